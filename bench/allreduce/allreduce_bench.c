/* specd-bench-allreduce: NCCL against the custom all-reduce variants on this
 * machine's GPUs, over message sizes, one worker thread per GPU (as the
 * engine runs). Prints the topology and the choice table, and writes the
 * full record as JSON (commit, machine, command, every timing).
 *
 *   specd-bench-allreduce [--gpus N] [--iters K] [--max-bytes B] [--out FILE]
 *
 * Built with CUDA only. */
#include <cuda_runtime_api.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench_commit.h"
#include "comm/gpu_comm.h"
#include "core/util.h"

typedef struct rank_job {
    int rank, device;
    sd_comm *nccl;
    sd_car *car;
    const size_t *sizes;
    int n_sizes, iters;
    sd_ar_table table;
    int rc;
    sd_err err;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    if (cudaSetDevice(j->device) != cudaSuccess) {
        j->rc = sd_err_set(&j->err, SD_EDEVICE, "cudaSetDevice(%d) failed", j->device);
        sd_comm_abort(j->nccl);
        return NULL;
    }
    j->rc = sd_ar_autotune(j->nccl, j->car, j->rank, j->sizes, j->n_sizes, -1, j->iters, &j->table,
                           &j->err);
    if (j->rc)
        sd_comm_abort(j->nccl);
    return NULL;
}

static int usage(void)
{
    fprintf(stderr, "usage: specd-bench-allreduce [--gpus N] [--iters K] [--max-bytes B] "
                    "[--out FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int gpus = 0, iters = 50;
    long long max_bytes = 64ll << 20, car_bytes = 8ll << 20;
    const char *out = "bench/results/allreduce.json";
    for (int i = 1; i < argc; i++) {
        int64_t v;
        if (!strcmp(argv[i], "--gpus") && i + 1 < argc && !sd_parse_i64(argv[i + 1], &v))
            gpus = (int)v, i++;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc && !sd_parse_i64(argv[i + 1], &v))
            iters = (int)v, i++;
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc && !sd_parse_i64(argv[i + 1], &v))
            max_bytes = v, i++;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else
            return usage();
    }
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
        fprintf(stderr, "specd-bench-allreduce: no CUDA device\n");
        return 77;
    }
    if (gpus <= 0 || gpus > have)
        gpus = have;
    if (gpus > SD_GPU_MAX_RANKS)
        gpus = SD_GPU_MAX_RANKS;
    sd_err err = {0};
    sd_topo topo;
    char topo_text[8192] = "";
    if (sd_topo_probe(&topo, &err) == 0)
        sd_topo_format(&topo, topo_text, sizeof topo_text);
    else
        snprintf(topo_text, sizeof topo_text, "(no topology: %s)\n", err.msg);
    printf("%s\n", topo_text);

    int devices[SD_GPU_MAX_RANKS];
    void *streams[SD_GPU_MAX_RANKS];
    for (int r = 0; r < gpus; r++) {
        cudaStream_t s;
        devices[r] = r;
        if (cudaSetDevice(r) != cudaSuccess ||
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "specd-bench-allreduce: cannot make a stream on GPU %d\n", r);
            return 1;
        }
        streams[r] = s;
    }
    sd_comm *nccl = NULL;
    sd_car *car = NULL;
    sd_nccl_opts no = {.n_local = gpus, .devices = devices, .streams = streams, .nnodes = 1};
    if (sd_nccl_comm_create(&nccl, &no, &err)) {
        fprintf(stderr, "specd-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    if (gpus >= 2 && sd_car_create(&car, gpus, devices, streams, (size_t)car_bytes, &err)) {
        fprintf(stderr, "specd-bench-allreduce: custom all-reduce off: %s\n", err.msg);
        car = NULL;
    }
    size_t sizes[SD_AR_TABLE_MAX];
    int n_sizes = 0;
    for (long long b = 1024; b <= max_bytes && n_sizes < SD_AR_TABLE_MAX; b *= 2)
        sizes[n_sizes++] = (size_t)b / sizeof(float);

    rank_job jobs[SD_GPU_MAX_RANKS];
    pthread_t tid[SD_GPU_MAX_RANKS];
    for (int r = 0; r < gpus; r++) {
        jobs[r] = (rank_job){.rank = r, .device = r, .nccl = nccl, .car = car, .sizes = sizes,
                             .n_sizes = n_sizes, .iters = iters};
        pthread_create(&tid[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < gpus; r++)
        pthread_join(tid[r], NULL);
    int status = 0;
    for (int r = 0; r < gpus; r++)
        if (jobs[r].rc) {
            fprintf(stderr, "specd-bench-allreduce: rank %d: %s\n", r, jobs[r].err.msg);
            status = 1;
        }
    if (!status) {
        const sd_ar_table *t = &jobs[0].table;
        json_t *root = json_object(), *rows = json_array();
        struct utsname u;
        uname(&u);
        char cmd[2048] = "";
        for (int i = 0; i < argc; i++)
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s%s", i ? " " : "", argv[i]);
        char name[256] = "";
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
            snprintf(name, sizeof name, "%s", p.name);
        json_object_set_new(root, "bench", json_string("allreduce"));
        json_object_set_new(root, "commit", json_string(SD_BENCH_COMMIT));
        json_object_set_new(root, "host", json_string(u.nodename));
        json_object_set_new(root, "gpu", json_string(name));
        json_object_set_new(root, "gpus", json_integer(gpus));
        json_object_set_new(root, "custom", json_boolean(car != NULL));
        json_object_set_new(root, "command", json_string(cmd));
        json_object_set_new(root, "iters", json_integer(iters));
        json_object_set_new(root, "topology", json_string(topo_text));
        for (int i = 0; i < t->n; i++) {
            json_t *row = json_object();
            json_object_set_new(row, "bytes", json_integer((json_int_t)(t->c[i].floats * 4)));
            json_object_set_new(row, "pick", json_string(sd_ar_algo_name(t->c[i].algo)));
            for (int a = 0; a < SD_AR_N_ALGOS; a++)
                if (t->c[i].us[a] > 0) {
                    char k[32];
                    snprintf(k, sizeof k, "%s_us", sd_ar_algo_name((sd_ar_algo)a));
                    json_object_set_new(row, k, json_real(t->c[i].us[a]));
                    snprintf(k, sizeof k, "%s_ok", sd_ar_algo_name((sd_ar_algo)a));
                    json_object_set_new(row, k, json_boolean(t->c[i].ok[a]));
                }
            json_array_append_new(rows, row);
        }
        json_object_set_new(root, "sizes", rows);
        if (json_dump_file(root, out, JSON_INDENT(2)))
            fprintf(stderr, "specd-bench-allreduce: cannot write %s\n", out);
        json_decref(root);
        char text[8192];
        sd_ar_table_format(t, text, sizeof text);
        printf("%d x %s, %d iterations per size (full record: %s)\n%s", gpus, name, iters, out,
               text);
    }
    sd_car_destroy(car);
    sd_comm_destroy(nccl);
    return status;
}

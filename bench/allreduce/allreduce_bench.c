/* specd-bench-allreduce: NCCL against the custom all-reduce variants on this
 * machine's GPUs, over message sizes, one worker thread per GPU (as the
 * engine runs). Prints the topology and the choice table, and writes the
 * full record as JSON (commit, machine, command, every timing).
 *
 * --gpus N: the start-up autotune's timings (NCCL, one-shot, two-shot: the
 * mean over the ranks of K back-to-back calls after 3 warm-up calls, each
 * result checked exactly first), and beside them the fused residual step
 * (sd_car_allreduce_add_rmsnorm: all-reduce + residual add + RMSNorm over
 * rows of d = 4096 floats, or one row of the message when it is smaller),
 * timed the same way after a check against the host (x exactly, xn within
 * 1e-5 relative): where it fits the custom all-reduce's buffer.
 *
 *   specd-bench-allreduce [--gpus N] [--iters K] [--max-bytes B] [--out FILE]
 *   specd-bench-allreduce --simulate P [--iters K] [--max-bytes B] [--out FILE]
 *
 * --simulate P runs the custom kernels (one-shot, two-shot, fused add +
 * RMSNorm) for P ranks whose buffers all sit on GPU 0, one thread and stream
 * per rank, each call's result checked exactly first. Those times are the
 * kernels' own cost (flags, barriers, HBM reads of P buffers), not a
 * topology's: no byte crosses a link. They say what a call costs at least.
 *
 * Built with CUDA only. */
#include <cuda_runtime_api.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench_commit.h"
#include "comm/gpu_comm.h"
#include "core/util.h"

/* ---- --simulate P ------------------------------------------------------- */

enum { SIM_ONESHOT, SIM_TWOSHOT, SIM_FUSED, SIM_N };
static const char *const sim_names[SIM_N] = {"oneshot", "twoshot", "fused"};

typedef struct sim_shared {
    pthread_barrier_t bar;
    pthread_mutex_t mu;
    int failed; /* sticky: once a rank fails, every rank stops at the next meeting */
} sim_shared;

typedef struct sim_job {
    int rank, P;
    sd_car *car;
    cudaStream_t stream;
    const size_t *sizes;
    int n_sizes, iters;
    sim_shared *sh;
    double us[SD_AR_TABLE_MAX][SIM_N];
    int ok[SD_AR_TABLE_MAX][SIM_N];
    int rc;
    char msg[256];
} sim_job;

/* Every rank meets the others here before a kernel that waits for them: 1
 * when every rank is fine so far. */
static int sim_agree(sim_shared *sh, int ok)
{
    pthread_mutex_lock(&sh->mu);
    sh->failed |= !ok;
    pthread_mutex_unlock(&sh->mu);
    pthread_barrier_wait(&sh->bar);
    pthread_mutex_lock(&sh->mu);
    int f = sh->failed;
    pthread_mutex_unlock(&sh->mu);
    return !f;
}

/* Like sim_agree, with a second meeting after the flag is read: no rank can
 * mark a failure for the next meeting before every rank has read this one's
 * (a rank leaving early would leave the others at a barrier forever). */
static int agree(sim_shared *sh, int ok)
{
    int all = sim_agree(sh, ok);
    pthread_barrier_wait(&sh->bar);
    return all;
}

/* ---- --gpus N ----------------------------------------------------------- */

typedef struct rank_job {
    int rank, device;
    sd_comm *nccl;
    sd_car *car;
    cudaStream_t stream; /* the rank's, the custom all-reduce's too */
    const size_t *sizes;
    int n_sizes, iters;
    sim_shared *sh;
    sd_ar_table table;
    int rc;
    sd_err err;
    /* the fused residual step per size: mean time per call (0: did not
     * fit or did not run), x exact and xn within 1e-5 of the host */
    double fused_us[SD_AR_TABLE_MAX];
    int fused_ok[SD_AR_TABLE_MAX], fused_rows[SD_AR_TABLE_MAX], fused_d[SD_AR_TABLE_MAX];
    char msg[256];
} rank_job;

#define FUSED_D 4096
#define FUSED_EPS 1e-6f

/* The host's residual step of this bench's inputs, checked against the
 * GPU's x and xn (rows, d): partial on rank r = (r + 1) * (i % 7 + 1), x
 * before = i % 5 - 2 on every rank, w[c] = 0.5 + 0.25 * (c % 5); small
 * integers, so x is exact in any order and so is the sum of squares. */
static int fused_check(const float *gx, const float *gxn, int P, int rows, int d)
{
    int ok = 1;
    for (int r = 0; r < rows && ok; r++) {
        double ss = 0;
        for (int c = 0; c < d; c++) {
            size_t i = (size_t)r * d + c;
            float v = (float)((int)(i % 5) - 2 + P * (P + 1) / 2 * (int)(i % 7 + 1));
            ok &= gx[i] == v;
            ss += (double)v * v;
        }
        double rstd = 1.0 / sqrt(ss / d + FUSED_EPS);
        for (int c = 0; c < d && ok; c++) {
            size_t i = (size_t)r * d + c;
            double want = (double)gx[i] * rstd * (0.5 + 0.25 * (c % 5));
            ok = fabs(gxn[i] - want) <= 1e-5 * (fabs(want) + 1e-3);
        }
    }
    return ok;
}

/* Every rank: for each size that fits, one checked call of the fused step,
 * 3 warm-up calls, then iters timed calls. The ranks meet (agree) before
 * each size and before each timed loop, so a rank that fails stops every
 * rank at the next meeting instead of leaving them in a kernel that waits
 * for it. */
static void fused_rank(rank_job *j)
{
    int P = j->nccl->size;
    size_t maxn = 0;
    for (int k = 0; k < j->n_sizes; k++)
        if (j->sizes[k] <= sd_car_max_floats(j->car))
            maxn = maxn > j->sizes[k] ? maxn : j->sizes[k];
    maxn = maxn ? maxn : 4;
    float *part = NULL, *x = NULL, *xn = NULL, *w = NULL;
    float *h = malloc(maxn * sizeof(float)), *hx = malloc(maxn * sizeof(float)),
          *hw = malloc(FUSED_D * sizeof(float));
    int ok = j->rc == 0 && h && hx && hw && cudaSetDevice(j->device) == cudaSuccess &&
             cudaMalloc((void **)&part, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&x, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&xn, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&w, FUSED_D * 4) == cudaSuccess;
    if (ok) {
        for (int c = 0; c < FUSED_D; c++)
            hw[c] = 0.5f + 0.25f * (float)(c % 5);
        ok = cudaMemcpyAsync(w, hw, FUSED_D * 4, cudaMemcpyHostToDevice, j->stream) ==
                 cudaSuccess &&
             cudaStreamSynchronize(j->stream) == cudaSuccess;
        if (!ok)
            snprintf(j->msg, sizeof j->msg, "fused: setup: %s",
                     cudaGetErrorString(cudaGetLastError()));
    }
    for (int k = 0; k < j->n_sizes && agree(j->sh, ok); k++) {
        size_t n = j->sizes[k];
        int d = n < FUSED_D ? (int)n : FUSED_D, rows = (int)(n / (size_t)d);
        /* alike on every rank: the same n, cudaMalloc'd (aligned) buffers */
        if (n > maxn || (size_t)rows * (size_t)d != n || !sd_car_fits(j->car, part, n))
            continue;
        j->fused_rows[k] = rows;
        j->fused_d[k] = d;
        for (size_t i = 0; i < n; i++) {
            h[i] = (float)((j->rank + 1) * (int)(i % 7 + 1));
            hx[i] = (float)((int)(i % 5) - 2);
        }
        /* the uploads on the rank's stream, ahead of the kernel (a pageable
         * cudaMemcpy may return before its DMA lands) */
        int rc = -1;
        ok = cudaMemcpyAsync(part, h, n * 4, cudaMemcpyHostToDevice, j->stream) == cudaSuccess &&
             cudaMemcpyAsync(x, hx, n * 4, cudaMemcpyHostToDevice, j->stream) == cudaSuccess &&
             (rc = sd_car_allreduce_add_rmsnorm(j->car, j->rank, part, x, xn, w, SD_DT_F32, rows,
                                                d, FUSED_EPS)) == 0 &&
             cudaMemcpyAsync(h, x, n * 4, cudaMemcpyDeviceToHost, j->stream) == cudaSuccess &&
             cudaMemcpyAsync(hx, xn, n * 4, cudaMemcpyDeviceToHost, j->stream) == cudaSuccess &&
             cudaStreamSynchronize(j->stream) == cudaSuccess;
        if (!ok) {
            snprintf(j->msg, sizeof j->msg, "fused at %zu floats: %s (rc %d)", n,
                     cudaGetErrorString(cudaGetLastError()), rc);
        } else {
            j->fused_ok[k] = fused_check(h, hx, P, rows, d);
        }
        for (int it = 0; it < 3 && ok; it++)
            ok = sd_car_allreduce_add_rmsnorm(j->car, j->rank, part, x, xn, w, SD_DT_F32, rows, d,
                                              FUSED_EPS) == 0;
        ok = ok && cudaStreamSynchronize(j->stream) == cudaSuccess;
        if (!agree(j->sh, ok))
            break;
        double t0 = sd_now_s();
        for (int it = 0; it < j->iters && ok; it++)
            ok = sd_car_allreduce_add_rmsnorm(j->car, j->rank, part, x, xn, w, SD_DT_F32, rows, d,
                                              FUSED_EPS) == 0;
        ok = ok && cudaStreamSynchronize(j->stream) == cudaSuccess;
        j->fused_us[k] = (sd_now_s() - t0) * 1e6 / j->iters;
        if (!ok)
            snprintf(j->msg, sizeof j->msg, "fused timing at %zu floats: %s", n,
                     cudaGetErrorString(cudaGetLastError()));
    }
    if (!ok && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "fused: stopped (another rank failed)");
    cudaFree(part);
    cudaFree(x);
    cudaFree(xn);
    cudaFree(w);
    free(h);
    free(hx);
    free(hw);
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    if (cudaSetDevice(j->device) != cudaSuccess) {
        j->rc = sd_err_set(&j->err, SD_EDEVICE, "cudaSetDevice(%d) failed", j->device);
        sd_comm_abort(j->nccl);
    } else {
        j->rc = sd_ar_autotune(j->nccl, j->car, j->rank, j->sizes, j->n_sizes, -1, j->iters,
                               &j->table, &j->err);
        if (j->rc)
            sd_comm_abort(j->nccl);
    }
    /* every rank comes here, failed or not: the fused step's meetings */
    if (j->car)
        fused_rank(j);
    return NULL;
}

/* One call of variant v over n floats: io (n) in place, or partial = io, x, xn
 * (n / d rows of d floats), w (d) ones. */
static int sim_call(sim_job *j, int v, float *io, float *x, float *xn, const float *w, size_t n)
{
    if (v != SIM_FUSED)
        return sd_car_allreduce(j->car, j->rank, io, n, v == SIM_ONESHOT ? SD_AR_ONESHOT
                                                                         : SD_AR_TWOSHOT);
    int d = n < 4096 ? (int)n : 4096;
    return sd_car_allreduce_add_rmsnorm(j->car, j->rank, io, x, xn, w, SD_DT_F32, (int)(n / d), d,
                                        1e-6f);
}

static void *sim_rank_main(void *arg)
{
    sim_job *j = arg;
    size_t maxn = 0;
    for (int k = 0; k < j->n_sizes; k++)
        maxn = maxn > j->sizes[k] ? maxn : j->sizes[k];
    float *io = NULL, *x = NULL, *xn = NULL, *w = NULL, *h = malloc(maxn * sizeof(float));
    int ok = h && cudaSetDevice(0) == cudaSuccess &&
             cudaMalloc((void **)&io, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&x, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&xn, maxn * 4) == cudaSuccess &&
             cudaMalloc((void **)&w, 4096 * 4) == cudaSuccess;
    if (ok) {
        for (int i = 0; i < 4096; i++)
            h[i] = 1.0f;
        ok = cudaMemcpy(w, h, 4096 * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess; /* the DMA landed */
    }
    /* every rank meets the others the same number of times on every path */
    for (int it = 0; it < j->n_sizes * SIM_N && sim_agree(j->sh, ok); it++) {
        int k = it / SIM_N, v = it % SIM_N;
        size_t n = j->sizes[k];
        /* rank r holds (r + 1) * (i % 7 + 1): every summation order is exact */
        for (size_t i = 0; i < n; i++)
            h[i] = (float)((j->rank + 1) * (int)(i % 7 + 1));
        ok = cudaMemcpyAsync(io, h, n * 4, cudaMemcpyHostToDevice, j->stream) == cudaSuccess &&
             cudaMemsetAsync(x, 0, n * 4, j->stream) == cudaSuccess &&
             sim_call(j, v, io, x, xn, w, n) == 0 &&
             cudaMemcpyAsync(h, v == SIM_FUSED ? x : io, n * 4, cudaMemcpyDeviceToHost,
                             j->stream) == cudaSuccess &&
             cudaStreamSynchronize(j->stream) == cudaSuccess;
        if (!ok)
            snprintf(j->msg, sizeof j->msg, "%s at %zu floats: %s", sim_names[v], n,
                     cudaGetErrorString(cudaGetLastError()));
        int right = ok;
        for (size_t i = 0; i < n && right; i++)
            right = h[i] == (float)(j->P * (j->P + 1) / 2 * (int)(i % 7 + 1));
        j->ok[k][v] = right;
        /* warm-up, then iters back-to-back calls, every rank starting together
         * (a failed rank still meets the others here, then all stop) */
        for (int r = 0; r < 3 && ok; r++)
            ok = sim_call(j, v, io, x, xn, w, n) == 0;
        ok = ok && cudaStreamSynchronize(j->stream) == cudaSuccess;
        if (!sim_agree(j->sh, ok))
            continue;
        double t0 = sd_now_s();
        for (int r = 0; r < j->iters && ok; r++)
            ok = sim_call(j, v, io, x, xn, w, n) == 0;
        ok = ok && cudaStreamSynchronize(j->stream) == cudaSuccess;
        j->us[k][v] = (sd_now_s() - t0) * 1e6 / j->iters;
        if (!ok)
            snprintf(j->msg, sizeof j->msg, "%s timing at %zu floats: %s", sim_names[v], n,
                     cudaGetErrorString(cudaGetLastError()));
    }
    j->rc = sim_agree(j->sh, ok) ? 0 : -1;
    if (j->rc && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "stopped: another rank failed");
    cudaFree(io);
    cudaFree(x);
    cudaFree(xn);
    cudaFree(w);
    free(h);
    return NULL;
}

static int simulate(int P, int iters, long long max_bytes, const char *out, int argc, char **argv)
{
    size_t sizes[SD_AR_TABLE_MAX];
    int n_sizes = 0;
    for (long long b = 8192; b <= max_bytes && n_sizes < SD_AR_TABLE_MAX; b *= 2)
        sizes[n_sizes++] = (size_t)b / sizeof(float);
    if (n_sizes == 0) {
        fprintf(stderr, "specd-bench-allreduce: --max-bytes below 8192\n");
        return 2;
    }
    int devices[SD_GPU_MAX_RANKS];
    void *streams[SD_GPU_MAX_RANKS];
    if (cudaSetDevice(0) != cudaSuccess)
        return 1;
    for (int r = 0; r < P; r++) {
        cudaStream_t s;
        devices[r] = 0;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "specd-bench-allreduce: cannot make stream %d\n", r);
            return 1;
        }
        streams[r] = s;
    }
    sd_err err = {0};
    sd_car *car = NULL;
    if (sd_car_create(&car, P, devices, streams, sizes[n_sizes - 1] * sizeof(float), &err)) {
        fprintf(stderr, "specd-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    sim_shared sh = {.failed = 0};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)P);
    pthread_mutex_init(&sh.mu, NULL);
    sim_job *jobs = calloc((size_t)P, sizeof *jobs);
    pthread_t tid[SD_GPU_MAX_RANKS];
    for (int r = 0; r < P; r++) {
        jobs[r] = (sim_job){.rank = r, .P = P, .car = car, .stream = (cudaStream_t)streams[r],
                            .sizes = sizes, .n_sizes = n_sizes, .iters = iters, .sh = &sh};
        pthread_create(&tid[r], NULL, sim_rank_main, &jobs[r]);
    }
    for (int r = 0; r < P; r++)
        pthread_join(tid[r], NULL);
    int status = 0;
    for (int r = 0; r < P; r++)
        if (jobs[r].rc) {
            fprintf(stderr, "specd-bench-allreduce: rank %d: %s\n", r, jobs[r].msg);
            status = 1;
        }
    if (!status) {
        char cmd[2048] = "", name[256] = "";
        for (int i = 0; i < argc; i++)
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s%s", i ? " " : "", argv[i]);
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
            snprintf(name, sizeof name, "%s", p.name);
        struct utsname u;
        uname(&u);
        json_t *root = json_object(), *rows = json_array();
        json_object_set_new(root, "bench", json_string("allreduce-simulated"));
        json_object_set_new(root, "commit", json_string(SD_BENCH_COMMIT));
        json_object_set_new(root, "host", json_string(u.nodename));
        json_object_set_new(root, "gpu", json_string(name));
        json_object_set_new(root, "ranks_on_one_gpu", json_integer(P));
        json_object_set_new(root, "command", json_string(cmd));
        json_object_set_new(root, "iters", json_integer(iters));
        json_object_set_new(root, "note",
                            json_string("all ranks' buffers on GPU 0: the kernels' own cost, no "
                                        "link crossed; us = slowest rank's mean per call; fused: "
                                        "rows of 4096 floats"));
        printf("%d simulated ranks on one %s, %d iterations per size (full record: %s)\n", P, name,
               iters, out);
        printf("%12s %12s %12s %12s\n", "bytes", "oneshot_us", "twoshot_us", "fused_us");
        for (int k = 0; k < n_sizes; k++) {
            json_t *row = json_object();
            json_object_set_new(row, "bytes", json_integer((json_int_t)(sizes[k] * 4)));
            printf("%12zu", sizes[k] * 4);
            for (int v = 0; v < SIM_N; v++) {
                double us = 0;
                int ok = 1;
                for (int r = 0; r < P; r++) {
                    us = us > jobs[r].us[k][v] ? us : jobs[r].us[k][v];
                    ok &= jobs[r].ok[k][v];
                }
                char key[32];
                snprintf(key, sizeof key, "%s_us", sim_names[v]);
                json_object_set_new(row, key, json_real(us));
                snprintf(key, sizeof key, "%s_ok", sim_names[v]);
                json_object_set_new(row, key, json_boolean(ok));
                printf(" %12.1f%s", us, ok ? "" : "!");
                status |= !ok;
            }
            printf("\n");
            json_array_append_new(rows, row);
        }
        json_object_set_new(root, "sizes", rows);
        if (json_dump_file(root, out, JSON_INDENT(2)))
            fprintf(stderr, "specd-bench-allreduce: cannot write %s\n", out);
        json_decref(root);
        if (status)
            fprintf(stderr, "specd-bench-allreduce: a result was wrong (marked !)\n");
    }
    free(jobs);
    pthread_barrier_destroy(&sh.bar);
    pthread_mutex_destroy(&sh.mu);
    sd_car_destroy(car);
    for (int r = 0; r < P; r++)
        cudaStreamDestroy((cudaStream_t)streams[r]);
    return status;
}

static int usage(void)
{
    fprintf(stderr, "usage: specd-bench-allreduce [--gpus N | --simulate P] [--iters K] "
                    "[--max-bytes B] [--out FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int gpus = 0, iters = 50, simulate_p = 0;
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
        else if (!strcmp(argv[i], "--simulate") && i + 1 < argc &&
                 !sd_parse_i64(argv[i + 1], &v) && v >= 2 && v <= SD_GPU_MAX_RANKS)
            simulate_p = (int)v, i++;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else
            return usage();
    }
    /* --simulate: a hardware queue per rank's stream, before the context starts */
    if (simulate_p)
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
        fprintf(stderr, "specd-bench-allreduce: no CUDA device\n");
        return 77;
    }
    if (simulate_p)
        return simulate(simulate_p, iters, max_bytes, out, argc, argv);
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
    sim_shared sh = {.failed = 0};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)gpus);
    pthread_mutex_init(&sh.mu, NULL);
    for (int r = 0; r < gpus; r++) {
        jobs[r] = (rank_job){.rank = r, .device = r, .nccl = nccl, .car = car,
                             .stream = (cudaStream_t)streams[r], .sizes = sizes,
                             .n_sizes = n_sizes, .iters = iters, .sh = &sh};
        pthread_create(&tid[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < gpus; r++)
        pthread_join(tid[r], NULL);
    pthread_barrier_destroy(&sh.bar);
    pthread_mutex_destroy(&sh.mu);
    int status = 0;
    for (int r = 0; r < gpus; r++)
        if (jobs[r].rc) {
            fprintf(stderr, "specd-bench-allreduce: rank %d: %s\n", r, jobs[r].err.msg);
            status = 1;
        } else if (jobs[r].msg[0]) {
            fprintf(stderr, "specd-bench-allreduce: rank %d: %s\n", r, jobs[r].msg);
            status = 1;
        }
    /* the fused step per size: the mean over the ranks, right on every rank */
    double fused_us[SD_AR_TABLE_MAX] = {0};
    int fused_ok[SD_AR_TABLE_MAX];
    for (int k = 0; k < n_sizes; k++) {
        fused_ok[k] = 1;
        for (int r = 0; r < gpus; r++) {
            fused_us[k] += jobs[r].fused_us[k] / gpus;
            fused_ok[k] &= jobs[r].fused_ok[k];
        }
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
        json_object_set_new(
            root, "note",
            json_string("us: mean over the ranks of the mean time per call of iters back-to-back "
                        "calls after 3 warm-up calls; nccl/oneshot/twoshot: the engine's start-up "
                        "autotune (sd_ar_autotune), result checked exactly; fused: all-reduce + "
                        "residual add + RMSNorm (sd_car_allreduce_add_rmsnorm) over fused_rows x "
                        "fused_d floats, x checked exactly and xn within 1e-5 relative against the "
                        "host, where the message fits the custom all-reduce's buffer"));
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
            if (fused_us[i] > 0) {
                json_object_set_new(row, "fused_us", json_real(fused_us[i]));
                json_object_set_new(row, "fused_ok", json_boolean(fused_ok[i]));
                json_object_set_new(row, "fused_rows", json_integer(jobs[0].fused_rows[i]));
                json_object_set_new(row, "fused_d", json_integer(jobs[0].fused_d[i]));
            }
            json_array_append_new(rows, row);
        }
        json_object_set_new(root, "sizes", rows);
        if (json_dump_file(root, out, JSON_INDENT(2)))
            fprintf(stderr, "specd-bench-allreduce: cannot write %s\n", out);
        json_decref(root);
        printf("%d x %s, %d iterations per size (full record: %s)\n", gpus, name, iters, out);
        printf("%12s %12s %8s %12s %12s %12s %12s\n", "floats", "bytes", "pick", "nccl_us",
               "oneshot_us", "twoshot_us", "fused_us");
        for (int i = 0; i < t->n; i++) {
            const sd_ar_choice *c = &t->c[i];
            char col[SD_AR_N_ALGOS + 1][32];
            for (int a = 0; a <= SD_AR_N_ALGOS; a++) {
                double us = a < SD_AR_N_ALGOS ? c->us[a] : fused_us[i];
                int ok = a < SD_AR_N_ALGOS ? c->ok[a] : fused_ok[i];
                if (us > 0)
                    snprintf(col[a], sizeof col[a], "%.1f%s", us, ok ? "" : " (wrong)");
                else
                    snprintf(col[a], sizeof col[a], "-");
            }
            printf("%12zu %12zu %8s %12s %12s %12s %12s\n", c->floats, c->floats * sizeof(float),
                   sd_ar_algo_name(c->algo), col[0], col[1], col[2], col[3]);
            status |= fused_us[i] > 0 && !fused_ok[i];
        }
        if (status)
            fprintf(stderr, "specd-bench-allreduce: a fused result was wrong\n");
    }
    sd_car_destroy(car);
    sd_comm_destroy(nccl);
    return status;
}

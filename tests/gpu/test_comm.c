/* GPU tests of src/comm on 2+ GPUs of one machine (skipped with fewer): one
 * worker thread per GPU, as the engine runs.
 * - NCCL all-reduce and all-gather against host sums (relative 1e-6);
 * - the custom one-shot and two-shot all-reduce equal the host's rank-order
 *   sum bit for bit on every rank, at several sizes, back to back with the
 *   variants interleaved (the per-block flags never reset);
 * - a one-shot call captured into a CUDA graph and replayed on new data;
 * - the fused all-reduce + residual + RMSNorm against the host (1e-5);
 * - the autotune's table: every size checked, NCCL right everywhere.
 * Each check prints `RESULT {...}` on stdout like the other GPU tests. */
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "comm/gpu_comm.h"
#include "core/util.h"
#include "test.h"

#define MAXG SD_GPU_MAX_RANKS

typedef struct world {
    int n;
    int devices[MAXG];
    void *streams[MAXG];
    sd_comm *nccl;
    sd_car *car;
    uint64_t seed;
} world;

/* 0 ready; 1 skip (msg); -1 failure (msg) */
static int world_open(world *w, char *msg, size_t ml)
{
    memset(w, 0, sizeof *w);
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 2) {
        cudaGetLastError();
        snprintf(msg, ml, "needs 2 GPUs, %d visible", have);
        return 1;
    }
    w->n = have < MAXG ? have : MAXG;
    w->seed = sd_test_seed();
    for (int r = 0; r < w->n; r++) {
        cudaStream_t s;
        w->devices[r] = r;
        if (cudaSetDevice(r) != cudaSuccess ||
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            snprintf(msg, ml, "cannot make a stream on GPU %d", r);
            return -1;
        }
        w->streams[r] = s;
    }
    sd_err err = {0};
    sd_nccl_opts o = {.n_local = w->n, .devices = w->devices, .streams = w->streams, .nnodes = 1};
    if (sd_nccl_comm_create(&w->nccl, &o, &err)) {
        snprintf(msg, ml, "%s", err.msg);
        return -1;
    }
    if (sd_car_create(&w->car, w->n, w->devices, w->streams, 8u << 20, &err)) {
        snprintf(msg, ml, "%s", err.msg);
        return -1;
    }
    return 0;
}

static void world_close(world *w)
{
    sd_car_destroy(w->car);
    sd_comm_destroy(w->nccl);
    for (int r = 0; r < w->n; r++)
        if (w->streams[r]) {
            cudaSetDevice(r);
            cudaStreamDestroy((cudaStream_t)w->streams[r]);
        }
}

#define WORLD_OPEN(w)                                                                      \
    char wmsg_[1024];                                                                      \
    int wr_ = world_open(&(w), wmsg_, sizeof wmsg_);                                       \
    if (wr_ > 0) {                                                                         \
        world_close(&(w));                                                                 \
        TEST_SKIP("%s", wmsg_);                                                            \
    }                                                                                      \
    if (wr_ < 0)                                                                           \
        world_close(&(w));                                                                 \
    ASSERT_MSG(wr_ == 0, "%s", wmsg_)

/* Rank r's input element i: fresh per run, the same on every call. */
static float input(uint64_t seed, int r, size_t i)
{
    uint64_t s = seed ^ ((uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
    return sd_test_randf(&s, -1, 1);
}

static float rank_sum(uint64_t seed, int P, size_t i)
{
    float s = input(seed, 0, i);
    for (int r = 1; r < P; r++)
        s += input(seed, r, i);
    return s;
}

typedef struct job job;
typedef int (*job_fn)(job *j);
struct job {
    world *w;
    int rank;
    job_fn fn;
    void *user;
    int rc;
    char msg[512];
};

static void *job_main(void *arg)
{
    job *j = arg;
    if (cudaSetDevice(j->w->devices[j->rank]) != cudaSuccess) {
        j->rc = -1;
        snprintf(j->msg, sizeof j->msg, "cudaSetDevice failed");
    } else {
        j->rc = j->fn(j);
    }
    if (j->rc)
        sd_comm_abort(j->w->nccl);
    return NULL;
}

static int run_ranks(world *w, job_fn fn, void *user, char *msg, size_t ml)
{
    job jobs[MAXG];
    pthread_t t[MAXG];
    for (int r = 0; r < w->n; r++) {
        jobs[r] = (job){.w = w, .rank = r, .fn = fn, .user = user};
        pthread_create(&t[r], NULL, job_main, &jobs[r]);
    }
    for (int r = 0; r < w->n; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < w->n; r++)
        if (jobs[r].rc) {
            snprintf(msg, ml, "rank %d: %s", r, jobs[r].msg);
            return jobs[r].rc;
        }
    return 0;
}

static const size_t sizes[] = {4, 1024, 4100, 65536, 262144, 1048576};

/* ---- all-reduce variants */

typedef struct ar_stats {
    double nccl_rel[MAXG];
    long custom_bad[MAXG];
} ar_stats;

static int ar_job(job *j)
{
    world *w = j->w;
    ar_stats *st = j->user;
    size_t maxn = sizes[sizeof sizes / sizeof sizes[0] - 1];
    float *dev = NULL, *h = malloc(maxn * sizeof(float));
    cudaStream_t s = (cudaStream_t)w->streams[j->rank];
    if (!h || cudaMalloc((void **)&dev, maxn * sizeof(float)) != cudaSuccess) {
        snprintf(j->msg, sizeof j->msg, "out of memory");
        free(h);
        return -1;
    }
    int rc = 0;
    /* three rounds, the variants interleaved, so flags run across calls */
    for (int round = 0; round < 3 && !rc; round++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && !rc; k++)
            for (int a = 0; a < SD_AR_N_ALGOS && !rc; a++) {
                size_t n = sizes[k];
                for (size_t i = 0; i < n; i++)
                    h[i] = input(w->seed, j->rank, i);
                cudaMemcpy(dev, h, n * sizeof(float), cudaMemcpyHostToDevice);
                rc = a == SD_AR_NCCL ? sd_comm_allreduce_sum(w->nccl, j->rank, dev, n)
                                     : sd_car_allreduce(w->car, j->rank, dev, n, (sd_ar_algo)a);
                if (rc) {
                    snprintf(j->msg, sizeof j->msg, "%s at %zu floats: %d",
                             sd_ar_algo_name((sd_ar_algo)a), n, rc);
                    break;
                }
                if (cudaStreamSynchronize(s) != cudaSuccess ||
                    cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
                    snprintf(j->msg, sizeof j->msg, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
                    rc = -1;
                    break;
                }
                for (size_t i = 0; i < n; i++) {
                    float want = rank_sum(w->seed, w->n, i);
                    if (a == SD_AR_NCCL) {
                        double d = fabs((double)h[i] - want) / (fabs(want) + 1e-3);
                        if (d > st->nccl_rel[j->rank])
                            st->nccl_rel[j->rank] = d;
                    } else if (memcmp(&h[i], &want, sizeof want)) {
                        st->custom_bad[j->rank]++;
                    }
                }
            }
    cudaFree(dev);
    free(h);
    return rc;
}

TEST(custom_allreduce_equals_the_rank_order_sum_bit_for_bit_and_nccl_is_close)
{
    world w;
    WORLD_OPEN(w);
    ar_stats st = {0};
    char msg[600] = "";
    int rc = run_ranks(&w, ar_job, &st, msg, sizeof msg);
    world_close(&w);
    ASSERT_MSG(rc == 0, "%s", msg);
    double nrel = 0;
    long bad = 0;
    for (int r = 0; r < w.n; r++) {
        nrel = fmax(nrel, st.nccl_rel[r]);
        bad += st.custom_bad[r];
    }
    printf("RESULT {\"test\": \"comm_allreduce\", \"gpus\": %d, \"nccl_rel\": %.3g, "
           "\"custom_wrong_elements\": %ld, \"passed\": %s}\n",
           w.n, nrel, bad, nrel <= 1e-6 && bad == 0 ? "true" : "false");
    ASSERT_MSG(bad == 0, "%ld elements of the custom all-reduce differ from the rank-order sum", bad);
    ASSERT_MSG(nrel <= 1e-6, "NCCL relative error %.3g", nrel);
}

/* ---- graph capture */

static int graph_job(job *j)
{
    world *w = j->w;
    size_t n = 65536;
    cudaStream_t s = (cudaStream_t)w->streams[j->rank];
    float *dev = NULL, *h = malloc(n * sizeof(float));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int rc = -1;
    if (!h || cudaMalloc((void **)&dev, n * sizeof(float)) != cudaSuccess)
        goto out;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        goto out;
    int crc = sd_car_allreduce(w->car, j->rank, dev, n, SD_AR_ONESHOT);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess || crc ||
        cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        goto out;
    for (int rep = 0; rep < 3; rep++) {
        /* new data each replay: rank r holds input * (rep + 1) */
        for (size_t i = 0; i < n; i++)
            h[i] = input(w->seed, j->rank, i) * (float)(rep + 1);
        cudaMemcpy(dev, h, n * sizeof(float), cudaMemcpyHostToDevice);
        if (cudaGraphLaunch(ge, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
            goto out;
        cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n; i++) {
            float want = input(w->seed, 0, i) * (float)(rep + 1);
            for (int r = 1; r < w->n; r++)
                want += input(w->seed, r, i) * (float)(rep + 1);
            if (memcmp(&h[i], &want, sizeof want)) {
                snprintf(j->msg, sizeof j->msg, "replay %d element %zu: %g, want %g", rep, i,
                         h[i], want);
                goto out;
            }
        }
    }
    rc = 0;
out:
    if (rc && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    cudaFree(dev);
    free(h);
    return rc;
}

TEST(a_captured_oneshot_replays_on_new_data)
{
    world w;
    WORLD_OPEN(w);
    char msg[600] = "";
    int rc = run_ranks(&w, graph_job, NULL, msg, sizeof msg);
    world_close(&w);
    printf("RESULT {\"test\": \"comm_graph_replay\", \"passed\": %s}\n", rc ? "false" : "true");
    ASSERT_MSG(rc == 0, "%s", msg);
}

/* ---- fused all-reduce + residual + RMSNorm */

typedef struct fused_stats {
    double rel_x[MAXG], rel_xn[MAXG];
} fused_stats;

static int fused_job(job *j)
{
    world *w = j->w;
    fused_stats *st = j->user;
    int rows = 7, d = 1024;
    size_t n = (size_t)rows * d;
    float *part = NULL, *x = NULL, *xn = NULL, *wt = NULL;
    float *h = malloc(n * sizeof(float)), *hx = malloc(n * sizeof(float)),
          *hw = malloc((size_t)d * sizeof(float));
    int rc = -1;
    if (!h || !hx || !hw || cudaMalloc((void **)&part, n * 4) || cudaMalloc((void **)&x, n * 4) ||
        cudaMalloc((void **)&xn, n * 4) || cudaMalloc((void **)&wt, (size_t)d * 4))
        goto out;
    for (size_t i = 0; i < n; i++) {
        h[i] = input(w->seed, j->rank, i);
        hx[i] = input(w->seed, 99, i); /* the residual: the same on every rank */
    }
    for (int c = 0; c < d; c++)
        hw[c] = 1.0f + 0.5f * input(w->seed, 98, (size_t)c);
    cudaMemcpy(part, h, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(x, hx, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(wt, hw, (size_t)d * 4, cudaMemcpyHostToDevice);
    if (sd_car_allreduce_add_rmsnorm(w->car, j->rank, part, x, xn, wt, SD_DT_F32, rows, d, 1e-6f) ||
        cudaStreamSynchronize((cudaStream_t)w->streams[j->rank]) != cudaSuccess)
        goto out;
    float *gx = malloc(n * 4), *gxn = malloc(n * 4);
    cudaMemcpy(gx, x, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(gxn, xn, n * 4, cudaMemcpyDeviceToHost);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < d; c++) {
            size_t i = (size_t)r * d + c;
            double v = (double)hx[i] + rank_sum(w->seed, w->n, i);
            st->rel_x[j->rank] = fmax(st->rel_x[j->rank], fabs(gx[i] - v) / (fabs(v) + 1e-3));
            ss += v * v;
        }
        double rstd = 1.0 / sqrt(ss / d + 1e-6);
        for (int c = 0; c < d; c++) {
            size_t i = (size_t)r * d + c;
            double v = ((double)hx[i] + rank_sum(w->seed, w->n, i)) * rstd * hw[c];
            st->rel_xn[j->rank] = fmax(st->rel_xn[j->rank], fabs(gxn[i] - v) / (fabs(v) + 1e-3));
        }
    }
    free(gx);
    free(gxn);
    rc = 0;
out:
    if (rc)
        snprintf(j->msg, sizeof j->msg, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(part);
    cudaFree(x);
    cudaFree(xn);
    cudaFree(wt);
    free(h);
    free(hx);
    free(hw);
    return rc;
}

TEST(fused_allreduce_residual_rmsnorm_matches_the_host)
{
    world w;
    WORLD_OPEN(w);
    fused_stats st = {0};
    char msg[600] = "";
    int rc = run_ranks(&w, fused_job, &st, msg, sizeof msg);
    world_close(&w);
    ASSERT_MSG(rc == 0, "%s", msg);
    double ex = 0, exn = 0;
    for (int r = 0; r < w.n; r++) {
        ex = fmax(ex, st.rel_x[r]);
        exn = fmax(exn, st.rel_xn[r]);
    }
    printf("RESULT {\"test\": \"comm_fused_add_rmsnorm\", \"x_rel\": %.3g, \"xn_rel\": %.3g, "
           "\"bound\": 1e-5, \"passed\": %s}\n",
           ex, exn, ex <= 1e-5 && exn <= 1e-5 ? "true" : "false");
    ASSERT_MSG(ex <= 1e-5 && exn <= 1e-5, "x rel %.3g, xn rel %.3g", ex, exn);
}

/* ---- autotune */

typedef struct tune {
    sd_ar_table t[MAXG];
} tune;

static int tune_job(job *j)
{
    tune *tu = j->user;
    sd_err err = {0};
    int rc = sd_ar_autotune(j->w->nccl, j->w->car, j->rank, sizes, (int)(sizeof sizes / sizeof sizes[0]),
                            -1, 20, &tu->t[j->rank], &err);
    if (rc)
        snprintf(j->msg, sizeof j->msg, "%.500s", err.msg);
    return rc;
}

TEST(autotune_checks_every_variant_and_all_ranks_agree_on_the_table)
{
    world w;
    WORLD_OPEN(w);
    tune tu;
    char msg[600] = "";
    int rc = run_ranks(&w, tune_job, &tu, msg, sizeof msg);
    world_close(&w);
    ASSERT_MSG(rc == 0, "%s", msg);
    char text[4096];
    sd_ar_table_format(&tu.t[0], text, sizeof text);
    fprintf(stderr, "%s", text);
    ASSERT_EQ(tu.t[0].n, (int)(sizeof sizes / sizeof sizes[0]));
    for (int i = 0; i < tu.t[0].n; i++) {
        ASSERT(tu.t[0].c[i].ok[SD_AR_NCCL]);
        for (int a = SD_AR_ONESHOT; a < SD_AR_N_ALGOS; a++)
            ASSERT_MSG(tu.t[0].c[i].us[a] <= 0 || tu.t[0].c[i].ok[a], "%s wrong at %zu floats",
                       sd_ar_algo_name((sd_ar_algo)a), tu.t[0].c[i].floats);
        for (int r = 1; r < w.n; r++)
            ASSERT_EQ(tu.t[r].c[i].algo, tu.t[0].c[i].algo);
    }
    printf("RESULT {\"test\": \"comm_autotune\", \"passed\": true}\n");
}

TEST_MAIN(T(custom_allreduce_equals_the_rank_order_sum_bit_for_bit_and_nccl_is_close),
          T(a_captured_oneshot_replays_on_new_data),
          T(fused_allreduce_residual_rmsnorm_matches_the_host),
          T(autotune_checks_every_variant_and_all_ranks_agree_on_the_table))

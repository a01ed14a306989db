/* GPU tests of src/comm.
 *
 * On one GPU (what runs anywhere a GPU is): the custom all-reduce's
 * arithmetic, barriers and flags with P = 2, 4, 8 simulated ranks whose
 * buffers all live in GPU 0's memory (one host thread and one stream per
 * rank, as the engine runs ranks; only the P2P loads are missing):
 * - one-shot and two-shot equal the host's rank-order sum bit for bit on
 *   every rank, 8 KB .. 4 MB (sizes with uneven two-shot slices too), the
 *   variants interleaved over two rounds (the per-block flags never reset);
 * - the fused all-reduce + residual add + RMSNorm: x bit for bit the
 *   unfused path's (x + the rank-order sum), xn against the CPU backend's
 *   rmsnorm (1e-6 of max|xn|), every rank the same bits, F32 and BF16
 *   weights, more rows than blocks; a call that does not fit is refused
 *   (SD_ENOTSUP) with nothing queued;
 * - a one-shot captured into a CUDA graph per rank and replayed on new data;
 * - NCCL with one rank: all-reduce, all-gather, barrier.
 * On 2+ GPUs of one machine (skipped, with the reason, on fewer): one worker
 * thread per GPU, buffers reached over P2P:
 * - NCCL all-reduce and all-gather against host sums (relative 1e-6);
 * - the custom one-shot and two-shot all-reduce equal the host's rank-order
 *   sum bit for bit on every rank, at several sizes, back to back with the
 *   variants interleaved;
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
            cudaSetDevice(w->devices[r]);
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
                /* on the rank's stream: a plain cudaMemcpy from pageable memory may
                 * return before its DMA lands, and s does not wait for it */
                cudaMemcpyAsync(dev, h, n * sizeof(float), cudaMemcpyHostToDevice, s);
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
        cudaMemcpyAsync(dev, h, n * sizeof(float), cudaMemcpyHostToDevice, s);
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
    cudaStream_t rs = (cudaStream_t)w->streams[j->rank];
    cudaMemcpyAsync(part, h, n * 4, cudaMemcpyHostToDevice, rs);
    cudaMemcpyAsync(x, hx, n * 4, cudaMemcpyHostToDevice, rs);
    cudaMemcpyAsync(wt, hw, (size_t)d * 4, cudaMemcpyHostToDevice, rs);
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

/* ---- one GPU: simulated ranks whose buffers share GPU 0 ------------------ */

/* The ranks' host threads meet here between collectives: a rank that failed
 * (allocation, CUDA error) says so before the others launch a kernel that
 * would wait for it forever. The flag is sticky. */
typedef struct meet {
    pthread_barrier_t bar;
    int failed;
    pthread_mutex_t mu;
} meet;

/* 1 when every rank is ok so far */
static int agree(meet *m, int ok)
{
    if (!ok) {
        pthread_mutex_lock(&m->mu);
        m->failed = 1;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_barrier_wait(&m->bar);
    pthread_mutex_lock(&m->mu);
    int f = m->failed;
    pthread_mutex_unlock(&m->mu);
    return !f;
}

/* 0 ready; 1 skip (msg); -1 failure (msg). P ranks, every one on GPU 0. */
static int sim_open(world *w, int P, size_t max_bytes, char *msg, size_t ml)
{
    memset(w, 0, sizeof *w);
    /* one hardware queue per rank's stream (read when the context starts;
     * the simulated tests run first) */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
        cudaGetLastError();
        snprintf(msg, ml, "no CUDA device is visible");
        return 1;
    }
    w->n = P;
    w->seed = sd_test_seed();
    if (cudaSetDevice(0) != cudaSuccess) {
        snprintf(msg, ml, "cudaSetDevice(0) failed");
        return -1;
    }
    for (int r = 0; r < P; r++) {
        cudaStream_t s;
        w->devices[r] = 0;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            snprintf(msg, ml, "cannot make stream %d on GPU 0", r);
            return -1;
        }
        w->streams[r] = s;
    }
    sd_err err = {0};
    if (sd_car_create(&w->car, P, w->devices, w->streams, max_bytes, &err)) {
        snprintf(msg, ml, "%s", err.msg);
        return -1;
    }
    return 0;
}

#define SIM_OPEN(w, P, bytes)                                                              \
    char smsg_[1024];                                                                      \
    int sr_ = sim_open(&(w), (P), (bytes), smsg_, sizeof smsg_);                           \
    if (sr_ != 0)                                                                          \
        world_close(&(w));                                                                 \
    if (sr_ > 0)                                                                           \
        TEST_SKIP("%s", smsg_);                                                            \
    ASSERT_MSG(sr_ == 0, "%d simulated ranks: %s", (P), smsg_)

static const int sim_ranks[] = {2, 4, 8};
#define N_SIM ((int)(sizeof sim_ranks / sizeof sim_ranks[0]))
/* 8 KB .. 4 MB; 2052 and 65548 floats leave uneven two-shot slices */
static const size_t sim_sizes[] = {2048, 2052, 16384, 65548, 262144, 1048576};
#define N_SIM_SIZES ((int)(sizeof sim_sizes / sizeof sim_sizes[0]))
#define SIM_MAXN 1048576

typedef struct sim_ar {
    meet m;
    float *in[MAXG]; /* (SIM_MAXN) each rank's input */
    float *want;     /* (SIM_MAXN) the rank-order sum */
    long wrong[MAXG][SD_AR_N_ALGOS][N_SIM_SIZES];
    double err[MAXG][SD_AR_N_ALGOS][N_SIM_SIZES];
    int calls[MAXG];
} sim_ar;

static int sim_ar_job(job *j)
{
    world *w = j->w;
    sim_ar *st = j->user;
    cudaStream_t s = (cudaStream_t)w->streams[j->rank];
    float *dev = NULL, *h = malloc(SIM_MAXN * sizeof(float));
    int ok = h && cudaMalloc((void **)&dev, SIM_MAXN * sizeof(float)) == cudaSuccess;
    if (!ok)
        snprintf(j->msg, sizeof j->msg, "out of memory");
    /* two rounds, one-shot and two-shot interleaved at every size; every rank
     * meets the others once per call (the same count on every path) */
    const int n_variants = SD_AR_N_ALGOS - SD_AR_ONESHOT;
    for (int it = 0; it < 2 * N_SIM_SIZES * n_variants && agree(&st->m, ok); it++) {
        int k = it / n_variants % N_SIM_SIZES, a = SD_AR_ONESHOT + it % n_variants;
        size_t n = sim_sizes[k];
        int rc = 0;
        ok = cudaMemcpyAsync(dev, st->in[j->rank], n * sizeof(float), cudaMemcpyHostToDevice, s) ==
                 cudaSuccess &&
             !(rc = sd_car_allreduce(w->car, j->rank, dev, n, (sd_ar_algo)a)) &&
             cudaMemcpyAsync(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess;
        if (!ok) {
            snprintf(j->msg, sizeof j->msg, "%s at %zu floats: rc %d, CUDA %s",
                     sd_ar_algo_name((sd_ar_algo)a), n, rc, cudaGetErrorString(cudaGetLastError()));
            continue;
        }
        st->calls[j->rank]++;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&h[i], &st->want[i], sizeof(float))) {
                st->wrong[j->rank][a][k]++;
                double d = fabs((double)h[i] - st->want[i]);
                if (!(d <= st->err[j->rank][a][k])) /* NaN counts too */
                    st->err[j->rank][a][k] = isnan(d) ? INFINITY : d;
            }
    }
    agree(&st->m, ok);
    cudaFree(dev);
    free(h);
    return ok ? 0 : -1;
}

TEST(simulated_ranks_on_one_gpu_oneshot_and_twoshot_equal_the_rank_order_sum_bit_for_bit)
{
    long bad_total = 0;
    for (int pi = 0; pi < N_SIM; pi++) {
        int P = sim_ranks[pi];
        world w;
        SIM_OPEN(w, P, SIM_MAXN * sizeof(float));
        sim_ar *st = calloc(1, sizeof *st);
        ASSERT(st);
        pthread_barrier_init(&st->m.bar, NULL, (unsigned)P);
        pthread_mutex_init(&st->m.mu, NULL);
        st->want = malloc(SIM_MAXN * sizeof(float));
        for (int r = 0; r < P; r++) {
            st->in[r] = malloc(SIM_MAXN * sizeof(float));
            for (size_t i = 0; i < SIM_MAXN; i++)
                st->in[r][i] = input(w.seed, r, i);
        }
        for (size_t i = 0; i < SIM_MAXN; i++) {
            float v = st->in[0][i];
            for (int r = 1; r < P; r++)
                v += st->in[r][i];
            st->want[i] = v;
        }
        char msg[600] = "";
        int rc = run_ranks(&w, sim_ar_job, st, msg, sizeof msg);
        world_close(&w);
        for (int a = SD_AR_ONESHOT; a < SD_AR_N_ALGOS && !rc; a++)
            for (int k = 0; k < N_SIM_SIZES; k++) {
                long bad = 0;
                double e = 0;
                for (int r = 0; r < P; r++) {
                    bad += st->wrong[r][a][k];
                    e = fmax(e, st->err[r][a][k]);
                }
                bad_total += bad;
                printf("RESULT {\"test\": \"sim_allreduce\", \"ranks\": %d, \"algo\": \"%s\", "
                       "\"bytes\": %zu, \"calls\": 2, \"wrong_elements\": %ld, \"error\": %.3g, "
                       "\"bound\": 0, \"passed\": %s}\n",
                       P, sd_ar_algo_name((sd_ar_algo)a), sim_sizes[k] * sizeof(float), bad, e,
                       bad == 0 ? "true" : "false");
            }
        int calls = st->calls[0];
        for (int r = 0; r < P; r++)
            free(st->in[r]);
        free(st->want);
        pthread_barrier_destroy(&st->m.bar);
        pthread_mutex_destroy(&st->m.mu);
        free(st);
        ASSERT_MSG(rc == 0, "%d ranks: %s", P, msg);
        ASSERT_EQ(calls, 2 * N_SIM_SIZES * 2);
    }
    ASSERT_MSG(bad_total == 0, "%ld elements differ from the rank-order sum", bad_total);
}

/* ---- fused, simulated */

typedef struct fshape {
    int rows, d;
} fshape;
/* 40 rows: more than the 36 blocks, so blocks take several rows */
static const fshape fshapes[] = {{1, 4096}, {7, 1024}, {40, 2048}, {3, 7168}};
#define N_FSHAPES ((int)(sizeof fshapes / sizeof fshapes[0]))
static const sd_dtype fdts[] = {SD_DT_F32, SD_DT_BF16};
#define N_FDTS 2
#define FMAX (40 * 2048)

typedef struct sim_fused {
    meet m;
    float *part[MAXG]; /* (FMAX) */
    float *resid;      /* (FMAX) the residual x before the call, the same on every rank */
    void *wt[N_FDTS];  /* (7168) weights in each dtype */
    float *want_x[N_FSHAPES];
    float *want_xn[N_FDTS][N_FSHAPES];
    float *got_x[MAXG][N_FDTS][N_FSHAPES], *got_xn[MAXG][N_FDTS][N_FSHAPES];
    int misfit_rc[MAXG];
} sim_fused;

static int sim_fused_job(job *j)
{
    world *w = j->w;
    sim_fused *st = j->user;
    cudaStream_t s = (cudaStream_t)w->streams[j->rank];
    float *part = NULL, *x = NULL, *xn = NULL;
    void *wt = NULL;
    int ok = cudaMalloc((void **)&part, FMAX * 4) == cudaSuccess &&
             cudaMalloc((void **)&x, FMAX * 4) == cudaSuccess &&
             cudaMalloc((void **)&xn, FMAX * 4) == cudaSuccess &&
             cudaMalloc(&wt, 7168 * 4) == cudaSuccess;
    for (int t = 0; t < N_FDTS && ok; t++)
        for (int k = 0; k < N_FSHAPES && ok; k++) {
            ok = (st->got_x[j->rank][t][k] = malloc(FMAX * 4)) &&
                 (st->got_xn[j->rank][t][k] = malloc(FMAX * 4));
        }
    if (!ok)
        snprintf(j->msg, sizeof j->msg, "out of memory");
    for (int it = 0; it < N_FDTS * N_FSHAPES && agree(&st->m, ok); it++) {
        int t = it / N_FSHAPES, k = it % N_FSHAPES;
        int rows = fshapes[k].rows, d = fshapes[k].d, rc = 0;
        size_t n = (size_t)rows * d;
        ok =
            cudaMemcpyAsync(part, st->part[j->rank], n * 4, cudaMemcpyHostToDevice, s) == 0 &&
            cudaMemcpyAsync(x, st->resid, n * 4, cudaMemcpyHostToDevice, s) == 0 &&
            cudaMemcpyAsync(wt, st->wt[t], (size_t)d * sd_dtype_size(fdts[t]),
                            cudaMemcpyHostToDevice, s) == 0 &&
            !(rc = sd_car_allreduce_add_rmsnorm(w->car, j->rank, part, x, xn, wt, fdts[t], rows, d,
                                                1e-6f)) &&
            cudaMemcpyAsync(st->got_x[j->rank][t][k], x, n * 4, cudaMemcpyDeviceToHost, s) == 0 &&
            cudaMemcpyAsync(st->got_xn[j->rank][t][k], xn, n * 4, cudaMemcpyDeviceToHost, s) == 0 &&
            cudaStreamSynchronize(s) == 0;
        if (!ok)
            snprintf(j->msg, sizeof j->msg, "%d x %d: rc %d, CUDA %s", rows, d, rc,
                     cudaGetErrorString(cudaGetLastError()));
    }
    /* a row length that is not whole float4s: refused on every rank, nothing
     * queued (so no rank waits for another) */
    if (agree(&st->m, ok))
        st->misfit_rc[j->rank] = sd_car_allreduce_add_rmsnorm(w->car, j->rank, part, x, xn, wt,
                                                              SD_DT_F32, 2, 1026, 1e-6f);
    ok = ok && cudaStreamSynchronize(s) == cudaSuccess;
    agree(&st->m, ok);
    cudaFree(part);
    cudaFree(x);
    cudaFree(xn);
    cudaFree(wt);
    return ok ? 0 : -1;
}

TEST(simulated_ranks_on_one_gpu_fused_add_rmsnorm_gives_the_unfused_x_and_the_cpu_norm)
{
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
        cudaGetLastError();
        TEST_SKIP("no CUDA device is visible");
    }
    sd_backend *cpu = NULL;
    ASSERT(sd_cpu_backend_create(&cpu, 2) == 0);
    long bad_total = 0;
    double worst = 0;
    int failed = 0;
    for (int pi = 0; pi < N_SIM; pi++) {
        int P = sim_ranks[pi];
        world w;
        SIM_OPEN(w, P, FMAX * sizeof(float));
        sim_fused *st = calloc(1, sizeof *st);
        ASSERT(st);
        pthread_barrier_init(&st->m.bar, NULL, (unsigned)P);
        pthread_mutex_init(&st->m.mu, NULL);
        for (int r = 0; r < P; r++) {
            st->part[r] = malloc(FMAX * 4);
            for (size_t i = 0; i < FMAX; i++)
                st->part[r][i] = input(w.seed, r, i);
        }
        st->resid = malloc(FMAX * 4);
        for (size_t i = 0; i < FMAX; i++)
            st->resid[i] = 2.0f * input(w.seed, 99, i);
        float wf[7168];
        uint16_t *wb = malloc(7168 * 2);
        for (int c = 0; c < 7168; c++) {
            wf[c] = 1.0f + 0.5f * input(w.seed, 98, (size_t)c);
            wb[c] = sd_f32_to_bf16(wf[c]);
        }
        st->wt[0] = wf;
        st->wt[1] = wb;
        /* the unfused path on the host: x + rank-order sum (fp32), then the
         * CPU backend's rmsnorm of it */
        for (int k = 0; k < N_FSHAPES; k++) {
            int rows = fshapes[k].rows, d = fshapes[k].d;
            size_t n = (size_t)rows * d;
            float *sum = malloc(n * 4);
            st->want_x[k] = malloc(n * 4);
            for (size_t i = 0; i < n; i++) {
                float v = st->part[0][i];
                for (int r = 1; r < P; r++)
                    v += st->part[r][i];
                sum[i] = v;
                st->want_x[k][i] = st->resid[i];
            }
            cpu->ops->add(cpu, st->want_x[k], sum, rows, d);
            for (int t = 0; t < N_FDTS; t++) {
                sd_weight wgt;
                ASSERT(cpu->ops->weight(cpu, &wgt, st->wt[t], fdts[t], 1, d) == 0);
                st->want_xn[t][k] = malloc(n * 4);
                cpu->ops->rmsnorm(cpu, st->want_xn[t][k], st->want_x[k], &wgt, rows, d, d, d,
                                  1e-6f);
                cpu->ops->weight_free(cpu, &wgt);
            }
            free(sum);
        }
        char msg[600] = "";
        int rc = run_ranks(&w, sim_fused_job, st, msg, sizeof msg);
        world_close(&w);
        for (int t = 0; t < N_FDTS && !rc; t++)
            for (int k = 0; k < N_FSHAPES; k++) {
                int rows = fshapes[k].rows, d = fshapes[k].d;
                size_t n = (size_t)rows * d;
                long xbad = 0, rank_diff = 0;
                double e = 0, scale = 0;
                for (size_t i = 0; i < n; i++)
                    scale = fmax(scale, fabs(st->want_xn[t][k][i]));
                for (int r = 0; r < P; r++) {
                    for (size_t i = 0; i < n; i++) {
                        xbad += memcmp(&st->got_x[r][t][k][i], &st->want_x[k][i], 4) != 0;
                        double dd = fabs((double)st->got_xn[r][t][k][i] - st->want_xn[t][k][i]);
                        e = isnan(dd) ? INFINITY : fmax(e, dd);
                    }
                    rank_diff += memcmp(st->got_xn[r][t][k], st->got_xn[0][t][k], n * 4) != 0;
                }
                double rel = e / scale;
                int pass = xbad == 0 && rank_diff == 0 && rel <= 1e-6;
                failed += !pass;
                bad_total += xbad;
                worst = fmax(worst, rel);
                printf("RESULT {\"test\": \"sim_fused_add_rmsnorm\", \"ranks\": %d, \"weight\": "
                       "\"%s\", \"rows\": %d, \"d\": %d, \"x_wrong_elements\": %ld, "
                       "\"ranks_differing\": %ld, \"error\": %.3g, \"bound\": 1e-6, "
                       "\"passed\": %s}\n",
                       P, sd_dtype_name(fdts[t]), rows, d, xbad, rank_diff, rel,
                       pass ? "true" : "false");
            }
        int misfit_ok = 1;
        for (int r = 0; r < P && !rc; r++)
            misfit_ok &= st->misfit_rc[r] == SD_ENOTSUP;
        if (!rc)
            printf("RESULT {\"test\": \"sim_fused_refuses_a_call_that_does_not_fit\", \"ranks\": "
                   "%d, \"rows\": 2, \"d\": 1026, \"error\": %d, \"bound\": 0, \"passed\": %s}\n",
                   P, !misfit_ok, misfit_ok ? "true" : "false");
        failed += !misfit_ok;
        for (int r = 0; r < P; r++) {
            free(st->part[r]);
            for (int t = 0; t < N_FDTS; t++)
                for (int k = 0; k < N_FSHAPES; k++) {
                    free(st->got_x[r][t][k]);
                    free(st->got_xn[r][t][k]);
                }
        }
        for (int k = 0; k < N_FSHAPES; k++) {
            free(st->want_x[k]);
            for (int t = 0; t < N_FDTS; t++)
                free(st->want_xn[t][k]);
        }
        free(st->resid);
        free(wb);
        pthread_barrier_destroy(&st->m.bar);
        pthread_mutex_destroy(&st->m.mu);
        free(st);
        if (rc)
            sd_cpu_backend_destroy(cpu);
        ASSERT_MSG(rc == 0, "%d ranks: %s", P, msg);
    }
    sd_cpu_backend_destroy(cpu);
    ASSERT_MSG(failed == 0,
               "%d fused checks failed: %ld x elements differ from the unfused bits, "
               "worst xn error %.3g of max|xn|",
               failed, bad_total, worst);
}

/* ---- graph capture, simulated */

typedef struct sim_graph {
    meet m;
} sim_graph;

static int sim_graph_job(job *j)
{
    world *w = j->w;
    sim_graph *st = j->user;
    size_t n = 65536;
    cudaStream_t s = (cudaStream_t)w->streams[j->rank];
    float *dev = NULL, *h = malloc(n * sizeof(float));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = h && cudaMalloc((void **)&dev, n * sizeof(float)) == cudaSuccess &&
             cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
        int crc = sd_car_allreduce(w->car, j->rank, dev, n, SD_AR_ONESHOT);
        ok = cudaStreamEndCapture(s, &g) == cudaSuccess && !crc &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    for (int rep = 0; rep < 3 && agree(&st->m, ok); rep++) {
        for (size_t i = 0; i < n; i++)
            h[i] = input(w->seed, j->rank, i) * (float)(rep + 1);
        ok = cudaMemcpyAsync(dev, h, n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess &&
             cudaGraphLaunch(ge, s) == cudaSuccess &&
             cudaMemcpyAsync(h, dev, n * 4, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess;
        for (size_t i = 0; i < n && ok; i++) {
            float want = input(w->seed, 0, i) * (float)(rep + 1);
            for (int r = 1; r < w->n; r++)
                want += input(w->seed, r, i) * (float)(rep + 1);
            if (memcmp(&h[i], &want, sizeof want)) {
                snprintf(j->msg, sizeof j->msg, "replay %d element %zu: %g, want %g", rep, i, h[i],
                         want);
                ok = 0;
            }
        }
    }
    if (!ok && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    agree(&st->m, ok);
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    cudaFree(dev);
    free(h);
    return ok ? 0 : -1;
}

TEST(simulated_ranks_on_one_gpu_a_captured_oneshot_replays_on_new_data)
{
    for (int pi = 0; pi < N_SIM; pi++) {
        int P = sim_ranks[pi];
        world w;
        SIM_OPEN(w, P, 65536 * sizeof(float));
        sim_graph st;
        memset(&st, 0, sizeof st);
        pthread_barrier_init(&st.m.bar, NULL, (unsigned)P);
        pthread_mutex_init(&st.m.mu, NULL);
        char msg[600] = "";
        int rc = run_ranks(&w, sim_graph_job, &st, msg, sizeof msg);
        world_close(&w);
        pthread_barrier_destroy(&st.m.bar);
        pthread_mutex_destroy(&st.m.mu);
        printf("RESULT {\"test\": \"sim_graph_replay\", \"ranks\": %d, \"replays\": 3, "
               "\"error\": %d, \"bound\": 0, \"passed\": %s}\n",
               P, rc != 0, rc ? "false" : "true");
        ASSERT_MSG(rc == 0, "%d ranks: %s", P, msg);
    }
}

/* ---- NCCL with one rank */

TEST(nccl_with_one_rank_allreduce_allgather_and_barrier)
{
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
        cudaGetLastError();
        TEST_SKIP("no CUDA device is visible");
    }
    ASSERT(cudaSetDevice(0) == cudaSuccess);
    cudaStream_t s;
    ASSERT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    int dev0 = 0;
    void *streams[1] = {s};
    sd_nccl_opts o = {.n_local = 1, .devices = &dev0, .streams = streams, .nnodes = 1};
    sd_comm *c = NULL;
    sd_err err = {0};
    int rc = sd_nccl_comm_create(&c, &o, &err);
    if (rc)
        cudaStreamDestroy(s);
    ASSERT_MSG(rc == 0, "%s", err.msg);
    uint64_t seed = sd_test_seed();
    size_t n = 262144;
    float *h = malloc(n * 4), *g = malloc(n * 4 * 1), *d = NULL, *d2 = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = input(seed, 0, i);
    int ok = cudaMalloc((void **)&d, n * 4) == cudaSuccess &&
             cudaMalloc((void **)&d2, n * 4) == cudaSuccess &&
             cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess;
    int ar = ok ? sd_comm_allreduce_sum(c, 0, d, n) : -1;
    ok = ok && ar == 0 && cudaStreamSynchronize(s) == cudaSuccess &&
         cudaMemcpy(g, d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    long ar_bad = 0, ag_bad = 0;
    for (size_t i = 0; i < n && ok; i++)
        ar_bad += memcmp(&g[i], &h[i], 4) != 0;
    int ag = ok ? sd_comm_allgather(c, 0, d2, d, n) : -1;
    ok = ok && ag == 0 && cudaStreamSynchronize(s) == cudaSuccess &&
         cudaMemcpy(g, d2, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; i < n && ok; i++)
        ag_bad += memcmp(&g[i], &h[i], 4) != 0;
    int br = ok ? sd_comm_barrier(c, 0) : -1;
    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(g);
    sd_comm_destroy(c);
    cudaStreamDestroy(s);
    printf("RESULT {\"test\": \"nccl_one_rank\", \"allreduce_wrong\": %ld, \"allgather_wrong\": "
           "%ld, \"barrier_rc\": %d, \"error\": %ld, \"bound\": 0, \"passed\": %s}\n",
           ar_bad, ag_bad, br, ar_bad + ag_bad + (br != 0),
           ok && ar_bad == 0 && ag_bad == 0 && br == 0 ? "true" : "false");
    ASSERT_MSG(ok, "NCCL calls: allreduce %d, allgather %d, CUDA %s", ar, ag,
               cudaGetErrorString(cudaGetLastError()));
    ASSERT_EQ(ar_bad, 0);
    ASSERT_EQ(ag_bad, 0);
    ASSERT_EQ(br, 0);
}

TEST_MAIN(T(simulated_ranks_on_one_gpu_oneshot_and_twoshot_equal_the_rank_order_sum_bit_for_bit),
          T(simulated_ranks_on_one_gpu_fused_add_rmsnorm_gives_the_unfused_x_and_the_cpu_norm),
          T(simulated_ranks_on_one_gpu_a_captured_oneshot_replays_on_new_data),
          T(nccl_with_one_rank_allreduce_allgather_and_barrier),
          T(custom_allreduce_equals_the_rank_order_sum_bit_for_bit_and_nccl_is_close),
          T(a_captured_oneshot_replays_on_new_data),
          T(fused_allreduce_residual_rmsnorm_matches_the_host),
          T(autotune_checks_every_variant_and_all_ranks_agree_on_the_table))

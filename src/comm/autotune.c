/* comm/autotune: which all-reduce for which message size, measured at start
 * on the real topology; and the GPU communicator that follows the table.
 *
 * The table helpers (pick, format, metrics) are plain C; the timing and the
 * communicator need CUDA. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gpu_comm.h"
#include "core/log.h"
#include "core/util.h"

sd_ar_algo sd_ar_table_pick(const sd_ar_table *t, size_t n)
{
    const sd_ar_choice *best = NULL;
    for (int i = 0; t && i < t->n; i++)
        if (t->c[i].floats >= n && (!best || t->c[i].floats < best->floats))
            best = &t->c[i];
    return best ? best->algo : SD_AR_NCCL;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = ((const sd_ar_choice *)a)->floats, y = ((const sd_ar_choice *)b)->floats;
    return x < y ? -1 : x > y;
}

_Static_assert(SD_AR_PATH_FUSED + 1 == SD_COMM_PATHS, "comm.h's paths: the algorithms + fused");

double sd_ar_table_est_us(const sd_ar_table *t, sd_ar_algo a, size_t n)
{
    if (!t || !t->timed || (unsigned)a >= SD_AR_N_ALGOS)
        return 0;
    /* the nearest usable sizes at or below n (lo) and at or above it (hi),
     * and the largest usable size (top) */
    const sd_ar_choice *lo = NULL, *hi = NULL, *top = NULL;
    for (int i = 0; i < t->n; i++) {
        const sd_ar_choice *c = &t->c[i];
        if (!(c->us[a] > 0) || !c->ok[a] || c->floats == 0)
            continue;
        if (c->floats <= n && (!lo || c->floats > lo->floats))
            lo = c;
        if (c->floats >= n && (!hi || c->floats < hi->floats))
            hi = c;
        if (!top || c->floats > top->floats)
            top = c;
    }
    if (!top)
        return 0;
    if (!hi) /* past the largest */
        return top->us[a] * (double)n / (double)top->floats;
    if (!lo || lo == hi)
        return hi->us[a];
    double f = (double)(n - lo->floats) / (double)(hi->floats - lo->floats);
    return lo->us[a] + f * (hi->us[a] - lo->us[a]);
}

static void fmt_us(char *s, size_t n, const sd_ar_choice *c, int a)
{
    if (c->us[a] <= 0)
        snprintf(s, n, "-");
    else
        snprintf(s, n, "%.1f%s", c->us[a], c->ok[a] ? "" : " (wrong)");
}

void sd_ar_table_format(const sd_ar_table *t, char *buf, size_t len)
{
    size_t off = 0;
    if (len)
        buf[0] = 0;
    sd_ar_table s = *t;
    qsort(s.c, (size_t)s.n, sizeof s.c[0], cmp_size);
    sd_bufappend(buf, len, &off, "%12s %12s %8s %12s %12s %12s\n", "floats", "bytes", "pick",
                 "nccl_us", "oneshot_us", "twoshot_us");
    for (int i = 0; i < s.n; i++) {
        const sd_ar_choice *c = &s.c[i];
        char u[SD_AR_N_ALGOS][32];
        for (int a = 0; a < SD_AR_N_ALGOS; a++)
            fmt_us(u[a], sizeof u[a], c, a);
        sd_bufappend(buf, len, &off, "%12zu %12zu %8s %12s %12s %12s\n", c->floats,
                     c->floats * sizeof(float), sd_ar_algo_name(c->algo), u[0], u[1], u[2]);
    }
}

void sd_ar_table_metrics(const sd_ar_table *t, char *buf, size_t len)
{
    size_t off = 0;
    if (len)
        buf[0] = 0;
    sd_ar_table s = *t;
    qsort(s.c, (size_t)s.n, sizeof s.c[0], cmp_size);
    sd_bufappend(buf, len, &off,
        "# HELP specd_allreduce_choice All-reduce algorithm picked at start per message size.\n"
        "# TYPE specd_allreduce_choice gauge\n");
    for (int i = 0; i < s.n; i++)
        sd_bufappend(buf, len, &off, "specd_allreduce_choice{bytes=\"%zu\",algo=\"%s\"} 1\n",
            s.c[i].floats * sizeof(float), sd_ar_algo_name(s.c[i].algo));
    sd_bufappend(buf, len, &off,
        "# HELP specd_allreduce_seconds Measured time of one all-reduce at start.\n"
        "# TYPE specd_allreduce_seconds gauge\n");
    for (int i = 0; i < s.n; i++)
        for (int a = 0; a < SD_AR_N_ALGOS; a++)
            if (s.c[i].us[a] > 0 && s.c[i].ok[a])
                sd_bufappend(buf, len, &off,
                             "specd_allreduce_seconds{bytes=\"%zu\",algo=\"%s\"} %.9g\n",
                             s.c[i].floats * sizeof(float), sd_ar_algo_name((sd_ar_algo)a),
                             s.c[i].us[a] * 1e-6);
}

#if !defined(SD_HAVE_CUDA)
/* sd_ar_algo_name / parse live beside the kernels; without CUDA, here. */
const char *sd_ar_algo_name(sd_ar_algo a)
{
    static const char *n[] = {"nccl", "oneshot", "twoshot"};
    return (unsigned)a < SD_AR_N_ALGOS ? n[a] : "?";
}

int sd_ar_algo_parse(const char *s)
{
    if (!s || !strcmp(s, "auto"))
        return -1;
    for (int a = 0; a < SD_AR_N_ALGOS; a++)
        if (!strcmp(s, sd_ar_algo_name((sd_ar_algo)a)))
            return a;
    return -2;
}
#endif

#ifdef SD_HAVE_CUDA
#include <cuda_runtime_api.h>

#define AT_CUDA(stmt)                                                                           \
    do {                                                                                        \
        cudaError_t e_ = (stmt);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            rc = sd_err_set(err, SD_EDEVICE, "all-reduce autotune: %s failed: %s (%s:%d)",      \
                            #stmt, cudaGetErrorString(e_), __FILE__, __LINE__);                 \
            goto done;                                                                          \
        }                                                                                       \
    } while (0)

/* Runs algorithm a once over dev (n floats) on this rank. */
static int run_algo(sd_comm *nccl, sd_car *car, int rank, float *dev, size_t n, sd_ar_algo a)
{
    return a == SD_AR_NCCL ? sd_comm_allreduce_sum(nccl, rank, dev, n)
                           : sd_car_allreduce(car, rank, dev, n, a);
}

int sd_ar_autotune(sd_comm *nccl, sd_car *car, int rank, const size_t *sizes, int n_sizes,
                   int forced, int iters, sd_ar_table *out, sd_err *err)
{
    memset(out, 0, sizeof *out);
    if (!nccl || n_sizes < 0 || n_sizes > SD_AR_TABLE_MAX || iters < 1)
        return sd_err_set(err, SD_EINVAL, "all-reduce autotune: %d sizes (0..%d), %d iterations",
                          n_sizes, SD_AR_TABLE_MAX, iters);
    if (forced >= SD_AR_N_ALGOS)
        return sd_err_set(err, SD_EINVAL, "--allreduce: unknown algorithm %d", forced);
    int P = nccl->size, rc = 0;
    size_t maxn = 0;
    for (int i = 0; i < n_sizes; i++)
        maxn = SD_MAX(maxn, sizes[i]);
    float *dev = NULL, *host = NULL, *stat_dev = NULL;
    float stat[2 * SD_AR_N_ALGOS];
    host = malloc(SD_MAX(maxn, 1) * sizeof(float));
    if (!host)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    /* on this rank's device (current in the calling thread) */
    AT_CUDA(cudaMalloc((void **)&dev, SD_MAX(maxn, 4) * sizeof(float)));
    AT_CUDA(cudaMalloc((void **)&stat_dev, sizeof stat));
    /* The collectives run on the rank's stream; copies and timing meet them
     * through device-wide syncs (start-up only, never in a step). A call's
     * time includes waiting for the slowest rank, which is what a step pays. */
    for (int s = 0; s < n_sizes; s++) {
        size_t n = sizes[s];
        sd_ar_choice *c = &out->c[out->n++];
        c->floats = n;
        for (int a = 0; a < SD_AR_N_ALGOS; a++) {
            int fits = a == SD_AR_NCCL || (car && sd_car_fits(car, dev, n));
            int want = fits && (forced < 0 || a == forced || a == SD_AR_NCCL);
            if (!want || n == 0)
                continue;
            /* correctness: rank r holds (r + 1) * (i % 7 + 1); the sum is exact */
            for (size_t i = 0; i < n; i++)
                host[i] = (float)((rank + 1) * (int)(i % 7 + 1));
            /* A cudaMemcpy from pageable memory may return before its DMA
             * lands, and the rank's stream (non-blocking) does not wait for
             * it: the device sync does. */
            AT_CUDA(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
            AT_CUDA(cudaDeviceSynchronize());
            if ((rc = run_algo(nccl, car, rank, dev, n, (sd_ar_algo)a))) {
                sd_err_set(err, rc, "all-reduce autotune: %s failed at %zu floats",
                           sd_ar_algo_name((sd_ar_algo)a), n);
                goto done;
            }
            AT_CUDA(cudaDeviceSynchronize());
            AT_CUDA(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
            int ok = 1;
            for (size_t i = 0; i < n && ok; i++)
                ok = host[i] == (float)(P * (P + 1) / 2 * (int)(i % 7 + 1));
            /* timing: warm-up, then iters back-to-back calls */
            double us = 0;
            if (forced < 0) {
                for (int w = 0; w < 3; w++)
                    run_algo(nccl, car, rank, dev, n, (sd_ar_algo)a);
                AT_CUDA(cudaDeviceSynchronize());
                double t0 = sd_now_s();
                for (int it = 0; it < iters; it++)
                    if ((rc = run_algo(nccl, car, rank, dev, n, (sd_ar_algo)a)))
                        goto done;
                AT_CUDA(cudaDeviceSynchronize());
                us = (sd_now_s() - t0) * 1e6 / iters;
            }
            c->us[a] = us > 0 ? us : 1e-3; /* ran (forced: untimed) */
            c->ok[a] = ok;
        }
        /* agree: mean time and "every rank right" over the ranks */
        for (int a = 0; a < SD_AR_N_ALGOS; a++) {
            stat[a] = (float)c->us[a];
            stat[SD_AR_N_ALGOS + a] = (float)c->ok[a];
        }
        AT_CUDA(cudaMemcpy(stat_dev, stat, sizeof stat, cudaMemcpyHostToDevice));
        AT_CUDA(cudaDeviceSynchronize());
        if ((rc = sd_comm_allreduce_sum(nccl, rank, stat_dev, 2 * SD_AR_N_ALGOS))) {
            sd_err_set(err, rc, "all-reduce autotune: exchanging timings failed");
            goto done;
        }
        AT_CUDA(cudaDeviceSynchronize());
        AT_CUDA(cudaMemcpy(stat, stat_dev, sizeof stat, cudaMemcpyDeviceToHost));
        c->algo = SD_AR_NCCL;
        double best = 0;
        for (int a = 0; a < SD_AR_N_ALGOS; a++) {
            c->us[a] = stat[a] / P;
            c->ok[a] = stat[SD_AR_N_ALGOS + a] == (float)P;
            if (c->us[a] > 0 && c->ok[a] && (forced >= 0 ? a == forced : best == 0 || c->us[a] < best)) {
                best = c->us[a];
                c->algo = (sd_ar_algo)a;
            }
        }
        if (n && !c->ok[SD_AR_NCCL]) {
            rc = sd_err_set(err, SD_EDEVICE, "all-reduce autotune: NCCL's sum of %zu floats is wrong",
                            n);
            goto done;
        }
    }
    out->timed = forced < 0;
done:
    if (dev)
        cudaFree(dev);
    if (stat_dev)
        cudaFree(stat_dev);
    free(host);
    return rc;
}

/* ---- the communicator that follows the table */

typedef struct gcomm {
    sd_comm pub;
    sd_comm *nccl;
    sd_car *car;
    sd_ar_table t;
} gcomm;

/* counts one call of n floats down path p (rank 0), with the table's time */
static void gc_count(gcomm *g, int rank, int p, size_t n)
{
    if (rank != 0)
        return;
    double us = sd_ar_table_est_us(&g->t, p == SD_AR_PATH_FUSED ? SD_AR_ONESHOT : (sd_ar_algo)p, n);
    sd_comm_count_path(&g->pub, rank, p, n, (uint64_t)(us * 1e3 + 0.5));
}

static int gc_allreduce(sd_comm *c, int rank, float *buf, size_t n)
{
    gcomm *g = (gcomm *)c;
    sd_ar_algo a = sd_ar_table_pick(&g->t, n);
    /* the pick depends on n and on buf's alignment, alike on every rank */
    if (a != SD_AR_NCCL && g->car && sd_car_fits(g->car, buf, n)) {
        gc_count(g, rank, a, n);
        return sd_car_allreduce(g->car, rank, buf, n, a);
    }
    gc_count(g, rank, SD_AR_NCCL, n);
    return sd_comm_allreduce_sum(g->nccl, rank, buf, n);
}

/* One-shot reads every peer's whole message, like the fused kernel, so the
 * fused kernel goes where one-shot won; where two-shot or NCCL won, the
 * unfused steps (SD_ENOTSUP: the entry point runs them). */
static int gc_allreduce_add_rmsnorm(sd_comm *c, int rank, const float *partial, float *x,
                                    float *xn, const sd_weight *w, int rows, int d, float eps)
{
    gcomm *g = (gcomm *)c;
    size_t n = (size_t)rows * (size_t)d;
    if (!g->car || sd_ar_table_pick(&g->t, n) != SD_AR_ONESHOT)
        return SD_ENOTSUP;
    int rc = sd_car_allreduce_add_rmsnorm(g->car, rank, partial, x, xn, w->data, w->dtype, rows, d,
                                          eps);
    if (rc != SD_ENOTSUP) /* refused: the unfused steps run, and count, instead */
        gc_count(g, rank, SD_AR_PATH_FUSED, n);
    return rc;
}

static int gc_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    return sd_comm_allgather(((gcomm *)c)->nccl, rank, dst, src, n);
}

static int gc_barrier(sd_comm *c, int rank) { return sd_comm_barrier(((gcomm *)c)->nccl, rank); }
static void gc_abort(sd_comm *c) { sd_comm_abort(((gcomm *)c)->nccl); }
static void gc_destroy(sd_comm *c) { free(c); }

static const sd_comm_ops gpu_ops = {
    .name = "gpu",
    .allreduce_sum = gc_allreduce,
    .allgather = gc_allgather,
    .barrier = gc_barrier,
    .abort = gc_abort,
    .destroy = gc_destroy,
    .allreduce_add_rmsnorm = gc_allreduce_add_rmsnorm,
};

int sd_gpu_comm_create(sd_comm **out, sd_comm *nccl, sd_car *car, const sd_ar_table *t,
                       sd_err *err)
{
    *out = NULL;
    if (!nccl)
        return sd_err_set(err, SD_EINVAL, "GPU comm: NCCL communicator missing");
    gcomm *g = calloc(1, sizeof *g);
    if (!g)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    g->nccl = nccl;
    g->car = car;
    if (t)
        g->t = *t;
    g->pub = (sd_comm){.ops = &gpu_ops, .size = nccl->size, .impl = g};
    *out = &g->pub;
    return 0;
}

int sd_gpu_comm_set_table(sd_comm *c, const sd_ar_table *t)
{
    if (!c || c->ops != &gpu_ops || !t)
        return SD_EINVAL;
    ((gcomm *)c)->t = *t;
    return 0;
}

#endif /* SD_HAVE_CUDA */

/* tests/comm/hook_comm.h: a communicator with a fused residual hook, for
 * tests of the paths that take it: a thread comm underneath, and a plain-C
 * all-reduce + add + RMSNorm (the CPU rmsnorm's formula, so the bits agree
 * with the unfused steps) that takes calls of at most max_rows rows and
 * refuses the others with SD_ENOTSUP, as the GPU kernel refuses what does
 * not fit its buffer. The test owns it: set scratch[r] (rows * d floats for
 * the largest call) before any step; hook_comm_close frees those. */
#ifndef SD_TESTS_HOOK_COMM_H
#define SD_TESTS_HOOK_COMM_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/dtype.h"

#define HOOK_COMM_MAXP 4

typedef struct hook_comm {
    sd_comm pub;
    sd_comm *inner;
    int max_rows;
    int calls[HOOK_COMM_MAXP], taken[HOOK_COMM_MAXP]; /* fused calls per rank; those it ran */
    float *scratch[HOOK_COMM_MAXP]; /* allocated up front: nothing allocates in a collective */
} hook_comm;

static int hook_comm_allreduce(sd_comm *c, int rank, float *buf, size_t n)
{
    return sd_comm_allreduce_sum(((hook_comm *)c)->inner, rank, buf, n);
}
static int hook_comm_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    return sd_comm_allgather(((hook_comm *)c)->inner, rank, dst, src, n);
}
static int hook_comm_barrier(sd_comm *c, int rank)
{
    return sd_comm_barrier(((hook_comm *)c)->inner, rank);
}
static void hook_comm_abort(sd_comm *c)
{
    sd_comm_abort(((hook_comm *)c)->inner);
}
static void hook_comm_destroy(sd_comm *c)
{
    (void)c; /* the test owns it: hook_comm_close */
}

/* x += sum; xn = w * (x * r), r = 1 / sqrtf(mean(x^2) + eps), the sum of
 * squares in double; x, xn (rows, d) */
static int hook_comm_fused(sd_comm *c, int rank, const float *partial, float *x, float *xn,
                           const sd_weight *w, int rows, int d, float eps)
{
    hook_comm *h = (hook_comm *)c;
    h->calls[rank]++;
    if (rows > h->max_rows)
        return SD_ENOTSUP;
    h->taken[rank]++;
    size_t n = (size_t)rows * d;
    float *s = h->scratch[rank];
    memcpy(s, partial, n * sizeof(float));
    int rc = sd_comm_allreduce_sum(h->inner, rank, s, n);
    if (rc)
        return rc;
    for (int t = 0; t < rows; t++) {
        float *xr = x + (size_t)t * d, *o = xn + (size_t)t * d;
        const float *sr = s + (size_t)t * d;
        double ss = 0;
        for (int i = 0; i < d; i++) {
            xr[i] += sr[i];
            ss += (double)xr[i] * xr[i];
        }
        float r = 1.0f / sqrtf((float)(ss / d) + eps);
        for (int i = 0; i < d; i++)
            o[i] = sd_load_f32(w->data, w->dtype, (size_t)i) * (xr[i] * r);
    }
    return 0;
}

static const sd_comm_ops hook_comm_ops = {
    .name = "hooked",
    .allreduce_sum = hook_comm_allreduce,
    .allgather = hook_comm_allgather,
    .barrier = hook_comm_barrier,
    .abort = hook_comm_abort,
    .destroy = hook_comm_destroy,
    .allreduce_add_rmsnorm = hook_comm_fused,
};

/* P (<= HOOK_COMM_MAXP) ranks over a fresh thread comm; h->pub is the
 * communicator to hand out. */
static int hook_comm_open(hook_comm *h, int P, int max_rows, sd_err *err)
{
    memset(h, 0, sizeof *h);
    h->max_rows = max_rows;
    int rc = sd_thread_comm_create(&h->inner, P, err);
    h->pub = (sd_comm){.ops = &hook_comm_ops, .size = P, .impl = h};
    return rc;
}

static void hook_comm_close(hook_comm *h)
{
    for (int r = 0; r < HOOK_COMM_MAXP; r++) {
        free(h->scratch[r]);
        h->scratch[r] = NULL;
    }
    if (h->inner)
        sd_comm_destroy(h->inner);
    h->inner = NULL;
}

#endif

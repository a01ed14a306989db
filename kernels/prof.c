/* kernels/prof: a backend that times every op of another one.
 *
 * Each compute op is bracketed by the inner backend's sync, so its wall time
 * is the op's own run time plus one sync; the sync's own cost, measured at
 * wrap time, is taken off. Crude next to a profiler's counters, but it works
 * on any backend and machine, and it is enough to rank where a step's time
 * goes (which op classes, which matmul shapes). It serializes the backend,
 * so it is for measurement runs only, and it has no graphs (every op must
 * run eagerly to be timed). */
#include "kernels/prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROF_KEYS 256

typedef struct prof_key {
    char name[48];
    uint64_t calls;
    double secs;
} prof_key;

typedef struct sd_prof {
    sd_backend *inner;
    sd_ops ops;
    double sync_s; /* an empty sync, subtracted from every op */
    prof_key keys[PROF_KEYS];
    int n_keys;
    double t0;
} sd_prof;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static sd_prof *P(sd_backend *be) { return be->impl; }
static sd_backend *I(sd_backend *be) { return P(be)->inner; }

static void add_key(sd_prof *p, const char *name, double secs)
{
    int i = 0;
    while (i < p->n_keys && strcmp(p->keys[i].name, name))
        i++;
    if (i == p->n_keys) {
        if (p->n_keys == PROF_KEYS)
            i = PROF_KEYS - 1; /* the last key collects the overflow */
        else
            snprintf(p->keys[p->n_keys++].name, sizeof p->keys[i].name, "%s", name);
    }
    p->keys[i].calls++;
    p->keys[i].secs += secs > 0 ? secs : 0;
}

/* sync, run the op, sync: the op's time */
#define TIMED(be, key, call)                                                                       \
    do {                                                                                           \
        sd_prof *p_ = P(be);                                                                       \
        p_->inner->ops->sync(p_->inner);                                                           \
        double t_ = now_s();                                                                       \
        call;                                                                                      \
        p_->inner->ops->sync(p_->inner);                                                           \
        add_key(p_, key, now_s() - t_ - p_->sync_s);                                               \
    } while (0)

/* a key per weight shape: "NAME ROWSxCOLS" */
static void shape_key(char *k, size_t n, const char *name, const sd_weight *w)
{
    snprintf(k, n, "%s %lldx%lld", name, (long long)w->rows, (long long)w->cols);
}

static void *p_alloc(sd_backend *be, size_t b) { return I(be)->ops->alloc(I(be), b); }
static void p_free(sd_backend *be, void *q) { I(be)->ops->free(I(be), q); }
static int p_upload(sd_backend *be, void *d, const void *s, size_t b)
{
    return I(be)->ops->upload(I(be), d, s, b);
}
static int p_download(sd_backend *be, void *d, const void *s, size_t b)
{
    return I(be)->ops->download(I(be), d, s, b);
}
static int p_memset0(sd_backend *be, void *d, size_t b) { return I(be)->ops->memset0(I(be), d, b); }
static int p_weight(sd_backend *be, sd_weight *out, const void *host, sd_dtype dt, int64_t r,
                    int64_t c)
{
    return I(be)->ops->weight(I(be), out, host, dt, r, c);
}
static void p_weight_free(sd_backend *be, sd_weight *w) { I(be)->ops->weight_free(I(be), w); }
static int p_weight_fp8(sd_backend *be, sd_weight *out, const uint8_t *q, const float *s, int64_t r,
                        int64_t c, int bm, int bn)
{
    return I(be)->ops->weight_fp8(I(be), out, q, s, r, c, bm, bn);
}
static int p_sync(sd_backend *be) { return I(be)->ops->sync(I(be)); }
static int p_mem_info(sd_backend *be, size_t *f, size_t *t)
{
    return I(be)->ops->mem_info ? I(be)->ops->mem_info(I(be), f, t) : -1;
}
static int p_upload2d(sd_backend *be, void *d, size_t dp, const void *s, size_t sp, size_t w,
                      size_t r)
{
    return I(be)->ops->upload2d(I(be), d, dp, s, sp, w, r);
}

static void p_embed(sd_backend *be, float *out, const sd_weight *t, const int32_t *ids, int n)
{
    TIMED(be, "embed", I(be)->ops->embed(I(be), out, t, ids, n));
}
static void p_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                      int xs, int os, float eps)
{
    TIMED(be, "rmsnorm", I(be)->ops->rmsnorm(I(be), out, x, w, n, d, xs, os, eps));
}
static void p_matmul(sd_backend *be, float *y, const float *x, const sd_weight *w,
                     const sd_weight *bias, int n, int xs)
{
    char k[48];
    shape_key(k, sizeof k, "matmul", w);
    TIMED(be, k, I(be)->ops->matmul(I(be), y, x, w, bias, n, xs));
}
static void p_matmul_heads(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                           int H, int xs, int xhs, int xo)
{
    char k[48];
    shape_key(k, sizeof k, "matmul_heads", w);
    TIMED(be, k, I(be)->ops->matmul_heads(I(be), y, x, w, n, H, xs, xhs, xo));
}
static void p_add(sd_backend *be, float *y, const float *x, int n, int d)
{
    TIMED(be, "add", I(be)->ops->add(I(be), y, x, n, d));
}
static void p_silu_mul(sd_backend *be, float *out, const float *gu, int n, int inter)
{
    TIMED(be, "silu_mul", I(be)->ops->silu_mul(I(be), out, gu, n, inter));
}
static void p_rope(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                   int rs, int hs, int off)
{
    TIMED(be, "rope", I(be)->ops->rope(I(be), x, pos, r, n, H, rs, hs, off));
}
static void p_gather_rows(sd_backend *be, float *d, const float *s, const int32_t *idx, int n,
                          int dd, int ds, int ss)
{
    TIMED(be, "gather_rows", I(be)->ops->gather_rows(I(be), d, s, idx, n, dd, ds, ss));
}
static void p_copy2d(sd_backend *be, float *d, const float *s, int n, int dd, int ds, int ss)
{
    TIMED(be, "copy2d", I(be)->ops->copy2d(I(be), d, s, n, dd, ds, ss));
}
static void p_attn_gqa(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                       void *kc, void *vc, const sd_attn_batch *b, int Hq, int Hkv, int D, int Dv,
                       int qs, int kvs, float scale)
{
    TIMED(be, "attn_gqa",
          I(be)->ops->attn_gqa(I(be), out, q, k, v, kc, vc, b, Hq, Hkv, D, Dv, qs, kvs, scale));
}
static void p_attn_mla(sd_backend *be, float *out, const float *ql, const float *qpe,
                       const float *c, const float *kpe, void *cache, const sd_attn_batch *b, int H,
                       int C, int R, int qps, int qphs, int cks, float scale)
{
    TIMED(be, "attn_mla",
          I(be)->ops->attn_mla(I(be), out, ql, qpe, c, kpe, cache, b, H, C, R, qps, qphs, cks,
                               scale));
}
static void p_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *lg,
                        const float *bias, int n, const sd_moe_route *r)
{
    TIMED(be, "moe_route", I(be)->ops->moe_route(I(be), ids, wts, lg, bias, n, r));
}
static void p_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                      const float *wts, const sd_experts *ex, int n, int k, int D, void *tmp)
{
    TIMED(be, "moe_ffn", I(be)->ops->moe_ffn(I(be), out, x, ids, wts, ex, n, k, D, tmp));
}
static void p_embed_shard(sd_backend *be, float *out, const sd_weight *t, const int32_t *ids,
                          int n, int first)
{
    TIMED(be, "embed_shard", I(be)->ops->embed_shard(I(be), out, t, ids, n, first));
}
static void p_argmax_rows(sd_backend *be, int32_t *out, const float *x, int n, int V)
{
    TIMED(be, "argmax_rows", I(be)->ops->argmax_rows(I(be), out, x, n, V));
}
static void p_sample_rows(sd_backend *be, int32_t *out, float *ps, const float *lg,
                          const sd_sample_params *sp, int n, int V)
{
    TIMED(be, "sample_rows", I(be)->ops->sample_rows(I(be), out, ps, lg, sp, n, V));
}
static void p_accept_greedy_rows(sd_backend *be, int32_t *na, int32_t *ot, const int32_t *dr,
                                 const int32_t *am, int n, int k)
{
    TIMED(be, "accept_greedy_rows", I(be)->ops->accept_greedy_rows(I(be), na, ot, dr, am, n, k));
}
static void p_accept_sample_rows(sd_backend *be, int32_t *na, int32_t *ot, float *ps,
                                 const float *lg, const int32_t *r0, const float *q,
                                 const int32_t *dr, const int32_t *nd, const sd_sample_params *sp,
                                 int n, int k, int V)
{
    TIMED(be, "accept_sample_rows",
          I(be)->ops->accept_sample_rows(I(be), na, ot, ps, lg, r0, q, dr, nd, sp, n, k, V));
}
static void p_gather_i32(sd_backend *be, int32_t *out, const int32_t *t, const int32_t *idx, int n)
{
    TIMED(be, "gather_i32", I(be)->ops->gather_i32(I(be), out, t, idx, n));
}
static void p_scatter_cols(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                           int ws, int wd)
{
    TIMED(be, "scatter_cols", I(be)->ops->scatter_cols(I(be), dst, src, map, n, ws, wd));
}

static void p_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                          int n, int d, float eps)
{
    TIMED(be, "add_rmsnorm", I(be)->ops->add_rmsnorm(I(be), out, x, y, w, n, d, eps));
}

static void p_rope_kv(sd_backend *be, float *q, float *k, const float *v, void *kc, void *vc,
                      const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv, int D, int Dv,
                      int qs, int kvs)
{
    TIMED(be, "rope_kv", I(be)->ops->rope_kv(I(be), q, k, v, kc, vc, b, r, Hq, Hkv, D, Dv, qs, kvs));
}

static void p_mla_prep(sd_backend *be, float *ckv, int cks, float *qpe, int qps, int qph,
                       const sd_weight *w, float eps, void *cache, const sd_attn_batch *b,
                       const sd_rope *r, int H, int C, int R)
{
    TIMED(be, "mla_prep",
          I(be)->ops->mla_prep(I(be), ckv, cks, qpe, qps, qph, w, eps, cache, b, r, H, C, R));
}

static void p_matmul_silu(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                          int xs)
{
    char k[48];
    shape_key(k, sizeof k, "matmul_silu", w);
    TIMED(be, k, I(be)->ops->matmul_silu(I(be), gu, x, w, n, xs));
}

static void p_moe_router_route(sd_backend *be, int32_t *ids, float *wts, float *lg, const float *x,
                               const sd_weight *w, const float *bias, int n, int xs,
                               const sd_moe_route *r)
{
    TIMED(be, "moe_router_route",
          I(be)->ops->moe_router_route(I(be), ids, wts, lg, x, w, bias, n, xs, r));
}

static void p_matmul_add(sd_backend *be, float *y, const float *x, const sd_weight *w,
                         const sd_weight *bias, int n, int xs, float *tmp)
{
    char k[48];
    shape_key(k, sizeof k, "matmul_add", w);
    TIMED(be, k, I(be)->ops->matmul_add(I(be), y, x, w, bias, n, xs, tmp));
}

static void p_rmsnorm_matmul(sd_backend *be, float *y, float *xn, const float *x,
                             const sd_weight *g, float eps, const sd_weight *w,
                             const sd_weight *bias, int n, int silu)
{
    char k[48];
    shape_key(k, sizeof k, silu ? "rmsnorm_matmul_silu" : "rmsnorm_matmul", w);
    TIMED(be, k, I(be)->ops->rmsnorm_matmul(I(be), y, xn, x, g, eps, w, bias, n, silu));
}

static void p_moe_router_ffn(sd_backend *be, float *out, int32_t *ids, float *wts, float *lg,
                             const float *x, const sd_weight *w, const float *bias,
                             const sd_experts *ex, int n, int D, const sd_moe_route *r, void *tmp)
{
    TIMED(be, "moe_router_ffn",
          I(be)->ops->moe_router_ffn(I(be), out, ids, wts, lg, x, w, bias, ex, n, D, r, tmp));
}

static void p_mla_prep_absorb(sd_backend *be, float *ckv, int cks, float *qpe, int qps, int qph,
                              const sd_weight *w, float eps, void *cache, const sd_attn_batch *b,
                              const sd_rope *r, int H, int C, int R, float *y, const float *x,
                              const sd_weight *wuk, int xs, int xhs)
{
    TIMED(be, "mla_prep_absorb",
          I(be)->ops->mla_prep_absorb(I(be), ckv, cks, qpe, qps, qph, w, eps, cache, b, r, H, C, R,
                                      y, x, wuk, xs, xhs));
}

int sd_prof_backend_wrap(sd_backend **out, sd_backend *inner)
{
    *out = NULL;
    sd_backend *be = calloc(1, sizeof *be);
    sd_prof *p = calloc(1, sizeof *p);
    if (!be || !p) {
        free(be);
        free(p);
        return SD_ENOMEM;
    }
    const sd_ops *o = inner->ops;
    p->inner = inner;
    /* an op the inner backend lacks stays NULL, as the callers expect */
#define W(f) (o->f ? p_##f : NULL)
    p->ops = (sd_ops){.name = o->name,
                      .alloc = p_alloc,
                      .free = p_free,
                      .upload = p_upload,
                      .download = p_download,
                      .memset0 = p_memset0,
                      .weight = p_weight,
                      .weight_free = p_weight_free,
                      .weight_fp8 = W(weight_fp8),
                      .sync = p_sync,
                      .mem_info = W(mem_info),
                      .embed = W(embed),
                      .rmsnorm = W(rmsnorm),
                      .matmul = W(matmul),
                      .matmul_heads = W(matmul_heads),
                      .add = W(add),
                      .silu_mul = W(silu_mul),
                      .rope = W(rope),
                      .gather_rows = W(gather_rows),
                      .copy2d = W(copy2d),
                      .attn_gqa = W(attn_gqa),
                      .attn_mla = W(attn_mla),
                      .moe_route = W(moe_route),
                      .moe_ffn = W(moe_ffn),
                      .embed_shard = W(embed_shard),
                      .argmax_rows = W(argmax_rows),
                      .sample_rows = W(sample_rows),
                      .accept_greedy_rows = W(accept_greedy_rows),
                      .upload2d = W(upload2d),
                      .accept_sample_rows = W(accept_sample_rows),
                      .gather_i32 = W(gather_i32),
                      .add_rmsnorm = W(add_rmsnorm),
                      .scatter_cols = W(scatter_cols),
                      .rope_kv = W(rope_kv),
                      .mla_prep = W(mla_prep),
                      .matmul_silu = W(matmul_silu), .moe_router_route = W(moe_router_route),
                      .matmul_add = W(matmul_add),
                      .rmsnorm_matmul = W(rmsnorm_matmul),
                      .moe_router_ffn = W(moe_router_ffn),
                      .mla_prep_absorb = W(mla_prep_absorb)};
#undef W
    /* the cost of an empty sync, the best of many */
    p->sync_s = 1e9;
    for (int i = 0; i < 200; i++) {
        double t = now_s();
        o->sync(inner);
        t = now_s() - t;
        p->sync_s = t < p->sync_s ? t : p->sync_s;
    }
    p->t0 = now_s();
    *be = (sd_backend){.ops = &p->ops, .device = inner->device, .rank = inner->rank, .impl = p};
    *out = be;
    return 0;
}

sd_backend *sd_prof_inner(sd_backend *be) { return I(be); }

static int by_time(const void *a, const void *b)
{
    double x = ((const prof_key *)a)->secs, y = ((const prof_key *)b)->secs;
    return x < y ? 1 : x > y ? -1 : 0;
}

void sd_prof_report(sd_backend *be, FILE *f)
{
    sd_prof *p = P(be);
    prof_key k[PROF_KEYS];
    memcpy(k, p->keys, (size_t)p->n_keys * sizeof k[0]);
    qsort(k, (size_t)p->n_keys, sizeof k[0], by_time);
    double total = 0;
    for (int i = 0; i < p->n_keys; i++)
        total += k[i].secs;
    fprintf(f, "op time (each op between syncs, %.1f us of sync taken off each; wall %.3f s):\n",
            p->sync_s * 1e6, now_s() - p->t0);
    fprintf(f, "  %-34s %10s %12s %10s %7s\n", "op", "calls", "total ms", "mean us", "share");
    for (int i = 0; i < p->n_keys; i++)
        fprintf(f, "  %-34s %10llu %12.3f %10.2f %6.1f%%\n", k[i].name,
                (unsigned long long)k[i].calls, k[i].secs * 1e3,
                k[i].calls ? k[i].secs * 1e6 / (double)k[i].calls : 0.0,
                total > 0 ? 100.0 * k[i].secs / total : 0.0);
}

void sd_prof_backend_free(sd_backend *be)
{
    if (!be)
        return;
    free(be->impl);
    free(be);
}

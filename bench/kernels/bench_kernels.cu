/* specd-bench-kernels: the memory-bound decode ops of the CUDA backend
 * (matmul on few rows, matmul_heads, moe_ffn, MLA attention: the SIMT
 * kernel against tensor cores) at real model shapes, timed
 * with CUDA events over many calls, eager and replayed from a CUDA graph
 * (no launch gaps), against a measured device-to-device copy and a
 * measured streaming read. Weights rotate over copies larger than L2 in
 * total so every call reads memory, not cache; all data is random.
 *
 *   specd-bench-kernels [--out FILE] [--commit C] [--quick] [--moe-prefill] [--mla]
 *                       [--gemv-lab] [--read-lab] [--chain-lab] [--boundary-lab]
 *                       [--down-lab]
 *
 * moe_ffn also runs at prefill sizes (n = 256 .. 4096 tokens) on the grouped
 * GEMV ("sorted") and on the tensor-core grouped GEMMs ("tc", the
 * SPECD_MOE_TC switch), with TFLOP/s beside the bandwidth; --moe-prefill
 * runs only that comparison.
 *
 * attn_mla (DeepSeek latent shape, 16 and 128 heads, 1 and 4 tokens,
 * contexts 256 .. 32k) on the SIMT fp32 kernel ("simt") and on tensor cores
 * ("tc", the SPECD_MLA_TC switch); --mla runs only that comparison.
 *
 * The achieved bandwidth of an op counts the bytes it must move: each weight
 * byte it touches once, activations in and out once. Prints a table and
 * writes the full record as JSON. Built with CUDA only.
 *
 * SD_BENCH_BASELINE: defined when this file is built against a tree older
 * than the benchmark overrides of sd__cuda (gemv_max_rows,
 * moe_fused_max_pairs), to record the "before" numbers of a change; forced
 * paths are then left out. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"

#define CHECK(x)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* ---- device helpers ----------------------------------------------------- */

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

/* uniform in [-scale, scale), as bf16 or fp32 */
__global__ void fill_kernel(void *p, size_t n, int bf16, float scale, uint32_t seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float f = ((float)(hash32(i, seed) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
        if (bf16)
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(f);
        else
            ((float *)p)[i] = f;
    }
}

/* streaming read of n uint4: the read ceiling a GEMV can hope for */
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *out)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u)
        out[0] = acc; /* keeps the loads */
}

/* ---- timing -------------------------------------------------------------- */

typedef struct bench bench;
typedef void (*op_fn)(bench *b, int rep);

struct bench {
    sd_backend *be;
    sd__cuda *c;
    cudaEvent_t e0, e1;
    /* the op under test */
    op_fn fn;
    void *ctx;
};

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median of `launches` timings of `reps` calls, ms per call */
static double time_eager(bench *b, int reps, int launches)
{
    float t[32];
    for (int l = 0; l < launches; l++) {
        CHECK(cudaEventRecord(b->e0, b->c->stream));
        for (int r = 0; r < reps; r++)
            b->fn(b, r);
        CHECK(cudaEventRecord(b->e1, b->c->stream));
        CHECK(cudaEventSynchronize(b->e1));
        CHECK(cudaEventElapsedTime(&t[l], b->e0, b->e1));
    }
    qsort(t, (size_t)launches, sizeof t[0], cmp_float);
    return t[launches / 2] / reps;
}

static double time_graph(bench *b, int reps, int launches)
{
    sd_cuda_graph *g = NULL;
    if (sd_cuda_capture_begin(b->be))
        return NAN;
    for (int r = 0; r < reps; r++)
        b->fn(b, r);
    if (sd_cuda_capture_end(b->be, &g))
        return NAN;
    float t[32];
    sd_cuda_graph_launch(b->be, g);
    for (int l = 0; l < launches; l++) {
        CHECK(cudaEventRecord(b->e0, b->c->stream));
        sd_cuda_graph_launch(b->be, g);
        CHECK(cudaEventRecord(b->e1, b->c->stream));
        CHECK(cudaEventSynchronize(b->e1));
        CHECK(cudaEventElapsedTime(&t[l], b->e0, b->e1));
    }
    sd_cuda_graph_destroy(g);
    qsort(t, (size_t)launches, sizeof t[0], cmp_float);
    return t[launches / 2] / reps;
}

/* one untimed call (plans are made outside capture), then eager and graph */
static int time_op(bench *b, int reps, double *ms_eager, double *ms_graph)
{
    b->fn(b, 0);
    if (b->be->ops->sync(b->be)) {
        fprintf(stderr, "op failed: %s\n", sd_cuda_backend_error(b->be));
        return -1;
    }
    *ms_eager = time_eager(b, reps, 5);
    *ms_graph = time_graph(b, reps, 7);
    if (b->be->ops->sync(b->be)) {
        fprintf(stderr, "op failed: %s\n", sd_cuda_backend_error(b->be));
        return -1;
    }
    return 0;
}

static void *dev_alloc(bench *b, size_t bytes)
{
    void *p = b->be->ops->alloc(b->be, bytes);
    if (!p) {
        fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static void dev_fill(bench *b, void *p, size_t n, int bf16, float scale, uint32_t seed)
{
    fill_kernel<<<1024, 256, 0, b->c->stream>>>(p, n, bf16, scale, seed);
    CHECK(cudaGetLastError());
}

/* ---- JSON ------------------------------------------------------------------ */

typedef struct out {
    FILE *json;
    int first;
} out;

static void jrow(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jrow(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(o->json, "%s\n    {", o->first ? "" : ",");
    vfprintf(o->json, fmt, ap);
    fprintf(o->json, "}");
    va_end(ap);
    o->first = 0;
}

/* ---- matmul ------------------------------------------------------------------ */

/* a weight of backend memory d, no FP8 scales */
static sd_weight bw(const void *d, sd_dtype dt, int64_t rows, int64_t cols)
{
    sd_weight w{};
    w.data = d;
    w.dtype = dt;
    w.rows = rows;
    w.cols = cols;
    return w;
}

typedef struct mm_ctx {
    int n, N, K, H, copies; /* H > 0: matmul_heads with H heads of N rows */
    void *w;                /* copies x (H or 1) x N x K bf16 (fp8: bytes) */
    float *x, *y;
    float *scale; /* fp8: one F32 scale a 128 x 128 block, shared by the copies */
} mm_ctx;

static void mm_fn(bench *b, int rep)
{
    mm_ctx *m = (mm_ctx *)b->ctx;
    int heads = m->H > 0 ? m->H : 1;
    size_t per = (size_t)heads * (size_t)m->N * (size_t)m->K * (m->scale ? 1 : 2);
    sd_weight w = bw((const char *)m->w + (size_t)(rep % m->copies) * per,
                     m->scale ? SD_DT_F8_E4M3 : SD_DT_BF16, (int64_t)heads * m->N, m->K);
#ifndef SD_BENCH_BASELINE
    if (m->scale) {
        w.scale = m->scale;
        w.block[0] = w.block[1] = 128;
        w.scale_cols = (m->K + 127) / 128;
    }
#endif
    if (m->H > 0)
        b->be->ops->matmul_heads(b->be, m->y, m->x, &w, m->n, m->H, m->H * m->K, m->K, 0);
    else
        b->be->ops->matmul(b->be, m->y, m->x, &w, NULL, m->n, m->K);
}

static double copy_gbps, read_gbps;

/* one matmul shape at several row counts; path: "gemv", "lt" (cuBLASLt
 * forced) or "auto" (the built-in choice) */
static void bench_mm(bench *b, out *o, const char *name, int N, int K, int H, const int *ns,
                     int nn, const char *path)
{
#ifdef SD_BENCH_BASELINE
    if (strcmp(path, "auto"))
        return;
#endif
    int heads = H > 0 ? H : 1;
    /* fp8: block-scaled E4M3 bytes (the GEMV's rows only: no dequantization
     * scratch here) */
    const int fp8 = !strncmp(path, "fp8", 3); /* fp8n: SPECD_F8_WIDE=0's shapes */
    size_t wbytes = (size_t)heads * (size_t)N * (size_t)K * (fp8 ? 1 : 2);
    int copies = (int)((768ull << 20) / wbytes) + 1;
    if (copies > 64)
        copies = 64;
    mm_ctx m = {0, N, K, H, copies, NULL, NULL, NULL, NULL};
    m.w = dev_alloc(b, wbytes * (size_t)copies);
    dev_fill(b, m.w, wbytes / 2 * (size_t)copies, 1, 0.05f, 7);
    size_t nscale = (size_t)((N + 127) / 128) * (size_t)((K + 127) / 128);
    if (fp8) {
        m.scale = (float *)dev_alloc(b, nscale * 4);
        dev_fill(b, m.scale, nscale, 0, 0.01f, 5);
        wbytes += nscale * 4;
    }
    int nmax = 0;
    for (int i = 0; i < nn; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    m.x = (float *)dev_alloc(b, (size_t)nmax * heads * K * 4);
    m.y = (float *)dev_alloc(b, (size_t)nmax * heads * N * 4);
    dev_fill(b, m.x, (size_t)nmax * heads * K, 0, 1.0f, 11);
    b->fn = mm_fn;
    b->ctx = &m;
#ifndef SD_BENCH_BASELINE
    int saved = b->c->gemv_max_rows, saved_few = b->c->gemv_few, saved_f8 = b->c->f8_wide;
    if (!strcmp(path, "fp8n"))
        b->c->f8_wide = 0;
    if (!strcmp(path, "onepass"))
        b->c->gemv_few = 0;
    if (!strcmp(path, "gemv"))
        b->c->gemv_max_rows = 1 << 20;
    else if (!strcmp(path, "lt"))
        b->c->gemv_max_rows = 1; /* rows >= 2 go to cuBLASLt */

#endif
    for (int i = 0; i < nn; i++) {
        m.n = ns[i];
        int reps = copies < 16 ? 16 : copies;
        double me, mg;
        if (time_op(b, reps, &me, &mg))
            exit(1);
        double bytes = (double)wbytes + (double)m.n * heads * (K + N) * 4.0;
        double gbps = bytes / (mg * 1e-3) / 1e9;
        printf("%-22s %-5s %6d %6d %3d %9.2f %9.2f %8.0f %6.3f %6.3f\n", name, path, N, K, m.n,
               mg * 1e3, me * 1e3, gbps, gbps / copy_gbps, gbps / read_gbps);
        jrow(o,
             "\"op\": \"%s\", \"name\": \"%s\", \"path\": \"%s\", \"N\": %d, \"K\": %d, \"heads\": %d, "
             "\"n\": %d, \"us_graph\": %.3f, \"us_eager\": %.3f, \"bytes\": %.0f, \"gbps\": %.1f, "
             "\"frac_copy\": %.4f, \"frac_read\": %.4f",
             H > 0 ? "matmul_heads" : "matmul", name, path, N, K, heads, m.n, mg * 1e3, me * 1e3,
             bytes, gbps, gbps / copy_gbps, gbps / read_gbps);
        fflush(stdout);
    }
#ifndef SD_BENCH_BASELINE
    b->c->gemv_max_rows = saved;
    b->c->gemv_few = saved_few;
    b->c->f8_wide = saved_f8;

#endif
    b->be->ops->free(b->be, m.w);
    b->be->ops->free(b->be, m.x);
    b->be->ops->free(b->be, m.y);
    if (m.scale)
        b->be->ops->free(b->be, m.scale);
}

/* ---- moe ------------------------------------------------------------------------ */

typedef struct moe_ctx {
    int n, K, D, I, E, sets;
    sd_experts ex;
    int32_t *ids; /* sets x (n, K) */
    float *wts, *x, *out, *tmp;
} moe_ctx;

static void moe_fn(bench *b, int rep)
{
    moe_ctx *m = (moe_ctx *)b->ctx;
    size_t off = (size_t)(rep % m->sets) * (size_t)m->n * (size_t)m->K;
    b->be->ops->moe_ffn(b->be, m->out, m->x, m->ids + off, m->wts + off, &m->ex, m->n, m->K, m->D,
                        m->tmp);
}

static void bench_moe(bench *b, out *o, int D, int I, int E, int K, const int *ns, int nn,
                      const char *path)
{
#ifdef SD_BENCH_BASELINE
    if (strcmp(path, "auto"))
        return;
#endif
    size_t eb = (size_t)I * (size_t)D * 2;
    char *w = (char *)dev_alloc(b, eb * 3 * (size_t)E);
    dev_fill(b, w, eb * 3 * (size_t)E / 2, 1, 0.05f, 3);
    sd_weight *ws = (sd_weight *)calloc((size_t)E * 3, sizeof(sd_weight));
    for (int e = 0; e < E; e++) {
        ws[e] = bw(w + eb * (size_t)(3 * e), SD_DT_BF16, I, D);
        ws[E + e] = bw(w + eb * (size_t)(3 * e + 1), SD_DT_BF16, I, D);
        ws[2 * E + e] = bw(w + eb * (size_t)(3 * e + 2), SD_DT_BF16, D, I);
    }
    int nmax = 0;
    for (int i = 0; i < nn; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    const int sets = 16;
    moe_ctx m;
    memset(&m, 0, sizeof m);
    m.K = K;
    m.D = D;
    m.I = I;
    m.E = E;
    m.sets = sets;
    m.ex = (sd_experts){E, ws, ws + E, ws + 2 * E, 0};
    size_t mids = (size_t)sets * (size_t)nmax * (size_t)K;
    m.ids = (int32_t *)dev_alloc(b, mids * 4);
    m.wts = (float *)dev_alloc(b, mids * 4);
    m.x = (float *)dev_alloc(b, (size_t)nmax * D * 4);
    m.out = (float *)dev_alloc(b, (size_t)nmax * D * 4);
    m.tmp = (float *)dev_alloc(b, SD_MOE_TMP_FLOATS(nmax, K, D, I) * 4);
    dev_fill(b, m.x, (size_t)nmax * D, 0, 1.0f, 5);
    int32_t *hids = (int32_t *)malloc(mids * 4);
    float *hw = (float *)malloc(mids * 4);
    b->fn = moe_fn;
    b->ctx = &m;
#ifndef SD_BENCH_BASELINE
    int saved = b->c->moe_fused_max_pairs, saved_tc = b->c->moe_tc;
    if (!strcmp(path, "fused")) {
        b->c->moe_fused_max_pairs = 1 << 30;
    } else if (!strcmp(path, "sorted")) {
        b->c->moe_fused_max_pairs = 1; /* top_k >= 2: never fused */
        b->c->moe_tc = 0;              /* the grouped GEMV even under SPECD_MOE_TC=1 */
    } else if (!strcmp(path, "tc")) {
        b->c->moe_fused_max_pairs = 1;
        b->c->moe_tc = 1;
    }
#endif
    uint64_t s = 0x1234567ull;
    for (int i = 0; i < nn; i++) {
        m.n = ns[i];
        /* sets of K distinct experts per token, laid out for this n */
        double touched = 0;
        for (int st = 0; st < sets; st++) {
            unsigned char used[1024] = {0};
            int distinct = 0;
            for (int t = 0; t < m.n; t++) {
                for (int j = 0; j < K; j++) {
                    int e, dup;
                    do {
                        s = s * 6364136223846793005ull + 1442695040888963407ull;
                        e = (int)((s >> 33) % (uint64_t)E);
                        dup = 0;
                        for (int q = 0; q < j; q++)
                            dup |= hids[((size_t)st * m.n + t) * K + q] == e;
                    } while (dup);
                    hids[((size_t)st * m.n + t) * K + j] = e;
                    hw[((size_t)st * m.n + t) * K + j] = 0.1f + (float)(s >> 40 & 255) / 512.0f;
                    distinct += !used[e];
                    used[e] = 1;
                }
            }
            touched += distinct;
        }
        touched /= sets;
        b->be->ops->upload(b->be, m.ids, hids, (size_t)sets * m.n * K * 4);
        b->be->ops->upload(b->be, m.wts, hw, (size_t)sets * m.n * K * 4);
        double me, mg;
        if (time_op(b, sets, &me, &mg))
            exit(1);
        double bytes = touched * 3.0 * (double)eb + (double)m.n * D * 8.0;
        double gbps = bytes / (mg * 1e-3) / 1e9;
        /* gate, up and down of every (token, slot) pair: 2 flops a weight */
        double tflops = 2.0 * m.n * K * 3.0 * (double)D * I / (mg * 1e-3) / 1e12;
        printf("%-22s %-6s D=%d I=%d E=%d top-%d n=%-4d %9.2f %9.2f %8.0f %6.3f %6.3f  (%.1f experts) "
               "%.1f TFLOP/s\n",
               "moe_ffn", path, D, I, E, K, m.n, mg * 1e3, me * 1e3, gbps, gbps / copy_gbps,
               gbps / read_gbps, touched, tflops);
        jrow(o,
             "\"op\": \"moe_ffn\", \"path\": \"%s\", \"D\": %d, \"I\": %d, \"experts\": %d, "
             "\"top_k\": %d, \"n\": %d, \"experts_touched\": %.2f, \"us_graph\": %.3f, "
             "\"us_eager\": %.3f, \"bytes\": %.0f, \"gbps\": %.1f, \"frac_copy\": %.4f, "
             "\"frac_read\": %.4f, \"tflops\": %.2f",
             path, D, I, E, K, m.n, touched, mg * 1e3, me * 1e3, bytes, gbps, gbps / copy_gbps,
             gbps / read_gbps, tflops);
        fflush(stdout);
    }
#ifndef SD_BENCH_BASELINE
    b->c->moe_fused_max_pairs = saved;
    b->c->moe_tc = saved_tc;
#endif
    free(hids);
    free(hw);
    void *ps[] = {w, m.ids, m.wts, m.x, m.out, m.tmp};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        b->be->ops->free(b->be, ps[i]);
    free(ws);
}

/* ---- attention (MLA, and GQA beside it) -------------------------------------------- */

/* attn_mla at the DeepSeek latent shape (C = 512, R = 64, fp32 cache rows of
 * 576 floats), or attn_gqa at the Llama-3-8B shape (path "gqa"): T tokens
 * at the end of one sequence of ctx positions. Each
 * call takes another sequence (its own cache region), copies of them
 * together well past L2, so every call reads its cache from memory. */
#define MLA_BS 16 /* KV block size: the engine's default */
#define GQA_KV 8  /* attn_gqa: KV heads (Llama-3-8B) */

typedef struct attn_ctx {
    int T, H, ctx, copies, max_blocks;
    int gqa; /* attn_gqa at the Llama-3-8B shape instead (32 query heads, 8 KV heads, 128 dims) */
    float *qlat, *qpe, *ckv, *cache, *vcache, *out;
    int32_t *pos, *seq, *slot, *table; /* seq and slot: copies x T */
} attn_ctx;

static void attn_fn(bench *b, int rep)
{
    attn_ctx *m = (attn_ctx *)b->ctx;
    int cp = rep % m->copies;
    sd_attn_batch ab = {m->T, m->pos, m->seq + (size_t)cp * m->T, m->slot + (size_t)cp * m->T,
                        m->table, m->max_blocks, MLA_BS, m->ctx};
    if (m->gqa)
        b->be->ops->attn_gqa(b->be, m->out, m->qlat, NULL, NULL, m->cache, m->vcache, &ab, m->H,
                             GQA_KV, 128, 128, m->H * 128, 0, 1.0f / sqrtf(128.0f));
    else
        b->be->ops->attn_mla(b->be, m->out, m->qlat, m->qpe, m->ckv, m->ckv + 512, m->cache, &ab,
                             m->H, 512, 64, m->H * 64, 64, 576, 1.0f / sqrtf(192.0f));
}

/* path: "simt" (sd_cuda_set_mla_tc off), "tc" (tensor cores), "dec" (mla_dec_kernel for <= 8 tokens, off by default)
 * or "tc4" (tensor cores, split chunks of at least 4 tiles: the first
 * version's constant) */
static void bench_attn(bench *b, out *o, int H, int T, const int *ctxs, int nc, const char *path)
{
    const int gqa = !strcmp(path, "gqa");
    /* a cached row: the latent and rope key (MLA), or K of the KV heads (GQA; V beside) */
    const size_t row = gqa ? GQA_KV * 128 : 576, qd = gqa ? 128 : 512;
#ifdef SD_BENCH_BASELINE
    if (strcmp(path, "simt") && !gqa)
        return;
#else
    sd_cuda_set_mla_tc(b->be, strcmp(path, "simt") != 0);
    sd_cuda_set_mla_dec(b->be, !strcmp(path, "dec"));
    b->c->mla_min_chunk = !strcmp(path, "tc4") ? 256 : 0;
#endif
    for (int i = 0; i < nc; i++) {
        attn_ctx m;
        memset(&m, 0, sizeof m);
        m.T = T;
        m.H = H;
        m.gqa = gqa;
        m.ctx = ctxs[i];
        m.max_blocks = (m.ctx + MLA_BS - 1) / MLA_BS;
        double seq_bytes = (double)m.ctx * (double)row * 4.0 * (gqa ? 2 : 1);
        int copies = (int)ceil((256.0 * 1048576.0) / seq_bytes);
        m.copies = copies < 16 ? 16 : copies > 1024 ? 1024 : copies;
        size_t slots = (size_t)m.copies * (size_t)m.max_blocks * MLA_BS;
        m.cache = (float *)dev_alloc(b, slots * row * 4);
        dev_fill(b, m.cache, slots * row, 0, 1.0f, 13);
        if (gqa) {
            m.vcache = (float *)dev_alloc(b, slots * row * 4);
            dev_fill(b, m.vcache, slots * row, 0, 1.0f, 29);
        }
        m.qlat = (float *)dev_alloc(b, (size_t)T * H * qd * 4);
        m.qpe = (float *)dev_alloc(b, (size_t)T * H * 64 * 4);
        m.ckv = (float *)dev_alloc(b, (size_t)T * 576 * 4);
        m.out = (float *)dev_alloc(b, (size_t)T * H * qd * 4);
        dev_fill(b, m.qlat, (size_t)T * H * qd, 0, 1.0f, 17);
        dev_fill(b, m.qpe, (size_t)T * H * 64, 0, 1.0f, 19);
        dev_fill(b, m.ckv, (size_t)T * 576, 0, 1.0f, 23);
        /* sequence cp owns blocks cp * max_blocks ..; its T tokens are its last positions */
        int32_t *tab = (int32_t *)malloc((size_t)m.copies * m.max_blocks * 4);
        int32_t *sq = (int32_t *)malloc((size_t)m.copies * T * 4);
        int32_t *sl = (int32_t *)malloc((size_t)m.copies * T * 4);
        int32_t *ps = (int32_t *)malloc((size_t)T * 4);
        for (int c = 0; c < m.copies; c++)
            for (int k = 0; k < m.max_blocks; k++)
                tab[(size_t)c * m.max_blocks + k] = c * m.max_blocks + k;
        for (int t = 0; t < T; t++) {
            ps[t] = m.ctx - T + t;
            for (int c = 0; c < m.copies; c++) {
                sq[(size_t)c * T + t] = c;
                sl[(size_t)c * T + t] = (c * m.max_blocks + ps[t] / MLA_BS) * MLA_BS + ps[t] % MLA_BS;
            }
        }
        m.table = (int32_t *)dev_alloc(b, (size_t)m.copies * m.max_blocks * 4);
        m.seq = (int32_t *)dev_alloc(b, (size_t)m.copies * T * 4);
        m.slot = (int32_t *)dev_alloc(b, (size_t)m.copies * T * 4);
        m.pos = (int32_t *)dev_alloc(b, (size_t)T * 4);
        b->be->ops->upload(b->be, m.table, tab, (size_t)m.copies * m.max_blocks * 4);
        b->be->ops->upload(b->be, m.seq, sq, (size_t)m.copies * T * 4);
        b->be->ops->upload(b->be, m.slot, sl, (size_t)m.copies * T * 4);
        b->be->ops->upload(b->be, m.pos, ps, (size_t)T * 4);
        b->fn = attn_fn;
        b->ctx = &m;
        double me, mg;
        if (time_op(b, m.copies, &me, &mg))
            exit(1);
        /* the bytes a step must read: the sequence's cache once (its tokens
         * and head groups share it), queries in, outputs out */
        double bytes = seq_bytes + (double)T * H * (gqa ? 256 : 512 + 64 + 512) * 4.0;
        double gbps = bytes / (mg * 1e-3) / 1e9;
        const char *op = gqa ? "attn_gqa" : "attn_mla";
        char name[64];
        snprintf(name, sizeof name, "%s H=%d ctx=%d", gqa ? "gqa" : "mla", H, m.ctx);
        printf("%-22s %-5s %6d %3d %3d %9.2f %9.2f %8.0f %6.3f %6.3f\n", op, path, m.ctx, H,
               T, mg * 1e3, me * 1e3, gbps, gbps / copy_gbps, gbps / read_gbps);
        jrow(o,
             "\"op\": \"%s\", \"name\": \"%s\", \"path\": \"%s\", \"heads\": %d, \"ctx\": %d, "
             "\"n\": %d, \"copies\": %d, \"us_graph\": %.3f, \"us_eager\": %.3f, \"bytes\": %.0f, "
             "\"gbps\": %.1f, \"frac_copy\": %.4f, \"frac_read\": %.4f",
             op, name, path, H, m.ctx, T, m.copies, mg * 1e3, me * 1e3, bytes, gbps, gbps / copy_gbps,
             gbps / read_gbps);
        fflush(stdout);
        free(tab);
        free(sq);
        free(sl);
        free(ps);
        void *ptrs[] = {m.cache, m.qlat, m.qpe, m.ckv, m.out, m.table, m.seq, m.slot, m.pos, m.vcache};
        for (size_t k = 0; k < sizeof ptrs / sizeof ptrs[0]; k++)
            if (ptrs[k])
                b->be->ops->free(b->be, ptrs[k]);
    }
#ifndef SD_BENCH_BASELINE
    sd_cuda_set_mla_tc(b->be, 1); /* the defaults */
    sd_cuda_set_mla_dec(b->be, 1);
    b->c->mla_min_chunk = 0;
#endif
}

/* SIMT fp32 against tensor cores: decode (1 token) and a 4-token verify,
 * DeepSeek-V2-Lite (16) and V3 (128) heads per rank; quick: 16 heads, decode,
 * three contexts */
static void bench_mla_all(bench *b, out *o, int quick)
{
    static const int ctx_all[] = {256, 1024, 4096, 8192, 16384, 32768};
    static const int ctx_quick[] = {256, 4096, 32768};
    static const int Hs[] = {16, 128}, Ts[] = {1, 4};
    static const char *paths[] = {"simt", "tc4", "tc"};
    static const int ctx_short[] = {64, 128, 192, 256, 512, 1024, 4096};
    printf("\n%-22s %-5s %6s %3s %3s %9s %9s %8s %6s %6s\n", "op", "path", "ctx", "H", "T",
           "us/graph", "us/eager", "GB/s", "/copy", "/read");
    for (int hi = 0; hi < (quick ? 1 : 2); hi++)
        for (int ti = 0; ti < (quick ? 1 : 2); ti++)
            for (int pi = 0; pi < 3; pi++)
                bench_attn(b, o, Hs[hi], Ts[ti], quick ? ctx_quick : ctx_all, quick ? 3 : 6,
                          paths[pi]);
    /* short contexts: decode's usual case; GQA at the Llama-3-8B shape beside */
    for (int ti = 0; ti < 2; ti++) {
        bench_attn(b, o, 32, Ts[ti], ctx_short, 7, "gqa");
        bench_attn(b, o, 16, Ts[ti], ctx_short, 7, "tc");
        bench_attn(b, o, 16, Ts[ti], ctx_short, 7, "dec");
    }
}


/* ---- the GEMV lab (--gemv-lab) -------------------------------------------------
 *
 * The decode GEMV at the shapes of both real-size models, and a whole
 * batch-1 step of the Llama-3-8B shape without attention: 32 layers of the
 * real ops in their order with their dependencies (qkv, rope, o,
 * add_rmsnorm, gate/up, silu_mul, down, add_rmsnorm; each layer its own
 * weights, 14 GB in all), the head and its argmax, replayed from one graph,
 * programmatic dependent launch off and on. The step's bytes over
 * the measured copy bandwidth are its floor; how far the step is above it is
 * what the GEMVs and the kernel boundaries cost. */
typedef struct step_ctx {
    int L, D, I, Q; /* layers, hidden, intermediate, q+k+v width */
    void *w;        /* per layer: qkv (Q, D), o (D, D), gate_up (2I, D), down (D, I); head (V, D) */
    int V;
    float *x, *xn, *qkv, *ao, *gu, *fo, *logits;
    const void *norm; /* (D) bf16 */
    float *inv_freq;
    int32_t *pos, *tok;
} step_ctx;

static size_t step_layer_elems(const step_ctx *s)
{
    return (size_t)s->Q * s->D + (size_t)s->D * s->D + 2 * (size_t)s->I * s->D +
           (size_t)s->D * s->I;
}

static void step_fn(bench *b, int rep)
{
    (void)rep;
    step_ctx *s = (step_ctx *)b->ctx;
    const sd_ops *op = b->be->ops;
    sd_backend *be = b->be;
    sd_weight nw = bw(s->norm, SD_DT_BF16, 1, s->D);
    sd_rope rope = {s->inv_freq, 128, 0, 1.0f};
    for (int l = 0; l < s->L; l++) {
        const uint16_t *base = (const uint16_t *)s->w + (size_t)l * step_layer_elems(s);
        sd_weight wqkv = bw(base, SD_DT_BF16, s->Q, s->D);
        sd_weight wo = bw(base + (size_t)s->Q * s->D, SD_DT_BF16, s->D, s->D);
        sd_weight wgu =
            bw((const uint16_t *)wo.data + (size_t)s->D * s->D, SD_DT_BF16, 2 * s->I, s->D);
        sd_weight wd =
            bw((const uint16_t *)wgu.data + 2 * (size_t)s->I * s->D, SD_DT_BF16, s->D, s->I);
        op->matmul(be, s->qkv, s->xn, &wqkv, NULL, 1, s->D);
        op->rope(be, s->qkv, s->pos, &rope, 1, (s->Q - s->D / 4) / 128, s->Q, 128, 0);
        /* attention's output stands in as the first D columns of qkv */
        op->matmul(be, s->ao, s->qkv, &wo, NULL, 1, s->D);
        op->add_rmsnorm(be, s->xn, s->x, s->ao, &nw, 1, s->D, 1e-5f);
        op->matmul(be, s->gu, s->xn, &wgu, NULL, 1, s->D);
        op->silu_mul(be, s->gu, s->gu, 1, s->I);
        op->matmul(be, s->fo, s->gu, &wd, NULL, 1, s->I);
        op->add_rmsnorm(be, s->xn, s->x, s->fo, &nw, 1, s->D, 1e-5f);
    }
    sd_weight head =
        bw((const uint16_t *)s->w + (size_t)s->L * step_layer_elems(s), SD_DT_BF16, s->V, s->D);
    op->matmul(be, s->logits, s->xn, &head, NULL, 1, s->D);
    op->argmax_rows(be, s->tok, s->logits, 1, s->V);
}

static void bench_step(bench *b, out *o)
{
    step_ctx s = {32, 4096, 14336, 6144, NULL, 128256, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                  NULL, NULL, NULL, NULL};
    size_t elems = step_layer_elems(&s) * (size_t)s.L + (size_t)s.V * s.D;
    s.w = dev_alloc(b, elems * 2);
    dev_fill(b, s.w, elems, 1, 0.02f, 5);
    float *f = (float *)dev_alloc(b, (size_t)(2 * s.D + s.Q + s.D + 2 * s.I + s.D + s.V) * 4);
    s.x = f;
    s.xn = s.x + s.D;
    s.qkv = s.xn + s.D;
    s.ao = s.qkv + s.Q;
    s.gu = s.ao + s.D;
    s.fo = s.gu + 2 * s.I;
    s.logits = s.fo + s.D;
    dev_fill(b, s.x, (size_t)2 * s.D, 0, 1.0f, 9);
    void *norm = dev_alloc(b, (size_t)s.D * 2);
    dev_fill(b, norm, (size_t)s.D, 1, 1.0f, 13);
    s.norm = norm;
    s.inv_freq = (float *)dev_alloc(b, 64 * 4);
    float inv[64];
    for (int i = 0; i < 64; i++)
        inv[i] = powf(500000.0f, -(float)i / 64.0f);
    b->be->ops->upload(b->be, s.inv_freq, inv, sizeof inv);
    s.pos = (int32_t *)dev_alloc(b, 8);
    s.tok = s.pos + 1;
    int32_t p0 = 100;
    b->be->ops->upload(b->be, s.pos, &p0, 4);
    b->fn = step_fn;
    b->ctx = &s;
    double bytes = (double)elems * 2.0;
    printf("\nbatch-1 step of the Llama-3-8B shape without attention, with the head's argmax (%.2f GB of weights, floor "
           "%.1f us at the copy bandwidth)\n%-10s %4s %10s %8s\n", bytes / 1e9,
           bytes / copy_gbps / 1e3, "path", "pdl", "us/step", "/floor");
    int saved_pdl = b->c->pdl;
    for (int round = 0; round < 2; round++)
        for (int pdl = 0; pdl < 2; pdl++) {
            sd_cuda_set_pdl(b->be, pdl);
            double me, mg;
            if (time_op(b, 1, &me, &mg))
                exit(1);
            double floor_us = bytes / copy_gbps / 1e3;
            printf("%-10s %4d %10.1f %8.3f   (round %d)\n", "auto", pdl, mg * 1e3,
                   floor_us / (mg * 1e3), round + 1);
            jrow(o,
                 "\"op\": \"l8b_step_no_attention\", \"path\": \"auto\", \"pdl\": %d, "
                 "\"round\": %d, \"us_graph\": %.2f, \"us_eager\": %.2f, \"bytes\": %.0f, "
                 "\"frac_floor\": %.4f",
                 pdl, round + 1, mg * 1e3, me * 1e3, bytes, floor_us / (mg * 1e3));
            fflush(stdout);
        }

    sd_cuda_set_pdl(b->be, saved_pdl);
    b->be->ops->free(b->be, s.w);
    b->be->ops->free(b->be, f);
    b->be->ops->free(b->be, norm);
    b->be->ops->free(b->be, s.inv_freq);
    b->be->ops->free(b->be, s.pos);
}

static void gemv_lab(bench *b, out *o, int quick)
{
    /* onepass: the one-pass GEMV at every row count (SPECD_GEMV_FEW=0);
     * auto: the build's choice (the persistent few-row kernel at 2-4 rows) */
    static const char *paths[] = {"onepass", "auto", "fp8", "fp8n"};
    static const int ns[] = {1, 2, 3, 4, 8};
    struct { const char *name; int N, K; } sh[] = {
        {"llama8b qkv", 6144, 4096},       {"llama8b o", 4096, 4096},
        {"llama8b gate+up", 28672, 4096},  {"llama8b down", 4096, 14336},
        {"llama8b lm_head", 128256, 4096}, {"dsv2lite q+kv_a", 3648, 2048},
        {"dsv2lite o", 2048, 2048},        {"dsv2lite shared g+u", 5632, 2048},
        {"dsv2lite shared down", 2048, 2816}, {"dsv2lite lm_head", 102400, 2048},
    };
    printf("\n%-22s %-5s %6s %6s %3s %9s %9s %8s %6s %6s\n", "op", "path", "N", "K", "n",
           "us/graph", "us/eager", "GB/s", "/copy", "/read");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++)
            bench_mm(b, o, sh[i].name, sh[i].N, sh[i].K, 0, ns, quick ? 1 : 5, paths[p]);
    bench_step(b, o);
}


/* ---- the read lab (--read-lab) --------------------------------------------------
 *
 * How fast one DeepSeek-V2-Lite MoE layer's expert bytes can stream at batch
 * 1: 8 experts (6 routed, 2 always-on), each gate and up (1408 x 2048 bf16)
 * and down (2048 x 1408), 24 runs of 5.77 MB, 138 MB a layer; 26 layers,
 * each its own bytes, replayed from one graph (no launch gaps, no L2 reuse).
 * A plain grid-stride read of each layer's 138 MB, and warps that stream
 * 4096-byte rows of the 24 runs with U rows in flight (a load-use pipeline:
 * row i + U loads as row i is used, each row's 8 16-byte loads a lane
 * multiplied into an fp32 activation from L1, as the GEMV does), in one
 * launch a layer or two (gate/up's 16 runs, then down's 8), B blocks of 256
 * threads an SM. Against these: the fused moe_ffn op at n = 1, top-8. */
#define RL_RB 4096                /* bytes a row */
#define RL_SEG (1408ull * RL_RB)  /* one matrix */
#define RL_LAYERS 26

template <int U>
__global__ void __launch_bounds__(256) rl_rows_kernel(const char *base, int seg0, int nseg,
                                                      const float *x, unsigned *sink)
{
    const int lane = threadIdx.x % 32;
    const int G = gridDim.x * (blockDim.x / 32);
    const int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int per = (int)(RL_SEG / RL_RB), n = nseg * per;
    const char *b0 = base + (size_t)seg0 * RL_SEG;
    uint4 buf[U][8];
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int it = g + u * G;
#pragma unroll
        for (int c = 0; c < 8; c++)
            buf[u][c] = it < n ? sd__ld_stream(b0 + (size_t)it * RL_RB + c * 512 + lane * 16)
                               : make_uint4(0, 0, 0, 0);
    }
    for (int b = g; b < n; b += U * G) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int nx = b + (u + U) * G; /* the row that reloads this slot */
#pragma unroll
            for (int c = 0; c < 8; c++) {
                float lo, hi;
                const uint32_t w[4] = {buf[u][c].x, buf[u][c].y, buf[u][c].z, buf[u][c].w};
                const float4 *xp = (const float4 *)(x + c * 256 + lane * 8);
                const float4 xa = __ldg(xp), xb = __ldg(xp + 1);
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    sd__u2f(w[q], SD__BF16, lo, hi);
                    acc = fmaf(lo, xv[2 * q], fmaf(hi, xv[2 * q + 1], acc));
                }
                buf[u][c] = nx < n ? sd__ld_stream(b0 + (size_t)nx * RL_RB + c * 512 + lane * 16)
                                   : make_uint4(0, 0, 0, 0);
            }
        }
    }
    if (acc == 1234.5f)
        sink[0] = 1; /* keeps the loads */
}

typedef struct rl_ctx {
    const char *w;
    const float *x;
    unsigned *sink;
    int mode, U, B; /* mode 0: grid-stride read; 1: rows, one launch; 2: rows, two launches */
} rl_ctx;

template <int U> static void rl_launch(bench *b, const rl_ctx *r, const char *lw, int s0, int ns)
{
    rl_rows_kernel<U><<<b->c->sm_count * r->B, 256, 0, b->c->stream>>>(lw, s0, ns, r->x, r->sink);
}

static void rl_rows(bench *b, const rl_ctx *r, const char *lw, int s0, int ns)
{
    if (r->U == 1)
        rl_launch<1>(b, r, lw, s0, ns);
    else if (r->U == 2)
        rl_launch<2>(b, r, lw, s0, ns);
    else if (r->U == 3)
        rl_launch<3>(b, r, lw, s0, ns);
    else
        rl_launch<4>(b, r, lw, s0, ns);
}

static void rl_fn(bench *b, int rep)
{
    (void)rep;
    const rl_ctx *r = (const rl_ctx *)b->ctx;
    for (int l = 0; l < RL_LAYERS; l++) {
        const char *lw = r->w + (size_t)l * 24 * RL_SEG;
        if (r->mode == 0)
            read_kernel<<<b->c->sm_count * 8, 256, 0, b->c->stream>>>((const uint4 *)lw,
                                                                     24 * RL_SEG / 16, r->sink);
        else if (r->mode == 1)
            rl_rows(b, r, lw, 0, 24);
        else {
            rl_rows(b, r, lw, 0, 16);
            rl_rows(b, r, lw, 16, 8);
        }
    }
}

static void read_lab(bench *b, out *o)
{
    size_t bytes = (size_t)RL_LAYERS * 24 * RL_SEG;
    rl_ctx r;
    memset(&r, 0, sizeof r);
    r.w = (const char *)dev_alloc(b, bytes);
    dev_fill(b, (void *)r.w, bytes / 4, 0, 1.0f, 21);
    r.x = (const float *)dev_alloc(b, 2048 * 4);
    dev_fill(b, (void *)r.x, 2048, 0, 1.0f, 22);
    r.sink = (unsigned *)dev_alloc(b, 64);
    b->fn = rl_fn;
    b->ctx = &r;
    const double lb = 24.0 * (double)RL_SEG;
    printf("\nread lab: %d layers of 24 x %.2f MB (%.1f MB a layer)\n%-10s %2s %2s %10s %8s %6s %6s\n",
           RL_LAYERS, RL_SEG / 1e6, lb / 1e6, "mode", "U", "B", "us/layer", "GB/s", "/copy",
           "/read");
    static const char *names[] = {"read", "rows1", "rows2"};
    static const int Us[] = {1, 2, 3, 4}, Bs[] = {2, 3, 4, 8};
    for (int mode = 0; mode < 3; mode++)
        for (int ui = 0; ui < (mode ? 4 : 1); ui++)
            for (int bi = 0; bi < (mode ? 4 : 1); bi++) {
                r.mode = mode;
                r.U = Us[ui];
                r.B = Bs[bi];
                double me, mg;
                if (time_op(b, 1, &me, &mg))
                    exit(1);
                const double us = mg * 1e3 / RL_LAYERS, gbps = lb / (us * 1e-6) / 1e9;
                printf("%-10s %2d %2d %10.2f %8.0f %6.3f %6.3f\n", names[mode], mode ? r.U : 0,
                       mode ? r.B : 8, us, gbps, gbps / copy_gbps, gbps / read_gbps);
                jrow(o,
                     "\"op\": \"read_lab\", \"mode\": \"%s\", \"U\": %d, \"B\": %d, "
                     "\"us_layer\": %.3f, \"gbps\": %.1f, \"frac_copy\": %.4f, \"frac_read\": %.4f",
                     names[mode], mode ? r.U : 0, mode ? r.B : 8, us, gbps, gbps / copy_gbps,
                     gbps / read_gbps);
                fflush(stdout);
            }
    b->be->ops->free(b->be, (void *)r.w);
    b->be->ops->free(b->be, (void *)r.x);
    b->be->ops->free(b->be, r.sink);
    static const int n1[] = {1, 2};
    bench_moe(b, o, 2048, 1408, 64, 8, n1, 2, "fused");
}

/* A lab's bodies timed in turn (*v = 0 .. n - 1: the body b->fn runs),
 * each a graph of `layers` layers of `lb` bytes: a row printed and written
 * as op, body, us a layer, GB/s and the fractions of the ceilings. */
static void lab_bodies(bench *b, out *o, const char *op, const char *const *names, int n, int *v,
                       int layers, double lb)
{
    printf("%-6s %10s %8s %6s %6s\n", "body", "us/layer", "GB/s", "/copy", "/read");
    for (*v = 0; *v < n; (*v)++) {
        double me, mg;
        if (time_op(b, 1, &me, &mg))
            exit(1);
        const double us = mg * 1e3 / layers, gbps = lb / (us * 1e-6) / 1e9;
        printf("%-6s %10.2f %8.0f %6.3f %6.3f\n", names[*v], us, gbps, gbps / copy_gbps,
               gbps / read_gbps);
        jrow(o,
             "\"op\": \"%s\", \"body\": \"%s\", \"us_layer\": %.3f, \"gbps\": %.1f, "
             "\"frac_copy\": %.4f, \"frac_read\": %.4f",
             op, names[*v], us, gbps, gbps / copy_gbps, gbps / read_gbps);
        fflush(stdout);
    }
}

/* ---- the down lab (--down-lab) --------------------------------------------------
 *
 * What holds the fused MoE down kernel of V2-Lite's batch-1 step at ~3.1
 * TB/s (14.85 us a layer for 46 MB in the step's kernel trace) where a
 * plain read of the same bytes streams at ~4.1: the kernel's body at its
 * default shape (moe.cu shape 1: 4 rows of all 8 slots a block, a warp a
 * slot over the whole K = 1408, 2 chunks a load, 3 load rounds, 512 blocks
 * at 4 an SM: one wave), its parts taken away one at a time:
 *   dots   the body: sd__warp_dots1 with h from global memory (L2 / L1)
 *   ids    the same after the expert's id and weight pointer are read from
 *          global memory (the real kernel's two round trips before its
 *          first weight load)
 *   nox    no activation loads: the weights times a constant
 *   xor    no arithmetic: the loaded words xor-ed
 *   u1     the body with one chunk a load (6 load rounds)
 *   smem   the block's 8 h rows copied into shared memory first (plain
 *          loads, a barrier), the activations then from there
 *   read   a grid-stride read of the same bytes (8 blocks an SM)
 * 26 layers of 8 down matrices (2048 x 1408 bf16, 5.77 MB), each layer its
 * own bytes, replayed from one graph; one h (8 x 1408 floats) for all
 * (it is in L2 in the step too, written by the gate/up kernel). The
 * gate/up half's lab (below) runs after it in the same call. */
#define DL_D 2048
#define DL_I 1408
#define DL_SLOTS 8
#define DL_SEG ((size_t)DL_D * DL_I * 2)
#define DL_LAYERS 26

template <int V>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, 4)
    dl_kernel(float *out, const char *w, const float *h, const int *ids, const char *const *tab)
{
    __shared__ float part[DL_SLOTS * 4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d0 = blockIdx.x * 4;
    const char *wd = w + (size_t)warp * DL_SEG;
    if (V == 1)
        wd = tab[ids[warp]];
    const void *wrow[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        wrow[i] = wd + (size_t)(d0 + i) * DL_I * 2;
    if (V <= 1) {
        sd__warp_dots1<SD__BF16, 4, 2>(wrow, h + (size_t)warp * DL_I, DL_I, 0, 1, lane,
                                       part + warp * 4);
    } else if (V == 4) {
        sd__warp_dots1<SD__BF16, 4, 1>(wrow, h + (size_t)warp * DL_I, DL_I, 0, 1, lane,
                                       part + warp * 4);
    } else if (V == 5) {
        extern __shared__ float4 hsm[]; /* (DL_SLOTS, DL_I / 4) */
        for (int e = threadIdx.x; e < DL_SLOTS * DL_I / 4; e += blockDim.x)
            hsm[e] = __ldg((const float4 *)h + e);
        __syncthreads();
        constexpr int nch = (DL_I + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
        const float4 *hw = hsm + warp * (DL_I / 4);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = 0; c < nch; c += 2) {
            sd__w8raw<SD__BF16> raw[2][4];
            sd__warp_load<SD__BF16, 4, 2>(raw, wrow, DL_I, c, 1, lane);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int k = (c + u) * SD__GEMV_CHUNK + lane * 8;
                if (c + u >= nch || k >= DL_I)
                    continue;
                const float4 a = hw[k / 4], b2 = hw[k / 4 + 1];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float f[8];
                    sd__w8_float<SD__BF16>(raw[u][i], f);
                    acc[i] = sd__fma8(f, a, b2, acc[i]);
                }
            }
        }
        sd__xreduce<4>(acc, lane);
        if (lane % 8 == 0)
            part[warp * 4 + sd__xr_index<4>(lane)] = acc[0];
    } else {
        constexpr int nch = (DL_I + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t bits = 0;
        for (int c = 0; c < nch; c += 2) {
            sd__w8raw<SD__BF16> raw[2][4];
            sd__warp_load<SD__BF16, 4, 2>(raw, wrow, DL_I, c, 1, lane);
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (V == 2) {
                        float f[8];
                        sd__w8_float<SD__BF16>(raw[u][i], f);
                        const float4 a = make_float4(0.5f, 0.25f, 0.5f, 0.25f);
                        acc[i] = sd__fma8(f, a, a, acc[i]);
                    } else {
                        bits ^= raw[u][i].q[0].x ^ raw[u][i].q[0].y ^ raw[u][i].q[0].z ^
                                raw[u][i].q[0].w;
                    }
                }
        }
        if (V == 3)
            acc[0] = __uint_as_float(bits & 0x3f7fffffu);
        sd__xreduce<4>(acc, lane);
        if (lane % 8 == 0)
            part[warp * 4 + sd__xr_index<4>(lane)] = acc[0];
    }
    __syncthreads();
    if (threadIdx.x < 4) {
        float s = 0.f;
        for (int j = 0; j < DL_SLOTS; j++)
            s += part[j * 4 + threadIdx.x];
        out[d0 + threadIdx.x] = s;
    }
}

typedef struct dl_ctx {
    const char *w;
    const float *h;
    float *out;
    const int *ids;
    const char **tab; /* DL_LAYERS x DL_SLOTS pointers, device */
    unsigned *sink;
    int v;
} dl_ctx;

static void dl_fn(bench *b, int rep)
{
    (void)rep;
    const dl_ctx *r = (const dl_ctx *)b->ctx;
    for (int l = 0; l < DL_LAYERS; l++) {
        const char *lw = r->w + (size_t)l * DL_SLOTS * DL_SEG;
        const char *const *lt = r->tab + (size_t)l * DL_SLOTS;
        const dim3 g(DL_D / 4);
        cudaStream_t st = b->c->stream;
        if (r->v == 0)
            dl_kernel<0><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->out, lw, r->h, r->ids, lt);
        else if (r->v == 1)
            dl_kernel<1><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->out, lw, r->h, r->ids, lt);
        else if (r->v == 2)
            dl_kernel<2><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->out, lw, r->h, r->ids, lt);
        else if (r->v == 3)
            dl_kernel<3><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->out, lw, r->h, r->ids, lt);
        else if (r->v == 4)
            dl_kernel<4><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->out, lw, r->h, r->ids, lt);
        else if (r->v == 5)
            dl_kernel<5><<<g, SD__GEMV_WARPS * 32, DL_SLOTS * DL_I * 4, st>>>(r->out, lw, r->h,
                                                                             r->ids, lt);
        else
            read_kernel<<<b->c->sm_count * 8, 256, 0, st>>>((const uint4 *)lw,
                                                           DL_SLOTS * DL_SEG / 16, r->sink);
    }
}

static void down_lab(bench *b, out *o)
{
    const size_t bytes = (size_t)DL_LAYERS * DL_SLOTS * DL_SEG;
    dl_ctx r;
    memset(&r, 0, sizeof r);
    r.w = (const char *)dev_alloc(b, bytes);
    dev_fill(b, (void *)r.w, bytes / 2, 1, 0.05f, 31);
    r.h = (const float *)dev_alloc(b, DL_SLOTS * DL_I * 4);
    dev_fill(b, (void *)r.h, DL_SLOTS * DL_I, 0, 1.0f, 32);
    r.out = (float *)dev_alloc(b, DL_D * 4);
    r.sink = (unsigned *)dev_alloc(b, 64);
    int hid[DL_SLOTS];
    const char *htab[DL_LAYERS * DL_SLOTS];
    for (int j = 0; j < DL_SLOTS; j++)
        hid[j] = (j * 5 + 3) % DL_SLOTS; /* a permutation: ids -> slots' matrices */
    for (int l = 0; l < DL_LAYERS; l++)
        for (int j = 0; j < DL_SLOTS; j++)
            htab[l * DL_SLOTS + j] = r.w + ((size_t)l * DL_SLOTS + (size_t)j) * DL_SEG;
    r.ids = (const int *)dev_alloc(b, sizeof hid);
    r.tab = (const char **)dev_alloc(b, sizeof htab);
    /* on the backend's stream, after the zeroing its alloc queued there
     * (a cudaMemcpy on the legacy stream raced it: the table read as NULL) */
    if (b->be->ops->upload(b->be, (void *)r.ids, hid, sizeof hid) ||
        b->be->ops->upload(b->be, (void *)r.tab, htab, sizeof htab) || b->be->ops->sync(b->be)) {
        fprintf(stderr, "down lab: upload failed\n");
        exit(1);
    }
    b->fn = dl_fn;
    b->ctx = &r;
    const double lb = (double)DL_SLOTS * (double)DL_SEG;
    printf("\ndown lab: %d layers of %d x %.2f MB (%.1f MB a layer)\n", DL_LAYERS, DL_SLOTS,
           DL_SEG / 1e6, lb / 1e6);
    /* smem: 4 blocks of 45 KB an SM, as much of L1 as shared memory */
    CHECK(cudaFuncSetAttribute(dl_kernel<5>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               (int)cudaSharedmemCarveoutMaxShared));
    static const char *names[] = {"dots", "ids", "nox", "xor", "u1", "smem", "read"};
    lab_bodies(b, o, "down_lab", names, 7, &r.v, DL_LAYERS, lb);
    b->be->ops->free(b->be, (void *)r.w);
    b->be->ops->free(b->be, (void *)r.h);
    b->be->ops->free(b->be, r.out);
    b->be->ops->free(b->be, r.sink);
    b->be->ops->free(b->be, (void *)r.ids);
    b->be->ops->free(b->be, (void *)r.tab);
}

/* The gate/up half of the same layer (the routed experts' kernel at its
 * default shape: a block a (slot, 4-column tile), 8 warps each one
 * 256-element chunk of the 2048-wide rows of 4 gate and 4 up rows, loaded
 * once; 6 slots x 352 tiles = 2112 blocks, slots fastest), bodies:
 *   gu     the body: sd__warp_dots1 with x from global memory, SiLU(g) u
 *   gu-nox no activation loads: the weights times a constant
 *   gu-4b  the body at 4 blocks an SM (64 registers) instead of 3
 *   gu-rd  a grid-stride read of the same bytes */
#define GL_SLOTS 6
#define GL_D 2048
#define GL_SEG ((size_t)DL_I * GL_D * 2) /* one gate or up matrix */

template <int V, int MINB>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, MINB)
    gl_kernel(float *hout, const char *w, const float *x)
{
    __shared__ float part[SD__GEMV_WARPS * 8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slot = blockIdx.x, j0 = blockIdx.y * 4;
    const char *wg = w + (size_t)(2 * slot) * GL_SEG, *wu = wg + GL_SEG;
    const void *wrow[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        wrow[i] = (i < 4 ? wg : wu) + (size_t)(j0 + i % 4) * GL_D * 2;
    if (V == 0) {
        sd__warp_dots1<SD__BF16, 8, 1>(wrow, x, GL_D, warp, SD__GEMV_WARPS, lane, part + warp * 8);
    } else {
        sd__w8raw<SD__BF16> raw[1][8];
        sd__warp_load<SD__BF16, 8, 1>(raw, wrow, GL_D, warp, SD__GEMV_WARPS, lane);
        float acc[8];
        const float4 a = make_float4(0.5f, 0.25f, 0.5f, 0.25f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float f[8];
            sd__w8_float<SD__BF16>(raw[0][i], f);
            acc[i] = sd__fma8(f, a, a, 0.0f);
        }
        sd__xreduce<8>(acc, lane);
        if (lane % 4 == 0)
            part[warp * 8 + sd__xr_index<8>(lane)] = acc[0];
    }
    __syncthreads();
    if (threadIdx.x < 4) {
        float g = 0.f, u = 0.f;
        for (int k = 0; k < SD__GEMV_WARPS; k++) {
            g += part[k * 8 + threadIdx.x];
            u += part[k * 8 + 4 + threadIdx.x];
        }
        hout[(size_t)slot * DL_I + j0 + threadIdx.x] = g / (1.0f + expf(-g)) * u;
    }
}

typedef struct gl_ctx {
    const char *w;
    const float *x;
    float *h;
    unsigned *sink;
    int v;
} gl_ctx;

static void gl_fn(bench *b, int rep)
{
    (void)rep;
    const gl_ctx *r = (const gl_ctx *)b->ctx;
    const dim3 g(GL_SLOTS, DL_I / 4);
    cudaStream_t st = b->c->stream;
    for (int l = 0; l < DL_LAYERS; l++) {
        const char *lw = r->w + (size_t)l * 2 * GL_SLOTS * GL_SEG;
        if (r->v == 0)
            gl_kernel<0, 2><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->h, lw, r->x);
        else if (r->v == 1)
            gl_kernel<1, 2><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->h, lw, r->x);
        else if (r->v == 2)
            gl_kernel<0, 4><<<g, SD__GEMV_WARPS * 32, 0, st>>>(r->h, lw, r->x);
        else
            read_kernel<<<b->c->sm_count * 8, 256, 0, st>>>((const uint4 *)lw,
                                                           2 * GL_SLOTS * GL_SEG / 16, r->sink);
    }
}

static void gateup_lab(bench *b, out *o)
{
    const size_t bytes = (size_t)DL_LAYERS * 2 * GL_SLOTS * GL_SEG;
    gl_ctx r;
    memset(&r, 0, sizeof r);
    r.w = (const char *)dev_alloc(b, bytes);
    dev_fill(b, (void *)r.w, bytes / 2, 1, 0.05f, 41);
    r.x = (const float *)dev_alloc(b, GL_D * 4);
    dev_fill(b, (void *)r.x, GL_D, 0, 1.0f, 42);
    r.h = (float *)dev_alloc(b, GL_SLOTS * DL_I * 4);
    r.sink = (unsigned *)dev_alloc(b, 64);
    b->fn = gl_fn;
    b->ctx = &r;
    const double lb = 2.0 * GL_SLOTS * (double)GL_SEG;
    printf("\ngate/up lab: %d layers of %d x 2 x %.2f MB (%.1f MB a layer)\n", DL_LAYERS,
           GL_SLOTS, GL_SEG / 1e6, lb / 1e6);
    static const char *names[] = {"gu", "gu-nox", "gu-4b", "gu-rd"};
    lab_bodies(b, o, "gateup_lab", names, 4, &r.v, DL_LAYERS, lb);
    b->be->ops->free(b->be, (void *)r.w);
    b->be->ops->free(b->be, (void *)r.x);
    b->be->ops->free(b->be, r.h);
    b->be->ops->free(b->be, r.sink);
}

/* ---- the chain lab (--chain-lab) -------------------------------------------------
 *
 * Whether a persistent kernel could run a batch-1 step's chain of dependent
 * stages faster than one kernel a stage under programmatic launch (the
 * backend's way). A DeepSeek-V2-Lite-shaped layer as 11 stages: GEMVs of
 * rows of 2048 bf16 (the query/latent projection 3648 rows, the value
 * absorb 512, the output projection 2048, the router 64, the experts'
 * gate/up 22528 and down 11264: 164 MB a layer) and latency stages (one
 * block loads the 2048 floats the stage before wrote, reduces them and
 * writes 2048: the latent prep, the attention, its merge, two norms), each
 * reading what the one before wrote. 26 layers, each its own weights, from
 * one graph.
 *   kernels:    a kernel a stage, launched as the backend launches (PDL:
 *               a GEMV's blocks load their first weights before the wait,
 *               8 rows a block, a 256-element chunk a warp, as gemv_kernel's
 *               wide shape);
 *   persistent: one kernel, every block resident (what the SMs hold), the
 *               stages separated by grid barriers (a counter a stage in
 *               global memory); a block issues its first weight loads of a stage
 *               before it waits for the stage before, so blocks with no
 *               work in a latency stage stream the next GEMV's weights
 *               while it runs;
 *   flags:      the persistent kernel with a word a block (the stages it is
 *               done with) instead of a counter a stage: a stage waits only
 *               for the blocks that wrote what it reads (78.5 us a layer
 *               against PDL's 53.2 on the H200: slower than the grid
 *               barrier; bench/results/chain-lab-cac288e.json);
 *   read:       the same bytes as one grid-stride read a layer (the floor).
 * The kernels also with their latency stages left out, as a wait and a
 * store, and as a wait alone (what a stage costs, and what of it is the
 * kernel boundary), and with the GEMVs loading no weights before the wait
 * ("no prefetch": whether early weight loads slow the latency stages'
 * round trips they overlap: 50.0 against 53.2 us a layer in the lab, but
 * the backend's GEMVs with their loads after the wait ran 2.6% slower,
 * bench/results/NOTES.md, session 19). Each with and without the experts'
 * two stages (the attention half alone: 25.7 MB a layer). Values are not
 * checked: a timing lab. */
#define CL_K 2048
#define CL_LAYERS 26
#define CL_STAGES 11
/* a layer's bytes without the experts' two stages */
#define CL_ATTN_BYTES ((size_t)(3648 + 512 + 2048 + 64) * CL_K * 2)
#define CL_BAR_WORDS 1024 /* the persistent kernels' counters (a stage) or flags (a block) */
#define CL_ROWS {3648, 0, 0, 0, 512, 2048, 0, 64, 22528, 11264, 0}
static const int cl_rows[CL_STAGES] = CL_ROWS;
__constant__ int cl_rows_d[CL_STAGES] = CL_ROWS;

typedef struct cl_ctx {
    const char *w;   /* weights: CL_LAYERS x the stages' rows x 4096 bytes */
    float *buf;      /* two activation buffers of 32768 floats */
    unsigned *bar;   /* the persistent kernel's barrier counters, one a stage */
    unsigned *sink;
    int mode, moe, grid;
    int lat; /* kernels: the latency stages as 0 written, 1 left out, 2 a wait and a store,
              * 3 a wait alone; 4 written, and the GEMVs load no weights before the wait */
    size_t layer_bytes;
} cl_ctx;

/* 8 rows (VR) x one 256-element chunk a warp: a lane's 8 16-byte loads */
__device__ __forceinline__ void cl_load(uint4 (&w)[8], const char *wb, int rows, int g, int warp,
                                        int lane)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = g * 8 + i;
        w[i] = r < rows ? sd__ld_stream(wb + (size_t)r * (CL_K * 2) + warp * 512 + lane * 16)
                        : make_uint4(0, 0, 0, 0);
    }
}

/* the dots of a row group from loaded weights and x (2048 floats, read
 * through L2: another block of the same kernel may have written it) */
__device__ __forceinline__ void cl_dots(const uint4 (&w)[8], const float *x, float *y, int rows,
                                        int g, int warp, int lane, float *part)
{
    const float4 *xp = (const float4 *)(x + warp * 256 + lane * 8);
    const float4 xa = __ldcg(xp), xb = __ldcg(xp + 1);
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float f[8];
        sd__w8_float<SD__BF16>(*(const sd__w8raw<SD__BF16> *)&w[i], f);
        acc[i] = sd__fma8(f, xa, xb, 0.0f);
    }
    sd__xreduce<8>(acc, lane);
    if (lane % 4 == 0)
        part[warp * 8 + sd__xr_index<8>(lane)] = acc[0];
    __syncthreads();
    if (threadIdx.x < 8 && g * 8 + (int)threadIdx.x < rows) {
        float s = 0.0f;
        for (int q = 0; q < 8; q++)
            s += part[q * 8 + threadIdx.x];
        y[g * 8 + threadIdx.x] = s;
    }
    __syncthreads();
}

/* a latency stage: 2048 floats in, their sum of squares, 2048 out */
__device__ __forceinline__ void cl_latency(const float *x, float *y, float *red)
{
    float v[8], ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = __ldcg(x + threadIdx.x + e * 256);
        ss += v[e] * v[e];
    }
    for (int st = 16; st > 0; st >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, st);
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int q = 0; q < 8; q++)
        t += red[q];
    const float r = rsqrtf(t / CL_K + 1e-6f);
#pragma unroll
    for (int e = 0; e < 8; e++)
        y[threadIdx.x + e * 256] = v[e] * r;
    __syncthreads();
}

template <bool PRE>
__global__ void __launch_bounds__(256, 3) cl_gemv_kernel(const char *wb, int rows, const float *x,
                                                         float *y)
{
    __shared__ float part[64];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint4 w[8];
    if (PRE)
        cl_load(w, wb, rows, blockIdx.x, warp, lane);
    SD_PDL_ENTER();
    if (!PRE)
        cl_load(w, wb, rows, blockIdx.x, warp, lane);
    cl_dots(w, x, y, rows, blockIdx.x, warp, lane, part);
}

__global__ void __launch_bounds__(256) cl_latency_kernel(const float *x, float *y, int lat)
{
    __shared__ float red[8];
    SD_PDL_ENTER();
    if (lat == 0)
        cl_latency(x, y, red);
    else if (lat == 2)
        y[threadIdx.x] = 1.0f;
}

/* every block: arrive (its writes first), then wait for all */
__device__ __forceinline__ void cl_arrive(unsigned *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
    }
}

__device__ __forceinline__ void cl_wait(const unsigned *bar, unsigned target)
{
    if (threadIdx.x == 0) {
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

/* FLAGS: block b's progress in bar[b] (the stages it is done with, a
 * store, no atomics); a stage waits only for the blocks that wrote what it
 * reads: a latency stage's block for all of the GEMV before (each thread
 * polls a few blocks' words), a GEMV's blocks for block 0 after a latency
 * stage */
__device__ __forceinline__ void cl_done(unsigned *bar, unsigned v)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        *(volatile unsigned *)(bar + blockIdx.x) = v;
    }
}

__device__ __forceinline__ void cl_wait_blocks(const unsigned *bar, int nb, unsigned target)
{
    for (;;) {
        int ok = 1;
        for (int i = threadIdx.x; i < nb; i += blockDim.x) {
            unsigned v;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar + i) : "memory");
            ok &= v >= target;
        }
        if (__syncthreads_and(ok))
            return;
    }
}

template <bool FLAGS>
__global__ void __launch_bounds__(256, 2) cl_persistent_kernel(const char *w, size_t layer_bytes,
                                                               float *buf, unsigned *bar, int moe)
{
    __shared__ float part[64];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, G = gridDim.x;
    int idx = 0, cur = 0; /* bar[idx]: blocks done with stage idx (blocks with nothing to do
                           * arrive at once, so each stage has its own counter) */
    int prev_rows = 0;    /* FLAGS: the stage before was a GEMV (all blocks wrote) or not */
    auto wait_prev = [&]() {
        if (!idx)
            return;
        if (!FLAGS)
            cl_wait(bar + idx - 1, (unsigned)G);
        else if (prev_rows)
            cl_wait_blocks(bar, G, (unsigned)idx);
        else
            cl_wait(bar, (unsigned)idx); /* block 0's word */
    };
    for (int l = 0; l < CL_LAYERS; l++) {
        const char *wb = w + (size_t)l * layer_bytes;
        for (int s = 0; s < CL_STAGES; s++) {
            const int rows = cl_rows_d[s];
            if (!moe && (s == 8 || s == 9)) {
                wb += (size_t)rows * (CL_K * 2);
                continue;
            }
            const float *x = buf + cur * 32768;
            float *y = buf + (1 - cur) * 32768;
            if (rows) {
                const int ng = (rows + 7) / 8;
                uint4 wr[8];
                int g = blockIdx.x;
                if (g < ng)
                    cl_load(wr, wb, rows, g, warp, lane); /* before the wait */
                wait_prev();
                for (; g < ng; g += G) {
                    uint4 nx[8];
                    if (g + G < ng)
                        cl_load(nx, wb, rows, g + G, warp, lane);
                    cl_dots(wr, x, y, rows, g, warp, lane, part);
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        wr[i] = nx[i];
                }
            } else if (blockIdx.x == 0) {
                wait_prev();
                cl_latency(x, y, part);
            }
            if (FLAGS)
                cl_done(bar, (unsigned)idx + 1);
            else
                cl_arrive(bar + idx);
            prev_rows = rows;
            idx++;
            cur = 1 - cur;
            wb += (size_t)rows * (CL_K * 2);
        }
    }
}

static void cl_fn(bench *b, int rep)
{
    (void)rep;
    const cl_ctx *r = (const cl_ctx *)b->ctx;
    sd__cuda *c = b->c;
    if (r->mode == 2) {
        for (int l = 0; l < CL_LAYERS; l++) {
            size_t n = r->moe ? r->layer_bytes : CL_ATTN_BYTES;
            read_kernel<<<c->sm_count * 8, 256, 0, c->stream>>>(
                (const uint4 *)(r->w + (size_t)l * r->layer_bytes), n / 16, r->sink);
        }
        return;
    }
    if (r->mode == 1 || r->mode == 3) {
        CHECK(cudaMemsetAsync(r->bar, 0, CL_BAR_WORDS * sizeof(unsigned), c->stream));
        if (r->mode == 1)
            cl_persistent_kernel<false><<<r->grid, 256, 0, c->stream>>>(r->w, r->layer_bytes,
                                                                        r->buf, r->bar, r->moe);
        else
            cl_persistent_kernel<true><<<r->grid, 256, 0, c->stream>>>(r->w, r->layer_bytes,
                                                                       r->buf, r->bar, r->moe);
        return;
    }
    int cur = 0;
    for (int l = 0; l < CL_LAYERS; l++) {
        const char *wb = r->w + (size_t)l * r->layer_bytes;
        for (int s = 0; s < CL_STAGES; s++) {
            const int rows = cl_rows[s];
            if (!r->moe && (s == 8 || s == 9)) {
                wb += (size_t)rows * (CL_K * 2);
                continue;
            }
            const float *x = r->buf + cur * 32768;
            float *y = r->buf + (1 - cur) * 32768;
            if (rows && r->lat == 4)
                sd__launch(c, cl_gemv_kernel<false>, (rows + 7) / 8, 256, 0, wb, rows, x, y);
            else if (rows)
                sd__launch(c, cl_gemv_kernel<true>, (rows + 7) / 8, 256, 0, wb, rows, x, y);
            else if (r->lat != 1)
                sd__launch(c, cl_latency_kernel, 1, 256, 0, x, y, r->lat);
            cur = 1 - cur;
            wb += (size_t)rows * (CL_K * 2);
        }
    }
}

static void chain_lab(bench *b, out *o)
{
    cl_ctx r;
    memset(&r, 0, sizeof r);
    size_t rows = 0;
    for (int s = 0; s < CL_STAGES; s++)
        rows += (size_t)cl_rows[s];
    r.layer_bytes = rows * CL_K * 2;
    r.w = (const char *)dev_alloc(b, r.layer_bytes * CL_LAYERS);
    dev_fill(b, (void *)r.w, r.layer_bytes * CL_LAYERS / 4, 0, 1.0f, 31);
    r.buf = (float *)dev_alloc(b, 2 * 32768 * sizeof(float));
    dev_fill(b, r.buf, 2 * 32768, 0, 1.0f, 32);
    r.bar = (unsigned *)dev_alloc(b, CL_BAR_WORDS * sizeof(unsigned));
    r.sink = (unsigned *)dev_alloc(b, 64);
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, cl_persistent_kernel<true>, 256,
                                                        0));
    r.grid = b->c->sm_count * per_sm;
    if (r.grid > CL_BAR_WORDS) {
        fprintf(stderr, "chain lab: a grid of %d blocks, flags for %d\n", r.grid, CL_BAR_WORDS);
        exit(1);
    }
    b->fn = cl_fn;
    b->ctx = &r;
    static const char *names[] = {"kernels", "persistent", "read", "flags"};
    static const char *lats[] = {"written", "left out", "wait+store", "wait", "no prefetch"};
    printf("\nchain lab: %d layers of %d stages, %.1f MB a layer (%.1f without the experts); "
           "persistent grid %d (%d an SM)\n%-11s %-9s %-10s %10s %8s\n",
           CL_LAYERS, CL_STAGES, r.layer_bytes / 1e6, (double)CL_ATTN_BYTES / 1e6,
           r.grid, per_sm, "mode", "experts", "latency", "us/layer", "GB/s");
    for (int moe = 1; moe >= 0; moe--)
        for (int mode = 0; mode < 4; mode++)
            for (int lat = 0; lat < (mode == 0 ? 5 : 1); lat++) {
                r.mode = mode;
                r.moe = moe;
                r.lat = lat;
                double me, mg;
                if (time_op(b, 1, &me, &mg))
                    exit(1);
                const double lb = moe ? (double)r.layer_bytes : (double)CL_ATTN_BYTES;
                const double us = mg * 1e3 / CL_LAYERS, gbps = lb / (us * 1e-6) / 1e9;
                const char *ln = mode == 2 ? "-" : lats[lat];
                printf("%-11s %-9s %-10s %10.2f %8.0f\n", names[mode], moe ? "yes" : "no", ln, us,
                       gbps);
                jrow(o,
                     "\"op\": \"chain_lab\", \"mode\": \"%s\", \"experts\": %d, "
                     "\"latency_stages\": \"%s\", \"us_layer\": %.3f, \"gbps\": %.1f, "
                     "\"persistent_grid\": %d",
                     names[mode], moe, ln, us, gbps, r.grid);
                fflush(stdout);
            }
    b->be->ops->free(b->be, (void *)r.w);
    b->be->ops->free(b->be, r.buf);
    b->be->ops->free(b->be, r.bar);
    b->be->ops->free(b->be, r.sink);
}

/* ---- the boundary lab (--boundary-lab) ------------------------------------------
 *
 * What the stream holds between two decode steps costs, at batch 1: a
 * "step" is a graph of BL_KERNELS one-block kernels under programmatic
 * launch (a chain of latency stages: the first reads the step's inputs,
 * the last writes its token), replayed back to back as the engine's launch
 * ahead queues them, with between two graphs:
 *   graph:      nothing;
 *   +down:      the token's download (4 bytes to page-locked memory) and an
 *               event (the engine's queue_tokens_down);
 *   +inputs:    that, the step's packed inputs up (64 bytes) and the token
 *               copied into them on the device (launch_ahead's upload and copy);
 *   +table:     that and the block-table row up (upload2d): the boundary
 *               the engine has at every queued-ahead step;
 *   one kernel: the download, then one kernel that reads the inputs and
 *               the table row from mapped page-locked memory and the token
 *               from the device (the three copies as one launch);
 *   event:      the event alone (no download);
 *   kernel down: a kernel writes the token into mapped page-locked memory
 *               (no copy engine), then the event;
 *   kernel both: one kernel does that and the next step's inputs (as
 *               "one kernel"), then the event;
 *   down pdl:   "kernel down" launched as the backend launches (programmatic);
 *   in graph:   the step's graph starts with the inputs kernel and its
 *               last kernel writes the token into mapped memory too: only
 *               the event between two graphs.
 * The us a step over the graph alone is what the boundary adds. */
#define BL_KERNELS 64
#define BL_STEPS 200

__global__ void bl_first_kernel(const int *meta, float *x)
{
    SD_PDL_ENTER();
    if (threadIdx.x == 0)
        x[0] = (float)meta[0];
}

/* the step's token (and into mapped host memory: hout, NULL none) */
__global__ void bl_last_kernel(const float *x, int *tok, int *hout)
{
    SD_PDL_ENTER();
    if (threadIdx.x == 0) {
        tok[0] = (int)x[0] & 1023;
        if (hout)
            hout[0] = tok[0];
    }
}

/* the inputs (16 words) and the table row (16) from mapped host memory
 * (hmeta NULL: none), the token from the device; hout: the token into
 * mapped host memory (NULL: none) */
__global__ void bl_inputs_kernel(int *meta, int *table, const int *hmeta, const int *htable,
                                 const int *tok, int *hout)
{
    SD_PDL_ENTER();
    const int i = threadIdx.x;
    if (hout && i == 0)
        hout[0] = tok[0];
    if (!hmeta)
        return;
    if (i < 16)
        meta[i] = i == 0 ? tok[0] : hmeta[i];
    else if (i < 32)
        table[i - 16] = htable[i - 16];
}

static void boundary_lab(bench *b, out *o)
{
    sd__cuda *c = b->c;
    cudaStream_t st = c->stream;
    int *meta = (int *)dev_alloc(b, 64 * sizeof(int)), *table = meta + 16, *tok = meta + 32;
    float *buf = (float *)dev_alloc(b, 2 * 32768 * sizeof(float));
    dev_fill(b, buf, 2 * 32768, 0, 1.0f, 41);
    int *h = NULL, *hd = NULL;
    CHECK(cudaHostAlloc((void **)&h, 256 * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&hd, h, 0));
    memset(h, 0, 256 * sizeof(int));
    CHECK(cudaMemsetAsync(meta, 0, 64 * sizeof(int), st));
    /* the step's graph; ge[1]: with its inputs kernel first and the token
     * written to mapped memory by its last kernel */
    cudaGraph_t g[2];
    cudaGraphExec_t ge[2];
    for (int v = 0; v < 2; v++) {
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        if (v)
            sd__launch(c, bl_inputs_kernel, 1, 32, 0, meta, table, (const int *)(hd + 128),
                       (const int *)(hd + 64), (const int *)tok, (int *)NULL);
        sd__launch(c, bl_first_kernel, 1, 256, 0, (const int *)meta, buf);
        for (int k = 0; k < BL_KERNELS; k++)
            sd__launch(c, cl_latency_kernel, 1, 256, 0, (const float *)(buf + (k & 1) * 32768),
                       buf + (1 - (k & 1)) * 32768, 0);
        sd__launch(c, bl_last_kernel, 1, 256, 0, (const float *)buf, tok, v ? hd : (int *)NULL);
        CHECK(cudaStreamEndCapture(st, &g[v]));
        CHECK(cudaGraphInstantiate(&ge[v], g[v], 0));
    }
    cudaEvent_t mark;
    CHECK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
    static const char *names[] = {"graph",       "+down",       "+inputs", "+table", "one kernel",
                                  "event",       "kernel down", "kernel both", "in graph", "down pdl"};
    const int n_modes = (int)(sizeof names / sizeof names[0]);
    double base = 0;
    printf("\nboundary lab: a step of %d one-block kernels, %d steps back to back\n%-11s %10s "
           "%10s\n",
           BL_KERNELS + 2, BL_STEPS, "between", "us/step", "added");
    for (int mode = 0; mode < n_modes; mode++) {
        float t[7];
        for (int rep = 0; rep < 7; rep++) {
            CHECK(cudaStreamSynchronize(st));
            CHECK(cudaEventRecord(b->e0, st));
            for (int s = 0; s < BL_STEPS; s++) {
                if (mode >= 2 && mode <= 3) {
                    if (mode == 3)
                        CHECK(cudaMemcpy2DAsync(table, 64, h + 64, 64, 64, 1,
                                                cudaMemcpyHostToDevice, st));
                    CHECK(cudaMemcpyAsync(meta, h + 128, 64, cudaMemcpyHostToDevice, st));
                    CHECK(cudaMemcpyAsync(meta, tok, 4, cudaMemcpyDeviceToDevice, st));
                } else if (mode == 4) {
                    bl_inputs_kernel<<<1, 32, 0, st>>>(meta, table, hd + 128, hd + 64, tok, NULL);
                } else if (mode == 7) {
                    bl_inputs_kernel<<<1, 32, 0, st>>>(meta, table, hd + 128, hd + 64, tok, hd);
                }
                CHECK(cudaGraphLaunch(ge[mode == 8], st));
                if (mode == 9)
                    sd__launch(c, bl_inputs_kernel, 1, 32, 0, meta, table, (const int *)NULL,
                               (const int *)NULL, (const int *)tok, hd);
                if (mode >= 1 && mode <= 4)
                    CHECK(cudaMemcpyAsync(h, tok, 4, cudaMemcpyDeviceToHost, st));
                if (mode == 6)
                    bl_inputs_kernel<<<1, 32, 0, st>>>(meta, table, NULL, NULL, tok, hd);
                if (mode >= 1)
                    CHECK(cudaEventRecord(mark, st));
            }
            CHECK(cudaEventRecord(b->e1, st));
            CHECK(cudaEventSynchronize(b->e1));
            CHECK(cudaEventElapsedTime(&t[rep], b->e0, b->e1));
        }
        qsort(t, 7, sizeof t[0], cmp_float);
        const double us = t[3] * 1e3 / BL_STEPS;
        if (mode == 0)
            base = us;
        printf("%-11s %10.2f %10.2f\n", names[mode], us, us - base);
        jrow(o, "\"op\": \"boundary_lab\", \"between\": \"%s\", \"kernels\": %d, \"us_step\": %.3f, "
                "\"added_us\": %.3f",
             names[mode], BL_KERNELS + 2, us, us - base);
        fflush(stdout);
    }
    /* the copies' size: a step's table (32 rows) and inputs (640 bytes) up
     * and its token copied in, by the backend's copies kernel (stage) or by
     * the copy engine (upload2d, upload, copy); the token down by a kernel
     * and the event after the graph, as the engine has them (backend.cu's
     * SD__COPIES_MAX is where the kernel stops being the faster) */
    const size_t sweep[] = {1024, 4096, 8192, 16384, 32768, 65536};
    char *hs = (char *)b->be->ops->host_alloc(b->be, 65536 + 1024);
    char *ds = (char *)dev_alloc(b, 65536 + 1024 + 64);
    if (!hs) {
        fprintf(stderr, "boundary lab: no page-locked memory for the sweep\n");
        exit(1);
    }
    memset(hs, 1, 65536 + 1024);
    printf("\nboundary lab, the copies by size (table of 32 rows + 640 B inputs + the token)\n"
           "%-10s %12s %12s %8s\n",
           "table", "kernel us", "engine us", "ratio");
    for (size_t z = 0; z < sizeof sweep / sizeof sweep[0]; z++) {
        const size_t tb = sweep[z], w = tb / 32;
        double us2[2];
        for (int how = 0; how < 2; how++) {
            float t[7];
            for (int rep = 0; rep < 7; rep++) {
                CHECK(cudaStreamSynchronize(st));
                CHECK(cudaEventRecord(b->e0, st));
                for (int s2 = 0; s2 < BL_STEPS; s2++) {
                    if (how == 0) {
                        sd__stage_set ss;
                        memset(&ss, 0, sizeof ss);
                        ss.part[0] = (sd_copy){ds, hs, w, 32, w, w};
                        ss.part[1] = (sd_copy){ds + 65536, hs + 65536, 640, 1, 640, 640};
                        ss.part[2] = (sd_copy){ds + 65536, tok, 4, 1, 4, 4};
                        ss.n = 3;
                        if (sd__cuda_stage(c, &ss))
                            exit(1);
                    } else {
                        CHECK(cudaMemcpy2DAsync(ds, w, hs, w, w, 32, cudaMemcpyHostToDevice, st));
                        CHECK(cudaMemcpyAsync(ds + 65536, hs + 65536, 640,
                                              cudaMemcpyHostToDevice, st));
                        CHECK(cudaMemcpyAsync(ds + 65536, tok, 4, cudaMemcpyDeviceToDevice, st));
                    }
                    CHECK(cudaGraphLaunch(ge[0], st));
                    sd__stage_set sd;
                    memset(&sd, 0, sizeof sd);
                    sd.part[0] = (sd_copy){hd, tok, 4, 1, 4, 4};
                    sd.n = 1;
                    sd.sys = 1;
                    if (sd__cuda_stage(c, &sd))
                        exit(1);
                    CHECK(cudaEventRecord(mark, st));
                }
                CHECK(cudaEventRecord(b->e1, st));
                CHECK(cudaEventSynchronize(b->e1));
                CHECK(cudaEventElapsedTime(&t[rep], b->e0, b->e1));
            }
            qsort(t, 7, sizeof t[0], cmp_float);
            us2[how] = t[3] * 1e3 / BL_STEPS - base;
        }
        printf("%7zu B %12.2f %12.2f %8.2f\n", tb, us2[0], us2[1], us2[0] / us2[1]);
        jrow(o, "\"op\": \"boundary_lab_copies\", \"table_bytes\": %zu, \"kernel_added_us\": %.3f, "
                "\"copy_engine_added_us\": %.3f",
             tb, us2[0], us2[1]);
        fflush(stdout);
    }
    b->be->ops->host_free(b->be, hs);
    b->be->ops->free(b->be, ds);
    CHECK(cudaEventDestroy(mark));
    for (int v = 0; v < 2; v++) {
        CHECK(cudaGraphExecDestroy(ge[v]));
        CHECK(cudaGraphDestroy(g[v]));
    }
    CHECK(cudaFreeHost(h));
    b->be->ops->free(b->be, meta);
    b->be->ops->free(b->be, buf);
}

/* ---- ceilings ------------------------------------------------------------------- */

static void ceilings(bench *b)
{
    size_t bytes = 2ull << 30;
    void *a = dev_alloc(b, bytes), *d = dev_alloc(b, bytes);
    unsigned *sink = (unsigned *)dev_alloc(b, 64);
    dev_fill(b, a, bytes / 4, 0, 1.0f, 1);
    float t[9];
    for (int l = 0; l < 9; l++) {
        CHECK(cudaEventRecord(b->e0, b->c->stream));
        CHECK(cudaMemcpyAsync(d, a, bytes, cudaMemcpyDeviceToDevice, b->c->stream));
        CHECK(cudaEventRecord(b->e1, b->c->stream));
        CHECK(cudaEventSynchronize(b->e1));
        CHECK(cudaEventElapsedTime(&t[l], b->e0, b->e1));
    }
    qsort(t, 9, sizeof t[0], cmp_float);
    copy_gbps = 2.0 * (double)bytes / (t[4] * 1e-3) / 1e9; /* read + written */
    int grid = b->c->sm_count * 8;
    for (int l = 0; l < 9; l++) {
        CHECK(cudaEventRecord(b->e0, b->c->stream));
        read_kernel<<<grid, 256, 0, b->c->stream>>>((const uint4 *)a, bytes / 16, sink);
        CHECK(cudaEventRecord(b->e1, b->c->stream));
        CHECK(cudaEventSynchronize(b->e1));
        CHECK(cudaEventElapsedTime(&t[l], b->e0, b->e1));
    }
    qsort(t, 9, sizeof t[0], cmp_float);
    read_gbps = (double)bytes / (t[4] * 1e-3) / 1e9;
    b->be->ops->free(b->be, a);
    b->be->ops->free(b->be, d);
    b->be->ops->free(b->be, sink);
}

int main(int argc, char **argv)
{
    const char *path = "bench/results/kernels-decode.json", *commit = "unknown";
    int quick = 0, moe_prefill = 0, mla_only = 0, lab = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--moe-prefill"))
            moe_prefill = 1;
        else if (!strcmp(argv[i], "--mla"))
            mla_only = 1;
        else if (!strcmp(argv[i], "--gemv-lab"))
            lab = 1;
        else if (!strcmp(argv[i], "--read-lab"))
            lab = 2;
        else if (!strcmp(argv[i], "--chain-lab"))
            lab = 3;
        else if (!strcmp(argv[i], "--boundary-lab"))
            lab = 4;
        else if (!strcmp(argv[i], "--down-lab"))
            lab = 5;
        else {
            fprintf(stderr, "usage: specd-bench-kernels [--out FILE] [--commit C] [--quick] "
                            "[--moe-prefill] [--mla] [--gemv-lab] [--read-lab] [--chain-lab] "
                            "[--boundary-lab] [--down-lab]\n");
            return 2;
        }
    }
    bench b;
    memset(&b, 0, sizeof b);
    sd_err err;
    memset(&err, 0, sizeof err);
    if (sd_cuda_device_count() <= 0 || sd_cuda_backend_create(&b.be, 0, &err)) {
        fprintf(stderr, "no CUDA backend: %s\n", err.msg);
        return 1;
    }
    b.c = sd__cuda_of(b.be);
    CHECK(cudaEventCreate(&b.e0));
    CHECK(cudaEventCreate(&b.e1));
    char dev[256];
    sd_cuda_device_name(0, dev, sizeof dev);
    ceilings(&b);
    printf("device: %s\ncopy %.0f GB/s (read + write), streaming read %.0f GB/s\n", dev, copy_gbps,
           read_gbps);
    out o = {fopen(path, "w"), 1};
    if (!o.json) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    fprintf(o.json, "{\n  \"benchmark\": \"kernels-decode\",\n  \"commit\": \"%s\",\n", commit);
    fprintf(o.json, "  \"device\": \"%s\",\n  \"command\": \"", dev);
    for (int i = 0; i < argc; i++)
        fprintf(o.json, "%s%s", i ? " " : "", argv[i]);
    fprintf(o.json, "\",\n  \"copy_gbps\": %.1f,\n  \"read_gbps\": %.1f,\n  \"rows\": [", copy_gbps,
            read_gbps);
    if (mla_only || lab) {
        if (lab == 5) {
            down_lab(&b, &o);
            gateup_lab(&b, &o);
        }
        else if (lab == 4)
            boundary_lab(&b, &o);
        else if (lab == 3)
            chain_lab(&b, &o);
        else if (lab == 2)
            read_lab(&b, &o);
        else if (lab)
            gemv_lab(&b, &o, quick);
        else
            bench_mla_all(&b, &o, quick);
        fprintf(o.json, "\n  ]\n}\n");
        fclose(o.json);
        printf("\nwrote %s\n", path);
        sd_cuda_backend_destroy(b.be);
        return 0;
    }
    printf("\n%-22s %-5s %6s %6s %3s %9s %9s %8s %6s %6s\n", "op", "path", "N", "K", "n",
           "us/graph", "us/eager", "GB/s", "/copy", "/read");

    /* Llama-3-8B (bf16): q/o, k/v, gate+up fused, down, lm_head */
    static const int n_dec[] = {1, 2, 4, 8}, n_one[] = {1};
    static const int n_lt[] = {8, 12, 16, 24, 32, 48, 64};
    struct { const char *name; int N, K; } l8[] = {
        {"llama8b q/o", 4096, 4096},   {"llama8b k/v", 1024, 4096},
        {"llama8b gate+up", 28672, 4096}, {"llama8b down", 4096, 14336},
        {"llama8b lm_head", 128256, 4096},
    };
    for (size_t i = 0; i < sizeof l8 / sizeof l8[0] && !moe_prefill; i++)
        bench_mm(&b, &o, l8[i].name, l8[i].N, l8[i].K, 0, n_dec, quick ? 1 : 4, "auto");
    /* DeepSeek-V2-Lite dense parts (bf16): q, kv_a, o, shared experts, lm_head */
    struct { const char *name; int N, K; } ds[] = {
        {"dsv2lite q", 3072, 2048},         {"dsv2lite kv_a", 576, 2048},
        {"dsv2lite o", 2048, 2048},         {"dsv2lite shared g+u", 5632, 2048},
        {"dsv2lite shared down", 2048, 2816}, {"dsv2lite lm_head", 102400, 2048},
    };
    for (size_t i = 0; i < sizeof ds / sizeof ds[0] && !moe_prefill; i++)
        bench_mm(&b, &o, ds[i].name, ds[i].N, ds[i].K, 0, n_one, 1, "auto");
    /* MLA absorbed per-head products (16 heads) */
    if (!moe_prefill) {
        bench_mm(&b, &o, "dsv2lite q_nope->lat", 512, 128, 16, n_dec, quick ? 1 : 4, "auto");
        bench_mm(&b, &o, "dsv2lite lat->v", 128, 512, 16, n_dec, quick ? 1 : 4, "auto");
    }
    if (!quick && !moe_prefill) {
        /* GEMV against cuBLASLt (bf16 hi + lo) above 8 rows: the crossover */
        int big[][2] = {{4096, 4096}, {28672, 4096}, {4096, 14336}};
        for (int i = 0; i < 3; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "xover %dx%d", big[i][0], big[i][1]);
            bench_mm(&b, &o, nm, big[i][0], big[i][1], 0, n_lt, 7, "gemv");
            bench_mm(&b, &o, nm, big[i][0], big[i][1], 0, n_lt, 7, "lt");
            bench_mm(&b, &o, nm, big[i][0], big[i][1], 0, n_lt, 7, "auto");
        }
        /* cuBLASLt at prefill sizes (timed algorithm trial vs the heuristic's first) */
        static const int n_pf[] = {64, 512};
        bench_mm(&b, &o, "prefill 4096x4096", 4096, 4096, 0, n_pf, 2, "auto");
        bench_mm(&b, &o, "prefill 28672x4096", 28672, 4096, 0, n_pf, 2, "auto");
    }
    /* DeepSeek-V2-Lite routed experts: 64 x (1408 x 2048), top-6 */
    static const int n_moe[] = {1, 2, 4, 8, 16, 32};
    int nm = quick ? 2 : 6;
    printf("\n%-22s %-6s %-32s %9s %9s %8s %6s %6s\n", "op", "path", "shape", "us/graph", "us/eager",
           "GB/s", "/copy", "/read");
    if (!moe_prefill) {
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_moe, nm, "auto");
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_moe, nm, "fused");
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_moe, nm, "sorted");
    }
    if (!quick || moe_prefill) {
        /* prefill: the grouped GEMV against the tensor-core grouped GEMMs;
         * DeepSeek-V2-Lite's experts, then 256 experts at top-8 (V3's
         * routing, V2-Lite's expert size) */
        static const int n_pf_moe[] = {256, 512, 1024, 2048, 4096};
        /* where the fused decode path and the tensor cores cross: batch-32
         * decode (192 pairs) to verify steps of batch 16-32 */
        static const int n_mid_moe[] = {16, 32, 48, 64, 96};
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_mid_moe, 5, "fused");
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_mid_moe, 5, "tc");
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_pf_moe, 5, "sorted");
        bench_moe(&b, &o, 2048, 1408, 64, 6, n_pf_moe, 5, "tc");
        bench_moe(&b, &o, 2048, 1408, 256, 8, n_pf_moe, 5, "sorted");
        bench_moe(&b, &o, 2048, 1408, 256, 8, n_pf_moe, 5, "tc");
    }
    if (moe_prefill)
        goto done; /* nothing else was asked for */
    bench_mla_all(&b, &o, quick);
done:
    fprintf(o.json, "\n  ]\n}\n");
    fclose(o.json);
    printf("\nwrote %s\n", path);
    sd_cuda_backend_destroy(b.be);
    return 0;
}

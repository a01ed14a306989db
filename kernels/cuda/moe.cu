/* CUDA: DeepSeek-V3 MoE routing and the routed experts
 * (kernels/cpu/moe.c is the reference; the shared expert is the model's
 * dense FFN, plain matmuls).
 *
 * Routing runs on the device, one warp per token: scores in parallel, then
 * the group-limited top-k with the correction bias in one lane, in the CPU's
 * order, so ties break the same way (lowest expert index).
 *
 * The expert FFN never leaves the device either. Few (token, slot) pairs
 * (decode, verification: up to SD_CUDA_MOE_FUSED_MAX_PAIRS) take the fused
 * path below, two launches and no sort. Otherwise the (token, slot) rows are
 * sorted by expert (counts, offsets, positions: one block), then a grouped
 * GEMV over (expert, output-column tile) blocks reads each expert's weights
 * once per 8 rows routed to it and skips experts with none; gate/up and SiLU
 * are fused, down follows, and a combine sums each token's top-k rows with
 * their weights in slot order. The expert weight pointers travel as a kernel
 * parameter (up to 1024 experts: 16 KiB, within the 32 KiB parameter limit
 * of CUDA 12.1+), so nothing is uploaded or allocated per call. */
#include <math.h>
#include <string.h>

#include "kernels/cuda/gemv.cuh"

#define MOE_MAX_EXPERTS 1024
#define MOE_WARPS 8

/* ---- routing ----------------------------------------------------------- */

__global__ void moe_route_kernel(int32_t *ids, float *wts, const float *logits, const float *bias,
                                 sd_moe_route r)
{
    extern __shared__ float rs[];
    const int E = r.n_experts, K = r.top_k, t = blockIdx.x, lane = threadIdx.x;
    float *scores = rs, *choice = rs + E, *gscore = choice + E;
    unsigned char *taken = (unsigned char *)(gscore + E), *gsel = taken + E;
    const float *lg = logits + (size_t)t * (size_t)E;
    if (r.sigmoid) {
        for (int e = lane; e < E; e += 32)
            scores[e] = 1.0f / (1.0f + expf(-lg[e]));
    } else {
        float m = -INFINITY;
        for (int e = lane; e < E; e += 32)
            m = fmaxf(m, lg[e]);
        m = sd__warp_max(m);
        for (int e = lane; e < E; e += 32)
            scores[e] = expf(lg[e] - m);
        __syncwarp();
        if (lane == 0) {
            float s = 0; /* in expert order, as the CPU sums */
            for (int e = 0; e < E; e++)
                s += scores[e];
            gscore[0] = s;
        }
        __syncwarp();
        float s = gscore[0];
        for (int e = lane; e < E; e += 32)
            scores[e] /= s;
    }
    for (int e = lane; e < E; e += 32) {
        choice[e] = scores[e] + (bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncwarp();
    if (lane != 0)
        return;
    int G = r.n_group > 1 ? r.n_group : 1;
    if (G > 1 && r.topk_group < G) {
        int per = E / G;
        for (int g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                float v = choice[e];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            gscore[g] = per >= 2 ? b1 + b2 : b1;
            gsel[g] = 0;
        }
        for (int k = 0; k < r.topk_group; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!gsel[g] && (best < 0 || gscore[g] > gscore[best]))
                    best = g;
            gsel[best] = 1;
        }
        for (int e = 0; e < E; e++)
            if (!gsel[e / per])
                choice[e] = 0.0f; /* DeepSeek-V3 masks with 0, not -inf */
    }
    int32_t *io = ids + (size_t)t * (size_t)K;
    float *wo = wts + (size_t)t * (size_t)K;
    float sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best]))
                best = e;
        taken[best] = 1;
        io[k] = best;
        wo[k] = scores[best];
        sum += scores[best];
    }
    for (int k = 0; k < K; k++) {
        float w = wo[k];
        if (r.norm_topk_prob)
            w /= (sum + 1e-20f);
        wo[k] = w * r.routed_scaling_factor;
    }
}

void sd__cuda_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                        const float *bias, int n, const sd_moe_route *r)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    int E = r->n_experts, G = r->n_group > 1 ? r->n_group : 1;
    if (E <= 0 || E > MOE_MAX_EXPERTS || r->top_k <= 0 || r->top_k > E ||
        (G > 1 && (E % G || r->topk_group <= 0 || r->topk_group > G))) {
        SD_BADARG(c, "moe_route: %d experts, top-%d, %d groups (top-%d)", E, r->top_k,
                  r->n_group, r->topk_group);
        return;
    }
    size_t sm = (size_t)E * 3 * sizeof(float) + (size_t)E * 2;
    moe_route_kernel<<<n, 32, sm, c->stream>>>(ids, wts, logits, bias, *r);
    SD_LAUNCHED(c, "moe_route_kernel");
}

/* ---- experts ----------------------------------------------------------- */

template <int MAXE> struct moe_tabs {
    const void *a[MAXE]; /* gate (or down) of each expert */
    const void *b[MAXE]; /* up */
};

/* off (E+1): first sorted position of each expert; sorted (m): row r = t*k + j
 * of each position; inv (m): position of each row, -1 for an id outside the
 * bank [first, first + E) (expert parallel: another rank's expert). */
__global__ void __launch_bounds__(1024)
moe_sort_kernel(int *off_g, int *sorted, int *inv, const int32_t *ids, int m, int E, int first)
{
    extern __shared__ int si[];
    int *cnt = si, *off = si + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < m; r += blockDim.x) {
        int e = ids[r] - first;
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        off[0] = 0;
        for (int e = 0; e < E; e++)
            off[e + 1] = off[e] + cnt[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        off_g[e] = off[e];
        if (e < E)
            cnt[e] = 0;
    }
    __syncthreads();
    /* order inside an expert's segment varies run to run; every row is
     * computed alone and combined by slot, so results do not */
    for (int r = threadIdx.x; r < m; r += blockDim.x) {
        int e = ids[r] - first;
        if (e >= 0 && e < E) {
            int p = off[e] + atomicAdd(&cnt[e], 1);
            sorted[p] = r;
            inv[r] = p;
        } else {
            inv[r] = -1;
        }
    }
}

/* h(p, I) = silu(x_row(p) @ gate_e^T) * (x_row(p) @ up_e^T) for the rows p of
 * expert e = blockIdx.y; a warp per output column. */
template <int DT, bool VEC, int MAXE>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_gate_up_kernel(float *h, const float *x, const int *off, const int *sorted, int top_k, int D,
                   int I, const __grid_constant__ moe_tabs<MAXE> tab)
{
    int e = blockIdx.y, beg = off[e], end = off[e + 1];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int j = blockIdx.x * MOE_WARPS + warp;
    if (beg >= end || j >= I)
        return;
    const void *wg = tab.a[e], *wu = tab.b[e];
    size_t wr = (size_t)j * (size_t)D;
    for (int p0 = beg; p0 < end; p0 += 8) {
        int nr = end - p0 < 8 ? end - p0 : 8;
        const float *xr[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            xr[r] = x + (size_t)(sorted[p0 + (r < nr ? r : 0)] / top_k) * (size_t)D;
        float ag[8] = {0, 0, 0, 0, 0, 0, 0, 0}, au[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        sd__dot_rows<DT, VEC>(wg, wr, D, xr, nr, lane, ag);
        sd__dot_rows<DT, VEC>(wu, wr, D, xr, nr, lane, au);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r < nr) {
                float g = sd__warp_sum(ag[r]), u = sd__warp_sum(au[r]);
                if (lane == r)
                    h[(size_t)(p0 + r) * (size_t)I + j] = g / (1.0f + expf(-g)) * u;
            }
        }
    }
}

/* y(p, D) = h(p) @ down_e^T */
template <int DT, bool VEC, int MAXE>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_down_kernel(float *y, const float *h, const int *off, int D, int I,
                const __grid_constant__ moe_tabs<MAXE> tab)
{
    int e = blockIdx.y, beg = off[e], end = off[e + 1];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int j = blockIdx.x * MOE_WARPS + warp;
    if (beg >= end || j >= D)
        return;
    const void *wd = tab.a[e];
    size_t wr = (size_t)j * (size_t)I;
    for (int p0 = beg; p0 < end; p0 += 8) {
        int nr = end - p0 < 8 ? end - p0 : 8;
        const float *xr[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            xr[r] = h + (size_t)(p0 + (r < nr ? r : 0)) * (size_t)I;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        sd__dot_rows<DT, VEC>(wd, wr, I, xr, nr, lane, acc);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r < nr) {
                float s = sd__warp_sum(acc[r]);
                if (lane == r)
                    y[(size_t)(p0 + r) * (size_t)D + j] = s;
            }
        }
    }
}

/* out(t) = sum_j wts[t, j] * y(inv[t, j]) */
__global__ void moe_combine_kernel(float *out, const float *y, const int *inv, const float *wts,
                                   int top_k, int D)
{
    int t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float s = 0;
        for (int j = 0; j < top_k; j++) {
            int p = inv[(size_t)t * top_k + j];
            if (p >= 0)
                s += wts[(size_t)t * top_k + j] * y[(size_t)p * (size_t)D + d];
        }
        out[(size_t)t * (size_t)D + d] = s;
    }
}

template <int DT, bool VEC, int MAXE>
static void launch_experts(sd__cuda *c, const sd_experts *ex, float *h, float *y, const float *x,
                           const int *off, const int *sorted, int top_k, int D, int I)
{
    moe_tabs<MAXE> tab;
    memset(&tab, 0, sizeof tab);
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->gate[e].data;
        tab.b[e] = ex->up[e].data;
    }
    dim3 g1((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)ex->n);
    moe_gate_up_kernel<DT, VEC, MAXE><<<g1, MOE_WARPS * 32, 0, c->stream>>>(h, x, off, sorted, top_k,
                                                                            D, I, tab);
    if (SD_LAUNCHED(c, "moe_gate_up_kernel"))
        return;
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->down[e].data;
        tab.b[e] = NULL;
    }
    dim3 g2((unsigned)((D + MOE_WARPS - 1) / MOE_WARPS), (unsigned)ex->n);
    moe_down_kernel<DT, VEC, MAXE><<<g2, MOE_WARPS * 32, 0, c->stream>>>(y, h, off, D, I, tab);
    SD_LAUNCHED(c, "moe_down_kernel");
}

template <int DT, bool VEC>
static void launch_experts_e(sd__cuda *c, const sd_experts *ex, float *h, float *y, const float *x,
                             const int *off, const int *sorted, int top_k, int D, int I)
{
    if (ex->n <= 256)
        launch_experts<DT, VEC, 256>(c, ex, h, y, x, off, sorted, top_k, D, I);
    else
        launch_experts<DT, VEC, MOE_MAX_EXPERTS>(c, ex, h, y, x, off, sorted, top_k, D, I);
}

template <int DT>
static void launch_experts_v(sd__cuda *c, int vec, const sd_experts *ex, float *h, float *y,
                             const float *x, const int *off, const int *sorted, int top_k, int D,
                             int I)
{
    if (vec)
        launch_experts_e<DT, true>(c, ex, h, y, x, off, sorted, top_k, D, I);
    else
        launch_experts_e<DT, false>(c, ex, h, y, x, off, sorted, top_k, D, I);
}

/* ---- fused small-batch experts ------------------------------------------
 *
 * For few (token, slot) pairs (decode, verification) sorting costs more than
 * it saves: two launches, no sort. Gate/up + SiLU runs per pair (the expert
 * id read from ids on the device), then down + the weighted combine per
 * token, each output element summing its slots in slot order in one thread,
 * so results are bit-identical from run to run and in graph replay. The dot
 * products are the GEMV's (kernels/cuda/gemv.cuh). An expert used by several
 * pairs is read once per pair (mostly from L2: all pairs of one row tile run
 * side by side). */

#define MOE_FUSED_U 2 /* chunks per warp loaded before use (3 measured slower) */

/* h(p, I) = silu(x_t @ gate_e^T) * (x_t @ up_e^T) for pair p = blockIdx.x
 * (t = p / top_k, e = ids[p] - first; pairs of other banks are skipped).
 * Block: WK K-slices x RG row groups; a row group computes output columns
 * j, j + 1 from 4 weight rows (gate j, j + 1, up j, j + 1) sharing x_t. */
template <int DT, int MAXE>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32)
moe_gate_up_fused_kernel(float *h, const float *x, const int32_t *ids, int top_k, int D, int I,
                         int first, int E, int WK, const __grid_constant__ moe_tabs<MAXE> tab)
{
    __shared__ float part[SD__GEMV_WARPS * 4];
    const int p = blockIdx.x, e = ids[p] - first;
    if (e < 0 || e >= E)
        return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int RG = SD__GEMV_WARPS / WK, kw = warp % WK, rg = warp / WK;
    const int cols0 = blockIdx.y * RG * 2, j0 = cols0 + rg * 2;
    const size_t esz = DT == SD__F32 ? 4 : 2, rb = (size_t)D * esz;
    const char *wg = (const char *)tab.a[e], *wu = (const char *)tab.b[e];
    const void *wrow[4] = {j0 < I ? wg + (size_t)j0 * rb : NULL,
                           j0 + 1 < I ? wg + (size_t)(j0 + 1) * rb : NULL,
                           j0 < I ? wu + (size_t)j0 * rb : NULL,
                           j0 + 1 < I ? wu + (size_t)(j0 + 1) * rb : NULL};
    const float *xr[1] = {x + (size_t)(p / top_k) * (size_t)D};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    sd__warp_dots<DT, 4, 1, MOE_FUSED_U>(wrow, xr, 1, D, kw, WK, lane, acc);
    sd__xreduce<4>(acc, lane);
    if (lane % 8 == 0)
        part[warp * 4 + sd__xr_index<4>(lane)] = acc[0];
    __syncthreads();
    if ((int)threadIdx.x < RG * 2) {
        const int g = threadIdx.x / 2, q = threadIdx.x % 2, j = cols0 + g * 2 + q;
        if (j < I) {
            float gs = part[(g * WK) * 4 + q], us = part[(g * WK) * 4 + 2 + q];
            for (int k = 1; k < WK; k++) {
                gs += part[(g * WK + k) * 4 + q];
                us += part[(g * WK + k) * 4 + 2 + q];
            }
            h[(size_t)p * (size_t)I + (size_t)j] = gs / (1.0f + expf(-gs)) * us;
        }
    }
}

/* out(t, d) = sum_j wts[t, j] * (h(t * top_k + j) @ down_e^T)[d], slots j in
 * order, for token t = blockIdx.x and rows d of tile blockIdx.y (4 rows).
 * Warps: SW slot lanes x WK K-slices; slot lane s takes slots s, s + SW, ...
 * part: (top_k, WK, 4) floats of dynamic shared memory. */
template <int DT, int MAXE>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32)
moe_down_fused_kernel(float *out, const float *h, const int32_t *ids, const float *wts, int top_k,
                      int D, int I, int first, int E, int WK,
                      const __grid_constant__ moe_tabs<MAXE> tab)
{
    extern __shared__ float part[];
    const int t = blockIdx.x, d0 = blockIdx.y * 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int SW = SD__GEMV_WARPS / WK, kw = warp % WK, sl = warp / WK;
    const size_t esz = DT == SD__F32 ? 4 : 2, rb = (size_t)I * esz;
    for (int j = sl; j < top_k; j += SW) {
        const size_t p = (size_t)t * (size_t)top_k + (size_t)j;
        const int e = ids[p] - first;
        if (e < 0 || e >= E)
            continue; /* the same for the whole warp */
        const char *wd = (const char *)tab.a[e];
        const void *wrow[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            wrow[i] = d0 + i < D ? (const void *)(wd + (size_t)(d0 + i) * rb) : NULL;
        const float *xr[1] = {h + p * (size_t)I};
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        sd__warp_dots<DT, 4, 1, MOE_FUSED_U>(wrow, xr, 1, I, kw, WK, lane, acc);
        sd__xreduce<4>(acc, lane);
        if (lane % 8 == 0)
            part[(j * WK + kw) * 4 + sd__xr_index<4>(lane)] = acc[0];
    }
    __syncthreads();
    if (threadIdx.x < 4 && d0 + (int)threadIdx.x < D) {
        const int i = threadIdx.x;
        float s = 0.0f;
        for (int j = 0; j < top_k; j++) {
            const size_t p = (size_t)t * (size_t)top_k + (size_t)j;
            const int e = ids[p] - first;
            if (e < 0 || e >= E)
                continue;
            float y = part[(j * WK) * 4 + i];
            for (int k = 1; k < WK; k++)
                y += part[(j * WK + k) * 4 + i];
            s += wts[p] * y;
        }
        out[(size_t)t * (size_t)D + (size_t)(d0 + i)] = s;
    }
}

/* Warps splitting I in the down kernel: as many as the slots leave free
 * (8 / the slot count rounded up to a power of two), at most what I's
 * chunks give. */
static int down_wk(int top_k, int I)
{
    int sw = 1;
    while (sw < top_k && sw < SD__GEMV_WARPS)
        sw *= 2;
    int wk = SD__GEMV_WARPS / sw, kmax = sd__gemv_wk(I);
    return wk < kmax ? wk : kmax;
}

template <int DT, int MAXE>
static void launch_fused(sd__cuda *c, const sd_experts *ex, float *out, float *h, const float *x,
                         const int32_t *ids, const float *wts, int n, int top_k, int D, int I)
{
    moe_tabs<MAXE> tab;
    memset(&tab, 0, sizeof tab);
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->gate[e].data;
        tab.b[e] = ex->up[e].data;
    }
    const unsigned th = SD__GEMV_WARPS * 32;
    int wk = sd__gemv_wk(D), cols = SD__GEMV_WARPS / wk * 2;
    dim3 g1((unsigned)(n * top_k), (unsigned)((I + cols - 1) / cols));
    moe_gate_up_fused_kernel<DT, MAXE><<<g1, th, 0, c->stream>>>(h, x, ids, top_k, D, I, ex->first,
                                                                  ex->n, wk, tab);
    if (SD_LAUNCHED(c, "moe_gate_up_fused_kernel"))
        return;
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->down[e].data;
        tab.b[e] = NULL;
    }
    wk = down_wk(top_k, I);
    dim3 g2((unsigned)n, (unsigned)((D + 3) / 4));
    size_t sm = (size_t)top_k * (size_t)wk * 4 * sizeof(float);
    moe_down_fused_kernel<DT, MAXE><<<g2, th, sm, c->stream>>>(out, h, ids, wts, top_k, D, I,
                                                               ex->first, ex->n, wk, tab);
    SD_LAUNCHED(c, "moe_down_fused_kernel");
}

template <int DT>
static void launch_fused_e(sd__cuda *c, const sd_experts *ex, float *out, float *h, const float *x,
                           const int32_t *ids, const float *wts, int n, int top_k, int D, int I)
{
    if (ex->n <= 256)
        launch_fused<DT, 256>(c, ex, out, h, x, ids, wts, n, top_k, D, I);
    else
        launch_fused<DT, MOE_MAX_EXPERTS>(c, ex, out, h, x, ids, wts, n, top_k, D, I);
}

void sd__cuda_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                      const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    int E = ex->n;
    if (E <= 0 || E > MOE_MAX_EXPERTS || top_k <= 0) {
        SD_BADARG(c, "moe_ffn: %d experts, top-%d", E, top_k);
        return;
    }
    int I = (int)ex->gate[0].rows;
    sd_dtype dt = ex->gate[0].dtype;
    /* a weight row is 16-byte aligned when its length is a multiple of 8 */
    int vec = D % 8 == 0 && I % 8 == 0 && sd__aligned16(x) && sd__aligned16(tmp);
    for (int e = 0; e < E; e++) {
        const sd_weight *g = &ex->gate[e], *u = &ex->up[e], *d = &ex->down[e];
        if (g->dtype != dt || u->dtype != dt || d->dtype != dt || g->rows != I || u->rows != I ||
            g->cols != D || u->cols != D || d->rows != D || d->cols != I) {
            SD_BADARG(c, "moe_ffn: expert %d: weights differ from expert 0 in dtype or shape", e);
            return;
        }
        vec = vec && sd__aligned16(g->data) && sd__aligned16(u->data) && sd__aligned16(d->data);
    }
    size_t m = (size_t)n * (size_t)top_k;
    if ((size_t)E + 1 + 2 * m > m * ((size_t)D + (size_t)I + 1)) {
        SD_BADARG(c, "moe_ffn: scratch of %zu floats cannot hold %d expert offsets",
                  SD_MOE_TMP_FLOATS(n, top_k, D, I), E);
        return;
    }
    float *h = (float *)tmp;                 /* (m, I) */
    int max_pairs = c->moe_fused_max_pairs > 0 ? c->moe_fused_max_pairs : SD_CUDA_MOE_FUSED_MAX_PAIRS;
    if (vec && m <= (size_t)max_pairs) {
        switch (dt) {
        case SD_DT_F32: launch_fused_e<SD__F32>(c, ex, out, h, x, ids, wts, n, top_k, D, I); break;
        case SD_DT_BF16: launch_fused_e<SD__BF16>(c, ex, out, h, x, ids, wts, n, top_k, D, I); break;
        case SD_DT_F16: launch_fused_e<SD__F16>(c, ex, out, h, x, ids, wts, n, top_k, D, I); break;
        default: SD_BADARG(c, "moe_ffn: weight dtype %s", sd_dtype_name(dt)); break;
        }
        return;
    }
    float *y = h + m * (size_t)I;            /* (m, D) */
    int *off = (int *)(y + m * (size_t)D);   /* (E + 1) */
    int *sorted = off + E + 1, *inv = sorted + m; /* (m), (m) */
    moe_sort_kernel<<<1, 1024, (2 * (size_t)E + 1) * sizeof(int), c->stream>>>(off, sorted, inv, ids,
                                                                               (int)m, E, ex->first);
    if (SD_LAUNCHED(c, "moe_sort_kernel"))
        return;
    switch (dt) {
    case SD_DT_F32: launch_experts_v<SD__F32>(c, vec, ex, h, y, x, off, sorted, top_k, D, I); break;
    case SD_DT_BF16: launch_experts_v<SD__BF16>(c, vec, ex, h, y, x, off, sorted, top_k, D, I); break;
    case SD_DT_F16: launch_experts_v<SD__F16>(c, vec, ex, h, y, x, off, sorted, top_k, D, I); break;
    default: SD_BADARG(c, "moe_ffn: weight dtype %s", sd_dtype_name(dt)); return;
    }
    if (c->err)
        return;
    moe_combine_kernel<<<n, 256, 0, c->stream>>>(out, y, inv, wts, top_k, D);
    SD_LAUNCHED(c, "moe_combine_kernel");
}

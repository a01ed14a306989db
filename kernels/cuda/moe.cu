/* CUDA: DeepSeek-V3 MoE routing and the routed experts
 * (kernels/cpu/moe.c is the reference; the shared expert is the model's
 * dense FFN, plain matmuls).
 *
 * Routing runs on the device, one warp per token: scores in parallel, then
 * the group-limited top-k with the correction bias, picked in the CPU's
 * order, so ties break the same way (lowest expert index), and summed in
 * the CPU's order.
 *
 * The expert FFN never leaves the device either. Few (token, slot) pairs
 * (decode, verification: up to SD_CUDA_MOE_FUSED_MAX_PAIRS) take the fused
 * path below, two launches and no sort. Otherwise the (token, slot) rows are
 * sorted by expert (counts, offsets, positions: one block), then a grouped
 * GEMV over (expert, output-column tile) blocks reads each expert's weights
 * once per 8 rows routed to it and skips experts with none; gate/up and SiLU
 * are fused, down follows, and a combine sums each token's top-k rows with
 * their weights in slot order. For real-size experts (the default; the
 * switch is SPECD_MOE_TC or sd_cuda_set_moe_tc) grouped GEMMs on tensor
 * cores (bf16 activations; section below) replace the grouped GEMV. The expert weight pointers
 * travel as a kernel parameter (up to 1024 experts: 16 KiB, within the
 * 32 KiB parameter limit of CUDA 12.1+), so nothing is uploaded or
 * allocated per call. */
#include <math.h>
#include <string.h>

#include "kernels/cuda/gemv_block.cuh"

#define MOE_MAX_EXPERTS 1024
#define MOE_WARPS 8

/* ---- routing ----------------------------------------------------------- */

/* The warp's index of the largest of v[0..n) not yet taken, lowest index on
 * ties (the CPU's argmax_free; every lane gets it). A lane scans its
 * stride-32 share in ascending order, then the warp keeps the larger value
 * or, equal, the lower index. NaN scores rank below every number (the CPU
 * keeps a NaN only when it comes first: routing logits are never NaN in a
 * working model). */
__device__ __forceinline__ int route_argmax(const float *v, const unsigned char *taken, int n,
                                            int lane)
{
    float bv = -INFINITY;
    int bi = n;
    for (int i = lane; i < n; i += 32) {
        float x = v[i] != v[i] ? -INFINITY : v[i];
        if (!taken[i] && (bi == n || x > bv))
            bv = x, bi = i;
    }
    for (int o = 16; o > 0; o /= 2) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi < n && (bi == n || ov > bv || (ov == bv && oi < bi)))
            bv = ov, bi = oi;
    }
    return bi;
}

/* The top K of choice[0..E) (E <= 64: a lane's two entries e = lane,
 * lane + 32) by rank: an entry's slot is the count of entries before it in
 * the order of route_argmax's rounds (larger value first, the lower index
 * on ties, NaN as -inf), so slot k holds round k's pick. One pass over the
 * shared scores a lane instead of K rounds of a 10-shuffle reduction. */
__device__ __forceinline__ void route_rank_topk(const float *choice, const float *scores, int E,
                                                int K, int lane, int *sel, float *selw)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int e = lane + 32 * h;
        if (e >= E)
            continue;
        const float x = choice[e] != choice[e] ? -INFINITY : choice[e];
        int rank = 0;
        for (int j = 0; j < E; j++) {
            const float y = choice[j] != choice[j] ? -INFINITY : choice[j];
            rank += y > x || (y == x && j < e);
        }
        if (rank < K) {
            sel[rank] = e;
            selw[rank] = scores[e];
        }
    }
}

/* Token t's row of ids and weights from its K picks (sel, selw: expert and
 * score by slot, in shared memory): the routed slots' scores summed in slot
 * order, as the CPU sums (every lane alike), normalized and scaled, then
 * the always-on slots (ids E.., weight 1); the lanes write the row at once. */
__device__ __forceinline__ void route_write_row(int32_t *ids, float *wts, const int *sel,
                                                const float *selw, const sd_moe_route &r, int t,
                                                int lane)
{
    const int E = r.n_experts, K = r.top_k;
    float sum = 0;
    for (int k = 0; k < K; k++)
        sum += selw[k];
    const int W = K + (r.n_always > 0 ? r.n_always : 0); /* a token's row: routed, always-on */
    int32_t *io = ids + (size_t)t * (size_t)W;
    float *wo = wts + (size_t)t * (size_t)W;
    for (int k = lane; k < W; k += 32) {
        if (k < K) {
            float w = selw[k];
            if (r.norm_topk_prob)
                w /= (sum + 1e-20f);
            io[k] = sel[k];
            wo[k] = w * r.routed_scaling_factor;
        } else {
            io[k] = E + (k - K);
            wo[k] = 1.0f;
        }
    }
}

/* One warp a token. Shared memory (the launcher's size): scores, choice,
 * group scores (E floats each), the K picks and their scores, the taken
 * and group flags (E bytes each). The picks stay in shared memory until
 * the lanes write a token's row at once (writing them to ids / wts one
 * round at a time and reading them back for the sum cost L2 round trips). */
__global__ void moe_route_kernel(int32_t *ids, float *wts, const float *logits, const float *bias,
                                 const __grid_constant__ sd_moe_route r)
{
    SD_PDL_ENTER(ids, wts, logits, bias, r);
    extern __shared__ float rs[];
    const int E = r.n_experts, K = r.top_k, t = blockIdx.x, lane = threadIdx.x;
    float *scores = rs, *choice = rs + E, *gscore = choice + E, *selw = gscore + E;
    int *sel = (int *)(selw + K);
    unsigned char *taken = (unsigned char *)(sel + K), *gsel = taken + E;
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
        float s = 0; /* in expert order, as the CPU sums: every lane alike */
        for (int e = 0; e < E; e++)
            s += scores[e];
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            scores[e] /= s;
    }
    for (int e = lane; e < E; e += 32) {
        choice[e] = scores[e] + (bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncwarp();
    int G = r.n_group > 1 ? r.n_group : 1;
    if (G > 1 && r.topk_group < G) {
        /* a lane per group: the sum of its two best biased scores */
        int per = E / G;
        for (int g = lane; g < G; g += 32) {
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
        __syncwarp();
        for (int k = 0; k < r.topk_group; k++) {
            int g = route_argmax(gscore, gsel, G, lane);
            if (lane == 0)
                gsel[g] = 1;
            __syncwarp();
        }
        for (int e = lane; e < E; e += 32)
            if (!gsel[e / per])
                choice[e] = 0.0f; /* DeepSeek-V3 masks with 0, not -inf */
        __syncwarp();
    }
    if (E <= 64) {
        route_rank_topk(choice, scores, E, K, lane, sel, selw);
    } else {
        for (int k = 0; k < K; k++) {
            int best = route_argmax(choice, taken, E, lane);
            if (lane == 0) {
                taken[best] = 1;
                sel[k] = best;
                selw[k] = scores[best];
            }
            __syncwarp();
        }
    }
    __syncwarp();
    route_write_row(ids, wts, sel, selw, r, t, lane);
}

/* moe_route for E <= 64 without group limits (V2-Lite: 64 experts, one
 * group), one warp a token, lane l holding entries l and l + 32 in
 * registers: the bias loads before the wait (no kernel writes it), the
 * logits once, and the ranks come from the biased scores broadcast four at
 * a time from shared memory. The general kernel above spent 4.2 us a
 * V2-Lite layer (SPECD_ABLATE=route against a kernel that only writes a
 * routing) in chains of shared-memory and L2 round trips. The same
 * numbers as moe_route_kernel: the softmax sum in expert order, the picks
 * by route_rank_topk's rank, their sum in slot order. */
/* token t's routing by the first warp of a block (lane: its lane): the
 * bias of experts lane and lane + 32 before the PDL wait, the rest after
 * (r: the kernel's __grid_constant__ parameter); !WAIT: in a block past
 * its wait */
template <bool SIG, bool WAIT = true>
__device__ __forceinline__ void route_small_token(int32_t *ids, float *wts, const float *logits,
                                                  const float *bias, const sd_moe_route &r,
                                                  int t, int lane)
{
    __shared__ float4 sh4[16]; /* 64 floats: the scores, then the ranked choices */
    __shared__ int sel[64];
    __shared__ float selw[64];
    float *sh = (float *)sh4;
    const int E = r.n_experts, K = r.top_k;
    const int e0 = lane, e1 = lane + 32;
    const bool in0 = e0 < E, in1 = e1 < E;
    const float b0 = bias && in0 ? bias[e0] : 0.0f, b1 = bias && in1 ? bias[e1] : 0.0f;
    if (WAIT)
        SD_PDL_ENTER(ids, wts, logits, bias, r);
    const float *lg = logits + (size_t)t * (size_t)E;
    const float l0 = in0 ? lg[e0] : 0.0f, l1 = in1 ? lg[e1] : 0.0f;
    float s0, s1;
    if (SIG) {
        s0 = 1.0f / (1.0f + expf(-l0));
        s1 = 1.0f / (1.0f + expf(-l1));
    } else {
        const float m = sd__warp_max(fmaxf(in0 ? l0 : -INFINITY, in1 ? l1 : -INFINITY));
        s0 = in0 ? expf(l0 - m) : 0.0f;
        s1 = in1 ? expf(l1 - m) : 0.0f;
        sh[e0] = s0;
        sh[e1] = s1;
        __syncwarp();
        /* in expert order, as the CPU sums, every lane alike; the entries
         * past E (up to a multiple of 4) hold 0 and add nothing */
        float s = 0;
        for (int j = 0; j < (E + 3) / 4; j++) {
            const float4 y = sh4[j];
            s += y.x;
            s += y.y;
            s += y.z;
            s += y.w;
        }
        s0 /= s;
        s1 /= s;
        __syncwarp();
    }
    /* choice = score + bias, NaN as -inf; rank = the entries ahead of it */
    const float c0 = s0 + b0, c1 = s1 + b1;
    const float x0 = c0 != c0 ? -INFINITY : c0, x1 = c1 != c1 ? -INFINITY : c1;
    sh[e0] = x0;
    sh[e1] = x1;
    __syncwarp();
    /* the entries past E are not experts (0.5 each with the sigmoid): they
     * rank nothing */
    int r0 = 0, r1 = 0;
    for (int j4 = 0; j4 < (E + 3) / 4; j4++) {
        const float4 y = sh4[j4];
        const float yv[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int j = 4 * j4 + q;
            r0 += j < E && (yv[q] > x0 || (yv[q] == x0 && j < e0));
            r1 += j < E && (yv[q] > x1 || (yv[q] == x1 && j < e1));
        }
    }
    if (in0 && r0 < K) {
        sel[r0] = e0;
        selw[r0] = s0;
    }
    if (in1 && r1 < K) {
        sel[r1] = e1;
        selw[r1] = s1;
    }
    __syncwarp();
    route_write_row(ids, wts, sel, selw, r, t, lane);
}

template <bool SIG>
__global__ void moe_route_small_kernel(int32_t *ids, float *wts, const float *logits,
                                       const float *bias, const __grid_constant__ sd_moe_route r)
{
    route_small_token<SIG>(ids, wts, logits, bias, r, blockIdx.x, threadIdx.x);
}

/* SPECD_ABLATE=route: token t's row gets experts t * W + k (mod E) with
 * weight 1 / W: top-k distinct experts, none of the routing's work */
__global__ void moe_route_fixed_kernel(int32_t *ids, float *wts,
                                       const __grid_constant__ sd_moe_route r)
{
    SD_PDL_ENTER(ids, wts, r);
    const int K = r.top_k, W = K + (r.n_always > 0 ? r.n_always : 0), t = blockIdx.x;
    for (int k = threadIdx.x; k < W; k += 32) {
        ids[(size_t)t * W + k] = k < K ? (t * W + k) % r.n_experts : r.n_experts + (k - K);
        wts[(size_t)t * W + k] = 1.0f / (float)W;
    }
}

/* r is routed on moe_route_small_kernel: a valid routing of up to 64
 * experts without group limits, that kernel on (SPECD_ROUTE_SMALL), the
 * routing not ablated */
static int route_small_takes(const sd__cuda *c, const sd_moe_route *r)
{
    const int E = r->n_experts, G = r->n_group > 1 ? r->n_group : 1;
    return c->route_small && !(c->ablate & SD__AB_ROUTE) && E > 0 && E <= 64 && r->top_k > 0 &&
           r->top_k <= E && r->n_always >= 0 && (G == 1 || r->topk_group >= G);
}

void sd__cuda_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                        const float *bias, int n, const sd_moe_route *r)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    int E = r->n_experts, G = r->n_group > 1 ? r->n_group : 1;
    if (E <= 0 || E > MOE_MAX_EXPERTS || r->top_k <= 0 || r->top_k > E || r->n_always < 0 ||
        (G > 1 && (E % G || r->topk_group <= 0 || r->topk_group > G))) {
        SD_BADARG(c, "moe_route: %d experts, top-%d, %d groups (top-%d)", E, r->top_k,
                  r->n_group, r->topk_group);
        return;
    }
    if (c->ablate & SD__AB_ROUTE) {
        sd__launch(c, moe_route_fixed_kernel, n, 32, 0, ids, wts, *r);
        SD_LAUNCHED(c, "moe_route_fixed_kernel");
        return;
    }
    if (route_small_takes(c, r)) {
        if (r->sigmoid)
            sd__launch(c, moe_route_small_kernel<true>, n, 32, 0, ids, wts, logits, bias, *r);
        else
            sd__launch(c, moe_route_small_kernel<false>, n, 32, 0, ids, wts, logits, bias, *r);
        SD_LAUNCHED(c, "moe_route_small_kernel");
        return;
    }
    size_t sm = ((size_t)E * 3 + 2 * (size_t)r->top_k) * sizeof(float) + (size_t)E * 2;
    sd__launch(c, moe_route_kernel, n, 32, sm, ids, wts, logits, bias, *r);
    SD_LAUNCHED(c, "moe_route_kernel");
}

/* the router's matmul then moe_route (the ops contract's definition; a
 * fused kernel would be one launch) */
void sd__cuda_moe_router_route(sd_backend *be, int32_t *ids, float *wts, float *logits,
                               const float *x, const sd_weight *w, const float *bias, int n,
                               int x_stride, const sd_moe_route *r)
{
    if (!(sd__cuda_of(be)->ablate & SD__AB_ROUTER))
        sd__cuda_matmul(be, logits, x, w, NULL, n, x_stride);
    sd__cuda_moe_route(be, ids, wts, logits, bias, n, r);
}

/* ---- experts ----------------------------------------------------------- */

template <int MAXE, bool F8 = false> struct moe_tabs {
    const void *a[MAXE]; /* gate (or down) of each expert */
    const void *b[MAXE]; /* up */
};

/* block-scaled FP8 experts (sd_weight's F8_E4M3): each one's scales too;
 * row j of a's expert e has its scales at sa[e] + (j / bm) * sca (b: sb,
 * scb), column k's at k >> bshift (the fused kernels and the tensor-core
 * GEMM read FP8; at most MOE_F8_MAX_EXPERTS, the parameter's 32 KB) */
template <int MAXE> struct moe_tabs<MAXE, true> {
    const void *a[MAXE];
    const void *b[MAXE];
    const float *sa[MAXE];
    const float *sb[MAXE];
    int bm, bshift, sca, scb;
};
#define MOE_F8_MAX_EXPERTS 512

/* an FP8 table's scalars, for SD_PDL_ENTER to read before the wait (its
 * pointer arrays are read at an index learned after it: common.cuh); 0
 * where the table is not FP8 */
template <int MAXE, bool F8> __device__ __forceinline__ int tab_words(const moe_tabs<MAXE, F8> &t)
{
    if constexpr (F8)
        return t.bm ^ t.bshift ^ t.sca ^ t.scb;
    else
        return 0;
}

/* tab's a and b from weights wa and wb (NULL: none), e of them */
template <int MAXE, bool F8>
static void tabs_fill(moe_tabs<MAXE, F8> &tab, const sd_weight *wa, const sd_weight *wb, int E)
{
    memset(&tab, 0, sizeof tab);
    for (int e = 0; e < E; e++) {
        tab.a[e] = wa[e].data;
        tab.b[e] = wb ? wb[e].data : NULL;
        if constexpr (F8) {
            tab.sa[e] = wa[e].scale;
            tab.sb[e] = wb ? wb[e].scale : NULL;
        }
    }
    if constexpr (F8) {
        tab.bm = wa[0].block[0];
        tab.bshift = __builtin_ctz((unsigned)wa[0].block[1]);
        tab.sca = (int)wa[0].scale_cols;
        tab.scb = wb ? (int)wb[0].scale_cols : 0;
    }
}

/* the table's log2 of its scale blocks' columns (0: not FP8) */
template <int MAXE, bool F8> __device__ __forceinline__ int tab_bshift(const moe_tabs<MAXE, F8> &tab)
{
    if constexpr (F8)
        return tab.bshift;
    else
        return 0;
}

/* FP8 row j's scales in a (b: !in_a) of expert e, else NULL */
template <int MAXE, bool F8>
__device__ __forceinline__ const float *tab_srow(const moe_tabs<MAXE, F8> &tab, int e, int j,
                                                 bool in_a)
{
    if constexpr (F8)
        return (in_a ? tab.sa[e] : tab.sb[e]) + (size_t)(j / tab.bm) * (size_t)(in_a ? tab.sca : tab.scb);
    else
        return NULL;
}

/* off (E+1): first sorted position of each expert; sorted (m): row r = t*k + j
 * of each position; inv (m): position of each row, -1 for an id outside the
 * bank [first, first + E) (expert parallel: another rank's expert). */
__global__ void __launch_bounds__(1024)
moe_sort_kernel(int *off_g, int *sorted, int *inv, const int32_t *ids, int m, int E, int first)
{
    SD_PDL_ENTER(off_g, sorted, inv, ids, m, E, first);
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

/* The rows [*beg, *end) of expert e that block row chunk z takes: chunks of
 * rc rows (a multiple of 8, so every 8-row group, and so every sum, is the
 * one an unchunked block forms). */
__device__ __forceinline__ void moe_rows_chunk(const int *off, int e, int z, int rc, int *beg,
                                               int *end)
{
    int b = off[e] + z * rc, e1 = off[e + 1];
    *beg = b;
    *end = e1 - b < rc ? e1 : b + rc;
}

/* h(p, I) = silu(x_row(p) @ gate_e^T) * (x_row(p) @ up_e^T) for the rows p of
 * expert e = blockIdx.y in row chunk blockIdx.z of rc rows; a warp per output
 * column. */
template <int DT, bool VEC, int MAXE>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_gate_up_kernel(float *h, const float *x, const int *off, const int *sorted, int top_k, int D,
                   int I, int rc, const __grid_constant__ moe_tabs<MAXE> tab)
{
    SD_PDL_ENTER(h, x, off, sorted, top_k, D, I, rc);
    int e = blockIdx.y, beg, end;
    moe_rows_chunk(off, e, blockIdx.z, rc, &beg, &end);
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

/* y(p, D) = h(p) @ down_e^T, rows chunked as moe_gate_up_kernel's */
template <int DT, bool VEC, int MAXE>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_down_kernel(float *y, const float *h, const int *off, int D, int I, int rc,
                const __grid_constant__ moe_tabs<MAXE> tab)
{
    SD_PDL_ENTER(y, h, off, D, I, rc);
    int e = blockIdx.y, beg, end;
    moe_rows_chunk(off, e, blockIdx.z, rc, &beg, &end);
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
    SD_PDL_ENTER(out, y, inv, wts, top_k, D);
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

/* The row chunks of the grouped GEMV: each expert's rows are cut into
 * chunks of *rc (a multiple of 8) so a prefill's few experts with hundreds
 * of rows each fill the GPU (one block per (column tile, expert) looped over
 * all of an expert's rows: the bundled model's 8 experts at 1400 tokens took
 * 271 + 171 us a layer on an H200, NOTES.md, session 32). The counts are on
 * the device, so the grid covers any split of the m rows: z chunks of rc
 * with z * rc >= m, about 4 a mean expert, and the blocks of chunks past an
 * expert's rows return at once; at most ~64k blocks (many experts: then
 * fewer, longer chunks). Returns z. */
static unsigned moe_row_chunks(int m, int E, unsigned cols, int *rc)
{
    long per = ((long)m + 4L * E - 1) / (4L * E); /* a quarter of a mean expert's rows */
    per = per < 32 ? 32 : (per + 7) / 8 * 8;
    long z = ((long)m + per - 1) / per, cap = 65536L / ((long)cols * E);
    if (cap < 1)
        cap = 1;
    if (z > cap) {
        z = cap;
        per = (((long)m + z - 1) / z + 7) / 8 * 8;
        z = ((long)m + per - 1) / per;
    }
    *rc = (int)per;
    return (unsigned)(z < 1 ? 1 : z);
}

template <int DT, bool VEC, int MAXE>
static void launch_experts(sd__cuda *c, const sd_experts *ex, float *h, float *y, const float *x,
                           const int *off, const int *sorted, int top_k, int D, int I, int m)
{
    moe_tabs<MAXE> tab;
    memset(&tab, 0, sizeof tab);
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->gate[e].data;
        tab.b[e] = ex->up[e].data;
    }
    int rc;
    unsigned gx = (unsigned)((I + MOE_WARPS - 1) / MOE_WARPS);
    dim3 g1(gx, (unsigned)ex->n, moe_row_chunks(m, ex->n, gx, &rc));
    sd__launch(c, moe_gate_up_kernel<DT, VEC, MAXE>, g1, MOE_WARPS * 32, 0, h, x, off, sorted, top_k,
                                                                            D, I, rc, tab);
    if (SD_LAUNCHED(c, "moe_gate_up_kernel"))
        return;
    for (int e = 0; e < ex->n; e++) {
        tab.a[e] = ex->down[e].data;
        tab.b[e] = NULL;
    }
    gx = (unsigned)((D + MOE_WARPS - 1) / MOE_WARPS);
    dim3 g2(gx, (unsigned)ex->n, moe_row_chunks(m, ex->n, gx, &rc));
    sd__launch(c, moe_down_kernel<DT, VEC, MAXE>, g2, MOE_WARPS * 32, 0, y, h, off, D, I, rc, tab);
    SD_LAUNCHED(c, "moe_down_kernel");
}

template <int DT, bool VEC>
static void launch_experts_e(sd__cuda *c, const sd_experts *ex, float *h, float *y, const float *x,
                             const int *off, const int *sorted, int top_k, int D, int I, int m)
{
    if (ex->n <= 256)
        launch_experts<DT, VEC, 256>(c, ex, h, y, x, off, sorted, top_k, D, I, m);
    else
        launch_experts<DT, VEC, MOE_MAX_EXPERTS>(c, ex, h, y, x, off, sorted, top_k, D, I, m);
}

template <int DT>
static void launch_experts_v(sd__cuda *c, int vec, const sd_experts *ex, float *h, float *y,
                             const float *x, const int *off, const int *sorted, int top_k, int D,
                             int I, int m)
{
    if (vec)
        launch_experts_e<DT, true>(c, ex, h, y, x, off, sorted, top_k, D, I, m);
    else
        launch_experts_e<DT, false>(c, ex, h, y, x, off, sorted, top_k, D, I, m);
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
 * side by side). At V2-Lite's batch 1 the two read a layer's 138 MB in 37.4
 * us, where a plain read of them takes 33.7 (specd-bench-kernels
 * --read-lab); one persistent launch of these tiles for both was 22-25%
 * slower (bench/results/NOTES.md, session 17). */

#define MOE_FUSED_U 2 /* chunks per warp loaded before use (3 measured slower) */

/* h(p, I) = silu(x_t @ gate_e^T) * (x_t @ up_e^T) for pair p = blockIdx.x
 * (t = p / top_k, e = ids[p] - first; pairs of other banks are skipped).
 * Block: WK K-slices x RG row groups; a row group computes output columns
 * j .. j + GU - 1 from 2 GU weight rows (gate j.., up j..) sharing x_t, U
 * chunks of each loaded before use: GU = 2 with MOE_FUSED_U chunks, or,
 * where one chunk is all a warp has of a row (D <= 8 x 256: V2-Lite's
 * 2048), GU = 4 with one, so a block streams twice the bytes and the grid
 * has half the blocks (the same sums: a row's order depends on D and WK
 * only). (Loading the always-on experts' weights before the PDL wait, while
 * the norm, router and route ran, measured 2% slower at V2-Lite's batch 1:
 * bench/results/NOTES.md, session 14.) */
#define MOE_GATE_WIDE_GU 4
/* a pair's column tile ty of its row hp of h (I wide), from its token's
 * row xt and expert e of the table (the kernel below; the routing
 * kernel's always-on tiles) */
template <int DT, int MAXE, int GU, int U>
__device__ __forceinline__ void gate_up_tile(float *hp, const float *xt, int e, int ty, int D,
                                             int I, int WK, const moe_tabs<MAXE, DT == SD__F8> &tab)
{
    constexpr int VR = 2 * GU;
    __shared__ float part[SD__GEMV_WARPS * VR];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int RG = SD__GEMV_WARPS / WK, kw = warp % WK, rg = warp / WK;
    const int cols0 = ty * RG * GU, j0 = cols0 + rg * GU;
    const size_t rb = (size_t)D * sd__esz<DT>();
    const char *wg = (const char *)tab.a[e], *wu = (const char *)tab.b[e];
    const void *wrow[VR];
    const float *srow[VR]; /* F8: each row's scales */
#pragma unroll
    for (int i = 0; i < VR; i++) {
        const int j = j0 + i % GU;
        wrow[i] = j < I ? (i < GU ? wg : wu) + (size_t)j * rb : NULL;
        srow[i] = j < I ? tab_srow(tab, e, j, i < GU) : NULL;
    }
    sd__warp_dots1<DT, VR, U>(wrow, xt, D, kw, WK, lane, part + warp * VR, srow, tab_bshift(tab));
    __syncthreads();
    if ((int)threadIdx.x < RG * GU) {
        const int g = threadIdx.x / GU, q = threadIdx.x % GU, j = cols0 + g * GU + q;
        if (j < I) {
            float gs = part[(g * WK) * VR + q], us = part[(g * WK) * VR + GU + q];
            for (int k = 1; k < WK; k++) {
                gs += part[(g * WK + k) * VR + q];
                us += part[(g * WK + k) * VR + GU + q];
            }
            hp[j] = gs / (1.0f + expf(-gs)) * us;
        }
    }
}

/* Slots j >= routed of each token are skipped (its always-on slots, run
 * beside the routing: moe_route_always_kernel; routed = top_k: none). */
template <int DT, int MAXE, int GU, int U, int MINB>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, MINB)
moe_gate_up_fused_kernel(float *h, const float *x, const int32_t *ids, int top_k, int routed,
                         int D, int I, int first, int E, int WK,
                         const __grid_constant__ moe_tabs<MAXE, DT == SD__F8> tab)
{
    SD_PDL_ENTER(h, x, ids, top_k, routed, D, I, first, E, WK, tab_words(tab));
    const int p = blockIdx.x, t = p / top_k;
    if (p - t * top_k >= routed)
        return;
    const int e = ids[p] - first;
    if (e < 0 || e >= E)
        return;
    gate_up_tile<DT, MAXE, GU, U>(h + (size_t)p * (size_t)I, x + (size_t)t * (size_t)D, e,
                                  blockIdx.y, D, I, WK, tab);
}

/* The routing of n tokens beside their always-on experts' gate/up: blocks
 * 0 .. n - 1 route a token each (warp 0: moe_route_small_kernel's work),
 * the others take gate_up_tile's column tiles of each token's slots
 * K .. K + n_always - 1, whose experts (E + a) do not wait
 * for the routing. The routing's chain (the logits' round trip, its
 * reductions) then runs while the always-on experts' weights stream
 * instead of before every expert's. The same bits as the two kernels. At
 * least 3 blocks an SM, as the gate/up kernel's wide shape gets (80
 * registers; the routing's part took it to 84 and 2 blocks an SM).
 *
 * ROUTER (one token; SPECD_MOE_ROUTER, the default): the router's GEMV
 * runs here too, its rgx blocks first (matmul's wide one-pass blocks,
 * gemv_block: the same logits), and the block that counts itself last of
 * them (rcnt, a release-acquire count as mla_dec_kernel's fold) routes the
 * token: the router's kernel and its boundary leave the step's chain, its
 * weights load before the wait and its sums run while the always-on
 * experts' weights stream. V2-Lite's batch 1 +2.4% on an H100 (2.088
 * against 2.138 ms a step; predicted +1-2% from the router's 1.66 us a
 * layer in session 55's trace). The same count on one word by every block
 * of a grid, to take the residual step after the MoE's down kernel (512
 * blocks) or after the output projection's GEMV (256) in its last block,
 * ran 3.2% and 2.2% slower than the add_rmsnorm kernel it saved
 * (bench/results/ab-moe-router-folds-5f9dc96.json; the code at 5f9dc96). */
template <int DT, int MAXE, int GU, int U, int MINB, bool SIG, bool ROUTER>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, MINB < 3 ? 3 : MINB)
moe_route_always_kernel(int32_t *ids, float *wts, const float *logits, const float *bias,
                        const __grid_constant__ sd_moe_route r, int n, float *h, const float *x,
                        int D, int I, int first, int E, int WK,
                        const __grid_constant__ moe_tabs<MAXE, DT == SD__F8> tab,
                        const __grid_constant__ mm_args ra, int rwk, int rgx, unsigned *rcnt)
{
    const int b = blockIdx.x, nr = ROUTER ? rgx : n;
    if (b < nr) {
        if (!ROUTER) {
            if (threadIdx.x < 32)
                route_small_token<SIG>(ids, wts, logits, bias, r, b, threadIdx.x);
            return;
        }
        /* the routing's parameters read before the wait too (sd__ptouch:
         * gemv_block's wait touches its own); its logits stored before the
         * block's last barrier */
        sd__ptouch(ids, wts, logits, bias, r, rcnt);
        gemv_block<SD__BF16, 1, true, false, GEMV_WIDE_VR, GEMV_WIDE_U>(ra, rwk, b, 0);
        __shared__ int last;
        if (threadIdx.x == 0)
            last = sd__atom_add_acq_rel(rcnt, 1u) == (unsigned)rgx - 1;
        __syncthreads();
        if (!last)
            return;
        if (threadIdx.x == 0)
            *rcnt = 0; /* zero for the next call (a graph replay too) */
        if (threadIdx.x < 32)
            route_small_token<SIG, false>(ids, wts, logits, bias, r, 0, threadIdx.x);
        return;
    }
    SD_PDL_ENTER(ids, wts, logits, bias, r, n, h, x, D, I, first, E, WK, tab_words(tab));
    /* pairs fastest, as the gate/up kernel's grid: the tokens' blocks of one
     * always-on expert's tile run side by side and share its weights in L2
     * (tiles fastest, a verify step's tokens each read an expert's 11.5 MB
     * tens of MB apart: V2-Lite's MTP verify steps ran 4-6% slower) */
    const int npa = n * r.n_always, q = b - nr, ty = q / npa, pa = q - ty * npa;
    const int t = pa / r.n_always, a = pa - t * r.n_always, W = r.top_k + r.n_always;
    const int e = r.n_experts + a - first;
    if (e < 0 || e >= E)
        return;
    gate_up_tile<DT, MAXE, GU, U>(h + (size_t)(t * W + r.top_k + a) * (size_t)I,
                                  x + (size_t)t * (size_t)D, e, ty, D, I, WK, tab);
}

/* out(t, d) = sum_j wts[t, j] * (h(t * top_k + j) @ down_e^T)[d], slots j in
 * order, for token t = blockIdx.x and rows d of tile blockIdx.y (DR rows).
 * Warps: SW slot lanes x WK K-slices; slot lane s takes slots s, s + SW, ...
 * A warp loads DU chunks of its DR rows before it uses them. part: (top_k,
 * WK, DR) floats of dynamic shared memory. A row's sums do not depend on DR
 * or DU (its chunks in order, the warp butterfly), so every shape gives the
 * same bits; MINB blocks an SM caps the registers.
 *
 * The shapes (SPECD_MOE_DOWN, c->moe_down): at batch 1 V2-Lite's 8 slots
 * of I = 1408 take one warp each, the whole K. With 4 rows a block and 2
 * chunks a load (0: the first shape) the kernel took 79 registers: 3
 * blocks an SM, 396 of its 512 blocks at once, and the other 116 a second
 * wave at a fraction of the bandwidth (17.8 us a layer for 46 MB, 60% of
 * the copy rate). 1: the same work in 64 registers, 4 blocks an SM, one
 * wave (the F32 instance spills); 2: 8 rows a block, 1 chunk a load, 256
 * blocks at 2 an SM, one wave (half the reads of h from L2); 3: 8 rows, 2
 * chunks a load (16 loads in flight a lane), 2 blocks an SM. Under Nsight
 * Compute shape 1 read 3.18 TB/s where the gate/up kernel (7 waves) read
 * 3.72 (bench/results/ncu-v2lite-b1-169c5d8.json): probably one wave of
 * blocks that each load, then use, 3 times over I = 1408, with no other
 * block to fill the gaps. 3 chunks a load spill at 4 rows and 4 blocks an
 * SM (136 bytes) and at 8 rows and 2 (68 bytes). In the step (a kernel
 * trace) it adds 15.2 us a layer, the gate/up kernel 23.4. Two shapes that
 * load V2-Lite's whole I = 1408 in one round trip a warp (2 rows and 6
 * chunks a load, 2 blocks an SM; 1 row, 4 blocks an SM, blocks that load
 * once and exit as the gate/up kernel's do) ran 6.1% and 5.5% slower at
 * V2-Lite's batch 1 (session 17) and were removed.
 *
 * Loading the first DU chunks before the PDL wait, for the experts ids
 * named then (the routing ran two kernels before), moved 3.3 us a layer
 * from this kernel into the gate/up kernel's last wave and saved nothing
 * (session 14, NOTES.md): the two kernels together read 138 MB a layer at
 * ~3.6 TB/s either way. Taking h's reads off the load rounds was slower
 * both ways tried (session 25): each warp's row prefetched into L1 after
 * the wait (prefetch.global.L1, with the gate/up kernels' and the GEMVs':
 * V2-Lite -10.4%), and copied into shared memory by one bulk copy a warp
 * before its first weight loads (-8.4%). The down lab's body with one chunk
 * a load (4 rows, 4 blocks an SM) read 5.5% faster than shape 1's alone
 * (12.88 against 13.63 us a layer), and in the step it ran V2-Lite 1.1%
 * slower (session 26): the lab ranks bodies, not the step. One block an
 * SM streaming a run of rows into shared memory (S stages of R rows of
 * every slot, as bulk copies on an mbarrier a stage, or cp.async by every
 * thread; h copied once), bitwise this kernel, ran V2-Lite's batch 1
 * 6-26% slower on an H100 (R = 4: -6..-9%, R = 1: -19..-26%; more stages did
 * not help): an SM's async copies reached ~8-14 GB/s, where 23 are needed
 * (session 55, a0091ba). The always-on experts' down rows moved into the
 * routed gate/up launch (their h is whole when it starts; this kernel then
 * adds their sums last, the same bits) ran V2-Lite's batch 1 and 2 within
 * 0.1% of this form on an H100 (session 57; the patch is
 * bench/gpu/pending/0001-moe-always-down.patch at 5e2175c). Not traced:
 * whether this kernel kept its time over its bytes or the gate/up kernel
 * grew by what it saved is not known. */
template <int DT, int MAXE, int DR, int DU, int MINB>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, MINB)
moe_down_fused_kernel(float *out, const float *h, const int32_t *ids, const float *wts, int top_k,
                      int D, int I, int first, int E, int WK,
                      const __grid_constant__ moe_tabs<MAXE, DT == SD__F8> tab)
{
    SD_PDL_ENTER(out, h, ids, wts, top_k, D, I, first, E, WK, tab_words(tab));
    extern __shared__ float part[];
    const int t = blockIdx.x, d0 = blockIdx.y * DR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int SW = SD__GEMV_WARPS / WK, kw = warp % WK, sl = warp / WK;
    const size_t rb = (size_t)I * sd__esz<DT>();
    for (int j = sl; j < top_k; j += SW) {
        const size_t p = (size_t)t * (size_t)top_k + (size_t)j;
        const int e = ids[p] - first;
        if (e < 0 || e >= E)
            continue; /* the same for the whole warp */
        const char *wd = (const char *)tab.a[e];
        const void *wrow[DR];
        const float *srow[DR]; /* F8: each row's scales */
#pragma unroll
        for (int i = 0; i < DR; i++) {
            wrow[i] = d0 + i < D ? (const void *)(wd + (size_t)(d0 + i) * rb) : NULL;
            srow[i] = d0 + i < D ? tab_srow(tab, e, d0 + i, true) : NULL;
        }
        sd__warp_dots1<DT, DR, DU>(wrow, h + p * (size_t)I, I, kw, WK, lane,
                                   part + (j * WK + kw) * DR, srow, tab_bshift(tab));
    }
    __syncthreads();
    if (threadIdx.x < DR && d0 + (int)threadIdx.x < D) {
        const int i = threadIdx.x;
        float s = 0.0f;
        for (int j = 0; j < top_k; j++) {
            const size_t p = (size_t)t * (size_t)top_k + (size_t)j;
            const int e = ids[p] - first;
            if (e < 0 || e >= E)
                continue;
            float y = part[(j * WK) * DR + i];
            for (int k = 1; k < WK; k++)
                y += part[(j * WK + k) * DR + i];
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

/* the down kernel of one shape: a block of DR rows of every token */
template <int DT, int MAXE, int DR, int DU, int MINB>
static void launch_down(sd__cuda *c, const moe_tabs<MAXE, DT == SD__F8> &tab, float *out, const float *h,
                        const int32_t *ids, const float *wts, int n, int top_k, int D, int I,
                        const sd_experts *ex, int wk)
{
    dim3 g((unsigned)n, (unsigned)((D + DR - 1) / DR));
    size_t sm = (size_t)top_k * (size_t)wk * DR * sizeof(float);
    sd__launch(c, moe_down_fused_kernel<DT, MAXE, DR, DU, MINB>, g, SD__GEMV_WARPS * 32, sm, out,
               h, ids, wts, top_k, D, I, ex->first, ex->n, wk, tab);
}

/* the routing moe_route_always_kernel runs beside the always-on experts
 * (router: the router's GEMV too, rt's rgx blocks of K-split rwk) */
struct moe_route_args {
    const float *logits, *bias;
    sd_moe_route r;
    int router;
    mm_args rt;
    int rwk, rgx;
};

/* gate/up (with ra: after the routing beside the always-on slots) in the
 * shape (GU, U, MINB), then nothing */
template <int DT, int MAXE, int GU, int U, int MINB>
static void launch_gate_up(sd__cuda *c, const moe_route_args *ra, int32_t *ids, float *wts,
                           float *h, const float *x, int n, int top_k, int D, int I,
                           const sd_experts *ex, int wk, const moe_tabs<MAXE, DT == SD__F8> &tab)
{
    const int cols = SD__GEMV_WARPS / wk * GU, tiles = (I + cols - 1) / cols;
    int routed = top_k;
    if (ra) {
        const int nr = ra->router ? ra->rgx : n;
        const unsigned g = (unsigned)(nr + n * ra->r.n_always * tiles), th = SD__GEMV_WARPS * 32;
#define ROUTE_ALWAYS(SIG, ROUTER)                                                                 \
    sd__launch(c, moe_route_always_kernel<DT, MAXE, GU, U, MINB, SIG, ROUTER>, g, th, 0, ids, wts, \
               ra->logits, ra->bias, ra->r, n, h, x, D, I, ex->first, ex->n, wk, tab, ra->rt,    \
               ra->rwk, ra->rgx, c->moe_router_cnt)
        if (ra->router)
            ra->r.sigmoid ? ROUTE_ALWAYS(true, true) : ROUTE_ALWAYS(false, true);
        else
            ra->r.sigmoid ? ROUTE_ALWAYS(true, false) : ROUTE_ALWAYS(false, false);
#undef ROUTE_ALWAYS
        if (SD_LAUNCHED(c, "moe_route_always_kernel"))
            return;
        routed = ra->r.top_k;
    }
    dim3 g1((unsigned)(n * top_k), (unsigned)tiles);
    sd__launch(c, moe_gate_up_fused_kernel<DT, MAXE, GU, U, MINB>, g1, SD__GEMV_WARPS * 32, 0, h,
               x, (const int32_t *)ids, top_k, routed, D, I, ex->first, ex->n, wk, tab);
}

/* ra: route too, beside the always-on slots (moe_router_ffn); ids and wts
 * are then written here */
template <int DT, int MAXE>
static void launch_fused(sd__cuda *c, const sd_experts *ex, float *out, float *h, const float *x,
                         int32_t *ids, float *wts, int n, int top_k, int D, int I,
                         const moe_route_args *ra)
{
    moe_tabs<MAXE, DT == SD__F8> tab;
    tabs_fill(tab, ex->gate, ex->up, ex->n);
    int wk = sd__gemv_wk(D);
    if (c->moe_gate_wide && (D + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK <= wk) {
        /* one chunk a warp: 4 output columns a row group, one load each
         * (80 registers: 3 blocks an SM; moe_gate_wide 2: 64, 4 blocks) */
        if (c->moe_gate_wide == 2)
            launch_gate_up<DT, MAXE, MOE_GATE_WIDE_GU, 1, 4>(c, ra, ids, wts, h, x, n, top_k, D,
                                                              I, ex, wk, tab);
        else
            launch_gate_up<DT, MAXE, MOE_GATE_WIDE_GU, 1, 2>(c, ra, ids, wts, h, x, n, top_k, D,
                                                              I, ex, wk, tab);
    } else {
        launch_gate_up<DT, MAXE, 2, MOE_FUSED_U, 4>(c, ra, ids, wts, h, x, n, top_k, D, I, ex, wk,
                                                    tab);
    }
    if (SD_LAUNCHED(c, "moe_gate_up_fused_kernel"))
        return;
    tabs_fill(tab, ex->down, (const sd_weight *)NULL, ex->n);
    wk = down_wk(top_k, I);
    if (c->moe_down == 3)
        launch_down<DT, MAXE, 8, 2, 2>(c, tab, out, h, ids, wts, n, top_k, D, I, ex, wk);
    else if (c->moe_down == 2)
        launch_down<DT, MAXE, 8, 1, 2>(c, tab, out, h, ids, wts, n, top_k, D, I, ex, wk);
    else if (c->moe_down == 1)
        launch_down<DT, MAXE, 4, MOE_FUSED_U, 4>(c, tab, out, h, ids, wts, n, top_k, D, I, ex, wk);
    else
        launch_down<DT, MAXE, 4, MOE_FUSED_U, 3>(c, tab, out, h, ids, wts, n, top_k, D, I, ex, wk);
    SD_LAUNCHED(c, "moe_down_fused_kernel");
}

template <int DT>
static void launch_fused_e(sd__cuda *c, const sd_experts *ex, float *out, float *h, const float *x,
                           int32_t *ids, float *wts, int n, int top_k, int D, int I,
                           const moe_route_args *ra)
{
    if (ex->n <= 256)
        launch_fused<DT, 256>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra);
    else if constexpr (DT == SD__F8) /* moe_ffn_path: at most MOE_F8_MAX_EXPERTS */
        launch_fused<DT, MOE_F8_MAX_EXPERTS>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra);
    else
        launch_fused<DT, MOE_MAX_EXPERTS>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra);
}

/* ---- grouped GEMM on tensor cores (prefill) ------------------------------
 *
 * Many (token, slot) rows per expert (prefill: hundreds to thousands of
 * tokens x top-k) make the expert FFN compute-bound; the grouped GEMV above
 * does fp32 multiply-adds. With the switch on (by default for real-size
 * experts; sd_cuda_set_moe_tc, SPECD_MOE_TC) and BF16 weights, the sorted rows go through two
 * grouped GEMMs on mma.sync m16n8k16 (bf16 operands, fp32 accumulate):
 *
 *   tiles    one block: each expert's rows cut into row tiles of MOE_TC_BM,
 *            tile_off (E + 1) the prefix of the per-expert tile counts and
 *            tile_e (tiles) the expert of each, from the sort's offsets, on
 *            the device (the host never sees a count);
 *   x -> bf16  the n token rows once (not the n * top_k pairs);
 *   gate/up  per (expert, column tile, row tile): 64 gate and the same 64 up
 *            columns against a row tile, SiLU(g) * u in the epilogue, h
 *            stored in bf16 (m, I) in sorted order;
 *   down     the same over h: 128 output columns a tile, y (m, D) fp32;
 *   combine  the grouped path's kernel (slots in order).
 *
 * The GEMM blocks are persistent (a grid of what the SMs hold at once)
 * and walk L = 0 .. tile_off[E] * ncol - 1 with a stride of the grid. Inside
 * an expert L runs over row tiles fastest, then column tiles, so the blocks
 * in flight share one expert's weight tile (read from memory about once,
 * then from L2) while the row tiles' activations, much smaller, are the
 * ones re-read. As in vLLM's fused_moe (rows padded to BLOCK_M per expert,
 * an expert id per row block) the activation rows of the gate/up GEMM are
 * gathered through the sort's positions as they load (token = row / top_k).
 *
 * Tile: BM = 64 rows x 128 weight rows (64 gate + 64 up, or 128 down) x
 * BK = 32, four warps of 32 x 64 (2 x 8 mmas), 4 stages of cp.async
 * (16-byte, zero-filled past the rows, columns and K), 48 KiB of static
 * shared memory; chunks XOR-swizzled by row so ldmatrix reads hit 8
 * different 16-byte bank groups. Needs D % 8 == 0, I % 8 == 0 and 16-byte
 * aligned data (any K tail is zero-filled); other shapes and dtypes take
 * the grouped GEMV.
 *
 * Accuracy: x and h are rounded to bf16 (2^-9 relative each); a float64
 * model of this op on the GPU test's distributions gave 2.7e-3 rms and
 * 2.0e-3 .. 3.1e-3 max |err| / max |out| (the GEMV path: ~1e-6). That
 * model, and a lane-by-lane emulation of these kernels' index math (PTX
 * fragment layouts, swizzle, zero-fill, tile walk), are
 * bench/kernels/moe_tc_model.py. */

#define MOE_TC_BM 64
#define MOE_TC_BK 32
#define MOE_TC_BROWS 128 /* weight rows a tile */
#define MOE_TC_STAGES 4
#define MOE_TC_THREADS 128
#define MOE_TC_BLOCKS_PER_SM 4 /* 48 KiB of shared memory and <= 128 registers each */

void sd_cuda_set_moe_tc(sd_backend *be, int mode)
{
    sd__cuda_of(be)->moe_tc = mode == SD_CUDA_TC_AUTO ? mode : mode != 0;
}

/* tile_off (E + 1): prefix of ceil(rows_e / BM); tile_e: the expert of each
 * row tile. One block of 1024 threads, one expert each (E <= 1024). */
__global__ void __launch_bounds__(1024) moe_tc_tiles_kernel(int *tile_off, int *tile_e,
                                                            const int *off, int E)
{
    SD_PDL_ENTER(tile_off, tile_e, off, E);
    __shared__ int wsum[32];
    const int e = threadIdx.x, lane = e % 32, w = e / 32;
    const int cnt = e < E ? (off[e + 1] - off[e] + MOE_TC_BM - 1) / MOE_TC_BM : 0;
    int v = cnt; /* inclusive scan in the warp, then over the warps' sums */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += u;
    }
    if (lane == 31)
        wsum[w] = v;
    __syncthreads();
    if (w == 0) {
        int s = lane < (int)(blockDim.x / 32) ? wsum[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int u = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o)
                s += u;
        }
        wsum[lane] = s;
    }
    __syncthreads();
    const int incl = v + (w ? wsum[w - 1] : 0), excl = incl - cnt;
    if (e < E) {
        tile_off[e] = excl;
        for (int i = 0; i < cnt; i++)
            tile_e[excl + i] = e;
    }
    if (e == E - 1)
        tile_off[E] = incl;
}

/* two floats as packed bf16 (round to nearest even), the first in the low half */
__device__ __forceinline__ uint32_t moe_tc_pack(float lo, float hi)
{
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&p);
}

/* xb(n8 * 8) = bf16(x); 8 elements a thread step */
__global__ void moe_tc_bf16_kernel(__nv_bfloat16 *xb, const float *x, size_t n8)
{
    SD_PDL_ENTER(xb, x, n8);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = ((const float4 *)x)[2 * i], b = ((const float4 *)x)[2 * i + 1];
        ((uint4 *)xb)[i] = make_uint4(moe_tc_pack(a.x, a.y), moe_tc_pack(a.z, a.w),
                                      moe_tc_pack(b.x, b.y), moe_tc_pack(b.z, b.w));
    }
}

/* element offset of 16-byte chunk c (0..3) of row r in a (rows, BK) tile */
__device__ __forceinline__ int moe_tc_swz(int r, int c)
{
    return r * MOE_TC_BK + ((c ^ ((r >> 1) & 3)) << 3);
}

/* 16 bytes global -> shared, or zeros when bytes == 0 (nothing is read) */
__device__ __forceinline__ void moe_tc_cp16(void *smem, const void *g, int bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(bytes));
}

__device__ __forceinline__ void moe_tc_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void moe_tc_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void moe_tc_ldsm4(uint32_t (&r)[4], const void *p)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* GU: h(m, N = I) = bf16(SiLU(A W_gate^T) * (A W_up^T)), A row p = a[sorted[p] / top_k]
 *     (a: the bf16 tokens (n, K = D)); tab.a gate, tab.b up.
 * !GU: y(m, N = D) = A W_down^T, A row p = a[p] (a: h (m, K = I)); tab.a down.
 * off (E + 1), tile_off (E + 1), tile_e: the sort's and the tiles kernel's. */
/* F8: the experts are block-scaled FP8; their tiles load through registers,
 * each weight BF16(E4M3 x scale) (the BF16 dequantization's bits, so the
 * sums of the BF16 experts), without cp.async's overlap. */
template <bool GU, int MAXE, bool F8>
__global__ void __launch_bounds__(MOE_TC_THREADS, MOE_TC_BLOCKS_PER_SM)
moe_tc_gemm_kernel(void *outp, const __nv_bfloat16 *a, const int *sorted, int top_k,
                   const int *off, const int *tile_off, const int *tile_e, int E, int N, int K,
                   const __grid_constant__ moe_tabs<MAXE, F8> tab)
{
    SD_PDL_ENTER(outp, a, sorted, top_k, off, tile_off, tile_e, E, N, K);
    __shared__ __align__(128) __nv_bfloat16 sa[MOE_TC_STAGES][MOE_TC_BM * MOE_TC_BK];
    __shared__ __align__(128) __nv_bfloat16 sb[MOE_TC_STAGES][MOE_TC_BROWS * MOE_TC_BK];
    const int BN = GU ? MOE_TC_BROWS / 2 : MOE_TC_BROWS; /* output columns a tile */
    const int ncol = (N + BN - 1) / BN, nk = (K + MOE_TC_BK - 1) / MOE_TC_BK;
    const int total = tile_off[E] * ncol;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wm = warp / 2, wn = warp % 2;
    const int ck = tid % 4; /* the 16-byte chunk of BK this thread loads */
    for (int L = blockIdx.x; L < total; L += gridDim.x) {
        const int rt = L / ncol, e = tile_e[rt], t0 = tile_off[e], nrt = tile_off[e + 1] - t0;
        const int local = L - t0 * ncol, ct = local / nrt, r = local % nrt;
        const int row0 = off[e] + r * MOE_TC_BM, col0 = ct * BN;
        const int rows = min(MOE_TC_BM, off[e + 1] - row0);
        /* this thread's source rows: A rows tid/4 + 32i, weight rows tid/4 + 32i */
        const __nv_bfloat16 *asrc[2];
        bool aok[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rr = tid / 4 + 32 * i;
            aok[i] = rr < rows;
            size_t ar = 0;
            if (aok[i])
                ar = GU ? (size_t)(sorted[row0 + rr] / top_k) : (size_t)(row0 + rr);
            asrc[i] = a + ar * (size_t)K;
        }
        /* weight rows tid/4 + 32i: i = 0, 1 from wlo, i = 2, 3 from whi (GU: the
         * same columns of up; down: 64 rows further) */
        const int j0 = col0 + tid / 4, jhi = GU ? j0 : j0 + 64;
        const __nv_bfloat16 *wlo = (const __nv_bfloat16 *)tab.a[e] + (size_t)j0 * (size_t)K;
        const __nv_bfloat16 *whi = (const __nv_bfloat16 *)(GU ? tab.b[e] : tab.a[e]) +
                                   (size_t)jhi * (size_t)K;
        const size_t k32 = (size_t)32 * (size_t)K;
        /* F8: the 4 rows' bytes and scales */
        const uint8_t *w8[4] = {NULL, NULL, NULL, NULL};
        const float *s8[4] = {NULL, NULL, NULL, NULL};
        if constexpr (F8) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = (i < 2 ? j0 : jhi) + 32 * (i % 2);
                const bool in_a = !GU || i < 2;
                if (j < N) {
                    w8[i] = (const uint8_t *)(in_a ? tab.a[e] : tab.b[e]) + (size_t)j * (size_t)K;
                    s8[i] = tab_srow(tab, e, j, in_a);
                }
            }
        }
        auto load = [&](int s, int kt) {
            const int k = kt * MOE_TC_BK + ck * 8;
            const bool kin = k < K;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const bool ok = kin && aok[i];
                moe_tc_cp16(&sa[s][moe_tc_swz(tid / 4 + 32 * i, ck)], ok ? asrc[i] + k : a,
                            ok ? 16 : 0);
            }
            if constexpr (F8) {
                uint2 q[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = kin && w8[i] ? __ldg((const uint2 *)(w8[i] + k)) : make_uint2(0, 0);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float sc = kin && w8[i] ? __ldg(s8[i] + (k >> tab.bshift)) : 0.0f;
                    float f[8];
                    sd__f8x8f(q[i], sc, f);
                    *(uint4 *)&sb[s][moe_tc_swz(tid / 4 + 32 * i, ck)] =
                        make_uint4(moe_tc_pack(f[0], f[1]), moe_tc_pack(f[2], f[3]),
                                   moe_tc_pack(f[4], f[5]), moe_tc_pack(f[6], f[7]));
                }
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = (i < 2 ? j0 : jhi) + 32 * (i % 2);
                    const bool ok = kin && j < N;
                    const __nv_bfloat16 *src = (i < 2 ? wlo : whi) + (i % 2 ? k32 : 0) + k;
                    moe_tc_cp16(&sb[s][moe_tc_swz(tid / 4 + 32 * i, ck)], ok ? src : a,
                                ok ? 16 : 0);
                }
            }
        };
        float acc[2][8][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    acc[mi][j][q] = 0.0f;
#pragma unroll
        for (int s = 0; s < MOE_TC_STAGES - 1; s++) {
            if (s < nk)
                load(s, s);
            moe_tc_commit();
        }
        for (int kt = 0; kt < nk; kt++) {
            moe_tc_wait<MOE_TC_STAGES - 2>(); /* stage kt has landed (this thread's part) */
            __syncthreads();                  /* everyone's part; stage kt - 1 is free */
            if (kt + MOE_TC_STAGES - 1 < nk)
                load((kt + MOE_TC_STAGES - 1) % MOE_TC_STAGES, kt + MOE_TC_STAGES - 1);
            moe_tc_commit();
            const __nv_bfloat16 *As = sa[kt % MOE_TC_STAGES], *Bs = sb[kt % MOE_TC_STAGES];
#pragma unroll
            for (int ks = 0; ks < MOE_TC_BK / 16; ks++) {
                /* A (16 x 16) of m-tile mi: matrices rows 0-7 / 8-15 x k 0-7 / 8-15 */
                uint32_t af[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
                    moe_tc_ldsm4(af[mi], As + moe_tc_swz(wm * 32 + mi * 16 + lane % 16,
                                                         ks * 2 + lane / 16));
                /* B pair p: n-tiles 2p, 2p + 1 (16 weight rows) x k 0-7 / 8-15; GU:
                 * pairs 0-1 gate columns, 2-3 the same up columns */
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const int rb = GU ? (p < 2 ? wn * 32 + p * 16
                                               : MOE_TC_BROWS / 2 + wn * 32 + (p - 2) * 16)
                                      : wn * 64 + p * 16;
                    uint32_t bf[4];
                    moe_tc_ldsm4(bf, Bs + moe_tc_swz(rb + lane % 8 + (lane / 16) * 8,
                                                     ks * 2 + (lane / 8) % 2));
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        sd__mma_bf16(acc[mi][2 * p], af[mi], bf[0], bf[1]);
                        sd__mma_bf16(acc[mi][2 * p + 1], af[mi], bf[2], bf[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the next tile's first loads reuse every stage */
        /* c0, c1: (row g, cols 2t, 2t + 1); c2, c3: (row g + 8, same) */
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = wm * 32 + mi * 16 + lane / 4 + 8 * hh;
                if (row >= rows)
                    continue;
                const size_t orow = (size_t)(row0 + row) * (size_t)N;
                if (GU) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int col = col0 + wn * 32 + j * 8 + 2 * (lane % 4);
                        if (col >= N)
                            continue;
                        const float g0 = acc[mi][j][2 * hh], g1 = acc[mi][j][2 * hh + 1];
                        const float u0 = acc[mi][j + 4][2 * hh], u1 = acc[mi][j + 4][2 * hh + 1];
                        ((__nv_bfloat162 *)outp)[(orow + (size_t)col) / 2] =
                            __floats2bfloat162_rn(g0 / (1.0f + expf(-g0)) * u0,
                                                  g1 / (1.0f + expf(-g1)) * u1);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int col = col0 + wn * 64 + j * 8 + 2 * (lane % 4);
                        if (col >= N)
                            continue;
                        ((float2 *)outp)[(orow + (size_t)col) / 2] =
                            make_float2(acc[mi][j][2 * hh], acc[mi][j][2 * hh + 1]);
                    }
                }
            }
        }
    }
}

/* Row tiles at most: sum over experts of ceil(m_e / BM) <= m / BM + the
 * experts with rows. */
static size_t moe_tc_max_tiles(size_t m, int E)
{
    return m / MOE_TC_BM + ((size_t)E < m ? (size_t)E : m);
}

/* Whether sorted rows go to the tensor cores: the switch (auto: real-size
 * experts only; small ones keep the exact fp32 GEMV, fast enough there),
 * bf16 weights, dims and pointers the 16-byte loads take (vec). */
static int moe_tc_wants(const sd__cuda *c, sd_dtype dt, int vec, int D, int I)
{
    if (!c->moe_tc || dt != SD_DT_BF16 || !vec)
        return 0;
    return c->moe_tc == SD_CUDA_TC_ON || (size_t)D * (size_t)I >= SD_CUDA_MOE_TC_MIN_WEIGHTS;
}

/* room in tmp for the tile list after the sort's ints (m sorted rows) */
static int moe_tc_room(size_t m, int E, int D, int I)
{
    size_t ints = 2 * ((size_t)E + 1) + 2 * m + moe_tc_max_tiles(m, E);
    return ints <= m * ((size_t)D + (size_t)I + 1);
}

/* h: (m, I) floats of tmp, holding h in bf16; y: (m, D) floats, first the
 * bf16 tokens (n, D) (read by gate/up, then overwritten by down); tile_off,
 * tile_e: ints after the sort's. */
template <int MAXE, bool F8>
static void launch_tc(sd__cuda *c, const sd_experts *ex, float *h, float *y, const float *x,
                      const int *off, const int *sorted, int *tile_off, int *tile_e, int n,
                      int top_k, int D, int I, size_t m)
{
    const int E = ex->n;
    sd__launch(c, moe_tc_tiles_kernel, 1, 1024, 0, tile_off, tile_e, off, E);
    if (SD_LAUNCHED(c, "moe_tc_tiles_kernel"))
        return;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)y, *hb = (__nv_bfloat16 *)h;
    size_t n8 = (size_t)n * (size_t)D / 8, cap = (size_t)c->sm_count * 8;
    unsigned gb = (unsigned)((n8 + 255) / 256 < cap ? (n8 + 255) / 256 : cap);
    sd__launch(c, moe_tc_bf16_kernel, gb, 256, 0, xb, x, n8);
    if (SD_LAUNCHED(c, "moe_tc_bf16_kernel"))
        return;
    moe_tabs<MAXE, F8> tab;
    tabs_fill(tab, ex->gate, ex->up, E);
    const size_t tiles = moe_tc_max_tiles(m, E), hold = (size_t)c->sm_count * MOE_TC_BLOCKS_PER_SM;
    size_t blocks = tiles * (size_t)((I + MOE_TC_BROWS / 2 - 1) / (MOE_TC_BROWS / 2));
    sd__launch(c, moe_tc_gemm_kernel<true, MAXE, F8>, (unsigned)(blocks < hold ? blocks : hold), MOE_TC_THREADS, 0, hb, xb, sorted, top_k, off, tile_off, tile_e, E,
                                                  I, D, tab);
    if (SD_LAUNCHED(c, "moe_tc_gemm_kernel<gate/up>"))
        return;
    tabs_fill(tab, ex->down, (const sd_weight *)NULL, E);
    blocks = tiles * (size_t)((D + MOE_TC_BROWS - 1) / MOE_TC_BROWS);
    sd__launch(c, moe_tc_gemm_kernel<false, MAXE, F8>, (unsigned)(blocks < hold ? blocks : hold), MOE_TC_THREADS, 0, y, hb, NULL, 1, off, tile_off, tile_e, E, D, I,
                                                   tab);
    SD_LAUNCHED(c, "moe_tc_gemm_kernel<down>");
}

/* moe_ffn's arguments checked (a bad one recorded as the backend's error:
 * -1) and its path: 1 the fused kernels, 0 the sorted one. *I, *dt: the
 * experts' intermediate size and dtype; *vec: 16-byte rows and data; *tc:
 * the sorted path on tensor cores (moe_tc_wants). */
static int moe_ffn_path(sd__cuda *c, const sd_experts *ex, const float *x, const void *tmp, int n,
                        int top_k, int D, int *I, sd_dtype *dt, int *vec, int *tc)
{
    int E = ex->n;
    if (E <= 0 || E > MOE_MAX_EXPERTS || top_k <= 0) {
        SD_BADARG(c, "moe_ffn: %d experts, top-%d", E, top_k);
        return -1;
    }
    *I = (int)ex->gate[0].rows;
    *dt = ex->gate[0].dtype;
    /* a weight row is 16-byte aligned when its length is a multiple of 8 */
    *vec = D % 8 == 0 && *I % 8 == 0 && sd__aligned16(x) && sd__aligned16(tmp);
    for (int e = 0; e < E; e++) {
        const sd_weight *g = &ex->gate[e], *u = &ex->up[e], *d = &ex->down[e];
        if (g->dtype != *dt || u->dtype != *dt || d->dtype != *dt || g->rows != *I ||
            u->rows != *I || g->cols != D || u->cols != D || d->rows != D || d->cols != *I) {
            SD_BADARG(c, "moe_ffn: expert %d: weights differ from expert 0 in dtype or shape", e);
            return -1;
        }
        *vec = *vec && sd__aligned16(g->data) && sd__aligned16(u->data) && sd__aligned16(d->data);
    }
    size_t m = (size_t)n * (size_t)top_k;
    if ((size_t)E + 1 + 2 * m > m * ((size_t)D + (size_t)*I + 1)) {
        SD_BADARG(c, "moe_ffn: scratch of %zu floats cannot hold %d expert offsets",
                  SD_MOE_TMP_FLOATS(n, top_k, D, *I), E);
        return -1;
    }
    if (*dt != SD_DT_F32 && *dt != SD_DT_BF16 && *dt != SD_DT_F16 && *dt != SD_DT_F8_E4M3) {
        SD_BADARG(c, "moe_ffn: weight dtype %s", sd_dtype_name(*dt));
        return -1;
    }
    if (*dt == SD_DT_F8_E4M3) {
        /* the fused kernels, or the tensor cores past their pairs (the
         * sorted GEMV reads no FP8): 16-byte rows, one block shape */
        for (int e = 0; e < E && *vec; e++) {
            const sd_weight *w[3] = {&ex->gate[e], &ex->up[e], &ex->down[e]};
            for (int i = 0; i < 3; i++)
                *vec = *vec && w[i]->scale && w[i]->block[0] == ex->gate[0].block[0] &&
                       w[i]->block[1] == ex->gate[0].block[1];
        }
        if (!*vec || E > MOE_F8_MAX_EXPERTS) {
            SD_BADARG(c, "moe_ffn: fp8 experts need rows of a multiple of 8, one block shape and "
                         "at most %d experts (%d, D %d, I %d)", MOE_F8_MAX_EXPERTS, E, D, *I);
            return -1;
        }
        *tc = c->moe_tc != 0 && moe_tc_room(m, E, D, *I);
    } else {
        *tc = moe_tc_wants(c, *dt, *vec, D, *I);
    }
    int max_pairs = c->moe_fused_max_pairs > 0 ? c->moe_fused_max_pairs
                    : *tc                      ? SD_CUDA_MOE_TC_FUSED_MAX_PAIRS
                                               : SD_CUDA_MOE_FUSED_MAX_PAIRS;
    /* FP8 takes the fused kernels wherever the tensor cores do not */
    return *vec && (m <= (size_t)max_pairs || (*dt == SD_DT_F8_E4M3 && !*tc));
}

/* the fused path of a checked moe_ffn (ra: routing beside it) */
static void moe_fused(sd__cuda *c, sd_dtype dt, const sd_experts *ex, float *out, float *h,
                      const float *x, int32_t *ids, float *wts, int n, int top_k, int D, int I,
                      const moe_route_args *ra)
{
    switch (dt) {
    case SD_DT_F8_E4M3: launch_fused_e<SD__F8>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra); break;
    case SD_DT_F32: launch_fused_e<SD__F32>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra); break;
    case SD_DT_BF16: launch_fused_e<SD__BF16>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra); break;
    default: launch_fused_e<SD__F16>(c, ex, out, h, x, ids, wts, n, top_k, D, I, ra); break;
    }
}

void sd__cuda_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                      const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    int I, vec, tc;
    sd_dtype dt;
    const int path = moe_ffn_path(c, ex, x, tmp, n, top_k, D, &I, &dt, &vec, &tc);
    if (path < 0)
        return;
    float *h = (float *)tmp; /* (m, I) */
    if (path == 1) {
        /* the fused kernels only read ids and wts without a routing to run */
        moe_fused(c, dt, ex, out, h, x, (int32_t *)ids, (float *)wts, n, top_k, D, I, NULL);
        return;
    }
    const int E = ex->n;
    size_t m = (size_t)n * (size_t)top_k;
    float *y = h + m * (size_t)I;            /* (m, D) */
    int *off = (int *)(y + m * (size_t)D);   /* (E + 1) */
    int *sorted = off + E + 1, *inv = sorted + m; /* (m), (m) */
    sd__launch(c, moe_sort_kernel, 1, 1024, (2 * (size_t)E + 1) * sizeof(int), off, sorted, inv, ids,
                                                                               (int)m, E, ex->first);
    if (SD_LAUNCHED(c, "moe_sort_kernel"))
        return;
    if (tc && moe_tc_room(m, E, D, I)) {
        int *tile_off = inv + m, *tile_e = tile_off + E + 1; /* (E + 1), (tiles) */
        if (dt == SD_DT_F8_E4M3 && E <= 256)
            launch_tc<256, true>(c, ex, h, y, x, off, sorted, tile_off, tile_e, n, top_k, D, I, m);
        else if (dt == SD_DT_F8_E4M3)
            launch_tc<MOE_F8_MAX_EXPERTS, true>(c, ex, h, y, x, off, sorted, tile_off, tile_e, n,
                                                top_k, D, I, m);
        else if (E <= 256)
            launch_tc<256, false>(c, ex, h, y, x, off, sorted, tile_off, tile_e, n, top_k, D, I, m);
        else
            launch_tc<MOE_MAX_EXPERTS, false>(c, ex, h, y, x, off, sorted, tile_off, tile_e, n,
                                              top_k, D, I, m);
    } else {
        switch (dt) {
        case SD_DT_F32: launch_experts_v<SD__F32>(c, vec, ex, h, y, x, off, sorted, top_k, D, I, (int)m); break;
        case SD_DT_BF16: launch_experts_v<SD__BF16>(c, vec, ex, h, y, x, off, sorted, top_k, D, I, (int)m); break;
        default: launch_experts_v<SD__F16>(c, vec, ex, h, y, x, off, sorted, top_k, D, I, (int)m); break;
        }
    }
    if (c->err)
        return;
    sd__launch(c, moe_combine_kernel, n, 256, 0, out, y, inv, wts, top_k, D);
    SD_LAUNCHED(c, "moe_combine_kernel");
}

/* moe_router_ffn: in steps of up to c->moe_overlap tokens (1 by default)
 * where the experts take the fused path, the routing is the register
 * kernel's (E <= 64, no group limits) and there are always-on experts, the
 * routing runs beside their gate/up (moe_route_always_kernel), at one
 * token the router's GEMV too (c->moe_router); otherwise moe_router_route,
 * then moe_ffn. */
void sd__cuda_moe_router_ffn(sd_backend *be, float *out, int32_t *ids, float *wts, float *logits,
                             const float *x, const sd_weight *w, const float *bias,
                             const sd_experts *ex, int n, int D, const sd_moe_route *r, void *tmp)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    const int na = r->n_always > 0 ? r->n_always : 0, W = r->top_k + na;
    int I = 0, vec = 0, tc = 0, path = -1;
    sd_dtype dt = SD_DT_F32;
    if (n <= c->moe_overlap && na > 0 && route_small_takes(c, r) && ex->n > 0 &&
        (path = moe_ffn_path(c, ex, x, tmp, n, W, D, &I, &dt, &vec, &tc)) < 0)
        return;
    if (path != 1) {
        sd__cuda_moe_router_route(be, ids, wts, logits, x, w, bias, n, D, r);
        sd__cuda_moe_ffn(be, out, x, ids, wts, ex, n, W, D, tmp);
        return;
    }
    moe_route_args ra = {logits, bias, *r, 0, {}, 0, 0};
    /* the router's GEMV beside the always-on experts too (one token, where
     * matmul runs the wide one-pass BF16 shape) */
    if (!(c->ablate & SD__AB_ROUTER)) {
        ra.router = n == 1 && c->moe_router &&
                    sd__cuda_gemv_wide1(c, &ra.rt, logits, x, w, D, &ra.rwk, &ra.rgx);
        if (!ra.router)
            sd__cuda_matmul(be, logits, x, w, NULL, n, D);
    }
    moe_fused(c, dt, ex, out, (float *)tmp, x, ids, wts, n, W, D, I, &ra);
}

SD_KTRACE_EXPORT(moe)

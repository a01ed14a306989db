/* CUDA: y = x @ W^T (kernels/cpu/matmul.c is the reference).
 *
 * Three paths, by the number of activation rows n:
 * - n <= SD_CUDA_GEMV_MAX_ROWS (decode, verification): GEMV on the fp32
 *   activations (kernels/cuda/gemv.cuh): memory-bound, each weight byte read
 *   once from memory with many 16-byte loads in flight (2-4 rows of 16-bit
 *   weights: the persistent few-row kernel, the same sums). Up to
 *   SD_CUDA_GEMV_EXACT_ROWS rows fp32 multiply-adds, whose result for a row
 *   does not depend on the other rows of the call; above, BF16 weights go
 *   to tensor cores (mma.sync) with the activations split exactly into
 *   three bf16 terms: fp32-exact products, 8 weight rows per activation
 *   fragment instead of 8 multiply-adds per weight.
 * - more rows, BF16 weights: cuBLASLt, fp32 accumulate, fp32 output. The
 *   activations go to bf16 in scratch (row chunks that fit it), by default as
 *   two terms, hi = bf16(x) and lo = bf16(x - hi), summed by two GEMMs: ~16
 *   mantissa bits, so prefill logits stay within ~1e-5 of fp32 (one term:
 *   ~1e-2, and greedy continuations drift; sd_cuda_set_bf16_split). F32
 *   weights: cuBLASLt in plain fp32 (no TF32). Descriptors and the algorithm
 *   are made once per shape and kept in the context; the algorithm is the
 *   fastest of the heuristic's candidates timed on the first call's operands
 *   (the heuristic's first when that call is being captured).
 * - otherwise (F16 weights, per-head matmuls, no cuBLASLt algorithm): a
 *   tiled fp32 kernel (64x64 tiles).
 * matmul_heads is the same with the head as a batch index: weight rows
 * h*N.., activations at h*x_head_stride + x_off, output (n, H, N). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_block.cuh"
#include "kernels/cuda/mla_prep.cuh"

template <int DT, int NR, bool PRE, bool SILU, int VR, int U>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, GEMV_MINB(DT, NR, VR, U))
    gemv_kernel(const __grid_constant__ mm_args a, int WK)
{
    gemv_block<DT, NR, PRE, SILU, VR, U>(a, WK, blockIdx.x, blockIdx.y);
}

/* BF16 weights on tensor cores (gemv.cuh), for batches above
 * SD_CUDA_GEMV_EXACT_ROWS: y(n, N) in passes of 16 * MT activation rows. A block is
 * SD__GEMV_WARPS warps = WK K-slices x (SD__GEMV_WARPS / WK) row groups of
 * 8 * NB weight rows (NB mmas share each activation fragment); K-slice kw
 * is a contiguous run of 32-element chunks. Each chunk's mmas (2 k-steps x
 * 3 activation terms, smallest first) start from 0 and are added to the
 * fp32 sum with one add per output: a chunk's partial stays small, so the
 * tensor cores' internal accumulation never rounds a large running sum. */
#define MMA_LOADS 8 /* 16-byte weight loads per lane in flight */

template <int MT, int NB>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, 2)
    gemv_mma_kernel(const __grid_constant__ mm_args a, int WK)
{
    SD_PDL_ENTER(a, WK);
    constexpr int U = MMA_LOADS / NB;   /* chunks per warp loaded before use */
    constexpr int E = MT * NB * 128;    /* outputs per warp and pass */
    __shared__ float part[SD__GEMV_WARPS * E];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int h = blockIdx.y, RG = SD__GEMV_WARPS / WK, kw = warp % WK, rg = warp / WK;
    const int rows0 = blockIdx.x * RG * 8 * NB;
    const uint16_t *wr[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        int j = rows0 + (rg * NB + b) * 8 + g;
        wr[b] = j < a.N ? (const uint16_t *)a.w + ((size_t)h * (size_t)a.N + (size_t)j) * (size_t)a.K
                        : NULL;
    }
    const float *xb = a.x + (size_t)h * (size_t)a.x_bstride + (size_t)a.x_off;
    float *yb = a.y + (size_t)h * (size_t)a.y_bstride;
    const int nch = (a.K + 31) / 32, cpw = (nch + WK - 1) / WK;
    const int cb = kw * cpw, ce = cb + cpw < nch ? cb + cpw : nch;
    for (int r0 = 0; r0 < a.n; r0 += 16 * MT) {
        const float *xr[MT][2];
        bool hi8[MT]; /* rows 8..15 of tile q hold activations */
#pragma unroll
        for (int q = 0; q < MT; q++) {
            hi8[q] = r0 + q * 16 + 8 < a.n;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int m = r0 + q * 16 + hh * 8 + g;
                xr[q][hh] = m < a.n ? xb + (size_t)m * (size_t)a.x_stride : NULL;
            }
        }
        float acc[MT][NB][4];
#pragma unroll
        for (int q = 0; q < MT; q++)
#pragma unroll
            for (int b = 0; b < NB; b++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[q][b][i] = 0.0f;
        for (int c0 = cb; c0 < ce; c0 += U) {
            uint4 w[U][NB];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = c0 + u, k = c * 32 + t * 8;
#pragma unroll
                for (int b = 0; b < NB; b++)
                    w[u][b] = c < ce && k < a.K && wr[b] ? sd__ld_stream(wr[b] + k)
                                                         : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u, k = c * 32 + t * 8;
                if (c >= ce)
                    break; /* the same for the whole warp: the mmas need all lanes */
#pragma unroll
                for (int q = 0; q < MT; q++) {
                    if (r0 + q * 16 >= a.n)
                        break; /* an empty tile (warp-uniform) */
                    uint32_t f[3][2][4];
                    sd__x_frags(xr[q][0], xr[q][1], k, k < a.K, hi8[q], f);
#pragma unroll
                    for (int b = 0; b < NB; b++) {
                        const uint32_t wb[4] = {w[u][b].x, w[u][b].y, w[u][b].z, w[u][b].w};
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int s = 0; s < 2; s++)
#pragma unroll
                            for (int term = 2; term >= 0; term--)
                                sd__mma_bf16(d, f[term][s], wb[2 * s], wb[2 * s + 1]);
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            acc[q][b][i] += d[i];
                    }
                }
            }
        }
        /* d0: (row g, column 2t), d1: (g, 2t+1), d2: (g+8, 2t), d3: (g+8, 2t+1);
         * part per warp: [q][row 16][weight column 8 * NB] */
#pragma unroll
        for (int q = 0; q < MT; q++)
#pragma unroll
            for (int b = 0; b < NB; b++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    part[warp * E + (q * 16 + g + (i >> 1) * 8) * (8 * NB) + b * 8 + 2 * t +
                         (i & 1)] = acc[q][b][i];
        __syncthreads();
        for (int idx = threadIdx.x; idx < RG * E; idx += blockDim.x) {
            const int gr = idx / E, rem = idx % E, m = r0 + rem / (8 * NB);
            const int jj = rows0 + gr * 8 * NB + rem % (8 * NB);
            if (m < a.n && jj < a.N) {
                float s = part[(gr * WK) * E + rem];
                for (int q = 1; q < WK; q++)
                    s += part[(gr * WK + q) * E + rem];
                if (a.bias)
                    s += sd__wload(a.bias, a.bias_dt, (size_t)jj);
                yb[(size_t)m * (size_t)a.y_stride + (size_t)jj] = s;
            }
        }
        __syncthreads(); /* part is rewritten by the next pass */
    }
}

/* The GEMV of rows that cannot take 16-byte loads (K % 8 != 0, unaligned
 * pointers or strides): a warp per weight row, one element per lane. */
template <int DT>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32)
    gemv_scalar_kernel(const __grid_constant__ mm_args a)
{
    SD_PDL_ENTER(a);
    int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int j = blockIdx.x * SD__GEMV_WARPS + warp;
    if (j >= a.N)
        return;
    size_t wr = ((size_t)h * (size_t)a.N + (size_t)j) * (size_t)a.K;
    const float *xb = a.x + (size_t)h * (size_t)a.x_bstride + (size_t)a.x_off;
    float *yb = a.y + (size_t)h * (size_t)a.y_bstride + (size_t)j;
    float bj = a.bias ? sd__wload(a.bias, a.bias_dt, (size_t)j) : 0.0f;
    for (int r0 = 0; r0 < a.n; r0 += 8) {
        int nr = a.n - r0 < 8 ? a.n - r0 : 8;
        const float *xr[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            xr[r] = xb + (size_t)(r0 + (r < nr ? r : 0)) * (size_t)a.x_stride;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        sd__dot_rows<DT, false>(a.w, wr, a.K, xr, nr, lane, acc);
        float mine = 0;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r < nr) {
                float s = sd__warp_sum(acc[r]);
                if (lane == r)
                    mine = s;
            }
        }
        if (lane < nr)
            yb[(size_t)(r0 + lane) * (size_t)a.y_stride] = mine + bj;
    }
}

#define TM 64
#define TN 64
#define TK 16

/* C tile (64 activation rows x 64 weight rows), 256 threads of 4x4 outputs. */
template <int DT>
__global__ void __launch_bounds__(256) tiled_kernel(const __grid_constant__ mm_args a)
{
    SD_PDL_ENTER(a);
    __shared__ float As[TK][TM + 4], Bs[TK][TN + 4];
    int h = blockIdx.z, m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const float *xb = a.x + (size_t)h * (size_t)a.x_bstride + (size_t)a.x_off;
    size_t wb = (size_t)h * (size_t)a.N;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0;
    for (int k0 = 0; k0 < a.K; k0 += TK) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int e = tid + i * 256, r = e / TK, kk = e % TK, gk = k0 + kk;
            int gm = m0 + r, gn = n0 + r;
            As[kk][r] = gm < a.n && gk < a.K ? xb[(size_t)gm * (size_t)a.x_stride + gk] : 0.0f;
            Bs[kk][r] = gn < a.N && gk < a.K
                            ? sd__w1<DT>(a.w, (wb + (size_t)gn) * (size_t)a.K + (size_t)gk)
                            : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                av[i] = As[kk][ty + 16 * i];
                bv[i] = Bs[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
    float *yb = a.y + (size_t)h * (size_t)a.y_bstride;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = m0 + ty + 16 * i;
        if (row >= a.n)
            continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int col = n0 + tx + 16 * j;
            if (col < a.N)
                yb[(size_t)row * (size_t)a.y_stride + col] =
                    acc[i][j] + (a.bias ? sd__wload(a.bias, a.bias_dt, (size_t)col) : 0.0f);
        }
    }
}

/* hi(n, K) dense bf16 = x(n, K) rows x_stride apart, round to nearest even;
 * with lo: lo = bf16(x - hi), the part of x that hi misses. */
__global__ void to_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, int n, int K,
                               int x_stride)
{
    SD_PDL_ENTER(hi, lo, x, n, K, x_stride);
    size_t m = (size_t)n * (size_t)K, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride) {
        size_t r = e / (size_t)K, k = e % (size_t)K;
        float v = x[r * (size_t)x_stride + k];
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[e] = h;
        if (lo)
            lo[e] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

__global__ void bias_kernel(float *y, const void *bias, int dt, int n, int N)
{
    SD_PDL_ENTER(y, bias, dt, n, N);
    size_t m = (size_t)n * (size_t)N, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride)
        y[e] += sd__wload(bias, dt, e % (size_t)N);
}

static unsigned grid_for(size_t m)
{
    size_t b = (m + 255) / 256;
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}

/* ---- the few-row GEMV, persistent (SPECD_GEMV_FEW) ----------------------
 *
 * gemv_kernel at 2-4 activation rows loads a warp's K-slice, waits, does
 * NR times the 1-row kernel's multiply-adds with nothing in flight, sums
 * the warps through shared memory behind a barrier, and exits: 2 blocks an
 * SM (its registers), each a single round of 8 weight loads a lane against
 * a fixed cost of setup and epilogue. At 4 rows the Llama-3-8B-shaped
 * gate/up ran at 0.64 of the copy bandwidth alone (1 row: 0.99) and a
 * 4-row step cost 1.56x a 1-row one (bench/results/NOTES.md, session 29);
 * Nsight Compute had its warps mostly ready, at the barrier or not
 * selected, not waiting on memory (ncu-deep-e5c1d8d.json). A first
 * persistent form that streamed each lane's weights through a cp.async ring
 * in shared memory ran slower at every row count (its index arithmetic an
 * item, and the ring's 64 KB a block pushing the activations out of L1).
 *
 * Here blocks are persistent (block b takes row blocks b, b + grid, ...)
 * and a warp walks its K-slice of its VR rows in items of up to CW = 2
 * chunks, the next item (the rest of this row block, or the next row
 * block's first) asked for before it multiplies this one's: a row block's
 * multiply-adds, warp sums and barrier run under the next loads. Where a
 * warp's K-slice is one item (K up to 4096 at 8 warps) the walk is a
 * row block a step in its own loop (the general walk ran the 8B's 2- and
 * 3-row steps 10% slower there); longer rows (LONG: the 8B's down
 * projection) take the general walk. The activation chunk of every row is
 * loaded at once, and the partials alternate between two buffers (one
 * barrier a row block). The first item's weights are asked for before the
 * PDL wait. Measured on the H200 (NOTES.md, session 29): the 8B's steps of
 * 2 / 3 / 4 rows 6.7% / 12.7% / 16.4% shorter, EAGLE-3 k = 3 at batch 1
 * 2.13x where it was 1.82x; 5-8 rows (2 weight rows a warp: the
 * registers) were slower than the one-pass kernel and stay there, and 2
 * rows of one chunk a warp stay on its wide shape (faster in the lab).
 *
 * The same order of sums as gemv_block (gemv.cuh: a lane's one fmaf chain
 * over its chunks c = kw, kw + WK, ... in order, the xor butterfly, the
 * WK warp partials in warp order): the bits of the 1-row kernel, whatever
 * the rows. */
#define FEW_VR 4 /* weight rows a warp */

/* the weight row i of a warp's row group in row block G (NULL: past the
 * end), as gemv_block picks them */
template <bool SILU, int VR>
__device__ __forceinline__ const char *few_row(const mm_args &a, const char *wb, int G, int RG,
                                               int rg, int i, size_t rowb)
{
    constexpr int HV = VR / 2;
    if (SILU) {
        const int I = a.N / 2, o = (G * RG + rg) * HV + i % HV;
        return o < I ? wb + (size_t)((i < HV ? 0 : I) + o) * rowb : NULL;
    }
    const int j = G * RG * VR + rg * VR + i;
    return j < a.N ? wb + (size_t)j * rowb : NULL;
}

template <int DT, int NR, bool SILU, int VR, int CW, bool LONG>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, 2)
    gemv_few_kernel(const __grid_constant__ mm_args a, int WK, int nG)
{
    static_assert(DT != SD__F32, "16-bit weights: one 16-byte load is 8 of them");
    /* exactly NR rows (no test a row), their sums NP apart (a power of two
     * for the butterfly: 3 rows take 4 places) */
    static_assert(NR >= 2 && NR <= 4, "2-4 activation rows");
    constexpr int NP = NR == 3 ? 4 : NR, V = VR * NP;
    __shared__ float part[2][SD__GEMV_WARPS * V];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int RG = SD__GEMV_WARPS / WK, kw = warp % WK, rg = warp / WK, h = blockIdx.y;
    const int nch = (a.K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    /* the warp's chunks kw, kw + WK, ... in items of CW: one a row block,
     * or (LONG) P (warps of one block may differ by one chunk, never by a
     * row block) */
    const int cwr = (nch - kw + WK - 1) / WK, P = LONG ? (cwr + CW - 1) / CW : 1;
    const size_t rowb = (size_t)a.K * 2;
    const char *wb = (const char *)a.w + (size_t)h * (size_t)a.N * rowb;
    /* item p's chunk q: its first element, and whether the lane has it */
    auto kof = [&](int p, int q) { return (kw + (p * CW + q) * WK) * SD__GEMV_CHUNK + lane * 8; };
    auto has = [&](int p, int q) { return p * CW + q < cwr && kof(p, q) < a.K; };
    auto load = [&](uint4 (&w)[CW][VR], int G, int p) {
#pragma unroll
        for (int i = 0; i < VR; i++) {
            const char *r = few_row<SILU, VR>(a, wb, G, RG, rg, i, rowb);
#pragma unroll
            for (int q = 0; q < CW; q++)
                w[q][i] = r && has(p, q) ? sd__ld_stream(r + (size_t)kof(p, q) * 2)
                                         : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 wa[CW][VR], wz[CW][VR];
    int G = blockIdx.x, p = 0, j = 0;
    if (G < nG)
        load(wa, G, 0);
    SD_PDL_ENTER(a, WK, nG);
    const float *xb = a.x + (size_t)h * (size_t)a.x_bstride + (size_t)a.x_off;
    float *yb = a.y + (size_t)h * (size_t)a.y_bstride;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++)
        acc[v] = 0.0f;
    /* item p's multiply-adds from its weights w (chunks in order: a
     * lane's one fmaf chain) */
    auto fmas = [&](const uint4 (&w)[CW][VR], int p) {
#pragma unroll
        for (int q = 0; q < CW; q++) {
            if (!has(p, q))
                continue;
            const int k = kof(p, q);
            float4 xv[NR][2];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const float4 *xp = (const float4 *)(xb + (size_t)r * (size_t)a.x_stride + k);
                xv[r][0] = __ldg(xp);
                xv[r][1] = __ldg(xp + 1);
            }
#pragma unroll
            for (int i = 0; i < VR; i++) {
                sd__w8raw<DT> raw;
                raw.q[0] = w[q][i];
                float wf[8];
                sd__w8_float<DT>(raw, wf);
#pragma unroll
                for (int r = 0; r < NR; r++)
                    acc[i * NP + r] = sd__fma8(wf, xv[r][0], xv[r][1], acc[i * NP + r]);
            }
        }
    };
    /* row block G's sums out through part[j & 1] */
    auto out = [&](int G, int j) {
        float *pb = part[j & 1];
        sd__xreduce<V>(acc, lane);
        if (lane % (32 / V) == 0)
            pb[warp * V + sd__xr_index<V>(lane)] = acc[0];
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[v] = 0.0f;
        /* one barrier a row block: part alternates, and the next row
         * block's writes to this one come after the next barrier, which
         * every thread reaches past its reads here */
        __syncthreads();
        gemv_store<SILU, VR, NP>(a, pb, WK, RG, G, 0, NR, yb);
    };
    /* two weight buffers: the next item's loads (the row block's next
     * chunks, or the next row block's first) go out before this item's
     * multiply-adds, and before a row block's sums and barrier. One item a
     * row block in its own loop (the general walk ran the 8B's 2- and
     * 3-row steps 10% slower there: NOTES.md, session 29). */
    if constexpr (!LONG) {
        for (; G < nG; j += 2) {
            const int G1 = G + (int)gridDim.x;
            if (G1 < nG)
                load(wz, G1, 0);
            fmas(wa, 0);
            out(G, j);
            if (G1 >= nG)
                break;
            const int G2 = G1 + (int)gridDim.x;
            if (G2 < nG)
                load(wa, G2, 0);
            fmas(wz, 0);
            out(G1, j + 1);
            G = G2;
        }
    } else {
        /* an item, the next one's loads first: whether there is a next */
        auto item = [&](const uint4 (&cur)[CW][VR], uint4 (&nxt)[CW][VR]) {
            int Gn = G, pn = p + 1;
            if (pn == P) {
                pn = 0;
                Gn += (int)gridDim.x;
            }
            if (Gn < nG)
                load(nxt, Gn, pn);
            fmas(cur, p);
            if (p == P - 1)
                out(G, j++);
            G = Gn;
            p = pn;
            return G < nG;
        };
        while (G < nG && item(wa, wz) && item(wz, wa)) {
        }
    }
}

/* chunks a warp takes of a row: the kernel's CW */
static int few_cw(const mm_args *a, int wk)
{
    const int nch = (a->K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    return (nch + wk - 1) / wk;
}

/* the persistent few-row GEMV's launch: one wave of blocks at the 2 an SM
 * its launch bounds give (no block waits for another, so a device that
 * holds fewer at once runs the same grid in more waves) */
template <int DT, int NR, bool SILU, int CW, bool LONG>
static void launch_gemv_few_nr(sd__cuda *c, const mm_args *a, int H, int wk)
{
    const int bps = 2;
    const dim3 g = gemv_grid(a, H, wk, FEW_VR, SILU);
    const int nG = (int)g.x, per = c->sm_count * bps / H > 0 ? c->sm_count * bps / H : 1;
    const dim3 grid((unsigned)(nG < per ? nG : per), (unsigned)H);
    sd__launch(c, gemv_few_kernel<DT, NR, SILU, FEW_VR, CW, LONG>, grid, SD__GEMV_WARPS * 32, 0,
               *a, wk, nG);
}

/* whether the persistent few-row GEMV takes a call: switched on for its
 * rows (SPECD_GEMV_FEW: n >= it), 2-4 rows of 16-bit weights (2 only
 * where a warp has 2 chunks or more), a warp's K-slice in at most 2 chunks
 * (K <= 4096 at 8 warps) or longer rows switched on too (SPECD_GEMV_FEW_LONG) */
static int gemv_few_takes(const sd__cuda *c, const mm_args *a, int dt16, int wk)
{
    const int cw = few_cw(a, wk);
    return dt16 && c->gemv_few > 0 && a->n >= c->gemv_few && a->n <= 4 &&
           (a->n >= 3 || (a->n == 2 && cw >= 2)) && (cw <= 2 || c->gemv_few_long);
}

template <int DT, bool SILU> static void launch_gemv_few(sd__cuda *c, const mm_args *a, int H, int wk)
{
    if constexpr (DT == SD__BF16 || DT == SD__F16) {
        const int cw = few_cw(a, wk);
#define FEW_CASE(n)                                                                     \
    case n:                                                                             \
        if (cw == 1)                                                                    \
            launch_gemv_few_nr<DT, n, SILU, 1, false>(c, a, H, wk);                     \
        else if (cw == 2)                                                               \
            launch_gemv_few_nr<DT, n, SILU, 2, false>(c, a, H, wk);                     \
        else                                                                            \
            launch_gemv_few_nr<DT, n, SILU, 2, true>(c, a, H, wk);                      \
        break;
        switch (a->n) {
            FEW_CASE(2)
            FEW_CASE(3)
            FEW_CASE(4)
        default: break;
        }
#undef FEW_CASE
    }
}

/* 1 or 2 rows (the wide and long-row shapes take only these) */
template <int DT, bool PRE, bool SILU, int VR, int U>
static void launch_gemv_12(sd__cuda *c, const mm_args *a, int H, int wk)
{
    const unsigned th = SD__GEMV_WARPS * 32;
    const dim3 grid = gemv_grid(a, H, wk, VR, SILU);
    if (a->n == 1)
        sd__launch(c, gemv_kernel<DT, 1, PRE, SILU, VR, U>, grid, th, 0, *a, wk);
    else
        sd__launch(c, gemv_kernel<DT, 2, PRE, SILU, VR, U>, grid, th, 0, *a, wk);
}

/* 1, 2, up to 4 or up to 8 rows (PRE: one pass, n <= 8) */
template <int DT, bool PRE, bool SILU, int VR, int U>
static void launch_gemv_nr(sd__cuda *c, const mm_args *a, int H, int wk)
{
    if (a->n <= 2) {
        launch_gemv_12<DT, PRE, SILU, VR, U>(c, a, H, wk);
        return;
    }
    const unsigned th = SD__GEMV_WARPS * 32;
    const dim3 grid = gemv_grid(a, H, wk, VR, SILU);
    if (a->n <= 4)
        sd__launch(c, gemv_kernel<DT, 4, PRE, SILU, VR, U>, grid, th, 0, *a, wk);
    else
        sd__launch(c, gemv_kernel<DT, 8, PRE, SILU, VR, U>, grid, th, 0, *a, wk);
}

/* the block GEMV of a (n <= 8 when SILU) on the 16-byte path: one pass of
 * <= 8 rows prefetches (PRE) when a warp can load its whole K-slice at once,
 * GEMV_U chunks of GEMV_VR rows; for short rows (16-bit weights, 1-2 rows,
 * one chunk a warp) GEMV_WIDE_VR rows a warp; for long rows (16-bit
 * weights, not SILU, 1-2 rows) up to GEMV_LONG_U chunks of GEMV_LONG_VR
 * rows */
/* whether a GEMV takes the wide one-pass shape: 16-bit weights (dt16), 1-2
 * rows, one chunk a warp (launch_block_gemv's first; the absorb's blocks of
 * mla_prep_absorb_kernel) */
static int gemv_wide_pre(const sd__cuda *c, const mm_args *a, int dt16)
{
    const int wk = sd__gemv_wk(a->K), nch = (a->K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    return dt16 && c->gemv_pre && c->gemv_wide && a->n <= 2 && nch <= wk;
}

/* FP8 at one activation row (decode at batch 1): its rows hold half the
 * bytes of BF16 ones, so twice the rows a warp keep a BF16 GEMV's loads in
 * flight (a row's sums do not depend on it); the wide one-pass shape (16
 * rows), else the prefetching or plain one (8 rows). At more rows the
 * doubled shapes spill (their rows' scale pointers): FP8 keeps the BF16
 * shapes there. SPECD_F8_WIDE=0: the BF16 shapes at one row too. */
template <bool SILU> static int launch_f8_row(sd__cuda *c, const mm_args *a, int H, int wk)
{
    const int nch = (a->K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    if (!c->f8_wide || a->n != 1)
        return 0;
    const unsigned th = SD__GEMV_WARPS * 32;
    if (gemv_wide_pre(c, a, 1))
        sd__launch(c, gemv_kernel<SD__F8, 1, true, SILU, 2 * GEMV_WIDE_VR, GEMV_WIDE_U>,
                   gemv_grid(a, H, wk, 2 * GEMV_WIDE_VR, SILU), th, 0, *a, wk);
    else if (c->gemv_pre && nch <= wk * GEMV_U)
        sd__launch(c, gemv_kernel<SD__F8, 1, true, SILU, 2 * GEMV_VR, GEMV_U>,
                   gemv_grid(a, H, wk, 2 * GEMV_VR, SILU), th, 0, *a, wk);
    else
        sd__launch(c, gemv_kernel<SD__F8, 1, false, SILU, 2 * GEMV_VR, GEMV_U>,
                   gemv_grid(a, H, wk, 2 * GEMV_VR, SILU), th, 0, *a, wk);
    return 1;
}

template <int DT, bool SILU> static void launch_block_gemv(sd__cuda *c, const mm_args *a, int H)
{
    const int wk = sd__gemv_wk(a->K), nch = (a->K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    if (gemv_few_takes(c, a, DT == SD__BF16 || DT == SD__F16, wk)) {
        launch_gemv_few<DT, SILU>(c, a, H, wk);
        SD_LAUNCHED(c, "gemv_few_kernel");
        return;
    }
    if constexpr (DT == SD__F8) {
        if (launch_f8_row<SILU>(c, a, H, wk)) {
            SD_LAUNCHED(c, "gemv_kernel");
            return;
        }
    }
    if (gemv_wide_pre(c, a, DT != SD__F32)) {
        if constexpr (DT != SD__F32)
            launch_gemv_12<DT, true, SILU, GEMV_WIDE_VR, GEMV_WIDE_U>(c, a, H, wk);
    } else if (c->gemv_pre && a->n <= 8 && nch <= wk * GEMV_U) {
        launch_gemv_nr<DT, true, SILU, GEMV_VR, GEMV_U>(c, a, H, wk);
    } else if (c->gemv_pre && DT != SD__F32 && !SILU && a->n <= 2 && nch <= wk * GEMV_LONG_U) {
        if constexpr (DT != SD__F32 && !SILU)
            launch_gemv_12<DT, true, false, GEMV_LONG_VR, GEMV_LONG_U>(c, a, H, wk);
    } else {
        launch_gemv_nr<DT, false, SILU, GEMV_VR, GEMV_U>(c, a, H, wk);
    }
    SD_LAUNCHED(c, "gemv_kernel");
}

template <int DT> static void launch_gemv(sd__cuda *c, const mm_args *a, int H)
{
    if constexpr (DT == SD__F8) { /* sd__cuda_matmul sends only these here */
        launch_block_gemv<DT, false>(c, a, H);
        return;
    }
    if (!vec_ok(a)) {
        dim3 grid((unsigned)((a->N + SD__GEMV_WARPS - 1) / SD__GEMV_WARPS), (unsigned)H);
        sd__launch(c, gemv_scalar_kernel<DT>, grid, SD__GEMV_WARPS * 32, 0, *a);
        SD_LAUNCHED(c, "gemv_scalar_kernel");
        return;
    }
    const unsigned th = SD__GEMV_WARPS * 32;
    if (DT == SD__BF16 && a->n > SD_CUDA_GEMV_EXACT_ROWS) {
        /* chunks of 32: the largest power of two <= 8 leaving each warp one */
        int nch = (a->K + 31) / 32, wk = 1;
        while (wk * 2 <= SD__GEMV_WARPS && wk * 2 <= nch)
            wk *= 2;
        /* 8 weight rows per mma, up to 4 mmas per warp while the grid still
         * has a block for every SM */
        int per = SD__GEMV_WARPS / wk * 8, nb = 4;
        while (nb > 1 && (a->N + per * nb - 1) / (per * nb) * H < c->sm_count)
            nb /= 2;
        dim3 grid((unsigned)((a->N + per * nb - 1) / (per * nb)), (unsigned)H);
        /* one 16-row tile per pass: two tiles (MT = 2) at 17..32 rows
         * measured no faster than cuBLASLt (bench/results/NOTES.md) */
        if (nb == 4)
            sd__launch(c, gemv_mma_kernel<1, 4>, grid, th, 0, *a, wk);
        else if (nb == 2)
            sd__launch(c, gemv_mma_kernel<1, 2>, grid, th, 0, *a, wk);
        else
            sd__launch(c, gemv_mma_kernel<1, 1>, grid, th, 0, *a, wk);
        SD_LAUNCHED(c, "gemv_mma_kernel");
    } else {
        launch_block_gemv<DT, false>(c, a, H);
    }
}

template <int DT> static void launch_tiled(sd__cuda *c, const mm_args *a, int H)
{
    dim3 grid((unsigned)((a->N + TN - 1) / TN), (unsigned)((a->n + TM - 1) / TM), (unsigned)H);
    sd__launch(c, tiled_kernel<DT>, grid, 256, 0, *a);
    SD_LAUNCHED(c, "tiled_kernel");
}

static void run_simt(sd__cuda *c, const mm_args *a, int dt, int H, int gemv)
{
    switch (dt) {
    case SD_DT_F32: gemv ? launch_gemv<SD__F32>(c, a, H) : launch_tiled<SD__F32>(c, a, H); break;
    case SD_DT_BF16: gemv ? launch_gemv<SD__BF16>(c, a, H) : launch_tiled<SD__BF16>(c, a, H); break;
    case SD_DT_F16: gemv ? launch_gemv<SD__F16>(c, a, H) : launch_tiled<SD__F16>(c, a, H); break;
    case SD_DT_F8_E4M3: /* the block GEMV only (f8_gemv_takes) */
        if (gemv && H == 1 && a->scale) {
            launch_gemv<SD__F8>(c, a, H);
            break;
        }
        SD_BADARG(c, "matmul: fp8 weights take the GEMV only (%d rows, %d heads)", a->n, H);
        break;
    default: SD_BADARG(c, "matmul: weight dtype %s", sd_dtype_name((sd_dtype)dt)); break;
    }
}

/* ---- cuBLASLt ---------------------------------------------------------- */

static uint32_t align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u & (a - 1)))
        a >>= 1;
    return a;
}

static void plan_release(sd__gemm_plan *p)
{
    if (!p->used)
        return;
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void sd__cuda_matmul_release(sd__cuda *c)
{
    for (int i = 0; i < c->n_plans; i++)
        plan_release(&c->plans[i]);
    c->n_plans = 0;
}

/* The timed trial (issue 7): the heuristic's candidates on the real
 * operands, LT_TRIAL_REPS runs each, in LT_TRIAL_ROUNDS interleaved rounds
 * after LT_TRIAL_WARM untimed runs of candidate 0, the best round of each
 * counting (one round of 3 runs without warm-up picked an algorithm 19-25%
 * slower than the heuristic's first in two of four runs on an H200,
 * 4096 x 4096 at 64 rows: an idle GPU runs its first kernels at low
 * clocks). It writes D, which is the
 * call's output and is overwritten right after. Candidate 0 (the
 * heuristic's first) is kept unless another is LT_TRIAL_MARGIN faster:
 * timings of near-equal algorithms flip between runs, and every algorithm
 * sums in its own order, so a flip would change results from run to run
 * for nothing. Under stream capture nothing can be timed (and no host sync
 * is allowed): candidate 0. Returns the index to use. */
#define LT_TRIAL_ALGOS 8
#define LT_TRIAL_REPS 3
#define LT_TRIAL_ROUNDS 2
#define LT_TRIAL_WARM 5
#define LT_TRIAL_MARGIN 0.97f

static int time_algos(sd__cuda *c, sd__gemm_plan *p, const cublasLtMatmulHeuristicResult_t *res,
                      int got, const void *A, const void *B, const void *D)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (got < 2 || SD_CUDA(c, cudaStreamIsCapturing(c->stream, &cs)) ||
        cs != cudaStreamCaptureStatusNone)
        return 0;
    cudaEvent_t ev[2] = {NULL, NULL};
    if (SD_CUDA(c, cudaEventCreate(&ev[0])) || SD_CUDA(c, cudaEventCreate(&ev[1]))) {
        if (ev[0])
            cudaEventDestroy(ev[0]);
        return 0;
    }
    const float alpha = 1.0f, beta = 0.0f;
    float ms[LT_TRIAL_ALGOS];
    int n = got < LT_TRIAL_ALGOS ? got : LT_TRIAL_ALGOS, pick = 0;
    for (int i = 0; i < n; i++)
        ms[i] = INFINITY;
    for (int r = 0; r < LT_TRIAL_WARM; r++)
        cublasLtMatmul(c->lt, p->op, &alpha, A, p->a, B, p->b, &beta, (void *)D, p->d, (void *)D,
                       p->d, &res[0].algo, c->lt_ws, c->lt_ws_bytes, c->stream);
    for (int round = 0; round < LT_TRIAL_ROUNDS && !c->err; round++) {
        for (int i = 0; i < n && !c->err; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS)
                continue;
            /* a candidate that refuses to run is skipped, not an error */
            if (SD_CUDA(c, cudaEventRecord(ev[0], c->stream)))
                break;
            int ran = 1;
            for (int k = 0; k < LT_TRIAL_REPS && ran; k++)
                ran = cublasLtMatmul(c->lt, p->op, &alpha, A, p->a, B, p->b, &beta, (void *)D,
                                     p->d, (void *)D, p->d, &res[i].algo, c->lt_ws,
                                     c->lt_ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
            float t = INFINITY;
            if (SD_CUDA(c, cudaEventRecord(ev[1], c->stream)) ||
                SD_CUDA(c, cudaEventSynchronize(ev[1])) ||
                SD_CUDA(c, cudaEventElapsedTime(&t, ev[0], ev[1])))
                break;
            if (ran && t < ms[i])
                ms[i] = t;
        }
    }
    for (int i = 1; i < n; i++)
        if (ms[i] < ms[pick] && (pick > 0 || ms[i] < LT_TRIAL_MARGIN * ms[0]))
            pick = i;
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (c->err)
        return 0;
    c->gemm_trials++;
    p->timed = 1;
    if (sd_log_level() >= SD_LOG_DEBUG)
        sd_log_debug("cuda: gemm %s N=%lld K=%lld n=%d: algorithm %d of %d (%.1f us, first %.1f us)",
                     sd_dtype_name((sd_dtype)p->s.dt), (long long)p->s.N, (long long)p->s.K, p->n, pick,
                     got, 1000.0 * (double)ms[pick] / LT_TRIAL_REPS,
                     1000.0 * (double)ms[0] / LT_TRIAL_REPS);
    return pick;
}

/* the power-of-two bucket of n rows above SD_CUDA_GEMM_POW2_ROWS (0: at or
 * below it) */
static int row_bucket(int n)
{
    int b = SD_CUDA_GEMM_POW2_ROWS;
    if (n <= b)
        return 0;
    while (b < n && b < (1 << 30))
        b <<= 1;
    return b;
}

/* q's trial may serve p's row count: p above SD_CUDA_GEMM_EXACT_ROWS rows
 * and q with more rows, at most twice p's (the padded steps' row counts,
 * whose graphs are captured at start in increasing order, each run their
 * own trial there, and a prompt step's rows between two of them take the
 * larger's choice), or both in one power-of-two bucket above
 * SD_CUDA_GEMM_POW2_ROWS (long prompts in any order) */
static int may_share(int qn, const sd__gemm_plan *p)
{
    if (p->n <= SD_CUDA_GEMM_EXACT_ROWS)
        return 0;
    const int bucket = row_bucket(p->n);
    return (qn > p->n && qn <= 2 * p->n) || (bucket && row_bucket(qn) == bucket);
}

static int shape_eq(const sd__gemm_shape *a, const sd__gemm_shape *b)
{
    return a->dt == b->dt && a->N == b->N && a->K == b->K && a->al_a == b->al_a && a->al_b == b->al_b &&
           a->al_d == b->al_d;
}

/* a kept choice of p's shape */
static int same_shape(const sd__gemm_choice *q, const sd__gemm_plan *p) { return shape_eq(&q->s, &p->s); }

/* whether cuBLASLt runs algo on p's layouts */
static int algo_fits(sd__cuda *c, const sd__gemm_plan *p, const cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulHeuristicResult_t chk;
    memset(&chk, 0, sizeof chk);
    return cublasLtMatmulAlgoCheck(c->lt, p->op, p->a, p->b, p->d, p->d, algo, &chk) ==
               CUBLAS_STATUS_SUCCESS &&
           chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= c->lt_ws_bytes;
}

/* keeps p's timed choice (sd__gemm_choice: it outlives the plan) */
static void keep_choice(sd__cuda *c, const sd__gemm_plan *p)
{
    sd__gemm_choice *q;
    if (c->n_choices < SD__GEMM_CHOICES) {
        q = &c->choices[c->n_choices++];
    } else {
        q = &c->choices[c->next_choice];
        c->next_choice = (c->next_choice + 1) % SD__GEMM_CHOICES;
    }
    q->s = p->s;
    q->n = p->n;
    q->algo = p->algo;
}

/* p's own row count's kept choice, from a plan replaced since: 1 when p
 * took it (no trial again) */
static int kept_choice(sd__cuda *c, sd__gemm_plan *p)
{
    for (int i = 0; i < c->n_choices; i++) {
        const sd__gemm_choice *q = &c->choices[i];
        if (q->n == p->n && same_shape(q, p) && algo_fits(c, p, &q->algo)) {
            p->algo = q->algo;
            return 1;
        }
    }
    return 0;
}

/* A timed trial's choice for another row count of p's shape, where
 * may_share allows it and cuBLASLt accepts it for p's layouts (the nearest
 * such row count's): a prompt step of a new length (its rows: the step's
 * prompt tokens) ran the trial of every GEMM shape again, its first launch
 * 7-87 ms on the bundled model on an H200 where the same rows took 0.5 ms
 * the second time, and ~4 ms more for prompts of ~80 tokens (NOTES.md,
 * sessions 30 and 31). 1 when p took it. */
static int share_choice(sd__cuda *c, sd__gemm_plan *p)
{
    const sd__gemm_choice *best = NULL;
    for (int i = 0; i < c->n_choices; i++) {
        const sd__gemm_choice *q = &c->choices[i];
        if (!same_shape(q, p) || !may_share(q->n, p) ||
            (best && abs(best->n - p->n) <= abs(q->n - p->n)) || !algo_fits(c, p, &q->algo))
            continue;
        best = q;
    }
    if (!best)
        return 0;
    p->algo = best->algo;
    return 1;
}

/* cuBLASLt's candidates for p (its workspace and alignments), into res:
 * 1 when it answered. Asked only where no kept or shared choice serves p
 * (the preference was made for every new plan, most of which share). */
static int heuristic(sd__cuda *c, const sd__gemm_plan *p, cublasLtMatmulHeuristicResult_t *res,
                     int *got)
{
    cublasLtMatmulPreference_t pref = NULL;
    int ok = !SD_CUBLAS(c, cublasLtMatmulPreferenceCreate(&pref)) &&
             !SD_CUBLAS(c, cublasLtMatmulPreferenceSetAttribute(
                               pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->lt_ws_bytes,
                               sizeof c->lt_ws_bytes)) &&
             !SD_CUBLAS(c, cublasLtMatmulPreferenceSetAttribute(
                               pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->s.al_a,
                               sizeof p->s.al_a)) &&
             !SD_CUBLAS(c, cublasLtMatmulPreferenceSetAttribute(
                               pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->s.al_b,
                               sizeof p->s.al_b)) &&
             !SD_CUBLAS(c, cublasLtMatmulPreferenceSetAttribute(
                               pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->s.al_d,
                               sizeof p->s.al_d)) &&
             !SD_CUBLAS(c, cublasLtMatmulPreferenceSetAttribute(
                               pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->s.al_d,
                               sizeof p->s.al_d)) &&
             cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->a, p->b, p->d, p->d, pref,
                                            LT_TRIAL_ALGOS, res, got) == CUBLAS_STATUS_SUCCESS;
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return ok;
}

/* The plan of y(n, N) = x(n, K) @ W^T, made on first use: column-major,
 * D (N x n, ld N) = op_T(A: K x N, ld K) * B (K x n, ld ldb). Outside
 * capture the first use times the candidate algorithms on the operands A, B
 * (which must hold the real inputs) into D; under capture it is host-side
 * only (no device memory, no synchronization). */
static sd__gemm_plan *get_plan(sd__cuda *c, int dt, int64_t N, int64_t K, int n, int ldb,
                               const void *A, const void *B, const void *D)
{
    const sd__gemm_shape s = {dt, N, K, align_of(A), align_of(B), align_of(D)};
    for (int i = 0; i < c->n_plans; i++) {
        sd__gemm_plan *p = &c->plans[i];
        if (p->n == n && p->ldb == ldb && shape_eq(&p->s, &s))
            return p;
    }
    sd__gemm_plan *p;
    if (c->n_plans < SD__GEMM_PLANS) {
        p = &c->plans[c->n_plans++];
    } else {
        p = &c->plans[c->next_evict];
        c->next_evict = (c->next_evict + 1) % SD__GEMM_PLANS;
        plan_release(p);
    }
    memset(p, 0, sizeof *p);
    p->used = 1;
    p->s = s;
    p->n = n;
    p->ldb = ldb;
    cudaDataType_t ab = dt == SD_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t res[LT_TRIAL_ALGOS];
    int got = 0;
    if (SD_CUBLAS(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        SD_CUBLAS(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                    sizeof ta)) ||
        SD_CUBLAS(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                    sizeof tb)) ||
        SD_CUBLAS(c, cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)K, (uint64_t)N, K)) ||
        SD_CUBLAS(c, cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)K, (uint64_t)n, ldb)) ||
        SD_CUBLAS(c, cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)N, (uint64_t)n, N)))
        return c->err ? NULL : p;
    /* no algorithm for this shape is not a failure: the tiled kernel runs */
    if (kept_choice(c, p)) {
        p->ok = p->timed = 1;
    } else if (share_choice(c, p)) {
        p->ok = 1;
    } else if (heuristic(c, p, res, &got) && got > 0 && res[0].state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res[time_algos(c, p, res, got, A, B, D)].algo;
        p->ok = 1;
        if (p->timed)
            keep_choice(c, p);
    }
    return c->err ? NULL : p;
}

/* y = W xb (accumulate: y += W xb) */
static int lt_matmul(sd__cuda *c, sd__gemm_plan *p, float *y, const void *W, const void *xb,
                     int accumulate)
{
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return SD_CUBLAS(c, cublasLtMatmul(c->lt, p->op, &alpha, W, p->a, xb, p->b, &beta, y, p->d, y,
                                       p->d, &p->algo, c->lt_ws, c->lt_ws_bytes, c->stream));
}

/* cuBLASLt for n rows; 0 when done, 1 when the caller should run the tiled kernel */
static int try_lt(sd__cuda *c, const mm_args *a, int dt)
{
    int64_t N = a->N, K = a->K;
    if (dt == SD_DT_F32) {
        sd__gemm_plan *p = get_plan(c, dt, N, K, a->n, a->x_stride, a->w, a->x, a->y);
        if (!p)
            return 0;
        if (!p->ok)
            return 1;
        lt_matmul(c, p, a->y, a->w, a->x, 0);
    } else if (dt == SD_DT_BF16) {
        /* split: x = hi + lo in two bf16 terms, two GEMMs into one fp32 sum */
        size_t terms = c->bf16_split ? 2 : 1;
        size_t avail = c->scratch_bytes - 256; /* lo starts 256-byte aligned like hi */
        if (K % 8 != 0 || (size_t)K * 2 * terms > avail)
            return 1;
        int per = (int)(avail / ((size_t)K * 2 * terms));
        if (per > a->n)
            per = a->n;
        __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
        __nv_bfloat16 *xl =
            terms == 2 ? xb + (((size_t)per * (size_t)K + 127) & ~(size_t)127) : NULL;
        for (int r0 = 0; r0 < a->n && !c->err; r0 += per) {
            int m = a->n - r0 < per ? a->n - r0 : per;
            float *y = a->y + (size_t)r0 * (size_t)N;
            /* converted first: a new plan times its algorithms on xb */
            sd__launch(c, to_bf16_kernel, grid_for((size_t)m * (size_t)K), 256, 0, 
                xb, xl, a->x + (size_t)r0 * (size_t)a->x_stride, m, (int)K, a->x_stride);
            if (SD_LAUNCHED(c, "to_bf16_kernel"))
                return 0;
            sd__gemm_plan *p = get_plan(c, dt, N, K, m, (int)K, a->w, xb, y);
            if (!p)
                return 0;
            if (!p->ok) {
                if (r0 == 0)
                    return 1;
                mm_args rest = *a;
                rest.y = y;
                rest.x = a->x + (size_t)r0 * (size_t)a->x_stride;
                rest.n = a->n - r0;
                rest.bias = NULL;
                run_simt(c, &rest, dt, 1, 0);
                break;
            }
            if (!lt_matmul(c, p, y, a->w, xb, 0) && xl)
                lt_matmul(c, p, y, a->w, xl, 1);
        }
    } else {
        return 1;
    }
    if (a->bias && !c->err) {
        sd__launch(c, bias_kernel, grid_for((size_t)a->n * (size_t)N), 256, 0, 
            a->y, a->bias, a->bias_dt, a->n, (int)N);
        SD_LAUNCHED(c, "bias_kernel");
    }
    return 0;
}

static int gemv_max_rows(const sd__cuda *c)
{
    return c->gemv_max_rows > 0 ? c->gemv_max_rows : SD_CUDA_GEMV_MAX_ROWS;
}

/* up to the exact GEMV's rows (above them BF16 goes to tensor cores), the
 * activations' 16-byte loads, 8-byte weight rows */
static int f8_gemv_takes(const sd__cuda *c, const mm_args *a)
{
    return a->n <= SD_CUDA_GEMV_EXACT_ROWS && a->n <= gemv_max_rows(c) && a->K % 8 == 0 &&
           sd__aligned16(a->w) && sd__aligned16(a->x) && a->x_stride % 4 == 0 && a->x_off % 4 == 0;
}

/* ---- block-scaled FP8 weights ------------------------------------------
 *
 * Up to the GEMV's rows (decode, verification) the block GEMV reads the FP8
 * bytes themselves (gemv.cuh: each lane's 8 exact E4M3 x activation
 * products summed, then times the block's scale: ops.h). Other calls
 * (prefill) dequantize the weight into the context's scratch (sized at
 * load to the largest FP8 weight; each element BF16(E4M3 x scale)) and run
 * the BF16 paths on it: the same numbers as a BF16 weight, plus a pass
 * over the weight. */

/* a's weight fields for FP8 weight w */
static void f8_args(mm_args *a, const sd_weight *w)
{
    a->scale = w->scale;
    a->bm = w->block[0];
    a->bshift = __builtin_ctz((unsigned)w->block[1]);
    a->scols = w->scale_cols;
}

/* out(rows, cols) bf16 = BF16(E4M3(q) x scale of its block), 8 elements a
 * thread where cols % 8 == 0 (q 8-byte aligned), else one */
template <bool VEC>
__global__ void fp8_dequant_kernel(uint16_t *out, const uint8_t *q, const float *scale, int64_t rows,
                                   int64_t cols, int bm, int bshift, int64_t scols)
{
    SD_PDL_ENTER(out, q, scale, rows, cols, bm, bshift, scols);
    const int64_t per = VEC ? 8 : 1, m = rows * cols / per;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride) {
        const int64_t i = e * per, r = i / cols, k = i % cols;
        const float s = scale[(r / bm) * scols + (k >> bshift)];
        if (VEC) {
            float f[8];
            sd__f8x8f(*(const uint2 *)(q + i), s, f);
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                o[j] = (__float_as_uint(f[2 * j]) >> 16) | (__float_as_uint(f[2 * j + 1]) & 0xffff0000u);
            *(uint4 *)(out + i) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            float lo, hi;
            sd__f8x2f((uint16_t)q[i], s, lo, hi);
            out[i] = (uint16_t)(__float_as_uint(lo) >> 16);
        }
    }
}

/* FP8 weight w as a BF16 weight in the context's scratch (its
 * dequantization, queued on the stream): 0, or an error set */
static int f8_to_bf16(sd__cuda *c, const sd_weight *w, sd_weight *out)
{
    const size_t m = (size_t)w->rows * (size_t)w->cols;
    if (!c->fp8_scratch || m * 2 > c->fp8_scratch_bytes) {
        SD_BADARG(c, "matmul: fp8 weight %lld x %lld past the dequantization scratch (%zu bytes)",
                  (long long)w->rows, (long long)w->cols, c->fp8_scratch_bytes);
        return -1;
    }
    const bool vec = w->cols % 8 == 0 && sd__aligned16(w->data);
    const unsigned g = grid_for(vec ? m / 8 : m);
    const int bshift = __builtin_ctz((unsigned)w->block[1]);
    sd__launch(c, vec ? fp8_dequant_kernel<true> : fp8_dequant_kernel<false>, g, 256, 0,
               (uint16_t *)c->fp8_scratch, (const uint8_t *)w->data, w->scale, (int64_t)w->rows,
               (int64_t)w->cols, w->block[0], bshift, (int64_t)w->scale_cols);
    if (SD_LAUNCHED(c, "fp8_dequant_kernel"))
        return -1;
    *out = (sd_weight){c->fp8_scratch, SD_DT_BF16, w->rows, w->cols, NULL, {0, 0}, 0, NULL};
    return 0;
}

int sd__cuda_gemv_wide1(const sd__cuda *c, mm_args *a, float *y, const float *x,
                        const sd_weight *w, int x_stride, int *wk, int *gx)
{
    /* one row goes to launch_block_gemv (never to the few-row kernel), which
     * takes the wide shape where gemv_wide_pre says so */
    *a = mm_args{y, x, w->data, NULL, 0, 1, (int)w->rows, (int)w->cols, x_stride, 0, 0,
                 (int)w->rows, 0};
    if (w->dtype != SD_DT_BF16 || w->rows <= 0 || !vec_ok(a) || !gemv_wide_pre(c, a, 1))
        return 0;
    *wk = sd__gemv_wk(a->K);
    *gx = (int)gemv_grid(a, 1, *wk, GEMV_WIDE_VR, false).x;
    return 1;
}

void sd__cuda_matmul(sd_backend *be, float *y, const float *x, const sd_weight *w,
                     const sd_weight *bias, int n, int x_stride)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || w->rows <= 0)
        return;
    mm_args a = {y, x, w->data, bias ? bias->data : NULL, bias ? (int)bias->dtype : 0,
                 n, (int)w->rows, (int)w->cols, x_stride, 0, 0, (int)w->rows, 0};
    if (w->dtype == SD_DT_F8_E4M3) {
        f8_args(&a, w);
        if (f8_gemv_takes(c, &a)) {
            run_simt(c, &a, w->dtype, 1, 1);
            return;
        }
        sd_weight b;
        if (!f8_to_bf16(c, w, &b))
            sd__cuda_matmul(be, y, x, &b, bias, n, x_stride);
        return;
    }
    if (n <= gemv_max_rows(c)) {
        run_simt(c, &a, w->dtype, 1, 1);
        return;
    }
    if (try_lt(c, &a, w->dtype))
        run_simt(c, &a, w->dtype, 1, 0);
}

void sd__cuda_matmul_heads(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                           int H, int x_stride, int x_head_stride, int x_off)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || H <= 0 || (c->ablate & SD__AB_ABSORB))
        return;
    if (w->rows % H) {
        SD_BADARG(c, "matmul_heads: %lld weight rows for %d heads", (long long)w->rows, H);
        return;
    }
    if (w->dtype == SD_DT_F8_E4M3) {
        SD_BADARG(c, "matmul_heads: fp8 weights are not taken (the model keeps them bf16)");
        return;
    }
    int N = (int)(w->rows / H);
    mm_args a = {y, x, w->data, NULL, 0, n, N, (int)w->cols, x_stride, x_head_stride, x_off,
                 H * N, N};
    run_simt(c, &a, w->dtype, H, n <= gemv_max_rows(c));
}

/* ---- mla_prep beside the query's absorb (SPECD_MLA_OVERLAP=1) ------------
 *
 * MLA's query absorb (matmul_heads of the query's nope part through W_UK)
 * and mla_prep (the latent's norm, the ropes, the cache store) read the
 * same projection's output and touch disjoint memory, yet ran one after
 * the other: two chains of round trips at batch 1 (prep 2.7 us, the
 * absorb 1.4 in V2-Lite's layer, bench/results/NOTES.md). Here one launch
 * runs them side by side: blocks 0 .. T - 1 prep a token each, the others
 * are the absorb's one-pass GEMV blocks (weights loaded before the PDL
 * wait, as the GEMV's), so the absorb's chain runs under prep's. The same
 * device functions as the two kernels: the same bits. Where the absorb
 * would not take the wide one-pass shape (more than 2 tokens, fp32
 * weights, long rows), or the switch is off, the two ops run. */
template <bool VEC, int DT, int NR>
__global__ void __launch_bounds__(SD__GEMV_WARPS * 32, GEMV_MINB(DT, NR, GEMV_WIDE_VR, GEMV_WIDE_U))
    mla_prep_absorb_kernel(const __grid_constant__ sd__mla_prep_args p, int T,
                           const __grid_constant__ mm_args a, int WK, int gx)
{
    static_assert(MLA_PREP_THREADS == SD__GEMV_WARPS * 32, "one block shape for both");
    if ((int)blockIdx.x < T) {
        sd__mla_prep_token<VEC>(p, blockIdx.x);
        return;
    }
    const int q = blockIdx.x - T;
    gemv_block<DT, NR, true, false, GEMV_WIDE_VR, GEMV_WIDE_U>(a, WK, q % gx, q / gx);
}

template <bool VEC, int DT>
static void launch_prep_absorb(sd__cuda *c, const sd__mla_prep_args &p, int T, const mm_args *a,
                               int H, int wk)
{
    const dim3 g = gemv_grid(a, H, wk, GEMV_WIDE_VR, false);
    const unsigned blocks = (unsigned)T + g.x * g.y;
    if (T == 1)
        sd__launch(c, mla_prep_absorb_kernel<VEC, DT, 1>, blocks, SD__GEMV_WARPS * 32, 0, p, T, *a,
                   wk, (int)g.x);
    else
        sd__launch(c, mla_prep_absorb_kernel<VEC, DT, 2>, blocks, SD__GEMV_WARPS * 32, 0, p, T, *a,
                   wk, (int)g.x);
}

void sd__cuda_mla_prep_absorb(sd_backend *be, float *ckv, int ck_stride, float *q_pe,
                              int qpe_stride, int qpe_head_stride, const sd_weight *w, float eps,
                              void *cache, const sd_attn_batch *b, const sd_rope *r, int H, int C,
                              int R, float *y, const float *x, const sd_weight *wuk, int x_stride,
                              int x_head_stride)
{
    sd__cuda *c = sd__cuda_op(be);
    const int T = b->n_tokens;
    if (!c || T <= 0)
        return;
    const int N = H > 0 && wuk->rows % H == 0 ? (int)(wuk->rows / H) : 0;
    mm_args a = {y, x, wuk->data, NULL, 0, T, N, (int)wuk->cols, x_stride, x_head_stride, 0,
                 H * N, N};
    sd__mla_prep_args p;
    int vec = 0;
    /* where matmul_heads would run the wide one-pass GEMV */
    const int takes = c->mla_overlap && N > 0 && T <= gemv_max_rows(c) &&
                      !(c->ablate & (SD__AB_PREP | SD__AB_ABSORB)) && vec_ok(&a) &&
                      gemv_wide_pre(c, &a, wuk->dtype == SD_DT_BF16 || wuk->dtype == SD_DT_F16);
    if (!takes || sd__cuda_mla_prep_args(c, ckv, ck_stride, q_pe, qpe_stride, qpe_head_stride, w,
                                         eps, cache, b, r, H, C, R, &p, &vec)) {
        sd__cuda_mla_prep(be, ckv, ck_stride, q_pe, qpe_stride, qpe_head_stride, w, eps, cache, b,
                          r, H, C, R);
        sd__cuda_matmul_heads(be, y, x, wuk, T, H, x_stride, x_head_stride, 0);
        return;
    }
    const int wk = sd__gemv_wk(a.K);
    if (wuk->dtype == SD_DT_BF16)
        vec ? launch_prep_absorb<true, SD__BF16>(c, p, T, &a, H, wk)
            : launch_prep_absorb<false, SD__BF16>(c, p, T, &a, H, wk);
    else
        vec ? launch_prep_absorb<true, SD__F16>(c, p, T, &a, H, wk)
            : launch_prep_absorb<false, SD__F16>(c, p, T, &a, H, wk);
    SD_LAUNCHED(c, "mla_prep_absorb_kernel");
}

/* matmul then silu_mul (the ops contract): one GEMV that writes the SiLU
 * product where the GEMV takes the call (up to SD_CUDA_GEMV_EXACT_ROWS rows,
 * 16-byte loads), else the two ops. Either way the same bits. */
void sd__cuda_matmul_silu(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                          int x_stride)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || w->rows <= 0)
        return;
    if (w->rows % 2) {
        SD_BADARG(c, "matmul_silu: %lld weight rows are not a gate and an up half",
                  (long long)w->rows);
        return;
    }
    mm_args a = {gu, x, w->data, NULL, 0, n, (int)w->rows, (int)w->cols, x_stride, 0, 0,
                 (int)w->rows / 2, 0};
    if (w->dtype == SD_DT_F8_E4M3)
        f8_args(&a, w);
    if (c->matmul_silu && n <= SD_CUDA_GEMV_EXACT_ROWS && n <= gemv_max_rows(c) &&
        (w->dtype == SD_DT_F8_E4M3 ? f8_gemv_takes(c, &a) : vec_ok(&a))) {
        switch (w->dtype) {
        case SD_DT_F8_E4M3: launch_block_gemv<SD__F8, true>(c, &a, 1); return;
        case SD_DT_F32: launch_block_gemv<SD__F32, true>(c, &a, 1); return;
        case SD_DT_BF16: launch_block_gemv<SD__BF16, true>(c, &a, 1); return;
        case SD_DT_F16: launch_block_gemv<SD__F16, true>(c, &a, 1); return;
        default: break;
        }
    }
    sd__cuda_matmul(be, gu, x, w, NULL, n, x_stride);
    sd__cuda_silu_mul(be, gu, gu, n, (int)(w->rows / 2));
}

SD_KTRACE_EXPORT(matmul)

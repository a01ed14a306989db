/* kernels/cuda: the block GEMV (a block of gemv_kernel, matmul.cu) as a
 * device function with its arguments and grid, for the launches that run
 * its blocks beside other work: mla_prep_absorb_kernel (matmul.cu) and the
 * router's GEMV beside the always-on experts (moe.cu). */
#ifndef SD_KERNELS_CUDA_GEMV_BLOCK_CUH
#define SD_KERNELS_CUDA_GEMV_BLOCK_CUH

#include <math.h>

#include "kernels/cuda/gemv.cuh"

/* One (x, w, y) problem, batched over blockIdx.y (matmul: 1 batch). */
typedef struct mm_args {
    float *y;
    const float *x;
    const void *w;
    const void *bias; /* (N) or NULL */
    int bias_dt;
    int n, N, K;
    int x_stride, x_bstride, x_off;
    int y_stride, y_bstride;
    /* F8_E4M3 weights (sd_weight's block scales; H = 1): row j's scales at
     * scale + (j / bm) * scols, column k's at k >> bshift */
    const float *scale = nullptr;
    int bm = 0, bshift = 0;
    long long scols = 0;
} mm_args;

/* ---- GEMV (kernels/cuda/gemv.cuh has the core and its order of sums) ---- */

#define GEMV_VR 4 /* weight rows per warp */
#define GEMV_U 2  /* chunks per warp loaded before use */
/* rows longer than a GEMV_U-chunk K-slice (down projections: 14336 wide)
 * prefetch with fewer rows a warp and all their chunks at once */
#define GEMV_LONG_VR 2
#define GEMV_LONG_U 8
/* 1-2 rows of short rows (K up to one chunk a warp of the K-split: the
 * DeepSeek-V2-Lite-shaped model's 2048): 8 weight rows a warp, so a lane
 * has 8 loads in flight as at K = 4096 with GEMV_VR x GEMV_U, not 4 (the
 * gemv lab measured V2-Lite's K = 2048 GEMVs at 0.40-0.58 of copy) */
#define GEMV_WIDE_VR 8
#define GEMV_WIDE_U 1

/* blocks an SM of a gemv_kernel shape */
#define GEMV_MINB(DT, NR, VR, U)                                            \
    /* 8 rows a warp: 3 blocks an SM for 1 BF16 row, else 2 (no spills) */ \
    ((VR) == 8 ? ((NR) == 1 && (DT) == SD__BF16 ? 3 : 2)                   \
     : (NR) == 1 && (DT) != SD__F32 && (VR) * (U) <= 8 ? 3                 \
                                                        : 2)

/* A block's sums out: the WK warp partials of each of its RG row groups'
 * VR weight rows x NP activation rows (part: warp-major, V = VR NP a warp)
 * added in warp order, then the bias, or (SILU: VR / 2 gate and VR / 2 up
 * rows a group) silu(gate) * up; rows r < nr of the pass at r0, weight rows
 * of row block blk */
template <bool SILU, int VR, int NP>
__device__ __forceinline__ void gemv_store(const mm_args &a, const float *part, int WK, int RG,
                                           int blk, int r0, int nr, float *yb)
{
    constexpr int V = VR * NP, HV = VR / 2;
    if (SILU) {
        if ((int)threadIdx.x < RG * HV * NP) {
            const int g = threadIdx.x / (HV * NP), i = threadIdx.x % (HV * NP) / NP;
            const int r = threadIdx.x % NP, o = (blk * RG + g) * HV + i, I = a.N / 2;
            if (r < nr && o < I) {
                const int vg = i * NP + r, vu = (i + HV) * NP + r;
                float sg = part[(g * WK) * V + vg], su = part[(g * WK) * V + vu];
                for (int q = 1; q < WK; q++) {
                    sg += part[(g * WK + q) * V + vg];
                    su += part[(g * WK + q) * V + vu];
                }
                yb[(size_t)(r0 + r) * (size_t)I + (size_t)o] = sg / (1.0f + expf(-sg)) * su;
            }
        }
    } else if ((int)threadIdx.x < RG * V) {
        const int g = threadIdx.x / V, v = threadIdx.x % V, i = v / NP, r = v % NP;
        const int j = blk * RG * VR + g * VR + i;
        if (r < nr && j < a.N) {
            float s = part[(g * WK) * V + v];
            for (int q = 1; q < WK; q++)
                s += part[(g * WK + q) * V + v];
            if (a.bias)
                s += sd__wload(a.bias, a.bias_dt, (size_t)j);
            yb[(size_t)(r0 + r) * (size_t)a.y_stride + (size_t)j] = s;
        }
    }
}

/* y(n, N) in passes of NR activation rows. A block is SD__GEMV_WARPS warps:
 * WK K-slices x (SD__GEMV_WARPS / WK) row groups of VR weight rows; a warp
 * loads U chunks of each row before it uses them (GEMV_VR x GEMV_U, or
 * GEMV_LONG_VR x up to GEMV_LONG_U for the long rows of a prefetching
 * launch). A row's sums depend on K and WK only, whatever VR and U. */
/* SILU (matmul_silu): w is [gate; up] stacked, N = 2I rows; a row group
 * takes gate rows o .. o + VR/2 - 1 and the up rows I + o .. (o = VR/2 x
 * the group's index) and writes y(n, I) = silu(gate) * up (silu_mul_kernel's
 * formula on the same sums: the bits of the two ops). gemv_block is block
 * (bx, h) of it: gemv_kernel's (matmul.cu), or a block of
 * mla_prep_absorb_kernel or of moe_route_always_kernel's router. */
template <int DT, int NR, bool PRE, bool SILU, int VR, int U>
__device__ __forceinline__ void gemv_block(const mm_args &a, int WK, int bx, int h)
{
    constexpr int V = VR * NR;
    static_assert(!SILU || VR % 2 == 0, "a SiLU row group is VR/2 gate and VR/2 up rows");
    constexpr int HV = VR / 2; /* SILU: gate (and up) rows of a row group */
    __shared__ float part[SD__GEMV_WARPS * V];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int RG = SD__GEMV_WARPS / WK, kw = warp % WK, rg = warp / WK;
    const int rows0 = bx * RG * VR; /* first weight row of the block */
    const int I = a.N / 2, o0 = (bx * RG + rg) * HV; /* SILU */
    constexpr size_t esz = sd__esz<DT>();
    const char *wb = (const char *)a.w + (size_t)h * (size_t)a.N * (size_t)a.K * esz;
    const void *wrow[VR];
    const float *srow[VR]; /* F8: each row's scales */
#pragma unroll
    for (int i = 0; i < VR; i++) {
        int j = rows0 + rg * VR + i;
        bool in = j < a.N;
        if (SILU) {
            j = (i < HV ? 0 : I) + o0 + i % HV;
            in = o0 + i % HV < I;
        }
        wrow[i] = in ? (const void *)(wb + (size_t)j * (size_t)a.K * esz) : NULL;
        srow[i] = DT == SD__F8 && in ? a.scale + (size_t)(j / a.bm) * (size_t)a.scols : NULL;
    }
    /* PRE (one pass, and one iteration covers a warp's K-slice: K up to
     * 4096): all of a warp's weight loads go out before the wait for the
     * kernels before (weights are no kernel's output). Under programmatic
     * launch the blocks resident while those finish stream their weights
     * meanwhile, so the small kernels between two GEMVs hide behind the
     * next one's loads. (Prefetching only the first of several iterations
     * held twice the load registers and spilled.) */
    sd__w8raw<DT> pre[U][VR];
    if (PRE)
        sd__warp_load<DT, VR, U>(pre, wrow, a.K, kw, WK, lane, srow, a.bshift);
    SD_PDL_ENTER(a, WK);
    const float *xb = a.x + (size_t)h * (size_t)a.x_bstride + (size_t)a.x_off;
    float *yb = a.y + (size_t)h * (size_t)a.y_bstride;
    for (int r0 = 0; r0 < (PRE ? 1 : a.n); r0 += NR) { /* PRE: n <= NR, one pass */
        const int nr = a.n - r0 < NR ? a.n - r0 : NR;
        const float *xr[NR];
#pragma unroll
        for (int r = 0; r < NR; r++)
            xr[r] = xb + (size_t)(r0 + (r < nr ? r : 0)) * (size_t)a.x_stride;
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++)
            acc[v] = 0.0f;
        if (PRE)
            sd__warp_use<DT, VR, NR, U>(pre, xr, nr, a.K, kw, WK, lane, acc);
        else
            sd__warp_dots<DT, VR, NR, U>(wrow, xr, nr, a.K, kw, WK, lane, acc, srow, a.bshift);
        sd__xreduce<V>(acc, lane);
        if (lane % (32 / V) == 0)
            part[warp * V + sd__xr_index<V>(lane)] = acc[0];
        __syncthreads();
        gemv_store<SILU, VR, NR>(a, part, WK, RG, bx, r0, nr, yb);
        __syncthreads(); /* part is rewritten by the next pass */
    }
}

static inline int vec_ok(const mm_args *a)
{
    return a->K % 8 == 0 && sd__aligned16(a->w) && sd__aligned16(a->x) && a->x_stride % 4 == 0 &&
           a->x_bstride % 4 == 0 && a->x_off % 4 == 0;
}

/* a block GEMV's grid: blocks of SD__GEMV_WARPS / wk row groups of VR rows */
static inline dim3 gemv_grid(const mm_args *a, int H, int wk, int VR, bool silu)
{
    const int rows = SD__GEMV_WARPS / wk * VR;
    /* SILU: a block's rows give half as many outputs (gate and up rows) */
    const int outs = silu ? a->N / 2 : a->N, per = silu ? rows / 2 : rows;
    return dim3((unsigned)((outs + per - 1) / per), (unsigned)H);
}

/* whether sd__cuda_matmul(y, x, w, NULL, 1, x_stride) runs the wide
 * one-pass BF16 shape, gemv_block<SD__BF16, 1, true, false, GEMV_WIDE_VR,
 * GEMV_WIDE_U> (matmul.cu): then *a holds its arguments, *wk its K-split and
 * *gx its blocks */
int sd__cuda_gemv_wide1(const sd__cuda *c, mm_args *a, float *y, const float *x,
                        const sd_weight *w, int x_stride, int *wk, int *gx);

#endif

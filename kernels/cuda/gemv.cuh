/* kernels/cuda: the memory-bound dot-product core shared by the GEMV
 * (matmul.cu, few activation rows) and the fused small-batch MoE experts
 * (moe.cu).
 *
 * Decode reads every weight byte once and does 1..8 multiply-adds per
 * weight, so these kernels live or die by the bytes they keep in flight:
 * - a warp works on VR weight rows at once; each lane loads 16 bytes (8
 *   weights) of every row per 256-element chunk, and U chunks are loaded
 *   before any is used: VR * U independent 16-byte loads per lane in flight;
 * - weights stream past L1 (ld.global.nc.L1::no_allocate) so the fp32
 *   activations, re-read for every weight row, stay in L1;
 * - each activation chunk is loaded once into registers and used for all VR
 *   rows (activation bytes per weight byte: 2 * NR / VR);
 * - the warps of a block split K (WK of them, chunk c goes to warp c % WK),
 *   so small-N shapes still fill the SMs; their partial sums meet in shared
 *   memory and are added in warp order.
 *
 * Order of the float operations, which makes a row's result independent of
 * the batch: lane l sums its elements k = c*256 + l*8 + e (e = 0..7, chunks c
 * in increasing order) with one fmaf chain; the warp adds its lanes with the
 * xor butterfly (distances 16, 8, 4, 2, 1: the same tree for every value and
 * every lane); then the WK warp partials are added in warp order. None of
 * this depends on the number of activation rows or on which other rows share
 * the launch, only on K and WK (chosen from the weight's shape). */
#ifndef SD_KERNELS_CUDA_GEMV_CUH
#define SD_KERNELS_CUDA_GEMV_CUH

#include "kernels/cuda/common.cuh"

#define SD__GEMV_WARPS 8
#define SD__GEMV_CHUNK 256 /* elements of one row per warp-wide load */

/* 16 bytes of a weight stream: not kept in L1, 256-byte L2 prefetch. */
__device__ __forceinline__ uint4 sd__ld_stream(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* raw words of 8 consecutive weights: 16 bytes (F32: two words); F8: 8
 * bytes and the scale of their block */
template <int DT> struct sd__w8raw {
    uint4 q[DT == SD__F32 ? 2 : 1];
};
template <> struct sd__w8raw<SD__F8> {
    uint2 q;
    float s;
};

/* 8 bytes of a weight stream, as sd__ld_stream */
__device__ __forceinline__ uint2 sd__ld_stream8(const void *p)
{
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* Block-scaled FP8 rows (sd_weight's F8_E4M3): srow, the row's scales (the
 * row block's scale row: scale + (row / block[0]) * scale_cols), and
 * bshift = log2(block[1]); the 8 weights a lane loads never straddle a
 * block (block[1] a power of two >= 8). Other dtypes take neither. */
template <int DT>
__device__ __forceinline__ void sd__w8_load(sd__w8raw<DT> &r, const void *row, int k,
                                            const float *srow, int bshift)
{
    if constexpr (DT == SD__F8) {
        r.q = sd__ld_stream8((const uint8_t *)row + k);
        r.s = __ldg(srow + (k >> bshift));
    } else if constexpr (DT == SD__F32) {
        const float *p = (const float *)row + k;
        r.q[0] = sd__ld_stream(p);
        r.q[1] = sd__ld_stream(p + 4);
    } else {
        r.q[0] = sd__ld_stream((const uint16_t *)row + k);
    }
}

template <int DT> __device__ __forceinline__ void sd__w8_zero(sd__w8raw<DT> &r)
{
    if constexpr (DT == SD__F8) {
        r.q = make_uint2(0, 0);
        r.s = 0.0f;
    } else {
#pragma unroll
        for (int i = 0; i < (DT == SD__F32 ? 2 : 1); i++)
            r.q[i] = make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ void sd__u2f(uint32_t u, int dt, float &lo, float &hi)
{
    if (dt == SD__BF16) {
        lo = __uint_as_float(u << 16);
        hi = __uint_as_float(u & 0xffff0000u);
    } else {
        lo = sd__f16f((uint16_t)(u & 0xffffu));
        hi = sd__f16f((uint16_t)(u >> 16));
    }
}

/* two E4M3 codes (the low byte first), exact as floats */
__device__ __forceinline__ float2 sd__f8x2raw(uint16_t u)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)u, __NV_E4M3);
    return __half22float2(*(const __half2 *)&h);
}

/* two E4M3 codes (the low byte first) times their block's scale s, each
 * rounded to BF16 (nearest even) and widened: the bits of the BF16
 * dequantization (sd_weight's F8_E4M3 contract) */
__device__ __forceinline__ void sd__f8x2f(uint16_t u, float s, float &lo, float &hi)
{
    const float2 f = sd__f8x2raw(u);
    lo = __bfloat162float(__float2bfloat16_rn(__fmul_rn(f.x, s)));
    hi = __bfloat162float(__float2bfloat16_rn(__fmul_rn(f.y, s)));
}

/* 8 E4M3 codes (the lowest byte first) of one block, as sd__f8x2f */
__device__ __forceinline__ void sd__f8x8f(uint2 q, float s, float f[8])
{
    sd__f8x2f((uint16_t)(q.x & 0xffffu), s, f[0], f[1]);
    sd__f8x2f((uint16_t)(q.x >> 16), s, f[2], f[3]);
    sd__f8x2f((uint16_t)(q.y & 0xffffu), s, f[4], f[5]);
    sd__f8x2f((uint16_t)(q.y >> 16), s, f[6], f[7]);
}

/* 8 E4M3 codes as floats, exact (not scaled, not rounded): the factored
 * FP8 dot (SD_F8_DOT, below) */
__device__ __forceinline__ void sd__f8x8raw(uint2 q, float f[8])
{
    const uint32_t w[2] = {q.x, q.y};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 v = sd__f8x2raw((uint16_t)(w[j / 2] >> (16 * (j % 2))));
        f[2 * j] = v.x;
        f[2 * j + 1] = v.y;
    }
}

template <int DT> __device__ __forceinline__ void sd__w8_float(const sd__w8raw<DT> &r, float f[8])
{
    if constexpr (DT == SD__F8) {
        sd__f8x8f(r.q, r.s, f);
    } else if constexpr (DT == SD__F32) {
        const uint4 a = r.q[0], b = r.q[1];
        f[0] = __uint_as_float(a.x); f[1] = __uint_as_float(a.y);
        f[2] = __uint_as_float(a.z); f[3] = __uint_as_float(a.w);
        f[4] = __uint_as_float(b.x); f[5] = __uint_as_float(b.y);
        f[6] = __uint_as_float(b.z); f[7] = __uint_as_float(b.w);
    } else {
        sd__u2f(r.q[0].x, DT, f[0], f[1]);
        sd__u2f(r.q[0].y, DT, f[2], f[3]);
        sd__u2f(r.q[0].z, DT, f[4], f[5]);
        sd__u2f(r.q[0].w, DT, f[6], f[7]);
    }
}

/* acc += w . x over 8 elements, one fmaf chain in element order */
__device__ __forceinline__ float sd__fma8(const float w[8], float4 a, float4 b, float acc)
{
    acc = fmaf(w[0], a.x, acc);
    acc = fmaf(w[1], a.y, acc);
    acc = fmaf(w[2], a.z, acc);
    acc = fmaf(w[3], a.w, acc);
    acc = fmaf(w[4], b.x, acc);
    acc = fmaf(w[5], b.y, acc);
    acc = fmaf(w[6], b.z, acc);
    acc = fmaf(w[7], b.w, acc);
    return acc;
}

/* One iteration of sd__warp_dots in two halves: the weight loads of chunks
 * c, c + cstep, ..., c + (U - 1) cstep (rows past the end and chunks past K
 * as zeros), and their multiply-adds into acc. */
template <int DT, int VR, int U>
__device__ __forceinline__ void sd__warp_load(sd__w8raw<DT> (&raw)[U][VR], const void *const (&wrow)[VR],
                                              int K, int c, int cstep, int lane,
                                              const float *const *srow = nullptr, int bshift = 0)
{
    const int nch = (K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int k = (c + u * cstep) * SD__GEMV_CHUNK + lane * 8;
        bool in = c + u * cstep < nch && k < K;
#pragma unroll
        for (int i = 0; i < VR; i++) {
            if (in && wrow[i])
                sd__w8_load<DT>(raw[u][i], wrow[i], k, DT == SD__F8 ? srow[i] : nullptr, bshift);
            else
                sd__w8_zero<DT>(raw[u][i]);
        }
    }
}

/* The FP8 dot (ops.h): 2, the default, the 8 products of the exact E4M3
 * values summed, then times the scale (one multiply a lane's 8 weights);
 * a build with -DSD_F8_DOT=N for an A/B: 0 each weight BF16(E4M3 x scale)
 * (the dequantized scratch's bits), 1 E4M3 x scale unrounded */
#ifndef SD_F8_DOT
#define SD_F8_DOT 2
#endif
template <int DT, int VR, int NR, int U>
__device__ __forceinline__ void sd__warp_use(const sd__w8raw<DT> (&raw)[U][VR],
                                             const float *const (&xr)[NR], int nr, int K, int c,
                                             int cstep, int lane, float (&acc)[VR * NR])
{
    constexpr int f8m = SD_F8_DOT;
    const int nch = (K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int k = (c + u * cstep) * SD__GEMV_CHUNK + lane * 8;
        if (c + u * cstep >= nch || k >= K)
            continue;
        float wf[VR][8];
#pragma unroll
        for (int i = 0; i < VR; i++) {
            if constexpr (DT == SD__F8 && f8m != 0) {
                sd__f8x8raw(raw[u][i].q, wf[i]);
                if constexpr (f8m == 1) {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        wf[i][j] = __fmul_rn(wf[i][j], raw[u][i].s);
                }
            } else {
                sd__w8_float<DT>(raw[u][i], wf[i]);
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < nr) {
                const float4 *xp = (const float4 *)(xr[r] + k);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
                for (int i = 0; i < VR; i++) {
                    if constexpr (DT == SD__F8 && f8m == 2)
                        acc[i * NR + r] = fmaf(raw[u][i].s, sd__fma8(wf[i], a, b, 0.0f), acc[i * NR + r]);
                    else
                        acc[i * NR + r] = sd__fma8(wf[i], a, b, acc[i * NR + r]);
                }
            }
        }
    }
}

/* Per-lane partial dots of one warp: acc[i * NR + r] += w_i . x_r over the
 * chunks c = c0, c0 + cstep, ... of K (K % 8 == 0, every row and x_r 16-byte
 * aligned; F8: 8-byte, with srow and bshift as sd__w8_load takes them).
 * wrow[i] NULL: a row past the end (its sums stay 0). Rows r >= nr are
 * skipped. */
template <int DT, int VR, int NR, int U>
__device__ __forceinline__ void sd__warp_dots(const void *const (&wrow)[VR], const float *const (&xr)[NR],
                                              int nr, int K, int c0, int cstep, int lane,
                                              float (&acc)[VR * NR],
                                              const float *const *srow = nullptr, int bshift = 0)
{
    const int nch = (K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK;
    for (int c = c0; c < nch; c += cstep * U) {
        sd__w8raw<DT> raw[U][VR];
        sd__warp_load<DT, VR, U>(raw, wrow, K, c, cstep, lane, srow, bshift);
        sd__warp_use<DT, VR, NR, U>(raw, xr, nr, K, c, cstep, lane, acc);
    }
}

/* Sums V values (a power of two <= 32) across the warp with the butterfly
 * tree, V at once: first each step halves the values a lane keeps (the lane
 * with the distance bit set keeps the upper half), then plain butterfly
 * steps. On return v[0] holds the warp sum of value index sd__xr_index<V>(lane);
 * the lanes whose low 5 - log2(V) bits are 0 hold each value once. */
template <int V> __device__ __forceinline__ int sd__xr_index(int lane)
{
    return lane / (32 / V);
}

/* halving steps: values [0, 2H) -> [0, H) over lane distance D, then on */
template <int V, int H, int D> struct sd__xr_steps {
    static __device__ __forceinline__ void run(float (&v)[V], int lane)
    {
        const bool upper = (lane & D) != 0;
#pragma unroll
        for (int j = 0; j < H; j++) {
            float send = upper ? v[j] : v[j + H];
            float keep = upper ? v[j + H] : v[j];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, D);
        }
        sd__xr_steps<V, H / 2, D / 2>::run(v, lane);
    }
};
template <int V, int D> struct sd__xr_steps<V, 0, D> {
    static __device__ __forceinline__ void run(float (&)[V], int) {}
};

template <int V> __device__ __forceinline__ void sd__xreduce(float (&v)[V], int lane)
{
    static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V: a power of two <= 32");
    sd__xr_steps<V, V / 2, 16>::run(v, lane);
#pragma unroll
    for (int d = 16 / V; d >= 1; d >>= 1)
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], d);
}

/* The V dot products of weight rows wrow with one activation row x over a
 * warp's chunks c0, c0 + cstep, ... (sd__warp_dots, U chunks a load),
 * summed over the warp: dst[i] = that warp's part of w_i . x, written by
 * the lane that holds it (lane % (32 / V) == 0, value sd__xr_index). */
template <int DT, int V, int U>
__device__ __forceinline__ void sd__warp_dots1(const void *const (&wrow)[V], const float *x,
                                               int K, int c0, int cstep, int lane, float *dst,
                                               const float *const *srow = nullptr, int bshift = 0)
{
    const float *xr[1] = {x};
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; i++)
        acc[i] = 0.0f;
    sd__warp_dots<DT, V, 1, U>(wrow, xr, 1, K, c0, cstep, lane, acc, srow, bshift);
    sd__xreduce<V>(acc, lane);
    if (lane % (32 / V) == 0)
        dst[sd__xr_index<V>(lane)] = acc[0];
}

/* ---- BF16 weights on tensor cores ----------------------------------------
 *
 * mma.sync m16n8k16 with the weights as B (8 weight rows per mma, the n8
 * side) and the activations as A (16 activation rows, the m16 side). An fp32
 * activation is split exactly into three bf16 terms, x = hi + mid + lo (each
 * residual is exact in fp32 and has 8 fewer significant bits), so every
 * product with a bf16 weight is exact and the sums are fp32: the GEMV's
 * accuracy without its fp32 multiply-adds (8 per weight at 8 rows), and
 * activation registers shared by 8 weight rows.
 *
 * The k index inside an mma is free to permute as long as A and B agree:
 * lane (g = lane / 4, t = lane % 4) loads 16 bytes of weight row g at
 * k = 32c + 8t (chunk c), and the two mmas of the chunk take elements 0-3
 * and 4-7 of that load as their k slots {2t, 2t+1, 2t+8, 2t+9}; the lane's
 * activation values come from the same 8 k. */

/* d += A B over one k16 step (not volatile: a pure function of its
 * operands, so the compiler may interleave independent mmas) */
__device__ __forceinline__ void sd__mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* x0, x1 -> three packed bf16 pairs with x = hi + mid + lo exactly: each
 * term is the top 8 significant bits of what the previous ones left
 * (truncation, so each residual is exact in fp32 and the last one fits a
 * bf16 whole). Low element in the low half, as the mma reads pairs. */
__device__ __forceinline__ void sd__split3(float x0, float x1, uint32_t &hi, uint32_t &mid,
                                           uint32_t &lo)
{
    const uint32_t u0 = __float_as_uint(x0), u1 = __float_as_uint(x1);
    const float r0 = x0 - __uint_as_float(u0 & 0xffff0000u);
    const float r1 = x1 - __uint_as_float(u1 & 0xffff0000u);
    const uint32_t m0 = __float_as_uint(r0), m1 = __float_as_uint(r1);
    const float s0 = r0 - __uint_as_float(m0 & 0xffff0000u);
    const float s1 = r1 - __uint_as_float(m1 & 0xffff0000u);
    hi = __byte_perm(u0, u1, 0x7632);
    mid = __byte_perm(m0, m1, 0x7632);
    lo = __byte_perm(__float_as_uint(s0), __float_as_uint(s1), 0x7632);
}

/* A fragments (terms hi, mid, lo; mmas s = 0, 1) of the lane's 8 values of
 * activation rows g (xa) and g + 8 (xb); NULL or k >= K: zeros. Rows g + 8
 * are skipped when the caller knows the whole half is empty (hi8 false). */
__device__ __forceinline__ void sd__x_frags(const float *xa, const float *xb, int k, bool kin,
                                            bool hi8, uint32_t (&f)[3][2][4])
{
    float v[2][8];
    const float *xr[2] = {xa, xb};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (kin && xr[h] && (h == 0 || hi8)) {
            const float4 *p = (const float4 *)(xr[h] + k);
            float4 a = __ldg(p), b = __ldg(p + 1);
            v[h][0] = a.x; v[h][1] = a.y; v[h][2] = a.z; v[h][3] = a.w;
            v[h][4] = b.x; v[h][5] = b.y; v[h][6] = b.z; v[h][7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[h][e] = 0.0f;
        }
    }
    /* a0: (row g, slots 2t, 2t+1), a1: (row g+8, same), a2: (row g, 2t+8,
     * 2t+9), a3: (row g+8, same); mma s takes elements 4s .. 4s+3 */
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int h = r & 1, e = 4 * s + (r >> 1) * 2;
            if (h == 0 || hi8)
                sd__split3(v[h][e], v[h][e + 1], f[0][s][r], f[1][s][r], f[2][s][r]);
            else
                f[0][s][r] = f[1][s][r] = f[2][s][r] = 0u;
        }
}

/* Warps splitting K for a row of K elements: the largest power of two <= 8
 * that leaves every warp at least one chunk. Depends on K only. */
static inline int sd__gemv_wk(int K)
{
    int nch = (K + SD__GEMV_CHUNK - 1) / SD__GEMV_CHUNK, wk = 1;
    while (wk * 2 <= SD__GEMV_WARPS && wk * 2 <= nch)
        wk *= 2;
    return wk;
}

#endif

/* kernels/cuda: the shape of the RMSNorm kernels (norm.cu) and the
 * residual step (add then RMSNorm) of one row as a device function with
 * their bits, for a kernel that ends with it: the fused MoE down kernel's
 * last block (moe.cu). */
#ifndef SD_KERNELS_CUDA_NORM_CUH
#define SD_KERNELS_CUDA_NORM_CUH

#include <string.h>

#include "kernels/cuda/common.cuh"

#define NORM_MAX_THREADS 1024
/* elements a thread holds in registers: float4s, or floats on the scalar
 * path; rows of up to 16384 floats either way */
#define NORM_VEC 4
#define NORM_SCALAR 16

/* Threads for a row of m elements (float4s or floats), a multiple of 32:
 * one element a thread up to NORM_MAX_THREADS, then up to per elements a
 * thread; 0 when the row is too long. The same for rmsnorm and add_rmsnorm. */
static inline int sd__norm_threads(int m, int per)
{
    if ((m + NORM_MAX_THREADS - 1) / NORM_MAX_THREADS > per)
        return 0;
    int nt = m < NORM_MAX_THREADS ? m : NORM_MAX_THREADS;
    return (nt + 31) / 32 * 32;
}

/* The residual step of rows of d floats (d % 4 == 0, rows 16-byte
 * aligned): x row += y row (stored), xn row = rmsnorm(x row) * w, as
 * norm_kernel<true, true> runs it with nt = sd__norm_threads(d / 4,
 * NORM_VEC) threads; cnt: the counts of a fold (a word a row, zero between
 * calls). x NULL: none. */
struct sd__addnorm_args {
    float *x, *xn;
    const void *w;
    int wdt, d, nt;
    float eps;
    unsigned *cnt;
};

/* A fold's arguments for the residual step an after an op of n rows of d
 * floats y (folds on: its switch), where add_rmsnorm would take float4
 * rows, rows of up to 4096 floats (2 x 16 KB of shared memory) and rows of
 * the counts cnt (max_rows); whether it takes it (else a->x NULL). */
static inline int sd__addnorm_fold_args(const sd__cuda *c, int on, const sd_addnorm *an,
                                        const float *y, int n, int d, unsigned *cnt,
                                        int max_rows, sd__addnorm_args *a)
{
    memset(a, 0, sizeof *a);
    const int nt = d % 4 == 0 ? sd__norm_threads(d / 4, NORM_VEC) : 0;
    if (!an || !on || (c->ablate & SD__AB_ADDNORM) || !nt || d > 4096 || n > max_rows ||
        !sd__aligned16(an->x) || !sd__aligned16(an->xn) || !sd__aligned16(y))
        return 0;
    *a = sd__addnorm_args{an->x, an->xn, an->w->data, (int)an->w->dtype, d, nt, an->eps, cnt};
    return 1;
}

/* Row t of the residual step by one block of any multiple of 32 threads up
 * to 1024, with norm_kernel<true, true>'s bits at a.nt threads: thread v's
 * float4s v, v + nt, ... summed in order in double, then sd__block_rrms's
 * tree over the nt threads' sums; this block's threads each stand in for
 * threads tid, tid + blockDim.x, ... Every element's x, y and weight load
 * at once (one round trip), kept in s: 2 d floats of shared memory, 16-byte
 * aligned. */
__device__ __forceinline__ void sd__addnorm_row(const sd__addnorm_args &a, const float *y, int t,
                                                float4 *s)
{
    __shared__ double part[32];
    __shared__ float rs;
    const int m = a.d / 4, nt = a.nt, B = blockDim.x, lane = threadIdx.x % 32;
    float4 *xr = (float4 *)(a.x + (size_t)t * (size_t)a.d);
    const float4 *yr = (const float4 *)(y + (size_t)t * (size_t)a.d);
    float4 *sv = s, *sg = s + m;
    for (int i = threadIdx.x; i < m; i += B) {
        float4 v = xr[i];
        const float4 b = yr[i];
        const size_t e = (size_t)i * 4;
        float4 g;
        g.x = sd__wload(a.w, a.wdt, e);
        g.y = sd__wload(a.w, a.wdt, e + 1);
        g.z = sd__wload(a.w, a.wdt, e + 2);
        g.w = sd__wload(a.w, a.wdt, e + 3);
        v.x += b.x;
        v.y += b.y;
        v.z += b.z;
        v.w += b.w;
        xr[i] = v;
        sv[i] = v;
        sg[i] = g;
    }
    __syncthreads();
    for (int v0 = 0; v0 < nt; v0 += B) { /* B and nt: multiples of 32 */
        const int v = v0 + (int)threadIdx.x;
        double ss = 0;
        if (v < nt)
            for (int i = v; i < m; i += nt) {
                const float4 q = sv[i];
                ss += (double)q.x * q.x;
                ss += (double)q.y * q.y;
                ss += (double)q.z * q.z;
                ss += (double)q.w * q.w;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0 && v < nt)
            part[v / 32] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        double tt = lane < nt / 32 ? part[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            tt += __shfl_xor_sync(0xffffffffu, tt, o);
        if (lane == 0)
            rs = 1.0f / sqrtf((float)(tt / a.d) + a.eps);
    }
    __syncthreads();
    const float r = rs;
    float4 *o = (float4 *)(a.xn + (size_t)t * (size_t)a.d);
    for (int i = threadIdx.x; i < m; i += B) {
        const float4 v = sv[i], g = sg[i];
        float4 q;
        q.x = g.x * (v.x * r);
        q.y = g.y * (v.y * r);
        q.z = g.z * (v.z * r);
        q.w = g.w * (v.w * r);
        o[i] = q;
    }
}

#endif

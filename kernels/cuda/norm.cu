/* CUDA: RMSNorm and the fused residual step (add then RMSNorm), one block
 * per row (kernels/cpu/norm.c is the reference). The sum of squares is kept
 * in double like the CPU's, so the two agree to fp32 rounding. Both kernels
 * take each thread's partial sum the same way (elements threadIdx.x,
 * + NORM_THREADS, ...) and reduce it with the same block_rrms, so
 * add_rmsnorm gives the bits of add followed by rmsnorm. In place (out == x,
 * same stride) is safe: every read of the row happens before the barrier
 * that precedes the writes. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define NORM_THREADS 256

/* 1/rms of a row from each thread's partial sum of squares ss: warp
 * shuffles, then thread 0 adds the warps' sums in order. Every thread of
 * the block gets the value (after the barriers). */
__device__ __forceinline__ float block_rrms(double ss, int d, float eps)
{
    __shared__ double part[NORM_THREADS / 32];
    __shared__ float rs;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < NORM_THREADS / 32; k++)
            t += part[k];
        rs = 1.0f / sqrtf((float)(t / d) + eps);
    }
    __syncthreads();
    return rs;
}

__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float *out, const float *x, const void *w, int wdt, int d, int x_stride,
               int out_stride, float eps)
{
    SD_PDL_ENTER();
    const float *xr = x + (size_t)blockIdx.x * (size_t)x_stride;
    float *o = out + (size_t)blockIdx.x * (size_t)out_stride;
    double ss = 0;
    for (int i = threadIdx.x; i < d; i += NORM_THREADS)
        ss += (double)xr[i] * xr[i];
    float r = block_rrms(ss, d, eps);
    for (int i = threadIdx.x; i < d; i += NORM_THREADS)
        o[i] = sd__wload(w, wdt, (size_t)i) * (xr[i] * r);
}

/* x(row) += y(row) (the fp32 add of add_kernel), then rmsnorm_kernel's
 * arithmetic on the sums. Each thread reads back only the elements it
 * wrote, so the second loop needs no barrier of its own. */
__global__ void __launch_bounds__(NORM_THREADS)
add_rmsnorm_kernel(float *out, float *x, const float *y, const void *w, int wdt, int d,
                   float eps)
{
    SD_PDL_ENTER();
    float *xr = x + (size_t)blockIdx.x * (size_t)d;
    const float *yr = y + (size_t)blockIdx.x * (size_t)d;
    float *o = out + (size_t)blockIdx.x * (size_t)d;
    double ss = 0;
    for (int i = threadIdx.x; i < d; i += NORM_THREADS) {
        float v = xr[i] + yr[i];
        xr[i] = v;
        ss += (double)v * v;
    }
    float r = block_rrms(ss, d, eps);
    for (int i = threadIdx.x; i < d; i += NORM_THREADS)
        o[i] = sd__wload(w, wdt, (size_t)i) * (xr[i] * r);
}

void sd__cuda_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                      int x_stride, int out_stride, float eps)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0)
        return;
    sd__launch(c, rmsnorm_kernel, n, NORM_THREADS, 0, out, x, w->data, w->dtype, d, x_stride,
                                                     out_stride, eps);
    SD_LAUNCHED(c, "rmsnorm_kernel");
}

void sd__cuda_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                          int n, int d, float eps)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0)
        return;
    sd__launch(c, add_rmsnorm_kernel, n, NORM_THREADS, 0, out, x, y, w->data, w->dtype, d, eps);
    SD_LAUNCHED(c, "add_rmsnorm_kernel");
}

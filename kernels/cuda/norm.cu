/* CUDA: RMSNorm and the fused residual step (add then RMSNorm), one block
 * per row (kernels/cpu/norm.c is the reference). The sum of squares is kept
 * in double like the CPU's, so the two agree to fp32 rounding.
 *
 * Decode normalizes one row of 2-7k floats at a time, so the kernel's
 * latency is the step's, not its bandwidth: the block is sized to the row
 * (a thread per float4, up to 1024 threads, then up to NORM_VEC float4s
 * a thread), every element is loaded once into registers (the add's
 * result too) and the products are written from there, with one block-wide
 * reduction between: one round trip to memory instead of one per 256
 * elements, and no re-read of the row. Rows that cannot take float4 loads
 * (odd widths or strides) go element by element, same structure.
 *
 * Both kernels are one template with the same thread count and the same
 * order of sums for a row width (thread i sums its elements in order, then
 * sd__block_rrms), so
 * add_rmsnorm gives the bits of add followed by rmsnorm. In place
 * (out == x) is safe: every element is read before the barrier that
 * precedes the writes. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define NORM_MAX_THREADS 1024
/* elements a thread holds in registers: float4s, or floats on the scalar
 * path; rows of up to 16384 floats either way */
#define NORM_VEC 4
#define NORM_SCALAR 16

/* out row = norm(x row [+ y row]) * w; ADD: x row += y row first (stored).
 * VEC: float4 elements (d % 4 == 0, rows 16-byte aligned), else floats. */
template <bool ADD, bool VEC>
__global__ void __launch_bounds__(NORM_MAX_THREADS)
    norm_kernel(float *out, float *x, const float *y, const void *w, int wdt, int d, int x_stride,
                int out_stride, float eps)
{
    constexpr int PER = VEC ? NORM_VEC : NORM_SCALAR;
    const int nt = blockDim.x, m = VEC ? d / 4 : d;
    /* the weights first: no kernel writes them, so they load before the
     * wait for the kernel before (a round trip to memory off the step) */
    float4 g[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int i = (int)threadIdx.x + j * nt;
        if (i < m) {
            const size_t e = VEC ? (size_t)i * 4 : (size_t)i;
            g[j].x = sd__wload(w, wdt, e);
            if (VEC) {
                g[j].y = sd__wload(w, wdt, e + 1);
                g[j].z = sd__wload(w, wdt, e + 2);
                g[j].w = sd__wload(w, wdt, e + 3);
            }
        }
    }
    SD_PDL_ENTER(out, x, y, w, wdt, d, x_stride, out_stride, eps);
    float *xr = x + (size_t)blockIdx.x * (size_t)x_stride;
    const float *yr = ADD ? y + (size_t)blockIdx.x * (size_t)d : NULL;
    float *o = out + (size_t)blockIdx.x * (size_t)out_stride;
    float4 v[PER];
    double ss = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int i = (int)threadIdx.x + j * nt;
        if (i < m) {
            if (VEC) {
                v[j] = ((const float4 *)xr)[i];
                if (ADD) {
                    const float4 b = ((const float4 *)yr)[i];
                    v[j].x += b.x;
                    v[j].y += b.y;
                    v[j].z += b.z;
                    v[j].w += b.w;
                    ((float4 *)xr)[i] = v[j];
                }
                ss += (double)v[j].x * v[j].x;
                ss += (double)v[j].y * v[j].y;
                ss += (double)v[j].z * v[j].z;
                ss += (double)v[j].w * v[j].w;
            } else {
                v[j].x = xr[i];
                if (ADD) {
                    v[j].x += yr[i];
                    xr[i] = v[j].x;
                }
                ss += (double)v[j].x * v[j].x;
            }
        }
    }
    const float r = sd__block_rrms(ss, d, eps);
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int i = (int)threadIdx.x + j * nt;
        if (i < m) {
            if (VEC) {
                float4 q;
                q.x = g[j].x * (v[j].x * r);
                q.y = g[j].y * (v[j].y * r);
                q.z = g[j].z * (v[j].z * r);
                q.w = g[j].w * (v[j].w * r);
                ((float4 *)o)[i] = q;
            } else {
                o[i] = g[j].x * (v[j].x * r);
            }
        }
    }
}

/* Threads for a row of m elements (float4s or floats), a multiple of 32:
 * one element a thread up to NORM_MAX_THREADS, then up to per elements a
 * thread; 0 when the row is too long. The same for rmsnorm and add_rmsnorm. */
static int norm_threads(int m, int per)
{
    if ((m + NORM_MAX_THREADS - 1) / NORM_MAX_THREADS > per)
        return 0;
    int nt = m < NORM_MAX_THREADS ? m : NORM_MAX_THREADS;
    return (nt + 31) / 32 * 32;
}

template <bool ADD>
static void launch_norm(sd__cuda *c, float *out, float *x, const float *y, const sd_weight *w,
                        int n, int d, int x_stride, int out_stride, float eps)
{
    const int vec = d % 4 == 0 && x_stride % 4 == 0 && out_stride % 4 == 0 && sd__aligned16(x) &&
                    sd__aligned16(out) && (!ADD || sd__aligned16(y));
    const int nt = vec ? norm_threads(d / 4, NORM_VEC) : norm_threads(d, NORM_SCALAR);
    if (!nt) {
        SD_BADARG(c, "rmsnorm: rows of %d floats (at most %d)", d,
                  NORM_MAX_THREADS * NORM_SCALAR);
        return;
    }
    if (vec)
        sd__launch(c, norm_kernel<ADD, true>, n, nt, 0, out, x, y, w->data, (int)w->dtype, d,
                   x_stride, out_stride, eps);
    else
        sd__launch(c, norm_kernel<ADD, false>, n, nt, 0, out, x, y, w->data, (int)w->dtype, d,
                   x_stride, out_stride, eps);
    SD_LAUNCHED(c, "norm_kernel");
}

void sd__cuda_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                      int x_stride, int out_stride, float eps)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0 || (c->ablate & SD__AB_NORM))
        return;
    launch_norm<false>(c, out, (float *)x, NULL, w, n, d, x_stride, out_stride, eps);
}

void sd__cuda_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                          int n, int d, float eps)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0 || (c->ablate & SD__AB_ADDNORM))
        return;
    launch_norm<true>(c, out, x, y, w, n, d, d, d, eps);
}

SD_KTRACE_EXPORT(norm)

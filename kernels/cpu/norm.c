/* CPU reference: RMSNorm, computed the way HF does it in fp32:
 * x * rsqrt(mean(x^2) + eps) * w; and the residual step x += y then
 * RMSNorm, through the same row function so the fused op gives the bits of
 * add followed by rmsnorm. */
#include <math.h>

#include "kernels/cpu/cpu.h"

/* o(d) = xr(d) * rsqrt(mean(xr^2) + eps) * w; the sum of squares in double */
static void norm_row(float *o, const float *xr, const sd_weight *w, int d, float eps)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += (double)xr[i] * xr[i];
    float r = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++)
        o[i] = sd_load_f32(w->data, w->dtype, (size_t)i) * (xr[i] * r);
}

void sd__cpu_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                     int x_stride, int out_stride, float eps)
{
    (void)be;
    for (int t = 0; t < n; t++)
        norm_row(out + (size_t)t * (size_t)out_stride, x + (size_t)t * (size_t)x_stride, w, d,
                 eps);
}

/* Row by row: the row's add (sd__cpu_add's y[i] += x[i]) completes before
 * its norm reads it, as in the two-op sequence. */
void sd__cpu_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                         int n, int d, float eps)
{
    (void)be;
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * (size_t)d;
        const float *yr = y + (size_t)t * (size_t)d;
        for (int i = 0; i < d; i++)
            xr[i] += yr[i];
        norm_row(out + (size_t)t * (size_t)d, xr, w, d, eps);
    }
}

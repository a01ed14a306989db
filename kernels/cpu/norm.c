/* CPU reference: RMSNorm, computed the way HF does it in fp32:
 * x * rsqrt(mean(x^2) + eps) * w. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void sd__cpu_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                     int x_stride, int out_stride, float eps)
{
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * (size_t)x_stride;
        float *o = out + (size_t)t * (size_t)out_stride;
        double ss = 0;
        for (int i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        float r = 1.0f / sqrtf((float)(ss / d) + eps);
        for (int i = 0; i < d; i++)
            o[i] = sd_load_f32(w->data, w->dtype, (size_t)i) * (xr[i] * r);
    }
}

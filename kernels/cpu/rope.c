/* CPU reference: rotary position embedding. The angle is computed in fp32
 * exactly as HF does (inv_freq * position, both fp32), then cos/sin. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void sd__cpu_rope(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                  int row_stride, int head_stride, int off)
{
    (void)be;
    int half = r->rot_dim / 2;
    for (int t = 0; t < n; t++) {
        float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            float ang = r->inv_freq[i] * p;
            float cs = cosf(ang) * r->mscale, sn = sinf(ang) * r->mscale;
            for (int h = 0; h < H; h++) {
                float *v = x + (size_t)t * (size_t)row_stride + (size_t)h * (size_t)head_stride +
                           (size_t)off;
                int a = r->interleave ? 2 * i : i;
                int b = r->interleave ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs - x1 * sn;
                v[b] = x1 * cs + x0 * sn;
            }
        }
    }
}

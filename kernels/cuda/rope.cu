/* CUDA: rotary position embedding (kernels/cpu/rope.c is the reference).
 * One thread per (token, head, pair). The angle is the fp32 product
 * inv_freq[i] * pos as in HF, then the full-range cosf/sinf (no fast-math
 * intrinsics: positions run to the context length, angles to thousands of
 * radians). Both variants: interleaved pairs (2i, 2i+1) and halves
 * (i, i + rot_dim/2); dims [off, off + rot_dim) of each head. */
#include <math.h>

#include "kernels/cuda/common.cuh"

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int half,
                            int interleave, float mscale, int n, int H, int row_stride,
                            int head_stride, int off)
{
    SD_PDL_ENTER();
    size_t m = (size_t)n * (size_t)H * (size_t)half;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride) {
        int i = (int)(e % (size_t)half);
        size_t th = e / (size_t)half;
        int h = (int)(th % (size_t)H), t = (int)(th / (size_t)H);
        float ang = __fmul_rn(inv_freq[i], (float)pos[t]);
        float cs = cosf(ang) * mscale, sn = sinf(ang) * mscale;
        float *v = x + (size_t)t * (size_t)row_stride + (size_t)h * (size_t)head_stride +
                   (size_t)off;
        int a = interleave ? 2 * i : i;
        int b = interleave ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        v[b] = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
    }
}

void sd__cuda_rope(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                   int row_stride, int head_stride, int off)
{
    sd__cuda *c = sd__cuda_op(be);
    int half = r->rot_dim / 2;
    if (!c || n <= 0 || H <= 0 || half <= 0)
        return;
    size_t m = (size_t)n * (size_t)H * (size_t)half;
    size_t blocks = (m + 255) / 256;
    if (blocks > 65535u * 16u)
        blocks = 65535u * 16u;
    sd__launch(c, rope_kernel, (unsigned)blocks, 256, 0, x, pos, r->inv_freq, half, r->interleave,
                                                         r->mscale, n, H, row_stride,
                                                         head_stride, off);
    SD_LAUNCHED(c, "rope_kernel");
}

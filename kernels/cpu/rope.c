/* CPU reference: rotary position embedding. The angle is computed in fp32
 * exactly as HF does (inv_freq * position, both fp32), then cos/sin. And the
 * attention prologues that end in it, as the ops they fuse: rope_kv (rope of
 * q and k, then attn_gqa's cache store) and mla_prep (rmsnorm of the latent,
 * rope of the key's and queries' rotary parts, then attn_mla's store). */
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

void sd__cpu_rope_kv(sd_backend *be, float *q, float *k, const float *v, void *kcache,
                     void *vcache, const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv, int D,
                     int Dv, int q_stride, int kv_stride)
{
    sd__cpu_rope(be, q, b->pos, r, b->n_tokens, Hq, q_stride, D, 0);
    sd__cpu_rope(be, k, b->pos, r, b->n_tokens, Hkv, kv_stride, D, 0);
    sd__cpu_kv_store(kcache, vcache, k, v, b, Hkv, D, Dv, kv_stride);
}

void sd__cpu_mla_prep(sd_backend *be, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                      int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                      const sd_attn_batch *b, const sd_rope *r, int H, int C, int R)
{
    int T = b->n_tokens;
    sd__cpu_rmsnorm(be, ckv, ckv, w, T, C, ck_stride, ck_stride, eps);
    sd__cpu_rope(be, ckv, b->pos, r, T, 1, ck_stride, 0, C);
    sd__cpu_rope(be, q_pe, b->pos, r, T, H, qpe_stride, qpe_head_stride, 0);
    sd__cpu_latent_store(cache, ckv, ckv + C, b, C, R, ck_stride);
}

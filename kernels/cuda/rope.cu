/* CUDA: rotary position embedding, and the attention prologues that end in
 * it (kernels/cpu/rope.c is the reference).
 *
 * rope: one thread per (token, head, pair). The angle is the fp32 product
 * inv_freq[i] * pos as in HF, then the full-range cosf/sinf (no fast-math
 * intrinsics: positions run to the context length, angles to thousands of
 * radians). Both variants: interleaved pairs (2i, 2i+1) and halves
 * (i, i + rot_dim/2); dims [off, off + rot_dim) of each head.
 *
 * The prologues do in one launch what a decode layer did in three or four
 * small ones (at batch 1 each is a few microseconds of the step, mostly
 * launch and one round trip to memory), with the same arithmetic:
 * - rope_kv (GQA): rope of q and k, and k and v into the KV cache;
 * - mla_prep (MLA): the latent's RMSNorm (the rmsnorm kernel's order of
 *   sums: a thread per float4, sd__block_rrms), rope of the key's and the
 *   queries' rotary parts, and [latent, rope key] into the cache. */
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mla_prep.cuh"

/* rotates pair i of head vector v in place (and into c when non-NULL) */
__device__ __forceinline__ void rope_apply(float *v, float *c, int i, int pos,
                                           const float *inv_freq, int half, int interleave,
                                           float mscale)
{
    float cs, sn, y0, y1;
    int a, b;
    sd__rope_cs(inv_freq[i], pos, mscale, &cs, &sn);
    sd__rope_pair(i, half, interleave, &a, &b);
    sd__rope_rot(v[a], v[b], cs, sn, &y0, &y1);
    v[a] = y0;
    v[b] = y1;
    if (c) {
        c[a] = y0;
        c[b] = y1;
    }
}

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int half,
                            int interleave, float mscale, int n, int H, int row_stride,
                            int head_stride, int off)
{
    SD_PDL_ENTER(x, pos, inv_freq, half, interleave, mscale, n, H, row_stride, head_stride, off);
    size_t m = (size_t)n * (size_t)H * (size_t)half;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride) {
        int i = (int)(e % (size_t)half);
        size_t th = e / (size_t)half;
        int h = (int)(th % (size_t)H), t = (int)(th / (size_t)H);
        float *v = x + (size_t)t * (size_t)row_stride + (size_t)h * (size_t)head_stride +
                   (size_t)off;
        rope_apply(v, NULL, i, pos[t], inv_freq, half, interleave, mscale);
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

/* ---- rope_kv ------------------------------------------------------------
 *
 * Token t = blockIdx.y; its work items, 256 a block along x:
 *   [0, Hq half)              q head h, pair i: rotated in place;
 *   [.., + Hkv D)             k head h, dim d: the first dim of a pair rotates
 *                             the pair in place and into the cache, the second
 *                             does nothing, a dim past rot_dim is copied;
 *   [.., + Hkv Dv)            v head h, dim d: copied into the cache. */
__global__ void rope_kv_kernel(float *q, float *k, const float *v, float *kc, float *vc,
                               const int32_t *pos, const int32_t *slot, const float *inv_freq,
                               int half, int interleave, float mscale, int Hq, int Hkv, int D,
                               int Dv, int q_stride, int kv_stride)
{
    SD_PDL_ENTER(q, k, v, kc, vc, pos, slot, inv_freq, half, interleave, mscale, Hq, Hkv, D, Dv,
                 q_stride, kv_stride);
    const int t = blockIdx.y, p = pos[t];
    const int nq = Hq * half, nk = Hkv * D, nv = Hkv * Dv;
    const size_t s = (size_t)slot[t];
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < nq + nk + nv;
         e += gridDim.x * blockDim.x) {
        if (e < nq) {
            const int h = e / half, i = e % half;
            rope_apply(q + (size_t)t * q_stride + (size_t)h * D, NULL, i, p, inv_freq, half,
                       interleave, mscale);
        } else if (e < nq + nk) {
            const int h = (e - nq) / D, d = (e - nq) % D;
            float *kv = k + (size_t)t * kv_stride + (size_t)h * D;
            float *kd = kc + (s * (size_t)Hkv + (size_t)h) * (size_t)D;
            if (d >= 2 * half) {
                kd[d] = kv[d];
            } else {
                const int i = interleave ? d / 2 : d < half ? d : -1;
                if (i >= 0 && (!interleave || d % 2 == 0))
                    rope_apply(kv, kd, i, p, inv_freq, half, interleave, mscale);
            }
        } else {
            const int h = (e - nq - nk) / Dv, d = (e - nq - nk) % Dv;
            vc[(s * (size_t)Hkv + (size_t)h) * (size_t)Dv + d] =
                v[(size_t)t * kv_stride + (size_t)h * Dv + d];
        }
    }
}

void sd__cuda_rope_kv(sd_backend *be, float *q, float *k, const float *v, void *kcache,
                      void *vcache, const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv,
                      int D, int Dv, int q_stride, int kv_stride)
{
    sd__cuda *c = sd__cuda_op(be);
    const int half = r->rot_dim / 2, T = b->n_tokens;
    if (!c || T <= 0)
        return;
    if (half <= 0 || 2 * half > D || T > 65535) {
        SD_BADARG(c, "rope_kv: rotary dims %d of heads of %d, %d tokens", r->rot_dim, D, T);
        return;
    }
    const int items = Hq * half + Hkv * D + Hkv * Dv;
    const dim3 grid((unsigned)((items + 255) / 256), (unsigned)T);
    sd__launch(c, rope_kv_kernel, grid, 256, 0, q, k, v, (float *)kcache, (float *)vcache, b->pos,
               b->slot, r->inv_freq, half, r->interleave, r->mscale, Hq, Hkv, D, Dv, q_stride,
               kv_stride);
    SD_LAUNCHED(c, "rope_kv_kernel");
}

template <bool VEC>
__global__ void __launch_bounds__(MLA_PREP_THREADS)
    mla_prep_kernel(const __grid_constant__ sd__mla_prep_args a)
{
    sd__mla_prep_token<VEC>(a, blockIdx.x);
}

int sd__cuda_mla_prep_args(sd__cuda *c, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                           int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                           const sd_attn_batch *b, const sd_rope *r, int H, int C, int R,
                           sd__mla_prep_args *a, int *vec)
{
    const int half = r->rot_dim / 2;
    *vec = C % 4 == 0 && ck_stride % 4 == 0 && sd__aligned16(ckv) && sd__aligned16(cache) &&
           (C + R) % 4 == 0;
    if (half <= 0 || 2 * half > R || (*vec ? C / 4 : C) > MLA_PREP_THREADS) {
        SD_BADARG(c, "mla_prep: latent %d, rope key %d, rotary dims %d", C, R, r->rot_dim);
        return -1;
    }
    *a = sd__mla_prep_args{ckv,     q_pe,       (float *)cache, ck_stride,   qpe_stride,
                             qpe_head_stride,     w->data,        (int)w->dtype, eps,
                             b->pos,  b->slot,    r->inv_freq,    half,        r->interleave,
                             r->mscale, H,        C,              R};
    return 0;
}

void sd__cuda_mla_prep(sd_backend *be, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                       int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                       const sd_attn_batch *b, const sd_rope *r, int H, int C, int R)
{
    sd__cuda *c = sd__cuda_op(be);
    const int T = b->n_tokens;
    if (!c || T <= 0 || (c->ablate & SD__AB_PREP))
        return;
    sd__mla_prep_args a;
    int vec;
    if (sd__cuda_mla_prep_args(c, ckv, ck_stride, q_pe, qpe_stride, qpe_head_stride, w, eps,
                               cache, b, r, H, C, R, &a, &vec))
        return;
    auto k = vec ? mla_prep_kernel<true> : mla_prep_kernel<false>;
    sd__launch(c, k, T, MLA_PREP_THREADS, 0, a);
    SD_LAUNCHED(c, "mla_prep_kernel");
}

SD_KTRACE_EXPORT(rope)

/* kernels/cuda: mla_prep's per-token work as a device function (rope.cu's
 * kernel; matmul.cu's launch of it beside the query's absorb). */
#ifndef SD_KERNELS_CUDA_MLA_PREP_CUH
#define SD_KERNELS_CUDA_MLA_PREP_CUH

#include "kernels/cuda/common.cuh"

/* ---- mla_prep -----------------------------------------------------------
 *
 * One block of MLA_PREP_THREADS per token: the latent c (C floats, C <= 4
 * MLA_PREP_THREADS) normed with the rmsnorm kernel's arithmetic (a thread
 * per float4 when C % 4 == 0 and the row is aligned, else a thread per
 * float; sums in double, sd__block_rrms) and written in place and into the
 * cache row; the rope key (R floats at c + C) and the H query rope parts
 * rotated in place, the key into the cache row too. The kernel is a chain
 * of round trips at batch 1 (3.3 us of a V2-Lite layer with SPECD_ABLATE),
 * so the weights load before the wait, and the rope, which does not need
 * the norm, runs while the latent's sums go through the block reduction. */
#define MLA_PREP_THREADS 256

/* rope items (pairs of the key and the queries) a thread loads at once */
#define MLA_PREP_ITEMS 4

/* the pair (a, b) of rotary index i of a head */
__device__ __forceinline__ void sd__rope_pair(int i, int half, int interleave, int *a, int *b)
{
    *a = interleave ? 2 * i : i;
    *b = interleave ? 2 * i + 1 : i + half;
}

/* mla_prep's arguments (sd__cuda_mla_prep_args makes them) */
typedef struct sd__mla_prep_args {
    float *ckv, *q_pe, *cache;
    int ck_stride, qpe_stride, qpe_head_stride;
    const void *w;
    int wdt;
    float eps;
    const int32_t *pos, *slot;
    const float *inv_freq;
    int half, interleave;
    float mscale;
    int H, C, R;
} sd__mla_prep_args;

/* token t's mla_prep, by a block of MLA_PREP_THREADS threads (its PDL wait
 * included; a: the kernel's __grid_constant__ parameter) */
template <bool VEC>
__device__ __forceinline__ void sd__mla_prep_token(const sd__mla_prep_args &a, int t)
{
    const int half = a.half, C = a.C, R = a.R, H = a.H;
    const int m = VEC ? C / 4 : C, i = threadIdx.x;
    /* The weights before the wait (no kernel writes them): the norm's, and
     * the inverse frequency of the thread's rotary index, which is the same
     * for all its pairs when the block is a multiple of half wide (then one
     * cos/sin a thread, not one a pair: the same numbers). */
    const bool jfix = blockDim.x % half == 0;
    float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < m) {
        const size_t e = VEC ? (size_t)i * 4 : (size_t)i;
        g.x = sd__wload(a.w, a.wdt, e);
        if (VEC) {
            g.y = sd__wload(a.w, a.wdt, e + 1);
            g.z = sd__wload(a.w, a.wdt, e + 2);
            g.w = sd__wload(a.w, a.wdt, e + 3);
        }
    }
    const float fq = jfix ? a.inv_freq[i % half] : 0.0f;
    SD_PDL_ENTER(a);
    const int p = a.pos[t];
    float *c = a.ckv + (size_t)t * (size_t)a.ck_stride;
    float *row = a.cache + (size_t)a.slot[t] * (size_t)(C + R);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    double ss = 0;
    if (i < m) {
        if (VEC) {
            v = ((const float4 *)c)[i];
            ss += (double)v.x * v.x;
            ss += (double)v.y * v.y;
            ss += (double)v.z * v.z;
            ss += (double)v.w * v.w;
        } else {
            v.x = c[i];
            ss += (double)v.x * v.x;
        }
    }
    /* The rope key (pairs [0, half) of c + C, also into the cache row) and
     * the queries' pairs after it: they do not wait for the norm, and a
     * thread loads MLA_PREP_ITEMS pairs before it rotates any. */
    float cs0 = 0.0f, sn0 = 0.0f;
    if (jfix)
        sd__rope_cs(fq, p, a.mscale, &cs0, &sn0);
    const int items = (H + 1) * half;
    for (int e0 = i; e0 < items; e0 += MLA_PREP_ITEMS * (int)blockDim.x) {
        float *vp[MLA_PREP_ITEMS];
        float x0[MLA_PREP_ITEMS], x1[MLA_PREP_ITEMS];
        int ia[MLA_PREP_ITEMS], ib[MLA_PREP_ITEMS];
#pragma unroll
        for (int k = 0; k < MLA_PREP_ITEMS; k++) {
            const int e = e0 + k * (int)blockDim.x, h = e / half, j = e % half;
            vp[k] = NULL;
            if (e < items) {
                vp[k] = h == 0 ? c + C
                               : a.q_pe + (size_t)t * a.qpe_stride +
                                     (size_t)(h - 1) * a.qpe_head_stride;
                sd__rope_pair(j, half, a.interleave, &ia[k], &ib[k]);
                x0[k] = vp[k][ia[k]];
                x1[k] = vp[k][ib[k]];
            }
        }
#pragma unroll
        for (int k = 0; k < MLA_PREP_ITEMS; k++) {
            if (!vp[k])
                continue;
            const int e = e0 + k * (int)blockDim.x;
            float cs = cs0, sn = sn0, y0, y1;
            if (!jfix)
                sd__rope_cs(a.inv_freq[e % half], p, a.mscale, &cs, &sn);
            sd__rope_rot(x0[k], x1[k], cs, sn, &y0, &y1);
            vp[k][ia[k]] = y0;
            vp[k][ib[k]] = y1;
            if (e < half) {
                row[C + ia[k]] = y0;
                row[C + ib[k]] = y1;
            }
        }
    }
    /* rope key dims past the rotary ones (none for DeepSeek: R = rot_dim) */
    for (int d = 2 * half + i; d < R; d += blockDim.x)
        row[C + d] = c[C + d];
    const float rr = sd__block_rrms(ss, C, a.eps);
    if (i < m) {
        if (VEC) {
            float4 o;
            o.x = g.x * (v.x * rr);
            o.y = g.y * (v.y * rr);
            o.z = g.z * (v.z * rr);
            o.w = g.w * (v.w * rr);
            ((float4 *)c)[i] = o;
            ((float4 *)row)[i] = o;
        } else {
            const float o = g.x * (v.x * rr);
            c[i] = o;
            row[i] = o;
        }
    }
}

/* mla_prep's arguments checked (a bad one recorded as the backend's error:
 * -1) into *a, and *vec: the float4 shape (rope.cu) */
int sd__cuda_mla_prep_args(sd__cuda *c, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                           int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                           const sd_attn_batch *b, const sd_rope *r, int H, int C, int R,
                           sd__mla_prep_args *a, int *vec);

#endif

/* CUDA: attention over the paged KV cache, GQA and MLA
 * (kernels/cpu/attention.c is the reference).
 *
 * One kernel serves both. A block takes one token and a group of G query
 * heads that share one K/V stream (GQA: the heads of one KV head; MLA: up to
 * 16 of the heads, all of which read the one latent cache), walks the
 * token's positions 0..pos through the block table in tiles of 32 keys, and
 * keeps a flash-style online softmax: each K/V tile is read from the cache
 * once per head group, not once per head. Everything is fp32 like the cache.
 * This step's K/V (the latent and roped key for MLA) are stored first, by
 * a kernel earlier on the stream, so tokens of one sequence see each other. */
#include <math.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define ATT_THREADS 256
#define KT 32 /* keys per tile: one warp lane per key in the softmax step */
#define MAX_G 16
/* Split-KV (flash decoding) for steps of few tokens: a token's positions are
 * cut into S contiguous chunks (whole tiles), one block each, and a second
 * kernel merges the S partial softmaxes in chunk order. S depends on the
 * head layout only, never on the number of tokens, so a token's bits are the
 * same in a 1-token decode step and a k+1-token verify step. */
#define SPLIT_MAX_T 8  /* tokens in a step at most for the split path */
#define SPLIT_MAX 16   /* chunks per token at most */

typedef struct att_args {
    float *out; /* out + t*o_tok + h*o_head, Dv floats */
    int o_tok, o_head;
    const float *q1; /* first D1 dims of the query */
    int q1_tok, q1_head, D1;
    const float *q2; /* the remaining D2 dims (MLA's roped part) */
    int q2_tok, q2_head, D2;
    const float *kc; /* key of slot s, KV head g: kc + s*k_slot + g*k_head (D1+D2 floats) */
    int k_slot, k_head;
    const float *vc; /* value: vc + s*v_slot + g*v_head (Dv floats) */
    int v_slot, v_head, Dv;
    int v_is_k; /* MLA: the value is the first Dv floats of the key row */
    int group;  /* query heads per KV head */
    int G;      /* query heads per block */
    int ngb;    /* blocks per KV head: ceil(group / G) */
    const int32_t *pos, *seq, *block_table;
    int max_blocks, block_size;
    float scale;
    int S;       /* chunks per token (1: no split) */
    float *part; /* S > 1: (T, Hq, S, Dv + 2) partial acc, max, sum */
} att_args;

static inline int tile_stride(const att_args *a)
{
    int dk = a->D1 + a->D2;
    int w = a->v_is_k || dk >= a->Dv ? dk : a->Dv;
    return w + 1; /* odd rows for even widths: lanes on consecutive keys hit distinct banks */
}

static size_t smem_bytes(const att_args *a)
{
    size_t dk = (size_t)(a->D1 + a->D2), G = (size_t)a->G;
    size_t floats = G * dk + (size_t)KT * (size_t)tile_stride(a) + G * KT + G * (size_t)a->Dv + 3 * G;
    return floats * sizeof(float) + KT * sizeof(int);
}

__global__ void __launch_bounds__(ATT_THREADS) attn_kernel(att_args a, int KS)
{
    extern __shared__ float sm[];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = ATT_THREADS / 32;
    const int t = blockIdx.x;
    const int kvh = blockIdx.y / a.ngb, g0 = (blockIdx.y % a.ngb) * a.G;
    const int G = a.group - g0 < a.G ? a.group - g0 : a.G;
    const int Dk = a.D1 + a.D2, Dv = a.Dv;
    float *qs = sm;               /* (G, Dk) */
    float *ks = qs + a.G * Dk;    /* (KT, KS): key tile, then value tile */
    float *S = ks + KT * KS;      /* (G, KT) scores, then probabilities */
    float *acc = S + a.G * KT;    /* (G, Dv) */
    float *mrun = acc + a.G * Dv; /* (G) running max */
    float *lrun = mrun + a.G;     /* (G) running sum */
    float *alpha = lrun + a.G;    /* (G) rescale of this tile */
    int *slots = (int *)(alpha + a.G);
    const int hbase = kvh * a.group + g0;

    for (int e = tid; e < G * Dk; e += ATT_THREADS) {
        int g = e / Dk, d = e % Dk, h = hbase + g;
        qs[e] = d < a.D1 ? a.q1[(size_t)t * a.q1_tok + (size_t)h * a.q1_head + d]
                         : a.q2[(size_t)t * a.q2_tok + (size_t)h * a.q2_head + (d - a.D1)];
    }
    for (int e = tid; e < G * Dv; e += ATT_THREADS)
        acc[e] = 0.0f;
    if (tid < G) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    const int n_all = a.pos[t] + 1;
    /* this block's chunk of the positions: [j_lo, n) */
    int j_lo = 0, n = n_all;
    if (a.S > 1) {
        int per = (n_all + a.S - 1) / a.S;
        per = (per + KT - 1) / KT * KT;
        j_lo = blockIdx.z * per;
        n = j_lo + per < n_all ? j_lo + per : n_all;
    }
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
    const size_t kbase = (size_t)kvh * (size_t)a.k_head, vbase = (size_t)kvh * (size_t)a.v_head;
    __syncthreads();

    for (int j0 = j_lo; j0 < n; j0 += KT) {
        const int kt = n - j0 < KT ? n - j0 : KT;
        if (tid < kt) {
            int p = j0 + tid;
            slots[tid] = bt[p / a.block_size] * a.block_size + p % a.block_size;
        }
        __syncthreads();
        for (int e = tid; e < kt * Dk; e += ATT_THREADS) {
            int jj = e / Dk, d = e % Dk;
            ks[jj * KS + d] = a.kc[(size_t)slots[jj] * (size_t)a.k_slot + kbase + d];
        }
        __syncthreads();
        /* scores: a warp per head (KT == 32), a lane per key */
        for (int e = tid; e < G * KT; e += ATT_THREADS) {
            int g = e / KT, jj = e % KT;
            float sc = -INFINITY;
            if (jj < kt) {
                const float *q = qs + g * Dk, *k = ks + jj * KS;
                float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                int d = 0;
                for (; d + 4 <= Dk; d += 4) {
                    s0 += q[d] * k[d];
                    s1 += q[d + 1] * k[d + 1];
                    s2 += q[d + 2] * k[d + 2];
                    s3 += q[d + 3] * k[d + 3];
                }
                float s = (s0 + s2) + (s1 + s3);
                for (; d < Dk; d++)
                    s += q[d] * k[d];
                sc = s * a.scale;
            }
            S[e] = sc;
        }
        __syncthreads();
        /* online softmax: the first tile always holds key 0, so the max is finite */
        for (int g = warp; g < G; g += nw) {
            float v = S[g * KT + lane];
            float mo = mrun[g], mn = fmaxf(mo, sd__warp_max(v));
            float p = v == -INFINITY ? 0.0f : expf(v - mn);
            S[g * KT + lane] = p;
            float sum = sd__warp_sum(p);
            if (lane == 0) {
                float al = mo == -INFINITY ? 0.0f : expf(mo - mn);
                mrun[g] = mn;
                lrun[g] = lrun[g] * al + sum;
                alpha[g] = al;
            }
        }
        if (!a.v_is_k) {
            for (int e = tid; e < kt * Dv; e += ATT_THREADS) {
                int jj = e / Dv, d = e % Dv;
                ks[jj * KS + d] = a.vc[(size_t)slots[jj] * (size_t)a.v_slot + vbase + d];
            }
        }
        __syncthreads();
        for (int e = tid; e < G * Dv; e += ATT_THREADS) {
            int g = e / Dv, d = e % Dv;
            const float *p = S + g * KT;
            float o = acc[e] * alpha[g];
            for (int jj = 0; jj < kt; jj++)
                o += p[jj] * ks[jj * KS + d];
            acc[e] = o;
        }
        __syncthreads();
    }
    if (a.S > 1) {
        /* partial: unnormalized acc, running max, running sum (an empty chunk: 0, -inf, 0) */
        const int Hq = gridDim.y / a.ngb * a.group, W = Dv + 2;
        for (int e = tid; e < G * W; e += ATT_THREADS) {
            int g = e / W, d = e % W;
            float *p = a.part + (((size_t)t * Hq + (size_t)(hbase + g)) * a.S + blockIdx.z) * W;
            p[d] = d < Dv ? acc[g * Dv + d] : d == Dv ? mrun[g] : lrun[g];
        }
        return;
    }
    for (int e = tid; e < G * Dv; e += ATT_THREADS) {
        int g = e / Dv, d = e % Dv;
        a.out[(size_t)t * a.o_tok + (size_t)(hbase + g) * a.o_head + d] = acc[e] / lrun[g];
    }
}

/* out(t, h) = the S partial softmaxes of (t, h) merged in chunk order */
__global__ void __launch_bounds__(ATT_THREADS) attn_merge_kernel(att_args a, int Hq)
{
    const int t = blockIdx.x, h = blockIdx.y, Dv = a.Dv, W = Dv + 2;
    const float *p = a.part + ((size_t)t * Hq + (size_t)h) * a.S * W;
    float M = -INFINITY;
    for (int z = 0; z < a.S; z++)
        M = fmaxf(M, p[(size_t)z * W + Dv]);
    float L = 0.0f;
    for (int z = 0; z < a.S; z++) {
        float m = p[(size_t)z * W + Dv];
        if (m != -INFINITY)
            L += p[(size_t)z * W + Dv + 1] * expf(m - M);
    }
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
        for (int z = 0; z < a.S; z++) {
            float m = p[(size_t)z * W + Dv];
            if (m != -INFINITY)
                o += p[(size_t)z * W + d] * expf(m - M);
        }
        a.out[(size_t)t * a.o_tok + (size_t)h * a.o_head + d] = o / L;
    }
}

/* kcache/vcache (slots, Hkv, D/Dv) at slot[t] = k/v of token t */
__global__ void kv_store_kernel(float *kc, float *vc, const float *k, const float *v,
                                const int32_t *slot, int Hkv, int D, int Dv, int kv_stride)
{
    int t = blockIdx.x;
    size_t s = (size_t)slot[t];
    for (int e = threadIdx.x; e < Hkv * D; e += blockDim.x)
        kc[s * (size_t)Hkv * D + e] = k[(size_t)t * kv_stride + e];
    for (int e = threadIdx.x; e < Hkv * Dv; e += blockDim.x)
        vc[s * (size_t)Hkv * Dv + e] = v[(size_t)t * kv_stride + e];
}

/* cache (slots, C + R) at slot[t] = [c(t), k_pe(t)] */
__global__ void latent_store_kernel(float *cache, const float *c, const float *kpe,
                                    const int32_t *slot, int C, int R, int ck_stride)
{
    int t = blockIdx.x;
    float *dst = cache + (size_t)slot[t] * (size_t)(C + R);
    for (int e = threadIdx.x; e < C + R; e += blockDim.x)
        dst[e] = e < C ? c[(size_t)t * ck_stride + e] : kpe[(size_t)t * ck_stride + (e - C)];
}

int sd__cuda_attention_init(sd__cuda *c)
{
    int limit = (int)c->smem_optin;
    return SD_CUDA(c, cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           limit));
}

static void launch(sd__cuda *c, att_args *a, int T, int Hkv, const char *what)
{
    a->G = a->group < MAX_G ? a->group : MAX_G;
    while (a->G > 1 && smem_bytes(a) > c->smem_optin)
        a->G = (a->G + 1) / 2;
    size_t sm = smem_bytes(a);
    if (sm > c->smem_optin) {
        SD_BADARG(c, "%s: head dims %d+%d/%d need %zu bytes of shared memory (limit %zu)", what,
                  a->D1, a->D2, a->Dv, sm, c->smem_optin);
        return;
    }
    a->ngb = (a->group + a->G - 1) / a->G;
    /* few tokens: split each token's positions so the blocks fill the GPU */
    int Hq = Hkv * a->group;
    a->S = 1;
    if (T <= SPLIT_MAX_T && c->attn_part) {
        int S = (2 * c->sm_count + Hkv * a->ngb - 1) / (Hkv * a->ngb);
        size_t per_s = (size_t)SPLIT_MAX_T * (size_t)Hq * (size_t)(a->Dv + 2) * sizeof(float);
        if (S > SPLIT_MAX)
            S = SPLIT_MAX;
        if ((size_t)S * per_s > c->attn_part_bytes)
            S = (int)(c->attn_part_bytes / per_s);
        if (S > 1) {
            a->S = S;
            a->part = c->attn_part;
        }
    }
    dim3 grid((unsigned)T, (unsigned)(Hkv * a->ngb), (unsigned)a->S);
    attn_kernel<<<grid, ATT_THREADS, sm, c->stream>>>(*a, tile_stride(a));
    if (SD_LAUNCHED(c, "attn_kernel") || a->S == 1)
        return;
    attn_merge_kernel<<<dim3((unsigned)T, (unsigned)Hq), 128, 0, c->stream>>>(*a, Hq);
    SD_LAUNCHED(c, "attn_merge_kernel");
}

void sd__cuda_attn_gqa(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                       void *kcache, void *vcache, const sd_attn_batch *b, int Hq, int Hkv, int D,
                       int Dv, int q_stride, int kv_stride, float scale)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || b->n_tokens <= 0)
        return;
    if (Hkv <= 0 || Hq % Hkv) {
        SD_BADARG(c, "attn_gqa: %d query heads over %d KV heads", Hq, Hkv);
        return;
    }
    kv_store_kernel<<<b->n_tokens, 256, 0, c->stream>>>((float *)kcache, (float *)vcache, k, v,
                                                        b->slot, Hkv, D, Dv, kv_stride);
    if (SD_LAUNCHED(c, "kv_store_kernel"))
        return;
    att_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.o_tok = Hq * Dv;
    a.o_head = Dv;
    a.q1 = q;
    a.q1_tok = q_stride;
    a.q1_head = D;
    a.D1 = D;
    a.q2 = q;
    a.kc = (const float *)kcache;
    a.k_slot = Hkv * D;
    a.k_head = D;
    a.vc = (const float *)vcache;
    a.v_slot = Hkv * Dv;
    a.v_head = Dv;
    a.Dv = Dv;
    a.group = Hq / Hkv;
    a.pos = b->pos;
    a.seq = b->seq;
    a.block_table = b->block_table;
    a.max_blocks = b->max_blocks;
    a.block_size = b->block_size;
    a.scale = scale;
    launch(c, &a, b->n_tokens, Hkv, "attn_gqa");
}

void sd__cuda_attn_mla(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                       const float *c_lat, const float *k_pe, void *cache, const sd_attn_batch *b,
                       int H, int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                       float scale)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || b->n_tokens <= 0)
        return;
    latent_store_kernel<<<b->n_tokens, 256, 0, c->stream>>>((float *)cache, c_lat, k_pe, b->slot,
                                                            C, R, ck_stride);
    if (SD_LAUNCHED(c, "latent_store_kernel"))
        return;
    att_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.o_tok = H * C;
    a.o_head = C;
    a.q1 = q_lat;
    a.q1_tok = H * C;
    a.q1_head = C;
    a.D1 = C;
    a.q2 = q_pe;
    a.q2_tok = qpe_stride;
    a.q2_head = qpe_head_stride;
    a.D2 = R;
    a.kc = (const float *)cache;
    a.k_slot = C + R;
    a.k_head = 0;
    a.vc = (const float *)cache;
    a.v_slot = C + R;
    a.Dv = C;
    a.v_is_k = 1;
    a.group = H;
    a.pos = b->pos;
    a.seq = b->seq;
    a.block_table = b->block_table;
    a.max_blocks = b->max_blocks;
    a.block_size = b->block_size;
    a.scale = scale;
    launch(c, &a, b->n_tokens, 1, "attn_mla");
}

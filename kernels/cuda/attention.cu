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
 * a kernel earlier on the stream, so tokens of one sequence see each other.
 *
 * MLA also has a tensor-core kernel (mla_tc_kernel below, the default for
 * the DeepSeek latent shape; SPECD_MLA_TC=0 or sd_cuda_set_mla_tc turns it
 * off). */
#include <math.h>
#include <string.h>

#include "kernels/cuda/gemv.cuh"

#define ATT_THREADS 256
#define KT 32 /* keys per tile: one warp lane per key in the softmax step */
#define MAX_G 16
/* Split-KV (flash decoding) for steps of few tokens: a token's positions are
 * cut into S contiguous chunks (whole tiles), one block each, and a second
 * kernel merges the S partial softmaxes in chunk order. S depends on the
 * head layout only, never on the number of tokens, so a token's bits are the
 * same in a 1-token decode step and a k+1-token verify step. The general
 * kernel (attn_kernel) splits larger steps the same way while the partials
 * buffer holds them: whole, a verify step of 9+ rows walked each token's
 * context one tile after another in T blocks (the bundled model's 16-row
 * steps: 0.20 ms at a 64-token context, 0.45 at 576, where 8-row steps took
 * 0.21-0.23; bench/results/step-split-833c19a.json). */
#define SPLIT_MAX_T 8  /* tokens in a step at most for the split path (the general kernel: more) */
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
    int S;         /* chunks per token (1: no split) */
    int tile;      /* S > 1: chunks are whole tiles of this many positions */
    int min_chunk; /* keys a chunk holds at least (mla_tc_kernel) */
    int used_max;  /* > 0: chunks a token's positions use at most (mla_dec_kernel) */
    int whole1;    /* a token whose positions fill one chunk is written whole by its block
                    * and the merge leaves it (mla_dec_kernel) */
    float *part;   /* S > 1: (T, Hq, S, Dv + 2) partial acc, max, sum */
    unsigned *fold; /* mla_dec_kernel: (T, ngb) counts of the chunks done; the last
                     * block of a token's head pair merges it (NULL: the merge kernel) */
    int fold_rel;   /* the fold's count by one release-acquire atomic (SPECD_MLA_FOLD_REL) */
    unsigned abl;   /* mla_dec_kernel: SPECD_ABLATE's parts of it (common.cuh; 0 outside
                     * timing experiments) */
} att_args;

static inline int tile_stride(const att_args *a)
{
    int dk = a->D1 + a->D2;
    int w = a->v_is_k || dk >= a->Dv ? dk : a->Dv;
    return w + 1; /* odd rows for even widths: lanes on consecutive keys hit distinct banks */
}

static size_t smem_bytes(const att_args *a)
{
    size_t dk = (size_t)(a->D1 + a->D2), G = (size_t)a->G, tiles = a->v_is_k ? 1 : 2;
    size_t floats = G * dk + tiles * (size_t)KT * (size_t)tile_stride(a) + G * KT +
                    G * (size_t)a->Dv + 3 * G;
    return floats * sizeof(float) + KT * sizeof(int);
}

/* Split-KV: a.S > 1 chunks over positions [0, n_all), each `per`
 * positions long: whole tiles of a.tile positions, at least a.min_chunk,
 * and with a.used_max, at most that many chunks used (the last ones may be
 * short or empty). */
static __device__ __forceinline__ int split_per(const att_args &a, int n_all)
{
    const int S = a.used_max > 0 && a.used_max < a.S ? a.used_max : a.S;
    int per = (n_all + S - 1) / S;
    per = (per + a.tile - 1) / a.tile * a.tile;
    return per < a.min_chunk ? a.min_chunk : per;
}

/* chunk z of a.S is [*lo, *hi); a.S == 1: all of the positions */
static __device__ __forceinline__ void split_chunk(const att_args &a, int n_all, int z, int *lo,
                                                   int *hi)
{
    *lo = 0;
    *hi = n_all;
    if (a.S <= 1)
        return;
    int per = split_per(a, n_all);
    *lo = z * per;
    *hi = *lo + per < n_all ? *lo + per : n_all;
}

/* the chunks that hold positions: 0 .. split_used - 1 (the rest are empty) */
static __device__ __forceinline__ int split_used(const att_args &a, int n_all)
{
    if (a.S <= 1)
        return 1;
    int per = split_per(a, n_all);
    return (n_all + per - 1) / per;
}

/* token t's positions fill one chunk, whose block writes the result whole
 * (a.whole1; the merge leaves the token) */
static __device__ __forceinline__ int written_whole_at(const att_args &a, int pos)
{
    return a.whole1 && split_used(a, pos + 1) == 1;
}
static __device__ __forceinline__ int written_whole(const att_args &a, int t)
{
    return written_whole_at(a, a.pos[t]);
}

/* this block's chunk [*lo, *hi) of token t's positions (blockIdx.z of
 * a.S); 0: a chunk past them, nothing to do (the merge reads only the
 * chunks that hold positions) */
static __device__ __forceinline__ int block_chunk_at(const att_args &a, int pos, int *lo, int *hi)
{
    split_chunk(a, pos + 1, blockIdx.z, lo, hi);
    return a.S <= 1 || *lo < *hi;
}
static __device__ __forceinline__ int block_chunk(const att_args &a, int t, int *lo, int *hi)
{
    return block_chunk_at(a, a.pos[t], lo, hi);
}

/* out(t, h) = the partial softmaxes of (t, h) merged in chunk order, the
 * block's threads taking output columns c0, c0 + cstep, ... Only the chunks
 * that hold positions are read (a short context under a split sized for
 * long ones has a few of up to 128). The chunks' maxes and sums are loaded
 * at once, a thread each, into shared memory; the max (any order gives the
 * same), each chunk's scale exp(m - M) and the sum L (in chunk order, one
 * thread) are computed once there, not once per column; a column's sum
 * over the chunks (in chunk order) loads 8 chunks' values before it adds.
 * The loops that read the partials straight from memory, each thread
 * alone, were ~7 dependent round trips to L2 at 5 chunks. */
#define MERGE_THREADS 128
#define MERGE_MAX_S 128
#define MERGE_FAST 8 /* chunks the one-round-trip path takes */

/* The merge of a thread's one column (c0, cstep >= Dv - c0) over nz <=
 * MERGE_FAST chunks: every load (the maxes, sums and the column's values of
 * the first MERGE_FAST chunks, whether they hold positions or not, and the
 * token's position) is issued before the first is used, so the merge costs
 * one round trip to L2 instead of three and no barriers: each thread takes
 * the max and the sum itself. The numbers of the general path (the same
 * max, scales, and sums in chunk order). 0: more chunks, nothing done. */
__device__ __forceinline__ int merge_fast(const att_args &a, const float *p, int t, int h,
                                          int c0, int W)
{
    const int Dv = a.Dv, nu = a.S < MERGE_FAST ? a.S : MERGE_FAST;
    const int n_all = a.pos[t] + 1;
    float mv[MERGE_FAST], lv[MERGE_FAST], ov[MERGE_FAST];
#pragma unroll
    for (int u = 0; u < MERGE_FAST; u++) {
        mv[u] = u < nu ? p[(size_t)u * W + Dv] : -INFINITY;
        lv[u] = u < nu ? p[(size_t)u * W + Dv + 1] : 0.0f;
        ov[u] = u < nu && c0 < Dv ? p[(size_t)u * W + c0] : 0.0f;
    }
    const int nz = split_used(a, n_all);
    if (nz > MERGE_FAST)
        return 0;
    float M = -INFINITY;
#pragma unroll
    for (int u = 0; u < MERGE_FAST; u++)
        if (u < nz)
            M = fmaxf(M, mv[u]);
    float L = 0.0f, o = 0.0f;
#pragma unroll
    for (int u = 0; u < MERGE_FAST; u++)
        if (u < nz) {
            const float sc = mv[u] == -INFINITY ? 0.0f : expf(mv[u] - M);
            L += lv[u] * sc;
            o += ov[u] * sc;
        }
    if (c0 < Dv)
        a.out[(size_t)t * a.o_tok + (size_t)h * a.o_head + c0] = o / L;
    return 1;
}

__device__ __forceinline__ void merge_head(const att_args &a, int t, int h, int Hq, int c0,
                                           int cstep)
{
    __shared__ float scale[MERGE_MAX_S], mz[MERGE_MAX_S], lz[MERGE_MAX_S], ml[2];
    const int Dv = a.Dv, W = Dv + 2;
    const float *p = a.part + ((size_t)t * Hq + (size_t)h) * a.S * W;
    if (written_whole(a, t))
        return; /* its one chunk's block wrote it */
    /* a block's threads all take the fast path or none (nz is the token's) */
    if (c0 + cstep >= Dv && merge_fast(a, p, t, h, c0, W))
        return;
    const int nz = split_used(a, a.pos[t] + 1);
    for (int z = threadIdx.x; z < nz; z += blockDim.x) {
        mz[z] = p[(size_t)z * W + Dv];
        lz[z] = p[(size_t)z * W + Dv + 1];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float m = -INFINITY;
        for (int z = threadIdx.x; z < nz; z += 32)
            m = fmaxf(m, mz[z]);
        m = sd__warp_max(m);
        if (threadIdx.x == 0)
            ml[0] = m;
    }
    __syncthreads();
    const float M = ml[0];
    for (int z = threadIdx.x; z < nz; z += blockDim.x)
        scale[z] = mz[z] == -INFINITY ? 0.0f : expf(mz[z] - M);
    __syncthreads();
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int z = 0; z < nz; z++)
            L += lz[z] * scale[z];
        ml[1] = L;
    }
    __syncthreads();
    const float L = ml[1];
    for (int d = c0; d < Dv; d += cstep) {
        float o = 0.0f;
#pragma unroll 8
        for (int z = 0; z < nz; z++)
            o += (p[(size_t)z * W + d]) * scale[z];
        a.out[(size_t)t * a.o_tok + (size_t)h * a.o_head + d] = o / L;
    }
    __syncthreads(); /* the shared arrays are rewritten by the next head */
}

/* block z takes output columns MERGE_THREADS z .. (one a thread) */
__global__ void __launch_bounds__(MERGE_THREADS)
    attn_merge_kernel(const __grid_constant__ att_args a, int Hq)
{
    SD_PDL_ENTER(a, Hq);
    merge_head(a, blockIdx.x, blockIdx.y, Hq, blockIdx.z * MERGE_THREADS + threadIdx.x,
                      gridDim.z * MERGE_THREADS);
}

/* Rows of floats into shared memory, the loads in batches of LD_BATCH per
 * thread issued before any store (a loop of load-then-store per element
 * waits one memory round trip per element a thread copies: a 32-key tile of
 * 128-dim heads was 16 of them). dst row r, column c at dst[r * ds + c];
 * source row r at row(r), cols floats; VEC: float4 loads (cols % 4 == 0,
 * every source row 16-byte aligned). */
#define LD_BATCH 8
template <bool VEC, class Row>
__device__ __forceinline__ void load_rows(float *dst, int ds, int rows, int cols, Row row)
{
    const int w = VEC ? cols / 4 : cols, m = rows * w;
    for (int b = threadIdx.x; b < m; b += LD_BATCH * blockDim.x) {
        float4 v[LD_BATCH];
#pragma unroll
        for (int u = 0; u < LD_BATCH; u++) {
            const int e = b + u * (int)blockDim.x;
            if (e < m) {
                if (VEC)
                    v[u] = __ldg((const float4 *)row(e / w) + e % w);
                else
                    v[u].x = __ldg(row(e / w) + e % w);
            }
        }
#pragma unroll
        for (int u = 0; u < LD_BATCH; u++) {
            const int e = b + u * (int)blockDim.x;
            if (e < m) {
                float *d = dst + (e / w) * ds + (VEC ? 4 * (e % w) : e % w);
                d[0] = v[u].x;
                if (VEC) {
                    d[1] = v[u].y;
                    d[2] = v[u].z;
                    d[3] = v[u].w;
                }
            }
        }
    }
}

/* the query rows (G, D1 + D2) of token t into qs, heads h0 .. h0 + G - 1 */
template <bool VEC>
__device__ __forceinline__ void load_q(float *qs, const att_args &a, int t, int h0, int G)
{
    const int Dk = a.D1 + a.D2;
    load_rows<VEC>(qs, Dk, G, a.D1, [&](int g) {
        return a.q1 + (size_t)t * a.q1_tok + (size_t)(h0 + g) * a.q1_head;
    });
    if (a.D2 > 0)
        load_rows<VEC>(qs + a.D1, Dk, G, a.D2, [&](int g) {
            return a.q2 + (size_t)t * a.q2_tok + (size_t)(h0 + g) * a.q2_head;
        });
}

/* One warp's online-softmax step for head g over a tile's KT scores
 * s[lane] (-INFINITY: no key): s becomes the probabilities exp(s - m) under
 * the new running max m; the running sum, the max and alpha, the factor that
 * rescales what was accumulated before, are updated in shared memory. */
__device__ __forceinline__ void softmax_tile(float *s, float *mrun, float *lrun, float *alpha,
                                             int g, int lane)
{
    const float v = s[lane];
    const float mo = mrun[g], mn = fmaxf(mo, sd__warp_max(v));
    const float p = v == -INFINITY ? 0.0f : expf(v - mn);
    s[lane] = p;
    const float sum = sd__warp_sum(p);
    if (lane == 0) {
        const float al = mo == -INFINITY ? 0.0f : expf(mo - mn);
        mrun[g] = mn;
        lrun[g] = lrun[g] * al + sum;
        alpha[g] = al;
    }
}

template <bool VEC>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_kernel(const __grid_constant__ att_args a, int KS)
{
    SD_PDL_ENTER(a, KS);
    extern __shared__ float sm[];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = ATT_THREADS / 32;
    const int t = blockIdx.x;
    const int kvh = blockIdx.y / a.ngb, g0 = (blockIdx.y % a.ngb) * a.G;
    const int G = a.group - g0 < a.G ? a.group - g0 : a.G;
    const int Dk = a.D1 + a.D2, Dv = a.Dv;
    float *qs = sm;               /* (G, Dk) */
    float *ks = qs + a.G * Dk;    /* (KT, KS) key tile */
    float *vs = a.v_is_k ? ks : ks + KT * KS; /* (KT, KS) value tile (MLA: the keys) */
    float *S = vs + KT * KS;      /* (G, KT) scores, then probabilities */
    float *acc = S + a.G * KT;    /* (G, Dv) */
    float *mrun = acc + a.G * Dv; /* (G) running max */
    float *lrun = mrun + a.G;     /* (G) running sum */
    float *alpha = lrun + a.G;    /* (G) rescale of this tile */
    int *slots = (int *)(alpha + a.G);
    const int hbase = kvh * a.group + g0;
    int j_lo, n; /* this block's chunk of the positions */
    if (!block_chunk(a, t, &j_lo, &n))
        return;

    load_q<VEC>(qs, a, t, hbase, G);
    for (int e = tid; e < G * Dv; e += ATT_THREADS)
        acc[e] = 0.0f;
    if (tid < G) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
    const size_t kbase = (size_t)kvh * (size_t)a.k_head, vbase = (size_t)kvh * (size_t)a.v_head;
    /* the first tile's slots are looked up with the queries' loads, each
     * next tile's while this one is multiplied, and a tile's keys and values
     * are loaded together: one dependent round trip to memory a tile */
    if (tid < KT && j_lo + tid < n) {
        int p = j_lo + tid;
        slots[tid] = bt[p / a.block_size] * a.block_size + p % a.block_size;
    }
    __syncthreads();

    for (int j0 = j_lo; j0 < n; j0 += KT) {
        const int kt = n - j0 < KT ? n - j0 : KT;
        load_rows<VEC>(ks, KS, kt, Dk, [&](int jj) {
            return a.kc + (size_t)slots[jj] * (size_t)a.k_slot + kbase;
        });
        if (!a.v_is_k)
            load_rows<VEC>(vs, KS, kt, Dv, [&](int jj) {
                return a.vc + (size_t)slots[jj] * (size_t)a.v_slot + vbase;
            });
        __syncthreads();
        if (tid < KT && j0 + KT + tid < n) { /* nothing reads this tile's slots any more */
            int p = j0 + KT + tid;
            slots[tid] = bt[p / a.block_size] * a.block_size + p % a.block_size;
        }
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
        for (int g = warp; g < G; g += nw)
            softmax_tile(S + g * KT, mrun, lrun, alpha, g, lane);
        __syncthreads();
        for (int e = tid; e < G * Dv; e += ATT_THREADS) {
            int g = e / Dv, d = e % Dv;
            const float *p = S + g * KT;
            float o = acc[e] * alpha[g];
            for (int jj = 0; jj < kt; jj++)
                o += p[jj] * vs[jj * KS + d];
            acc[e] = o;
        }
        __syncthreads(); /* tiles, scores and the next slots */
    }
    if (a.S > 1) {
        /* partial: unnormalized acc, running max, running sum (a chunk that
         * holds positions: blocks past them returned at the start) */
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

/* ---- GQA, 128-dim heads ---------------------------------------------------
 *
 * 128-dim GQA heads, up to 8 query heads a block: attn_kernel's walk (one block = a token, a
 * head group and a chunk of whole 32-key tiles; online softmax; the same
 * partials for attn_merge_kernel), but with no serial loop over a head's
 * dims. A lane holds 4 of the 128 dims: of each head's query (registers),
 * of the 4 keys and 4 values a warp takes of a tile (8 warps x 4 = 32 keys,
 * loaded straight from the cache, 8 16-byte loads a lane in flight), and of
 * each head's output accumulator. A score is 4 multiply-adds a lane and the
 * warp's butterfly (all 4 x GP of a warp's scores at once, sd__xreduce);
 * the 8 warps' accumulators meet in shared memory at the end, added in
 * warp order. attn_kernel's 128-element dot products, one thread each,
 * took ~12 us a layer for a context of 100 keys on an H200, at any context
 * up to 512 (bench/results/ktrace-*.json).
 *
 * Bits: a token's result depends on its positions and the chunk count S
 * (from the head layout), never on the other tokens of the step. */
#define DEC_D 128
#define DEC_KW 4 /* keys a warp takes of a tile */
#define DEC_WARPS (KT / DEC_KW)
#define DEC_MAX_G 8
static_assert(DEC_WARPS * 32 == ATT_THREADS, "a block: 8 warps of 4 keys");

__device__ __forceinline__ float dec_dot(float4 q, float4 k, float acc)
{
    acc = fmaf(q.x, k.x, acc);
    acc = fmaf(q.y, k.y, acc);
    acc = fmaf(q.z, k.z, acc);
    return fmaf(q.w, k.w, acc);
}

__device__ __forceinline__ void dec_axpy(float4 &o, float p, float4 v)
{
    o.x = fmaf(p, v.x, o.x);
    o.y = fmaf(p, v.y, o.y);
    o.z = fmaf(p, v.z, o.z);
    o.w = fmaf(p, v.w, o.w);
}

__device__ __forceinline__ void dec_scale(float4 &o, float s)
{
    o.x *= s;
    o.y *= s;
    o.z *= s;
    o.w *= s;
}

/* the cache slot of position j0 + lane of a tile (0 past n): lane l looks
 * up key l, a warp's keys then come by shuffle */
__device__ __forceinline__ int dec_slot(const att_args &a, const int32_t *bt, int j0, int n,
                                        int lane)
{
    const int p = j0 + lane;
    if (a.abl & SD__AB_SLOTS)
        return p < n ? p : 0;
    return p < n ? bt[p / a.block_size] * a.block_size + p % a.block_size : 0;
}

/* A tile's softmax step, after sd__xreduce<V> of each warp's KW keys x GP
 * heads of scores (key i, head g at i * GP + g): the lanes holding a sum
 * write it, scaled, to S[g][key] for the block's G heads (-INFINITY past
 * the chunk's n), then a warp a head takes the online-softmax step
 * (softmax_tile: the chunk's first tile holds key j_lo, so the max is
 * finite). On return S holds the probabilities and alpha the rescale. */
template <int V, int GP, int KW>
__device__ __forceinline__ void dec_softmax(float (*S)[KT], float *mrun, float *lrun, float *alpha,
                                            float sum, const att_args &a, int lane, int warp,
                                            int G, int j0, int n)
{
    if (lane % (32 / V) == 0) {
        const int v = sd__xr_index<V>(lane), i = v / GP, g = v % GP, key = warp * KW + i;
        if (g < G)
            S[g][key] = j0 + key < n ? sum * a.scale : -INFINITY;
    }
    __syncthreads();
    if (warp < G)
        softmax_tile(S[warp], mrun, lrun, alpha, warp, lane);
    __syncthreads();
}

/* the decode kernels' loads of what kernels before them wrote (the query,
 * the cache rows): EARLY, whose addresses are known before the wait, by plain
 * loads, which stay after it (ptxas moved a read-only (nc) load of a key
 * row above griddepcontrol.wait: the row of this step's token, written by
 * the kernel before) */
template <bool EARLY, class T> __device__ __forceinline__ T md_ld(const T *p)
{
    return EARLY ? __ldcg(p) : __ldg(p);
}

template <int GP, bool EARLY> /* GP: heads a block at most, a power of two >= a.G;
                                * EARLY: as mla_dec_kernel's */
__global__ void __launch_bounds__(ATT_THREADS) attn_dec_kernel(const __grid_constant__ att_args a)
{
    constexpr int V = DEC_KW * GP; /* a warp's scores a tile: key i, head g at i * GP + g */
    __shared__ float S[GP][KT];    /* scores, then probabilities */
    __shared__ float mrun[GP], lrun[GP], alpha[GP];
    __shared__ float4 red[DEC_WARPS][GP][32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int t = blockIdx.x;
    const int kvh = blockIdx.y / a.ngb, g0 = (blockIdx.y % a.ngb) * a.G;
    const int G = a.group - g0 < a.G ? a.group - g0 : a.G;
    int j_lo, n, s0 = 0;
    const int32_t *bt = NULL;
    /* EARLY: the step's inputs before the wait (mla_dec_kernel) */
    if (EARLY)
        SD_PDL_PRE(a);
    else
        SD_PDL_ENTER(a);
    if (!block_chunk(a, t, &j_lo, &n))
        return;
    if (EARLY) {
        bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
        s0 = dec_slot(a, bt, j_lo, n, lane);
        SD_PDL_POST();
    }
    const int hbase = kvh * a.group + g0;
    float4 q[GP], acc[GP];
#pragma unroll
    for (int g = 0; g < GP; g++) {
        q[g] = g < G ? md_ld<EARLY>((const float4 *)(a.q1 + (size_t)t * a.q1_tok +
                                                     (size_t)(hbase + g) * a.q1_head) +
                                    lane)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
        acc[g] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (tid < GP) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    if (!EARLY)
        bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
    const float *kb = a.kc + (size_t)kvh * (size_t)a.k_head, *vb = a.vc + (size_t)kvh * (size_t)a.v_head;
    for (int j0 = j_lo; j0 < n; j0 += KT) {
        const int slot = EARLY && j0 == j_lo ? s0 : dec_slot(a, bt, j0, n, lane);
        float4 kr[DEC_KW], vr[DEC_KW];
#pragma unroll
        for (int i = 0; i < DEC_KW; i++) {
            const int key = warp * DEC_KW + i;
            const size_t sl = (size_t)__shfl_sync(0xffffffffu, slot, key);
            const bool in = j0 + key < n;
            kr[i] = in ? md_ld<EARLY>((const float4 *)(kb + sl * (size_t)a.k_slot) + lane)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
            vr[i] = in ? md_ld<EARLY>((const float4 *)(vb + sl * (size_t)a.v_slot) + lane)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float sc[V];
#pragma unroll
        for (int i = 0; i < DEC_KW; i++)
#pragma unroll
            for (int g = 0; g < GP; g++)
                sc[i * GP + g] = dec_dot(q[g], kr[i], 0.0f);
        sd__xreduce<V>(sc, lane);
        dec_softmax<V, GP, DEC_KW>(S, mrun, lrun, alpha, sc[0], a, lane, warp, G, j0, n);
#pragma unroll
        for (int g = 0; g < GP; g++) {
            if (g < G) {
                dec_scale(acc[g], alpha[g]);
#pragma unroll
                for (int i = 0; i < DEC_KW; i++)
                    dec_axpy(acc[g], S[g][warp * DEC_KW + i], vr[i]);
            }
        }
        __syncthreads(); /* S and alpha are rewritten by the next tile */
    }
#pragma unroll
    for (int g = 0; g < GP; g++)
        if (g < G)
            red[warp][g][lane] = acc[g];
    __syncthreads();
    if (tid >= G * 32)
        return;
    const int g = tid / 32;
    float4 o = red[0][g][lane];
#pragma unroll
    for (int w = 1; w < DEC_WARPS; w++) {
        const float4 r = red[w][g][lane];
        o.x += r.x;
        o.y += r.y;
        o.z += r.z;
        o.w += r.w;
    }
    if (a.S > 1) {
        const int Hq = gridDim.y / a.ngb * a.group, W = DEC_D + 2;
        float *pp = a.part + (((size_t)t * Hq + (size_t)(hbase + g)) * a.S + blockIdx.z) * W;
        /* a partial row is 520 bytes: 8-byte aligned */
        ((float2 *)pp)[2 * lane] = make_float2(o.x, o.y);
        ((float2 *)pp)[2 * lane + 1] = make_float2(o.z, o.w);
        if (lane == 0) {
            pp[DEC_D] = mrun[g];
            pp[DEC_D + 1] = lrun[g];
        }
        return;
    }
    const float L = lrun[g];
    float4 r = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
    *((float4 *)(a.out + (size_t)t * a.o_tok + (size_t)(hbase + g) * a.o_head) + lane) = r;
}

/* ---- MLA decode on tensor cores ----------------------------------------
 *
 * The same walk as attn_kernel for MLA (one block = one token x a group of
 * 16 heads, flash-style online softmax, split-KV chunks merged by
 * attn_merge_kernel), with both products on mma.sync m16n8k16 (bf16 in,
 * fp32 accumulate). Only the DeepSeek latent shape: C = 512, R = 64, so a
 * cached row is 576 floats and the 16 heads are the mma's M.
 *
 * Per tile of 64 keys (8 warps):
 * - the 64 cached rows are read from global memory once for the head group
 *   (16-byte loads past L1, 12 in flight per thread), rounded to bf16 and
 *   stored in shared memory as a (key, 576) row-major tile;
 * - scores S(16, 64) = Q(16, 576) K^T: warp w takes keys 8w..8w+7 over all
 *   36 k-steps (A fragments of q from shared memory, which was rounded to
 *   bf16 once per block; B fragments by ldmatrix of the key rows);
 * - online softmax in fp32 on the scores (two rows per warp, a lane per
 *   two keys), p = bf16(exp(s - m)) written as the A operand of the next
 *   product, and the running sum l adds the rounded p, so the output is
 *   exactly a weighted mean of the (rounded) rows with weights summing to 1;
 * - O(16, 512) = alpha O + P(16, 64) V(64, 512): V is the first 512
 *   columns of the same tile (ldmatrix.trans gives the B fragments); warp w
 *   keeps output columns 64w..64w+63 in registers (32 floats a lane).
 * Shared memory 100 544 bytes: two blocks per SM on sm_90 (227 KB), so one
 * block's mma phase can overlap the other's loads (one block on sm_80/86/89;
 * no double buffering within a block yet). Rows are padded to an odd number
 * of 16-byte units, so ldmatrix has no bank conflicts. The lanes' ldmatrix
 * addresses and fragment uses below are checked against the PTX layouts by
 * bench/kernels/mla_tc_error_model.py --emulate.
 *
 * Precision against the fp32 kernel / the CPU op. q, the cached rows and p
 * are rounded to bf16: x -> x (1 + e), |e| <= u = 2^-8; products are exact
 * and sums fp32 (~2^-24 each, negligible). Then
 *   score:  s~_j = s_j + d_j, |d_j| <= 2u scale sum_d |q_d k_jd| (worst
 *           case; the 576 rounding errors have random signs, so typically
 *           ~u scale |q o k_j|_2);
 *   weight: w~_j = w_j exp(d_j) (1 + r_j) / Z, |r_j| <= u (p rounded), and
 *           the w~ sum to 1 because l adds the rounded p;
 *   out:    o~ - o = sum_j (w~_j - w_j)(v_j - o) + sum_j w~_j e_j v_j,
 * so |o~ - o| <= (exp(2 (D + u)) - 1) sum_j w_j |v_j - o| + u max_j |v_j|
 * with D = max |d_j|. One key: o~ = bf16(v), within 2^-8 of max |out|.
 * Many keys: the terms have random signs and average like out itself, so
 * max |err| / max |out| stays a small multiple of u. A model of this
 * kernel's exact rounding (bench/kernels/mla_tc_error_model.py) on the GPU
 * test's inputs (q, q_pe and cache uniform in [-1, 1), scale 1/sqrt(192))
 * gives 2.0e-3 at 1 key, 5.2e-3 at 2 keys (the worst: two rows that
 * cancel), 3.3e-3 at 64, 2.2-2.6e-3 at 4100; the test bound is 1e-2 (about
 * twice the worst). Peaked real attention (large |s|) has larger D, as any
 * bf16 attention kernel does.
 *
 * Bits: a token's result depends on its own positions and the chunk count,
 * which is fixed by the head layout (mla_split), never by the number of
 * tokens in the step, so decode and verify steps agree bit for bit. */
#define MLA_C 512
#define MLA_R 64
#define MLA_DK (MLA_C + MLA_R) /* 576: a cached row */
#define TC_M 16                /* heads per block: the mma's M */
#define TC_KT 64               /* keys per tile */
#define TC_WARPS 8
#define TC_THREADS (TC_WARPS * 32)
#define TC_KP (MLA_DK + 8) /* bf16 pitch of key and query rows: 1168 bytes, 73 x 16 */
#define TC_SP (TC_KT + 4)  /* fp32 pitch of score rows */
#define TC_PP (TC_KT + 8)  /* bf16 pitch of probability rows: 144 bytes, 9 x 16 */
#define TC_LOADS 12        /* 16-byte cache loads per thread in flight */
/* Split-KV: chunks per token at most; a chunk holds one tile of keys at
 * least (mla_min_chunk) (a chunk's partial costs 16 x 514 floats written and read back by the
 * merge: short contexts use fewer chunks, the rest are empty and write only
 * their max and sum). A block walks its tiles one after another (~10 us a
 * tile of 64 keys on an H200), so a short context wants one tile a chunk:
 * with 4 tiles a chunk every context up to 4k keys took ~47 us at 16 heads
 * (bench/results/mla-tc.json). */
#define TC_SPLIT_MAX 128
static_assert(TC_SPLIT_MAX <= MERGE_MAX_S && SPLIT_MAX <= MERGE_MAX_S, "merge scales in shared memory");

/* shared memory layout (bytes; every part 16-byte aligned) */
#define TC_OFF_Q (TC_KT * TC_KP * 2)
#define TC_OFF_S (TC_OFF_Q + TC_M * TC_KP * 2)
#define TC_OFF_P (TC_OFF_S + TC_M * TC_SP * 4)
#define TC_OFF_ST (TC_OFF_P + TC_M * TC_PP * 2)
#define TC_OFF_SLOT (TC_OFF_ST + 3 * TC_M * 4)
#define TC_SMEM (TC_OFF_SLOT + TC_KT * 4)

static_assert(TC_OFF_Q % 16 == 0 && TC_OFF_S % 16 == 0 && TC_OFF_P % 16 == 0 &&
                  TC_OFF_ST % 16 == 0 && TC_OFF_SLOT % 16 == 0,
              "mla_tc shared memory parts must stay 16-byte aligned");
static_assert((TC_KP * 2 / 16) % 2 == 1 && (TC_PP * 2 / 16) % 2 == 1,
              "row pitches must be odd multiples of 16 bytes (ldmatrix banks)");
static_assert(TC_KT * (MLA_DK / 4) % (TC_THREADS * TC_LOADS) == 0, "tile load batches");
static_assert(TC_KT == TC_WARPS * 8 && MLA_C == TC_WARPS * 64, "warp split of the products");

/* four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row
 * addresses of matrix i. "memory": ordered against the block's barriers. */
__device__ __forceinline__ void tc_ldsm4(uint32_t (&r)[4], const __nv_bfloat16 *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* the same, each matrix transposed (B fragments of a row-major (k, n) tile) */
__device__ __forceinline__ void tc_ldsm4_t(uint32_t (&r)[4], const __nv_bfloat16 *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* two floats rounded to bf16, lo in the low half (the element order of a row) */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

/* The queries of token t, heads h0 .. h0 + G - 1, as bf16 rows of qs
 * (pitch TC_KP; rows past G are zeros): float4 loads, all of a thread's
 * issued before any conversion (mla_tc_takes checked the alignment). */
#define TC_Q4 ((TC_M * MLA_DK / 4 + TC_THREADS - 1) / TC_THREADS)
__device__ __forceinline__ void tc_load_q(__nv_bfloat16 *qs, const att_args &a, int t, int h0,
                                          int G)
{
    float4 v[TC_Q4];
#pragma unroll
    for (int u = 0; u < TC_Q4; u++) {
        const int e = u * TC_THREADS + (int)threadIdx.x, r = e / (MLA_DK / 4), d = 4 * (e % (MLA_DK / 4));
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (e < TC_M * MLA_DK / 4 && r < G)
            v[u] = __ldg((const float4 *)(d < MLA_C ? a.q1 + (size_t)t * a.q1_tok +
                                                          (size_t)(h0 + r) * a.q1_head + d
                                                    : a.q2 + (size_t)t * a.q2_tok +
                                                          (size_t)(h0 + r) * a.q2_head + (d - MLA_C)));
    }
#pragma unroll
    for (int u = 0; u < TC_Q4; u++) {
        const int e = u * TC_THREADS + (int)threadIdx.x, r = e / (MLA_DK / 4), d = 4 * (e % (MLA_DK / 4));
        if (e < TC_M * MLA_DK / 4) {
            uint2 w;
            w.x = tc_pack(v[u].x, v[u].y);
            w.y = tc_pack(v[u].z, v[u].w);
            *(uint2 *)(qs + r * TC_KP + d) = w;
        }
    }
}

/* att_args as sd__cuda_attn_mla fills it (group = H, Dv = C = 512), G = 16 */
__global__ void __launch_bounds__(TC_THREADS, 2) mla_tc_kernel(const __grid_constant__ att_args a)
{
    SD_PDL_ENTER(a);
    extern __shared__ __align__(16) unsigned char tsm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)tsm;              /* (TC_KT, TC_KP) key tile */
    __nv_bfloat16 *qs = (__nv_bfloat16 *)(tsm + TC_OFF_Q); /* (TC_M, TC_KP) queries */
    float *ss = (float *)(tsm + TC_OFF_S);                 /* (TC_M, TC_SP) scores */
    __nv_bfloat16 *ps = (__nv_bfloat16 *)(tsm + TC_OFF_P); /* (TC_M, TC_PP) probabilities */
    float *mrun = (float *)(tsm + TC_OFF_ST);              /* (TC_M) running max */
    float *lrun = mrun + TC_M;                             /* (TC_M) running sum */
    float *alpha = lrun + TC_M;                            /* (TC_M) rescale of this tile */
    int *slots = (int *)(tsm + TC_OFF_SLOT);               /* (TC_KT) */
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tq = lane % 4;
    const int t = blockIdx.x, h0 = blockIdx.y * TC_M;
    const int G = a.group - h0 < TC_M ? a.group - h0 : TC_M;
    int j_lo, n;
    if (!block_chunk(a, t, &j_lo, &n))
        return;

    /* queries to bf16 once; rows past the group's heads are zeros (their
     * scores are 0, finite, and their outputs are not written) */
    tc_load_q(qs, a, t, h0, G);
    if (tid < TC_M) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
    float acc[8][4]; /* output columns 64 warp + 8 i + (2 tq, 2 tq + 1), rows g and g + 8 */
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            acc[i][k] = 0.0f;
    /* ldmatrix row addresses of this lane: A fragments (16 rows, 8 of k at
     * k0 + 8 (lane / 16)), B fragments of K^T (keys 8 warp + lane % 8, 8 of
     * k at k0 + 8 (lane / 8)), B fragments of V (keys k0 + lane % 16,
     * columns 64 warp + 8 (lane / 16)) */
    const __nv_bfloat16 *qa = qs + (lane % 16) * TC_KP + (lane / 16) * 8;
    const __nv_bfloat16 *kb = ks + (warp * 8 + lane % 8) * TC_KP + (lane / 8) * 8;
    const __nv_bfloat16 *pa = ps + (lane % 16) * TC_PP + (lane / 16) * 8;
    const __nv_bfloat16 *vb = ks + (lane % 16) * TC_KP + warp * 64 + (lane / 16) * 8;
    __syncthreads();

    for (int j0 = j_lo; j0 < n; j0 += TC_KT) {
        const int kt = n - j0 < TC_KT ? n - j0 : TC_KT;
        if (tid < kt) {
            const int p = j0 + tid;
            slots[tid] = bt[p / a.block_size] * a.block_size + p % a.block_size;
        }
        __syncthreads();
        /* the tile: float4 e of the tile is row e / 144, columns 4 (e % 144);
         * rows past kt are zeros (a stale bf16 NaN times p = 0 would spread).
         * Batches of TC_LOADS loads, not unrolled across batches: unrolled,
         * the compiler overlaps them past 128 registers and spills */
#pragma unroll 1
        for (int b0 = 0; b0 < TC_KT * (MLA_DK / 4) / TC_THREADS; b0 += TC_LOADS) {
            uint4 v[TC_LOADS];
#pragma unroll
            for (int u = 0; u < TC_LOADS; u++) {
                const int e = (b0 + u) * TC_THREADS + tid, jj = e / (MLA_DK / 4);
                const int c4 = e % (MLA_DK / 4);
                v[u] = jj < kt ? sd__ld_stream(a.kc + (size_t)slots[jj] * MLA_DK + 4 * c4)
                               : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < TC_LOADS; u++) {
                const int e = (b0 + u) * TC_THREADS + tid, jj = e / (MLA_DK / 4);
                const int c4 = e % (MLA_DK / 4);
                uint2 w;
                w.x = tc_pack(__uint_as_float(v[u].x), __uint_as_float(v[u].y));
                w.y = tc_pack(__uint_as_float(v[u].z), __uint_as_float(v[u].w));
                *(uint2 *)(ks + jj * TC_KP + 4 * c4) = w;
            }
        }
        __syncthreads();
        /* scores of keys 8 warp .. 8 warp + 7 */
        {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 6
            for (int k0 = 0; k0 < MLA_DK; k0 += 32) {
                uint32_t a0[4], a1[4], b[4];
                tc_ldsm4(a0, qa + k0);
                tc_ldsm4(a1, qa + k0 + 16);
                tc_ldsm4(b, kb + k0);
                sd__mma_bf16(d, a0, b[0], b[1]);
                sd__mma_bf16(d, a1, b[2], b[3]);
            }
            /* d0: (row g, key 2 tq), d1: (g, 2 tq + 1), d2, d3: row g + 8 */
            const int c = warp * 8 + 2 * tq;
            ss[g * TC_SP + c] = c < kt ? d[0] * a.scale : -INFINITY;
            ss[g * TC_SP + c + 1] = c + 1 < kt ? d[1] * a.scale : -INFINITY;
            ss[(g + 8) * TC_SP + c] = c < kt ? d[2] * a.scale : -INFINITY;
            ss[(g + 8) * TC_SP + c + 1] = c + 1 < kt ? d[3] * a.scale : -INFINITY;
        }
        __syncthreads();
        /* online softmax: rows warp and warp + 8, keys lane and lane + 32; a
         * chunk's first tile holds its first key, so the max is finite */
        for (int r = warp; r < TC_M; r += TC_WARPS) {
            const float v0 = ss[r * TC_SP + lane], v1 = ss[r * TC_SP + lane + 32];
            const float mo = mrun[r], mn = fmaxf(mo, sd__warp_max(fmaxf(v0, v1)));
            const __nv_bfloat16 p0 = __float2bfloat16_rn(v0 == -INFINITY ? 0.0f : expf(v0 - mn));
            const __nv_bfloat16 p1 = __float2bfloat16_rn(v1 == -INFINITY ? 0.0f : expf(v1 - mn));
            ps[r * TC_PP + lane] = p0;
            ps[r * TC_PP + lane + 32] = p1;
            const float sum = sd__warp_sum(__bfloat162float(p0) + __bfloat162float(p1));
            if (lane == 0) {
                const float al = mo == -INFINITY ? 0.0f : expf(mo - mn);
                mrun[r] = mn;
                lrun[r] = lrun[r] * al + sum;
                alpha[r] = al;
            }
        }
        __syncthreads();
        /* O = alpha O + P V over this warp's 64 columns */
        {
            const float al0 = alpha[g], al1 = alpha[g + 8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                acc[i][0] *= al0;
                acc[i][1] *= al0;
                acc[i][2] *= al1;
                acc[i][3] *= al1;
            }
#pragma unroll
            for (int k0 = 0; k0 < TC_KT; k0 += 16) {
                uint32_t pf[4];
                tc_ldsm4(pf, pa + k0);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    /* matrices: keys k0.. / k0+8.. of columns 16 np, then of 16 np + 8 */
                    uint32_t b[4];
                    tc_ldsm4_t(b, vb + k0 * TC_KP + np * 16);
                    sd__mma_bf16(acc[2 * np], pf, b[0], b[1]);
                    sd__mma_bf16(acc[2 * np + 1], pf, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* the tile, slots and p are rewritten next */
    }
    const int Dv = MLA_C;
    if (a.S > 1) {
        /* partial (T, H, S, Dv + 2): unnormalized acc, max, sum (a chunk
         * that holds positions: blocks past them returned at the start) */
        const int W = Dv + 2;
        float *pt = a.part + ((size_t)t * (size_t)a.group + (size_t)h0) * (size_t)a.S * W +
                    (size_t)blockIdx.z * W;
        const size_t hs = (size_t)a.S * W; /* one head further */
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = g + (k >> 1) * 8, col = warp * 64 + i * 8 + 2 * tq + (k & 1);
                if (r < G)
                    pt[(size_t)r * hs + col] = acc[i][k];
            }
        if (tid < G) {
            pt[(size_t)tid * hs + Dv] = mrun[tid];
            pt[(size_t)tid * hs + Dv + 1] = lrun[tid];
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = g + (k >> 1) * 8, col = warp * 64 + i * 8 + 2 * tq + (k & 1);
            if (r < G)
                a.out[(size_t)t * a.o_tok + (size_t)(h0 + r) * a.o_head + col] = acc[i][k] / lrun[r];
        }
}

/* mla_dec_kernel's fold: output dims d .. d + 3 of a head merged from its
 * nz partial rows (p: chunk z's at p + z W; MLA_C values, the max, the
 * sum), written by other blocks of this kernel, so read through L2
 * (__ldcg). The numbers of merge_fast and merge_head: the max over the
 * chunks, each chunk's scale exp(m - M), the sum L and each dim's sum in
 * chunk order, then o / L. Up to MERGE_FAST chunks the loads are issued
 * at once (one round trip); past that the max is taken first. */
__device__ __forceinline__ float4 fold_merge4(const float *p, int W, int nz, int d)
{
    float M = -INFINITY;
    if (nz > MERGE_FAST)
        for (int z = 0; z < nz; z++)
            M = fmaxf(M, __ldcg(p + (size_t)z * W + MLA_C));
    float L = 0.0f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int z0 = 0; z0 < nz; z0 += MERGE_FAST) {
        float mv[MERGE_FAST], lv[MERGE_FAST];
        float2 oa[MERGE_FAST], ob[MERGE_FAST];
#pragma unroll
        for (int u = 0; u < MERGE_FAST; u++) {
            const float *pz = p + (size_t)(z0 + u) * W;
            const bool in = z0 + u < nz;
            mv[u] = in ? __ldcg(pz + MLA_C) : -INFINITY;
            lv[u] = in ? __ldcg(pz + MLA_C + 1) : 0.0f;
            oa[u] = in ? __ldcg((const float2 *)(pz + d)) : make_float2(0.f, 0.f);
            ob[u] = in ? __ldcg((const float2 *)(pz + d) + 1) : make_float2(0.f, 0.f);
        }
        if (nz <= MERGE_FAST)
#pragma unroll
            for (int u = 0; u < MERGE_FAST; u++)
                if (u < nz)
                    M = fmaxf(M, mv[u]);
#pragma unroll
        for (int u = 0; u < MERGE_FAST; u++)
            if (z0 + u < nz) {
                const float sc = mv[u] == -INFINITY ? 0.0f : expf(mv[u] - M);
                L += lv[u] * sc;
                o.x += oa[u].x * sc;
                o.y += oa[u].y * sc;
                o.z += ob[u].x * sc;
                o.w += ob[u].y * sc;
            }
    }
    return make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
}

/* ---- MLA decode, fp32, a lane per dims -----------------------------------
 *
 * Steps of <= SPLIT_MAX_T tokens at the DeepSeek latent shape (C = 512,
 * R = 64), on by default (SPECD_MLA_DEC=0: the tensor-core kernel):
 * attn_dec_kernel's design for MLA rows. A block takes a token, 2 heads and
 * a chunk of whole 32-key tiles; each warp takes 4 keys of a tile, loading
 * their rows straight from the cache (a lane: 4 16-byte loads of the latent,
 * one 8-byte load of the rope key, for 4 keys: 20 loads in flight), and a
 * lane holds 16 latent + 2 rope dims of both heads' queries and 16 latent
 * dims of both heads' output accumulators (the values are the rows' first
 * 512 floats: the loaded keys). A score is 18 FMAs a lane and the warp
 * butterfly for 4 keys x 2 heads at once; the online softmax as
 * attn_kernel's (softmax_tile); the 8 warps' accumulators are added in warp
 * order at the end.
 *
 * Its first version (bb4734f: 16 heads a block, a warp owning 2 heads over
 * all 32 keys of a tile staged in 72 KB of shared memory) was correct and
 * no faster than mla_tc_kernel at short contexts (14.5 vs 13.4 us a layer
 * on V2-Lite, bench/results/mla-dec.json): ~2200 dependent FMAs a lane a
 * tile and 3 staging round trips. Here a lane has ~270 FMAs a tile and one
 * round trip, with 8 times the blocks.
 *
 * A chunk's tiles are walked with the next tile's keys loading while this
 * one is used, and the slots (the keys' addresses) two tiles ahead (PIPE;
 * 242 registers, a block an SM either way): a chunk of several tiles walked
 * one round trip at a time cost ~1.4 us a tile. A token uses at most the
 * chunks of one wave of blocks (a.used_max: V2-Lite's 8 head pairs, 16 of
 * the grid's 33): at 4k positions 16 chunks of 8 tiles ran V2-Lite 6.6%
 * faster a step than 31 of 4 in two waves, one tile at a time; at 64-192
 * positions (the same 2-6 chunks of a tile) 0.8% slower, and longer chunks
 * there (SPECD_MLA_MIN_CHUNK=128, 256: no merge below 256 positions) 3.6%
 * and 4.5% slower: the chunks' parallelism beats the merge's round trip
 * (bench/results/NOTES.md, session 18). SPECD_MLA_PIPE=0: one tile at a
 * time, no cap (the kernel before; other bits past 16 chunks' positions).
 * A token whose positions fill one chunk is written whole by its block (the
 * merge leaves it). With a.fold (SPECD_MLA_FOLD) there is no merge kernel:
 * each block counts its chunk done for its (token, head pair), and the
 * block that counts the last one merges the pair's partials
 * (fold_merge4), one launch less a layer; it counts with one
 * release-acquire atomic a block (a.fold_rel: +0.3% on V2-Lite at batch 1
 * against a fence in every thread before and after). EARLY: the token's
 * position, chunk and first two tiles' slots are read before the PDL wait
 * (step inputs: common.cuh, SD_PDL_STEP_INPUTS), three dependent round
 * trips off the step's chain: +1.4% at V2-Lite's batch 1; a merge through
 * a thread-block cluster's shared memory instead of the fold was 0.4%
 * slower (bench/results/NOTES.md, session 26).
 *
 * Bits: a token's result depends on its positions and the chunk count,
 * which comes from the head layout (mla_split, used_max), never on the
 * step's other tokens. */
#define MD_KW 4  /* keys a warp takes of a tile */
#define MD_GH 2  /* heads a block */
#define MD_WARPS (KT / MD_KW)
static_assert(MD_WARPS * 32 == ATT_THREADS, "a block: 8 warps of 4 keys");

template <bool PIPE, bool EARLY>
__global__ void __launch_bounds__(ATT_THREADS) mla_dec_kernel(const __grid_constant__ att_args a)
{
    constexpr int V = MD_KW * MD_GH; /* a warp's scores a tile: key i, head g at i * MD_GH + g */
    __shared__ float S[MD_GH][KT];
    __shared__ float mrun[MD_GH], lrun[MD_GH], alpha[MD_GH];
    __shared__ float4 red[MD_WARPS][MD_GH][4][32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int t = blockIdx.x, h0 = blockIdx.y * MD_GH;
    const int G = a.group - h0 < MD_GH ? a.group - h0 : MD_GH;
    /* the token's position, its chunk, and the cache slots of its first
     * two tiles: step inputs (EARLY: read before the wait, see
     * SD_PDL_STEP_INPUTS in common.cuh), the slots otherwise after the
     * query's loads are issued */
    int pt = 0, j_lo = 0, n = 0, s0 = 0, s1 = 0;
    const int32_t *bt = NULL;
    auto chunk = [&]() {
        pt = a.pos[t];
        return block_chunk_at(a, pt, &j_lo, &n);
    };
    auto slots = [&]() {
        bt = a.block_table + (size_t)a.seq[t] * (size_t)a.max_blocks;
        s0 = dec_slot(a, bt, j_lo, n, lane);
        s1 = PIPE && j_lo + KT < n ? dec_slot(a, bt, j_lo + KT, n, lane) : 0;
    };
    if (EARLY)
        SD_PDL_PRE(a);
    else
        SD_PDL_ENTER(a);
    if (!chunk())
        return;
    if (EARLY) {
        slots();
        SD_PDL_POST();
    }
    /* a lane's dims: latent float4s lane + 32 m (m = 0..3), rope float2 lane */
    float4 qc[MD_GH][4], acc[MD_GH][4];
    float2 qp[MD_GH];
#pragma unroll
    for (int g = 0; g < MD_GH; g++) {
        const int h = g < G ? h0 + g : h0; /* a head past H: computed, not written */
        const float4 *q1 = (const float4 *)(a.q1 + (size_t)t * a.q1_tok + (size_t)h * a.q1_head);
        const float2 *q2 = (const float2 *)(a.q2 + (size_t)t * a.q2_tok + (size_t)h * a.q2_head);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            qc[g][m] = md_ld<EARLY>(q1 + lane + 32 * m);
            acc[g][m] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        qp[g] = md_ld<EARLY>(q2 + lane);
    }
    if (tid < MD_GH) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    if (!EARLY)
        slots();
    /* a warp's MD_KW keys of the tile at j0 (slot: the lane's key's) */
    auto load = [&](float4 (&kc)[MD_KW][4], float2 (&kp)[MD_KW], int j0, int slot) {
#pragma unroll
        for (int i = 0; i < MD_KW; i++) {
            const int key = warp * MD_KW + i;
            const size_t sl = (size_t)__shfl_sync(0xffffffffu, slot, key);
            const bool in = j0 + key < n && !(a.abl & SD__AB_KEYS);
            const float *row = a.kc + sl * (size_t)a.k_slot;
#pragma unroll
            for (int m = 0; m < 4; m++)
                kc[i][m] = in ? md_ld<EARLY>((const float4 *)row + lane + 32 * m)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
            kp[i] = in ? md_ld<EARLY>((const float2 *)(row + MLA_C) + lane) : make_float2(0.f, 0.f);
        }
    };
    auto step = [&](const float4 (&kc)[MD_KW][4], const float2 (&kp)[MD_KW], int j0) {
        float sc[V];
#pragma unroll
        for (int i = 0; i < MD_KW; i++)
#pragma unroll
            for (int g = 0; g < MD_GH; g++) {
                float x = dec_dot(qc[g][0], kc[i][0], 0.0f);
                x = dec_dot(qc[g][1], kc[i][1], x);
                x = dec_dot(qc[g][2], kc[i][2], x);
                x = dec_dot(qc[g][3], kc[i][3], x);
                x = fmaf(qp[g].x, kp[i].x, x);
                sc[i * MD_GH + g] = fmaf(qp[g].y, kp[i].y, x);
            }
        sd__xreduce<V>(sc, lane);
        dec_softmax<V, MD_GH, MD_KW>(S, mrun, lrun, alpha, sc[0], a, lane, warp, G, j0, n);
#pragma unroll
        for (int g = 0; g < MD_GH; g++) {
            if (g < G) {
#pragma unroll
                for (int m = 0; m < 4; m++)
                    dec_scale(acc[g][m], alpha[g]);
#pragma unroll
                for (int i = 0; i < MD_KW; i++) {
                    const float pr = S[g][warp * MD_KW + i];
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        dec_axpy(acc[g][m], pr, kc[i][m]);
                }
            }
        }
        __syncthreads(); /* S and alpha are rewritten by the next tile */
    };
    /* two tiles in flight: the next tile's keys load while this one is
     * used, the slots two tiles ahead (the keys' addresses) before that
     * (a chunk of several tiles walked one round trip at a time cost ~1.4
     * us a tile: bench/results/NOTES.md, session 17) */
    float4 ka[MD_KW][4], kb[MD_KW][4];
    float2 pa[MD_KW], pb[MD_KW];
    if (!PIPE) {
        for (int j0 = j_lo; j0 < n; j0 += KT) {
            load(ka, pa, j0, j0 == j_lo ? s0 : dec_slot(a, bt, j0, n, lane));
            step(ka, pa, j0);
        }
    } else {
        load(ka, pa, j_lo, s0);
        for (int j0 = j_lo; j0 < n; j0 += 2 * KT) {
            const int s2 = j0 + 2 * KT < n ? dec_slot(a, bt, j0 + 2 * KT, n, lane) : 0;
            if (j0 + KT < n)
                load(kb, pb, j0 + KT, s1);
            step(ka, pa, j0);
            if (j0 + KT >= n)
                break;
            s1 = j0 + 3 * KT < n ? dec_slot(a, bt, j0 + 3 * KT, n, lane) : 0;
            if (j0 + 2 * KT < n)
                load(ka, pa, j0 + 2 * KT, s2);
            step(kb, pb, j0 + KT);
        }
    }
#pragma unroll
    for (int g = 0; g < MD_GH; g++)
        if (g < G)
#pragma unroll
            for (int m = 0; m < 4; m++)
                red[warp][g][m][lane] = acc[g][m];
    __syncthreads();
    /* thread tid: head g of the block, its output dims d .. d + 3 (threads
     * past the block's heads take none, and stay for the barriers below) */
    const bool mine = tid < G * 128;
    const int g = mine ? tid / 128 : 0, m = tid / 32 % 4, h = h0 + g;
    const int d = 4 * (lane + 32 * m);
    float4 o = red[0][g][m][lane];
#pragma unroll
    for (int w = 1; w < MD_WARPS; w++) {
        const float4 r = red[w][g][m][lane];
        o.x += r.x;
        o.y += r.y;
        o.z += r.z;
        o.w += r.w;
    }
    if (a.S > 1 && !written_whole_at(a, pt)) {
        /* a partial row is 514 floats: 8-byte aligned */
        const int W = MLA_C + 2;
        const float *p0 = a.part + ((size_t)t * a.group + (size_t)h) * a.S * W;
        float *pp = (float *)p0 + (size_t)blockIdx.z * W;
        if (mine) {
            ((float2 *)(pp + d))[0] = make_float2(o.x, o.y);
            ((float2 *)(pp + d))[1] = make_float2(o.z, o.w);
            if (tid % 128 == 0) {
                pp[MLA_C] = mrun[g];
                pp[MLA_C + 1] = lrun[g];
            }
        }
        if (!a.fold || (a.abl & SD__AB_FOLD))
            return;
        /* the fold: the block that counts the pair's last chunk merges it
         * (each thread's partial stores made visible before the count) */
        __shared__ int last;
        const int nz = split_used(a, pt + 1);
        unsigned *cnt = a.fold + (size_t)t * a.ngb + blockIdx.y;
        /* a.fold_rel: the block's stores, then one thread's count with
         * release and acquire semantics: the stores before the barrier are
         * ordered before it, and the last block's reads after the barrier
         * after it (no fence in every thread: MEMBAR.SC.GPU and an L1
         * invalidation, twice) */
        if (!a.fold_rel)
            __threadfence();
        __syncthreads();
        if (tid == 0)
            last = (a.fold_rel ? sd__atom_add_acq_rel(cnt, 1u) : atomicAdd(cnt, 1u)) ==
                   (unsigned)nz - 1;
        __syncthreads();
        if (!last)
            return;
        if (!a.fold_rel)
            __threadfence();
        if (tid == 0)
            *cnt = 0; /* zero for the next call (a graph replay too) */
        if (mine) {
            const float4 r = fold_merge4(p0, W, nz, d);
            *(float4 *)(a.out + (size_t)t * a.o_tok + (size_t)h * a.o_head + d) = r;
        }
        return;
    }
    if (!mine)
        return;
    const float L = lrun[g];
    *(float4 *)(a.out + (size_t)t * a.o_tok + (size_t)h * a.o_head + d) =
        make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
}

/* kcache/vcache (slots, Hkv, D/Dv) at slot[t] = k/v of token t */
__global__ void kv_store_kernel(float *kc, float *vc, const float *k, const float *v,
                                const int32_t *slot, int Hkv, int D, int Dv, int kv_stride)
{
    SD_PDL_ENTER(kc, vc, k, v, slot, Hkv, D, Dv, kv_stride);
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
    SD_PDL_ENTER(cache, c, kpe, slot, C, R, ck_stride);
    int t = blockIdx.x;
    float *dst = cache + (size_t)slot[t] * (size_t)(C + R);
    for (int e = threadIdx.x; e < C + R; e += blockDim.x)
        dst[e] = e < C ? c[(size_t)t * ck_stride + e] : kpe[(size_t)t * ck_stride + (e - C)];
}

int sd__cuda_attention_init(sd__cuda *c)
{
    /* the dynamic part may take what the kernel's static shared memory
     * leaves of a block's limit */
    cudaFuncAttributes fa[2];
    if (SD_CUDA(c, cudaFuncGetAttributes(&fa[0], attn_kernel<true>)) ||
        SD_CUDA(c, cudaFuncGetAttributes(&fa[1], attn_kernel<false>)))
        return SD_EDEVICE;
    size_t st = fa[0].sharedSizeBytes > fa[1].sharedSizeBytes ? fa[0].sharedSizeBytes
                                                              : fa[1].sharedSizeBytes;
    c->attn_dyn_max = c->smem_optin > st ? c->smem_optin - st : 0;
    int limit = (int)c->attn_dyn_max;
    if (SD_CUDA(c, cudaFuncSetAttribute(attn_kernel<true>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, limit)) ||
        SD_CUDA(c, cudaFuncSetAttribute(attn_kernel<false>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, limit)))
        return SD_EDEVICE;
    /* blocks an SM of the MLA decode kernel (its split's wave; the two
     * pipelined forms, the fewer) */
    int bps_early = 0;
    if (SD_CUDA(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c->mla_dec_bps,
                                                                 mla_dec_kernel<true, false>,
                                                                 ATT_THREADS, 0)) ||
        SD_CUDA(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps_early,
                                                                 mla_dec_kernel<true, true>,
                                                                 ATT_THREADS, 0)))
        return SD_EDEVICE;
    if (bps_early < c->mla_dec_bps)
        c->mla_dec_bps = bps_early;
    if (c->mla_dec_bps < 1)
        c->mla_dec_bps = 1;
    if (c->smem_optin < TC_SMEM)
        return 0; /* the tensor-core MLA kernel does not fit: attn_mla keeps the SIMT kernel */
    if (SD_CUDA(c, cudaFuncSetAttribute(mla_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        TC_SMEM)))
        return SD_EDEVICE;
    /* as much of L1 as shared memory as there is: two blocks a SM */
    return SD_CUDA(c, cudaFuncSetAttribute(mla_tc_kernel,
                                           cudaFuncAttributePreferredSharedMemoryCarveout,
                                           (int)cudaSharedmemCarveoutMaxShared));
}

/* every row attn_kernel reads is 16-byte aligned and a whole number of
 * float4s: queries, keys and values */
static int att_vec(const att_args *a)
{
    int ok = a->D1 % 4 == 0 && a->D2 % 4 == 0 && a->Dv % 4 == 0;
    ok = ok && sd__aligned16(a->q1) && a->q1_tok % 4 == 0 && a->q1_head % 4 == 0;
    ok = ok && (a->D2 == 0 || (sd__aligned16(a->q2) && a->q2_tok % 4 == 0 && a->q2_head % 4 == 0));
    ok = ok && sd__aligned16(a->kc) && a->k_slot % 4 == 0 && a->k_head % 4 == 0;
    return ok && (a->v_is_k || (sd__aligned16(a->vc) && a->v_slot % 4 == 0 && a->v_head % 4 == 0));
}

static void launch_merge(sd__cuda *c, const att_args *a, int T, int Hq)
{
    if (c->ablate & SD__AB_MERGE)
        return;
    unsigned z = (unsigned)((a->Dv + MERGE_THREADS - 1) / MERGE_THREADS);
    sd__launch(c, attn_merge_kernel, dim3((unsigned)T, (unsigned)Hq, z), MERGE_THREADS, 0, *a, Hq);
}

/* Chunks per token of the split path (T <= SPLIT_MAX_T): two blocks a SM
 * from the head layout (Hkv KV heads, ngb blocks each), at most SPLIT_MAX
 * and what the partials buffer holds; 1: no split. */
static int split_count(const sd__cuda *c, int Hkv, int ngb, int Hq, int Dv)
{
    if (!c->attn_part)
        return 1;
    int S = (2 * c->sm_count + Hkv * ngb - 1) / (Hkv * ngb);
    size_t per_s = (size_t)SPLIT_MAX_T * (size_t)Hq * (size_t)(Dv + 2) * sizeof(float);
    if (S > SPLIT_MAX)
        S = SPLIT_MAX;
    if ((size_t)S * per_s > c->attn_part_bytes)
        S = (int)(c->attn_part_bytes / per_s);
    return S > 1 ? S : 1;
}

/* The chunks of a step of T tokens, from S, the head layout's for steps of
 * up to SPLIT_MAX_T (c->attn_split_all):
 *   T <= SPLIT_MAX_T    S;
 *   level >= lvl and the partials buffer holds S chunks of T tokens' Hq
 *                       heads: S (a token's bits as in a decode step);
 *   level >= fit        as many chunks as the buffer holds, up to S;
 *   else                1: each token's positions whole.
 * The general kernel splits larger steps from level 1 (the default), as
 * many chunks as fit from level 2; the DeepSeek latent kernel both from
 * level 1 (V2-Lite at batch 32: +52% at 3968-token contexts, +1% at 64:
 * bench/results/NOTES.md, session 16); the 128-dim GQA kernel both from
 * level 2 (the 8B at batch 32: +10% at 3968, -2.1% at 64). */
static int split_for_step(const sd__cuda *c, int S, int T, int Hq, int Dv, int lvl, int fit)
{
    if (T <= SPLIT_MAX_T || S <= 1)
        return S;
    if (c->attn_split_all < lvl)
        return 1;
    const size_t per = (size_t)T * (size_t)Hq * (size_t)(Dv + 2) * sizeof(float);
    if ((size_t)S * per <= c->attn_part_bytes)
        return S;
    if (c->attn_split_all < fit)
        return 1;
    const size_t held = c->attn_part_bytes / per;
    return held > 1 ? (int)held : 1;
}

/* attn_dec_kernel takes 128-dim heads (every row 16-byte aligned, the
 * output too), SPECD_ATTN_DEC=0 aside: split into chunks for steps of <=
 * SPLIT_MAX_T tokens, whole for larger ones unless SPECD_ATTN_SPLIT_ALL=2
 * (split_for_step; a batch-32 decode step: the 8B's attention took 47 us a
 * layer on attn_kernel) */
static int dec_takes(const sd__cuda *c, const att_args *a)
{
    return c->attn_dec && !a->v_is_k && a->D1 == DEC_D && a->D2 == 0 &&
           a->Dv == DEC_D && att_vec(a) && sd__aligned16(a->out) && a->o_tok % 4 == 0 &&
           a->o_head % 4 == 0;
}

template <bool EARLY> static void launch_dec_g(sd__cuda *c, const att_args *a, dim3 grid)
{
    if (a->G > 4)
        sd__launch(c, attn_dec_kernel<8, EARLY>, grid, ATT_THREADS, 0, *a);
    else if (a->G > 2)
        sd__launch(c, attn_dec_kernel<4, EARLY>, grid, ATT_THREADS, 0, *a);
    else if (a->G > 1)
        sd__launch(c, attn_dec_kernel<2, EARLY>, grid, ATT_THREADS, 0, *a);
    else
        sd__launch(c, attn_dec_kernel<1, EARLY>, grid, ATT_THREADS, 0, *a);
}

static void launch_dec(sd__cuda *c, att_args *a, int T, int Hkv)
{
    a->G = a->group < DEC_MAX_G ? a->group : DEC_MAX_G;
    a->ngb = (a->group + a->G - 1) / a->G;
    a->tile = KT;
    a->min_chunk = 0;
    a->S = split_for_step(c, split_count(c, Hkv, a->ngb, Hkv * a->group, a->Dv), T,
                          Hkv * a->group, a->Dv, 2, 2);
    a->part = a->S > 1 ? c->attn_part : NULL;
    dim3 grid((unsigned)T, (unsigned)(Hkv * a->ngb), (unsigned)a->S);
    if (sd__early_inputs(c))
        launch_dec_g<true>(c, a, grid);
    else
        launch_dec_g<false>(c, a, grid);
    if (SD_LAUNCHED(c, "attn_dec_kernel") || a->S == 1)
        return;
    launch_merge(c, a, T, Hkv * a->group);
    SD_LAUNCHED(c, "attn_merge_kernel");
}

static void launch(sd__cuda *c, att_args *a, int T, int Hkv, const char *what)
{
    if (dec_takes(c, a)) {
        launch_dec(c, a, T, Hkv);
        return;
    }
    a->G = a->group < MAX_G ? a->group : MAX_G;
    while (a->G > 1 && smem_bytes(a) > c->attn_dyn_max)
        a->G = (a->G + 1) / 2;
    size_t sm = smem_bytes(a);
    if (sm > c->attn_dyn_max) {
        SD_BADARG(c, "%s: head dims %d+%d/%d need %zu bytes of shared memory (limit %zu)", what,
                  a->D1, a->D2, a->Dv, sm, c->attn_dyn_max);
        return;
    }
    a->ngb = (a->group + a->G - 1) / a->G;
    a->tile = KT;
    a->min_chunk = 0;
    /* split each token's positions so the blocks fill the GPU: the head
     * layout's chunks for a step of up to SPLIT_MAX_T tokens, and for a
     * larger one whose partials the buffer holds (split_for_step: verify
     * steps of 9+ rows, a batch's decode; the same chunks, so a token's
     * bits do not depend on the step it is in); else whole */
    int Hq = Hkv * a->group;
    a->S = split_for_step(c, split_count(c, Hkv, a->ngb, Hq, a->Dv), T, Hq, a->Dv, 1, 2);
    a->part = a->S > 1 ? c->attn_part : NULL;
    dim3 grid((unsigned)T, (unsigned)(Hkv * a->ngb), (unsigned)a->S);
    if (att_vec(a))
        sd__launch(c, attn_kernel<true>, grid, ATT_THREADS, sm, *a, tile_stride(a));
    else
        sd__launch(c, attn_kernel<false>, grid, ATT_THREADS, sm, *a, tile_stride(a));
    if (SD_LAUNCHED(c, "attn_kernel") || a->S == 1)
        return;
    launch_merge(c, a, T, Hq);
    SD_LAUNCHED(c, "attn_merge_kernel");
}

/* Whether mla_tc_kernel takes this attn_mla call: switched on, the DeepSeek
 * latent shape, float4-aligned cache and query rows, the shared memory there. Nothing
 * here depends on the number of tokens (decode and verify take one path). */
static int mla_tc_takes(const sd__cuda *c, int C, int R, const void *cache, const att_args *a)
{
    return c->mla_tc && C == MLA_C && R == MLA_R && sd__aligned16(cache) &&
           c->smem_optin >= (size_t)TC_SMEM && att_vec(a);
}

/* Chunks per token for steps of <= SPLIT_MAX_T tokens: enough blocks for two
 * a SM, from the head layout alone (H heads in blocks of gh). */
static int mla_split(const sd__cuda *c, int H, int gh)
{
    int ngb = (H + gh - 1) / gh;
    int S = (2 * c->sm_count + ngb - 1) / ngb;
    size_t per_s = (size_t)SPLIT_MAX_T * (size_t)H * (size_t)(MLA_C + 2) * sizeof(float);
    if (S > TC_SPLIT_MAX)
        S = TC_SPLIT_MAX;
    if (!c->attn_part)
        S = 1;
    else if ((size_t)S * per_s > c->attn_part_bytes)
        S = (int)(c->attn_part_bytes / per_s);
    return S > 1 ? S : 1;
}

/* Whether mla_dec_kernel takes this attn_mla call: switched on (SPECD_MLA_DEC,
 * sd_cuda_set_mla_dec), a step of <= SPLIT_MAX_T tokens at the DeepSeek
 * latent shape, float4-aligned rows (the rope query's float2-aligned), the
 * shared memory there */
static int mla_dec_takes(const sd__cuda *c, int C, int R, const void *cache, const att_args *a,
                         int T)
{
    return c->mla_dec && T <= SPLIT_MAX_T && C == MLA_C && R == MLA_R && sd__aligned16(cache) &&
           att_vec(a) && sd__aligned16(a->out) && a->o_tok % 4 == 0 && a->o_head % 4 == 0;
}

/* keys a split chunk holds at least: SPECD_MLA_MIN_CHUNK rounded up to
 * whole tiles, else one tile */
static int mla_min_chunk(const sd__cuda *c, int tile)
{
    return c->mla_min_chunk > 0 ? (c->mla_min_chunk + tile - 1) / tile * tile : tile;
}

static void launch_mla_dec(sd__cuda *c, att_args *a, int T)
{
    a->G = MD_GH;
    a->ngb = (a->group + MD_GH - 1) / MD_GH;
    a->tile = KT;
    a->min_chunk = mla_min_chunk(c, KT);
    /* a token's chunks in use, at most one wave of blocks (the kernel's
     * comment has what that measured); the grid keeps mla_split's chunks:
     * a grid of one wave ran V2-Lite 3.1% slower at 64-192 positions, where
     * a token uses the same 2-6 either way (not understood; NOTES.md,
     * session 18) */
    const int wave = c->sm_count * c->mla_dec_bps / a->ngb;
    a->S = mla_split(c, a->group, MD_GH);
    a->used_max = c->mla_pipe ? (wave > 1 ? wave : 1) : 0;
    a->part = a->S > 1 ? c->attn_part : NULL;
    a->whole1 = 1;
    a->fold = c->mla_fold && a->part && T * a->ngb <= SD__MLA_FOLD_WORDS ? c->mla_fold_cnt : NULL;
    a->abl = c->ablate & (SD__AB_FOLD | SD__AB_SLOTS | SD__AB_KEYS);
    a->fold_rel = c->mla_fold_rel;
    dim3 grid((unsigned)T, (unsigned)a->ngb, (unsigned)a->S);
    if (c->mla_pipe && sd__early_inputs(c))
        sd__launch(c, mla_dec_kernel<true, true>, grid, ATT_THREADS, 0, *a);
    else if (c->mla_pipe)
        sd__launch(c, mla_dec_kernel<true, false>, grid, ATT_THREADS, 0, *a);
    else
        sd__launch(c, mla_dec_kernel<false, false>, grid, ATT_THREADS, 0, *a);
    if (SD_LAUNCHED(c, "mla_dec_kernel") || a->S == 1 || a->fold)
        return;
    launch_merge(c, a, T, a->group);
    SD_LAUNCHED(c, "attn_merge_kernel");
}

static void launch_mla_tc(sd__cuda *c, att_args *a, int T)
{
    a->G = TC_M;
    a->ngb = (a->group + TC_M - 1) / TC_M;
    a->tile = TC_KT;
    a->min_chunk = mla_min_chunk(c, TC_KT);
    a->S = split_for_step(c, mla_split(c, a->group, TC_M), T, a->group, MLA_C, 1, 1);
    a->part = a->S > 1 ? c->attn_part : NULL;
    dim3 grid((unsigned)T, (unsigned)a->ngb, (unsigned)a->S);
    sd__launch(c, mla_tc_kernel, grid, TC_THREADS, TC_SMEM, *a);
    if (SD_LAUNCHED(c, "mla_tc_kernel") || a->S == 1)
        return;
    launch_merge(c, a, T, a->group);
    SD_LAUNCHED(c, "attn_merge_kernel");
}

/* the step's rows and the paged cache of an attention op's arguments */
static void att_batch(att_args *a, const sd_attn_batch *b, float scale)
{
    a->pos = b->pos;
    a->seq = b->seq;
    a->block_table = b->block_table;
    a->max_blocks = b->max_blocks;
    a->block_size = b->block_size;
    a->scale = scale;
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
    if (k) { /* NULL: rope_kv stored this step's rows */
        sd__launch(c, kv_store_kernel, b->n_tokens, 256, 0, (float *)kcache, (float *)vcache, k, v,
                   b->slot, Hkv, D, Dv, kv_stride);
        if (SD_LAUNCHED(c, "kv_store_kernel"))
            return;
    }
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
    att_batch(&a, b, scale);
    launch(c, &a, b->n_tokens, Hkv, "attn_gqa");
}

void sd__cuda_attn_mla(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                       const float *c_lat, const float *k_pe, void *cache, const sd_attn_batch *b,
                       int H, int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                       float scale)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || b->n_tokens <= 0 || (c->ablate & SD__AB_ATTN))
        return;
    if (c_lat) { /* NULL: mla_prep stored this step's rows */
        sd__launch(c, latent_store_kernel, b->n_tokens, 256, 0, (float *)cache, c_lat, k_pe,
                   b->slot, C, R, ck_stride);
        if (SD_LAUNCHED(c, "latent_store_kernel"))
            return;
    }
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
    att_batch(&a, b, scale);
    if (mla_dec_takes(c, C, R, cache, &a, b->n_tokens))
        launch_mla_dec(c, &a, b->n_tokens);
    else if (mla_tc_takes(c, C, R, cache, &a))
        launch_mla_tc(c, &a, b->n_tokens);
    else
        launch(c, &a, b->n_tokens, 1, "attn_mla");
}

SD_KTRACE_EXPORT(attention)

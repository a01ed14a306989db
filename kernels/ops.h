/* kernels/ops.h: the ops contract. The forward pass of every architecture is
 * written once (src/target) against this table; kernels/cpu implements it as
 * the readable fp32 reference and CI oracle, kernels/cuda on the GPU.
 *
 * Conventions
 * - All pointers handed to ops are backend memory (device memory on CUDA,
 *   host memory on the CPU), from be->ops->alloc or sd_weight uploads.
 * - Activations are fp32, row-major. Shapes are given as comments:
 *   `// (T, D)` = T rows of D floats.
 * - Weights are sd_weight: a row-major [rows, cols] matrix of F32/F16/BF16
 *   (an nn.Linear's [out_features, in_features]), or of block-scaled FP8
 *   where the backend has weight_fp8; 1-D vectors have rows = 1.
 * - Ops do not fail and do not synchronize: launch errors are recorded in the
 *   backend and returned by sync(). Nothing in an op allocates.
 * - Work scales with the real context: attention walks each token's own
 *   positions 0..pos through the block table, never a maximum.
 */
#ifndef SD_KERNELS_OPS_H
#define SD_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct sd_backend sd_backend;

typedef struct sd_weight {
    const void *data; /* backend memory */
    sd_dtype dtype;
    int64_t rows, cols;
    /* F8_E4M3 only (block-scaled fp8, weight_fp8): element (r, c) is
     * E4M3(data[r][c]) x scale[(r / block[0]) * scale_cols + c / block[1]],
     * the product in F32 (the CPU's definition). CUDA: the GEMV (1-8 rows)
     * and the fused experts sum each 8 elements' exact E4M3 x activation
     * products, then scale the sum once; more rows and the tensor-core
     * experts read the weight dequantized to BF16 (the product rounded to
     * nearest even), what the GEMMs take. scale: backend memory. */
    const float *scale;
    int32_t block[2];
    int64_t scale_cols;
    const void *aux; /* the backend's own (the CPU's: FP8 code tables), or NULL */
} sd_weight;

/* Rotary embedding of one attention: inv_freq[rot_dim/2] in backend memory.
 * angle(pos, i) = (float)pos * inv_freq[i]; cos/sin multiplied by mscale. */
typedef struct sd_rope {
    const float *inv_freq; /* (rot_dim/2) */
    int rot_dim;
    int interleave; /* 1: pairs (2i, 2i+1); 0: halves (i, i + rot_dim/2) */
    float mscale;   /* yarn attention factor applied to cos and sin */
} sd_rope;

/* The tokens of one step, over a paged KV cache. Every sequence's tokens sit
 * at consecutive positions; token t attends to positions 0..pos[t] of its
 * sequence (causal), which are in the cache once this step's K/V are written.
 * Physical slot of position p of sequence s:
 *   block_table[s * max_blocks + p / block_size] * block_size + p % block_size */
typedef struct sd_attn_batch {
    int n_tokens;
    const int32_t *pos;         /* (T) */
    const int32_t *seq;         /* (T) sequence index of each token */
    const int32_t *slot;        /* (T) slot where the token's K/V go */
    const int32_t *block_table; /* (n_seqs, max_blocks) */
    int max_blocks;
    int block_size;
    int max_pos; /* largest pos in the batch + 1 (sizes scratch; never loops) */
} sd_attn_batch;

/* MoE routing parameters (DeepSeek-V3 style). A token's row of ids / wts
 * holds top_k routed slots, then n_always always-on slots: ids n_experts,
 * n_experts + 1, ... with weight 1 (shared experts held in the expert bank
 * after the routed ones, so moe_ffn runs them with the routed experts). */
typedef struct sd_moe_route {
    int n_experts, top_k, n_group, topk_group;
    int norm_topk_prob;
    int sigmoid; /* 1: sigmoid scores (V3), 0: softmax */
    float routed_scaling_factor;
    int n_always; /* always-on slots after the routed ones (0: none) */
} sd_moe_route;

/* One expert bank: n experts of gate/up [inter, D] and down [D, inter].
 * Expert parallelism: the bank holds experts first .. first + n - 1 of the
 * model (routing ids are global); tokens routed elsewhere add nothing here. */
typedef struct sd_experts {
    int n;
    const sd_weight *gate, *up, *down; /* arrays of n */
    int first;                         /* global id of gate[0] (0 unless expert parallel) */
} sd_experts;

#define SD_MOE_TMP_FLOATS(n, k, D, I) ((size_t)(n) * (size_t)(k) * (2 * (size_t)(D) + 2 * (size_t)(I) + 1))

/* Sampling parameters of one row of sample_rows (backend memory, an array of
 * n). The fields mean what sd_sampling's do (src/verify/sampling.h): the
 * distribution is sd_sampling_probs with temperature / top_p / top_k, the
 * uniform sd_rand_uniform(seed, counter, stream), counter being the output
 * position of the token the row decides. 32 bytes, no padding holes. */
typedef struct sd_sample_params {
    float temperature; /* <= 0: greedy */
    float top_p;       /* >= 1: off */
    int32_t top_k;     /* <= 0 or >= V: off */
    uint32_t stream;   /* the uniform's stream: SD_RNG_TARGET (0), SD_RNG_DRAFT for drafts;
                        * accept_sample_rows ignores it (its streams are fixed) */
    uint64_t seed;
    uint64_t counter;
} sd_sample_params;

/* One copy of `copies`: rows of width bytes, dst's rows dpitch bytes
 * apart, src's spitch */
typedef struct sd_copy {
    void *dst;
    const void *src;
    size_t width, rows, dpitch, spitch;
} sd_copy;
#define SD_COPIES_MAX 4 /* copies a `copies` call takes at most */

typedef struct sd_ops {
    const char *name;

    /* ---- memory ---- */
    void *(*alloc)(sd_backend *be, size_t bytes); /* NULL on failure */
    void (*free)(sd_backend *be, void *p);
    int (*upload)(sd_backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(sd_backend *be, void *dst, const void *src, size_t bytes);
    int (*memset0)(sd_backend *be, void *dst, size_t bytes);
    /* Makes a weight usable by the ops from host data (the CPU may keep the
     * pointer: checkpoint mappings outlive the model). */
    int (*weight)(sd_backend *be, sd_weight *out, const void *host, sd_dtype dt, int64_t rows,
                  int64_t cols);
    void (*weight_free)(sd_backend *be, sd_weight *w);
    /* Waits for queued work; returns the first recorded error (0 if none). */
    int (*sync)(sd_backend *be);
    /* Memory the backend can still allocate and its total, in bytes (device
     * memory on a GPU, available RAM on the CPU). For the memory plan. */
    int (*mem_info)(sd_backend *be, size_t *free_bytes, size_t *total_bytes);

    /* ---- ops ---- */
    /* out(n, D) = table[ids[i]] */
    void (*embed)(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids, int n);
    /* out(n, D) = x * rsqrt(mean(x^2) + eps) * w   (in place allowed) */
    void (*rmsnorm)(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                    int x_stride, int out_stride, float eps);
    /* y(n, w.rows) = x(n, w.cols) @ w^T (+ bias); x rows x_stride apart */
    void (*matmul)(sd_backend *be, float *y, const float *x, const sd_weight *w,
                   const sd_weight *bias, int n, int x_stride);
    /* Per-head matmul: y(n, H, N) = x(n, H, K) @ W_h^T where w is [H*N, K].
     * x rows x_stride apart, heads K apart from x_off; y is dense. */
    void (*matmul_heads)(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                         int H, int x_stride, int x_head_stride, int x_off);
    /* y(n, d) += x(n, d) */
    void (*add)(sd_backend *be, float *y, const float *x, int n, int d);
    /* out(n, I) = silu(gu[:, :I]) * gu[:, I:]  where gu is (n, 2I) */
    void (*silu_mul)(sd_backend *be, float *out, const float *gu, int n, int I);
    /* Rotates dims [off, off + rope.rot_dim) of each of H heads of x (n, H*head_stride)
     * (row stride row_stride floats) by each token's position. */
    void (*rope)(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                 int row_stride, int head_stride, int off);
    /* Copies rows: dst(n, d) (stride ds) = src(idx[i]) (stride ss). */
    void (*gather_rows)(sd_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                        int d, int ds, int ss);
    /* Copies a (n, d) block: dst rows ds apart, src rows ss apart. */
    void (*copy2d)(sd_backend *be, float *dst, const float *src, int n, int d, int ds, int ss);

    /* GQA attention over the paged cache. q (T, Hq, D) rows q_stride apart;
     * k, v (T, Hkv, D) / (T, Hkv, Dv) written into kcache/vcache (slots, Hkv, D)
     * at b->slot first (k NULL: rope_kv already did); out (T, Hq, Dv). scale
     * multiplies q.k. */
    void (*attn_gqa)(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                     void *kcache, void *vcache, const sd_attn_batch *b, int Hq, int Hkv, int D,
                     int Dv, int q_stride, int kv_stride, float scale);
    /* MLA attention with absorbed weights over the latent cache.
     * q_lat (T, H, C) latent queries; q_pe (T, H, R) roped queries (rows
     * qpe_stride apart, heads qpe_head_stride apart);
     * c (T, C) normalized latent and k_pe (T, R) roped key written into
     * cache (slots, C + R) first (c NULL: mla_prep already did); out (T, H, C)
     * = sum_j p_j c_j. */
    void (*attn_mla)(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                     const float *c, const float *k_pe, void *cache, const sd_attn_batch *b, int H,
                     int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                     float scale);

    /* MoE: router logits (n, E) (fp32) and correction bias (E) or NULL ->
     * ids (n, k), weights (n, k). */
    void (*moe_route)(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                      const float *bias, int n, const sd_moe_route *r);
    /* out(n, D) = sum_j wts[t, j] * expert_{ids[t, j]}(x[t]); tmp is scratch of
     * SD_MOE_TMP_FLOATS(n, top_k, D, I) floats. */
    void (*moe_ffn)(sd_backend *be, float *out, const float *x, const int32_t *ids,
                    const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp);

    /* ---- tensor parallelism (last, so tables written in order stay valid) ---- */
    /* Vocab-parallel lookup (tensor parallelism): table holds the vocabulary
     * rows [first, first + table.rows); out(n, D) = table[ids[i] - first] for
     * ids in that range, zeros for the others, so the ranks' outputs sum to
     * the full lookup. */
    void (*embed_shard)(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids,
                        int n, int first);

    /* ---- sampling and verification (appended: the CUDA table is positional) ----
     * One definition of the math: src/verify (sampling.h, accept.h); the CPU
     * ops call it, the GPU ops compute the same (the same integer RNG; float
     * sums in another order, so probabilities agree to rounding and tokens
     * agree unless the uniform falls within rounding of a CDF boundary). */
    /* out(n) = sd_argmax of each row of x (n, V): lowest id on ties, NaN skipped. */
    void (*argmax_rows)(sd_backend *be, int32_t *out, const float *x, int n, int V);
    /* Per row r of logits (n, V): probs_scratch row r = sd_sampling_probs(row,
     * p[r]) (the full distribution, left there for the caller), and out[r] =
     * sd_sample(that row, sd_rand_uniform(p[r].seed, p[r].counter,
     * SD_RNG_TARGET)); a greedy row (temperature <= 0) gives its argmax and a
     * one-hot row. p: (n) sd_sample_params; probs_scratch (n, V) may not alias
     * logits. */
    void (*sample_rows)(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                        const sd_sample_params *p, int n, int V);
    /* Greedy verification of n_seq chains of k drafts, sd_accept_greedy per
     * sequence s: n_acc[s] = the accepted count (0..k); out_tok row s (k + 1
     * wide) gets the n_acc[s] accepted drafts then target_argmax[s][n_acc[s]],
     * so the sequence grows by n_acc[s] + 1 tokens; entries after those are not
     * written. draft (n_seq, k), target_argmax (n_seq, k + 1). k >= 0. */
    void (*accept_greedy_rows)(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                               const int32_t *draft, const int32_t *target_argmax, int n_seq,
                               int k);

    /* ---- step uploads and graphs (appended; NULL where a backend has none) ----
     * upload2d: rows of `width` bytes, src rows spitch bytes apart, dst rows
     * dpitch apart (a block table's used columns). Queued like upload. */
    int (*upload2d)(sd_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t rows);
    /* Records the ops queued between graph_begin and graph_end (which must
     * neither allocate nor synchronize) into a graph; graph_launch replays it
     * with the same pointers and sizes, reading whatever the buffers hold
     * then. Replay is bit-identical to launching the ops again. */
    int (*graph_begin)(sd_backend *be);
    int (*graph_end)(sd_backend *be, void **graph);
    int (*graph_launch)(sd_backend *be, void *graph);
    void (*graph_free)(sd_backend *be, void *graph);

    /* ---- sampled verification (appended: the CUDA table is positional) ----
     * sd_accept_chain (src/verify/accept.h) for n_seq sequences on the
     * backend: rejection sampling for sampled sequences, argmax comparison
     * for greedy ones (temperature <= 0), so the caller downloads n_acc and
     * tokens, never logits rows.
     *
     * Sequence s has kd = n_draft[s] drafts (0 <= kd <= k; n_draft NULL: k
     * each) and kd + 1 consecutive rows of logits (R, V): rows r0 .. r0 + kd
     * with r0 = row0[s] (row0 NULL: s * (k + 1), the dense (n_seq, k + 1, V)
     * layout); row i (< kd) is the position that draft i is proposed for,
     * row kd the bonus row. For each of those rows r:
     *   probs_scratch row r = sd_sampling_probs(logits row r, p[s]).
     * probs_scratch is (R, V) with the row numbering of logits, may not
     * alias it; every row of a sequence is written (those after a rejection
     * too) and left there for the caller; rows of no sequence are untouched.
     * Then, with p[s].counter = the output position of draft 0 (of out_tok
     * row s entry 0),
     *   n_acc[s] = sd_accept_chain({p[s].temperature, .top_p, .top_k, .seed},
     *                              V, kd, draft + s * k, probs rows r0 ..,
     *                              q ? q + s * k * V : NULL, p[s].counter,
     *                              out_tok + s * (k + 1))
     * q (n_seq, k, V): the draft distributions the drafts were sampled from,
     * through the same sd_sampling_probs(p[s]) (rows past kd unread); NULL
     * for deterministic drafts (n-gram, greedy proposers: one-hot q, never
     * materialized), then for every sequence of the call. out_tok row s
     * (k + 1 wide) gets n_acc[s] + 1 tokens; later entries are not written.
     * A sequence with kd outside 0..k or a draft outside 0..V-1 gets
     * n_acc[s] = SD_EINVAL (core/err.h) and no tokens. draft (n_seq, k),
     * p (n_seq), n_acc (n_seq), out_tok (n_seq, k + 1). k >= 0. The CPU op
     * calls src/verify; the GPU op computes the same numbers with the same
     * uniforms, so tokens agree unless one lands within rounding of a
     * boundary (a p/q acceptance threshold or a CDF step). */
    void (*accept_sample_rows)(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                               float *probs_scratch, const float *logits, const int32_t *row0,
                               const float *q, const int32_t *draft, const int32_t *n_draft,
                               const sd_sample_params *p, int n_seq, int k, int V);

    /* ---- device-side drafting (appended) ----
     * out(n) = table[idx[i]]: token ids through a map (EAGLE-3's draft
     * vocabulary to the target's), so a draft chain never leaves the device. */
    void (*gather_i32)(sd_backend *be, int32_t *out, const int32_t *table, const int32_t *idx,
                       int n);

    /* ---- fused residual step (appended: the CUDA table is positional) ----
     * x(n, d) += y(n, d), then out(n, d) = rmsnorm(x) * w: the numbers of add
     * followed by rmsnorm(out, x, w, n, d, d, d, eps), bit for bit, in one
     * pass. Dense rows (stride d). out may not alias x or y. NULL where a
     * backend has none (callers then run add and rmsnorm). */
    void (*add_rmsnorm)(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                        int n, int d, float eps);

    /* ---- device-side sampled drafts (appended) ----
     * dst(n, wd) := 0, then dst[i][map[c]] = src[i][c] for c < ws: rows of a
     * reduced vocabulary (EAGLE-3's draft distributions) spread over the
     * target's. map is injective (ws distinct columns below wd). */
    void (*scatter_cols)(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                         int ws, int wd);

    /* ---- fused attention prologues (appended; every backend has them: the
     * model calls no other way to rope and store) ----
     * rope_kv: rope(q, b->pos, r, T, Hq, q_stride, D, 0), rope(k, b->pos, r, T,
     * Hkv, kv_stride, D, 0), then attn_gqa's store of k and v into the caches
     * at b->slot: those numbers, one op. attn_gqa then takes k = v = NULL. */
    void (*rope_kv)(sd_backend *be, float *q, float *k, const float *v, void *kcache,
                    void *vcache, const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv,
                    int D, int Dv, int q_stride, int kv_stride);
    /* mla_prep: per token of b, with T = b->n_tokens:
     *   rmsnorm(ckv, ckv, w, T, C, ck_stride, ck_stride, eps)    the latent
     *   rope(ckv, b->pos, r, T, 1, ck_stride, 0, C)              the rope key
     *   rope(q_pe, b->pos, r, T, H, qpe_stride, qpe_head_stride, 0)
     * then attn_mla's store of [latent, rope key] (R floats at ckv + C) into
     * cache (slots, C + R) at b->slot: those numbers, one op. attn_mla then
     * takes c = k_pe = NULL. */
    void (*mla_prep)(sd_backend *be, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                     int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                     const sd_attn_batch *b, const sd_rope *r, int H, int C, int R);

    /* ---- fused gate/up (appended; every backend has it: a backend without a
     * fused kernel runs the two ops) ----
     * w is a gate and an up projection stacked [2I, K] (gate rows first);
     * gu is (n, 2I) of room. The numbers of matmul(gu, x, w, NULL, n,
     * x_stride) followed by silu_mul(gu, gu, n, I) in place: on return gu
     * holds out(n, I) = silu(x Wg^T) * (x Wu^T), rows I apart; the rest of
     * gu is scratch. */
    void (*matmul_silu)(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                        int x_stride);

    /* ---- fused MoE router (appended; every backend has it: a backend
     * without a fused kernel runs the two ops) ----
     * The numbers of matmul(logits, x, w, NULL, n, x_stride) (w: the router
     * [r->n_experts, K]; logits (n, n_experts) of room) followed by
     * moe_route(ids, wts, logits, bias, n, r): on return logits holds the
     * router's logits and ids / wts the routing. */
    void (*moe_router_route)(sd_backend *be, int32_t *ids, float *wts, float *logits,
                             const float *x, const sd_weight *w, const float *bias, int n,
                             int x_stride, const sd_moe_route *r);

    /* ---- fused residual GEMVs (appended; NULL where a backend has none:
     * the callers then run the ops they stand for) ----
     * matmul_add: y(n, w.rows) += x @ w^T (+ bias), y dense: the numbers of
     * matmul(tmp, x, w, bias, n, x_stride) followed by add(y, tmp, n,
     * w.rows); tmp is (n, w.rows) of room the op may use for that. y may
     * not alias x or tmp. */
    void (*matmul_add)(sd_backend *be, float *y, const float *x, const sd_weight *w,
                       const sd_weight *bias, int n, int x_stride, float *tmp);
    /* rmsnorm_matmul: the numbers of rmsnorm(xn, x, g, n, K, K, K, eps)
     * (K = w.cols, dense rows) followed by matmul(y, xn, w, bias, n, K), or
     * with silu (bias NULL) by matmul_silu(y, xn, w, n, K): the normalized
     * rows land in xn too. Neither y nor xn may alias x or each other. */
    void (*rmsnorm_matmul)(sd_backend *be, float *y, float *xn, const float *x, const sd_weight *g,
                           float eps, const sd_weight *w, const sd_weight *bias, int n, int silu);

    /* ---- page-locked host buffers (appended; NULL where a backend has none:
     * the caller mallocs) ----
     * Host memory the backend copies to and from without staging it through
     * a buffer of its own. A download into it is done when download returns;
     * an upload from it may still be queued after upload returns, so its
     * source must not be rewritten before the next sync. NULL on failure. */
    void *(*host_alloc)(sd_backend *be, size_t bytes);
    void (*host_free)(sd_backend *be, void *p);

    /* ---- a step queued before the one ahead of it is read (appended; NULL
     * where a backend has none: the engine then reads each step before it
     * queues the next) ----
     * copy: bytes from device memory to device memory, after the work
     * queued before it. download_async: queues a copy to host memory
     * (host_alloc's, or the call waits for it) and marks its end with mark
     * `ev` (0 or 1), then returns. download_wait: returns when mark ev's
     * copy and everything queued before it are done, with the first
     * recorded error (0 if none). */
    int (*copy)(sd_backend *be, void *dst, const void *src, size_t bytes);
    int (*download_async)(sd_backend *be, void *dst, const void *src, size_t bytes, int ev);
    int (*download_wait)(sd_backend *be, int ev);

    /* ---- a MoE block's routing and experts in one op (appended; NULL where
     * a backend has none: the caller runs the two ops) ----
     * moe_router_ffn: the numbers of moe_router_route(ids, wts, logits, x,
     * w, bias, n, D, r) followed by moe_ffn(out, x, ids, wts, ex, n,
     * r->top_k + r->n_always, D, tmp) (x dense, n rows of D): a backend may
     * run the always-on experts while it routes. */
    void (*moe_router_ffn)(sd_backend *be, float *out, int32_t *ids, float *wts, float *logits,
                           const float *x, const sd_weight *w, const float *bias,
                           const sd_experts *ex, int n, int D, const sd_moe_route *r, void *tmp);

    /* ---- MLA's latent prep and query absorb in one op (appended; NULL
     * where a backend has none: the caller runs the two ops) ----
     * mla_prep_absorb: the numbers of mla_prep(ckv, ck_stride, q_pe,
     * qpe_stride, qpe_head_stride, w, eps, cache, b, r, H, C, R) and
     * matmul_heads(y, x, wuk, b->n_tokens, H, x_stride, x_head_stride, 0);
     * x's rows (the query's nope parts) are none of mla_prep's memory, so a
     * backend may run the two at once. */
    void (*mla_prep_absorb)(sd_backend *be, float *ckv, int ck_stride, float *q_pe,
                            int qpe_stride, int qpe_head_stride, const sd_weight *w, float eps,
                            void *cache, const sd_attn_batch *b, const sd_rope *r, int H, int C,
                            int R, float *y, const float *x, const sd_weight *wuk, int x_stride,
                            int x_head_stride);

    /* ---- a step's small copies as one (appended; NULL where a backend has
     * none: the caller makes them one at a time) ----
     * copies: the n (<= SD_COPIES_MAX) copies in order, after the work
     * queued before them; each source is device memory or host_alloc's
     * memory (not rewritten before the next sync or download_wait, as
     * upload's), each destination device memory or host_alloc's memory
     * (the host reads it after a download_async queued later, of nothing
     * or more, is waited for). SD_ENOTSUP, with nothing queued, where the
     * backend cannot make these one (the caller then uses upload2d,
     * upload, copy and download_async). */
    int (*copies)(sd_backend *be, const sd_copy *c, int n);

    /* ---- counters (appended; NULL where a backend has none) ----
     * gemm_trials: GEMM algorithm trials run so far, each a host stall of a
     * few ms where it runs (the timed candidates of a shape and row count
     * met the first time: kernels/cuda/matmul.cu). */
    long (*gemm_trials)(sd_backend *be);

    /* ---- block-scaled FP8 weights (appended; NULL where a backend takes
     * them dequantized to BF16 only) ----
     * weight_fp8: a weight of rows x cols E4M3 bytes q (host) and F32 scales
     * (host) [ceil(rows / bm), ceil(cols / bn)], one a bm x bn block; every
     * op that takes an sd_weight then reads it as sd_weight's comment says
     * (E4M3 x scale; BF16-rounded where a path says so). The CPU may keep
     * the pointers. */
    int (*weight_fp8)(sd_backend *be, sd_weight *out, const uint8_t *q, const float *scale,
                      int64_t rows, int64_t cols, int bm, int bn);
} sd_ops;

struct sd_backend {
    const sd_ops *ops;
    int device;  /* GPU ordinal, -1 for the CPU */
    int rank;    /* tensor-parallel rank */
    void *impl;  /* backend-private state */
};

/* The ops matmul_add stands for: matmul into tmp, then add (the contract's
 * definition; a backend may implement the op as this). */
static inline void sd_matmul_add_ops(sd_backend *be, float *y, const float *x, const sd_weight *w,
                                     const sd_weight *bias, int n, int x_stride, float *tmp)
{
    be->ops->matmul(be, tmp, x, w, bias, n, x_stride);
    be->ops->add(be, y, tmp, n, (int)w->rows);
}

/* The ops rmsnorm_matmul stands for: rmsnorm into xn, then matmul or
 * matmul_silu from it. */
static inline void sd_rmsnorm_matmul_ops(sd_backend *be, float *y, float *xn, const float *x,
                                         const sd_weight *g, float eps, const sd_weight *w,
                                         const sd_weight *bias, int n, int silu)
{
    const sd_ops *op = be->ops;
    int K = (int)w->cols;
    op->rmsnorm(be, xn, x, g, n, K, K, K, eps);
    if (silu)
        op->matmul_silu(be, y, xn, w, n, K);
    else
        op->matmul(be, y, xn, w, bias, n, K);
}

/* matmul_add where the backend has it, else the two ops it stands for */
static inline void sd_matmul_add(sd_backend *be, float *y, const float *x, const sd_weight *w,
                                 const sd_weight *bias, int n, int x_stride, float *tmp)
{
    if (be->ops->matmul_add)
        be->ops->matmul_add(be, y, x, w, bias, n, x_stride, tmp);
    else
        sd_matmul_add_ops(be, y, x, w, bias, n, x_stride, tmp);
}

/* rmsnorm_matmul where the backend has it, else the ops it stands for */
static inline void sd_rmsnorm_matmul(sd_backend *be, float *y, float *xn, const float *x,
                                     const sd_weight *g, float eps, const sd_weight *w,
                                     const sd_weight *bias, int n, int silu)
{
    if (be->ops->rmsnorm_matmul)
        be->ops->rmsnorm_matmul(be, y, xn, x, g, eps, w, bias, n, silu);
    else
        sd_rmsnorm_matmul_ops(be, y, xn, x, g, eps, w, bias, n, silu);
}

/* moe_router_ffn where the backend has it, else the two ops it stands for */
static inline void sd_moe_router_ffn(sd_backend *be, float *out, int32_t *ids, float *wts,
                                     float *logits, const float *x, const sd_weight *w,
                                     const float *bias, const sd_experts *ex, int n, int D,
                                     const sd_moe_route *r, void *tmp)
{
    const sd_ops *op = be->ops;
    if (op->moe_router_ffn) {
        op->moe_router_ffn(be, out, ids, wts, logits, x, w, bias, ex, n, D, r, tmp);
        return;
    }
    op->moe_router_route(be, ids, wts, logits, x, w, bias, n, D, r);
    op->moe_ffn(be, out, x, ids, wts, ex, n, r->top_k + (r->n_always > 0 ? r->n_always : 0), D,
                tmp);
}

/* mla_prep_absorb where the backend has it, else the two ops it stands for */
static inline void sd_mla_prep_absorb(sd_backend *be, float *ckv, int ck_stride, float *q_pe,
                                      int qpe_stride, int qpe_head_stride, const sd_weight *w,
                                      float eps, void *cache, const sd_attn_batch *b,
                                      const sd_rope *r, int H, int C, int R, float *y,
                                      const float *x, const sd_weight *wuk, int x_stride,
                                      int x_head_stride)
{
    const sd_ops *op = be->ops;
    if (op->mla_prep_absorb) {
        op->mla_prep_absorb(be, ckv, ck_stride, q_pe, qpe_stride, qpe_head_stride, w, eps, cache,
                            b, r, H, C, R, y, x, wuk, x_stride, x_head_stride);
        return;
    }
    op->mla_prep(be, ckv, ck_stride, q_pe, qpe_stride, qpe_head_stride, w, eps, cache, b, r, H, C,
                 R);
    op->matmul_heads(be, y, x, wuk, b->n_tokens, H, x_stride, x_head_stride, 0);
}

/* kernels/cpu: threads = 0 for all cores. */
int sd_cpu_backend_create(sd_backend **out, int threads);
void sd_cpu_backend_destroy(sd_backend *be);

#endif

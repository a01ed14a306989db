/* kernels/cpu: the CPU backend, internal header. A persistent thread pool
 * splits each op's rows/columns across threads; every op is plain fp32 C. */
#ifndef SD_KERNELS_CPU_H
#define SD_KERNELS_CPU_H

#include <pthread.h>

#include "kernels/ops.h"

typedef void (*sd__cpu_task)(void *ctx, int begin, int end, int thread);

typedef struct sd__cpu_pool sd__cpu_pool;

typedef struct sd__cpu {
    sd__cpu_pool *pool;
    int threads;
    float **scratch; /* per thread */
    size_t scratch_len;
    /* FP8 weights' code tables (weight_fp8), freed with the backend */
    pthread_mutex_t luts_mu;
    float **luts;
    int n_luts, cap_luts;
} sd__cpu;

/* task over items 0..n-1 in contiguous chunks, one a thread (at most); work: about the
 * multiply-adds (or element steps) of one item. A job under the pool's
 * min_work in all runs on the caller alone (a split costs a hand-off to
 * every thread; SPECD_CPU_MIN_WORK). */
void sd__cpu_parallel(sd_backend *be, int n, size_t work, sd__cpu_task task, void *ctx);
/* Per-thread scratch of at least len floats (grown between ops only). */
float *sd__cpu_scratch(sd_backend *be, int thread, size_t len);
int sd__cpu_reserve_scratch(sd_backend *be, size_t len);

/* Row r of weight w as fp32 into dst (w.cols floats). */
void sd__cpu_weight_row(const sd_weight *w, int64_t r, float *dst);
/* dot of x (n floats) with weight row r. */
float sd__cpu_dot_row(const sd_weight *w, int64_t r, const float *x);
/* dot of x with a row in fp32 (sd__cpu_weight_row's): the sums of
 * sd__cpu_dot_row over that weight row, bit for bit. */
float sd__cpu_dot_f32(const float *w, const float *x, size_t n);
/* out[t] = sd__cpu_dot_row(w, r, x[t]) for 4 activation rows, bit for bit,
 * the row read once (BF16 and F32 weights; -1 for the others). */
int sd__cpu_dot4_row(const sd_weight *w, int64_t r, const float *const x[4], float out[4]);

/* op entry points (one family per file) */
void sd__cpu_embed(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids, int n);
void sd__cpu_embed_shard(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids,
                         int n, int first);
void sd__cpu_add(sd_backend *be, float *y, const float *x, int n, int d);
void sd__cpu_silu_mul(sd_backend *be, float *out, const float *gu, int n, int I);
void sd__cpu_scatter_cols(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                          int ws, int wd);
void sd__cpu_gather_i32(sd_backend *be, int32_t *out, const int32_t *table, const int32_t *idx,
                        int n);
void sd__cpu_gather_rows(sd_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                         int d, int ds, int ss);
void sd__cpu_copy2d(sd_backend *be, float *dst, const float *src, int n, int d, int ds, int ss);
void sd__cpu_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                     int x_stride, int out_stride, float eps);
void sd__cpu_kv_store(float *kc, float *vc, const float *k, const float *v,
                      const sd_attn_batch *b, int Hkv, int D, int Dv, int kv_stride);
void sd__cpu_latent_store(float *cache, const float *c_lat, const float *k_pe,
                          const sd_attn_batch *b, int C, int R, int ck_stride);
void sd__cpu_rope_kv(sd_backend *be, float *q, float *k, const float *v, void *kcache,
                     void *vcache, const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv, int D,
                     int Dv, int q_stride, int kv_stride);
void sd__cpu_mla_prep(sd_backend *be, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                      int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                      const sd_attn_batch *b, const sd_rope *r, int H, int C, int R);
void sd__cpu_matmul_silu(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                         int x_stride);
void sd__cpu_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                         int n, int d, float eps);
void sd__cpu_matmul(sd_backend *be, float *y, const float *x, const sd_weight *w,
                    const sd_weight *bias, int n, int x_stride);
void sd__cpu_matmul_heads(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                          int H, int x_stride, int x_head_stride, int x_off);
void sd__cpu_rope(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                  int row_stride, int head_stride, int off);
void sd__cpu_attn_gqa(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                      void *kcache, void *vcache, const sd_attn_batch *b, int Hq, int Hkv, int D,
                      int Dv, int q_stride, int kv_stride, float scale);
void sd__cpu_attn_mla(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                      const float *c, const float *k_pe, void *cache, const sd_attn_batch *b, int H,
                      int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                      float scale);
void sd__cpu_moe_router_route(sd_backend *be, int32_t *ids, float *wts, float *logits,
                              const float *x, const sd_weight *w, const float *bias, int n,
                              int x_stride, const sd_moe_route *r);
void sd__cpu_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                       const float *bias, int n, const sd_moe_route *r);
void sd__cpu_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                     const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp);
void sd__cpu_argmax_rows(sd_backend *be, int32_t *out, const float *x, int n, int V);
void sd__cpu_sample_rows(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                         const sd_sample_params *p, int n, int V);
void sd__cpu_accept_greedy_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                const int32_t *draft, const int32_t *target_argmax, int n_seq,
                                int k);
void sd__cpu_accept_sample_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                float *probs_scratch, const float *logits, const int32_t *row0,
                                const float *q, const int32_t *draft, const int32_t *n_draft,
                                const sd_sample_params *p, int n_seq, int k, int V);

static inline int sd__slot_of(const sd_attn_batch *b, int s, int p)
{
    return b->block_table[(size_t)s * (size_t)b->max_blocks + (size_t)(p / b->block_size)] *
               b->block_size +
           p % b->block_size;
}

#endif

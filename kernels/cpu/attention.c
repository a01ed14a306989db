/* CPU reference: attention over the paged KV cache (GQA and MLA).
 * Each token walks its own positions 0..pos through the block table: the
 * work follows the real context, never a maximum. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

typedef struct attn_ctx {
    sd_backend *be;
    float *out;
    const float *q, *q_pe;
    const float *kc, *vc; /* caches (fp32 on the CPU) */
    const sd_attn_batch *b;
    int Hq, Hkv, D, Dv, q_stride;
    int C, R, qpe_stride, qpe_head_stride; /* MLA */
    float scale;
} attn_ctx;

/* softmax of s[0..n) in place, fp32 like HF's eager path */
static void softmax_inplace(float *s, int n)
{
    float m = -INFINITY;
    for (int j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    float sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < n; j++)
        s[j] *= inv;
}

static float dot(const float *a, const float *b, int n)
{
    float acc[4] = {0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void gqa_task(void *arg, int begin, int end, int thread)
{
    attn_ctx *c = arg;
    const sd_attn_batch *b = c->b;
    float *sc = sd__cpu_scratch(c->be, thread, (size_t)b->max_pos);
    int group = c->Hq / c->Hkv;
    for (int w = begin; w < end; w++) {
        int t = w / c->Hq, h = w % c->Hq, kvh = h / group;
        int n = b->pos[t] + 1, s = b->seq[t];
        const float *q = c->q + (size_t)t * (size_t)c->q_stride + (size_t)h * (size_t)c->D;
        for (int j = 0; j < n; j++) {
            const float *k = c->kc + ((size_t)sd__slot_of(b, s, j) * (size_t)c->Hkv + (size_t)kvh) *
                                         (size_t)c->D;
            sc[j] = dot(q, k, c->D) * c->scale;
        }
        softmax_inplace(sc, n);
        float *o = c->out + ((size_t)t * (size_t)c->Hq + (size_t)h) * (size_t)c->Dv;
        memset(o, 0, (size_t)c->Dv * sizeof(float));
        for (int j = 0; j < n; j++) {
            const float *v = c->vc + ((size_t)sd__slot_of(b, s, j) * (size_t)c->Hkv + (size_t)kvh) *
                                         (size_t)c->Dv;
            float p = sc[j];
            for (int i = 0; i < c->Dv; i++)
                o[i] += p * v[i];
        }
    }
}

void sd__cpu_kv_store(float *kc, float *vc, const float *k, const float *v,
                      const sd_attn_batch *b, int Hkv, int D, int Dv, int kv_stride)
{
    for (int t = 0; t < b->n_tokens; t++) {
        size_t slot = (size_t)b->slot[t];
        for (int h = 0; h < Hkv; h++) {
            memcpy(kc + (slot * (size_t)Hkv + (size_t)h) * (size_t)D,
                   k + (size_t)t * (size_t)kv_stride + (size_t)h * (size_t)D, (size_t)D * sizeof(float));
            memcpy(vc + (slot * (size_t)Hkv + (size_t)h) * (size_t)Dv,
                   v + (size_t)t * (size_t)kv_stride + (size_t)h * (size_t)Dv,
                   (size_t)Dv * sizeof(float));
        }
    }
}

void sd__cpu_latent_store(float *cache, const float *c_lat, const float *k_pe,
                          const sd_attn_batch *b, int C, int R, int ck_stride)
{
    size_t row = (size_t)(C + R);
    for (int t = 0; t < b->n_tokens; t++) {
        float *dst = cache + (size_t)b->slot[t] * row;
        memcpy(dst, c_lat + (size_t)t * (size_t)ck_stride, (size_t)C * sizeof(float));
        memcpy(dst + C, k_pe + (size_t)t * (size_t)ck_stride, (size_t)R * sizeof(float));
    }
}

void sd__cpu_attn_gqa(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                      void *kcache, void *vcache, const sd_attn_batch *b, int Hq, int Hkv, int D,
                      int Dv, int q_stride, int kv_stride, float scale)
{
    float *kc = kcache, *vc = vcache;
    /* this step's keys and values go in first: tokens of one sequence see
     * each other (k NULL: rope_kv stored them) */
    if (k)
        sd__cpu_kv_store(kc, vc, k, v, b, Hkv, D, Dv, kv_stride);
    if (sd__cpu_reserve_scratch(be, (size_t)b->max_pos) != 0)
        return;
    attn_ctx c = {.be = be, .out = out, .q = q, .kc = kc, .vc = vc, .b = b, .Hq = Hq, .Hkv = Hkv,
                  .D = D, .Dv = Dv, .q_stride = q_stride, .scale = scale};
    sd__cpu_parallel(be, b->n_tokens * Hq, (size_t)b->max_pos * (size_t)(D + Dv), gqa_task, &c);
}

static void mla_task(void *arg, int begin, int end, int thread)
{
    attn_ctx *c = arg;
    const sd_attn_batch *b = c->b;
    float *sc = sd__cpu_scratch(c->be, thread, (size_t)b->max_pos);
    int C = c->C, R = c->R, row = C + R;
    for (int w = begin; w < end; w++) {
        int t = w / c->Hq, h = w % c->Hq;
        int n = b->pos[t] + 1, s = b->seq[t];
        const float *ql = c->q + ((size_t)t * (size_t)c->Hq + (size_t)h) * (size_t)C;
        const float *qp = c->q_pe + (size_t)t * (size_t)c->qpe_stride +
                          (size_t)h * (size_t)c->qpe_head_stride;
        for (int j = 0; j < n; j++) {
            const float *kv = c->kc + (size_t)sd__slot_of(b, s, j) * (size_t)row;
            sc[j] = (dot(ql, kv, C) + dot(qp, kv + C, R)) * c->scale;
        }
        softmax_inplace(sc, n);
        float *o = c->out + ((size_t)t * (size_t)c->Hq + (size_t)h) * (size_t)C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < n; j++) {
            const float *kv = c->kc + (size_t)sd__slot_of(b, s, j) * (size_t)row;
            float p = sc[j];
            for (int i = 0; i < C; i++)
                o[i] += p * kv[i];
        }
    }
}

void sd__cpu_attn_mla(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                      const float *c_lat, const float *k_pe, void *cache, const sd_attn_batch *b,
                      int H, int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                      float scale)
{
    float *kc = cache;
    if (c_lat) /* NULL: mla_prep stored them */
        sd__cpu_latent_store(kc, c_lat, k_pe, b, C, R, ck_stride);
    if (sd__cpu_reserve_scratch(be, (size_t)b->max_pos) != 0)
        return;
    attn_ctx c = {.be = be, .out = out, .q = q_lat, .q_pe = q_pe, .kc = kc, .b = b, .Hq = H,
                  .C = C, .R = R, .qpe_stride = qpe_stride, .qpe_head_stride = qpe_head_stride,
                  .scale = scale};
    sd__cpu_parallel(be, b->n_tokens * H, (size_t)b->max_pos * (size_t)(2 * C + R), mla_task, &c);
}

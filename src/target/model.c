/* target/model: loading and the forward pass of every supported architecture. */
#include "target/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/safetensors.h"
#include "core/util.h"
#include "target/rope.h"

#define MAX_AUX 8

typedef struct layer {
    int mla, moe;
    sd_weight attn_norm, ffn_norm;
    /* GQA: q, k, v projections stacked [Hq*Dh + 2*Hkv*Dh, in] (this rank's
     * heads) for one matmul, and their biases likewise (F32). MLA: q_a (or
     * q_proj, this rank's heads, when there is no q_lora) and kv_a stacked. */
    sd_weight wqkv, bqkv, wo, bo, q_norm, k_norm;
    int has_bias, has_qk_norm;
    sd_weight q_a_norm, q_b, kv_a_norm, wuk_t, wuv; /* MLA */
    /* dense FFN or MoE shared experts: gate and up stacked [2I, D] */
    sd_weight gate_up, down;
    int ffn_inter;
    /* MoE */
    sd_weight router;
    float *corr_bias; /* backend (E) or NULL */
    sd_weight *eg, *eu, *ed;
    sd_experts experts;
    int n_always; /* shared experts in the bank after the routed ones (their slots) */
    /* cache */
    void *kc, *vc;
} layer;

struct sd_model {
    sd_model_cfg cfg;
    sd_backend *be;
    sd_st *st;
    char dir[1024];
    int max_tokens;
    sd_weight embed, norm, lm_head;
    layer *layers;
    int n_layers;
    sd_rope rope;
    float attn_scale;
    int qk_dim; /* MLA: nope + rope; GQA: head_dim */
    int shared_slots; /* MoE layers keep their shared experts in the bank (sd_model_opts) */
    int fp8_keep;     /* FP8 weights placed as FP8 (sd_model_opts; the backend takes them) */
    int fp8_kept;     /* weights placed as FP8, and their E4M3 bytes */
    size_t fp8_bytes;
    size_t placed;    /* bytes of every weight placed on the backend */
    /* MTP */
    int has_mtp;
    layer mtp;
    sd_weight mtp_embed, enorm, hnorm, eh_proj, sh_norm, sh_head;
    /* EAGLE-3 aux capture */
    int aux_layers[MAX_AUX], n_aux;
    /* host buffers the CPU weights point into (derived weights) */
    void **owned;
    int n_owned, cap_owned;
    /* workspace (backend memory) */
    float *ws;
    size_t ws_floats;
    float *x, *xn, *ao, *fo, *qkv, *q, *k, *v, *qlat, *lat, *att, *gu, *rlog, *wts, *moetmp, *xo,
        *eh;
    int32_t *ids;
    float *lg_local, *lg_all; /* vocab-parallel logits: (T, vocab_shard), (tp, T, vocab_shard) */
    int n_slots;
    /* tensor parallelism: this rank's share (unsharded: rank 0 of 1, all of it) */
    int tp_rank, tp_size;
    sd_comm *comm;
    int ep;       /* routed experts split whole across the ranks */
    int comm_rc;  /* first failed collective of the step */
    /* the fused residual path (fused_residual): xn = rmsnorm(x, xn_norm) is
     * owed, not yet computed (NULL: xn is current) */
    const sd_weight *xn_norm;
    int hq, hkv;  /* attention heads on this rank (GQA kv heads: hkv from kv_head0) */
    int kv_head0;
    int vocab_shard;             /* rows per vocab shard: ceil(vocab / tp) */
    int vocab_first, vocab_rows; /* this rank's rows of the embedding and the head */
};

/* ------------------------------------------------------------------ loading */

static int own(sd_model *m, void *p)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 16;
        void **o = realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o)
            return SD_ENOMEM;
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

/* Places host data as weight w on the backend, counting its bytes. */
static int place(sd_model *m, sd_weight *w, const void *host, sd_dtype dt, int64_t rows,
                 int64_t cols)
{
    if (m->be->ops->weight(m->be, w, host, dt, rows, cols))
        return -1;
    m->placed += (size_t)(rows * cols) * sd_dtype_size(dt);
    return 0;
}

static int upload_host(sd_model *m, sd_weight *w, void *host, sd_dtype dt, int64_t rows,
                       int64_t cols, sd_err *err)
{
    if (own(m, host)) {
        free(host);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    if (place(m, w, host, dt, rows, cols))
        return sd_err_set(err, SD_EDEVICE, "cannot place a derived weight on %s",
                          m->be->ops->name);
    return 0;
}

/* Finds tensor `name` of shape [rows, cols] (cols = 0: 1-D of rows) in a
 * dtype the ops take. */
static int find_w(sd_model *m, const char *name, int64_t rows, int64_t cols,
                  const sd_st_tensor **t, sd_err *err)
{
    int64_t shape[2] = {rows, cols};
    int rc = sd_st_expect(m->st, name, cols ? 2 : 1, shape, t, err);
    if (rc)
        return rc;
    if ((*t)->dtype != SD_DT_F32 && (*t)->dtype != SD_DT_BF16 && (*t)->dtype != SD_DT_F16)
        return sd_err_set(err, SD_ENOTSUP, "%s: tensor %s: dtype %s is not supported", (*t)->file,
                          name, sd_dtype_name((*t)->dtype));
    return 0;
}

/* E4M3 bytes q [rows, cols] and their F32 scales placed as one FP8 weight */
static int place_fp8(sd_model *m, sd_weight *w, const char *name, const uint8_t *q,
                     const float *scale, int64_t rows, int64_t cols, sd_err *err)
{
    if (m->be->ops->weight_fp8(m->be, w, q, scale, rows, cols, m->cfg.fp8_block[0],
                               m->cfg.fp8_block[1]))
        return sd_err_set(err, SD_EDEVICE, "%s: cannot place fp8 on %s", name, m->be->ops->name);
    const size_t scales = (size_t)w->scale_cols * (size_t)((rows + w->block[0] - 1) / w->block[0]);
    m->fp8_kept++;
    m->fp8_bytes += (size_t)(rows * cols);
    m->placed += (size_t)(rows * cols) + scales * sizeof(float);
    return 0;
}

static int get_fp8(sd_model *m, const char *name, int64_t rows, int64_t cols, int64_t r0,
                   int64_t n, sd_weight *w, sd_err *err);
static int get_fp8_cols(sd_model *m, const char *name, int64_t rows, int64_t cols, int64_t c0,
                        int64_t n, sd_weight *w, sd_err *err);

/* Loads tensor `name` of shape [rows, cols] (cols = 0: 1-D of rows). */
static int get_w(sd_model *m, const char *name, int64_t rows, int64_t cols, sd_weight *w,
                 sd_err *err)
{
    int rc = get_fp8(m, name, rows, cols, 0, rows, w, err);
    if (rc != 1)
        return rc;
    const sd_st_tensor *t;
    rc = find_w(m, name, rows, cols, &t, err);
    if (rc)
        return rc;
    if (place(m, w, t->data, t->dtype, cols ? rows : 1, cols ? cols : rows))
        return sd_err_set(err, SD_EDEVICE, "%s: cannot place on %s", name, m->be->ops->name);
    return 0;
}

/* The part of a tensor one tensor-parallel rank holds: all of it, a block of
 * rows (column-parallel layers, vocab shards; 1-D: elements) or a block of
 * columns (row-parallel layers). */
typedef struct part {
    enum { PART_ALL, PART_ROWS, PART_COLS } kind;
    int64_t off, n;
} part;
static part part_rows(int64_t off, int64_t n) { return (part){PART_ROWS, off, n}; }
static part part_cols(int64_t off, int64_t n) { return (part){PART_COLS, off, n}; }

/* Loads part p of tensor `name` [rows, cols]: rows are a zero-copy view of
 * the mapping, columns a copy (same dtype) owned by the model. */
static int get_part(sd_model *m, const char *name, int64_t rows, int64_t cols, part p,
                    sd_weight *w, sd_err *err)
{
    int64_t full = p.kind == PART_COLS ? cols : rows;
    if (p.kind == PART_ALL || (p.off == 0 && p.n == full))
        return get_w(m, name, rows, cols, w, err);
    const int in = p.off >= 0 && p.n > 0 && p.off + p.n <= full;
    int rc = !in                    ? 1
             : p.kind == PART_ROWS ? get_fp8(m, name, rows, cols, p.off, p.n, w, err)
             : cols                 ? get_fp8_cols(m, name, rows, cols, p.off, p.n, w, err)
                                    : 1;
    if (rc != 1)
        return rc;
    const sd_st_tensor *t;
    rc = find_w(m, name, rows, cols, &t, err);
    if (rc)
        return rc;
    if (p.off < 0 || p.n <= 0 || p.off + p.n > full || (p.kind == PART_COLS && !cols))
        return sd_err_set(err, SD_EINVAL, "%s: shard [%lld, %lld) is outside the tensor", name,
                          (long long)p.off, (long long)(p.off + p.n));
    size_t es = sd_dtype_size(t->dtype);
    if (p.kind == PART_ROWS) {
        size_t row = (size_t)(cols ? cols : 1) * es;
        const char *d = (const char *)t->data + (size_t)p.off * row;
        if (place(m, w, d, t->dtype, cols ? p.n : 1, cols ? cols : p.n))
            return sd_err_set(err, SD_EDEVICE, "%s: cannot place on %s", name, m->be->ops->name);
        return 0;
    }
    size_t rb = (size_t)p.n * es, sb = (size_t)cols * es;
    char *buf = malloc((size_t)rows * rb);
    if (!buf)
        return sd_err_set(err, SD_ENOMEM, "out of memory slicing %s", name);
    for (int64_t r = 0; r < rows; r++)
        memcpy(buf + (size_t)r * rb, (const char *)t->data + (size_t)r * sb + (size_t)p.off * es,
               rb);
    return upload_host(m, w, buf, t->dtype, rows, p.n, err);
}

static int get_wpf(sd_model *m, sd_weight *w, sd_err *err, int64_t rows, int64_t cols, part p,
                   const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int get_wpf(sd_model *m, sd_weight *w, sd_err *err, int64_t rows, int64_t cols, part p,
                   const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return get_part(m, name, rows, cols, p, w, err);
}
/* The whole tensor, by a formatted name. */
#define get_wf(m, w, err, rows, cols, ...) \
    get_wpf(m, w, err, rows, cols, (part){PART_ALL, 0, 0}, __VA_ARGS__)

static int has_tensor(const sd_model *m, const char *fmt, int i, const char *suffix)
{
    char name[512];
    snprintf(name, sizeof name, fmt, i, suffix);
    return sd_st_find(m->st, name) != NULL;
}

/* One projection's share of a stacked weight: rows [r0, r0 + n) of the
 * checkpoint's tensor `name` (full rows); `bias`, when set, names its bias. */
typedef struct stack_part {
    char name[512], bias[512];
    int64_t full, r0, n;
} stack_part;

/* Parts of FP8 tensors [full, cols] stacked as FP8 where m keeps FP8, every
 * part starts a block of scales and all but the last fill whole blocks
 * (their rows and their scales' rows one after another; one part's rows
 * stay in the mapping): 0 when placed, 1 when the caller stacks them
 * dequantized, else an error. */
static int stack_fp8(sd_model *m, const stack_part *p, int np, int64_t cols, sd_weight *w,
                     sd_err *err)
{
    const int bm = m->cfg.fp8_block[0], bn = m->cfg.fp8_block[1];
    if (!m->fp8_keep || np > 4)
        return 1;
    const sd_st_tensor *q[4], *s[4];
    int64_t R = 0, SR = 0;
    for (int i = 0; i < np; i++) {
        const int64_t shape[2] = {p[i].full, cols};
        int rc = sd_st_fp8_parts(m->st, p[i].name, 2, shape, &q[i], &s[i], err);
        if (rc)
            return rc;
        if (p[i].r0 < 0 || p[i].n < 1 || p[i].r0 + p[i].n > p[i].full || p[i].r0 % bm ||
            (i < np - 1 && p[i].n % bm))
            return 1;
        R += p[i].n;
        SR += (p[i].n + bm - 1) / bm;
    }
    const int64_t SC = (cols + bn - 1) / bn;
    const uint8_t *bytes = (const uint8_t *)q[0]->data + (size_t)(p[0].r0 * cols);
    uint8_t *buf = NULL;
    if (np > 1) {
        buf = malloc((size_t)(R * cols));
        if (!buf || own(m, buf)) {
            free(buf);
            return sd_err_set(err, SD_ENOMEM, "out of memory stacking %s", p[0].name);
        }
        bytes = buf;
    }
    float *scale = malloc((size_t)(SR * SC) * sizeof *scale);
    if (!scale || own(m, scale)) {
        free(scale);
        return sd_err_set(err, SD_ENOMEM, "out of memory for %s's scales", p[0].name);
    }
    uint8_t *dq = buf;
    float *ds = scale;
    for (int i = 0; i < np; i++) {
        if (buf) {
            memcpy(dq, (const uint8_t *)q[i]->data + (size_t)(p[i].r0 * cols), (size_t)(p[i].n * cols));
            dq += p[i].n * cols;
        }
        const int64_t s0 = p[i].r0 / bm, sn = (p[i].n + bm - 1) / bm;
        for (int64_t k = 0; k < sn * SC; k++)
            *ds++ = sd_load_f32(s[i]->data, s[i]->dtype, (size_t)(s0 * SC + k));
    }
    return place_fp8(m, w, p[0].name, bytes, scale, R, cols, err);
}

/* Columns [c0, c0 + n) of FP8 tensor `name` [rows, cols] (a row-parallel
 * shard, a shared expert's slot) placed as FP8 where m keeps FP8 and c0
 * starts a block of scales: a copy of those bytes and of those blocks'
 * scales. 0 when placed, 1 when the caller takes the columns dequantized,
 * else an error. */
static int get_fp8_cols(sd_model *m, const char *name, int64_t rows, int64_t cols, int64_t c0,
                        int64_t n, sd_weight *w, sd_err *err)
{
    const int bm = m->cfg.fp8_block[0], bn = m->cfg.fp8_block[1];
    if (!m->fp8_keep || c0 % bn)
        return 1;
    const int64_t shape[2] = {rows, cols};
    const sd_st_tensor *q, *s;
    int rc = sd_st_fp8_parts(m->st, name, 2, shape, &q, &s, err);
    if (rc)
        return rc;
    const int64_t SR = (rows + bm - 1) / bm, SC = (cols + bn - 1) / bn, sc = (n + bn - 1) / bn;
    uint8_t *bytes = malloc((size_t)(rows * n));
    if (!bytes || own(m, bytes)) {
        free(bytes);
        return sd_err_set(err, SD_ENOMEM, "out of memory slicing %s", name);
    }
    float *scale = malloc((size_t)(SR * sc) * sizeof *scale);
    if (!scale || own(m, scale)) {
        free(scale);
        return sd_err_set(err, SD_ENOMEM, "out of memory for %s's scales", name);
    }
    for (int64_t r = 0; r < rows; r++)
        memcpy(bytes + r * n, (const uint8_t *)q->data + r * cols + c0, (size_t)n);
    for (int64_t br = 0; br < SR; br++)
        for (int64_t k = 0; k < sc; k++)
            scale[br * sc + k] = sd_load_f32(s->data, s->dtype, (size_t)(br * SC + c0 / bn + k));
    return place_fp8(m, w, name, bytes, scale, rows, n, err);
}

/* Rows [r0, r0 + n) of FP8 tensor `name` [rows, cols] placed as FP8 where
 * m keeps FP8 and r0 starts a block of scales: stack_fp8's one part. */
static int get_fp8(sd_model *m, const char *name, int64_t rows, int64_t cols, int64_t r0,
                   int64_t n, sd_weight *w, sd_err *err)
{
    if (!cols)
        return 1;
    stack_part p = {.full = rows, .r0 = r0, .n = n};
    snprintf(p.name, sizeof p.name, "%s", name);
    return stack_fp8(m, &p, 1, cols, w, err);
}

/* Rows [r0, r0 + nr) of two [I, D] tensors stacked into one [2nr, D] weight
 * of the same dtype (unsharded: all I rows). */
static int stack2(sd_model *m, const char *a, const char *b, int64_t I, int64_t D, int64_t r0,
                  int64_t nr, sd_weight *out, sd_err *err)
{
    stack_part sp[2] = {{.full = I, .r0 = r0, .n = nr}, {.full = I, .r0 = r0, .n = nr}};
    snprintf(sp[0].name, sizeof sp[0].name, "%s", a);
    snprintf(sp[1].name, sizeof sp[1].name, "%s", b);
    int rc = stack_fp8(m, sp, 2, D, out, err);
    if (rc != 1)
        return rc;
    const sd_st_tensor *ta, *tb;
    int64_t shape[2] = {I, D};
    rc = sd_st_expect(m->st, a, 2, shape, &ta, err);
    if (!rc)
        rc = sd_st_expect(m->st, b, 2, shape, &tb, err);
    if (rc)
        return rc;
    if (ta->dtype != tb->dtype)
        return sd_err_set(err, SD_EFORMAT, "%s and %s: dtypes differ", a, b);
    size_t row = (size_t)D * sd_dtype_size(ta->dtype), half = (size_t)nr * row;
    char *buf = malloc(2 * half);
    if (!buf)
        return sd_err_set(err, SD_ENOMEM, "out of memory stacking %s", a);
    memcpy(buf, (const char *)ta->data + (size_t)r0 * row, half);
    memcpy(buf + half, (const char *)tb->data + (size_t)r0 * row, half);
    return upload_host(m, out, buf, ta->dtype, 2 * nr, D, err);
}

static int load_ffn_dense(sd_model *m, const char *pre, int64_t I, layer *L, sd_err *err)
{
    char a[512], b[512];
    int64_t D = m->cfg.hidden_size;
    /* column-parallel gate/up, row-parallel down: rows/columns [i0, i0 + il) */
    int64_t il = I / m->tp_size, i0 = (int64_t)m->tp_rank * il;
    snprintf(a, sizeof a, "%s.gate_proj.weight", pre);
    snprintf(b, sizeof b, "%s.up_proj.weight", pre);
    int rc = stack2(m, a, b, I, D, i0, il, &L->gate_up, err);
    if (!rc)
        rc = get_wpf(m, &L->down, err, D, I, part_cols(i0, il), "%s.down_proj.weight", pre);
    L->ffn_inter = (int)il;
    return rc;
}

static int load_moe(sd_model *m, const char *pre, layer *L, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int E = c->n_routed_experts, I = c->moe_intermediate_size, D = c->hidden_size;
    L->moe = 1;
    /* the block's and its experts' names: DeepSeek's and Qwen's, or Mixtral's */
    const int mx = c->moe_mixtral_names;
    const char *blk = mx ? "block_sparse_moe" : "mlp", *gn = mx ? "w1" : "gate_proj",
               *un = mx ? "w3" : "up_proj", *dn = mx ? "w2" : "down_proj";
    int rc = get_wf(m, &L->router, err, E, D, "%s.%s.gate.weight", pre, blk);
    if (rc)
        return rc;
    char name[512];
    snprintf(name, sizeof name, "%s.mlp.gate.e_score_correction_bias", pre);
    const sd_st_tensor *tb = c->route_bias ? sd_st_find(m->st, name) : NULL;
    if (tb) {
        int64_t shape[1] = {E};
        rc = sd_st_expect(m->st, name, 1, shape, &tb, err);
        if (rc)
            return rc;
        float *hb = malloc((size_t)E * sizeof(float));
        float *db = m->be->ops->alloc(m->be, (size_t)E * sizeof(float));
        if (!hb || !db) {
            free(hb);
            return sd_err_set(err, SD_ENOMEM, "out of memory");
        }
        for (int e = 0; e < E; e++)
            hb[e] = sd_load_f32(tb->data, tb->dtype, (size_t)e);
        m->be->ops->upload(m->be, db, hb, (size_t)E * sizeof(float));
        free(hb);
        L->corr_bias = db;
    }
    /* Tensor parallel: every expert sliced (gate/up rows and down columns
     * [i0, i0 + il)). Expert parallel: experts [e0, e0 + el) whole. */
    int el = m->ep ? E / m->tp_size : E, e0 = m->ep ? m->tp_rank * el : 0;
    int il = m->ep ? I : I / m->tp_size, i0 = m->ep ? 0 : m->tp_rank * il;
    /* shared experts in the bank: S more experts after the routed ones,
     * expert j being rows [j I, (j + 1) I) of the shared gate / up and those
     * columns of its down (this rank's slice of them, as for the routed) */
    int S = m->shared_slots ? c->n_shared_experts : 0;
    L->eg = calloc((size_t)(el + S), sizeof(sd_weight));
    L->eu = calloc((size_t)(el + S), sizeof(sd_weight));
    L->ed = calloc((size_t)(el + S), sizeof(sd_weight));
    if (!L->eg || !L->eu || !L->ed)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    part pr = part_rows(i0, il), pc = part_cols(i0, il);
    /* A bank holds one dtype (the CUDA MoE kernels take one): where a shared
     * slot's rows would start inside a block of FP8 scales (placed BF16),
     * the routed experts load BF16 too (FP8's numbers rounded to BF16) */
    const int keep = m->fp8_keep, bm = m->cfg.fp8_block[0];
    if (keep && S > 1 && I % bm)
        m->fp8_keep = 0;
    for (int j = 0; j < el && !rc; j++) {
        int e = e0 + j;
        rc = get_wpf(m, &L->eg[j], err, I, D, pr, "%s.%s.experts.%d.%s.weight", pre, blk, e, gn);
        if (!rc)
            rc = get_wpf(m, &L->eu[j], err, I, D, pr, "%s.%s.experts.%d.%s.weight", pre, blk, e,
                         un);
        if (!rc)
            rc = get_wpf(m, &L->ed[j], err, D, I, pc, "%s.%s.experts.%d.%s.weight", pre, blk, e,
                         dn);
    }
    for (int j = 0; j < S && !rc; j++) {
        const int64_t IS = (int64_t)I * S;
        part sr = part_rows((int64_t)j * I + i0, il), sc = part_cols((int64_t)j * I + i0, il);
        rc = get_wpf(m, &L->eg[el + j], err, IS, D, sr, "%s.mlp.shared_experts.gate_proj.weight",
                     pre);
        if (!rc)
            rc = get_wpf(m, &L->eu[el + j], err, IS, D, sr,
                         "%s.mlp.shared_experts.up_proj.weight", pre);
        if (!rc)
            rc = get_wpf(m, &L->ed[el + j], err, D, IS, sc,
                         "%s.mlp.shared_experts.down_proj.weight", pre);
    }
    m->fp8_keep = keep;
    if (rc)
        return rc;
    L->n_always = S;
    L->experts = (sd_experts){.n = el + S, .gate = L->eg, .up = L->eu, .down = L->ed, .first = e0};
    if (c->n_shared_experts > 0 && !S) {
        char sp[512];
        snprintf(sp, sizeof sp, "%s.mlp.shared_experts", pre);
        rc = load_ffn_dense(m, sp, (int64_t)I * c->n_shared_experts, L, err);
    }
    return rc;
}

/* Projections of one input stacked into one weight [sum of n, in_dim] (and
 * their biases into one F32 vector when the parts have them), so they are
 * one matmul whose output row is the parts side by side. Every output
 * column is the dot product the separate matmuls computed, so results do
 * not change. The stacked copy is the only one placed on the backend. */
static int stack_bias(sd_model *m, sd_weight *bias, const stack_part *p, int np, sd_err *err);
static int load_stack(sd_model *m, sd_weight *w, sd_weight *bias, const stack_part *p, int np,
                      int64_t in_dim, sd_err *err)
{
    const sd_st_tensor *t[4];
    if (np > (int)SD_ARRAY_LEN(t))
        return sd_err_set(err, SD_EINVAL, "%s: %d parts to stack", p[0].name, np);
    int rc = stack_fp8(m, p, np, in_dim, w, err);
    if (rc == 0)
        return stack_bias(m, bias, p, np, err);
    if (rc != 1)
        return rc;
    int64_t R = 0;
    for (int i = 0; i < np; i++) {
        rc = find_w(m, p[i].name, p[i].full, in_dim, &t[i], err);
        if (rc)
            return rc;
        if (p[i].r0 < 0 || p[i].r0 + p[i].n > p[i].full)
            return sd_err_set(err, SD_EINVAL, "%s: shard [%lld, %lld) is outside the tensor",
                              p[i].name, (long long)p[i].r0, (long long)(p[i].r0 + p[i].n));
        R += p[i].n;
    }
    size_t cols = (size_t)in_dim;
    /* one dtype for the stack: the checkpoint's; F32 (exact) if the parts differ */
    sd_dtype dt = t[0]->dtype;
    for (int i = 1; i < np; i++)
        if (t[i]->dtype != dt)
            dt = SD_DT_F32;
    size_t es = sd_dtype_size(dt);
    char *buf = malloc((size_t)R * cols * es);
    if (!buf)
        return sd_err_set(err, SD_ENOMEM, "out of memory stacking %s", p[0].name);
    char *dst = buf;
    for (int i = 0; i < np; i++) {
        size_t n = (size_t)p[i].n * cols;
        if (t[i]->dtype == dt) {
            memcpy(dst, (const char *)t[i]->data + (size_t)p[i].r0 * cols * es, n * es);
        } else {
            for (size_t e = 0; e < n; e++)
                ((float *)(void *)dst)[e] =
                    sd_load_f32(t[i]->data, t[i]->dtype, (size_t)p[i].r0 * cols + e);
        }
        dst += n * es;
    }
    rc = upload_host(m, w, buf, dt, R, in_dim, err);
    return rc ? rc : stack_bias(m, bias, p, np, err);
}

/* The biases of a stack's parts (p[0].bias set) as one F32 vector. */
static int stack_bias(sd_model *m, sd_weight *bias, const stack_part *p, int np, sd_err *err)
{
    if (!bias || !p[0].bias[0])
        return 0;
    int64_t R = 0;
    for (int i = 0; i < np; i++)
        R += p[i].n;
    int rc;
    float *b = malloc((size_t)R * sizeof(float));
    if (!b)
        return sd_err_set(err, SD_ENOMEM, "out of memory stacking %s", p[0].bias);
    float *bo = b;
    for (int i = 0; i < np; i++) {
        const sd_st_tensor *tb;
        if ((rc = find_w(m, p[i].bias, p[i].full, 0, &tb, err))) {
            free(b);
            return rc;
        }
        /* the matmuls add the bias as fp32 (sd_load_f32): storing F32 is exact */
        for (int64_t e = 0; e < p[i].n; e++)
            *bo++ = sd_load_f32(tb->data, tb->dtype, (size_t)(p[i].r0 + e));
    }
    return upload_host(m, bias, b, SD_DT_F32, 1, R, err);
}

/* Element i of tensor t into element o of dst, as dt: t's own bits when dt
 * is t's dtype, else its value as F32. */
static void copy_elem(char *dst, size_t o, const sd_st_tensor *t, size_t i, sd_dtype dt)
{
    if (dt == t->dtype && dt != SD_DT_F32)
        memcpy(dst + o * 2, (const char *)t->data + i * 2, 2);
    else
        ((float *)(void *)dst)[o] = sd_load_f32(t->data, t->dtype, i);
}

/* Absorbed MLA weights from kv_b_proj [H*(nope+v), C]:
 * wuk_t [H*C, nope] (row h*C+c = column c of head h's key rows) and
 * wuv [H*v, C] (head h's value rows), for this rank's heads.
 * The projections of the normed input, q_a (or q_proj: this rank's heads)
 * and kv_a, are one stacked weight (wqkv): one matmul gives [q_a | c_kv k_pe]
 * (or [q | c_kv k_pe]).
 * Tensor parallel: heads split (q_b / q_proj rows, kv_b heads, o_proj
 * columns); q_a, kv_a and the latent cache replicated. */
static int load_mla(sd_model *m, const char *pre, layer *L, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int H = c->num_heads, D = c->hidden_size, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
    int nope = c->qk_nope_head_dim, vd = c->v_head_dim, qk = nope + R;
    int Hl = m->hq, h0 = m->tp_rank * m->hq;
    part pq = part_rows((int64_t)h0 * qk, (int64_t)Hl * qk);
    int rc;
    L->mla = 1;
    stack_part sp[2] = {{.full = (int64_t)H * qk, .r0 = pq.off, .n = pq.n},
                        {.full = C + R, .r0 = 0, .n = C + R}};
    if (c->q_lora_rank > 0) {
        snprintf(sp[0].name, sizeof sp[0].name, "%s.self_attn.q_a_proj.weight", pre);
        sp[0].full = sp[0].n = c->q_lora_rank;
        sp[0].r0 = 0;
    } else {
        snprintf(sp[0].name, sizeof sp[0].name, "%s.self_attn.q_proj.weight", pre);
    }
    snprintf(sp[1].name, sizeof sp[1].name, "%s.self_attn.kv_a_proj_with_mqa.weight", pre);
    rc = load_stack(m, &L->wqkv, NULL, sp, 2, D, err);
    if (!rc && c->q_lora_rank > 0) {
        rc = get_wf(m, &L->q_a_norm, err, c->q_lora_rank, 0, "%s.self_attn.q_a_layernorm.weight",
                    pre);
        if (!rc)
            rc = get_wpf(m, &L->q_b, err, (int64_t)H * qk, c->q_lora_rank, pq,
                         "%s.self_attn.q_b_proj.weight", pre);
    }
    if (!rc)
        rc = get_wf(m, &L->kv_a_norm, err, C, 0, "%s.self_attn.kv_a_layernorm.weight", pre);
    if (!rc)
        rc = get_wpf(m, &L->wo, err, D, (int64_t)H * vd, part_cols((int64_t)h0 * vd, (int64_t)Hl * vd),
                     "%s.self_attn.o_proj.weight", pre);
    if (rc)
        return rc;
    char name[512];
    snprintf(name, sizeof name, "%s.self_attn.kv_b_proj.weight", pre);
    const sd_st_tensor *kb;
    int64_t shape[2] = {(int64_t)H * (nope + vd), C};
    rc = sd_st_expect(m->st, name, 2, shape, &kb, err);
    if (rc)
        return rc;
    /* a re-layout, no arithmetic: the checkpoint's own 16-bit values when it
     * has them (half the bytes a decode step reads for them, the same
     * numbers), else F32 */
    sd_dtype dt = kb->dtype == SD_DT_BF16 || kb->dtype == SD_DT_F16 ? kb->dtype : SD_DT_F32;
    size_t es = sd_dtype_size(dt);
    char *uk = malloc((size_t)Hl * C * nope * es);
    char *uv = malloc((size_t)Hl * vd * C * es);
    if (!uk || !uv) {
        free(uk);
        free(uv);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (int h = 0; h < Hl; h++) {
        size_t base = (size_t)(h0 + h) * (size_t)(nope + vd);
        for (int n = 0; n < nope; n++)
            for (int cc = 0; cc < C; cc++)
                copy_elem(uk, ((size_t)h * C + cc) * nope + n, kb, (base + n) * (size_t)C + cc, dt);
        for (int j = 0; j < vd; j++)
            for (int cc = 0; cc < C; cc++)
                copy_elem(uv, ((size_t)h * vd + j) * C + cc, kb,
                          (base + nope + j) * (size_t)C + cc, dt);
    }
    rc = upload_host(m, &L->wuk_t, uk, dt, (int64_t)Hl * C, nope, err);
    if (!rc)
        rc = upload_host(m, &L->wuv, uv, dt, (int64_t)Hl * vd, C, err);
    return rc;
}

/* q, k and v of a GQA layer stacked into one weight [nq + 2*nkv, in_dim]:
 * this rank's rows, q [q0, q0 + nq), k and v [kv0, kv0 + nkv). */
static int load_qkv(sd_model *m, const char *pre, layer *L, int64_t in_dim, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int64_t Dh = c->head_dim;
    int64_t full[3] = {(int64_t)c->num_heads * Dh, (int64_t)c->num_kv_heads * Dh,
                       (int64_t)c->num_kv_heads * Dh};
    int64_t r0[3] = {(int64_t)m->tp_rank * m->hq * Dh, (int64_t)m->kv_head0 * Dh,
                     (int64_t)m->kv_head0 * Dh};
    int64_t nr[3] = {(int64_t)m->hq * Dh, (int64_t)m->hkv * Dh, (int64_t)m->hkv * Dh};
    static const char *proj[3] = {"q", "k", "v"};
    stack_part p[3];
    for (int i = 0; i < 3; i++) {
        snprintf(p[i].name, sizeof p[i].name, "%s.self_attn.%s_proj.weight", pre, proj[i]);
        p[i].bias[0] = 0;
        if (c->attention_bias)
            snprintf(p[i].bias, sizeof p[i].bias, "%s.self_attn.%s_proj.bias", pre, proj[i]);
        p[i].full = full[i];
        p[i].r0 = r0[i];
        p[i].n = nr[i];
    }
    L->has_bias = c->attention_bias != 0;
    return load_stack(m, &L->wqkv, &L->bqkv, p, 3, in_dim, err);
}

/* Tensor parallel: q/k/v column-parallel by heads (this rank's query heads
 * and their kv heads), o_proj row-parallel; its bias is added on rank 0 only,
 * so the all-reduce adds it once. */
static int load_gqa(sd_model *m, const char *pre, layer *L, int64_t in_dim, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int64_t Hq = c->num_heads, Dh = c->head_dim, D = c->hidden_size;
    part po = part_cols((int64_t)m->tp_rank * m->hq * Dh, (int64_t)m->hq * Dh);
    int rc = load_qkv(m, pre, L, in_dim, err);
    if (!rc)
        rc = get_wpf(m, &L->wo, err, D, Hq * Dh, po, "%s.self_attn.o_proj.weight", pre);
    if (!rc && c->attention_bias) {
        char name[512];
        snprintf(name, sizeof name, "%s.self_attn.o_proj.bias", pre);
        if (m->tp_rank == 0 && sd_st_find(m->st, name))
            rc = get_wf(m, &L->bo, err, D, 0, "%s", name);
    }
    if (!rc && c->qk_norm) {
        L->has_qk_norm = 1;
        rc = get_wf(m, &L->q_norm, err, Dh, 0, "%s.self_attn.q_norm.weight", pre);
        if (!rc)
            rc = get_wf(m, &L->k_norm, err, Dh, 0, "%s.self_attn.k_norm.weight", pre);
    }
    return rc;
}

static int load_layer(sd_model *m, int i, layer *L, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    char pre[256];
    snprintf(pre, sizeof pre, "model.layers.%d", i);
    int D = c->hidden_size;
    int rc = get_wf(m, &L->attn_norm, err, D, 0, "%s.input_layernorm.weight", pre);
    if (!rc)
        rc = get_wf(m, &L->ffn_norm, err, D, 0, "%s.post_attention_layernorm.weight", pre);
    if (rc)
        return rc;
    if (c->arch == SD_ARCH_DEEPSEEK_V3)
        rc = load_mla(m, pre, L, err);
    else
        rc = load_gqa(m, pre, L, D, err);
    if (rc)
        return rc;
    if (c->n_routed_experts > 0 && sd_model_cfg_layer_is_moe(c, i))
        return load_moe(m, pre, L, err);
    char mp[300];
    snprintf(mp, sizeof mp, "%s.mlp", pre);
    return load_ffn_dense(m, mp, c->intermediate_size, L, err);
}

static int load_mtp(sd_model *m, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int L = c->num_layers, D = c->hidden_size, V = c->vocab_size;
    int rc = load_layer(m, L, &m->mtp, err);
    if (!rc)
        rc = get_wf(m, &m->enorm, err, D, 0, "model.layers.%d.enorm.weight", L);
    if (!rc)
        rc = get_wf(m, &m->hnorm, err, D, 0, "model.layers.%d.hnorm.weight", L);
    if (!rc)
        rc = get_wf(m, &m->eh_proj, err, D, 2 * D, "model.layers.%d.eh_proj.weight", L);
    if (!rc)
        rc = get_wf(m, &m->sh_norm, err, D, 0, "model.layers.%d.shared_head.norm.weight", L);
    if (rc)
        return rc;
    /* DeepSeek-V3 stores copies of the embedding and head in the MTP layer;
     * a checkpoint without them shares the main ones. */
    part pv = part_rows(m->vocab_first, m->vocab_rows);
    if (has_tensor(m, "model.layers.%d.%s", L, "shared_head.head.weight"))
        rc = get_wpf(m, &m->sh_head, err, V, D, pv, "model.layers.%d.shared_head.head.weight", L);
    else
        m->sh_head = m->lm_head;
    if (!rc && has_tensor(m, "model.layers.%d.%s", L, "embed_tokens.weight"))
        rc = get_wpf(m, &m->mtp_embed, err, V, D, pv, "model.layers.%d.embed_tokens.weight", L);
    else
        m->mtp_embed = m->embed;
    if (!rc)
        m->has_mtp = 1;
    return rc;
}

static size_t ws_plan(sd_model *m, int T)
{
    const sd_model_cfg *c = &m->cfg;
    size_t D = (size_t)c->hidden_size, t = (size_t)T;
    size_t H = (size_t)c->num_heads;
    size_t qdim = H * (size_t)m->qk_dim;
    size_t kvdim = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    size_t C = (size_t)c->kv_lora_rank, R = (size_t)c->qk_rope_head_dim;
    size_t attdim = SD_MAX(H * (size_t)c->head_dim, H * (size_t)c->v_head_dim);
    size_t inter = SD_MAX((size_t)c->intermediate_size,
                          (size_t)c->moe_intermediate_size * (size_t)SD_MAX(c->n_shared_experts, 1));
    size_t E = (size_t)c->n_routed_experts, K = (size_t)SD_MAX(c->num_experts_per_tok, 1);
    if (m->shared_slots)
        K += (size_t)c->n_shared_experts; /* a token's slots: routed, then shared */
    /* the stacked projection's row: GQA [q | k | v], MLA [q_a or q | c_kv k_pe] */
    size_t qkvdim = c->arch == SD_ARCH_DEEPSEEK_V3
                        ? (c->q_lora_rank > 0 ? (size_t)c->q_lora_rank : qdim) + C + R
                        : H * (size_t)c->head_dim + 2 * kvdim;
    size_t sz[] = {
        t * D, t * D, t * D, t * D,             /* x xn ao fo */
        t * qkvdim,                             /* qkv */
        t * SD_MAX(qdim, H * (size_t)c->head_dim), /* q */
        t * kvdim, t * kvdim,                   /* k v */
        t * H * C, t * H * C,                   /* qlat lat */
        t * attdim,                             /* att */
        t * 2 * inter,                          /* gu */
        t * E, t * K,                           /* rlog wts */
        E ? SD_MOE_TMP_FLOATS(t, K, D, (size_t)c->moe_intermediate_size) : 0, /* moetmp */
        t * D,                                  /* xo */
        t * 2 * D,                              /* eh */
        t * K,                                  /* ids */
        m->tp_size > 1 ? t * (size_t)m->vocab_shard : 0,                    /* lg_local */
        m->tp_size > 1 ? (size_t)m->tp_size * t * (size_t)m->vocab_shard : 0, /* lg_all */
    };
    float **dst[] = {&m->x, &m->xn, &m->ao, &m->fo, &m->qkv, &m->q, &m->k, &m->v, &m->qlat, &m->lat, &m->att, &m->gu, &m->rlog, &m->wts, &m->moetmp, &m->xo,
                     &m->eh, (float **)&m->ids, &m->lg_local, &m->lg_all};
    size_t off = 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(sz); i++) {
        if (m->ws)
            *dst[i] = m->ws + off;
        off += (sz[i] + 15) & ~(size_t)15; /* 64-byte aligned pieces */
    }
    return off;
}

/* Tensor parallelism: checks that the config splits over tp_size ranks and
 * sets this rank's share. Refusals name the config key. */
static int tp_plan(sd_model *m, const char *dir, const sd_model_opts *o, sd_err *err)
{
    const sd_model_cfg *c = &m->cfg;
    int P = o->tp_size > 0 ? o->tp_size : 1, r = o->tp_rank;
    if (r < 0 || r >= P)
        return sd_err_set(err, SD_EINVAL, "tensor parallel rank %d is not in 0..%d", r, P - 1);
    if (P > 1 && (!o->comm || o->comm->size != P))
        return sd_err_set(err, SD_EINVAL, "--tp %d: the ranks need a communicator of %d ranks", P,
                          P);
    m->tp_size = P;
    m->tp_rank = r;
    m->comm = P > 1 ? o->comm : NULL;
    int Hq = c->num_heads, Hkv = c->num_kv_heads;
    if (Hq % P)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: num_attention_heads %d is not divisible by --tp %d", dir,
                          Hq, P);
    m->hq = Hq / P;
    m->hkv = Hkv;
    if (c->arch != SD_ARCH_DEEPSEEK_V3) {
        if (Hkv % P == 0) {
            m->hkv = Hkv / P;
            m->kv_head0 = r * m->hkv;
        } else if (P % Hkv == 0) {
            /* more ranks than kv heads: each rank keeps the one kv head its
             * query heads share, replicated over P / Hkv ranks */
            m->hkv = 1;
            m->kv_head0 = r / (P / Hkv);
        } else {
            return sd_err_set(err, SD_EINVAL,
                              "%s/config.json: num_key_value_heads %d does not split over --tp %d "
                              "(tp must divide it or be a multiple of it)",
                              dir, Hkv, P);
        }
    }
    int dense = 0;
    for (int i = 0; i <= c->num_layers; i++)
        dense |= !(c->n_routed_experts > 0 && sd_model_cfg_layer_is_moe(c, i));
    if (dense && c->intermediate_size % P)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: intermediate_size %d is not divisible by --tp %d", dir,
                          c->intermediate_size, P);
    m->ep = P > 1 && o->ep && c->n_routed_experts > 0;
    m->shared_slots = o->moe_shared_slots && !m->ep && c->n_routed_experts > 0 &&
                      c->n_shared_experts > 0;
    if (m->ep && c->n_routed_experts % P)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: n_routed_experts %d is not divisible by --tp %d (--ep)",
                          dir, c->n_routed_experts, P);
    /* sliced experts: the routed ones (unless --ep) and the shared ones */
    if (c->n_routed_experts > 0 && !m->ep && c->moe_intermediate_size % P)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: moe_intermediate_size %d is not divisible by --tp %d",
                          dir, c->moe_intermediate_size, P);
    if (m->ep && (c->moe_intermediate_size * c->n_shared_experts) % P)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: the shared experts' width moe_intermediate_size %d x "
                          "n_shared_experts %d is not divisible by --tp %d",
                          dir, c->moe_intermediate_size, c->n_shared_experts, P);
    /* vocab shards of ceil(V / P) rows, the last one shorter when P does
     * not divide V (its logits are gathered at their true width) */
    int V = c->vocab_size, Vs = (V + P - 1) / P;
    if ((int64_t)Vs * (P - 1) >= V)
        return sd_err_set(err, SD_EINVAL,
                          "%s/config.json: vocab_size %d is too small to shard over --tp %d", dir,
                          V, P);
    m->vocab_shard = Vs;
    m->vocab_first = r * Vs;
    m->vocab_rows = SD_MIN(Vs, V - m->vocab_first);
    return 0;
}

int sd_model_load(sd_model **out, const char *dir, sd_backend *be, const sd_model_opts *o,
                  sd_err *err)
{
    *out = NULL;
    sd_model *m = calloc(1, sizeof *m);
    if (!m)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    m->be = be;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    int rc = sd_model_cfg_load(&m->cfg, dir, err);
    if (rc)
        goto fail;
    sd_model_cfg *c = &m->cfg;
    if (c->mlp_bias) {
        rc = sd_err_set(err, SD_ENOTSUP, "%s/config.json: mlp_bias is not supported", dir);
        goto fail;
    }
    if ((rc = tp_plan(m, dir, o, err)))
        goto fail;
    rc = sd_st_open(&m->st, dir, err);
    if (rc)
        goto fail;
    /* block-scaled fp8: each weight dequantized to BF16 as it loads */
    if (c->fp8) {
        if ((rc = sd_st_fp8_blocks(m->st, c->fp8_block[0], c->fp8_block[1])))
            goto fail;
        m->fp8_keep = o->fp8_keep && be->ops->weight_fp8;
        if (m->tp_rank == 0)
            sd_log_info("%s: fp8 weights (blocks of %d x %d): %s", dir, c->fp8_block[0],
                        c->fp8_block[1],
                        m->fp8_keep ? "kept as fp8 where whole blocks load, else bf16"
                                    : "dequantized to bf16 as they load");
    }
    int D = c->hidden_size, V = c->vocab_size;
    m->qk_dim = c->arch == SD_ARCH_DEEPSEEK_V3 ? c->qk_nope_head_dim + c->qk_rope_head_dim
                                               : c->head_dim;
    part pv = part_rows(m->vocab_first, m->vocab_rows); /* vocab-parallel */
    rc = get_part(m, "model.embed_tokens.weight", V, D, pv, &m->embed, err);
    if (!rc)
        rc = get_w(m, "model.norm.weight", D, 0, &m->norm, err);
    if (rc)
        goto fail;
    if (c->tie_embeddings && !sd_st_find(m->st, "lm_head.weight"))
        m->lm_head = m->embed;
    else if ((rc = get_part(m, "lm_head.weight", V, D, pv, &m->lm_head, err)))
        goto fail;
    m->n_layers = c->num_layers;
    m->layers = calloc((size_t)c->num_layers, sizeof(layer));
    if (!m->layers) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c->num_layers; i++)
        if ((rc = load_layer(m, i, &m->layers[i], err)))
            goto fail;
    if (o->load_mtp && c->num_nextn_predict_layers > 0 &&
        has_tensor(m, "model.layers.%d.%s", c->num_layers, "eh_proj.weight"))
        if ((rc = load_mtp(m, err)))
            goto fail;
    if (m->fp8_keep && m->tp_rank == 0)
        sd_log_info("%s: %d weights kept as fp8 (%.1f MiB)", dir, m->fp8_kept,
                    (double)m->fp8_bytes / (1 << 20));
    /* rope */
    float *inv = NULL;
    rc = sd_rope_inv_freq(&c->rope, c->max_pos, &inv, err);
    if (rc)
        goto fail;
    int half = c->rope.rot_dim / 2;
    float *dinv = be->ops->alloc(be, (size_t)half * sizeof(float));
    if (!dinv) {
        free(inv);
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    be->ops->upload(be, dinv, inv, (size_t)half * sizeof(float));
    free(inv);
    m->rope = (sd_rope){.inv_freq = dinv, .rot_dim = c->rope.rot_dim,
                        .interleave = c->rope.interleave, .mscale = (float)c->rope_attn_factor};
    m->attn_scale = (float)c->softmax_scale;
    /* workspace */
    m->max_tokens = o->max_tokens > 0 ? o->max_tokens : 512;
    m->ws_floats = ws_plan(m, m->max_tokens);
    m->ws = be->ops->alloc(be, m->ws_floats * sizeof(float));
    if (!m->ws) {
        rc = sd_err_set(err, SD_ENOMEM, "workspace: out of memory (%zu bytes)",
                        m->ws_floats * sizeof(float));
        goto fail;
    }
    ws_plan(m, m->max_tokens);
    *out = m;
    return 0;
fail:
    sd_model_free(m);
    return rc;
}

static void free_layer(sd_model *m, layer *L)
{
    sd_backend *be = m->be;
    if (L->corr_bias)
        be->ops->free(be, L->corr_bias);
    free(L->eg);
    free(L->eu);
    free(L->ed);
    if (L->kc)
        be->ops->free(be, L->kc);
    if (L->vc)
        be->ops->free(be, L->vc);
}

void sd_model_free(sd_model *m)
{
    if (!m)
        return;
    sd_backend *be = m->be;
    if (m->layers)
        for (int i = 0; i < m->n_layers; i++)
            free_layer(m, &m->layers[i]);
    free(m->layers);
    free_layer(m, &m->mtp);
    if (m->ws)
        be->ops->free(be, m->ws);
    if (m->rope.inv_freq)
        be->ops->free(be, (void *)m->rope.inv_freq);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    sd_st_close(m->st);
    free(m);
}

const sd_model_cfg *sd_model_cfg_of(const sd_model *m) { return &m->cfg; }
int sd_model_has_mtp(const sd_model *m) { return m->has_mtp; }
int sd_model_fp8_kept(const sd_model *m) { return m->fp8_kept; }
size_t sd_model_weight_bytes(const sd_model *m) { return m->placed; }
int sd_model_expert_parallel(const sd_model *m) { return m->ep; }
int sd_model_tp_size(const sd_model *m) { return m->tp_size; }
int sd_model_tp_rank(const sd_model *m) { return m->tp_rank; }
const sd_weight *sd_model_embed(const sd_model *m) { return &m->embed; }
size_t sd_model_workspace_bytes(const sd_model *m) { return m->ws_floats * sizeof(float); }
const char *sd_model_dir(const sd_model *m) { return m->dir; }
sd_backend *sd_model_backend(const sd_model *m) { return m->be; }

static size_t layer_kv_floats(const sd_model *m, const layer *L)
{
    const sd_model_cfg *c = &m->cfg;
    if (L->mla)
        return (size_t)(c->kv_lora_rank + c->qk_rope_head_dim);
    return 2 * (size_t)m->hkv * (size_t)c->head_dim;
}

size_t sd_model_kv_bytes_per_slot(const sd_model *m)
{
    size_t f = 0;
    for (int i = 0; i < m->n_layers; i++)
        f += layer_kv_floats(m, &m->layers[i]);
    if (m->has_mtp)
        f += layer_kv_floats(m, &m->mtp);
    return f * sizeof(float);
}

static int alloc_layer_kv(sd_model *m, layer *L, int n_slots, sd_err *err)
{
    sd_backend *be = m->be;
    const sd_model_cfg *c = &m->cfg;
    if (L->kc)
        be->ops->free(be, L->kc);
    if (L->vc)
        be->ops->free(be, L->vc);
    L->kc = L->vc = NULL;
    size_t per = L->mla ? (size_t)(c->kv_lora_rank + c->qk_rope_head_dim)
                        : (size_t)m->hkv * (size_t)c->head_dim;
    L->kc = be->ops->alloc(be, (size_t)n_slots * per * sizeof(float));
    if (!L->mla)
        L->vc = be->ops->alloc(be, (size_t)n_slots * per * sizeof(float));
    if (!L->kc || (!L->mla && !L->vc))
        return sd_err_set(err, SD_ENOMEM, "KV cache: out of memory for %d slots", n_slots);
    return 0;
}

int sd_model_alloc_kv(sd_model *m, int n_slots, sd_err *err)
{
    for (int i = 0; i < m->n_layers; i++) {
        int rc = alloc_layer_kv(m, &m->layers[i], n_slots, err);
        if (rc)
            return rc;
    }
    if (m->has_mtp) {
        int rc = alloc_layer_kv(m, &m->mtp, n_slots, err);
        if (rc)
            return rc;
    }
    m->n_slots = n_slots;
    return 0;
}

int sd_model_set_aux_layers(sd_model *m, const int *layers, int n, sd_err *err)
{
    if (n > MAX_AUX)
        return sd_err_set(err, SD_EINVAL, "at most %d aux layers", MAX_AUX);
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] >= m->n_layers)
            return sd_err_set(err, SD_EINVAL, "aux layer %d is not a layer of the target (0..%d)",
                              layers[i], m->n_layers - 1);
        m->aux_layers[i] = layers[i];
    }
    m->n_aux = n;
    return 0;
}

/* ------------------------------------------------------------------ forward */

/* Tensor parallelism: the partial sums of the ranks (row-parallel outputs,
 * vocab-shard lookups) summed on every rank. Unsharded: nothing. A failure is
 * kept for the end of the step (every rank goes on calling the same
 * collectives, which then fail at once). */
static void tp_sum(sd_model *m, float *buf, size_t n)
{
    if (m->tp_size == 1)
        return;
    int rc = sd_comm_allreduce_sum(m->comm, m->tp_rank, buf, n);
    if (rc && !m->comm_rc)
        m->comm_rc = rc;
}

/* The fused residual path: one rank and a backend with matmul_add and
 * rmsnorm_matmul. A row-parallel output projection adds into x itself
 * (matmul_add), and the norm after a residual step is owed to its reader
 * (xn_norm): a lone GEMV takes it as its prologue (rmsnorm_matmul: the
 * attention's input projection, the dense MLP's gate/up), any other reader
 * has it computed first (xn_ready). The numbers of add, rmsnorm and matmul
 * in the unfused order, with one kernel a sublayer fewer on a GPU. */
static int fused_residual(const sd_model *m)
{
    const sd_ops *op = m->be->ops;
    return m->tp_size == 1 && op->matmul_add && op->rmsnorm_matmul;
}

/* xn = the owed norm of x, if one is owed */
static void xn_ready(sd_model *m, int T)
{
    if (!m->xn_norm)
        return;
    int D = m->cfg.hidden_size;
    m->be->ops->rmsnorm(m->be, m->xn, m->x, m->xn_norm, T, D, D, D, (float)m->cfg.rms_eps);
    m->xn_norm = NULL;
}

/* y = xn @ w^T (+ bias), or with silu matmul_silu(y, xn, w): from the owed
 * norm in one op where one is owed */
static void xn_matmul(sd_model *m, float *y, const sd_weight *w, const sd_weight *bias, int T,
                      int silu)
{
    const sd_ops *op = m->be->ops;
    int D = m->cfg.hidden_size;
    if (m->xn_norm) {
        sd_rmsnorm_matmul(m->be, y, m->xn, m->x, m->xn_norm, (float)m->cfg.rms_eps, w, bias, T,
                          silu);
        m->xn_norm = NULL;
    } else if (silu) {
        op->matmul_silu(m->be, y, m->xn, w, T, D);
    } else {
        op->matmul(m->be, y, m->xn, w, bias, T, D);
    }
}

/* A row-parallel output projection of x_in (T, K): on the fused path added
 * into x (returns 1), else its partial into out (returns 0: the residual
 * step adds it). */
static int out_proj(sd_model *m, float *out, const float *x_in, const sd_weight *w,
                    const sd_weight *bias, int T, int K)
{
    if (fused_residual(m)) {
        sd_matmul_add(m->be, m->x, x_in, w, bias, T, K, out);
        return 1;
    }
    m->be->ops->matmul(m->be, out, x_in, w, bias, T, K);
    return 0;
}

/* The residual step after a row-parallel sublayer (o_proj, down_proj, the
 * MoE combine): x += the ranks' partials summed (partial NULL: the
 * sublayer added into x itself), then xn = norm(x), the input of the next
 * sublayer or of the head. The fused path: the add where one is left, and
 * the norm owed. One rank: add and rmsnorm (one op, add_rmsnorm, where the
 * backend has it). Several: the communicator's all-reduce + add + RMSNorm,
 * fused where it has a kernel for it (the custom GPU all-reduce), else the
 * same three steps. */
static void residual_norm(sd_model *m, float *partial, const sd_weight *norm, int T)
{
    const sd_ops *op = m->be->ops;
    int D = m->cfg.hidden_size;
    float eps = (float)m->cfg.rms_eps;
    if (fused_residual(m)) {
        if (partial)
            op->add(m->be, m->x, partial, T, D);
        m->xn_norm = norm;
        return;
    }
    if (m->tp_size == 1) {
        if (op->add_rmsnorm) {
            op->add_rmsnorm(m->be, m->xn, m->x, partial, norm, T, D, eps);
        } else {
            op->add(m->be, m->x, partial, T, D);
            op->rmsnorm(m->be, m->xn, m->x, norm, T, D, D, D, eps);
        }
        return;
    }
    int rc = sd_comm_allreduce_add_rmsnorm(m->comm, m->tp_rank, m->be, partial, m->x, m->xn, norm,
                                           T, D, eps);
    if (rc && !m->comm_rc)
        m->comm_rc = rc;
}

/* xn = norm(x) at the start of a forward: owed on the fused path */
static void first_norm(sd_model *m, const sd_weight *norm, int T)
{
    m->xn_norm = norm;
    if (!fused_residual(m))
        xn_ready(m, T);
}

/* out(T, D) = embedding rows of tokens; vocab-parallel when sharded. */
static void embed_tokens(sd_model *m, float *out, const sd_weight *table, const int32_t *tokens,
                         int T)
{
    sd_backend *be = m->be;
    if (m->tp_size == 1) {
        be->ops->embed(be, out, table, tokens, T);
        return;
    }
    be->ops->embed_shard(be, out, table, tokens, T, m->vocab_first);
    tp_sum(m, out, (size_t)T * (size_t)m->cfg.hidden_size);
}

/* logits(n, V) = x(n, D) @ lm^T; sharded: this rank's vocab rows, then the
 * shards all-gathered (n, Vs) per rank and laid side by side. */
static void lm_logits(sd_model *m, float *logits, const float *x, const sd_weight *lm, int n)
{
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size, Vs = m->vocab_shard;
    if (m->tp_size == 1) {
        op->matmul(be, logits, x, lm, NULL, n, D);
        return;
    }
    op->matmul(be, m->lg_local, x, lm, NULL, n, D); /* (n, vocab_rows) */
    size_t chunk = (size_t)n * (size_t)Vs;
    int rc = sd_comm_allgather(m->comm, m->tp_rank, m->lg_all, m->lg_local, chunk);
    if (rc && !m->comm_rc)
        m->comm_rc = rc;
    for (int r = 0; r < m->tp_size; r++) {
        int rows = SD_MIN(Vs, V - r * Vs);
        op->copy2d(be, logits + (size_t)r * (size_t)Vs, m->lg_all + (size_t)r * chunk, n, rows, V,
                   rows);
    }
}

/* DeepSeek's q_a_layernorm and kv_a_layernorm use RMSNorm's default eps. */
#define MLA_NORM_EPS 1e-6f

/* q, k, v come out of one matmul as the row [q | k | v] of qkv (T, W),
 * W = (Hq + 2 Hkv) Dh, and the ops read them in place (rows W apart).
 * Returns out_proj's: 1 when the output went into x. */
static int attention_gqa(sd_model *m, layer *L, const sd_attn_batch *ab, int T)
{
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    const sd_model_cfg *c = &m->cfg;
    int Hq = m->hq, Hkv = m->hkv, Dh = c->head_dim; /* this rank's heads */
    int W = (int)L->wqkv.rows;
    xn_matmul(m, m->qkv, &L->wqkv, L->has_bias ? &L->bqkv : NULL, T, 0);
    float *q = m->qkv, *k = q + (size_t)Hq * Dh, *v = k + (size_t)Hkv * Dh;
    int qs = W, kvs = W;
    if (L->has_qk_norm) {
        /* The norms take rows of Dh a fixed stride apart: the heads of one
         * token are, those of several tokens are not (W apart per token).
         * Several tokens: dense copies of q, k, v first. */
        if (T > 1) {
            op->copy2d(be, m->q, q, T, Hq * Dh, Hq * Dh, W);
            op->copy2d(be, m->k, k, T, Hkv * Dh, Hkv * Dh, W);
            op->copy2d(be, m->v, v, T, Hkv * Dh, Hkv * Dh, W);
            q = m->q, k = m->k, v = m->v;
            qs = Hq * Dh, kvs = Hkv * Dh;
        }
        op->rmsnorm(be, q, q, &L->q_norm, T * Hq, Dh, Dh, Dh, (float)c->rms_eps);
        op->rmsnorm(be, k, k, &L->k_norm, T * Hkv, Dh, Dh, Dh, (float)c->rms_eps);
    }
    /* rope of q and k and the cache store in one op; attention over the cache */
    op->rope_kv(be, q, k, v, L->kc, L->vc, ab, &m->rope, Hq, Hkv, Dh, Dh, qs, kvs);
    op->attn_gqa(be, m->att, q, NULL, NULL, L->kc, L->vc, ab, Hq, Hkv, Dh, Dh, qs, kvs,
                 m->attn_scale);
    return out_proj(m, m->ao, m->att, &L->wo, L->bo.data ? &L->bo : NULL, T, Hq * Dh);
}

/* The chain below is latency-bound at decode sizes and leaves DRAM mostly
 * idle, but weights asked into L2 meanwhile (cp.async.bulk.prefetch.L2)
 * never paid: the next weights after the qkv matmul, 9.8% slower on an H200
 * (session 13); the always-on experts' 23 MB, 2-9% slower on an H100 when
 * issued during the qkv matmul or at the decode attention's start (its
 * loads queue behind the prefetch), and a tie after attention, where the
 * prefetch saved about what its own kernel cost (session 57:
 * bench/results/ab-l2-prefetch-*.json; the code at 5161d6b, its own kernel
 * at either site, and 9ad5502, issued by the decode attention's blocks). */
static int attention_mla(sd_model *m, layer *L, const sd_attn_batch *ab, int T)
{
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    const sd_model_cfg *c = &m->cfg;
    int H = m->hq, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
    int nope = c->qk_nope_head_dim, vd = c->v_head_dim, qk = nope + R;
    /* one matmul: the row [q_a | c_kv k_pe] (q_lora) or [q | c_kv k_pe], W wide */
    int W = (int)L->wqkv.rows;
    xn_matmul(m, m->qkv, &L->wqkv, NULL, T, 0);
    float *ckv = m->qkv + (W - (C + R)), *q = m->qkv;
    int qs = W; /* q's row stride */
    if (c->q_lora_rank > 0) {
        op->rmsnorm(be, m->qkv, m->qkv, &L->q_a_norm, T, c->q_lora_rank, W, W, MLA_NORM_EPS);
        op->matmul(be, m->q, m->qkv, &L->q_b, NULL, T, W);
        q = m->q;
        qs = H * qk;
    }
    /* the latent's norm, both ropes and the cache store in one op; beside
     * it, absorbed: q_lat = W_UK^T q_nope per head; attend over the latent
     * cache */
    sd_mla_prep_absorb(be, ckv, W, q + nope, qs, qk, &L->kv_a_norm, MLA_NORM_EPS, L->kc, ab,
                       &m->rope, H, C, R, m->qlat, q, &L->wuk_t, qs, qk);
    op->attn_mla(be, m->lat, m->qlat, q + nope, NULL, NULL, L->kc, ab, H, C, R, qs, qk, W,
                 m->attn_scale);
    op->matmul_heads(be, m->att, m->lat, &L->wuv, T, H, H * C, C, 0);
    return out_proj(m, m->ao, m->att, &L->wo, NULL, T, H * vd);
}

/* Returns out_proj's: 1 when the output went into x (a dense MLP on the
 * fused path). */
static int ffn(sd_model *m, layer *L, int T)
{
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    const sd_model_cfg *c = &m->cfg;
    int D = c->hidden_size;
    if (L->moe) {
        int K = c->num_experts_per_tok;
        sd_moe_route r = {.n_experts = c->n_routed_experts, .top_k = K, .n_group = c->n_group,
                          .topk_group = c->topk_group, .norm_topk_prob = c->norm_topk_prob,
                          .sigmoid = c->scoring_sigmoid,
                          .routed_scaling_factor = (float)c->routed_scaling_factor,
                          .n_always = L->n_always};
        xn_ready(m, T); /* three readers: the router, the experts, the shared MLP */
        sd_moe_router_ffn(be, m->fo, m->ids, m->wts, m->rlog, m->xn, &L->router, L->corr_bias,
                          &L->experts, T, D, &r, m->moetmp);
        if (!L->gate_up.data)
            return 0;
        op->matmul_silu(be, m->gu, m->xn, &L->gate_up, T, D);
        /* fo += the shared experts: a rank's partial, any tp */
        sd_matmul_add(be, m->fo, m->gu, &L->down, NULL, T, L->ffn_inter, m->ao);
        return 0;
    }
    xn_matmul(m, m->gu, &L->gate_up, NULL, T, 1);
    return out_proj(m, m->fo, m->gu, &L->down, NULL, T, L->ffn_inter);
}

/* x += attn(norm(x)); x += ffn(norm(x)). On entry xn = attn_norm(x) (the
 * previous residual step normed it); on return xn = next_norm(x): the next
 * layer's attn_norm or the head's final norm, so each residual add and the
 * norm after it are one step (fused with the all-reduce on GPUs). */
static void decoder_layer(sd_model *m, layer *L, const sd_attn_batch *ab, int T,
                          const sd_weight *next_norm)
{
    int added = L->mla ? attention_mla(m, L, ab, T) : attention_gqa(m, L, ab, T);
    residual_norm(m, added ? NULL : m->ao, &L->ffn_norm, T); /* row-parallel o_proj partials */
    added = ffn(m, L, T);
    residual_norm(m, added ? NULL : m->fo, next_norm, T); /* down / experts' down partials */
}

static int check_batch(sd_model *m, const sd_fwd *f, sd_err *err)
{
    if (f->ab.n_tokens <= 0 || f->ab.n_tokens > m->max_tokens)
        return sd_err_set(err, SD_EINVAL, "forward: %d tokens (workspace holds %d)",
                          f->ab.n_tokens, m->max_tokens);
    if (f->n_out < 0 || f->n_out > f->ab.n_tokens)
        return sd_err_set(err, SD_EINVAL, "forward: %d output rows for %d tokens", f->n_out,
                          f->ab.n_tokens);
    if (!m->layers[0].kc)
        return sd_err_set(err, SD_ESTATE, "forward: the KV cache is not allocated");
    return 0;
}

/* hidden out, logits of the wanted rows; xn holds the final-normed x (the
 * last layer's residual step normed it) */
static void head(sd_model *m, const sd_fwd *f, const sd_weight *lm)
{
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    int T = f->ab.n_tokens, D = m->cfg.hidden_size;
    xn_ready(m, T);
    if (f->hidden)
        op->copy2d(be, f->hidden, m->xn, T, D, D, D);
    if (f->logits && f->n_out > 0) {
        op->gather_rows(be, m->xo, m->xn, f->out_rows, f->n_out, D, D, D);
        lm_logits(m, f->logits, m->xo, lm, f->n_out);
    }
}

/* The step's collectives failed: report it once (then clear it). */
static int step_status(sd_model *m, sd_err *err)
{
    int rc = m->comm_rc;
    m->comm_rc = 0;
    if (rc)
        return sd_err_set(err, rc, "tensor parallel rank %d of %d: a %s collective failed (%s)",
                          m->tp_rank, m->tp_size, sd_comm_name(m->comm), sd_strerror(rc));
    return 0;
}

int sd_model_forward(sd_model *m, const sd_fwd *f, sd_err *err)
{
    int rc = check_batch(m, f, err);
    if (rc)
        return rc;
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    int T = f->ab.n_tokens, D = m->cfg.hidden_size;
    embed_tokens(m, m->x, &m->embed, f->tokens, T);
    first_norm(m, m->n_layers ? &m->layers[0].attn_norm : &m->norm, T);
    for (int i = 0; i < m->n_layers; i++) {
        decoder_layer(m, &m->layers[i], &f->ab, T,
                      i + 1 < m->n_layers ? &m->layers[i + 1].attn_norm : &m->norm);
        /* EAGLE-3 ids name a layer's OUTPUT (the residual stream after it) */
        for (int a = 0; a < m->n_aux; a++)
            if (f->aux && m->aux_layers[a] == i)
                op->copy2d(be, f->aux + (size_t)a * (size_t)D, m->x, T, D, m->n_aux * D, D);
    }
    head(m, f, &m->lm_head);
    return step_status(m, err);
}

int sd_model_mtp_forward(sd_model *m, const sd_fwd *f, sd_err *err)
{
    if (!m->has_mtp)
        return sd_err_set(err, SD_ESTATE, "%s: the checkpoint has no MTP layer", m->dir);
    if (!m->mtp.kc)
        return sd_err_set(err, SD_ESTATE, "MTP: the KV cache is not allocated");
    int rc = check_batch(m, f, err);
    if (rc)
        return rc;
    const sd_ops *op = m->be->ops;
    sd_backend *be = m->be;
    int T = f->ab.n_tokens, D = m->cfg.hidden_size;
    float eps = (float)m->cfg.rms_eps;
    /* eh = [enorm(embed(x_{i+1})), hnorm(h_i)]: the embedding half first */
    embed_tokens(m, m->xn, &m->mtp_embed, f->tokens, T);
    op->rmsnorm(be, m->eh, m->xn, &m->enorm, T, D, D, 2 * D, eps);
    op->rmsnorm(be, m->eh + D, f->in_hidden, &m->hnorm, T, D, D, 2 * D, eps);
    op->matmul(be, m->x, m->eh, &m->eh_proj, NULL, T, 2 * D);
    first_norm(m, &m->mtp.attn_norm, T);
    decoder_layer(m, &m->mtp, &f->ab, T, &m->sh_norm);
    if (f->out_hidden)
        op->copy2d(be, f->out_hidden, m->x, T, D, D, D);
    sd_fwd g = *f;
    g.hidden = NULL;
    head(m, &g, &m->sh_head);
    return step_status(m, err);
}

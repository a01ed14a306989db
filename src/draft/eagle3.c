#include "draft/eagle3.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "target/rope.h"

struct sd_eagle3 {
    sd_backend *be;
    sd_st *st;
    sd_st *tst; /* the target's checkpoint, for a whole embedding under tensor parallelism */
    char dir[1024];
    int H, D, Hq, Hkv, hd, I, V, Vd, max_tokens;
    double eps;
    int aux[3];
    sd_weight fc, in_ln, hid_ln, wq, wk, wv, wo, post_ln, gate_up, down, norm, lm_head, embed;
    void *gate_up_host;
    int32_t *d2t;
    sd_rope rope;
    float *inv_freq;
    void *kc, *vc;
    float *ws, *hid, *x2, *q, *k, *v, *att, *h, *xn, *gu, *xo;
};

static int e3_getw(sd_eagle3 *h, const char *name, int64_t rows, int64_t cols, sd_weight *w,
                sd_err *err)
{
    const sd_st_tensor *t;
    int64_t shape[2] = {rows, cols};
    int rc = sd_st_expect(h->st, name, cols ? 2 : 1, shape, &t, err);
    if (rc)
        return rc;
    if (h->be->ops->weight(h->be, w, t->data, t->dtype, cols ? rows : 1, cols ? cols : rows))
        return sd_err_set(err, SD_ENOTSUP, "%s: tensor %s: dtype %s is not supported", h->dir,
                          name, sd_dtype_name(t->dtype));
    return 0;
}

static int jint(json_t *cfg, const char *key, int def, int *out, const char *path, sd_err *err)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (def < 0)
            return sd_err_set(err, SD_ENOENT, "%s: key %s is missing", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return sd_err_set(err, SD_EFORMAT, "%s: key %s must be a positive integer", path, key);
    *out = (int)json_integer_value(v);
    return 0;
}

int sd_eagle3_load(sd_eagle3 **out, const char *dir, sd_backend *be, const sd_model *target,
                   int max_tokens, sd_err *err)
{
    *out = NULL;
    sd_eagle3 *h = calloc(1, sizeof *h);
    if (!h)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    h->be = be;
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    const sd_model_cfg *tc = sd_model_cfg_of(target);
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    int rc = 0;
    if (!cfg) {
        rc = sd_err_set(err, SD_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
        goto fail;
    }
    if ((rc = jint(cfg, "hidden_size", -1, &h->H, path, err)) ||
        (rc = jint(cfg, "num_attention_heads", -1, &h->Hq, path, err)) ||
        (rc = jint(cfg, "num_key_value_heads", h->Hq, &h->Hkv, path, err)) ||
        (rc = jint(cfg, "intermediate_size", -1, &h->I, path, err)) ||
        (rc = jint(cfg, "vocab_size", -1, &h->V, path, err)) ||
        (rc = jint(cfg, "draft_vocab_size", h->V, &h->Vd, path, err)) ||
        (rc = jint(cfg, "head_dim", h->H / h->Hq, &h->hd, path, err)))
        goto fail;
    json_t *eps = json_object_get(cfg, "rms_norm_eps");
    h->eps = json_is_number(eps) ? json_number_value(eps) : 1e-6;
    json_t *th = json_object_get(cfg, "rope_theta");
    sd_rope_cfg rc_cfg = {.type = SD_ROPE_DEFAULT, .theta = json_is_number(th) ? json_number_value(th) : 10000.0,
                          .factor = 1, .rot_dim = h->hd};
    h->D = tc->hidden_size;
    if (h->V != tc->vocab_size) {
        rc = sd_err_set(err, SD_EINVAL, "%s: vocab_size %d differs from the target's %d", path,
                        h->V, tc->vocab_size);
        goto fail;
    }
    if (h->H != h->D) {
        rc = sd_err_set(err, SD_EINVAL, "%s: hidden_size %d differs from the target's %d", path,
                        h->H, h->D);
        goto fail;
    }
    if (h->Hq % h->Hkv) {
        rc = sd_err_set(err, SD_EINVAL, "%s: %d heads are not a multiple of %d kv heads", path,
                        h->Hq, h->Hkv);
        goto fail;
    }
    /* low / mid / high: the config's ids, else SGLang's default */
    int L = tc->num_layers;
    int def[3] = {1, L / 2 - 1, L - 4};
    json_t *ids = json_object_get(json_object_get(cfg, "eagle_config"), "eagle_aux_hidden_state_layer_ids");
    for (int i = 0; i < 3; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        h->aux[i] = v ? (int)json_integer_value(v) : def[i];
        if (h->aux[i] < 0 || h->aux[i] >= L) {
            rc = sd_err_set(err, SD_EINVAL,
                            "%s: eagle_aux_hidden_state_layer_ids[%d] = %d is not a layer of the "
                            "target (0..%d)",
                            path, i, h->aux[i], L - 1);
            goto fail;
        }
    }
    if (ids && json_array_size(ids) != 3) {
        rc = sd_err_set(err, SD_EINVAL, "%s: eagle_aux_hidden_state_layer_ids must have 3 ids", path);
        goto fail;
    }
    if ((rc = sd_st_open(&h->st, dir, err)))
        goto fail;
    int H = h->H, qd = h->Hq * h->hd, kvd = h->Hkv * h->hd;
    if ((rc = e3_getw(h, "fc.weight", H, 3 * h->D, &h->fc, err)) ||
        (rc = e3_getw(h, "midlayer.input_layernorm.weight", H, 0, &h->in_ln, err)) ||
        (rc = e3_getw(h, "midlayer.hidden_norm.weight", H, 0, &h->hid_ln, err)) ||
        (rc = e3_getw(h, "midlayer.self_attn.q_proj.weight", qd, 2 * H, &h->wq, err)) ||
        (rc = e3_getw(h, "midlayer.self_attn.k_proj.weight", kvd, 2 * H, &h->wk, err)) ||
        (rc = e3_getw(h, "midlayer.self_attn.v_proj.weight", kvd, 2 * H, &h->wv, err)) ||
        (rc = e3_getw(h, "midlayer.self_attn.o_proj.weight", H, qd, &h->wo, err)) ||
        (rc = e3_getw(h, "midlayer.post_attention_layernorm.weight", H, 0, &h->post_ln, err)) ||
        (rc = e3_getw(h, "midlayer.mlp.down_proj.weight", H, h->I, &h->down, err)) ||
        (rc = e3_getw(h, "norm.weight", H, 0, &h->norm, err)) ||
        (rc = e3_getw(h, "lm_head.weight", h->Vd, H, &h->lm_head, err)))
        goto fail;
    /* gate and up stacked [2I, H] for one matmul + silu_mul */
    {
        const sd_st_tensor *g, *u;
        int64_t sh[2] = {h->I, H};
        if ((rc = sd_st_expect(h->st, "midlayer.mlp.gate_proj.weight", 2, sh, &g, err)) ||
            (rc = sd_st_expect(h->st, "midlayer.mlp.up_proj.weight", 2, sh, &u, err)))
            goto fail;
        h->gate_up_host = malloc(g->nbytes + u->nbytes);
        if (!h->gate_up_host || g->dtype != u->dtype) {
            rc = sd_err_set(err, SD_EFORMAT, "%s: gate/up projections", dir);
            goto fail;
        }
        memcpy(h->gate_up_host, g->data, g->nbytes);
        memcpy((char *)h->gate_up_host + g->nbytes, u->data, u->nbytes);
        if (be->ops->weight(be, &h->gate_up, h->gate_up_host, g->dtype, 2 * (int64_t)h->I, H)) {
            rc = sd_err_set(err, SD_EDEVICE, "%s: cannot place the MLP", dir);
            goto fail;
        }
    }
    if (sd_st_find(h->st, "embed_tokens.weight")) {
        if ((rc = e3_getw(h, "embed_tokens.weight", h->V, H, &h->embed, err)))
            goto fail;
    } else if (sd_model_tp_size(target) > 1) {
        /* the target's embedding is split over the tensor-parallel ranks:
         * the head takes a whole copy from the target's checkpoint */
        const sd_st_tensor *t;
        int64_t sh[2] = {h->V, H};
        if ((rc = sd_st_open(&h->tst, sd_model_dir(target), err)) ||
            (rc = sd_st_expect(h->tst, "model.embed_tokens.weight", 2, sh, &t, err)))
            goto fail;
        if (be->ops->weight(be, &h->embed, t->data, t->dtype, h->V, H)) {
            rc = sd_err_set(err, SD_EDEVICE, "%s: cannot place the target's embedding", dir);
            goto fail;
        }
    } else {
        h->embed = *sd_model_embed(target);
    }
    /* d2t */
    {
        const sd_st_tensor *t = sd_st_find(h->st, "d2t");
        h->d2t = malloc((size_t)h->Vd * sizeof(int32_t));
        if (!h->d2t) {
            rc = sd_err_set(err, SD_ENOMEM, "out of memory");
            goto fail;
        }
        if (!t) {
            if (h->Vd != h->V) {
                rc = sd_err_set(err, SD_ENOENT, "%s: tensor d2t is missing (draft vocab %d < %d)",
                                dir, h->Vd, h->V);
                goto fail;
            }
            for (int i = 0; i < h->Vd; i++)
                h->d2t[i] = i;
        } else {
            if (t->ndim != 1 || t->shape[0] != h->Vd || (t->dtype != SD_DT_I64 && t->dtype != SD_DT_I32)) {
                rc = sd_err_set(err, SD_EFORMAT, "%s: tensor d2t must be [%d] int64", dir, h->Vd);
                goto fail;
            }
            for (int i = 0; i < h->Vd; i++) {
                int64_t off = t->dtype == SD_DT_I64 ? ((const int64_t *)t->data)[i]
                                                    : ((const int32_t *)t->data)[i];
                int64_t id = i + off;
                if (id < 0 || id >= h->V) {
                    rc = sd_err_set(err, SD_EFORMAT, "%s: d2t[%d] maps to %lld, outside the vocabulary",
                                    dir, i, (long long)id);
                    goto fail;
                }
                h->d2t[i] = (int32_t)id;
            }
        }
    }
    /* rope */
    if ((rc = sd_rope_inv_freq(&rc_cfg, 1 << 20, &h->inv_freq, err)))
        goto fail;
    float *dinv = be->ops->alloc(be, (size_t)(h->hd / 2) * sizeof(float));
    if (!dinv) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    be->ops->upload(be, dinv, h->inv_freq, (size_t)(h->hd / 2) * sizeof(float));
    h->rope = (sd_rope){.inv_freq = dinv, .rot_dim = h->hd, .interleave = 0, .mscale = 1.0f};
    /* workspace */
    h->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens;
    size_t sz[] = {T * H, T * 2 * H, T * qd, T * kvd, T * kvd, T * qd, T * H, T * H, T * 2 * h->I, T * H};
    size_t tot = 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(sz); i++)
        tot += (sz[i] + 15) & ~(size_t)15;
    h->ws = be->ops->alloc(be, tot * sizeof(float));
    if (!h->ws) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    float **dst[] = {&h->hid, &h->x2, &h->q, &h->k, &h->v, &h->att, &h->h, &h->xn, &h->gu, &h->xo};
    size_t off = 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(sz); i++) {
        *dst[i] = h->ws + off;
        off += (sz[i] + 15) & ~(size_t)15;
    }
    json_decref(cfg);
    *out = h;
    return 0;
fail:
    json_decref(cfg);
    sd_eagle3_free(h);
    return rc;
}

void sd_eagle3_free(sd_eagle3 *h)
{
    if (!h)
        return;
    sd_backend *be = h->be;
    if (h->ws)
        be->ops->free(be, h->ws);
    if (h->kc)
        be->ops->free(be, h->kc);
    if (h->vc)
        be->ops->free(be, h->vc);
    if (h->rope.inv_freq)
        be->ops->free(be, (void *)h->rope.inv_freq);
    free(h->inv_freq);
    free(h->gate_up_host);
    free(h->d2t);
    sd_st_close(h->st);
    sd_st_close(h->tst);
    free(h);
}

int sd_eagle3_aux_layers(const sd_eagle3 *h, int *ids)
{
    memcpy(ids, h->aux, sizeof h->aux);
    return 3;
}
int sd_eagle3_draft_vocab(const sd_eagle3 *h) { return h->Vd; }
int sd_eagle3_hidden(const sd_eagle3 *h) { return h->H; }
const int32_t *sd_eagle3_d2t(const sd_eagle3 *h) { return h->d2t; }

size_t sd_eagle3_kv_bytes_per_slot(const sd_eagle3 *h)
{
    return 2 * (size_t)h->Hkv * (size_t)h->hd * sizeof(float);
}

size_t sd_eagle3_workspace_bytes(const sd_eagle3 *h)
{
    size_t T = (size_t)h->max_tokens;
    return T * sizeof(float) *
           ((size_t)h->H * 5 + (size_t)h->Hq * h->hd * 2 + (size_t)h->Hkv * h->hd * 2 +
            2 * (size_t)h->I);
}

int sd_eagle3_alloc_kv(sd_eagle3 *h, int n_slots, sd_err *err)
{
    size_t per = (size_t)h->Hkv * (size_t)h->hd * sizeof(float);
    h->kc = h->be->ops->alloc(h->be, (size_t)n_slots * per);
    h->vc = h->be->ops->alloc(h->be, (size_t)n_slots * per);
    if (!h->kc || !h->vc)
        return sd_err_set(err, SD_ENOMEM, "EAGLE-3 KV cache: out of memory for %d slots", n_slots);
    return 0;
}

int sd_eagle3_forward(sd_eagle3 *h, const sd_fwd *f, int first, sd_err *err)
{
    int T = f->ab.n_tokens;
    if (T <= 0 || T > h->max_tokens)
        return sd_err_set(err, SD_EINVAL, "EAGLE-3: %d tokens (workspace holds %d)", T, h->max_tokens);
    if (!h->kc)
        return sd_err_set(err, SD_ESTATE, "EAGLE-3: the KV cache is not allocated");
    sd_backend *be = h->be;
    const sd_ops *op = be->ops;
    int H = h->H, qd = h->Hq * h->hd, kvd = h->Hkv * h->hd;
    float eps = (float)h->eps;
    if (first)
        op->matmul(be, h->hid, f->in_hidden, &h->fc, NULL, T, 3 * h->D);
    else
        op->copy2d(be, h->hid, f->in_hidden, T, H, H, H);
    /* x2 = [input_layernorm(embed(token)), hidden_norm(hidden)] */
    op->embed(be, h->xn, &h->embed, f->tokens, T);
    op->rmsnorm(be, h->x2, h->xn, &h->in_ln, T, H, H, 2 * H, eps);
    op->rmsnorm(be, h->x2 + H, h->hid, &h->hid_ln, T, H, H, 2 * H, eps);
    op->matmul(be, h->q, h->x2, &h->wq, NULL, T, 2 * H);
    op->matmul(be, h->k, h->x2, &h->wk, NULL, T, 2 * H);
    op->matmul(be, h->v, h->x2, &h->wv, NULL, T, 2 * H);
    /* both ropes and the cache store in one op; attention over the cache */
    op->rope_kv(be, h->q, h->k, h->v, h->kc, h->vc, &f->ab, &h->rope, h->Hq, h->Hkv, h->hd, h->hd,
                qd, kvd);
    op->attn_gqa(be, h->att, h->q, NULL, NULL, h->kc, h->vc, &f->ab, h->Hq, h->Hkv, h->hd, h->hd,
                 qd, kvd, (float)(1.0 / sqrt((double)h->hd)));
    /* r = hidden + o_proj(att); out = r + mlp(post_ln(r)), the residual r
     * kept in hid (this step's copy of the input hidden: read no more) */
    float *r = h->hid;
    sd_matmul_add(be, r, h->att, &h->wo, NULL, T, qd, h->h);
    sd_rmsnorm_matmul(be, h->gu, h->xn, r, &h->post_ln, eps, &h->gate_up, NULL, T, 1);
    sd_matmul_add(be, r, h->gu, &h->down, NULL, T, h->I, h->xn);
    if (f->out_hidden)
        op->copy2d(be, f->out_hidden, r, T, H, H, H);
    if (f->logits && f->n_out > 0) {
        op->gather_rows(be, h->xo, r, f->out_rows, f->n_out, H, H, H);
        op->rmsnorm(be, h->xo, h->xo, &h->norm, f->n_out, H, H, H, eps);
        op->matmul(be, f->logits, h->xo, &h->lm_head, NULL, f->n_out, H);
    }
    return 0;
}

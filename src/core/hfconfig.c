/* core/hfconfig: config.json -> sd_model_cfg.
 *
 * Optional keys default the way transformers' config classes default them
 * (LlamaConfig, Qwen3Config, DeepseekV3Config); the keys that fix the shapes
 * of the weights are required, since a default there would build a model that
 * does not match its checkpoint. A key present with JSON null counts as absent,
 * except where null means something (q_lora_rank: null = no q LoRA;
 * n_routed_experts: null = dense). */
#include "core/hfconfig.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* Where values come from, for messages: path names the file, obj the nested
 * dict ("rope_scaling") or NULL for the top level. */
typedef struct sd__jctx {
    const char *path;
    const char *obj;
    sd_err *err;
} sd__jctx;

static const char *sd__jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

/* "rope_scaling.factor" or "factor" */
static const char *sd__kname(const sd__jctx *c, const char *key, char *buf, size_t cap)
{
    if (c->obj)
        snprintf(buf, cap, "%s.%s", c->obj, key);
    else
        snprintf(buf, cap, "%s", key);
    return buf;
}

static int sd__missing(const sd__jctx *c, const char *key)
{
    char k[128];
    return sd_err_set(c->err, SD_ENOENT, "%s: key \"%s\" is missing", c->path,
                      sd__kname(c, key, k, sizeof k));
}

static int sd__badtype(const sd__jctx *c, const char *key, const char *want, const json_t *v)
{
    char k[128];
    return sd_err_set(c->err, SD_EFORMAT, "%s: key \"%s\" must be %s, not %s", c->path,
                      sd__kname(c, key, k, sizeof k), want, sd__jtype(v));
}

static int sd__range(const sd__jctx *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int sd__range(const sd__jctx *c, const char *key, const char *fmt, ...)
{
    char k[128], why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return sd_err_set(c->err, SD_ERANGE, "%s: key \"%s\" %s", c->path,
                      sd__kname(c, key, k, sizeof k), why);
}

/* 1 when the key is present with JSON null. */
static int sd__null(json_t *obj, const char *key)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return v && json_is_null(v);
}

/* NULL when absent or null. */
static json_t *sd__get(json_t *obj, const char *key)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

/* Integer in [lo, hi], def when absent. A real with an integral value
 * (4096.0) is accepted: some writers emit every number as a float. */
static int sd__int_of(const sd__jctx *c, json_t *v, const char *key, long long def, long long lo,
                      long long hi, int *out);
static int sd__int(const sd__jctx *c, json_t *obj, const char *key, int required, long long def,
                   long long lo, long long hi, int *out)
{
    json_t *v = sd__get(obj, key);
    if (!v && required)
        return sd__missing(c, key);
    return sd__int_of(c, v, key, def, lo, hi, out);
}

/* Value v (NULL: def) of key as an integer in [lo, hi] (sd__int's rules). */
static int sd__int_of(const sd__jctx *c, json_t *v, const char *key, long long def, long long lo,
                      long long hi, int *out)
{
    long long x;
    if (!v) {
        x = def;
    } else if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return sd__badtype(c, key, "an integer", v);
    }
    if (x < lo || x > hi)
        return sd__range(c, key, "= %lld is out of range [%lld, %lld]", x, lo, hi);
    *out = (int)x;
    return 0;
}

/* Number (integer or real), def when absent; *present (if given) tells which. */
static int sd__num(const sd__jctx *c, json_t *obj, const char *key, int required, double def,
                   double *out, int *present)
{
    json_t *v = sd__get(obj, key);
    if (present)
        *present = v != NULL;
    if (!v) {
        if (required)
            return sd__missing(c, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return sd__badtype(c, key, "a number", v);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return sd__range(c, key, "is not finite");
    return 0;
}

/* true/false; 0/1 integers are accepted too. */
static int sd__bool(const sd__jctx *c, json_t *obj, const char *key, int def, int *out)
{
    json_t *v = sd__get(obj, key);
    if (!v)
        *out = def;
    else if (json_is_boolean(v))
        *out = json_is_true(v);
    else if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1))
        *out = (int)json_integer_value(v);
    else
        return sd__badtype(c, key, "true or false", v);
    return 0;
}

/* String or NULL (absent); error if present with another type. */
static int sd__str(const sd__jctx *c, json_t *obj, const char *key, const char **out)
{
    json_t *v = sd__get(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return sd__badtype(c, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* Object or NULL (absent/null). */
static int sd__obj(const sd__jctx *c, json_t *obj, const char *key, json_t **out)
{
    json_t *v = sd__get(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_object(v))
        return sd__badtype(c, key, "an object", v);
    *out = v;
    return 0;
}

/* ---- architecture ------------------------------------------------------- */

static const struct {
    const char *arch;
    sd_arch id;
    const char *types[2]; /* accepted model_type values; the first is the default */
} sd__archs[] = {
    {"LlamaForCausalLM", SD_ARCH_LLAMA, {"llama", "mistral"}},
    {"MistralForCausalLM", SD_ARCH_LLAMA, {"mistral", "llama"}},
    /* Mistral's layer with a sparse MoE block (softmax top-2, renormalized) */
    {"MixtralForCausalLM", SD_ARCH_LLAMA, {"mixtral", NULL}},
    /* Qwen2 / Qwen2.5: Llama's layer with q/k/v biases (HF's Qwen2Attention) */
    {"Qwen2ForCausalLM", SD_ARCH_LLAMA, {"qwen2", NULL}},
    {"Qwen3ForCausalLM", SD_ARCH_QWEN3, {"qwen3", NULL}},
    /* Qwen3's layer with a sparse MoE block (softmax top-k, no shared expert) */
    {"Qwen3MoeForCausalLM", SD_ARCH_QWEN3, {"qwen3_moe", NULL}},
    /* Kimi-K2 ships model_type kimi_k2 with the DeepSeek-V3 architecture. */
    {"DeepseekV3ForCausalLM", SD_ARCH_DEEPSEEK_V3, {"deepseek_v3", "kimi_k2"}},
    /* DeepSeek-V2: V3's MLA with softmax routing; its plain top-k ("greedy",
     * V2-Lite) is V3's router with one group and no correction bias */
    {"DeepseekV2ForCausalLM", SD_ARCH_DEEPSEEK_V3, {"deepseek_v2", NULL}},
};
#define SD__ARCH_LIST                                                                              \
    "LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "               \
    "Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, DeepseekV2ForCausalLM"

static int sd__parse_arch(sd_model_cfg *cfg, json_t *root, const sd__jctx *c)
{
    const char *arch = NULL, *mt = NULL;
    json_t *a = sd__get(root, "architectures");
    if (a) {
        if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0)))
            return sd_err_set(c->err, SD_EFORMAT,
                              "%s: key \"architectures\" must be a non-empty array of strings",
                              c->path);
        arch = json_string_value(json_array_get(a, 0));
    }
    int rc = sd__str(c, root, "model_type", &mt);
    if (rc)
        return rc;
    int found = -1;
    if (arch) {
        for (size_t i = 0; i < SD_ARRAY_LEN(sd__archs); i++)
            if (strcmp(arch, sd__archs[i].arch) == 0)
                found = (int)i;
        if (found < 0)
            return sd_err_set(c->err, SD_ENOTSUP,
                              "%s: architecture \"%s\" is not supported (supported: %s)", c->path,
                              arch, SD__ARCH_LIST);
        if (mt) {
            int ok = 0;
            for (int j = 0; j < 2; j++)
                ok |= sd__archs[found].types[j] && strcmp(mt, sd__archs[found].types[j]) == 0;
            if (!ok)
                return sd_err_set(c->err, SD_ENOTSUP,
                                  "%s: model_type \"%s\" is not supported with architecture "
                                  "\"%s\"",
                                  c->path, mt, arch);
        }
    } else if (mt) {
        /* No "architectures" (configs written by hand or by old tools): the
         * model_type alone decides. */
        for (size_t i = 0; i < SD_ARRAY_LEN(sd__archs) && found < 0; i++)
            for (int j = 0; j < 2; j++)
                if (sd__archs[i].types[j] && strcmp(mt, sd__archs[i].types[j]) == 0)
                    found = (int)i;
        if (found < 0)
            return sd_err_set(c->err, SD_ENOTSUP,
                              "%s: model_type \"%s\" is not supported (supported architectures: "
                              "%s)",
                              c->path, mt, SD__ARCH_LIST);
        arch = sd__archs[found].arch;
    } else {
        return sd_err_set(c->err, SD_ENOENT,
                          "%s: key \"architectures\" is missing (and no \"model_type\")", c->path);
    }
    if (!mt)
        mt = sd__archs[found].types[0];
    if (strlen(arch) >= sizeof cfg->arch_name || strlen(mt) >= sizeof cfg->model_type)
        return sd_err_set(c->err, SD_EFORMAT, "%s: architecture name too long", c->path);
    cfg->arch = sd__archs[found].id;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
    return 0;
}

/* ---- token ids ---------------------------------------------------------- */

static int sd__parse_ids(sd_model_cfg *cfg, json_t *root, const sd__jctx *c, int def_bos,
                         int def_eos)
{
    json_t *b = json_object_get(root, "bos_token_id");
    if (!b)
        cfg->bos_id = def_bos;
    else if (json_is_null(b))
        cfg->bos_id = -1;
    else {
        int rc = sd__int(c, root, "bos_token_id", 1, 0, 0, INT32_MAX, &cfg->bos_id);
        if (rc)
            return rc;
    }
    json_t *e = json_object_get(root, "eos_token_id");
    cfg->n_eos = 0;
    if (!e) {
        if (def_eos >= 0)
            cfg->eos_ids[cfg->n_eos++] = def_eos;
    } else if (json_is_array(e)) {
        size_t n = json_array_size(e);
        if (n > SD_ARRAY_LEN(cfg->eos_ids))
            return sd_err_set(c->err, SD_ERANGE,
                              "%s: key \"eos_token_id\" lists %zu ids (at most %zu)", c->path, n,
                              SD_ARRAY_LEN(cfg->eos_ids));
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(e, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                return sd_err_set(c->err, SD_EFORMAT,
                                  "%s: key \"eos_token_id\"[%zu] must be a non-negative integer",
                                  c->path, i);
            cfg->eos_ids[cfg->n_eos++] = (int)json_integer_value(v);
        }
    } else if (!json_is_null(e)) {
        int id;
        int rc = sd__int(c, root, "eos_token_id", 1, 0, 0, INT32_MAX, &id);
        if (rc)
            return rc == SD_EFORMAT ? sd__badtype(c, "eos_token_id", "an integer or a list", e)
                                    : rc;
        cfg->eos_ids[cfg->n_eos++] = id;
    }
    cfg->eos_id = cfg->n_eos ? cfg->eos_ids[0] : -1;
    return 0;
}

/* ---- RoPE ---------------------------------------------------------------- */

/* yarn's magnitude correction: 0.1 m ln(f) + 1, or 1 without scaling. */
static double sd__mscale(double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * log(f) + 1.0; }

static int sd__parse_rope(sd_model_cfg *cfg, json_t *root, const sd__jctx *top)
{
    sd_rope_cfg *r = &cfg->rope;
    json_t *rp, *rs;
    int rc = sd__obj(top, root, "rope_parameters", &rp);
    if (!rc)
        rc = sd__obj(top, root, "rope_scaling", &rs);
    if (rc)
        return rc;
    /* transformers 5.x writes rope_parameters (theta inside); 4.x checkpoints
     * have rope_theta + rope_scaling at the top level. Either yields the same
     * sd_rope_cfg. */
    json_t *src = rp ? rp : rs;
    sd__jctx c = *top;
    c.obj = rp ? "rope_parameters" : "rope_scaling";

    const char *type = NULL;
    if (src) {
        rc = sd__str(&c, src, "rope_type", &type);
        if (!rc && !type)
            rc = sd__str(&c, src, "type", &type);
        if (rc)
            return rc;
        if (!type && rp) {
            /* {"full_attention": {...}, "sliding_attention": {...}} */
            const char *k;
            json_t *v;
            json_object_foreach(rp, k, v)
            {
                if (json_is_object(v))
                    return sd_err_set(top->err, SD_ENOTSUP,
                                      "%s: key \"rope_parameters.%s\": per-layer-type RoPE "
                                      "parameters are not supported",
                                      top->path, k);
            }
        }
    }
    if (!type)
        type = "default";

    double theta = 0;
    int have_theta = 0;
    if (rp)
        rc = sd__num(&c, rp, "rope_theta", 0, 0, &theta, &have_theta);
    if (!rc && !have_theta)
        rc = sd__num(top, root, "rope_theta", 0, 10000.0, &theta, NULL);
    if (rc)
        return rc;
    if (!(theta > 0))
        return sd__range(rp && have_theta ? &c : top, "rope_theta", "must be positive");

    double prf = 1.0;
    int have_prf = 0;
    rc = src ? sd__num(&c, src, "partial_rotary_factor", 0, 1.0, &prf, &have_prf) : 0;
    if (!rc && !have_prf)
        rc = sd__num(top, root, "partial_rotary_factor", 0, 1.0, &prf, NULL);
    if (rc)
        return rc;
    if (prf != 1.0)
        return sd_err_set(top->err, SD_ENOTSUP,
                          "%s: key \"partial_rotary_factor\" = %g is not supported (only 1)",
                          top->path, prf);

    memset(r, 0, sizeof *r);
    r->theta = theta;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->mscale = 1.0;
    r->mscale_all_dim = 0.0;
    r->original_max_pos = cfg->max_pos;
    cfg->rope_attn_factor = 1.0;

    if (strcmp(type, "default") == 0) {
        r->type = SD_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        r->type = SD_ROPE_LINEAR;
        rc = sd__num(&c, src, "factor", 1, 0, &r->factor, NULL);
    } else if (strcmp(type, "llama3") == 0) {
        r->type = SD_ROPE_LLAMA3;
        rc = sd__num(&c, src, "factor", 1, 0, &r->factor, NULL);
        if (!rc)
            rc = sd__num(&c, src, "low_freq_factor", 1, 0, &r->low_freq_factor, NULL);
        if (!rc)
            rc = sd__num(&c, src, "high_freq_factor", 1, 0, &r->high_freq_factor, NULL);
        if (!rc)
            rc = sd__int(&c, src, "original_max_position_embeddings", 1, 0, 1, INT32_MAX,
                         &r->original_max_pos);
        if (!rc && !(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor))
            rc = sd__range(&c, "high_freq_factor",
                           "must exceed low_freq_factor, both positive (got %g and %g)",
                           r->high_freq_factor, r->low_freq_factor);
    } else if (strcmp(type, "yarn") == 0) {
        r->type = SD_ROPE_YARN;
        int have_f = 0, have_orig = sd__get(src, "original_max_position_embeddings") != NULL;
        if (have_orig)
            rc = sd__int(&c, src, "original_max_position_embeddings", 1, 0, 1, INT32_MAX,
                         &r->original_max_pos);
        else /* 5.x may keep it at the top level; else max_position_embeddings */
            rc = sd__int(top, root, "original_max_position_embeddings", 0, cfg->max_pos, 1,
                         INT32_MAX, &r->original_max_pos);
        if (!rc)
            rc = sd__num(&c, src, "factor", 0, 0, &r->factor, &have_f);
        if (!rc && !have_f) {
            if (!have_orig)
                return sd__missing(&c, "factor");
            r->factor = (double)cfg->max_pos / r->original_max_pos;
        }
        int have_ms = 0, have_msa = 0, have_af = 0;
        if (!rc)
            rc = sd__num(&c, src, "beta_fast", 0, 32.0, &r->beta_fast, NULL);
        if (!rc)
            rc = sd__num(&c, src, "beta_slow", 0, 1.0, &r->beta_slow, NULL);
        if (!rc)
            rc = sd__num(&c, src, "mscale", 0, 1.0, &r->mscale, &have_ms);
        if (!rc)
            rc = sd__num(&c, src, "mscale_all_dim", 0, 0.0, &r->mscale_all_dim, &have_msa);
        if (!rc)
            rc = sd__num(&c, src, "attention_factor", 0, 0.0, &r->attention_factor, &have_af);
        int truncate = 1;
        if (!rc)
            rc = sd__bool(&c, src, "truncate", 1, &truncate);
        if (rc)
            return rc;
        if (!truncate)
            return sd_err_set(top->err, SD_ENOTSUP,
                              "%s: key \"%s.truncate\" = false is not supported", top->path, c.obj);
        if (!(r->beta_slow > 0 && r->beta_fast >= r->beta_slow))
            return sd__range(&c, "beta_fast",
                             "must be at least beta_slow, both positive (got %g and %g)",
                             r->beta_fast, r->beta_slow);
        /* HF: explicit attention_factor wins; the ratio form needs both
         * mscale and mscale_all_dim set and non-zero. */
        if (have_af)
            cfg->rope_attn_factor = r->attention_factor;
        else if (have_ms && r->mscale != 0 && have_msa && r->mscale_all_dim != 0)
            cfg->rope_attn_factor =
                sd__mscale(r->factor, r->mscale) / sd__mscale(r->factor, r->mscale_all_dim);
        else
            cfg->rope_attn_factor = sd__mscale(r->factor, 1.0);
    } else {
        return sd_err_set(top->err, SD_ENOTSUP,
                          "%s: rope type \"%s\" (key \"%s.rope_type\") is not supported "
                          "(supported: default, linear, llama3, yarn)",
                          top->path, type, c.obj);
    }
    if (rc)
        return rc;
    if (!(r->factor > 0))
        return sd__range(&c, "factor", "must be positive (got %g)", r->factor);
    return 0;
}

/* ---- the whole config ---------------------------------------------------- */

/* quantization_config of quant_method fp8 (DeepSeek-V3, Kimi-K2, Qwen3
 * FP8): E4M3 weights with one F32 scale a block of weight_block_size
 * [rows, cols] (the "<weight>_scale_inv" tensor, multiplied in to
 * dequantize); activations "dynamic" (quantized by the serving kernel, not
 * by the checkpoint). Per-tensor and static-activation FP8 are refused. */
static int sd__parse_fp8(sd_model_cfg *cfg, json_t *qc, const sd__jctx *cq)
{
    const char *fmt, *act;
    int rc = sd__str(cq, qc, "fmt", &fmt);
    if (!rc)
        rc = sd__str(cq, qc, "activation_scheme", &act);
    if (rc)
        return rc;
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return sd_err_set(cq->err, SD_ENOTSUP,
                          "%s: key \"quantization_config.fmt\" = \"%s\" is not supported (e4m3 is)",
                          cq->path, fmt);
    if (act && strcmp(act, "dynamic") != 0)
        return sd_err_set(cq->err, SD_ENOTSUP,
                          "%s: key \"quantization_config.activation_scheme\" = \"%s\" is not "
                          "supported (dynamic is)",
                          cq->path, act);
    json_t *b = sd__get(qc, "weight_block_size");
    if (!b)
        return sd_err_set(cq->err, SD_ENOTSUP,
                          "%s: quantization_config has no \"weight_block_size\": only "
                          "block-scaled fp8 is supported, not per-tensor scales",
                          cq->path);
    if (!json_is_array(b) || json_array_size(b) != 2)
        return sd__badtype(cq, "weight_block_size", "an array of two integers", b);
    static const char *const key[2] = {"weight_block_size[0]", "weight_block_size[1]"};
    for (int i = 0; i < 2 && !rc; i++)
        rc = sd__int_of(cq, json_array_get(b, (size_t)i), key[i], 0, 1, 1 << 20, &cfg->fp8_block[i]);
    if (!rc)
        cfg->fp8 = 1;
    return rc;
}

/* A sparse block routed by a plain softmax top-k over all its experts, none
 * shared (Qwen3-MoE's, Mixtral's): DeepSeek's router with one group, no
 * correction bias, scale 1. */
static void plain_topk(sd_model_cfg *cfg)
{
    cfg->n_shared_experts = 0;
    cfg->n_group = cfg->topk_group = 1;
    cfg->scoring_sigmoid = 0;
    cfg->route_bias = 0;
    cfg->routed_scaling_factor = 1.0;
}

/* Qwen3-MoE's sparse block (HF Qwen3MoeSparseMoeBlock): softmax over the
 * experts, the top num_experts_per_tok, renormalized where norm_topk_prob;
 * no shared expert, no groups, no correction bias. Layer i is sparse where
 * (i + 1) % decoder_sparse_step == 0; mlp_only_layers (dense ones among
 * them) must be empty. */
static int sd__parse_qwen3_moe(sd_model_cfg *cfg, json_t *root, const sd__jctx *c)
{
    /* published (4.x) checkpoints say num_experts; transformers 5.x writes
     * num_local_experts */
    const char *ne = sd__get(root, "num_experts") || !sd__get(root, "num_local_experts")
                         ? "num_experts"
                         : "num_local_experts";
    int rc = sd__int(c, root, ne, 0, 128, 1, 1 << 16, &cfg->n_routed_experts);
    if (!rc)
        rc = sd__int(c, root, "num_experts_per_tok", 0, 8, 1, cfg->n_routed_experts,
                     &cfg->num_experts_per_tok);
    if (!rc)
        rc = sd__int(c, root, "moe_intermediate_size", 0, 768, 1, INT32_MAX,
                     &cfg->moe_intermediate_size);
    if (!rc)
        rc = sd__bool(c, root, "norm_topk_prob", 0, &cfg->norm_topk_prob);
    if (!rc)
        rc = sd__int(c, root, "decoder_sparse_step", 0, 1, 1, INT32_MAX, &cfg->moe_sparse_step);
    if (rc)
        return rc;
    json_t *only = sd__get(root, "mlp_only_layers");
    if (only && (!json_is_array(only) || json_array_size(only) > 0))
        return sd_err_set(c->err, SD_ENOTSUP,
                          "%s: key \"mlp_only_layers\" lists dense layers among the sparse ones: "
                          "not supported (only an empty list)",
                          c->path);
    plain_topk(cfg);
    return 0;
}

/* Mixtral's sparse block (HF MixtralSparseMoeBlock, "block_sparse_moe"):
 * every layer, num_local_experts of intermediate_size, softmax top
 * num_experts_per_tok renormalized; experts w1 (gate), w3 (up), w2 (down). */
static int sd__parse_mixtral(sd_model_cfg *cfg, json_t *root, const sd__jctx *c)
{
    int rc = sd__int(c, root, "num_local_experts", 0, 8, 1, 1 << 16, &cfg->n_routed_experts);
    if (!rc)
        rc = sd__int(c, root, "num_experts_per_tok", 0, 2, 1, cfg->n_routed_experts,
                     &cfg->num_experts_per_tok);
    if (rc)
        return rc;
    cfg->moe_intermediate_size = cfg->intermediate_size;
    cfg->moe_sparse_step = 1;
    cfg->moe_mixtral_names = 1;
    cfg->norm_topk_prob = 1;
    plain_topk(cfg);
    return 0;
}

static int sd__parse_deepseek(sd_model_cfg *cfg, json_t *root, const sd__jctx *c)
{
    int rc = 0;
    /* DeepSeek-V2's config class defaults: softmax, plain top-k, no
     * normalization, scale 1 (published configs give them all) */
    const int v2 = !strcmp(cfg->model_type, "deepseek_v2");
    /* q_lora_rank: null means q_proj straight from the hidden state. */
    if (sd__null(root, "q_lora_rank"))
        cfg->q_lora_rank = 0;
    else
        rc = sd__int(c, root, "q_lora_rank", 0, 1536, 0, INT32_MAX, &cfg->q_lora_rank);
    if (!rc)
        rc = sd__int(c, root, "kv_lora_rank", 1, 0, 1, 1 << 20, &cfg->kv_lora_rank);
    if (!rc)
        rc = sd__int(c, root, "qk_nope_head_dim", 1, 0, 0, 1 << 16, &cfg->qk_nope_head_dim);
    if (!rc)
        rc = sd__int(c, root, "qk_rope_head_dim", 1, 0, 2, 1 << 16, &cfg->qk_rope_head_dim);
    if (!rc)
        rc = sd__int(c, root, "v_head_dim", 1, 0, 1, 1 << 16, &cfg->v_head_dim);
    if (rc)
        return rc;
    if (cfg->qk_rope_head_dim % 2)
        return sd__range(c, "qk_rope_head_dim", "= %d must be even", cfg->qk_rope_head_dim);
    /* MLA: every head reads the same latent, so "kv heads" = heads; the
     * head_dim a 5.x config may carry is HF's rope dim, not ours. */
    cfg->num_kv_heads = cfg->num_heads;
    cfg->head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;

    if (sd__null(root, "n_routed_experts"))
        cfg->n_routed_experts = 0;
    else
        rc = sd__int(c, root, "n_routed_experts", 0, 256, 0, 1 << 16, &cfg->n_routed_experts);
    if (!rc)
        rc = sd__int(c, root, "n_shared_experts", 0, 1, 0, 1 << 10, &cfg->n_shared_experts);
    if (!rc)
        rc = sd__int(c, root, "first_k_dense_replace", 0, 3, 0, INT32_MAX,
                     &cfg->first_k_dense_replace);
    if (!rc)
        rc = sd__int(c, root, "moe_layer_freq", 0, 1, 1, INT32_MAX, &cfg->moe_layer_freq);
    if (!rc)
        rc = sd__int(c, root, "num_nextn_predict_layers", 0, 0, 0, 64,
                     &cfg->num_nextn_predict_layers);
    if (rc)
        return rc;
    if (cfg->n_routed_experts > 0) {
        int ne = cfg->n_routed_experts;
        rc = sd__int(c, root, "moe_intermediate_size", 1, 0, 1, INT32_MAX,
                     &cfg->moe_intermediate_size);
        if (!rc)
            rc = sd__int(c, root, "num_experts_per_tok", 0, 8, 1, ne, &cfg->num_experts_per_tok);
        /* null group counts (the original DeepSeek config class defaults them
         * to None) mean one group: no group-limited routing. */
        int null_groups = sd__null(root, "n_group");
        if (!rc)
            rc = sd__int(c, root, "n_group", 0, null_groups ? 1 : 8, 1, ne, &cfg->n_group);
        if (!rc)
            rc = sd__int(c, root, "topk_group", 0,
                         sd__null(root, "topk_group") ? cfg->n_group : SD_MIN(4, cfg->n_group), 1,
                         cfg->n_group, &cfg->topk_group);
        if (!rc)
            rc = sd__bool(c, root, "norm_topk_prob", !v2, &cfg->norm_topk_prob);
        if (!rc)
            rc = sd__num(c, root, "routed_scaling_factor", 0, v2 ? 1.0 : 2.5,
                         &cfg->routed_scaling_factor, NULL);
        if (rc)
            return rc;
        if (ne % cfg->n_group)
            return sd__range(c, "n_group", "= %d does not divide n_routed_experts = %d",
                             cfg->n_group, ne);
        if (!(cfg->routed_scaling_factor > 0))
            return sd__range(c, "routed_scaling_factor", "must be positive");
        const char *sf, *tm;
        rc = sd__str(c, root, "scoring_func", &sf);
        if (!rc)
            rc = sd__str(c, root, "topk_method", &tm);
        if (rc)
            return rc;
        /* V3 (transformers' model) routes with sigmoid scores and the
         * bias-corrected group top-k (noaux_tc); V2 with softmax scores and
         * a plain top-k (greedy). V2's group_limited_greedy (groups ranked
         * by their best score) is refused. */
        if (!sf)
            cfg->scoring_sigmoid = !v2;
        else if (strcmp(sf, "sigmoid") == 0)
            cfg->scoring_sigmoid = 1;
        else if (strcmp(sf, "softmax") == 0)
            cfg->scoring_sigmoid = 0;
        else
            return sd_err_set(c->err, SD_ENOTSUP,
                              "%s: key \"scoring_func\" = \"%s\" is not supported (sigmoid or "
                              "softmax)",
                              c->path, sf);
        cfg->route_bias = !v2;
        if (v2 && (!tm || !strcmp(tm, "greedy"))) {
            cfg->n_group = cfg->topk_group = 1; /* every expert a candidate */
        } else if (tm && strcmp(tm, "noaux_tc") != 0) {
            return sd_err_set(c->err, SD_ENOTSUP,
                              "%s: key \"topk_method\" = \"%s\" is not supported (%s)", c->path,
                              tm, v2 ? "greedy" : "noaux_tc");
        }
    } else {
        cfg->n_shared_experts = 0;
    }
    return 0;
}

int sd_model_cfg_parse(sd_model_cfg *cfg, const char *json_text, const char *path, sd_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    if (!path)
        path = "config.json";
    sd__jctx c = {path, NULL, err};
    json_error_t je;
    json_t *root = json_loads(json_text ? json_text : "", 0, &je);
    if (!root)
        return sd_err_set(err, SD_EFORMAT, "%s: malformed JSON (line %d, column %d): %s", path,
                          je.line, je.column, je.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = sd_err_set(err, SD_EFORMAT, "%s: top level is not a JSON object", path);
        goto out;
    }
    rc = sd__parse_arch(cfg, root, &c);
    if (rc)
        goto out;
    int ds = cfg->arch == SD_ARCH_DEEPSEEK_V3;
    int qwen = cfg->arch == SD_ARCH_QWEN3;
    int qwen2 = !strcmp(cfg->model_type, "qwen2");

    const int big = 1 << 30;
    rc = sd__int(&c, root, "vocab_size", 1, 0, 1, big, &cfg->vocab_size);
    if (!rc)
        rc = sd__int(&c, root, "hidden_size", 1, 0, 1, 1 << 20, &cfg->hidden_size);
    if (!rc)
        rc = sd__int(&c, root, "intermediate_size", 1, 0, 1, big, &cfg->intermediate_size);
    if (!rc)
        rc = sd__int(&c, root, "num_hidden_layers", 1, 0, 1, 1 << 16, &cfg->num_layers);
    if (!rc)
        rc = sd__int(&c, root, "num_attention_heads", 1, 0, 1, 1 << 16, &cfg->num_heads);
    if (!rc)
        rc = sd__num(&c, root, "rms_norm_eps", 0, 1e-6, &cfg->rms_eps, NULL);
    if (!rc && !(cfg->rms_eps > 0))
        rc = sd__range(&c, "rms_norm_eps", "must be positive");
    if (!rc)
        rc = sd__int(&c, root, "max_position_embeddings", 0,
                     ds              ? 4096
                     : qwen || qwen2 ? 32768
                                     : 2048,
                     1, big, &cfg->max_pos);
    if (!rc)
        rc = sd__bool(&c, root, "tie_word_embeddings", 0, &cfg->tie_embeddings);
    if (!rc) /* Qwen2's config has no such key: its q/k/v projections always have biases */
        rc = sd__bool(&c, root, "attention_bias", qwen2, &cfg->attention_bias);
    if (!rc && cfg->arch == SD_ARCH_LLAMA)
        rc = sd__bool(&c, root, "mlp_bias", 0, &cfg->mlp_bias);
    if (rc)
        goto out;
    const char *act;
    rc = sd__str(&c, root, "hidden_act", &act);
    if (rc)
        goto out;
    if (act && strcmp(act, "silu") != 0) {
        rc = sd_err_set(err, SD_ENOTSUP, "%s: key \"hidden_act\" = \"%s\" is not supported (silu)",
                        path, act);
        goto out;
    }

    if (ds) {
        rc = sd__parse_deepseek(cfg, root, &c);
    } else {
        rc = sd__int(&c, root, "num_key_value_heads", 0, cfg->num_heads, 1, cfg->num_heads,
                     &cfg->num_kv_heads);
        if (!rc && cfg->num_heads % cfg->num_kv_heads)
            rc = sd__range(&c, "num_key_value_heads",
                           "= %d does not divide num_attention_heads = %d", cfg->num_kv_heads,
                           cfg->num_heads);
        if (!rc && !qwen && !sd__get(root, "head_dim") && cfg->hidden_size % cfg->num_heads)
            rc = sd__missing(&c, "head_dim"); /* hidden/heads is not whole */
        if (!rc)
            rc = sd__int(&c, root, "head_dim", 0, qwen ? 128 : cfg->hidden_size / cfg->num_heads, 2,
                         1 << 16, &cfg->head_dim);
        if (!rc && cfg->head_dim % 2)
            rc = sd__range(&c, "head_dim", "= %d must be even", cfg->head_dim);
        cfg->qk_norm = qwen;
        if (!rc && !strcmp(cfg->model_type, "qwen3_moe"))
            rc = sd__parse_qwen3_moe(cfg, root, &c);
        if (!rc && !strcmp(cfg->model_type, "mixtral"))
            rc = sd__parse_mixtral(cfg, root, &c);
    }
    if (rc)
        goto out;

    /* Sliding windows: Mistral's sliding_window (null in later releases);
     * Qwen3's per-layer windows behind use_sliding_window are not modelled. */
    if (cfg->arch == SD_ARCH_LLAMA && !qwen2) {
        rc = sd__int(&c, root, "sliding_window", 0, 0, 0, big, &cfg->sliding_window);
        if (!rc && cfg->sliding_window >= cfg->max_pos)
            cfg->sliding_window = 0;
    } else if (qwen || qwen2) {
        int usw = 0;
        rc = sd__bool(&c, root, "use_sliding_window", 0, &usw);
        if (!rc && usw)
            rc = sd_err_set(err, SD_ENOTSUP,
                            "%s: key \"use_sliding_window\" = true is not supported", path);
    }
    if (rc)
        goto out;

    rc = sd__parse_ids(cfg, root, &c, ds ? 0 : qwen ? -1 : 1, ds ? 1 : qwen ? -1 : 2);
    if (rc)
        goto out;
    rc = sd__parse_rope(cfg, root, &c);
    if (rc)
        goto out;
    cfg->rope.rot_dim = ds ? cfg->qk_rope_head_dim : cfg->head_dim;
    cfg->rope.interleave = 0;
    if (ds) {
        /* DeepseekV3Config defaults rope_interleave to true, and the official
         * checkpoints (which lack the key) rotate interleaved pairs. */
        rc = sd__bool(&c, root, "rope_interleave", 1, &cfg->rope.interleave);
        if (rc)
            goto out;
    }

    cfg->softmax_scale = 1.0 / sqrt((double)cfg->head_dim);
    if (ds && cfg->rope.type != SD_ROPE_DEFAULT && cfg->rope.mscale_all_dim != 0) {
        double m = sd__mscale(cfg->rope.factor, cfg->rope.mscale_all_dim);
        cfg->softmax_scale *= m * m;
    }

    json_t *qc;
    rc = sd__obj(&c, root, "quantization_config", &qc);
    if (rc)
        goto out;
    if (qc) {
        sd__jctx cq = {path, "quantization_config", err};
        const char *qm;
        rc = sd__str(&cq, qc, "quant_method", &qm);
        if (!rc && !qm)
            rc = sd__missing(&cq, "quant_method");
        if (rc)
            goto out;
        if (strcmp(qm, "fp8") != 0) {
            rc = sd_err_set(err, SD_ENOTSUP,
                            "%s: key \"quantization_config.quant_method\" = \"%s\" is not "
                            "supported",
                            path, qm);
            goto out;
        }
        rc = sd__parse_fp8(cfg, qc, &cq);
        if (rc)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

int sd_model_cfg_load(sd_model_cfg *cfg, const char *dir, sd_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    char *path = sd_strfmt("%s/config.json", dir);
    if (!path)
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", dir);
    char *text = NULL;
    int rc = sd_read_file(path, &text, NULL, err);
    if (!rc)
        rc = sd_model_cfg_parse(cfg, text, path, err);
    free(text);
    free(path);
    return rc;
}

int sd_model_cfg_layer_is_moe(const sd_model_cfg *cfg, int layer)
{
    if (cfg->n_routed_experts <= 0 || layer < 0 ||
        layer > cfg->num_layers + cfg->num_nextn_predict_layers - 1)
        return 0;
    if (cfg->moe_sparse_step > 0) /* Qwen3-MoE */
        return (layer + 1) % cfg->moe_sparse_step == 0;
    return cfg->arch == SD_ARCH_DEEPSEEK_V3 && layer >= cfg->first_k_dense_replace &&
           layer % cfg->moe_layer_freq == 0;
}

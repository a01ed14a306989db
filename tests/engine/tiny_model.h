/* tests/engine/tiny_model.h: writes a small random Llama checkpoint
 * (config.json + model.safetensors, bf16) into a fresh temp folder, for tests
 * that need a model of a chosen shape (e.g. a tiny vocabulary). */
#ifndef SD_TESTS_TINY_MODEL_H
#define SD_TESTS_TINY_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "core/util.h"

typedef struct tiny_spec {
    int vocab, hidden, layers, heads, kv_heads, inter;
    int max_pos; /* max_position_embeddings; 0: 256 */
    float scale; /* std of the random weights */
    uint64_t seed;
} tiny_spec;

static inline float tiny_rand(uint64_t *s)
{
    /* sum of uniforms: roughly normal, deterministic */
    float acc = 0;
    for (int i = 0; i < 4; i++) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        acc += (float)((*s >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    return acc * 1.7320508f;
}

/* Returns a malloc'd folder path, or NULL. */
static inline char *tiny_model_write(const tiny_spec *sp)
{
    char tmpl[] = "/tmp/specd-tiny-XXXXXX";
    if (!mkdtemp(tmpl))
        return NULL;
    char *dir = strdup(tmpl);
    int D = sp->hidden, V = sp->vocab, H = sp->heads, KV = sp->kv_heads, I = sp->inter;
    int hd = D / H;
    char *cfg = sd_strfmt(
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d, "
        "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
        "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"rms_norm_eps\": 1e-5, "
        "\"max_position_embeddings\": %d, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
        "\"bos_token_id\": null, \"eos_token_id\": null, \"hidden_act\": \"silu\"}",
        V, D, I, sp->layers, H, KV, sp->max_pos > 0 ? sp->max_pos : 256);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sd_write_file(path, cfg, strlen(cfg), NULL);
    free(cfg);
    /* tensors */
    enum { MAXT = 64 };
    sd_st_tensor t[MAXT];
    char *names[MAXT];
    int n = 0;
    uint64_t s = sp->seed ? sp->seed : 1;
#define ADD(nm, r, c, sc, base)                                                                \
    do {                                                                                       \
        names[n] = nm;                                                                         \
        size_t cnt = (size_t)(r) * (size_t)((c) != 0 ? (c) : 1);                                    \
        uint16_t *buf = malloc(cnt * 2);                                                       \
        for (size_t q = 0; q < cnt; q++)                                                       \
            buf[q] = sd_f32_to_bf16((base) + (sc) * tiny_rand(&s));                            \
        t[n] = (sd_st_tensor){.name = names[n], .dtype = SD_DT_BF16, .ndim = (c) != 0 ? 2 : 1,      \
                              .shape = {(r), (c)}, .data = buf, .nbytes = cnt * 2};            \
        n++;                                                                                   \
    } while (0)
    ADD(strdup("model.embed_tokens.weight"), V, D, sp->scale * 2, 0.0f);
    ADD(strdup("model.norm.weight"), D, 0, 0.1f, 1.0f);
    ADD(strdup("lm_head.weight"), V, D, sp->scale * 2, 0.0f);
    for (int l = 0; l < sp->layers; l++) {
        ADD(sd_strfmt("model.layers.%d.input_layernorm.weight", l), D, 0, 0.1f, 1.0f);
        ADD(sd_strfmt("model.layers.%d.post_attention_layernorm.weight", l), D, 0, 0.1f, 1.0f);
        ADD(sd_strfmt("model.layers.%d.self_attn.q_proj.weight", l), H * hd, D, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.self_attn.k_proj.weight", l), KV * hd, D, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.self_attn.v_proj.weight", l), KV * hd, D, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.self_attn.o_proj.weight", l), D, H * hd, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.mlp.gate_proj.weight", l), I, D, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.mlp.up_proj.weight", l), I, D, sp->scale, 0.0f);
        ADD(sd_strfmt("model.layers.%d.mlp.down_proj.weight", l), D, I, sp->scale, 0.0f);
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = sd_st_write(path, t, n, NULL, NULL);
    for (int i = 0; i < n; i++) {
        free((void *)t[i].data);
        free(names[i]);
    }
    if (rc) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* A random EAGLE-3 head for a target of hidden D, vocabulary V and L layers:
 * draft vocabulary Vd (the ids 0, 3, 6, ... of the target), aux layers
 * {0, L/2, L-1}. Returns a malloc'd folder path, or NULL. */
static inline char *tiny_eagle3_write(int D, int V, int Vd, int L, float scale, uint64_t seed)
{
    char tmpl[] = "/tmp/specd-eagle-XXXXXX";
    if (!mkdtemp(tmpl))
        return NULL;
    char *dir = strdup(tmpl);
    int H = D, heads = 4, kv = 2, hd = D / 4, I = 2 * D;
    char *cfg = sd_strfmt(
        "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"model_type\": \"llama\", "
        "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
        "\"draft_vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, "
        "\"max_position_embeddings\": 2048, \"eagle_config\": "
        "{\"eagle_aux_hidden_state_layer_ids\": [0, %d, %d], \"use_aux_hidden_state\": true}}",
        H, I, heads, kv, V, Vd, L / 2, L - 1);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sd_write_file(path, cfg, strlen(cfg), NULL);
    free(cfg);
    enum { MAXT = 32 };
    sd_st_tensor t[MAXT];
    int n = 0;
    uint64_t s = seed ? seed : 7;
#define ADDW(nm, r, c, sc, base)                                                               \
    do {                                                                                       \
        size_t cnt = (size_t)(r) * (size_t)((c) != 0 ? (c) : 1);                               \
        uint16_t *buf = malloc(cnt * 2);                                                       \
        for (size_t q = 0; q < cnt; q++)                                                       \
            buf[q] = sd_f32_to_bf16((base) + (sc) * tiny_rand(&s));                            \
        t[n] = (sd_st_tensor){.name = nm, .dtype = SD_DT_BF16, .ndim = (c) != 0 ? 2 : 1,      \
                              .shape = {(r), (c)}, .data = buf, .nbytes = cnt * 2};            \
        n++;                                                                                   \
    } while (0)
    ADDW("fc.weight", H, 3 * D, scale, 0.0f);
    ADDW("midlayer.input_layernorm.weight", H, 0, 0.1f, 1.0f);
    ADDW("midlayer.hidden_norm.weight", H, 0, 0.1f, 1.0f);
    ADDW("midlayer.post_attention_layernorm.weight", H, 0, 0.1f, 1.0f);
    ADDW("midlayer.self_attn.q_proj.weight", heads * hd, 2 * H, scale, 0.0f);
    ADDW("midlayer.self_attn.k_proj.weight", kv * hd, 2 * H, scale, 0.0f);
    ADDW("midlayer.self_attn.v_proj.weight", kv * hd, 2 * H, scale, 0.0f);
    ADDW("midlayer.self_attn.o_proj.weight", H, heads * hd, scale, 0.0f);
    ADDW("midlayer.mlp.gate_proj.weight", I, H, scale, 0.0f);
    ADDW("midlayer.mlp.up_proj.weight", I, H, scale, 0.0f);
    ADDW("midlayer.mlp.down_proj.weight", H, I, scale, 0.0f);
    ADDW("norm.weight", H, 0, 0.1f, 1.0f);
    ADDW("lm_head.weight", Vd, H, scale * 3, 0.0f);
#undef ADDW
    int64_t *d2t = malloc((size_t)Vd * 8);
    unsigned char *t2d = calloc((size_t)V, 1);
    for (int i = 0; i < Vd; i++) {
        d2t[i] = (int64_t)(3 * i) - i; /* target id 3i */
        t2d[3 * i] = 1;
    }
    t[n++] = (sd_st_tensor){.name = "d2t", .dtype = SD_DT_I64, .ndim = 1, .shape = {Vd},
                            .data = d2t, .nbytes = (size_t)Vd * 8};
    t[n++] = (sd_st_tensor){.name = "t2d", .dtype = SD_DT_BOOL, .ndim = 1, .shape = {V},
                            .data = t2d, .nbytes = (size_t)V};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = sd_st_write(path, t, n, NULL, NULL);
    for (int i = 0; i < n; i++)
        free((void *)t[i].data);
    if (rc) {
        free(dir);
        return NULL;
    }
    return dir;
}

static inline void tiny_model_remove(char *dir)
{
    if (!dir)
        return;
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    remove(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    remove(p);
    rmdir(dir);
    free(dir);
}

#endif

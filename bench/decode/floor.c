#include "floor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/hfconfig.h"
#include "core/safetensors.h"

/* name ends with suffix */
static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* The layer index of "model.layers.<i>.<rest>", or -1. */
static int layer_of(const char *name)
{
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1) != 0)
        return -1;
    char *end;
    long i = strtol(name + sizeof pre - 1, &end, 10);
    return end != name + sizeof pre - 1 && *end == '.' && i >= 0 && i < (1 << 20) ? (int)i : -1;
}

int sd_decode_bytes_load(sd_decode_bytes *b, const char *dir, int kv_elem_bytes, sd_err *err)
{
    memset(b, 0, sizeof *b);
    sd_model_cfg c;
    int rc = sd_model_cfg_load(&c, dir, err);
    if (rc)
        return rc;
    sd_st *st;
    if ((rc = sd_st_open(&st, dir, err)))
        return rc;
    const sd_st_tensor *head = sd_st_find(st, "lm_head.weight");
    unsigned char *moe = calloc((size_t)c.num_layers + 1, 1);
    if (!moe) {
        sd_st_close(st);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < sd_st_count(st); i++) {
        const sd_st_tensor *t = sd_st_at(st, i);
        double nb = (double)t->nbytes;
        /* MLA's kv_b is absorbed into BF16 W_UK / W_UV at load, FP8 or not
         * (src/target/model.c): its BF16 bytes, and no scales */
        if (ends_with(t->name, "kv_b_proj.weight") && t->dtype == SD_DT_F8_E4M3)
            nb *= 2;
        else if (ends_with(t->name, "kv_b_proj.weight_scale_inv"))
            nb = 0;
        int l = layer_of(t->name);
        b->total += nb;
        if (l >= c.num_layers) {
            b->mtp += nb;
        } else if (l >= 0 && strstr(t->name, ".mlp.experts.")) {
            b->routed += nb;
            moe[l] = 1;
        } else if (!strcmp(t->name, "model.embed_tokens.weight")) {
            if (head && t->ndim == 2 && t->shape[0] > 0)
                b->embed_row = nb / (double)t->shape[0];
            else
                b->dense += nb; /* tied: the head reads the whole table */
        } else {
            b->dense += nb;
        }
    }
    for (int l = 0; l < c.num_layers; l++)
        b->n_moe_layers += moe[l];
    free(moe);
    sd_st_close(st);
    if (b->routed > 0 && (c.n_routed_experts <= 0 || c.num_experts_per_tok <= 0))
        return sd_err_set(err, SD_EFORMAT,
                          "%s: expert tensors but no n_routed_experts / num_experts_per_tok in "
                          "config.json", dir);
    b->n_experts = b->routed > 0 ? c.n_routed_experts : 0;
    b->top_k = b->routed > 0 ? c.num_experts_per_tok : 0;
    /* the engine's caches: GQA keeps K and V per kv head; MLA the normalized
     * latent plus the rope key per token */
    double per_layer = c.arch == SD_ARCH_DEEPSEEK_V3
                           ? (double)(c.kv_lora_rank + c.qk_rope_head_dim)
                           : 2.0 * c.num_kv_heads * c.head_dim;
    b->kv_per_token = per_layer * c.num_layers * kv_elem_bytes;
    return 0;
}

double sd_decode_expected_experts(int n, int top_k, int tokens)
{
    if (n <= 0 || top_k <= 0 || tokens <= 0)
        return 0;
    if (top_k >= n)
        return n;
    return n * (1.0 - pow(1.0 - (double)top_k / n, tokens));
}

double sd_decode_step_bytes(const sd_decode_bytes *b, int tokens)
{
    double bytes = b->dense + b->embed_row * tokens;
    if (b->n_experts > 0)
        bytes += b->routed * sd_decode_expected_experts(b->n_experts, b->top_k, tokens) /
                 b->n_experts;
    return bytes;
}

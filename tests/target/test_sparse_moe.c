/* Sparse MoE blocks of softmax top-k experts without shared ones: Qwen3-MoE
 * (Qwen3MoeForCausalLM: Qwen3's attention, q/k norms, GQA; renormalized
 * where norm_topk_prob) and Mixtral (MixtralForCausalLM: Mistral's layer,
 * block_sparse_moe, always renormalized). Random tiny checkpoints written here:
 * - one expert, top-1, and copies of one expert under a router of zeros
 *   (softmax scores 1/E): the bits of the dense Qwen3 (Mistral) whose MLP
 *   is that expert, its down projection scaled by the weight top-k gives it;
 * - 8 experts, top-2, every second layer sparse: finite logits that the
 *   routing moves (not the dense model's), and through the engine the same
 *   greedy tokens with MTP off on 1 rank, 2 tensor-parallel ranks and 2
 *   expert-parallel ranks (Qwen3-MoE). HF's own numbers for Qwen3-MoE come
 *   from a golden fixture (tests/golden/README.md), generated where
 *   transformers runs. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "../engine/engine_run.h"
#include "fixtures.h"
#include "test.h"

#define V 512
#define D 64
#define H 4
#define HKV 2
#define HD 16
#define L 2
#define MI 32 /* moe_intermediate_size */
#define DI 96 /* a dense layer's intermediate_size */

typedef struct ckpt {
    sd_st_tensor t[256];
    void *buf[256];
    int n;
} ckpt;

static void add(ckpt *c, uint64_t *rng, const char *name, int64_t rows, int64_t cols, float lo,
                float hi)
{
    int64_t n = rows * (cols ? cols : 1);
    uint16_t *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = sd_f32_to_bf16(sd_test_randf(rng, lo, hi));
    c->buf[c->n] = w;
    c->t[c->n++] = (sd_st_tensor){.name = strdup(name), .dtype = SD_DT_BF16, .ndim = cols ? 2 : 1,
                                  .shape = {rows, cols}, .data = w,
                                  .nbytes = (size_t)n * sizeof *w};
}

/* from's tensor src copied into c as name (the dense twin's) */
static void add_copy(ckpt *c, const ckpt *from, const char *name, const char *src)
{
    for (int i = 0; i < from->n; i++)
        if (!strcmp(from->t[i].name, src)) {
            void *w = malloc(from->t[i].nbytes);
            memcpy(w, from->t[i].data, from->t[i].nbytes);
            c->buf[c->n] = w;
            c->t[c->n] = from->t[i];
            c->t[c->n].name = strdup(name);
            c->t[c->n++].data = w;
            return;
        }
}

static void ckpt_free(ckpt *c)
{
    for (int i = 0; i < c->n; i++) {
        free((char *)c->t[i].name);
        free(c->buf[i]);
    }
    c->n = 0;
}

/* A Qwen3-MoE checkpoint of E experts (top k, every step-th layer sparse,
 * norm_topk_prob norm) into dir. With dense_dir (step 1): every expert a
 * copy of expert 0 and the router's weights 0 (each expert's softmax score
 * 1 / E), and in dense_dir the Qwen3 whose MLP is expert 0 with its down
 * projection times twin_scale (a power of two: exact). */
static int write_moe(int mixtral, const char *dir, const char *dense_dir, int E, int k, int step,
                     int norm, float twin_scale, uint64_t seed)
{
    ckpt c = {0}, d = {0};
    uint64_t rng = seed;
    char nm[256], src[256];
    /* the block's name and its experts' (gate, up, down) */
    const char *blk = mixtral ? "block_sparse_moe" : "mlp";
    static const char *const qwen_pr[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const mixtral_pr[3] = {"w1", "w3", "w2"};
    const char *const *epr = mixtral ? mixtral_pr : qwen_pr;
    add(&c, &rng, "model.embed_tokens.weight", V, D, -1, 1);
    for (int l = 0; l < L; l++) {
        const float a = 0.35f;
#define P(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        add(&c, &rng, P("model.layers.%d.input_layernorm.weight", l), D, 0, 0.8f, 1.2f);
        add(&c, &rng, P("model.layers.%d.post_attention_layernorm.weight", l), D, 0, 0.8f, 1.2f);
        add(&c, &rng, P("model.layers.%d.self_attn.q_proj.weight", l), H * HD, D, -a, a);
        add(&c, &rng, P("model.layers.%d.self_attn.k_proj.weight", l), HKV * HD, D, -a, a);
        add(&c, &rng, P("model.layers.%d.self_attn.v_proj.weight", l), HKV * HD, D, -a, a);
        add(&c, &rng, P("model.layers.%d.self_attn.o_proj.weight", l), D, H * HD, -a, a);
        if (!mixtral) {
            add(&c, &rng, P("model.layers.%d.self_attn.q_norm.weight", l), HD, 0, 0.8f, 1.2f);
            add(&c, &rng, P("model.layers.%d.self_attn.k_norm.weight", l), HD, 0, 0.8f, 1.2f);
        }
        if ((l + 1) % step == 0) {
            add(&c, &rng, P("model.layers.%d.%s.gate.weight", l, blk), E, D, dense_dir ? 0 : -1,
                dense_dir ? 0 : 1);
            for (int e = 0; e < E; e++) {
                for (int p = 0; p < 3; p++) {
                    snprintf(src, sizeof src, "model.layers.%d.%s.experts.0.%s.weight", l, blk,
                             epr[p]);
                    P("model.layers.%d.%s.experts.%d.%s.weight", l, blk, e, epr[p]);
                    if (e && dense_dir)
                        add_copy(&c, &c, nm, src);
                    else
                        add(&c, &rng, nm, p == 2 ? D : MI, p == 2 ? MI : D, -a, a);
                }
            }
        } else {
            add(&c, &rng, P("model.layers.%d.mlp.gate_proj.weight", l), DI, D, -a, a);
            add(&c, &rng, P("model.layers.%d.mlp.up_proj.weight", l), DI, D, -a, a);
            add(&c, &rng, P("model.layers.%d.mlp.down_proj.weight", l), D, DI, -a, a);
        }
    }
    add(&c, &rng, "model.norm.weight", D, 0, 0.8f, 1.2f);
    add(&c, &rng, "lm_head.weight", V, D, -0.5f, 0.5f);
    if (dense_dir) { /* the same tensors, each layer's MLP expert 0's */
        for (int i = 0; i < c.n; i++)
            if (!strstr(c.t[i].name, ".mlp.") && !strstr(c.t[i].name, ".block_sparse_moe."))
                add_copy(&d, &c, c.t[i].name, c.t[i].name);
        for (int l = 0; l < L; l++)
            for (int p = 0; p < 3; p++) {
                snprintf(src, sizeof src, "model.layers.%d.%s.experts.0.%s.weight", l, blk, epr[p]);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s.weight", l, qwen_pr[p]);
                add_copy(&d, &c, nm, src);
                if (p == 2) { /* down: times twin_scale */
                    uint16_t *w = d.buf[d.n - 1];
                    for (size_t i = 0; i < d.t[d.n - 1].nbytes / 2; i++)
                        w[i] = sd_f32_to_bf16(sd_bf16_to_f32(w[i]) * twin_scale);
                }
            }
    }
#undef P
    sd_err err = {0};
    int rc = 0;
    const char *dirs[2] = {dir, dense_dir};
    ckpt *cs[2] = {&c, &d};
    for (int w = 0; w < 2 && !rc; w++) {
        if (!dirs[w])
            continue;
        mkdir(dirs[w], 0700);
        char *p = sd_strfmt("%s/model.safetensors", dirs[w]);
        rc = sd_st_write(p, cs[w]->t, cs[w]->n, NULL, &err);
        free(p);
        static const char *const arch[2][2] = {{"Qwen3MoeForCausalLM", "Qwen3ForCausalLM"},
                                               {"MixtralForCausalLM", "MistralForCausalLM"}};
        static const char *const type[2][2] = {{"qwen3_moe", "qwen3"}, {"mixtral", "mistral"}};
        json_t *cfg = json_pack(
            "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:i, s:b, s:s}",
            "architectures", arch[mixtral][w], "model_type", type[mixtral][w], "vocab_size", V,
            "hidden_size", D, "intermediate_size", w || mixtral ? MI : DI, "num_hidden_layers", L,
            "num_attention_heads", H, "num_key_value_heads", HKV, "head_dim", HD, "rms_norm_eps",
            1e-6, "rope_theta", 1e6, "bos_token_id", 1, "eos_token_id", 2, "tie_word_embeddings", 0,
            "hidden_act", "silu");
        if (!w && mixtral) {
            json_object_set_new(cfg, "num_local_experts", json_integer(E));
            json_object_set_new(cfg, "num_experts_per_tok", json_integer(k));
        } else if (!w) {
            json_object_set_new(cfg, "num_experts", json_integer(E));
            json_object_set_new(cfg, "num_experts_per_tok", json_integer(k));
            json_object_set_new(cfg, "moe_intermediate_size", json_integer(MI));
            json_object_set_new(cfg, "decoder_sparse_step", json_integer(step));
            json_object_set_new(cfg, "norm_topk_prob", json_boolean(norm));
            json_object_set_new(cfg, "mlp_only_layers", json_array());
        }
        p = sd_strfmt("%s/config.json", dirs[w]);
        if (!rc && json_dump_file(cfg, p, 0))
            rc = -1;
        free(p);
        json_decref(cfg);
    }
    if (rc)
        fprintf(stderr, "  writing %s: %s\n", dir, err.msg);
    ckpt_free(&c);
    ckpt_free(&d);
    return rc;
}

static const int32_t IDS[] = {1, 17, 230, 5, 491, 42, 300, 3, 77, 120, 64, 9};
#define NIDS ((int)SD_ARRAY_LEN(IDS))

/* The MoE block (Qwen3-MoE's, or Mixtral's) against dense twins: E experts
 * k of them chosen, scale the dense model's down scale that the block's
 * weights make. */
static int block_is_dense(int mixtral, int E, int k, int norm, float scale)
{
    char tmpl[] = "/tmp/sd_q3moe_XXXXXX";
    if (!mkdtemp(tmpl))
        return 0;
    char *dm = sd_strfmt("%s/moe", tmpl), *dd = sd_strfmt("%s/dense", tmpl);
    int ok = write_moe(mixtral, dm, dd, E, k, 1, norm, scale, sd_test_seed()) == 0;
    sd_backend *be = NULL;
    outs a = {0}, b = {0};
    int nv = 0, nd = 0;
    sd_err err = {0};
    ok = ok && sd_cpu_backend_create(&be, 2) == 0;
    if (ok && (run_model(be, dm, IDS, NIDS, &a, &nv, &nd, &err) ||
               run_model(be, dd, IDS, NIDS, &b, &nv, &nd, &err))) {
        fprintf(stderr, "  %s\n", err.msg);
        ok = 0;
    }
    char what[96];
    snprintf(what, sizeof what, "%s %d experts, top %d%s", mixtral ? "mixtral" : "qwen3-moe", E,
             k, norm ? ", norm" : "");
    if (ok)
        ok = same(what, "logits", a.logits, b.logits, (size_t)NIDS * nv) &
             same(what, "decode", a.step, b.step, (size_t)NIDS * nv);
    outs_free(&a);
    outs_free(&b);
    sd_cpu_backend_destroy(be);
    rm_ckpt(dm);
    rm_ckpt(dd);
    rmdir(tmpl);
    free(dm);
    free(dd);
    return ok;
}

/* One expert, top-1: the block is that expert (weight 1). Eight copies of
 * one expert under a router of zeros: each softmax score is 1/8, so top-2
 * without norm_topk_prob weighs the expert 2/8 (the dense down x 0.25),
 * with it 1 (sigmoid scores would give 0.5 each: 1 and 1, not 0.25); top-4
 * 4/8. */
TEST(the_sparse_block_weighs_its_experts_by_softmax_top_k)
{
    ASSERT(block_is_dense(0, 1, 1, 1, 1.0f));
    ASSERT(block_is_dense(0, 8, 2, 0, 0.25f));
    ASSERT(block_is_dense(0, 8, 2, 1, 1.0f));
    ASSERT(block_is_dense(0, 8, 4, 0, 0.5f));
}

/* Mixtral: Mistral's layer (no q/k norms), block_sparse_moe with experts
 * w1 / w3 / w2, top-k always renormalized: copies of one expert weigh 1
 * (top-2 of 8, and one expert), against the dense Mistral. */
TEST(mixtrals_block_renormalizes_its_top_k)
{
    ASSERT(block_is_dense(1, 1, 1, 1, 1.0f));
    ASSERT(block_is_dense(1, 8, 2, 1, 1.0f));
}

TEST(eight_experts_route_and_split_over_ranks)
{
    char tmpl[] = "/tmp/sd_q3moe_XXXXXX";
    ASSERT(mkdtemp(tmpl));
    char *dm = sd_strfmt("%s/moe", tmpl), *dz = sd_strfmt("%s/moe_norm", tmpl);
    const uint64_t seed = sd_test_seed();
    ASSERT_OK(write_moe(0, dm, NULL, 8, 2, 2, 0, 1, seed));
    ASSERT_OK(write_moe(0, dz, NULL, 8, 2, 2, 1, 1, seed)); /* the same weights, renormalized */
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    outs a, z;
    int nv = 0, nd = 0;
    sd_err err = {0};
    ASSERT_MSG(run_model(be, dm, IDS, NIDS, &a, &nv, &nd, &err) == 0, "%s", err.msg);
    ASSERT_MSG(run_model(be, dz, IDS, NIDS, &z, &nv, &nd, &err) == 0, "%s", err.msg);
    size_t n = (size_t)NIDS * nv;
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(a.logits[i]) && isfinite(z.logits[i]);
    /* renormalizing the two weights changes the sparse layer's output */
    double moved = max_diff(a.logits, z.logits, n);
    fprintf(stderr, "  norm_topk_prob moves the logits by %.3g\n", moved);
    /* one token at a time gives the prefill's numbers */
    int ok = finite && moved > 1e-3 && max_diff(a.logits, a.step, n) < 1e-4 * (1 + max_abs(a.logits, n));
    outs_free(&a);
    outs_free(&z);
    sd_cpu_backend_destroy(be);
    ASSERT_MSG(ok, "8-expert model: finite %d, moved %.3g", finite, moved);
    /* the engine: 1 rank, 2 tensor-parallel, 2 expert-parallel: one answer */
    engine_out ref[ENGINE_GREEDY_REQS], got[ENGINE_GREEDY_REQS];
    const char *one[] = {"model", dm, NULL};
    ASSERT_OK(engine_greedy(one, ref, 16));
    const char *tp2[] = {"model", dm, "tp", "2", NULL};
    const char *ep2[] = {"model", dm, "tp", "2", "ep", "true", NULL};
    const char *const *runs[2] = {tp2, ep2};
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(engine_greedy(runs[r], got, 16));
        for (int i = 0; i < ENGINE_GREEDY_REQS; i++)
            ASSERT_MSG(got[i].n == 16 && !memcmp(got[i].ids, ref[i].ids, 16 * sizeof got[i].ids[0]),
                       "%s: request %d's tokens differ from one rank's", r ? "ep 2" : "tp 2", i);
    }
    rm_ckpt(dm);
    rm_ckpt(dz);
    rmdir(tmpl);
    free(dm);
    free(dz);
}

TEST_MAIN(T(the_sparse_block_weighs_its_experts_by_softmax_top_k), T(mixtrals_block_renormalizes_its_top_k),
          T(eight_experts_route_and_split_over_ranks))

/* bench/decode/floor: the bytes a decode step reads, from checkpoints written
 * here with known tensor sizes (a dense Llama, a MoE DeepSeek-V3 with an MTP
 * layer, a tied-embedding Llama), and the expected distinct experts against
 * a simulation of uniform top-k routing. */
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "engine/tiny_model.h"
#include "floor.h"
#include "test.h"

TEST(dense_llama_reads_every_weight_but_only_the_embedding_rows_it_looks_up)
{
    tiny_spec sp = {.vocab = 300, .hidden = 32, .layers = 3, .heads = 4, .kv_heads = 2,
                    .inter = 48, .scale = 0.05f, .seed = 7};
    char *dir = tiny_model_write(&sp);
    ASSERT(dir != NULL);
    sd_decode_bytes b;
    sd_err err = {0};
    ASSERT_OK(sd_decode_bytes_load(&b, dir, 4, &err));
    int D = 32, V = 300, I = 48, L = 3, hd = 8;
    /* bf16: embed, head, final norm; per layer 2 norms, q, k, v, o, gate, up, down */
    double layer = 2.0 * (2 * D + D * D + 2 * (2 * hd) * D + D * D + 3 * I * D);
    double total = 2.0 * (2 * V * D + D) + L * layer;
    ASSERT_NEAR(b.total, total, 0);
    ASSERT_NEAR(b.embed_row, 2.0 * D, 0);
    ASSERT_NEAR(b.dense, total - 2.0 * V * D, 0);
    ASSERT_NEAR(b.routed, 0, 0);
    ASSERT_NEAR(b.mtp, 0, 0);
    ASSERT_EQ(b.n_experts, 0);
    ASSERT_NEAR(b.kv_per_token, 2.0 * L * 2 * hd * 4, 0);
    for (int B = 1; B <= 64; B *= 4)
        ASSERT_NEAR(sd_decode_step_bytes(&b, B), total - 2.0 * V * D + B * 2.0 * D, 1e-6);
    char *cmd = sd_strfmt("rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    free(dir);
}

/* Writes dir/config.json and one safetensors file of zero-filled tensors
 * (dts: each one's dtype; NULL: bf16). */
static int write_ckpt_dt(const char *dir, const char *config, const char *const *names,
                         const int64_t (*shapes)[2], const sd_dtype *dts, int n)
{
    char *p = sd_strfmt("%s/config.json", dir);
    int rc = sd_write_file(p, config, strlen(config), NULL);
    free(p);
    if (rc)
        return rc;
    sd_st_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        int64_t r = shapes[i][0], c = shapes[i][1];
        size_t cnt = (size_t)r * (size_t)(c ? c : 1);
        const sd_dtype dt = dts ? dts[i] : SD_DT_BF16;
        const size_t es = sd_dtype_size(dt);
        t[i] = (sd_st_tensor){.name = names[i], .dtype = dt, .ndim = c ? 2 : 1,
                              .shape = {r, c}, .data = calloc(cnt, es), .nbytes = cnt * es};
    }
    p = sd_strfmt("%s/model.safetensors", dir);
    sd_err err = {0};
    rc = sd_st_write(p, t, n, NULL, &err);
    free(p);
    for (int i = 0; i < n; i++)
        free((void *)t[i].data);
    free(t);
    return rc;
}

static int write_ckpt(const char *dir, const char *config, const char *const *names,
                      const int64_t (*shapes)[2], int n)
{
    return write_ckpt_dt(dir, config, names, shapes, NULL, n);
}

TEST(moe_reads_the_expected_distinct_experts_and_not_the_mtp_layer)
{
    char tmpl[] = "/tmp/specd-floor-XXXXXX";
    ASSERT(mkdtemp(tmpl) != NULL);
    /* 2 layers (layer 0 dense, layer 1 MoE: 8 experts top-2), MTP at layer 2 */
    const char *cfg =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
        "\"vocab_size\": 100, \"hidden_size\": 16, \"intermediate_size\": 40, "
        "\"moe_intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 2, \"q_lora_rank\": null, \"kv_lora_rank\": 12, "
        "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, "
        "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1, "
        "\"first_k_dense_replace\": 1, \"n_group\": 1, \"topk_group\": 1, "
        "\"norm_topk_prob\": false, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", "
        "\"num_nextn_predict_layers\": 1, \"max_position_embeddings\": 256, "
        "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}";
    enum { N = 3 + 1 + 8 + 1 + 1 + 2 };
    const char *names[N] = {"model.embed_tokens.weight",
                            "lm_head.weight",
                            "model.norm.weight",
                            "model.layers.0.mlp.gate_proj.weight",
                            "model.layers.1.mlp.experts.0.gate_proj.weight",
                            "model.layers.1.mlp.experts.1.gate_proj.weight",
                            "model.layers.1.mlp.experts.2.gate_proj.weight",
                            "model.layers.1.mlp.experts.3.gate_proj.weight",
                            "model.layers.1.mlp.experts.4.gate_proj.weight",
                            "model.layers.1.mlp.experts.5.gate_proj.weight",
                            "model.layers.1.mlp.experts.6.gate_proj.weight",
                            "model.layers.1.mlp.experts.7.gate_proj.weight",
                            "model.layers.1.mlp.shared_experts.gate_proj.weight",
                            "model.layers.1.mlp.gate.weight",
                            "model.layers.2.mlp.experts.0.gate_proj.weight",
                            "model.layers.2.eh_proj.weight"};
    const int64_t shapes[N][2] = {{100, 16}, {100, 16}, {16, 0}, {40, 16}, {8, 16}, {8, 16},
                                  {8, 16},   {8, 16},   {8, 16}, {8, 16}, {8, 16},  {8, 16},
                                  {8, 16},   {8, 16},   {8, 16}, {16, 32}};
    ASSERT_OK(write_ckpt(tmpl, cfg, names, shapes, N));
    sd_decode_bytes b;
    sd_err err = {0};
    ASSERT_OK(sd_decode_bytes_load(&b, tmpl, 2, &err));
    double dense = 2.0 * (100 * 16 + 16 + 40 * 16 + 8 * 16 + 8 * 16); /* head, norm, mlp, shared, router */
    ASSERT_NEAR(b.dense, dense, 0);
    ASSERT_NEAR(b.embed_row, 32, 0);
    ASSERT_NEAR(b.routed, 8 * 2.0 * 8 * 16, 0);
    ASSERT_NEAR(b.mtp, 2.0 * (8 * 16 + 16 * 32), 0);
    ASSERT_EQ(b.n_experts, 8);
    ASSERT_EQ(b.top_k, 2);
    ASSERT_EQ(b.n_moe_layers, 1);
    ASSERT_NEAR(b.kv_per_token, 2.0 * (12 + 4) * 2, 0); /* MLA latent + rope key, 2 layers */
    /* one token reads its 2 experts of 8; many tokens read all 8 */
    ASSERT_NEAR(sd_decode_step_bytes(&b, 1), dense + 32 + 2 * 256, 1e-9);
    ASSERT_NEAR(sd_decode_step_bytes(&b, 3), dense + 3 * 32 + 8 * (1 - 0.75 * 0.75 * 0.75) * 256,
                1e-9);
    ASSERT_NEAR(sd_decode_step_bytes(&b, 200), dense + 200 * 32 + 8 * 256, 1e-6);
    char *cmd = sd_strfmt("rm -rf '%s'", tmpl);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
}

/* A block-scaled FP8 checkpoint: its FP8 bytes and their scales, but MLA's
 * kv_b at BF16 and without scales (absorbed into BF16 at load, FP8 or not) */
TEST(fp8_weights_count_their_bytes_and_scales_but_kv_b_as_the_bf16_it_loads_as)
{
    char tmpl[] = "/tmp/specd-floor-XXXXXX";
    ASSERT(mkdtemp(tmpl) != NULL);
    const char *cfg =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
        "\"vocab_size\": 100, \"hidden_size\": 16, \"intermediate_size\": 40, "
        "\"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, "
        "\"n_shared_experts\": 1, \"first_k_dense_replace\": 1, \"n_group\": 1, \"topk_group\": 1, "
        "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 2, \"q_lora_rank\": null, \"kv_lora_rank\": 12, "
        "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, "
        "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, "
        "\"tie_word_embeddings\": false, \"quantization_config\": {\"quant_method\": \"fp8\", "
        "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}}";
    enum { N = 7 };
    const char *names[N] = {"model.embed_tokens.weight",
                            "lm_head.weight",
                            "model.norm.weight",
                            "model.layers.0.self_attn.o_proj.weight",
                            "model.layers.0.self_attn.o_proj.weight_scale_inv",
                            "model.layers.0.self_attn.kv_b_proj.weight",
                            "model.layers.0.self_attn.kv_b_proj.weight_scale_inv"};
    const int64_t shapes[N][2] = {{100, 16}, {100, 16}, {16, 0}, {16, 16}, {1, 1}, {32, 12}, {1, 1}};
    const sd_dtype dts[N] = {SD_DT_BF16,    SD_DT_BF16, SD_DT_BF16,   SD_DT_F8_E4M3,
                             SD_DT_F32,     SD_DT_F8_E4M3, SD_DT_F32};
    ASSERT_OK(write_ckpt_dt(tmpl, cfg, names, shapes, dts, N));
    sd_decode_bytes b;
    sd_err err = {0};
    ASSERT_MSG(sd_decode_bytes_load(&b, tmpl, 2, &err) == 0, "%s", err.msg);
    /* head and norm in bf16, o_proj's bytes and its one scale, kv_b as bf16 */
    ASSERT_NEAR(b.dense, 2.0 * (100 * 16 + 16) + (16 * 16 + 4) + 2.0 * 32 * 12, 0);
    char *cmd = sd_strfmt("rm -rf '%s'", tmpl);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
}

/* The closed form against routing simulated as it is assumed: each token
 * picks top_k distinct experts uniformly (a partial Fisher-Yates shuffle). */
TEST(expected_distinct_experts_match_a_simulation_of_uniform_routing)
{
    uint64_t s = sd_test_seed() | 1;
    const int cases[][3] = {{8, 2, 1}, {8, 2, 3}, {64, 6, 1}, {64, 6, 8}, {64, 6, 32}, {256, 8, 17}};
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int E = cases[c][0], k = cases[c][1], B = cases[c][2];
        enum { TRIALS = 20000 };
        double sum = 0, sum2 = 0;
        int perm[256];
        unsigned char used[256];
        for (int t = 0; t < TRIALS; t++) {
            memset(used, 0, sizeof used);
            int distinct = 0;
            for (int b = 0; b < B; b++) {
                for (int i = 0; i < E; i++)
                    perm[i] = i;
                for (int i = 0; i < k; i++) {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    int j = i + (int)(s % (uint64_t)(E - i));
                    int x = perm[i];
                    perm[i] = perm[j];
                    perm[j] = x;
                    if (!used[perm[i]]) {
                        used[perm[i]] = 1;
                        distinct++;
                    }
                }
            }
            sum += distinct;
            sum2 += (double)distinct * distinct;
        }
        double mean = sum / TRIALS, sd = sqrt(sum2 / TRIALS - mean * mean) / sqrt(TRIALS);
        double want = sd_decode_expected_experts(E, k, B);
        fprintf(stderr, "  E %d top-%d, %d tokens: simulated %.4f, formula %.4f\n", E, k, B, mean,
                want);
        ASSERT_NEAR(mean, want, 5 * sd + 1e-9);
    }
    ASSERT_NEAR(sd_decode_expected_experts(8, 8, 5), 8, 0);
    ASSERT_NEAR(sd_decode_expected_experts(0, 2, 5), 0, 0);
}

TEST_MAIN(T(dense_llama_reads_every_weight_but_only_the_embedding_rows_it_looks_up),
          T(fp8_weights_count_their_bytes_and_scales_but_kv_b_as_the_bf16_it_loads_as),
          T(moe_reads_the_expected_distinct_experts_and_not_the_mtp_layer),
          T(expected_distinct_experts_match_a_simulation_of_uniform_routing))

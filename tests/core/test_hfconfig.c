/* tests/core/test_hfconfig: config.json parsing for every supported
 * architecture, both RoPE layouts, the derived attention scales, and one clear
 * error (code + file + key) for every kind of bad config. */
#include <jansson.h>

#include "core/hfconfig.h"
#include "core/util.h"
#include "test.h"

#define PATH "ckpt/config.json"

/* Llama-3.1-8B-Instruct shaped, 4.x layout (rope_theta + rope_scaling). */
static const char *LLAMA31 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"intermediate_size\":14336,\"max_position_embeddings\":131072,"
    "\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":32,"
    "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
    "\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
    "\"rope_theta\":500000.0,\"tie_word_embeddings\":false,\"vocab_size\":128256}";

/* The same model as transformers 5.x writes it: rope_parameters, theta inside. */
static const char *LLAMA31_V5 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,"
    "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\","
    "\"hidden_size\":4096,\"intermediate_size\":14336,\"max_position_embeddings\":131072,"
    "\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":32,"
    "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
    "\"rope_parameters\":{\"factor\":8.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
    "\"original_max_position_embeddings\":8192,\"rope_theta\":500000.0,"
    "\"rope_type\":\"llama3\"},\"tie_word_embeddings\":false,\"vocab_size\":128256}";

/* Qwen3-0.6B shaped: head_dim 128 while hidden/heads is 64. */
static const char *QWEN3 =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"intermediate_size\":3072,\"max_position_embeddings\":40960,"
    "\"max_window_layers\":28,\"model_type\":\"qwen3\",\"num_attention_heads\":16,"
    "\"num_hidden_layers\":28,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,"
    "\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
    "\"tie_word_embeddings\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";

/* Qwen3-30B-A3B's config.json. */
static const char *QWEN3_MOE =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,"
    "\"attention_dropout\":0.0,\"bos_token_id\":151643,\"decoder_sparse_step\":1,"
    "\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
    "\"initializer_range\":0.02,\"intermediate_size\":6144,\"max_position_embeddings\":40960,"
    "\"max_window_layers\":48,\"mlp_only_layers\":[],\"model_type\":\"qwen3_moe\","
    "\"moe_intermediate_size\":768,\"norm_topk_prob\":true,\"num_attention_heads\":32,"
    "\"num_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"output_router_logits\":false,\"rms_norm_eps\":1e-06,"
    "\"rope_scaling\":null,\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.51.0\",\"use_cache\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

/* Mixtral-8x7B-Instruct-v0.1's config.json. */
static const char *MIXTRAL =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":1,"
    "\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mixtral\","
    "\"num_attention_heads\":32,\"num_experts_per_tok\":2,\"num_hidden_layers\":32,"
    "\"num_key_value_heads\":8,\"num_local_experts\":8,\"output_router_logits\":false,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.02,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.36.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}";

/* DeepSeek-V2-Lite's config.json (auto_map left out). */
static const char *DSV2_LITE =
    "{\"architectures\":[\"DeepseekV2ForCausalLM\"],\"attention_bias\":false,"
    "\"attention_dropout\":0.0,\"aux_loss_alpha\":0.001,\"bos_token_id\":100000,"
    "\"eos_token_id\":100001,\"first_k_dense_replace\":1,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":10944,"
    "\"kv_lora_rank\":512,\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v2\","
    "\"moe_intermediate_size\":1408,\"moe_layer_freq\":1,\"n_group\":1,\"n_routed_experts\":64,"
    "\"n_shared_experts\":2,\"norm_topk_prob\":false,\"num_attention_heads\":16,"
    "\"num_experts_per_tok\":6,\"num_hidden_layers\":27,\"num_key_value_heads\":16,"
    "\"pretraining_tp\":1,\"q_lora_rank\":null,\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,"
    "\"mscale\":0.707,\"mscale_all_dim\":0.707,\"original_max_position_embeddings\":4096,"
    "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":1.0,"
    "\"scoring_func\":\"softmax\",\"seq_aux\":true,\"tie_word_embeddings\":false,"
    "\"topk_group\":1,\"topk_method\":\"greedy\",\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.33.1\",\"use_cache\":true,\"v_head_dim\":128,"
    "\"vocab_size\":102400}";

/* A small DeepSeek-V3 (4.x layout, yarn under the legacy "type" key). */
static const char *DSV3 =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\","
    "\"bos_token_id\":0,\"eos_token_id\":1,\"first_k_dense_replace\":1,\"hidden_act\":\"silu\","
    "\"hidden_size\":256,\"intermediate_size\":512,\"kv_lora_rank\":64,"
    "\"max_position_embeddings\":163840,\"moe_intermediate_size\":128,\"moe_layer_freq\":1,"
    "\"n_group\":4,\"n_routed_experts\":16,\"n_shared_experts\":1,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":8,\"num_experts_per_tok\":4,\"num_hidden_layers\":4,"
    "\"num_key_value_heads\":8,\"num_nextn_predict_layers\":1,\"q_lora_rank\":96,"
    "\"qk_nope_head_dim\":32,\"qk_rope_head_dim\":16,\"rms_norm_eps\":1e-06,"
    "\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,\"mscale\":1.0,"
    "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},"
    "\"rope_theta\":10000,\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\","
    "\"tie_word_embeddings\":false,\"topk_group\":2,\"topk_method\":\"noaux_tc\","
    "\"v_head_dim\":32,\"vocab_size\":1000}";

/* Kimi-K2-Instruct shaped: model_type kimi_k2 on the DeepSeek-V3 architecture. */
static const char *KIMI_K2 =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":false,"
    "\"auto_map\":{\"AutoConfig\":\"configuration_deepseek.DeepseekV3Config\"},"
    "\"aux_loss_alpha\":0.001,\"bos_token_id\":163584,\"eos_token_id\":163585,"
    "\"first_k_dense_replace\":1,\"hidden_act\":\"silu\",\"hidden_size\":7168,"
    "\"initializer_range\":0.02,\"intermediate_size\":18432,\"kv_lora_rank\":512,"
    "\"max_position_embeddings\":131072,\"model_type\":\"kimi_k2\","
    "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":1,"
    "\"n_routed_experts\":384,\"n_shared_experts\":1,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":64,\"num_experts_per_tok\":8,\"num_hidden_layers\":61,"
    "\"num_key_value_heads\":64,\"num_nextn_predict_layers\":0,\"q_lora_rank\":1536,"
    "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"quantization_config\":"
    "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
    "\"weight_block_size\":[128,128]},\"rms_norm_eps\":1e-06,\"rope_scaling\":"
    "{\"beta_fast\":1.0,\"beta_slow\":1.0,\"factor\":32.0,\"mscale\":1.0,"
    "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},"
    "\"rope_theta\":50000.0,\"routed_scaling_factor\":2.827,\"scoring_func\":\"sigmoid\","
    "\"seq_aux\":true,\"tie_word_embeddings\":false,\"topk_group\":1,"
    "\"topk_method\":\"noaux_tc\",\"torch_dtype\":\"bfloat16\",\"use_cache\":true,"
    "\"v_head_dim\":128,\"vocab_size\":163840}";

/* yarn's magnitude correction, as transformers defines it. */
static double mscale(double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * log(f) + 1.0; }

/* base, with patch (a JSON object) merged over the top level and del (a key,
 * or "outer.inner") removed, then parsed. */
static int parse_mod(const char *base, const char *patch, const char *del, sd_model_cfg *cfg,
                     sd_err *err)
{
    json_t *root = json_loads(base, 0, NULL);
    if (!root)
        return -100;
    if (patch) {
        json_t *p = json_loads(patch, 0, NULL);
        if (!p) {
            json_decref(root);
            return -101;
        }
        json_object_update(root, p);
        json_decref(p);
    }
    if (del) {
        const char *dot = strchr(del, '.');
        if (dot) {
            char outer[64];
            snprintf(outer, sizeof outer, "%.*s", (int)(dot - del), del);
            json_object_del(json_object_get(root, outer), dot + 1);
        } else {
            json_object_del(root, del);
        }
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = sd_model_cfg_parse(cfg, text, PATH, err);
    free(text);
    return rc;
}

static int rope_equal(const sd_rope_cfg *a, const sd_rope_cfg *b)
{
    return a->type == b->type && a->theta == b->theta && a->factor == b->factor &&
           a->original_max_pos == b->original_max_pos && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->attention_factor == b->attention_factor &&
           a->interleave == b->interleave && a->rot_dim == b->rot_dim;
}

/* ---- architectures ---- */

TEST(llama31_parses_with_llama3_rope_and_eos_list)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, LLAMA31, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_LLAMA);
    ASSERT_STR_EQ(c.arch_name, "LlamaForCausalLM");
    ASSERT_STR_EQ(c.model_type, "llama");
    ASSERT_EQ(c.vocab_size, 128256);
    ASSERT_EQ(c.hidden_size, 4096);
    ASSERT_EQ(c.intermediate_size, 14336);
    ASSERT_EQ(c.num_layers, 32);
    ASSERT_EQ(c.num_heads, 32);
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.head_dim, 128); /* hidden / heads */
    ASSERT_NEAR(c.rms_eps, 1e-5, 0);
    ASSERT_EQ(c.max_pos, 131072);
    ASSERT_EQ(c.tie_embeddings, 0);
    ASSERT_EQ(c.bos_id, 128000);
    ASSERT_EQ(c.n_eos, 3);
    ASSERT_EQ(c.eos_id, 128001);
    ASSERT_EQ(c.eos_ids[1], 128008);
    ASSERT_EQ(c.eos_ids[2], 128009);
    ASSERT_EQ(c.rope.type, SD_ROPE_LLAMA3);
    ASSERT_NEAR(c.rope.theta, 500000.0, 0);
    ASSERT_NEAR(c.rope.factor, 8.0, 0);
    ASSERT_NEAR(c.rope.low_freq_factor, 1.0, 0);
    ASSERT_NEAR(c.rope.high_freq_factor, 4.0, 0);
    ASSERT_EQ(c.rope.original_max_pos, 8192);
    ASSERT_EQ(c.rope.interleave, 0);
    ASSERT_EQ(c.rope.rot_dim, 128);
    ASSERT_NEAR(c.rope_attn_factor, 1.0, 0);
    ASSERT_NEAR(c.softmax_scale, 1.0 / sqrt(128.0), 1e-15);
    ASSERT_EQ(c.qk_norm, 0);
    ASSERT_EQ(c.n_routed_experts, 0);
    ASSERT_EQ(c.fp8, 0);
    ASSERT_EQ(c.sliding_window, 0);
    for (int l = 0; l < c.num_layers; l++)
        ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, l), 0);
}

TEST(rope_scaling_and_rope_parameters_layouts_give_the_same_rope)
{
    sd_model_cfg a, b;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&a, LLAMA31, PATH, &err) == 0, "%s", err.msg);
    ASSERT_MSG(sd_model_cfg_parse(&b, LLAMA31_V5, PATH, &err) == 0, "%s", err.msg);
    ASSERT(rope_equal(&a.rope, &b.rope));
    ASSERT_EQ(b.rope.type, SD_ROPE_LLAMA3);
    ASSERT_NEAR(b.rope.theta, 500000.0, 0);

    /* yarn: 4.x "type" + top-level theta vs 5.x rope_parameters. */
    ASSERT_MSG(sd_model_cfg_parse(&a, DSV3, PATH, &err) == 0, "%s", err.msg);
    ASSERT_MSG(parse_mod(DSV3,
                         "{\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000.0,"
                         "\"factor\":40.0,\"beta_fast\":32.0,\"beta_slow\":1.0,\"mscale\":1.0,"
                         "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096}}",
                         "rope_scaling", &b, &err) == 0,
               "%s", err.msg);
    ASSERT(rope_equal(&a.rope, &b.rope));
    ASSERT_NEAR(a.rope_attn_factor, b.rope_attn_factor, 0);
    ASSERT_NEAR(a.softmax_scale, b.softmax_scale, 0);

    /* default: rope_scaling null + rope_theta vs rope_parameters. */
    ASSERT_MSG(sd_model_cfg_parse(&a, QWEN3, PATH, &err) == 0, "%s", err.msg);
    ASSERT_MSG(
        parse_mod(QWEN3,
                  "{\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}",
                  "rope_theta", &b, &err) == 0,
        "%s", err.msg);
    ASSERT(rope_equal(&a.rope, &b.rope));
    ASSERT_EQ(a.rope.type, SD_ROPE_DEFAULT);
    ASSERT_NEAR(a.rope.theta, 1e6, 0);
    ASSERT_NEAR(a.rope.factor, 1.0, 0);

    /* rope_parameters without theta inside falls back to the top level. */
    ASSERT_MSG(parse_mod(LLAMA31_V5, "{\"rope_theta\":500000.0}", "rope_parameters.rope_theta", &b,
                         &err) == 0,
               "%s", err.msg);
    ASSERT_MSG(sd_model_cfg_parse(&a, LLAMA31, PATH, &err) == 0, "%s", err.msg);
    ASSERT(rope_equal(&a.rope, &b.rope));
}

/* Qwen3-MoE: Qwen3's attention, every layer a sparse block (softmax top-8
 * of 128, renormalized), no shared expert or groups; decoder_sparse_step
 * picks the sparse layers; dense layers in mlp_only_layers are refused. */
TEST(qwen3_moe_parses_its_sparse_blocks)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, QWEN3_MOE, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_QWEN3);
    ASSERT_STR_EQ(c.model_type, "qwen3_moe");
    ASSERT_EQ(c.qk_norm, 1);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.num_kv_heads, 4);
    ASSERT_EQ(c.n_routed_experts, 128);
    ASSERT_EQ(c.num_experts_per_tok, 8);
    ASSERT_EQ(c.moe_intermediate_size, 768);
    ASSERT_EQ(c.norm_topk_prob, 1);
    ASSERT_EQ(c.n_shared_experts, 0);
    ASSERT_EQ(c.n_group, 1);
    ASSERT_EQ(c.topk_group, 1);
    ASSERT_EQ(c.scoring_sigmoid, 0);
    ASSERT_NEAR(c.routed_scaling_factor, 1.0, 0);
    for (int i = 0; i < 48; i++)
        ASSERT(sd_model_cfg_layer_is_moe(&c, i));
    ASSERT(!sd_model_cfg_layer_is_moe(&c, 48));
    /* every second layer sparse (1, 3, ...); HF's defaults where keys are absent */
    ASSERT_MSG(parse_mod(QWEN3_MOE, "{\"decoder_sparse_step\":2}", "norm_topk_prob", &c, &err) == 0,
               "%s", err.msg);
    ASSERT(!sd_model_cfg_layer_is_moe(&c, 0) && sd_model_cfg_layer_is_moe(&c, 1) &&
           !sd_model_cfg_layer_is_moe(&c, 2) && sd_model_cfg_layer_is_moe(&c, 47));
    ASSERT_EQ(c.norm_topk_prob, 0);
    ASSERT_EQ(parse_mod(QWEN3_MOE, "{\"mlp_only_layers\":[0,3]}", NULL, &c, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "key \"mlp_only_layers\" lists dense layers");
    ASSERT_EQ(parse_mod(QWEN3_MOE, "{\"num_experts_per_tok\":129}", NULL, &c, &err), SD_ERANGE);
    /* the dense Qwen3 has no sparse layer */
    ASSERT_OK(sd_model_cfg_parse(&c, QWEN3, PATH, &err));
    ASSERT_EQ(c.n_routed_experts, 0);
    ASSERT(!sd_model_cfg_layer_is_moe(&c, 0));
}

/* DeepSeek-V2-Lite: MLA without q LoRA, softmax scores, a plain top-6 of
 * 64 (greedy: no groups, no correction bias), not renormalized, scale 1;
 * V2's group-limited variant is refused. */
TEST(deepseek_v2_lite_routes_by_a_plain_softmax_top_k)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, DSV2_LITE, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_DEEPSEEK_V3);
    ASSERT_STR_EQ(c.model_type, "deepseek_v2");
    ASSERT_EQ(c.q_lora_rank, 0);
    ASSERT_EQ(c.kv_lora_rank, 512);
    ASSERT_EQ(c.n_routed_experts, 64);
    ASSERT_EQ(c.num_experts_per_tok, 6);
    ASSERT_EQ(c.n_shared_experts, 2);
    ASSERT_EQ(c.scoring_sigmoid, 0);
    ASSERT_EQ(c.route_bias, 0);
    ASSERT_EQ(c.n_group, 1);
    ASSERT_EQ(c.topk_group, 1);
    ASSERT_EQ(c.norm_topk_prob, 0);
    ASSERT_NEAR(c.routed_scaling_factor, 1.0, 0);
    ASSERT_EQ(c.num_nextn_predict_layers, 0);
    ASSERT(!sd_model_cfg_layer_is_moe(&c, 0) && sd_model_cfg_layer_is_moe(&c, 1));
    ASSERT_EQ(c.rope.type, SD_ROPE_YARN);
    /* its config class's defaults where keys are absent */
    ASSERT_OK(parse_mod(DSV2_LITE, NULL, "topk_method", &c, &err));
    ASSERT_EQ(c.n_group, 1);
    ASSERT_OK(parse_mod(DSV2_LITE, NULL, "scoring_func", &c, &err));
    ASSERT_EQ(c.scoring_sigmoid, 0);
    ASSERT_EQ(parse_mod(DSV2_LITE, "{\"topk_method\":\"group_limited_greedy\",\"n_group\":8,"
                                   "\"topk_group\":3}",
                        NULL, &c, &err),
              SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "key \"topk_method\" = \"group_limited_greedy\" is not supported (greedy)");
    /* V3 keeps its bias-steered routing */
    ASSERT_OK(sd_model_cfg_parse(&c, DSV3, PATH, &err));
    ASSERT_EQ(c.route_bias, 1);
}

/* Mixtral: Mistral's attention, every layer 8 experts of intermediate_size,
 * softmax top-2 always renormalized, named block_sparse_moe / w1 w3 w2. */
TEST(mixtral_parses_its_sparse_blocks)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, MIXTRAL, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_LLAMA);
    ASSERT_STR_EQ(c.model_type, "mixtral");
    ASSERT_EQ(c.qk_norm, 0);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.n_routed_experts, 8);
    ASSERT_EQ(c.num_experts_per_tok, 2);
    ASSERT_EQ(c.moe_intermediate_size, 14336);
    ASSERT_EQ(c.norm_topk_prob, 1);
    ASSERT_EQ(c.moe_mixtral_names, 1);
    ASSERT_EQ(c.scoring_sigmoid, 0);
    ASSERT_EQ(c.n_group, 1);
    ASSERT_EQ(c.route_bias, 0);
    ASSERT_EQ(c.sliding_window, 0);
    for (int i = 0; i < 32; i++)
        ASSERT(sd_model_cfg_layer_is_moe(&c, i));
    ASSERT_EQ(parse_mod(MIXTRAL, "{\"num_experts_per_tok\":9}", NULL, &c, &err), SD_ERANGE);
}

TEST(qwen3_keeps_explicit_head_dim_and_defaults_it_to_128)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, QWEN3, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_QWEN3);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.hidden_size / c.num_heads, 64);
    ASSERT_EQ(c.qk_norm, 1);
    ASSERT_EQ(c.tie_embeddings, 1);
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.bos_id, 151643);
    ASSERT_EQ(c.n_eos, 1);
    ASSERT_EQ(c.eos_id, 151645);
    ASSERT_EQ(c.rope.rot_dim, 128);
    ASSERT_EQ(c.rope.interleave, 0);
    ASSERT_NEAR(c.softmax_scale, 1.0 / sqrt(128.0), 1e-15);

    /* Qwen3Config's default head_dim is 128, not hidden/heads; its token ids
     * default to none. */
    ASSERT_MSG(parse_mod(QWEN3, "{\"bos_token_id\":null}", "head_dim", &c, &err) == 0, "%s",
               err.msg);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.bos_id, -1);
    ASSERT_MSG(parse_mod(QWEN3, NULL, "eos_token_id", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.n_eos, 0);
    ASSERT_EQ(c.eos_id, -1);
    ASSERT_EQ(c.bos_id, 151643);
}

TEST(deepseek_v3_with_and_without_q_lora)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, DSV3, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_DEEPSEEK_V3);
    ASSERT_EQ(c.q_lora_rank, 96);
    ASSERT_EQ(c.kv_lora_rank, 64);
    ASSERT_EQ(c.qk_nope_head_dim, 32);
    ASSERT_EQ(c.qk_rope_head_dim, 16);
    ASSERT_EQ(c.v_head_dim, 32);
    ASSERT_EQ(c.head_dim, 48);
    ASSERT_EQ(c.num_kv_heads, c.num_heads);
    ASSERT_EQ(c.rope.rot_dim, 16);
    ASSERT_EQ(c.rope.interleave, 1);
    ASSERT_EQ(c.rope.type, SD_ROPE_YARN);
    ASSERT_EQ(c.n_routed_experts, 16);
    ASSERT_EQ(c.n_shared_experts, 1);
    ASSERT_EQ(c.num_experts_per_tok, 4);
    ASSERT_EQ(c.moe_intermediate_size, 128);
    ASSERT_EQ(c.n_group, 4);
    ASSERT_EQ(c.topk_group, 2);
    ASSERT_EQ(c.norm_topk_prob, 1);
    ASSERT_EQ(c.scoring_sigmoid, 1);
    ASSERT_NEAR(c.routed_scaling_factor, 2.5, 0);
    ASSERT_EQ(c.num_nextn_predict_layers, 1);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 0), 0);
    for (int l = 1; l <= 4; l++) /* 4 = the MTP layer */
        ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, l), 1);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 5), 0);

    ASSERT_MSG(
        parse_mod(DSV3, "{\"q_lora_rank\":null,\"num_key_value_heads\":1}", NULL, &c, &err) == 0,
        "%s", err.msg);
    ASSERT_EQ(c.q_lora_rank, 0);
    ASSERT_EQ(c.num_kv_heads, 8); /* MLA ignores num_key_value_heads */

    /* DeepseekV3Config's default when the key is absent. */
    ASSERT_MSG(parse_mod(DSV3, NULL, "q_lora_rank", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.q_lora_rank, 1536);

    ASSERT_MSG(parse_mod(DSV3, "{\"rope_interleave\":false}", NULL, &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.rope.interleave, 0);

    /* n_routed_experts null: a dense model, every layer an MLP. */
    ASSERT_MSG(parse_mod(DSV3, "{\"n_routed_experts\":null}", "moe_intermediate_size", &c, &err) ==
                   0,
               "%s", err.msg);
    ASSERT_EQ(c.n_routed_experts, 0);
    for (int l = 0; l <= 4; l++)
        ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, l), 0);

    /* moe_layer_freq 2: MoE on even layers past the dense prefix. */
    ASSERT_MSG(
        parse_mod(DSV3, "{\"moe_layer_freq\":2,\"first_k_dense_replace\":0}", NULL, &c, &err) == 0,
        "%s", err.msg);
    for (int l = 0; l <= 4; l++)
        ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, l), l % 2 == 0);
}

TEST(deepseek_optional_keys_default_like_transformers)
{
    const char *min = "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"hidden_size\":256,"
                      "\"intermediate_size\":512,\"kv_lora_rank\":64,\"moe_intermediate_size\":128,"
                      "\"num_attention_heads\":8,\"num_hidden_layers\":4,\"qk_nope_head_dim\":32,"
                      "\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"vocab_size\":1000}";
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, min, PATH, &err) == 0, "%s", err.msg);
    ASSERT_STR_EQ(c.model_type, "deepseek_v3");
    ASSERT_EQ(c.q_lora_rank, 1536);
    ASSERT_EQ(c.n_routed_experts, 256);
    ASSERT_EQ(c.n_shared_experts, 1);
    ASSERT_EQ(c.num_experts_per_tok, 8);
    ASSERT_EQ(c.n_group, 8);
    ASSERT_EQ(c.topk_group, 4);
    ASSERT_NEAR(c.routed_scaling_factor, 2.5, 0);
    ASSERT_EQ(c.norm_topk_prob, 1);
    ASSERT_EQ(c.scoring_sigmoid, 1);
    ASSERT_EQ(c.first_k_dense_replace, 3);
    ASSERT_EQ(c.moe_layer_freq, 1);
    ASSERT_EQ(c.num_nextn_predict_layers, 0);
    ASSERT_EQ(c.rope.interleave, 1);
    ASSERT_EQ(c.rope.type, SD_ROPE_DEFAULT);
    ASSERT_NEAR(c.rope.theta, 10000.0, 0);
    ASSERT_EQ(c.max_pos, 4096);
    ASSERT_NEAR(c.rms_eps, 1e-6, 0);
    ASSERT_EQ(c.bos_id, 0);
    ASSERT_EQ(c.eos_id, 1);
    ASSERT_EQ(c.tie_embeddings, 0);
    ASSERT_NEAR(c.softmax_scale, 1.0 / sqrt(48.0), 1e-15);

    /* null group counts: no group-limited routing. */
    ASSERT_MSG(parse_mod(min, "{\"n_group\":null,\"topk_group\":null}", NULL, &c, &err) == 0, "%s",
               err.msg);
    ASSERT_EQ(c.n_group, 1);
    ASSERT_EQ(c.topk_group, 1);
}

TEST(llama_optional_keys_default_like_transformers)
{
    const char *min = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":512,"
                      "\"intermediate_size\":1024,\"num_attention_heads\":8,"
                      "\"num_hidden_layers\":2,\"vocab_size\":300}";
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, min, PATH, &err) == 0, "%s", err.msg);
    ASSERT_STR_EQ(c.model_type, "llama");
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.head_dim, 64);
    ASSERT_EQ(c.max_pos, 2048);
    ASSERT_NEAR(c.rms_eps, 1e-6, 0);
    ASSERT_EQ(c.bos_id, 1);
    ASSERT_EQ(c.n_eos, 1);
    ASSERT_EQ(c.eos_id, 2);
    ASSERT_EQ(c.tie_embeddings, 0);
    ASSERT_EQ(c.attention_bias, 0);
    ASSERT_EQ(c.mlp_bias, 0);
    ASSERT_EQ(c.rope.type, SD_ROPE_DEFAULT);
    ASSERT_NEAR(c.rope.theta, 10000.0, 0);
    ASSERT_EQ(c.rope.rot_dim, 64);

    ASSERT_MSG(parse_mod(min,
                         "{\"attention_bias\":true,\"mlp_bias\":1,\"tie_word_embeddings\":true}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_EQ(c.attention_bias, 1);
    ASSERT_EQ(c.mlp_bias, 1);
    ASSERT_EQ(c.tie_embeddings, 1);

    /* An integral float where an integer belongs is read as the integer. */
    ASSERT_MSG(parse_mod(min, "{\"max_position_embeddings\":4096.0}", NULL, &c, &err) == 0, "%s",
               err.msg);
    ASSERT_EQ(c.max_pos, 4096);
}

TEST(kimi_k2_config_is_the_deepseek_v3_architecture)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, KIMI_K2, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_DEEPSEEK_V3);
    ASSERT_STR_EQ(c.arch_name, "DeepseekV3ForCausalLM");
    ASSERT_STR_EQ(c.model_type, "kimi_k2");
    ASSERT_EQ(c.vocab_size, 163840);
    ASSERT_EQ(c.num_heads, 64);
    ASSERT_EQ(c.num_kv_heads, 64);
    ASSERT_EQ(c.head_dim, 192);
    ASSERT_EQ(c.n_routed_experts, 384);
    ASSERT_EQ(c.n_group, 1);
    ASSERT_EQ(c.topk_group, 1);
    ASSERT_NEAR(c.routed_scaling_factor, 2.827, 0);
    ASSERT_EQ(c.bos_id, 163584);
    ASSERT_EQ(c.eos_id, 163585);
    ASSERT_EQ(c.fp8, 1);
    ASSERT_EQ(c.fp8_block[0], 128);
    ASSERT_EQ(c.fp8_block[1], 128);
    ASSERT_EQ(c.rope.type, SD_ROPE_YARN);
    ASSERT_NEAR(c.rope.theta, 50000.0, 0);
    ASSERT_NEAR(c.rope.factor, 32.0, 0);
    ASSERT_NEAR(c.rope.beta_fast, 1.0, 0);
    ASSERT_NEAR(c.rope.beta_slow, 1.0, 0);
    ASSERT_EQ(c.rope.original_max_pos, 4096);
    ASSERT_EQ(c.rope.interleave, 1);
    ASSERT_EQ(c.rope.rot_dim, 64);
    ASSERT_EQ(c.num_nextn_predict_layers, 0);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 0), 0);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 1), 1);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 60), 1);
    ASSERT_EQ(sd_model_cfg_layer_is_moe(&c, 61), 0); /* no MTP layer */
    double m = mscale(32.0, 1.0);
    ASSERT_NEAR(c.softmax_scale, m * m / sqrt(192.0), 1e-15);
    ASSERT_NEAR(c.rope_attn_factor, 1.0, 0);

    /* Without "architectures", model_type alone picks the architecture. */
    ASSERT_MSG(parse_mod(KIMI_K2, NULL, "architectures", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_DEEPSEEK_V3);
    ASSERT_STR_EQ(c.arch_name, "DeepseekV3ForCausalLM");
}

TEST(mistral_is_llama_with_its_name_kept)
{
    const char *m = "{\"architectures\":[\"MistralForCausalLM\"],\"model_type\":\"mistral\","
                    "\"hidden_size\":4096,\"intermediate_size\":14336,"
                    "\"max_position_embeddings\":32768,\"num_attention_heads\":32,"
                    "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
                    "\"rope_theta\":10000.0,\"sliding_window\":4096,\"vocab_size\":32000}";
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(sd_model_cfg_parse(&c, m, PATH, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_LLAMA);
    ASSERT_STR_EQ(c.arch_name, "MistralForCausalLM");
    ASSERT_STR_EQ(c.model_type, "mistral");
    ASSERT_EQ(c.sliding_window, 4096);
    ASSERT_MSG(parse_mod(m, "{\"sliding_window\":null}", NULL, &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.sliding_window, 0);
    /* LlamaForCausalLM with model_type mistral is fine too. */
    ASSERT_MSG(parse_mod(m, "{\"architectures\":[\"LlamaForCausalLM\"]}", NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_STR_EQ(c.model_type, "mistral");
}

/* ---- RoPE scaling and the attention scales it implies ---- */

TEST(yarn_mscale_and_mscale_all_dim_set_both_attention_scales)
{
    sd_model_cfg c;
    sd_err err = {0};
    /* DeepSeek-V3: mscale = mscale_all_dim = 1, factor 40. cos/sin stay
     * unscaled; q.k gets mscale(40, 1)^2 on top of 1/sqrt(qk head dim). */
    ASSERT_MSG(sd_model_cfg_parse(&c, DSV3, PATH, &err) == 0, "%s", err.msg);
    ASSERT_NEAR(c.rope.factor, 40.0, 0);
    ASSERT_NEAR(c.rope.mscale, 1.0, 0);
    ASSERT_NEAR(c.rope.mscale_all_dim, 1.0, 0);
    ASSERT_NEAR(c.rope.beta_fast, 32.0, 0);
    ASSERT_NEAR(c.rope.beta_slow, 1.0, 0);
    ASSERT_EQ(c.rope.original_max_pos, 4096);
    ASSERT_NEAR(c.rope_attn_factor, 1.0, 1e-15);
    double m = mscale(40.0, 1.0);
    ASSERT_NEAR(c.softmax_scale, m * m / sqrt(48.0), 1e-15);

    /* DeepSeek-V2-Lite style 0.707/0.707: ratio 1, softmax uses 0.707. */
    ASSERT_MSG(parse_mod(DSV3,
                         "{\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,"
                         "\"mscale_all_dim\":0.707,\"original_max_position_embeddings\":4096}}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    m = mscale(40.0, 0.707);
    ASSERT_NEAR(c.softmax_scale, m * m / sqrt(48.0), 1e-15);
    ASSERT_NEAR(c.rope_attn_factor, 1.0, 1e-15);

    /* Unequal: cos/sin carry mscale(f, mscale) / mscale(f, mscale_all_dim). */
    ASSERT_MSG(parse_mod(DSV3,
                         "{\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,"
                         "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096}}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_NEAR(c.rope_attn_factor, mscale(40, 0.707) / mscale(40, 1.0), 1e-15);
    ASSERT_NEAR(c.rope_attn_factor, 0.921042, 1e-6);

    /* Llama-style yarn without mscale keys: cos/sin get mscale(f), q.k
     * keeps 1/sqrt(head_dim). */
    ASSERT_MSG(parse_mod(LLAMA31,
                         "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                         "\"original_max_position_embeddings\":32768}}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_EQ(c.rope.type, SD_ROPE_YARN);
    ASSERT_NEAR(c.rope_attn_factor, 0.1 * log(4.0) + 1.0, 1e-15);
    ASSERT_NEAR(c.softmax_scale, 1.0 / sqrt(128.0), 1e-15);
    ASSERT_NEAR(c.rope.mscale_all_dim, 0.0, 0);

    /* An explicit attention_factor wins. */
    ASSERT_MSG(parse_mod(LLAMA31,
                         "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                         "\"attention_factor\":1.25,\"original_max_position_embeddings\":32768}}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_NEAR(c.rope_attn_factor, 1.25, 0);
    ASSERT_NEAR(c.rope.attention_factor, 1.25, 0);

    /* No factor: max_position_embeddings / original_max_position_embeddings. */
    ASSERT_MSG(parse_mod(LLAMA31,
                         "{\"rope_scaling\":{\"rope_type\":\"yarn\","
                         "\"original_max_position_embeddings\":32768}}",
                         NULL, &c, &err) == 0,
               "%s", err.msg);
    ASSERT_NEAR(c.rope.factor, 4.0, 0);

    /* linear */
    ASSERT_MSG(parse_mod(LLAMA31, "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}", NULL, &c,
                         &err) == 0,
               "%s", err.msg);
    ASSERT_EQ(c.rope.type, SD_ROPE_LINEAR);
    ASSERT_NEAR(c.rope.factor, 2.0, 0);
    ASSERT_NEAR(c.rope_attn_factor, 1.0, 0);
}

/* ---- bad configs: one clear error each ---- */

TEST(missing_required_key_names_file_and_key)
{
    struct {
        const char *base, *del;
    } cases[] = {
        {LLAMA31, "vocab_size"},
        {LLAMA31, "hidden_size"},
        {LLAMA31, "intermediate_size"},
        {LLAMA31, "num_hidden_layers"},
        {LLAMA31, "num_attention_heads"},
        {LLAMA31, "rope_scaling.low_freq_factor"},
        {LLAMA31, "rope_scaling.factor"},
        {LLAMA31, "rope_scaling.original_max_position_embeddings"},
        {DSV3, "kv_lora_rank"},
        {DSV3, "qk_nope_head_dim"},
        {DSV3, "qk_rope_head_dim"},
        {DSV3, "v_head_dim"},
        {DSV3, "moe_intermediate_size"},
        {QWEN3, "num_hidden_layers"},
        {KIMI_K2, "quantization_config.quant_method"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_model_cfg c;
        sd_err err = {0};
        int rc = parse_mod(cases[i].base, NULL, cases[i].del, &c, &err);
        ASSERT_MSG(rc == SD_ENOENT, "deleting %s: rc %d (%s)", cases[i].del, rc, err.msg);
        char want[256];
        snprintf(want, sizeof want, PATH ": key \"%s\" is missing", cases[i].del);
        ASSERT_STR_EQ(err.msg, want);
    }
    /* A required key set to null is missing too. */
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_EQ(parse_mod(QWEN3, "{\"hidden_size\":null}", NULL, &c, &err), SD_ENOENT);
    ASSERT_STR_EQ(err.msg, PATH ": key \"hidden_size\" is missing");
    /* yarn needs a factor or an original length to derive it from. */
    ASSERT_EQ(parse_mod(DSV3, "{\"rope_scaling\":{\"type\":\"yarn\"}}", NULL, &c, &err), SD_ENOENT);
    ASSERT_STR_EQ(err.msg, PATH ": key \"rope_scaling.factor\" is missing");
    /* Neither architectures nor model_type. */
    ASSERT_EQ(parse_mod(LLAMA31, "{\"model_type\":null}", "architectures", &c, &err), SD_ENOENT);
    ASSERT_CONTAINS(err.msg, PATH ": key \"architectures\" is missing");
}

TEST(unsupported_architecture_names_file_and_architecture)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_EQ(parse_mod(QWEN3, "{\"architectures\":[\"Gemma3ForCausalLM\"]}", NULL, &c, &err),
              SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, PATH ": architecture \"Gemma3ForCausalLM\" is not supported");
    ASSERT_CONTAINS(err.msg, "Qwen3MoeForCausalLM");
    ASSERT_CONTAINS(err.msg, "DeepseekV3ForCausalLM");

    ASSERT_EQ(parse_mod(QWEN3, "{\"model_type\":\"qwen2\"}", NULL, &c, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, PATH ": model_type \"qwen2\" is not supported with architecture "
                                  "\"Qwen3ForCausalLM\"");

    ASSERT_EQ(parse_mod(QWEN3, "{\"model_type\":\"gemma3\"}", "architectures", &c, &err),
              SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, PATH ": model_type \"gemma3\" is not supported");

    /* Recognized architectures with features this engine does not model. */
    struct {
        const char *base, *patch, *msg;
    } cases[] = {
        {LLAMA31, "{\"hidden_act\":\"gelu\"}", "key \"hidden_act\" = \"gelu\" is not supported"},
        {DSV3, "{\"topk_method\":\"greedy\"}", "key \"topk_method\" = \"greedy\" is not supported"},
        {DSV3, "{\"scoring_func\":\"sqrtsoftplus\"}",
         "key \"scoring_func\" = \"sqrtsoftplus\" is not supported"},
        {QWEN3, "{\"use_sliding_window\":true}", "key \"use_sliding_window\" = true"},
        {LLAMA31, "{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4}}",
         "key \"quantization_config.quant_method\" = \"awq\" is not supported"},
        {KIMI_K2,
         "{\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\","
         "\"weight_block_size\":[128,128]}}",
         "key \"quantization_config.fmt\" = \"e5m2\" is not supported (e4m3 is)"},
        {KIMI_K2,
         "{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\","
         "\"weight_block_size\":[128,128]}}",
         "key \"quantization_config.activation_scheme\" = \"static\" is not supported"},
        {KIMI_K2, "{\"quantization_config\":{\"quant_method\":\"fp8\"}}",
         "quantization_config has no \"weight_block_size\": only block-scaled fp8 is supported"},
        {LLAMA31, "{\"partial_rotary_factor\":0.5}", "key \"partial_rotary_factor\" = 0.5"},
        {LLAMA31,
         "{\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"},"
         "\"sliding_attention\":{\"rope_type\":\"default\"}}}",
         "per-layer-type RoPE parameters are not supported"},
        {LLAMA31,
         "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":32.0,\"truncate\":false,"
         "\"original_max_position_embeddings\":4096}}",
         "key \"rope_scaling.truncate\" = false is not supported"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        int rc = parse_mod(cases[i].base, cases[i].patch, NULL, &c, &err);
        ASSERT_MSG(rc == SD_ENOTSUP, "case %zu: rc %d (%s)", i, rc, err.msg);
        ASSERT_CONTAINS(err.msg, PATH ": ");
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
}

TEST(unknown_rope_type_is_named)
{
    sd_model_cfg c;
    sd_err err = {0};
    const char *types[] = {"longrope", "dynamic", "su", "ntk-whatever"};
    for (size_t i = 0; i < SD_ARRAY_LEN(types); i++) {
        char patch[256];
        snprintf(patch, sizeof patch, "{\"rope_scaling\":{\"rope_type\":\"%s\",\"factor\":2.0}}",
                 types[i]);
        ASSERT_EQ(parse_mod(LLAMA31, patch, NULL, &c, &err), SD_ENOTSUP);
        char want[256];
        snprintf(want, sizeof want,
                 PATH ": rope type \"%s\" (key \"rope_scaling.rope_type\") is not supported",
                 types[i]);
        ASSERT_CONTAINS(err.msg, want);
    }
    /* 5.x layout names its own dict. */
    ASSERT_EQ(
        parse_mod(LLAMA31_V5, "{\"rope_parameters\":{\"rope_type\":\"longrope\"}}", NULL, &c, &err),
        SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "\"longrope\" (key \"rope_parameters.rope_type\")");
}

TEST(wrong_types_name_file_key_and_type)
{
    struct {
        const char *base, *patch, *msg;
    } cases[] = {
        {LLAMA31, "{\"num_attention_heads\":\"32\"}",
         "key \"num_attention_heads\" must be an integer, not a string"},
        {LLAMA31, "{\"hidden_size\":4096.5}", "key \"hidden_size\" must be an integer, not a real"},
        {LLAMA31, "{\"tie_word_embeddings\":\"yes\"}",
         "key \"tie_word_embeddings\" must be true or false, not a string"},
        {LLAMA31, "{\"rope_scaling\":5}", "key \"rope_scaling\" must be an object, not an integer"},
        {LLAMA31, "{\"rope_theta\":\"1e4\"}", "key \"rope_theta\" must be a number, not a string"},
        {LLAMA31,
         "{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":\"8\","
         "\"low_freq_factor\":1,\"high_freq_factor\":4,"
         "\"original_max_position_embeddings\":8192}}",
         "key \"rope_scaling.factor\" must be a number, not a string"},
        {LLAMA31, "{\"eos_token_id\":\"2\"}", "key \"eos_token_id\" must be an integer or a list"},
        {LLAMA31, "{\"eos_token_id\":[1,\"2\"]}", "key \"eos_token_id\"[1] must be"},
        {LLAMA31, "{\"architectures\":\"LlamaForCausalLM\"}",
         "key \"architectures\" must be a non-empty array of strings"},
        {LLAMA31, "{\"model_type\":7}", "key \"model_type\" must be a string, not an integer"},
        {DSV3, "{\"q_lora_rank\":[1536]}", "key \"q_lora_rank\" must be an integer, not an array"},
        {KIMI_K2, "{\"quantization_config\":\"fp8\"}",
         "key \"quantization_config\" must be an object, not a string"},
        {KIMI_K2, "{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128]}}",
         "key \"quantization_config.weight_block_size\" must be an array of two integers"},
        {KIMI_K2,
         "{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,\"x\"]}}",
         "key \"quantization_config.weight_block_size[1]\" must be an integer, not a string"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_model_cfg c;
        sd_err err = {0};
        int rc = parse_mod(cases[i].base, cases[i].patch, NULL, &c, &err);
        ASSERT_MSG(rc == SD_EFORMAT, "case %zu: rc %d (%s)", i, rc, err.msg);
        ASSERT_CONTAINS(err.msg, PATH ": ");
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
}

TEST(values_out_of_range_name_the_key)
{
    struct {
        const char *base, *patch, *msg;
    } cases[] = {
        {LLAMA31, "{\"num_key_value_heads\":5}",
         "key \"num_key_value_heads\" = 5 does not divide num_attention_heads = 32"},
        {LLAMA31, "{\"num_key_value_heads\":64}",
         "key \"num_key_value_heads\" = 64 is out of range"},
        {LLAMA31, "{\"hidden_size\":0}", "key \"hidden_size\" = 0 is out of range"},
        {LLAMA31, "{\"vocab_size\":-3}", "key \"vocab_size\" = -3 is out of range"},
        {LLAMA31, "{\"rms_norm_eps\":0}", "key \"rms_norm_eps\" must be positive"},
        {LLAMA31, "{\"rope_theta\":-1}", "key \"rope_theta\" must be positive"},
        {LLAMA31, "{\"head_dim\":65}", "key \"head_dim\" = 65 must be even"},
        {LLAMA31, "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "key \"eos_token_id\" lists 9 ids"},
        {DSV3, "{\"n_group\":3}", "key \"n_group\" = 3 does not divide n_routed_experts = 16"},
        {KIMI_K2, "{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[0,128]}}",
         "key \"quantization_config.weight_block_size[0]\" = 0 is out of range"},
        {DSV3, "{\"topk_group\":5}", "key \"topk_group\" = 5 is out of range"},
        {DSV3, "{\"num_experts_per_tok\":17}", "key \"num_experts_per_tok\" = 17 is out of range"},
        {DSV3, "{\"qk_rope_head_dim\":15}", "key \"qk_rope_head_dim\" = 15 must be even"},
        {DSV3, "{\"rope_scaling\":{\"type\":\"yarn\",\"factor\":-2}}",
         "key \"rope_scaling.factor\" must be positive"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_model_cfg c;
        sd_err err = {0};
        int rc = parse_mod(cases[i].base, cases[i].patch, NULL, &c, &err);
        ASSERT_MSG(rc == SD_ERANGE, "case %zu: rc %d (%s)", i, rc, err.msg);
        ASSERT_CONTAINS(err.msg, PATH ": ");
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
}

TEST(malformed_json_names_file_and_place)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_EQ(sd_model_cfg_parse(&c, "{\"hidden_size\": 4096,\n \"vocab_size\": }", PATH, &err),
              SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, PATH ": malformed JSON (line 2");
    ASSERT_EQ(sd_model_cfg_parse(&c, "[1,2]", PATH, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, PATH ": top level is not a JSON object");
    ASSERT_EQ(sd_model_cfg_parse(&c, "", PATH, &err), SD_EFORMAT);
}

/* ---- real configs, as published ---- */

static int load_real(const char *name, sd_model_cfg *c, sd_err *err)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/core/configs/%s", sd_test_srcdir(), name);
    return sd_model_cfg_load(c, dir, err);
}

TEST(real_llama_3_2_1b_config_parses)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(load_real("llama-3.2-1b", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_LLAMA);
    ASSERT_EQ(c.vocab_size, 128256);
    ASSERT_EQ(c.hidden_size, 2048);
    ASSERT_EQ(c.intermediate_size, 8192);
    ASSERT_EQ(c.num_layers, 16);
    ASSERT_EQ(c.num_heads, 32);
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.head_dim, 64);
    ASSERT_EQ(c.tie_embeddings, 1);
    ASSERT_EQ(c.max_pos, 131072);
    ASSERT_NEAR(c.rms_eps, 1e-5, 0);
    ASSERT_EQ(c.bos_id, 128000);
    ASSERT_EQ(c.eos_id, 128001);
    ASSERT_EQ(c.rope.type, SD_ROPE_LLAMA3);
    ASSERT_NEAR(c.rope.theta, 500000.0, 0);
    ASSERT_NEAR(c.rope.factor, 32.0, 0);
    ASSERT_NEAR(c.rope.low_freq_factor, 1.0, 0);
    ASSERT_NEAR(c.rope.high_freq_factor, 4.0, 0);
    ASSERT_EQ(c.rope.original_max_pos, 8192);
    ASSERT_EQ(c.rope.rot_dim, 64);
    ASSERT_EQ(c.rope.interleave, 0);
}

TEST(real_qwen3_8b_config_parses)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(load_real("qwen3-8b", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_QWEN3);
    ASSERT_EQ(c.vocab_size, 151936);
    ASSERT_EQ(c.hidden_size, 4096);
    ASSERT_EQ(c.intermediate_size, 12288);
    ASSERT_EQ(c.num_layers, 36);
    ASSERT_EQ(c.num_heads, 32);
    ASSERT_EQ(c.num_kv_heads, 8);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.max_pos, 40960);
    ASSERT_EQ(c.tie_embeddings, 0);
    ASSERT_EQ(c.qk_norm, 1);
    ASSERT_EQ(c.bos_id, 151643);
    ASSERT_EQ(c.eos_id, 151645);
    ASSERT_EQ(c.rope.type, SD_ROPE_DEFAULT);
    ASSERT_NEAR(c.rope.theta, 1e6, 0);
    ASSERT_EQ(c.sliding_window, 0);
}

/* Qwen2 / Qwen2.5 run as Llama's layer with q/k/v biases: the config has no
 * attention_bias key (HF's Qwen2Attention always has them), and its
 * sliding_window means nothing while use_sliding_window is false. */
TEST(real_qwen2_5_7b_config_parses_as_llama_with_biases)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(load_real("qwen2.5-7b-instruct", &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.arch, SD_ARCH_LLAMA);
    ASSERT_STR_EQ(c.arch_name, "Qwen2ForCausalLM");
    ASSERT_STR_EQ(c.model_type, "qwen2");
    ASSERT_EQ(c.vocab_size, 152064);
    ASSERT_EQ(c.hidden_size, 3584);
    ASSERT_EQ(c.num_layers, 28);
    ASSERT_EQ(c.num_heads, 28);
    ASSERT_EQ(c.num_kv_heads, 4);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT_EQ(c.max_pos, 32768);
    ASSERT_EQ(c.attention_bias, 1);
    ASSERT_EQ(c.qk_norm, 0);
    ASSERT_EQ(c.sliding_window, 0);
    ASSERT_EQ(c.eos_id, 151645);
    ASSERT_NEAR(c.rope.theta, 1e6, 0);
    const char *m = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"qwen2\","
                    "\"hidden_size\":64,\"intermediate_size\":128,\"num_attention_heads\":4,"
                    "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"vocab_size\":300}";
    ASSERT_MSG(parse_mod(m, "{\"use_sliding_window\":true}", NULL, &c, &err) != 0, "a window was taken");
    ASSERT_CONTAINS(err.msg, "use_sliding_window");
    /* an explicit attention_bias false is read as written */
    ASSERT_MSG(parse_mod(m, "{\"attention_bias\":false}", NULL, &c, &err) == 0, "%s", err.msg);
    ASSERT_EQ(c.attention_bias, 0);
}

static void check_deepseek_v3(const sd_model_cfg *c)
{
    ASSERT_EQ(c->arch, SD_ARCH_DEEPSEEK_V3);
    ASSERT_STR_EQ(c->model_type, "deepseek_v3");
    ASSERT_EQ(c->vocab_size, 129280);
    ASSERT_EQ(c->hidden_size, 7168);
    ASSERT_EQ(c->intermediate_size, 18432);
    ASSERT_EQ(c->num_layers, 61);
    ASSERT_EQ(c->num_heads, 128);
    ASSERT_EQ(c->num_kv_heads, 128);
    ASSERT_EQ(c->head_dim, 192);
    ASSERT_EQ(c->q_lora_rank, 1536);
    ASSERT_EQ(c->kv_lora_rank, 512);
    ASSERT_EQ(c->qk_nope_head_dim, 128);
    ASSERT_EQ(c->qk_rope_head_dim, 64);
    ASSERT_EQ(c->v_head_dim, 128);
    ASSERT_EQ(c->n_routed_experts, 256);
    ASSERT_EQ(c->n_shared_experts, 1);
    ASSERT_EQ(c->num_experts_per_tok, 8);
    ASSERT_EQ(c->moe_intermediate_size, 2048);
    ASSERT_EQ(c->first_k_dense_replace, 3);
    ASSERT_EQ(c->moe_layer_freq, 1);
    ASSERT_EQ(c->n_group, 8);
    ASSERT_EQ(c->topk_group, 4);
    ASSERT_EQ(c->norm_topk_prob, 1);
    ASSERT_NEAR(c->routed_scaling_factor, 2.5, 0);
    ASSERT_EQ(c->scoring_sigmoid, 1);
    ASSERT_EQ(c->num_nextn_predict_layers, 1);
    ASSERT_EQ(c->fp8, 1);
    ASSERT_EQ(c->fp8_block[0], 128);
    ASSERT_EQ(c->fp8_block[1], 128);
    ASSERT_EQ(c->max_pos, 163840);
    ASSERT_EQ(c->bos_id, 0);
    ASSERT_EQ(c->eos_id, 1);
    ASSERT_EQ(c->rope.type, SD_ROPE_YARN);
    ASSERT_NEAR(c->rope.theta, 10000.0, 0);
    ASSERT_NEAR(c->rope.factor, 40.0, 0);
    ASSERT_EQ(c->rope.original_max_pos, 4096);
    ASSERT_EQ(c->rope.rot_dim, 64);
    ASSERT_EQ(c->rope.interleave, 1);
    ASSERT_NEAR(c->rope_attn_factor, 1.0, 1e-15);
    /* 192^-0.5 * (0.1 ln 40 + 1)^2 */
    ASSERT_NEAR(c->softmax_scale, 0.1352338, 1e-7);
    for (int l = 0; l < 3; l++)
        ASSERT_EQ(sd_model_cfg_layer_is_moe(c, l), 0);
    for (int l = 3; l <= 61; l++) /* 61: the MTP layer */
        ASSERT_EQ(sd_model_cfg_layer_is_moe(c, l), 1);
}

TEST(real_deepseek_v3_config_parses)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_MSG(load_real("deepseek-v3", &c, &err) == 0, "%s", err.msg);
    check_deepseek_v3(&c);
    if (sd_test_failed_)
        return;

    /* Re-serialized by transformers 4.57: rope_type + type, an explicit
     * rope_interleave, and head_dim 64 (the rope dim) that must not leak. */
    sd_model_cfg r;
    ASSERT_MSG(load_real("deepseek-r1-resaved", &r, &err) == 0, "%s", err.msg);
    check_deepseek_v3(&r);
    if (sd_test_failed_)
        return;
    ASSERT(rope_equal(&c.rope, &r.rope));
    ASSERT_NEAR(c.softmax_scale, r.softmax_scale, 0);
}

TEST(missing_config_file_names_its_path)
{
    sd_model_cfg c;
    sd_err err = {0};
    ASSERT_NE(sd_model_cfg_load(&c, "/nonexistent-model-dir", &err), 0);
    ASSERT_CONTAINS(err.msg, "/nonexistent-model-dir/config.json");
}

TEST_MAIN(T(llama31_parses_with_llama3_rope_and_eos_list),
          T(rope_scaling_and_rope_parameters_layouts_give_the_same_rope),
          T(qwen3_moe_parses_its_sparse_blocks), T(mixtral_parses_its_sparse_blocks), T(deepseek_v2_lite_routes_by_a_plain_softmax_top_k), T(qwen3_keeps_explicit_head_dim_and_defaults_it_to_128),
          T(deepseek_v3_with_and_without_q_lora),
          T(deepseek_optional_keys_default_like_transformers),
          T(llama_optional_keys_default_like_transformers),
          T(kimi_k2_config_is_the_deepseek_v3_architecture), T(mistral_is_llama_with_its_name_kept),
          T(yarn_mscale_and_mscale_all_dim_set_both_attention_scales),
          T(missing_required_key_names_file_and_key),
          T(unsupported_architecture_names_file_and_architecture), T(unknown_rope_type_is_named),
          T(wrong_types_name_file_key_and_type), T(values_out_of_range_name_the_key),
          T(malformed_json_names_file_and_place), T(real_llama_3_2_1b_config_parses),
          T(real_qwen3_8b_config_parses), T(real_qwen2_5_7b_config_parses_as_llama_with_biases),
          T(real_deepseek_v3_config_parses),
          T(missing_config_file_names_its_path))

/* core/hfconfig: a Hugging Face config.json, read into one flat struct.
 *
 * Supported architectures: LlamaForCausalLM (also Mistral-style GQA),
 * Qwen3ForCausalLM (q/k RMSNorm), DeepseekV3ForCausalLM (MLA + MoE + MTP;
 * Kimi-K2 configs are the same architecture). RoPE parameters come from either
 * layout in the wild: `rope_theta` + `rope_scaling` at the top level (4.x-era
 * checkpoints) or `rope_parameters` (transformers 5.x). Every missing required
 * key, wrong type or unsupported value is an error naming the file and key.
 * This module only reads: it never allocates weights. */
#ifndef SD_CORE_HFCONFIG_H
#define SD_CORE_HFCONFIG_H

#include "core/err.h"

typedef enum sd_arch { SD_ARCH_LLAMA = 0, SD_ARCH_QWEN3, SD_ARCH_DEEPSEEK_V3 } sd_arch;

typedef enum sd_rope_type {
    SD_ROPE_DEFAULT = 0,
    SD_ROPE_LINEAR, /* positions divided by factor */
    SD_ROPE_LLAMA3, /* factor, low/high_freq_factor, original_max_position_embeddings */
    SD_ROPE_YARN,   /* factor, beta_fast/slow, mscale, mscale_all_dim, original_max_... */
} sd_rope_type;

typedef struct sd_rope_cfg {
    sd_rope_type type;
    double theta;  /* base */
    double factor; /* scaling factor (1 when none) */
    int original_max_pos;
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;              /* yarn (defaults 32, 1) */
    double mscale, mscale_all_dim;            /* yarn (defaults 1, 0) */
    double attention_factor;                  /* yarn: explicit attention_factor, 0 if absent */
    int interleave; /* 1: rotate (x[2i], x[2i+1]) pairs (DeepSeek rope_interleave);
                       0: rotate (x[i], x[i+d/2]) halves (Llama/Qwen, HF rotate_half) */
    int rot_dim;    /* dimensions rotated per head (head_dim, or qk_rope_head_dim for MLA) */
} sd_rope_cfg;

typedef struct sd_model_cfg {
    sd_arch arch;
    char arch_name[64]; /* as in "architectures" */
    char model_type[64];
    int vocab_size;
    int hidden_size;
    int intermediate_size; /* dense MLP */
    int num_layers;        /* num_hidden_layers (MTP layers not counted) */
    int num_heads;
    int num_kv_heads; /* GQA; MLA: = num_heads */
    int head_dim;     /* Llama: explicit or hidden/heads; Qwen3: explicit or 128;
                         MLA: qk_nope_head_dim + qk_rope_head_dim (the q.k length) */
    double rms_eps;
    int max_pos; /* max_position_embeddings */
    int tie_embeddings;
    int attention_bias; /* q/k/v/o biases (Llama attention_bias) */
    int mlp_bias;
    int bos_id, eos_id; /* -1 when absent; eos_id is the first of a list */
    int eos_ids[8];
    int n_eos;
    sd_rope_cfg rope;
    /* Qwen3 */
    int qk_norm;
    /* DeepSeek-V3 MLA */
    int q_lora_rank; /* 0: no q LoRA (q_proj directly) */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* MoE: DeepSeek-V3's, and Qwen3-MoE's (softmax top-k, no shared or groups) */
    int n_routed_experts; /* 0: dense model */
    int n_shared_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int first_k_dense_replace;
    int moe_layer_freq;
    int moe_sparse_step; /* Qwen3-MoE's decoder_sparse_step (0: DeepSeek's layer rule) */
    int moe_mixtral_names; /* block_sparse_moe.{gate, experts.E.w1 / w3 / w2} for mlp.{gate,
                            * experts.E.gate_proj / up_proj / down_proj} */
    int n_group, topk_group;
    int norm_topk_prob;
    double routed_scaling_factor;
    int scoring_sigmoid; /* scoring_func: 1 sigmoid, 0 softmax */
    int route_bias;      /* e_score_correction_bias steers the choice (V3's noaux_tc) */
    int num_nextn_predict_layers;
    /* quantization_config of block-scaled fp8 weights: E4M3 tensors, each
     * with "<name>_scale_inv" of one F32 scale a fp8_block[0] x fp8_block[1]
     * block; dequantized at load (core/safetensors.h sd_st_fp8_blocks) */
    int fp8;
    int fp8_block[2];
    /* Derived here so every consumer scales attention alike. */
    double rope_attn_factor; /* multiplies cos and sin (HF attention_factor): yarn's
                                explicit attention_factor, else mscale(f, mscale) /
                                mscale(f, mscale_all_dim) when both are set, else
                                mscale(f); 1 for the other rope types */
    double softmax_scale;    /* multiplies q.k: 1/sqrt(head_dim); MLA with scaled rope
                                and mscale_all_dim: times mscale(f, mscale_all_dim)^2,
                                where mscale(f, m) = 0.1 m ln(f) + 1 for f > 1, else 1 */
    int sliding_window;      /* Mistral sliding_window in tokens; 0: full attention */
} sd_model_cfg;

/* Reads DIR/config.json. */
int sd_model_cfg_load(sd_model_cfg *cfg, const char *dir, sd_err *err);
/* Parses config text; path is used in messages only. */
int sd_model_cfg_parse(sd_model_cfg *cfg, const char *json_text, const char *path, sd_err *err);
/* 1 if layer i (0-based, i < num_layers, or the MTP layer i = num_layers) uses MoE. */
int sd_model_cfg_layer_is_moe(const sd_model_cfg *cfg, int layer);

#endif

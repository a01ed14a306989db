/* target: the model definitions, written once against kernels/ops.h.
 *
 * One decoder-layer type covers the architectures: attention is GQA (Llama,
 * Qwen3 with q/k norms, EAGLE-3's 2x-wide input) or MLA (DeepSeek-V3, run in
 * the absorbed form over the latent cache); the FFN is dense SwiGLU or
 * DeepSeek-V3 MoE (routed + shared experts). A model is the embedding, the
 * layers, the final norm and the head; DeepSeek-V3's MTP layer is an extra
 * decoder layer with its own norms and projection (sd_model_mtp_forward).
 *
 * The forward pass reads its inputs from backend memory (tokens, positions,
 * slots, block tables) and writes logits and hidden states there: it never
 * synchronizes and never allocates (the workspace is reserved up front). */
#ifndef SD_TARGET_MODEL_H
#define SD_TARGET_MODEL_H

#include "comm/comm.h"
#include "core/err.h"
#include "core/hfconfig.h"
#include "kernels/ops.h"

typedef struct sd_model sd_model;

/* One forward step. Every pointer is backend memory. */
typedef struct sd_fwd {
    sd_attn_batch ab;      /* positions, sequences, slots, block tables */
    const int32_t *tokens; /* (T) */
    int n_out;
    const int32_t *out_rows; /* (n_out) token rows whose logits are wanted */
    float *logits;           /* (n_out, vocab) or NULL */
    float *hidden;           /* (T, D): final-normed hidden of every token, or NULL */
    float *aux;              /* (T, n_aux * D): output of the aux layers (EAGLE-3), or NULL */
    const float *in_hidden;  /* (T, D): MTP input hidden (sd_model_mtp_forward) */
    float *out_hidden;       /* (T, D): MTP output hidden before the head's norm, or NULL */
} sd_fwd;

typedef struct sd_model_opts {
    int max_tokens; /* most tokens in one step (workspace size) */
    int load_mtp;   /* load the MTP layer when the checkpoint has one */
    /* Tensor parallelism: this model is rank tp_rank of tp_size (0 or 1: the
     * whole model) and comm joins the ranks. Each rank loads its shard:
     * attention heads (query heads split; GQA kv heads split, or replicated
     * when tp is a multiple of them; MLA's latent replicated), the dense FFN's
     * and every expert's inner dimension, and the vocabulary (embedding and
     * head rows, ceil(vocab / tp) per rank). Every rank must then run the
     * same steps with the same inputs and the same outputs asked for: the
     * forward pass calls collectives on comm. Every rank gets full outputs. */
    int tp_rank, tp_size;
    sd_comm *comm;
    /* Expert parallel MoE: each rank holds n_routed_experts / tp whole
     * experts instead of a slice of every expert (shared experts stay sliced). */
    int ep;
    /* MoE shared experts as always-on slots of the expert bank (one slot of
     * moe_intermediate_size per shared expert, weight 1), so the expert
     * kernels run them with the routed ones instead of a dense MLP after
     * them. Not with ep. The same sums up to their order. */
    int moe_shared_slots;
    /* Block-scaled FP8 checkpoints: 1 keeps the weights that load whole, by
     * whole blocks of rows, or stacked from parts that start blocks, as FP8
     * where the backend takes them (weight_fp8: the same numbers at half
     * the bytes); 0 dequantizes every one to BF16 as it loads. Derived
     * weights (MLA's absorbed ones) and column shards are BF16 either way. */
    int fp8_keep;
} sd_model_opts;

int sd_model_load(sd_model **out, const char *dir, sd_backend *be, const sd_model_opts *o,
                  sd_err *err);
void sd_model_free(sd_model *m);
const sd_model_cfg *sd_model_cfg_of(const sd_model *m);
int sd_model_has_mtp(const sd_model *m);
/* weights placed as FP8 (sd_model_opts.fp8_keep) */
int sd_model_fp8_kept(const sd_model *m);
/* bytes of the weights this model (rank) placed on its backend: the
 * checkpoint's, BF16 where FP8 was dequantized, and the derived ones */
size_t sd_model_weight_bytes(const sd_model *m);
/* 1 when the routed experts are split whole over the ranks (--ep) */
int sd_model_expert_parallel(const sd_model *m);
sd_backend *sd_model_backend(const sd_model *m);
/* The checkpoint folder the model was loaded from. */
const char *sd_model_dir(const sd_model *m);
/* Tensor-parallel ranks of the model (1 when unsharded) and this one's rank. */
int sd_model_tp_size(const sd_model *m);
int sd_model_tp_rank(const sd_model *m);
/* The token embedding (EAGLE-3 heads share the target's). */
const sd_weight *sd_model_embed(const sd_model *m);
/* Bytes of the forward workspace (activations). */
size_t sd_model_workspace_bytes(const sd_model *m);

/* Allocates the KV cache for n_slots token positions (target layers and,
 * if loaded, the MTP layer). Bytes per slot: sd_model_kv_bytes_per_slot. */
int sd_model_alloc_kv(sd_model *m, int n_slots, sd_err *err);
size_t sd_model_kv_bytes_per_slot(const sd_model *m);

/* EAGLE-3: capture the outputs of these layers (SGLang's
 * eagle_aux_hidden_state_layer_ids) into fwd.aux, concatenated in order. */
int sd_model_set_aux_layers(sd_model *m, const int *layers, int n, sd_err *err);

int sd_model_forward(sd_model *m, const sd_fwd *f, sd_err *err);
int sd_model_mtp_forward(sd_model *m, const sd_fwd *f, sd_err *err);

#endif

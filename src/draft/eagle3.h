/* draft/eagle3: an EAGLE-3 draft head in the layout published heads use
 * (LlamaForCausalLMEagle3, as SGLang and vLLM load them):
 *   fc [H, 3*D]: fuses the target's low/mid/high hidden states (the outputs
 *     of the layers eagle_config.eagle_aux_hidden_state_layer_ids);
 *   midlayer: one Llama decoder layer whose q/k/v take 2H inputs,
 *     x = [input_layernorm(embed(token)), hidden_norm(hidden)], residual = hidden;
 *   norm, lm_head [draft_vocab, H] over a reduced vocabulary, d2t mapping a
 *     draft id to the target id draft_id + d2t[draft_id].
 * Slot i takes token x_{i+1} with hidden fc(aux_i) (first step) or the
 * previous step's output (chain), at rotary position i; its KV cache uses the
 * target's slot mapping. The embedding is the target's. */
#ifndef SD_DRAFT_EAGLE3_H
#define SD_DRAFT_EAGLE3_H

#include "core/err.h"
#include "target/model.h"

typedef struct sd_eagle3 sd_eagle3;

int sd_eagle3_load(sd_eagle3 **out, const char *dir, sd_backend *be, const sd_model *target,
                   int max_tokens, sd_err *err);
void sd_eagle3_free(sd_eagle3 *h);
/* The target layers whose outputs feed fc (low, mid, high). */
int sd_eagle3_aux_layers(const sd_eagle3 *h, int *ids);
int sd_eagle3_draft_vocab(const sd_eagle3 *h);
int sd_eagle3_hidden(const sd_eagle3 *h);
/* Host map draft id -> target id. */
const int32_t *sd_eagle3_d2t(const sd_eagle3 *h);
int sd_eagle3_alloc_kv(sd_eagle3 *h, int n_slots, sd_err *err);
size_t sd_eagle3_kv_bytes_per_slot(const sd_eagle3 *h);
size_t sd_eagle3_workspace_bytes(const sd_eagle3 *h);
/* One step over f->ab / f->tokens. first: f->in_hidden holds the aux states
 * (T, 3*D) and goes through fc; else it holds the head's hidden (T, H).
 * Writes f->out_hidden (T, H) and f->logits (n_out, draft_vocab). */
int sd_eagle3_forward(sd_eagle3 *h, const sd_fwd *f, int first, sd_err *err);

#endif

/* target/rope: rotary frequencies for every RoPE variant of the supported
 * configs (default, linear, llama3, yarn), computed as HF transformers does. */
#ifndef SD_TARGET_ROPE_H
#define SD_TARGET_ROPE_H

#include "core/err.h"
#include "core/hfconfig.h"

/* *inv: malloc'd rot_dim/2 inverse frequencies. max_pos: max_position_embeddings
 * (yarn with original_max_position_embeddings uses their ratio as the factor).
 * The cos/sin factor and the softmax scale are derived in core/hfconfig
 * (rope_attn_factor, softmax_scale). */
int sd_rope_inv_freq(const sd_rope_cfg *r, int max_pos, float **inv, sd_err *err);

#endif

/* target/rope: rotary frequencies for every RoPE variant of the supported
 * configs (default, linear, llama3, yarn), computed as HF transformers does. */
#ifndef SD_TARGET_ROPE_H
#define SD_TARGET_ROPE_H

#include "core/err.h"
#include "core/hfconfig.h"

/* *inv (malloc'd, rot_dim/2 floats) and the factor cos/sin are multiplied by
 * (yarn's attention factor; 1 otherwise). max_pos: max_position_embeddings. */
int sd_rope_inv_freq(const sd_rope_cfg *r, int max_pos, float **inv, float *mscale, sd_err *err);
/* DeepSeek-V3 multiplies its softmax scale by yarn_get_mscale(factor,
 * mscale_all_dim)^2 when mscale_all_dim is set; 1 otherwise. */
double sd_rope_softmax_mscale(const sd_rope_cfg *r);

#endif

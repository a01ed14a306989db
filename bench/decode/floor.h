/* bench/decode/floor: the bytes one decode step must read, from a
 * checkpoint's config.json and safetensors headers, and the bandwidth floor
 * they imply.
 *
 * What a plain decode step of B sequences (B tokens) reads:
 *   - every weight of the main model in full (attention, dense MLPs, norms,
 *     MoE routers, shared experts, the final norm, lm_head), except
 *   - the token embedding: only the B rows looked up (the whole table when
 *     the head is tied to it: the head reads it all);
 *   - routed experts: each MoE layer reads the distinct experts its B tokens
 *     pick; with uniform routing of top_k distinct experts of E per token the
 *     expected count is E * (1 - (1 - top_k / E)^B);
 *   - not the MTP layer (layer index >= num_hidden_layers): plain decode does
 *     not run it.
 * The KV cache is reported apart (kv_per_token: bytes per token of context
 * over all layers for a cache of kv_elem_bytes per element), since its
 * element type is the engine's choice, not the checkpoint's. */
#ifndef SD_BENCH_DECODE_FLOOR_H
#define SD_BENCH_DECODE_FLOOR_H

#include "core/err.h"

typedef struct sd_decode_bytes {
    double total;        /* every tensor in the checkpoint */
    double dense;        /* read in full by every step (embedding excluded) */
    double embed_row;    /* one token-embedding row; 0 when the head is tied (counted in dense) */
    double routed;       /* every routed expert of the main model's MoE layers */
    double mtp;          /* tensors of layers >= num_hidden_layers (not read) */
    int n_experts;       /* routed experts per MoE layer (0: dense model) */
    int top_k;           /* experts per token */
    int n_moe_layers;    /* main-model layers holding routed experts */
    double kv_per_token; /* KV cache bytes per token of context, all layers */
} sd_decode_bytes;

/* Reads DIR/config.json and the headers of DIR's safetensors. kv_elem_bytes:
 * bytes per element of the engine's KV cache (4 for fp32). */
int sd_decode_bytes_load(sd_decode_bytes *b, const char *dir, int kv_elem_bytes, sd_err *err);

/* Expected distinct experts picked by `tokens` tokens, each routing to top_k
 * distinct experts of n uniformly at random: n * (1 - (1 - top_k / n)^tokens). */
double sd_decode_expected_experts(int n, int top_k, int tokens);

/* Bytes of weights one plain decode step of `tokens` tokens reads (see above). */
double sd_decode_step_bytes(const sd_decode_bytes *b, int tokens);

#endif

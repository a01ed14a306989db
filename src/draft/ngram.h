/* draft/ngram: n-gram prompt lookup (no model). Finds the most recent
 * earlier occurrence of the last n tokens (n from max_n down to 1) in the
 * request's tokens and proposes the tokens that followed it.
 * The engine calls sd_ngram_propose (src/engine/spec.c): keep its contract. */
#ifndef SD_DRAFT_NGRAM_H
#define SD_DRAFT_NGRAM_H

#include <stdint.h>

/* Proposes up to k tokens into out; returns how many (0 when no match). */
int sd_ngram_propose(const int32_t *tok, int n_tok, int max_n, int k, int32_t *out);

#endif

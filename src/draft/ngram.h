/* draft/ngram: n-gram prompt lookup (no model). Finds the most recent
 * earlier occurrence of the last n tokens (n from max_n down to min_n) in the
 * request's tokens (prompt + output) and proposes the tokens that followed it.
 * The engine calls sd_ngram_propose (src/engine/spec.c): keep its contract.
 *
 * An occurrence ends at e (tokens [e - n, e)) with 1 <= e <= n_tok - 1, so at
 * least one token follows it. The proposal is tok[e], tok[e + 1], ... and, past
 * the end of the history, continues with its own first tokens: the history
 * extended by the proposal is read as the continuation, so a loop of period
 * n_tok - e keeps being predicted (x y x y -> x y x y ...). With a match, the
 * proposal always has k tokens.
 *
 * Two forms with the same results: sd_ngram_propose rescans the history
 * (O(n_tok * max_n) per call); sd_ngram (an index per sequence, a hash table
 * of every n-gram's most recent end) answers in O(max_n^2 + k) and costs
 * O(max_n) per appended token. Neither allocates per lookup; the index owns no
 * copy of the tokens: the caller passes its append-only history each time. */
#ifndef SD_DRAFT_NGRAM_H
#define SD_DRAFT_NGRAM_H

#include <stdint.h>

#include "core/err.h"

#define SD_NGRAM_MAX_N 16

/* Proposes up to k tokens into out (k,); returns how many (0 when no match).
 * min_n is 1. */
int sd_ngram_propose(const int32_t *tok, int n_tok, int max_n, int k, int32_t *out);

typedef struct sd_ngram sd_ngram;

/* 1 <= min_n <= max_n <= SD_NGRAM_MAX_N. */
int sd_ngram_create(sd_ngram **out, int min_n, int max_n, sd_err *err);
void sd_ngram_destroy(sd_ngram *g);
/* Forgets every token (a sequence's history was replaced). */
void sd_ngram_reset(sd_ngram *g);
/* Indexes tok[indexed, n_tok): the history must be what it was at the previous
 * call plus new tokens; a history shorter than what was indexed is re-indexed
 * from scratch. 0, or SD_ENOMEM (the index stays valid for what it held) or
 * SD_ERANGE (n_tok past 2^27 tokens). */
int sd_ngram_update(sd_ngram *g, const int32_t *tok, int n_tok, sd_err *err);
/* Proposes up to k tokens into out for the history tok (n_tok,), which must be
 * the one indexed last (sd_ngram_update(g, tok, n_tok) first). Returns how
 * many (0: no match), or SD_ESTATE if n_tok is not what was indexed.
 * *match_n (if set) gets the length of the matched n-gram, 0 without a match. */
int sd_ngram_lookup(const sd_ngram *g, const int32_t *tok, int n_tok, int k, int32_t *out,
                    int *match_n);
/* Tokens indexed so far. */
int sd_ngram_indexed(const sd_ngram *g);

#endif

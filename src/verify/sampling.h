/* verify/sampling: the target distribution after temperature/top-k/top-p, a
 * counter-based RNG, and inverse-CDF sampling.
 *
 * Owns: the definition of "the distribution a request samples from" that both
 * plain decode and speculative verification use (invariant 1 of DESIGN.md),
 * and the uniform numbers they draw. Everything here is a pure function of its
 * arguments: no state, no allocation, no globals, so a request's seed gives the
 * same tokens whatever else is in the batch and in whatever order rows are
 * processed. The RNG is integer arithmetic only, so a GPU kernel can compute
 * the very same numbers. */
#ifndef SD_VERIFY_SAMPLING_H
#define SD_VERIFY_SAMPLING_H

#include <math.h>
#include <stdint.h>

typedef struct sd_sampling {
    float temperature; /* <= 0: greedy (one-hot at the argmax, lowest id on ties) */
    float top_p;       /* keep the smallest set with mass >= top_p; >= 1: off; <= 0: keep 1 */
    int top_k;         /* keep the k most likely tokens; <= 0 or >= vocab: off */
    uint64_t seed;     /* the request's seed, input of sd_rand_uniform */
} sd_sampling;

/* Greedy decoding: a temperature that is not > 0, or so small that 1/T overflows. */
static inline int sd_sampling_is_greedy(const sd_sampling *s)
{
    return s && (!(s->temperature > 0.0f) || !(1.0f / s->temperature < INFINITY));
}

/* Streams of sd_rand_uniform: one per purpose, so the uniforms that decide one
 * output position are independent of each other. The counter is the output
 * position (0-based index of the token among the request's generated tokens). */
enum {
    SD_RNG_TARGET = 0,   /* a sample straight from the target distribution (plain
                            decode, bonus token, deterministic-draft verification) */
    SD_RNG_ACCEPT = 1,   /* the acceptance test of a sampled draft */
    SD_RNG_RESIDUAL = 2, /* the corrected token after a rejection */
    SD_RNG_DRAFT = 3,    /* the proposer's own sample of a draft token */
};

/* Target distribution of one row of logits (vocab,) -> probs (vocab,):
 * softmax(logits / T); then keep the top_k most likely tokens; then, of those
 * (renormalized), the smallest set whose mass >= top_p; renormalize; zeros
 * elsewhere. Order for top-k/top-p: probability descending, token id ascending
 * on ties. NaN logits count as -inf; if some logits are +inf, they share the
 * mass; if no logit is above -inf, the result is one-hot at sd_argmax(logits).
 * s == NULL means T = 1 with no truncation. O(vocab) with top-k/top-p: a radix
 * select on the bits of the probabilities (no sort, no allocation, 24 KiB of
 * stack); vocabularies of <= 256 tokens are heapsorted instead. probs may not
 * alias logits. */
void sd_sampling_probs(const float *logits, int vocab, const sd_sampling *s, float *probs);

/* Uniform double in [0, 1) with 53 random bits, a hash of (seed, counter,
 * stream): splitmix64's finalizer applied three times, each round folding in one
 * input. Integer math only; see sampling.c for the exact recipe. */
double sd_rand_uniform(uint64_t seed, uint64_t counter, uint32_t stream);

/* Inverse-CDF sample of the distribution proportional to probs (vocab,):
 * the first token whose cumulative mass exceeds u * sum(probs). probs need not
 * sum to 1; tokens with probability <= 0 are never returned. If every entry is
 * <= 0, returns sd_argmax(probs, vocab). u in [0, 1). */
int32_t sd_sample(const float *probs, int vocab, double u);

/* Index of the largest element, the lowest index on ties; NaN is skipped;
 * 0 when every element is NaN or n <= 0. */
int32_t sd_argmax(const float *x, int n);

/* OpenAI's logits processors on one row of logits (vocab,), in place: each
 * bias[i] added to the logit of bias_ids[i] (ids outside the vocabulary are
 * skipped); presence taken off the logit of each token whose count is > 0,
 * frequency times its count (counts: NULL, or (vocab,) times each token
 * was generated). */
void sd_logits_process(float *logits, int vocab, const int32_t *bias_ids, const float *bias,
                       int n_bias, float presence, float frequency, const int32_t *counts);

/* The log-softmax of one row of logits (vocab,) at token tok, into *lp; and
 * its top (>= 0) likeliest tokens, most likely first, the lower id first on
 * ties, into top_ids / top_lps (top entries each; fewer where vocab is
 * smaller). NaN logits count as -inf. Returns the count written to top_ids. */
int sd_logprobs_row(const float *logits, int vocab, int32_t tok, int top, float *lp,
                    int32_t *top_ids, float *top_lps);

#endif

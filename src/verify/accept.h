/* verify/accept: lossless acceptance of a chain of k draft tokens for ONE
 * sequence (the engine loops over the batch), and acceptance statistics.
 *
 * Owns the rule that keeps speculation lossless (invariant 1 of DESIGN.md):
 * greedy verification compares with the target's argmax; sampled verification
 * is rejection sampling against the target distribution, so the tokens emitted
 * are distributed exactly as plain sampling from the target. Pure functions of
 * their arguments: no allocation, no state, no globals.
 *
 * Random numbers: sd_rand_uniform(seed, pos + i, stream) decides output
 * position pos + i (see sampling.h for the streams). A proposer that samples
 * its drafts must draw d_i from q_i independently of the ACCEPT/RESIDUAL/TARGET
 * streams, e.g. d_i = sd_sample(q_i, vocab, sd_rand_uniform(seed, pos + i,
 * SD_RNG_DRAFT)). */
#ifndef SD_VERIFY_ACCEPT_H
#define SD_VERIFY_ACCEPT_H

#include <stdint.h>

#include "core/err.h"
#include "verify/sampling.h"

/* Verifies draft[0..k-1] against the target and writes the n + 1 tokens to
 * append to out (room for k + 1): the n accepted drafts, then the corrected
 * token (first rejection) or the bonus token (all accepted). Returns n
 * (0 <= n <= k), or SD_EINVAL (bad k, vocab or draft id; err names it).
 *
 *   s      the request's sampling parameters; s->temperature <= 0 is greedy.
 *   draft  (k,) draft tokens; draft[i] is proposed for output position pos + i.
 *   p      (k + 1, vocab) target probabilities through sd_sampling_probs(s):
 *          row i is the distribution of position pos + i given the prefix and
 *          draft[0..i-1]; row k is the bonus row.
 *   q      (k, vocab) the draft distributions the drafts were sampled from,
 *          through the same sd_sampling_probs(s); NULL for a deterministic
 *          proposer (n-gram, greedy draft): q_i is one-hot at draft[i] and is
 *          never materialized.
 *   pos    output position of draft[0]: the RNG counter.
 *
 * Greedy: accept while draft[i] == argmax p_i; the next token is argmax of the
 * first mismatching row, or argmax p_k (bonus) when all match. q is unused.
 *
 * Sampling with q: accept draft[i] with probability min(1, p_i(d)/q_i(d))
 * (uniform of stream ACCEPT); on rejection sample normalize(max(0, p_i - q_i))
 * (stream RESIDUAL; p_i itself if that residual is all zero); if all k pass,
 * sample the bonus from p_k (stream TARGET).
 *
 * Sampling with q == NULL: x_i = sd_sample(p_i, u of stream TARGET at pos + i);
 * accept while x_i == draft[i], and x_i is the corrected token at the first
 * mismatch. This IS the rule above for a one-hot q (accepted with probability
 * p_i(d), else a sample of p_i with d removed), and every emitted token equals
 * what plain decode with the same seed emits at that position, whatever k and
 * whatever the drafts: deterministic proposers keep seeded outputs identical. */
int sd_accept_chain(const sd_sampling *s, int vocab, int k, const int32_t *draft, const float *p,
                    const float *q, uint64_t pos, int32_t *out, sd_err *err);

/* Greedy verification when only the target's argmax per row is at hand
 * (target_argmax: (k + 1,)): accept while draft[i] == target_argmax[i]; out gets
 * the n accepted drafts then target_argmax[n]. Returns n. */
int sd_accept_greedy(int k, const int32_t *draft, const int32_t *target_argmax, int32_t *out);

/* ---- statistics ---------------------------------------------------------------- */

#define SD_ACCEPT_POSITIONS 16

/* Counters of verify steps. Position i counts drafts at chain index i
 * (0-based); positions >= SD_ACCEPT_POSITIONS count only in the totals. */
typedef struct sd_accept_stats {
    uint64_t steps;    /* verify steps */
    uint64_t drafted;  /* draft tokens proposed */
    uint64_t accepted; /* draft tokens accepted */
    uint64_t emitted;  /* tokens emitted: accepted + one corrected/bonus per step */
    uint64_t proposed_at[SD_ACCEPT_POSITIONS];
    uint64_t accepted_at[SD_ACCEPT_POSITIONS];
} sd_accept_stats;

/* Adds one verify step that proposed k drafts and accepted n (0 <= n <= k). */
void sd_accept_stats_add(sd_accept_stats *st, int k, int n);
/* dst += src */
void sd_accept_stats_merge(sd_accept_stats *dst, const sd_accept_stats *src);
/* Mean tokens emitted per verify step (bonus included): emitted / steps; 0 with no step. */
double sd_accept_stats_mean_len(const sd_accept_stats *st);
/* Share of the steps that proposed a draft at chain index i in which it was
 * accepted (so were all before it): accepted_at[i] / proposed_at[i]; 0 if none.
 * The rate conditional on reaching index i is rate_at(i) / rate_at(i - 1)
 * when k is the same every step. */
double sd_accept_stats_rate_at(const sd_accept_stats *st, int i);

#endif

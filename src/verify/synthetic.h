/* verify/synthetic: benchmark-only synthetic acceptance.
 *
 * Random weights accept (almost) no draft, so the speedup of speculation at
 * real model sizes cannot be measured with them. In this mode the engine does
 * not compare the drafts with the target at all: draft i of a verify step is
 * accepted with a given probability p_i, conditional on drafts 0..i-1 having
 * been accepted (the chain stops at the first rejection), like vLLM's
 * synthetic rejection sampler. The emitted tokens are the accepted drafts
 * followed by the target's own token at the first rejected position, so the
 * target and the proposer do exactly the work of a real verify step with that
 * outcome. THE OUTPUT IS THEN NOT THE MODEL'S: benchmarks only.
 *
 * Probabilities are given per draft position, "P1,P2,...": p_i = P_{i+1} for
 * i < m and P_m for every later position. They are CONDITIONAL rates; the
 * unconditional rate at position i that acceptance statistics report
 * (sd_accept_stats_rate_at) is p_0 * ... * p_i.
 *
 * Random numbers: sd_rand_uniform(seed, counter + i, SD_RNG_ACCEPT) decides
 * draft i (counter: the output position of draft 0), so a request's outcome
 * depends only on its seed and positions, never on the batch. Pure functions,
 * no allocation, no globals. */
#ifndef SD_VERIFY_SYNTHETIC_H
#define SD_VERIFY_SYNTHETIC_H

#include <stdint.h>

#include "core/err.h"

#define SD_SYNTHETIC_MAX 16

typedef struct sd_synthetic {
    int n;                       /* values given; 0: synthetic acceptance is off */
    double p[SD_SYNTHETIC_MAX];  /* conditional acceptance of draft position i */
} sd_synthetic;

/* Parses "P1,P2,..." (each in [0, 1], at most SD_SYNTHETIC_MAX, spaces
 * allowed around values). NULL or "" (or only spaces) turns the mode off
 * (s->n = 0). Errors (SD_EINVAL) name --synthetic-accept and the value at
 * fault; s is then off. */
int sd_synthetic_parse(sd_synthetic *s, const char *text, sd_err *err);

/* The acceptance probability of draft position i (0-based), conditional on
 * the earlier ones; 0 when the mode is off. */
double sd_synthetic_p(const sd_synthetic *s, int i);

/* How many of k drafts are accepted (0..k): the first i with
 * sd_rand_uniform(seed, counter + i, SD_RNG_ACCEPT) >= p_i, else k. counter is
 * the output position of draft 0. 0 when k <= 0 or the mode is off. */
int sd_synthetic_accept(const sd_synthetic *s, int k, uint64_t seed, uint64_t counter);

/* Expected tokens emitted per verify step with k drafts (the bonus or
 * corrected token included): 1 + sum_{i<k} p_0 * ... * p_i. */
double sd_synthetic_mean_len(const sd_synthetic *s, int k);

#endif

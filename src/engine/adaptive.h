/* engine/adaptive: the draft length k that maximises tokens per second.
 *
 * Per step, with b running requests, drafting k tokens each costs
 *   target(b (k + 1)) + draft(k)
 * and yields 1 + sum_{j<=k} P(the first j drafts accepted) tokens each.
 * target(T) is a measured cost curve over a step's token rows, one for each
 * batch bucket (powers of two: a step's attention reads each request's
 * context, so rows of more requests cost more), draft(k) one over k for
 * each bucket of drafting requests (its passes run over their rows), and
 * the acceptance comes from the engine-wide per-position counts.
 *
 * The curves are made to survive what real steps look like:
 *   - a shape's first steps carry one-off costs (an eager pass that makes
 *     GEMM plans, a graph capture): each point of a curve keeps its last
 *     SD_CURVE_RING times and answers with a low order statistic of them
 *     (the least up to 4 times, the 3rd smallest of 8: not a noisy
 *     machine's luckiest step), and a point is trusted only from its
 *     third time on;
 *   - the machine changes under a long run (other processes, clocks, the
 *     context growing): a point keeps the step of its last time; read with
 *     a point whose time falls below its own as x grows, a point more than
 *     SD_CURVE_STALE steps older is left out, a point seen again after that
 *     long starts over (trusted if it was), and one untouched for
 *     SD_CURVE_FRESH steps is trusted no more (measured again);
 *   - a GPU's step time is flat in T up to where the GEMMs stop being
 *     memory-bound, a CPU's grows with T from the start: no global shape is
 *     assumed; between measured points the curve is linear, beyond them it
 *     continues with the slope of the nearest segment;
 *   - the slope cannot be learnt from one size: until the costs of k = 0
 *     and 1 at the running batch are measured (a trusted point at their row
 *     bucket, or on both sides of it), k alternates between 1 and 0, so the
 *     target is seen at b and 2 b rows and drafting at 1; again whenever the
 *     batch leaves what was measured (a choice at 32 requests is not made
 *     from steps of 8; a smaller batch's curve prices it only where that
 *     rises in proportion to its rows over its whole range, a CPU's).
 *     Deeper k are measured once chosen, and the
 *     neighbours of the choice by a probe every 4th step, so a k = k_max
 *     step (k_max + 1 times the rows) is never spent only to measure it;
 *   - with fewer than SD_ADAPT_EXPLORE first-position drafts (counting at
 *     most 4 a drafting step: one step's drafts share their place in the
 *     requests), a 0 becomes 1
 *     while drafting would pay at an acceptance the drafts so far cannot
 *     rule out (two standard deviations above the estimate) and at the
 *     drafting phase's least time (a GPU's draft phase of a few hundred us
 *     moves by 2x between steps; with one point measured, flat in k): the
 *     cheapest probe keeps the evidence coming
 *     until it settles the question, which at poor acceptance takes a few
 *     drafts, not SD_ADAPT_EXPLORE of them.
 * Prompt steps are another cost curve (long rows, no graphs): the engine
 * does not report them. */
#ifndef SD_ENGINE_ADAPTIVE_H
#define SD_ENGINE_ADAPTIVE_H

#include <stdint.h>
#include <stdio.h>

#include "verify/accept.h"

/* first-position drafts before adaptive k may choose not to draft */
#define SD_ADAPT_EXPLORE 64
/* the default margin (--spec-margin): a k is chosen over a shorter one (k =
 * 0: plain decode) only where it promises 2% more tokens/s, so two costs
 * within the noise of their measurement do not turn speculation on */
#define SD_ADAPT_MARGIN 0.02
#define SD_CURVE_PTS 24
#define SD_CURVE_RING 8
/* a point's times before it is trusted (the first two may be one-off) */
#define SD_CURVE_TRUST 3
/* Steps (the owner's clock, sd_curve.now) after which a point is trusted
 * no more: the machine it measured may have changed; exploration measures
 * it again. No shorter than SD_ADAPT_REFRESH_GAP: an exploration measures
 * what a refresh would, and points aged out sooner would explore where a
 * refresh is not due. */
#define SD_CURVE_FRESH 2048
/* Steps after which a point's times are stale: read together with a
 * point whose times fall below its own as x grows, and whose age differs
 * by more, it is left out (the two measured two machines, not one falling
 * curve); seen again after that long, it starts over from the new time
 * (still trusted if it was). */
#define SD_CURVE_STALE 16
/* Steps between two refreshes a stale draft price starts where the
 * running requests' contexts are where that price was measured (arrivals
 * while others run; a burst after idle too, at a verdict of plain, and so
 * do arrivals where the mean context moved by more than
 * SD_ADAPT_CTX_MOVED of it, or is not known): under a steady stream of
 * arrivals with speculation off the draft price is always stale, and a
 * refresh at each arrival (its tracked arrivals, one draft, a plain step
 * read one at a time and four zeros before speculation goes off again: ~6
 * steps not queued ahead) ran the bundled model on an H200 at 16 requests
 * 25-30% slower a token than plain decode (360 refreshes in 9000 steps;
 * NOTES.md, session 32). At most one in 512 steps there: ~1%; and the
 * decode bench's bursts of 512 tokens, one after another at a verdict of
 * plain, each paid one (sampled batch 32 at 0.993-0.996 of plain; NOTES.md,
 * session 34): one in 2048, ~0.3%, counted from the last refresh or
 * exploration (both measure the two prices). A quarter of the context
 * was too near for "moved": at 16 requests under Poisson arrivals the
 * mean context moved that much every 50-300 steps (17 of 25 refreshes in a
 * trace). */
#define SD_ADAPT_REFRESH_GAP 2048
#define SD_ADAPT_CTX_MOVED 0.5

typedef struct sd_curve_pt {
    int x, n;      /* x, times seen */
    uint64_t used; /* clock of the last time (the stalest point is replaced) */
    uint64_t at;   /* the owner's clock (sd_curve.now) at the last time */
    double t[SD_CURVE_RING];
} sd_curve_pt;

/* a measured cost curve t(x) */
typedef struct sd_curve {
    sd_curve_pt pt[SD_CURVE_PTS];
    int n;
    uint64_t clock;
    uint64_t now; /* the owner's clock (steps), for the points' ages */
    /* The owner's clock when what the points measured changed (0: never;
     * sd_curve_restart): a point measured before starts over at its next
     * time (trusted if it was: deeper k measured at the last burst's start
     * price the next one's start well, and untrusted they had to be found
     * again, which at batch 8 often stopped at k = 1 where k = 4 paid) */
    uint64_t restart;
} sd_curve;

/* the step sizes a curve (and the CUDA graphs) tell apart: the smallest
 * bucket >= T of 1..8, then multiples of 8 to 64, of 16 to 128, of 32 to
 * 256, of 64 beyond */
int sd_row_bucket(int T);

void sd_curve_add(sd_curve *c, int x, double secs);
/* what c's points measured changed at its clock's now (sd_curve.restart) */
void sd_curve_restart(sd_curve *c);
/* t(x) from the curve; 0 with no point. *n_trusted (may be NULL): the
 * trusted points it used (all points when none is trusted yet) */
double sd_curve_at(const sd_curve *c, double x, int *n_trusted);

/* Batch buckets (powers of two) that keep target curves of their own: a
 * step's cost is not its rows' alone. Attention reads each request's
 * context, so 32 rows of 32 requests cost more than 32 rows of 8 at k = 3
 * (the bundled model on an H200: 0.454 against 0.313 ms), and the plain
 * step of 32 read off the curve of the 8's looked 1.5x cheaper than it ran. */
#define SD_ADAPT_BATCHES 12

/* Queued-ahead plain steps a batch bucket keeps with the keys they read:
 * a plain step's time grows with its requests' contexts (the bundled model
 * at batch 32 on an H200: 0.30 ms at 5k keys, 0.345 at 16k), and priced
 * at the last burst's end a new burst's short contexts looked 15% dearer
 * than they ran, so one draft, 0.95-0.97x plain there, was chosen
 * (NOTES.md, session 30). */
#define SD_ADAPT_CTX_RING 256
/* fresh queued-ahead steps of a row count before their keys price it */
#define SD_ADAPT_CTX_MIN 16

typedef struct sd_adapt_ctx {
    double keys[SD_ADAPT_CTX_RING], t[SD_ADAPT_CTX_RING];
    uint64_t at[SD_ADAPT_CTX_RING]; /* the curves' clock (sd_adaptive.steps) */
    int x[SD_ADAPT_CTX_RING];       /* its rows' bucket */
    int n;                          /* steps seen (the ring keeps the last ones) */
    /* the line last fitted (adaptive.c's ctx_price: a pick reads it several
     * times, and fitted at each read the sorts took tens of us of host time
     * a step, 12% of a sampled batch-8 step on an H200; NOTES.md, session
     * 31): of fit_n steps at rows fit_x, good up to the clock fit_until (its
     * oldest time's freshness); fit_ok 0: too few */
    int fit_n, fit_x, fit_ok;
    uint64_t fit_until;
    double fit_slope, fit_level, fit_kmin;
} sd_adapt_ctx;

/* the curves of one batch bucket */
typedef struct sd_adapt_target {
    int batch;     /* its batch bucket (0: unused) */
    uint64_t used; /* the controller's step when last observed (the stalest is reused) */
    sd_curve c;    /* a decode/verify step's time vs its token rows' bucket */
    /* a drafting phase's time vs k (catch-up + first draft, then a pass
     * each), for this bucket's number of drafting requests: its passes are
     * over their rows (the bundled model's MTP at k = 3 on an H200: 0.20 ms
     * for 1 request, 0.32 for 8, 0.57 for 32) */
    sd_curve draft;
    /* plain steps queued ahead (the owner's a->ahead): their time vs rows,
     * from the end of the host's work on the step before to their tokens
     * (what the other curves leave out, the host's part, runs during them) */
    sd_curve ahead;
    /* what queueing ahead would hide of a step read one at a time (its
     * upload and launch, its download: the host's work around it is in
     * no step's time): one point, x = 1 */
    sd_curve hide;
    /* the queued-ahead steps against their keys (plain decode's price at
     * the running requests' keys, sd_adaptive.keys) */
    sd_adapt_ctx ctx;
    /* what drafting ahead hides of a drafting step of this bucket priced
     * as the phase and its verify step timed apart (each waited for): that
     * price less the interval of a step whose drafts stayed on the device
     * (negative where the interval is longer, as on an H100: the host's
     * work on the step before runs in it), x = k. Its points never age (the
     * curve's clock stays 0): it is the host's part of a step, not the
     * device's work, and only drafting steps measure it, so aged out it
     * would be gone whenever speculation was off a while */
    sd_curve dahead;
} sd_adapt_target;

/* Why a step drafted the k it did (sd_adaptive.why for pick_k's; the
 * engine's for the rest): its best price; measuring k = 0 and 1 at a batch
 * not yet measured; measuring again after a refresh; a hope (too few
 * drafts to give up on); a neighbour of the choice measured; the periodic
 * try of one deeper; speculation off but for requests tracking the
 * proposer (a probe); a fixed --spec-k; a cohort's requests drafting
 * while it gathers (sd_adaptive_cohort); the rate asked for served by
 * fewer requests drafting than plain (sd_adaptive_demand_k). */
enum {
    SD_KWHY_BEST = 0,
    SD_KWHY_EXPLORE,
    SD_KWHY_REFRESH,
    SD_KWHY_HOPE,
    SD_KWHY_NEIGHBOUR,
    SD_KWHY_PERIODIC,
    SD_KWHY_PROBE,
    SD_KWHY_FIXED,
    SD_KWHY_COHORT,
    SD_KWHY_DEMAND,
    SD_KWHY_N
};

typedef struct sd_adaptive {
    sd_adapt_target target[SD_ADAPT_BATCHES];
    uint64_t steps;  /* target steps seen */
    uint64_t draft_steps; /* drafting phases seen */
    uint64_t picks;
    int k_max;
    double margin; /* a k is chosen over a shorter one promising 1 + margin times its throughput */
    int exploring; /* the last pick explored */
    int last_k; /* the previous pick (a change is logged at debug level) */
    int why;    /* SD_KWHY_* of the last pick */
    /* set by the owner: with speculation off for all of them, the running
     * requests' plain steps would be queued ahead (launch ahead), so k = 0
     * is priced at a queued-ahead step, not at the step the speculative
     * engine reads one at a time (on the bundled model at batch 32 that
     * was 5-9% dearer, and drafting that tied with the cheaper plain
     * decode kept drafting: NOTES.md, session 15) */
    int ahead;
    /* each batch bucket prices its steps on its own curves, never lent a
     * smaller bucket's that rose in proportion to its rows (a GPU's: its
     * steps run as a graph per batch bucket; EAGLE-3 at c = 32 on an H100,
     * a stream's first prices at 10-12 requests, 10 / 20 / 30 rows in
     * 0.202 / 0.306 / 0.402 ms, were lent to every batch of 17-30 and kept
     * speculation off for ~2000 steps, 1.00x plain where the runs that
     * measured those batches ran 0.72x; NOTES.md, session 51) */
    int own_buckets;
    uint64_t refresh_at; /* sd_adaptive_refresh: steps + 1 then; 0: none pending */
    uint64_t refreshed;  /* steps + 1 at the last sd_adaptive_refresh; 0: none */
    /* the mean context (keys a request) at the last pick, and at the pick
     * before the last drafting phase observed (0: not known) */
    double pick_kpr, draft_kpr;
    /* set by the owner before a pick or an admission: the keys the next
     * plain step would read (its requests' contexts; 0: unknown). With
     * a->ahead, k = 0 is priced at the queued-ahead steps' time at these
     * keys (a line through their times against their keys) where enough
     * were measured */
    double keys;
} sd_adaptive;

void sd_adaptive_init(sd_adaptive *a, int k_max);
/* the batch bucket whose target curve a step of `batch` requests uses */
int sd_adapt_batch_bucket(int batch);
/* a target step of `batch` requests and `tokens` rows took secs */
void sd_adaptive_observe_target(sd_adaptive *a, int batch, int tokens, double secs);
/* a plain step of `batch` requests and `tokens` rows queued ahead took
 * secs (from the step before's tokens to its own), its rows reading `keys`
 * keys */
void sd_adaptive_observe_ahead(sd_adaptive *a, int batch, int tokens, double secs, double keys);
/* a step of `batch` requests read one at a time spent secs where queueing
 * ahead would have hidden them (upload and launch, download) */
void sd_adaptive_observe_hidden(sd_adaptive *a, int batch, double secs);
/* a step of `batch` requests, `drafting` of them with k drafts each that
 * stayed on the device (draft ahead), took secs from the step before's
 * tokens to its own: what drafting ahead hides of that step's price
 * (the drafting phase and its verify step as timed apart), where both are
 * measured, is learnt (sd_adapt_target.dahead) and taken off drafting's
 * price at this batch bucket, at any k (the nearest measured), where
 * plain steps are priced queued ahead (a->ahead: both then priced from
 * one step's tokens to the next's) */
void sd_adaptive_observe_draft_ahead(sd_adaptive *a, int batch, int drafting, int k, double secs);
/* k = 0's time at this batch (the plain step, or with a->ahead the
 * queued-ahead one: at a->keys where enough were measured, else as
 * measured, else the plain step less what queueing ahead hides, never
 * under half of it); 0 before a step of it */
double sd_adaptive_plain_cost(const sd_adaptive *a, int batch);
/* the target curve of this batch's bucket; NULL before a step of it */
const sd_curve *sd_adaptive_target(const sd_adaptive *a, int batch);
/* a drafting phase of n_seqs requests at k took secs */
void sd_adaptive_observe_draft(sd_adaptive *a, int n_seqs, int k, double secs);
/* the k of most tokens per second at this batch (0 = do not draft) */
int sd_adaptive_best_k(const sd_adaptive *a, const sd_accept_stats *acc, int batch);
/* 1 when the costs of k = 0 and 1 at this batch were measured.
 * Otherwise pick_k explores, and best_k's 0 is no reason to stop drafting. */
int sd_adaptive_informed(const sd_adaptive *a, int batch);
/* 1 when the step of one draft each at this batch was last measured more
 * than SD_CURVE_STALE steps ago (its price may be another context's: a
 * burst of arrivals is not turned away from drafting on it), on the curve
 * that prices it: a smaller bucket's where that one is lent (a GPU's
 * tiered steps rose nearly in proportion to their rows, 16 / 24 / 40 rows
 * of EAGLE-3 at c = 32 in 0.217 / 0.308 / 0.497 ms, and a stream's first
 * 48 steps' prices at 11 requests judged every arrival at 17-25 for ~2000
 * steps, never stale by the larger bucket's own curve, which had no point;
 * NOTES.md, session 49; a GPU's curves are no longer lent: own_buckets) */
int sd_adaptive_draft_stale(const sd_adaptive *a, int batch);
/* the prices of drafting and of plain decode may be another context's (a
 * burst of arrivals after a stretch of plain decode: the plain step's price
 * is of the last requests' long contexts, the draft's older still): every
 * curve restarts (sd_curve_restart), and the next picks measure one draft
 * and one plain step before they choose */
void sd_adaptive_refresh(sd_adaptive *a);
/* The admission of an arrival that joins a batch of `joins` requests: 1
 * when it starts with speculation off. drafting: the requests that would
 * draft with it (the running ones still tracking the proposer, it and the
 * arrivals waiting behind it); off_verdict: the controller's last
 * picks turned speculation off (the engine's count of zeros); idle: no
 * request runs (a burst after idle). Off where the verdict stands on
 * measured prices of `drafting` drafting at this batch and best_k still
 * says 0 there: what the pick after its first step would say (asked of
 * every request drafting, a price no step measures while the verdict is
 * plain, each Poisson arrival tracked the proposer for a step, its prompt
 * through the proposer and no step queued ahead: 995 of ~1020 arrivals at
 * c = 64 on the bundled model, an H100; NOTES.md, session 44). Not where
 * the prices may be another context's: after idle, on that verdict or
 * where best_k says 0 at this batch, unless the arrivals' mean context is
 * within SD_ADAPT_CTX_MOVED of the one the draft was priced at and the last
 * refresh is less than SD_ADAPT_REFRESH_GAP steps old (waves of requests
 * of one length each measured their prices again: a bench's repeats, a
 * serving client's bursts; NOTES.md, session 32) (the last burst's prices were of its
 * long contexts, where drafting stopped paying, or one draft's of its end
 * against a plain step of its start, and the next burst was judged on
 * them: the draft LM at batch 32 on an H200 went plain for whole bursts
 * where one draft paid ~20% at their short contexts; NOTES.md, session
 * 27), where one draft's price at this batch is stale (at most once in
 * SD_ADAPT_REFRESH_GAP steps where a->keys / joins is within
 * SD_ADAPT_CTX_MOVED of the context that price was measured at), or while
 * a refresh's measurements are pending: the curves restart
 * (sd_adaptive_refresh) and the next picks measure again. (After idle
 * where drafting still pays, nothing restarts: a request at a time at
 * batch 1 would pay a forced draft and plain step each.) */
int sd_adaptive_admit_off(sd_adaptive *a, const sd_accept_stats *acc, int joins, int drafting,
                          int off_verdict, int idle);
/* The cohort switch. A request admitted with speculation off never drafts
 * (MTP and EAGLE-3 need the target's hidden states of every token it
 * skipped), and an arrival is priced drafting among the plain ones
 * (sd_adaptive_admit_off), which rarely pays: a batch that went plain at
 * one size stayed plain as it grew. Under Poisson arrivals on the bundled
 * model (an H100) the verdict was made at the first burst's 14 requests,
 * where drafting lost by 5%, and kept at the 30 that followed, where a
 * fixed k = 2 ran 0.79-0.91x plain's TPOT (NOTES.md, sessions 44-45).
 * Asked where an arrival would be admitted off: nonzero where every
 * request drafting at `joins` would pay, by its measured prices
 * (SD_COHORT_MEASURED), or where those are not measured, by the hopeful
 * price of sd_adaptive_pick_k's hope with the drafting phase of the
 * nearest smaller bucket's requests where this bucket's was never timed
 * (SD_COHORT_HOPED); the owner then admits arrivals tracking the proposer
 * until they are the batch, drafts on until the batch is drafting's
 * (engine/internal.h's SD_COHORT_SETTLE), and the pick then decides on
 * every request drafting. Only where plain steps are priced queued ahead
 * (a->ahead: a GPU's engine). The owner starts one too where drafting
 * serves the output rate with fewer requests (sd_adaptive_demand_k:
 * SD_COHORT_DEMAND). */
enum { SD_COHORT_MEASURED = 1, SD_COHORT_HOPED = 2, SD_COHORT_DEMAND = 3 };
/* k (may be NULL): the k of that price */
int sd_adaptive_cohort(const sd_adaptive *a, const sd_accept_stats *acc, int joins, int *k);
/* Where a cohort settles and the pick says plain at the running batch:
 * the shallowest k not measured there (its target rows or its drafting
 * phase) that could still pay, so the pick decides on measured prices of
 * the deeper k (0: every k measured, or none could pay). A deeper step
 * costs at least the deepest measured one below it, so where even k_max's
 * tokens at that price do not beat plain decode by the margin nothing is
 * worth measuring. Under Poisson arrivals on the bundled model's MTP (an
 * H100, c = 16) one draft each lost at 12 requests (54.0 tokens a ms
 * against plain's 59.8) and two lost (58.8), while three paid (64.1), and
 * the pick extrapolates one k past the measured ones: cohorts that
 * settled at one or two drafts ended plain at 9-13 requests, and a run's
 * stream went plain for half its steps before a dip to a few requests
 * measured the deeper k (NOTES.md, session 49). */
int sd_adaptive_measure_k(const sd_adaptive *a, const sd_accept_stats *acc, int batch,
                          int drafting);
/* A cohort's settle (every running request tracks the proposer): the
 * pick at the running batch with its measuring steps (explorations,
 * neighbours, refreshes); where it says plain, the deeper k that
 * sd_adaptive_measure_k would measure (*measuring: 1); else -1, the
 * cohort's own k stands. Drafting at the cohort's one k the batch grew
 * past the row tier that k pays below (k = 1 at 15-16 requests, 30-32
 * rows, on an H100), where it then ended plain; and deeper k were never
 * measured at the batches drafting runs at (NOTES.md, sessions 48-49). */
int sd_adaptive_settle_k(sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting,
                         int *measuring);
/* Engine steps from a cohort's end to the next one a step's price starts
 * (not one the output rate starts: sd_adaptive_demand_k). At 16 requests
 * under Poisson arrivals (the bundled model's MTP, an H100) a cohort began
 * where the batch dipped to 7-8, where drafting paid, and ended at the
 * 13-15 it grew back to, where it did not: 31-35 cohorts in 12000 steps,
 * each ~80 steps tracking the proposer and not queued ahead, ran 1.08-1.11x
 * plain's TPOT (NOTES.md, session 45). A gap of SD_COHORT_GAP after each
 * (as often as a stale price is measured again) held off for its 2048
 * steps the second cohort of a stream whose first ended plain at the start
 * (its prices and its rate not yet measured), and the runs that lost it
 * ran ~1.0x plain where the others ran ~0.85x (NOTES.md, session 48): the
 * gap is SD_COHORT_GAP_MIN after a cohort whose verdict held (speculation
 * still on SD_COHORT_HELD steps after its end: two lives of a 128-token
 * request at ~2 tokens a step) and doubles after each whose end turned
 * speculation off sooner, up to SD_COHORT_GAP (the cohorts that flapped
 * ended plain within a few steps). */
#define SD_COHORT_GAP SD_ADAPT_REFRESH_GAP
#define SD_COHORT_GAP_MIN 256
#define SD_COHORT_HELD 256
typedef struct sd_cohort_gap {
    uint64_t gap; /* the next gap (0: SD_COHORT_GAP_MIN) */
    uint64_t end; /* the engine step of the last cohort's end + 1; 0: its verdict is known */
} sd_cohort_gap;
/* a cohort ended at engine step `step`: the step from which the next may start */
uint64_t sd_cohort_gap_end(sd_cohort_gap *g, uint64_t step);
/* at engine step `step`, speculation went off for the running requests
 * (off = 1), or did not while some of them track the proposer (off = 0):
 * within SD_COHORT_HELD steps of a cohort's end a turn off doubles the
 * gap; past them the gap is the least again */
void sd_cohort_gap_verdict(sd_cohort_gap *g, uint64_t step, int off);
/* Under a steady stream of requests a server's output rate is what they
 * ask for, not what a step could give: a policy that serves it with fewer
 * running requests gives each a shorter time per token (Little's law: the
 * time per token is the batch over the rate). Drafting shrinks the batch
 * it runs at, which a step's price at the batch running now does not see:
 * under Poisson arrivals on the bundled model (an H100) every request
 * drafting paid ~20% a step at 20-26 requests and lost 5% at 14; a cohort
 * that drafted took the batch from 39 to ~20, where it dipped to 16, the
 * picks said plain and speculation went off for all, and plain decode
 * grew it back to 30+ (NOTES.md, session 45). Returns the k whose every
 * request drafting serves `demand` tokens a second at the fewest requests,
 * fewer than plain decode's by the margin (0: plain, or prices not
 * measured), priced at measured points only, at batches up to twice
 * `batch`'s bucket (sd_adapt_batch_bucket: one answer for the bucket);
 * b_plain, b_k (may be NULL): the fewest requests plain decode and any k
 * serve it at (0: at no measured batch). A policy serves the
 * demand at b where it does at b and at every measured batch above it
 * (up to the scan's top): a batch that grows past a tier of the step's
 * price where the demand is not served grows on, so a policy that serves
 * it below the tier only runs above it (plain decode on an H100: 22
 * requests in 0.218 ms, 23-26 in 0.291: at ~90 tokens/ms it served 19-22
 * and ran at ~28; NOTES.md, session 46). */
int sd_adaptive_demand_k(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                         int batch, int *b_plain, int *b_k);
/* the same, printing each price the scan reads (where it moves) to trace
 * (bench/adaptive/replay.c) */
int sd_adaptive_demand_trace(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                             int batch, FILE *trace);
/* 1 when the next drafting phase of `drafting` of `batch` requests at k
 * should be timed (the engine waits for its drafts, and times the verify
 * step after it alone): exploring, a refresh pending, or the drafting
 * point at k or the target point of its verify step not trusted. A phase
 * the engine does not wait for (--draft-ahead) runs its verify step during
 * it, and the two times it would give are not the curves' */
int sd_adaptive_wants_times(const sd_adaptive *a, int batch, int drafting, int k);
/* the k for the next step of `batch` requests of which `drafting` draft
 * (the others stopped tracking the proposer: a row and a token each, so a
 * k that pays for the few drafting ones must pay for the whole step):
 * exploration first, then best_k (now and then one deeper, so a proposer
 * that improves is noticed) */
int sd_adaptive_pick_k(sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting);
/* no pick this step (no request tracks the proposer): an exploration the
 * last pick began is over, as no request runs it */
void sd_adaptive_no_pick(sd_adaptive *a);

#endif

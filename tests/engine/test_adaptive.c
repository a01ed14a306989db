/* Adaptive k on simulated machines: measured cost curves that survive
 * one-off costs (a shape's eager first pass, its graph capture), the draft
 * length a GPU-like flat cost curve and a CPU-like linear one should get,
 * and exploration again when the batch grows past what was measured. */
#include "engine/adaptive.h"
#include "test.h"
#include "core/util.h"
#include "engine/internal.h"

TEST(row_buckets_match_the_graph_buckets)
{
    static const int in[] = {1, 7, 8, 9, 16, 17, 64, 65, 128, 129, 256, 257, 321};
    static const int out[] = {1, 7, 8, 16, 16, 24, 64, 80, 128, 160, 256, 320, 384};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        ASSERT_EQ(sd_row_bucket(in[i]), out[i]);
}

TEST(curve_ignores_one_off_costs_and_interpolates)
{
    sd_curve c = {0};
    int used = -1;
    ASSERT_NEAR(sd_curve_at(&c, 8, &used), 0, 0);
    ASSERT_EQ(used, 0);
    /* one point, untrusted: used as it is, in proportion to x */
    sd_curve_add(&c, 8, 0.050);
    ASSERT_NEAR(sd_curve_at(&c, 16, &used), 0.100, 1e-12);
    ASSERT_EQ(used, 1);
    /* the first two times of a shape are one-off (eager + plans, capture) */
    sd_curve_add(&c, 8, 0.040);
    for (int i = 0; i < 3; i++)
        sd_curve_add(&c, 8, 0.001);
    sd_curve_add(&c, 40, 0.100);
    /* x = 40 is not trusted yet: the one trusted point scales */
    ASSERT_NEAR(sd_curve_at(&c, 40, &used), 0.005, 1e-12);
    ASSERT_EQ(used, 1);
    sd_curve_add(&c, 40, 0.090);
    for (int i = 0; i < 3; i++)
        sd_curve_add(&c, 40, 0.002);
    ASSERT_NEAR(sd_curve_at(&c, 8, &used), 0.001, 1e-12);
    ASSERT_EQ(used, 2);
    ASSERT_NEAR(sd_curve_at(&c, 24, NULL), 0.0015, 1e-12);
    /* beyond: the nearest segment's slope; below a segment that rises less
     * than in proportion (a GPU's): the smallest point's time */
    ASSERT_NEAR(sd_curve_at(&c, 72, NULL), 0.003, 1e-12);
    ASSERT_NEAR(sd_curve_at(&c, 4, NULL), 0.001, 1e-12);
    ASSERT_NEAR(sd_curve_at(&c, 1, NULL), 0.001, 1e-12);
    /* below one that rises in proportion (a CPU's, with a fixed part): the
     * segment, never under the time per row */
    sd_curve cpu = {0};
    for (int i = 0; i < 3; i++) {
        sd_curve_add(&cpu, 8, 0.0050);
        sd_curve_add(&cpu, 16, 0.0090);
    }
    ASSERT_NEAR(sd_curve_at(&cpu, 4, NULL), 0.0030, 1e-12);
    ASSERT_NEAR(sd_curve_at(&cpu, 1, NULL), 0.0015, 1e-12);
    /* below a steep segment that is still less than proportional (a GPU's
     * 16 to 24 rows across a kernel switch: 0.241, 0.317 ms): flat, not the
     * segment down to 0.165 at 8 rows */
    sd_curve gpu = {0};
    for (int i = 0; i < 3; i++) {
        sd_curve_add(&gpu, 16, 0.241e-3);
        sd_curve_add(&gpu, 24, 0.317e-3);
    }
    ASSERT_NEAR(sd_curve_at(&gpu, 8, NULL), 0.241e-3, 1e-12);
    /* a point answers with a low order statistic of its last SD_CURVE_RING
     * times (the least up to 4, the 3rd smallest of 8): it follows a slower
     * machine once the fast times are out of the ring */
    for (int i = 0; i < SD_CURVE_RING; i++)
        sd_curve_add(&c, 8, 0.003);
    ASSERT_NEAR(sd_curve_at(&c, 8, NULL), 0.003, 1e-12);
    /* a noisy machine: not its luckiest step */
    static const double noisy[SD_CURVE_RING] = {0.0050, 0.0042, 0.0061, 0.0044,
                                                0.0040, 0.0058, 0.0047, 0.0053};
    for (int i = 0; i < SD_CURVE_RING; i++)
        sd_curve_add(&c, 8, noisy[i]);
    ASSERT_NEAR(sd_curve_at(&c, 8, NULL), 0.0044, 1e-12);
}

/* a simulated machine and proposer */
typedef struct sim {
    double base, knee, per_row;    /* target step: base + per_row * (T - knee)+ */
    double attn;                   /* ... + attn * T * ctx (each row reads its request's context) */
    int ctx;                       /* positions a request (run_ctx: grows with the tokens) */
    double ctx_f;                  /* run_ctx: the mean positions a request, exact */
    /* run_ctx as the engine runs a burst: after SD_SPEC_OFF_AFTER picks of
     * k = 0 that were no exploration (zero_k), speculation is off (off)
     * for the rest of the burst, its steps plain without a pick */
    int engine, zero_k, off;
    int quad;                      /* ... or base + per_row * ((T - knee)+)^2 / 8 */
    double d_base, d_per;          /* drafting: d_base + d_per * k */
    /* as the engine with --draft-ahead: a drafting phase and its verify
     * step are timed only where sd_adaptive_wants_times says so, and
     * every 8th phase (the others: untimed) */
    int timed_only, phases, untimed;
    double p;                      /* each draft accepted with p given the ones before */
    int seen_t[1024], seen_d[32];
    uint64_t rng;
    int zero_picks, one_picks, max_picks;
    double secs, tokens; /* the time its steps took (one-offs left out), the tokens they gave */
} sim;

static double urand(sim *m)
{
    m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(m->rng >> 11) * (1.0 / 9007199254740992.0);
}

static double target_cost(const sim *m, int T)
{
    double x = T > m->knee ? T - m->knee : 0;
    return m->base + m->per_row * (m->quad ? x * x / 8 : x) + m->attn * T * m->ctx;
}

/* n steps at this batch: pick k, draft, verify, accept; with grow, the
 * context (m->ctx: the controller is not told) grows by the tokens a
 * request gets a step, up to grow */
static void run_ctx(sd_adaptive *a, sd_accept_stats *acc, sim *m, int batch, int n, int grow)
{
    for (int s = 0; s < n && (!grow || m->ctx < grow); s++) {
        int k = m->off ? 0 : sd_adaptive_pick_k(a, acc, batch, batch);
        if (m->engine && !m->off) {
            m->zero_k = k == 0 && !a->exploring ? m->zero_k + 1 : 0;
            m->off = m->zero_k == SD_SPEC_OFF_AFTER; /* (as the engine: on reaching it) */
        }
        m->zero_picks += k == 0;
        m->one_picks += k == 1;
        m->max_picks += k == a->k_max;
        int timed = k == 0 || !m->timed_only || m->phases++ % 8 == 7 ||
                    sd_adaptive_wants_times(a, batch, batch, k);
        m->untimed += !timed;
        if (k > 0) {
            double t = m->d_base + m->d_per * k;
            m->secs += t; /* (a shape's one-off costs left out) */
            /* its first two times: an eager pass and a graph capture */
            if (m->seen_d[k]++ < 2)
                t *= 40;
            if (timed)
                sd_adaptive_observe_draft(a, batch, k, t);
        }
        int T = batch * (k + 1);
        double t = target_cost(m, T);
        m->secs += t;
        if (m->seen_t[sd_row_bucket(T)]++ < 1)
            t *= 40; /* an eager first step */
        if (timed)
            sd_adaptive_observe_target(a, batch, T, t);
        int got = 0;
        for (int b = 0; b < batch; b++) {
            int acc_n = 0;
            while (acc_n < k && urand(m) < m->p)
                acc_n++;
            sd_accept_stats_add(acc, k, acc_n);
            got += acc_n + 1;
        }
        m->tokens += got;
        if (grow) {
            m->ctx_f = (m->ctx_f > m->ctx ? m->ctx_f : m->ctx) + (double)got / batch;
            m->ctx = (int)m->ctx_f;
        }
    }
}

static void run(sd_adaptive *a, sd_accept_stats *acc, sim *m, int batch, int n)
{
    run_ctx(a, acc, m, batch, n, 0);
}

/* a fresh controller (k_max 4) and no acceptance counts */
static void fresh(sd_adaptive *a, sd_accept_stats *acc)
{
    sd_adaptive_init(a, 4);
    memset(acc, 0, sizeof *acc);
}

/* a fresh controller (k_max 4) after n steps of m at this batch: 1 when
 * it has measured what it needs there and explores no more */
static int settled(sd_adaptive *a, sd_accept_stats *acc, sim *m, int batch, int n)
{
    fresh(a, acc);
    run(a, acc, m, batch, n);
    return !a->exploring && sd_adaptive_informed(a, batch);
}

static double sim_rate(const sim *m, int batch, int k);

TEST(flat_gpu_cost_drafts_deep_despite_capture_spikes)
{
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 3e-4, .knee = 64, .per_row = 2e-6, .d_base = 5e-5, .d_per = 3e-5, .p = 0.8,
             .rng = 7};
    ASSERT(settled(&a, &acc, &m, 8, 300));
    /* exploration measured k = 0 and 1 */
    ASSERT_GT(m.zero_picks, 2);
    ASSERT_GT(m.one_picks, 2);
    /* 0.8 per position at nearly free verification: as deep as allowed */
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    /* --spec-margin: a k must promise that much over the best shorter one */
    ASSERT_NEAR(a.margin, SD_ADAPT_MARGIN, 0);
    a.margin = 0;
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    a.margin = 0.6 * (sim_rate(&m, 8, 1) / sim_rate(&m, 8, 0) - 1);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 1);
    a.margin = 4 * (sim_rate(&m, 8, 4) / sim_rate(&m, 8, 0) - 1);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 0);
}

/* --draft-ahead: where drafting phases and their verify steps are timed
 * only when adaptive k asks (sd_adaptive_wants_times) and every 8th, it
 * settles on the k it settles on when every one is timed, and most phases
 * go untimed (ahead) */
TEST(drafting_timed_only_where_adaptive_k_asks_settles_the_same)
{
    sd_adaptive a, b;
    sd_accept_stats acc, bcc;
    sim m = {.base = 3e-4, .knee = 64, .per_row = 2e-6, .d_base = 5e-5, .d_per = 3e-5, .p = 0.8,
             .rng = 7};
    sim n = m;
    n.timed_only = 1;
    fresh(&b, &bcc);
    ASSERT(sd_adaptive_wants_times(&b, 8, 8, 1)); /* a fresh controller explores */
    ASSERT(settled(&a, &acc, &m, 8, 400));
    ASSERT(settled(&b, &bcc, &n, 8, 400));
    int ka = sd_adaptive_best_k(&a, &acc, 8), kb = sd_adaptive_best_k(&b, &bcc, 8);
    ASSERT_GE(ka, 3);
    ASSERT_EQ(kb, ka);
    ASSERT_EQ(m.untimed, 0);
    ASSERT_GT(n.untimed, 250);
    ASSERT(!sd_adaptive_wants_times(&b, 8, 8, kb)); /* its points are trusted */
    ASSERT(sd_adaptive_wants_times(&b, 32, 32, kb)); /* another batch's are not there */
    fprintf(stderr, "  k %d either way; %d of 400 steps untimed\n", kb, n.untimed);
}

TEST(the_choice_and_its_neighbours_are_measured_not_interpolated)
{
    sd_adaptive a;
    sd_accept_stats acc;
    /* flat to 24 rows, then ever steeper: exploration measures 8, 16 and 40
     * rows, and a line between them is off at 24 and 32 */
    sim m = {.base = 3e-4, .knee = 24, .per_row = 3e-5, .quad = 1, .d_base = 5e-5, .d_per = 3e-5,
             .p = 0.7, .rng = 23};
    ASSERT(settled(&a, &acc, &m, 8, 400));
    int best = sd_adaptive_best_k(&a, &acc, 8);
    ASSERT_GE(best, 1);
    for (int k = best - 1 > 0 ? best - 1 : 1; k <= best + 1 && k <= 4; k++) {
        int rows = 8 * (k + 1);
        ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 8), rows, NULL), target_cost(&m, rows), 1e-12);
    }
}

TEST(linear_cpu_cost_with_poor_acceptance_does_not_draft)
{
    sd_adaptive a;
    sd_accept_stats acc;
    /* every row costs the same: k drafts cost k + 1 steps for 1 + p + ... tokens */
    sim m = {.base = 0, .knee = 0, .per_row = 5e-4, .d_base = 1e-4, .d_per = 1e-4, .p = 0.45,
             .rng = 11};
    ASSERT(settled(&a, &acc, &m, 4, 300));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 4), 0);
    /* few drafts, but a draft here costs more than even a certain one
     * returns (2 steps' time and more for at most 2 tokens): no probe */
    sd_adaptive c;
    sd_accept_stats acc3;
    sim m3 = m;
    memset(m3.seen_t, 0, sizeof m3.seen_t);
    memset(m3.seen_d, 0, sizeof m3.seen_d);
    ASSERT(settled(&c, &acc3, &m3, 1, 20));
    ASSERT_LT(acc3.proposed_at[0], SD_ADAPT_EXPLORE);
    ASSERT_EQ(sd_adaptive_best_k(&c, &acc3, 1), 0);
    ASSERT_EQ(sd_adaptive_pick_k(&c, &acc3, 1, 1), 0);
    /* with 0.95 a draft it pays even there */
    sd_adaptive b;
    sd_accept_stats acc2;
    sim m2 = {.base = 0, .knee = 0, .per_row = 5e-4, .d_base = 1e-5, .d_per = 1e-5, .p = 0.95,
              .rng = 13};
    m2.base = 2e-3; /* a fixed cost per step as well (launches, sync) */
    ASSERT(settled(&b, &acc2, &m2, 1, 300));
    ASSERT_GE(sd_adaptive_best_k(&b, &acc2, 1), 1);
}

/* A CPU's rows each cost about the same: once batch 1's steps of 1 and 2
 * rows are measured, the curve past them is its own continuation, and a
 * growing batch (a server's requests arriving while prompts prefill) is
 * judged without one-draft steps at every new size (on two cores they
 * cost adaptive MTP 2-10% of a serving level). A flat GPU curve is still
 * explored at each new size (the test after this one). */
TEST(a_proportional_cpu_curve_is_not_explored_again_as_the_batch_grows)
{
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 0, .knee = 0, .per_row = 5e-4, .d_base = 1e-4, .d_per = 1e-4, .p = 0.8,
             .rng = 23};
    ASSERT(settled(&a, &acc, &m, 1, 40));
    ASSERT(sd_adaptive_informed(&a, 4));
    ASSERT(sd_adaptive_informed(&a, 32));
    m.zero_picks = m.one_picks = m.max_picks = 0;
    run(&a, &acc, &m, 8, 50);
    ASSERT_LE(m.one_picks, 2);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 0);
}

TEST(a_larger_batch_is_explored_before_it_is_judged)
{
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 3e-4, .knee = 96, .per_row = 4e-6, .d_base = 5e-5, .d_per = 3e-5, .p = 0.7,
             .rng = 17};
    ASSERT(settled(&a, &acc, &m, 4, 200));
    /* steps of 4 requests say nothing about 32 x (k + 1) rows */
    ASSERT(!sd_adaptive_informed(&a, 32));
    m.zero_picks = m.one_picks = m.max_picks = 0;
    run(&a, &acc, &m, 32, 12);
    ASSERT(a.exploring || sd_adaptive_informed(&a, 32));
    /* the cycle measured 32 and 32 x 2 rows, never spending a k_max step on it */
    ASSERT_GE(m.zero_picks, 2);
    ASSERT_GE(m.one_picks, 2);
    run(&a, &acc, &m, 32, 100);
    ASSERT(!a.exploring);
    ASSERT(sd_adaptive_informed(&a, 32));
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 32), 1);
}

/* tokens per second of drafting k each step on m at this batch (steady
 * state: the expected accepted length over the step's cost) */
static double sim_rate(const sim *m, int batch, int k)
{
    double len = 1, run = 1;
    for (int j = 0; j < k; j++) {
        run *= m->p;
        len += run;
    }
    double t = target_cost(m, batch * (k + 1)) + (k > 0 ? m->d_base + m->d_per * k : 0);
    return batch * len / t;
}

/* Batch-1 decode of a memory-bound model (a DeepSeek-V2-Lite-like step of
 * 2.9 ms, flat in rows; an MTP pass of 0.2 ms plus 0.05 ms to start
 * drafting): at 0.15 acceptance one draft still pays (1.15 tokens for 1.09
 * steps' time: +6%), deeper ones pay less; at 0.05 none does. Over 20 runs
 * (machines of other random draws) the settled choice is never one that
 * decodes slower than plain, and at 0.15 it finds the draft that pays in
 * most of them (a run whose first drafts were unlucky may settle on plain:
 * equal speed, not a loss). */
TEST(poor_acceptance_on_a_memory_bound_gpu_never_settles_below_plain)
{
    static const double ps[2] = {0.15, 0.05};
    for (int i = 0; i < 2; i++) {
        int found = 0;
        for (int run_i = 0; run_i < 20; run_i++) {
            sd_adaptive a;
            sd_accept_stats acc;
            sim m = {.base = 2.9e-3, .knee = 64, .per_row = 4e-6, .d_base = 5e-5,
                     .d_per = 2e-4, .p = ps[i], .rng = 29 + 1000 * (uint64_t)run_i + (uint64_t)i};
            ASSERT(settled(&a, &acc, &m, 1, 400));
            int best = sd_adaptive_best_k(&a, &acc, 1);
            ASSERT_GE(sim_rate(&m, 1, best), sim_rate(&m, 1, 0));
            found += best == (i == 0 ? 1 : 0);
        }
        ASSERT_GE(found, i == 0 ? 16 : 20);
    }
}

/* The batch-1 costs an H200 measured for the DeepSeek-V2-Lite-shaped model
 * with its MTP layer (bench/results/NOTES.md: a 1-row step 2.50 ms, 2 rows
 * 3.46 ms, a draft 0.31 ms): one draft pays above ~0.53 acceptance. At
 * 0.15 the controller used to draft 64 times before it could stop (0.885 of
 * plain over a 128-token request); now the probes end once the drafts so
 * far rule out an acceptance that would pay. A proposer that does pay is
 * still found (0.8). */
TEST(a_poor_draft_on_a_memory_bound_gpu_is_given_up_after_a_few_drafts)
{
    int all = 0;
    for (int run_i = 0; run_i < 20; run_i++) {
        sd_adaptive a;
        sd_accept_stats acc;
        sim m = {.base = 2.5e-3, .knee = 1, .per_row = 0.96e-3, .d_base = 5e-6, .d_per = 3e-4,
                 .p = 0.15, .rng = 71 + 1000 * (uint64_t)run_i};
        sd_adaptive_init(&a, 4);
        memset(&acc, 0, sizeof acc);
        run(&a, &acc, &m, 1, 114); /* the measured window: 114 steps */
        /* a lucky streak of early acceptances probes longer (up to ~1/3
         * accepted over 32 drafts in these draws), but never the old 64 */
        int drafting = 114 - m.zero_picks;
        ASSERT_LE(drafting, 40);
        all += drafting;
        ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 1), 0);
    }
    ASSERT_LE(all, 20 * 16); /* 10.5 a run in these draws */
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 2.5e-3, .knee = 1, .per_row = 0.96e-3, .d_base = 5e-6, .d_per = 3e-4, .p = 0.8,
             .rng = 5};
    fresh(&a, &acc);
    run(&a, &acc, &m, 1, 200);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 1), 1);
}

/* The machine slows down (4x: another process, a clock, a longer context)
 * while k = 0 is chosen: the 1-row point follows, the 2-row point and the
 * draft's stay as they were measured, fast. Read together they said a
 * second row costs nothing (the line between them falls, clamped flat), so
 * a draft that loses at 0.1 acceptance looked like it paid, and drafting
 * came back for good (the CPU backend on the bundled model did this). Now
 * a point much staler than the one it is read with is left out, and a
 * stale point is measured again. */
TEST(a_slower_machine_does_not_make_stale_points_look_cheap)
{
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 0, .knee = 0, .per_row = 5e-4, .d_base = 5e-5, .d_per = 5e-5, .p = 0.1,
             .rng = 31};
    ASSERT(settled(&a, &acc, &m, 1, 120));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 1), 0);
    m.per_row *= 4; /* every row 4x slower from here on; drafting too */
    m.d_base *= 4;
    m.d_per *= 4;
    m.zero_picks = m.one_picks = m.max_picks = 0;
    run(&a, &acc, &m, 1, 400);
    /* a few steps to measure again at most, never a settled draft */
    ASSERT_LE(400 - m.zero_picks, 12);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 1), 0);
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 1, 1), 0);
}

/* Two measured points whose line falls (noise: 16 rows measured a little
 * faster than 8) said nothing about 24..40 rows, but extrapolated flat
 * they made every deeper k look free: a CPU server at batch 8 went from
 * k = 0 straight to 4 and paid 40-row steps. Only one k past the measured
 * ones may be chosen; measuring it opens the next. */
TEST(deeper_k_than_measured_waits_for_its_measurement)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 6; i++) {
        sd_adaptive_observe_target(&a, 8, 8, 2.60e-3);
        sd_adaptive_observe_target(&a, 8, 16, 2.55e-3);
        sd_adaptive_observe_draft(&a, 8, 1, 0.5e-3);
    }
    for (int i = 0; i < 200; i++) /* 0.9 per position: deep drafts look good */
        sd_accept_stats_add(&acc, 4, i % 10 == 0 ? 0 : 4);
    ASSERT(sd_adaptive_informed(&a, 8));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 2);
    /* 24 rows measured (what they cost on this machine: 3 of 8): k = 3 opens, and loses */
    for (int i = 0; i < 4; i++) {
        sd_adaptive_observe_target(&a, 8, 24, 7.8e-3);
        sd_adaptive_observe_draft(&a, 8, 2, 1.0e-3);
    }
    ASSERT_LE(sd_adaptive_best_k(&a, &acc, 8), 1);
}

/* A CPU's step times at batch 8 spread over 3-5.5 ms; its 16-row point
 * came out a little under its 8-row one. Read as a curve that falls, one
 * draft looked free. A fall within the points' own spread is noise: the
 * curve then rises as the points' typical (median) times do, 1 ms here,
 * and a draft that does not pay for those rows is not drafted. A GPU's real
 * fall (16-row tensor core steps under 8-row fp32 ones, each steady) stays
 * a fall. */
TEST(a_fall_within_the_noise_is_not_free_rows)
{
    static const double t8[8] = {3.0e-3, 5.5e-3, 3.6e-3, 4.8e-3, 3.2e-3, 5.1e-3, 4.2e-3, 3.9e-3};
    static const double t16[8] = {3.4e-3, 6.0e-3, 5.2e-3, 3.3e-3, 4.9e-3, 6.4e-3, 3.5e-3, 5.8e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 8; i++) {
        sd_adaptive_observe_target(&a, 8, 8, t8[i]);
        sd_adaptive_observe_target(&a, 8, 16, t16[i]);
        sd_adaptive_observe_draft(&a, 8, 1, 0.5e-3);
    }
    for (int i = 0; i < 100; i++) /* 0.3 a draft */
        sd_accept_stats_add(&acc, 1, i % 10 < 3);
    ASSERT(sd_adaptive_informed(&a, 8));
    /* the medians of the times after the first two: 4.05 and 5.05 ms */
    ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 8), 16, NULL) - sd_curve_at(sd_adaptive_target(&a, 8), 8, NULL), 1.0e-3, 1e-9);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 0);
    /* at 0.6 a draft the same rows pay (1.6 tokens for 5.1 ms against 1 for 3.6) */
    sd_accept_stats acc6;
    memset(&acc6, 0, sizeof acc6);
    for (int i = 0; i < 100; i++)
        sd_accept_stats_add(&acc6, 1, i % 5 < 3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc6, 8), 1);
    /* steady times, a real fall: 16 rows are cheaper, and one draft pays */
    sd_adaptive g;
    sd_adaptive_init(&g, 4);
    for (int i = 0; i < 8; i++) {
        sd_adaptive_observe_target(&g, 8, 8, 10.34e-3 + 1e-6 * (i % 3));
        sd_adaptive_observe_target(&g, 8, 16, 7.90e-3 + 1e-6 * (i % 2));
        sd_adaptive_observe_draft(&g, 8, 1, 0.2e-3);
    }
    ASSERT_GE(sd_adaptive_best_k(&g, &acc, 8), 1);
}

/* The bundled model on an H200 (its debug trace): a plain step at batch 8
 * takes 0.247 ms, a 16-row one the same within a few us, and the first of
 * each shape is a graph capture. The fall of a few us from 8 to 16 rows is
 * within the noise; read as a rise at the larger point's time per row (the
 * rule before this one) it made 16 rows cost 0.365 ms, so one draft at
 * 0.74 looked worse than none and speculation went off after 7 steps,
 * where fixed k = 3 runs 1.23x plain. Flat times read flat. */
TEST(a_flat_gpu_curve_measured_a_little_lower_at_more_rows_stays_flat)
{
    static const double t8[3] = {0.341e-3, 0.247e-3, 0.256e-3};
    static const double t16[3] = {0.365e-3, 0.238e-3, 0.236e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 3; i++) {
        sd_adaptive_observe_target(&a, 8, 8, t8[i]);
        sd_adaptive_observe_target(&a, 8, 16, t16[i]);
        sd_adaptive_observe_draft(&a, 8, 1, i ? 0.130e-3 : 27e-3);
    }
    for (int i = 0; i < 19; i++) /* 14 of 19 first drafts accepted */
        sd_accept_stats_add(&acc, 1, i < 14);
    ASSERT(sd_adaptive_informed(&a, 8));
    ASSERT(sd_curve_at(sd_adaptive_target(&a, 8), 16, NULL) <= sd_curve_at(sd_adaptive_target(&a, 8), 8, NULL) + 1e-9);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 1);
}

/* The same machine at batch 1 with the draft LM: its drafting phase took
 * 0.137-0.365 ms from step to step. After six drafts (five accepted) the
 * ring's second-least time made one draft at the hoped-for acceptance
 * lose to plain decode and speculation went off for good, where the draft
 * LM's k = 3 runs 1.79x plain. The hope is read at the least times. */
TEST(the_hope_is_read_at_the_least_times)
{
    static const double d1[5] = {24.078e-3, 0.137e-3, 0.365e-3, 0.161e-3, 0.286e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 5; i++) {
        sd_adaptive_observe_target(&a, 1, 2, i ? 0.187e-3 : 0.300e-3);
        sd_adaptive_observe_target(&a, 1, 1, i ? 0.175e-3 : 0.262e-3);
        sd_adaptive_observe_draft(&a, 1, 1, d1[i]);
    }
    for (int i = 0; i < 6; i++)
        sd_accept_stats_add(&acc, 1, i != 0);
    ASSERT(sd_adaptive_informed(&a, 1));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 1), 0);
    /* not yet a verdict: the least times and a hopeful acceptance pay */
    a.picks = 1; /* not a neighbour-probe pick */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 1, 1), 1);
    /* 64 drafting steps at 0.5: no hope left */
    for (int i = 0; i < 64; i++) {
        sd_adaptive_observe_draft(&a, 1, 1, d1[1 + i % 4]);
        sd_accept_stats_add(&acc, 1, i % 2);
    }
    a.picks = 1;
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 1, 1), 0);
}

/* The draft LM at batch 1 on an H200 again: one draft (0.16 ms of
 * drafting phase on a 0.175 ms step) does not pay even at a hopeful
 * acceptance, but its second and third drafts cost 0.03 ms each and k = 3
 * runs 1.79x plain. Before k = 2 is measured the hope reads the draft
 * curve flat past its one point, not in proportion to k (0.32 ms at k = 2),
 * so drafting goes on and the neighbour probes measure k = 2. */
TEST(the_hope_looks_past_a_first_draft_that_does_not_pay_alone)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 5; i++) {
        sd_adaptive_observe_target(&a, 1, 2, 0.187e-3);
        sd_adaptive_observe_target(&a, 1, 1, 0.175e-3);
        sd_adaptive_observe_draft(&a, 1, 1, 0.160e-3);
    }
    for (int i = 0; i < 6; i++)
        sd_accept_stats_add(&acc, 1, 1);
    ASSERT(sd_adaptive_informed(&a, 1));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 1), 0);
    a.picks = 1;
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 1, 1), 1);
    /* the probe measures k = 2 (0.19 ms): settled, it pays at 0.97 */
    for (int i = 0; i < 4; i++) {
        sd_adaptive_observe_target(&a, 1, 3, 0.199e-3);
        sd_adaptive_observe_draft(&a, 1, 2, 0.190e-3);
    }
    for (int i = 0; i < 100; i++)
        sd_accept_stats_add(&acc, 2, i % 33 ? 2 : 0);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 1), 2);
}

/* After speculation went off, the requests still tracking the proposer
 * (one admitted in 8) came back drafting k = 2-3 while the other 7 of the
 * batch were plain rows: each step paid the whole drafting phase (0.13 ms
 * on a 0.25 ms step) for one request's tokens, 0.62x plain. A k must pay
 * for the step of the whole batch. */
TEST(a_draft_for_one_request_of_eight_must_pay_for_the_whole_step)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 8; i++) {
        for (int T = 8; T <= 12; T++)
            sd_adaptive_observe_target(&a, 8, T, 0.245e-3);
        for (int T = 16; T <= 40; T += 8)
            sd_adaptive_observe_target(&a, 8, T, 0.245e-3 + 0.002e-3 * (T / 8));
        for (int k = 1; k <= 4; k++) { /* a GPU's phase: the same for 1 request and 8 */
            sd_adaptive_observe_draft(&a, 1, k, 0.10e-3 + 0.033e-3 * k);
            sd_adaptive_observe_draft(&a, 8, k, 0.10e-3 + 0.033e-3 * k);
        }
    }
    for (int i = 0; i < 400; i++) /* 0.97 a position */
        sd_accept_stats_add(&acc, 4, i % 33 ? 4 : 0);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    a.picks = 1;
    ASSERT_GE(sd_adaptive_pick_k(&a, &acc, 8, 8), 3);
    a.picks = 1;
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 8, 1), 0);
}

/* 8 rounds of a batch of 8 requests at k = 0..4 (8..40 rows): target
 * steps of t[k] (0: none of that k) and drafting phases of d[k - 1] */
static void observe_batch8(sd_adaptive *a, const double t[5], const double d[4])
{
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k <= 4; k++)
            if (t[k] > 0)
                sd_adaptive_observe_target(a, 8, 8 * (k + 1), t[k]);
        for (int k = 1; k <= 4; k++)
            sd_adaptive_observe_draft(a, 8, k, d[k - 1]);
    }
}

/* The bundled model's MTP layer on an H200 (its debug log, NOTES.md
 * session 12): 32-row steps of 8 requests at k = 3 took 0.313 ms, plain
 * steps of 32 requests 0.454 (each request's context read by the
 * attention). Priced by rows alone, a plain step of 32 read the 8's point:
 * 102 tokens a ms against 79 for one draft, and speculation went off where
 * it ran 1.20x plain. Each batch bucket has its own curves (target steps,
 * drafting phases); a GPU's flat one is not lent to another batch, which
 * explores first. */
TEST(rows_of_more_requests_are_priced_on_their_own_batch_curve)
{
    static const double t8[5] = {0.250e-3, 0.262e-3, 0.281e-3, 0.313e-3, 0.330e-3};
    static const double t32[3] = {0.454e-3, 0.593e-3, 0.861e-3};
    static const double d[4] = {0.207e-3, 0.375e-3, 0.614e-3, 0.827e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    observe_batch8(&a, t8, d);
    for (int i = 0; i < 1000; i++) /* 0.967, 0.894, 0.826, 0.749 of the first 1..4 */
        sd_accept_stats_add(&acc, 4, i < 33 ? 0 : i < 106 ? 1 : i < 174 ? 2 : i < 251 ? 3 : 4);
    /* batch 32 before a step of its own: nothing measured, it explores */
    ASSERT(!sd_adaptive_informed(&a, 32));
    ASSERT(sd_adaptive_target(&a, 32) == NULL);
    /* its steps at k = 0..2, and its drafting phases (32 requests: dearer
     * than 8's, and no reason to reprice 8's: with one drafting curve for
     * every batch they did, and batch 8's best k fell from 2 to 0) */
    static const double d32[2] = {0.25e-3, 0.45e-3};
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k <= 2; k++)
            sd_adaptive_observe_target(&a, 32, 32 * (k + 1), t32[k]);
        for (int k = 1; k <= 2; k++)
            sd_adaptive_observe_draft(&a, 32, k, d32[k - 1]);
    }
    ASSERT(sd_adaptive_informed(&a, 32));
    ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 8), 32, NULL), 0.313e-3, 1e-12);
    ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 32), 32, NULL), 0.454e-3, 1e-12);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 32), 1);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 8), 2);
    /* 16 requests: between the two, still its own bucket to measure */
    ASSERT(!sd_adaptive_informed(&a, 16));
}

/* Fewer drafting requests than a measured bucket's (some stopped tracking
 * the proposer, or a batch's tail): that bucket's phases are an upper bound
 * of theirs, so nothing is explored again for them (before, the engine's
 * 4 requests with speculation off explored k = 1 for 1 drafting request
 * at every step) */
TEST(fewer_drafting_requests_are_priced_by_a_larger_buckets_phases)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 4; i++) {
        sd_adaptive_observe_target(&a, 4, 4, 3.0e-3);
        sd_adaptive_observe_target(&a, 4, 8, 5.5e-3);
        sd_adaptive_observe_draft(&a, 4, 1, 1.4e-3);
    }
    for (int i = 0; i < 100; i++) /* 0.1 accepted: not worth a draft */
        sd_accept_stats_add(&acc, 1, i % 10 == 0);
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 4, 1), 0);
    ASSERT(!a.exploring);
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 4, 4), 0);
    ASSERT(!a.exploring);
}

/* The bundled draft LM on an H200 at batch 8 (its trace, 3 repeats of 8
 * requests in one engine): the batch's tail (batches 6..1) left the
 * batch-8 curve's points of 24..40 rows older than SD_CURVE_STALE steps,
 * and its 16-row point priced by the tail's 12 rows of 6 requests (0.48
 * ms against 0.30 for 16 rows of 8). The next repeat's first steps at 40
 * and 32 rows (0.342, 0.323 ms: what they always cost) restarted those
 * points untrusted, the curve was read off its 8- and 16-row points, 40
 * rows came out at 1.2 ms, k went to 0 and speculation off for the whole
 * repeat (1.21x plain at fixed k = 3 there). A point that was trusted
 * restarts trusted: its shape is not new, its time is no one-off. */
TEST(a_stale_point_measured_again_is_read_at_its_new_time)
{
    static const double t8[5] = {0.233e-3, 0, 0.35e-3, 0.40e-3, 0.45e-3};
    static const double d[4] = {0.147e-3, 0.150e-3, 0.200e-3, 0.325e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    observe_batch8(&a, t8, d);
    for (int i = 0; i < 1000; i++) /* 0.93, 0.89, 0.88, 0.87 of the first 1..4 */
        sd_accept_stats_add(&acc, 4, i < 70 ? 0 : i < 110 ? 1 : i < 120 ? 2 : i < 130 ? 3 : 4);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    /* plain steps a while, then the tail: 12 rows of 6 requests and 25 of
     * 8 (bucket 8, the 16- and 24-row points), then batches of 4, 2, 1 */
    for (int i = 0; i < 20; i++)
        sd_adaptive_observe_target(&a, 8, 8, 0.235e-3);
    for (int i = 0; i < 4; i++)
        sd_adaptive_observe_target(&a, 6, 12, 0.48e-3);
    sd_adaptive_observe_target(&a, 8, 25, 0.588e-3);
    for (int i = 0; i < 60; i++)
        sd_adaptive_observe_target(&a, 4 >> (i / 20), 4 * (4 >> (i / 20)), 0.21e-3);
    /* the next 8 requests */
    sd_adaptive_observe_target(&a, 8, 40, 0.342e-3);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    sd_adaptive_observe_target(&a, 8, 32, 0.323e-3);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 8), 3);
    ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 8), 40, NULL), 0.342e-3, 1e-12);
}

/* The same trace, the next batch of 32: the batch-4 curve (the tail's
 * steps of 3..4 requests) rose from 0.215 ms at 3 rows to 0.268 at 8 and
 * 0.471 at 16 (padded steps of a few requests cost that much there). Its
 * top two points rose in proportion to their rows, as a CPU's do, so it
 * was lent to the 32 arrivals, which read plain decode as cheaper than
 * drafting and started with speculation off. A curve is lent only where
 * it rises in proportion over its whole range. */
TEST(a_gpu_curve_with_a_bump_is_not_lent_to_a_larger_batch)
{
    static const int x[5] = {3, 4, 6, 8, 16};
    static const double t[5] = {0.215e-3, 0.233e-3, 0.251e-3, 0.268e-3, 0.471e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            sd_adaptive_observe_target(&a, 4, x[j], t[j]);
    for (int k = 1; k <= 4; k++)
        for (int i = 0; i < 4; i++)
            sd_adaptive_observe_draft(&a, 4, k, 0.1e-3 + 0.05e-3 * k);
    ASSERT(sd_adaptive_informed(&a, 4));
    ASSERT(!sd_adaptive_informed(&a, 32));
    /* a CPU's curve of the same points in proportion is still lent */
    fresh(&a, &acc);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            sd_adaptive_observe_target(&a, 4, x[j], 0.03e-3 * x[j]);
    for (int k = 1; k <= 4; k++)
        for (int i = 0; i < 4; i++)
            sd_adaptive_observe_draft(&a, 4, k, 0.1e-3 + 0.05e-3 * k);
    ASSERT(sd_adaptive_informed(&a, 32));
}

/* The bundled model's MTP layer on an H200 at batch 32 (its trace): 115
 * first drafts in 3 steps right after the prompts, 0.68 accepted; one
 * draft then lost to plain decode by 4% and speculation went off for
 * good, where fixed k = 3 runs 1.19x plain (0.9 accepted later). Three
 * steps are not 115 independent drafts: the hope keeps probing. */
TEST(drafts_of_a_few_steps_are_not_settled_evidence)
{
    static const double d1[3] = {1.112e-3, 0.202e-3, 0.931e-3};
    static const double t64[3] = {0.557e-3, 0.370e-3, 0.395e-3};
    static const double t32[3] = {0.507e-3, 0.328e-3, 0.341e-3};
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 3; i++) {
        sd_adaptive_observe_target(&a, 32, 64, t64[i]);
        sd_adaptive_observe_target(&a, 32, 32, t32[i]);
        sd_adaptive_observe_draft(&a, 32, 1, d1[i]);
    }
    for (int i = 0; i < 115; i++)
        sd_accept_stats_add(&acc, 1, i % 22 < 15);
    ASSERT(sd_adaptive_informed(&a, 32));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    a.picks = 1;
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 1);
    /* 16 drafting steps later at the same 0.68 the question is settled */
    for (int i = 0; i < 16; i++) {
        sd_adaptive_observe_draft(&a, 32, 1, 0.202e-3);
        for (int j = 0; j < 32; j++)
            sd_accept_stats_add(&acc, 1, (i * 32 + j) % 22 < 15);
    }
    a.picks = 1;
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 0);
}

/* A small model's GPU steps as the H200 traces of the bundled model show
 * them: a target step flat in its rows (base + per_row x rows), a drafting
 * phase of d_base + d_per x k whose host time jumps to up to 2.5x in a
 * third of the steps, the first time of every shape 1.6x (the target) or
 * 3 ms more, then 3x (a drafting phase: an eager pass, a capture), each
 * draft accepted with p. The engine's rule on top: 4
 * chosen (not exploring) zeros in a row and the requests stop drafting
 * for good. Returns the run's tokens per second over plain decode's. */
typedef struct noisy_gpu {
    int batch;
    double base, per_row, d_base, d_per, p;
} noisy_gpu;

static double noisy_run(const noisy_gpu *g, uint64_t seed, int steps, int *went_off)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    sim m = {.rng = seed};
    int seen_t[1024] = {0}, seen_d[8] = {0}, seen_k[8] = {0}, zeros = 0, off = 0;
    double t_all = 0, tok = 0;
    for (int s = 0; s < steps; s++) {
        int k = off ? 0 : sd_adaptive_pick_k(&a, &acc, g->batch, g->batch);
        m.zero_picks += k == 0;
        m.one_picks += k == 1;
        m.max_picks = k > m.max_picks ? k : m.max_picks;
        if (k < 8)
            seen_k[k]++;
        if (!off) {
            zeros = k == 0 && !a.exploring ? zeros + 1 : 0;
            off = zeros >= 4;
        }
        double jitter = urand(&m) < 0.33 ? 1.0 + 1.5 * urand(&m) : 1.0 + 0.1 * urand(&m);
        if (k > 0) {
            double t = (g->d_base + g->d_per * k) * jitter;
            t = seen_d[k] == 0 ? t + 3e-3 : seen_d[k] == 1 ? 3 * t : t;
            seen_d[k]++;
            sd_adaptive_observe_draft(&a, g->batch, k, t);
            t_all += t;
        }
        int T = g->batch * (k + 1);
        double t = (g->base + g->per_row * T) * (1.0 + 0.05 * urand(&m));
        if (seen_t[sd_row_bucket(T)]++ == 0)
            t *= 1.6;
        sd_adaptive_observe_target(&a, g->batch, T, t);
        t_all += t;
        for (int b = 0; b < g->batch; b++) {
            int n = 0;
            while (n < k && urand(&m) < g->p)
                n++;
            sd_accept_stats_add(&acc, k, n);
            tok += 1 + n;
        }
    }
    *went_off = off;
    if (getenv("SIM_TRACE")) /* SIM_TRACE=1: each run's steps by k */
        fprintf(stderr, "   seed %llu off %d: k %d %d %d %d %d\n", (unsigned long long)seed, off,
                seen_k[0], seen_k[1], seen_k[2], seen_k[3], seen_k[4]);
    double plain = g->base + g->per_row * g->batch;
    return tok / t_all / (g->batch / plain);
}

/* In most runs such a machine drafts, and the runs gain on average (the
 * fixed k = 3 of the bundled model: 1.79x at batch 1 with the draft LM,
 * 1.31x at batch 32 with its MTP layer). With the hope reading a
 * one-point draft curve in proportion to k, 27 of 100 runs at batch 1
 * went off (the worst 0.94x plain) and 5 of 100 at batch 32: the GPU's
 * runs of the bundled draft LM that went off after 5 drafts. */
TEST(noisy_small_gpu_steps_draft_in_most_runs)
{
    static const noisy_gpu cases[] = {
        /* the draft LM at batch 1 (decode.json at e5c1d8d: a 0.188 ms
         * plain step, 0.215 ms to verify 4 rows, 0.194 ms to draft 3; the
         * trace: 0.137 ms at least to draft 1) */
        {.batch = 1, .base = 0.179e-3, .per_row = 0.009e-3, .d_base = 0.119e-3, .d_per = 0.011e-3,
         .p = 0.97},
        /* the MTP layer at batch 32 (0.553 ms plain, 0.874 ms to verify 128
         * rows, 0.588 ms to draft 3, 0.202 ms at least to draft 1) */
        {.batch = 32, .base = 0.446e-3, .per_row = 0.00334e-3, .d_base = 0.055e-3,
         .d_per = 0.135e-3, .p = 0.88},
    };
    int ok = 1;
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int n_off = 0, runs = 100;
        double sum = 0, worst = 1e9;
        for (int r = 0; r < runs; r++) {
            int off;
            double x = noisy_run(&cases[c], 1000 + 7919 * (uint64_t)r, 512, &off);
            n_off += off;
            sum += x;
            worst = x < worst ? x : worst;
        }
        fprintf(stderr, "  batch %d: %d of %d runs went off, mean %.3fx plain, worst %.3fx\n",
                cases[c].batch, n_off, runs, sum / runs, worst);
        ok &= n_off <= 5 && sum / runs > (cases[c].batch == 1 ? 1.5 : 1.1) && worst > 0.97;
    }
    ASSERT(ok);
}

/* Where plain steps would be queued ahead (launch ahead: the bundled model
 * on an H200 ran plain decode 5-9% faster with it at batch 32, and the
 * speculative engines, which queue nothing ahead while a request tracks
 * the proposer, then tied with it: NOTES.md, session 15), k = 0 is priced
 * at the queued-ahead step: the plain step read one at a time less what
 * queueing ahead hides, until a queued-ahead step is measured, which
 * then prices it alone. */
TEST(plain_decode_queued_ahead_is_priced_at_its_own_cost)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    for (int i = 0; i < 8; i++) {
        sd_adaptive_observe_target(&a, 32, 32, 0.300e-3);
        sd_adaptive_observe_target(&a, 32, 64, 0.330e-3);
        sd_adaptive_observe_target(&a, 32, 96, 0.450e-3);
        sd_adaptive_observe_draft(&a, 32, 1, 0.030e-3);
        sd_adaptive_observe_draft(&a, 32, 2, 0.060e-3);
    }
    for (int i = 0; i < 1000; i++) /* a quarter of first drafts accepted */
        sd_accept_stats_add(&acc, 1, i % 4 == 0);
    /* one draft: 40 tokens in 0.36 ms against plain's 32 in 0.30, +4% */
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 1);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.300e-3, 1e-12);
    /* the steps read one at a time spent 0.04 ms where queueing ahead would
     * hide them; without a.ahead (the CPU, several nodes) that prices nothing */
    for (int i = 0; i < 8; i++)
        sd_adaptive_observe_hidden(&a, 32, 0.040e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 1);
    a.ahead = 1;
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.260e-3, 1e-12);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 0);
    ASSERT(!a.exploring);
    /* another batch's hidden time prices nothing here */
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 8), 0, 0);
    /* measured: queued-ahead steps of 32 took 0.31 ms (the GPU had run part
     * of each step during its launch call already): their time alone, and
     * one draft pays again */
    for (int i = 0; i < 2; i++)
        sd_adaptive_observe_ahead(&a, 32, 32, 0.310e-3, 0);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.260e-3, 1e-12); /* two times: not trusted */
    sd_adaptive_observe_ahead(&a, 32, 32, 0.310e-3, 0);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.310e-3, 1e-12);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 1);
    /* queued-ahead steps are no target steps: the curve of steps read one at
     * a time kept its 0.30 ms, and its points aged with them */
    ASSERT_NEAR(sd_curve_at(sd_adaptive_target(&a, 32), 32, NULL), 0.300e-3, 1e-12);
    uint64_t s0 = a.steps;
    for (int i = 0; i < SD_CURVE_FRESH + 1; i++)
        sd_adaptive_observe_ahead(&a, 32, 32, 0.310e-3, 0);
    ASSERT_EQ(a.steps, s0 + SD_CURVE_FRESH + 1);
    ASSERT(!sd_adaptive_informed(&a, 32)); /* arrivals explore again */
    /* a hidden time of most of the step: never under half of it */
    sd_adaptive b;
    fresh(&b, &acc);
    b.ahead = 1;
    for (int i = 0; i < 4; i++) {
        sd_adaptive_observe_target(&b, 4, 4, 0.200e-3);
        sd_adaptive_observe_hidden(&b, 4, 0.500e-3);
    }
    ASSERT_NEAR(sd_adaptive_plain_cost(&b, 4), 0.100e-3, 1e-12);
}

/* A plain step's time grows with the keys its rows read (the bundled
 * model at batch 32 on an H200: 0.30 ms at 5k keys, 0.345 at 16k): priced
 * at the last burst's end, a new burst's short contexts looked 15% dearer
 * than they ran and one draft (0.95-0.97x plain there) was chosen
 * (NOTES.md, session 30). With the running requests' keys (a.keys) plain
 * decode is priced on a line through the queued-ahead steps' times
 * against their keys. */
TEST(plain_decode_queued_ahead_is_priced_at_the_running_contexts)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    a.ahead = 1;
    for (int i = 0; i < 8; i++) { /* one draft: 0.44 + 0.14 ms */
        sd_adaptive_observe_target(&a, 32, 32, 0.330e-3);
        sd_adaptive_observe_target(&a, 32, 64, 0.440e-3);
        sd_adaptive_observe_draft(&a, 32, 1, 0.140e-3);
    }
    for (int i = 0; i < 1000; i++) /* 76% of first drafts accepted: 32 x 1.76 in 0.58 ms */
        sd_accept_stats_add(&acc, 1, i % 25 < 19);
    /* a burst's queued-ahead steps from 1k to 16.4k keys, 0.29 ms + 3.5 ns a
     * key, each +-3 us (the ring keeps the last SD_ADAPT_CTX_RING: 8k-16.4k) */
    int n = 0;
    for (double keys = 1000; keys <= 16400; keys += 32, n++)
        sd_adaptive_observe_ahead(&a, 32, 32, 0.290e-3 + 3.5e-9 * keys + (n % 3 - 1) * 3e-6,
                                  keys);
    /* without the keys: the ahead curve's point (its last 8 times) */
    a.keys = 0;
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.290e-3 + 3.5e-9 * 16380, 8e-6);
    /* at the burst's end one draft pays (97 tokens a ms against 93) */
    a.keys = 16400;
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.290e-3 + 3.5e-9 * 16400, 5e-6);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 1);
    /* a new burst at 5k keys: plain 0.3075 ms (104 a ms), no draft */
    a.keys = 5000;
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.290e-3 + 3.5e-9 * 5000, 6e-6);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    /* far below what was measured the line falls no further than 3/4 of
     * the time at the fewest keys */
    a.keys = 1;
    double low = sd_adaptive_plain_cost(&a, 32);
    ASSERT(low >= 0.75 * (0.290e-3 + 3.5e-9 * 8200) - 6e-6 && low < 0.290e-3);
    /* steps of another row count price nothing here: 40 rows of batch 32
     * (the bucket of 33..40 requests is 64; of 17..32 rows 24 or 32) */
    a.keys = 5000;
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 24), sd_curve_at(sd_adaptive_target(&a, 24), 24, NULL),
                0);
    /* a machine that has not run plain decode for SD_CURVE_FRESH steps: its
     * queued-ahead times price nothing (the point is not trusted either:
     * t0 less the hidden time, none here: t0) */
    for (int i = 0; i <= SD_CURVE_FRESH; i++)
        sd_adaptive_observe_target(&a, 32, 64, 0.440e-3);
    sd_adaptive_observe_target(&a, 32, 32, 0.330e-3);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.330e-3, 1e-12);
    /* too few (SD_ADAPT_CTX_MIN) fresh steps: the point as measured */
    for (int i = 0; i < SD_ADAPT_CTX_MIN - 1; i++)
        sd_adaptive_observe_ahead(&a, 32, 32, 0.320e-3, 9000 + 32 * i);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.320e-3, 1e-12);
    sd_adaptive_observe_ahead(&a, 32, 32, 0.320e-3, 9000 + 32 * 15);
    ASSERT_NEAR(sd_adaptive_plain_cost(&a, 32), 0.320e-3, 1e-12); /* flat: the same time */
}

/* a refresh's picks at batch 32: one draft measured at the short context
 * (0.34 + 0.12 ms), then a plain step (0.30 ms), then drafting (32 x 1.9
 * tokens in 0.46 ms, 132 a ms, against 107) */
static void remeasure_short(sd_adaptive *a, const sd_accept_stats *acc)
{
    ASSERT_EQ(sd_adaptive_pick_k(a, acc, 32, 32), 1);
    sd_adaptive_observe_target(a, 32, 64, 0.340e-3);
    sd_adaptive_observe_draft(a, 32, 1, 0.120e-3);
    ASSERT_EQ(sd_adaptive_pick_k(a, acc, 32, 32), 0);
    sd_adaptive_observe_target(a, 32, 32, 0.300e-3);
    ASSERT_GE(sd_adaptive_pick_k(a, acc, 32, 32), 1);
    ASSERT_EQ(a->refresh_at, 0);
}

/* a fresh controller whose first drafts were accepted at rate p (of 2000) */
static void fresh_accepting(sd_adaptive *a, sd_accept_stats *acc, double p)
{
    fresh(a, acc);
    for (int i = 0; i < 2000; i++)
        sd_accept_stats_add(acc, 1, i % 100 < (int)(100 * p + 0.5) ? 1 : 0);
}

/* SD_CURVE_RING steps of one draft and of plain at batch 32: t64 + td, t32 */
static void prices32(sd_adaptive *a, double t64, double td, double t32)
{
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(a, 32, 64, t64);
        sd_adaptive_observe_draft(a, 32, 1, td);
        sd_adaptive_observe_target(a, 32, 32, t32);
    }
}

/* Bursts of 32 requests of 512 tokens (the draft LM on the bundled model
 * at batch 32 on an H200): one draft paid ~20% at a burst's short
 * contexts and stopped paying near its end (96.3 tokens/ms against plain's
 * 95.2 at 410 positions), where speculation went off. The next burst came
 * after idle in two steps: 5 arrivals, exploring their own batch (which
 * resets the engine's count of zeros), then 27 more, admitted on; its
 * first picks then compared a plain step at the new short context with
 * one draft's price from the last burst's end, picked 0 four times, and
 * the whole burst ran plain (NOTES.md, session 27). A burst after idle
 * measures both prices again first. */
TEST(a_burst_after_idle_measures_its_prices_again)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh_accepting(&a, &acc, 0.9);
    /* the end of a burst: one draft 32 x 1.9 tokens in 0.45 + 0.18 ms
     * (96.5 a ms), plain 32 in 0.33 (97.0): plain, then a plain stretch */
    for (int i = 0; i < 20; i++) {
        sd_adaptive_observe_target(&a, 32, 32, 0.330e-3);
        sd_adaptive_observe_target(&a, 32, 64, 0.450e-3);
        sd_adaptive_observe_draft(&a, 32, 1, 0.180e-3);
    }
    ASSERT(sd_adaptive_informed(&a, 32));
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 0);
    for (int i = 0; i < 150; i++)
        sd_adaptive_observe_target(&a, 32, 32, 0.340e-3);
    /* the tail's small batches, measured plain */
    for (int b = 4; b >= 1; b /= 2)
        for (int i = 0; i < 4; i++)
            sd_adaptive_observe_target(&a, b, b, 0.250e-3);
    /* the next burst: 5 arrivals after idle, on a settled verdict of 0 */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 5, 5, 1, 1), 0);
    ASSERT(a.refresh_at != 0);
    int k5 = sd_adaptive_pick_k(&a, &acc, 5, 5); /* batch 8's bucket: exploring */
    ASSERT(a.exploring);
    ASSERT(k5 == 0 || k5 == 1);
    /* 27 more, the count of zeros reset by the exploring pick */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 0, 0), 0);
    /* the first picks at 32 measure one draft and a plain step at the new
     * context, then compare them: drafting */
    remeasure_short(&a, &acc);
    /* an arrival while others run, on a verdict of 0 and fresh prices that
     * say 0 at its batch, starts off */
    prices32(&a, 0.450e-3, 0.180e-3, 0.330e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 0), 1);
    /* after idle with drafting on to the end (no verdict of 0) whose last
     * draft price, of the long context, makes best_k 0 against a plain step
     * of the start: measured again */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 0, 1), 0);
    ASSERT(a.refresh_at != 0);
    remeasure_short(&a, &acc);
    /* after idle where drafting pays at the batch, nothing restarts */
    prices32(&a, 0.340e-3, 0.120e-3, 0.300e-3);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 32), 1);
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 0, 1), 0);
    ASSERT_EQ(a.refresh_at, 0);
    /* a fresh controller has nothing to measure again */
    sd_adaptive b;
    fresh(&b, &acc);
    ASSERT_EQ(sd_adaptive_admit_off(&b, &acc, 1, 1, 1, 1), 0);
    ASSERT_EQ(b.refresh_at, 0);
}

/* A Poisson arrival while every running request runs plain (the bundled
 * model at c = 64 on an H100: 995 of ~1020 arrivals tracked the proposer
 * for a step; NOTES.md, session 44): the pick after its first step prices
 * it drafting alone among 32, so its admission asks that, not the price of
 * every request drafting, which no step measures while the verdict is
 * plain. Where one drafting among the batch would pay, it tracks. */
/* a fresh controller (acceptance 0.9) after SD_CURVE_RING plain steps of
 * 32 at 0.33 ms and steps of one of them drafting once: 33 rows in t33,
 * its draft in td */
static void one_of_32_drafting(sd_adaptive *a, sd_accept_stats *acc, double t33, double td)
{
    fresh_accepting(a, acc, 0.9);
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(a, 32, 32, 0.330e-3);
        sd_adaptive_observe_target(a, 32, 33, t33);
        sd_adaptive_observe_draft(a, 1, 1, td);
    }
}

TEST(an_arrival_among_plain_requests_is_priced_drafting_alone)
{
    sd_adaptive a;
    sd_accept_stats acc;
    /* plain 32 rows 0.33 ms (97 tokens/ms); one of 32 drafting: 33 rows
     * 0.335 ms + its draft 0.05 ms (32.9 tokens in 0.385: 85) */
    one_of_32_drafting(&a, &acc, 0.335e-3, 0.050e-3);
    ASSERT(!sd_adaptive_informed(&a, 32)); /* every request drafting: never measured */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 1), 0);
    ASSERT(!a.exploring);
    /* on a verdict of plain: off, as the pick would turn it */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 1, 1, 0), 1);
    ASSERT_EQ(a.refresh_at, 0);
    /* every request drafting is not known: a burst of 32 tracks (and explores) */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 0), 0);
    /* without the verdict it tracks */
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 1, 0, 0), 0);
    /* where one drafting pays (its draft free, the row free), it tracks */
    sd_adaptive b;
    sd_accept_stats bcc;
    one_of_32_drafting(&b, &bcc, 0.330e-3, 0.001e-3);
    ASSERT_GE(sd_adaptive_pick_k(&b, &bcc, 32, 1), 1);
    ASSERT_EQ(sd_adaptive_admit_off(&b, &bcc, 32, 1, 1, 0), 0);
}

/* The cohort switch (the bundled model's MTP under Poisson arrivals at c =
 * 64 on an H100; NOTES.md, session 45): every request drafting was priced
 * at the first burst's 14 requests, where one draft lost (14 x 1.89 tokens
 * in 0.332 + 0.095 ms, 62 a ms, against 14 in 0.205: 68), and speculation
 * went off; the batch then grew to ~30, where a plain step's rows cross
 * the GPU's 16-row tier (0.285 ms) and drafting paid, but each arrival was
 * priced drafting alone among the plain ones. Asked where an arrival
 * would start off, the cohort switch prices every request drafting at its
 * batch: measured where it was, hoped where not. */
/* a fresh controller (acceptance p, plain priced queued ahead) after
 * SD_CURVE_RING steps of 14 requests: plain 0.205 ms; one draft each, 28
 * rows 0.332 + 0.095 ms (the bundled model's MTP on an H100) */
/* SD_CURVE_RING times: target steps {batch, rows, seconds} (n of them),
 * then a drafting phase of one draft each for draft_batch requests */
static void observe_ring(sd_adaptive *a, const double (*pts)[3], int n, int draft_batch,
                         double draft_s)
{
    for (int i = 0; i < SD_CURVE_RING; i++) {
        for (int j = 0; j < n; j++)
            sd_adaptive_observe_target(a, (int)pts[j][0], (int)pts[j][1], pts[j][2]);
        sd_adaptive_observe_draft(a, draft_batch, 1, draft_s);
    }
}

/* a fresh controller, plain priced queued ahead, drafts accepted with
 * probability 0.89 (1.89 tokens a step), after observe_ring */
static void priced(sd_adaptive *a, sd_accept_stats *acc, const double (*pts)[3], int n,
                   int draft_batch, double draft_s)
{
    fresh_accepting(a, acc, 0.89);
    a->ahead = 1;
    observe_ring(a, pts, n, draft_batch, draft_s);
}

/* SD_CURVE_RING steps of 14 requests: plain 0.205 ms; one draft each, 28
 * rows 0.332 + 0.095 ms */
static void fresh_at_14_prices(sd_adaptive *a)
{
    static const double pts[][3] = {{14, 14, 0.205e-3}, {14, 28, 0.332e-3}};
    observe_ring(a, pts, 2, 14, 0.095e-3);
}

static void fresh_at_14(sd_adaptive *a, sd_accept_stats *acc, double p)
{
    fresh_accepting(a, acc, p);
    a->ahead = 1;
    fresh_at_14_prices(a);
}

static void burst_of_14_then_30_plain(sd_adaptive *a, sd_accept_stats *acc, double p)
{
    /* (31 rows: one of 30 drafting, its draft alone) */
    static const double pts[][3] = {{30, 24, 0.283e-3}, {30, 32, 0.292e-3}, {30, 31, 0.292e-3}};
    fresh_at_14(a, acc, p);
    observe_ring(a, pts, 3, 1, 0.070e-3);
}

/* burst_of_14_then_30_plain, and every request drafting measured at 30:
 * 60 rows in 0.45 ms and the draft in 0.20 (30 x 1.89 / 0.65 = 87 a ms,
 * plain's 103) */
static void drafting_at_30_does_not_pay(sd_adaptive *a, sd_accept_stats *acc)
{
    burst_of_14_then_30_plain(a, acc, 0.89);
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(a, 30, 60, 0.450e-3);
        sd_adaptive_observe_draft(a, 30, 1, 0.200e-3);
    }
}

TEST(a_plain_batch_that_grew_admits_a_cohort_where_every_request_drafting_pays)
{
    sd_adaptive a;
    sd_accept_stats acc;
    burst_of_14_then_30_plain(&a, &acc, 0.89);
    /* 14: measured, plain */
    ASSERT(sd_adaptive_informed(&a, 14));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 0);
    ASSERT_EQ(sd_adaptive_cohort(&a, &acc, 14, NULL), 0);
    /* 30: one arrival drafting among 29 plain loses (30.9 tokens in 0.362
     * ms against 30 in 0.292), so it would start off ... */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 30, 1), 0);
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 30, 1, 1, 0), 1);
    /* ... but every request drafting, never measured there, may pay: the
     * 64-row step at the 32-row one's time at most (the curve's slope) and
     * the 14 requests' draft */
    ASSERT(!sd_adaptive_informed(&a, 30));
    int k = 0;
    ASSERT_EQ(sd_adaptive_cohort(&a, &acc, 30, &k), SD_COHORT_HOPED);
    ASSERT_EQ(k, 1); /* k = 2 is not priced before k = 1 is measured */
    /* not without queued-ahead pricing (a CPU's engine) */
    a.ahead = 0;
    ASSERT_EQ(sd_adaptive_cohort(&a, &acc, 30, NULL), 0);
    a.ahead = 1;
    /* measured where it pays: 30 x 1.89 in 0.36 + 0.12 ms (118 a ms, plain 103) */
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(&a, 30, 60, 0.360e-3);
        sd_adaptive_observe_draft(&a, 30, 1, 0.120e-3);
    }
    ASSERT(sd_adaptive_informed(&a, 30));
    ASSERT_EQ(sd_adaptive_cohort(&a, &acc, 30, &k), SD_COHORT_MEASURED);
    ASSERT_GE(k, 1);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 30), 1);
    /* measured where it does not: 0.45 + 0.20 ms (87 a ms) */
    sd_adaptive b;
    sd_accept_stats bcc;
    drafting_at_30_does_not_pay(&b, &bcc);
    ASSERT_EQ(sd_adaptive_cohort(&b, &bcc, 30, &k), 0);
    ASSERT_EQ(k, 0);
    /* a proposer whose drafts are rarely accepted hopes for nothing */
    sd_adaptive c;
    sd_accept_stats ccc;
    burst_of_14_then_30_plain(&c, &ccc, 0.15);
    ASSERT_EQ(sd_adaptive_cohort(&c, &ccc, 30, NULL), 0);
    /* no proposer */
    sd_adaptive d;
    sd_accept_stats dcc;
    burst_of_14_then_30_plain(&d, &dcc, 0.89);
    d.k_max = 0;
    ASSERT_EQ(sd_adaptive_cohort(&d, &dcc, 30, NULL), 0);
}

/* The demand pick (the bundled model's MTP under Poisson arrivals at c = 64
 * on an H100: 650 requests a second of 128 tokens ask for ~83 tokens a ms;
 * NOTES.md, session 45): plain decode serves that at 24 requests (the
 * 17-32-row tier's 0.283 ms), every request drafting one at 22 (44 rows,
 * priced as 48, in 0.36 ms and its draft in 0.12: 22 x 1.89 / 0.48 = 87;
 * 20 serve it, 40 rows in 0.326 ms, but 21 do not), so a running
 * batch that dipped to 14, where plain decode wins a step by 2%, drafts:
 * plain decode there would grow it back to 24. */
static void plain_and_drafting_tiers(sd_adaptive *a, sd_accept_stats *acc, double p)
{
    /* 17-32 requests: plain 0.283-0.292 ms; one draft each, 48 rows 0.36 + 0.12 */
    static const double pts[][3] = {{24, 24, 0.283e-3}, {24, 32, 0.292e-3}, {24, 48, 0.360e-3}};
    fresh_at_14(a, acc, p);
    observe_ring(a, pts, 3, 24, 0.120e-3);
}

/* the demand pick of adaptive a (accept stats acc) for `rate` tokens a
 * second at `batch` requests is k, plain decode serving it at p requests
 * and drafting at q (0: at no measured batch) */
#define ASSERT_DEMAND(a, acc, rate, batch, k, p, q)                                        \
    do {                                                                                   \
        int bp_ = -1, bk_ = -1;                                                            \
        ASSERT_EQ(sd_adaptive_demand_k(&(a), &(acc), rate, batch, &bp_, &bk_), k);         \
        ASSERT_EQ(bp_, p);                                                                 \
        ASSERT_EQ(bk_, q);                                                                 \
    } while (0)

/* A drafting step is priced at its phase and its verify step timed apart,
 * each waited for (only such phases give the two times), while in steady
 * state the phase runs ahead and its verify step is queued behind it (read
 * in session 44 as why fixed k = 2 ran 0.79-0.91x plain's TPOT under
 * Poisson load on an H100 where adaptive k ran ~1.00x; measured in session
 * 48, the interval was 0.01 ms longer than the two: NOTES.md). A step
 * whose drafts stayed on the device is timed from the step before's
 * tokens to its own, as a queued-ahead plain step is, and what that hides
 * of the price (or adds to it) is taken off drafting's. */
TEST(a_step_whose_drafts_stay_on_the_device_is_priced_at_its_interval)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh_at_14(&a, &acc, 0.89);
    /* 14 x 1.89 in 0.332 + 0.095 ms: 62 a ms against plain's 68 */
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 0);
    ASSERT_DEMAND(a, acc, 60e3, 14, 0, 13, 14);
    /* steps of 14 drafting one each ahead took 0.36 ms: 0.067 hidden (a
     * point is trusted from its third time) */
    for (int i = 0; i < SD_CURVE_TRUST - 1; i++)
        sd_adaptive_observe_draft_ahead(&a, 14, 14, 1, 0.360e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 0);
    sd_adaptive_observe_draft_ahead(&a, 14, 14, 1, 0.360e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 1); /* 73.5 a ms */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 14, 14), 1);
    /* and the demand pick reads it: 60 a ms served by plain decode at
     * 13, by every request drafting at 10 (20 rows, priced as 24, 0.269 +
     * 0.028 ms: 64 a ms), where before the hide it took 14 (13: 26 rows,
     * priced as 32, 0.332 + 0.095: 58) */
    ASSERT_DEMAND(a, acc, 60e3, 14, 1, 13, 10);
    /* not where plain steps are not priced queued ahead (a CPU's engine) */
    a.ahead = 0;
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 0);
    a.ahead = 1;
    /* another bucket's steps are priced as before */
    sd_adaptive b;
    sd_accept_stats bcc;
    drafting_at_30_does_not_pay(&b, &bcc);
    for (int i = 0; i < SD_CURVE_RING; i++)
        sd_adaptive_observe_draft_ahead(&b, 14, 14, 1, 0.300e-3);
    ASSERT_EQ(sd_adaptive_best_k(&b, &bcc, 30), 0);
    ASSERT_EQ(sd_adaptive_best_k(&b, &bcc, 14), 1);
    /* the hide never ages: the prices at 14 measured again after the
     * curves' points aged out still take it */
    for (int i = 0; i < SD_CURVE_FRESH + 1; i++)
        sd_adaptive_observe_ahead(&a, 64, 64, 0.400e-3, 0);
    ASSERT(!sd_adaptive_informed(&a, 14));
    fresh_at_14_prices(&a);
    ASSERT(sd_adaptive_informed(&a, 14));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 1);
    /* a step ahead that took longer than its price makes drafting dearer:
     * a draft of 0.03 ms pays (0.362 ms, 73 a ms), ahead in 0.45 it does
     * not (59) */
    sd_adaptive c;
    sd_accept_stats ccc;
    static const double pts[][3] = {{14, 14, 0.205e-3}, {14, 28, 0.332e-3}};
    fresh_accepting(&c, &ccc, 0.89);
    c.ahead = 1;
    observe_ring(&c, pts, 2, 14, 0.030e-3);
    ASSERT_EQ(sd_adaptive_best_k(&c, &ccc, 14), 1);
    for (int i = 0; i < SD_CURVE_RING; i++)
        sd_adaptive_observe_draft_ahead(&c, 14, 14, 1, 0.450e-3);
    ASSERT_EQ(sd_adaptive_best_k(&c, &ccc, 14), 0);
    /* never under the verify step alone: a hide past the whole phase
     * prices the step at its target rows (14 x 1.89 / 0.332 = 80) */
    sd_adaptive d;
    sd_accept_stats dcc;
    fresh_at_14(&d, &dcc, 0.5);
    ASSERT_EQ(sd_adaptive_best_k(&d, &dcc, 14), 0);
    for (int i = 0; i < SD_CURVE_RING; i++)
        sd_adaptive_observe_draft_ahead(&d, 14, 14, 1, 0.100e-3);
    /* 14 x 1.5 / 0.332 = 63 against plain's 68 */
    ASSERT_EQ(sd_adaptive_best_k(&d, &dcc, 14), 0);
}

/* The gap after a cohort: the least after one whose verdict held, doubled
 * after each that ended plain within SD_COHORT_HELD steps, up to
 * SD_COHORT_GAP (NOTES.md, session 48) */
TEST(a_cohort_that_ends_plain_doubles_the_gap_to_the_next)
{
    sd_cohort_gap g = {0};
    /* no cohort yet: nothing to judge */
    sd_cohort_gap_verdict(&g, 10, 1);
    ASSERT_EQ(g.gap, 0);
    /* ended at step 100, off 4 steps later: the next from 356, then 512 */
    ASSERT_EQ(sd_cohort_gap_end(&g, 100), 100 + SD_COHORT_GAP_MIN);
    sd_cohort_gap_verdict(&g, 101, 0);
    sd_cohort_gap_verdict(&g, 104, 1);
    ASSERT_EQ(g.gap, 2 * SD_COHORT_GAP_MIN);
    /* the verdict is the first turn off only */
    sd_cohort_gap_verdict(&g, 105, 1);
    ASSERT_EQ(g.gap, 2 * SD_COHORT_GAP_MIN);
    uint64_t at = 1000;
    uint64_t gap = 2 * SD_COHORT_GAP_MIN;
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ(sd_cohort_gap_end(&g, at), at + gap);
        sd_cohort_gap_verdict(&g, at + SD_COHORT_HELD, 1); /* (the last step that counts) */
        gap = 2 * gap < SD_COHORT_GAP ? 2 * gap : SD_COHORT_GAP;
        ASSERT_EQ(g.gap, gap);
        at += 10000;
    }
    ASSERT_EQ(g.gap, SD_COHORT_GAP);
    /* one that held: the least again, and a turn off long after is no verdict */
    ASSERT_EQ(sd_cohort_gap_end(&g, at), at + SD_COHORT_GAP);
    sd_cohort_gap_verdict(&g, at + 1, 0);
    ASSERT_EQ(g.gap, SD_COHORT_GAP);
    sd_cohort_gap_verdict(&g, at + SD_COHORT_HELD + 1, 0);
    ASSERT_EQ(g.gap, SD_COHORT_GAP_MIN);
    sd_cohort_gap_verdict(&g, at + SD_COHORT_HELD + 2, 1);
    ASSERT_EQ(g.gap, SD_COHORT_GAP_MIN);
    ASSERT_EQ(sd_cohort_gap_end(&g, at + 5000), at + 5000 + SD_COHORT_GAP_MIN);
}

/* A fresh controller (plain priced queued ahead) whose 2000 drafts of 4
 * were each accepted with probability p given the ones before, at 12
 * requests: plain decode 0.201 ms, one draft each 24 rows in 0.313 ms and
 * the phase 0.115 (the bundled model's MTP under Poisson arrivals on an
 * H100, c = 16) */
static void at_12_one_draft(sd_adaptive *a, sd_accept_stats *acc, double p)
{
    fresh(a, acc);
    a->ahead = 1;
    for (int i = 0; i < 2000; i++) {
        double u = (i + 0.5) / 2000, pj = 1;
        int n = 0;
        while (n < 4 && u < (pj *= p))
            n++;
        sd_accept_stats_add(acc, 4, n);
    }
    static const double pts[][3] = {{12, 12, 0.201e-3}, {12, 24, 0.313e-3}};
    observe_ring(a, pts, 2, 12, 0.115e-3);
}

/* SD_CURVE_RING steps of every one of 12 requests drafting k: `rows` target
 * rows in t, the phase in td */
static void at_12_drafting(sd_adaptive *a, int k, double t, double td)
{
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(a, 12, 12 * (1 + k), t);
        sd_adaptive_observe_draft(a, 12, k, td);
    }
}

/* Where a cohort settles and the pick says plain, the deeper k are measured
 * before the verdict (the same stream: one draft each 54 tokens a ms
 * against plain's 59.7, two 58.7, three 64.1; the pick looks one k past
 * the measured ones only, and the cohort ended plain; NOTES.md, session
 * 49) */
TEST(a_cohort_settle_measures_the_deeper_k_before_its_verdict)
{
    sd_adaptive a;
    sd_accept_stats acc;
    at_12_one_draft(&a, &acc, 0.87);
    ASSERT(sd_adaptive_informed(&a, 12));
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 12), 0);
    ASSERT_EQ(sd_adaptive_measure_k(&a, &acc, 12, 12), 2);
    at_12_drafting(&a, 2, 0.318e-3, 0.240e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 12), 0);
    ASSERT_EQ(sd_adaptive_measure_k(&a, &acc, 12, 12), 3);
    at_12_drafting(&a, 3, 0.343e-3, 0.291e-3);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 12), 3);
    /* every k measured: nothing left to measure */
    at_12_drafting(&a, 4, 0.364e-3, 0.377e-3);
    ASSERT_GE(sd_adaptive_best_k(&a, &acc, 12), 3);
    ASSERT_EQ(sd_adaptive_measure_k(&a, &acc, 12, 12), 0);
    /* drafts rarely accepted: at one draft's price even four drafts'
     * tokens do not beat plain decode, and nothing deeper is measured */
    sd_adaptive b;
    sd_accept_stats bcc;
    at_12_one_draft(&b, &bcc, 0.3);
    ASSERT_EQ(sd_adaptive_best_k(&b, &bcc, 12), 0);
    ASSERT_EQ(sd_adaptive_measure_k(&b, &bcc, 12, 12), 0);
    /* nor at a batch with no price */
    ASSERT_EQ(sd_adaptive_measure_k(&b, &bcc, 40, 40), 0);
}

/* The settle the engine runs (sd_adaptive_settle_k) on the same stream:
 * each k it drafts is measured at the prices that stream's steps had, and
 * it ends on a measured k = 3 or deeper, every k up to it measured on the
 * way; where drafts are rarely accepted it leaves the cohort's k
 * (-1) and measures nothing. */
TEST(a_settle_drafts_each_deeper_k_until_the_pick_decides_on_measured_prices)
{
    /* (k: its target step, its drafting phase) */
    static const double price[5][2] = {{0, 0},
                                       {0.313e-3, 0.115e-3},
                                       {0.318e-3, 0.240e-3},
                                       {0.343e-3, 0.291e-3},
                                       {0.364e-3, 0.377e-3}};
    sd_adaptive a;
    sd_accept_stats acc;
    at_12_one_draft(&a, &acc, 0.87);
    int measured[5] = {0, 1, 0, 0, 0}, k = -1, measuring = 0, steps = 0;
    for (; steps < 64; steps++) {
        k = sd_adaptive_settle_k(&a, &acc, 12, 12, &measuring);
        ASSERT(k >= -1 && k <= 4);
        if (measuring) {
            ASSERT(!measured[k]); /* (each deeper k once) */
            ASSERT(!a.exploring);
        }
        if (k > 0 && (measuring || a.exploring || a.refresh_at)) {
            at_12_drafting(&a, k, price[k][0], price[k][1]);
            measured[k] = 1;
            continue;
        }
        if (!a.exploring && !a.refresh_at)
            break;
        sd_adaptive_observe_target(&a, 12, 12, 0.201e-3); /* (a plain measuring step) */
    }
    ASSERT(steps < 64);
    ASSERT_EQ(measuring, 0);
    ASSERT_GE(k, 3);
    for (int j = 1; j <= k; j++)
        ASSERT_MSG(measured[j], "k = %d was not measured before the verdict", j);
    /* drafts rarely accepted: the cohort's own k stands, nothing measured */
    sd_adaptive b;
    sd_accept_stats bcc;
    at_12_one_draft(&b, &bcc, 0.3);
    int ended = 0;
    for (int i = 0; i < 8 && !ended; i++) {
        const int bk = sd_adaptive_settle_k(&b, &bcc, 12, 12, &measuring);
        ASSERT_EQ(measuring, 0);
        if (!b.exploring && !b.refresh_at) {
            ASSERT_EQ(bk, -1);
            ended = 1;
            continue;
        }
        ASSERT(bk >= 0);
        sd_adaptive_observe_target(&b, 12, 12 * (1 + bk), bk ? price[bk][0] : 0.201e-3);
        if (bk)
            sd_adaptive_observe_draft(&b, 12, bk, price[bk][1]);
    }
    ASSERT(ended);
}

/* A stream's first prices at 11-13 requests (bucket 16: 16 / 24 / 40 rows
 * in 0.217 / 0.308 / 0.497 ms, nearly in proportion to the rows, so lent
 * to larger batches), then the batch grows to 18 with every step queued
 * ahead (EAGLE-3 at c = 32 on an H100; NOTES.md, session 49): one draft
 * each at 18 is priced on bucket 16's 40-row point, and once that is old
 * it is stale there too, so an arrival's admission measures again where
 * the contexts moved. (A CPU's curves are lent so; a GPU's no longer are:
 * the next test.) */
TEST(a_lent_draft_price_goes_stale_like_an_own_one)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh_accepting(&a, &acc, 0.76);
    a.ahead = 1;
    a.keys = 12 * 100.0; /* the contexts its draft was priced at */
    sd_adaptive_pick_k(&a, &acc, 12, 12);
    static const double pts[][3] = {{12, 12, 0.217e-3}, {12, 24, 0.308e-3}, {13, 39, 0.497e-3}};
    observe_ring(&a, pts, 3, 12, 0.070e-3);
    sd_adaptive_pick_k(&a, &acc, 12, 12); /* (its exploration's end: the gap counts from it) */
    ASSERT(!a.exploring && a.refreshed);
    ASSERT(sd_adaptive_informed(&a, 18)); /* (bucket 16's curve, lent) */
    ASSERT(!sd_adaptive_draft_stale(&a, 18));
    for (int i = 0; i < 100; i++)
        sd_adaptive_observe_ahead(&a, 18, 18, 0.280e-3, 18 * 100.0);
    ASSERT(sd_adaptive_draft_stale(&a, 18));
    /* the same contexts: not measured again before the gap */
    a.keys = 18 * 110.0;
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 18, 1, 1, 0), 1);
    ASSERT_EQ(a.refresh_at, 0);
    /* contexts twice as long: measured again */
    a.keys = 18 * 200.0;
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 18, 1, 1, 0), 0);
    ASSERT(a.refresh_at != 0);
}

/* EAGLE-3 at c = 32 on an H100 (NOTES.md, session 51): a stream's first
 * prices at 10-12 requests, 10 / 20 / 30 rows in 0.202 / 0.306 / 0.402 ms
 * (bucket 16, rising in proportion to its rows), were lent to every batch
 * of 17-30: one draft each read as slower than plain, and the arrivals
 * were admitted off for ~2000 steps (1.00x plain, where the runs that
 * measured those batches ran 0.72x). On a GPU (own_buckets) a batch of
 * bucket 32 is not informed until its own steps are measured, so it
 * explores; a CPU's engine still lends the curve. */
TEST(a_gpu_bucket_is_not_lent_a_smaller_buckets_proportional_curve)
{
    static const double pts[][3] = {{10, 10, 0.202e-3}, {10, 20, 0.306e-3}, {10, 30, 0.402e-3}};
    for (int gpu = 0; gpu < 2; gpu++) {
        sd_adaptive a;
        sd_accept_stats acc;
        fresh_accepting(&a, &acc, 0.76);
        a.ahead = 1;
        a.own_buckets = gpu;
        observe_ring(&a, pts, 3, 10, 0.069e-3);
        ASSERT(sd_adaptive_informed(&a, 10));
        ASSERT_EQ(sd_adaptive_informed(&a, 18), !gpu);
        ASSERT_EQ(sd_adaptive_informed(&a, 30), !gpu);
        /* an arrival at 18 (1 drafting) is admitted off on the lent
         * prices only: on a GPU it tracks the proposer and is measured */
        a.keys = 18 * 100.0;
        ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 18, 1, 1, 0), !gpu);
        /* and the pick at 18 explores there */
        sd_adaptive_pick_k(&a, &acc, 18, 18);
        ASSERT_EQ(a.exploring, gpu);
    }
}

TEST(a_steady_stream_drafts_where_drafting_serves_its_rate_with_fewer_requests)
{
    sd_adaptive a;
    sd_accept_stats acc;
    plain_and_drafting_tiers(&a, &acc, 0.89);
    /* a step at 14: plain (14 in 0.205 ms, 68 a ms; drafting 62) */
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 14), 0);
    /* (drafting: 20 serve it, 40 rows; 21 do not, 42 rows priced as 48:
     * 82.7 a ms) */
    ASSERT_DEMAND(a, acc, 83e3, 14, 1, 24, 22);
    /* a rate both serve at the least measured batch, 9 (plain: 9 in
     * 0.205 ms; one draft each: 18 rows between 14's and 28's and the
     * draft, 9 x 1.89 / 0.363 = 47): no fewer requests */
    ASSERT_DEMAND(a, acc, 34e3, 14, 0, 9, 9);
    /* a rate no measured batch serves: no opinion */
    ASSERT_DEMAND(a, acc, 500e3, 14, 0, 0, 0);
    /* none asked for, or not priced queued ahead (a CPU's engine) */
    ASSERT_EQ(sd_adaptive_demand_k(&a, &acc, 0, 14, NULL, NULL), 0);
    a.ahead = 0;
    ASSERT_EQ(sd_adaptive_demand_k(&a, &acc, 83e3, 14, NULL, NULL), 0);
    /* drafts rarely accepted: drafting serves 83 a ms at no batch up to 28 */
    sd_adaptive c;
    sd_accept_stats ccc;
    plain_and_drafting_tiers(&c, &ccc, 0.15);
    int bp = -1, bk = -1;
    ASSERT_EQ(sd_adaptive_demand_k(&c, &ccc, 83e3, 14, &bp, &bk), 0);
    ASSERT_EQ(bp, 24);
}

/* A tier of the step's price the demand falls in (the bundled model's MTP
 * at c = 64 on an H100, its decode steps serving ~90 tokens/ms; NOTES.md,
 * session 46): plain decode's 17-24 rows take 0.218 ms, 25-32 rows 0.291.
 * At 20-24 requests plain decode serves 90 a ms, at 25-26 it does not
 * (86, 89), so a batch that grows past 24 grows on to 27: it serves the
 * rate at 27, not at 20. Every request drafting one (40-48 rows 0.330 ms
 * and its draft 0.12: 22 x 1.89 / 0.45 = 92) serves it at 22. */
TEST(a_policy_serves_the_rate_where_every_larger_measured_batch_does)
{
    sd_adaptive a;
    sd_accept_stats acc;
    static const double pts[][3] = {{24, 16, 0.205e-3}, {24, 24, 0.218e-3}, {24, 32, 0.291e-3},
                                     {24, 40, 0.330e-3}, {24, 48, 0.330e-3}};
    priced(&a, &acc, pts, 5, 24, 0.120e-3);
    ASSERT_DEMAND(a, acc, 90e3, 16, 1, 27, 22);
    /* a rate plain decode serves below the tier and above it (80 a ms: at
     * 18 in 0.218 ms, 83; at 25 in 0.291, 86): at 18, fewer than
     * drafting's 20 (20 x 1.89 / 0.45 = 84; 19: 80) */
    ASSERT_DEMAND(a, acc, 80e3, 16, 0, 18, 20);
}

/* The tier rule reads a bucket's own prices only: at 44 requests the scan
 * reaches 128, and the 65-128 bucket, never measured, is lent the 33-64
 * one's curve (0.73 ms a step at 65 requests here: 89 tokens/ms); read as
 * a measured tier, plain decode "served" 90 tokens/ms from 66 requests,
 * not from 27 (0.291 ms at 25-32 requests, 0.30-0.33 at 33-64). */
TEST(the_tier_rule_reads_a_buckets_own_prices_only)
{
    sd_adaptive a;
    sd_accept_stats acc;
    static const double pts[][3] = {{24, 24, 0.218e-3}, {24, 32, 0.291e-3}, {44, 40, 0.300e-3},
                                     {44, 48, 0.310e-3}, {44, 56, 0.320e-3}, {44, 64, 0.330e-3},
                                     {44, 88, 0.400e-3}};
    priced(&a, &acc, pts, 7, 44, 0.150e-3);
    int bp = -1;
    ASSERT_EQ(sd_adaptive_demand_k(&a, &acc, 90e3, 44, &bp, NULL), 0);
    ASSERT_EQ(bp, 27);
}

/* Where plain decode is not measured at the batch drafting would serve the
 * rate at, nothing is known: a CPU engine's first steps (random-weight
 * MTP, drafts never accepted) at 4 requests, plain 4 rows 3.4 ms, one
 * draft each 8 rows 23.6 ms + 3.7: at a rate of 0.1 tokens/ms drafting's 3
 * requests (6 rows, priced between 4 and 8) beat plain's 4, the least
 * batch plain was measured at, and it drafted (under load, 112 drafting
 * steps that stopped launch ahead for the whole batch). */
TEST(the_demand_pick_wants_plain_decode_measured_where_drafting_serves_the_rate)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh(&a, &acc);
    a.ahead = 1;
    for (int i = 0; i < 16; i++)
        sd_accept_stats_add(&acc, 1, 0);
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(&a, 4, 4, 3.4e-3);
        sd_adaptive_observe_target(&a, 4, 8, 23.6e-3);
        sd_adaptive_observe_draft(&a, 4, 1, 3.7e-3);
    }
    /* (drafting: 5 and 6 requests, 10 and 12 rows, lent the batch-4
     * bucket's prices, serve 77 and 92 a second: a lent price does not say
     * the rate goes unserved) */
    ASSERT_DEMAND(a, acc, 100, 4, 0, 4, 3);
    /* and where plain decode is measured at no batch, nothing either */
    sd_adaptive b;
    sd_accept_stats bcc;
    fresh_accepting(&b, &bcc, 0.9);
    b.ahead = 1;
    for (int i = 0; i < SD_CURVE_RING; i++) {
        sd_adaptive_observe_target(&b, 16, 32, 0.30e-3);
        sd_adaptive_observe_draft(&b, 16, 1, 0.05e-3);
    }
    int bp = -1, bk = -1;
    ASSERT_EQ(sd_adaptive_demand_k(&b, &bcc, 30e3, 16, &bp, &bk), 0);
    ASSERT_EQ(bp, 0);
}

/* A steady stream of arrivals while speculation is off (the bundled model
 * at 16 requests under Poisson arrivals on an H200: its draft price is
 * always stale there, and a refresh started at each arrival, 360 in 9000
 * steps, each ~6 steps not queued ahead: 25-30% slower a token than plain;
 * NOTES.md, session 32): a stale draft price refreshes at most once in
 * SD_ADAPT_REFRESH_GAP steps, and the arrivals in between start off. */
TEST(a_stream_of_arrivals_refreshes_a_stale_draft_price_once_in_a_while)
{
    sd_adaptive a;
    sd_accept_stats acc;
    fresh_accepting(&a, &acc, 0.9);
    /* one draft: 32 x 1.9 tokens in 0.45 + 0.18 ms (96.5 a ms); plain 32
     * in 0.30 (106.7): plain */
    a.keys = 32 * 150.0; /* the running requests' contexts: 150 keys each */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 1); /* exploring */
    prices32(&a, 0.450e-3, 0.180e-3, 0.300e-3);
    ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    const int steps = 4 * SD_ADAPT_REFRESH_GAP;
    int refreshes = 0, off = 0, arrivals = 0;
    uint64_t last = 0;
    for (int st = 0; st < steps; st++) {
        if (a.refresh_at) { /* the engine's picks measure a draft, then a plain step */
            if (sd_adaptive_pick_k(&a, &acc, 32, 32)) {
                sd_adaptive_observe_target(&a, 32, 64, 0.450e-3);
                sd_adaptive_observe_draft(&a, 32, 1, 0.180e-3);
            } else {
                sd_adaptive_observe_target(&a, 32, 32, 0.300e-3);
            }
        } else {
            sd_adaptive_observe_target(&a, 32, 32, 0.300e-3);
        }
        if (st % 3)
            continue;
        const uint64_t before = a.refresh_at;
        off += sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 0);
        arrivals++;
        if (!before && a.refresh_at) {
            if (refreshes)
                ASSERT_GE(a.steps - last, (uint64_t)SD_ADAPT_REFRESH_GAP);
            last = a.steps;
            refreshes++;
        }
    }
    fprintf(stderr, "  %d refreshes in %d steps; %d of %d arrivals started off\n", refreshes,
            steps, off, arrivals);
    /* the price kept fresh (one refresh a gap), and nearly all arrivals off */
    ASSERT_GE(refreshes, 3);
    ASSERT_LE(refreshes, 4);
    ASSERT_GE(off, arrivals - 4 * refreshes);
    /* arrivals at contexts less than half as long as the draft was priced
     * at measure again at once; a third shorter does not */
    ASSERT(!a.refresh_at);
    a.keys = 32 * 100.0;
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 0), 1);
    ASSERT(!a.refresh_at);
    a.keys = 32 * 70.0;
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 0), 0);
    ASSERT(a.refresh_at != 0);
    remeasure_short(&a, &acc);
    /* a burst after idle at the contexts just priced starts off, as the
     * next one would (waves of requests of one length: a bench's repeats);
     * one at contexts twice as long measures again */
    prices32(&a, 0.450e-3, 0.180e-3, 0.300e-3); /* plain again */
    ASSERT_EQ(sd_adaptive_pick_k(&a, &acc, 32, 32), 0);
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 1), 1);
    ASSERT(!a.refresh_at);
    a.keys = 32 * 150.0;
    ASSERT_EQ(sd_adaptive_admit_off(&a, &acc, 32, 32, 1, 1), 0);
    ASSERT(a.refresh_at != 0);
}

/* Bursts of 32 requests of one length, one after another (the decode
 * bench's repeats: 512 tokens, ~513 steps each, and a warm-up), where
 * drafting does not pay (sampled at batch 32 on the bundled model, one
 * draft a tie at best; here 48 tokens in 0.63 ms against plain's 32 in
 * 0.30). The first burst explores and goes plain; the next ones, at the
 * contexts the draft was priced at, keep that verdict: a refresh costs ~6
 * steps not queued ahead (~1% of a burst), and with a gap of 512 steps
 * every burst after the first paid one (0.993-0.996 of plain in the bench;
 * NOTES.md, session 34). The points the verdict stands on stay trusted as
 * long (at 1024 steps the third burst explored again). Once the gap has
 * passed, a burst at the same contexts measures again; so does one whose
 * contexts moved. */
TEST(bursts_of_one_length_at_a_verdict_of_plain_keep_it)
{
    enum { STEPS = 540 };
    sd_adaptive a;
    sd_accept_stats acc;
    fresh_accepting(&a, &acc, 0.5);
    a.ahead = 1;
    int zeros = 0;
    for (int burst = 0; burst < 6; burst++) {
        const double ctx0 = burst < 5 ? 150 : 600; /* the last one's prompts are longer */
        a.keys = 32 * ctx0;
        const uint64_t at = a.steps;
        int tracking = 0;
        for (int i = 0; i < 32; i++)
            tracking += !sd_adaptive_admit_off(&a, &acc, 32, 32, zeros >= SD_SPEC_OFF_AFTER, i == 0);
        const int refresh = a.refresh_at != 0;
        int explored = 0, drafted = 0;
        for (int st = 0; st < STEPS; st++) {
            a.keys = 32 * (ctx0 + st);
            if (!tracking) {
                sd_adaptive_observe_ahead(&a, 32, 32, 0.300e-3, a.keys);
                continue;
            }
            const int k = sd_adaptive_pick_k(&a, &acc, 32, tracking);
            explored |= a.exploring;
            if (k > 0) {
                sd_adaptive_observe_target(&a, 32, 32 + tracking * k, 0.450e-3);
                sd_adaptive_observe_draft(&a, tracking, k, 0.180e-3);
                drafted++;
            } else {
                sd_adaptive_observe_target(&a, 32, 32, 0.330e-3);
            }
            /* the engine's count of zeros: speculation off after 4 */
            zeros = k == 0 && !a.exploring ? zeros + 1 : 0;
            if (zeros == SD_SPEC_OFF_AFTER)
                tracking = 0;
        }
        fprintf(stderr, "  burst %d at step %llu: %s, %s, %d drafting steps\n", burst,
                (unsigned long long)at, refresh ? "refreshed" : "no refresh",
                explored ? "explored" : "no exploration", drafted);
        ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
        ASSERT_GE(zeros, SD_SPEC_OFF_AFTER);
        if (burst == 0) {
            ASSERT(explored);
        } else if (at < SD_ADAPT_REFRESH_GAP) { /* the same contexts: the verdict holds */
            ASSERT(!refresh);
            ASSERT(!explored);
            ASSERT_EQ(drafted, 0);
        } else { /* the gap passed (bursts 4 and 5), or the contexts moved (5): again */
            ASSERT(refresh || explored);
            ASSERT_GT(drafted, 0);
        }
    }
}

/* tokens per second of plain decode and of the best k at each context
 * (k <= 4) over a burst of `batch` requests from c0 to c1 positions */
static void burst_rates(sim m, int batch, int c0, int c1, double *plain, double *best)
{
    double tp = 0, tb = 0;
    for (m.ctx = c0; m.ctx < c1; m.ctx++) {
        tp += batch / sim_rate(&m, batch, 0);
        double top = 0;
        for (int k = 0; k <= 4; k++)
            top = sim_rate(&m, batch, k) > top ? sim_rate(&m, batch, k) : top;
        tb += batch / top;
    }
    *plain = batch * (c1 - c0) / tp;
    *best = batch * (c1 - c0) / tb;
}

/* A draft that pays at short contexts and loses at long ones (a GPU's flat
 * step whose attention grows with each row's context: at 32 requests and
 * 0.5 acceptance one draft is +12% near 50 positions, a tie near 200,
 * -3% near 300; the draft LM on the bundled model at batch 32 was such a
 * tie, NOTES.md, session 19). Bursts of 32 requests from 40 to 560
 * positions, the controller not told the context: each drafts while it is
 * short and stops as it grows, and the next burst, short again, drafts
 * again: admitted on a draft price measured long ago, it restarts the
 * curves and measures a draft and a plain step before it chooses (the
 * prices of the last burst's end turned speculation off for whole
 * bursts). */
TEST(bursts_that_start_short_draft_again)
{
    sd_adaptive a;
    sd_accept_stats acc;
    sim m = {.base = 3e-4, .knee = 1024, .attn = 2e-8, .d_base = 2e-5, .d_per = 6e-5, .p = 0.5,
             .rng = 3};
    double plain, best;
    burst_rates(m, 32, 40, 560, &plain, &best);
    fresh(&a, &acc);
    m.engine = 1;
    for (int burst = 0; burst < 4; burst++) {
        m.ctx = 40;
        m.ctx_f = 0;
        m.zero_picks = m.one_picks = 0;
        m.secs = m.tokens = 0;
        /* the engine's admission of a burst: speculation off where the
         * last steps ran plain and the prices say drafting does not pay,
         * unless the price of drafting is old: then both are measured
         * again first */
        const int stale = sd_adaptive_draft_stale(&a, 32);
        if (burst > 0) /* the last burst ended plain, its draft priced long ago */
            ASSERT(stale);
        m.off = sd_adaptive_admit_off(&a, &acc, 32, 32, m.zero_k >= SD_SPEC_OFF_AFTER, 0);
        ASSERT(!m.off);
        run_ctx(&a, &acc, &m, 32, 1000, 560);
        const double rate = m.tokens / m.secs;
        fprintf(stderr, "  burst %d: %.3f of plain, %.3f of the best k at each context, %d / %d "
                        "picks of k = 0 / 1\n",
                burst, rate / plain, rate / best, m.zero_picks, m.one_picks);
        /* its short part drafted, its long part did not */
        ASSERT_GE(m.one_picks, 50);
        ASSERT_GE(m.zero_picks, 250);
        /* after the first (its exploration): faster than plain, near the
         * best */
        if (burst > 0) {
            ASSERT_GT(rate, plain);
            ASSERT_GE(rate, 0.98 * best);
        }
        /* at its end: plain decode */
        ASSERT_EQ(sd_adaptive_best_k(&a, &acc, 32), 0);
    }
}

TEST_MAIN(T(row_buckets_match_the_graph_buckets), T(bursts_that_start_short_draft_again),
          T(a_step_whose_drafts_stay_on_the_device_is_priced_at_its_interval),
          T(a_cohort_that_ends_plain_doubles_the_gap_to_the_next),
          T(a_lent_draft_price_goes_stale_like_an_own_one),
          T(a_gpu_bucket_is_not_lent_a_smaller_buckets_proportional_curve),
          T(a_cohort_settle_measures_the_deeper_k_before_its_verdict),
          T(a_settle_drafts_each_deeper_k_until_the_pick_decides_on_measured_prices),
          T(an_arrival_among_plain_requests_is_priced_drafting_alone),
          T(a_plain_batch_that_grew_admits_a_cohort_where_every_request_drafting_pays),
          T(a_steady_stream_drafts_where_drafting_serves_its_rate_with_fewer_requests),
          T(the_demand_pick_wants_plain_decode_measured_where_drafting_serves_the_rate),
          T(a_policy_serves_the_rate_where_every_larger_measured_batch_does),
          T(the_tier_rule_reads_a_buckets_own_prices_only),
          T(bursts_of_one_length_at_a_verdict_of_plain_keep_it),
          T(a_stream_of_arrivals_refreshes_a_stale_draft_price_once_in_a_while),
          T(drafting_timed_only_where_adaptive_k_asks_settles_the_same),
          T(a_burst_after_idle_measures_its_prices_again),
          T(curve_ignores_one_off_costs_and_interpolates),
          T(flat_gpu_cost_drafts_deep_despite_capture_spikes),
          T(the_choice_and_its_neighbours_are_measured_not_interpolated),
          T(linear_cpu_cost_with_poor_acceptance_does_not_draft),
          T(a_proportional_cpu_curve_is_not_explored_again_as_the_batch_grows),
          T(a_larger_batch_is_explored_before_it_is_judged),
          T(rows_of_more_requests_are_priced_on_their_own_batch_curve),
          T(fewer_drafting_requests_are_priced_by_a_larger_buckets_phases),
          T(a_stale_point_measured_again_is_read_at_its_new_time),
          T(a_gpu_curve_with_a_bump_is_not_lent_to_a_larger_batch),
          T(poor_acceptance_on_a_memory_bound_gpu_never_settles_below_plain),
          T(a_poor_draft_on_a_memory_bound_gpu_is_given_up_after_a_few_drafts),
          T(a_slower_machine_does_not_make_stale_points_look_cheap),
          T(deeper_k_than_measured_waits_for_its_measurement),
          T(a_fall_within_the_noise_is_not_free_rows),
          T(a_flat_gpu_curve_measured_a_little_lower_at_more_rows_stays_flat),
          T(the_hope_is_read_at_the_least_times),
          T(the_hope_looks_past_a_first_draft_that_does_not_pay_alone),
          T(a_draft_for_one_request_of_eight_must_pay_for_the_whole_step),
          T(drafts_of_a_few_steps_are_not_settled_evidence),
          T(noisy_small_gpu_steps_draft_in_most_runs),
          T(plain_decode_queued_ahead_is_priced_at_its_own_cost),
          T(plain_decode_queued_ahead_is_priced_at_the_running_contexts))

/* Synthetic acceptance (--synthetic-accept, benchmarks only): the parser's
 * errors, the accepted-length distribution against the product of the
 * per-position probabilities (with a check that the test tells the
 * conditional rule from a wrong one), and the engine hook on the bundled
 * model with MTP drafts: 1.0 accepts every draft, 0.0 none and then emits
 * exactly what plain decode emits (greedy and sampled), 0.8,0.5 is measured
 * near those rates. */
#include <pthread.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/util.h"
#include "engine/engine.h"
#include "test.h"
#include "engine/engine_run.h"
#include "verify/chisq.h"
#include "verify/synthetic.h"

/* ------------------------------------------------------------------ parsing */

TEST(parse_refuses_bad_lists_with_a_message_naming_the_value)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"1.5", "value 1 ('1.5') is not a probability"},
        {"0.5,-0.1", "value 2 ('-0.1')"},
        {"0.5,abc", "value 2 ('abc')"},
        {"0.5,,0.3", "value 2 is empty"},
        {"0.5,", "value 2 is empty"},
        {",0.5", "value 1 is empty"},
        {"nan", "value 1 ('nan')"},
        {"inf", "value 1 ('inf')"},
        {"0.5 0.3", "value 1 ('0.5 0.3')"},
        {"0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9", "more than 16"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(bad); i++) {
        sd_synthetic s = {.n = 3};
        sd_err err = {0};
        ASSERT_EQ(sd_synthetic_parse(&s, bad[i].text, &err), SD_EINVAL);
        ASSERT_CONTAINS(err.msg, "--synthetic-accept");
        ASSERT_CONTAINS(err.msg, bad[i].want);
        ASSERT(strchr(err.msg, '\n') == NULL);
        ASSERT_EQ(s.n, 0);
    }
}

TEST(parse_reads_values_and_the_last_one_repeats)
{
    sd_synthetic s;
    sd_err err = {0};
    ASSERT_OK(sd_synthetic_parse(&s, " 0.8 , 0.5", &err));
    ASSERT_EQ(s.n, 2);
    ASSERT_NEAR(sd_synthetic_p(&s, 0), 0.8, 0);
    ASSERT_NEAR(sd_synthetic_p(&s, 1), 0.5, 0);
    ASSERT_NEAR(sd_synthetic_p(&s, 9), 0.5, 0);
    ASSERT_NEAR(sd_synthetic_mean_len(&s, 3), 1 + 0.8 + 0.4 + 0.2, 1e-12);
    ASSERT_OK(sd_synthetic_parse(&s, "0,1", &err));
    ASSERT_EQ(s.n, 2);
    ASSERT_OK(sd_synthetic_parse(&s, "0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,0.9,1",
                                 &err));
    ASSERT_EQ(s.n, 16);
    /* off */
    ASSERT_OK(sd_synthetic_parse(&s, "", &err));
    ASSERT_EQ(s.n, 0);
    ASSERT_OK(sd_synthetic_parse(&s, "  ", &err));
    ASSERT_EQ(s.n, 0);
    ASSERT_OK(sd_synthetic_parse(&s, NULL, &err));
    ASSERT_EQ(s.n, 0);
    ASSERT_EQ(sd_synthetic_accept(&s, 4, 1, 0), 0);
}

/* ------------------------------------------------------------------ the rule */

TEST(one_accepts_every_draft_and_zero_accepts_none)
{
    sd_synthetic one, zero;
    sd_err err = {0};
    ASSERT_OK(sd_synthetic_parse(&one, "1", &err));
    ASSERT_OK(sd_synthetic_parse(&zero, "0", &err));
    uint64_t seed = sd_test_seed();
    for (uint64_t t = 0; t < 5000; t++) {
        ASSERT_EQ(sd_synthetic_accept(&one, 7, seed + t, t * 3), 7);
        ASSERT_EQ(sd_synthetic_accept(&zero, 7, seed + t, t * 3), 0);
    }
    ASSERT_EQ(sd_synthetic_accept(&one, 0, seed, 0), 0);
}

TEST(outcome_depends_only_on_seed_and_position_and_k_only_truncates_it)
{
    sd_synthetic s;
    sd_err err = {0};
    ASSERT_OK(sd_synthetic_parse(&s, "0.7,0.6", &err));
    uint64_t seed = sd_test_seed();
    for (uint64_t t = 0; t < 20000; t++) {
        int a8 = sd_synthetic_accept(&s, 8, seed ^ t, t);
        ASSERT_EQ(sd_synthetic_accept(&s, 8, seed ^ t, t), a8);
        for (int k = 0; k <= 8; k++)
            ASSERT_EQ(sd_synthetic_accept(&s, k, seed ^ t, t), a8 < k ? a8 : k);
    }
}

/* P(n = j) for j < k: p_0 ... p_{j-1} (1 - p_j); P(n = k) = p_0 ... p_{k-1}. */
static void length_dist(const double *cond, int k, double *prob)
{
    double reach = 1;
    for (int j = 0; j < k; j++) {
        prob[j] = reach * (1 - cond[j]);
        reach *= cond[j];
    }
    prob[k] = reach;
}

TEST(accepted_length_follows_the_product_of_the_per_position_probabilities)
{
    sd_synthetic s;
    sd_err err = {0};
    ASSERT_OK(sd_synthetic_parse(&s, "0.8,0.5,0.9", &err));
    enum { K = 5, N = 200000 };
    uint32_t obs[K + 1] = {0};
    uint64_t seed = sd_test_seed();
    double sum = 0;
    for (int t = 0; t < N; t++) {
        /* a fresh request seed per trial, positions as a request walks them */
        int n = sd_synthetic_accept(&s, K, seed * 6364136223846793005ull + (uint64_t)t,
                                    (uint64_t)(t % 97) * 5);
        ASSERT(n >= 0 && n <= K);
        obs[n]++;
        sum += n + 1;
    }
    double cond[K], prob[K + 1];
    for (int i = 0; i < K; i++)
        cond[i] = sd_synthetic_p(&s, i);
    length_dist(cond, K, prob);
    int df = 0;
    double pv = sd_chisq_gof(obs, prob, K + 1, &df);
    fprintf(stderr, "  lengths 0..5: %u %u %u %u %u %u, chi-square p = %.3g (df %d)\n", obs[0],
            obs[1], obs[2], obs[3], obs[4], obs[5], pv, df);
    ASSERT_MSG(pv > 1e-4, "p-value %.3g", pv);
    /* the mean emitted length, 1 + accepted, is the formula's */
    double mean = sd_synthetic_mean_len(&s, K), var = 0;
    for (int j = 0; j <= K; j++)
        var += prob[j] * (j + 1 - mean) * (j + 1 - mean);
    ASSERT_NEAR(sum / N, mean, 5 * sqrt(var / N));
    /* The same counts against a wrong reading of the list (the values as
     * unconditional rates: P(n >= i+1) = P_{i+1}) must fail the same test,
     * or the test above could not tell the rules apart. */
    double wrong[K];
    for (int i = 0; i < K; i++)
        wrong[i] = i == 0 ? cond[0] : cond[i] / cond[i - 1] > 1 ? 1 : cond[i] / cond[i - 1];
    double pw[K + 1];
    length_dist(wrong, K, pw);
    ASSERT_MSG(sd_chisq_gof(obs, pw, K + 1, NULL) < 1e-9, "the wrong rule passes too");
}

/* ------------------------------------------------------------------ engine */

#define NREQ 16

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* every request's engine_out */

/* n_req (<= NREQ) requests on the bundled model (MTP drafts, k = 3 unless
 * spec is none), all submitted at once, max_tokens each (<= ENGINE_OUT_MAX); prompts of
 * 4..19 token ids. */
static int run_bundled(const char *spec, const char *synth, double temperature, uint64_t seed,
                       int n_req, int max_tokens, engine_out *outs)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return -1;
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", spec, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", "3", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "synthetic-accept", synth, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "128", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "log-level", "error", &err);
    sd_log_set_level(SD_LOG_WARN);
    sd_engine *e = NULL;
    int rc = sd_engine_create(&e, &o, &err);
    sd_opts_free(&o);
    if (rc) {
        fprintf(stderr, "  engine: %s\n", err.msg);
        return rc;
    }
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    for (int i = 0; i < NREQ; i++)
        memset(&outs[i], 0, sizeof outs[i]);
    for (int i = 0; i < n_req; i++) {
        outs[i].mu = &g_mu;
        int32_t p[32];
        int n = 4 + i % 16;
        uint64_t s = seed + (uint64_t)i * 7919u + 1;
        for (int j = 0; j < n; j++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            p[j] = (int32_t)(5 + s % 8000); /* ordinary ids of the 8192-token vocabulary */
        }
        sd_gen_params gp = {.max_tokens = max_tokens, .temperature = temperature, .top_p = 1,
                            .seed = seed + (uint64_t)i, .has_seed = 1, .ignore_eos = 1};
        if ((rc = sd_engine_submit(e, p, n, &gp, &ev, &outs[i], NULL, &err))) {
            fprintf(stderr, "  submit: %s\n", err.msg);
            sd_engine_destroy(e);
            return rc;
        }
    }
    engine_out_wait(outs, n_req, 600000);
    sd_engine_destroy(e);
    return 0;
}

static void sum_spec(const engine_out *outs, sd_spec_stats *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NREQ; i++)
        sd_spec_stats_add(t, &outs[i].st.spec);
}

static engine_out g_plain[NREQ], g_spec[NREQ];

TEST(engine_with_synthetic_one_accepts_every_draft)
{
    ASSERT_OK(run_bundled("mtp", "1.0", 0, sd_test_seed(), 4, 24, g_spec));
    sd_spec_stats t;
    sum_spec(g_spec, &t);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(g_spec[i].why, SD_FINISH_LENGTH);
        ASSERT_EQ(g_spec[i].st.completion_tokens, 24);
    }
    fprintf(stderr, "  1.0: %llu verify steps, %llu of %llu drafts accepted, mean length %.3f\n",
            (unsigned long long)t.steps, (unsigned long long)t.accepted,
            (unsigned long long)t.drafted, (double)t.emitted / (double)t.steps);
    ASSERT_GT(t.drafted, 0);
    ASSERT_EQ(t.accepted, t.drafted);
    ASSERT_EQ(t.emitted, t.drafted + t.steps);
    /* k = 3 except where the tokens left cap it (the last step or two of a request) */
    ASSERT_GT(t.proposed_at[2], t.steps - 2 * 4);
    ASSERT_EQ(t.accepted_at[2], t.proposed_at[2]);
}

/* With 0.0 every step emits only the target's own token at the first
 * position: that is plain decode, token for token, greedy and sampled (the
 * sampled token uses the stream and position plain decode uses). */
static void check_zero_is_plain(double temperature)
{
    uint64_t seed = sd_test_seed();
    ASSERT_OK(run_bundled("none", "", temperature, seed, 4, 16, g_plain));
    ASSERT_OK(run_bundled("mtp", "0", temperature, seed, 4, 16, g_spec));
    sd_spec_stats t;
    sum_spec(g_spec, &t);
    ASSERT_GT(t.drafted, 0);
    ASSERT_EQ(t.accepted, 0);
    ASSERT_EQ(t.emitted, t.steps);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(g_spec[i].n, g_plain[i].n);
        ASSERT_EQ(g_spec[i].n, 16);
        for (int j = 0; j < g_spec[i].n; j++)
            ASSERT_MSG(g_spec[i].ids[j] == g_plain[i].ids[j], "T=%g request %d token %d: %d vs %d",
                       temperature, i, j, g_spec[i].ids[j], g_plain[i].ids[j]);
    }
}

TEST(engine_with_synthetic_zero_accepts_nothing_and_emits_the_plain_greedy_output)
{
    check_zero_is_plain(0);
}

TEST(engine_with_synthetic_zero_emits_the_plain_sampled_output)
{
    check_zero_is_plain(0.8);
}

TEST(engine_measures_per_position_acceptance_near_the_given_rates)
{
    /* 12 requests x 40 tokens: ~200 verify steps */
    sd_spec_stats t;
    ASSERT_OK(run_bundled("mtp", "0.8,0.5", 0, sd_test_seed(), 12, 40, g_spec));
    sum_spec(g_spec, &t);
    /* A step that proposes draft p accepts it with probability p_0 ... p_p
     * whatever its k (the outcome of the prefix does not depend on k), and
     * no uniform is looked at twice (the next step starts past the first
     * rejection): accepted_at[p] is binomial(proposed_at[p], 0.8, 0.4, 0.2). */
    double want[3] = {0.8, 0.4, 0.2};
    for (int p = 0; p < 3; p++) {
        double trials = (double)t.proposed_at[p];
        double rate = (double)t.accepted_at[p] / trials;
        double sd = sqrt(want[p] * (1 - want[p]) / trials);
        fprintf(stderr,
                "  position %d: %.0f proposed, accepted %.3f (want %.2f +- %.3f), conditional %.3f\n",
                p, trials, rate, want[p], 4.5 * sd,
                p ? rate / ((double)t.accepted_at[p - 1] / (double)t.proposed_at[p - 1]) : rate);
        ASSERT_GT(trials, 60);
        ASSERT_NEAR(rate, want[p], 4.5 * sd);
    }
}

TEST_MAIN(T(parse_refuses_bad_lists_with_a_message_naming_the_value),
          T(parse_reads_values_and_the_last_one_repeats),
          T(one_accepts_every_draft_and_zero_accepts_none),
          T(outcome_depends_only_on_seed_and_position_and_k_only_truncates_it),
          T(accepted_length_follows_the_product_of_the_per_position_probabilities),
          T(engine_with_synthetic_one_accepts_every_draft),
          T(engine_with_synthetic_zero_accepts_nothing_and_emits_the_plain_greedy_output),
          T(engine_with_synthetic_zero_emits_the_plain_sampled_output),
          T(engine_measures_per_position_acceptance_near_the_given_rates))

#include <ctype.h>

#include "net/metrics.h"
#include "test.h"

/* The value of one series line ("name{labels} value"), or NAN when absent. */
static double series(const char *text, const char *name_labels)
{
    size_t n = strlen(name_labels);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, name_labels, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return NAN;
}

/* Every line is a comment (# HELP / # TYPE) or `name[{labels}] number`,
 * every series has a TYPE line before it, and names start specd_. */
static int well_formed(const char *text, char *why, size_t whylen)
{
    char typed[256][96];
    int n_typed = 0;
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        if (!e) {
            snprintf(why, whylen, "last line lacks a newline");
            return 0;
        }
        char line[512];
        size_t l = (size_t)(e - p);
        if (l >= sizeof line) {
            snprintf(why, whylen, "line too long");
            return 0;
        }
        memcpy(line, p, l);
        line[l] = 0;
        p = e + 1;
        if (!strncmp(line, "# HELP ", 7))
            continue;
        if (!strncmp(line, "# TYPE ", 7)) {
            char name[96], type[32];
            if (sscanf(line + 7, "%95s %31s", name, type) != 2 || strncmp(name, "specd_", 6) ||
                (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram"))) {
                snprintf(why, whylen, "bad TYPE line: %.200s", line);
                return 0;
            }
            if (n_typed < 256)
                snprintf(typed[n_typed++], 96, "%s", name);
            continue;
        }
        size_t nl = 0;
        while (line[nl] && (isalnum((unsigned char)line[nl]) || line[nl] == '_'))
            nl++;
        if (nl == 0 || strncmp(line, "specd_", 6)) {
            snprintf(why, whylen, "bad series name: %.200s", line);
            return 0;
        }
        const char *rest = line + nl;
        if (*rest == '{') {
            const char *close = strchr(rest, '}');
            if (!close) {
                snprintf(why, whylen, "unclosed labels: %.200s", line);
                return 0;
            }
            rest = close + 1;
        }
        char *end;
        if (*rest != ' ' || (strtod(rest + 1, &end), *end != 0) || end == rest + 1) {
            snprintf(why, whylen, "bad value: %.200s", line);
            return 0;
        }
        int found = 0;
        for (int i = 0; i < n_typed && !found; i++) {
            size_t tl = strlen(typed[i]);
            found = !strncmp(line, typed[i], tl) &&
                    (nl == tl || !strcmp(line + tl, "_bucket") || !strncmp(line + tl, "_bucket{", 8) ||
                     !strncmp(line + tl, "_sum ", 5) || !strncmp(line + tl, "_count ", 7));
        }
        if (!found) {
            snprintf(why, whylen, "series before its TYPE: %.200s", line);
            return 0;
        }
    }
    return 1;
}

TEST(histogram_buckets_are_cumulative_with_inf_sum_and_count)
{
    sd_metrics m;
    sd_metrics_init(&m);
    sd_req_stats st;
    memset(&st, 0, sizeof st);
    double ttfts[] = {0.003, 0.02, 0.02, 0.7, 500};
    for (int i = 0; i < 5; i++) {
        st.ttft_s = ttfts[i];
        st.total_s = ttfts[i] + 1;
        st.prompt_tokens = 10;
        st.completion_tokens = 3;
        sd_metrics_finished(&m, &st);
    }
    sd_buf b = {0};
    ASSERT_OK(sd_metrics_render(&m, NULL, &b));
    char why[256] = "";
    ASSERT_MSG(well_formed(b.p, why, sizeof why), "%s", why);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_bucket{le=\"0.005\"}"), 1, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_bucket{le=\"0.025\"}"),
                3, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_bucket{le=\"1\"}"), 4, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_bucket{le=\"120\"}"), 4, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 5, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_count"), 5, 0);
    ASSERT_NEAR(series(b.p, "specd_time_to_first_token_seconds_sum"), 500.743, 1e-9);
    ASSERT_NEAR(series(b.p, "specd_prompt_tokens_total"), 50, 0);
    ASSERT_NEAR(series(b.p, "specd_generation_tokens_total"), 15, 0);
    /* no engine: its series are absent, not zero */
    ASSERT(isnan(series(b.p, "specd_requests_running")));
    sd_buf_free(&b);
}

TEST(inter_token_latency_spreads_a_burst_over_its_tokens)
{
    sd_metrics m;
    sd_metrics_init(&m);
    sd_metrics_tokens(&m, 0.03, 3); /* three tokens in one verify step: 10 ms each */
    sd_metrics_tokens(&m, 0.5, 1);
    sd_metrics_tokens(&m, 0.2, 0); /* no token: nothing observed */
    ASSERT_EQ(m.itl.count, 4);
    ASSERT_NEAR(m.itl.sum, 0.53, 1e-12);
    sd_buf b = {0};
    ASSERT_OK(sd_metrics_render(&m, NULL, &b));
    ASSERT_NEAR(series(b.p, "specd_inter_token_latency_seconds_bucket{le=\"0.01\"}"), 3, 0);
    ASSERT_NEAR(series(b.p, "specd_inter_token_latency_seconds_bucket{le=\"0.5\"}"), 4, 0);
    sd_buf_free(&b);
}

TEST(outcomes_and_statuses_are_labelled_counters)
{
    sd_metrics m;
    sd_metrics_init(&m);
    sd_metrics_outcome(&m, SD_OUTCOME_STOP);
    sd_metrics_outcome(&m, SD_OUTCOME_CANCELLED);
    sd_metrics_outcome(&m, SD_OUTCOME_CANCELLED);
    sd_metrics_outcome(&m, SD_OUTCOME_REJECTED);
    sd_metrics_status(&m, 200);
    sd_metrics_status(&m, 413);
    sd_metrics_status(&m, 413);
    sd_metrics_status(&m, 418);
    sd_buf b = {0};
    ASSERT_OK(sd_metrics_render(&m, NULL, &b));
    ASSERT_NEAR(series(b.p, "specd_requests_total{outcome=\"stop\"}"), 1, 0);
    ASSERT_NEAR(series(b.p, "specd_requests_total{outcome=\"cancelled\"}"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_requests_total{outcome=\"rejected\"}"), 1, 0);
    ASSERT_NEAR(series(b.p, "specd_requests_total{outcome=\"error\"}"), 0, 0);
    ASSERT_NEAR(series(b.p, "specd_http_responses_total{code=\"413\"}"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_http_responses_total{code=\"other\"}"), 1, 0);
    sd_buf_free(&b);
}

TEST(engine_series_and_exact_accepted_length_histogram)
{
    sd_metrics m;
    sd_metrics_init(&m);
    /* 10 verify steps of k = 3: accepted lengths 0,0,1,1,1,2,3,3,3,3 */
    sd_engine_stats es;
    memset(&es, 0, sizeof es);
    es.queued = 2;
    es.running = 5;
    es.kv_blocks_total = 100;
    es.kv_blocks_used = 37;
    es.steps = 77;
    es.spec.steps = 10;
    es.spec.drafted = 30;
    es.spec.accepted = 17;
    es.spec.emitted = 27;
    es.spec.draft_s = 0.5;
    es.spec.verify_s = 2.0;
    for (int i = 0; i < 3; i++)
        es.spec.proposed_at[i] = 10;
    es.spec.accepted_at[0] = 8; /* steps that accepted > 0 */
    es.spec.accepted_at[1] = 5; /* > 1 */
    es.spec.accepted_at[2] = 4; /* > 2 */
    es.spec_k_steps[0] = 2;
    es.spec_k_steps[3] = 8;
    es.spec_k_last = 3;
    es.spec_exploring = 1;
    es.spec_off_running = 2;
    es.spec_eager_passes = 41;
    es.spec_graph_cache_full = 7;
    es.ahead_steps = 12;
    es.draft_ahead_steps = 5;
    es.draft_ahead_timed = 4;
    es.gemm_trials = 9;
    es.prompt_steps = 11;
    es.prompt_graph_steps = 7;
    es.spec_why_steps[1] = 6; /* explore */
    es.spec_why_idle[1] = 40;
    es.spec_why_steps[6] = 3; /* probe */
    es.spec_why_steps[8] = 2; /* cohort */
    es.spec_cohorts = 1;
    es.spec_why_idle[6] = 90;
    sd_buf b = {0};
    ASSERT_OK(sd_metrics_render(&m, &es, &b));
    char why[256] = "";
    ASSERT_MSG(well_formed(b.p, why, sizeof why), "%s", why);
    ASSERT_NEAR(series(b.p, "specd_queue_depth"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_requests_running"), 5, 0);
    ASSERT_NEAR(series(b.p, "specd_kv_blocks_used"), 37, 0);
    ASSERT_NEAR(series(b.p, "specd_kv_blocks_free"), 63, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_bucket{le=\"0\"}"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_bucket{le=\"1\"}"), 5, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_bucket{le=\"2\"}"), 6, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_bucket{le=\"+Inf\"}"), 10, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_sum"), 17, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_accepted_length_count"), 10, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_position_acceptance_rate{position=\"1\"}"), 0.5, 1e-12);
    ASSERT_NEAR(series(b.p, "specd_spec_position_accepted_total{position=\"2\"}"), 4, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_draft_step_seconds"), 0.05, 1e-12);
    ASSERT_NEAR(series(b.p, "specd_spec_verify_step_seconds"), 0.2, 1e-12);
    ASSERT(isnan(series(b.p, "specd_spec_position_proposed_total{position=\"3\"}")));
    ASSERT_NEAR(series(b.p, "specd_spec_draft_length_steps_total{k=\"0\"}"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_draft_length_steps_total{k=\"3\"}"), 8, 0);
    ASSERT(isnan(series(b.p, "specd_spec_draft_length_steps_total{k=\"1\"}")));
    ASSERT_NEAR(series(b.p, "specd_spec_draft_length"), 3, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_adaptive_exploring"), 1, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_requests_not_drafting"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_eager_passes_total"), 41, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_graph_cache_full_total"), 7, 0);
    ASSERT_NEAR(series(b.p, "specd_launch_ahead_steps_total"), 12, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_draft_ahead_steps_total"), 5, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_draft_ahead_timed_total"), 4, 0);
    ASSERT_NEAR(series(b.p, "specd_gemm_trials_total"), 9, 0);
    ASSERT_NEAR(series(b.p, "specd_prompt_steps_total"), 11, 0);
    ASSERT_NEAR(series(b.p, "specd_prompt_graph_steps_total"), 7, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_drafting_steps_total{why=\"explore\"}"), 6, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_drafting_steps_total{why=\"probe\"}"), 3, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_drafting_steps_total{why=\"cohort\"}"), 2, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_cohorts_total"), 1, 0);
    ASSERT_NEAR(series(b.p, "specd_spec_drafting_idle_requests_total{why=\"probe\"}"), 90, 0);
    ASSERT(isnan(series(b.p, "specd_spec_drafting_steps_total{why=\"best\"}")));
    sd_buf_free(&b);
}

TEST(random_histograms_stay_cumulative)
{
    uint64_t s = sd_test_seed();
    sd_metrics m;
    sd_metrics_init(&m);
    for (int i = 0; i < 2000; i++)
        sd_hist_observe(&m.e2e, sd_test_randf(&s, 0, 700), 1 + (uint64_t)sd_test_randf(&s, 0, 3));
    sd_buf b = {0};
    ASSERT_OK(sd_metrics_render(&m, NULL, &b));
    double prev = 0;
    int buckets = 0;
    for (const char *p = strstr(b.p, "specd_request_duration_seconds_bucket"); p;
         p = strstr(p + 1, "specd_request_duration_seconds_bucket")) {
        double v = strtod(strchr(p, ' ') + 1, NULL);
        ASSERT(v >= prev);
        prev = v;
        buckets++;
    }
    ASSERT_EQ(buckets, m.e2e.n + 1);
    ASSERT_NEAR(prev, (double)m.e2e.count, 0);
    sd_buf_free(&b);
}

TEST_MAIN(T(histogram_buckets_are_cumulative_with_inf_sum_and_count),
          T(inter_token_latency_spreads_a_burst_over_its_tokens),
          T(outcomes_and_statuses_are_labelled_counters),
          T(engine_series_and_exact_accepted_length_histogram),
          T(random_histograms_stay_cumulative))

#include "net/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,  5,     10,   30,  60,   120};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                    0.08,  0.1,    0.25,  0.5,  1,    2.5};
static const double e2e_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
static const double queue_bounds[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60};

static const int counted_statuses[SD_METRICS_STATUSES] = {200, 400, 401, 404, 405, 408,
                                                          413, 415, 431, 500, 501, 503};

static const char *outcome_names[SD_OUTCOME_COUNT] = {"stop",  "length",   "cancelled",
                                                      "error", "rejected", "overloaded"};

/* m is zeroed already. */
static void hist_init(sd_hist *h, const double *bounds, int n)
{
    h->bounds = bounds;
    h->n = n;
}

void sd_metrics_init(sd_metrics *m)
{
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]));
    hist_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]));
    hist_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof e2e_bounds[0]));
    hist_init(&m->queue, queue_bounds, (int)(sizeof queue_bounds / sizeof queue_bounds[0]));
}

void sd_hist_observe(sd_hist *h, double v, uint64_t weight)
{
    int i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i] += weight;
    h->sum += v * (double)weight;
    h->count += weight;
}

void sd_metrics_outcome(sd_metrics *m, sd_outcome o)
{
    if (o >= 0 && o < SD_OUTCOME_COUNT)
        m->requests[o]++;
}

void sd_metrics_status(sd_metrics *m, int status)
{
    for (int i = 0; i < SD_METRICS_STATUSES; i++)
        if (counted_statuses[i] == status) {
            m->responses[i]++;
            return;
        }
    m->responses[SD_METRICS_STATUSES]++;
}

void sd_metrics_finished(sd_metrics *m, const sd_req_stats *st)
{
    m->prompt_tokens += (uint64_t)(st->prompt_tokens > 0 ? st->prompt_tokens : 0);
    m->completion_tokens += (uint64_t)(st->completion_tokens > 0 ? st->completion_tokens : 0);
    if (st->completion_tokens > 0)
        sd_hist_observe(&m->ttft, st->ttft_s, 1);
    sd_hist_observe(&m->e2e, st->total_s, 1);
    sd_hist_observe(&m->queue, st->queued_s, 1);
}

void sd_metrics_tokens(sd_metrics *m, double dt, int n)
{
    if (n > 0)
        sd_hist_observe(&m->itl, dt / n, (uint64_t)n);
}

/* The shortest of %.15g / %.17g that reads back as v (0.025, not
 * 0.025000000000000001). */
static const char *num(char *buf, size_t n, double v)
{
    snprintf(buf, n, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, n, "%.17g", v);
    return buf;
}

static void head(sd_buf *o, const char *name, const char *type, const char *help)
{
    sd_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(sd_buf *o, const char *name, const char *type, const char *help, double v)
{
    char nb[40];
    head(o, name, type, help);
    sd_buf_printf(o, "%s %s\n", name, num(nb, sizeof nb, v));
}

static void hist(sd_buf *o, const char *name, const char *help, const sd_hist *h)
{
    char nb[40];
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        sd_buf_printf(o, "%s_bucket{le=\"%s\"} %llu\n", name, num(nb, sizeof nb, h->bounds[i]),
                      (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    sd_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    sd_buf_printf(o, "%s_sum %s\n%s_count %llu\n", name, num(nb, sizeof nb, h->sum), name,
                  (unsigned long long)h->count);
}

/* In a chain of drafts, position i is accepted only if every earlier one
 * was, so accepted_at[i] counts the verify steps that accepted more than i
 * drafts: the steps that accepted at most L are steps - accepted_at[L].
 * That makes the per-step accepted-length histogram exact from the totals. */
static void spec_series(sd_buf *o, const sd_spec_stats *s)
{
    scalar(o, "specd_spec_steps_total", "counter", "Draft-then-verify steps.", (double)s->steps);
    scalar(o, "specd_spec_draft_tokens_total", "counter", "Draft tokens proposed.",
           (double)s->drafted);
    scalar(o, "specd_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
           (double)s->accepted);
    scalar(o, "specd_spec_emitted_tokens_total", "counter",
           "Tokens emitted by verify steps (accepted drafts plus the bonus token).",
           (double)s->emitted);
    scalar(o, "specd_spec_acceptance_rate", "gauge", "Accepted over proposed draft tokens.",
           s->drafted ? (double)s->accepted / (double)s->drafted : 0.0);

    int last = -1;
    for (int i = 0; i < 16; i++)
        if (s->proposed_at[i])
            last = i;
    const char *n = "specd_spec_accepted_length";
    head(o, n, "histogram", "Draft tokens accepted per verify step.");
    uint64_t prev = 0;
    for (int L = 0; L <= last; L++) {
        uint64_t at_most = s->steps >= s->accepted_at[L] ? s->steps - s->accepted_at[L] : 0;
        if (at_most < prev)
            at_most = prev; /* keep the buckets cumulative whatever the engine reports */
        prev = at_most;
        sd_buf_printf(o, "%s_bucket{le=\"%d\"} %llu\n", n, L, (unsigned long long)at_most);
    }
    sd_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %llu\n%s_count %llu\n", n,
                  (unsigned long long)(s->steps > prev ? s->steps : prev), n,
                  (unsigned long long)s->accepted, n, (unsigned long long)s->steps);

    head(o, "specd_spec_position_proposed_total", "counter",
         "Draft tokens proposed at each draft position (0-based).");
    for (int i = 0; i <= last; i++)
        sd_buf_printf(o, "specd_spec_position_proposed_total{position=\"%d\"} %llu\n", i,
                      (unsigned long long)s->proposed_at[i]);
    head(o, "specd_spec_position_accepted_total", "counter",
         "Draft tokens accepted at each draft position (0-based).");
    for (int i = 0; i <= last; i++)
        sd_buf_printf(o, "specd_spec_position_accepted_total{position=\"%d\"} %llu\n", i,
                      (unsigned long long)s->accepted_at[i]);
    head(o, "specd_spec_position_acceptance_rate", "gauge",
         "Acceptance rate at each draft position (0-based).");
    for (int i = 0; i <= last; i++) {
        char nb[40];
        sd_buf_printf(o, "specd_spec_position_acceptance_rate{position=\"%d\"} %s\n", i,
                      num(nb, sizeof nb,
                          s->proposed_at[i]
                              ? (double)s->accepted_at[i] / (double)s->proposed_at[i]
                              : 0.0));
    }

    scalar(o, "specd_spec_draft_seconds_total", "counter", "Time spent drafting.", s->draft_s);
    scalar(o, "specd_spec_verify_seconds_total", "counter", "Time spent verifying.",
           s->verify_s);
    scalar(o, "specd_spec_draft_step_seconds", "gauge", "Mean draft time per verify step.",
           s->steps ? s->draft_s / (double)s->steps : 0.0);
    scalar(o, "specd_spec_verify_step_seconds", "gauge", "Mean verify time per verify step.",
           s->steps ? s->verify_s / (double)s->steps : 0.0);
}

/* a counter by one label: v[i] as key="name_of(i)", for the i where
 * shown[i] is not 0 */
static void label_series(sd_buf *o, const char *name, const char *help, const char *key,
                         const char *(*name_of)(int), int n, const uint64_t *shown,
                         const uint64_t *v)
{
    head(o, name, "counter", help);
    for (int i = 0; i < n; i++)
        if (shown[i])
            sd_buf_printf(o, "%s{%s=\"%s\"} %llu\n", name, key, name_of(i),
                          (unsigned long long)v[i]);
}

/* a counter by why a step drafted, for the reasons that drafted a step */
static void why_series(sd_buf *o, const char *name, const char *help, const sd_engine_stats *es,
                       const uint64_t *v)
{
    label_series(o, name, help, "why", sd_spec_why_name, SD_SPEC_WHY_N, es->spec_why_steps, v);
}

/* the draft length adaptive k (or --spec-k) chose, step by step */
static void draft_length_series(sd_buf *o, const sd_engine_stats *es)
{
    head(o, "specd_spec_draft_length_steps_total", "counter",
         "Engine steps by the draft length k they drafted (16: 16 or more).");
    for (int k = 0; k <= 16; k++)
        if (es->spec_k_steps[k])
            sd_buf_printf(o, "specd_spec_draft_length_steps_total{k=\"%d\"} %llu\n", k,
                          (unsigned long long)es->spec_k_steps[k]);
    why_series(o, "specd_spec_drafting_steps_total",
               "Engine steps that drafted, by why (best: its price; explore, refresh: measuring; "
               "hope: too few drafts to give up; neighbour, periodic: another k; probe: requests "
               "tracking the proposer while it is off; fixed: --spec-k; cohort: arrivals "
               "admitted drafting on a plain verdict; demand: the output rate served by fewer "
               "requests drafting).",
               es, es->spec_why_steps);
    why_series(o, "specd_spec_drafting_idle_requests_total",
               "Running requests of those steps that did not draft (a verify step's wait for one "
               "token), by why the step drafted.",
               es, es->spec_why_idle);
    scalar(o, "specd_spec_draft_length", "gauge",
           "Draft length k of the last engine step (-1: none drafted yet).", es->spec_k_last);
    scalar(o, "specd_spec_adaptive_exploring", "gauge",
           "1 while adaptive k measures the costs of k = 0 and 1 at the running batch.",
           es->spec_exploring);
    scalar(o, "specd_spec_requests_not_drafting", "gauge",
           "Running requests that stopped drafting (adaptive k: it does not pay at their batch).",
           es->spec_off_running);
    scalar(o, "specd_spec_eager_passes_total", "counter",
           "Proposer passes run without a CUDA graph (first of a shape, past the graph sizes, CPU).",
           (double)es->spec_eager_passes);
    scalar(o, "specd_spec_graph_cache_full_total", "counter",
           "Proposer passes run eagerly because the proposer graph cache was full.",
           (double)es->spec_graph_cache_full);
    scalar(o, "specd_spec_cohorts_total", "counter",
           "Times adaptive k admitted arrivals tracking the proposer on a verdict of plain "
           "decode: every request drafting priced to pay at their batch, or to serve the output "
           "rate with fewer requests.",
           (double)es->spec_cohorts);
    scalar(o, "specd_spec_plain_steps_total", "counter",
           "Target steps with no request drafting, run without the proposer's hidden states.",
           (double)es->spec_plain_steps);
    scalar(o, "specd_launch_ahead_steps_total", "counter",
           "Decode steps queued before the step before them was read (--launch-ahead).",
           (double)es->ahead_steps);
    scalar(o, "specd_spec_draft_ahead_steps_total", "counter",
           "Verify steps queued before their drafts reached the host, taking them on the device "
           "(--draft-ahead).",
           (double)es->draft_ahead_steps);
    scalar(o, "specd_spec_draft_ahead_timed_total", "counter",
           "Verify steps that took their drafts on the device timed from the step before's tokens "
           "(adaptive k learns what drafting ahead hides of its price from them).",
           (double)es->draft_ahead_timed);
    label_series(o, "specd_launch_ahead_refused_steps_total",
                 "Steps not queued ahead of the step before them, by the first reason found "
                 "(host_tokens: chosen on the host; arrivals: requests join; host_rows: a "
                 "request's logits go to the host; prefill: prompt rows; drafts: a verify step; "
                 "tracking: a request tracks the proposer; ending: every request ends; shape: a "
                 "running request left out).",
                 "cause", sd_ahead_cause_name, SD_AHEAD_CAUSES, es->ahead_refused,
                 es->ahead_refused);
    scalar(o, "specd_logits_host_rows_total", "counter",
           "Logits rows brought to the host: requests with logprobs, logit_bias, penalties, "
           "JSON or min_tokens (the other requests choose their tokens on the device).",
           (double)es->logits_host_rows);
    scalar(o, "specd_logits_host_steps_total", "counter",
           "Target steps that brought logits rows to the host.", (double)es->logits_host_steps);
    scalar(o, "specd_json_masks_found_total", "counter",
           "JSON masks (response_format) found in the cache of recent states.",
           (double)es->json_masks_found);
    scalar(o, "specd_json_masks_made_total", "counter",
           "JSON masks (response_format) made by a walk of the vocabulary.",
           (double)es->json_masks_made);
    scalar(o, "specd_json_schemas_compiled_total", "counter",
           "json_schema texts compiled (response_format, forced tool calls): once a text "
           "while it is in use or among the recent ones.",
           (double)es->json_schemas_compiled);
    scalar(o, "specd_json_schemas_found_total", "counter",
           "Look-ups of a json_schema that found it compiled.", (double)es->json_schemas_found);
}

int sd_metrics_render(const sd_metrics *m, const sd_engine_stats *es, sd_buf *o)
{
    head(o, "specd_requests_total", "counter", "Requests by outcome.");
    for (int i = 0; i < SD_OUTCOME_COUNT; i++)
        sd_buf_printf(o, "specd_requests_total{outcome=\"%s\"} %llu\n", outcome_names[i],
                      (unsigned long long)m->requests[i]);
    head(o, "specd_http_responses_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i <= SD_METRICS_STATUSES; i++) {
        if (i < SD_METRICS_STATUSES)
            sd_buf_printf(o, "specd_http_responses_total{code=\"%d\"} %llu\n",
                          counted_statuses[i], (unsigned long long)m->responses[i]);
        else
            sd_buf_printf(o, "specd_http_responses_total{code=\"other\"} %llu\n",
                          (unsigned long long)m->responses[i]);
    }
    scalar(o, "specd_http_connections", "gauge", "Open client connections.",
           m->connections_open);
    scalar(o, "specd_http_connections_total", "counter", "Client connections accepted.",
           (double)m->connections_total);
    scalar(o, "specd_slow_reader_closes_total", "counter",
           "Connections closed because their output buffer passed --max-output-buffer.",
           (double)m->slow_reader_closes);
    scalar(o, "specd_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           (double)m->prompt_tokens);
    scalar(o, "specd_generation_tokens_total", "counter",
           "Completion tokens of finished requests.", (double)m->completion_tokens);
    hist(o, "specd_time_to_first_token_seconds", "Submit to first token.", &m->ttft);
    hist(o, "specd_inter_token_latency_seconds", "Time between output tokens.", &m->itl);
    hist(o, "specd_request_duration_seconds", "Submit to finish.", &m->e2e);
    hist(o, "specd_request_queue_seconds", "Submit to first scheduled.", &m->queue);
    if (es) {
        scalar(o, "specd_queue_depth", "gauge", "Requests waiting for the engine.", es->queued);
        scalar(o, "specd_requests_running", "gauge", "Requests the engine is running.",
               es->running);
        scalar(o, "specd_kv_blocks_total", "gauge", "KV cache blocks.", es->kv_blocks_total);
        scalar(o, "specd_kv_blocks_used", "gauge", "KV cache blocks in use.", es->kv_blocks_used);
        scalar(o, "specd_kv_blocks_cached", "gauge",
               "KV cache blocks that hold a cached prefix and no running request (counted free: "
               "they are evicted when blocks run short).",
               es->kv_blocks_cached);
        scalar(o, "specd_prefix_cache_queried_tokens_total", "counter",
               "Prompt tokens looked up in the prefix cache at admission.",
               (double)es->prefix_queried_tokens);
        scalar(o, "specd_prefix_cache_hit_tokens_total", "counter",
               "Prompt tokens found in the prefix cache (their prefill skipped).",
               (double)es->prefix_hit_tokens);
        scalar(o, "specd_kv_blocks_free", "gauge", "KV cache blocks free.",
               es->kv_blocks_total - es->kv_blocks_used);
        scalar(o, "specd_engine_steps_total", "counter", "Engine steps.", (double)es->steps);
        scalar(o, "specd_tensor_parallel_ranks", "gauge", "Tensor-parallel ranks of the model.",
               es->tp);
        scalar(o, "specd_engine_failed_steps_total", "counter",
               "Model steps that failed (their requests ended with an error).",
               (double)es->failed_steps);
        scalar(o, "specd_gemm_trials_total", "counter",
               "GEMM algorithm trials run (a host stall of a few ms each on a GPU: a matrix shape "
               "and row count met the first time).",
               (double)es->gemm_trials);
        scalar(o, "specd_prompt_steps_total", "counter",
               "Target steps with prompt rows (prefill chunks, with or without decode rows).",
               (double)es->prompt_steps);
        scalar(o, "specd_prompt_graph_steps_total", "counter",
               "Target steps with prompt rows replayed from a CUDA graph (the rest ran eagerly).",
               (double)es->prompt_graph_steps);
        if (es->allreduce_metrics && es->allreduce_metrics[0])
            sd_buf_printf(o, "%s", es->allreduce_metrics);
        spec_series(o, &es->spec);
        draft_length_series(o, es);
    }
    return o->oom ? SD_ENOMEM : 0;
}

/* bench/serve/report: the JSON records and the closing table. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/serve/bench.h"

static json_t *real(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* mean/median/p90/p99/min/max of one distribution, seconds -> ms keys. */
static void dist_ms(json_t *o, const char *what, const sd_bench_dist *d)
{
    char k[64];
    static const char *const names[] = {"mean", "median", "p90", "p99", "min", "max"};
    const double v[] = {d->mean, d->p50, d->p90, d->p99, d->min, d->max};
    for (int i = 0; i < 6; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", names[i], what);
        json_object_set_new(o, k, d->n ? real(v[i] * 1e3) : json_null());
    }
    snprintf(k, sizeof k, "n_%s", what);
    json_object_set_new(o, k, json_integer(d->n));
}

json_t *sd_bench_summary_json(const sd_bench_summary *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "requests", json_integer(s->requests));
    json_object_set_new(o, "completed", json_integer(s->completed));
    json_object_set_new(o, "failed", json_integer(s->failed));
    json_t *by = json_object();
    for (int i = 0; i < SD_BENCH_STATUS_COUNT; i++)
        if (s->by_status[i])
            json_object_set_new(by, sd_bench_status_name((sd_bench_status)i),
                                json_integer(s->by_status[i]));
    json_object_set_new(o, "by_status", by);
    json_object_set_new(o, "duration_s", real(s->duration_s));
    json_object_set_new(o, "total_input_tokens", json_integer(s->input_tokens));
    json_object_set_new(o, "total_output_tokens", json_integer(s->output_tokens));
    json_object_set_new(o, "output_tokens_from_usage", json_integer(s->output_tokens_from_usage));
    json_object_set_new(o, "request_throughput", real(s->request_throughput));
    json_object_set_new(o, "output_throughput", real(s->output_throughput));
    json_object_set_new(o, "total_token_throughput", real(s->total_token_throughput));
    json_object_set_new(o, "peak_in_flight", json_integer(s->peak_in_flight));
    dist_ms(o, "ttft", &s->ttft);
    dist_ms(o, "tpot", &s->tpot);
    dist_ms(o, "itl", &s->itl);
    dist_ms(o, "e2el", &s->e2e);
    if (s->spec_requests) {
        json_t *u = json_object();
        json_object_set_new(u, "requests", json_integer(s->spec_requests));
        json_object_set_new(u, "steps", json_integer(s->spec_steps));
        json_object_set_new(u, "draft_tokens", json_integer(s->spec_drafted));
        json_object_set_new(u, "accepted_tokens", json_integer(s->spec_accepted));
        json_object_set_new(u, "acceptance_rate",
                            s->spec_drafted ? real((double)s->spec_accepted / (double)s->spec_drafted)
                                            : json_null());
        json_object_set_new(o, "usage_speculative", u);
    }
    return o;
}

json_t *sd_bench_spec_json(const sd_bench_spec *d)
{
    if (!d->present)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "steps", real(d->steps));
    json_object_set_new(o, "draft_tokens", real(d->drafted));
    json_object_set_new(o, "accepted_tokens", real(d->accepted));
    json_object_set_new(o, "emitted_tokens", real(d->emitted));
    json_object_set_new(o, "acceptance_rate", d->drafted > 0 ? real(d->accepted / d->drafted)
                                                              : json_null());
    /* accepted drafts + the bonus token per verify step (SGLang's "accept length") */
    json_object_set_new(o, "mean_accepted_length", d->steps > 0 ? real(d->emitted / d->steps)
                                                                 : json_null());
    json_t *acc = json_array(), *prop = json_array();
    for (int i = 0; i < d->n_pos; i++) {
        json_array_append_new(prop, real(d->proposed_at[i]));
        json_array_append_new(acc, d->proposed_at[i] > 0
                                       ? real(d->accepted_at[i] / d->proposed_at[i])
                                       : json_null());
    }
    json_object_set_new(o, "acceptance_by_position", acc);
    json_object_set_new(o, "proposed_by_position", prop);
    json_object_set_new(o, "draft_seconds", real(d->draft_s));
    json_object_set_new(o, "verify_seconds", real(d->verify_s));
    json_object_set_new(o, "proposer_eager_passes", real(d->eager_passes));
    json_object_set_new(o, "proposer_graph_cache_full", real(d->cache_full));
    /* engine steps by draft length k (index k; the last: 16 or more),
     * trailing zeros left out */
    int nk = 17;
    while (nk > 0 && d->steps_by_k[nk - 1] <= 0)
        nk--;
    json_t *byk = json_array();
    for (int k = 0; k < nk; k++)
        json_array_append_new(byk, real(d->steps_by_k[k]));
    json_object_set_new(o, "engine_steps_by_k", byk);
    json_object_set_new(o, "engine_plain_steps", real(d->plain_steps));
    json_object_set_new(o, "engine_cohorts", real(d->cohorts));
    json_object_set_new(o, "engine_launch_ahead_steps", real(d->ahead_steps));
    json_object_set_new(o, "engine_draft_ahead_steps", real(d->draft_ahead_steps));
    json_object_set_new(o, "engine_gemm_trials", real(d->gemm_trials));
    json_object_set_new(o, "engine_prompt_steps", real(d->prompt_steps));
    json_object_set_new(o, "engine_prompt_graph_steps", real(d->prompt_graph_steps));
    json_object_set_new(o, "engine_prefix_cache_queried_tokens", real(d->prefix_queried));
    json_object_set_new(o, "engine_prefix_cache_hit_tokens", real(d->prefix_hit));
    /* drafting steps by why they drafted, and their requests not drafting */
    json_t *ws = json_object(), *wi = json_object();
    for (int i = 0; i < d->n_why; i++) {
        json_object_set_new(ws, d->why[i], real(d->why_steps[i]));
        json_object_set_new(wi, d->why[i], real(d->why_idle[i]));
    }
    json_object_set_new(o, "engine_drafting_steps_by_why", ws);
    json_object_set_new(o, "engine_drafting_idle_by_why", wi);
    /* steps not queued ahead, by cause */
    json_t *ca = json_object();
    for (int i = 0; i < d->n_cause; i++)
        json_object_set_new(ca, d->cause[i], real(d->cause_steps[i]));
    json_object_set_new(o, "engine_not_ahead_steps_by_cause", ca);
    return o;
}

json_t *sd_bench_rec_json(const sd_bench_rec *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(r->id));
    json_object_set_new(o, "prompt", json_integer(r->prompt));
    json_object_set_new(o, "status", json_string(sd_bench_status_name(r->status)));
    json_object_set_new(o, "http_status", r->http_status ? json_integer(r->http_status)
                                                         : json_null());
    if (r->error[0])
        json_object_set_new(o, "error", json_string(r->error));
    json_object_set_new(o, "attempts", json_integer(r->attempts));
    json_object_set_new(o, "arrival_s", real(r->t_arrival));
    json_object_set_new(o, "sent_s", r->t_sent >= 0 ? real(r->t_sent) : json_null());
    json_object_set_new(o, "end_s", r->t_end >= 0 ? real(r->t_end) : json_null());
    if (r->status == SD_BENCH_OK) {
        json_object_set_new(o, "ttft_ms", r->ttft >= 0 ? real(r->ttft * 1e3) : json_null());
        json_object_set_new(o, "e2el_ms", real(r->e2e * 1e3));
        json_object_set_new(o, "tpot_ms", r->tpot >= 0 ? real(r->tpot * 1e3) : json_null());
        json_object_set_new(o, "output_tokens", json_integer(r->out_tokens));
        json_object_set_new(o, "output_tokens_source",
                            json_string(r->usage_completion_tokens >= 0 ? "usage" : "chunks"));
    }
    json_object_set_new(o, "prompt_tokens", r->prompt_tokens >= 0 ? json_integer(r->prompt_tokens)
                                                                   : json_null());
    json_object_set_new(o, "chunks", json_integer(r->n_chunks));
    json_object_set_new(o, "content_bytes", json_integer((json_int_t)r->content_bytes));
    if (r->finish_reason[0])
        json_object_set_new(o, "finish_reason", json_string(r->finish_reason));
    json_t *itl = json_array();
    for (int k = 1; k < r->n_chunks; k++)
        json_array_append_new(itl, real((r->chunk_t[k] - r->chunk_t[k - 1]) * 1e3));
    json_object_set_new(o, "itl_ms", itl);
    if (r->has_spec) {
        json_t *s = json_object();
        json_object_set_new(s, "steps", json_integer(r->spec_steps));
        json_object_set_new(s, "draft_tokens", json_integer(r->spec_drafted));
        json_object_set_new(s, "accepted_tokens", json_integer(r->spec_accepted));
        json_object_set_new(o, "speculative", s);
    }
    return o;
}

json_t *sd_bench_level_json(const sd_bench_level *l, int with_requests)
{
    json_t *o = json_object();
    json_object_set_new(o, "concurrency", l->concurrency > 0 ? json_integer(l->concurrency)
                                                             : json_null());
    json_object_set_new(o, "request_rate", l->rate > 0 ? real(l->rate) : json_null());
    json_object_set_new(o, "connections", json_integer(l->run.connections));
    json_object_set_new(o, "stopped_by_duration_limit", json_boolean(l->run.stopped));
    json_object_set_new(o, "summary", sd_bench_summary_json(&l->sum));
    json_object_set_new(o, "server_speculative", sd_bench_spec_json(&l->spec));
    if (with_requests) {
        json_t *a = json_array();
        for (int i = 0; i < l->run.n; i++)
            json_array_append_new(a, sd_bench_rec_json(&l->run.recs[i]));
        json_object_set_new(o, "requests", a);
    }
    return o;
}

static void pair(char *b, size_t n, const sd_bench_dist *d)
{
    if (!d->n)
        snprintf(b, n, "-");
    else
        snprintf(b, n, "%.1f / %.1f", d->p50 * 1e3, d->p99 * 1e3);
}

void sd_bench_table(FILE *f, const sd_bench_level *lv, int n)
{
    fprintf(f, "%5s %7s %5s %5s %8s %10s %17s %15s %15s %9s %11s\n", "conc", "rate", "done",
            "fail", "req/s", "out tok/s", "TTFT ms p50/p99", "TPOT p50/p99", "ITL p50/p99",
            "E2E p50", "accept/len");
    for (int i = 0; i < n; i++) {
        const sd_bench_level *l = &lv[i];
        const sd_bench_summary *s = &l->sum;
        char conc[16], rate[16], ttft[40], tpot[40], itl[40], e2e[24], acc[32];
        snprintf(conc, sizeof conc, l->concurrency > 0 ? "%d" : "inf", l->concurrency);
        snprintf(rate, sizeof rate, l->rate > 0 ? "%.2f" : "inf", l->rate);
        pair(ttft, sizeof ttft, &s->ttft);
        pair(tpot, sizeof tpot, &s->tpot);
        pair(itl, sizeof itl, &s->itl);
        snprintf(e2e, sizeof e2e, s->e2e.n ? "%.0f" : "-", s->e2e.p50 * 1e3);
        if (l->spec.present && l->spec.drafted > 0 && l->spec.steps > 0)
            snprintf(acc, sizeof acc, "%.2f / %.2f", l->spec.accepted / l->spec.drafted,
                     l->spec.emitted / l->spec.steps);
        else
            snprintf(acc, sizeof acc, "-");
        fprintf(f, "%5s %7s %5d %5d %8.2f %10.1f %17s %15s %15s %9s %11s\n", conc, rate,
                s->completed, s->failed, s->request_throughput, s->output_throughput, ttft, tpot,
                itl, e2e, acc);
    }
}

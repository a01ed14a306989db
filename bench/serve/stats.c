/* bench/serve/stats: per-request derived times and run summaries, with the
 * definitions of vLLM's benchmark_serving and SGLang's bench_serving. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/serve/bench.h"

const char *sd_bench_status_name(sd_bench_status s)
{
    static const char *const names[SD_BENCH_STATUS_COUNT] = {
        "not_sent", "ok", "connect_error", "http_error", "stream_error", "io_error",
        "timeout", "cancelled"};
    return (unsigned)s < SD_BENCH_STATUS_COUNT ? names[s] : "unknown";
}

uint64_t sd_bench_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sd_bench_rand_unit(uint64_t *state) { return (double)(sd_bench_rand(state) >> 11) * 0x1p-53; }

void sd_bench_arrivals(double *t, int n, double rate, uint64_t seed)
{
    uint64_t st = seed ^ 0x5eedA771ull;
    double now = 0;
    for (int i = 0; i < n; i++) {
        if (rate > 0 && i > 0) /* the first request goes at once, as in vLLM */
            now += -log(1.0 - sd_bench_rand_unit(&st)) / rate;
        t[i] = now;
    }
}

double sd_bench_percentile(const double *v, int n, double q)
{
    if (n <= 0)
        return 0;
    double pos = q / 100.0 * (double)(n - 1);
    int lo = (int)floor(pos);
    if (lo < 0)
        return v[0];
    if (lo >= n - 1)
        return v[n - 1];
    double f = pos - (double)lo;
    return v[lo] + (v[lo + 1] - v[lo]) * f;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void sd_bench_dist_of(double *v, int n, sd_bench_dist *d)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    if (n <= 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    d->mean = sum / n;
    d->min = v[0];
    d->max = v[n - 1];
    d->p50 = sd_bench_percentile(v, n, 50);
    d->p90 = sd_bench_percentile(v, n, 90);
    d->p99 = sd_bench_percentile(v, n, 99);
}

void sd_bench_rec_derive(sd_bench_rec *r)
{
    r->out_tokens = r->usage_completion_tokens >= 0 ? r->usage_completion_tokens : r->n_chunks;
    r->e2e = r->t_sent >= 0 && r->t_end >= r->t_sent ? r->t_end - r->t_sent : 0;
    r->ttft = r->n_chunks > 0 ? r->chunk_t[0] - r->t_sent : -1;
    r->tpot = r->ttft >= 0 && r->out_tokens > 1 ? (r->e2e - r->ttft) / (r->out_tokens - 1) : -1;
}

void sd_bench_rec_free(sd_bench_rec *r)
{
    free(r->chunk_t);
    r->chunk_t = NULL;
    r->n_chunks = r->cap_chunks = 0;
}

void sd_bench_summarize(const sd_bench_rec *recs, int n, double duration_s, int peak_in_flight,
                        sd_bench_summary *s)
{
    memset(s, 0, sizeof *s);
    s->requests = n;
    s->duration_s = duration_s;
    s->peak_in_flight = peak_in_flight;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++) {
        s->by_status[recs[i].status]++;
        if (recs[i].status == SD_BENCH_OK && recs[i].n_chunks > 1)
            n_itl += (size_t)recs[i].n_chunks - 1;
    }
    size_t cap = n > 0 ? (size_t)n : 1;
    double *ttft = malloc(sizeof(double) * cap);
    double *tpot = malloc(sizeof(double) * cap);
    double *e2e = malloc(sizeof(double) * cap);
    double *itl = malloc(sizeof(double) * (n_itl ? n_itl : 1));
    int nt = 0, np = 0, ne = 0;
    size_t ni = 0;
    if (!ttft || !tpot || !e2e || !itl)
        goto out; /* the counts above stand; the distributions stay empty */
    for (int i = 0; i < n; i++) {
        const sd_bench_rec *r = &recs[i];
        if (r->status != SD_BENCH_OK)
            continue;
        s->output_tokens += r->out_tokens;
        if (r->usage_completion_tokens >= 0)
            s->output_tokens_from_usage++;
        if (r->prompt_tokens > 0)
            s->input_tokens += r->prompt_tokens;
        e2e[ne++] = r->e2e;
        if (r->ttft >= 0)
            ttft[nt++] = r->ttft;
        if (r->tpot >= 0)
            tpot[np++] = r->tpot;
        for (int k = 1; k < r->n_chunks; k++)
            itl[ni++] = r->chunk_t[k] - r->chunk_t[k - 1];
        if (r->has_spec) {
            s->spec_requests++;
            s->spec_steps += r->spec_steps;
            s->spec_drafted += r->spec_drafted;
            s->spec_accepted += r->spec_accepted;
        }
    }
    sd_bench_dist_of(ttft, nt, &s->ttft);
    sd_bench_dist_of(tpot, np, &s->tpot);
    sd_bench_dist_of(e2e, ne, &s->e2e);
    sd_bench_dist_of(itl, (int)ni, &s->itl);
out:
    s->completed = s->by_status[SD_BENCH_OK];
    s->failed = n - s->completed - s->by_status[SD_BENCH_NOT_SENT] -
                s->by_status[SD_BENCH_CANCELLED];
    if (s->duration_s > 0) {
        s->request_throughput = s->completed / s->duration_s;
        s->output_throughput = (double)s->output_tokens / s->duration_s;
        s->total_token_throughput = (double)(s->input_tokens + s->output_tokens) / s->duration_s;
    }
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

/* bench/serve/scrape: specd's speculative counters out of GET /metrics
 * (Prometheus text format 0.0.4), so a run can report the acceptance the
 * server saw while it ran. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bench/serve/bench.h"

/* name{labels} value: returns the value and points *labels at the brace
 * contents (or NULL). 0 when the line is not a sample of `name`. */
static int sample(const char *line, size_t len, const char *name, const char **labels,
                  size_t *labels_len, double *value)
{
    size_t nl = strlen(name);
    if (len <= nl || memcmp(line, name, nl) != 0)
        return 0;
    const char *p = line + nl, *end = line + len;
    *labels = NULL;
    *labels_len = 0;
    if (*p == '{') {
        const char *close = memchr(p, '}', (size_t)(end - p));
        if (!close)
            return 0;
        *labels = p + 1;
        *labels_len = (size_t)(close - p - 1);
        p = close + 1;
    }
    if (p >= end || (*p != ' ' && *p != '\t'))
        return 0;
    char buf[64];
    size_t n = (size_t)(end - p);
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    char *e;
    *value = strtod(buf, &e);
    return e != buf;
}

/* the value of label `key` (e.g. "position") as an index below lim, or -1 */
static int label_index(const char *labels, size_t len, const char *key, int lim)
{
    size_t kl = strlen(key);
    if (!labels)
        return -1;
    for (size_t i = 0; i + kl + 2 < len; i++)
        if (memcmp(labels + i, key, kl) == 0 && labels[i + kl] == '=' && labels[i + kl + 1] == '"' &&
            (i == 0 || labels[i - 1] == ',')) {
            int v = atoi(labels + i + kl + 2);
            return v >= 0 && v < lim ? v : -1;
        }
    return -1;
}

/* the slot of label KEY="NAME" (key: `KEY="`) among names (*n of them),
 * added where new; -1: no such label, or no room */
static int name_slot(char (*names)[16], int *n_names, const char *key, const char *labels,
                     size_t len)
{
    const size_t kl = strlen(key);
    if (!labels || len < kl + 1 || memcmp(labels, key, kl) != 0)
        return -1;
    const char *v = labels + kl, *q = memchr(v, '"', len - kl);
    if (!q || q == v || (size_t)(q - v) >= sizeof names[0])
        return -1;
    const size_t n = (size_t)(q - v);
    for (int i = 0; i < *n_names; i++)
        if (strlen(names[i]) == n && memcmp(names[i], v, n) == 0)
            return i;
    if (*n_names == SD_BENCH_WHY_MAX)
        return -1;
    memcpy(names[*n_names], v, n);
    names[*n_names][n] = 0;
    return (*n_names)++;
}

static int why_slot(sd_bench_spec *s, const char *labels, size_t len)
{
    return name_slot(s->why, &s->n_why, "why=\"", labels, len);
}

/* the slot of name among names (n of them), or -1 */
static int slot_of(const char (*names)[16], int n, const char *name)
{
    for (int j = 0; j < n; j++)
        if (!strcmp(names[j], name))
            return j;
    return -1;
}

static int position(const char *labels, size_t len)
{
    return label_index(labels, len, "position", SD_BENCH_MAX_POS);
}

/* specd's unlabelled counters and the fields they fill (spec: a series
 * that tells a speculative server's exposition) */
static const struct {
    const char *name;
    size_t off;
    int spec;
} scalars[] = {
    {"specd_spec_steps_total", offsetof(sd_bench_spec, steps), 1},
    {"specd_spec_draft_tokens_total", offsetof(sd_bench_spec, drafted), 1},
    {"specd_spec_accepted_tokens_total", offsetof(sd_bench_spec, accepted), 1},
    {"specd_spec_emitted_tokens_total", offsetof(sd_bench_spec, emitted), 1},
    {"specd_spec_draft_seconds_total", offsetof(sd_bench_spec, draft_s), 0},
    {"specd_spec_verify_seconds_total", offsetof(sd_bench_spec, verify_s), 0},
    {"specd_spec_eager_passes_total", offsetof(sd_bench_spec, eager_passes), 0},
    {"specd_spec_graph_cache_full_total", offsetof(sd_bench_spec, cache_full), 0},
    {"specd_spec_plain_steps_total", offsetof(sd_bench_spec, plain_steps), 0},
    {"specd_spec_cohorts_total", offsetof(sd_bench_spec, cohorts), 0},
    {"specd_launch_ahead_steps_total", offsetof(sd_bench_spec, ahead_steps), 0},
    {"specd_spec_draft_ahead_steps_total", offsetof(sd_bench_spec, draft_ahead_steps), 0},
    {"specd_gemm_trials_total", offsetof(sd_bench_spec, gemm_trials), 0},
    {"specd_prompt_steps_total", offsetof(sd_bench_spec, prompt_steps), 0},
    {"specd_prompt_graph_steps_total", offsetof(sd_bench_spec, prompt_graph_steps), 0},
    {"specd_prefix_cache_queried_tokens_total", offsetof(sd_bench_spec, prefix_queried), 0},
    {"specd_prefix_cache_hit_tokens_total", offsetof(sd_bench_spec, prefix_hit), 0},
};
#define N_SCALARS ((int)(sizeof scalars / sizeof scalars[0]))

static double *scalar(sd_bench_spec *s, int i) { return (double *)((char *)s + scalars[i].off); }
static double value(const sd_bench_spec *s, int i)
{
    return *(const double *)((const char *)s + scalars[i].off);
}

void sd_bench_spec_parse(const char *text, size_t len, sd_bench_spec *s)
{
    memset(s, 0, sizeof *s);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        size_t n = (size_t)(e - p);
        const char *lab;
        size_t lablen;
        double v, *at;
        int pos;
        if (n && p[0] != '#') {
            int i = 0;
            while (i < N_SCALARS && !sample(p, n, scalars[i].name, &lab, &lablen, &v))
                i++;
            if (i < N_SCALARS) {
                *scalar(s, i) = v;
                s->present |= scalars[i].spec;
            } else if (sample(p, n, "specd_spec_draft_length_steps_total", &lab, &lablen, &v) &&
                       (pos = label_index(lab, lablen, "k", 17)) >= 0) {
                s->steps_by_k[pos] = v;
            } else if ((at = sample(p, n, "specd_spec_drafting_steps_total", &lab, &lablen, &v)
                                 ? s->why_steps
                             : sample(p, n, "specd_spec_drafting_idle_requests_total", &lab,
                                      &lablen, &v)
                                 ? s->why_idle
                                 : NULL) &&
                       (pos = why_slot(s, lab, lablen)) >= 0) {
                at[pos] = v;
            } else if (sample(p, n, "specd_launch_ahead_refused_steps_total", &lab, &lablen, &v) &&
                       (pos = name_slot(s->cause, &s->n_cause, "cause=\"", lab, lablen)) >= 0) {
                s->cause_steps[pos] = v;
            } else if ((at = sample(p, n, "specd_spec_position_proposed_total", &lab, &lablen, &v)
                                 ? s->proposed_at
                             : sample(p, n, "specd_spec_position_accepted_total", &lab, &lablen, &v)
                                 ? s->accepted_at
                                 : NULL) &&
                       (pos = position(lab, lablen)) >= 0) {
                at[pos] = v;
                if (pos + 1 > s->n_pos)
                    s->n_pos = pos + 1;
            }
        }
        p = nl ? nl + 1 : end;
    }
}

void sd_bench_spec_delta(const sd_bench_spec *b, const sd_bench_spec *a, sd_bench_spec *d)
{
    memset(d, 0, sizeof *d);
    if (!a->present)
        return;
    /* Counters only grow; a smaller value means the server restarted
     * between the scrapes and the difference means nothing. */
    if (a->steps < b->steps || a->drafted < b->drafted || a->accepted < b->accepted)
        return;
    d->present = 1;
    for (int i = 0; i < N_SCALARS; i++)
        *scalar(d, i) = value(a, i) - value(b, i);
    for (int k = 0; k < 17; k++)
        d->steps_by_k[k] = a->steps_by_k[k] - b->steps_by_k[k];
    /* reasons by name (a reason first seen after `before` counted 0 there) */
    d->n_why = a->n_why;
    memcpy(d->why, a->why, sizeof d->why);
    for (int i = 0; i < a->n_why; i++) {
        const int j = slot_of(b->why, b->n_why, a->why[i]);
        d->why_steps[i] = a->why_steps[i] - (j >= 0 ? b->why_steps[j] : 0);
        d->why_idle[i] = a->why_idle[i] - (j >= 0 ? b->why_idle[j] : 0);
    }
    d->n_cause = a->n_cause;
    memcpy(d->cause, a->cause, sizeof d->cause);
    for (int i = 0; i < a->n_cause; i++) {
        const int j = slot_of(b->cause, b->n_cause, a->cause[i]);
        d->cause_steps[i] = a->cause_steps[i] - (j >= 0 ? b->cause_steps[j] : 0);
    }
    d->n_pos = a->n_pos > b->n_pos ? a->n_pos : b->n_pos;
    for (int i = 0; i < d->n_pos; i++) {
        d->proposed_at[i] = a->proposed_at[i] - b->proposed_at[i];
        d->accepted_at[i] = a->accepted_at[i] - b->accepted_at[i];
    }
    /* Trailing positions nothing was proposed at during this run say nothing. */
    while (d->n_pos > 0 && d->proposed_at[d->n_pos - 1] <= 0)
        d->n_pos--;
}

/* net/metrics: the numbers behind GET /metrics (Prometheus text format 0.0.4).
 *
 * The server's own counters and histograms live in sd_metrics and are
 * touched on the loop thread only (no locks). Engine-wide numbers (queue,
 * running requests, KV blocks, speculative statistics) come from an
 * sd_engine_stats snapshot taken at render time. Every name starts specd_. */
#ifndef SD_NET_METRICS_H
#define SD_NET_METRICS_H

#include <stdint.h>

#include "engine/engine.h"
#include "net/buf.h"

/* How a request ended, as the `outcome` label of specd_requests_total. */
typedef enum sd_outcome {
    SD_OUTCOME_STOP = 0, /* finished: eos or a stop string */
    SD_OUTCOME_LENGTH,   /* finished: max_tokens or the context */
    SD_OUTCOME_CANCELLED, /* client gone, slow reader, or shutdown */
    SD_OUTCOME_ERROR,    /* the engine failed it */
    SD_OUTCOME_REJECTED, /* refused before reaching the engine (4xx) */
    SD_OUTCOME_OVERLOADED, /* 503: queue full, loading or draining */
    SD_OUTCOME_COUNT
} sd_outcome;

#define SD_HIST_MAX_BUCKETS 24

typedef struct sd_hist {
    const double *bounds; /* upper bounds, ascending; +Inf is implied */
    int n;
    uint64_t counts[SD_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last: +Inf */
    double sum;
    uint64_t count;
} sd_hist;

/* HTTP statuses counted one by one; others land in "other". */
#define SD_METRICS_STATUSES 12

typedef struct sd_metrics {
    uint64_t requests[SD_OUTCOME_COUNT];
    uint64_t responses[SD_METRICS_STATUSES + 1];
    uint64_t prompt_tokens, completion_tokens;
    sd_hist ttft;      /* seconds, submit -> first token */
    sd_hist itl;       /* seconds between tokens, per token */
    sd_hist e2e;       /* seconds, submit -> finish */
    sd_hist queue;     /* seconds, submit -> first scheduled */
    uint64_t connections_total;
    int connections_open;
    uint64_t slow_reader_closes;
} sd_metrics;

void sd_metrics_init(sd_metrics *m);
void sd_hist_observe(sd_hist *h, double v, uint64_t weight);
void sd_metrics_outcome(sd_metrics *m, sd_outcome o);
void sd_metrics_status(sd_metrics *m, int status);
/* A finished request (any finish): tokens, TTFT, end-to-end and queue time. */
void sd_metrics_finished(sd_metrics *m, const sd_req_stats *st);
/* n tokens arrived dt seconds after the previous ones: n observations of dt/n. */
void sd_metrics_tokens(sd_metrics *m, double dt, int n);

/* The whole exposition. es may be NULL (no engine yet: its series are left
 * out but the server's are written). */
int sd_metrics_render(const sd_metrics *m, const sd_engine_stats *es, sd_buf *out);

#endif

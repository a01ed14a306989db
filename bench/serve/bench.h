/* bench/serve: a load generator for OpenAI-compatible streaming endpoints.
 *
 * One run sends a list of requests to /v1/chat/completions or
 * /v1/completions with "stream": true, on one libuv loop in the calling
 * thread, over keep-alive HTTP/1.1 connections (one request at a time per
 * connection). Requests arrive at precomputed times (Poisson at a rate, or
 * all at once) and are sent as soon as fewer than `concurrency` are in
 * flight. Every request ends as one record: its status, the time of every
 * content chunk, the server's usage when it sent one. Failures of any kind
 * (refused connections, HTTP error statuses, malformed streams, lost
 * connections, timeouts) are that request's record, never the run's.
 * Nothing here prints; progress goes through a callback.
 *
 * Timing follows vLLM's benchmark_serving and SGLang's bench_serving (see
 * bench/serve/README.md): TTFT = sent -> first non-empty content chunk;
 * ITL = gaps between successive content chunks; e2e = sent -> end of the
 * stream; TPOT = (e2e - TTFT) / (output tokens - 1). */
#ifndef SD_BENCH_BENCH_H
#define SD_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/err.h"
#include "net/buf.h"

typedef enum sd_bench_endpoint { SD_BENCH_CHAT = 0, SD_BENCH_COMPLETIONS = 1 } sd_bench_endpoint;

typedef enum sd_bench_status {
    SD_BENCH_NOT_SENT = 0, /* the run stopped (--duration-limit) before it was sent */
    SD_BENCH_OK,
    SD_BENCH_ERR_CONNECT, /* connect failed: refused, unreachable */
    SD_BENCH_ERR_HTTP,    /* a status other than 200 */
    SD_BENCH_ERR_STREAM,  /* malformed SSE or JSON, an error event, no [DONE] */
    SD_BENCH_ERR_IO,      /* connection lost or bad HTTP before the response ended */
    SD_BENCH_ERR_TIMEOUT, /* the request outlived request_timeout_s */
    SD_BENCH_CANCELLED,   /* in flight when the run's duration limit passed */
    SD_BENCH_STATUS_COUNT
} sd_bench_status;

/* "ok", "connect_error", ... (names used in the JSON and the table) */
const char *sd_bench_status_name(sd_bench_status s);

/* ---- the server ------------------------------------------------------------ */

typedef struct sd_bench_target {
    char host[256];   /* name or address, without IPv6 brackets */
    int port;
    char base[512];   /* path prefix without a trailing '/', "" for none */
    char hostport[300]; /* the Host header's value */
} sd_bench_target;

/* "http://host[:port][/prefix]" (port 80 by default; "[::1]" for IPv6).
 * A prefix ending in "/v1" is kept without it, since endpoints add "/v1/...". */
int sd_bench_parse_url(const char *url, sd_bench_target *t, sd_err *err);

/* One blocking GET (for /metrics and /v1/models, outside timed runs):
 * fills *status and body (chunked coding removed). timeout_s bounds it all. */
int sd_bench_http_get(const sd_bench_target *t, const char *path, const char *api_key,
                      double timeout_s, int *status, sd_buf *body, sd_err *err);

/* ---- one request ------------------------------------------------------------ */

typedef struct sd_bench_rec {
    int id;     /* position in the run */
    int prompt; /* index into the prompt list */
    sd_bench_status status;
    int http_status; /* 0: no status line received */
    char error[240]; /* one line, "" when ok */
    int attempts;    /* 2 when resent after a stale keep-alive connection failed */
    /* seconds from the run's start */
    double t_arrival; /* when it was due */
    double t_sent;    /* when it went out (connect included); -1: never */
    double t_end;     /* end of the stream ([DONE] or the response's end) */
    double *chunk_t;  /* (n_chunks) arrival of each non-empty content chunk */
    int n_chunks, cap_chunks;
    size_t content_bytes;
    int prompt_tokens;           /* usage.prompt_tokens, -1: not sent by the server */
    int usage_completion_tokens; /* usage.completion_tokens, -1: not sent */
    char finish_reason[24];
    /* specd's usage.speculative extension; has_spec = 0 when absent */
    int has_spec;
    long long spec_steps, spec_drafted, spec_accepted;
    /* derived by sd_bench_rec_derive (ok records) */
    int out_tokens; /* usage when present, else n_chunks */
    double ttft;    /* s; -1 when no content arrived */
    double e2e;     /* s */
    double tpot;    /* s; -1 when out_tokens < 2 or no content arrived */
} sd_bench_rec;

/* Fills out_tokens, ttft, e2e and tpot from the raw times. */
void sd_bench_rec_derive(sd_bench_rec *r);
void sd_bench_rec_free(sd_bench_rec *r);

/* ---- prompts ---------------------------------------------------------------- */

typedef struct sd_bench_prompts {
    char **text;
    int n;
} sd_bench_prompts;

/* JSON Lines, one prompt per line, in the shapes of public sets: MT-Bench
 * {"turns": [first, ...]} (the first turn), GSM8K {"question": ...},
 * HumanEval {"prompt": ...}, or {"prompt": ...}; also {"text": ...}.
 * Blank lines are skipped; any other line is an error naming its number. */
int sd_bench_prompts_load(const char *path, sd_bench_prompts *p, sd_err *err);
/* n prompts of `words` pseudo-random common English words each (seeded).
 * BPE tokenizers make about one token of each; the server's usage reports
 * the exact count. */
int sd_bench_prompts_random(int n, int words, uint64_t seed, sd_bench_prompts *p, sd_err *err);
/* One text of `words` pseudo-random common words (seeded apart from the
 * prompts') and a blank line before every prompt: a system prompt all the
 * requests share (a server's prefix cache finds it). */
int sd_bench_prompts_prefix(sd_bench_prompts *p, int words, uint64_t seed, sd_err *err);
void sd_bench_prompts_free(sd_bench_prompts *p);

/* ---- numbers ---------------------------------------------------------------- */

/* splitmix64: the seeded generator of arrivals, prompt order and random prompts. */
uint64_t sd_bench_rand(uint64_t *state);
double sd_bench_rand_unit(uint64_t *state); /* [0, 1) */
/* t[i] = arrival of request i in seconds: a Poisson process at `rate` per
 * second (exponential gaps) starting at 0, or all 0 when rate <= 0. */
void sd_bench_arrivals(double *t, int n, double rate, uint64_t seed);

typedef struct sd_bench_dist {
    int n;
    double mean, p50, p90, p99, min, max; /* 0 when n == 0 */
} sd_bench_dist;

/* Percentile with linear interpolation between closest ranks (numpy's
 * default): sorted v, q in [0, 100]. */
double sd_bench_percentile(const double *sorted, int n, double q);
/* Sorts v in place. */
void sd_bench_dist_of(double *v, int n, sd_bench_dist *d);

typedef struct sd_bench_summary {
    int requests, completed, failed;  /* failed: every status but ok, not sent and cancelled */
    int by_status[SD_BENCH_STATUS_COUNT];
    double duration_s;                /* run start -> last request's end */
    long long input_tokens;           /* usage.prompt_tokens of completed requests */
    long long output_tokens;          /* out_tokens of completed requests */
    int output_tokens_from_usage;     /* completed requests whose count came from usage */
    double request_throughput;        /* completed / duration, req/s */
    double output_throughput;         /* output tokens / duration, tok/s */
    double total_token_throughput;    /* (input + output) / duration, tok/s */
    sd_bench_dist ttft, tpot, itl, e2e; /* seconds */
    int peak_in_flight;
    /* sums of usage.speculative over completed requests that carried it */
    int spec_requests;
    long long spec_steps, spec_drafted, spec_accepted;
} sd_bench_summary;

void sd_bench_summarize(const sd_bench_rec *recs, int n, double duration_s, int peak_in_flight,
                        sd_bench_summary *s);

/* ---- one run ---------------------------------------------------------------- */

typedef struct sd_bench_progress {
    int total, sent, done, ok, failed, in_flight;
    long long out_tokens; /* content chunks so far, usage once a request ends */
    double elapsed_s;
} sd_bench_progress;

typedef struct sd_bench_cfg {
    sd_bench_target target;
    sd_bench_endpoint endpoint;
    const char *model;
    const char *api_key;       /* NULL or "": no Authorization header */
    int max_tokens;            /* <= 0: not sent */
    double temperature;        /* < 0: not sent */
    int ignore_eos;            /* send "ignore_eos": true (vLLM, SGLang and specd know it) */
    int send_seed;             /* send "seed": seed + id */
    int json_object;           /* send "response_format": {"type": "json_object"} */
    uint64_t seed;             /* arrivals, prompt order, per-request seeds */
    int num_requests;
    double rate;               /* requests per second (Poisson); <= 0: all at once */
    int concurrency;           /* in flight at most; <= 0: unbounded */
    double duration_limit_s;   /* <= 0: none */
    double request_timeout_s;  /* <= 0: none */
    const sd_bench_prompts *prompts;
    void (*progress)(void *user, const sd_bench_progress *p);
    void *progress_user;
    double progress_interval_s; /* <= 0: no progress calls */
} sd_bench_cfg;

typedef struct sd_bench_run {
    sd_bench_rec *recs; /* (n) */
    int n;
    double duration_s;
    int peak_in_flight;
    int connections; /* TCP connections opened */
    int stopped;     /* the duration limit ended it */
} sd_bench_run;

/* Runs cfg to the end (or to its duration limit). Fails only when the run
 * cannot start (bad config, unresolvable host, no memory). */
int sd_bench_run_once(const sd_bench_cfg *cfg, sd_bench_run *out, sd_err *err);
void sd_bench_run_free(sd_bench_run *r);

/* ---- specd's /metrics --------------------------------------------------------- */

#define SD_BENCH_MAX_POS 16

typedef struct sd_bench_spec {
    int present; /* the exposition held specd_spec_* series */
    double steps, drafted, accepted, emitted;
    double proposed_at[SD_BENCH_MAX_POS], accepted_at[SD_BENCH_MAX_POS];
    int n_pos;
    double draft_s, verify_s;
    /* the proposer's passes run without a CUDA graph, and those because its
     * graph cache was full (one-off costs of a shape met the first time) */
    double eager_passes, cache_full;
    /* engine steps: by the draft length k adaptive k (or --spec-k) chose
     * (16: 16 or more), with no request drafting (plain), queued before the
     * step before was read (launch ahead), verify steps queued before their
     * drafts reached the host (draft ahead) */
    double steps_by_k[17];
    double plain_steps, ahead_steps, draft_ahead_steps, cohorts;
    double gemm_trials; /* the backend's GEMM algorithm trials (stalls of a few ms) */
    /* target steps with prompt rows, and of those replayed from a CUDA graph */
    double prompt_steps, prompt_graph_steps;
    /* the prefix cache: prompt tokens looked up at admission, and found */
    double prefix_queried, prefix_hit;
    /* drafting steps by why they drafted (the `why` label: best, explore,
     * ...), and the running requests of those steps that did not draft */
#define SD_BENCH_WHY_MAX 12
    int n_why;
    char why[SD_BENCH_WHY_MAX][16];
    double why_steps[SD_BENCH_WHY_MAX], why_idle[SD_BENCH_WHY_MAX];
    /* steps not queued ahead, by cause (the `cause` label) */
    int n_cause;
    char cause[SD_BENCH_WHY_MAX][16];
    double cause_steps[SD_BENCH_WHY_MAX];
} sd_bench_spec;

/* Reads the specd_spec_* counters from Prometheus text. */
void sd_bench_spec_parse(const char *text, size_t len, sd_bench_spec *s);
/* after - before, counter by counter (a restart shows as a negative delta:
 * then present = 0). */
void sd_bench_spec_delta(const sd_bench_spec *before, const sd_bench_spec *after,
                         sd_bench_spec *d);

/* ---- reports ------------------------------------------------------------------ */

/* One level of a sweep (or the only one): its settings, records and numbers. */
typedef struct sd_bench_level {
    int concurrency; /* <= 0: unbounded */
    double rate;     /* <= 0: all at once */
    sd_bench_run run;
    sd_bench_summary sum;
    sd_bench_spec spec; /* /metrics delta over the level; present = 0 when unknown */
} sd_bench_level;

struct json_t;
/* JSON objects (jansson, new references); times in ms as vLLM's JSON has them. */
struct json_t *sd_bench_summary_json(const sd_bench_summary *s);
struct json_t *sd_bench_spec_json(const sd_bench_spec *d);
struct json_t *sd_bench_rec_json(const sd_bench_rec *r);
struct json_t *sd_bench_level_json(const sd_bench_level *l, int with_requests);

/* The short table printed last: one row per level. */
void sd_bench_table(FILE *f, const sd_bench_level *levels, int n);

#endif

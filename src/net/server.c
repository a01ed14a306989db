#include "net/server.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "engine/engine.h"
#include "net/buf.h"
#include "net/http.h"
#include "net/metrics.h"
#include "net/notify.h"
#include "net/openai.h"
#include "net/reasoning.h"
#include "net/toolcall.h"
#include "net/router.h"
#include "verify/schema_cache.h"

/* An engine that has work but has not completed a step for this long is
 * reported unhealthy (and the systemd watchdog is no longer fed). */
#define SD_STALL_NS (60ull * 1000000000ull)

enum { ST_NOMODEL, ST_LOADING, ST_WARMING, ST_READY, ST_FAILED };

typedef struct job job;
typedef struct reply reply;

/* One engine callback, copied for the loop thread. */
typedef struct event {
    struct event *next;
    job *j;
    int fin;
    int lp; /* logprobs: text holds n_ids ids, then their sd_token_logprob */
    uint64_t t_ns;
    int n_ids;
    sd_finish why;
    sd_req_stats st;
    char *msg; /* fin with SD_FINISH_ERROR */
    size_t len;
    char text[];
} event;

/* One response: a request's n choices (n > 1: the same prompt generated n
 * times), each an engine request (a job). Lives until the last of its jobs
 * has finished, whatever happened to its connection. */
struct reply {
    sd_server *s;
    sd_http_req *req; /* NULL once the response ended or the client went away */
    uint64_t rid;     /* server request number (logs) */
    sd_oai_kind kind;
    int stream, include_usage, warmup;
    char id[48];
    long long created;
    sd_buf out;   /* streaming: the SSE events of one wake, written together */
    reply *dirty; /* next reply with events in out (on_wake's list: those with out.len) */
    const char *cancel_why;
    char peer[64];
    int n, live;   /* choices; those whose engine request has not finished */
    int per;       /* choices of each prompt (the request's n): choice i is of prompt i / per */
    int want_lp, top_lp; /* logprobs asked for (sd_gen_params.logprobs, top_logprobs) */
    int streaming; /* the stream's head went out */
    int gone;      /* the client went away */
    int refused;   /* a choice was refused at submission (e says why) */
    /* the first choice that failed (its error is the response's; the
     * others are cancelled), else 0 */
    int failed;
    sd_finish fail_why;
    sd_api_error e;
    sd_req_stats usage; /* the prompt once; completions and speculation summed */
    job *jobs[];        /* n */
};

/* One choice: an engine request. */
struct job {
    sd_server *s;
    reply *rp;
    int index;    /* its choice's */
    uint64_t eid; /* engine id */
    int live;     /* submitted and not finished (on the server's list) */
    sd_finish why;
    sd_buf text; /* non-streaming: the whole completion (with tools: its content) */
    /* tools: the model's text read for tool calls (net/toolcall.h); what is
     * not a call is content */
    int tools;
    sd_tc_parser tc;
    /* --reasoning-parser: the reply's reasoning split from its content
     * (net/reasoning.h); the content goes on as above */
    int reasoning;
    sd_rs_parser rs;
    sd_buf rtext; /* non-streaming: the reasoning */
    sd_tool_call *calls; /* non-streaming: the calls made (streaming: tc.n_calls sent) */
    int n_calls, cap_calls;
    /* logprobs: the tokens' (streaming: those from lp_sent on are not sent
     * yet, and those sent are dropped at the next; lp_off: the text bytes
     * of those sent, completions' text_offset) */
    int32_t *lp_ids;
    sd_token_logprob *lp;
    int n_lp, cap_lp, lp_sent;
    size_t lp_off;
    /* completions' echo: the prompt's text and first token, out before
     * the completion (then freed) */
    char *echo;
    size_t echo_len;
    int32_t echo_id;
    uint64_t t_last; /* engine-thread time of the last tokens, ns */
    job *prev, *next;
};

struct sd_server {
    uv_loop_t *loop;
    const sd_opts *o;
    unsigned flags;
    sd_http_server *http;
    sd_metrics metrics;
    int state;
    int draining, closing, exit_status;
    sd_engine *engine;
    const sd_tokenizer *tok;
    sd_chat_template *ct;
    int32_t eot_id; /* the chat template's end-of-turn token, or -1 */
    int reasoning;  /* --reasoning-parser: chat replies' <think> reasoning as reasoning_content */
    int think_special; /* <think> or </think> is a special token: replies read for them keep specials */
    char ct_err[1100];
    char model_name[256];
    int max_context;
    char *api_key;
    size_t api_key_len;
    /* engine -> loop */
    pthread_mutex_t mu;
    event *q_head, *q_tail;
    uv_async_t wake;
    uv_signal_t sigterm, sigint;
    uv_timer_t watchdog, drain_timer;
    int handles_open;
    int n_pool; /* requests parsed or tokenized on the thread pool (pool_done) */
    uint64_t watchdog_usec, wd_last_step;
    /* model loading on a worker thread */
    uv_work_t load;
    int loading, load_rc;
    sd_err load_err;
    sd_engine *loaded;
    job *jobs;
    int n_jobs;
    uint64_t next_rid, id_key, id_count;
    long long started;
};

static void check_drained(sd_server *s);

/* ---- small helpers ------------------------------------------------------------- */

static int auth_ok(const sd_server *s, const sd_http_req *req)
{
    return !s->api_key ||
           sd_api_key_ok(sd_http_header(req, "Authorization"), s->api_key, s->api_key_len);
}

static const char *finish_name(sd_finish why)
{
    switch (why) {
    case SD_FINISH_STOP: return "stop";
    case SD_FINISH_LENGTH: return "length";
    case SD_FINISH_CANCELLED: return "cancelled";
    case SD_FINISH_ERROR: return "error";
    default: return "none";
    }
}

/* An error response for a request that never reached the engine. */
static void reject(sd_server *s, sd_http_req *req, uint64_t rid, const sd_api_error *e,
                   const char *extra, int counts)
{
    if (counts)
        sd_metrics_outcome(&s->metrics,
                           e->status == 503 ? SD_OUTCOME_OVERLOADED : SD_OUTCOME_REJECTED);
    sd_log_info("request %llu %s %s -> %d%s%s: %s (peer %s)", (unsigned long long)rid,
                sd_http_method(req), sd_http_path(req), e->status, e->param[0] ? " param " : "",
                e->param, e->message, sd_http_peer(req));
    sd_buf body = {0};
    sd_api_error_json(&body, e);
    sd_http_respond(req, e->status, "application/json", extra, body.p ? body.p : "", body.len);
    sd_buf_free(&body);
}

/* ---- replies and jobs ------------------------------------------------------------ */

static void reply_free(reply *rp);

static reply *reply_new(sd_server *s, sd_http_req *req, uint64_t rid, sd_oai_kind kind, int n)
{
    reply *rp = calloc(1, sizeof *rp + (size_t)n * sizeof rp->jobs[0]);
    if (!rp)
        return NULL;
    rp->s = s;
    rp->req = req;
    rp->rid = rid;
    rp->kind = kind;
    rp->n = n;
    rp->per = 1;
    rp->created = (long long)time(NULL);
    uint64_t c = ++s->id_count;
    snprintf(rp->id, sizeof rp->id, "%s-%016llx%08llx", kind == SD_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)sd_mix64(s->id_key ^ c),
             (unsigned long long)(sd_mix64(s->id_key + c) & 0xffffffffu));
    snprintf(rp->peer, sizeof rp->peer, "%s", req ? sd_http_peer(req) : "-");
    for (int i = 0; i < n; i++) {
        job *j = calloc(1, sizeof *j);
        if (!j) {
            reply_free(rp);
            return NULL;
        }
        j->s = s;
        j->rp = rp;
        j->index = i;
        rp->jobs[i] = j;
    }
    return rp;
}

/* a submitted job goes on the server's list of engine requests */
static void job_live(job *j)
{
    sd_server *s = j->s;
    j->live = 1;
    j->rp->live++;
    j->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = j;
    s->jobs = j;
    s->n_jobs++;
}

/* its engine request finished: off the list (the job stays with its reply) */
static void job_ended(job *j)
{
    sd_server *s = j->s;
    if (j->prev)
        j->prev->next = j->next;
    else
        s->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->prev = j->next = NULL;
    s->n_jobs--;
    j->live = 0;
    j->rp->live--;
}

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->live)
        job_ended(j);
    sd_buf_free(&j->text);
    sd_tc_free(&j->tc);
    sd_rs_free(&j->rs);
    sd_buf_free(&j->rtext);
    for (int i = 0; i < j->n_calls; i++)
        sd_tool_call_free(&j->calls[i]);
    free(j->calls);
    free(j->lp_ids);
    free(j->lp);
    free(j->echo);
    free(j);
}

static void reply_free(reply *rp)
{
    for (int i = 0; i < rp->n; i++)
        job_free(rp->jobs[i]);
    sd_buf_free(&rp->out);
    free(rp);
}

static sd_oai_meta job_meta(const job *j)
{
    const reply *rp = j->rp;
    sd_oai_meta m = {rp->kind, rp->id, rp->created, j->s->model_name, j->index};
    return m;
}

/* cancels the reply's engine requests still running */
static void reply_cancel(reply *rp, const char *why)
{
    if (!rp->cancel_why)
        rp->cancel_why = why;
    for (int i = 0; i < rp->n; i++)
        if (rp->jobs[i]->live && rp->s->engine)
            sd_engine_cancel(rp->s->engine, rp->jobs[i]->eid);
}

/* a choice's statistics into the reply's usage: each prompt once (its
 * first choice's: the choices of a prompt share it), the rest summed; the
 * first token's and the whole time the longest of the choices' */
static void usage_add(sd_req_stats *u, const sd_req_stats *st, int first_of_prompt)
{
    if (first_of_prompt) {
        u->prompt_tokens += st->prompt_tokens;
        u->cached_tokens += st->cached_tokens;
    }
    u->completion_tokens += st->completion_tokens;
    u->queued_s = SD_MAX(u->queued_s, st->queued_s);
    u->ttft_s = SD_MAX(u->ttft_s, st->ttft_s);
    u->total_s = SD_MAX(u->total_s, st->total_s);
    sd_spec_stats_add(&u->spec, &st->spec);
}

/* ---- engine callbacks (engine thread): copy, queue, wake ------------------------- */

static void push_event(sd_server *s, event *ev)
{
    pthread_mutex_lock(&s->mu);
    if (s->q_tail)
        s->q_tail->next = ev;
    else
        s->q_head = ev;
    s->q_tail = ev;
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->wake);
}

/* an event of j with len bytes of payload (zeroed, NUL after), or NULL
 * (logged: what is lost) */
static event *event_new(job *j, size_t len, const char *what)
{
    event *ev = malloc(sizeof *ev + len + 1);
    if (!ev) {
        sd_log_error("request %llu: out of memory queueing %zu bytes of %s",
                     (unsigned long long)j->rp->rid, len, what);
        return NULL;
    }
    memset(ev, 0, sizeof *ev);
    ev->j = j;
    ev->len = len;
    ev->text[len] = 0;
    return ev;
}

static void on_output(void *user, const char *text, size_t len, const int32_t *ids, int n_ids)
{
    job *j = user;
    event *ev = event_new(j, len, "output");
    if (!ev)
        return;
    ev->t_ns = sd_now_ns();
    ev->n_ids = n_ids;
    if (len)
        memcpy(ev->text, text, len);
    (void)ids;
    push_event(j->s, ev);
}

static void on_logprobs(void *user, const int32_t *ids, const sd_token_logprob *lp, int n)
{
    job *j = user;
    event *ev = event_new(j, (size_t)n * (sizeof *ids + sizeof *lp), "logprobs");
    if (!ev)
        return;
    ev->lp = 1;
    ev->n_ids = n;
    memcpy(ev->text, ids, (size_t)n * sizeof *ids);
    memcpy(ev->text + (size_t)n * sizeof *ids, lp, (size_t)n * sizeof *lp);
    push_event(j->s, ev);
}

static void on_finish(void *user, sd_finish why, const sd_req_stats *st, const char *msg)
{
    job *j = user;
    /* The finish must reach the loop or the job never ends: retry the
     * allocation rather than drop it. */
    event *ev;
    while (!(ev = calloc(1, sizeof *ev + 1)))
        usleep(1000);
    ev->j = j;
    ev->fin = 1;
    ev->t_ns = sd_now_ns();
    ev->why = why;
    if (st)
        ev->st = *st;
    ev->msg = msg ? strdup(msg) : NULL;
    push_event(j->s, ev);
}

/* ---- events on the loop -------------------------------------------------------- */

/* A stream's logprobs not sent yet, into *lp (marked sent): 0 where none
 * are (or none were asked for). */
static int lp_pending(job *j, sd_oai_logprobs *lp)
{
    if (!j->rp->want_lp || j->lp_sent >= j->n_lp)
        return 0;
    *lp = (sd_oai_logprobs){j->s->tok, j->rp->top_lp, j->lp_ids + j->lp_sent, j->lp + j->lp_sent,
                            j->n_lp - j->lp_sent, &j->lp_off};
    j->lp_sent = j->n_lp;
    return 1;
}

/* A stream's logprobs not sent yet in a chunk of their own (after text a
 * parser held or split: tool calls, reasoning) */
static int lp_flush(job *j)
{
    sd_oai_logprobs lp;
    if (!lp_pending(j, &lp))
        return 0;
    sd_oai_meta m = job_meta(j);
    return sd_oai_chunk_event_lp(&j->rp->out, &m, 0, "", 0, SD_FINISH_NONE, &lp) ? SD_ENOMEM : 0;
}

/* n tokens' entries appended to the job's (their ids and sd_token_logprob
 * entries, at any alignment) */
static int lp_append(job *j, const void *src_ids, const void *src_lp, int n)
{
    if (j->rp->stream && j->lp_sent == j->n_lp) /* (all sent: their room is free again) */
        j->n_lp = j->lp_sent = 0;
    if (j->n_lp + n > j->cap_lp) {
        int cap = j->cap_lp ? 2 * j->cap_lp : 64;
        while (cap < j->n_lp + n)
            cap *= 2;
        int32_t *ids = realloc(j->lp_ids, (size_t)cap * sizeof *ids);
        if (ids)
            j->lp_ids = ids;
        sd_token_logprob *lp = realloc(j->lp, (size_t)cap * sizeof *lp);
        if (lp)
            j->lp = lp;
        if (!ids || !lp)
            return SD_ENOMEM;
        j->cap_lp = cap;
    }
    memcpy(j->lp_ids + j->n_lp, src_ids, (size_t)n * sizeof *j->lp_ids);
    memcpy(j->lp + j->n_lp, src_lp, (size_t)n * sizeof *j->lp);
    j->n_lp += n;
    return 0;
}

/* A logprobs event: its tokens' entries appended to the job's */
static int take_logprobs(job *j, const event *ev)
{
    const int n = ev->n_ids;
    return lp_append(j, ev->text, ev->text + (size_t)n * sizeof(int32_t), n);
}

/* The tool-call parser's output: content and calls, kept (a whole response)
 * or as stream chunks in the reply's gathered events. */
static int tc_emit(void *arg, const char *content, size_t len, const sd_tool_call *call)
{
    job *j = arg;
    if (!j->rp->stream) {
        if (!call)
            return sd_buf_append(&j->text, content, len) ? SD_ENOMEM : 0;
        if (j->n_calls == j->cap_calls) {
            int cap = j->cap_calls ? 2 * j->cap_calls : 4;
            sd_tool_call *v = realloc(j->calls, (size_t)cap * sizeof *v);
            if (!v)
                return SD_ENOMEM;
            j->calls = v;
            j->cap_calls = cap;
        }
        sd_tool_call *c = &j->calls[j->n_calls];
        *c = *call;
        c->name = strdup(call->name);
        c->arguments = strdup(call->arguments);
        if (!c->name || !c->arguments) {
            sd_tool_call_free(c);
            return SD_ENOMEM;
        }
        j->n_calls++;
        return 0;
    }
    sd_oai_meta m = job_meta(j);
    if (!call)
        return sd_oai_chunk_event(&j->rp->out, &m, 0, content, len, SD_FINISH_NONE) ? SD_ENOMEM : 0;
    /* (the parser counts a call before it emits it: its index is one less) */
    return sd_oai_tool_call_event(&j->rp->out, &m, j->tc.n_calls - 1, call) ? SD_ENOMEM : 0;
}

/* Text of the reply's content: kept (a whole response), read for tool
 * calls, or a stream chunk in the reply's gathered events. */
static int content_out(job *j, const char *text, size_t len)
{
    if (j->tools)
        return sd_tc_feed(&j->tc, text, len);
    if (!j->rp->stream)
        return sd_buf_append(&j->text, text, len) ? SD_ENOMEM : 0;
    sd_oai_meta m = job_meta(j);
    sd_oai_logprobs lp;
    const int with = !j->reasoning && lp_pending(j, &lp); /* (a parser's text: apart) */
    return sd_oai_chunk_event_lp(&j->rp->out, &m, 0, text, len, SD_FINISH_NONE, with ? &lp : NULL)
               ? SD_ENOMEM
               : 0;
}

/* the echoed prompt out: its text first, and with logprobs its first
 * token's entry (null: nothing comes before it; the engine's entries of
 * the rest of the prompt follow) */
static int echo_out(job *j)
{
    int rc = 0;
    if (j->rp->want_lp) {
        sd_token_logprob first = {.logprob = NAN};
        rc = lp_append(j, &j->echo_id, &first, 1);
    }
    if (!rc)
        rc = content_out(j, j->echo, j->echo_len);
    free(j->echo);
    j->echo = NULL;
    return rc;
}

/* The reasoning parser's output: reasoning kept or streamed as
 * reasoning_content, the rest content. */
static int rs_emit(void *arg, int reasoning, const char *text, size_t len)
{
    job *j = arg;
    if (!reasoning)
        return content_out(j, text, len);
    if (!j->rp->stream)
        return sd_buf_append(&j->rtext, text, len) ? SD_ENOMEM : 0;
    sd_oai_meta m = job_meta(j);
    return sd_oai_reasoning_event(&j->rp->out, &m, text, len) ? SD_ENOMEM : 0;
}

/* The events of one wake for a stream, as one write: at batch 64 the
 * engine makes 64 events a step, and a write each (a system call) left the
 * loop 13-37 ms behind the engine at the end of a burst on an H200
 * (NOTES.md, session 32). Returns the reply to put on the dirty list, or
 * NULL. */
static reply *handle_output(sd_server *s, event *ev)
{
    job *j = ev->j;
    reply *rp = j->rp;
    if (ev->lp) {
        if (take_logprobs(j, ev))
            j->text.oom = 1; /* the response fails as out of memory */
        return NULL;
    }
    if (ev->n_ids > 0) {
        if (j->t_last)
            sd_metrics_tokens(&s->metrics, (double)(ev->t_ns - j->t_last) * 1e-9, ev->n_ids);
        j->t_last = ev->t_ns;
    }
    if (!rp->req || !ev->len || rp->failed) /* (a failed reply's answer is its error) */
        return NULL;
    const size_t len0 = rp->out.len; /* 0: not on the list yet */
    int rc = j->reasoning ? sd_rs_feed(&j->rs, ev->text, ev->len) : content_out(j, ev->text, ev->len);
    if (!rc && rp->stream && (j->reasoning || j->tools))
        rc = lp_flush(j);
    if (!rp->stream) {
        if (rc)
            j->text.oom = 1; /* the response fails as out of memory */
        return NULL;
    }
    if (rc != 0) {
        rp->out.len = len0; /* (the event is lost, as a failed write's would be) */
        if (rp->out.p)
            rp->out.p[len0] = 0;
        rp->out.oom = 0;
    }
    return !len0 && rp->out.len ? rp : NULL;
}

/* writes a reply's gathered events */
static void flush_output(reply *rp)
{
    if (rp->req && rp->out.len)
        sd_http_stream_write(rp->req, rp->out.p, rp->out.len); /* a failure: the abort callback follows */
    sd_buf_clear(&rp->out);
}

static void warmup_done(sd_server *s, sd_finish why, const char *msg);

/* the outcome of a finish for the metrics: the worst a reply's choices met */
static sd_outcome outcome_of(sd_finish why)
{
    return why == SD_FINISH_STOP     ? SD_OUTCOME_STOP
           : why == SD_FINISH_LENGTH ? SD_OUTCOME_LENGTH
           : why == SD_FINISH_ERROR  ? SD_OUTCOME_ERROR
                                     : SD_OUTCOME_CANCELLED;
}

/* The last choice finished: the whole response (non-streaming), or the
 * stream's usage and end; the log line and the metrics; frees the reply. */
static void reply_done(sd_server *s, reply *rp, const char *msg)
{
    int status = rp->gone && !rp->warmup ? 499 /* nginx's "client closed request" */
                 : rp->failed         ? rp->e.status
                                      : 200;
    sd_finish why = rp->failed ? rp->fail_why : SD_FINISH_STOP;
    for (int i = 0; i < rp->n && !rp->failed; i++)
        if (rp->jobs[i]->why == SD_FINISH_LENGTH)
            why = SD_FINISH_LENGTH;
    if (rp->req) {
        sd_oai_meta m = job_meta(rp->jobs[0]);
        sd_buf b = {0};
        if (rp->streaming) {
            /* (a failure ended the stream at once: ok here) */
            if (rp->include_usage)
                sd_oai_usage_event(&b, &m, &rp->usage);
            sd_sse_done(&b);
            if (!b.oom)
                sd_http_stream_write(rp->req, b.p, b.len);
            sd_http_stream_end(rp->req);
        } else if (!rp->failed) {
            sd_oai_choice ch[SD_OAI_MAX_N];
            sd_oai_logprobs lp[SD_OAI_MAX_N];
            int oom = 0;
            for (int i = 0; i < rp->n; i++) {
                const job *j = rp->jobs[i];
                lp[i] = (sd_oai_logprobs){s->tok, rp->top_lp, j->lp_ids, j->lp, j->n_lp, NULL};
                ch[i] = (sd_oai_choice){j->text.p ? j->text.p : "", j->text.len,
                                        j->reasoning ? (j->rtext.p ? j->rtext.p : "") : NULL,
                                        j->rtext.len, j->calls, j->n_calls, j->why,
                                        rp->want_lp ? &lp[i] : NULL};
                oom |= j->text.oom | j->rtext.oom;
            }
            if (oom || sd_oai_response(&b, &m, ch, rp->n, &rp->usage)) {
                sd_http_respond_error(rp->req, 500, NULL, "out_of_memory", NULL,
                                      "out of memory building the response");
                status = 500;
            } else {
                sd_http_respond(rp->req, 200, "application/json", NULL, b.p, b.len);
            }
        } else {
            sd_api_error_json(&b, &rp->e);
            sd_http_respond(rp->req, rp->e.status, "application/json", NULL, b.p ? b.p : "", b.len);
        }
        sd_buf_free(&b);
        rp->req = NULL;
    }
    if (!rp->warmup) {
        sd_metrics_outcome(&s->metrics, !rp->refused         ? outcome_of(why)
                                        : rp->e.status == 503 ? SD_OUTCOME_OVERLOADED
                                                              : SD_OUTCOME_REJECTED);
        const sd_req_stats *st = &rp->usage;
        const sd_spec_stats *sp = &st->spec;
        char choices[24] = "";
        if (rp->n > 1)
            snprintf(choices, sizeof choices, " n=%d", rp->n);
        sd_log_info("request %llu %d finish=%s%s prompt=%d completion=%d ttft=%.1fms total=%.1fms "
                    "accepted_len=%.2f%s%s peer %s",
                    (unsigned long long)rp->rid, status, finish_name(why), choices, st->prompt_tokens,
                    st->completion_tokens, st->ttft_s * 1e3, st->total_s * 1e3,
                    sp->steps ? (double)sp->emitted / (double)sp->steps : 0.0,
                    rp->cancel_why ? " cancelled: " : "", rp->cancel_why ? rp->cancel_why : "",
                    rp->peer);
    }
    int warm = rp->warmup;
    reply_free(rp);
    if (warm)
        warmup_done(s, why, msg);
}

static void handle_finish(sd_server *s, event *ev)
{
    job *j = ev->j;
    reply *rp = j->rp;
    sd_finish why = ev->why;
    j->why = why;
    job_ended(j);
    if (!rp->warmup)
        sd_metrics_finished(&s->metrics, &ev->st);
    usage_add(&rp->usage, &ev->st, j->index % rp->per == 0);
    int ok = why == SD_FINISH_STOP || why == SD_FINISH_LENGTH;
    if (!ok && !rp->failed) {
        /* the first failure is the response's; the other choices stop */
        rp->failed = 1;
        rp->fail_why = why;
        if (why == SD_FINISH_ERROR)
            sd_api_error_set(&rp->e, 500, NULL, "engine_error", "the engine failed this request: %s",
                             ev->msg ? ev->msg : "unknown error");
        else
            sd_api_error_set(&rp->e, 503, NULL, "cancelled", "the request was cancelled (%s)",
                             rp->cancel_why ? rp->cancel_why : "engine shutdown");
        if (rp->live)
            reply_cancel(rp, rp->n > 1 ? "another choice of the request failed" : NULL);
        if (rp->req && rp->streaming) {
            /* The status line went out with the first byte: errors travel
             * as an SSE error event, and no [DONE] follows one. */
            sd_buf b = {0};
            flush_output(rp);
            sd_sse_error(&b, &rp->e);
            if (!b.oom)
                sd_http_stream_write(rp->req, b.p, b.len);
            sd_buf_free(&b);
            sd_http_stream_end(rp->req);
            rp->req = NULL;
        }
    } else if (ok && rp->req && !rp->failed) {
        if (j->reasoning || j->tools) {
            /* what the parsers held (an unfinished call: content) goes out */
            int rc = j->reasoning ? sd_rs_end(&j->rs) : 0;
            if (!rc && j->tools)
                rc = sd_tc_end(&j->tc);
            if (rc && !rp->stream)
                j->text.oom = 1;
        }
        if (rp->stream) {
            /* the logprobs of tokens whose text never came (held back, or
             * cut at a stop), then this choice's last chunk */
            lp_flush(j);
            sd_oai_meta m = job_meta(j);
            if (j->tools && j->tc.n_calls)
                sd_oai_tool_calls_finish_event(&rp->out, &m);
            else
                sd_oai_chunk_event(&rp->out, &m, 0, "", 0, why);
            flush_output(rp);
        }
    }
    if (!rp->live)
        reply_done(s, rp, ev->msg);
}

static void on_wake(uv_async_t *a)
{
    sd_server *s = a->data;
    pthread_mutex_lock(&s->mu);
    event *ev = s->q_head;
    s->q_head = s->q_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    /* outputs first, gathered per reply and written once each; then the
     * finishes, in order (a job's finish is its last event; the reply's
     * last frees it) */
    reply *dirty = NULL;
    event *fins = NULL, **fin_tail = &fins;
    while (ev) {
        event *next = ev->next;
        if (ev->fin) {
            ev->next = NULL;
            *fin_tail = ev;
            fin_tail = &ev->next;
        } else {
            reply *rp = handle_output(s, ev);
            if (rp) {
                rp->dirty = dirty;
                dirty = rp;
            }
            free(ev);
        }
        ev = next;
    }
    while (dirty) {
        reply *next = dirty->dirty;
        flush_output(dirty);
        dirty = next;
    }
    for (ev = fins; ev; ev = fins) {
        fins = ev->next;
        handle_finish(s, ev);
        free(ev->msg);
        free(ev);
    }
    check_drained(s);
}

/* The client went away (EOF, reset, or cut off as a slow reader). */
static void on_abort(void *user, sd_http_req *req)
{
    reply *rp = user;
    (void)req;
    rp->req = NULL;
    rp->gone = 1;
    sd_log_info("request %llu: connection to %s closed before the response ended; cancelling",
                (unsigned long long)rp->rid, rp->peer);
    reply_cancel(rp, "client disconnected");
}

/* ---- routes ---------------------------------------------------------------------- */

static int not_ready(sd_server *s, sd_api_error *e)
{
    if (s->draining)
        return sd_api_error_set(e, 503, NULL, "shutting_down", "the server is shutting down");
    switch (s->state) {
    case ST_READY: return 0;
    case ST_NOMODEL:
        return sd_api_error_set(e, 503, NULL, "no_model", "this server runs without a model");
    case ST_FAILED:
        return sd_api_error_set(e, 503, NULL, "model_failed", "the model failed to load");
    default: return sd_api_error_set(e, 503, NULL, "model_loading", "the model is loading");
    }
}

/* A completions prompt (number `which` of the batch), or the chat messages,
 * -> token ids; *think_open: the rendered chat prompt ends with <think>
 * (the reply starts inside its reasoning) */
static int encode_one(sd_server *s, const sd_oai_request *r, int which, int32_t **ids, int *n,
                      int *think_open, sd_api_error *e)
{
    sd_err err = {0};
    *think_open = 0;
    *ids = NULL;
    *n = 0;
    const sd_oai_prompt *pr = r->kind == SD_OAI_COMPLETIONS ? &r->prompts[which] : NULL;
    if (pr && pr->is_ids) {
        *ids = malloc((size_t)pr->n_ids * sizeof **ids);
        if (!*ids)
            return sd_api_error_set(e, 500, NULL, "out_of_memory", "out of memory");
        memcpy(*ids, pr->ids, (size_t)pr->n_ids * sizeof **ids);
        *n = pr->n_ids;
        return 0;
    }
    const char *pp = r->kind == SD_OAI_CHAT ? "messages" : "prompt";
    if (!s->tok)
        return sd_api_error_set(e, 400, pp, "no_tokenizer",
                                "%s: the model has no tokenizer (tokenizer.json or tiktoken.model); send token ids", pp);
    if (pr) {
        if (sd_tok_encode(s->tok, pr->text, pr->len, r->add_special_tokens, ids, n, &err))
            return sd_api_error_set(e, 400, "prompt", "invalid_value", "prompt: %s", err.msg);
        return 0;
    }
    if (!s->ct)
        return sd_api_error_set(e, 400, "messages", "no_chat_template",
                                "chat completions are not available: %s", s->ct_err);
    if (r->n_msgs < 1)
        return sd_api_error_set(e, 400, "messages", "invalid_value", "messages: at least one message is required");
    int n_calls = 0;
    for (int i = 0; i < r->n_msgs; i++)
        n_calls += r->msgs[i].n_calls;
    sd_chat_msg *msgs = calloc((size_t)r->n_msgs, sizeof *msgs);
    sd_chat_call *calls = calloc((size_t)n_calls + 1, sizeof *calls);
    if (!msgs || !calls) {
        free(msgs);
        free(calls);
        return sd_api_error_set(e, 500, NULL, "out_of_memory", "out of memory");
    }
    for (int i = 0, c = 0; i < r->n_msgs; i++) {
        msgs[i].role = r->msgs[i].role;
        /* an assistant's tool calls alone: no content (templates tell None from "") */
        msgs[i].content = r->msgs[i].content_null && r->msgs[i].n_calls ? NULL : r->msgs[i].content;
        msgs[i].calls = calls + c;
        msgs[i].n_calls = r->msgs[i].n_calls;
        msgs[i].tool_call_id = r->msgs[i].tool_call_id;
        for (int k = 0; k < r->msgs[i].n_calls; k++, c++)
            calls[c] = (sd_chat_call){.name = r->msgs[i].calls[k].name,
                                      .arguments = r->msgs[i].calls[k].arguments,
                                      .arguments_text = r->msgs[i].calls[k].arguments_text,
                                      .id = r->msgs[i].calls[k].id};
    }
    char *text = NULL;
    size_t len = 0;
    int rc = sd_chat_render_kw(s->ct, msgs, r->n_msgs, r->tools, &r->kwargs, r->add_generation_prompt, &text, &len,
                               &err);
    free(msgs);
    free(calls);
    if (rc == SD_ENOTSUP)
        return sd_api_error_set(e, 400, r->tools ? "tools" : "messages", "unsupported_parameter",
                                "%s: this model's chat template (%s) has no tool format specd writes out "
                                "(Qwen2.5's, Qwen3's, Llama 3.1's, DeepSeek's and Kimi-K2's are)",
                                r->tools ? "tools" : "messages", sd_chat_template_name(s->ct));
    if (rc)
        return sd_api_error_set(e, 400, "messages", "invalid_value", "messages: %s", err.msg);
    *think_open = sd_rs_prompt_opens(text, len);
    /* The rendered text holds the template's BOS text itself. */
    rc = sd_tok_encode(s->tok, text, len, r->add_special_tokens, ids, n, &err);
    free(text);
    if (rc)
        return sd_api_error_set(e, 400, "messages", "invalid_value", "messages: %s", err.msg);
    return 0;
}

/* Prompts up to this many bytes are tokenized on the loop thread; longer ones
 * on the thread pool, so that a 1 MiB prompt does not stall every stream. */
#define SD_INLINE_ENCODE_BYTES (16u << 10)

static size_t text_bytes(const sd_oai_request *r)
{
    size_t n = 0;
    if (r->kind == SD_OAI_COMPLETIONS) {
        for (int i = 0; i < r->n_prompts; i++)
            n += r->prompts[i].is_ids ? 0 : r->prompts[i].len;
        return n;
    }
    for (int i = 0; i < r->n_msgs; i++)
        n += strlen(r->msgs[i].content) + 256 * (size_t)r->msgs[i].n_calls;
    return n + 1024 * json_array_size(r->tools); /* (their JSON, roughly) */
}

/* A request on its way to the engine (or to /tokenize's answer): parsed
 * and validated (validate), its prompts tokenized (encode), each on the
 * loop thread or the pool (route_prompt says which). */
typedef struct pending {
    uv_work_t w;
    sd_server *s;
    sd_http_req *req; /* NULL once the client went away */
    uint64_t rid;
    int tokenize; /* POST /tokenize, not a generation */
    sd_oai_kind kind;
    /* the pool parses too (pool_work): the body, copied (the request is
     * freed if its client leaves meanwhile), and what the loop thread read
     * of the server for it at its arrival */
    int prep;
    char *body;
    size_t len;
    sd_schema_cache *schemas; /* the engine's, or NULL */
    int nr;                   /* not_ready() at its arrival: nr_e */
    sd_api_error nr_e;
    int vrc; /* validate's: 0, or e says why */
    sd_oai_request r;
    int np;         /* prompts: the batch's (chat: 1) */
    int n_enc;      /* those encoded */
    int32_t **ids;  /* each prompt's token ids */
    int *n;         /* and their counts */
    int rc;
    int think_open; /* the chat prompt ends with <think> */
    sd_api_error e;
    /* json_after done on the pool already: its result (0, or after_e) */
    int after_done, after_rc;
    sd_api_error after_e;
} pending;

/* completions' echo: the text of prompt pi of the request (as the client
 * gave it, or its ids decoded) and its first token, kept in the job */
static int echo_keep(sd_server *s, job *j, const sd_oai_request *r, const pending *p, int pi)
{
    const sd_oai_prompt *pr = &r->prompts[pi];
    j->echo_id = p->ids[pi][0];
    if (!pr->is_ids) {
        j->echo = malloc(pr->len + 1);
        if (!j->echo)
            return SD_ENOMEM;
        memcpy(j->echo, pr->text, pr->len);
        j->echo_len = pr->len;
        return 0;
    }
    sd_err err = {0};
    if (!s->tok) {
        j->echo = strdup("");
        return j->echo ? 0 : SD_ENOMEM;
    }
    return sd_tok_decode(s->tok, p->ids[pi], p->n[pi], 0, &j->echo, &j->echo_len, &err);
}

/* every prompt of p's request -> token ids (p->ids, p->n); 0 or p->e set */
static int encode(sd_server *s, pending *p)
{
    const sd_oai_request *r = &p->r;
    p->np = r->kind == SD_OAI_COMPLETIONS ? r->n_prompts : 1;
    p->ids = calloc((size_t)p->np, sizeof *p->ids);
    p->n = calloc((size_t)p->np, sizeof *p->n);
    if (!p->ids || !p->n)
        return sd_api_error_set(&p->e, 500, NULL, "out_of_memory", "out of memory");
    for (; p->n_enc < p->np; p->n_enc++)
        if (encode_one(s, r, p->n_enc, &p->ids[p->n_enc], &p->n[p->n_enc], &p->think_open, &p->e))
            return p->e.status;
    return 0;
}

/* A chat reply that begins inside the model's reasoning (the prompt ends
 * with <think>), or that may open one (--reasoning-parser: Qwen3 opens its
 * own): a schema (response_format, a forced call) holds for the text after
 * </think>, not for the reasoning. 0, or e set (500). */
static int json_after(sd_server *s, pending *p, sd_api_error *e)
{
    if (p->r.kind != SD_OAI_CHAT || !(p->think_open || s->reasoning))
        return 0;
    return sd_oai_json_after(&p->r, p->think_open ? NULL : "<think>", "</think>",
                             s->think_special, e);
}

/* Parses and validates p's body (the route's kind) and, where the server
 * was ready at its arrival (p->nr clear), decodes a forced call in the
 * model's own format where its template has one: p->vrc, 0 or p->e set.
 * Runs on the loop thread or the pool: it reads only what the server does
 * not change once the request could pass (model_name from the start; the
 * tokenizer, template and reasoning flags once ready, until every pooled
 * request is done: check_drained) and the thread-safe schema cache. */
static void validate(sd_server *s, pending *p, const char *body, size_t len)
{
    int rc = p->tokenize
                 ? sd_oai_parse_tokenize(body, len, s->model_name, p->schemas, &p->r, &p->e)
                 : sd_oai_parse(p->kind, body, len, s->model_name, p->schemas, &p->r, &p->e);
    if (!rc && !p->nr && !p->tokenize && p->r.tool_forced && s->ct)
        rc = sd_oai_force_format(&p->r, sd_chat_template_tool_format(s->ct), &p->e);
    p->vrc = rc;
}

static void pending_free(pending *p)
{
    for (int i = 0; p->ids && i < p->np; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->n);
    sd_oai_request_free(&p->r);
    free(p->body);
    free(p);
}

/* The request parameter the engine's refusal names first ("prompt: ...",
 * "logit_bias: ..."), by the name the client used, or NULL */
static const char *refused_param(const sd_oai_request *r, const char *msg)
{
    static const char *const named[] = {"logit_bias", "top_logprobs", "response_format",
                                        "min_tokens"};
    if (!strncmp(msg, "prompt", 6))
        return r->kind == SD_OAI_CHAT ? "messages" : "prompt";
    if (!strncmp(msg, "max_tokens", 10))
        return r->max_tokens_param;
    for (size_t i = 0; i < SD_ARRAY_LEN(named); i++)
        if (!strncmp(msg, named[i], strlen(named[i])))
            return named[i];
    return NULL;
}

/* The engine half of a generation: context check, admission, submit, and
 * the start of the stream. Consumes p. */
static void generate_submit(sd_server *s, pending *p)
{
    sd_http_req *req = p->req;
    sd_oai_request *r = &p->r;
    sd_api_error e;
    const char *extra = NULL;
    reply *rp = NULL;
    if (not_ready(s, &e)) {
        extra = s->draining ? NULL : "Retry-After: 5\r\n";
        goto fail;
    }
    /* every prompt fits before any is submitted; each its own max_tokens
     * (a completion's default is what its context leaves, at most 16) */
    int max_tok[SD_OAI_MAX_N];
    for (int i = 0; i < p->np; i++) {
        if (sd_oai_fit_context(r, p->n[i], s->max_context, &e))
            goto fail;
        max_tok[i] = r->gen.max_tokens;
    }
    sd_engine_stats es;
    sd_engine_get_stats(s->engine, &es);
    /* Requests submitted that the engine is not running yet: its queue plus
     * what it has not picked up. (A request of n choices counts as one
     * here: its engine requests may run the queue past the limit by n - 1,
     * and it is never refused for its n alone.) */
    if (s->n_jobs - es.running >= s->o->max_queued) {
        sd_api_error_set(&e, 503, NULL, "overloaded",
                         "the server is overloaded (%d requests queued); retry later",
                         s->n_jobs - es.running);
        extra = "Retry-After: 1\r\n";
        goto fail;
    }
    rp = reply_new(s, req, p->rid, r->kind, p->np * r->n);
    if (!rp)
        goto oom;
    rp->per = r->n;
    rp->want_lp = r->gen.logprobs;
    rp->top_lp = r->gen.top_logprobs;
    rp->stream = r->stream;
    rp->include_usage = r->include_usage;
    if (r->tools && (!r->tool_forced || r->tool_format))
        r->gen.keep_special = sd_tc_keeps_special(sd_chat_template_tool_format(s->ct));
    if (s->reasoning && r->kind == SD_OAI_CHAT)
        r->gen.keep_special |= s->think_special;
    if (r->kind != SD_OAI_COMPLETIONS && s->eot_id >= 0) {
        r->gen.stop_ids = &s->eot_id;
        r->gen.n_stop_ids = 1;
    }
    /* echo: the prompts' texts kept before any choice runs (a failure then
     * frees the reply whole) */
    for (int i = 0; r->echo && i < rp->n; i++)
        if (echo_keep(s, rp->jobs[i], r, p, i / r->n)) {
            reply_free(rp);
            goto oom;
        }
    /* the schema after the reasoning (json_after; done on the pool where
     * the request was parsed there: its error is told here all the same) */
    if (p->after_done ? p->after_rc : json_after(s, p, &p->after_e)) {
        e = p->after_e;
        reply_free(rp);
        goto fail;
    }
    sd_req_events ev = {on_output, on_finish, on_logprobs};
    for (int i = 0; i < rp->n; i++) {
        job *j = rp->jobs[i];
        if (r->tools) {
            j->tools = 1;
            const uint64_t key = sd_mix64(s->id_key ^ (rp->rid << 20) ^ ((uint64_t)i << 12) ^ s->id_count);
            if (r->tool_forced && !r->tool_format) /* the reply decodes to the call (forced_schema) */
                sd_tc_init_forced(&j->tc, r->tool_forced == 1 ? r->forced_name : NULL,
                                  r->parallel_tool_calls ? 0 : 1, key, tc_emit, j);
            else
                sd_tc_init(&j->tc, sd_chat_template_tool_format(s->ct), r->parallel_tool_calls ? 0 : 1,
                           key, tc_emit, j);
        }
        if (s->reasoning && r->kind == SD_OAI_CHAT) {
            j->reasoning = 1;
            sd_rs_init(&j->rs, p->think_open, rs_emit, j);
        }
        /* choice c of prompt pi; each choice its own draw: a given seed is
         * each prompt's first choice's, seed + c its c-th's (vLLM's rule) */
        const int pi = i / r->n, c = i % r->n;
        sd_gen_params g = r->gen;
        g.max_tokens = max_tok[pi];
        if (g.has_seed)
            g.seed += (uint64_t)c;
        sd_err err = {0};
        int rc = sd_engine_submit(s->engine, p->ids[pi], p->n[pi], &g, &ev, j, &j->eid, &err);
        if (rc) {
            const char *param = refused_param(r, err.msg);
            sd_api_error_set(&e, rc == SD_EFULL ? 503 : rc == SD_EINVAL || rc == SD_ERANGE ? 400 : 500,
                             param, rc == SD_EFULL ? "overloaded" : "invalid_value", "%s", err.msg);
            if (!rp->live) {
                reply_free(rp);
                goto fail;
            }
            /* choices already running: they stop, and the response is
             * this error once they have */
            rp->failed = 1;
            rp->fail_why = SD_FINISH_ERROR;
            rp->e = e;
            for (int k = i; k < rp->n; k++)
                job_free(rp->jobs[k]);
            rp->n = i; /* (the rest never ran) */
            rp->refused = 1;
            reply_cancel(rp, "another choice of the request was refused");
            break;
        }
        job_live(j);
    }
    sd_log_debug("request %llu: %s, %d prompt tokens%s, max_tokens %d%s, %d choices",
                 (unsigned long long)p->rid, sd_http_path(req), p->n[0],
                 p->np > 1 ? " (the first of the batch)" : "", max_tok[0],
                 rp->stream ? ", streaming" : "", rp->n);
    pending_free(p);
    sd_http_on_abort(req, on_abort, rp);
    if (rp->stream && !rp->failed) {
        if (sd_http_stream_begin(req, 200, "text/event-stream; charset=utf-8",
                                 "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"))
            return; /* gone already: the abort callback cancels */
        rp->streaming = 1;
        if (rp->kind == SD_OAI_CHAT) {
            /* each choice's first chunk: the assistant role */
            for (int i = 0; i < rp->n; i++) {
                sd_oai_meta m = job_meta(rp->jobs[i]);
                sd_oai_chunk_event(&rp->out, &m, 1, "", 0, SD_FINISH_NONE);
            }
        }
    }
    /* echo: each choice's text (and logprobs) starts with the prompt */
    for (int i = 0; i < rp->n && !rp->failed; i++)
        if (rp->jobs[i]->echo && echo_out(rp->jobs[i]))
            rp->jobs[i]->text.oom = 1; /* the response fails as out of memory */
    if (rp->streaming && rp->out.len) {
        if (!rp->out.oom)
            sd_http_stream_write(req, rp->out.p, rp->out.len);
        sd_buf_clear(&rp->out);
    }
    return;
oom:
    sd_api_error_set(&e, 500, NULL, "out_of_memory", "out of memory");
fail:;
    uint64_t rid = p->rid;
    pending_free(p);
    reject(s, req, rid, &e, extra, 1);
}

static void tokenize_answer(sd_server *s, pending *p)
{
    sd_buf b = {0};
    sd_buf_printf(&b, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", p->n[0], s->max_context);
    for (int i = 0; i < p->n[0]; i++)
        sd_buf_printf(&b, i ? ",%d" : "%d", p->ids[0][i]);
    sd_buf_puts(&b, "]}");
    if (b.oom)
        sd_http_respond_error(p->req, 500, NULL, "out_of_memory", NULL, "out of memory");
    else
        sd_http_respond(p->req, 200, "application/json", NULL, b.p, b.len);
    sd_buf_free(&b);
    pending_free(p);
}

/* After the prompt's token ids are known (inline or from the pool). */
static void encoded(sd_server *s, pending *p)
{
    if (p->rc) {
        sd_http_req *req = p->req;
        uint64_t rid = p->rid;
        int counts = !p->tokenize;
        sd_api_error e = p->e;
        pending_free(p);
        reject(s, req, rid, &e, NULL, counts);
    } else if (p->tokenize) {
        tokenize_answer(s, p);
    } else {
        generate_submit(s, p);
    }
}

/* The pool's part of a request: with p->prep its parse and validation,
 * then (the server ready at its arrival) its prompts' tokenization and the
 * schema after the reasoning, every schema compilation it needs (up to
 * ~25 ms each) thus off the loop thread; else the tokenization alone. */
static void pool_work(uv_work_t *w)
{
    pending *p = w->data;
    if (p->prep) {
        validate(p->s, p, p->body, p->len);
        if (p->vrc || p->nr)
            return;
    }
    p->rc = encode(p->s, p);
    if (p->prep && !p->rc && !p->tokenize) {
        p->after_rc = json_after(p->s, p, &p->after_e);
        p->after_done = 1;
    }
}

/* An error before tokenization (validate's, or the server not ready),
 * answered as route_prompt always has. Consumes p. */
static void reject_early(sd_server *s, pending *p, sd_http_req *req, const sd_api_error *e)
{
    const char *extra = e->status == 503 && !s->draining ? "Retry-After: 5\r\n" : NULL;
    sd_api_error copy = *e;
    uint64_t rid = p->rid;
    int counts = !p->tokenize;
    pending_free(p);
    reject(s, req, rid, &copy, extra, counts);
}

static void pool_done(uv_work_t *w, int status)
{
    pending *p = w->data;
    sd_server *s = p->s;
    s->n_pool--;
    if (!p->req) { /* the client left while its request was on the pool */
        pending_free(p);
    } else {
        sd_http_req *req = p->req;
        sd_http_on_abort(req, NULL, NULL);
        if (status < 0) {
            p->rc = sd_api_error_set(&p->e, 503, NULL, "shutting_down",
                                     "the server is shutting down");
            encoded(s, p);
        } else if (p->prep && (p->vrc || p->nr)) {
            reject_early(s, p, req, p->vrc ? &p->e : &p->nr_e);
        } else {
            encoded(s, p);
        }
    }
    check_drained(s);
}

static void pool_abort(void *user, sd_http_req *req)
{
    pending *p = user;
    sd_log_info("request %llu: connection to %s closed while the request was on the thread pool",
                (unsigned long long)p->rid, sd_http_peer(req));
    p->req = NULL;
}

static void pool_queue(sd_server *s, pending *p)
{
    p->w.data = p;
    sd_http_on_abort(p->req, pool_abort, p);
    s->n_pool++;
    uv_queue_work(s->loop, &p->w, pool_work, pool_done);
}

/* Whether parsing body may compile a JSON schema: its response_format is a
 * json_schema, or its tool_choice forces a call (required, or a named
 * function). Told from the raw bytes, without parsing: the words appear
 * there, or a \u escape of an ASCII character, which could spell them.
 * Either way the request is parsed on the pool: a schema's compilation
 * takes up to ~25 ms (json_schema's DFA steps are capped; NOTES), and a
 * client may send a new schema text with every request, which on the loop
 * thread would stall every stream and /health meanwhile. (A body that only
 * mentions the words is parsed on the pool too: one hop, no harm; a
 * json_object's schema after the reasoning, json_after, is one small text
 * of the cache's, compiled once.) */
static int may_compile_schema(const char *body, size_t len)
{
    static const char *const words[] = {"json_schema", "tool_choice"};
    if (!body)
        return 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(words); i++)
        if (memmem(body, len, words[i], strlen(words[i])))
            return 1;
    const char *end = body + len;
    for (const char *q = body; (q = memmem(q, (size_t)(end - q), "\\u00", 4)); q += 4)
        if (end - q > 4 && q[4] >= '0' && q[4] <= '7')
            return 1;
    return 0;
}

/* Parses and validates the body, then tokenizes. Inline, on the loop
 * thread, for a small body that compiles no schema (no latency added to
 * plain requests); on the thread pool for one that may compile a schema or
 * is larger than SD_INLINE_ENCODE_BYTES (a 1 MiB body's parse is
 * milliseconds too), and for a prompt too long to tokenize inline. The
 * client may leave while its request is on the pool (pool_abort), and a
 * drain waits for it (n_pool). */
static void route_prompt(sd_server *s, sd_http_req *req, uint64_t rid, sd_oai_kind kind,
                         int tokenize)
{
    pending *p = calloc(1, sizeof *p);
    if (!p) {
        sd_http_respond_error(req, 500, NULL, "out_of_memory", NULL, "out of memory");
        return;
    }
    p->s = s;
    p->req = req;
    p->rid = rid;
    p->tokenize = tokenize;
    p->kind = kind;
    p->schemas = s->engine ? sd_engine_schemas(s->engine) : NULL;
    p->nr = not_ready(s, &p->nr_e) != 0;
    size_t len;
    const char *body = sd_http_body(req, &len);
    if (len > SD_INLINE_ENCODE_BYTES || may_compile_schema(body, len)) {
        p->body = malloc(len + 1);
        if (!p->body) {
            pending_free(p);
            sd_http_respond_error(req, 500, NULL, "out_of_memory", NULL, "out of memory");
            return;
        }
        if (len)
            memcpy(p->body, body, len);
        p->body[len] = 0;
        p->len = len;
        p->prep = 1;
        pool_queue(s, p);
        return;
    }
    validate(s, p, body, len);
    if (p->vrc || p->nr) {
        reject_early(s, p, req, p->vrc ? &p->e : &p->nr_e);
        return;
    }
    if (text_bytes(&p->r) <= SD_INLINE_ENCODE_BYTES) {
        p->rc = encode(s, p);
        encoded(s, p);
        return;
    }
    pool_queue(s, p);
}

static void route_generate(sd_server *s, sd_http_req *req, uint64_t rid, sd_oai_kind kind)
{
    route_prompt(s, req, rid, kind, 0);
}

static void route_tokenize(sd_server *s, sd_http_req *req, uint64_t rid)
{
    route_prompt(s, req, rid, SD_OAI_COMPLETIONS, 1);
}

static void route_models(sd_server *s, sd_http_req *req, uint64_t rid)
{
    (void)rid;
    const char *path = sd_http_path(req);
    sd_buf b = {0};
    if (!strcmp(path, "/v1/models")) {
        sd_oai_models(&b, s->model_name, s->started, s->max_context);
    } else {
        /* GET /v1/models/{model}: the model object alone */
        const char *name = path + strlen("/v1/models/");
        if (strcmp(name, s->model_name) != 0) {
            sd_http_respond_error(req, 404, "model", "model_not_found", NULL,
                                  "The model '%.200s' does not exist", name);
            return;
        }
        sd_buf list = {0};
        sd_oai_models(&list, s->model_name, s->started, s->max_context);
        /* {"object":"list","data":[X]} -> X */
        const char *open = list.p ? strchr(list.p, '[') : NULL;
        const char *close = list.p ? strrchr(list.p, ']') : NULL;
        if (open && close && close > open)
            sd_buf_append(&b, open + 1, (size_t)(close - open - 1));
        sd_buf_free(&list);
    }
    if (b.oom || !b.len)
        sd_http_respond_error(req, 500, NULL, "out_of_memory", NULL, "out of memory");
    else
        sd_http_respond(req, 200, "application/json", NULL, b.p, b.len);
    sd_buf_free(&b);
}

static void route_metrics(sd_server *s, sd_http_req *req, uint64_t rid)
{
    (void)rid;
    sd_engine_stats es;
    if (s->engine)
        sd_engine_get_stats(s->engine, &es);
    sd_buf b = {0};
    if (sd_metrics_render(&s->metrics, s->engine ? &es : NULL, &b))
        sd_http_respond_error(req, 500, NULL, "out_of_memory", NULL, "out of memory");
    else
        sd_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.p, b.len);
    sd_buf_free(&b);
}

static int engine_stalled(sd_server *s)
{
    sd_engine_stats es;
    sd_engine_get_stats(s->engine, &es);
    return (es.running || es.queued) && es.last_step_ns && sd_now_ns() > es.last_step_ns &&
           sd_now_ns() - es.last_step_ns > SD_STALL_NS;
}

/* Probes come every few seconds: answered without a log line. */
static void route_health(sd_server *s, sd_http_req *req, uint64_t rid)
{
    (void)rid;
    sd_api_error e;
    int bad = not_ready(s, &e) != 0;
    sd_engine_stats es = {0};
    if (!bad)
        sd_engine_get_stats(s->engine, &es);
    if (!bad && es.failing > 0) {
        /* a GPU error is sticky and an aborted tensor-parallel group stays
         * aborted: a restart is the remedy, so say so to the orchestrator */
        sd_api_error_set(&e, 503, NULL, "engine_failed",
                         "the last %d model step(s) failed (the log says why)", es.failing);
        bad = 1;
    }
    if (!bad && engine_stalled(s)) {
        sd_api_error_set(&e, 503, NULL, "engine_stalled",
                         "the engine has work and has not completed a step for over %llu s",
                         (unsigned long long)(SD_STALL_NS / 1000000000ull));
        bad = 1;
    }
    if (!bad) {
        static const char ok[] = "{\"status\":\"ok\"}";
        sd_http_respond(req, 200, "application/json", NULL, ok, sizeof ok - 1);
        return;
    }
    sd_buf b = {0};
    sd_api_error_json(&b, &e);
    sd_http_respond(req, 503, "application/json", NULL, b.p ? b.p : "", b.len);
    sd_buf_free(&b);
}

static void handle(void *user, sd_http_req *req)
{
    sd_server *s = user;
    uint64_t rid = ++s->next_rid;
    const char *path = sd_http_path(req);
    const char *method = sd_http_method(req);
    if (sd_route_needs_key(path) && !auth_ok(s, req)) {
        sd_api_error e;
        sd_api_error_set(&e, 401, NULL, "invalid_api_key",
                         "missing or wrong API key: send `Authorization: Bearer KEY`");
        reject(s, req, rid, &e, "WWW-Authenticate: Bearer\r\n", 0);
        return;
    }
    sd_route route;
    const char *allow;
    int st = sd_route_find(method, path, &route, &allow);
    sd_api_error e;
    switch (st == 200 ? route : SD_ROUTE_NONE) {
    case SD_ROUTE_CHAT: route_generate(s, req, rid, SD_OAI_CHAT); return;
    case SD_ROUTE_COMPLETIONS: route_generate(s, req, rid, SD_OAI_COMPLETIONS); return;
    case SD_ROUTE_MODELS:
    case SD_ROUTE_MODEL: route_models(s, req, rid); return;
    case SD_ROUTE_TOKENIZE: route_tokenize(s, req, rid); return;
    case SD_ROUTE_METRICS: route_metrics(s, req, rid); return;
    case SD_ROUTE_HEALTH: route_health(s, req, rid); return;
    case SD_ROUTE_NONE: break;
    }
    if (st == 405) {
        char extra[64];
        snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
        sd_api_error_set(&e, 405, NULL, "method_not_allowed", "%s %s: use %s", method, path,
                         allow);
        reject(s, req, rid, &e, extra, 0);
    } else {
        sd_api_error_set(&e, 404, NULL, "not_found", "no route %s %.200s", method, path);
        reject(s, req, rid, &e, NULL, 0);
    }
}

/* ---- loading, warm-up, watchdog ------------------------------------------------- */

static void load_work(uv_work_t *w)
{
    sd_server *s = w->data;
    s->load_rc = sd_engine_create(&s->loaded, s->o, &s->load_err);
}

static void fail_start(sd_server *s, const char *what, const char *msg)
{
    sd_log_error("%s: %s", what, msg);
    s->state = ST_FAILED;
    s->exit_status = 1;
    sd_server_drain(s);
}

static void warmup(sd_server *s)
{
    int32_t *ids = NULL;
    int n = 0;
    sd_err err = {0};
    if (s->tok)
        sd_tok_encode(s->tok, "Hello", 5, 1, &ids, &n, &err);
    if (!n) {
        free(ids);
        ids = calloc(1, sizeof *ids);
        n = ids ? 1 : 0;
    }
    reply *rp = reply_new(s, NULL, 0, SD_OAI_COMPLETIONS, 1);
    if (!rp || !ids) {
        free(ids);
        if (rp)
            reply_free(rp);
        fail_start(s, "warm-up", "out of memory");
        return;
    }
    rp->warmup = 1;
    job *j = rp->jobs[0];
    sd_gen_params p = {.max_tokens = 1, .temperature = 0, .top_p = 1, .has_seed = 1};
    sd_req_events ev = {on_output, on_finish, NULL};
    if (sd_engine_submit(s->engine, ids, n, &p, &ev, j, &j->eid, &err)) {
        reply_free(rp);
        free(ids);
        fail_start(s, "warm-up", err.msg);
        return;
    }
    job_live(j);
    free(ids);
}

static void warmup_done(sd_server *s, sd_finish why, const char *msg)
{
    if (why != SD_FINISH_STOP && why != SD_FINISH_LENGTH) {
        if (!s->draining)
            fail_start(s, "warm-up request", msg ? msg : finish_name(why));
        return;
    }
    s->state = ST_READY;
    sd_log_info("ready: serving %s on http://%s:%d (context %d tokens%s)", s->model_name,
                s->o->host, sd_http_port(s->http), s->max_context,
                s->ct ? "" : "; chat completions unavailable");
    char st[512];
    snprintf(st, sizeof st, "READY=1\nSTATUS=serving %s on port %d", s->model_name,
             sd_http_port(s->http));
    sd_notify_state(st);
}

static void load_done(uv_work_t *w, int status)
{
    sd_server *s = w->data;
    s->loading = 0;
    if (status == UV_ECANCELED) {
        check_drained(s);
        return;
    }
    if (s->load_rc) {
        fail_start(s, "loading the model", s->load_err.msg);
        return;
    }
    s->engine = s->loaded;
    s->tok = sd_engine_tokenizer(s->engine);
    s->max_context = sd_engine_max_context(s->engine);
    if (s->draining) {
        check_drained(s);
        return;
    }
    s->reasoning = s->o->reasoning_parser && strcmp(s->o->reasoning_parser, "none") != 0;
    const char *ctn = s->o->chat_template && *s->o->chat_template ? s->o->chat_template : "auto";
    sd_err err = {0};
    if (!s->tok) {
        snprintf(s->ct_err, sizeof s->ct_err, "the model has no tokenizer");
    } else if (sd_chat_template_load(&s->ct, sd_engine_model_dir(s->engine), ctn, &err)) {
        s->ct = NULL;
        if (strcmp(ctn, "auto") != 0) {
            fail_start(s, "--chat-template", err.msg);
            return;
        }
        snprintf(s->ct_err, sizeof s->ct_err, "%s", err.msg);
        sd_log_warn("chat completions unavailable: %s", err.msg);
    }
    if (s->reasoning && s->tok) {
        static const char *const tags[] = {"<think>", "</think>"};
        for (int i = 0; i < 2; i++)
            s->think_special |= sd_tok_is_special(s->tok, sd_tok_token_id(s->tok, tags[i], strlen(tags[i])));
    }
    /* A chat turn ends at the template's end-of-turn token, whether or not
     * the checkpoint lists it among its eos ids. */
    s->eot_id = -1;
    if (s->ct && sd_chat_template_stop(s->ct)) {
        const char *eot = sd_chat_template_stop(s->ct);
        s->eot_id = sd_tok_token_id(s->tok, eot, strlen(eot));
    }
    s->state = ST_WARMING;
    warmup(s);
}

/* WATCHDOG=1 only while the engine makes progress: it completed a step
 * since the last ping, or it has nothing to do. A wedged engine stops the
 * pings and systemd restarts the service after WatchdogSec. */
static void on_watchdog(uv_timer_t *t)
{
    sd_server *s = t->data;
    if (!s->engine) {
        sd_notify_state("WATCHDOG=1"); /* loading: bounded by systemd's TimeoutStartSec */
        return;
    }
    sd_engine_stats es;
    sd_engine_get_stats(s->engine, &es);
    int idle = es.running == 0 && es.queued == 0;
    if (es.failing > 0)
        sd_log_warn("watchdog: the last %d model step(s) failed; not pinging systemd",
                    es.failing);
    else if (idle || es.last_step_ns != s->wd_last_step)
        sd_notify_state("WATCHDOG=1");
    else
        sd_log_warn("watchdog: %d requests and no engine step for %.1f s; not pinging systemd",
                    es.running + es.queued,
                    es.last_step_ns ? (double)(sd_now_ns() - es.last_step_ns) * 1e-9 : 0.0);
    s->wd_last_step = es.last_step_ns;
}

/* ---- drain and close -------------------------------------------------------------- */

static void cancel_all(sd_server *s, const char *why)
{
    for (job *j = s->jobs; j; j = j->next) {
        if (!j->rp->cancel_why)
            j->rp->cancel_why = why;
        if (s->engine)
            sd_engine_cancel(s->engine, j->eid);
    }
}

static void on_drain_timeout(uv_timer_t *t)
{
    sd_server *s = t->data;
    if (s->n_jobs)
        sd_log_warn("shutdown: --shutdown-timeout passed; cancelling %d requests", s->n_jobs);
    cancel_all(s, "server shutdown");
}

static void on_signal(uv_signal_t *h, int signum)
{
    sd_server *s = h->data;
    sd_log_info("%s received", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    sd_server_drain(s);
}

static void handle_closed(uv_handle_t *h)
{
    sd_server *s = h->data;
    s->handles_open--;
}

static void close_handle(sd_server *s, uv_handle_t *h)
{
    if (h->loop && !uv_is_closing(h)) {
        s->handles_open++;
        uv_close(h, handle_closed);
    }
}

static void http_closed(void *arg) { (void)arg; }

static void close_all(sd_server *s)
{
    s->closing = 1;
    if (s->engine) {
        sd_engine_destroy(s->engine);
        s->engine = NULL;
        s->tok = NULL;
    }
    if (s->http)
        sd_http_server_close(s->http, http_closed, s);
    close_handle(s, (uv_handle_t *)&s->wake);
    close_handle(s, (uv_handle_t *)&s->sigterm);
    close_handle(s, (uv_handle_t *)&s->sigint);
    close_handle(s, (uv_handle_t *)&s->watchdog);
    close_handle(s, (uv_handle_t *)&s->drain_timer);
}

static void check_drained(sd_server *s)
{
    if (!s->draining || s->closing || s->n_jobs || s->loading || s->n_pool)
        return;
    sd_log_info("shutdown: drained");
    close_all(s);
}

void sd_server_drain(sd_server *s)
{
    if (s->closing)
        return;
    if (s->draining) {
        sd_log_info("shutdown: cancelling %d requests now", s->n_jobs);
        cancel_all(s, "server shutdown");
        check_drained(s);
        return;
    }
    s->draining = 1;
    sd_notify_state("STOPPING=1");
    sd_log_info("shutdown: %d requests in flight; waiting up to %g s", s->n_jobs,
                s->o->shutdown_timeout);
    if (s->http)
        sd_http_stop_accepting(s->http);
    if (s->loading)
        uv_cancel((uv_req_t *)&s->load); /* only succeeds before the load began */
    uv_timer_start(&s->drain_timer, on_drain_timeout, (uint64_t)(s->o->shutdown_timeout * 1000),
                   0);
    check_drained(s);
}

/* ---- start ------------------------------------------------------------------------ */

static void model_name_of(const sd_opts *o, char *out, size_t n)
{
    if (o->served_model_name && *o->served_model_name) {
        snprintf(out, n, "%s", o->served_model_name);
        return;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", o->model && *o->model ? o->model : sd_bundled_model_dir());
    size_t l = strlen(dir);
    while (l > 1 && dir[l - 1] == '/')
        dir[--l] = 0;
    const char *base = strrchr(dir, '/');
    snprintf(out, n, "%s", base && base[1] ? base + 1 : dir);
}

int sd_server_start(sd_server **out, uv_loop_t *loop, const sd_opts *o, unsigned flags,
                    sd_err *err)
{
    sd_server *s = calloc(1, sizeof *s);
    if (!s)
        return sd_err_set(err, SD_ENOMEM, "serve: out of memory");
    s->loop = loop;
    s->o = o;
    s->flags = flags;
    s->started = (long long)time(NULL);
    s->state = flags & SD_SERVER_NO_ENGINE ? ST_NOMODEL : ST_LOADING;
    sd_metrics_init(&s->metrics);
    pthread_mutex_init(&s->mu, NULL);
    model_name_of(o, s->model_name, sizeof s->model_name);
    snprintf(s->ct_err, sizeof s->ct_err, "the model is not loaded");
    if (getrandom(&s->id_key, sizeof s->id_key, GRND_NONBLOCK) != sizeof s->id_key)
        s->id_key = sd_now_ns() ^ ((uint64_t)getpid() << 32);
    const char *key = o->api_key && *o->api_key ? o->api_key : getenv("SPECD_API_KEY");
    if (key && *key) {
        s->api_key = strdup(key);
        s->api_key_len = strlen(key);
    }

    sd_http_limits lim;
    sd_http_limits_default(&lim);
    lim.max_body = (size_t)o->max_body;
    lim.header_timeout_ms = (uint64_t)(o->header_timeout * 1000);
    lim.body_timeout_ms = (uint64_t)(o->body_timeout * 1000);
    lim.max_output = (size_t)o->max_output_buffer;
    int rc = sd_http_server_create(&s->http, loop, &lim, handle, s, &s->metrics, err);
    if (rc) {
        free(s->api_key);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    uv_async_init(loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_timer_init(loop, &s->drain_timer);
    s->drain_timer.data = s;
    if (!(flags & SD_SERVER_NO_LISTEN) && (rc = sd_http_listen(s->http, o->host, o->port, err))) {
        s->draining = 1;
        close_all(s);
        while (s->handles_open || sd_http_connections(s->http))
            uv_run(loop, UV_RUN_NOWAIT);
        uv_run(loop, UV_RUN_NOWAIT); /* the listener's close callback */
        sd_server_free(s);
        return rc;
    }
    if (!(flags & SD_SERVER_NO_SIGNALS)) {
        uv_signal_init(loop, &s->sigterm);
        uv_signal_init(loop, &s->sigint);
        s->sigterm.data = s->sigint.data = s;
        uv_signal_start(&s->sigterm, on_signal, SIGTERM);
        uv_signal_start(&s->sigint, on_signal, SIGINT);
    }
    s->watchdog_usec = sd_notify_watchdog_usec();
    if (s->watchdog_usec) {
        uv_timer_init(loop, &s->watchdog);
        s->watchdog.data = s;
        uint64_t ms = s->watchdog_usec / 2000;
        uv_timer_start(&s->watchdog, on_watchdog, ms ? ms : 1, ms ? ms : 1);
    }
    if (!(flags & SD_SERVER_NO_LISTEN))
        sd_log_info("listening on http://%s:%d; %s", o->host, sd_http_port(s->http),
                    flags & SD_SERVER_NO_ENGINE ? "no model" : "loading the model");
    if (!(flags & SD_SERVER_NO_ENGINE)) {
        s->loading = 1;
        s->load.data = s;
        uv_queue_work(loop, &s->load, load_work, load_done);
    }
    *out = s;
    return 0;
}

int sd_server_port(const sd_server *s) { return sd_http_port(s->http); }
int sd_server_exit_status(const sd_server *s) { return s->exit_status; }

void sd_server_feed(sd_server *s, const void *data, size_t len, sd_buf *out)
{
    sd_http_feed_memory(s->http, data, len, out);
}

void sd_server_free(sd_server *s)
{
    if (!s)
        return;
    if (s->engine)
        sd_engine_destroy(s->engine);
    for (event *ev = s->q_head, *next; ev; ev = next) {
        next = ev->next;
        free(ev->msg);
        free(ev);
    }
    sd_chat_template_free(s->ct);
    sd_http_server_free(s->http);
    free(s->api_key);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

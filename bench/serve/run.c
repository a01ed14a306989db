/* bench/serve/run: one timed run on a libuv loop.
 *
 * Connections are kept alive and reused LIFO; each carries one request at a
 * time. A request whose reused connection turns out closed before any byte
 * of the response came back (the server's keep-alive timeout raced our
 * write) is sent once more on a fresh connection, its send time unchanged.
 * Every request ends exactly once through end_request; the loop ends when
 * all requests ended (or the duration limit stopped the run) and every
 * handle is closed. */
#include <jansson.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "bench/serve/internal.h"
#include "bench/serve/sse.h"

#define SSE_MAX_EVENT (1u << 20) /* bytes of one SSE event */
#define ERRBODY_MAX 2048         /* bytes of an error response kept for the message */
#define TICK_MS 20               /* timeouts, duration limit and progress are checked this often */

typedef struct runner runner;
typedef struct conn conn;

enum { C_CONNECTING, C_BUSY, C_IDLE, C_CLOSING };

struct conn {
    uv_tcp_t tcp;
    runner *r;
    int state;
    conn *next, *prev; /* every open connection */
    conn *next_idle;
    sd_bench_rec *rec; /* the request it carries, NULL when idle */
    int reused;        /* a response came back on it before this request */
    int writing;       /* wreq is in flight: the connection cannot take another request */
    size_t resp_bytes; /* bytes of this request's response so far */
    llhttp_t parser;
    int http_status;
    int msg_complete;
    int got_done;
    sd_bench_status fail; /* set by a parser callback that stopped the parse */
    char fail_msg[200];
    sd_bench_sse sse;
    sd_buf errbody;
    uv_connect_t creq;
    uv_write_t wreq;
    char rbuf[65536];
};

struct runner {
    uv_loop_t loop;
    const sd_bench_cfg *cfg;
    struct sockaddr_storage addr;
    llhttp_settings_t settings;
    sd_bench_rec *recs;
    int n;
    char **reqs; /* (n) whole HTTP requests, built before the clock starts */
    size_t *req_len;
    int arrived, next_send, in_flight, peak, finished, ok, failed;
    long long out_tokens;
    conn *conns, *idle;
    uv_timer_t arrival_timer, tick_timer;
    uint64_t t0;
    double last_progress, duration;
    int stopping, shut;
    int conns_opened;
};

static double now_s(const runner *r) { return (double)(uv_hrtime() - r->t0) * 1e-9; }

static void pump(runner *r);
static int dispatch_new(runner *r, sd_bench_rec *rec);

/* ---- the requests ------------------------------------------------------------- */

static char *build_request(const sd_bench_cfg *cfg, int id, const char *prompt, size_t *len)
{
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(cfg->model ? cfg->model : ""));
    if (cfg->endpoint == SD_BENCH_CHAT) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", json_string(prompt));
        json_t *a = json_array();
        json_array_append_new(a, m);
        json_object_set_new(o, "messages", a);
    } else {
        json_object_set_new(o, "prompt", json_string(prompt));
    }
    if (cfg->max_tokens > 0)
        json_object_set_new(o, "max_tokens", json_integer(cfg->max_tokens));
    if (cfg->temperature >= 0)
        json_object_set_new(o, "temperature", json_real(cfg->temperature));
    if (cfg->ignore_eos)
        json_object_set_new(o, "ignore_eos", json_true());
    if (cfg->json_object) {
        json_t *rf = json_object();
        json_object_set_new(rf, "type", json_string("json_object"));
        json_object_set_new(o, "response_format", rf);
    }
    if (cfg->send_seed)
        json_object_set_new(o, "seed", json_integer((json_int_t)((cfg->seed + (uint64_t)id) &
                                                                 0x7fffffffffffffffull)));
    json_object_set_new(o, "stream", json_true());
    json_t *so = json_object();
    json_object_set_new(so, "include_usage", json_true());
    json_object_set_new(o, "stream_options", so);
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!body)
        return NULL;
    sd_buf b = {0};
    size_t bl = strlen(body);
    sd_buf_printf(&b,
                  "POST %s/v1/%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: specd-bench-serve\r\n"
                  "Accept: text/event-stream\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\n",
                  cfg->target.base, cfg->endpoint == SD_BENCH_CHAT ? "chat/completions" : "completions",
                  cfg->target.hostport, bl);
    if (cfg->api_key && *cfg->api_key)
        sd_buf_printf(&b, "Authorization: Bearer %s\r\n", cfg->api_key);
    sd_buf_puts(&b, "\r\n");
    sd_buf_append(&b, body, bl);
    free(body);
    if (b.oom) {
        sd_buf_free(&b);
        return NULL;
    }
    return sd_buf_take(&b, len);
}

/* ---- the end of a request ----------------------------------------------------- */

static void end_request(runner *r, sd_bench_rec *rec, sd_bench_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void end_request(runner *r, sd_bench_rec *rec, sd_bench_status st, const char *fmt, ...)
{
    double t = now_s(r);
    rec->status = st;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rec->error, sizeof rec->error, fmt, ap);
        va_end(ap);
    }
    if (st != SD_BENCH_OK || rec->t_end < 0)
        rec->t_end = t;
    if (st == SD_BENCH_OK) {
        sd_bench_rec_derive(rec);
        r->ok++;
        r->out_tokens += rec->out_tokens - rec->n_chunks; /* chunks were counted as they came */
    } else if (st != SD_BENCH_CANCELLED) {
        r->failed++;
    }
    r->in_flight--;
    r->finished++;
    r->duration = t;
}

/* ---- connections -------------------------------------------------------------- */

static void on_close(uv_handle_t *h)
{
    conn *c = h->data;
    runner *r = c->r;
    if (c->prev)
        c->prev->next = c->next;
    else
        r->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    sd_bench_sse_free(&c->sse);
    sd_buf_free(&c->errbody);
    free(c);
}

static void conn_close(conn *c)
{
    if (c->state == C_CLOSING)
        return;
    if (c->state == C_IDLE) {
        conn **pp = &c->r->idle;
        while (*pp && *pp != c)
            pp = &(*pp)->next_idle;
        if (*pp)
            *pp = c->next_idle;
    }
    c->state = C_CLOSING;
    c->rec = NULL;
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

/* The request on c failed: c is closed; the request is resent once when c
 * was a reused connection that never answered (a stale keep-alive). */
static void conn_fail(conn *c, sd_bench_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_fail(conn *c, sd_bench_status st, const char *fmt, ...)
{
    runner *r = c->r;
    sd_bench_rec *rec = c->rec;
    int stale = c->reused && c->resp_bytes == 0 && st == SD_BENCH_ERR_IO;
    conn_close(c);
    if (!rec)
        return;
    if (stale && rec->attempts < 2 && !r->stopping) {
        rec->attempts++;
        int e = dispatch_new(r, rec);
        if (e == 0)
            return;
        end_request(r, rec, SD_BENCH_ERR_CONNECT, "connect to %s: %s", r->cfg->target.hostport,
                    uv_strerror(e));
    } else {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        end_request(r, rec, st, "%s", msg);
    }
    pump(r);
}

/* The response on c ended (llhttp's message complete). */
static void complete(conn *c, int keep_alive)
{
    runner *r = c->r;
    sd_bench_rec *rec = c->rec;
    c->rec = NULL;
    if (c->http_status == 200) {
        if (!c->got_done)
            end_request(r, rec, SD_BENCH_ERR_STREAM, "stream ended without data: [DONE]");
        else
            end_request(r, rec, SD_BENCH_OK, NULL);
    } else {
        /* OpenAI-shaped errors carry {"error": {"message": ...}}; else the body's start. */
        const char *msg = NULL;
        json_t *o = c->errbody.len ? json_loadb(c->errbody.p, c->errbody.len, 0, NULL) : NULL;
        json_t *m = json_object_get(json_object_get(o, "error"), "message");
        if (json_is_string(m))
            msg = json_string_value(m);
        end_request(r, rec, SD_BENCH_ERR_HTTP, "HTTP %d: %.160s", c->http_status,
                    msg ? msg : c->errbody.len ? c->errbody.p : "(no body)");
        json_decref(o);
    }
    /* A server may answer before it has read the whole request (an early
     * error); the connection is reusable only once our write is done. */
    if (keep_alive && !r->stopping && !c->writing) {
        c->state = C_IDLE;
        c->reused = 1;
        c->next_idle = r->idle;
        r->idle = c;
    } else {
        conn_close(c);
    }
    pump(r);
}

/* ---- the parsers ------------------------------------------------------------ */

static void set_fail(conn *c, sd_bench_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_fail(conn *c, sd_bench_status st, const char *fmt, ...)
{
    c->fail = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail_msg, sizeof c->fail_msg, fmt, ap);
    va_end(ap);
}

static long long int_field(json_t *o, const char *key, long long dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : dflt;
}

/* One SSE event of a 200 response. */
static int on_event(void *user, const char *data, size_t len)
{
    conn *c = user;
    sd_bench_rec *rec = c->rec;
    runner *r = c->r;
    double t = now_s(r);
    if (c->got_done)
        return 0; /* after [DONE] nothing counts (clients stop reading there) */
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        c->got_done = 1;
        rec->t_end = t;
        return 0;
    }
    json_error_t je;
    json_t *o = json_loadb(data, len, 0, &je);
    if (!o || !json_is_object(o)) {
        set_fail(c, SD_BENCH_ERR_STREAM, "malformed SSE data (%s): %.60s",
                 o ? "not a JSON object" : je.text, data);
        json_decref(o);
        return SD_EFORMAT;
    }
    json_t *err = json_object_get(o, "error");
    if (err) {
        json_t *m = json_object_get(err, "message");
        set_fail(c, SD_BENCH_ERR_STREAM, "error event in the stream: %.160s",
                 json_is_string(m) ? json_string_value(m) : "(no message)");
        json_decref(o);
        return SD_EFORMAT;
    }
    json_t *choices = json_object_get(o, "choices");
    if (choices && !json_is_array(choices)) {
        set_fail(c, SD_BENCH_ERR_STREAM, "malformed chunk: \"choices\" is not an array");
        json_decref(o);
        return SD_EFORMAT;
    }
    size_t tl = 0;
    json_t *ch = json_array_get(choices, 0);
    if (ch) {
        json_t *v = r->cfg->endpoint == SD_BENCH_CHAT
                        ? json_object_get(json_object_get(ch, "delta"), "content")
                        : json_object_get(ch, "text");
        if (json_is_string(v))
            tl = json_string_length(v);
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr))
            snprintf(rec->finish_reason, sizeof rec->finish_reason, "%s", json_string_value(fr));
    }
    if (tl > 0) {
        if (rec->n_chunks == rec->cap_chunks) {
            int nc = rec->cap_chunks ? rec->cap_chunks * 2 : 64;
            double *p = realloc(rec->chunk_t, sizeof(double) * (size_t)nc);
            if (!p) {
                set_fail(c, SD_BENCH_ERR_STREAM, "out of memory recording chunk times");
                json_decref(o);
                return SD_ENOMEM;
            }
            rec->chunk_t = p;
            rec->cap_chunks = nc;
        }
        rec->chunk_t[rec->n_chunks++] = t;
        rec->content_bytes += tl;
        r->out_tokens++;
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        rec->prompt_tokens = (int)int_field(u, "prompt_tokens", rec->prompt_tokens);
        rec->usage_completion_tokens =
            (int)int_field(u, "completion_tokens", rec->usage_completion_tokens);
        json_t *sp = json_object_get(u, "speculative");
        if (json_is_object(sp)) {
            rec->has_spec = 1;
            rec->spec_steps = int_field(sp, "steps", 0);
            rec->spec_drafted = int_field(sp, "draft_tokens", 0);
            rec->spec_accepted = int_field(sp, "accepted_tokens", 0);
        }
    }
    json_decref(o);
    return 0;
}

static conn *pconn(llhttp_t *p) { return p->data; }

static int on_headers_complete(llhttp_t *p)
{
    conn *c = pconn(p);
    c->http_status = llhttp_get_status_code(p);
    if (c->rec)
        c->rec->http_status = c->http_status;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    conn *c = pconn(p);
    if (!c->rec)
        return 0;
    if (c->http_status != 200) {
        size_t room = c->errbody.len < ERRBODY_MAX ? ERRBODY_MAX - c->errbody.len : 0;
        sd_buf_append(&c->errbody, at, len < room ? len : room);
        return 0;
    }
    int rc = sd_bench_sse_feed(&c->sse, at, len);
    if (rc == 0)
        return 0;
    if (!c->fail)
        set_fail(c, SD_BENCH_ERR_STREAM, rc == SD_ERANGE ? "SSE event over %u bytes"
                                                         : "SSE parser out of memory (%u)",
                 SSE_MAX_EVENT);
    return -1;
}

static int on_message_complete(llhttp_t *p)
{
    pconn(p)->msg_complete = 1;
    return HPE_PAUSED; /* the rest is done outside the parser, which may then be reset */
}

/* ---- libuv callbacks ---------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    conn *c = h->data;
    *b = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = s->data;
    if (nread == 0 || c->state == C_CLOSING)
        return;
    if (!c->rec) { /* idle: the server closed it, or sent bytes nobody asked for */
        conn_close(c);
        return;
    }
    if (nread < 0) {
        /* llhttp_finish reports our on_message_complete's pause as HPE_PAUSED. */
        llhttp_errno_t fe =
            nread == UV_EOF && c->resp_bytes > 0 ? llhttp_finish(&c->parser) : HPE_INTERNAL;
        if ((fe == HPE_OK || fe == HPE_PAUSED) && c->msg_complete) {
            complete(c, 0); /* a body delimited by the connection's end */
            return;
        }
        if (c->resp_bytes == 0)
            conn_fail(c, SD_BENCH_ERR_IO, "connection closed before any response (%s)",
                      uv_strerror((int)nread));
        else
            conn_fail(c, SD_BENCH_ERR_IO, "connection closed mid-response (%s)",
                      uv_strerror((int)nread));
        return;
    }
    c->resp_bytes += (size_t)nread;
    llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)nread);
    if (e == HPE_PAUSED && c->msg_complete) {
        /* Bytes after the response were not asked for: do not reuse the connection. */
        const char *pos = llhttp_get_error_pos(&c->parser);
        int extra = pos && pos < buf->base + nread;
        complete(c, !extra && llhttp_should_keep_alive(&c->parser));
    } else if (e != HPE_OK) {
        if (c->fail)
            conn_fail(c, c->fail, "%s", c->fail_msg);
        else
            conn_fail(c, SD_BENCH_ERR_IO, "bad HTTP response: %s",
                      llhttp_get_error_reason(&c->parser) ? llhttp_get_error_reason(&c->parser)
                                                          : llhttp_errno_name(e));
    }
}

static void on_write(uv_write_t *w, int status)
{
    conn *c = w->data;
    c->writing = 0;
    if (status < 0 && c->state != C_CLOSING && c->rec)
        conn_fail(c, SD_BENCH_ERR_IO, "sending the request: %s", uv_strerror(status));
}

static void send_req(conn *c)
{
    runner *r = c->r;
    sd_bench_rec *rec = c->rec;
    c->state = C_BUSY;
    c->resp_bytes = 0;
    c->http_status = 0;
    c->msg_complete = 0;
    c->got_done = 0;
    c->fail = SD_BENCH_OK;
    c->fail_msg[0] = 0;
    sd_bench_sse_reset(&c->sse);
    sd_buf_clear(&c->errbody);
    llhttp_init(&c->parser, HTTP_RESPONSE, &r->settings);
    c->parser.data = c;
    uv_buf_t b = uv_buf_init(r->reqs[rec->id], (unsigned)r->req_len[rec->id]);
    int e = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    c->writing = e == 0;
    if (e)
        conn_fail(c, SD_BENCH_ERR_IO, "sending the request: %s", uv_strerror(e));
}

static void on_connect(uv_connect_t *req, int status)
{
    conn *c = req->data;
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        conn_fail(c, SD_BENCH_ERR_CONNECT, "connect to %s: %s", c->r->cfg->target.hostport,
                  uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    int e = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (e) {
        conn_fail(c, SD_BENCH_ERR_CONNECT, "reading from %s: %s", c->r->cfg->target.hostport,
                  uv_strerror(e));
        return;
    }
    send_req(c);
}

/* Opens a connection for rec; a libuv error code when that fails at once. */
static int dispatch_new(runner *r, sd_bench_rec *rec)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return UV_ENOMEM;
    c->r = r;
    int e = uv_tcp_init(&r->loop, &c->tcp);
    if (e) {
        free(c);
        return e;
    }
    c->tcp.data = c;
    c->creq.data = c;
    c->wreq.data = c;
    c->next = r->conns;
    if (r->conns)
        r->conns->prev = c;
    r->conns = c;
    sd_bench_sse_init(&c->sse, SSE_MAX_EVENT, on_event, c);
    c->state = C_CONNECTING;
    e = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&r->addr, on_connect);
    if (e) {
        conn_close(c);
        return e;
    }
    c->rec = rec;
    r->conns_opened++;
    return 0;
}

/* ---- scheduling --------------------------------------------------------------- */

static void shutdown_run(runner *r)
{
    if (r->shut)
        return;
    r->shut = 1;
    if (!r->finished || r->stopping)
        r->duration = now_s(r);
    uv_timer_stop(&r->arrival_timer);
    uv_timer_stop(&r->tick_timer);
    uv_close((uv_handle_t *)&r->arrival_timer, NULL);
    uv_close((uv_handle_t *)&r->tick_timer, NULL);
    for (conn *c = r->conns; c; c = c->next)
        conn_close(c);
}

static void report(runner *r)
{
    const sd_bench_cfg *cfg = r->cfg;
    if (!cfg->progress)
        return;
    sd_bench_progress p = {.total = r->n, .sent = r->next_send, .done = r->finished, .ok = r->ok,
                           .failed = r->failed, .in_flight = r->in_flight,
                           .out_tokens = r->out_tokens, .elapsed_s = now_s(r)};
    cfg->progress(cfg->progress_user, &p);
}

static void pump(runner *r)
{
    const sd_bench_cfg *cfg = r->cfg;
    while (!r->stopping && r->next_send < r->arrived &&
           (cfg->concurrency <= 0 || r->in_flight < cfg->concurrency)) {
        sd_bench_rec *rec = &r->recs[r->next_send++];
        rec->t_sent = now_s(r);
        rec->attempts = 1;
        r->in_flight++;
        if (r->in_flight > r->peak)
            r->peak = r->in_flight;
        conn *c = r->idle;
        if (c) {
            r->idle = c->next_idle;
            c->rec = rec;
            send_req(c); /* a failure here ends or resends rec itself */
            continue;
        }
        int e = dispatch_new(r, rec);
        if (e)
            end_request(r, rec, SD_BENCH_ERR_CONNECT, "connect to %s: %s", cfg->target.hostport,
                        uv_strerror(e));
    }
    if (!r->shut && (r->finished == r->n || (r->stopping && r->in_flight == 0))) {
        report(r);
        shutdown_run(r);
    }
}

static void on_arrival(uv_timer_t *t)
{
    runner *r = t->data;
    double now = now_s(r);
    const sd_bench_rec *recs = r->recs;
    while (r->arrived < r->n && recs[r->arrived].t_arrival <= now + 0.0005)
        r->arrived++;
    if (r->arrived < r->n && !r->stopping) {
        double wait = recs[r->arrived].t_arrival - now;
        uv_timer_start(&r->arrival_timer, on_arrival, wait > 0 ? (uint64_t)(wait * 1e3) : 0, 0);
    }
    pump(r);
}

static void stop_all(runner *r)
{
    r->stopping = 1;
    for (conn *c = r->conns; c; c = c->next) {
        sd_bench_rec *rec = c->rec;
        if (c->state == C_CLOSING || !rec)
            continue;
        conn_close(c);
        end_request(r, rec, SD_BENCH_CANCELLED, "in flight when the duration limit (%.3g s) passed",
                    r->cfg->duration_limit_s);
    }
    pump(r);
}

static void on_tick(uv_timer_t *t)
{
    runner *r = t->data;
    const sd_bench_cfg *cfg = r->cfg;
    double now = now_s(r);
    if (cfg->duration_limit_s > 0 && now >= cfg->duration_limit_s && !r->stopping) {
        stop_all(r);
        return;
    }
    if (cfg->request_timeout_s > 0) {
        conn *next;
        for (conn *c = r->conns; c; c = next) {
            next = c->next; /* conns opened by conn_fail go to the head: not visited */
            if (c->state != C_CLOSING && c->rec &&
                now - c->rec->t_sent > cfg->request_timeout_s)
                conn_fail(c, SD_BENCH_ERR_TIMEOUT, "no complete response within %.3g s",
                          cfg->request_timeout_s);
            if (r->shut)
                return;
        }
    }
    if (cfg->progress_interval_s > 0 && now - r->last_progress >= cfg->progress_interval_s) {
        r->last_progress = now;
        report(r);
    }
}

/* ---- the run ---------------------------------------------------------------- */

int sd_bench_run_once(const sd_bench_cfg *cfg, sd_bench_run *out, sd_err *err)
{
    memset(out, 0, sizeof *out);
    if (cfg->num_requests <= 0)
        return sd_err_set(err, SD_EINVAL, "--num-requests must be positive");
    if (!cfg->prompts || cfg->prompts->n <= 0)
        return sd_err_set(err, SD_EINVAL, "no prompts");
    runner *r = calloc(1, sizeof *r);
    if (!r)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    r->cfg = cfg;
    r->n = cfg->num_requests;
    int rc = sd__bench_resolve(&cfg->target, &r->addr, err);
    if (rc) {
        free(r);
        return rc;
    }
    r->recs = calloc((size_t)r->n, sizeof *r->recs);
    r->reqs = calloc((size_t)r->n, sizeof *r->reqs);
    r->req_len = calloc((size_t)r->n, sizeof *r->req_len);
    double *arr = calloc((size_t)r->n, sizeof *arr);
    int *perm = calloc((size_t)cfg->prompts->n, sizeof *perm);
    rc = !r->recs || !r->reqs || !r->req_len || !arr || !perm ? SD_ENOMEM : 0;
    if (!rc) {
        /* A seeded shuffle of the prompts, repeated when there are more requests. */
        int np = cfg->prompts->n;
        uint64_t st = cfg->seed ^ 0x0bd3e7ull;
        for (int i = 0; i < np; i++)
            perm[i] = i;
        for (int i = np - 1; i > 0; i--) {
            int j = (int)(sd_bench_rand(&st) % (uint64_t)(i + 1));
            int x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        sd_bench_arrivals(arr, r->n, cfg->rate, cfg->seed);
        for (int i = 0; i < r->n && !rc; i++) {
            sd_bench_rec *rec = &r->recs[i];
            rec->id = i;
            rec->prompt = perm[i % np];
            rec->t_arrival = arr[i];
            rec->t_sent = rec->t_end = -1;
            rec->prompt_tokens = rec->usage_completion_tokens = -1;
            rec->ttft = rec->tpot = -1;
            r->reqs[i] = build_request(cfg, i, cfg->prompts->text[rec->prompt], &r->req_len[i]);
            if (!r->reqs[i])
                rc = SD_ENOMEM;
        }
    }
    free(arr);
    free(perm);
    if (!rc && uv_loop_init(&r->loop))
        rc = SD_EIO;
    if (rc) {
        sd_err_set(err, rc, rc == SD_ENOMEM ? "out of memory building %d requests"
                                             : "cannot start an event loop (%d requests)",
                   r->n);
        goto fail;
    }
    llhttp_settings_init(&r->settings);
    r->settings.on_headers_complete = on_headers_complete;
    r->settings.on_body = on_body;
    r->settings.on_message_complete = on_message_complete;
    uv_timer_init(&r->loop, &r->arrival_timer);
    uv_timer_init(&r->loop, &r->tick_timer);
    r->arrival_timer.data = r->tick_timer.data = r;
    r->t0 = uv_hrtime();
    uv_timer_start(&r->tick_timer, on_tick, TICK_MS, TICK_MS);
    on_arrival(&r->arrival_timer);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    uv_loop_close(&r->loop);

    out->recs = r->recs;
    out->n = r->n;
    out->duration_s = r->duration;
    out->peak_in_flight = r->peak;
    out->connections = r->conns_opened;
    out->stopped = r->stopping;
    r->recs = NULL;
    rc = 0;
fail:
    if (r->reqs)
        for (int i = 0; i < r->n; i++)
            free(r->reqs[i]);
    free(r->reqs);
    free(r->req_len);
    if (r->recs)
        free(r->recs);
    free(r);
    return rc;
}

void sd_bench_run_free(sd_bench_run *r)
{
    for (int i = 0; i < r->n; i++)
        sd_bench_rec_free(&r->recs[i]);
    free(r->recs);
    memset(r, 0, sizeof *r);
}

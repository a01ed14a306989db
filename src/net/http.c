#include "net/http.h"

#include <llhttp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"
#include "net/openai.h"

/* A connection is in one of these states; the timer's meaning follows it. */
enum {
    CS_IDLE,      /* between requests: the idle timer runs */
    CS_READING,   /* a request's head or body is arriving: header or body timer */
    CS_HANDLER,   /* the handler holds the request: no timer, bytes wait unparsed */
    CS_FINISHING, /* our last response is out: shutdown, then linger for the EOF */
};

enum { TK_NONE, TK_IDLE, TK_HEADER, TK_BODY, TK_PROCESS, TK_DRAIN, TK_LINGER };

typedef struct hdr {
    uint32_t name, name_len, value, value_len; /* offsets into req->head */
} hdr;

typedef struct sd_http_conn sd_http_conn;

struct sd_http_req {
    sd_http_conn *conn;
    sd_buf head; /* target NUL, then name NUL value NUL per header */
    uint32_t target_len;
    int target_done;
    hdr *hdrs;
    int n_hdrs, cap_hdrs;
    int in_field;
    char *path, *query; /* split at dispatch */
    sd_buf body;
    char method[24];
    int is_head, http10, keep_alive, force_close;
    int dispatched, started, ended, chunked;
    sd_http_abort_fn abort_fn;
    void *abort_user;
};

struct sd_http_conn {
    sd_http_server *srv;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    int mem;         /* no socket: output goes to mem_out */
    sd_buf *mem_out;
    llhttp_t parser;
    sd_buf in;       /* received, not parsed yet */
    sd_http_req *req;
    int state, timer_kind;
    int closing, handles_open, reading, in_process, dispatch_pending, upgraded;
    int eof; /* the peer has sent its FIN */
    size_t drain_left; /* output queued when the drain timer was armed */
    int reject_status;
    const char *reject_code;
    char reject_msg[200];
    uint64_t id;
    char peer[64];
    sd_http_conn *prev, *next;
};

struct sd_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    int listener_open;
    int port;
    sd_http_limits lim;
    llhttp_settings_t settings;
    sd_http_handler fn;
    void *user;
    sd_metrics *metrics;
    sd_http_conn *conns;
    int n_conns;
    uint64_t next_id;
    int draining, closing;
    void (*done)(void *);
    void *done_arg;
    char rbuf[64 * 1024]; /* every read lands here first, then in the connection's buffer */
};

typedef struct wreq {
    uv_write_t w;
    sd_http_conn *conn;
    char data[];
} wreq;

static void conn_process(sd_http_conn *c);
static void conn_close(sd_http_conn *c);
static void conn_finish(sd_http_conn *c);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);

void sd_http_limits_default(sd_http_limits *l)
{
    l->max_body = 1u << 20;
    l->max_header_bytes = 64u << 10;
    l->max_headers = 100;
    l->header_timeout_ms = 10000;
    l->body_timeout_ms = 30000;
    l->max_output = 8u << 20;
    l->linger_ms = 2000;
}

const char *sd_http_status_text(int s)
{
    switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* ---- timers ------------------------------------------------------------------ */

static void timer_cb(uv_timer_t *t);

static void set_timer(sd_http_conn *c, int kind, uint64_t ms)
{
    if (c->mem || c->closing)
        return;
    c->timer_kind = kind;
    if (kind == TK_NONE)
        uv_timer_stop(&c->timer);
    else
        uv_timer_start(&c->timer, timer_cb, ms, 0);
}

/* ---- writing ----------------------------------------------------------------- */

static void on_write(uv_write_t *w, int status)
{
    wreq *r = (wreq *)w;
    sd_http_conn *c = r->conn;
    free(r);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        sd_log_debug("connection %llu (%s): write failed: %s", (unsigned long long)c->id, c->peer,
                     uv_strerror(status));
        conn_close(c);
    }
}

/* Queues bytes for the peer. Tries the socket first so that most writes
 * need no copy; what the kernel does not take is copied and queued. */
static int conn_write(sd_http_conn *c, const char *data, size_t len)
{
    if (c->closing)
        return SD_ECANCELED;
    if (c->mem) {
        sd_buf_append(c->mem_out, data, len);
        return 0;
    }
    uv_stream_t *st = (uv_stream_t *)&c->tcp;
    size_t off = 0;
    if (uv_stream_get_write_queue_size(st) == 0) {
        uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
        int n = uv_try_write(st, &b, 1);
        if (n >= 0) {
            off = (size_t)n;
        } else if (n != UV_EAGAIN) {
            sd_log_debug("connection %llu (%s): write failed: %s", (unsigned long long)c->id,
                         c->peer, uv_strerror(n));
            conn_close(c);
            return SD_ECANCELED;
        }
    }
    if (off == len)
        return 0;
    wreq *r = malloc(sizeof *r + (len - off));
    if (!r) {
        sd_log_error("connection %llu (%s): out of memory queueing %zu bytes; closing",
                     (unsigned long long)c->id, c->peer, len - off);
        conn_close(c);
        return SD_ECANCELED;
    }
    r->conn = c;
    memcpy(r->data, data + off, len - off);
    uv_buf_t b = uv_buf_init(r->data, (unsigned)(len - off));
    int rc = uv_write(&r->w, st, &b, 1, on_write);
    if (rc) {
        free(r);
        conn_close(c);
        return SD_ECANCELED;
    }
    size_t queued = uv_stream_get_write_queue_size(st);
    if (queued > c->srv->lim.max_output) {
        sd_log_warn("closing connection %llu (%s): %zu bytes of output queued, over the "
                    "--max-output-buffer limit of %zu (slow reader)",
                    (unsigned long long)c->id, c->peer, queued, c->srv->lim.max_output);
        if (c->srv->metrics)
            c->srv->metrics->slow_reader_closes++;
        conn_close(c);
        return SD_ECANCELED;
    }
    return 0;
}

/* A kept-alive connection also says how long it may sit idle before the
 * server closes it (the header timeout runs between requests): a client that
 * reuses a pooled connection near that moment races the close, and clients
 * (undici, requests' urllib3 pools) retire connections before the hint. */
static void head_lines(sd_buf *b, int status, const char *ctype, const char *extra, int close,
                       uint64_t idle_ms)
{
    sd_buf_printf(b, "HTTP/1.1 %d %s\r\nServer: specd\r\n", status, sd_http_status_text(status));
    if (ctype)
        sd_buf_printf(b, "Content-Type: %s\r\n", ctype);
    if (extra)
        sd_buf_puts(b, extra);
    if (close)
        sd_buf_puts(b, "Connection: close\r\n");
    else
        sd_buf_printf(b, "Connection: keep-alive\r\nKeep-Alive: timeout=%llu\r\n",
                      (unsigned long long)(idle_ms / 1000));
}

/* An error the connection itself answers (bad HTTP, limits, timeouts): the
 * request never reaches the handler and the connection closes after it. */
static void conn_error(sd_http_conn *c, int status, const char *code, const char *msg)
{
    if (c->closing || c->state == CS_FINISHING)
        return;
    sd_api_error e;
    sd_api_error_set(&e, status, NULL, code, "%s", msg);
    sd_buf body = {0}, out = {0};
    sd_api_error_json(&body, &e);
    head_lines(&out, status, "application/json", NULL, 1, 0);
    sd_buf_printf(&out, "Content-Length: %zu\r\n\r\n", body.len);
    sd_buf_append(&out, body.p, body.len);
    if (c->srv->metrics)
        sd_metrics_status(c->srv->metrics, status);
    sd_log_info("connection %llu (%s): %d %s", (unsigned long long)c->id, c->peer, status, msg);
    if (!out.oom)
        conn_write(c, out.p, out.len);
    sd_buf_free(&body);
    sd_buf_free(&out);
    conn_finish(c);
}

/* ---- requests ---------------------------------------------------------------- */

static void req_free(sd_http_req *r)
{
    if (!r)
        return;
    sd_buf_free(&r->head);
    sd_buf_free(&r->body);
    free(r->hdrs);
    free(r->path);
    free(r->query);
    free(r);
}

const char *sd_http_method(const sd_http_req *r) { return r->method; }
const char *sd_http_path(const sd_http_req *r) { return r->path ? r->path : "/"; }
const char *sd_http_query(const sd_http_req *r) { return r->query ? r->query : ""; }
const char *sd_http_peer(const sd_http_req *r) { return r->conn->peer; }

const char *sd_http_body(const sd_http_req *r, size_t *len)
{
    if (len)
        *len = r->body.len;
    return r->body.p ? r->body.p : "";
}

const char *sd_http_header(const sd_http_req *r, const char *name)
{
    for (int i = 0; i < r->n_hdrs; i++)
        if (strcasecmp(r->head.p + r->hdrs[i].name, name) == 0)
            return r->head.p + r->hdrs[i].value;
    return NULL;
}

void sd_http_on_abort(sd_http_req *r, sd_http_abort_fn fn, void *user)
{
    r->abort_fn = fn;
    r->abort_user = user;
}

/* The response ended: the next request may be parsed, or the connection ends. */
static void req_end(sd_http_req *r)
{
    sd_http_conn *c = r->conn;
    r->ended = 1;
    if (c->closing)
        return; /* freed with the connection */
    int close = !r->keep_alive || r->force_close || c->srv->draining || c->upgraded;
    c->req = NULL;
    req_free(r);
    if (close) {
        conn_finish(c);
        return;
    }
    c->state = CS_IDLE;
    if (!c->mem && !c->reading && !c->eof)
        c->reading = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0;
    /* Pipelined bytes are parsed from a fresh loop turn, never from inside the
     * handler's call (conn_process does it directly when it is the caller). */
    c->drain_left = 0;
    set_timer(c, c->in.len ? TK_PROCESS : TK_IDLE, c->in.len ? 0 : c->srv->lim.header_timeout_ms);
}

static int resp_check(sd_http_req *r)
{
    if (!r->dispatched || r->started)
        return SD_ESTATE;
    return r->conn->closing || r->conn->state == CS_FINISHING ? SD_ECANCELED : 0;
}

int sd_http_respond(sd_http_req *r, int status, const char *ctype, const char *extra,
                    const void *body, size_t len)
{
    int rc = resp_check(r);
    if (rc == SD_ESTATE)
        return rc;
    r->started = 1;
    if (rc == 0) {
        sd_http_conn *c = r->conn;
        int close = !r->keep_alive || r->force_close || c->srv->draining || c->upgraded;
        sd_buf out = {0};
        head_lines(&out, status, ctype, extra, close, c->srv->lim.header_timeout_ms);
        sd_buf_printf(&out, "Content-Length: %zu\r\n\r\n", len);
        if (!r->is_head)
            sd_buf_append(&out, body, len);
        if (c->srv->metrics)
            sd_metrics_status(c->srv->metrics, status);
        rc = out.oom ? SD_ENOMEM : conn_write(c, out.p, out.len);
        sd_buf_free(&out);
        if (rc == SD_ENOMEM)
            conn_close(c);
    }
    /* The handler is done with r whatever happened: no abort follows. */
    r->abort_fn = NULL;
    req_end(r);
    return rc ? SD_ECANCELED : 0;
}

int sd_http_respond_error(sd_http_req *r, int status, const char *param, const char *code,
                          const char *extra, const char *fmt, ...)
{
    sd_api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sd_api_error_set(&e, status, param, code, "%s", msg);
    sd_buf body = {0};
    sd_api_error_json(&body, &e);
    int rc = sd_http_respond(r, status, "application/json", extra, body.p ? body.p : "", body.len);
    sd_buf_free(&body);
    return rc;
}

int sd_http_stream_begin(sd_http_req *r, int status, const char *ctype, const char *extra)
{
    int rc = resp_check(r);
    if (rc)
        return rc;
    sd_http_conn *c = r->conn;
    r->started = 1;
    /* HTTP/1.0 has no chunked coding: the body ends with the connection. */
    r->chunked = !r->http10;
    if (r->http10)
        r->force_close = 1;
    int close = !r->keep_alive || r->force_close || c->srv->draining || c->upgraded;
    sd_buf out = {0};
    head_lines(&out, status, ctype, extra, close, c->srv->lim.header_timeout_ms);
    if (r->chunked)
        sd_buf_puts(&out, "Transfer-Encoding: chunked\r\n");
    sd_buf_puts(&out, "\r\n");
    if (c->srv->metrics)
        sd_metrics_status(c->srv->metrics, status);
    rc = out.oom ? SD_ENOMEM : conn_write(c, out.p, out.len);
    sd_buf_free(&out);
    if (rc == SD_ENOMEM)
        conn_close(c);
    return rc ? SD_ECANCELED : 0;
}

int sd_http_stream_write(sd_http_req *r, const void *data, size_t len)
{
    if (!r->started || r->ended)
        return SD_ESTATE;
    sd_http_conn *c = r->conn;
    if (c->closing || c->state == CS_FINISHING)
        return SD_ECANCELED;
    if (len == 0 || r->is_head)
        return 0;
    int rc;
    if (r->chunked) {
        sd_buf out = {0};
        sd_buf_printf(&out, "%zx\r\n", len);
        sd_buf_append(&out, data, len);
        sd_buf_append(&out, "\r\n", 2);
        rc = out.oom ? SD_ENOMEM : conn_write(c, out.p, out.len);
        sd_buf_free(&out);
        if (rc == SD_ENOMEM)
            conn_close(c);
    } else {
        rc = conn_write(c, data, len);
    }
    return rc ? SD_ECANCELED : 0;
}

int sd_http_stream_end(sd_http_req *r)
{
    if (!r->started || r->ended)
        return SD_ESTATE;
    int rc = 0;
    if (r->chunked && !r->is_head && !r->conn->closing && r->conn->state != CS_FINISHING)
        rc = conn_write(r->conn, "0\r\n\r\n", 5);
    r->abort_fn = NULL;
    req_end(r);
    return rc ? SD_ECANCELED : 0;
}

/* ---- parser callbacks -------------------------------------------------------- */

static sd_http_conn *pconn(llhttp_t *p) { return p->data; }

static int reject(sd_http_conn *c, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int reject(sd_http_conn *c, int status, const char *code, const char *fmt, ...)
{
    c->reject_status = status;
    c->reject_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reject_msg, sizeof c->reject_msg, fmt, ap);
    va_end(ap);
    return HPE_USER;
}

static int head_append(sd_http_conn *c, const char *at, size_t len)
{
    sd_http_req *r = c->req;
    if (r->head.len + len + 2 > c->srv->lim.max_header_bytes)
        return reject(c, 431, "headers_too_large", "request line and headers exceed %zu bytes",
                      c->srv->lim.max_header_bytes);
    if (sd_buf_append(&r->head, at, len))
        return reject(c, 500, "out_of_memory", "out of memory reading the request");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    req_free(c->req);
    c->req = calloc(1, sizeof *c->req);
    if (!c->req) {
        reject(c, 500, "out_of_memory", "out of memory reading the request");
        return -1;
    }
    c->req->conn = c;
    c->state = CS_READING;
    if (c->timer_kind != TK_HEADER)
        set_timer(c, TK_HEADER, c->srv->lim.header_timeout_ms);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len) { return head_append(pconn(p), at, len); }

static int on_url_complete(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    c->req->target_len = (uint32_t)c->req->head.len;
    c->req->target_done = 1;
    return head_append(c, "", 1);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    sd_http_conn *c = pconn(p);
    sd_http_req *r = c->req;
    if (!r->in_field) {
        if (r->n_hdrs >= c->srv->lim.max_headers)
            return reject(c, 431, "headers_too_large", "more than %d header lines",
                          c->srv->lim.max_headers);
        if (r->n_hdrs == r->cap_hdrs) {
            int cap = r->cap_hdrs ? r->cap_hdrs * 2 : 16;
            hdr *h = realloc(r->hdrs, (size_t)cap * sizeof *h);
            if (!h)
                return reject(c, 500, "out_of_memory", "out of memory reading the request");
            r->hdrs = h;
            r->cap_hdrs = cap;
        }
        r->hdrs[r->n_hdrs].name = (uint32_t)r->head.len;
        r->in_field = 1;
    }
    return head_append(c, at, len);
}

static int on_header_field_complete(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    sd_http_req *r = c->req;
    if (!r->in_field) /* an empty name: llhttp refuses it before this, but be sure */
        return reject(c, 400, "bad_request", "empty header name");
    hdr *h = &r->hdrs[r->n_hdrs];
    h->name_len = (uint32_t)r->head.len - h->name;
    int rc = head_append(c, "", 1);
    h->value = (uint32_t)r->head.len;
    r->in_field = 0;
    return rc;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    return head_append(pconn(p), at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    sd_http_req *r = c->req;
    if (r->n_hdrs >= r->cap_hdrs || r->in_field)
        return reject(c, 400, "bad_request", "header value without a name");
    hdr *h = &r->hdrs[r->n_hdrs];
    h->value_len = (uint32_t)r->head.len - h->value;
    int rc = head_append(c, "", 1);
    r->n_hdrs++;
    return rc;
}

static int on_headers_complete(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    sd_http_req *r = c->req;
    if (!r->target_done && head_append(c, "", 1))
        return -1;
    snprintf(r->method, sizeof r->method, "%s", llhttp_method_name(llhttp_get_method(p)));
    r->is_head = llhttp_get_method(p) == HTTP_HEAD;
    r->http10 = llhttp_get_http_major(p) == 1 && llhttp_get_http_minor(p) == 0;
    if (llhttp_get_http_major(p) != 1) {
        reject(c, 505, "http_version", "only HTTP/1.0 and HTTP/1.1 are served");
        return HPE_PAUSED;
    }
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->lim.max_body) {
        /* Refused before a byte of the body is read. */
        reject(c, 413, "body_too_large", "request body of %llu bytes exceeds --max-body %zu",
               (unsigned long long)p->content_length, c->srv->lim.max_body);
        return HPE_PAUSED;
    }
    const char *expect = sd_http_header(r, "Expect");
    if (expect) {
        if (strcasecmp(expect, "100-continue") != 0) {
            reject(c, 417, "expectation_failed", "only Expect: 100-continue is understood");
            return HPE_PAUSED;
        }
        if (!r->http10)
            conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
    int has_body = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length);
    if (has_body)
        set_timer(c, TK_BODY, c->srv->lim.body_timeout_ms);
    else
        set_timer(c, TK_NONE, 0);
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    sd_http_conn *c = pconn(p);
    sd_http_req *r = c->req;
    if (r->body.len + len > c->srv->lim.max_body)
        return reject(c, 413, "body_too_large", "request body exceeds --max-body %zu bytes",
                      c->srv->lim.max_body);
    if (sd_buf_append(&r->body, at, len))
        return reject(c, 500, "out_of_memory", "out of memory reading the request body");
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    sd_http_conn *c = pconn(p);
    c->req->keep_alive = llhttp_should_keep_alive(p);
    c->dispatch_pending = 1;
    /* Stop right after this message: the next one is parsed only once this
     * one's response has ended. */
    return HPE_PAUSED;
}

/* ---- processing ------------------------------------------------------------- */

static int split_target(sd_http_req *r)
{
    const char *t = r->head.p ? r->head.p : "";
    size_t n = r->target_len;
    const char *q = memchr(t, '?', n);
    size_t pl = q ? (size_t)(q - t) : n;
    r->path = malloc(pl + 1);
    r->query = malloc(q ? n - pl : 1);
    if (!r->path || !r->query)
        return SD_ENOMEM;
    memcpy(r->path, t, pl);
    r->path[pl] = 0;
    if (q) {
        memcpy(r->query, q + 1, n - pl - 1);
        r->query[n - pl - 1] = 0;
    } else {
        r->query[0] = 0;
    }
    return 0;
}

static void dispatch(sd_http_conn *c)
{
    sd_http_req *r = c->req;
    c->dispatch_pending = 0;
    c->state = CS_HANDLER;
    set_timer(c, TK_NONE, 0);
    if (split_target(r)) {
        conn_error(c, 500, "out_of_memory", "out of memory");
        return;
    }
    r->dispatched = 1;
    c->srv->fn(c->srv->user, r);
}

/* Parses what has arrived, one request at a time, and hands each complete
 * request to the handler. Never re-entered: a response ended from inside
 * the handler lets this loop go on to the next pipelined request. */
static void conn_process(sd_http_conn *c)
{
    if (c->in_process)
        return;
    c->in_process = 1;
    while (!c->closing && c->state != CS_HANDLER && c->state != CS_FINISHING && c->in.len) {
        if (c->upgraded) {
            conn_error(c, 400, "bad_request", "bytes after an upgrade request");
            break;
        }
        llhttp_errno_t rc = llhttp_execute(&c->parser, c->in.p, c->in.len);
        size_t used = c->in.len;
        if (rc == HPE_PAUSED || rc == HPE_PAUSED_UPGRADE) {
            used = (size_t)(llhttp_get_error_pos(&c->parser) - c->in.p);
            if (rc == HPE_PAUSED_UPGRADE) {
                /* We upgrade to nothing: answer this request, then close. */
                c->upgraded = 1;
                used = c->in.len;
            } else {
                llhttp_resume(&c->parser);
            }
        } else if (rc != HPE_OK) {
            if (!c->reject_status)
                reject(c, 400, "bad_request", "malformed HTTP request: %s",
                       llhttp_get_error_reason(&c->parser) ? llhttp_get_error_reason(&c->parser)
                                                           : llhttp_errno_name(rc));
        }
        sd_buf_consume(&c->in, used);
        if (c->reject_status) {
            conn_error(c, c->reject_status, c->reject_code, c->reject_msg);
            break;
        }
        if (c->dispatch_pending)
            dispatch(c);
        else if (rc == HPE_OK)
            break; /* all consumed, the message goes on in later bytes */
    }
    c->in_process = 0;
}

/* ---- closing ----------------------------------------------------------------- */

static void maybe_done(sd_http_server *s)
{
    if (s->closing && !s->conns && !s->listener_open && s->done) {
        void (*done)(void *) = s->done;
        s->done = NULL;
        done(s->done_arg);
    }
}

static void conn_free(sd_http_conn *c)
{
    sd_http_server *s = c->srv;
    sd_http_req *r = c->req;
    if (r && r->dispatched && !r->ended && r->abort_fn) {
        sd_http_abort_fn fn = r->abort_fn;
        r->abort_fn = NULL;
        fn(r->abort_user, r);
    }
    req_free(r);
    sd_buf_free(&c->in);
    if (c->prev)
        c->prev->next = c->next;
    else if (s->conns == c)
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (!c->mem) {
        s->n_conns--;
        if (s->metrics)
            s->metrics->connections_open--;
    }
    free(c);
    maybe_done(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    sd_http_conn *c = h->data;
    if (--c->handles_open == 0)
        conn_free(c);
}

/* Hard close: pending writes are dropped, an unfinished request is aborted
 * (its abort callback runs from the close callback, on a later loop turn). */
static void conn_close(sd_http_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->mem)
        return; /* sd_http_feed_memory frees it */
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    c->handles_open = 2;
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    sd_http_conn *c = sr->data;
    if (c->closing)
        return;
    if (status < 0 || c->eof) {
        conn_close(c); /* the peer's FIN came already: nothing to linger for */
        return;
    }
    /* Our side is done; read and drop until the peer's EOF so that closing
     * with unread bytes does not reset the connection before the peer has
     * read our last response. */
    set_timer(c, TK_LINGER, c->srv->lim.linger_ms);
}

/* Graceful close after the last response: flush, shutdown, linger. */
static void conn_finish(sd_http_conn *c)
{
    if (c->closing || c->state == CS_FINISHING)
        return;
    c->state = CS_FINISHING;
    if (c->mem) {
        c->closing = 1;
        return;
    }
    /* The writes still queued must make progress every body-timeout. */
    c->drain_left = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    set_timer(c, TK_DRAIN, c->srv->lim.body_timeout_ms);
    if (!c->reading && !c->eof)
        c->reading = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown))
        conn_close(c);
}

/* ---- reading ----------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    sd_http_conn *c = h->data;
    b->base = c->srv->rbuf;
    b->len = sizeof c->srv->rbuf;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    sd_http_conn *c = st->data;
    if (c->closing)
        return;
    if (n < 0) {
        /* EOF or reset. A request still being answered is abandoned: a client
         * that goes away (even by half-closing) no longer wants it. Between
         * requests, an EOF still lets the last response drain out. */
        if (n != UV_EOF) {
            sd_log_debug("connection %llu (%s): read: %s", (unsigned long long)c->id, c->peer,
                         uv_strerror((int)n));
            conn_close(c);
            return;
        }
        c->eof = 1;
        c->reading = 0; /* libuv stops reading at EOF */
        if (c->state == CS_FINISHING)
            conn_close(c);
        else if (c->state == CS_IDLE && !c->in.len)
            conn_finish(c);
        else
            conn_close(c);
        return;
    }
    if (n == 0)
        return;
    if (c->state == CS_FINISHING)
        return; /* lingering: drop */
    if (sd_buf_append(&c->in, buf->base, (size_t)n)) {
        conn_close(c);
        return;
    }
    if (c->state == CS_IDLE) {
        c->state = CS_READING;
        set_timer(c, TK_HEADER, c->srv->lim.header_timeout_ms);
    }
    conn_process(c);
    /* Bytes pipelined behind a request in progress are kept, up to a bound;
     * past it the peer waits (TCP flow control) until the response ends. */
    if (!c->closing && c->state == CS_HANDLER &&
        c->in.len > c->srv->lim.max_body + c->srv->lim.max_header_bytes) {
        uv_read_stop(st);
        c->reading = 0;
    }
}

static void timer_cb(uv_timer_t *t)
{
    sd_http_conn *c = t->data;
    int kind = c->timer_kind;
    c->timer_kind = TK_NONE;
    switch (kind) {
    case TK_PROCESS:
        if (!c->reading && !c->eof && !c->closing && c->state != CS_FINISHING)
            c->reading = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0;
        if (c->state == CS_IDLE && c->in.len) {
            c->state = CS_READING;
            set_timer(c, TK_HEADER, c->srv->lim.header_timeout_ms);
        }
        conn_process(c);
        break;
    case TK_IDLE: {
        /* Idle means nothing to read and nothing left to write: a response
         * the peer is still taking keeps the connection while it moves. */
        size_t left = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
        if (left && (!c->drain_left || left < c->drain_left)) {
            c->drain_left = left;
            set_timer(c, TK_IDLE, c->srv->lim.header_timeout_ms);
            break;
        }
        sd_log_debug("connection %llu (%s): idle%s, closing", (unsigned long long)c->id, c->peer,
                     left ? " and not reading" : "");
        conn_close(c);
        break;
    }
    case TK_HEADER:
        if (c->state == CS_READING)
            conn_error(c, 408, "request_timeout", "request headers not received in time");
        break;
    case TK_BODY:
        if (c->state == CS_READING)
            conn_error(c, 408, "request_timeout", "request body not received in time");
        break;
    case TK_DRAIN: {
        /* A peer still taking our last response may have more time; one
         * that took nothing since the last look is cut off. */
        size_t left = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
        if (left && left < c->drain_left) {
            c->drain_left = left;
            set_timer(c, TK_DRAIN, c->srv->lim.body_timeout_ms);
        } else if (left) {
            sd_log_info("connection %llu (%s): %zu bytes of the last response not taken in "
                        "time; closing",
                        (unsigned long long)c->id, c->peer, left);
            conn_close(c);
        }
        break;
    }
    case TK_LINGER:
        conn_close(c);
        break;
    default: break;
    }
}

/* ---- server ------------------------------------------------------------------ */

static sd_http_conn *conn_new(sd_http_server *s)
{
    sd_http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = s;
    c->id = ++s->next_id;
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    return c;
}

static void on_connection(uv_stream_t *ls, int status)
{
    sd_http_server *s = ls->data;
    if (status < 0) {
        sd_log_warn("accept: %s", uv_strerror(status));
        return;
    }
    sd_http_conn *c = conn_new(s);
    if (!c) {
        sd_log_error("accept: out of memory");
        return;
    }
    s->n_conns++;
    if (s->metrics) {
        s->metrics->connections_open++;
        s->metrics->connections_total++;
    }
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp)) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* SSE chunks go out as soon as they are written */
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        char ip[48];
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip,
                     ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            snprintf(c->peer, sizeof c->peer, "%s:%d", ip,
                     ntohs(((struct sockaddr_in *)&ss)->sin_port));
        }
    }
    c->state = CS_IDLE;
    c->reading = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0;
    set_timer(c, TK_IDLE, s->lim.header_timeout_ms);
}

int sd_http_server_create(sd_http_server **out, uv_loop_t *loop, const sd_http_limits *lim,
                          sd_http_handler fn, void *user, sd_metrics *metrics, sd_err *err)
{
    sd_http_server *s = calloc(1, sizeof *s);
    if (!s)
        return sd_err_set(err, SD_ENOMEM, "http server: out of memory");
    s->loop = loop;
    s->lim = *lim;
    s->fn = fn;
    s->user = user;
    s->metrics = metrics;
    llhttp_settings_init(&s->settings);
    s->settings.on_message_begin = on_message_begin;
    s->settings.on_url = on_url;
    s->settings.on_url_complete = on_url_complete;
    s->settings.on_header_field = on_header_field;
    s->settings.on_header_field_complete = on_header_field_complete;
    s->settings.on_header_value = on_header_value;
    s->settings.on_header_value_complete = on_header_value_complete;
    s->settings.on_headers_complete = on_headers_complete;
    s->settings.on_body = on_body;
    s->settings.on_message_complete = on_message_complete;
    *out = s;
    return 0;
}

int sd_http_listen(sd_http_server *s, const char *host, int port, sd_err *err)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss))
        return sd_err_set(err, SD_EINVAL, "--host: '%s' is not an IPv4 or IPv6 address", host);
    int rc = uv_tcp_init(s->loop, &s->listener);
    if (rc)
        return sd_err_set(err, SD_EIO, "listen: %s", uv_strerror(rc));
    s->listener.data = s;
    s->listener_open = 1;
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    if (rc)
        return sd_err_set(err, SD_EIO, "--host %s --port %d: %s", host, port, uv_strerror(rc));
    int len = sizeof ss;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

int sd_http_port(const sd_http_server *s) { return s->port; }
int sd_http_connections(const sd_http_server *s) { return s->n_conns; }

static void on_listener_closed(uv_handle_t *h)
{
    sd_http_server *s = h->data;
    s->listener_open = 0;
    maybe_done(s);
}

static void close_listener(sd_http_server *s)
{
    if (s->listener_open && !uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

void sd_http_stop_accepting(sd_http_server *s)
{
    s->draining = 1;
    close_listener(s);
    for (sd_http_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == CS_IDLE && !c->in.len)
            conn_close(c);
    }
}

void sd_http_server_close(sd_http_server *s, void (*done)(void *), void *arg)
{
    s->closing = 1;
    s->draining = 1;
    s->done = done;
    s->done_arg = arg;
    close_listener(s);
    for (sd_http_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        conn_close(c);
    }
    maybe_done(s);
}

void sd_http_server_free(sd_http_server *s) { free(s); }

void sd_http_feed_memory(sd_http_server *s, const void *data, size_t len, sd_buf *out)
{
    sd_http_conn *c = conn_new(s);
    if (!c)
        return;
    c->mem = 1;
    c->mem_out = out;
    snprintf(c->peer, sizeof c->peer, "memory");
    c->state = CS_READING;
    if (sd_buf_append(&c->in, data, len) == 0)
        conn_process(c);
    c->closing = 1;
    conn_free(c);
}

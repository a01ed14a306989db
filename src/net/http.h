/* net/http: HTTP/1.1 connections on a libuv loop (llhttp parses).
 *
 * Owns the listener, the connections and their timers; knows nothing of
 * routes. Each complete request goes to one handler on the loop thread.
 * Requests of one connection are handled strictly one at a time in arrival
 * order: pipelined bytes wait, unparsed, until the response before them
 * ends, so responses can never leave out of order. llhttp removes chunked
 * transfer coding; bodies past max_body get 413 as soon as the length is
 * known (Content-Length) or passed (chunked), without reading the rest.
 * Slow peers get 408 (headers or body too slow). A peer that stops reading
 * is closed once its queued output passes max_output, with a log line
 * naming it and why; the handler learns of any early close through the
 * request's abort callback, which runs once, after which the request must
 * not be touched. Everything here runs on the loop thread; nothing here
 * blocks. Error responses are OpenAI-shaped JSON like every other error. */
#ifndef SD_NET_HTTP_H
#define SD_NET_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/err.h"
#include "net/buf.h"
#include "net/metrics.h"

typedef struct sd_http_server sd_http_server;
typedef struct sd_http_req sd_http_req;

typedef struct sd_http_limits {
    size_t max_body;            /* bytes of a request body; 413 past it */
    size_t max_header_bytes;    /* request line + headers; 431 past it */
    int max_headers;            /* header lines; 431 past it */
    uint64_t header_timeout_ms; /* first byte -> end of headers (408); also keep-alive idle */
    uint64_t body_timeout_ms;   /* end of headers -> end of body (408) */
    size_t max_output;          /* bytes queued to a peer that does not read */
    uint64_t linger_ms;         /* after our last byte: wait this long for the peer's EOF */
} sd_http_limits;

/* Defaults: 1 MiB body, 64 KiB / 100 headers, 10 s / 30 s, 8 MiB output, 2 s linger. */
void sd_http_limits_default(sd_http_limits *l);

/* Called once per complete request. The handler answers now or later with
 * sd_http_respond or the stream calls. */
typedef void (*sd_http_handler)(void *user, sd_http_req *req);
/* The request's connection is gone before its response ended. Runs once, on
 * the loop thread; req is freed when it returns. */
typedef void (*sd_http_abort_fn)(void *user, sd_http_req *req);

/* metrics may be NULL; when set, connections and response statuses are counted. */
int sd_http_server_create(sd_http_server **out, uv_loop_t *loop, const sd_http_limits *lim,
                          sd_http_handler fn, void *user, sd_metrics *metrics, sd_err *err);
/* Binds and listens (port 0: an ephemeral port, see sd_http_port). */
int sd_http_listen(sd_http_server *s, const char *host, int port, sd_err *err);
int sd_http_port(const sd_http_server *s);
/* Drain: the listener closes, idle connections close, and every response
 * from now on carries Connection: close. */
void sd_http_stop_accepting(sd_http_server *s);
int sd_http_connections(const sd_http_server *s);
/* Closes the listener and every connection (aborting their requests); done
 * runs once every handle is closed. Then sd_http_server_free. */
void sd_http_server_close(sd_http_server *s, void (*done)(void *arg), void *arg);
void sd_http_server_free(sd_http_server *s);

/* Feeds bytes to a connection that has no socket (its output goes to out),
 * then ends it as a peer's EOF would: the same parsing, limits and handler
 * as a TCP connection. For fuzzing and tests; needs no running loop as long
 * as the handler answers at once. */
void sd_http_feed_memory(sd_http_server *s, const void *data, size_t len, sd_buf *out);

/* ---- the request ----------------------------------------------------------- */

const char *sd_http_method(const sd_http_req *r); /* "GET", "POST", ... */
const char *sd_http_path(const sd_http_req *r);   /* target without ?query */
const char *sd_http_query(const sd_http_req *r);  /* after '?', or "" */
const char *sd_http_body(const sd_http_req *r, size_t *len);
/* First header of that name (case-insensitive), or NULL. */
const char *sd_http_header(const sd_http_req *r, const char *name);
const char *sd_http_peer(const sd_http_req *r); /* "ip:port" */
void sd_http_on_abort(sd_http_req *r, sd_http_abort_fn fn, void *user);

/* The whole response. extra_headers: complete lines ("Retry-After: 1\r\n")
 * or NULL. Ends the request. Returns 0, or SD_ECANCELED when the
 * connection is gone or going (the abort callback follows). */
int sd_http_respond(sd_http_req *r, int status, const char *content_type,
                    const char *extra_headers, const void *body, size_t len);
/* An OpenAI-shaped error response. */
int sd_http_respond_error(sd_http_req *r, int status, const char *param, const char *code,
                          const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* A streamed response (chunked transfer coding). write returns SD_ECANCELED
 * once the connection is gone or over its output limit; the abort callback
 * follows and further writes are refused. */
int sd_http_stream_begin(sd_http_req *r, int status, const char *content_type,
                         const char *extra_headers);
int sd_http_stream_write(sd_http_req *r, const void *data, size_t len);
int sd_http_stream_end(sd_http_req *r);

const char *sd_http_status_text(int status);

#endif

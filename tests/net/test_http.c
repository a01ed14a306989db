/* The HTTP layer on a real loopback socket: a test server (its own loop
 * thread, a handler with a few routes) driven by raw sockets from the test
 * thread, so every byte on the wire is the test's choice. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"
#include "net/http.h"
#include "test.h"
#include "rawclient.h"

/* ---- the test server ---------------------------------------------------------- */

typedef struct tsrv {
    uv_loop_t loop;
    uv_async_t stop, drain;
    int halted;
    sd_http_server *http;
    sd_metrics metrics;
    pthread_t th;
    int port;
    atomic_int aborts;
    atomic_int handled;
    atomic_int big_bytes_written;
} tsrv;

/* A response sent later from a timer (/slow) or a stream fed by a timer (/stream, /big). */
typedef struct pending {
    uv_timer_t t;
    sd_http_req *req;
    tsrv *s;
    int left;   /* chunks still to write */
    size_t size;
    int closed;
} pending;

static void pending_closed(uv_handle_t *h) { free(h->data); }

static void on_pending_abort(void *user, sd_http_req *req)
{
    pending *p = user;
    atomic_fetch_add(&p->s->aborts, 1);
    p->req = NULL;
    uv_timer_stop(&p->t);
    uv_close((uv_handle_t *)&p->t, pending_closed);
}

static void slow_fire(uv_timer_t *t)
{
    pending *p = t->data;
    char body[256];
    int n = snprintf(body, sizeof body, "slow %s", sd_http_query(p->req));
    sd_http_respond(p->req, 200, "text/plain", NULL, body, (size_t)n);
    p->req = NULL;
    uv_close((uv_handle_t *)&p->t, pending_closed);
}

static void stream_fire(uv_timer_t *t)
{
    pending *p = t->data;
    char *chunk = malloc(p->size);
    memset(chunk, 'a' + p->left % 26, p->size);
    /* /big writes as fast as the loop turns: a peer that does not read
     * must be cut off by the output limit. */
    int rc = sd_http_stream_write(p->req, chunk, p->size);
    free(chunk);
    if (rc) {
        uv_timer_stop(t); /* the abort callback follows and closes the timer */
        return;
    }
    atomic_fetch_add(&p->s->big_bytes_written, (int)p->size);
    if (--p->left == 0) {
        sd_http_stream_end(p->req);
        p->req = NULL;
        uv_timer_stop(t);
        uv_close((uv_handle_t *)&p->t, pending_closed);
    }
}

static int qint(const char *q, const char *key, int def)
{
    const char *p = strstr(q, key);
    return p ? atoi(p + strlen(key)) : def;
}

static void handler(void *user, sd_http_req *req)
{
    tsrv *s = user;
    atomic_fetch_add(&s->handled, 1);
    const char *path = sd_http_path(req);
    const char *m = sd_http_method(req);
    if (!strcmp(path, "/hello")) {
        char body[256];
        int n = snprintf(body, sizeof body, "hello %s %s", m, sd_http_query(req));
        sd_http_respond(req, 200, "text/plain", "X-Test: 1\r\n", body, (size_t)n);
    } else if (!strcmp(path, "/blob")) {
        size_t n = (size_t)qint(sd_http_query(req), "size=", 1000);
        char *b = malloc(n);
        for (size_t i = 0; i < n; i++)
            b[i] = (char)('a' + i % 26);
        sd_http_respond(req, 200, "application/octet-stream", NULL, b, n);
        free(b);
    } else if (!strcmp(path, "/echo")) {
        size_t len;
        const char *b = sd_http_body(req, &len);
        sd_http_respond(req, 200, "application/octet-stream", NULL, b, len);
    } else if (!strcmp(path, "/slow") || !strcmp(path, "/hold") || !strcmp(path, "/stream") ||
               !strcmp(path, "/big")) {
        pending *p = calloc(1, sizeof *p);
        p->req = req;
        p->s = s;
        uv_timer_init(&s->loop, &p->t);
        p->t.data = p;
        sd_http_on_abort(req, on_pending_abort, p);
        if (!strcmp(path, "/slow")) {
            uv_timer_start(&p->t, slow_fire, (uint64_t)qint(sd_http_query(req), "ms=", 100), 0);
        } else if (!strcmp(path, "/stream") || !strcmp(path, "/big")) {
            p->left = qint(sd_http_query(req), "n=", 3);
            p->size = (size_t)qint(sd_http_query(req), "size=", 5);
            sd_http_stream_begin(req, 200, "text/event-stream", NULL);
            uv_timer_start(&p->t, stream_fire, 0, !strcmp(path, "/big") ? 1 : 5);
        }
        /* /hold: never answered; only the abort ends it */
    } else {
        sd_http_respond_error(req, 404, NULL, "not_found", NULL, "no route %s", path);
    }
}

static void *loop_main(void *arg)
{
    tsrv *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void all_closed(void *arg) { (void)arg; }

static void on_stop(uv_async_t *a)
{
    tsrv *s = a->data;
    sd_http_server_close(s->http, all_closed, s);
    uv_close((uv_handle_t *)&s->stop, NULL);
    uv_close((uv_handle_t *)&s->drain, NULL);
}

static void on_drain(uv_async_t *a)
{
    tsrv *s = a->data;
    sd_http_stop_accepting(s->http);
}

static tsrv *start(const sd_http_limits *lim)
{
    tsrv *s = calloc(1, sizeof *s);
    uv_loop_init(&s->loop);
    sd_metrics_init(&s->metrics);
    sd_err err = {0};
    if (sd_http_server_create(&s->http, &s->loop, lim, handler, s, &s->metrics, &err) ||
        sd_http_listen(s->http, "127.0.0.1", 0, &err)) {
        fprintf(stderr, "  server: %s\n", err.msg);
        return NULL;
    }
    s->port = sd_http_port(s->http);
    uv_async_init(&s->loop, &s->stop, on_stop);
    uv_async_init(&s->loop, &s->drain, on_drain);
    s->stop.data = s;
    s->drain.data = s;
    pthread_create(&s->th, NULL, loop_main, s);
    return s;
}

/* Closes the server from its loop thread and waits for the loop to end. */
static void halt(tsrv *s)
{
    if (s->halted)
        return;
    s->halted = 1;
    uv_async_send(&s->stop);
    pthread_join(s->th, NULL);
}

/* Returns 0 when the loop ended with every handle closed (nothing leaked). */
static int stop(tsrv *s)
{
    halt(s);
    int rc = uv_loop_close(&s->loop);
    if (rc)
        fprintf(stderr, "  uv_loop_close: %s (handles left open)\n", uv_strerror(rc));
    sd_http_server_free(s->http);
    free(s);
    return rc;
}

static sd_http_limits test_limits(void)
{
    sd_http_limits l;
    sd_http_limits_default(&l);
    l.max_body = 1 << 20;
    l.header_timeout_ms = 400;
    l.body_timeout_ms = 400;
    l.linger_ms = 200;
    l.max_output = 256 << 10;
    return l;
}

/* ---- tests -------------------------------------------------------------------- */

TEST(keep_alive_serves_several_requests_on_one_connection)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    ASSERT(s);
    int fd = dial(s->port);
    ASSERT(fd >= 0);
    for (int i = 0; i < 3; i++) {
        char req[128];
        snprintf(req, sizeof req, "GET /hello?i=%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
        ASSERT_OK(SEND(fd, req));
        rbuf b = {0};
        resp r[1];
        ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
        ASSERT_EQ(r[0].status, 200);
        char want[64], v[64];
        snprintf(want, sizeof want, "hello GET i=%d", i);
        ASSERT_STR_EQ(r[0].body, want);
        ASSERT_STR_EQ(hdr_get(&r[0], "Connection", v, sizeof v), "keep-alive");
        /* the idle limit (the 400 ms header timeout) in whole seconds */
        ASSERT_STR_EQ(hdr_get(&r[0], "Keep-Alive", v, sizeof v), "timeout=0");
        ASSERT_STR_EQ(hdr_get(&r[0], "X-Test", v, sizeof v), "1");
        ASSERT(!b.eof);
        resps_free(r, 1);
        free(b.p);
    }
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(pipelined_requests_are_answered_in_order)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    /* The first answers after 150 ms, the others at once: order must hold. */
    const char *reqs = "GET /slow?ms=150&id=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /hello?id=2 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nid=3!"
                       "GET /slow?ms=1&id=4 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /hello?id=5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ASSERT_OK(SEND(fd, reqs));
    rbuf b = {0};
    resp r[5];
    ASSERT_EQ(read_responses(fd, &b, r, 5, 3000), 5);
    ASSERT_STR_EQ(r[0].body, "slow ms=150&id=1");
    ASSERT_STR_EQ(r[1].body, "hello GET id=2");
    ASSERT_STR_EQ(r[2].body, "id=3!");
    ASSERT_STR_EQ(r[3].body, "slow ms=1&id=4");
    ASSERT_STR_EQ(r[4].body, "hello GET id=5");
    char v[32];
    ASSERT_STR_EQ(hdr_get(&r[4], "Connection", v, sizeof v), "close");
    resps_free(r, 5);
    free(b.p);
    ASSERT(wait_eof(fd, 2000)); /* Connection: close is honoured */
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(pipelined_bytes_split_anywhere_still_parse)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    uint64_t seed = sd_test_seed();
    const char *reqs = "GET /hello?a=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n"
                       "GET /hello?a=3 HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t n = strlen(reqs);
    for (int round = 0; round < 5; round++) {
        int fd = dial(s->port);
        size_t at = 0;
        while (at < n) {
            size_t k = 1 + (size_t)sd_test_randf(&seed, 0, 20);
            if (k > n - at)
                k = n - at;
            ASSERT_OK(send_all(fd, reqs + at, k));
            at += k;
            usleep(200);
        }
        rbuf b = {0};
        resp r[3];
        ASSERT_EQ(read_responses(fd, &b, r, 3, 3000), 3);
        ASSERT_STR_EQ(r[0].body, "hello GET a=1");
        ASSERT_STR_EQ(r[1].body, "abcdefg"); /* chunked body, de-chunked */
        ASSERT_STR_EQ(r[2].body, "hello GET a=3");
        resps_free(r, 3);
        free(b.p);
        close(fd);
    }
    ASSERT_OK(stop(s));
}

TEST(body_over_the_limit_gets_413_before_it_is_sent)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    /* Only the head goes out: the 413 must not wait for 2 MiB of body. */
    ASSERT_OK(SEND(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n"));
    rbuf b = {0};
    resp r[1];
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].status, 413);
    ASSERT(is_error_shape(&r[0], "body_too_large"));
    resps_free(r, 1);
    free(b.p);
    ASSERT(wait_eof(fd, 2000));
    close(fd);

    /* chunked: refused once the chunks pass the limit */
    fd = dial(s->port);
    ASSERT_OK(SEND(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
    char *chunk = malloc(70000);
    int n = snprintf(chunk, 70000, "%x\r\n", 65536);
    memset(chunk + n, 'z', 65536);
    memcpy(chunk + n + 65536, "\r\n", 2);
    memset(&b, 0, sizeof b);
    for (int i = 0; i < 20 && !b.eof; i++) {
        if (send_all(fd, chunk, (size_t)n + 65538))
            break; /* the server may close while we still send */
    }
    free(chunk);
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].status, 413);
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(expect_100_continue_is_answered_before_the_body)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    ASSERT_OK(SEND(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                       "Expect: 100-continue\r\n\r\n"));
    rbuf b = {0};
    read_until(fd, &b, "\r\n\r\n", 1000);
    ASSERT(b.p && !strncmp(b.p, "HTTP/1.1 100 Continue\r\n\r\n", 25));
    ASSERT_OK(SEND(fd, "ping"));
    resp r[1];
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].status, 200);
    ASSERT_STR_EQ(r[0].body, "ping");
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(slow_headers_and_slow_bodies_get_408)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    uint64_t t0 = sd_now_ns();
    ASSERT_OK(SEND(fd, "GET /hello HTTP/1.1\r\nHost: x\r\n")); /* the head never ends */
    rbuf b = {0};
    resp r[1];
    ASSERT_EQ(read_responses(fd, &b, r, 1, 3000), 1);
    double dt = (double)(sd_now_ns() - t0) * 1e-9;
    ASSERT_EQ(r[0].status, 408);
    ASSERT(is_error_shape(&r[0], "request_timeout"));
    ASSERT_MSG(dt > 0.3 && dt < 2.0, "408 after %.3f s, header timeout 0.4 s", dt);
    resps_free(r, 1);
    free(b.p);
    ASSERT(wait_eof(fd, 2000));
    close(fd);

    fd = dial(s->port);
    ASSERT_OK(SEND(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"));
    memset(&b, 0, sizeof b);
    ASSERT_EQ(read_responses(fd, &b, r, 1, 3000), 1);
    ASSERT_EQ(r[0].status, 408);
    ASSERT_CONTAINS(r[0].body, "body");
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(idle_keep_alive_connections_close_quietly)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    rbuf b = {0};
    rb_read(fd, &b, 2000);
    ASSERT(b.eof);
    ASSERT_EQ(b.len, 0); /* no 408 for a connection that never started a request */
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(malformed_http_and_oversized_heads_get_error_json)
{
    sd_http_limits l = test_limits();
    l.max_header_bytes = 4096;
    tsrv *s = start(&l);
    static const struct {
        const char *req;
        int status;
    } cases[] = {
        {"GARBAGE\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400},
        {"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400},
        {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
        {"GET / HTTP/2.0\r\n\r\n", 505},
        {"POST /echo HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = dial(s->port);
        ASSERT_OK(SEND(fd, cases[i].req));
        rbuf b = {0};
        resp r[1];
        ASSERT_MSG(read_responses(fd, &b, r, 1, 2000) == 1, "%s", cases[i].req);
        ASSERT_MSG(r[0].status == cases[i].status, "%s -> %d", cases[i].req, r[0].status);
        ASSERT(is_error_shape(&r[0], NULL));
        resps_free(r, 1);
        free(b.p);
        ASSERT(wait_eof(fd, 2000));
        close(fd);
    }
    int fd = dial(s->port);
    char big[6000];
    int n = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'h', 5000);
    strcpy(big + n + 5000, "\r\n\r\n");
    ASSERT_OK(SEND(fd, big));
    rbuf b = {0};
    resp r[1];
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].status, 431);
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_EQ(atomic_load(&s->handled), 0); /* none reached the handler */
    ASSERT_OK(stop(s));
}

TEST(client_disconnect_aborts_the_request)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    for (int i = 0; i < 3; i++) {
        int fd = dial(s->port);
        ASSERT_OK(SEND(fd, i == 2 ? "GET /stream?n=100000&size=10 HTTP/1.1\r\n\r\n"
                                  : "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"));
        usleep(100000);
        if (i == 1)
            shutdown(fd, SHUT_WR); /* a half-close is a disconnect too */
        else
            close(fd);
        uint64_t t0 = sd_now_ns();
        while (atomic_load(&s->aborts) < i + 1 && sd_now_ns() - t0 < 1000000000ull)
            usleep(1000);
        ASSERT_MSG(atomic_load(&s->aborts) == i + 1, "case %d: aborts %d", i,
                   atomic_load(&s->aborts));
        if (i == 1)
            close(fd);
    }
    ASSERT_OK(stop(s));
}

TEST(slow_reader_is_cut_off_at_the_output_limit)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)s->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof a));
    /* 64 MiB offered, never read: the server must give up near 256 KiB + socket buffers */
    ASSERT_OK(SEND(fd, "GET /big?n=1024&size=65536 HTTP/1.1\r\nHost: x\r\n\r\n"));
    uint64_t t0 = sd_now_ns();
    while (atomic_load(&s->aborts) < 1 && sd_now_ns() - t0 < 5000000000ull)
        usleep(2000);
    ASSERT_EQ(atomic_load(&s->aborts), 1);
    ASSERT_LT(atomic_load(&s->big_bytes_written), 32 << 20);
    close(fd);
    halt(s);
    ASSERT_EQ(s->metrics.slow_reader_closes, 1);
    ASSERT_OK(stop(s));
}

TEST(a_half_close_after_the_request_still_gets_the_whole_response)
{
    sd_http_limits l = test_limits();
    l.max_output = 64 << 20;
    tsrv *s = start(&l);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)s->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof a));
    /* 8 MiB answered at once: more than the kernel buffers take, so most of it
     * waits in the server's queue when the FIN arrives */
    ASSERT_OK(SEND(fd, "GET /blob?size=8388608 HTTP/1.1\r\nHost: x\r\n\r\n"));
    shutdown(fd, SHUT_WR);
    usleep(300000);
    rbuf b = {0};
    resp r[1];
    int got = read_responses(fd, &b, r, 1, 10000);
    ASSERT_MSG(got == 1, "%zu bytes, eof %d", b.len, b.eof);
    ASSERT_EQ(r[0].body_len, 8388608);
    ASSERT_EQ(r[0].body[8388607], 'a' + 8388607 % 26);
    ASSERT(wait_eof(fd, 3000));
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(streams_are_chunked_and_head_has_no_body)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    ASSERT_OK(SEND(fd, "GET /stream?n=4&size=3 HTTP/1.1\r\nHost: x\r\n\r\n"
                       "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /hello?after HTTP/1.1\r\nHost: x\r\n\r\n"));
    rbuf b = {0};
    resp r[3];
    /* HEAD's Content-Length names a body that is not sent, so parse by hand */
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].body_len, 12);
    ASSERT_STR_EQ(r[0].body, "eeedddcccbbb");
    read_until(fd, &b, "hello GET after", 2000);
    ASSERT_CONTAINS(b.p, "hello GET after");
    const char *head = strstr(b.p, "HTTP/1.1 200 OK\r\nServer: specd\r\nContent-Type: text/plain");
    ASSERT(head);
    const char *next = strstr(head + 10, "HTTP/1.1 200");
    ASSERT(next);
    ASSERT(memmem(head, (size_t)(next - head), "\r\n\r\nhello", 9) == NULL);
    resps_free(r, 1);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(http10_without_keep_alive_closes_after_the_response)
{
    sd_http_limits l = test_limits();
    tsrv *s = start(&l);
    int fd = dial(s->port);
    ASSERT_OK(SEND(fd, "GET /hello HTTP/1.0\r\n\r\n"));
    rbuf b = {0};
    resp r[1];
    ASSERT_EQ(read_responses(fd, &b, r, 1, 2000), 1);
    char v[32];
    ASSERT_STR_EQ(hdr_get(&r[0], "Connection", v, sizeof v), "close");
    resps_free(r, 1);
    free(b.p);
    ASSERT(wait_eof(fd, 2000));
    close(fd);
    ASSERT_OK(stop(s));
}

TEST(stop_accepting_closes_idle_connections_and_finishes_busy_ones)
{
    sd_http_limits l = test_limits();
    l.header_timeout_ms = 5000;
    tsrv *s = start(&l);
    int idle = dial(s->port);
    int busy = dial(s->port);
    ASSERT(idle >= 0 && busy >= 0);
    ASSERT_OK(SEND(busy, "GET /slow?ms=300 HTTP/1.1\r\nHost: x\r\n\r\n"));
    usleep(50000);
    uv_async_send(&s->drain);
    ASSERT(wait_eof(idle, 1000));
    close(idle);
    usleep(50000);
    ASSERT_LT(dial(s->port), 0); /* the listener is gone */
    rbuf b = {0};
    resp r[1];
    ASSERT_EQ(read_responses(busy, &b, r, 1, 2000), 1);
    ASSERT_EQ(r[0].status, 200);
    char v[32];
    ASSERT_STR_EQ(hdr_get(&r[0], "Connection", v, sizeof v), "close");
    resps_free(r, 1);
    free(b.p);
    ASSERT(wait_eof(busy, 2000));
    close(busy);
    ASSERT_OK(stop(s));
}

TEST(memory_connections_parse_like_sockets)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    tsrv s;
    memset(&s, 0, sizeof s);
    sd_http_limits l = test_limits();
    sd_http_server *h;
    sd_err err = {0};
    ASSERT_OK(sd_http_server_create(&h, &loop, &l, handler, &s, NULL, &err));
    sd_buf out = {0};
    const char *in = "GET /hello?m=1 HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"
                     "GET /nope HTTP/1.1\r\n\r\nBROKEN";
    sd_http_feed_memory(h, in, strlen(in), &out);
    ASSERT(out.p);
    rbuf b = {out.p, out.len, out.cap, 1};
    size_t off = 0;
    resp r[4];
    for (int i = 0; i < 4; i++)
        ASSERT_OK(parse_resp(&b, &off, &r[i]));
    ASSERT_STR_EQ(r[0].body, "hello GET m=1");
    ASSERT_STR_EQ(r[1].body, "ok");
    ASSERT_EQ(r[2].status, 404);
    ASSERT(is_error_shape(&r[2], "not_found"));
    ASSERT_EQ(r[3].status, 400);
    resps_free(r, 4);
    sd_buf_free(&out);
    sd_http_server_free(h);
    ASSERT_OK(uv_loop_close(&loop));
}

TEST_MAIN(T(keep_alive_serves_several_requests_on_one_connection),
          T(pipelined_requests_are_answered_in_order), T(pipelined_bytes_split_anywhere_still_parse),
          T(body_over_the_limit_gets_413_before_it_is_sent),
          T(expect_100_continue_is_answered_before_the_body),
          T(slow_headers_and_slow_bodies_get_408), T(idle_keep_alive_connections_close_quietly),
          T(malformed_http_and_oversized_heads_get_error_json),
          T(client_disconnect_aborts_the_request), T(slow_reader_is_cut_off_at_the_output_limit),
          T(a_half_close_after_the_request_still_gets_the_whole_response),
          T(streams_are_chunked_and_head_has_no_body),
          T(http10_without_keep_alive_closes_after_the_response),
          T(stop_accepting_closes_idle_connections_and_finishes_busy_ones),
          T(memory_connections_parse_like_sockets))

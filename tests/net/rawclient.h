/* tests/net/rawclient.h: a raw HTTP/1.1 client over loopback sockets for
 * the net tests, so every byte on the wire is the test's choice. Responses
 * are parsed here by hand (Content-Length or chunked). */
#ifndef SD_TESTS_NET_RAWCLIENT_H
#define SD_TESTS_NET_RAWCLIENT_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"
#include "net/buf.h"

/* ---- the raw client ----------------------------------------------------------- */

static inline int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}
#define SEND(fd, s) send_all(fd, s, strlen(s))

/* Reads until `want` bytes of the buffer hold `count` complete responses,
 * the peer closes, or timeout_ms passes. Returns 1 on EOF seen, else 0. */
typedef struct rbuf {
    char *p;
    size_t len, cap;
    int eof;
} rbuf;

static inline void rb_read(int fd, rbuf *b, int timeout_ms)
{
    uint64_t end = sd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (!b->eof) {
        int64_t left = (int64_t)(end - sd_now_ns()) / 1000000;
        if ((int64_t)(end - sd_now_ns()) <= 0)
            return;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(left > 0 ? left : 1)) <= 0)
            return;
        if (b->len + 65536 > b->cap) {
            b->cap = (b->cap + 65536) * 2;
            b->p = realloc(b->p, b->cap + 1);
        }
        ssize_t n = recv(fd, b->p + b->len, 65536, 0);
        if (n <= 0) {
            b->eof = 1;
            return;
        }
        b->len += (size_t)n;
        b->p[b->len] = 0;
    }
}

/* Reads until the buffer holds needle (or EOF / timeout). */
static inline void read_until(int fd, rbuf *b, const char *needle, int timeout_ms)
{
    uint64_t end = sd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (!b->eof && sd_now_ns() < end && !(b->p && strstr(b->p, needle)))
        rb_read(fd, b, 20);
}

/* Parses one response at b->p + *off: status, headers, body (Content-Length
 * or chunked). Returns 0 and advances *off, or -1 when incomplete/bad. */
typedef struct resp {
    int status;
    char headers[4096];
    char *body;
    size_t body_len;
} resp;

static inline const char *hdr_get(const resp *r, const char *name, char *out, size_t n)
{
    size_t nl = strlen(name);
    for (const char *p = r->headers; *p;) {
        if (!strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t l = e ? (size_t)(e - v) : strlen(v);
            if (l >= n)
                l = n - 1;
            memcpy(out, v, l);
            out[l] = 0;
            return out;
        }
        p = strstr(p, "\r\n");
        if (!p)
            break;
        p += 2;
    }
    return NULL;
}

static inline int parse_resp(const rbuf *b, size_t *off, resp *r)
{
    const char *s = b->p + *off;
    size_t avail = b->len - *off;
    const char *he = memmem(s, avail, "\r\n\r\n", 4);
    if (!he || sscanf(s, "HTTP/1.1 %d", &r->status) != 1)
        return -1;
    size_t hl = (size_t)(he - s) + 2;
    if (hl >= sizeof r->headers)
        return -1;
    memcpy(r->headers, s, hl);
    r->headers[hl] = 0;
    const char *body = he + 4;
    size_t left = avail - (size_t)(body - s);
    char v[64];
    r->body = NULL;
    r->body_len = 0;
    if (r->status == 100) {
        *off += (size_t)(body - s);
        return 0;
    }
    if (hdr_get(r, "Content-Length", v, sizeof v)) {
        size_t cl = (size_t)atoll(v);
        if (left < cl)
            return -1;
        r->body = malloc(cl + 1);
        memcpy(r->body, body, cl);
        r->body[cl] = 0;
        r->body_len = cl;
        *off += (size_t)(body - s) + cl;
        return 0;
    }
    if (hdr_get(r, "Transfer-Encoding", v, sizeof v) && !strcmp(v, "chunked")) {
        sd_buf out = {0};
        const char *p = body, *end = body + left;
        for (;;) {
            const char *le = memmem(p, (size_t)(end - p), "\r\n", 2);
            if (!le) {
                sd_buf_free(&out);
                return -1;
            }
            size_t n = strtoul(p, NULL, 16);
            p = le + 2;
            if ((size_t)(end - p) < n + 2) {
                sd_buf_free(&out);
                return -1;
            }
            if (n == 0) {
                p += 2;
                break;
            }
            sd_buf_append(&out, p, n);
            p += n + 2;
        }
        r->body_len = out.len;
        r->body = sd_buf_take(&out, NULL);
        *off += (size_t)(p - s);
        return 0;
    }
    return -1;
}

/* Reads until n complete responses are there (or timeout). */
static inline int read_responses(int fd, rbuf *b, resp *rs, int n, int timeout_ms)
{
    uint64_t end = sd_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    size_t off = 0;
    int got = 0;
    while (got < n) {
        size_t o = off;
        if (b->len > off && parse_resp(b, &o, &rs[got]) == 0) {
            off = o;
            if (rs[got].status != 100)
                got++;
            continue;
        }
        if (b->eof || sd_now_ns() > end)
            break;
        rb_read(fd, b, 50);
    }
    return got;
}

static inline void resps_free(resp *rs, int n)
{
    for (int i = 0; i < n; i++)
        free(rs[i].body);
}

/* The error body's OpenAI shape. */
static inline int is_error_shape(const resp *r, const char *code)
{
    json_error_t je;
    json_t *v = json_loadb(r->body ? r->body : "", r->body_len, 0, &je);
    json_t *e = json_object_get(v, "error");
    int ok = json_is_string(json_object_get(e, "message")) &&
             json_is_string(json_object_get(e, "type")) && json_object_get(e, "param") &&
             (!code || (json_is_string(json_object_get(e, "code")) &&
                        !strcmp(json_string_value(json_object_get(e, "code")), code)));
    if (!ok)
        fprintf(stderr, "  not the error shape (code %s): %.*s\n", code ? code : "*",
                (int)r->body_len, r->body ? r->body : "");
    json_decref(v);
    return ok;
}

static inline int wait_eof(int fd, int timeout_ms)
{
    rbuf b = {0};
    rb_read(fd, &b, timeout_ms);
    free(b.p);
    return b.eof;
}

/* One request on a fresh connection: method, path, extra header lines
 * ("Authorization: Bearer x\r\n" or NULL), body (or NULL). Fills r;
 * returns its status, or -1. */
static inline int http_call(int port, const char *method, const char *path, const char *headers,
                            const char *body, resp *r)
{
    int fd = dial(port);
    if (fd < 0)
        return -1;
    sd_buf q = {0};
    sd_buf_printf(&q, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s", method, path,
                  headers ? headers : "");
    if (body)
        sd_buf_printf(&q, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                      strlen(body), body);
    else
        sd_buf_puts(&q, "\r\n");
    int rc = send_all(fd, q.p, q.len);
    sd_buf_free(&q);
    rbuf b = {0};
    if (rc == 0 && read_responses(fd, &b, r, 1, 3000) == 1)
        rc = r->status;
    else
        rc = -1;
    free(b.p);
    close(fd);
    return rc;
}

#endif

#include "fake_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void ms_sleep(int ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- reading one request ---------------------------------------------------- */

typedef struct reqbuf {
    char buf[65536];
    size_t len;
} reqbuf;

/* Reads one request into rb; returns the header+body length, or -1 at EOF. */
static long read_request(int fd, reqbuf *rb, char *path, size_t pathsz, char *auth, size_t authsz,
                         const char **body, size_t *body_len)
{
    for (;;) {
        char *end = rb->len ? memmem(rb->buf, rb->len, "\r\n\r\n", 4) : NULL;
        if (end) {
            size_t hl = (size_t)(end - rb->buf) + 4;
            size_t cl = 0;
            for (char *p = rb->buf; p < end; p++)
                if ((p == rb->buf || p[-1] == '\n') && !strncasecmp(p, "content-length:", 15))
                    cl = strtoul(p + 15, NULL, 10);
            auth[0] = 0;
            for (char *p = rb->buf; p < end; p++)
                if ((p == rb->buf || p[-1] == '\n') && !strncasecmp(p, "authorization:", 14)) {
                    char *v = p + 14;
                    while (*v == ' ')
                        v++;
                    size_t n = strcspn(v, "\r");
                    if (n >= authsz)
                        n = authsz - 1;
                    memcpy(auth, v, n);
                    auth[n] = 0;
                }
            if (rb->len >= hl + cl) {
                const char *sp = memchr(rb->buf, ' ', hl);
                size_t n = sp ? strcspn(sp + 1, " ") : 0;
                if (n >= pathsz)
                    n = pathsz - 1;
                memcpy(path, sp ? sp + 1 : "", n);
                path[n] = 0;
                *body = rb->buf + hl;
                *body_len = cl;
                return (long)(hl + cl);
            }
        }
        if (rb->len == sizeof rb->buf)
            return -1;
        ssize_t r = recv(fd, rb->buf + rb->len, sizeof rb->buf - rb->len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        rb->len += (size_t)r;
    }
}

/* ---- writing the response ------------------------------------------------------- */

typedef struct out {
    fake_server *s;
    int fd;
    int chunked; /* events go out as HTTP chunks now; else they collect in body */
    char *body;
    size_t len, cap;
} out;

static int http_chunk(out *o, const char *p, size_t n)
{
    char head[32];
    int split = o->s->cfg.split && n > 2;
    size_t part[2] = {split ? n / 2 + 1 : n, split ? n - (n / 2 + 1) : 0};
    for (int i = 0; i < (split ? 2 : 1); i++) {
        int hl = snprintf(head, sizeof head, "%zx\r\n", part[i]);
        char *c = malloc((size_t)hl + part[i] + 2);
        if (!c)
            return -1;
        memcpy(c, head, (size_t)hl);
        memcpy(c + hl, p, part[i]);
        memcpy(c + hl + part[i], "\r\n", 2);
        size_t cl = (size_t)hl + part[i] + 2;
        int rc;
        if (split) { /* cut inside the chunk framing too */
            rc = send_all(o->fd, c, cl / 2);
            ms_sleep(1);
            rc = rc ? rc : send_all(o->fd, c + cl / 2, cl - cl / 2);
        } else {
            rc = send_all(o->fd, c, cl);
        }
        free(c);
        if (rc)
            return -1;
        p += part[i];
    }
    return 0;
}

static int emit(out *o, const char *text)
{
    size_t n = strlen(text);
    if (o->chunked)
        return http_chunk(o, text, n);
    if (o->len + n + 1 > o->cap) {
        size_t nc = (o->len + n + 1) * 2;
        char *b = realloc(o->body, nc);
        if (!b)
            return -1;
        o->body = b;
        o->cap = nc;
    }
    memcpy(o->body + o->len, text, n + 1);
    o->len += n;
    return 0;
}

static int event(out *o, const char *json)
{
    const char *nl = o->s->cfg.crlf ? "\r\n" : "\n";
    char *ev = malloc(strlen(json) + 16);
    if (!ev)
        return -1;
    sprintf(ev, "data: %s%s%s", json, nl, nl);
    int rc = emit(o, ev);
    free(ev);
    return rc;
}

static int content_event(out *o, int chat, int k)
{
    char j[256];
    if (chat)
        snprintf(j, sizeof j,
                 "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
                 "\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},"
                 "\"finish_reason\":null}]}", k);
    else
        snprintf(j, sizeof j,
                 "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"fake\","
                 "\"choices\":[{\"index\":0,\"text\":\"tok%d \",\"logprobs\":null,"
                 "\"finish_reason\":null}]}", k);
    return event(o, j);
}

static int respond_status(out *o, int status)
{
    char body[256], head[512];
    snprintf(body, sizeof body,
             "{\"error\":{\"message\":\"fake failure %d\",\"type\":\"server_error\",\"param\":null,"
             "\"code\":null}}", status);
    snprintf(head, sizeof head,
             "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s%s\r\n",
             status, status == 429 ? "Too Many Requests" : "Internal Server Error", strlen(body),
             status == 429 ? "Retry-After: 1\r\n" : "",
             o->s->cfg.close_after ? "Connection: close\r\n" : "");
    return send_all(o->fd, head, strlen(head)) || send_all(o->fd, body, strlen(body)) ? -1 : 0;
}

/* 0: keep the connection; 1: close it now. */
static int respond(fake_server *s, int fd, int k, int chat)
{
    const fs_cfg *c = &s->cfg;
    out o = {.s = s, .fd = fd};
    if (c->mode == FS_STATUS || (c->fail_every > 0 && k % c->fail_every == 0))
        return respond_status(&o, c->status) ? 1 : c->close_after || c->silent_close;
    int framed = c->mode == FS_LENGTH_BODY || c->mode == FS_EOF_BODY;
    if (!framed) {
        char head[256];
        snprintf(head, sizeof head,
                 "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 "Transfer-Encoding: chunked\r\n%s\r\n",
                 c->close_after ? "Connection: close\r\n" : "");
        if (send_all(fd, head, strlen(head)))
            return 1;
        o.chunked = 1;
    }
    int rc = emit(&o, c->crlf ? ": ping\r\n\r\n" : ": ping\n\n");
    /* An empty first chunk, as servers send the role first: not a token. */
    rc = rc ? rc
            : event(&o, chat ? "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                               "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                               "\"content\":\"\"},\"finish_reason\":null}]}"
                             : "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":"
                               "[{\"index\":0,\"text\":\"\",\"finish_reason\":null}]}");
    int n = c->mode == FS_CLOSE_MID ? 2 : c->n_chunks;
    if (c->mode == FS_MALFORMED || c->mode == FS_ERROR_EVENT)
        n = 1;
    for (int i = 0; i < n && !rc; i++) {
        if (!framed)
            ms_sleep(i == 0 ? c->ttft_ms : c->itl_ms);
        rc = content_event(&o, chat, i);
    }
    if (rc)
        goto out;
    if (c->mode == FS_CLOSE_MID) {
        rc = 1;
        goto out;
    }
    if (c->mode == FS_MALFORMED)
        rc = emit(&o, "data: {not json\n\n");
    if (c->mode == FS_ERROR_EVENT)
        rc = event(&o, "{\"error\":{\"message\":\"engine failed: boom\",\"type\":\"server_error\"}}");
    if (!rc && c->mode != FS_MALFORMED && c->mode != FS_ERROR_EVENT) {
        rc = event(&o, chat ? "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
                              "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}"
                            : "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":"
                              "[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}");
        if (!rc && !c->no_usage) {
            char j[512];
            int toks = c->n_chunks * (c->tokens_per_chunk > 0 ? c->tokens_per_chunk : 1);
            snprintf(j, sizeof j,
                     "{\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
                     "\"completion_tokens\":%d,\"total_tokens\":%d%s}}", toks, toks + 7,
                     c->spec ? ",\"speculative\":{\"steps\":3,\"draft_tokens\":6,"
                               "\"accepted_tokens\":4,\"acceptance_rate\":0.667}" : "");
            rc = event(&o, j);
        }
    }
    if (!rc && c->mode != FS_NO_DONE)
        rc = emit(&o, c->crlf ? "data: [DONE]\r\n\r\n" : "data: [DONE]\n\n");
    if (rc)
        goto out;
    if (o.chunked) {
        rc = send_all(fd, "0\r\n\r\n", 5) ? 1 : 0;
    } else {
        char head[256];
        if (c->mode == FS_LENGTH_BODY)
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                        "Content-Length: %zu\r\n\r\n", o.len);
        else
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                        "Connection: close\r\n\r\n");
        rc = send_all(fd, head, strlen(head)) || send_all(fd, o.body, o.len) ? 1 : 0;
        if (c->mode == FS_EOF_BODY)
            rc = 1;
    }
out:
    free(o.body);
    return rc ? 1 : c->close_after || c->silent_close;
}

/* ---- threads -------------------------------------------------------------------- */

typedef struct conn_arg {
    fake_server *s;
    int fd;
} conn_arg;

static void *conn_main(void *p)
{
    conn_arg a = *(conn_arg *)p;
    free(p);
    fake_server *s = a.s;
    reqbuf *rb = calloc(1, sizeof *rb);
    char path[256], auth[256];
    while (rb) {
        const char *body;
        size_t blen;
        long used = read_request(a.fd, rb, path, sizeof path, auth, sizeof auth, &body, &blen);
        if (used < 0)
            break;
        if (!strncmp(rb->buf, "GET ", 4)) { /* /metrics, /v1/models: not served here */
            pthread_mutex_lock(&s->mu);
            s->gets++;
            pthread_mutex_unlock(&s->mu);
            memmove(rb->buf, rb->buf + used, rb->len - (size_t)used);
            rb->len -= (size_t)used;
            static const char nf[] = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                                     "Content-Length: 2\r\n\r\n{}";
            if (send_all(a.fd, nf, sizeof nf - 1))
                break;
            continue;
        }
        pthread_mutex_lock(&s->mu);
        int k = ++s->requests;
        if (++s->in_flight > s->peak_in_flight)
            s->peak_in_flight = s->in_flight;
        if (s->n_bodies < FS_MAX_BODIES) {
            char *b = malloc(blen + 1);
            if (b) {
                memcpy(b, body, blen);
                b[blen] = 0;
                s->bodies[s->n_bodies++] = b;
            }
        }
        snprintf(s->path, sizeof s->path, "%s", path);
        snprintf(s->auth, sizeof s->auth, "%s", auth);
        pthread_mutex_unlock(&s->mu);
        int chat = strstr(path, "/chat/") != NULL;
        memmove(rb->buf, rb->buf + used, rb->len - (size_t)used);
        rb->len -= (size_t)used;
        int close_now = respond(s, a.fd, k, chat);
        pthread_mutex_lock(&s->mu);
        s->in_flight--;
        pthread_mutex_unlock(&s->mu);
        if (close_now)
            break;
    }
    free(rb);
    shutdown(a.fd, SHUT_RDWR); /* the fd itself is closed by fs_stop after the join */
    return NULL;
}

static void *accept_main(void *p)
{
    fake_server *s = p;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        struct pollfd pf = {.fd = s->fd, .events = POLLIN};
        if (poll(&pf, 1, 20) != 1)
            continue;
        int fd = accept(s->fd, NULL, NULL);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_arg *a = malloc(sizeof *a);
        pthread_mutex_lock(&s->mu);
        int i = s->connections;
        if (!a || i >= FS_MAX_CONNS) {
            pthread_mutex_unlock(&s->mu);
            free(a);
            close(fd);
            continue;
        }
        a->s = s;
        a->fd = fd;
        s->conn_fds[i] = fd;
        if (pthread_create(&s->conn_thr[i], NULL, conn_main, a)) {
            free(a);
            close(fd);
        } else {
            s->connections++;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

int fs_start(fake_server *s, const fs_cfg *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->fd < 0)
        return -1;
    int one = 1;
    setsockopt(s->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 512) ||
        getsockname(s->fd, (struct sockaddr *)&a, &al)) {
        close(s->fd);
        return -1;
    }
    s->port = ntohs(a.sin_port);
    if (pthread_create(&s->accept_thr, NULL, accept_main, s)) {
        close(s->fd);
        return -1;
    }
    return 0;
}

void fs_stop(fake_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->accept_thr, NULL);
    for (int i = 0; i < s->connections; i++)
        shutdown(s->conn_fds[i], SHUT_RDWR);
    for (int i = 0; i < s->connections; i++) {
        pthread_join(s->conn_thr[i], NULL);
        close(s->conn_fds[i]);
    }
    close(s->fd);
    for (int i = 0; i < s->n_bodies; i++)
        free(s->bodies[i]);
    pthread_mutex_destroy(&s->mu);
}

int fs_dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &al)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

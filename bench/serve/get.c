/* bench/serve/get: the server's address, and one blocking GET for the
 * requests made outside timed runs (/v1/models, /metrics). */
#include <errno.h>
#include <fcntl.h>
#include <llhttp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/serve/internal.h"
#include "core/util.h"

int sd_bench_parse_url(const char *url, sd_bench_target *t, sd_err *err)
{
    memset(t, 0, sizeof *t);
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0)
        return sd_err_set(err, SD_EINVAL, "--url %s: only http:// URLs are supported", url);
    p += 7;
    const char *host = p, *host_end;
    if (*p == '[') { /* [v6 address] */
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end)
            return sd_err_set(err, SD_EINVAL, "--url %s: missing ']'", url);
        p = host_end + 1;
    } else {
        while (*p && *p != ':' && *p != '/')
            p++;
        host_end = p;
    }
    size_t hl = (size_t)(host_end - host);
    if (hl == 0 || hl >= sizeof t->host)
        return sd_err_set(err, SD_EINVAL, "--url %s: bad host", url);
    memcpy(t->host, host, hl);
    t->port = 80;
    if (*p == ':') {
        p++;
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || v < 1 || v > 65535 || (*e && *e != '/'))
            return sd_err_set(err, SD_EINVAL, "--url %s: bad port", url);
        t->port = (int)v;
        p = e;
    } else if (*p && *p != '/') {
        return sd_err_set(err, SD_EINVAL, "--url %s: bad host", url);
    }
    size_t bl = strlen(p);
    while (bl && p[bl - 1] == '/')
        bl--;
    if (bl >= 3 && memcmp(p + bl - 3, "/v1", 3) == 0)
        bl -= 3;
    if (bl >= sizeof t->base)
        return sd_err_set(err, SD_EINVAL, "--url %s: path too long", url);
    memcpy(t->base, p, bl);
    int v6 = strchr(t->host, ':') != NULL;
    snprintf(t->hostport, sizeof t->hostport, v6 ? "[%s]:%d" : "%s:%d", t->host, t->port);
    return 0;
}

typedef struct get_state {
    sd_buf *body;
    int done;
} get_state;

static int g_body(llhttp_t *p, const char *at, size_t len)
{
    get_state *g = p->data;
    return sd_buf_append(g->body, at, len) ? -1 : 0;
}

static int g_done(llhttp_t *p)
{
    ((get_state *)p->data)->done = 1;
    return 0;
}

static int remaining_ms(uint64_t deadline)
{
    uint64_t now = sd_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000 + 1);
}

/* Connects (non-blocking socket, waits until the deadline) to one address. */
static int connect_to(const struct sockaddr *sa, socklen_t len, uint64_t deadline, int *fd_out)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return errno;
    if (connect(fd, sa, len) && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return e;
    }
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    if (poll(&pf, 1, remaining_ms(deadline)) != 1) {
        close(fd);
        return ETIMEDOUT;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr) {
        close(fd);
        return soerr;
    }
    *fd_out = fd;
    return 0;
}

int sd__bench_resolve(const sd_bench_target *t, struct sockaddr_storage *ss, sd_err *err)
{
    char port[8];
    snprintf(port, sizeof port, "%d", t->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(t->host, port, &hints, &ai);
    if (g)
        return sd_err_set(err, SD_EIO, "--url: resolving %s: %s", t->host, gai_strerror(g));
    /* "localhost" may give ::1 first to a server on 127.0.0.1 only: when
     * there are several addresses, take the first that accepts a connection,
     * else the first one (its requests then fail as refused, which the run
     * reports). One address is taken as it is, without a probe. */
    const struct addrinfo *pick = ai;
    for (const struct addrinfo *a = ai->ai_next ? ai : NULL; a; a = a->ai_next) {
        int fd = -1;
        if (connect_to(a->ai_addr, a->ai_addrlen, sd_now_ns() + 2000000000ull, &fd) == 0) {
            close(fd);
            pick = a;
            break;
        }
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

int sd_bench_http_get(const sd_bench_target *t, const char *path, const char *api_key,
                      double timeout_s, int *status, sd_buf *body, sd_err *err)
{
    *status = 0;
    uint64_t deadline = sd_now_ns() + (uint64_t)(timeout_s * 1e9);
    struct sockaddr_storage ss;
    int rc = sd__bench_resolve(t, &ss, err);
    if (rc)
        return rc;
    int fd = -1;
    int e = connect_to((struct sockaddr *)&ss,
                       ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in),
                       deadline, &fd);
    if (e)
        return sd_err_set(err, SD_EIO, "GET %s: connect to %s: %s", path, t->hostport,
                          strerror(e));
    struct pollfd pf = {.fd = fd};
    sd_buf req = {0};
    sd_buf_printf(&req, "GET %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: specd-bench-serve\r\n"
                        "Connection: close\r\n", t->base, path, t->hostport);
    if (api_key && *api_key)
        sd_buf_printf(&req, "Authorization: Bearer %s\r\n", api_key);
    sd_buf_puts(&req, "\r\n");
    if (req.oom) {
        sd_buf_free(&req);
        rc = sd_err_set(err, SD_ENOMEM, "GET %s: out of memory", path);
        goto out;
    }
    size_t off = 0;
    while (off < req.len) {
        ssize_t w = send(fd, req.p + off, req.len - off, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            pf.events = POLLOUT;
            if (poll(&pf, 1, remaining_ms(deadline)) != 1)
                break;
            continue;
        }
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    size_t req_len = req.len;
    sd_buf_free(&req);
    if (off < req_len) {
        rc = sd_err_set(err, SD_EIO, "GET %s: sending to %s failed", path, t->hostport);
        goto out;
    }
    llhttp_settings_t set;
    llhttp_settings_init(&set);
    set.on_body = g_body;
    set.on_message_complete = g_done;
    llhttp_t parser;
    llhttp_init(&parser, HTTP_RESPONSE, &set);
    get_state gs = {body, 0};
    parser.data = &gs;
    sd_buf_clear(body);
    char buf[16384];
    while (!gs.done) {
        pf.events = POLLIN;
        int ms = remaining_ms(deadline);
        if (ms == 0 || poll(&pf, 1, ms) != 1) {
            rc = sd_err_set(err, SD_EIO, "GET %s: no complete response from %s within %.1f s",
                            path, t->hostport, timeout_s);
            goto out;
        }
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        llhttp_errno_t pe = r > 0 ? llhttp_execute(&parser, buf, (size_t)r) : llhttp_finish(&parser);
        if (pe != HPE_OK) {
            rc = sd_err_set(err, SD_EIO, "GET %s: bad HTTP from %s: %s", path, t->hostport,
                            llhttp_get_error_reason(&parser) ? llhttp_get_error_reason(&parser)
                                                             : llhttp_errno_name(pe));
            goto out;
        }
        if (r <= 0 && !gs.done) {
            rc = sd_err_set(err, SD_EIO, "GET %s: %s closed the connection mid-response", path,
                            t->hostport);
            goto out;
        }
    }
    *status = llhttp_get_status_code(&parser);
out:
    close(fd);
    return rc;
}

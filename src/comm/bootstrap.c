/* comm/bootstrap: node 0 hands a small blob (NCCL's unique id) to the other
 * nodes over TCP at --dist-init-addr HOST:PORT; NCCL's own transports do the
 * rest.
 *
 * Protocol (one short connection per node, network byte order):
 *   node -> 0:  "SPECDBS1" (8 bytes), u32 node_rank, u32 blob length
 *   0 -> node:  u32 status (0: ok, else the reason below), then the blob
 * Node 0 returns once every node 1..nnodes-1 has its copy; a node asking with
 * another length or a rank seen twice fails the start on both sides, with a
 * message naming the nodes: they run different configurations. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/util.h"

#define BS_MAGIC "SPECDBS1"
enum { BS_OK = 0, BS_BAD_LEN = 1, BS_BAD_RANK = 2, BS_DUP_RANK = 3 };

struct sd_bootstrap {
    int fd;
    int port;
    char addr[256];
};

int sd_dist_addr_parse(const char *addr, char *host, size_t hl, int *port, sd_err *err)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr)
        return sd_err_set(err, SD_EINVAL, "--dist-init-addr '%s': expected HOST:PORT",
                          addr ? addr : "");
    const char *h = addr;
    size_t n = (size_t)(colon - addr);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    int64_t p;
    if (n == 0 || n >= hl || sd_parse_i64(colon + 1, &p) || p < 0 || p > 65535)
        return sd_err_set(err, SD_EINVAL, "--dist-init-addr '%s': expected HOST:PORT (port 0..65535)",
                          addr);
    memcpy(host, h, n);
    host[n] = 0;
    *port = (int)p;
    return 0;
}

static double now_s(void) { return sd_now_s(); }

/* Waits until fd is readable (or writable), up to the deadline. */
static int wait_fd(int fd, short ev, double deadline)
{
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0)
            return SD_ECANCELED;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return SD_EIO;
    }
}

static int io_all(int fd, void *buf, size_t len, int wr, double deadline)
{
    char *p = buf;
    while (len) {
        int rc = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline);
        if (rc)
            return rc;
        ssize_t k = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k == 0)
            return SD_EIO;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return SD_EIO;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

int sd_bootstrap_listen(sd_bootstrap **out, const char *addr, sd_err *err)
{
    *out = NULL;
    char host[256];
    int port;
    int rc = sd_dist_addr_parse(addr, host, sizeof host, &port, err);
    if (rc)
        return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g)
        return sd_err_set(err, SD_EINVAL, "--dist-init-addr %s: %s", addr, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 64)) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return sd_err_set(err, SD_EIO, "--dist-init-addr %s: cannot listen (%s)", addr,
                          strerror(e ? e : EADDRNOTAVAIL));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    sd_bootstrap *b = calloc(1, sizeof *b);
    if (!b) {
        close(fd);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    b->fd = fd;
    b->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    snprintf(b->addr, sizeof b->addr, "%s", addr);
    *out = b;
    return 0;
}

int sd_bootstrap_port(const sd_bootstrap *b) { return b->port; }

void sd_bootstrap_close(sd_bootstrap *b)
{
    if (!b)
        return;
    close(b->fd);
    free(b);
}

/* Serves blob to nodes 1..nnodes-1; with fds, keeps node k's connection
 * open in fds[k] (the node group) instead of closing it. */
static int serve(sd_bootstrap *b, int nnodes, const void *blob, size_t len, double timeout_s,
                 int *fds, sd_err *err)
{
    if (nnodes < 1 || nnodes > 4096 || len > (1u << 20))
        return sd_err_set(err, SD_EINVAL, "bootstrap: %d nodes, %zu bytes", nnodes, len);
    unsigned char *seen = calloc((size_t)nnodes, 1);
    if (!seen)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    double deadline = now_s() + timeout_s;
    int served = 0, rc = 0;
    while (served < nnodes - 1 && !rc) {
        if (wait_fd(b->fd, POLLIN, deadline)) {
            rc = sd_err_set(err, SD_ECANCELED,
                            "--dist-init-addr %s: %d of %d nodes joined within %.0f s", b->addr,
                            served + 1, nnodes, timeout_s);
            break;
        }
        int c = accept4(b->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        unsigned char hello[16];
        uint32_t rank_n, len_n, status = BS_OK;
        /* a peer that says nothing in time is not a node of ours: drop it */
        if (io_all(c, hello, sizeof hello, 0, SD_MIN(deadline, now_s() + 5.0)) ||
            memcmp(hello, BS_MAGIC, 8)) {
            close(c);
            continue;
        }
        memcpy(&rank_n, hello + 8, 4);
        memcpy(&len_n, hello + 12, 4);
        uint32_t rank = ntohl(rank_n), want = ntohl(len_n);
        if (want != len) {
            status = BS_BAD_LEN;
            rc = sd_err_set(err, SD_EINVAL,
                            "--dist-init-addr %s: node %u expects a %u-byte id, this node serves "
                            "%zu (different builds or settings)",
                            b->addr, rank, want, len);
        } else if (rank < 1 || rank >= (uint32_t)nnodes) {
            status = BS_BAD_RANK;
            rc = sd_err_set(err, SD_EINVAL,
                            "--dist-init-addr %s: a node says --node-rank %u, but --nnodes is %d",
                            b->addr, rank, nnodes);
        } else if (seen[rank]) {
            status = BS_DUP_RANK;
            rc = sd_err_set(err, SD_EINVAL,
                            "--dist-init-addr %s: two nodes say --node-rank %u", b->addr, rank);
        }
        uint32_t st_n = htonl(status);
        int w = io_all(c, &st_n, 4, 1, deadline);
        if (!w && status == BS_OK)
            w = io_all(c, (void *)blob, len, 1, deadline);
        if (!w && status == BS_OK && fds) {
            fds[rank] = c;
        } else {
            close(c);
        }
        if (!w && status == BS_OK) {
            seen[rank] = 1;
            served++;
        }
    }
    free(seen);
    return rc;
}

int sd_bootstrap_serve(sd_bootstrap *b, int nnodes, const void *blob, size_t len,
                       double timeout_s, sd_err *err)
{
    return serve(b, nnodes, blob, len, timeout_s, NULL, err);
}

/* Fetches node 0's blob; with keep, leaves the connection open in *keep. */
static int fetch(const char *addr, int node_rank, void *blob, size_t len, double timeout_s,
                 int *keep, sd_err *err)
{
    char host[256];
    int port;
    int rc = sd_dist_addr_parse(addr, host, sizeof host, &port, err);
    if (rc)
        return rc;
    if (port == 0)
        return sd_err_set(err, SD_EINVAL, "--dist-init-addr %s: a port is needed to connect", addr);
    double deadline = now_s() + timeout_s;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    /* node 0 may not listen yet: retry until the deadline */
    for (;;) {
        struct addrinfo *res = NULL;
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g)
            return sd_err_set(err, SD_EINVAL, "--dist-init-addr %s: %s", addr, gai_strerror(g));
        int fd = -1;
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
                close(fd);
                fd = -1;
            }
        }
        freeaddrinfo(res);
        if (fd >= 0) {
            unsigned char hello[16];
            uint32_t r = htonl((uint32_t)node_rank), l = htonl((uint32_t)len), st;
            memcpy(hello, BS_MAGIC, 8);
            memcpy(hello + 8, &r, 4);
            memcpy(hello + 12, &l, 4);
            rc = io_all(fd, hello, sizeof hello, 1, deadline);
            if (!rc)
                rc = io_all(fd, &st, 4, 0, deadline);
            if (!rc && ntohl(st) != BS_OK) {
                static const char *why[] = {"", "a different id length (different builds)",
                                            "a --node-rank outside --nnodes",
                                            "another node with the same --node-rank"};
                uint32_t s = ntohl(st);
                close(fd);
                return sd_err_set(err, SD_EINVAL, "--dist-init-addr %s: node 0 refused node %d: %s",
                                  addr, node_rank, s < 4 ? why[s] : "unknown reason");
            }
            if (!rc)
                rc = io_all(fd, blob, len, 0, deadline);
            if (!rc && keep) {
                *keep = fd;
                return 0;
            }
            close(fd);
            if (!rc)
                return 0;
            return sd_err_set(err, rc == SD_ECANCELED ? SD_ECANCELED : SD_EIO,
                              "--dist-init-addr %s: node 0 closed the connection or timed out",
                              addr);
        }
        if (now_s() + 0.05 >= deadline)
            return sd_err_set(err, SD_ECANCELED,
                              "--dist-init-addr %s: node 0 did not answer within %.1f s", addr,
                              timeout_s);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int sd_bootstrap_fetch(const char *addr, int node_rank, void *blob, size_t len, double timeout_s,
                       sd_err *err)
{
    return fetch(addr, node_rank, blob, len, timeout_s, NULL, err);
}

/* ---- the node group: the bootstrap's connections, kept open ----
 * A star: node 0 holds one connection per other node. Messages are raw
 * bytes in an order both sides know (the same calls on every node);
 * variable-length ones carry a u64 length first. */

struct sd_nodes {
    int n, rank;
    int fd[SD_NODES_MAX]; /* node 0: fd[k] to node k; other nodes: fd[0] to node 0 */
    _Atomic int aborted;
    char addr[256];
};

int sd_nodes_open(sd_nodes **out, int nnodes, int node_rank, const char *addr,
                  const void *fingerprint, size_t fp_len, double timeout_s, sd_err *err)
{
    *out = NULL;
    if (nnodes < 2 || nnodes > SD_NODES_MAX || node_rank < 0 || node_rank >= nnodes ||
        fp_len > 4096)
        return sd_err_set(err, SD_EINVAL, "node group: --nnodes %d (2..%d), --node-rank %d",
                          nnodes, SD_NODES_MAX, node_rank);
    sd_nodes *g = calloc(1, sizeof *g);
    if (!g)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    g->n = nnodes;
    g->rank = node_rank;
    for (int k = 0; k < SD_NODES_MAX; k++)
        g->fd[k] = -1;
    snprintf(g->addr, sizeof g->addr, "%s", addr ? addr : "");
    int rc;
    if (node_rank == 0) {
        sd_bootstrap *b = NULL;
        rc = sd_bootstrap_listen(&b, addr, err);
        if (!rc)
            rc = serve(b, nnodes, fingerprint, fp_len, timeout_s, g->fd, err);
        sd_bootstrap_close(b);
    } else {
        unsigned char theirs[4096];
        rc = fetch(addr, node_rank, theirs, fp_len, timeout_s, &g->fd[0], err);
        if (!rc && fp_len && memcmp(theirs, fingerprint, fp_len))
            rc = sd_err_set(err, SD_EINVAL,
                            "--dist-init-addr %s: node 0 runs other settings than node %d "
                            "(model, --tp, --nnodes, --max-batch or the proposer differ)",
                            addr, node_rank);
    }
    if (rc) {
        sd_nodes_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int sd_nodes_count(const sd_nodes *g) { return g ? g->n : 1; }
int sd_nodes_rank(const sd_nodes *g) { return g ? g->rank : 0; }

static int nodes_io(sd_nodes *g, int k, void *buf, size_t len, int wr, double timeout_s,
                    sd_err *err)
{
    if (atomic_load(&g->aborted))
        return sd_err_set(err, SD_ECANCELED, "node group: aborted");
    int rc = io_all(g->fd[k], buf, len, wr, now_s() + timeout_s);
    if (rc) {
        sd_nodes_abort(g); /* the group is broken: every later call fails at once */
        return sd_err_set(err, rc == SD_ECANCELED ? SD_ECANCELED : SD_EIO,
                          "node group: node %d %s (--dist-init-addr %s)",
                          g->rank ? 0 : k,
                          rc == SD_ECANCELED ? "did not answer in time" : "is gone",
                          g->addr);
    }
    return 0;
}

int sd_nodes_bcast(sd_nodes *g, void *buf, size_t len, double timeout_s, sd_err *err)
{
    if (g->rank)
        return nodes_io(g, 0, buf, len, 0, timeout_s, err);
    for (int k = 1; k < g->n; k++) {
        int rc = nodes_io(g, k, buf, len, 1, timeout_s, err);
        if (rc)
            return rc;
    }
    return 0;
}

int sd_nodes_gather(sd_nodes *g, const void *mine, void *all, size_t len, double timeout_s,
                    sd_err *err)
{
    if (g->rank)
        return nodes_io(g, 0, (void *)mine, len, 1, timeout_s, err);
    if (all != mine)
        memcpy(all, mine, len);
    for (int k = 1; k < g->n; k++) {
        int rc = nodes_io(g, k, (char *)all + (size_t)k * len, len, 0, timeout_s, err);
        if (rc)
            return rc;
    }
    return 0;
}

int sd_nodes_send_msg(sd_nodes *g, const void *buf, size_t len, double timeout_s, sd_err *err)
{
    if (g->rank)
        return sd_err_set(err, SD_EINVAL, "node group: only node 0 sends messages");
    uint64_t l = len;
    int rc = sd_nodes_bcast(g, &l, sizeof l, timeout_s, err);
    return rc ? rc : sd_nodes_bcast(g, (void *)buf, len, timeout_s, err);
}

int sd_nodes_recv_msg(sd_nodes *g, void **buf, size_t *len, double timeout_s, sd_err *err)
{
    *buf = NULL;
    *len = 0;
    uint64_t l = 0;
    int rc = nodes_io(g, 0, &l, sizeof l, 0, timeout_s, err);
    if (rc)
        return rc;
    if (l > ((uint64_t)1 << 32)) {
        sd_nodes_abort(g);
        return sd_err_set(err, SD_EIO, "node group: a %llu-byte message from node 0",
                          (unsigned long long)l);
    }
    void *p = malloc(l ? (size_t)l : 1);
    if (!p)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    if ((rc = nodes_io(g, 0, p, (size_t)l, 0, timeout_s, err))) {
        free(p);
        return rc;
    }
    *buf = p;
    *len = (size_t)l;
    return 0;
}

void sd_nodes_abort(sd_nodes *g)
{
    if (!g)
        return;
    atomic_store(&g->aborted, 1);
    for (int k = 0; k < SD_NODES_MAX; k++)
        if (g->fd[k] >= 0)
            shutdown(g->fd[k], SHUT_RDWR); /* wakes a peer's and our own pending I/O */
}

void sd_nodes_close(sd_nodes *g)
{
    if (!g)
        return;
    for (int k = 0; k < SD_NODES_MAX; k++)
        if (g->fd[k] >= 0)
            close(g->fd[k]);
    free(g);
}

/* tests/bench/fake_server: a small HTTP/1.1 server on loopback that answers
 * OpenAI-shaped streaming requests with scripted timing and faults, so the
 * load generator's numbers can be checked against known delays.
 *
 * One thread accepts; one thread per connection reads requests (headers +
 * Content-Length body) and writes the scripted response with blocking
 * send() and nanosleep() between events. Keep-alive unless told otherwise. */
#ifndef SD_TESTS_BENCH_FAKE_SERVER_H
#define SD_TESTS_BENCH_FAKE_SERVER_H

#include <pthread.h>

typedef enum fs_mode {
    FS_STREAM = 0,     /* 200, chunked SSE: role chunk, content chunks, finish, usage, [DONE] */
    FS_STATUS,         /* `status` with an OpenAI error body (Content-Length), keep-alive */
    FS_MALFORMED,      /* 200, one good chunk, then `data: {not json` */
    FS_ERROR_EVENT,    /* 200, one good chunk, then data: {"error": {...}} */
    FS_NO_DONE,        /* 200, chunks, then the chunked body ends without [DONE] */
    FS_CLOSE_MID,      /* 200, two chunks, then the socket closes */
    FS_LENGTH_BODY,    /* 200 with Content-Length: the whole SSE body in one piece */
    FS_EOF_BODY,       /* 200, no length, Connection: close, body ends with the connection */
} fs_mode;

typedef struct fs_cfg {
    fs_mode mode;
    int status;           /* FS_STATUS (and every fail_every-th request) */
    int fail_every;       /* > 0: the k-th, 2k-th, ... requests answer `status` instead */
    int ttft_ms, itl_ms;  /* delay to the first content chunk, between content chunks */
    int n_chunks;         /* content chunks */
    int tokens_per_chunk; /* usage.completion_tokens = n_chunks * tokens_per_chunk */
    int no_usage;         /* leave the usage chunk out */
    int spec;             /* add usage.speculative {steps 3, draft 6, accepted 4} */
    int split;            /* write each event as two HTTP chunks, each in two send()s */
    int crlf;             /* SSE lines end in CRLF */
    int close_after;      /* Connection: close after each response */
    int silent_close;     /* close the connection after each response without saying so */
} fs_cfg;

#define FS_MAX_CONNS 512
#define FS_MAX_BODIES 64

typedef struct fake_server {
    fs_cfg cfg;
    int fd, port;
    pthread_t accept_thr;
    pthread_mutex_t mu;
    int stop;
    int conn_fds[FS_MAX_CONNS];
    pthread_t conn_thr[FS_MAX_CONNS];
    /* counted under mu */
    int connections, requests, in_flight, peak_in_flight; /* requests: POSTs */
    int gets; /* GETs (answered 404) */
    char *bodies[FS_MAX_BODIES]; /* the first request bodies, in arrival order */
    int n_bodies;
    char path[256], auth[256]; /* of the last request */
} fake_server;

/* Listens on 127.0.0.1 (ephemeral port, s->port). 0 or -1. */
int fs_start(fake_server *s, const fs_cfg *cfg);
/* Stops accepting, closes every connection, joins the threads, frees. */
void fs_stop(fake_server *s);
/* A loopback port that nothing listens on (bound, then closed). */
int fs_dead_port(void);

#endif

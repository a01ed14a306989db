/* net/server: `specd serve`, the glue between the HTTP loop and the engine.
 *
 * The libuv loop thread parses, validates, tokenizes, routes and writes; it
 * never runs model work. The engine runs on its own threads; its callbacks
 * copy their data into a mutex-guarded queue and wake the loop with
 * uv_async_send, and the loop turns queued events into SSE chunks or the
 * final JSON. A client that goes away (in any state: queued, prefill,
 * decode, non-streaming) has its request cancelled, which frees its KV
 * blocks. The model loads on a worker thread while /health answers 503;
 * a one-token warm-up request must finish before the server reports ready
 * (READY=1 to systemd). SIGTERM/SIGINT drain: the listener closes, running
 * requests get --shutdown-timeout to finish, the rest are cancelled, and
 * the loop ends with every handle closed. */
#ifndef SD_NET_SERVER_H
#define SD_NET_SERVER_H

#include <uv.h>

#include "core/config.h"
#include "core/err.h"

typedef struct sd_server sd_server;

enum {
    SD_SERVER_NO_ENGINE = 1u << 0,  /* never load a model: model routes answer 503 (tests, fuzzing) */
    SD_SERVER_NO_SIGNALS = 1u << 1, /* leave SIGTERM/SIGINT alone (in-process tests) */
    SD_SERVER_NO_LISTEN = 1u << 2,  /* no socket: requests come through sd_server_feed */
};

/* Starts serving on loop: listens (unless NO_LISTEN), starts loading the
 * model (unless NO_ENGINE). o must outlive the server. */
int sd_server_start(sd_server **out, uv_loop_t *loop, const sd_opts *o, unsigned flags,
                    sd_err *err);
/* The bound port (--port 0 picks one). */
int sd_server_port(const sd_server *s);
/* What SIGTERM does (loop thread only); a second call cancels at once. */
void sd_server_drain(sd_server *s);
/* The process exit status once the loop has ended: 0, or 1 when the model
 * failed to load or to warm up. */
int sd_server_exit_status(const sd_server *s);
/* After uv_run returned. */
void sd_server_free(sd_server *s);
/* Runs bytes through a socketless connection (same parser, limits, routes and
 * validation); responses are appended to out. For the fuzzer. A request
 * the server parses or tokenizes on the thread pool (a body over 16 KiB,
 * or one that may compile a JSON schema) gets no response: the connection
 * ends before the pool is done. */
struct sd_buf;
void sd_server_feed(sd_server *s, const void *data, size_t len, struct sd_buf *out);

#endif

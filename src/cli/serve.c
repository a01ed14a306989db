/* specd serve: the OpenAI-compatible HTTP server (src/net/server.c) on its
 * own libuv loop; returns when the loop has ended (after SIGTERM/SIGINT). */
#include <signal.h>
#include <stdio.h>
#include <uv.h>

#include "cli/cli.h"
#include "net/server.h"

int sd_cmd_serve(const sd_opts *o)
{
    /* A peer that closes mid-write must cost a write error, not the process. */
    signal(SIGPIPE, SIG_IGN);
    if (o->nnodes > 1 && o->node_rank > 0)
        return sd_cli_follow(o, "serve"); /* node 0 serves the API */
    uv_loop_t loop;
    int rc = uv_loop_init(&loop);
    if (rc) {
        fprintf(stderr, "specd serve: event loop: %s\n", uv_strerror(rc));
        return 1;
    }
    sd_server *s = NULL;
    sd_err err = {0};
    if (sd_server_start(&s, &loop, o, 0, &err)) {
        fprintf(stderr, "specd serve: %s\n", err.msg);
        uv_loop_close(&loop);
        return 1;
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    int status = sd_server_exit_status(s);
    sd_server_free(s);
    if (uv_loop_close(&loop))
        fprintf(stderr, "specd serve: event loop closed with handles still open\n");
    return status;
}

/* cli/comm_opts: the tensor-parallel options checked together, after the
 * table has checked each alone (types, ranges, choices).
 *
 * Two kinds of refusal, one line each:
 * - inconsistent (SD_EINVAL, exit 2): --node-rank not below --nnodes, several
 *   nodes without --dist-init-addr or with a malformed one, --tp that does
 *   not split over the nodes;
 * - --allreduce other than auto on CPU ranks is refused where the ranks
 *   open (engine/tp.c), with the device known.
 * Several nodes: every node runs the same command with its --node-rank;
 * node 0 takes the requests, the others follow its steps (sd_cli_follow). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/log.h"
#include "engine/engine.h"
#include "net/notify.h"

int sd_cli_check_comm_opts(const sd_opts *o, unsigned cmd, sd_err *err)
{
    if (!(cmd & SD_CMD_MODEL))
        return 0;
    int nnodes = o->nnodes, tp = o->tp;
    const char *addr = o->dist_init_addr ? o->dist_init_addr : "";
    if (o->node_rank >= nnodes)
        return sd_err_set(err, SD_EINVAL, "--node-rank %d: not in 0..%d (--nnodes %d)",
                          o->node_rank, nnodes - 1, nnodes);
    if (addr[0]) {
        char host[256];
        int port;
        int rc = sd_dist_addr_parse(addr, host, sizeof host, &port, err);
        if (rc)
            return rc;
        if (nnodes > 1 && port == 0)
            return sd_err_set(err, SD_EINVAL,
                              "--dist-init-addr '%s': port 0 (any free port) cannot be found by "
                              "the other nodes; give node 0's port",
                              addr);
    }
    if (nnodes > 1 && !addr[0])
        return sd_err_set(err, SD_EINVAL, "--nnodes %d: --dist-init-addr HOST:PORT is required",
                          nnodes);
    if (nnodes > 1 && tp % nnodes)
        return sd_err_set(err, SD_EINVAL,
                          "--tp %d: not a multiple of --nnodes %d (each node runs --tp / --nnodes "
                          "ranks)",
                          tp, nnodes);
    return 0;
}

int sd_cli_follow(const sd_opts *o, const char *cmd)
{
    sd_err err = {0};
    sd_engine *e = NULL;
    if (sd_engine_create(&e, o, &err)) {
        fprintf(stderr, "specd %s: %s\n", cmd, err.msg);
        return 1;
    }
    sd_log_info("node %d of %d: following node 0's steps (requests go to node 0)", o->node_rank,
                o->nnodes);
    /* Under systemd (the shipped unit is Type=notify with a watchdog): ready
     * once the engine runs, and a ping while node 0's plans keep coming
     * (every step, and every 50 ms when idle) and no step fails. */
    char st[128];
    snprintf(st, sizeof st, "READY=1\nSTATUS=node %d of %d, following node 0", o->node_rank,
             o->nnodes);
    sd_notify_state(st);
    uint64_t wd = sd_notify_watchdog_usec(), seen = 0;
    int rc;
    while ((rc = sd_engine_wait(e, wd ? (double)wd * 0.5e-6 : 0)) == 1) {
        sd_engine_stats es;
        sd_engine_get_stats(e, &es);
        if (es.failing == 0 && es.plans != seen)
            sd_notify_state("WATCHDOG=1");
        else
            sd_log_warn("watchdog: %s; not pinging systemd",
                        es.failing ? "model steps fail" : "no plan from node 0");
        seen = es.plans;
    }
    sd_notify_state("STOPPING=1");
    sd_engine_destroy(e);
    if (rc) {
        fprintf(stderr, "specd %s: the node group failed (node 0 is gone or out of step)\n",
                cmd);
        return 1;
    }
    sd_log_info("node 0 stopped: this node stops too");
    return 0;
}

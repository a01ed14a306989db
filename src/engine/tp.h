/* engine/tp: tensor-parallel ranks behind one virtual backend (tp.c). */
#ifndef SD_ENGINE_TP_H
#define SD_ENGINE_TP_H

#include "comm/comm.h"
#include "core/config.h"
#include "engine/backend.h"
#include "kernels/ops.h"
#include "target/runner.h"

#define SD_TP_MAX 16
#define SD_AR_SIZES 32 /* message sizes the start-up autotune times at most */

typedef struct sd_tp sd_tp;

/* The ranks of this node (o->tp / o->nnodes): backends (GPU r, or CPU
 * backends sharing the threads), the communicator, the rank threads. With
 * several nodes, first the node group at o->dist_init_addr (the settings
 * every node must share are compared there); the CPU ranks' collectives then
 * go through it (node_comm.c), the GPU ranks' through NCCL. */
int sd__tp_open(sd_tp **out, const sd_opts *o, int hidden, sd_err *err);
/* GPU ranks: times NCCL and the custom all-reduce at each message size (in
 * floats) on the rank threads and keeps the fastest correct one per size;
 * CPU ranks: nothing to do. */
int sd__tp_tune(sd_tp *t, const size_t *sizes, int n_sizes, sd_err *err);
/* device memory of the custom all-reduce on each GPU (memory plan) */
size_t sd__tp_comm_bytes(const sd_tp *t);
/* Prometheus lines of the all-reduce choice per message size ("" on CPUs) */
const char *sd__tp_metrics(const sd_tp *t);
void sd__tp_close(sd_tp *t);
int sd__tp_size(const sd_tp *t); /* ranks of this node */
int sd__tp_rank0(const sd_tp *t); /* global rank of this node's rank 0 */
int sd__tp_total(const sd_tp *t); /* ranks of all nodes */
/* several nodes: the node group (NULL on one node) */
sd_nodes *sd__tp_nodes(sd_tp *t);
/* the virtual backend the engine allocates from and runs ops on */
sd_backend *sd__tp_backend(sd_tp *t);
sd_backend *sd__tp_rank_backend(sd_tp *t, int r);
sd_comm *sd__tp_comm(sd_tp *t);
/* Runs fn(ctx, r) for every rank r at once, each in its rank's context
 * (rank 0 on the calling thread); returns the first failure. Called in a
 * rank's context, runs fn for that rank only. */
int sd__tp_each(sd_tp *t, int (*fn)(void *ctx, int rank, sd_err *err), void *ctx, sd_err *err);
/* the calling thread's rank context, -1 outside one */
int sd__tp_rank(void);
/* rank r's address of a virtual (rank 0) address; NULL stays NULL */
const void *sd__tp_map(sd_tp *t, const void *p, int r);

/* Tensor parallelism outside the engine (tp_runner.c): the o->tp ranks of
 * one model (o->device: GPU r, or CPU backends sharing o->threads) joined by
 * the communicator, for one sequence at a time (target/runner.h's slots).
 * Each call runs the same step on every rank at once (rank 0 on the
 * caller's thread) and returns the outputs, which every rank computes alike:
 * a rank whose outputs differ from rank 0's by one bit is an error. A failed
 * step leaves the group unusable (its communicator aborted). GPU ranks time
 * the all-reduce at open for the workspace's message sizes. */
typedef struct sd_tp_runner sd_tp_runner;

/* mo->tp_rank, mo->tp_size and mo->comm are set per rank */
int sd_tp_runner_open(sd_tp_runner **out, const char *dir, const sd_opts *o,
                      const sd_model_opts *mo, sd_err *err);
void sd_tp_runner_close(sd_tp_runner *t);
int sd_tp_runner_size(const sd_tp_runner *t);
sd_model *sd_tp_runner_model(sd_tp_runner *t, int rank);
int sd_tp_runner_alloc_kv(sd_tp_runner *t, int n_slots, sd_err *err);
int sd_tp_runner_target(sd_tp_runner *t, const int32_t *ids, int n, int start,
                        const sd_seq_out *o, sd_err *err);
int sd_tp_runner_mtp(sd_tp_runner *t, const int32_t *ids, const float *in_hidden, int n,
                     int start, const sd_seq_out *o, sd_err *err);

#endif

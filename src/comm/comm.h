/* comm: collectives among the tensor-parallel ranks of one model.
 *
 * A communicator joins `size` ranks of one process (one worker thread per
 * rank; several processes for several nodes). Every rank calls every
 * collective, in the same order, from its own thread, with its own buffers:
 * backend memory of that rank (host memory on the CPU, device memory on a
 * GPU, where a call is queued on the rank's stream and returns at once).
 *
 * Implementations plug in behind a small vtable: the CPU thread comm
 * (thread_comm.c, below) and, on GPUs, NCCL and the custom all-reduce.
 * The thread comm reduces in a fixed order (rank 0 + rank 1 + ... in that
 * order, for every element), so a result never depends on timing and every
 * rank holds bit-identical sums.
 *
 * Failure: a collective that cannot complete returns a negative SD_E* code on
 * every rank that takes part. A rank that fails OUTSIDE a collective (and so
 * would leave the others waiting for it) calls sd_comm_abort: every pending and
 * later collective then returns SD_ECANCELED. An aborted communicator stays
 * aborted; destroy it and make a new one.
 *
 * This module never allocates inside a collective and never prints. */
#ifndef SD_COMM_COMM_H
#define SD_COMM_COMM_H

#include <stddef.h>

#include "core/err.h"
#include "kernels/ops.h" /* sd_backend, sd_weight: the unfused residual step's ops */

typedef struct sd_comm sd_comm;

typedef struct sd_comm_ops {
    const char *name;
    int (*allreduce_sum)(sd_comm *c, int rank, float *buf, size_t n);
    int (*allgather)(sd_comm *c, int rank, float *dst, const float *src, size_t n);
    int (*barrier)(sd_comm *c, int rank);
    void (*abort)(sd_comm *c);
    void (*destroy)(sd_comm *c);
    /* Optional (NULL: none): sd_comm_allreduce_add_rmsnorm in one kernel.
     * Returns SD_ENOTSUP, alike on every rank, for a call it does not take
     * (size, alignment, weight dtype); the entry point then runs the
     * unfused steps. */
    int (*allreduce_add_rmsnorm)(sd_comm *c, int rank, const float *partial, float *x, float *xn,
                                 const sd_weight *w, int rows, int d, float eps);
} sd_comm_ops;

struct sd_comm {
    const sd_comm_ops *ops;
    int size;   /* ranks */
    void *impl; /* implementation state */
};

/* buf (n) on every rank := the element-wise sum of all ranks' buf. Returns
 * when this rank's buf holds the sum (CPU) or once the sum is queued (GPU). */
int sd_comm_allreduce_sum(sd_comm *c, int rank, float *buf, size_t n);
/* dst (size * n) on every rank := [src of rank 0, src of rank 1, ...].
 * src may be dst + rank * n (in place). */
int sd_comm_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n);
/* The residual step after a row-parallel layer (o_proj, down_proj, the MoE
 * combine), over `rows` dense rows of d floats on every rank:
 *   x(rows, d)  += partial_0 + partial_1 + ... + partial_{P-1}  (that order)
 *   xn(rows, d)  = w * (x * rsqrt(mean(x^2) + eps))             (be's rmsnorm)
 * In one collective where the communicator has a fused kernel for the call;
 * otherwise sd_comm_allreduce_sum on partial, then be's add and rmsnorm (the
 * thread comm: bit for bit what those three calls give). partial holds an
 * unspecified value afterwards; partial, x and xn do not overlap; w is a (d)
 * vector. Every rank gets the same bits of x and xn. */
int sd_comm_allreduce_add_rmsnorm(sd_comm *c, int rank, sd_backend *be, float *partial, float *x,
                                  float *xn, const sd_weight *w, int rows, int d, float eps);
/* Returns once every rank has called it. */
int sd_comm_barrier(sd_comm *c, int rank);
/* Wakes every waiting rank with SD_ECANCELED; any thread may call it. */
void sd_comm_abort(sd_comm *c);
void sd_comm_destroy(sd_comm *c);
const char *sd_comm_name(const sd_comm *c);

/* The CPU thread communicator for `size` ranks of this process. */
int sd_thread_comm_create(sd_comm **out, int size, sd_err *err);

/* ---- multi-node bootstrap (bootstrap.c) ----
 * Node 0 listens on --dist-init-addr HOST:PORT (PORT 0: any free port) and
 * serves a blob (NCCL's unique id) to nodes 1..nnodes-1, each of which
 * fetches it (retrying until node 0 listens). Every wait has a deadline. */
typedef struct sd_bootstrap sd_bootstrap;
/* "HOST:PORT" or "[V6]:PORT" -> host (hl bytes at most), port (0..65535);
 * an error names --dist-init-addr. */
int sd_dist_addr_parse(const char *addr, char *host, size_t hl, int *port, sd_err *err);
int sd_bootstrap_listen(sd_bootstrap **out, const char *addr, sd_err *err);
int sd_bootstrap_port(const sd_bootstrap *b);
/* Returns once nodes 1..nnodes-1 each hold the blob. */
int sd_bootstrap_serve(sd_bootstrap *b, int nnodes, const void *blob, size_t len,
                       double timeout_s, sd_err *err);
void sd_bootstrap_close(sd_bootstrap *b);
int sd_bootstrap_fetch(const char *addr, int node_rank, void *blob, size_t len, double timeout_s,
                       sd_err *err);

#endif

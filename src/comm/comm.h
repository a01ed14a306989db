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
#include <stdint.h>

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

/* ---- call counts: what a step spends on collectives ----
 * The entry points below count rank 0's calls (every rank makes the same
 * ones, so rank 0's are the collectives'): on every communicator, CPU or
 * GPU. A communicator that picks among paths (the GPU comm) also counts
 * calls and floats per path and adds an estimate of their time. Counters
 * are written by rank 0's thread only and read from any thread
 * (sd_comm_get_counts; relaxed atomics: a read during a call may see part
 * of it). */
#define SD_COMM_PATHS 4 /* the GPU comm's: nccl, oneshot, twoshot, fused (gpu_comm.h) */
typedef struct sd_comm_counts {
    uint64_t allreduce_calls;  /* sd_comm_allreduce_sum + sd_comm_allreduce_add_rmsnorm */
    uint64_t allreduce_floats; /* floats summed by those calls (per rank) */
    uint64_t residual_calls;   /* of allreduce_calls: sd_comm_allreduce_add_rmsnorm (rows > 0) */
    uint64_t allgather_calls;
    uint64_t allgather_floats; /* floats each rank contributes */
    uint64_t path_calls[SD_COMM_PATHS], path_floats[SD_COMM_PATHS]; /* GPU comm: by path */
    /* GPU comm: the sum over all-reduces of the time the start-up autotune
     * measured for that message size and path (nanoseconds), and the calls
     * that sum covers (none where the table was not timed) */
    uint64_t est_ns, est_calls;
    /* replays of graphs whose collectives were never recorded
     * (sd_comm_replayed with an unknown key): their calls are missing above */
    uint64_t unrecorded_replays;
} sd_comm_counts;

struct sd_comm_graphs; /* comm.c: the calls each captured graph queues, by key */

struct sd_comm {
    const sd_comm_ops *ops;
    int size;   /* ranks */
    void *impl; /* implementation state */
    /* counts (comm.c; implementations leave them zero at create) */
    sd_comm_counts counts;
    sd_comm_counts pending; /* while recording: the calls of the graph being captured */
    int recording;
    struct sd_comm_graphs *graphs;
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

/* The counts so far (all zero for NULL). */
void sd_comm_get_counts(const sd_comm *c, sd_comm_counts *out);
/* CUDA graphs: the collectives captured into a graph run at each replay,
 * not at capture. Between sd_comm_record_begin and sd_comm_record_end (the
 * capture, on every rank) rank 0's calls are kept apart instead of counted;
 * record_end files them under key (the graph) and sd_comm_replayed counts
 * them once per replay. Called from rank 0's thread (the engine's), outside
 * any collective. record_end returns SD_ENOMEM where it cannot keep them
 * (the replays then count as unrecorded). */
void sd_comm_record_begin(sd_comm *c);
int sd_comm_record_end(sd_comm *c, const void *key);
void sd_comm_replayed(sd_comm *c, const void *key);
/* For implementations (rank 0's thread, inside a collective): one call of
 * n floats down path p, with its estimated time (0: none). */
void sd_comm_count_path(sd_comm *c, int rank, int path, size_t n, uint64_t est_ns);

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

/* ---- the node group (bootstrap.c): node 0's connections to the other
 * nodes, opened through the bootstrap at --dist-init-addr and kept. The
 * control plane of several nodes: the engine's step plans, the NCCL id, and
 * the CPU ranks' collectives across processes (node_comm.c). Every node
 * makes the same calls in the same order. A call that fails (a node gone, a
 * timeout) aborts the group: every later call fails at once. */
#define SD_NODES_MAX 64
typedef struct sd_nodes sd_nodes;
/* fingerprint: the settings every node must share (compared with node 0's) */
int sd_nodes_open(sd_nodes **out, int nnodes, int node_rank, const char *addr,
                  const void *fingerprint, size_t fp_len, double timeout_s, sd_err *err);
int sd_nodes_count(const sd_nodes *g);
int sd_nodes_rank(const sd_nodes *g);
/* node 0's buf (len bytes) to every node */
int sd_nodes_bcast(sd_nodes *g, void *buf, size_t len, double timeout_s, sd_err *err);
/* node 0: all (nnodes * len) := [node 0's mine, node 1's, ...]; others send mine */
int sd_nodes_gather(sd_nodes *g, const void *mine, void *all, size_t len, double timeout_s,
                    sd_err *err);
/* a message of any length from node 0 (send) to every other node (recv: *buf
 * malloc'd, the caller frees it) */
int sd_nodes_send_msg(sd_nodes *g, const void *buf, size_t len, double timeout_s, sd_err *err);
int sd_nodes_recv_msg(sd_nodes *g, void **buf, size_t *len, double timeout_s, sd_err *err);
/* every pending and later call fails; any thread may call it */
void sd_nodes_abort(sd_nodes *g);
void sd_nodes_close(sd_nodes *g);

/* The CPU communicator of the tensor-parallel ranks of several processes
 * (node_comm.c): n_local rank threads here, global ranks node * n_local + r,
 * size nnodes * n_local. Each collective gathers every rank's buffer on node
 * 0, which sums (or concatenates) in global rank order and sends the result
 * back: the thread comm's bits. Slow (TCP), for CPU ranks and tests; GPU
 * ranks use NCCL across nodes. The comm's `rank` is the local rank. */
int sd_node_comm_create(sd_comm **out, sd_nodes *g, int n_local, sd_err *err);

#endif

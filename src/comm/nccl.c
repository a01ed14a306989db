/* comm/nccl: the NCCL communicator behind the sd_comm vtable.
 *
 * One process drives n_local GPUs, one rank thread each. On one node the
 * unique id is made here; across nodes node 0 makes it and serves it over
 * TCP (bootstrap.c) and NCCL's own transports (NVLink, PCIe, IB, sockets) do
 * the rest. All local communicators are created in one NCCL group from the
 * calling thread; afterwards each rank thread calls only its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gpu_comm.h"
#include "core/log.h"

#ifdef SD_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

typedef struct ncomm {
    sd_comm pub;
    int n;
    int rank0, nranks; /* global rank of local rank 0, ranks of all nodes */
    int devices[SD_GPU_MAX_RANKS];
    cudaStream_t streams[SD_GPU_MAX_RANKS];
    ncclComm_t comms[SD_GPU_MAX_RANKS];
    float *one[SD_GPU_MAX_RANKS]; /* (1) per rank: the barrier's all-reduce */
    int aborted;
} ncomm;

/* Statement, file, line and device of a failed NCCL or CUDA call. */
static int nccl_failed(sd_err *err, const char *what, const char *why, const char *stmt, int dev,
                       const char *file, int line)
{
    if (err)
        return sd_err_set(err, SD_EDEVICE, "%s: %s failed: %s (device %d, %s:%d)", what, stmt, why,
                          dev, file, line);
    sd_log_error("%s: %s failed: %s (device %d, %s:%d)", what, stmt, why, dev, file, line);
    return SD_EDEVICE;
}
#define SD_NCCL(err, stmt, dev)                                                                 \
    do {                                                                                        \
        ncclResult_t r_ = (stmt);                                                               \
        if (r_ != ncclSuccess && r_ != ncclInProgress)                                          \
            return nccl_failed((err), "NCCL", ncclGetErrorString(r_), #stmt, (dev), __FILE__,   \
                               __LINE__);                                                       \
    } while (0)
#define SD_CUDART(err, stmt, dev)                                                               \
    do {                                                                                        \
        cudaError_t e_ = (stmt);                                                                \
        if (e_ != cudaSuccess)                                                                  \
            return nccl_failed((err), "CUDA", cudaGetErrorString(e_), #stmt, (dev), __FILE__,   \
                               __LINE__);                                                       \
    } while (0)

/* A collective's rank is global (rank0 .. rank0 + n - 1 here). */
#define LOCAL(t, rank)                                                                          \
    do {                                                                                        \
        rank -= (t)->rank0;                                                                     \
        if (rank < 0 || rank >= (t)->n)                                                         \
            return SD_EINVAL;                                                                   \
    } while (0)

static int nc_allreduce(sd_comm *c, int rank, float *buf, size_t n)
{
    ncomm *t = (ncomm *)c;
    LOCAL(t, rank);
    if (t->aborted)
        return SD_ECANCELED;
    SD_NCCL(NULL, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, t->comms[rank], t->streams[rank]),
            t->devices[rank]);
    return 0;
}

static int nc_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    ncomm *t = (ncomm *)c;
    LOCAL(t, rank);
    if (t->aborted)
        return SD_ECANCELED;
    SD_NCCL(NULL, ncclAllGather(src, dst, n, ncclFloat, t->comms[rank], t->streams[rank]),
            t->devices[rank]);
    return 0;
}

/* A one-float all-reduce, then the stream: every rank's queued work is done. */
static int nc_barrier(sd_comm *c, int rank)
{
    ncomm *t = (ncomm *)c;
    LOCAL(t, rank);
    if (t->aborted)
        return SD_ECANCELED;
    SD_NCCL(NULL,
            ncclAllReduce(t->one[rank], t->one[rank], 1, ncclFloat, ncclSum, t->comms[rank],
                          t->streams[rank]),
            t->devices[rank]);
    SD_CUDART(NULL, cudaStreamSynchronize(t->streams[rank]), t->devices[rank]);
    return 0;
}

static void nc_abort(sd_comm *c)
{
    ncomm *t = (ncomm *)c;
    if (t->aborted)
        return;
    t->aborted = 1;
    for (int r = 0; r < t->n; r++)
        if (t->comms[r])
            ncclCommAbort(t->comms[r]);
}

static void nc_destroy(sd_comm *c)
{
    ncomm *t = (ncomm *)c;
    int prev = 0;
    cudaGetDevice(&prev);
    for (int r = 0; r < t->n; r++) {
        if (t->comms[r] && !t->aborted)
            ncclCommDestroy(t->comms[r]);
        if (t->one[r]) {
            cudaSetDevice(t->devices[r]);
            cudaFree(t->one[r]);
        }
    }
    cudaSetDevice(prev);
    free(t);
}

static const sd_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce_sum = nc_allreduce,
    .allgather = nc_allgather,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .destroy = nc_destroy,
};

/* The unique id: made here (one node, or node 0, which serves it) or
 * fetched from node 0. */
static int unique_id(const sd_nccl_opts *o, ncclUniqueId *id, sd_err *err)
{
    if (o->nnodes > 1 && o->nodes) {
        if (o->node_rank == 0)
            SD_NCCL(err, ncclGetUniqueId(id), -1);
        return sd_nodes_bcast(o->nodes, id, sizeof *id, o->timeout_s, err);
    }
    if (o->nnodes > 1 && o->node_rank > 0)
        return sd_bootstrap_fetch(o->dist_init_addr, o->node_rank, id, sizeof *id, o->timeout_s,
                                  err);
    SD_NCCL(err, ncclGetUniqueId(id), -1);
    if (o->nnodes <= 1)
        return 0;
    sd_bootstrap *b;
    int rc = sd_bootstrap_listen(&b, o->dist_init_addr, err);
    if (rc)
        return rc;
    rc = sd_bootstrap_serve(b, o->nnodes, id, sizeof *id, o->timeout_s, err);
    sd_bootstrap_close(b);
    return rc;
}

static int init_comms(ncomm *t, const ncclUniqueId *id, sd_err *err)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    SD_NCCL(err, ncclGroupStart(), -1);
    for (int r = 0; r < t->n; r++) {
        cudaError_t e = cudaSetDevice(t->devices[r]);
        ncclResult_t nr = e == cudaSuccess ? ncclCommInitRankConfig(&t->comms[r], t->nranks, *id,
                                                                    t->rank0 + r, &cfg)
                                           : ncclSuccess;
        if (e != cudaSuccess || nr != ncclSuccess) {
            ncclGroupEnd();
            return e != cudaSuccess
                       ? nccl_failed(err, "CUDA", cudaGetErrorString(e), "cudaSetDevice",
                                     t->devices[r], __FILE__, __LINE__)
                       : nccl_failed(err, "NCCL", ncclGetErrorString(nr), "ncclCommInitRankConfig",
                                     t->devices[r], __FILE__, __LINE__);
        }
    }
    SD_NCCL(err, ncclGroupEnd(), -1);
    for (int r = 0; r < t->n; r++) {
        SD_CUDART(err, cudaSetDevice(t->devices[r]), t->devices[r]);
        SD_CUDART(err, cudaMalloc((void **)&t->one[r], sizeof(float)), t->devices[r]);
        SD_CUDART(err, cudaMemset(t->one[r], 0, sizeof(float)), t->devices[r]);
    }
    return 0;
}

int sd_nccl_comm_create(sd_comm **out, const sd_nccl_opts *o, sd_err *err)
{
    *out = NULL;
    if (o->n_local < 1 || o->n_local > SD_GPU_MAX_RANKS || !o->devices || !o->streams)
        return sd_err_set(err, SD_EINVAL, "NCCL: %d local ranks (1..%d, with devices and streams)",
                          o->n_local, SD_GPU_MAX_RANKS);
    int nnodes = o->nnodes > 0 ? o->nnodes : 1;
    if (o->node_rank < 0 || o->node_rank >= nnodes)
        return sd_err_set(err, SD_EINVAL, "--node-rank %d: not in 0..%d (--nnodes %d)",
                          o->node_rank, nnodes - 1, nnodes);
    if (nnodes > 1 && (!o->dist_init_addr || !o->dist_init_addr[0]))
        return sd_err_set(err, SD_EINVAL, "--nnodes %d: --dist-init-addr HOST:PORT is required",
                          nnodes);
    /* NVLink multicast (NVLS) stays off: the design never relies on it */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncomm *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->n = o->n_local;
    t->nranks = nnodes * o->n_local;
    t->rank0 = o->node_rank * o->n_local;
    for (int r = 0; r < t->n; r++) {
        t->devices[r] = o->devices[r];
        t->streams[r] = (cudaStream_t)o->streams[r];
    }
    t->pub = (sd_comm){.ops = &nccl_ops, .size = t->nranks, .impl = t};
    int prev = 0;
    cudaGetDevice(&prev);
    ncclUniqueId id;
    sd_nccl_opts oo = *o;
    oo.nnodes = nnodes;
    int rc = unique_id(&oo, &id, err);
    if (!rc)
        rc = init_comms(t, &id, err);
    cudaSetDevice(prev);
    if (rc) {
        nc_destroy(&t->pub);
        return rc;
    }
    sd_log_info("NCCL %d.%d.%d: %d ranks here (global %d..%d of %d), NVLS off", NCCL_MAJOR,
                NCCL_MINOR, NCCL_PATCH, t->n, t->rank0, t->rank0 + t->n - 1, t->nranks);
    *out = &t->pub;
    return 0;
}

#else /* !SD_HAVE_NCCL */

int sd_nccl_comm_create(sd_comm **out, const sd_nccl_opts *o, sd_err *err)
{
    (void)o;
    *out = NULL;
    return sd_err_set(err, SD_ENOTSUP,
                      "NCCL: this build has no NCCL (build with -Dcuda=enabled where libnccl is "
                      "installed)");
}

#endif

/* comm on GPUs: NCCL, the custom all-reduce over CUDA P2P, the topology
 * probe and the start-up autotune that picks between them per message size.
 *
 * One process per node, one worker thread per GPU: rank r of this process
 * drives GPU devices[r] on stream streams[r] (its backend's stream). Every
 * collective is called from that thread with its device current, and only
 * enqueues work on the stream (no host synchronization, no allocation), so
 * it can be captured into a CUDA graph. All buffers are device memory.
 *
 * The custom all-reduce never uses NVLink multicast (NVLS): it is plain P2P
 * loads and stores, and NCCL is started with NVLS off. Within one process
 * peers' memory is reached through P2P pointers (cudaDeviceEnablePeerAccess),
 * so no CUDA IPC handles are exchanged; its buffers are allocated once at
 * start (graph-capture safe: fixed addresses) and their bytes go into the
 * memory plan (sd_car_buffer_bytes).
 *
 * Built with CUDA only (SD_HAVE_CUDA; NCCL parts with SD_HAVE_NCCL); the
 * topology formatter and the choice-table helpers are plain C. */
#ifndef SD_COMM_GPU_COMM_H
#define SD_COMM_GPU_COMM_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_GPU_MAX_RANKS 8

/* ---- NCCL (nccl.c) ---- */
typedef struct sd_nccl_opts {
    int n_local;                /* GPUs (ranks) of this process */
    const int *devices;         /* (n_local) CUDA ordinals */
    void *const *streams;       /* (n_local) cudaStream_t of each rank */
    int nnodes, node_rank;      /* 1 and 0 on one node; every node has n_local GPUs */
    const char *dist_init_addr; /* HOST:PORT of node 0 when nnodes > 1 */
    sd_nodes *nodes;            /* nnodes > 1: the id goes through this group (else the
                                 * bootstrap at dist_init_addr) */
    double timeout_s;           /* for the id exchange */
} sd_nccl_opts;

/* A communicator over the n_local ranks of this process (global rank of
 * local rank r: node_rank * n_local + r). Collectives: ncclAllReduce /
 * ncclAllGather on the rank's stream; barrier also waits for the stream. */
int sd_nccl_comm_create(sd_comm **out, const sd_nccl_opts *o, sd_err *err);

/* ---- custom all-reduce (custom_ar.cu) ---- */
typedef enum sd_ar_algo {
    SD_AR_NCCL = 0,
    SD_AR_ONESHOT, /* every rank reads every peer's buffer and sums: 1 step */
    SD_AR_TWOSHOT, /* reduce-scatter then all-gather: 2 steps, 2/P of the reads */
    SD_AR_N_ALGOS
} sd_ar_algo;

const char *sd_ar_algo_name(sd_ar_algo a);
/* "auto" -> -1, else the algorithm; -2 if unknown. */
int sd_ar_algo_parse(const char *s);

typedef struct sd_car sd_car;

/* Enables P2P between every pair of GPUs (refused, naming the pair, where
 * the hardware cannot) and allocates for each rank, on its GPU, a buffer of
 * max_bytes and a signal area. devices[] may repeat an ordinal: those ranks
 * share that GPU (no P2P; for checking the kernels on one GPU), which is
 * refused where their blocks cannot all be resident together. */
int sd_car_create(sd_car **out, int n, const int *devices, void *const *streams,
                  size_t max_bytes, sd_err *err);
void sd_car_destroy(sd_car *c);
/* Device memory the custom all-reduce holds on each GPU (memory plan). */
size_t sd_car_buffer_bytes(const sd_car *c);
/* Largest message in floats; messages must also be a multiple of 4 floats
 * at a 16-byte aligned address (sd_car_fits). */
size_t sd_car_max_floats(const sd_car *c);
int sd_car_fits(const sd_car *c, const float *buf, size_t n);
/* buf (n) := sum over ranks, in rank order (every rank gets the same bits).
 * Called from the rank's thread with the rank's GPU current (the kernel goes
 * to the current device; engine/tp.c's rank functions guarantee it). */
int sd_car_allreduce(sd_car *c, int rank, float *buf, size_t n, sd_ar_algo algo);
/* Fused one-shot all-reduce + residual add + RMSNorm over rows of d floats
 * (sd_comm_allreduce_add_rmsnorm's contract): x(rows, d) += partial_0 + ...
 * + partial_{P-1} in rank order (the bits of the unfused path); xn = w * (x *
 * rsqrt(mean(x^2) + eps)) as the backend's rmsnorm computes it, w a (d)
 * vector of dtype wdt. partial is not written. SD_ENOTSUP (nothing queued)
 * where the call does not fit: d not a multiple of 4, rows * d past the
 * buffer, a pointer not 16-byte aligned, wdt not F32/BF16/F16. */
int sd_car_allreduce_add_rmsnorm(sd_car *c, int rank, const float *partial, float *x, float *xn,
                                 const void *w, sd_dtype wdt, int rows, int d, float eps);

/* ---- autotune (autotune.c) ---- */
#define SD_AR_TABLE_MAX 32
typedef struct sd_ar_choice {
    size_t floats;           /* message size */
    sd_ar_algo algo;         /* the pick */
    double us[SD_AR_N_ALGOS]; /* mean time per call over the ranks, microseconds; 0: not run */
    int ok[SD_AR_N_ALGOS];   /* 1: every rank got the exact sum */
} sd_ar_choice;

typedef struct sd_ar_table {
    int n;
    sd_ar_choice c[SD_AR_TABLE_MAX];
    int timed; /* 1: us[] are measured times (0: --allreduce forced, untimed) */
} sd_ar_table;

/* Called by every rank's thread with the same sizes (like a collective):
 * for each size, times NCCL and each custom variant that fits (iters calls
 * after a warm-up), checks each result exactly (inputs are small integers,
 * so every summation order is exact), and picks the fastest correct one.
 * forced >= 0 skips the timing and uses that algorithm where it fits (NCCL
 * elsewhere). The ranks agree on the table (timings are all-reduced). */
int sd_ar_autotune(sd_comm *nccl, sd_car *car, int rank, const size_t *sizes, int n_sizes,
                   int forced, int iters, sd_ar_table *out, sd_err *err);
/* The algorithm for a message of n floats: that of the smallest tuned size
 * >= n (NCCL above the largest). */
sd_ar_algo sd_ar_table_pick(const sd_ar_table *t, size_t n);
/* The time of one all-reduce of n floats by algorithm a, in microseconds,
 * from a timed table: linear between the two tuned sizes around n, the
 * smallest size's time below it (a latency floor), the largest's scaled by
 * n / its size above it (bandwidth-bound). Only sizes where a ran and was
 * right count. 0 where there is none (or the table is untimed). */
double sd_ar_table_est_us(const sd_ar_table *t, sd_ar_algo a, size_t n);
/* One line per size: "floats bytes algo  nccl_us oneshot_us twoshot_us". */
void sd_ar_table_format(const sd_ar_table *t, char *buf, size_t len);
/* Prometheus lines: specd_allreduce_choice{bytes="...",algo="..."} 1 and
 * specd_allreduce_seconds{bytes="...",algo="..."} t. */
void sd_ar_table_metrics(const sd_ar_table *t, char *buf, size_t len);

/* The communicator the model uses on GPUs: all-reduce by the table (the
 * custom variant where it won and fits, NCCL otherwise), all-gather and
 * barrier by NCCL; the residual step (sd_comm_allreduce_add_rmsnorm) by the
 * fused kernel where one-shot won at that size and the call fits, else
 * unfused. Borrows nccl and car (the caller frees them after). */
int sd_gpu_comm_create(sd_comm **out, sd_comm *nccl, sd_car *car, const sd_ar_table *t,
                       sd_err *err);
/* Its call counts (sd_comm_get_counts) by path: SD_AR_NCCL, SD_AR_ONESHOT,
 * SD_AR_TWOSHOT, and SD_AR_PATH_FUSED for the fused residual kernel; every
 * call carries the table's time for its size (the fused kernel: one-shot's,
 * the all-reduce it contains; its add and norm replace the unfused path's
 * two kernels and are not counted). */
#define SD_AR_PATH_FUSED SD_AR_N_ALGOS
/* Replaces the table (while no collective is in flight: at start, once the
 * message sizes are known). */
int sd_gpu_comm_set_table(sd_comm *c, const sd_ar_table *t);

/* ---- topology (topo.c) ---- */
typedef enum sd_link {
    SD_LINK_SELF = 0,
    SD_LINK_NVLINK, /* n NVLink lanes, direct or through NVSwitch */
    SD_LINK_PIX,    /* at most one PCIe switch */
    SD_LINK_PXB,    /* several PCIe switches, no host bridge */
    SD_LINK_PHB,    /* a PCIe host bridge */
    SD_LINK_NODE,   /* host bridges within one NUMA node */
    SD_LINK_SYS,    /* across NUMA nodes (SMP interconnect) */
    SD_LINK_UNKNOWN,
} sd_link;

typedef struct sd_topo {
    int n;
    char name[SD_GPU_MAX_RANKS][96];
    char bus_id[SD_GPU_MAX_RANKS][32]; /* "0000:18:00.0" */
    sd_link link[SD_GPU_MAX_RANKS][SD_GPU_MAX_RANKS];
    int nvlinks[SD_GPU_MAX_RANKS][SD_GPU_MAX_RANKS]; /* lanes for SD_LINK_NVLINK */
    int p2p[SD_GPU_MAX_RANKS][SD_GPU_MAX_RANKS];     /* 1: CUDA P2P access i -> j; -1 unknown */
    int numa[SD_GPU_MAX_RANKS];                      /* NUMA node, -1 unknown */
    char cpus[SD_GPU_MAX_RANKS][128];                /* CPU affinity list, "" unknown */
} sd_topo;

/* Probes the GPUs (in CUDA ordinal order when built with CUDA): NVML
 * (libnvidia-ml.so.1, opened at run time, so the binary does not need it)
 * for links, CUDA for P2P, sysfs for NUMA and CPU affinity. */
int sd_topo_probe(sd_topo *t, sd_err *err);
/* The matrix like `nvidia-smi topo -m`, then the P2P matrix. */
void sd_topo_format(const sd_topo *t, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif

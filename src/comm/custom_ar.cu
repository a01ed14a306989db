/* comm/custom_ar: all-reduce for small messages over CUDA P2P (one process,
 * one GPU per rank thread), for the sizes where NCCL's latency dominates.
 *
 * Each rank owns, in its GPU's memory, a data buffer and a signal area; every
 * rank's kernel gets all ranks' pointers (fixed at start: graph-capture safe).
 * A call:
 *   one-shot: copy the input into the own buffer | barrier | sum every rank's
 *             buffer in rank order 0..P-1 into the output | barrier
 *   two-shot: copy | barrier | rank r sums its 1/P slice into its own buffer
 *             | barrier | every rank gathers the P slices | barrier
 *   fused:    one-shot per row, then x += sum, xn = RMSNorm(x) * w
 * The summation order is the same on every rank, so all ranks hold the same
 * bits. The closing barrier keeps a fast rank from overwriting its buffer
 * while a slow one still reads it.
 *
 * Barriers are per block: block b of every rank touches the same elements in
 * every phase (the same grid-stride index set), so block b only waits for
 * block b of the peers. Each block counts its calls in its own signal area;
 * the count is the flag value it stores into the peers' slots (release,
 * system scope) and waits for in its own slots (acquire, system scope), so
 * flags never need resetting. The grid is at most CAR_MAX_BLOCKS blocks so
 * every block of every rank is resident together. Messages are float4
 * vectors (n a multiple of 4, 16-byte aligned). No NVLink multicast.
 *
 * Ranks may share a GPU (devices[] repeats an ordinal): their buffers then
 * sit in that GPU's memory and need no P2P. Nothing is faster that way; it is
 * how the kernels' arithmetic, barriers and flags are checked on one GPU.
 * Such ranks spin on each other inside one device, so every block of all of
 * them must be resident at once: sd_car_create checks the occupancy and
 * refuses otherwise (a deadlock, not a slow run, would follow). Their streams
 * must also reach the GPU through distinct hardware queues, or one rank's
 * spinning kernel blocks a peer's queued behind it: the process sets
 * CUDA_DEVICE_MAX_CONNECTIONS (default 8) to 32 before its first CUDA call. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "comm/gpu_comm.h"
#include "core/log.h"
}

#define CAR_MAX_BLOCKS 36
#define CAR_THREADS 512

/* In each rank's GPU memory; peers write the slots, the owner the counters. */
struct car_signal {
    uint32_t start[CAR_MAX_BLOCKS][SD_GPU_MAX_RANKS];
    uint32_t mid[CAR_MAX_BLOCKS][SD_GPU_MAX_RANKS];
    uint32_t end[CAR_MAX_BLOCKS][SD_GPU_MAX_RANKS];
    uint32_t count[CAR_MAX_BLOCKS];
};

/* Kernel argument (by value: captured with the graph). */
struct car_peers {
    float4 *buf[SD_GPU_MAX_RANKS];
    car_signal *sig[SD_GPU_MAX_RANKS];
};

struct sd_car {
    int n;
    int devices[SD_GPU_MAX_RANKS];
    cudaStream_t streams[SD_GPU_MAX_RANKS];
    car_peers peers;
    size_t max_bytes;
};

/* ---- device ------------------------------------------------------------ */

static __device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v)
{
    asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p) : "memory");
}

static __device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

enum { BAR_START = 0, BAR_MID = 1, BAR_END = 2 };

/* A barrier that waits this long for a peer gives up: the peer's rank
 * failed (or never launched this call), and spinning on would hang the
 * engine thread in its next sync forever. __trap() turns it into a sticky
 * device error instead, which the engine counts as failed steps (/health
 * 503, the watchdog no longer fed: the service manager restarts it). */
#define CAR_TIMEOUT_NS (30ull * 1000 * 1000 * 1000)

static __device__ __forceinline__ uint64_t globaltimer_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ uint32_t *bar_slot(car_signal *s, int which, int b, int k)
{
    return which == BAR_START ? &s->start[b][k] : which == BAR_MID ? &s->mid[b][k] : &s->end[b][k];
}

/* This block's call number (1, 2, ...): the flag of this call's barriers. */
static __device__ __forceinline__ uint32_t next_flag(const car_peers &p, int rank)
{
    __shared__ uint32_t flag;
    if (threadIdx.x == 0) {
        uint32_t f = p.sig[rank]->count[blockIdx.x] + 1;
        p.sig[rank]->count[blockIdx.x] = f;
        flag = f;
    }
    __syncthreads();
    return flag;
}

/* Block b of this rank meets block b of every peer. Thread k signals peer k
 * and waits for peer k's signal; the fence makes the block's earlier writes
 * (seen by thread k through __syncthreads) visible to the peers first. */
static __device__ void block_barrier(const car_peers &p, int rank, int P, uint32_t flag, int which)
{
    __syncthreads();
    if (threadIdx.x < P) {
        int k = threadIdx.x;
        __threadfence_system();
        st_release_sys(bar_slot(p.sig[k], which, blockIdx.x, rank), flag);
        const uint32_t *mine = bar_slot(p.sig[rank], which, blockIdx.x, k);
        uint64_t t0 = globaltimer_ns();
        for (uint32_t spins = 1; ld_acquire_sys(mine) != flag; spins++)
            if (!(spins & 1023) && globaltimer_ns() - t0 > CAR_TIMEOUT_NS)
                __trap(); /* a peer that never came: a device error, not a hang */
    }
    __syncthreads();
}

static __device__ __forceinline__ float4 add4(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* Rank-order sum of element i over the P buffers. */
static __device__ __forceinline__ float4 sum_ranks(const car_peers &p, int P, size_t i)
{
    float4 s = p.buf[0][i];
    for (int k = 1; k < P; k++)
        s = add4(s, p.buf[k][i]);
    return s;
}

/* io (n4 float4) */
__global__ void __launch_bounds__(CAR_THREADS)
    oneshot_kernel(car_peers p, int rank, int P, float4 *io, size_t n4)
{
    uint32_t flag = next_flag(p, rank);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float4 *mine = p.buf[rank];
    for (size_t i = i0; i < n4; i += stride)
        mine[i] = io[i];
    block_barrier(p, rank, P, flag, BAR_START);
    for (size_t i = i0; i < n4; i += stride)
        io[i] = sum_ranks(p, P, i);
    block_barrier(p, rank, P, flag, BAR_END);
}

__global__ void __launch_bounds__(CAR_THREADS)
    twoshot_kernel(car_peers p, int rank, int P, float4 *io, size_t n4)
{
    uint32_t flag = next_flag(p, rank);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float4 *mine = p.buf[rank];
    for (size_t i = i0; i < n4; i += stride)
        mine[i] = io[i];
    block_barrier(p, rank, P, flag, BAR_START);
    /* reduce-scatter: this rank's slice [lo, hi), in place in its buffer
     * (no other rank reads this slice before the next barrier) */
    size_t lo = n4 * (size_t)rank / (size_t)P, hi = n4 * (size_t)(rank + 1) / (size_t)P;
    for (size_t i = i0; i < n4; i += stride)
        if (i >= lo && i < hi)
            mine[i] = sum_ranks(p, P, i);
    block_barrier(p, rank, P, flag, BAR_MID);
    /* all-gather: element i from the rank owning its slice */
    for (size_t i = i0; i < n4; i += stride) {
        int k = (int)((i * (size_t)P + (size_t)P - 1) / n4);
        /* owner: the k with lo_k <= i < hi_k (the estimate is off by at most one) */
        while (k > 0 && i < n4 * (size_t)k / (size_t)P)
            k--;
        while (k < P - 1 && i >= n4 * (size_t)(k + 1) / (size_t)P)
            k++;
        io[i] = p.buf[k][i];
    }
    block_barrier(p, rank, P, flag, BAR_END);
}

static __device__ __forceinline__ float load_w(const void *w, int dt, int i)
{
    if (dt == SD_DT_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    if (dt == SD_DT_F16)
        return __half2float(((const __half *)w)[i]);
    return ((const float *)w)[i];
}

/* Block sum of v (all threads get it); sh holds one value per warp. */
static __device__ double block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0)
        sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    double s = 0;
    for (int j = 0; j < nw; j++) /* same order in every thread and on every rank */
        s += sh[j];
    return s;
}

static __device__ __forceinline__ float4 norm4(float4 v, float r, const void *w, int wdt, int j)
{
    return make_float4(load_w(w, wdt, j) * (v.x * r), load_w(w, wdt, j + 1) * (v.y * r),
                       load_w(w, wdt, j + 2) * (v.z * r), load_w(w, wdt, j + 3) * (v.w * r));
}

/* partial, x, xn (rows, d4 float4); rows split over blocks, whole rows per
 * block. x + (partial_0 + ... + partial_{P-1}) is the unfused path's bits
 * (all-reduce, then the backend's add); the norm is the backend's rmsnorm
 * formula (sum of squares in double, 1 / sqrtf, w * (x * r)), summed in
 * another order: equal to fp32 rounding. */
__global__ void __launch_bounds__(CAR_THREADS)
    fused_kernel(car_peers p, int rank, int P, const float4 *partial, float4 *x, float4 *xn,
                 const void *w, int wdt, int rows, int d4, float eps)
{
    __shared__ double sh[CAR_THREADS / 32];
    uint32_t flag = next_flag(p, rank);
    float4 *mine = p.buf[rank];
    for (int r = blockIdx.x; r < rows; r += gridDim.x)
        for (int c = threadIdx.x; c < d4; c += blockDim.x) {
            size_t i = (size_t)r * d4 + c;
            mine[i] = partial[i];
        }
    block_barrier(p, rank, P, flag, BAR_START);
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        double ss = 0;
        for (int c = threadIdx.x; c < d4; c += blockDim.x) {
            size_t i = (size_t)r * d4 + c;
            float4 v = add4(x[i], sum_ranks(p, P, i));
            x[i] = v;
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        float rstd = 1.0f / sqrtf((float)(block_sum(ss, sh) / (4 * d4)) + eps);
        for (int c = threadIdx.x; c < d4; c += blockDim.x) {
            size_t i = (size_t)r * d4 + c;
            xn[i] = norm4(x[i], rstd, w, wdt, 4 * c);
        }
    }
    block_barrier(p, rank, P, flag, BAR_END);
}

/* ---- host --------------------------------------------------------------- */

static int car_cuda(sd_err *err, cudaError_t e, const char *stmt, int dev, const char *file,
                    int line)
{
    if (e == cudaSuccess)
        return 0;
    if (err)
        return sd_err_set(err, SD_EDEVICE, "custom all-reduce: %s failed: %s (device %d, %s:%d)",
                          stmt, cudaGetErrorString(e), dev, file, line);
    sd_log_error("custom all-reduce: %s failed: %s (device %d, %s:%d)", stmt,
                 cudaGetErrorString(e), dev, file, line);
    return SD_EDEVICE;
}
#define CAR_CUDA(err, stmt, dev)                                                                \
    do {                                                                                        \
        int rc_ = car_cuda((err), (stmt), #stmt, (dev), __FILE__, __LINE__);                    \
        if (rc_)                                                                                \
            return rc_;                                                                         \
    } while (0)

extern "C" const char *sd_ar_algo_name(sd_ar_algo a)
{
    static const char *n[] = {"nccl", "oneshot", "twoshot"};
    return (unsigned)a < SD_AR_N_ALGOS ? n[a] : "?";
}

extern "C" int sd_ar_algo_parse(const char *s)
{
    if (!s || !strcmp(s, "auto"))
        return -1;
    for (int a = 0; a < SD_AR_N_ALGOS; a++)
        if (!strcmp(s, sd_ar_algo_name((sd_ar_algo)a)))
            return a;
    return -2;
}

/* Loads the kernels on the current device now (lazy module loading would
 * load one at its first launch, which may wait for kernels already spinning
 * in a collective) and checks that k ranks sharing it can all be resident. */
static int prepare_device(int dev, int k, sd_err *err)
{
    static const struct {
        const void *fn;
        const char *name;
    } kern[] = {{(const void *)oneshot_kernel, "oneshot_kernel"},
                {(const void *)twoshot_kernel, "twoshot_kernel"},
                {(const void *)fused_kernel, "fused_kernel"}};
    cudaDeviceProp prop;
    CAR_CUDA(err, cudaGetDeviceProperties(&prop, dev), dev);
    for (size_t f = 0; f < sizeof kern / sizeof kern[0]; f++) {
        cudaFuncAttributes a;
        CAR_CUDA(err, cudaFuncGetAttributes(&a, kern[f].fn), dev);
        int per_sm = 0;
        CAR_CUDA(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern[f].fn,
                                                                    CAR_THREADS, 0),
                 dev);
        long have = (long)per_sm * prop.multiProcessorCount, need = (long)k * CAR_MAX_BLOCKS;
        if (k > 1 && have < need)
            return sd_err_set(err, SD_ENOTSUP,
                              "custom all-reduce: %d ranks share GPU %d, whose %d SMs hold %ld "
                              "resident blocks of %s (%d registers a thread), not the %ld they "
                              "need",
                              k, dev, prop.multiProcessorCount, have, kern[f].name, a.numRegs,
                              need);
    }
    return 0;
}

static int setup(sd_car *c, sd_err *err)
{
    for (int i = 0; i < c->n; i++) {
        CAR_CUDA(err, cudaSetDevice(c->devices[i]), c->devices[i]);
        int first = 1, sharing = 0;
        for (int j = 0; j < c->n; j++)
            if (c->devices[j] == c->devices[i]) {
                sharing++;
                first &= j >= i;
            }
        if (first) {
            int rc = prepare_device(c->devices[i], sharing, err);
            if (rc)
                return rc;
        }
        for (int j = 0; j < c->n; j++) {
            if (c->devices[j] == c->devices[i])
                continue; /* the same GPU's memory: no P2P */
            int ok = 0;
            CAR_CUDA(err, cudaDeviceCanAccessPeer(&ok, c->devices[i], c->devices[j]), c->devices[i]);
            if (!ok)
                return sd_err_set(err, SD_ENOTSUP,
                                  "custom all-reduce: GPU %d cannot access GPU %d directly (no "
                                  "P2P); use --allreduce nccl",
                                  c->devices[i], c->devices[j]);
            cudaError_t e = cudaDeviceEnablePeerAccess(c->devices[j], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                cudaGetLastError();
            else
                CAR_CUDA(err, e, c->devices[i]);
        }
        void *b = NULL, *s = NULL;
        CAR_CUDA(err, cudaMalloc(&b, c->max_bytes), c->devices[i]);
        c->peers.buf[i] = (float4 *)b;
        CAR_CUDA(err, cudaMalloc(&s, sizeof(car_signal)), c->devices[i]);
        c->peers.sig[i] = (car_signal *)s;
        CAR_CUDA(err, cudaMemset(s, 0, sizeof(car_signal)), c->devices[i]);
        CAR_CUDA(err, cudaDeviceSynchronize(), c->devices[i]);
    }
    return 0;
}

extern "C" int sd_car_create(sd_car **out, int n, const int *devices, void *const *streams,
                             size_t max_bytes, sd_err *err)
{
    *out = NULL;
    if (n < 2 || n > SD_GPU_MAX_RANKS || !devices || !streams || max_bytes < 16)
        return sd_err_set(err, SD_EINVAL, "custom all-reduce: %d ranks (2..%d), %zu bytes", n,
                          SD_GPU_MAX_RANKS, max_bytes);
    sd_car *c = (sd_car *)calloc(1, sizeof *c);
    if (!c)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    c->n = n;
    c->max_bytes = (max_bytes + 15) & ~(size_t)15;
    for (int i = 0; i < n; i++) {
        c->devices[i] = devices[i];
        c->streams[i] = (cudaStream_t)streams[i];
    }
    int prev = 0;
    cudaGetDevice(&prev);
    int rc = setup(c, err);
    cudaSetDevice(prev);
    if (rc) {
        sd_car_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

extern "C" void sd_car_destroy(sd_car *c)
{
    if (!c)
        return;
    int prev = 0;
    cudaGetDevice(&prev);
    for (int i = 0; i < c->n; i++) {
        cudaSetDevice(c->devices[i]);
        if (c->peers.buf[i])
            cudaFree(c->peers.buf[i]);
        if (c->peers.sig[i])
            cudaFree(c->peers.sig[i]);
    }
    cudaSetDevice(prev);
    free(c);
}

extern "C" size_t sd_car_buffer_bytes(const sd_car *c)
{
    return c->max_bytes + sizeof(car_signal);
}

extern "C" size_t sd_car_max_floats(const sd_car *c) { return c->max_bytes / sizeof(float); }

extern "C" int sd_car_fits(const sd_car *c, const float *buf, size_t n)
{
    return c && n > 0 && n % 4 == 0 && n <= sd_car_max_floats(c) && ((uintptr_t)buf & 15) == 0;
}

/* The same grid on every rank for the same n: blocks pair up by index. */
static unsigned grid_for(size_t units)
{
    size_t b = (units + CAR_THREADS - 1) / CAR_THREADS;
    return (unsigned)(b < 1 ? 1 : b > CAR_MAX_BLOCKS ? CAR_MAX_BLOCKS : b);
}

extern "C" int sd_car_allreduce(sd_car *c, int rank, float *buf, size_t n, sd_ar_algo algo)
{
    if (rank < 0 || rank >= c->n || !sd_car_fits(c, buf, n) ||
        (algo != SD_AR_ONESHOT && algo != SD_AR_TWOSHOT))
        return SD_EINVAL;
    size_t n4 = n / 4;
    unsigned g = grid_for(n4);
    if (algo == SD_AR_ONESHOT)
        oneshot_kernel<<<g, CAR_THREADS, 0, c->streams[rank]>>>(c->peers, rank, c->n,
                                                                 (float4 *)buf, n4);
    else
        twoshot_kernel<<<g, CAR_THREADS, 0, c->streams[rank]>>>(c->peers, rank, c->n,
                                                                 (float4 *)buf, n4);
    CAR_CUDA(NULL, cudaGetLastError(), c->devices[rank]);
    return 0;
}

extern "C" int sd_car_allreduce_add_rmsnorm(sd_car *c, int rank, const float *partial, float *x,
                                            float *xn, const void *w, sd_dtype wdt, int rows,
                                            int d, float eps)
{
    if (rank < 0 || rank >= c->n || rows < 1 || d < 1 || !partial || !x || !xn || !w)
        return SD_EINVAL;
    size_t n = (size_t)rows * (size_t)d;
    if (d % 4 || !sd_car_fits(c, partial, n) || ((uintptr_t)x & 15) || ((uintptr_t)xn & 15) ||
        (wdt != SD_DT_F32 && wdt != SD_DT_BF16 && wdt != SD_DT_F16))
        return SD_ENOTSUP;
    unsigned g = (unsigned)(rows < CAR_MAX_BLOCKS ? rows : CAR_MAX_BLOCKS);
    fused_kernel<<<g, CAR_THREADS, 0, c->streams[rank]>>>(c->peers, rank, c->n,
                                                          (const float4 *)partial, (float4 *)x,
                                                          (float4 *)xn, w, (int)wdt, rows, d / 4,
                                                          eps);
    CAR_CUDA(NULL, cudaGetLastError(), c->devices[rank]);
    return 0;
}

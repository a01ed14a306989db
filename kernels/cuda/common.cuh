/* kernels/cuda: internal header shared by the op families (one .cu per
 * family, mirroring kernels/cpu): the per-device context, the checking
 * macros, weight loads and reductions. */
#ifndef SD_KERNELS_CUDA_COMMON_CUH
#define SD_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "core/err.h"
#include "core/log.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"
}

/* ---- context ---------------------------------------------------------- */

/* One cached cuBLASLt plan: descriptors and the algorithm of one shape. */
/* What a GEMM's algorithm depends on besides its row count: a plan's key
 * with n and ldb, and a kept choice's with n. */
typedef struct sd__gemm_shape {
    int dt;                    /* sd_dtype of A and B */
    int64_t N, K;              /* weight rows, cols */
    uint32_t al_a, al_b, al_d; /* pointer alignments (bytes, <= 256) */
} sd__gemm_shape;

typedef struct sd__gemm_plan {
    int used;
    sd__gemm_shape s;
    int n, ldb;           /* activation rows, leading dimension */
    int ok;               /* 0: no algorithm; the tiled kernel runs instead */
    int timed;            /* its algorithm is its own timed trial's choice (not shared) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} sd__gemm_plan;

#define SD__GEMM_PLANS 512

/* A timed trial's choice, kept when its plan is replaced: the plan cache
 * holds cuBLASLt's descriptors for the row counts met last, and a server's
 * prompt steps meet hundreds of row counts, so the graph buckets' timed
 * plans, made at start, were replaced within seconds, and the row counts
 * that shared them (or had their own) ran their trials again: 315-333
 * trials in 3 s of serving on an H200, 15 ms a step with 6 (NOTES.md,
 * session 32). Replaced oldest first when full. */
typedef struct sd__gemm_choice {
    sd__gemm_shape s;
    int n;
    cublasLtMatmulAlgo_t algo;
} sd__gemm_choice;

#define SD__GEMM_CHOICES 4096

typedef struct sd__cuda {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch; /* bf16 activations, aliasing copies */
    size_t scratch_bytes;
    float *attn_part; /* split-KV attention partials (attention.cu) */
    size_t attn_part_bytes;
    size_t attn_dyn_max; /* attn_kernel's dynamic shared memory at most */
    int bf16_split; /* BF16 GEMMs on hi + lo activation terms (sd_cuda_set_bf16_split) */
    int mla_tc;     /* MLA attention on tensor cores (SPECD_MLA_TC, sd_cuda_set_mla_tc) */
    /* benchmark overrides of built-in crossovers, 0 = the default:
     * matmul's GEMV up to this many rows (SD_CUDA_GEMV_MAX_ROWS), moe_ffn's
     * fused small-batch path up to this many (token, expert) pairs
     * (SD_CUDA_MOE_FUSED_MAX_PAIRS) */
    int gemv_max_rows, moe_fused_max_pairs;
    /* keys a split chunk of the MLA kernels holds at least, rounded up to
     * their tiles (SPECD_MLA_MIN_CHUNK; 0: one tile, 32 keys on
     * mla_dec_kernel, 64 on mla_tc_kernel). Other chunks, other bits; a
     * token's bits still do not depend on the step's other tokens. */
    int mla_min_chunk;
    /* mla_dec_kernel keeps the next tile's keys in flight and splits a
     * token's positions into one wave's chunks (SPECD_MLA_PIPE=0: one tile
     * at a time, two blocks an SM's chunks) */
    int mla_pipe;
    /* blocks an SM of mla_dec_kernel (attention.cu: its split is one wave) */
    int mla_dec_bps;
    /* moe_ffn's sorted rows on tensor cores (SD_CUDA_TC_OFF/ON/AUTO:
     * SPECD_MOE_TC, sd_cuda_set_moe_tc) */
    int moe_tc;
    /* kernels launched as programmatic dependents (sd__launch; SPECD_PDL=1
     * or sd_cuda_set_pdl turns it on) */
    int pdl;
    /* A/B switches of the decode kernels, read as the backend opens (all on
     * by default): the GEMV's prefetch before the PDL wait (SPECD_GEMV_PRE=0
     * off), the fused gate/up SiLU GEMV
     * (SPECD_MATMUL_SILU=0: matmul then silu_mul), the MoE gate/up kernel's
     * 4 columns a row group where a warp has one chunk (moe_gate_wide 1;
     * SPECD_MOE_GATE=2: 2 columns, 0; =4b4: 4 columns in 64 registers, 4
     * blocks an SM, 2). The same bits either way. */
    int gemv_pre, matmul_silu, moe_gate_wide;
    /* the fused MoE down kernel's shape (SPECD_MOE_DOWN, sd_cuda_set_moe_down;
     * moe.cu): 0 4 rows a block, 2 chunks a load, 3 blocks an SM; 1 the
     * same in 64 registers (4 blocks an SM); 2 8 rows a block, 1 chunk a
     * load, 2 blocks an SM; 3 8 rows, 2 chunks a load, 2 blocks an SM. The
     * same bits. */
    int moe_down;
    /* the GEMV of 1-2 rows of short 16-bit rows with 8 weight rows a warp
     * (SPECD_GEMV_WIDE=0: the 4-row shape). The same bits. */
    int gemv_wide;
    /* FP8 GEMVs of one row take twice the rows a warp (SPECD_F8_WIDE; matmul.cu) */
    int f8_wide;
    /* matmul's GEMV of n >= gemv_few rows (2-4, 16-bit weights) on the
     * persistent few-row kernel (SPECD_GEMV_FEW=N; 0: never; matmul.cu),
     * rows of more than 2 chunks a warp too when gemv_few_long. The same
     * bits. */
    int gemv_few;
    int gemv_few_long; /* SPECD_GEMV_FEW_LONG */
    /* GQA decode of 128-dim heads on attn_dec_kernel (SPECD_ATTN_DEC=0:
     * attn_kernel; other bits, the same to the CPU's tolerance) */
    int attn_dec;
    /* MLA decode steps (<= 8 tokens) on mla_dec_kernel, fp32 (on by
     * default; SPECD_MLA_DEC=0, sd_cuda_set_mla_dec: the tensor-core
     * kernel. Its first design was no faster, bench/results/mla-dec.json;
     * the second, 2 heads a block, took V2-Lite's attention from 13.4 to
     * 4.0 us a layer: NOTES.md, session 11) */
    int mla_dec;
    /* moe_route for E <= 64 without group limits on moe_route_small_kernel
     * (SPECD_ROUTE_SMALL=0: moe_route_kernel; the same bits) */
    int route_small;
    /* moe_router_ffn routes beside the always-on experts' gate/up in steps
     * of up to this many tokens (SPECD_MOE_OVERLAP, sd_cuda_set_moe_overlap;
     * 0: never; the same bits) */
    int moe_overlap;
    /* mla_prep_absorb runs mla_prep beside the query's absorb in one launch
     * (SPECD_MLA_OVERLAP=1, sd_cuda_set_mla_overlap; matmul.cu; the same
     * bits) */
    int mla_overlap;
    /* moe_router_ffn's router GEMV in the launch of the routing beside the
     * always-on experts (SPECD_MOE_ROUTER, sd_cuda_set_moe_router; moe.cu;
     * the same bits), its count of router blocks done (zero between calls) */
    int moe_router;
    unsigned *moe_router_cnt;
    /* mla_dec_kernel's last block of a token's head pair merges the pair's
     * split-KV partials (SPECD_MLA_FOLD=0: off; sd_cuda_set_mla_fold; attention.cu;
     * the same bits as attn_merge_kernel); its counts, zero between calls:
     * SD__MLA_FOLD_WORDS (token, head pair) words */
    int mla_fold;
    /* the decode attention reads the step's inputs (positions, sequences,
     * block tables) before its wait (SPECD_STEP_EARLY; SD_PDL_PRE below):
     * 0 never, 1 in the launches captured into graphs, 2 in every launch,
     * stage_kernel then launching its dependents only at its end; and
     * whether the stream is being captured now */
    int step_inputs_early;
    int capturing;
    /* mla_dec's fold counts its chunks with one release-acquire atomic
     * instead of fences in every thread (SPECD_MLA_FOLD_REL) */
    int mla_fold_rel;
    unsigned *mla_fold_cnt;
    /* download_async into page-locked memory by a kernel, not the copy
     * engine (SPECD_KERNEL_DOWN; backend.cu) */
    int kernel_down;
    /* copies (a step's inputs) as one kernel (SPECD_KERNEL_UP; backend.cu) */
    int kernel_up;
    /* steps of more than 8 tokens split into chunks (attention.cu,
     * split_for_step; SPECD_ATTN_SPLIT_ALL): 0 none, 1 the general and
     * DeepSeek latent kernels (the default), 2 the 128-dim GQA kernel too */
    int attn_split_all;
    /* host_alloc gives page-locked memory (SPECD_PINNED=0: NULL, malloc) */
    int pinned;
    /* Timing ablation, for benchmarks only (SPECD_ABLATE=name,name...):
     * the named kernels are not launched (moe_route: a kernel that only
     * writes a fixed routing, so the experts still read top-k distinct
     * experts), so a decode step shows what each costs inside the graph.
     * The model's outputs are then wrong. 0: off (always, outside
     * benchmarks). */
    unsigned ablate;
    /* the split argmax's per-row keys and block counts (sample.cu), zero
     * between calls: SD__ARGMAX_ROWS rows */
    unsigned long long *am_keys;
    unsigned *am_cnt;
    /* the kernel trace's stamps and where they go at close (SD_KTRACE), and
     * the launches seen (shape and kernel name: FILE.N.names) */
    unsigned long long *kt_buf;
    char *kt_path;
    struct sd__kt_launch *kt_launch;
    int n_kt_launch;
    int sm_count;
    size_t smem_optin; /* largest dynamic shared memory per block */
    /* sticky first error */
    int err;
    char msg[768];
    /* cuBLASLt plans, replaced round-robin when full */
    sd__gemm_plan plans[SD__GEMM_PLANS];
    int n_plans, next_evict;
    sd__gemm_choice choices[SD__GEMM_CHOICES];
    int n_choices, next_choice;
    long gemm_trials; /* timed trials run (sd_cuda_gemm_trials) */
    /* weights uploaded by weight(), freed at destroy if still held */
    void **weights;
    int n_weights, cap_weights;
    /* FP8 weights dequantized to BF16 for the calls the FP8 GEMV does not
     * take (matmul.cu): as large as the largest FP8 weight placed, made at
     * load (weight_fp8), never inside a step */
    void *fp8_scratch;
    size_t fp8_scratch_bytes;
    /* download_async's two marks (created on first use) */
    cudaEvent_t marks[2];
    /* the device's views of the pointers copies and download_async saw
     * last (backend.cu, dev_view: the engine's few fixed buffers, each step;
     * a driver lookup each otherwise); emptied when memory is freed */
    struct {
        const void *p;
        void *view; /* the device's pointer */
        int host;   /* p is page-locked host memory */
    } views[16];
    int n_views, next_view;
} sd__cuda;

#define SD__ARGMAX_ROWS 4096
#define SD__MLA_FOLD_WORDS 1024 /* (token, head pair) counts of mla_dec_kernel's fold */

/* SPECD_ABLATE's names, in bit order (backend.cu parses them) */
#define SD__ABLATE_NAMES \
    {"addnorm", "norm", "route", "router", "merge", "prep", "attn", "absorb", "fold", "slots", "keys"}
enum {
    SD__AB_ADDNORM = 1u << 0, /* add_rmsnorm */
    SD__AB_NORM = 1u << 1,    /* rmsnorm */
    SD__AB_ROUTE = 1u << 2,   /* moe_route (a fixed routing instead) */
    SD__AB_ROUTER = 1u << 3,  /* moe_router_route's matmul */
    SD__AB_MERGE = 1u << 4,   /* the split-KV merge */
    SD__AB_PREP = 1u << 5,    /* mla_prep */
    SD__AB_ATTN = 1u << 6,    /* attn_mla (its merge too) */
    SD__AB_ABSORB = 1u << 7,  /* matmul_heads */
    /* parts of mla_dec_kernel (attention.cu), not kernels: */
    SD__AB_FOLD = 1u << 8,  /* the fold's merge (blocks write their partials and leave) */
    SD__AB_SLOTS = 1u << 9, /* the block table's lookups (a position's slot: the position) */
    SD__AB_KEYS = 1u << 10, /* the cache rows' loads (zero keys) */
};

static inline sd__cuda *sd__cuda_of(sd_backend *be) { return (sd__cuda *)be->impl; }

/* Records the first failure: statement, file, line, device. Returns 0 or SD_EDEVICE. */
int sd__cuda_fail(sd__cuda *c, const char *what, const char *detail, const char *file, int line);
int sd__cuda_check(sd__cuda *c, cudaError_t e, const char *stmt, const char *file, int line);
int sd__cublas_check(sd__cuda *c, cublasStatus_t s, const char *stmt, const char *file, int line);

#define SD_CUDA(c, stmt) sd__cuda_check((c), (stmt), #stmt, __FILE__, __LINE__)
#define SD_CUBLAS(c, stmt) sd__cublas_check((c), (stmt), #stmt, __FILE__, __LINE__)
/* after every launch: a bad configuration shows here, not at sync */
#define SD_LAUNCHED(c, kernel) sd__cuda_check((c), cudaGetLastError(), kernel " launch", __FILE__, __LINE__)
/* an argument the kernels cannot take (recorded like a CUDA failure) */
#define SD_BADARG(c, ...) sd__cuda_badarg((c), __FILE__, __LINE__, __VA_ARGS__)
int sd__cuda_badarg(sd__cuda *c, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The context for an op, or NULL when an earlier failure stopped it. */
sd__cuda *sd__cuda_op(sd_backend *be);

/* ---- launches ---------------------------------------------------------
 *
 * Programmatic dependent launch (sm_90). Every kernel here starts with
 * SD_PDL_ENTER(its parameters): griddepcontrol.launch_dependents (the next
 * kernel on the stream may be scheduled as soon as every block of this one
 * has started), the parameters read (sd__ptouch below), and then
 * griddepcontrol.wait (until the grids before it have finished and
 * their memory is visible: before that a kernel reads and writes nothing
 * that a kernel of the step writes; the GEMV loads its first weights, which
 * no kernel writes, and the decode attention its cache slots, from the
 * step's inputs: SD_PDL_PRE below). sd__launch launches with programmatic stream serialization
 * allowed when c->pdl, so a chain of small kernels lets the next GEMV's
 * blocks become resident while they run and stream its weights meanwhile,
 * and a GEMV's blocks fill the SMs as the previous one's last wave drains.
 * Nothing is reordered: a kernel's wait returns only once its predecessor
 * has finished, which waited for its own, so each kernel still sees every
 * earlier kernel's writes, and none overwrites what an earlier one still
 * reads. Dependents launch only once all of a kernel's blocks are resident,
 * so waiting blocks never hold slots a running kernel needs. Inside stream
 * capture the launches become programmatic graph edges. A kernel whose
 * predecessor is not a kernel (a copy, a cuBLASLt or NCCL call) waits as
 * usual. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SD__PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define SD__PDL_WAIT1() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define SD__PDL_LAUNCH() ((void)0)
#define SD__PDL_WAIT1() ((void)0)
#endif

/* ---- a kernel's parameters before the wait -----------------------------
 *
 * A kernel's parameters sit in a constant bank that each SM caches in
 * lines of its own (32 bytes or more): the first use of a line is a round
 * trip to memory (a graph node's parameters are read once a step, so L2
 * has long dropped them). ptxas reads a parameter where it is first used,
 * which for most is after griddepcontrol.wait: a kernel of the decode
 * chain then waits for its predecessor, and only then for the line with
 * (say) its epsilon, its output pointer or the block dimensions, on the
 * critical path (the SASS shows such first reads hundreds of instructions
 * past the wait in the norm, the MLA kernels, the routing and the
 * experts' kernels; Nsight Compute counts their stalls as imc_miss).
 * sd__ptouch reads a word of every 32-byte stretch of the values given
 * (the kernel's parameters; a struct must be a __grid_constant__
 * parameter, else taking its address copies it to local memory) and of
 * the block and grid dimensions, and stores their xor to a shared word:
 * the store, ordered before the wait, keeps the reads there, while the
 * kernel before still runs. Nothing reads the word. V2-Lite's batch-1
 * step +1.8%, batch 32 +7%, the bundled model's plain decode +0.6-3.8%
 * (bench/results/NOTES.md, session 24). The experts' pointer tables
 * (moe_tabs, read at an index learned after the wait) are left out: read
 * by every block of the experts' kernels they cost V2-Lite 8.6%, and read
 * by the grid's first block an SM only they gained nothing more. */
template <class T> __device__ __forceinline__ uint32_t sd__pbits(const T &x)
{
    if constexpr (sizeof(T) <= 8) {
        uint64_t v = 0;
        memcpy(&v, &x, sizeof x);
        return (uint32_t)v ^ (uint32_t)(v >> 32);
    } else {
        static_assert(sizeof(T) % 4 == 0, "a parameter struct of whole words");
        const uint32_t *w = reinterpret_cast<const uint32_t *>(&x);
        uint32_t v = w[sizeof(T) / 4 - 1];
#pragma unroll
        for (size_t i = 0; i < sizeof(T) / 4; i += 8)
            v ^= w[i];
        return v;
    }
}
template <class... A> __device__ __forceinline__ void sd__ptouch(const A &...a)
{
    __shared__ uint32_t sd__psink;
    const uint32_t v = blockDim.x ^ gridDim.x ^ gridDim.y ^ (0u ^ ... ^ sd__pbits(a));
    asm volatile("st.shared.u32 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(&sd__psink)),
                 "r"(v)
                 : "memory");
}
#define SD__PDL_WAIT(...)               \
    do {                                \
        SD__PDL_LAUNCH();               \
        sd__ptouch(__VA_ARGS__);        \
        SD__PDL_WAIT1();                \
    } while (0)

/* ---- kernel trace (meson -Dktrace=true, a diagnostic build) -------------
 *
 * With SD_KTRACE, SD_PDL_ENTER also stamps, in thread 0 of block 0, the
 * global timer just after the wait returns, with the kernel's grid and
 * block shape, into a device buffer (SPECD_KTRACE=FILE at backend open;
 * written to FILE at close). Under programmatic launch the wait returns
 * when the kernel before has finished, so the difference between two
 * consecutive stamps is what a kernel adds to the step in the real
 * (graph, PDL) schedule: its exposed time, where a serialized profiler
 * reads a latency the overlap may hide (tools/ktrace.py reads the file).
 * Each .cu holding kernels ends with SD_KTRACE_EXPORT(name), the setter of
 * its copy of the buffer pointer (no device linking here). */
#define SD__KT_CAP (1u << 21) /* stamps at most */
#ifdef SD_KTRACE
static __device__ unsigned long long *sd__kt_buf; /* [0]: count, then 2 words a stamp */
/* a stamp's shape word: grid x (24 bits), y (16), z (8), block x (16) */
static __host__ __device__ __forceinline__ unsigned long long sd__kt_sig(dim3 g, dim3 b)
{
    return (unsigned long long)(g.x & 0xffffffu) | (unsigned long long)(g.y & 0xffffu) << 24 |
           (unsigned long long)(g.z & 0xffu) << 40 | (unsigned long long)(b.x & 0xffffu) << 48;
}
__device__ __forceinline__ void sd__kt_mark(void)
{
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) != 0)
        return;
    unsigned long long *b = sd__kt_buf;
    if (!b)
        return;
    unsigned long long i = atomicAdd(b, 1ull), t;
    if (i >= SD__KT_CAP)
        return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    b[1 + 2 * i] = t;
    b[2 + 2 * i] = sd__kt_sig(gridDim, blockDim);
}
#define SD_PDL_ENTER(...)         \
    do {                          \
        SD__PDL_WAIT(__VA_ARGS__); \
        sd__kt_mark();            \
    } while (0)
#define SD_PDL_POST()     \
    do {                  \
        SD__PDL_WAIT1();  \
        sd__kt_mark();    \
    } while (0)
#define SD_KTRACE_EXPORT(name)                                               \
    int sd__kt_set_##name(void *p)                                           \
    {                                                                        \
        return cudaMemcpyToSymbol(sd__kt_buf, &p, sizeof p) != cudaSuccess; \
    }
#else
#define SD_PDL_ENTER(...) SD__PDL_WAIT(__VA_ARGS__)
#define SD_PDL_POST() SD__PDL_WAIT1()
#define SD_KTRACE_EXPORT(name)
#endif

/* ---- step inputs before the wait (SD_PDL_STEP_INPUTS) --------------------
 *
 * SD_PDL_ENTER split in two: SD_PDL_PRE(parameters...) (the dependents'
 * launch and the parameters' reads) and SD_PDL_POST() (the wait), for a
 * kernel that reads a step's inputs in between: its positions, sequences
 * and block tables. No kernel of a step writes them: they come up before
 * its first kernel, by the copy engine or by stage_kernel. A kernel
 * launched as a dependent may be resident before the kernels two or more
 * before it have finished (each launches its dependents as it starts), so
 * the copy must be finished first another way: a graph's launch is
 * ordered behind all the work before it on the stream, and the engine's
 * copies are never inside its graphs, so the launches captured into a
 * graph read the inputs early (c->step_inputs_early 1, the default); with
 * 2, every launch does, and stage_kernel launches its dependents only as
 * it exits, after a fence (which cost the bundled model's speculative
 * steps ~1.5%: bench/results/NOTES.md, session 26). So the attention
 * kernel resolves its cache slots (the position, the sequence, the block
 * table: three dependent round trips) while the kernel before it runs,
 * and after the wait only the query's and the keys' loads remain
 * (attention.cu). */
/* whether a launch now reads the step's inputs before its wait */
static inline int sd__early_inputs(const sd__cuda *c)
{
    return c->step_inputs_early == 2 || (c->step_inputs_early == 1 && c->capturing);
}
#define SD_PDL_PRE(...)               \
    do {                              \
        SD__PDL_LAUNCH();             \
        sd__ptouch(__VA_ARGS__);      \
    } while (0)

template <class T> struct sd__nd { typedef T type; }; /* a non-deduced parameter type */

/* kernel<<<g, b, sm, c->stream>>>(args...), as a programmatic dependent
 * launch when c->pdl; check with SD_LAUNCHED as after <<<>>> */
/* SD_KTRACE: notes a launch's shape and kernel (backend.cu) */
void sd__kt_note(struct sd__cuda *c, const void *kernel, unsigned long long sig);

template <typename... KA>
static inline void sd__launch(sd__cuda *c, void (*kernel)(KA...), dim3 g, dim3 b, size_t sm,
                              typename sd__nd<KA>::type... args)
{
#ifdef SD_KTRACE
    if (c->kt_buf)
        sd__kt_note(c, (const void *)kernel, sd__kt_sig(g, b));
#endif
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = b;
    cfg.dynamicSmemBytes = sm;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl ? 1 : 0;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* ---- device helpers --------------------------------------------------- */

enum { SD__F32 = SD_DT_F32, SD__F16 = SD_DT_F16, SD__BF16 = SD_DT_BF16, SD__F8 = SD_DT_F8_E4M3 };

/* bytes of one weight element */
template <int DT> __host__ __device__ constexpr size_t sd__esz()
{
    return DT == SD__F32 ? 4 : DT == SD__F8 ? 1 : 2;
}

__device__ __forceinline__ float sd__bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float sd__f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* element i of a weight of dtype DT as float */
template <int DT> __device__ __forceinline__ float sd__w1(const void *w, size_t i)
{
    if (DT == SD__F32)
        return ((const float *)w)[i];
    if (DT == SD__BF16)
        return sd__bf16f(((const uint16_t *)w)[i]);
    return sd__f16f(((const uint16_t *)w)[i]);
}

/* runtime-dtype element load (norm weights, biases: off the hot loops) */
__device__ __forceinline__ float sd__wload(const void *w, int dt, size_t i)
{
    if (dt == SD__F32)
        return ((const float *)w)[i];
    if (dt == SD__BF16)
        return sd__bf16f(((const uint16_t *)w)[i]);
    return sd__f16f(((const uint16_t *)w)[i]);
}

/* 8 consecutive weights from a 16-byte aligned address (F32: 32 bytes) */
template <int DT> __device__ __forceinline__ void sd__w8(const void *w, size_t i, float f[8])
{
    if (DT == SD__F32) {
        const float4 *p = (const float4 *)((const float *)w + i);
        float4 a = __ldg(p), b = __ldg(p + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    } else {
        uint4 u = __ldg((const uint4 *)((const uint16_t *)w + i));
        uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (DT == SD__BF16) {
                f[2 * k] = __uint_as_float(v[k] << 16);
                f[2 * k + 1] = __uint_as_float(v[k] & 0xffff0000u);
            } else {
                f[2 * k] = sd__f16f((uint16_t)(v[k] & 0xffffu));
                f[2 * k + 1] = sd__f16f((uint16_t)(v[k] >> 16));
            }
        }
    }
}

__device__ __forceinline__ float sd__warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float sd__warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* 1/rms of a row from each thread's partial sum of squares ss (double):
 * warp butterflies, then warp 0's butterfly over the warp partials (lanes
 * past the block's warps add 0, exactly). Every thread of the block gets
 * the value; a block of any size up to 1024 threads. The reduction of
 * rmsnorm and of every fused op that norms a row (the same bits for the
 * same partials). */
__device__ __forceinline__ float sd__block_rrms(double ss, int d, float eps)
{
    __shared__ double part[32];
    __shared__ float rs;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, s);
    if (lane == 0)
        part[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        double t = lane < nw ? part[lane] : 0.0;
#pragma unroll
        for (int s = 16; s > 0; s >>= 1)
            t += __shfl_xor_sync(0xffffffffu, t, s);
        if (lane == 0)
            rs = 1.0f / sqrtf((float)(t / d) + eps);
    }
    __syncthreads();
    return rs;
}

/* *p += v at device scope, with release and acquire semantics; the old
 * value. A fold's count (a block's last stores, a barrier, then this in one
 * thread: the block that counts last sees every block's stores; the
 * acquire invalidates the SM's L1, so its plain loads after the barrier
 * read them). Every block of a grid counting on one word serializes at
 * its L2 slice: folds of 256-512 blocks ran V2-Lite 2-3% slower than the
 * kernel they saved (bench/results/NOTES.md, session 58). */
__device__ __forceinline__ unsigned sd__atom_add_acq_rel(unsigned *p, unsigned v)
{
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(v)
                 : "memory");
    return old;
}

/* Rotary embedding of one pair: cos and sin of the fp32 angle inv_freq * pos
 * (HF's), times mscale, full-range cosf/sinf (angles run to thousands of
 * radians); then (x0, x1) rotated. Every op that ropes uses these. */
__device__ __forceinline__ void sd__rope_cs(float inv_freq, int pos, float mscale, float *cs,
                                            float *sn)
{
    float ang = __fmul_rn(inv_freq, (float)pos);
    *cs = cosf(ang) * mscale;
    *sn = sinf(ang) * mscale;
}

__device__ __forceinline__ void sd__rope_rot(float x0, float x1, float cs, float sn, float *y0,
                                             float *y1)
{
    *y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    *y1 = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
}

/* NR dot products of one weight row (K elements from w + wr) with NR
 * activation rows xr[r] (r < nr), partial sums per lane; the caller reduces
 * across the warp. VEC: K % 8 == 0, the row and every xr[r] 16-byte aligned. */
template <int DT, bool VEC>
__device__ __forceinline__ void sd__dot_rows(const void *w, size_t wr, int K, const float *const xr[8],
                                             int nr, int lane, float acc[8])
{
    if (VEC) {
        for (int k = lane * 8; k < K; k += 256) {
            float wf[8];
            sd__w8<DT>(w, wr + (size_t)k, wf);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                if (r < nr) {
                    float4 a = *(const float4 *)(xr[r] + k), b = *(const float4 *)(xr[r] + k + 4);
                    acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                              wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            float wv = sd__w1<DT>(w, wr + (size_t)k);
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (r < nr)
                    acc[r] += wv * xr[r][k];
        }
    }
}

static inline int sd__aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- small copies by a kernel (elementwise.cu) ------------------------- */

/* bytes a kernel copies at most (else the copy engine): a download (device
 * reads, posted host writes), and the copies op (host reads: 256 threads'
 * batches of 4 words a round trip over PCIe; between two graphs the kernel
 * added 7.4-14.3 us at 1-16 KB where the copy engine's three copies added
 * 17.3, and 21.9 against 17.9 at 32 KB: boundary-lab-c4c5acb.json) */
#define SD__STAGE_MAX (64u << 10)
#define SD__COPIES_MAX (16u << 10)
typedef struct sd__stage_set {
    sd_copy part[SD_COPIES_MAX]; /* 4-byte words; rows, pitches below 4 G */
    int n;
    int sys; /* a part writes page-locked host memory */
} sd__stage_set;
/* the parts in order, one launch; an error where a part is not in 4-byte words */
int sd__cuda_stage(sd__cuda *c, const sd__stage_set *s);

/* ---- op families ------------------------------------------------------ */

void sd__cuda_embed(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids, int n);
void sd__cuda_embed_shard(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids,
                          int n, int first);
void sd__cuda_add(sd_backend *be, float *y, const float *x, int n, int d);
void sd__cuda_silu_mul(sd_backend *be, float *out, const float *gu, int n, int I);
void sd__cuda_scatter_cols(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                           int ws, int wd);
void sd__cuda_gather_i32(sd_backend *be, int32_t *out, const int32_t *table, const int32_t *idx,
                         int n);
void sd__cuda_gather_rows(sd_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                          int d, int ds, int ss);
void sd__cuda_copy2d(sd_backend *be, float *dst, const float *src, int n, int d, int ds, int ss);
void sd__cuda_rmsnorm(sd_backend *be, float *out, const float *x, const sd_weight *w, int n, int d,
                      int x_stride, int out_stride, float eps);
void sd__cuda_add_rmsnorm(sd_backend *be, float *out, float *x, const float *y, const sd_weight *w,
                          int n, int d, float eps);
void sd__cuda_matmul(sd_backend *be, float *y, const float *x, const sd_weight *w,
                     const sd_weight *bias, int n, int x_stride);
void sd__cuda_moe_router_route(sd_backend *be, int32_t *ids, float *wts, float *logits,
                               const float *x, const sd_weight *w, const float *bias, int n,
                               int x_stride, const sd_moe_route *r);
void sd__cuda_moe_router_ffn(sd_backend *be, float *out, int32_t *ids, float *wts, float *logits,
                             const float *x, const sd_weight *w, const float *bias,
                             const sd_experts *ex, int n, int D, const sd_moe_route *r, void *tmp);
void sd__cuda_matmul_silu(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                          int x_stride);
void sd__cuda_matmul_heads(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                           int H, int x_stride, int x_head_stride, int x_off);
void sd__cuda_rope(sd_backend *be, float *x, const int32_t *pos, const sd_rope *r, int n, int H,
                   int row_stride, int head_stride, int off);
void sd__cuda_rope_kv(sd_backend *be, float *q, float *k, const float *v, void *kcache,
                      void *vcache, const sd_attn_batch *b, const sd_rope *r, int Hq, int Hkv,
                      int D, int Dv, int q_stride, int kv_stride);
void sd__cuda_mla_prep(sd_backend *be, float *ckv, int ck_stride, float *q_pe, int qpe_stride,
                       int qpe_head_stride, const sd_weight *w, float eps, void *cache,
                       const sd_attn_batch *b, const sd_rope *r, int H, int C, int R);
void sd__cuda_mla_prep_absorb(sd_backend *be, float *ckv, int ck_stride, float *q_pe,
                              int qpe_stride, int qpe_head_stride, const sd_weight *w, float eps,
                              void *cache, const sd_attn_batch *b, const sd_rope *r, int H, int C,
                              int R, float *y, const float *x, const sd_weight *wuk, int x_stride,
                              int x_head_stride);
void sd__cuda_attn_gqa(sd_backend *be, float *out, const float *q, const float *k, const float *v,
                       void *kcache, void *vcache, const sd_attn_batch *b, int Hq, int Hkv, int D,
                       int Dv, int q_stride, int kv_stride, float scale);
void sd__cuda_attn_mla(sd_backend *be, float *out, const float *q_lat, const float *q_pe,
                       const float *c, const float *k_pe, void *cache, const sd_attn_batch *b, int H,
                       int C, int R, int qpe_stride, int qpe_head_stride, int ck_stride,
                       float scale);
void sd__cuda_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                        const float *bias, int n, const sd_moe_route *r);
void sd__cuda_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                      const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp);
void sd__cuda_argmax_rows(sd_backend *be, int32_t *out, const float *x, int n, int V);
void sd__cuda_sample_rows(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                          const sd_sample_params *p, int n, int V);
void sd__cuda_accept_greedy_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                 const int32_t *draft, const int32_t *target_argmax, int n_seq,
                                 int k);
void sd__cuda_accept_sample_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                 float *probs_scratch, const float *logits, const int32_t *row0,
                                 const float *q, const int32_t *draft, const int32_t *n_draft,
                                 const sd_sample_params *p, int n_seq, int k, int V);

/* start-up hooks of families that raise kernel attributes (0 or SD_EDEVICE) */
int sd__cuda_attention_init(sd__cuda *c);
/* releases the cuBLASLt plans */
void sd__cuda_matmul_release(sd__cuda *c);

#endif

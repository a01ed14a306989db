/* kernels/cuda: the CUDA backend of the ops contract (kernels/ops.h).
 *
 * One context per device: a non-blocking stream, a cuBLASLt handle with its
 * workspace and per-shape plan cache, and preallocated scratch. Every op only
 * enqueues kernels on that stream: no allocation, no host synchronization,
 * so a forward pass can be captured into a CUDA graph. The first failed CUDA
 * or cuBLAS call is kept (statement, file, line, device) and returned by
 * sync(); once failed, ops enqueue nothing more.
 *
 * Upload sources may be reused as soon as upload returns when they are
 * ordinary (pageable) host memory. Download waits for the stream.
 * A context is used by one host thread at a time.
 *
 * C linkage: src/engine/backend.c calls this under #ifdef SD_HAVE_CUDA. */
#ifndef SD_KERNELS_CUDA_H
#define SD_KERNELS_CUDA_H

#include "core/err.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows up to which matmul runs the GEMV kernel on fp32 activations; above it
 * BF16 weights go through cuBLASLt on bf16 activations (fp32 accumulate,
 * fp32 output), F32 weights through cuBLASLt in fp32, F16 weights through a
 * tiled fp32 kernel. */
#define SD_CUDA_GEMV_MAX_ROWS 16

/* Up to this many rows the GEMV computes every row with the same fp32
 * multiply-adds in the same order whatever the batch (n = 1 gives the same
 * bits as that row inside a batch of 8: plain decode and verification
 * agree). Above it BF16 weights go to tensor cores (exact products of the
 * activations split into three bf16 terms, fp32 sums in another order), the
 * same for every row of batches SD_CUDA_GEMV_EXACT_ROWS + 1 .. MAX_ROWS. */
#define SD_CUDA_GEMV_EXACT_ROWS 8

/* matmul's GEMV of 2-4 rows (16-bit weights) runs the persistent few-row
 * kernel from this many rows on (matmul.cu; SPECD_GEMV_FEW; 0: never),
 * and rows of more than 2 chunks a warp (K > 4096 at 8 warps) too
 * (SPECD_GEMV_FEW_LONG=0: not those). The same bits as the other GEMV
 * shapes. */
#define SD_CUDA_GEMV_FEW_DEFAULT 2
#define SD_CUDA_GEMV_FEW_LONG_DEFAULT 1
void sd_cuda_set_gemv_few(sd_backend *be, int min_rows, int long_rows);

/* cuBLASLt's timed trials of candidate algorithms run so far: one per GEMM
 * shape and row count up to SD_CUDA_GEMM_EXACT_ROWS rows (those the GEMV
 * does not take: none; it was 64, and a server's mixed steps of 17-64 rows,
 * their logits' rows a request each, ran a trial for each new count: NOTES.md,
 * session 32); above, a row
 * count takes the choice of a timed one of its shape with more rows, at
 * most twice its own, or one in its power-of-two bucket above
 * SD_CUDA_GEMM_POW2_ROWS, where cuBLASLt accepts it (matmul.cu) */
#define SD_CUDA_GEMM_EXACT_ROWS SD_CUDA_GEMV_MAX_ROWS
#define SD_CUDA_GEMM_POW2_ROWS 256
long sd_cuda_gemm_trials(sd_backend *be);

/* (token, expert) pairs (n * top_k) up to which moe_ffn runs the fused
 * small-batch path (no sort: gate/up per pair, down + combine per token);
 * above it, or when a dimension is not a multiple of 8, the sorted grouped
 * path. Measured on an H200 with 64 experts of 1408 x 2048, top-6: fused
 * 1.5x faster at 96 pairs, 1.08x at 192 (bench/results/NOTES.md). */
#define SD_CUDA_MOE_FUSED_MAX_PAIRS 192

/* moe_ffn's sorted path on tensor cores (grouped GEMMs, mma.sync bf16).
 * SD_CUDA_TC_AUTO (the default): for real-size experts, D x I of at least
 * SD_CUDA_MOE_TC_MIN_WEIGHTS (DeepSeek-V2-Lite's 2048 x 1408: 7-16x faster
 * than the grouped GEMV from 256 tokens, bench/results/moe-prefill-tc.json);
 * SD_CUDA_TC_ON: every shape it can take; SD_CUDA_TC_OFF: the grouped GEMV.
 * SPECD_MOE_TC=0 or 1 as the backend opens picks off or on. It takes BF16
 * weights with D and I multiples of 8; other shapes keep the grouped GEMV.
 * The activations and the SiLU product are rounded to bf16 (fp32 sums):
 * outputs within ~3e-3 of max |out| of the fp32 path (kernels/cuda/moe.cu;
 * tested to 1e-2). Where it takes the sorted rows, steps of up to
 * SD_CUDA_MOE_TC_FUSED_MAX_PAIRS pairs keep the fused fp32 path (equal
 * times at 96 pairs of V2-Lite's experts, tensor cores 1.6x faster at 192:
 * bench/results/moe-prefill-tc.json). */
#define SD_CUDA_MOE_TC_MIN_WEIGHTS (1 << 20)
#define SD_CUDA_MOE_TC_FUSED_MAX_PAIRS 128
enum { SD_CUDA_TC_OFF = 0, SD_CUDA_TC_ON = 1, SD_CUDA_TC_AUTO = 2 };
void sd_cuda_set_moe_tc(sd_backend *be, int mode);

/* BF16 GEMM activations: on (the default), two bf16 terms hi = bf16(x) and
 * lo = bf16(x - hi) in two GEMMs, ~16 mantissa bits (logits within ~1e-5 of
 * fp32; twice the tensor-core work); off, one term, 8 bits (~1e-2). */
void sd_cuda_set_bf16_split(sd_backend *be, int on);

/* MLA attention (attn_mla) on tensor cores: on by default (SPECD_MLA_TC=0
 * as the backend opens, or this call with 0, keeps the SIMT fp32 kernel:
 * 1.7-41x slower on an H200, bench/results/mla-tc.json). The tensor-core
 * kernel takes the DeepSeek latent shape (C = 512, R = 64, a 16-byte
 * aligned cache); other shapes keep the SIMT kernel. Its products are bf16 (q, the cached rows and the softmax
 * weights rounded to bf16, fp32 sums): outputs within ~1e-2 of max |out| of
 * the fp32 kernel (kernels/cuda/attention.cu gives the bound), and a token
 * still gets the same bits in a decode step and in a verify step. */
void sd_cuda_set_mla_tc(sd_backend *be, int on);
/* MLA decode and verify steps (<= 8 tokens) on the fp32 lane-per-dims
 * kernel (default on: 12.8% faster V2-Lite decode at batch 1 than the
 * tensor-core kernel, bench/results/NOTES.md session 11; SPECD_MLA_DEC=0
 * off) */
void sd_cuda_set_mla_dec(sd_backend *be, int on);

/* The fused (decode-size) MoE down kernel's shape, 0..3 (moe.cu; the same
 * bits for every shape): SPECD_MOE_DOWN as the backend opens, or this call */
#define SD_CUDA_MOE_DOWN_DEFAULT 1
void sd_cuda_set_moe_down(sd_backend *be, int shape);

/* moe_route for up to 64 experts without group limits on its register
 * kernel (moe.cu; on by default, SPECD_ROUTE_SMALL=0 or this call: the
 * general kernel). The same bits either way. */
void sd_cuda_set_route_small(sd_backend *be, int on);
/* moe_router_ffn's routing beside the always-on experts' gate/up, in steps
 * of up to max_tokens tokens (SPECD_MOE_OVERLAP=N as the backend opens, or
 * this call; 0: never, moe_router_route then moe_ffn; the same bits). The
 * default 1: V2-Lite's batch-1 decode +0.4%, its 2-token MTP verify steps
 * -2.2% (bench/results/NOTES.md, session 16). */
#define SD_CUDA_MOE_OVERLAP_DEFAULT 1
void sd_cuda_set_moe_overlap(sd_backend *be, int max_tokens);
/* mla_prep_absorb's two ops in one launch, side by side (matmul.cu;
 * SPECD_MLA_OVERLAP=1 as the backend opens, or this call; steps of 1-2
 * tokens with 16-bit W_UK; the same bits). The default 1: V2-Lite's
 * batch-1 decode +1.45% in three rounds (bench/results/NOTES.md, session 18). */
#define SD_CUDA_MLA_OVERLAP_DEFAULT 1
void sd_cuda_set_mla_overlap(sd_backend *be, int on);
/* moe_router_ffn's router GEMV in the launch of its routing beside the
 * always-on experts, at one token where matmul takes its wide one-pass BF16
 * shape (moe.cu; SPECD_MOE_ROUTER as the backend opens, or this call; the
 * same bits). The default 1: V2-Lite's batch-1 decode +2.4% on an H100
 * (bench/results/ab-moe-router-folds-5f9dc96.json). */
#define SD_CUDA_MOE_ROUTER_DEFAULT 1
void sd_cuda_set_moe_router(sd_backend *be, int on);
/* MLA decode's split-KV merge in the decode kernel's last block of each
 * token's head pair (SPECD_MLA_FOLD, the default); 0: attn_merge_kernel
 * after it. The same bits either way; V2-Lite batch 1 +1.1% at 64-192
 * positions, equal at 4k (bench/results/ab-mla-fold-65858d6.json). */
#define SD_CUDA_MLA_FOLD_DEFAULT 1
/* download_async into page-locked host memory by a kernel's stores instead
 * of the copy engine (SPECD_KERNEL_DOWN), and the copies op (a step's block
 * tables, inputs and tokens) as one kernel (SPECD_KERNEL_UP; 0: SD_ENOTSUP,
 * the engine's copies one at a time). Between two queued-ahead steps the
 * copy engine's four took 15.8 us, the two kernels 5.0
 * (bench/results/boundary-lab-*): the bundled model's plain decode +6% at
 * batch 1 and 8, V2-Lite's +0.45%. */
#define SD_CUDA_KERNEL_DOWN_DEFAULT 1
#define SD_CUDA_KERNEL_UP_DEFAULT 1
void sd_cuda_set_kernel_copies(sd_backend *be, int down, int up);
void sd_cuda_set_mla_fold(sd_backend *be, int on);
/* The decode attention kernels (MLA and 128-dim GQA) resolve their cache
 * slots (the step's positions, sequences and block tables) before their
 * PDL wait (SPECD_STEP_EARLY; common.cuh, SD_PDL_PRE): 0 never; 1 in the
 * launches captured into graphs, whose launch is ordered behind the step's
 * input copies (the default); 2 in every launch, the step's input copy
 * launching its dependents only at its end. The same bits at every level.
 * Measured at 2: V2-Lite batch 1 +1.4% (565.5 against 557.8 tok/s, 3
 * rounds; the step replays a graph), the 8B level, the bundled model's
 * speculative steps ~1.5% slower (its input copies); 1 keeps the graphs'
 * kernels and drops the copies' cost (bench/results/NOTES.md, session 26). */
#define SD_CUDA_STEP_EARLY_DEFAULT 1
void sd_cuda_set_step_early(sd_backend *be, int level);
/* mla_dec's fold counts a head pair's chunks by one release-acquire atomic
 * a block, not fences in every thread (SPECD_MLA_FOLD_REL). The same bits;
 * V2-Lite batch 1 +0.3% (559.4 against 557.8, 3 rounds; session 26). */
#define SD_CUDA_MLA_FOLD_REL_DEFAULT 1
void sd_cuda_set_mla_fold_rel(sd_backend *be, int on);

/* Attention steps of more than 8 tokens (verify steps of 9+ rows, a
 * batch's decode) split each token's positions into chunks, as a decode
 * step's are (attention.cu, split_for_step). Level 0: none, each token's
 * positions whole (before 2c6448d); 1 (the default): the general kernel
 * (head dims other than the 128-dim GQA and the DeepSeek latent shapes, e.g.
 * the bundled model's), with a decode step's chunks where the partials
 * buffer holds them, and the DeepSeek latent kernel, as many chunks as the
 * buffer holds (V2-Lite at batch 32: +52% at 3968-token contexts); 2: the
 * 128-dim GQA kernel too (the 8B at batch 32: +10% at 3968 tokens, -2.1% at
 * 64), and as many chunks as the buffer holds on every kernel.
 * SPECD_ATTN_SPLIT_ALL=0/1/2 as the backend opens, or this call. Not the
 * same bits as whole. */
#define SD_CUDA_ATTN_SPLIT_ALL_DEFAULT 1
void sd_cuda_set_attn_split_all(sd_backend *be, int level);

/* Kernels as programmatic dependent launches (sm_90: the next kernel's
 * blocks wait on the GPU instead of being launched when this one ends;
 * kernels/cuda/common.cuh): on by default since every kernel asks for
 * its weights before it waits (on an H200, batch-1 decode 1.6% faster on
 * the Llama-3-8B-shaped model and 2.2% on the DeepSeek-V2-Lite-shaped one:
 * bench/results/ab-series-8000d37.json); SPECD_PDL=0 as the backend opens,
 * or this call, turns it off. Results are the same bits either way
 * (tests/gpu/test_model.c). */
#define SD_CUDA_PDL_DEFAULT 1
void sd_cuda_set_pdl(sd_backend *be, int on);

/* Number of CUDA devices usable here; 0 when there is no driver or device. */
int sd_cuda_device_count(void);

/* Opens the backend on GPU `device`; fills err with one line on failure. */
int sd_cuda_backend_create(sd_backend **out, int device, sd_err *err);
/* The backend's stream (a cudaStream_t), for communicators that enqueue on it. */
void *sd_cuda_stream(sd_backend *be);
/* Makes be's GPU the calling thread's current device (a rank thread's
 * collectives and allocations outside the backend's ops follow it). */
int sd_cuda_make_current(sd_backend *be);
void sd_cuda_backend_destroy(sd_backend *be);

/* The first recorded error of the context ("" if none). */
const char *sd_cuda_backend_error(const sd_backend *be);

/* Device name and compute capability, e.g. "NVIDIA H200 (sm_90, 132 SMs)". */
int sd_cuda_device_name(int device, char *buf, size_t len);

/* CUDA graphs over the context's stream. Ops enqueued between begin and end
 * are recorded, not run; launch replays them. */
typedef struct sd_cuda_graph sd_cuda_graph;
int sd_cuda_capture_begin(sd_backend *be);
int sd_cuda_capture_end(sd_backend *be, sd_cuda_graph **out);
int sd_cuda_graph_launch(sd_backend *be, sd_cuda_graph *g);
void sd_cuda_graph_destroy(sd_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif

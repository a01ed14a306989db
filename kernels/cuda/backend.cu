/* CUDA backend: the per-device context, memory, weights, errors, graphs and
 * the ops table. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

/* cuBLASLt workspace: what its Hopper kernels ask for at most. */
#define LT_WS_BYTES ((size_t)32 << 20)
/* Scratch for bf16 activations and aliasing copies; ops that need more work
 * in row chunks of this size, so it bounds memory, not shapes. */
#define SCRATCH_BYTES ((size_t)64 << 20)
#define ATTN_PART_BYTES ((size_t)32 << 20)

/* ---- errors ------------------------------------------------------------ */

int sd__cuda_fail(sd__cuda *c, const char *what, const char *detail, const char *file, int line)
{
    if (c->err)
        return SD_EDEVICE;
    c->err = SD_EDEVICE;
    snprintf(c->msg, sizeof c->msg, "%s: %s (%s:%d, device %d)", what, detail, file, line,
             c->device);
    sd_log_error("cuda: %s", c->msg);
    return SD_EDEVICE;
}

int sd__cuda_check(sd__cuda *c, cudaError_t e, const char *stmt, const char *file, int line)
{
    if (e == cudaSuccess)
        return 0;
    char d[256];
    snprintf(d, sizeof d, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return sd__cuda_fail(c, stmt, d, file, line);
}

int sd__cublas_check(sd__cuda *c, cublasStatus_t s, const char *stmt, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    char d[128];
    snprintf(d, sizeof d, "cublas status %d", (int)s);
    return sd__cuda_fail(c, stmt, d, file, line);
}

int sd__cuda_badarg(sd__cuda *c, const char *file, int line, const char *fmt, ...)
{
    char d[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    return sd__cuda_fail(c, "unsupported op arguments", d, file, line);
}

sd__cuda *sd__cuda_op(sd_backend *be)
{
    sd__cuda *c = sd__cuda_of(be);
    if (c->err)
        return NULL;
    /* the engine may call from a thread other than the one that opened us */
    if (SD_CUDA(c, cudaSetDevice(c->device)))
        return NULL;
    return c;
}

/* ---- memory ------------------------------------------------------------ */

static void views_forget(sd__cuda *c);

static void *cu_alloc(sd_backend *be, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    void *p = NULL;
    if (cudaSetDevice(c->device) != cudaSuccess)
        return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report */
        return NULL;
    }
    /* zeroed like the CPU's calloc, ordered before every later op */
    if (SD_CUDA(c, cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(sd_backend *be, void *p)
{
    sd__cuda *c = sd__cuda_of(be);
    if (p) {
        views_forget(c);
        cudaSetDevice(c->device);
        SD_CUDA(c, cudaFree(p));
    }
}

static int cu_upload(sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    if (!bytes)
        return 0;
    if (c->err)
        return c->err;
    return SD_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static int cu_download(sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    if (c->err)
        return c->err;
    if (bytes && SD_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)))
        return c->err;
    SD_CUDA(c, cudaStreamSynchronize(c->stream));
    return c->err;
}

static int cu_copy(sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    if (!bytes || c->err)
        return c->err;
    return SD_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

/* the device's pointer to p (device memory, or page-locked host memory:
 * then *host = 1); NULL where a kernel cannot reach it. The answers for
 * the last few pointers are kept (the driver's lookup is host time on a
 * speculative step's path, several a step for the same few buffers) until
 * memory is freed (views_forget). */
static void *dev_view(sd__cuda *c, const void *p, int *host)
{
    for (int i = 0; i < c->n_views; i++)
        if (c->views[i].p == p) {
            *host = c->views[i].host;
            return c->views[i].view;
        }
    *host = 0;
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* not sticky */
        return NULL;
    }
    *host = at.type == cudaMemoryTypeHost;
    void *v = *host || at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged
                  ? at.devicePointer
                  : NULL;
    if (v) { /* pageable memory is not kept: it may become page-locked */
        const int n = (int)(sizeof c->views / sizeof c->views[0]);
        const int i = c->n_views < n ? c->n_views++ : (c->next_view++ % n);
        c->views[i].p = p;
        c->views[i].view = v;
        c->views[i].host = *host;
    }
    return v;
}

/* memory was freed: a kept view may now be another allocation's */
static void views_forget(sd__cuda *c) { c->n_views = c->next_view = 0; }

/* a step's small copies as one kernel (SPECD_KERNEL_UP; the copy engine's
 * upload, 2-D upload and device copy between two graphs cost ~6.5 us a
 * step, bench/results/boundary-lab-*) */
static int cu_copies(sd_backend *be, const sd_copy *cp, int n)
{
    sd__cuda *c = sd__cuda_of(be);
    if (c->err)
        return c->err;
    if (!c->kernel_up || n < 1 || n > SD_COPIES_MAX)
        return SD_ENOTSUP;
    sd__stage_set s;
    memset(&s, 0, sizeof s);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const sd_copy *q = &cp[i];
        if (q->width % 4 || q->dpitch % 4 || q->spitch % 4 || q->dpitch > UINT32_MAX ||
            q->spitch > UINT32_MAX || q->rows > UINT32_MAX)
            return SD_ENOTSUP;
        total += q->width * q->rows;
        int dh = 0, sh;
        void *d = q->width && q->rows ? dev_view(c, q->dst, &dh) : q->dst;
        const void *sp = q->width && q->rows ? dev_view(c, q->src, &sh) : q->src;
        if (total > SD__COPIES_MAX || !d || !sp)
            return SD_ENOTSUP;
        s.sys |= dh; /* page-locked host memory: the host reads it after a mark */
        s.part[i] = *q;
        s.part[i].dst = d;
        s.part[i].src = sp;
    }
    s.n = n;
    return sd__cuda_stage(c, &s);
}

/* a download the host reads after download_wait(ev): the step queued after
 * it runs meanwhile (the engine's launch ahead). Into page-locked memory a
 * small one is a kernel's stores (SPECD_KERNEL_DOWN; the copy engine's
 * download between two graphs cost ~9 us, bench/results/boundary-lab-*). */
static int cu_download_async(sd_backend *be, void *dst, const void *src, size_t bytes, int ev)
{
    sd__cuda *c = sd__cuda_of(be);
    if (c->err)
        return c->err;
    if (ev < 0 || ev > 1)
        return SD_BADARG(c, "download_async: mark %d (0 or 1)", ev), c->err;
    if (!c->marks[ev] &&
        SD_CUDA(c, cudaEventCreateWithFlags(&c->marks[ev], cudaEventDisableTiming)))
        return c->err;
    void *dd = NULL;
    int host = 0;
    if (bytes && c->kernel_down && bytes <= SD__STAGE_MAX && bytes % 4 == 0 &&
        ((uintptr_t)dst | (uintptr_t)src) % 4 == 0 && (dd = dev_view(c, dst, &host)) && host) {
        sd__stage_set s;
        memset(&s, 0, sizeof s);
        s.part[0] = (sd_copy){dd, src, bytes, 1, bytes, bytes};
        s.n = 1;
        s.sys = 1;
        if (sd__cuda_stage(c, &s))
            return c->err;
    } else if (bytes &&
               SD_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream))) {
        return c->err;
    }
    return SD_CUDA(c, cudaEventRecord(c->marks[ev], c->stream));
}

static int cu_download_wait(sd_backend *be, int ev)
{
    sd__cuda *c = sd__cuda_of(be);
    if (c->err)
        return c->err;
    if (ev < 0 || ev > 1 || !c->marks[ev])
        return SD_BADARG(c, "download_wait: mark %d was not queued", ev), c->err;
    cudaSetDevice(c->device);
    SD_CUDA(c, cudaEventSynchronize(c->marks[ev]));
    return c->err;
}

static int cu_memset0(sd_backend *be, void *dst, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    if (!bytes)
        return 0;
    if (c->err)
        return c->err;
    return SD_CUDA(c, cudaMemsetAsync(dst, 0, bytes, c->stream));
}

static int track_weight(sd__cuda *c, void *p)
{
    if (c->n_weights == c->cap_weights) {
        int cap = c->cap_weights ? 2 * c->cap_weights : 256;
        void **w = (void **)realloc(c->weights, (size_t)cap * sizeof *w);
        if (!w)
            return -1;
        c->weights = w;
        c->cap_weights = cap;
    }
    c->weights[c->n_weights++] = p;
    return 0;
}

/* host bytes to a new device allocation, freed at destroy if still held:
 * NULL on failure */
static void *upload_tracked(sd_backend *be, const void *host, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    void *p = cu_alloc(be, bytes);
    if (!p)
        return NULL;
    if (SD_CUDA(c, cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, c->stream)) ||
        track_weight(c, p)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

/* p freed where upload_tracked made it */
static void untrack_free(sd_backend *be, const void *p)
{
    sd__cuda *c = sd__cuda_of(be);
    for (int i = 0; p && i < c->n_weights; i++)
        if (c->weights[i] == p) {
            c->weights[i] = c->weights[--c->n_weights];
            cu_free(be, (void *)p);
            break;
        }
}

/* Device copy of a host weight in its own dtype (bf16 stays bf16). */
static int cu_weight(sd_backend *be, sd_weight *out, const void *host, sd_dtype dt, int64_t rows,
                     int64_t cols)
{
    if (dt != SD_DT_F32 && dt != SD_DT_F16 && dt != SD_DT_BF16)
        return -1;
    void *p = upload_tracked(be, host, (size_t)rows * (size_t)cols * sd_dtype_size(dt));
    if (!p)
        return -1;
    *out = (sd_weight){p, dt, rows, cols, NULL, {0, 0}, 0, NULL};
    return 0;
}

/* A block-scaled FP8 weight kept as FP8 (ops.h, weight_fp8): its E4M3
 * bytes and F32 scales copied as they are. The GEMV reads them (matmul.cu);
 * other calls dequantize into the context's scratch, grown here to the
 * largest FP8 weight's BF16 size. Column blocks: a power of two >= 8 (a
 * GEMV lane's 8 weights in one block). */
static int cu_weight_fp8(sd_backend *be, sd_weight *out, const uint8_t *q, const float *scale,
                         int64_t rows, int64_t cols, int bm, int bn)
{
    sd__cuda *c = sd__cuda_of(be);
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX || bm <= 0 || bn < 8 ||
        (bn & (bn - 1)))
        return -1;
    const int64_t sr = (rows + bm - 1) / bm, sc = (cols + bn - 1) / bn;
    const size_t need = (size_t)rows * (size_t)cols * 2;
    if (need > c->fp8_scratch_bytes) {
        void *s = cu_alloc(be, need);
        if (!s)
            return -1;
        if (c->fp8_scratch) {
            cudaStreamSynchronize(c->stream); /* no queued reader left */
            cudaFree(c->fp8_scratch);
        }
        c->fp8_scratch = s;
        c->fp8_scratch_bytes = need;
    }
    void *d = upload_tracked(be, q, (size_t)rows * (size_t)cols);
    if (!d)
        return -1;
    void *s = upload_tracked(be, scale, (size_t)(sr * sc) * sizeof(float));
    if (!s) {
        untrack_free(be, d);
        return -1;
    }
    *out = (sd_weight){d, SD_DT_F8_E4M3, rows, cols, (const float *)s, {bm, bn}, sc, NULL};
    return 0;
}

static void cu_weight_free(sd_backend *be, sd_weight *w)
{
    untrack_free(be, w->data);
    untrack_free(be, w->scale);
    w->data = NULL;
    w->scale = NULL;
}

static int cu_mem_info(sd_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    *free_bytes = *total_bytes = 0;
    if (SD_CUDA(c, cudaSetDevice(c->device)) || SD_CUDA(c, cudaMemGetInfo(free_bytes, total_bytes)))
        return -1;
    return 0;
}

static int cu_sync(sd_backend *be)
{
    sd__cuda *c = sd__cuda_of(be);
    if (!c->err) {
        cudaSetDevice(c->device);
        SD_CUDA(c, cudaStreamSynchronize(c->stream));
    }
    return c->err;
}

/* ---- graphs ------------------------------------------------------------ */

struct sd_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

int sd_cuda_capture_begin(sd_backend *be)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c)
        return SD_EDEVICE;
    int rc = SD_CUDA(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = !rc;
    return rc;
}

int sd_cuda_capture_end(sd_backend *be, sd_cuda_graph **out)
{
    sd__cuda *c = sd__cuda_of(be);
    *out = NULL;
    c->capturing = 0;
    cudaGraph_t g = NULL;
    /* ends the capture even after a failure, so the stream is usable again */
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (SD_CUDA(c, e) || c->err) {
        if (g)
            cudaGraphDestroy(g);
        return SD_EDEVICE;
    }
    sd_cuda_graph *cg = (sd_cuda_graph *)calloc(1, sizeof *cg);
    if (!cg) {
        cudaGraphDestroy(g);
        return SD_ENOMEM;
    }
    cg->graph = g;
    /* uploaded now, at capture: a graph's first launch otherwise uploads
     * it then (0.2-0.25 ms a graph on the bundled model's steps, the first
     * step of each bucket and proposer shape a burst meets) */
    if (SD_CUDA(c, cudaGraphInstantiate(&cg->exec, g, 0)) ||
        SD_CUDA(c, cudaGraphUpload(cg->exec, c->stream))) {
        if (cg->exec)
            cudaGraphExecDestroy(cg->exec);
        cudaGraphDestroy(g);
        free(cg);
        return SD_EDEVICE;
    }
    *out = cg;
    return 0;
}

int sd_cuda_graph_launch(sd_backend *be, sd_cuda_graph *g)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c)
        return SD_EDEVICE;
    return SD_CUDA(c, cudaGraphLaunch(g->exec, c->stream));
}

void sd_cuda_graph_destroy(sd_cuda_graph *g)
{
    if (!g)
        return;
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    if (g->graph)
        cudaGraphDestroy(g->graph);
    free(g);
}

static int cu_upload2d(sd_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows)
{
    sd__cuda *c = sd__cuda_of(be);
    if (!width || !rows)
        return 0;
    if (c->err)
        return c->err;
    return SD_CUDA(c, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                        cudaMemcpyHostToDevice, c->stream));
}

static int cu_graph_begin(sd_backend *be) { return sd_cuda_capture_begin(be); }

static int cu_graph_end(sd_backend *be, void **graph)
{
    sd_cuda_graph *g = NULL;
    int rc = sd_cuda_capture_end(be, &g);
    *graph = g;
    return rc;
}

static int cu_graph_launch(sd_backend *be, void *graph)
{
    return sd_cuda_graph_launch(be, (sd_cuda_graph *)graph);
}

static void cu_graph_free(sd_backend *be, void *graph)
{
    (void)be;
    sd_cuda_graph_destroy((sd_cuda_graph *)graph);
}

/* Page-locked host memory (SPECD_PINNED=0: none, the engine mallocs): a
 * copy from or to pageable memory goes through the driver's staging buffer
 * and waits for it, ~5-10 us a small copy, several a step. */
static void *cu_host_alloc(sd_backend *be, size_t bytes)
{
    sd__cuda *c = sd__cuda_of(be);
    void *p = NULL;
    if (!c->pinned || c->err)
        return NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller mallocs instead */
        return NULL;
    }
    return p;
}

static void cu_host_free(sd_backend *be, void *p)
{
    if (p) {
        views_forget(sd__cuda_of(be));
        cudaFreeHost(p);
    }
}

/* ---- the table --------------------------------------------------------- */

static const sd_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .memset0 = */ cu_memset0,
    /* .weight = */ cu_weight,
    /* .weight_free = */ cu_weight_free,
    /* .sync = */ cu_sync,
    /* .mem_info = */ cu_mem_info,
    /* .embed = */ sd__cuda_embed,
    /* .rmsnorm = */ sd__cuda_rmsnorm,
    /* .matmul = */ sd__cuda_matmul,
    /* .matmul_heads = */ sd__cuda_matmul_heads,
    /* .add = */ sd__cuda_add,
    /* .silu_mul = */ sd__cuda_silu_mul,
    /* .rope = */ sd__cuda_rope,
    /* .gather_rows = */ sd__cuda_gather_rows,
    /* .copy2d = */ sd__cuda_copy2d,
    /* .attn_gqa = */ sd__cuda_attn_gqa,
    /* .attn_mla = */ sd__cuda_attn_mla,
    /* .moe_route = */ sd__cuda_moe_route,
    /* .moe_ffn = */ sd__cuda_moe_ffn,
    /* .embed_shard = */ sd__cuda_embed_shard,
    /* .argmax_rows = */ sd__cuda_argmax_rows,
    /* .sample_rows = */ sd__cuda_sample_rows,
    /* .accept_greedy_rows = */ sd__cuda_accept_greedy_rows,
    /* .upload2d = */ cu_upload2d,
    /* .graph_begin = */ cu_graph_begin,
    /* .graph_end = */ cu_graph_end,
    /* .graph_launch = */ cu_graph_launch,
    /* .graph_free = */ cu_graph_free,
    /* .accept_sample_rows = */ sd__cuda_accept_sample_rows,
    /* .gather_i32 = */ sd__cuda_gather_i32,
    /* .add_rmsnorm = */ sd__cuda_add_rmsnorm,
    /* .scatter_cols = */ sd__cuda_scatter_cols,
    /* .rope_kv = */ sd__cuda_rope_kv,
    /* .mla_prep = */ sd__cuda_mla_prep,
    /* .matmul_silu = */ sd__cuda_matmul_silu,
    /* .moe_router_route = */ sd__cuda_moe_router_route,
    /* .matmul_add = */ NULL, /* the fused residual ops: not yet (the model */
    /* .rmsnorm_matmul = */ NULL, /* runs add_rmsnorm after each sublayer) */
    /* .host_alloc = */ cu_host_alloc,
    /* .host_free = */ cu_host_free,
    /* .copy = */ cu_copy,
    /* .download_async = */ cu_download_async,
    /* .download_wait = */ cu_download_wait,
    /* .moe_router_ffn = */ sd__cuda_moe_router_ffn,
    /* .mla_prep_absorb = */ sd__cuda_mla_prep_absorb,
    /* .copies = */ cu_copies,
    /* .gemm_trials = */ sd_cuda_gemm_trials,
    /* .weight_fp8 = */ cu_weight_fp8,
};

int sd_cuda_make_current(sd_backend *be)
{
    sd__cuda *c = sd__cuda_of(be);
    return c->err ? c->err : SD_CUDA(c, cudaSetDevice(c->device));
}

void *sd_cuda_stream(sd_backend *be)
{
    sd__cuda *c = sd__cuda_of(be);
    return c ? (void *)c->stream : NULL;
}

int sd_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int sd_cuda_device_name(int device, char *buf, size_t len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "cuda device %d (unavailable)", device);
        return SD_EDEVICE;
    }
    snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
    return 0;
}

void sd_cuda_set_bf16_split(sd_backend *be, int on) { sd__cuda_of(be)->bf16_split = on != 0; }

void sd_cuda_set_mla_tc(sd_backend *be, int on) { sd__cuda_of(be)->mla_tc = on != 0; }
void sd_cuda_set_mla_dec(sd_backend *be, int on) { sd__cuda_of(be)->mla_dec = on != 0; }
/* a switch: off where the variable is "0", on where it is set otherwise,
 * def where it is unset or empty */
static int env_flag(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? strcmp(v, "0") != 0 : def;
}

/* a switch that is on unless the variable is "0" */
static int env_on(const char *name) { return env_flag(name, 1); }

/* SPECD_ABLATE's comma-separated kernel names -> common.cuh's bits (a
 * timing experiment: an unknown name is logged and ignored) */
static unsigned ablate_mask(const char *v)
{
    static const char *const names[] = SD__ABLATE_NAMES;
    unsigned m = 0;
    while (v && *v) {
        size_t n = strcspn(v, ",");
        unsigned b = 0;
        for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
            if (strlen(names[i]) == n && !strncmp(v, names[i], n))
                b = 1u << i;
        if (!b && n)
            sd_log_warn("cuda: SPECD_ABLATE: no kernel named %.*s", (int)n, v);
        m |= b;
        v += n + (v[n] == ',');
    }
    if (m)
        sd_log_warn("cuda: SPECD_ABLATE=%#x: kernels left out for timing; outputs are wrong", m);
    return m;
}

/* a switch of levels 0 .. max: v, or def for any other number */
static int level_or(int v, int max, int def) { return v >= 0 && v <= max ? v : def; }

/* the level a variable names (level_or), def where it is unset or empty */
static int env_level(const char *name, int max, int def)
{
    const char *v = getenv(name);
    return level_or(v && *v ? atoi(v) : def, max, def);
}
void sd_cuda_set_moe_down(sd_backend *be, int shape)
{
    sd__cuda_of(be)->moe_down = level_or(shape, 3, SD_CUDA_MOE_DOWN_DEFAULT); /* moe.cu's shapes */
}

void sd_cuda_set_gemv_few(sd_backend *be, int min_rows, int long_rows)
{
    sd__cuda *c = sd__cuda_of(be);
    c->gemv_few = level_or(min_rows, SD_CUDA_GEMV_EXACT_ROWS, 0);
    c->gemv_few_long = long_rows != 0;
}

void sd_cuda_set_pdl(sd_backend *be, int on) { sd__cuda_of(be)->pdl = on != 0; }

long sd_cuda_gemm_trials(sd_backend *be) { return sd__cuda_of(be)->gemm_trials; }

void sd_cuda_set_attn_split_all(sd_backend *be, int level)
{
    sd__cuda_of(be)->attn_split_all = level_or(level, 2, SD_CUDA_ATTN_SPLIT_ALL_DEFAULT);
}

void sd_cuda_set_route_small(sd_backend *be, int on) { sd__cuda_of(be)->route_small = on != 0; }
void sd_cuda_set_moe_overlap(sd_backend *be, int max_tokens)
{
    sd__cuda_of(be)->moe_overlap = max_tokens > 0 ? max_tokens : 0;
}
void sd_cuda_set_mla_overlap(sd_backend *be, int on) { sd__cuda_of(be)->mla_overlap = on != 0; }
void sd_cuda_set_moe_router(sd_backend *be, int on) { sd__cuda_of(be)->moe_router = on != 0; }
void sd_cuda_set_mla_fold(sd_backend *be, int on) { sd__cuda_of(be)->mla_fold = on != 0; }
void sd_cuda_set_mla_fold_rel(sd_backend *be, int on) { sd__cuda_of(be)->mla_fold_rel = on != 0; }
void sd_cuda_set_step_early(sd_backend *be, int level)
{
    sd__cuda_of(be)->step_inputs_early = level_or(level, 2, SD_CUDA_STEP_EARLY_DEFAULT);
}
void sd_cuda_set_kernel_copies(sd_backend *be, int down, int up)
{
    sd__cuda_of(be)->kernel_down = down != 0;
    sd__cuda_of(be)->kernel_up = up != 0;
}

const char *sd_cuda_backend_error(const sd_backend *be)
{
    return ((const sd__cuda *)be->impl)->msg;
}

/* ---- kernel trace (common.cuh: SD_KTRACE builds, SPECD_KTRACE=FILE) ---- */
#ifdef SD_KTRACE
int sd__kt_set_attention(void *p);
int sd__kt_set_elementwise(void *p);
int sd__kt_set_matmul(void *p);
int sd__kt_set_moe(void *p);
int sd__kt_set_norm(void *p);
int sd__kt_set_rope(void *p);
int sd__kt_set_sample(void *p);

static int kt_open(sd__cuda *c)
{
    const char *path = getenv("SPECD_KTRACE");
    if (!path || !*path)
        return 0;
    size_t bytes = (1 + 2 * (size_t)SD__KT_CAP) * sizeof(unsigned long long);
    int rc = SD_CUDA(c, cudaMalloc((void **)&c->kt_buf, bytes));
    if (!rc)
        rc = SD_CUDA(c, cudaMemset(c->kt_buf, 0, bytes));
    int (*set[])(void *) = {sd__kt_set_attention, sd__kt_set_elementwise, sd__kt_set_matmul,
                            sd__kt_set_moe, sd__kt_set_norm, sd__kt_set_rope, sd__kt_set_sample};
    for (size_t i = 0; !rc && i < sizeof set / sizeof set[0]; i++)
        if (set[i](c->kt_buf))
            rc = sd__cuda_fail(c, "kernel trace", "cannot set the trace buffer", __FILE__, __LINE__);
    c->kt_path = rc ? NULL : strdup(path);
    return rc;
}

/* a launch's shape and kernel: a name for each shape the stamps show */
struct sd__kt_launch {
    unsigned long long sig;
    const char *name;
};
#define KT_LAUNCHES 4096 /* distinct (shape, kernel) pairs kept */

void sd__kt_note(sd__cuda *c, const void *kernel, unsigned long long sig)
{
    const char *name = NULL;
    if (cudaFuncGetName(&name, kernel) != cudaSuccess || !name) {
        cudaGetLastError();
        name = "?";
    }
    for (int i = 0; i < c->n_kt_launch; i++)
        if (c->kt_launch[i].sig == sig && c->kt_launch[i].name == name)
            return;
    if (!c->kt_launch)
        c->kt_launch = (struct sd__kt_launch *)calloc(KT_LAUNCHES, sizeof *c->kt_launch);
    if (c->kt_launch && c->n_kt_launch < KT_LAUNCHES)
        c->kt_launch[c->n_kt_launch++] = (struct sd__kt_launch){sig, name};
}

/* FILE.N (the N-th backend closed by this process): the count, then two
 * words a stamp (common.cuh); FILE.N.names: a line a (shape, kernel) pair
 * launched, the shape word in hex and the kernel's name */
static void kt_close(sd__cuda *c)
{
    static int seq;
    if (c->kt_buf && c->kt_path) {
        const int me = seq++;
        unsigned long long n = 0;
        cudaMemcpy(&n, c->kt_buf, sizeof n, cudaMemcpyDeviceToHost);
        size_t m = n < SD__KT_CAP ? (size_t)n : SD__KT_CAP;
        unsigned long long *h = (unsigned long long *)malloc((1 + 2 * m) * sizeof *h);
        char name[4096];
        snprintf(name, sizeof name, "%s.%d", c->kt_path, me);
        FILE *f = fopen(name, "wb");
        if (h && f && cudaMemcpy(h, c->kt_buf, (1 + 2 * m) * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess) {
            h[0] = m;
            fwrite(h, sizeof *h, 1 + 2 * m, f);
            sd_log_info("cuda: kernel trace: %zu stamps in %s", m, name);
        }
        if (f)
            fclose(f);
        free(h);
        snprintf(name, sizeof name, "%s.%d.names", c->kt_path, me);
        FILE *nf = fopen(name, "w");
        for (int i = 0; nf && i < c->n_kt_launch; i++)
            fprintf(nf, "%llx %s\n", c->kt_launch[i].sig, c->kt_launch[i].name);
        if (nf)
            fclose(nf);
    }
    free(c->kt_launch);
    if (c->kt_buf)
        cudaFree(c->kt_buf);
    free(c->kt_path);
}
#else
static int kt_open(sd__cuda *c)
{
    (void)c;
    return 0;
}
static void kt_close(sd__cuda *c) { (void)c; }
#endif

int sd_cuda_backend_create(sd_backend **out, int device, sd_err *err)
{
    *out = NULL;
    int n = sd_cuda_device_count();
    if (device < 0 || device >= n)
        return sd_err_set(err, SD_EDEVICE, "cuda: device %d is not present (%d visible)", device,
                          n);
    sd_backend *be = (sd_backend *)calloc(1, sizeof *be);
    sd__cuda *c = (sd__cuda *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return sd_err_set(err, SD_ENOMEM, "cuda: out of memory for the context");
    }
    be->ops = &cuda_ops;
    be->device = device;
    be->impl = c;
    c->device = device;
    c->bf16_split = 1;
    /* SPECD_MOE_TC=0/1: moe_ffn's sorted path off/on tensor cores (default:
     * real-size experts); SPECD_MLA_TC=0: attn_mla off tensor cores. Read
     * once, kept in the context. */
    const char *moe_tc = getenv("SPECD_MOE_TC");
    c->moe_tc = !moe_tc || !*moe_tc ? SD_CUDA_TC_AUTO : strcmp(moe_tc, "0") ? SD_CUDA_TC_ON : SD_CUDA_TC_OFF;
    c->mla_tc = env_on("SPECD_MLA_TC");
    c->pdl = env_flag("SPECD_PDL", SD_CUDA_PDL_DEFAULT); /* programmatic dependent launches */
    c->gemv_pre = env_on("SPECD_GEMV_PRE");
    c->matmul_silu = env_on("SPECD_MATMUL_SILU");
    const char *mgate = getenv("SPECD_MOE_GATE");
    c->moe_gate_wide = mgate && !strcmp(mgate, "2") ? 0 : mgate && !strcmp(mgate, "4b4") ? 2 : 1;
    const char *mchunk = getenv("SPECD_MLA_MIN_CHUNK");
    c->mla_min_chunk = mchunk && *mchunk ? atoi(mchunk) : 0;
    c->mla_pipe = env_on("SPECD_MLA_PIPE");
    c->moe_down = env_level("SPECD_MOE_DOWN", 3, SD_CUDA_MOE_DOWN_DEFAULT);
    c->gemv_wide = env_on("SPECD_GEMV_WIDE");
    c->f8_wide = env_on("SPECD_F8_WIDE");
    c->gemv_few = env_level("SPECD_GEMV_FEW", SD_CUDA_GEMV_EXACT_ROWS, SD_CUDA_GEMV_FEW_DEFAULT);
    c->gemv_few_long = env_flag("SPECD_GEMV_FEW_LONG", SD_CUDA_GEMV_FEW_LONG_DEFAULT);
    c->pinned = env_on("SPECD_PINNED");
    c->attn_dec = env_on("SPECD_ATTN_DEC");
    c->attn_split_all = env_level("SPECD_ATTN_SPLIT_ALL", 2, SD_CUDA_ATTN_SPLIT_ALL_DEFAULT);
    c->mla_dec = env_on("SPECD_MLA_DEC"); /* 0: off (the tensor-core kernel) */
    c->ablate = ablate_mask(getenv("SPECD_ABLATE"));
    c->route_small = env_on("SPECD_ROUTE_SMALL");
    c->moe_overlap = env_level("SPECD_MOE_OVERLAP", 1 << 20, SD_CUDA_MOE_OVERLAP_DEFAULT);
    c->mla_overlap = env_flag("SPECD_MLA_OVERLAP", SD_CUDA_MLA_OVERLAP_DEFAULT);
    c->moe_router = env_flag("SPECD_MOE_ROUTER", SD_CUDA_MOE_ROUTER_DEFAULT);
    c->mla_fold = env_flag("SPECD_MLA_FOLD", SD_CUDA_MLA_FOLD_DEFAULT);
    c->step_inputs_early = env_level("SPECD_STEP_EARLY", 2, SD_CUDA_STEP_EARLY_DEFAULT);
    c->mla_fold_rel = env_flag("SPECD_MLA_FOLD_REL", SD_CUDA_MLA_FOLD_REL_DEFAULT);
    c->kernel_down = env_flag("SPECD_KERNEL_DOWN", SD_CUDA_KERNEL_DOWN_DEFAULT);
    c->kernel_up = env_flag("SPECD_KERNEL_UP", SD_CUDA_KERNEL_UP_DEFAULT);
    cudaDeviceProp p;
    int rc = SD_CUDA(c, cudaSetDevice(device));
    if (!rc)
        rc = SD_CUDA(c, cudaGetDeviceProperties(&p, device));
    if (!rc) {
        c->sm_count = p.multiProcessorCount;
        c->smem_optin = p.sharedMemPerBlockOptin;
        if (p.major < 8)
            rc = sd__cuda_fail(c, "cuda device", "compute capability 8.0 or newer is needed",
                               __FILE__, __LINE__);
    }
    if (!rc)
        rc = SD_CUDA(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (!rc)
        rc = SD_CUBLAS(c, cublasLtCreate(&c->lt));
    if (!rc) {
        c->lt_ws_bytes = LT_WS_BYTES;
        rc = SD_CUDA(c, cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
    }
    if (!rc) {
        c->scratch_bytes = SCRATCH_BYTES;
        rc = SD_CUDA(c, cudaMalloc(&c->scratch, c->scratch_bytes));
    }
    if (!rc) {
        c->attn_part_bytes = ATTN_PART_BYTES;
        rc = SD_CUDA(c, cudaMalloc((void **)&c->attn_part, c->attn_part_bytes));
    }
    if (!rc) {
        /* the argmax's keys and counts, then MLA's fold counts, then the
         * router's: all zero */
        size_t b = SD__ARGMAX_ROWS * (sizeof(unsigned long long) + sizeof(unsigned)) +
                   (SD__MLA_FOLD_WORDS + 1) * sizeof(unsigned);
        rc = SD_CUDA(c, cudaMalloc((void **)&c->am_keys, b));
        if (!rc)
            rc = SD_CUDA(c, cudaMemset(c->am_keys, 0, b));
        c->am_cnt = (unsigned *)(c->am_keys + SD__ARGMAX_ROWS);
        c->mla_fold_cnt = c->am_cnt + SD__ARGMAX_ROWS;
        c->moe_router_cnt = c->mla_fold_cnt + SD__MLA_FOLD_WORDS;
    }
    if (!rc)
        rc = sd__cuda_attention_init(c);
    if (!rc)
        rc = kt_open(c);
    if (rc) {
        sd_err_set(err, SD_EDEVICE, "cuda: cannot open device %d: %s", device, c->msg);
        sd_cuda_backend_destroy(be);
        return SD_EDEVICE;
    }
    *out = be;
    return 0;
}

void sd_cuda_backend_destroy(sd_backend *be)
{
    if (!be)
        return;
    sd__cuda *c = sd__cuda_of(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream)
            cudaStreamSynchronize(c->stream);
        sd__cuda_matmul_release(c);
        for (int i = 0; i < c->n_weights; i++)
            cudaFree(c->weights[i]);
        free(c->weights);
        if (c->fp8_scratch)
            cudaFree(c->fp8_scratch);
        if (c->scratch)
            cudaFree(c->scratch);
        if (c->attn_part)
            cudaFree(c->attn_part);
        if (c->am_keys)
            cudaFree(c->am_keys);
        kt_close(c);
        if (c->lt_ws)
            cudaFree(c->lt_ws);
        if (c->lt)
            cublasLtDestroy(c->lt);
        for (int i = 0; i < 2; i++)
            if (c->marks[i])
                cudaEventDestroy(c->marks[i]);
        if (c->stream)
            cudaStreamDestroy(c->stream);
        cudaGetLastError();
        free(c);
    }
    free(be);
}

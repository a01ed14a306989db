/* CUDA: a kernel trace through CUPTI's activity API, for finding where a
 * decode step's time goes inside its CUDA graph (--profile-ops times ops
 * one at a time, synced, which a graph does not do).
 *
 * SPECD_KERNEL_TRACE=FILE as the first CUDA backend opens: every kernel the
 * process runs afterwards (graph replays included) is written to FILE, one
 * line each:
 *   start_ns end_ns graph_id correlation_id device grid_x block_x name
 * (a graph replay's kernels share the correlation id of its launch; graph_id
 * 0: launched outside a graph). tools/kernel_trace.py sums it up. CUPTI is
 * loaded with dlopen, so a machine without it runs untraced (one warning). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti_activity.h>
#include <cupti_version.h>

#include "kernels/cuda/common.cuh"

typedef CUptiResult (*reg_fn)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*enable_fn)(CUpti_ActivityKind);
typedef CUptiResult (*next_fn)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*flush_fn)(uint32_t);
typedef CUptiResult (*version_fn)(uint32_t *);

static struct {
    pthread_mutex_t mu;
    int started;
    FILE *f;
    next_fn next;
    flush_fn flush;
    unsigned long long kernels;
} tr = {PTHREAD_MUTEX_INITIALIZER, 0, NULL, NULL, NULL, 0};

#define TRACE_BUF (8u << 20)

static void CUPTIAPI buf_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = (uint8_t *)aligned_alloc(8, TRACE_BUF);
    *size = *buffer ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                   size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&tr.mu);
    while (tr.f && tr.next && tr.next(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(tr.f, "%llu %llu %u %u %u %d %d %s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId, k->correlationId, k->deviceId, k->gridX,
                k->blockX, k->name ? k->name : "?");
        tr.kernels++;
    }
    pthread_mutex_unlock(&tr.mu);
    free(buffer);
}

void sd__cuda_trace_start(void)
{
    const char *path = getenv("SPECD_KERNEL_TRACE");
    if (!path || !*path)
        return;
    pthread_mutex_lock(&tr.mu);
    if (tr.started) {
        pthread_mutex_unlock(&tr.mu);
        return;
    }
    tr.started = 1;
    static const char *libs[] = {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                                 "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !h; i++)
        h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    reg_fn reg = h ? (reg_fn)dlsym(h, "cuptiActivityRegisterCallbacks") : NULL;
    enable_fn en = h ? (enable_fn)dlsym(h, "cuptiActivityEnable") : NULL;
    tr.next = h ? (next_fn)dlsym(h, "cuptiActivityGetNextRecord") : NULL;
    tr.flush = h ? (flush_fn)dlsym(h, "cuptiActivityFlushAll") : NULL;
    version_fn ver = h ? (version_fn)dlsym(h, "cuptiGetVersion") : NULL;
    if (!reg || !en || !tr.next || !tr.flush || !ver) {
        sd_log_warn("SPECD_KERNEL_TRACE: CUPTI not found (%s): no kernel trace", dlerror());
        pthread_mutex_unlock(&tr.mu);
        return;
    }
    /* the kernel records are read as this header's CUpti_ActivityKernel10:
     * only a library of the same API version writes exactly that */
    uint32_t v = 0;
    if (ver(&v) != CUPTI_SUCCESS || v != CUPTI_API_VERSION) {
        sd_log_warn("SPECD_KERNEL_TRACE: CUPTI API version %u, built for %u: no kernel trace", v,
                    (unsigned)CUPTI_API_VERSION);
        tr.next = NULL;
        pthread_mutex_unlock(&tr.mu);
        return;
    }
    tr.f = fopen(path, "w");
    if (!tr.f) {
        sd_log_warn("SPECD_KERNEL_TRACE: cannot write %s: no kernel trace", path);
        pthread_mutex_unlock(&tr.mu);
        return;
    }
    pthread_mutex_unlock(&tr.mu);
    if (reg(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        en(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        sd_log_warn("SPECD_KERNEL_TRACE: CUPTI would not record kernels: no kernel trace");
        pthread_mutex_lock(&tr.mu);
        fclose(tr.f);
        tr.f = NULL;
        pthread_mutex_unlock(&tr.mu);
        return;
    }
    sd_log_info("kernel trace to %s", path);
}

void sd__cuda_trace_flush(void)
{
    if (!tr.f || !tr.flush)
        return;
    cudaDeviceSynchronize(); /* this device's kernels have ended */
    tr.flush(1); /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: the buffers in use too */
    pthread_mutex_lock(&tr.mu);
    if (tr.f)
        fflush(tr.f);
    sd_log_info("kernel trace: %llu kernels so far", tr.kernels);
    pthread_mutex_unlock(&tr.mu);
}

/* tests/gpu: helpers shared by the GPU tests (CUDA backend against the CPU
 * backend). Each check prints one line for people and one machine-readable
 * line, `RESULT {"test": ..., "error": ..., "bound": ..., "passed": ...}`,
 * on stdout, from which bench/results/gpu-validate.json is assembled. */
#ifndef SD_TESTS_GPU_TEST_H
#define SD_TESTS_GPU_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"
#include "test.h"

typedef struct gpu_env {
    sd_backend *cpu, *gpu;
    uint64_t rng;
    char msg[1024];
} gpu_env;

/* 0: both open; 1: no GPU (skip); -1: failure (msg says why) */
static inline int gpu_env_open(gpu_env *e)
{
    memset(e, 0, sizeof *e);
    e->rng = sd_test_seed();
    if (sd_cuda_device_count() <= 0) {
        snprintf(e->msg, sizeof e->msg, "no CUDA device is visible (no GPU or no driver)");
        return 1;
    }
    sd_err err = {0};
    if (sd_cuda_backend_create(&e->gpu, 0, &err)) {
        snprintf(e->msg, sizeof e->msg, "%s", err.msg);
        return -1;
    }
    if (sd_cpu_backend_create(&e->cpu, 0)) {
        snprintf(e->msg, sizeof e->msg, "cannot start the CPU backend");
        return -1;
    }
    return 0;
}

static inline void gpu_env_close(gpu_env *e)
{
    if (e->gpu)
        sd_cuda_backend_destroy(e->gpu);
    if (e->cpu)
        sd_cpu_backend_destroy(e->cpu);
    e->gpu = e->cpu = NULL;
}

#define GPU_OPEN(e)                                                                        \
    do {                                                                                   \
        int r_ = gpu_env_open(&(e));                                                       \
        if (r_ > 0)                                                                        \
            TEST_SKIP("%s", (e).msg);                                                      \
        ASSERT_MSG(r_ == 0, "cannot open the backends: %s", (e).msg);                      \
    } while (0)

/* uniform floats in [lo, hi) */
static inline float *rnd_floats(gpu_env *e, size_t n, float lo, float hi)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = sd_test_randf(&e->rng, lo, hi);
    return p;
}

static inline int rnd_int(gpu_env *e, int n) /* [0, n) */
{
    int v = (int)sd_test_randf(&e->rng, 0.0f, (float)n);
    return v < n ? v : n - 1;
}

static inline void *gput(gpu_env *e, const void *h, size_t bytes)
{
    void *d = e->gpu->ops->alloc(e->gpu, bytes);
    if (d && h)
        e->gpu->ops->upload(e->gpu, d, h, bytes);
    return d;
}

/* n floats of NaN on the GPU: an element the op forgets stays NaN */
static inline float *gpoison(gpu_env *e, size_t n)
{
    float *h = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = (float *)gput(e, h, n * sizeof(float));
    free(h);
    return d;
}

/* downloads n floats (after the stream's work); NULL if the backend failed */
static inline float *gget(gpu_env *e, const void *d, size_t n)
{
    float *h = (float *)malloc((n ? n : 1) * sizeof(float));
    if (e->gpu->ops->download(e->gpu, h, d, n * sizeof(float))) {
        fprintf(stderr, "  gpu: %s\n", sd_cuda_backend_error(e->gpu));
        free(h);
        return NULL;
    }
    return h;
}

static inline void gfree(gpu_env *e, void *d)
{
    if (d)
        e->gpu->ops->free(e->gpu, d);
}

/* gfree of each of the GPU buffers listed (NULLs skipped) */
#define GFREE_ALL(e, ...)                                                                          \
    do {                                                                                           \
        void *gfree_all_[] = {__VA_ARGS__};                                                        \
        for (size_t gfree_i_ = 0; gfree_i_ < SD_ARRAY_LEN(gfree_all_); gfree_i_++)                 \
            gfree((e), gfree_all_[gfree_i_]);                                                      \
    } while (0)

/* A weight in dtype dt, the same bytes for both backends. */
typedef struct tw {
    sd_weight c, g;
    void *host;
} tw;

static inline int tw_make(gpu_env *e, tw *w, sd_dtype dt, int64_t rows, int64_t cols, float scale)
{
    size_t n = (size_t)rows * (size_t)cols;
    memset(w, 0, sizeof *w);
    w->host = malloc(n * sd_dtype_size(dt) + 16);
    for (size_t i = 0; i < n; i++) {
        float f = sd_test_randf(&e->rng, -scale, scale);
        if (dt == SD_DT_F32)
            ((float *)w->host)[i] = f;
        else if (dt == SD_DT_BF16)
            ((uint16_t *)w->host)[i] = sd_f32_to_bf16(f);
        else
            ((uint16_t *)w->host)[i] = sd_f32_to_f16(f);
    }
    if (e->cpu->ops->weight(e->cpu, &w->c, w->host, dt, rows, cols))
        return -1;
    return e->gpu->ops->weight(e->gpu, &w->g, w->host, dt, rows, cols);
}

static inline void tw_free(gpu_env *e, tw *w)
{
    if (w->g.data)
        e->gpu->ops->weight_free(e->gpu, &w->g);
    free(w->host);
    memset(w, 0, sizeof *w);
}

/* max |g - c| / max |c|; infinite when g has a NaN or Inf that c has not
 * (an element the GPU did not write keeps its NaN poison). */
static inline double rel_err(const float *g, const float *c, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) && isfinite(c[i]))
            return INFINITY;
        double d = fabs((double)g[i] - (double)c[i]);
        if (d > md)
            md = d;
        if (fabs((double)c[i]) > mr)
            mr = fabs((double)c[i]);
    }
    return mr > 0 ? md / mr : md;
}

/* Elements of a and b (n floats each, host copies) whose bits differ;
 * infinite when either is missing (a failed download). */
static inline double bit_mismatches(const float *a, const float *b, size_t n)
{
    if (!a || !b)
        return INFINITY;
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* Records a check; returns 1 when err <= bound. */
static inline int report(const char *name, double err, double bound)
{
    int ok = err <= bound;
    fprintf(stderr, "  %-64s err %-10.3g bound %-8.2g %s\n", name, err, bound, ok ? "ok" : "FAIL");
    printf("RESULT {\"test\": \"%s\", \"error\": %.6g, \"bound\": %.3g, \"passed\": %s}\n", name,
           isfinite(err) ? err : 1e308, bound, ok ? "true" : "false");
    fflush(stdout);
    return ok;
}

/* report() of a formatted name */
static inline int reportf(double err, double bound, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int reportf(double err, double bound, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return report(name, err, bound);
}

/* Compares n floats of GPU memory d with host c: download, rel_err, report. */
static inline int check_dev(gpu_env *e, const void *d, const float *c, size_t n, double bound,
                            const char *name)
{
    float *g = gget(e, d, n);
    double err = g ? rel_err(g, c, n) : INFINITY;
    free(g);
    return report(name, err, bound);
}

#endif

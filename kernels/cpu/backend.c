/* CPU backend: memory, weights, the thread pool, and the ops table. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

/* The pool: the caller is thread 0 of every job and the workers 1..n.
 *
 * A job is posted by bumping epoch; a worker that finished one spins on
 * epoch for up to spin_ns before it sleeps on a condition variable, and
 * the caller spins on pending the same way before it sleeps. A decode step
 * is a few hundred small ops back to back (the bundled model's take 10-70
 * us each), and waking a sleeping thread costs more than that on some
 * machines (~70 us an op measured on a 2-core VM, where one thread decoded
 * 5x faster than two): spinning keeps the workers awake through a step and
 * lets them sleep between steps. SPECD_CPU_SPIN_US sets the spin (0: block
 * at once). Which rows a thread takes does not change: the same bits. */
struct sd__cpu_pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *tids;
    int n;                   /* worker threads (threads - 1; the caller is thread 0) */
    _Atomic uint64_t epoch;  /* bumped per job (release: the job's fields before it) */
    _Atomic int pending;     /* workers still on the job */
    _Atomic int quit;
    int sleepers;            /* workers blocked on go (under mu) */
    int waiting;             /* the caller blocked on done (under mu) */
    uint64_t spin_ns;
    size_t min_work; /* jobs of less run on the caller alone */
    sd__cpu_task task;
    void *ctx;
    int total;
    int chunks;
};

typedef struct worker_arg {
    sd__cpu_pool *pool;
    int index; /* 1.. */
} worker_arg;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* One round of a wait that spins: a pause, and every 64th round a yield of
 * the core, so a machine with more runnable threads than cores (tests in
 * parallel, a busy host) runs the thread this one waits for instead of
 * the spin (two decoders on two cores: 1000-2100 tok/s a process at batch
 * 1 with the yield, 106 without, ~1000 for the pool that slept). Returns 0
 * once ns have passed since *t0 (set on the first call). */
static int spin_round(unsigned i, uint64_t *t0, uint64_t ns)
{
    cpu_relax();
    if (i % 64 != 63)
        return 1;
    uint64_t t = mono_ns();
    if (!*t0)
        *t0 = t;
    if (t - *t0 > ns)
        return 0;
    sched_yield();
    return 1;
}

/* spins while *v == old for up to ns nanoseconds; returns the last value */
static uint64_t spin_while_eq(_Atomic uint64_t *v, uint64_t old, uint64_t ns)
{
    uint64_t x = atomic_load_explicit(v, memory_order_acquire), t0 = 0;
    for (unsigned i = 0; x == old && ns && spin_round(i, &t0, ns); i++)
        x = atomic_load_explicit(v, memory_order_acquire);
    return x;
}

static void run_chunk(sd__cpu_pool *p, int chunk)
{
    int per = (p->total + p->chunks - 1) / p->chunks;
    int b = chunk * per, e = b + per;
    if (e > p->total)
        e = p->total;
    if (b < e)
        p->task(p->ctx, b, e, chunk);
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    sd__cpu_pool *p = wa->pool;
    int me = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t e = spin_while_eq(&p->epoch, seen, p->spin_ns);
        if (e == seen && !atomic_load(&p->quit)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while ((e = atomic_load(&p->epoch)) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->go, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit))
            break;
        seen = e;
        if (me < p->chunks)
            run_chunk(p, me);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); /* the last one: wake a caller that sleeps */
            if (p->waiting)
                pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

void sd__cpu_parallel(sd_backend *be, int n, size_t work, sd__cpu_task task, void *ctx)
{
    sd__cpu *c = be->impl;
    sd__cpu_pool *p = c->pool;
    if (n <= 0)
        return;
    if (!p || p->n == 0 || n == 1 || (double)n * (double)work < (double)p->min_work) {
        task(ctx, 0, n, 0);
        return;
    }
    p->task = task;
    p->ctx = ctx;
    p->total = n;
    p->chunks = n < p->n + 1 ? n : p->n + 1;
    atomic_store_explicit(&p->pending, p->n, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->epoch, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers)
        pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0);
    /* the workers' chunks: spin a while, then sleep */
    uint64_t t0 = 0;
    for (unsigned i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0 &&
                         spin_round(i, &t0, p->spin_ns);
         i++)
        ;
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        p->waiting = 1;
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        p->waiting = 0;
        pthread_mutex_unlock(&p->mu);
    }
}

int sd__cpu_reserve_scratch(sd_backend *be, size_t len)
{
    sd__cpu *c = be->impl;
    if (len <= c->scratch_len)
        return 0;
    for (int i = 0; i < c->threads; i++) {
        float *s = realloc(c->scratch[i], len * sizeof(float));
        if (!s)
            return -1;
        c->scratch[i] = s;
    }
    c->scratch_len = len;
    return 0;
}

float *sd__cpu_scratch(sd_backend *be, int thread, size_t len)
{
    sd__cpu *c = be->impl;
    (void)len; /* reserved before the op by the caller of the parallel section */
    return c->scratch[thread];
}

/* An FP8 weight's code tables (cpu_weight_fp8): for each block of scales,
 * 256 floats, code c's value times the scale (ops.h); row r's
 * tables, one a block of columns, start at fp8_luts(w, r). */
static inline const float *fp8_luts(const sd_weight *w, int64_t r)
{
    return (const float *)w->aux + (size_t)(r / w->block[0]) * (size_t)w->scale_cols * 256;
}

void sd__cpu_weight_row(const sd_weight *w, int64_t r, float *dst)
{
    size_t k = (size_t)w->cols;
    size_t off = (size_t)r * k;
    switch (w->dtype) {
    case SD_DT_F32: memcpy(dst, (const float *)w->data + off, k * sizeof(float)); break;
    case SD_DT_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++)
            dst[i] = sd_bf16_to_f32(s[i]);
        break;
    }
    case SD_DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++)
            dst[i] = sd_f16_to_f32(s[i]);
        break;
    }
    case SD_DT_F8_E4M3: {
        const uint8_t *q = (const uint8_t *)w->data + off;
        const float *t = fp8_luts(w, r);
        for (size_t i = 0; i < k; i++)
            dst[i] = t[i / (size_t)w->block[1] * 256 + q[i]];
        break;
    }
    default: memset(dst, 0, k * sizeof(float)); break;
    }
}

/* 8 partial sums: vectorizes, and keeps rounding close to blocked BLAS sums. */
static inline float dot_f32(const float *a, const float *b, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline float dot_bf16(const uint16_t *w, const float *x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            uint32_t u = (uint32_t)w[i + j] << 16;
            float f;
            memcpy(&f, &u, 4);
            acc[j] += f * x[i + j];
        }
    float s = 0;
    for (; i < n; i++)
        s += sd_bf16_to_f32(w[i]) * x[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* dot_bf16's sums over an FP8 row's values (ops.h),
 * each code's value from its block's table t (256 floats a block of bn) */
static inline float dot_fp8(const uint8_t *q, const float *t, size_t bn, const float *x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    if (bn % 8 == 0) {
        for (; i + 8 <= n; i += 8) {
            const float *tb = t + i / bn * 256;
            for (int j = 0; j < 8; j++)
                acc[j] += tb[q[i + j]] * x[i + j];
        }
    } else {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += t[(i + j) / bn * 256 + q[i + j]] * x[i + j];
    }
    float s = 0;
    for (; i < n; i++)
        s += t[i / bn * 256 + q[i]] * x[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float sd__cpu_dot_f32(const float *w, const float *x, size_t n) { return dot_f32(w, x, n); }

/* weight element i of a BF16 or F32 row */
static inline float w_elem(const void *row, int bf16, size_t i)
{
    return bf16 ? sd_bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* Built for AVX2 too (picked at run time): its 8 lanes a row are the 8 sums
 * in the same order, so the same bits; four independent chains of them
 * (one per activation row) keep the wider units busy, where the one-row dot,
 * a single chain, gained nothing from AVX2 (session 39). Static, called
 * through the plain function below: clang 14 names an exported clone's
 * dispatcher NAME.ifunc, so other files could not link to it. */
__attribute__((target_clones("avx2", "default"))) static int
dot4_row(const sd_weight *w, int64_t r, const float *const x[4], float out[4])
{
    if (w->dtype != SD_DT_BF16 && w->dtype != SD_DT_F32)
        return -1;
    const int bf16 = w->dtype == SD_DT_BF16;
    const size_t n = (size_t)w->cols;
    const void *row = (const char *)w->data + (size_t)r * n * (bf16 ? 2 : 4);
    float acc[4][8] = {{0}};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float f[8];
        for (int j = 0; j < 8; j++)
            f[j] = w_elem(row, bf16, i + j);
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 8; j++)
                acc[t][j] += f[j] * x[t][i + j];
    }
    for (int t = 0; t < 4; t++) {
        float s = 0;
        for (size_t k = i; k < n; k++)
            s += w_elem(row, bf16, k) * x[t][k];
        const float *a = acc[t];
        out[t] = s + ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
    return 0;
}

int sd__cpu_dot4_row(const sd_weight *w, int64_t r, const float *const x[4], float out[4])
{
    return dot4_row(w, r, x, out);
}

float sd__cpu_dot_row(const sd_weight *w, int64_t r, const float *x)
{
    size_t k = (size_t)w->cols, off = (size_t)r * k;
    switch (w->dtype) {
    case SD_DT_F32: return dot_f32((const float *)w->data + off, x, k);
    case SD_DT_BF16: return dot_bf16((const uint16_t *)w->data + off, x, k);
    case SD_DT_F8_E4M3:
        return dot_fp8((const uint8_t *)w->data + off, fp8_luts(w, r), (size_t)w->block[1], x, k);
    case SD_DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + off;
        float acc = 0;
        for (size_t i = 0; i < k; i++)
            acc += sd_f16_to_f32(s[i]) * x[i];
        return acc;
    }
    default: return 0;
    }
}

static void *cpu_alloc(sd_backend *be, size_t bytes)
{
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}
static void cpu_free(sd_backend *be, void *p)
{
    (void)be;
    free(p);
}
static int cpu_copy(sd_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}
static int cpu_memset0(sd_backend *be, void *dst, size_t bytes)
{
    (void)be;
    memset(dst, 0, bytes);
    return 0;
}
static int cpu_weight(sd_backend *be, sd_weight *out, const void *host, sd_dtype dt, int64_t rows,
                      int64_t cols)
{
    (void)be;
    if (dt != SD_DT_F32 && dt != SD_DT_F16 && dt != SD_DT_BF16)
        return -1;
    out->data = host;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    return 0;
}
static int cpu_weight_fp8(sd_backend *be, sd_weight *out, const uint8_t *q, const float *scale,
                          int64_t rows, int64_t cols, int bm, int bn)
{
    sd__cpu *c = be->impl;
    if (bm < 1 || bn < 1 || rows < 1 || cols < 1)
        return -1;
    const int64_t sr = (rows + bm - 1) / bm, sc = (cols + bn - 1) / bn;
    float code[256];
    for (int i = 0; i < 256; i++)
        code[i] = sd_fp8_e4m3_to_f32((uint8_t)i);
    float *t = malloc((size_t)(sr * sc) * 256 * sizeof *t);
    if (!t)
        return -1;
    for (int64_t b = 0; b < sr * sc; b++)
        for (int i = 0; i < 256; i++)
            t[b * 256 + i] = code[i] * scale[b];
    pthread_mutex_lock(&c->luts_mu);
    if (c->n_luts == c->cap_luts) {
        int cap = c->cap_luts ? 2 * c->cap_luts : 64;
        float **l = realloc(c->luts, (size_t)cap * sizeof *l);
        if (!l) {
            pthread_mutex_unlock(&c->luts_mu);
            free(t);
            return -1;
        }
        c->luts = l;
        c->cap_luts = cap;
    }
    c->luts[c->n_luts++] = t;
    pthread_mutex_unlock(&c->luts_mu);
    *out = (sd_weight){.data = q, .dtype = SD_DT_F8_E4M3, .rows = rows, .cols = cols,
                       .scale = scale, .block = {bm, bn}, .scale_cols = sc, .aux = t};
    return 0;
}
static void cpu_weight_free(sd_backend *be, sd_weight *w)
{
    (void)be;
    w->data = NULL;
}
static int cpu_sync(sd_backend *be)
{
    (void)be;
    return 0;
}

/* MemAvailable and MemTotal from /proc/meminfo */
static int cpu_mem_info(sd_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    (void)be;
    *free_bytes = *total_bytes = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            *free_bytes = (size_t)kb * 1024;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            *total_bytes = (size_t)kb * 1024;
    }
    fclose(f);
    return *total_bytes ? 0 : -1;
}

static int cpu_upload2d(sd_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows)
{
    (void)be;
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

/* the CPU's ops are done when they return: a queued download is a copy */
static int cpu_download_async(sd_backend *be, void *dst, const void *src, size_t bytes, int ev)
{
    (void)ev;
    return cpu_copy(be, dst, src, bytes);
}

static int cpu_copies(sd_backend *be, const sd_copy *c, int n)
{
    for (int i = 0; i < n; i++)
        cpu_upload2d(be, c[i].dst, c[i].dpitch, c[i].src, c[i].spitch, c[i].width, c[i].rows);
    return 0;
}

static int cpu_download_wait(sd_backend *be, int ev)
{
    (void)be;
    (void)ev;
    return 0;
}

static const sd_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .memset0 = cpu_memset0,
    .weight = cpu_weight,
    .weight_fp8 = cpu_weight_fp8,
    .weight_free = cpu_weight_free,
    .sync = cpu_sync,
    .mem_info = cpu_mem_info,
    .embed = sd__cpu_embed,
    .rmsnorm = sd__cpu_rmsnorm,
    .matmul = sd__cpu_matmul,
    .matmul_heads = sd__cpu_matmul_heads,
    .add = sd__cpu_add,
    .silu_mul = sd__cpu_silu_mul,
    .rope = sd__cpu_rope,
    .gather_rows = sd__cpu_gather_rows,
    .copy2d = sd__cpu_copy2d,
    .attn_gqa = sd__cpu_attn_gqa,
    .attn_mla = sd__cpu_attn_mla,
    .moe_route = sd__cpu_moe_route,
    .moe_ffn = sd__cpu_moe_ffn,
    .embed_shard = sd__cpu_embed_shard,
    .argmax_rows = sd__cpu_argmax_rows,
    .sample_rows = sd__cpu_sample_rows,
    .accept_greedy_rows = sd__cpu_accept_greedy_rows,
    .upload2d = cpu_upload2d,
    /* no graphs: every step launches its ops */
    .accept_sample_rows = sd__cpu_accept_sample_rows,
    .gather_i32 = sd__cpu_gather_i32,
    .add_rmsnorm = sd__cpu_add_rmsnorm,
    .scatter_cols = sd__cpu_scatter_cols,
    .rope_kv = sd__cpu_rope_kv,
    .mla_prep = sd__cpu_mla_prep,
    .matmul_silu = sd__cpu_matmul_silu,
    .moe_router_route = sd__cpu_moe_router_route,
    /* the fused residual ops: the ops they stand for (ops.h) */
    .matmul_add = sd_matmul_add_ops,
    .rmsnorm_matmul = sd_rmsnorm_matmul_ops,
    .copy = cpu_copy,
    .download_async = cpu_download_async,
    .download_wait = cpu_download_wait,
    .copies = cpu_copies,
};

int sd_cpu_backend_create(sd_backend **out, int threads)
{
    *out = NULL;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > 256)
        threads = 256;
    sd_backend *be = calloc(1, sizeof *be);
    sd__cpu *c = calloc(1, sizeof *c);
    if (!be || !c)
        goto fail;
    pthread_mutex_init(&c->luts_mu, NULL);
    be->ops = &cpu_ops;
    be->device = -1;
    be->impl = c;
    c->threads = threads;
    c->scratch = calloc((size_t)threads, sizeof *c->scratch);
    if (!c->scratch)
        goto fail;
    if (threads > 1) {
        sd__cpu_pool *p = calloc(1, sizeof *p);
        if (!p)
            goto fail;
        c->pool = p;
        const char *spin = getenv("SPECD_CPU_SPIN_US");
        p->spin_ns = (uint64_t)(spin ? atof(spin) : 200.0) * 1000u;
        const char *mw = getenv("SPECD_CPU_MIN_WORK");
        p->min_work = (size_t)(mw ? atof(mw) : 32768.0);
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->go, NULL);
        pthread_cond_init(&p->done, NULL);
        p->tids = calloc((size_t)threads - 1, sizeof *p->tids);
        if (!p->tids)
            goto fail;
        for (int i = 0; i < threads - 1; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa)
                goto fail;
            wa->pool = p;
            wa->index = i + 1;
            if (pthread_create(&p->tids[i], NULL, worker_main, wa) != 0) {
                free(wa);
                goto fail;
            }
            p->n++;
        }
    }
    *out = be;
    return 0;
fail:
    if (be && c)
        sd_cpu_backend_destroy(be);
    else {
        free(be);
        free(c);
    }
    return -1;
}

void sd_cpu_backend_destroy(sd_backend *be)
{
    if (!be)
        return;
    sd__cpu *c = be->impl;
    if (c) {
        sd__cpu_pool *p = c->pool;
        if (p) {
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->quit, 1);
            pthread_cond_broadcast(&p->go);
            pthread_mutex_unlock(&p->mu);
            for (int i = 0; i < p->n; i++)
                pthread_join(p->tids[i], NULL);
            free(p->tids);
            pthread_mutex_destroy(&p->mu);
            pthread_cond_destroy(&p->go);
            pthread_cond_destroy(&p->done);
            free(p);
        }
        if (c->scratch)
            for (int i = 0; i < c->threads; i++)
                free(c->scratch[i]);
        free(c->scratch);
        for (int i = 0; i < c->n_luts; i++)
            free(c->luts[i]);
        free(c->luts);
        pthread_mutex_destroy(&c->luts_mu);
        free(c);
    }
    free(be);
}

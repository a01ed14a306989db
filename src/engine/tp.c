/* engine/tp: tensor-parallel ranks under one engine.
 *
 * Rank r has its own backend (GPU r, or a CPU backend with its share of the
 * threads), its own shard of the model and its own copy of every engine
 * buffer. The engine does not know: it talks to a virtual backend whose
 * memory is "rank 0's address, and the same offset in every other rank's
 * allocation", and whose ops run on every rank with the addresses mapped.
 * Model passes run on all ranks at once, one thread each (rank 0 on the
 * engine's thread), because their collectives need every rank in flight.
 *
 * Rank context: inside sd__tp_each, a thread works for one rank only; the
 * virtual ops and graph calls made there act on that rank alone, so a
 * function written for one backend (a pass and its capture into a graph)
 * runs unchanged per rank. Outside it (the engine thread between passes),
 * an op runs on every rank in turn; downloads read rank 0, which holds the
 * same bits as every other rank (the all-reduce gives all ranks one sum).
 *
 * A rank that fails inside a pass aborts the communicator, so the others
 * return instead of waiting for it; the engine then fails the step. */
#include "engine/tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#ifdef SD_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#ifdef SD_HAVE_NCCL
#include "comm/gpu_comm.h"
#endif
#endif

typedef struct tp_alloc {
    uintptr_t base; /* rank 0's address: the virtual address */
    size_t bytes;
    void *p[SD_TP_MAX];
} tp_alloc;

typedef struct tp_graph {
    void *g[SD_TP_MAX];
} tp_graph;

struct sd_tp {
    int n;     /* ranks of this process (node) */
    int rank0; /* global rank of local rank 0: node_rank * n */
    int total; /* ranks of all nodes (--tp) */
    sd_nodes *nodes; /* several nodes: the group (NULL on one node) */
    sd_backend *be[SD_TP_MAX];
    sd_comm *comm; /* what the models use: the thread comm, or the GPU comm */
    sd_comm *nccl; /* GPU ranks: NCCL, and the custom all-reduce with its table */
    void *car;
    int forced; /* --allreduce: an algorithm, or -1 (timed) */
    size_t comm_bytes;
    char table_metrics[4096];
    sd_backend vbe;
    sd_ops ops;
    tp_alloc *allocs; /* sorted by base */
    int n_allocs, cap_allocs;
    pthread_mutex_t mu; /* guards allocs against workers' lookups, graphs */
    /* workers (ranks 1..n-1) */
    pthread_t th[SD_TP_MAX];
    int started;
    pthread_mutex_t jmu;
    pthread_cond_t jcv, dcv;
    uint64_t gen;
    int quit, done;
    int (*fn)(void *ctx, int rank, sd_err *err);
    void *ctx;
    int rc[SD_TP_MAX];
    sd_err errs[SD_TP_MAX];
};

static _Thread_local int tls_rank = -1;

int sd__tp_rank(void) { return tls_rank; }
int sd__tp_size(const sd_tp *t) { return t ? t->n : 1; }
int sd__tp_rank0(const sd_tp *t) { return t ? t->rank0 : 0; }
int sd__tp_total(const sd_tp *t) { return t ? t->total : 1; }
sd_nodes *sd__tp_nodes(sd_tp *t) { return t ? t->nodes : NULL; }
sd_backend *sd__tp_backend(sd_tp *t) { return &t->vbe; }
sd_backend *sd__tp_rank_backend(sd_tp *t, int r) { return t->be[r]; }
sd_comm *sd__tp_comm(sd_tp *t) { return t->comm; }

/* ---- address map ---- */

static tp_alloc *find(sd_tp *t, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int lo = 0, hi = t->n_allocs - 1, at = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t->allocs[mid].base <= a) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (at < 0 || a > t->allocs[at].base + t->allocs[at].bytes)
        return NULL;
    return &t->allocs[at];
}

const void *sd__tp_map(sd_tp *t, const void *p, int r)
{
    if (!p || r == 0)
        return p;
    pthread_mutex_lock(&t->mu);
    tp_alloc *a = find(t, p);
    const void *q = a ? (const char *)a->p[r] + ((uintptr_t)p - a->base) : NULL;
    pthread_mutex_unlock(&t->mu);
    return q;
}

#define M(p, r) ((__typeof__(p))(uintptr_t)sd__tp_map(t, (p), (r)))

/* the ranks an op acts on: this thread's, or all of them */
#define RANKS(t, r)                                                                                \
    for (int r = tls_rank >= 0 ? tls_rank : 0, r##_end = tls_rank >= 0 ? tls_rank + 1 : (t)->n;   \
         r < r##_end; r++)

static sd_tp *tp_of(sd_backend *vb) { return vb->impl; }

static void *v_alloc(sd_backend *vb, size_t bytes)
{
    sd_tp *t = tp_of(vb);
    tp_alloc a = {.bytes = bytes};
    for (int r = 0; r < t->n; r++) {
        a.p[r] = t->be[r]->ops->alloc(t->be[r], bytes);
        if (!a.p[r]) {
            while (r-- > 0)
                t->be[r]->ops->free(t->be[r], a.p[r]);
            return NULL;
        }
    }
    a.base = (uintptr_t)a.p[0];
    pthread_mutex_lock(&t->mu);
    if (t->n_allocs == t->cap_allocs) {
        int cap = t->cap_allocs ? 2 * t->cap_allocs : 64;
        tp_alloc *na = realloc(t->allocs, (size_t)cap * sizeof *na);
        if (!na) {
            pthread_mutex_unlock(&t->mu);
            for (int r = 0; r < t->n; r++)
                t->be[r]->ops->free(t->be[r], a.p[r]);
            return NULL;
        }
        t->allocs = na;
        t->cap_allocs = cap;
    }
    int i = t->n_allocs;
    while (i > 0 && t->allocs[i - 1].base > a.base) {
        t->allocs[i] = t->allocs[i - 1];
        i--;
    }
    t->allocs[i] = a;
    t->n_allocs++;
    pthread_mutex_unlock(&t->mu);
    return a.p[0];
}

static void v_free(sd_backend *vb, void *p)
{
    sd_tp *t = tp_of(vb);
    if (!p)
        return;
    pthread_mutex_lock(&t->mu);
    tp_alloc *a = find(t, p);
    if (a && a->base == (uintptr_t)p) {
        for (int r = 0; r < t->n; r++)
            t->be[r]->ops->free(t->be[r], a->p[r]);
        int i = (int)(a - t->allocs);
        memmove(a, a + 1, (size_t)(t->n_allocs - i - 1) * sizeof *a);
        t->n_allocs--;
    }
    pthread_mutex_unlock(&t->mu);
}

static int v_upload(sd_backend *vb, void *dst, const void *src, size_t bytes)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = t->be[r]->ops->upload(t->be[r], M(dst, r), src, bytes);
    return rc;
}

static int v_upload2d(sd_backend *vb, void *dst, size_t dpitch, const void *src, size_t spitch,
                      size_t width, size_t rows)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = t->be[r]->ops->upload2d(t->be[r], M(dst, r), dpitch, src, spitch, width, rows);
    return rc;
}

/* the rank a download reads: this thread's, or rank 0 (every rank holds
 * the same tokens and logits) */
static int read_rank(void) { return tls_rank >= 0 ? tls_rank : 0; }

static int v_download(sd_backend *vb, void *dst, const void *src, size_t bytes)
{
    sd_tp *t = tp_of(vb);
    int r = read_rank();
    return t->be[r]->ops->download(t->be[r], dst, M(src, r), bytes);
}

static int v_copy(sd_backend *vb, void *dst, const void *src, size_t bytes)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = t->be[r]->ops->copy(t->be[r], M(dst, r), M(src, r), bytes);
    return rc;
}

/* A queued download comes from one rank, as v_download's does (every rank
 * holds the same argmax), and its mark is that rank's. The other ranks'
 * inputs of the step it ends went up before the step's collectives, which
 * that rank has finished too: the engine may rewrite them after the wait. */
static int v_download_async(sd_backend *vb, void *dst, const void *src, size_t bytes, int ev)
{
    sd_tp *t = tp_of(vb);
    int r = read_rank();
    return t->be[r]->ops->download_async(t->be[r], dst, M(src, r), bytes, ev);
}

static int v_download_wait(sd_backend *vb, int ev)
{
    sd_tp *t = tp_of(vb);
    int r = read_rank();
    return t->be[r]->ops->download_wait(t->be[r], ev);
}

static int v_memset0(sd_backend *vb, void *dst, size_t bytes)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = t->be[r]->ops->memset0(t->be[r], M(dst, r), bytes);
    return rc;
}

static int v_sync(sd_backend *vb)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    {
        int x = t->be[r]->ops->sync(t->be[r]);
        rc = rc ? rc : x;
    }
    return rc;
}

/* rank 0's (its thread is the caller's; every rank meets the same shapes) */
static long v_gemm_trials(sd_backend *vb)
{
    sd_tp *t = tp_of(vb);
    return t->be[0]->ops->gemm_trials(t->be[0]);
}

static int v_mem_info(sd_backend *vb, size_t *free_bytes, size_t *total_bytes)
{
    sd_tp *t = tp_of(vb);
    *free_bytes = *total_bytes = 0;
    for (int r = 0; r < t->n; r++) {
        size_t f = 0, tot = 0;
        if (!t->be[r]->ops->mem_info || t->be[r]->ops->mem_info(t->be[r], &f, &tot))
            return -1;
        /* the CPU ranks share one memory: its free bytes, not their sum */
        if (r == 0 || f < *free_bytes)
            *free_bytes = f;
        if (r == 0 || tot < *total_bytes)
            *total_bytes = tot;
    }
    return 0;
}

static void v_gather_rows(sd_backend *vb, float *dst, const float *src, const int32_t *idx, int n,
                          int d, int ds, int ss)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->gather_rows(t->be[r], M(dst, r), M(src, r), M(idx, r), n, d, ds, ss);
}

static void v_copy2d(sd_backend *vb, float *dst, const float *src, int n, int d, int ds, int ss)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->copy2d(t->be[r], M(dst, r), M(src, r), n, d, ds, ss);
}

static void v_argmax_rows(sd_backend *vb, int32_t *out, const float *x, int n, int V)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->argmax_rows(t->be[r], M(out, r), M(x, r), n, V);
}

static void v_gather_i32(sd_backend *vb, int32_t *out, const int32_t *table, const int32_t *idx,
                         int n)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->gather_i32(t->be[r], M(out, r), M(table, r), M(idx, r), n);
}

static void v_sample_rows(sd_backend *vb, int32_t *out, float *probs_scratch, const float *logits,
                          const sd_sample_params *p, int n, int V)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->sample_rows(t->be[r], M(out, r), M(probs_scratch, r), M(logits, r), M(p, r), n,
                               V);
}

static void v_scatter_cols(sd_backend *vb, float *dst, const float *src, const int32_t *map, int n,
                           int ws, int wd)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->scatter_cols(t->be[r], M(dst, r), M(src, r), M(map, r), n, ws, wd);
}

static void v_accept_sample_rows(sd_backend *vb, int32_t *n_acc, int32_t *out_tok,
                                 float *probs_scratch, const float *logits, const int32_t *row0,
                                 const float *q, const int32_t *draft, const int32_t *n_draft,
                                 const sd_sample_params *p, int n_seq, int k, int V)
{
    sd_tp *t = tp_of(vb);
    RANKS(t, r)
    t->be[r]->ops->accept_sample_rows(t->be[r], M(n_acc, r), M(out_tok, r), M(probs_scratch, r),
                                      M(logits, r), M(row0, r), M(q, r), M(draft, r),
                                      M(n_draft, r), M(p, r), n_seq, k, V);
}

static int v_graph_begin(sd_backend *vb)
{
    sd_tp *t = tp_of(vb);
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = t->be[r]->ops->graph_begin(t->be[r]);
    return rc;
}

/* every rank ends its own capture into the one handle they share */
static int v_graph_end(sd_backend *vb, void **graph)
{
    sd_tp *t = tp_of(vb);
    pthread_mutex_lock(&t->mu);
    if (!*graph)
        *graph = calloc(1, sizeof(tp_graph));
    tp_graph *g = *graph;
    pthread_mutex_unlock(&t->mu);
    int rc = 0;
    RANKS(t, r)
    {
        void *rg = NULL;
        int x = t->be[r]->ops->graph_end(t->be[r], &rg);
        if (g)
            g->g[r] = rg;
        else if (rg)
            t->be[r]->ops->graph_free(t->be[r], rg);
        rc = rc ? rc : x;
    }
    return g ? rc : SD_ENOMEM;
}

static int v_graph_launch(sd_backend *vb, void *graph)
{
    sd_tp *t = tp_of(vb);
    tp_graph *g = graph;
    int rc = 0;
    RANKS(t, r)
    if (!rc)
        rc = g->g[r] ? t->be[r]->ops->graph_launch(t->be[r], g->g[r]) : SD_EINVAL;
    return rc;
}

static void v_graph_free(sd_backend *vb, void *graph)
{
    sd_tp *t = tp_of(vb);
    tp_graph *g = graph;
    if (!g)
        return;
    for (int r = 0; r < t->n; r++)
        if (g->g[r])
            t->be[r]->ops->graph_free(t->be[r], g->g[r]);
    free(g);
}

/* ---- rank threads ---- */

static void run_rank(sd_tp *t, int r)
{
    tls_rank = r;
    memset(&t->errs[r], 0, sizeof t->errs[r]);
#ifdef SD_HAVE_CUDA
    /* The rank's GPU current on this thread: rank 0 runs on the engine's
     * thread, which issues ops to every rank in turn between passes and so
     * is left on whichever GPU came last; the collectives and the autotune's
     * buffers go to the current device. */
    if (t->be[r]->device >= 0 && (t->rc[r] = sd_cuda_make_current(t->be[r]))) {
        sd_err_set(&t->errs[r], t->rc[r], "rank %d: cannot make GPU %d current: %s", r,
                   t->be[r]->device, sd_cuda_backend_error(t->be[r]));
        if (t->comm)
            sd_comm_abort(t->comm);
        tls_rank = -1;
        return;
    }
#endif
    t->rc[r] = t->fn(t->ctx, r, &t->errs[r]);
    if (t->rc[r] && t->comm)
        sd_comm_abort(t->comm); /* the others may wait for this rank */
    tls_rank = -1;
}

typedef struct worker_arg {
    sd_tp *t;
    int r;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    sd_tp *t = w->t;
    int r = w->r;
    free(w);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->jmu);
        while (!t->quit && t->gen == seen)
            pthread_cond_wait(&t->jcv, &t->jmu);
        if (t->quit) {
            pthread_mutex_unlock(&t->jmu);
            return NULL;
        }
        seen = t->gen;
        pthread_mutex_unlock(&t->jmu);
        run_rank(t, r);
        pthread_mutex_lock(&t->jmu);
        t->done++;
        pthread_cond_signal(&t->dcv);
        pthread_mutex_unlock(&t->jmu);
    }
}

int sd__tp_each(sd_tp *t, int (*fn)(void *ctx, int rank, sd_err *err), void *ctx, sd_err *err)
{
    if (tls_rank >= 0) /* already in a rank's context */
        return fn(ctx, tls_rank, err);
    pthread_mutex_lock(&t->jmu);
    t->fn = fn;
    t->ctx = ctx;
    t->done = 0;
    t->gen++;
    pthread_cond_broadcast(&t->jcv);
    pthread_mutex_unlock(&t->jmu);
    run_rank(t, 0);
    pthread_mutex_lock(&t->jmu);
    while (t->done < t->n - 1)
        pthread_cond_wait(&t->dcv, &t->jmu);
    pthread_mutex_unlock(&t->jmu);
    /* the first rank that failed for its own reason (not the abort) speaks */
    for (int r = 0; r < t->n; r++)
        if (t->rc[r] && t->rc[r] != SD_ECANCELED) {
            if (err && !err->msg[0])
                *err = t->errs[r];
            return t->rc[r];
        }
    for (int r = 0; r < t->n; r++)
        if (t->rc[r]) {
            if (err && !err->msg[0])
                *err = t->errs[r];
            return t->rc[r];
        }
    return 0;
}

#if defined(SD_HAVE_CUDA) && defined(SD_HAVE_NCCL)
struct tune_job {
    sd_tp *t;
    const size_t *sizes;
    int n_sizes, forced;
    sd_ar_table table;
};

static int tune_rank(void *ctx, int r, sd_err *err)
{
    struct tune_job *j = ctx;
    sd_ar_table tb;
    int rc = sd_ar_autotune(j->t->nccl, (sd_car *)j->t->car, j->t->rank0 + r, j->sizes, j->n_sizes, j->forced, 20,
                            &tb, err);
    if (!rc && r == 0)
        j->table = tb;
    return rc;
}

/* The GPU ranks' communicator: the topology printed, the custom all-reduce
 * where P2P allows it, and per message size the fastest correct of NCCL,
 * one-shot and two-shot timed on this machine (the sizes of the residual
 * all-reduce of steps of 1..512 tokens). Without P2P: NCCL alone. */
static int gpu_comm(sd_tp *t, const sd_opts *o, int hidden, const int *devs, void *const *streams,
                    sd_err *err)
{
    sd_topo topo;
    sd_err terr = {0};
    if (sd_topo_probe(&topo, &terr) == 0) {
        char buf[4096];
        sd_topo_format(&topo, buf, sizeof buf);
        sd_log_info("topology:\n%s", buf);
    } else {
        sd_log_warn("topology probe: %s", terr.msg);
    }
    int forced = sd_ar_algo_parse(o->allreduce ? o->allreduce : "auto");
    if (forced < -1)
        return sd_err_set(err, SD_EINVAL, "--allreduce %s: unknown", o->allreduce);
    sd_car *car = NULL;
    sd_err cerr = {0};
    if (t->nodes) { /* no P2P between nodes: NCCL for every size */
        if (forced > 0)
            return sd_err_set(err, SD_ENOTSUP,
                              "--allreduce %s: a P2P all-reduce of one node; several nodes use "
                              "NCCL",
                              o->allreduce);
        forced = SD_AR_NCCL;
    }
    if (forced != SD_AR_NCCL &&
        sd_car_create(&car, t->n, devs, streams, (size_t)(512 * hidden) * sizeof(float), &cerr)) {
        if (forced > 0)
            return sd_err_set(err, SD_ENOTSUP, "--allreduce %s: %s", o->allreduce, cerr.msg);
        sd_log_warn("custom all-reduce unavailable (%s): NCCL only", cerr.msg);
        car = NULL;
    }
    t->car = car;
    t->forced = car ? forced : SD_AR_NCCL;
    t->comm_bytes = car ? sd_car_buffer_bytes(car) : 0;
    /* NCCL for every size until sd__tp_tune has timed the real ones */
    sd_ar_table none = {0};
    return sd_gpu_comm_create(&t->comm, t->nccl, car, &none, err);
}
#endif

int sd__tp_tune(sd_tp *t, const size_t *sizes, int n_sizes, sd_err *err)
{
    if (!t || !t->nccl)
        return 0; /* CPU ranks: the thread comm has nothing to choose */
#if defined(SD_HAVE_CUDA) && defined(SD_HAVE_NCCL)
    struct tune_job j = {.t = t, .sizes = sizes, .n_sizes = n_sizes, .forced = t->forced};
    int rc = sd__tp_each(t, tune_rank, &j, err);
    if (rc)
        return rc;
    char buf[4096];
    sd_ar_table_format(&j.table, buf, sizeof buf);
    sd_log_info("all-reduce choice per message size:\n%s", buf);
    sd_ar_table_metrics(&j.table, t->table_metrics, sizeof t->table_metrics);
    return sd_gpu_comm_set_table(t->comm, &j.table);
#else
    (void)sizes;
    (void)n_sizes;
    (void)err;
    return 0;
#endif
}

size_t sd__tp_comm_bytes(const sd_tp *t) { return t ? t->comm_bytes : 0; }
const char *sd__tp_metrics(const sd_tp *t) { return t ? t->table_metrics : ""; }

/* ---- open / close ---- */

void sd__tp_close(sd_tp *t)
{
    if (!t)
        return;
    if (t->started) {
        pthread_mutex_lock(&t->jmu);
        t->quit = 1;
        pthread_cond_broadcast(&t->jcv);
        pthread_mutex_unlock(&t->jmu);
        for (int r = 1; r <= t->started; r++)
            pthread_join(t->th[r], NULL);
    }
    for (int i = 0; i < t->n_allocs; i++)
        for (int r = 0; r < t->n; r++)
            t->be[r]->ops->free(t->be[r], t->allocs[i].p[r]);
    free(t->allocs);
    if (t->comm != t->nccl)
        sd_comm_destroy(t->comm);
#if defined(SD_HAVE_CUDA) && defined(SD_HAVE_NCCL)
    sd_car_destroy((sd_car *)t->car);
#endif
    sd_comm_destroy(t->nccl);
    for (int r = 0; r < t->n; r++)
        sd_backend_close(t->be[r]);
    sd_nodes_close(t->nodes);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->jmu);
    pthread_cond_destroy(&t->jcv);
    pthread_cond_destroy(&t->dcv);
    free(t);
}

int sd__tp_open(sd_tp **out, const sd_opts *o, int hidden, sd_err *err)
{
    *out = NULL;
    int n = o->tp;
    if (n < 2 || n > SD_TP_MAX)
        return sd_err_set(err, SD_EINVAL, "--tp %d: 2..%d ranks for the tensor-parallel engine", n,
                          SD_TP_MAX);
    int nnodes = o->nnodes > 1 ? o->nnodes : 1;
    if (n % nnodes)
        return sd_err_set(err, SD_EINVAL, "--tp %d: not a multiple of --nnodes %d", n, nnodes);
    sd_tp *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->total = n;
    n /= nnodes; /* ranks of this node */
    t->n = n;
    t->rank0 = o->node_rank * n;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->jmu, NULL);
    pthread_cond_init(&t->jcv, NULL);
    pthread_cond_init(&t->dcv, NULL);
    int rc = 0;
    if (nnodes > 1) {
        /* The settings every node must share to take the same steps. */
        char fp[512] = {0}; /* sent whole: no stray bytes past the text */
        /* the device as it will open (auto: cuda where a GPU is visible), so
         * a GPU node and a CPU node are told apart before their collectives
         * (NCCL and TCP) could talk past each other */
        const char *dev = sd_backend_kind(o);
        snprintf(fp, sizeof fp,
                 "specd tp %d nnodes %d device %s spec %s k %d ngram %d context %d block %d "
                 "kv_blocks %d batch %d tokens %d graphs %d %d seed %lld prefix_cache %d",
                 o->tp, nnodes, dev, o->spec ? o->spec : "",
                 o->spec_k, o->ngram_n, o->max_context, o->block_size, o->kv_blocks,
                 o->max_batch, o->max_batch_tokens, o->cuda_graph_max_bs,
                 o->cuda_graph_prompt_rows, o->seed, o->prefix_cache);
        rc = sd_nodes_open(&t->nodes, nnodes, o->node_rank, o->dist_init_addr, fp, sizeof fp,
                           120.0, err);
        if (rc)
            goto fail;
        sd_log_info("node %d of %d: ranks %d..%d of %d", o->node_rank, nnodes, t->rank0,
                    t->rank0 + n - 1, t->total);
    }
    for (int r = 0; r < n && !rc; r++) {
        rc = sd_backend_open_rank(&t->be[r], o, r, n, err);
        if (!rc)
            t->be[r]->rank = t->rank0 + r;
    }
    if (rc)
        goto fail;
    t->ops = (sd_ops){.name = t->be[0]->ops->name,
                      .alloc = v_alloc,
                      .free = v_free,
                      .upload = v_upload,
                      .download = v_download,
                      .memset0 = v_memset0,
                      .sync = v_sync,
                      .mem_info = v_mem_info,
                      .gather_rows = v_gather_rows,
                      .copy2d = v_copy2d,
                      .argmax_rows = t->be[0]->ops->argmax_rows ? v_argmax_rows : NULL,
                      .upload2d = v_upload2d,
                      .accept_sample_rows =
                          t->be[0]->ops->accept_sample_rows ? v_accept_sample_rows : NULL,
                      .sample_rows = t->be[0]->ops->sample_rows ? v_sample_rows : NULL,
                      .scatter_cols = t->be[0]->ops->scatter_cols ? v_scatter_cols : NULL,
                      .gather_i32 = t->be[0]->ops->gather_i32 ? v_gather_i32 : NULL,
                      .gemm_trials = t->be[0]->ops->gemm_trials ? v_gemm_trials : NULL};
    if (t->be[0]->ops->copy && t->be[0]->ops->download_async && t->be[0]->ops->download_wait) {
        t->ops.copy = v_copy;
        t->ops.download_async = v_download_async;
        t->ops.download_wait = v_download_wait;
    }
    if (t->be[0]->ops->graph_begin) {
        t->ops.graph_begin = v_graph_begin;
        t->ops.graph_end = v_graph_end;
        t->ops.graph_launch = v_graph_launch;
        t->ops.graph_free = v_graph_free;
    }
    t->vbe = (sd_backend){.ops = &t->ops, .device = t->be[0]->device, .rank = 0, .impl = t};
    for (int r = 1; r < n; r++) {
        worker_arg *w = malloc(sizeof *w);
        if (w)
            *w = (worker_arg){t, r};
        if (!w || pthread_create(&t->th[r], NULL, worker, w) != 0) {
            free(w);
            rc = sd_err_set(err, SD_ENOMEM, "cannot start the thread of rank %d", r);
            break;
        }
        t->started = r; /* threads 1..r run */
    }
    if (rc)
        goto fail;
    /* the communicator last: the GPU autotune runs on the rank threads */
    if (t->be[0]->device < 0) {
        if (o->allreduce && strcmp(o->allreduce, "auto")) {
            rc = sd_err_set(err, SD_ENOTSUP,
                            "--allreduce %s: a GPU all-reduce; CPU ranks sum through threads",
                            o->allreduce);
            goto fail;
        }
        rc = t->nodes ? sd_node_comm_create(&t->comm, t->nodes, n, err)
                      : sd_thread_comm_create(&t->comm, n, err);
    } else {
#if defined(SD_HAVE_CUDA) && defined(SD_HAVE_NCCL)
        int devs[SD_TP_MAX];
        void *streams[SD_TP_MAX];
        for (int r = 0; r < n; r++) {
            devs[r] = t->be[r]->device;
            streams[r] = sd_cuda_stream(t->be[r]);
        }
        sd_nccl_opts no = {.n_local = n, .devices = devs, .streams = streams, .nnodes = nnodes,
                           .node_rank = o->node_rank, .nodes = t->nodes,
                           .timeout_s = 60};
        rc = sd_nccl_comm_create(&t->nccl, &no, err);
        if (!rc)
            rc = gpu_comm(t, o, hidden, devs, streams, err);
#else
        rc = sd_err_set(err, SD_ENOTSUP, "--tp %d on GPUs needs a build with NCCL", n);
#endif
    }
    if (rc)
        goto fail;
    sd_log_info("tensor parallel: %d ranks on %s, %s", n, t->ops.name, sd_comm_name(t->comm));
    *out = t;
    return 0;
fail:
    sd__tp_close(t);
    return rc;
}

/* comm: the entry points, shared checks, then the implementation's vtable;
 * and the call counts (comm.h). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

/* ---- counts */

/* The calls each captured graph queues. Grown at record_end (outside any
 * collective); a key recorded again (a graph re-captured at the same
 * address) is replaced. */
struct sd_comm_graphs {
    int n, cap;
    const void **key;
    sd_comm_counts *d;
};

/* Every counter of sd_comm_counts, in order (they are all uint64_t). */
#define N_WORDS (sizeof(sd_comm_counts) / sizeof(uint64_t))
_Static_assert(sizeof(sd_comm_counts) % sizeof(uint64_t) == 0, "sd_comm_counts: uint64_t only");

static void add_word(uint64_t *w, uint64_t v)
{
    __atomic_fetch_add(w, v, __ATOMIC_RELAXED);
}

/* where rank 0's calls go now: the counts, or the graph being recorded */
static sd_comm_counts *tally(sd_comm *c)
{
    return __atomic_load_n(&c->recording, __ATOMIC_RELAXED) ? &c->pending : &c->counts;
}

static void count_call(sd_comm *c, int rank, int allreduce, int residual, size_t n)
{
    if (rank != 0)
        return;
    sd_comm_counts *k = tally(c);
    if (allreduce) {
        add_word(&k->allreduce_calls, 1);
        add_word(&k->allreduce_floats, n);
        add_word(&k->residual_calls, residual ? 1 : 0);
    } else {
        add_word(&k->allgather_calls, 1);
        add_word(&k->allgather_floats, n);
    }
}

void sd_comm_count_path(sd_comm *c, int rank, int path, size_t n, uint64_t est_ns)
{
    if (!c || rank != 0 || path < 0 || path >= SD_COMM_PATHS)
        return;
    sd_comm_counts *k = tally(c);
    add_word(&k->path_calls[path], 1);
    add_word(&k->path_floats[path], n);
    if (est_ns) {
        add_word(&k->est_ns, est_ns);
        add_word(&k->est_calls, 1);
    }
}

void sd_comm_get_counts(const sd_comm *c, sd_comm_counts *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    const uint64_t *src = (const uint64_t *)&c->counts;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < N_WORDS; i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

static void add_counts(sd_comm_counts *to, const sd_comm_counts *d)
{
    uint64_t *t = (uint64_t *)to;
    const uint64_t *s = (const uint64_t *)d;
    for (size_t i = 0; i < N_WORDS; i++)
        if (s[i])
            add_word(&t[i], s[i]);
}

void sd_comm_record_begin(sd_comm *c)
{
    if (!c)
        return;
    memset(&c->pending, 0, sizeof c->pending);
    __atomic_store_n(&c->recording, 1, __ATOMIC_RELAXED);
}

int sd_comm_record_end(sd_comm *c, const void *key)
{
    if (!c)
        return 0;
    __atomic_store_n(&c->recording, 0, __ATOMIC_RELAXED);
    struct sd_comm_graphs *g = c->graphs;
    if (!g && !(g = c->graphs = calloc(1, sizeof *g)))
        return SD_ENOMEM;
    int i = 0;
    while (i < g->n && g->key[i] != key)
        i++;
    if (i == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        const void **k = realloc(g->key, (size_t)cap * sizeof *k);
        if (k)
            g->key = k;
        sd_comm_counts *d = k ? realloc(g->d, (size_t)cap * sizeof *d) : NULL;
        if (!d)
            return SD_ENOMEM;
        g->d = d;
        g->cap = cap;
    }
    g->key[i] = key;
    g->d[i] = c->pending;
    if (i == g->n)
        g->n++;
    return 0;
}

void sd_comm_replayed(sd_comm *c, const void *key)
{
    if (!c)
        return;
    const struct sd_comm_graphs *g = c->graphs;
    for (int i = 0; g && i < g->n; i++)
        if (g->key[i] == key) {
            add_counts(&c->counts, &g->d[i]);
            return;
        }
    add_word(&c->counts.unrecorded_replays, 1);
}

/* ---- entry points */

static int bad_rank(const sd_comm *c, int rank)
{
    return !c || rank < 0 || rank >= c->size;
}

int sd_comm_allreduce_sum(sd_comm *c, int rank, float *buf, size_t n)
{
    if (bad_rank(c, rank) || (n && !buf))
        return SD_EINVAL;
    count_call(c, rank, 1, 0, n);
    return c->ops->allreduce_sum(c, rank, buf, n);
}

int sd_comm_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    if (bad_rank(c, rank) || (n && (!dst || !src)))
        return SD_EINVAL;
    count_call(c, rank, 0, 0, n);
    return c->ops->allgather(c, rank, dst, src, n);
}

int sd_comm_allreduce_add_rmsnorm(sd_comm *c, int rank, sd_backend *be, float *partial, float *x,
                                  float *xn, const sd_weight *w, int rows, int d, float eps)
{
    if (bad_rank(c, rank) || !be || !w || rows < 0 || d <= 0 ||
        (rows && (!partial || !x || !xn)))
        return SD_EINVAL;
    if (rows == 0)
        return 0;
    count_call(c, rank, 1, 1, (size_t)rows * (size_t)d);
    if (c->ops->allreduce_add_rmsnorm) {
        int rc = c->ops->allreduce_add_rmsnorm(c, rank, partial, x, xn, w, rows, d, eps);
        if (rc != SD_ENOTSUP)
            return rc;
    }
    int rc = c->ops->allreduce_sum(c, rank, partial, (size_t)rows * (size_t)d);
    if (rc)
        return rc;
    be->ops->add(be, x, partial, rows, d);
    be->ops->rmsnorm(be, xn, x, w, rows, d, d, d, eps);
    return 0;
}

int sd_comm_barrier(sd_comm *c, int rank)
{
    if (bad_rank(c, rank))
        return SD_EINVAL;
    return c->ops->barrier(c, rank);
}

void sd_comm_abort(sd_comm *c)
{
    if (c)
        c->ops->abort(c);
}

void sd_comm_destroy(sd_comm *c)
{
    if (!c)
        return;
    if (c->graphs) {
        free(c->graphs->key);
        free(c->graphs->d);
        free(c->graphs);
        c->graphs = NULL;
    }
    c->ops->destroy(c);
}

const char *sd_comm_name(const sd_comm *c)
{
    return c ? c->ops->name : "none";
}

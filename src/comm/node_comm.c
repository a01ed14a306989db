/* comm/node_comm: collectives among CPU rank threads of several processes
 * (one per node), over the node group's TCP star.
 *
 * A collective: the local rank threads publish their buffers and meet (a
 * mutex, a condition variable, a generation count, as in the thread comm);
 * the last one to arrive does the node's network part while the others
 * wait: it packs the node's buffers in local rank order, node 0 gathers
 * every node's pack (global rank order: node k holds ranks k*n_local ..),
 * sums element by element in that order (rank 0 + rank 1 + ...: the thread
 * comm's bits) or concatenates, and sends the result back; then every local
 * buffer gets it. The staging buffer grows on the first call of a larger
 * size (the one allocation inside a collective in src/comm: this path is
 * for CPU ranks and tests, not for speed). A failed exchange aborts the
 * group and the comm: every rank, here and on the other nodes, returns an
 * error instead of waiting. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

#define NC_TIMEOUT_S 600.0 /* a peer busy that long in one step is gone */

enum { NC_SUM, NC_GATHER, NC_BARRIER };

typedef struct ncomm {
    sd_comm pub;
    sd_nodes *g;
    int nl, nn, rank0;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, aborted, rc;
    uint64_t gen;
    /* published per collective, by local rank */
    float *dst[SD_NODES_MAX];
    const float *src[SD_NODES_MAX];
    size_t n[SD_NODES_MAX];
    int kind[SD_NODES_MAX];
    float *stage; /* node 0: nn * nl * n (+ the result); others: nl * n */
    size_t cap;
} ncomm;

static int grow(ncomm *t, size_t floats)
{
    if (floats <= t->cap)
        return 0;
    float *p = realloc(t->stage, floats * sizeof(float));
    if (!p)
        return SD_ENOMEM;
    t->stage = p;
    t->cap = floats;
    return 0;
}

/* The node's network part of a collective of n floats per rank (under mu). */
static int exchange(ncomm *t, int kind, size_t n)
{
    sd_err err = {0};
    size_t per_node = (size_t)t->nl * n, all = (size_t)t->nn * per_node;
    size_t out = kind == NC_SUM ? n : all; /* what every rank receives */
    if (grow(t, all + out))
        return SD_ENOMEM;
    float *pack = t->stage, *res = t->stage + all;
    for (int r = 0; r < t->nl; r++)
        if (n)
            memcpy(pack + (size_t)r * n, t->src[r], n * sizeof(float));
    int rc = sd_nodes_gather(t->g, pack, pack, per_node * sizeof(float), NC_TIMEOUT_S, &err);
    if (!rc && sd_nodes_rank(t->g) == 0) {
        int P = t->nn * t->nl;
        if (kind == NC_SUM)
            for (size_t i = 0; i < n; i++) {
                float s = pack[i];
                for (int k = 1; k < P; k++)
                    s += pack[(size_t)k * n + i];
                res[i] = s;
            }
        else if (out)
            memcpy(res, pack, out * sizeof(float));
    }
    if (!rc)
        rc = sd_nodes_bcast(t->g, res, out * sizeof(float), NC_TIMEOUT_S, &err);
    if (rc)
        return rc;
    for (int r = 0; r < t->nl && kind != NC_BARRIER; r++)
        if (out)
            memcpy(t->dst[r], res, out * sizeof(float));
    return 0;
}

static int collective(ncomm *t, int rank, int kind, float *dst, const float *src, size_t n)
{
    int lr = rank - t->rank0;
    if (lr < 0 || lr >= t->nl)
        return SD_EINVAL;
    pthread_mutex_lock(&t->mu);
    if (t->aborted) {
        pthread_mutex_unlock(&t->mu);
        return SD_ECANCELED;
    }
    t->dst[lr] = dst;
    t->src[lr] = src;
    t->n[lr] = n;
    t->kind[lr] = kind;
    uint64_t g = t->gen;
    int rc;
    if (++t->arrived == t->nl) {
        rc = 0;
        for (int r = 1; r < t->nl; r++)
            if (t->n[r] != t->n[0] || t->kind[r] != t->kind[0])
                rc = SD_EINVAL; /* ranks out of step: a bug, never a hang */
        /* the network part holds mu: the other local ranks wait anyway */
        if (!rc)
            rc = exchange(t, kind, n);
        if (rc) {
            t->aborted = 1;
            sd_nodes_abort(t->g);
        }
        t->rc = rc;
        t->arrived = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv);
    } else {
        while (t->gen == g && !t->aborted)
            pthread_cond_wait(&t->cv, &t->mu);
        rc = t->gen == g ? SD_ECANCELED : t->rc;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int nc_allreduce(sd_comm *c, int rank, float *buf, size_t n)
{
    return collective((ncomm *)c, rank, NC_SUM, buf, buf, n);
}

static int nc_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    return collective((ncomm *)c, rank, NC_GATHER, dst, src, n);
}

static int nc_barrier(sd_comm *c, int rank)
{
    return collective((ncomm *)c, rank, NC_BARRIER, NULL, NULL, 0);
}

static void nc_abort(sd_comm *c)
{
    ncomm *t = (ncomm *)c;
    sd_nodes_abort(t->g);
    pthread_mutex_lock(&t->mu);
    t->aborted = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void nc_destroy(sd_comm *c)
{
    ncomm *t = (ncomm *)c;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->stage);
    free(t);
}

static const sd_comm_ops node_ops = {
    .name = "nodes",
    .allreduce_sum = nc_allreduce,
    .allgather = nc_allgather,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .destroy = nc_destroy,
};

int sd_node_comm_create(sd_comm **out, sd_nodes *g, int n_local, sd_err *err)
{
    *out = NULL;
    int nn = sd_nodes_count(g);
    if (!g || n_local < 1 || n_local > SD_NODES_MAX || nn * n_local > 4096)
        return sd_err_set(err, SD_EINVAL, "node comm: %d ranks on each of %d nodes", n_local, nn);
    ncomm *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->g = g;
    t->nl = n_local;
    t->nn = nn;
    t->rank0 = sd_nodes_rank(g) * n_local;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->pub = (sd_comm){.ops = &node_ops, .size = nn * n_local, .impl = t};
    *out = &t->pub;
    return 0;
}

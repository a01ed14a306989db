/* comm/thread_comm: collectives among the rank threads of one process (CPU).
 *
 * Every collective is publish, barrier, work, barrier:
 * - each rank publishes its buffer pointer and element count;
 * - after the first barrier every buffer is ready and readable;
 * - all-reduce: rank r owns the slice [n*r/size, n*(r+1)/size) of the
 *   elements, sums that slice over the ranks in rank order 0, 1, ..., size-1
 *   and writes the sum into every rank's buffer (slices are disjoint, so no
 *   two threads touch one element); all-gather: each rank copies every
 *   rank's source into its own destination;
 * - the second barrier keeps every buffer (and the published pointers)
 *   alive until nobody reads them, so a rank may start the next collective.
 * The barrier is a mutex and a condition variable with a generation count,
 * so ranks never spin (CI runs more rank threads than cores). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

typedef struct tcomm {
    sd_comm pub;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t gen; /* bumped when the last rank arrives */
    int aborted;
    /* published per collective, indexed by rank */
    float **buf;
    const float **src;
    size_t *n;
} tcomm;

/* Returns 0 once every rank has arrived, SD_ECANCELED if aborted first. */
static int tc_wait(tcomm *t)
{
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (t->aborted) {
        pthread_mutex_unlock(&t->mu);
        return SD_ECANCELED;
    }
    uint64_t g = t->gen;
    if (++t->arrived == t->pub.size) {
        t->arrived = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv);
    } else {
        while (t->gen == g && !t->aborted)
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->gen == g)
            rc = SD_ECANCELED;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* 1 if every rank published the same count (checked by every rank alike). */
static int same_counts(const tcomm *t)
{
    for (int k = 1; k < t->pub.size; k++)
        if (t->n[k] != t->n[0])
            return 0;
    return 1;
}

static int tc_allreduce(sd_comm *c, int rank, float *buf, size_t n)
{
    tcomm *t = (tcomm *)c;
    int P = c->size;
    if (P == 1)
        return 0;
    t->buf[rank] = buf;
    t->n[rank] = n;
    int rc = tc_wait(t);
    if (rc)
        return rc;
    int ok = same_counts(t);
    if (ok) {
        size_t b = n * (size_t)rank / (size_t)P, e = n * (size_t)(rank + 1) / (size_t)P;
        float *const *bufs = t->buf;
        for (size_t i = b; i < e; i++) {
            float s = bufs[0][i];
            for (int k = 1; k < P; k++)
                s += bufs[k][i];
            for (int k = 0; k < P; k++)
                bufs[k][i] = s;
        }
    }
    rc = tc_wait(t);
    return rc ? rc : ok ? 0 : SD_EINVAL;
}

static int tc_allgather(sd_comm *c, int rank, float *dst, const float *src, size_t n)
{
    tcomm *t = (tcomm *)c;
    int P = c->size;
    t->src[rank] = src;
    t->n[rank] = n;
    int rc = tc_wait(t);
    if (rc)
        return rc;
    int ok = same_counts(t);
    if (ok)
        for (int k = 0; k < P; k++) {
            float *d = dst + (size_t)k * n;
            if (d != t->src[k] && n)
                memcpy(d, t->src[k], n * sizeof(float));
        }
    rc = tc_wait(t);
    return rc ? rc : ok ? 0 : SD_EINVAL;
}

static int tc_barrier(sd_comm *c, int rank)
{
    (void)rank;
    return tc_wait((tcomm *)c);
}

static void tc_abort(sd_comm *c)
{
    tcomm *t = (tcomm *)c;
    pthread_mutex_lock(&t->mu);
    t->aborted = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void tc_destroy(sd_comm *c)
{
    tcomm *t = (tcomm *)c;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->buf);
    free((void *)t->src);
    free(t->n);
    free(t);
}

static const sd_comm_ops thread_ops = {
    .name = "thread",
    .allreduce_sum = tc_allreduce,
    .allgather = tc_allgather,
    .barrier = tc_barrier,
    .abort = tc_abort,
    .destroy = tc_destroy,
};

int sd_thread_comm_create(sd_comm **out, int size, sd_err *err)
{
    *out = NULL;
    if (size < 1 || size > 1024)
        return sd_err_set(err, SD_EINVAL, "thread comm: %d ranks (1..1024)", size);
    tcomm *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->buf = calloc((size_t)size, sizeof *t->buf);
    t->src = calloc((size_t)size, sizeof *t->src);
    t->n = calloc((size_t)size, sizeof *t->n);
    if (!t->buf || !t->src || !t->n) {
        free(t->buf);
        free((void *)t->src);
        free(t->n);
        free(t);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->pub = (sd_comm){.ops = &thread_ops, .size = size, .impl = t};
    *out = &t->pub;
    return 0;
}

/* The collectives' call counts (comm.h): every entry point counts rank 0's
 * call once, on any communicator (here the thread comm, P = 2..4 rank
 * threads), with its floats; a graph's capture is kept apart and counted at
 * each replay; a path with its estimated time adds to the estimate. */
#include <pthread.h>

#include "comm/comm.h"
#include "core/dtype.h"
#include "test.h"

#define MAXP 4
#define MAXF 4096

/* One step's calls, sizes drawn per run: an all-reduce of n_sum floats, a
 * residual step of rows x d, an empty residual step (rows 0: no collective),
 * an all-gather of n_gather floats per rank. */
typedef struct plan {
    int P;
    size_t n_sum, n_gather;
    int rows, d;
    sd_comm *comm;
    int rc[MAXP];
} plan;

typedef struct rank_arg {
    plan *p;
    int rank;
} rank_arg;

static void *rank_main(void *arg)
{
    rank_arg *a = arg;
    plan *p = a->p;
    int r = a->rank, rc = 0;
    sd_backend *be = NULL;
    float *buf = calloc(MAXF, sizeof(float)), *x = calloc(MAXF, sizeof(float)),
          *xn = calloc(MAXF, sizeof(float)), *all = calloc(MAXP * MAXF, sizeof(float));
    float w1[MAXF];
    for (int i = 0; i < MAXF; i++)
        w1[i] = 1;
    if (sd_cpu_backend_create(&be, 1) || !buf || !x || !xn || !all)
        rc = SD_ENOMEM;
    sd_weight w = {0};
    if (!rc && (rc = be->ops->weight(be, &w, w1, SD_DT_F32, 1, p->d)))
        w.data = NULL;
    if (!rc)
        rc = sd_comm_allreduce_sum(p->comm, r, buf, p->n_sum);
    if (!rc)
        rc = sd_comm_allreduce_add_rmsnorm(p->comm, r, be, buf, x, xn, &w, p->rows, p->d, 1e-6f);
    if (!rc)
        rc = sd_comm_allreduce_add_rmsnorm(p->comm, r, be, buf, x, xn, &w, 0, p->d, 1e-6f);
    if (!rc)
        rc = sd_comm_allgather(p->comm, r, all, buf, p->n_gather);
    if (be) {
        if (w.data)
            be->ops->weight_free(be, &w);
        sd_cpu_backend_destroy(be);
    }
    free(buf);
    free(x);
    free(xn);
    free(all);
    p->rc[r] = rc;
    if (rc)
        sd_comm_abort(p->comm);
    return NULL;
}

/* every rank makes the plan's calls once */
static int step(plan *p)
{
    pthread_t tid[MAXP];
    rank_arg args[MAXP];
    for (int r = 0; r < p->P; r++) {
        args[r] = (rank_arg){p, r};
        pthread_create(&tid[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < p->P; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < p->P; r++)
        if (p->rc[r])
            return p->rc[r];
    return 0;
}

static void draw(plan *p, uint64_t *s)
{
    p->n_sum = 1 + (size_t)sd_test_randf(s, 0, MAXF - 1);
    p->n_gather = 1 + (size_t)sd_test_randf(s, 0, MAXF - 1);
    p->d = 1 + (int)sd_test_randf(s, 0, 1023);
    p->rows = 1 + (int)sd_test_randf(s, 0, (float)(MAXF / p->d - 1));
}

/* the counts k should hold after `times` steps of p */
static void expect(const sd_comm_counts *k, const plan *p, uint64_t times)
{
    ASSERT_EQ(k->allreduce_calls, 2 * times);
    ASSERT_EQ(k->residual_calls, times);
    ASSERT_EQ(k->allreduce_floats, times * (p->n_sum + (size_t)p->rows * (size_t)p->d));
    ASSERT_EQ(k->allgather_calls, times);
    ASSERT_EQ(k->allgather_floats, times * p->n_gather);
}

TEST(every_collective_counts_once_per_call_with_its_floats_whatever_the_ranks)
{
    uint64_t s = sd_test_seed();
    for (int P = 2; P <= MAXP; P++) {
        plan p = {.P = P};
        draw(&p, &s);
        sd_err err = {0};
        ASSERT_MSG(sd_thread_comm_create(&p.comm, P, &err) == 0, "%s", err.msg);
        sd_comm_counts k;
        sd_comm_get_counts(p.comm, &k);
        ASSERT_EQ(k.allreduce_calls + k.allgather_calls, 0);
        int rc = 0;
        for (int i = 0; i < 3 && !rc; i++)
            rc = step(&p);
        ASSERT_EQ(rc, 0);
        sd_comm_get_counts(p.comm, &k);
        expect(&k, &p, 3);
        /* the thread comm has no paths and no timings */
        ASSERT_EQ(k.est_calls + k.est_ns + k.unrecorded_replays, 0);
        sd_comm_destroy(p.comm);
    }
    sd_comm_counts none;
    sd_comm_get_counts(NULL, &none);
    ASSERT_EQ(none.allreduce_calls, 0);
}

TEST(a_recorded_capture_counts_nothing_until_each_replay_counts_it_once)
{
    uint64_t s = sd_test_seed();
    plan p = {.P = 2}, q = {.P = 2};
    draw(&p, &s);
    draw(&q, &s);
    sd_err err = {0};
    ASSERT_MSG(sd_thread_comm_create(&p.comm, 2, &err) == 0, "%s", err.msg);
    q.comm = p.comm;
    int key_a, key_b, key_c; /* graph handles: any distinct addresses */
    ASSERT_EQ(step(&p), 0); /* one eager step: counted */
    sd_comm_record_begin(p.comm);
    ASSERT_EQ(step(&p), 0); /* the capture of graph a */
    ASSERT_EQ(sd_comm_record_end(p.comm, &key_a), 0);
    sd_comm_record_begin(p.comm);
    ASSERT_EQ(step(&q), 0); /* graph b: q's calls */
    ASSERT_EQ(sd_comm_record_end(p.comm, &key_b), 0);
    sd_comm_counts k;
    sd_comm_get_counts(p.comm, &k);
    expect(&k, &p, 1);
    int reps = 2 + (int)sd_test_randf(&s, 0, 5);
    for (int i = 0; i < reps; i++)
        sd_comm_replayed(p.comm, &key_a);
    sd_comm_get_counts(p.comm, &k);
    expect(&k, &p, 1 + (uint64_t)reps);
    sd_comm_replayed(p.comm, &key_b);
    sd_comm_get_counts(p.comm, &k);
    ASSERT_EQ(k.allreduce_calls, 2 * (2 + (uint64_t)reps));
    ASSERT_EQ(k.allgather_floats, (1 + (uint64_t)reps) * p.n_gather + q.n_gather);
    ASSERT_EQ(k.unrecorded_replays, 0);
    /* a graph never recorded: marked, its calls unknown */
    sd_comm_replayed(p.comm, &key_c);
    sd_comm_counts k2;
    sd_comm_get_counts(p.comm, &k2);
    ASSERT_EQ(k2.unrecorded_replays, 1);
    ASSERT_EQ(k2.allreduce_calls, k.allreduce_calls);
    /* recorded again under the same key (re-captured): replaced */
    sd_comm_record_begin(p.comm);
    ASSERT_EQ(step(&q), 0);
    ASSERT_EQ(sd_comm_record_end(p.comm, &key_a), 0);
    sd_comm_replayed(p.comm, &key_a);
    sd_comm_get_counts(p.comm, &k2);
    ASSERT_EQ(k2.allgather_floats, k.allgather_floats + q.n_gather);
    /* many graphs: the table grows */
    int keys[40];
    for (int i = 0; i < 40; i++) {
        sd_comm_record_begin(p.comm);
        ASSERT_EQ(step(&p), 0);
        ASSERT_EQ(sd_comm_record_end(p.comm, &keys[i]), 0);
    }
    sd_comm_get_counts(p.comm, &k);
    ASSERT_EQ(k.allreduce_calls, k2.allreduce_calls);
    for (int i = 39; i >= 0; i--)
        sd_comm_replayed(p.comm, &keys[i]);
    sd_comm_get_counts(p.comm, &k);
    ASSERT_EQ(k.allreduce_calls, k2.allreduce_calls + 80);
    ASSERT_EQ(k.unrecorded_replays, 1);
    sd_comm_destroy(p.comm);
}

TEST(a_path_counts_only_rank_0_and_adds_its_estimate)
{
    sd_comm *c = NULL;
    sd_err err = {0};
    ASSERT_MSG(sd_thread_comm_create(&c, 2, &err) == 0, "%s", err.msg);
    sd_comm_count_path(c, 0, 1, 1024, 9500);
    sd_comm_count_path(c, 1, 1, 1024, 9500); /* rank 1: not counted */
    sd_comm_count_path(c, 0, 3, 4096, 12000);
    sd_comm_count_path(c, 0, 0, 64, 0); /* no estimate */
    sd_comm_count_path(c, 0, SD_COMM_PATHS, 64, 5); /* no such path */
    sd_comm_count_path(NULL, 0, 0, 64, 5);
    sd_comm_counts k;
    sd_comm_get_counts(c, &k);
    ASSERT_EQ(k.path_calls[0], 1);
    ASSERT_EQ(k.path_calls[1], 1);
    ASSERT_EQ(k.path_calls[2], 0);
    ASSERT_EQ(k.path_calls[3], 1);
    ASSERT_EQ(k.path_floats[1], 1024);
    ASSERT_EQ(k.path_floats[3], 4096);
    ASSERT_EQ(k.est_ns, 21500);
    ASSERT_EQ(k.est_calls, 2);
    /* paths say how; the entry points count the calls */
    ASSERT_EQ(k.allreduce_calls, 0);
    sd_comm_destroy(c);
}

TEST_MAIN(T(every_collective_counts_once_per_call_with_its_floats_whatever_the_ranks),
          T(a_recorded_capture_counts_nothing_until_each_replay_counts_it_once),
          T(a_path_counts_only_rank_0_and_adds_its_estimate))

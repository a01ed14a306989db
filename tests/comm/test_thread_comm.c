/* The CPU thread communicator: sums in rank order (bit for bit), all-gather
 * layout, many sizes, back-to-back and concurrent use, mismatch and abort. */
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "comm/comm.h"
#include "test.h"

#define MAXP 8
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

typedef struct rank_ctx rank_ctx;
typedef int (*rank_fn)(rank_ctx *r);

typedef struct group {
    sd_comm *comm;
    int P;
    rank_fn fn;
    void *user;
} group;

struct rank_ctx {
    group *g;
    int rank;
    int rc;
    uint64_t rng;
};

static void *rank_main(void *arg)
{
    rank_ctx *r = arg;
    r->rc = r->g->fn(r);
    return NULL;
}

/* Runs fn on P threads (rank 0 on the caller); returns the first nonzero rc. */
static int run_group(group *g, rank_ctx *rs)
{
    pthread_t tid[MAXP];
    uint64_t seed = sd_test_seed();
    for (int r = 0; r < g->P; r++)
        rs[r] = (rank_ctx){.g = g, .rank = r, .rng = seed * 2654435761u + (uint64_t)r + 1};
    for (int r = 1; r < g->P; r++)
        if (pthread_create(&tid[r], NULL, rank_main, &rs[r]))
            return -100;
    rank_main(&rs[0]);
    for (int r = 1; r < g->P; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < g->P; r++)
        if (rs[r].rc)
            return rs[r].rc;
    return 0;
}

/* Short random pause so ranks arrive in a different order each call. */
static void jitter(rank_ctx *r)
{
    int k = (int)sd_test_randf(&r->rng, 0, 4);
    if (k == 0)
        sched_yield();
    else if (k == 1) {
        struct timespec ts = {0, (long)sd_test_randf(&r->rng, 0, 20000)};
        nanosleep(&ts, NULL);
    }
}

/* ---- all-reduce: every rank's buffer equals the serial rank-order sum */

static const size_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 31, 64, 100, 1000, 4097, 65536 + 3};

typedef struct ar_case {
    float *in[MAXP];  /* per rank input (max size) */
    float *want;      /* serial sum in rank order */
    int mismatches;   /* elements that differ bit-wise, summed over ranks */
} ar_case;

static int ar_rank(rank_ctx *r)
{
    ar_case *ac = r->g->user;
    size_t maxn = sizes[NELEM(sizes) - 1];
    float *buf = malloc((maxn ? maxn : 1) * sizeof(float));
    if (!buf)
        return -101;
    int bad = 0;
    for (size_t s = 0; s < NELEM(sizes); s++) {
        size_t n = sizes[s];
        memcpy(buf, ac->in[r->rank], n * sizeof(float));
        jitter(r);
        int rc = sd_comm_allreduce_sum(r->g->comm, r->rank, buf, n);
        if (rc) {
            free(buf);
            return rc;
        }
        /* want[] was computed for the largest n: element i's sum does not depend on n */
        if (n && memcmp(buf, ac->want, n * sizeof(float)))
            for (size_t i = 0; i < n; i++)
                bad += memcmp(&buf[i], &ac->want[i], sizeof(float)) != 0;
    }
    free(buf);
    __atomic_add_fetch(&ac->mismatches, bad, __ATOMIC_RELAXED);
    return 0;
}

TEST(allreduce_gives_every_rank_the_rank_order_sum_bit_for_bit_at_every_size)
{
    static const int Ps[] = {1, 2, 3, 4, 8};
    size_t maxn = sizes[NELEM(sizes) - 1];
    uint64_t rng = sd_test_seed();
    for (size_t pi = 0; pi < NELEM(Ps); pi++) {
        int P = Ps[pi];
        ar_case ac = {0};
        for (int r = 0; r < P; r++) {
            ac.in[r] = malloc(maxn * sizeof(float));
            for (size_t i = 0; i < maxn; i++)
                ac.in[r][i] = sd_test_randf(&rng, -1, 1) * (i % 3 == 0 ? 1e4f : 1.0f);
        }
        ac.want = malloc(maxn * sizeof(float));
        for (size_t i = 0; i < maxn; i++) {
            float s = ac.in[0][i];
            for (int r = 1; r < P; r++)
                s += ac.in[r][i];
            ac.want[i] = s;
        }
        sd_comm *c;
        sd_err err = {0};
        ASSERT_OK(sd_thread_comm_create(&c, P, &err));
        ASSERT_STR_EQ(sd_comm_name(c), "thread");
        group g = {.comm = c, .P = P, .fn = ar_rank, .user = &ac};
        rank_ctx rs[MAXP];
        int rc = run_group(&g, rs);
        sd_comm_destroy(c);
        for (int r = 0; r < P; r++)
            free(ac.in[r]);
        free(ac.want);
        ASSERT_EQ(rc, 0);
        ASSERT_MSG(ac.mismatches == 0, "P=%d: %d elements differ from the rank-order sum", P,
                   ac.mismatches);
    }
}

/* Values where the order of float additions shows: with a = 1e8, b = 1,
 * c = -1e8 (ranks 0, 1, 2), (a + b) + c = 0 but (a + c) + b = 1 and
 * (c + a) + b = 1, which is what summing in arrival order could give. */
typedef struct order_case {
    float got[3];
} order_case;

static int order_rank(rank_ctx *r)
{
    order_case *oc = r->g->user;
    static const float v[3] = {1e8f, 1.0f, -1e8f};
    int rc = 0;
    for (int it = 0; it < 200 && !rc; it++) {
        float x = v[r->rank];
        jitter(r);
        rc = sd_comm_allreduce_sum(r->g->comm, r->rank, &x, 1);
        if (!rc && it == 0)
            oc->got[r->rank] = x;
        else if (!rc && x != oc->got[r->rank])
            rc = -102; /* changed between calls: timing leaked into the result */
    }
    return rc;
}

TEST(allreduce_adds_rank_0_first_whatever_the_arrival_order)
{
    sd_comm *c;
    sd_err err = {0};
    ASSERT_OK(sd_thread_comm_create(&c, 3, &err));
    order_case oc = {{-1, -1, -1}};
    group g = {.comm = c, .P = 3, .fn = order_rank, .user = &oc};
    rank_ctx rs[MAXP];
    int rc = run_group(&g, rs);
    sd_comm_destroy(c);
    ASSERT_EQ(rc, 0);
    float want = (1e8f + 1.0f) + -1e8f; /* 0: rank 0 + rank 1 first */
    for (int r = 0; r < 3; r++)
        ASSERT_MSG(oc.got[r] == want, "rank %d got %g, want %g", r, oc.got[r], want);
}

/* ---- all-gather */

typedef struct ag_case {
    int inplace;
    int bad;
} ag_case;

static int ag_rank(rank_ctx *r)
{
    ag_case *ac = r->g->user;
    int P = r->g->P;
    for (size_t s = 0; s < NELEM(sizes); s++) {
        size_t n = sizes[s];
        float *dst = malloc((n * (size_t)P + 1) * sizeof(float));
        float *own = malloc((n + 1) * sizeof(float));
        if (!dst || !own) {
            free(dst);
            free(own);
            return -101;
        }
        for (size_t i = 0; i < n * (size_t)P; i++)
            dst[i] = -7.0f; /* poison */
        for (size_t i = 0; i < n; i++)
            own[i] = (float)(r->rank * 1000003 + (int)i);
        const float *src = own;
        if (ac->inplace) {
            memcpy(dst + (size_t)r->rank * n, own, n * sizeof(float));
            src = dst + (size_t)r->rank * n;
        }
        jitter(r);
        int rc = sd_comm_allgather(r->g->comm, r->rank, dst, src, n);
        for (int k = 0; k < P && !rc; k++)
            for (size_t i = 0; i < n; i++)
                if (dst[(size_t)k * n + i] != (float)(k * 1000003 + (int)i)) {
                    __atomic_add_fetch(&ac->bad, 1, __ATOMIC_RELAXED);
                    break;
                }
        free(dst);
        free(own);
        if (rc)
            return rc;
    }
    return 0;
}

TEST(allgather_concatenates_ranks_in_order_also_in_place)
{
    static const int Ps[] = {1, 2, 4, 5};
    for (int inplace = 0; inplace < 2; inplace++)
        for (size_t pi = 0; pi < NELEM(Ps); pi++) {
            sd_comm *c;
            sd_err err = {0};
            ASSERT_OK(sd_thread_comm_create(&c, Ps[pi], &err));
            ag_case ac = {.inplace = inplace};
            group g = {.comm = c, .P = Ps[pi], .fn = ag_rank, .user = &ac};
            rank_ctx rs[MAXP];
            int rc = run_group(&g, rs);
            sd_comm_destroy(c);
            ASSERT_EQ(rc, 0);
            ASSERT_MSG(ac.bad == 0, "P=%d in_place=%d: %d wrong blocks", Ps[pi], inplace, ac.bad);
        }
}

/* ---- back-to-back and concurrent use */

typedef struct stress_case {
    int iters;
    int bad;
} stress_case;

/* Each iteration: rank r holds (r + 1) * (it + 1) at every element of a
 * buffer of a size that changes per call; the sum is known exactly
 * (small integers), so any mix-up between calls shows. */
static int stress_rank(rank_ctx *r)
{
    stress_case *sc = r->g->user;
    int P = r->g->P;
    float buf[300];
    float big[300 * MAXP];
    for (int it = 0; it < sc->iters; it++) {
        size_t n = (size_t)(it * 37 % 300) + 1;
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)((r->rank + 1) * (it + 1));
        if (it % 7 == 0)
            jitter(r);
        int rc = sd_comm_allreduce_sum(r->g->comm, r->rank, buf, n);
        if (rc)
            return rc;
        float want = (float)(P * (P + 1) / 2 * (it + 1));
        for (size_t i = 0; i < n; i++)
            if (buf[i] != want) {
                __atomic_add_fetch(&sc->bad, 1, __ATOMIC_RELAXED);
                break;
            }
        if (it % 5 == 0) {
            rc = sd_comm_allgather(r->g->comm, r->rank, big, buf, n);
            if (rc)
                return rc;
            for (size_t i = 0; i < n * (size_t)P; i++)
                if (big[i] != want) {
                    __atomic_add_fetch(&sc->bad, 1, __ATOMIC_RELAXED);
                    break;
                }
        }
        if (it % 11 == 0 && (rc = sd_comm_barrier(r->g->comm, r->rank)))
            return rc;
    }
    return 0;
}

typedef struct conc_arg {
    group g;
    rank_ctx rs[MAXP];
    int rc;
} conc_arg;

static void *conc_main(void *arg)
{
    conc_arg *a = arg;
    a->rc = run_group(&a->g, a->rs);
    return NULL;
}

TEST(back_to_back_calls_and_two_communicators_at_once_keep_their_sums_apart)
{
    sd_comm *c1, *c2;
    sd_err err = {0};
    ASSERT_OK(sd_thread_comm_create(&c1, 4, &err));
    ASSERT_OK(sd_thread_comm_create(&c2, 3, &err));
    stress_case s1 = {.iters = 1500}, s2 = {.iters = 1500};
    conc_arg a = {.g = {.comm = c1, .P = 4, .fn = stress_rank, .user = &s1}};
    conc_arg b = {.g = {.comm = c2, .P = 3, .fn = stress_rank, .user = &s2}};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, conc_main, &a), 0);
    conc_main(&b);
    pthread_join(t, NULL);
    sd_comm_destroy(c1);
    sd_comm_destroy(c2);
    ASSERT_EQ(a.rc, 0);
    ASSERT_EQ(b.rc, 0);
    ASSERT_EQ(s1.bad, 0);
    ASSERT_EQ(s2.bad, 0);
}

/* ---- misuse and failure */

static int mismatch_rank(rank_ctx *r)
{
    float buf[8] = {0};
    int rc = sd_comm_allreduce_sum(r->g->comm, r->rank, buf, r->rank == 1 ? 4 : 8);
    /* the group stays usable: the next, matching call succeeds */
    int rc2 = sd_comm_allreduce_sum(r->g->comm, r->rank, buf, 8);
    ((int *)r->g->user)[r->rank] = rc;
    return rc2;
}

TEST(allreduce_with_different_counts_fails_on_every_rank_and_the_group_recovers)
{
    sd_comm *c;
    sd_err err = {0};
    ASSERT_OK(sd_thread_comm_create(&c, 3, &err));
    int rcs[3] = {1, 1, 1};
    group g = {.comm = c, .P = 3, .fn = mismatch_rank, .user = rcs};
    rank_ctx rs[MAXP];
    int rc = run_group(&g, rs);
    sd_comm_destroy(c);
    ASSERT_EQ(rc, 0);
    for (int r = 0; r < 3; r++)
        ASSERT_EQ(rcs[r], SD_EINVAL);
}

static int abort_rank(rank_ctx *r)
{
    float x = 1;
    if (r->rank == 0) {
        /* let the others block in the collective first */
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        sd_comm_abort(r->g->comm);
        return sd_comm_allreduce_sum(r->g->comm, 0, &x, 1) == SD_ECANCELED ? 0 : -103;
    }
    int rc = sd_comm_allreduce_sum(r->g->comm, r->rank, &x, 1);
    int rc2 = sd_comm_barrier(r->g->comm, r->rank);
    return rc == SD_ECANCELED && rc2 == SD_ECANCELED ? 0 : -104;
}

TEST(abort_wakes_waiting_ranks_with_ecanceled_and_later_calls_fail)
{
    sd_comm *c;
    sd_err err = {0};
    ASSERT_OK(sd_thread_comm_create(&c, 4, &err));
    group g = {.comm = c, .P = 4, .fn = abort_rank};
    rank_ctx rs[MAXP];
    int rc = run_group(&g, rs);
    sd_comm_destroy(c);
    ASSERT_EQ(rc, 0);
}

TEST(bad_arguments_are_refused)
{
    sd_comm *c = NULL;
    sd_err err = {0};
    ASSERT_EQ(sd_thread_comm_create(&c, 0, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "0 ranks");
    ASSERT(c == NULL);
    ASSERT_OK(sd_thread_comm_create(&c, 2, &err));
    float x = 0;
    ASSERT_EQ(sd_comm_allreduce_sum(c, 2, &x, 1), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_sum(c, -1, &x, 1), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_sum(c, 0, NULL, 1), SD_EINVAL);
    ASSERT_EQ(sd_comm_allgather(c, 0, &x, NULL, 1), SD_EINVAL);
    ASSERT_EQ(sd_comm_barrier(NULL, 0), SD_EINVAL);
    sd_comm_destroy(c);
}

TEST_MAIN(T(allreduce_gives_every_rank_the_rank_order_sum_bit_for_bit_at_every_size),
          T(allreduce_adds_rank_0_first_whatever_the_arrival_order),
          T(allgather_concatenates_ranks_in_order_also_in_place),
          T(back_to_back_calls_and_two_communicators_at_once_keep_their_sums_apart),
          T(allreduce_with_different_counts_fails_on_every_rank_and_the_group_recovers),
          T(abort_wakes_waiting_ranks_with_ecanceled_and_later_calls_fail),
          T(bad_arguments_are_refused))

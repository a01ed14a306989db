/* The node group and the node comm over loopback TCP, every node a set of
 * threads of this process: the group forms and carries broadcasts, gathers
 * and messages; different settings are refused; an abort wakes a node
 * waiting for a message. The node comm of 2 nodes x 2 ranks sums in global
 * rank order (the thread comm's bits) and gathers in rank order, over many
 * calls of changing sizes; a node that leaves fails the others' collective
 * instead of hanging. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/util.h"
#include "test.h"

#define NN 3

typedef struct opener {
    int n, rank;
    char addr[64];
    char fp[32];
    sd_nodes *g;
    int rc;
    sd_err err;
} opener;

static void *open_main(void *arg)
{
    opener *o = arg;
    o->rc = sd_nodes_open(&o->g, o->n, o->rank, o->addr, o->fp, sizeof o->fp, 20.0, &o->err);
    return NULL;
}

/* Opens n nodes at a loopback port (node 0 last, so the others retry); a
 * port already taken by another program moves on to the next one. The
 * ports are below Linux's ephemeral range (32768-60999): a server of a test
 * run beside this one (bound to port 0) or a client's socket holds ports
 * there, and the nodes that connect first would wait out their handshake
 * on that server (comm/nodes once timed out at 60 s in a parallel run). */
static int open_at(opener *o, int n, const char *fp_of_1, int port);
static int open_group(opener *o, int n, const char *fp_of_1)
{
    int port = 20000 + (int)(sd_test_seed() % 12000), rc = 0;
    for (int tries = 0; tries < 5; tries++, port += 7) {
        rc = open_at(o, n, fp_of_1, port);
        if (!rc || !strstr(o[0].err.msg, "cannot listen"))
            break;
        for (int k = 0; k < n; k++)
            sd_nodes_close(o[k].g);
    }
    return rc;
}

static int open_at(opener *o, int n, const char *fp_of_1, int port)
{
    pthread_t th[NN];
    for (int k = 0; k < n; k++) {
        memset(&o[k], 0, sizeof o[k]);
        o[k].n = n;
        o[k].rank = k;
        snprintf(o[k].addr, sizeof o[k].addr, "127.0.0.1:%d", port);
        snprintf(o[k].fp, sizeof o[k].fp, "%s", k == 1 && fp_of_1 ? fp_of_1 : "same settings");
    }
    for (int k = n - 1; k >= 0; k--)
        pthread_create(&th[k], NULL, open_main, &o[k]);
    int bad = 0;
    for (int k = 0; k < n; k++) {
        pthread_join(th[k], NULL);
        bad |= o[k].rc != 0;
    }
    return bad;
}

static void close_group(opener *o, int n)
{
    for (int k = 0; k < n; k++)
        sd_nodes_close(o[k].g);
}

typedef struct talk {
    opener *o;
    int rc;
    char got[64];
    int64_t gathered[NN];
} talk;

static void *talk_main(void *arg)
{
    talk *t = arg;
    sd_nodes *g = t->o->g;
    int k = sd_nodes_rank(g);
    sd_err err = {0};
    char word[16] = {0};
    if (k == 0)
        snprintf(word, sizeof word, "from node 0");
    int rc = sd_nodes_bcast(g, word, sizeof word, 10, &err);
    int64_t mine = 100 + k;
    if (!rc)
        rc = sd_nodes_gather(g, &mine, t->gathered, sizeof mine, 10, &err);
    const char *msg = "a plan of some length";
    if (!rc && k == 0)
        rc = sd_nodes_send_msg(g, msg, strlen(msg), 10, &err);
    else if (!rc) {
        void *buf = NULL;
        size_t len = 0;
        rc = sd_nodes_recv_msg(g, &buf, &len, 10, &err);
        if (!rc && len < sizeof t->got) {
            memcpy(t->got, buf, len);
            t->got[len] = 0;
        }
        free(buf);
    }
    if (k)
        snprintf(t->got + strlen(t->got), sizeof t->got - strlen(t->got), "|%s", word);
    t->rc = rc;
    return NULL;
}

TEST(a_group_of_three_broadcasts_gathers_and_sends_messages)
{
    opener o[NN];
    ASSERT_MSG(open_group(o, NN, NULL) == 0, "%s | %s | %s", o[0].err.msg, o[1].err.msg,
               o[2].err.msg);
    talk t[NN];
    pthread_t th[NN];
    for (int k = 0; k < NN; k++) {
        memset(&t[k], 0, sizeof t[k]);
        t[k].o = &o[k];
        pthread_create(&th[k], NULL, talk_main, &t[k]);
    }
    for (int k = 0; k < NN; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < NN; k++)
        ASSERT_MSG(t[k].rc == 0, "node %d: %d", k, t[k].rc);
    for (int k = 0; k < NN; k++)
        ASSERT(t[0].gathered[k] == 100 + k);
    for (int k = 1; k < NN; k++)
        ASSERT_MSG(!strcmp(t[k].got, "a plan of some length|from node 0"), "node %d got '%s'", k,
                   t[k].got);
    close_group(o, NN);
}

TEST(a_node_with_other_settings_is_refused_by_name)
{
    opener o[2];
    ASSERT(open_group(o, 2, "other settings") != 0);
    ASSERT(o[1].rc == SD_EINVAL);
    ASSERT_MSG(strstr(o[1].err.msg, "runs other settings than node 1"), "%s", o[1].err.msg);
    close_group(o, 2);
}

static void *recv_main(void *arg)
{
    opener *o = arg;
    void *buf = NULL;
    size_t len = 0;
    o->rc = sd_nodes_recv_msg(o->g, &buf, &len, 30, &o->err);
    free(buf);
    return NULL;
}

TEST(an_abort_wakes_a_node_waiting_for_a_message)
{
    opener o[2];
    ASSERT(open_group(o, 2, NULL) == 0);
    pthread_t th;
    pthread_create(&th, NULL, recv_main, &o[1]);
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double t0 = sd_now_s();
    sd_nodes_abort(o[1].g);
    pthread_join(th, NULL);
    ASSERT(o[1].rc != 0);
    ASSERT_MSG(sd_now_s() - t0 < 5, "took %.1f s", sd_now_s() - t0);
    /* and node 0 learns the group is gone at its next call */
    sd_err err = {0};
    ASSERT(sd_nodes_send_msg(o[0].g, "x", 1, 5, &err) != 0 ||
           sd_nodes_send_msg(o[0].g, "x", 1, 5, &err) != 0);
    close_group(o, 2);
}

/* ---- the node comm: 2 nodes x 2 rank threads */

typedef struct rank_job {
    sd_comm *c;
    int rank; /* global */
    uint64_t seed;
    int stop_after; /* leave after this many calls (-1: never) */
    int rc, wrong;
} rank_job;

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* rank's value of element i at a call: uniform in [-0.5, 0.5) */
static float val(uint64_t seed, int rank, int call, size_t i)
{
    uint64_t h = mix(seed ^ ((uint64_t)rank << 40) ^ ((uint64_t)call << 20) ^ i);
    return (float)((double)(h >> 11) * 0x1.0p-53 - 0.5);
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    const int P = 4;
    for (int call = 0; call < 24 && !j->rc; call++) {
        if (call == j->stop_after) {
            sd_comm_abort(j->c); /* this node leaves */
            j->rc = SD_ECANCELED;
            break;
        }
        size_t n = (size_t)(1 + call * 37 % 300);
        float *buf = malloc(n * sizeof(float)), *all = malloc((size_t)P * n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            buf[i] = val(j->seed, j->rank, call, i);
        j->rc = sd_comm_allreduce_sum(j->c, j->rank, buf, n);
        for (size_t i = 0; i < n && !j->rc; i++) {
            float s = val(j->seed, 0, call, i);
            for (int k = 1; k < P; k++)
                s += val(j->seed, k, call, i);
            j->wrong += memcmp(&s, &buf[i], sizeof s) != 0;
        }
        if (!j->rc)
            j->rc = sd_comm_allgather(j->c, j->rank, all, buf, n);
        for (int k = 0; k < P && !j->rc; k++)
            j->wrong += memcmp(all + (size_t)k * n, buf, n * sizeof(float)) != 0;
        if (!j->rc)
            j->rc = sd_comm_barrier(j->c, j->rank);
        free(buf);
        free(all);
    }
    return NULL;
}

static void run_node_comm(int stop_node1_after, rank_job *jobs)
{
    opener o[2];
    if (open_group(o, 2, NULL)) {
        jobs[0].rc = -1;
        return;
    }
    sd_comm *c[2] = {0};
    sd_err err = {0};
    for (int k = 0; k < 2; k++)
        if (sd_node_comm_create(&c[k], o[k].g, 2, &err)) {
            jobs[0].rc = -1;
            return;
        }
    uint64_t seed = sd_test_seed();
    pthread_t th[4];
    for (int r = 0; r < 4; r++) {
        jobs[r] = (rank_job){.c = c[r / 2], .rank = r, .seed = seed,
                             .stop_after = r / 2 == 1 ? stop_node1_after : -1};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < 4; r++)
        pthread_join(th[r], NULL);
    for (int k = 0; k < 2; k++)
        sd_comm_destroy(c[k]);
    close_group(o, 2);
}

TEST(node_comm_of_two_nodes_sums_in_global_rank_order_and_gathers_in_rank_order)
{
    rank_job j[4];
    run_node_comm(-1, j);
    for (int r = 0; r < 4; r++) {
        ASSERT_MSG(j[r].rc == 0, "rank %d: %d", r, j[r].rc);
        ASSERT_MSG(j[r].wrong == 0, "rank %d: %d wrong values", r, j[r].wrong);
    }
}

TEST(a_node_that_leaves_fails_the_other_nodes_collectives_instead_of_hanging)
{
    rank_job j[4];
    double t0 = sd_now_s();
    run_node_comm(5, j);
    ASSERT(j[0].rc != 0 && j[1].rc != 0);
    ASSERT(j[0].wrong == 0 && j[1].wrong == 0);
    ASSERT_MSG(sd_now_s() - t0 < 20, "took %.1f s", sd_now_s() - t0);
}

TEST_MAIN(T(a_group_of_three_broadcasts_gathers_and_sends_messages),
          T(a_node_with_other_settings_is_refused_by_name),
          T(an_abort_wakes_a_node_waiting_for_a_message),
          T(node_comm_of_two_nodes_sums_in_global_rank_order_and_gathers_in_rank_order),
          T(a_node_that_leaves_fails_the_other_nodes_collectives_instead_of_hanging))

/* Multi-node bootstrap over loopback TCP: node 0 serves the id to every other
 * node (also when they start first); mismatched lengths, duplicate or
 * out-of-range ranks and silence fail with messages naming --dist-init-addr. */
#include <pthread.h>

#include "comm/comm.h"
#include "core/util.h"
#include "test.h"

#define MAXN 8

typedef struct node {
    char addr[64];
    int rank;
    size_t len;
    double timeout;
    double delay; /* s before connecting */
    unsigned char blob[256];
    int rc;
    sd_err err;
} node;

static void *node_main(void *arg)
{
    node *n = arg;
    if (n->delay > 0) {
        struct timespec ts = {0, (long)(n->delay * 1e9)};
        nanosleep(&ts, NULL);
    }
    n->rc = sd_bootstrap_fetch(n->addr, n->rank, n->blob, n->len, n->timeout, &n->err);
    return NULL;
}

typedef struct server {
    sd_bootstrap *b;
    int nnodes;
    const unsigned char *blob;
    size_t len;
    double timeout;
    int rc;
    sd_err err;
} server;

static void *server_main(void *arg)
{
    server *s = arg;
    s->rc = sd_bootstrap_serve(s->b, s->nnodes, s->blob, s->len, s->timeout, &s->err);
    return NULL;
}

/* Runs a server for nnodes and the given client nodes; returns the server's rc. */
static int run(server *s, node *nodes, int nc)
{
    pthread_t ts, tn[MAXN];
    pthread_create(&ts, NULL, server_main, s);
    for (int i = 0; i < nc; i++)
        pthread_create(&tn[i], NULL, node_main, &nodes[i]);
    for (int i = 0; i < nc; i++)
        pthread_join(tn[i], NULL);
    pthread_join(ts, NULL);
    return s->rc;
}

static void random_blob(unsigned char *b, size_t n)
{
    uint64_t rng = sd_test_seed();
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)sd_test_randf(&rng, 0, 256);
}

TEST(node_0_hands_the_id_to_every_node_even_ones_that_start_first)
{
    sd_bootstrap *b;
    sd_err err = {0};
    ASSERT_OK(sd_bootstrap_listen(&b, "127.0.0.1:0", &err));
    int port = sd_bootstrap_port(b);
    ASSERT_GT(port, 0);
    unsigned char id[128];
    random_blob(id, sizeof id);
    server s = {.b = b, .nnodes = 4, .blob = id, .len = sizeof id, .timeout = 20};
    node nodes[3];
    for (int i = 0; i < 3; i++) {
        nodes[i] = (node){.rank = i + 1, .len = sizeof id, .timeout = 20, .delay = 0.02 * i};
        snprintf(nodes[i].addr, sizeof nodes[i].addr, "127.0.0.1:%d", port);
    }
    int rc = run(&s, nodes, 3);
    sd_bootstrap_close(b);
    ASSERT_MSG(rc == 0, "%s", s.err.msg);
    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(nodes[i].rc == 0, "node %d: %s", i + 1, nodes[i].err.msg);
        ASSERT(memcmp(nodes[i].blob, id, sizeof id) == 0);
    }
}

TEST(a_node_that_starts_before_node_0_listens_retries_until_it_does)
{
    /* take a free port, release it, start the node, then listen on it */
    sd_bootstrap *b;
    sd_err err = {0};
    ASSERT_OK(sd_bootstrap_listen(&b, "127.0.0.1:0", &err));
    int port = sd_bootstrap_port(b);
    sd_bootstrap_close(b);
    node n = {.rank = 1, .len = 16, .timeout = 20};
    snprintf(n.addr, sizeof n.addr, "127.0.0.1:%d", port);
    pthread_t t;
    pthread_create(&t, NULL, node_main, &n);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%d", port);
    int lrc = sd_bootstrap_listen(&b, a, &err);
    unsigned char id[16];
    random_blob(id, sizeof id);
    int src = lrc ? lrc : sd_bootstrap_serve(b, 2, id, sizeof id, 20, &err);
    pthread_join(t, NULL);
    if (!lrc)
        sd_bootstrap_close(b);
    ASSERT_MSG(lrc == 0 && src == 0, "%s", err.msg);
    ASSERT_MSG(n.rc == 0, "%s", n.err.msg);
    ASSERT(memcmp(n.blob, id, sizeof id) == 0);
}

TEST(mismatched_length_or_rank_fails_both_sides_naming_the_flag)
{
    struct {
        int nnodes, rank_a, rank_b;
        size_t len_b;
        const char *server_says, *node_says;
    } cases[] = {
        {3, 1, 2, 64, "expects a 64-byte id, this node serves 128", "different id length"},
        {3, 1, 1, 128, "two nodes say --node-rank 1", "same --node-rank"},
        {3, 1, 5, 128, "a node says --node-rank 5, but --nnodes is 3", "outside --nnodes"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sd_bootstrap *b;
        sd_err err = {0};
        ASSERT_OK(sd_bootstrap_listen(&b, "127.0.0.1:0", &err));
        int port = sd_bootstrap_port(b);
        unsigned char id[128];
        random_blob(id, sizeof id);
        server s = {.b = b, .nnodes = cases[k].nnodes, .blob = id, .len = 128, .timeout = 20};
        node nodes[2] = {{.rank = cases[k].rank_a, .len = 128, .timeout = 20},
                         {.rank = cases[k].rank_b, .len = cases[k].len_b, .timeout = 3,
                          .delay = 0.3}};
        for (int i = 0; i < 2; i++)
            snprintf(nodes[i].addr, sizeof nodes[i].addr, "127.0.0.1:%d", port);
        int rc = run(&s, nodes, 2);
        sd_bootstrap_close(b);
        ASSERT_EQ(rc, SD_EINVAL);
        ASSERT_CONTAINS(s.err.msg, cases[k].server_says);
        ASSERT_CONTAINS(s.err.msg, "--dist-init-addr 127.0.0.1:0");
        ASSERT_EQ(nodes[0].rc, 0);
        ASSERT_NE(nodes[1].rc, 0);
        ASSERT_CONTAINS(nodes[1].err.msg, cases[k].node_says);
    }
}

TEST(silence_times_out_with_a_message_and_bad_addresses_are_refused)
{
    sd_bootstrap *b;
    sd_err err = {0};
    ASSERT_OK(sd_bootstrap_listen(&b, "127.0.0.1:0", &err));
    unsigned char id[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double t0 = sd_now_s();
    ASSERT_EQ(sd_bootstrap_serve(b, 3, id, sizeof id, 0.3, &err), SD_ECANCELED);
    ASSERT_CONTAINS(err.msg, "1 of 3 nodes joined within");
    ASSERT_LT((sd_now_s() - t0) * 1000, 5000);
    int port = sd_bootstrap_port(b);
    sd_bootstrap_close(b);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%d", port);
    unsigned char got[8];
    ASSERT_EQ(sd_bootstrap_fetch(a, 1, got, sizeof got, 0.3, &err), SD_ECANCELED);
    ASSERT_CONTAINS(err.msg, "did not answer within");
    const char *bad[] = {"nohostport", "host:notaport", "host:70000", ":5000", "host:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(sd_bootstrap_fetch(bad[i], 1, got, sizeof got, 0.1, &err), SD_EINVAL);
        ASSERT_CONTAINS(err.msg, "--dist-init-addr");
        ASSERT_EQ(sd_bootstrap_listen(&b, bad[i], &err), SD_EINVAL);
    }
    ASSERT_EQ(sd_bootstrap_fetch("127.0.0.1:0", 1, got, sizeof got, 0.1, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "a port is needed");
}

TEST_MAIN(T(node_0_hands_the_id_to_every_node_even_ones_that_start_first),
          T(a_node_that_starts_before_node_0_listens_retries_until_it_does),
          T(mismatched_length_or_rank_fails_both_sides_naming_the_flag),
          T(silence_times_out_with_a_message_and_bad_addresses_are_refused))

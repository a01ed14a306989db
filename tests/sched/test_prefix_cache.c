/* sched/prefix_cache over sched/kv_blocks: matching, the proposer's marks,
 * eviction, and a randomized run against emulated cache memory: every slot
 * remembers the prefix it was written for, and every matched block must hold
 * the matching request's own prefix.
 *
 * Both sources are included (see test_kv_blocks.c) so that the pool's
 * invariant checks run after every call. */
#define SD_KV_VALIDATE 1
#include "sched/kv_blocks.c"
#include "sched/prefix_cache.c"

#include "test.h"

static uint32_t rnd(uint64_t *s, uint32_t n) { return (uint32_t)sd_test_randf(s, 0, (float)n) % n; }

/* a sequence's blocks offered to the cache, the first n of them */
static sd_pc_key offer(sd_pcache *c, const sd_kv_seq *s, const int32_t *tok, int n, int bs,
                       int prop, int next_from_tok)
{
    sd_pc_key k = sd_pcache_root();
    for (int j = 0; j < n; j++)
        k = sd_pcache_insert(c, k, tok + j * bs, s->blocks[j], prop,
                             next_from_tok ? tok[(j + 1) * bs] : -1);
    return k;
}

TEST(a_prompt_finds_its_blocks_and_stops_where_it_differs)
{
    sd_kv_pool *p;
    sd_pcache *c;
    ASSERT_OK(sd_kv_pool_create(&p, 16, 4, NULL));
    ASSERT_OK(sd_pcache_create(&c, p, NULL));
    int32_t tok[20], other[20];
    for (int i = 0; i < 20; i++)
        tok[i] = other[i] = 100 + i;
    other[9] = 7; /* block 2 differs */
    sd_kv_seq a, b;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 18));
    offer(c, &a, tok, 4, 4, 0, 0);
    ASSERT_EQ(sd_pcache_entries(c), 4);
    ASSERT_EQ(sd_kv_pool_cached(p), 4);
    int32_t m[8];
    int np = -1;
    sd_pc_key keys[8], k = sd_pcache_root();
    ASSERT_EQ(sd_pcache_match(c, tok, 20, 8, m, keys, &np), 4);
    ASSERT_EQ(np, 0); /* no proposer slots written */
    for (int j = 0; j < 4; j++) {
        ASSERT_EQ(m[j], a.blocks[j]);
        k = sd_pcache_key(k, tok + j * 4, 4); /* each block's chained key */
        ASSERT(!memcmp(&keys[j], &k, sizeof k));
    }
    ASSERT_EQ(sd_pcache_match(c, tok, 20, 3, m, NULL, &np), 3); /* at most max_blocks */
    ASSERT_EQ(sd_pcache_match(c, tok, 15, 8, m, NULL, &np), 3); /* whole blocks of the tokens only */
    ASSERT_EQ(sd_pcache_match(c, other, 20, 8, m, NULL, &np), 2);
    /* a block of the same tokens after another prefix is another block */
    int32_t shifted[20];
    memcpy(shifted, tok + 4, 16 * sizeof *tok);
    ASSERT_EQ(sd_pcache_match(c, shifted, 16, 8, m, NULL, &np), 0);

    /* a released prefix stays matchable; b shares it and reads no new block */
    sd_kv_seq_free(p, &a);
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    ASSERT_EQ(sd_kv_pool_evictable(p), 4);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 16);
    ASSERT_EQ(sd_pcache_match(c, other, 20, 8, m, NULL, &np), 2);
    for (int j = 0; j < 2; j++)
        ASSERT_OK(sd_kv_seq_share(p, &b, m[j]));
    ASSERT_EQ(sd_kv_seq_share(p, &b, m[0]), SD_EINVAL); /* already in b */
    ASSERT_EQ(sd_kv_pool_evictable(p), 2);
    ASSERT_EQ(sd_kv_pool_used(p), 2);
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 20));
    ASSERT_EQ(sd_kv_pool_used(p), 5);
    offer(c, &b, other, 5, 4, 0, 0);
    ASSERT_EQ(sd_pcache_entries(c), 7); /* 4 of a, b's blocks 2..4 */
    ASSERT_OK(sd_pcache_check(c, NULL));
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_kv_seq_free(p, &b);
    sd_pcache_free(c);
    ASSERT_EQ(sd_kv_pool_cached(p), 0);
    ASSERT_EQ(sd_kv_pool_evictable(p), 0);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_kv_pool_free(p);
}

TEST(eviction_takes_the_least_recently_released_and_the_cache_forgets_it)
{
    sd_kv_pool *p;
    sd_pcache *c;
    ASSERT_OK(sd_kv_pool_create(&p, 6, 2, NULL));
    ASSERT_OK(sd_pcache_create(&c, p, NULL));
    int32_t t1[6] = {1, 2, 3, 4, 5, 6}, t2[6] = {9, 8, 7, 6, 5, 4};
    sd_kv_seq a, b, x;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    sd_kv_seq_init(&x);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 6));
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 6));
    offer(c, &a, t1, 3, 2, 0, 0);
    offer(c, &b, t2, 3, 2, 0, 0);
    sd_kv_seq_free(p, &a); /* released first: evicted first, its last block first */
    sd_kv_seq_free(p, &b);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 6);
    ASSERT_EQ(sd_kv_pool_evictable(p), 6);
    ASSERT_OK(sd_kv_seq_reserve(p, &x, 2)); /* one block: a's third */
    int32_t m[3];
    int np;
    ASSERT_EQ(sd_pcache_match(c, t1, 6, 3, m, NULL, &np), 2);
    ASSERT_EQ(sd_pcache_match(c, t2, 6, 3, m, NULL, &np), 3);
    ASSERT_OK(sd_kv_seq_reserve(p, &x, 6)); /* a's other two */
    ASSERT_EQ(sd_pcache_match(c, t1, 6, 3, m, NULL, &np), 0);
    ASSERT_EQ(sd_pcache_match(c, t2, 6, 3, m, NULL, &np), 3);
    ASSERT_EQ(sd_pcache_entries(c), 3);
    /* a held cached block is not evictable: all-or-nothing still holds */
    sd_kv_seq y;
    sd_kv_seq_init(&y);
    ASSERT_OK(sd_kv_seq_share(p, &y, m[0]));
    ASSERT_EQ(sd_kv_seq_reserve(p, &x, 14), SD_EFULL); /* 4 more, 2 evictable */
    ASSERT_EQ(x.n_blocks, 3);
    ASSERT_EQ(sd_pcache_entries(c), 3);
    ASSERT_OK(sd_kv_seq_reserve(p, &x, 10)); /* 2 more: b's blocks 2 and 1 */
    ASSERT_EQ(sd_pcache_match(c, t2, 6, 3, m, NULL, &np), 1);
    ASSERT_OK(sd_pcache_check(c, NULL));
    sd_kv_seq_free(p, &x);
    sd_kv_seq_free(p, &y);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_pcache_free(c);
    sd_kv_pool_free(p);
}

TEST(proposer_slots_are_shared_only_for_the_token_they_were_made_with)
{
    sd_kv_pool *p;
    sd_pcache *c;
    ASSERT_OK(sd_kv_pool_create(&p, 12, 4, NULL));
    ASSERT_OK(sd_pcache_create(&c, p, NULL));
    int32_t t[13], u[13];
    for (int i = 0; i < 13; i++)
        t[i] = u[i] = 50 + i;
    u[12] = 3; /* the token after block 2 differs */
    sd_kv_seq a, b;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 13));
    offer(c, &a, t, 3, 4, 0, 0); /* target only */
    int32_t m[4];
    int np;
    ASSERT_EQ(sd_pcache_match(c, t, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(np, 0);
    offer(c, &a, t, 3, 4, 1, 1); /* the same blocks: proposer written (MTP-like) */
    ASSERT_EQ(sd_pcache_match(c, t, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(np, 3);
    ASSERT_EQ(sd_pcache_match(c, u, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(np, 2); /* block 2's last proposer slot was made from t[12] */
    ASSERT_EQ(sd_pcache_match(c, t, 12, 3, m, NULL, &np), 3);
    ASSERT_EQ(np, 2); /* the next token is not known */

    /* b holds the same prefix in blocks of its own, without the proposer's
     * slots: the cache keeps a's; with them, b's replace the entries only
     * where a's lack them */
    sd_kv_seq_free(p, &a);
    sd_pcache_free(c);
    ASSERT_OK(sd_pcache_create(&c, p, NULL));
    sd_kv_seq_init(&a);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 13));
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 13));
    offer(c, &a, t, 3, 4, 0, 0);
    offer(c, &b, t, 3, 4, 0, 0);
    ASSERT_EQ(sd_pcache_match(c, t, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(m[0], a.blocks[0]);
    offer(c, &b, t, 3, 4, 1, 0); /* a draft LM's: no next token */
    ASSERT_EQ(sd_pcache_match(c, u, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(np, 3);
    for (int j = 0; j < 3; j++) {
        ASSERT_EQ(m[j], b.blocks[j]);
        ASSERT(!sd_kv_block_cached(p, a.blocks[j]));
    }
    offer(c, &a, t, 3, 4, 1, 0); /* a's now too: b's stay */
    ASSERT_EQ(sd_pcache_match(c, t, 13, 3, m, NULL, &np), 3);
    ASSERT_EQ(m[2], b.blocks[2]);
    ASSERT_EQ(sd_pcache_entries(c), 3);
    ASSERT_OK(sd_pcache_check(c, NULL));
    sd_kv_seq_free(p, &a);
    sd_kv_seq_free(p, &b);
    ASSERT_EQ(sd_kv_pool_evictable(p), 3);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 12);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_pcache_free(c);
    sd_kv_pool_free(p);
}

/* ---- randomized: requests over a few shared prefixes ------------------------------ */

enum { NB = 40, BS = 4, NREQ = 5, MAXT = 48 };

typedef struct rq {
    int live;
    int32_t tok[MAXT + 1];
    int n;        /* tokens */
    int written;  /* positions computed */
    int offered;  /* blocks offered */
    sd_pc_key key;
    sd_kv_seq kv;
} rq;

/* what a slot holds: the hash of the prefix up to and including its
 * position, written by whoever computed it */
static uint64_t prefix_tag(const int32_t *tok, int pos)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i <= pos; i++)
        h = (h ^ (uint32_t)tok[i]) * 1099511628211ull;
    return h;
}

TEST(randomized_matched_blocks_hold_the_requests_own_prefix)
{
    uint64_t seed = sd_test_seed();
    sd_kv_pool *p;
    sd_pcache *c;
    ASSERT_OK(sd_kv_pool_create(&p, NB, BS, NULL));
    ASSERT_OK(sd_pcache_create(&c, p, NULL));
    static uint64_t mem[NB * BS];
    memset(mem, 0, sizeof mem);
    rq r[NREQ];
    memset(r, 0, sizeof r);
    int32_t stems[3][MAXT + 1];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i <= MAXT; i++)
            stems[s][i] = (int32_t)rnd(&seed, 5);
    long hits = 0, evicting = 0;
    for (int it = 0; it < 4000; it++) {
        rq *q = &r[rnd(&seed, NREQ)];
        if (!q->live) {
            /* a new request: a stem's first tokens, then its own */
            const int32_t *stem = stems[rnd(&seed, 3)];
            int share = (int)rnd(&seed, MAXT);
            q->n = 2 + (int)rnd(&seed, MAXT - 2);
            for (int i = 0; i < q->n; i++)
                q->tok[i] = i < share ? stem[i] : (int32_t)rnd(&seed, 5);
            int32_t m[MAXT / BS];
            int np;
            int got = sd_pcache_match(c, q->tok, q->n, (q->n - 1) / BS, m, NULL, &np);
            ASSERT_LE(got * BS, q->n - 1);
            sd_kv_seq_init(&q->kv);
            q->key = sd_pcache_root();
            for (int j = 0; j < got; j++) {
                ASSERT_OK(sd_kv_seq_share(p, &q->kv, m[j]));
                for (int o = 0; o < BS; o++)
                    ASSERT_MSG(mem[m[j] * BS + o] == prefix_tag(q->tok, j * BS + o),
                               "block %d (matched as block %d) holds another prefix", (int)m[j],
                               j);
                q->key = sd_pcache_key(q->key, q->tok + j * BS, BS);
            }
            hits += got;
            q->written = got * BS;
            q->offered = got;
            q->live = 1;
            continue;
        }
        uint32_t op = rnd(&seed, 10);
        if (op < 6 && q->written < q->n) {
            /* compute a chunk (reserving may evict) */
            int to = q->written + 1 + (int)rnd(&seed, 12);
            if (to > q->n)
                to = q->n;
            int evicts = sd_kv_seq_need(p, &q->kv, to) > p->n_free;
            if (sd_kv_seq_reserve(p, &q->kv, to) != 0)
                continue;
            evicting += evicts;
            for (int pos = q->written; pos < to; pos++)
                mem[sd_kv_seq_slot(p, &q->kv, pos)] = prefix_tag(q->tok, pos);
            q->written = to;
            while ((q->offered + 1) * BS <= q->written) {
                q->key = sd_pcache_insert(c, q->key, q->tok + q->offered * BS,
                                          q->kv.blocks[q->offered], 0, -1);
                q->offered++;
            }
        } else if (op < 8 || q->written == q->n) {
            sd_kv_seq_free(p, &q->kv);
            q->live = 0;
        }
        if (it % 97 == 0) {
            ASSERT_OK(sd_pcache_check(c, NULL));
            ASSERT_OK(sd_kv_pool_check(p, NULL));
        }
    }
    ASSERT_GT(hits, 100);   /* shared prefixes were found */
    ASSERT_GT(evicting, 20); /* and the pool ran short of free blocks */
    for (int i = 0; i < NREQ; i++)
        if (r[i].live)
            sd_kv_seq_free(p, &r[i].kv);
    ASSERT_OK(sd_pcache_check(c, NULL));
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    sd_pcache_free(c);
    sd_kv_pool_free(p);
}

TEST_MAIN(T(a_prompt_finds_its_blocks_and_stops_where_it_differs),
          T(eviction_takes_the_least_recently_released_and_the_cache_forgets_it),
          T(proposer_slots_are_shared_only_for_the_token_they_were_made_with),
          T(randomized_matched_blocks_hold_the_requests_own_prefix))

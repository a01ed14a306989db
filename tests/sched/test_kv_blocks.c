/* sched/kv_blocks: the block manager against a model of what each sequence
 * stored, with the cache memory emulated, under SD_KV_VALIDATE.
 *
 * The source is included (as h2o's unit tests do) so this program gets a copy
 * built with the invariant checks on; the library's copy is never linked in
 * because every symbol it would provide is already defined here. */
#define SD_KV_VALIDATE 1
#include "sched/kv_blocks.c"

#include "test.h"

static uint32_t rnd(uint64_t *s, uint32_t n) { return (uint32_t)sd_test_randf(s, 0, (float)n) % n; }

TEST(pool_rejects_empty_shapes)
{
    sd_kv_pool *p = (sd_kv_pool *)1;
    sd_err err = {0};
    ASSERT_EQ(sd_kv_pool_create(&p, 0, 16, &err), SD_EINVAL);
    ASSERT(p == NULL);
    ASSERT_CONTAINS(err.msg, "0 blocks of 16 tokens");
    ASSERT_EQ(sd_kv_pool_create(&p, 4, 0, &err), SD_EINVAL);
}

TEST(reserve_truncate_free_round_trip_and_slots)
{
    sd_kv_pool *p;
    ASSERT_OK(sd_kv_pool_create(&p, 10, 4, NULL));
    sd_kv_seq a, b;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    ASSERT_EQ(sd_kv_seq_need(p, &a, 9), 3);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 9)); /* 3 blocks: 0, 1, 2 */
    ASSERT_EQ(a.n_blocks, 3);
    ASSERT_EQ(sd_kv_seq_need(p, &a, 12), 0);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 5)); /* never shrinks */
    ASSERT_EQ(a.n_blocks, 3);
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 4));
    ASSERT_EQ(sd_kv_pool_used(p), 4);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 6);
    for (int pos = 0; pos < 12; pos++)
        ASSERT_EQ(sd_kv_seq_slot(p, &a, pos), a.blocks[pos / 4] * 4 + pos % 4);
    int32_t sl[7];
    sd_kv_seq_slots(p, &a, 3, 7, sl);
    for (int i = 0; i < 7; i++)
        ASSERT_EQ(sl[i], sd_kv_seq_slot(p, &a, 3 + i));
    /* Rollback to 5 positions keeps 2 blocks; the freed block comes back first (LIFO). */
    int32_t third = a.blocks[2];
    sd_kv_seq_truncate(p, &a, 5);
    ASSERT_EQ(a.n_blocks, 2);
    ASSERT_EQ(sd_kv_pool_used(p), 3);
    sd_kv_seq_truncate(p, &a, 8); /* a no-op: only releases */
    ASSERT_EQ(a.n_blocks, 2);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 9));
    ASSERT_EQ(a.blocks[2], third);
    /* Rolling back several blocks and reserving again restores the same table. */
    int32_t before[3] = {a.blocks[0], a.blocks[1], a.blocks[2]};
    sd_kv_seq_truncate(p, &a, 1);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 12));
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(a.blocks[i], before[i]);
    sd_kv_seq_free(p, &a);
    sd_kv_seq_free(p, &b);
    ASSERT(a.blocks == NULL && a.n_blocks == 0);
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 10);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_kv_pool_free(p);
}

TEST(full_reservation_changes_nothing)
{
    sd_kv_pool *p;
    ASSERT_OK(sd_kv_pool_create(&p, 5, 8, NULL));
    sd_kv_seq a, b;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 17)); /* 3 blocks */
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 3));  /* 1 block */
    int32_t a0[3];
    memcpy(a0, a.blocks, sizeof a0);
    int32_t fl[5];
    memcpy(fl, p->free_list, sizeof fl);
    ASSERT_EQ(sd_kv_seq_reserve(p, &b, 8 * 3), SD_EFULL); /* needs 2, 1 free */
    ASSERT_EQ(b.n_blocks, 1);
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 1);
    ASSERT_EQ(p->free_list[0], fl[0]);
    ASSERT_EQ(sd_kv_seq_reserve(p, &a, 1000), SD_EFULL);
    ASSERT_EQ(a.n_blocks, 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(a.blocks[i], a0[i]);
        ASSERT_EQ(sd_kv_block_refs(p, a0[i]), 1);
    }
    ASSERT_OK(sd_kv_seq_reserve(p, &b, 16)); /* exactly the last block */
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 0);
    int32_t from, to;
    sd_kv_seq c;
    sd_kv_seq_init(&c);
    ASSERT_OK(sd_kv_seq_fork(p, &c, &a, 1));
    ASSERT_EQ(sd_kv_seq_make_private(p, &c, 3, &from, &to), SD_EFULL); /* no block for the copy */
    ASSERT_EQ(c.blocks[0], a.blocks[0]);
    ASSERT_EQ(sd_kv_block_refs(p, a.blocks[0]), 2);
    sd_kv_seq_free(p, &c);
    sd_kv_seq_free(p, &a);
    sd_kv_seq_free(p, &b);
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_kv_pool_free(p);
}

TEST(forked_blocks_are_shared_and_copied_on_write)
{
    sd_kv_pool *p;
    ASSERT_OK(sd_kv_pool_create(&p, 8, 4, NULL));
    sd_kv_seq a, b;
    sd_kv_seq_init(&a);
    sd_kv_seq_init(&b);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 10)); /* 3 blocks, the last partly written */
    ASSERT_OK(sd_kv_seq_fork(p, &b, &a, 99));
    ASSERT_EQ(b.n_blocks, 3);
    ASSERT_EQ(sd_kv_pool_used(p), 3);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(sd_kv_block_refs(p, a.blocks[i]), 2);
    /* b writes position 10 (block 2, shared): it gets its own block. */
    int32_t from = -1, to = -1, shared = a.blocks[2];
    ASSERT_EQ(sd_kv_seq_make_private(p, &b, 10, &from, &to), 1);
    ASSERT_EQ(from, shared);
    ASSERT_NE(to, shared);
    ASSERT_EQ(b.blocks[2], to);
    ASSERT_EQ(sd_kv_block_refs(p, shared), 1);
    ASSERT_EQ(sd_kv_seq_make_private(p, &b, 11, &from, &to), 0); /* now private */
    ASSERT_EQ(sd_kv_seq_make_private(p, &a, 10, &from, &to), 0); /* a is the sole owner now */
    ASSERT_EQ(sd_kv_seq_make_private(p, &a, 12, &from, &to), SD_EINVAL);
    ASSERT_EQ(sd_kv_pool_used(p), 4);
    /* A prefix cache holds block 0 beyond both sequences. */
    int32_t b0 = a.blocks[0];
    sd_kv_block_incref(p, b0);
    ASSERT_EQ(sd_kv_block_refs(p, b0), 3);
    sd_kv_seq_free(p, &a);
    ASSERT_EQ(sd_kv_pool_used(p), 3); /* b's three blocks (block 0 shared with the cache) */
    sd_kv_seq_free(p, &b);
    ASSERT_EQ(sd_kv_pool_used(p), 1);
    ASSERT_EQ(sd_kv_block_refs(p, b0), 1);
    sd_kv_block_decref(p, b0);
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    /* Fork onto a sequence that already shares the blocks keeps them alive. */
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 8));
    ASSERT_OK(sd_kv_seq_fork(p, &b, &a, 2));
    ASSERT_OK(sd_kv_seq_fork(p, &b, &a, 1));
    ASSERT_EQ(sd_kv_block_refs(p, a.blocks[0]), 2);
    ASSERT_EQ(sd_kv_block_refs(p, a.blocks[1]), 1);
    ASSERT_EQ(sd_kv_seq_fork(p, &a, &a, 1), SD_EINVAL);
    sd_kv_seq_free(p, &a);
    sd_kv_seq_free(p, &b);
    ASSERT_EQ(sd_kv_pool_used(p), 0);
    ASSERT_OK(sd_kv_pool_check(p, NULL));
    sd_kv_pool_free(p);
}

TEST(misuse_and_broken_invariants_are_reported)
{
    sd_kv_pool *p;
    sd_err err = {0};
    ASSERT_OK(sd_kv_pool_create(&p, 4, 2, NULL));
    sd_kv_block_decref(p, 2); /* a free block */
    ASSERT_EQ(sd_kv_pool_check(p, &err), SD_ESTATE);
    ASSERT_CONTAINS(err.msg, "block 2");
    ASSERT_EQ(sd_kv_pool_free_blocks(p), 4); /* not pushed twice */
    sd_kv_pool_free(p);

    /* Corrupt the state behind the API's back: the validating build notices
     * at the next call. */
    ASSERT_OK(sd_kv_pool_create(&p, 4, 2, NULL));
    sd_kv_seq a;
    sd_kv_seq_init(&a);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 2));
    p->ref[3] = 1; /* block 3 is on the free list */
    sd_kv_seq_truncate(p, &a, 0);
    ASSERT_EQ(sd_kv_pool_check(p, &err), SD_ESTATE);
    ASSERT_CONTAINS(err.msg, "after truncate");
    ASSERT_CONTAINS(err.msg, "block 3");
    sd_kv_seq_free(p, &a);
    sd_kv_pool_free(p);

    ASSERT_OK(sd_kv_pool_create(&p, 4, 2, NULL));
    sd_kv_seq_init(&a);
    ASSERT_OK(sd_kv_seq_reserve(p, &a, 4));
    a.blocks[1] = a.blocks[0];
    ASSERT_EQ(sd_kv_seq_check(p, &a, &err), SD_ESTATE);
    ASSERT_CONTAINS(err.msg, "twice");
    sd_kv_seq_free(p, &a);
    sd_kv_pool_free(p);
}

/* ---- randomized against a model ---------------------------------------------------- */

enum { NSEQ = 6, MAX_POS = 512, MAX_EXT = 64 };

typedef struct model_seq {
    int written;           /* positions [0, written) hold data */
    uint32_t val[MAX_POS]; /* what each holds */
} model_seq;

typedef struct world {
    sd_kv_pool *p;
    int nb, bs;
    uint32_t *mem; /* (nb * bs,) the emulated cache */
    sd_kv_seq seq[NSEQ];
    model_seq m[NSEQ];
    int32_t ext[MAX_EXT]; /* blocks held by an emulated prefix cache */
    int n_ext;
} world;

/* Checks everything the model knows: data through the slots, reference counts
 * = table memberships + cache holds, used = distinct referenced blocks. */
static int check_world(world *w, const char *op)
{
    sd_err err = {0};
    if (sd_kv_pool_check(w->p, &err)) {
        fprintf(stderr, "  after %s: %s\n", op, err.msg);
        return 0;
    }
    int *refs = calloc((size_t)w->nb, sizeof *refs), used = 0, ok = 1;
    for (int s = 0; s < NSEQ && ok; s++) {
        const sd_kv_seq *q = &w->seq[s];
        if (sd_kv_seq_check(w->p, q, &err)) {
            fprintf(stderr, "  after %s: seq %d: %s\n", op, s, err.msg);
            ok = 0;
        }
        if (sd_kv_blocks_for(w->p, w->m[s].written) > q->n_blocks) {
            fprintf(stderr, "  after %s: seq %d holds %d blocks for %d positions\n", op, s,
                    q->n_blocks, w->m[s].written);
            ok = 0;
        }
        for (int i = 0; i < q->n_blocks; i++)
            refs[q->blocks[i]]++;
        for (int pos = 0; pos < w->m[s].written && ok; pos++) {
            int slot = sd_kv_seq_slot(w->p, q, pos);
            if (w->mem[slot] != w->m[s].val[pos]) {
                fprintf(stderr, "  after %s: seq %d pos %d reads %u, wrote %u\n", op, s, pos,
                        w->mem[slot], w->m[s].val[pos]);
                ok = 0;
            }
        }
    }
    for (int i = 0; i < w->n_ext; i++)
        refs[w->ext[i]]++;
    for (int b = 0; b < w->nb && ok; b++) {
        used += refs[b] > 0;
        if (refs[b] != sd_kv_block_refs(w->p, b)) {
            fprintf(stderr, "  after %s: block %d has %d references, the model counts %d\n", op, b,
                    sd_kv_block_refs(w->p, b), refs[b]);
            ok = 0;
        }
    }
    if (ok && used != sd_kv_pool_used(w->p)) {
        fprintf(stderr, "  after %s: %d blocks used, the model counts %d\n", op,
                sd_kv_pool_used(w->p), used);
        ok = 0;
    }
    if (ok && sd_kv_pool_used(w->p) + sd_kv_pool_free_blocks(w->p) != w->nb) {
        fprintf(stderr, "  after %s: used + free != total\n", op);
        ok = 0;
    }
    free(refs);
    return ok;
}

/* Snapshot of the pool and the tables, to prove a failed call changed nothing. */
static uint64_t fingerprint(const world *w)
{
    uint64_t h = 1469598103934665603ull;
#define FP_ADD(x) (h = (h ^ (uint64_t)(uint32_t)(x)) * 1099511628211ull)
    FP_ADD(w->p->n_free);
    for (int i = 0; i < w->p->n_free; i++)
        FP_ADD(w->p->free_list[i]);
    for (int b = 0; b < w->nb; b++)
        FP_ADD(w->p->ref[b]);
    for (int s = 0; s < NSEQ; s++) {
        FP_ADD(w->seq[s].n_blocks);
        for (int i = 0; i < w->seq[s].n_blocks; i++)
            FP_ADD(w->seq[s].blocks[i]);
    }
#undef FP_ADD
    return h;
}

TEST(random_operations_match_a_model_and_return_every_block)
{
    uint64_t rng = sd_test_seed() | 1;
    long ops = 0, efull = 0, cows = 0;
    for (int round = 0; round < 40; round++) {
        world w;
        memset(&w, 0, sizeof w);
        w.nb = 4 + (int)rnd(&rng, 60);
        w.bs = 1 + (int)rnd(&rng, 8);
        ASSERT_OK(sd_kv_pool_create(&w.p, w.nb, w.bs, NULL));
        w.mem = calloc((size_t)w.nb * w.bs, sizeof *w.mem);
        for (int s = 0; s < NSEQ; s++)
            sd_kv_seq_init(&w.seq[s]);
        int ok = 1;
        for (int step = 0; step < 1500 && ok; step++, ops++) {
            int s = (int)rnd(&rng, NSEQ);
            sd_kv_seq *q = &w.seq[s];
            model_seq *m = &w.m[s];
            const char *op = "?";
            switch (rnd(&rng, 9)) {
            case 0:
            case 1: { /* reserve ahead (speculative room included) */
                op = "reserve";
                int n = m->written + (int)rnd(&rng, 3 * w.bs + 2);
                if (n > MAX_POS)
                    n = MAX_POS;
                int need = sd_kv_seq_need(w.p, q, n), free_before = sd_kv_pool_free_blocks(w.p);
                uint64_t before = fingerprint(&w);
                int rc = sd_kv_seq_reserve(w.p, q, n);
                if (need > free_before) {
                    ASSERT_EQ(rc, SD_EFULL);
                    ASSERT(fingerprint(&w) == before);
                    efull++;
                } else {
                    ASSERT_EQ(rc, 0);
                    ASSERT_GE(q->n_blocks, sd_kv_blocks_for(w.p, n));
                }
                break;
            }
            case 2:
            case 3:
            case 4: { /* write into reserved room, copying shared blocks first */
                op = "write";
                int room = q->n_blocks * w.bs - m->written;
                int n = room > 0 ? (int)rnd(&rng, (uint32_t)room + 1) : 0;
                for (int i = 0; i < n; i++) {
                    int pos = m->written;
                    int32_t from, to;
                    int rc = sd_kv_seq_make_private(w.p, q, pos, &from, &to);
                    if (rc == SD_EFULL)
                        break; /* the scheduler would preempt */
                    ASSERT(rc == 0 || rc == 1);
                    if (rc == 1) {
                        memcpy(w.mem + (size_t)to * w.bs, w.mem + (size_t)from * w.bs,
                               (size_t)w.bs * sizeof *w.mem);
                        cows++;
                    }
                    uint32_t v = (uint32_t)rnd(&rng, 1u << 30) + 1;
                    w.mem[sd_kv_seq_slot(w.p, q, pos)] = v;
                    m->val[pos] = v;
                    m->written++;
                }
                break;
            }
            case 5: { /* rollback of rejected positions */
                op = "truncate";
                int n = m->written ? (int)rnd(&rng, (uint32_t)m->written + 1) : 0;
                sd_kv_seq_truncate(w.p, q, n);
                m->written = n;
                ASSERT_EQ(q->n_blocks, sd_kv_blocks_for(w.p, n));
                break;
            }
            case 6: /* finish or cancel */
                op = "free";
                if (rnd(&rng, 3) == 0) {
                    sd_kv_seq_free(w.p, q);
                    m->written = 0;
                }
                break;
            case 7: { /* fork another sequence's prefix */
                op = "fork";
                int src = (int)rnd(&rng, NSEQ);
                if (src == s)
                    break;
                int nb = (int)rnd(&rng, (uint32_t)w.seq[src].n_blocks + 2);
                ASSERT_OK(sd_kv_seq_fork(w.p, q, &w.seq[src], nb));
                int shared = nb < w.seq[src].n_blocks ? nb : w.seq[src].n_blocks;
                int wr = shared * w.bs < w.m[src].written ? shared * w.bs : w.m[src].written;
                memcpy(m->val, w.m[src].val, (size_t)wr * sizeof *m->val);
                m->written = wr;
                break;
            }
            default: /* the prefix cache takes or drops a block */
                op = "cache";
                if (w.n_ext > 0 && (rnd(&rng, 2) || w.n_ext == MAX_EXT)) {
                    int i = (int)rnd(&rng, (uint32_t)w.n_ext);
                    sd_kv_block_decref(w.p, w.ext[i]);
                    w.ext[i] = w.ext[--w.n_ext];
                } else if (q->n_blocks > 0) {
                    int32_t b = q->blocks[rnd(&rng, (uint32_t)q->n_blocks)];
                    sd_kv_block_incref(w.p, b);
                    w.ext[w.n_ext++] = b;
                }
                break;
            }
            ok = check_world(&w, op);
        }
        for (int s = 0; s < NSEQ; s++)
            sd_kv_seq_free(w.p, &w.seq[s]);
        while (w.n_ext > 0)
            sd_kv_block_decref(w.p, w.ext[--w.n_ext]);
        int used = sd_kv_pool_used(w.p), fr = sd_kv_pool_free_blocks(w.p);
        int chk = sd_kv_pool_check(w.p, NULL);
        sd_kv_pool_free(w.p);
        free(w.mem);
        ASSERT(ok);
        ASSERT_EQ(used, 0);
        ASSERT_EQ(fr, w.nb);
        ASSERT_OK(chk);
    }
    fprintf(stderr, "  %ld operations, %ld refused as full, %ld copy-on-write\n", ops, efull, cows);
    ASSERT_GT(efull, 0);
    ASSERT_GT(cows, 0);
}

TEST_MAIN(T(pool_rejects_empty_shapes), T(reserve_truncate_free_round_trip_and_slots),
          T(full_reservation_changes_nothing), T(forked_blocks_are_shared_and_copied_on_write),
          T(misuse_and_broken_invariants_are_reported),
          T(random_operations_match_a_model_and_return_every_block))

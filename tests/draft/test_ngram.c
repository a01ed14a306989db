/* draft/ngram: prompt lookup, the rescanning form and the incremental index,
 * against a brute-force reference on random and repetitive histories. */
#include "core/util.h"
#include "draft/ngram.h"
#include "test.h"

/* Reference: for n = max_n .. min_n, the largest e in [n, L-1] with
 * tok[e-n, e) == tok[L-n, L); the proposal reads the history from e, extended
 * by itself. Returns the count and the matched n. */
static int ref_propose(const int32_t *tok, int L, int min_n, int max_n, int k, int32_t *out,
                       int *mn)
{
    *mn = 0;
    if (k <= 0)
        return 0;
    for (int n = max_n; n >= min_n; n--) {
        for (int e = L - 1; e >= n && L - n >= 0; e--) {
            int same = 1;
            for (int i = 0; i < n && same; i++)
                same = tok[e - n + i] == tok[L - n + i];
            if (!same)
                continue;
            int32_t ext[4096];
            memcpy(ext, tok, (size_t)L * sizeof *tok);
            for (int i = 0; i < k; i++) {
                out[i] = ext[e + i];
                ext[L + i] = out[i];
            }
            *mn = n;
            return k;
        }
    }
    return 0;
}

TEST(propose_hand_cases)
{
    int32_t out[8];
    /* 1 2 3 4 1 2: the 2-gram "1 2" ended at 2; "4 1 2" never occurred. */
    const int32_t a[] = {1, 2, 3, 4, 1, 2};
    ASSERT_EQ(sd_ngram_propose(a, 6, 3, 3, out), 3);
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[1], 4);
    ASSERT_EQ(out[2], 1);
    /* The most recent occurrence wins, and the proposal runs on into itself. */
    const int32_t b[] = {5, 7, 1, 5, 8, 2, 5};
    ASSERT_EQ(sd_ngram_propose(b, 7, 1, 5, out), 5);
    const int32_t want_b[5] = {8, 2, 5, 8, 2};
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(out[i], want_b[i]);
    /* The longest match wins over a more recent shorter one: "9 5" ended at 2,
     * "5" alone last ended at 5 (followed by 6). */
    const int32_t c[] = {9, 5, 1, 2, 5, 6, 9, 5};
    ASSERT_EQ(sd_ngram_propose(c, 8, 2, 2, out), 2);
    ASSERT_EQ(out[0], 1);
    ASSERT_EQ(out[1], 2);
    ASSERT_EQ(sd_ngram_propose(c, 8, 1, 2, out), 2);
    ASSERT_EQ(out[0], 6);
    /* A run repeats. */
    const int32_t d[] = {4, 4, 4, 4};
    ASSERT_EQ(sd_ngram_propose(d, 4, 3, 6, out), 6);
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(out[i], 4);
    /* Nothing to match. */
    const int32_t e[] = {1, 2, 3};
    ASSERT_EQ(sd_ngram_propose(e, 3, 3, 4, out), 0);
    ASSERT_EQ(sd_ngram_propose(e, 1, 3, 4, out), 0);
    ASSERT_EQ(sd_ngram_propose(e, 0, 3, 4, out), 0);
    ASSERT_EQ(sd_ngram_propose(a, 6, 3, 0, out), 0);
}

TEST(index_refuses_bad_lengths_and_stale_histories)
{
    sd_ngram *g = (sd_ngram *)1;
    sd_err err = {0};
    ASSERT_EQ(sd_ngram_create(&g, 0, 3, &err), SD_EINVAL);
    ASSERT(g == NULL);
    ASSERT_CONTAINS(err.msg, "0..3");
    ASSERT_EQ(sd_ngram_create(&g, 3, 2, &err), SD_EINVAL);
    ASSERT_EQ(sd_ngram_create(&g, 1, SD_NGRAM_MAX_N + 1, &err), SD_EINVAL);
    ASSERT_OK(sd_ngram_create(&g, 1, 3, &err));
    const int32_t a[] = {1, 2, 3, 1, 2};
    int32_t out[4];
    ASSERT_EQ(sd_ngram_lookup(g, a, 5, 4, out, NULL), SD_ESTATE); /* not indexed yet */
    ASSERT_OK(sd_ngram_update(g, a, 5, NULL));
    ASSERT_EQ(sd_ngram_lookup(g, a, 4, 4, out, NULL), SD_ESTATE);
    int mn;
    ASSERT_EQ(sd_ngram_lookup(g, a, 5, 4, out, &mn), 4);
    ASSERT_EQ(mn, 2);
    ASSERT_EQ(out[0], 3);
    /* A shorter, different history is re-indexed from scratch. */
    const int32_t b[] = {7, 8, 7};
    ASSERT_OK(sd_ngram_update(g, b, 3, NULL));
    ASSERT_EQ(sd_ngram_indexed(g), 3);
    ASSERT_EQ(sd_ngram_lookup(g, b, 3, 2, out, &mn), 2);
    ASSERT_EQ(mn, 1);
    ASSERT_EQ(out[0], 8);
    ASSERT_EQ(out[1], 7);
    sd_ngram_reset(g);
    ASSERT_EQ(sd_ngram_indexed(g), 0);
    ASSERT_EQ(sd_ngram_lookup(g, b, 0, 2, out, &mn), 0);
    sd_ngram_destroy(g);
}

/* Histories: uniform over a small alphabet (kind 0: 3 tokens, many matches;
 * kind 1: 40 tokens), or recent stretches repeated with noise (kind 2: what
 * code and chat outputs look like to prompt lookup). */
static int32_t next_token(uint64_t *rng, int kind, const int32_t *tok, int L)
{
    if (kind == 2 && L > 8 && sd_test_randf(rng, 0, 1) < 0.85f)
        return tok[L - (int)sd_test_randf(rng, 2, 9)];
    return (int32_t)sd_test_randf(rng, 0, kind == 0 ? 3 : kind == 1 ? 40 : 1000);
}

TEST(index_and_rescan_match_the_reference_on_every_prefix)
{
    uint64_t rng = sd_test_seed() | 1;
    enum { MAXL = 600, K = 7 };
    int32_t *tok = malloc(MAXL * sizeof *tok);
    long lookups = 0, matched = 0;
    for (int rep = 0; rep < 60; rep++) {
        const int kind = rep % 3;
        const int max_n = 1 + rep % 5, min_n = rep % 4 == 3 ? (max_n + 1) / 2 : 1;
        sd_ngram *g;
        ASSERT_OK(sd_ngram_create(&g, min_n, max_n, NULL));
        int L = 0;
        while (L < MAXL) {
            /* append a chunk (accepted tokens arrive several at a time) */
            int chunk = 1 + (int)sd_test_randf(&rng, 0, 6);
            for (int c = 0; c < chunk && L < MAXL; c++) {
                int32_t t = next_token(&rng, kind, tok, L);
                tok[L++] = t;
            }
            ASSERT_OK(sd_ngram_update(g, tok, L, NULL));
            int32_t a[K], b[K], r[K];
            int mn_a, mn_r;
            int k = (int)sd_test_randf(&rng, 0, K + 1);
            int na = sd_ngram_lookup(g, tok, L, k, a, &mn_a);
            int nr = ref_propose(tok, L, min_n, max_n, k, r, &mn_r);
            ASSERT_EQ(na, nr);
            ASSERT_EQ(mn_a, nr ? mn_r : 0);
            for (int i = 0; i < nr; i++)
                ASSERT_EQ(a[i], r[i]);
            if (min_n == 1) {
                int nb = sd_ngram_propose(tok, L, max_n, k, b);
                ASSERT_EQ(nb, nr);
                for (int i = 0; i < nr; i++)
                    ASSERT_EQ(b[i], r[i]);
            }
            lookups++;
            matched += nr > 0;
        }
        sd_ngram_destroy(g);
    }
    free(tok);
    fprintf(stderr, "  %ld lookups, %ld matched\n", lookups, matched);
    ASSERT_GT(matched, lookups / 4);
    ASSERT_LT(matched, lookups);
}

TEST(index_lookup_cost_does_not_grow_with_history)
{
    /* 200k tokens from a 5000-token vocabulary with repeats: appending one token
     * at a time and looking up after each must stay cheap, and agree with the
     * rescan at a few points. */
    enum { N = 200000, K = 5 };
    uint64_t rng = sd_test_seed() ^ 0x3c6ef372u;
    int32_t *tok = malloc(N * sizeof *tok);
    sd_ngram *g;
    ASSERT_OK(sd_ngram_create(&g, 1, 4, NULL));
    int32_t a[K], b[K];
    uint64_t t0 = sd_now_ns();
    long hits = 0;
    for (int L = 0; L < N; L++) {
        tok[L] = L > 16 && sd_test_randf(&rng, 0, 1) < 0.5f
                     ? tok[(int)sd_test_randf(&rng, 0, (float)(L - 1))]
                     : (int32_t)sd_test_randf(&rng, 0, 5000);
        ASSERT_OK(sd_ngram_update(g, tok, L + 1, NULL));
        hits += sd_ngram_lookup(g, tok, L + 1, K, a, NULL) > 0;
    }
    double per = (double)(sd_now_ns() - t0) / N;
    int na = sd_ngram_lookup(g, tok, N, K, a, NULL), nb = sd_ngram_propose(tok, N, 4, K, b);
    ASSERT_EQ(na, nb);
    for (int i = 0; i < na; i++)
        ASSERT_EQ(a[i], b[i]);
    fprintf(stderr, "  %d tokens: %.0f ns per append + lookup, %ld hits\n", N, per, hits);
    ASSERT_GT(hits, N / 2);
    sd_ngram_destroy(g);
    free(tok);
}

TEST_MAIN(T(propose_hand_cases), T(index_refuses_bad_lengths_and_stale_histories),
          T(index_and_rescan_match_the_reference_on_every_prefix),
          T(index_lookup_cost_does_not_grow_with_history))

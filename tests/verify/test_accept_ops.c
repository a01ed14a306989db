/* kernels/cpu accept_sample_rows against the host functions it lays over a
 * batch: for every sequence, the probability rows are sd_sampling_probs of
 * its logits rows (bit for bit) and n_acc / the tokens are what
 * sd_accept_chain returns on those rows, whatever the other sequences, the
 * row layout (dense or packed with row0), the per-sequence draft counts and
 * the thread split. That rule is lossless by test_accept.c's chi-square
 * checks; here it is only pinned that the op is that rule. Random logits,
 * drafts from a perturbed copy of the target (so chains both accept and
 * reject), greedy, plain, top-k and top-p sequences mixed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "test.h"
#include "verify/accept.h"
#include "verify/sampling.h"

static int rnd_int(uint64_t *rng, int n) /* [0, n) */
{
    int v = (int)sd_test_randf(rng, 0.0f, (float)n);
    return v < n ? v : n - 1;
}

static sd_sample_params params_of(uint64_t *rng, int s)
{
    sd_sample_params p = {0};
    p.seed = ((uint64_t)rnd_int(rng, 1 << 30) << 20) ^ (uint64_t)rnd_int(rng, 1 << 20);
    p.counter = (uint64_t)rnd_int(rng, 4096);
    p.temperature = sd_test_randf(rng, 0.6f, 1.2f);
    p.top_p = 1.0f;
    switch (s % 5) {
    case 0: p.temperature = 0.0f; break; /* greedy */
    case 1: break;
    case 2: p.top_k = 1 + rnd_int(rng, 40); break;
    case 3: p.top_p = sd_test_randf(rng, 0.5f, 0.98f); break;
    case 4:
        p.top_k = 1 + rnd_int(rng, 300);
        p.top_p = sd_test_randf(rng, 0.5f, 0.98f);
        break;
    }
    return p;
}

static sd_sampling sampling_of(const sd_sample_params *p)
{
    return (sd_sampling){p->temperature, p->top_p, p->top_k, p->seed};
}

/* One call's inputs: n_seq sequences, k drafts at most, V tokens. */
typedef struct batch {
    int n_seq, k, V, R; /* R: logits rows */
    int with_q, packed;
    float *logits;      /* (R, V) */
    float *q;           /* (n_seq, k, V) or NULL */
    int32_t *draft;     /* (n_seq, k) */
    int32_t *n_draft;   /* (n_seq) */
    int32_t *row0;      /* (n_seq) or NULL */
    sd_sample_params *p;
} batch;

/* Target rows: noise plus a few strong tokens. Draft rows: the target's logits
 * plus noise, so q is near p and chains accept and reject. Drafts are sampled
 * from q (stream DRAFT), or, without q, the target's own sample (accepted)
 * or a random token. Packed layout: one unused row after every sequence. */
static void make_batch(uint64_t *rng, batch *b, int n_seq, int k, int V, int with_q, int packed)
{
    memset(b, 0, sizeof *b);
    b->n_seq = n_seq;
    b->k = k;
    b->V = V;
    b->with_q = with_q;
    b->packed = packed;
    b->n_draft = malloc((size_t)n_seq * sizeof *b->n_draft);
    b->p = malloc((size_t)n_seq * sizeof *b->p);
    b->draft = malloc(((size_t)n_seq * k + 1) * sizeof *b->draft);
    if (packed)
        b->row0 = malloc((size_t)n_seq * sizeof *b->row0);
    int R = 0;
    for (int s = 0; s < n_seq; s++) {
        b->n_draft[s] = s % 3 == 2 ? rnd_int(rng, k + 1) : k;
        b->p[s] = params_of(rng, s);
        if (packed) {
            b->row0[s] = R;
            R += b->n_draft[s] + 2;
        }
    }
    b->R = packed ? R : n_seq * (k + 1);
    const size_t v = (size_t)V;
    b->logits = malloc((size_t)b->R * v * sizeof *b->logits);
    for (size_t i = 0; i < (size_t)b->R * v; i++)
        b->logits[i] = sd_test_randf(rng, -3.0f, 3.0f);
    if (with_q)
        b->q = malloc(((size_t)n_seq * k * v + 1) * sizeof *b->q);
    float *dl = malloc(v * sizeof *dl), *pr = malloc(v * sizeof *pr);
    for (int s = 0; s < n_seq; s++) {
        size_t r0 = packed ? (size_t)b->row0[s] : (size_t)s * (size_t)(k + 1);
        sd_sampling smp = sampling_of(&b->p[s]);
        for (int i = 0; i <= b->n_draft[s]; i++) {
            float *row = b->logits + (r0 + (size_t)i) * v;
            const int strong = 1 + rnd_int(rng, 6);
            for (int j = 0; j < strong; j++)
                row[rnd_int(rng, V)] += sd_test_randf(rng, 3.0f, 9.0f);
        }
        for (int i = 0; i < b->n_draft[s]; i++) {
            const float *row = b->logits + (r0 + (size_t)i) * v;
            uint64_t ctr = b->p[s].counter + (uint64_t)i;
            int32_t *d = &b->draft[(size_t)s * k + i];
            if (with_q) {
                for (int j = 0; j < V; j++)
                    dl[j] = row[j] + sd_test_randf(rng, -1.0f, 1.0f);
                float *qi = b->q + ((size_t)s * k + i) * v;
                sd_sampling_probs(dl, V, &smp, qi);
                *d = sd_sample(qi, V, sd_rand_uniform(smp.seed, ctr, SD_RNG_DRAFT));
            } else if (rnd_int(rng, 4) < 3) {
                sd_sampling_probs(row, V, &smp, pr);
                *d = sd_sample(pr, V, sd_rand_uniform(smp.seed, ctr, SD_RNG_TARGET));
            } else {
                *d = rnd_int(rng, V);
            }
        }
        for (int i = b->n_draft[s]; i < k; i++)
            b->draft[(size_t)s * k + i] = -5; /* past kd: never read */
    }
    free(dl);
    free(pr);
}

static void free_batch(batch *b)
{
    free(b->logits);
    free(b->q);
    free(b->draft);
    free(b->n_draft);
    free(b->row0);
    free(b->p);
}

static size_t row0_of(const batch *b, int s)
{
    return b->row0 ? (size_t)b->row0[s] : (size_t)s * (size_t)(b->k + 1);
}

/* Runs the op with NaN-poisoned probs and -7-poisoned tokens. */
static void run_op(sd_backend *be, const batch *b, int32_t *n_acc, int32_t *out, float *probs)
{
    for (size_t i = 0; i < (size_t)b->R * b->V; i++)
        probs[i] = NAN;
    for (int i = 0; i < b->n_seq * (b->k + 1); i++)
        out[i] = -7;
    be->ops->accept_sample_rows(be, n_acc, out, probs, b->logits, b->row0, b->q, b->draft,
                                b->n_draft, b->p, b->n_seq, b->k, b->V);
}

TEST(accept_sample_rows_equals_sd_accept_chain_on_each_sequence)
{
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 3));
    const int Vs[] = {1, 5, 300, 1003, 32003};
    int accepted = 0, rejected = 0, all = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        for (int k = 0; k <= 5; k++) {
            for (int mode = 0; mode < 4; mode++) {
                const int V = Vs[vi], n_seq = V > 10000 ? 5 : 11;
                batch b;
                make_batch(&rng, &b, n_seq, k, V, mode & 1, mode >> 1);
                const size_t v = (size_t)V;
                float *probs = malloc((size_t)b.R * v * sizeof *probs);
                float *ref = malloc((size_t)(k + 1) * v * sizeof *ref);
                int32_t *out = malloc((size_t)n_seq * (k + 1) * sizeof *out);
                int32_t n_acc[11], want[6];
                run_op(be, &b, n_acc, out, probs);
                ASSERT_OK(be->ops->sync(be));
                char *used = calloc((size_t)b.R, 1);
                for (int s = 0; s < n_seq; s++) {
                    const int kd = b.n_draft[s];
                    const size_t r0 = row0_of(&b, s);
                    sd_sampling smp = sampling_of(&b.p[s]);
                    for (int i = 0; i <= kd; i++) {
                        sd_sampling_probs(b.logits + (r0 + i) * v, V, &smp, ref + i * v);
                        used[r0 + i] = 1;
                    }
                    ASSERT(memcmp(ref, probs + r0 * v, (size_t)(kd + 1) * v * sizeof *ref) == 0);
                    int n = sd_accept_chain(&smp, V, kd, b.draft + (size_t)s * k, ref,
                                            b.q ? b.q + (size_t)s * k * v : NULL, b.p[s].counter,
                                            want, NULL);
                    ASSERT(n >= 0 && n <= kd);
                    ASSERT_EQ(n_acc[s], n);
                    const int32_t *o = out + (size_t)s * (k + 1);
                    for (int i = 0; i <= n; i++)
                        ASSERT_EQ(o[i], want[i]);
                    for (int i = n + 1; i <= k; i++)
                        ASSERT_EQ(o[i], -7); /* not written */
                    accepted += n;
                    rejected += n < kd;
                    all += kd > 0 && n == kd;
                }
                /* rows of no sequence (the packed layout's gaps) are untouched */
                for (int r = 0; r < b.R; r++)
                    if (!used[r])
                        for (int j = 0; j < V; j++)
                            ASSERT(isnan(probs[(size_t)r * v + j]));
                free(used);
                free(probs);
                free(ref);
                free(out);
                free_batch(&b);
            }
        }
    }
    /* the inputs exercised every branch: accepts, rejections, full chains */
    ASSERT_GT(accepted, 50);
    ASSERT_GT(rejected, 50);
    ASSERT_GT(all, 20);
    sd_cpu_backend_destroy(be);
}

TEST(accept_sample_rows_gives_a_sequence_the_same_result_alone_or_in_a_batch)
{
    uint64_t rng = sd_test_seed() ^ 0x5eed;
    sd_backend *be, *be1;
    ASSERT_OK(sd_cpu_backend_create(&be, 4));
    ASSERT_OK(sd_cpu_backend_create(&be1, 1));
    const int V = 700, k = 4, n_seq = 13;
    batch b;
    make_batch(&rng, &b, n_seq, k, V, 1, 1);
    const size_t v = (size_t)V;
    float *probs = malloc((size_t)b.R * v * sizeof *probs), *one_p = malloc((k + 1) * v * 4);
    int32_t *out = malloc((size_t)n_seq * (k + 1) * sizeof *out), n_acc[13];
    run_op(be, &b, n_acc, out, probs);
    for (int s = 0; s < n_seq; s++) {
        /* sequence s alone, dense layout, on one thread */
        int32_t one_n = -9, one_out[5] = {-7, -7, -7, -7, -7};
        const size_t r0 = row0_of(&b, s);
        be1->ops->accept_sample_rows(be1, &one_n, one_out, one_p, b.logits + r0 * v, NULL,
                                     b.q + (size_t)s * k * v, b.draft + (size_t)s * k,
                                     &b.n_draft[s], &b.p[s], 1, k, V);
        ASSERT_EQ(one_n, n_acc[s]);
        ASSERT(memcmp(one_out, out + (size_t)s * (k + 1), sizeof one_out) == 0);
        ASSERT(memcmp(one_p, probs + r0 * v, (size_t)(b.n_draft[s] + 1) * v * 4) == 0);
    }
    free(probs);
    free(one_p);
    free(out);
    free_batch(&b);
    sd_cpu_backend_destroy(be);
    sd_cpu_backend_destroy(be1);
}

TEST(accept_sample_rows_refuses_bad_draft_counts_and_ids_per_sequence)
{
    uint64_t rng = sd_test_seed() ^ 0xbad;
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int V = 50, k = 3, n_seq = 6;
    batch b;
    make_batch(&rng, &b, n_seq, k, V, 1, 0);
    for (int s = 0; s < n_seq; s++)
        b.n_draft[s] = k;
    /* fill in drafts for every position (make_batch left some past kd) */
    for (int i = 0; i < n_seq * k; i++)
        if (b.draft[i] < 0)
            b.draft[i] = rnd_int(&rng, V);
    b.n_draft[1] = -1;      /* bad count */
    b.n_draft[2] = k + 1;   /* bad count */
    b.draft[3 * k + 2] = V; /* bad id at the last position */
    b.draft[4 * k + 0] = -3;
    float *probs = malloc((size_t)b.R * V * sizeof *probs);
    int32_t out[6 * 4], n_acc[6];
    run_op(be, &b, n_acc, out, probs);
    for (int s = 1; s <= 4; s++) {
        ASSERT_EQ(n_acc[s], SD_EINVAL);
        for (int i = 0; i <= k; i++)
            ASSERT_EQ(out[s * (k + 1) + i], -7);
    }
    /* the others are verified as usual */
    for (int s = 0; s < n_seq; s += 5) {
        ASSERT(n_acc[s] >= 0 && n_acc[s] <= k);
        ASSERT(out[s * (k + 1) + n_acc[s]] >= 0);
    }
    free(probs);
    free_batch(&b);
    sd_cpu_backend_destroy(be);
}

TEST_MAIN(T(accept_sample_rows_equals_sd_accept_chain_on_each_sequence),
          T(accept_sample_rows_gives_a_sequence_the_same_result_alone_or_in_a_batch),
          T(accept_sample_rows_refuses_bad_draft_counts_and_ids_per_sequence))

/* kernels/cpu sampling ops (argmax_rows, sample_rows, accept_greedy_rows)
 * against the host functions of src/verify they lay over a batch: each row of
 * the op equals the host call on that row alone, whatever the other rows and
 * the thread split. Random logits, vocabularies from 1 to 32k (ragged sizes
 * that are not multiples of anything), greedy and sampled rows mixed. */
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

/* n rows of V logits in [-scale, scale) with a planted tie of the maximum
 * (lowest id must win) in some rows and a NaN in others. */
static float *make_logits(uint64_t *rng, int n, int V, float scale)
{
    float *x = malloc((size_t)n * (size_t)V * sizeof *x);
    for (size_t i = 0; i < (size_t)n * (size_t)V; i++)
        x[i] = sd_test_randf(rng, -scale, scale);
    for (int r = 0; r < n && V > 2; r++) {
        float *row = x + (size_t)r * (size_t)V;
        if (r % 3 == 0) {
            int a = rnd_int(rng, V), b = rnd_int(rng, V);
            row[a] = row[b] = 2 * scale; /* tie at the top */
        } else if (r % 3 == 1) {
            row[rnd_int(rng, V)] = NAN;
        }
    }
    return x;
}

TEST(argmax_rows_equals_sd_argmax_of_each_row)
{
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int Vs[] = {1, 2, 7, 300, 1003, 32003};
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        int V = Vs[vi], n = 11;
        float *x = make_logits(&rng, n, V, 4.0f);
        if (V > 3) /* a row of NaN only: 0 */
            for (int i = 0; i < V; i++)
                x[(size_t)5 * V + i] = NAN;
        int32_t out[11];
        memset(out, 0xff, sizeof out);
        be->ops->argmax_rows(be, out, x, n, V);
        ASSERT_OK(be->ops->sync(be));
        for (int r = 0; r < n; r++)
            ASSERT_EQ(out[r], sd_argmax(x + (size_t)r * V, V));
        if (V > 3)
            ASSERT_EQ(out[5], 0);
        free(x);
    }
    sd_cpu_backend_destroy(be);
}

/* Row r's parameters: a mix of greedy, plain, top-k, top-p and both. */
static sd_sample_params params_of(uint64_t *rng, int r)
{
    sd_sample_params p = {0};
    p.seed = ((uint64_t)rnd_int(rng, 1 << 30) << 20) ^ (uint64_t)rnd_int(rng, 1 << 20);
    p.counter = (uint64_t)rnd_int(rng, 4096);
    p.temperature = sd_test_randf(rng, 0.3f, 1.5f);
    p.top_p = 1.0f;
    p.top_k = 0;
    switch (r % 6) {
    case 0: p.temperature = 0.0f; break; /* greedy */
    case 1: break;                        /* softmax only */
    case 2: p.top_k = 1 + rnd_int(rng, 50); break;
    case 3: p.top_p = sd_test_randf(rng, 0.3f, 0.95f); break;
    case 4:
        p.top_k = 1 + rnd_int(rng, 500);
        p.top_p = sd_test_randf(rng, 0.3f, 0.95f);
        break;
    case 5: p.temperature = -1.0f; break; /* greedy too */
    }
    return p;
}

TEST(sample_rows_equals_the_host_distribution_and_sample_of_each_row)
{
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int Vs[] = {1, 5, 256, 257, 5003, 32003};
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        int V = Vs[vi], n = 13;
        float *x = make_logits(&rng, n, V, 6.0f);
        sd_sample_params p[13];
        for (int r = 0; r < n; r++) {
            p[r] = params_of(&rng, r);
            p[r].stream = r % 3 == 1 ? SD_RNG_DRAFT : SD_RNG_TARGET; /* a draft's own stream */
        }
        float *probs = malloc((size_t)n * V * sizeof *probs);
        float *ref = malloc((size_t)V * sizeof *ref);
        int32_t out[13], one;
        be->ops->sample_rows(be, out, probs, x, p, n, V);
        ASSERT_OK(be->ops->sync(be));
        for (int r = 0; r < n; r++) {
            const float *row = x + (size_t)r * V;
            sd_sampling s = {p[r].temperature, p[r].top_p, p[r].top_k, p[r].seed};
            sd_sampling_probs(row, V, &s, ref);
            ASSERT(memcmp(ref, probs + (size_t)r * V, (size_t)V * sizeof *ref) == 0);
            int32_t want = sd_sample(ref, V, sd_rand_uniform(p[r].seed, p[r].counter, p[r].stream));
            ASSERT_EQ(out[r], want);
            ASSERT(ref[out[r]] > 0.0f);
            if (!(p[r].temperature > 0) || p[r].top_k == 1)
                ASSERT_EQ(out[r], sd_argmax(row, V));
            /* the same row alone in a batch of one gives the same token */
            be->ops->sample_rows(be, &one, ref, row, &p[r], 1, V);
            ASSERT_OK(be->ops->sync(be));
            ASSERT_EQ(one, out[r]);
        }
        free(x);
        free(probs);
        free(ref);
    }
    sd_cpu_backend_destroy(be);
}

TEST(sample_rows_draws_each_row_from_its_own_counter)
{
    /* the same logits in every row, counters 0..n-1: the tokens are the
     * host's draws at those counters, and a flat distribution gives several
     * distinct tokens (the rows do not share one uniform) */
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    enum { n = 64, V = 100 };
    float *x = malloc((size_t)n * V * sizeof *x), *probs = malloc((size_t)n * V * sizeof *probs);
    for (int i = 0; i < V; i++)
        x[i] = sd_test_randf(&rng, -0.1f, 0.1f);
    for (int r = 1; r < n; r++)
        memcpy(x + (size_t)r * V, x, V * sizeof *x);
    sd_sample_params p[n];
    uint64_t seed = (uint64_t)rnd_int(&rng, 1 << 30);
    for (int r = 0; r < n; r++)
        p[r] = (sd_sample_params){1.0f, 1.0f, 0, 0, seed, (uint64_t)r};
    int32_t out[n];
    be->ops->sample_rows(be, out, probs, x, p, n, V);
    ASSERT_OK(be->ops->sync(be));
    int distinct = 0;
    char seen[V] = {0};
    for (int r = 0; r < n; r++) {
        ASSERT_EQ(out[r], sd_sample(probs, V, sd_rand_uniform(seed, (uint64_t)r, SD_RNG_TARGET)));
        distinct += !seen[out[r]];
        seen[out[r]] = 1;
    }
    ASSERT_GT(distinct, 20);
    free(x);
    free(probs);
    sd_cpu_backend_destroy(be);
}

TEST(accept_greedy_rows_accepts_the_matching_prefix_and_writes_n_plus_one_tokens)
{
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int ks[] = {0, 1, 4, 7};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        int k = ks[ki], n_seq = 9, V = 1000;
        int32_t *draft = malloc((size_t)(n_seq * k + 1) * sizeof *draft);
        int32_t *am = malloc((size_t)n_seq * (k + 1) * sizeof *am);
        int32_t *out = malloc((size_t)n_seq * (k + 1) * sizeof *out);
        int32_t *ref = malloc((size_t)(k + 1) * sizeof *ref);
        int planted[9], n_acc[9];
        for (int s = 0; s < n_seq; s++) {
            planted[s] = rnd_int(&rng, k + 1); /* drafts 0..planted-1 match */
            for (int i = 0; i <= k; i++)
                am[s * (k + 1) + i] = rnd_int(&rng, V);
            for (int i = 0; i < k; i++)
                draft[s * k + i] = i < planted[s] ? am[s * (k + 1) + i]
                                                  : (am[s * (k + 1) + i] + 1 + rnd_int(&rng, V - 1)) % V;
        }
        for (int i = 0; i < n_seq * (k + 1); i++)
            out[i] = -7;
        be->ops->accept_greedy_rows(be, n_acc, out, draft, am, n_seq, k);
        ASSERT_OK(be->ops->sync(be));
        for (int s = 0; s < n_seq; s++) {
            ASSERT_EQ(n_acc[s], planted[s]);
            ASSERT_EQ(n_acc[s], sd_accept_greedy(k, draft + s * k, am + s * (k + 1), ref));
            const int32_t *o = out + s * (k + 1);
            for (int i = 0; i < n_acc[s]; i++)
                ASSERT_EQ(o[i], draft[s * k + i]);
            ASSERT_EQ(o[n_acc[s]], am[s * (k + 1) + n_acc[s]]);
            for (int i = n_acc[s] + 1; i <= k; i++)
                ASSERT_EQ(o[i], -7); /* not written */
        }
        free(draft);
        free(am);
        free(out);
        free(ref);
    }
    sd_cpu_backend_destroy(be);
}

TEST(scatter_cols_places_each_column_through_the_map_and_zeroes_the_rest)
{
    uint64_t rng = sd_test_seed();
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    enum { N = 7, WS = 40, WD = 173 };
    int32_t map[WD];
    for (int i = 0; i < WD; i++)
        map[i] = i;
    for (int i = WD - 1; i > 0; i--) { /* a random injective map: a shuffled prefix */
        int j = rnd_int(&rng, i + 1), t = map[i];
        map[i] = map[j];
        map[j] = t;
    }
    float *src = make_logits(&rng, N, WS, 3.0f), *dst = malloc(N * WD * sizeof *dst);
    for (int i = 0; i < N * WD; i++)
        dst[i] = NAN; /* every element must be written */
    be->ops->scatter_cols(be, dst, src, map, N, WS, WD);
    ASSERT_OK(be->ops->sync(be));
    for (int i = 0; i < N; i++) {
        int placed = 0;
        for (int c = 0; c < WD; c++) {
            int from = -1;
            for (int k = 0; k < WS; k++)
                if (map[k] == c)
                    from = k;
            float want = from >= 0 ? src[i * WS + from] : 0.0f;
            ASSERT(memcmp(&dst[i * WD + c], &want, sizeof want) == 0);
            placed += from >= 0;
        }
        ASSERT_EQ(placed, WS);
    }
    free(src);
    free(dst);
    sd_cpu_backend_destroy(be);
}

TEST_MAIN(T(argmax_rows_equals_sd_argmax_of_each_row),
          T(scatter_cols_places_each_column_through_the_map_and_zeroes_the_rest),
          T(sample_rows_equals_the_host_distribution_and_sample_of_each_row),
          T(sample_rows_draws_each_row_from_its_own_counter),
          T(accept_greedy_rows_accepts_the_matching_prefix_and_writes_n_plus_one_tokens))

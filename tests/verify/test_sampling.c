/* verify/sampling: the target distribution (temperature, top-k, top-p) against a
 * sort-based reference, inverse-CDF sampling, the counter-based RNG. */
#include <float.h>

#include "core/util.h"
#include "test.h"
#include "verify/chisq.h"
#include "verify/sampling.h"

/* ---- reference: sort everything ------------------------------------------------ */

typedef struct ref_item {
    float w;
    int id;
} ref_item;

static int ref_cmp(const void *a, const void *b)
{
    const ref_item *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return x->id - y->id;
}

/* The definition of sampling.h, written the obvious way: w computed with the
 * same float expression, a full sort by (w desc, id asc), the top-k prefix,
 * then the shortest prefix of it holding top_p of its mass. out (V,) in double;
 * *boundary_gap gets |cumulative mass - target| at the top-p cut relative to
 * the mass (a small gap means rounding may move the cut by a tie). */
static void ref_probs(const float *logits, int V, const sd_sampling *s, double *out,
                      double *boundary_gap)
{
    *boundary_gap = INFINITY;
    for (int i = 0; i < V; i++)
        out[i] = 0;
    float temp = s->temperature;
    if (!(temp > 0) || !(1.0f / temp < INFINITY)) {
        out[sd_argmax(logits, V)] = 1;
        return;
    }
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > m)
            m = logits[i];
    if (m == -INFINITY) {
        out[sd_argmax(logits, V)] = 1;
        return;
    }
    const float inv_t = 1.0f / temp;
    ref_item *it = malloc((size_t)V * sizeof *it);
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        float w = m == INFINITY ? (l == INFINITY ? 1.0f : 0.0f)
                  : isnan(l)    ? 0.0f
                                : expf((l - m) * inv_t);
        it[i].w = w;
        it[i].id = i;
    }
    qsort(it, (size_t)V, sizeof *it, ref_cmp);
    int k = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    float top_p = s->top_p;
    if (!(top_p > 0)) {
        k = 1;
        top_p = 1;
    }
    int kept = k;
    if (top_p < 1) {
        double wk = 0, c = 0;
        for (int j = 0; j < k; j++)
            wk += it[j].w;
        double target = (double)top_p * wk;
        int j = 0;
        while (j < k) {
            c += it[j].w;
            j++;
            if (c >= target)
                break;
        }
        kept = j;
        *boundary_gap = fabs(c - target) / wk;
        if (j >= 1)
            *boundary_gap = fmin(*boundary_gap, fabs(c - it[j - 1].w - target) / wk);
    }
    double total = 0;
    for (int j = 0; j < kept; j++)
        total += it[j].w;
    for (int j = 0; j < kept; j++)
        out[it[j].id] = it[j].w / total;
    free(it);
}

/* Fills logits (V,) in one of several shapes: smooth, heavy ties, spiky with
 * -inf/NaN holes, all equal, a few +inf. */
static void make_logits(float *l, int V, int shape, uint64_t *rng)
{
    for (int i = 0; i < V; i++) {
        switch (shape) {
        case 0:
            l[i] = sd_test_randf(rng, -10, 10);
            break;
        case 1:
            l[i] = (float)(int)sd_test_randf(rng, -3, 4);
            break;
        case 2: {
            float r = sd_test_randf(rng, 0, 1);
            l[i] = r < 0.05f   ? -INFINITY
                   : r < 0.07f ? NAN
                               : 3 * sd_test_randf(rng, -1, 1) * sd_test_randf(rng, -1, 1) * 4;
            break;
        }
        case 3:
            l[i] = 1.5f;
            break;
        default:
            l[i] = sd_test_randf(rng, 0, 1) < 0.01f ? INFINITY : sd_test_randf(rng, -5, 5);
            break;
        }
    }
    if (shape == 4)
        l[(int)sd_test_randf(rng, 0, (float)V)] = INFINITY;
}

/* Compares sd_sampling_probs with the reference on one case; returns 1 when the
 * kept sets differ only by a tie that rounding may move (counted by the caller). */
static int check_case(const float *logits, int V, const sd_sampling *s, float *probs, double *ref,
                      int *bad)
{
    double gap;
    for (int i = 0; i < V; i++)
        probs[i] = NAN; /* poison */
    sd_sampling_probs(logits, V, s, probs);
    ref_probs(logits, V, s, ref, &gap);
    int set_diff = 0;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        if (!(probs[i] >= 0) || probs[i] > 1) {
            fprintf(stderr, "  V=%d T=%g k=%d p=%g: probs[%d] = %g\n", V, s->temperature, s->top_k,
                    s->top_p, i, probs[i]);
            *bad = 1;
            return 0;
        }
        sum += probs[i];
        if ((probs[i] > 0) != (ref[i] > 0))
            set_diff = 1;
    }
    if (fabs(sum - 1) > 1e-5) {
        fprintf(stderr, "  V=%d: probs sum to %.9g\n", V, sum);
        *bad = 1;
        return 0;
    }
    if (set_diff) {
        if (gap < 1e-9)
            return 1;
        fprintf(stderr, "  V=%d T=%g k=%d p=%g: kept sets differ (cut gap %.3g)\n", V,
                s->temperature, s->top_k, s->top_p, gap);
        *bad = 1;
        return 0;
    }
    for (int i = 0; i < V; i++) {
        if (fabs(probs[i] - ref[i]) > 1e-7 + 1e-6 * ref[i]) {
            fprintf(stderr, "  V=%d T=%g k=%d p=%g: probs[%d] %.9g vs reference %.9g\n", V,
                    s->temperature, s->top_k, s->top_p, i, probs[i], ref[i]);
            *bad = 1;
            return 0;
        }
    }
    return 0;
}

TEST(probs_match_sorted_reference_for_temperature_top_k_top_p)
{
    uint64_t rng = sd_test_seed() | 1;
    static const int vocabs[] = {1, 2, 3, 7, 12, 50, 255, 256, 257, 1000, 4099, 32000};
    const int max_v = 32000;
    float *logits = malloc(max_v * sizeof *logits), *probs = malloc(max_v * sizeof *probs);
    double *ref = malloc(max_v * sizeof *ref);
    int cases = 0, tie_moves = 0, bad = 0;
    for (int rep = 0; rep < 8 && !bad; rep++) {
        for (size_t vi = 0; vi < SD_ARRAY_LEN(vocabs) && !bad; vi++) {
            const int V = vocabs[vi];
            for (int shape = 0; shape < 5 && !bad; shape++) {
                make_logits(logits, V, shape, &rng);
                static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 2.5f};
                const int ks[] = {0, 1, 2, 5, 40, V - 1, V, V + 3};
                const float ps[] = {1.0f, 0.9f, sd_test_randf(&rng, 0.05f, 0.999f), 1e-6f, 0.0f};
                sd_sampling s = {temps[(int)sd_test_randf(&rng, 0, 5)],
                                 ps[(int)sd_test_randf(&rng, 0, 5)],
                                 ks[(int)sd_test_randf(&rng, 0, 8)], 0};
                tie_moves += check_case(logits, V, &s, probs, ref, &bad);
                cases++;
            }
        }
    }
    fprintf(stderr, "  %d cases, %d cut moved by a tie within rounding\n", cases, tie_moves);
    free(logits);
    free(probs);
    free(ref);
    ASSERT(!bad);
    ASSERT_LE(tie_moves * 50, cases);
}

TEST(probs_keep_lowest_ids_among_equal_probabilities)
{
    /* All logits equal: top-k keeps ids 0..k-1, top-p keeps the first ceil(p V)
     * ids, each with probability 1 / kept. Both the sort path (V <= 256) and
     * the radix path. */
    static const int vocabs[] = {200, 1000};
    for (size_t vi = 0; vi < SD_ARRAY_LEN(vocabs); vi++) {
        const int V = vocabs[vi];
        float *l = malloc((size_t)V * sizeof *l), *p = malloc((size_t)V * sizeof *p);
        for (int i = 0; i < V; i++)
            l[i] = 0.25f;
        sd_sampling s = {0.8f, 1.0f, 10, 0};
        sd_sampling_probs(l, V, &s, p);
        for (int i = 0; i < V; i++)
            ASSERT_NEAR(p[i], i < 10 ? 0.1 : 0.0, 1e-7);
        s = (sd_sampling){0.8f, 0.25f, 0, 0};
        sd_sampling_probs(l, V, &s, p);
        int kept = (int)ceil(0.25 * V);
        for (int i = 0; i < V; i++)
            ASSERT_NEAR(p[i], i < kept ? 1.0 / kept : 0.0, 1e-7);
        /* top-k then top-p: of 10 tokens, 0.25 of the mass is 3 tokens (2.5 rounded up). */
        s = (sd_sampling){0.8f, 0.25f, 10, 0};
        sd_sampling_probs(l, V, &s, p);
        for (int i = 0; i < V; i++)
            ASSERT_NEAR(p[i], i < 3 ? 1.0 / 3 : 0.0, 1e-7);
        free(l);
        free(p);
    }
}

TEST(probs_greedy_and_degenerate_logits)
{
    float p[6];
    sd_sampling greedy = {0.0f, 0.5f, 3, 0};
    const float a[6] = {1, 7, NAN, 7, -INFINITY, 2};
    sd_sampling_probs(a, 6, &greedy, p);
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(p[i], i == 1 ? 1.0 : 0.0, 0);
    /* A temperature so small that 1/T overflows is greedy too. */
    sd_sampling tiny = {1e-39f, 1.0f, 0, 0};
    sd_sampling_probs(a, 6, &tiny, p);
    ASSERT_NEAR(p[1], 1.0, 0);

    /* No logit above -inf: one-hot at the argmax (the first non-NaN). */
    const float none[6] = {NAN, -INFINITY, -INFINITY, NAN, -INFINITY, -INFINITY};
    sd_sampling t1 = {1.0f, 1.0f, 0, 0};
    sd_sampling_probs(none, 6, &t1, p);
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(p[i], i == 1 ? 1.0 : 0.0, 0);

    /* +inf logits share all the mass; NaN counts as -inf. */
    const float inf2[6] = {0, INFINITY, NAN, 50, INFINITY, -3};
    sd_sampling_probs(inf2, 6, &t1, p);
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(p[i], (i == 1 || i == 4) ? 0.5 : 0.0, 0);

    /* s == NULL: softmax at T = 1. */
    const float b[3] = {0, logf(2), logf(5)};
    sd_sampling_probs(b, 3, NULL, p);
    ASSERT_NEAR(p[0], 1.0 / 8, 1e-7);
    ASSERT_NEAR(p[1], 2.0 / 8, 1e-7);
    ASSERT_NEAR(p[2], 5.0 / 8, 1e-7);

    /* top_p <= 0 keeps the single most likely token; top_k >= vocab is off. */
    sd_sampling p0 = {1.0f, 0.0f, 0, 0};
    sd_sampling_probs(b, 3, &p0, p);
    ASSERT_NEAR(p[2], 1.0, 0);
    sd_sampling kall = {1.0f, 1.0f, 3, 0};
    sd_sampling_probs(b, 3, &kall, p);
    ASSERT_NEAR(p[0], 1.0 / 8, 1e-7);
}

TEST(probs_large_vocab_timing)
{
    /* Qwen-sized vocabulary: checks against the reference once per setting and
     * prints the time per row (the radix select is O(V)). */
    const int V = 151936;
    float *l = malloc(V * sizeof *l), *p = malloc(V * sizeof *p);
    double *ref = malloc(V * sizeof *ref);
    uint64_t rng = sd_test_seed() ^ 0x5bd1e995u;
    for (int i = 0; i < V; i++)
        l[i] =
            4 * sd_test_randf(&rng, -1, 1) * sd_test_randf(&rng, 0, 1) * sd_test_randf(&rng, 0, 1);
    const sd_sampling cfg[4] = {
        {0.7f, 1.0f, 0, 0}, {0.7f, 0.9f, 0, 0}, {0.7f, 1.0f, 50, 0}, {1.0f, 0.95f, 100, 0}};
    int bad = 0;
    for (int c = 0; c < 4; c++) {
        check_case(l, V, &cfg[c], p, ref, &bad);
        ASSERT(!bad);
        const int reps = 5;
        uint64_t t0 = sd_now_ns();
        for (int r = 0; r < reps; r++)
            sd_sampling_probs(l, V, &cfg[c], p);
        double ms = (double)(sd_now_ns() - t0) / reps * 1e-6;
        fprintf(stderr, "  V=%d T=%.2f top_p=%.2f top_k=%d: %.3f ms/row\n", V, cfg[c].temperature,
                cfg[c].top_p, cfg[c].top_k, ms);
    }
    free(l);
    free(p);
    free(ref);
}

/* ---- sd_sample ------------------------------------------------------------------ */

TEST(sample_is_inverse_cdf_and_never_picks_zero_probability)
{
    uint64_t rng = sd_test_seed() ^ 77;
    enum { V = 40 };
    float pr[V];
    for (int rep = 0; rep < 20; rep++) {
        double scale = sd_test_randf(&rng, 0.1f, 10); /* unnormalized is fine */
        for (int i = 0; i < V; i++)
            pr[i] = sd_test_randf(&rng, 0, 1) < 0.4f ? 0.0f
                                                     : (float)(scale * sd_test_randf(&rng, 0, 1));
        double total = 0, cum[V];
        for (int i = 0; i < V; i++) {
            total += pr[i];
            cum[i] = total;
        }
        if (total == 0)
            continue;
        int prev = 0;
        for (int g = 0; g <= 4000; g++) {
            double u = g == 4000 ? 1.0 - 0x1.0p-53 : g / 4000.0;
            int32_t x = sd_sample(pr, V, u);
            ASSERT(x >= 0 && x < V);
            ASSERT_MSG(pr[x] > 0, "u=%.17g picked token %d of probability 0", u, (int)x);
            ASSERT_GE(x, prev); /* monotone in u */
            prev = x;
            /* x is the token whose CDF interval holds u (away from the edges). */
            double lo = x ? cum[x - 1] / total : 0, hi = cum[x] / total;
            if (u > lo + 1e-12 && u < hi - 1e-12)
                continue;
            ASSERT_MSG(fabs(u - lo) <= 1e-12 || fabs(u - hi) <= 1e-12 || u >= 1 - 1e-12,
                       "u=%.17g token %d interval [%.17g, %.17g)", u, (int)x, lo, hi);
        }
    }
    /* All zero (or NaN): the argmax rule, never an out-of-range id. */
    float z[4] = {0, 0, 0, 0};
    ASSERT_EQ(sd_sample(z, 4, 0.5), 0);
    float zn[4] = {NAN, -1, 0, -2};
    ASSERT_EQ(sd_sample(zn, 4, 0.3), 2);
}

TEST(sample_frequencies_follow_probs)
{
    enum { V = 10, N = 100000 };
    const uint64_t seed = sd_test_seed();
    float pr[V];
    double prob[V], tot = 0;
    for (int i = 0; i < V; i++)
        tot += (pr[i] = (float)(i % 3 == 1 ? 0 : 1 + i));
    for (int i = 0; i < V; i++)
        prob[i] = pr[i] / tot;
    uint32_t obs[V] = {0};
    for (int n = 0; n < N; n++)
        obs[sd_sample(pr, V, sd_rand_uniform(seed, (uint64_t)n, SD_RNG_TARGET))]++;
    double pv = sd_chisq_gof(obs, prob, V, NULL);
    fprintf(stderr, "  chi-square p = %.4g\n", pv);
    ASSERT_MSG(pv > 1e-4, "p = %.3g", pv); /* one check: false failure 1e-4 */
}

/* ---- RNG ------------------------------------------------------------------------- */

TEST(rand_uniform_is_53_bit_pure_and_in_range)
{
    const uint64_t seed = sd_test_seed();
    for (uint64_t c = 0; c < 20000; c++) {
        for (uint32_t st = 0; st < 4; st++) {
            double u = sd_rand_uniform(seed, c, st);
            ASSERT(u >= 0 && u < 1);
            double scaled = u * 0x1.0p53;
            ASSERT_NEAR(scaled, floor(scaled), 0);
            ASSERT(u == sd_rand_uniform(seed, c, st)); /* no hidden state */
        }
    }
    /* Distinct counters of one (seed, stream) never collide (bijective rounds);
     * 53-bit truncation makes a collision among 2^15 values ~1e-7 likely. */
    enum { N = 1 << 15 };
    double *v = malloc(N * sizeof *v);
    for (int i = 0; i < N; i++)
        v[i] = sd_rand_uniform(seed, (uint64_t)i, SD_RNG_ACCEPT);
    int dup = 0;
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < i + 64 && j < N; j++)
            dup += v[i] == v[j];
    free(v);
    ASSERT_EQ(dup, 0);
}

TEST(rand_uniform_is_uniform_and_streams_counters_seeds_independent)
{
    /* Six chi-square checks at 1e-5 each: false failure < 1e-4 per run. */
    const uint64_t seed = sd_test_seed();
    enum { N = 100000, B = 64, G = 16 };
    double prob1[B], prob2[G * G];
    for (int b = 0; b < B; b++)
        prob1[b] = 1.0 / B;
    for (int b = 0; b < G * G; b++)
        prob2[b] = 1.0 / (G * G);
    uint32_t *h = calloc(G * G, sizeof *h);
    double worst = 1;
    for (uint32_t st = 0; st < 2; st++) {
        memset(h, 0, G * G * sizeof *h);
        for (int n = 0; n < N; n++)
            h[(int)(sd_rand_uniform(seed, (uint64_t)n, st) * B)]++;
        double pv = sd_chisq_gof(h, prob1, B, NULL);
        fprintf(stderr, "  stream %u uniformity p = %.4g\n", st, pv);
        worst = fmin(worst, pv);
    }
    /* Pairs that share all inputs but one: 16x16 joint histograms. */
    const char *what[4] = {"stream 0 vs 1", "counter c vs c+1", "seed s vs s+1", "stream 2 vs 3"};
    for (int pair = 0; pair < 4; pair++) {
        memset(h, 0, G * G * sizeof *h);
        for (int n = 0; n < N; n++) {
            uint64_t c = (uint64_t)n * 2;
            double a, b;
            switch (pair) {
            case 0:
                a = sd_rand_uniform(seed, c, 0), b = sd_rand_uniform(seed, c, 1);
                break;
            case 1:
                a = sd_rand_uniform(seed, c, 0), b = sd_rand_uniform(seed, c + 1, 0);
                break;
            case 2:
                a = sd_rand_uniform(seed + (uint64_t)n * 2, 5, 0);
                b = sd_rand_uniform(seed + (uint64_t)n * 2 + 1, 5, 0);
                break;
            default:
                a = sd_rand_uniform(seed, c, 2), b = sd_rand_uniform(seed, c, 3);
                break;
            }
            h[(int)(a * G) * G + (int)(b * G)]++;
        }
        double pv = sd_chisq_gof(h, prob2, G * G, NULL);
        fprintf(stderr, "  %s joint p = %.4g\n", what[pair], pv);
        worst = fmin(worst, pv);
    }
    free(h);
    ASSERT_MSG(worst > 1e-5, "smallest p = %.3g", worst);
}

TEST(argmax_takes_lowest_index_and_skips_nan)
{
    const float a[5] = {1, 3, 3, NAN, 2};
    ASSERT_EQ(sd_argmax(a, 5), 1);
    const float b[3] = {NAN, NAN, NAN};
    ASSERT_EQ(sd_argmax(b, 3), 0);
    const float c[3] = {NAN, -INFINITY, -INFINITY};
    ASSERT_EQ(sd_argmax(c, 3), 1);
    const float d[4] = {-INFINITY, -FLT_MAX, INFINITY, INFINITY};
    ASSERT_EQ(sd_argmax(d, 4), 2);
    ASSERT_EQ(sd_argmax(a, 0), 0);
}

/* The chi-square machinery itself, against closed forms: df=2: exp(-x/2);
 * df=1: erfc(sqrt(x/2)); df=4: exp(-x/2)(1 + x/2). */
TEST(chisq_survival_matches_closed_forms)
{
    static const double xs[] = {0.01, 0.5, 1, 2.5, 3.841458820694124, 7, 15, 40, 100};
    for (size_t i = 0; i < SD_ARRAY_LEN(xs); i++) {
        double x = xs[i];
        ASSERT_NEAR(sd_chisq_sf(x, 2), exp(-x / 2), 1e-12);
        ASSERT_NEAR(sd_chisq_sf(x, 1), erfc(sqrt(x / 2)), 1e-12);
        ASSERT_NEAR(sd_chisq_sf(x, 4), exp(-x / 2) * (1 + x / 2), 1e-12);
    }
    ASSERT_NEAR(sd_chisq_sf(3.841458820694124, 1), 0.05, 1e-9);
}

TEST_MAIN(T(probs_match_sorted_reference_for_temperature_top_k_top_p),
          T(probs_keep_lowest_ids_among_equal_probabilities), T(probs_greedy_and_degenerate_logits),
          T(probs_large_vocab_timing), T(sample_is_inverse_cdf_and_never_picks_zero_probability),
          T(sample_frequencies_follow_probs), T(rand_uniform_is_53_bit_pure_and_in_range),
          T(rand_uniform_is_uniform_and_streams_counters_seeds_independent),
          T(argmax_takes_lowest_index_and_skips_nan), T(chisq_survival_matches_closed_forms))

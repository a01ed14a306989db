/* verify/accept: greedy chains, lossless rejection sampling (chi-square against
 * plain sampling and the exact distribution), reproducibility, statistics. */
#include "core/util.h"
#include "test.h"
#include "verify/accept.h"
#include "verify/chisq.h"

/* ---- a synthetic autoregressive target and draft ---------------------------------
 *
 * Both are deterministic functions of the prefix: logits from a hash of the
 * prefix, the draft's logits = the target's + noise * other hashed logits, both
 * through sd_sampling_probs with the same parameters (the engine's contract). */

enum { MAX_V = 64, MAX_K = 8, MAX_LEN = 64 };

typedef struct synth {
    int V;
    float noise;   /* distance of the draft from the target */
    sd_sampling s; /* temperature / top-k / top-p of both; seed set per run */
    uint64_t salt; /* picks the functions */
} synth;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t prefix_hash(uint64_t salt, const int32_t *x, int n)
{
    uint64_t h = mix64(salt ^ (uint64_t)n * 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++)
        h = mix64(h ^ ((uint64_t)x[i] + 1) * 0xd1b54a32d192ed03ull);
    return h;
}

static void hashed_logits(uint64_t h, int V, float scale, float *out)
{
    for (int v = 0; v < V; v++) {
        double u = (double)(mix64(h + (uint64_t)v * 0x8cb92ba72f3d8dd7ull) >> 11) * 0x1.0p-53;
        out[v] = scale * (float)(2 * u - 1); /* uniform in [-scale, scale) */
    }
}

static void target_row(const synth *m, const int32_t *x, int n, float *probs)
{
    float l[MAX_V];
    hashed_logits(prefix_hash(m->salt, x, n), m->V, 2.5f, l);
    sd_sampling_probs(l, m->V, &m->s, probs);
}

static void draft_row(const synth *m, const int32_t *x, int n, float *probs)
{
    float l[MAX_V], e[MAX_V];
    hashed_logits(prefix_hash(m->salt, x, n), m->V, 2.5f, l);
    hashed_logits(prefix_hash(m->salt ^ 0x5555, x, n), m->V, 2.5f, e);
    for (int v = 0; v < m->V; v++)
        l[v] += m->noise * e[v];
    sd_sampling_probs(l, m->V, &m->s, probs);
}

typedef int (*accept_fn)(const sd_sampling *s, int vocab, int k, const int32_t *draft,
                         const float *p, const float *q, uint64_t pos, int32_t *out, sd_err *err);

/* Speculative generation of the first L tokens with chains of k drafts:
 * sampled drafts (q given) or greedy drafts (argmax of q, verified with q = NULL).
 * k_of_step, if set, varies k per step. Returns the steps taken, -1 on error. */
static int spec_generate(const synth *m, int k, int greedy_draft, accept_fn acc, uint64_t seed,
                         int L, const int *k_of_step, int32_t *x)
{
    const int V = m->V;
    float p[(MAX_K + 1) * MAX_V], q[MAX_K * MAX_V];
    int32_t ctx[MAX_LEN + MAX_K], d[MAX_K], o[MAX_K + 1];
    sd_sampling s = m->s;
    s.seed = seed;
    int len = 0, steps = 0;
    while (len < L) {
        int kk = k_of_step ? k_of_step[steps % 7] : k;
        memcpy(ctx, x, (size_t)len * sizeof *x);
        for (int i = 0; i < kk; i++) {
            draft_row(m, ctx, len + i, q + i * V);
            d[i] = greedy_draft
                       ? sd_argmax(q + i * V, V)
                       : sd_sample(q + i * V, V,
                                   sd_rand_uniform(seed, (uint64_t)(len + i), SD_RNG_DRAFT));
            ctx[len + i] = d[i];
        }
        for (int i = 0; i <= kk; i++)
            target_row(m, ctx, len + i, p + i * V);
        sd_err err = {0};
        int n = acc(&s, V, kk, d, p, greedy_draft ? NULL : q, (uint64_t)len, o, &err);
        if (n < 0 || n > kk)
            return -1;
        for (int j = 0; j <= n && len < MAX_LEN; j++)
            x[len++] = o[j];
        steps++;
    }
    return steps;
}

/* Plain decode: x_t = sd_sample(p(x_<t), uniform of stream TARGET at t). */
static void plain_generate(const synth *m, uint64_t seed, int L, int32_t *x)
{
    float p[MAX_V];
    for (int t = 0; t < L; t++) {
        target_row(m, x, t, p);
        x[t] = sd_sample(p, m->V, sd_rand_uniform(seed, (uint64_t)t, SD_RNG_TARGET));
    }
}

/* Exact joint probabilities of the first J tokens (V^J cells, first token most
 * significant) by enumerating prefixes. */
static void exact_joint(const synth *m, int J, int32_t *x, int t, double pr, double *out, int cell)
{
    if (t == J) {
        out[cell] = pr;
        return;
    }
    float p[MAX_V];
    target_row(m, x, t, p);
    for (int v = 0; v < m->V; v++) {
        x[t] = v;
        exact_joint(m, J, x, t + 1, pr * p[v], out, cell * m->V + v);
    }
}

/* ---- the lossless check ------------------------------------------------------------ */

typedef struct spec_cfg {
    int V, k, top_k, greedy_draft;
    float noise;
} spec_cfg;

enum { TRIALS = 20000, J = 3 };

/* Runs TRIALS speculative and TRIALS plain generations (independent seeds
 * derived from seed) and tests, on the first J tokens' joint and on each
 * position's marginal (positions 0..k): spec vs exact, spec vs plain, plain vs
 * exact. Returns the Bonferroni-corrected p-value of the family (min p times
 * the number of tests), so "> 0.01" has a false-failure rate <= 1%. */
static double lossless_family_p(const spec_cfg *c, accept_fn acc, uint64_t seed, int verbose)
{
    synth m = {c->V, c->noise, {0.7f, 0.9f, c->top_k, 0}, seed ^ 0xabcdefull};
    const int V = c->V, L = c->k + 1 > J ? c->k + 1 : J;
    int cells = 1;
    for (int j = 0; j < J; j++)
        cells *= V;
    uint32_t *js = calloc((size_t)cells, sizeof *js), *jp = calloc((size_t)cells, sizeof *jp);
    uint32_t *ms = calloc((size_t)L * V, sizeof *ms), *mp = calloc((size_t)L * V, sizeof *mp);
    double *exact = calloc((size_t)cells, sizeof *exact);
    int32_t x[MAX_LEN], y[MAX_LEN];
    int bad = 0;
    for (int t = 0; t < TRIALS && !bad; t++) {
        if (spec_generate(&m, c->k, c->greedy_draft, acc, mix64(seed + 2 * (uint64_t)t), L, NULL,
                          x) < 0)
            bad = 1;
        plain_generate(&m, mix64(seed + 2 * (uint64_t)t + 1), L, y);
        int a = 0, b = 0;
        for (int j = 0; j < J; j++) {
            a = a * V + x[j];
            b = b * V + y[j];
        }
        js[a]++;
        jp[b]++;
        for (int j = 0; j < L; j++) {
            ms[j * V + x[j]]++;
            mp[j * V + y[j]]++;
        }
    }
    exact_joint(&m, J, x, 0, 1.0, exact, 0);
    double pv[3 + MAX_K + 1];
    int n = 0;
    pv[n++] = sd_chisq_gof(js, exact, cells, NULL);
    pv[n++] = sd_chisq_two_sample(js, jp, cells, NULL);
    pv[n++] = sd_chisq_gof(jp, exact, cells, NULL);
    for (int j = 0; j <= c->k; j++)
        pv[n++] = sd_chisq_two_sample(ms + j * V, mp + j * V, V, NULL);
    double worst = 1;
    for (int i = 0; i < n; i++)
        worst = fmin(worst, pv[i]);
    if (verbose) {
        fprintf(stderr,
                "  V=%d k=%d top_k=%d %s: joint spec/exact %.3g spec/plain %.3g plain/exact %.3g;"
                " marginals",
                V, c->k, c->top_k, c->greedy_draft ? "greedy drafts" : "sampled drafts", pv[0],
                pv[1], pv[2]);
        for (int i = 3; i < n; i++)
            fprintf(stderr, " %.3g", pv[i]);
        fputc('\n', stderr);
    }
    free(js);
    free(jp);
    free(ms);
    free(mp);
    free(exact);
    return bad ? -1 : fmin(1.0, worst * n);
}

/* A family whose corrected p is <= 0.01 is run once more on fresh seeds and must
 * pass then: a correct rule fails both with probability <= 1e-4, a broken one
 * (p ~ 1e-30 and below, see the broken-rule tests) fails both. */
static double lossless_p_with_rerun(const spec_cfg *c, accept_fn acc, uint64_t seed)
{
    double pc = lossless_family_p(c, acc, seed, 1);
    if (pc > 0.01 || pc < 0)
        return pc;
    fprintf(stderr, "  corrected p %.3g <= 0.01: second run on fresh seeds\n", pc);
    return lossless_family_p(c, acc, mix64(seed ^ 0x2545f4914f6cdd1dull), 1);
}

TEST(sampled_speculation_matches_target_distribution)
{
    const uint64_t seed = sd_test_seed();
    static const spec_cfg cfgs[] = {
        {6, 1, 0, 0, 1.0f},
        {8, 2, 5, 0, 1.5f},
        {10, 3, 0, 0, 1.0f},
        {12, 4, 0, 0, 0.7f},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cfgs); i++) {
        double pc = lossless_p_with_rerun(&cfgs[i], sd_accept_chain, seed + i);
        ASSERT_MSG(pc > 0.01, "V=%d k=%d: corrected p = %.3g", cfgs[i].V, cfgs[i].k, pc);
    }
}

TEST(deterministic_draft_speculation_matches_target_distribution)
{
    const uint64_t seed = sd_test_seed() ^ 0x77;
    const spec_cfg c = {9, 3, 0, 1, 1.0f};
    double pc = lossless_p_with_rerun(&c, sd_accept_chain, seed);
    ASSERT_MSG(pc > 0.01, "corrected p = %.3g", pc);
}

/* ---- rules that must FAIL the same check -------------------------------------------- */

static int broken_always_accept(const sd_sampling *s, int V, int k, const int32_t *d,
                                const float *p, const float *q, uint64_t pos, int32_t *out,
                                sd_err *err)
{
    for (int i = 0; i < k; i++)
        out[i] = d[i];
    out[k] =
        sd_sample(p + (size_t)k * V, V, sd_rand_uniform(s->seed, pos + (uint64_t)k, SD_RNG_TARGET));
    return k;
}

/* The classic slip: after a rejection, sample p instead of max(0, p - q). */
static int broken_resample_target(const sd_sampling *s, int V, int k, const int32_t *d,
                                  const float *p, const float *q, uint64_t pos, int32_t *out,
                                  sd_err *err)
{
    for (int i = 0; i < k; i++) {
        const float *pi = p + (size_t)i * V, *qi = q + (size_t)i * V;
        if (sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_ACCEPT) * qi[d[i]] < pi[d[i]]) {
            out[i] = d[i];
            continue;
        }
        out[i] = sd_sample(pi, V, sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_RESIDUAL));
        return i;
    }
    out[k] =
        sd_sample(p + (size_t)k * V, V, sd_rand_uniform(s->seed, pos + (uint64_t)k, SD_RNG_TARGET));
    return k;
}

/* Reusing the acceptance uniform for the residual: after a rejection u >= p/q,
 * so the residual sample is drawn from the upper part of its CDF only. */
static int broken_shared_uniform(const sd_sampling *s, int V, int k, const int32_t *d,
                                 const float *p, const float *q, uint64_t pos, int32_t *out,
                                 sd_err *err)
{
    for (int i = 0; i < k; i++) {
        const float *pi = p + (size_t)i * V, *qi = q + (size_t)i * V;
        double u = sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_ACCEPT);
        if (u * qi[d[i]] < pi[d[i]]) {
            out[i] = d[i];
            continue;
        }
        float r[MAX_V];
        for (int v = 0; v < V; v++)
            r[v] = pi[v] > qi[v] ? pi[v] - qi[v] : 0.0f;
        out[i] = sd_sample(r, V, u);
        return i;
    }
    out[k] =
        sd_sample(p + (size_t)k * V, V, sd_rand_uniform(s->seed, pos + (uint64_t)k, SD_RNG_TARGET));
    return k;
}

TEST(broken_acceptance_rules_fail_the_lossless_check)
{
    const uint64_t seed = sd_test_seed() ^ 0x99;
    const spec_cfg c = {10, 3, 0, 0, 1.0f};
    const struct {
        const char *name;
        accept_fn fn;
    } broken[] = {{"always accept", broken_always_accept},
                  {"resample target on rejection", broken_resample_target},
                  {"residual reuses the acceptance uniform", broken_shared_uniform}};
    for (size_t i = 0; i < SD_ARRAY_LEN(broken); i++) {
        double pc = lossless_family_p(&c, broken[i].fn, seed, 1);
        fprintf(stderr, "  %s: corrected p = %.3g\n", broken[i].name, pc);
        ASSERT_MSG(pc >= 0 && pc <= 1e-6, "%s passed the lossless check (p = %.3g)", broken[i].name,
                   pc);
    }
}

/* Rejection sampling is also optimal: P(accept d_0) = sum_x min(p(x), q(x)).
 * (A rule that always rejects and samples p is lossless too, and useless.) */
TEST(acceptance_rate_is_one_minus_total_variation)
{
    const uint64_t seed = sd_test_seed() ^ 0x1234;
    enum { N = 20000 };
    synth m = {10, 1.0f, {0.7f, 0.9f, 0, 0}, seed};
    float p[2 * MAX_V], q[MAX_V];
    int32_t none[1] = {0}, d[1], o[2], dg = 0;
    double alpha = 0, alpha_det = 0;
    /* A model whose first rows make both rates informative (top-p can leave a
     * single token, or put the draft's argmax outside the target's set). */
    for (int tries = 0; tries < 1000; tries++, m.salt = mix64(m.salt)) {
        target_row(&m, none, 0, p);
        draft_row(&m, none, 0, q);
        alpha = 0;
        for (int v = 0; v < m.V; v++)
            alpha += fmin(p[v], q[v]);
        dg = sd_argmax(q, m.V);
        alpha_det = p[dg];
        if (alpha > 0.05 && alpha < 0.95 && alpha_det > 0.05 && alpha_det < 0.95)
            break;
    }
    ASSERT(alpha > 0.05 && alpha < 0.95 && alpha_det > 0.05 && alpha_det < 0.95);
    long acc = 0, acc_det = 0;
    for (int t = 0; t < N; t++) {
        m.s.seed = mix64(seed + (uint64_t)t);
        d[0] = sd_sample(q, m.V, sd_rand_uniform(m.s.seed, 0, SD_RNG_DRAFT));
        target_row(&m, d, 1, p + m.V); /* the bonus row after d_0 */
        int n = sd_accept_chain(&m.s, m.V, 1, d, p, q, 0, o, NULL);
        ASSERT(n == 0 || n == 1);
        acc += n;
        d[0] = dg;
        target_row(&m, d, 1, p + m.V);
        n = sd_accept_chain(&m.s, m.V, 1, d, p, NULL, 0, o, NULL);
        ASSERT(n == 0 || n == 1);
        acc_det += n;
    }
    double z = (acc - N * alpha) / sqrt(N * alpha * (1 - alpha));
    double zd = (acc_det - N * alpha_det) / sqrt(N * alpha_det * (1 - alpha_det));
    fprintf(stderr,
            "  sampled draft: %.4f accepted, 1 - TV = %.4f (z = %.2f); greedy draft: %.4f vs p(d) "
            "= %.4f (z = %.2f)\n",
            (double)acc / N, alpha, z, (double)acc_det / N, alpha_det, zd);
    ASSERT_MSG(fabs(z) < 5 && fabs(zd) < 5, "z = %.2f, %.2f", z, zd);
}

/* ---- deterministic properties --------------------------------------------------------- */

TEST(greedy_chain_accepts_while_draft_equals_argmax)
{
    enum { V = 5 };
    /* Rows: argmax 2, 4, 1 (tie 1/3 -> lowest id 1), 0. */
    const float p[4 * V] = {0.1f, 0.2f, 0.5f, 0.1f, 0.1f, 0,    0,    0, 0, 1,
                            0,    0.4f, 0.2f, 0.4f, 0,    0.9f, 0.1f, 0, 0, 0};
    const int32_t am[4] = {2, 4, 1, 0};
    sd_sampling g = {0.0f, 1.0f, 0, 42};
    struct {
        int k;
        int32_t d[3];
        int n;
        int32_t out[4];
    } cases[] = {
        {3, {2, 4, 1}, 3, {2, 4, 1, 0}}, {3, {3, 4, 1}, 0, {2}}, {3, {2, 4, 3}, 2, {2, 4, 1}},
        {3, {2, 0, 1}, 1, {2, 4}},       {0, {0}, 0, {2}},       {2, {2, 4}, 2, {2, 4, 1}},
    };
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int32_t out[4] = {-1, -1, -1, -1}, out2[4] = {-1, -1, -1, -1};
        int n = sd_accept_chain(&g, V, cases[c].k, cases[c].d, p, NULL, 7, out, NULL);
        ASSERT_EQ(n, cases[c].n);
        for (int i = 0; i <= n; i++)
            ASSERT_EQ(out[i], cases[c].out[i]);
        /* q is ignored when greedy. */
        float q[3 * V];
        for (int i = 0; i < 3 * V; i++)
            q[i] = 1.0f / V;
        ASSERT_EQ(sd_accept_chain(&g, V, cases[c].k, cases[c].d, p, q, 7, out2, NULL), n);
        for (int i = 0; i <= n; i++)
            ASSERT_EQ(out2[i], out[i]);
        /* The argmax-only entry agrees. */
        ASSERT_EQ(sd_accept_greedy(cases[c].k, cases[c].d, am, out2), n);
        for (int i = 0; i <= n; i++)
            ASSERT_EQ(out2[i], out[i]);
    }
}

TEST(greedy_speculation_equals_greedy_decode)
{
    /* Random target/draft, temperature 0: speculative output is the greedy
     * sequence token for token, for every k, with sampled-free greedy drafts. */
    const uint64_t seed = sd_test_seed();
    for (int rep = 0; rep < 50; rep++) {
        synth m = {20 + rep % 30, 1.5f, {0.0f, 1.0f, 0, 0}, mix64(seed + (uint64_t)rep)};
        int32_t ref[40], x[MAX_LEN];
        float p[MAX_V];
        for (int t = 0; t < 40; t++) {
            target_row(&m, ref, t, p);
            ref[t] = sd_argmax(p, m.V);
        }
        for (int k = 0; k <= MAX_K; k++) {
            ASSERT(spec_generate(&m, k, 1, sd_accept_chain, 1, 40, NULL, x) > 0);
            for (int t = 0; t < 40; t++)
                ASSERT_EQ(x[t], ref[t]);
        }
    }
}

TEST(deterministic_drafts_reproduce_plain_sampling_token_for_token)
{
    /* With q == NULL every emitted token is sd_sample(p, TARGET uniform at its
     * position): the same tokens as plain decode with the same seed, whatever k
     * (here varying per step, 0 included) and whatever the drafts. */
    const uint64_t seed = sd_test_seed();
    static const int ks[7] = {3, 0, 5, 1, 8, 2, 4};
    for (int rep = 0; rep < 200; rep++) {
        synth m = {
            8 + rep % 40, 1.0f, {0.9f, 0.95f, rep % 3 ? 0 : 6, 0}, mix64(seed ^ (uint64_t)rep)};
        const uint64_t rs = mix64(seed + 1000 + (uint64_t)rep);
        int32_t x[MAX_LEN], y[MAX_LEN];
        plain_generate(&m, rs, 40, y);
        ASSERT(spec_generate(&m, 0, 1, sd_accept_chain, rs, 40, ks, x) > 0);
        for (int t = 0; t < 40; t++)
            ASSERT_EQ(x[t], y[t]);
    }
}

TEST(same_seed_same_tokens_whatever_the_batch_order)
{
    /* Six sequences with their own seeds, sampled drafts: generated one after
     * the other, then interleaved step by step in reverse order, as a batch
     * would run them. Each sequence's tokens must not change. */
    const uint64_t seed = sd_test_seed();
    enum { B = 6, L = 30 };
    synth m = {16, 1.2f, {0.8f, 0.9f, 0, 0}, seed};
    int32_t a[B][MAX_LEN], b[B][MAX_LEN];
    for (int i = 0; i < B; i++)
        ASSERT(spec_generate(&m, 3, 0, sd_accept_chain, mix64(seed + (uint64_t)i), L, NULL, a[i]) >
               0);
    /* Interleaved: step every sequence once per round, reverse order. */
    float p[(MAX_K + 1) * MAX_V], q[MAX_K * MAX_V];
    int len[B] = {0};
    for (int round = 0; round < L; round++) {
        for (int i = B - 1; i >= 0; i--) {
            if (len[i] >= L)
                continue;
            sd_sampling s = m.s;
            s.seed = mix64(seed + (uint64_t)i);
            int32_t ctx[MAX_LEN + MAX_K], d[MAX_K], o[MAX_K + 1];
            memcpy(ctx, b[i], (size_t)len[i] * sizeof **b);
            for (int j = 0; j < 3; j++) {
                draft_row(&m, ctx, len[i] + j, q + j * m.V);
                d[j] = sd_sample(q + j * m.V, m.V,
                                 sd_rand_uniform(s.seed, (uint64_t)(len[i] + j), SD_RNG_DRAFT));
                ctx[len[i] + j] = d[j];
            }
            for (int j = 0; j <= 3; j++)
                target_row(&m, ctx, len[i] + j, p + j * m.V);
            int n = sd_accept_chain(&s, m.V, 3, d, p, q, (uint64_t)len[i], o, NULL);
            ASSERT(n >= 0 && n <= 3);
            for (int j = 0; j <= n; j++)
                b[i][len[i]++] = o[j];
        }
    }
    int differ = 0;
    for (int i = 0; i < B; i++) {
        for (int t = 0; t < L; t++)
            ASSERT_EQ(b[i][t], a[i][t]);
        differ += memcmp(a[i], a[0], L * sizeof **a) != 0;
    }
    ASSERT_GT(differ, 0); /* the seed matters */
}

TEST(identical_draft_and_target_always_accept)
{
    /* q == p: acceptance probability min(1, p/q) = 1 for every token of
     * positive probability; p(d) == 0 (outside top-p): always rejected, and the
     * corrected token has positive probability. */
    const uint64_t seed = sd_test_seed();
    synth m = {12, 0.0f, {0.7f, 0.6f, 0, seed}, seed};
    float p[3 * MAX_V], q[2 * MAX_V];
    int32_t none[1] = {0}, o[3];
    for (int t = 0; t < 500; t++) {
        m.s.seed = mix64(seed + (uint64_t)t);
        target_row(&m, none, 0, p);
        memcpy(q, p, (size_t)m.V * sizeof *p);
        int32_t d[2];
        d[0] = sd_sample(q, m.V, sd_rand_uniform(m.s.seed, 0, SD_RNG_DRAFT));
        target_row(&m, d, 1, p + m.V);
        memcpy(q + m.V, p + m.V, (size_t)m.V * sizeof *p);
        d[1] = sd_sample(q + m.V, m.V, sd_rand_uniform(m.s.seed, 1, SD_RNG_DRAFT));
        target_row(&m, d, 2, p + 2 * m.V);
        ASSERT_EQ(sd_accept_chain(&m.s, m.V, 2, d, p, q, 0, o, NULL), 2);
        ASSERT(p[2 * m.V + o[2]] > 0);
        /* A draft outside the target's support is always rejected. */
        int32_t z = 0;
        while (z < m.V && p[z] > 0)
            z++;
        ASSERT_LT(z, m.V); /* top-p 0.6 leaves some token out */
        int32_t dz[1] = {z};
        float qz[MAX_V] = {0};
        qz[z] = 1;
        ASSERT_EQ(sd_accept_chain(&m.s, m.V, 1, dz, p, qz, 0, o, NULL), 0);
        ASSERT(p[o[0]] > 0);
        ASSERT_EQ(sd_accept_chain(&m.s, m.V, 1, dz, p, NULL, 0, o, NULL), 0);
        ASSERT(p[o[0]] > 0);
    }
}

TEST(bad_arguments_are_refused_with_a_message)
{
    const float p[2 * 4] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    sd_sampling s = {1.0f, 1.0f, 0, 1};
    int32_t out[2], d[1] = {4};
    sd_err err = {0};
    ASSERT_EQ(sd_accept_chain(&s, 4, 1, d, p, NULL, 0, out, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "draft token 4");
    d[0] = -1;
    ASSERT_EQ(sd_accept_chain(&s, 4, 1, d, p, NULL, 0, out, &err), SD_EINVAL);
    ASSERT_EQ(sd_accept_chain(&s, 4, -1, d, p, NULL, 0, out, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "draft length");
    ASSERT_EQ(sd_accept_chain(&s, 0, 0, d, p, NULL, 0, out, &err), SD_EINVAL);
    ASSERT_EQ(sd_accept_chain(NULL, 4, 0, d, p, NULL, 0, out, &err), SD_EINVAL);
}

TEST(stats_count_positions_steps_and_mean_length)
{
    sd_accept_stats st, sum;
    memset(&st, 0, sizeof st);
    memset(&sum, 0, sizeof sum);
    sd_accept_stats_add(&st, 4, 4); /* emits 5 */
    sd_accept_stats_add(&st, 4, 1); /* emits 2 */
    sd_accept_stats_add(&st, 2, 0); /* emits 1 */
    ASSERT_EQ(st.steps, 3);
    ASSERT_EQ(st.drafted, 10);
    ASSERT_EQ(st.accepted, 5);
    ASSERT_EQ(st.emitted, 8);
    ASSERT_NEAR(sd_accept_stats_mean_len(&st), 8.0 / 3, 1e-12);
    ASSERT_EQ(st.proposed_at[0], 3);
    ASSERT_EQ(st.proposed_at[2], 2);
    ASSERT_EQ(st.proposed_at[4], 0);
    ASSERT_EQ(st.accepted_at[0], 2);
    ASSERT_EQ(st.accepted_at[1], 1);
    ASSERT_EQ(st.accepted_at[3], 1);
    ASSERT_NEAR(sd_accept_stats_rate_at(&st, 0), 2.0 / 3, 1e-12);
    ASSERT_NEAR(sd_accept_stats_rate_at(&st, 3), 0.5, 1e-12);
    ASSERT_NEAR(sd_accept_stats_rate_at(&st, 9), 0, 0);
    ASSERT_NEAR(sd_accept_stats_rate_at(&st, 99), 0, 0);
    /* Chains longer than the per-position table count in the totals only. */
    sd_accept_stats_add(&st, 20, 18);
    ASSERT_EQ(st.drafted, 30);
    ASSERT_EQ(st.accepted_at[SD_ACCEPT_POSITIONS - 1], 1);
    ASSERT_EQ(st.proposed_at[SD_ACCEPT_POSITIONS - 1], 1);
    sd_accept_stats_merge(&sum, &st);
    sd_accept_stats_merge(&sum, &st);
    ASSERT_EQ(sum.steps, 8);
    ASSERT_EQ(sum.emitted, 2 * (8 + 19));
    ASSERT_EQ(sum.accepted_at[0], 6);
    memset(&st, 0, sizeof st);
    ASSERT_NEAR(sd_accept_stats_mean_len(&st), 0, 0);
}

TEST_MAIN(T(greedy_chain_accepts_while_draft_equals_argmax),
          T(greedy_speculation_equals_greedy_decode),
          T(deterministic_drafts_reproduce_plain_sampling_token_for_token),
          T(same_seed_same_tokens_whatever_the_batch_order),
          T(identical_draft_and_target_always_accept), T(bad_arguments_are_refused_with_a_message),
          T(stats_count_positions_steps_and_mean_length),
          T(acceptance_rate_is_one_minus_total_variation),
          T(sampled_speculation_matches_target_distribution),
          T(deterministic_draft_speculation_matches_target_distribution),
          T(broken_acceptance_rules_fail_the_lossless_check))

/* Automatic prefix caching in the engine (sched/prefix_cache.h): a request
 * that starts after cached blocks gives the tokens it gives without the
 * cache, greedy and seeded-sampled, with every proposer; it reports the
 * cached tokens; the cache survives the requests that filled it, gives way
 * to new requests when blocks run short, and never holds blocks an idle
 * engine counts as used. */
#include <string.h>

#include "core/config.h"
#include "core/util.h"
#include "engine/engine.h"
#include "engine_run.h"
#include "test.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct cfg {
    const char *model, *spec, *k, *draft;
    int cache, kv_blocks, max_context;
} cfg;

static char *path_of(const char *name)
{
    return !strncmp(name, "models/", 7) ? sd_strfmt("%s/%s", sd_test_srcdir(), name)
                                        : sd_strfmt("%s/tests/golden/models/%s", sd_test_srcdir(), name);
}

static sd_engine *engine(const cfg *c)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return NULL;
    /* a fixture, or a folder of the repository (models/...) */
    char *m = path_of(c->model);
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", c->spec ? c->spec : "none", &err);
    if (c->draft) {
        char *d = path_of(c->draft);
        sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", d, &err);
        free(d);
    }
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", c->k ? c->k : "0", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "prefix-cache", c->cache ? "true" : "false", &err);
    char buf[32];
    snprintf(buf, sizeof buf, "%d", c->max_context ? c->max_context : 160);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", buf, &err);
    snprintf(buf, sizeof buf, "%d", c->kv_blocks);
    sd_opts_set(&o, SD_CMD_GENERATE, "kv-blocks", buf, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    if (err.msg[0])
        fprintf(stderr, "  options: %s\n", err.msg);
    return engine_of_opts(&o, m);
}

/* requests p[i] (n[i] tokens) submitted together, run to their end */
static int run_batch(sd_engine *e, int32_t *const *p, const int *n, int count,
                     const sd_gen_params *gp, engine_out *outs)
{
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    for (int i = 0; i < count; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
    }
    for (int i = 0; i < count; i++) {
        sd_err err = {0};
        sd_gen_params g = *gp;
        g.seed += (uint64_t)i;
        if (sd_engine_submit(e, p[i], n[i], &g, &ev, &outs[i], NULL, &err)) {
            fprintf(stderr, "  submit: %s\n", err.msg);
            return -1;
        }
    }
    return engine_out_wait(outs, count, 60000) ? 0 : -1;
}

static int run1(sd_engine *e, int32_t *p, int n, const sd_gen_params *gp, engine_out *out)
{
    return run_batch(e, &p, &n, 1, gp, out);
}

static void stats_of(sd_engine *e, sd_engine_stats *s)
{
    usleep(50000); /* published after the step */
    sd_engine_get_stats(e, s);
}

static void rand_tokens(uint64_t *s, int32_t *p, int n, int vocab)
{
    for (int i = 0; i < n; i++) {
        *s = sd_mix64(*s + 0x9e3779b97f4a7c15ull);
        p[i] = (int32_t)(*s % (uint64_t)vocab);
    }
}

static void same_ids(const engine_out *a, const engine_out *b)
{
    ASSERT_EQ(a->why, b->why);
    ASSERT_EQ(a->n, b->n);
    for (int j = 0; j < a->n; j++)
        ASSERT_EQ(a->ids[j], b->ids[j]);
}

/* A prompt met again starts after its cached whole blocks (all but the
 * last token's block at least one token short), and its tokens are the
 * uncached engine's; a prompt that shares only a system prompt's blocks
 * starts after those. */
TEST(a_repeated_prompt_starts_after_its_cached_blocks_with_the_same_tokens)
{
    uint64_t seed = sd_test_seed();
    cfg c = {.model = "llama", .cache = 1};
    cfg c0 = c;
    c0.cache = 0;
    sd_engine *e = engine(&c), *e0 = engine(&c0);
    ASSERT(e && e0);
    int32_t p[80], q[80];
    rand_tokens(&seed, p, 80, 300);
    memcpy(q, p, 48 * sizeof *p);
    rand_tokens(&seed, q + 48, 32, 300); /* the first 48 shared */
    sd_gen_params gp = {.max_tokens = 24, .top_p = 1, .ignore_eos = 1};
    engine_out a, b, ref, cq, refq;
    ASSERT_OK(run1(e0, p, 70, &gp, &ref));
    ASSERT_OK(run1(e, p, 70, &gp, &a));
    ASSERT_EQ(a.st.cached_tokens, 0);
    ASSERT_OK(run1(e, p, 70, &gp, &b));
    same_ids(&a, &ref);
    same_ids(&b, &ref);
    ASSERT_EQ(b.st.cached_tokens, 64); /* 4 blocks of 16: the 5th would hold the last token */
    ASSERT_EQ(b.st.prompt_tokens, 70);
    /* the prompt and its answer: a next turn finds the answer's blocks too */
    int32_t turn[120];
    memcpy(turn, p, 70 * sizeof *p);
    memcpy(turn + 70, a.ids, 24 * sizeof *p);
    rand_tokens(&seed, turn + 94, 6, 300);
    engine_out t, reft;
    ASSERT_OK(run1(e0, turn, 100, &gp, &reft));
    ASSERT_OK(run1(e, turn, 100, &gp, &t));
    same_ids(&t, &reft);
    ASSERT_EQ(t.st.cached_tokens, 80); /* 93 tokens computed before: 5 whole blocks */
    ASSERT_OK(run1(e0, q, 80, &gp, &refq));
    ASSERT_OK(run1(e, q, 80, &gp, &cq));
    same_ids(&cq, &refq);
    ASSERT_EQ(cq.st.cached_tokens, 48);
    sd_engine_stats s;
    stats_of(e, &s);
    ASSERT_EQ(s.kv_blocks_used, 0); /* idle: cached blocks are not in use */
    ASSERT_GT(s.kv_blocks_cached, 0);
    ASSERT_EQ(s.prefix_hit_tokens, 64 + 80 + 48);
    ASSERT_EQ(s.prefix_queried_tokens, 70 + 70 + 100 + 80);
    sd_engine_destroy(e);
    sd_engine_destroy(e0);
}

/* the generation parameters of the test below (greedy or sampled) */
static sd_gen_params cached_start_gp(int sampled, uint64_t seed)
{
    return (sd_gen_params){.max_tokens = 40, .top_p = 1, .ignore_eos = 1,
                           .temperature = sampled ? 0.8f : 0.0f, .seed = seed, .has_seed = 1};
}

/* Whether n-gram lookup drafts at all on the first 70 tokens of p and of
 * p2, greedy and sampled, on an engine without a cache. It drafts only
 * where the output meets an n-gram of its context, which the bundled
 * model's continuation of a random prompt misses now and then (2 seeds of
 * 120 for one of the four runs): the test below takes a prompt where it
 * does, so its comparison of drafts is never over none. */
static int ngram_drafts(int32_t *p, int32_t *p2, uint64_t seed)
{
    cfg c = {.model = "models/specd-tiny", .spec = "ngram", .k = "3", .cache = 0};
    sd_engine *e = engine(&c);
    int ok = e != NULL;
    for (int sampled = 0; sampled < 2 && ok; sampled++) {
        const sd_gen_params gp = cached_start_gp(sampled, seed);
        int32_t *ps[2] = {p, p2};
        for (int i = 0; i < 2 && ok; i++) {
            engine_out o;
            ok = run1(e, ps[i], 70, &gp, &o) == 0 && o.st.spec.drafted > 0;
        }
    }
    sd_engine_destroy(e);
    return ok;
}

/* Every proposer of the bundled model (k = 3): a prompt met again starts
 * after its cached blocks, the proposer's slots among them (MTP, EAGLE-3,
 * the draft LM keep KV there), and drafts as it did the first time: the
 * same tokens as plain decode, greedy, and the same seeded sampled tokens
 * and acceptance as its first run. */
TEST(every_proposer_drafts_after_a_cached_start_as_after_a_full_prefill)
{
    static const struct {
        const char *spec, *draft;
    } specs[] = {{"mtp", NULL},
                 {"eagle3", "models/specd-tiny-eagle3"},
                 {"draft", "models/specd-tiny-draft"},
                 {"ngram", NULL}};
    uint64_t seed = sd_test_seed();
    int32_t p[80], p2[80];
    int tries = 0;
    do {
        rand_tokens(&seed, p, 80, 8000);
        for (int i = 40; i < 70; i++) /* a repeated piece: n-gram lookup finds drafts */
            p[i] = p[i - 30];
        /* p2: p with the token after its 4th block changed. MTP's and
         * EAGLE-3's last slot of a block is made from the token after it:
         * p2 shares 3 blocks with them, 4 with the draft LM and n-gram
         * lookup */
        memcpy(p2, p, sizeof p);
        p2[64] = (p[64] + 1) % 8000;
    } while (!ngram_drafts(p, p2, seed) && ++tries < 8);
    ASSERT_MSG(tries < 8, "no prompt of 8 where n-gram lookup drafts");
    cfg c0 = {.model = "models/specd-tiny", .cache = 0};
    sd_engine *plain = engine(&c0);
    ASSERT(plain);
    uint64_t accepted = 0;
    for (int sampled = 0; sampled < 2; sampled++) {
        const sd_gen_params gp = cached_start_gp(sampled, seed);
        engine_out ref, ref2;
        ASSERT_OK(run1(plain, p, 70, &gp, &ref));
        ASSERT_OK(run1(plain, p2, 70, &gp, &ref2));
        for (size_t si = 0; si < SD_ARRAY_LEN(specs); si++) {
            cfg c = {.model = "models/specd-tiny", .spec = specs[si].spec,
                     .draft = specs[si].draft, .k = "3", .cache = 1};
            sd_engine *e = engine(&c);
            ASSERT(e);
            engine_out a, b;
            ASSERT_OK(run1(e, p, 70, &gp, &a));
            ASSERT_OK(run1(e, p, 70, &gp, &b));
            ASSERT_MSG(b.st.cached_tokens == 64, "%s: %d cached tokens", specs[si].spec,
                       b.st.cached_tokens);
            if (!sampled) {
                same_ids(&a, &ref);
                same_ids(&b, &ref);
            }
            same_ids(&b, &a);
            ASSERT_GT(b.st.spec.drafted, 0);
            accepted += b.st.spec.accepted;
            ASSERT_MSG(b.st.spec.drafted == a.st.spec.drafted &&
                           b.st.spec.accepted == a.st.spec.accepted,
                       "%s%s: drafted %llu accepted %llu after the cache, %llu %llu before",
                       specs[si].spec, sampled ? " sampled" : "",
                       (unsigned long long)b.st.spec.drafted,
                       (unsigned long long)b.st.spec.accepted,
                       (unsigned long long)a.st.spec.drafted,
                       (unsigned long long)a.st.spec.accepted);
            engine_out d;
            ASSERT_OK(run1(e, p2, 70, &gp, &d));
            const int shifted = !strcmp(specs[si].spec, "mtp") || !strcmp(specs[si].spec, "eagle3");
            ASSERT_MSG(d.st.cached_tokens == (shifted ? 48 : 64), "%s: %d cached tokens",
                       specs[si].spec, d.st.cached_tokens);
            if (!sampled)
                same_ids(&d, &ref2);
            ASSERT_GT(d.st.spec.drafted, 0);
            sd_engine_destroy(e);
        }
    }
    ASSERT_GT(accepted, 0);
    sd_engine_destroy(plain);
}

/* A system prompt's blocks, cached by a first request, are shared by a
 * batch of requests that arrive together (each its own continuation). */
TEST(a_batch_shares_a_cached_system_prompt)
{
    uint64_t seed = sd_test_seed();
    enum { N = 6 };
    cfg c = {.model = "llama", .cache = 1};
    cfg c0 = c;
    c0.cache = 0;
    sd_engine *e = engine(&c), *e0 = engine(&c0);
    ASSERT(e && e0);
    int32_t buf[N][64], *p[N];
    int n[N];
    rand_tokens(&seed, buf[0], 64, 300);
    for (int i = 0; i < N; i++) {
        memcpy(buf[i], buf[0], 40 * sizeof(int32_t)); /* 40 shared: 2 whole blocks */
        rand_tokens(&seed, buf[i] + 40, 24, 300);
        p[i] = buf[i];
        n[i] = 45 + i * 3;
    }
    sd_gen_params gp = {.max_tokens = 12, .top_p = 1, .ignore_eos = 1};
    engine_out warm, outs[N], refs[N];
    ASSERT_OK(run1(e, p[0], 40, &gp, &warm));
    ASSERT_OK(run_batch(e, p, n, N, &gp, outs));
    ASSERT_OK(run_batch(e0, p, n, N, &gp, refs));
    for (int i = 0; i < N; i++) {
        same_ids(&outs[i], &refs[i]);
        ASSERT_EQ(outs[i].st.cached_tokens, 32);
    }
    sd_engine_destroy(e);
    sd_engine_destroy(e0);
}

/* Requests that arrive together with one system prompt, none cached yet:
 * the first computes its blocks and the others, held a step, find them
 * (the n choices of one prompt too) */
TEST(arrivals_with_one_new_prefix_wait_for_its_blocks)
{
    uint64_t seed = sd_test_seed();
    enum { N = 5 };
    cfg c = {.model = "llama", .cache = 1};
    cfg c0 = c;
    c0.cache = 0;
    sd_engine *e = engine(&c), *e0 = engine(&c0);
    ASSERT(e && e0);
    int32_t buf[N][64], *p[N];
    int n[N];
    rand_tokens(&seed, buf[0], 64, 300);
    for (int i = 0; i < N; i++) {
        memcpy(buf[i], buf[0], 50 * sizeof(int32_t)); /* 3 whole blocks shared */
        rand_tokens(&seed, buf[i] + 50, 14, 300);
        p[i] = buf[i];
        n[i] = i == N - 1 ? 50 : 52 + i; /* the last: the prefix alone */
    }
    sd_gen_params gp = {.max_tokens = 10, .top_p = 1, .ignore_eos = 1};
    engine_out outs[N], refs[N];
    ASSERT_OK(run_batch(e, p, n, N, &gp, outs));
    ASSERT_OK(run_batch(e0, p, n, N, &gp, refs));
    int cached = 0;
    for (int i = 0; i < N; i++) {
        same_ids(&outs[i], &refs[i]);
        cached += outs[i].st.cached_tokens;
    }
    ASSERT_EQ(outs[0].st.cached_tokens, 0);
    ASSERT_EQ(cached, (N - 1) * 48);
    sd_engine_destroy(e);
    sd_engine_destroy(e0);
}

/* With few blocks, other requests' prompts evict a cached prefix (least
 * recently released first): a prompt met again after them starts where
 * its blocks still are, with the same tokens; an idle engine holds no
 * block in use. Off, nothing is cached. */
TEST(cached_blocks_give_way_when_blocks_run_short)
{
    uint64_t seed = sd_test_seed();
    cfg c = {.model = "llama", .cache = 1, .kv_blocks = 14, .max_context = 128};
    cfg c0 = c;
    c0.cache = 0;
    sd_engine *e = engine(&c), *e0 = engine(&c0);
    ASSERT(e && e0);
    int32_t p[4][80];
    for (int i = 0; i < 4; i++)
        rand_tokens(&seed, p[i], 80, 300);
    sd_gen_params gp = {.max_tokens = 20, .top_p = 1, .ignore_eos = 1};
    engine_out o, ref;
    ASSERT_OK(run1(e, p[0], 70, &gp, &o)); /* 89 positions: 5 whole blocks cached */
    for (int i = 1; i < 4; i++) /* 6 blocks each: p[0]'s go first */
        ASSERT_OK(run1(e, p[i], 70, &gp, &o));
    ASSERT_OK(run1(e, p[0], 70, &gp, &o));
    ASSERT_OK(run1(e0, p[0], 70, &gp, &ref));
    same_ids(&o, &ref);
    ASSERT_EQ(o.st.cached_tokens, 0);
    ASSERT_OK(run1(e, p[3], 70, &gp, &o)); /* the last one's blocks are still there */
    ASSERT_OK(run1(e0, p[3], 70, &gp, &ref));
    same_ids(&o, &ref);
    ASSERT_GT(o.st.cached_tokens, 0);
    sd_engine_stats s, s0;
    stats_of(e, &s);
    stats_of(e0, &s0);
    ASSERT_EQ(s.kv_blocks_used, 0);
    ASSERT_GT(s.kv_blocks_cached, 0);
    ASSERT_LE(s.kv_blocks_cached, 14);
    ASSERT_EQ(s0.kv_blocks_cached, 0);
    ASSERT_EQ(s0.prefix_hit_tokens, 0);
    ASSERT_EQ(ref.st.cached_tokens, 0);
    sd_engine_destroy(e);
    sd_engine_destroy(e0);
}

TEST_MAIN(T(a_repeated_prompt_starts_after_its_cached_blocks_with_the_same_tokens),
          T(every_proposer_drafts_after_a_cached_start_as_after_a_full_prefill),
          T(a_batch_shares_a_cached_system_prompt),
          T(arrivals_with_one_new_prefix_wait_for_its_blocks),
          T(cached_blocks_give_way_when_blocks_run_short))

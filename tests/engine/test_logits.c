/* The logits tokens are chosen from, and what the engine gives back of
 * them.
 *
 * Log probabilities of the tokens (sd_gen_params.logprobs): the target's
 * log-softmax at each token, against transformers' logits (the golden
 * fixtures: the first generated token's position is the prompt's last,
 * whose logits golden.json holds) and against a plain run for every later
 * token; asking for them changes no token, greedy or sampled, with or
 * without speculation; sd_logprobs_row against a direct computation on
 * fresh random rows.
 *
 * Logits processors (logit_bias, presence and frequency penalties): the
 * first token against transformers' logits with the bias added; speculative
 * decoding gives plain decode's tokens under them (a verify row counts the
 * drafts before it as history, as plain decode's step there would); the
 * penalties count generated tokens; sd_logits_process against a direct
 * computation. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "core/config.h"
#include "core/util.h"
#include "engine/engine.h"
#include "engine_run.h"
#include "test.h"
#include "verify/json_mask.h"
#include "verify/json_schema.h"
#include "verify/sampling.h"

#define MAXT 64

typedef struct lp_out {
    pthread_mutex_t mu;
    int32_t ids[MAXT];
    sd_token_logprob lp[MAXT];
    int n, n_lp, lp_calls_before_output, done;
    sd_finish why;
    uint64_t drafted, accepted;
    char text[4096];
    size_t len;
} lp_out;

static void on_output(void *u, const char *t, size_t l, const int32_t *ids, int n)
{
    lp_out *o = u;
    pthread_mutex_lock(&o->mu);
    if (l && o->len + l < sizeof o->text) {
        memcpy(o->text + o->len, t, l);
        o->len += l;
    }
    for (int i = 0; i < n && o->n < MAXT; i++)
        o->ids[o->n++] = ids[i];
    /* every token's logprobs came before the output that carries it */
    if (o->n_lp >= o->n)
        o->lp_calls_before_output++;
    pthread_mutex_unlock(&o->mu);
}

static void on_logprobs(void *u, const int32_t *ids, const sd_token_logprob *lp, int n)
{
    lp_out *o = u;
    pthread_mutex_lock(&o->mu);
    for (int i = 0; i < n && o->n_lp < MAXT; i++) {
        if (ids[i] < 0)
            o->why = SD_FINISH_ERROR;
        o->lp[o->n_lp++] = lp[i];
    }
    pthread_mutex_unlock(&o->mu);
}

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    (void)msg;
    lp_out *o = u;
    pthread_mutex_lock(&o->mu);
    o->drafted = st ? st->spec.drafted : 0;
    o->accepted = st ? st->spec.accepted : 0;
    if (o->why != SD_FINISH_ERROR)
        o->why = why;
    o->done = 1;
    pthread_mutex_unlock(&o->mu);
}

/* spec "draft": the draft model is the fixture llama-tied (the fixtures'
 * vocabulary) */
static sd_engine *engine_ctx(const char *model, const char *spec, const char *k, const char *ctx)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return NULL;
    /* a fixture, or a folder of the repository (models/...) */
    char *m = !strncmp(model, "models/", 7) ? sd_strfmt("%s/%s", sd_test_srcdir(), model)
                                            : sd_strfmt("%s/tests/golden/models/%s", sd_test_srcdir(), model);
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", spec, &err);
    if (!strcmp(spec, "draft")) {
        char *d = sd_strfmt("%s/tests/golden/models/llama-tied", sd_test_srcdir());
        sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", d, &err);
        free(d);
    }
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", k, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", ctx, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    return engine_of_opts(&o, m);
}

static sd_engine *engine(const char *model, const char *spec, const char *k)
{
    return engine_ctx(model, spec, k, "128");
}

/* The engine's stats once the step that ended the last request has put
 * them out (a request's end is delivered inside its step, the step's
 * counts after it): read until two reads 5 ms apart agree. */
static void settled_stats(sd_engine *e, sd_engine_stats *st)
{
    sd_engine_stats b;
    sd_engine_get_stats(e, st);
    for (int i = 0; i < 400; i++) {
        usleep(5000);
        sd_engine_get_stats(e, &b);
        const int same = b.steps == st->steps && b.logits_host_rows == st->logits_host_rows &&
                         b.json_masks_made == st->json_masks_made &&
                         b.json_masks_found == st->json_masks_found;
        *st = b;
        if (same)
            return;
    }
}

/* one request to its end */
/* a and b are the same tokens (greedy speculation against plain decode) */
static void same_tokens(const lp_out *a, const lp_out *b)
{
    ASSERT_EQ(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        ASSERT_EQ(a->ids[i], b->ids[i]);
}

static int run1(sd_engine *e, const int32_t *p, int n, const sd_gen_params *gp, lp_out *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish, .on_logprobs = on_logprobs};
    sd_err err = {0};
    if (sd_engine_submit(e, p, n, gp, &ev, o, NULL, &err)) {
        fprintf(stderr, "  submit: %s\n", err.msg);
        return -1;
    }
    for (int spin = 0; spin < 60000 && !o->done; spin++)
        usleep(1000);
    return o->done ? 0 : -1;
}

/* golden.json's prompt ids and the logits of its positions from row0 on
 * ((n - row0, vocab)) */
static int golden_rows(const char *model, int32_t *ids, int *n, int row0, float **last, int *vocab);

/* golden.json's prompt ids and the logits of its last position (vocab,) */
static int golden(const char *model, int32_t *ids, int *n, float **last, int *vocab)
{
    return golden_rows(model, ids, n, -1, last, vocab);
}

static int golden_rows(const char *model, int32_t *ids, int *n, int row0, float **last, int *vocab)
{
    char *dir = sd_strfmt("%s/tests/golden/models/%s", sd_test_srcdir(), model);
    char *gp = sd_strfmt("%s/golden.json", dir);
    json_error_t je;
    json_t *j = json_load_file(gp, 0, &je);
    int rc = -1;
    if (j) {
        json_t *a = json_object_get(j, "ids");
        json_t *shape = json_object_get(json_object_get(j, "logits"), "shape");
        *n = (int)json_array_size(a);
        for (int i = 0; i < *n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
        int rows = (int)json_integer_value(json_array_get(shape, 0));
        *vocab = (int)json_integer_value(json_array_get(shape, 1));
        char *lf = sd_strfmt("%s/%s", dir,
                             json_string_value(json_object_get(json_object_get(j, "logits"), "file")));
        FILE *f = fopen(lf, "rb");
        if (row0 < 0)
            row0 = rows - 1;
        const size_t want = (size_t)(rows - row0) * (size_t)*vocab;
        *last = malloc(want * sizeof **last);
        if (f && *last && rows == *n && row0 < rows &&
            fseek(f, (long)((size_t)row0 * (size_t)*vocab * sizeof(float)), SEEK_SET) == 0 &&
            fread(*last, sizeof(float), want, f) == want)
            rc = 0;
        if (f)
            fclose(f);
        free(lf);
        json_decref(j);
    }
    free(gp);
    free(dir);
    return rc;
}

/* the next of a test's random numbers */
static uint64_t next_rand(uint64_t *s)
{
    *s = sd_mix64(*s + 0x9e3779b97f4a7c15ull);
    return *s;
}

static void check_shape(const lp_out *o, int top)
{
    for (int i = 0; i < o->n; i++) {
        const sd_token_logprob *t = &o->lp[i];
        ASSERT(t->logprob <= 1e-6f);
        ASSERT_EQ(t->n_top, top);
        double mass = 0;
        for (int j = 0; j < t->n_top; j++) {
            mass += exp(t->top_logprobs[j]);
            if (j)
                ASSERT(t->top_logprobs[j] <= t->top_logprobs[j - 1]);
            if (t->top_ids[j] == o->ids[i])
                ASSERT_NEAR(t->top_logprobs[j], t->logprob, 1e-6);
        }
        ASSERT(mass <= 1 + 1e-5);
    }
}

/* Greedy on every fixture with an MTP layer or without: the first token's
 * log probability and top 5 equal transformers' log-softmax of the prompt's
 * last logits; every token is its position's likeliest; the same tokens
 * and log probabilities (within float error) with MTP drafting k = 2. */
TEST(greedy_logprobs_match_transformers_and_do_not_change_with_speculation)
{
    static const struct {
        const char *model, *spec;
    } cases[] = {{"llama", "none"}, {"qwen2", "ngram"}, {"deepseek-v3", "mtp"}};
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int32_t ids[64];
        int n = 0, V = 0;
        float *last = NULL;
        ASSERT_OK(golden(cases[c].model, ids, &n, &last, &V));
        sd_engine *plain = engine(cases[c].model, "none", "0");
        sd_engine *spec = engine(cases[c].model, cases[c].spec, "2");
        ASSERT(plain && spec);
        sd_gen_params gp = {.max_tokens = 12, .top_p = 1, .logprobs = 1, .top_logprobs = 5,
                            .ignore_eos = 1};
        lp_out a, b, none;
        ASSERT_OK(run1(plain, ids, n, &gp, &a));
        ASSERT_OK(run1(spec, ids, n, &gp, &b));
        sd_gen_params g0 = gp;
        g0.logprobs = 0;
        ASSERT_OK(run1(spec, ids, n, &g0, &none));
        ASSERT_EQ(a.n, 12);
        ASSERT_EQ(a.n_lp, 12);
        ASSERT_EQ(none.n_lp, 0);
        ASSERT_EQ(a.lp_calls_before_output > 0, 1);
        check_shape(&a, 5);
        check_shape(&b, 5);
        /* the oracle: transformers' logits at the prompt's last position */
        float ref_lp, ref_top[5];
        int32_t ref_ids[5];
        ASSERT_EQ(sd_logprobs_row(last, V, a.ids[0], 5, &ref_lp, ref_ids, ref_top), 5);
        ASSERT_NEAR(a.lp[0].logprob, ref_lp, 1e-4);
        for (int j = 0; j < 5; j++) {
            ASSERT_EQ(a.lp[0].top_ids[j], ref_ids[j]);
            ASSERT_NEAR(a.lp[0].top_logprobs[j], ref_top[j], 1e-4);
        }
        double worst = 0;
        for (int i = 0; i < a.n; i++) {
            ASSERT_EQ(a.ids[i], b.ids[i]);
            ASSERT_EQ(a.ids[i], none.ids[i]);
            ASSERT_EQ(a.lp[i].top_ids[0], a.ids[i]); /* greedy: the likeliest */
            worst = fmax(worst, fabs((double)a.lp[i].logprob - b.lp[i].logprob));
        }
        ASSERT(worst < 1e-4);
        if (!strcmp(cases[c].spec, "mtp"))
            ASSERT(b.drafted > 0);
        fprintf(stderr, "  %-12s %-5s first token %d: logprob %.5f (transformers %.5f); "
                        "plain vs speculative max |d| %.2g\n",
                cases[c].model, cases[c].spec, a.ids[0], a.lp[0].logprob, ref_lp, worst);
        sd_engine_destroy(plain);
        sd_engine_destroy(spec);
        free(last);
    }
}

/* The prompt's log probabilities (completions' echo): each prompt token's
 * against transformers' log-softmax of the position before it, top 5
 * included, plain and with MTP; the generated tokens and their log
 * probabilities as without them; a prompt prefilled in chunks gives the
 * same entries as in one. */
TEST(prompt_logprobs_match_transformers_at_every_position)
{
    static const struct {
        const char *model, *spec;
    } cases[] = {{"llama", "none"}, {"deepseek-v3", "mtp"}};
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int32_t ids[64];
        int n = 0, V = 0;
        float *rows = NULL;
        ASSERT_OK(golden_rows(cases[c].model, ids, &n, 0, &rows, &V));
        sd_engine *e = engine(cases[c].model, cases[c].spec, "2");
        ASSERT(e);
        sd_gen_params gp = {.max_tokens = 4, .top_p = 1, .logprobs = 1, .top_logprobs = 5,
                            .ignore_eos = 1, .prompt_logprobs = 1};
        lp_out a, b;
        ASSERT_OK(run1(e, ids, n, &gp, &a));
        sd_gen_params g0 = gp;
        g0.prompt_logprobs = 0;
        ASSERT_OK(run1(e, ids, n, &g0, &b));
        ASSERT_EQ(a.n, 4);
        ASSERT_EQ(a.n_lp, n - 1 + 4);
        ASSERT_EQ(b.n_lp, 4);
        double worst = 0;
        for (int p = 1; p < n; p++) {
            const sd_token_logprob *t = &a.lp[p - 1];
            float ref, ref_top[5];
            int32_t ref_ids[5];
            ASSERT_EQ(sd_logprobs_row(rows + (size_t)(p - 1) * V, V, ids[p], 5, &ref, ref_ids, ref_top), 5);
            ASSERT_EQ(t->n_top, 5);
            worst = fmax(worst, fabs((double)t->logprob - ref));
            for (int j = 0; j < 5; j++) {
                ASSERT_EQ(t->top_ids[j], ref_ids[j]);
                worst = fmax(worst, fabs((double)t->top_logprobs[j] - ref_top[j]));
            }
        }
        ASSERT(worst < 1e-4);
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(a.ids[i], b.ids[i]);
            ASSERT_NEAR(a.lp[n - 1 + i].logprob, b.lp[i].logprob, 1e-5);
        }
        fprintf(stderr, "  %-12s %-5s %d prompt tokens: max |d| from transformers %.2g\n",
                cases[c].model, cases[c].spec, n - 1, worst);
        sd_engine_destroy(e);
        free(rows);
    }
    /* chunks: 60 prompt tokens in steps of 16 */
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    char *m = sd_strfmt("%s/tests/golden/models/llama", sd_test_srcdir());
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "128", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-batch-tokens", "16", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    sd_engine *chunked = engine_of_opts(&o, m), *whole = engine("llama", "none", "0");
    ASSERT(chunked && whole);
    int32_t p[60];
    uint64_t seed = sd_test_seed();
    for (int i = 0; i < 60; i++)
        p[i] = (int32_t)(next_rand(&seed) % 300);
    sd_gen_params gp = {.max_tokens = 3, .top_p = 1, .logprobs = 1, .top_logprobs = 2,
                        .ignore_eos = 1, .prompt_logprobs = 1};
    lp_out x, y;
    ASSERT_OK(run1(chunked, p, 60, &gp, &x));
    ASSERT_OK(run1(whole, p, 60, &gp, &y));
    ASSERT_EQ(x.n_lp, 59 + 3);
    ASSERT_EQ(y.n_lp, 59 + 3);
    for (int i = 0; i < x.n_lp; i++) {
        ASSERT_NEAR(x.lp[i].logprob, y.lp[i].logprob, 1e-5);
        ASSERT_EQ(x.lp[i].top_ids[0], y.lp[i].top_ids[0]);
    }
    sd_engine_destroy(chunked);
    sd_engine_destroy(whole);
}

/* Sampled (temperature 0.8, a seed): asking for log probabilities brings
 * the logits to the host and verifies there; the tokens stay the same. */
TEST(sampled_tokens_are_the_same_with_logprobs_asked_or_not)
{
    sd_engine *e = engine("deepseek-v3", "mtp", "2");
    ASSERT(e);
    int32_t p[6] = {3, 14, 15, 92, 65, 35};
    for (uint64_t seed = 1; seed <= 4; seed++) {
        sd_gen_params gp = {.max_tokens = 16, .temperature = 0.8, .top_p = 0.95, .seed = seed,
                            .has_seed = 1, .ignore_eos = 1};
        lp_out a, b;
        ASSERT_OK(run1(e, p, 6, &gp, &a));
        gp.logprobs = 1;
        gp.top_logprobs = 0;
        ASSERT_OK(run1(e, p, 6, &gp, &b));
        ASSERT_EQ(a.n, b.n);
        for (int i = 0; i < a.n; i++)
            ASSERT_EQ(a.ids[i], b.ids[i]);
        ASSERT_EQ(b.n_lp, b.n);
        check_shape(&b, 0);
    }
    /* more than SD_MAX_TOP_LOGPROBS is refused */
    sd_gen_params bad = {.max_tokens = 4, .top_p = 1, .logprobs = 1,
                         .top_logprobs = SD_MAX_TOP_LOGPROBS + 1};
    sd_err err = {0};
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    lp_out o;
    memset(&o, 0, sizeof o);
    ASSERT_EQ(sd_engine_submit(e, p, 6, &bad, &ev, &o, NULL, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "top_logprobs");
    sd_engine_destroy(e);
}

/* sd_logprobs_row against a direct double computation and a full sort, on
 * fresh random rows (NaN and -inf among them) */
TEST(logprobs_row_matches_a_direct_computation)
{
    uint64_t seed = sd_test_seed();
    uint64_t s = seed;
    for (int trial = 0; trial < 200; trial++) {
        int V = 1 + (int)(next_rand(&s) % 700);
        float *x = malloc((size_t)V * sizeof *x);
        for (int i = 0; i < V; i++) {
            uint64_t r = next_rand(&s);
            x[i] = (float)((double)(r % 20000) / 1000.0 - 10.0);
            if (r % 97 == 0)
                x[i] = -INFINITY;
            if (r % 89 == 0)
                x[i] = NAN;
            if (r % 7 == 0 && i > 0)
                x[i] = x[i - 1]; /* ties */
        }
        int32_t tok = (int32_t)(next_rand(&s) % (uint64_t)V);
        int top = (int)(next_rand(&s) % 21);
        float lp, tl[20];
        int32_t ti[20];
        int got = sd_logprobs_row(x, V, tok, top, &lp, ti, tl);
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            if (!isnan(x[i]) && x[i] > mx)
                mx = x[i];
        for (int i = 0; i < V; i++)
            if (!isnan(x[i]) && x[i] > -INFINITY)
                sum += exp((double)x[i] - mx);
        double lse = mx + log(sum);
        double want = isnan(x[tok]) || !(mx > -INFINITY) ? -INFINITY : x[tok] - lse;
        if (isinf(want))
            ASSERT(isinf(lp) && lp < 0);
        else
            ASSERT_NEAR(lp, want, 1e-4);
        ASSERT_EQ(got, top < V ? top : V);
        /* the reference order: value descending (NaN as -inf), id ascending */
        for (int j = 0; j < got; j++) {
            int best = -1;
            for (int i = 0; i < V; i++) {
                int taken = 0;
                for (int q = 0; q < j; q++)
                    taken |= ti[q] == i;
                if (taken)
                    continue;
                float v = isnan(x[i]) ? -INFINITY : x[i];
                float bv = best < 0 ? 0 : isnan(x[best]) ? -INFINITY : x[best];
                if (best < 0 || v > bv)
                    best = i;
            }
            ASSERT_MSG(ti[j] == best, "seed %llu trial %d: top[%d] %d, want %d",
                       (unsigned long long)seed, trial, j, ti[j], best);
        }
        free(x);
    }
}

/* A bias of +100 makes its token the first one, -100 takes the likeliest
 * away (the second likeliest of transformers' logits comes); the logprobs
 * are of the processed logits */
TEST(logit_bias_moves_the_first_token_as_on_transformers_logits)
{
    int32_t ids[64];
    int n = 0, V = 0;
    float *last = NULL;
    ASSERT_OK(golden("qwen2", ids, &n, &last, &V));
    sd_engine *e = engine("qwen2", "ngram", "2");
    ASSERT(e);
    float lp0, top[2];
    int32_t tid[2];
    ASSERT_EQ(sd_logprobs_row(last, V, 0, 2, &lp0, tid, top), 2);
    const int32_t pick = (tid[0] + 7) % V; /* some token not the likeliest */
    const float up = 100, down = -100;
    sd_gen_params gp = {.max_tokens = 4, .top_p = 1, .ignore_eos = 1, .logprobs = 1,
                        .top_logprobs = 1, .bias_ids = &pick, .bias = &up, .n_bias = 1};
    lp_out a, b;
    ASSERT_OK(run1(e, ids, n, &gp, &a));
    ASSERT_EQ(a.ids[0], pick);
    ASSERT(a.lp[0].logprob > -1e-3f);
    for (int i = 1; i < a.n; i++)
        ASSERT_EQ(a.ids[i], pick); /* +100 wins every step */
    gp.bias_ids = &tid[0];
    gp.bias = &down;
    ASSERT_OK(run1(e, ids, n, &gp, &b));
    ASSERT_EQ(b.ids[0], tid[1]);
    /* ids outside the vocabulary are refused */
    const int32_t far = V;
    gp.bias_ids = &far;
    sd_err err = {0};
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    lp_out c;
    memset(&c, 0, sizeof c);
    ASSERT_EQ(sd_engine_submit(e, ids, n, &gp, &ev, &c, NULL, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "logit_bias");
    sd_engine_destroy(e);
    free(last);
}

/* the largest count of one token among o's */
static int most_repeats(const lp_out *o)
{
    int best = 0;
    for (int i = 0; i < o->n; i++) {
        int c = 0;
        for (int j = 0; j < o->n; j++)
            c += o->ids[j] == o->ids[i];
        best = c > best ? c : best;
    }
    return best;
}

/* Penalties and a bias together: MTP and a draft model (k = 2) give plain
 * decode's greedy tokens, on the bundled model (whose MTP layer's drafts
 * are accepted) and the fixtures; the penalties lower the repeats */
TEST(speculation_gives_plain_decodes_tokens_under_penalties_and_bias)
{
    static const struct {
        const char *model, *spec;
    } cases[] = {{"models/specd-tiny", "mtp"}, {"deepseek-v3", "mtp"}, {"deepseek-v3", "draft"}};
    for (size_t c = 0; c < SD_ARRAY_LEN(cases); c++) {
        int32_t p[8] = {3, 14, 15, 92, 65, 35, 89, 79};
        char cfg[1200];
        snprintf(cfg, sizeof cfg, "%s/%s/config.json", sd_test_srcdir(), cases[c].model);
        if (!strncmp(cases[c].model, "models/", 7) && !sd_file_exists(cfg))
            continue; /* (the bundled model is absent) */
        sd_engine *plain = engine(cases[c].model, "none", "0");
        sd_engine *spec = engine(cases[c].model, cases[c].spec, "2");
        ASSERT(plain && spec);
        const int32_t bid[2] = {5, 9};
        const float bv[2] = {1.5f, -2.0f};
        sd_gen_params gp = {.max_tokens = 40, .top_p = 1, .ignore_eos = 1, .bias_ids = bid,
                            .bias = bv, .n_bias = 2, .presence_penalty = 0.5f,
                            .frequency_penalty = 1.0f};
        lp_out a, b, none;
        ASSERT_OK(run1(plain, p, 8, &gp, &a));
        ASSERT_OK(run1(spec, p, 8, &gp, &b));
        sd_gen_params g0 = {.max_tokens = 40, .top_p = 1, .ignore_eos = 1};
        ASSERT_OK(run1(plain, p, 8, &g0, &none));
        ASSERT_EQ(a.n, 40);
        ASSERT_EQ(b.n, 40);
        for (int i = 0; i < a.n; i++)
            ASSERT_MSG(a.ids[i] == b.ids[i], "%s %s: token %d: plain %d, speculative %d",
                       cases[c].model, cases[c].spec, i, a.ids[i], b.ids[i]);
        ASSERT(most_repeats(&a) <= most_repeats(&none));
        /* the bundled model's MTP layer accepts drafts: verify rows past
         * the first chose tokens, on the drafts before them as history
         * (the fixtures' random weights accept none) */
        if (c == 0)
            ASSERT(b.accepted > 0);
        fprintf(stderr, "  %-12s %-5s most repeats: %d penalized, %d not; %llu drafts, %llu accepted\n",
                cases[c].model, cases[c].spec, most_repeats(&a), most_repeats(&none),
                (unsigned long long)b.drafted, (unsigned long long)b.accepted);
        sd_engine_destroy(plain);
        sd_engine_destroy(spec);
    }
}

/* A batch where some requests' logits come to the host (logprobs, bias
 * and penalties, min_tokens, prompt logprobs) and others' do not: every
 * request's tokens are its tokens alone, greedy and sampled, with and
 * without speculation; and only the host requests' rows come down (plain
 * decode: one row a token, none of the other requests'). */
TEST(requests_whose_logits_come_to_the_host_leave_the_others_on_the_device)
{
    static const char *specs[][2] = {{"none", "0"}, {"mtp", "2"}};
    const int32_t bid[2] = {5, 9};
    const float bv[2] = {1.5f, -2.0f};
    const sd_gen_params base = {.max_tokens = 16, .top_p = 1, .ignore_eos = 1};
    enum { NR = 7 };
    sd_gen_params gp[NR];
    for (int i = 0; i < NR; i++)
        gp[i] = base;
    gp[1].logprobs = 1, gp[1].top_logprobs = 2;              /* greedy, host */
    gp[2].temperature = 0.8, gp[2].seed = 7, gp[2].has_seed = 1; /* sampled, device */
    gp[3].bias_ids = bid, gp[3].bias = bv, gp[3].n_bias = 2;  /* greedy, host */
    gp[3].presence_penalty = 0.5f, gp[3].frequency_penalty = 1.0f;
    gp[4] = gp[2], gp[4].seed = 8, gp[4].logprobs = 1;        /* sampled, host */
    gp[5].min_tokens = 12;                                    /* greedy, host */
    gp[6].logprobs = 1, gp[6].prompt_logprobs = 1;           /* the prompt's rows too */
    const int host[NR] = {0, 1, 0, 1, 1, 1, 1};
    int32_t p[NR][8];
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < 8; j++)
            p[i][j] = (int32_t)(3 + 11 * i + 7 * j) % 300;
    for (size_t c = 0; c < SD_ARRAY_LEN(specs); c++) {
        sd_engine *e = engine("models/specd-tiny", specs[c][0], specs[c][1]);
        ASSERT(e);
        pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        engine_out alone[NR], batch[NR];
        sd_req_events ev = {.on_output = engine_out_on_output,
                            .on_logprobs = engine_out_on_logprobs,
                            .on_finish = engine_out_on_finish};
        sd_err err = {0};
        sd_engine_stats st0, st1;
        for (int i = 0; i < NR; i++) {
            memset(&alone[i], 0, sizeof alone[i]);
            alone[i].mu = &mu;
            settled_stats(e, &st0);
            ASSERT_OK(sd_engine_submit(e, p[i], 8, &gp[i], &ev, &alone[i], NULL, &err));
            ASSERT(engine_out_wait(&alone[i], 1, 60000));
            settled_stats(e, &st1);
            /* alone: its own rows only where it wants them (plain decode:
             * one a token; prompt logprobs: one a prompt position too; a
             * speculative step the device cannot verify comes down whole) */
            const uint64_t rows = st1.logits_host_rows - st0.logits_host_rows;
            if (c == 0)
                ASSERT_EQ(rows, host[i] ? (uint64_t)(16 + (i == 6 ? 7 : 0)) : 0);
        }
        settled_stats(e, &st0);
        for (int i = 0; i < NR; i++) {
            memset(&batch[i], 0, sizeof batch[i]);
            batch[i].mu = &mu;
            ASSERT_OK(sd_engine_submit(e, p[i], 8, &gp[i], &ev, &batch[i], NULL, &err));
        }
        ASSERT(engine_out_wait(batch, NR, 60000));
        settled_stats(e, &st1);
        for (int i = 0; i < NR; i++) {
            ASSERT_EQ(batch[i].n, 16);
            ASSERT_EQ(batch[i].why, SD_FINISH_LENGTH);
            for (int j = 0; j < 16; j++)
                ASSERT_MSG(batch[i].ids[j] == alone[i].ids[j],
                           "spec %s, request %d, token %d: %d in the batch, %d alone",
                           specs[c][0], i, j, batch[i].ids[j], alone[i].ids[j]);
            ASSERT_EQ(batch[i].n_lp, alone[i].n_lp);
        }
        if (c == 0) /* the host requests' rows, none of the others' */
            ASSERT_EQ(st1.logits_host_rows - st0.logits_host_rows, (uint64_t)(5 * 16 + 7));
        fprintf(stderr, "  spec %-4s: %llu logits rows to the host in %llu steps\n", specs[c][0],
                (unsigned long long)(st1.logits_host_rows - st0.logits_host_rows),
                (unsigned long long)(st1.logits_host_steps - st0.logits_host_steps));
        sd_engine_destroy(e);
    }
}

/* sd_logits_process against a direct computation on fresh random rows */
TEST(logits_process_matches_a_direct_computation)
{
    uint64_t seed = sd_test_seed(), s = seed;
    for (int trial = 0; trial < 100; trial++) {
        int V = 1 + (int)(next_rand(&s) % 300);
        float *x = malloc((size_t)V * sizeof *x), *y = malloc((size_t)V * sizeof *y);
        int32_t *cnt = calloc((size_t)V, sizeof *cnt), bid[6];
        float bv[6];
        for (int i = 0; i < V; i++) {
            x[i] = y[i] = (float)((double)(next_rand(&s) % 2000) / 100.0 - 10.0);
            cnt[i] = next_rand(&s) % 4 == 0 ? (int)(next_rand(&s) % 5) : 0;
        }
        int nb = (int)(next_rand(&s) % 7);
        for (int i = 0; i < nb; i++) {
            bid[i] = (int32_t)(next_rand(&s) % (uint64_t)(V + 2)) - 1; /* -1 and V: skipped */
            bv[i] = (float)((double)(next_rand(&s) % 200) - 100.0);
        }
        float pres = (float)((double)(next_rand(&s) % 400) / 100.0 - 2.0);
        float freq = (float)((double)(next_rand(&s) % 400) / 100.0 - 2.0);
        sd_logits_process(x, V, bid, bv, nb, pres, freq, cnt);
        for (int t = 0; t < V; t++) {
            double want = y[t];
            for (int i = 0; i < nb; i++)
                if (bid[i] == t)
                    want += bv[i];
            if (cnt[t] > 0)
                want -= pres + freq * cnt[t];
            ASSERT_MSG(fabs(x[t] - want) < 1e-4, "seed %llu trial %d token %d: %g, want %g",
                       (unsigned long long)seed, trial, t, x[t], want);
        }
        free(x);
        free(y);
        free(cnt);
    }
}

/* code points of a UTF-8 string */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* the bundled model's engines, plain and with its MTP layer (k = 2); 0
 * where the model is absent */
static int bundled_pair_ctx(sd_engine **plain, sd_engine **spec, const char *ctx)
{
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/models/specd-tiny/config.json", sd_test_srcdir());
    if (!sd_file_exists(cfg))
        return 0;
    *plain = engine_ctx("models/specd-tiny", "none", "0", ctx);
    *spec = engine_ctx("models/specd-tiny", "mtp", "2", ctx);
    return 1;
}

static int bundled_pair(sd_engine **plain, sd_engine **spec)
{
    return bundled_pair_ctx(plain, spec, "128");
}

/* response_format json_object on the bundled model (trained on Python,
 * never JSON): a text that ends (stop) is a JSON object jansson reads, one
 * cut at its length a prefix of one; greedy and sampled; speculative (MTP,
 * k = 2) gives plain decode's greedy tokens under the mask */
TEST(json_object_texts_are_json_objects)
{
    sd_engine *plain = NULL, *spec = NULL;
    if (!bundled_pair(&plain, &spec))
        TEST_SKIP("the bundled model is absent");
    ASSERT(plain && spec);
    int32_t p[6] = {755, 12, 302, 44, 1021, 9};
    int stops = 0;
    for (int trial = 0; trial < 6; trial++) {
        sd_gen_params gp = {.max_tokens = 110, .top_p = 1, .temperature = trial % 2 ? 0.9 : 0,
                            .seed = 11 + (uint64_t)trial, .has_seed = 1, .json_object = 1};
        p[0] = 755 + trial * 17;
        lp_out a, b;
        ASSERT_OK(run1(plain, p, 6, &gp, &a));
        ASSERT_OK(run1(spec, p, 6, &gp, &b));
        for (int k = 0; k < 2; k++) {
            const lp_out *o = k ? &b : &a;
            sd_json_state st;
            sd_json_init(&st);
            ASSERT_MSG(sd_json_feed(&st, (const unsigned char *)o->text, o->len) == 0,
                       "not a JSON prefix: %.*s", (int)o->len, o->text);
            if (o->why == SD_FINISH_STOP) {
                json_error_t je;
                json_t *v = json_loadb(o->text, o->len, 0, &je);
                ASSERT_MSG(json_is_object(v), "%s: %.*s", je.text, (int)o->len, o->text);
                json_decref(v);
                stops++;
            } else {
                ASSERT_EQ(o->why, SD_FINISH_LENGTH);
            }
        }
        if (gp.temperature == 0)
            same_tokens(&a, &b);
        fprintf(stderr, "  trial %d (%s): %s, %zu bytes, %llu of %llu drafts accepted\n", trial,
                gp.temperature > 0 ? "sampled" : "greedy", a.why == SD_FINISH_STOP ? "stop" : "length",
                a.len, (unsigned long long)b.accepted, (unsigned long long)b.drafted);
    }
    ASSERT(stops > 0);
    /* the masks of recurring states came from the cache (sd_mask_cache:
     * the same masks, tests/verify/test_token_mask.c) */
    sd_engine_stats st;
    settled_stats(plain, &st);
    fprintf(stderr, "  JSON masks: %llu found, %llu made\n",
            (unsigned long long)st.json_masks_found, (unsigned long long)st.json_masks_made);
    ASSERT_GT(st.json_masks_found, st.json_masks_made);
    sd_engine_destroy(plain);
    sd_engine_destroy(spec);
}

/* response_format json_schema on the bundled model: a text that ends
 * (stop) is a document jansson reads with the schema's keys in order, of
 * their types and within their bounds, one cut at its length a prefix the
 * automaton takes; greedy and sampled; speculative (MTP, k = 2) gives plain
 * decode's greedy tokens under the mask */
TEST(json_schema_texts_are_valid_documents)
{
    sd_engine *plain = NULL, *spec = NULL;
    if (!bundled_pair_ctx(&plain, &spec, "512"))
        TEST_SKIP("the bundled model is absent");
    ASSERT(plain && spec);
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{"
        "\"name\":{\"type\":\"string\",\"maxLength\":12},"
        "\"kind\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},"
        "\"age\":{\"type\":\"integer\"},"
        "\"ok\":{\"type\":[\"boolean\",\"null\"]},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},"
        "\"maxItems\":2}},"
        "\"required\":[\"name\",\"kind\",\"age\",\"ok\",\"tags\"],\"additionalProperties\":false}";
    static const char *const keys[] = {"name", "kind", "age", "ok", "tags"};
    sd_jschema *js = NULL;
    ASSERT_OK(sd_jschema_compile(schema, strlen(schema), &js, NULL));
    int32_t p[6] = {755, 12, 302, 44, 1021, 9};
    int stops = 0;
    for (int trial = 0; trial < 4; trial++) {
        sd_gen_params gp = {.max_tokens = 400, .top_p = 1, .temperature = trial % 2 ? 0.9 : 0,
                            .seed = 21 + (uint64_t)trial, .has_seed = 1, .json_schema = schema};
        p[0] = 755 + trial * 17;
        lp_out a, b;
        ASSERT_OK(run1(plain, p, 6, &gp, &a));
        ASSERT_OK(run1(spec, p, 6, &gp, &b));
        for (int k = 0; k < 2; k++) {
            const lp_out *o = k ? &b : &a;
            sd_jschema_state st;
            sd_jschema_init(js, &st);
            ASSERT_MSG(sd_jschema_feed(js, &st, (const unsigned char *)o->text, o->len) == 0,
                       "not a prefix of a valid document: %.*s", (int)o->len, o->text);
            if (o->why != SD_FINISH_STOP) {
                ASSERT_EQ(o->why, SD_FINISH_LENGTH);
                continue;
            }
            stops++;
            json_error_t je;
            json_t *v = json_loadb(o->text, o->len, 0, &je);
            ASSERT_MSG(json_is_object(v) && json_object_size(v) == 5, "%s: %.*s", je.text,
                       (int)o->len, o->text);
            size_t i = 0;
            const char *key;
            json_t *x;
            json_object_foreach(v, key, x)
                ASSERT_STR_EQ(key, keys[i++]); /* in the schema's order */
            json_t *name = json_object_get(v, "name"), *kind = json_object_get(v, "kind"),
                   *tags = json_object_get(v, "tags"), *ok = json_object_get(v, "ok");
            ASSERT(json_is_string(name) && utf8_chars(json_string_value(name)) <= 12);
            ASSERT(json_is_string(kind));
            const char *kv = json_string_value(kind);
            ASSERT(!strcmp(kv, "cat") || !strcmp(kv, "dog") || !strcmp(kv, "bird"));
            ASSERT(json_is_integer(json_object_get(v, "age")));
            ASSERT(json_is_boolean(ok) || json_is_null(ok));
            ASSERT(json_is_array(tags) && json_array_size(tags) <= 2);
            for (size_t t = 0; t < json_array_size(tags); t++)
                ASSERT(json_is_string(json_array_get(tags, t)) &&
                       utf8_chars(json_string_value(json_array_get(tags, t))) <= 6);
            json_decref(v);
        }
        if (gp.temperature == 0)
            same_tokens(&a, &b);
        fprintf(stderr, "  trial %d (%s): %s, %.*s\n", trial, gp.temperature > 0 ? "sampled" : "greedy",
                a.why == SD_FINISH_STOP ? "stop" : "length", (int)a.len, a.text);
    }
    ASSERT(stops > 0);
    /* requests with one schema share its compilation (verify/schema_cache.h)
     * and so the masks of its states: a greedy request sent again makes no
     * mask, every one of its states met before */
    {
        sd_gen_params gp = {.max_tokens = 60, .top_p = 1, .json_schema = schema};
        lp_out a, b;
        sd_engine_stats s0, s1, s2;
        settled_stats(plain, &s0);
        ASSERT_OK(run1(plain, p, 6, &gp, &a));
        settled_stats(plain, &s1);
        ASSERT_OK(run1(plain, p, 6, &gp, &b));
        settled_stats(plain, &s2);
        ASSERT_EQ(a.n, b.n);
        ASSERT_EQ(s2.json_masks_made, s1.json_masks_made);
        ASSERT_GE(s2.json_masks_found - s1.json_masks_found, (uint64_t)b.n);
        fprintf(stderr, "  again: %llu masks made the first time, %llu the second\n",
                (unsigned long long)(s1.json_masks_made - s0.json_masks_made),
                (unsigned long long)(s2.json_masks_made - s1.json_masks_made));
    }
    /* a schema the subset does not take: the submit says why */
    sd_gen_params bad = {.max_tokens = 8, .top_p = 1, .json_schema = "{\"type\":\"string\",\"pattern\":\"a(?=b)\"}"};
    sd_err err = {0};
    ASSERT_EQ(sd_engine_submit(plain, p, 6, &bad, NULL, NULL, NULL, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "pattern");
    sd_jschema_free(js);
    sd_engine_destroy(plain);
    sd_engine_destroy(spec);
}

/* Tool calls in a format of special tokens (verify/json_schema.h's
 * x-specd-calls, "specials"): the bundled tokenizer's <|im_start|> and
 * <|pad|> as the calls' lead and end. A bias on <|im_start|> makes the model
 * write it as the special token where the grammar takes its text (the
 * calls' starts) and nowhere else; the text (special tokens printed) is a
 * prefix of the grammar's, whole where the request stopped; speculation
 * gives plain decode's greedy tokens. */
TEST(tool_calls_in_special_tokens_take_the_special_tokens)
{
    sd_engine *plain = NULL, *spec = NULL;
    if (!bundled_pair_ctx(&plain, &spec, "512"))
        TEST_SKIP("the bundled model is absent");
    ASSERT(plain && spec);
    static const char schema[] =
        "{\"x-specd-calls\":{\"begin\":\"<|im_start|>\",\"sep\":\"<|im_start|>\",\"end\":\"<|pad|>\","
        "\"max\":2,\"specials\":true,\"tools\":[{\"prefix\":\"get(\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
        "\"additionalProperties\":false},\"suffix\":\")\"}]}}";
    sd_jschema *js = NULL;
    ASSERT_OK(sd_jschema_compile(schema, strlen(schema), &js, NULL));
    const int32_t im_start = 2, pad = 4, bias_ids[2] = {im_start, pad};
    const float bias[2] = {30.0f, 30.0f};
    int32_t p[6] = {755, 12, 302, 44, 1021, 9};
    int stops = 0;
    for (int trial = 0; trial < 4; trial++) {
        sd_gen_params gp = {.max_tokens = 120, .top_p = 1, .temperature = trial % 2 ? 0.9 : 0,
                            .seed = 31 + (uint64_t)trial, .has_seed = 1, .json_schema = schema,
                            .keep_special = 1, .bias_ids = bias_ids, .bias = bias, .n_bias = 2};
            p[0] = 755 + trial * 13;
        lp_out a, b;
        ASSERT_OK(run1(plain, p, 6, &gp, &a));
        ASSERT_OK(run1(spec, p, 6, &gp, &b));
        for (int k = 0; k < 2; k++) {
            const lp_out *o = k ? &b : &a;
            ASSERT_EQ(o->ids[0], im_start); /* the lead as the special token */
            int starts = 0, ends = 0;
            for (int i = 0; i < o->n; i++) {
                starts += o->ids[i] == im_start;
                ends += o->ids[i] == pad;
            }
            ASSERT_LE(starts, 2); /* only where a call begins */
            ASSERT_LE(ends, 1);   /* and the end once */
            sd_jschema_state st;
            sd_jschema_init(js, &st);
            ASSERT_MSG(sd_jschema_feed(js, &st, (const unsigned char *)o->text, o->len) == 0,
                       "not a prefix of the calls: %.*s", (int)o->len, o->text);
            if (o->why == SD_FINISH_STOP) {
                ASSERT_MSG(sd_jschema_done(js, &st), "%.*s", (int)o->len, o->text);
                ASSERT_EQ(ends, 1); /* the end as the special token */
                stops++;
            }
        }
        if (gp.temperature == 0)
            same_tokens(&a, &b);
        fprintf(stderr, "  trial %d (%s): %s, %.*s\n", trial, gp.temperature > 0 ? "sampled" : "greedy",
                a.why == SD_FINISH_STOP ? "stop" : "length", (int)a.len, a.text);
    }
    ASSERT(stops > 0);
    sd_jschema_free(js);
    sd_engine_destroy(plain);
    sd_engine_destroy(spec);
}

/* A schema after the reasoning (x-specd-after) whose end is a special
 * token, <|im_start|> of the bundled tokenizer here: the text before it is
 * free (greedy: the tokens of an unconstrained request, but the end of
 * text, which waits for the document), the special token ends it, and the
 * rest is the document; a bias makes the model write the end early. */
TEST(a_schema_after_the_reasoning_waits_for_its_end_token)
{
    sd_engine *plain = NULL, *spec = NULL;
    if (!bundled_pair_ctx(&plain, &spec, "512"))
        TEST_SKIP("the bundled model is absent");
    ASSERT(plain && spec);
    static const char schema[] =
        "{\"x-specd-after\":\"<|im_start|>\",\"specials\":true,\"x-specd-then\":{\"type\":\"object\","
        "\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],\"additionalProperties\":false}}";
    int32_t p[6] = {755, 12, 302, 44, 1021, 9};
    for (int biased = 0; biased < 2; biased++) {
        const int32_t bias_ids[1] = {2};
        const float bias[1] = {30.0f};
        sd_gen_params free_gp = {.max_tokens = 40, .top_p = 1, .keep_special = 1};
        sd_gen_params gp = free_gp;
        gp.json_schema = schema;
        if (biased) {
            gp.bias_ids = bias_ids;
            gp.bias = bias;
            gp.n_bias = 1;
        }
        lp_out f, a, b;
        ASSERT_OK(run1(plain, p, 6, &free_gp, &f));
        ASSERT_OK(run1(plain, p, 6, &gp, &a));
        ASSERT_OK(run1(spec, p, 6, &gp, &b));
        same_tokens(&a, &b); /* speculation: plain decode's tokens */
        if (!biased) { /* the model never writes the end: free text, as unconstrained */
            int end = 0;
            for (int i = 0; i < f.n; i++)
                end |= f.ids[i] == 2 || f.ids[i] == 1 || f.ids[i] == 3;
            if (!end) {
                ASSERT_EQ(a.n, f.n);
                for (int i = 0; i < a.n; i++)
                    ASSERT_EQ(a.ids[i], f.ids[i]);
            }
            fprintf(stderr, "  free: %.*s\n", (int)a.len, a.text);
            continue;
        }
        ASSERT_EQ(a.ids[0], 2); /* the end tag as the special token */
        ASSERT_MSG(a.len > 12 && !memcmp(a.text, "<|im_start|>", 12), "%.*s", (int)a.len, a.text);
        fprintf(stderr, "  biased: %s, %.*s\n", a.why == SD_FINISH_STOP ? "stop" : "length", (int)a.len, a.text);
        if (a.why == SD_FINISH_STOP) {
            json_error_t je;
            json_t *v = json_loadb(a.text + 12, a.len - 12, 0, &je);
            ASSERT_MSG(json_is_integer(json_object_get(v, "n")), "%s: %.*s", je.text, (int)a.len, a.text);
            json_decref(v);
        }
    }
    sd_engine_destroy(plain);
    sd_engine_destroy(spec);
}

/* min_tokens on the bundled model: a stop id that ends a free run early is
 * masked until then (speculative = plain), and a stop string met in the
 * first min_tokens tokens' text is passed over, as vLLM does */
TEST(min_tokens_hold_the_end_of_text_and_stop_strings)
{
    sd_engine *plain = NULL, *spec = NULL;
    if (!bundled_pair(&plain, &spec))
        TEST_SKIP("the bundled model is absent");
    ASSERT(plain && spec);
    int32_t p[5] = {755, 12, 302, 44, 1021};
    sd_gen_params gp = {.max_tokens = 40, .top_p = 1, .ignore_eos = 1};
    lp_out free_run, a, b;
    ASSERT_OK(run1(plain, p, 5, &gp, &free_run));
    ASSERT_EQ(free_run.n, 40);
    /* a stop id: the free run's third token */
    const int32_t stop = free_run.ids[2];
    gp.ignore_eos = 0;
    gp.stop_ids = &stop;
    gp.n_stop_ids = 1;
    ASSERT_OK(run1(plain, p, 5, &gp, &a));
    ASSERT(a.n <= 3 && a.why == SD_FINISH_STOP);
    gp.min_tokens = 12;
    ASSERT_OK(run1(plain, p, 5, &gp, &a));
    ASSERT_OK(run1(spec, p, 5, &gp, &b));
    ASSERT(a.n >= 12);
    for (int i = 0; i < 12; i++)
        ASSERT(a.ids[i] != stop);
    ASSERT_EQ(a.n, b.n);
    for (int i = 0; i < a.n; i++)
        ASSERT_EQ(a.ids[i], b.ids[i]);
    const int held = a.n;
    /* a stop string: the free run's first two bytes of text */
    char s2[3] = {free_run.text[0], free_run.text[1], 0};
    const char *stops[1] = {s2};
    sd_gen_params gs = {.max_tokens = 40, .top_p = 1, .ignore_eos = 1, .stop = stops, .n_stop = 1};
    ASSERT_OK(run1(plain, p, 5, &gs, &a));
    ASSERT_EQ(a.why, SD_FINISH_STOP);
    ASSERT_EQ(a.len, 0); /* cut where the stop string starts */
    gs.min_tokens = 8;
    ASSERT_OK(run1(plain, p, 5, &gs, &b));
    ASSERT(b.n >= 8);
    /* the first 8 tokens' text as the free run's, whatever stop string it holds */
    ASSERT(b.len > 0 && b.len <= free_run.len && !memcmp(b.text, free_run.text, b.len));
    fprintf(stderr, "  stop id %d: with min_tokens 12, %d tokens; stop string \"%s\": with "
                    "min_tokens 8, %d tokens, %zu bytes\n",
            stop, held, s2, b.n, b.len);
    sd_engine_destroy(plain);
    sd_engine_destroy(spec);
}

TEST_MAIN(T(logprobs_row_matches_a_direct_computation), T(logits_process_matches_a_direct_computation),
          T(requests_whose_logits_come_to_the_host_leave_the_others_on_the_device),
          T(min_tokens_hold_the_end_of_text_and_stop_strings),
          T(prompt_logprobs_match_transformers_at_every_position),
          T(json_object_texts_are_json_objects),
          T(json_schema_texts_are_valid_documents), T(tool_calls_in_special_tokens_take_the_special_tokens),
          T(a_schema_after_the_reasoning_waits_for_its_end_token),
          T(logit_bias_moves_the_first_token_as_on_transformers_logits),
          T(speculation_gives_plain_decodes_tokens_under_penalties_and_bias),
          T(greedy_logprobs_match_transformers_and_do_not_change_with_speculation),
          T(sampled_tokens_are_the_same_with_logprobs_asked_or_not))

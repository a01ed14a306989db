/* Lossless sampling through the engine: with temperature 0.7 and top-p 0.9
 * the first 4 generated tokens (the prefill's sample, then one verify step of
 * k = 2 drafts + the bonus) follow the target's exact joint distribution (chi-square goodness of fit over 20 000 requests, p >
 * 0.01). The exact joint distribution comes from running the target over
 * every prefix. Models: random vocabulary-16 Llamas written by the test. */
#include <pthread.h>
#include <unistd.h>

#include "../verify/chisq.h"
#include "core/config.h"
#include "engine/engine.h"
#include "target/runner.h"
#include "test.h"
#include "tiny_model.h"
#include "verify/sampling.h"

#define V 16
#define N_REQ 20000
#define NTOK 4

typedef struct sample_sink {
    pthread_mutex_t mu;
    uint32_t *counts; /* V^4 */
    int done, bad;
    int32_t (*toks)[NTOK];
    int *n;
} sample_sink;

typedef struct one {
    sample_sink *sink;
    int idx;
} one;

static void on_output(void *u, const char *t, size_t l, const int32_t *ids, int n)
{
    (void)t;
    (void)l;
    one *o = u;
    sample_sink *s = o->sink;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++)
        if (s->n[o->idx] < NTOK)
            s->toks[o->idx][s->n[o->idx]++] = ids[i];
    pthread_mutex_unlock(&s->mu);
}

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    (void)st;
    (void)msg;
    one *o = u;
    sample_sink *s = o->sink;
    pthread_mutex_lock(&s->mu);
    if (why != SD_FINISH_LENGTH || s->n[o->idx] != NTOK)
        s->bad++;
    s->done++;
    pthread_mutex_unlock(&s->mu);
}

static const sd_sampling SAMP = {.temperature = 0.7f, .top_p = 0.9f, .top_k = 0};
static const int32_t PROMPT[] = {3, 7, 1, 3, 7};
#define NP ((int)(sizeof PROMPT / sizeof PROMPT[0]))

/* exact P(x1..x4 | prompt) under SAMP, by running the target over every prefix */
static void joint_rec(sd_model *m, int32_t *seq, int depth, double pref, double *joint, int cell)
{
    float lg[(NP + NTOK) * V], p[V];
    sd_err err = {0};
    sd_seq_out so = {.logits = lg};
    sd_runner_target(m, seq, NP + depth, 0, &so, &err);
    sd_sampling_probs(lg + (NP + depth - 1) * V, V, &SAMP, p);
    for (int a = 0; a < V; a++) {
        int c = cell * V + a;
        if (depth + 1 == NTOK) {
            joint[c] = pref * p[a];
        } else if (p[a] <= 0) {
            int span = 1;
            for (int d = depth + 1; d < NTOK; d++)
                span *= V;
            for (int q = 0; q < span; q++)
                joint[c * span + q] = 0;
        } else {
            seq[NP + depth] = a;
            joint_rec(m, seq, depth + 1, pref * p[a], joint, c);
        }
    }
}

static int exact_joint(const char *dir, double *joint)
{
    sd_backend *be;
    if (sd_cpu_backend_create(&be, 1))
        return -1;
    sd_model *m = NULL;
    sd_err err = {0};
    sd_model_opts mo = {.max_tokens = 16};
    if (sd_model_load(&m, dir, be, &mo, &err) || sd_model_alloc_kv(m, 32, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    int32_t seq[NP + NTOK];
    memcpy(seq, PROMPT, sizeof PROMPT);
    joint_rec(m, seq, 0, 1.0, joint, 0);
    sd_model_free(m);
    sd_cpu_backend_destroy(be);
    return 0;
}

static void check(const char *spec, int with_draft)
{
    tiny_spec ts = {.vocab = V, .hidden = 32, .layers = 2, .heads = 2, .kv_heads = 1,
                    .inter = 64, .scale = 0.12f, .seed = 12345};
    char *target = tiny_model_write(&ts);
    ts.scale = 0.1f; /* a similar, not identical, draft */
    /* with_draft 2: an EAGLE-3 head whose draft vocabulary is 6 of the 16
     * target ids (0, 3, ..., 15): its q is zero on the other ten, so the
     * residual distribution must give them all the missing mass */
    char *draft = with_draft == 2 ? tiny_eagle3_write(ts.hidden, V, 6, ts.layers, 0.02f, 99)
                  : with_draft   ? tiny_model_write(&ts)
                                 : NULL;
    ASSERT(target && (!with_draft || draft));
    static double joint[V * V * V * V];
    ASSERT_OK(exact_joint(target, joint));

    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    sd_opts_set(&o, SD_CMD_GENERATE, "model", target, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", spec, &err);
    if (draft)
        sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", draft, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", "2", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-batch", "512", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "64", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "1", &err);
    sd_engine *e;
    ASSERT_MSG(sd_engine_create(&e, &o, &err) == 0, "%s", err.msg);
    sd_opts_free(&o);

    /* A correct rule fails p > 0.01 one run in a hundred: a failing run is
     * repeated with other seeds and the test fails only if three do (a
     * wrong rule gives p near 0 every time; a false alarm is 1 in 10^6: at
     * two, one CI run met its 1 in 10^4, the draft LM at p 0.0069 and
     * 0.0038 with SD_TEST_SEED=4768437367744419087, where 40 other seeds
     * spread its p evenly from 0.06 up; NOTES.md, session 31). */
    double pv = 0;
    for (int attempt = 0; attempt < 3 && !(pv > 0.01); attempt++) {
        sample_sink s = {.mu = PTHREAD_MUTEX_INITIALIZER};
        s.counts = calloc(V * V * V * V, sizeof *s.counts);
        s.toks = calloc(N_REQ, sizeof *s.toks);
        s.n = calloc(N_REQ, sizeof *s.n);
        one *ones = calloc(N_REQ, sizeof *ones);
        uint64_t base = sd_test_seed() + (uint64_t)attempt * 7919u;
        sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
        for (int i = 0; i < N_REQ; i++) {
            ones[i] = (one){.sink = &s, .idx = i};
            sd_gen_params gp = {.max_tokens = NTOK, .temperature = SAMP.temperature,
                                .top_p = SAMP.top_p, .seed = base * 1000003u + (uint64_t)i,
                                .has_seed = 1, .ignore_eos = 1};
            ASSERT_OK(sd_engine_submit(e, PROMPT, NP, &gp, &ev, &ones[i], NULL, &err));
        }
        for (int spin = 0; spin < 600000; spin++) {
            pthread_mutex_lock(&s.mu);
            int d = s.done;
            pthread_mutex_unlock(&s.mu);
            if (d == N_REQ)
                break;
            usleep(1000);
        }
        usleep(100000);
        sd_engine_stats st;
        sd_engine_get_stats(e, &st);
        ASSERT_EQ(s.done, N_REQ);
        ASSERT_EQ(s.bad, 0);
        for (int i = 0; i < N_REQ; i++)
            s.counts[((s.toks[i][0] * V + s.toks[i][1]) * V + s.toks[i][2]) * V + s.toks[i][3]]++;
        int df = 0;
        pv = sd_chisq_gof(s.counts, joint, V * V * V * V, &df);
        fprintf(stderr, "  %s: %d requests, drafts accepted %llu of %llu, chi-square df %d p %.4f\n",
                spec, N_REQ, (unsigned long long)st.spec.accepted,
                (unsigned long long)st.spec.drafted, df, pv);
        /* the speculative path was taken, with both acceptances and rejections */
        ASSERT_GT(st.spec.drafted, 10000 * (attempt + 1));
        ASSERT_GT(st.spec.accepted, 0);
        ASSERT_LT(st.spec.accepted, st.spec.drafted);
        free(s.counts);
        free(s.toks);
        free(s.n);
        free(ones);
    }
    sd_engine_destroy(e);
    ASSERT_MSG(pv > 0.01, "the joint distribution of the first 4 tokens differs from the target's");
    tiny_model_remove(target);
    tiny_model_remove(draft);
}

TEST(draft_model_sampling_matches_the_target_distribution_chi_square)
{
    check("draft", 1);
}

TEST(ngram_sampling_matches_the_target_distribution_chi_square)
{
    check("ngram", 0);
}

TEST(eagle3_sampling_with_a_reduced_draft_vocabulary_matches_the_target_distribution)
{
    check("eagle3", 2);
}

TEST_MAIN(T(draft_model_sampling_matches_the_target_distribution_chi_square),
          T(ngram_sampling_matches_the_target_distribution_chi_square),
          T(eagle3_sampling_with_a_reduced_draft_vocabulary_matches_the_target_distribution))

/* Engine tests: lossless speculation (greedy) for every proposer at several
 * batch sizes with mixed prompts arriving mid-flight; preemption under a
 * small KV cache; KV accounting; statistics. Models: the golden fixtures
 * (random weights: acceptance is low, which exercises rejection paths). */
#include <pthread.h>
#include <unistd.h>

#include "core/config.h"
#include "core/util.h"
#include "engine/adaptive.h"
#include "engine/engine.h"
#include "engine_run.h"
#include "test.h"
#include "tiny_model.h"

#define MAXR 32

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* every request's engine_out */

typedef struct run_cfg {
    const char *model, *spec, *draft;
    int k, kv_blocks, max_context, n_req, max_batch_tokens;
    double temperature;
    int pad_bs; /* > 0: pad steps as CUDA graphs do, up to this many sequences */
    int tp;     /* > 1: tensor-parallel ranks */
    int ep;     /* with tp: expert parallel (whole experts per rank) */
    int slots;  /* MoE shared experts as always-on slots of the expert bank */
    int ahead;  /* --launch-ahead on (else off) */
    int no_draft_ahead; /* --draft-ahead off (else on, the default) */
    int sampled_from;   /* > 0: requests from this one on sample (temperature 0.8) */
} run_cfg;

static int make_prompt(uint64_t seed, int i, int32_t *p, int vocab)
{
    uint64_t s = seed * 1000003u + (uint64_t)i * 7919u + 1;
    int n = 1 + (int)((s >> 7) % 37);
    for (int j = 0; j < n; j++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[j] = (int32_t)(s % (uint64_t)vocab);
    }
    /* repeat a piece so n-gram lookup has something to find */
    if (n > 8)
        for (int j = n / 2; j < n; j++)
            p[j] = p[j - n / 2];
    return n;
}

static char *dir_of(const char *name)
{
    if (name[0] == '/')
        return strdup(name);
    return sd_strfmt("%s/tests/golden/models/%s", sd_test_srcdir(), name);
}

/* Runs cfg's requests; half at once, the rest while the first half decodes. */
static int run(const run_cfg *c, uint64_t seed, engine_out *outs, sd_engine_stats *after)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return -1;
    char *m = dir_of(c->model), *d = c->draft ? dir_of(c->draft) : NULL;
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", c->spec, &err);
    if (d)
        sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", d, &err);
    char buf[32];
    snprintf(buf, sizeof buf, "%d", c->k);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", c->k < 0 ? "auto" : buf, &err);
    snprintf(buf, sizeof buf, "%d", c->kv_blocks);
    sd_opts_set(&o, SD_CMD_GENERATE, "kv-blocks", buf, &err);
    snprintf(buf, sizeof buf, "%d", c->max_context);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", buf, &err);
    snprintf(buf, sizeof buf, "%d", c->max_batch_tokens ? c->max_batch_tokens : 64);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-batch-tokens", buf, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    if (c->tp > 1) {
        snprintf(buf, sizeof buf, "%d", c->tp);
        sd_opts_set(&o, SD_CMD_GENERATE, "tp", buf, &err);
    }
    if (c->ep)
        sd_opts_set(&o, SD_CMD_GENERATE, "ep", "true", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "moe-shared-slots", c->slots ? "true" : "false", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "launch-ahead", c->ahead ? "on" : "off", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "draft-ahead", c->no_draft_ahead ? "false" : "true", &err);
    if (c->pad_bs > 0) {
        snprintf(buf, sizeof buf, "%d", c->pad_bs);
        sd_opts_set(&o, SD_CMD_GENERATE, "cuda-graph-max-bs", buf, &err);
        o.debug_pad_steps = 1;
    }
    sd_engine *e = NULL;
    int rc = sd_engine_create(&e, &o, &err);
    free(m);
    free(d);
    sd_opts_free(&o);
    if (rc) {
        fprintf(stderr, "  engine: %s\n", err.msg);
        return rc;
    }
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    int32_t p[64];
    for (int i = 0; i < c->n_req; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
    }
    int half = (c->n_req + 1) / 2;
    uint64_t prompt_total = 0;
    for (int i = 0; i < c->n_req; i++) {
        if (i == half) {
            /* mid-flight arrivals: wait until the first requests produced tokens */
            for (int spin = 0; spin < 2000; spin++) {
                pthread_mutex_lock(&g_mu);
                int any = outs[0].n > 2 || outs[0].done;
                pthread_mutex_unlock(&g_mu);
                if (any)
                    break;
                usleep(1000);
            }
        }
        int n = make_prompt(seed, i, p, 300);
        prompt_total += (uint64_t)n;
        const double temp = c->sampled_from > 0 && i >= c->sampled_from ? 0.8 : c->temperature;
        sd_gen_params gp = {.max_tokens = 8 + (i * 5) % 13, .temperature = temp,
                            .top_p = 1, .seed = (uint64_t)i + seed, .has_seed = 1,
                            .ignore_eos = 1};
        if (sd_engine_submit(e, p, n, &gp, &ev, &outs[i], NULL, &err)) {
            fprintf(stderr, "  submit: %s\n", err.msg);
            sd_engine_destroy(e);
            return -1;
        }
    }
    engine_out_wait(outs, c->n_req, 60000);
    usleep(120000); /* the engine publishes its stats after the step */
    sd_engine_get_stats(e, after);
    sd_engine_destroy(e);
    /* the prompt rows computed: each prompt's once at most (fewer where
     * the prefix cache held a part), with a cache that holds them all (a
     * preempted request computes its context again); a step queued ahead
     * after a prompt's last chunk counted that chunk again with each step
     * after it */
    if (!c->kv_blocks && after->prompt_tokens > prompt_total) {
        fprintf(stderr, "  %llu prompt tokens counted of %llu\n",
                (unsigned long long)after->prompt_tokens, (unsigned long long)prompt_total);
        return -1;
    }
    return 0;
}

static void check_lossless(const char *model, const char *spec, const char *draft, int k)
{
    uint64_t seed = sd_test_seed();
    int sizes[] = {1, 3, 8, 16};
    for (size_t si = 0; si < SD_ARRAY_LEN(sizes); si++) {
        int n = sizes[si];
        engine_out plain[MAXR], sp[MAXR];
        sd_engine_stats s1, s2;
        run_cfg c0 = {.model = model, .spec = "none", .k = 0, .max_context = 256, .n_req = n};
        run_cfg c1 = {.model = model, .spec = spec, .draft = draft, .k = k, .max_context = 256,
                      .n_req = n};
        ASSERT_OK(run(&c0, seed, plain, &s1));
        ASSERT_OK(run(&c1, seed, sp, &s2));
        ASSERT_EQ(s1.kv_blocks_used, 0);
        ASSERT_EQ(s2.kv_blocks_used, 0);
        for (int i = 0; i < n; i++) {
            ASSERT_EQ(plain[i].why, SD_FINISH_LENGTH);
            ASSERT_EQ(sp[i].why, SD_FINISH_LENGTH);
            ASSERT_EQ(plain[i].n, sp[i].n);
            for (int j = 0; j < plain[i].n; j++)
                ASSERT_MSG(plain[i].ids[j] == sp[i].ids[j],
                           "%s k=%d batch %d request %d token %d: plain %d, spec %d", spec, k, n, i,
                           j, plain[i].ids[j], sp[i].ids[j]);
            /* statistics agree with what we counted */
            const sd_spec_stats *st = &sp[i].st.spec;
            ASSERT_EQ(sp[i].st.completion_tokens, sp[i].n);
            ASSERT_LE(st->emitted, (uint64_t)sp[i].n);
            ASSERT_EQ(st->emitted, st->steps + st->accepted);
            uint64_t acc = 0;
            for (int a = 0; a < 16; a++)
                acc += st->accepted_at[a];
            ASSERT_EQ(acc, st->accepted);
        }
        /* model drafts are greedy here: every verify step takes them on
         * the device (n-gram drafts are the host's) */
        if (strcmp(spec, "ngram") && s2.spec.drafted > 0)
            ASSERT_MSG(s2.draft_ahead_steps > 0, "%s batch %d: no verify step drafted ahead", spec,
                       n);
        fprintf(stderr, "  %s k=%d batch %2d: equal; engine accepted %llu of %llu drafts\n", spec,
                k, n, (unsigned long long)s2.spec.accepted, (unsigned long long)s2.spec.drafted);
    }
}

/* --draft-ahead: greedy requests drafting while sampled ones arrive (a
 * step that cannot take the drafts on the device brings them to the host
 * first), on and off, give plain decode's greedy tokens; on the bundled
 * model, whose proposers are trained, the same drafts are accepted either
 * way (a verify step that took wrong drafts on the device would still be
 * lossless, but would accept fewer) */
/* Draft ahead on and off: greedy requests give plain decode's tokens and
 * accept the same drafts (a request's drafts do not depend on the batch);
 * seeded sampled requests give the same tokens either way (their drafts
 * and their verification are seeded by position). Greedy batches, sampled
 * arrivals among greedy requests, and all sampled: sampled steps verify on
 * the device and take their drafts from the step's gathered tokens. MTP,
 * EAGLE-3 and the draft LM of the bundled model. */
TEST(draft_ahead_on_and_off_equal_plain_with_sampled_arrivals)
{
    uint64_t seed = sd_test_seed();
    const int n = 8;
    char *tiny = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    char *draft = sd_strfmt("%s/models/specd-tiny-draft", sd_test_srcdir());
    char *head = sd_strfmt("%s/models/specd-tiny-eagle3", sd_test_srcdir());
    const char *specs[][2] = {{"mtp", NULL}, {"eagle3", head}, {"draft", draft}};
    static const char *modes[] = {"", " (sampled arrivals)", " (all sampled)"};
    for (size_t si = 0; si < SD_ARRAY_LEN(specs); si++) {
        for (int mode = 0; mode < 3; mode++) {
            engine_out plain[MAXR], on[MAXR], off[MAXR];
            sd_engine_stats s0, s1, s2;
            run_cfg c = {.model = tiny, .spec = "none", .k = 0, .max_context = 256, .n_req = n,
                         .sampled_from = mode == 1 ? n / 2 : 0,
                         .temperature = mode == 2 ? 0.8 : 0.0};
            ASSERT_OK(run(&c, seed, plain, &s0));
            c.spec = specs[si][0];
            c.draft = specs[si][1];
            c.k = 3;
            ASSERT_OK(run(&c, seed, on, &s1));
            c.no_draft_ahead = 1;
            ASSERT_OK(run(&c, seed, off, &s2));
            ASSERT(s1.draft_ahead_steps > 0);
            ASSERT_EQ(s2.draft_ahead_steps, 0);
            uint64_t acc = 0;
            for (int i = 0; i < n; i++) {
                const int sampled = mode == 2 || (mode == 1 && i >= c.sampled_from);
                ASSERT_EQ(on[i].why, SD_FINISH_LENGTH);
                ASSERT_EQ(off[i].why, SD_FINISH_LENGTH);
                ASSERT_EQ(on[i].n, plain[i].n);
                ASSERT_EQ(off[i].n, plain[i].n);
                for (int j = 0; j < plain[i].n; j++) {
                    ASSERT_MSG(on[i].ids[j] == off[i].ids[j],
                               "%s%s request %d token %d: ahead %d, not ahead %d", c.spec,
                               modes[mode], i, j, on[i].ids[j], off[i].ids[j]);
                    if (!sampled)
                        ASSERT_MSG(on[i].ids[j] == plain[i].ids[j],
                                   "%s request %d token %d: ahead %d, plain %d", c.spec, i, j,
                                   on[i].ids[j], plain[i].ids[j]);
                }
                /* the same drafts accepted either way (in the mixed runs
                 * too, where a step may bring them to the host) */
                ASSERT_EQ(on[i].st.spec.accepted, off[i].st.spec.accepted);
                acc += on[i].st.spec.accepted;
            }
            ASSERT(acc > 0);
            fprintf(stderr, "  %s%s: %llu of %llu verify steps drafted ahead, %llu drafts accepted\n",
                    c.spec, modes[mode], (unsigned long long)s1.draft_ahead_steps,
                    (unsigned long long)s1.spec.steps, (unsigned long long)s1.spec.accepted);
        }
    }
    free(tiny);
    free(draft);
    free(head);
}

TEST(mtp_greedy_output_equals_plain_at_batch_1_3_8_16)
{
    check_lossless("deepseek-v3", "mtp", NULL, 3);
}

TEST(ngram_greedy_output_equals_plain_at_batch_1_3_8_16)
{
    check_lossless("deepseek-v3", "ngram", NULL, 4);
}

TEST(draft_model_greedy_output_equals_plain_at_batch_1_3_8_16)
{
    check_lossless("deepseek-v3", "draft", "llama-tied", 2);
}

TEST(eagle3_greedy_output_equals_plain_at_batch_1_3_8_16)
{
    /* the deepseek-v3 fixture: hidden 64, vocabulary 384, 3 layers */
    char *head = tiny_eagle3_write(64, 384, 128, 3, 0.1f, sd_test_seed());
    ASSERT(head != NULL);
    check_lossless("deepseek-v3", "eagle3", head, 3);
    tiny_model_remove(head);
}

TEST(adaptive_k_greedy_output_equals_plain)
{
    check_lossless("deepseek-v3", "mtp", NULL, -1);
}

/* Runs two configurations on the same requests: every request finishes at
 * its length with the same tokens, and the proposer drafted and got accepted
 * the same counts. */
static void expect_same_output(const run_cfg *c0, const run_cfg *c1, uint64_t seed)
{
    engine_out a[MAXR], b[MAXR];
    sd_engine_stats s1, s2;
    ASSERT_OK(run(c0, seed, a, &s1));
    ASSERT_OK(run(c1, seed, b, &s2));
    ASSERT_EQ(s2.kv_blocks_used, 0);
    for (int i = 0; i < c0->n_req; i++) {
        ASSERT_EQ(b[i].why, SD_FINISH_LENGTH);
        ASSERT_EQ(a[i].n, b[i].n);
        for (int j = 0; j < a[i].n; j++)
            ASSERT_MSG(a[i].ids[j] == b[i].ids[j],
                       "%s %s k=%d T=%.1f tp %d pad %d: request %d token %d: %d vs %d", c1->model,
                       c1->spec, c1->k, c1->temperature, c1->tp, c1->pad_bs, i, j, a[i].ids[j],
                       b[i].ids[j]);
    }
    /* steps with prompt rows (the mid-flight arrivals' prompts beside
     * decode rows) were padded too, as their graphs would be, and only
     * where steps are padded */
    ASSERT(s2.prompt_steps > 0);
    if (c1->pad_bs > 0)
        ASSERT_GT(s2.prompt_padded_steps, 0);
    else
        ASSERT_EQ(s2.prompt_padded_steps, 0);
    ASSERT_EQ(s2.prompt_graph_steps, 0); /* the CPU has no graphs */
    /* every drafting phase has a reason: a fixed k's all "fixed", adaptive
     * k's none */
    uint64_t why_sum = 0;
    for (int i = 0; i < SD_SPEC_WHY_N; i++)
        why_sum += s2.spec_why_steps[i];
    ASSERT_EQ(why_sum, s2.spec_draft_phases);
    if (why_sum > 0)
        ASSERT_EQ(s2.spec_why_steps[SD_KWHY_FIXED] == why_sum, c1->k >= 0);
    /* plain greedy decode with --launch-ahead queued steps ahead */
    if (c1->ahead && !strcmp(c1->spec, "none") && c1->temperature == 0)
        ASSERT_GT(s2.ahead_steps, 0);
    /* the steps not queued ahead, by cause: none without launch ahead;
     * with it, verify steps only where something drafts (a fixed k); the
     * requests end at different steps (8 + 5i % 13 tokens), so plain decode
     * queued steps that left rows out */
    uint64_t refused = 0;
    for (int i = 0; i < SD_AHEAD_CAUSES; i++)
        refused += s2.ahead_refused[i];
    if (!c1->ahead) {
        ASSERT_EQ(refused, 0);
    } else {
        if (!strcmp(c1->spec, "none"))
            ASSERT_EQ(s2.ahead_refused[SD_AHEAD_DRAFTS] + s2.ahead_refused[SD_AHEAD_TRACKING], 0);
        else if (c1->k > 0 && s2.spec.drafted > 0)
            ASSERT_GT(s2.ahead_refused[SD_AHEAD_DRAFTS], 0);
    }
    /* adaptive k follows measured step times: its draft counts may differ */
    if (c1->k >= 0) {
        ASSERT_EQ(s1.spec.drafted, s2.spec.drafted);
        ASSERT_EQ(s1.spec.accepted, s2.spec.accepted);
    }
    fprintf(stderr,
            "  %s %s k=%d T=%.1f tp %d%s%s pad %d: equal, %llu of %llu drafts accepted, %llu "
            "steps ahead, %llu not\n",
            c1->model, c1->spec, c1->k, c1->temperature, c1->tp, c1->ep ? " ep" : "",
            c1->slots ? " shared-slots" : "", c1->pad_bs, (unsigned long long)s2.spec.accepted,
            (unsigned long long)s2.spec.drafted, (unsigned long long)s2.ahead_steps,
            (unsigned long long)refused);
}

/* Each configuration against the same run on one rank, without expert
 * parallelism, shared-expert slots or padded steps (c->max_context 256). */
static void expect_each_like_one_plain_rank(const run_cfg *cfgs, size_t n, uint64_t seed)
{
    for (size_t ci = 0; ci < n; ci++) {
        run_cfg c1 = cfgs[ci];
        c1.max_context = 256;
        run_cfg c0 = c1;
        c0.tp = 1;
        c0.ep = 0;
        c0.slots = 0;
        c0.pad_bs = 0;
        c0.ahead = 0;
        expect_same_output(&c0, &c1, seed);
    }
}

/* CUDA graphs run decode/verify steps and proposer passes padded to a
 * bucket (graphs.c): the padding rows write only the trash block and their
 * logits are ignored, so outputs equal unpadded runs exactly (the CPU
 * computes each row the same way whatever the batch). A small bucket limit
 * mixes padded steps with unpadded larger ones. */
TEST(padded_steps_give_the_same_output_for_every_proposer_greedy_and_sampled)
{
    uint64_t seed = sd_test_seed();
    char *head = tiny_eagle3_write(64, 384, 128, 3, 0.1f, seed);
    ASSERT(head != NULL);
    run_cfg cfgs[] = {
        {.model = "deepseek-v3", .spec = "none", .n_req = 8},
        {.model = "deepseek-v3", .spec = "mtp", .k = 3, .n_req = 8},
        {.model = "deepseek-v3", .spec = "eagle3", .draft = head, .k = 2, .n_req = 8},
        {.model = "deepseek-v3", .spec = "draft", .draft = "llama-tied", .k = 2, .n_req = 8},
        {.model = "deepseek-v3", .spec = "mtp", .k = -1, .n_req = 5},
        {.model = "llama", .spec = "ngram", .k = 3, .n_req = 8, .temperature = 0.8},
        {.model = "deepseek-v3", .spec = "draft", .draft = "llama-tied", .k = 2, .n_req = 8,
         .temperature = 0.8},
    };
    for (size_t ci = 0; ci < SD_ARRAY_LEN(cfgs); ci++) {
        run_cfg c0 = cfgs[ci];
        c0.max_context = 256;
        run_cfg c1 = c0;
        c1.pad_bs = 3;
        expect_same_output(&c0, &c1, seed);
    }
    tiny_model_remove(head);
}

/* The engine over tensor-parallel ranks (CPU threads, the thread all-reduce
 * in rank order): the same outputs as one rank, plain and speculative,
 * greedy and sampled, with padded steps too. TP sums in another order than
 * one rank does (relative 1e-7), so a token could flip where two logits tie
 * within that: none of these runs has such a tie, and a flip would show as
 * a failure to look at, not noise to allow. */
TEST(tensor_parallel_engine_gives_the_same_output_as_one_rank)
{
    uint64_t seed = sd_test_seed();
    /* the deepseek-v3 fixture: hidden 64, vocabulary 384, 3 layers */
    char *head = tiny_eagle3_write(64, 384, 128, 3, 0.1f, seed);
    ASSERT(head != NULL);
    /* the bundled model and its heads accept most drafts: the acceptance
     * paths run too (the random fixtures reject almost everything) */
    char *tiny = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    char *tiny_e3 = sd_strfmt("%s/models/specd-tiny-eagle3", sd_test_srcdir());
    run_cfg cfgs[] = {
        {.model = tiny, .spec = "mtp", .k = 3, .n_req = 4, .tp = 2},
        {.model = tiny, .spec = "eagle3", .draft = tiny_e3, .k = 3, .n_req = 4, .tp = 2},
        {.model = "deepseek-v3", .spec = "eagle3", .draft = head, .k = 3, .n_req = 6, .tp = 2},
        {.model = "llama", .spec = "none", .n_req = 6, .tp = 2},
        /* steps queued ahead on the ranks (greedy; sampled: never) */
        {.model = "deepseek-v3", .spec = "none", .n_req = 6, .tp = 2, .ahead = 1},
        {.model = "llama", .spec = "none", .n_req = 6, .tp = 4, .pad_bs = 3, .ahead = 1},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .tp = 2, .ahead = 1},
        {.model = "llama", .spec = "none", .n_req = 6, .tp = 2, .temperature = 0.8, .ahead = 1},
        {.model = "qwen3", .spec = "ngram", .k = 3, .n_req = 6, .tp = 2},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .tp = 2},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .tp = 4, .pad_bs = 3},
        {.model = "deepseek-v3", .spec = "draft", .draft = "llama-tied", .k = 2, .n_req = 6,
         .tp = 2, .temperature = 0.8},
        {.model = "llama", .spec = "none", .n_req = 6, .tp = 4, .temperature = 0.8},
        /* expert parallel: whole experts per rank (8 and 6 of them over 2) */
        {.model = tiny, .spec = "mtp", .k = 3, .n_req = 4, .tp = 2, .ep = 1},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .tp = 2, .ep = 1,
         .temperature = 0.8},
    };
    expect_each_like_one_plain_rank(cfgs, SD_ARRAY_LEN(cfgs), seed);
    /* --ep reaches the model (the engine used to drop it) */
    run_cfg epc = {.model = "deepseek-v3", .spec = "none", .max_context = 256, .n_req = 1,
                   .tp = 2, .ep = 1};
    engine_out o1[MAXR];
    sd_engine_stats sb;
    ASSERT_OK(run(&epc, seed, o1, &sb));
    ASSERT_EQ(sb.ep, 1);
    epc.ep = 0;
    ASSERT_OK(run(&epc, seed, o1, &sb));
    ASSERT_EQ(sb.ep, 0);
    free(tiny);
    free(tiny_e3);
    tiny_model_remove(head);
}

/* --moe-shared-slots: the shared expert in the expert bank gives the same
 * output as the dense shared MLP, target and MTP layer alike, on one rank
 * and over two, greedy and sampled (one shared expert: the same sums) */
TEST(moe_shared_slots_give_the_same_output)
{
    uint64_t seed = sd_test_seed();
    char *tiny = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    run_cfg cfgs[] = {
        {.model = tiny, .spec = "mtp", .k = 3, .n_req = 4, .slots = 1},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .slots = 1},
        {.model = "deepseek-v3", .spec = "mtp", .k = 2, .n_req = 6, .slots = 1, .tp = 2,
         .temperature = 0.8},
    };
    expect_each_like_one_plain_rank(cfgs, SD_ARRAY_LEN(cfgs), seed);
    free(tiny);
}

TEST(small_kv_cache_preempts_and_every_request_still_finishes_with_the_same_output)
{
    uint64_t seed = sd_test_seed();
    engine_out big[MAXR], small[MAXR];
    sd_engine_stats s1, s2;
    run_cfg c0 = {.model = "deepseek-v3", .spec = "mtp", .k = 2, .max_context = 96, .n_req = 16};
    run_cfg c1 = c0;
    c1.kv_blocks = 9; /* one full-context request (96 + 3 tokens) and a little more */
    ASSERT_OK(run(&c0, seed, big, &s1));
    ASSERT_OK(run(&c1, seed, small, &s2));
    ASSERT_EQ(s2.kv_blocks_used, 0);
    for (int i = 0; i < 16; i++) {
        ASSERT_EQ(small[i].why, SD_FINISH_LENGTH);
        ASSERT_EQ(small[i].n, big[i].n);
        for (int j = 0; j < big[i].n; j++)
            ASSERT_EQ(small[i].ids[j], big[i].ids[j]);
    }
}

TEST(a_seeded_sampled_request_is_reproducible_whatever_the_batch)
{
    uint64_t seed = sd_test_seed();
    engine_out a[MAXR], b[MAXR];
    sd_engine_stats s;
    run_cfg c1 = {.model = "llama", .spec = "none", .max_context = 256, .n_req = 1,
                  .temperature = 0.8};
    run_cfg c8 = c1;
    c8.n_req = 8;
    ASSERT_OK(run(&c1, seed, a, &s));
    ASSERT_OK(run(&c8, seed, b, &s));
    ASSERT_EQ(a[0].n, b[0].n);
    for (int j = 0; j < a[0].n; j++)
        ASSERT_EQ(a[0].ids[j], b[0].ids[j]);
}

TEST(submit_refuses_bad_requests_with_a_message)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    char *m = dir_of("llama");
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "64", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "1", &err);
    sd_engine *e;
    ASSERT_OK(sd_engine_create(&e, &o, &err));
    int32_t p[4] = {1, 2, 3, 4000};
    sd_gen_params gp = {.max_tokens = 4, .top_p = 1};
    ASSERT_EQ(sd_engine_submit(e, p, 4, &gp, NULL, NULL, NULL, &err), SD_ERANGE);
    ASSERT_CONTAINS(err.msg, "out of range");
    p[3] = 4;
    gp.max_tokens = 61;
    ASSERT_EQ(sd_engine_submit(e, p, 4, &gp, NULL, NULL, NULL, &err), SD_ERANGE);
    ASSERT_CONTAINS(err.msg, "max_tokens");
    ASSERT_EQ(sd_engine_submit(e, p, 0, &gp, NULL, NULL, NULL, &err), SD_EINVAL);
    sd_engine_destroy(e);
    free(m);
    sd_opts_free(&o);
}

/* A draft LM reads the last token, whose KV position the target reserves only
 * next step: when that position opens a new block at a request's last
 * decoding step (no drafts left to reserve for), the proposer must reserve it.
 * Prompts of 3..18 tokens with max_tokens = 34 - p put it at position 32. */
TEST(draft_lm_reserves_the_last_token_position_at_a_block_boundary)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    /* the target as its own draft: every draft is accepted */
    char *m = dir_of("deepseek-v3"), *d = dir_of("deepseek-v3");
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", "draft", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", d, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", "1", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "128", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "block-size", "16", &err);
    sd_engine *e;
    ASSERT_OK(sd_engine_create(&e, &o, &err));
    free(m);
    free(d);
    sd_opts_free(&o);
    engine_out outs[16];
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    for (int i = 0; i < 16; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
        int p = 3 + i;
        int32_t prompt[32];
        for (int j = 0; j < p; j++)
            prompt[j] = (j * 7 + i) % 300;
        sd_gen_params gp = {.max_tokens = 34 - p, .top_p = 1, .ignore_eos = 1};
        ASSERT_OK(sd_engine_submit(e, prompt, p, &gp, &ev, &outs[i], NULL, &err));
    }
    engine_out_wait(outs, 16, 60000);
    sd_engine_destroy(e);
    for (int i = 0; i < 16; i++) {
        ASSERT_EQ(outs[i].why, SD_FINISH_LENGTH);
        ASSERT_EQ(outs[i].n, 34 - (3 + i));
    }
}

/* An engine drafting with MTP on the DeepSeek fixture (random weights:
 * drafts are rarely accepted), spec-k k ("auto" or a number), with n
 * greedy requests of the 3-token prompts {i + 1, 5, 9} submitted at once;
 * NULL on failure (err says why). */
static sd_engine *mtp_engine_with_price(const char *k, const char *ahead, int price_ahead,
                                        engine_out *outs, int n, int max_tokens, sd_err *err)
{
    sd_opts o;
    if (sd_opts_init(&o, err))
        return NULL;
    o.debug_price_ahead = price_ahead;
    char *m = dir_of("deepseek-v3");
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", "mtp", err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", k, err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", err);
    sd_opts_set(&o, SD_CMD_GENERATE, "launch-ahead", ahead, err);
    /* "off": every step read before the next is queued (no draft ahead) */
    sd_opts_set(&o, SD_CMD_GENERATE, "draft-ahead", strcmp(ahead, "off") ? "true" : "false", err);
    sd_engine *e = NULL;
    int rc = sd_engine_create(&e, &o, err);
    free(m);
    sd_opts_free(&o);
    if (rc)
        return NULL;
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
        int32_t p[3] = {i + 1, 5, 9};
        sd_gen_params gp = {.max_tokens = max_tokens, .top_p = 1, .ignore_eos = 1};
        if (sd_engine_submit(e, p, 3, &gp, &ev, &outs[i], NULL, err)) {
            sd_engine_destroy(e);
            return NULL;
        }
    }
    return e;
}

static sd_engine *mtp_engine_with(const char *k, const char *ahead, engine_out *outs, int n,
                                  int max_tokens, sd_err *err)
{
    return mtp_engine_with_price(k, ahead, 0, outs, n, max_tokens, err);
}

/* With drafts that are never accepted (random-weight MTP), adaptive k falls
 * back to plain decode after its exploration steps; with --launch-ahead
 * (pass 2) those plain steps are queued ahead, as a plain engine's are;
 * pass 3 prices k = 0 at the queued-ahead step as a GPU's engine does
 * (adaptive.ahead: the hidden times and queued-ahead steps observed). */
TEST(adaptive_k_stops_drafting_when_nothing_is_accepted)
{
    sd_err err = {0};
    uint64_t drafted[4] = {0, 0, 0, 0};
    static engine_out outs_of[4][4];
    for (int pass = 0; pass < 4; pass++) {
        engine_out outs[4];
        sd_engine *e = mtp_engine_with_price(pass ? "auto" : "4", pass >= 2 ? "on" : "off",
                                             pass == 3, outs, 4, 120, &err);
        ASSERT_MSG(e, "engine: %s", err.msg);
        for (int spin = 0; spin < 60000; spin++) {
            pthread_mutex_lock(&g_mu);
            int all = outs[0].done && outs[1].done && outs[2].done && outs[3].done;
            pthread_mutex_unlock(&g_mu);
            if (all)
                break;
            usleep(1000);
        }
        for (int i = 0; i < 4; i++) {
            drafted[pass] += outs[i].st.spec.drafted;
            outs_of[pass][i] = outs[i];
        }
        sd_engine_stats st;
        sd_engine_get_stats(e, &st);
        uint64_t steps = 0;
        for (int k = 0; k <= 16; k++)
            steps += st.spec_k_steps[k];
        /* the draft-length series: every step counted at its k */
        fprintf(stderr, "  pass %d: %llu steps, by k: %llu %llu %llu %llu %llu, ahead %llu\n", pass,
                (unsigned long long)steps, (unsigned long long)st.spec_k_steps[0],
                (unsigned long long)st.spec_k_steps[1], (unsigned long long)st.spec_k_steps[2],
                (unsigned long long)st.spec_k_steps[3], (unsigned long long)st.spec_k_steps[4],
                (unsigned long long)st.ahead_steps);
        ASSERT_GT(steps, 0);
        if (!pass) {
            ASSERT_EQ(st.spec_k_steps[4], steps);
            ASSERT_EQ(st.spec_k_last, 4);
            ASSERT_EQ(st.spec_plain_steps, 0);
        } else {
            /* once no request tracks the proposer every step counts as
             * k = 0 (a 2-core CI machine once picked k = 1 for nobody in
             * 75 of 120 steps of pass 3) */
            ASSERT_GT(st.spec_k_steps[0], steps / 2);
            /* speculation off: the target steps skip the MTP hidden states */
            ASSERT_GT(st.spec_plain_steps, 0);
        }
        ASSERT(pass >= 2 ? st.ahead_steps > 0 : st.ahead_steps == 0);
        sd_engine_destroy(e);
    }
    /* and the greedy tokens are the same either way */
    for (int pass = 1; pass < 4; pass++)
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(outs_of[0][i].n, outs_of[pass][i].n);
            for (int j = 0; j < outs_of[0][i].n; j++)
                ASSERT_MSG(outs_of[0][i].ids[j] == outs_of[pass][i].ids[j],
                           "request %d token %d: k=4 %d, auto (pass %d) %d", i, j,
                           outs_of[0][i].ids[j], pass, outs_of[pass][i].ids[j]);
        }
    fprintf(stderr, "  drafts: fixed k=4 %llu, auto %llu\n", (unsigned long long)drafted[0],
            (unsigned long long)drafted[1]);
    ASSERT_GT(drafted[0], 0);
    ASSERT_LT(drafted[1] * 4, drafted[0]);
    ASSERT_LT(drafted[3] * 4, drafted[0]);
}

/* Requests that end in the steps where adaptive k still explores (drafting:
 * each step read one at a time), with k = 0 priced at a queued-ahead step:
 * the step's hidden time goes to adaptive k after its ended requests are
 * freed, and nothing of theirs may be read then (a version that read them
 * there crashed on the GPU when a burst of requests ended; here it is a
 * heap-use-after-free under ASan). */
TEST(requests_that_end_while_k_is_priced_ahead_are_not_read_after_they_are_freed)
{
    sd_err err = {0};
    engine_out outs[4];
    sd_engine *e = mtp_engine_with_price("auto", "on", 1, outs, 4, 3, &err);
    ASSERT_MSG(e, "engine: %s", err.msg);
    ASSERT_EQ(engine_out_wait(outs, 4, 60000), 1);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(outs[i].n, 3);
    sd_engine_destroy(e);
}


/* Speculation off for a batch (random-weight MTP: no draft is accepted),
 * arrivals one at a time join it at batch sizes adaptive k has not priced
 * yet, and some of them track the proposer; none is admitted drafting as a
 * cohort nor drafts for the output rate. Without a price of the
 * queued-ahead step (pass 0, the CPU's default) such a request drafts one
 * token a step as a probe of the acceptance. Where plain steps are queued
 * ahead and priced (pass 1, a GPU's engine), a probe's verify step would
 * stop launch ahead for the whole batch (on the H200 under Poisson
 * arrivals probes made 1211-2681 of a speculative server's drafting steps,
 * 9-30 requests waiting in each: NOTES.md, session 34): the requests that
 * track the proposer stop tracking it once the batch's verdict is plain,
 * and no step drafts as a probe. */
TEST(where_plain_steps_are_queued_ahead_no_request_drafts_as_a_probe)
{
    uint64_t seed = sd_test_seed();
    sd_err err = {0};
    uint64_t probes[2] = {0, 0}, ahead[2] = {0, 0}, turned[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        enum { N = 24, FIRST = 4 };
        static engine_out outs[N];
        sd_engine *e = mtp_engine_with_price("auto", "on", pass, outs, FIRST, 96, &err);
        ASSERT_MSG(e, "engine: %s", err.msg);
        sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
        /* the rest arrive one at a time once the first batch decoded a while */
        for (int spin = 0; spin < 20000; spin++) {
            pthread_mutex_lock(&g_mu);
            int n = outs[0].n;
            pthread_mutex_unlock(&g_mu);
            if (n >= 24)
                break;
            usleep(500);
        }
        for (int i = FIRST; i < N; i++) {
            memset(&outs[i], 0, sizeof outs[i]);
            outs[i].mu = &g_mu;
            int32_t p[64];
            int n = make_prompt(seed, i, p, 300);
            sd_gen_params gp = {.max_tokens = 48, .top_p = 1, .ignore_eos = 1};
            ASSERT_OK(sd_engine_submit(e, p, n, &gp, &ev, &outs[i], NULL, &err));
            /* the next one once this one decodes */
            for (int spin = 0; spin < 20000; spin++) {
                pthread_mutex_lock(&g_mu);
                int got = outs[i].n;
                pthread_mutex_unlock(&g_mu);
                if (got >= 3)
                    break;
                usleep(200);
            }
        }
        ASSERT(engine_out_wait(outs, N, 60000));
        sd_engine_stats st;
        sd_engine_get_stats(e, &st);
        sd_engine_destroy(e);
        for (int i = 0; i < N; i++)
            ASSERT_EQ(outs[i].why, SD_FINISH_LENGTH);
        probes[pass] = st.spec_why_steps[SD_KWHY_PROBE];
        ahead[pass] = st.ahead_steps;
        turned[pass] = st.spec_cohorts + st.spec_why_steps[SD_KWHY_COHORT] +
                       st.spec_why_steps[SD_KWHY_DEMAND];
        fprintf(stderr,
                "  pass %d: %llu probe steps (%llu requests waiting in them), %llu ahead; "
                "%llu cohorts, %llu cohort and %llu demand drafting steps\n",
                pass, (unsigned long long)probes[pass],
                (unsigned long long)st.spec_why_idle[SD_KWHY_PROBE],
                (unsigned long long)st.ahead_steps, (unsigned long long)st.spec_cohorts,
                (unsigned long long)st.spec_why_steps[SD_KWHY_COHORT],
                (unsigned long long)st.spec_why_steps[SD_KWHY_DEMAND]);
    }
    ASSERT_GT(probes[0], 0); /* the arrivals did track the proposer in a plain batch */
    ASSERT_EQ(probes[1], 0);
    ASSERT_GT(ahead[1], 0); /* and the plain steps were queued ahead */
    /* drafts never accepted: no cohort of arrivals drafting, no step drafts
     * for the output rate (sd_adaptive_cohort, sd_adaptive_demand_k) */
    ASSERT_EQ(turned[0], 0);
    ASSERT_EQ(turned[1], 0);
}

/* Speculation off (random-weight MTP) where plain steps are queued ahead
 * and priced (a GPU's engine): a batch of 40 is priced at its bucket, and
 * once all but two of it ended, arrivals join one at a time at a batch of
 * 3, a bucket not priced. Each tracks the proposer, and the pick explores
 * that batch, drafting where k = 1 is not measured: its trackers draft
 * for those steps, then stop tracking, and once none tracks the
 * exploration is over. A version that turned the trackers off at the
 * exploring pick measured nothing, and its exploration stayed on with no
 * request to run it: the count of plain steps stood still, and every
 * later arrival explored again at a step not queued ahead (EAGLE-3 on an
 * H100, 395 times in 6900 steps; NOTES.md, session 47). */
TEST(an_exploration_while_speculation_is_off_drafts_and_then_ends)
{
    enum { FIRST = 40, LONG = 2, LATER = 6, N = FIRST + LATER };
    static engine_out outs[N];
    sd_err err = {0};
    sd_engine *e = mtp_engine_with_price("auto", "on", 1, outs, 0, 0, &err);
    ASSERT_MSG(e, "engine: %s", err.msg);
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    for (int i = 0; i < N; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
    }
    /* a batch of 40 priced at its bucket; all but two end soon */
    for (int i = 0; i < FIRST; i++) {
        int32_t p[3] = {i + 1, 5, 9};
        sd_gen_params gp = {.max_tokens = i < LONG ? 200 : 12, .top_p = 1, .ignore_eos = 1};
        ASSERT_OK(sd_engine_submit(e, p, 3, &gp, &ev, &outs[i], NULL, &err));
    }
    ASSERT(engine_out_wait(outs + LONG, FIRST - LONG, 60000));
    sd_engine_stats st;
    sd_engine_get_stats(e, &st);
    const uint64_t explored0 = st.spec_why_steps[SD_KWHY_EXPLORE];
    /* arrivals one at a time at a batch of 3: a bucket not priced */
    for (int i = FIRST; i < N; i++) {
        int32_t p[3] = {i + 1, 7, 11};
        sd_gen_params gp = {.max_tokens = 16, .top_p = 1, .ignore_eos = 1};
        ASSERT_OK(sd_engine_submit(e, p, 3, &gp, &ev, &outs[i], NULL, &err));
        ASSERT(engine_out_wait(outs + i, 1, 60000));
    }
    ASSERT(engine_out_wait(outs, N, 60000));
    usleep(120000); /* the engine publishes its stats after the step */
    sd_engine_get_stats(e, &st);
    sd_engine_destroy(e);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(outs[i].why, SD_FINISH_LENGTH);
    fprintf(stderr,
            "  exploring drafting steps: %llu before the arrivals, %llu after; exploring %d\n",
            (unsigned long long)explored0,
            (unsigned long long)st.spec_why_steps[SD_KWHY_EXPLORE], st.spec_exploring);
    ASSERT_GT(st.spec_why_steps[SD_KWHY_EXPLORE], explored0);
    ASSERT_EQ(st.spec_exploring, 0);
}

/* Adaptive k learns a drafting phase's cost only from steps without prompt
 * rows, as it learns the target's: a request drafts in the step that ends
 * its prefill, and that phase also runs the prompt through the proposer
 * (a catch-up pass the size of the prompt), so it is counted but not
 * learnt from; every later phase is. 3 requests of short prompts (each
 * prefilled in one step): 1 to 3 such steps, then steady ones. */
TEST(adaptive_k_learns_drafting_costs_only_from_steps_without_prompt_rows)
{
    sd_err err = {0};
    engine_out outs[3];
    sd_engine *e = mtp_engine_with("2", "off", outs, 3, 24, &err);
    ASSERT_MSG(e, "engine: %s", err.msg);
    ASSERT_EQ(engine_out_wait(outs, 3, 60000), 1);
    usleep(120000); /* the engine publishes its stats after the step */
    sd_engine_stats st;
    sd_engine_get_stats(e, &st);
    sd_engine_destroy(e);
    fprintf(stderr, "  drafting phases %llu, learnt from %llu\n",
            (unsigned long long)st.spec_draft_phases, (unsigned long long)st.spec_draft_observed);
    ASSERT_GT(st.spec_draft_observed, 0);
    ASSERT_GE(st.spec_draft_phases - st.spec_draft_observed, 1);
    ASSERT_LE(st.spec_draft_phases - st.spec_draft_observed, 3);
    ASSERT_EQ(st.draft_ahead_timed, 0); /* (no draft ahead) */
    /* no graphs on the CPU: every proposer pass runs eagerly, none is a
     * graph shape's one-off, and no phase is left out for one */
    ASSERT_EQ(st.spec_draft_oneoff, 0);
    /* with draft ahead, a fixed k's phases are not waited for: none is
     * timed (their verify steps ran during them), every one went ahead */
    e = mtp_engine_with("2", "auto", outs, 3, 24, &err);
    ASSERT_MSG(e, "engine: %s", err.msg);
    ASSERT_EQ(engine_out_wait(outs, 3, 60000), 1);
    usleep(120000);
    sd_engine_get_stats(e, &st);
    sd_engine_destroy(e);
    ASSERT_EQ(st.spec_draft_observed, 0);
    ASSERT_GT(st.draft_ahead_steps, 0);
    /* and the steps that took them, at the batch of their phase, were
     * timed from the step before's tokens (what adaptive k prices a
     * drafting step ahead at; a fixed k prices nothing) */
    fprintf(stderr, "  draft-ahead steps %llu, timed %llu\n",
            (unsigned long long)st.draft_ahead_steps, (unsigned long long)st.draft_ahead_timed);
    ASSERT_GT(st.draft_ahead_timed, 0);
    ASSERT_LE(st.draft_ahead_timed, st.draft_ahead_steps);
}

/* A request's stop token ids end it like eos (a chat template's end of turn). */
TEST(stop_token_ids_end_a_request_like_eos)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    char *m = dir_of("llama");
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "128", &err);
    sd_engine *e;
    ASSERT_OK(sd_engine_create(&e, &o, &err));
    free(m);
    sd_opts_free(&o);
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    int32_t p[4] = {5, 6, 7, 8};
    engine_out a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.mu = b.mu = &g_mu;
    sd_gen_params gp = {.max_tokens = 12, .top_p = 1};
    ASSERT_OK(sd_engine_submit(e, p, 4, &gp, &ev, &a, NULL, &err));
    for (int spin = 0; spin < 20000 && !a.done; spin++)
        usleep(1000);
    ASSERT(a.done && a.n == 12);
    /* the first occurrence of the 4th token ends the second run there */
    int32_t stop = a.ids[3];
    int first = 3;
    for (int i = 0; i < 3; i++)
        if (a.ids[i] == stop) {
            first = i;
            break;
        }
    gp.stop_ids = &stop;
    gp.n_stop_ids = 1;
    ASSERT_OK(sd_engine_submit(e, p, 4, &gp, &ev, &b, NULL, &err));
    for (int spin = 0; spin < 20000 && !b.done; spin++)
        usleep(1000);
    sd_engine_destroy(e);
    ASSERT_EQ(b.why, SD_FINISH_STOP);
    ASSERT_EQ(b.n, first + 1);
}

/* Launch ahead (engine.c): a plain greedy decode step queued before the one
 * before it is read, its tokens copied on the device. Against reading every
 * step first: the same tokens and finish reasons, with requests ending at a
 * stop token mid-chain (their rows in the queued step are computed and
 * dropped), requests arriving while a chain runs, one cancelled, and every
 * KV block back at the end. On the CPU the queued step runs at once; the
 * order of the engine's work is the GPU's. */
static sd_engine *ahead_engine(const char *model, const char *ahead, int pad_bs)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return NULL;
    char *m = dir_of(model);
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "launch-ahead", ahead, &err);
    if (pad_bs > 0) {
        char buf[16];
        snprintf(buf, sizeof buf, "%d", pad_bs);
        sd_opts_set(&o, SD_CMD_GENERATE, "cuda-graph-max-bs", buf, &err);
        o.debug_pad_steps = 1;
    }
    return engine_of_opts(&o, m);
}

#define AHEAD_N 7

/* Runs AHEAD_N requests (stop[i] >= 0: a stop id; sampled: the odd ones
 * sample, seeded, at T 0.8, the rest greedy), the last three arriving
 * once the first has 4 tokens; cancel >= 0: that request is cancelled
 * once it has 3. Returns the engine's queued-ahead steps, -1 on failure. */
static long long ahead_run(const char *model, const char *ahead, int pad_bs, const int32_t *stop,
                           int cancel, int sampled, engine_out *outs)
{
    sd_engine *e = ahead_engine(model, ahead, pad_bs);
    if (!e)
        return -1;
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    uint64_t ids[AHEAD_N];
    sd_err err = {0};
    for (int i = 0; i < AHEAD_N; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].mu = &g_mu;
    }
    for (int i = 0; i < AHEAD_N; i++) {
        int wait_for = i == AHEAD_N - 3 ? 4 : 0;
        for (int spin = 0; wait_for && spin < 20000; spin++) {
            pthread_mutex_lock(&g_mu);
            int n = outs[0].n;
            pthread_mutex_unlock(&g_mu);
            if (n >= wait_for || outs[0].done)
                break;
            usleep(500);
        }
        int32_t p[8];
        for (int j = 0; j < 3 + i % 4; j++)
            p[j] = (int32_t)(11 + 17 * i + 5 * j);
        sd_gen_params gp = {.max_tokens = 20 + 3 * i, .top_p = 1};
        if (sampled && i % 2) {
            gp.temperature = 0.8;
            gp.seed = 1000 + (uint64_t)i;
            gp.has_seed = 1;
        }
        if (stop && stop[i] >= 0) {
            gp.stop_ids = &stop[i];
            gp.n_stop_ids = 1;
        }
        if (sd_engine_submit(e, p, 3 + i % 4, &gp, &ev, &outs[i], &ids[i], &err)) {
            fprintf(stderr, "  submit: %s\n", err.msg);
            sd_engine_destroy(e);
            return -1;
        }
    }
    if (cancel >= 0) {
        for (int spin = 0; spin < 20000; spin++) {
            pthread_mutex_lock(&g_mu);
            int n = outs[cancel].n, done = outs[cancel].done;
            pthread_mutex_unlock(&g_mu);
            if (n >= 3 || done)
                break;
            usleep(200);
        }
        sd_engine_cancel(e, ids[cancel]);
    }
    engine_out_wait(outs, AHEAD_N, 60000);
    usleep(120000); /* the stats go out after the step */
    sd_engine_stats st;
    sd_engine_get_stats(e, &st);
    sd_engine_destroy(e);
    if (st.kv_blocks_used != 0) {
        fprintf(stderr, "  %d KV blocks still held\n", st.kv_blocks_used);
        return -1;
    }
    return (long long)st.ahead_steps;
}

TEST(launch_ahead_gives_the_same_tokens_as_reading_each_step)
{
    const char *models[] = {"llama", "deepseek-v3"};
    for (int v = 0; v < 6; v++) {
        /* llama, deepseek-v3: greedy unpadded, greedy padded, half sampled */
        int mi = v / 3, pad = v % 3 == 1, smp = v % 3 == 2;
        {
            int pad_bs = pad ? 4 : 0;
            engine_out free_run[AHEAD_N], off[AHEAD_N], on[AHEAD_N];
            ASSERT(ahead_run(models[mi], "off", pad_bs, NULL, -1, smp, free_run) == 0);
            /* stop ids from the free run: requests end at a token's first
             * occurrence, between 3 and 12 tokens in; one has none */
            int32_t stop[AHEAD_N];
            for (int i = 0; i < AHEAD_N; i++) {
                ASSERT(free_run[i].done && free_run[i].n > 12);
                stop[i] = i == 2 ? -1 : free_run[i].ids[3 + (i * 5) % 10];
            }
            ASSERT(ahead_run(models[mi], "off", pad_bs, stop, -1, smp, off) == 0);
            long long n_ahead = ahead_run(models[mi], "on", pad_bs, stop, -1, smp, on);
            ASSERT_MSG(n_ahead > 0, "%s pad %d: %lld steps queued ahead", models[mi], pad_bs,
                       n_ahead);
            int stopped = 0;
            for (int i = 0; i < AHEAD_N; i++) {
                ASSERT_EQ(on[i].why, off[i].why);
                ASSERT_EQ(on[i].n, off[i].n);
                for (int j = 0; j < on[i].n; j++)
                    ASSERT_MSG(on[i].ids[j] == off[i].ids[j], "%s pad %d request %d token %d",
                               models[mi], pad_bs, i, j);
                stopped += on[i].why == SD_FINISH_STOP;
            }
            ASSERT(stopped >= 3);
            /* a cancel mid-chain: that request ends CANCELLED on a prefix of
             * its tokens; the others are untouched */
            long long n2 = ahead_run(models[mi], "on", pad_bs, stop, 2, smp, on);
            ASSERT(n2 > 0);
            for (int i = 0; i < AHEAD_N; i++) {
                if (i == 2) {
                    ASSERT(on[i].why == SD_FINISH_CANCELLED || on[i].why == SD_FINISH_LENGTH);
                    ASSERT(on[i].n <= off[i].n);
                } else {
                    ASSERT_EQ(on[i].why, off[i].why);
                    ASSERT_EQ(on[i].n, off[i].n);
                }
                for (int j = 0; j < on[i].n; j++)
                    ASSERT_EQ(on[i].ids[j], off[i].ids[j]);
            }
            fprintf(stderr, "  %s pad %d%s: equal; %lld steps queued ahead, %d requests stopped\n",
                    models[mi], pad_bs, smp ? " sampled" : "", n_ahead, stopped);
        }
    }
}

/* A draft LM whose tokenizer differs from the target's is refused at start. */
TEST(a_draft_model_with_another_tokenizer_is_refused)
{
    char root[1024];
    snprintf(root, sizeof root, "%s/models", sd_test_srcdir());
    char tmpl[] = "/tmp/specd-draft-XXXXXX";
    ASSERT(mkdtemp(tmpl) != NULL);
    const char *links[] = {"config.json", "model.safetensors", "tokenizer_config.json"};
    char a[1200], b[1200];
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/specd-tiny-draft/%s", root, links[i]);
        snprintf(b, sizeof b, "%s/%s", tmpl, links[i]);
        ASSERT_OK(symlink(a, b));
    }
    char *tj = NULL;
    size_t len = 0;
    sd_err err = {0};
    snprintf(a, sizeof a, "%s/specd-tiny-draft/tokenizer.json", root);
    ASSERT_OK(sd_read_file(a, &tj, &len, &err));
    char *hit = strstr(tj, "\"<|im_start|>\"");
    ASSERT(hit != NULL);
    memcpy(hit + 5, "BEGIN", 5); /* <|im_BEGIN|>: same length, another token */
    snprintf(b, sizeof b, "%s/tokenizer.json", tmpl);
    ASSERT_OK(sd_write_file(b, tj, len, &err));
    free(tj);
    sd_opts o;
    ASSERT_OK(sd_opts_init(&o, &err));
    snprintf(a, sizeof a, "%s/specd-tiny", root);
    sd_opts_set(&o, SD_CMD_GENERATE, "model", a, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", "draft", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", tmpl, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", &err);
    sd_engine *e = NULL;
    int rc = sd_engine_create(&e, &o, &err);
    sd_opts_free(&o);
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "%s/%s", tmpl, links[i]);
        unlink(b);
    }
    snprintf(b, sizeof b, "%s/tokenizer.json", tmpl);
    unlink(b);
    rmdir(tmpl);
    ASSERT_EQ(rc, SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "tokenizer does not match");
}

TEST(a_kv_cache_too_small_for_one_full_context_request_is_refused_at_start)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    char *m = dir_of("llama");
    sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "kv-blocks", "4", &err);
    sd_engine *e = NULL;
    ASSERT_EQ(sd_engine_create(&e, &o, &err), SD_EFULL);
    ASSERT_CONTAINS(err.msg, "maximum context (256 tokens)");
    ASSERT(e == NULL);
    free(m);
    sd_opts_free(&o);
}

TEST_MAIN(T(mtp_greedy_output_equals_plain_at_batch_1_3_8_16),
          T(ngram_greedy_output_equals_plain_at_batch_1_3_8_16),
          T(draft_model_greedy_output_equals_plain_at_batch_1_3_8_16),
          T(eagle3_greedy_output_equals_plain_at_batch_1_3_8_16),
          T(adaptive_k_greedy_output_equals_plain),
          T(draft_ahead_on_and_off_equal_plain_with_sampled_arrivals),
          T(padded_steps_give_the_same_output_for_every_proposer_greedy_and_sampled),
          T(tensor_parallel_engine_gives_the_same_output_as_one_rank), T(moe_shared_slots_give_the_same_output),
          T(small_kv_cache_preempts_and_every_request_still_finishes_with_the_same_output),
          T(a_seeded_sampled_request_is_reproducible_whatever_the_batch),
          T(submit_refuses_bad_requests_with_a_message),
          T(draft_lm_reserves_the_last_token_position_at_a_block_boundary),
          T(adaptive_k_stops_drafting_when_nothing_is_accepted),
          T(where_plain_steps_are_queued_ahead_no_request_drafts_as_a_probe),
          T(an_exploration_while_speculation_is_off_drafts_and_then_ends),
          T(adaptive_k_learns_drafting_costs_only_from_steps_without_prompt_rows),
          T(requests_that_end_while_k_is_priced_ahead_are_not_read_after_they_are_freed),
          T(stop_token_ids_end_a_request_like_eos),
          T(launch_ahead_gives_the_same_tokens_as_reading_each_step),
          T(a_draft_model_with_another_tokenizer_is_refused),
          T(a_kv_cache_too_small_for_one_full_context_request_is_refused_at_start))

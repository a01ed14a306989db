/* GPU tests: whole models on the CUDA backend against the CPU backend.
 *
 * Golden fixtures (tests/golden/models/): prefill logits, token-by-token
 * decode logits and the MTP head's logits within 1e-3 of the CPU's
 * (max |d| / max |ref|). The only inexact step is the cuBLASLt GEMM of steps
 * above SD_CUDA_GEMV_MAX_ROWS tokens on bf16 activation terms (hi + lo): a
 * CPU model of it gives 0.7-1.6e-5 on these fixtures, 0 on the F16/F32 ones.
 * A whole forward captured into a CUDA graph replays bit for bit, and
 * plain kernel launches give the bits of programmatic dependent ones.
 *
 * The bundled model (models/specd-tiny, when present): greedy generation of
 * 32 tokens on the GPU equals the CPU's for every held-out prompt (its first
 * 64 tokens), and prefill logits stay within 1e-3. Through the engine on the
 * GPU, greedy speculation (MTP, EAGLE-3, the draft LM at k = 3) gives plain
 * decode's tokens at batch 1, 3 and 4, whose verify steps (4, 12, 16 rows)
 * take attention's split path as the decode steps do. */
#include <dirent.h>
#include <jansson.h>

#include "core/config.h"
#include "core/tokenizer.h"
#include "engine/engine_run.h"
#include "gpu_test.h"
#include "target/runner.h"
#include "../target/fp8_ckpt.h"

#define MODEL_BOUND 1e-3

static int read_ids(const char *dir, int32_t *ids, int max)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j)
        return -1;
    json_t *a = json_object_get(j, "ids");
    int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < max; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    json_decref(j);
    return n < max ? n : max;
}

static int fixtures(char names[][256], int max)
{
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/golden/models", sd_test_srcdir());
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s/golden.json", root, e->d_name);
        if (e->d_name[0] != '.' && sd_file_exists(p))
            snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

/* One model on one backend: logits of a full prefill, of a half prefill then
 * one token at a time, the final hidden, and MTP logits fed mtp_in. */
typedef struct run_out {
    float *prefill, *decode, *hidden, *mtp;
    int V, D, has_mtp;
} run_out;

static void run_out_free(run_out *r)
{
    free(r->prefill);
    free(r->decode);
    free(r->hidden);
    free(r->mtp);
}

/* the model of dir loaded with mo (max_tokens and load_mtp set here) */
static int run_model_opts(sd_backend *be, const char *dir, const int32_t *ids, int n,
                          const float *mtp_in, sd_model_opts mo, run_out *o, sd_err *err)
{
    memset(o, 0, sizeof *o);
    sd_model *m = NULL;
    mo.max_tokens = 64;
    mo.load_mtp = 1;
    int rc = sd_model_load(&m, dir, be, &mo, err);
    if (!rc)
        rc = sd_model_alloc_kv(m, n + 64, err);
    if (rc)
        goto done;
    const sd_model_cfg *c = sd_model_cfg_of(m);
    int V = o->V = c->vocab_size, D = o->D = c->hidden_size;
    o->prefill = (float *)calloc((size_t)n * V, sizeof(float));
    o->decode = (float *)calloc((size_t)n * V, sizeof(float));
    o->hidden = (float *)calloc((size_t)n * D, sizeof(float));
    sd_seq_out so = {.logits = o->prefill, .hidden = o->hidden};
    if ((rc = sd_runner_target(m, ids, n, 0, &so, err)))
        goto done;
    int k = n / 2;
    sd_seq_out s1 = {.logits = o->decode};
    if ((rc = sd_runner_target(m, ids, k, 0, &s1, err)))
        goto done;
    for (int i = k; i < n && !rc; i++) {
        sd_seq_out s2 = {.logits = o->decode + (size_t)i * V};
        rc = sd_runner_target(m, ids + i, 1, i, &s2, err);
    }
    if (!rc && sd_model_has_mtp(m)) {
        o->has_mtp = 1;
        o->mtp = (float *)calloc((size_t)(n - 1) * V, sizeof(float));
        sd_seq_out sm = {.logits = o->mtp};
        rc = sd_runner_mtp(m, ids + 1, mtp_in ? mtp_in : o->hidden, n - 1, 0, &sm, err);
    }
done:
    sd_model_free(m);
    return rc;
}

/* slots: the MoE shared experts in the expert bank (--moe-shared-slots) */
static int run_model(sd_backend *be, const char *dir, const int32_t *ids, int n,
                     const float *mtp_in, int slots, run_out *o, sd_err *err)
{
    return run_model_opts(be, dir, ids, n, mtp_in, (sd_model_opts){.moe_shared_slots = slots}, o,
                          err);
}

TEST(gpu_logits_match_the_cpu_on_every_golden_fixture)
{
    gpu_env e;
    GPU_OPEN(e);
    char names[64][256];
    int nf = fixtures(names, 64);
    ASSERT_MSG(nf >= 6, "expected the fixtures under tests/golden/models, found %d", nf);
    int ok = 1;
    for (int f = 0; f < nf; f++) {
        char dir[1400];
        snprintf(dir, sizeof dir, "%s/tests/golden/models/%.255s", sd_test_srcdir(), names[f]);
        int32_t ids[256];
        int n = read_ids(dir, ids, 256);
        ASSERT_MSG(n > 2, "%s: no ids", dir);
        run_out c, g;
        sd_err err = {0};
        ASSERT_MSG(run_model(e.cpu, dir, ids, n, NULL, 0, &c, &err) == 0, "%s: cpu: %s", names[f],
                   err.msg);
        ASSERT_MSG(run_model(e.gpu, dir, ids, n, c.hidden, 0, &g, &err) == 0, "%s: gpu: %s (%s)",
                   names[f], err.msg, sd_cuda_backend_error(e.gpu));
        size_t nv = (size_t)n * c.V;
        ok &= reportf(rel_err(g.prefill, c.prefill, nv), MODEL_BOUND, "model %s prefill logits (%d tokens)",
                      names[f], n);
        ok &= reportf(rel_err(g.decode, c.decode, nv), MODEL_BOUND,
                      "model %s decode logits (prefill %d, then 1 token/step)", names[f], n / 2);
        ok &= reportf(rel_err(g.hidden, c.hidden, (size_t)n * c.D), MODEL_BOUND,
                      "model %s final hidden", names[f]);
        if (c.has_mtp)
            ok &= reportf(g.has_mtp ? rel_err(g.mtp, c.mtp, (size_t)(n - 1) * c.V) : INFINITY,
                          MODEL_BOUND, "model %s mtp logits", names[f]);
        /* the MoE fixtures again with their shared experts in the expert
         * bank, against the CPU's dense shared MLP */
        if (!strncmp(names[f], "deepseek", 8)) {
            run_out s;
            ASSERT_MSG(run_model(e.gpu, dir, ids, n, c.hidden, 1, &s, &err) == 0,
                       "%s: gpu, shared slots: %s (%s)", names[f], err.msg,
                       sd_cuda_backend_error(e.gpu));
            ok &= reportf(rel_err(s.prefill, c.prefill, nv), MODEL_BOUND,
                          "model %s, shared experts in the bank: prefill logits", names[f]);
            ok &= reportf(rel_err(s.decode, c.decode, nv), MODEL_BOUND,
                          "model %s, shared experts in the bank: decode logits", names[f]);
            if (c.has_mtp)
                ok &= reportf(s.has_mtp ? rel_err(s.mtp, c.mtp, (size_t)(n - 1) * c.V) : INFINITY,
                              MODEL_BOUND, "model %s, shared experts in the bank: mtp logits",
                              names[f]);
            run_out_free(&s);
        }
        run_out_free(&c);
        run_out_free(&g);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A whole forward (every layer, head, MoE) captured into a graph and replayed
 * equals the eager forward bit for bit: nothing in it allocates or syncs. */
TEST(a_captured_model_forward_replays_the_eager_logits)
{
    gpu_env e;
    GPU_OPEN(e);
    char names[64][256];
    int nf = fixtures(names, 64);
    ASSERT(nf > 0);
    int ok = 1;
    for (int f = 0; f < nf; f++) {
        char dir[1400];
        snprintf(dir, sizeof dir, "%s/tests/golden/models/%.255s", sd_test_srcdir(), names[f]);
        int32_t ids[256];
        int n = read_ids(dir, ids, 64);
        sd_model *m = NULL;
        sd_err err = {0};
        sd_model_opts mo = {.max_tokens = 64, .load_mtp = 0};
        ASSERT_MSG(sd_model_load(&m, dir, e.gpu, &mo, &err) == 0 &&
                       sd_model_alloc_kv(m, 64, &err) == 0,
                   "%s: %s", names[f], err.msg);
        int V = sd_model_cfg_of(m)->vocab_size;
        int32_t pos[64], zero[64], table[4] = {0, 1, 2, 3};
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            zero[i] = 0;
        }
        int32_t *dtok = (int32_t *)gput(&e, ids, (size_t)n * 4);
        int32_t *dpos = (int32_t *)gput(&e, pos, (size_t)n * 4);
        int32_t *dseq = (int32_t *)gput(&e, zero, (size_t)n * 4);
        int32_t *dtab = (int32_t *)gput(&e, table, sizeof table);
        float *dlog = gpoison(&e, (size_t)n * V);
        sd_fwd fw = {.ab = {.n_tokens = n, .pos = dpos, .seq = dseq, .slot = dpos,
                            .block_table = dtab, .max_blocks = 4, .block_size = 16, .max_pos = n},
                     .tokens = dtok, .n_out = n, .out_rows = dpos, .logits = dlog};
        ASSERT_OK(sd_model_forward(m, &fw, &err));
        float *eager = gget(&e, dlog, (size_t)n * V);
        ASSERT(eager != NULL);
        sd_cuda_graph *gr = NULL;
        ASSERT_OK(sd_cuda_capture_begin(e.gpu));
        int frc = sd_model_forward(m, &fw, &err);
        ASSERT_OK(sd_cuda_capture_end(e.gpu, &gr));
        ASSERT_OK(frc);
        float *nan = (float *)malloc((size_t)n * V * sizeof(float));
        for (size_t i = 0; i < (size_t)n * V; i++)
            nan[i] = NAN;
        e.gpu->ops->upload(e.gpu, dlog, nan, (size_t)n * V * 4);
        free(nan);
        ASSERT_OK(sd_cuda_graph_launch(e.gpu, gr));
        float *replay = gget(&e, dlog, (size_t)n * V);
        ASSERT(replay != NULL);
        ok &= reportf(rel_err(replay, eager, (size_t)n * V), 0,
                      "model %s graph replay vs eager logits (bitwise)", names[f]);
        sd_cuda_graph_destroy(gr);
        /* programmatic dependent launches (SPECD_PDL=1) against plain ones */
        sd_cuda_set_pdl(e.gpu, 1);
        float *nan2 = (float *)malloc((size_t)n * V * sizeof(float));
        for (size_t i = 0; i < (size_t)n * V; i++)
            nan2[i] = NAN;
        e.gpu->ops->upload(e.gpu, dlog, nan2, (size_t)n * V * 4);
        free(nan2);
        ASSERT_OK(sd_model_forward(m, &fw, &err));
        sd_cuda_set_pdl(e.gpu, 0);
        float *pdl = gget(&e, dlog, (size_t)n * V);
        ASSERT(pdl != NULL);
        ok &= reportf(rel_err(pdl, eager, (size_t)n * V), 0,
                      "model %s programmatic dependent launches vs plain ones (bitwise)", names[f]);
        free(pdl);
        free(eager);
        free(replay);
        GFREE_ALL(&e, dtok, dpos, dseq, dtab, dlog);
        sd_model_free(m);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

#define PROMPT_TOKENS 64
#define GREEDY_TOKENS 32

/* Greedy continuation of ids[0..n) by GREEDY_TOKENS tokens into out;
 * the prefill logits (n, V) into prefill. */
static int greedy(sd_model *m, const int32_t *ids, int n, int32_t *out, float *prefill,
                  float *row, sd_err *err)
{
    int V = sd_model_cfg_of(m)->vocab_size;
    sd_seq_out so = {.logits = prefill};
    int rc = sd_runner_target(m, ids, n, 0, &so, err);
    int next = argmax(prefill + (size_t)(n - 1) * V, V);
    for (int i = 0; i < GREEDY_TOKENS && !rc; i++) {
        out[i] = next;
        sd_seq_out s1 = {.logits = row};
        rc = sd_runner_target(m, &out[i], 1, n + i, &s1, err);
        next = argmax(row, V);
    }
    return rc;
}

TEST(greedy_generation_on_the_gpu_equals_the_cpu_on_the_bundled_model)
{
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/models/specd-tiny", sd_test_srcdir());
    snprintf(path, sizeof path, "%s/heldout_prompts.jsonl", dir);
    if (!sd_file_exists(path))
        TEST_SKIP("%s is absent (the bundled model is not trained yet)", path);
    gpu_env e;
    GPU_OPEN(e);
    sd_err err = {0};
    sd_tokenizer *tk = NULL;
    char tpath[1300];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    ASSERT_MSG(sd_tok_load(&tk, tpath, &err) == 0, "%s", err.msg);
    sd_model *mc = NULL, *mg = NULL;
    sd_model_opts mo = {.max_tokens = PROMPT_TOKENS, .load_mtp = 0};
    int slots = PROMPT_TOKENS + GREEDY_TOKENS + 1;
    ASSERT_MSG(sd_model_load(&mc, dir, e.cpu, &mo, &err) == 0 && sd_model_alloc_kv(mc, slots, &err) == 0,
               "cpu: %s", err.msg);
    ASSERT_MSG(sd_model_load(&mg, dir, e.gpu, &mo, &err) == 0 && sd_model_alloc_kv(mg, slots, &err) == 0,
               "gpu: %s", err.msg);
    int V = sd_model_cfg_of(mc)->vocab_size;
    float *pc = (float *)malloc((size_t)PROMPT_TOKENS * V * sizeof(float));
    float *pg = (float *)malloc((size_t)PROMPT_TOKENS * V * sizeof(float));
    float *row = (float *)malloc((size_t)V * sizeof(float));
    FILE *f = fopen(path, "r");
    ASSERT(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    int prompts = 0, diverged = 0, failed = 0;
    double worst = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        const char *txt = j ? json_string_value(json_object_get(j, "prompt")) : NULL;
        int32_t *ids = NULL;
        int n = 0;
        if (!txt || sd_tok_encode(tk, txt, strlen(txt), 1, &ids, &n, &err) || n < 2) {
            json_decref(j);
            free(ids);
            continue;
        }
        if (n > PROMPT_TOKENS)
            n = PROMPT_TOKENS;
        int32_t oc[GREEDY_TOKENS], og[GREEDY_TOKENS];
        if (greedy(mc, ids, n, oc, pc, row, &err) || greedy(mg, ids, n, og, pg, row, &err)) {
            fprintf(stderr, "  prompt %d: %s (%s)\n", prompts, err.msg,
                    sd_cuda_backend_error(e.gpu));
            failed = 1;
        } else {
            for (int i = 0; i < GREEDY_TOKENS; i++)
                if (oc[i] != og[i]) {
                    fprintf(stderr, "  prompt %d: token %d: gpu %d, cpu %d\n", prompts, i, og[i],
                            oc[i]);
                    diverged++;
                    break;
                }
            double r = rel_err(pg, pc, (size_t)n * V);
            worst = r > worst ? r : worst;
        }
        prompts++;
        free(ids);
        json_decref(j);
        if (failed)
            break;
    }
    free(line);
    fclose(f);
    int ok = !failed && prompts > 0;
    ok &= reportf(diverged, 0, "specd-tiny greedy %d tokens, %d prompts: prompts that diverge",
                  GREEDY_TOKENS, prompts);
    ok &= reportf(worst, MODEL_BOUND, "specd-tiny prefill logits, worst of %d prompts", prompts);
    free(pc);
    free(pg);
    free(row);
    sd_model_free(mc);
    sd_model_free(mg);
    sd_tok_free(tk);
    gpu_env_close(&e);
    ASSERT(ok);
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static sd_engine_stats g_last_stats; /* engine_run's engine's, at its end */
/* engine_run's requests arrive one at a time, each once the one before has
 * two tokens (steps with a prompt's rows beside decode rows), with prompts
 * of g_prompt_ids ids; g_graph_bs: --cuda-graph-max-bs (NULL: the
 * default); g_prompt_rows: --cuda-graph-prompt-rows (NULL: the
 * default) */
static int g_stagger, g_prompt_ids;
/* > 0: engine_run's requests ask for logprobs with g_logprobs - 1 top;
 * g_lp_only (not 0): only the requests of its bits (bit i: request i) */
static int g_logprobs;
static unsigned g_lp_only;
static const char *g_prompt_rows, *g_graph_bs;
/* g_again: once the n requests end, the same n again (same prompts and
 * seeds) into outs[n..2n): they start after the prefix cache's blocks;
 * g_no_cache: --no-prefix-cache */
static int g_again, g_no_cache;
/* with g_logprobs: the prompts' log probabilities too */
static int g_plp;

/* n requests of greedy decoding on the bundled model through the engine on
 * the GPU (random prompts of 8-40 ids, 40 tokens each, all at once; temp >
 * 0: the odd ones sample, seeded); ahead: --launch-ahead; *n_ahead (if not
 * NULL): the steps queued ahead */
static int engine_run(const char *dir, const char *spec, const char *draft, int n,
                      const char *ahead, float temp, engine_out *outs, long *n_ahead)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return -1;
    char buf[1300];
    sd_opts_set(&o, SD_CMD_GENERATE, "model", dir, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "device", "cuda", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec", spec, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "spec-k", "3", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "launch-ahead", ahead, &err);
    if (g_prompt_rows)
        sd_opts_set(&o, SD_CMD_GENERATE, "cuda-graph-prompt-rows", g_prompt_rows, &err);
    if (g_graph_bs)
        sd_opts_set(&o, SD_CMD_GENERATE, "cuda-graph-max-bs", g_graph_bs, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "prefix-cache", g_no_cache ? "false" : "true", &err);
    if (draft) {
        snprintf(buf, sizeof buf, "%s-%s", dir, draft);
        sd_opts_set(&o, SD_CMD_GENERATE, "draft-model", buf, &err);
    }
    sd_engine *e = NULL;
    int rc = err.msg[0] ? -1 : sd_engine_create(&e, &o, &err);
    sd_opts_free(&o);
    if (rc) {
        fprintf(stderr, "  engine (%s): %s\n", spec, err.msg);
        return -1;
    }
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish,
                        .on_logprobs = engine_out_on_logprobs};
    for (int round = 0; round < 1 + (g_again != 0) && !rc; round++) {
        uint64_t x = 0x9e3779b97f4a7c15ull;
        engine_out *o_r = outs + round * n;
        for (int i = 0; i < n && !rc; i++) {
            memset(&o_r[i], 0, sizeof o_r[i]);
            o_r[i].mu = &g_mu;
            int32_t p[40];
            int np = g_prompt_ids ? g_prompt_ids : 8 + i * 9 % 33;
            for (int spin = 0; g_stagger && i > 0 && spin < 20000; spin++) {
                pthread_mutex_lock(&g_mu);
                int go = o_r[i - 1].n >= 2 || o_r[i - 1].done;
                pthread_mutex_unlock(&g_mu);
                if (go)
                    break;
                usleep(500);
            }
            for (int j = 0; j < np; j++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                p[j] = (int32_t)(3 + x % 8000);
            }
            sd_gen_params gp = {.max_tokens = 40, .temperature = i % 2 ? temp : 0, .top_p = 1,
                                .seed = 77 + (uint64_t)i, .has_seed = 1, .ignore_eos = 1,
                                .logprobs = g_logprobs > 0 && (!g_lp_only || (g_lp_only >> i & 1)),
                                .top_logprobs = g_logprobs > 0 ? g_logprobs - 1 : 0,
                                .prompt_logprobs = g_plp};
            o_r[i].greedy = !(i % 2 && temp > 0);
            rc = sd_engine_submit(e, p, np, &gp, &ev, &o_r[i], NULL, &err);
        }
        if (!rc && !engine_out_wait(o_r, n, 120000))
            rc = -1;
    }
    if (rc)
        fprintf(stderr, "  %s batch %d: %s\n", spec, n, err.msg[0] ? err.msg : "timed out");
    usleep(50000); /* the stats go out after the step */
    sd_engine_stats st;
    sd_engine_get_stats(e, &st);
    g_last_stats = st;
    if (n_ahead)
        *n_ahead = (long)st.ahead_steps;
    sd_engine_destroy(e);
    return rc;
}

/* tokens of a and b (n requests each) that differ, a request that did not
 * end at its length counting one */
static long tokens_differ(const engine_out *a, const engine_out *b, int n)
{
    long differ = 0;
    for (int i = 0; i < n; i++) {
        differ += a[i].n != b[i].n || a[i].why != SD_FINISH_LENGTH || b[i].why != SD_FINISH_LENGTH;
        for (int j = 0; j < a[i].n && j < b[i].n; j++)
            differ += a[i].ids[j] != b[i].ids[j];
    }
    return differ;
}

/* n requests of plain decode (temp: the odd ones' temperature) read step
 * by step and launched ahead: the same tokens, and steps were queued
 * ahead. off (if not NULL) keeps the step-by-step run's outputs. Returns
 * 1 when they agree, 0 when not, -1 when a run failed. */
static int check_ahead(const char *dir, int n, float temp, engine_out *off)
{
    engine_out a[4], b[4];
    long n_ahead = 0;
    if (!off)
        off = a;
    if (engine_run(dir, "none", NULL, n, "off", temp, off, NULL) ||
        engine_run(dir, "none", NULL, n, "on", temp, b, &n_ahead))
        return -1;
    const char *what = temp > 0 ? "sampled plain decode" : "plain decode";
    int ok = reportf((double)tokens_differ(off, b, n), 0,
                     "engine on the gpu, %s launched ahead at batch %d (%ld steps ahead): tokens "
                     "that differ from reading each step",
                     what, n, n_ahead);
    ok &= reportf(n_ahead > 0 ? 0 : 1, 0, "engine on the gpu, %s at batch %d: steps queued ahead",
                  what, n);
    return ok;
}

/* dir (a char array): the bundled model's folder; the test skips where it
 * is absent or no GPU is there */
#define BUNDLED_ON_A_GPU(dir)                                                      \
    do {                                                                           \
        char cfg_[1300];                                                           \
        snprintf(dir, sizeof dir, "%s/models/specd-tiny", sd_test_srcdir());       \
        snprintf(cfg_, sizeof cfg_, "%s/config.json", dir);                        \
        if (!sd_file_exists(cfg_))                                                 \
            TEST_SKIP("%s is absent", cfg_);                                       \
        gpu_env e_;                                                                \
        GPU_OPEN(e_); /* skips without a GPU */                                    \
        gpu_env_close(&e_);                                                        \
    } while (0)

TEST(greedy_speculation_on_the_gpu_equals_plain_decode_on_the_bundled_model)
{
    char dir[1200], path[1300];
    BUNDLED_ON_A_GPU(dir);
    static const struct { const char *spec, *draft; } props[] = {
        {"mtp", NULL}, {"eagle3", "eagle3"}, {"draft", "draft"}};
    static const int batches[] = {1, 3, 4};
    int ok = 1;
    for (size_t b = 0; b < SD_ARRAY_LEN(batches); b++) {
        int n = batches[b];
        engine_out plain[4], sp[4];
        /* plain decode queued a step ahead of its reading: the same tokens;
         * with seeded sampled requests among them too (the device's
         * sampling feeds the next step, --launch-ahead on) */
        int r = check_ahead(dir, n, 0, plain);
        if (r >= 0 && n > 1)
            r = SD_MIN(r, check_ahead(dir, n, 0.8f, NULL));
        if (r <= 0) {
            ok = 0;
            if (r < 0)
                continue;
        }
        for (size_t q = 0; q < SD_ARRAY_LEN(props); q++) {
            snprintf(path, sizeof path, "%s-%s/config.json", dir, props[q].draft ? props[q].draft : "");
            if (props[q].draft && !sd_file_exists(path))
                continue;
            if (engine_run(dir, props[q].spec, props[q].draft, n, "auto", 0, sp, NULL)) {
                ok = 0;
                continue;
            }
            long differ = tokens_differ(plain, sp, n), drafted = 0;
            for (int i = 0; i < n; i++)
                drafted += (long)sp[i].st.spec.drafted;
            ok &= reportf((double)differ, 0,
                          "engine on the gpu, %s k=3 at batch %d (%ld drafts): tokens that differ "
                          "from plain decode",
                          props[q].spec, n, drafted);
            ok &= reportf(drafted > 0 ? 0 : 1, 0, "engine on the gpu, %s at batch %d drafted",
                          props[q].spec, n);
            /* one request drafts the shapes captured at start (sd__spec_capture):
             * no drafting step ran a proposer pass eagerly or captured one */
            if (n == 1)
                ok &= reportf((double)g_last_stats.spec_draft_oneoff, 0,
                              "engine on the gpu, %s at batch 1: drafting phases with a proposer "
                              "pass run eagerly or captured (%llu phases, %llu eager passes)",
                              props[q].spec, (unsigned long long)g_last_stats.spec_draft_phases,
                              (unsigned long long)g_last_stats.spec_eager_passes);
        }
    }
    ASSERT(ok);
}

/* Steps with a prompt's rows beside decode rows replay graphs (padded to
 * the decode buckets, their logits rows to a power of two; captured the
 * second time a key comes): the same tokens as running them eagerly
 * (--cuda-graph-prompt-rows 0), plain and speculative, greedy and sampled;
 * and graphs did run. With --cuda-graph-max-bs 4 and 8-id prompts, steps
 * of 16 rows with 9-16 logits rows pad those to 16, past the decode
 * graphs' 4 rows: their own graphs (they once took the decode graph's
 * bucket, which is not there). */
TEST(steps_with_prompt_rows_replay_graphs_with_the_eager_tokens)
{
    char dir[1200];
    BUNDLED_ON_A_GPU(dir);
    static const struct {
        const char *spec;
        float temp;
        const char *graph_bs;
        int ids;
    } cfgs[] = {{"none", 0, NULL, 24},
                {"none", 0.8f, NULL, 24},
                {"mtp", 0, NULL, 24},
                {"mtp", 0.8f, NULL, 24},
                {"none", 0, "4", 8}};
    enum { N = 12 };
    int ok = 1;
    g_stagger = 1;
    for (size_t c = 0; c < SD_ARRAY_LEN(cfgs); c++) {
        g_prompt_ids = cfgs[c].ids;
        g_graph_bs = cfgs[c].graph_bs;
        engine_out eager[N], graph[N];
        g_prompt_rows = "0";
        int rc = engine_run(dir, cfgs[c].spec, NULL, N, "auto", cfgs[c].temp, eager, NULL);
        const sd_engine_stats se = g_last_stats;
        g_prompt_rows = NULL;
        rc = rc ? rc : engine_run(dir, cfgs[c].spec, NULL, N, "auto", cfgs[c].temp, graph, NULL);
        const sd_engine_stats sg = g_last_stats;
        if (rc) {
            ok = 0;
            continue;
        }
        char what[96];
        snprintf(what, sizeof what, "%s T=%.1f%s%s", cfgs[c].spec, cfgs[c].temp,
                 cfgs[c].graph_bs ? " --cuda-graph-max-bs " : "",
                 cfgs[c].graph_bs ? cfgs[c].graph_bs : "");
        ok &= reportf((double)tokens_differ(eager, graph, N), 0,
                      "engine on the gpu, %s, %d arrivals one at a time: tokens that differ "
                      "with steps of prompt rows from graphs (%llu of %llu such steps) and eager",
                      what, N, (unsigned long long)sg.prompt_graph_steps,
                      (unsigned long long)sg.prompt_steps);
        ok &= reportf(sg.prompt_graph_steps > 0 ? 0 : 1, 0,
                      "engine on the gpu, %s: steps with prompt rows replayed graphs", what);
        ok &= reportf((double)(se.prompt_graph_steps + se.prompt_padded_steps), 0,
                      "engine on the gpu, %s, --cuda-graph-prompt-rows 0: steps with prompt "
                      "rows padded or from graphs",
                      what);
    }
    g_stagger = g_prompt_ids = 0;
    g_graph_bs = NULL;
    ASSERT(ok);
}

/* Requests that ask for logprobs take the host's path (their logits rows
 * come down and their tokens are chosen there; nothing is queued ahead of
 * their steps): the same tokens as without, plain and speculative, greedy
 * and sampled; one entry a token, each a log probability, a greedy token
 * its position's likeliest. Two of four asking: the others' tokens still
 * chosen on the device, the same tokens, and on plain decode only the two
 * requests' rows come down. */
TEST(logprobs_on_the_gpu_change_no_token)
{
    char dir[1200];
    BUNDLED_ON_A_GPU(dir);
    static const char *const specs[] = {"none", "mtp"};
    int ok = 1;
    for (size_t q = 0; q < SD_ARRAY_LEN(specs); q++) {
        for (int sampled = 0; sampled < 2; sampled++) {
            engine_out a[4], b[4], c[4];
            const float temp = sampled ? 0.8f : 0;
            g_logprobs = 0;
            int rc = engine_run(dir, specs[q], NULL, 4, "auto", temp, a, NULL);
            g_logprobs = 1 + 5;
            rc |= engine_run(dir, specs[q], NULL, 4, "auto", temp, b, NULL);
            /* two of them ask (0 and 2, greedy) beside two whose tokens the
             * device chooses: only their rows come down */
            g_lp_only = 0x5;
            rc |= engine_run(dir, specs[q], NULL, 4, "auto", temp, c, NULL);
            const long host_rows = (long)g_last_stats.logits_host_rows;
            g_lp_only = 0;
            g_logprobs = 0;
            if (rc) {
                ok = 0;
                continue;
            }
            long mixed = 0;
            for (int i = 0; i < 4; i++)
                mixed += (i % 2 ? c[i].n_lp : labs((long)(c[i].n_lp - c[i].n))) + c[i].lp_bad;
            ok &= reportf((double)tokens_differ(a, c, 4), 0,
                          "engine on the gpu, %s %s at batch 4: tokens that differ with logprobs "
                          "asked by two requests",
                          specs[q], sampled ? "sampled" : "greedy");
            ok &= reportf((double)mixed, 0,
                          "engine on the gpu, %s %s: logprobs of two requests missing, wrong or "
                          "extra",
                          specs[q], sampled ? "sampled" : "greedy");
            if (!strcmp(specs[q], "none")) /* 40 tokens each, a row a token */
                ok &= reportf((double)labs(host_rows - 80), 0,
                              "engine on the gpu, plain %s: logits rows to the host off the two "
                              "requests' 80",
                              sampled ? "sampled" : "greedy");
            long bad = 0, missing = 0;
            for (int i = 0; i < 4; i++) {
                bad += b[i].lp_bad + a[i].n_lp;
                missing += b[i].n_lp != b[i].n;
            }
            ok &= reportf((double)tokens_differ(a, b, 4), 0,
                          "engine on the gpu, %s %s at batch 4: tokens that differ with logprobs "
                          "asked",
                          specs[q], sampled ? "sampled" : "greedy");
            ok &= reportf((double)(bad + missing), 0,
                          "engine on the gpu, %s %s at batch 4: logprobs entries missing or wrong",
                          specs[q], sampled ? "sampled" : "greedy");
        }
    }
    ASSERT(ok);
}

/* The prefix cache on the GPU: the same requests again, on the same
 * engine, start after their cached blocks (the prompts of 17 ids and
 * more) and give the tokens they gave the first time and that an engine
 * without the cache gives, plain and with MTP, greedy and sampled. */
TEST(a_cached_prefix_on_the_gpu_changes_no_token)
{
    char dir[1200];
    BUNDLED_ON_A_GPU(dir);
    static const char *const specs[] = {"none", "mtp"};
    int ok = 1;
    for (size_t q = 0; q < SD_ARRAY_LEN(specs); q++) {
        for (int sampled = 0; sampled < 2; sampled++) {
            engine_out a[8], b[4];
            const float temp = sampled ? 0.8f : 0;
            g_again = 1;
            int rc = engine_run(dir, specs[q], NULL, 4, "auto", temp, a, NULL);
            g_again = 0;
            g_no_cache = 1;
            rc |= engine_run(dir, specs[q], NULL, 4, "auto", temp, b, NULL);
            g_no_cache = 0;
            if (rc) {
                ok = 0;
                continue;
            }
            long cached = 0, first = 0;
            for (int i = 0; i < 4; i++) {
                cached += a[4 + i].st.cached_tokens;
                first += a[i].st.cached_tokens + b[i].st.cached_tokens;
            }
            ok &= reportf((double)(tokens_differ(a, b, 4) + tokens_differ(a + 4, b, 4)), 0,
                          "engine on the gpu, %s %s at batch 4: tokens that differ after a "
                          "cached start",
                          specs[q], sampled ? "sampled" : "greedy");
            /* prompts of 8, 17, 26, 35 ids: 0 + 16 + 16 + 32 cached */
            ok &= reportf((double)(labs(cached - 64) + first), 0,
                          "engine on the gpu, %s %s: cached prompt tokens off 64 (then 0)",
                          specs[q], sampled ? "sampled" : "greedy");
        }
    }
    ASSERT(ok);
}

/* The prompts' log probabilities on the GPU (completions' echo: every
 * prompt row's logits to the host): one entry a prompt token but the
 * first, before the generated tokens' entries, and the tokens those
 * without them give, plain and with MTP (a prompt token is no position's
 * likeliest: the greedy check is of the run without them). */
TEST(prompt_logprobs_on_the_gpu_change_no_token)
{
    char dir[1200];
    BUNDLED_ON_A_GPU(dir);
    static const char *const specs[] = {"none", "mtp"};
    int ok = 1;
    for (size_t q = 0; q < SD_ARRAY_LEN(specs); q++) {
        engine_out a[4], b[4];
        g_logprobs = 1 + 2;
        int rc = engine_run(dir, specs[q], NULL, 4, "auto", 0, a, NULL);
        g_plp = 1;
        rc |= engine_run(dir, specs[q], NULL, 4, "auto", 0, b, NULL);
        g_plp = 0;
        g_logprobs = 0;
        if (rc) {
            ok = 0;
            continue;
        }
        long entries = 0;
        for (int i = 0; i < 4; i++) /* prompts of 8 + 9 i % 33 ids: all but their first */
            entries += labs((long)(b[i].n_lp - a[i].n_lp - (7 + i * 9 % 33))) + a[i].lp_bad;
        ok &= reportf((double)tokens_differ(a, b, 4), 0,
                      "engine on the gpu, %s greedy at batch 4: tokens that differ with the "
                      "prompts' logprobs asked",
                      specs[q]);
        ok &= reportf((double)entries, 0,
                      "engine on the gpu, %s: prompt logprobs entries missing or wrong", specs[q]);
    }
    ASSERT(ok);
}

/* The bundled model's projections quantized to block-scaled FP8 and kept as
 * FP8 on the GPU (--fp8-weights fp8) against the CPU's FP8 model: one token
 * at a time (the FP8 GEMV's factored dot, ops.h) within the model bound;
 * prefill within the weights' BF16 rounding (1e-2: its projections read
 * the dequantized BF16 scratch, its experts with few tokens the fused
 * kernels' factored dot, so it is the bits of neither the BF16 checkpoint
 * nor the CPU's). */
TEST(fp8_weights_on_the_gpu_match_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    char *src_dir, *cfg_text;
    if (bundled(&src_dir, &cfg_text)) {
        gpu_env_close(&e);
        TEST_SKIP("no bundled model");
    }
    sd_st *src = NULL;
    sd_err err = {0};
    ASSERT_MSG(sd_st_open(&src, src_dir, &err) == 0, "%s", err.msg);
    char tmpl[] = "/tmp/sd_gpu_fp8_XXXXXX";
    ASSERT(mkdtemp(tmpl));
    char *d8 = sd_strfmt("%s/fp8", tmpl), *d16 = sd_strfmt("%s/bf16", tmpl);
    ASSERT_MSG(write_ckpt(src, cfg_text, d8, 0, &err) == 0, "%s", err.msg);
    ASSERT_MSG(write_ckpt(src, cfg_text, d16, 1, &err) == 0, "%s", err.msg);
    sd_st_close(src);
    const int32_t ids[] = {0, 17, 230, 5, 991, 42, 8000, 3, 77, 1200, 64, 9, 512, 2048, 31, 600};
    const int n = (int)SD_ARRAY_LEN(ids);
    const sd_model_opts keep = {.fp8_keep = 1};
    run_out a, b, c;
    ASSERT_MSG(run_model_opts(e.gpu, d8, ids, n, NULL, keep, &a, &err) == 0, "gpu fp8: %s", err.msg);
    ASSERT_MSG(run_model_opts(e.gpu, d16, ids, n, NULL, (sd_model_opts){0}, &b, &err) == 0,
               "gpu bf16: %s", err.msg);
    ASSERT_MSG(run_model_opts(e.cpu, d8, ids, n, NULL, keep, &c, &err) == 0, "cpu fp8: %s", err.msg);
    sd_model *m = NULL;
    sd_model_opts mo = {.max_tokens = 8, .load_mtp = 1, .fp8_keep = 1};
    ASSERT_OK(sd_model_load(&m, d8, e.gpu, &mo, &err));
    const int kept = sd_model_fp8_kept(m);
    sd_model_free(m);
    const size_t nv = (size_t)n * a.V;
    int ok = reportf(kept > 0 ? 0 : 1, 0, "weights kept as fp8 on the gpu: %d", kept);
    ok &= reportf(a.has_mtp && b.has_mtp ? 0 : 1, 0, "both have the MTP layer");
    ok &= report("fp8 kept: gpu prefill logits vs cpu", rel_err(a.prefill, c.prefill, nv), 1e-2);
    ok &= report("fp8 kept: gpu decode logits vs cpu", rel_err(a.decode, c.decode, nv), MODEL_BOUND);
    run_out_free(&a);
    run_out_free(&b);
    run_out_free(&c);
    const char *dirs[2] = {d8, d16};
    for (int i = 0; i < 2; i++) {
        char *p = sd_strfmt("%s/model.safetensors", dirs[i]), *q = sd_strfmt("%s/config.json", dirs[i]);
        remove(p);
        remove(q);
        rmdir(dirs[i]);
        free(p);
        free(q);
    }
    rmdir(tmpl);
    free(d8);
    free(d16);
    free(src_dir);
    free(cfg_text);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST_MAIN(T(gpu_logits_match_the_cpu_on_every_golden_fixture),
          T(fp8_weights_on_the_gpu_match_the_cpu),
          T(a_captured_model_forward_replays_the_eager_logits),
          T(greedy_generation_on_the_gpu_equals_the_cpu_on_the_bundled_model),
          T(greedy_speculation_on_the_gpu_equals_plain_decode_on_the_bundled_model),
          T(steps_with_prompt_rows_replay_graphs_with_the_eager_tokens),
          T(logprobs_on_the_gpu_change_no_token),
          T(a_cached_prefix_on_the_gpu_changes_no_token),
          T(prompt_logprobs_on_the_gpu_change_no_token))

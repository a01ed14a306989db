/* specd-bench-accept: the acceptance-rate benchmark (in-process, no HTTP).
 *
 * For each proposer, draft length k and temperature it runs a prompt set
 * through the engine and reports the mean accepted length (tokens emitted per
 * verify step, bonus included, as SGLang and TensorRT-LLM report it), the
 * acceptance by draft position, draft and verify time per step, and tokens/s,
 * beside a plain-decode run of the same prompts. A short table goes to stdout
 * last; --out FILE gets the full JSON (commit, machine, command, numbers).
 *
 * Prompt sets: JSONL with one prompt per line, in the shapes of public sets
 * (MT-Bench {"turns": [...]}, GSM8K {"question"}, HumanEval {"prompt"}, or
 * {"text"}); --chat renders each through the model's chat template. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "core/config.h"
#include "core/log.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "engine/engine.h"

typedef struct job {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *left;
    sd_req_stats st;
    int n_out;
    sd_finish why;
} job;

static void on_output(void *u, const char *t, size_t l, const int32_t *ids, int n)
{
    (void)t;
    (void)l;
    (void)ids;
    job *j = u;
    pthread_mutex_lock(j->mu);
    j->n_out += n;
    pthread_mutex_unlock(j->mu);
}

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    (void)msg;
    job *j = u;
    pthread_mutex_lock(j->mu);
    j->why = why;
    j->st = *st;
    (*j->left)--;
    pthread_cond_broadcast(j->cv);
    pthread_mutex_unlock(j->mu);
}

typedef struct args {
    const char *model, *prompts, *out, *eagle3, *draft, *commit, *machine, *device;
    char proposers[256], ks[128], temps[128];
    int n_prompts, max_tokens, batch, chat, threads, max_prompt_tokens;
    int graph_bs; /* --cuda-graph-max-bs; -1: the engine's default */
} args;

static void usage(void)
{
    fprintf(stderr,
            "usage: specd-bench-accept [--model DIR] [--prompts FILE.jsonl] [--n-prompts N]\n"
            "  [--proposers none,mtp,eagle3,draft,ngram] [--ks 1,2,3,4,5,6,auto] [--temperatures 0,0.7]\n"
            "  [--eagle3 DIR] [--draft DIR] [--max-tokens N] [--batch N] [--chat] [--threads N]\n"
            "  [--max-prompt-tokens N] [--device auto|cpu|cuda] [--out FILE.json] [--commit SHA]\n"
            "  [--machine TEXT] [--cuda-graph-max-bs N (0: no CUDA graphs)]\n");
}

static int parse_args(args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    snprintf(a->proposers, sizeof a->proposers, "mtp,eagle3,draft,ngram");
    snprintf(a->ks, sizeof a->ks, "1,2,3,4,5,6,auto");
    snprintf(a->temps, sizeof a->temps, "0,0.7");
    a->n_prompts = 32;
    a->max_tokens = 64;
    a->batch = 1;
    a->max_prompt_tokens = 512;
    a->graph_bs = -1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define STR SD_BENCH_ARG_STR
#define BUF SD_BENCH_ARG_BUF
#define INT(name, field) SD_BENCH_ARG_INT("specd-bench-accept", name, field, 0, 1000000)
        STR("--model", a->model)
        STR("--prompts", a->prompts)
        STR("--out", a->out)
        STR("--eagle3", a->eagle3)
        STR("--draft", a->draft)
        STR("--commit", a->commit)
        STR("--machine", a->machine)
        STR("--device", a->device)
        BUF("--proposers", a->proposers)
        BUF("--ks", a->ks)
        BUF("--temperatures", a->temps)
        INT("--n-prompts", a->n_prompts)
        INT("--max-tokens", a->max_tokens)
        INT("--batch", a->batch)
        INT("--threads", a->threads)
        INT("--max-prompt-tokens", a->max_prompt_tokens)
        INT("--cuda-graph-max-bs", a->graph_bs)
        if (!strcmp(k, "--chat")) {
            a->chat = 1;
            continue;
        }
        fprintf(stderr, "specd-bench-accept: unknown option %s\n", k);
        return -1;
    }
#undef STR
#undef BUF
#undef INT
    if (a->batch < 1 || a->n_prompts < 1 || a->max_tokens < 1)
        return -1;
    return 0;
}

typedef sd_bench_prompt prompt;

static int load_prompts(const args *a, const char *model_dir, prompt **out, int *n_out)
{
    sd_err err = {0};
    sd_tokenizer *tok = NULL;
    sd_chat_template *ct = NULL;
    char path[1100];
    const char *file = a->prompts;
    if (!file) {
        snprintf(path, sizeof path, "%s/heldout_prompts.jsonl", model_dir);
        file = path;
    }
    if (sd_tok_load(&tok, model_dir, &err)) {
        fprintf(stderr, "specd-bench-accept: %s\n", err.msg);
        return -1;
    }
    if (a->chat && sd_chat_template_load(&ct, model_dir, "auto", &err)) {
        fprintf(stderr, "specd-bench-accept: %s\n", err.msg);
        sd_tok_free(tok);
        return -1;
    }
    prompt *ps = calloc((size_t)a->n_prompts, sizeof *ps);
    int n = 0;
    int rc = sd_bench_load_prompts(file, tok, ct, a->n_prompts, a->max_prompt_tokens, ps, &n, &err);
    if (rc)
        fprintf(stderr, "specd-bench-accept: %s\n", err.msg);
    sd_tok_free(tok);
    sd_chat_template_free(ct);
    *out = ps;
    *n_out = n;
    return !rc && n > 0 ? 0 : -1;
}

typedef struct result {
    char proposer[16];
    int k; /* -1 auto */
    double temperature;
    double wall_s, tok_s, mean_len, draft_ms, verify_ms;
    uint64_t steps, drafted, accepted, emitted, tokens;
    double acc_at[16];
    int n_pos;
} result;

static int run_one(const args *a, const prompt *ps, int n, const char *proposer, int k, double temp,
                   result *res)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return -1;
    char buf[32];
    if (a->model)
        sd_opts_set(&o, SD_CMD_BENCH, "model", a->model, &err);
    sd_opts_set(&o, SD_CMD_BENCH, "spec", proposer, &err);
    snprintf(buf, sizeof buf, "%d", k);
    sd_opts_set(&o, SD_CMD_BENCH, "spec-k", k < 0 ? "auto" : buf, &err);
    if (!strcmp(proposer, "eagle3") && a->eagle3)
        sd_opts_set(&o, SD_CMD_BENCH, "draft-model", a->eagle3, &err);
    if (!strcmp(proposer, "draft") && a->draft)
        sd_opts_set(&o, SD_CMD_BENCH, "draft-model", a->draft, &err);
    if (a->device)
        sd_opts_set(&o, SD_CMD_BENCH, "device", a->device, &err);
    snprintf(buf, sizeof buf, "%d", a->threads);
    sd_opts_set(&o, SD_CMD_BENCH, "threads", buf, &err);
    sd_opts_set(&o, SD_CMD_BENCH, "log-level", "warn", &err);
    if (a->graph_bs >= 0) {
        snprintf(buf, sizeof buf, "%d", a->graph_bs);
        sd_opts_set(&o, SD_CMD_BENCH, "cuda-graph-max-bs", buf, &err);
    }
    sd_engine *e = NULL;
    int rc = sd_engine_create(&e, &o, &err);
    sd_opts_free(&o);
    if (rc) {
        fprintf(stderr, "specd-bench-accept: %s: %s\n", proposer, err.msg);
        return rc;
    }
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int left = 0;
    job *jobs = calloc((size_t)n, sizeof *jobs);
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    uint64_t t0 = sd_now_ns();
    /* at most a->batch requests in flight: per-user speed at batch 1 */
    int next = 0;
    pthread_mutex_lock(&mu);
    while (next < n || left > 0) {
        while (next < n && left < a->batch) {
            jobs[next] = (job){.mu = &mu, .cv = &cv, .left = &left};
            sd_gen_params gp = {.max_tokens = a->max_tokens, .temperature = temp, .top_p = 1,
                                .seed = (uint64_t)next + 1, .has_seed = 1};
            left++;
            pthread_mutex_unlock(&mu);
            if (sd_engine_submit(e, ps[next].ids, ps[next].n, &gp, &ev, &jobs[next], NULL, &err)) {
                fprintf(stderr, "specd-bench-accept: prompt %d: %s\n", next, err.msg);
                pthread_mutex_lock(&mu);
                left--;
            } else {
                pthread_mutex_lock(&mu);
            }
            next++;
        }
        if (left > 0)
            pthread_cond_wait(&cv, &mu);
    }
    pthread_mutex_unlock(&mu);
    double wall = (double)(sd_now_ns() - t0) * 1e-9;
    sd_engine_destroy(e);
    memset(res, 0, sizeof *res);
    snprintf(res->proposer, sizeof res->proposer, "%s", proposer);
    res->k = k;
    res->temperature = temp;
    res->wall_s = wall;
    uint64_t prop_at[16] = {0}, acc_at[16] = {0};
    double draft_s = 0, verify_s = 0;
    for (int i = 0; i < n; i++) {
        const sd_spec_stats *s = &jobs[i].st.spec;
        res->steps += s->steps;
        res->drafted += s->drafted;
        res->accepted += s->accepted;
        res->emitted += s->emitted;
        res->tokens += (uint64_t)jobs[i].st.completion_tokens;
        draft_s += s->draft_s;
        verify_s += s->verify_s;
        for (int p = 0; p < 16; p++) {
            prop_at[p] += s->proposed_at[p];
            acc_at[p] += s->accepted_at[p];
        }
    }
    res->tok_s = wall > 0 ? (double)res->tokens / wall : 0;
    res->mean_len = res->steps ? (double)res->emitted / (double)res->steps : 1.0;
    /* per step of each request (a step of a batch counts for each request in it) */
    uint64_t steps_all = res->tokens; /* plain: one step per token */
    if (res->steps)
        steps_all = res->steps;
    res->draft_ms = steps_all ? 1e3 * draft_s / (double)steps_all : 0;
    res->verify_ms = steps_all ? 1e3 * verify_s / (double)steps_all : 0;
    for (int p = 0; p < 16; p++)
        if (prop_at[p]) {
            res->acc_at[p] = (double)acc_at[p] / (double)prop_at[p];
            res->n_pos = p + 1;
        }
    free(jobs);
    return 0;
}

/* tokens/s of the plain run at the same temperature */
static double plain_tok_s(const result *rs, int nr, double temperature)
{
    for (int j = 0; j < nr; j++)
        if (!strcmp(rs[j].proposer, "none") && rs[j].temperature == temperature)
            return rs[j].tok_s;
    return 0;
}

int main(int argc, char **argv)
{
    args a;
    if (parse_args(&a, argc, argv)) {
        usage();
        return 2;
    }
    sd_log_set_level(SD_LOG_WARN);
    const char *model_dir = a.model ? a.model : sd_bundled_model_dir();
    prompt *ps = NULL;
    int n = 0;
    if (load_prompts(&a, model_dir, &ps, &n))
        return 1;
    fprintf(stderr, "specd-bench-accept: %d prompts from %s\n", n,
            a.prompts ? a.prompts : "the model's heldout_prompts.jsonl");
    result *rs = calloc(512, sizeof *rs);
    int nr = 0;
    char temps[128];
    snprintf(temps, sizeof temps, "%s", a.temps);
    for (char *ts = strtok(temps, ","); ts && nr < 500; ts = strtok(NULL, ",")) {
        double temp = atof(ts);
        if (run_one(&a, ps, n, "none", 0, temp, &rs[nr]) == 0)
            nr++;
        char props[256];
        snprintf(props, sizeof props, "%s", a.proposers);
        char *sp1 = NULL;
        for (char *p = strtok_r(props, ",", &sp1); p; p = strtok_r(NULL, ",", &sp1)) {
            if (!strcmp(p, "none"))
                continue;
            char ks[128];
            snprintf(ks, sizeof ks, "%s", a.ks);
            char *sp2 = NULL;
            for (char *kk = strtok_r(ks, ",", &sp2); kk && nr < 500; kk = strtok_r(NULL, ",", &sp2)) {
                int k = !strcmp(kk, "auto") ? -1 : atoi(kk);
                fprintf(stderr, "  %s k=%s T=%g ...\n", p, kk, temp);
                if (run_one(&a, ps, n, p, k, temp, &rs[nr]) == 0)
                    nr++;
            }
        }
    }
    /* JSON */
    json_t *root = json_object();
    sd_bench_json_head(root, "accept", a.commit, a.machine, a.device, argc, argv);
    json_object_set_new(root, "host_cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    /* the bundled model by its place in the source tree, not this machine's path */
    json_object_set_new(root, "model", json_string(a.model ? a.model : "models/specd-tiny"));
    json_object_set_new(root, "prompts", json_string(a.prompts ? a.prompts : "heldout_prompts.jsonl"));
    json_object_set_new(root, "n_prompts", json_integer(n));
    json_object_set_new(root, "max_tokens", json_integer(a.max_tokens));
    json_object_set_new(root, "batch", json_integer(a.batch));
    json_t *arr = json_array();
    for (int i = 0; i < nr; i++) {
        result *r = &rs[i];
        double base = plain_tok_s(rs, nr, r->temperature);
        json_t *o = json_object();
        json_object_set_new(o, "proposer", json_string(r->proposer));
        json_object_set_new(o, "k", r->k < 0 ? json_string("auto") : json_integer(r->k));
        json_object_set_new(o, "temperature", json_real(r->temperature));
        json_object_set_new(o, "mean_accepted_length", json_real(r->mean_len));
        json_t *pa = json_array();
        for (int p = 0; p < r->n_pos; p++)
            json_array_append_new(pa, json_real(r->acc_at[p]));
        json_object_set_new(o, "acceptance_by_position", pa);
        json_object_set_new(o, "verify_steps", json_integer((json_int_t)r->steps));
        json_object_set_new(o, "drafted", json_integer((json_int_t)r->drafted));
        json_object_set_new(o, "accepted", json_integer((json_int_t)r->accepted));
        json_object_set_new(o, "completion_tokens", json_integer((json_int_t)r->tokens));
        json_object_set_new(o, "draft_ms_per_step", json_real(r->draft_ms));
        json_object_set_new(o, "verify_ms_per_step", json_real(r->verify_ms));
        json_object_set_new(o, "tokens_per_s", json_real(r->tok_s));
        json_object_set_new(o, "speedup_vs_plain", json_real(base > 0 ? r->tok_s / base : 0));
        json_object_set_new(o, "wall_s", json_real(r->wall_s));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "results", arr);
    if (a.out && json_dump_file(root, a.out, JSON_INDENT(2)) != 0)
        fprintf(stderr, "specd-bench-accept: cannot write %s\n", a.out);
    /* table last */
    printf("%-8s %5s %5s %9s %10s %9s %9s %8s  %s\n", "proposer", "k", "T", "mean_len", "tok/s",
           "speedup", "draft_ms", "verif_ms", "acceptance by position");
    for (int i = 0; i < nr; i++) {
        result *r = &rs[i];
        double base = plain_tok_s(rs, nr, r->temperature);
        char kb[8];
        snprintf(kb, sizeof kb, r->k < 0 ? "auto" : "%d", r->k);
        printf("%-8s %5s %5.2f %9.3f %10.1f %9.3f %9.3f %8.3f ", r->proposer, kb, r->temperature,
               r->mean_len, r->tok_s, base > 0 ? r->tok_s / base : 0, r->draft_ms, r->verify_ms);
        for (int p = 0; p < r->n_pos; p++)
            printf(" %.2f", r->acc_at[p]);
        printf("\n");
    }
    json_decref(root);
    for (int i = 0; i < n; i++)
        free(ps[i].ids);
    free(ps);
    free(rs);
    return 0;
}

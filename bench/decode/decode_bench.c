/* specd-bench-decode: decode speed at fixed batch sizes, against the floor
 * that reading the weights at the copy bandwidth sets (in-process, through
 * the public engine API, no HTTP).
 *
 * For each batch size B it runs B requests at once (ignore_eos, max_tokens
 * N, fixed prompts), after a short warm-up round of the same shape, and
 * measures:
 *   decode tokens/s  the tokens all B requests emitted inside the window
 *                    from the moment the LAST request got its second token
 *                    (every prefill is done, and the proposer's pass over
 *                    the prompts that follows it) to the last output of
 *                    the FIRST request to finish (the batch is still full),
 *                    divided by the window's length: steady-state batch-B
 *                    decode, with no prefill and no tail. At B = 1 this is
 *                    (N - 2) / (t_last_token - t_second_token).
 *   second token     mean over requests of the time from the first token
 *                    to the second (second_token_s): one decode step, and
 *                    with speculation the proposer's catch-up over the
 *                    prompt, which the window leaves out.
 *   per-request      mean over requests of (tokens - first) / (last - first
 *                    token time): what one user sees.
 *   step time        the window's length over the steps in it (each step
 *                    gives every running request one output call).
 *   draft and verify time per engine step, mean accepted length and
 *                    acceptance by position: from the engine's statistics
 *                    taken at the window's two ends, inside the engine's
 *                    callbacks (the output that opens the window, the
 *                    finish of the first request), so they cover the same
 *                    steps as the window.
 * Floor: floor.h says which bytes a plain decode step of B tokens reads;
 * floor tokens/s = B * copy bandwidth / those bytes, and the fraction is the
 * measured decode tokens/s over it (a speculative run can pass 1). The copy
 * bandwidth (--copy-bw-gbs, or --measure-copy-bw for host memory) counts the
 * bytes read plus the bytes written by a large copy, per second.
 *
 * Tensor parallel runs (--opt tp=N) add, from the same two snapshots, the
 * collectives per engine step (all-reduces, of which residual add + RMSNorm
 * steps, all-gathers, by path on GPUs) and, on GPUs, an ESTIMATE of the
 * all-reduce time per step: the sum over its calls of the time the engine's
 * start-up autotune measured for that message size and path, and its share
 * of the measured step time. An estimate from start-up timings (each call
 * timed back to back, alone), not a measurement inside the steps.
 *
 * --synthetic-accept passes the engine's benchmark-only acceptance mode
 * (drafts accepted at random with the given per-position probabilities):
 * with random weights it is the only way to see speculation's speedup at
 * real sizes; the output is then not the model's.
 *
 * A short table goes to stdout last; --out FILE gets the JSON (commit,
 * machine, command, engine options, every figure). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "core/config.h"
#include "core/hfconfig.h"
#include "core/log.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "engine/engine.h"
#include "floor.h"
#include "verify/synthetic.h"

#define MAX_BATCHES 16
#define MAX_OPTS 32

typedef struct args {
    const char *model, *spec, *draft, *prompts, *synth, *graphs, *device, *out, *commit, *machine,
        *label;
    int batches[MAX_BATCHES], n_batches;
    int k, max_tokens, prompt_len, warmup, repeat, kv_bytes, measure_bw;
    double temperature, copy_bw_gbs;
    uint64_t seed;
    char *opt_key[MAX_OPTS], *opt_val[MAX_OPTS];
    int n_opts;
} args;

static void usage(void)
{
    fprintf(stderr,
            "usage: specd-bench-decode [--model DIR] [--batch 1,32] [--max-tokens N] [--prompt-len N]\n"
            "  [--prompts FILE.jsonl] [--spec none|mtp|eagle3|draft|ngram] [--draft-model DIR]\n"
            "  [--k N|auto] [--synthetic-accept P1,P2,...] [--graphs on|off] [--opt KEY=VALUE]...\n"
            "  [--warmup N] [--repeat N] [--temperature T] [--seed N] [--device auto|cpu|cuda]\n"
            "  [--copy-bw-gbs X | --measure-copy-bw] [--kv-bytes N] [--label TEXT]\n"
            "  [--out FILE.json] [--commit SHA] [--machine TEXT]\n");
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int64_t x;
        if (n == max || sd_parse_i64(t, &x) || x < 1 || x > 4096) {
            free(copy);
            return -1;
        }
        out[n++] = (int)x;
    }
    free(copy);
    return n;
}

static int parse_args(args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    a->spec = "none";
    a->graphs = "on";
    a->batches[0] = 1;
    a->n_batches = 1;
    a->k = -2; /* unset: 3 with a proposer */
    a->max_tokens = 128;
    a->prompt_len = 32;
    a->warmup = 8;
    a->repeat = 1;
    a->kv_bytes = 4;
    a->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define STR SD_BENCH_ARG_STR
#define INT(name, field, lo, hi) SD_BENCH_ARG_INT("specd-bench-decode", name, field, lo, hi)
#define NUM(name, field, lo, hi) SD_BENCH_ARG_NUM("specd-bench-decode", name, field, lo, hi)
        STR("--model", a->model)
        STR("--spec", a->spec)
        STR("--draft-model", a->draft)
        STR("--prompts", a->prompts)
        STR("--synthetic-accept", a->synth)
        STR("--graphs", a->graphs)
        STR("--device", a->device)
        STR("--out", a->out)
        STR("--commit", a->commit)
        STR("--machine", a->machine)
        STR("--label", a->label)
        if (!strcmp(k, "--k") && v && !strcmp(v, "auto")) {
            a->k = -1;
            i++;
            continue;
        }
        INT("--k", a->k, 0, 16)
        INT("--max-tokens", a->max_tokens, 2, 1 << 20)
        INT("--prompt-len", a->prompt_len, 1, 1 << 20)
        INT("--warmup", a->warmup, 0, 1 << 20)
        INT("--repeat", a->repeat, 1, 100)
        INT("--kv-bytes", a->kv_bytes, 1, 8)
        NUM("--temperature", a->temperature, 0, 100)
        NUM("--copy-bw-gbs", a->copy_bw_gbs, 0, 1e6)
        if (!strcmp(k, "--seed")) {
            int64_t x;
            if (!v || sd_parse_i64(v, &x) || x < 0)
                return -1;
            a->seed = (uint64_t)x;
            i++;
            continue;
        }
        if (!strcmp(k, "--batch")) {
            if (!v || (a->n_batches = parse_list(v, a->batches, MAX_BATCHES)) <= 0) {
                fprintf(stderr, "specd-bench-decode: --batch: '%s' is not a list of 1..4096\n",
                        v ? v : "");
                return -1;
            }
            i++;
            continue;
        }
        if (!strcmp(k, "--opt")) {
            const char *eq = v ? strchr(v, '=') : NULL;
            if (!eq || eq == v || a->n_opts == MAX_OPTS) {
                fprintf(stderr, "specd-bench-decode: --opt: '%s' is not KEY=VALUE\n", v ? v : "");
                return -1;
            }
            a->opt_key[a->n_opts] = strndup(v, (size_t)(eq - v));
            a->opt_val[a->n_opts++] = strdup(eq + 1);
            i++;
            continue;
        }
        if (!strcmp(k, "--measure-copy-bw")) {
            a->measure_bw = 1;
            continue;
        }
        fprintf(stderr, "specd-bench-decode: unknown option %s\n", k);
        return -1;
    }
#undef STR
#undef INT
#undef NUM
    if (strcmp(a->graphs, "on") && strcmp(a->graphs, "off")) {
        fprintf(stderr, "specd-bench-decode: --graphs: '%s' is not on or off\n", a->graphs);
        return -1;
    }
    if (a->k == -2)
        a->k = strcmp(a->spec, "none") ? 3 : 0;
    return 0;
}

/* ------------------------------------------------------------------ requests */

typedef struct shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_second, n_done; /* requests with two output calls; finished requests */
    /* the engine's statistics at the window's ends, taken in the callbacks
     * (the engine thread, which holds no lock of its own while it calls
     * them): when the last of n_req requests has its second output, and
     * when the first request finishes */
    sd_engine *e;
    int n_req, have0, have1;
    uint64_t t0;
    sd_engine_stats s0, s1;
} shared;

typedef struct track {
    shared *sh;
    uint64_t *t; /* time of each output call */
    int *cum;    /* tokens after each call */
    int n_calls, cap;
    int n;
    int done;
    sd_finish why;
    sd_req_stats st;
    char msg[256];
} track;

static void on_output(void *u, const char *text, size_t len, const int32_t *ids, int n)
{
    (void)text;
    (void)len;
    (void)ids;
    track *tr = u;
    if (n <= 0)
        return;
    uint64_t now = sd_now_ns();
    pthread_mutex_lock(&tr->sh->mu);
    if (tr->n_calls < tr->cap) {
        tr->n += n;
        tr->t[tr->n_calls] = now;
        tr->cum[tr->n_calls++] = tr->n;
        if (tr->n_calls == 2) {
            shared *sh = tr->sh;
            if (++sh->n_second == sh->n_req && !sh->have0 && sh->e) {
                sd_engine_get_stats(sh->e, &sh->s0);
                sh->t0 = now;
                sh->have0 = 1;
            }
            pthread_cond_broadcast(&sh->cv);
        }
    }
    pthread_mutex_unlock(&tr->sh->mu);
}

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    track *tr = u;
    pthread_mutex_lock(&tr->sh->mu);
    tr->why = why;
    tr->st = *st;
    snprintf(tr->msg, sizeof tr->msg, "%s", msg ? msg : "");
    tr->done = 1;
    if (tr->sh->n_done++ == 0 && tr->sh->have0) {
        sd_engine_get_stats(tr->sh->e, &tr->sh->s1);
        tr->sh->have1 = 1;
    }
    pthread_cond_broadcast(&tr->sh->cv);
    pthread_mutex_unlock(&tr->sh->mu);
}

typedef sd_bench_prompt prompt;

/* Fixed prompts: len random ordinary ids per request (xorshift of (seed, i)). */
static void synthetic_prompts(prompt *ps, int n, int len, int vocab, uint64_t seed)
{
    int lo = vocab > 1000 ? 256 : vocab / 8; /* away from the special tokens at the start */
    for (int i = 0; i < n; i++) {
        ps[i].ids = malloc((size_t)len * sizeof(int32_t));
        ps[i].n = len;
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 7919u + 1;
        for (int j = 0; j < len; j++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ps[i].ids[j] = (int32_t)(lo + (int)(s % (uint64_t)(vocab - lo)));
        }
    }
}

/* Prompts from a JSONL file, through the model's tokenizer; each keeps its
 * last max_len tokens; records are reused in turn when there are fewer than n. */
static int file_prompts(prompt *ps, int n, int max_len, const char *file, const sd_tokenizer *tok)
{
    if (!tok) {
        fprintf(stderr, "specd-bench-decode: --prompts needs the model's tokenizer.json\n");
        return -1;
    }
    int got = 0;
    sd_err err = {0};
    if (sd_bench_load_prompts(file, tok, NULL, n, max_len, ps, &got, &err)) {
        fprintf(stderr, "specd-bench-decode: %s\n", err.msg);
        return -1;
    }
    if (!got) {
        fprintf(stderr, "specd-bench-decode: no prompt in %s\n", file);
        return -1;
    }
    for (int i = got; i < n; i++) {
        ps[i].n = ps[i % got].n;
        ps[i].ids = malloc((size_t)ps[i].n * sizeof(int32_t));
        memcpy(ps[i].ids, ps[i % got].ids, (size_t)ps[i].n * sizeof(int32_t));
    }
    return 0;
}

/* ------------------------------------------------------------------ one measurement */

typedef struct result {
    int batch, rep;
    double decode_tok_s, per_req_tok_s, window_s, ttft_s, wall_s, second_token_s;
    long long window_tokens;
    double step_ms, draft_ms, verify_ms, host_ms;
    long long engine_steps, window_steps;
    double mean_len;
    double acc_at[16];
    int n_pos;
    /* speculation: the window's engine steps by the k they drafted (16: 16
     * or more), and the running requests that had stopped tracking the
     * proposer at the window's end (adaptive k: drafting did not pay) */
    long long k_steps[17];
    int n_k, spec_off_running;
    long long eager_passes, graph_cache_full; /* proposer passes in the window */
    long long plain_steps; /* target steps without the proposer's hidden states */
    long long ahead_steps; /* steps queued before the step before them was read */
    long long draft_ahead_steps; /* verify steps queued before their drafts were read */
    long long draft_phases, draft_learnt; /* drafting phases; those adaptive k learnt from */
    long long draft_oneoff; /* drafting phases left out for a shape's first proposer pass */
    double mean_context; /* tokens of context per sequence, mean over the window */
    /* tensor parallel: collectives per engine step between the snapshots */
    int tp;
    double ar_calls, ar_residual, ar_gather, ar_floats_per_call, ar_path[4];
    double ar_est_ms;       /* estimated all-reduce time per step; < 0: none (CPU ranks) */
    double ar_est_covered;  /* share of the calls the estimate covers */
    double ar_unrecorded;   /* graph replays per step whose calls are not counted */
} result;

/* Runs B requests of max_tokens at once and waits for them; fills r when
 * measure is set. Returns 0, or -1 when a request failed. */
static int run_batch(sd_engine *e, const args *a, const prompt *ps, int B, int max_tokens,
                     int measure, result *r)
{
    shared sh = {.n_second = 0, .n_done = 0, .e = e, .n_req = B};
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    track *tr = calloc((size_t)B, sizeof *tr);
    for (int i = 0; i < B; i++) {
        tr[i].sh = &sh;
        tr[i].cap = max_tokens + 1;
        tr[i].t = calloc((size_t)tr[i].cap, sizeof(uint64_t));
        tr[i].cum = calloc((size_t)tr[i].cap, sizeof(int));
    }
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    sd_err err = {0};
    int rc = 0, submitted = 0;
    uint64_t t0 = sd_now_ns();
    for (int i = 0; i < B; i++) {
        sd_gen_params gp = {.max_tokens = max_tokens, .temperature = a->temperature, .top_p = 1,
                            .seed = a->seed + (uint64_t)i, .has_seed = 1, .ignore_eos = 1};
        if (sd_engine_submit(e, ps[i].ids, ps[i].n, &gp, &ev, &tr[i], NULL, &err)) {
            fprintf(stderr, "specd-bench-decode: request %d: %s\n", i, err.msg);
            rc = -1;
            break;
        }
        submitted++;
    }
    /* the statistics at the window's ends: taken in the callbacks (shared);
     * here, when a request finished before every one had two outputs (no
     * window worth the name), once they all have and after the first
     * finished */
    sd_engine_stats s0, s1;
    pthread_mutex_lock(&sh.mu);
    while (sh.n_second + sh.n_done < submitted)
        pthread_cond_wait(&sh.cv, &sh.mu);
    pthread_mutex_unlock(&sh.mu);
    sd_engine_get_stats(e, &s0);
    pthread_mutex_lock(&sh.mu);
    while (sh.n_done == 0 && submitted > 0)
        pthread_cond_wait(&sh.cv, &sh.mu);
    pthread_mutex_unlock(&sh.mu);
    sd_engine_get_stats(e, &s1);
    pthread_mutex_lock(&sh.mu);
    while (sh.n_done < submitted)
        pthread_cond_wait(&sh.cv, &sh.mu);
    int aligned = sh.have0 && sh.have1 && submitted == B;
    if (aligned) {
        s0 = sh.s0;
        s1 = sh.s1;
    }
    pthread_mutex_unlock(&sh.mu);
    double wall = (double)(sd_now_ns() - t0) * 1e-9;
    for (int i = 0; i < submitted; i++)
        if (tr[i].why != SD_FINISH_LENGTH || tr[i].n != max_tokens) {
            fprintf(stderr, "specd-bench-decode: request %d ended (%d) after %d of %d tokens%s%s\n", i,
                    (int)tr[i].why, tr[i].n, max_tokens, tr[i].msg[0] ? ": " : "", tr[i].msg);
            rc = -1;
        }
    if (!rc && measure) {
        memset(r, 0, sizeof *r);
        r->batch = B;
        r->wall_s = wall;
        uint64_t t_start = 0, t_end = UINT64_MAX;
        int first_done = 0, n_second = 0;
        double per = 0, ttft = 0, second = 0;
        for (int i = 0; i < B; i++) {
            const track *x = &tr[i];
            if (x->t[0] > t_start)
                t_start = x->t[0];
            if (x->n_calls >= 2) {
                second += (double)(x->t[1] - x->t[0]) * 1e-9;
                n_second++;
            }
            if (x->t[x->n_calls - 1] < t_end) {
                t_end = x->t[x->n_calls - 1];
                first_done = i;
            }
            double span = (double)(x->t[x->n_calls - 1] - x->t[0]) * 1e-9;
            per += span > 0 ? (double)(x->n - x->cum[0]) / span : 0;
            ttft += x->st.ttft_s;
        }
        if (aligned)
            t_start = sh.t0; /* the last second output (the first snapshot's moment) */
        r->second_token_s = n_second ? second / n_second : 0;
        long long tok = 0;
        double ctx = 0;
        int nctx = 0;
        for (int i = 0; i < B; i++) {
            const track *x = &tr[i];
            for (int j = 1; j < x->n_calls; j++)
                if (x->t[j] > t_start && x->t[j] <= t_end) {
                    tok += x->cum[j] - x->cum[j - 1];
                    ctx += ps[i].n + x->cum[j];
                    nctx++;
                }
        }
        r->window_s = t_end > t_start ? (double)(t_end - t_start) * 1e-9 : 0;
        /* every decode or verify step gives each running request one output
         * call: the first finisher's calls inside the window count the steps */
        for (int j = 1; j < tr[first_done].n_calls; j++)
            r->window_steps += tr[first_done].t[j] > t_start && tr[first_done].t[j] <= t_end;
        if (r->window_steps > 0)
            r->step_ms = 1e3 * r->window_s / (double)r->window_steps;
        r->window_tokens = tok;
        r->decode_tok_s = r->window_s > 0 ? (double)tok / r->window_s : 0;
        r->per_req_tok_s = per / B;
        r->ttft_s = ttft / B;
        r->mean_context = nctx ? ctx / nctx : 0;
        long long steps = (long long)(s1.steps - s0.steps);
        r->engine_steps = steps;
        if (steps > 0) {
            r->draft_ms = 1e3 * (s1.spec.draft_s - s0.spec.draft_s) / (double)steps;
            r->verify_ms = 1e3 * (s1.spec.verify_s - s0.spec.verify_s) / (double)steps;
            r->host_ms = 1e3 * (s1.spec.host_s - s0.spec.host_s) / (double)steps;
        }
        r->tp = s1.tp;
        if (steps > 0 && s1.tp > 1) {
            double n = (double)steps;
            uint64_t calls = s1.allreduce_calls - s0.allreduce_calls;
            r->ar_calls = (double)calls / n;
            r->ar_residual = (double)(s1.residual_calls - s0.residual_calls) / n;
            r->ar_gather = (double)(s1.allgather_calls - s0.allgather_calls) / n;
            r->ar_floats_per_call =
                calls ? (double)(s1.allreduce_floats - s0.allreduce_floats) / (double)calls : 0;
            for (int p = 0; p < 4; p++)
                r->ar_path[p] =
                    (double)(s1.allreduce_path_calls[p] - s0.allreduce_path_calls[p]) / n;
            uint64_t est_calls = s1.allreduce_est_calls - s0.allreduce_est_calls;
            r->ar_est_ms = est_calls ? 1e3 * (s1.allreduce_est_s - s0.allreduce_est_s) / n : -1;
            r->ar_est_covered = calls ? (double)est_calls / (double)calls : 0;
            r->ar_unrecorded =
                (double)(s1.allreduce_unrecorded_replays - s0.allreduce_unrecorded_replays) / n;
        }
        for (int k = 0; k < 17; k++) {
            r->k_steps[k] = (long long)(s1.spec_k_steps[k] - s0.spec_k_steps[k]);
            if (r->k_steps[k])
                r->n_k = k + 1;
        }
        r->spec_off_running = s1.spec_off_running;
        r->eager_passes = (long long)(s1.spec_eager_passes - s0.spec_eager_passes);
        r->graph_cache_full = (long long)(s1.spec_graph_cache_full - s0.spec_graph_cache_full);
        r->plain_steps = (long long)(s1.spec_plain_steps - s0.spec_plain_steps);
        r->ahead_steps = (long long)(s1.ahead_steps - s0.ahead_steps);
        r->draft_ahead_steps = (long long)(s1.draft_ahead_steps - s0.draft_ahead_steps);
        r->draft_phases = (long long)(s1.spec_draft_phases - s0.spec_draft_phases);
        r->draft_learnt = (long long)(s1.spec_draft_observed - s0.spec_draft_observed);
        r->draft_oneoff = (long long)(s1.spec_draft_oneoff - s0.spec_draft_oneoff);
        uint64_t vs = s1.spec.steps - s0.spec.steps;
        r->mean_len = vs ? (double)(s1.spec.emitted - s0.spec.emitted) / (double)vs : 1.0;
        for (int p = 0; p < 16; p++) {
            uint64_t pr = s1.spec.proposed_at[p] - s0.spec.proposed_at[p];
            if (pr) {
                r->acc_at[p] = (double)(s1.spec.accepted_at[p] - s0.spec.accepted_at[p]) / (double)pr;
                r->n_pos = p + 1;
            }
        }
        if (r->window_s <= 0 || tok <= 0) {
            fprintf(stderr, "specd-bench-decode: batch %d: the first request finished before the "
                            "last one started decoding (raise --max-tokens)\n", B);
            rc = -1;
        }
    }
    for (int i = 0; i < B; i++) {
        free(tr[i].t);
        free(tr[i].cum);
    }
    free(tr);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    return rc;
}

/* Host memory copy bandwidth (read + write bytes per second, GB/s): the best
 * of 5 memcpy of 512 MiB after one warm-up. */
static double host_copy_bw_gbs(void)
{
    size_t n = (size_t)512 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 6; i++) {
        uint64_t t0 = sd_now_ns();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        double s = (double)(sd_now_ns() - t0) * 1e-9;
        if (i && s < best)
            best = s;
    }
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return 2.0 * (double)n / best / 1e9;
}

static const char *const ar_paths[4] = {"nccl", "oneshot", "twoshot", "fused"}; /* engine.h's */

/* the collectives of a tensor-parallel result, per engine step */
static json_t *allreduce_json(const result *r)
{
    json_t *o = json_object(), *by = json_object();
    json_object_set_new(o, "tp", json_integer(r->tp));
    json_object_set_new(o, "calls_per_step", json_real(r->ar_calls));
    json_object_set_new(o, "residual_calls_per_step", json_real(r->ar_residual));
    json_object_set_new(o, "allgather_calls_per_step", json_real(r->ar_gather));
    json_object_set_new(o, "floats_per_call", json_real(r->ar_floats_per_call));
    for (int p = 0; p < 4; p++)
        json_object_set_new(by, ar_paths[p], json_real(r->ar_path[p]));
    json_object_set_new(o, "calls_per_step_by_path", by);
    int est = r->ar_est_ms >= 0;
    json_object_set_new(o, "est_ms_per_step", est ? json_real(r->ar_est_ms) : json_null());
    json_object_set_new(o, "est_share_of_step",
                        est && r->step_ms > 0 ? json_real(r->ar_est_ms / r->step_ms) : json_null());
    json_object_set_new(o, "est_calls_covered", json_real(r->ar_est_covered));
    json_object_set_new(o, "unrecorded_graph_replays_per_step", json_real(r->ar_unrecorded));
    json_object_set_new(
        o, "note",
        json_string("counts: rank 0's collectives between the two statistics snapshots over the "
                    "engine steps between them. est_ms_per_step: ESTIMATED from the start-up "
                    "autotune's timings (per call, the time measured at start for that message "
                    "size and path, interpolated between the timed sizes; the fused residual "
                    "kernel at one-shot's time), not measured in the steps; its share is over "
                    "the measured step_ms. null on CPU ranks (no timings). Graph replays whose "
                    "capture was not recorded: unrecorded_graph_replays_per_step (0 expected)"));
    return o;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    args a;
    if (parse_args(&a, argc, argv)) {
        usage();
        return 2;
    }
    sd_log_set_level(SD_LOG_WARN);
    const char *dir = a.model ? a.model : sd_bundled_model_dir();
    sd_err err = {0};
    sd_model_cfg cfg;
    sd_decode_bytes db;
    if (sd_model_cfg_load(&cfg, dir, &err) || sd_decode_bytes_load(&db, dir, a.kv_bytes, &err)) {
        fprintf(stderr, "specd-bench-decode: %s\n", err.msg);
        return 1;
    }
    sd_synthetic syn;
    if (sd_synthetic_parse(&syn, a.synth, &err)) {
        fprintf(stderr, "specd-bench-decode: %s\n", err.msg);
        return 2;
    }
    double bw = a.copy_bw_gbs;
    const char *bw_src = "given (--copy-bw-gbs)";
    if (a.measure_bw) {
        bw = host_copy_bw_gbs();
        bw_src = "host memcpy of 512 MiB, best of 5";
    }
    int maxb = 1;
    for (int i = 0; i < a.n_batches; i++)
        maxb = a.batches[i] > maxb ? a.batches[i] : maxb;
    /* engine options: the bench's, then --opt overrides */
    sd_opts o;
    if (sd_opts_init(&o, &err))
        return 1;
    char buf[64];
    int ok = 1;
#define SET(key, val) ok &= sd_opts_set(&o, SD_CMD_BENCH, key, val, &err) == 0
    SET("model", dir);
    SET("spec", a.spec);
    /* the repeats send the warm-up's prompts: cached, their prefill would
     * be skipped (--opt prefix-cache=true measures that) */
    SET("prefix-cache", "false");
    snprintf(buf, sizeof buf, "%d", a.k);
    SET("spec-k", a.k < 0 ? "auto" : buf);
    if (a.draft)
        SET("draft-model", a.draft);
    if (a.synth)
        SET("synthetic-accept", a.synth);
    if (a.device)
        SET("device", a.device);
    if (!strcmp(a.graphs, "off"))
        SET("cuda-graph-max-bs", "0");
    snprintf(buf, sizeof buf, "%d", maxb);
    SET("max-batch", buf);
    int ctx = (a.prompt_len + a.max_tokens + 32 + 63) / 64 * 64;
    if (ctx > cfg.max_pos)
        ctx = cfg.max_pos;
    snprintf(buf, sizeof buf, "%d", ctx);
    SET("max-context", buf);
    SET("log-level", "warn");
    for (int i = 0; i < a.n_opts && ok; i++)
        SET(a.opt_key[i], a.opt_val[i]);
#undef SET
    if (!ok) {
        fprintf(stderr, "specd-bench-decode: %s\n", err.msg);
        return 2;
    }
    if (sd_log_parse_level(o.log_level) >= 0) /* --opt log-level=debug: the engine's trace */
        sd_log_set_level(sd_log_parse_level(o.log_level));
    sd_engine *e = NULL;
    uint64_t tl = sd_now_ns();
    if (sd_engine_create(&e, &o, &err)) {
        fprintf(stderr, "specd-bench-decode: %s\n", err.msg);
        sd_opts_free(&o);
        return 1;
    }
    double load_s = (double)(sd_now_ns() - tl) * 1e-9;
    prompt *ps = calloc((size_t)maxb, sizeof *ps);
    if (a.prompts) {
        if (file_prompts(ps, maxb, a.prompt_len, a.prompts, sd_engine_tokenizer(e))) {
            sd_engine_destroy(e);
            return 1;
        }
    } else {
        synthetic_prompts(ps, maxb, a.prompt_len, cfg.vocab_size, a.seed);
    }
    fprintf(stderr, "specd-bench-decode: %s, spec %s k %d%s%s, graphs %s, loaded in %.1f s\n", dir,
            a.spec, a.k, a.synth ? ", synthetic acceptance " : "", a.synth ? a.synth : "", a.graphs,
            load_s);
    result *rs = calloc((size_t)(a.n_batches * a.repeat), sizeof *rs);
    int nr = 0, failed = 0;
    for (int bi = 0; bi < a.n_batches; bi++) {
        int B = a.batches[bi];
        if (a.warmup > 0 && run_batch(e, &a, ps, B, a.warmup < 2 ? 2 : a.warmup, 0, NULL)) {
            failed = 1;
            continue;
        }
        for (int rep = 0; rep < a.repeat; rep++) {
            if (run_batch(e, &a, ps, B, a.max_tokens, 1, &rs[nr])) {
                failed = 1;
                continue;
            }
            rs[nr].rep = rep;
            fprintf(stderr, "  batch %d: %.1f tok/s decode, step %.3f ms\n", B, rs[nr].decode_tok_s,
                    rs[nr].step_ms);
            nr++;
        }
    }
    sd_engine_destroy(e);
    /* JSON */
    json_t *root = json_object();
    sd_bench_json_head(root, "decode", a.commit, a.machine, a.device, argc, argv);
    if (a.label)
        json_object_set_new(root, "label", json_string(a.label));
    json_object_set_new(root, "model", json_string(a.model ? a.model : "models/specd-tiny"));
    json_object_set_new(root, "architecture", json_string(cfg.arch_name));
    json_object_set_new(root, "load_s", json_real(load_s));
    json_object_set_new(root, "spec", json_string(a.spec));
    json_object_set_new(root, "k", a.k < 0 ? json_string("auto") : json_integer(a.k));
    json_object_set_new(root, "draft_model", a.draft ? json_string(a.draft) : json_null());
    json_object_set_new(root, "synthetic_accept", a.synth ? json_string(a.synth) : json_null());
    if (syn.n > 0 && a.k > 0)
        json_object_set_new(root, "synthetic_expected_mean_len",
                            json_real(sd_synthetic_mean_len(&syn, a.k)));
    json_object_set_new(root, "graphs", json_string(a.graphs));
    json_t *eo = json_object();
    for (int i = 0; i < a.n_opts; i++)
        json_object_set_new(eo, a.opt_key[i], json_string(a.opt_val[i]));
    json_object_set_new(root, "engine_opts", eo);
    json_object_set_new(root, "temperature", json_real(a.temperature));
    json_object_set_new(root, "max_tokens", json_integer(a.max_tokens));
    json_object_set_new(root, "prompts", json_string(a.prompts ? a.prompts : "synthetic ids"));
    json_object_set_new(root, "prompt_len", json_integer(a.prompt_len));
    json_t *bj = json_object();
    json_object_set_new(bj, "definition",
                        json_string("a plain decode step of B tokens reads every main-model weight "
                                    "in full except: B rows of the token embedding (all of it when "
                                    "the head is tied), the expected distinct routed experts of B "
                                    "tokens x top_k under uniform routing in each MoE layer, and "
                                    "no MTP layer; shared experts and routers in full. KV cache "
                                    "apart"));
    json_object_set_new(bj, "checkpoint_gb", json_real(db.total / 1e9));
    json_object_set_new(bj, "dense_gb", json_real(db.dense / 1e9));
    json_object_set_new(bj, "embed_row_bytes", json_real(db.embed_row));
    json_object_set_new(bj, "routed_experts_gb", json_real(db.routed / 1e9));
    json_object_set_new(bj, "mtp_gb", json_real(db.mtp / 1e9));
    json_object_set_new(bj, "n_routed_experts", json_integer(db.n_experts));
    json_object_set_new(bj, "top_k", json_integer(db.top_k));
    json_object_set_new(bj, "moe_layers", json_integer(db.n_moe_layers));
    json_object_set_new(bj, "kv_bytes_per_token", json_real(db.kv_per_token));
    json_object_set_new(bj, "kv_element_bytes", json_integer(a.kv_bytes));
    json_object_set_new(root, "bytes", bj);
    json_object_set_new(root, "copy_bw_gbs", bw > 0 ? json_real(bw) : json_null());
    json_object_set_new(root, "copy_bw_source",
                        json_string(bw > 0 ? bw_src : "none (no floor computed)"));
    json_t *arr = json_array();
    for (int i = 0; i < nr; i++) {
        const result *r = &rs[i];
        double sb = sd_decode_step_bytes(&db, r->batch);
        double floor = bw > 0 ? r->batch * bw * 1e9 / sb : 0;
        double kvb = r->batch * r->mean_context * db.kv_per_token;
        double floor_kv = bw > 0 ? r->batch * bw * 1e9 / (sb + kvb) : 0;
        json_t *x = json_object();
        json_object_set_new(x, "batch", json_integer(r->batch));
        json_object_set_new(x, "repeat", json_integer(r->rep));
        json_object_set_new(x, "decode_tokens_per_s", json_real(r->decode_tok_s));
        json_object_set_new(x, "per_request_tokens_per_s", json_real(r->per_req_tok_s));
        json_object_set_new(x, "window_s", json_real(r->window_s));
        json_object_set_new(x, "window_tokens", json_integer(r->window_tokens));
        json_object_set_new(x, "window_steps", json_integer(r->window_steps));
        json_object_set_new(x, "engine_steps", json_integer(r->engine_steps));
        json_object_set_new(x, "ahead_steps", json_integer(r->ahead_steps));
        json_object_set_new(x, "draft_ahead_steps", json_integer(r->draft_ahead_steps));
        json_object_set_new(x, "step_ms", json_real(r->step_ms));
        json_object_set_new(x, "draft_ms_per_step", json_real(r->draft_ms));
        json_object_set_new(x, "verify_ms_per_step", json_real(r->verify_ms));
        json_object_set_new(x, "host_ms_per_step", json_real(r->host_ms));
        json_object_set_new(x, "mean_accepted_length", json_real(r->mean_len));
        json_t *pa = json_array();
        for (int p = 0; p < r->n_pos; p++)
            json_array_append_new(pa, json_real(r->acc_at[p]));
        json_object_set_new(x, "acceptance_by_position", pa);
        if (r->n_k > 0) { /* a speculative engine: steps by draft length */
            json_t *ka = json_array();
            for (int k = 0; k < r->n_k; k++)
                json_array_append_new(ka, json_integer(r->k_steps[k]));
            json_object_set_new(x, "steps_by_k", ka);
            json_object_set_new(x, "requests_not_drafting", json_integer(r->spec_off_running));
            json_object_set_new(x, "proposer_eager_passes", json_integer(r->eager_passes));
            json_object_set_new(x, "proposer_graph_cache_full", json_integer(r->graph_cache_full));
            json_object_set_new(x, "target_plain_steps", json_integer(r->plain_steps));
            json_object_set_new(x, "draft_phases", json_integer(r->draft_phases));
            json_object_set_new(x, "draft_phases_learnt", json_integer(r->draft_learnt));
            json_object_set_new(x, "draft_phases_oneoff", json_integer(r->draft_oneoff));
        }
        json_object_set_new(x, "ttft_s", json_real(r->ttft_s));
        json_object_set_new(x, "second_token_s", json_real(r->second_token_s));
        json_object_set_new(x, "wall_s", json_real(r->wall_s));
        json_object_set_new(x, "mean_context_tokens", json_real(r->mean_context));
        json_object_set_new(x, "expected_routed_experts",
                            json_real(sd_decode_expected_experts(db.n_experts, db.top_k, r->batch)));
        json_object_set_new(x, "step_bytes_gb", json_real(sb / 1e9));
        json_object_set_new(x, "kv_read_gb", json_real(kvb / 1e9));
        json_object_set_new(x, "floor_tokens_per_s", bw > 0 ? json_real(floor) : json_null());
        json_object_set_new(x, "fraction_of_floor",
                            bw > 0 ? json_real(r->decode_tok_s / floor) : json_null());
        json_object_set_new(x, "floor_with_kv_tokens_per_s",
                            bw > 0 ? json_real(floor_kv) : json_null());
        if (r->tp > 1)
            json_object_set_new(x, "allreduce", allreduce_json(r));
        json_array_append_new(arr, x);
    }
    json_object_set_new(root, "results", arr);
    if (a.out && json_dump_file(root, a.out, JSON_INDENT(2)) != 0)
        fprintf(stderr, "specd-bench-decode: cannot write %s\n", a.out);
    /* table last: one row per batch, the median of the repeats */
    printf("%-6s %-7s %4s %-14s %-5s %10s %9s %8s %8s %8s %7s %9s %9s %6s\n", "batch", "spec", "k",
           "synthetic", "graph", "tok/s", "tok/s/req", "step_ms", "draft_ms", "verif_ms", "len",
           "step_GB", "floor", "frac");
    for (int bi = 0; bi < a.n_batches; bi++) {
        double v[100];
        int n = 0;
        const result *last = NULL;
        for (int i = 0; i < nr; i++)
            if (rs[i].batch == a.batches[bi]) {
                v[n++] = rs[i].decode_tok_s;
                last = &rs[i];
            }
        if (!last)
            continue;
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        double med = v[n / 2];
        double sb = sd_decode_step_bytes(&db, last->batch);
        double floor = bw > 0 ? last->batch * bw * 1e9 / sb : 0;
        char kb[8];
        snprintf(kb, sizeof kb, a.k < 0 ? "auto" : "%d", a.k);
        printf("%-6d %-7s %4s %-14s %-5s %10.1f %9.1f %8.3f %8.3f %8.3f %7.3f %9.3f %9.1f %6.3f\n",
               last->batch, a.spec, kb, a.synth ? a.synth : "-", a.graphs, med,
               last->per_req_tok_s, last->step_ms, last->draft_ms, last->verify_ms, last->mean_len,
               sb / 1e9, floor, floor > 0 ? med / floor : 0);
    }
    /* tensor parallel: the collectives per step, the last repeat of each batch */
    for (int bi = 0, head = 0; bi < a.n_batches; bi++) {
        const result *last = NULL;
        for (int i = 0; i < nr; i++)
            if (rs[i].batch == a.batches[bi])
                last = &rs[i];
        if (!last || last->tp < 2)
            continue;
        if (!head++) {
            printf("collectives per engine step at tp %d; est_ms: all-reduce time ESTIMATED from "
                   "the start-up autotune's timings, not measured\n",
                   last->tp);
            printf("%-6s %8s %8s %8s %9s %7s %7s %7s %7s %8s %6s %7s\n", "batch", "ar/step",
                   "resid", "gather", "KB/call", "nccl", "oneshot", "twoshot", "fused", "est_ms",
                   "share", "unrec");
        }
        char est[32] = "-", share[32] = "-";
        if (last->ar_est_ms >= 0) {
            snprintf(est, sizeof est, "%.3f", last->ar_est_ms);
            if (last->step_ms > 0)
                snprintf(share, sizeof share, "%.3f", last->ar_est_ms / last->step_ms);
        }
        printf("%-6d %8.2f %8.2f %8.2f %9.1f %7.2f %7.2f %7.2f %7.2f %8s %6s %7.2f\n",
               last->batch, last->ar_calls, last->ar_residual, last->ar_gather,
               last->ar_floats_per_call * 4 / 1024, last->ar_path[0], last->ar_path[1],
               last->ar_path[2], last->ar_path[3], est, share, last->ar_unrecorded);
    }
    json_decref(root);
    for (int i = 0; i < maxb; i++)
        free(ps[i].ids);
    free(ps);
    free(rs);
    sd_opts_free(&o);
    for (int i = 0; i < a.n_opts; i++) {
        free(a.opt_key[i]);
        free(a.opt_val[i]);
    }
    return failed ? 1 : 0;
}

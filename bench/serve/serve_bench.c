/* specd-bench-serve: load an OpenAI-compatible server and measure it.
 *
 * Sends streaming completions or chat completions at a Poisson rate or at a
 * fixed concurrency (or over a sweep of concurrencies), prints a progress
 * line on stderr while it runs and a short table last, and writes the full
 * record (every request, the summaries, the command line, the time, the
 * machine, and specd's speculative counters from /metrics) to --out. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench/serve/bench.h"
#include "bench_commit.h"
#include "core/util.h"

typedef struct opts {
    const char *url, *model, *prompts, *out, *api_key, *label, *machine;
    sd_bench_endpoint endpoint;
    int random_in, random_out, max_tokens, num_requests, concurrency, ignore_eos,
        json_object;
    double rate, temperature, duration_limit, request_timeout, progress_interval;
    uint64_t seed;
    int *sweep, n_sweep;
    int metrics, with_requests, quiet, warmup, max_prompt_chars, waves, shared_prefix;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: specd-bench-serve [options]\n"
        "\n"
        "Load an OpenAI-compatible server (specd, vLLM, SGLang, ...) with streaming requests\n"
        "and report TTFT, TPOT, ITL, end-to-end latency and throughput, as vLLM's\n"
        "benchmark_serving and SGLang's bench_serving define them.\n"
        "\n"
        "server:\n"
        "  --url URL               http://host:port[/prefix] (default http://127.0.0.1:8000)\n"
        "  --endpoint E            completions | chat (default completions)\n"
        "  --model NAME            model name to send (default: the first of GET /v1/models)\n"
        "  --api-key KEY           send Authorization: Bearer KEY\n"
        "prompts:\n"
        "  --prompts FILE          JSON Lines: MT-Bench \"turns\" (first turn), GSM8K \"question\",\n"
        "                          HumanEval \"prompt\", or {\"prompt\": ...} / {\"text\": ...}\n"
        "  --max-prompt-chars N    leave out prompts longer than N bytes (the bench has no\n"
        "                          tokenizer: about 3-4 bytes a token; default: keep all)\n"
        "  --shared-prefix-words N every prompt after the same N random common words and a blank\n"
        "                          line: a system prompt (a prefix cache's workload; default 0)\n"
        "  --random-input-len N    N random common words per prompt (default 128 without --prompts)\n"
        "  --random-output-len N   max_tokens = N and ignore_eos, so every request makes N tokens\n"
        "  --max-tokens N          max_tokens of each request (default 128)\n"
        "  --ignore-eos            send \"ignore_eos\": true\n"
        "  --json-object           send \"response_format\": {\"type\": \"json_object\"} (JSON mode:\n"
        "                          the server masks every token to JSON)\n"
        "  --temperature T         (default 0: greedy); above 0 each request sends seed = --seed + id\n"
        "load:\n"
        "  --num-requests N        requests per run (default 64)\n"
        "  --rate R                Poisson arrivals at R requests/s (default: all at once)\n"
        "  --concurrency C         at most C requests in flight (default: no bound)\n"
        "  --sweep C1,C2,...       one run per concurrency C, each of max(N, C) requests\n"
        "  --waves W               with --sweep: each run at least W x C requests, W waves of\n"
        "                          its connections, so a server's one-off costs (a shape met\n"
        "                          the first time) weigh alike at every C (default 1)\n"
        "  --seed S                arrivals, prompt order, random prompts (default 0)\n"
        "  --warmup N              N requests before the first run, not recorded (default 1)\n"
        "  --duration-limit S      stop each run after S seconds; requests in flight are\n"
        "                          counted as cancelled (default: none)\n"
        "  --request-timeout S     a request with no complete response after S s fails (600)\n"
        "output:\n"
        "  --out FILE.json         write everything (per-request records included) here\n"
        "  --no-requests           leave the per-request records out of --out\n"
        "  --label TEXT            a name for this run in the JSON (\"spec\", \"plain\", ...)\n"
        "  --machine TEXT          what it ran on, for the JSON (CPU and cores are added)\n"
        "  --no-metrics            do not read the server's /metrics\n"
        "  --progress-interval S   seconds between progress lines when stderr is not a\n"
        "                          terminal (default 5; a terminal gets one updated line)\n"
        "  --quiet                 no progress line\n"
        "\n"
        "Exit status: 0 when every run completed at least one request, 3 when one did not,\n"
        "2 for bad options, 1 when the bench could not start.\n");
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (sd_parse_i64(s, &v) || v < lo || v > hi) {
        fprintf(stderr, "specd-bench-serve: %s %s: expected an integer in [%d, %d]\n", flag, s,
                lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_num(const char *flag, const char *s, double lo, double hi, double *out)
{
    double v;
    if (sd_parse_f64(s, &v) || !(v >= lo && v <= hi)) {
        fprintf(stderr, "specd-bench-serve: %s %s: expected a number in [%g, %g]\n", flag, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}

enum {
    O_URL = 256, O_ENDPOINT, O_MODEL, O_API_KEY, O_PROMPTS, O_RIN, O_ROUT, O_MAXTOK, O_IGNORE_EOS,
    O_TEMP, O_NUM, O_RATE, O_CONC, O_SWEEP, O_SEED, O_DUR, O_RTO, O_OUT, O_NOREQ, O_LABEL,
    O_MACHINE, O_NOMETRICS, O_PROGRESS, O_QUIET, O_WARMUP, O_MAXCHARS, O_WAVES, O_SHARED, O_JSON, O_HELP
};

/* a sweep level's requests: N, at least C, and at least --waves x C */
static int level_requests(const opts *o, int c)
{
    if (!o->n_sweep)
        return o->num_requests;
    long n = (long)o->waves * c;
    n = n > o->num_requests ? n : o->num_requests;
    return n > 1 << 24 ? 1 << 24 : (int)n;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"url", 1, 0, O_URL}, {"endpoint", 1, 0, O_ENDPOINT}, {"model", 1, 0, O_MODEL},
        {"api-key", 1, 0, O_API_KEY}, {"prompts", 1, 0, O_PROMPTS},
        {"random-input-len", 1, 0, O_RIN}, {"random-output-len", 1, 0, O_ROUT},
        {"max-tokens", 1, 0, O_MAXTOK}, {"ignore-eos", 0, 0, O_IGNORE_EOS},
        {"temperature", 1, 0, O_TEMP}, {"num-requests", 1, 0, O_NUM}, {"rate", 1, 0, O_RATE},
        {"concurrency", 1, 0, O_CONC}, {"sweep", 1, 0, O_SWEEP}, {"seed", 1, 0, O_SEED},
        {"duration-limit", 1, 0, O_DUR}, {"request-timeout", 1, 0, O_RTO}, {"out", 1, 0, O_OUT},
        {"no-requests", 0, 0, O_NOREQ}, {"label", 1, 0, O_LABEL}, {"machine", 1, 0, O_MACHINE},
        {"no-metrics", 0, 0, O_NOMETRICS}, {"progress-interval", 1, 0, O_PROGRESS},
        {"quiet", 0, 0, O_QUIET}, {"warmup", 1, 0, O_WARMUP},
        {"max-prompt-chars", 1, 0, O_MAXCHARS}, {"waves", 1, 0, O_WAVES},
        {"shared-prefix-words", 1, 0, O_SHARED}, {"json-object", 0, 0, O_JSON},
        {"help", 0, 0, O_HELP},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->url = "http://127.0.0.1:8000";
    o->endpoint = SD_BENCH_COMPLETIONS;
    o->max_tokens = -1;
    o->num_requests = 64;
    o->request_timeout = 600;
    o->progress_interval = 5;
    o->metrics = 1;
    o->with_requests = 1;
    o->warmup = 1;
    o->waves = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        int rc = 0;
        double d;
        switch (c) {
        case O_URL: o->url = a; break;
        case O_ENDPOINT:
            if (!strcmp(a, "chat"))
                o->endpoint = SD_BENCH_CHAT;
            else if (!strcmp(a, "completions"))
                o->endpoint = SD_BENCH_COMPLETIONS;
            else {
                fprintf(stderr, "specd-bench-serve: --endpoint %s: expected chat or completions\n", a);
                rc = -1;
            }
            break;
        case O_MODEL: o->model = a; break;
        case O_API_KEY: o->api_key = a; break;
        case O_PROMPTS: o->prompts = a; break;
        case O_RIN: rc = parse_int("--random-input-len", a, 1, 1 << 20, &o->random_in); break;
        case O_ROUT: rc = parse_int("--random-output-len", a, 1, 1 << 24, &o->random_out); break;
        case O_MAXTOK: rc = parse_int("--max-tokens", a, 1, 1 << 24, &o->max_tokens); break;
        case O_IGNORE_EOS: o->ignore_eos = 1; break;
        case O_JSON: o->json_object = 1; break;
        case O_TEMP: rc = parse_num("--temperature", a, 0, 100, &o->temperature); break;
        case O_NUM: rc = parse_int("--num-requests", a, 1, 1 << 24, &o->num_requests); break;
        case O_RATE:
            if (!strcmp(a, "inf"))
                o->rate = 0;
            else
                rc = parse_num("--rate", a, 1e-6, 1e9, &o->rate);
            break;
        case O_CONC: rc = parse_int("--concurrency", a, 1, 1 << 20, &o->concurrency); break;
        case O_SWEEP: {
            int32_t *ids = NULL;
            int n = 0;
            sd_err e = {0};
            if (sd_parse_ids(a, &ids, &n, "--sweep", &e) || n == 0) {
                fprintf(stderr, "specd-bench-serve: %s\n", n ? e.msg : "--sweep: empty list");
                free(ids);
                rc = -1;
                break;
            }
            free(o->sweep);
            o->sweep = malloc(sizeof(int) * (size_t)n);
            for (int i = 0; o->sweep && i < n; i++) {
                if (ids[i] < 1) {
                    fprintf(stderr, "specd-bench-serve: --sweep %s: concurrencies must be >= 1\n", a);
                    rc = -1;
                }
                o->sweep[i] = ids[i];
            }
            o->n_sweep = o->sweep ? n : 0;
            free(ids);
            break;
        }
        case O_SEED:
            rc = parse_num("--seed", a, 0, 9.2e18, &d);
            o->seed = (uint64_t)d;
            break;
        case O_DUR: rc = parse_num("--duration-limit", a, 0.001, 1e9, &o->duration_limit); break;
        case O_RTO: rc = parse_num("--request-timeout", a, 0.001, 1e9, &o->request_timeout); break;
        case O_OUT: o->out = a; break;
        case O_NOREQ: o->with_requests = 0; break;
        case O_LABEL: o->label = a; break;
        case O_MACHINE: o->machine = a; break;
        case O_NOMETRICS: o->metrics = 0; break;
        case O_PROGRESS:
            rc = parse_num("--progress-interval", a, 0.01, 1e6, &o->progress_interval);
            break;
        case O_QUIET: o->quiet = 1; break;
        case O_WARMUP: rc = parse_int("--warmup", a, 0, 1 << 20, &o->warmup); break;
        case O_WAVES: rc = parse_int("--waves", a, 1, 1 << 16, &o->waves); break;
        case O_SHARED:
            rc = parse_int("--shared-prefix-words", a, 0, 1 << 20, &o->shared_prefix);
            break;
        case O_MAXCHARS:
            rc = parse_int("--max-prompt-chars", a, 1, 1 << 30, &o->max_prompt_chars);
            break;
        case 'h':
        case O_HELP: usage(stdout); return 1;
        default:
            fprintf(stderr, "specd-bench-serve: unknown or incomplete option '%s' (see --help)\n",
                    argv[optind - 1]);
            rc = -1;
        }
        if (rc)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "specd-bench-serve: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    if (o->prompts && o->random_in) {
        fprintf(stderr, "specd-bench-serve: --prompts and --random-input-len exclude each other\n");
        return -1;
    }
    if (!o->prompts && !o->random_in)
        o->random_in = 128;
    if (o->random_out) {
        if (o->max_tokens < 0)
            o->max_tokens = o->random_out;
        o->ignore_eos = 1;
    }
    if (o->max_tokens < 0)
        o->max_tokens = 128;
    return 0;
}

/* ---- progress ------------------------------------------------------------------ */

typedef struct progress_ctx {
    int tty;
    const char *tag;
} progress_ctx;

static void on_progress(void *user, const sd_bench_progress *p)
{
    progress_ctx *pc = user;
    double t = p->elapsed_s > 0 ? p->elapsed_s : 1e-9;
    char line[256];
    snprintf(line, sizeof line,
             "%s %d/%d done (%d failed), %d in flight, %.2f req/s, %.1f tok/s, %.1f s", pc->tag,
             p->done, p->total, p->failed, p->in_flight, p->ok / t, (double)p->out_tokens / t,
             p->elapsed_s);
    if (pc->tty)
        fprintf(stderr, "\r%s\033[K", line);
    else
        fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

/* ---- the record ------------------------------------------------------------------ */

static void scrape(const opts *o, const sd_bench_target *t, sd_bench_spec *s, int *is_specd)
{
    memset(s, 0, sizeof *s);
    if (!o->metrics)
        return;
    sd_buf body = {0};
    int status = 0;
    sd_err err = {0};
    if (sd_bench_http_get(t, "/metrics", o->api_key, 10, &status, &body, &err) == 0 &&
        status == 200 && body.len) {
        sd_bench_spec_parse(body.p, body.len, s);
        if (strstr(body.p, "specd_"))
            *is_specd = 1;
    }
    sd_buf_free(&body);
}

static char *first_model(const opts *o, const sd_bench_target *t, sd_err *err)
{
    sd_buf body = {0};
    int status = 0;
    char *name = NULL;
    if (sd_bench_http_get(t, "/v1/models", o->api_key, 10, &status, &body, err) == 0) {
        json_t *j = status == 200 ? json_loadb(body.p ? body.p : "", body.len, 0, NULL) : NULL;
        json_t *id = json_object_get(json_array_get(json_object_get(j, "data"), 0), "id");
        if (json_is_string(id))
            name = strdup(json_string_value(id));
        else
            sd_err_set(err, SD_EFORMAT, "GET /v1/models answered %d without data[0].id", status);
        json_decref(j);
    }
    sd_buf_free(&body);
    return name;
}

static json_t *machine_json(const opts *o)
{
    json_t *m = json_object();
    if (o->machine)
        json_object_set_new(m, "label", json_string(o->machine));
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            v[strcspn(v, "\n")] = 0;
            json_object_set_new(m, "cpu", json_string(v));
            break;
        }
    if (f)
        fclose(f);
    json_object_set_new(m, "cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    struct sysinfo si;
    if (sysinfo(&si) == 0)
        json_object_set_new(m, "memory_gib",
                            json_real(round((double)si.totalram * si.mem_unit / 1073741824.0 * 10) / 10));
    struct utsname u;
    if (uname(&u) == 0) {
        json_object_set_new(m, "os", json_string(u.sysname));
        json_object_set_new(m, "kernel", json_string(u.release));
        json_object_set_new(m, "arch", json_string(u.machine));
    }
    return m;
}

/* argv joined as a shell would need it. */
static char *command_line(int argc, char **argv)
{
    sd_buf b = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a != 0;
        for (const char *p = a; *p; p++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%", *p))
                plain = 0;
        if (i)
            sd_buf_puts(&b, " ");
        if (plain) {
            sd_buf_puts(&b, a);
        } else {
            sd_buf_puts(&b, "'");
            for (const char *p = a; *p; p++)
                if (*p == '\'')
                    sd_buf_puts(&b, "'\\''");
                else
                    sd_buf_append(&b, p, 1);
            sd_buf_puts(&b, "'");
        }
    }
    return sd_buf_take(&b, NULL);
}

static int write_json(const opts *o, int argc, char **argv, const char *model, int is_specd,
                      const sd_bench_level *lv, int n, const double load_before[3],
                      int n_prompts, int skipped)
{
    json_t *root = json_object();
    json_object_set_new(root, "tool", json_string("specd-bench-serve"));
    json_object_set_new(root, "commit", json_string(SD_BENCH_COMMIT));
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_set_new(root, "timestamp", json_string(ts));
    char *cmd = command_line(argc, argv);
    json_object_set_new(root, "command", json_string(cmd ? cmd : ""));
    free(cmd);
    json_object_set_new(root, "label", o->label ? json_string(o->label) : json_null());
    json_t *mj = machine_json(o);
    /* The load other processes put on the machine, before and after: CPU
     * numbers taken on a busy machine say so. */
    double load_after[3] = {-1, -1, -1};
    getloadavg(load_after, 3);
    json_object_set_new(mj, "loadavg_1m_before", load_before[0] >= 0 ? json_real(load_before[0])
                                                                     : json_null());
    json_object_set_new(mj, "loadavg_1m_after", load_after[0] >= 0 ? json_real(load_after[0])
                                                                   : json_null());
    json_object_set_new(root, "machine", mj);
    json_t *srv = json_object();
    json_object_set_new(srv, "url", json_string(o->url));
    json_object_set_new(srv, "endpoint",
                        json_string(o->endpoint == SD_BENCH_CHAT ? "chat" : "completions"));
    json_object_set_new(srv, "model", json_string(model));
    json_object_set_new(srv, "specd_metrics", json_boolean(is_specd));
    json_object_set_new(root, "server", srv);
    json_t *cfg = json_object();
    json_object_set_new(cfg, "num_requests", json_integer(o->num_requests));
    json_object_set_new(cfg, "request_rate", o->rate > 0 ? json_real(o->rate) : json_null());
    json_object_set_new(cfg, "concurrency", o->concurrency ? json_integer(o->concurrency)
                                                           : json_null());
    if (o->n_sweep) {
        json_t *sw = json_array();
        for (int i = 0; i < o->n_sweep; i++)
            json_array_append_new(sw, json_integer(o->sweep[i]));
        json_object_set_new(cfg, "sweep", sw);
    }
    json_object_set_new(cfg, "prompts", o->prompts ? json_string(o->prompts) : json_string("random"));
    json_object_set_new(cfg, "n_prompts", json_integer(n_prompts));
    if (o->max_prompt_chars) {
        json_object_set_new(cfg, "max_prompt_chars", json_integer(o->max_prompt_chars));
        json_object_set_new(cfg, "prompts_left_out", json_integer(skipped));
    }
    if (o->shared_prefix)
        json_object_set_new(cfg, "shared_prefix_words", json_integer(o->shared_prefix));
    if (o->random_in)
        json_object_set_new(cfg, "random_input_len", json_integer(o->random_in));
    if (o->random_out)
        json_object_set_new(cfg, "random_output_len", json_integer(o->random_out));
    json_object_set_new(cfg, "max_tokens", json_integer(o->max_tokens));
    json_object_set_new(cfg, "ignore_eos", json_boolean(o->ignore_eos));
    json_object_set_new(cfg, "json_object", json_boolean(o->json_object));
    json_object_set_new(cfg, "temperature", json_real(o->temperature));
    json_object_set_new(cfg, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(cfg, "duration_limit_s", o->duration_limit > 0 ? json_real(o->duration_limit)
                                                                       : json_null());
    json_object_set_new(cfg, "request_timeout_s", json_real(o->request_timeout));
    json_object_set_new(cfg, "warmup", json_integer(o->warmup));
    json_object_set_new(cfg, "waves", json_integer(o->waves));
    json_object_set_new(root, "config", cfg);
    /* Indented, except that each request record is one compact line: the
     * records are most of the file, and a line per ITL value would triple it. */
    json_t *runs = json_array();
    for (int i = 0; i < n; i++) {
        json_t *l = sd_bench_level_json(&lv[i], 0);
        if (o->with_requests) {
            char mark[32];
            snprintf(mark, sizeof mark, "@@requests-%d@@", i);
            json_object_set_new(l, "requests", json_string(mark));
        }
        json_array_append_new(runs, l);
    }
    json_object_set_new(root, "runs", runs);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(7));
    json_decref(root);
    FILE *f = text ? fopen(o->out, "w") : NULL;
    int rc = f ? 0 : -1;
    const char *p = text;
    for (int i = 0; f && i <= n; i++) {
        char mark[40];
        snprintf(mark, sizeof mark, "\"@@requests-%d@@\"", i);
        const char *at = i < n && o->with_requests ? strstr(p, mark) : NULL;
        if (!at) {
            if (i == n || !o->with_requests) {
                fputs(p, f);
                break;
            }
            rc = -1; /* cannot happen: the mark is in the text */
            break;
        }
        fwrite(p, 1, (size_t)(at - p), f);
        fputs("[", f);
        for (int k = 0; k < lv[i].run.n; k++) {
            json_t *r = sd_bench_rec_json(&lv[i].run.recs[k]);
            char *line = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(7));
            json_decref(r);
            if (!line) {
                rc = -1;
                break;
            }
            fprintf(f, "%s\n  %s", k ? "," : "", line);
            free(line);
        }
        fputs("\n  ]", f);
        p = at + strlen(mark);
    }
    if (f && (fputc('\n', f) == EOF || fclose(f)))
        rc = -1;
    free(text);
    if (rc) {
        fprintf(stderr, "specd-bench-serve: --out %s: cannot write\n", o->out);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* A server that closes a connection mid-write must cost a request, not the process. */
    signal(SIGPIPE, SIG_IGN);
    opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;
    sd_err err = {0};
    sd_bench_target target;
    if (sd_bench_parse_url(o.url, &target, &err)) {
        fprintf(stderr, "specd-bench-serve: %s\n", err.msg);
        return 2;
    }
    char *model = o.model ? strdup(o.model) : first_model(&o, &target, &err);
    if (!model) {
        fprintf(stderr, "specd-bench-serve: %s (or pass --model)\n", err.msg);
        return 1;
    }
    sd_bench_prompts prompts;
    int rc = o.prompts ? sd_bench_prompts_load(o.prompts, &prompts, &err)
                       : sd_bench_prompts_random(256, o.random_in, o.seed, &prompts, &err);
    if (rc) {
        fprintf(stderr, "specd-bench-serve: %s\n", err.msg);
        free(model);
        return 1;
    }
    int skipped = 0;
    if (o.max_prompt_chars > 0) {
        int k = 0;
        for (int i = 0; i < prompts.n; i++) {
            if (strlen(prompts.text[i]) > (size_t)o.max_prompt_chars) {
                free(prompts.text[i]);
                skipped++;
            } else {
                prompts.text[k++] = prompts.text[i];
            }
        }
        prompts.n = k;
        if (k == 0) {
            fprintf(stderr, "specd-bench-serve: --max-prompt-chars %d leaves no prompt\n",
                    o.max_prompt_chars);
            free(model);
            sd_bench_prompts_free(&prompts);
            return 2;
        }
    }
    if (o.shared_prefix > 0 && sd_bench_prompts_prefix(&prompts, o.shared_prefix, o.seed, &err)) {
        fprintf(stderr, "specd-bench-serve: %s\n", err.msg);
        free(model);
        sd_bench_prompts_free(&prompts);
        return 1;
    }
    int one = o.concurrency;
    int n_levels = o.n_sweep ? o.n_sweep : 1;
    sd_bench_level *lv = calloc((size_t)n_levels, sizeof *lv);
    if (!lv) {
        fprintf(stderr, "specd-bench-serve: out of memory\n");
        return 1;
    }
    progress_ctx pc = {.tty = isatty(2)};
    int is_specd = 0, exit_code = 0, ran = 0;
    double load_before[3] = {-1, -1, -1};
    getloadavg(load_before, 3);
    if (o.warmup > 0) {
        /* Servers do one-time work on their first requests (allocations,
         * caches, graph captures); vLLM and SGLang send one request first too. */
        sd_bench_cfg w = {.target = target, .endpoint = o.endpoint, .model = model,
                          .api_key = o.api_key, .max_tokens = o.max_tokens,
                          .temperature = o.temperature, .ignore_eos = o.ignore_eos,
                          .json_object = o.json_object,
                          .seed = o.seed ^ 0x77a6ull, .num_requests = o.warmup,
                          .concurrency = o.warmup, .request_timeout_s = o.request_timeout,
                          .duration_limit_s = o.duration_limit, .prompts = &prompts};
        sd_bench_run wr;
        if (sd_bench_run_once(&w, &wr, &err) == 0) {
            int ok = 0;
            for (int k = 0; k < wr.n; k++)
                ok += wr.recs[k].status == SD_BENCH_OK;
            if (ok < wr.n && !o.quiet)
                fprintf(stderr, "specd-bench-serve: warm-up: %d of %d requests failed (%s)\n",
                        wr.n - ok, wr.n, wr.recs[0].error[0] ? wr.recs[0].error : "see the runs");
            sd_bench_run_free(&wr);
        }
    }
    for (int i = 0; i < n_levels; i++) {
        sd_bench_level *l = &lv[i];
        l->concurrency = o.n_sweep ? o.sweep[i] : one;
        l->rate = o.rate;
        sd_bench_cfg cfg = {
            .target = target, .endpoint = o.endpoint, .model = model, .api_key = o.api_key,
            .max_tokens = o.max_tokens, .temperature = o.temperature, .ignore_eos = o.ignore_eos,
            .json_object = o.json_object, .send_seed = o.temperature > 0, .seed = o.seed,
            .num_requests = level_requests(&o, l->concurrency),
            .rate = o.rate, .concurrency = l->concurrency, .duration_limit_s = o.duration_limit,
            .request_timeout_s = o.request_timeout, .prompts = &prompts,
            .progress = o.quiet ? NULL : on_progress, .progress_user = &pc,
            .progress_interval_s = pc.tty ? 0.25 : o.progress_interval};
        char tag[64];
        if (l->concurrency > 0)
            snprintf(tag, sizeof tag, "[c=%d]", l->concurrency);
        else if (o.rate > 0)
            snprintf(tag, sizeof tag, "[rate=%g]", o.rate);
        else
            snprintf(tag, sizeof tag, "[all at once]");
        pc.tag = tag;
        sd_bench_spec before, after;
        scrape(&o, &target, &before, &is_specd);
        rc = sd_bench_run_once(&cfg, &l->run, &err);
        if (rc) {
            fprintf(stderr, "specd-bench-serve: %s\n", err.msg);
            exit_code = 1;
            break;
        }
        ran = i + 1;
        if (!o.quiet && pc.tty)
            fputc('\n', stderr);
        scrape(&o, &target, &after, &is_specd);
        sd_bench_spec_delta(&before, &after, &l->spec);
        sd_bench_summarize(l->run.recs, l->run.n, l->run.duration_s, l->run.peak_in_flight, &l->sum);
        if (l->sum.completed == 0) {
            exit_code = 3;
            for (int k = 0; k < l->run.n; k++)
                if (l->run.recs[k].error[0]) {
                    fprintf(stderr, "specd-bench-serve: %s no request completed; first error: %s\n",
                            tag, l->run.recs[k].error);
                    break;
                }
        }
    }
    if (ran && o.out && write_json(&o, argc, argv, model, is_specd, lv, ran, load_before,
                                  prompts.n, skipped))
        exit_code = 1;
    if (ran) {
        printf("specd-bench-serve: %s %s model=%s%s%s\n", o.url,
               o.endpoint == SD_BENCH_CHAT ? "chat" : "completions", model, o.label ? " label=" : "",
               o.label ? o.label : "");
        sd_bench_table(stdout, lv, ran);
    }
    for (int i = 0; i < n_levels; i++)
        sd_bench_run_free(&lv[i].run);
    free(lv);
    free(o.sweep);
    free(model);
    sd_bench_prompts_free(&prompts);
    return exit_code;
}

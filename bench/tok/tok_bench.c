/* specd-bench-tok: tokenizer throughput (one thread, in-process).
 *
 *   specd-bench-tok [--tokenizer PATH] [--golden FILE] [--mb N] [--reps N] [--out FILE.json]
 *
 * Two texts of at least --mb megabytes (default 1.1), each encoded in one call:
 *   golden  the golden long text (argparse.py source mixed with the edge-case
 *           corpus: long runs, CJK, emoji, whitespace runs), repeated the way
 *           tools/golden/tokenizers.py builds the text HF timed on the H200
 *   words   English-like words, punctuation, numbers, some non-ASCII
 * For each: encode MB/s and tokens/s (median of --reps), full decode and
 * one-id-at-a-time streaming detokenization in tokens/s. A short table goes to
 * stdout last; --out writes JSON with the commit, machine and command. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench_util.h"
#include "core/tokenizer.h"
#include "core/utf8.h"
#include "core/util.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* UTF-8 code points in s (what Python's len counts). */
static size_t n_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static char *golden_text(const char *golden, size_t want, size_t *len)
{
    json_error_t je;
    json_t *g = json_load_file(golden, JSON_ALLOW_NUL, &je);
    if (!g) {
        fprintf(stderr, "specd-bench-tok: %s:%d: %s\n", golden, je.line, je.text);
        return NULL;
    }
    json_t *t = json_object_get(json_object_get(json_array_get(json_object_get(g, "tokenizers"), 0), "long"), "text");
    const char *s = json_string_value(t);
    size_t n = json_string_length(t);
    /* big = (text + "\n") * (want // (len(text) + 1) + 1), len in characters */
    size_t reps = want / (n_chars(s, n) + 1) + 1;
    char *out = malloc(reps * (n + 1) + 1);
    if (out) {
        for (size_t r = 0; r < reps; r++) {
            memcpy(out + r * (n + 1), s, n);
            out[r * (n + 1) + n] = '\n';
        }
        *len = reps * (n + 1);
        out[*len] = 0;
    }
    json_decref(g);
    return out;
}

static char *words_text(size_t want, size_t *len)
{
    static const char *const w[] = {
        "the", "of", "and", "to", "in", "is", "that", "for", "it", "was", "on", "with", "as", "by", "model",
        "tokenizer", "speculative", "decoding", "server", "request", "latency", "throughput", "GPU", "memory",
        "don't", "it's", "we're", "2024", "3.14", "1,000", "naïve", "café", "über", "日本語", "中文", "😀",
        "function", "return", "value", "(x)", "x[i]", "==", "->", "https://example.com", "user@example.org"};
    static const char *const sep[] = {" ", " ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "\t", "  ", "; ", "! "};
    char *out = malloc(want + 64);
    size_t n = 0;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    while (out && n < want) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const char *a = w[s % SD_ARRAY_LEN(w)], *b = sep[(s >> 32) % SD_ARRAY_LEN(sep)];
        size_t la = strlen(a), lb = strlen(b);
        memcpy(out + n, a, la);
        memcpy(out + n + la, b, lb);
        n += la + lb;
    }
    if (out) {
        out[n] = 0;
        *len = n;
    }
    return out;
}

typedef struct result {
    const char *name;
    size_t bytes;
    int ids;
    double enc_mbps, enc_tps, dec_tps, stream_tps;
} result;

static int run(const sd_tokenizer *t, const char *name, const char *text, size_t len, int reps, result *r)
{
    sd_err err = {0};
    double *ts = calloc((size_t)reps, sizeof *ts);
    int32_t *ids = NULL;
    int n = 0;
    for (int k = 0; k < reps; k++) {
        free(ids);
        double t0 = sd_now_s();
        if (sd_tok_encode(t, text, len, 0, &ids, &n, &err)) {
            fprintf(stderr, "specd-bench-tok: %s\n", err.msg);
            free(ts);
            return 1;
        }
        ts[k] = sd_now_s() - t0;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
    double enc = ts[reps / 2];
    double t0 = sd_now_s();
    char *s;
    size_t sl;
    if (sd_tok_decode(t, ids, n, 0, &s, &sl, &err)) {
        fprintf(stderr, "specd-bench-tok: %s\n", err.msg);
        return 1;
    }
    double dec = sd_now_s() - t0;
    free(s);
    sd_detok *d;
    sd_detok_new(&d, t, 0, &err);
    t0 = sd_now_s();
    for (int i = 0; i < n; i++) {
        sd_detok_push(d, &ids[i], 1, &s, &sl, &err);
        free(s);
    }
    sd_detok_flush(d, &s, &sl);
    free(s);
    double st = sd_now_s() - t0;
    sd_detok_free(d);
    *r = (result){name, len, n, (double)len / enc / 1e6, n / enc, n / dec, n / st};
    free(ids);
    free(ts);
    return 0;
}

static char *cpu_model(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            fclose(f);
            c = c ? c + 2 : line;
            c[strcspn(c, "\n")] = 0;
            return strdup(c);
        }
    }
    if (f)
        fclose(f);
    return strdup("unknown");
}

int main(int argc, char **argv)
{
    const char *tok = "tests/golden/tokenizer/llama3ish", *golden = "tests/golden/tokenizer/golden.json", *out = NULL;
    double mb = 1.1;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok = argv[++i];
        else if (!strcmp(argv[i], "--golden") && i + 1 < argc)
            golden = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: specd-bench-tok [--tokenizer PATH] [--golden FILE] [--mb N] [--reps N] "
                            "[--out FILE.json]\n");
            return 2;
        }
    }
    if (reps < 1 || mb <= 0) {
        fprintf(stderr, "specd-bench-tok: --reps >= 1 and --mb > 0\n");
        return 2;
    }
    sd_err err = {0};
    sd_tokenizer *t;
    double t0 = sd_now_s();
    if (sd_tok_load(&t, tok, &err)) {
        fprintf(stderr, "specd-bench-tok: %s\n", err.msg);
        return 1;
    }
    double load_s = sd_now_s() - t0;
    size_t want = (size_t)(mb * 1e6), gl = 0, wl = 0;
    char *g = golden_text(golden, want, &gl), *w = words_text(want, &wl);
    if (!g || !w)
        return 1;
    result r[2];
    if (run(t, "golden", g, gl, reps, &r[0]) || run(t, "words", w, wl, reps, &r[1]))
        return 1;
    if (out) {
        struct utsname un;
        uname(&un);
        char *commit = sd_bench_git_commit(), *cpu = cpu_model();
        sd_sbuf cmd = {0};
        for (int i = 0; i < argc; i++) {
            sd_sbuf_put(&cmd, argv[i], strlen(argv[i]));
            if (i + 1 < argc)
                sd_sbuf_putc(&cmd, ' ');
        }
        json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:s, s:f, s:i, s:[]}", "bench", "tokenizer", "commit", commit,
                                 "machine", un.machine, "cpu", cpu, "command", cmd.p ? cmd.p : "", "load_s", load_s,
                                 "vocab", sd_tok_vocab_size(t), "results");
        json_object_set_new(root, "tokenizer", json_string(tok));
        for (int i = 0; i < 2; i++)
            json_array_append_new(json_object_get(root, "results"),
                                  json_pack("{s:s, s:I, s:i, s:f, s:f, s:f, s:f}", "text", r[i].name, "bytes",
                                            (json_int_t)r[i].bytes, "ids", r[i].ids, "encode_mb_per_s", r[i].enc_mbps,
                                            "encode_tokens_per_s", r[i].enc_tps, "decode_tokens_per_s", r[i].dec_tps,
                                            "stream_tokens_per_s", r[i].stream_tps));
        if (json_dump_file(root, out, JSON_INDENT(2)))
            fprintf(stderr, "specd-bench-tok: cannot write %s\n", out);
        json_decref(root);
        free(commit);
        free(cpu);
        sd_sbuf_free(&cmd);
    }
    printf("tokenizer %s (vocab %d, loaded in %.3f s), one thread, median of %d\n", tok, sd_tok_vocab_size(t), load_s,
           reps);
    printf("%-7s %9s %8s %12s %12s %12s %12s\n", "text", "bytes", "ids", "encode MB/s", "encode tok/s", "decode tok/s",
           "stream tok/s");
    for (int i = 0; i < 2; i++)
        printf("%-7s %9zu %8d %12.1f %12.0f %12.0f %12.0f\n", r[i].name, r[i].bytes, r[i].ids, r[i].enc_mbps,
               r[i].enc_tps, r[i].dec_tps, r[i].stream_tps);
    free(g);
    free(w);
    sd_tok_free(t);
    return 0;
}

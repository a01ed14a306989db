/* specd-bench-mask: the JSON masks of response_format per logits row (one
 * thread, in-process): every token fed whole from the state, against
 * verify/token_mask's fast path (the engine's), over every prefix state of
 * a JSON document.
 *
 *   specd-bench-mask [--tokenizer DIR] [--vocab N] [--reps N] [--out FILE.json]
 *
 * --tokenizer: a checkpoint folder's tokenizer (its tokens' bytes, the
 * specials left out as the engine leaves them); without it a synthetic
 * vocabulary of --vocab tokens (default 150000) of 1-8 bytes: letters, 3% of
 * bytes '"', 2% spaces, digits and JSON punctuation. The document is an
 * object of strings, numbers, an enum and an array, masked as json_object
 * and as a document of its schema. Best of --reps (3) sweeps; a table goes
 * to stdout, --out writes JSON with the commit, machine and command. Both
 * paths' masks are compared on every row (a difference fails the run). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "verify/json_mask.h"
#include "verify/json_schema.h"
#include "verify/token_mask.h"

typedef struct vocab {
    const sd_tokenizer *tok;
    unsigned char **own; /* synthetic tokens */
} vocab;

static const unsigned char *bytes_of(const void *ctx, int32_t t, size_t *len)
{
    const vocab *v = ctx;
    if (v->tok) {
        *len = 0;
        if (sd_tok_is_special(v->tok, t))
            return NULL;
        return (const unsigned char *)sd_tok_token_bytes(v->tok, t, len);
    }
    *len = v->own[t][0];
    return v->own[t] + 1;
}

static const char DOC[] = "{\"name\": \"a long string value with some words in it\", \"age\": 12345, "
                          "\"kind\": \"cat\", \"tags\": [\"red\", \"blue\"], \"score\": -0.25}";
static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\"},\"kind\":{\"enum\":[\"cat\",\"dog\"]},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\"}},\"score\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\","
    "\"kind\",\"tags\",\"score\"]}";

/* one sweep over DOC's prefix states: the seconds of each path (fed
 * whole, the fast path, the fast path through a cache empty at the start:
 * one document's own recurring states); -1 where their masks differ */
static int sweep(const sd_token_table *tt, const sd_byte_automaton *a, void *st, void *scratch,
                 void (*init)(const void *ctx, void *st), float *r0, float *r1, double *t_fed,
                 double *t_fast, double *t_cached, int *rows, uint64_t *hits)
{
    init(a->ctx, st);
    *t_fed = *t_fast = *t_cached = 0;
    *rows = 0;
    sd_mask_cache *c = NULL;
    if (sd_mask_cache_create(&c, tt, (size_t)16 << 20))
        return -1;
    const size_t n = strlen(DOC);
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = sd_now_ns();
        for (int t = 0; t < tt->n; t++) {
            r0[t] = 0;
            if (!tt->bytes[t])
                continue;
            a->copy(a->ctx, scratch, st);
            if (a->feed(a->ctx, scratch, tt->bytes[t], tt->len[t]))
                r0[t] = -INFINITY;
        }
        uint64_t t1 = sd_now_ns();
        memset(r1, 0, (size_t)tt->n * sizeof *r1);
        uint64_t t2 = sd_now_ns();
        sd_token_mask(tt, a, st, scratch, r1);
        uint64_t t3 = sd_now_ns();
        *t_fed += (double)(t1 - t0) * 1e-9;
        *t_fast += (double)(t3 - t2) * 1e-9;
        (*rows)++;
        int bad = memcmp(r0, r1, (size_t)tt->n * sizeof *r0) != 0;
        memset(r1, 0, (size_t)tt->n * sizeof *r1);
        uint64_t t4 = sd_now_ns();
        sd_token_mask_cached(c, tt, a, st, scratch, r1);
        *t_cached += (double)(sd_now_ns() - t4) * 1e-9;
        bad |= memcmp(r0, r1, (size_t)tt->n * sizeof *r0) != 0;
        if (bad || a->feed(a->ctx, st, (const unsigned char *)DOC + i, 1)) {
            sd_mask_cache_free(c);
            return -1;
        }
    }
    uint64_t misses;
    sd_mask_cache_counts(c, hits, &misses);
    sd_mask_cache_free(c);
    return 0;
}

static void jm_init(const void *c, void *st)
{
    (void)c;
    sd_json_init(st);
}
static void js_init(const void *c, void *st) { sd_jschema_init(c, st); }

int main(int argc, char **argv)
{
    const char *tokdir = NULL, *out = NULL;
    int V = 150000, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tokdir = argv[++i];
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc)
            V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: specd-bench-mask [--tokenizer DIR] [--vocab N] [--reps N] "
                            "[--out FILE.json]\n");
            return 2;
        }
    }
    if (V < 1 || reps < 1) {
        fprintf(stderr, "specd-bench-mask: --vocab and --reps must be >= 1\n");
        return 2;
    }
    vocab v = {0};
    sd_tokenizer *tok = NULL;
    sd_err err = {0};
    if (tokdir) {
        if (sd_tok_load(&tok, tokdir, &err)) {
            fprintf(stderr, "specd-bench-mask: %s\n", err.msg);
            return 1;
        }
        v.tok = tok;
        V = sd_tok_vocab_size(tok);
    } else {
        v.own = calloc((size_t)V, sizeof *v.own);
        uint64_t s = 88172645463325252ull;
        for (int t = 0; v.own && t < V; t++) {
            s = sd_mix64(s);
            const int n = 1 + (int)(s % 8);
            v.own[t] = malloc((size_t)n + 1);
            if (!v.own[t])
                return 1;
            v.own[t][0] = (unsigned char)n;
            for (int i = 0; i < n; i++) {
                s = sd_mix64(s);
                const int r = (int)(s % 100);
                v.own[t][1 + i] = r < 3 ? '"' : r < 5 ? ' ' : r < 6 ? '{' : r < 7 ? ':' : r < 8 ? ','
                                  : r < 10 ? (unsigned char)('0' + s / 100 % 10)
                                           : (unsigned char)('a' + s / 100 % 26);
            }
        }
    }
    sd_token_table tt;
    sd_jschema *js = NULL;
    float *r0 = malloc((size_t)V * sizeof *r0), *r1 = malloc((size_t)V * sizeof *r1);
    if (sd_token_table_build(&tt, V, bytes_of, &v) || !r0 || !r1 ||
        sd_jschema_compile(SCHEMA, strlen(SCHEMA), &js, &err)) {
        fprintf(stderr, "specd-bench-mask: %s\n", err.msg[0] ? err.msg : "out of memory");
        return 1;
    }
    static sd_json_state ms, msc;
    static sd_jschema_state ss, ssc;
    const struct {
        const char *name;
        sd_byte_automaton a;
        void *st, *scratch;
        void (*init)(const void *, void *);
    } kinds[2] = {{"json_object", sd_json_automaton(), &ms, &msc, jm_init},
                  {"json_schema", sd_jschema_automaton(js), &ss, &ssc, js_init}};
    json_t *root = json_object(), *res = json_array();
    char *commit = sd_bench_git_commit();
    sd_bench_json_head(root, "json_mask", commit, NULL, "cpu (one thread)", argc, argv);
    json_object_set_new(root, "vocab", json_integer(V));
    json_object_set_new(root, "vocab_source", json_string(tokdir ? tokdir : "synthetic"));
    printf("%-12s %6s %12s %12s %8s %14s %6s\n", "mask", "rows", "fed ms/row", "fast ms/row",
           "ratio", "cached ms/row", "found");
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        double best_fed = 1e30, best_fast = 1e30, best_cached = 1e30;
        int rows = 0;
        uint64_t hits = 0;
        for (int r = 0; r < reps; r++) {
            double tf, tq, tc;
            if (sweep(&tt, &kinds[k].a, kinds[k].st, kinds[k].scratch, kinds[k].init, r0, r1, &tf,
                      &tq, &tc, &rows, &hits)) {
                fprintf(stderr, "specd-bench-mask: %s: the two masks differ\n", kinds[k].name);
                rc = 1;
                break;
            }
            best_fed = tf < best_fed ? tf : best_fed;
            best_fast = tq < best_fast ? tq : best_fast;
            best_cached = tc < best_cached ? tc : best_cached;
        }
        if (rc)
            break;
        printf("%-12s %6d %12.3f %12.3f %7.2fx %14.3f %6llu\n", kinds[k].name, rows,
               best_fed / rows * 1e3, best_fast / rows * 1e3, best_fed / best_fast,
               best_cached / rows * 1e3, (unsigned long long)hits);
        json_t *x = json_object();
        json_object_set_new(x, "mask", json_string(kinds[k].name));
        json_object_set_new(x, "rows", json_integer(rows));
        json_object_set_new(x, "fed_ms_per_row", json_real(best_fed / rows * 1e3));
        json_object_set_new(x, "fast_ms_per_row", json_real(best_fast / rows * 1e3));
        json_object_set_new(x, "speedup", json_real(best_fed / best_fast));
        /* a cache empty at the document's start: the masks its own states
         * found again (a server's cache also holds earlier documents') */
        json_object_set_new(x, "cached_ms_per_row", json_real(best_cached / rows * 1e3));
        json_object_set_new(x, "cached_rows_found", json_integer((json_int_t)hits));
        json_array_append_new(res, x);
    }
    json_object_set_new(root, "results", res);
    if (!rc && out && json_dump_file(root, out, JSON_INDENT(2))) {
        fprintf(stderr, "specd-bench-mask: cannot write %s\n", out);
        rc = 1;
    }
    json_decref(root);
    free(commit);
    sd_jschema_free(js);
    sd_token_table_free(&tt);
    for (int t = 0; v.own && t < V; t++)
        free(v.own[t]);
    free(v.own);
    sd_tok_free(tok);
    free(r0);
    free(r1);
    return rc;
}

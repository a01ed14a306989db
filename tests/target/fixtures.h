/* tests/target/fixtures.h: the golden model fixtures (tests/golden/models/NAME/
 * with golden.json), the error measures the model tests share, and a
 * model's outputs on a backend (run_model) compared bit for bit (same). */
#ifndef SD_TESTS_TARGET_FIXTURES_H
#define SD_TESTS_TARGET_FIXTURES_H

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "core/util.h"
#include "target/runner.h"
#include "test.h"

/* Names of the fixture folders (those holding golden.json); returns the count. */
static inline int golden_fixtures(char names[][256], int max)
{
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/golden/models", sd_test_srcdir());
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.')
            continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s/golden.json", root, e->d_name);
        if (sd_file_exists(p))
            snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

/* The first max token ids of a fixture's golden.json; returns the count (0
 * when it cannot be read). */
static inline int fixture_ids(const char *dir, int32_t *ids, int max)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return 0;
    json_t *a = json_object_get(j, "ids");
    int n = (int)json_array_size(a);
    n = n < max ? n : max;
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    json_decref(j);
    return n;
}

static inline double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* largest |a - b|; infinity if any difference is NaN */
static inline double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        m = fmax(m, d);
    }
    return m;
}

/* ---- a model's outputs on a backend, and their comparison ---- */

/* Everything one model gives for ids. */
typedef struct outs {
    float *logits, *hidden, *step, *mtp, *mtp_hidden; /* (n,V) (n,D) (n,V) (n-1,V) (n-1,D) */
    int has_mtp;
} outs;

static inline void outs_free(outs *o)
{
    free(o->logits);
    free(o->hidden);
    free(o->step);
    free(o->mtp);
    free(o->mtp_hidden);
}

/* The model of dir loaded with mo (max_tokens 64 and load_mtp set here). */
static inline int run_model_with(sd_backend *be, const char *dir, sd_model_opts mo,
                                 const int32_t *ids, int n, outs *o, int *V_out, int *D_out,
                                 sd_err *err)
{
    memset(o, 0, sizeof *o);
    sd_model *m = NULL;
    mo.max_tokens = 64;
    mo.load_mtp = 1;
    int rc = sd_model_load(&m, dir, be, &mo, err);
    if (!rc)
        rc = sd_model_alloc_kv(m, n + 8, err);
    if (rc) {
        sd_model_free(m);
        return rc;
    }
    const sd_model_cfg *c = sd_model_cfg_of(m);
    int V = c->vocab_size, D = c->hidden_size;
    *V_out = V;
    *D_out = D;
    o->logits = calloc((size_t)n * V, sizeof(float));
    o->hidden = calloc((size_t)n * D, sizeof(float));
    o->step = calloc((size_t)n * V, sizeof(float));
    sd_seq_out so = {.logits = o->logits, .hidden = o->hidden};
    rc = sd_runner_target(m, ids, n, 0, &so, err);
    int k = n / 2;
    sd_seq_out s1 = {.logits = o->step};
    if (!rc)
        rc = sd_runner_target(m, ids, k, 0, &s1, err);
    for (int i = k; i < n && !rc; i++) {
        sd_seq_out s2 = {.logits = o->step + (size_t)i * V};
        rc = sd_runner_target(m, ids + i, 1, i, &s2, err);
    }
    if (!rc && sd_model_has_mtp(m)) {
        o->has_mtp = 1;
        o->mtp = calloc((size_t)(n - 1) * V, sizeof(float));
        o->mtp_hidden = calloc((size_t)(n - 1) * D, sizeof(float));
        sd_seq_out sm = {.logits = o->mtp, .out_hidden = o->mtp_hidden};
        rc = sd_runner_mtp(m, ids + 1, o->hidden, n - 1, 0, &sm, err);
    }
    sd_model_free(m);
    return rc;
}

static inline int run_model(sd_backend *be, const char *dir, const int32_t *ids, int n, outs *o,
                            int *V_out, int *D_out, sd_err *err)
{
    return run_model_with(be, dir, (sd_model_opts){0}, ids, n, o, V_out, D_out, err);
}

static inline int same(const char *name, const char *what, const float *a, const float *b, size_t n)
{
    int ok = !memcmp(a, b, n * sizeof(float));
    fprintf(stderr, "  %-28s %-11s %s (max|d| %.3g)\n", name, what, ok ? "same bits" : "DIFFER",
            max_diff(a, b, n));
    return ok;
}

/* a within bound of b: the largest |a - b| over the largest |b| */
static inline int near(const char *name, const char *what, const float *a, const float *b, size_t n,
                       double bound)
{
    const double m = max_abs(b, n), rel = m > 0 ? max_diff(a, b, n) / m : max_diff(a, b, n);
    const int ok = rel <= bound;
    fprintf(stderr, "  %-28s %-11s %s (max|d| / max|b| %.3g, bound %.3g)\n", name, what,
            ok ? "near" : "FAR", rel, bound);
    return ok;
}

/* Removes a checkpoint folder a test wrote (model.safetensors and config.json). */
static inline void rm_ckpt(const char *dir)
{
    char *a = sd_strfmt("%s/model.safetensors", dir), *b = sd_strfmt("%s/config.json", dir);
    remove(a);
    remove(b);
    rmdir(dir);
    free(a);
    free(b);
}

#endif

/* Golden tests: the CPU backend against HF transformers' fp32 logits
 * (fixtures in tests/golden/models/, made by tools/golden/models.py). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>

#include "core/util.h"
#include "target/runner.h"
#include "fixtures.h"
#include "test.h"

typedef struct golden {
    char dir[1024];
    int32_t ids[256];
    int n;
    int vocab;
    float *logits;     /* (n, vocab) */
    float *mtp_logits; /* (n-1, vocab) or NULL */
    int32_t greedy[64];
    int n_greedy;
} golden;

static float *read_f32(const char *dir, json_t *spec, int rows, int cols)
{
    const char *file = json_string_value(json_object_get(spec, "file"));
    json_t *shape = json_object_get(spec, "shape");
    if (!file || json_integer_value(json_array_get(shape, 0)) != rows ||
        json_integer_value(json_array_get(shape, 1)) != cols)
        return NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *data;
    size_t len;
    sd_err err = {0};
    if (sd_read_file(path, &data, &len, &err) || len != (size_t)rows * cols * sizeof(float)) {
        fprintf(stderr, "  %s: %s (len %zu)\n", path, err.msg, len);
        return NULL;
    }
    return (float *)data;
}

static int load_golden(golden *g, const char *dir)
{
    memset(g, 0, sizeof *g);
    snprintf(g->dir, sizeof g->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return -1;
    json_t *ids = json_object_get(j, "ids");
    g->n = (int)json_array_size(ids);
    for (int i = 0; i < g->n && i < 256; i++)
        g->ids[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    json_t *lg = json_object_get(j, "logits");
    g->vocab = (int)json_integer_value(json_array_get(json_object_get(lg, "shape"), 1));
    g->logits = read_f32(dir, lg, g->n, g->vocab);
    json_t *mtp = json_object_get(j, "mtp");
    if (mtp)
        g->mtp_logits = read_f32(dir, mtp, g->n - 1, g->vocab);
    json_t *gr = json_object_get(j, "greedy");
    g->n_greedy = (int)json_array_size(gr);
    for (int i = 0; i < g->n_greedy && i < 64; i++)
        g->greedy[i] = (int32_t)json_integer_value(json_array_get(gr, (size_t)i));
    json_decref(j);
    return g->logits && (!mtp || g->mtp_logits) ? 0 : -1;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void check_fixture(const char *name, int *failed)
{
    char dir[1024];
    if (snprintf(dir, sizeof dir, "%s/tests/golden/models/%s", sd_test_srcdir(), name) >=
        (int)sizeof dir) {
        *failed = 1;
        return;
    }
    golden g;
    if (load_golden(&g, dir)) {
        fprintf(stderr, "  %s: cannot read the fixture\n", name);
        *failed = 1;
        return;
    }
    sd_backend *be;
    sd_err err = {0};
    sd_model *m = NULL;
    if (sd_cpu_backend_create(&be, 2)) {
        *failed = 1;
        return;
    }
    sd_model_opts mo = {.max_tokens = 64, .load_mtp = 1};
    int n = g.n, V = g.vocab;
    float *lg = calloc((size_t)n * V, sizeof(float)), *lg2 = calloc((size_t)n * V, sizeof(float));
    float *hid = NULL, *mlg = NULL;
    if (sd_model_load(&m, dir, be, &mo, &err) || sd_model_alloc_kv(m, n + 64, &err)) {
        fprintf(stderr, "  %s: %s\n", name, err.msg);
        *failed = 1;
        goto done;
    }
    const sd_model_cfg *c = sd_model_cfg_of(m);
    int D = c->hidden_size;
    hid = calloc((size_t)n * D, sizeof(float));
    sd_seq_out so = {.logits = lg, .hidden = hid};
    if (sd_runner_target(m, g.ids, n, 0, &so, &err)) {
        fprintf(stderr, "  %s: %s\n", name, err.msg);
        *failed = 1;
        goto done;
    }
    double ref = max_abs(g.logits, (size_t)n * V), d = max_diff(lg, g.logits, (size_t)n * V);
    int ok = d <= 1e-4 * ref;
    fprintf(stderr, "  %-28s logits   max|d| %.3g  max|ref| %.3g  rel %.3g  %s\n", name, d, ref,
            d / ref, ok ? "ok" : "FAIL");
    if (!ok)
        *failed = 1;
    /* prefill of a prefix, then one token at a time, equals the full prefill */
    int k = n / 2;
    sd_seq_out s1 = {.logits = lg2};
    if (sd_runner_target(m, g.ids, k, 0, &s1, &err)) {
        *failed = 1;
        goto done;
    }
    for (int i = k; i < n; i++) {
        sd_seq_out s2 = {.logits = lg2 + (size_t)i * V};
        if (sd_runner_target(m, g.ids + i, 1, i, &s2, &err)) {
            *failed = 1;
            goto done;
        }
    }
    double dd = max_diff(lg, lg2, (size_t)n * V);
    ok = dd <= 1e-5 * ref;
    fprintf(stderr, "  %-28s decode   max|d| vs prefill %.3g  %s\n", name, dd, ok ? "ok" : "FAIL");
    if (!ok)
        *failed = 1;
    /* greedy continuation equals HF generate's */
    if (g.n_greedy > 0) {
        int32_t seq[320];
        memcpy(seq, g.ids, (size_t)n * sizeof(int32_t));
        float *row = malloc((size_t)V * sizeof(float));
        int next = argmax(lg + (size_t)(n - 1) * V, V), match = 1;
        for (int i = 0; i < g.n_greedy; i++) {
            if (next != g.greedy[i]) {
                fprintf(stderr, "  %s: greedy token %d: %d, HF %d\n", name, i, next, g.greedy[i]);
                match = 0;
                break;
            }
            seq[n + i] = next;
            sd_seq_out s3 = {.logits = row};
            if (sd_runner_target(m, &seq[n + i], 1, n + i, &s3, &err))
                break;
            next = argmax(row, V);
        }
        free(row);
        fprintf(stderr, "  %-28s greedy   %d tokens %s\n", name, g.n_greedy, match ? "ok" : "FAIL");
        if (!match)
            *failed = 1;
    }
    if (g.mtp_logits) {
        if (!sd_model_has_mtp(m)) {
            fprintf(stderr, "  %s: MTP layer not loaded\n", name);
            *failed = 1;
            goto done;
        }
        mlg = calloc((size_t)(n - 1) * V, sizeof(float));
        sd_seq_out sm = {.logits = mlg};
        if (sd_runner_mtp(m, g.ids + 1, hid, n - 1, 0, &sm, &err)) {
            fprintf(stderr, "  %s: %s\n", name, err.msg);
            *failed = 1;
            goto done;
        }
        double mref = max_abs(g.mtp_logits, (size_t)(n - 1) * V);
        double md = max_diff(mlg, g.mtp_logits, (size_t)(n - 1) * V);
        ok = md <= 1e-4 * mref;
        fprintf(stderr, "  %-28s mtp      max|d| %.3g  max|ref| %.3g  rel %.3g  %s\n", name, md,
                mref, md / mref, ok ? "ok" : "FAIL");
        if (!ok)
            *failed = 1;
    }
done:
    free(lg);
    free(lg2);
    free(hid);
    free(mlg);
    free(g.logits);
    free(g.mtp_logits);
    sd_model_free(m);
    sd_cpu_backend_destroy(be);
}

TEST(cpu_logits_match_hf_transformers_on_every_fixture)
{
    char names[64][256];
    int n = golden_fixtures(names, 64);
    ASSERT_MSG(n >= 6, "expected the committed fixtures under tests/golden/models, found %d", n);
    int failed = 0;
    for (int i = 0; i < n; i++)
        check_fixture(names[i], &failed);
    ASSERT(!failed);
}

TEST_MAIN(T(cpu_logits_match_hf_transformers_on_every_fixture))

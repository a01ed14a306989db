/* The model's fused residual path (one rank, a backend with matmul_add and
 * rmsnorm_matmul: output projections add into the residual, a norm is
 * owed to its reader and taken as a GEMV's prologue) gives the bits of the
 * unfused path (add_rmsnorm after every sublayer) on every golden fixture:
 * logits and final hidden states of a prefill, of a half prefill then one
 * token at a time, and MTP logits and layer outputs. The unfused run is the
 * same CPU backend with those two ops taken out of its table. The bundled
 * model's EAGLE-3 head (the same residual steps through the ops' helpers)
 * gives the same bits both ways too. */
#include <jansson.h>
#include <string.h>

#include "core/util.h"
#include "draft/eagle3.h"
#include "fixtures.h"
#include "test.h"

TEST(fused_residual_path_gives_the_unfused_bits_on_every_fixture)
{
    char names[64][256];
    int nf = golden_fixtures(names, 64);
    ASSERT_MSG(nf >= 6, "expected the committed fixtures under tests/golden/models, found %d", nf);
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    ASSERT(be->ops->matmul_add && be->ops->rmsnorm_matmul);
    /* the same backend without the two fused ops: the model's unfused path */
    sd_ops plain_ops = *be->ops;
    plain_ops.matmul_add = NULL;
    plain_ops.rmsnorm_matmul = NULL;
    sd_backend plain = *be;
    plain.ops = &plain_ops;
    int failed = 0, mtp_seen = 0;
    for (int f = 0; f < nf; f++) {
        char dir[1400];
        snprintf(dir, sizeof dir, "%.1000s/tests/golden/models/%.255s", sd_test_srcdir(), names[f]);
        int32_t ids[64];
        int n = fixture_ids(dir, ids, 24);
        if (n < 4) {
            fprintf(stderr, "  %s: no ids\n", names[f]);
            failed = 1;
            continue;
        }
        outs a, b;
        int V = 0, D = 0;
        sd_err err = {0};
        if (run_model(be, dir, ids, n, &a, &V, &D, &err) ||
            run_model(&plain, dir, ids, n, &b, &V, &D, &err)) {
            fprintf(stderr, "  %s: %s\n", names[f], err.msg);
            failed = 1;
        } else {
            size_t nv = (size_t)n * V, nd = (size_t)n * D;
            int ok = same(names[f], "logits", a.logits, b.logits, nv) &
                     same(names[f], "hidden", a.hidden, b.hidden, nd) &
                     same(names[f], "decode", a.step, b.step, nv);
            if (a.has_mtp != b.has_mtp) {
                ok = 0;
            } else if (a.has_mtp) {
                mtp_seen = 1;
                ok &= same(names[f], "mtp logits", a.mtp, b.mtp, nv - V) &
                      same(names[f], "mtp hidden", a.mtp_hidden, b.mtp_hidden, nd - D);
            }
            if (!ok)
                failed = 1;
        }
        outs_free(&a);
        outs_free(&b);
    }
    sd_cpu_backend_destroy(be);
    ASSERT_MSG(mtp_seen, "no fixture with an MTP layer ran");
    ASSERT_MSG(!failed, "the fused residual path differs from the unfused one");
}

/* The bundled EAGLE-3 head on be: a first step (fc over aux states) of T
 * tokens, then a chain step from its hidden; logits and hidden of both. */
#define E3_T 6
static int run_eagle3(sd_backend *be, const float *aux, float *out, size_t *n_out, sd_err *err)
{
    char *tdir = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    char *hdir = sd_strfmt("%s/models/specd-tiny-eagle3", sd_test_srcdir());
    sd_model *m = NULL;
    sd_eagle3 *h = NULL;
    sd_model_opts mo = {.max_tokens = 16};
    int rc = sd_model_load(&m, tdir, be, &mo, err);
    if (!rc)
        rc = sd_eagle3_load(&h, hdir, be, m, 16, err);
    if (!rc)
        rc = sd_eagle3_alloc_kv(h, 64, err);
    size_t o = 0;
    if (!rc) {
        int V = sd_eagle3_draft_vocab(h), H = sd_eagle3_hidden(h);
        int32_t tok[E3_T], pos[E3_T], seq[E3_T], rows[E3_T], table[4] = {0, 1, 2, 3};
        for (int i = 0; i < E3_T; i++) {
            tok[i] = 3 + 5 * i;
            pos[i] = i;
            seq[i] = 0;
            rows[i] = i;
        }
        for (int step = 0; step < 2 && !rc; step++) {
            const float *in = step ? out + o - (size_t)E3_T * H : aux;
            float *lg = out + o, *hid = lg + (size_t)E3_T * V;
            sd_fwd f = {.ab = {.n_tokens = E3_T, .pos = pos, .seq = seq, .slot = pos,
                               .block_table = table, .max_blocks = 4, .block_size = 16,
                               .max_pos = pos[E3_T - 1] + 1},
                        .tokens = tok, .n_out = E3_T, .out_rows = rows, .logits = lg,
                        .in_hidden = in, .out_hidden = hid};
            rc = sd_eagle3_forward(h, &f, step == 0, err);
            o += (size_t)E3_T * (V + H);
            for (int i = 0; i < E3_T; i++)
                pos[i] += E3_T; /* the chain step's tokens follow */
        }
    }
    *n_out = o;
    sd_eagle3_free(h);
    sd_model_free(m);
    free(tdir);
    free(hdir);
    return rc;
}

TEST(eagle3_head_gives_the_same_bits_with_and_without_the_fused_ops)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    sd_ops plain_ops = *be->ops;
    plain_ops.matmul_add = NULL;
    plain_ops.rmsnorm_matmul = NULL;
    sd_backend plain = *be;
    plain.ops = &plain_ops;
    uint64_t rng = sd_test_seed();
    size_t na = (size_t)E3_T * 3 * 1024; /* room for 3 target widths of up to 1024 */
    float *aux = malloc(na * sizeof(float));
    for (size_t i = 0; i < na; i++)
        aux[i] = sd_test_randf(&rng, -2.0f, 2.0f);
    size_t cap = (size_t)2 * E3_T * (32768 + 1024);
    float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
    size_t n1 = 0, n2 = 0;
    sd_err err = {0};
    int rc = run_eagle3(be, aux, a, &n1, &err);
    if (!rc)
        rc = run_eagle3(&plain, aux, b, &n2, &err);
    int ok = !rc && n1 == n2 && n1 > 0 && !memcmp(a, b, n1 * sizeof(float));
    if (!rc)
        fprintf(stderr, "  eagle3 head: %zu floats, max|d| %.3g\n", n1, max_diff(a, b, n1));
    free(aux);
    free(a);
    free(b);
    sd_cpu_backend_destroy(be);
    ASSERT_MSG(!rc, "%s", err.msg);
    ASSERT_MSG(ok, "the EAGLE-3 head differs with the fused ops");
}

TEST_MAIN(T(fused_residual_path_gives_the_unfused_bits_on_every_fixture),
          T(eagle3_head_gives_the_same_bits_with_and_without_the_fused_ops))

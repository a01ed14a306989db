/* Block-scaled FP8 checkpoints (DeepSeek-V3 / Kimi-K2 / Qwen3 FP8's layout:
 * E4M3 "<name>" plus F32 "<name>_scale_inv", one scale a 128 x 128 block,
 * quantization_config naming the blocks). The bundled model's projections
 * are quantized here (blocks that do not divide its 96-, 80- and 64-wide
 * matrices included, the MTP layer's too) and written twice: as FP8, and as
 * the BF16 checkpoint of their values dequantized by the E4M3 definition
 * (not specd's decoder). Dequantized at load (--fp8-weights bf16), specd
 * gives both the same bits: logits, hidden states, one token at a time,
 * and MTP. Kept as FP8, each weight is E4M3 x scale in F32 (ops.h), not
 * rounded to BF16: near them (KEPT_BOUND), and the same greedy tokens on
 * 1 and 2 ranks. The FP8 model stays near the original (a sanity bound:
 * quantization moved it, not broke it). */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "../engine/engine_run.h"
#include "fixtures.h"
#include "fp8_ckpt.h"
#include "test.h"

/* kept FP8 weights against their BF16 dequantization: each weight differs
 * by its BF16 rounding (relative 2^-9 at most): the model's outputs by
 * ~1e-3 of their largest, the MTP layer's (which reads the model's hidden
 * states) by ~3e-2 */
#define KEPT_BOUND 1e-2
#define KEPT_MTP_BOUND 1e-1

/* Greedy tokens of ENGINE_GREEDY_REQS requests through an engine of dir
 * (MTP drafts, tp ranks, --fp8-weights w) into res. */
static int engine_tokens(const char *dir, const char *w, const char *tp, engine_out *res)
{
    const char *opts[] = {"model", dir, "spec", "mtp", "fp8-weights", w, "tp", tp, NULL};
    return engine_greedy(opts, res, 24);
}

TEST(fp8_checkpoint_gives_its_bf16_dequantization)
{
    char *src_dir, *cfg_text;
    if (bundled(&src_dir, &cfg_text))
        TEST_SKIP("no bundled model");
    sd_st *src = NULL;
    sd_err err = {0};
    ASSERT_MSG(sd_st_open(&src, src_dir, &err) == 0, "%s", err.msg);
    int nq = 0, partial = 0;
    for (int i = 0; i < sd_st_count(src); i++) {
        const sd_st_tensor *t = sd_st_at(src, i);
        if (quantized(t)) {
            nq++;
            partial += t->shape[0] % FP8_BLK || t->shape[1] % FP8_BLK;
        }
    }
    ASSERT_MSG(nq > 20 && partial > 0, "%d projections quantized, %d with partial blocks", nq,
               partial);
    char tmpl[] = "/tmp/sd_fp8_XXXXXX";
    ASSERT(mkdtemp(tmpl));
    char *d8 = sd_strfmt("%s/fp8", tmpl), *d16 = sd_strfmt("%s/bf16", tmpl);
    ASSERT_MSG(write_ckpt(src, cfg_text, d8, 0, &err) == 0, "%s", err.msg);
    ASSERT_MSG(write_ckpt(src, cfg_text, d16, 1, &err) == 0, "%s", err.msg);
    sd_st_close(src);

    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const int32_t ids[] = {0, 17, 230, 5, 991, 42, 8000, 3, 77, 1200, 64, 9, 512, 2048, 31, 600};
    const int n = (int)SD_ARRAY_LEN(ids);
    outs a, k, b, o;
    int V = 0, D = 0, ok = 1;
    int ra = run_model(be, d8, ids, n, &a, &V, &D, &err);
    ASSERT_MSG(ra == 0, "fp8: %s", err.msg);
    ASSERT_MSG(run_model_with(be, d8, (sd_model_opts){.fp8_keep = 1}, ids, n, &k, &V, &D, &err) == 0,
               "fp8 kept: %s", err.msg);
    ASSERT_MSG(run_model(be, d16, ids, n, &b, &V, &D, &err) == 0, "bf16: %s", err.msg);
    ASSERT_MSG(run_model(be, src_dir, ids, n, &o, &V, &D, &err) == 0, "original: %s", err.msg);
    /* which weights the kept model holds as FP8: every quantized projection
     * but those derived at load (MLA's absorbed kv_b) or whose stack starts
     * a part inside a block (q_a above kv_a: 128 + 80 rows is whole blocks,
     * so it stacks) */
    sd_model *mk = NULL;
    sd_model_opts mko = {.max_tokens = 8, .load_mtp = 1, .fp8_keep = 1};
    ASSERT_OK(sd_model_load(&mk, d8, be, &mko, &err));
    int kept = sd_model_fp8_kept(mk);
    size_t kept_bytes = sd_model_weight_bytes(mk);
    sd_model_free(mk);
    mko.fp8_keep = 0;
    ASSERT_OK(sd_model_load(&mk, d8, be, &mko, &err));
    size_t bf16_bytes = sd_model_weight_bytes(mk);
    sd_model_free(mk);
    fprintf(stderr, "  %d weights kept as fp8 (%d quantized projections): %zu bytes placed, %zu as bf16\n",
            kept, nq, kept_bytes, bf16_bytes);
    ASSERT_MSG(kept >= nq / 2, "%d weights kept as fp8", kept);
    ASSERT(kept_bytes < bf16_bytes);
    /* through the engine (--fp8-weights, MTP drafts, 1 and 2 ranks): the
     * tokens of the BF16 checkpoint */
    engine_out ref[ENGINE_GREEDY_REQS], got[ENGINE_GREEDY_REQS];
    static const char *const modes[][2] = {{"bf16", "1"}, {"fp8", "1"}, {"fp8", "2"}};
    for (size_t mi = 0; mi < SD_ARRAY_LEN(modes); mi++) {
        /* kept: the tokens of 1 rank (a near tie may go either way against
         * the BF16 checkpoint's) */
        if (mi != 2)
            ASSERT_OK(engine_tokens(mi == 0 ? d16 : d8, modes[mi][0], "1", ref));
        ASSERT_OK(engine_tokens(d8, modes[mi][0], modes[mi][1], got));
        for (int i = 0; i < ENGINE_GREEDY_REQS; i++) {
            ASSERT_MSG(got[i].n == 24 && got[i].n == ref[i].n &&
                           !memcmp(got[i].ids, ref[i].ids, sizeof got[i].ids[0] * 24),
                       "--fp8-weights %s --tp %s: request %d differs", modes[mi][0],
                       modes[mi][1], i);
        }
    }
    size_t nv = (size_t)n * V, nd = (size_t)n * D;
    ok &= same("fp8 / its bf16", "logits", a.logits, b.logits, nv);
    ok &= same("fp8 / its bf16", "hidden", a.hidden, b.hidden, nd);
    ok &= same("fp8 / its bf16", "decode", a.step, b.step, nv);
    ASSERT(a.has_mtp && b.has_mtp);
    ok &= same("fp8 / its bf16", "mtp logits", a.mtp, b.mtp, nv - V);
    ok &= same("fp8 / its bf16", "mtp hidden", a.mtp_hidden, b.mtp_hidden, nd - D);
    /* the weights kept as FP8 (the backend's weight_fp8): near */
    ASSERT(be->ops->weight_fp8);
    ok &= near("fp8 kept / bf16", "logits", k.logits, b.logits, nv, KEPT_BOUND);
    ok &= near("fp8 kept / bf16", "hidden", k.hidden, b.hidden, nd, KEPT_BOUND);
    ok &= near("fp8 kept / bf16", "decode", k.step, b.step, nv, KEPT_BOUND);
    ASSERT(k.has_mtp);
    ok &= near("fp8 kept / bf16", "mtp logits", k.mtp, b.mtp, nv - V, KEPT_MTP_BOUND);
    ok &= near("fp8 kept / bf16", "mtp hidden", k.mtp_hidden, b.mtp_hidden, nd - D, KEPT_MTP_BOUND);
    /* near the original: the logits move by a small part of their range */
    double dmax = max_diff(a.logits, o.logits, nv), range = max_abs(o.logits, nv);
    int agree = 0;
    for (int t = 0; t < n; t++) {
        int ia = 0, io = 0;
        for (int v = 1; v < V; v++) {
            ia = a.logits[(size_t)t * V + v] > a.logits[(size_t)t * V + ia] ? v : ia;
            io = o.logits[(size_t)t * V + v] > o.logits[(size_t)t * V + io] ? v : io;
        }
        agree += ia == io;
    }
    fprintf(stderr, "  fp8 against the original: max|d| %.3g of max|logit| %.3g, argmax %d/%d\n",
            dmax, range, agree, n);
    outs_free(&a);
    outs_free(&k);
    outs_free(&b);
    outs_free(&o);
    sd_cpu_backend_destroy(be);
    rm_ckpt(d8);
    rm_ckpt(d16);
    rmdir(tmpl);
    free(d8);
    free(d16);
    free(src_dir);
    free(cfg_text);
    ASSERT_MSG(ok, "the fp8 checkpoint differs from its dequantization");
    ASSERT_MSG(dmax < 0.2 * range && agree >= n - 3, "the fp8 model is far from the original");
}

/* A checkpoint of FP8 weights whose config does not say so is refused,
 * naming the tensor (missing scales: tests/core/test_safetensors.c). */
TEST(fp8_weights_without_their_config_are_refused_naming_the_tensor)
{
    char *src_dir, *cfg_text;
    if (bundled(&src_dir, &cfg_text))
        TEST_SKIP("no bundled model");
    sd_st *src = NULL;
    sd_err err = {0};
    ASSERT_OK(sd_st_open(&src, src_dir, &err));
    char tmpl[] = "/tmp/sd_fp8_XXXXXX";
    ASSERT(mkdtemp(tmpl));
    char *d8 = sd_strfmt("%s/fp8", tmpl);
    ASSERT_OK(write_ckpt(src, cfg_text, d8, 0, &err));
    sd_st_close(src);
    /* the config without quantization_config */
    char *p = sd_strfmt("%s/config.json", d8);
    FILE *f = fopen(p, "w");
    ASSERT(f);
    fputs(cfg_text, f);
    fclose(f);
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 1));
    sd_model *m = NULL;
    sd_model_opts mo = {.max_tokens = 16};
    ASSERT_EQ(sd_model_load(&m, d8, be, &mo, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "dtype F8_E4M3, and the config has no fp8 quantization_config");
    sd_cpu_backend_destroy(be);
    rm_ckpt(d8);
    rmdir(tmpl);
    free(p);
    free(d8);
    free(src_dir);
    free(cfg_text);
}

TEST_MAIN(T(fp8_checkpoint_gives_its_bf16_dequantization),
          T(fp8_weights_without_their_config_are_refused_naming_the_tensor))

/* Block-scaled FP8 checkpoints (DeepSeek-V3 / Kimi-K2 / Qwen3 FP8's layout:
 * E4M3 "<name>" plus F32 "<name>_scale_inv", one scale a 128 x 128 block,
 * quantization_config naming the blocks). The bundled model's projections
 * are quantized here (blocks that do not divide its 96-, 80- and 64-wide
 * matrices included, the MTP layer's too) and written twice: as FP8, and as
 * the BF16 checkpoint of their values dequantized by the E4M3 definition
 * (not specd's decoder). specd must give both the same bits: logits, hidden
 * states, one token at a time, and MTP. The FP8 model stays near the
 * original (a sanity bound: quantization moved it, not broke it). */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "../engine/engine_run.h"
#include "fixtures.h"
#include "test.h"

static float e4m3_value(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v = e ? ldexpf(1.0f + (float)m / 8, e - 7) : ldexpf((float)m / 8, -6);
    return b & 0x80 ? -v : v;
}

/* x (|x| <= 448) to the nearest E4M3 code, ties to the even code. */
static uint8_t e4m3_encode(float x)
{
    float a = fabsf(x);
    int lo = 0, hi = 126; /* positive finite codes, increasing in value */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (e4m3_value((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    float dl = a - e4m3_value((uint8_t)lo), dh = e4m3_value((uint8_t)hi) - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return (uint8_t)(c | (x < 0 ? 0x80 : 0));
}

static int quantized(const sd_st_tensor *t)
{
    size_t n = strlen(t->name);
    return t->ndim == 2 && n > 12 && !strcmp(t->name + n - 12, "_proj.weight");
}

#define BLK 128

/* Writes dir/model.safetensors (FP8 where quantized, else the tensor) or,
 * with as_bf16, the dequantized values; and dir/config.json. */
static int write_ckpt(const sd_st *src, const char *cfg_text, const char *dir, int as_bf16,
                      sd_err *err)
{
    mkdir(dir, 0700);
    int n = sd_st_count(src), k = 0;
    sd_st_tensor *out = calloc((size_t)n * 2, sizeof *out);
    void **bufs = calloc((size_t)n * 2, sizeof *bufs);
    char **names = calloc((size_t)n, sizeof *names);
    int nb = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        const sd_st_tensor *t = sd_st_at(src, i);
        if (!quantized(t)) {
            out[k++] = *t;
            continue;
        }
        int64_t R = t->shape[0], C = t->shape[1];
        int64_t SR = (R + BLK - 1) / BLK, SC = (C + BLK - 1) / BLK;
        uint8_t *q = malloc((size_t)(R * C));
        float *sc = malloc((size_t)(SR * SC) * sizeof *sc);
        for (int64_t br = 0; br < SR; br++)
            for (int64_t bc = 0; bc < SC; bc++) {
                float amax = 0;
                for (int64_t r = br * BLK; r < R && r < (br + 1) * BLK; r++)
                    for (int64_t c = bc * BLK; c < C && c < (bc + 1) * BLK; c++)
                        amax = fmaxf(amax, fabsf(sd_load_f32(t->data, t->dtype, (size_t)(r * C + c))));
                float s = amax > 0 ? amax / 448.0f : 1.0f;
                sc[br * SC + bc] = s;
                for (int64_t r = br * BLK; r < R && r < (br + 1) * BLK; r++)
                    for (int64_t c = bc * BLK; c < C && c < (bc + 1) * BLK; c++) {
                        float x = sd_load_f32(t->data, t->dtype, (size_t)(r * C + c)) / s;
                        q[r * C + c] = e4m3_encode(fminf(fmaxf(x, -448.0f), 448.0f));
                    }
            }
        if (as_bf16) {
            uint16_t *w = malloc((size_t)(R * C) * sizeof *w);
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    w[r * C + c] = sd_f32_to_bf16(e4m3_value(q[r * C + c]) * sc[(r / BLK) * SC + c / BLK]);
            out[k] = *t;
            out[k].dtype = SD_DT_BF16;
            out[k].data = w;
            out[k++].nbytes = (size_t)(R * C) * sizeof *w;
            bufs[nb++] = w;
            free(q);
            free(sc);
        } else {
            out[k] = *t;
            out[k].dtype = SD_DT_F8_E4M3;
            out[k].data = q;
            out[k++].nbytes = (size_t)(R * C);
            names[i] = sd_strfmt("%s_scale_inv", t->name);
            out[k] = (sd_st_tensor){.name = names[i], .dtype = SD_DT_F32, .ndim = 2,
                                    .shape = {SR, SC}, .data = sc,
                                    .nbytes = (size_t)(SR * SC) * sizeof *sc};
            k++;
            bufs[nb++] = q;
            bufs[nb++] = sc;
        }
    }
    char *p = sd_strfmt("%s/model.safetensors", dir);
    rc = sd_st_write(p, out, k, NULL, err);
    free(p);
    /* the config, with quantization_config for the FP8 one */
    json_error_t je;
    json_t *cfg = json_loads(cfg_text, 0, &je);
    if (!as_bf16)
        json_object_set_new(cfg, "quantization_config",
                            json_pack("{s:s, s:s, s:s, s:[i,i]}", "activation_scheme", "dynamic",
                                      "fmt", "e4m3", "quant_method", "fp8", "weight_block_size",
                                      BLK, BLK));
    p = sd_strfmt("%s/config.json", dir);
    if (!rc && json_dump_file(cfg, p, 0))
        rc = sd_err_set(err, SD_EIO, "%s: cannot write", p);
    free(p);
    json_decref(cfg);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(bufs);
    free(names);
    free(out);
    return rc;
}

/* The bundled model's folder and its config.json's text (0), or 1 when it
 * is not there. */
static int bundled(char **dir, char **cfg_text)
{
    *dir = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    char *cfg_path = sd_strfmt("%s/config.json", *dir);
    size_t len = 0;
    sd_err err = {0};
    *cfg_text = NULL;
    int rc = sd_read_file(cfg_path, cfg_text, &len, &err) || !sd_dir_exists(*dir);
    free(cfg_path);
    if (rc) {
        free(*dir);
        free(*cfg_text);
    }
    return rc;
}

/* Greedy tokens of ENGINE_GREEDY_REQS requests through an engine of dir
 * (MTP drafts, tp ranks, --fp8-weights w) into res. */
static int engine_tokens(const char *dir, const char *w, const char *tp, engine_out *res)
{
    const char *opts[] = {"model", dir, "spec", "mtp", "fp8-weights", w, "tp", tp, NULL};
    return engine_greedy(opts, res, 24);
}

TEST(fp8_checkpoint_gives_the_bits_of_its_bf16_dequantization)
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
            partial += t->shape[0] % BLK || t->shape[1] % BLK;
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
    ASSERT_OK(engine_tokens(d16, "bf16", "1", ref));
    static const char *const modes[][2] = {{"bf16", "1"}, {"fp8", "1"}, {"fp8", "2"}};
    for (size_t mi = 0; mi < SD_ARRAY_LEN(modes); mi++) {
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
    /* the weights kept as FP8 (the backend's weight_fp8): the same bits */
    ASSERT(be->ops->weight_fp8);
    ok &= same("fp8 kept / bf16", "logits", k.logits, b.logits, nv);
    ok &= same("fp8 kept / bf16", "hidden", k.hidden, b.hidden, nd);
    ok &= same("fp8 kept / bf16", "decode", k.step, b.step, nv);
    ASSERT(k.has_mtp);
    ok &= same("fp8 kept / bf16", "mtp logits", k.mtp, b.mtp, nv - V);
    ok &= same("fp8 kept / bf16", "mtp hidden", k.mtp_hidden, b.mtp_hidden, nd - D);
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

TEST_MAIN(T(fp8_checkpoint_gives_the_bits_of_its_bf16_dequantization),
          T(fp8_weights_without_their_config_are_refused_naming_the_tensor))

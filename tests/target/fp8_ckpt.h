/* Block-scaled FP8 checkpoints written for tests (DeepSeek-V3 / Kimi-K2 /
 * Qwen3 FP8's layout: E4M3 "<name>" plus F32 "<name>_scale_inv", one scale
 * a 128 x 128 block, quantization_config naming the blocks): a checkpoint's
 * projections quantized, written as FP8 or as the BF16 checkpoint of their
 * values dequantized by the E4M3 definition (not specd's decoder). Used by
 * tests/target/test_fp8.c (CPU) and tests/gpu/test_model.c (CUDA). */
#ifndef SD_TESTS_TARGET_FP8_CKPT_H
#define SD_TESTS_TARGET_FP8_CKPT_H

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/err.h"
#include "core/safetensors.h"
#include "core/util.h"
#include "test.h"

static inline float e4m3_value(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v = e ? ldexpf(1.0f + (float)m / 8, e - 7) : ldexpf((float)m / 8, -6);
    return b & 0x80 ? -v : v;
}

/* x (|x| <= 448) to the nearest E4M3 code, ties to the even code. */
static inline uint8_t e4m3_encode(float x)
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

static inline int quantized(const sd_st_tensor *t)
{
    size_t n = strlen(t->name);
    return t->ndim == 2 && n > 12 && !strcmp(t->name + n - 12, "_proj.weight");
}

#define FP8_BLK 128

/* Writes dir/model.safetensors (FP8 where quantized, else the tensor) or,
 * with as_bf16, the dequantized values; and dir/config.json. */
static inline int write_ckpt(const sd_st *src, const char *cfg_text, const char *dir, int as_bf16,
                      sd_err *err)
{
    mkdir(dir, 0700);
    int n = sd_st_count(src), k = 0;
    sd_st_tensor *out = (sd_st_tensor *)calloc((size_t)n * 2, sizeof *out);
    void **bufs = (void **)calloc((size_t)n * 2, sizeof *bufs);
    char **names = (char **)calloc((size_t)n, sizeof *names);
    int nb = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        const sd_st_tensor *t = sd_st_at(src, i);
        if (!quantized(t)) {
            out[k++] = *t;
            continue;
        }
        int64_t R = t->shape[0], C = t->shape[1];
        int64_t SR = (R + FP8_BLK - 1) / FP8_BLK, SC = (C + FP8_BLK - 1) / FP8_BLK;
        uint8_t *q = (uint8_t *)malloc((size_t)(R * C));
        float *sc = (float *)malloc((size_t)(SR * SC) * sizeof *sc);
        for (int64_t br = 0; br < SR; br++)
            for (int64_t bc = 0; bc < SC; bc++) {
                float amax = 0;
                for (int64_t r = br * FP8_BLK; r < R && r < (br + 1) * FP8_BLK; r++)
                    for (int64_t c = bc * FP8_BLK; c < C && c < (bc + 1) * FP8_BLK; c++)
                        amax = fmaxf(amax, fabsf(sd_load_f32(t->data, t->dtype, (size_t)(r * C + c))));
                float s = amax > 0 ? amax / 448.0f : 1.0f;
                sc[br * SC + bc] = s;
                for (int64_t r = br * FP8_BLK; r < R && r < (br + 1) * FP8_BLK; r++)
                    for (int64_t c = bc * FP8_BLK; c < C && c < (bc + 1) * FP8_BLK; c++) {
                        float x = sd_load_f32(t->data, t->dtype, (size_t)(r * C + c)) / s;
                        q[r * C + c] = e4m3_encode(fminf(fmaxf(x, -448.0f), 448.0f));
                    }
            }
        if (as_bf16) {
            uint16_t *w = (uint16_t *)malloc((size_t)(R * C) * sizeof *w);
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    w[r * C + c] = sd_f32_to_bf16(e4m3_value(q[r * C + c]) * sc[(r / FP8_BLK) * SC + c / FP8_BLK]);
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
                                      FP8_BLK, FP8_BLK));
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
static inline int bundled(char **dir, char **cfg_text)
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

#endif

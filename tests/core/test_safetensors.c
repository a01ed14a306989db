/* tests/core/test_safetensors: the reader against files the writer made, then
 * against the same files damaged byte by byte. Every bad file must give its
 * error code and a message naming the file and the tensor (or key). */
#include <math.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "test.h"

/* ---- scratch folders, removed at exit even when an assert returns early ---- */

static char sd_tmp_dirs[64][64];
static int sd_ntmp;

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void rm_all_tmp(void)
{
    for (int i = 0; i < sd_ntmp; i++)
        rm_tree(sd_tmp_dirs[i]);
}

static const char *tmpdir(void)
{
    if (sd_ntmp == 0)
        atexit(rm_all_tmp);
    if (sd_ntmp == 64)
        abort();
    char *d = sd_tmp_dirs[sd_ntmp];
    snprintf(d, 64, "/tmp/sd_st_XXXXXX");
    if (!mkdtemp(d))
        abort();
    sd_ntmp++;
    return d;
}

static char *path_in(const char *dir, const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* ---- file bytes ---- */

static uint8_t *slurp(const char *path, size_t *len)
{
    char *d = NULL;
    sd_err err = {0};
    if (sd_read_file(path, &d, len, &err) != 0)
        return NULL;
    return (uint8_t *)d;
}

static int spit(const char *path, const uint8_t *d, size_t len)
{
    sd_err err = {0};
    return sd_write_file(path, d, len, &err);
}

static uint64_t header_len(const uint8_t *d)
{
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = (h << 8) | d[i];
    return h;
}

/* Replaces the first `from` inside the header with `to` (same length), so the
 * damage stays a header edit and offsets elsewhere do not move. */
static int patch_header(const char *path, const char *from, const char *to)
{
    size_t len;
    uint8_t *d = slurp(path, &len);
    if (!d || strlen(from) != strlen(to))
        return -1;
    uint64_t hl = header_len(d);
    char *hdr = (char *)d + 8;
    char save = hdr[hl];
    hdr[hl] = 0;
    char *at = strstr(hdr, from);
    hdr[hl] = save;
    if (!at) {
        free(d);
        return -1;
    }
    memcpy(at, to, strlen(to));
    int rc = spit(path, d, len);
    free(d);
    return rc;
}

/* ---- a small checkpoint of every dtype ---- */

enum { NT = 7 };

typedef struct ckpt {
    sd_st_tensor t[NT];
    uint16_t bf[3 * 5];
    float bf_src[3 * 5];
    float f32[4];
    uint16_t f16[2 * 3];
    int64_t i64[6];
    uint8_t bl[7];
    int32_t i32[1];
} ckpt;

static uint64_t rng_state(void)
{
    uint64_t s = sd_test_seed();
    return s ? s : 1;
}

static void make_ckpt(ckpt *c, uint64_t *rs)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 15; i++) {
        c->bf_src[i] = sd_test_randf(rs, -4.0f, 4.0f);
        c->bf[i] = sd_f32_to_bf16(c->bf_src[i]);
    }
    for (int i = 0; i < 4; i++)
        c->f32[i] = sd_test_randf(rs, -1e3f, 1e3f);
    for (int i = 0; i < 6; i++)
        c->f16[i] = sd_f32_to_f16(sd_test_randf(rs, -2.0f, 2.0f));
    for (int i = 0; i < 6; i++) /* EAGLE-3 d2t-style offsets */
        c->i64[i] = (int64_t)(sd_test_randf(rs, 0, 1e6f)) - 500000;
    for (int i = 0; i < 7; i++)
        c->bl[i] = sd_test_randf(rs, 0, 1) < 0.5f;
    c->i32[0] = (int32_t)sd_test_randf(rs, -1e6f, 1e6f);
    /* Input order mixes element sizes on purpose: the writer must still put
     * every tensor on a multiple of its element size. */
    c->t[0] = (sd_st_tensor){.name = "model.embed_tokens.weight",
                             .dtype = SD_DT_BF16,
                             .ndim = 2,
                             .shape = {3, 5},
                             .data = c->bf,
                             .nbytes = sizeof c->bf};
    c->t[1] = (sd_st_tensor){.name = "t2d",
                             .dtype = SD_DT_BOOL,
                             .ndim = 1,
                             .shape = {7},
                             .data = c->bl,
                             .nbytes = sizeof c->bl};
    c->t[2] = (sd_st_tensor){.name = "norm.weight",
                             .dtype = SD_DT_F32,
                             .ndim = 1,
                             .shape = {4},
                             .data = c->f32,
                             .nbytes = sizeof c->f32};
    c->t[3] = (sd_st_tensor){.name = "d2t",
                             .dtype = SD_DT_I64,
                             .ndim = 1,
                             .shape = {6},
                             .data = c->i64,
                             .nbytes = sizeof c->i64};
    c->t[4] = (sd_st_tensor){.name = "half",
                             .dtype = SD_DT_F16,
                             .ndim = 2,
                             .shape = {2, 3},
                             .data = c->f16,
                             .nbytes = sizeof c->f16};
    c->t[5] = (sd_st_tensor){.name = "scalar_i32",
                             .dtype = SD_DT_I32,
                             .ndim = 0,
                             .data = c->i32,
                             .nbytes = sizeof c->i32};
    c->t[6] = (sd_st_tensor){
        .name = "empty", .dtype = SD_DT_U8, .ndim = 2, .shape = {0, 4}, .data = NULL, .nbytes = 0};
}

/* Is p inside a mapping of the file named base (per /proc/self/maps)? */
static int in_file_mapping(const void *p, const char *base)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2)
            continue;
        line[strcspn(line, "\n")] = 0;
        size_t ll = strlen(line), bl = strlen(base);
        if (ll > bl && strcmp(line + ll - bl, base) == 0 && line[ll - bl - 1] == '/' &&
            (uintptr_t)p >= lo && (uintptr_t)p < hi)
            found = 1;
    }
    fclose(f);
    return found;
}

/* Two BF16 tensors: x [2] at data [0,4), y [3] at [4,10). */
static const char *write_xy(const char *dir, const char *name)
{
    static uint16_t v[5] = {0x3f80, 0x4000, 0xc040, 0x4080, 0x0001};
    sd_st_tensor t[2] = {
        {.name = "x", .dtype = SD_DT_BF16, .ndim = 1, .shape = {2}, .data = v, .nbytes = 4},
        {.name = "y", .dtype = SD_DT_BF16, .ndim = 1, .shape = {3}, .data = v + 2, .nbytes = 6},
    };
    const char *p = path_in(dir, name);
    sd_err err = {0};
    if (sd_st_write(p, t, 2, NULL, &err) != 0) {
        fprintf(stderr, "  write_xy: %s\n", err.msg);
        return NULL;
    }
    return p;
}

/* ---- happy paths ---- */

TEST(written_file_reads_back_exactly_from_the_mapping)
{
    uint64_t rs = rng_state();
    ckpt c;
    make_ckpt(&c, &rs);
    const char *dir = tmpdir();
    const char *p = path_in(dir, "model.safetensors");
    sd_err err = {0};
    ASSERT_MSG(sd_st_write(p, c.t, NT, "{\"format\":\"pt\"}", &err) == 0, "%s", err.msg);

    size_t len;
    uint8_t *raw = slurp(p, &len);
    ASSERT(raw);
    uint64_t hl = header_len(raw);
    ASSERT_EQ(hl % 8, 0);
    ASSERT_LE(8 + hl, len);
    ASSERT(memmem(raw + 8, hl, "\"__metadata__\":{\"format\":\"pt\"}", 30) != NULL);
    free(raw);

    sd_st *st;
    ASSERT_MSG(sd_st_open(&st, p, &err) == 0, "%s", err.msg);
    ASSERT_EQ(sd_st_count(st), NT);
    for (int i = 0; i < NT; i++) {
        const sd_st_tensor *t = sd_st_find(st, c.t[i].name);
        ASSERT_MSG(t, "%s", c.t[i].name);
        ASSERT_STR_EQ(t->name, c.t[i].name);
        ASSERT_STR_EQ(t->file, "model.safetensors");
        ASSERT_EQ(t->dtype, c.t[i].dtype);
        ASSERT_EQ(t->ndim, c.t[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            ASSERT_EQ(t->shape[d], c.t[i].shape[d]);
        ASSERT_EQ(t->nbytes, c.t[i].nbytes);
        ASSERT_EQ((uintptr_t)t->data % sd_dtype_size(t->dtype), 0);
        if (t->nbytes) {
            ASSERT_MSG(memcmp(t->data, c.t[i].data, t->nbytes) == 0, "%s", t->name);
            ASSERT_MSG(in_file_mapping(t->data, "model.safetensors") == 1,
                       "%s data is not in the file's mapping", t->name);
        }
    }
    /* bf16 values survive bit for bit: the rounded value, not the source. */
    const sd_st_tensor *e = sd_st_find(st, "model.embed_tokens.weight");
    for (int i = 0; i < 15; i++) {
        float got = sd_load_f32(e->data, SD_DT_BF16, (size_t)i);
        ASSERT_EQ(((const uint16_t *)e->data)[i], c.bf[i]);
        ASSERT_NEAR(got, sd_bf16_to_f32(c.bf[i]), 0);
        ASSERT_NEAR(got, c.bf_src[i], fabsf(c.bf_src[i]) * (1.0f / 128));
    }
    /* sd_st_at walks every tensor once, in name order. */
    for (int i = 1; i < sd_st_count(st); i++)
        ASSERT_LT(strcmp(sd_st_at(st, i - 1)->name, sd_st_at(st, i)->name), 0);
    ASSERT(sd_st_at(st, NT) == NULL);
    ASSERT(sd_st_find(st, "nope") == NULL);
    sd_st_close(st);
}

TEST(expect_checks_shape_and_names_file_and_tensor)
{
    uint64_t rs = rng_state();
    ckpt c;
    make_ckpt(&c, &rs);
    const char *dir = tmpdir();
    const char *p = path_in(dir, "model.safetensors");
    sd_err err = {0};
    ASSERT_OK(sd_st_write(p, c.t, NT, NULL, &err));
    sd_st *st;
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);

    const sd_st_tensor *t = NULL;
    int64_t good[2] = {3, 5}, bad[2] = {5, 3};
    ASSERT_OK(sd_st_expect(st, "model.embed_tokens.weight", 2, good, &t, &err));
    ASSERT(t && t == sd_st_find(st, "model.embed_tokens.weight"));

    ASSERT_EQ(sd_st_expect(st, "model.embed_tokens.weight", 2, bad, &t, &err), SD_EFORMAT);
    ASSERT(t == NULL);
    char want[1024];
    snprintf(want, sizeof want,
             "%s/model.safetensors: tensor model.embed_tokens.weight: shape [3,5] does not "
             "match the config (expected [5,3])",
             dir);
    ASSERT_STR_EQ(err.msg, want);

    int64_t one[1] = {15};
    ASSERT_EQ(sd_st_expect(st, "model.embed_tokens.weight", 1, one, NULL, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "expected [15]");

    ASSERT_EQ(sd_st_expect(st, "lm_head.weight", 2, good, &t, &err), SD_ENOENT);
    snprintf(want, sizeof want, "%s: tensor lm_head.weight is missing", dir);
    ASSERT_STR_EQ(err.msg, want);

    ASSERT_OK(sd_st_expect(st, "scalar_i32", 0, NULL, &t, &err));
    ASSERT_EQ(*(const int32_t *)t->data, c.i32[0]);
    sd_st_close(st);
}

/* E4M3 by its definition, apart from the bit-building decoder: sign,
 * (1 + m/8) 2^(e-7), subnormals m/8 2^-6, S.1111.111 NaN. */
static float e4m3_by_definition(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7)
        return NAN;
    float v = e ? ldexpf(1.0f + (float)m / 8, e - 7) : ldexpf((float)m / 8, -6);
    return b & 0x80 ? -v : v;
}

TEST(fp8_e4m3_decodes_every_code_as_defined)
{
    for (int b = 0; b < 256; b++) {
        float got = sd_fp8_e4m3_to_f32((uint8_t)b), want = e4m3_by_definition((uint8_t)b);
        if (isnan(want))
            ASSERT_MSG(isnan(got), "code 0x%02x: %g, want NaN", b, got);
        else
            ASSERT_MSG(got == want && signbit(got) == signbit(want), "code 0x%02x: %g, want %g", b,
                       got, want);
        ASSERT(sd_load_f32(&(uint8_t){(uint8_t)b}, SD_DT_F8_E4M3, 0) == got || isnan(got));
    }
    ASSERT(sd_fp8_e4m3_to_f32(0x7e) == 448.0f);
    ASSERT(sd_fp8_e4m3_to_f32(0x38) == 1.0f);
    ASSERT(sd_fp8_e4m3_to_f32(0x01) == ldexpf(1, -9));
}

/* DeepSeek-V3 style: an F8_E4M3 weight [R, C] and its F32 block scales
 * [ceil(R/bm), ceil(C/bn)], written to dir (blocks that do not divide it). */
#define FP8_R 5
#define FP8_C 7
static void write_fp8(const char *dir, uint8_t *w, float *s, int scale_rows)
{
    for (int i = 0; i < FP8_R * FP8_C; i++)
        w[i] = (uint8_t)(i * 37 + 11) == 0x7f || (uint8_t)(i * 37 + 11) == 0xff
                   ? 0x30
                   : (uint8_t)(i * 37 + 11);
    for (int i = 0; i < 3 * 2; i++)
        s[i] = ldexpf(1.5f, i - 3);
    sd_st_tensor t[2] = {
        {.name = "model.layers.0.mlp.down_proj.weight", .dtype = SD_DT_F8_E4M3, .ndim = 2,
         .shape = {FP8_R, FP8_C}, .data = w,
         .nbytes = (size_t)FP8_R * FP8_C},
        {.name = "model.layers.0.mlp.down_proj.weight_scale_inv", .dtype = SD_DT_F32, .ndim = 2,
         .shape = {scale_rows, 2}, .data = s, .nbytes = (size_t)scale_rows * 2 * sizeof(float)},
    };
    sd_err err = {0};
    ASSERT_OK(sd_st_write(path_in(dir, "model-00001-of-00001.safetensors"), t, 2, NULL, &err));
}

TEST(fp8_weights_are_refused_without_block_scales_and_dequantized_with_them)
{
    uint8_t w[FP8_R * FP8_C];
    float s[3 * 2];
    const char *dir = tmpdir();
    write_fp8(dir, w, s, 3);
    sd_err err = {0};
    sd_st *st;
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);
    const char *name = "model.layers.0.mlp.down_proj.weight";
    const sd_st_tensor *w8 = sd_st_find(st, name);
    ASSERT(w8 && w8->dtype == SD_DT_F8_E4M3 && w8->nbytes == sizeof w);
    int64_t shape[2] = {FP8_R, FP8_C};
    ASSERT_EQ(sd_st_expect(st, name, 2, shape, NULL, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "model-00001-of-00001.safetensors: tensor "
                             "model.layers.0.mlp.down_proj.weight: dtype F8_E4M3, and the config "
                             "has no fp8 quantization_config");
    /* blocks of 2 x 4: scales [3, 2] */
    ASSERT_OK(sd_st_fp8_blocks(st, 2, 4));
    const sd_st_tensor *t;
    ASSERT_MSG(sd_st_expect(st, name, 2, shape, &t, &err) == 0, "%s", err.msg);
    ASSERT_EQ(t->dtype, SD_DT_BF16);
    ASSERT_EQ(t->nbytes, sizeof w * 2);
    for (int r = 0; r < FP8_R; r++)
        for (int c = 0; c < FP8_C; c++) {
            float want = e4m3_by_definition(w[r * FP8_C + c]) * s[(r / 2) * 2 + c / 4];
            uint16_t got = ((const uint16_t *)t->data)[r * FP8_C + c];
            ASSERT_MSG(got == sd_f32_to_bf16(want), "[%d, %d]: %g, want %g", r, c,
                       sd_bf16_to_f32(got), want);
        }
    /* a second load is the same copy */
    const sd_st_tensor *t2;
    ASSERT_OK(sd_st_expect(st, name, 2, shape, &t2, &err));
    ASSERT(t2->data == t->data);
    sd_st_close(st);

    /* scales of the wrong shape; none at all */
    const char *bad = tmpdir();
    write_fp8(bad, w, s, 2);
    ASSERT_OK(sd_st_open(&st, bad, &err));
    ASSERT_OK(sd_st_fp8_blocks(st, 2, 4));
    ASSERT_EQ(sd_st_expect(st, name, 2, shape, NULL, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "tensor model.layers.0.mlp.down_proj.weight_scale_inv: shape [2,2] "
                             "does not match model.layers.0.mlp.down_proj.weight's blocks of 2 x 4 "
                             "(expected [3,2])");
    sd_st_close(st);
    sd_st_tensor only = {.name = name, .dtype = SD_DT_F8_E4M3, .ndim = 2, .shape = {FP8_R, FP8_C},
                         .data = w, .nbytes = sizeof w};
    const char *none = tmpdir();
    ASSERT_OK(sd_st_write(path_in(none, "model.safetensors"), &only, 1, NULL, &err));
    ASSERT_OK(sd_st_open(&st, none, &err));
    ASSERT_OK(sd_st_fp8_blocks(st, 128, 128));
    ASSERT_EQ(sd_st_expect(st, name, 2, shape, NULL, &err), SD_ENOENT);
    ASSERT_CONTAINS(err.msg, "tensor model.layers.0.mlp.down_proj.weight is F8_E4M3 and its "
                             "scales model.layers.0.mlp.down_proj.weight_scale_inv are missing");
    sd_st_close(st);
}

/* A file of no tensors opens, holding none (it once handed qsort a null
 * array: UBSan). */
TEST(file_without_tensors_opens_empty)
{
    const char *dir = tmpdir();
    sd_err err = {0};
    ASSERT_OK(sd_st_write(path_in(dir, "model.safetensors"), NULL, 0, NULL, &err));
    sd_st *st;
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);
    ASSERT_EQ(sd_st_count(st), 0);
    ASSERT(!sd_st_find(st, "x"));
    sd_st_close(st);
}

TEST(sharded_folder_opens_through_its_index)
{
    uint64_t rs = rng_state();
    ckpt c;
    make_ckpt(&c, &rs);
    const char *dir = tmpdir();
    sd_err err = {0};
    /* tensors 0..3 in shard 1, 4..6 in shard 2 */
    ASSERT_OK(sd_st_write(path_in(dir, "model-00001-of-00002.safetensors"), c.t, 4, NULL, &err));
    ASSERT_OK(
        sd_st_write(path_in(dir, "model-00002-of-00002.safetensors"), c.t + 4, 3, NULL, &err));
    char idx[4096];
    int o = snprintf(idx, sizeof idx, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (int i = 0; i < NT; i++)
        o += snprintf(idx + o, sizeof idx - (size_t)o,
                      "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", c.t[i].name,
                      i < 4 ? 1 : 2);
    snprintf(idx + o, sizeof idx - (size_t)o, "}}");
    ASSERT_OK(
        spit(path_in(dir, "model.safetensors.index.json"), (const uint8_t *)idx, strlen(idx)));
    /* A stray file the index does not name is not read. */
    ASSERT_OK(spit(path_in(dir, "stray.safetensors"), (const uint8_t *)"junk", 4));

    sd_st *st;
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);
    ASSERT_EQ(sd_st_count(st), NT);
    for (int i = 0; i < NT; i++) {
        const sd_st_tensor *t = sd_st_find(st, c.t[i].name);
        ASSERT_MSG(t, "%s", c.t[i].name);
        ASSERT_STR_EQ(t->file, i < 4 ? "model-00001-of-00002.safetensors"
                                     : "model-00002-of-00002.safetensors");
        ASSERT(t->nbytes == 0 || memcmp(t->data, c.t[i].data, t->nbytes) == 0);
        if (t->nbytes)
            ASSERT_EQ(in_file_mapping(t->data, t->file), 1);
    }
    sd_st_close(st);
}

TEST(folder_without_index_takes_model_safetensors_else_every_shard)
{
    const char *dir = tmpdir();
    sd_err err = {0};
    sd_st *st;
    ASSERT_EQ(sd_st_open(&st, dir, &err), SD_ENOENT);
    ASSERT_CONTAINS(err.msg, dir);
    ASSERT_CONTAINS(err.msg, "model.safetensors");

    ASSERT(write_xy(dir, "b.safetensors"));
    uint16_t z[1] = {0x3f80};
    sd_st_tensor tz = {
        .name = "z", .dtype = SD_DT_BF16, .ndim = 1, .shape = {1}, .data = z, .nbytes = 2};
    ASSERT_OK(sd_st_write(path_in(dir, "a.safetensors"), &tz, 1, NULL, &err));
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);
    ASSERT_EQ(sd_st_count(st), 3);
    ASSERT_STR_EQ(sd_st_find(st, "z")->file, "a.safetensors");
    ASSERT_STR_EQ(sd_st_find(st, "y")->file, "b.safetensors");
    sd_st_close(st);

    /* model.safetensors, when present, is the checkpoint. */
    ASSERT_OK(sd_st_write(path_in(dir, "model.safetensors"), &tz, 1, NULL, &err));
    ASSERT_MSG(sd_st_open(&st, dir, &err) == 0, "%s", err.msg);
    ASSERT_EQ(sd_st_count(st), 1);
    sd_st_close(st);
}

/* ---- bad checkpoints: one clear error each ---- */

TEST(truncated_file_names_file_and_tensor)
{
    const char *dir = tmpdir();
    const char *p = write_xy(dir, "trunc.safetensors");
    ASSERT(p);
    struct stat sb;
    ASSERT_OK(stat(p, &sb));
    ASSERT_OK(truncate(p, sb.st_size - 3));
    sd_st *st = NULL;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT(st == NULL);
    ASSERT_CONTAINS(err.msg, "trunc.safetensors");
    ASSERT_CONTAINS(err.msg, "tensor y");
    ASSERT_CONTAINS(err.msg, "truncated");

    /* Cut inside the 8-byte length itself. */
    ASSERT_OK(truncate(p, 5));
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "trunc.safetensors: truncated file: 5 bytes");
}

TEST(header_length_past_the_end_is_refused)
{
    const char *dir = tmpdir();
    const char *p = write_xy(dir, "hl.safetensors");
    ASSERT(p);
    size_t len;
    uint8_t *d = slurp(p, &len);
    ASSERT(d);
    uint64_t bogus = len; /* 8 + len > len */
    for (int i = 0; i < 8; i++)
        d[i] = (uint8_t)(bogus >> (8 * i));
    ASSERT_OK(spit(p, d, len));
    sd_st *st;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "hl.safetensors: header length");
    ASSERT_CONTAINS(err.msg, "runs past the end of the file");
    /* All ones: the largest u64 must not wrap any size arithmetic. */
    memset(d, 0xff, 8);
    ASSERT_OK(spit(p, d, len));
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "header length 18446744073709551615");
    free(d);
}

TEST(malformed_header_json_is_refused)
{
    const char *dir = tmpdir();
    const char *p = write_xy(dir, "bad.safetensors");
    ASSERT(p);
    ASSERT_OK(patch_header(p, "\"y\":{", "\"y\":["));
    sd_st *st;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "bad.safetensors: malformed header JSON");

    /* Valid JSON that is not an object. */
    uint8_t raw[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '[', '1', ',', '2', ']', ' ', ' ', ' '};
    p = path_in(dir, "arr.safetensors");
    ASSERT_OK(spit(p, raw, sizeof raw));
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "arr.safetensors: header JSON is not an object");
    /* The same key twice in one header. */
    p = write_xy(dir, "dup.safetensors");
    ASSERT_OK(patch_header(p, "\"y\":", "\"x\":"));
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "dup.safetensors: malformed header JSON");
    ASSERT_CONTAINS(err.msg, "duplicate object key");
}

TEST(unknown_dtype_names_tensor_and_dtype)
{
    const char *dir = tmpdir();
    const char *p = write_xy(dir, "dt.safetensors");
    ASSERT(p);
    ASSERT_OK(patch_header(p, "\"y\":{\"dtype\":\"BF16\"", "\"y\":{\"dtype\":\"Q4_K\""));
    sd_st *st;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "dt.safetensors: tensor y: unknown dtype \"Q4_K\"");
}

TEST(bad_data_offsets_name_file_and_tensor)
{
    const char *dir = tmpdir();
    sd_st *st;
    sd_err err = {0};
    struct {
        const char *from, *to, *msg;
    } cases[] = {
        /* past the data section (10 bytes) */
        {"\"data_offsets\":[4,10]", "\"data_offsets\":[4,99]",
         "tensor y: data_offsets [4,99] run past the end"},
        {"\"data_offsets\":[4,10]", "\"data_offsets\":[9,10]",
         "tensor y: data_offsets [9,10] hold 1 bytes but shape [3] of BF16 needs 6"},
        {"\"data_offsets\":[4,10]", "\"data_offsets\":[10,4]",
         "tensor y: data_offsets [10,4] are inverted"},
        {"\"data_offsets\":[4,10]", "\"data_offsets\":[-4,1]",
         "tensor y: data_offsets is not a pair"},
        {"\"shape\":[3]", "\"shape\":[4]",
         "tensor y: data_offsets [4,10] hold 6 bytes but shape [4] of BF16 needs 8"},
        {"\"shape\":[3]", "\"shape\":\"3\"", "tensor y: shape is not an array"},
        {"\"dtype\":\"BF16\",\"shape\":[3]", "\"dtyqe\":\"BF16\",\"shape\":[3]",
         "tensor y: header entry lacks \"dtype\""},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        const char *p = write_xy(dir, "off.safetensors");
        ASSERT(p);
        ASSERT_MSG(patch_header(p, cases[i].from, cases[i].to) == 0, "case %zu", i);
        int rc = sd_st_open(&st, p, &err);
        ASSERT_MSG(rc == SD_EFORMAT, "case %zu: rc %d", i, rc);
        ASSERT_CONTAINS(err.msg, "off.safetensors: ");
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
}

TEST(overlapping_tensors_are_refused)
{
    const char *dir = tmpdir();
    const char *p = write_xy(dir, "ov.safetensors");
    ASSERT(p);
    /* y [4,10) -> [2,8): same size, overlaps x [0,4). */
    ASSERT_OK(patch_header(p, "\"data_offsets\":[4,10]", "\"data_offsets\":[2, 8]"));
    sd_st *st;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "ov.safetensors: tensors x and y overlap");
}

TEST(duplicate_tensor_across_shards_is_refused)
{
    const char *dir = tmpdir();
    ASSERT(write_xy(dir, "part-a.safetensors"));
    ASSERT(write_xy(dir, "part-b.safetensors"));
    sd_st *st;
    sd_err err = {0};
    ASSERT_EQ(sd_st_open(&st, dir, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "tensor x appears in both part-a.safetensors and part-b.safetensors");

    /* The same through an index. */
    const char *idx =
        "{\"weight_map\":{\"x\":\"part-a.safetensors\",\"y\":\"part-b.safetensors\"}}";
    ASSERT_OK(
        spit(path_in(dir, "model.safetensors.index.json"), (const uint8_t *)idx, strlen(idx)));
    ASSERT_EQ(sd_st_open(&st, dir, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "appears in both part-a.safetensors and part-b.safetensors");
}

TEST(index_that_disagrees_with_its_shards_is_refused)
{
    const char *dir = tmpdir();
    ASSERT(write_xy(dir, "s1.safetensors"));
    const char *ip = path_in(dir, "model.safetensors.index.json");
    sd_st *st;
    sd_err err = {0};
    struct {
        const char *json, *msg;
        int code;
    } cases[] = {
        {"{\"weight_map\":{\"x\":\"s1.safetensors\",\"w\":\"s1.safetensors\"}}",
         "model.safetensors.index.json: tensor w is listed in s1.safetensors but "
         "s1.safetensors lacks it",
         SD_ENOENT},
        {"{\"weight_map\":{\"x\":\"s2.safetensors\"}}",
         "model.safetensors.index.json: shard s2.safetensors named by the index does not exist",
         SD_ENOENT},
        {"{\"weight_map\":{\"x\":\"../s1.safetensors\"}}",
         "weight_map entry for tensor x is not a file name in the folder", SD_EFORMAT},
        {"{\"metadata\":{}}", "model.safetensors.index.json: key \"weight_map\" is missing",
         SD_ENOENT},
        {"{\"weight_map\":{\"x\":", "model.safetensors.index.json: malformed JSON", SD_EFORMAT},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        ASSERT_OK(spit(ip, (const uint8_t *)cases[i].json, strlen(cases[i].json)));
        int rc = sd_st_open(&st, dir, &err);
        ASSERT_MSG(rc == cases[i].code, "case %zu: rc %d (%s)", i, rc, err.msg);
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
}

TEST(random_header_damage_never_crashes)
{
    /* Whatever bytes the header holds, open either succeeds with in-bounds
     * tensors or fails with a message; ASan/UBSan watch the rest. */
    uint64_t rs = rng_state();
    ckpt c;
    make_ckpt(&c, &rs);
    const char *dir = tmpdir();
    const char *p = path_in(dir, "fuzz.safetensors");
    sd_err err = {0};
    ASSERT_OK(sd_st_write(p, c.t, NT, NULL, &err));
    size_t len;
    uint8_t *orig = slurp(p, &len);
    ASSERT(orig);
    uint8_t *d = malloc(len);
    static const char alphabet[] = "0123456789[]{},:\"-. eE";
    int ok = 0, failed = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(d, orig, len);
        int flips = 1 + (int)sd_test_randf(&rs, 0, 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)sd_test_randf(&rs, 0, (float)(header_len(orig) + 8));
            if (at >= len)
                at = len - 1;
            d[at] = sd_test_randf(&rs, 0, 1) < 0.7f
                        ? (uint8_t)alphabet[(int)sd_test_randf(&rs, 0, sizeof alphabet - 1)]
                        : (uint8_t)sd_test_randf(&rs, 0, 256);
        }
        ASSERT_OK(spit(p, d, len));
        sd_st *st;
        err.msg[0] = 0;
        if (sd_st_open(&st, p, &err) == 0) {
            for (int i = 0; i < sd_st_count(st); i++) {
                const sd_st_tensor *t = sd_st_at(st, i);
                volatile uint8_t sum = 0;
                for (size_t b = 0; b < t->nbytes; b++)
                    sum += ((const uint8_t *)t->data)[b];
                (void)sum;
            }
            sd_st_close(st);
            ok++;
        } else {
            ASSERT_MSG(strstr(err.msg, "fuzz.safetensors") != NULL, "it %d: %s", it, err.msg);
            failed++;
        }
    }
    free(d);
    free(orig);
    ASSERT_GT(failed, 0);
    fprintf(stderr, "  %d opened, %d refused\n", ok, failed);
}

TEST(writer_refuses_inconsistent_tensors)
{
    const char *dir = tmpdir();
    const char *p = path_in(dir, "w.safetensors");
    uint16_t v[4] = {0};
    sd_err err = {0};
    sd_st_tensor t[2] = {
        {.name = "a", .dtype = SD_DT_BF16, .ndim = 2, .shape = {2, 2}, .data = v, .nbytes = 6},
        {.name = "a", .dtype = SD_DT_BF16, .ndim = 1, .shape = {4}, .data = v, .nbytes = 8},
    };
    ASSERT_EQ(sd_st_write(p, t, 1, NULL, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "tensor a: nbytes 6 does not match shape [2,2] of BF16 (8 bytes)");
    t[0].nbytes = 8;
    ASSERT_EQ(sd_st_write(p, t, 2, NULL, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "tensor a appears twice");
    ASSERT_EQ(sd_st_write(p, t, 1, "[1]", &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "metadata");
    ASSERT_EQ(sd_st_write("/nonexistent-dir/x.safetensors", t, 1, NULL, &err), SD_EIO);
    ASSERT_CONTAINS(err.msg, "/nonexistent-dir/x.safetensors");
}

TEST_MAIN(T(written_file_reads_back_exactly_from_the_mapping),
          T(expect_checks_shape_and_names_file_and_tensor),
          T(fp8_e4m3_decodes_every_code_as_defined), T(file_without_tensors_opens_empty), T(fp8_weights_are_refused_without_block_scales_and_dequantized_with_them),
          T(sharded_folder_opens_through_its_index),
          T(folder_without_index_takes_model_safetensors_else_every_shard),
          T(truncated_file_names_file_and_tensor), T(header_length_past_the_end_is_refused),
          T(malformed_header_json_is_refused), T(unknown_dtype_names_tensor_and_dtype),
          T(bad_data_offsets_name_file_and_tensor), T(overlapping_tensors_are_refused),
          T(duplicate_tensor_across_shards_is_refused),
          T(index_that_disagrees_with_its_shards_is_refused), T(random_header_damage_never_crashes),
          T(writer_refuses_inconsistent_tensors))

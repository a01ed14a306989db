/* The CPU backend's matmul gives each activation row the bits it gets alone
 * (n = 1), whatever the rows beside it: the oracle's batched steps (verify,
 * prefill, batches of requests) and its one-token decode agree bit for bit.
 * Covers the paths of a weight row read once for several activation rows
 * (four at a time for BF16 and F32, decoded once for FP8) and their tails:
 * row counts 1-9 and 17, widths with and without a multiple of 8, fresh
 * random inputs each run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/util.h"
#include "kernels/ops.h"
#include "test.h"

static void *weights(uint64_t *rng, sd_dtype dt, size_t n)
{
    void *w = malloc(n * (dt == SD_DT_F32 ? 4 : dt == SD_DT_F8_E4M3 ? 1 : 2));
    for (size_t i = 0; i < n; i++) {
        float v = sd_test_randf(rng, -1.0f, 1.0f);
        if (dt == SD_DT_F32)
            ((float *)w)[i] = v;
        else if (dt == SD_DT_BF16)
            ((uint16_t *)w)[i] = sd_f32_to_bf16(v);
        else if (dt == SD_DT_F16)
            ((uint16_t *)w)[i] = sd_f32_to_f16(v);
        else { /* E4M3 codes, NaN's (0x7f, 0xff) left out */
            uint8_t q = (uint8_t)(sd_test_randf(rng, 0, 1) * 254.99f);
            ((uint8_t *)w)[i] = q == 0x7f ? 0x3f : q;
        }
    }
    return w;
}

TEST(each_activation_row_gets_the_bits_it_gets_alone)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    uint64_t rng = sd_test_seed();
    static const sd_dtype dts[] = {SD_DT_BF16, SD_DT_F32, SD_DT_F16, SD_DT_F8_E4M3};
    static const int widths[] = {1, 7, 8, 13, 64, 200, 257};
    static const int counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
    const int N = 37; /* output columns */
    int checked = 0;
    for (size_t d = 0; d < SD_ARRAY_LEN(dts); d++)
        for (size_t wi = 0; wi < SD_ARRAY_LEN(widths); wi++) {
            const int K = widths[wi];
            void *wd = weights(&rng, dts[d], (size_t)N * K);
            float scale[256]; /* ceil(37 / 16) x ceil(257 / 8) = 99 blocks at most */
            for (int i = 0; i < 256; i++)
                scale[i] = sd_test_randf(&rng, 0.001f, 0.05f);
            sd_weight w;
            if (dts[d] == SD_DT_F8_E4M3)
                ASSERT_OK(be->ops->weight_fp8(be, &w, wd, scale, N, K, 16, 8));
            else
                ASSERT_OK(be->ops->weight(be, &w, wd, dts[d], N, K));
            for (size_t ci = 0; ci < SD_ARRAY_LEN(counts); ci++) {
                const int n = counts[ci], stride = K + 3;
                float *x = malloc((size_t)n * stride * sizeof(float));
                for (int i = 0; i < n * stride; i++)
                    x[i] = sd_test_randf(&rng, -2.0f, 2.0f);
                float *y = malloc((size_t)n * N * sizeof(float)), one[64];
                be->ops->matmul(be, y, x, &w, NULL, n, stride);
                for (int t = 0; t < n; t++) {
                    be->ops->matmul(be, one, x + (size_t)t * stride, &w, NULL, 1, stride);
                    ASSERT_MSG(!memcmp(one, y + (size_t)t * N, (size_t)N * sizeof(float)),
                               "%s, width %d, %d rows: row %d differs from its one-row matmul",
                               sd_dtype_name(dts[d]), K, n, t);
                    checked++;
                }
                free(x);
                free(y);
            }
            free(wd);
        }
    fprintf(stderr, "  %d rows checked\n", checked);
    sd_cpu_backend_destroy(be);
}

/* FP8 rows (the per-block code tables) give the bits of their values, the
 * E4M3 code by dtype.h's definition times the scale in F32 (ops.h), as F32
 * weights: every E4M3 code (NaN's too) in every lane, scales from 2^-140
 * (subnormal products) to 2^120 (products past the F32 range) and
 * 1 + 3/256 (products that would be BF16 ties), blocks of 8,
 * 16, 24 and 12 columns, one row and several (a row decoded once, read four
 * activation rows a pass). */
TEST(fp8_rows_give_the_bits_of_their_f32_values)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    uint64_t rng = sd_test_seed();
    static const int bns[] = {8, 16, 24, 12};
    const int N = 96, K = 72, bm = 16;
    for (size_t bi = 0; bi < SD_ARRAY_LEN(bns); bi++) {
        const int bn = bns[bi], sr = (N + bm - 1) / bm, sc = (K + bn - 1) / bn;
        uint8_t *q = malloc((size_t)N * K);
        float *deq = malloc((size_t)N * K * sizeof(float));
        float *scale = malloc((size_t)sr * sc * sizeof(float));
        const int off = (int)(sd_test_randf(&rng, 0, 255.99f));
        for (int i = 0; i < N * K; i++)
            q[i] = (uint8_t)((i * 37 + off) % 256);
        /* 1 + 3 / 256: products of short codes that would land on BF16 ties */
        for (int i = 0; i < sr * sc; i++)
            scale[i] = i % 7 == 2 ? 1.0f + 3.0f / 256
                                  : ldexpf(sd_test_randf(&rng, 1.0f, 2.0f),
                                           i % 7 == 0   ? -140
                                           : i % 7 == 1 ? 120
                                                        : (int)sd_test_randf(&rng, -20, 5));
        for (int r = 0; r < N; r++)
            for (int k = 0; k < K; k++)
                deq[r * K + k] = sd_fp8_e4m3_to_f32(q[r * K + k]) * scale[(r / bm) * sc + k / bn];
        sd_weight w8, w16;
        ASSERT_OK(be->ops->weight_fp8(be, &w8, q, scale, N, K, bm, bn));
        ASSERT_OK(be->ops->weight(be, &w16, deq, SD_DT_F32, N, K));
        for (int n = 1; n <= 5; n += 2) {
            float *x = malloc((size_t)n * K * sizeof(float));
            for (int i = 0; i < n * K; i++)
                x[i] = sd_test_randf(&rng, -2.0f, 2.0f);
            float *a = malloc((size_t)n * N * sizeof(float)), *b = malloc((size_t)n * N * sizeof(float));
            be->ops->matmul(be, a, x, &w8, NULL, n, K);
            be->ops->matmul(be, b, x, &w16, NULL, n, K);
            int bad = 0, nans = 0;
            for (int i = 0; i < n * N; i++) {
                nans += isnan(a[i]);
                bad += memcmp(&a[i], &b[i], sizeof(float)) && !(isnan(a[i]) && isnan(b[i]));
            }
            ASSERT_MSG(bad == 0, "blocks of %d columns, %d rows: %d of %d outputs differ", bn, n,
                       bad, n * N);
            ASSERT_MSG(nans > 0 && nans < n * N, "%d NaN outputs of %d", nans, n * N);
            free(x);
            free(a);
            free(b);
        }
        free(q);
        free(deq);
        free(scale);
    }
    sd_cpu_backend_destroy(be);
}

/* matmul_heads (head h's rows of W against head h's part of each activation
 * row) the same: n rows give each row's one-row bits. */
TEST(each_row_of_matmul_heads_gets_the_bits_it_gets_alone)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    uint64_t rng = sd_test_seed();
    const int H = 3, N = 5, K = 21, stride = H * K + 2;
    for (int d = 0; d < 2; d++) {
        const sd_dtype dt = d ? SD_DT_F32 : SD_DT_BF16;
        void *wd = weights(&rng, dt, (size_t)H * N * K);
        sd_weight w;
        ASSERT_OK(be->ops->weight(be, &w, wd, dt, (int64_t)H * N, K));
        for (int n = 1; n <= 9; n++) {
            float *x = malloc((size_t)n * stride * sizeof(float));
            for (int i = 0; i < n * stride; i++)
                x[i] = sd_test_randf(&rng, -2.0f, 2.0f);
            float *y = malloc((size_t)n * H * N * sizeof(float)), one[64];
            be->ops->matmul_heads(be, y, x, &w, n, H, stride, K, 1);
            for (int t = 0; t < n; t++) {
                be->ops->matmul_heads(be, one, x + (size_t)t * stride, &w, 1, H, stride, K, 1);
                ASSERT_MSG(!memcmp(one, y + (size_t)t * H * N, (size_t)H * N * sizeof(float)),
                           "%s, %d rows: row %d differs from its one-row matmul_heads",
                           sd_dtype_name(dt), n, t);
            }
            free(x);
            free(y);
        }
        free(wd);
    }
    sd_cpu_backend_destroy(be);
}

TEST_MAIN(T(each_activation_row_gets_the_bits_it_gets_alone),
          T(fp8_rows_give_the_bits_of_their_f32_values),
          T(each_row_of_matmul_heads_gets_the_bits_it_gets_alone))

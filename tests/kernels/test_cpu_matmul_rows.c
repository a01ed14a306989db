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
          T(each_row_of_matmul_heads_gets_the_bits_it_gets_alone))

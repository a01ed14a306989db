/* The CPU backend's add_rmsnorm (the residual step x += y, out = rmsnorm(x)
 * * w in one op) gives the bits of its add followed by its rmsnorm, for F32,
 * F16 and BF16 norm weights, one row to a prefill chunk, odd and model-sized
 * widths; inputs fresh per run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/util.h"
#include "kernels/ops.h"
#include "test.h"

static float *rnd(uint64_t *rng, size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = sd_test_randf(rng, lo, hi);
    return p;
}

/* Norm weight of d elements in dtype dt around 1 (host data the CPU keeps). */
static void *norm_weight(uint64_t *rng, sd_dtype dt, int d)
{
    void *w = malloc((size_t)d * sd_dtype_size(dt));
    for (int i = 0; i < d; i++) {
        float v = sd_test_randf(rng, 0.5f, 1.5f);
        if (dt == SD_DT_F32)
            ((float *)w)[i] = v;
        else if (dt == SD_DT_BF16)
            ((uint16_t *)w)[i] = sd_f32_to_bf16(v);
        else
            ((uint16_t *)w)[i] = sd_f32_to_f16(v);
    }
    return w;
}

TEST(add_rmsnorm_gives_the_bits_of_add_then_rmsnorm)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    const sd_ops *op = be->ops;
    ASSERT(op->add_rmsnorm != NULL);
    uint64_t rng = sd_test_seed();
    struct { int n, d; } cs[] = {{1, 64}, {1, 4096}, {7, 100}, {33, 4096}, {3, 7000}, {64, 1}};
    static const sd_dtype dts[3] = {SD_DT_F32, SD_DT_F16, SD_DT_BF16};
    for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++)
        for (int di = 0; di < 3; di++) {
            int n = cs[k].n, d = cs[k].d;
            size_t m = (size_t)n * (size_t)d;
            /* residuals of a wide range (rms far from 1), sublayer outputs smaller */
            float *x0 = rnd(&rng, m, -40.0f, 40.0f), *y = rnd(&rng, m, -3.0f, 3.0f);
            void *wh = norm_weight(&rng, dts[di], d);
            sd_weight w;
            ASSERT_OK(op->weight(be, &w, wh, dts[di], 1, d));
            float eps = k % 2 ? 1e-6f : 1e-5f;
            float *xa = malloc(m * sizeof(float)), *xb = malloc(m * sizeof(float));
            float *oa = malloc(m * sizeof(float)), *ob = malloc(m * sizeof(float));
            memcpy(xa, x0, m * sizeof(float));
            memcpy(xb, x0, m * sizeof(float));
            for (size_t i = 0; i < m; i++)
                oa[i] = ob[i] = NAN;
            op->add(be, xa, y, n, d);
            op->rmsnorm(be, oa, xa, &w, n, d, d, d, eps);
            op->add_rmsnorm(be, ob, xb, y, &w, n, d, eps);
            ASSERT_OK(op->sync(be));
            ASSERT_MSG(!memcmp(xa, xb, m * sizeof(float)), "x differs: n=%d d=%d %s", n, d,
                       sd_dtype_name(dts[di]));
            ASSERT_MSG(!memcmp(oa, ob, m * sizeof(float)), "out differs: n=%d d=%d %s", n, d,
                       sd_dtype_name(dts[di]));
            /* and it is the norm: row 0 against a double-precision formula */
            double ss = 0;
            for (int i = 0; i < d; i++) {
                double v = (double)x0[i] + y[i];
                ss += v * v;
            }
            double r = 1.0 / sqrt(ss / d + eps);
            for (int i = 0; i < d; i++) {
                double want = ((double)x0[i] + y[i]) * r * sd_load_f32(wh, dts[di], (size_t)i);
                ASSERT_MSG(fabs(ob[i] - want) <= 1e-5 * (fabs(want) + 1e-3),
                           "out[0][%d] = %.9g, want %.9g (d=%d)", i, ob[i], want, d);
            }
            op->weight_free(be, &w);
            free(x0);
            free(y);
            free(wh);
            free(xa);
            free(xb);
            free(oa);
            free(ob);
        }
    sd_cpu_backend_destroy(be);
}

TEST_MAIN(T(add_rmsnorm_gives_the_bits_of_add_then_rmsnorm))

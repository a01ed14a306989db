/* GPU tests: every op of kernels/ops.h on the CUDA backend against the CPU
 * backend, on fresh random inputs (never zeros), with the GPU output
 * poisoned (NaN) first so an element the GPU does not write fails the check.
 *
 * Error: max |gpu - cpu| / max |cpu| over the whole output. Bounds, per op:
 *   exact (0)  embed, embed_shard, gather_rows, copy2d, add, the K/V cache
 *              stores, MoE expert ids, a GEMV row alone vs in a batch;
 *   1e-6       silu_mul, rmsnorm, add_rmsnorm's norm (its x: exact, and both
 *              the bits of the GPU's add then rmsnorm), MoE routing weights
 *              (expf/sqrt ulps);
 *   1e-5       rope (cosf/sinf of angles to 8k radians, a few ulps), matmul on
 *              fp32 activations (GEMV rows, F32 and F16 weights, per-head;
 *              BF16 GEMV batches above SD_CUDA_GEMV_EXACT_ROWS on tensor
 *              cores with the activations split exactly into 3 bf16 terms),
 *              moe_ffn (fp32 sums in another order);
 *   1e-4       matmul above SD_CUDA_GEMV_MAX_ROWS rows with BF16 weights: the
 *              activations go to cuBLASLt as two bf16 terms (hi + lo, ~2^-17
 *              relative);
 *   1e-2       the same with one bf16 term (sd_cuda_set_bf16_split off: 2^-9);
 *              moe_ffn on tensor cores (sd_cuda_set_moe_tc: x and SiLU(g) * u
 *              rounded to bf16; 2.0e-3 .. 3.1e-3 in a float64 model of it);
 *   5e-5       attention (fp32 softmax sums over up to 8k positions in tiles
 *              of 32 instead of one by one; ~4e-6 measured in a model of it).
 * Shapes include ragged batches (sequences of different lengths and new
 * tokens in one step, block tables with shuffled blocks) and long contexts. */
#include <float.h>

#include "gpu_test.h"
#include "verify/sampling.h"

static const sd_dtype all_dt[3] = {SD_DT_F32, SD_DT_F16, SD_DT_BF16};

static float *nan_floats(size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* ------------------------------------------------------------ elementwise */

TEST(embed_copies_and_elementwise_ops_equal_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    for (int di = 0; di < 3; di++) {
        int Ds[2] = {64, 200};
        for (int k = 0; k < 2; k++) {
            int V = 1000, D = Ds[k], n = 37;
            tw t;
            ASSERT_OK(tw_make(&e, &t, all_dt[di], V, D, 1.0f));
            int32_t ids[37];
            for (int i = 0; i < n; i++)
                ids[i] = rnd_int(&e, V);
            float *co = (float *)malloc((size_t)n * D * sizeof(float));
            e.cpu->ops->embed(e.cpu, co, &t.c, ids, n);
            int32_t *dids = (int32_t *)gput(&e, ids, sizeof ids);
            float *dout = gpoison(&e, (size_t)n * D);
            e.gpu->ops->embed(e.gpu, dout, &t.g, dids, n);
            char name[128];
            snprintf(name, sizeof name, "embed %s D=%d n=%d", sd_dtype_name(all_dt[di]), D, n);
            ok &= check_dev(&e, dout, co, (size_t)n * D, 0, name);
            gfree(&e, dids);
            gfree(&e, dout);
            free(co);
            tw_free(&e, &t);
        }
    }
    {
        /* a vocab shard [300, 700) of a 1000-token vocabulary */
        int rows = 400, D = 96, n = 41, first = 300;
        tw t;
        ASSERT_OK(tw_make(&e, &t, SD_DT_BF16, rows, D, 1.0f));
        int32_t ids[41];
        for (int i = 0; i < n; i++)
            ids[i] = rnd_int(&e, 1000);
        float *co = (float *)malloc((size_t)n * D * sizeof(float));
        e.cpu->ops->embed_shard(e.cpu, co, &t.c, ids, n, first);
        int32_t *dids = (int32_t *)gput(&e, ids, sizeof ids);
        float *dout = gpoison(&e, (size_t)n * D);
        e.gpu->ops->embed_shard(e.gpu, dout, &t.g, dids, n, first);
        ok &= check_dev(&e, dout, co, (size_t)n * D, 0, "embed_shard BF16 rows [300,700) n=41");
        gfree(&e, dids);
        gfree(&e, dout);
        free(co);
        tw_free(&e, &t);
    }
    {
        /* gather_rows and copy2d with strides; the gaps stay NaN on both sides */
        int nsrc = 50, ss = 70, d = 64, ds = 66, n = 33;
        float *src = rnd_floats(&e, (size_t)nsrc * ss, -3, 3);
        int32_t idx[33];
        for (int i = 0; i < n; i++)
            idx[i] = rnd_int(&e, nsrc);
        float *cd = nan_floats((size_t)n * ds);
        e.cpu->ops->gather_rows(e.cpu, cd, src, idx, n, d, ds, ss);
        float *dsrc = (float *)gput(&e, src, (size_t)nsrc * ss * sizeof(float));
        int32_t *didx = (int32_t *)gput(&e, idx, sizeof idx);
        float *dd = gpoison(&e, (size_t)n * ds);
        e.gpu->ops->gather_rows(e.gpu, dd, dsrc, didx, n, d, ds, ss);
        ok &= check_dev(&e, dd, cd, (size_t)n * ds, 0, "gather_rows n=33 d=64 ds=66 ss=70");
        float *cc = nan_floats((size_t)n * ds);
        e.cpu->ops->copy2d(e.cpu, cc, src, n, d, ds, ss);
        float *dc = gpoison(&e, (size_t)n * ds);
        e.gpu->ops->copy2d(e.gpu, dc, dsrc, n, d, ds, ss);
        ok &= check_dev(&e, dc, cc, (size_t)n * ds, 0, "copy2d n=33 d=64 ds=66 ss=70");
        /* gather_i32: ids through a map */
        int32_t map[50], ci[33], gi[33];
        for (int i = 0; i < nsrc; i++)
            map[i] = rnd_int(&e, 1 << 30);
        e.cpu->ops->gather_i32(e.cpu, ci, map, idx, n);
        int32_t *dmap = (int32_t *)gput(&e, map, sizeof map);
        int32_t *dgi = (int32_t *)gput(&e, map, sizeof gi); /* poisoned with other ids */
        e.gpu->ops->gather_i32(e.gpu, dgi, dmap, didx, n);
        e.gpu->ops->download(e.gpu, gi, dgi, sizeof gi);
        int wrong = 0;
        for (int i = 0; i < n; i++)
            wrong += gi[i] != ci[i] || ci[i] != map[idx[i]];
        ok &= report("gather_i32 n=33 (ids that differ)", wrong, 0);
        /* scatter_cols: rows of 50 columns spread over 301 through an
         * injective map (a shuffled prefix of 0..300) */
        {
            int ws = 50, wd = 301;
            int32_t perm[301];
            for (int i = 0; i < wd; i++)
                perm[i] = i;
            for (int i = wd - 1; i > 0; i--) {
                int j = rnd_int(&e, i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            float *cs = nan_floats((size_t)n * wd);
            e.cpu->ops->scatter_cols(e.cpu, cs, src, perm, n, ws, wd);
            int32_t *dperm = (int32_t *)gput(&e, perm, (size_t)ws * sizeof(int32_t));
            float *dsc = gpoison(&e, (size_t)n * wd);
            e.gpu->ops->scatter_cols(e.gpu, dsc, dsrc, dperm, n, ws, wd);
            ok &= check_dev(&e, dsc, cs, (size_t)n * wd, 0, "scatter_cols n=33 50 -> 301 columns");
            gfree(&e, dperm);
            gfree(&e, dsc);
            free(cs);
        }
        gfree(&e, dmap);
        gfree(&e, dgi);
        gfree(&e, dsrc);
        gfree(&e, didx);
        gfree(&e, dd);
        gfree(&e, dc);
        free(src);
        free(cd);
        free(cc);
    }
    {
        int shapes[2][2] = {{17, 1003}, {8, 512}}; /* scalar and float4 paths */
        for (int k = 0; k < 2; k++) {
            int n = shapes[k][0], d = shapes[k][1];
            size_t m = (size_t)n * d;
            float *y = rnd_floats(&e, m, -2, 2), *x = rnd_floats(&e, m, -2, 2);
            float *dy = (float *)gput(&e, y, m * sizeof(float));
            float *dx = (float *)gput(&e, x, m * sizeof(float));
            e.cpu->ops->add(e.cpu, y, x, n, d);
            e.gpu->ops->add(e.gpu, dy, dx, n, d);
            char name[64];
            snprintf(name, sizeof name, "add n=%d d=%d", n, d);
            ok &= check_dev(&e, dy, y, m, 0, name);
            gfree(&e, dy);
            gfree(&e, dx);
            free(y);
            free(x);
        }
    }
    /* 300 rows (in place: through scratch), one row of 14336 (in place: one
     * kernel, plain decode's call at batch 1) */
    for (int c = 0; c < 2; c++) {
        int n = c ? 1 : 300, I = c ? 14336 : 96;
        char nm[80];
        size_t m = (size_t)n * 2 * I;
        float *gu = rnd_floats(&e, m, -4, 4);
        float *co = (float *)malloc((size_t)n * I * sizeof(float));
        e.cpu->ops->silu_mul(e.cpu, co, gu, n, I);
        float *dgu = (float *)gput(&e, gu, m * sizeof(float));
        float *dout = gpoison(&e, (size_t)n * I);
        e.gpu->ops->silu_mul(e.gpu, dout, dgu, n, I);
        snprintf(nm, sizeof nm, "silu_mul n=%d I=%d", n, I);
        ok &= check_dev(&e, dout, co, (size_t)n * I, 1e-6, nm);
        /* in place, as the model calls it: out rows I apart over gu rows 2I apart */
        e.cpu->ops->silu_mul(e.cpu, gu, gu, n, I);
        e.gpu->ops->silu_mul(e.gpu, dgu, dgu, n, I);
        snprintf(nm, sizeof nm, "silu_mul in place n=%d I=%d", n, I);
        ok &= check_dev(&e, dgu, gu, (size_t)n * I, 1e-6, nm);
        gfree(&e, dgu);
        gfree(&e, dout);
        free(gu);
        free(co);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ------------------------------------------------------------------- norm */

TEST(rmsnorm_matches_the_cpu_with_strides_and_in_place)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* n, d, x_stride, out_stride, dtype, in place */
    struct { int n, d, xs, os; sd_dtype dt; int inplace; } cs[] = {
        {5, 64, 64, 64, SD_DT_F32, 0},       {33, 4096, 4100, 4096, SD_DT_BF16, 0},
        {512, 128, 128, 128, SD_DT_F16, 1},  {3, 7000, 7000, 14000, SD_DT_BF16, 0},
        {7, 512, 576, 576, SD_DT_BF16, 1},
        /* float4 rows of one to four float4s a thread, and rows on the
         * element path (odd widths and strides) from 1 to 16 floats a thread */
        {2, 16384, 16384, 16384, SD_DT_BF16, 0}, {4, 7168, 7168, 7168, SD_DT_F32, 1},
        {3, 4099, 4099, 4103, SD_DT_BF16, 0},    {2, 16383, 16383, 16383, SD_DT_F16, 1},
        {9, 33, 35, 33, SD_DT_F32, 0},
    };
    for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++) {
        int n = cs[k].n, d = cs[k].d, xs = cs[k].xs, os = cs[k].os;
        size_t mx = (size_t)n * xs, mo = (size_t)n * os;
        tw w;
        ASSERT_OK(tw_make(&e, &w, cs[k].dt, 1, d, 1.5f));
        float *x = rnd_floats(&e, mx, -3, 3);
        float *dx = (float *)gput(&e, x, mx * sizeof(float));
        char name[128];
        snprintf(name, sizeof name, "rmsnorm %s n=%d d=%d xs=%d os=%d%s", sd_dtype_name(cs[k].dt),
                 n, d, xs, os, cs[k].inplace ? " in place" : "");
        if (cs[k].inplace) {
            e.cpu->ops->rmsnorm(e.cpu, x, x, &w.c, n, d, xs, xs, 1e-6f);
            e.gpu->ops->rmsnorm(e.gpu, dx, dx, &w.g, n, d, xs, xs, 1e-6f);
            ok &= check_dev(&e, dx, x, mx, 1e-6, name);
        } else {
            float *co = nan_floats(mo);
            float *dout = gpoison(&e, mo);
            e.cpu->ops->rmsnorm(e.cpu, co, x, &w.c, n, d, xs, os, 1e-6f);
            e.gpu->ops->rmsnorm(e.gpu, dout, dx, &w.g, n, d, xs, os, 1e-6f);
            ok &= check_dev(&e, dout, co, mo, 1e-6, name);
            gfree(&e, dout);
            free(co);
        }
        gfree(&e, dx);
        free(x);
        tw_free(&e, &w);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* The fused residual step: x exact, out within rmsnorm's bound of the CPU,
 * and both bit for bit the GPU's own add followed by its rmsnorm (the
 * unfused path the model took before). */
TEST(add_rmsnorm_matches_the_cpu_and_the_gpus_add_then_rmsnorm_bitwise)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    struct { int n, d; sd_dtype dt; } cs[] = {
        {1, 4096, SD_DT_BF16}, {5, 64, SD_DT_F32},  {33, 4096, SD_DT_BF16},
        {3, 7000, SD_DT_F16},  {17, 100, SD_DT_F32}, {2, 5120, SD_DT_BF16},
        {1, 2048, SD_DT_BF16}, {2, 16384, SD_DT_BF16}, {3, 4098, SD_DT_F32}, {1, 9999, SD_DT_BF16},
    };
    for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++) {
        int n = cs[k].n, d = cs[k].d;
        size_t m = (size_t)n * d;
        tw w;
        ASSERT_OK(tw_make(&e, &w, cs[k].dt, 1, d, 1.5f));
        float *x0 = rnd_floats(&e, m, -40, 40), *y = rnd_floats(&e, m, -3, 3);
        float *xc = (float *)malloc(m * sizeof(float)), *oc = nan_floats(m);
        memcpy(xc, x0, m * sizeof(float));
        e.cpu->ops->add_rmsnorm(e.cpu, oc, xc, y, &w.c, n, d, 1e-5f);
        float *dx = (float *)gput(&e, x0, m * sizeof(float));
        float *dy = (float *)gput(&e, y, m * sizeof(float));
        float *dout = gpoison(&e, m);
        e.gpu->ops->add_rmsnorm(e.gpu, dout, dx, dy, &w.g, n, d, 1e-5f);
        /* the unfused GPU path on the same inputs */
        float *dx2 = (float *)gput(&e, x0, m * sizeof(float));
        float *dout2 = gpoison(&e, m);
        e.gpu->ops->add(e.gpu, dx2, dy, n, d);
        e.gpu->ops->rmsnorm(e.gpu, dout2, dx2, &w.g, n, d, d, d, 1e-5f);
        char name[128];
        snprintf(name, sizeof name, "add_rmsnorm %s n=%d d=%d x", sd_dtype_name(cs[k].dt), n, d);
        ok &= check_dev(&e, dx, xc, m, 0, name);
        snprintf(name, sizeof name, "add_rmsnorm %s n=%d d=%d out", sd_dtype_name(cs[k].dt), n, d);
        ok &= check_dev(&e, dout, oc, m, 1e-6, name);
        float *gx = gget(&e, dx, m), *gx2 = gget(&e, dx2, m);
        float *go = gget(&e, dout, m), *go2 = gget(&e, dout2, m);
        int same = gx && gx2 && go && go2 && !memcmp(gx, gx2, m * sizeof(float)) &&
                   !memcmp(go, go2, m * sizeof(float));
        snprintf(name, sizeof name, "add_rmsnorm %s n=%d d=%d == add + rmsnorm (bits)",
                 sd_dtype_name(cs[k].dt), n, d);
        ok &= report(name, same ? 0 : 1, 0);
        free(gx);
        free(gx2);
        free(go);
        free(go2);
        gfree(&e, dx);
        gfree(&e, dy);
        gfree(&e, dout);
        gfree(&e, dx2);
        gfree(&e, dout2);
        free(x0);
        free(y);
        free(xc);
        free(oc);
        tw_free(&e, &w);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ------------------------------------------------------------------- rope */

TEST(rope_matches_the_cpu_for_every_variant_up_to_8k_positions)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* H, head_stride, row_stride, off, rot_dim, interleave, mscale:
     * halves over whole heads (Llama), interleaved on the last 64 dims of
     * 192-wide heads (DeepSeek q), and on one 576-wide latent row (k_pe) */
    struct { int H, hs, rs, off, rot, il; float ms; } cs[] = {
        {8, 128, 8 * 128 + 16, 0, 128, 0, 1.0f},
        {4, 192, 4 * 192, 128, 64, 1, 1.2f},
        {1, 0, 576, 512, 64, 1, 0.9f},
        {6, 64, 6 * 64, 0, 32, 0, 1.0f},
    };
    for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++) {
        int n = 50, half = cs[k].rot / 2;
        float *inv = (float *)malloc((size_t)half * sizeof(float));
        for (int i = 0; i < half; i++)
            inv[i] = powf(10000.0f, -2.0f * (float)i / (float)cs[k].rot) *
                     sd_test_randf(&e.rng, 0.5f, 1.0f);
        int32_t pos[50];
        for (int t = 0; t < n; t++)
            pos[t] = t < 4 ? t : rnd_int(&e, 8192);
        size_t m = (size_t)n * cs[k].rs;
        float *x = rnd_floats(&e, m, -2, 2);
        float *dx = (float *)gput(&e, x, m * sizeof(float));
        float *dinv = (float *)gput(&e, inv, (size_t)half * sizeof(float));
        int32_t *dpos = (int32_t *)gput(&e, pos, sizeof pos);
        sd_rope rc = {.inv_freq = inv, .rot_dim = cs[k].rot, .interleave = cs[k].il,
                      .mscale = cs[k].ms};
        sd_rope rg = rc;
        rg.inv_freq = dinv;
        e.cpu->ops->rope(e.cpu, x, pos, &rc, n, cs[k].H, cs[k].rs, cs[k].hs, cs[k].off);
        e.gpu->ops->rope(e.gpu, dx, dpos, &rg, n, cs[k].H, cs[k].rs, cs[k].hs, cs[k].off);
        char name[128];
        snprintf(name, sizeof name, "rope %s H=%d rot=%d off=%d mscale=%.1f",
                 cs[k].il ? "interleaved" : "halves", cs[k].H, cs[k].rot, cs[k].off,
                 (double)cs[k].ms);
        ok &= check_dev(&e, dx, x, m, 1e-5, name);
        gfree(&e, dx);
        gfree(&e, dinv);
        gfree(&e, dpos);
        free(x);
        free(inv);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ----------------------------------------------------------------- matmul */

/* y = x @ W^T (+ bias) on both; returns the reported pass. */
static int mm_case_split(gpu_env *e, sd_dtype dt, int n, int N, int K, int xs, int with_bias,
                         int split)
{
    sd_cuda_set_bf16_split(e->gpu, split);
    tw w, b;
    memset(&b, 0, sizeof b);
    if (tw_make(e, &w, dt, N, K, 0.5f) || (with_bias && tw_make(e, &b, dt, 1, N, 1.0f)))
        return report("matmul: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, (size_t)n * xs, -1, 1);
    float *co = (float *)malloc((size_t)n * N * sizeof(float));
    e->cpu->ops->matmul(e->cpu, co, x, &w.c, with_bias ? &b.c : NULL, n, xs);
    float *dx = (float *)gput(e, x, (size_t)n * xs * sizeof(float));
    float *dy = gpoison(e, (size_t)n * N);
    e->gpu->ops->matmul(e->gpu, dy, dx, &w.g, with_bias ? &b.g : NULL, n, xs);
    /* bf16 activations only where cuBLASLt takes BF16 weights */
    int bf16_act = n > SD_CUDA_GEMV_MAX_ROWS && dt == SD_DT_BF16 && K % 8 == 0;
    char name[160];
    snprintf(name, sizeof name, "matmul %s n=%d N=%d K=%d xs=%d%s (%s)", sd_dtype_name(dt), n, N,
             K, xs, with_bias ? " +bias" : "",
             n <= SD_CUDA_GEMV_MAX_ROWS ? "gemv"
             : bf16_act                 ? (split ? "cublaslt bf16 hi+lo" : "cublaslt bf16")
             : dt == SD_DT_F32          ? "cublaslt fp32"
                                        : "tiled");
    int ok = check_dev(e, dy, co, (size_t)n * N, bf16_act ? (split ? 1e-4 : 1e-2) : 1e-5, name);
    sd_cuda_set_bf16_split(e->gpu, 1);
    gfree(e, dx);
    gfree(e, dy);
    free(x);
    free(co);
    tw_free(e, &w);
    if (with_bias)
        tw_free(e, &b);
    return ok;
}

static int mm_case(gpu_env *e, sd_dtype dt, int n, int N, int K, int xs, int with_bias)
{
    return mm_case_split(e, dt, n, N, K, xs, with_bias, 1);
}

TEST(matmul_gemv_rows_match_the_cpu_in_fp32)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    for (int di = 0; di < 3; di++) {
        sd_dtype dt = all_dt[di];
        ok &= mm_case(&e, dt, 1, 256, 512, 512, 0);
        ok &= mm_case(&e, dt, 3, 1000, 136, 140, 1);
        ok &= mm_case(&e, dt, 8, 77, 45, 45, 0); /* K % 8 != 0: the scalar path */
        ok &= mm_case(&e, dt, 5, 4096, 4096, 4096, 0);
        ok &= mm_case(&e, dt, 2, 300, 64, 128, 1);
        /* the K split of the 16-byte path (gemv.cuh): 8 warps over 56
         * chunks, 4 warps over 6 (uneven), 8 over 9 with a partial last
         * chunk, 2 over 3, 1 on a partial chunk; weight rows not a multiple
         * of the block's; 1, 2, 4 and 8 activation rows per pass */
        ok &= mm_case(&e, dt, 1, 4096, 14336, 14336, 1);
        ok &= mm_case(&e, dt, 4, 1027, 1408, 1416, 0);
        ok &= mm_case(&e, dt, 7, 333, 2056, 2056, 1);
        ok &= mm_case(&e, dt, 2, 50, 520, 524, 0);
        ok &= mm_case(&e, dt, 1, 70, 64, 64, 1);
        /* above SD_CUDA_GEMV_EXACT_ROWS (BF16: tensor cores, 1, 2 or 4 mmas
         * per warp by N; F32/F16: passes of 8 rows) up to the largest GEMV
         * batch, ragged tiles and a partial last chunk */
        ok &= mm_case(&e, dt, SD_CUDA_GEMV_MAX_ROWS, 600, 1024, 1024, 0);
        ok &= mm_case(&e, dt, SD_CUDA_GEMV_MAX_ROWS - 3, 259, 2056, 2060, 1);
        ok &= mm_case(&e, dt, SD_CUDA_GEMV_EXACT_ROWS + 4, 4500, 1024, 1024, 0);
        ok &= mm_case(&e, dt, SD_CUDA_GEMV_EXACT_ROWS + 12, 2200, 520, 520, 1);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A row's GEMV result is the same bits whatever else is in the batch: up to
 * SD_CUDA_GEMV_EXACT_ROWS rows, row r alone (n = 1) and inside every batch
 * at every position; above it (tensor cores for BF16 weights), row r in
 * every batch of SD_CUDA_GEMV_EXACT_ROWS + 1 .. SD_CUDA_GEMV_MAX_ROWS rows
 * and in the largest. The first is what keeps greedy verification equal to
 * plain decode on the GPU. */
static float *mm_rows(gpu_env *e, float *dy, const float *dx, const tw *w, int n, int N, int K)
{
    e->gpu->ops->matmul(e->gpu, dy, dx, &w->g, NULL, n, K);
    return gget(e, dy, (size_t)n * N);
}

/* the batch-independence check for one weight shape and dtype */
static int mm_batch_case(gpu_env *e, sd_dtype dt, int N, int K, const char *path)
{
    const int nmax = SD_CUDA_GEMV_MAX_ROWS, nex = SD_CUDA_GEMV_EXACT_ROWS;
    tw w;
    if (tw_make(e, &w, dt, N, K, 0.5f))
        return report("matmul: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, (size_t)nmax * K, -1, 1);
    float *dx = (float *)gput(e, x, (size_t)nmax * K * sizeof(float));
    float *dy = gpoison(e, (size_t)nmax * N);
    /* references: each row alone, and all rows in the largest batch */
    float *alone = (float *)malloc((size_t)nmax * N * sizeof(float));
    float *full = mm_rows(e, dy, dx, &w, nmax, N, K);
    int got = full != NULL, ok = 1;
    for (int r = 0; r < nmax && got; r++) {
        float *g = mm_rows(e, dy, dx + (size_t)r * K, &w, 1, N, K);
        got = g != NULL;
        if (g)
            memcpy(alone + (size_t)r * N, g, (size_t)N * sizeof(float));
        free(g);
    }
    double bad[2] = {got ? 0 : INFINITY, got ? 0 : INFINITY};
    /* batches of every size starting at every offset that fits */
    for (int n = 2; n <= nmax && got; n++) {
        const float *ref = n <= nex ? alone : full;
        for (int r0 = 0; r0 + n <= nmax; r0 += n > 4 && n <= nex ? 1 : n > nex ? 3 : n) {
            float *g = mm_rows(e, dy, dx + (size_t)r0 * K, &w, n, N, K);
            if (!g) {
                bad[n > nex] = INFINITY;
                break;
            }
            for (size_t i = 0; i < (size_t)n * N; i++)
                bad[n > nex] += memcmp(&g[i], &ref[(size_t)r0 * N + i], sizeof(float)) != 0;
            free(g);
        }
    }
    ok &= reportf(bad[0], 0, "matmul %s %s N=%d K=%d: a row in batches of 2..%d vs alone "
                  "(differing elements)", path, sd_dtype_name(dt), N, K, nex);
    if (nmax > nex)
        ok &= reportf(bad[1], 0, "matmul %s %s N=%d K=%d: a row in batches of %d..%d vs "
                      "in %d (differing elements)", path, sd_dtype_name(dt), N, K, nex + 1,
                      nmax, nmax);
    GFREE_ALL(e, dx, dy);
    free(x);
    free(alone);
    free(full);
    tw_free(e, &w);
    return ok;
}

TEST(matmul_gemv_rows_do_not_depend_on_the_batch)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    for (int di = 0; di < 3; di++) {
        ok &= mm_batch_case(&e, all_dt[di], 1500, 4104, "gemv");
        /* short rows: 1-2 rows take 8 weight rows a warp (SPECD_GEMV_WIDE) */
        ok &= mm_batch_case(&e, all_dt[di], 1000, 2048, "gemv short rows");
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* The persistent few-row GEMV (SPECD_GEMV_FEW: 2-4 rows, long rows too)
 * keeps the GEMV's order of sums: with it on for every batch of 2+ rows, a
 * row in every batch still has its bits alone (n = 1 stays on the one-pass
 * kernel); and matmul_silu, a bias and matmul_heads give the bits of the
 * kernel it replaces. Shapes with a partial last chunk and warps of unequal
 * chunk counts (K = 4000, 2816, 520), one chunk a warp (2048, 512), row
 * counts that leave a persistent block's last row block short, rows of
 * several items a warp (K = 4104: one warp a chunk more; 14336), and 5-8
 * rows (the one-pass kernel either way). */
static int pipe_vs_plain(gpu_env *e, int which, sd_dtype dt, int n, int N, int K, int H)
{
    const int rows = H > 0 ? H * N : N, xs = H > 0 ? H * K : K;
    tw w, b;
    if (tw_make(e, &w, dt, rows, K, 0.5f) || tw_make(e, &b, SD_DT_F32, 1, rows, 0.5f))
        return report("matmul: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, (size_t)n * xs, -1, 1);
    float *dx = (float *)gput(e, x, (size_t)n * xs * sizeof(float));
    size_t m = (size_t)n * (size_t)rows;
    float *dy[2], *hy[2];
    for (int p = 0; p < 2; p++) {
        sd_cuda_set_gemv_few(e->gpu, p ? 2 : 0, p);
        dy[p] = gpoison(e, m);
        if (which == 0)
            e->gpu->ops->matmul(e->gpu, dy[p], dx, &w.g, &b.g, n, K);
        else if (which == 1)
            e->gpu->ops->matmul_silu(e->gpu, dy[p], dx, &w.g, n, K);
        else
            e->gpu->ops->matmul_heads(e->gpu, dy[p], dx, &w.g, n, H, xs, K, 0);
        hy[p] = gget(e, dy[p], which == 1 ? m / 2 : m);
    }
    sd_cuda_set_gemv_few(e->gpu, SD_CUDA_GEMV_FEW_DEFAULT, SD_CUDA_GEMV_FEW_LONG_DEFAULT);
    double bad = hy[0] && hy[1] ? 0 : INFINITY;
    for (size_t i = 0; hy[0] && hy[1] && i < (which == 1 ? m / 2 : m); i++)
        bad += memcmp(&hy[0][i], &hy[1][i], sizeof(float)) != 0;
    static const char *what[3] = {"matmul + bias", "matmul_silu", "matmul_heads"};
    int ok = reportf(bad, 0, "few-row GEMV %s %s n=%d N=%d K=%d H=%d vs the one-pass kernel "
                     "(differing elements)", what[which], sd_dtype_name(dt), n, N, K, H);
    for (int p = 0; p < 2; p++) {
        gfree(e, dy[p]);
        free(hy[p]);
    }
    gfree(e, dx);
    free(x);
    tw_free(e, &w);
    tw_free(e, &b);
    return ok;
}

TEST(matmul_few_row_gemv_gives_the_gemvs_bits)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    sd_dtype dts[2] = {SD_DT_BF16, SD_DT_F16};
    for (int di = 0; di < 2; di++) {
        sd_cuda_set_gemv_few(e.gpu, 2, 1);
        ok &= mm_batch_case(&e, dts[di], 1500, 4000, "persistent few-row gemv");
        ok &= mm_batch_case(&e, dts[di], 1000, 2048, "persistent few-row gemv short rows");
        ok &= mm_batch_case(&e, dts[di], 700, 4104, "persistent few-row gemv long rows");
        sd_cuda_set_gemv_few(e.gpu, SD_CUDA_GEMV_FEW_DEFAULT, SD_CUDA_GEMV_FEW_LONG_DEFAULT);
        struct { int which, n, N, K, H; } cs[] = {
            {0, 2, 4096, 4096, 0}, {0, 4, 6144, 4096, 0}, {0, 3, 2048, 2816, 0},
            {0, 4, 4096, 14336, 0}, {0, 4, 37, 520, 0},   {1, 4, 2 * 2816, 2048, 0},
            {1, 3, 2 * 1001, 520, 0}, {1, 2, 2 * 1408, 2048, 0}, {1, 2, 2 * 14336, 4096, 0},
            {2, 4, 128, 512, 16},    {2, 3, 512, 128, 16},    {0, 3, 1500, 4104, 0},
            {1, 4, 2 * 300, 14336, 0}, {0, 5, 1000, 4096, 0},  {0, 8, 600, 14336, 0},
            {1, 6, 2 * 1001, 2048, 0}, {1, 7, 2 * 700, 4104, 0}, {2, 8, 128, 512, 16},
        };
        for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++)
            ok &= pipe_vs_plain(&e, cs[k].which, dts[di], cs[k].n, cs[k].N, cs[k].K, cs[k].H);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* matmul_silu: within the GEMV's bound of the CPU, and bit for bit the
 * GPU's own matmul followed by its silu_mul (the pair the model ran before),
 * on the fused GEMV (n <= SD_CUDA_GEMV_EXACT_ROWS) and on the pair beyond */
TEST(matmul_silu_matches_the_cpu_and_the_gpus_matmul_then_silu_mul_bitwise)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    struct { int n, I, K; } cs[] = {{1, 14336, 4096}, {3, 2816, 2048}, {8, 1001, 520},
                                    {2, 7, 64},       {5, 1408, 2056}, {20, 600, 1024},
                                    {1, 1408, 2048},  {2, 1001, 2048}};
    for (int di = 0; di < 3; di++)
        for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++) {
            int n = cs[k].n, I = cs[k].I, K = cs[k].K;
            tw w;
            ASSERT_OK(tw_make(&e, &w, all_dt[di], 2 * I, K, 0.5f));
            float *x = rnd_floats(&e, (size_t)n * K, -1, 1);
            float *co = (float *)malloc((size_t)n * 2 * I * sizeof(float));
            e.cpu->ops->matmul_silu(e.cpu, co, x, &w.c, n, K);
            float *dx = (float *)gput(&e, x, (size_t)n * K * sizeof(float));
            float *dy = gpoison(&e, (size_t)n * 2 * I), *dz = gpoison(&e, (size_t)n * 2 * I);
            e.gpu->ops->matmul_silu(e.gpu, dy, dx, &w.g, n, K);
            e.gpu->ops->matmul(e.gpu, dz, dx, &w.g, NULL, n, K);
            e.gpu->ops->silu_mul(e.gpu, dz, dz, n, I);
            char name[160];
            snprintf(name, sizeof name, "matmul_silu %s n=%d I=%d K=%d", sd_dtype_name(all_dt[di]),
                     n, I, K);
            ok &= check_dev(&e, dy, co, (size_t)n * I, n > SD_CUDA_GEMV_MAX_ROWS ? 1e-4 : 1e-5,
                            name);
            float *a = gget(&e, dy, (size_t)n * I), *b = gget(&e, dz, (size_t)n * I);
            double bad = a && b ? 0 : INFINITY;
            for (size_t i = 0; a && b && i < (size_t)n * I; i++)
                bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
            ok &= reportf(bad, 0, "matmul_silu %s n=%d I=%d K=%d vs matmul + silu_mul on the GPU "
                          "(differing elements)", sd_dtype_name(all_dt[di]), n, I, K);
            free(a);
            free(b);
            gfree(&e, dx);
            gfree(&e, dy);
            gfree(&e, dz);
            free(x);
            free(co);
            tw_free(&e, &w);
        }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ---- block-scaled FP8 weights (weight_fp8) ---- */

/* An FP8 weight (random E4M3 codes but NaN, scales 2^-12 .. 2^-4 a block)
 * on both backends, and its BF16 dequantization by the contract's
 * definition (dtype.h's decoder, the product rounded to BF16) on the GPU. */
typedef struct f8w {
    sd_weight c, g, b; /* CPU fp8, GPU fp8, GPU bf16 dequantization */
    uint8_t *q;
    float *s;
    uint16_t *deq;
} f8w;

static int f8w_make(gpu_env *e, f8w *w, int64_t rows, int64_t cols, int bm, int bn)
{
    memset(w, 0, sizeof *w);
    const int64_t sr = (rows + bm - 1) / bm, sc = (cols + bn - 1) / bn;
    w->q = (uint8_t *)malloc((size_t)(rows * cols));
    w->s = (float *)malloc((size_t)(sr * sc) * sizeof(float));
    w->deq = (uint16_t *)malloc((size_t)(rows * cols) * sizeof(uint16_t));
    for (int64_t i = 0; i < rows * cols; i++) {
        uint8_t b = (uint8_t)rnd_int(e, 256);
        w->q[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b - 1) : b; /* no NaN codes */
    }
    for (int64_t i = 0; i < sr * sc; i++)
        w->s[i] = ldexpf(sd_test_randf(&e->rng, 1.0f, 2.0f), -12 + rnd_int(e, 9));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            w->deq[r * cols + k] = sd_f32_to_bf16(sd_fp8_e4m3_to_f32(w->q[r * cols + k]) *
                                                  w->s[(r / bm) * sc + k / bn]);
    if (e->cpu->ops->weight_fp8(e->cpu, &w->c, w->q, w->s, rows, cols, bm, bn) ||
        e->gpu->ops->weight_fp8(e->gpu, &w->g, w->q, w->s, rows, cols, bm, bn))
        return -1;
    return e->gpu->ops->weight(e->gpu, &w->b, w->deq, SD_DT_BF16, rows, cols);
}

static void f8w_free(gpu_env *e, f8w *w)
{
    if (w->g.data)
        e->gpu->ops->weight_free(e->gpu, &w->g);
    if (w->b.data)
        e->gpu->ops->weight_free(e->gpu, &w->b);
    if (w->c.data)
        e->cpu->ops->weight_free(e->cpu, &w->c);
    free(w->q);
    free(w->s);
    free(w->deq);
    memset(w, 0, sizeof *w);
}

/* the CPU's FP8 weights are E4M3 x scale in F32, the GPU's dequantized
 * scratch rounds them to BF16 (ops.h): a weight differs by 2^-9 of itself
 * at most, a matmul's outputs by ~1e-3 of the largest */
#define F8_SCRATCH_BOUND 1e-2

/* one call of matmul (silu: matmul_silu) with FP8 weight w: up to the
 * FP8 GEMV's rows (the factored dot: ops.h) against the CPU's FP8 weight
 * (the GEMV's bound above); more rows (the dequantized scratch) against the
 * same call with its BF16 dequantization on the GPU (bitwise) and the CPU
 * (F8_SCRATCH_BOUND) */
static int f8_case(gpu_env *e, f8w *w, int silu, int n, int bias)
{
    const int N = (int)w->g.rows, K = (int)w->g.cols, O = silu ? N / 2 : N;
    float *x = rnd_floats(e, (size_t)n * K, -1, 1), *bh = rnd_floats(e, (size_t)N, -1, 1);
    sd_weight bc = {0}, bg = {0};
    if (bias && (e->cpu->ops->weight(e->cpu, &bc, bh, SD_DT_F32, 1, N) ||
                 e->gpu->ops->weight(e->gpu, &bg, bh, SD_DT_F32, 1, N)))
        return reportf(INFINITY, 0, "fp8 bias upload");
    float *co = (float *)malloc((size_t)n * N * sizeof(float));
    float *dx = (float *)gput(e, x, (size_t)n * K * sizeof(float));
    float *d8 = gpoison(e, (size_t)n * N), *d16 = gpoison(e, (size_t)n * N);
    if (silu) {
        e->cpu->ops->matmul_silu(e->cpu, co, x, &w->c, n, K);
        e->gpu->ops->matmul_silu(e->gpu, d8, dx, &w->g, n, K);
        e->gpu->ops->matmul_silu(e->gpu, d16, dx, &w->b, n, K);
    } else {
        e->cpu->ops->matmul(e->cpu, co, x, &w->c, bias ? &bc : NULL, n, K);
        e->gpu->ops->matmul(e->gpu, d8, dx, &w->g, bias ? &bg : NULL, n, K);
        e->gpu->ops->matmul(e->gpu, d16, dx, &w->b, bias ? &bg : NULL, n, K);
    }
    char name[160];
    snprintf(name, sizeof name, "fp8 %s n=%d N=%d K=%d blocks %dx%d%s",
             silu ? "matmul_silu" : "matmul", n, N, K, w->g.block[0], w->g.block[1],
             bias ? " +bias" : "");
    const int gemv = n <= SD_CUDA_GEMV_EXACT_ROWS;
    int ok = check_dev(e, d8, co, (size_t)n * O, gemv ? 1e-5 : F8_SCRATCH_BOUND, name);
    float *a = gget(e, d8, (size_t)n * O), *b = gget(e, d16, (size_t)n * O);
    if (!gemv)
        ok &= reportf(a && b ? bit_mismatches(a, b, (size_t)n * O) : INFINITY, 0,
                      "%s vs its bf16 dequantization on the GPU (differing elements)", name);
    free(a);
    free(b);
    GFREE_ALL(e, dx, d8, d16);
    if (bias) {
        e->gpu->ops->weight_free(e->gpu, &bg);
        e->cpu->ops->weight_free(e->cpu, &bc);
    }
    free(x);
    free(bh);
    free(co);
    return ok;
}

/* FP8 weights: the FP8 GEMV (1-8 rows: the factored dot) near the CPU's,
 * the BF16 paths on the dequantized scratch (9+ rows: tensor-core GEMV,
 * cuBLASLt) the bits of their BF16 dequantization, and the fused SiLU;
 * partial blocks of rows and columns, odd block shapes; weight_fp8 refuses
 * column blocks that are not a power of two >= 8 */
TEST(fp8_weights_match_the_cpu_and_their_bf16_scratch)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    struct { int N, K, bm, bn; } shapes[] = {
        {4096, 4096, 128, 128}, {1000, 2056, 128, 128}, {300, 520, 128, 128},
        {37, 64, 128, 128},     {2048, 1408, 128, 128}, {513, 1024, 64, 32},
    };
    const int ns[] = {1, 2, 3, 4, 5, 8, 9, 16, 40, 300};
    for (size_t si = 0; si < SD_ARRAY_LEN(shapes); si++) {
        f8w w;
        ASSERT_OK(f8w_make(&e, &w, shapes[si].N, shapes[si].K, shapes[si].bm, shapes[si].bn));
        for (size_t ni = 0; ni < SD_ARRAY_LEN(ns); ni++)
            ok &= f8_case(&e, &w, 0, ns[ni], ni % 3 == 1);
        f8w_free(&e, &w);
    }
    struct { int I, K; } silu[] = {{14336, 4096}, {1408, 2048}, {1001, 520}};
    const int sn[] = {1, 2, 3, 8, 20};
    for (size_t si = 0; si < SD_ARRAY_LEN(silu); si++) {
        f8w w;
        ASSERT_OK(f8w_make(&e, &w, 2 * silu[si].I, silu[si].K, 128, 128));
        for (size_t ni = 0; ni < SD_ARRAY_LEN(sn); ni++)
            ok &= f8_case(&e, &w, 1, sn[ni], 0);
        f8w_free(&e, &w);
    }
    uint8_t q[64] = {0};
    float s[4] = {1, 1, 1, 1};
    sd_weight bad;
    ok &= reportf(e.gpu->ops->weight_fp8(e.gpu, &bad, q, s, 8, 8, 4, 6) == 0, 0,
                  "weight_fp8 takes column blocks of 6");
    ok &= reportf(e.gpu->ops->weight_fp8(e.gpu, &bad, q, s, 8, 8, 4, 4) == 0, 0,
                  "weight_fp8 takes column blocks of 4");
    gpu_env_close(&e);
    ASSERT(ok);
}

/* moe_ffn with E FP8 experts (gate, up: I x D; down: D x I) against the
 * CPU's FP8 experts; tc: the tensor cores on for both, which read the
 * experts dequantized to BF16: also bitwise the same call with their BF16
 * dequantizations on the GPU (else the fused kernels, the factored dot:
 * m <= SD_CUDA_MOE_TC_FUSED_MAX_PAIRS) */
static int f8_moe_case(gpu_env *e, int n, int E, int K, int D, int I, int tc)
{
    f8w *w = (f8w *)calloc((size_t)E * 3, sizeof(f8w));
    sd_weight *ws = (sd_weight *)calloc((size_t)E * 9, sizeof(sd_weight));
    int ok = 1;
    for (int x = 0; x < E && ok; x++)
        ok = !f8w_make(e, &w[x], I, D, 128, 128) && !f8w_make(e, &w[E + x], I, D, 128, 128) &&
             !f8w_make(e, &w[2 * E + x], D, I, 128, 128);
    if (!ok)
        return reportf(INFINITY, 0, "fp8 experts: weight_fp8");
    for (int k = 0; k < 3 * E; k++) { /* [cpu fp8 | gpu fp8 | gpu bf16] x (gate, up, down) */
        ws[k] = w[k].c;
        ws[3 * E + k] = w[k].g;
        ws[6 * E + k] = w[k].b;
    }
    sd_experts ex[3];
    for (int v = 0; v < 3; v++)
        ex[v] = (sd_experts){.n = E, .gate = ws + 3 * E * v, .up = ws + 3 * E * v + E,
                             .down = ws + 3 * E * v + 2 * E, .first = 0};
    const size_t m = (size_t)n * K;
    int32_t *ids = (int32_t *)malloc(m * sizeof(int32_t));
    for (int t = 0; t < n; t++) /* K distinct experts a token */
        for (int j = 0; j < K; j++) {
            int x, dup;
            do {
                x = rnd_int(e, E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= ids[(size_t)t * K + i] == x;
            } while (dup);
            ids[(size_t)t * K + j] = x;
        }
    float *wt = rnd_floats(e, m, 0.05f, 1.0f), *x = rnd_floats(e, (size_t)n * D, -1, 1);
    const size_t tmpn = SD_MOE_TMP_FLOATS(n, K, D, I);
    float *tmp = (float *)malloc(tmpn * sizeof(float));
    float *co = (float *)malloc((size_t)n * D * sizeof(float));
    e->cpu->ops->moe_ffn(e->cpu, co, x, ids, wt, &ex[0], n, K, D, tmp);
    int32_t *did = (int32_t *)gput(e, ids, m * 4);
    float *dw = (float *)gput(e, wt, m * 4), *dx = (float *)gput(e, x, (size_t)n * D * 4);
    float *dtmp = gpoison(e, tmpn), *d8 = gpoison(e, (size_t)n * D), *d16 = gpoison(e, (size_t)n * D);
    sd_cuda_set_moe_tc(e->gpu, tc ? SD_CUDA_TC_ON : SD_CUDA_TC_AUTO);
    e->gpu->ops->moe_ffn(e->gpu, d8, dx, did, dw, &ex[1], n, K, D, dtmp);
    e->gpu->ops->moe_ffn(e->gpu, d16, dx, did, dw, &ex[2], n, K, D, dtmp);
    sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_AUTO);
    char name[160];
    snprintf(name, sizeof name, "fp8 moe_ffn n=%d E=%d top-%d D=%d I=%d (%s)", n, E, K, D, I,
             tc ? "tensor cores" : "fused");
    ok &= check_dev(e, d8, co, (size_t)n * D, tc ? 1e-2 : 1e-5, name);
    float *a = gget(e, d8, (size_t)n * D), *b = gget(e, d16, (size_t)n * D);
    if (tc)
        ok &= reportf(a && b ? bit_mismatches(a, b, (size_t)n * D) : INFINITY, 0,
                      "%s vs its bf16 dequantization on the GPU (differing elements)", name);
    free(a);
    free(b);
    GFREE_ALL(e, did, dw, dx, dtmp, d8, d16);
    for (int k = 0; k < 3 * E; k++)
        f8w_free(e, &w[k]);
    free(w);
    free(ws);
    free(ids);
    free(wt);
    free(x);
    free(tmp);
    free(co);
    return ok;
}

/* FP8 experts: the fused kernels (decode, verification) near the CPU's, the
 * tensor-core GEMMs (prefill) the bits of their BF16 dequantizations */
TEST(fp8_experts_match_the_cpu_and_their_bf16_scratch)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    ok &= f8_moe_case(&e, 1, 16, 6, 2048, 1408, 0); /* V2-Lite's expert shape */
    ok &= f8_moe_case(&e, 3, 16, 8, 2048, 1408, 0);
    ok &= f8_moe_case(&e, 2, 8, 2, 520, 264, 0); /* partial blocks */
    ok &= f8_moe_case(&e, 300, 8, 2, 520, 264, 1);
    ok &= f8_moe_case(&e, 200, 16, 6, 2048, 1408, 1);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(matmul_many_rows_match_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    for (int di = 0; di < 3; di++) {
        sd_dtype dt = all_dt[di];
        ok &= mm_case(&e, dt, 9, 512, 1024, 1024, 0);
        ok &= mm_case(&e, dt, 64, 512, 1024, 1032, 1);
        ok &= mm_case(&e, dt, 16, 300, 64, 64, 0);
        ok &= mm_case(&e, dt, 40, 77, 45, 47, 1);
        ok &= mm_case(&e, dt, 300, 2048, 2048, 2048, 0);
    }
    ok &= mm_case_split(&e, SD_DT_BF16, 64, 512, 1024, 1032, 1, 0);
    ok &= mm_case_split(&e, SD_DT_BF16, 300, 2048, 2048, 2048, 0, 0);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* Row counts above SD_CUDA_GEMM_EXACT_ROWS take the timed trial's choice of
 * a row count of their shape with more rows (up to twice theirs), or of
 * one in their power-of-two bucket above SD_CUDA_GEMM_POW2_ROWS: a prompt
 * step of a new length runs no trial where such a count did (the bundled
 * model's first 694-row prefill took 30.7 ms to launch on an H200, 0.46 ms
 * the second time), and each still matches the CPU. */
TEST(matmul_row_counts_of_one_bucket_share_its_timed_trial)
{
    gpu_env e;
    GPU_OPEN(e);
    const int N = 1024, K = 1024;
    int ok = mm_case(&e, SD_DT_BF16, 300, N, K, K, 0);
    const long t0 = sd_cuda_gemm_trials(e.gpu);
    ok &= reportf(t0 > 0 ? 0 : 1, 0, "matmul BF16 n=300: a timed trial ran (%ld)", t0);
    ok &= mm_case(&e, SD_DT_BF16, 400, N, K, K, 0); /* 257..512: the same bucket */
    ok &= mm_case(&e, SD_DT_BF16, 511, N, K, K, 0);
    ok &= mm_case(&e, SD_DT_BF16, 200, N, K, K, 0); /* under 300, over its half */
    ok &= mm_case(&e, SD_DT_BF16, 151, N, K, K, 0);
    const long t1 = sd_cuda_gemm_trials(e.gpu);
    ok &= reportf((double)(t1 - t0), 0, "matmul BF16 n=400, 511, 200, 151 after n=300: trials run");
    ok &= mm_case(&e, SD_DT_BF16, 700, N, K, K, 0); /* 513..1024, nothing above: its own */
    ok &= mm_case(&e, SD_DT_BF16, 100, N, K, K, 0); /* nothing in 101..200 timed: its own */
    ok &= reportf(fabs(2.0 - (double)(sd_cuda_gemm_trials(e.gpu) - t1)), 0,
                  "matmul BF16 n=700, 100: a trial each");
    /* the few rows above the GEMV's: a count with nothing timed within
     * twice its rows runs its own, the counts below it share it */
    const long t2 = sd_cuda_gemm_trials(e.gpu);
    ok &= mm_case(&e, SD_DT_BF16, 40, N, K, K, 0);
    ok &= reportf(fabs(1.0 - (double)(sd_cuda_gemm_trials(e.gpu) - t2)), 0,
                  "matmul BF16 n=40: a trial");
    ok &= mm_case(&e, SD_DT_BF16, 33, N, K, K, 0);
    ok &= mm_case(&e, SD_DT_BF16, SD_CUDA_GEMM_EXACT_ROWS + 4, N, K, K, 0);
    ok &= reportf(fabs(1.0 - (double)(sd_cuda_gemm_trials(e.gpu) - t2)), 0,
                  "matmul BF16 n=33, %d after n=40: no trial", SD_CUDA_GEMM_EXACT_ROWS + 4);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A timed choice outlives its plan: after more row counts than the plan
 * cache holds, a timed row count met again runs no trial (a server's prompt
 * steps replaced the start's timed plans and ran their trials again:
 * NOTES.md, session 32). */
TEST(matmul_a_timed_choice_outlives_its_plan)
{
    gpu_env e;
    GPU_OPEN(e);
    const int N = 1024, K = 1024, Nf = 64, Kf = 64, top = 1300, fillers = 600;
    int ok = mm_case(&e, SD_DT_BF16, 300, N, K, K, 0);
    const long t0 = sd_cuda_gemm_trials(e.gpu);
    /* another shape at 600 row counts (more than the plan cache holds): the
     * first timed, the others sharing its choice (within twice their rows) */
    tw w;
    ASSERT_OK(tw_make(&e, &w, SD_DT_BF16, Nf, Kf, 0.5f));
    float *x = rnd_floats(&e, (size_t)top * Kf, -1, 1);
    float *dx = (float *)gput(&e, x, (size_t)top * Kf * sizeof(float));
    float *dy = gpoison(&e, (size_t)top * Nf);
    for (int n = top; n > top - fillers; n--)
        e.gpu->ops->matmul(e.gpu, dy, dx, &w.g, NULL, n, Kf);
    ASSERT_OK(e.gpu->ops->sync(e.gpu));
    const long t1 = sd_cuda_gemm_trials(e.gpu);
    ok &= reportf(fabs(1.0 - (double)(t1 - t0)), 0, "matmul BF16 %d row counts of %dx%d: one trial",
                  fillers, Nf, Kf);
    /* n = 300 of the first shape again: its plan was replaced, its choice kept */
    ok &= mm_case(&e, SD_DT_BF16, 300, N, K, K, 0);
    ok &= reportf((double)(sd_cuda_gemm_trials(e.gpu) - t1), 0,
                  "matmul BF16 n=300 again after its plan was replaced: trials run");
    gfree(&e, dx);
    gfree(&e, dy);
    free(x);
    tw_free(&e, &w);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(matmul_heads_matches_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* MLA's absorbed products: q_lat = W_UK^T q_nope per head (x heads
     * qk apart, offset 0) and out = W_UV lat per head */
    struct { int H, N, K, xs, xhs, xoff; } cs[] = {
        {4, 32, 48, 4 * 72, 72, 0}, {16, 64, 128, 16 * 192, 192, 0}, {5, 24, 20, 5 * 30, 30, 8},
        /* DeepSeek-V2-Lite's: q_nope (128 of 192 per head) -> latent 512,
         * latent 512 -> v 128 */
        {16, 512, 128, 16 * 192, 192, 0}, {16, 128, 512, 16 * 512, 512, 0},
    };
    int ns[4] = {1, 5, SD_CUDA_GEMV_EXACT_ROWS + 4, SD_CUDA_GEMV_MAX_ROWS + 8};
    sd_dtype dts[2] = {SD_DT_F32, SD_DT_BF16};
    for (size_t k = 0; k < SD_ARRAY_LEN(cs); k++)
        for (int a = 0; a < 4; a++)
            for (int di = 0; di < 2; di++) {
                int H = cs[k].H, N = cs[k].N, K = cs[k].K, n = ns[a];
                tw w;
                ASSERT_OK(tw_make(&e, &w, dts[di], (int64_t)H * N, K, 0.5f));
                size_t mx = (size_t)n * cs[k].xs, my = (size_t)n * H * N;
                float *x = rnd_floats(&e, mx, -1, 1);
                float *co = (float *)malloc(my * sizeof(float));
                e.cpu->ops->matmul_heads(e.cpu, co, x, &w.c, n, H, cs[k].xs, cs[k].xhs, cs[k].xoff);
                float *dx = (float *)gput(&e, x, mx * sizeof(float));
                float *dy = gpoison(&e, my);
                e.gpu->ops->matmul_heads(e.gpu, dy, dx, &w.g, n, H, cs[k].xs, cs[k].xhs,
                                         cs[k].xoff);
                char name[128];
                snprintf(name, sizeof name, "matmul_heads %s n=%d H=%d N=%d K=%d off=%d",
                         sd_dtype_name(dts[di]), n, H, N, K, cs[k].xoff);
                ok &= check_dev(&e, dy, co, my, 1e-5, name);
                gfree(&e, dx);
                gfree(&e, dy);
                free(x);
                free(co);
                tw_free(&e, &w);
            }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* -------------------------------------------------------------- attention */

/* One step over a paged cache: sequence s has ctx[s] positions, the last
 * nnew[s] of which are this step's tokens; every sequence's blocks are drawn
 * from a shuffled pool, so tables are not contiguous. */
typedef struct tbatch {
    int T, n_slots, max_pos;
    int32_t *pos, *seq, *slot, *table;
    int32_t *dpos, *dseq, *dslot, *dtable;
    sd_attn_batch hb, db; /* host view (CPU) and device view (GPU) */
} tbatch;

static void tbatch_make(gpu_env *e, tbatch *b, int n_seq, const int *ctx, const int *nnew, int bs)
{
    memset(b, 0, sizeof *b);
    int max_blocks = 0, need = 0;
    for (int s = 0; s < n_seq; s++) {
        int nb = (ctx[s] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks;
        need += nb;
        b->T += nnew[s];
    }
    int pool = need + 7;
    int32_t *perm = (int32_t *)malloc((size_t)pool * sizeof(int32_t));
    for (int i = 0; i < pool; i++)
        perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = rnd_int(e, i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    b->table = (int32_t *)malloc((size_t)n_seq * max_blocks * sizeof(int32_t));
    for (int i = 0; i < n_seq * max_blocks; i++)
        b->table[i] = -1; /* never read: a stray read goes out of bounds */
    int next = 0;
    for (int s = 0; s < n_seq; s++)
        for (int k = 0; k < (ctx[s] + bs - 1) / bs; k++)
            b->table[s * max_blocks + k] = perm[next++];
    b->pos = (int32_t *)malloc((size_t)b->T * sizeof(int32_t));
    b->seq = (int32_t *)malloc((size_t)b->T * sizeof(int32_t));
    b->slot = (int32_t *)malloc((size_t)b->T * sizeof(int32_t));
    int t = 0;
    for (int s = 0; s < n_seq; s++)
        for (int p = ctx[s] - nnew[s]; p < ctx[s]; p++, t++) {
            b->pos[t] = p;
            b->seq[t] = s;
            b->slot[t] = b->table[s * max_blocks + p / bs] * bs + p % bs;
            b->max_pos = p + 1 > b->max_pos ? p + 1 : b->max_pos;
        }
    b->n_slots = pool * bs;
    size_t ti = (size_t)b->T * sizeof(int32_t);
    b->dpos = (int32_t *)gput(e, b->pos, ti);
    b->dseq = (int32_t *)gput(e, b->seq, ti);
    b->dslot = (int32_t *)gput(e, b->slot, ti);
    b->dtable = (int32_t *)gput(e, b->table, (size_t)n_seq * max_blocks * sizeof(int32_t));
    b->hb = (sd_attn_batch){.n_tokens = b->T, .pos = b->pos, .seq = b->seq, .slot = b->slot,
                            .block_table = b->table, .max_blocks = max_blocks, .block_size = bs,
                            .max_pos = b->max_pos};
    b->db = b->hb;
    b->db.pos = b->dpos;
    b->db.seq = b->dseq;
    b->db.slot = b->dslot;
    b->db.block_table = b->dtable;
    free(perm);
}

static void tbatch_free(gpu_env *e, tbatch *b)
{
    free(b->pos);
    free(b->seq);
    free(b->slot);
    free(b->table);
    gfree(e, b->dpos);
    gfree(e, b->dseq);
    gfree(e, b->dslot);
    gfree(e, b->dtable);
}

/* rope_kv against the CPU: q and k (rotated in place) within rope's bound,
 * the cache rows at the step's slots too, every other cache row untouched
 * (the caches start random on both sides; the GPU's copy is compared whole) */
static int rope_kv_case(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew,
                        int bs, int Hq, int Hkv, int D, int Dv, int rot, int il)
{
    tbatch b;
    tbatch_make(e, &b, n_seq, ctx, nnew, bs);
    int T = b.T, q_stride = Hq * D + 8, kv_stride = Hkv * (D > Dv ? D : Dv) + 4, half = rot / 2;
    size_t mq = (size_t)T * q_stride, mkv = (size_t)T * kv_stride;
    size_t mkc = (size_t)b.n_slots * Hkv * D, mvc = (size_t)b.n_slots * Hkv * Dv;
    float *inv = (float *)malloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++)
        inv[i] = powf(500000.0f, -2.0f * (float)i / (float)rot);
    float *q = rnd_floats(e, mq, -2, 2), *k = rnd_floats(e, mkv, -1, 1);
    float *v = rnd_floats(e, mkv, -1, 1);
    float *kc = rnd_floats(e, mkc, -1, 1), *vc = rnd_floats(e, mvc, -1, 1);
    float *dq = (float *)gput(e, q, mq * 4), *dk = (float *)gput(e, k, mkv * 4);
    float *dv = (float *)gput(e, v, mkv * 4), *dinv = (float *)gput(e, inv, (size_t)half * 4);
    float *dkc = (float *)gput(e, kc, mkc * 4), *dvc = (float *)gput(e, vc, mvc * 4);
    sd_rope rc = {.inv_freq = inv, .rot_dim = rot, .interleave = il, .mscale = 1.0f}, rg = rc;
    rg.inv_freq = dinv;
    e->cpu->ops->rope_kv(e->cpu, q, k, v, kc, vc, &b.hb, &rc, Hq, Hkv, D, Dv, q_stride, kv_stride);
    e->gpu->ops->rope_kv(e->gpu, dq, dk, dv, dkc, dvc, &b.db, &rg, Hq, Hkv, D, Dv, q_stride,
                         kv_stride);
    char name[200];
    int ok = 1;
    const char *part[4] = {"q", "k", "k cache", "v cache"};
    float *dp[4] = {dq, dk, dkc, dvc}, *cp[4] = {q, k, kc, vc};
    size_t m[4] = {mq, mkv, mkc, mvc};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "rope_kv %s T=%d Hq=%d Hkv=%d D=%d rot=%d %s: %s", what, T, Hq,
                 Hkv, D, rot, il ? "interleaved" : "halves", part[i]);
        ok &= check_dev(e, dp[i], cp[i], m[i], i == 3 ? 0 : 1e-5, name);
    }
    float *ptrs[7] = {dq, dk, dv, dinv, dkc, dvc, NULL};
    for (int i = 0; ptrs[i]; i++)
        gfree(e, ptrs[i]);
    free(q);
    free(k);
    free(v);
    free(kc);
    free(vc);
    free(inv);
    tbatch_free(e, &b);
    return ok;
}

/* mla_prep against the CPU: the normed latent and the roped key in place,
 * the roped query parts, and the cache (rows at the step's slots written) */
static int mla_prep_case(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew,
                         int bs, int H, int C, int R, int qk, sd_dtype dt)
{
    tbatch b;
    tbatch_make(e, &b, n_seq, ctx, nnew, bs);
    int T = b.T, W = H * qk + C + R, half = R / 2;
    size_t mx = (size_t)T * W, mc = (size_t)b.n_slots * (C + R);
    float *inv = (float *)malloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)R);
    tw w;
    if (tw_make(e, &w, dt, 1, C, 1.5f))
        return report("mla_prep: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, mx, -3, 3), *cache = rnd_floats(e, mc, -1, 1);
    float *dx = (float *)gput(e, x, mx * 4), *dc = (float *)gput(e, cache, mc * 4);
    float *dinv = (float *)gput(e, inv, (size_t)half * 4);
    sd_rope rc = {.inv_freq = inv, .rot_dim = R, .interleave = 1, .mscale = 1.1f}, rg = rc;
    rg.inv_freq = dinv;
    int nope = qk - R, off = H * qk;
    e->cpu->ops->mla_prep(e->cpu, x + off, W, x + nope, W, qk, &w.c, 1e-6f, cache, &b.hb, &rc, H,
                          C, R);
    e->gpu->ops->mla_prep(e->gpu, dx + off, W, dx + nope, W, qk, &w.g, 1e-6f, dc, &b.db, &rg, H,
                          C, R);
    char name[200];
    snprintf(name, sizeof name, "mla_prep %s T=%d H=%d C=%d R=%d %s: rows", what, T, H, C, R,
             sd_dtype_name(dt));
    int ok = check_dev(e, dx, x, mx, 1e-5, name);
    snprintf(name, sizeof name, "mla_prep %s T=%d H=%d C=%d R=%d %s: cache", what, T, H, C, R,
             sd_dtype_name(dt));
    ok &= check_dev(e, dc, cache, mc, 1e-5, name);
    GFREE_ALL(e, dx, dc, dinv);
    free(x);
    free(cache);
    free(inv);
    tw_free(e, &w);
    tbatch_free(e, &b);
    return ok;
}

/* mla_prep_absorb with the CUDA backend's one launch (sd_cuda_set_mla_overlap)
 * against its two GPU ops, bit for bit (the rows in place: the normed latent,
 * the roped key and query parts, the nope parts untouched; the cache; the
 * absorbed queries), and against the CPU's two ops within their bounds.
 * Steps of 1 and 2 tokens take the one launch; 3 tokens and fp32 W_UK the
 * two ops (the same bits trivially). */
static int mla_prep_absorb_case(gpu_env *e, const char *what, int n_seq, const int *ctx,
                                const int *nnew, int H, int C, int R, int qk, sd_dtype wdt)
{
    tbatch b;
    tbatch_make(e, &b, n_seq, ctx, nnew, 16);
    int T = b.T, W = H * qk + C + R, half = R / 2, nope = qk - R, off = H * qk;
    size_t mx = (size_t)T * W, mc = (size_t)b.n_slots * (C + R), my = (size_t)T * H * C;
    float *inv = (float *)malloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)R);
    tw w, wuk;
    if (tw_make(e, &w, SD_DT_BF16, 1, C, 1.5f) || tw_make(e, &wuk, wdt, (int64_t)H * C, nope, 0.5f))
        return report("mla_prep_absorb: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, mx, -3, 3), *cache = rnd_floats(e, mc, -1, 1);
    float *y = (float *)malloc(my * sizeof(float));
    float *dinv = (float *)gput(e, inv, (size_t)half * 4);
    sd_rope rc = {.inv_freq = inv, .rot_dim = R, .interleave = 1, .mscale = 1.1f}, rg = rc;
    rg.inv_freq = dinv;
    float *dx[2], *dc[2], *dy[2];
    for (int v = 0; v < 2; v++) { /* 0: the two ops, 1: the one launch */
        dx[v] = (float *)gput(e, x, mx * 4);
        dc[v] = (float *)gput(e, cache, mc * 4);
        dy[v] = gpoison(e, my);
        sd_cuda_set_mla_overlap(e->gpu, v);
        e->gpu->ops->mla_prep_absorb(e->gpu, dx[v] + off, W, dx[v] + nope, W, qk, &w.g, 1e-6f,
                                     dc[v], &b.db, &rg, H, C, R, dy[v], dx[v], &wuk.g, W, qk);
        sd_cuda_set_mla_overlap(e->gpu, SD_CUDA_MLA_OVERLAP_DEFAULT);
    }
    sd_mla_prep_absorb(e->cpu, x + off, W, x + nope, W, qk, &w.c, 1e-6f, cache, &b.hb, &rc, H, C,
                       R, y, x, &wuk.c, W, qk);
    char name[200];
    int ok = 1;
    const char *part[3] = {"rows", "cache", "absorbed queries"};
    float *dv[3][2] = {{dx[0], dx[1]}, {dc[0], dc[1]}, {dy[0], dy[1]}}, *cv[3] = {x, cache, y};
    size_t m[3] = {mx, mc, my};
    for (int i = 0; i < 3; i++) {
        float *g0 = gget(e, dv[i][0], m[i]), *g1 = gget(e, dv[i][1], m[i]);
        snprintf(name, sizeof name, "mla_prep_absorb %s T=%d H=%d C=%d R=%d W_UK %s: %s, one "
                 "launch vs the two ops (mismatches)", what, T, H, C, R, sd_dtype_name(wdt),
                 part[i]);
        ok &= report(name, g0 && g1 ? bit_mismatches(g0, g1, m[i]) : INFINITY, 0);
        free(g0);
        free(g1);
        snprintf(name, sizeof name, "mla_prep_absorb %s T=%d H=%d C=%d R=%d W_UK %s: %s vs the cpu",
                 what, T, H, C, R, sd_dtype_name(wdt), part[i]);
        ok &= check_dev(e, dv[i][1], cv[i], m[i], 1e-5, name);
    }
    GFREE_ALL(e, dx[0], dx[1], dc[0], dc[1], dy[0], dy[1], dinv);
    free(x);
    free(cache);
    free(y);
    free(inv);
    tw_free(e, &w);
    tw_free(e, &wuk);
    tbatch_free(e, &b);
    return ok;
}

TEST(mla_prep_absorb_in_one_launch_gives_the_two_ops_bits)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    int c1[1] = {1}, n1[1] = {1}, c1b[1] = {300}, c2[2] = {70, 9}, n2[2] = {1, 1};
    int c3[1] = {40}, n3[1] = {3}, c5[2] = {33, 4100}, n5[2] = {1, 2};
    /* V2-Lite (16 heads), V3 a rank of 8 (16) and whole (128), an odd one */
    ok &= mla_prep_absorb_case(&e, "decode", 1, c1, n1, 16, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_absorb_case(&e, "decode at 300", 1, c1b, n1, 16, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_absorb_case(&e, "two sequences", 2, c2, n2, 128, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_absorb_case(&e, "2-token verify", 1, c3, n5 + 1, 16, 512, 64, 192, SD_DT_F16);
    ok &= mla_prep_absorb_case(&e, "odd heads", 1, c1b, n1, 5, 512, 64, 192, SD_DT_BF16);
    /* the two ops: 3 tokens, fp32 W_UK */
    ok &= mla_prep_absorb_case(&e, "3-token verify", 1, c3, n3, 16, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_absorb_case(&e, "fp32 W_UK", 2, c5, n5, 16, 512, 64, 192, SD_DT_F32);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(rope_kv_and_mla_prep_match_the_cpu_on_ragged_paged_batches)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    int c1[1] = {1}, n1[1] = {1};
    int c3[3] = {70, 5, 300}, n3[3] = {1, 5, 4};
    int c2[2] = {4100, 9}, n2[2] = {3, 9};
    ok &= rope_kv_case(&e, "decode", 1, c1, n1, 16, 32, 8, 128, 128, 128, 0);
    ok &= rope_kv_case(&e, "ragged", 3, c3, n3, 16, 8, 2, 128, 128, 128, 0);
    ok &= rope_kv_case(&e, "partial rotary", 2, c2, n2, 32, 6, 3, 64, 64, 32, 0);
    ok &= rope_kv_case(&e, "interleaved, Dv < D", 3, c3, n3, 16, 4, 4, 96, 64, 64, 1);
    ok &= mla_prep_case(&e, "decode", 1, c1, n1, 16, 16, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_case(&e, "ragged", 3, c3, n3, 16, 128, 512, 64, 192, SD_DT_BF16);
    ok &= mla_prep_case(&e, "odd latent", 2, c2, n2, 32, 5, 250, 30, 80, SD_DT_F32);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A step's output rows (dout: T rows of m1 floats) against each token run
 * alone, a 1-token step on the same cache rows (the batch's arrays from
 * entry t; it rewrites its own cache row with the same values): the floats
 * whose bits differ, INFINITY on a failed download. run(e, ctx, out, t,
 * one): the op on token t's inputs. Attention's chunks come from the head
 * layout, not from the step's tokens, so where a kernel splits both steps
 * alike this is 0. */
typedef void (*token_alone_fn)(gpu_env *e, void *ctx, float *out, int t, const sd_attn_batch *one);
static double alone_mismatches(gpu_env *e, const tbatch *b, float *dout, size_t m1,
                               token_alone_fn run, void *ctx)
{
    float *gv = gget(e, dout, (size_t)b->T * m1), *dout1 = gpoison(e, m1);
    double differ = gv ? 0 : INFINITY;
    for (int t = 0; t < b->T && gv; t++) {
        sd_attn_batch one = b->db;
        one.n_tokens = 1;
        one.pos = b->dpos + t;
        one.seq = b->dseq + t;
        one.slot = b->dslot + t;
        one.max_pos = b->pos[t] + 1;
        run(e, ctx, dout1, t, &one);
        float *g1 = gget(e, dout1, m1);
        differ += bit_mismatches(g1, gv + (size_t)t * m1, m1);
        free(g1);
    }
    free(gv);
    gfree(e, dout1);
    return differ;
}

/* what a check expects of each token run alone (alone_mismatches) */
enum { ALONE_SKIP = 0, ALONE_SAME = 1, ALONE_DIFFERS = -1 };
static int report_alone(double differ, int alone, const char *name)
{
    if (alone == ALONE_SAME)
        return reportf(differ, 0, "%s: floats that differ, each token alone vs in the step", name);
    return reportf(differ > 0 && differ < INFINITY ? 0 : 1, 0,
                   "%s: each token alone differs from the step (%.0f floats)", name, differ);
}

struct gqa_args {
    const float *q, *k, *v;
    float *kc, *vc;
    int Hq, Hkv, D, Dv, q_stride, kv_stride;
    float scale;
};

static void gqa_alone(gpu_env *e, void *ctx, float *out, int t, const sd_attn_batch *one)
{
    const struct gqa_args *g = ctx;
    e->gpu->ops->attn_gqa(e->gpu, out, g->q + (size_t)t * g->q_stride, g->k + (size_t)t * g->kv_stride,
                          g->v + (size_t)t * g->kv_stride, g->kc, g->vc, one, g->Hq, g->Hkv, g->D,
                          g->Dv, g->q_stride, g->kv_stride, g->scale);
}

static int gqa_run(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew, int bs,
                   int Hq, int Hkv, int D, int Dv, int alone)
{
    tbatch b;
    tbatch_make(e, &b, n_seq, ctx, nnew, bs);
    int T = b.T, q_stride = Hq * D + 8, kv_stride = Hkv * (D > Dv ? D : Dv) + 4;
    size_t mq = (size_t)T * q_stride, mkv = (size_t)T * kv_stride;
    size_t mkc = (size_t)b.n_slots * Hkv * D, mvc = (size_t)b.n_slots * Hkv * Dv;
    size_t mo = (size_t)T * Hq * Dv;
    float *q = rnd_floats(e, mq, -2, 2), *k = rnd_floats(e, mkv, -1, 1);
    float *v = rnd_floats(e, mkv, -1, 1);
    float *kc = rnd_floats(e, mkc, -1, 1), *vc = rnd_floats(e, mvc, -1, 1);
    float *dq = (float *)gput(e, q, mq * 4), *dk = (float *)gput(e, k, mkv * 4);
    float *dv = (float *)gput(e, v, mkv * 4);
    float *dkc = (float *)gput(e, kc, mkc * 4), *dvc = (float *)gput(e, vc, mvc * 4);
    float *dout = gpoison(e, mo);
    float *co = (float *)malloc(mo * sizeof(float));
    float scale = 1.0f / sqrtf((float)D);
    e->cpu->ops->attn_gqa(e->cpu, co, q, k, v, kc, vc, &b.hb, Hq, Hkv, D, Dv, q_stride, kv_stride,
                          scale);
    e->gpu->ops->attn_gqa(e->gpu, dout, dq, dk, dv, dkc, dvc, &b.db, Hq, Hkv, D, Dv, q_stride,
                          kv_stride, scale);
    char name[200];
    snprintf(name, sizeof name, "attn_gqa %s T=%d max_pos=%d Hq=%d Hkv=%d D=%d Dv=%d bs=%d", what,
             T, b.max_pos, Hq, Hkv, D, Dv, bs);
    int ok = check_dev(e, dout, co, mo, 5e-5, name);
    if (alone != ALONE_SKIP) {
        struct gqa_args g = {dq, dk, dv, dkc, dvc, Hq, Hkv, D, Dv, q_stride, kv_stride, scale};
        ok &= report_alone(alone_mismatches(e, &b, dout, (size_t)Hq * Dv, gqa_alone, &g), alone,
                           name);
    }
    snprintf(name, sizeof name, "attn_gqa %s K/V cache stores", what);
    float *gk = gget(e, dkc, mkc), *gv = gget(e, dvc, mvc);
    double err = gk && gv ? fmax(rel_err(gk, kc, mkc), rel_err(gv, vc, mvc)) : INFINITY;
    ok &= report(name, err, 0);
    free(gk);
    free(gv);
    {
        /* the decode kernel's cache slots resolved before its wait in every
         * launch (sd_cuda_set_step_early 2; eager, the default resolves
         * them after it): the same bits */
        float *ref = gget(e, dout, mo), *d2 = gpoison(e, mo);
        sd_cuda_set_step_early(e->gpu, 2);
        e->gpu->ops->attn_gqa(e->gpu, d2, dq, dk, dv, dkc, dvc, &b.db, Hq, Hkv, D, Dv, q_stride,
                              kv_stride, scale);
        sd_cuda_set_step_early(e->gpu, SD_CUDA_STEP_EARLY_DEFAULT);
        float *g2 = gget(e, d2, mo);
        ok &= reportf(ref && g2 && !memcmp(ref, g2, mo * sizeof(float)) ? 0 : 1, 0,
                      "attn_gqa %s: the slots resolved before the wait give the same bits",
                      what);
        free(ref);
        free(g2);
        gfree(e, d2);
    }
    float *hs[] = {q, k, v, kc, vc, co};
    for (size_t i = 0; i < SD_ARRAY_LEN(hs); i++)
        free(hs[i]);
    float *ds[] = {dq, dk, dv, dkc, dvc, dout};
    for (size_t i = 0; i < SD_ARRAY_LEN(ds); i++)
        gfree(e, ds[i]);
    tbatch_free(e, &b);
    return ok;
}

static int gqa_case(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew, int bs,
                    int Hq, int Hkv, int D, int Dv)
{
    return gqa_run(e, what, n_seq, ctx, nnew, bs, Hq, Hkv, D, Dv, ALONE_SKIP);
}

TEST(attn_gqa_matches_the_cpu_on_ragged_paged_batches)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* a fresh sequence, a prefill chunk on a prefix, a decode, a 5-token
     * verification, a whole 64-token prefill, in one step */
    int ctx[5] = {1, 37, 300, 1005, 64}, nnew[5] = {1, 20, 1, 5, 64};
    ok &= gqa_case(&e, "ragged", 5, ctx, nnew, 16, 8, 2, 64, 64);
    ok &= gqa_case(&e, "ragged mha", 5, ctx, nnew, 32, 4, 4, 128, 128);
    ok &= gqa_case(&e, "ragged group-3 Dv!=D", 5, ctx, nnew, 16, 12, 4, 96, 64);
    ok &= gqa_case(&e, "ragged group-16", 5, ctx, nnew, 16, 32, 2, 128, 128);
    int c1[1] = {9}, n1[1] = {9};
    ok &= gqa_case(&e, "tiny head_dim", 1, c1, n1, 16, 4, 2, 8, 8);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(attn_gqa_matches_the_cpu_on_long_contexts)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    int ctx[2] = {8192, 4000}, nnew[2] = {4, 1};
    ok &= gqa_case(&e, "long", 2, ctx, nnew, 16, 8, 1, 128, 128);
    int c2[1] = {6000}, n2[1] = {64};
    ok &= gqa_case(&e, "long prefill chunk", 1, c2, n2, 64, 8, 8, 64, 64);
    /* decode and verify steps (<= 8 tokens): split-KV chunks, some empty */
    int c3[1] = {1}, n3[1] = {1};
    ok &= gqa_case(&e, "split decode ctx 1", 1, c3, n3, 16, 32, 8, 128, 128);
    int c4[3] = {33, 700, 129}, n4[3] = {1, 1, 4};
    ok &= gqa_case(&e, "split decode+verify", 3, c4, n4, 16, 32, 8, 128, 128);
    int c5[2] = {20000, 3}, n5[2] = {1, 1};
    ok &= gqa_case(&e, "split long", 2, c5, n5, 16, 8, 2, 64, 64);
    /* 128-dim heads of every group width attn_dec_kernel takes (1, 2, 3-4,
     * 5-8 heads a block; 16: two blocks a KV head), ragged decode and
     * verify rows, chunks of several tiles and partly filled ones */
    int c6[4] = {1, 95, 2100, 31}, n6[4] = {1, 3, 1, 3};
    static const struct { const char *what; int bs, Hq, Hkv; } widths[] = {
        {"split mha D=128", 16, 4, 4},      {"split group-2 D=128", 16, 8, 4},
        {"split group-3 D=128", 32, 12, 4}, {"split group-7 D=128", 16, 28, 4},
        {"split group-16 D=128", 16, 32, 2},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(widths); i++)
        ok &= gqa_case(&e, widths[i].what, 4, c6, n6, widths[i].bs, widths[i].Hq, widths[i].Hkv,
                       128, 128);
    int c7[1] = {30000}, n7[1] = {8};
    ok &= gqa_case(&e, "split long verify D=128", 1, c7, n7, 16, 32, 8, 128, 128);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A verify step of nv tokens plus a decode at 128-dim heads (attn_dec_kernel;
 * steps of 9+ tokens split from SPECD_ATTN_SPLIT_ALL=2): each token's bits
 * as computed alone */
static int gqa_decode_equals_verify(gpu_env *e, int Hq, int Hkv, int P, int nv, int level)
{
    int ctx[2] = {P + nv, 50}, nnew[2] = {nv, 1};
    char what[64];
    snprintf(what, sizeof what, "verify+decode, split level %d", level);
    sd_cuda_set_attn_split_all(e->gpu, level);
    int ok = gqa_run(e, what, 2, ctx, nnew, 16, Hq, Hkv, 128, 128, ALONE_SAME);
    sd_cuda_set_attn_split_all(e->gpu, SD_CUDA_ATTN_SPLIT_ALL_DEFAULT);
    return ok;
}

/* The tensor-core MLA kernel (sd_cuda_set_mla_tc, DeepSeek shape C = 512,
 * R = 64) against the fp32 CPU op: q, the cached rows and the softmax
 * weights are rounded to bf16 (u = 2^-8), so the error is bf16 rounding, not
 * fp32 ulps. A model of the kernel's rounding on these inputs
 * (bench/kernels/mla_tc_error_model.py) gives 2.0e-3 at 1 key, 5.2e-3 at 2
 * keys (the worst), 2.2-3.3e-3 from 64 to 4100 keys; kernels/cuda/
 * attention.cu derives it. */
#define MLA_TC_BOUND 1e-2

/* One attn_mla step, GPU against CPU, on one of the kernels:
 * MLA_SIMT  the fp32 SIMT kernel (tensor cores and the decode kernel off);
 * MLA_TC    the tensor-core kernel (the decode kernel off): for shapes it
 *           takes the bound is MLA_TC_BOUND and the output must also differ
 *           from the SIMT kernel's (the new path ran, not the fallback);
 *           other shapes fall back to the SIMT kernel and its 5e-5;
 * MLA_DEC   the decode kernel on (sd_cuda_set_mla_dec): steps of <= 8
 *           tokens at the DeepSeek shape on mla_dec_kernel (fp32: 5e-5),
 *           which must differ from the tensor-core kernel's output (it
 *           ran), the rest as MLA_TC. */
enum { MLA_SIMT, MLA_TC, MLA_DEC };
struct mla_args {
    const float *qlat, *q, *ckv;
    float *cache;
    int H, C, R, nope;
    float scale;
};

static void mla_alone(gpu_env *e, void *ctx, float *out, int t, const sd_attn_batch *one)
{
    const struct mla_args *m = ctx;
    const int qk = m->nope + m->R, row = m->C + m->R;
    e->gpu->ops->attn_mla(e->gpu, out, m->qlat + (size_t)t * m->H * m->C,
                          m->q + (size_t)t * m->H * qk + m->nope, m->ckv + (size_t)t * row,
                          m->ckv + (size_t)t * row + m->C, m->cache, one, m->H, m->C, m->R,
                          m->H * qk, qk, row, m->scale);
}

/* the step of b again on the kernel settings now, twice: the same bits as
 * gt (mo floats) */
static int mla_again(gpu_env *e, const struct mla_args *m, const tbatch *b, const float *gt,
                     size_t mo, const char *what)
{
    const int qk = m->nope + m->R, row = m->C + m->R;
    int ok = 1;
    for (int rep = 0; rep < 2; rep++) {
        float *d = gpoison(e, mo);
        e->gpu->ops->attn_mla(e->gpu, d, m->qlat, m->q + m->nope, m->ckv, m->ckv + m->C, m->cache,
                              &b->db, m->H, m->C, m->R, m->H * qk, qk, row, m->scale);
        float *g = gget(e, d, mo);
        ok &= reportf(gt && g && !memcmp(gt, g, mo * sizeof(float)) ? 0 : 1, 0,
                      "%s gives the same bits (call %d)", what, rep + 1);
        free(g);
        gfree(e, d);
    }
    return ok;
}

/* mla_run, and with alone (ALONE_SAME / ALONE_DIFFERS) each token of the
 * step run alone on the same kernel settings */
static int mla_check(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew,
                     int bs, int H, int C, int R, int nope, int mode, int alone)
{
    tbatch b;
    tbatch_make(e, &b, n_seq, ctx, nnew, bs);
    int dec_shape = mode == MLA_DEC && C == 512 && R == 64 && b.T <= 8;
    int tc_shape = mode != MLA_SIMT && C == 512 && R == 64 && !dec_shape;
    sd_cuda_set_mla_tc(e->gpu, mode != MLA_SIMT);
    sd_cuda_set_mla_dec(e->gpu, mode == MLA_DEC);
    int T = b.T, qk = nope + R, row = C + R;
    size_t mql = (size_t)T * H * C, mq = (size_t)T * H * qk, mck = (size_t)T * row;
    size_t mc = (size_t)b.n_slots * row, mo = (size_t)T * H * C;
    float *qlat = rnd_floats(e, mql, -1, 1), *q = rnd_floats(e, mq, -1, 1);
    float *ckv = rnd_floats(e, mck, -1, 1), *cache = rnd_floats(e, mc, -1, 1);
    float *dqlat = (float *)gput(e, qlat, mql * 4), *dq = (float *)gput(e, q, mq * 4);
    float *dckv = (float *)gput(e, ckv, mck * 4), *dcache = (float *)gput(e, cache, mc * 4);
    float *dout = gpoison(e, mo);
    float *co = (float *)malloc(mo * sizeof(float));
    float scale = 1.0f / sqrtf((float)qk);
    e->cpu->ops->attn_mla(e->cpu, co, qlat, q + nope, ckv, ckv + C, cache, &b.hb, H, C, R, H * qk,
                          qk, row, scale);
    e->gpu->ops->attn_mla(e->gpu, dout, dqlat, dq + nope, dckv, dckv + C, dcache, &b.db, H, C, R,
                          H * qk, qk, row, scale);
    char name[200];
    const char *op = dec_shape ? "attn_mla dec" : tc_shape ? "attn_mla tc" : "attn_mla";
    snprintf(name, sizeof name, "%s %s T=%d max_pos=%d H=%d C=%d R=%d bs=%d", op, what, T,
             b.max_pos, H, C, R, bs);
    int ok = check_dev(e, dout, co, mo, tc_shape ? MLA_TC_BOUND : 5e-5, name);
    if (alone != ALONE_SKIP) {
        struct mla_args m = {dqlat, dq, dckv, dcache, H, C, R, nope, scale};
        ok &= report_alone(alone_mismatches(e, &b, dout, (size_t)H * C, mla_alone, &m), alone,
                           name);
    }
    snprintf(name, sizeof name, "%s %s latent cache stores", op, what);
    float *gc = gget(e, dcache, mc);
    ok &= report(name, gc ? rel_err(gc, cache, mc) : INFINITY, 0);
    free(gc);
    if (tc_shape || dec_shape) {
        /* the same step on the SIMT kernel, or the decode kernel's on the
         * tensor-core one (it rewrites the same rows) */
        float *dsimt = gpoison(e, mo);
        sd_cuda_set_mla_tc(e->gpu, dec_shape);
        sd_cuda_set_mla_dec(e->gpu, 0);
        e->gpu->ops->attn_mla(e->gpu, dsimt, dqlat, dq + nope, dckv, dckv + C, dcache, &b.db, H, C,
                              R, H * qk, qk, row, scale);
        float *gt = gget(e, dout, mo), *gs = gget(e, dsimt, mo);
        double d = gt && gs ? rel_err(gt, gs, mo) : 0;
        ok &= reportf(d > 1e-5 ? 0 : 1, 0, "%s %s ran %s (differs from %s by %.2g)", op, what,
                      dec_shape ? "mla_dec_kernel" : "on tensor cores",
                      dec_shape ? "the tensor-core kernel" : "SIMT", d);
        free(gt);
        free(gs);
        gfree(e, dsimt);
    }
    if (dec_shape) {
        /* each switch of the decode kernel flipped: the same bits, twice
         * (the fold's counts are zero again after a call). The split-KV
         * merge folded into the decode kernel (or not, when that is the
         * default): */
        sd_cuda_set_mla_tc(e->gpu, 1);
        sd_cuda_set_mla_dec(e->gpu, 1);
        float *gt = gget(e, dout, mo);
        struct mla_args m = {dqlat, dq, dckv, dcache, H, C, R, nope, scale};
        char lab[160];
        sd_cuda_set_mla_fold(e->gpu, !SD_CUDA_MLA_FOLD_DEFAULT);
        snprintf(lab, sizeof lab, "%s %s: the merge %s the decode kernel", op, what,
                 SD_CUDA_MLA_FOLD_DEFAULT ? "after" : "folded into");
        ok &= mla_again(e, &m, &b, gt, mo, lab);
        sd_cuda_set_mla_fold(e->gpu, SD_CUDA_MLA_FOLD_DEFAULT);
        /* the cache slots resolved before the wait in every launch (the
         * inputs came up by cudaMemcpy: no kernel writes them), against
         * the eager default's after it */
        sd_cuda_set_step_early(e->gpu, 2);
        snprintf(lab, sizeof lab, "%s %s: the slots resolved before the wait", op, what);
        ok &= mla_again(e, &m, &b, gt, mo, lab);
        sd_cuda_set_step_early(e->gpu, SD_CUDA_STEP_EARLY_DEFAULT);
        /* the fold's count by a release-acquire atomic (or fences) */
        sd_cuda_set_mla_fold_rel(e->gpu, !SD_CUDA_MLA_FOLD_REL_DEFAULT);
        snprintf(lab, sizeof lab, "%s %s: the fold counted %s", op, what,
                 SD_CUDA_MLA_FOLD_REL_DEFAULT ? "with fences" : "by release-acquire");
        ok &= mla_again(e, &m, &b, gt, mo, lab);
        sd_cuda_set_mla_fold_rel(e->gpu, SD_CUDA_MLA_FOLD_REL_DEFAULT);
        free(gt);
    }
    sd_cuda_set_mla_tc(e->gpu, 1); /* the defaults */
    sd_cuda_set_mla_dec(e->gpu, 1);
    float *hs[] = {qlat, q, ckv, cache, co};
    for (size_t i = 0; i < SD_ARRAY_LEN(hs); i++)
        free(hs[i]);
    float *ds[] = {dqlat, dq, dckv, dcache, dout};
    for (size_t i = 0; i < SD_ARRAY_LEN(ds); i++)
        gfree(e, ds[i]);
    tbatch_free(e, &b);
    return ok;
}

static int mla_run(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew, int bs,
                   int H, int C, int R, int nope, int mode)
{
    return mla_check(e, what, n_seq, ctx, nnew, bs, H, C, R, nope, mode, ALONE_SKIP);
}

static int mla_case(gpu_env *e, const char *what, int n_seq, const int *ctx, const int *nnew, int bs,
                    int H, int C, int R, int nope)
{
    return mla_run(e, what, n_seq, ctx, nnew, bs, H, C, R, nope, MLA_SIMT);
}

TEST(attn_mla_matches_the_cpu_on_ragged_and_long_contexts)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    int ctx[4] = {1, 200, 77, 300}, nnew[4] = {1, 7, 30, 1};
    ok &= mla_case(&e, "ragged tiny", 4, ctx, nnew, 16, 4, 32, 8, 16);
    /* DeepSeek-V3 dims; 40 heads = 3 head groups, the last partial */
    ok &= mla_case(&e, "ragged v3 dims", 4, ctx, nnew, 16, 40, 512, 64, 128);
    int c2[2] = {4096, 1500}, n2[2] = {2, 3};
    ok &= mla_case(&e, "long v3 dims", 2, c2, n2, 64, 16, 512, 64, 128);
    /* decode steps: split-KV chunks (one head group: the split fills the GPU) */
    int c3[1] = {1}, n3[1] = {1};
    ok &= mla_case(&e, "split decode ctx 1", 1, c3, n3, 16, 16, 512, 64, 128);
    int c4[2] = {3000, 17}, n4[2] = {1, 3};
    ok &= mla_case(&e, "split decode+verify v2-lite dims", 2, c4, n4, 16, 16, 512, 64, 128);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(attn_mla_on_tensor_cores_matches_the_cpu_within_bf16_rounding)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    static const int Hs[2] = {16, 128}; /* DeepSeek-V2-Lite, V3 heads per rank */
    for (int i = 0; i < 2; i++) {
        int H = Hs[i];
        /* decodes at 1, 33, 300 positions and a 4-token verify at 4100, one
         * step of <= 8 tokens: split-KV chunks (some empty), partial tiles */
        int c1[4] = {1, 33, 300, 4100}, n1[4] = {1, 1, 1, 4};
        ok &= mla_run(&e, "decode+verify", 4, c1, n1, 16, H, 512, 64, 128, MLA_TC);
        /* the same contexts as a ragged prefill step (> 8 tokens: no split) */
        int c2[4] = {33, 300, 4100, 1}, n2[4] = {33, 2, 5, 1};
        ok &= mla_run(&e, "ragged prefill", 4, c2, n2, 64, H, 512, 64, 128, MLA_TC);
        int c3[1] = {1}, n3[1] = {1};
        ok &= mla_run(&e, "decode ctx 1", 1, c3, n3, 16, H, 512, 64, 128, MLA_TC);
        /* long contexts alone (the error is relative to max |out|, which a
         * short context in the same step would set) */
        int c6[2] = {4100, 3000}, n6[2] = {4, 1};
        ok &= mla_run(&e, "long decode+verify", 2, c6, n6, 16, H, 512, 64, 128, MLA_TC);
        int c7[1] = {4100}, n7[1] = {12};
        ok &= mla_run(&e, "long prefill chunk", 1, c7, n7, 64, H, 512, 64, 128, MLA_TC);
    }
    /* 40 heads: 3 head groups, the last 8 heads of 16 */
    int c4[3] = {300, 65, 2}, n4[3] = {1, 3, 2};
    ok &= mla_run(&e, "partial head group decode+verify", 3, c4, n4, 16, 40, 512, 64, 128, MLA_TC);
    int c5[4] = {1, 200, 77, 300}, n5[4] = {1, 7, 30, 1};
    ok &= mla_run(&e, "partial head group ragged", 4, c5, n5, 16, 40, 512, 64, 128, MLA_TC);
    /* a shape the kernel does not take runs on the SIMT kernel */
    ok &= mla_run(&e, "other shape falls back", 4, c5, n5, 16, 4, 32, 8, 16, MLA_TC);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(attn_mla_decode_kernel_matches_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* V2-Lite, V3 a rank, 40 and 5 heads (the last block of 2 heads half empty at 5) */
    static const int Hs[4] = {16, 128, 40, 5};
    for (int i = 0; i < 4; i++) {
        int H = Hs[i];
        /* decodes at 1, 33, 300 and a 4-token verify at 4100: one step of
         * 7 tokens, chunks of one or several tiles, partial tiles, empty chunks */
        int c1[4] = {1, 33, 300, 4100}, n1[4] = {1, 1, 1, 4};
        ok &= mla_run(&e, "decode+verify", 4, c1, n1, 16, H, 512, 64, 128, MLA_DEC);
        int c2[1] = {1}, n2[1] = {1};
        ok &= mla_run(&e, "decode ctx 1", 1, c2, n2, 16, H, 512, 64, 128, MLA_DEC);
        /* one token of 4, 10 and 16 chunks (the fold's counts of each) */
        static const int one[3] = {100, 300, 4100};
        for (int j = 0; j < 3; j++) {
            int cj[1] = {one[j]}, nj[1] = {1};
            char what[40];
            snprintf(what, sizeof what, "decode ctx %d", one[j]);
            ok &= mla_run(&e, what, 1, cj, nj, 16, H, 512, 64, 128, MLA_DEC);
        }
        int c3[2] = {20000, 64}, n3[2] = {4, 4};
        ok &= mla_run(&e, "long verify", 2, c3, n3, 16, H, 512, 64, 128, MLA_DEC);
    }
    /* more than 8 tokens: the tensor-core kernel as before */
    int c4[4] = {33, 300, 4100, 1}, n4[4] = {33, 2, 5, 1};
    ok &= mla_run(&e, "ragged prefill", 4, c4, n4, 64, 16, 512, 64, 128, MLA_DEC);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A verify step of nv tokens plus a decode: each token's bits as computed
 * alone. mode: MLA_TC or MLA_DEC at the DeepSeek shape (nv = 4: a verify of
 * 3 drafts), MLA_SIMT at any (the general kernel; nv > 7 makes a step of
 * more than 8 tokens, split too unless split_all is 0, when they differ). */
static int mla_decode_equals_verify(gpu_env *e, int H, int C, int R, int nope, int P, int nv,
                                    int mode, int split_all)
{
    int ctx[2] = {P + nv, 50}, nnew[2] = {nv, 1};
    char what[64];
    snprintf(what, sizeof what, "verify+decode at %d, split level %d", P, split_all);
    sd_cuda_set_attn_split_all(e->gpu, split_all);
    int ok = mla_check(e, what, 2, ctx, nnew, 16, H, C, R, nope, mode,
                       split_all ? ALONE_SAME : ALONE_DIFFERS);
    sd_cuda_set_attn_split_all(e->gpu, SD_CUDA_ATTN_SPLIT_ALL_DEFAULT);
    return ok;
}

TEST(attn_mla_on_tensor_cores_gives_a_token_the_same_bits_in_decode_and_verify)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    for (int dec = 0; dec < 2; dec++) {
        const int mode = dec ? MLA_DEC : MLA_TC;
        ok &= mla_decode_equals_verify(&e, 16, 512, 64, 128, 300, 4, mode, 1);
        ok &= mla_decode_equals_verify(&e, 16, 512, 64, 128, 4100, 4, mode, 1);
        ok &= mla_decode_equals_verify(&e, 128, 512, 64, 128, 4100, 4, mode, 1);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* The general kernel (the bundled model's MLA: 8 heads, a 64-float latent,
 * 16 rope dims): verify steps of 5 and 13 tokens (more than 8: split into
 * the same chunks as a decode step where the partials buffer holds them) */
TEST(attn_mla_on_the_general_kernel_gives_a_token_the_same_bits_in_decode_and_verify)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    ok &= mla_decode_equals_verify(&e, 8, 64, 16, 32, 300, 4, MLA_SIMT, 1);
    ok &= mla_decode_equals_verify(&e, 8, 64, 16, 32, 300, 12, MLA_SIMT, 1);
    ok &= mla_decode_equals_verify(&e, 8, 64, 16, 32, 1500, 12, MLA_SIMT, 1);
    ok &= mla_decode_equals_verify(&e, 16, 512, 64, 128, 700, 12, MLA_SIMT, 1);
    ok &= mla_decode_equals_verify(&e, 8, 64, 16, 32, 300, 12, MLA_SIMT, 0);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* Steps of 9+ tokens on the DeepSeek latent kernels (split from level 1,
 * the default) and with SPECD_ATTN_SPLIT_ALL=2 on the 128-dim GQA kernel
 * too (a decode step's chunks where the partials buffer holds them, else as
 * many as it holds): against the CPU, and a token's bits in a 13-token
 * verify step as decoded alone (GQA) */
TEST(attention_split_steps_of_more_than_8_tokens_match_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    sd_cuda_set_attn_split_all(e.gpu, 2);
    /* a batch's decode and verify rows (17 tokens), a prefill chunk whose
     * partials the buffer holds (64) and one it does not (300: fewer chunks) */
    int c1[5] = {40, 700, 2100, 31, 5000}, n1[5] = {4, 4, 4, 4, 1};
    ok &= gqa_case(&e, "level 2 batch decode+verify D=128", 5, c1, n1, 16, 32, 8, 128, 128);
    int c2[1] = {6000}, n2[1] = {64};
    ok &= gqa_case(&e, "level 2 prefill chunk D=128", 1, c2, n2, 16, 32, 8, 128, 128);
    int c3[1] = {1200}, n3[1] = {300};
    ok &= gqa_case(&e, "level 2 long prefill chunk D=128", 1, c3, n3, 64, 32, 8, 128, 128);
    sd_cuda_set_attn_split_all(e.gpu, SD_CUDA_ATTN_SPLIT_ALL_DEFAULT);
    static const int Hs[2] = {16, 128};
    for (int i = 0; i < 2; i++) {
        int c4[5] = {40, 700, 4100, 31, 300}, n4[5] = {4, 4, 4, 4, 1};
        ok &= mla_run(&e, "split batch decode+verify", 5, c4, n4, 16, Hs[i], 512, 64, 128, MLA_TC);
        int c5[4] = {33, 300, 4100, 1}, n5[4] = {33, 2, 5, 1};
        ok &= mla_run(&e, "split ragged prefill", 4, c5, n5, 64, Hs[i], 512, 64, 128, MLA_DEC);
    }
    ok &= gqa_decode_equals_verify(&e, 32, 8, 300, 12, 2);
    ok &= gqa_decode_equals_verify(&e, 32, 8, 4100, 12, 2);
    ok &= gqa_decode_equals_verify(&e, 8, 1, 1500, 12, 2);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* -------------------------------------------------------------------- moe */

/* Router logits whose choices (score + bias) are spaced >= 1e-4 apart with
 * continuous jitter: no near-ties, so the ulp differences of expf between
 * the backends cannot change the experts, and the ids must agree exactly. */
static void route_inputs(gpu_env *e, float *lg, float *bias, int n, int E, int sigmoid)
{
    int *perm = (int *)malloc((size_t)E * sizeof(int));
    float sp = 0.8f / (float)E;
    if (bias)
        for (int x = 0; x < E; x++)
            bias[x] = sd_test_randf(&e->rng, -0.05f, 0.05f);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < E; i++)
            perm[i] = i;
        for (int i = E - 1; i > 0; i--) {
            int j = rnd_int(e, i + 1), tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        for (int x = 0; x < E; x++) {
            float c = 0.1f + sp * ((float)perm[x] + sd_test_randf(&e->rng, 0.0f, 0.6f));
            float s = c - (bias ? bias[x] : 0.0f); /* in (0.05, 0.95) */
            lg[(size_t)t * E + x] = sigmoid ? logf(s / (1.0f - s)) : logf(s);
        }
    }
    free(perm);
}

/* ties: logits rounded to steps of 1/2, so many experts and groups tie
 * (the lowest index wins on both sides) */
static int route_case(gpu_env *e, const char *what, int n, sd_moe_route r, int with_bias, int ties)
{
    int E = r.n_experts, K = r.top_k + r.n_always; /* a token's row */
    float *lg = (float *)malloc((size_t)n * E * sizeof(float));
    float *bias = with_bias ? (float *)malloc((size_t)E * sizeof(float)) : NULL;
    route_inputs(e, lg, bias, n, E, r.sigmoid);
    for (size_t i = 0; ties && i < (size_t)n * E; i++)
        lg[i] = floorf(lg[i] * 2.0f) / 2.0f;
    int32_t *cid = (int32_t *)malloc((size_t)n * K * sizeof(int32_t));
    float *cw = (float *)malloc((size_t)n * K * sizeof(float));
    e->cpu->ops->moe_route(e->cpu, cid, cw, lg, bias, n, &r);
    float *dlg = (float *)gput(e, lg, (size_t)n * E * 4);
    float *dbias = bias ? (float *)gput(e, bias, (size_t)E * 4) : NULL;
    int32_t *did = (int32_t *)gpoison(e, (size_t)n * K);
    float *dw = gpoison(e, (size_t)n * K);
    e->gpu->ops->moe_route(e->gpu, did, dw, dlg, dbias, n, &r);
    int32_t *gid = (int32_t *)gget(e, did, (size_t)n * K);
    int bad = gid ? 0 : n * K;
    for (int i = 0; gid && i < n * K; i++)
        bad += gid[i] != cid[i];
    /* the general kernel where the register one ran (E <= 64, no group
     * limit): the same bits */
    int32_t *did2 = (int32_t *)gpoison(e, (size_t)n * K);
    float *dw2 = gpoison(e, (size_t)n * K);
    sd_cuda_set_route_small(e->gpu, 0);
    e->gpu->ops->moe_route(e->gpu, did2, dw2, dlg, dbias, n, &r);
    sd_cuda_set_route_small(e->gpu, 1);
    int32_t *gid2 = (int32_t *)gget(e, did2, (size_t)n * K);
    float *gw = gget(e, dw, (size_t)n * K), *gw2 = gget(e, dw2, (size_t)n * K);
    long bits = gid2 && gw && gw2 ? 0 : n * K;
    for (int i = 0; !bits && i < n * K; i++)
        bits += gid2[i] != gid[i] || memcmp(&gw[i], &gw2[i], sizeof(float)) != 0;
    char name[160];
    snprintf(name, sizeof name, "moe_route %s: both kernels, the same bits (mismatches)", what);
    report(name, (double)bits, 0);
    int ok0 = bits == 0;
    free(gid2);
    free(gw);
    free(gw2);
    gfree(e, did2);
    gfree(e, dw2);
    snprintf(name, sizeof name,
             "moe_route %s n=%d E=%d top-%d + %d always-on groups %d/%d ids (mismatches)", what, n,
             E, r.top_k, r.n_always, r.topk_group, r.n_group);
    int ok = report(name, bad, 0) && ok0;
    snprintf(name, sizeof name, "moe_route %s weights", what);
    ok &= check_dev(e, dw, cw, (size_t)n * K, 1e-6, name);
    free(gid);
    free(lg);
    free(bias);
    free(cid);
    free(cw);
    gfree(e, dlg);
    gfree(e, dbias);
    gfree(e, did);
    gfree(e, dw);
    return ok;
}

/* DeepSeek-V3's routing (256 experts, top-8 of 4 of 8 groups, sigmoid) and
 * V2-Lite's (64 experts, top-6, softmax) */
static const sd_moe_route route_v3 = {.n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4,
                                      .norm_topk_prob = 1, .sigmoid = 1,
                                      .routed_scaling_factor = 2.5f};
static const sd_moe_route route_lite = {.n_experts = 64, .top_k = 6, .n_group = 1,
                                        .topk_group = 1, .norm_topk_prob = 0, .sigmoid = 0,
                                        .routed_scaling_factor = 1.0f};

TEST(moe_route_matches_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    sd_moe_route v3 = route_v3;
    ok &= route_case(&e, "v3 sigmoid+bias", 70, v3, 1, 0);
    ok &= route_case(&e, "v3 ties", 40, v3, 0, 1);
    sd_moe_route tiny = {.n_experts = 8, .top_k = 2, .n_group = 4, .topk_group = 2,
                         .norm_topk_prob = 1, .sigmoid = 1, .routed_scaling_factor = 2.5f};
    ok &= route_case(&e, "tiny groups", 33, tiny, 1, 0);
    sd_moe_route sm = route_lite;
    ok &= route_case(&e, "softmax", 40, sm, 0, 0);
    ok &= route_case(&e, "softmax ties", 40, sm, 0, 1);
    ok &= route_case(&e, "softmax + bias", 40, sm, 1, 0);
    sd_moe_route sg = route_lite; /* sigmoid, 64 experts, one group: the register kernel */
    sg.sigmoid = 1;
    sg.norm_topk_prob = 1;
    ok &= route_case(&e, "sigmoid 64", 40, sg, 1, 0);
    ok &= route_case(&e, "sigmoid 64 ties", 40, sg, 1, 1);
    sd_moe_route odd = {.n_experts = 30, .top_k = 4, .n_group = 1, .topk_group = 1,
                        .norm_topk_prob = 1, .routed_scaling_factor = 1.5f};
    ok &= route_case(&e, "30 experts", 33, odd, 1, 0);
    /* E % 4 != 0 with the sigmoid: the register kernel's entries past E
     * hold 0.5 and must rank nothing */
    odd.n_experts = 41;
    odd.sigmoid = 1;
    ok &= route_case(&e, "41 experts sigmoid", 33, odd, 1, 0);
    ok &= route_case(&e, "41 experts sigmoid ties", 33, odd, 0, 1);
    /* shared experts in the bank: always-on slots after the routed ones */
    sm.n_always = 2;
    ok &= route_case(&e, "softmax + shared", 40, sm, 0, 0);
    v3.n_always = 1;
    ok &= route_case(&e, "v3 + shared", 40, v3, 1, 0);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* moe_router_route on the GPU: bit for bit the GPU's matmul followed by its
 * moe_route (a fused kernel must keep the GEMV's sums), and its logits
 * within the GEMV's bound of the CPU's; random router weights and inputs,
 * decode and verify sizes and one prefill-sized call */
static int router_case(gpu_env *e, const char *what, int n, int D, sd_moe_route r)
{
    int E = r.n_experts, W = r.top_k + r.n_always;
    tw w;
    if (tw_make(e, &w, SD_DT_BF16, E, D, 0.5f))
        return report("moe_router_route: weight upload", INFINITY, 0);
    float *x = rnd_floats(e, (size_t)n * D, -1, 1);
    float *bias = (float *)malloc((size_t)E * sizeof(float));
    for (int i = 0; i < E; i++)
        bias[i] = sd_test_randf(&e->rng, -0.05f, 0.05f);
    float *clg = (float *)malloc((size_t)n * E * sizeof(float));
    int32_t *cid = (int32_t *)malloc((size_t)n * W * sizeof(int32_t));
    float *cw = (float *)malloc((size_t)n * W * sizeof(float));
    e->cpu->ops->moe_router_route(e->cpu, cid, cw, clg, x, &w.c, bias, n, D, &r);
    float *dx = (float *)gput(e, x, (size_t)n * D * sizeof(float));
    float *db = (float *)gput(e, bias, (size_t)E * sizeof(float));
    float *dlg = gpoison(e, (size_t)n * E), *dlg2 = gpoison(e, (size_t)n * E);
    int32_t *did = (int32_t *)gpoison(e, (size_t)n * W), *did2 = (int32_t *)gpoison(e, (size_t)n * W);
    float *dw = gpoison(e, (size_t)n * W), *dw2 = gpoison(e, (size_t)n * W);
    e->gpu->ops->moe_router_route(e->gpu, did, dw, dlg, dx, &w.g, db, n, D, &r);
    e->gpu->ops->matmul(e->gpu, dlg2, dx, &w.g, NULL, n, D);
    e->gpu->ops->moe_route(e->gpu, did2, dw2, dlg2, db, n, &r);
    float *g[3] = {gget(e, dlg, (size_t)n * E), gget(e, dw, (size_t)n * W),
                   gget(e, (float *)did, (size_t)n * W)};
    float *h[3] = {gget(e, dlg2, (size_t)n * E), gget(e, dw2, (size_t)n * W),
                   gget(e, (float *)did2, (size_t)n * W)};
    size_t cnt[3] = {(size_t)n * E, (size_t)n * W, (size_t)n * W};
    long bad = 0;
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < cnt[k]; i++)
            bad += !g[k] || !h[k] || memcmp(&g[k][i], &h[k][i], sizeof(float)) != 0;
    char name[160];
    snprintf(name, sizeof name,
             "moe_router_route %s n=%d E=%d D=%d vs the GPU's matmul + moe_route (differing "
             "values)",
             what, n, E, D);
    int ok = report(name, (double)bad, 0);
    snprintf(name, sizeof name, "moe_router_route %s n=%d logits vs the cpu", what, n);
    ok &= reportf(g[0] ? rel_err(g[0], clg, (size_t)n * E) : INFINITY, 1e-5, "%s", name);
    for (int k = 0; k < 3; k++) {
        free(g[k]);
        free(h[k]);
    }
    GFREE_ALL(e, dx, db, dlg, dlg2, did, did2, dw, dw2);
    tw_free(e, &w);
    free(x);
    free(bias);
    free(clg);
    free(cid);
    free(cw);
    return ok;
}

TEST(moe_router_route_is_the_gpus_matmul_then_moe_route)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    sd_moe_route lite = route_lite, v3 = route_v3;
    const int ns[4] = {1, 3, 8, 40};
    for (int i = 0; i < 4; i++) {
        ok &= router_case(&e, "v2-lite", ns[i], 2048, lite);
        ok &= router_case(&e, "v3", ns[i], 7168, v3);
    }
    lite.n_always = 2;
    ok &= router_case(&e, "v2-lite + shared", 4, 2048, lite);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* moe_router_ffn: the routing beside the always-on experts' gate/up
 * (moe_route_always_kernel), with the router's GEMV in its launch too or
 * not (sd_cuda_set_moe_router), gives bit for bit the GPU's
 * moe_router_route + moe_ffn (logits, ids, weights, output: the switch
 * off), and the output
 * the CPU's within moe_ffn's bound. A bank of r.n_experts routed experts
 * and r.n_always always-on ones (ids E..), `first` the bank's first id of
 * `e_all` routed + always-on ones (expert parallel: other ranks' pairs
 * skipped); the shapes it does not take (no always-on experts, more than
 * 64 experts, many pairs) run the two ops, checked the same way. */
static int router_ffn_case(gpu_env *e, const char *what, sd_dtype dt, int n, int D, int I,
                           sd_moe_route r, int first, int bank)
{
    const int E = r.n_experts, na = r.n_always, W = r.top_k + na;
    tw rw;
    if (tw_make(e, &rw, SD_DT_BF16, E, D, 0.5f))
        return report("moe_router_ffn: weight upload", INFINITY, 0);
    tw *g = (tw *)calloc((size_t)bank, sizeof(tw)), *u = (tw *)calloc((size_t)bank, sizeof(tw));
    tw *d = (tw *)calloc((size_t)bank, sizeof(tw));
    sd_weight *cw = (sd_weight *)calloc((size_t)bank * 6, sizeof(sd_weight));
    for (int x = 0; x < bank; x++) {
        if (tw_make(e, &g[x], dt, I, D, 0.3f) || tw_make(e, &u[x], dt, I, D, 0.3f) ||
            tw_make(e, &d[x], dt, D, I, 0.3f))
            return report("moe_router_ffn: weight upload", INFINITY, 0);
        cw[x] = g[x].c;
        cw[bank + x] = u[x].c;
        cw[2 * bank + x] = d[x].c;
        cw[3 * bank + x] = g[x].g;
        cw[4 * bank + x] = u[x].g;
        cw[5 * bank + x] = d[x].g;
    }
    sd_experts ce = {.n = bank, .gate = cw, .up = cw + bank, .down = cw + 2 * bank, .first = first};
    sd_experts ge = {.n = bank, .gate = cw + 3 * bank, .up = cw + 4 * bank,
                     .down = cw + 5 * bank, .first = first};
    float *x = rnd_floats(e, (size_t)n * D, -1, 1);
    float *bias = (float *)malloc((size_t)E * sizeof(float));
    for (int i = 0; i < E; i++)
        bias[i] = sd_test_randf(&e->rng, -0.05f, 0.05f);
    size_t tmpn = SD_MOE_TMP_FLOATS(n, W, D, I);
    float *tmp = (float *)malloc(tmpn * sizeof(float));
    float *co = (float *)malloc((size_t)n * D * sizeof(float));
    float *clg = (float *)malloc((size_t)n * E * sizeof(float));
    int32_t *cid = (int32_t *)malloc((size_t)n * W * sizeof(int32_t));
    float *cwt = (float *)malloc((size_t)n * W * sizeof(float));
    sd_moe_router_ffn(e->cpu, co, cid, cwt, clg, x, &rw.c, bias, &ce, n, D, &r, tmp);
    float *dx = (float *)gput(e, x, (size_t)n * D * sizeof(float));
    float *db = (float *)gput(e, bias, (size_t)E * sizeof(float));
    float *dtmp = gpoison(e, tmpn);
    float *dout[3], *dlg[3], *dwt[3];
    int32_t *did[3];
    /* v = 0: beside; 1: the switch off; 2: beside with the router's GEMV
     * (twice: its count is zero again after a call) */
    for (int v = 0; v < 3; v++) {
        dout[v] = gpoison(e, (size_t)n * D);
        dlg[v] = gpoison(e, (size_t)n * E);
        dwt[v] = gpoison(e, (size_t)n * W);
        did[v] = (int32_t *)gpoison(e, (size_t)n * W);
        sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_OFF);
        sd_cuda_set_moe_overlap(e->gpu, v == 1 ? 0 : 1 << 20);
        sd_cuda_set_moe_router(e->gpu, v == 2);
        for (int rep = 0; rep < (v == 2 ? 2 : 1); rep++)
            e->gpu->ops->moe_router_ffn(e->gpu, dout[v], did[v], dwt[v], dlg[v], dx, &rw.g, db,
                                        &ge, n, D, &r, dtmp);
        sd_cuda_set_moe_router(e->gpu, SD_CUDA_MOE_ROUTER_DEFAULT);
        sd_cuda_set_moe_overlap(e->gpu, SD_CUDA_MOE_OVERLAP_DEFAULT);
        sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_AUTO);
    }
    long bad = 0;
    const size_t cnt[4] = {(size_t)n * D, (size_t)n * E, (size_t)n * W, (size_t)n * W};
    for (int v = 0; v < 3; v += 2) {
        const void *pa[4] = {dout[v], dlg[v], dwt[v], did[v]};
        const void *pb[4] = {dout[1], dlg[1], dwt[1], did[1]};
        for (int k = 0; k < 4; k++) {
            float *ga = gget(e, pa[k], cnt[k]), *gb = gget(e, pb[k], cnt[k]);
            bad += ga && gb ? (long)bit_mismatches(ga, gb, cnt[k]) : 1;
            free(ga);
            free(gb);
        }
    }
    char name[200];
    snprintf(name, sizeof name,
             "moe_router_ffn %s %s n=%d E=%d+%d top-%d D=%d I=%d: beside, and with the router, "
             "vs the two ops (bits that differ)",
             what, sd_dtype_name(dt), n, E, na, r.top_k, D, I);
    int ok = report(name, (double)bad, 0);
    snprintf(name, sizeof name, "moe_router_ffn %s n=%d output vs the cpu", what, n);
    ok &= check_dev(e, dout[0], co, (size_t)n * D, 1e-5, name);
    for (int v = 0; v < 3; v++)
        GFREE_ALL(e, dout[v], dlg[v], dwt[v], did[v]);
    GFREE_ALL(e, dx, db, dtmp);
    for (int k = 0; k < bank; k++) {
        tw_free(e, &g[k]);
        tw_free(e, &u[k]);
        tw_free(e, &d[k]);
    }
    tw_free(e, &rw);
    free(g);
    free(u);
    free(d);
    free(cw);
    free(x);
    free(bias);
    free(tmp);
    free(co);
    free(clg);
    free(cid);
    free(cwt);
    return ok;
}

TEST(moe_router_ffn_routes_beside_the_always_on_experts)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    sd_moe_route lite = route_lite, sig = route_lite, v3 = route_v3;
    lite.n_always = 2;
    /* V2-Lite's expert shape (16 of its 64 routed experts: the register
     * routing takes up to 64), decode and verify sizes */
    lite.n_experts = 16;
    const int ns[3] = {1, 3, 4};
    for (int i = 0; i < 3; i++)
        ok &= router_ffn_case(&e, "v2-lite", SD_DT_BF16, ns[i], 2048, 1408, lite, 0, 18);
    /* 64 experts, sigmoid with the correction bias, normalized, scaled */
    sig.n_always = 1;
    sig.sigmoid = 1;
    sig.norm_topk_prob = 1;
    sig.routed_scaling_factor = 2.5f;
    ok &= router_ffn_case(&e, "sigmoid", SD_DT_BF16, 8, 256, 128, sig, 0, 65);
    ok &= router_ffn_case(&e, "sigmoid", SD_DT_BF16, 1, 256, 128, sig, 0, 65);
    /* all 64 of V2-Lite's routed experts at its D (the router's GEMV in 8
     * blocks at one token), narrow experts */
    sd_moe_route lite64 = route_lite;
    lite64.n_always = 2;
    ok &= router_ffn_case(&e, "v2-lite 64", SD_DT_BF16, 1, 2048, 128, lite64, 0, 66);
    ok &= router_ffn_case(&e, "sigmoid", SD_DT_F16, 2, 256, 136, sig, 0, 65);
    ok &= router_ffn_case(&e, "sigmoid", SD_DT_F32, 5, 128, 64, sig, 0, 65);
    /* an expert-parallel bank (ids 32..65 of 66: half the routed experts
     * and both always-on ones) */
    sd_moe_route ep = route_lite;
    ep.n_always = 2;
    ok &= router_ffn_case(&e, "expert-parallel bank", SD_DT_BF16, 3, 256, 128, ep, 32, 34);
    /* the shapes it leaves to the two ops */
    sd_moe_route none = route_lite;
    ok &= router_ffn_case(&e, "no always-on", SD_DT_BF16, 2, 256, 128, none, 0, 64);
    v3.n_always = 1;
    ok &= router_ffn_case(&e, "v3 groups", SD_DT_BF16, 2, 256, 64, v3, 0, 257);
    ok &= router_ffn_case(&e, "many pairs", SD_DT_BF16, 40, 256, 64, lite, 0, 18);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* A bank of E experts, global ids first .. first + E - 1 of E_all; tokens
 * pick K distinct global experts (expert parallel when E < E_all). */
static int ffn_case_ep(gpu_env *e, sd_dtype dt, int n, int E, int K, int D, int I, int first,
                       int E_all)
{
    tw *g = (tw *)calloc((size_t)E, sizeof(tw)), *u = (tw *)calloc((size_t)E, sizeof(tw));
    tw *d = (tw *)calloc((size_t)E, sizeof(tw));
    sd_weight *cg = (sd_weight *)calloc((size_t)E * 6, sizeof(sd_weight));
    sd_weight *cu = cg + E, *cd = cg + 2 * E, *gg = cg + 3 * E, *gu = cg + 4 * E, *gd = cg + 5 * E;
    for (int x = 0; x < E; x++) {
        if (tw_make(e, &g[x], dt, I, D, 0.3f) || tw_make(e, &u[x], dt, I, D, 0.3f) ||
            tw_make(e, &d[x], dt, D, I, 0.3f))
            return report("moe_ffn: weight upload", INFINITY, 0);
        cg[x] = g[x].c;
        cu[x] = u[x].c;
        cd[x] = d[x].c;
        gg[x] = g[x].g;
        gu[x] = u[x].g;
        gd[x] = d[x].g;
    }
    sd_experts ce = {.n = E, .gate = cg, .up = cu, .down = cd, .first = first};
    sd_experts ge = {.n = E, .gate = gg, .up = gu, .down = gd, .first = first};
    size_t m = (size_t)n * K;
    int32_t *ids = (int32_t *)malloc(m * sizeof(int32_t));
    for (int t = 0; t < n; t++) /* K distinct experts per token */
        for (int j = 0; j < K; j++) {
            int x, dup;
            do {
                x = rnd_int(e, E_all);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= ids[(size_t)t * K + i] == x;
            } while (dup);
            ids[(size_t)t * K + j] = x;
        }
    float *w = rnd_floats(e, m, 0.05f, 1.0f), *x = rnd_floats(e, (size_t)n * D, -1, 1);
    size_t tmpn = SD_MOE_TMP_FLOATS(n, K, D, I);
    float *tmp = (float *)malloc(tmpn * sizeof(float));
    float *co = (float *)malloc((size_t)n * D * sizeof(float));
    e->cpu->ops->moe_ffn(e->cpu, co, x, ids, w, &ce, n, K, D, tmp);
    int32_t *did = (int32_t *)gput(e, ids, m * 4);
    float *dw = (float *)gput(e, w, m * 4), *dx = (float *)gput(e, x, (size_t)n * D * 4);
    float *dtmp = gpoison(e, tmpn), *dout = gpoison(e, (size_t)n * D);
    sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_OFF); /* the fp32 paths */
    e->gpu->ops->moe_ffn(e->gpu, dout, dx, did, dw, &ge, n, K, D, dtmp);
    sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_AUTO);
    char name[160];
    int fused = m <= SD_CUDA_MOE_FUSED_MAX_PAIRS && D % 8 == 0 && I % 8 == 0;
    snprintf(name, sizeof name, "moe_ffn %s n=%d E=%d top-%d D=%d I=%d%s (%s)", sd_dtype_name(dt),
             n, E, K, D, I, E < E_all ? " expert-parallel bank" : "", fused ? "fused" : "sorted");
    int ok = check_dev(e, dout, co, (size_t)n * D, 1e-5, name);
    if (fused) {
        /* every shape of the down kernel: the default's bits */
        float *ref = gget(e, dout, (size_t)n * D);
        for (int sh = 0; sh <= 3; sh++) {
            float *d2 = gpoison(e, (size_t)n * D);
            sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_OFF);
            sd_cuda_set_moe_down(e->gpu, sh);
            e->gpu->ops->moe_ffn(e->gpu, d2, dx, did, dw, &ge, n, K, D, dtmp);
            sd_cuda_set_moe_down(e->gpu, SD_CUDA_MOE_DOWN_DEFAULT);
            sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_AUTO);
            float *g2 = gget(e, d2, (size_t)n * D);
            ok &= reportf(bit_mismatches(ref, g2, (size_t)n * D), 0,
                          "%s: down shape %d bitwise (mismatches)", name, sh);
            free(g2);
            gfree(e, d2);
        }
        free(ref);
    }
    for (int k = 0; k < E; k++) {
        tw_free(e, &g[k]);
        tw_free(e, &u[k]);
        tw_free(e, &d[k]);
    }
    free(g);
    free(u);
    free(d);
    free(cg);
    free(ids);
    free(w);
    free(x);
    free(tmp);
    free(co);
    gfree(e, did);
    gfree(e, dw);
    gfree(e, dx);
    gfree(e, dtmp);
    gfree(e, dout);
    return ok;
}

static int ffn_case(gpu_env *e, sd_dtype dt, int n, int E, int K, int D, int I)
{
    return ffn_case_ep(e, dt, n, E, K, D, I, 0, E);
}

TEST(moe_ffn_matches_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    ok &= ffn_case(&e, SD_DT_BF16, 1, 16, 4, 128, 96); /* decode: most experts idle */
    ok &= ffn_case(&e, SD_DT_BF16, 37, 16, 4, 128, 96);
    ok &= ffn_case(&e, SD_DT_F32, 16, 8, 2, 64, 32); /* the tiny DeepSeek fixture's shape */
    ok &= ffn_case(&e, SD_DT_F16, 9, 12, 3, 70, 50); /* dims not a multiple of 8 */
    ok &= ffn_case(&e, SD_DT_BF16, 64, 256, 8, 256, 128);
    ok &= ffn_case_ep(&e, SD_DT_BF16, 23, 4, 3, 128, 96, 8, 16); /* experts 8..11 of 16 */
    /* a prefill of the bundled model's experts (the grouped GEMV cuts each
     * expert's rows into chunks), and every token on the same two experts
     * (chunks past the mean expert's rows) */
    ok &= ffn_case(&e, SD_DT_BF16, 1400, 8, 2, 256, 96);
    ok &= ffn_case_ep(&e, SD_DT_BF16, 700, 8, 2, 256, 96, 0, 2);
    ok &= ffn_case_ep(&e, SD_DT_F32, 333, 5, 2, 64, 40, 0, 2);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* The fused small-batch path (up to SD_CUDA_MOE_FUSED_MAX_PAIRS pairs): the
 * DeepSeek-V2-Lite expert shape at decode and verification sizes, every way
 * the down kernel splits its warps (top-1, 2, 3, 6 and 10 slots: more slots
 * than warps), expert-parallel banks (pairs of other ranks skipped, tokens
 * with no local expert give 0), all three dtypes, and the boundary. */
TEST(moe_ffn_fused_small_batches_match_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    ok &= ffn_case(&e, SD_DT_BF16, 1, 16, 6, 2048, 1408);
    ok &= ffn_case(&e, SD_DT_BF16, 8, 16, 6, 2048, 1408);
    ok &= ffn_case(&e, SD_DT_BF16, 1, 16, 8, 2048, 1408); /* V2-Lite's 8 slots a token */
    ok &= ffn_case(&e, SD_DT_BF16, 2, 16, 8, 2048, 1408);
    ok &= ffn_case(&e, SD_DT_BF16, 3, 8, 1, 256, 264);
    ok &= ffn_case(&e, SD_DT_BF16, 5, 8, 2, 520, 128);
    ok &= ffn_case(&e, SD_DT_F16, 2, 12, 3, 136, 64);
    ok &= ffn_case(&e, SD_DT_F32, 2, 32, 10, 64, 40);
    ok &= ffn_case_ep(&e, SD_DT_BF16, 3, 4, 3, 256, 96, 8, 16);
    ok &= ffn_case_ep(&e, SD_DT_BF16, 3, 4, 6, 256, 96, 8, 16); /* a warp a slot, slots skipped */
    ok &= ffn_case_ep(&e, SD_DT_F32, 6, 2, 2, 64, 32, 0, 16);
    /* the largest fused batch of top-4 and the smallest sorted one */
    int nb = SD_CUDA_MOE_FUSED_MAX_PAIRS / 4;
    ok &= ffn_case(&e, SD_DT_BF16, nb, 16, 4, 128, 96);
    ok &= ffn_case(&e, SD_DT_BF16, nb + 1, 16, 4, 128, 96);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* The sorted path on tensor cores (sd_cuda_set_moe_tc): grouped GEMMs on
 * bf16 activations. Routing is skewed as prefill sees it: one hot expert in
 * every token's top-k (in a rotating slot: the most rows, many row tiles),
 * a quarter of the experts never chosen (no rows), the rest uniform. One
 * bank of experts serves several batches (weights are the slow part to
 * make). Bound 1e-2 of max |out|: x and SiLU(g) * u are rounded to bf16
 * (2^-9 relative each), which a float64 model of the op
 * (bench/kernels/moe_tc_model.py error) gave as 2.0e-3 .. 3.1e-3 of
 * max |out| on these distributions (2.7e-3 rms); shapes the path
 * does not take (F16 weights, D not a multiple of 8, too few pairs) must
 * keep the fp32 paths' 1e-5, and a tensor-core run must show the bf16
 * rounding (error >= 1e-5: the switch took effect) and give the same bits
 * twice. */
typedef struct tc_bank {
    sd_dtype dt;
    int E, D, I, first;
    tw *w;           /* 3E: gate, up, down */
    sd_weight *cw;   /* 6E: cpu gate, up, down, gpu gate, up, down */
} tc_bank;

static int tc_bank_make(gpu_env *e, tc_bank *b, sd_dtype dt, int E, int D, int I, int first)
{
    *b = (tc_bank){.dt = dt, .E = E, .D = D, .I = I, .first = first};
    b->w = (tw *)calloc((size_t)E * 3, sizeof(tw));
    b->cw = (sd_weight *)calloc((size_t)E * 6, sizeof(sd_weight));
    for (int x = 0; x < E; x++) {
        if (tw_make(e, &b->w[x], dt, I, D, 0.3f) || tw_make(e, &b->w[E + x], dt, I, D, 0.3f) ||
            tw_make(e, &b->w[2 * E + x], dt, D, I, 0.3f))
            return -1;
        for (int k = 0; k < 3; k++) {
            b->cw[k * E + x] = b->w[k * E + x].c;
            b->cw[(3 + k) * E + x] = b->w[k * E + x].g;
        }
    }
    return 0;
}

static void tc_bank_free(gpu_env *e, tc_bank *b)
{
    for (int x = 0; b->w && x < 3 * b->E; x++)
        tw_free(e, &b->w[x]);
    free(b->w);
    free(b->cw);
    memset(b, 0, sizeof *b);
}

/* a quarter of the global experts, picked by salt, that no token chooses */
static int tc_idle(int x, int salt) { return (x * 7 + salt) % 4 == 0; }

/* n tokens, top-K over E_all global experts (the bank holds first .. first
 * + E - 1); see above for the skew. mode: the switch (SD_CUDA_TC_ON: every
 * shape the path takes; SD_CUDA_TC_AUTO, the default: real-size experts). */
static int tc_case_mode(gpu_env *e, const tc_bank *b, int n, int K, int E_all, int mode)
{
    const int E = b->E, D = b->D, I = b->I;
    const size_t m = (size_t)n * K;
    const int salt = rnd_int(e, 4);
    int hot;
    do
        hot = b->first + rnd_int(e, E);
    while (tc_idle(hot, salt));
    int32_t *ids = (int32_t *)malloc(m * sizeof(int32_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int x = hot, dup;
            if (j != t % K) {
                do {
                    x = rnd_int(e, E_all);
                    dup = x == hot || tc_idle(x, salt);
                    for (int i = 0; i < j; i++)
                        dup |= ids[(size_t)t * K + i] == x;
                } while (dup);
            }
            ids[(size_t)t * K + j] = x;
        }
    int idle = 0;
    for (int x = 0; x < E; x++) {
        int used = 0;
        for (size_t r = 0; r < m && !used; r++)
            used = ids[r] == b->first + x;
        idle += !used;
    }
    sd_experts ce = {.n = E, .gate = b->cw, .up = b->cw + E, .down = b->cw + 2 * E,
                     .first = b->first};
    sd_experts ge = {.n = E, .gate = b->cw + 3 * E, .up = b->cw + 4 * E, .down = b->cw + 5 * E,
                     .first = b->first};
    float *w = rnd_floats(e, m, 0.05f, 1.0f), *x = rnd_floats(e, (size_t)n * D, -1, 1);
    size_t tmpn = SD_MOE_TMP_FLOATS(n, K, D, I);
    float *tmp = (float *)malloc(tmpn * sizeof(float));
    float *co = (float *)malloc((size_t)n * D * sizeof(float));
    e->cpu->ops->moe_ffn(e->cpu, co, x, ids, w, &ce, n, K, D, tmp);
    int32_t *did = (int32_t *)gput(e, ids, m * 4);
    float *dw = (float *)gput(e, w, m * 4), *dx = (float *)gput(e, x, (size_t)n * D * 4);
    float *dtmp = gpoison(e, tmpn), *d1 = gpoison(e, (size_t)n * D), *d2 = gpoison(e, (size_t)n * D);
    sd_cuda_set_moe_tc(e->gpu, mode);
    e->gpu->ops->moe_ffn(e->gpu, d1, dx, did, dw, &ge, n, K, D, dtmp);
    e->gpu->ops->moe_ffn(e->gpu, d2, dx, did, dw, &ge, n, K, D, dtmp);
    sd_cuda_set_moe_tc(e->gpu, SD_CUDA_TC_AUTO);
    const int v8 = D % 8 == 0 && I % 8 == 0;
    const int big = (size_t)D * (size_t)I >= SD_CUDA_MOE_TC_MIN_WEIGHTS;
    const int wants = v8 && b->dt == SD_DT_BF16 && (mode == SD_CUDA_TC_ON || big);
    const int fused =
        v8 && m <= (size_t)(wants ? SD_CUDA_MOE_TC_FUSED_MAX_PAIRS : SD_CUDA_MOE_FUSED_MAX_PAIRS);
    const int tc = !fused && wants;
    char name[160];
    snprintf(name, sizeof name, "moe_ffn tc %s %s n=%d E=%d%s top-%d D=%d I=%d",
             mode == SD_CUDA_TC_ON ? "on" : "auto", sd_dtype_name(b->dt), n, E,
             E < E_all ? " bank" : "", K, D, I);
    float *g1 = gget(e, d1, (size_t)n * D), *g2 = gget(e, d2, (size_t)n * D);
    double err = g1 ? rel_err(g1, co, (size_t)n * D) : INFINITY;
    int ok = reportf(err, tc ? 1e-2 : 1e-5, "%s, hot expert %d rows, %d idle (%s)", name, n, idle,
                     tc ? "tensor cores" : fused ? "fused" : "grouped gemv");
    if (tc) {
        /* the GEMV paths are ~1e-6 from the CPU: a smaller error means the
         * switch did not take effect */
        ok &= reportf(err >= 1e-5 ? 0 : 1, 0, "%s: bf16 rounding seen (error >= 1e-5)", name);
        size_t diff = g1 && g2 ? 0 : (size_t)n * D;
        for (size_t i = 0; g1 && g2 && i < (size_t)n * D; i++)
            diff += memcmp(&g1[i], &g2[i], sizeof(float)) != 0;
        ok &= reportf((double)diff, 0, "%s: second run bitwise (mismatches)", name);
    }
    free(g1);
    free(g2);
    free(ids);
    free(w);
    free(x);
    free(tmp);
    free(co);
    gfree(e, did);
    gfree(e, dw);
    gfree(e, dx);
    gfree(e, dtmp);
    gfree(e, d1);
    gfree(e, d2);
    return ok;
}

static int tc_case(gpu_env *e, const tc_bank *b, int n, int K, int E_all)
{
    return tc_case_mode(e, b, n, K, E_all, SD_CUDA_TC_ON);
}

TEST(moe_ffn_tensor_core_prefill_matches_the_cpu_and_odd_shapes_fall_back)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    tc_bank b;
    /* DeepSeek-V2-Lite's experts: 64 x (1408 x 2048) */
    ASSERT(tc_bank_make(&e, &b, SD_DT_BF16, 64, 2048, 1408, 0) == 0);
    ok &= tc_case(&e, &b, 64, 6, 64);
    ok &= tc_case(&e, &b, 300, 6, 64);
    ok &= tc_case(&e, &b, 300, 8, 64);
    ok &= tc_case(&e, &b, 2048, 6, 64);
    /* the default switch takes these real-size experts too */
    ok &= tc_case_mode(&e, &b, 300, 6, 64, SD_CUDA_TC_AUTO);
    /* the fused path up to its threshold, tensor cores right above it */
    ok &= tc_case(&e, &b, SD_CUDA_MOE_TC_FUSED_MAX_PAIRS / 6, 6, 64);
    ok &= tc_case(&e, &b, SD_CUDA_MOE_TC_FUSED_MAX_PAIRS / 6 + 1, 6, 64);
    tc_bank_free(&e, &b);
    /* 256 experts, dims multiples of 8 but not of the tiles: K and column
     * tails in both GEMMs (520 = 16 x 32 + 8, 200 = 3 x 64 + 8) */
    ASSERT(tc_bank_make(&e, &b, SD_DT_BF16, 256, 520, 200, 0) == 0);
    ok &= tc_case(&e, &b, 2048, 8, 256);
    ok &= tc_case(&e, &b, 300, 8, 256);
    ok &= tc_case(&e, &b, 64, 6, 256);
    /* the default leaves experts this small (0.1 M weights) on the fp32 GEMV */
    ok &= tc_case_mode(&e, &b, 300, 8, 256, SD_CUDA_TC_AUTO);
    tc_bank_free(&e, &b);
    /* an expert-parallel bank: experts 128..191 of 256 */
    ASSERT(tc_bank_make(&e, &b, SD_DT_BF16, 64, 264, 136, 128) == 0);
    ok &= tc_case(&e, &b, 300, 8, 256);
    tc_bank_free(&e, &b);
    /* shapes it does not take: F16 weights, D not a multiple of 8 */
    ASSERT(tc_bank_make(&e, &b, SD_DT_F16, 64, 256, 128, 0) == 0);
    ok &= tc_case(&e, &b, 300, 6, 64);
    tc_bank_free(&e, &b);
    ASSERT(tc_bank_make(&e, &b, SD_DT_BF16, 64, 260, 136, 0) == 0);
    ok &= tc_case(&e, &b, 300, 6, 64);
    tc_bank_free(&e, &b);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ------------------------------------------------ sampling and verification
 *
 * Tokens are integers: argmax_rows and accept_greedy_rows must equal the CPU
 * exactly (error = mismatching entries). sample_rows: probabilities within
 * 1e-5 (relative to the row's largest), and the sampled token equal to the
 * CPU's on every row whose u * total is not within 1e-5 of a CDF boundary
 * (rounding of the sums in another order may move the token there; those
 * rows are counted, not compared). */

static int32_t *iget(gpu_env *e, const void *d, size_t n)
{
    int32_t *h = (int32_t *)malloc((n ? n : 1) * sizeof(int32_t));
    if (e->gpu->ops->download(e->gpu, h, d, n * sizeof(int32_t))) {
        fprintf(stderr, "  gpu: %s\n", sd_cuda_backend_error(e->gpu));
        free(h);
        return NULL;
    }
    return h;
}

static int32_t *ipoison(gpu_env *e, size_t n, int32_t v)
{
    int32_t *h = (int32_t *)malloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        h[i] = v;
    int32_t *d = (int32_t *)gput(e, h, n * sizeof(int32_t));
    free(h);
    return d;
}

/* logits rows: uniform, or (quantized) from a few levels so top-k/top-p cut
 * through groups of equal probability (ties by id); planted NaN and a tie at
 * the top */
static float *sample_logits(gpu_env *e, int n, int V, int quantized)
{
    float *x = rnd_floats(e, (size_t)n * V, -8.0f, 8.0f);
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * V;
        if (quantized)
            for (int i = 0; i < V; i++)
                row[i] = floorf(row[i] * 2.0f) * 0.5f;
        if (V > 3) {
            row[rnd_int(e, V)] = NAN;
            int a = rnd_int(e, V), b = rnd_int(e, V);
            row[a] = row[b] = 9.0f;
        }
    }
    return x;
}

TEST(argmax_rows_equals_the_cpu_with_ties_and_nan)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* one block a row up to 8192 ids, split over blocks above (twice: the
     * split's per-row state must be back to zero after every call) */
    const int Vs[6] = {1, 1003, 8193, 32000, 128256, 151936};
    for (int vi = 0; vi < 12; vi++) {
        int V = Vs[vi % 6], n = 9;
        float *x = sample_logits(&e, n, V, vi < 6);
        if (V > 1)
            for (int i = 0; i < V; i++) {
                x[(size_t)4 * V + i] = NAN; /* all NaN: 0 */
                x[(size_t)6 * V + i] = -INFINITY; /* all -inf: 0 */
            }
        if (V > 8192)
            x[(size_t)7 * V + V - 1] = 1e30f; /* the winner in the last block */
        int32_t *c = (int32_t *)malloc(n * sizeof(int32_t));
        e.cpu->ops->argmax_rows(e.cpu, c, x, n, V);
        float *dx = (float *)gput(&e, x, (size_t)n * V * sizeof(float));
        int32_t *dout = ipoison(&e, n, -1);
        e.gpu->ops->argmax_rows(e.gpu, dout, dx, n, V);
        int32_t *g = iget(&e, dout, n);
        double bad = g ? 0 : INFINITY;
        for (int r = 0; g && r < n; r++)
            bad += g[r] != c[r];
        ok &= reportf(bad, 0, "argmax_rows n=%d V=%d (mismatches)", n, V);
        free(g);
        free(c);
        free(x);
        gfree(&e, dx);
        gfree(&e, dout);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* Bound on a probability's difference from the CPU's, relative to its row's
 * largest: both normalise by a sum of V fp32 terms in different orders,
 * whose rounding grows like sqrt(V) ulps (1.66e-5 was seen at V = 129280,
 * over the flat noise rows where the largest probability is small). */
static double prob_bound(int V) { return fmax(1e-5, FLT_EPSILON * sqrt((double)V)); }

/* distance of u * total from the nearest CDF boundary of probs, relative to total */
static double cdf_gap(const float *probs, int V, double u)
{
    double total = 0;
    for (int i = 0; i < V; i++)
        if (probs[i] > 0.0f)
            total += probs[i];
    if (!(total > 0))
        return INFINITY;
    double target = u * total, c = 0, gap = INFINITY;
    for (int i = 0; i < V; i++) {
        if (probs[i] > 0.0f) {
            c += probs[i];
            double d = fabs(c - target);
            if (d < gap)
                gap = d;
        }
    }
    return gap / total;
}

/* ---- rows whose top-k / top-p cut lies within rounding -----------------
 * The GPU's weights exp((l - m) / T) differ from the CPU's by an ulp or two
 * (expf), so where the cut falls between two tokens whose order, or whose
 * cumulative mass against top_p, is decided by that rounding, the two sides
 * may keep one token more or less (or a different one of two). Such a row
 * is accepted only when (a) the CPU's own distribution puts the cut within
 * CUT_NEAR of a boundary, (b) the kept sets differ by at most two tokens,
 * each ranked within two places of the CPU's cut, and (c) the tokens both
 * keep have the CPU's probabilities once renormalized over them. */
#define CUT_NEAR 1e-6

typedef struct {
    float p;
    int id;
} cut_tok;

static int cut_cmp(const void *a, const void *b)
{
    const cut_tok *x = (const cut_tok *)a, *y = (const cut_tok *)b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* probs of logits with the cuts of sp but top_k and top_p as given, sorted
 * by (probability desc, id asc): the CPU's order */
static cut_tok *cut_sorted(const float *logits, int V, const sd_sample_params *sp, int top_k,
                           float top_p)
{
    sd_sampling smp = {sp->temperature, top_p, top_k, sp->seed};
    float *pr = (float *)malloc((size_t)V * sizeof(float));
    cut_tok *t = (cut_tok *)malloc((size_t)V * sizeof(cut_tok));
    sd_sampling_probs(logits, V, &smp, pr);
    for (int i = 0; i < V; i++)
        t[i] = (cut_tok){pr[i], i};
    free(pr);
    qsort(t, (size_t)V, sizeof *t, cut_cmp);
    return t;
}

/* (a): whether the CPU's top-k or top-p decision for this row is within
 * rounding of going the other way */
static int cut_near(const float *logits, int V, const sd_sample_params *sp)
{
    sd_sampling smp = {sp->temperature, sp->top_p, sp->top_k, sp->seed};
    if (sd_sampling_is_greedy(&smp))
        return 0;
    int near = 0;
    if (sp->top_k > 0 && sp->top_k < V) {
        cut_tok *t = cut_sorted(logits, V, sp, 0, 1.0f);
        float a = t[sp->top_k - 1].p, b = t[sp->top_k].p;
        near |= a != b && a - b <= CUT_NEAR * a;
        free(t);
    }
    if (sp->top_p > 0.0f && sp->top_p < 1.0f) {
        cut_tok *t = cut_sorted(logits, V, sp, sp->top_k, 1.0f);
        double c = 0;
        for (int i = 0; i < V && t[i].p > 0; i++) {
            c += t[i].p;
            near |= fabs(c - (double)sp->top_p) <= CUT_NEAR;
        }
        free(t);
    }
    return near;
}

/* (b) and (c) for row g (GPU) against c (CPU) */
static int cut_match(const float *g, const float *c, const float *logits, int V,
                     const sd_sample_params *sp, double bound)
{
    cut_tok *t = cut_sorted(logits, V, sp, 0, 1.0f);
    int n_c = 0, n_diff = 0, ok = 1;
    for (int i = 0; i < V; i++)
        n_c += c[i] > 0;
    double sg = 0, sc = 0, mc = 0;
    for (int r = 0; r < V; r++) {
        int i = t[r].id;
        if ((g[i] > 0) != (c[i] > 0)) {
            n_diff++;
            ok &= r >= n_c - 2 && r <= n_c + 1;
        } else if (c[i] > 0) {
            sg += g[i];
            sc += c[i];
        }
        if (c[i] > mc)
            mc = c[i];
    }
    ok &= n_diff <= 2 && sg > 0 && sc > 0;
    for (int i = 0; ok && i < V; i++)
        if (g[i] > 0 && c[i] > 0)
            ok &= fabs((double)g[i] / sg - (double)c[i] / sc) <= bound * mc / sc;
    free(t);
    return ok;
}

/* A GPU probability row against the CPU's: within bound, or (cut_near)
 * different only at a cut that rounding decides (*at_cut is then set). */
static double row_err(const float *g, const float *c, const float *logits, int V,
                      const sd_sample_params *sp, int *at_cut)
{
    double er = rel_err(g, c, (size_t)V), bound = prob_bound(V);
    *at_cut = 0;
    if (er > bound && cut_near(logits, V, sp) && cut_match(g, c, logits, V, sp, bound)) {
        *at_cut = 1;
        return 0;
    }
    return er;
}

TEST(sample_rows_gives_the_cpu_distribution_and_token_on_mixed_rows)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    const int Vs[5] = {5, 257, 1003, 32003, 151936};
    for (int vi = 0; vi < 5; vi++) {
        for (int quant = 0; quant < 2; quant++) {
            int V = Vs[vi], n = 14;
            float *x = sample_logits(&e, n, V, quant);
            sd_sample_params p[14];
            for (int r = 0; r < n; r++) {
                sd_sample_params q = {0};
                q.seed = ((uint64_t)rnd_int(&e, 1 << 30) << 17) ^ (uint64_t)rnd_int(&e, 1 << 17);
                q.counter = (uint64_t)rnd_int(&e, 100000);
                q.temperature = sd_test_randf(&e.rng, 0.4f, 1.6f);
                q.top_p = 1.0f;
                switch (r % 7) {
                case 0: q.temperature = 0.0f; break;
                case 1: break;
                case 2: q.top_k = 1 + rnd_int(&e, 200); break;
                case 3: q.top_p = sd_test_randf(&e.rng, 0.2f, 0.97f); break;
                case 4:
                    q.top_k = 1 + rnd_int(&e, 2000);
                    q.top_p = sd_test_randf(&e.rng, 0.2f, 0.97f);
                    break;
                case 5: q.top_k = 1; break;
                case 6: q.top_p = 0.0f; break; /* the top token only */
                }
                q.stream = r % 2 ? SD_RNG_DRAFT : SD_RNG_TARGET; /* drafts sample too */
                p[r] = q;
            }
            float *cp = (float *)malloc((size_t)n * V * sizeof(float));
            int32_t *ct = (int32_t *)malloc(n * sizeof(int32_t));
            e.cpu->ops->sample_rows(e.cpu, ct, cp, x, p, n, V);
            float *dx = (float *)gput(&e, x, (size_t)n * V * sizeof(float));
            sd_sample_params *dp = (sd_sample_params *)gput(&e, p, sizeof p);
            float *dprobs = gpoison(&e, (size_t)n * V);
            int32_t *dt = ipoison(&e, n, -1);
            e.gpu->ops->sample_rows(e.gpu, dt, dprobs, dx, dp, n, V);
            float *gp = gget(&e, dprobs, (size_t)n * V);
            int32_t *gt = iget(&e, dt, n);
            double perr = 0, bad = 0;
            int near = 0, cuts = 0;
            for (int r = 0; r < n; r++) {
                const float *crow = cp + (size_t)r * V;
                int at_cut = 0;
                double er = gp ? row_err(gp + (size_t)r * V, crow, x + (size_t)r * V, V, &p[r],
                                         &at_cut)
                               : INFINITY;
                cuts += at_cut;
                if (er > perr)
                    perr = er;
                if (!gt) {
                    bad = INFINITY;
                    continue;
                }
                double u = sd_rand_uniform(p[r].seed, p[r].counter, p[r].stream);
                if (cdf_gap(crow, V, u) < 1e-5) {
                    near++;
                    continue;
                }
                if (gt[r] != ct[r]) {
                    bad += 1;
                    fprintf(stderr, "    row %d (T=%g k=%d p=%g): gpu %d cpu %d\n", r,
                            p[r].temperature, p[r].top_k, p[r].top_p, gt[r], ct[r]);
                }
            }
            ok &= reportf(perr, prob_bound(V), "sample_rows probs n=%d V=%d%s (%d at a cut within rounding)",
                          n, V, quant ? " tied logits" : "", cuts);
            ok &= reportf((double)cuts, 2, "sample_rows rows at a cut within rounding n=%d V=%d%s",
                          n, V, quant ? " tied logits" : "");
            ok &= reportf(bad, 0, "sample_rows tokens n=%d V=%d%s (mismatches, %d near a boundary)",
                          n, V, quant ? " tied logits" : "", near);
            free(gp);
            free(gt);
            free(cp);
            free(ct);
            free(x);
            gfree(&e, dx);
            gfree(&e, dp);
            gfree(&e, dprobs);
            gfree(&e, dt);
        }
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(accept_greedy_rows_equals_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    const int ks[4] = {0, 1, 5, 8};
    for (int ki = 0; ki < 4; ki++) {
        int k = ks[ki], n_seq = 37, V = 50;
        int32_t *draft = (int32_t *)malloc((size_t)(n_seq * k + 1) * sizeof(int32_t));
        int32_t *am = (int32_t *)malloc((size_t)n_seq * (k + 1) * sizeof(int32_t));
        for (int s = 0; s < n_seq; s++) {
            int match = rnd_int(&e, k + 1);
            for (int i = 0; i <= k; i++)
                am[s * (k + 1) + i] = rnd_int(&e, V);
            for (int i = 0; i < k; i++)
                draft[s * k + i] = i < match ? am[s * (k + 1) + i] : rnd_int(&e, V);
        }
        size_t no = (size_t)n_seq * (k + 1);
        int32_t *cn = (int32_t *)malloc(n_seq * sizeof(int32_t));
        int32_t *co = (int32_t *)malloc(no * sizeof(int32_t));
        for (size_t i = 0; i < no; i++)
            co[i] = -1; /* the same poison as the GPU's: unwritten entries agree */
        e.cpu->ops->accept_greedy_rows(e.cpu, cn, co, draft, am, n_seq, k);
        int32_t *dd = (int32_t *)gput(&e, draft, (size_t)(n_seq * k + 1) * sizeof(int32_t));
        int32_t *da = (int32_t *)gput(&e, am, no * sizeof(int32_t));
        int32_t *dn = ipoison(&e, n_seq, -1), *dout = ipoison(&e, no, -1);
        e.gpu->ops->accept_greedy_rows(e.gpu, dn, dout, dd, da, n_seq, k);
        int32_t *gn = iget(&e, dn, n_seq), *go = iget(&e, dout, no);
        double bad = gn && go ? 0 : INFINITY;
        for (int s = 0; gn && s < n_seq; s++)
            bad += gn[s] != cn[s];
        for (size_t i = 0; go && i < no; i++)
            bad += go[i] != co[i];
        ok &= reportf(bad, 0, "accept_greedy_rows n_seq=%d k=%d (mismatches)", n_seq, k);
        free(gn);
        free(go);
        free(cn);
        free(co);
        free(draft);
        free(am);
        gfree(&e, dd);
        gfree(&e, da);
        gfree(&e, dn);
        gfree(&e, dout);
    }
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ------------------------------------------------ sampled verification
 *
 * accept_sample_rows on the GPU against the CPU op (src/verify's
 * sd_accept_chain over sd_sampling_probs rows), on fresh random batches:
 * V = 257, 4099, 32000, 129280; k = 0..5 with per-sequence draft counts,
 * dense and packed (row0) layouts, drafts from q or deterministic (q NULL);
 * temperatures 0.6..1.2, top-k and top-p on and off, some greedy sequences.
 * Target rows are noise with a few strong tokens; the draft's logits are the
 * target's plus noise, so chains both accept and reject.
 *
 * Probabilities: every row of every sequence within prob_bound(V) of the
 * CPU's (relative to the row's largest: 1e-5, and eps * sqrt(V) past 7000),
 * or (row_err) different only at a top-k / top-p cut that rounding decides,
 * in under 1% of the sequences. Tokens: n_acc and out_tok equal the CPU's
 * per sequence, except where a decision on the CPU's path lies within
 * rounding of its boundary: |u q(d) - p(d)| <= 1e-6 p(d) for an acceptance
 * test, or u * total within 1e-6 (probability units) of a CDF step for a
 * sample (target, residual or bonus). Such sequences are counted ("near");
 * a mismatch elsewhere is a failure, and mismatches of any kind must stay
 * under 0.1% of the sequences. */

/* rounding of the GPU's rows: ~1e-7 per probability (measured), so the CDF
 * moves by ~1e-7 at most; 1e-6 leaves a tenfold margin */
#define ACC_NEAR 1e-6

/* distance of u * total from the nearest CDF step of the weights
 * w_i = p_i (q NULL) or p_i - q_i (residual; p itself when that is all zero)
 * over the positive weights, in probability units */
static double cdf_gap_abs(const float *p, const float *q, int V, double u)
{
    double total = 0;
    for (int i = 0; i < V; i++) {
        double w = q ? (double)p[i] - (double)q[i] : (double)p[i];
        if (w > 0)
            total += w;
    }
    if (!(total > 0))
        return q ? cdf_gap_abs(p, NULL, V, u) : INFINITY;
    double target = u * total, c = 0, gap = INFINITY;
    for (int i = 0; i < V; i++) {
        double w = q ? (double)p[i] - (double)q[i] : (double)p[i];
        if (w > 0) {
            c += w;
            if (fabs(c - target) < gap)
                gap = fabs(c - target);
        }
    }
    return gap;
}

/* What a probability row that differs from the CPU's looks like: its
 * sampling parameters, the worst element and the ids each side keeps. */
static void prob_row_diff(const float *g, const float *c, int V, const sd_sample_params *sp, int s,
                          int row, int k)
{
    int worst = 0, kept_g = 0, kept_c = 0, only_g = -1, only_c = -1;
    double sg = 0, sc = 0;
    for (int j = 0; j < V; j++) {
        if (fabs((double)g[j] - c[j]) > fabs((double)g[worst] - c[worst]))
            worst = j;
        kept_g += g[j] > 0;
        kept_c += c[j] > 0;
        if (g[j] > 0 && !(c[j] > 0))
            only_g = j;
        if (c[j] > 0 && !(g[j] > 0))
            only_c = j;
        sg += g[j];
        sc += c[j];
    }
    fprintf(stderr,
            "    probs V=%d k=%d seq %d row %d (T=%.9g top-k %d top-p %.9g): id %d gpu %.9g cpu %.9g; "
            "kept gpu %d cpu %d (only gpu: id %d %.9g, only cpu: id %d %.9g); sums %.17g %.17g\n",
            V, k, s, row, sp->temperature, sp->top_k, sp->top_p, worst, g[worst], c[worst], kept_g,
            kept_c, only_g, only_g >= 0 ? g[only_g] : 0.0, only_c, only_c >= 0 ? c[only_c] : 0.0,
            sg, sc);
}

/* 1 when a decision of sd_accept_chain on the CPU's rows p (kd + 1, V), on
 * the path the chain takes, lies within rounding of its boundary */
static int chain_near(const float *p, const float *q, const int32_t *draft, int kd,
                      const sd_sample_params *sp, int V)
{
    sd_sampling s = {sp->temperature, sp->top_p, sp->top_k, sp->seed};
    if (sd_sampling_is_greedy(&s))
        return 0; /* argmax of one-hot rows: no rounding */
    for (int i = 0; i < kd; i++) {
        const float *pi = p + (size_t)i * V;
        const uint64_t ctr = sp->counter + (uint64_t)i;
        if (!q) {
            double u = sd_rand_uniform(sp->seed, ctr, SD_RNG_TARGET);
            if (cdf_gap_abs(pi, NULL, V, u) < ACC_NEAR)
                return 1;
            if (sd_sample(pi, V, u) != draft[i])
                return 0;
            continue;
        }
        const float *qi = q + (size_t)i * V;
        double a = sd_rand_uniform(sp->seed, ctr, SD_RNG_ACCEPT) * (double)qi[draft[i]];
        double pd = pi[draft[i]];
        if (fabs(a - pd) <= ACC_NEAR * pd)
            return 1;
        if (a < pd)
            continue;
        return cdf_gap_abs(pi, qi, V, sd_rand_uniform(sp->seed, ctr, SD_RNG_RESIDUAL)) < ACC_NEAR;
    }
    double u = sd_rand_uniform(sp->seed, sp->counter + (uint64_t)kd, SD_RNG_TARGET);
    return cdf_gap_abs(p + (size_t)kd * V, NULL, V, u) < ACC_NEAR;
}

/* One call's inputs (host). */
typedef struct acc_batch {
    int n_seq, k, V, R; /* R: logits rows */
    float *logits;      /* (R, V) */
    float *q;           /* (n_seq, k, V) or NULL */
    int32_t *draft;     /* (n_seq, k) */
    int32_t *n_draft;   /* (n_seq) */
    int32_t *row0;      /* (n_seq) or NULL (dense) */
    sd_sample_params *p;
} acc_batch;

static sd_sample_params acc_params(gpu_env *e, int s)
{
    sd_sample_params p = {0};
    p.seed = ((uint64_t)rnd_int(e, 1 << 30) << 17) ^ (uint64_t)rnd_int(e, 1 << 17);
    p.counter = (uint64_t)rnd_int(e, 100000);
    p.temperature = sd_test_randf(&e->rng, 0.6f, 1.2f);
    p.top_p = 1.0f;
    switch (s % 8) {
    case 0: p.temperature = 0.0f; break; /* greedy */
    case 1: case 2: break;
    case 3: p.top_k = 1 + rnd_int(e, 50); break;
    case 4: p.top_k = 1 + rnd_int(e, 2000); break;
    case 5: case 6: p.top_p = sd_test_randf(&e->rng, 0.5f, 0.98f); break;
    case 7:
        p.top_k = 1 + rnd_int(e, 500);
        p.top_p = sd_test_randf(&e->rng, 0.5f, 0.98f);
        break;
    }
    return p;
}

static size_t acc_row0(const acc_batch *b, int s)
{
    return b->row0 ? (size_t)b->row0[s] : (size_t)s * (size_t)(b->k + 1);
}

static void acc_make(gpu_env *e, acc_batch *b, int n_seq, int k, int V, int with_q, int packed)
{
    memset(b, 0, sizeof *b);
    b->n_seq = n_seq;
    b->k = k;
    b->V = V;
    b->n_draft = (int32_t *)malloc((size_t)n_seq * sizeof(int32_t));
    b->p = (sd_sample_params *)malloc((size_t)n_seq * sizeof(sd_sample_params));
    b->draft = (int32_t *)malloc(((size_t)n_seq * k + 1) * sizeof(int32_t));
    if (packed)
        b->row0 = (int32_t *)malloc((size_t)n_seq * sizeof(int32_t));
    int R = 0;
    for (int s = 0; s < n_seq; s++) {
        b->n_draft[s] = s % 4 == 3 ? rnd_int(e, k + 1) : k;
        b->p[s] = acc_params(e, s);
        if (packed) {
            b->row0[s] = R;
            R += b->n_draft[s] + 1 + (s & 1); /* a gap row after odd sequences */
        }
    }
    b->R = packed ? R : n_seq * (k + 1);
    const size_t v = (size_t)V;
    b->logits = rnd_floats(e, (size_t)b->R * v, -2.0f, 2.0f);
    if (with_q)
        b->q = (float *)malloc(((size_t)n_seq * k * v + 1) * sizeof(float));
    float *dl = (float *)malloc(v * sizeof(float)), *pr = (float *)malloc(v * sizeof(float));
    for (int s = 0; s < n_seq; s++) {
        const size_t r0 = acc_row0(b, s);
        sd_sampling smp = {b->p[s].temperature, b->p[s].top_p, b->p[s].top_k, b->p[s].seed};
        for (int i = 0; i <= b->n_draft[s]; i++) {
            float *row = b->logits + (r0 + (size_t)i) * v;
            const int strong = 1 + rnd_int(e, 8);
            for (int j = 0; j < strong; j++)
                row[rnd_int(e, V)] += sd_test_randf(&e->rng, 4.0f, 12.0f);
        }
        for (int i = 0; i < b->n_draft[s]; i++) {
            const float *row = b->logits + (r0 + (size_t)i) * v;
            const uint64_t ctr = b->p[s].counter + (uint64_t)i;
            int32_t *d = &b->draft[(size_t)s * k + i];
            if (with_q) {
                for (int j = 0; j < V; j++)
                    dl[j] = row[j] + sd_test_randf(&e->rng, -1.0f, 1.0f);
                float *qi = b->q + ((size_t)s * k + i) * v;
                sd_sampling_probs(dl, V, &smp, qi);
                *d = sd_sample(qi, V, sd_rand_uniform(smp.seed, ctr, SD_RNG_DRAFT));
            } else if (rnd_int(e, 4) < 3) { /* the target's own sample: accepted */
                sd_sampling_probs(row, V, &smp, pr);
                *d = sd_sample(pr, V, sd_rand_uniform(smp.seed, ctr, SD_RNG_TARGET));
            } else {
                *d = rnd_int(e, V);
            }
        }
        for (int i = b->n_draft[s]; i < k; i++)
            b->draft[(size_t)s * k + i] = -5; /* past kd: never read */
    }
    free(dl);
    free(pr);
}

static void acc_free(acc_batch *b)
{
    free(b->logits);
    free(b->q);
    free(b->draft);
    free(b->n_draft);
    free(b->row0);
    free(b->p);
}

/* The batch in GPU memory. */
typedef struct acc_dev {
    float *logits, *q, *probs;
    int32_t *draft, *n_draft, *row0, *n_acc, *out;
    sd_sample_params *p;
} acc_dev;

static void acc_upload(gpu_env *e, const acc_batch *b, acc_dev *d)
{
    const size_t v = (size_t)b->V;
    memset(d, 0, sizeof *d);
    d->logits = (float *)gput(e, b->logits, (size_t)b->R * v * sizeof(float));
    if (b->q)
        d->q = (float *)gput(e, b->q, ((size_t)b->n_seq * b->k * v + 1) * sizeof(float));
    d->draft = (int32_t *)gput(e, b->draft, ((size_t)b->n_seq * b->k + 1) * sizeof(int32_t));
    d->n_draft = (int32_t *)gput(e, b->n_draft, (size_t)b->n_seq * sizeof(int32_t));
    if (b->row0)
        d->row0 = (int32_t *)gput(e, b->row0, (size_t)b->n_seq * sizeof(int32_t));
    d->p = (sd_sample_params *)gput(e, b->p, (size_t)b->n_seq * sizeof(sd_sample_params));
    d->probs = gpoison(e, (size_t)b->R * v);
    d->n_acc = ipoison(e, (size_t)b->n_seq, -1);
    d->out = ipoison(e, (size_t)b->n_seq * (b->k + 1), -1);
}

static void acc_dev_free(gpu_env *e, acc_dev *d)
{
    GFREE_ALL(e, d->logits, d->q, d->probs, d->draft, d->n_draft, d->row0, d->n_acc, d->out,
              d->p);
}

static void acc_gpu_op(gpu_env *e, const acc_batch *b, const acc_dev *d)
{
    e->gpu->ops->accept_sample_rows(e->gpu, d->n_acc, d->out, d->probs, d->logits, d->row0, d->q,
                                    d->draft, d->n_draft, d->p, b->n_seq, b->k, b->V);
}

/* The CPU op's results: NaN / -1 poisoned like the GPU's buffers. */
static void acc_cpu_op(gpu_env *e, const acc_batch *b, int32_t *n_acc, int32_t *out, float *probs)
{
    for (size_t i = 0; i < (size_t)b->R * b->V; i++)
        probs[i] = NAN;
    for (int i = 0; i < b->n_seq * (b->k + 1); i++)
        out[i] = -1;
    e->cpu->ops->accept_sample_rows(e->cpu, n_acc, out, probs, b->logits, b->row0, b->q, b->draft,
                                    b->n_draft, b->p, b->n_seq, b->k, b->V);
}

TEST(accept_sample_rows_equals_the_cpu_on_sampled_chains_but_at_rounding_boundaries)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    const int Vs[4] = {257, 4099, 32000, 129280}, nseq[4] = {128, 96, 64, 48};
    long all_seqs = 0, all_mism = 0;
    for (int vi = 0; vi < 4; vi++) {
        const int V = Vs[vi];
        const size_t v = (size_t)V;
        long seqs = 0, mism = 0, unexplained = 0, near = 0, drafted = 0, accepted = 0, cuts = 0;
        double perr = 0;
        for (int rep = 0; rep < 2; rep++) {
            for (int k = 0; k <= 5; k++) {
                const int n_seq = nseq[vi], with_q = (k + rep) % 4 != 3, packed = (k + rep) & 1;
                acc_batch b;
                acc_make(&e, &b, n_seq, k, V, with_q, packed);
                float *cp = (float *)malloc((size_t)b.R * v * sizeof(float));
                int32_t *cn = (int32_t *)malloc((size_t)n_seq * sizeof(int32_t));
                int32_t *co = (int32_t *)malloc((size_t)n_seq * (k + 1) * sizeof(int32_t));
                acc_cpu_op(&e, &b, cn, co, cp);
                acc_dev d;
                acc_upload(&e, &b, &d);
                acc_gpu_op(&e, &b, &d);
                float *gp = gget(&e, d.probs, (size_t)b.R * v);
                int32_t *gn = iget(&e, d.n_acc, (size_t)n_seq);
                int32_t *go = iget(&e, d.out, (size_t)n_seq * (k + 1));
                if (!gp || !gn || !go) {
                    ok = 0;
                    perr = INFINITY;
                }
                for (int s = 0; gp && gn && go && s < n_seq; s++) {
                    const int kd = b.n_draft[s];
                    const size_t r0 = acc_row0(&b, s);
                    for (int i = 0; i <= kd; i++) {
                        const float *g = gp + (r0 + i) * v, *c = cp + (r0 + i) * v;
                        int at_cut;
                        double er = row_err(g, c, b.logits + (r0 + i) * v, V, &b.p[s], &at_cut);
                        cuts += at_cut;
                        if (er > perr)
                            perr = er;
                        if (er > prob_bound(V) || at_cut)
                            prob_row_diff(g, c, V, &b.p[s], s, i, k);
                    }
                    const float *qs = b.q ? b.q + (size_t)s * k * v : NULL;
                    const int32_t *ds = b.draft + (size_t)s * k;
                    int is_near = chain_near(cp + r0 * v, qs, ds, kd, &b.p[s], V);
                    int same = gn[s] == cn[s];
                    for (int i = 0; i <= k; i++)
                        same &= go[(size_t)s * (k + 1) + i] == co[(size_t)s * (k + 1) + i];
                    seqs++;
                    near += is_near;
                    drafted += kd;
                    accepted += cn[s] > 0 ? cn[s] : 0;
                    if (!same) {
                        mism++;
                        unexplained += !is_near;
                        fprintf(stderr,
                                "    V=%d k=%d seq %d (T=%g top-k %d top-p %g q %d, %s): gpu n_acc "
                                "%d cpu %d; tokens:",
                                V, k, s, b.p[s].temperature, b.p[s].top_k, b.p[s].top_p, with_q,
                                is_near ? "near a boundary" : "NOT near a boundary", gn[s], cn[s]);
                        for (int i = 0; i <= k; i++)
                            fprintf(stderr, " %d/%d", go[(size_t)s * (k + 1) + i],
                                    co[(size_t)s * (k + 1) + i]);
                        fputc('\n', stderr);
                    }
                }
                free(gp);
                free(gn);
                free(go);
                free(cp);
                free(cn);
                free(co);
                acc_dev_free(&e, &d);
                acc_free(&b);
            }
        }
        ok &= reportf(perr, prob_bound(V),
                      "accept_sample_rows probs V=%d k=0..5 (%ld sequences; %ld rows at a cut "
                      "within rounding)",
                      V, seqs, cuts);
        ok &= reportf((double)cuts / (double)seqs, 1e-2,
                      "accept_sample_rows share of sequences with a row at a cut within rounding "
                      "V=%d",
                      V);
        ok &= reportf((double)unexplained, 0,
                      "accept_sample_rows tokens V=%d (mismatches not near a boundary; %ld mismatched, "
                      "%ld near a boundary, %ld of %ld drafts accepted)",
                      V, mism, near, accepted, drafted);
        all_seqs += seqs;
        all_mism += mism;
    }
    ok &= reportf(all_seqs ? (double)all_mism / (double)all_seqs : INFINITY, 1e-3,
                  "accept_sample_rows share of sequences whose tokens differ (%ld of %ld)", all_mism,
                  all_seqs);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* Captured into a graph: nothing allocates or synchronizes, a replay over
 * poisoned outputs gives the eager results bit for bit, and sequences with a
 * bad draft count or id get SD_EINVAL like on the CPU. */
TEST(accept_sample_rows_is_capture_safe_and_refuses_bad_sequences_like_the_cpu)
{
    gpu_env e;
    GPU_OPEN(e);
    const int V = 32000, k = 3, n_seq = 12;
    const size_t v = (size_t)V;
    acc_batch b;
    acc_make(&e, &b, n_seq, k, V, 1, 1);
    b.n_draft[1] = k + 1;
    b.n_draft[2] = -1;
    b.n_draft[4] = k;
    b.draft[4 * k + 1] = V; /* out of the vocabulary */
    b.n_draft[5] = k;
    b.draft[5 * k + 0] = -2;
    for (int i = 0; i < k; i++) /* the rows of sequence 1 now run past its own */
        b.draft[1 * k + i] = i;
    float *cp = (float *)malloc((size_t)b.R * v * sizeof(float));
    int32_t cn[12], co[12 * 4];
    acc_cpu_op(&e, &b, cn, co, cp);
    for (int s = 1; s <= 5; s++)
        if (s != 3)
            ASSERT_EQ(cn[s], SD_EINVAL);
    acc_dev d;
    acc_upload(&e, &b, &d);
    acc_gpu_op(&e, &b, &d);
    ASSERT_EQ(e.gpu->ops->sync(e.gpu), 0);
    float *ep = gget(&e, d.probs, (size_t)b.R * v);
    int32_t *en = iget(&e, d.n_acc, n_seq), *eo = iget(&e, d.out, (size_t)n_seq * (k + 1));
    ASSERT(ep && en && eo);
    void *graph = NULL;
    ASSERT_OK(e.gpu->ops->graph_begin(e.gpu));
    acc_gpu_op(&e, &b, &d);
    ASSERT_OK(e.gpu->ops->graph_end(e.gpu, &graph));
    /* poison what the graph must rewrite, then replay */
    float *nan = nan_floats((size_t)b.R * v);
    e.gpu->ops->upload(e.gpu, d.probs, nan, (size_t)b.R * v * sizeof(float));
    free(nan);
    int32_t poison[12 * 4];
    for (int i = 0; i < 12 * 4; i++)
        poison[i] = -1;
    e.gpu->ops->upload(e.gpu, d.n_acc, poison, (size_t)n_seq * sizeof(int32_t));
    e.gpu->ops->upload(e.gpu, d.out, poison, (size_t)n_seq * (k + 1) * sizeof(int32_t));
    ASSERT_OK(e.gpu->ops->graph_launch(e.gpu, graph));
    ASSERT_EQ(e.gpu->ops->sync(e.gpu), 0);
    float *rp = gget(&e, d.probs, (size_t)b.R * v);
    int32_t *rn = iget(&e, d.n_acc, n_seq), *ro = iget(&e, d.out, (size_t)n_seq * (k + 1));
    ASSERT(rp && rn && ro);
    /* bits, NaN gaps included */
    int ok = report("accept_sample_rows graph replay vs eager (bitwise)",
                    memcmp(rp, ep, (size_t)b.R * v * sizeof(float)) == 0 &&
                            memcmp(rn, en, sizeof cn) == 0 && memcmp(ro, eo, sizeof co) == 0
                        ? 0
                        : 1,
                    0);
    double bad = 0;
    for (int s = 0; s < n_seq; s++) {
        bad += en[s] != cn[s] && (cn[s] < 0 || en[s] < 0); /* refusals exactly */
        if (cn[s] < 0)
            for (int i = 0; i <= k; i++)
                bad += eo[s * (k + 1) + i] != -1; /* and no tokens */
    }
    ok &= report("accept_sample_rows refusals (bad draft count or id) vs the cpu (mismatches)", bad,
                 0);
    e.gpu->ops->graph_free(e.gpu, graph);
    free(ep);
    free(en);
    free(eo);
    free(rp);
    free(rn);
    free(ro);
    free(cp);
    acc_dev_free(&e, &d);
    acc_free(&b);
    gpu_env_close(&e);
    ASSERT(ok);
}

/* ------------------------------------------------------- errors and graphs */

/* A queued-ahead step's copies (ops.h copies, download_async) by kernels:
 * random words from page-locked host memory and from the device, rows at
 * pitches, parts in order (the last overwrites the first's words), against
 * the CPU backend's copies; a download into page-locked memory by a
 * kernel, read after download_wait; and the copy engine's path where the
 * switches are off (copies: SD_ENOTSUP, nothing queued). */
TEST(step_copies_by_a_kernel_equal_the_cpus)
{
    gpu_env e;
    GPU_OPEN(e);
    int ok = 1;
    /* 1505 words (6 KB) in all: two of a thread's batches of loads */
    const size_t W = 40, R = 7, dp = 64 * 4, sp = 48 * 4, n1 = 1200, n2 = 25;
    int32_t *hsrc = (int32_t *)e.gpu->ops->host_alloc(e.gpu, R * sp + n1 * 4);
    int32_t *dev_h = (int32_t *)malloc(n2 * 4);
    ASSERT(hsrc && dev_h);
    for (size_t i = 0; i < R * sp / 4 + n1; i++)
        hsrc[i] = (int32_t)(sd_test_randf(&e.rng, 0, 1) * 2147483647.0f);
    for (size_t i = 0; i < n2; i++)
        dev_h[i] = -(int32_t)i - 1;
    int32_t *dsrc = (int32_t *)gput(&e, dev_h, n2 * 4);
    const size_t nd = R * dp / 4 + n1 + 8;
    float *dd = gpoison(&e, nd);
    /* the same copies on the CPU, into a NaN-filled buffer */
    float *cd = (float *)malloc(nd * sizeof(float));
    for (size_t i = 0; i < nd; i++)
        cd[i] = NAN;
    int32_t *tbl = (int32_t *)(void *)hsrc, *meta = hsrc + R * sp / 4;
    for (int side = 0; side < 2; side++) {
        char *base = side ? (char *)cd : (char *)dd;
        const void *dev_src = side ? (const void *)dev_h : (const void *)dsrc;
        sd_copy cp[3] = {
            {.dst = base, .src = tbl, .width = W * 4, .rows = R, .dpitch = dp, .spitch = sp},
            {.dst = base + R * dp, .src = meta, .width = n1 * 4, .rows = 1, .dpitch = n1 * 4,
             .spitch = n1 * 4},
            {.dst = base + R * dp + 8, .src = dev_src, .width = n2 * 4, .rows = 1,
             .dpitch = n2 * 4, .spitch = n2 * 4}};
        sd_backend *be = side ? e.cpu : e.gpu;
        if (!side)
            sd_cuda_set_kernel_copies(e.gpu, 1, 1);
        ok &= reportf(be->ops->copies(be, cp, 3) ? 1 : 0, 0, "copies by %s queued",
                      side ? "the cpu" : "a kernel");
    }
    float *g = gget(&e, dd, nd);
    ok &= reportf(g && !memcmp(g, cd, nd * sizeof(float)) ? 0 : 1, 0,
                  "copies: 2-D rows from page-locked memory, a row from it and one from the "
                  "device overwriting it: the cpu's bytes");
    /* the kernel's download into page-locked memory */
    int32_t *hdst = (int32_t *)e.gpu->ops->host_alloc(e.gpu, n2 * 4);
    ASSERT(hdst);
    memset(hdst, 0, n2 * 4);
    ok &= reportf(e.gpu->ops->download_async(e.gpu, hdst, dsrc, n2 * 4, 1) ? 1 : 0, 0,
                  "download_async by a kernel queued");
    ok &= reportf(e.gpu->ops->download_wait(e.gpu, 1) ? 1 : 0, 0, "download_wait");
    ok &= reportf(memcmp(hdst, dev_h, n2 * 4) ? 1 : 0, 0,
                  "download_async by a kernel: the device's words in page-locked memory");
    /* a step's copies with the step before's tokens down as their fourth
     * (a destination in page-locked memory), then a mark of nothing: the
     * wait for the mark brings the words (the engine's launch ahead) */
    memset(hdst, 0, n2 * 4);
    {
        sd_copy cp4[4] = {
            {.dst = dd, .src = tbl, .width = W * 4, .rows = R, .dpitch = dp, .spitch = sp},
            {.dst = (char *)dd + R * dp, .src = meta, .width = n1 * 4, .rows = 1,
             .dpitch = n1 * 4, .spitch = n1 * 4},
            {.dst = (char *)dd + R * dp + 8, .src = dsrc, .width = n2 * 4, .rows = 1,
             .dpitch = n2 * 4, .spitch = n2 * 4},
            {.dst = hdst, .src = dsrc, .width = n2 * 4, .rows = 1, .dpitch = n2 * 4,
             .spitch = n2 * 4}};
        ok &= reportf(e.gpu->ops->copies(e.gpu, cp4, 4) ? 1 : 0, 0,
                      "copies with a part into page-locked memory queued");
        ok &= reportf(e.gpu->ops->download_async(e.gpu, hdst, dsrc, 0, 1) ? 1 : 0, 0,
                      "a mark of nothing queued");
        ok &= reportf(e.gpu->ops->download_wait(e.gpu, 1) ? 1 : 0, 0, "its download_wait");
        ok &= reportf(memcmp(hdst, dev_h, n2 * 4) ? 1 : 0, 0,
                      "copies' part into page-locked memory: the device's words after the mark");
        float *g4 = gget(&e, dd, nd);
        ok &= reportf(g4 && !memcmp(g4, cd, nd * sizeof(float)) ? 0 : 1, 0,
                      "copies with a fourth part: the device's three the cpu's bytes");
        free(g4);
    }
    /* switched off: the copy engine */
    sd_cuda_set_kernel_copies(e.gpu, 0, 0);
    sd_copy one = {.dst = dd, .src = dsrc, .width = 4, .rows = 1, .dpitch = 4, .spitch = 4};
    ok &= reportf(e.gpu->ops->copies(e.gpu, &one, 1) == SD_ENOTSUP ? 0 : 1, 0,
                  "copies switched off: SD_ENOTSUP");
    memset(hdst, 0, n2 * 4);
    e.gpu->ops->download_async(e.gpu, hdst, dsrc, n2 * 4, 0);
    ok &= reportf(e.gpu->ops->download_wait(e.gpu, 0) || memcmp(hdst, dev_h, n2 * 4) ? 1 : 0, 0,
                  "download_async by the copy engine");
    sd_cuda_set_kernel_copies(e.gpu, SD_CUDA_KERNEL_DOWN_DEFAULT, SD_CUDA_KERNEL_UP_DEFAULT);
    free(g);
    free(cd);
    free(dev_h);
    gfree(&e, dd);
    gfree(&e, dsrc);
    e.gpu->ops->host_free(e.gpu, hsrc);
    e.gpu->ops->host_free(e.gpu, hdst);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(a_bad_op_is_reported_by_sync_with_its_name_and_stops_later_ops)
{
    gpu_env e;
    GPU_OPEN(e);
    float *buf = gpoison(&e, 4096);
    int32_t zero[4] = {0, 0, 0, 0};
    int32_t *di = (int32_t *)gput(&e, zero, sizeof zero);
    sd_attn_batch b = {.n_tokens = 1, .pos = di, .seq = di, .slot = di, .block_table = di,
                       .max_blocks = 1, .block_size = 16, .max_pos = 1};
    ASSERT_EQ(e.gpu->ops->sync(e.gpu), 0);
    /* 6 query heads cannot share 4 KV heads */
    e.gpu->ops->attn_gqa(e.gpu, buf, buf, buf, buf, buf, buf, &b, 6, 4, 8, 8, 48, 32, 1.0f);
    ASSERT_EQ(e.gpu->ops->sync(e.gpu), SD_EDEVICE);
    ASSERT_CONTAINS(sd_cuda_backend_error(e.gpu), "attn_gqa");
    ASSERT_CONTAINS(sd_cuda_backend_error(e.gpu), "attention.cu");
    ASSERT_CONTAINS(sd_cuda_backend_error(e.gpu), "device 0");
    float h[8];
    ASSERT_EQ(e.gpu->ops->download(e.gpu, h, buf, sizeof h), SD_EDEVICE);
    gpu_env_close(&e);
    /* a fresh context is unaffected */
    GPU_OPEN(e);
    float *x = gpoison(&e, 8);
    float one[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    e.gpu->ops->upload(e.gpu, x, one, sizeof one);
    e.gpu->ops->add(e.gpu, x, x, 1, 8);
    ASSERT_EQ(e.gpu->ops->sync(e.gpu), 0);
    ASSERT_OK(e.gpu->ops->download(e.gpu, h, x, sizeof h));
    ASSERT_NEAR(h[7], 16.0, 0);
    gpu_env_close(&e);
}

/* The ops of one layer step (cuBLASLt matmul, in-place silu_mul, norm,
 * rope, paged attention, routing, the fused and the sorted experts) captured
 * into a CUDA graph:
 * capture succeeds only if nothing allocates or synchronizes, and a replay
 * gives the eager results bit for bit. */
/* A cuBLASLt plan first needed inside a capture cannot time its candidate
 * algorithms (no host synchronization while capturing): it takes the
 * heuristic's first, the replay is right, and an eager call of the same
 * shape afterwards reuses that plan: the same bits. */
TEST(matmul_plans_made_under_capture_skip_the_timed_trial_and_replay_right)
{
    gpu_env e;
    GPU_OPEN(e);
    const int n = SD_CUDA_GEMV_MAX_ROWS + 30, N = 384, K = 520;
    tw w;
    ASSERT_OK(tw_make(&e, &w, SD_DT_BF16, N, K, 0.5f));
    float *x = rnd_floats(&e, (size_t)n * K, -1, 1);
    float *co = (float *)malloc((size_t)n * N * sizeof(float));
    e.cpu->ops->matmul(e.cpu, co, x, &w.c, NULL, n, K);
    float *dx = (float *)gput(&e, x, (size_t)n * K * sizeof(float));
    float *dy = gpoison(&e, (size_t)n * N), *dy2 = gpoison(&e, (size_t)n * N);
    sd_cuda_graph *g = NULL;
    ASSERT_OK(sd_cuda_capture_begin(e.gpu));
    e.gpu->ops->matmul(e.gpu, dy, dx, &w.g, NULL, n, K);
    ASSERT_OK(sd_cuda_capture_end(e.gpu, &g));
    ASSERT_OK(sd_cuda_graph_launch(e.gpu, g));
    char name[128];
    snprintf(name, sizeof name, "matmul BF16 n=%d N=%d K=%d planned under capture, replay", n, N,
             K);
    int ok = check_dev(&e, dy, co, (size_t)n * N, 1e-4, name);
    e.gpu->ops->matmul(e.gpu, dy2, dx, &w.g, NULL, n, K);
    float *a = gget(&e, dy, (size_t)n * N), *b = gget(&e, dy2, (size_t)n * N);
    double bad = a && b ? 0 : INFINITY;
    for (size_t i = 0; a && b && i < (size_t)n * N; i++)
        bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    ok &= reportf(bad, 0, "matmul BF16 n=%d: eager after the capture vs replay (differing elements)",
                  n);
    sd_cuda_graph_destroy(g);
    free(a);
    free(b);
    free(x);
    free(co);
    gfree(&e, dx);
    gfree(&e, dy);
    gfree(&e, dy2);
    tw_free(&e, &w);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST(ops_are_capture_safe_and_a_graph_replay_equals_the_eager_run)
{
    gpu_env e;
    GPU_OPEN(e);
    int ctx[3] = {40, 9, 120}, nnew[3] = {16, 9, 1};
    tbatch b;
    tbatch_make(&e, &b, 3, ctx, nnew, 16);
    int T = b.T, D = 128, H = 4, Hd = 32, I = 96, E = 8, K = 2;
    tw wqkv, wo, norm, wgu, router, g[8], u[8], d[8];
    ASSERT_OK(tw_make(&e, &wqkv, SD_DT_BF16, 3 * H * Hd, D, 0.2f));
    ASSERT_OK(tw_make(&e, &wo, SD_DT_BF16, D, H * Hd, 0.2f));
    ASSERT_OK(tw_make(&e, &norm, SD_DT_BF16, 1, D, 1.0f));
    ASSERT_OK(tw_make(&e, &wgu, SD_DT_BF16, 2 * I, D, 0.2f));
    ASSERT_OK(tw_make(&e, &router, SD_DT_F32, E, D, 0.2f));
    sd_weight eg[8], eu[8], ed[8];
    for (int x = 0; x < E; x++) {
        ASSERT_OK(tw_make(&e, &g[x], SD_DT_BF16, I, D, 0.2f));
        ASSERT_OK(tw_make(&e, &u[x], SD_DT_BF16, I, D, 0.2f));
        ASSERT_OK(tw_make(&e, &d[x], SD_DT_BF16, D, I, 0.2f));
        eg[x] = g[x].g;
        eu[x] = u[x].g;
        ed[x] = d[x].g;
    }
    sd_experts ex = {.n = E, .gate = eg, .up = eu, .down = ed};
    sd_moe_route r = {.n_experts = E, .top_k = K, .n_group = 4, .topk_group = 2,
                      .norm_topk_prob = 1, .sigmoid = 1, .routed_scaling_factor = 2.5f};
    /* top-8 of the same logits (no groups): T * 8 pairs take the sorted
     * expert path, T * 2 the fused one */
    const int K4 = 8;
    sd_moe_route r4 = r;
    r4.top_k = K4;
    r4.n_group = r4.topk_group = 1;
    ASSERT(T * K > 0 && T * K <= SD_CUDA_MOE_FUSED_MAX_PAIRS);
    ASSERT(T * K4 > SD_CUDA_MOE_FUSED_MAX_PAIRS);
    float *inv = rnd_floats(&e, Hd / 2, 0.001f, 1.0f);
    float *dinv = (float *)gput(&e, inv, Hd / 2 * sizeof(float));
    sd_rope rope = {.inv_freq = dinv, .rot_dim = Hd, .interleave = 0, .mscale = 1.0f};
    float *x0 = rnd_floats(&e, (size_t)T * D, -1, 1);
    float *dx0 = (float *)gput(&e, x0, (size_t)T * D * 4);
    float *x = gpoison(&e, (size_t)T * D), *xn = gpoison(&e, (size_t)T * D);
    float *qkv = gpoison(&e, (size_t)T * 3 * H * Hd), *att = gpoison(&e, (size_t)T * H * Hd);
    float *gu = gpoison(&e, (size_t)T * 2 * I), *fo = gpoison(&e, (size_t)T * D);
    float *rl = gpoison(&e, (size_t)T * E), *wts = gpoison(&e, (size_t)T * K);
    int32_t *ids = (int32_t *)gpoison(&e, (size_t)T * K);
    float *tmp = gpoison(&e, SD_MOE_TMP_FLOATS(T, K4, D, I));
    float *wts4 = gpoison(&e, (size_t)T * K4);
    int32_t *ids4 = (int32_t *)gpoison(&e, (size_t)T * K4);
    /* earlier positions of the sequences: random cache contents */
    size_t mc = (size_t)b.n_slots * H * Hd;
    float *hc = rnd_floats(&e, 2 * mc, -1, 1);
    float *kc = (float *)gput(&e, hc, mc * 4), *vc = (float *)gput(&e, hc + mc, mc * 4);
    free(hc);
    const sd_ops *op = e.gpu->ops;
    sd_backend *be = e.gpu;
    float *eager = NULL, *replay = NULL;
    for (int pass = 0; pass < 2; pass++) {
        sd_cuda_graph *gr = NULL;
        if (pass == 1)
            ASSERT_OK(sd_cuda_capture_begin(be));
        op->copy2d(be, x, dx0, T, D, D, D);
        op->rmsnorm(be, xn, x, &norm.g, T, D, D, D, 1e-6f);
        op->matmul(be, qkv, xn, &wqkv.g, NULL, T, D);
        op->rope(be, qkv, b.dpos, &rope, T, 2 * H, 3 * H * Hd, Hd, 0);
        op->attn_gqa(be, att, qkv, qkv + H * Hd, qkv + 2 * H * Hd, kc, vc, &b.db, H, H, Hd, Hd,
                     3 * H * Hd, 3 * H * Hd, 0.2f);
        op->matmul(be, fo, att, &wo.g, NULL, T, H * Hd);
        op->add(be, x, fo, T, D);
        op->matmul(be, gu, x, &wgu.g, NULL, T, D);
        op->silu_mul(be, gu, gu, T, I);
        op->matmul(be, rl, x, &router.g, NULL, T, D);
        op->moe_route(be, ids, wts, rl, NULL, T, &r);
        op->moe_ffn(be, fo, x, ids, wts, &ex, T, K, D, tmp);
        op->add(be, x, fo, T, D);
        op->moe_route(be, ids4, wts4, rl, NULL, T, &r4);
        op->moe_ffn(be, fo, x, ids4, wts4, &ex, T, K4, D, tmp);
        op->add(be, x, fo, T, D);
        if (pass == 1) {
            ASSERT_OK(sd_cuda_capture_end(be, &gr));
            /* poison what the graph must rewrite, then replay */
            float *nan = nan_floats((size_t)T * D);
            op->upload(be, x, nan, (size_t)T * D * 4);
            free(nan);
            ASSERT_OK(sd_cuda_graph_launch(be, gr));
        }
        ASSERT_EQ(op->sync(be), 0);
        float *out = gget(&e, x, (size_t)T * D);
        ASSERT(out != NULL);
        if (pass == 0)
            eager = out;
        else
            replay = out;
        sd_cuda_graph_destroy(gr);
    }
    int ok = report("cuda graph replay of a MoE layer step vs eager (bitwise)",
                    rel_err(replay, eager, (size_t)T * D), 0);
    for (size_t i = 0; i < (size_t)T * D && ok; i++)
        ok = isfinite(eager[i]);
    free(eager);
    free(replay);
    free(x0);
    free(inv);
    GFREE_ALL(&e, dinv, dx0, x, xn, qkv, att, gu, fo, rl, wts, ids, tmp, kc, vc, wts4, ids4);
    tw *ws[] = {&wqkv, &wo, &norm, &wgu, &router};
    for (size_t i = 0; i < SD_ARRAY_LEN(ws); i++)
        tw_free(&e, ws[i]);
    for (int k = 0; k < E; k++) {
        tw_free(&e, &g[k]);
        tw_free(&e, &u[k]);
        tw_free(&e, &d[k]);
    }
    tbatch_free(&e, &b);
    gpu_env_close(&e);
    ASSERT(ok);
}

TEST_MAIN(T(embed_copies_and_elementwise_ops_equal_the_cpu),
          T(rmsnorm_matches_the_cpu_with_strides_and_in_place),
          T(add_rmsnorm_matches_the_cpu_and_the_gpus_add_then_rmsnorm_bitwise),
          T(rope_matches_the_cpu_for_every_variant_up_to_8k_positions),
          T(matmul_gemv_rows_match_the_cpu_in_fp32), T(matmul_gemv_rows_do_not_depend_on_the_batch),
          T(matmul_few_row_gemv_gives_the_gemvs_bits),
          T(matmul_many_rows_match_the_cpu), T(fp8_weights_match_the_cpu_and_their_bf16_scratch),
          T(fp8_experts_match_the_cpu_and_their_bf16_scratch),
          T(matmul_row_counts_of_one_bucket_share_its_timed_trial),
          T(matmul_a_timed_choice_outlives_its_plan),
          T(matmul_silu_matches_the_cpu_and_the_gpus_matmul_then_silu_mul_bitwise),
          T(matmul_heads_matches_the_cpu), T(attn_gqa_matches_the_cpu_on_ragged_paged_batches),
          T(rope_kv_and_mla_prep_match_the_cpu_on_ragged_paged_batches),
          T(attn_gqa_matches_the_cpu_on_long_contexts), T(attn_mla_decode_kernel_matches_the_cpu),
          T(attn_mla_matches_the_cpu_on_ragged_and_long_contexts),
          T(attn_mla_on_tensor_cores_matches_the_cpu_within_bf16_rounding),
          T(attn_mla_on_tensor_cores_gives_a_token_the_same_bits_in_decode_and_verify),
          T(attn_mla_on_the_general_kernel_gives_a_token_the_same_bits_in_decode_and_verify),
          T(attention_split_steps_of_more_than_8_tokens_match_the_cpu),
          T(moe_route_matches_the_cpu), T(moe_router_route_is_the_gpus_matmul_then_moe_route),
          T(moe_ffn_matches_the_cpu), T(moe_ffn_fused_small_batches_match_the_cpu),
          T(moe_router_ffn_routes_beside_the_always_on_experts),
          T(mla_prep_absorb_in_one_launch_gives_the_two_ops_bits),
          T(moe_ffn_tensor_core_prefill_matches_the_cpu_and_odd_shapes_fall_back),
          T(argmax_rows_equals_the_cpu_with_ties_and_nan),
          T(sample_rows_gives_the_cpu_distribution_and_token_on_mixed_rows),
          T(accept_greedy_rows_equals_the_cpu),
          T(accept_sample_rows_equals_the_cpu_on_sampled_chains_but_at_rounding_boundaries),
          T(accept_sample_rows_is_capture_safe_and_refuses_bad_sequences_like_the_cpu),
          T(step_copies_by_a_kernel_equal_the_cpus),
          T(a_bad_op_is_reported_by_sync_with_its_name_and_stops_later_ops),
          T(matmul_plans_made_under_capture_skip_the_timed_trial_and_replay_right),
          T(ops_are_capture_safe_and_a_graph_replay_equals_the_eager_run))

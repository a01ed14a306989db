/* CPU reference: embedding lookup, add, SiLU-and-multiply, row copies. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void sd__cpu_embed(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids, int n)
{
    (void)be;
    for (int i = 0; i < n; i++)
        sd__cpu_weight_row(table, ids[i], out + (size_t)i * (size_t)table->cols);
}

void sd__cpu_embed_shard(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids,
                         int n, int first)
{
    (void)be;
    size_t d = (size_t)table->cols;
    for (int i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - first;
        float *o = out + (size_t)i * d;
        if (r >= 0 && r < table->rows)
            sd__cpu_weight_row(table, r, o);
        else
            memset(o, 0, d * sizeof(float));
    }
}

void sd__cpu_add(sd_backend *be, float *y, const float *x, int n, int d)
{
    (void)be;
    size_t m = (size_t)n * (size_t)d;
    for (size_t i = 0; i < m; i++)
        y[i] += x[i];
}

void sd__cpu_silu_mul(sd_backend *be, float *out, const float *gu, int n, int I)
{
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *g = gu + (size_t)t * 2 * (size_t)I, *u = g + I;
        float *o = out + (size_t)t * (size_t)I;
        for (int i = 0; i < I; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void sd__cpu_gather_i32(sd_backend *be, int32_t *out, const int32_t *table, const int32_t *idx,
                        int n)
{
    (void)be;
    for (int i = 0; i < n; i++)
        out[i] = table[idx[i]];
}

void sd__cpu_scatter_cols(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                          int ws, int wd)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        float *d = dst + (size_t)i * (size_t)wd;
        const float *s = src + (size_t)i * (size_t)ws;
        memset(d, 0, (size_t)wd * sizeof *d);
        for (int c = 0; c < ws; c++)
            d[map[c]] = s[c];
    }
}

void sd__cpu_gather_rows(sd_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                         int d, int ds, int ss)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * (size_t)ds, src + (size_t)idx[i] * (size_t)ss,
                (size_t)d * sizeof(float));
}

void sd__cpu_copy2d(sd_backend *be, float *dst, const float *src, int n, int d, int ds, int ss)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * (size_t)ds, src + (size_t)i * (size_t)ss,
                (size_t)d * sizeof(float));
}

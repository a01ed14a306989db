/* CPU reference: y = x @ W^T over fp32 activations and F32/F16/BF16 weights.
 * Parallel over output columns; each weight row is read once per call and
 * dotted with every input row (decode reads each weight byte once). */
#include <string.h>

#include "kernels/cpu/cpu.h"

typedef struct mm_ctx {
    sd_backend *be;
    float *y;
    const float *x;
    const sd_weight *w, *bias;
    int n, x_stride;
    int rows_f32; /* an FP8 weight's rows decoded once into the thread's scratch */
    int H, x_head_stride, x_off, N; /* matmul_heads */
} mm_ctx;

static void mm_task(void *arg, int b, int e, int thread)
{
    mm_ctx *c = arg;
    int64_t N = c->w->rows;
    float *row = c->rows_f32 ? sd__cpu_scratch(c->be, thread, (size_t)c->w->cols) : NULL;
    for (int j = b; j < e; j++) {
        float bj = c->bias ? sd_load_f32(c->bias->data, c->bias->dtype, (size_t)j) : 0.0f;
        /* an FP8 row decoded: the same products in the same order as
         * sd__cpu_dot_row's, read as the F32 row it is now */
        sd_weight rw = {.data = row, .dtype = SD_DT_F32, .rows = 1, .cols = c->w->cols};
        if (row)
            sd__cpu_weight_row(c->w, j, row);
        int t = 0;
        /* four activation rows a pass over the weight row */
        for (; t + 4 <= c->n; t += 4) {
            const float *xs[4];
            float o[4];
            for (int k = 0; k < 4; k++)
                xs[k] = c->x + (size_t)(t + k) * (size_t)c->x_stride;
            if (row ? sd__cpu_dot4_row(&rw, 0, xs, o) : sd__cpu_dot4_row(c->w, j, xs, o))
                break;
            for (int k = 0; k < 4; k++)
                c->y[(size_t)(t + k) * (size_t)N + (size_t)j] = o[k] + bj;
        }
        for (; t < c->n; t++) {
            const float *xt = c->x + (size_t)t * (size_t)c->x_stride;
            c->y[(size_t)t * (size_t)N + (size_t)j] =
                (row ? sd__cpu_dot_f32(row, xt, (size_t)c->w->cols) : sd__cpu_dot_row(c->w, j, xt)) +
                bj;
        }
    }
}

void sd__cpu_matmul(sd_backend *be, float *y, const float *x, const sd_weight *w,
                    const sd_weight *bias, int n, int x_stride)
{
    mm_ctx c = {.be = be, .y = y, .x = x, .w = w, .bias = bias, .n = n, .x_stride = x_stride};
    /* FP8 rows read by several activation rows: decoded once, not per row */
    c.rows_f32 = w->dtype == SD_DT_F8_E4M3 && n > 1 &&
                 sd__cpu_reserve_scratch(be, (size_t)w->cols) == 0;
    sd__cpu_parallel(be, (int)w->rows, (size_t)w->cols * (size_t)n, mm_task, &c);
}

/* y(n, H, N) = x(n, H, K) @ W_h^T, W = [H*N, K]: output column j of head h is
 * weight row h*N + j. */
static void mmh_task(void *arg, int b, int e, int thread)
{
    (void)thread;
    mm_ctx *c = arg;
    int N = c->N;
    for (int r = b; r < e; r++) {
        int h = r / N, j = r % N;
        for (int t = 0; t < c->n; t++) {
            const float *xr = c->x + (size_t)t * (size_t)c->x_stride +
                              (size_t)h * (size_t)c->x_head_stride + (size_t)c->x_off;
            c->y[((size_t)t * (size_t)c->H + (size_t)h) * (size_t)N + (size_t)j] =
                sd__cpu_dot_row(c->w, r, xr);
        }
    }
}

void sd__cpu_matmul_heads(sd_backend *be, float *y, const float *x, const sd_weight *w, int n,
                          int H, int x_stride, int x_head_stride, int x_off)
{
    mm_ctx c = {.y = y, .x = x, .w = w, .n = n, .x_stride = x_stride, .H = H,
                .x_head_stride = x_head_stride, .x_off = x_off, .N = (int)(w->rows / H)};
    sd__cpu_parallel(be, (int)w->rows, (size_t)w->cols * (size_t)n, mmh_task, &c);
}

/* matmul then silu_mul in place: the ops contract's definition, step by step */
void sd__cpu_matmul_silu(sd_backend *be, float *gu, const float *x, const sd_weight *w, int n,
                         int x_stride)
{
    sd__cpu_matmul(be, gu, x, w, NULL, n, x_stride);
    sd__cpu_silu_mul(be, gu, gu, n, (int)(w->rows / 2));
}

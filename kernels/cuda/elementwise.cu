/* CUDA: embedding lookup, add, SiLU-and-multiply, row copies
 * (kernels/cpu/elementwise.c is the reference). */
#include <math.h>

#include "kernels/cuda/common.cuh"

static inline unsigned blocks_for(size_t n, unsigned per)
{
    size_t b = (n + per - 1) / per;
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}

/* out(n, D) = table[ids[i] - first]. An id outside the table gives zeros
 * for a vocab shard (another rank holds the row) and NaN rows for the whole
 * table, so a bad token shows in the logits instead of reading past the
 * weight. */
#define EMBED_BATCH 8 /* elements of the row a thread loads before it stores them */

__global__ void embed_kernel(float *out, const void *table, int dt, const int32_t *ids,
                             int64_t rows, int D, int first, int shard)
{
    SD_PDL_ENTER(out, table, dt, ids, rows, D, first, shard);
    int i = blockIdx.x;
    int64_t id = (int64_t)ids[i] - first;
    float *o = out + (size_t)i * (size_t)D;
    if (id < 0 || id >= rows) {
        float f = shard ? 0.0f : __int_as_float(0x7fc00000);
        for (int d = threadIdx.x; d < D; d += blockDim.x)
            o[d] = f;
        return;
    }
    /* a thread's elements are loaded before they are stored: a store
     * between two loads made each load wait for the last (the compiler
     * cannot tell the rows apart), 8 round trips to memory in a row of
     * 2048 where one does (the V2-Lite-shaped step's embedding took 6.5
     * us in the kernel trace; bench/results/NOTES.md, session 23) */
    size_t base = (size_t)id * (size_t)D;
    const int step = (int)blockDim.x;
    for (int d0 = threadIdx.x; d0 < D; d0 += EMBED_BATCH * step) {
        float v[EMBED_BATCH];
#pragma unroll
        for (int u = 0; u < EMBED_BATCH; u++)
            v[u] = d0 + u * step < D ? sd__wload(table, dt, base + (size_t)(d0 + u * step)) : 0.0f;
#pragma unroll
        for (int u = 0; u < EMBED_BATCH; u++)
            if (d0 + u * step < D)
                o[d0 + u * step] = v[u];
    }
}

void sd__cuda_embed(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids, int n)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    sd__launch(c, embed_kernel, n, 256, 0, out, table->data, table->dtype, ids, table->rows,
                                           (int)table->cols, 0, 0);
    SD_LAUNCHED(c, "embed_kernel");
}

void sd__cuda_embed_shard(sd_backend *be, float *out, const sd_weight *table, const int32_t *ids,
                          int n, int first)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    sd__launch(c, embed_kernel, n, 256, 0, out, table->data, table->dtype, ids, table->rows,
                                           (int)table->cols, first, 1);
    SD_LAUNCHED(c, "embed_kernel");
}

/* y(m) += x(m), float4 when both are 16-byte aligned */
__global__ void add_kernel(float *y, const float *x, size_t m)
{
    SD_PDL_ENTER(y, x, m);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += stride)
        y[i] += x[i];
}

__global__ void add4_kernel(float4 *y, const float4 *x, size_t m4)
{
    SD_PDL_ENTER(y, x, m4);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < m4; i += stride) {
        float4 a = y[i], b = x[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        y[i] = a;
    }
}

void sd__cuda_add(sd_backend *be, float *y, const float *x, int n, int d)
{
    sd__cuda *c = sd__cuda_op(be);
    size_t m = (size_t)n * (size_t)d;
    if (!c || m == 0)
        return;
    if (m % 4 == 0 && sd__aligned16(y) && sd__aligned16(x)) {
        sd__launch(c, add4_kernel, blocks_for(m / 4, 256), 256, 0, (float4 *)y, (const float4 *)x,
                                                                   m / 4);
        SD_LAUNCHED(c, "add4_kernel");
    } else {
        sd__launch(c, add_kernel, blocks_for(m, 256), 256, 0, y, x, m);
        SD_LAUNCHED(c, "add_kernel");
    }
}

/* out(n, I) (rows out_stride apart) = silu(gu[:, :I]) * gu[:, I:], gu (n, 2I) */
__global__ void silu_mul_kernel(float *out, const float *gu, int n, int I, int out_stride)
{
    SD_PDL_ENTER(out, gu, n, I, out_stride);
    size_t m = (size_t)n * (size_t)I, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += stride) {
        size_t t = e / (size_t)I, i = e % (size_t)I;
        const float *g = gu + t * 2 * (size_t)I;
        float gv = g[i];
        out[t * (size_t)out_stride + i] = gv / (1.0f + expf(-gv)) * g[(size_t)I + i];
    }
}

__global__ void copy_rows_kernel(float *dst, const float *src, const int32_t *idx, int n, int d,
                                 int ds, int ss)
{
    SD_PDL_ENTER(dst, src, idx, n, d, ds, ss);
    int i = blockIdx.x;
    size_t r = idx ? (size_t)idx[i] : (size_t)i;
    float *o = dst + (size_t)i * (size_t)ds;
    const float *s = src + r * (size_t)ss;
    for (int k = threadIdx.x; k < d; k += blockDim.x)
        o[k] = s[k];
}

/* The model calls silu_mul in place (out == gu, rows I apart over rows 2I
 * apart): row t's results land on the inputs of row t/2, which another block
 * may not have read yet. Such calls go through scratch in row chunks; a chunk
 * [a, b) writes [a*I, b*I), below the inputs of every later row (>= 2b*I).
 * One row in place is safe in one kernel (element i is written by the thread
 * that read it, and no thread reads another's: the up half starts at I), so
 * plain decode at batch 1 takes one launch, not two. */
void sd__cuda_silu_mul(sd_backend *be, float *out, const float *gu, int n, int I)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || I <= 0)
        return;
    const char *o0 = (const char *)out, *o1 = o0 + (size_t)n * (size_t)I * sizeof(float);
    const char *g0 = (const char *)gu, *g1 = g0 + (size_t)n * 2 * (size_t)I * sizeof(float);
    int overlap = o0 < g1 && g0 < o1;
    if (!overlap || (n == 1 && out == gu)) {
        sd__launch(c, silu_mul_kernel, blocks_for((size_t)n * I, 256), 256, 0, out, gu, n, I, I);
        SD_LAUNCHED(c, "silu_mul_kernel");
        return;
    }
    size_t per = c->scratch_bytes / ((size_t)I * sizeof(float));
    if (per == 0) {
        SD_BADARG(c, "silu_mul: I = %d does not fit the scratch", I);
        return;
    }
    float *tmp = (float *)c->scratch;
    for (int a = 0; a < n; a += (int)per) {
        int m = n - a < (int)per ? n - a : (int)per;
        sd__launch(c, silu_mul_kernel, blocks_for((size_t)m * I, 256), 256, 0, 
            tmp, gu + (size_t)a * 2 * (size_t)I, m, I, I);
        SD_LAUNCHED(c, "silu_mul_kernel");
        sd__launch(c, copy_rows_kernel, m, 256, 0, out + (size_t)a * (size_t)I, tmp, NULL, m, I, I,
                                                   I);
        SD_LAUNCHED(c, "copy_rows_kernel");
    }
}

void sd__cuda_gather_rows(sd_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                          int d, int ds, int ss)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0)
        return;
    sd__launch(c, copy_rows_kernel, n, 256, 0, dst, src, idx, n, d, ds, ss);
    SD_LAUNCHED(c, "copy_rows_kernel");
}

/* Small copies by one kernel instead of the copy engine (sd__cuda_stage):
 * between two graphs a copy-engine download cost ~9 us a step and each
 * upload or device copy 1-4 (bench/results/boundary-lab-*.json). The parts
 * run in order (a barrier between them: a later part may overwrite what an
 * earlier one wrote), 4-byte words, rows of width bytes at their pitches;
 * a part's source or destination may be page-locked host memory (the host
 * pointer is the device's under unified addressing). sys: the writes are
 * made visible to the host before the kernel ends. */
#define STAGE_BATCH 4 /* words a thread loads before it stores (a read of host memory is a PCIe round trip) */
template <bool LATE> /* dependents launched as it exits (c->step_inputs_early 2; common.cuh) */
__global__ void stage_kernel(const __grid_constant__ sd__stage_set s)
{
    if (LATE) {
        sd__ptouch(s);
        SD_PDL_POST();
    } else {
        SD_PDL_ENTER(s);
    }
    for (int p = 0; p < s.n; p++) {
        const sd_copy q = s.part[p];
        const unsigned words = (unsigned)q.width / 4, total = words * (unsigned)q.rows;
        const unsigned dpitch = (unsigned)q.dpitch, spitch = (unsigned)q.spitch;
        for (unsigned i0 = threadIdx.x; i0 < total; i0 += STAGE_BATCH * blockDim.x) {
            uint32_t v[STAGE_BATCH];
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; u++) {
                const unsigned i = i0 + u * blockDim.x;
                if (i < total)
                    v[u] = ((const uint32_t *)((const char *)q.src +
                                               (size_t)(i / words) * spitch))[i % words];
            }
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; u++) {
                const unsigned i = i0 + u * blockDim.x;
                if (i < total)
                    ((uint32_t *)((char *)q.dst + (size_t)(i / words) * dpitch))[i % words] = v[u];
            }
        }
        if (p + 1 < s.n)
            __syncthreads();
    }
    if (s.sys)
        __threadfence_system();
    else if (LATE)
        __threadfence(); /* its writes visible before its dependents start */
}

int sd__cuda_stage(sd__cuda *c, const sd__stage_set *s)
{
    for (int p = 0; p < s->n; p++) {
        const sd_copy *q = &s->part[p];
        if ((q->width | q->dpitch | q->spitch) % 4 || ((uintptr_t)q->dst | (uintptr_t)q->src) % 4 ||
            q->width * q->rows > UINT32_MAX || q->dpitch > UINT32_MAX || q->spitch > UINT32_MAX)
            return SD_BADARG(c, "stage: part %d is not in 4-byte words below 4 GB", p), c->err;
    }
    if (c->step_inputs_early == 2)
        sd__launch(c, stage_kernel<true>, 1, 256, 0, *s);
    else
        sd__launch(c, stage_kernel<false>, 1, 256, 0, *s);
    return SD_LAUNCHED(c, "stage_kernel") ? c->err : 0;
}

__global__ void gather_i32_kernel(int32_t *out, const int32_t *table, const int32_t *idx, int n)
{
    SD_PDL_ENTER(out, table, idx, n);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = table[idx[i]];
}

void sd__cuda_gather_i32(sd_backend *be, int32_t *out, const int32_t *table, const int32_t *idx,
                         int n)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    sd__launch(c, gather_i32_kernel, (n + 255) / 256, 256, 0, out, table, idx, n);
    SD_LAUNCHED(c, "gather_i32_kernel");
}

/* one block per row: the row zeroed, then the source columns placed */
__global__ void scatter_cols_kernel(float *dst, const float *src, const int32_t *map, int ws,
                                    int wd)
{
    SD_PDL_ENTER(dst, src, map, ws, wd);
    float *d = dst + (size_t)blockIdx.x * (size_t)wd;
    const float *s = src + (size_t)blockIdx.x * (size_t)ws;
    for (int c = threadIdx.x; c < wd; c += blockDim.x)
        d[c] = 0.0f;
    __syncthreads();
    for (int c = threadIdx.x; c < ws; c += blockDim.x)
        d[map[c]] = s[c];
}

void sd__cuda_scatter_cols(sd_backend *be, float *dst, const float *src, const int32_t *map, int n,
                           int ws, int wd)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0)
        return;
    sd__launch(c, scatter_cols_kernel, n, 256, 0, dst, src, map, ws, wd);
    SD_LAUNCHED(c, "scatter_cols_kernel");
}

void sd__cuda_copy2d(sd_backend *be, float *dst, const float *src, int n, int d, int ds, int ss)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || d <= 0)
        return;
    if (SD_CUDA(c, cudaMemcpy2DAsync(dst, (size_t)ds * sizeof(float), src,
                                     (size_t)ss * sizeof(float), (size_t)d * sizeof(float),
                                     (size_t)n, cudaMemcpyDeviceToDevice, c->stream)))
        return;
}

SD_KTRACE_EXPORT(elementwise)

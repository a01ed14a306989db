/* CUDA: argmax, sampling, greedy and sampled verification of whole batches
 * (kernels/cpu/sample.c is the reference; the math is src/verify/sampling.c's
 * and accept.c's, reproduced here step for step).
 *
 * sample_rows runs one block per row, in passes over the row:
 *   1. max logit (NaN skipped); greedy rows and rows without a finite top
 *      become one-hot at the argmax;
 *   2. w = expf((l - max) / T) into probs, z = sum w;
 *   3. top-k / top-p thresholds by the radix select of sampling.c: histograms
 *      (2048 bins: counts and fp64 masses, in shared memory) of the IEEE bits
 *      of w, three digit rounds, the bin scan done by one thread;
 *   4. keep key > t plus the first `ties` ids of key == t (a block scan of tie
 *      counts over contiguous per-thread chunks), normalize;
 *   5. inverse CDF: per-thread chunk sums (fp64), a block scan, and the thread
 *      whose chunk crosses u * total walks it.
 * accept_sample_rows computes the same distributions for every row of a
 * chain (pass 1), then walks sd_accept_chain per sequence (pass 2, below).
 * The uniforms are sd_rand_uniform's integer recipe, bit for bit. Sums run in
 * another order than on the CPU, so probabilities agree to rounding and the
 * token agrees unless u * total lies within rounding of a CDF boundary. */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "verify/sampling.h" /* the SD_RNG_* streams */
}

#define SB 512     /* threads per row block */
#define BINS 2048

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* sd_rand_uniform (src/verify/sampling.c) */
__device__ __forceinline__ double rand_uniform(uint64_t seed, uint64_t counter, uint32_t stream)
{
    const uint64_t g = 0x9e3779b97f4a7c15ull;
    uint64_t z = mix64(seed + g);
    z = mix64(z ^ (counter * 0xd1b54a32d192ed03ull + g));
    z = mix64(z ^ ((uint64_t)stream * 0x8cb92ba72f3d8dd7ull + g));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* (value, index) argmax pair: index < 0 is "none"; lowest index wins ties */
__device__ __forceinline__ void am_merge(float &bv, int &bi, float v, int i)
{
    if (i < 0)
        return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

/* The block's (value, index) pair from each thread's (bv, bi): warp
 * shuffles, then thread 0 merges the warps' pairs in order; thread 0's bv,
 * bi hold the result on return (the others' are partial). Blocks of up to
 * SB threads. */
__device__ __forceinline__ void block_am_reduce(float &bv, int &bi)
{
    __shared__ float sv[SB / 32];
    __shared__ int si[SB / 32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int oi = __shfl_down_sync(0xffffffffu, bi, o);
        am_merge(bv, bi, ov, oi);
    }
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.0f;
        int b = -1;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++)
            am_merge(v, b, sv[k], si[k]);
        bv = v;
        bi = b;
    }
}

/* sd_argmax of x (V): every thread of the block gets the result. */
__device__ int block_argmax(const float *x, int V)
{
    __shared__ int res;
    float bv = 0.0f;
    int bi = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (!isnan(v))
            am_merge(bv, bi, v, i);
    }
    block_am_reduce(bv, bi);
    if (threadIdx.x == 0)
        res = bi < 0 ? 0 : bi;
    __syncthreads();
    int r = res;
    __syncthreads();
    return r;
}

__global__ void argmax_rows_kernel(int32_t *out, const float *x, int V)
{
    SD_PDL_ENTER(out, x, V);
    int r = block_argmax(x + (size_t)blockIdx.x * (size_t)V, V);
    if (threadIdx.x == 0)
        out[blockIdx.x] = r;
}

/* The argmax of a long row split over P blocks (decode: one row of a
 * 100k+ vocabulary was one block's serial walk, ~65 us on an H200). Block
 * (r, b) takes elements [b AM_PER, (b + 1) AM_PER) of row r, AM_PER /
 * AM_THREADS independent loads a thread, and folds its (value, index) into
 * the row's key with atomicMax: the key orders by value, then by the lower
 * index (the same winner as sd_argmax: NaN skipped, lowest id on ties,
 * whatever the order blocks finish in). The block that counts last writes
 * the row's result and resets its key and count, so the next call (a graph
 * replay too) starts from zero. */
#define AM_THREADS 256
#define AM_PER 8192
__device__ __forceinline__ unsigned long long am_key(float v, int i)
{
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ordered as the floats */
    return ((unsigned long long)u << 32) | (unsigned long long)(~(uint32_t)i);
}

__global__ void __launch_bounds__(AM_THREADS)
    argmax_split_kernel(int32_t *out, const float *x, int V, unsigned long long *keys,
                        unsigned *cnt)
{
    SD_PDL_ENTER(out, x, V, keys, cnt);
    const int r = blockIdx.x, lo = blockIdx.y * AM_PER;
    const int hi = V - lo < AM_PER ? V : lo + AM_PER;
    const float *xr = x + (size_t)r * (size_t)V;
    float bv = 0.0f;
    int bi = -1;
#pragma unroll 8
    for (int i = lo + threadIdx.x; i < hi; i += AM_THREADS) {
        float v = xr[i];
        if (!isnan(v))
            am_merge(bv, bi, v, i);
    }
    block_am_reduce(bv, bi);
    if (threadIdx.x == 0) {
        if (bi >= 0)
            atomicMax(&keys[r], am_key(bv, bi));
        __threadfence();
        if (atomicAdd(&cnt[r], 1u) == gridDim.y - 1) {
            __threadfence();
            const unsigned long long k = atomicExch(&keys[r], 0ull);
            cnt[r] = 0;
            out[r] = k ? (int32_t)~(uint32_t)(k & 0xffffffffu) : 0; /* all NaN: 0 */
        }
    }
}

/* Block sums; every thread gets the result. */
__device__ double block_sum_d(double v)
{
    __shared__ double s[SB / 32];
    __shared__ double res;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        s[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++)
            t += s[k];
        res = t;
    }
    __syncthreads();
    double r = res;
    __syncthreads();
    return r;
}

__device__ float block_max_f(float v)
{
    __shared__ float s[SB / 32];
    __shared__ float res;
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0)
        s[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = -INFINITY;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++)
            t = fmaxf(t, s[k]);
        res = t;
    }
    __syncthreads();
    float r = res;
    __syncthreads();
    return r;
}

__constant__ int c_shift[3] = {21, 10, 0};
__constant__ uint32_t c_digit[3] = {0x7ff, 0x7ff, 0x3ff};

struct hist {
    uint32_t cnt[BINS];
    double mass[BINS];
};

/* sampling.c's sd__histogram: digit `round` of the tokens whose higher digits
 * equal prefix (under mask), survivors of the cut (cut_on) only. */
__device__ void histogram(hist *h, const float *w, int V, int round, uint32_t prefix, uint32_t mask,
                          int cut_on, uint32_t cut_t, int cut_ties)
{
    const int sh = c_shift[round];
    const uint32_t dm = c_digit[round];
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        h->cnt[b] = 0;
        h->mass[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float f = w[i];
        uint32_t key = __float_as_uint(f);
        if ((key & mask) != prefix)
            continue;
        if (cut_on && key <= cut_t)
            continue;
        uint32_t b = (key >> sh) & dm;
        atomicAdd(&h->cnt[b], 1u);
        atomicAdd(&h->mass[b], (double)f);
    }
    __syncthreads();
    if (threadIdx.x == 0 && cut_on && (cut_t & mask) == prefix) {
        uint32_t b = (cut_t >> sh) & dm;
        h->cnt[b] += (uint32_t)cut_ties;
        h->mass[b] += (double)cut_ties * (double)__uint_as_float(cut_t);
    }
    __syncthreads();
}

struct select_out {
    uint32_t t;
    int ties;     /* top-k: ties; top-p: tokens of key t among the survivors */
    double above; /* mass with key > t */
    double need;  /* top-p: mass still missing at key t */
};

/* sd__select_count: the k-th token of the order is the ties-th (by id) of key t. */
__device__ void select_count(hist *h, const float *w, int V, int k, select_out *so)
{
    __shared__ uint32_t s_prefix, s_mask, s_need;
    __shared__ double s_above;
    if (threadIdx.x == 0) {
        s_prefix = s_mask = 0;
        s_need = (uint32_t)k;
        s_above = 0;
    }
    __syncthreads();
    for (int r = 0; r < 3; r++) {
        histogram(h, w, V, r, s_prefix, s_mask, 0, 0, 0);
        if (threadIdx.x == 0) {
            int b = (int)c_digit[r];
            for (; b > 0; b--) {
                if (s_need <= h->cnt[b])
                    break;
                s_need -= h->cnt[b];
                s_above += h->mass[b];
            }
            s_prefix |= (uint32_t)b << c_shift[r];
            s_mask |= c_digit[r] << c_shift[r];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        so->t = s_prefix;
        so->ties = (int)s_need;
        so->above = s_above;
    }
    __syncthreads();
}

/* sd__select_mass over the survivors of the cut. */
__device__ void select_mass(hist *h, const float *w, int V, double frac, int cut_on,
                            uint32_t cut_t, int cut_ties, select_out *so)
{
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ double s_need, s_above;
    __shared__ int s_chosen;
    if (threadIdx.x == 0) {
        s_prefix = s_mask = 0;
        s_need = s_above = 0;
        s_chosen = 0;
    }
    __syncthreads();
    for (int r = 0; r < 3; r++) {
        histogram(h, w, V, r, s_prefix, s_mask, cut_on, cut_t, cut_ties);
        if (threadIdx.x == 0) {
            double need = s_need, above = s_above;
            if (r == 0) {
                double total = 0;
                for (int b = 0; b < BINS; b++)
                    total += h->mass[b];
                need = frac * total;
            }
            int lowest = -1, chosen = -1;
            for (int b = (int)c_digit[r]; b >= 0; b--) {
                if (h->cnt[b] == 0)
                    continue;
                if (h->mass[b] > 0)
                    lowest = b;
                if (h->mass[b] >= need) {
                    chosen = b;
                    break;
                }
                need -= h->mass[b];
                above += h->mass[b];
            }
            if (chosen < 0) {
                chosen = lowest < 0 ? 0 : lowest;
                need += h->mass[chosen];
                above -= h->mass[chosen];
            }
            s_prefix |= (uint32_t)chosen << c_shift[r];
            s_mask |= c_digit[r] << c_shift[r];
            s_need = need;
            s_above = above;
            s_chosen = chosen;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        so->t = s_prefix;
        so->ties = (int)h->cnt[s_chosen];
        so->need = s_need;
        so->above = s_above;
    }
    __syncthreads();
}

/* Exclusive block scan of one double per thread (thread 0 walks SB values). */
__device__ double block_excl_scan_d(double v, double *total)
{
    __shared__ double s[SB];
    __shared__ double tot;
    s[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double c = 0;
        for (int k = 0; k < (int)blockDim.x; k++) {
            double x = s[k];
            s[k] = c;
            c += x;
        }
        tot = c;
    }
    __syncthreads();
    double r = s[threadIdx.x];
    *total = tot;
    __syncthreads();
    return r;
}

__device__ int block_excl_scan_i(int v)
{
    __shared__ int s[SB];
    s[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int c = 0;
        for (int k = 0; k < (int)blockDim.x; k++) {
            int x = s[k];
            s[k] = c;
            c += x;
        }
    }
    __syncthreads();
    int r = s[threadIdx.x];
    __syncthreads();
    return r;
}

/* Inverse CDF of the weights w_i = p_i (RES false: sd_sample) or
 * w_i = p_i - q_i in double (RES true: accept.c's sd__sample_residual), over
 * the tokens with w_i > 0: the first token whose cumulative weight exceeds
 * u * total, the last such token if rounding never crosses, -1 when none has
 * w_i > 0. Every thread gets the result. */
template <bool RES> __device__ int block_sample_w(const float *p, const float *q, int V, double u)
{
    __shared__ int found, last_pos;
    const int per = (V + (int)blockDim.x - 1) / (int)blockDim.x;
    const int b = (int)threadIdx.x * per;
    const int e = min(V, b + per);
    double mine = 0;
    int my_last = -1;
    for (int i = b; i < e; i++) {
        double w = RES ? (double)p[i] - (double)q[i] : (double)p[i];
        if (w > 0) {
            mine += w;
            my_last = i;
        }
    }
    if (threadIdx.x == 0) {
        found = INT_MAX;
        last_pos = -1;
    }
    __syncthreads();
    double total;
    double excl = block_excl_scan_d(mine, &total);
    if (!(total > 0))
        return -1;
    const double target = u * total;
    if (my_last >= 0)
        atomicMax(&last_pos, my_last);
    /* the first chunk whose end passes target holds the token */
    if (my_last >= 0 && excl + mine > target && excl <= target) {
        double c = excl;
        int tok = my_last;
        for (int i = b; i < e; i++) {
            double w = RES ? (double)p[i] - (double)q[i] : (double)p[i];
            if (w > 0) {
                c += w;
                if (c > target) {
                    tok = i;
                    break;
                }
            }
        }
        atomicMin(&found, tok);
    }
    __syncthreads();
    int r = found != INT_MAX ? found : last_pos;
    __syncthreads();
    return r;
}

/* sd_sample of probs (V) with uniform u; the argmax when nothing is positive. */
__device__ int block_sample(const float *probs, int V, double u)
{
    int r = block_sample_w<false>(probs, nullptr, V, u);
    return r >= 0 ? r : block_argmax(probs, V);
}

/* accept.c's sd__sample_residual: a sample of normalize(max(0, p - q)), of p
 * itself when that residual is all zero (p == q up to rounding). */
__device__ int block_sample_residual(const float *p, const float *q, int V, double u)
{
    int r = block_sample_w<true>(p, q, V, u);
    return r >= 0 ? r : block_sample(p, V, u);
}

/* probs (V) = sd_sampling_probs(logits (V), p) by the whole block. Returns
 * the token of a one-hot row (greedy, or no logit above -inf), else -1; the
 * row is written and visible to the whole block on return. h, so: the
 * caller's shared memory. */
__device__ int row_probs(float *probs, const float *logits, int V, const sd_sample_params &p,
                         hist *h, select_out *so)
{
    const float temp = p.temperature;
    /* sd_sampling_is_greedy */
    const int greedy = !(temp > 0.0f) || !(1.0f / temp < INFINITY);
    float m = -INFINITY;
    if (!greedy) {
        float lm = -INFINITY;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            lm = fmaxf(lm, logits[i]); /* fmaxf drops NaN, as `l > m` does */
        m = block_max_f(lm);
    }
    if (greedy || m == -INFINITY) {
        int a = block_argmax(logits, V);
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            probs[i] = i == a ? 1.0f : 0.0f;
        __syncthreads();
        return a;
    }
    float top_p = p.top_p;
    int top_k = p.top_k;
    if (isnan(top_p))
        top_p = 1.0f;
    if (!(top_p > 0.0f)) {
        top_k = 1;
        top_p = 1.0f;
    }
    const int use_k = top_k > 0 && top_k < V;
    const int use_p = top_p < 1.0f;
    const float inv_t = 1.0f / temp;

    double z = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float l = logits[i], w;
        if (m == INFINITY)
            w = l == INFINITY ? 1.0f : 0.0f;
        else
            w = isnan(l) ? 0.0f : expf((l - m) * inv_t);
        probs[i] = w;
        z += w;
    }
    z = block_sum_d(z);
    __syncthreads(); /* probs (w) visible to the whole block */

    if (!use_k && !use_p) {
        const double inv = 1.0 / z;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            probs[i] = (float)(probs[i] * inv);
    } else {
        uint32_t t = 0;
        int ties = 0;
        double above = 0;
        int cut_on = 0;
        if (use_k) {
            select_count(h, probs, V, top_k, so);
            t = so->t;
            ties = so->ties;
            above = so->above;
            cut_on = 1;
        }
        if (use_p) {
            select_mass(h, probs, V, (double)top_p, cut_on, t, ties, so);
            t = so->t;
            above = so->above;
            double n_ties = ceil(so->need / (double)__uint_as_float(t));
            ties = n_ties < 1 ? 1 : n_ties > so->ties ? so->ties : (int)n_ties;
        }
        const double inv = 1.0 / (above + (double)ties * (double)__uint_as_float(t));
        /* keep key > t and the first `ties` ids of key == t: per-thread
         * contiguous chunks so the tie rank is a block scan */
        const int per = (V + (int)blockDim.x - 1) / (int)blockDim.x;
        const int b = (int)threadIdx.x * per;
        const int e = min(V, b + per);
        int my_ties = 0;
        for (int i = b; i < e; i++)
            my_ties += __float_as_uint(probs[i]) == t;
        int taken = block_excl_scan_i(my_ties);
        for (int i = b; i < e; i++) {
            uint32_t key = __float_as_uint(probs[i]);
            if (key > t || (key == t && taken++ < ties))
                probs[i] = (float)(probs[i] * inv);
            else
                probs[i] = 0.0f;
        }
    }
    __syncthreads();
    return -1;
}

__global__ void sample_rows_kernel(int32_t *out, float *probs_all, const float *logits_all,
                                   const sd_sample_params *params, int V)
{
    SD_PDL_ENTER(out, probs_all, logits_all, params, V);
    __shared__ hist h;
    __shared__ select_out so;
    const int row = blockIdx.x;
    const float *logits = logits_all + (size_t)row * (size_t)V;
    float *probs = probs_all + (size_t)row * (size_t)V;
    const sd_sample_params p = params[row];
    const double u = rand_uniform(p.seed, p.counter, p.stream);
    int tok = row_probs(probs, logits, V, p, &h, &so);
    if (tok < 0)
        tok = block_sample(probs, V, u);
    if (threadIdx.x == 0)
        out[row] = tok;
}

__global__ void accept_greedy_rows_kernel(int32_t *n_acc, int32_t *out_tok, const int32_t *draft,
                                          const int32_t *am, int n_seq, int k)
{
    SD_PDL_ENTER(n_acc, out_tok, draft, am, n_seq, k);
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_seq)
        return;
    const int32_t *d = draft + (size_t)s * (size_t)k;
    const int32_t *a = am + (size_t)s * (size_t)(k + 1);
    int32_t *o = out_tok + (size_t)s * (size_t)(k + 1);
    int i = 0;
    for (; i < k && d[i] == a[i]; i++)
        o[i] = d[i];
    o[i] = a[i];
    n_acc[s] = i;
}

/* ---- accept_sample_rows ------------------------------------------------------
 * Pass 1 (accept_probs_kernel): one block per row i of sequence s
 * (blockIdx.x = s * (k + 1) + i), the target distribution into probs, rows
 * past the sequence's kd idle. Pass 2 (accept_chain_kernel): one block per
 * sequence walks accept.c's sd_accept_chain over those rows, each step a
 * block-wide argmax or inverse-CDF sample, the uniforms of the same streams
 * and counters. */

/* drafts of sequence s, or -1 when n_draft[s] is outside 0..k */
__device__ __forceinline__ int accept_kd(const int32_t *n_draft, int s, int k)
{
    int kd = n_draft ? n_draft[s] : k;
    return kd >= 0 && kd <= k ? kd : -1;
}

__device__ __forceinline__ size_t accept_row0(const int32_t *row0, int s, int k)
{
    return row0 ? (size_t)row0[s] : (size_t)s * (size_t)(k + 1);
}

__global__ void accept_probs_kernel(float *probs_all, const float *logits_all,
                                    const int32_t *row0, const int32_t *n_draft,
                                    const sd_sample_params *params, int k, int V)
{
    SD_PDL_ENTER(probs_all, logits_all, row0, n_draft, params, k, V);
    __shared__ hist h;
    __shared__ select_out so;
    const int s = blockIdx.x / (k + 1), i = blockIdx.x % (k + 1);
    if (i > accept_kd(n_draft, s, k)) /* also every row of a bad kd (-1) */
        return;
    const size_t r = accept_row0(row0, s, k) + (size_t)i;
    const sd_sample_params p = params[s];
    row_probs(probs_all + r * (size_t)V, logits_all + r * (size_t)V, V, p, &h, &so);
}

__global__ void accept_chain_kernel(int32_t *n_acc, int32_t *out_tok, const float *probs_all,
                                    const float *q, const int32_t *draft, const int32_t *row0,
                                    const int32_t *n_draft, const sd_sample_params *params, int k,
                                    int V)
{
    SD_PDL_ENTER(n_acc, out_tok, probs_all, q, draft, row0, n_draft, params, k, V);
    __shared__ int bad;
    const int s = blockIdx.x;
    const int kd = accept_kd(n_draft, s, k);
    if (kd < 0) {
        if (threadIdx.x == 0)
            n_acc[s] = SD_EINVAL;
        return;
    }
    const int32_t *d = k ? draft + (size_t)s * (size_t)k : draft; /* draft may be NULL if k == 0 */
    if (threadIdx.x == 0)
        bad = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < kd; i += blockDim.x)
        if (d[i] < 0 || d[i] >= V)
            bad = 1;
    __syncthreads();
    if (bad) { /* sd_accept_chain's refusal: no tokens */
        if (threadIdx.x == 0)
            n_acc[s] = SD_EINVAL;
        return;
    }
    const sd_sample_params p = params[s];
    const int greedy = !(p.temperature > 0.0f) || !(1.0f / p.temperature < INFINITY);
    const float *pr = probs_all + accept_row0(row0, s, k) * (size_t)V;
    int32_t *o = out_tok + (size_t)s * (size_t)(k + 1);
    /* every value below is the same in all threads, so the block stays in step */
    int n = kd;
    for (int i = 0; i < kd; i++) {
        const float *pi = pr + (size_t)i * (size_t)V;
        const int32_t di = d[i];
        const uint64_t ctr = p.counter + (uint64_t)i;
        int tok, acc;
        if (greedy) {
            tok = block_argmax(pi, V);
            acc = tok == di;
        } else if (!q) { /* one-hot q: sample the target and compare */
            tok = block_sample(pi, V, rand_uniform(p.seed, ctr, SD_RNG_TARGET));
            acc = tok == di;
        } else {
            const float *qi = q + ((size_t)s * (size_t)k + (size_t)i) * (size_t)V;
            const double u = rand_uniform(p.seed, ctr, SD_RNG_ACCEPT);
            acc = u * (double)qi[di] < (double)pi[di];
            tok = acc ? di
                      : block_sample_residual(pi, qi, V,
                                              rand_uniform(p.seed, ctr, SD_RNG_RESIDUAL));
        }
        if (threadIdx.x == 0)
            o[i] = tok;
        if (!acc) {
            n = i;
            break;
        }
    }
    if (n == kd) { /* all accepted: the bonus token from row kd */
        const float *pk = pr + (size_t)kd * (size_t)V;
        int tok = greedy ? block_argmax(pk, V)
                         : block_sample(pk, V,
                                        rand_uniform(p.seed, p.counter + (uint64_t)kd,
                                                     SD_RNG_TARGET));
        if (threadIdx.x == 0)
            o[kd] = tok;
    }
    if (threadIdx.x == 0)
        n_acc[s] = n;
}

void sd__cuda_argmax_rows(sd_backend *be, int32_t *out, const float *x, int n, int V)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || V <= 0)
        return;
    const int P = (V + AM_PER - 1) / AM_PER;
    if (P > 1 && n <= SD__ARGMAX_ROWS && c->am_keys) {
        sd__launch(c, argmax_split_kernel, dim3((unsigned)n, (unsigned)P), AM_THREADS, 0, out, x,
                   V, c->am_keys, c->am_cnt);
        SD_LAUNCHED(c, "argmax_split_kernel");
        return;
    }
    sd__launch(c, argmax_rows_kernel, n, SB, 0, out, x, V);
    SD_LAUNCHED(c, "argmax_rows_kernel");
}

void sd__cuda_sample_rows(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                          const sd_sample_params *p, int n, int V)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n <= 0 || V <= 0)
        return;
    sd__launch(c, sample_rows_kernel, n, SB, 0, out, probs_scratch, logits, p, V);
    SD_LAUNCHED(c, "sample_rows_kernel");
}

void sd__cuda_accept_greedy_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                 const int32_t *draft, const int32_t *target_argmax, int n_seq,
                                 int k)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n_seq <= 0)
        return;
    if (k < 0) {
        SD_BADARG(c, "accept_greedy_rows: draft length %d < 0", k);
        return;
    }
    sd__launch(c, accept_greedy_rows_kernel, (n_seq + 127) / 128, 128, 0, 
        n_acc, out_tok, draft, target_argmax, n_seq, k);
    SD_LAUNCHED(c, "accept_greedy_rows_kernel");
}

void sd__cuda_accept_sample_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                 float *probs_scratch, const float *logits, const int32_t *row0,
                                 const float *q, const int32_t *draft, const int32_t *n_draft,
                                 const sd_sample_params *p, int n_seq, int k, int V)
{
    sd__cuda *c = sd__cuda_op(be);
    if (!c || n_seq <= 0)
        return;
    if (k < 0 || V <= 0) {
        SD_BADARG(c, "accept_sample_rows: draft length %d < 0 or vocabulary %d <= 0", k, V);
        return;
    }
    sd__launch(c, accept_probs_kernel, n_seq * (k + 1), SB, 0, probs_scratch, logits, row0,
                                                                n_draft, p, k, V);
    SD_LAUNCHED(c, "accept_probs_kernel");
    sd__launch(c, accept_chain_kernel, n_seq, SB, 0, n_acc, out_tok, probs_scratch, q, draft, row0,
                                                     n_draft, p, k, V);
    SD_LAUNCHED(c, "accept_chain_kernel");
}

SD_KTRACE_EXPORT(sample)

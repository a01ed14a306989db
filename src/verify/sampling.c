#include "verify/sampling.h"

#include <math.h>
#include <string.h>

/* ---- top-k / top-p by radix select --------------------------------------------
 *
 * The unnormalized probabilities w = exp((logit - max) / T) lie in [0, 1], so
 * their IEEE-754 bit patterns (as uint32) sort exactly like the values. A
 * threshold "keep every token whose key is > t, plus the first `ties` tokens
 * (by id) whose key is == t" describes any prefix of the order (probability
 * descending, id ascending). The threshold is found digit by digit, high bits
 * first, from histograms of counts (top-k) or of masses (top-p): three passes of
 * 11 + 11 + 10 bits, O(vocab) each, with no sort, no index array and no heap
 * memory. The first histogram is built in the same pass that computes w. */

#define SD__BINS 2048

static const int sd__shift[3] = {21, 10, 0};
static const uint32_t sd__digit[3] = {0x7ff, 0x7ff, 0x3ff};

typedef struct sd__hist {
    uint32_t cnt[SD__BINS]; /* tokens per digit value */
    double mass[SD__BINS];  /* sum of their w */
} sd__hist;

/* The survivors of top-k, as seen by the top-p select: key > t, plus `ties`
 * tokens of key == t (all of the same value, so their ids do not matter here). */
typedef struct sd__cut {
    int on;
    uint32_t t;
    int ties;
} sd__cut;

static inline uint32_t sd__key(float w)
{
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return u;
}

static inline float sd__val(uint32_t u)
{
    float w;
    memcpy(&w, &u, sizeof w);
    return w;
}

/* Histogram of digit `round` over the tokens whose higher digits equal prefix
 * (under mask), restricted to the survivors of cut when cut->on. */
static void sd__histogram(const float *w, int n, int round, uint32_t prefix, uint32_t mask,
                          const sd__cut *cut, sd__hist *h)
{
    const int sh = sd__shift[round];
    const uint32_t dm = sd__digit[round];
    memset(h, 0, sizeof *h);
    for (int i = 0; i < n; i++) {
        uint32_t key = sd__key(w[i]);
        if ((key & mask) != prefix)
            continue;
        if (cut->on && key <= cut->t)
            continue;
        uint32_t b = (key >> sh) & dm;
        h->cnt[b]++;
        h->mass[b] += w[i];
    }
    if (cut->on && (cut->t & mask) == prefix) {
        uint32_t b = (cut->t >> sh) & dm;
        h->cnt[b] += (uint32_t)cut->ties;
        h->mass[b] += (double)cut->ties * sd__val(cut->t);
    }
}

/* Top-k threshold: the k-th token of the order is the `*ties`-th token (by id)
 * of key *t; *above is the mass of the tokens with key > *t. h holds the
 * round-0 histogram on entry (it is overwritten). Requires 0 < k < n. */
static void sd__select_count(const float *w, int n, int k, sd__hist *h, uint32_t *t, int *ties,
                             double *above)
{
    static const sd__cut nocut = {0, 0, 0};
    uint32_t prefix = 0, mask = 0;
    uint32_t need = (uint32_t)k;
    double mass_above = 0;
    for (int r = 0; r < 3; r++) {
        if (r > 0)
            sd__histogram(w, n, r, prefix, mask, &nocut, h);
        int b = (int)sd__digit[r];
        /* The group holds >= need tokens, so the scan stops at a bin. */
        for (; b > 0; b--) {
            if (need <= h->cnt[b])
                break;
            need -= h->cnt[b];
            mass_above += h->mass[b];
        }
        prefix |= (uint32_t)b << sd__shift[r];
        mask |= sd__digit[r] << sd__shift[r];
    }
    *t = prefix;
    *ties = (int)need;
    *above = mass_above;
}

/* Top-p threshold over the survivors of cut: walking the order, the first token
 * where the mass reaches frac * (survivors' mass) has key *t; *above is the mass
 * with key > *t, *need the mass still missing there, *avail the survivors of key
 * *t. h holds the round-0 histogram when h_ready. */
static void sd__select_mass(const float *w, int n, double frac, const sd__cut *cut, sd__hist *h,
                            int h_ready, uint32_t *t, int *avail, double *need_out, double *above)
{
    uint32_t prefix = 0, mask = 0;
    double need = 0, mass_above = 0;
    int chosen = 0;
    for (int r = 0; r < 3; r++) {
        if (r > 0 || !h_ready)
            sd__histogram(w, n, r, prefix, mask, cut, h);
        if (r == 0) {
            double total = 0;
            for (int b = 0; b < SD__BINS; b++)
                total += h->mass[b];
            need = frac * total; /* > 0: the top token has w = 1 */
        }
        int lowest = -1;
        chosen = -1;
        for (int b = (int)sd__digit[r]; b >= 0; b--) {
            if (h->cnt[b] == 0)
                continue;
            if (h->mass[b] > 0)
                lowest = b;
            if (h->mass[b] >= need) {
                chosen = b;
                break;
            }
            need -= h->mass[b];
            mass_above += h->mass[b];
        }
        if (chosen < 0) {
            /* Rounding left the group a hair short of need: keep all of it,
             * down to its smallest positive token. */
            chosen = lowest < 0 ? 0 : lowest;
            need += h->mass[chosen];
            mass_above -= h->mass[chosen];
        }
        prefix |= (uint32_t)chosen << sd__shift[r];
        mask |= sd__digit[r] << sd__shift[r];
    }
    *t = prefix;
    *avail = (int)h->cnt[chosen];
    *need_out = need;
    *above = mass_above;
}

/* ---- small vocabularies: sort ------------------------------------------------
 *
 * Below SD__SMALL tokens, clearing three 24 KiB histograms costs more than
 * sorting: heapsort (O(n log n), in place) of 64-bit keys (w bits << 32 |
 * ~id), so descending key order is probability descending, id ascending. */

#define SD__SMALL 256

static void sd__sift_down(uint64_t *a, int root, int n)
{
    for (;;) {
        int c = 2 * root + 1;
        if (c >= n)
            return;
        if (c + 1 < n && a[c + 1] < a[c])
            c++;
        if (a[root] <= a[c])
            return;
        uint64_t tmp = a[root];
        a[root] = a[c];
        a[c] = tmp;
        root = c;
    }
}

/* Sorts a[0..n) descending (min-heap, smallest moved to the end). */
static void sd__heapsort_desc(uint64_t *a, int n)
{
    for (int i = n / 2 - 1; i >= 0; i--)
        sd__sift_down(a, i, n);
    for (int end = n - 1; end > 0; end--) {
        uint64_t tmp = a[0];
        a[0] = a[end];
        a[end] = tmp;
        sd__sift_down(a, 0, end);
    }
}

/* w (n,) unnormalized, n <= SD__SMALL: keep the first k of the order, then the
 * shortest prefix of those with mass >= top_p of theirs; normalize. */
static void sd__truncate_small(float *w, int n, int k, float top_p)
{
    uint64_t key[SD__SMALL];
    for (int i = 0; i < n; i++)
        key[i] = (uint64_t)sd__key(w[i]) << 32 | (uint32_t) ~(uint32_t)i;
    sd__heapsort_desc(key, n);
#define SD__ID(j) ((int)~(uint32_t)key[j])
    int kept = k;
    if (top_p < 1.0f) {
        double wk = 0, c = 0;
        for (int j = 0; j < k; j++)
            wk += w[SD__ID(j)];
        const double target = (double)top_p * wk;
        int j = 0;
        while (j < k) {
            c += w[SD__ID(j)];
            j++;
            if (c >= target)
                break;
        }
        kept = j;
    }
    double total = 0;
    for (int j = 0; j < kept; j++)
        total += w[SD__ID(j)];
    for (int j = kept; j < n; j++)
        w[SD__ID(j)] = 0.0f;
#undef SD__ID
    const double inv = 1.0 / total;
    for (int i = 0; i < n; i++)
        w[i] = (float)(w[i] * inv);
}

static void sd__one_hot(float *probs, int vocab, int32_t hot)
{
    memset(probs, 0, (size_t)vocab * sizeof *probs);
    probs[hot] = 1.0f;
}

void sd_sampling_probs(const float *logits, int vocab, const sd_sampling *s, float *probs)
{
    if (vocab <= 0)
        return;
    float temp = s ? s->temperature : 1.0f;
    float top_p = s ? s->top_p : 1.0f;
    int top_k = s ? s->top_k : 0;
    if (sd_sampling_is_greedy(s)) {
        sd__one_hot(probs, vocab, sd_argmax(logits, vocab));
        return;
    }
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > m)
            m = logits[i];
    if (m == -INFINITY) {
        sd__one_hot(probs, vocab, sd_argmax(logits, vocab));
        return;
    }
    if (isnan(top_p))
        top_p = 1.0f;
    if (!(top_p > 0.0f)) { /* the smallest non-empty set: the top token */
        top_k = 1;
        top_p = 1.0f;
    }
    const int use_k = top_k > 0 && top_k < vocab;
    const int use_p = top_p < 1.0f;
    const float inv_t = 1.0f / temp;

    const int radix = (use_k || use_p) && vocab > SD__SMALL;

    sd__hist h;
    double z = 0;
    if (radix)
        memset(&h, 0, sizeof h);
    for (int i = 0; i < vocab; i++) {
        float l = logits[i], w;
        if (m == INFINITY)
            w = l == INFINITY ? 1.0f : 0.0f;
        else
            w = isnan(l) ? 0.0f : expf((l - m) * inv_t);
        probs[i] = w;
        z += w;
        if (radix) {
            uint32_t b = sd__key(w) >> sd__shift[0];
            h.cnt[b]++;
            h.mass[b] += w;
        }
    }
    if (!use_k && !use_p) {
        double inv = 1.0 / z;
        for (int i = 0; i < vocab; i++)
            probs[i] = (float)(probs[i] * inv);
        return;
    }
    if (!radix) {
        sd__truncate_small(probs, vocab, use_k ? top_k : vocab, use_p ? top_p : 1.0f);
        return;
    }

    uint32_t t = 0;
    int ties = 0;
    double above = 0;
    sd__cut cut = {0, 0, 0};
    if (use_k) {
        sd__select_count(probs, vocab, top_k, &h, &t, &ties, &above);
        cut.on = 1;
        cut.t = t;
        cut.ties = ties;
    }
    if (use_p) {
        int avail;
        double need;
        sd__select_mass(probs, vocab, (double)top_p, &cut, &h, !use_k, &t, &avail, &need, &above);
        double n_ties = ceil(need / (double)sd__val(t));
        ties = n_ties < 1 ? 1 : n_ties > avail ? avail : (int)n_ties;
    }
    /* Keep key > t and the first `ties` ids of key == t; normalize by their mass. */
    const double inv = 1.0 / (above + (double)ties * sd__val(t));
    int taken = 0;
    for (int i = 0; i < vocab; i++) {
        uint32_t key = sd__key(probs[i]);
        if (key > t || (key == t && taken++ < ties))
            probs[i] = (float)(probs[i] * inv);
        else
            probs[i] = 0.0f;
    }
}

/* ---- counter-based RNG ---------------------------------------------------------
 *
 * z = mix(seed + G); z = mix(z ^ (counter * C1 + G)); z = mix(z ^ (stream * C2 + G));
 * u = (z >> 11) * 2^-53, with mix = splitmix64's finalizer. Each step is a
 * bijection, so for one (seed, stream) distinct counters never collide. */

static inline uint64_t sd__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sd_rand_uniform(uint64_t seed, uint64_t counter, uint32_t stream)
{
    const uint64_t g = 0x9e3779b97f4a7c15ull;
    uint64_t z = sd__mix64(seed + g);
    z = sd__mix64(z ^ (counter * 0xd1b54a32d192ed03ull + g));
    z = sd__mix64(z ^ ((uint64_t)stream * 0x8cb92ba72f3d8dd7ull + g));
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- sampling ------------------------------------------------------------------ */

int32_t sd_sample(const float *probs, int vocab, double u)
{
    double total = 0;
    for (int i = 0; i < vocab; i++)
        if (probs[i] > 0.0f)
            total += probs[i];
    if (!(total > 0))
        return sd_argmax(probs, vocab);
    /* Same additions in the same order as above: the running sum ends at total
     * exactly, and target < total, so the walk stops inside the loop except when
     * u * total rounds up to total. */
    const double target = u * total;
    double c = 0;
    int32_t last = 0;
    for (int i = 0; i < vocab; i++) {
        if (probs[i] > 0.0f) {
            c += probs[i];
            last = i;
            if (c > target)
                return i;
        }
    }
    return last;
}

int32_t sd_argmax(const float *x, int n)
{
    int32_t best = -1;
    float bv = 0;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        if (isnan(v))
            continue;
        if (best < 0 || v > bv) {
            best = i;
            bv = v;
        }
    }
    return best < 0 ? 0 : best;
}

static inline float logit_or_ninf(const float *x, int i) { return isnan(x[i]) ? -INFINITY : x[i]; }

int sd_logprobs_row(const float *logits, int vocab, int32_t tok, int top, float *lp,
                    int32_t *top_ids, float *top_lps)
{
    /* log-sum-exp in double, over the max */
    double mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0;
    if (mx > -INFINITY)
        for (int i = 0; i < vocab; i++)
            if (logits[i] > -INFINITY)
                sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum > 0 ? sum : 1);
    const float x = tok >= 0 && tok < vocab ? logits[tok] : NAN;
    *lp = isnan(x) || !(mx > -INFINITY) ? -INFINITY : (float)((double)x - lse);
    /* the top: insertion into a sorted list of at most `top` (ties: the
     * lower id, met first, stays ahead) */
    int n = 0;
    for (int i = 0; i < vocab && top > 0; i++) {
        const float v = logit_or_ninf(logits, i);
        if (n == top && !(v > logit_or_ninf(logits, top_ids[n - 1])))
            continue;
        int j = n < top ? n++ : n - 1;
        for (; j > 0 && v > logit_or_ninf(logits, top_ids[j - 1]); j--)
            top_ids[j] = top_ids[j - 1];
        top_ids[j] = i;
    }
    for (int j = 0; j < n; j++) {
        float v = logits[top_ids[j]];
        top_lps[j] = isnan(v) || !(mx > -INFINITY) ? -INFINITY : (float)((double)v - lse);
    }
    return n;
}

void sd_logits_process(float *logits, int vocab, const int32_t *bias_ids, const float *bias,
                       int n_bias, float presence, float frequency, const int32_t *counts)
{
    for (int i = 0; i < n_bias; i++)
        if (bias_ids[i] >= 0 && bias_ids[i] < vocab)
            logits[bias_ids[i]] += bias[i];
    if (!counts || (presence == 0 && frequency == 0))
        return;
    for (int t = 0; t < vocab; t++)
        if (counts[t] > 0)
            logits[t] -= presence + frequency * (float)counts[t];
}

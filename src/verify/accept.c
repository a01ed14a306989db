#include "verify/accept.h"

#include <stddef.h>

/* Inverse-CDF sample of normalize(max(0, p - q)) without materializing it
 * (p, q: (vocab,)). The residual is all zero only when q >= p everywhere, i.e.
 * p == q up to rounding; then p itself is the right distribution. */
static int32_t sd__sample_residual(const float *p, const float *q, int vocab, double u)
{
    double total = 0;
    for (int i = 0; i < vocab; i++) {
        double r = (double)p[i] - (double)q[i];
        if (r > 0)
            total += r;
    }
    if (!(total > 0))
        return sd_sample(p, vocab, u);
    const double target = u * total;
    double c = 0;
    int32_t last = 0;
    for (int i = 0; i < vocab; i++) {
        double r = (double)p[i] - (double)q[i];
        if (r > 0) {
            c += r;
            last = i;
            if (c > target)
                return i;
        }
    }
    return last;
}

int sd_accept_greedy(int k, const int32_t *draft, const int32_t *target_argmax, int32_t *out)
{
    int i = 0;
    for (; i < k && draft[i] == target_argmax[i]; i++)
        out[i] = draft[i];
    out[i] = target_argmax[i];
    return i;
}

int sd_accept_chain(const sd_sampling *s, int vocab, int k, const int32_t *draft, const float *p,
                    const float *q, uint64_t pos, int32_t *out, sd_err *err)
{
    if (!s)
        return sd_err_set(err, SD_EINVAL, "accept: no sampling parameters");
    if (vocab <= 0)
        return sd_err_set(err, SD_EINVAL, "accept: vocab %d <= 0", vocab);
    if (k < 0)
        return sd_err_set(err, SD_EINVAL, "accept: draft length %d < 0", k);
    for (int i = 0; i < k; i++)
        if (draft[i] < 0 || draft[i] >= vocab)
            return sd_err_set(err, SD_EINVAL,
                              "accept: draft token %d at chain index %d is outside the vocabulary "
                              "(%d tokens)",
                              (int)draft[i], i, vocab);
    const size_t v = (size_t)vocab;

    if (sd_sampling_is_greedy(s)) {
        for (int i = 0; i < k; i++) {
            int32_t a = sd_argmax(p + (size_t)i * v, vocab);
            out[i] = a;
            if (a != draft[i])
                return i;
        }
        out[k] = sd_argmax(p + (size_t)k * v, vocab);
        return k;
    }

    for (int i = 0; i < k; i++) {
        const float *pi = p + (size_t)i * v;
        const int32_t d = draft[i];
        if (!q) {
            /* One-hot q: sample the target and compare (see accept.h). */
            int32_t x =
                sd_sample(pi, vocab, sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_TARGET));
            out[i] = x;
            if (x != d)
                return i;
            continue;
        }
        const float *qi = q + (size_t)i * v;
        /* u < p/q without dividing: q(d) == 0 (a draft its own distribution
         * calls impossible) is accepted iff p(d) > 0. */
        double u = sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_ACCEPT);
        if (u * (double)qi[d] < (double)pi[d]) {
            out[i] = d;
            continue;
        }
        out[i] = sd__sample_residual(pi, qi, vocab,
                                     sd_rand_uniform(s->seed, pos + (uint64_t)i, SD_RNG_RESIDUAL));
        return i;
    }
    out[k] = sd_sample(p + (size_t)k * v, vocab,
                       sd_rand_uniform(s->seed, pos + (uint64_t)k, SD_RNG_TARGET));
    return k;
}

/* ---- statistics ---------------------------------------------------------------- */

void sd_accept_stats_add(sd_accept_stats *st, int k, int n)
{
    if (k < 0)
        k = 0;
    if (n < 0)
        n = 0;
    if (n > k)
        n = k;
    st->steps++;
    st->drafted += (uint64_t)k;
    st->accepted += (uint64_t)n;
    st->emitted += (uint64_t)n + 1;
    for (int i = 0; i < k && i < SD_ACCEPT_POSITIONS; i++) {
        st->proposed_at[i]++;
        if (i < n)
            st->accepted_at[i]++;
    }
}

void sd_accept_stats_merge(sd_accept_stats *dst, const sd_accept_stats *src)
{
    dst->steps += src->steps;
    dst->drafted += src->drafted;
    dst->accepted += src->accepted;
    dst->emitted += src->emitted;
    for (int i = 0; i < SD_ACCEPT_POSITIONS; i++) {
        dst->proposed_at[i] += src->proposed_at[i];
        dst->accepted_at[i] += src->accepted_at[i];
    }
}

double sd_accept_stats_mean_len(const sd_accept_stats *st)
{
    return st->steps ? (double)st->emitted / (double)st->steps : 0.0;
}

double sd_accept_stats_rate_at(const sd_accept_stats *st, int i)
{
    if (i < 0 || i >= SD_ACCEPT_POSITIONS || !st->proposed_at[i])
        return 0.0;
    return (double)st->accepted_at[i] / (double)st->proposed_at[i];
}

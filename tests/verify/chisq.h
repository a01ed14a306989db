/* tests/verify/chisq.h: chi-square tests for the sampling and acceptance tests.
 *
 * sd_chisq_sf(x, df): P(X >= x) for X ~ chi-square(df), through the regularized
 * upper incomplete gamma function Q(df/2, x/2) (series below a + 1, Lentz's
 * continued fraction above). Goodness of fit against known probabilities and
 * a two-sample homogeneity test, both merging sparse cells (expected < 5)
 * into one pooled cell. */
#ifndef SD_TESTS_VERIFY_CHISQ_H
#define SD_TESTS_VERIFY_CHISQ_H

#include <math.h>
#include <stdint.h>

static inline double sd_gamma_q(double a, double x)
{
    if (!(x > 0))
        return 1.0;
    const double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        /* P(a, x) = lead * sum_n x^n / (a (a+1) ... (a+n)) */
        double term = 1.0 / a, sum = term, ap = a;
        for (int n = 0; n < 10000; n++) {
            ap += 1;
            term *= x / ap;
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-16)
                break;
        }
        double q = 1.0 - lead * sum;
        return q < 0 ? 0 : q;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny)
            d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny)
            c = tiny;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16)
            break;
    }
    return lead * h;
}

static inline double sd_chisq_sf(double x, int df)
{
    if (df <= 0)
        return 1.0;
    return sd_gamma_q(0.5 * df, 0.5 * x);
}

/* Goodness of fit of counts obs (n_cells,) to probabilities prob (n_cells,).
 * Cells with expected count < 5 are pooled; a pool still under 5 joins the
 * smallest remaining cell. An observation in a cell of probability 0 gives
 * p = 0. Returns the p-value; *df_out (if set) gets the degrees of freedom. */
static inline double sd_chisq_gof(const uint32_t *obs, const double *prob, int n_cells, int *df_out)
{
    double n = 0;
    for (int c = 0; c < n_cells; c++)
        n += obs[c];
    double pool_o = 0, pool_e = 0, small_e = INFINITY;
    int cells = 0, small = -1;
    for (int c = 0; c < n_cells; c++) {
        double e = n * prob[c];
        if (prob[c] <= 0) {
            if (obs[c])
                return 0.0;
            continue;
        }
        if (e < 5) {
            pool_o += obs[c];
            pool_e += e;
        } else {
            cells++;
            if (e < small_e) {
                small_e = e;
                small = c;
            }
        }
    }
    const int join = pool_e > 0 && pool_e < 5 && small >= 0;
    double stat = 0;
    for (int c = 0; c < n_cells; c++) {
        double e = n * prob[c], o = obs[c];
        if (prob[c] <= 0 || e < 5)
            continue;
        if (join && c == small) {
            o += pool_o;
            e += pool_e;
        }
        stat += (o - e) * (o - e) / e;
    }
    if (pool_e > 0 && !join) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    if (df_out)
        *df_out = cells - 1;
    return cells > 1 ? sd_chisq_sf(stat, cells - 1) : 1.0;
}

/* Two-sample homogeneity test of counts a and b (n_cells,): do both samples
 * come from one distribution? Cells whose expected count in either sample is
 * < 5 are pooled; a pool still under 5 joins the smallest remaining cell. */
static inline double sd_chisq_two_sample(const uint32_t *a, const uint32_t *b, int n_cells,
                                         int *df_out)
{
    double na = 0, nb = 0;
    for (int c = 0; c < n_cells; c++) {
        na += a[c];
        nb += b[c];
    }
    const double n = na + nb, fa = na / n, fb = nb / n;
    double pa = 0, pb = 0, small_t = INFINITY;
    int cells = 0, small = -1;
    for (int c = 0; c < n_cells; c++) {
        double t = (double)a[c] + b[c];
        if (t == 0)
            continue;
        if (t * fa < 5 || t * fb < 5) {
            pa += a[c];
            pb += b[c];
        } else {
            cells++;
            if (t < small_t) {
                small_t = t;
                small = c;
            }
        }
    }
    const double pt = pa + pb;
    const int join = pt > 0 && (pt * fa < 5 || pt * fb < 5) && small >= 0;
    double stat = 0;
    for (int c = 0; c < n_cells; c++) {
        double oa = a[c], ob = b[c], t = oa + ob;
        if (t == 0 || t * fa < 5 || t * fb < 5)
            continue;
        if (join && c == small) {
            oa += pa;
            ob += pb;
            t += pt;
        }
        double ea = t * fa, eb = t * fb;
        stat += (oa - ea) * (oa - ea) / ea + (ob - eb) * (ob - eb) / eb;
    }
    if (pt > 0 && !join) {
        double ea = pt * fa, eb = pt * fb;
        stat += (pa - ea) * (pa - ea) / ea + (pb - eb) * (pb - eb) / eb;
        cells++;
    }
    if (df_out)
        *df_out = cells - 1;
    return cells > 1 ? sd_chisq_sf(stat, cells - 1) : 1.0;
}

#endif

/* engine/adaptive: measured cost curves and the draft length (adaptive.h). */
#include "engine/adaptive.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "engine/engine.h"

/* ------------------------------------------------------------------ curves */

/* A rise "in proportion to x": a slope of at least this share of the time
 * per row (a CPU's steps, where each row costs about the same) */
#define CURVE_PROPORTIONAL 0.8

/* a slope that rises in proportion to x, up to a point of time v at x */
static int in_proportion(double slope, double v, double x)
{
    return v > 0 && slope >= CURVE_PROPORTIONAL * v / x;
}

int sd_row_bucket(int T)
{
    if (T <= 8)
        return T;
    int q = T <= 64 ? 8 : T <= 128 ? 16 : T <= 256 ? 32 : 64;
    return (T + q - 1) / q * q;
}

/* A point's time: of its last m times (m <= SD_CURVE_RING) the
 * ((m - 3) / 2)-th smallest: the least up to 4 times (a shape's first two
 * are one-off: an eager pass, a graph capture), the 3rd smallest of 8 (a
 * lower median). The least of 8 is the luckiest step of a noisy machine,
 * not its typical one (throughput is the typical one), and how lucky
 * depends on each point's own spread, so a choice between two costs
 * measured at different moments leaned to the noisier. On a steady
 * machine (a GPU replaying graphs) the two agree. */
/* the ring's times from its first-th on (0: all), sorted into v; their count */
static int ring_sorted(const sd_curve_pt *p, int first, double v[SD_CURVE_RING])
{
    int m = p->n < SD_CURVE_RING ? p->n : SD_CURVE_RING, k = 0;
    for (int i = first > 0 ? first : 0; i < m; i++) { /* insertion sort */
        int j = k++;
        for (; j > 0 && v[j - 1] > p->t[i]; j--)
            v[j] = v[j - 1];
        v[j] = p->t[i];
    }
    return k;
}

static double pt_value(const sd_curve_pt *p, double *spread)
{
    double v[SD_CURVE_RING];
    int m = ring_sorted(p, 0, v);
    *spread = 0;
    if (m <= 0)
        return 0;
    int q = m > 3 ? (m - 3) / 2 : 0;
    /* how far apart the same shape's times are: the order statistics
     * symmetric to the answer (0 up to 4 times) */
    *spread = v[m - 1 - q] - v[q];
    return v[q];
}

/* A point's typical time: the median of its ring, leaving out the first
 * SD_CURVE_TRUST - 1 times while they are still in it (one-offs: an eager
 * pass, a graph capture). What a fall between two points within their
 * noise is read with: two rings' medians tell a flat GPU curve (about
 * equal) from a CPU's rising one (the larger point's median above). */
static double pt_typical(const sd_curve_pt *p)
{
    int m = p->n < SD_CURVE_RING ? p->n : SD_CURVE_RING;
    double v[SD_CURVE_RING];
    int k = ring_sorted(p, p->n <= SD_CURVE_RING ? SD_MIN(SD_CURVE_TRUST - 1, m - 1) : 0, v);
    if (k == 0)
        return 0;
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* the least of a point's times (the optimistic reading of pick_k's hope) */
static double pt_least(const sd_curve_pt *p)
{
    int m = p->n < SD_CURVE_RING ? p->n : SD_CURVE_RING;
    double v = m > 0 ? p->t[0] : 0;
    for (int i = 1; i < m; i++)
        v = p->t[i] < v ? p->t[i] : v;
    return v;
}

void sd_curve_add(sd_curve *c, int x, double secs)
{
    sd_curve_pt *p = NULL;
    for (int i = 0; i < c->n && !p; i++)
        if (c->pt[i].x == x)
            p = &c->pt[i];
    if (!p) {
        if (c->n < SD_CURVE_PTS) {
            p = &c->pt[c->n++];
        } else {
            p = &c->pt[0];
            for (int i = 1; i < c->n; i++)
                if (c->pt[i].used < p->used)
                    p = &c->pt[i];
        }
        memset(p, 0, sizeof *p);
        p->x = x;
    }
    if (p->n > 0 && (c->now - p->at > SD_CURVE_STALE || p->at < c->restart)) {
        /* seen again after a while: its old times may be another machine's,
         * and the least of a ring that mixes the two would be the stale
         * one; the point starts over from this time. A point not yet
         * trusted is trusted from the next (one time alone may be a
         * shape's one-off: a graph captured the second time its shape
         * comes); one that was stays trusted, at this time: its shape is
         * not new, and left untrusted the curve was read off its other
         * points instead (on an H200 a batch's 40 rows restarted at 0.342
         * ms and priced at 1.2 ms off the 8- and 16-row points: speculation
         * went off where it ran 1.2x plain; NOTES.md, session 13) */
        int was_trusted = p->n >= SD_CURVE_TRUST;
        for (int i = 0; i < SD_CURVE_RING; i++)
            p->t[i] = secs;
        p->n = was_trusted ? SD_CURVE_TRUST : SD_CURVE_TRUST - 1;
    } else {
        p->t[p->n % SD_CURVE_RING] = secs;
        p->n++;
    }
    p->used = ++c->clock;
    p->at = c->now;
}

void sd_curve_restart(sd_curve *c)
{
    c->restart = c->now > 0 ? c->now : 1;
}

/* seen often enough, and recently enough */
static int trusted(const sd_curve *c, const sd_curve_pt *p)
{
    return p->n >= SD_CURVE_TRUST && c->now - p->at <= SD_CURVE_FRESH;
}

static int n_trusted(const sd_curve *c)
{
    int n = 0;
    for (int i = 0; i < c->n; i++)
        n += trusted(c, &c->pt[i]);
    return n;
}

/* a point as sd_curve_at reads it: x, its time, its spread, its typical
 * time, its step */
typedef struct pt_read {
    double x, v, w, md;
    uint64_t at;
} pt_read;

/* t(x); optimistic: each point at the least of its times */
static double curve_eval(const sd_curve *c, double x, int *used, int optimistic)
{
    /* the trusted points (all of them while none is), sorted by x */
    pt_read p[SD_CURVE_PTS];
    int trust = n_trusted(c) > 0, m = 0;
    for (int i = 0; i < c->n; i++) {
        if (trust && !trusted(c, &c->pt[i]))
            continue;
        pt_read r = {.x = c->pt[i].x, .at = c->pt[i].at};
        r.v = pt_value(&c->pt[i], &r.w);
        r.md = pt_typical(&c->pt[i]);
        if (optimistic)
            r.v = pt_least(&c->pt[i]);
        int j = m++;
        for (; j > 0 && p[j - 1].x > r.x; j--)
            p[j] = p[j - 1];
        p[j] = r;
    }
    /* a falling segment between points of different times: the older
     * point measured another machine; leave it out (SD_CURVE_STALE) */
    for (int i = 0; i + 1 < m;) {
        uint64_t d = p[i].at > p[i + 1].at ? p[i].at - p[i + 1].at : p[i + 1].at - p[i].at;
        if (p[i + 1].v < p[i].v && d > SD_CURVE_STALE) {
            int drop = p[i].at < p[i + 1].at ? i : i + 1;
            memmove(&p[drop], &p[drop + 1], (size_t)(m - drop - 1) * sizeof p[0]);
            m--;
            i = i > 0 ? i - 1 : 0; /* the new neighbours */
        } else {
            i++;
        }
    }
    if (used)
        *used = m;
    if (m == 0)
        return 0;
    /* the slope is unknown: time in proportion to x; optimistic, flat (a
     * drafting phase of k = 1 is a catch-up pass and a draft, and each
     * further draft a one-row pass that may cost far less: the bundled
     * draft LM's phase took 0.137 ms at k = 1, 0.170 at 2, 0.194 at 3) */
    if (m == 1)
        return optimistic || p[0].x <= 0 ? p[0].v : p[0].v * x / p[0].x;
    int s = 0; /* the segment [s, s + 1]: containing x, else the nearest */
    while (s < m - 2 && x > p[s + 1].x)
        s++;
    double slope = (p[s + 1].v - p[s].v) / (p[s + 1].x - p[s].x);
    if (slope < 0) {
        /* a fall within what either point's times spread over is noise, not
         * a shape that costs less (a GPU's 16-row tensor-core steps under
         * its 8-row fp32 ones are a fall outside the spread): the segment
         * then rises as the two points' typical times do, or lies flat
         * where they do not (a GPU's flat curve, measured a little lower at
         * the larger point, is still flat; a noisy CPU's rising one still
         * rises); a real fall flat */
        double fall = p[s].v - p[s + 1].v, w = p[s].w > p[s + 1].w ? p[s].w : p[s + 1].w;
        double rise = (p[s + 1].md - p[s].md) / (p[s + 1].x - p[s].x);
        slope = fall <= w && rise > 0 ? rise : 0;
    }
    double v = p[s].v + slope * (x - p[s].x);
    if (x < p[0].x) {
        /* below the smallest: where the first segment rises in proportion
         * to x (a CPU's rows), never under the time per row measured
         * there; else (a GPU's flat cost below its knee) the smallest's
         * time. Scaled down per row, a GPU's 16-row point priced 8 rows
         * at half their cost once the 8-row point was left out as stale,
         * and plain decode looked 1.5x cheaper than it was (the H200's
         * trace of the bundled draft LM at batch 8; NOTES.md, session 13) */
        double lo = p[0].x > 0 ? p[0].v * x / p[0].x : 0;
        if (!in_proportion(slope, p[1].v, p[1].x))
            v = p[0].v;
        else if (v < lo)
            v = lo;
    }
    return v > 0 ? v : 0;
}

double sd_curve_at(const sd_curve *c, double x, int *used)
{
    return curve_eval(c, x, used, 0);
}

/* ------------------------------------------------------------------ k */

_Static_assert(SD_KWHY_N == SD_SPEC_WHY_N, "a name for each reason a step drafts");

void sd_adaptive_init(sd_adaptive *a, int k_max)
{
    memset(a, 0, sizeof *a);
    a->k_max = k_max;
    a->margin = SD_ADAPT_MARGIN;
    a->exploring = 1;
    a->last_k = k_max;
}

int sd_adapt_batch_bucket(int batch)
{
    int b = 1;
    while (b < batch && b < (1 << 30))
        b *= 2;
    return b;
}

/* the index of this batch's bucket among a's target curves; -1: none yet */
static int target_index(const sd_adaptive *a, int batch)
{
    const int bb = sd_adapt_batch_bucket(batch);
    for (int i = 0; i < SD_ADAPT_BATCHES; i++)
        if (a->target[i].batch == bb)
            return i;
    return -1;
}

const sd_curve *sd_adaptive_target(const sd_adaptive *a, int batch)
{
    const int i = target_index(a, batch);
    return i >= 0 ? &a->target[i].c : NULL;
}

/* this batch's bucket's target curve, made (in an unused slot, else in the
 * stalest one) when it has none */
static sd_adapt_target *target_of(sd_adaptive *a, int batch)
{
    const int i = target_index(a, batch);
    if (i >= 0)
        return &a->target[i];
    sd_adapt_target *t = &a->target[0];
    for (int j = 1; j < SD_ADAPT_BATCHES && t->batch; j++)
        if (!a->target[j].batch || a->target[j].used < t->used)
            t = &a->target[j];
    memset(t, 0, sizeof *t);
    t->batch = sd_adapt_batch_bucket(batch);
    return t;
}

/* the curves' clock: target steps, read one at a time or queued ahead
 * (every curve's points age with them) */
static void clock_to(sd_adaptive *a)
{
    for (int i = 0; i < SD_ADAPT_BATCHES; i++) {
        sd_adapt_target *t = &a->target[i];
        t->c.now = t->draft.now = t->ahead.now = t->hide.now = a->steps;
    }
}

/* a target step, read one at a time or queued ahead (with its keys, 0:
 * not known): a tick of the clock */
static void observe_step(sd_adaptive *a, int batch, int tokens, double secs, int ahead,
                         double keys)
{
    if (tokens <= 0 || batch <= 0)
        return;
    sd_adapt_target *t = target_of(a, batch);
    clock_to(a);
    const int x = sd_row_bucket(tokens);
    sd_curve_add(ahead ? &t->ahead : &t->c, x, secs);
    if (ahead && keys > 0) {
        sd_adapt_ctx *c = &t->ctx;
        const int i = c->n++ % SD_ADAPT_CTX_RING;
        c->keys[i] = keys;
        c->t[i] = secs;
        c->at[i] = a->steps;
        c->x[i] = x;
    }
    t->used = a->steps;
    a->steps++;
}

void sd_adaptive_observe_target(sd_adaptive *a, int batch, int tokens, double secs)
{
    observe_step(a, batch, tokens, secs, 0, 0);
}

void sd_adaptive_observe_ahead(sd_adaptive *a, int batch, int tokens, double secs, double keys)
{
    observe_step(a, batch, tokens, secs, 1, keys);
}

static int cmp_double(const void *x, const void *y)
{
    const double u = *(const double *)x, v = *(const double *)y;
    return (u > v) - (u < v);
}

typedef struct kt {
    double k, t;
} kt;

/* the median of v[0..n)'s keys (time 0) or times (1) */
static double median_of(const kt *v, int n, int time)
{
    double w[SD_ADAPT_CTX_RING];
    for (int i = 0; i < n; i++)
        w[i] = time ? v[i].t : v[i].k;
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

static int cmp_keys(const void *x, const void *y)
{
    const double u = ((const kt *)x)->k, v = ((const kt *)y)->k;
    return (u > v) - (u < v);
}

/* The line through c's fresh times (SD_ADAPT_CTX_MIN of them at least) of
 * rows bucket x against their keys, into c's fit: its slope from the
 * medians of the half with fewer keys and the half with more (never
 * falling: the same shape reads more keys no faster; flat where their keys
 * hardly differ), its level the same low order statistic of the times less
 * the slope's part as a curve point reads (pt_value: the 3rd smallest of
 * 8, 2/7 of the way up), so this price and the speculative steps' are read
 * alike. */
static void ctx_fit(sd_adapt_ctx *c, uint64_t now, int x)
{
    kt v[SD_ADAPT_CTX_RING];
    int m = 0;
    uint64_t newest = 0;
    for (int i = 0; i < c->n && i < SD_ADAPT_CTX_RING; i++)
        if (c->x[i] == x && now - c->at[i] <= SD_CURVE_FRESH) {
            v[m++] = (kt){c->keys[i], c->t[i]};
            newest = c->at[i] > newest ? c->at[i] : newest;
        }
    c->fit_n = c->n;
    c->fit_x = x;
    /* good while its newest time is fresh (fitted again as each time went
     * stale, a long stretch of drafting would refit at every step) */
    c->fit_until = newest + SD_CURVE_FRESH;
    c->fit_ok = m >= SD_ADAPT_CTX_MIN;
    if (!c->fit_ok)
        return;
    qsort(v, (size_t)m, sizeof *v, cmp_keys); /* (a wrapped ring is two runs) */
    const int h = m / 2;
    const double kl = median_of(v, h, 0), tl = median_of(v, h, 1);
    const double ku = median_of(v + h, m - h, 0), tu = median_of(v + h, m - h, 1);
    double w[SD_ADAPT_CTX_RING];
    const double slope = ku - kl > 0.05 * ku && tu > tl ? (tu - tl) / (ku - kl) : 0;
    for (int i = 0; i < m; i++)
        w[i] = v[i].t - slope * v[i].k;
    qsort(w, (size_t)m, sizeof *w, cmp_double);
    c->fit_slope = slope;
    c->fit_level = w[(m - 1) * 2 / 7];
    c->fit_kmin = v[0].k;
}

/* The queued-ahead step of rows bucket x at `keys` keys from c's line
 * (ctx_fit, fitted again where c has a step since, another x is asked or
 * the newest time it used went stale). Below the fewest keys measured the
 * line falls no further than 3/4 of its time there. 0 where too few were
 * measured. */
static double ctx_price(const sd_adapt_ctx *cc, uint64_t now, int x, double keys)
{
    /* the fit is a cache: sd_adaptive is never a const object, a price is
     * read through a const one */
    sd_adapt_ctx *c = (sd_adapt_ctx *)cc;
    if (keys <= 0 || c->n < SD_ADAPT_CTX_MIN)
        return 0;
    if (c->fit_n != c->n || c->fit_x != x || now > c->fit_until)
        ctx_fit(c, now, x);
    if (!c->fit_ok)
        return 0;
    const double at = c->fit_level + c->fit_slope * keys;
    if (keys >= c->fit_kmin)
        return at;
    const double at_least = c->fit_level + c->fit_slope * c->fit_kmin;
    return at > 0.75 * at_least ? at : 0.75 * at_least;
}

void sd_adaptive_observe_hidden(sd_adaptive *a, int batch, double secs)
{
    if (batch <= 0 || secs < 0)
        return;
    sd_adapt_target *t = target_of(a, batch);
    t->hide.now = a->steps;
    sd_curve_add(&t->hide, 1, secs);
}

void sd_adaptive_observe_draft(sd_adaptive *a, int n_seqs, int k, double secs)
{
    if (n_seqs <= 0 || k <= 0)
        return;
    sd_adapt_target *t = target_of(a, n_seqs);
    t->draft.now = a->steps;
    sd_curve_add(&t->draft, k, secs);
    t->used = a->steps;
    a->draft_steps++;
    a->draft_kpr = a->pick_kpr;
}

/* Pseudo-observations behind each position's prior. The prior of position
 * k's acceptance (given the first k - 1 accepted) is position k - 1's
 * estimate (0.5 for the first): a position never drafted is expected to do
 * as well as the one before it, so a proposer that pays at k = 1 is tried
 * deeper, and the evidence then decides. */
#define ADAPT_PRIOR_W 4.0
/* standard deviations above its estimate at which a position's acceptance
 * counts as still possible (the hopeful estimate of pick_k) */
#define ADAPT_HOPE_Z 2.0
/* The drafts of one step are not independent evidence: they share the
 * step's place in the requests (right after their prompts, the drafts of
 * the bundled model's MTP layer at batch 32 were accepted at 0.68 over 115
 * drafts in 3 steps, 0.9 later). The hope counts at most this many drafts
 * a drafting step. */
#define ADAPT_PER_STEP 4.0

/* drafts at this position that count as evidence for the hope */
static double hope_evidence(const sd_adaptive *a, double proposed)
{
    double cap = ADAPT_PER_STEP * (double)a->draft_steps;
    return proposed < cap ? proposed : cap;
}

/* c's point at x, measured at least once; NULL where there is none */
static const sd_curve_pt *point_of(const sd_curve *c, int x)
{
    for (int i = 0; c && i < c->n; i++)
        if (c->pt[i].x == x)
            return c->pt[i].n > 0 ? &c->pt[i] : NULL;
    return NULL;
}

static int has_trusted(const sd_curve *c, int x)
{
    const sd_curve_pt *p = point_of(c, x);
    return p && trusted(c, p);
}

/* the largest two trusted points of c (NULL where there are fewer) */
static void top_two(const sd_curve *c, const sd_curve_pt **top, const sd_curve_pt **next)
{
    *top = *next = NULL;
    for (int i = 0; i < c->n; i++) {
        const sd_curve_pt *p = &c->pt[i];
        if (!trusted(c, p))
            continue;
        if (!*top || p->x > (*top)->x) {
            *next = *top;
            *top = p;
        } else if (!*next || p->x > (*next)->x) {
            *next = p;
        }
    }
}

/* the segment from p up to the top point rises in proportion to x */
static int rises_to(const sd_curve_pt *p, const sd_curve_pt *top)
{
    double spread, vt = pt_value(top, &spread), vp = pt_value(p, &spread);
    return in_proportion((vt - vp) / (double)(top->x - p->x), vt, (double)top->x);
}

/* c rises in proportion to x (a CPU's steps: each row costs about the
 * same; past its top points the curve's own continuation cannot be an
 * underestimate, as a flat GPU curve's is before its knee): from its
 * next-to-top trusted point to the top, and from its smallest (a GPU's
 * steps of a few requests had a bump:
 * 9-16 rows at 0.47 ms against 0.23-0.27 for 3-8 rows, the top two of
 * the batch-4 curve rose in proportion, and the curve was lent to a batch
 * of 32; NOTES.md, session 13) */
static int proportional(const sd_curve *c)
{
    const sd_curve_pt *top, *next, *low = NULL;
    top_two(c, &top, &next);
    if (!next)
        return 0;
    for (int i = 0; i < c->n; i++)
        if (trusted(c, &c->pt[i]) && (!low || c->pt[i].x < low->x))
            low = &c->pt[i];
    return rises_to(next, top) && (low == next || rises_to(low, top));
}

/* c may price another batch bucket's steps: it rises in proportion to its
 * rows, on a backend whose buckets do not price their steps apart
 * (a->own_buckets) */
static int lends(const sd_adaptive *a, const sd_curve *c)
{
    return !a->own_buckets && proportional(c);
}

/* x measured on c: a trusted point there, trusted points on both sides, or
 * past the largest one a curve that already grows in proportion to x */
static int covered(const sd_curve *c, int x)
{
    int lo = 0, hi = 0;
    for (int i = 0; i < c->n; i++) {
        const sd_curve_pt *p = &c->pt[i];
        if (!trusted(c, p))
            continue;
        if (p->x == x)
            return 1;
        lo |= p->x < x;
        hi |= p->x > x;
    }
    /* here no trusted point is at x, so with lo alone x is past them all */
    return lo && (hi || proportional(c));
}

/* The target curve that prices x rows at this batch: its bucket's where
 * that covers x; else the largest smaller bucket's that covers x and rises
 * in proportion to its rows (a CPU's: a row costs about the same whichever
 * request it is of, so a batch that grows is judged without exploring each
 * size again); else its bucket's (NULL before a step of it). A GPU's
 * curve is never borrowed (lends): there the rows of 8 requests at k = 3
 * cost less than the rows of 32 plain ones. */
static const sd_curve *target_curve(const sd_adaptive *a, int batch, int x)
{
    const sd_curve *own = sd_adaptive_target(a, batch);
    if (own && covered(own, x))
        return own;
    const int bb = sd_adapt_batch_bucket(batch);
    const sd_adapt_target *best = NULL;
    for (int i = 0; i < SD_ADAPT_BATCHES; i++) {
        const sd_adapt_target *t = &a->target[i];
        if (t->batch && t->batch < bb && (!best || t->batch > best->batch) &&
            covered(&t->c, x) && lends(a, &t->c))
            best = t;
    }
    return best ? &best->c : own;
}

/* The drafting curve that prices k drafts each for `drafting` requests,
 * and the factor on its times: its bucket's where that covers k; else the
 * smallest larger bucket's that covers k (more requests' phase: an upper
 * bound, as when some requests stopped drafting or a batch's tail
 * finishes); else the largest smaller bucket's that covers k where that
 * bucket's target curve rises in proportion to its rows (a CPU's: a
 * phase's passes are over the drafting requests' rows, so its time is
 * scaled by the buckets' ratio); else its bucket's (NULL before a phase of
 * it). One curve for every batch priced a GPU's 32 drafting requests at
 * the 8's (the bundled model's MTP at k = 3: 0.32 ms for 8 requests, 0.57
 * for 32; NOTES.md, session 14). */
static const sd_curve *draft_curve_of(const sd_adaptive *a, int drafting, int k, int borrow,
                                      double *scale)
{
    *scale = 1;
    const int i = target_index(a, drafting);
    const sd_curve *own = i >= 0 && a->target[i].draft.n > 0 ? &a->target[i].draft : NULL;
    if (own && covered(own, k))
        return own;
    const int bb = sd_adapt_batch_bucket(drafting);
    const sd_adapt_target *up = NULL, *down = NULL;
    for (int j = 0; j < SD_ADAPT_BATCHES; j++) {
        const sd_adapt_target *t = &a->target[j];
        if (!t->batch || !covered(&t->draft, k))
            continue;
        if (t->batch > bb && (!up || t->batch < up->batch))
            up = t;
        if (t->batch < bb && (!down || t->batch > down->batch) &&
            (borrow || lends(a, &t->c)))
            down = t;
    }
    if (up)
        return &up->draft;
    if (!down)
        return own;
    if (!lends(a, &down->c))
        return own ? own : &down->draft; /* borrowed, unscaled: a lower bound on a GPU */
    *scale = (double)bb / (double)down->batch;
    return &down->draft;
}

static const sd_curve *draft_curve(const sd_adaptive *a, int drafting, int k, double *scale)
{
    return draft_curve_of(a, drafting, k, 0, scale);
}

/* k drafts measured for `drafting` requests (draft_curve) */
static int draft_covered(const sd_adaptive *a, int drafting, int k)
{
    double scale;
    const sd_curve *d = draft_curve(a, drafting, k, &scale);
    return d && covered(d, k);
}

/* a step's token rows at this batch when `drafting` of its requests draft k */
static int step_rows(int batch, int drafting, int k)
{
    return batch + drafting * k;
}

/* the choice between k and 0 at this batch rests on measured costs (of
 * steps of this batch's bucket) */
static int k_measured(const sd_adaptive *a, int batch, int drafting, int k)
{
    const int x = sd_row_bucket(step_rows(batch, drafting, k));
    const sd_curve *tc = target_curve(a, batch, x);
    return tc && covered(tc, x) && (k == 0 || draft_covered(a, drafting, k));
}

/* k = 0's time at this batch from tc, its target curve: the step read one
 * at a time, t0. Where plain steps would be queued ahead (a->ahead): the
 * queued-ahead steps' time at the running requests' keys (a->keys,
 * ctx_price) where this bucket measured enough of them, else their time
 * as measured (they run once speculation is off for every request, and
 * after a restart that time may be of the last burst's longer contexts),
 * else t0 less what queueing
 * ahead hides of a step read one at a time (measured on every such step),
 * never under half of t0. That estimate errs low where a GPU already runs
 * part of a step during its launch call, so the measured time replaces it
 * as soon as there is one, and keeps it after a restart (the estimate ran
 * 0.26 ms where the bundled model's queued-ahead step at batch 32 took
 * 0.33 on an H200, and read in its place after a burst's restart it
 * turned MTP off where drafting paid 8%; NOTES.md, session 20). */
static double plain_cost(const sd_adaptive *a, int batch, const sd_curve *tc)
{
    const double t0 = curve_eval(tc, sd_row_bucket(batch), NULL, 0);
    const int i = target_index(a, batch);
    if (!a->ahead || i < 0 || t0 <= 0)
        return t0;
    const sd_adapt_target *t = &a->target[i];
    const int x = sd_row_bucket(batch);
    const double at_keys = ctx_price(&t->ctx, a->steps, x, a->keys);
    if (at_keys > 0)
        return at_keys;
    if (has_trusted(&t->ahead, x))
        return curve_eval(&t->ahead, x, NULL, 0);
    if (!has_trusted(&t->hide, 1))
        return t0;
    const double h = curve_eval(&t->hide, 1, NULL, 0);
    return t0 - h > 0.5 * t0 ? t0 - h : 0.5 * t0;
}

double sd_adaptive_plain_cost(const sd_adaptive *a, int batch)
{
    if (batch < 1)
        batch = 1;
    const sd_curve *tc = target_curve(a, batch, sd_row_bucket(batch));
    if (!tc || tc->n == 0)
        return 0;
    return plain_cost(a, batch, tc);
}

/* best_k at a batch of which `drafting` requests draft (the others are
 * plain rows: a token each, whatever k); with trace, a debug line per k.
 * z > 0: each position's acceptance taken z standard deviations above its
 * estimate (the evidence so far cannot rule that out), capped at 1, and
 * the drafting phase at the least time measured: a hopeful best_k. (Only
 * the drafting phase: its host time is what jumps on a GPU, while target
 * steps replayed from graphs are steady; on a noisy CPU the least target
 * time is a lucky step, and reading it made 64-row steps at batch 32 look
 * as cheap as 32-row ones.) */
/* each k's expected tokens a drafting request (1 + sum_{j<=k} P(the first
 * j drafts accepted)) into ex[1..kmax], P(the first k accepted) into
 * rate[1..kmax]; z > 0: each position's acceptance z standard deviations
 * up (best_k's hope) */
static void expectations(const sd_adaptive *a, const sd_accept_stats *acc, int kmax, double z,
                         double *ex, double *rates)
{
    double cum = 1, expect = 1, prev_rate = 1, prev_cond = 0.5;
    for (int k = 1; k <= kmax && k <= SD_ACCEPT_POSITIONS; k++) {
        double prop = (double)acc->proposed_at[k - 1], got = (double)acc->accepted_at[k - 1];
        /* P(first k accepted), shrunk toward the previous position's rate */
        double prior = prev_rate * prev_cond;
        double rate = (got + ADAPT_PRIOR_W * prior) / (prop + ADAPT_PRIOR_W);
        if (z > 0) {
            rate += z * sqrt(rate * (1 - rate) / (hope_evidence(a, prop) + ADAPT_PRIOR_W));
            if (rate > 1)
                rate = 1;
        }
        double cond = prev_rate > 0 ? rate / prev_rate : 0;
        if (cond > 1)
            cond = 1;
        prev_rate = rate;
        prev_cond = cond;
        cum *= cond;
        expect += cum;
        ex[k] = expect;
        rates[k] = rate;
    }
}

/* What drafting ahead hides of a drafting step of this batch at k: its
 * bucket's trusted point at the k nearest (the lower of two as near);
 * 0 where none is, or where plain steps are not priced queued ahead */
static double draft_ahead_hide(const sd_adaptive *a, int batch, int k)
{
    const int i = target_index(a, batch);
    if (!a->ahead || i < 0)
        return 0;
    const sd_curve *c = &a->target[i].dahead;
    const sd_curve_pt *best = NULL;
    for (int j = 0; j < c->n; j++) {
        const sd_curve_pt *p = &c->pt[j];
        const int d = abs(p->x - k), bd = best ? abs(best->x - k) : 0;
        if (p->n >= SD_CURVE_TRUST && (!best || d < bd || (d == bd && p->x < best->x)))
            best = p;
    }
    double spread;
    return best ? pt_value(best, &spread) : 0;
}

/* a step of `batch` requests of which `drafting` draft k each, its parts
 * timed apart: the target's rows (*tt) and the drafting phase (*td) */
static void step_parts(const sd_adaptive *a, int batch, int drafting, int k, const sd_curve *tc,
                       int hope, int borrow, double *tt, double *td)
{
    double s1;
    const sd_curve *d1 = draft_curve_of(a, drafting, 1, borrow, &s1);
    const int xk = sd_row_bucket(step_rows(batch, drafting, k));
    const sd_curve *tk = target_curve(a, batch, xk);
    *tt = curve_eval(tk ? tk : tc, xk, NULL, 0);
    double sk;
    const sd_curve *dk = draft_curve_of(a, drafting, k, borrow, &sk);
    *td = dk ? sk * curve_eval(dk, k, NULL, hope) : d1 ? s1 * curve_eval(d1, k, NULL, hope) : 0;
}

/* a step of `batch` requests of which `drafting` draft k each: its time
 * (the target's rows and the drafting phase, less what drafting ahead
 * hides of the two, more where that is negative: never under the target's
 * rows alone); *td_out (may be NULL) the phase's part of it */
static double step_cost(const sd_adaptive *a, int batch, int drafting, int k, const sd_curve *tc,
                        int hope, int borrow, double *tt_out, double *td_out)
{
    double tt, td;
    step_parts(a, batch, drafting, k, tc, hope, borrow, &tt, &td);
    td -= draft_ahead_hide(a, batch, k);
    td = td > 0 ? td : 0;
    if (tt_out)
        *tt_out = tt;
    if (td_out)
        *td_out = td;
    return tt + td;
}

void sd_adaptive_observe_draft_ahead(sd_adaptive *a, int batch, int drafting, int k, double secs)
{
    if (batch <= 0 || k <= 0 || secs <= 0)
        return;
    drafting = drafting < 1 ? 1 : drafting > batch ? batch : drafting;
    const int i = target_index(a, batch);
    const sd_curve *tc = target_curve(a, batch, sd_row_bucket(batch));
    if (i < 0 || !tc || !k_measured(a, batch, drafting, k))
        return;
    double tt, td;
    step_parts(a, batch, drafting, k, tc, 0, 0, &tt, &td);
    sd_curve_add(&a->target[i].dahead, k, tt + td - secs);
    sd_log_debug("adaptive k: drafting ahead hid %.3f ms of %.3f + %.3f (batch %d, %d drafting, "
                 "k %d)",
                 1e3 * (tt + td - secs), 1e3 * tt, 1e3 * td, batch, drafting, k);
}

static int best_k_of(const sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting,
                     int trace, double z, int borrow)
{
    int kmax = a->k_max;
    if (batch < 1)
        batch = 1;
    drafting = drafting < 0 ? 0 : drafting > batch ? batch : drafting;
    const sd_curve *tc = target_curve(a, batch, sd_row_bucket(batch));
    double s1;
    const sd_curve *d1 = drafting > 0 ? draft_curve_of(a, drafting, 1, borrow, &s1) : NULL;
    if (kmax <= 0 || !d1 || !tc || tc->n == 0)
        return 0;
    const int hope = z > 0;
    int best_k = 0;
    double t0 = plain_cost(a, batch, tc);
    double best = batch / (t0 > 0 ? t0 : 1e-9);
    /* at most one k past the measured ones: beyond the last measured row
     * count the curve only extrapolates, and a falling last segment (noise,
     * clamped flat) would make every deeper k look free (a CPU server at
     * batch 8 went from k = 0 to 4 on two points 8 and 16 rows apart) */
    int measured = 0;
    while (measured < kmax && k_measured(a, batch, drafting, measured + 1))
        measured++;
    if (kmax > measured + 1)
        kmax = measured + 1;
    double ex[SD_ACCEPT_POSITIONS + 1], rates[SD_ACCEPT_POSITIONS + 1];
    expectations(a, acc, kmax, z, ex, rates);
    for (int k = 1; k <= kmax && k <= SD_ACCEPT_POSITIONS; k++) {
        const double prop = (double)acc->proposed_at[k - 1], rate = rates[k], expect = ex[k];
        double tt, td;
        const double cost = step_cost(a, batch, drafting, k, tc, hope, borrow, &tt, &td);
        double thr = (batch - drafting + drafting * expect) / (cost > 0 ? cost : 1e-9);
        if (trace)
            sd_log_debug("adaptive k:   k %d: drafted %.0f, P(first k accepted) %.3f, expect %.2f, "
                         "%d of %d drafting, target %.3f ms + draft %.3f ms: %.3f tok/ms "
                         "(k 0: %.3f ms, %.3f)",
                         k, prop, rate, expect, drafting, batch, 1e3 * tt, 1e3 * td, thr / 1e3,
                         1e3 * t0, 1e-3 * batch / t0);
        if (thr > best * (1 + a->margin)) {
            best = thr;
            best_k = k;
        }
    }
    return best_k;
}

static int best_k(const sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting,
                  int trace, double z)
{
    return best_k_of(a, acc, batch, drafting, trace, z, 0);
}

int sd_adaptive_best_k(const sd_adaptive *a, const sd_accept_stats *acc, int batch)
{
    return best_k(a, acc, batch, batch, 0, 0);
}

/* the step at which the target step of x rows at this batch was last
 * measured, plus 1 (the plain step with a->ahead: at a queued-ahead step
 * where it was, the later of the two); 0 where it never was */
static uint64_t point_at(const sd_adaptive *a, int batch, int x)
{
    const int i = target_index(a, batch);
    if (i < 0)
        return 0;
    const sd_curve_pt *pc = point_of(&a->target[i].c, x);
    const sd_curve_pt *pa = a->ahead ? point_of(&a->target[i].ahead, x) : NULL;
    const uint64_t ac = pc ? pc->at + 1 : 0, aa = pa ? pa->at + 1 : 0;
    return ac > aa ? ac : aa;
}

void sd_adaptive_refresh(sd_adaptive *a)
{
    clock_to(a);
    for (int i = 0; i < SD_ADAPT_BATCHES; i++) {
        sd_adapt_target *t = &a->target[i];
        sd_curve_restart(&t->c);
        sd_curve_restart(&t->draft);
        sd_curve_restart(&t->ahead);
    }
    a->refresh_at = a->refreshed = a->steps + 1;
}

int sd_adaptive_draft_stale(const sd_adaptive *a, int batch)
{
    if (batch < 1)
        batch = 1;
    /* (the curve that prices it: a smaller bucket's where that is lent) */
    const int x = sd_row_bucket(step_rows(batch, batch, 1));
    const sd_curve_pt *p = point_of(target_curve(a, batch, x), x);
    return p && a->steps - p->at > SD_CURVE_STALE;
}

static int informed(const sd_adaptive *a, int batch, int drafting)
{
    return k_measured(a, batch, drafting, 0) && k_measured(a, batch, drafting, 1);
}

/* what a point of c at x lacks, for the debug log: never measured, too
 * few times, or aged out (SD_CURVE_FRESH) */
static const char *point_lack(const sd_curve *c, int x, char *buf, size_t n)
{
    const sd_curve_pt *p = point_of(c, x);
    if (!p)
        return "not measured";
    if (p->n < SD_CURVE_TRUST)
        snprintf(buf, n, "%d of %d times", p->n, SD_CURVE_TRUST);
    else
        snprintf(buf, n, "aged out (%llu steps)", (unsigned long long)(c->now - p->at));
    return buf;
}

/* why informed() is false, for the debug log: for k = 0 and 1, the curve
 * and point that do not cover it */
static void uninformed_why(const sd_adaptive *a, int batch, int drafting, char *out, size_t n)
{
    size_t o = 0;
    out[0] = 0;
    for (int k = 0; k < 2 && o < n; k++) {
        if (k_measured(a, batch, drafting, k))
            continue;
        const int x = sd_row_bucket(step_rows(batch, drafting, k));
        const sd_curve *tc = sd_adaptive_target(a, batch);
        const int id = target_index(a, drafting);
        char b[48];
        int w;
        if (!tc)
            w = snprintf(out + o, n - o, "; k %d: no curve of batch %d", k,
                         sd_adapt_batch_bucket(batch));
        else if (!covered(tc, x))
            w = snprintf(out + o, n - o, "; k %d: %d rows of batch %d %s", k, x,
                         sd_adapt_batch_bucket(batch), point_lack(tc, x, b, sizeof b));
        else
            w = snprintf(out + o, n - o, "; k %d: the draft of %d requests %s", k,
                         sd_adapt_batch_bucket(drafting),
                         id < 0 ? "not measured" : point_lack(&a->target[id].draft, 1, b, sizeof b));
        o += w > 0 ? (size_t)w : 0;
    }
}

int sd_adaptive_informed(const sd_adaptive *a, int batch)
{
    if (batch < 1)
        batch = 1;
    return informed(a, batch, batch);
}

int sd_adaptive_wants_times(const sd_adaptive *a, int batch, int drafting, int k)
{
    if (a->exploring || a->refresh_at)
        return 1;
    if (k < 1)
        return 0;
    batch = batch < 1 ? 1 : batch;
    drafting = drafting < 1 ? 1 : drafting > batch ? batch : drafting;
    const int id = target_index(a, drafting);
    const sd_curve *tc = sd_adaptive_target(a, batch);
    return !tc || !has_trusted(tc, sd_row_bucket(step_rows(batch, drafting, k))) || id < 0 ||
           !has_trusted(&a->target[id].draft, k);
}

int sd_adaptive_admit_off(sd_adaptive *a, const sd_accept_stats *acc, int joins, int drafting,
                          int off_verdict, int idle)
{
    if (joins < 1)
        joins = 1;
    drafting = drafting < 1 ? 1 : drafting > joins ? joins : drafting;
    /* the pick that follows its first step: `drafting` of `joins` (every
     * request drafting at that batch is the step no one runs while the
     * verdict is plain: its price ages out, and each arrival tracked the
     * proposer for a step until the pick turned it off) */
    const int off_now = off_verdict && informed(a, joins, drafting);
    /* best_k says plain at this batch (asked once, and only where it decides) */
    const int plain = (off_now || idle) && best_k(a, acc, joins, drafting, 0, 0) == 0;
    /* a stale draft price: measured again once in a while, or where the
     * contexts moved since (or are not known) */
    const double kpr = a->keys > 0 ? a->keys / joins : 0;
    const int moved = !(kpr > 0 && a->draft_kpr > 0) ||
                      fabs(kpr - a->draft_kpr) > SD_ADAPT_CTX_MOVED * a->draft_kpr;
    const int gap = !a->refreshed || a->steps + 1 - a->refreshed >= SD_ADAPT_REFRESH_GAP;
    /* a burst after idle: measured again where its contexts are not where
     * the draft was priced (the last burst's end), or once in a while */
    const int by_idle = idle && (off_verdict || plain) && (gap || moved);
    if (!a->refresh_at && a->steps > 0 &&
        (by_idle || (off_now && (gap || moved) && sd_adaptive_draft_stale(a, joins)))) {
        sd_log_debug("adaptive k: prices measured again at batch %d (step %llu): %s", joins,
                     (unsigned long long)a->steps,
                     by_idle ? "a burst after idle"
                     : moved ? "the contexts moved since the draft was priced"
                             : "the draft price is stale");
        sd_adaptive_refresh(a);
    }
    /* a pending refresh's measurements decide, not these prices */
    return off_now && !a->refresh_at && plain;
}

int sd_adaptive_cohort(const sd_adaptive *a, const sd_accept_stats *acc, int joins, int *k)
{
    int kk = 0, why = 0;
    if (joins < 1)
        joins = 1;
    if (a->k_max > 0 && a->ahead) {
        /* measured: what the pick with every request drafting would say */
        if (informed(a, joins, joins)) {
            kk = best_k(a, acc, joins, joins, 0, 0);
            why = SD_COHORT_MEASURED;
        } else {
            /* not: the hopeful price (each position's acceptance two
             * standard deviations up, the drafting phase at its least
             * time), the phase of a smaller bucket's requests where this
             * one's was never measured */
            kk = best_k_of(a, acc, joins, joins, 0, ADAPT_HOPE_Z, 1);
            why = SD_COHORT_HOPED;
        }
    }
    if (k)
        *k = kk;
    return kk > 0 ? why : 0;
}

int sd_adaptive_measure_k(const sd_adaptive *a, const sd_accept_stats *acc, int batch,
                          int drafting)
{
    if (batch < 1)
        batch = 1;
    drafting = drafting < 1 ? 1 : drafting > batch ? batch : drafting;
    const int kmax = a->k_max < SD_ACCEPT_POSITIONS ? a->k_max : SD_ACCEPT_POSITIONS;
    const sd_curve *tc = target_curve(a, batch, sd_row_bucket(batch));
    if (kmax < 1 || !tc || tc->n == 0)
        return 0;
    const double t0 = plain_cost(a, batch, tc);
    if (t0 <= 0)
        return 0;
    int k = 1;
    while (k <= kmax && k_measured(a, batch, drafting, k))
        k++;
    if (k > kmax)
        return 0;
    /* the step of the deepest measured k below (else plain decode's) */
    const double below = k > 1 ? step_cost(a, batch, drafting, k - 1, tc, 0, 0, NULL, NULL) : t0;
    double ex[SD_ACCEPT_POSITIONS + 1], rates[SD_ACCEPT_POSITIONS + 1];
    expectations(a, acc, kmax, 0, ex, rates);
    /* a step of more drafts costs at least one of fewer: at that price
     * the deepest k must beat plain decode by the margin (its tokens grow
     * with k, its bound does not) */
    const double most = (batch - drafting + drafting * ex[kmax]) / below;
    return most > batch / t0 * (1 + a->margin) ? k : 0;
}

int sd_adaptive_settle_k(sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting,
                         int *measuring)
{
    *measuring = 0;
    const int pk = sd_adaptive_pick_k(a, acc, batch, drafting);
    if (pk > 0 || a->exploring || a->refresh_at)
        return pk;
    const int mk = sd_adaptive_measure_k(a, acc, batch, drafting);
    *measuring = mk > 0;
    return mk ? mk : -1;
}

uint64_t sd_cohort_gap_end(sd_cohort_gap *g, uint64_t step)
{
    if (!g->gap)
        g->gap = SD_COHORT_GAP_MIN;
    g->end = step + 1;
    return step + g->gap;
}

void sd_cohort_gap_verdict(sd_cohort_gap *g, uint64_t step, int off)
{
    if (!g->end)
        return;
    if (step + 1 - g->end > SD_COHORT_HELD) {
        g->gap = SD_COHORT_GAP_MIN;
        g->end = 0;
    } else if (off) {
        g->gap = 2 * g->gap < SD_COHORT_GAP ? 2 * g->gap : SD_COHORT_GAP;
        g->end = 0;
    }
}

/* the time of a step of `batch` requests every one of which drafts k
 * (k = 0: plain decode) by measured prices; 0 where they are not. *own
 * (own may be NULL): priced by the batch's own bucket's curves alone (not lent by another
 * bucket's: at the scan's top a lent price may be far off, 0.73 ms where
 * the bucket below measured 0.33 in a test, and it made plain decode
 * "fail" the rate there, so serve it at no batch). It
 * follows the batch through its bucket and the row buckets of its plain
 * and its drafting step alone (batch_price_key) */
static double batch_cost(const sd_adaptive *a, int batch, int k, int *own)
{
    const sd_curve *tc = target_curve(a, batch, sd_row_bucket(batch));
    const int ok = tc && tc->n > 0 && k_measured(a, batch, batch, k);
    if (own) {
        const int i = target_index(a, batch);
        double s;
        const int xk = sd_row_bucket(step_rows(batch, batch, k));
        *own = ok && i >= 0 && target_curve(a, batch, xk) == &a->target[i].c &&
               (!k || draft_curve(a, batch, k, &s) == &a->target[i].draft);
    }
    if (!ok)
        return 0;
    return k ? step_cost(a, batch, batch, k, tc, 0, 0, NULL, NULL) : plain_cost(a, batch, tc);
}

/* what batch_cost(batch, k) depends on the batch through, as one number */
static int64_t batch_price_key(int batch, int k)
{
    return ((int64_t)sd_adapt_batch_bucket(batch) << 40) ^ ((int64_t)sd_row_bucket(batch) << 20) ^
           sd_row_bucket(step_rows(batch, batch, k));
}

static int demand_scan(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                       int batch, int *b_plain, int *b_k, FILE *trace);

int sd_adaptive_demand_k(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                         int batch, int *b_plain, int *b_k)
{
    return demand_scan(a, acc, demand, batch, b_plain, b_k, NULL);
}

int sd_adaptive_demand_trace(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                             int batch, FILE *trace)
{
    return demand_scan(a, acc, demand, batch, NULL, NULL, trace);
}

static int demand_scan(const sd_adaptive *a, const sd_accept_stats *acc, double demand,
                       int batch, int *b_plain, int *b_k, FILE *trace)
{
    int best = 0, bp = 0, bk = 0;
    if (a->k_max > 0 && a->ahead && demand > 0 && batch > 0) {
        double ex[SD_ACCEPT_POSITIONS + 1], rates[SD_ACCEPT_POSITIONS + 1];
        const int kmax = a->k_max < SD_ACCEPT_POSITIONS ? a->k_max : SD_ACCEPT_POSITIONS;
        expectations(a, acc, kmax, 0, ex, rates);
        /* need[k]: the least batch from which every measured one serves it */
        int need[SD_ACCEPT_POSITIONS + 1] = {0};
        double most[SD_ACCEPT_POSITIONS + 1] = {0}; /* the most each serves at a measured batch */
        /* each k's step time, priced again only where its key moves (a
         * scan of every batch priced at each: 84 us at 32 requests, 260
         * at 64 in a release build here, every few steps under arrivals) */
        int64_t key[SD_ACCEPT_POSITIONS + 1];
        double cost[SD_ACCEPT_POSITIONS + 1];
        int own[SD_ACCEPT_POSITIONS + 1];
        for (int k = 0; k <= kmax; k++)
            key[k] = -1;
        const int top = 2 * sd_adapt_batch_bucket(batch); /* (one answer a bucket: its cache's) */
        for (int b = 1; b <= top; b++)
            for (int k = 0; k <= kmax; k++) {
                const int64_t kb = batch_price_key(b, k);
                if (kb != key[k]) {
                    key[k] = kb;
                    cost[k] = batch_cost(a, b, k, &own[k]);
                    if (trace)
                        fprintf(trace, "  b %3d k %d: %.3f ms%s, %.1f tokens/ms\n", b, k,
                                cost[k] * 1e3, own[k] ? "" : " (lent)",
                                cost[k] > 0 ? b * (k ? ex[k] : 1) / cost[k] * 1e-3 : 0.0);
                }
                if (cost[k] <= 0) /* (not measured) */
                    continue;
                const double r = b * (k ? ex[k] : 1) / cost[k];
                most[k] = r > most[k] ? r : most[k];
                /* (a price lent by another bucket may be far off: it does
                 * not say the rate goes unserved) */
                if (r < demand && own[k])
                    need[k] = 0;
                else if (r >= demand && !need[k])
                    need[k] = b;
            }
        bp = need[0];
        for (int k = 1; k <= kmax; k++)
            if (need[k] && (!bk || need[k] < bk)) {
                bk = need[k];
                best = k;
            }
        /* drafting must serve the demand with fewer requests by the
         * margin; where plain decode serves it at no measured batch, it
         * must serve more than plain does at any, by the margin; where
         * plain decode is measured at none, nothing is known */
        if (best && bp && bk * (1 + a->margin) >= bp)
            best = 0;
        if (best && !bp && !(most[0] > 0 && most[best] > most[0] * (1 + a->margin)))
            best = 0;
        /* and plain decode measured not to serve it at drafting's batch
         * (not merely unmeasured there: at a low rate early on, drafting's
         * 3 requests, priced between measured row counts, beat plain's 4,
         * the least it was measured at) */
        if (best && bp && batch_cost(a, bk, 0, NULL) <= 0)
            best = 0;
    }
    if (b_plain)
        *b_plain = bp;
    if (b_k)
        *b_k = bk;
    return best;
}

int sd_adaptive_pick_k(sd_adaptive *a, const sd_accept_stats *acc, int batch, int drafting)
{
    if (a->k_max <= 0)
        return 0;
    if (batch < 1)
        batch = 1;
    drafting = drafting < 1 ? 1 : drafting > batch ? batch : drafting;
    /* measure first: k = 1 and 0 in turn (each until its costs are
     * trusted), so the target is seen at b and 2 b rows and drafting at 1;
     * again whenever the batch leaves what was measured. Deeper k are
     * measured once chosen (the curve continues the last segment's slope
     * there), and the choice's neighbours by the probes below. */
    a->pick_kpr = a->keys > 0 ? a->keys / batch : 0;
    int explore = !informed(a, batch, drafting);
    if (explore != a->exploring && sd_log_level() >= SD_LOG_DEBUG) {
        char why[256] = "";
        if (explore)
            uninformed_why(a, batch, drafting, why, sizeof why);
        sd_log_debug("adaptive k: %s at batch %d, %d drafting (step %llu)%s",
                     explore ? "exploring" : "explored", batch, drafting,
                     (unsigned long long)a->steps, why);
    }
    /* an exploration's end measured both prices at this batch and context,
     * as a refresh does: the gap to the next refresh counts from it (also
     * where the batch left the bucket it explored before the end: points
     * age out after SD_CURVE_FRESH, no shorter than the gap, so nothing
     * stays unmeasured longer for it) */
    if (a->exploring && !explore)
        a->refreshed = a->steps + 1;
    a->exploring = explore;
    if (explore) {
        for (int i = 0; i < 2; i++) {
            int k = (int)((a->picks + (uint64_t)i) % 2) ? 0 : 1;
            if (!k_measured(a, batch, drafting, k)) {
                a->picks++;
                a->why = SD_KWHY_EXPLORE;
                return k;
            }
        }
    }
    a->picks++;
    /* both sides measured again since sd_adaptive_refresh: a draft, then
     * the plain step (a point measured before the curves restarted starts
     * over from its new time: one step each) */
    int refreshed = 0;
    if (a->refresh_at) {
        const int x1 = sd_row_bucket(step_rows(batch, drafting, 1)), x0 = sd_row_bucket(batch);
        a->why = SD_KWHY_REFRESH;
        if (point_at(a, batch, x1) < a->refresh_at)
            return 1;
        if (point_at(a, batch, x0) < a->refresh_at)
            return 0;
        a->refresh_at = 0;
        refreshed = 1;
    }
    int k = best_k(a, acc, batch, drafting, 0, 0);
    /* a change, and the first choice on a refresh's prices even where it
     * is no change (a burst's verdict: NOTES.md, session 30) */
    if ((k != a->last_k || refreshed) && sd_log_level() >= SD_LOG_DEBUG) {
        sd_log_debug("adaptive k: %d -> %d at batch %d (step %llu)%s", a->last_k, k, batch,
                     (unsigned long long)a->steps, refreshed ? ", measured again" : "");
        best_k(a, acc, batch, drafting, 1, 0);
    }
    a->last_k = k;
    a->why = SD_KWHY_BEST;
    /* too few drafts to give up on drafting: the cheapest probe instead,
     * while drafting could still pay at an acceptance the drafts so far do
     * not rule out (a draft that costs more than a perfect one returns
     * stops at once, a poor one after a few; bench/results/NOTES.md) */
    if (k == 0 && hope_evidence(a, (double)acc->proposed_at[0]) < SD_ADAPT_EXPLORE &&
        best_k(a, acc, batch, drafting, 0, ADAPT_HOPE_Z) > 0) {
        k = 1;
        a->why = SD_KWHY_HOPE;
    }
    /* between measured points the curve is a straight line and the real one
     * is not (flat, then rising): every 4th pick measures a neighbour of the
     * choice that has no trusted point yet */
    for (int d = 1; d >= -1 && k > 0 && a->picks % 4 == 0; d -= 2) {
        int nk = k + d;
        const int xn = sd_row_bucket(step_rows(batch, drafting, nk));
        const sd_curve *tn = target_curve(a, batch, xn);
        double sn;
        const sd_curve *dn = draft_curve(a, drafting, nk, &sn);
        if (nk >= 1 && nk <= a->k_max &&
            !(tn && has_trusted(tn, xn) && dn && has_trusted(dn, nk))) {
            k = nk;
            a->why = SD_KWHY_NEIGHBOUR;
            break;
        }
    }
    if (a->picks % 97 == 0 && k < a->k_max) {
        k++;
        a->why = SD_KWHY_PERIODIC;
    }
    return k;
}

void sd_adaptive_no_pick(sd_adaptive *a)
{
    a->exploring = 0;
}

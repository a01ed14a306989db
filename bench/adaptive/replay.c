/* specd-adaptive-replay: an engine's debug log through the adaptive-k cost
 * model again, on any machine. The engine logs every observation its cost
 * model learns from ("adaptive k: target step: rows x batch R x B: T ms",
 * "adaptive k: drafting phase: requests x k N x K: T ms", --opt
 * log-level=debug); this feeds them in order to engine/adaptive.c as the
 * engine does, picks k after each target step, and prints where the pick
 * changes and where k = 0 held for SD_SPEC_OFF_AFTER picks (the engine
 * then turns speculation off for the running requests). The acceptance is
 * not in those lines: --accept P gives each draft position's chance given
 * the ones before (default 0.9).
 *
 * Open loop: the log's steps were those its own picks chose, so once a
 * replayed pick differs the rest is what that machine measured, not what
 * it would have. What it shows is how a change of the model reads the same
 * numbers (session 13 found its two faults this way: NOTES.md).
 *
 * --ahead: the engine priced k = 0 at a queued-ahead plain step (a GPU's
 * engine with launch ahead): its "queued-ahead step" and "hidden by
 * queueing ahead" lines are fed too (no pick after a queued-ahead step:
 * the engine makes none while no request tracks the proposer), each
 * queued-ahead step with the keys of the step line before it, and each
 * pick with the keys of the last step line, a request's rows' keys as
 * one row's, and a token more a request (the engine's sd_adaptive.keys);
 * so are its "draft-ahead step" lines (what drafting ahead hides).
 *
 * --rate R: at each cohort's start and end the log shows, and where it
 * turned speculation off for the running requests, the demand pick
 * (sd_adaptive_demand_k) at that batch for R tokens/ms (else the rate of
 * the log's last "demand pick" line), with every price its scan reads.
 *
 * usage: specd-adaptive-replay [--accept P] [--k-max K] [--ahead] [--rate R] [--quiet] < LOG */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/adaptive.h"
#include "engine/internal.h"

/* 1000 drafts of k_max with P(the first j accepted) = p^j, as quantiles */
static void accept_counts(sd_accept_stats *acc, double p, int k_max)
{
    memset(acc, 0, sizeof *acc);
    for (int i = 0; i < 1000; i++) {
        double u = (i + 0.5) / 1000, pj = 1;
        int n = 0;
        while (n < k_max && u < (pj *= p))
            n++;
        sd_accept_stats_add(acc, k_max, n);
    }
}

int main(int argc, char **argv)
{
    double p = 0.9;
    int k_max = 4, quiet = 0, ahead = 0;
    double rate = 0; /* tokens/ms: --rate, else the log's last demand pick's */
    int rate_given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--accept") && i + 1 < argc)
            p = atof(argv[++i]);
        else if (!strcmp(argv[i], "--k-max") && i + 1 < argc)
            k_max = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quiet"))
            quiet = 1;
        else if (!strcmp(argv[i], "--ahead"))
            ahead = 1;
        else if (!strcmp(argv[i], "--rate") && i + 1 < argc) {
            rate = atof(argv[++i]);
            rate_given = 1;
        }
        else {
            fprintf(stderr,
                    "usage: %s [--accept P] [--k-max K] [--ahead] [--rate R] [--quiet] < LOG\n",
                    argv[0]);
            return 2;
        }
    }
    if (p < 0 || p > 1 || k_max < 1 || k_max > SD_ACCEPT_POSITIONS) {
        fprintf(stderr, "%s: --accept takes 0..1, --k-max 1..%d\n", argv[0], SD_ACCEPT_POSITIONS);
        return 2;
    }
    sd_adaptive a;
    sd_adaptive_init(&a, k_max);
    a.ahead = ahead;
    sd_accept_stats acc;
    accept_counts(&acc, p, k_max);
    char line[1024];
    long n_target = 0, n_draft = 0, offs = 0, by_k[SD_ACCEPT_POSITIONS + 1] = {0};
    int last = -1, zeros = 0;
    long long keys = 0; /* the last step line's keys */
    while (fgets(line, sizeof line, stdin)) {
        const char *sl = strstr(line, "debug: target step: ");
        const char *kw = sl ? strstr(sl, " keys") : NULL;
        if (kw) { /* "... ms, N keys" */
            const char *num = kw;
            while (num > sl && num[-1] >= '0' && num[-1] <= '9')
                num--;
            keys = atoll(num);
            continue;
        }
        const char *dp = strstr(line, "adaptive k: demand pick ");
        const char *co = strstr(line, "adaptive k: a cohort at batch ");
        const char *ce = strstr(line, "adaptive k: the cohort ends at batch ");
        double r;
        int cb;
        if (dp && !rate_given &&
            sscanf(dp, "adaptive k: demand pick %*d at batch %*d (step %*d): %lf", &r) == 1)
            rate = r;
        const char *so = strstr(line, "steps: speculation off for the ");
        if ((co && sscanf(co, "adaptive k: a cohort at batch %d", &cb) == 1) ||
            (ce && sscanf(ce, "adaptive k: the cohort ends at batch %d", &cb) == 1) ||
            (so && sscanf(so, "steps: speculation off for the %d", &cb) == 1)) {
            printf("step %llu: %s at batch %d: demand %.1f tokens/ms\n",
                   (unsigned long long)a.steps,
                   co ? "a cohort" : ce ? "the cohort ends" : "speculation off", cb, rate);
            const int k = sd_adaptive_demand_trace(&a, &acc, rate * 1e3, cb, stdout);
            int bp = 0, bk = 0;
            sd_adaptive_demand_k(&a, &acc, rate * 1e3, cb, &bp, &bk);
            printf("  demand pick %d: plain serves it at %d requests, drafting at %d\n", k, bp, bk);
            continue;
        }
        const char *t = strstr(line, "adaptive k: target step: rows x batch ");
        const char *d = strstr(line, "adaptive k: drafting phase: requests x k ");
        const char *q = strstr(line, "adaptive k: queued-ahead step: rows x batch ");
        const char *h = strstr(line, "adaptive k: hidden by queueing ahead: 1 x batch ");
        const char *da = strstr(line, "adaptive k: draft-ahead step: drafting x batch ");
        int x, y, z;
        double ms;
        if (da && sscanf(da, "adaptive k: draft-ahead step: drafting x batch %d x %d, k %d: %lf ms",
                         &x, &y, &z, &ms) == 4) {
            sd_adaptive_observe_draft_ahead(&a, y, x, z, ms * 1e-3);
            continue;
        }
        if (q && sscanf(q, "adaptive k: queued-ahead step: rows x batch %d x %d: %lf ms", &x, &y,
                        &ms) == 3) {
            sd_adaptive_observe_ahead(&a, y, x, ms * 1e-3, (double)keys);
            continue;
        }
        if (h && sscanf(h, "adaptive k: hidden by queueing ahead: 1 x batch %d x %d: %lf ms", &x,
                        &y, &ms) == 3) {
            sd_adaptive_observe_hidden(&a, y, ms * 1e-3);
            continue;
        }
        if (d && sscanf(d, "adaptive k: drafting phase: requests x k %d x %d: %lf ms", &x, &y,
                        &ms) == 3) {
            sd_adaptive_observe_draft(&a, x, y, ms * 1e-3);
            n_draft++;
            continue;
        }
        if (!t || sscanf(t, "adaptive k: target step: rows x batch %d x %d: %lf ms", &x, &y, &ms) != 3)
            continue;
        sd_adaptive_observe_target(&a, y, x, ms * 1e-3);
        n_target++;
        a.keys = keys > 0 ? (double)keys * y / x + y : 0; /* a row a request */
        int k = sd_adaptive_pick_k(&a, &acc, y, y);
        by_k[k]++;
        if (k != last && !quiet)
            printf("step %llu batch %d: k %d\n", (unsigned long long)a.steps, y, k);
        last = k;
        zeros = k == 0 && !a.exploring ? zeros + 1 : 0;
        if (zeros == SD_SPEC_OFF_AFTER) {
            offs++;
            printf("step %llu batch %d: k = 0 for %d picks: speculation off\n",
                   (unsigned long long)a.steps, y, SD_SPEC_OFF_AFTER);
        }
    }
    printf("%ld target steps, %ld drafting phases; picks by k:", n_target, n_draft);
    for (int k = 0; k <= k_max; k++)
        printf(" %ld", by_k[k]);
    printf("; speculation off %ld times\n", offs);
    return n_target > 0 ? 0 : 1;
}

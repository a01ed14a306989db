/* tests/engine/engine_run.h: what the engine's request callbacks deliver,
 * kept per request (under one mutex that a test's requests share), and a
 * wait for a set of requests to finish. */
#ifndef SD_TESTS_ENGINE_RUN_H
#define SD_TESTS_ENGINE_RUN_H

#include <pthread.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "engine/engine.h"

#define ENGINE_OUT_MAX 64 /* token ids kept per request; later ones are counted in calls only */

typedef struct engine_out {
    pthread_mutex_t *mu;
    int32_t ids[ENGINE_OUT_MAX];
    int n, calls, done; /* ids kept; output calls that carried tokens; finished */
    /* with sd_gen_params.logprobs: entries delivered, and those not a log
     * probability (> 0 or NaN) or, where greedy is set, whose token is not
     * its position's likeliest */
    int greedy, n_lp, lp_bad;
    sd_finish why;
    sd_req_stats st;
} engine_out;

static inline void engine_out_on_output(void *u, const char *t, size_t l, const int32_t *ids, int n)
{
    (void)t;
    (void)l;
    engine_out *o = u;
    pthread_mutex_lock(o->mu);
    for (int i = 0; i < n && o->n < ENGINE_OUT_MAX; i++)
        o->ids[o->n++] = ids[i];
    if (n)
        o->calls++;
    pthread_mutex_unlock(o->mu);
}

static inline void engine_out_on_logprobs(void *u, const int32_t *ids, const sd_token_logprob *lp,
                                          int n)
{
    engine_out *o = u;
    pthread_mutex_lock(o->mu);
    for (int i = 0; i < n; i++) {
        o->n_lp++;
        o->lp_bad += !(lp[i].logprob <= 0) ||
                     (o->greedy && lp[i].n_top > 0 && lp[i].top_ids[0] != ids[i]);
    }
    pthread_mutex_unlock(o->mu);
}

static inline void engine_out_on_finish(void *u, sd_finish why, const sd_req_stats *st,
                                        const char *msg)
{
    (void)msg;
    engine_out *o = u;
    pthread_mutex_lock(o->mu);
    o->why = why;
    o->st = *st;
    o->done = 1;
    pthread_mutex_unlock(o->mu);
}

/* An engine of the options o (freed, with model, the path the test made
 * for them), or NULL with the reason printed */
static inline sd_engine *engine_of_opts(sd_opts *o, char *model)
{
    sd_engine *e = NULL;
    sd_err err = {0};
    if (sd_engine_create(&e, o, &err))
        fprintf(stderr, "  engine: %s\n", err.msg);
    free(model);
    sd_opts_free(o);
    return e;
}

/* Waits (1 ms polls, up to max_ms) until outs[0..n) are all done; returns 1
 * when they are, 0 on time-out (the caller's asserts then say what is missing). */
static inline int engine_out_wait(engine_out *outs, int n, int max_ms)
{
    for (int spin = 0; spin < max_ms; spin++) {
        int all = 1;
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(outs[i].mu);
            all &= outs[i].done;
            pthread_mutex_unlock(outs[i].mu);
        }
        if (all)
            return 1;
        usleep(1000);
    }
    return 0;
}

/* Greedy tokens (max_tokens each, end of text ignored) of
 * ENGINE_GREEDY_REQS short requests of fixed ids through an engine of the
 * options opts (name, value pairs, NULL-terminated; one thread a rank,
 * max context 256) into res; 0, or -1 with the reason printed. */
#define ENGINE_GREEDY_REQS 4
static inline int engine_greedy(const char *const *opts, engine_out *res, int max_tokens)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return -1;
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "1", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "256", &err);
    for (int i = 0; opts[i] && opts[i + 1]; i += 2)
        if (sd_opts_set(&o, SD_CMD_GENERATE, opts[i], opts[i + 1], &err)) {
            fprintf(stderr, "  --%s %s: %s\n", opts[i], opts[i + 1], err.msg);
            sd_opts_free(&o);
            return -1;
        }
    sd_engine *e = engine_of_opts(&o, NULL);
    if (!e)
        return -1;
    sd_req_events ev = {.on_output = engine_out_on_output, .on_finish = engine_out_on_finish};
    int rc = 0;
    for (int i = 0; i < ENGINE_GREEDY_REQS && !rc; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].mu = &mu;
        int32_t p[8];
        for (int j = 0; j < 8; j++)
            p[j] = (int32_t)((97 * i + 31 * j + 5) % 500);
        sd_gen_params gp = {.max_tokens = max_tokens, .top_p = 1, .ignore_eos = 1};
        rc = sd_engine_submit(e, p, 3 + i, &gp, &ev, &res[i], NULL, &err);
    }
    if (rc)
        fprintf(stderr, "  submit: %s\n", err.msg);
    else if (!engine_out_wait(res, ENGINE_GREEDY_REQS, 60000))
        rc = -1;
    sd_engine_destroy(e);
    return rc;
}

#endif

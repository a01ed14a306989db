/* engine/tp_runner: one sequence through the tensor-parallel ranks of a
 * model, outside the engine (`specd logits --tp N`, the TP tests). The ranks
 * are the engine's (engine/tp.c): a backend per rank (GPU r, or CPU threads),
 * the thread or the GPU communicator, the rank threads; each call runs
 * sd_runner_target / sd_runner_mtp on every rank at once. */
#include <stdlib.h>
#include <string.h>

#include "engine/tp.h"

struct sd_tp_runner {
    sd_tp *tp;
    int n;
    sd_model *m[SD_TP_MAX];
    int broken; /* a step failed: the communicator is aborted */
};

int sd_tp_runner_size(const sd_tp_runner *t) { return t->n; }

sd_model *sd_tp_runner_model(sd_tp_runner *t, int rank)
{
    return rank >= 0 && rank < t->n ? t->m[rank] : NULL;
}

void sd_tp_runner_close(sd_tp_runner *t)
{
    if (!t)
        return;
    for (int r = 0; r < t->n; r++)
        sd_model_free(t->m[r]);
    sd__tp_close(t->tp);
    free(t);
}

int sd_tp_runner_open(sd_tp_runner **out, const char *dir, const sd_opts *o,
                      const sd_model_opts *mo, sd_err *err)
{
    *out = NULL;
    sd_model_cfg pre;
    int rc = sd_model_cfg_load(&pre, dir, err);
    if (rc)
        return rc;
    sd_tp_runner *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    if ((rc = sd__tp_open(&t->tp, o, pre.hidden_size, err)))
        goto fail;
    t->n = sd__tp_size(t->tp);
    for (int r = 0; r < t->n; r++) {
        sd_model_opts m = *mo;
        m.tp_rank = sd__tp_rank0(t->tp) + r;
        m.tp_size = sd__tp_total(t->tp);
        m.comm = sd__tp_comm(t->tp);
        if ((rc = sd_model_load(&t->m[r], dir, sd__tp_rank_backend(t->tp, r), &m, err)))
            goto fail;
    }
    /* GPU ranks: the all-reduce per message size, timed for the residual
     * sums of 1, 2, 4, ... tokens up to the workspace (CPU ranks: nothing) */
    size_t sizes[SD_AR_SIZES];
    int ns = 0;
    int max_tok = mo->max_tokens > 0 ? mo->max_tokens : 1;
    for (int k = 1; ns < SD_AR_SIZES; k *= 2) {
        int tok = k < max_tok ? k : max_tok;
        sizes[ns++] = (size_t)tok * (size_t)pre.hidden_size;
        if (tok == max_tok)
            break;
    }
    if ((rc = sd__tp_tune(t->tp, sizes, ns, err)))
        goto fail;
    *out = t;
    return 0;
fail:
    sd_tp_runner_close(t);
    return rc;
}

typedef struct alloc_job {
    sd_tp_runner *t;
    int n_slots;
} alloc_job;

static int alloc_rank(void *ctx, int r, sd_err *err)
{
    alloc_job *j = ctx;
    return sd_model_alloc_kv(j->t->m[r], j->n_slots, err);
}

int sd_tp_runner_alloc_kv(sd_tp_runner *t, int n_slots, sd_err *err)
{
    alloc_job j = {t, n_slots};
    return sd__tp_each(t->tp, alloc_rank, &j, err);
}

typedef struct run_job {
    sd_tp_runner *t;
    const int32_t *ids;
    const float *in_hidden;
    int n, start, mtp;
    sd_seq_out out[SD_TP_MAX]; /* rank 0: the caller's; ranks > 0: their own */
} run_job;

static int run_rank(void *ctx, int r, sd_err *err)
{
    run_job *j = ctx;
    sd_model *m = j->t->m[r];
    return j->mtp ? sd_runner_mtp(m, j->ids, j->in_hidden, j->n, j->start, &j->out[r], err)
                  : sd_runner_target(m, j->ids, j->n, j->start, &j->out[r], err);
}

/* Bit-wise equality of rank r's output with rank 0's. */
static int same_out(const float *a, const float *b, size_t n)
{
    return !a || !b || !memcmp(a, b, n * sizeof(float));
}

static int tp_run(sd_tp_runner *t, const int32_t *ids, const float *in_hidden, int n, int start,
                  const sd_seq_out *o, int mtp, sd_err *err)
{
    if (t->broken)
        return sd_err_set(err, SD_ESTATE,
                          "tensor parallel group: an earlier step failed; reopen the model");
    const sd_model_cfg *c = sd_model_cfg_of(t->m[0]);
    size_t nl = (size_t)n * (size_t)c->vocab_size, nh = (size_t)n * (size_t)c->hidden_size;
    run_job *j = calloc(1, sizeof *j);
    if (!j)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    *j = (run_job){.t = t, .ids = ids, .in_hidden = in_hidden, .n = n, .start = start, .mtp = mtp};
    j->out[0] = *o;
    int rc = 0;
    /* ranks > 0 write into their own buffers (compared with rank 0's after) */
    for (int r = 1; r < t->n && !rc; r++) {
        sd_seq_out *q = &j->out[r];
        q->logits = o->logits ? malloc(nl * sizeof(float)) : NULL;
        q->hidden = o->hidden ? malloc(nh * sizeof(float)) : NULL;
        q->out_hidden = o->out_hidden ? malloc(nh * sizeof(float)) : NULL;
        if ((o->logits && !q->logits) || (o->hidden && !q->hidden) ||
            (o->out_hidden && !q->out_hidden))
            rc = sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    if (!rc && (rc = sd__tp_each(t->tp, run_rank, j, err)))
        t->broken = 1;
    for (int r = 1; r < t->n && !rc; r++) {
        const sd_seq_out *q = &j->out[r];
        if (!same_out(q->logits, o->logits, nl) || !same_out(q->hidden, o->hidden, nh) ||
            !same_out(q->out_hidden, o->out_hidden, nh))
            rc = sd_err_set(err, SD_ESTATE,
                            "tensor parallel: rank %d's outputs differ from rank 0's (the ranks' "
                            "replicated state diverged)",
                            r);
    }
    for (int r = 1; r < t->n; r++) {
        free(j->out[r].logits);
        free(j->out[r].hidden);
        free(j->out[r].out_hidden);
    }
    free(j);
    return rc;
}

int sd_tp_runner_target(sd_tp_runner *t, const int32_t *ids, int n, int start,
                        const sd_seq_out *o, sd_err *err)
{
    return tp_run(t, ids, NULL, n, start, o, 0, err);
}

int sd_tp_runner_mtp(sd_tp_runner *t, const int32_t *ids, const float *in_hidden, int n,
                     int start, const sd_seq_out *o, sd_err *err)
{
    return tp_run(t, ids, in_hidden, n, start, o, 1, err);
}

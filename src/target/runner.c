#include "target/runner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"

#define RUN_BLOCK 16

typedef struct dev_batch {
    sd_backend *be;
    int32_t *tok, *pos, *seq, *slot, *table, *rows;
    float *logits, *hidden, *in_hidden, *out_hidden;
} dev_batch;

static void dev_free(dev_batch *d)
{
    void *ps[] = {d->tok, d->pos, d->seq, d->slot, d->table, d->rows,
                  d->logits, d->hidden, d->in_hidden, d->out_hidden};
    for (size_t i = 0; i < SD_ARRAY_LEN(ps); i++)
        if (ps[i])
            d->be->ops->free(d->be, ps[i]);
}

static int run(sd_model *m, const int32_t *ids, const float *in_hidden, int n, int start,
               const sd_seq_out *o, int mtp, sd_err *err)
{
    sd_backend *be = sd_model_backend(m);
    const sd_model_cfg *c = sd_model_cfg_of(m);
    int V = c->vocab_size, D = c->hidden_size;
    int chunk = n < 256 ? n : 256;
    int total = start + n;
    int nblk = (total + RUN_BLOCK - 1) / RUN_BLOCK;
    dev_batch d = {.be = be};
    size_t ib = (size_t)chunk * sizeof(int32_t);
    d.tok = be->ops->alloc(be, ib);
    d.pos = be->ops->alloc(be, ib);
    d.seq = be->ops->alloc(be, ib);
    d.slot = be->ops->alloc(be, ib);
    d.rows = be->ops->alloc(be, ib);
    d.table = be->ops->alloc(be, (size_t)nblk * sizeof(int32_t));
    d.logits = o->logits ? be->ops->alloc(be, (size_t)chunk * V * sizeof(float)) : NULL;
    d.hidden = o->hidden ? be->ops->alloc(be, (size_t)chunk * D * sizeof(float)) : NULL;
    d.out_hidden = o->out_hidden ? be->ops->alloc(be, (size_t)chunk * D * sizeof(float)) : NULL;
    d.in_hidden = mtp ? be->ops->alloc(be, (size_t)chunk * D * sizeof(float)) : NULL;
    int32_t *h = malloc(ib * 4 + (size_t)nblk * sizeof(int32_t));
    int rc = 0;
    if (!d.tok || !d.pos || !d.seq || !d.slot || !d.rows || !d.table || !h ||
        (o->logits && !d.logits) || (o->hidden && !d.hidden) || (mtp && !d.in_hidden) ||
        (o->out_hidden && !d.out_hidden)) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto done;
    }
    int32_t *hpos = h, *hseq = h + chunk, *hrows = h + 2 * chunk, *htab = h + 4 * chunk;
    for (int b = 0; b < nblk; b++)
        htab[b] = b;
    be->ops->upload(be, d.table, htab, (size_t)nblk * sizeof(int32_t));
    for (int i = 0; i < chunk; i++) {
        hseq[i] = 0;
        hrows[i] = i;
    }
    be->ops->upload(be, d.seq, hseq, ib);
    be->ops->upload(be, d.rows, hrows, ib);
    for (int off = 0; off < n; off += chunk) {
        int T = n - off < chunk ? n - off : chunk;
        for (int i = 0; i < T; i++)
            hpos[i] = start + off + i;
        be->ops->upload(be, d.tok, ids + off, (size_t)T * sizeof(int32_t));
        be->ops->upload(be, d.pos, hpos, (size_t)T * sizeof(int32_t));
        be->ops->upload(be, d.slot, hpos, (size_t)T * sizeof(int32_t));
        if (mtp)
            be->ops->upload(be, d.in_hidden, in_hidden + (size_t)off * D,
                            (size_t)T * D * sizeof(float));
        sd_fwd f = {
            .ab = {.n_tokens = T, .pos = d.pos, .seq = d.seq, .slot = d.slot,
                   .block_table = d.table, .max_blocks = nblk, .block_size = RUN_BLOCK,
                   .max_pos = start + off + T},
            .tokens = d.tok,
            .n_out = o->logits ? T : 0,
            .out_rows = d.rows,
            .logits = d.logits,
            .hidden = d.hidden,
            .in_hidden = d.in_hidden,
            .out_hidden = d.out_hidden,
        };
        rc = mtp ? sd_model_mtp_forward(m, &f, err) : sd_model_forward(m, &f, err);
        if (!rc && (rc = be->ops->sync(be)))
            sd_err_set(err, rc, "%s backend: step failed", be->ops->name);
        if (rc)
            goto done;
        if (o->logits)
            be->ops->download(be, o->logits + (size_t)off * V, d.logits,
                              (size_t)T * V * sizeof(float));
        if (o->hidden)
            be->ops->download(be, o->hidden + (size_t)off * D, d.hidden,
                              (size_t)T * D * sizeof(float));
        if (o->out_hidden)
            be->ops->download(be, o->out_hidden + (size_t)off * D, d.out_hidden,
                              (size_t)T * D * sizeof(float));
    }
done:
    free(h);
    dev_free(&d);
    return rc;
}

int sd_runner_target(sd_model *m, const int32_t *ids, int n, int start, const sd_seq_out *o,
                     sd_err *err)
{
    return run(m, ids, NULL, n, start, o, 0, err);
}

int sd_runner_mtp(sd_model *m, const int32_t *ids, const float *in_hidden, int n, int start,
                  const sd_seq_out *o, sd_err *err)
{
    return run(m, ids, in_hidden, n, start, o, 1, err);
}

/* ------------------------------------------------------- tensor parallel */

#define TP_MAX 64

struct sd_tp_runner {
    int tp;
    sd_comm *comm;
    sd_backend *be[TP_MAX];
    sd_model *m[TP_MAX];
    int broken; /* a step failed: the communicator is aborted */
};

int sd_tp_runner_size(const sd_tp_runner *t) { return t->tp; }
sd_model *sd_tp_runner_model(sd_tp_runner *t, int rank)
{
    return rank >= 0 && rank < t->tp ? t->m[rank] : NULL;
}

void sd_tp_runner_close(sd_tp_runner *t)
{
    if (!t)
        return;
    for (int r = 0; r < t->tp; r++) {
        sd_model_free(t->m[r]);
        if (t->be[r])
            sd_cpu_backend_destroy(t->be[r]);
    }
    sd_comm_destroy(t->comm);
    free(t);
}

int sd_tp_runner_open(sd_tp_runner **out, const char *dir, int tp, int threads,
                      const sd_model_opts *o, sd_err *err)
{
    *out = NULL;
    if (tp < 1 || tp > TP_MAX)
        return sd_err_set(err, SD_EINVAL, "--tp %d: 1..%d ranks", tp, TP_MAX);
    sd_tp_runner *t = calloc(1, sizeof *t);
    if (!t)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->tp = tp;
    int rc = sd_thread_comm_create(&t->comm, tp, err);
    if (rc)
        goto fail;
    if (threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (int)nc : 1;
    }
    int per = threads / tp > 0 ? threads / tp : 1;
    for (int r = 0; r < tp; r++) {
        if (sd_cpu_backend_create(&t->be[r], per)) {
            rc = sd_err_set(err, SD_ENOMEM, "cannot start the CPU backend of rank %d", r);
            goto fail;
        }
        t->be[r]->rank = r;
        sd_model_opts mo = *o;
        mo.tp_rank = r;
        mo.tp_size = tp;
        mo.comm = t->comm;
        if ((rc = sd_model_load(&t->m[r], dir, t->be[r], &mo, err)))
            goto fail;
    }
    *out = t;
    return 0;
fail:
    sd_tp_runner_close(t);
    return rc;
}

int sd_tp_runner_alloc_kv(sd_tp_runner *t, int n_slots, sd_err *err)
{
    for (int r = 0; r < t->tp; r++) {
        int rc = sd_model_alloc_kv(t->m[r], n_slots, err);
        if (rc)
            return rc;
    }
    return 0;
}

typedef struct tp_job {
    sd_tp_runner *t;
    int rank;
    const int32_t *ids;
    const float *in_hidden;
    int n, start, mtp;
    sd_seq_out out;
    int rc;
    sd_err err;
} tp_job;

static void *tp_rank_main(void *arg)
{
    tp_job *j = arg;
    j->rc = run(j->t->m[j->rank], j->ids, j->in_hidden, j->n, j->start, &j->out, j->mtp, &j->err);
    if (j->rc)
        sd_comm_abort(j->t->comm); /* the others may wait for this rank */
    return NULL;
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
    tp_job *jobs = calloc((size_t)t->tp, sizeof *jobs);
    pthread_t *tid = calloc((size_t)t->tp, sizeof *tid);
    char *started = calloc((size_t)t->tp, 1);
    int rc = 0;
    if (!jobs || !tid || !started) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto done;
    }
    /* ranks > 0 write into their own buffers (compared with rank 0's after) */
    for (int r = 0; r < t->tp; r++) {
        tp_job *j = &jobs[r];
        *j = (tp_job){.t = t, .rank = r, .ids = ids, .in_hidden = in_hidden, .n = n,
                      .start = start, .mtp = mtp, .out = *o};
        if (r == 0)
            continue;
        j->out.logits = o->logits ? malloc(nl * sizeof(float)) : NULL;
        j->out.hidden = o->hidden ? malloc(nh * sizeof(float)) : NULL;
        j->out.out_hidden = o->out_hidden ? malloc(nh * sizeof(float)) : NULL;
        if ((o->logits && !j->out.logits) || (o->hidden && !j->out.hidden) ||
            (o->out_hidden && !j->out.out_hidden)) {
            rc = sd_err_set(err, SD_ENOMEM, "out of memory");
            goto done;
        }
    }
    for (int r = 1; r < t->tp; r++) {
        if (pthread_create(&tid[r], NULL, tp_rank_main, &jobs[r])) {
            sd_comm_abort(t->comm);
            rc = sd_err_set(err, SD_ENOMEM, "cannot start the thread of rank %d", r);
            break;
        }
        started[r] = 1;
    }
    if (!rc)
        tp_rank_main(&jobs[0]);
    for (int r = 1; r < t->tp; r++)
        if (started[r])
            pthread_join(tid[r], NULL);
    if (rc) {
        t->broken = 1;
        goto done;
    }
    /* the first real failure (not a rank woken by another's abort) */
    int fr = -1;
    for (int r = 0; r < t->tp && fr < 0; r++)
        if (jobs[r].rc && jobs[r].rc != SD_ECANCELED)
            fr = r;
    for (int r = 0; r < t->tp && fr < 0; r++)
        if (jobs[r].rc)
            fr = r;
    if (fr >= 0) {
        t->broken = 1;
        *err = jobs[fr].err;
        rc = jobs[fr].rc;
        goto done;
    }
    for (int r = 1; r < t->tp; r++) {
        const sd_seq_out *q = &jobs[r].out;
        if (!same_out(q->logits, o->logits, nl) || !same_out(q->hidden, o->hidden, nh) ||
            !same_out(q->out_hidden, o->out_hidden, nh)) {
            rc = sd_err_set(err, SD_ESTATE,
                            "tensor parallel: rank %d's outputs differ from rank 0's (the ranks' "
                            "replicated state diverged)",
                            r);
            break;
        }
    }
done:
    if (jobs)
        for (int r = 1; r < t->tp; r++) {
            free(jobs[r].out.logits);
            free(jobs[r].out.hidden);
            free(jobs[r].out.out_hidden);
        }
    free(jobs);
    free(tid);
    free(started);
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

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

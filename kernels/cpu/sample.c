/* CPU: argmax, sampling and greedy verification of whole batches. The math is
 * src/verify's (sd_argmax, sd_sampling_probs, sd_rand_uniform, sd_sample,
 * sd_accept_greedy): these ops only lay it over rows, so there is one
 * definition of the distribution a request samples from. */
#include "kernels/cpu/cpu.h"
#include "verify/accept.h"
#include "verify/sampling.h"

typedef struct argmax_ctx {
    int32_t *out;
    const float *x;
    int V;
} argmax_ctx;

static void argmax_task(void *vctx, int b, int e, int thread)
{
    (void)thread;
    argmax_ctx *c = vctx;
    for (int r = b; r < e; r++)
        c->out[r] = sd_argmax(c->x + (size_t)r * (size_t)c->V, c->V);
}

void sd__cpu_argmax_rows(sd_backend *be, int32_t *out, const float *x, int n, int V)
{
    if (n <= 0 || V <= 0)
        return;
    argmax_ctx c = {out, x, V};
    sd__cpu_parallel(be, n, (size_t)V, argmax_task, &c);
}

typedef struct sample_ctx {
    int32_t *out;
    float *probs;
    const float *logits;
    const sd_sample_params *p;
    int V;
} sample_ctx;

static void sample_task(void *vctx, int b, int e, int thread)
{
    (void)thread;
    sample_ctx *c = vctx;
    for (int r = b; r < e; r++) {
        const sd_sample_params *p = &c->p[r];
        sd_sampling s = {p->temperature, p->top_p, p->top_k, p->seed};
        float *pr = c->probs + (size_t)r * (size_t)c->V;
        sd_sampling_probs(c->logits + (size_t)r * (size_t)c->V, c->V, &s, pr);
        /* a greedy row is one-hot at the argmax: sd_sample returns it */
        c->out[r] = sd_sample(pr, c->V, sd_rand_uniform(p->seed, p->counter, p->stream));
    }
}

void sd__cpu_sample_rows(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                         const sd_sample_params *p, int n, int V)
{
    if (n <= 0 || V <= 0)
        return;
    sample_ctx c = {out, probs_scratch, logits, p, V};
    sd__cpu_parallel(be, n, 4 * (size_t)V, sample_task, &c);
}

void sd__cpu_accept_greedy_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                const int32_t *draft, const int32_t *target_argmax, int n_seq,
                                int k)
{
    (void)be;
    if (k < 0)
        return;
    for (int s = 0; s < n_seq; s++)
        n_acc[s] = sd_accept_greedy(k, draft + (size_t)s * (size_t)k,
                                    target_argmax + (size_t)s * (size_t)(k + 1),
                                    out_tok + (size_t)s * (size_t)(k + 1));
}

/* ---- accept_sample_rows: sd_accept_chain over a batch ------------------------
 * Two passes: the target distribution of every row of every sequence (rows
 * are independent, so split across threads), then each sequence's chain
 * (sd_accept_chain reads those rows). */

typedef struct accept_ctx {
    int32_t *n_acc, *out_tok;
    float *probs;
    const float *logits, *q;
    const int32_t *row0, *draft, *n_draft;
    const sd_sample_params *p;
    int k, V;
} accept_ctx;

/* drafts of sequence s, or -1 when n_draft[s] is outside 0..k */
static int accept_kd(const accept_ctx *c, int s)
{
    int kd = c->n_draft ? c->n_draft[s] : c->k;
    return kd >= 0 && kd <= c->k ? kd : -1;
}

static size_t accept_row0(const accept_ctx *c, int s)
{
    return c->row0 ? (size_t)c->row0[s] : (size_t)s * (size_t)(c->k + 1);
}

static sd_sampling accept_sampling(const sd_sample_params *p)
{
    return (sd_sampling){p->temperature, p->top_p, p->top_k, p->seed};
}

/* task index j = s * (k + 1) + i: row i of sequence s */
static void accept_probs_task(void *vctx, int b, int e, int thread)
{
    (void)thread;
    accept_ctx *c = vctx;
    const size_t V = (size_t)c->V;
    for (int j = b; j < e; j++) {
        int s = j / (c->k + 1), i = j % (c->k + 1);
        if (i > accept_kd(c, s))
            continue;
        size_t r = accept_row0(c, s) + (size_t)i;
        sd_sampling smp = accept_sampling(&c->p[s]);
        sd_sampling_probs(c->logits + r * V, c->V, &smp, c->probs + r * V);
    }
}

static void accept_chain_task(void *vctx, int b, int e, int thread)
{
    (void)thread;
    accept_ctx *c = vctx;
    const size_t V = (size_t)c->V, k = (size_t)c->k;
    for (int s = b; s < e; s++) {
        int kd = accept_kd(c, s);
        if (kd < 0) {
            c->n_acc[s] = SD_EINVAL;
            continue;
        }
        sd_sampling smp = accept_sampling(&c->p[s]);
        /* a draft outside the vocabulary: SD_EINVAL, nothing written; draft
         * and q may be NULL when k == 0 (no offset on them then) */
        const int32_t *d = k ? c->draft + (size_t)s * k : c->draft;
        c->n_acc[s] = sd_accept_chain(&smp, c->V, kd, d,
                                      c->probs + accept_row0(c, s) * V,
                                      c->q && k ? c->q + (size_t)s * k * V : NULL,
                                      c->p[s].counter,
                                      c->out_tok + (size_t)s * (k + 1), NULL);
    }
}

void sd__cpu_accept_sample_rows(sd_backend *be, int32_t *n_acc, int32_t *out_tok,
                                float *probs_scratch, const float *logits, const int32_t *row0,
                                const float *q, const int32_t *draft, const int32_t *n_draft,
                                const sd_sample_params *p, int n_seq, int k, int V)
{
    if (n_seq <= 0 || k < 0 || V <= 0)
        return;
    accept_ctx c = {n_acc, out_tok, probs_scratch, logits, q, row0, draft, n_draft, p, k, V};
    sd__cpu_parallel(be, n_seq * (k + 1), 4 * (size_t)V, accept_probs_task, &c);
    sd__cpu_parallel(be, n_seq, (size_t)(k + 1) * (size_t)V, accept_chain_task, &c);
}

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
    sd__cpu_parallel(be, n, argmax_task, &c);
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
        c->out[r] = sd_sample(pr, c->V, sd_rand_uniform(p->seed, p->counter, SD_RNG_TARGET));
    }
}

void sd__cpu_sample_rows(sd_backend *be, int32_t *out, float *probs_scratch, const float *logits,
                         const sd_sample_params *p, int n, int V)
{
    if (n <= 0 || V <= 0)
        return;
    sample_ctx c = {out, probs_scratch, logits, p, V};
    sd__cpu_parallel(be, n, sample_task, &c);
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

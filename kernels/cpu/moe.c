/* CPU reference: DeepSeek-V3 MoE routing and the routed experts.
 * Routing follows DeepSeek-V3 (and HF's DeepseekV3TopkRouter): sigmoid scores;
 * the correction bias only steers the choice; groups ranked by the sum of
 * their two best biased scores; experts outside the chosen groups score 0;
 * weights are the unbiased scores of the chosen experts, optionally
 * normalized, times routed_scaling_factor. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define MAX_EXPERTS 1024

/* index of the largest of v[0..n) not yet taken (lowest index on ties) */
static int argmax_free(const float *v, const unsigned char *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

void sd__cpu_moe_route(sd_backend *be, int32_t *ids, float *wts, const float *logits,
                       const float *bias, int n, const sd_moe_route *r)
{
    (void)be;
    int E = r->n_experts, K = r->top_k, W = K + (r->n_always > 0 ? r->n_always : 0);
    float scores[MAX_EXPERTS], choice[MAX_EXPERTS], gscore[MAX_EXPERTS];
    unsigned char taken[MAX_EXPERTS], gsel[MAX_EXPERTS];
    if (E > MAX_EXPERTS)
        return;
    for (int t = 0; t < n; t++) {
        const float *lg = logits + (size_t)t * (size_t)E;
        if (r->sigmoid) {
            for (int e = 0; e < E; e++)
                scores[e] = 1.0f / (1.0f + expf(-lg[e]));
        } else {
            float m = -INFINITY, s = 0;
            for (int e = 0; e < E; e++)
                m = lg[e] > m ? lg[e] : m;
            for (int e = 0; e < E; e++)
                s += (scores[e] = expf(lg[e] - m));
            for (int e = 0; e < E; e++)
                scores[e] /= s;
        }
        for (int e = 0; e < E; e++)
            choice[e] = scores[e] + (bias ? bias[e] : 0.0f);
        int G = r->n_group > 1 ? r->n_group : 1;
        if (G > 1 && r->topk_group < G) {
            int per = E / G;
            for (int g = 0; g < G; g++) {
                /* sum of the group's two best biased scores */
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    float v = choice[e];
                    if (v > b1) {
                        b2 = b1;
                        b1 = v;
                    } else if (v > b2) {
                        b2 = v;
                    }
                }
                gscore[g] = per >= 2 ? b1 + b2 : b1;
            }
            memset(taken, 0, (size_t)G);
            memset(gsel, 0, (size_t)G);
            for (int k = 0; k < r->topk_group; k++) {
                int g = argmax_free(gscore, taken, G);
                taken[g] = 1;
                gsel[g] = 1;
            }
            for (int e = 0; e < E; e++)
                if (!gsel[e / per])
                    choice[e] = 0.0f; /* as DeepSeek-V3 masks: 0, not -inf */
        }
        memset(taken, 0, (size_t)E);
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int e = argmax_free(choice, taken, E);
            taken[e] = 1;
            ids[(size_t)t * (size_t)W + (size_t)k] = e;
            wts[(size_t)t * (size_t)W + (size_t)k] = scores[e];
            sum += scores[e];
        }
        for (int k = 0; k < K; k++) {
            float *w = &wts[(size_t)t * (size_t)W + (size_t)k];
            if (r->norm_topk_prob)
                *w /= (sum + 1e-20f);
            *w *= r->routed_scaling_factor;
        }
        for (int k = K; k < W; k++) { /* always-on: the bank's experts past the routed ones */
            ids[(size_t)t * (size_t)W + (size_t)k] = E + (k - K);
            wts[(size_t)t * (size_t)W + (size_t)k] = 1.0f;
        }
    }
}

/* the router's matmul then moe_route: the ops contract's definition */
void sd__cpu_moe_router_route(sd_backend *be, int32_t *ids, float *wts, float *logits,
                              const float *x, const sd_weight *w, const float *bias, int n,
                              int x_stride, const sd_moe_route *r)
{
    sd__cpu_matmul(be, logits, x, w, NULL, n, x_stride);
    sd__cpu_moe_route(be, ids, wts, logits, bias, n, r);
}

/* Tokens grouped by expert: each expert's rows go through its gate/up/down
 * as one small matmul (every expert weight read once per call). tmp holds
 * xg (m, D), g (m, I), u (m, I), y (m, D) for m = n * top_k rows, then m ints. */
void sd__cpu_moe_ffn(sd_backend *be, float *out, const float *x, const int32_t *ids,
                     const float *wts, const sd_experts *ex, int n, int top_k, int D, void *tmp)
{
    int I = (int)ex->gate[0].rows;
    size_t m = (size_t)n * (size_t)top_k;
    float *xg = tmp, *g = xg + m * (size_t)D, *u = g + m * (size_t)I, *y = u + m * (size_t)I;
    int32_t *rows = (int32_t *)(y + m * (size_t)D);
    memset(out, 0, (size_t)n * (size_t)D * sizeof(float));
    for (int e = 0; e < ex->n; e++) {
        int cnt = 0;
        for (size_t r = 0; r < m; r++)
            if (ids[r] == ex->first + e)
                rows[cnt++] = (int32_t)r;
        if (!cnt)
            continue;
        for (int i = 0; i < cnt; i++)
            memcpy(xg + (size_t)i * (size_t)D, x + (size_t)(rows[i] / top_k) * (size_t)D,
                   (size_t)D * sizeof(float));
        sd__cpu_matmul(be, g, xg, &ex->gate[e], NULL, cnt, D);
        sd__cpu_matmul(be, u, xg, &ex->up[e], NULL, cnt, D);
        for (size_t i = 0; i < (size_t)cnt * (size_t)I; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        sd__cpu_matmul(be, y, g, &ex->down[e], NULL, cnt, I);
        for (int i = 0; i < cnt; i++) {
            float w = wts[rows[i]];
            float *o = out + (size_t)(rows[i] / top_k) * (size_t)D;
            const float *yr = y + (size_t)i * (size_t)D;
            for (int d = 0; d < D; d++)
                o[d] += w * yr[d];
        }
    }
}

/* The CPU backend's MLA attention: each head of each token gets the bits it
 * gets alone (a one-head call for that token), whatever heads and tokens
 * share the call (a guard for walking several heads over their shared
 * latent rows at once: tried, 12% slower on the bundled model, not landed). Tokens of two sequences at different
 * positions, head counts that leave partial groups, odd latent and rope
 * widths; fresh random inputs each run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/ops.h"
#include "test.h"

TEST(each_mla_head_gets_the_bits_it_gets_alone)
{
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 2));
    uint64_t rng = sd_test_seed();
    static const int heads[] = {1, 3, 4, 7, 9};
    enum { C = 22, R = 6, BS = 4, MB = 8, T = 3 };
    /* two sequences' blocks, one cache row (C + R floats) a slot */
    const int32_t table[2 * MB] = {5, 2, 7, 0, 9, 11, 1, 3, 4, 6, 8, 10, 12, 13, 14, 15};
    float *cache = malloc((size_t)16 * BS * (C + R) * sizeof(float));
    for (int i = 0; i < 16 * BS * (C + R); i++)
        cache[i] = sd_test_randf(&rng, -1.0f, 1.0f);
    const int32_t pos[T] = {4, 19, 20}, seq[T] = {1, 0, 0};
    int32_t slot[T];
    for (int t = 0; t < T; t++)
        slot[t] = table[seq[t] * MB + pos[t] / BS] * BS + pos[t] % BS;
    int checked = 0;
    for (size_t hi = 0; hi < SD_ARRAY_LEN(heads); hi++) {
        const int H = heads[hi], qpe_head = R + 1, qpe_stride = H * qpe_head + 2;
        float *q = malloc((size_t)T * H * C * sizeof(float));
        float *qp = malloc((size_t)T * qpe_stride * sizeof(float));
        for (int i = 0; i < T * H * C; i++)
            q[i] = sd_test_randf(&rng, -1.0f, 1.0f);
        for (int i = 0; i < T * qpe_stride; i++)
            qp[i] = sd_test_randf(&rng, -1.0f, 1.0f);
        float *out = malloc((size_t)T * H * C * sizeof(float)), one[64];
        sd_attn_batch b = {.n_tokens = T, .pos = pos, .seq = seq, .slot = slot,
                           .block_table = table, .max_blocks = MB, .block_size = BS,
                           .max_pos = 21};
        be->ops->attn_mla(be, out, q, qp, NULL, NULL, cache, &b, H, C, R, qpe_stride, qpe_head,
                          C + R, 0.3f);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const int32_t p1 = pos[t], s1 = 0;
                sd_attn_batch b1 = {.n_tokens = 1, .pos = &p1, .seq = &s1, .slot = &slot[t],
                                    .block_table = table + seq[t] * MB, .max_blocks = MB,
                                    .block_size = BS, .max_pos = p1 + 1};
                be->ops->attn_mla(be, one, q + ((size_t)t * H + h) * C,
                                  qp + (size_t)t * qpe_stride + (size_t)h * qpe_head, NULL, NULL,
                                  cache, &b1, 1, C, R, qpe_stride, qpe_head, C + R, 0.3f);
                ASSERT_MSG(!memcmp(one, out + ((size_t)t * H + h) * C, (size_t)C * sizeof(float)),
                           "%d heads: token %d head %d differs from its one-head call", H, t, h);
                checked++;
            }
        free(q);
        free(qp);
        free(out);
    }
    fprintf(stderr, "  %d heads checked\n", checked);
    free(cache);
    sd_cpu_backend_destroy(be);
}

TEST_MAIN(T(each_mla_head_gets_the_bits_it_gets_alone))

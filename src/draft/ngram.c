#include "draft/ngram.h"

#include <string.h>

int sd_ngram_propose(const int32_t *tok, int n_tok, int max_n, int k, int32_t *out)
{
    if (k <= 0)
        return 0;
    for (int n = max_n; n >= 1; n--) {
        if (n_tok <= n)
            continue;
        const int32_t *tail = tok + n_tok - n;
        /* most recent earlier occurrence with at least one token after it */
        for (int start = n_tok - n - 1; start >= 0; start--) {
            if (memcmp(tok + start, tail, (size_t)n * sizeof(int32_t)) != 0)
                continue;
            int m = 0;
            for (int j = start + n; j < n_tok && m < k; j++)
                out[m++] = tok[j];
            if (m > 0)
                return m;
        }
    }
    return 0;
}

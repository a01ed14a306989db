#include "draft/ngram.h"

#include <stdlib.h>
#include <string.h>

/* The proposal for an occurrence ending at e (1 <= e <= n_tok - 1): the
 * history read from e on, extended by the proposal itself (e + i - n_tok < i). */
static int sd__ngram_continue(const int32_t *tok, int n_tok, int e, int k, int32_t *out)
{
    for (int i = 0; i < k; i++) {
        int idx = e + i;
        out[i] = idx < n_tok ? tok[idx] : out[idx - n_tok];
    }
    return k;
}

int sd_ngram_propose(const int32_t *tok, int n_tok, int max_n, int k, int32_t *out)
{
    if (k <= 0)
        return 0;
    if (max_n > SD_NGRAM_MAX_N)
        max_n = SD_NGRAM_MAX_N;
    for (int n = max_n; n >= 1; n--) {
        if (n_tok <= n)
            continue;
        const int32_t *tail = tok + n_tok - n;
        /* the most recent earlier occurrence: it ends at e <= n_tok - 1 */
        for (int e = n_tok - 1; e >= n; e--)
            if (memcmp(tok + e - n, tail, (size_t)n * sizeof *tok) == 0)
                return sd__ngram_continue(tok, n_tok, e, k, out);
    }
    return 0;
}

/* ---- the index --------------------------------------------------------------------
 *
 * One open-addressing table (linear probing, load <= 1/2) for every n in
 * [min_n, max_n]. An entry is one uint64: the hash's high 32 bits as a
 * fingerprint, n - 1 in bits 27..31, the end e in bits 0..26 (so 0 is never an
 * entry: e >= n >= 1). A hit is confirmed by comparing the n tokens in the
 * caller's history, so a hash collision costs time, never a wrong answer, and
 * each distinct n-gram has one entry, holding its most recent end. */

#define SD__END_BITS 27
#define SD__END_MASK ((1u << SD__END_BITS) - 1)

struct sd_ngram {
    int min_n, max_n;
    int indexed;    /* tokens indexed: every n-gram ending at e <= indexed - 1 */
    uint64_t *slot; /* (cap,) entries, 0 = empty */
    size_t cap;     /* power of two, or 0 before the first insert */
    size_t count;
};

static inline uint64_t sd__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Hash of the tokens before position e, one more token per step: h(1) covers
 * tok[e-1], h(n) covers tok[e-n .. e-1]. The same chain serves the insert of
 * every n at one end and the lookup of every suffix length. */
static inline uint64_t sd__hash_step(uint64_t h, int32_t t)
{
    return sd__mix64(h ^ ((uint64_t)(uint32_t)t * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
}

static uint64_t sd__hash_gram(const int32_t *tok, int e, int n)
{
    uint64_t h = 0;
    for (int i = 1; i <= n; i++)
        h = sd__hash_step(h, tok[e - i]);
    return h;
}

static inline uint64_t sd__entry(uint64_t h, int n, int e)
{
    return (h & 0xffffffff00000000ull) | (uint64_t)(n - 1) << SD__END_BITS | (uint32_t)e;
}
static inline int sd__entry_end(uint64_t v) { return (int)(v & SD__END_MASK); }
static inline int sd__entry_n(uint64_t v) { return (int)((v >> SD__END_BITS) & 31) + 1; }

/* The slot of the entry for n-gram tok[e-n, e) (hash h), or of the empty slot
 * where it would go. */
static size_t sd__find(const sd_ngram *g, const int32_t *tok, uint64_t h, int n, int e)
{
    const size_t mask = g->cap - 1;
    const uint64_t fp_n = (h & 0xffffffff00000000ull) | (uint64_t)(n - 1) << SD__END_BITS;
    const uint64_t key_mask = 0xffffffff00000000ull | 31ull << SD__END_BITS;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        uint64_t v = g->slot[i];
        if (!v)
            return i;
        if ((v & key_mask) != fp_n)
            continue;
        int oe = sd__entry_end(v);
        if (memcmp(tok + oe - n, tok + e - n, (size_t)n * sizeof *tok) == 0)
            return i;
    }
}

/* Doubles the table (at least 64 slots), rehashing from the tokens. */
static int sd__grow(sd_ngram *g, const int32_t *tok)
{
    size_t cap = g->cap ? g->cap * 2 : 64;
    uint64_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return SD_ENOMEM;
    for (size_t i = 0; i < g->cap; i++) {
        uint64_t v = g->slot[i];
        if (!v)
            continue;
        uint64_t h = sd__hash_gram(tok, sd__entry_end(v), sd__entry_n(v));
        size_t j = (size_t)h & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = v;
    }
    free(g->slot);
    g->slot = slot;
    g->cap = cap;
    return 0;
}

int sd_ngram_create(sd_ngram **out, int min_n, int max_n, sd_err *err)
{
    *out = NULL;
    if (min_n < 1 || max_n < min_n || max_n > SD_NGRAM_MAX_N)
        return sd_err_set(err, SD_EINVAL,
                          "ngram: match lengths %d..%d (need 1 <= min <= max <= %d)", min_n, max_n,
                          SD_NGRAM_MAX_N);
    sd_ngram *g = calloc(1, sizeof *g);
    if (!g)
        return sd_err_set(err, SD_ENOMEM, "ngram: out of memory");
    g->min_n = min_n;
    g->max_n = max_n;
    *out = g;
    return 0;
}

void sd_ngram_destroy(sd_ngram *g)
{
    if (!g)
        return;
    free(g->slot);
    free(g);
}

void sd_ngram_reset(sd_ngram *g)
{
    if (g->slot)
        memset(g->slot, 0, g->cap * sizeof *g->slot);
    g->count = 0;
    g->indexed = 0;
}

int sd_ngram_indexed(const sd_ngram *g) { return g->indexed; }

int sd_ngram_update(sd_ngram *g, const int32_t *tok, int n_tok, sd_err *err)
{
    if (n_tok < g->indexed)
        sd_ngram_reset(g);
    if (n_tok > (int)SD__END_MASK)
        return sd_err_set(err, SD_ERANGE, "ngram: %d tokens, the index holds up to %u", n_tok,
                          SD__END_MASK);
    for (int e = g->indexed > 1 ? g->indexed : 1; e < n_tok; e++) {
        /* n-grams ending at e, followed by tok[e] */
        uint64_t h = 0;
        for (int n = 1; n <= g->max_n && n <= e; n++) {
            h = sd__hash_step(h, tok[e - n]);
            if (n < g->min_n)
                continue;
            if ((g->count + 1) * 2 > g->cap && sd__grow(g, tok)) {
                g->indexed = e; /* n-grams at e partly in: redone next time (same entries) */
                return sd_err_set(err, SD_ENOMEM, "ngram: out of memory for %zu entries",
                                  g->count + 1);
            }
            size_t i = sd__find(g, tok, h, n, e);
            if (!g->slot[i])
                g->count++;
            g->slot[i] = sd__entry(h, n, e);
        }
    }
    g->indexed = n_tok;
    return 0;
}

int sd_ngram_lookup(const sd_ngram *g, const int32_t *tok, int n_tok, int k, int32_t *out,
                    int *match_n)
{
    if (match_n)
        *match_n = 0;
    if (n_tok != g->indexed)
        return SD_ESTATE;
    if (k <= 0 || !g->cap)
        return 0;
    /* Suffix hashes for every n, shortest first (the chain's order). */
    uint64_t hs[SD_NGRAM_MAX_N + 1], h = 0;
    int top = g->max_n < n_tok - 1 ? g->max_n : n_tok - 1;
    for (int n = 1; n <= top; n++)
        hs[n] = h = sd__hash_step(h, tok[n_tok - n]);
    for (int n = top; n >= g->min_n; n--) {
        uint64_t v = g->slot[sd__find(g, tok, hs[n], n, n_tok)];
        if (!v)
            continue;
        if (match_n)
            *match_n = n;
        return sd__ngram_continue(tok, n_tok, sd__entry_end(v), k, out);
    }
    return 0;
}

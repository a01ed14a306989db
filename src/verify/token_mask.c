#include "verify/token_mask.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "verify/json_mask.h"
#include "verify/json_schema.h"

static void jm_copy(const void *c, void *d, const void *s)
{
    (void)c;
    *(sd_json_state *)d = *(const sd_json_state *)s;
}

static int jm_feed(const void *c, void *st, const unsigned char *b, size_t n)
{
    (void)c;
    return sd_json_feed(st, b, n);
}

static int jm_equal(const void *c, const void *a, const void *b)
{
    (void)c;
    return sd_json_equal(a, b);
}

static void js_copy(const void *c, void *d, const void *s)
{
    (void)c;
    sd_jschema_copy(d, s);
}

static int js_feed(const void *c, void *st, const unsigned char *b, size_t n)
{
    return sd_jschema_feed(c, st, b, n);
}

static int js_equal(const void *c, const void *a, const void *b)
{
    (void)c;
    return sd_jschema_equal(a, b);
}

/* FNV-1a over n bytes, on from h */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define FNV0 0xcbf29ce484222325ull

/* the fields sd_json_equal compares */
static uint64_t jm_hash(const void *c, const void *st)
{
    (void)c;
    const sd_json_state *s = st;
    const uint8_t head[4] = {s->mode, s->sub, s->ws, s->bad};
    uint64_t h = fnv(FNV0, head, sizeof head);
    h = fnv(h, &s->depth, sizeof s->depth);
    return s->depth > 0 ? fnv(h, s->stack, (size_t)s->depth * sizeof s->stack[0]) : h;
}

/* the bytes sd_jschema_equal compares */
static uint64_t js_hash(const void *c, const void *st)
{
    (void)c;
    const sd_jschema_state *s = st;
    return fnv(FNV0, s, offsetof(sd_jschema_state, alt) + s->nalt * sizeof s->alt[0]);
}

_Static_assert(sizeof(sd_json_state) <= SD_MASK_STATE_MAX, "SD_MASK_STATE_MAX");
_Static_assert(sizeof(sd_jschema_state) <= SD_MASK_STATE_MAX, "SD_MASK_STATE_MAX");

sd_byte_automaton sd_json_automaton(void)
{
    return (sd_byte_automaton){NULL, jm_copy, jm_feed, jm_equal, jm_hash, 0};
}

sd_byte_automaton sd_jschema_automaton(const struct sd_jschema *s)
{
    return (sd_byte_automaton){s, js_copy, js_feed, js_equal, js_hash, sd_jschema_serial(s)};
}

int sd_token_table_build(sd_token_table *tt, int n,
                         const unsigned char *(*bytes_of)(const void *ctx, int32_t t, size_t *len),
                         const void *ctx)
{
    memset(tt, 0, sizeof *tt);
    tt->bytes = calloc((size_t)n, sizeof *tt->bytes);
    tt->len = calloc((size_t)n, sizeof *tt->len);
    tt->set = calloc((size_t)n, sizeof *tt->set);
    tt->none = malloc((size_t)(n > 0 ? n : 1) * sizeof *tt->none);
    if (!tt->bytes || !tt->len || !tt->set || !tt->none) {
        sd_token_table_free(tt);
        return -1;
    }
    tt->n = n;
    for (int32_t t = 0; t < n; t++) {
        size_t len = 0;
        const unsigned char *b = bytes_of(ctx, t, &len);
        tt->bytes[t] = len ? b : NULL;
        tt->len[t] = b ? len : 0;
        if (!tt->bytes[t])
            tt->none[tt->n_none++] = t;
        for (size_t i = 0; b && i < len; i++)
            tt->set[t][b[i] >> 6] |= 1ull << (b[i] & 63);
    }
    return 0;
}

void sd_token_table_free(sd_token_table *tt)
{
    free(tt->bytes);
    free(tt->len);
    free(tt->set);
    free(tt->none);
    memset(tt, 0, sizeof *tt);
}

/* token t not taken: its bit cleared, or (bits NULL) row[t] = -inf */
static inline void reject(uint64_t *bits, float *row, int t)
{
    if (bits)
        bits[t >> 6] &= ~(1ull << (t & 63));
    else
        row[t] = -INFINITY;
}

/* The mask's bits (1: taken; tokens without bytes 1, the caller's): bits
 * NULL, row[t] = -inf for the tokens not taken instead */
static int mask_into(const sd_token_table *tt, const sd_byte_automaton *a, const void *st,
                     void *scratch, float *row, uint64_t *bits)
{
    /* the byte values taken from st, and those that leave it as it is */
    uint64_t ok[4] = {0, 0, 0, 0}, same[4] = {0, 0, 0, 0};
    for (int v = 0; v < 256; v++) {
        const unsigned char c = (unsigned char)v;
        a->copy(a->ctx, scratch, st);
        if (a->feed(a->ctx, scratch, &c, 1) == 0) {
            ok[v >> 6] |= 1ull << (v & 63);
            if (a->equal(a->ctx, scratch, st))
                same[v >> 6] |= 1ull << (v & 63);
        }
    }
    int fed = 0;
    for (int t = 0; t < tt->n; t++) {
        if (!tt->bytes[t])
            continue;
        const unsigned char b0 = tt->bytes[t][0];
        if (!(ok[b0 >> 6] >> (b0 & 63) & 1)) { /* its first byte is not taken: nor is it */
            reject(bits, row, t);
            continue;
        }
        const uint64_t *s = tt->set[t];
        if (!((s[0] & ~same[0]) | (s[1] & ~same[1]) | (s[2] & ~same[2]) | (s[3] & ~same[3])))
            continue; /* every byte keeps the state: taken */
        a->copy(a->ctx, scratch, st);
        fed++;
        if (a->feed(a->ctx, scratch, tt->bytes[t], tt->len[t]) != 0)
            reject(bits, row, t);
    }
    return fed;
}

int sd_token_mask(const sd_token_table *tt, const sd_byte_automaton *a, const void *st,
                  void *scratch, float *row)
{
    return mask_into(tt, a, st, scratch, row, NULL);
}

/* ---- the cache ---- */

#define WAYS 4

typedef struct mc_entry {
    uint64_t hash, id, used; /* used: the lookup it was last found or made at; 0: empty */
    uint64_t *bits;
    _Alignas(8) unsigned char st[SD_MASK_STATE_MAX];
} mc_entry;

struct sd_mask_cache {
    int n_tokens;
    size_t words; /* a mask's */
    uint32_t n_sets;
    mc_entry *e;  /* (n_sets * WAYS) */
    uint64_t *bits;
    uint64_t clock, hits, misses;
};

int sd_mask_cache_create(sd_mask_cache **out, const sd_token_table *tt, size_t bytes)
{
    *out = NULL;
    sd_mask_cache *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->n_tokens = tt->n;
    c->words = ((size_t)tt->n + 63) / 64;
    const size_t per = c->words * 8 + sizeof(mc_entry);
    size_t sets = bytes / (per * WAYS);
    c->n_sets = 1;
    while ((size_t)c->n_sets * 2 <= sets && c->n_sets < (1u << 20))
        c->n_sets *= 2;
    const size_t n = (size_t)c->n_sets * WAYS;
    c->e = calloc(n, sizeof *c->e);
    c->bits = malloc(n * c->words * 8 + 8);
    if (!c->e || !c->bits) {
        sd_mask_cache_free(c);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        c->e[i].bits = c->bits + i * c->words;
    *out = c;
    return 0;
}

void sd_mask_cache_free(sd_mask_cache *c)
{
    if (!c)
        return;
    free(c->e);
    free(c->bits);
    free(c);
}

void sd_mask_cache_counts(const sd_mask_cache *c, uint64_t *hits, uint64_t *misses)
{
    *hits = c->hits;
    *misses = c->misses;
}

/* row[t] = -inf for every token whose bit is clear */
static void apply_bits(const uint64_t *bits, size_t words, int n, float *row)
{
    for (size_t w = 0; w < words; w++) {
        uint64_t off = ~bits[w];
        if (!off)
            continue;
        const int t0 = (int)(w * 64);
        if (off == ~0ull && t0 + 64 <= n) {
            for (int j = 0; j < 64; j++)
                row[t0 + j] = -INFINITY;
            continue;
        }
        while (off) {
            const int t = t0 + __builtin_ctzll(off);
            if (t < n)
                row[t] = -INFINITY;
            off &= off - 1;
        }
    }
}

int sd_token_mask_cached(sd_mask_cache *c, const sd_token_table *tt, const sd_byte_automaton *a,
                         const void *st, void *scratch, float *row)
{
    if (!c || !a->hash || tt->n != c->n_tokens)
        return sd_token_mask(tt, a, st, scratch, row);
    const uint64_t h = a->hash(a->ctx, st);
    mc_entry *set = c->e + (size_t)(h & (c->n_sets - 1)) * WAYS, *victim = set;
    c->clock++;
    for (int w = 0; w < WAYS; w++) {
        mc_entry *x = set + w;
        if (x->used && x->hash == h && x->id == a->id && a->equal(a->ctx, x->st, st)) {
            x->used = c->clock;
            c->hits++;
            apply_bits(x->bits, c->words, tt->n, row);
            return 0;
        }
        if (x->used < victim->used)
            victim = x;
    }
    c->misses++;
    memset(victim->bits, 0xff, c->words * 8);
    const int fed = mask_into(tt, a, st, scratch, row, victim->bits);
    a->copy(a->ctx, victim->st, st);
    victim->hash = h;
    victim->id = a->id;
    victim->used = c->clock;
    apply_bits(victim->bits, c->words, tt->n, row);
    return fed;
}

#include "sched/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

/* Entries live in per-block arrays (a block is the entry of one key at
 * most); the table maps keys to blocks by open addressing with linear
 * probing, deleted by shifting the run back (no tombstones). */
struct sd_pcache {
    sd_kv_pool *pool;
    int n_blocks, bs;
    sd_pc_key *key, *parent; /* (n_blocks,) */
    int32_t *tok;            /* (n_blocks, bs) */
    unsigned char *in, *prop;
    int32_t *next; /* the token after the block its proposer slots were made with, or -1 */
    int32_t *slots; /* (cap,) block or -1 */
    uint32_t mask;
    int n;
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t lane(uint64_t seed, sd_pc_key parent, const int32_t *tok, int n)
{
    uint64_t h = mix64(seed ^ parent.h[0]) ^ mix64(parent.h[1] + seed * 3);
    for (int i = 0; i < n; i++)
        h = mix64(h ^ ((uint64_t)(uint32_t)tok[i] | (uint64_t)(uint32_t)i << 32) ^ seed);
    return mix64(h ^ (uint64_t)n);
}

sd_pc_key sd_pcache_root(void)
{
    return (sd_pc_key){{0x736465632d707265ull, 0x6669782d726f6f74ull}};
}

sd_pc_key sd_pcache_key(sd_pc_key parent, const int32_t *tok, int block_size)
{
    return (sd_pc_key){{lane(0x9e3779b97f4a7c15ull, parent, tok, block_size),
                        lane(0xc2b2ae3d27d4eb4full, parent, tok, block_size)}};
}

static int key_eq(sd_pc_key a, sd_pc_key b) { return a.h[0] == b.h[0] && a.h[1] == b.h[1]; }

static void on_evict(void *ctx, int32_t block);

int sd_pcache_create(sd_pcache **out, sd_kv_pool *pool, sd_err *err)
{
    *out = NULL;
    sd_pcache *c = calloc(1, sizeof *c);
    if (!c)
        return sd_err_set(err, SD_ENOMEM, "prefix cache: out of memory");
    c->pool = pool;
    c->n_blocks = sd_kv_pool_total(pool);
    c->bs = sd_kv_pool_block_size(pool);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)c->n_blocks)
        cap *= 2;
    c->mask = cap - 1;
    size_t nb = (size_t)c->n_blocks;
    c->key = malloc(nb * sizeof *c->key);
    c->parent = malloc(nb * sizeof *c->parent);
    c->tok = malloc(nb * (size_t)c->bs * sizeof *c->tok);
    c->in = calloc(nb, 1);
    c->prop = calloc(nb, 1);
    c->next = malloc(nb * sizeof *c->next);
    c->slots = malloc((size_t)cap * sizeof *c->slots);
    if (!c->key || !c->parent || !c->tok || !c->in || !c->prop || !c->next || !c->slots) {
        sd_pcache_free(c);
        return sd_err_set(err, SD_ENOMEM, "prefix cache: out of memory for %d blocks",
                          c->n_blocks);
    }
    memset(c->slots, 0xff, (size_t)cap * sizeof *c->slots);
    sd_kv_pool_on_evict(pool, on_evict, c);
    *out = c;
    return 0;
}

void sd_pcache_free(sd_pcache *c)
{
    if (!c)
        return;
    if (c->in) {
        for (int b = 0; b < c->n_blocks; b++)
            if (c->in[b])
                sd_kv_block_set_cached(c->pool, b, 0);
        sd_kv_pool_on_evict(c->pool, NULL, NULL);
    }
    free(c->key);
    free(c->parent);
    free(c->tok);
    free(c->in);
    free(c->prop);
    free(c->next);
    free(c->slots);
    free(c);
}

/* the table slot of key's entry, or of the empty slot that ends its run */
static uint32_t find(const sd_pcache *c, sd_pc_key key, sd_pc_key parent, const int32_t *tok)
{
    uint32_t i = (uint32_t)key.h[0] & c->mask;
    for (;; i = (i + 1) & c->mask) {
        int32_t b = c->slots[i];
        if (b < 0 ||
            (key_eq(c->key[b], key) && key_eq(c->parent[b], parent) &&
             !memcmp(c->tok + (size_t)b * c->bs, tok, (size_t)c->bs * sizeof *tok)))
            return i;
    }
}

/* takes block's entry out of the table (the pool's mark is the caller's) */
static void remove_entry(sd_pcache *c, int32_t block)
{
    uint32_t i = (uint32_t)c->key[block].h[0] & c->mask;
    while (c->slots[i] != block)
        i = (i + 1) & c->mask;
    /* shift the rest of the run back over the hole */
    for (uint32_t j = (i + 1) & c->mask; c->slots[j] >= 0; j = (j + 1) & c->mask) {
        uint32_t home = (uint32_t)c->key[c->slots[j]].h[0] & c->mask;
        /* j's entry may move to i if its home is not in (i, j] */
        if (((j - home) & c->mask) >= ((j - i) & c->mask)) {
            c->slots[i] = c->slots[j];
            i = j;
        }
    }
    c->slots[i] = -1;
    c->in[block] = 0;
    c->prop[block] = 0;
    c->n--;
}

static void on_evict(void *ctx, int32_t block)
{
    sd_pcache *c = ctx;
    if (block >= 0 && block < c->n_blocks && c->in[block])
        remove_entry(c, block);
}

int sd_pcache_match(const sd_pcache *c, const int32_t *tok, int n_tok, int max_blocks,
                    int32_t *blocks, sd_pc_key *keys, int *n_prop)
{
    const int bs = c->bs;
    sd_pc_key key = sd_pcache_root();
    int m = 0, np = 0, run = 1;
    while (m < max_blocks && (m + 1) * bs <= n_tok) {
        const int32_t *bt = tok + (size_t)m * bs;
        sd_pc_key k = sd_pcache_key(key, bt, bs);
        int32_t b = c->slots[find(c, k, key, bt)];
        if (b < 0)
            break;
        blocks[m] = b;
        if (keys)
            keys[m] = k;
        const int end = (m + 1) * bs;
        run = run && c->prop[b] && (c->next[b] < 0 || (end < n_tok && tok[end] == c->next[b]));
        np += run;
        key = k;
        m++;
    }
    *n_prop = np;
    return m;
}

sd_pc_key sd_pcache_insert(sd_pcache *c, sd_pc_key parent, const int32_t *btok, int32_t block,
                           int prop, int32_t next)
{
    const int bs = c->bs;
    sd_pc_key key = sd_pcache_key(parent, btok, bs);
    if (block < 0 || block >= c->n_blocks)
        return key;
    uint32_t i = find(c, key, parent, btok);
    int32_t old = c->slots[i];
    if (old == block) {
        if (prop && !c->prop[block]) {
            c->prop[block] = 1;
            c->next[block] = next;
        }
        return key;
    }
    if (c->in[block]) /* the entry of another prefix: cannot be */
        return key;
    if (old >= 0) {
        if (!prop || c->prop[old])
            return key;
        /* this block has the proposer's slots too: it takes the entry */
        remove_entry(c, old);
        sd_kv_block_set_cached(c->pool, old, 0);
        i = find(c, key, parent, btok);
    }
    c->slots[i] = block;
    c->key[block] = key;
    c->parent[block] = parent;
    memcpy(c->tok + (size_t)block * bs, btok, (size_t)bs * sizeof *btok);
    c->in[block] = 1;
    c->prop[block] = prop != 0;
    c->next[block] = prop ? next : -1;
    c->n++;
    sd_kv_block_set_cached(c->pool, block, 1);
    return key;
}

int sd_pcache_entries(const sd_pcache *c) { return c ? c->n : 0; }

int sd_pcache_check(const sd_pcache *c, sd_err *err)
{
    int in_table = 0;
    for (uint32_t i = 0; i <= c->mask; i++) {
        int32_t b = c->slots[i];
        if (b < 0)
            continue;
        if (b >= c->n_blocks || !c->in[b])
            return sd_err_set(err, SD_ESTATE, "prefix cache: slot %u holds block %d, no entry", i,
                              (int)b);
        if (c->slots[find(c, c->key[b], c->parent[b], c->tok + (size_t)b * c->bs)] != b)
            return sd_err_set(err, SD_ESTATE, "prefix cache: block %d is not found by its key",
                              (int)b);
        in_table++;
    }
    int n_in = 0;
    for (int b = 0; b < c->n_blocks; b++) {
        n_in += c->in[b];
        if (c->in[b] != sd_kv_block_cached(c->pool, b))
            return sd_err_set(err, SD_ESTATE, "prefix cache: block %d is %s but %s in the pool", b,
                              c->in[b] ? "an entry" : "no entry",
                              sd_kv_block_cached(c->pool, b) ? "marked" : "not marked");
    }
    if (in_table != c->n || n_in != c->n)
        return sd_err_set(err, SD_ESTATE, "prefix cache: %d entries, %d in the table, %d counted",
                          n_in, in_table, c->n);
    return 0;
}

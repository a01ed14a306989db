#include "sched/kv_blocks.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

struct sd_kv_pool {
    int n_blocks, block_size;
    int32_t *free_list; /* stack of free block ids, top at n_free - 1 */
    int n_free;
    int32_t *ref; /* (n_blocks,) reference count per block */
    /* cached blocks (a prefix cache): the mark, and the evictable queue of
     * those nobody holds, a doubly linked list through prev / next (-1 ends),
     * head released longest ago */
    unsigned char *cached;
    int32_t *prev, *next;
    int32_t head, tail;
    int n_evict, n_cached;
    void (*on_evict)(void *ctx, int32_t block);
    void *evict_ctx;
    /* The first misuse seen (decref of a free block, ...) or, in a validating
     * build, the first broken invariant; reported by sd_kv_pool_check. */
    int broken;
    char broken_msg[256];
};

static void sd__kv_break(sd_kv_pool *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sd__kv_break(sd_kv_pool *p, const char *fmt, ...)
{
    if (p->broken)
        return;
    p->broken = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->broken_msg, sizeof p->broken_msg, fmt, ap);
    va_end(ap);
    sd_log_error("kv_blocks: %s", p->broken_msg);
}

#ifdef SD_KV_VALIDATE
static void sd__kv_validate(sd_kv_pool *p, const sd_kv_seq *s, const char *where)
{
    sd_err e = {0};
    if (!p->broken && (sd_kv_pool_check(p, &e) || (s && sd_kv_seq_check(p, s, &e))))
        sd__kv_break(p, "after %s: %s", where, e.msg);
}
#define SD__KV_VALIDATE(p, s, where) sd__kv_validate(p, s, where)
#else
#define SD__KV_VALIDATE(p, s, where) ((void)0)
#endif

int sd_kv_pool_create(sd_kv_pool **out, int n_blocks, int block_size, sd_err *err)
{
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0)
        return sd_err_set(err, SD_EINVAL, "kv cache: %d blocks of %d tokens (both must be > 0)",
                          n_blocks, block_size);
    sd_kv_pool *p = calloc(1, sizeof *p);
    if (!p)
        return sd_err_set(err, SD_ENOMEM, "kv cache: out of memory");
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->cached = calloc((size_t)n_blocks, 1);
    p->prev = malloc((size_t)n_blocks * sizeof *p->prev);
    p->next = malloc((size_t)n_blocks * sizeof *p->next);
    if (!p->free_list || !p->ref || !p->cached || !p->prev || !p->next) {
        sd_kv_pool_free(p);
        return sd_err_set(err, SD_ENOMEM, "kv cache: out of memory for %d blocks", n_blocks);
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* Block 0 on top: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    p->head = p->tail = -1;
    *out = p;
    return 0;
}

void sd_kv_pool_free(sd_kv_pool *p)
{
    if (!p)
        return;
    free(p->free_list);
    free(p->ref);
    free(p->cached);
    free(p->prev);
    free(p->next);
    free(p);
}

int sd_kv_pool_used(const sd_kv_pool *p) { return p ? p->n_blocks - p->n_free - p->n_evict : 0; }
int sd_kv_pool_free_blocks(const sd_kv_pool *p) { return p ? p->n_free + p->n_evict : 0; }
int sd_kv_pool_evictable(const sd_kv_pool *p) { return p ? p->n_evict : 0; }
int sd_kv_pool_cached(const sd_kv_pool *p) { return p ? p->n_cached : 0; }
int sd_kv_pool_total(const sd_kv_pool *p) { return p ? p->n_blocks : 0; }
int sd_kv_pool_block_size(const sd_kv_pool *p) { return p->block_size; }

int sd_kv_blocks_for(const sd_kv_pool *p, int n_positions)
{
    if (n_positions <= 0)
        return 0;
    return (int)(((int64_t)n_positions + p->block_size - 1) / p->block_size);
}

void sd_kv_seq_init(sd_kv_seq *s) { memset(s, 0, sizeof *s); }

/* the evictable queue: append at the tail, unlink anywhere */
static void sd__kv_queue_push(sd_kv_pool *p, int32_t b)
{
    p->prev[b] = p->tail;
    p->next[b] = -1;
    if (p->tail >= 0)
        p->next[p->tail] = b;
    else
        p->head = b;
    p->tail = b;
    p->n_evict++;
}

static void sd__kv_queue_unlink(sd_kv_pool *p, int32_t b)
{
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        p->head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->tail = p->prev[b];
    p->n_evict--;
}

static void sd__kv_unref(sd_kv_pool *p, int32_t b)
{
    if (b < 0 || b >= p->n_blocks || p->ref[b] <= 0) {
        sd__kv_break(p, "release of block %d, which is %s", (int)b,
                     b < 0 || b >= p->n_blocks ? "out of range" : "already free");
        return;
    }
    if (--p->ref[b] == 0) {
        if (p->cached[b])
            sd__kv_queue_push(p, b);
        else
            p->free_list[p->n_free++] = b;
    }
}

/* A block for new slots: a free one, else the cached one released longest
 * ago (the cache forgets it first). The caller checked that one exists. */
static int32_t sd__kv_pop(sd_kv_pool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_list[--p->n_free];
    } else {
        b = p->head;
        sd__kv_queue_unlink(p, b);
        if (p->on_evict)
            p->on_evict(p->evict_ctx, b);
        if (p->cached[b]) { /* the callback may have unmarked it */
            p->cached[b] = 0;
            p->n_cached--;
        }
    }
    p->ref[b] = 1;
    return b;
}

/* Grows s's table to hold n entries; nothing changes on failure. */
static int sd__kv_table_fit(sd_kv_seq *s, int n)
{
    if (n <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < n)
        cap *= 2;
    int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
    if (!b)
        return SD_ENOMEM;
    s->blocks = b;
    s->cap = cap;
    return 0;
}

int sd_kv_seq_need(const sd_kv_pool *p, const sd_kv_seq *s, int n_positions)
{
    int more = sd_kv_blocks_for(p, n_positions) - s->n_blocks;
    return more > 0 ? more : 0;
}

int sd_kv_seq_reserve(sd_kv_pool *p, sd_kv_seq *s, int n_positions)
{
    const int need = sd_kv_blocks_for(p, n_positions);
    const int more = need - s->n_blocks;
    if (more <= 0)
        return 0;
    if (more > p->n_free + p->n_evict)
        return SD_EFULL;
    if (sd__kv_table_fit(s, need))
        return SD_ENOMEM;
    for (int i = 0; i < more; i++)
        s->blocks[s->n_blocks++] = sd__kv_pop(p);
    SD__KV_VALIDATE(p, s, "reserve");
    return 0;
}

void sd_kv_seq_truncate(sd_kv_pool *p, sd_kv_seq *s, int n_positions)
{
    const int keep = sd_kv_blocks_for(p, n_positions);
    /* Last block first: the next reserve pops them back in table order. */
    while (s->n_blocks > keep)
        sd__kv_unref(p, s->blocks[--s->n_blocks]);
    SD__KV_VALIDATE(p, s, "truncate");
}

void sd_kv_seq_free(sd_kv_pool *p, sd_kv_seq *s)
{
    if (p)
        sd_kv_seq_truncate(p, s, 0);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

int sd_kv_seq_slot(const sd_kv_pool *p, const sd_kv_seq *s, int pos)
{
    return s->blocks[pos / p->block_size] * p->block_size + pos % p->block_size;
}

void sd_kv_seq_slots(const sd_kv_pool *p, const sd_kv_seq *s, int pos0, int n, int32_t *out)
{
    const int bs = p->block_size;
    int bi = pos0 / bs, off = pos0 % bs;
    for (int i = 0; i < n; i++) {
        out[i] = s->blocks[bi] * bs + off;
        if (++off == bs) {
            off = 0;
            bi++;
        }
    }
}

int sd_kv_seq_fork(sd_kv_pool *p, sd_kv_seq *dst, const sd_kv_seq *src, int n_blocks)
{
    if (dst == src)
        return SD_EINVAL;
    if (n_blocks > src->n_blocks)
        n_blocks = src->n_blocks;
    if (n_blocks < 0)
        n_blocks = 0;
    int32_t *t = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *t);
    if (!t)
        return SD_ENOMEM;
    /* Take the new references before dropping dst's old ones: blocks both share
     * stay alive. */
    for (int i = 0; i < n_blocks; i++) {
        t[i] = src->blocks[i];
        p->ref[t[i]]++;
    }
    sd_kv_seq_free(p, dst);
    dst->blocks = t;
    dst->n_blocks = n_blocks;
    dst->cap = n_blocks > 0 ? n_blocks : 1;
    SD__KV_VALIDATE(p, dst, "fork");
    return 0;
}

int sd_kv_seq_make_private(sd_kv_pool *p, sd_kv_seq *s, int pos, int32_t *copy_from,
                           int32_t *copy_to)
{
    if (pos < 0 || pos / p->block_size >= s->n_blocks)
        return SD_EINVAL;
    const int bi = pos / p->block_size;
    const int32_t old = s->blocks[bi];
    if (p->ref[old] <= 1)
        return 0;
    if (p->n_free + p->n_evict == 0)
        return SD_EFULL;
    const int32_t b = sd__kv_pop(p);
    p->ref[old]--; /* was > 1: stays in use by the other holders */
    s->blocks[bi] = b;
    *copy_from = old;
    *copy_to = b;
    SD__KV_VALIDATE(p, s, "make_private");
    return 1;
}

void sd_kv_block_incref(sd_kv_pool *p, int32_t block)
{
    if (block < 0 || block >= p->n_blocks || p->ref[block] <= 0) {
        sd__kv_break(p, "incref of block %d, which is %s", (int)block,
                     block < 0 || block >= p->n_blocks ? "out of range" : "free");
        return;
    }
    p->ref[block]++;
    SD__KV_VALIDATE(p, NULL, "incref");
}

void sd_kv_block_decref(sd_kv_pool *p, int32_t block)
{
    sd__kv_unref(p, block);
    SD__KV_VALIDATE(p, NULL, "decref");
}

int sd_kv_block_refs(const sd_kv_pool *p, int32_t block)
{
    return block >= 0 && block < p->n_blocks ? p->ref[block] : 0;
}

void sd_kv_pool_on_evict(sd_kv_pool *p, void (*on_evict)(void *ctx, int32_t block), void *ctx)
{
    p->on_evict = on_evict;
    p->evict_ctx = ctx;
}

void sd_kv_block_set_cached(sd_kv_pool *p, int32_t block, int cached)
{
    if (block < 0 || block >= p->n_blocks || (cached && p->ref[block] <= 0)) {
        sd__kv_break(p, "cache mark of block %d, which is %s", (int)block,
                     block < 0 || block >= p->n_blocks ? "out of range" : "free");
        return;
    }
    cached = cached != 0;
    if (p->cached[block] == cached)
        return;
    p->cached[block] = (unsigned char)cached;
    p->n_cached += cached ? 1 : -1;
    if (!cached && p->ref[block] == 0) { /* off the evictable queue, free */
        sd__kv_queue_unlink(p, block);
        p->free_list[p->n_free++] = block;
    }
    SD__KV_VALIDATE(p, NULL, "set_cached");
}

int sd_kv_block_cached(const sd_kv_pool *p, int32_t block)
{
    return block >= 0 && block < p->n_blocks && p->cached[block];
}

int sd_kv_seq_share(sd_kv_pool *p, sd_kv_seq *s, int32_t block)
{
    if (block < 0 || block >= p->n_blocks || !p->cached[block])
        return SD_EINVAL;
    for (int i = 0; i < s->n_blocks; i++)
        if (s->blocks[i] == block)
            return SD_EINVAL;
    if (sd__kv_table_fit(s, s->n_blocks + 1))
        return SD_ENOMEM;
    if (p->ref[block]++ == 0)
        sd__kv_queue_unlink(p, block);
    s->blocks[s->n_blocks++] = block;
    SD__KV_VALIDATE(p, s, "share");
    return 0;
}

int sd_kv_pool_check(const sd_kv_pool *p, sd_err *err)
{
    if (p->broken)
        return sd_err_set(err, SD_ESTATE, "kv cache: %s", p->broken_msg);
    if (p->n_free < 0 || p->n_evict < 0 || p->n_free + p->n_evict > p->n_blocks)
        return sd_err_set(err, SD_ESTATE, "kv cache: %d free and %d evictable of %d blocks",
                          p->n_free, p->n_evict, p->n_blocks);
    unsigned char *seen = calloc((size_t)p->n_blocks, 1);
    if (!seen)
        return sd_err_set(err, SD_ENOMEM, "kv cache: out of memory checking %d blocks",
                          p->n_blocks);
    int rc = 0;
    for (int i = 0; i < p->n_free && !rc; i++) {
        int32_t b = p->free_list[i];
        if (b < 0 || b >= p->n_blocks)
            rc = sd_err_set(err, SD_ESTATE,
                            "kv cache: free list entry %d is block %d, out of range", i, (int)b);
        else if (seen[b])
            rc = sd_err_set(err, SD_ESTATE, "kv cache: block %d is on the free list twice", (int)b);
        else if (p->ref[b] != 0)
            rc = sd_err_set(err, SD_ESTATE,
                            "kv cache: block %d is on the free list with %d references", (int)b,
                            (int)p->ref[b]);
        else if (p->cached[b])
            rc = sd_err_set(err, SD_ESTATE, "kv cache: block %d is on the free list and cached",
                            (int)b);
        else
            seen[b] = 1;
    }
    /* the evictable queue: linked both ways, cached blocks nobody holds */
    int n_q = 0, last = -1;
    for (int32_t b = p->head; b != -1 && !rc; b = p->next[b]) {
        if (b < 0 || b >= p->n_blocks || n_q >= p->n_blocks)
            rc = sd_err_set(err, SD_ESTATE, "kv cache: the evictable queue is broken at block %d",
                            (int)b);
        else if (seen[b])
            rc = sd_err_set(err, SD_ESTATE, "kv cache: block %d is queued twice or also free",
                            (int)b);
        else if (p->ref[b] != 0 || !p->cached[b] || p->prev[b] != last)
            rc = sd_err_set(err, SD_ESTATE,
                            "kv cache: evictable block %d has %d references, cached %d, a wrong "
                            "link %d",
                            (int)b, (int)p->ref[b], p->cached[b], p->prev[b] != last);
        else
            seen[b] = 1;
        last = b;
        n_q++;
    }
    if (!rc && (n_q != p->n_evict || last != p->tail))
        rc = sd_err_set(err, SD_ESTATE, "kv cache: %d blocks queued, %d counted", n_q, p->n_evict);
    int n_c = 0;
    for (int b = 0; b < p->n_blocks; b++)
        n_c += p->cached[b];
    if (!rc && n_c != p->n_cached)
        rc = sd_err_set(err, SD_ESTATE, "kv cache: %d blocks cached, %d counted", n_c, p->n_cached);
    for (int b = 0; b < p->n_blocks && !rc; b++) {
        if (p->ref[b] < 0)
            rc = sd_err_set(err, SD_ESTATE, "kv cache: block %d has %d references", b,
                            (int)p->ref[b]);
        else if (p->ref[b] == 0 && !seen[b])
            rc = sd_err_set(err, SD_ESTATE,
                            "kv cache: block %d has no reference and is neither free nor "
                            "evictable (leaked)",
                            b);
    }
    free(seen);
    return rc;
}

int sd_kv_seq_check(const sd_kv_pool *p, const sd_kv_seq *s, sd_err *err)
{
    if (s->n_blocks < 0 || s->n_blocks > s->cap || (s->n_blocks && !s->blocks))
        return sd_err_set(err, SD_ESTATE, "kv sequence: %d blocks in a table of %d", s->n_blocks,
                          s->cap);
    unsigned char *seen = calloc((size_t)p->n_blocks, 1);
    if (!seen)
        return sd_err_set(err, SD_ENOMEM, "kv sequence: out of memory checking %d blocks",
                          p->n_blocks);
    int rc = 0;
    for (int i = 0; i < s->n_blocks && !rc; i++) {
        int32_t b = s->blocks[i];
        if (b < 0 || b >= p->n_blocks)
            rc = sd_err_set(err, SD_ESTATE, "kv sequence: table entry %d is block %d, out of range",
                            i, (int)b);
        else if (seen[b])
            rc = sd_err_set(err, SD_ESTATE, "kv sequence: block %d appears twice in the table",
                            (int)b);
        else if (p->ref[b] < 1)
            rc = sd_err_set(err, SD_ESTATE,
                            "kv sequence: table entry %d is block %d, which is free", i, (int)b);
        else
            seen[b] = 1;
    }
    free(seen);
    return rc;
}

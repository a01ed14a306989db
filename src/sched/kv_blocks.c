#include "sched/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

struct sd_kv_pool {
    int n_blocks, block_size;
    int32_t *free_list; /* stack of free block ids */
    int n_free;
    int32_t *ref; /* reference count per block */
};

#ifdef SD_KV_VALIDATE
#include <stdio.h>
static void validate(const sd_kv_pool *p)
{
    int zero = 0;
    for (int b = 0; b < p->n_blocks; b++) {
        if (p->ref[b] < 0) {
            fprintf(stderr, "kv_blocks: block %d has refcount %d\n", b, p->ref[b]);
            abort();
        }
        zero += p->ref[b] == 0;
    }
    if (zero != p->n_free) {
        fprintf(stderr, "kv_blocks: %d unreferenced blocks but %d on the free list\n", zero,
                p->n_free);
        abort();
    }
}
#define VALIDATE(p) validate(p)
#else
#define VALIDATE(p) ((void)0)
#endif

int sd_kv_pool_create(sd_kv_pool **out, int n_blocks, int block_size, sd_err *err)
{
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0)
        return sd_err_set(err, SD_EINVAL, "kv: %d blocks of %d tokens", n_blocks, block_size);
    sd_kv_pool *p = calloc(1, sizeof *p);
    if (!p)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    p->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
    p->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!p->free_list || !p->ref) {
        sd_kv_pool_free(p);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* LIFO: block 0 on top */
    for (int i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    *out = p;
    return 0;
}

void sd_kv_pool_free(sd_kv_pool *p)
{
    if (!p)
        return;
    free(p->free_list);
    free(p->ref);
    free(p);
}

int sd_kv_pool_used(const sd_kv_pool *p) { return p ? p->n_blocks - p->n_free : 0; }
int sd_kv_pool_free_blocks(const sd_kv_pool *p) { return p ? p->n_free : 0; }
int sd_kv_pool_block_size(const sd_kv_pool *p) { return p->block_size; }

void sd_kv_seq_init(sd_kv_seq *s) { memset(s, 0, sizeof *s); }

static void unref(sd_kv_pool *p, int32_t b)
{
    if (--p->ref[b] == 0)
        p->free_list[p->n_free++] = b;
}

int sd_kv_seq_reserve(sd_kv_pool *p, sd_kv_seq *s, int n_positions)
{
    int need = (n_positions + p->block_size - 1) / p->block_size;
    int more = need - s->n_blocks;
    if (more <= 0)
        return 0;
    if (more > p->n_free)
        return SD_EFULL;
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < need)
            cap *= 2;
        int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
        if (!b)
            return SD_ENOMEM;
        s->blocks = b;
        s->cap = cap;
    }
    for (int i = 0; i < more; i++) {
        int32_t b = p->free_list[--p->n_free];
        p->ref[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    VALIDATE(p);
    return 0;
}

void sd_kv_seq_truncate(sd_kv_pool *p, sd_kv_seq *s, int n_positions)
{
    int keep = n_positions <= 0 ? 0 : (n_positions + p->block_size - 1) / p->block_size;
    while (s->n_blocks > keep)
        unref(p, s->blocks[--s->n_blocks]);
    VALIDATE(p);
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

int sd_kv_seq_fork(sd_kv_pool *p, sd_kv_seq *dst, const sd_kv_seq *src, int n_blocks)
{
    if (n_blocks > src->n_blocks)
        n_blocks = src->n_blocks;
    sd_kv_seq_free(p, dst);
    dst->blocks = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof(int32_t));
    if (!dst->blocks)
        return SD_ENOMEM;
    dst->cap = n_blocks > 0 ? n_blocks : 1;
    for (int i = 0; i < n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        p->ref[src->blocks[i]]++;
    }
    dst->n_blocks = n_blocks;
    VALIDATE(p);
    return 0;
}

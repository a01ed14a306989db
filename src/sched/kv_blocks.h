/* sched/kv_blocks: the paged KV cache's block manager (host bookkeeping; the
 * cache memory lives in the backend). n_blocks blocks of block_size token
 * slots; a LIFO free list (the block freed last is reused first, while it is
 * warm in cache); per-block reference counts (prefix sharing, forks); per-
 * sequence block tables. Position p of a sequence lives in slot
 * blocks[p / block_size] * block_size + p % block_size.
 *
 * The engine calls this API (src/engine): keep its names and semantics.
 * Reservation is all-or-nothing: SD_EFULL (or SD_ENOMEM) leaves everything
 * unchanged, and the scheduler then preempts. Single-threaded: the scheduler
 * thread owns the pool.
 *
 * Sharing rule: a block whose reference count is > 1 is read-only. Share
 * (sd_kv_seq_fork, sd_kv_block_incref) only blocks whose slots are all
 * written; before a sequence writes into a shared block, sd_kv_seq_make_private
 * gives it its own copy (copy-on-write; the backend copies the slots).
 *
 * Cached blocks (a prefix cache, sched/prefix_cache.h): a block marked
 * cached keeps its slots when its last reference goes: it waits on the
 * evictable queue (least recently released first) instead of the free list,
 * and a sequence may take it back (sd_kv_seq_share). A reservation takes
 * free blocks first and then evicts from the queue's head, telling the
 * cache (the evict callback) before the block is reused; free and evictable
 * blocks together are what a reservation can have.
 *
 * Invariants (checked by sd_kv_pool_check; after every mutating call when
 * built with -DSD_KV_VALIDATE, which the tests do): every block is either on
 * the free list exactly once with reference count 0 and not cached, or on the
 * evictable queue exactly once with count 0 and cached, or on neither with
 * count >= 1; a sequence's table holds distinct, referenced blocks. */
#ifndef SD_SCHED_KV_BLOCKS_H
#define SD_SCHED_KV_BLOCKS_H

#include <stdint.h>

#include "core/err.h"

typedef struct sd_kv_pool sd_kv_pool;

typedef struct sd_kv_seq {
    int32_t *blocks; /* block table: blocks[i] holds positions [i*bs, (i+1)*bs) */
    int n_blocks;    /* blocks held */
    int cap;         /* allocated entries of blocks */
} sd_kv_seq;

int sd_kv_pool_create(sd_kv_pool **out, int n_blocks, int block_size, sd_err *err);
void sd_kv_pool_free(sd_kv_pool *p);
int sd_kv_pool_used(const sd_kv_pool *p);        /* blocks with reference count >= 1 */
int sd_kv_pool_free_blocks(const sd_kv_pool *p); /* blocks a reservation can take: free + evictable */
int sd_kv_pool_evictable(const sd_kv_pool *p);   /* cached blocks nobody holds (on the queue) */
int sd_kv_pool_cached(const sd_kv_pool *p);      /* blocks marked cached, held or not */
int sd_kv_pool_total(const sd_kv_pool *p);
int sd_kv_pool_block_size(const sd_kv_pool *p);
/* Blocks that hold n_positions positions: ceil(n_positions / block_size). */
int sd_kv_blocks_for(const sd_kv_pool *p, int n_positions);

void sd_kv_seq_init(sd_kv_seq *s);
/* Blocks sd_kv_seq_reserve(p, s, n_positions) would take from the free list
 * (0 when s already holds them): what the scheduler budgets before admitting. */
int sd_kv_seq_need(const sd_kv_pool *p, const sd_kv_seq *s, int n_positions);
/* Makes s hold blocks for positions [0, n_positions). 0, or SD_EFULL/SD_ENOMEM
 * with nothing changed. Never shrinks. */
int sd_kv_seq_reserve(sd_kv_pool *p, sd_kv_seq *s, int n_positions);
/* Keeps the blocks for positions [0, n_positions) and releases the rest
 * (rollback of rejected speculative positions). */
void sd_kv_seq_truncate(sd_kv_pool *p, sd_kv_seq *s, int n_positions);
/* Releases every block and the table; s is then as after sd_kv_seq_init. */
void sd_kv_seq_free(sd_kv_pool *p, sd_kv_seq *s);
/* Slot of position pos (which must be reserved). */
int sd_kv_seq_slot(const sd_kv_pool *p, const sd_kv_seq *s, int pos);
/* Slots of positions [pos0, pos0 + n) into out (n,): a step's slot mapping. */
void sd_kv_seq_slots(const sd_kv_pool *p, const sd_kv_seq *s, int pos0, int n, int32_t *out);
/* Shares src's first n_blocks blocks (all of them if it holds fewer) with dst,
 * whose previous blocks are released (reference counts + 1). 0, or SD_ENOMEM
 * with nothing changed. */
int sd_kv_seq_fork(sd_kv_pool *p, sd_kv_seq *dst, const sd_kv_seq *src, int n_blocks);
/* Copy-on-write before writing position pos: if the block holding it is shared,
 * s gets a fresh block in its place (the shared one loses a reference) and the
 * function returns 1 with *copy_from / *copy_to set: the backend must copy those
 * blocks' slots. Returns 0 when the block is already private, SD_EFULL when no
 * block is free (nothing changed), SD_EINVAL when pos is not reserved. */
int sd_kv_seq_make_private(sd_kv_pool *p, sd_kv_seq *s, int pos, int32_t *copy_from,
                           int32_t *copy_to);

/* The prefix cache's side. on_evict(ctx, block) is called when a cached
 * block is taken off the evictable queue for reuse (its slots are about to
 * be overwritten): the cache forgets it; the block is no longer cached when
 * the call returns. */
void sd_kv_pool_on_evict(sd_kv_pool *p, void (*on_evict)(void *ctx, int32_t block), void *ctx);
/* Marks a block cached (it must be held: reference count >= 1) or not; a
 * block unmarked while on the evictable queue goes to the free list. */
void sd_kv_block_set_cached(sd_kv_pool *p, int32_t block, int cached);
int sd_kv_block_cached(const sd_kv_pool *p, int32_t block);
/* Appends a cached block (held or on the evictable queue) to s's table with a
 * reference: a matched prefix. 0, or SD_ENOMEM / SD_EINVAL (not cached, or
 * already in s) with nothing changed. */
int sd_kv_seq_share(sd_kv_pool *p, sd_kv_seq *s, int32_t block);

/* References held outside sequence tables. incref: the block
 * must be in use; decref returns it to the free list at zero. */
void sd_kv_block_incref(sd_kv_pool *p, int32_t block);
void sd_kv_block_decref(sd_kv_pool *p, int32_t block);
int sd_kv_block_refs(const sd_kv_pool *p, int32_t block);

/* Checks the pool's invariants (O(n_blocks)), and reports the first violation a
 * validating build saw in any call: 0, or SD_ESTATE naming it. */
int sd_kv_pool_check(const sd_kv_pool *p, sd_err *err);
/* Checks one sequence against the pool: distinct blocks in range, each referenced. */
int sd_kv_seq_check(const sd_kv_pool *p, const sd_kv_seq *s, sd_err *err);

#endif

/* sched/kv_blocks: the paged KV cache's block manager (host bookkeeping; the
 * cache memory lives in the backend). n_blocks blocks of block_size token
 * slots; a LIFO free list; per-block reference counts (ready for prefix
 * sharing); per-sequence block tables. Position p of a sequence lives in slot
 * blocks[p / block_size] * block_size + p % block_size.
 *
 * The engine calls this API (src/engine): keep its names and semantics.
 * Reservation is all-or-nothing: SD_EFULL leaves everything unchanged, and the
 * scheduler then preempts. Build with -DSD_KV_VALIDATE to check invariants
 * after every call. */
#ifndef SD_SCHED_KV_BLOCKS_H
#define SD_SCHED_KV_BLOCKS_H

#include <stdint.h>

#include "core/err.h"

typedef struct sd_kv_pool sd_kv_pool;

typedef struct sd_kv_seq {
    int32_t *blocks; /* block table */
    int n_blocks;    /* blocks held */
    int cap;
} sd_kv_seq;

int sd_kv_pool_create(sd_kv_pool **out, int n_blocks, int block_size, sd_err *err);
void sd_kv_pool_free(sd_kv_pool *p);
int sd_kv_pool_used(const sd_kv_pool *p);
int sd_kv_pool_free_blocks(const sd_kv_pool *p);
int sd_kv_pool_block_size(const sd_kv_pool *p);

void sd_kv_seq_init(sd_kv_seq *s);
/* Makes s hold blocks for positions [0, n_positions). 0, or SD_EFULL/SD_ENOMEM
 * with nothing changed. Never shrinks. */
int sd_kv_seq_reserve(sd_kv_pool *p, sd_kv_seq *s, int n_positions);
/* Keeps the blocks for positions [0, n_positions) and releases the rest
 * (rollback of rejected speculative positions). */
void sd_kv_seq_truncate(sd_kv_pool *p, sd_kv_seq *s, int n_positions);
/* Releases every block and the table. */
void sd_kv_seq_free(sd_kv_pool *p, sd_kv_seq *s);
/* Slot of position pos (which must be reserved). */
int sd_kv_seq_slot(const sd_kv_pool *p, const sd_kv_seq *s, int pos);
/* Shares src's first n_blocks blocks with dst (reference counts + 1). */
int sd_kv_seq_fork(sd_kv_pool *p, sd_kv_seq *dst, const sd_kv_seq *src, int n_blocks);

#endif

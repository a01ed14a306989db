/* sched/prefix_cache: automatic prefix caching over the KV block pool.
 *
 * A full block of a sequence is known by a key: a 128-bit hash of the key of
 * the blocks before it (the root's for the first) and its block_size tokens.
 * The cache maps keys to blocks whose slots hold that prefix's KV; an entry
 * also keeps the parent's key and the tokens, and a lookup compares both, so
 * a block is matched only where a 128-bit key of a different prefix equals
 * the parent's (no hash of one block's tokens alone decides).
 *
 * Cached blocks are marked in the pool (sched/kv_blocks.h): released by every
 * sequence they wait on its evictable queue, and the pool evicts the one
 * released longest ago when a reservation finds no free block, telling the
 * cache first. A request that finds its prompt's first blocks here shares
 * them (sd_kv_seq_share) and computes only the rest.
 *
 * The proposer's KV (MTP, EAGLE-3, a draft LM) lives in the same slots. An
 * entry says whether its block's proposer slots were written too, and for
 * the proposers whose slot i is made from token i + 1 (MTP, EAGLE-3) which
 * token followed the block when they were: a request that will draft may
 * share a block only where both hold for its own tokens.
 *
 * Single-threaded, like the pool: the engine's step thread owns both. */
#ifndef SD_SCHED_PREFIX_CACHE_H
#define SD_SCHED_PREFIX_CACHE_H

#include <stdint.h>

#include "core/err.h"
#include "sched/kv_blocks.h"

typedef struct sd_pc_key {
    uint64_t h[2];
} sd_pc_key;

typedef struct sd_pcache sd_pcache;

/* A cache over pool (which must outlive it; the pool's evict callback is
 * the cache's until sd_pcache_free). */
int sd_pcache_create(sd_pcache **out, sd_kv_pool *pool, sd_err *err);
/* Forgets every entry (the blocks are unmarked: idle ones go to the free
 * list) and frees the cache. */
void sd_pcache_free(sd_pcache *c);

/* The key of the empty prefix, and of the block after parent holding tok
 * (block_size tokens). */
sd_pc_key sd_pcache_root(void);
sd_pc_key sd_pcache_key(sd_pc_key parent, const int32_t *tok, int block_size);

/* The longest run of cached blocks holding the first blocks of tok (n_tok
 * tokens), at most max_blocks: their ids into blocks (no references are
 * taken: share them before the pool's next reservation) and, where keys is
 * not NULL, each one's key into keys; their count returned. *n_prop: how many of them, from the first, have their proposer
 * slots written for these tokens (an entry's next token, where it has one,
 * must be tok's token after that block: tok must hold it). */
int sd_pcache_match(const sd_pcache *c, const int32_t *tok, int n_tok, int max_blocks,
                    int32_t *blocks, sd_pc_key *keys, int *n_prop);

/* Offers block (held by a sequence) as the block after parent holding btok,
 * and returns its key. prop: its proposer slots are written; next: the token
 * after it they were made with, or -1 where they are made from the block's
 * own tokens. Where the key has no entry the block becomes its entry; where
 * it has this block, prop upgrades it; where it has another block without
 * proposer slots and this one has them, this one takes its place; otherwise
 * nothing changes. */
sd_pc_key sd_pcache_insert(sd_pcache *c, sd_pc_key parent, const int32_t *btok, int32_t block,
                           int prop, int32_t next);

int sd_pcache_entries(const sd_pcache *c);
/* The table against the pool's marks: 0, or SD_ESTATE naming the first fault. */
int sd_pcache_check(const sd_pcache *c, sd_err *err);

#endif

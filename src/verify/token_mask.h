/* verify/token_mask: which vocabulary tokens a byte automaton takes from a
 * state (the JSON masks of response_format: verify/json_mask.h,
 * verify/json_schema.h), without feeding most of them.
 *
 * The fast path: the byte values that leave the state as it is (feeding
 * one of them gives an equal state: inside a JSON string with no length
 * bound, every plain character; inside a number's digits, the digits) are
 * found by 256 one-byte feeds; a token all of whose bytes are among them
 * takes the state back to itself, so it is taken, decided by a test of its
 * precomputed set of byte values against theirs. A token whose first byte
 * the state does not take is not taken (a bad state stays bad). The others
 * are fed whole, as a mask without the fast path would. The result is
 * exactly that mask's. */
#ifndef SD_VERIFY_TOKEN_MASK_H
#define SD_VERIFY_TOKEN_MASK_H

#include <stddef.h>
#include <stdint.h>

/* the tokens' bytes and their sets of byte values */
typedef struct sd_token_table {
    int n;                       /* tokens */
    const unsigned char **bytes; /* (n,) each token's bytes, or NULL: none (special, unknown) */
    size_t *len;                 /* (n,) */
    uint64_t (*set)[4];          /* (n,) the byte values each holds */
    int32_t *none;               /* the tokens without bytes (n_none of them) */
    int n_none;
} sd_token_table;

/* A table of n tokens: bytes_of(ctx, t, &len) gives token t's bytes (kept
 * by reference: they must outlive the table), NULL where it has none. 0, or
 * -1 out of memory. */
int sd_token_table_build(sd_token_table *tt, int n,
                         const unsigned char *(*bytes_of)(const void *ctx, int32_t t, size_t *len),
                         const void *ctx);
void sd_token_table_free(sd_token_table *tt);

/* A byte automaton: copy, feed (0 while it takes the bytes, else
 * nonzero), equal (1 when two states go on alike), hash (equal states hash
 * alike); id: which automaton it is, unique in the process (0: json_mask's;
 * a schema's compilation serial), so that a mask cache never mixes two. */
typedef struct sd_byte_automaton {
    const void *ctx;
    void (*copy)(const void *ctx, void *dst, const void *src);
    int (*feed)(const void *ctx, void *st, const unsigned char *b, size_t n);
    int (*equal)(const void *ctx, const void *a, const void *b);
    uint64_t (*hash)(const void *ctx, const void *st);
    uint64_t id;
} sd_byte_automaton;

/* the most bytes a state of these automata takes */
#define SD_MASK_STATE_MAX 512

/* verify/json_mask's states (sd_json_state) and a schema's
 * (sd_jschema_state of s) as such automata */
struct sd_jschema;
sd_byte_automaton sd_json_automaton(void);
sd_byte_automaton sd_jschema_automaton(const struct sd_jschema *s);

/* row[t] = -inf for every token with bytes that a, from st, does not take
 * (tokens without bytes are the caller's). scratch: room for one state.
 * Returns the tokens fed whole (the rest took the fast path or none). */
int sd_token_mask(const sd_token_table *tt, const sd_byte_automaton *a, const void *st,
                  void *scratch, float *row);

/* The masks of the states met lately, by automaton and state: a text's
 * states recur (inside a string, after a key, between values), and a mask
 * found again is its bits applied, not a walk of the vocabulary. Sets of 4
 * ways, the least recently used of a set replaced. Not thread-safe. */
typedef struct sd_mask_cache sd_mask_cache;
/* A cache for tt's tokens in about `bytes` of memory (at least 4 masks).
 * 0, or -1 out of memory. */
int sd_mask_cache_create(sd_mask_cache **out, const sd_token_table *tt, size_t bytes);
void sd_mask_cache_free(sd_mask_cache *c);
/* sd_token_mask (the same row), through the cache. Returns the tokens fed
 * whole (0 on a hit). */
int sd_token_mask_cached(sd_mask_cache *c, const sd_token_table *tt, const sd_byte_automaton *a,
                         const void *st, void *scratch, float *row);
/* lookups that found their mask, and those that did not */
void sd_mask_cache_counts(const sd_mask_cache *c, uint64_t *hits, uint64_t *misses);

#endif

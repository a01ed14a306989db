/* verify/schema_cache: one compilation of a response_format json_schema for
 * the requests that send the same schema text (structured-output clients
 * send one schema with every request). The compiled schema is shared,
 * read-only (sd_jschema_feed takes it const), so its automaton's id is the
 * same for all of them and the JSON mask cache (verify/token_mask.h) finds
 * one request's masks for the next. Thread-safe. */
#ifndef SD_VERIFY_SCHEMA_CACHE_H
#define SD_VERIFY_SCHEMA_CACHE_H

#include "core/err.h"
#include "verify/json_schema.h"

typedef struct sd_schema_cache sd_schema_cache;

/* A cache keeping up to max_idle schemas no request holds (the least
 * recently used go first). 0, or SD_ENOMEM. */
int sd_schema_cache_create(sd_schema_cache **out, int max_idle);
/* Frees the cache; every schema must have been put back. */
void sd_schema_cache_free(sd_schema_cache *c);
/* The compiled schema of text (NUL-terminated), held until put back: the
 * cached one where an equal text was compiled, else a new compilation.
 * 0, or sd_jschema_compile's error with err naming the fault. */
int sd_schema_cache_get(sd_schema_cache *c, const char *text, const sd_jschema **out,
                        sd_err *err);
/* Puts back a schema _get gave (NULL: nothing). */
void sd_schema_cache_put(sd_schema_cache *c, const sd_jschema *s);
/* compilations so far, and the gets that found one */
void sd_schema_cache_counts(sd_schema_cache *c, uint64_t *compiled, uint64_t *found);

/* Test-only: fn (NULL: none, the default) is called with the text at the
 * start of every compilation a get makes, on the thread that compiles, in
 * every cache of the process (tests/net/test_server.c holds one there to
 * see that the server goes on answering meanwhile). */
typedef void sd_schema_cache_hook(const char *text);
void sd_schema_cache_set_test_hook(sd_schema_cache_hook *fn);

#endif

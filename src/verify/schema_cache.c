#include "verify/schema_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct sc_entry {
    char *text;
    size_t len;
    uint64_t hash, used; /* used: the get or put it was last touched at */
    sd_jschema *s;
    int refs;
} sc_entry;

struct sd_schema_cache {
    pthread_mutex_t mu;
    sc_entry *e;
    int n, cap, max_idle;
    uint64_t clock, compiled, found;
};

/* (set by tests only: sd_schema_cache_set_test_hook) */
static _Atomic(sd_schema_cache_hook *) test_hook;

void sd_schema_cache_set_test_hook(sd_schema_cache_hook *fn) { atomic_store(&test_hook, fn); }

static uint64_t text_hash(const char *t, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)t[i]) * 0x100000001b3ull;
    return h;
}

int sd_schema_cache_create(sd_schema_cache **out, int max_idle)
{
    sd_schema_cache *c = calloc(1, sizeof *c);
    if (!c)
        return SD_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    c->max_idle = max_idle < 0 ? 0 : max_idle;
    *out = c;
    return 0;
}

static void drop(sd_schema_cache *c, int i)
{
    sd_jschema_free(c->e[i].s);
    free(c->e[i].text);
    c->e[i] = c->e[--c->n];
}

void sd_schema_cache_free(sd_schema_cache *c)
{
    if (!c)
        return;
    while (c->n)
        drop(c, c->n - 1);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* drops the least recently used idle schemas past max_idle (under mu) */
static void trim(sd_schema_cache *c)
{
    for (;;) {
        int idle = 0, lru = -1;
        for (int i = 0; i < c->n; i++)
            if (!c->e[i].refs) {
                idle++;
                if (lru < 0 || c->e[i].used < c->e[lru].used)
                    lru = i;
            }
        if (idle <= c->max_idle)
            return;
        drop(c, lru);
    }
}

int sd_schema_cache_get(sd_schema_cache *c, const char *text, const sd_jschema **out,
                        sd_err *err)
{
    *out = NULL;
    const size_t len = strlen(text);
    const uint64_t h = text_hash(text, len);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        sc_entry *x = &c->e[i];
        if (x->hash == h && x->len == len && !memcmp(x->text, text, len)) {
            x->refs++;
            x->used = ++c->clock;
            c->found++;
            *out = x->s;
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* compiled outside the lock (a large schema takes a while); two gets of
     * one new text may both compile it: each keeps its own entry */
    sd_schema_cache_hook *hook = atomic_load(&test_hook);
    if (hook)
        hook(text);
    sd_jschema *s = NULL;
    int rc = sd_jschema_compile(text, len, &s, err);
    if (rc)
        return rc;
    char *t = malloc(len + 1);
    pthread_mutex_lock(&c->mu);
    if (t && c->n == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 8;
        sc_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (e) {
            c->e = e;
            c->cap = cap;
        }
    }
    if (!t || c->n == c->cap) {
        pthread_mutex_unlock(&c->mu);
        free(t);
        sd_jschema_free(s);
        return sd_err_set(err, SD_ENOMEM, "json_schema: out of memory");
    }
    memcpy(t, text, len + 1);
    c->e[c->n++] = (sc_entry){.text = t, .len = len, .hash = h, .used = ++c->clock, .s = s,
                              .refs = 1};
    c->compiled++;
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return 0;
}

void sd_schema_cache_put(sd_schema_cache *c, const sd_jschema *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].s == s && c->e[i].refs > 0) {
            c->e[i].refs--;
            c->e[i].used = ++c->clock;
            break;
        }
    trim(c);
    pthread_mutex_unlock(&c->mu);
}

void sd_schema_cache_counts(sd_schema_cache *c, uint64_t *compiled, uint64_t *found)
{
    pthread_mutex_lock(&c->mu);
    *compiled = c->compiled;
    *found = c->found;
    pthread_mutex_unlock(&c->mu);
}

/* verify/schema_cache: one compilation for equal texts while held or
 * idle-kept, the least recently used idle ones dropped past the limit, bad
 * schemas refused and not kept, and gets and puts from several threads. */
#include <pthread.h>
#include <string.h>

#include "test.h"
#include "verify/schema_cache.h"

static const char A[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}";
static const char B[] = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}";
static const char C[] = "{\"enum\":[\"x\",\"y\"]}";

TEST(equal_texts_share_one_compilation)
{
    sd_schema_cache *c;
    ASSERT_OK(sd_schema_cache_create(&c, 1));
    const sd_jschema *a1, *a2, *b;
    ASSERT_OK(sd_schema_cache_get(c, A, &a1, NULL));
    char copy[sizeof A];
    memcpy(copy, A, sizeof A); /* equal text, another buffer */
    ASSERT_OK(sd_schema_cache_get(c, copy, &a2, NULL));
    ASSERT(a1 == a2);
    ASSERT_OK(sd_schema_cache_get(c, B, &b, NULL));
    ASSERT(b != a1);
    uint64_t compiled, found;
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 2);
    ASSERT_EQ(found, 1);
    /* one held by a request stays; idle ones past max_idle (1) go, least
     * recently used first */
    sd_schema_cache_put(c, a1);
    sd_schema_cache_put(c, b); /* idle: A (older), B */
    const sd_jschema *x;
    ASSERT_OK(sd_schema_cache_get(c, B, &x, NULL));
    ASSERT(x == b); /* kept */
    sd_schema_cache_put(c, x);
    ASSERT_OK(sd_schema_cache_get(c, A, &x, NULL)); /* A was held once more: a2 */
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 2);
    sd_schema_cache_put(c, x);
    sd_schema_cache_put(c, a2);
    /* now both idle: A most recent, B dropped */
    ASSERT_OK(sd_schema_cache_get(c, B, &x, NULL));
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 3);
    sd_schema_cache_put(c, x);
    sd_schema_cache_put(c, NULL); /* nothing */
    sd_schema_cache_free(c);
}

TEST(a_bad_schema_is_refused_and_not_kept)
{
    sd_schema_cache *c;
    ASSERT_OK(sd_schema_cache_create(&c, 4));
    const sd_jschema *s = (const sd_jschema *)1;
    sd_err err = {0};
    ASSERT_EQ(sd_schema_cache_get(c, "{\"type\":\"objekt\"}", &s, &err), SD_EINVAL);
    ASSERT(s == NULL);
    ASSERT(err.msg[0]);
    uint64_t compiled, found;
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 0);
    ASSERT_EQ(sd_schema_cache_get(c, "{\"type\":\"objekt\"}", &s, &err), SD_EINVAL);
    sd_schema_cache_free(c);
}

typedef struct worker {
    sd_schema_cache *c;
    uint64_t seed;
    int bad;
} worker;

static void *work(void *p)
{
    worker *w = p;
    const char *const texts[3] = {A, B, C};
    const sd_jschema *held[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 2000; i++) {
        w->seed = w->seed * 6364136223846793005ull + 1442695040888963407ull;
        const int k = (int)(w->seed >> 33) % 3;
        if (held[k]) {
            sd_schema_cache_put(w->c, held[k]);
            held[k] = NULL;
        } else if (sd_schema_cache_get(w->c, texts[k], &held[k], NULL)) {
            w->bad++;
        } else {
            /* a held schema works: its initial state exists */
            sd_jschema_state st;
            sd_jschema_init(held[k], &st);
            w->bad += st.bad != 0;
        }
    }
    for (int k = 0; k < 3; k++)
        sd_schema_cache_put(w->c, held[k]);
    return NULL;
}

TEST(gets_and_puts_from_several_threads)
{
    sd_schema_cache *c;
    ASSERT_OK(sd_schema_cache_create(&c, 1));
    enum { NT = 4 };
    pthread_t t[NT];
    worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){c, sd_test_seed() + (uint64_t)i, 0};
        ASSERT_EQ(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        ASSERT_EQ(w[i].bad, 0);
    }
    uint64_t compiled, found;
    sd_schema_cache_counts(c, &compiled, &found);
    fprintf(stderr, "  %llu compiled, %llu found\n", (unsigned long long)compiled,
            (unsigned long long)found);
    ASSERT(compiled >= 3);
    ASSERT(found > compiled);
    sd_schema_cache_free(c);
}

TEST_MAIN(T(equal_texts_share_one_compilation), T(a_bad_schema_is_refused_and_not_kept),
          T(gets_and_puts_from_several_threads))

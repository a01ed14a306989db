/* verify/token_mask against the mask it stands for (every token fed whole
 * from the state), on random vocabularies of JSON-ish bytes, from states
 * reached by random prefixes of JSON objects (json_mask) and of documents
 * of a schema (json_schema); the fast path must decide most tokens inside
 * a string. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "verify/json_mask.h"
#include "verify/json_schema.h"
#include "verify/token_mask.h"

enum { V = 3000 };

typedef struct vocab {
    unsigned char *bytes[V];
    size_t len[V];
} vocab;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const unsigned char *bytes_of(const void *ctx, int32_t t, size_t *len)
{
    const vocab *v = ctx;
    *len = v->len[t];
    return v->bytes[t];
}

/* tokens: words, JSON punctuation, digits, whitespace runs, escapes,
 * UTF-8 pieces, and a few without bytes (specials) */
static void make_vocab(vocab *v, uint64_t *s)
{
    static const char *const parts[] = {"\"", "{", "}", "[", "]", ":", ",", " ", "  ", "\n", "\t",
                                        "\\", "\\n", "\\u00", "true", "false", "null", "-", ".",
                                        "e", "E", "+", "0", "1", "9", "name", "kind", "cat", "dog",
                                        "age", "\xc3", "\xa9", "\xe2\x9c\x93", "x", "_", "/"};
    const size_t np = sizeof parts / sizeof parts[0];
    for (int t = 0; t < V; t++) {
        if (t % 500 == 7) { /* no bytes */
            v->bytes[t] = NULL;
            v->len[t] = 0;
            continue;
        }
        unsigned char buf[64];
        size_t n = 0;
        const int k = 1 + (int)(rnd(s) % 4);
        for (int i = 0; i < k; i++) {
            const char *p = rnd(s) % 3 ? parts[rnd(s) % np] : NULL;
            if (p) {
                size_t l = strlen(p);
                if (n + l < sizeof buf) {
                    memcpy(buf + n, p, l);
                    n += l;
                }
            } else if (n < sizeof buf) {
                buf[n++] = (unsigned char)('a' + rnd(s) % 26);
            }
        }
        v->bytes[t] = malloc(n);
        memcpy(v->bytes[t], buf, n);
        v->len[t] = n;
    }
}

/* a fresh random vocabulary (the test's seed) and its table */
static int table_of_random_vocab(vocab *v, sd_token_table *tt)
{
    uint64_t seed = sd_test_seed() | 1;
    make_vocab(v, &seed);
    return sd_token_table_build(tt, V, bytes_of, v);
}

static void free_vocab(vocab *v)
{
    for (int t = 0; t < V; t++)
        free(v->bytes[t]);
}

/* the mask of every token fed whole vs sd_token_mask, from st; *fast:
 * tokens the fast path decided */
static void compare(const sd_token_table *tt, const sd_byte_automaton *a, const void *st,
                    void *scratch, long *fast)
{
    static float want[V], got[V];
    for (int t = 0; t < V; t++) {
        want[t] = got[t] = 0;
        if (!tt->bytes[t])
            continue;
        a->copy(a->ctx, scratch, st);
        if (a->feed(a->ctx, scratch, tt->bytes[t], tt->len[t]))
            want[t] = -INFINITY;
    }
    int with = 0;
    for (int t = 0; t < V; t++)
        with += tt->bytes[t] != NULL;
    *fast += with - sd_token_mask(tt, a, st, scratch, got);
    for (int t = 0; t < V; t++)
        ASSERT_MSG(want[t] == got[t], "token %d (%.*s): fed %g, masked %g", t, (int)tt->len[t],
                   tt->bytes[t] ? (const char *)tt->bytes[t] : "", want[t], got[t]);
}

TEST(the_fast_mask_is_the_fed_mask)
{
    static vocab v;
    sd_token_table tt;
    ASSERT_OK(table_of_random_vocab(&v, &tt));
    /* states: every prefix of a few texts, valid and not */
    static const char *const texts[] = {
        ("{\"name\": \"a long string value with words, punctuation; and \\\"escapes\\\" \\u00e9\", "
         "\"kind\": \"cat\", \"age\": 12345, \"tags\": [\"x\", \"y\"], \"ok\": true}"),
        "{\"kind\":\"dog\",\"age\":-1.5e+3,\"tags\":[],\"ok\":null,\"name\":\"caf\xc3\xa9 \xe2\x9c\x93\"}",
        "{ \"name\" : \"\" , \"kind\" :\"bird\"}",
    };
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"kind\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},\"age\":{\"type\":\"number\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3}},"
        "\"ok\":{\"type\":[\"boolean\",\"null\"]}},\"required\":[\"name\",\"kind\"]}";
    sd_jschema *js = NULL;
    ASSERT_OK(sd_jschema_compile(schema, strlen(schema), &js, NULL));
    sd_byte_automaton am = sd_json_automaton(), as = sd_jschema_automaton(js);
    long fast_m = 0, fast_s = 0, states = 0;
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        const unsigned char *x = (const unsigned char *)texts[k];
        const size_t n = strlen(texts[k]);
        sd_json_state m, ms;
        sd_jschema_state s, ss;
        sd_json_init(&m);
        sd_jschema_init(js, &s);
        for (size_t i = 0; i <= n; i++) {
            if (!m.bad)
                compare(&tt, &am, &m, &ms, &fast_m);
            if (!s.bad)
                compare(&tt, &as, &s, &ss, &fast_s);
            states++;
            if (i < n) {
                sd_json_feed(&m, x + i, 1);
                sd_jschema_feed(js, &s, x + i, 1);
            }
        }
    }
    /* inside the strings most tokens are plain: decided without a feed */
    fprintf(stderr, "  %ld states: %ld (json_object) and %ld (schema) tokens by the fast path\n",
            states, fast_m, fast_s);
    ASSERT_GT(fast_m, states * V / 10);
    ASSERT_GT(fast_s, states * V / 20);
    sd_jschema_free(js);
    sd_token_table_free(&tt);
    free_vocab(&v);
}

/* sd_token_mask_cached against sd_token_mask on every state of the texts
 * walked twice, alternating two automata of each kind (json_object, two
 * schemas whose states may be alike byte for byte), with a cache of 4
 * masks (evictions all the time) and one that holds them all (hits) */
TEST(a_cached_mask_is_the_mask)
{
    static vocab v;
    sd_token_table tt;
    ASSERT_OK(table_of_random_vocab(&v, &tt));
    static const char *const texts[] = {
        "{\"name\": \"a string, a string, a string\", \"kind\": \"cat\", \"age\": 12, "
        "\"tags\": [\"x\", \"y\"], \"ok\": true}",
        "{\"kind\":\"dog\",\"name\":\"\\u00e9\", \"tags\":[], \"ok\":null}",
    };
    static const char schema1[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"kind\":{\"enum\":[\"cat\",\"dog\"]},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"ok\":{\"type\":[\"boolean\",\"null\"]}}}";
    /* the same layout, other literals: its states may equal schema1's bytes */
    static const char schema2[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"kind\":{\"enum\":[\"cow\",\"dog\"]},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},"
        "\"ok\":{\"type\":\"boolean\"}}}";
    sd_jschema *js[2] = {NULL, NULL};
    ASSERT_OK(sd_jschema_compile(schema1, strlen(schema1), &js[0], NULL));
    ASSERT_OK(sd_jschema_compile(schema2, strlen(schema2), &js[1], NULL));
    sd_byte_automaton au[3] = {sd_json_automaton(), sd_jschema_automaton(js[0]),
                               sd_jschema_automaton(js[1])};
    ASSERT(au[1].id != au[2].id && au[1].id != 0 && au[2].id != 0);
    static float want[V], got[V];
    const size_t sizes[2] = {1, (size_t)64 << 20};
    for (int z = 0; z < 2; z++) {
        sd_mask_cache *c = NULL;
        ASSERT_OK(sd_mask_cache_create(&c, &tt, sizes[z]));
        long checked = 0;
        for (int pass = 0; pass < 2; pass++)
            for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
                const unsigned char *x = (const unsigned char *)texts[k];
                const size_t n = strlen(texts[k]);
                sd_json_state m, ms;
                sd_jschema_state s[2], ss;
                sd_json_init(&m);
                sd_jschema_init(js[0], &s[0]);
                sd_jschema_init(js[1], &s[1]);
                for (size_t i = 0; i <= n; i++) {
                    const void *st[3] = {&m, &s[0], &s[1]};
                    void *scr[3] = {&ms, &ss, &ss};
                    const int bad[3] = {m.bad, s[0].bad, s[1].bad};
                    for (int q = 0; q < 3; q++) {
                        if (bad[q])
                            continue;
                        for (int t = 0; t < V; t++)
                            want[t] = got[t] = (float)t;
                        sd_token_mask(&tt, &au[q], st[q], scr[q], want);
                        sd_token_mask_cached(c, &tt, &au[q], st[q], scr[q], got);
                        ASSERT(!memcmp(want, got, sizeof want));
                        checked++;
                    }
                    if (i < n) {
                        sd_json_feed(&m, x + i, 1);
                        sd_jschema_feed(js[0], &s[0], x + i, 1);
                        sd_jschema_feed(js[1], &s[1], x + i, 1);
                    }
                }
            }
        uint64_t hits, misses;
        sd_mask_cache_counts(c, &hits, &misses);
        fprintf(stderr, "  a cache of %zu bytes: %ld masks, %llu found, %llu made\n", sizes[z],
                checked, (unsigned long long)hits, (unsigned long long)misses);
        ASSERT_EQ((long)(hits + misses), checked);
        if (z == 1) /* the second pass finds every mask of the first */
            ASSERT_GT((long)hits, checked / 2);
        sd_mask_cache_free(c);
    }
    sd_jschema_free(js[0]);
    sd_jschema_free(js[1]);
    sd_token_table_free(&tt);
    free_vocab(&v);
}

TEST_MAIN(T(the_fast_mask_is_the_fed_mask), T(a_cached_mask_is_the_mask))

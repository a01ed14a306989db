/* verify/json_mask against jansson's parser: every prefix of a JSON object
 * (hand-written ones and random ones at a fresh seed, fed a byte at a time
 * and in random pieces) is accepted and whole only at its end; random
 * one-byte edits of them are whole exactly where jansson reads an object
 * (edits that make what this mask allows on purpose and jansson does not -
 * invalid UTF-8, overflowing numbers - left out); the limits (depth,
 * whitespace) hold. */
#include <jansson.h>
#include <string.h>

#include "core/util.h"
#include "test.h"
#include "verify/json_mask.h"

static uint64_t next_rand(uint64_t *s)
{
    *s = sd_mix64(*s + 0x9e3779b97f4a7c15ull);
    return *s;
}

/* 1: every proper prefix of t is accepted and not whole, t itself whole */
static int prefixes_ok(const char *t, size_t n, uint64_t *rng)
{
    sd_json_state s;
    sd_json_init(&s);
    for (size_t i = 0; i < n; i++) {
        if (sd_json_feed(&s, (const unsigned char *)t + i, 1))
            return 0;
        if (i + 1 < n && sd_json_done(&s))
            return 0;
    }
    if (!sd_json_done(&s))
        return 0;
    /* in random pieces: the same */
    sd_json_init(&s);
    for (size_t i = 0; i < n;) {
        size_t k = 1 + next_rand(rng) % 7;
        k = k < n - i ? k : n - i;
        if (sd_json_feed(&s, (const unsigned char *)t + i, k))
            return 0;
        i += k;
    }
    return sd_json_done(&s);
}

static int whole(const char *t, size_t n)
{
    sd_json_state s;
    sd_json_init(&s);
    return sd_json_feed(&s, (const unsigned char *)t, n) == 0 && sd_json_done(&s);
}

TEST(hand_written_objects_and_not_objects)
{
    uint64_t rng = 1;
    static const char *const good[] = {
        "{}", "{ }", "{\"a\":1}", "{\"a\": [1, 2.5, -0.5e+3, 0, -0, 1E9, true, false, null]}",
        "{\"k\":{\"n\":{\"x\":[[],[{}]]}}}", "{\"s\":\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\"}",
        "{\"a\" : \"b\" , \"c\" :[ ]}", "{\"\xc3\xa9\":\"\xf0\x9f\x98\x80\"}",
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(good); i++)
        ASSERT_MSG(prefixes_ok(good[i], strlen(good[i]), &rng), "%s", good[i]);
    static const char *const bad[] = {
        "[]", "1", "\"a\"", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":1.}",
        "{\"a\":.5}", "{\"a\":-}", "{\"a\":1e}", "{\"a\":tru}", "{\"a\":True}", "{\"a\":[1,]}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":\"\x01\"}", "{\"a\":1}}", "{\"a\":1} x",
        "{'a':1}", "{\"a\":[}", "{\"a\":1]", " {}", "{} ", "\n{\"a\":1}",
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(bad); i++)
        ASSERT_MSG(!whole(bad[i], strlen(bad[i])), "%s", bad[i]);
    /* an unfinished one is a prefix, not whole */
    sd_json_state s;
    sd_json_init(&s);
    ASSERT_OK(sd_json_feed(&s, (const unsigned char *)"{\"a\":[1,{\"b\":\"c", 14));
    ASSERT(!sd_json_done(&s));
}

TEST(limits_on_depth_and_whitespace)
{
    char deep[200] = "{\"a\":";
    size_t n = strlen(deep);
    for (int i = 0; i < SD_JSON_MAX_DEPTH; i++)
        deep[n++] = '[';
    sd_json_state s;
    sd_json_init(&s);
    ASSERT_EQ(sd_json_feed(&s, (const unsigned char *)deep, n), -1); /* one past the limit */
    sd_json_init(&s);
    ASSERT_OK(sd_json_feed(&s, (const unsigned char *)deep, n - 1));
    char ws[80] = "{";
    memset(ws + 1, ' ', SD_JSON_MAX_WS);
    sd_json_init(&s);
    ASSERT_OK(sd_json_feed(&s, (const unsigned char *)ws, 1 + SD_JSON_MAX_WS));
    ASSERT_EQ(sd_json_feed(&s, (const unsigned char *)" ", 1), -1);
}

/* a random JSON value of depth at most d */
static json_t *random_value(uint64_t *rng, int d)
{
    switch (next_rand(rng) % (d > 0 ? 7 : 5)) {
    case 0: return json_integer((json_int_t)(next_rand(rng) % 2000) - 1000);
    case 1: return json_real((double)(next_rand(rng) % 100000) / 7.0 - 5000);
    case 2: {
        static const char *const strs[] = {"", "x", "a \"q\" \\ b", "tab\there", "nl\n", "\xc3\xa9t\xc3\xa9",
                                           "\xf0\x9f\x98\x80", "ctl\x01"};
        return json_string(strs[next_rand(rng) % SD_ARRAY_LEN(strs)]);
    }
    case 3: return json_boolean(next_rand(rng) % 2);
    case 4: return json_null();
    case 5: {
        json_t *a = json_array();
        for (int i = (int)(next_rand(rng) % 4); i > 0; i--)
            json_array_append_new(a, random_value(rng, d - 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int i = (int)(next_rand(rng) % 4); i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "k%d", (int)(next_rand(rng) % 50));
            json_object_set_new(o, k, random_value(rng, d - 1));
        }
        return o;
    }
    }
}

TEST(random_objects_and_their_edits_agree_with_jansson)
{
    uint64_t seed = sd_test_seed(), rng = seed;
    static const char edits[] = "{}[]:,\"0123456789.-+eEtrfalsn \\/x";
    int docs = 0, edited = 0, objects = 0;
    for (int trial = 0; trial < 400; trial++) {
        json_t *o = json_object();
        for (int i = (int)(next_rand(&rng) % 5); i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "f%d", i);
            json_object_set_new(o, k, random_value(&rng, 4));
        }
        size_t flags = next_rand(&rng) % 2 ? JSON_COMPACT : JSON_INDENT((int)(next_rand(&rng) % 3));
        char *t = json_dumps(o, flags);
        json_decref(o);
        size_t n = strlen(t);
        ASSERT_MSG(prefixes_ok(t, n, &rng), "seed %llu: %s", (unsigned long long)seed, t);
        docs++;
        /* one-byte edits: whole here exactly where jansson reads an object */
        for (int e = 0; e < 8; e++) {
            char buf[4096];
            if (n + 2 > sizeof buf)
                break;
            memcpy(buf, t, n + 1);
            size_t at = next_rand(&rng) % n, m = n;
            char c = edits[next_rand(&rng) % (sizeof edits - 1)];
            switch (next_rand(&rng) % 3) {
            case 0: buf[at] = c; break;
            case 1: memmove(buf + at + 1, buf + at, n - at + 1); buf[at] = c; m++; break;
            default: memmove(buf + at, buf + at + 1, n - at); m--; break;
            }
            json_error_t je;
            json_t *v = json_loadb(buf, m, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
            if (!v && (strstr(je.text, "overflow") || strstr(je.text, "UTF-8") || strstr(je.text, "decode byte") ||
                       strstr(je.text, "surrogate")))
                continue; /* what the mask allows on purpose */
            /* (whitespace around the object: jansson's, not the mask's) */
            int theirs = v && json_is_object(v) && buf[0] == '{' && buf[m - 1] == '}';
            objects += theirs;
            json_decref(v);
            ASSERT_MSG(whole(buf, m) == theirs, "seed %llu: jansson %s (%s): %.*s",
                       (unsigned long long)seed, theirs ? "reads an object" : "refuses it",
                       v ? "" : je.text, (int)m, buf);
            edited++;
        }
        free(t);
    }
    fprintf(stderr, "  %d objects (every prefix), %d edits (%d still objects)\n", docs, edited,
            objects);
}

TEST_MAIN(T(hand_written_objects_and_not_objects), T(limits_on_depth_and_whitespace),
          T(random_objects_and_their_edits_agree_with_jansson))

#include "verify/token_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "verify/json_mask.h"
#include "verify/json_schema.h"

static void jm_copy(const void *c, void *d, const void *s)
{
    (void)c;
    *(sd_json_state *)d = *(const sd_json_state *)s;
}

static int jm_feed(const void *c, void *st, const unsigned char *b, size_t n)
{
    (void)c;
    return sd_json_feed(st, b, n);
}

static int jm_equal(const void *c, const void *a, const void *b)
{
    (void)c;
    return sd_json_equal(a, b);
}

static void js_copy(const void *c, void *d, const void *s)
{
    (void)c;
    sd_jschema_copy(d, s);
}

static int js_feed(const void *c, void *st, const unsigned char *b, size_t n)
{
    return sd_jschema_feed(c, st, b, n);
}

static int js_equal(const void *c, const void *a, const void *b)
{
    (void)c;
    return sd_jschema_equal(a, b);
}

sd_byte_automaton sd_json_automaton(void)
{
    return (sd_byte_automaton){NULL, jm_copy, jm_feed, jm_equal};
}

sd_byte_automaton sd_jschema_automaton(const struct sd_jschema *s)
{
    return (sd_byte_automaton){s, js_copy, js_feed, js_equal};
}

int sd_token_table_build(sd_token_table *tt, int n,
                         const unsigned char *(*bytes_of)(const void *ctx, int32_t t, size_t *len),
                         const void *ctx)
{
    memset(tt, 0, sizeof *tt);
    tt->bytes = calloc((size_t)n, sizeof *tt->bytes);
    tt->len = calloc((size_t)n, sizeof *tt->len);
    tt->set = calloc((size_t)n, sizeof *tt->set);
    tt->none = malloc((size_t)(n > 0 ? n : 1) * sizeof *tt->none);
    if (!tt->bytes || !tt->len || !tt->set || !tt->none) {
        sd_token_table_free(tt);
        return -1;
    }
    tt->n = n;
    for (int32_t t = 0; t < n; t++) {
        size_t len = 0;
        const unsigned char *b = bytes_of(ctx, t, &len);
        tt->bytes[t] = len ? b : NULL;
        tt->len[t] = b ? len : 0;
        if (!tt->bytes[t])
            tt->none[tt->n_none++] = t;
        for (size_t i = 0; b && i < len; i++)
            tt->set[t][b[i] >> 6] |= 1ull << (b[i] & 63);
    }
    return 0;
}

void sd_token_table_free(sd_token_table *tt)
{
    free(tt->bytes);
    free(tt->len);
    free(tt->set);
    free(tt->none);
    memset(tt, 0, sizeof *tt);
}

int sd_token_mask(const sd_token_table *tt, const sd_byte_automaton *a, const void *st,
                  void *scratch, float *row)
{
    /* the byte values taken from st, and those that leave it as it is */
    uint64_t ok[4] = {0, 0, 0, 0}, same[4] = {0, 0, 0, 0};
    for (int v = 0; v < 256; v++) {
        const unsigned char c = (unsigned char)v;
        a->copy(a->ctx, scratch, st);
        if (a->feed(a->ctx, scratch, &c, 1) == 0) {
            ok[v >> 6] |= 1ull << (v & 63);
            if (a->equal(a->ctx, scratch, st))
                same[v >> 6] |= 1ull << (v & 63);
        }
    }
    int fed = 0;
    for (int t = 0; t < tt->n; t++) {
        if (!tt->bytes[t])
            continue;
        const unsigned char b0 = tt->bytes[t][0];
        if (!(ok[b0 >> 6] >> (b0 & 63) & 1)) { /* its first byte is not taken: nor is it */
            row[t] = -INFINITY;
            continue;
        }
        const uint64_t *s = tt->set[t];
        if (!((s[0] & ~same[0]) | (s[1] & ~same[1]) | (s[2] & ~same[2]) | (s[3] & ~same[3])))
            continue; /* every byte keeps the state: taken */
        a->copy(a->ctx, scratch, st);
        fed++;
        if (a->feed(a->ctx, scratch, tt->bytes[t], tt->len[t]) != 0)
            row[t] = -INFINITY;
    }
    return fed;
}

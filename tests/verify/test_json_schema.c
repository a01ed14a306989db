/* verify/json_schema against a reference validator written here: jansson
 * parses the text, a plain recursive walk checks the document against the
 * schema (the same subset, JSON Schema's meaning, oneOf as exactly one),
 * and a walk over the raw text checks what only the text shows (keys in
 * "properties" order, keys and enum values spelled as jansson writes them,
 * whitespace runs, nesting). Random documents of several schemas (nested
 * objects, arrays, enums, anyOf, oneOf, nullable, $ref recursion, any
 * values) are accepted at every prefix and whole exactly where the
 * reference says so; random one-byte edits get the reference's verdict;
 * and every prefix the automaton accepts completes (greedily, byte by
 * byte, by what the automaton allows) into a document the reference
 * accepts - so an accepted prefix is never a dead end. Hand-written cases
 * pin the byte where a text goes bad, the limits, and the refusals. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "test.h"
#include "verify/json_schema.h"

static uint64_t next_rand(uint64_t *s)
{
    *s = sd_mix64(*s + 0x9e3779b97f4a7c15ull);
    return *s;
}

static sd_jschema *compile_or_null(const char *schema, sd_err *err)
{
    sd_jschema *s = NULL;
    sd_err_clear(err);
    if (sd_jschema_compile(schema, strlen(schema), &s, err))
        return NULL;
    return s;
}

/* the byte at which feeding t goes bad (n when it does not) */
static size_t bad_at(const sd_jschema *s, const char *t, size_t n)
{
    sd_jschema_state st;
    sd_jschema_init(s, &st);
    for (size_t i = 0; i < n; i++)
        if (sd_jschema_feed(s, &st, (const unsigned char *)t + i, 1))
            return i;
    return n;
}

static int whole(const sd_jschema *s, const char *t, size_t n)
{
    sd_jschema_state st;
    sd_jschema_init(s, &st);
    return sd_jschema_feed(s, &st, (const unsigned char *)t, n) == 0 && sd_jschema_done(s, &st);
}

/* t goes bad at byte want (>= 0), is whole (-1), or a prefix only (-2) */
static int goes_as_said(const sd_jschema *s, const char *t, int want)
{
    const size_t n = strlen(t), at = bad_at(s, t, n);
    const int w = whole(s, t, n);
    const int ok = want >= 0 ? at == (size_t)want : at == n && w == (want == -1);
    if (!ok)
        fprintf(stderr, "  %s: bad at %zu, whole %d (want %d)\n", t, at, w, want);
    return ok;
}

/* ---- the reference ---------------------------------------------------- */

typedef struct ref {
    json_t *root;
    int max_depth;
} ref;

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* $ref and allOf of one, followed */
static json_t *resolve(const ref *r, json_t *sch)
{
    for (;;) {
        json_t *x = json_object_get(sch, "$ref");
        if (x) {
            const char *p = json_string_value(x);
            if (!strcmp(p, "#"))
                sch = r->root;
            else if (!strncmp(p, "#/$defs/", 8))
                sch = json_object_get(json_object_get(r->root, "$defs"), p + 8);
            else
                sch = json_object_get(json_object_get(r->root, "definitions"), p + 14);
            continue;
        }
        if ((x = json_object_get(sch, "allOf"))) {
            sch = json_array_get(x, 0);
            continue;
        }
        return sch;
    }
}

static int is_any(json_t *sch)
{
    static const char *const kw[] = {"type",      "properties", "required", "additionalProperties",
                                     "items",     "minItems",   "maxItems", "minLength",
                                     "maxLength", "enum",       "const",    "anyOf",
                                     "oneOf"};
    if (json_is_true(sch))
        return 1;
    for (size_t i = 0; i < SD_ARRAY_LEN(kw); i++)
        if (json_object_get(sch, kw[i]))
            return 0;
    return 1;
}

/* an object of any keys (no properties listed, additionalProperties true
 * or a schema): its values' schema (true: any value), else NULL */
static json_t *open_object(json_t *sch)
{
    json_t *add = json_object_get(sch, "additionalProperties");
    if (json_object_size(json_object_get(sch, "properties")) || !(json_is_true(add) || json_is_object(add)))
        return NULL;
    return add;
}

static int has_type(json_t *sch, const char *t)
{
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty))
        return !strcmp(json_string_value(ty), t);
    for (size_t i = 0; i < json_array_size(ty); i++)
        if (!strcmp(json_string_value(json_array_get(ty, i)), t))
            return 1;
    return 0;
}

static int type_ok(json_t *sch, json_t *v)
{
    if (!json_object_get(sch, "type"))
        return 1;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return has_type(sch, "object");
    case JSON_ARRAY: return has_type(sch, "array");
    case JSON_STRING: return has_type(sch, "string");
    case JSON_INTEGER: return has_type(sch, "integer") || has_type(sch, "number");
    case JSON_REAL: return has_type(sch, "number");
    case JSON_TRUE:
    case JSON_FALSE: return has_type(sch, "boolean");
    default: return has_type(sch, "null");
    }
}

static long long int_kw(json_t *sch, const char *k, long long dflt)
{
    json_t *x = json_object_get(sch, k);
    return x ? (long long)json_integer_value(x) : dflt;
}

static size_t skip_ws(const char *t, size_t i, size_t n)
{
    while (i < n && is_ws(t[i]))
        i++;
    return i;
}

/* the end of the (valid) value at t[i] */
static size_t value_end(const char *t, size_t i, size_t n)
{
    if (t[i] == '"') {
        for (i++; i < n; i++) {
            if (t[i] == '\\')
                i++;
            else if (t[i] == '"')
                return i + 1;
        }
        return n;
    }
    if (t[i] == '{' || t[i] == '[') {
        int d = 0;
        for (; i < n; i++) {
            if (t[i] == '"') {
                i = value_end(t, i, n) - 1;
            } else if (t[i] == '{' || t[i] == '[') {
                d++;
            } else if ((t[i] == '}' || t[i] == ']') && --d == 0) {
                return i + 1;
            }
        }
        return n;
    }
    while (i < n && t[i] && strchr("0123456789+-.eEtruefalsn", t[i]))
        i++;
    return i;
}

/* containers nested in v */
static int nesting(json_t *v)
{
    int d = 0;
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x) d = nesting(x) > d ? nesting(x) : d;
        return d + 1;
    }
    if (json_is_object(v)) {
        json_object_foreach(v, k, x) d = nesting(x) > d ? nesting(x) : d;
        return d + 1;
    }
    return 0;
}

/* the text is the JSON text jansson writes for w */
static int spelled_as(json_t *w, const char *t, size_t n)
{
    char *d = json_dumps(w, JSON_ENCODE_ANY | JSON_COMPACT);
    int ok = d && strlen(d) == n && !memcmp(d, t, n);
    free(d);
    return ok;
}

static int valid(const ref *r, json_t *sch, json_t *v, const char *t, size_t n, int depth);

/* a number's text t as json_schema reads one of a number's bounds
 * (json_schema.h): no exponent, at most 15 digits from the first nonzero
 * one, 20 decimals; any other value or schema: 1 */
static int bounded_number_text(json_t *sch, json_t *v, const char *t, size_t n)
{
    int bounded = 0;
    for (int i = 0; i < 4; i++) {
        static const char *const kw[] = {"minimum", "exclusiveMinimum", "maximum",
                                         "exclusiveMaximum"};
        bounded |= json_object_get(sch, kw[i]) != NULL;
    }
    if (!bounded || !json_is_number(v) || !has_type(sch, "number"))
        return 1;
    int digits = 0, decimals = -1, lead = 1;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == 'e' || t[i] == 'E')
            return 0;
        if (t[i] == '.') {
            decimals = 0;
        } else if (t[i] >= '0' && t[i] <= '9') {
            lead &= t[i] == '0';
            digits += !lead;
            decimals += decimals >= 0;
        }
    }
    return digits <= 15 && decimals <= 20;
}

/* a number within sch's bounds (JSON Schema's meaning), or no number */
static int in_bounds(json_t *sch, json_t *v)
{
    if (!json_is_number(v))
        return 1;
    const double d = json_number_value(v);
    json_t *b;
    return !(((b = json_object_get(sch, "minimum")) && d < json_number_value(b)) ||
             ((b = json_object_get(sch, "exclusiveMinimum")) && d <= json_number_value(b)) ||
             ((b = json_object_get(sch, "maximum")) && d > json_number_value(b)) ||
             ((b = json_object_get(sch, "exclusiveMaximum")) && d >= json_number_value(b)));
}

/* the key at t[i] (ending at *ke): its index in properties (-1: not
 * listed, or spelled otherwise than jansson writes it), name and schema */
static long key_at(json_t *props, const char *t, size_t i, size_t n, size_t *ke, const char **name,
                   json_t **ps)
{
    *ke = value_end(t, i, n);
    json_t *kj = json_loadb(t + i, *ke - i, JSON_DECODE_ANY, NULL);
    long at = 0, found = -1;
    const char *k;
    json_t *x;
    json_object_foreach(props, k, x)
    {
        if (json_is_string(kj) && !strcmp(k, json_string_value(kj))) {
            *name = k;
            *ps = x;
            found = at;
            break;
        }
        at++;
    }
    if (found >= 0 && !spelled_as(kj, t + i, *ke - i))
        found = -1;
    json_decref(kj);
    return found;
}

static int object_valid(const ref *r, json_t *sch, json_t *v, const char *t, size_t n, int depth)
{
    json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required"),
           *ps = NULL;
    /* pass 0, the keys: listed, in order, once, spelled as jansson writes
     * them (a repeated key, of which jansson keeps the last value, is
     * refused before any value is looked at); pass 1, the values */
    for (int pass = 0; pass < 2; pass++) {
        long last = -1;
        size_t i = skip_ws(t, 1, n), ke;
        while (t[i] != '}') {
            const char *name = NULL;
            long at = key_at(props, t, i, n, &ke, &name, &ps);
            if (at <= last)
                return 0;
            last = at;
            i = skip_ws(t, skip_ws(t, ke, n) + 1, n); /* past ':' */
            size_t ve = value_end(t, i, n);
            if (pass && !valid(r, ps, json_object_get(v, name), t + i, ve - i, depth))
                return 0;
            i = skip_ws(t, ve, n);
            if (t[i] == ',')
                i = skip_ws(t, i + 1, n);
        }
    }
    for (size_t q = 0; q < json_array_size(req); q++)
        if (!json_object_get(v, json_string_value(json_array_get(req, q))))
            return 0;
    return 1;
}

static int array_valid(const ref *r, json_t *sch, json_t *v, const char *t, size_t n, int depth)
{
    json_t *items = json_object_get(sch, "items"), *pre = json_object_get(sch, "prefixItems");
    long long k = (long long)json_array_size(v);
    if (k < int_kw(sch, "minItems", 0) || k > int_kw(sch, "maxItems", 1LL << 40))
        return 0;
    size_t i = skip_ws(t, 1, n);
    for (size_t e = 0; t[i] != ']'; e++) {
        size_t ve = value_end(t, i, n);
        /* prefixItems' schema at e, else items (false: no item) */
        json_t *it = e < json_array_size(pre) ? json_array_get(pre, e) : items ? items : json_true();
        if (json_is_false(it) || !valid(r, it, json_array_get(v, e), t + i, ve - i, depth))
            return 0;
        i = skip_ws(t, ve, n);
        if (t[i] == ',')
            i = skip_ws(t, i + 1, n);
    }
    return 1;
}

/* an open object's text: each value (its own text: a repeated key's too)
 * against vals */
static int open_valid(const ref *r, json_t *vals, const char *t, size_t n, int depth)
{
    size_t i = skip_ws(t, 1, n);
    while (t[i] != '}') {
        i = skip_ws(t, skip_ws(t, value_end(t, i, n), n) + 1, n); /* past the key and ':' */
        size_t ve = value_end(t, i, n);
        json_t *mv = json_loadb(t + i, ve - i, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        int ok = mv && valid(r, vals, mv, t + i, ve - i, depth);
        json_decref(mv);
        if (!ok)
            return 0;
        i = skip_ws(t, ve, n);
        if (t[i] == ',')
            i = skip_ws(t, i + 1, n);
    }
    return 1;
}

/* v (whose text is t) against sch; depth: containers around it */
static int valid(const ref *r, json_t *sch, json_t *v, const char *t, size_t n, int depth)
{
    if (!v) /* a repeated key: jansson kept its last value, the text's order check refuses it */
        return 0;
    sch = resolve(r, sch);
    if (json_is_array(v) || json_is_object(v))
        depth++;
    if (is_any(sch))
        return depth - (json_is_array(v) || json_is_object(v)) + nesting(v) <= r->max_depth;
    if (depth > r->max_depth)
        return 0;
    json_t *x;
    if ((x = json_object_get(sch, "anyOf")) || (x = json_object_get(sch, "oneOf"))) {
        int hits = 0;
        for (size_t i = 0; i < json_array_size(x); i++)
            hits += valid(r, json_array_get(x, i), v, t, n,
                          depth - (json_is_array(v) || json_is_object(v)));
        return json_object_get(sch, "anyOf") ? hits > 0 : hits == 1;
    }
    if (!type_ok(sch, v))
        return 0;
    json_t *e = json_object_get(sch, "enum"), *c = json_object_get(sch, "const");
    if (c && !(json_equal(v, c) && spelled_as(c, t, n)))
        return 0;
    if (e) {
        int found = 0;
        for (size_t i = 0; i < json_array_size(e) && !found; i++)
            found = json_equal(v, json_array_get(e, i)) && spelled_as(json_array_get(e, i), t, n);
        if (!found)
            return 0;
    }
    if (!in_bounds(sch, v) || !bounded_number_text(sch, v, t, n))
        return 0;
    if (json_is_string(v)) {
        long long k = 0;
        const char *p = json_string_value(v);
        for (size_t i = 0; i < json_string_length(v); i++)
            k += ((unsigned char)p[i] & 0xc0) != 0x80;
        return k >= int_kw(sch, "minLength", 0) && k <= int_kw(sch, "maxLength", 1LL << 40);
    }
    if (json_is_array(v))
        return array_valid(r, sch, v, t, n, depth);
    if (json_is_object(v) && open_object(sch))
        return open_valid(r, open_object(sch), t, n, depth);
    if (json_is_object(v))
        return object_valid(r, sch, v, t, n, depth);
    return 1;
}

/* whitespace runs between tokens: at most SD_JSON_MAX_WS */
static int ws_runs_ok(const char *t, size_t n)
{
    int run = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (t[i] == '\\')
                i++;
            else if (t[i] == '"')
                in_str = 0;
            continue;
        }
        in_str = t[i] == '"';
        run = is_ws(t[i]) ? run + 1 : 0;
        if (run > SD_JSON_MAX_WS)
            return 0;
    }
    return 1;
}

/* 1 valid, 0 not, -1 jansson cannot tell: what the automaton allows on
 * purpose (bytes that are not UTF-8, lone surrogates, numbers too big for
 * jansson, NUL in keys) */
static int verdict(const ref *r, const char *t, size_t n)
{
    if (!n || is_ws(t[0]) || is_ws(t[n - 1]) || !ws_runs_ok(t, n))
        return 0;
    json_error_t je;
    json_t *v = json_loadb(t, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) {
        static const char *const allowed[] = {"UTF-8",    "decode byte", "surrogate", "Unicode",
                                              "overflow", "too big",     "NUL"};
        for (size_t i = 0; i < SD_ARRAY_LEN(allowed); i++)
            if (strstr(je.text, allowed[i]))
                return -1;
        return 0;
    }
    int ok = valid(r, r->root, v, t, n, 0);
    json_decref(v);
    return ok;
}

/* ---- random documents of a schema ------------------------------------- */

static json_t *random_any(uint64_t *rng, int d)
{
    switch (next_rand(rng) % (d > 0 ? 7 : 5)) {
    case 0: return json_integer((json_int_t)(next_rand(rng) % 2000) - 1000);
    case 1: return json_real((double)(next_rand(rng) % 100000) / 8.0 - 5000);
    case 2: return json_string(next_rand(rng) % 2 ? "q\"\\" : "any");
    case 3: return json_boolean(next_rand(rng) % 2);
    case 4: return json_null();
    case 5: {
        json_t *a = json_array();
        for (int i = (int)(next_rand(rng) % 3); i > 0; i--)
            json_array_append_new(a, random_any(rng, d - 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int i = (int)(next_rand(rng) % 3); i > 0; i--) {
            char k[8];
            snprintf(k, sizeof k, "k%d", (int)(next_rand(rng) % 9));
            json_object_set_new(o, k, random_any(rng, d - 1));
        }
        return o;
    }
    }
}

/* code points, each one: ASCII, escapes jansson writes, 2- and 4-byte UTF-8 */
static const char *const CHARS[] = {"a",
                                    "b",
                                    "Z",
                                    " ",
                                    "\"",
                                    "\\",
                                    "/",
                                    "\n",
                                    "\t",
                                    "\x01",
                                    "\x7f",
                                    "\xc3\xa9",
                                    "\xf0\x9f\x98\x80"};

static json_t *gen(const ref *r, json_t *sch, uint64_t *rng, int depth);

static json_t *gen_type(const ref *r, json_t *sch, const char *ty, uint64_t *rng, int depth)
{
    if (!strcmp(ty, "object")) {
        if (depth >= 5)
            return NULL;
        json_t *vals = open_object(sch);
        if (vals) { /* (random_any's objects are one in seven) */
            json_t *o = json_object();
            for (int i = (int)(next_rand(rng) % 4); i > 0; i--) {
                char k[8];
                snprintf(k, sizeof k, "k%d", (int)(next_rand(rng) % 9));
                json_t *v = json_is_true(vals) ? random_any(rng, 2) : gen(r, vals, rng, depth + 1);
                if (v)
                    json_object_set_new(o, k, v);
            }
            return o;
        }
        json_t *o = json_object(), *props = json_object_get(sch, "properties"),
               *req = json_object_get(sch, "required"), *x;
        const char *k;
        json_object_foreach(props, k, x)
        {
            int required = 0;
            for (size_t q = 0; q < json_array_size(req); q++)
                required |= !strcmp(json_string_value(json_array_get(req, q)), k);
            if (!required && next_rand(rng) % 2)
                continue;
            json_t *v = gen(r, x, rng, depth + 1);
            if (!v && required) {
                json_decref(o);
                return NULL;
            }
            if (v)
                json_object_set_new(o, k, v);
        }
        return o;
    }
    if (!strcmp(ty, "array")) {
        if (depth >= 5)
            return NULL;
        json_t *a = json_array(), *items = json_object_get(sch, "items"),
               *pre = json_object_get(sch, "prefixItems");
        long long lo = int_kw(sch, "minItems", 0), hi = int_kw(sch, "maxItems", lo + 3);
        if (json_is_false(items) && hi > (long long)json_array_size(pre))
            hi = (long long)json_array_size(pre);
        long long k = lo + (long long)(next_rand(rng) % 4);
        k = k > hi ? hi : k;
        for (long long i = 0; i < k; i++) {
            json_t *it = (size_t)i < json_array_size(pre) ? json_array_get(pre, (size_t)i) : items;
            json_t *v = it ? gen(r, it, rng, depth + 1) : random_any(rng, 2);
            if (!v) {
                if (i < lo) {
                    json_decref(a);
                    return NULL;
                }
                break;
            }
            json_array_append_new(a, v);
        }
        return a;
    }
    if (!strcmp(ty, "string")) {
        long long lo = int_kw(sch, "minLength", 0), hi = int_kw(sch, "maxLength", lo + 6);
        long long k = lo + (long long)(next_rand(rng) % 7);
        k = k > hi ? hi : k;
        char buf[256] = "";
        for (long long i = 0; i < k; i++)
            strcat(buf, CHARS[next_rand(rng) % SD_ARRAY_LEN(CHARS)]);
        return json_string(buf);
    }
    if (!strcmp(ty, "integer")) { /* within the bounds, their ends often */
        long long lo = -10000, hi = 10000;
        json_t *b;
        if ((b = json_object_get(sch, "minimum")))
            lo = (long long)ceil(json_number_value(b));
        if ((b = json_object_get(sch, "exclusiveMinimum")))
            lo = (long long)floor(json_number_value(b)) + 1;
        if ((b = json_object_get(sch, "maximum")))
            hi = (long long)floor(json_number_value(b));
        if ((b = json_object_get(sch, "exclusiveMaximum")))
            hi = (long long)ceil(json_number_value(b)) - 1;
        hi = hi < lo ? lo + 20000 : hi; /* (a minimum alone) */
        const uint64_t u = next_rand(rng);
        return json_integer(u % 4 == 0   ? lo
                            : u % 4 == 1 ? hi
                                         : lo + (long long)(u / 4 % (uint64_t)(hi - lo + 1)));
    }
    if (!strcmp(ty, "number")) { /* sixty-fourths within the bounds, their ends often */
        double lo = -7000 * 64, hi = 8625 * 64;
        json_t *b;
        if ((b = json_object_get(sch, "minimum")))
            lo = fmax(lo, ceil(64 * json_number_value(b)));
        if ((b = json_object_get(sch, "exclusiveMinimum")))
            lo = fmax(lo, floor(64 * json_number_value(b)) + 1);
        if ((b = json_object_get(sch, "maximum")))
            hi = fmin(hi, floor(64 * json_number_value(b)));
        if ((b = json_object_get(sch, "exclusiveMaximum")))
            hi = fmin(hi, ceil(64 * json_number_value(b)) - 1);
        if (hi < lo)
            return NULL;
        const uint64_t u = next_rand(rng);
        const double k = u % 4 == 0 ? lo : u % 4 == 1 ? hi : lo + (double)(u / 4 % (uint64_t)(hi - lo + 1));
        return fmod(k, 64) == 0 && next_rand(rng) % 2 ? json_integer((json_int_t)(k / 64))
                                                       : json_real(k / 64);
    }
    if (!strcmp(ty, "boolean"))
        return json_boolean(next_rand(rng) % 2);
    return json_null();
}

/* a random document valid against sch (NULL: none found within the nesting) */
static json_t *gen(const ref *r, json_t *sch, uint64_t *rng, int depth)
{
    sch = resolve(r, sch);
    if (is_any(sch))
        return random_any(rng, depth < 4 ? 2 : 0);
    json_t *x = json_object_get(sch, "anyOf");
    x = x ? x : json_object_get(sch, "oneOf");
    if (x) {
        size_t n = json_array_size(x), at = next_rand(rng) % n;
        for (size_t i = 0; i < n; i++) {
            json_t *v = gen(r, json_array_get(x, (at + i) % n), rng, depth);
            if (v)
                return v;
        }
        return NULL;
    }
    if ((x = json_object_get(sch, "const")))
        return json_deep_copy(x);
    if ((x = json_object_get(sch, "enum"))) { /* (a value within the bounds) */
        size_t n = json_array_size(x), at = next_rand(rng) % n;
        for (size_t i = 0; i < n; i++)
            if (in_bounds(sch, json_array_get(x, (at + i) % n)))
                return json_deep_copy(json_array_get(x, (at + i) % n));
        return NULL;
    }
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty))
        return gen_type(r, sch, json_string_value(ty), rng, depth);
    size_t n = json_array_size(ty), at = next_rand(rng) % n;
    for (size_t i = 0; i < n; i++) {
        json_t *v =
            gen_type(r, sch, json_string_value(json_array_get(ty, (at + i) % n)), rng, depth);
        if (v)
            return v;
    }
    return NULL;
}

/* compact text with 0-2 whitespace bytes at random token boundaries */
static char *sprinkle_ws(const char *t, uint64_t *rng)
{
    size_t n = strlen(t);
    char *o = malloc(3 * n + 1);
    size_t w = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        int boundary = !in_str && strchr("{[,:}]", c);
        if (boundary && (c == '}' || c == ']' || c == ',' || c == ':') && i > 0)
            for (int k = (int)(next_rand(rng) % 3); k > 0; k--)
                o[w++] = " \t\n\r"[next_rand(rng) % 4];
        o[w++] = c;
        if (in_str && c == '\\')
            o[w++] = t[++i];
        else if (c == '"')
            in_str = !in_str;
        if (boundary && (c == '{' || c == '[' || c == ',' || c == ':') && i + 1 < n)
            for (int k = (int)(next_rand(rng) % 3); k > 0; k--)
                o[w++] = " \t\n\r"[next_rand(rng) % 4];
    }
    o[w] = 0;
    return o;
}

static char *serialize(json_t *v, uint64_t *rng)
{
    char *t = NULL;
    switch (next_rand(rng) % 5) {
    case 0: return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    case 1: return json_dumps(v, JSON_ENCODE_ANY);
    case 2: return json_dumps(v, JSON_ENCODE_ANY | JSON_INDENT((int)(1 + next_rand(rng) % 3)));
    case 3: return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);
    default:
        t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        char *o = sprinkle_ws(t, rng);
        free(t);
        return o;
    }
}

/* buf = t (n > 0 bytes, room for n + 2) with one random edit: a byte of
 * edits put in place of one, inserted, a byte deleted, or a truncation;
 * returns its length */
static size_t random_edit(char *buf, const char *t, size_t n, const char *edits, uint64_t *rng)
{
    memcpy(buf, t, n + 1);
    size_t at = next_rand(rng) % n, m = n;
    char c = edits[next_rand(rng) % strlen(edits)];
    switch (next_rand(rng) % 4) {
    case 0: buf[at] = c; break;
    case 1:
        memmove(buf + at + 1, buf + at, n - at + 1);
        buf[at] = c;
        m++;
        break;
    case 2:
        memmove(buf + at, buf + at + 1, n - at);
        m--;
        break;
    default: m = at + 1; break; /* a truncation */
    }
    return m;
}

/* ---- checks on one text ----------------------------------------------- */

/* every prefix accepted, whole exactly where the reference (verdict_of:
 * 1, 0, -1 cannot tell) reads a valid text; fed a byte at a time, in random
 * pieces, and through copies */
static int prefixes_ok_by(const sd_jschema *s, int (*verdict_of)(const void *, const char *, size_t),
                          const void *r, const char *t, size_t n, uint64_t *rng)
{
    sd_jschema_state st, cp;
    sd_jschema_init(s, &st);
    for (size_t i = 0; i < n; i++) {
        if (sd_jschema_feed(s, &st, (const unsigned char *)t + i, 1)) {
            fprintf(stderr, "  rejected at byte %zu\n", i);
            return 0;
        }
        int v = verdict_of(r, t, i + 1);
        if (v >= 0 && v != sd_jschema_done(s, &st)) {
            fprintf(stderr, "  at byte %zu: done %d, reference %d\n", i, sd_jschema_done(s, &st),
                    v);
            return 0;
        }
    }
    if (!sd_jschema_done(s, &st))
        return 0;
    sd_jschema_init(s, &st);
    for (size_t i = 0; i < n;) {
        size_t k = 1 + next_rand(rng) % 9;
        k = k < n - i ? k : n - i;
        sd_jschema_copy(&cp, &st); /* (a copy goes on as the original would) */
        if (sd_jschema_feed(s, &cp, (const unsigned char *)t + i, k))
            return 0;
        st = cp;
        i += k;
    }
    return sd_jschema_done(s, &st);
}

static int doc_verdict(const void *r, const char *t, size_t n) { return verdict(r, t, n); }

static int prefixes_ok(const sd_jschema *s, const ref *r, const char *t, size_t n, uint64_t *rng)
{
    return prefixes_ok_by(s, doc_verdict, r, t, n, rng);
}

/* the bytes a completion may use: JSON's, and every byte of the schema */
static void completion_alphabet(const char *schema, char *alpha, size_t cap)
{
    /* (closers first, then what goes on to the next key or item, so that
     * it ends) */
    static const char first[] = "\"}],:0ntf{[-.eE1a\\urlsbcdABCDF";
    size_t w = 0;
    for (size_t i = 0; first[i] && w + 1 < cap; i++)
        alpha[w++] = first[i];
    for (size_t i = 0; schema[i] && w + 1 < cap; i++)
        if (!memchr(alpha, schema[i], w) && (unsigned char)schema[i] >= 0x20)
            alpha[w++] = schema[i];
    alpha[w] = 0;
}

/* completes an accepted prefix greedily (the first byte of alpha the
 * automaton allows, each time): 1 when that reaches a whole text the
 * reference (verdict_of) accepts (or cannot judge), 0 otherwise */
static int completes_by(const sd_jschema *s, int (*verdict_of)(const void *, const char *, size_t),
                        const void *r, const char *t, size_t n, const char *alpha)
{
    enum { CAP = 8192 };
    char *buf = malloc(n + CAP);
    memcpy(buf, t, n);
    sd_jschema_state st, tr;
    sd_jschema_init(s, &st);
    if (sd_jschema_feed(s, &st, (const unsigned char *)t, n)) {
        free(buf);
        return 0;
    }
    size_t m = n;
    while (!sd_jschema_done(s, &st) && m < n + CAP) {
        size_t i = 0;
        for (; alpha[i]; i++) {
            sd_jschema_copy(&tr, &st);
            if (!sd_jschema_feed(s, &tr, (const unsigned char *)alpha + i, 1))
                break;
        }
        if (!alpha[i]) {
            fprintf(stderr, "  dead end after: %.*s\n", (int)m, buf);
            free(buf);
            return 0;
        }
        buf[m++] = alpha[i];
        st = tr;
    }
    int v = sd_jschema_done(s, &st) ? verdict_of(r, buf, m) : 0;
    if (!v)
        fprintf(stderr, "  completion %s: %.*s\n",
                sd_jschema_done(s, &st) ? "refused by the reference" : "too long",
                (int)(m < 600 ? m : 600), buf);
    free(buf);
    return v != 0;
}

static int completes(const sd_jschema *s, const ref *r, const char *t, size_t n, const char *alpha)
{
    return completes_by(s, doc_verdict, r, t, n, alpha);
}

/* ---- the schemas ------------------------------------------------------ */

static const char *const SCHEMAS[] = {
    /* a record: lengths, nullable, enum, nested object, bounded array */
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":5},"
    "\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":[\"string\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},\"maxItems\":3},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"integer\"}},\"required\":[\"city\"],"
    "\"additionalProperties\":false},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\",\"u\"]},"
    "\"score\":{\"type\":\"number\"}},"
    "\"required\":[\"name\",\"age\",\"role\"],\"additionalProperties\":false}",
    /* a discriminated union by const, through $defs */
    "{\"$defs\":{\"shape\":{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":"
    "\"number\"}},"
    "\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"rect\"},\"w\":{\"type\":"
    "\"integer\"},"
    "\"h\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"w\"],\"additionalProperties\":false},"
    "{\"type\":\"null\"}]}},"
    "\"type\":\"object\",\"properties\":{\"shapes\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/"
    "$defs/shape\"},"
    "\"minItems\":1,\"maxItems\":4}},\"required\":[\"shapes\"]}",
    /* a tree */
    "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
    "\"value\":{\"type\":\"integer\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/"
    "$defs/node\"}}},"
    "\"required\":[\"value\"],\"additionalProperties\":false}}}",
    /* a linked list, nullable by anyOf */
    "{\"definitions\":{\"list\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\","
    "\"properties\":{"
    "\"head\":{\"type\":\"string\",\"maxLength\":3},\"tail\":{\"$ref\":\"#/definitions/list\"}},"
    "\"required\":[\"head\",\"tail\"]}]}},\"$ref\":\"#/definitions/list\"}",
    /* scalars that overlap: integer, number, a short string, an enum, arrays */
    "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"},{\"type\":\"string\",\"maxLength\":2}"
    ","
    "{\"enum\":[1,2.5,-0.25,\"x\",\"xyz\",true,null]},"
    "{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"boolean\"]},\"minItems\":1}]}",
    /* oneOf told apart by a const key and by type */
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"},\"x\":{\"type\":"
    "\"integer\"}},"
    "\"required\":[\"t\",\"x\"],\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"b\"},\"y\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\"},\"minItems\":1}},\"required\":[\"t\",\"y\"],"
    "\"additionalProperties\":false},"
    "{\"type\":\"string\",\"minLength\":1}]}",
    /* objects that begin alike: the key's value decides, deep inside */
    "{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"x\":{"
    "\"type\":\"integer\"}},"
    "\"required\":[\"x\"]},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]},"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"x\":{"
    "\"type\":\"string\"}},"
    "\"required\":[\"x\"]},\"b\":{\"type\":\"string\"}},\"required\":[\"a\",\"b\"]},"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\"},\"c\":{\"type\":\"boolean\"}}"
    "}]}",
    /* any values */
    "{\"type\":\"object\",\"properties\":{\"meta\":{},\"data\":{\"type\":\"array\"},\"more\":true},"
    "\"required\":[\"meta\"]}",
    /* lengths in code points (surrogate pairs under JSON_ENSURE_ASCII) */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},"
    "\"maxItems\":3}",
    /* recursion through alternatives: k's type says which schema c has,
     * at every level, objects and arrays mixed */
    "{\"$defs\":{\"a\":{\"anyOf\":["
    "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"},\"c\":{\"$ref\":\"#/$defs/"
    "a\"}},"
    "\"required\":[\"k\"]},"
    "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":1},\"c\":{\"$"
    "ref\":"
    "\"#/$defs/b\"}},\"required\":[\"k\",\"c\"]},"
    "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a\"},\"maxItems\":2}]},"
    "\"b\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"boolean\"},\"c\":{\"$"
    "ref\":"
    "\"#/$defs/a\"}}},{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"type\":\"integer\"},"
    "\"minItems\":1}]}},\"$ref\":\"#/$defs/a\"}",
    /* objects of any keys (pydantic's dict[str, Any]) beside a listed one,
     * in an anyOf with an object of listed keys, as array items */
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"object\",\"additionalProperties\":"
    "true},\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k1\":{\"type\":\"integer\"}},"
    "\"required\":[\"k1\"]},{\"type\":[\"object\",\"string\"],\"additionalProperties\":true}]},"
    "\"l\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"additionalProperties\":true},"
    "\"maxItems\":3},"
    /* values of a schema (pydantic's dict[str, int], nested dicts), and
     * one beside listed keys in an anyOf */
    "\"m\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0}},"
    "\"n\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"object\",\"additionalProperties\":"
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"array\",\"items\":{\"type\":"
    "\"boolean\"}}]}}},"
    "\"w\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k1\":{\"type\":\"string\"}},"
    "\"additionalProperties\":false},{\"type\":\"object\",\"additionalProperties\":{\"type\":"
    "\"integer\"}}]}},\"required\":[\"d\"],\"additionalProperties\":false}",
    /* integers' bounds: both sides, exclusive and real-valued ones, negative
     * ranges, one side only, a tight range far from 0, beside null, in an
     * anyOf that overlaps, and an enum's values filtered by them */
    "{\"type\":\"object\",\"properties\":{"
    "\"pct\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100},"
    "\"pos\":{\"type\":\"integer\",\"exclusiveMinimum\":0},"
    "\"neg\":{\"type\":\"integer\",\"maximum\":-10.5},"
    "\"band\":{\"type\":\"integer\",\"minimum\":-25,\"exclusiveMaximum\":-3},"
    "\"near\":{\"type\":[\"integer\",\"null\"],\"minimum\":1000,\"maximum\":1005},"
    "\"mid\":{\"type\":\"integer\",\"exclusiveMinimum\":-7.5,\"exclusiveMaximum\":7},"
    "\"alt\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":50,\"maximum\":59},"
    "{\"type\":\"integer\",\"minimum\":500,\"maximum\":599}]},"
    "\"pick\":{\"enum\":[1,5,10,50,\"x\"],\"minimum\":5,\"maximum\":10}},"
    "\"required\":[\"pct\"],\"additionalProperties\":false}",
    /* numbers' bounds (pydantic's float fields with Field(ge=, le=, gt=,
     * lt=)): a probability, one side only, both exclusive, negative beside
     * null, a tight range of a non-dyadic decimal's ends, in an anyOf of two
     * ranges and beside a bounded integer, and an enum filtered by them */
    "{\"type\":\"object\",\"properties\":{"
    "\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
    "\"t\":{\"type\":\"number\",\"exclusiveMinimum\":-273.15},"
    "\"q\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":0.5},"
    "\"n\":{\"type\":[\"number\",\"null\"],\"maximum\":-0.001},"
    "\"w\":{\"type\":\"number\",\"minimum\":19.99,\"maximum\":20.01},"
    "\"a\":{\"anyOf\":[{\"type\":\"number\",\"maximum\":-100},{\"type\":\"number\","
    "\"minimum\":100.5}]},"
    "\"i\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},{\"type\":"
    "\"number\",\"minimum\":0.5,\"maximum\":0.75}]},"
    "\"u\":{\"type\":[\"integer\",\"number\"],\"minimum\":-1.5,\"exclusiveMaximum\":1e3},"
    "\"e\":{\"enum\":[0.5,1.5,2.5],\"minimum\":1}},"
    "\"required\":[\"p\"],\"additionalProperties\":false}",
    /* tuples (pydantic's tuple[int, str] and tuple[str, ...] after a
     * prefix): prefixItems with the items past them, none (items false),
     * any, or a schema; nested, in an anyOf with a plain array, and a
     * tuple of an object and a tuple */
    "{\"type\":\"object\",\"properties\":{"
    "\"pair\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\","
    "\"maxLength\":3}],\"minItems\":2,\"maxItems\":2},"
    "\"head\":{\"type\":\"array\",\"prefixItems\":[{\"enum\":[\"a\",\"b\"]}],\"items\":{\"type\":"
    "\"boolean\"},\"maxItems\":4},"
    "\"closed\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"},{\"type\":\"number\"}],"
    "\"items\":false},"
    "\"open\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"minItems\":1},"
    "\"alt\":{\"anyOf\":[{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":"
    "\"integer\"}],\"items\":false,\"minItems\":2},{\"type\":\"array\",\"items\":{\"type\":"
    "\"string\"}}]},"
    "\"deep\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"object\",\"properties\":{\"k\":"
    "{\"type\":\"integer\"}},\"required\":[\"k\"],\"additionalProperties\":false},{\"type\":\"array\","
    "\"prefixItems\":[{\"type\":\"boolean\"}],\"items\":false}],\"minItems\":1,\"items\":false}},"
    "\"required\":[\"pair\"],\"additionalProperties\":false}",
};

TEST(random_documents_agree_with_the_reference)
{
    uint64_t seed = sd_test_seed(), rng = seed;
    static const char edits[] = "{}[]:,\"0123456789.-+eE tnulfasr\\/xabchkdwy";
    int docs = 0, edited = 0, valid_edits = 0, completions = 0;
    for (size_t si = 0; si < SD_ARRAY_LEN(SCHEMAS); si++) {
        sd_err err;
        sd_jschema *s = compile_or_null(SCHEMAS[si], &err);
        ASSERT_MSG(s, "schema %zu: %s", si, err.msg);
        ref r = {json_loads(SCHEMAS[si], 0, NULL), sd_jschema_max_depth(s)};
        char alpha[256];
        completion_alphabet(SCHEMAS[si], alpha, sizeof alpha);
        for (int trial = 0; trial < 300; trial++) {
            json_t *v = gen(&r, r.root, &rng, 0);
            if (!v)
                continue;
            char *t = serialize(v, &rng);
            json_decref(v);
            size_t n = strlen(t);
            ASSERT_MSG(verdict(&r, t, n) == 1, "seed %llu schema %zu: the reference refuses %s",
                       (unsigned long long)seed, si, t);
            ASSERT_MSG(prefixes_ok(s, &r, t, n, &rng), "seed %llu schema %zu: %s",
                       (unsigned long long)seed, si, t);
            docs++;
            for (int e = 0; e < 10; e++) {
                char buf[4096];
                if (n + 2 > sizeof buf)
                    break;
                const size_t m = random_edit(buf, t, n, edits, &rng);
                int theirs = verdict(&r, buf, m);
                if (theirs < 0)
                    continue;
                int ours = whole(s, buf, m);
                ASSERT_MSG(ours == theirs, "seed %llu schema %zu: automaton %d, reference %d: %.*s",
                           (unsigned long long)seed, si, ours, theirs, (int)m, buf);
                edited++;
                valid_edits += theirs;
                /* what it accepted of the edit completes to a valid document */
                if (e % 3 == 0) {
                    size_t k = bad_at(s, buf, m);
                    ASSERT_MSG(completes(s, &r, buf, k, alpha), "seed %llu schema %zu: prefix %.*s",
                               (unsigned long long)seed, si, (int)k, buf);
                    completions++;
                }
            }
            /* and a random prefix of the document itself */
            size_t k = next_rand(&rng) % (n + 1);
            ASSERT_MSG(completes(s, &r, t, k, alpha), "seed %llu schema %zu: prefix %.*s",
                       (unsigned long long)seed, si, (int)k, t);
            completions++;
            free(t);
        }
        json_decref(r.root);
        sd_jschema_free(s);
    }
    fprintf(stderr, "  %d documents (every prefix), %d edits (%d still valid), %d completions\n",
            docs, edited, valid_edits, completions);
    ASSERT_GT(docs, 500);
    ASSERT_GT(valid_edits, 50);
}

/* ---- hand-written cases ------------------------------------------------ */

typedef struct hcase {
    int schema; /* into SCHEMAS */
    const char *text;
    int bad_at; /* the byte at which it goes bad; -1: whole; -2: a prefix, not whole */
} hcase;

static const hcase CASES[] = {
    {0, "{\"name\":\"ab\",\"age\":3,\"role\":\"u\"}", -1},
    {0, "{\"name\":\"ab\",\"age\":3,\"role\":\"user\"}", -1},
    {0, "{\"name\":\"ab\",\"age\":3,\"role\":\"use\"}", 32}, /* no such value */
    {0, "{\"name\":\"ab\",\"age\":3,\"role\":\"users\"}", 33},
    {0, "{\"name\":\"ab\",\"age\":3.5,\"role\":\"u\"}", 20}, /* integer */
    {0, "{\"name\":\"ab\",\"age\":3e1,\"role\":\"u\"}", 20},
    {0, "{\"name\":\"\",\"age\":3,\"role\":\"u\"}", 9},                /* minLength 1 */
    {0, "{\"name\":\"abcdef\",\"age\":3,\"role\":\"u\"}", 14},         /* maxLength 5 */
    {0, "{\"name\":\"\\ud83d\\ude00\",\"age\":1,\"role\":\"u\"}", -1}, /* a pair: one */
    {0, "{\"name\":\"abcd\\ud83d\\ude00\",\"age\":1,\"role\":\"u\"}", -1},
    {0, "{\"name\":\"abcd\\ud83d\\u0041\",\"age\":1,\"role\":\"u\"}", 21}, /* not a low half */
    {0, "{\"name\":\"abcde\\n\",\"age\":1,\"role\":\"u\"}", 14},
    {0, "{\"age\":3}", 2},                      /* name is required first */
    {0, "{\"name\":\"a\",\"role\":\"u\"}", 13}, /* age is required */
    {0, "{\"name\":\"a\",\"age\":1}", 19},
    {0, "{\"name\":\"a\",\"age\":1,\"role\":\"u\",\"age\":2}", 32}, /* once, in order */
    {0, "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"],\"role\":\"u\"}", -1},
    {0, "{\"name\":\"a\",\"age\":1,\"role\":\"u\",\"tags\":[]}", 32},  /* out of order */
    {0, "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\",", 39}, /* maxItems 3 */
    {0, "{\"name\":\"a\",\"age\":1,\"role\":\"u\",\"score\":1,", 40},  /* nothing after score */
    {0, "{\"name\":\"a\",\"age\":1,\"address\":{}}", 31},              /* city required */
    {0, "{\"name\":\"a\",\"age\":1,\"address\":{\"zip\":1,\"city\":\"c\"}}", 32}, /* city first */
    {0, "{\"name\":\"a\",\"age\":1,\"email\":null,\"role\":\"u\",\"score\":-0.5e-3}", -1},
    {0, "{\"name\":\"a\",\"age\":1,\"role\":\"u\",\"other\":1}", 32},
    {0, " {}", 0},
    {0, "{\"name\":\"a\",\"age\":1,\"role\":\"u\"} ", 31},
    {0, "{\"name\"", -2},
    {1, "{\"shapes\":[{\"kind\":\"rect\",\"w\":1},null,{\"kind\":\"circle\",\"r\":2.5}]}", -1},
    {1, "{\"shapes\":[]}", 11},                            /* minItems 1 */
    {1, "{\"shapes\":[{\"kind\":\"rect\",\"r\":1}]}", 27}, /* r is circle's */
    {1, "{\"shapes\":[{\"kind\":\"circle\",\"w\":1}]}", 29},
    {1, "{\"shapes\":[{\"kind\":\"square\"}]}", 20},
    {1, "{\"shapes\":[null,null,null,null,null]}", 30},
    {2, "{\"value\":1,\"children\":[{\"value\":2,\"children\":[]},{\"value\":3}]}", -1},
    {2, "{\"value\":1,\"children\":[{\"children\":[]}]}", 25},
    {3, "null", -1},
    {3, "{\"head\":\"a\",\"tail\":{\"head\":\"b\",\"tail\":null}}", -1},
    {3, "{\"head\":\"a\",\"tail\":{\"head\":\"b\"}}", 30},
    {3, "{\"head\":\"abcd\",\"tail\":null}", 12},
    {4, "1", -1},
    {4, "-12.5e+3", -1},
    {4, "\"xyz\"", -1},
    {4, "\"xy\"", -1},
    {4, "\"xya\"", 3},
    {4, "\"xyzz\"", 4},
    {4, "[true,3]", -1},
    {4, "[]", 1},
    {4, "[1.5]", 2},
    {4, "true", -1},
    {4, "false", 0},
    {4, "nul", -2},
    {5, "{\"t\":\"a\",\"x\":1}", -1},
    {5, "{\"t\":\"b\",\"y\":[\"q\"]}", -1},
    {5, "{\"t\":\"a\",\"y\":[\"q\"]}", 10},
    {5, "\"\"", 1},
    {6, "{\"a\":{\"x\":1},\"b\":2}", -1},
    {6, "{\"a\":{\"x\":\"s\"},\"b\":\"s\"}", -1},
    {6, "{\"a\":{\"x\":1},\"b\":\"s\"}", 17}, /* the branches the 1 kept want an integer */
    {6, "{\"a\":{\"x\":\"s\"},\"b\":2}", 19},
    {6, "{\"a\":{},\"c\":true}", -1},
    {6, "{\"a\":{\"x\":1},\"c\":true}", 14}, /* (the third branch's a has no keys) */
    {7, "{\"meta\":{\"k\":[1,{\"z\":null}],\"k\":2},\"data\":[1,\"a\"]}", -1},
    {7, "{\"data\":[]}", 2},
    {8, "[\"\\ud83d\\ude00a\",\"\xc3\xa9\xc3\xa9\xc3\xa9\"]", -1},
    {8, "[\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"]", 8},
    {8, "[\"a\"]", 3},
    {10, "{\"d\":{\"x\":[1,{\"y\":null}],\"x\":2},\"u\":{\"k1\":1,\"z\":true}}", -1},
    {10, "{\"d\":{}}", -1},
    {10, "{\"u\":1}", 2},  /* d first */
    {10, "{\"d\":[]}", 5}, /* an object */
    {10, "{\"d\":{},\"u\":\"s\"}", -1},
    {10, "{\"d\":{},\"u\":5}", 12},
    {10, "{\"d\":{},\"u\":{\"k1\":1,\"z\":[1,2]},\"zz\":1}", 32}, /* the root stays closed */
    {10, "{\"d\":{},\"l\":[{\"a\":1},{},{\"b\":[]}]}", -1},
    {10, "{\"d\":{},\"l\":[{},{},{},{}]}", 21},
    {10, "{\"d\":{},\"m\":{\"a\":1,\"b\\\"c\":20}}", -1},
    {10, "{\"d\":{},\"m\":{\"a\":-1}}", 18},  /* minimum 0 (-0 would do) */
    {10, "{\"d\":{},\"m\":{\"a\":\"x\"}}", 17},
    {10, "{\"d\":{},\"n\":{\"x\":{\"y\":\"ab\",\"z\":[true]},\"q\":{}}}", -1},
    {10, "{\"d\":{},\"n\":{\"x\":{\"y\":\"abc\"}}}", 25},
    {10, "{\"d\":{},\"n\":{\"x\":5}}", 17},
    {10, "{\"d\":{},\"w\":{\"k1\":\"s\"}}", -1},
    {10, "{\"d\":{},\"w\":{\"k1\":7,\"k2\":8}}", -1},
    {10, "{\"d\":{},\"w\":{\"k1\":true}}", 18},
    {10, "{\"d\":{},\"w\":{\"k1\":\"s\",\"k2\":8}}", 21}, /* (the string's branch lists k1 only) */
    {11, "{\"pct\":0}", -1},
    {11, "{\"pct\":100}", -1},
    {11, "{\"pct\":101}", 9},   /* no 3-digit completion of 10 past 100 */
    {11, "{\"pct\":-", -2},     /* -0 is 0 */
    {11, "{\"pct\":-0}", -1},
    {11, "{\"pct\":-1", 8},     /* no negatives */
    {11, "{\"pct\":1000", 10},
    {11, "{\"pct\":10", -2},    /* 10, or 100 */
    {11, "{\"pct\":5,\"pos\":0", 15},
    {11, "{\"pct\":5,\"pos\":12345678901234}", -1},
    {11, "{\"pct\":5,\"neg\":-1", -2},   /* -1x */
    {11, "{\"pct\":5,\"neg\":-1}", 17},  /* -1 > -10.5 */
    {11, "{\"pct\":5,\"neg\":-11}", -1},
    {11, "{\"pct\":5,\"neg\":9", 15},
    {11, "{\"pct\":5,\"neg\":-0", 16},   /* -0 is 0 */
    {11, "{\"pct\":5,\"band\":-3}", 17}, /* exclusive */
    {11, "{\"pct\":5,\"band\":-25}", -1},
    {11, "{\"pct\":5,\"band\":-26", 18},
    {11, "{\"pct\":5,\"near\":100", -2},
    {11, "{\"pct\":5,\"near\":1006", 19},
    {11, "{\"pct\":5,\"near\":null}", -1},
    {11, "{\"pct\":5,\"near\":1005}", -1},
    {11, "{\"pct\":5,\"mid\":-7}", -1},
    {11, "{\"pct\":5,\"mid\":-8", 16},
    {11, "{\"pct\":5,\"mid\":7", 15},
    {11, "{\"pct\":5,\"mid\":0}", -1},
    {11, "{\"pct\":5,\"alt\":5}", 16},   /* 50-59 or 500-599 */
    {11, "{\"pct\":5,\"alt\":55}", -1},
    {11, "{\"pct\":5,\"alt\":555}", -1},
    {11, "{\"pct\":5,\"alt\":6", 15},
    {11, "{\"pct\":5,\"pick\":1", -2},   /* 10 */
    {11, "{\"pct\":5,\"pick\":1}", 17},
    {11, "{\"pct\":5,\"pick\":5}", -1},
    {11, "{\"pct\":5,\"pick\":5", -2},   /* (50 is out) */
    {11, "{\"pct\":5,\"pick\":50", 17},
    {11, "{\"pct\":5,\"pick\":\"x\"}", -1},
};

TEST(hand_written_cases_go_bad_at_the_right_byte)
{
    for (size_t i = 0; i < SD_ARRAY_LEN(CASES); i++) {
        const hcase *h = &CASES[i];
        sd_err err;
        sd_jschema *s = compile_or_null(SCHEMAS[h->schema], &err);
        ASSERT_MSG(s, "%s", err.msg);
        size_t n = strlen(h->text), at = bad_at(s, h->text, n);
        int w = whole(s, h->text, n);
        sd_jschema_free(s);
        if (h->bad_at >= 0)
            ASSERT_MSG(at == (size_t)h->bad_at, "case %zu: %s goes bad at %zu, not %d", i, h->text,
                       at, h->bad_at);
        else
            ASSERT_MSG(at == n && w == (h->bad_at == -1), "case %zu: %s: bad at %zu, whole %d", i,
                       h->text, at, w);
    }
}

TEST(state_is_small_and_copies_cheaply)
{
    fprintf(stderr, "  sizeof(sd_jschema_state) = %zu\n", sizeof(sd_jschema_state));
    ASSERT_LE(sizeof(sd_jschema_state), 512);
    sd_err err;
    sd_jschema *s = compile_or_null(SCHEMAS[0], &err);
    ASSERT_MSG(s, "%s", err.msg);
    const char *t = "{\"name\":\"ab\",\"age\":3,\"role\":\"u\"}";
    sd_jschema_state a, b;
    sd_jschema_init(s, &a);
    ASSERT_OK(sd_jschema_feed(s, &a, (const unsigned char *)t, 10));
    sd_jschema_copy(&b, &a);
    ASSERT_OK(sd_jschema_feed(s, &b, (const unsigned char *)t + 10, strlen(t) - 10));
    ASSERT(sd_jschema_done(s, &b));
    ASSERT(!sd_jschema_done(s, &a)); /* the original is untouched */
    ASSERT_EQ(sd_jschema_feed(s, &a, (const unsigned char *)"\x01", 1), -1); /* (in a string) */
    ASSERT_EQ(sd_jschema_feed(s, &a, (const unsigned char *)"\"", 1), -1);   /* bad stays bad */
    sd_jschema_free(s);
    /* inside a number, states differ by its digits only where a bound
     * needs them (the mask cache finds states by their bytes) */
    for (int bounded = 0; bounded < 2; bounded++) {
        s = compile_or_null(bounded ? "{\"type\":\"integer\",\"maximum\":999}" : "{\"type\":\"integer\"}",
                            &err);
        ASSERT_MSG(s, "%s", err.msg);
        sd_jschema_init(s, &a);
        sd_jschema_init(s, &b);
        ASSERT_OK(sd_jschema_feed(s, &a, (const unsigned char *)"12", 2));
        ASSERT_OK(sd_jschema_feed(s, &b, (const unsigned char *)"34", 2));
        ASSERT_EQ(sd_jschema_equal(&a, &b), !bounded);
        sd_jschema_free(s);
    }
}

TEST(limits_on_depth_and_whitespace)
{
    sd_err err;
    /* nested arrays to the limit, and one more */
    sd_jschema *s =
        compile_or_null("{\"$defs\":{\"a\":{\"type\":[\"array\",\"integer\"],\"items\":{\"$ref\":"
                        "\"#/$defs/a\"}}},\"$ref\":\"#/$defs/a\"}",
                        &err);
    ASSERT_MSG(s, "%s", err.msg);
    int d = sd_jschema_max_depth(s);
    ASSERT_EQ(d, SD_JSCHEMA_MAX_DEPTH);
    char deep[200];
    memset(deep, '[', (size_t)d + 1);
    ASSERT_EQ(bad_at(s, deep, (size_t)d + 1), (size_t)d);
    deep[d] = '1';
    memset(deep + d + 1, ']', (size_t)d);
    ASSERT(whole(s, deep, 2 * (size_t)d + 1));
    /* whitespace: SD_JSON_MAX_WS in a row, not one more */
    char ws[80] = "[";
    memset(ws + 1, ' ', SD_JSON_MAX_WS);
    ASSERT_EQ(bad_at(s, ws, 1 + SD_JSON_MAX_WS), 1 + SD_JSON_MAX_WS);
    ws[1 + SD_JSON_MAX_WS] = ' ';
    ASSERT_EQ(bad_at(s, ws, 2 + SD_JSON_MAX_WS), 1 + SD_JSON_MAX_WS);
    sd_jschema_free(s);

    /* a list that needs a node per level: at the deepest, no key can
     * follow "v" (next's value would not fit), so ',' is refused */
    s = compile_or_null(
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
        "\"next\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
        &err);
    ASSERT_MSG(s, "%s", err.msg);
    d = sd_jschema_max_depth(s);
    char buf[2048] = "";
    for (int i = 0; i < d; i++)
        strcat(buf, i ? ",\"next\":{\"v\":1" : "{\"v\":1");
    size_t n = strlen(buf);
    strcat(buf, ",\"n");
    ASSERT_EQ(bad_at(s, buf, strlen(buf)), n);
    buf[n] = 0;
    for (int i = 0; i < d; i++)
        strcat(buf, "}");
    ASSERT(whole(s, buf, strlen(buf)));
    sd_jschema_free(s);

    /* at the deepest, a later key candidate whose value cannot fit is
     * refused though an earlier one that fits shares its first byte */
    s = compile_or_null(
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},"
        "\"next\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
        &err);
    ASSERT_MSG(s, "%s", err.msg);
    d = sd_jschema_max_depth(s);
    buf[0] = 0;
    for (int i = 0; i < d; i++)
        strcat(buf, i ? "\"next\":{" : "{");
    n = strlen(buf);
    strcat(buf, "\"ne");
    ASSERT_EQ(bad_at(s, buf, strlen(buf)), n + 2);
    sd_jschema_free(s);

    /* an object that needs two more levels may not begin one level short */
    s = compile_or_null(
        "{\"$defs\":{\"t\":{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}},"
        "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"array\",\"minItems\":1,"
        "\"items\":{\"type\":\"null\"}}},\"required\":[\"o\"]}]}},\"$ref\":\"#/$defs/t\"}",
        &err);
    ASSERT_MSG(s, "%s", err.msg);
    d = sd_jschema_max_depth(s);
    ASSERT_EQ(d, SD_JSCHEMA_MAX_DEPTH);
    memset(deep, '[', (size_t)d);
    deep[d - 2] = '{';
    ASSERT_EQ(bad_at(s, deep, (size_t)d - 1), (size_t)d - 1); /* d-2 arrays, an object */
    deep[d - 2] = '[';
    deep[d - 1] = '{';
    ASSERT_EQ(bad_at(s, deep, (size_t)d), (size_t)d - 1); /* d-1 arrays: no room */
    sd_jschema_free(s);

    /* and an array that needs two */
    s = compile_or_null(
        "{\"$defs\":{\"t\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":"
        "\"#/$defs/t\"}}},{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"array\","
        "\"minItems\":1,\"items\":{\"type\":\"null\"}}}]}},\"$ref\":\"#/$defs/t\"}",
        &err);
    ASSERT_MSG(s, "%s", err.msg);
    d = sd_jschema_max_depth(s);
    ASSERT_EQ(d, SD_JSCHEMA_MAX_DEPTH);
    for (int k = d - 2; k <= d - 1; k++) {
        buf[0] = 0;
        for (int i = 0; i < k; i++)
            strcat(buf, "{\"a\":");
        n = strlen(buf);
        strcat(buf, "[[null]]");
        ASSERT_EQ(bad_at(s, buf, strlen(buf)), k == d - 2 ? strlen(buf) : n);
    }
    sd_jschema_free(s);

    /* alternatives that fill the pool lower the nesting limit */
    char big[8192] = "{\"$defs\":{\"t\":{\"anyOf\":[";
    for (int i = 0; i < SD_JSCHEMA_MAX_ALT; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big),
                 "%s{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":%d}",
                 i ? "," : "", i + 1);
    strcat(big, "]}},\"$ref\":\"#/$defs/t\"}");
    s = compile_or_null(big, &err);
    ASSERT_MSG(s, "%s", err.msg);
    d = sd_jschema_max_depth(s);
    fprintf(stderr, "  %d alternatives per level: nesting limit %d\n", SD_JSCHEMA_MAX_ALT, d);
    ASSERT_LT(d, SD_JSCHEMA_MAX_DEPTH);
    ASSERT_GE(d, SD_JSCHEMA_POOL / SD_JSCHEMA_MAX_ALT - 1);
    memset(deep, '[', (size_t)d);
    memset(deep + d, ']', (size_t)d);
    ASSERT(whole(s, deep, 2 * (size_t)d));
    memset(deep, '[', (size_t)d + 1);
    ASSERT_EQ(bad_at(s, deep, (size_t)d + 1), (size_t)d);
    sd_jschema_free(s);
}

TEST(misc_schemas_compile_and_behave)
{
    static const struct {
        const char *schema, *good, *bad;
    } cases[] = {
        /* no type: told by the keywords; nothing: any value */
        {"{\"properties\":{\"a\":{}}}", "{\"a\":[1,{\"b\":2}]}", "[1]"},
        /* an object with no properties: {} only (the first object of a
         * schema without properties once failed as out of memory) */
        {"{\"type\":\"object\"}", "{ }", "{\"a\":1}"},
        {"{\"type\":\"object\",\"properties\":{}}", "{}", "[]"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"array\"}]}", "[]", "{\"a\":1}"},
        {"{}", "[1,{\"b\":\"c\"}]", "[1,]"},
        {"true", "\"s\"", "'s'"},
        /* allOf of one, pydantic's description beside a $ref */
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"allOf\":[{\"$ref\":\"#/$defs/"
         "P\"}],\"description\":\"d\"}},"
         "\"$defs\":{\"P\":{\"enum\":[\"a\",\"b\"]}}}",
         "{\"p\":\"b\"}", "{\"p\":\"c\"}"},
        /* $ref "#": the root recurses */
        {"{\"type\":[\"array\",\"string\"],\"items\":{\"$ref\":\"#\"}}", "[[\"a\"],[]]", "[1]"},
        /* format ignored, annotations ignored */
        {"{\"type\":\"string\",\"format\":\"date-time\",\"title\":\"t\",\"default\":\"x\","
         "\"examples\":[\"y\"]}",
         "\"not a date\"", "1"},
        /* const with type, numbers spelled shortest, integral reals as integers */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"const\":2.0},\"b\":{\"enum\":[0.1,1e3]}},"
         "\"required\":[\"a\",\"b\"]}",
         "{\"a\":2,\"b\":0.1}", "{\"a\":2.0,\"b\":0.1}"},
        {"{\"type\":\"object\",\"properties\":{\"b\":{\"enum\":[0.1,1e3]}},\"required\":[\"b\"]}",
         "{\"b\":1000}", "{\"b\":1e3}"},
        /* integers' bounds at int64's ends; a side without one takes any
         * integer, past int64 too */
        {"{\"type\":\"integer\",\"maximum\":9223372036854775806}", "9223372036854775806",
         "9223372036854775807"},
        {"{\"type\":\"integer\",\"minimum\":-9223372036854775807}", "-9223372036854775807",
         "-9223372036854775808"},
        {"{\"type\":\"integer\",\"minimum\":-9223372036854775808,\"maximum\":0}",
         "-9223372036854775808", "1"},
        {"{\"type\":\"integer\",\"minimum\":5}", "123456789012345678901234567890", "4"},
        {"{\"type\":\"integer\",\"maximum\":5}", "-123456789012345678901234567890", "6"},
        {"{\"type\":\"integer\",\"minimum\":-1e300,\"maximum\":1e300}", "-12", "1.5"},
        /* tuples: prefixItems (told an array by it alone), items past them */
        {"{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}",
         "[1,\"a\"]", "[1,\"a\",2]"},
        {"{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}", "[]",
         "[\"a\"]"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":"
         "\"null\"}}",
         "[7,null,null]", "[7,8]"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}]}", "[7,{\"x\":[]},\"s\"]",
         "[\"s\",7]"},
        {"{\"type\":\"array\",\"items\":false}", "[]", "[1]"},
        /* enum values not of the type are dropped */
        {"{\"type\":\"string\",\"enum\":[\"a\",1,null]}", "\"a\"", "1"},
        /* a key with escapes is matched as jansson writes it */
        {"{\"type\":\"object\",\"properties\":{\"q\\\"\\u00e9\\n\":{\"type\":\"null\"}}}",
         "{\"q\\\"\xc3\xa9\\n\":null}", "{\"q\\\"\\u00e9\\n\":null}"},
        /* unevaluatedProperties false and uniqueItems false: nothing to do */
        {"{\"type\":\"object\",\"unevaluatedProperties\":false,\"properties\":{\"a\":{\"type\":"
         "\"array\","
         "\"uniqueItems\":false}}}",
         "{\"a\":[1,1]}", "{\"b\":1}"},
        /* an anyOf of consts is one enum (more than SD_JSCHEMA_MAX_ALT of them) */
        {"{\"anyOf\":[{\"const\":\"a\"},{\"const\":\"b\"},{\"const\":\"c\"},{\"const\":\"d\"},{"
         "\"const\":\"e\"},"
         "{\"const\":\"f\"},{\"const\":\"g\"},{\"const\":\"h\"},{\"const\":\"i\"},{\"const\":\"j\"}"
         ",{\"const\":\"k\"},"
         "{\"const\":\"l\"},{\"const\":\"m\"},{\"const\":\"n\"},{\"const\":\"o\"},{\"const\":\"p\"}"
         ",{\"const\":\"q\"},"
         "{\"type\":\"integer\"}]}",
         "\"q\"", "\"r\""},
        /* two alternatives whose key has the same schema: the value, one
         * alternative of it, keeps both (the first is the one that lasts) */
        {"{\"$defs\":{\"s\":{\"type\":\"string\"}},\"anyOf\":["
         "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/"
         "s\"},\"a\":{\"type\":\"integer\"}}},"
         "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/"
         "s\"},\"b\":{\"type\":\"integer\"}}}]}",
         "{\"x\":\"s\",\"a\":1}", "{\"x\":\"s\",\"c\":1}"},
        /* maxItems 0; an enum of numbers ends where the number does */
        {"{\"type\":\"array\",\"maxItems\":0}", "[]", "[1]"},
        {"{\"enum\":[10,2.5,\"a\"]}", "10", "1"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[10,-2]}}}", "{\"a\":-2}",
         "{\"a\":1}"},
        /* top-level scalars end with the text */
        {"{\"type\":\"integer\"}", "-120", "-"},
        {"{\"type\":\"number\"}", "0.5e7", "0.5e"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_err err;
        sd_jschema *s = compile_or_null(cases[i].schema, &err);
        ASSERT_MSG(s, "%s: %s", cases[i].schema, err.msg);
        int g = whole(s, cases[i].good, strlen(cases[i].good)),
            b = whole(s, cases[i].bad, strlen(cases[i].bad));
        sd_jschema_free(s);
        ASSERT_MSG(g, "%s refuses %s", cases[i].schema, cases[i].good);
        ASSERT_MSG(!b, "%s accepts %s", cases[i].schema, cases[i].bad);
    }
}

/* Numbers' bounds, held as a validator reading both as doubles holds
 * them, on a bounded number's text (no exponent, 15 digits from the first
 * nonzero one, 20 decimals): each case's texts whole or bad at a byte */
TEST(numbers_bounds_hold_at_the_right_byte)
{
    static const struct {
        const char *schema, *text;
        int bad_at; /* -1: whole; -2: a prefix, not whole */
    } cases[] = {
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.5", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.0", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.00000000000001", 15},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.999999999999999", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "2", 0},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "10", 1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "-0", -1}, /* -0 is 0 */
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "-0.1", 3},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.5e0", 3}, /* no exponent */
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.", -2},
        /* 15 digits from the first nonzero one, 20 decimals */
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.1234567890123456", 17},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.00000123456789012345", -1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.000000000000000000001", 22},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.000000000000000000000", 22},
        {"{\"type\":\"number\",\"minimum\":-1e300}", "123456789012345", -1},
        {"{\"type\":\"number\",\"minimum\":-1e300}", "1234567890123456", 15},
        /* exclusive ends, a non-dyadic decimal (0.1 is its double) */
        {"{\"type\":\"number\",\"exclusiveMinimum\":0.1}", "0.1", -2},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0.1}", "0.10000000000001", -1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0.1}", "0.09", 2},
        {"{\"type\":\"number\",\"minimum\":0.1}", "0.1", -1},
        {"{\"type\":\"number\",\"maximum\":0.1}", "0.1", -1},
        {"{\"type\":\"number\",\"maximum\":0.1}", "0.10000000000000", -1},
        {"{\"type\":\"number\",\"maximum\":0.1}", "0.100000000000001", 16},
        {"{\"type\":\"number\",\"exclusiveMaximum\":0.1}", "0.099999999999999", -1},
        {"{\"type\":\"number\",\"exclusiveMaximum\":0.1}", "0.1", 2},
        /* a bound of 17 digits: 0.30000000000000004 is the double after 0.3 */
        {"{\"type\":\"number\",\"minimum\":0.30000000000000004}", "0.3", -2},
        {"{\"type\":\"number\",\"minimum\":0.30000000000000004}", "0.300000000000001", -1},
        /* negative ranges, exclusive at 0 */
        {"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-0.001", -1},
        {"{\"type\":\"number\",\"exclusiveMaximum\":0}", "0", 0},
        {"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-0", -2},
        {"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-0.0", -2},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.25}", "-2.3", -1},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.25}", "-2.2", -2},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.25}", "-2.1", 3},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.25}", "-2.51", 4},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-2.25}", "-3", 1},
        /* a tight range far from 1: its digits, then nothing past it */
        {"{\"type\":\"number\",\"minimum\":1e-7,\"maximum\":2e-7}", "0.00000015", -1},
        {"{\"type\":\"number\",\"minimum\":1e-7,\"maximum\":2e-7}", "0.0000003", 8},
        {"{\"type\":\"number\",\"minimum\":1e-7,\"maximum\":2e-7}", "0.000001", 7},
        {"{\"type\":\"number\",\"minimum\":1e-7,\"maximum\":2e-7}", "0.0000001", -1},
        {"{\"type\":\"number\",\"minimum\":1e-7,\"maximum\":2e-7}", "1", 0},
        {"{\"type\":\"number\",\"minimum\":100.5}", "100", -2},
        {"{\"type\":\"number\",\"minimum\":100.5}", "100.4", 4},
        {"{\"type\":\"number\",\"minimum\":100.5}", "1005", -1},
        {"{\"type\":\"number\",\"minimum\":1e14}", "99999999999999.9", 14},
        {"{\"type\":\"number\",\"minimum\":1e14}", "100000000000000.5", 15},
        {"{\"type\":\"number\",\"minimum\":1e14}", "999999999999999", -1},
        /* integers within a number's bounds; the integer's own */
        {"{\"type\":[\"integer\",\"number\"],\"minimum\":-1.5,\"maximum\":3}", "-1", -1},
        {"{\"type\":[\"integer\",\"number\"],\"minimum\":-1.5,\"maximum\":3}", "-1.6", 3},
        {"{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5},{\"type\":\"number\",\"maximum\":0.5}]}",
         "0.25", -1},
        {"{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5},{\"type\":\"number\",\"maximum\":0.5}]}",
         "7", -1},
        {"{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5},{\"type\":\"number\",\"maximum\":0.5}]}",
         "1", -2},
        {"{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5},{\"type\":\"number\",\"maximum\":0.5}]}",
         "7.5", 1},
        /* an unbounded number keeps its exponent */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":"
         "\"number\",\"maximum\":0}}}",
         "{\"a\":1e400,\"b\":-1.5}", -1},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_err err;
        sd_jschema *s = compile_or_null(cases[i].schema, &err);
        ASSERT_MSG(s, "%s: %s", cases[i].schema, err.msg);
        ASSERT_MSG(goes_as_said(s, cases[i].text, cases[i].bad_at), "%s: %s (want %d)",
                   cases[i].schema, cases[i].text, cases[i].bad_at);
        sd_jschema_free(s);
    }
}

/* a random decimal's double: a mantissa of 1-6 digits at 10^-9..10^8,
 * either sign, into buf as %.*g of 1-17 digits (shortest forms and long
 * ones both) */
static double random_bound(uint64_t *rng, char *buf, size_t cap)
{
    const double m = (double)(next_rand(rng) % 1000000) / (double)(1 + next_rand(rng) % 1000);
    double v = m * pow(10, (double)((int)(next_rand(rng) % 18) - 9));
    v = next_rand(rng) % 3 == 0 ? -v : v;
    snprintf(buf, cap, "%.*g", 1 + (int)(next_rand(rng) % 17), v);
    return strtod(buf, NULL);
}

/* Numbers' bounds on random bounds (one or two of the four keywords):
 * number texts near each bound and random ones are whole exactly where
 * the reference (the values as doubles, a bounded number's text rule)
 * accepts them, and every prefix the automaton accepts completes */
TEST(random_number_bounds_agree_with_the_reference)
{
    static const char *const KW[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    uint64_t seed = sd_test_seed(), rng = seed ^ 0x9e3779b97f4a7c15u;
    int schemas = 0, refused = 0, texts = 0, accepted = 0, completions = 0;
    for (int trial = 0; trial < 400; trial++) {
        char sch[512], b[2][40];
        double bv[2];
        int w = snprintf(sch, sizeof sch, "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":%s",
                         next_rand(&rng) % 4 ? "\"number\"" : "[\"number\",\"null\"]");
        const int nb = 1 + (int)(next_rand(&rng) % 2), k0 = (int)(next_rand(&rng) % 4);
        double lo = -INFINITY, hi = INFINITY;
        int lo_ex = 0, hi_ex = 0;
        for (int i = 0; i < nb; i++) {
            bv[i] = random_bound(&rng, b[i], sizeof b[i]);
            const int kw = (k0 + 2 * i + (int)(next_rand(&rng) % 2)) % 4;
            w += snprintf(sch + w, sizeof sch - (size_t)w, ",\"%s\":%s", KW[kw], b[i]);
            if (kw < 2 && (bv[i] > lo || (bv[i] == lo && kw == 1)))
                lo = bv[i], lo_ex = kw == 1;
            else if (kw >= 2 && (bv[i] < hi || (bv[i] == hi && kw == 3)))
                hi = bv[i], hi_ex = kw == 3;
        }
        snprintf(sch + w, sizeof sch - (size_t)w, "}},\"required\":[\"v\"]}");
        sd_err err;
        sd_jschema *s = compile_or_null(sch, &err);
        if (!s) { /* only bounds that cross (or meet, one exclusive) */
            ASSERT_MSG(strstr(err.msg, "admit no number"), "%s: %s", sch, err.msg);
            ASSERT_MSG(lo > hi || (lo == hi && (lo_ex || hi_ex)), "%s refused", sch);
            refused++;
            continue;
        }
        schemas++;
        ref r = {json_loads(sch, 0, NULL), sd_jschema_max_depth(s)};
        for (int j = 0; j < 40; j++) {
            /* near a bound (its value, one unit of the last printed place
             * either way) or anywhere */
            double v = j % 4 == 3 ? (double)((int64_t)(next_rand(&rng) % 2000001) - 1000000) / 997.0
                                  : bv[j % nb];
            const int p = (int)(next_rand(&rng) % 16);
            v += (double)((int)(next_rand(&rng) % 3) - 1) * pow(10, -p);
            if (fabs(v) > 1e12)
                continue;
            char doc[128];
            snprintf(doc, sizeof doc, "{\"v\":%.*f}", p, v);
            const size_t n = strlen(doc);
            const int theirs = verdict(&r, doc, n);
            if (theirs < 0)
                continue;
            const int ours = whole(s, doc, n);
            ASSERT_MSG(ours == theirs, "seed %llu: %s: %s: automaton %d, reference %d",
                       (unsigned long long)seed, sch, doc, ours, theirs);
            texts++;
            accepted += theirs;
            /* what it accepted completes to a valid document */
            const size_t k = bad_at(s, doc, n);
            if (k > 5 && j % 2 == 0) {
                ASSERT_MSG(completes(s, &r, doc, k, "}0123456789.-"), "seed %llu: %s: prefix %.*s",
                           (unsigned long long)seed, sch, (int)k, doc);
                completions++;
            }
        }
        json_decref(r.root);
        sd_jschema_free(s);
    }
    fprintf(stderr, "  %d schemas (%d refused), %d texts (%d valid), %d completions\n", schemas,
            refused, texts, accepted, completions);
    ASSERT_GT(schemas, 200);
    ASSERT_GT(accepted, 1000);
    ASSERT_GT(texts - accepted, 1000);
}

TEST(refused_schemas_name_the_keyword)
{
    static const struct {
        const char *schema, *msg;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"^a\"}}}",
         "json_schema: \"pattern\" at $.properties.name is not supported"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}",
         "\"patternProperties\" at $ is not supported"},
        {"{\"not\":{\"type\":\"null\"}}", "\"not\" at $ is not supported"},
        {"{\"if\":{},\"then\":{},\"else\":{}}", "\"if\" at $ is not supported"},
        {"{\"maximum\":3}",
         "\"maximum\" at $ is supported with \"type\": \"integer\" or \"number\" beside it"},
        {"{\"type\":\"number\",\"minimum\":2,\"maximum\":1.5}",
         "the bounds at $ admit no number of at most 15 significant digits and 20 decimals"},
        {"{\"type\":[\"number\",\"null\"],\"minimum\":1e15}",
         "the bounds at $ admit no number of at most 15 significant digits and 20 decimals"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1e-21}",
         "the bounds at $ admit no number of at most 15 significant digits and 20 decimals"},
        {"{\"type\":\"number\",\"minimum\":0.1,\"exclusiveMaximum\":0.1}",
         "the bounds at $ admit no number of at most 15 significant digits and 20 decimals"},
        {"{\"type\":\"integer\",\"minimum\":\"0\"}", "\"minimum\" at $ must be a number"},
        {"{\"type\":\"integer\",\"minimum\":3,\"exclusiveMaximum\":3.5,\"maximum\":2}",
         "the bounds at $ admit no 64-bit integer"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":3}",
         "the bounds at $ admit no 64-bit integer"},
        {"{\"type\":\"integer\",\"minimum\":1e300}", "the bounds at $ admit no 64-bit integer"},
        {"{\"type\":\"integer\",\"exclusiveMaximum\":-9223372036854775808}",
         "the bounds at $ admit no 64-bit integer"},
        {"{\"enum\":[1,2],\"minimum\":3}", "\"enum\" at $ admits no value"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "\"multipleOf\" at $ is not supported"},
        {"{\"type\":\"array\",\"prefixItems\":[]}",
         "\"prefixItems\" at $ must be an array of 1 to 64 schemas"},
        {"{\"prefixItems\":{\"type\":\"null\"}}",
         "\"prefixItems\" at $ must be an array of 1 to 64 schemas"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
         "\"minItems\" at $ is greater than \"maxItems\" (or the items \"items\": false leaves)"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"pattern\":\"a\"}]}",
         "\"pattern\" at $.prefixItems[0] is not supported"},
        {"{\"type\":\"array\",\"items\":[{}]}", "\"items\" at $ as an array"},
        {"{\"type\":\"array\",\"contains\":{}}", "\"contains\" at $ is not supported"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "\"uniqueItems\" at $ is not supported"},
        {"{\"type\":\"object\",\"minProperties\":1}", "\"minProperties\" at $ is not supported"},
        {"{\"type\":\"object\",\"propertyNames\":{}}", "\"propertyNames\" at $ is not supported"},
        {"{\"type\":\"object\",\"dependentRequired\":{}}",
         "\"dependentRequired\" at $ is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":\"string\"}}",
         "\"additionalProperties\" at $ is not supported unless false (or true, read as false), or "
         "a schema where no properties are listed"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"pattern\":\"x\"}}",
         "\"pattern\" at $.additionalProperties is not supported"},
        {"{\"type\":\"object\",\"nullable\":true}", "\"nullable\" at $ is not supported"},
        {"{\"allOf\":[{},{}]}", "\"allOf\" at $ is not supported"},
        {"{\"type\":\"object\",\"anyOf\":[{}]}", "\"anyOf\" at $ with \"type\" beside it"},
        {"{\"$ref\":\"other.json#/a\"}", "\"$ref\" \"other.json#/a\" at $ is not supported"},
        {"{\"$ref\":\"#/$defs/missing\"}", "no such definition"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$id\":\"x\"}}}",
         "\"$id\" at $.properties.a"},
        {"{\"enum\":[{\"a\":1}]}", "\"enum\" at $: only scalar values"},
        {"{\"const\":[1]}", "\"const\" at $: only scalar values"},
        {"{\"type\":\"integer\",\"enum\":[\"a\",1.5]}", "\"enum\" at $ admits no value"},
        {"{\"type\":\"strin\"}", "\"type\" at $: unknown type \"strin\""},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "\"minLength\" at $ is greater"},
        {"{\"type\":\"array\",\"minItems\":-1}", "\"minItems\" at $ must be an integer"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}",
         "names \"a\", which is not in"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false}}",
         "false at $.properties.a admits no value"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}",
         "\"oneOf\" at $ is not supported where"},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"]},"
         "{\"type\":\"object\",\"properties\":{\"b\":{}},\"required\":[\"b\"]}]}",
         "\"oneOf\" at $ is not supported where"}, /* (open objects: {"a":1,"b":2} is both) */
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/n\"}},"
         "\"required\":[\"n\"]}},\"$ref\":\"#/$defs/n\"}",
         "admits no finite document"},
        {"{\"type\":\"string\"", "not JSON"},
        {"[]", "the schema at $ must be an object or a boolean"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_err err;
        sd_jschema *s = NULL;
        sd_err_clear(&err);
        int rc = sd_jschema_compile(cases[i].schema, strlen(cases[i].schema), &s, &err);
        ASSERT_MSG(rc == SD_EINVAL && !s, "%s: rc %d", cases[i].schema, rc);
        ASSERT_CONTAINS(err.msg, cases[i].msg);
    }
    /* alternatives that begin alike, more than the state follows */
    char big[8192] = "{\"anyOf\":[";
    for (int i = 0; i <= SD_JSCHEMA_MAX_ALT; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big),
                 "%s{\"type\":\"object\",\"properties\":{\"k%d\":{\"type\":\"null\"}}}",
                 i ? "," : "", i);
    strcat(big, "]}");
    sd_jschema *s = NULL;
    sd_err err;
    ASSERT_EQ(sd_jschema_compile(big, strlen(big), &s, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "alternatives may be open at once as objects");
    /* too large: properties, schemas */
    size_t cap = 200000;
    char *huge = malloc(cap);
    strcpy(huge, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i <= SD_JSCHEMA_MAX_PROPS; i++)
        snprintf(huge + strlen(huge), cap - strlen(huge), "%s\"p%d\":{\"type\":\"null\"}",
                 i ? "," : "", i);
    strcat(huge, "}}");
    ASSERT_EQ(sd_jschema_compile(huge, strlen(huge), &s, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "\"properties\" at $ has more than");
    strcpy(huge, "{\"type\":\"array\",\"items\":{\"anyOf\":[");
    for (int i = 0; i <= SD_JSCHEMA_MAX_NODES; i++)
        strcat(huge, i ? ",{\"type\":\"null\"}" : "{\"type\":\"null\"}");
    strcat(huge, "]}}");
    ASSERT_EQ(sd_jschema_compile(huge, strlen(huge), &s, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "schemas (at $.items.anyOf[");
    free(huge);
    /* a oneOf told apart by a required key the other, closed, lacks is fine */
    const char *ok =
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"],"
        "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"b\":{}},"
        "\"required\":[\"b\"],\"additionalProperties\":false},{\"type\":\"integer\"}]}";
    ASSERT_OK(sd_jschema_compile(ok, strlen(ok), &s, &err));
    sd_jschema_free(s);
}

/* ---- tool calls in a model's format (x-specd-calls) ------------------ */

/* a format: its literals and up to 4 tools (name, parameters) */
typedef struct cfmt {
    const char *begin, *sep, *end;
    const char *pre_head, *pre_tail, *suffix; /* a tool's prefix: head NAME tail */
    int max, specials, ntools;
    const char *name[4], *params[4];
} cfmt;

static const char TZ_PARAMS[] =
    "{\"type\":\"object\",\"properties\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]},\"n\":{\"type\":"
    "\"integer\"}},\"required\":[\"tz\"],\"additionalProperties\":false}";
#define DS_CALL "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"

static const cfmt FORMATS[] = {
    /* Qwen's <tool_call> blocks; "get" and "get_weather" share a start */
    {"<tool_call>\n{\"name\": \"", "\n<tool_call>\n{\"name\": \"", "", "", "\", \"arguments\": ",
     "}\n</tool_call>", 3, 0, 3, {"get_weather", "get", "tree"},
     {NULL, TZ_PARAMS, NULL}},
    /* DeepSeek V3 / R1: a section, each call's arguments in a json fence */
    {"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>" DS_CALL "function<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>",
     "\n" DS_CALL "function<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>",
     "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>", "", "\n```json\n",
     "\n```<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>", 2, 1, 2,
     {"get_time", "shapes"}, {TZ_PARAMS, NULL}},
    /* Kimi-K2: functions.NAME:DIGITS */
    {"<|tool_calls_section_begin|><|tool_call_begin|>functions.", "<|tool_call_begin|>functions.",
     "<|tool_calls_section_end|>", "", ":\x01<|tool_call_argument_begin|>", "<|tool_call_end|>",
     16, 1, 2, {"a", "ab"}, {TZ_PARAMS, NULL}},
    /* Llama 3.1: one JSON object, "parameters" */
    {"{\"name\": \"", "", "", "", "\", \"parameters\": ", "}", 1, 0, 1, {"get_time"}, {TZ_PARAMS}},
};

/* a tool's parameters: given, or by name from SCHEMAS */
static const char *cf_params(const cfmt *f, int i)
{
    if (f->params[i])
        return f->params[i];
    return !strcmp(f->name[i], "tree") ? SCHEMAS[2] : !strcmp(f->name[i], "shapes") ? SCHEMAS[1]
                                                                                    : SCHEMAS[0];
}

static char *cf_prefix(const cfmt *f, int i)
{
    char *p = malloc(strlen(f->pre_head) + strlen(f->name[i]) + strlen(f->pre_tail) + 1);
    sprintf(p, "%s%s%s", f->pre_head, f->name[i], f->pre_tail);
    return p;
}

static char *cf_spec(const cfmt *f)
{
    json_t *tools = json_array();
    for (int i = 0; i < f->ntools; i++) {
        char *p = cf_prefix(f, i);
        json_array_append_new(tools, json_pack("{s:s, s:o, s:s}", "prefix", p, "parameters",
                                               json_loads(cf_params(f, i), 0, NULL), "suffix",
                                               f->suffix));
        free(p);
    }
    json_t *o = json_pack("{s:{s:s, s:s, s:s, s:i, s:b, s:o}}", "x-specd-calls", "begin", f->begin,
                          "sep", f->sep, "end", f->end, "max", f->max, "specials", f->specials,
                          "tools", tools);
    char *t = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return t;
}

/* the reference: 1 the text is 1..max calls and the end, 0 not, -1
 * jansson cannot tell */
typedef struct cref {
    const cfmt *f;
    ref r[4];
    char *pre[4];
} cref;

static int cf_verdict(const cref *c, const char *t, size_t n)
{
    const cfmt *f = c->f;
    size_t i = 0;
    int unsure = 0;
    for (int calls = 0;; calls++) {
        if (calls > 0 && n - i == strlen(f->end) && !memcmp(t + i, f->end, n - i))
            return unsure ? -1 : 1;
        if (calls == f->max)
            return 0;
        const char *lead = calls ? f->sep : f->begin;
        if (n - i < strlen(lead) || memcmp(t + i, lead, strlen(lead)))
            return 0;
        i += strlen(lead);
        int tool = -1;
        size_t at = 0;
        for (int k = 0; k < f->ntools && tool < 0; k++) {
            const char *p = c->pre[k];
            size_t j = i;
            for (; *p; p++) {
                if (*p == '\x01') {
                    size_t d = 0;
                    while (j < n && t[j] >= '0' && t[j] <= '9')
                        j++, d++;
                    if (d < 1 || d > 4)
                        break;
                } else if (j < n && t[j] == *p) {
                    j++;
                } else {
                    break;
                }
            }
            if (!*p)
                tool = k, at = j;
        }
        if (tool < 0 || at >= n || t[at] != '{')
            return 0;
        const size_t e = value_end(t, at, n);
        const int v = verdict(&c->r[tool], t + at, e - at);
        if (!v)
            return 0;
        unsure |= v < 0;
        i = e;
        const size_t ns = strlen(f->suffix);
        if (n - i < ns || memcmp(t + i, f->suffix, ns))
            return 0;
        i += ns;
    }
}

/* random calls: 1..max of random tools, documents of their schemas */
static char *cf_text(const cref *c, uint64_t *rng)
{
    const cfmt *f = c->f;
    size_t cap = 1 << 16, w = 0;
    char *t = malloc(cap);
    const int calls = 1 + (int)(next_rand(rng) % (uint64_t)f->max % 4);
    t[0] = 0;
    for (int k = 0; k < calls; k++) {
        const int i = (int)(next_rand(rng) % (uint64_t)f->ntools);
        json_t *v = NULL;
        while (!v)
            v = gen(&c->r[i], c->r[i].root, rng, 0);
        char *d = serialize(v, rng);
        json_decref(v);
        w += (size_t)snprintf(t + w, cap - w, "%s", k ? f->sep : f->begin);
        for (const char *p = c->pre[i]; *p; p++) {
            if (*p == '\x01')
                w += (size_t)snprintf(t + w, cap - w, "%d", (int)(next_rand(rng) % 2000));
            else
                t[w++] = *p;
        }
        w += (size_t)snprintf(t + w, cap - w, "%s%s", d, f->suffix);
        free(d);
    }
    snprintf(t + w, cap - w, "%s", f->end);
    return t;
}

static int cf_verdict_of(const void *c, const char *t, size_t n) { return cf_verdict(c, t, n); }

TEST(tool_calls_in_a_models_format_agree_with_the_reference)
{
    uint64_t seed = sd_test_seed(), rng = seed;
    static const char edits[] = "{}[]:,\"0123456789<>|\n_-tlgeanmf`";
    int texts = 0, edited = 0, valid_edits = 0, completions = 0;
    for (size_t fi = 0; fi < SD_ARRAY_LEN(FORMATS); fi++) {
        const cfmt *f = &FORMATS[fi];
        cref c = {.f = f};
        char *spec = cf_spec(f), alpha[512];
        sd_err err;
        sd_jschema *s = compile_or_null(spec, &err);
        ASSERT_MSG(s, "format %zu: %s", fi, err.msg);
        ASSERT_EQ(sd_jschema_calls(s), 1);
        ASSERT_EQ(sd_jschema_takes_specials(s), f->specials);
        completion_alphabet(spec, alpha, sizeof alpha);
        { /* and the literals' bytes (the spec's text escapes some) */
            size_t w = strlen(alpha);
            const char *lits[] = {f->begin, f->sep, f->end, f->pre_tail, f->suffix};
            for (size_t l = 0; l < SD_ARRAY_LEN(lits); l++)
                for (const char *q = lits[l]; *q && w + 1 < sizeof alpha; q++)
                    if (!memchr(alpha, *q, w) && *q != '\x01')
                        alpha[w++] = *q;
            alpha[w] = 0;
        }
        for (int i = 0; i < f->ntools; i++) {
            c.r[i] = (ref){json_loads(cf_params(f, i), 0, NULL), sd_jschema_max_depth(s)};
            c.pre[i] = cf_prefix(f, i);
        }
        for (int trial = 0; trial < 150; trial++) {
            char *t = cf_text(&c, &rng);
            const size_t n = strlen(t);
            ASSERT_MSG(cf_verdict(&c, t, n) != 0, "seed %llu format %zu: the reference refuses %s",
                       (unsigned long long)seed, fi, t);
            ASSERT_MSG(prefixes_ok_by(s, cf_verdict_of, &c, t, n, &rng), "seed %llu format %zu: %s",
                       (unsigned long long)seed, fi, t);
            texts++;
            for (int e = 0; e < 10; e++) {
                char buf[1 << 16];
                if (n + 2 > sizeof buf)
                    break;
                const size_t m = random_edit(buf, t, n, edits, &rng);
                const int theirs = cf_verdict(&c, buf, m);
                if (theirs < 0)
                    continue;
                const int ours = whole(s, buf, m);
                ASSERT_MSG(ours == theirs, "seed %llu format %zu: automaton %d, reference %d: %.*s",
                           (unsigned long long)seed, fi, ours, theirs, (int)m, buf);
                edited++;
                valid_edits += theirs;
                if (e % 3 == 0) {
                    const size_t k = bad_at(s, buf, m);
                    ASSERT_MSG(completes_by(s, cf_verdict_of, &c, buf, k, alpha), "seed %llu format %zu",
                               (unsigned long long)seed, fi);
                    completions++;
                }
            }
            const size_t k = next_rand(&rng) % (n + 1);
            ASSERT_MSG(completes_by(s, cf_verdict_of, &c, t, k, alpha), "seed %llu format %zu",
                       (unsigned long long)seed, fi);
            completions++;
            free(t);
        }
        for (int i = 0; i < f->ntools; i++) {
            json_decref(c.r[i].root);
            free(c.pre[i]);
        }
        sd_jschema_free(s);
        free(spec);
    }
    fprintf(stderr, "  %d call texts (every prefix), %d edits (%d still valid), %d completions\n",
            texts, edited, valid_edits, completions);
    ASSERT_GT(texts, 500);
    ASSERT_GT(valid_edits, 20);
}

TEST(tool_calls_go_bad_at_the_right_byte)
{
    static const struct {
        int fmt;
        const char *text;
        int bad_at; /* -1 whole, -2 a prefix */
    } cases[] = {
        {0, "", -2}, /* a call at least */
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>", -1},
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>\n", -2},
        {0, "<tool_call>\n{\"name\": \"got", 23},
        {0, "<tool_call>\n{\"name\": \"get_time", 26}, /* get, get_weather */
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"name\":\"a\"", 43}, /* tz, required, first */
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"tz\":\"UTC\"} }", 53},
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call>"
            "\n<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"value\":1,\"children\":[{\"value\":2}]}}"
            "\n</tool_call>",
         -1},
        {0, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"tz\":\"UTC\"}}\n</tool_call> ", 67},
        {2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:12<|tool_call_argument_begin|>"
            "{\"tz\":\"CET\"}<|tool_call_end|>",
         -2},
        {2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:12<|tool_call_argument_begin|>"
            "{\"tz\":\"CET\"}<|tool_call_end|><|tool_calls_section_end|>",
         -1},
        {2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.ab:<", 60}, /* a digit first */
        {2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.ab:12345", 64}, /* 4 at most */
        {2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>"
            "{\"tz\":\"UTC\"}<|tool_call_end|><|tool_call_begin|>functions.a:1<|tool_call_argument_begin|>"
            "{\"tz\":\"UTC\",\"n\":2}<|tool_call_end|><|tool_calls_section_end|>",
         -1},
        {3, "{\"name\": \"get_time\", \"parameters\": {\"tz\":\"UTC\"}}", -1},
        {3, "{\"name\": \"get_time\", \"parameters\": {\"tz\":\"UTC\"}}{", 48}, /* one call */
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        char *spec = cf_spec(&FORMATS[cases[i].fmt]);
        sd_err err;
        sd_jschema *s = compile_or_null(spec, &err);
        ASSERT_MSG(s, "%s", err.msg);
        ASSERT_MSG(goes_as_said(s, cases[i].text, cases[i].bad_at), "case %zu", i);
        /* a special token's text is taken only where a literal is matched */
        sd_jschema_state st;
        sd_jschema_init(s, &st);
        ASSERT(sd_jschema_in_literal(&st));
        sd_jschema_free(s);
        free(spec);
    }
}

TEST(tool_call_formats_that_cannot_be_read_are_refused)
{
    static const struct {
        const char *spec, *msg;
    } cases[] = {
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\",\"parameters\":{\"type\":\"integer\"},\"suffix\":\"\"}]}}",
         "must be an object schema"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\",\"parameters\":{},\"suffix\":\"\"}]}}",
         "must be an object schema"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\",\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"},{\"prefix\":\"ab\","
         "\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"}]}}",
         "do not tell their tools apart"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\\u0001:\",\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"},{\"prefix\":\"a\\u0001;\","
         "\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"}]}}",
         "do not tell their tools apart"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\\u00011\",\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"}]}}",
         "one digits byte at most"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\";\",\"end\":\";ab\",\"max\":2,\"tools\":[{"
         "\"prefix\":\"a\",\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"}]}}",
         "the end begins with a call"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":0,\"tools\":[{\"prefix\":"
         "\"a\",\"parameters\":{\"type\":\"object\"},\"suffix\":\"\"}]}}",
         "\"max\" must be an integer from 1 to 16"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[]}}",
         "must be an array of 1 to 128 tools"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{\"prefix\":"
         "\"a\",\"parameters\":{\"type\":\"object\",\"pattern\":\"x\"},\"suffix\":\"\"}]}}",
         "\"pattern\" at $.tools[0].parameters is not supported"},
        {"{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"extra\":1,"
         "\"tools\":[]}}",
         "\"extra\" is not a key of it"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_err err;
        sd_jschema *s = compile_or_null(cases[i].spec, &err);
        ASSERT_MSG(!s, "case %zu compiled", i);
        ASSERT_MSG(strstr(err.msg, cases[i].msg), "case %zu: %s", i, err.msg);
    }
    /* each tool's "#" and $defs are its own */
    const char *own =
        "{\"x-specd-calls\":{\"begin\":\"\",\"sep\":\",\",\"end\":\"\",\"max\":2,\"tools\":[{\"prefix\":"
        "\"a\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#\"}}},"
        "\"suffix\":\"\"},{\"prefix\":\"b\",\"parameters\":{\"$defs\":{\"d\":{\"type\":\"object\","
        "\"properties\":{\"y\":{\"type\":\"integer\"}}}},\"$ref\":\"#/$defs/d\"},\"suffix\":\"\"}]}}";
    sd_err err;
    sd_jschema *s = compile_or_null(own, &err);
    ASSERT_MSG(s, "%s", err.msg);
    ASSERT(whole(s, "a{\"x\":{\"x\":{}}},b{\"y\":1}", 24));
    ASSERT(!whole(s, "a{\"x\":{\"y\":1}}", 14));
    ASSERT(!whole(s, "b{\"y\":{}}", 9));
    sd_jschema_free(s);
}

/* x-specd-after: any text up to and including the first A, then the
 * reply's; A found as the first occurrence (KMP: a partial match that
 * fails restarts at its longest border), against strstr as the reference */
static int after_verdict(const ref *r, const char *a, const char *t, size_t n)
{
    char *z = strndup(t, n);
    const char *at = strstr(z, a);
    int v = at ? verdict(r, t + (at - z) + strlen(a), n - (size_t)(at - z) - strlen(a)) : 0;
    free(z);
    return v;
}

TEST(text_before_the_reply_ends_at_the_first_close)
{
    static const char CALLS[] =
        "{\"x-specd-calls\":{\"begin\":\"<c>\",\"sep\":\"\",\"end\":\"\",\"max\":1,\"tools\":[{"
        "\"prefix\":\"f \",\"parameters\":{\"type\":\"object\"},\"suffix\":\"</c>\"}]}}";
    static const struct {
        const char *after, *then, *text;
        int bad_at; /* -1 whole, -2 a prefix */
        const char *open; /* x-specd-open */
    } cases[] = {
        /* the reasoning optional: O, or the reply at once */
        {"</think>", "{\"type\":\"integer\"}", "12", -1, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "<think>x</think>3", -1, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "<think>", -2, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "<thin", -2, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "<x", 1, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "1<think>", 1, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "<think>12", -2, "<think>"}, /* inside: free */
        {"</think>", CALLS, "<c>f {}</c>", -1, "<think>"},
        {"</think>", CALLS, "<think>hm</think><c>f {}</c>", -1, "<think>"},
        {"</think>", CALLS, "<cx", 2, "<think>"},
        {"</think>", CALLS, "<tx", 2, "<think>"},
        {"</think>", "{\"type\":\"integer\"}", "abc</think>12", -1, NULL},
        {"</think>", "{\"type\":\"integer\"}", "</think>1", -1, NULL},
        {"</think>", "{\"type\":\"integer\"}", "x</thin</think>1", -1, NULL},
        {"</think>", "{\"type\":\"integer\"}", "<</think>7", -1, NULL},
        {"</think>", "{\"type\":\"integer\"}", "12", -2, NULL}, /* thinking still */
        {"</think>", "{\"type\":\"integer\"}", "abc</think", -2, NULL},
        {"</think>", "{\"type\":\"integer\"}", "abc</think>x", 11, NULL},
        {"</think>", "{\"type\":\"integer\"}", "a</think></think>1", 9, NULL}, /* the first one ends it */
        {"aab", "true", "aaab{}aab1", 6, NULL}, /* the reply: one value */
        {"aab", "{}", "aaab{}", -1, NULL},
        {"aab", "{}", "aab{}", -1, NULL},
        {"abab", "{}", "abaabab{}", -1, NULL},
        {"abab", "{}", "ababab{}", 4, NULL}, /* ends at the first: then "ab{}" */
        {"</think>\n\n", CALLS, "why not</think>\n\n<c>f {}</c>", -1, NULL},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        char *spec = NULL;
        json_t *o = json_pack("{s:s, s:o}", "x-specd-after", cases[i].after, "x-specd-then",
                              json_loads(cases[i].then, JSON_DECODE_ANY, NULL));
        if (cases[i].open)
            json_object_set_new(o, "x-specd-open", json_string(cases[i].open));
        spec = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        sd_err err;
        sd_jschema *s = compile_or_null(spec, &err);
        ASSERT_MSG(s, "case %zu: %s", i, err.msg);
        ASSERT_MSG(goes_as_said(s, cases[i].text, cases[i].bad_at), "case %zu", i);
        sd_jschema_state st;
        sd_jschema_init(s, &st);
        ASSERT(sd_jschema_in_literal(&st)); /* (specials may be reasoning's text) */
        sd_jschema_free(s);
        free(spec);
    }
    /* random reasoning, the close, a random document; random edits: as the
     * reference says */
    uint64_t seed = sd_test_seed(), rng = seed;
    static const char A[] = "</think>";
    char spec[8192];
    snprintf(spec, sizeof spec, "{\"x-specd-after\":\"%s\",\"x-specd-then\":%s}", A, SCHEMAS[0]);
    sd_err err;
    sd_jschema *s = compile_or_null(spec, &err);
    ASSERT_MSG(s, "%s", err.msg);
    ref r = {json_loads(SCHEMAS[0], 0, NULL), sd_jschema_max_depth(s)};
    static const char pieces[] = "<</>thinkabc </th</think";
    int edited = 0, valid = 0;
    for (int trial = 0; trial < 300; trial++) {
        json_t *v = NULL;
        while (!v)
            v = gen(&r, r.root, &rng, 0);
        char *d = serialize(v, &rng);
        json_decref(v);
        char t[8192];
        size_t w = 0;
        for (int k = (int)(next_rand(&rng) % 40); k > 0; k--)
            t[w++] = pieces[next_rand(&rng) % (sizeof pieces - 1)];
        t[w] = 0;
        char *z;
        while ((z = strstr(t, A))) /* no close inside the reasoning */
            memmove(z, z + 1, strlen(z));
        w = strlen(t);
        w += (size_t)snprintf(t + w, sizeof t - w, "%s%s", A, d);
        free(d);
        ASSERT_MSG(after_verdict(&r, A, t, w) == 1, "seed %llu: the reference refuses %s",
                   (unsigned long long)seed, t);
        ASSERT_MSG(whole(s, t, w) && bad_at(s, t, w) == w, "seed %llu: %s", (unsigned long long)seed, t);
        for (int e = 0; e < 10 && w + 2 < sizeof t; e++) {
            char buf[8192];
            const size_t m = random_edit(buf, t, w, "<>/thin{}\":,0a", &rng);
            const int theirs = after_verdict(&r, A, buf, m);
            if (theirs < 0)
                continue;
            ASSERT_MSG(whole(s, buf, m) == theirs, "seed %llu: automaton %d, reference %d: %.*s",
                       (unsigned long long)seed, !theirs, theirs, (int)m, buf);
            edited++;
            valid += theirs;
        }
    }
    fprintf(stderr, "  300 texts, %d edits (%d still valid)\n", edited, valid);
    ASSERT_GT(valid, 20);
    json_decref(r.root);
    sd_jschema_free(s);
}

TEST_MAIN(T(text_before_the_reply_ends_at_the_first_close),
          T(tool_calls_in_a_models_format_agree_with_the_reference),
          T(tool_calls_go_bad_at_the_right_byte), T(tool_call_formats_that_cannot_be_read_are_refused),
          T(hand_written_cases_go_bad_at_the_right_byte), T(state_is_small_and_copies_cheaply),
          T(limits_on_depth_and_whitespace), T(misc_schemas_compile_and_behave),
          T(numbers_bounds_hold_at_the_right_byte), T(random_number_bounds_agree_with_the_reference),
          T(refused_schemas_name_the_keyword), T(random_documents_agree_with_the_reference))

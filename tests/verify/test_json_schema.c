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
#include "verify/json_regex.h"
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

/* ---- strings' patterns, integers' multiples ----------------------------- */

/* Patterns (ECMA-262, a search unless anchored) over the string's decoded
 * code points, with its lengths: each text whole, a prefix, or bad at the
 * first byte after which no string of the schema can follow */
TEST(patterns_hold_at_the_right_byte)
{
    static const struct {
        const char *schema, *text;
        int bad_at; /* -1: whole; -2: a prefix, not whole */
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}-\\\\d{4}$\"}", "\"555-1234\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}-\\\\d{4}$\"}", "\"555-12345\"", 9},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}-\\\\d{4}$\"}", "\"55a", 3},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}-\\\\d{4}$\"}", "\"555-123\"", 8},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}", "\"Hello\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}", "\"hello\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}", "\"H\"", 2},
        {"{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}", "\"HeL", 3},
        /* unanchored: anywhere in the string */
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xxab\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"abzz\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xxa", -2},
        {"{\"type\":\"string\",\"pattern\":\"ab\"}", "\"xxa\"", 4},
        {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", "\"cats\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", "\"dog\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", "\"cow\"", 2},
        {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", "\"dogss\"", 5},
        {"{\"type\":\"string\",\"pattern\":\"^(?:a|b)+?c{2,}$\"}", "\"abacc\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^(?:a|b)+?c{2,}$\"}", "\"abac\"", 5},
        /* escapes decoded first: \u0041 is A */
        {"{\"type\":\"string\",\"pattern\":\"^A$\"}", "\"\\u0041\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^A$\"}", "\"\\u0042\"", 6},
        {"{\"type\":\"string\",\"pattern\":\"^A$\"}", "\"\\u0141\"", 4},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\n\\\"$\"}", "\"\\n\\\"\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\n\\\"$\"}", "\"\\u000a\\u0022\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\n\\\"$\"}", "\"\\t", 2},
        {"{\"type\":\"string\",\"pattern\":\"^[\\\\\\\\/]+$\"}", "\"\\\\\\/\"", -1},
        /* '.' is any code point but the line terminators; one per pair */
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xc3\xa9\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\u2028\"", 6},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xe2\x80\xa8", 3},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\ud83d\\ude00\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xf0\x9f\x98\x80\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^..$\"}", "\"\\ud83d\\ude00\"", 13},
        {"{\"type\":\"string\",\"pattern\":\"^..$\"}", "\"\\ud83d\\u0041\"", -1}, /* a lone half, then A */
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\ud83d\\u0041", 9}, /* (\u0 begins no low half) */
        /* \s: ECMA's white space; a UTF-8 prefix no space begins with */
        {"{\"type\":\"string\",\"pattern\":\"^\\\\s+$\"}", "\"\xe2\x80\x80 \\u3000\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\s+$\"}", "\"\xe2\x82", 2},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\S+$\"}", "\"\xc2\xa0", 2},
        {"{\"type\":\"string\",\"pattern\":\"^[^a]$\"}", "\"\xe2\x80\xa9\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]$\"}", "\"\xc3", 1},
        /* not UTF-8: no string of a pattern */
        {"{\"type\":\"string\",\"pattern\":\"^.*$\"}", "\"\xc0\x80\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^.*$\"}", "\"\xed\xa0\x80\"", 2},
        {"{\"type\":\"string\",\"pattern\":\"^.*$\"}", "\"\xc3\"", 2},
        /* with the lengths: cut off where no string of both follows */
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+[0-9]+$\",\"maxLength\":4}", "\"abc1\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+[0-9]+$\",\"maxLength\":4}", "\"abcd", 4},
        {"{\"type\":\"string\",\"pattern\":\"^(ab)*$\",\"minLength\":3,\"maxLength\":5}", "\"ab\"", 3},
        {"{\"type\":\"string\",\"pattern\":\"^(ab)*$\",\"minLength\":3,\"maxLength\":5}", "\"abab\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^(ab)*$\",\"minLength\":3,\"maxLength\":5}", "\"ababa", 5},
        {"{\"type\":\"string\",\"pattern\":\"^a{2,3}$\",\"minLength\":3}", "\"aa\"", 3},
        {"{\"type\":\"string\",\"pattern\":\"^a{2,3}$\",\"minLength\":3}", "\"aaa\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"xyz\",\"maxLength\":4}", "\"axyz\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"xyz\",\"maxLength\":4}", "\"aa", 2},
        {"{\"type\":\"string\",\"pattern\":\"^x*\",\"minLength\":2}", "\"\\ud83d\\ude00\\u", -2},
        {"{\"type\":\"string\",\"pattern\":\"^.{2}$\",\"maxLength\":2}", "\"\\ud83d\\ude00\\u00e9\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^.{2}$\",\"maxLength\":2}", "\"\\ud83d\\ude00\\u00e9\\", 19},
        /* enums keep the values that match; alternatives follow their own */
        {"{\"enum\":[\"ab\",\"cd\",\"ax\"],\"pattern\":\"^a\"}", "\"ax\"", -1},
        {"{\"enum\":[\"ab\",\"cd\",\"ax\"],\"pattern\":\"^a\"}", "\"c", 1},
        {"{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^a+$\"},{\"type\":\"string\",\"pattern\":"
         "\"^b+$\"}]}",
         "\"bb\"", -1},
        {"{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^a+$\"},{\"type\":\"string\",\"pattern\":"
         "\"^b+$\"}]}",
         "\"aab", 3},
        {"{\"type\":[\"string\",\"null\"],\"pattern\":\"^z\"}", "null", -1},
        {"{\"type\":\"object\",\"properties\":{\"id\":{\"pattern\":\"^[0-9a-f]{4}$\"}}}",
         "{\"id\":\"beef\"}", -1},
        {"{\"type\":\"object\",\"properties\":{\"id\":{\"pattern\":\"^[0-9a-f]{4}$\"}}}",
         "{\"id\":\"bee\"}", 10},
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

/* Integers' multipleOf, alone (any integer: past int64 too) and with
 * bounds: a digit goes bad where no multiple within them begins so */
TEST(multiples_hold_at_the_right_byte)
{
    static const struct {
        const char *schema, *text;
        int bad_at; /* -1: whole; -2: a prefix, not whole */
    } cases[] = {
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "15", -1},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "20", -1},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "1", -2},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "16", 1},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "10", 1},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "25", 1},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "3", 0},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":12,\"maximum\":23}", "-", 0},
        {"{\"type\":\"integer\",\"multipleOf\":7}", "14", -1},
        {"{\"type\":\"integer\",\"multipleOf\":7}", "15", -2}, /* 154 */
        {"{\"type\":\"integer\",\"multipleOf\":7}", "-0", -1},
        {"{\"type\":\"integer\",\"multipleOf\":7}", "-21", -1},
        {"{\"type\":\"integer\",\"multipleOf\":7}", "123456789012345678901234", -2},
        {"{\"type\":\"integer\",\"multipleOf\":13}", "98765432109876543210987654321", -1},
        {"{\"type\":\"integer\",\"multipleOf\":13}", "98765432109876543210987654322", -2},
        {"{\"type\":\"integer\",\"multipleOf\":7}", "14.0", 2},
        {"{\"type\":\"integer\",\"multipleOf\":3,\"exclusiveMaximum\":10,\"minimum\":-4}", "-3", -1},
        {"{\"type\":\"integer\",\"multipleOf\":3,\"exclusiveMaximum\":10,\"minimum\":-4}", "-4", 1},
        {"{\"type\":\"integer\",\"multipleOf\":3,\"exclusiveMaximum\":10,\"minimum\":-4}", "9", -1},
        {"{\"type\":\"integer\",\"multipleOf\":3,\"exclusiveMaximum\":10,\"minimum\":-4}", "1", 0},
        {"{\"type\":\"integer\",\"multipleOf\":1000,\"minimum\":1}", "1", -2},
        {"{\"type\":\"integer\",\"multipleOf\":1000,\"minimum\":1}", "999", -2}, /* 999000 */
        {"{\"type\":\"integer\",\"multipleOf\":1000,\"maximum\":1999}", "1", -2},
        {"{\"type\":\"integer\",\"multipleOf\":1000,\"maximum\":1999}", "2", 0},
        {"{\"type\":\"integer\",\"multipleOf\":1000,\"maximum\":1999}", "-2", -2},
        {"{\"type\":\"integer\",\"multipleOf\":4294967295}", "4294967295", -1},
        {"{\"type\":\"integer\",\"multipleOf\":4294967295}", "4294967296", -2},
        {"{\"type\":[\"integer\",\"string\"],\"multipleOf\":2}", "\"x\"", -1},
        {"{\"type\":[\"integer\",\"string\"],\"multipleOf\":2}", "3", -2},
        {"{\"enum\":[1,2,3,4,6.0,7.5],\"multipleOf\":2}", "6", -1},
        {"{\"enum\":[1,2,3,4,6.0,7.5],\"multipleOf\":2}", "3", 0},
        {"{\"anyOf\":[{\"type\":\"integer\",\"multipleOf\":3},{\"type\":\"integer\",\"multipleOf\":5}]}",
         "10", -1},
        {"{\"anyOf\":[{\"type\":\"integer\",\"multipleOf\":3},{\"type\":\"integer\",\"multipleOf\":5}]}",
         "12", -1},
        {"{\"anyOf\":[{\"type\":\"integer\",\"multipleOf\":3},{\"type\":\"integer\",\"multipleOf\":5}]}",
         "11", -2},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_err err;
        sd_jschema *s = compile_or_null(cases[i].schema, &err);
        ASSERT_MSG(s, "%s: %s", cases[i].schema, err.msg);
        ASSERT_MSG(goes_as_said(s, cases[i].text, cases[i].bad_at), "%s: %s (want %d)",
                   cases[i].schema, cases[i].text, cases[i].bad_at);
        sd_jschema_free(s);
    }
    /* the remainder is the alternative's: states of different remainders
     * differ, of one are equal */
    sd_err err;
    sd_jschema *s = compile_or_null("{\"type\":\"integer\",\"multipleOf\":5}", &err);
    ASSERT_MSG(s, "%s", err.msg);
    sd_jschema_state a, b;
    sd_jschema_init(s, &a);
    sd_jschema_init(s, &b);
    ASSERT_OK(sd_jschema_feed(s, &a, (const unsigned char *)"12", 2));
    ASSERT_OK(sd_jschema_feed(s, &b, (const unsigned char *)"37", 2));
    ASSERT(sd_jschema_equal(&a, &b));
    ASSERT_OK(sd_jschema_feed(s, &b, (const unsigned char *)"1", 1));
    ASSERT_OK(sd_jschema_feed(s, &a, (const unsigned char *)"2", 1));
    ASSERT(!sd_jschema_equal(&a, &b));
    sd_jschema_free(s);
}

/* The reference for patterns: the pattern parsed again here and matched
 * over code points as sets of positions (a group's ends from its starts),
 * the ECMA-262 meanings written out per code point: a different algorithm
 * from the automaton's (no NFA, no subsets, no symbols). */

typedef struct xnode {
    char kind; /* 'c' characters, '.' then, '|' or, '*' repeat, '^', '$', 'e' empty */
    int a, b, min, max;
    /* 'c': negated, and items: ranges [lo, hi] or a class letter (d w s D W S) */
    int neg, n;
    uint32_t lo[16], hi[16];
    char cls[16];
    int dot;
} xnode;

typedef struct xre {
    xnode node[512];
    int n;
    const char *p;
} xre;

static int x_new(xre *x, char kind)
{
    xnode *q = &x->node[x->n];
    memset(q, 0, sizeof *q);
    q->kind = kind;
    q->a = q->b = -1;
    return x->n++;
}

static int ecma_space(uint32_t c)
{
    static const uint32_t sp[] = {9,      10,     11,     12,     13,     32,     0xa0,   0x1680,
                                  0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff};
    for (size_t i = 0; i < SD_ARRAY_LEN(sp); i++)
        if (c == sp[i])
            return 1;
    return c >= 0x2000 && c <= 0x200a;
}

static int x_in_class(char k, uint32_t c)
{
    int in;
    switch (k | 0x20) {
    case 'd': in = c >= '0' && c <= '9'; break;
    case 'w': in = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; break;
    default: in = ecma_space(c); break;
    }
    return k >= 'a' ? in : !in;
}

static int x_has(const xnode *q, uint32_t c)
{
    if (q->dot)
        return c != '\n' && c != '\r' && c != 0x2028 && c != 0x2029;
    int in = 0;
    for (int i = 0; i < q->n && !in; i++)
        in = q->cls[i] ? x_in_class(q->cls[i], c) : c >= q->lo[i] && c <= q->hi[i];
    return in != q->neg;
}

/* one escaped character or class letter after '\' (the subset the
 * generator writes) */
static void x_escape(xre *x, xnode *q)
{
    const char k = *x->p++;
    if (strchr("dwsDWS", k)) {
        q->cls[q->n++] = k;
        return;
    }
    const uint32_t c = k == 'n' ? '\n' : k == 't' ? '\t' : (uint32_t)(unsigned char)k;
    q->lo[q->n] = q->hi[q->n] = c;
    q->n++;
}

static int x_alt(xre *x);

static int x_atom(xre *x)
{
    const char c = *x->p++;
    if (c == '^' || c == '$')
        return x_new(x, c);
    if (c == '(') {
        if (*x->p == '?')
            x->p += 2; /* (?: */
        const int g = x_alt(x);
        x->p++; /* ) */
        return g;
    }
    const int id = x_new(x, 'c');
    xnode *q = &x->node[id];
    if (c == '.') {
        q->dot = 1;
    } else if (c == '\\') {
        x_escape(x, q);
    } else if (c == '[') {
        q->neg = *x->p == '^';
        x->p += q->neg;
        while (*x->p != ']') {
            if (*x->p == '\\') {
                x->p++;
                x_escape(x, q);
            } else if (x->p[1] == '-' && x->p[2] != ']') {
                q->lo[q->n] = (unsigned char)x->p[0], q->hi[q->n] = (unsigned char)x->p[2];
                q->n++;
                x->p += 3;
            } else {
                q->lo[q->n] = q->hi[q->n] = (unsigned char)*x->p++;
                q->n++;
            }
        }
        x->p++;
    } else {
        q->lo[0] = q->hi[0] = (unsigned char)c;
        q->n = 1;
    }
    return id;
}

static int x_rep(xre *x)
{
    int a = x_atom(x);
    while (*x->p && strchr("*+?{", *x->p)) {
        const char q = *x->p++;
        int lo = q == '+', hi = q == '?' ? 1 : -1;
        if (q == '{') {
            lo = (int)strtol(x->p, (char **)&x->p, 10);
            hi = lo;
            if (*x->p == ',')
                hi = x->p[1] == '}' ? -1 : (int)strtol(x->p + 1, (char **)&x->p, 10);
            if (*x->p == ',')
                x->p++;
            x->p++; /* } */
        }
        if (*x->p == '?')
            x->p++;
        const int r = x_new(x, '*');
        x->node[r].a = a, x->node[r].min = lo, x->node[r].max = hi;
        a = r;
    }
    return a;
}

static int x_cat(xre *x)
{
    int a = -1;
    while (*x->p && *x->p != '|' && *x->p != ')') {
        const int b = x_rep(x);
        if (a < 0) {
            a = b;
        } else {
            const int c = x_new(x, '.');
            x->node[c].a = a, x->node[c].b = b;
            a = c;
        }
    }
    return a < 0 ? x_new(x, 'e') : a;
}

static int x_alt(xre *x)
{
    int a = x_cat(x);
    while (*x->p == '|') {
        x->p++;
        const int b = x_cat(x), c = x_new(x, '|');
        x->node[c].a = a, x->node[c].b = b;
        a = c;
    }
    return a;
}

/* the positions where node i's matches from the positions in from end
 * (bit p: after p code points of s) */
static uint64_t x_run(const xre *x, int i, const uint32_t *s, int n, uint64_t from)
{
    const xnode *q = &x->node[i];
    uint64_t to = 0;
    switch (q->kind) {
    case 'c':
        for (int p = 0; p < n; p++)
            if ((from >> p & 1) && x_has(q, s[p]))
                to |= (uint64_t)1 << (p + 1);
        return to;
    case '.': return x_run(x, q->b, s, n, x_run(x, q->a, s, n, from));
    case '|': return x_run(x, q->a, s, n, from) | x_run(x, q->b, s, n, from);
    case '^': return from & 1;
    case '$': return from & (uint64_t)1 << n;
    case 'e': return from;
    default: {
        for (int k = 0; k < q->min; k++)
            from = x_run(x, q->a, s, n, from);
        uint64_t all = from;
        for (int k = q->min; q->max < 0 || k < q->max; k++) {
            from = x_run(x, q->a, s, n, from);
            if ((from | all) == all)
                break;
            all |= from;
        }
        return all;
    }
    }
}

/* does the pattern match a part of s (n code points) */
static int x_search(const xre *x, int root, const uint32_t *s, int n)
{
    return x_run(x, root, s, n, ((uint64_t)2 << n) - 1) != 0;
}

/* code points a test string is made of, one of each kind the automaton
 * tells apart: letters of the patterns, a digit, spaces, line breaks, and
 * non-ASCII: é, a no-break space, U+2028, an astral one */
static const uint32_t XCHARS[] = {'a', 'b', 'c', 'x', '-', '1', ' ', '\n', 0xe9, 0xa0, 0x2028, 0x1f600};
#define NX ((int)SD_ARRAY_LEN(XCHARS))

/* the ways a code point is written in a JSON string (at most 3) */
static int x_spellings(uint32_t c, char out[3][16])
{
    int k = 0;
    if (c == '\n') {
        strcpy(out[k++], "\\n");
    } else if (c < 0x80) {
        out[k][0] = (char)c, out[k++][1] = 0;
    } else if (c < 0x800) {
        snprintf(out[k++], 16, "%c%c", 0xc0 | c >> 6, 0x80 | (c & 63));
    } else if (c < 0x10000) {
        snprintf(out[k++], 16, "%c%c%c", 0xe0 | c >> 12, 0x80 | (c >> 6 & 63), 0x80 | (c & 63));
    } else {
        snprintf(out[k++], 16, "%c%c%c%c", 0xf0 | c >> 18, 0x80 | (c >> 12 & 63), 0x80 | (c >> 6 & 63),
                 0x80 | (c & 63));
    }
    if (c < 0x10000)
        snprintf(out[k++], 16, "\\u%04x", c);
    else
        snprintf(out[k++], 16, "\\u%04X\\u%04x", 0xd800 + ((c - 0x10000) >> 10), 0xdc00 + ((c - 0x10000) & 0x3ff));
    return k;
}

/* a random pattern of the subset, small */
static void x_gen(char *out, size_t cap, uint64_t *rng, int depth)
{
    static const char *const ATOMS[] = {"a",     "b",      "c",      "x",   "-",     "1",
                                        "\\-",   ".",      "[ab]",   "[^a]", "[a-c1]", "[^\\s]",
                                        "\\d",   "\\w",    "\\s",    "\\D", "\\W",   "\\S",
                                        "[\\s1]", "[x-]",  "\\n",    " "};
    static const char *const QUANT[] = {"", "", "", "*", "+", "?", "{2}", "{1,}", "{0,2}", "{1,3}", "*?", "??"};
    const int branches = next_rand(rng) % 5 == 0 ? 2 : 1;
    for (int b = 0; b < branches; b++) {
        if (b)
            strncat(out, "|", cap - strlen(out) - 1);
        const int items = 1 + (int)(next_rand(rng) % 3);
        for (int i = 0; i < items; i++) {
            const uint64_t u = next_rand(rng);
            if (depth < 2 && u % 7 == 0) {
                strncat(out, u % 2 ? "(" : "(?:", cap - strlen(out) - 1);
                x_gen(out, cap, rng, depth + 1);
                strncat(out, ")", cap - strlen(out) - 1);
            } else if (u % 41 == 1) {
                strncat(out, u % 2 ? "^" : "$", cap - strlen(out) - 1);
                continue;
            } else {
                strncat(out, ATOMS[u / 64 % SD_ARRAY_LEN(ATOMS)], cap - strlen(out) - 1);
            }
            strncat(out, QUANT[next_rand(rng) % SD_ARRAY_LEN(QUANT)], cap - strlen(out) - 1);
        }
    }
}

/* a random string the pattern's node i matches (from the test's chars; 0
 * where a set has none of them) */
static int x_sample(const xre *x, int i, uint64_t *rng, uint32_t *s, int *n, int cap)
{
    const xnode *q = &x->node[i];
    switch (q->kind) {
    case 'c': {
        uint32_t pick[NX];
        int k = 0;
        for (int j = 0; j < NX; j++)
            if (x_has(q, XCHARS[j]))
                pick[k++] = XCHARS[j];
        if (!k || *n >= cap)
            return 0;
        s[(*n)++] = pick[next_rand(rng) % (uint64_t)k];
        return 1;
    }
    case '.': return x_sample(x, q->a, rng, s, n, cap) && x_sample(x, q->b, rng, s, n, cap);
    case '|': return x_sample(x, next_rand(rng) % 2 ? q->a : q->b, rng, s, n, cap);
    case '*': {
        const int k = q->min + (int)(next_rand(rng) % (uint64_t)((q->max < 0 ? 3 : q->max - q->min) + 1));
        for (int j = 0; j < k; j++)
            if (!x_sample(x, q->a, rng, s, n, cap))
                return 0;
        return 1;
    }
    default: return 1;
    }
}

typedef struct xcase {
    const xre *x;
    int root;
    long long min_len, max_len;
} xcase;

static int x_valid(const xcase *c, const uint32_t *s, int n)
{
    return n >= c->min_len && n <= c->max_len && x_search(c->x, c->root, s, n);
}

/* the text of s as a JSON string, each code point spelled at random; off[i]:
 * where code point i begins (off[n]: the closing quote) */
static size_t x_text(const uint32_t *s, int n, uint64_t *rng, char *t, int *off)
{
    size_t w = 0;
    t[w++] = '"';
    for (int i = 0; i < n; i++) {
        char sp[3][16];
        const int k = x_spellings(s[i], sp);
        off[i] = (int)w;
        const char *p = sp[next_rand(rng) % (uint64_t)k];
        memcpy(t + w, p, strlen(p));
        w += strlen(p);
    }
    off[n] = (int)w;
    t[w++] = '"';
    t[w] = 0;
    return w;
}

/* some string of the test's chars, w of them at most after s[0..j) and a
 * code point spelled from the bytes part (k of them), is valid */
static int x_completes_from(const xcase *c, uint32_t *s, int j, const char *part, size_t k, int w)
{
    for (int a = 0; a < NX; a++) {
        char sp[3][16];
        const int ns = x_spellings(XCHARS[a], sp);
        int fits = 0;
        for (int q = 0; q < ns; q++)
            fits |= strlen(sp[q]) >= k && !memcmp(sp[q], part, k);
        if (!fits)
            continue;
        s[j] = XCHARS[a];
        /* then every suffix of up to w code points */
        int idx[4] = {0, 0, 0, 0};
        for (int len = 0; len <= w; len++) {
            memset(idx, 0, sizeof idx);
            for (;;) {
                for (int q = 0; q < len; q++)
                    s[j + 1 + q] = XCHARS[idx[q]];
                if (x_valid(c, s, j + 1 + len))
                    return 1;
                int q = 0;
                while (q < len && ++idx[q] == NX)
                    idx[q++] = 0;
                if (q == len)
                    break;
            }
        }
    }
    return 0;
}

/* one more way to go on: state x and code points cp[0..m), unless a state
 * equal to x is there */
static int x_push(sd_jschema_state *st, uint32_t (*cps)[48], int *ncp, int *n, int cap,
                  const sd_jschema_state *x, const uint32_t *cp, int m)
{
    for (int y = 0; y < *n; y++)
        if (sd_jschema_equal(x, &st[y]))
            return 0;
    if (*n == cap || m >= 48)
        return 0;
    st[*n] = *x;
    memcpy(cps[*n], cp, (size_t)m * sizeof *cp);
    ncp[*n] = m;
    (*n)++;
    return 1;
}

/* the accepted prefix t[0..at) (code points s[0..q), then the bytes of
 * s[q]'s spelling before at) completes: that char finished as a test char
 * whose spelling begins so (wide: or as any BMP code point's \u escape or
 * UTF-8), then a breadth-first search over the automaton's states (equal
 * ones once) adding whole test chars, for a closing quote; the code points
 * then valid by the reference */
static int x_completes(const sd_jschema *s, const xcase *c, const char *t, size_t at,
                       const uint32_t *str, int q, const int *off)
{
    enum { CAP = 2000 };
    sd_jschema_state *st = malloc(CAP * sizeof *st), pre, nx;
    uint32_t(*cps)[48] = malloc(CAP * sizeof *cps), cp[48];
    int *ncp = malloc(CAP * sizeof *ncp), n = 0, ok = -1;
    sd_jschema_init(s, &pre);
    sd_jschema_feed(s, &pre, (const unsigned char *)t, at);
    const size_t k = at - (size_t)off[q];
    const char *part = t + off[q];
    memcpy(cp, str, (size_t)q * sizeof *str);
    for (int wide = 0; wide < 2 && ok < 0; wide++) {
        n = 0;
        if (!k) {
            x_push(st, cps, ncp, &n, CAP, &pre, cp, q);
        } else if (!wide) {
            for (int a = 0; a < NX; a++) {
                char sp[3][16];
                const int ns = x_spellings(XCHARS[a], sp);
                for (int w = 0; w < ns; w++) {
                    sd_jschema_copy(&nx, &pre);
                    cp[q] = XCHARS[a];
                    if (strlen(sp[w]) >= k && !memcmp(sp[w], part, k) &&
                        !sd_jschema_feed(s, &nx, (const unsigned char *)sp[w] + k, strlen(sp[w]) - k))
                        x_push(st, cps, ncp, &n, CAP, &nx, cp, q + 1);
                }
            }
        } else {
            for (uint32_t v = 0; v < 0x10000; v++) {
                if (v >= 0xd800 && v <= 0xdfff)
                    continue;
                char sp[2][16];
                snprintf(sp[0], 16, "\\u%04x", v);
                if (v < 0x800)
                    snprintf(sp[1], 16, "%c%c", 0xc0 | v >> 6, 0x80 | (v & 63));
                else
                    snprintf(sp[1], 16, "%c%c%c", 0xe0 | v >> 12, 0x80 | (v >> 6 & 63), 0x80 | (v & 63));
                for (int w = 0; w < 2; w++) {
                    if ((w && v < 0x80) || strlen(sp[w]) < k || memcmp(sp[w], part, k))
                        continue;
                    sd_jschema_copy(&nx, &pre);
                    cp[q] = v;
                    if (!sd_jschema_feed(s, &nx, (const unsigned char *)sp[w] + k, strlen(sp[w]) - k))
                        x_push(st, cps, ncp, &n, CAP, &nx, cp, q + 1);
                }
            }
        }
        for (int i = 0; i < n && ok < 0; i++) {
            sd_jschema_copy(&nx, &st[i]);
            if (!sd_jschema_feed(s, &nx, (const unsigned char *)"\"", 1) && sd_jschema_done(s, &nx)) {
                ok = x_valid(c, cps[i], ncp[i]);
                if (!ok)
                    fprintf(stderr, "  a completion of %d code points refused by the reference\n",
                            ncp[i]);
                break;
            }
            for (int a = 0; a < NX; a++) {
                char sp[3][16];
                const int ns = x_spellings(XCHARS[a], sp);
                memcpy(cp, cps[i], (size_t)ncp[i] * sizeof *cp);
                cp[ncp[i]] = XCHARS[a];
                for (int w = 0; w < ns; w++) {
                    sd_jschema_copy(&nx, &st[i]);
                    if (!sd_jschema_feed(s, &nx, (const unsigned char *)sp[w], strlen(sp[w])))
                        x_push(st, cps, ncp, &n, CAP, &nx, cp, ncp[i] + 1);
                }
            }
        }
    }
    if (ok < 0)
        fprintf(stderr, "  no completion of %.*s within %d states\n", (int)at, t, n);
    free(st);
    free(cps);
    free(ncp);
    return ok > 0;
}

/* Random patterns of the subset (groups, alternation, classes, escapes,
 * quantifiers, anchors; often with minLength/maxLength) and random strings
 * of code points of every kind, spelled raw, as escapes, as surrogate
 * pairs: the automaton accepts a string exactly where the reference
 * does, every prefix of an accepted one, and where it goes bad, at the
 * first byte after which no string (over the test's chars, up to two more)
 * is valid; the prefix before it completes to a valid one. A refused
 * pattern is one no short string matches. */
/* a pattern's automaton (verify/json_regex.c) keeps no two states that no
 * string tells apart: the ones each spelling of one language gives are
 * alike in number, and every pair of states of ~300 random patterns' is
 * told apart by a string (the table-filling check) */
static int jre_states(const char *pat)
{
    sd__jre re;
    char why[128];
    if (sd__jre_compile(pat, strlen(pat), NULL, &re, why, sizeof why))
        return -1;
    const int n = re.nstate;
    sd__jre_free(&re);
    return n;
}

static int jre_minimal(const sd__jre *re)
{
    const int n = re->nstate, nc = re->nclass;
    uint8_t *d = calloc((size_t)n * n, 1);
    for (int p = 0; p < n; p++)
        for (int q = 0; q < n; q++)
            d[p * n + q] = re->acc[p] != re->acc[q];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int p = 0; p < n; p++)
            for (int q = 0; q < n; q++) {
                if (d[p * n + q])
                    continue;
                for (int k = 0; k < nc; k++) {
                    const int tp = re->next[p * nc + k], tq = re->next[q * nc + k];
                    if ((tp == SD_JRE_DEAD) != (tq == SD_JRE_DEAD) ||
                        (tp != SD_JRE_DEAD && tq != SD_JRE_DEAD && d[tp * n + tq])) {
                        d[p * n + q] = 1;
                        changed = 1;
                        break;
                    }
                }
            }
    }
    int ok = 1;
    for (int p = 0; p < n && ok; p++)
        for (int q = p + 1; q < n && ok; q++)
            ok = d[p * n + q];
    free(d);
    return ok;
}

TEST(a_patterns_automaton_keeps_no_two_states_alike)
{
    static const char *same[][2] = {{"^(a|ab|ac)$", "^a[bc]?$"},
                                    {"^(?:ab|cb)$", "^[ac]b$"},
                                    {"^(?:x*|x+)y$", "^x*y$"},
                                    {"abc|abd", "ab[cd]"},
                                    {"^(?:a{1,3}|a{2,4})$", "^a{1,4}$"}};
    for (size_t i = 0; i < SD_ARRAY_LEN(same); i++) {
        const int a = jre_states(same[i][0]), b = jre_states(same[i][1]);
        ASSERT_MSG(a > 0 && a == b, "%s: %d states, %s: %d", same[i][0], a, same[i][1], b);
    }
    uint64_t rng = sd_test_seed() ^ 0x9e3779b9u;
    int checked = 0;
    for (int trial = 0; trial < 300; trial++) {
        char pat[256] = "";
        if (next_rand(&rng) % 2)
            strcat(pat, "^");
        x_gen(pat, sizeof pat - 2, &rng, 0);
        sd__jre re;
        char why[128];
        if (sd__jre_compile(pat, strlen(pat), NULL, &re, why, sizeof why))
            continue;
        if (re.nstate <= 300) {
            ASSERT_MSG(jre_minimal(&re), "%s: %d states, two of them alike", pat, re.nstate);
            checked++;
        }
        sd__jre_free(&re);
    }
    ASSERT_GT(checked, 100);
    fprintf(stderr, "  %d random patterns' automata minimal\n", checked);
}

TEST(random_patterns_agree_with_a_backtracking_reference)
{
    uint64_t seed = sd_test_seed(), rng = seed ^ 0x5bd1e995u;
    int schemas = 0, refused = 0, big = 0, texts = 0, valid = 0, cut = 0, completions = 0;
    for (int trial = 0; trial < 500; trial++) {
        char pat[256] = "";
        const uint64_t u = next_rand(&rng);
        if (u % 3)
            strcat(pat, "^");
        x_gen(pat, sizeof pat - 2, &rng, 0);
        if (u / 3 % 3)
            strcat(pat, "$");
        xre *x = malloc(sizeof *x);
        x->n = 0;
        x->p = pat;
        xcase c = {x, x_alt(x), 0, 1LL << 40};
        json_t *sch = json_pack("{s:s, s:s}", "type", "string", "pattern", pat);
        if (u / 9 % 3 == 0) {
            c.min_len = (long long)(next_rand(&rng) % 4);
            json_object_set_new(sch, "minLength", json_integer(c.min_len));
        }
        if (u / 27 % 3 == 0) {
            c.max_len = c.min_len + (long long)(next_rand(&rng) % 5);
            json_object_set_new(sch, "maxLength", json_integer(c.max_len));
        }
        char *text = json_dumps(sch, JSON_COMPACT);
        json_decref(sch);
        sd_err err;
        sd_jschema *s = compile_or_null(text, &err);
        if (!s && strstr(err.msg, "automaton states")) { /* (too large: rare) */
            big++;
            free(text);
            free(x);
            continue;
        }
        if (!s) { /* no string of the lengths matches: none of up to 4 chars */
            ASSERT_MSG(strstr(err.msg, "matches no string"), "%s: %s", text, err.msg);
            uint32_t str[8];
            for (int len = 0; len <= 4; len++)
                for (int k = 0; k < (len ? 10 : 1); k++) {
                    for (int q = 0; q < len; q++)
                        str[q] = XCHARS[next_rand(&rng) % NX];
                    ASSERT_MSG(!x_valid(&c, str, len), "%s refused", text);
                }
            refused++;
            free(text);
            free(x);
            continue;
        }
        schemas++;
        for (int j = 0; j < 24; j++) {
            uint32_t str[40];
            int n = 0;
            if (j % 2 == 0 && x_sample(x, c.root, &rng, str, &n, 12)) {
                /* a match, sometimes with chars around it or one changed */
                if (j % 8 == 2 && n < 12)
                    str[n++] = XCHARS[next_rand(&rng) % NX];
                if (j % 8 == 4 && n)
                    str[next_rand(&rng) % (uint64_t)n] = XCHARS[next_rand(&rng) % NX];
            } else {
                n = (int)(next_rand(&rng) % 7);
                for (int q = 0; q < n; q++)
                    str[q] = XCHARS[next_rand(&rng) % NX];
            }
            char t[512];
            int off[41];
            const size_t len = x_text(str, n, &rng, t, off);
            const int theirs = x_valid(&c, str, n), ours = whole(s, t, len);
            ASSERT_MSG(ours == theirs, "seed %llu: %s: %s: automaton %d, reference %d",
                       (unsigned long long)seed, text, t, ours, theirs);
            texts++;
            valid += theirs;
            const size_t at = bad_at(s, t, len);
            if (theirs) {
                ASSERT_MSG(at == len, "seed %llu: %s: %s: a prefix refused at %zu",
                           (unsigned long long)seed, text, t, at);
                continue;
            }
            ASSERT_MSG(at < len, "seed %llu: %s: %s: every byte taken", (unsigned long long)seed, text, t);
            /* the byte it went bad at: within code point q (or the closing
             * quote, after which nothing may follow) */
            int q = 0;
            while (q < n && off[q + 1] <= (int)at)
                q++;
            if (q < n && texts % 3 == 0) {
                ASSERT_MSG(!x_completes_from(&c, str, q, t + off[q], at + 1 - (size_t)off[q], 2),
                           "seed %llu: %s: %s: bad at byte %zu, yet a string goes on from it",
                           (unsigned long long)seed, text, t, at);
                cut++;
            }
            if (at > 0 && texts % 2 == 0) {
                ASSERT_MSG(x_completes(s, &c, t, at, str, q, off),
                           "seed %llu: %s: %.*s: no valid completion",
                           (unsigned long long)seed, text, (int)at, t);
                completions++;
            }
        }
        sd_jschema_free(s);
        free(text);
        free(x);
    }
    fprintf(stderr,
            "  seed %llu: %d patterns (%d refused as matching none, %d as too large), %d strings (%d "
            "valid), %d cut-offs checked, %d completions\n",
            (unsigned long long)seed, schemas, refused, big, texts, valid, cut, completions);
    ASSERT_LT(big, 10);
    ASSERT_GT(schemas, 350);
    ASSERT_GT(valid, 2000);
    ASSERT_GT(texts - valid, 2000);
}

/* an integer's text (JSON's: no leading zero, "-0" too) within [lo, hi]
 * and a multiple of m; *v its value */
static int m_valid(const char *t, size_t n, long long lo, long long hi, long long m)
{
    size_t i = t[0] == '-';
    if (i >= n || n > 18 || (t[i] == '0' && n > i + 1))
        return 0;
    long long v = 0;
    for (size_t k = i; k < n; k++) {
        if (t[k] < '0' || t[k] > '9')
            return 0;
        v = v * 10 + (t[k] - '0');
    }
    v = i ? -v : v;
    return v >= lo && v <= hi && v % m == 0;
}

/* some integer text t[0..n) and up to 4 more digits is valid (brute force:
 * with bounds within 1500 of 0 and m below 10^4, 4 more always reach past
 * a bound and span a multiple) */
static int m_goes_on(const char *t, size_t n, long long lo, long long hi, long long m)
{
    const int neg = t[0] == '-', digits = (int)n - neg;
    long long p = 0;
    for (size_t k = (size_t)neg; k < n; k++) {
        if (t[k] < '0' || t[k] > '9')
            return 0;
        p = p * 10 + (t[k] - '0');
    }
    if (digits > 1 && t[neg] == '0')
        return 0;
    for (int more = 0, top = 1; more <= 4; more++, top *= 10) {
        if (digits && t[neg] == '0' && more) /* (0 takes no more) */
            break;
        for (long long r = digits || more < 2 ? 0 : top / 10; r < top && (digits || more); r++) {
            const long long v = (neg ? -1 : 1) * (p * top + r);
            if (v >= lo && v <= hi && v % m == 0)
                return 1;
        }
    }
    return 0;
}

/* Integers' multipleOf on random divisors and bounds (none, one or two
 * sides, inclusive or exclusive): texts near the bounds, multiples and any
 * digits are whole exactly where brute force says so; every byte taken
 * begins some valid integer, and the byte a text goes bad at begins none */
TEST(random_multiples_agree_with_brute_force)
{
    static const char *const KW[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    uint64_t seed = sd_test_seed(), rng = seed ^ 0x27d4eb2fu;
    int schemas = 0, refused = 0, texts = 0, valid = 0, cuts = 0;
    for (int trial = 0; trial < 300; trial++) {
        const long long m = next_rand(&rng) % 4 ? 2 + (long long)(next_rand(&rng) % 12)
                                                 : 2 + (long long)(next_rand(&rng) % 400);
        long long lo = -(1LL << 60), hi = 1LL << 60; /* (past what any text here reaches) */
        char sch[256];
        int w = snprintf(sch, sizeof sch, "{\"type\":\"integer\",\"multipleOf\":%lld", m);
        for (int side = 0; side < 2; side++) {
            if (next_rand(&rng) % 3 == 0)
                continue;
            const int ex = (int)(next_rand(&rng) % 2);
            const long long b = (long long)(next_rand(&rng) % 3001) - 1500;
            w += snprintf(sch + w, sizeof sch - (size_t)w, ",\"%s\":%lld", KW[2 * side + ex], b);
            if (side == 0)
                lo = b + ex;
            else
                hi = b - ex;
        }
        snprintf(sch + w, sizeof sch - (size_t)w, "}");
        sd_err err;
        sd_jschema *s = compile_or_null(sch, &err);
        long long first = lo % m ? lo + (lo > 0 ? m - lo % m : -(lo % m)) : lo;
        if (!s) {
            ASSERT_MSG(strstr(err.msg, "admit no multiple") || strstr(err.msg, "admit no 64-bit"),
                       "%s: %s", sch, err.msg);
            ASSERT_MSG(first > hi, "%s refused, yet %lld", sch, first);
            refused++;
            continue;
        }
        ASSERT_MSG(first <= hi, "%s compiled", sch);
        schemas++;
        for (int j = 0; j < 40; j++) {
            char t[32];
            const uint64_t u = next_rand(&rng);
            const long long base = u % 3 == 0 ? (lo > -5000 ? lo : -2000)
                                   : u % 3 == 1 ? (hi < 5000 ? hi : 2000)
                                                : (long long)(u / 3 % 6001) - 3000;
            long long v = base + (long long)(next_rand(&rng) % 41) - 20;
            if (j % 4 == 0)
                v -= v % m;
            if (j % 10 == 9) {
                snprintf(t, sizeof t, "%s", j % 20 == 9 ? "-0" : "00");
            } else {
                snprintf(t, sizeof t, "%lld", v);
            }
            const size_t n = strlen(t);
            const int theirs = m_valid(t, n, lo, hi, m), ours = whole(s, t, n);
            ASSERT_MSG(ours == theirs, "seed %llu: %s: %s: automaton %d, brute force %d",
                       (unsigned long long)seed, sch, t, ours, theirs);
            texts++;
            valid += theirs;
            const size_t at = bad_at(s, t, n);
            for (size_t k = 1; k <= at && k <= n; k++)
                ASSERT_MSG(m_goes_on(t, k, lo, hi, m), "seed %llu: %s: %.*s taken, yet nothing valid begins so",
                           (unsigned long long)seed, sch, (int)k, t);
            if (at < n) {
                ASSERT_MSG(!m_goes_on(t, at + 1, lo, hi, m), "seed %llu: %s: %s bad at %zu, yet %.*s goes on",
                           (unsigned long long)seed, sch, t, at, (int)at + 1, t);
                cuts++;
            }
        }
        sd_jschema_free(s);
    }
    fprintf(stderr, "  %d schemas (%d refused), %d texts (%d valid), %d cut-offs\n", schemas, refused,
            texts, valid, cuts);
    ASSERT_GT(schemas, 200);
    ASSERT_GT(valid, 1000);
    ASSERT_GT(cuts, 1000);
}

TEST(refused_schemas_name_the_keyword)
{
    static const struct {
        const char *schema, *msg;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"^(?=a)\"}}}",
         "json_schema: \"pattern\" at $.properties.name: lookahead and lookbehind ((?=, (?!, (?<=, "
         "(?<!) are not supported"},
        /* patterns outside the subset, each saying why */
        {"{\"pattern\":\"a(?!b)\"}", "\"pattern\" at $: lookahead and lookbehind"},
        {"{\"pattern\":\"(?<=a)b\"}", "\"pattern\" at $: lookahead and lookbehind"},
        {"{\"pattern\":\"(a)\\\\1\"}", "\"pattern\" at $: backreferences (\\1) are not supported"},
        {"{\"pattern\":\"(?<n>a)\\\\k<n>\"}", "backreferences (\\k<name>) are not supported"},
        {"{\"pattern\":\"\\\\bword\"}", "word boundaries (\\b, \\B) are not supported"},
        {"{\"pattern\":\"\\\\p{L}\"}", "unicode property escapes (\\p{...}) are not supported"},
        {"{\"pattern\":\"a*+\"}", "a quantifier after a quantifier"},
        {"{\"pattern\":\"a{2\"}", "a '{' that is not a repetition"},
        {"{\"pattern\":\"a}\"}", "a lone '}'"},
        {"{\"pattern\":\"^caf\u00e9$\"}", "non-ASCII characters are not supported in a pattern"},
        {"{\"pattern\":\"\\\\u00e9\"}", "non-ASCII characters (\\u00E9) are not supported"},
        {"{\"pattern\":\"[z-a]\"}", "the range z-a is out of order"},
        {"{\"pattern\":\"[\\\\d-z]\"}", "a range from a class escape"},
        {"{\"pattern\":\"(a\"}", "a '(' without its ')'"},
        {"{\"pattern\":\"a)\"}", "a ')' without its '('"},
        {"{\"pattern\":\"*a\"}", "'*' with nothing to repeat"},
        {"{\"pattern\":\"^*\"}", "an anchor (^, $) with a quantifier"},
        {"{\"pattern\":\"(?i)a\"}", "the group (?i"},
        {"{\"pattern\":\"\\\\e\"}", "the escape \\e is not supported"},
        {"{\"pattern\":\"a{1001}\"}", "a repetition count above 1000"},
        {"{\"pattern\":\"a{3,2}\"}", "the repetition {3,2} is out of order"},
        {"{\"pattern\":\"(a{100}){100}\"}", "the pattern is too large (its repetitions expand past"},
        {"{\"pattern\":\"(a|b)*a(a|b){11}\"}", "the pattern needs more than 2048 automaton states"},
        {"{\"pattern\":\"(?:.+\\\\s){1,450}\"}", "the pattern is too large to compile"},
        /* two that take ~2.4M steps each: the second is over the schema's 4.2M */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":\"(?:\\\\w+[a-z]){1,300}\"},"
         "\"b\":{\"pattern\":\"(?:\\\\d?(?:a|b)){1,300}\"}}}",
         "\"pattern\" at $.properties.b: the pattern is too large to compile"},
        {"{\"pattern\":\"a^b\"}", "\"pattern\" at $: the pattern matches no string"},
        {"{\"pattern\":3}", "\"pattern\" at $ must be a string"},
        {"{\"type\":\"string\",\"pattern\":\"^a{5}$\",\"maxLength\":3}",
         "\"pattern\" at $ matches no string of 0 to 3 code points"},
        {"{\"type\":\"string\",\"pattern\":\"^(ab)+$\",\"minLength\":3,\"maxLength\":3}",
         "\"pattern\" at $ matches no string of 3 to 3 code points"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":70000}",
         "\"minLength\" and \"maxLength\" beside a pattern at $ must be below 65535"},
        {"{\"enum\":[\"b\",\"c\"],\"pattern\":\"a\"}", "\"enum\" at $ admits no value"},
        {"{\"$ref\":\"#/$defs/a\",\"pattern\":\"a\",\"$defs\":{\"a\":{}}}",
         "\"$ref\" at $ with \"pattern\" beside it is not supported"},
        /* multiples: integers', whole, within the bounds */
        {"{\"multipleOf\":2}", "\"multipleOf\" at $ is supported with \"type\": \"integer\" beside it"},
        {"{\"type\":\"integer\",\"multipleOf\":0.5}",
         "\"multipleOf\" at $ is supported as an integer from 1 to 4294967295"},
        {"{\"type\":\"integer\",\"multipleOf\":0}", "\"multipleOf\" at $ is supported as an integer"},
        {"{\"type\":\"integer\",\"multipleOf\":4294967296}", "\"multipleOf\" at $ is supported as an integer"},
        {"{\"type\":\"integer\",\"multipleOf\":\"2\"}", "\"multipleOf\" at $ is supported as an integer"},
        {"{\"type\":\"integer\",\"minimum\":1,\"maximum\":4,\"multipleOf\":5}",
         "the bounds at $ admit no multiple of 5"},
        {"{\"enum\":[1,3],\"multipleOf\":2}", "\"enum\" at $ admits no value"},
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
        {"{\"type\":\"number\",\"multipleOf\":2}",
         "\"multipleOf\" at $ is supported with \"type\": \"integer\" beside it (not on numbers)"},
        {"{\"type\":[\"integer\",\"number\"],\"multipleOf\":0.25}", "(not on numbers)"},
        {"{\"type\":\"array\",\"prefixItems\":[]}",
         "\"prefixItems\" at $ must be an array of 1 to 64 schemas"},
        {"{\"prefixItems\":{\"type\":\"null\"}}",
         "\"prefixItems\" at $ must be an array of 1 to 64 schemas"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
         "\"minItems\" at $ is greater than \"maxItems\" (or the items \"items\": false leaves)"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"pattern\":\"a|\\\\2\"}]}",
         "\"pattern\" at $.prefixItems[0]: backreferences (\\2) are not supported"},
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
        {"{\"type\":\"object\",\"additionalProperties\":{\"pattern\":\"\\\\P{Lu}\"}}",
         "\"pattern\" at $.additionalProperties: unicode property escapes"},
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
         "\"a\",\"parameters\":{\"type\":\"object\",\"minProperties\":1},\"suffix\":\"\"}]}}",
         "\"minProperties\" at $.tools[0].parameters is not supported"},
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
          T(patterns_hold_at_the_right_byte), T(multiples_hold_at_the_right_byte),
          T(random_patterns_agree_with_a_backtracking_reference),
          T(a_patterns_automaton_keeps_no_two_states_alike),
          T(random_multiples_agree_with_brute_force), T(refused_schemas_name_the_keyword),
          T(random_documents_agree_with_the_reference))

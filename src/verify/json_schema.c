#include "verify/json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "verify/json_regex.h"

/* ---- the program ------------------------------------------------------
 *
 * A node is a schema after $ref: a leaf (what one value may be: types and
 * their constraints, or an enum, or any value) or a union (anyOf, oneOf, a
 * $ref's target) that stands for a list of leaves. The state's
 * alternatives are leaves. */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64 };
#define T_ALL 127
#define INF 255 /* the nesting of a value that cannot be */

/* F_OPEN: an object of any keys, their values of node vals (no properties
 * listed; additionalProperties true: any value, or a schema) */
enum { F_LEAF = 1, F_ANY = 2, F_ENUM = 4, F_CLOSED = 8, F_ONEOF = 16, F_OPEN = 32 };

typedef struct js_prop {
    uint32_t name; /* the key's JSON text, unquoted, in text */
    uint16_t len;
    uint16_t node;
    uint16_t lim; /* the last key that may follow when this is the first
                   * allowed: the first required one from here, or the last */
    uint8_t required;
} js_prop;

typedef struct js_lit {
    uint32_t off; /* a value's JSON text in text */
    uint16_t len;
} js_lit;

/* a number's bound: m 10^e, its sign, and how it bounds (NB_*) */
typedef struct js_bound {
    uint64_t m;
    int16_t e;
    uint8_t neg, kind;
} js_bound;
enum { NB_NONE, NB_INCL, NB_EXCL };

typedef struct js_node {
    uint8_t flags, types;
    uint8_t mind;               /* least nesting of a value (INF: none) */
    uint8_t mind_obj, mind_arr; /* of an object / array value, itself included */
    uint16_t items;
    uint16_t vals;         /* F_OPEN: the values' schema */
    uint32_t prop0, nprop; /* object: properties, in order */
    uint32_t lit0, nlit;   /* enum: values, sorted by text */
    uint32_t mem0, nmem;   /* union: members */
    uint32_t leaf0, nleaf; /* the leaves it stands for */
    uint32_t pre0, npre;   /* array: prefixItems' schemas (in mem), items past them */
    uint32_t min_items, max_items, min_len, max_len;
    int64_t lo, hi; /* an integer's bounds (INT64_MIN / INT64_MAX: none on that side) */
    js_bound nlo, nhi; /* a number's bounds (type number) */
    uint32_t mult;     /* an integer's multipleOf (0: none) */
    uint16_t re;       /* a string's pattern: its automaton in re, plus one (0: none) */
} js_node;

/* a tool of x-specd-calls */
typedef struct js_call {
    uint32_t pre, suf; /* its prefix and suffix, in text */
    uint16_t npre, nsuf;
    uint16_t root; /* its parameters' root (a union of the body, as the root) */
    uint16_t ph;   /* the digits' byte in the prefix, or NO_PH */
} js_call;
#define NO_PH 0xffff
#define PH_BYTE 0x01
#define MAX_CALL_TOOLS 128
#define MAX_CALLS 16
#define MAX_PREFIX 64 /* prefixItems' schemas an array */
#define MAX_AFTER 64
#define MAX_RE_STATES 16384     /* patterns' automata's states, in all */
#define MAX_RE_LENS (1u << 21) /* their lengths' tables' entries */

struct sd_jschema {
    js_node *node;
    uint32_t nnode, cnode;
    js_prop *prop;
    uint32_t nprop, cprop;
    js_lit *lit;
    uint32_t nlit, clit;
    uint16_t *mem;
    uint32_t nmem, cmem;
    uint16_t *leaf;
    uint32_t nleaf, cleaf;
    char *text;
    uint32_t ntext, ctext;
    uint16_t root, any;
    int max_depth;
    /* x-specd-calls (ncall tools, sorted by prefix; 0: a plain schema) */
    js_call *call;
    uint32_t ncall;
    uint32_t lead[2], end; /* begin, sep; end: in text */
    uint16_t nlead[2], nend;
    uint8_t max_calls, specials;
    /* x-specd-after: its text (in text) and KMP's failure table; the
     * optional opening (x-specd-open) */
    uint32_t after, open;
    uint16_t nafter, nopen;
    uint8_t after_fail[MAX_AFTER];
    uint64_t serial; /* this compilation's, unique in the process (a mask cache's key) */
    /* strings' patterns (js_node.re); any: strings' characters are decoded
     * (scp, sdec; elsewhere left 0) */
    sd__jre *re;
    uint32_t nre, cre;
    uint32_t re_states, re_lens; /* their automata's states and lengths' entries, in all */
    /* a bounded integer or number among the nodes: numbers' digits are followed
     * (nmag; elsewhere left 0, so states that differ only there stay
     * equal for the mask cache) */
    uint8_t bounded;
};

/* the kinds of value a first byte begins */
enum { K_OBJ, K_ARR, K_STR, K_NUM, K_BOOL, K_NULL, K_COUNT };
static const char *const KIND_NAME[K_COUNT] = {"objects", "arrays",   "strings",
                                               "numbers", "booleans", "nulls"};

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int hexval(unsigned char c)
{
    return is_digit(c)            ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int byte_kind(unsigned char c)
{
    switch (c) {
    case '{': return K_OBJ;
    case '[': return K_ARR;
    case '"': return K_STR;
    case 't':
    case 'f': return K_BOOL;
    case 'n': return K_NULL;
    default: return c == '-' || is_digit(c) ? K_NUM : -1;
    }
}

/* inside an object of leaf n, any key may come */
static int keys_free(const js_node *n) { return (n->flags & (F_ANY | F_OPEN)) != 0; }

/* the schema of such a key's value */
static uint16_t free_vals(const sd_jschema *s, const js_node *n)
{
    return (n->flags & F_ANY) ? s->any : n->vals;
}

/* ---- compiling: the context ------------------------------------------- */

typedef struct js_def {
    char *name; /* "$defs/NAME" or "definitions/NAME" */
    uint16_t node;
} js_def;

typedef struct cx {
    sd_jschema *s;
    json_t *root;       /* where "#/$defs/..." look */
    uint16_t root_node; /* what "#" is */
    sd_err *err;
    js_def *defs;
    uint32_t ndefs, cdefs;
    char **path; /* per node, for messages */
    uint32_t cpath;
    int depth;
    uint64_t re_work; /* what the patterns' automata may still take (sd__jre_compile) */
} cx;

/* 0, or -1 (out of memory, arr as it was); no room wanted: 0 (arr may be NULL) */
#define GROW(arr, n, cap, more)                                                                    \
    ((n) + (more) <= (cap) ? 0                                                                     \
                           : ((arr) = sd_grow((tmp_ = (arr)), &(cap), (n) + (more),                \
                                              sizeof *(arr)),                                      \
                              (arr) ? 0 : ((arr) = tmp_, -1)))

/* the schema of array n's item i: its prefixItems' at i, else items */
static uint16_t item_node(const sd_jschema *s, const js_node *n, uint32_t i)
{
    return i < n->npre ? s->mem[n->pre0 + i] : n->items;
}

/* n node ids appended to mem: 0, or -1 (out of memory) */
static int add_mem(cx *c, const uint16_t *ids, uint32_t n)
{
    sd_jschema *s = c->s;
    void *tmp_;
    if (!n)
        return 0;
    if (GROW(s->mem, s->nmem, s->cmem, n))
        return -1;
    memcpy(s->mem + s->nmem, ids, n * sizeof *ids);
    s->nmem += n;
    return 0;
}

static int refuse(cx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(cx *c, const char *fmt, ...)
{
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return sd_err_set(c->err, SD_EINVAL, "json_schema: %s", m);
}

static int nomem(cx *c) { return sd_err_set(c->err, SD_ENOMEM, "json_schema: out of memory"); }

static int new_node(cx *c, const char *path, uint8_t flags, uint16_t *id)
{
    sd_jschema *s = c->s;
    void *tmp_;
    if (s->nnode >= SD_JSCHEMA_MAX_NODES)
        return refuse(c, "more than %d schemas (at %s)", SD_JSCHEMA_MAX_NODES, path);
    if (GROW(s->node, s->nnode, s->cnode, 1) || GROW(c->path, s->nnode, c->cpath, 1))
        return nomem(c);
    js_node *n = &s->node[s->nnode];
    memset(n, 0, sizeof *n);
    n->flags = flags;
    n->max_items = n->max_len = UINT32_MAX;
    n->lo = INT64_MIN, n->hi = INT64_MAX;
    c->path[s->nnode] = strdup(path);
    if (!c->path[s->nnode])
        return nomem(c);
    *id = (uint16_t)s->nnode++;
    return 0;
}

static int add_text(cx *c, const char *t, size_t n, uint32_t *off)
{
    sd_jschema *s = c->s;
    void *tmp_;
    if (GROW(s->text, s->ntext, s->ctext, (uint32_t)n + 1))
        return nomem(c);
    if (n)
        memcpy(s->text + s->ntext, t, n);
    s->text[s->ntext + n] = 0;
    *off = s->ntext;
    s->ntext += (uint32_t)n + 1;
    return 0;
}

/* the leaf list of a leaf: itself */
static int self_leaf(cx *c, uint16_t id)
{
    sd_jschema *s = c->s;
    void *tmp_;
    if (GROW(s->leaf, s->nleaf, s->cleaf, 1))
        return nomem(c);
    s->node[id].leaf0 = s->nleaf;
    s->node[id].nleaf = 1;
    s->leaf[s->nleaf++] = id;
    return 0;
}

/* ---- compiling: keywords ---------------------------------------------- */

/* constraining keywords this compiler reads */
static const char *const HANDLED[] = {
    "type",      "properties", "required",         "additionalProperties",
    "items",     "minItems",   "maxItems",         "minLength",
    "maxLength", "enum",       "const",            "anyOf",
    "oneOf",     "$ref",       "allOf",            "minimum",
    "maximum",   "exclusiveMinimum", "exclusiveMaximum", "prefixItems",
    "pattern",   "multipleOf",
};
/* the bounds of a number, in the order of the bound they set: lower
 * (inclusive, exclusive), upper (inclusive, exclusive) */
static const char *const BOUND_KW[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
/* annotations, and definitions (read where a $ref points) */
static const char *const IGNORED[] = {
    "description", "title",    "default",   "examples", "$schema",     "$comment",
    "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions", "format",
};

static int in_list(const char *k, const char *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i]))
            return 1;
    return 0;
}
#define IN_LIST(k, l) in_list(k, l, sizeof l / sizeof l[0])

static int check_keywords(cx *c, json_t *j, const char *path, int is_root)
{
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        if (IN_LIST(k, HANDLED) || IN_LIST(k, IGNORED) || (is_root && !strcmp(k, "$id")))
            continue;
        if ((!strcmp(k, "uniqueItems") || !strcmp(k, "unevaluatedProperties")) && json_is_false(v))
            continue; /* what generated output satisfies anyway */
        return refuse(c, "\"%s\" at %s is not supported", k, path);
    }
    return 0;
}

/* a non-negative integer keyword, or dflt when absent */
static int count_kw(cx *c, json_t *j, const char *k, const char *path, uint32_t dflt, uint32_t *out)
{
    json_t *v = json_object_get(j, k);
    *out = dflt;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= (json_int_t)UINT32_MAX)
        return refuse(c, "\"%s\" at %s must be an integer from 0 to %u", k, path, UINT32_MAX - 1);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

/* the bound keywords present (bit i: BOUND_KW[i]); a bound that is not a
 * number is refused */
static int bound_kws(cx *c, json_t *j, const char *path, int *present)
{
    *present = 0;
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(j, BOUND_KW[i]);
        if (v && !json_is_number(v))
            return refuse(c, "\"%s\" at %s must be a number", BOUND_KW[i], path);
        *present |= v ? 1 << i : 0;
    }
    return 0;
}

/* does the number v meet the bounds of j (all present ones) */
static int in_bounds(json_t *j, double v)
{
    for (int i = 0; i < 4; i++) {
        json_t *b = json_object_get(j, BOUND_KW[i]);
        if (!b)
            continue;
        const double x = json_number_value(b);
        if (i == 0 ? v < x : i == 1 ? v <= x : i == 2 ? v > x : v >= x)
            return 0;
    }
    return 1;
}

/* the integers j's bounds admit, [*lo, *hi] (INT64_MIN / INT64_MAX: no
 * bound on that side, and none past it: a bound at int64's end takes the
 * integers past it too). 0, or -1 where a bound is past int64 on the side
 * that leaves none */
static int int_bounds(json_t *j, int64_t *lo, int64_t *hi)
{
    *lo = INT64_MIN, *hi = INT64_MAX;
    for (int i = 0; i < 4; i++) {
        json_t *b = json_object_get(j, BOUND_KW[i]);
        if (!b)
            continue;
        int64_t v; /* the bound as the nearest integer it admits */
        if (json_is_integer(b)) {
            v = json_integer_value(b);
            if ((i == 1 && v == INT64_MAX) || (i == 3 && v == INT64_MIN))
                return -1;
            v += i == 1 ? 1 : i == 3 ? -1 : 0;
        } else {
            const double x = json_real_value(b);
            double r = i < 2 ? (i == 0 ? ceil(x) : floor(x) + 1) : (i == 2 ? floor(x) : ceil(x) - 1);
            if (!(r > -9.2e18)) {
                if (i >= 2)
                    return -1;
                v = INT64_MIN;
            } else if (!(r < 9.2e18)) {
                if (i < 2)
                    return -1;
                v = INT64_MAX;
            } else {
                v = (int64_t)r;
            }
        }
        if (i < 2 && v > *lo)
            *lo = v;
        else if (i >= 2 && v < *hi)
            *hi = v;
    }
    return 0;
}

/* ---- strings' patterns, integers' multiples ------------------------------ */

/* j's "pattern" compiled into *re (*has 0: absent); one outside
 * json_regex's subset is refused, saying what */
static int pattern_kw(cx *c, json_t *j, const char *path, sd__jre *re, int *has)
{
    json_t *p = json_object_get(j, "pattern");
    *has = 0;
    if (!p)
        return 0;
    if (!json_is_string(p))
        return refuse(c, "\"pattern\" at %s must be a string", path);
    char why[256];
    const int rc = sd__jre_compile(json_string_value(p), json_string_length(p), &c->re_work, re,
                                   why, sizeof why);
    if (rc == SD_ENOMEM)
        return nomem(c);
    if (rc)
        return refuse(c, "\"pattern\" at %s: %s", path, why);
    *has = 1;
    return 0;
}

/* "multipleOf": *m (0: absent); an integer from 1 to 2^32 - 1 (a value's
 * remainder is kept in 32 bits) */
static int mult_kw(cx *c, json_t *j, const char *path, uint32_t *m)
{
    json_t *v = json_object_get(j, "multipleOf");
    *m = 0;
    if (!v)
        return 0;
    const double d = json_number_value(v);
    if (!json_is_number(v) || !(d >= 1 && d <= UINT32_MAX) || d != floor(d))
        return refuse(c, "\"multipleOf\" at %s is supported as an integer from 1 to %u", path,
                      UINT32_MAX);
    *m = (uint32_t)d;
    return 0;
}

/* is the number v a multiple of m */
static int is_multiple(json_t *v, uint32_t m)
{
    if (json_is_integer(v))
        return json_integer_value(v) % (json_int_t)m == 0;
    const double d = json_real_value(v);
    return d == floor(d) && fmod(d, m) == 0;
}

/* does [lo, hi] hold a multiple of m (INT64_MIN / INT64_MAX: that side
 * unbounded) */
static int int_multiple_in(int64_t lo, int64_t hi, uint32_t m)
{
    if (!m || lo == INT64_MIN || hi == INT64_MAX)
        return 1;
    const int64_t r = (lo % (int64_t)m + (int64_t)m) % (int64_t)m; /* lo mod m, from 0 */
    return (uint64_t)hi - (uint64_t)lo >= (uint64_t)(r ? (int64_t)m - r : 0);
}

/* re becomes the program's: *id its index plus one (re freed on failure) */
static int add_re(cx *c, sd__jre *re, uint16_t *id)
{
    sd_jschema *s = c->s;
    void *tmp_;
    if (GROW(s->re, s->nre, s->cre, 1)) {
        sd__jre_free(re);
        return nomem(c);
    }
    s->re[s->nre++] = *re;
    *id = (uint16_t)s->nre;
    return 0;
}

/* ---- numbers' bounds -----------------------------------------------------
 * A bounded number is read without an exponent, at most NUM_DIGITS digits
 * from its first nonzero one and NUM_FRAC decimals. Such a decimal and a
 * bound written as the shortest decimal that reads back as the bound's
 * double compare exactly as their doubles do (two decimals of at most 15
 * significant digits are never within one double's rounding of each
 * other), so the bounds hold as any validator that reads both as doubles
 * holds them. */
#define NUM_DIGITS 15
#define NUM_FRAC 20

static int ndigits(uint64_t m)
{
    int d = 1;
    for (; m >= 10; m /= 10)
        d++;
    return d;
}

static uint64_t pow10u(int k)
{
    uint64_t p = 1;
    while (k-- > 0)
        p *= 10;
    return p;
}

/* v as m 10^e, the shortest decimal that reads back as v */
static js_bound bound_of(json_t *v)
{
    js_bound b = {0};
    if (json_is_integer(v)) {
        const json_int_t x = json_integer_value(v);
        b.neg = x < 0;
        b.m = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    } else {
        const double x = json_real_value(v);
        char buf[40];
        for (int p = 0; p < 17; p++) {
            snprintf(buf, sizeof buf, "%.*e", p, x);
            if (strtod(buf, NULL) == x)
                break;
        }
        const char *q = buf;
        b.neg = *q == '-';
        int frac = -1;
        for (q += b.neg; *q && *q != 'e'; q++) {
            if (*q == '.')
                frac = 0;
            else
                b.m = b.m * 10 + (uint64_t)(*q - '0'), frac += frac >= 0;
        }
        b.e = (int16_t)(atoi(q + 1) - (frac > 0 ? frac : 0));
    }
    b.neg &= b.m != 0;
    return b;
}

/* compares the magnitudes am 10^ae and bm 10^be */
static int mag_cmp(uint64_t am, int ae, uint64_t bm, int be)
{
    if (!am || !bm)
        return (am != 0) - (bm != 0);
    const int oa = ndigits(am) + ae, ob = ndigits(bm) + be;
    if (oa != ob)
        return oa < ob ? -1 : 1;
    /* the same order: the one of fewer digits scaled to the other's (at
     * most 19 digits) */
    if (ae > be)
        am *= pow10u(ae - be);
    else
        bm *= pow10u(be - ae);
    return (am > bm) - (am < bm);
}

static int bound_cmp(const js_bound *a, const js_bound *b)
{
    const int sa = a->m ? (a->neg ? -1 : 1) : 0, sb = b->m ? (b->neg ? -1 : 1) : 0;
    if (sa != sb)
        return sa < sb ? -1 : 1;
    const int c = mag_cmp(a->m, a->e, b->m, b->e);
    return sa < 0 ? -c : c;
}

/* a number's bounds from j's keywords (the tightest of each side; an
 * exclusive one where they are equal) */
static void num_bounds(json_t *j, js_bound *lo, js_bound *hi)
{
    *lo = *hi = (js_bound){0};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(j, BOUND_KW[i]);
        if (!v)
            continue;
        js_bound b = bound_of(v);
        b.kind = i == 0 || i == 2 ? NB_INCL : NB_EXCL;
        js_bound *cur = i < 2 ? lo : hi;
        const int c = cur->kind ? bound_cmp(&b, cur) : 0;
        if (!cur->kind || (i < 2 ? c > 0 : c < 0) || (c == 0 && b.kind == NB_EXCL))
            *cur = b;
    }
}

static int num_any(const js_node *n);

static int type_bit(const char *t)
{
    static const char *const names[] = {"null",   "boolean", "integer", "number",
                                        "string", "array",   "object"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i]))
            return 1 << i;
    return 0;
}

/* "type": a name or a list of them; 0 when absent */
static int parse_types(cx *c, json_t *j, const char *path, uint8_t *out)
{
    json_t *ty = json_object_get(j, "type");
    *out = 0;
    if (!ty)
        return 0;
    size_t n = json_is_array(ty) ? json_array_size(ty) : 1;
    if (!n || (!json_is_array(ty) && !json_is_string(ty)))
        return refuse(c, "\"type\" at %s must be a type name or a non-empty array of them", path);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_is_array(ty) ? json_array_get(ty, i) : ty;
        int b = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
        if (!b)
            return refuse(c, "\"type\" at %s: unknown type %s%s%s", path,
                          json_is_string(t) ? "\"" : "",
                          json_is_string(t) ? json_string_value(t) : "(not a string)",
                          json_is_string(t) ? "\"" : "");
        *out |= (uint8_t)b;
    }
    if (*out & T_NUM) /* integer | number is number */
        *out &= (uint8_t)~T_INT;
    return 0;
}

/* code points of a UTF-8 string: its lead bytes */
static uint32_t utf8_len(const char *p, size_t n)
{
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}

/* the exact text an enum value is matched as (malloc'd) */
static char *canon(json_t *v)
{
    char buf[64];
    if (json_is_string(v))
        return json_dumps(v, JSON_ENCODE_ANY);
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 1e15) {
            snprintf(buf, sizeof buf, "%.0f", d);
        } else {
            for (int p = 1; p <= 17; p++) {
                snprintf(buf, sizeof buf, "%.*g", p, d);
                if (strtod(buf, NULL) == d)
                    break;
            }
        }
    } else {
        snprintf(buf, sizeof buf, "%s",
                 json_is_true(v)    ? "true"
                 : json_is_false(v) ? "false"
                                    : "null");
    }
    return strdup(buf);
}

/* the type an enum value has (an integral real is an integer) */
static int value_type(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_NUM;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_NULL: return T_NULL;
    default: return 0;
    }
}

static int lit_cmp(const sd_jschema *s, const js_lit *a, const js_lit *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(s->text + a->off, s->text + b->off, n);
    return r ? r : (int)a->len - (int)b->len;
}

/* sorts (insertion: at most SD_JSCHEMA_MAX_ENUM) and drops duplicates; the count left */
static uint32_t sort_lits(const sd_jschema *s, js_lit *l, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        js_lit x = l[i];
        uint32_t j = i;
        for (; j > 0 && lit_cmp(s, &l[j - 1], &x) > 0; j--)
            l[j] = l[j - 1];
        l[j] = x;
    }
    uint32_t w = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!w || lit_cmp(s, &l[w - 1], &l[i]))
            l[w++] = l[i];
    return w;
}

/* node's enum: its types and the literals added from lit0 on, sorted,
 * without duplicates */
static void set_enum(sd_jschema *s, js_node *nd, int types, uint32_t lit0)
{
    nd->types = (uint8_t)types;
    nd->lit0 = lit0;
    nd->nlit = sort_lits(s, s->lit + lit0, s->nlit - lit0);
    s->nlit = lit0 + nd->nlit;
}

static int lit_types(const sd_jschema *s, const js_lit *l)
{
    const char *t = s->text + l->off;
    switch (t[0]) {
    case '"': return T_STR;
    case 't':
    case 'f': return T_BOOL;
    case 'n': return T_NULL;
    default: return strpbrk(t, ".eE") ? T_NUM : T_INT;
    }
}

static int compile(cx *c, json_t *j, const char *path, int is_root, uint16_t *out);

/* enum / const: a leaf of values, those of the schema's type, length,
 * bounds, pattern re (NULL: none) and multiple mult (0: none) */
static int enum_values(cx *c, json_t *j, const char *path, const sd__jre *re, uint32_t mult,
                       uint16_t *out)
{
    sd_jschema *s = c->s;
    json_t *e = json_object_get(j, "enum"), *k = json_object_get(j, "const");
    const char *kw = e ? "enum" : "const";
    if (e && (!json_is_array(e) || !json_array_size(e)))
        return refuse(c, "\"enum\" at %s must be a non-empty array", path);
    uint8_t types;
    uint32_t min_len, max_len;
    int bounds;
    int rc = parse_types(c, j, path, &types);
    if (!rc)
        rc = count_kw(c, j, "minLength", path, 0, &min_len);
    if (!rc)
        rc = count_kw(c, j, "maxLength", path, UINT32_MAX, &max_len);
    if (!rc)
        rc = bound_kws(c, j, path, &bounds);
    if (rc)
        return rc;
    if (!types)
        types = T_ALL;
    size_t n = e ? json_array_size(e) : 1;
    if (n > SD_JSCHEMA_MAX_ENUM)
        return refuse(c, "\"enum\" at %s has more than %d values", path, SD_JSCHEMA_MAX_ENUM);
    void *tmp_;
    if (GROW(s->lit, s->nlit, s->clit, (uint32_t)n))
        return nomem(c);
    uint32_t lit0 = s->nlit, kinds = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = e ? json_array_get(e, i) : k;
        int t = value_type(v);
        if (!t)
            return refuse(c, "\"%s\" at %s: only scalar values (no object or array) are supported",
                          kw, path);
        if (e && k && !json_equal(v, k))
            continue;
        if (!(t & types) && !(t == T_INT && (types & T_NUM)))
            continue;
        if (t == T_STR) {
            uint32_t len = utf8_len(json_string_value(v), json_string_length(v));
            if (len < min_len || len > max_len ||
                (re && !sd__jre_match(re, json_string_value(v), json_string_length(v))))
                continue;
        }
        if ((t & (T_INT | T_NUM)) && bounds && !in_bounds(j, json_number_value(v)))
            continue;
        if ((t & (T_INT | T_NUM)) && mult && !is_multiple(v, mult))
            continue;
        char *txt = canon(v);
        if (!txt)
            return nomem(c);
        size_t tl = strlen(txt);
        uint32_t off = 0;
        if (tl > SD_JSCHEMA_MAX_TEXT) {
            free(txt);
            return refuse(c, "\"%s\" at %s: a value longer than %d bytes", kw, path,
                          SD_JSCHEMA_MAX_TEXT);
        }
        rc = add_text(c, txt, tl, &off);
        free(txt);
        if (rc)
            return rc;
        s->lit[s->nlit++] = (js_lit){off, (uint16_t)tl};
        kinds |= (uint32_t)t;
    }
    if (s->nlit == lit0)
        return refuse(c,
                      "\"%s\" at %s admits no value (none has the schema's type, length, bounds, "
                      "pattern and multipleOf)",
                      kw, path);
    uint16_t id;
    if ((rc = new_node(c, path, F_LEAF | F_ENUM, &id)) || (rc = self_leaf(c, id)))
        return rc;
    set_enum(s, &s->node[id], kinds, lit0);
    *out = id;
    return 0;
}

static int compile_enum(cx *c, json_t *j, const char *path, uint16_t *out)
{
    sd__jre re;
    int has = 0;
    uint32_t mult = 0;
    int rc = pattern_kw(c, j, path, &re, &has);
    if (!rc)
        rc = mult_kw(c, j, path, &mult);
    if (!rc)
        rc = enum_values(c, j, path, has ? &re : NULL, mult, out);
    if (has)
        sd__jre_free(&re);
    return rc;
}

/* $ref: "#", "#/$defs/NAME" or "#/definitions/NAME" */
static int compile_ref(cx *c, json_t *j, const char *path, uint16_t *out)
{
    json_t *v = json_object_get(j, "$ref");
    if (!json_is_string(v))
        return refuse(c, "\"$ref\" at %s must be a string", path);
    const char *r = json_string_value(v), *name = NULL, *where = NULL;
    if (!strcmp(r, "#")) {
        *out = c->root_node;
        return 0;
    }
    if (!strncmp(r, "#/$defs/", 8))
        name = r + 8, where = "$defs";
    else if (!strncmp(r, "#/definitions/", 14))
        name = r + 14, where = "definitions";
    if (!name || !*name || strchr(name, '/'))
        return refuse(c,
                      "\"$ref\" \"%s\" at %s is not supported (only \"#\", \"#/$defs/NAME\", "
                      "\"#/definitions/NAME\")",
                      r, path);
    /* the def's key: JSON pointer's ~1 and ~0 undone */
    size_t wl = strlen(where), nl = strlen(name);
    char *key = malloc(wl + 1 + nl + 1);
    if (!key)
        return nomem(c);
    memcpy(key, where, wl);
    key[wl] = '/';
    size_t o = wl + 1;
    for (size_t i = 0; i < nl; i++) {
        if (name[i] == '~' && (name[i + 1] == '0' || name[i + 1] == '1')) {
            key[o++] = name[i + 1] == '0' ? '~' : '/';
            i++;
        } else {
            key[o++] = name[i];
        }
    }
    key[o] = 0;
    for (uint32_t i = 0; i < c->ndefs; i++) {
        if (!strcmp(c->defs[i].name, key)) {
            *out = c->defs[i].node;
            free(key);
            return 0;
        }
    }
    json_t *d = json_object_get(json_object_get(c->root, where), key + wl + 1);
    if (!d) {
        free(key);
        return refuse(c, "\"$ref\" \"%s\" at %s: no such definition", r, path);
    }
    /* a union of one, registered before its body: recursion finds it */
    char dpath[512];
    snprintf(dpath, sizeof dpath, "$.%s.%s", where, key + wl + 1);
    uint16_t u, body;
    void *tmp_;
    int rc = new_node(c, dpath, 0, &u);
    if (!rc && GROW(c->defs, c->ndefs, c->cdefs, 1))
        rc = nomem(c);
    if (rc) {
        free(key);
        return rc;
    }
    c->defs[c->ndefs++] = (js_def){key, u};
    if ((rc = compile(c, d, dpath, 0, &body)))
        return rc;
    sd_jschema *s = c->s;
    if (GROW(s->mem, s->nmem, s->cmem, 1))
        return nomem(c);
    s->node[u].mem0 = s->nmem;
    s->node[u].nmem = 1;
    s->mem[s->nmem++] = body;
    *out = u;
    return 0;
}

/* anyOf / oneOf: a union of the branches; allOf of one schema: that one
 * (pydantic's way to put a description beside a $ref) */
static int compile_union(cx *c, json_t *j, const char *path, uint16_t *out)
{
    const char *kw = json_object_get(j, "anyOf")   ? "anyOf"
                     : json_object_get(j, "oneOf") ? "oneOf"
                                                   : "allOf";
    json_t *a = json_object_get(j, kw);
    size_t n = json_array_size(a);
    if (!json_is_array(a) || !n)
        return refuse(c, "\"%s\" at %s must be a non-empty array", kw, path);
    if (kw[1] == 'l' && n > 1)
        return refuse(c, "\"allOf\" at %s is not supported (but for one schema)", path);
    uint16_t *br = malloc(n * sizeof *br);
    if (!br)
        return nomem(c);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s.%s[%zu]", path, kw, i);
        rc = compile(c, json_array_get(a, i), p, 0, &br[i]);
    }
    uint16_t u;
    sd_jschema *s = c->s;
    if (!rc)
        rc = new_node(c, path, kw[0] == 'o' ? F_ONEOF : 0, &u);
    if (!rc) {
        s->node[u].mem0 = s->nmem;
        s->node[u].nmem = (uint32_t)n;
        if (add_mem(c, br, (uint32_t)n))
            rc = nomem(c);
        else
            *out = u;
    }
    free(br);
    return rc;
}

/* an object's properties, required and additionalProperties into node id */
static int compile_object(cx *c, json_t *j, const char *path, uint16_t id)
{
    sd_jschema *s = c->s;
    json_t *props = json_object_get(j, "properties"), *req = json_object_get(j, "required"),
           *add = json_object_get(j, "additionalProperties");
    if (props && !json_is_object(props))
        return refuse(c, "\"properties\" at %s must be an object", path);
    if (req && !json_is_array(req))
        return refuse(c, "\"required\" at %s must be an array of names", path);
    size_t n = json_object_size(props);
    if (add && !json_is_boolean(add) && !(json_is_object(add) && !n))
        return refuse(c,
                      "\"additionalProperties\" at %s is not supported unless false (or true, "
                      "read as false), or a schema where no properties are listed",
                      path);
    /* no properties, additionalProperties true or a schema: any keys */
    uint16_t vals = s->any;
    if (json_is_object(add)) {
        char p[512];
        snprintf(p, sizeof p, "%s.additionalProperties", path);
        int rv = compile(c, add, p, 0, &vals);
        if (rv)
            return rv;
    }
    if (n > SD_JSCHEMA_MAX_PROPS)
        return refuse(c, "\"properties\" at %s has more than %d keys", path, SD_JSCHEMA_MAX_PROPS);
    js_prop *tp = calloc(n ? n : 1, sizeof *tp);
    if (!tp)
        return nomem(c);
    int rc = 0;
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v)
    {
        char p[512];
        snprintf(p, sizeof p, "%s.properties.%s", path, k);
        json_t *ks = json_string(k);
        char *t = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!t) {
            rc = nomem(c);
            break;
        }
        size_t tl = strlen(t) - 2; /* without the quotes */
        if (tl > SD_JSCHEMA_MAX_TEXT)
            rc = refuse(c, "a key longer than %d bytes at %s", SD_JSCHEMA_MAX_TEXT, p);
        if (!rc)
            rc = add_text(c, t + 1, tl, &tp[i].name);
        free(t);
        tp[i].len = (uint16_t)tl;
        if (!rc)
            rc = compile(c, v, p, 0, &tp[i].node);
        if (rc)
            break;
        i++;
    }
    for (size_t r = 0; !rc && r < json_array_size(req); r++) {
        json_t *x = json_array_get(req, r);
        if (!json_is_string(x)) {
            rc = refuse(c, "\"required\" at %s must be an array of names", path);
            break;
        }
        size_t at = 0;
        json_object_foreach(props, k, v)
        {
            if (!strcmp(k, json_string_value(x)))
                break;
            at++;
        }
        if (at == n)
            rc = refuse(c, "\"required\" at %s names \"%s\", which is not in \"properties\"", path,
                        json_string_value(x));
        else
            tp[at].required = 1;
    }
    void *tmp_;
    if (!rc && GROW(s->prop, s->nprop, s->cprop, (uint32_t)n))
        rc = nomem(c);
    if (!rc) {
        uint32_t next_req = (uint32_t)n;
        for (size_t q = n; q-- > 0;) {
            if (tp[q].required)
                next_req = (uint32_t)q;
            tp[q].lim = (uint16_t)(next_req < n ? next_req : n - 1);
        }
        js_node *nd = &s->node[id];
        nd->prop0 = s->nprop;
        nd->nprop = (uint32_t)n;
        if (json_is_false(add))
            nd->flags |= F_CLOSED;
        else if ((json_is_true(add) || json_is_object(add)) && !n)
            nd->flags |= F_OPEN, nd->vals = vals;
        if (n)
            memcpy(s->prop + s->nprop, tp, n * sizeof *tp);
        s->nprop += (uint32_t)n;
    }
    free(tp);
    return rc;
}

/* a string's pattern (none: *re 0) with its lengths [min_len, max_len]:
 * a string of them must match (the lengths' table built where bounded) */
static int compile_pattern(cx *c, json_t *j, const char *path, uint32_t min_len, uint32_t max_len,
                           uint16_t *re)
{
    sd__jre x;
    int has;
    *re = 0;
    int rc = pattern_kw(c, j, path, &x, &has);
    if (rc || !has)
        return rc;
    if (min_len || max_len != UINT32_MAX) {
        char why[256];
        /* (the count beside the automaton's state: 16 bits) */
        if (min_len >= UINT16_MAX || (max_len != UINT32_MAX && max_len >= UINT16_MAX))
            rc = refuse(c, "\"minLength\" and \"maxLength\" beside a pattern at %s must be below %d",
                        path, UINT16_MAX);
        else if ((rc = sd__jre_lengths(&x, why, sizeof why)))
            rc = rc == SD_ENOMEM ? nomem(c) : refuse(c, "\"pattern\" at %s: %s", path, why);
        else if (sd__jre_next_len(&x, 0, min_len) > max_len)
            rc = refuse(c, "\"pattern\" at %s matches no string of %u to %u code points", path,
                        min_len, max_len);
        if (rc) {
            sd__jre_free(&x);
            return rc;
        }
    }
    /* (the program's memory: a cap over all its patterns) */
    sd_jschema *s = c->s;
    s->re_states += x.nstate;
    s->re_lens += x.len ? x.nstate * (x.lt + x.lp) : 0;
    if (s->re_states > MAX_RE_STATES || s->re_lens > MAX_RE_LENS) {
        sd__jre_free(&x);
        return refuse(c, "the patterns up to %s need more than %d automaton states (or %d lengths) in all",
                      path, MAX_RE_STATES, MAX_RE_LENS);
    }
    return add_re(c, &x, re);
}

/* a leaf of types (given, or told by the keywords present); any value
 * when neither */
static int compile_typed(cx *c, json_t *j, const char *path, uint16_t *out)
{
    uint8_t t;
    int bounds;
    int rc = parse_types(c, j, path, &t);
    if (!rc)
        rc = bound_kws(c, j, path, &bounds);
    if (rc)
        return rc;
    /* bounds hold for integers and numbers; for other types they mean
     * nothing; with no type, for a number among any value (not held) */
    for (int i = 0; i < 4; i++)
        if ((bounds >> i & 1) && !json_object_get(j, "type"))
            return refuse(c,
                          "\"%s\" at %s is supported with \"type\": \"integer\" or \"number\" "
                          "beside it",
                          BOUND_KW[i], path);
    /* a multiple: of integers only (a number's would need its decimals
     * held exactly as the validator's division rounds them) */
    if (json_object_get(j, "multipleOf") && !(t & T_INT))
        return refuse(c,
                      "\"multipleOf\" at %s is supported with \"type\": \"integer\" beside it "
                      "(not on numbers)",
                      path);
    if (!json_object_get(j, "type")) {
        static const char *const obj_kw[] = {"properties", "required", "additionalProperties"};
        static const char *const arr_kw[] = {"items", "minItems", "maxItems", "prefixItems"};
        for (int i = 0; i < 4; i++) {
            t |= i < 3 && json_object_get(j, obj_kw[i]) ? T_OBJ : 0;
            t |= json_object_get(j, arr_kw[i]) ? T_ARR : 0;
        }
        t |= json_object_get(j, "minLength") || json_object_get(j, "maxLength") ||
                     json_object_get(j, "pattern")
                 ? T_STR
                 : 0;
        if (!t) {
            *out = c->s->any;
            return 0;
        }
    }
    uint32_t min_items = 0, max_items = UINT32_MAX, min_len = 0, max_len = UINT32_MAX;
    uint16_t items = c->s->any, pre[MAX_PREFIX];
    uint32_t npre = 0;
    if (t & T_ARR) {
        json_t *it = json_object_get(j, "items"), *px = json_object_get(j, "prefixItems");
        if (json_is_array(it))
            return refuse(c, "\"items\" at %s as an array (a tuple) is not supported (prefixItems is)",
                          path);
        if (px && (!json_is_array(px) || !json_array_size(px) || json_array_size(px) > MAX_PREFIX))
            return refuse(c, "\"prefixItems\" at %s must be an array of 1 to %d schemas", path,
                          MAX_PREFIX);
        char p[512];
        /* each position's schema, then the items past them (items false:
         * none past them) */
        for (size_t i = 0; i < json_array_size(px); i++, npre++) {
            snprintf(p, sizeof p, "%s.prefixItems[%zu]", path, i);
            if ((rc = compile(c, json_array_get(px, i), p, 0, &pre[i])))
                return rc;
        }
        snprintf(p, sizeof p, "%s.items", path);
        if ((it && !json_is_false(it) && (rc = compile(c, it, p, 0, &items))) ||
            (rc = count_kw(c, j, "minItems", path, 0, &min_items)) ||
            (rc = count_kw(c, j, "maxItems", path, UINT32_MAX, &max_items)))
            return rc;
        if (json_is_false(it) && max_items > npre)
            max_items = npre;
        if (min_items > max_items)
            return refuse(c, "\"minItems\" at %s is greater than \"maxItems\"%s", path,
                          json_is_false(it) ? " (or the items \"items\": false leaves)" : "");
    }
    if (t & T_STR) {
        if ((rc = count_kw(c, j, "minLength", path, 0, &min_len)) ||
            (rc = count_kw(c, j, "maxLength", path, UINT32_MAX, &max_len)))
            return rc;
        if (min_len > max_len)
            return refuse(c, "\"minLength\" at %s is greater than \"maxLength\"", path);
    }
    uint32_t mult = 0;
    if ((t & T_INT) && (rc = mult_kw(c, j, path, &mult)))
        return rc;
    uint16_t re = 0;
    if ((t & T_STR) && (rc = compile_pattern(c, j, path, min_len, max_len, &re)))
        return rc;
    uint16_t id;
    if ((rc = new_node(c, path, F_LEAF, &id)) || (rc = self_leaf(c, id)))
        return rc;
    if (npre && add_mem(c, pre, npre))
        return nomem(c);
    js_node *nd = &c->s->node[id];
    nd->types = t;
    nd->items = items;
    nd->pre0 = c->s->nmem - npre;
    nd->npre = npre;
    nd->min_items = min_items;
    nd->max_items = max_items;
    nd->min_len = min_len;
    nd->max_len = max_len;
    nd->re = re;
    nd->mult = mult > 1 ? mult : 0;
    if (bounds && (t & T_INT) && (int_bounds(j, &nd->lo, &nd->hi) || nd->lo > nd->hi))
        return refuse(c, "the bounds at %s admit no 64-bit integer", path);
    if (!int_multiple_in(nd->lo, nd->hi, nd->mult))
        return refuse(c, "the bounds at %s admit no multiple of %u", path, nd->mult);
    if (bounds && (t & T_NUM)) {
        num_bounds(j, &nd->nlo, &nd->nhi);
        if (!num_any(nd))
            return refuse(c,
                          "the bounds at %s admit no number of at most %d significant digits and %d "
                          "decimals",
                          path, NUM_DIGITS, NUM_FRAC);
    }
    c->s->bounded |= nd->lo != INT64_MIN || nd->hi != INT64_MAX || nd->nlo.kind || nd->nhi.kind;
    if ((t & T_OBJ) && (rc = compile_object(c, j, path, id)))
        return rc;
    *out = id;
    return 0;
}

static int compile(cx *c, json_t *j, const char *path, int is_root, uint16_t *out)
{
    if (json_is_true(j)) {
        *out = c->s->any;
        return 0;
    }
    if (json_is_false(j))
        return refuse(c, "the schema false at %s admits no value", path);
    if (!json_is_object(j))
        return refuse(c, "the schema at %s must be an object or a boolean", path);
    if (c->depth >= 64)
        return refuse(c, "schemas nest deeper than 64 at %s", path);
    int rc = check_keywords(c, j, path, is_root);
    if (rc)
        return rc;
    /* $ref, anyOf, oneOf: alone among the constraining keywords */
    static const char *const sole[] = {"$ref", "anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 4; i++) {
        if (!json_object_get(j, sole[i]))
            continue;
        for (size_t h = 0; h < sizeof HANDLED / sizeof HANDLED[0]; h++)
            if (strcmp(HANDLED[h], sole[i]) && json_object_get(j, HANDLED[h]))
                return refuse(c, "\"%s\" at %s with \"%s\" beside it is not supported", sole[i],
                              path, HANDLED[h]);
    }
    c->depth++;
    if (json_object_get(j, "$ref"))
        rc = compile_ref(c, j, path, out);
    else if (json_object_get(j, "anyOf") || json_object_get(j, "oneOf") ||
             json_object_get(j, "allOf"))
        rc = compile_union(c, j, path, out);
    else if (json_object_get(j, "enum") || json_object_get(j, "const"))
        rc = compile_enum(c, j, path, out);
    else
        rc = compile_typed(c, j, path, out);
    c->depth--;
    return rc;
}

/* ---- compiling: what the nodes stand for ------------------------------ */

/* every union's leaves (members followed through unions; a cycle of
 * unions adds nothing) */
static int find_leaves(cx *c)
{
    sd_jschema *s = c->s;
    uint32_t nn = s->nnode;
    uint32_t *seen = calloc(nn, sizeof *seen);
    uint16_t *stack = malloc(nn * sizeof *stack), *got = malloc(nn * sizeof *got);
    int rc = seen && stack && got ? 0 : nomem(c);
    for (uint32_t u = 0; u < nn && !rc; u++) {
        if (s->node[u].flags & F_LEAF)
            continue;
        uint32_t sp = 0, ng = 0;
        stack[sp++] = (uint16_t)u;
        seen[u] = u + 1;
        while (sp) {
            const js_node *x = &s->node[stack[--sp]];
            for (uint32_t m = 0; m < x->nmem; m++) {
                uint16_t y = s->mem[x->mem0 + m];
                if (seen[y] == u + 1)
                    continue;
                seen[y] = u + 1;
                if (s->node[y].flags & F_LEAF)
                    got[ng++] = y;
                else
                    stack[sp++] = y;
            }
        }
        void *tmp_;
        if (GROW(s->leaf, s->nleaf, s->cleaf, ng)) {
            rc = nomem(c);
            break;
        }
        if (ng)
            memcpy(s->leaf + s->nleaf, got, ng * sizeof *got);
        s->node[u].leaf0 = s->nleaf;
        s->node[u].nleaf = ng;
        s->nleaf += ng;
    }
    free(seen);
    free(stack);
    free(got);
    return rc;
}

/* may enum text l be valid against leaf b (over-approximate) */
static int lit_may_match(const sd_jschema *s, const js_lit *l, const js_node *b)
{
    if (b->flags & F_ANY)
        return 1;
    if (b->flags & F_ENUM) {
        for (uint32_t i = 0; i < b->nlit; i++)
            if (!lit_cmp(s, l, &s->lit[b->lit0 + i]))
                return 1;
        return 0;
    }
    int t = lit_types(s, l);
    return (t & b->types) || (t == T_INT && (b->types & T_NUM));
}

static int nodes_disjoint(const sd_jschema *s, uint16_t x, uint16_t y, int depth);

/* no document is valid against both leaves (a sound under-approximation:
 * 0 where unsure) */
static int leaves_disjoint(const sd_jschema *s, uint16_t x, uint16_t y, int depth)
{
    const js_node *a = &s->node[x], *b = &s->node[y];
    if (depth > 8 || (a->flags & F_ANY) || (b->flags & F_ANY))
        return 0;
    if (b->flags & F_ENUM) {
        const js_node *t = a;
        a = b, b = t;
    }
    if (a->flags & F_ENUM) {
        for (uint32_t i = 0; i < a->nlit; i++)
            if (lit_may_match(s, &s->lit[a->lit0 + i], b))
                return 0;
        return 1;
    }
    int common = a->types & b->types;
    if ((common & (T_NULL | T_BOOL | T_STR | T_ARR)) ||
        ((a->types & (T_INT | T_NUM)) && (b->types & (T_INT | T_NUM))))
        return 0;
    if (!(common & T_OBJ))
        return 1;
    /* objects: a key one requires that the other forbids, or that both
     * would hold with schemas that exclude each other */
    for (int side = 0; side < 2; side++) {
        const js_node *p = side ? b : a, *q = side ? a : b;
        for (uint32_t i = 0; i < p->nprop; i++) {
            const js_prop *pp = &s->prop[p->prop0 + i];
            if (!pp->required)
                continue;
            const js_prop *qq = NULL;
            for (uint32_t k = 0; k < q->nprop && !qq; k++) {
                const js_prop *t = &s->prop[q->prop0 + k];
                if (t->len == pp->len && !memcmp(s->text + t->name, s->text + pp->name, pp->len))
                    qq = t;
            }
            if (!qq ? (q->flags & F_CLOSED) != 0 : nodes_disjoint(s, pp->node, qq->node, depth + 1))
                return 1;
        }
    }
    return 0;
}

static int nodes_disjoint(const sd_jschema *s, uint16_t x, uint16_t y, int depth)
{
    const js_node *a = &s->node[x], *b = &s->node[y];
    for (uint32_t i = 0; i < a->nleaf; i++)
        for (uint32_t k = 0; k < b->nleaf; k++)
            if (!leaves_disjoint(s, s->leaf[a->leaf0 + i], s->leaf[b->leaf0 + k], depth))
                return 0;
    return 1;
}

/* oneOf is read as anyOf: only where no document matches two branches */
static int check_oneofs(cx *c)
{
    const sd_jschema *s = c->s;
    for (uint32_t u = 0; u < s->nnode; u++) {
        const js_node *n = &s->node[u];
        if (!(n->flags & F_ONEOF))
            continue;
        for (uint32_t i = 0; i < n->nmem; i++)
            for (uint32_t k = i + 1; k < n->nmem; k++)
                if (!nodes_disjoint(s, s->mem[n->mem0 + i], s->mem[n->mem0 + k], 0))
                    return refuse(
                        c,
                        "\"oneOf\" at %s is not supported where two branches may both match "
                        "(branches %u and %u; only branches told apart by type, by enum/const "
                        "values or by a required key are); use anyOf",
                        c->path[u], i, k);
    }
    return 0;
}

/* a union's enum leaves become one (anyOf of consts is an enum): fewer
 * alternatives to follow */
static int merge_enums(cx *c)
{
    sd_jschema *s = c->s;
    uint32_t nn = s->nnode;
    for (uint32_t u = 0; u < nn; u++) {
        uint32_t ne = 0, nl = 0;
        for (uint32_t i = 0; i < s->node[u].nleaf; i++) {
            const js_node *l = &s->node[s->leaf[s->node[u].leaf0 + i]];
            if (l->flags & F_ENUM)
                ne++, nl += l->nlit;
        }
        if (ne < 2 || (s->node[u].flags & F_LEAF))
            continue;
        if (nl > SD_JSCHEMA_MAX_ENUM)
            return refuse(c, "the enum/const values of the anyOf at %s are more than %d",
                          c->path[u], SD_JSCHEMA_MAX_ENUM);
        void *tmp_;
        if (GROW(s->lit, s->nlit, s->clit, nl))
            return nomem(c);
        uint32_t lit0 = s->nlit, w = 0;
        int types = 0;
        js_node *n = &s->node[u];
        for (uint32_t i = 0; i < n->nleaf; i++) {
            const js_node *l = &s->node[s->leaf[n->leaf0 + i]];
            if (!(l->flags & F_ENUM)) {
                s->leaf[n->leaf0 + w++] = s->leaf[n->leaf0 + i];
                continue;
            }
            if (l->nlit)
                memcpy(s->lit + s->nlit, s->lit + l->lit0, l->nlit * sizeof *s->lit);
            s->nlit += l->nlit;
            types |= l->types;
        }
        uint16_t id;
        int rc = new_node(c, c->path[u], F_LEAF | F_ENUM, &id);
        if (!rc)
            rc = self_leaf(c, id);
        if (rc)
            return rc;
        n = &s->node[u];
        n->nleaf = w + 1;
        s->leaf[n->leaf0 + w] = id;
        set_enum(s, &s->node[id], types, lit0);
    }
    return 0;
}

static uint8_t plus1(uint8_t x) { return x >= INF - 1 ? INF : (uint8_t)(x + 1); }

/* least nesting of each node's values, to a fixpoint from "none" (what
 * admits no finite value stays INF) */
static void find_nesting(sd_jschema *s)
{
    for (uint32_t u = 0; u < s->nnode; u++)
        s->node[u].mind = s->node[u].mind_obj = s->node[u].mind_arr = INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t u = 0; u < s->nnode; u++) {
            js_node *n = &s->node[u];
            uint8_t m = INF;
            if (!(n->flags & F_LEAF)) {
                for (uint32_t i = 0; i < n->nleaf; i++)
                    if (s->node[s->leaf[n->leaf0 + i]].mind < m)
                        m = s->node[s->leaf[n->leaf0 + i]].mind;
            } else if (n->flags & F_ANY) {
                m = 0, n->mind_obj = n->mind_arr = 1;
            } else {
                if (n->types & T_OBJ) {
                    uint8_t r = 0;
                    for (uint32_t i = 0; i < n->nprop; i++) {
                        const js_prop *p = &s->prop[n->prop0 + i];
                        if (p->required && s->node[p->node].mind > r)
                            r = s->node[p->node].mind;
                    }
                    n->mind_obj = plus1(r);
                }
                if (n->types & T_ARR) { /* (the items it requires) */
                    uint8_t r = 0;
                    for (uint32_t i = 0; i < n->min_items && i <= n->npre; i++) {
                        const uint8_t mi = s->node[item_node(s, n, i)].mind;
                        r = mi > r ? mi : r;
                    }
                    n->mind_arr = plus1(r);
                }
                m = n->types & (T_NULL | T_BOOL | T_INT | T_NUM | T_STR) ? 0 : INF;
                m = n->mind_obj < m ? n->mind_obj : m;
                m = n->mind_arr < m ? n->mind_arr : m;
            }
            if (m != n->mind)
                n->mind = m, changed = 1;
        }
    }
}

/* ---- compiling: how many alternatives may be open at once --------------
 *
 * A set is the leaves a value of one kind may be alive as, given the
 * leaves its container is alive as and the key it is under; from the
 * root's sets, every reachable one, as the state would meet it (an
 * over-approximation: the live alternatives are a subset of these). */

typedef struct aset {
    uint8_t kind;
    uint32_t n, l0;  /* leaves, in sl */
    uint32_t c0, nc; /* child sets, in edge */
} aset;

typedef struct an {
    cx *c;
    aset *set;
    uint32_t nset, cset;
    uint16_t *sl;
    uint32_t nsl, csl;
    uint32_t *edge;
    uint32_t nedge, cedge;
    uint16_t *buf; /* a set being built */
    uint32_t nbuf;
} an;

static int leaf_kind_ok(const sd_jschema *s, uint16_t l, int k)
{
    const js_node *n = &s->node[l];
    if (n->flags & F_ANY)
        return 1;
    if (n->flags & F_ENUM) {
        for (uint32_t i = 0; i < n->nlit; i++)
            if (byte_kind((unsigned char)s->text[s->lit[n->lit0 + i].off]) == k)
                return 1;
        return 0;
    }
    switch (k) {
    case K_OBJ: return (n->types & T_OBJ) && n->mind_obj != INF;
    case K_ARR: return (n->types & T_ARR) && n->mind_arr != INF;
    case K_STR: return !!(n->types & T_STR);
    case K_NUM: return !!(n->types & (T_INT | T_NUM));
    case K_BOOL: return !!(n->types & T_BOOL);
    default: return !!(n->types & T_NULL);
    }
}

/* adds node x's leaves to buf (once each) */
static void buf_add(an *a, uint16_t x)
{
    const sd_jschema *s = a->c->s;
    const js_node *n = &s->node[x];
    for (uint32_t i = 0; i < n->nleaf; i++) {
        uint16_t l = s->leaf[n->leaf0 + i];
        uint32_t k = 0;
        while (k < a->nbuf && a->buf[k] != l)
            k++;
        if (k == a->nbuf)
            a->buf[a->nbuf++] = l;
    }
}

/* the sets buf makes, one per kind, as edges of the set being explored */
static int add_sets(an *a)
{
    cx *c = a->c;
    const sd_jschema *s = c->s;
    void *tmp_;
    for (int k = 0; k < K_COUNT; k++) {
        uint16_t pick[SD_JSCHEMA_MAX_ALT + 1];
        uint32_t n = 0, first = 0, second = 0, total = 0;
        for (uint32_t i = 0; i < a->nbuf; i++) {
            if (!leaf_kind_ok(s, a->buf[i], k))
                continue;
            if (total == 0)
                first = a->buf[i];
            else if (total == 1)
                second = a->buf[i];
            if (n <= SD_JSCHEMA_MAX_ALT)
                pick[n++] = a->buf[i];
            total++;
        }
        if (!n)
            continue;
        if (total > SD_JSCHEMA_MAX_ALT)
            return refuse(c,
                          "%u alternatives may be open at once as %s (at most %d): anyOf or type "
                          "unions whose branches begin alike, e.g. %s and %s",
                          total, KIND_NAME[k], SD_JSCHEMA_MAX_ALT, c->path[first], c->path[second]);
        /* sorted, to find it again */
        for (uint32_t i = 1; i < n; i++)
            for (uint32_t j = i; j > 0 && pick[j - 1] > pick[j]; j--) {
                uint16_t t = pick[j];
                pick[j] = pick[j - 1], pick[j - 1] = t;
            }
        uint32_t id = 0;
        for (; id < a->nset; id++)
            if (a->set[id].kind == k && a->set[id].n == n &&
                !memcmp(a->sl + a->set[id].l0, pick, n * sizeof *pick))
                break;
        if (id == a->nset) {
            if (a->nset >= 4 * SD_JSCHEMA_MAX_NODES)
                return refuse(c, "the schema is too complex (alternatives)");
            if (GROW(a->set, a->nset, a->cset, 1) || GROW(a->sl, a->nsl, a->csl, n))
                return nomem(c);
            a->set[a->nset++] = (aset){(uint8_t)k, n, a->nsl, 0, 0};
            memcpy(a->sl + a->nsl, pick, n * sizeof *pick);
            a->nsl += n;
        }
        if (GROW(a->edge, a->nedge, a->cedge, 1))
            return nomem(c);
        a->edge[a->nedge++] = id;
    }
    return 0;
}

/* adds the value schemas of the keys the objects mem[0 .. n) do not list
 * (theirs where they take any key) to buf */
static void buf_add_free(an *a, const uint16_t *mem, uint32_t n)
{
    const sd_jschema *s = a->c->s;
    for (uint32_t y = 0; y < n; y++)
        if (keys_free(&s->node[mem[y]]))
            buf_add(a, free_vals(s, &s->node[mem[y]]));
}

/* set i's children: per key (objects) or the items (arrays) */
static int explore(an *a, uint32_t i)
{
    const sd_jschema *s = a->c->s;
    aset st = a->set[i];
    const uint16_t *m = a->sl + st.l0; /* (copied below: sl may move) */
    uint16_t mem[SD_JSCHEMA_MAX_ALT];
    memcpy(mem, m, st.n * sizeof *mem);
    int any = 0, rc = 0; /* (objects: a member takes keys it does not list) */
    for (uint32_t x = 0; x < st.n; x++)
        any |= st.kind == K_OBJ ? keys_free(&s->node[mem[x]]) : (s->node[mem[x]].flags & F_ANY) != 0;
    a->set[i].c0 = a->nedge;
    if (st.kind == K_ARR) {
        a->nbuf = 0;
        for (uint32_t x = 0; x < st.n; x++) { /* (every position's: an over-approximation) */
            const js_node *n = &s->node[mem[x]];
            buf_add(a, (n->flags & F_ANY) ? s->any : n->items);
            for (uint32_t q = 0; !(n->flags & F_ANY) && q < n->npre; q++)
                buf_add(a, s->mem[n->pre0 + q]);
        }
        rc = add_sets(a);
    } else if (st.kind == K_OBJ) {
        for (uint32_t x = 0; x < st.n && !rc; x++) {
            const js_node *n = &s->node[mem[x]];
            for (uint32_t p = 0; p < n->nprop && !rc; p++) {
                const js_prop *pp = &s->prop[n->prop0 + p];
                int dup = 0;
                a->nbuf = 0;
                if (any)
                    buf_add_free(a, mem, st.n);
                for (uint32_t y = 0; y < st.n && !dup; y++) {
                    const js_node *o = &s->node[mem[y]];
                    for (uint32_t q = 0; q < o->nprop; q++) {
                        const js_prop *qq = &s->prop[o->prop0 + q];
                        if (qq->len != pp->len ||
                            memcmp(s->text + qq->name, s->text + pp->name, pp->len))
                            continue;
                        if (y < x)
                            dup = 1; /* (explored with member y) */
                        else
                            buf_add(a, qq->node);
                        break;
                    }
                }
                if (!dup)
                    rc = add_sets(a);
            }
        }
        if (any && !rc) { /* a key none lists */
            a->nbuf = 0;
            buf_add_free(a, mem, st.n);
            rc = add_sets(a);
        }
    }
    a->set[i].nc = a->nedge - a->set[i].c0;
    return rc;
}

/* the nesting limit: the most containers D for which any chain of open
 * values (D containers and a scalar) fits the pool */
static int find_depth(cx *c, uint16_t root, int *depth)
{
    sd_jschema *s = c->s;
    an a = {.c = c};
    a.buf = malloc(s->nnode * sizeof *a.buf);
    int rc = a.buf ? 0 : nomem(c);
    *depth = 0;
    if (!rc) {
        a.nbuf = 0;
        buf_add(&a, root);
        rc = add_sets(&a);
    }
    uint32_t nroot = a.nset;
    for (uint32_t i = 0; i < a.nset && !rc; i++)
        rc = explore(&a, i);
    int *h = NULL, *prev = NULL;
    if (!rc) {
        h = malloc((a.nset + 1) * sizeof *h);
        prev = malloc((a.nset + 1) * sizeof *prev);
        if (!h || !prev)
            rc = nomem(c);
    }
    if (!rc) {
        for (uint32_t i = 0; i < a.nset; i++) /* no container at depth 0 */
            prev[i] = a.set[i].kind <= K_ARR ? -1 : (int)a.set[i].n;
        for (int d = 1; d <= SD_JSCHEMA_MAX_DEPTH; d++) {
            int worst = 0;
            for (uint32_t i = 0; i < a.nset; i++) {
                const aset *x = &a.set[i];
                int best = 0;
                for (uint32_t e = 0; x->kind <= K_ARR && e < x->nc; e++) {
                    uint32_t y = a.edge[x->c0 + e];
                    int v = a.set[y].kind <= K_ARR ? prev[y] : (int)a.set[y].n;
                    best = v > best ? v : best;
                }
                h[i] = (int)x->n + best;
            }
            for (uint32_t i = 0; i < nroot; i++)
                worst = h[i] > worst ? h[i] : worst;
            if (worst > SD_JSCHEMA_POOL)
                break;
            *depth = d;
            int *t = prev;
            prev = h, h = t;
        }
    }
    free(h);
    free(prev);
    free(a.set);
    free(a.sl);
    free(a.edge);
    free(a.buf);
    return rc;
}

/* ---- compiling: tool calls (x-specd-calls) ---------------------------- */

/* o's literal k (lo to hi bytes, no NUL) into the text */
static int lit_text(cx *c, json_t *o, const char *k, const char *path, size_t lo, size_t hi,
                    uint32_t *off, uint16_t *len)
{
    json_t *v = json_object_get(o, k);
    const size_t n = json_string_length(v);
    if (!json_is_string(v) || n < lo || n > hi || memchr(json_string_value(v), 0, n))
        return refuse(c, "\"%s\" at %s must be a string of %zu to %zu bytes, no NUL", k, path, lo, hi);
    *len = (uint16_t)n;
    return add_text(c, json_string_value(v), n, off);
}

static int call_text(cx *c, json_t *o, const char *k, const char *path, uint32_t *off, uint16_t *len)
{
    return lit_text(c, o, k, path, 0, SD_JSCHEMA_MAX_TEXT, off, len);
}

static void defs_clear(cx *c)
{
    for (uint32_t i = 0; i < c->ndefs; i++)
        free(c->defs[i].name);
    c->ndefs = 0;
}

/* the shorter length, and where a and b first differ (that length where
 * one is a prefix of the other) */
static uint32_t first_diff(const char *a, uint32_t na, const char *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* the tools, each parameters schema a root of its own, and the literals;
 * *body: a union of the tools' roots */
static int compile_calls(cx *c, json_t *spec, uint16_t *body)
{
    sd_jschema *s = c->s;
    if (!json_is_object(spec))
        return refuse(c, "x-specd-calls must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(spec, k, v)
    {
        static const char *const KEYS[] = {"begin", "sep", "end", "max", "tools", "specials"};
        if (!IN_LIST(k, KEYS))
            return refuse(c, "x-specd-calls: \"%s\" is not a key of it", k);
    }
    int rc = call_text(c, spec, "begin", "$", &s->lead[0], &s->nlead[0]);
    if (!rc)
        rc = call_text(c, spec, "sep", "$", &s->lead[1], &s->nlead[1]);
    if (!rc)
        rc = call_text(c, spec, "end", "$", &s->end, &s->nend);
    if (rc)
        return rc;
    json_t *mx = json_object_get(spec, "max"), *tools = json_object_get(spec, "tools"),
           *sp = json_object_get(spec, "specials");
    if (!json_is_integer(mx) || json_integer_value(mx) < 1 || json_integer_value(mx) > MAX_CALLS)
        return refuse(c, "x-specd-calls: \"max\" must be an integer from 1 to %d", MAX_CALLS);
    if (sp && !json_is_boolean(sp))
        return refuse(c, "x-specd-calls: \"specials\" must be a boolean");
    const size_t nt = json_array_size(tools);
    if (!json_is_array(tools) || nt < 1 || nt > MAX_CALL_TOOLS)
        return refuse(c, "x-specd-calls: \"tools\" must be an array of 1 to %d tools",
                      MAX_CALL_TOOLS);
    s->max_calls = (uint8_t)json_integer_value(mx);
    s->specials |= json_is_true(sp);
    if (!(s->call = calloc(nt, sizeof *s->call)))
        return nomem(c);
    json_t *outer = c->root;
    for (size_t i = 0; i < nt; i++) {
        json_t *t = json_array_get(tools, i), *pa = json_object_get(t, "parameters");
        char path[64];
        snprintf(path, sizeof path, "$.tools[%zu]", i);
        js_call *kc = &s->call[i];
        if (!json_is_object(t) || json_object_size(t) != 3 || !pa)
            return refuse(c, "x-specd-calls: %s must be {\"prefix\", \"parameters\", \"suffix\"}",
                          path);
        if ((rc = call_text(c, t, "prefix", path, &kc->pre, &kc->npre)) ||
            (rc = call_text(c, t, "suffix", path, &kc->suf, &kc->nsuf)))
            return rc;
        /* the digits' byte: one at most, not last, no digit after it */
        const char *pr = s->text + kc->pre, *ph = memchr(pr, PH_BYTE, kc->npre);
        kc->ph = ph ? (uint16_t)(ph - pr) : NO_PH;
        if (ph && (memchr(ph + 1, PH_BYTE, kc->npre - kc->ph - 1) || kc->ph + 1 == kc->npre ||
                   (ph[1] >= '0' && ph[1] <= '9')))
            return refuse(c, "x-specd-calls: %s.prefix: one digits byte at most, a non-digit after it",
                          path);
        /* a root of its own: its "#" and $defs */
        uint16_t b;
        char pp[80];
        snprintf(pp, sizeof pp, "%s.parameters", path);
        defs_clear(c);
        c->root = pa;
        void *tmp_;
        if ((rc = new_node(c, pp, 0, &kc->root)))
            return rc;
        c->root_node = kc->root;
        if ((rc = compile(c, pa, pp, 1, &b)))
            return rc;
        if (GROW(s->mem, s->nmem, s->cmem, 1))
            return nomem(c);
        s->node[kc->root].mem0 = s->nmem;
        s->node[kc->root].nmem = 1;
        s->mem[s->nmem++] = b;
        s->ncall++;
    }
    defs_clear(c);
    c->root = outer;
    /* by prefix (insertion: 128 at most), then: no prefix another's, the
     * tools told apart before any digits */
    for (uint32_t i = 1; i < s->ncall; i++) {
        js_call x = s->call[i];
        uint32_t j = i;
        for (; j > 0; j--) {
            const js_call *y = &s->call[j - 1];
            const uint32_t d = first_diff(s->text + y->pre, y->npre, s->text + x.pre, x.npre);
            const int less = d == x.npre ? x.npre < y->npre
                                         : d < y->npre && (unsigned char)s->text[x.pre + d] <
                                                              (unsigned char)s->text[y->pre + d];
            if (!less)
                break;
            s->call[j] = *y;
        }
        s->call[j] = x;
    }
    for (uint32_t i = 0; i + 1 < s->ncall; i++) {
        const js_call *x = &s->call[i], *y = &s->call[i + 1];
        const uint32_t d = first_diff(s->text + x->pre, x->npre, s->text + y->pre, y->npre);
        if (d == x->npre || d >= x->ph || d >= y->ph)
            return refuse(c,
                          "x-specd-calls: the prefixes \"%.*s\" and \"%.*s\" do not tell their tools "
                          "apart",
                          (int)x->npre, s->text + x->pre, (int)y->npre, s->text + y->pre);
    }
    /* the end is not a call's lead and prefix or longer */
    for (uint32_t i = 0; i < s->ncall; i++) {
        const js_call *x = &s->call[i];
        const uint32_t ns = s->nlead[1];
        const char *e = s->text + s->end;
        if (s->nend >= ns + x->npre && !memcmp(e, s->text + s->lead[1], ns) &&
            first_diff(e + ns, s->nend - ns, s->text + x->pre, x->npre) == x->npre)
            return refuse(c, "x-specd-calls: the end begins with a call");
    }
    /* the union of the tools (the root's body: every node reachable) */
    if ((rc = new_node(c, "$.tools", 0, body)))
        return rc;
    void *tmp_;
    if (GROW(s->mem, s->nmem, s->cmem, s->ncall))
        return nomem(c);
    s->node[*body].mem0 = s->nmem;
    s->node[*body].nmem = s->ncall;
    for (uint32_t i = 0; i < s->ncall; i++)
        s->mem[s->nmem++] = s->call[i].root;
    return 0;
}

/* {"x-specd-after": A, "x-specd-then": S, "x-specd-open"?: O,
 * "specials"?}: A's and O's text, A's failure table; *then: S (where
 * "$defs" resolve) */
static int compile_after(cx *c, json_t *root, json_t **then)
{
    sd_jschema *s = c->s;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        static const char *const KEYS[] = {"x-specd-after", "x-specd-then", "x-specd-open", "specials"};
        if (!IN_LIST(k, KEYS))
            return refuse(c, "x-specd-after: \"%s\" is not a key beside it", k);
    }
    json_t *sp = json_object_get(root, "specials");
    *then = json_object_get(root, "x-specd-then");
    if (!*then || (sp && !json_is_boolean(sp)))
        return refuse(c, "x-specd-after: \"x-specd-then\" (a schema) and a boolean \"specials\"");
    s->specials = json_is_true(sp);
    c->root = *then;
    int rc = lit_text(c, root, "x-specd-after", "$", 1, MAX_AFTER, &s->after, &s->nafter);
    if (!rc && json_object_get(root, "x-specd-open"))
        rc = lit_text(c, root, "x-specd-open", "$", 1, MAX_AFTER, &s->open, &s->nopen);
    if (rc)
        return rc;
    /* fail[i]: the longest proper border of the first i + 1 bytes */
    const char *a = s->text + s->after;
    s->after_fail[0] = 0;
    for (size_t i = 1, j = 0; i < s->nafter; i++) {
        while (j > 0 && a[i] != a[j])
            j = s->after_fail[j - 1];
        if (a[i] == a[j])
            j++;
        s->after_fail[i] = (uint8_t)j;
    }
    return 0;
}

/* after the leaves and nesting: each tool's documents are objects, and
 * the nesting limit is the least of the tools' */
static int check_calls(cx *c)
{
    sd_jschema *s = c->s;
    s->max_depth = SD_JSCHEMA_MAX_DEPTH;
    for (uint32_t i = 0; i < s->ncall; i++) {
        const js_node *r = &s->node[s->call[i].root];
        for (uint32_t j = 0; j < r->nleaf; j++) {
            const js_node *l = &s->node[s->leaf[r->leaf0 + j]];
            if ((l->flags & (F_ANY | F_ENUM)) || l->types != T_OBJ)
                return refuse(c, "x-specd-calls: %s must be an object schema",
                              c->path[s->call[i].root]);
        }
        if (r->mind == INF)
            return refuse(c, "x-specd-calls: %s admits no finite document", c->path[s->call[i].root]);
        int d;
        int rc = find_depth(c, s->call[i].root, &d);
        if (rc)
            return rc;
        if (r->mind > d)
            return refuse(c, "x-specd-calls: %s: documents nest deeper than %d containers",
                          c->path[s->call[i].root], d);
        s->max_depth = d < s->max_depth ? d : s->max_depth;
    }
    return 0;
}

static void cx_free(cx *c)
{
    for (uint32_t i = 0; i < c->ndefs; i++)
        free(c->defs[i].name);
    free(c->defs);
    for (uint32_t i = 0; c->path && i < c->s->nnode; i++)
        free(c->path[i]);
    free(c->path);
}

int sd_jschema_compile(const char *schema_json, size_t len, sd_jschema **out, sd_err *err)
{
    *out = NULL;
    if (len > SD_JSCHEMA_MAX_SCHEMA)
        return sd_err_set(err, SD_EINVAL, "json_schema: the schema is longer than %d bytes",
                          SD_JSCHEMA_MAX_SCHEMA);
    json_error_t je;
    json_t *root = json_loadb(schema_json ? schema_json : "", schema_json ? len : 0,
                              JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root)
        return sd_err_set(err, SD_EINVAL, "json_schema: not JSON: %s at byte %d", je.text,
                          je.position);
    sd_jschema *s = calloc(1, sizeof *s);
    static _Atomic uint64_t serials;
    if (s)
        s->serial = atomic_fetch_add(&serials, 1) + 1;
    cx c = {.s = s, .root = root, .err = err, .re_work = SD_JRE_MAX_WORK};
    /* x-specd-after: the text before the reply, then its schema */
    json_t *then = root;
    int rc = s ? 0 : sd_err_set(err, SD_ENOMEM, "json_schema: out of memory");
    if (!rc && json_is_object(root) && json_object_get(root, "x-specd-after"))
        rc = compile_after(&c, root, &then);
    json_t *calls = json_is_object(then) && json_object_size(then) == 1
                        ? json_object_get(then, "x-specd-calls")
                        : NULL;
    uint16_t body;
    /* node 0: the root, a union of its body ("#" recurses to it); node 1: any value */
    if (!rc)
        rc = new_node(&c, "$", 0, &s->root);
    c.root_node = s ? s->root : 0;
    if (!rc)
        rc = new_node(&c, "(any value)", F_LEAF | F_ANY, &s->any);
    if (!rc) {
        s->node[s->any].types = T_ALL;
        s->node[s->any].items = s->any;
        rc = self_leaf(&c, s->any);
    }
    if (!rc && calls)
        rc = compile_calls(&c, calls, &body);
    else if (!rc)
        rc = compile(&c, then, "$", 1, &body);
    void *tmp_;
    if (!rc && GROW(s->mem, s->nmem, s->cmem, 1))
        rc = nomem(&c);
    if (!rc) {
        s->node[s->root].mem0 = s->nmem;
        s->node[s->root].nmem = 1;
        s->mem[s->nmem++] = body;
        rc = find_leaves(&c);
    }
    if (!rc)
        rc = check_oneofs(&c);
    if (!rc)
        rc = merge_enums(&c);
    if (!rc)
        find_nesting(s);
    if (!rc && calls)
        rc = check_calls(&c);
    else if (!rc && s->node[s->root].mind == INF)
        rc = refuse(&c, "the schema admits no finite document (a required key or item recurses "
                        "without end)");
    else if (!rc)
        rc = find_depth(&c, s->root, &s->max_depth);
    if (!rc && !calls && s->node[s->root].mind > s->max_depth)
        rc = refuse(&c, "the schema's documents nest deeper than %d containers", s->max_depth);
    if (s)
        cx_free(&c);
    json_decref(root);
    if (rc) {
        sd_jschema_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sd_jschema_free(sd_jschema *s)
{
    if (!s)
        return;
    free(s->node);
    free(s->prop);
    free(s->lit);
    free(s->mem);
    free(s->leaf);
    free(s->text);
    free(s->call);
    for (uint32_t i = 0; i < s->nre; i++)
        sd__jre_free(&s->re[i]);
    free(s->re);
    free(s);
}

uint64_t sd_jschema_serial(const sd_jschema *s) { return s->serial; }

int sd_jschema_max_depth(const sd_jschema *s) { return s->max_depth; }

/* ---- the automaton -----------------------------------------------------
 *
 * The syntax is json_mask's (mode, sub, ws), with a value's schema
 * alternatives kept per open value. A value begins: the alternatives of
 * its container (each: the schema of the key it is under, or of its
 * items) give the leaves that may begin with its first byte, each knowing
 * which of the container's alternatives it came from. A byte within the
 * value drops those it does not fit; when the value ends, the container
 * keeps the alternatives some finished one came from. The text is a valid
 * prefix while the innermost value has one: its container's are alive
 * (they die only when it ends), and every alternative is one that a
 * document (within the nesting limit) completes. */

enum {
    M_START,        /* the top-level value */
    M_VALUE,        /* after ':' or ',' in an array */
    M_VALUE_OR_END, /* after '[' */
    M_KEY_OR_END,   /* after '{' */
    M_KEY,          /* after ',' in an object */
    M_IN_KEY,       /* in a key (sub as in a string) */
    M_COLON,        /* after a key */
    M_AFTER,        /* ',' or the container's closer */
    M_STR,          /* in a string value (sub: 0, 1 after '\', 2..5 at \u's digits; bit 3: its
                     * first digit is d; bits 4-5: its second is 8-b (1) or c-f (2)) */
    M_NUM,          /* in a number (sub: N_*) */
    M_LIT,          /* in true / false / null (sub: literal << 4 | bytes matched) */
    M_DONE,
};
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
static const char *const LITERALS[3] = {"true", "false", "null"};

#define NODE_MASK 0x0fff
#define PENDING_HIGH 0x8000
#define LEV_OBJ 0x80

static const js_node *alt_node(const sd_jschema *s, const sd_jschema_alt *a)
{
    return &s->node[a->node & NODE_MASK];
}

static int top_start(const sd_jschema_state *st) { return st->lev[st->nlev - 1] & 0x7f; }
static int top_is_obj(const sd_jschema_state *st) { return (st->lev[st->nlev - 1] & LEV_OBJ) != 0; }
static uint32_t count_of(const sd_jschema_alt *a) { return (uint32_t)a->a | (uint32_t)a->b << 16; }
static void set_count(sd_jschema_alt *a, uint32_t n)
{
    a->a = (uint16_t)n;
    a->b = (uint16_t)(n >> 16);
}

static int bad(sd_jschema_state *st)
{
    st->bad = 1;
    return -1;
}

/* the innermost value keeps alternatives [start, w) */
static int settle(sd_jschema_state *st, int start, int w)
{
    st->nalt = (uint8_t)w;
    return w == start ? bad(st) : 0;
}

/* tool calls' phases (cph) */
enum { C_NONE, C_LEAD, C_DIG, C_DOC, C_SUF, C_DONE };

void sd_jschema_init(const sd_jschema *s, sd_jschema_state *st)
{
    memset(st, 0, sizeof *st);
    st->mode = M_START;
    st->pre = !s->nafter ? 0 : s->nopen ? 2 : 1;
    if (s->ncall) {
        st->cph = C_LEAD;
        st->chi = (uint16_t)s->ncall;
    }
}

int sd_jschema_calls(const sd_jschema *s) { return s->ncall > 0; }

int sd_jschema_takes_specials(const sd_jschema *s) { return s->specials; }

int sd_jschema_in_literal(const sd_jschema_state *st)
{
    return st->pre || st->cph == C_LEAD || st->cph == C_SUF;
}

void sd_jschema_copy(sd_jschema_state *dst, const sd_jschema_state *src)
{
    memcpy(dst, src, offsetof(sd_jschema_state, alt) + src->nalt * sizeof src->alt[0]);
}

int sd_jschema_equal(const sd_jschema_state *a, const sd_jschema_state *b)
{
    return a->nalt == b->nalt &&
           !memcmp(a, b, offsetof(sd_jschema_state, alt) + a->nalt * sizeof a->alt[0]);
}

/* may a value of node p's schema still begin, nesting-wise, in the
 * innermost (container) value */
static int fits(const sd_jschema *s, const sd_jschema_state *st, uint16_t node)
{
    return st->nlev + s->node[node].mind <= s->max_depth;
}

/* the first key an object may go on with from key next (-1: none): up to
 * the first required one, and one whose value fits */
static int first_key(const sd_jschema *s, const sd_jschema_state *st, const js_node *n,
                     uint32_t next)
{
    if (next >= n->nprop)
        return -1;
    const js_prop *p = &s->prop[n->prop0];
    for (uint32_t j = next; j <= p[next].lim; j++)
        if (fits(s, st, p[j].node))
            return (int)j;
    return -1;
}

/* a key's byte c (closed: its closing quote) against the candidate a->a
 * matched for a->b bytes: the first later candidate that matches one more
 * (all candidates from a->a to its lim share its first a->b bytes, or
 * were passed) */
static int key_step(const sd_jschema *s, const sd_jschema_state *st, const js_node *n,
                    sd_jschema_alt *a, unsigned char c, int closed)
{
    const js_prop *p = &s->prop[n->prop0];
    const char *cand = s->text + p[a->a].name;
    uint16_t off = a->b;
    for (uint32_t j = a->a; j <= p[a->a].lim; j++) {
        const char *nm = s->text + p[j].name;
        if (closed ? p[j].len != off : p[j].len <= off || (unsigned char)nm[off] != c)
            continue;
        if (memcmp(nm, cand, off) || !fits(s, st, p[j].node))
            continue;
        a->a = (uint16_t)j;
        a->b = (uint16_t)(off + 1);
        return 1;
    }
    return 0;
}

/* an enum's byte c: the first value (sorted) with the bytes so far and c */
static int lit_step(const sd_jschema *s, const js_node *n, sd_jschema_alt *a, unsigned char c)
{
    const js_lit *l = &s->lit[n->lit0];
    uint16_t off = a->b;
    const char *t0 = s->text + l[a->a].off;
    for (uint32_t j = a->a; j < n->nlit; j++) {
        const char *t = s->text + l[j].off;
        if (l[j].len < off || memcmp(t, t0, off))
            break; /* past the values with this prefix */
        if (l[j].len > off && (unsigned char)t[off] == c) {
            a->a = (uint16_t)j;
            a->b = (uint16_t)(off + 1);
            return 1;
        }
    }
    return 0;
}

/* one byte of a string (key or value): 0, 1 on its closing quote, -1 bad */
static int str_syntax(sd_jschema_state *st, unsigned char c)
{
    uint8_t sub = st->sub;
    int h;
    switch (sub & 7) {
    case 0:
        if (c < 0x20)
            return -1;
        if (c == '\\')
            st->sub = 1;
        return c == '"';
    case 1:
        if (c == 'u')
            st->sub = 2;
        else if (c && strchr("\"\\/bfnrt", c))
            st->sub = 0;
        else
            return -1;
        return 0;
    default:
        if ((h = hexval(c)) < 0)
            return -1;
        switch (sub & 7) {
        case 2: st->sub = (uint8_t)(3 | (h == 0xd ? 8 : 0)); break;
        case 3: st->sub = (uint8_t)(4 | (sub & 8) | (h >= 0xc ? 0x20 : h >= 8 ? 0x10 : 0)); break;
        case 4: st->sub = (uint8_t)(5 | (sub & 0x38)); break;
        default: st->sub = 0; break;
        }
        return 0;
    }
}

/* a string's length in code points against maxLength, at byte c (sub: the
 * syntax before it). A \u high surrogate counts, the low one after it
 * does not; at maxLength, only the low half of a pending pair may come. */
static int str_count(const js_node *n, sd_jschema_alt *a, uint8_t sub, unsigned char c)
{
    uint32_t k = count_of(a);
    int pend = (a->node & PENDING_HIGH) != 0, full = k >= n->max_len;
    switch (sub & 7) {
    case 0:
        if (c == '"' || (c & 0xc0) == 0x80) /* the end, or within a character */
            return 1;
        if (c == '\\')
            return !full || pend;
        pend = 0, k++;
        break;
    case 1:
        if (c == 'u')
            return 1;
        pend = 0, k++;
        break;
    case 2: return !full || hexval(c) == 0xd;
    case 3: return !full || hexval(c) >= 0xc;
    case 4: return 1;
    default: { /* \u's last digit */
        int high = (sub & 8) && (sub & 0x30) == 0x10, low = (sub & 8) && (sub & 0x30) == 0x20;
        if (pend && low)
            pend = 0;
        else
            k++, pend = high;
        break;
    }
    }
    if (k > n->max_len)
        return 0;
    set_count(a, k);
    a->node = (uint16_t)((a->node & NODE_MASK) | (pend ? PENDING_HIGH : 0));
    return 1;
}

/* ---- strings' patterns -------------------------------------------------
 * A string of a schema with a pattern is decoded as it is read: each
 * character (a byte, an escape, a UTF-8 sequence, a \u escape; a \u
 * surrogate pair is one, at its high half) steps each patterned
 * alternative's automaton (alt b) and its count of code points (alt a,
 * where the lengths are bounded). A byte within a character goes bad for
 * an alternative where no character it may still be takes the automaton
 * to a state from which a string of the lengths left ends accepted. UTF-8
 * is checked there (a patterned string is text a validator decodes). */

#define SDEC_LEFT 0x03   /* UTF-8 continuation bytes still to come */
#define SDEC_LEN 0x0c    /* the sequence's bytes less one, << 2 */
#define SDEC_PEND 0x10   /* a \u high surrogate just read: its low half may follow */
#define SDEC_BROKEN 0x20 /* not UTF-8: no pattern takes the string */

enum { EV_NONE, EV_SYM, EV_PART, EV_BAD };

/* what a byte of a string does to its characters: nothing (the closing
 * quote, a pair's low half), a character whole (sym), part of one (m: the
 * symbols it may still be; nostep: or a pair's low half), not UTF-8 */
typedef struct chr_ev {
    uint8_t kind, nostep;
    uint16_t sym;
    uint64_t m[3];
} chr_ev;

static const uint32_t UTF8_MIN[4] = {0, 0x80, 0x800, 0x10000};
static const uint32_t UTF8_MAX[4] = {0x7f, 0x7ff, 0xffff, 0x10ffff};

static int is_high(uint32_t u) { return u >= 0xd800 && u <= 0xdbff; }
static int is_low(uint32_t u) { return u >= 0xdc00 && u <= 0xdfff; }

/* the symbols a character may be where its code point is in [lo, hi]:
 * UTF-8 (no surrogates), or a \u escape's unit (pend: a low half ends a
 * pair instead) */
static void unit_syms(uint32_t lo, uint32_t hi, int utf8, int pend, chr_ev *e)
{
    sd__jre_range(lo, hi, e->m);
    if (utf8)
        return;
    const int high = lo <= 0xdbff && hi >= 0xd800, low = lo <= 0xdfff && hi >= 0xdc00;
    if (high || (low && !pend)) /* (a lone low half is a code point of its own) */
        e->m[2] |= (uint64_t)1 << (SD_JRE_OTHER - 128);
    e->nostep = (uint8_t)(low && pend);
}

static void all_syms(chr_ev *e, int nostep)
{
    e->kind = EV_PART;
    e->m[0] = e->m[1] = UINT64_MAX;
    e->m[2] = ((uint64_t)1 << (SD_JRE_NSYM - 128)) - 1;
    e->nostep = (uint8_t)nostep;
}

/* part of a UTF-8 sequence of len + 1 bytes read, its bits so far v with
 * `left` continuation bytes to come: the symbols it may still be; 0 where
 * none (no code point of the sequence's length begins so) */
static int utf8_part(uint32_t v, int left, int len, chr_ev *e)
{
    const uint32_t lo = v << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    e->kind = EV_PART;
    unit_syms(lo > UTF8_MIN[len] ? lo : UTF8_MIN[len], hi < UTF8_MAX[len] ? hi : UTF8_MAX[len], 1,
              0, e);
    return (e->m[0] | e->m[1] | e->m[2]) != 0;
}

/* byte c of a string (sub: the syntax before it; valid JSON) */
static void str_decode(sd_jschema_state *st, uint8_t sub, unsigned char c, chr_ev *e)
{
    const uint8_t d = st->sdec;
    const int pend = (d & SDEC_PEND) != 0;
    memset(e, 0, sizeof *e);
    if (d & SDEC_BROKEN) {
        e->kind = EV_BAD;
        return;
    }
    switch (sub & 7) {
    case 0: {
        if (d & SDEC_LEFT) { /* a continuation byte */
            const int len = (d & SDEC_LEN) >> 2, left = (d & SDEC_LEFT) - 1;
            if ((c & 0xc0) != 0x80)
                break;
            const uint32_t v = st->scp << 6 | (c & 0x3f);
            if (!left) {
                if (v < UTF8_MIN[len] || v > UTF8_MAX[len] || (v >= 0xd800 && v <= 0xdfff))
                    break;
                st->scp = 0, st->sdec = 0;
                e->kind = EV_SYM, e->sym = (uint16_t)sd__jre_sym(v);
                return;
            }
            st->scp = v;
            st->sdec = (uint8_t)((d & ~SDEC_LEFT) | left);
            if (!utf8_part(v, left, len, e))
                break;
            return;
        }
        if (c == '"') {
            e->kind = EV_NONE;
            return;
        }
        if (c == '\\') { /* any character (\u), or a pair's low half */
            all_syms(e, pend);
            return;
        }
        st->sdec = 0;
        if (c < 0x80) {
            e->kind = EV_SYM, e->sym = c;
            return;
        }
        /* a lead byte: 2 to 4 bytes, their code points' range */
        const int len = c >= 0xf8 ? -1 : c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
        if (len < 0)
            break;
        st->scp = c & (0x3fu >> len);
        st->sdec = (uint8_t)(len << 2 | len);
        if (!utf8_part(st->scp, len, len, e))
            break;
        return;
    }
    case 1: {
        static const char ESC[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
        if (c == 'u') {
            st->scp = 0;
            all_syms(e, pend);
            return;
        }
        st->sdec = 0;
        e->kind = EV_SYM;
        for (int i = 0; ESC[i]; i += 2)
            if ((unsigned char)ESC[i] == c)
                e->sym = (unsigned char)ESC[i + 1];
        return;
    }
    case 2:
    case 3:
    case 4: { /* \u's first three digits: the unit's range */
        const int left = 4 - ((sub & 7) - 1);
        st->scp = st->scp << 4 | (uint32_t)hexval(c);
        const uint32_t lo = st->scp << (4 * left), hi = lo | ((1u << (4 * left)) - 1);
        e->kind = EV_PART;
        unit_syms(lo, hi, 0, pend, e);
        return;
    }
    default: { /* its last */
        const uint32_t u = st->scp << 4 | (uint32_t)hexval(c);
        st->scp = 0;
        st->sdec = is_high(u) && !(pend && is_low(u)) ? SDEC_PEND : 0;
        if (pend && is_low(u)) {
            e->kind = EV_NONE;
            return;
        }
        e->kind = EV_SYM, e->sym = (uint16_t)sd__jre_sym(u);
        return;
    }
    }
    st->sdec = SDEC_BROKEN, st->scp = 0;
    e->kind = EV_BAD;
}

/* may a patterned string whose automaton is at q after k code points
 * still end accepted within its lengths */
static int pat_viable(const sd__jre *re, const js_node *n, uint16_t q, uint32_t k)
{
    if (k > n->max_len)
        return 0;
    if (!re->len) /* (no lengths: every live state is) */
        return 1;
    const uint64_t lo = k < n->min_len ? n->min_len - k : 0;
    const uint64_t hi = n->max_len == UINT32_MAX ? UINT64_MAX - 1 : (uint64_t)(n->max_len - k);
    return sd__jre_next_len(re, q, lo) <= hi;
}

/* the count after one more code point: none where the lengths are
 * unbounded, at most minLength where only it bounds them (states that
 * differ past it take the same bytes) */
static uint32_t pat_count(const js_node *n, uint32_t k)
{
    if (!n->min_len && n->max_len == UINT32_MAX)
        return 0;
    k++;
    return n->max_len == UINT32_MAX && k > n->min_len ? n->min_len : k;
}

static int pat_step(const sd_jschema *s, const js_node *n, sd_jschema_alt *a, const chr_ev *e)
{
    const sd__jre *re = &s->re[n->re - 1];
    const uint32_t k = pat_count(n, a->a);
    switch (e->kind) {
    case EV_NONE: return 1;
    case EV_BAD: return 0;
    case EV_SYM: {
        const uint16_t q = re->next[(size_t)a->b * re->nclass + re->cls[e->sym]];
        if (q == SD_JRE_DEAD || !pat_viable(re, n, q, k))
            return 0;
        a->b = q;
        a->a = (uint16_t)k;
        return 1;
    }
    default:
        if (e->nostep)
            return 1;
        for (uint32_t x = 0; x < re->nclass; x++) {
            const uint64_t *cm = re->cmask + 3 * (size_t)x;
            if (!((cm[0] & e->m[0]) | (cm[1] & e->m[1]) | (cm[2] & e->m[2])))
                continue;
            const uint16_t q = re->next[(size_t)a->b * re->nclass + x];
            if (q != SD_JRE_DEAD && pat_viable(re, n, q, k))
                return 1;
        }
        return 0;
    }
}

/* ---- integers' bounds --------------------------------------------------- */

#define NMAG_SAT ((uint64_t)1 << 63 | 1) /* past every int64's magnitude */

/* may an integer of [lo, hi] still be read from here: sub the number's
 * part (N_MINUS: '-' alone; N_ZERO: 0 or -0, whole; N_INT: the magnitude
 * mag so far, more digits may follow), neg its sign */
static int int_reach(const js_node *n, uint8_t sub, int neg, uint64_t mag)
{
    if (n->lo == INT64_MIN && n->hi == INT64_MAX)
        return 1;
    if (sub == N_MINUS) /* a negative, or -0 */
        return n->lo <= 0;
    if (sub == N_ZERO)
        return n->lo <= 0 && n->hi >= 0;
    /* the magnitudes m the bounds admit on this side, [a, b] (b unbounded:
     * UINT64_MAX): a value mag 10^e + r, 0 <= r < 10^e, for some e >= 0 */
    uint64_t a, b;
    if (!neg) {
        if (n->hi < 1)
            return 0;
        a = n->lo < 1 ? 1 : (uint64_t)n->lo;
        b = n->hi == INT64_MAX ? UINT64_MAX : (uint64_t)n->hi;
    } else {
        if (n->lo > -1)
            return 0;
        a = n->hi > -1 ? 1 : n->hi == INT64_MIN ? (uint64_t)1 << 63 : (uint64_t)-n->hi;
        b = n->lo == INT64_MIN ? UINT64_MAX : (uint64_t)-n->lo;
    }
    if (b == UINT64_MAX)
        return 1; /* (mag 10^e grows past a) */
    /* [mag 10^e, (mag + 1) 10^e - 1] meets [a, b] (at a multiple) for
     * some e: the low end grows past b, then never again */
    uint64_t x = mag, y = mag;
    for (;;) {
        if (x > b)
            return 0;
        if (y >= a) {
            const uint64_t l = x > a ? x : a, h = y < b ? y : b;
            if (!n->mult || !(l % n->mult) || h - l >= n->mult - l % n->mult)
                return 1;
        }
        if (x > UINT64_MAX / 10)
            return 0;
        x *= 10;
        y = y > (UINT64_MAX - 9) / 10 ? UINT64_MAX : y * 10 + 9;
    }
}

/* is the whole integer read within n's bounds, a multiple where it must
 * be (a: its remainder) */
static int int_whole(const js_node *n, const sd_jschema_state *st, const sd_jschema_alt *a)
{
    if (n->mult && st->sub != N_ZERO && count_of(a))
        return 0;
    if (n->lo == INT64_MIN && n->hi == INT64_MAX)
        return 1;
    if (st->sub == N_ZERO)
        return n->lo <= 0 && n->hi >= 0;
    /* past int64: only where that side is unbounded */
    if (!st->nneg)
        return st->nmag > (uint64_t)INT64_MAX
                   ? n->hi == INT64_MAX
                   : (int64_t)st->nmag >= n->lo && (int64_t)st->nmag <= n->hi;
    if (st->nmag > (uint64_t)1 << 63)
        return n->lo == INT64_MIN;
    const int64_t v = st->nmag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)st->nmag;
    return v >= n->lo && v <= n->hi;
}

/* a number's bounds on the magnitudes x of one sign's values: x in
 * [l, h] (each side NB_NONE, NB_INCL or NB_EXCL), or none (empty) */
typedef struct magb {
    uint64_t lm, hm;
    int16_t le, he;
    uint8_t lk, hk, empty;
} magb;

static magb mag_bounds(const js_node *n, int neg)
{
    const js_bound *lo = &n->nlo, *hi = &n->nhi;
    magb b = {0};
    if (!neg) { /* x >= lo (none where lo < 0), x <= hi (none where hi < 0) */
        if (lo->kind && !lo->neg)
            b.lk = lo->kind, b.lm = lo->m, b.le = lo->e;
        if (hi->kind && hi->neg)
            b.empty = 1;
        else if (hi->kind)
            b.hk = hi->kind, b.hm = hi->m, b.he = hi->e;
    } else { /* lo <= -x: x <= -lo (none where lo > 0); -x <= hi: x >= -hi where hi <= 0 */
        if (lo->kind && !lo->neg && lo->m)
            b.empty = 1;
        else if (lo->kind)
            b.hk = lo->kind, b.hm = lo->m, b.he = lo->e;
        if (hi->kind && (hi->neg || !hi->m))
            b.lk = hi->kind, b.lm = hi->m, b.le = hi->e;
    }
    return b;
}

#define SCALED_CAP ((uint64_t)4000000000000000000u)

/* m 10^e 10^S rounded down (up: up), at most SCALED_CAP */
static uint64_t scaled(uint64_t m, int e, int S, int up)
{
    int k = e + S;
    if (k >= 0) {
        for (; k > 0 && m; k--) {
            if (m > SCALED_CAP / 10)
                return SCALED_CAP;
            m *= 10;
        }
        return m > SCALED_CAP ? SCALED_CAP : m;
    }
    if (-k > 19)
        return up && m;
    const uint64_t p = pow10u(-k);
    return m / p + (up && m % p);
}

/* is some magnitude (base + t) 10^-S, t in [0, tmax], within b (base and
 * tmax below 10^16) */
static int mag_fits(const magb *b, int S, uint64_t base, uint64_t tmax)
{
    if (b->empty)
        return 0;
    int64_t tl = 0, th = (int64_t)tmax;
    if (b->lk) { /* x >= l: t >= ceil(l 10^S) - base; x > l: t >= floor(l 10^S) + 1 - base */
        const int ex = b->lk == NB_EXCL;
        const int64_t t = (int64_t)scaled(b->lm, b->le, S, !ex) + ex - (int64_t)base;
        tl = t > tl ? t : tl;
    }
    if (b->hk) { /* x <= h: t <= floor(h 10^S) - base; x < h: t <= ceil(h 10^S) - 1 - base */
        const int ex = b->hk == NB_EXCL;
        const int64_t t = (int64_t)scaled(b->hm, b->he, S, ex) - ex - (int64_t)base;
        th = t < th ? t : th;
    }
    return tl <= th;
}

/* may a number of n's bounds still be read from here (no exponent, at
 * most NUM_DIGITS digits from the first nonzero one, NUM_FRAC decimals):
 * sub the number's part (N_MINUS: '-' alone, any magnitude; N_ZERO: 0 or
 * -0; N_INT: the integer part's digits m so far; N_DOT, N_FRAC: the digits
 * m of both parts, f of them decimals), neg its sign */
static int num_reach(const js_node *n, uint8_t sub, int neg, uint64_t m, int f)
{
    if (!n->nlo.kind && !n->nhi.kind)
        return 1;
    if (sub == N_MINUS) {
        for (int d = 0; d <= 9; d++)
            if (num_reach(n, d ? N_INT : N_ZERO, 1, (uint64_t)d, 0))
                return 1;
        return 0;
    }
    const magb b = mag_bounds(n, neg);
    const int frac = sub == N_DOT || sub == N_FRAC;
    f = frac ? f : 0;
    if (b.empty || f > NUM_FRAC)
        return 0;
    if (m == 0) {
        /* 0 itself, or a first nonzero digit at decimal place z (the
         * magnitudes [10^-z, 10^(1-z)) to NUM_DIGITS digits from it) */
        if (mag_fits(&b, 0, 0, 0))
            return 1;
        for (int z = f + 1; z <= NUM_FRAC; z++) {
            const int S = z - 1 + NUM_DIGITS > NUM_FRAC ? NUM_FRAC : z - 1 + NUM_DIGITS;
            const uint64_t lo = pow10u(S - z);
            if (mag_fits(&b, S, lo, 9 * lo - 1))
                return 1;
        }
        return 0;
    }
    const int d = ndigits(m);
    if (d > NUM_DIGITS)
        return 0;
    if (frac) { /* [m 10^-f, (m + 1) 10^-f), the digits left as decimals */
        const int r = f + NUM_DIGITS - d > NUM_FRAC ? NUM_FRAC - f : NUM_DIGITS - d;
        if (sub == N_DOT && r < 1) /* (a decimal must follow) */
            return 0;
        const uint64_t p = pow10u(r);
        return mag_fits(&b, f + r, m * p, p - 1);
    }
    /* j more digits of the integer part, then decimals to NUM_DIGITS in
     * all: [m 10^j, (m + 1) 10^j) in units of 10^-(NUM_DIGITS - d - j) */
    const uint64_t p = pow10u(NUM_DIGITS - d);
    for (int j = 0; j <= NUM_DIGITS - d; j++)
        if (mag_fits(&b, NUM_DIGITS - d - j, m * p, p - 1))
            return 1;
    return 0;
}

/* may any number of n's bounds be read */
static int num_any(const js_node *n)
{
    for (int neg = 0; neg < 2; neg++)
        for (int d = 0; d <= 9; d++)
            if (num_reach(n, d ? N_INT : N_ZERO, neg, (uint64_t)d, 0))
                return 1;
    return 0;
}

/* is the whole number read within n's bounds */
static int num_whole(const js_node *n, const sd_jschema_state *st)
{
    if (!n->nlo.kind && !n->nhi.kind)
        return 1;
    const magb b = mag_bounds(n, st->nneg);
    const int f = st->sub == N_FRAC ? st->nfrac : 0;
    return st->nmag < pow10u(NUM_DIGITS) && f <= NUM_FRAC && mag_fits(&b, f, st->nmag, 0);
}

/* whether a scalar alternative is whole at the value's end */
static int scalar_whole(const sd_jschema *s, const sd_jschema_state *st, const js_node *n,
                        const sd_jschema_alt *a)
{
    if (n->flags & F_ENUM)
        return s->lit[n->lit0 + a->a].len == a->b;
    if (n->flags & F_ANY)
        return 1;
    if (st->mode == M_STR)
        return n->re ? s->re[n->re - 1].acc[a->b] && a->a >= n->min_len : count_of(a) >= n->min_len;
    return st->mode != M_NUM || ((n->types & T_NUM) ? num_whole(n, st) : int_whole(n, st, a));
}

/* the innermost value ended (its alternatives: those whole): its container
 * keeps the alternatives they came from, one key or item further */
static int pop(const sd_jschema *s, sd_jschema_state *st)
{
    int start = top_start(st);
    uint16_t m = 0;
    for (int i = start; i < st->nalt; i++)
        m |= st->alt[i].parents;
    st->nalt = (uint8_t)start;
    st->nlev--;
    if (!m)
        return bad(st);
    if (st->nlev == 0) {
        st->mode = M_DONE;
        return 0;
    }
    int ps = top_start(st), w = ps, obj = top_is_obj(st);
    for (int i = ps; i < st->nalt; i++) {
        if (!(m >> (i - ps) & 1))
            continue;
        sd_jschema_alt a = st->alt[i];
        if (obj) {
            a.a++; /* the next key after this one */
        } else {
            uint32_t k = count_of(&a);
            set_count(&a, k < UINT32_MAX ? k + 1 : k);
        }
        st->alt[w++] = a;
    }
    st->mode = M_AFTER;
    return settle(st, ps, w);
}

static int scalar_end(const sd_jschema *s, sd_jschema_state *st)
{
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++)
        if (scalar_whole(s, st, alt_node(s, &st->alt[i]), &st->alt[i]))
            st->alt[w++] = st->alt[i];
    st->nmag = 0, st->nneg = 0, st->nfrac = 0;
    st->scp = 0, st->sdec = 0;
    if (settle(st, start, w))
        return -1;
    return pop(s, st);
}

/* may leaf l begin with byte c (of kind k) here; *lit: an enum's first
 * value that does */
static int leaf_begins(const sd_jschema *s, const sd_jschema_state *st, uint16_t l, int k,
                       unsigned char c, int *lit)
{
    const js_node *n = &s->node[l];
    if (n->flags & F_ANY)
        return 1;
    if (n->flags & F_ENUM) {
        for (uint32_t j = 0; j < n->nlit; j++) {
            if ((unsigned char)s->text[s->lit[n->lit0 + j].off] == c) {
                *lit = (int)j;
                return 1;
            }
        }
        return 0;
    }
    switch (k) {
    case K_OBJ: return (n->types & T_OBJ) && st->nlev + n->mind_obj <= s->max_depth;
    case K_ARR: return (n->types & T_ARR) && st->nlev + n->mind_arr <= s->max_depth;
    case K_STR: return !!(n->types & T_STR);
    case K_NUM: {
        const uint8_t sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        const uint64_t mag = is_digit(c) ? (uint64_t)(c - '0') : 0;
        if (n->types & T_NUM)
            return num_reach(n, sub, c == '-', mag, 0);
        return (n->types & T_INT) && int_reach(n, sub, c == '-', mag);
    }
    case K_BOOL: return !!(n->types & T_BOOL);
    default: return !!(n->types & T_NULL);
    }
}

/* the leaves of node x that may begin with c join the new value (from
 * base), merged by leaf, as children of the container's alternative bit */
static int add_leaves(const sd_jschema *s, sd_jschema_state *st, int base, uint16_t x, int k,
                      unsigned char c, uint16_t bit)
{
    const js_node *n = &s->node[x];
    for (uint32_t i = 0; i < n->nleaf; i++) {
        uint16_t l = s->leaf[n->leaf0 + i];
        int lit = -1, j = base;
        if (!leaf_begins(s, st, l, k, c, &lit))
            continue;
        while (j < st->nalt && (st->alt[j].node & NODE_MASK) != l)
            j++;
        if (j < st->nalt) {
            st->alt[j].parents |= bit;
            continue;
        }
        /* (compilation bounds both; a failure here would be a bug) */
        if (st->nalt - base >= SD_JSCHEMA_MAX_ALT || st->nalt >= SD_JSCHEMA_POOL)
            return -1;
        st->alt[st->nalt++] =
            (sd_jschema_alt){l, bit, lit < 0 ? 0 : (uint16_t)lit, lit < 0 ? 0 : 1};
    }
    return 0;
}

/* the first byte of a value */
static int value_begin(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    int k = byte_kind(c);
    if (k < 0 || ((k == K_OBJ || k == K_ARR) && st->nlev >= s->max_depth))
        return bad(st);
    int base = st->nalt;
    if (st->nlev == 0) {
        if (add_leaves(s, st, base, s->ncall ? s->call[st->clo].root : s->root, k, c, 1))
            return bad(st);
    } else {
        int ps = top_start(st), obj = top_is_obj(st);
        for (int i = ps; i < base; i++) {
            const sd_jschema_alt *a = &st->alt[i];
            const js_node *n = alt_node(s, a);
            uint16_t x;
            if ((n->flags & F_ANY) || (obj && keys_free(n)))
                x = free_vals(s, n);
            else if (obj)
                x = s->prop[n->prop0 + a->a].node;
            else if (count_of(a) < n->max_items)
                x = item_node(s, n, count_of(a));
            else
                continue;
            if (add_leaves(s, st, base, x, k, c, (uint16_t)(1u << (i - ps))))
                return bad(st);
        }
    }
    if (st->nalt == base)
        return bad(st);
    st->lev[st->nlev++] = (uint8_t)(base | (k == K_OBJ ? LEV_OBJ : 0));
    st->sub = 0;
    switch (k) {
    case K_OBJ: st->mode = M_KEY_OR_END; break;
    case K_ARR: st->mode = M_VALUE_OR_END; break;
    case K_STR: st->mode = M_STR; break;
    case K_NUM:
        st->mode = M_NUM;
        st->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        if (s->bounded) {
            st->nneg = c == '-';
            st->nmag = is_digit(c) ? (uint64_t)(c - '0') : 0;
            st->nfrac = 0;
        }
        for (int i = base; is_digit(c) && i < st->nalt; i++) { /* multiples: the remainder */
            const js_node *n = alt_node(s, &st->alt[i]);
            if (!(n->flags & F_ENUM) && n->mult)
                set_count(&st->alt[i], (uint32_t)(c - '0') % n->mult);
        }
        break;
    default:
        st->mode = M_LIT;
        st->sub = (uint8_t)((c == 't' ? 0 : c == 'f' ? 1 : 2) << 4 | 1);
        break;
    }
    return 0;
}

/* '}' or ']': the alternatives with nothing required left */
static int close_value(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    int obj = top_is_obj(st), start = top_start(st), w = start;
    if ((c == '}') != obj)
        return bad(st);
    for (int i = start; i < st->nalt; i++) {
        const sd_jschema_alt *a = &st->alt[i];
        const js_node *n = alt_node(s, a);
        int ok = 1;
        if (obj)
            ok = keys_free(n) || a->a >= n->nprop ||
                 !s->prop[n->prop0 + s->prop[n->prop0 + a->a].lim].required;
        else if (!(n->flags & F_ANY))
            ok = count_of(a) >= n->min_items;
        if (ok)
            st->alt[w++] = *a;
    }
    if (settle(st, start, w))
        return -1;
    return pop(s, st);
}

/* ',': the alternatives that may take another key or item */
static int comma(const sd_jschema *s, sd_jschema_state *st)
{
    int obj = top_is_obj(st), start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        const sd_jschema_alt *a = &st->alt[i];
        const js_node *n = alt_node(s, a);
        int ok = 1;
        if (obj)
            ok = keys_free(n) || first_key(s, st, n, a->a) >= 0;
        else if (!(n->flags & F_ANY))
            ok = count_of(a) < n->max_items && fits(s, st, n->items);
        if (ok)
            st->alt[w++] = *a;
    }
    st->mode = obj ? M_KEY : M_VALUE;
    return settle(st, start, w);
}

/* a key's opening quote: each object's first candidate */
static int key_begin(const sd_jschema *s, sd_jschema_state *st)
{
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        sd_jschema_alt a = st->alt[i];
        const js_node *n = alt_node(s, &a);
        if (!keys_free(n)) {
            int j = first_key(s, st, n, a.a);
            if (j < 0)
                continue;
            a.a = (uint16_t)j;
            a.b = 0;
        }
        st->alt[w++] = a;
    }
    st->mode = M_IN_KEY;
    st->sub = 0;
    return settle(st, start, w);
}

static int key_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    int closed = str_syntax(st, c);
    if (closed < 0)
        return bad(st);
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        sd_jschema_alt a = st->alt[i];
        const js_node *n = alt_node(s, &a);
        if (keys_free(n) || key_step(s, st, n, &a, c, closed))
            st->alt[w++] = a;
    }
    if (closed)
        st->mode = M_COLON;
    return settle(st, start, w);
}

static int str_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    uint8_t sub = st->sub;
    int closed = str_syntax(st, c);
    if (closed < 0)
        return bad(st);
    chr_ev ev;
    if (s->nre)
        str_decode(st, sub, c, &ev);
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        sd_jschema_alt a = st->alt[i];
        const js_node *n = alt_node(s, &a);
        int ok = 1;
        if (n->flags & F_ENUM)
            ok = lit_step(s, n, &a, c);
        else if (n->re)
            ok = pat_step(s, n, &a, &ev);
        else if (!(n->flags & F_ANY) && (n->min_len || n->max_len != UINT32_MAX))
            ok = str_count(n, &a, sub, c);
        if (ok)
            st->alt[w++] = a;
    }
    if (settle(st, start, w))
        return -1;
    return closed ? scalar_end(s, st) : 0;
}

static int step(const sd_jschema *s, sd_jschema_state *st, unsigned char c);

/* 1: c goes on the number (*sub its part then), 0: the number ended before
 * c, -1: neither */
static int number_next(uint8_t sub, unsigned char c, uint8_t *out)
{
    switch (sub) {
    case N_MINUS:
        if (!is_digit(c))
            return -1;
        *out = c == '0' ? N_ZERO : N_INT;
        return 1;
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (is_digit(c) && sub != N_ZERO) {
            *out = sub;
            return 1;
        }
        if (c == '.' && sub != N_FRAC) {
            *out = N_DOT;
            return 1;
        }
        if (c == 'e' || c == 'E') {
            *out = N_E;
            return 1;
        }
        return 0;
    case N_DOT:
        if (!is_digit(c))
            return -1;
        *out = N_FRAC;
        return 1;
    case N_E:
        if (c == '+' || c == '-') {
            *out = N_ESIGN;
            return 1;
        }
        /* fall through */ /* (a digit) */
    case N_ESIGN:
        if (!is_digit(c))
            return -1;
        *out = N_EXP;
        return 1;
    default: /* N_EXP */
        if (is_digit(c)) {
            *out = N_EXP;
            return 1;
        }
        return 0;
    }
}

static int number_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    uint8_t sub = 0;
    int r = number_next(st->sub, c, &sub);
    if (r < 0)
        return bad(st);
    if (r == 0) { /* the number ended: c is read again after it */
        if (scalar_end(s, st))
            return -1;
        return step(s, st, c);
    }
    if (s->bounded && (sub == N_INT || sub == N_FRAC) && is_digit(c)) { /* (not the exponent's) */
        st->nmag = st->nmag > (NMAG_SAT - 9) / 10 ? NMAG_SAT : st->nmag * 10 + (uint64_t)(c - '0');
        st->nfrac += sub == N_FRAC && st->nfrac < UINT8_MAX;
    }
    st->sub = sub;
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        sd_jschema_alt a = st->alt[i];
        const js_node *n = alt_node(s, &a);
        int ok = 1;
        if (n->flags & F_ENUM)
            ok = lit_step(s, n, &a, c);
        else if (!(n->types & T_NUM)) { /* integer: no fraction or exponent; its bounds */
            ok = c != '.' && c != 'e' && c != 'E' && int_reach(n, sub, st->nneg, st->nmag);
            if (ok && n->mult) /* (sub: N_ZERO or N_INT, c a digit) */
                set_count(&a, (uint32_t)(((uint64_t)count_of(&a) * 10 + (uint64_t)(c - '0')) % n->mult));
        }
        else if (n->nlo.kind || n->nhi.kind) /* a bounded number: no exponent; its bounds */
            ok = c != 'e' && c != 'E' && num_reach(n, sub, st->nneg, st->nmag, st->nfrac);
        if (ok)
            st->alt[w++] = a;
    }
    return settle(st, start, w);
}

static int literal_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    const char *lit = LITERALS[st->sub >> 4];
    int at = st->sub & 15;
    if ((unsigned char)lit[at] != c)
        return bad(st);
    int start = top_start(st), w = start;
    for (int i = start; i < st->nalt; i++) {
        sd_jschema_alt a = st->alt[i];
        const js_node *n = alt_node(s, &a);
        if (!(n->flags & F_ENUM) || lit_step(s, n, &a, c))
            st->alt[w++] = a;
    }
    if (settle(st, start, w))
        return -1;
    if (lit[at + 1] == 0)
        return scalar_end(s, st);
    st->sub = (uint8_t)((st->sub & 0xf0) | (at + 1));
    return 0;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int step(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    switch (st->mode) {
    case M_IN_KEY: return key_byte(s, st, c);
    case M_STR: return str_byte(s, st, c);
    case M_NUM: return number_byte(s, st, c);
    case M_LIT: return literal_byte(s, st, c);
    default: break;
    }
    /* between tokens: whitespace, capped; none before the value or after it */
    if (is_ws(c)) {
        if (st->mode == M_START || st->mode == M_DONE || ++st->ws > SD_JSON_MAX_WS)
            return bad(st);
        return 0;
    }
    st->ws = 0;
    switch (st->mode) {
    case M_START:
    case M_VALUE: return value_begin(s, st, c);
    case M_VALUE_OR_END: return c == ']' ? close_value(s, st, c) : value_begin(s, st, c);
    case M_KEY_OR_END:
        if (c == '}')
            return close_value(s, st, c);
        /* fall through */ /* (a key) */
    case M_KEY: return c == '"' ? key_begin(s, st) : bad(st);
    case M_COLON:
        if (c != ':')
            return bad(st);
        st->mode = M_VALUE;
        return 0;
    case M_AFTER:
        if (c == '}' || c == ']')
            return close_value(s, st, c);
        return c == ',' ? comma(s, st) : bad(st);
    default: /* M_DONE: nothing */ return bad(st);
    }
}

/* ---- tool calls -------------------------------------------------------
 *
 * The literals are matched against every tool still alive: in C_LEAD the
 * text so far is lead + prefix_i up to cpos for each tool in [clo, chi)
 * (a range: the tools are sorted by prefix), and the end's first cpos
 * bytes too while cend. A prefix whole starts its document (only that
 * tool is alive then: no prefix is another's); the document whole (an
 * object: nothing can follow it) starts the suffix; the suffix whole
 * counts the call and matches leads again, the sep's, with the end. */

static void doc_clear(sd_jschema_state *st)
{
    memset(&st->mode, 0, offsetof(sd_jschema_state, alt) - offsetof(sd_jschema_state, mode));
    st->mode = M_START;
}

static uint32_t cand_len(const sd_jschema *s, const sd_jschema_state *st, uint32_t i)
{
    return s->nlead[st->ncall > 0] + s->call[i].npre;
}

static unsigned char cand_at(const sd_jschema *s, const sd_jschema_state *st, uint32_t i,
                             uint32_t pos)
{
    const uint32_t nl = s->nlead[st->ncall > 0];
    return (unsigned char)(pos < nl ? s->text[s->lead[st->ncall > 0] + pos]
                                    : s->text[s->call[i].pre + pos - nl]);
}

static void call_whole(const sd_jschema *s, sd_jschema_state *st)
{
    doc_clear(st);
    st->ncall++;
    st->cph = C_LEAD;
    st->cpos = 0;
    st->cend = 1;
    st->clo = 0;
    st->chi = st->ncall < s->max_calls ? (uint16_t)s->ncall : 0;
    if (!st->chi && !s->nend)
        st->cph = C_DONE;
}

/* the document is whole: its suffix next */
static void doc_whole(const sd_jschema *s, sd_jschema_state *st)
{
    st->cph = C_SUF;
    st->cpos = 0;
    if (!s->call[st->clo].nsuf)
        call_whole(s, st);
}

static int lead_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    int lo = -1, hi = -1;
    for (uint32_t i = st->clo; i < st->chi; i++) {
        if (st->cpos < cand_len(s, st, i) && cand_at(s, st, i, st->cpos) == c) {
            lo = lo < 0 ? (int)i : lo;
            hi = (int)i + 1;
        } else if (lo >= 0) {
            break;
        }
    }
    if (lo < 0 && c >= '0' && c <= '9') { /* the digits' byte (one tool alive there) */
        for (uint32_t i = st->clo; i < st->chi; i++)
            if (st->cpos < cand_len(s, st, i) && cand_at(s, st, i, st->cpos) == PH_BYTE) {
                st->cph = C_DIG;
                st->cdig = 1;
                st->clo = (uint16_t)i;
                st->chi = (uint16_t)(i + 1);
                st->cend = 0;
                st->cpos++;
                return 0;
            }
    }
    st->cend = st->cend && st->cpos < s->nend && (unsigned char)s->text[s->end + st->cpos] == c;
    st->cpos++;
    if (lo < 0) {
        st->clo = st->chi = 0;
        if (!st->cend)
            return bad(st);
    } else {
        st->clo = (uint16_t)lo;
        st->chi = (uint16_t)hi;
    }
    if (st->clo < st->chi && st->cpos == cand_len(s, st, st->clo)) { /* its document next */
        st->chi = st->clo + 1;
        st->cend = 0;
        st->cph = C_DOC;
        doc_clear(st);
    } else if (st->clo == st->chi && st->cpos == s->nend) {
        st->cph = C_DONE;
    }
    return 0;
}

static int call_step(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    switch (st->cph) {
    case C_DIG:
        if (c >= '0' && c <= '9' && st->cdig < 4) {
            st->cdig++;
            return 0;
        }
        st->cph = C_LEAD;
        st->cdig = 0;
        return lead_byte(s, st, c);
    case C_LEAD: return lead_byte(s, st, c);
    case C_DOC:
        if (step(s, st, c))
            return -1;
        if (st->mode == M_DONE)
            doc_whole(s, st);
        return 0;
    case C_SUF: {
        const js_call *k = &s->call[st->clo];
        if (st->cpos >= k->nsuf || (unsigned char)s->text[k->suf + st->cpos] != c)
            return bad(st);
        if (++st->cpos == k->nsuf)
            call_whole(s, st);
        return 0;
    }
    default: return bad(st);
    }
}

/* the text before x-specd-after's A: the bytes it takes up to A's end */
static size_t after_bytes(const sd_jschema *s, sd_jschema_state *st, const unsigned char *b, size_t n)
{
    const unsigned char *a = (const unsigned char *)s->text + s->after;
    size_t i = 0;
    uint32_t j = st->pmatch;
    while (i < n && j < s->nafter) {
        while (j > 0 && b[i] != a[j])
            j = s->after_fail[j - 1];
        if (b[i] == a[j])
            j++;
        i++;
    }
    st->pmatch = (uint16_t)j;
    if (j == s->nafter) { /* A whole: the reply's text next */
        st->pre = 0;
        st->pmatch = 0;
    }
    return i;
}

/* the reply's text, one byte */
static int reply_step(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    return s->ncall ? call_step(s, st, c) : step(s, st, c);
}

/* a byte where the text may still open the reasoning (pre 2): fed to the
 * reply and matched against O; O whole: the reasoning, the reply from its
 * start after A; O no longer matched: the reply alone */
static void undecided_byte(const sd_jschema *s, sd_jschema_state *st, unsigned char c)
{
    const int open = st->pmatch < s->nopen && (unsigned char)s->text[s->open + st->pmatch] == c;
    if (!st->pbad && reply_step(s, st, c)) {
        st->bad = 0;
        st->pbad = 1;
    }
    if (!open) {
        st->pre = 0;
        st->pmatch = 0;
        st->bad = st->pbad;
        st->pbad = 0;
        return;
    }
    if (++st->pmatch == s->nopen) { /* O whole: inside the reasoning */
        sd_jschema_init(s, st);
        st->pre = 1;
    }
}

int sd_jschema_feed(const sd_jschema *s, sd_jschema_state *st, const unsigned char *b, size_t n)
{
    while (n && st->pre && !st->bad) {
        if (st->pre == 2) {
            undecided_byte(s, st, *b);
            b++;
            n--;
        } else {
            const size_t k = after_bytes(s, st, b, n);
            b += k;
            n -= k;
        }
    }
    for (size_t i = 0; i < n && !st->bad; i++)
        reply_step(s, st, b[i]);
    return st->bad ? -1 : 0;
}

int sd_jschema_done(const sd_jschema *s, const sd_jschema_state *st)
{
    if (st->bad || st->pre == 1 || st->pbad)
        return 0;
    if (s->ncall)
        return st->cph == C_DONE || (st->cph == C_LEAD && st->cend && st->cpos == s->nend);
    if (st->mode == M_DONE)
        return 1;
    /* a top-level number ends with the text */
    if (st->mode != M_NUM || st->nlev != 1 || st->sub == N_MINUS || st->sub == N_DOT ||
        st->sub == N_E || st->sub == N_ESIGN)
        return 0;
    sd_jschema_state t;
    sd_jschema_copy(&t, st);
    return scalar_end(s, &t) == 0 && t.mode == M_DONE;
}

#include "verify/json_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"

/* ---- symbols ------------------------------------------------------------ */

typedef struct cset {
    uint64_t w[3];
} cset;

static void cs_add(cset *s, int sym) { s->w[sym >> 6] |= (uint64_t)1 << (sym & 63); }
static int cs_has(const cset *s, int sym) { return (int)(s->w[sym >> 6] >> (sym & 63) & 1); }
static void cs_range(cset *s, int lo, int hi)
{
    for (int c = lo; c <= hi; c++)
        cs_add(s, c);
}
static void cs_or(cset *s, const cset *t)
{
    for (int i = 0; i < 3; i++)
        s->w[i] |= t->w[i];
}
static cset cs_not(cset s)
{
    for (int i = 0; i < 3; i++)
        s.w[i] = ~s.w[i];
    s.w[2] &= ((uint64_t)1 << (SD_JRE_NSYM - 128)) - 1;
    return s;
}
static cset cs_all(void) { return cs_not((cset){{0, 0, 0}}); }

/* ECMA-262's WhiteSpace and LineTerminator beyond ASCII (Zs, U+FEFF, U+2028-9) */
static const uint32_t WS_RANGES[][2] = {{0xa0, 0xa0},     {0x1680, 0x1680}, {0x2000, 0x200a},
                                        {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000},
                                        {0xfeff, 0xfeff}};

int sd__jre_sym(uint32_t cp)
{
    if (cp < 0x80)
        return (int)cp;
    if (cp == 0x2028 || cp == 0x2029)
        return SD_JRE_LT;
    for (size_t i = 0; i < sizeof WS_RANGES / sizeof WS_RANGES[0]; i++)
        if (cp >= WS_RANGES[i][0] && cp <= WS_RANGES[i][1])
            return SD_JRE_WS;
    return SD_JRE_OTHER;
}

/* how many of [lo, hi] are in [a, b] */
static uint32_t overlap(uint32_t lo, uint32_t hi, uint32_t a, uint32_t b)
{
    lo = lo > a ? lo : a;
    hi = hi < b ? hi : b;
    return lo <= hi ? hi - lo + 1 : 0;
}

void sd__jre_range(uint32_t lo, uint32_t hi, uint64_t m[3])
{
    if (lo > hi)
        return;
    for (uint32_t c = lo; c <= hi && c < 0x80; c++)
        m[c >> 6] |= (uint64_t)1 << (c & 63);
    if (hi < 0x80)
        return;
    lo = lo < 0x80 ? 0x80 : lo;
    /* the rest: LT, WS, and any other not a surrogate */
    uint32_t special = 0;
    const uint32_t lt = overlap(lo, hi, 0x2028, 0x2029);
    if (lt)
        m[2] |= (uint64_t)1 << (SD_JRE_LT - 128);
    special += lt;
    for (size_t i = 0; i < sizeof WS_RANGES / sizeof WS_RANGES[0]; i++) {
        const uint32_t k = overlap(lo, hi, WS_RANGES[i][0], WS_RANGES[i][1]);
        if (k)
            m[2] |= (uint64_t)1 << (SD_JRE_WS - 128);
        special += k;
    }
    if (hi - lo + 1 > special + overlap(lo, hi, 0xd800, 0xdfff))
        m[2] |= (uint64_t)1 << (SD_JRE_OTHER - 128);
}

/* ---- the pattern's tree ---------------------------------------------------
 * ECMA-262 (with the u flag's strictness: what Annex B reads as a literal,
 * a lone '{', '}' or ']', is refused) over ASCII. */

enum { R_SET, R_CAT, R_ALT, R_REP, R_BOL, R_EOL, R_EMPTY };

typedef struct rnode {
    uint8_t kind;
    int32_t a, b;     /* CAT, ALT: the two sides; REP: a, the repeated */
    int32_t min, max; /* REP (max -1: no bound) */
    uint32_t set;     /* SET */
} rnode;

#define MAX_TREE 4096
#define MAX_GROUPS 32 /* groups nested */
#define MAX_NFA 4096

typedef struct rp {
    const unsigned char *p, *end;
    rnode *node;
    uint32_t nnode, cnode;
    cset *set;
    uint32_t nset, csetc;
    char *why;
    size_t cap;
    int rc; /* the first failure (0: none) */
    int groups;
    uint64_t work; /* the steps building the DFA may take */
} rp;

static int fail(rp *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rp *r, int rc, const char *fmt, ...)
{
    if (!r->rc) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->why, r->cap, fmt, ap);
        va_end(ap);
        r->rc = rc;
    }
    return -1;
}

static int new_rnode(rp *r, uint8_t kind, int32_t a, int32_t b)
{
    if (r->nnode >= MAX_TREE)
        return fail(r, SD_EINVAL, "the pattern is too large (more than %d parts)", MAX_TREE);
    rnode *q = sd_grow(r->node, &r->cnode, r->nnode + 1, sizeof *q);
    if (!q)
        return fail(r, SD_ENOMEM, "out of memory");
    r->node = q;
    q[r->nnode] = (rnode){.kind = kind, .a = a, .b = b};
    return (int)r->nnode++;
}

static int new_set(rp *r, const cset *s)
{
    cset *q = sd_grow(r->set, &r->csetc, r->nset + 1, sizeof *q);
    if (!q)
        return fail(r, SD_ENOMEM, "out of memory");
    r->set = q;
    q[r->nset] = *s;
    const int id = new_rnode(r, R_SET, -1, -1);
    if (id >= 0)
        r->node[id].set = r->nset++;
    return id;
}

static int at(const rp *r, char c) { return r->p < r->end && *r->p == (unsigned char)c; }

static cset class_of(char k)
{
    cset s = {{0, 0, 0}};
    switch (k | 0x20) {
    case 'd': cs_range(&s, '0', '9'); break;
    case 'w':
        cs_range(&s, '0', '9'), cs_range(&s, 'a', 'z'), cs_range(&s, 'A', 'Z');
        cs_add(&s, '_');
        break;
    default: /* s: \t \n \v \f \r, space, and the non-ASCII ones */
        cs_range(&s, '\t', '\r'), cs_add(&s, ' ');
        cs_add(&s, SD_JRE_LT), cs_add(&s, SD_JRE_WS);
        break;
    }
    return k >= 'A' && k <= 'Z' ? cs_not(s) : s;
}

static int hexdig(unsigned char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* an escape after '\' (in a class or not): a character (*ch, 0) or a
 * class (*set, 1); -1 refused */
static int escape(rp *r, int in_class, int *ch, cset *set)
{
    if (r->p >= r->end)
        return fail(r, SD_EINVAL, "the pattern ends with a lone '\\'");
    const unsigned char k = *r->p++;
    if (strchr("dDwWsS", k) && k) {
        *set = class_of((char)k);
        return 1;
    }
    switch (k) {
    case 't': *ch = '\t'; return 0;
    case 'n': *ch = '\n'; return 0;
    case 'r': *ch = '\r'; return 0;
    case 'v': *ch = '\v'; return 0;
    case 'f': *ch = '\f'; return 0;
    case 'b':
        if (in_class) { /* backspace, in a class */
            *ch = '\b';
            return 0;
        }
        /* fall through */
    case 'B': return fail(r, SD_EINVAL, "word boundaries (\\b, \\B) are not supported");
    case '0':
        if (r->p < r->end && *r->p >= '0' && *r->p <= '9')
            return fail(r, SD_EINVAL, "octal escapes (\\0 and a digit) are not supported");
        *ch = 0;
        return 0;
    case 'c':
        if (r->p < r->end && ((*r->p | 0x20) >= 'a' && (*r->p | 0x20) <= 'z')) {
            *ch = *r->p++ & 31;
            return 0;
        }
        return fail(r, SD_EINVAL, "\\c must be followed by a letter");
    case 'x':
    case 'u': {
        const int nd = k == 'x' ? 2 : 4;
        int v = 0;
        if (k == 'u' && at(r, '{'))
            return fail(r, SD_EINVAL, "\\u{...} escapes are not supported");
        for (int i = 0; i < nd; i++) {
            const int h = r->p < r->end ? hexdig(*r->p) : -1;
            if (h < 0)
                return fail(r, SD_EINVAL, "\\%c needs %d hex digits", k, nd);
            v = v * 16 + h;
            r->p++;
        }
        if (v >= 0x80)
            return fail(r, SD_EINVAL,
                        "non-ASCII characters (\\%c%0*X) are not supported in a pattern", k, nd, v);
        *ch = v;
        return 0;
    }
    case 'k': return fail(r, SD_EINVAL, "backreferences (\\k<name>) are not supported");
    case 'p':
    case 'P': return fail(r, SD_EINVAL, "unicode property escapes (\\%c{...}) are not supported", k);
    default: break;
    }
    if (k >= '1' && k <= '9')
        return fail(r, SD_EINVAL, "backreferences (\\%c) are not supported", k);
    if (k && (strchr("^$\\.*+?()[]{}|/", k) || k == '-')) {
        *ch = k;
        return 0;
    }
    if (k >= 0x80)
        return fail(r, SD_EINVAL, "non-ASCII characters are not supported in a pattern");
    return fail(r, SD_EINVAL, "the escape \\%c is not supported", k);
}

/* a class atom: a character (0) or a class escape (1) */
static int class_atom(rp *r, int *ch, cset *set)
{
    const unsigned char c = *r->p++;
    if (c == '\\')
        return escape(r, 1, ch, set);
    if (c >= 0x80)
        return fail(r, SD_EINVAL, "non-ASCII characters are not supported in a pattern");
    *ch = c;
    return 0;
}

/* '[' ... ']' (the '[' read) */
static int parse_class(rp *r)
{
    cset s = {{0, 0, 0}};
    const int neg = at(r, '^');
    r->p += neg;
    for (;;) {
        if (r->p >= r->end)
            return fail(r, SD_EINVAL, "a '[' without its ']'");
        if (*r->p == ']') {
            r->p++;
            break;
        }
        int lo, hi;
        cset cl;
        const int k = class_atom(r, &lo, &cl);
        if (k < 0)
            return -1;
        if (k == 1) {
            if (at(r, '-') && r->p + 1 < r->end && r->p[1] != ']')
                return fail(r, SD_EINVAL, "a range from a class escape (e.g. [\\d-z]) is not valid");
            cs_or(&s, &cl);
            continue;
        }
        if (at(r, '-') && r->p + 1 < r->end && r->p[1] != ']') {
            r->p++;
            const int k2 = class_atom(r, &hi, &cl);
            if (k2 < 0)
                return -1;
            if (k2 == 1)
                return fail(r, SD_EINVAL, "a range to a class escape (e.g. [a-\\d]) is not valid");
            if (hi < lo)
                return fail(r, SD_EINVAL, "the range %c-%c is out of order", lo, hi);
            cs_range(&s, lo, hi);
            continue;
        }
        cs_add(&s, lo);
    }
    if (neg)
        s = cs_not(s);
    return new_set(r, &s);
}

static int parse_alt(rp *r);

static int parse_atom(rp *r)
{
    const unsigned char c = *r->p++;
    cset s = {{0, 0, 0}};
    int ch;
    switch (c) {
    case '^': return new_rnode(r, R_BOL, -1, -1);
    case '$': return new_rnode(r, R_EOL, -1, -1);
    case '.':
        s = cs_not(s);
        s.w[0] &= ~((uint64_t)1 << '\n' | (uint64_t)1 << '\r');
        s.w[2] &= ~((uint64_t)1 << (SD_JRE_LT - 128));
        return new_set(r, &s);
    case '[': return parse_class(r);
    case '(': {
        if (at(r, '?')) {
            r->p++;
            if (at(r, ':')) {
                r->p++;
            } else if (at(r, '=') || at(r, '!') ||
                       (at(r, '<') && r->p + 1 < r->end && (r->p[1] == '=' || r->p[1] == '!'))) {
                return fail(r, SD_EINVAL,
                            "lookahead and lookbehind ((?=, (?!, (?<=, (?<!) are not supported");
            } else if (at(r, '<')) { /* a named group: a group */
                const unsigned char *q = r->p + 1;
                while (q < r->end && (*q == '_' || *q == '$' || ((*q | 0x20) >= 'a' && (*q | 0x20) <= 'z') ||
                                      (q > r->p + 1 && *q >= '0' && *q <= '9')))
                    q++;
                if (q == r->p + 1 || q >= r->end || *q != '>')
                    return fail(r, SD_EINVAL, "a group name must be (?<name>...)");
                r->p = q + 1;
            } else {
                return fail(r, SD_EINVAL, "the group (?%.1s is not supported",
                            r->p < r->end ? (const char *)r->p : "");
            }
        }
        if (++r->groups > MAX_GROUPS)
            return fail(r, SD_EINVAL, "groups nest deeper than %d", MAX_GROUPS);
        const int g = parse_alt(r);
        r->groups--;
        if (g < 0)
            return -1;
        if (!at(r, ')'))
            return fail(r, SD_EINVAL, "a '(' without its ')'");
        r->p++;
        return g;
    }
    case ')': return fail(r, SD_EINVAL, "a ')' without its '('");
    case '*':
    case '+':
    case '?': return fail(r, SD_EINVAL, "'%c' with nothing to repeat", c);
    case '{':
    case '}':
    case ']': return fail(r, SD_EINVAL, "a lone '%c' (escape it: \\%c)", c, c);
    case '\\': {
        const int k = escape(r, 0, &ch, &s);
        if (k < 0)
            return -1;
        if (!k)
            cs_add(&s, ch);
        return new_set(r, &s);
    }
    default:
        if (c >= 0x80)
            return fail(r, SD_EINVAL, "non-ASCII characters are not supported in a pattern");
        cs_add(&s, c);
        return new_set(r, &s);
    }
}

/* digits at p: their value (at most SD_JRE_MAX_REP + 1), or -1 none */
static int32_t rep_count(rp *r)
{
    int32_t v = -1;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*r->p++ - '0');
        v = v > SD_JRE_MAX_REP ? SD_JRE_MAX_REP + 1 : v;
    }
    return v;
}

/* an atom and its quantifiers */
static int parse_rep(rp *r)
{
    const int anchor = at(r, '^') || at(r, '$'); /* (a group of one may repeat) */
    int x = parse_atom(r);
    while (x >= 0 && r->p < r->end && strchr("*+?{", *r->p)) {
        const unsigned char q = *r->p++;
        int32_t lo = q == '+', hi = q == '?' ? 1 : -1;
        if (q == '{') {
            lo = rep_count(r);
            hi = lo;
            if (at(r, ',')) {
                r->p++;
                hi = rep_count(r);
            }
            if (lo < 0 || !at(r, '}'))
                return fail(r, SD_EINVAL, "a '{' that is not a repetition {n}, {n,} or {n,m} (escape it: \\{)");
            r->p++;
            if (lo > SD_JRE_MAX_REP || hi > SD_JRE_MAX_REP)
                return fail(r, SD_EINVAL, "a repetition count above %d", SD_JRE_MAX_REP);
            if (hi >= 0 && hi < lo)
                return fail(r, SD_EINVAL, "the repetition {%d,%d} is out of order", lo, hi);
        }
        if (anchor)
            return fail(r, SD_EINVAL, "an anchor (^, $) with a quantifier");
        if (at(r, '?')) /* lazy: the same strings match */
            r->p++;
        if (r->p < r->end && strchr("*+?{", *r->p))
            return fail(r, SD_EINVAL, "a quantifier after a quantifier (e.g. a*+)");
        const int y = new_rnode(r, R_REP, x, -1);
        if (y < 0)
            return -1;
        r->node[y].min = lo;
        r->node[y].max = hi;
        x = y;
    }
    return x;
}

static int parse_cat(rp *r)
{
    int x = -1;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        const int y = parse_rep(r);
        if (y < 0)
            return -1;
        x = x < 0 ? y : new_rnode(r, R_CAT, x, y);
        if (x < 0)
            return -1;
    }
    return x < 0 ? new_rnode(r, R_EMPTY, -1, -1) : x;
}

static int parse_alt(rp *r)
{
    int x = parse_cat(r);
    while (x >= 0 && at(r, '|')) {
        r->p++;
        const int y = parse_cat(r);
        x = y < 0 ? -1 : new_rnode(r, R_ALT, x, y);
    }
    return x;
}

/* ---- the NFA (Thompson's), the pattern searched for ---------------------- */

enum { N_CHAR, N_SPLIT, N_EPS, N_BOL, N_EOL, N_MATCH };

typedef struct nst {
    uint8_t kind;
    uint32_t set;      /* N_CHAR */
    int32_t out, out1; /* out1: N_SPLIT's second */
} nst;

typedef struct nfa {
    nst *st; /* MAX_NFA of them */
    uint32_t n;
    rp *r;
} nfa;

static int nfa_new(nfa *f, uint8_t kind, uint32_t set, int32_t out, int32_t out1)
{
    if (f->n >= MAX_NFA)
        return fail(f->r, SD_EINVAL, "the pattern is too large (its repetitions expand past %d states)",
                    MAX_NFA);
    f->st[f->n] = (nst){kind, set, out, out1};
    return (int)f->n++;
}

/* the states of tree node x: entry *s, and *e, an N_EPS whose out is
 * left to set; -1 too large */
static int emit(nfa *f, int x, int *s, int *e)
{
    const rnode nd = f->r->node[x];
    int s1, e1, s2, e2;
    switch (nd.kind) {
    case R_SET:
    case R_BOL:
    case R_EOL: {
        static const uint8_t KIND[] = {[R_SET] = N_CHAR, [R_BOL] = N_BOL, [R_EOL] = N_EOL};
        if ((*e = nfa_new(f, N_EPS, 0, -1, -1)) < 0 ||
            (*s = nfa_new(f, KIND[nd.kind], nd.set, *e, -1)) < 0)
            return -1;
        return 0;
    }
    case R_EMPTY: *s = *e = nfa_new(f, N_EPS, 0, -1, -1); return *s < 0 ? -1 : 0;
    case R_CAT:
        if (emit(f, nd.a, &s1, &e1) || emit(f, nd.b, &s2, &e2))
            return -1;
        f->st[e1].out = s2;
        *s = s1, *e = e2;
        return 0;
    case R_ALT:
        if (emit(f, nd.a, &s1, &e1) || emit(f, nd.b, &s2, &e2) ||
            (*e = nfa_new(f, N_EPS, 0, -1, -1)) < 0 || (*s = nfa_new(f, N_SPLIT, 0, s1, s2)) < 0)
            return -1;
        f->st[e1].out = f->st[e2].out = *e;
        return 0;
    default: { /* R_REP: min copies, then a loop, or max - min optional ones */
        const int exit_ = nfa_new(f, N_EPS, 0, -1, -1);
        int start = -1, end = -1; /* the chain so far: its entry, its open end */
        if (exit_ < 0)
            return -1;
        const int32_t n = nd.max < 0 ? nd.min + 1 : nd.max;
        for (int32_t i = 0; i < n; i++) {
            int sp = -1;
            if (i >= nd.min && (sp = nfa_new(f, N_SPLIT, 0, -1, exit_)) < 0)
                return -1;
            if (emit(f, nd.a, &s1, &e1))
                return -1;
            if (sp >= 0)
                f->st[sp].out = s1;
            const int in = sp >= 0 ? sp : s1;
            if (end >= 0)
                f->st[end].out = in;
            else
                start = in;
            end = e1;
            if (nd.max < 0 && sp >= 0) { /* the loop back; its split leads out */
                f->st[e1].out = sp;
                end = -1;
            }
        }
        if (end >= 0)
            f->st[end].out = exit_;
        *s = start >= 0 ? start : exit_;
        *e = exit_;
        return 0;
    }
    }
}

/* ---- the DFA (subsets of the NFA's states) ----------------------------- */

typedef struct sub {
    const nfa *f;
    uint32_t nw;      /* words of a set of NFA states */
    uint64_t *seen;   /* (nw) states visited by a closure */
    int32_t *stack;   /* (MAX_NFA) */
    uint64_t work;    /* words and states touched (rp.work at most) */
} sub;

/* adds to set the closure of state x: the character, pending $ and match
 * states it reaches through empty moves (^ followed where at the start, $
 * where at the end) */
static void closure(sub *c, uint64_t *set, int32_t x, int at_start, int at_end)
{
    uint32_t sp = 0;
    if (x < 0 || (c->seen[x >> 6] >> (x & 63) & 1))
        return;
    c->seen[x >> 6] |= (uint64_t)1 << (x & 63);
    c->stack[sp++] = x;
    while (sp) {
        c->work++;
        const nst *s = &c->f->st[c->stack[--sp]];
        const int32_t id = c->stack[sp];
        int32_t to[2] = {-1, -1};
        switch (s->kind) {
        case N_CHAR:
        case N_MATCH: set[id >> 6] |= (uint64_t)1 << (id & 63); break;
        case N_EOL:
            if (at_end)
                to[0] = s->out;
            else
                set[id >> 6] |= (uint64_t)1 << (id & 63);
            break;
        case N_BOL: to[0] = at_start ? s->out : -1; break;
        case N_SPLIT: to[0] = s->out, to[1] = s->out1; break;
        default: to[0] = s->out; break;
        }
        for (int k = 0; k < 2; k++) {
            const int32_t y = to[k];
            if (y >= 0 && !(c->seen[y >> 6] >> (y & 63) & 1)) {
                c->seen[y >> 6] |= (uint64_t)1 << (y & 63);
                c->stack[sp++] = y;
            }
        }
    }
}

/* does the set accept where the string ends (its $ states followed) */
static int set_accepts(sub *c, const uint64_t *set, int at_start, uint64_t *tmp)
{
    memset(c->seen, 0, c->nw * sizeof *c->seen);
    memset(tmp, 0, c->nw * sizeof *tmp);
    for (uint32_t w = 0; w < c->nw; w++)
        for (uint64_t b = set[w]; b; b &= b - 1) {
            const int32_t x = (int32_t)(w * 64 + (uint32_t)__builtin_ctzll(b));
            const nst *s = &c->f->st[x];
            if (s->kind == N_MATCH)
                return 1;
            if (s->kind == N_EOL)
                closure(c, tmp, s->out, at_start, 1);
        }
    for (uint32_t w = 0; w < c->nw; w++)
        for (uint64_t b = tmp[w]; b; b &= b - 1)
            if (c->f->st[w * 64 + (uint32_t)__builtin_ctzll(b)].kind == N_MATCH)
                return 1;
    return 0;
}

static uint64_t hash_set(const uint64_t *s, uint32_t nw)
{
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (uint32_t i = 0; i < nw; i++)
        h = (h ^ s[i]) * 0x100000001b3u, h ^= h >> 29;
    return h;
}

/* the symbols' classes: symbols no set tells apart share one */
static void partition(const rp *r, sd__jre *re)
{
    memset(re->cls, 0, sizeof re->cls);
    int n = 1;
    for (uint32_t i = 0; i < r->nset; i++) {
        int map[2][SD_JRE_NSYM];
        memset(map, -1, sizeof map);
        int m = 0;
        for (int y = 0; y < SD_JRE_NSYM; y++) {
            int *to = &map[cs_has(&r->set[i], y)][re->cls[y]];
            if (*to < 0)
                *to = m++;
            re->cls[y] = (uint8_t)*to;
        }
        n = m;
    }
    re->nclass = (uint16_t)n;
}

#define HASH_SLOTS 8192 /* > 2 SD_JRE_MAX_STATES */

/* Numbers the live states of a DFA of n states (next: (n, nc), a move to
 * a state that is not live is one to the dead state) in id, merging the
 * states no string tells apart (Moore's refinement: blocks of states that
 * accept alike, split until every class moves a block's states into one
 * block), the start's block first (id 0); returns the states kept. A
 * pattern's subset construction leaves such twins (a|ab|ac: one state for
 * each of b and c; a search's states that differ only in a started match
 * the text can no longer complete), and each is a state json_schema's
 * masks and their cache tell apart. Where the refinement would pass the
 * work the pattern has left, the live states are kept as they are. slot:
 * HASH_SLOTS of scratch. */
#define MIN_NONE 0xffffu
static uint32_t minimise(sub *c, const rp *r, const uint16_t *next, const uint8_t *acc,
                         const uint8_t *live, uint32_t n, uint32_t nc, int32_t *slot, uint16_t *id)
{
    uint16_t *blk = malloc(n * sizeof *blk), *nb = malloc(n * sizeof *nb);
    uint32_t nblk = 0, keep = 0;
    int done = 0; /* the refinement ran to its end */
    for (uint32_t q = 0; q < n; q++)
        keep += live[q];
    if (blk && nb) {
        /* the block of a move's target (MIN_NONE: the dead state) */
#define MIN_TO(b, q, k)                                                                             \
    (next[(q) * nc + (k)] == SD_JRE_DEAD || !live[next[(q) * nc + (k)]] ? MIN_NONE                  \
                                                                           : (b)[next[(q) * nc + (k)]])
        for (uint32_t q = 0; q < n; q++)
            blk[q] = live[q] ? acc[q] : MIN_NONE;
        for (uint32_t prev = 0;;) {
            const uint64_t cost = (uint64_t)keep * (nc + 2);
            if (c->work + cost > r->work) /* (left as they are) */
                break;
            c->work += cost;
            for (int i = 0; i < HASH_SLOTS; i++)
                slot[i] = -1;
            nblk = 0;
            for (uint32_t q = 0; q < n; q++) {
                if (!live[q]) {
                    nb[q] = MIN_NONE;
                    continue;
                }
                uint64_t h = blk[q] * 0x9e3779b97f4a7c15ull;
                for (uint32_t k = 0; k < nc; k++)
                    h = (h ^ MIN_TO(blk, q, k)) * 0x100000001b3ull;
                uint32_t i = (uint32_t)(h >> 32) & (HASH_SLOTS - 1);
                for (;; i = (i + 1) & (HASH_SLOTS - 1)) {
                    if (slot[i] < 0) {
                        slot[i] = (int32_t)q;
                        nb[q] = (uint16_t)nblk++;
                        break;
                    }
                    const uint32_t p = (uint32_t)slot[i];
                    int same = blk[p] == blk[q];
                    for (uint32_t k = 0; k < nc && same; k++)
                        same = MIN_TO(blk, p, k) == MIN_TO(blk, q, k);
                    if (same) {
                        nb[q] = nb[p];
                        break;
                    }
                }
            }
            memcpy(blk, nb, n * sizeof *blk);
            if ((done = nblk == prev)) /* (a split splits no more) */
                break;
            prev = nblk;
        }
#undef MIN_TO
    }
    if (done) {
        /* the start's block first, then in order of their first state */
        for (uint32_t b = 0; b < nblk; b++)
            nb[b] = MIN_NONE;
        uint32_t m = 0;
        nb[blk[0]] = (uint16_t)m++;
        for (uint32_t q = 0; q < n; q++)
            if (live[q] && nb[blk[q]] == MIN_NONE)
                nb[blk[q]] = (uint16_t)m++;
        for (uint32_t q = 0; q < n; q++)
            id[q] = live[q] ? nb[blk[q]] : SD_JRE_DEAD;
    } else {
        nblk = 0;
        for (uint32_t q = 0; q < n; q++)
            id[q] = live[q] ? (uint16_t)nblk++ : SD_JRE_DEAD;
    }
    free(blk);
    free(nb);
    return nblk;
}

static int build_dfa(rp *r, nfa *f, int32_t start, sd__jre *re)
{
    sub c = {.f = f, .nw = (f->n + 63) / 64};
    partition(r, re);
    const uint32_t nc = re->nclass;
    int rep[SD_JRE_NSYM];
    for (int y = SD_JRE_NSYM - 1; y >= 0; y--)
        rep[re->cls[y]] = y;
    uint64_t *sets = malloc((size_t)SD_JRE_MAX_STATES * c.nw * sizeof *sets);
    uint64_t *tmp = malloc(c.nw * sizeof *tmp);
    c.seen = malloc(c.nw * sizeof *c.seen);
    c.stack = malloc(MAX_NFA * sizeof *c.stack);
    int32_t *slot = malloc(HASH_SLOTS * sizeof *slot);
    uint16_t *next = malloc((size_t)SD_JRE_MAX_STATES * nc * sizeof *next);
    uint8_t *acc = calloc(SD_JRE_MAX_STATES, 1), *live = calloc(SD_JRE_MAX_STATES, 1);
    uint16_t *id = malloc(SD_JRE_MAX_STATES * sizeof *id);
    int rc = 0;
    if (!sets || !tmp || !c.seen || !c.stack || !slot || !next || !acc || !live || !id) {
        rc = fail(r, SD_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < HASH_SLOTS; i++)
        slot[i] = -1;
    /* the start: not shared with a later state (^ holds there alone) */
    uint32_t n = 1;
    memset(sets, 0, c.nw * sizeof *sets);
    memset(c.seen, 0, c.nw * sizeof *c.seen);
    closure(&c, sets, start, 1, 0);
    for (uint32_t q = 0; q < n; q++) {
        for (uint32_t k = 0; k < nc; k++) {
            uint64_t *t = sets + (size_t)n * c.nw; /* (the next free one, as scratch) */
            if (n == SD_JRE_MAX_STATES)
                t = tmp;
            memset(t, 0, c.nw * sizeof *t);
            memset(c.seen, 0, c.nw * sizeof *c.seen);
            const uint64_t *from = sets + (size_t)q * c.nw;
            c.work += 4 * (uint64_t)c.nw; /* (the clears, the scan, the test, the hash) */
            if (c.work > r->work) {
                rc = fail(r, SD_EINVAL, "the pattern is too large to compile (its automaton, "
                                        "with the schema's other patterns, takes more than %u "
                                        "steps to build)", SD_JRE_MAX_WORK);
                goto out;
            }
            for (uint32_t w = 0; w < c.nw; w++)
                for (uint64_t b = from[w]; b; b &= b - 1) {
                    const nst *s = &f->st[w * 64 + (uint32_t)__builtin_ctzll(b)];
                    if (s->kind == N_CHAR && cs_has(&r->set[s->set], rep[k]))
                        closure(&c, t, s->out, 0, 0);
                }
            int empty = 1;
            for (uint32_t w = 0; w < c.nw; w++)
                empty &= t[w] == 0;
            if (empty) {
                next[q * nc + k] = SD_JRE_DEAD;
                continue;
            }
            uint32_t h = (uint32_t)hash_set(t, c.nw) & (HASH_SLOTS - 1);
            while (slot[h] >= 0 && memcmp(sets + (size_t)slot[h] * c.nw, t, c.nw * sizeof *t))
                h = (h + 1) & (HASH_SLOTS - 1);
            if (slot[h] < 0) {
                if (n == SD_JRE_MAX_STATES) {
                    rc = fail(r, SD_EINVAL, "the pattern needs more than %d automaton states",
                              SD_JRE_MAX_STATES);
                    goto out;
                }
                slot[h] = (int32_t)n++;
            }
            next[q * nc + k] = (uint16_t)slot[h];
        }
    }
    for (uint32_t q = 0; q < n; q++)
        acc[q] = (uint8_t)set_accepts(&c, sets + (size_t)q * c.nw, q == 0, tmp);
    /* the states a string can still end accepted from */
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t q = 0; q < n; q++) {
            if (live[q])
                continue;
            int l = acc[q];
            for (uint32_t k = 0; k < nc && !l; k++)
                l = next[q * nc + k] != SD_JRE_DEAD && live[next[q * nc + k]];
            if (l)
                live[q] = 1, changed = 1;
        }
    }
    if (!live[0]) {
        rc = fail(r, SD_EINVAL, "the pattern matches no string");
        goto out;
    }
    const uint32_t m = minimise(&c, r, next, acc, live, n, nc, slot, id);
    re->nstate = (uint16_t)m;
    re->next = malloc((size_t)m * nc * sizeof *re->next);
    re->acc = malloc(m);
    re->cmask = calloc((size_t)nc * 3, sizeof *re->cmask);
    if (!re->next || !re->acc || !re->cmask) {
        rc = fail(r, SD_ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t q = 0; q < n; q++) {
        if (!live[q]) /* (a state merged with another writes the same row; a move to
                       * a state not live is to SD_JRE_DEAD, its id) */
            continue;
        re->acc[id[q]] = acc[q];
        for (uint32_t k = 0; k < nc; k++) {
            const uint16_t t = next[q * nc + k];
            re->next[(size_t)id[q] * nc + k] = t == SD_JRE_DEAD ? SD_JRE_DEAD : id[t];
        }
    }
    for (int y = 0; y < SD_JRE_NSYM; y++)
        re->cmask[re->cls[y] * 3 + (y >> 6)] |= (uint64_t)1 << (y & 63);
out:
    r->work -= c.work < r->work ? c.work : r->work;
    free(sets);
    free(tmp);
    free(c.seen);
    free(c.stack);
    free(slot);
    free(next);
    free(acc);
    free(live);
    free(id);
    return rc ? -1 : 0;
}

void sd__jre_free(sd__jre *re)
{
    free(re->cmask);
    free(re->next);
    free(re->acc);
    free(re->len);
    memset(re, 0, sizeof *re);
}

int sd__jre_compile(const char *pat, size_t n, uint64_t *work, sd__jre *re, char *why,
                    size_t cap)
{
    memset(re, 0, sizeof *re);
    rp r = {.p = (const unsigned char *)pat, .end = (const unsigned char *)pat + n, .why = why,
            .cap = cap, .work = work ? *work : SD_JRE_MAX_WORK};
    if (n > SD_JRE_MAX_LEN) {
        snprintf(why, cap, "a pattern longer than %d bytes", SD_JRE_MAX_LEN);
        return SD_EINVAL;
    }
    nfa f = {.st = malloc(MAX_NFA * sizeof *f.st), .r = &r};
    int x = f.st ? parse_alt(&r) : fail(&r, SD_ENOMEM, "out of memory");
    if (x >= 0 && r.p < r.end)
        x = fail(&r, SD_EINVAL, "a ')' without its '('");
    /* any text, the pattern, any text: a search */
    const cset all = cs_all();
    const int any = x >= 0 ? new_set(&r, &all) : -1;
    int32_t s0 = -1, ps, pe;
    if (any >= 0 && !emit(&f, x, &ps, &pe)) {
        const uint32_t set = r.node[any].set;
        const int32_t m = nfa_new(&f, N_MATCH, 0, -1, -1), fin = nfa_new(&f, N_SPLIT, 0, -1, m),
                      c1 = nfa_new(&f, N_CHAR, set, fin, -1);
        s0 = nfa_new(&f, N_SPLIT, 0, -1, ps);
        const int32_t c0 = nfa_new(&f, N_CHAR, set, s0, -1);
        if (m >= 0 && fin >= 0 && c1 >= 0 && s0 >= 0 && c0 >= 0) {
            f.st[fin].out = c1;
            f.st[pe].out = fin;
            f.st[s0].out = c0;
        } else {
            s0 = -1;
        }
    }
    if (s0 >= 0)
        build_dfa(&r, &f, s0, re);
    if (work)
        *work = r.work;
    free(f.st);
    free(r.node);
    free(r.set);
    if (r.rc)
        sd__jre_free(re);
    return r.rc;
}

/* ---- lengths -------------------------------------------------------------
 * R_0 is the accepting states, R_(n+1) those with a move into R_n: a
 * function of R_n alone, so the sequence repeats once a set comes again. */

#define LEN_BUDGET (1u << 20) /* states times lengths kept */

int sd__jre_lengths(sd__jre *re, char *why, size_t cap)
{
    const uint32_t ns = re->nstate, nc = re->nclass, nw = (ns + 63) / 64;
    const uint32_t max_layers = LEN_BUDGET / ns;
    uint64_t *layer = malloc((size_t)max_layers * nw * sizeof *layer);
    int32_t *slot = malloc(2 * (size_t)max_layers * sizeof *slot);
    if (!layer || !slot) {
        free(layer);
        free(slot);
        return SD_ENOMEM;
    }
    const uint32_t nslot = 2 * max_layers;
    for (uint32_t i = 0; i < nslot; i++)
        slot[i] = -1;
    memset(layer, 0, nw * sizeof *layer);
    for (uint32_t q = 0; q < ns; q++)
        if (re->acc[q])
            layer[q >> 6] |= (uint64_t)1 << (q & 63);
    int32_t t = -1;
    uint32_t j = 0;
    for (;; j++) {
        const uint64_t *cur = layer + (size_t)j * nw;
        uint32_t h = (uint32_t)(hash_set(cur, nw) % nslot);
        while (slot[h] >= 0 && memcmp(layer + (size_t)slot[h] * nw, cur, nw * sizeof *cur))
            h = (h + 1) % nslot;
        if (slot[h] >= 0) {
            t = slot[h];
            break;
        }
        slot[h] = (int32_t)j;
        if (j + 1 >= max_layers) {
            free(layer);
            free(slot);
            snprintf(why, cap,
                     "the lengths of the pattern's matches repeat only past %u code points (with "
                     "minLength/maxLength)",
                     max_layers);
            return SD_EINVAL;
        }
        uint64_t *nx = layer + (size_t)(j + 1) * nw;
        memset(nx, 0, nw * sizeof *nx);
        for (uint32_t q = 0; q < ns; q++)
            for (uint32_t k = 0; k < nc; k++) {
                const uint16_t y = re->next[(size_t)q * nc + k];
                if (y != SD_JRE_DEAD && (cur[y >> 6] >> (y & 63) & 1)) {
                    nx[q >> 6] |= (uint64_t)1 << (q & 63);
                    break;
                }
            }
    }
    free(slot);
    /* R_j = R_t: lengths from t on repeat with period j - t */
    const uint32_t lt = (uint32_t)t, lp = j - (uint32_t)t, w = lt + lp;
    re->len = malloc((size_t)ns * w * sizeof *re->len);
    if (!re->len) {
        free(layer);
        return SD_ENOMEM;
    }
    re->lt = lt, re->lp = lp;
    for (uint32_t q = 0; q < ns; q++) {
        /* backwards from two periods past t: each m's least n >= m */
        uint32_t best = UINT32_MAX;
        for (uint32_t m = lt + 2 * lp; m-- > 0;) {
            const uint32_t l = m < w ? m : lt + (m - lt) % lp;
            if (layer[(size_t)l * nw + (q >> 6)] >> (q & 63) & 1)
                best = m;
            if (m < w)
                re->len[(size_t)q * w + m] = best;
        }
    }
    free(layer);
    return 0;
}

uint64_t sd__jre_next_len(const sd__jre *re, uint16_t q, uint64_t m)
{
    const uint32_t w = re->lt + re->lp;
    if (m < w) {
        const uint32_t v = re->len[(size_t)q * w + m];
        return v == UINT32_MAX ? SD_JRE_NO_LEN : v;
    }
    /* past t: m's place in the period, shifted back */
    const uint64_t r = re->lt + (m - re->lt) % re->lp;
    const uint32_t v = re->len[(size_t)q * w + r];
    return v == UINT32_MAX ? SD_JRE_NO_LEN : v + (m - r);
}

int sd__jre_match(const sd__jre *re, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    uint16_t q = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = p[i];
        int k = cp < 0x80 ? 0 : cp < 0xe0 ? 1 : cp < 0xf0 ? 2 : 3;
        cp &= k ? 0x3fu >> k : 0x7f;
        for (i++; k > 0 && i < n; k--, i++)
            cp = cp << 6 | (p[i] & 0x3f);
        q = re->next[(size_t)q * re->nclass + re->cls[sd__jre_sym(cp)]];
        if (q == SD_JRE_DEAD)
            return 0;
    }
    return re->acc[q];
}

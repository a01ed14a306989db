/* core/tok_encode: text -> ids. The order of the stages is HF's
 * (TokenizerImpl::encode_single_sequence):
 *   1. repair ill-formed UTF-8 (U+FFFD per maximal subpart)
 *   2. split out added tokens whose normalized == false (leftmost-longest)
 *   3. normalize each remaining piece, then split out the normalized == true ones
 *   4. pre-tokenize each piece (Split / ByteLevel steps refine a list of spans)
 *   5. BPE each span: lowest merge rank first, ties to the left, with a binary heap
 *      over a linked list of symbols (HF's Word::merge_all), so O(k log k) a word. */
#include <stdio.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "core/tok_internal.h"

/* ---- maps ---------------------------------------------------------------------- */

static int strmap_rehash(sd__strmap *m, uint32_t cap)
{
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return -1;
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = (uint32_t)m->ent[e].hash & (cap - 1);
        while (slot[i])
            i = (i + 1) & (cap - 1);
        slot[i] = e + 1;
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

int sd__strmap_put(sd__strmap *m, const char *k, size_t len, int32_t val, int overwrite)
{
    if (len > UINT32_MAX || (m->n + 1) * 2 > m->cap) {
        if (len > UINT32_MAX || strmap_rehash(m, m->cap ? m->cap * 2 : 256))
            return -1;
    }
    if (sd_sbuf_reserve(&m->pool, len))
        return -1;
    uint64_t h = sd__hash(k, len);
    uint32_t i = (uint32_t)h & (m->cap - 1);
    while (m->slot[i]) {
        sd__strent *e = &m->ent[m->slot[i] - 1];
        if (e->hash == h && e->len == len && !memcmp(m->pool.p + e->off, k, len)) {
            if (overwrite)
                e->val = val;
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    if (m->n == m->ncap) {
        uint32_t nc = m->ncap ? m->ncap * 2 : 256;
        sd__strent *ne = realloc(m->ent, (size_t)nc * sizeof *ne);
        if (!ne)
            return -1;
        m->ent = ne;
        m->ncap = nc;
    }
    if (m->pool.len + len > UINT32_MAX)
        return -1;
    sd__strent *e = &m->ent[m->n];
    e->hash = h;
    e->off = (uint32_t)m->pool.len;
    e->len = (uint32_t)len;
    e->val = val;
    if (sd_sbuf_put(&m->pool, k, len))
        return -1;
    m->slot[i] = ++m->n;
    return 0;
}

int32_t sd__strmap_get(const sd__strmap *m, const char *k, size_t len)
{
    if (!m->cap)
        return -1;
    uint64_t h = sd__hash(k, len);
    uint32_t i = (uint32_t)h & (m->cap - 1);
    while (m->slot[i]) {
        const sd__strent *e = &m->ent[m->slot[i] - 1];
        if (e->hash == h && e->len == len && !memcmp(m->pool.p + e->off, k, len))
            return e->val;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void sd__strmap_free(sd__strmap *m)
{
    free(m->slot);
    free(m->ent);
    sd_sbuf_free(&m->pool);
    memset(m, 0, sizeof *m);
}

static int pairmap_rehash(sd__pairmap *m, uint32_t cap)
{
    sd__pairent *t = malloc((size_t)cap * sizeof *t);
    if (!t)
        return -1;
    for (uint32_t i = 0; i < cap; i++)
        t[i].key = UINT64_MAX;
    for (uint32_t j = 0; j < m->cap; j++) {
        if (m->t[j].key == UINT64_MAX)
            continue;
        uint64_t h = m->t[j].key * 0x9E3779B97F4A7C15ull;
        uint32_t i = (uint32_t)(h >> 32) & (cap - 1);
        while (t[i].key != UINT64_MAX)
            i = (i + 1) & (cap - 1);
        t[i] = m->t[j];
    }
    free(m->t);
    m->t = t;
    m->cap = cap;
    return 0;
}

int sd__pairmap_put(sd__pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->n + 1) * 2 > m->cap && pairmap_rehash(m, m->cap ? m->cap * 2 : 1024))
        return -1;
    uint64_t k = sd__pairkey(a, b);
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    uint32_t mask = m->cap - 1, i = (uint32_t)(h >> 32) & mask;
    while (m->t[i].key != UINT64_MAX && m->t[i].key != k)
        i = (i + 1) & mask;
    if (m->t[i].key == UINT64_MAX)
        m->n++;
    m->t[i].key = k;
    m->t[i].rank = rank;
    m->t[i].id = id;
    return 0;
}

void sd__pairmap_free(sd__pairmap *m)
{
    free(m->t);
    memset(m, 0, sizeof *m);
}

/* ---- Oniguruma pattern -> PCRE2 ----------------------------------------------- */

/* The Unicode White_Space set as class items (Oniguruma's \s). */
static const char WS_ITEMS[] = "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}"
                               "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

/* 1 if \p{sc:name} compiles, i.e. name is a script (PCRE2 reads a bare script name
 * as Script_Extensions, Oniguruma as Script). */
static int is_script_name(const char *name, size_t n)
{
    char buf[96];
    if (n == 0 || n > 64 || memchr(name, ':', n) || memchr(name, '=', n))
        return 0;
    int len = snprintf(buf, sizeof buf, "\\p{sc:%.*s}", (int)n, name);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, (PCRE2_SIZE)len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re)
        return 0;
    pcre2_code_free(re);
    return 1;
}

typedef struct retr {
    const char *p;
    size_t n, i;
    sd_sbuf *out;
    const char *why; /* set when the pattern uses something we refuse */
} retr;

static int put(retr *r, const char *s, size_t n) { return sd_sbuf_put(r->out, s, n); }
static int puts_(retr *r, const char *s) { return sd_sbuf_put(r->out, s, strlen(s)); }

/* Translates one escape at r->i (r->p[r->i] == '\\'). in_class: inside [...]. */
static int tr_escape(retr *r, int in_class)
{
    const char *p = r->p;
    size_t i = r->i;
    if (i + 1 >= r->n) { /* trailing backslash: let PCRE2 report it */
        r->i = r->n;
        return put(r, "\\", 1);
    }
    char c = p[i + 1];
    if (c == 's' || c == 'S') {
        r->i = i + 2;
        if (in_class) {
            if (c == 'S') {
                r->why = "\\S inside a character class";
                return 0;
            }
            return puts_(r, WS_ITEMS);
        }
        return puts_(r, c == 's' ? "[" : "[^") || puts_(r, WS_ITEMS) || puts_(r, "]");
    }
    if (c == 'h' || c == 'H') { /* Oniguruma (Ruby syntax): hex digit */
        r->i = i + 2;
        if (in_class) {
            if (c == 'H') {
                r->why = "\\H inside a character class";
                return 0;
            }
            return puts_(r, "0-9a-fA-F");
        }
        return puts_(r, c == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]");
    }
    if (c == 'u' && i + 6 <= r->n) { /* \uHHHH */
        int ok = 1;
        for (int k = 2; k < 6; k++) {
            char h = p[i + k];
            ok &= (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
        }
        if (ok) {
            r->i = i + 6;
            return puts_(r, "\\x{") || put(r, p + i + 2, 4) || puts_(r, "}");
        }
    }
    if ((c == 'p' || c == 'P') && i + 2 < r->n && p[i + 2] == '{') {
        const char *end = memchr(p + i + 3, '}', r->n - (i + 3));
        if (end) {
            const char *name = p + i + 3;
            size_t nl = (size_t)(end - name);
            int neg = nl > 0 && name[0] == '^';
            if (neg) {
                name++;
                nl--;
            }
            r->i = (size_t)(end - p) + 1;
            if (put(r, p + i, 3) || (neg && put(r, "^", 1)))
                return -1;
            if (is_script_name(name, nl) && puts_(r, "sc:"))
                return -1;
            return put(r, name, nl) || put(r, "}", 1);
        }
    }
    /* Any other escape: copy the backslash and the whole next character. */
    size_t clen = 1;
    unsigned char b = (unsigned char)c;
    if (b >= 0xC0)
        clen = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (i + 1 + clen > r->n)
        clen = r->n - i - 1;
    r->i = i + 1 + clen;
    return put(r, p + i, 1 + clen);
}

/* The end (index of the closing ']') of the class opening at r->p[start] == '['. */
static size_t class_end(const char *p, size_t n, size_t start)
{
    size_t i = start + 1;
    if (i < n && p[i] == '^')
        i++;
    if (i < n && p[i] == ']')
        i++; /* a leading ']' is literal */
    int depth = 1;
    while (i < n) {
        if (p[i] == '\\') {
            i += 2;
            continue;
        }
        if (p[i] == '[') {
            if (i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
                const char *e = strstr(p + i + 2, ":]");
                if (e && (size_t)(e - p) < n) {
                    i = (size_t)(e - p) + 2;
                    continue;
                }
            }
            depth++;
        } else if (p[i] == ']') {
            if (--depth == 0)
                return i;
        }
        i++;
    }
    return n;
}

/* Copies class items p[a..b) translating escapes; nested classes are copied
 * with their escapes translated too. */
static int tr_class_items(retr *r, size_t a, size_t b)
{
    size_t save_n = r->n;
    r->n = b;
    r->i = a;
    while (r->i < b) {
        if (r->p[r->i] == '\\') {
            if (tr_escape(r, 1))
                return -1;
            if (r->why)
                break;
        } else {
            if (put(r, r->p + r->i, 1))
                return -1;
            r->i++;
        }
    }
    r->n = save_n;
    return 0;
}

static int tr_class(retr *r)
{
    const char *p = r->p;
    size_t start = r->i, end = class_end(p, r->n, start);
    if (end >= r->n) { /* unterminated: let PCRE2 report it */
        int rc = put(r, p + start, r->n - start);
        r->i = r->n;
        return rc;
    }
    size_t body = start + 1;
    int neg = p[body] == '^';
    /* Find a top-level "&&". */
    size_t amp = 0;
    for (size_t i = body + neg; i < end; i++) {
        if (p[i] == '\\') {
            i++;
            continue;
        }
        if (p[i] == '[') {
            i = class_end(p, end + 1, i);
            continue;
        }
        if (p[i] == '&' && i + 1 < end && p[i + 1] == '&') {
            amp = i;
            break;
        }
    }
    if (!amp) {
        if (put(r, "[", 1) || (neg && put(r, "^", 1)) || tr_class_items(r, body + neg, end) ||
            put(r, "]", 1))
            return -1;
        r->i = end + 1;
        return 0;
    }
    /* Only [A&&[^B]] (Kimi-K2's form): (?:(?![B])[A]). */
    size_t rb = amp + 2;
    if (neg || rb + 2 >= end || p[rb] != '[' || p[rb + 1] != '^' || class_end(p, end + 1, rb) != end - 1) {
        r->why = "a character-class intersection other than [A&&[^B]]";
        r->i = r->n;
        return 0;
    }
    if (puts_(r, "(?:(?![") || tr_class_items(r, rb + 2, end - 1) || puts_(r, "])[") ||
        tr_class_items(r, body, amp) || puts_(r, "])"))
        return -1;
    r->i = end + 1;
    return 0;
}

pcre2_code *sd__re_compile(const char *pat, size_t len, int literal, const char *what, sd_err *err)
{
    sd_sbuf out = {0};
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (literal) {
        opts = PCRE2_UTF | PCRE2_LITERAL; /* PCRE2 refuses UCP beside LITERAL; it changes nothing there */
        if (sd_sbuf_put(&out, pat, len)) {
            sd_err_set(err, SD_ENOMEM, "%s: out of memory", what);
            return NULL;
        }
    } else {
        retr r = {pat, len, 0, &out, NULL};
        int rc = 0;
        while (!rc && !r.why && r.i < r.n) {
            char c = pat[r.i];
            if (c == '\\')
                rc = tr_escape(&r, 0);
            else if (c == '[')
                rc = tr_class(&r);
            else {
                rc = put(&r, pat + r.i, 1);
                r.i++;
            }
        }
        if (rc || r.why) {
            sd_sbuf_free(&out);
            if (rc)
                sd_err_set(err, SD_ENOMEM, "%s: out of memory", what);
            else
                sd_err_set(err, SD_ENOTSUP, "%s: the regex uses %s, which is not supported", what, r.why);
            return NULL;
        }
        if (!out.p && sd_sbuf_reserve(&out, 0)) {
            sd_err_set(err, SD_ENOMEM, "%s: out of memory", what);
            return NULL;
        }
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)out.p, out.len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        sd_err_set(err, SD_EFORMAT, "%s: regex does not compile (PCRE2: %s at offset %zu of \"%s\")", what,
                   (char *)msg, (size_t)eo, out.p);
        sd_sbuf_free(&out);
        return NULL;
    }
    sd_sbuf_free(&out);
    /* JIT is an optimization: the interpreter gives the same matches if it fails. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* ---- encode context ------------------------------------------------------------- */

typedef struct sym {
    int32_t id, prev, next;
    uint32_t len; /* bytes covered; 0 once merged into its left neighbour */
} sym;

typedef struct hent {
    int32_t rank, pos, id;
} hent;

typedef struct wcent {
    uint32_t off, n; /* ids in wc_ids */
} wcent;

typedef struct ectx {
    const sd_tokenizer *t;
    sd_err *err;
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* with a large JIT stack, made on first need */
    pcre2_jit_stack *jit;
    int32_t *ids;
    size_t n_ids, cap_ids;
    sym *sy;
    size_t cap_sy;
    hent *hp;
    size_t n_hp, cap_hp;
    sd_sbuf nbuf;  /* normalized piece */
    sd_sbuf *pbuf; /* per pre-tokenizer step: a piece with its prefix space */
    sd_sbuf unit;  /* scratch for one BPE unit string */
    /* Words seen in this call -> their ids. Per call, so the tokenizer stays
     * immutable and shareable between threads; natural text repeats its words. */
    sd__strmap wc;
    wcent *wc_ent;
    size_t n_wc, cap_wc;
    int32_t *wc_ids;
    size_t n_wc_ids, cap_wc_ids;
} ectx;

static int oom(ectx *c) { return sd_err_set(c->err, SD_ENOMEM, "tokenizer: out of memory while encoding"); }

static int push_id(ectx *c, int32_t id)
{
    if (c->n_ids == c->cap_ids) {
        size_t cap = c->cap_ids ? c->cap_ids * 2 : 256;
        int32_t *v = realloc(c->ids, cap * sizeof *v);
        if (!v)
            return oom(c);
        c->ids = v;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = id;
    return 0;
}

static void ectx_free(ectx *c)
{
    if (c->md)
        pcre2_match_data_free(c->md);
    if (c->mctx)
        pcre2_match_context_free(c->mctx);
    if (c->jit)
        pcre2_jit_stack_free(c->jit);
    free(c->ids);
    free(c->sy);
    free(c->hp);
    sd_sbuf_free(&c->nbuf);
    if (c->pbuf)
        for (int k = 0; k < c->t->n_pre; k++)
            sd_sbuf_free(&c->pbuf[k]);
    free(c->pbuf);
    sd_sbuf_free(&c->unit);
    sd__strmap_free(&c->wc);
    free(c->wc_ent);
    free(c->wc_ids);
}

/* One regex search; 1 match, 0 none, <0 error. */
static int re_find(ectx *c, const pcre2_code *re, const char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    if (!c->md) {
        c->md = pcre2_match_data_create(8, NULL);
        if (!c->md)
            return oom(c);
    }
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jit) {
        /* Deep backtracking on a long span: retry with a 64 MiB JIT stack. */
        c->jit = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        c->mctx = pcre2_match_context_create(NULL);
        if (!c->jit || !c->mctx)
            return oom(c);
        pcre2_jit_stack_assign(c->mctx, NULL, c->jit);
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return sd_err_set(c->err, SD_EINVAL, "tokenizer regex failed on the input: %s", (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* ---- normalizers ---------------------------------------------------------------- */

static int uc_is_mark(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

/* One step from in to out (out emptied first). */
int sd__norm_step(const sd__norm *st, const char *in, size_t n, sd_sbuf *out, sd_err *err)
{
    out->len = 0;
    switch (st->kind) {
    case SD__N_NFC:
    case SD__N_NFD:
    case SD__N_NFKC:
    case SD__N_NFKD: {
        int o = UTF8PROC_STABLE;
        o |= (st->kind == SD__N_NFC || st->kind == SD__N_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (st->kind == SD__N_NFKC || st->kind == SD__N_NFKD)
            o |= UTF8PROC_COMPAT;
        /* An ASCII character never changes, never reorders (it is a starter) and is
         * never the second half of a composition, so the text splits before each one
         * without changing the result: only the non-ASCII stretches, each with the
         * ASCII character before it (which may compose with them), go to utf8proc. */
        size_t i = 0;
        while (i < n) {
            size_t j = i;
            while (j < n && (unsigned char)in[j] < 0x80)
                j++;
            if (j == n) {
                if (sd_sbuf_put(out, in + i, n - i))
                    return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
                break;
            }
            size_t rs = j > i ? j - 1 : j, k = j;
            while (k < n && (unsigned char)in[k] >= 0x80)
                k++;
            if (sd_sbuf_put(out, in + i, rs - i))
                return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in + rs, (utf8proc_ssize_t)(k - rs), &dst,
                                              (utf8proc_option_t)o);
            if (r < 0) {
                free(dst);
                return sd_err_set(err, r == UTF8PROC_ERROR_NOMEM ? SD_ENOMEM : SD_EINVAL,
                                  "tokenizer normalizer: %s", utf8proc_errmsg(r));
            }
            int rc = sd_sbuf_put(out, dst, (size_t)r);
            free(dst);
            if (rc)
                return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
            i = k;
        }
        return 0;
    }
    case SD__N_LOWER:
    case SD__N_STRIP_ACCENTS: {
        /* at most 3 output bytes per input byte (U+0130 -> i + U+0307: 2 -> 3) */
        if (sd_sbuf_reserve(out, 3 * n / 2 + 8))
            return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
        const unsigned char *p = (const unsigned char *)in;
        char *w = out->p;
        for (size_t i = 0; i < n;) {
            if (p[i] < 0x80) {
                *w++ = (char)(st->kind == SD__N_LOWER && p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
                i++;
                continue;
            }
            uint32_t cp;
            size_t l;
            sd_utf8_next(p + i, n - i, &cp, &l); /* input is valid UTF-8 */
            if (st->kind == SD__N_STRIP_ACCENTS) {
                if (!uc_is_mark(cp))
                    w += sd_utf8_encode(cp, w);
            } else if (cp == 0x130) {
                /* Rust's char::to_lowercase: the one unconditional multi-char mapping. */
                w += sd_utf8_encode('i', w);
                w += sd_utf8_encode(0x307, w);
            } else {
                w += sd_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), w);
            }
            i += l;
        }
        out->len = (size_t)(w - out->p);
        out->p[out->len] = 0;
        return 0;
    }
    case SD__N_PREPEND:
        if (n && sd_sbuf_put(out, st->s, st->slen))
            return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
        break;
    case SD__N_STRIP: {
        size_t a = 0, b = n;
        const unsigned char *p = (const unsigned char *)in;
        if (st->left) {
            while (a < b) {
                uint32_t cp;
                size_t l;
                sd_utf8_next(p + a, b - a, &cp, &l);
                if (!sd_uc_white_space(cp))
                    break;
                a += l;
            }
        }
        if (st->right) {
            while (b > a) {
                size_t k = b - 1;
                while (k > a && (p[k] & 0xC0) == 0x80)
                    k--;
                uint32_t cp;
                size_t l;
                sd_utf8_next(p + k, b - k, &cp, &l);
                if (!sd_uc_white_space(cp))
                    break;
                b = k;
            }
        }
        if (sd_sbuf_put(out, in + a, b - a))
            return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
        return 0;
    }
    case SD__N_REPLACE_STR:
    case SD__N_REPLACE_RE:
        break; /* handled below */
    }
    if (st->kind == SD__N_REPLACE_STR) {
        size_t i = 0;
        while (i < n) {
            const char *hit = st->slen ? memmem(in + i, n - i, st->s, st->slen) : NULL;
            size_t stop = hit ? (size_t)(hit - in) : n;
            if (sd_sbuf_put(out, in + i, stop - i) || (hit && sd_sbuf_put(out, st->s2, st->s2len)))
                return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
            i = hit ? stop + st->slen : n;
        }
        return 0;
    }
    if (st->kind == SD__N_REPLACE_RE) {
        ectx c = {0};
        c.err = err;
        size_t i = 0, from = 0;
        for (;;) {
            size_t ms, me;
            int rc = re_find(&c, st->re, in, n, from, &ms, &me);
            if (rc < 0) {
                ectx_free(&c);
                return rc;
            }
            if (rc == 0)
                break;
            if (sd_sbuf_put(out, in + i, ms - i) || sd_sbuf_put(out, st->s2, st->s2len)) {
                ectx_free(&c);
                return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
            }
            i = me;
            from = me;
            if (me == ms) { /* empty match: step over one character */
                uint32_t cp;
                size_t l = 1;
                if (me < n)
                    sd_utf8_next((const unsigned char *)in + me, n - me, &cp, &l);
                from = me + l;
            }
            if (from > n)
                break;
        }
        int rc = sd_sbuf_put(out, in + i, n - i);
        ectx_free(&c);
        if (rc)
            return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
        return 0;
    }
    /* PREPEND: the piece follows the prefix. */
    if (sd_sbuf_put(out, in, n))
        return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
    return 0;
}

int sd__normalize(const sd_tokenizer *t, const char *s, size_t n, sd_sbuf *out, sd_err *err)
{
    sd_sbuf tmp = {0};
    out->len = 0;
    if (sd_sbuf_put(out, s, n))
        return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
    for (int k = 0; k < t->n_norm; k++) {
        int rc = sd__norm_step(&t->norm[k], out->p, out->len, &tmp, err);
        if (rc) {
            sd_sbuf_free(&tmp);
            return rc;
        }
        sd_sbuf x = *out;
        *out = tmp;
        tmp = x;
    }
    sd_sbuf_free(&tmp);
    if (!out->p && sd_sbuf_reserve(out, 0))
        return sd_err_set(err, SD_ENOMEM, "tokenizer normalizer: out of memory");
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------ */

int sd__trie_add(sd__trie *tr, const char *s, size_t n, int32_t added)
{
    if (!tr->node) {
        tr->cap = 64;
        tr->node = malloc((size_t)tr->cap * sizeof *tr->node);
        if (!tr->node)
            return -1;
        tr->n = 1;
        tr->node[0] = (sd__trie_node){-1, -1, -1, 0};
        for (int i = 0; i < 256; i++)
            tr->root[i] = -1;
    }
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t ch = cur == 0 ? tr->root[b] : tr->node[cur].child;
        if (cur != 0)
            while (ch >= 0 && tr->node[ch].byte != b)
                ch = tr->node[ch].next;
        if (ch < 0) {
            if (tr->n == tr->cap) {
                int cap = tr->cap * 2;
                sd__trie_node *nn = realloc(tr->node, (size_t)cap * sizeof *nn);
                if (!nn)
                    return -1;
                tr->node = nn;
                tr->cap = cap;
            }
            ch = tr->n++;
            tr->node[ch] = (sd__trie_node){-1, -1, -1, b};
            if (cur == 0) {
                tr->root[b] = ch;
            } else {
                tr->node[ch].next = tr->node[cur].child;
                tr->node[cur].child = ch;
            }
        }
        cur = ch;
    }
    /* A duplicate content keeps its first token (the first pattern wins in HF's
     * automaton as well). */
    if (cur != 0 && tr->node[cur].added < 0)
        tr->node[cur].added = added;
    return 0;
}

void sd__trie_free(sd__trie *tr)
{
    free(tr->node);
    memset(tr, 0, sizeof *tr);
}

/* Longest pattern starting at s[0..n): its added index and length, or -1. */
static int32_t trie_longest(const sd__trie *tr, const unsigned char *s, size_t n, size_t *len)
{
    int32_t cur = tr->root[s[0]], best = -1;
    size_t i = 0;
    while (cur >= 0) {
        if (tr->node[cur].added >= 0) {
            best = tr->node[cur].added;
            *len = i + 1;
        }
        if (++i >= n)
            break;
        int32_t ch = tr->node[cur].child;
        while (ch >= 0 && tr->node[ch].byte != s[i])
            ch = tr->node[ch].next;
        cur = ch;
    }
    return best;
}

/* Rust regex \w (Unicode): Alphabetic, marks, decimal digits, connector punctuation,
 * join controls. Alphabetic outside letters and Nl is the circled/squared letters. */
static int uc_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
               (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
               (cp >= 0x1F170 && cp <= 0x1F189);
    }
}

/* The code point ending at s[0..n) (n > 0). */
static uint32_t last_cp(const unsigned char *s, size_t n)
{
    size_t k = n - 1;
    while (k > 0 && (s[k] & 0xC0) == 0x80 && n - k < 4)
        k--;
    uint32_t cp = 0xFFFD;
    size_t l;
    sd_utf8_next(s + k, n - k, &cp, &l);
    return cp;
}

typedef struct seg {
    size_t off, len;
    int32_t id; /* -1: text */
} seg;

typedef struct segv {
    seg *v;
    size_t n, cap;
} segv;

static int segv_push(segv *s, size_t off, size_t len, int32_t id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){off, len, id};
    return 0;
}

/* HF AddedVocabulary::find_matches: the pieces of s[0..n) between added tokens. */
static int split_added(const sd_tokenizer *t, const sd__trie *tr, const char *s, size_t n, segv *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t start_off = 0, pos = 0;
    out->n = 0;
    while (pos < n) {
        size_t mlen = 0, ms = pos;
        int32_t ai = -1;
        for (; ms < n; ms++) {
            if (tr->root[p[ms]] < 0)
                continue;
            ai = trie_longest(tr, p + ms, n - ms, &mlen);
            if (ai >= 0)
                break;
        }
        if (ai < 0)
            break;
        size_t me = ms + mlen;
        pos = me; /* the automaton resumes after the match, used or not */
        const sd__added *a = &t->added[ai];
        if (ms < start_off)
            continue; /* overlaps what an rstrip already took */
        if (a->single_word) {
            int start_space = ms == 0 || !uc_is_word(last_cp(p, ms));
            int stop_space = 1;
            if (me < n) {
                uint32_t cp = 0xFFFD;
                size_t l;
                sd_utf8_next(p + me, n - me, &cp, &l);
                stop_space = !uc_is_word(cp);
            }
            if (!start_space || !stop_space)
                continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t k = ms;
            while (k > 0) {
                size_t j = k - 1;
                while (j > 0 && (p[j] & 0xC0) == 0x80 && k - j < 4)
                    j--;
                uint32_t cp = 0;
                size_t l;
                sd_utf8_next(p + j, k - j, &cp, &l);
                if (!sd_uc_white_space(cp))
                    break;
                k = j;
            }
            start = k > start_off ? k : start_off;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp = 0;
                size_t l;
                sd_utf8_next(p + stop, n - stop, &cp, &l);
                if (!sd_uc_white_space(cp))
                    break;
                stop += l;
            }
        }
        if (start_off < start && segv_push(out, start_off, start - start_off, -1))
            return -1;
        if (segv_push(out, start, stop - start, a->id))
            return -1;
        start_off = stop;
    }
    if (start_off < n && segv_push(out, start_off, n - start_off, -1))
        return -1;
    return 0;
}

/* ---- BPE ------------------------------------------------------------------------- */

static int heap_push(ectx *c, int32_t rank, int32_t pos, int32_t id)
{
    if (c->n_hp == c->cap_hp) {
        size_t cap = c->cap_hp ? c->cap_hp * 2 : 64;
        hent *v = realloc(c->hp, cap * sizeof *v);
        if (!v)
            return oom(c);
        c->hp = v;
        c->cap_hp = cap;
    }
    size_t i = c->n_hp++;
    hent e = {rank, pos, id};
    while (i > 0) {
        size_t up = (i - 1) / 2;
        hent *u = &c->hp[up];
        if (u->rank < e.rank || (u->rank == e.rank && u->pos <= e.pos))
            break;
        c->hp[i] = *u;
        i = up;
    }
    c->hp[i] = e;
    return 0;
}

static hent heap_pop(ectx *c)
{
    hent top = c->hp[0], last = c->hp[--c->n_hp];
    size_t i = 0, n = c->n_hp;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const hent *best = &last;
        if (l < n && (c->hp[l].rank < best->rank || (c->hp[l].rank == best->rank && c->hp[l].pos < best->pos))) {
            m = l;
            best = &c->hp[l];
        }
        if (r < n && (c->hp[r].rank < best->rank || (c->hp[r].rank == best->rank && c->hp[r].pos < best->pos))) {
            m = r;
            best = &c->hp[r];
        }
        if (m == i)
            break;
        c->hp[i] = c->hp[m];
        i = m;
    }
    if (n)
        c->hp[i] = last;
    return top;
}

/* GPT-2's byte -> printable code point (bytes_to_unicode). */
static uint32_t bl_cp(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    unsigned k = 0; /* rank of b among the bytes that are remapped */
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            k++;
    return 256 + k;
}

typedef struct unk_state {
    int32_t id;
    uint32_t len;
} unk_state;

static int add_sym(ectx *c, size_t *ns, int32_t id, uint32_t len)
{
    if (*ns == c->cap_sy) {
        size_t cap = c->cap_sy ? c->cap_sy * 2 : 64;
        sym *v = realloc(c->sy, cap * sizeof *v);
        if (!v)
            return oom(c);
        c->sy = v;
        c->cap_sy = cap;
    }
    c->sy[*ns] = (sym){id, (int32_t)*ns - 1, -1, len};
    if (*ns > 0)
        c->sy[*ns - 1].next = (int32_t)*ns;
    (*ns)++;
    return 0;
}

/* A unit (one character of the word, as the model sees it) that the fast path did
 * not resolve: prefix/suffix, byte fallback, unk (HF BPE::merge_word). */
static int slow_unit(ectx *c, size_t *ns, unk_state *unk, const char *u, size_t ul, int first, int last,
                     uint32_t byte_len)
{
    const sd_tokenizer *t = c->t;
    c->unit.len = 0;
    if ((!first && t->cont_prefix && sd_sbuf_put(&c->unit, t->cont_prefix, t->cont_prefix_len)) ||
        sd_sbuf_put(&c->unit, u, ul) ||
        (last && t->eow_suffix && sd_sbuf_put(&c->unit, t->eow_suffix, t->eow_suffix_len)))
        return oom(c);
    int32_t id = sd__strmap_get(&t->vocab, c->unit.p, c->unit.len);
    if (id >= 0) {
        if (unk->id >= 0) {
            if (add_sym(c, ns, unk->id, unk->len))
                return -1;
            unk->id = -1;
        }
        return add_sym(c, ns, id, byte_len);
    }
    if (t->byte_fallback) {
        int all = 1;
        for (size_t i = 0; i < c->unit.len; i++)
            all &= t->byte_fb_id[(unsigned char)c->unit.p[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < c->unit.len; i++)
                if (add_sym(c, ns, t->byte_fb_id[(unsigned char)c->unit.p[i]], 1))
                    return -1;
            return 0;
        }
    }
    if (t->unk_id >= 0) {
        if (unk->id >= 0 && t->fuse_unk) {
            unk->len += byte_len;
        } else {
            if (unk->id >= 0 && add_sym(c, ns, unk->id, unk->len))
                return -1;
            unk->id = t->unk_id;
            unk->len = byte_len;
        }
    }
    return 0; /* no unk token: HF drops the character */
}

static int merge_short(ectx *c, size_t ns);
static int merge_long(ectx *c, size_t ns);

static int bpe_word(ectx *c, const char *w, size_t n)
{
    const sd_tokenizer *t = c->t;
    if (n == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = t->byte_level ? sd__strmap_get(&t->raw, w, n) : sd__strmap_get(&t->vocab, w, n);
        if (id >= 0)
            return push_id(c, id);
    }
    size_t ns = 0;
    unk_state unk = {-1, 0};
    const unsigned char *p = (const unsigned char *)w;
    int plain = !t->cont_prefix && !t->eow_suffix;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = plain ? t->byte_id[p[i]] : -1;
            if (id >= 0 && unk.id < 0) {
                if (add_sym(c, &ns, id, 1))
                    return -1;
                continue;
            }
            char u[4];
            int ul = sd_utf8_encode(bl_cp(p[i]), u);
            if (slow_unit(c, &ns, &unk, u, (size_t)ul, i == 0, i + 1 == n, 1))
                return -1;
        }
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l;
            sd_utf8_next(p + i, n - i, &cp, &l);
            int32_t id = plain && unk.id < 0 ? sd__strmap_get(&t->vocab, w + i, l) : -1;
            if (id >= 0) {
                if (add_sym(c, &ns, id, (uint32_t)l))
                    return -1;
            } else if (slow_unit(c, &ns, &unk, w + i, l, i == 0, i + l == n, (uint32_t)l)) {
                return -1;
            }
            i += l;
        }
    }
    if (unk.id >= 0 && add_sym(c, &ns, unk.id, unk.len))
        return -1;
    if (ns == 0)
        return 0;

    if (ns <= 64)
        return merge_short(c, ns);
    return merge_long(c, ns);
}

/* Merging: lowest rank first, ties to the leftmost pair, until no pair has a
 * merge. Short words keep the rank of each adjacent pair in an array and rescan
 * it (tiktoken's way: O(k^2) compares, O(k) lookups); long ones use HF's heap
 * over a linked list (Word::merge_all, O(k log k)). Both give HF's result. */
static int merge_short(ectx *c, size_t ns)
{
    const sd_tokenizer *t = c->t;
    int32_t id[64], rk[64], to[64];
    size_t n = 0;
    for (size_t i = 0; i < ns; i++)
        if (c->sy[i].len)
            id[n++] = c->sy[i].id;
    for (size_t i = 0; i + 1 < n; i++) {
        const sd__pairent *m = sd__pairmap_get(&t->merges, id[i], id[i + 1]);
        rk[i] = m ? m->rank : INT32_MAX;
        to[i] = m ? m->id : -1;
    }
    while (n > 1) {
        size_t b = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rk[i] < rk[b])
                b = i;
        if (rk[b] == INT32_MAX)
            break;
        id[b] = to[b];
        memmove(id + b + 1, id + b + 2, (n - b - 2) * sizeof *id);
        memmove(rk + b + 1, rk + b + 2, (n - b - 2) * sizeof *rk);
        memmove(to + b + 1, to + b + 2, (n - b - 2) * sizeof *to);
        n--;
        for (size_t i = b ? b - 1 : 0; i <= b && i + 1 < n; i++) {
            const sd__pairent *m = sd__pairmap_get(&t->merges, id[i], id[i + 1]);
            rk[i] = m ? m->rank : INT32_MAX;
            to[i] = m ? m->id : -1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (push_id(c, id[i]))
            return -1;
    return 0;
}

static int merge_long(ectx *c, size_t ns)
{
    const sd_tokenizer *t = c->t;
    sym *sy = c->sy;
    c->n_hp = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const sd__pairent *m = sd__pairmap_get(&t->merges, sy[i].id, sy[i + 1].id);
        if (m && heap_push(c, m->rank, (int32_t)i, m->id))
            return -1;
    }
    while (c->n_hp) {
        hent top = heap_pop(c);
        sym *s = &c->sy[top.pos];
        if (s->len == 0 || s->next < 0)
            continue;
        sym *r = &c->sy[s->next];
        const sd__pairent *m = sd__pairmap_get(&t->merges, s->id, r->id);
        if (!m || m->id != top.id)
            continue; /* stale entry */
        s->id = top.id;
        s->len += r->len;
        s->next = r->next;
        r->len = 0;
        if (s->next >= 0)
            c->sy[s->next].prev = top.pos;
        if (s->prev >= 0) {
            const sym *l = &c->sy[s->prev];
            const sd__pairent *ml = sd__pairmap_get(&t->merges, l->id, s->id);
            if (ml && heap_push(c, ml->rank, s->prev, ml->id))
                return -1;
        }
        if (s->next >= 0) {
            const sd__pairent *mr = sd__pairmap_get(&t->merges, s->id, c->sy[s->next].id);
            if (mr && heap_push(c, mr->rank, top.pos, mr->id))
                return -1;
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (c->sy[i].len && push_id(c, c->sy[i].id))
            return -1;
    return 0;
}

/* bpe_word through the call's word cache. */
static int encode_word(ectx *c, const char *w, size_t n)
{
    enum { MAX_WORD = 64, MAX_WORDS = 1 << 16 };
    if (n > MAX_WORD)
        return bpe_word(c, w, n);
    int32_t e = sd__strmap_get(&c->wc, w, n);
    if (e >= 0) {
        const wcent *we = &c->wc_ent[e];
        for (uint32_t i = 0; i < we->n; i++)
            if (push_id(c, c->wc_ids[we->off + i]))
                return -1;
        return 0;
    }
    size_t before = c->n_ids;
    int rc = bpe_word(c, w, n);
    if (rc || c->n_wc >= MAX_WORDS)
        return rc;
    size_t cnt = c->n_ids - before;
    if (c->n_wc == c->cap_wc) {
        size_t cap = c->cap_wc ? c->cap_wc * 2 : 256;
        wcent *v = realloc(c->wc_ent, cap * sizeof *v);
        if (!v)
            return oom(c);
        c->wc_ent = v;
        c->cap_wc = cap;
    }
    if (c->n_wc_ids + cnt > c->cap_wc_ids) {
        size_t cap = c->cap_wc_ids ? c->cap_wc_ids : 1024;
        while (cap < c->n_wc_ids + cnt)
            cap *= 2;
        int32_t *v = realloc(c->wc_ids, cap * sizeof *v);
        if (!v)
            return oom(c);
        c->wc_ids = v;
        c->cap_wc_ids = cap;
    }
    memcpy(c->wc_ids + c->n_wc_ids, c->ids + before, cnt * sizeof *c->ids);
    c->wc_ent[c->n_wc] = (wcent){(uint32_t)c->n_wc_ids, (uint32_t)cnt};
    if (sd__strmap_put(&c->wc, w, n, (int32_t)c->n_wc, 0) < 0)
        return oom(c);
    c->n_wc++;
    c->n_wc_ids += cnt;
    return 0;
}

/* ---- pre-tokenization ---------------------------------------------------------
 * Depth first: each piece a step makes goes through the next steps and BPE at once,
 * so a megabyte of text never becomes a megabyte-sized list of spans. */

static int pre_from(ectx *c, int k, const char *s, size_t n, int at0);

/* HF NormalizedString::split, streamed: the elements of one piece (gaps and
 * matches, in order) become pieces by behaviour. The last piece is held while the
 * next element may still extend it. */
typedef struct emitter {
    ectx *c;
    int k; /* the step splitting; pieces go to step k + 1 */
    const char *s;
    sd__split_behavior b;
    int has_pend, pend_match, prev_match;
    size_t pend_off, pend_len;
    int at0; /* s starts the input (HF: its original offset is 0) */
} emitter;

static int em_out(emitter *e, size_t off, size_t len)
{
    /* empty pieces are dropped */
    return len ? pre_from(e->c, e->k + 1, e->s + off, len, e->at0 && off == 0) : 0;
}

static int em_flush(emitter *e)
{
    if (!e->has_pend)
        return 0;
    e->has_pend = 0;
    return em_out(e, e->pend_off, e->pend_len);
}

static int em_hold(emitter *e, size_t off, size_t len, int is_match)
{
    int rc = em_flush(e);
    e->has_pend = 1;
    e->pend_off = off;
    e->pend_len = len;
    e->pend_match = is_match;
    return rc;
}

static int em_elem(emitter *e, size_t off, size_t len, int is_match)
{
    int rc = 0;
    switch (e->b) {
    case SD__SPLIT_ISOLATED:
        return em_out(e, off, len);
    case SD__SPLIT_REMOVED:
        return is_match ? 0 : em_out(e, off, len);
    case SD__SPLIT_CONTIGUOUS:
        if (e->has_pend && is_match == e->prev_match)
            e->pend_len = off + len - e->pend_off;
        else
            rc = em_hold(e, off, len, is_match);
        break;
    case SD__SPLIT_MERGED_PREV:
        if (e->has_pend && is_match && !e->prev_match)
            e->pend_len = off + len - e->pend_off;
        else
            rc = em_hold(e, off, len, is_match);
        break;
    case SD__SPLIT_MERGED_NEXT:
        /* HF folds right to left: a match followed by a non-match joins it */
        if (e->has_pend && !is_match) {
            e->pend_len = off + len - e->pend_off;
            rc = em_flush(e);
        } else if (is_match) {
            rc = em_hold(e, off, len, 1);
        } else {
            rc = em_flush(e);
            if (!rc)
                rc = em_out(e, off, len);
        }
        break;
    }
    e->prev_match = is_match;
    return rc;
}

/* Splits s[0..n) with step k's regex (HF find_matches: gaps and matches). */
static int split_piece(ectx *c, int k, const sd__pre *st, const char *s, size_t n, int at0)
{
    emitter e = {c, k, s, st->behavior, 0, 0, 0, 0, 0, at0};
    size_t from = 0, prev = 0, last_end = (size_t)-1;
    int inv = st->invert;
    while (from <= n) {
        size_t ms, me;
        int rc = re_find(c, st->re, s, n, from, &ms, &me);
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
        if (ms == me) {
            size_t step = 1;
            if (ms < n) {
                uint32_t cp;
                sd_utf8_next((const unsigned char *)s + ms, n - ms, &cp, &step);
            }
            from = me + step;
            if (me == last_end)
                continue; /* an empty match right after a match does not count */
        } else {
            from = me;
        }
        last_end = me;
        if (prev != ms && (rc = em_elem(&e, prev, ms - prev, inv)))
            return rc;
        if ((rc = em_elem(&e, ms, me - ms, !inv)))
            return rc;
        prev = me;
    }
    int rc = prev != n ? em_elem(&e, prev, n - prev, inv) : 0;
    return rc ? rc : em_flush(&e);
}

/* HF Metaspace: spaces become the replacement, which goes before a piece that
 * does not start with it where the scheme says (first: only the piece that
 * starts the input, not one after an added token); with split, pieces break
 * before each replacement (MergedWithNext). */
static int metaspace(ectx *c, int k, const sd__pre *st, const char *s, size_t n, int at0)
{
    sd_sbuf *b = &c->pbuf[k];
    b->len = 0;
    int starts = s[0] == ' ' || (n >= st->rep_len && !memcmp(s, st->rep, st->rep_len));
    if (!starts && (st->prepend == SD__PREPEND_ALWAYS || (st->prepend == SD__PREPEND_FIRST && at0)) &&
        sd_sbuf_put(b, st->rep, st->rep_len))
        return oom(c);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && s[j] != ' ')
            j++;
        if (sd_sbuf_put(b, s + i, j - i) || (j < n && sd_sbuf_put(b, st->rep, st->rep_len)))
            return oom(c);
        i = j + (j < n);
    }
    s = b->p;
    n = b->len;
    if (!st->split)
        return pre_from(c, k + 1, s, n, at0);
    emitter e = {c, k, s, SD__SPLIT_MERGED_NEXT, 0, 0, 0, 0, 0, at0};
    size_t prev = 0;
    for (size_t at = 0; at + st->rep_len <= n;) {
        const char *m = memmem(s + at, n - at, st->rep, st->rep_len);
        if (!m)
            break;
        size_t ms = (size_t)(m - s);
        int rc = (prev != ms ? em_elem(&e, prev, ms - prev, 0) : 0);
        if (rc || (rc = em_elem(&e, ms, st->rep_len, 1)))
            return rc;
        prev = at = ms + st->rep_len;
    }
    int rc = prev != n ? em_elem(&e, prev, n - prev, 0) : 0;
    return rc ? rc : em_flush(&e);
}

static int pre_from(ectx *c, int k, const char *s, size_t n, int at0)
{
    const sd_tokenizer *t = c->t;
    if (k == t->n_pre)
        return encode_word(c, s, n);
    const sd__pre *st = &t->pre[k];
    if (st->kind == SD__P_METASPACE)
        return metaspace(c, k, st, s, n, at0);
    if (st->kind == SD__P_BYTELEVEL && st->add_prefix_space && s[0] != ' ') {
        sd_sbuf *b = &c->pbuf[k];
        b->len = 0;
        if (sd_sbuf_putc(b, ' ') || sd_sbuf_put(b, s, n))
            return oom(c);
        s = b->p;
        n = b->len;
    }
    if (!st->re)
        return pre_from(c, k + 1, s, n, at0);
    return split_piece(c, k, st, s, n, at0);
}

/* at0: the piece starts the input (for Metaspace's prepend_scheme first) */
static int encode_piece(ectx *c, const char *s, size_t n, int at0)
{
    if (n == 0)
        return 0;
    if (!c->pbuf && c->t->n_pre) {
        c->pbuf = calloc((size_t)c->t->n_pre, sizeof *c->pbuf);
        if (!c->pbuf)
            return oom(c);
    }
    return pre_from(c, 0, s, n, at0);
}

/* A normalized piece: split out the normalized added tokens, encode the rest. */
static int encode_normalized(ectx *c, const char *s, size_t n, segv *tmp, int at0)
{
    const sd_tokenizer *t = c->t;
    if (!t->norm_trie.node)
        return encode_piece(c, s, n, at0);
    if (split_added(t, &t->norm_trie, s, n, tmp))
        return oom(c);
    for (size_t i = 0; i < tmp->n; i++) {
        int rc = tmp->v[i].id >= 0 ? push_id(c, tmp->v[i].id)
                                   : encode_piece(c, s + tmp->v[i].off, tmp->v[i].len, at0 && tmp->v[i].off == 0);
        if (rc)
            return rc;
    }
    return 0;
}

int sd_tok_encode(const sd_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids, int *n,
                  sd_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!text && len)
        return sd_err_set(err, SD_EINVAL, "sd_tok_encode: text is NULL");
    ectx c = {0};
    c.t = t;
    c.err = err;
    sd_sbuf fixed = {0};
    segv outer = {0}, inner = {0};
    int rc = 0;
    const char *s = text ? text : "";
    if (!sd_utf8_valid(s, len)) {
        if (sd_utf8_repair(&fixed, s, len, 1) == (size_t)-1) {
            rc = oom(&c);
            goto done;
        }
        s = fixed.p;
        len = fixed.len;
    }
    if (add_bos && t->bos >= 0 && (rc = push_id(&c, t->bos)))
        goto done;
    if (!t->raw_trie.node) {
        if (segv_push(&outer, 0, len, -1)) {
            rc = oom(&c);
            goto done;
        }
    } else if (split_added(t, &t->raw_trie, s, len, &outer)) {
        rc = oom(&c);
        goto done;
    }
    for (size_t i = 0; i < outer.n && !rc; i++) {
        const seg *g = &outer.v[i];
        if (g->id >= 0) {
            rc = push_id(&c, g->id);
        } else if (g->len == 0) {
            continue;
        } else if (t->n_norm) {
            rc = sd__normalize(t, s + g->off, g->len, &c.nbuf, err);
            if (!rc)
                rc = encode_normalized(&c, c.nbuf.p, c.nbuf.len, &inner, g->off == 0);
        } else {
            rc = encode_normalized(&c, s + g->off, g->len, &inner, g->off == 0);
        }
    }
    if (!rc && c.n_ids > (size_t)INT32_MAX)
        rc = sd_err_set(err, SD_ERANGE, "sd_tok_encode: more than 2^31 tokens");
done:
    if (!rc) {
        *ids = c.ids;
        *n = (int)c.n_ids;
        c.ids = NULL;
    }
    ectx_free(&c);
    sd_sbuf_free(&fixed);
    free(outer.v);
    free(inner.v);
    return rc;
}

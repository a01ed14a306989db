/* core/tokenizer: loading tokenizer.json, decoding, streaming detokenization.
 * Encoding lives in tok_encode.c. */
#include "core/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tok_internal.h"
#include "core/util.h"

/* Ids beyond this are refused at load: real vocabularies stay under 2^18, and a
 * corrupt file must not make us allocate gigabytes. */
#define MAX_ID (1 << 24)

/* ---- JSON helpers ------------------------------------------------------------------ */

typedef struct ld {
    sd_tokenizer *t;
    sd_err *err;
    const char *file; /* for messages */
} ld;

/* 1: string (s, n set); 0: absent or null; -1: another type (error set). */
static int jstr(ld *L, const json_t *o, const char *key, const char *where, const char **s, size_t *n)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v)) {
        sd_err_set(L->err, SD_EFORMAT, "%s: %s.%s must be a string", L->file, where, key);
        return -1;
    }
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 1;
}

static int jbool(const json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static const char *jtype(const json_t *o)
{
    json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static int nomem(ld *L) { return sd_err_set(L->err, SD_ENOMEM, "%s: out of memory", L->file); }

/* s[0..n) is exactly one well-formed character */
static int one_char(const char *s, size_t n)
{
    uint32_t cp;
    size_t cl;
    return n && sd_utf8_next((const unsigned char *)s, n, &cp, &cl) == SD_UTF8_OK && cl == n;
}

/* A {"String": s} / {"Regex": r} pattern. */
static int jpattern(ld *L, const json_t *o, const char *where, pcre2_code **re, char **lit, size_t *litlen)
{
    json_t *p = json_object_get(o, "pattern");
    const char *s;
    size_t n;
    char what[256];
    if (json_is_object(p)) {
        json_t *rx = json_object_get(p, "Regex"), *st = json_object_get(p, "String");
        snprintf(what, sizeof what, "%s: %s.pattern", L->file, where);
        if (json_is_string(rx)) {
            *re = sd__re_compile(json_string_value(rx), json_string_length(rx), 0, what, L->err);
            return *re ? 0 : L->err->code;
        }
        if (json_is_string(st)) {
            s = json_string_value(st);
            n = json_string_length(st);
            if (lit) {
                *lit = dupn(s, n);
                *litlen = n;
                return *lit ? 0 : nomem(L);
            }
            *re = sd__re_compile(s, n, 1, what, L->err);
            return *re ? 0 : L->err->code;
        }
    }
    return sd_err_set(L->err, SD_EFORMAT, "%s: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", L->file,
                      where);
}

/* ---- normalizer ---------------------------------------------------------------- */

static int add_norm(ld *L, sd__norm st)
{
    sd_tokenizer *t = L->t;
    sd__norm *v = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *v);
    if (!v)
        return nomem(L);
    t->norm = v;
    t->norm[t->n_norm++] = st;
    return 0;
}

static int load_normalizer(ld *L, const json_t *o, const char *where)
{
    if (!o || json_is_null(o))
        return 0;
    const char *ty = jtype(o);
    if (!json_is_object(o) || !ty)
        return sd_err_set(L->err, SD_EFORMAT, "%s: %s must be an object with a \"type\"", L->file, where);
    sd__norm st = {0};
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a))
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.normalizers must be an array", L->file, where);
        for (size_t i = 0; i < json_array_size(a); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            int rc = load_normalizer(L, json_array_get(a, i), w);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "NFC"))
        st.kind = SD__N_NFC;
    else if (!strcmp(ty, "NFD"))
        st.kind = SD__N_NFD;
    else if (!strcmp(ty, "NFKC"))
        st.kind = SD__N_NFKC;
    else if (!strcmp(ty, "NFKD"))
        st.kind = SD__N_NFKD;
    else if (!strcmp(ty, "Lowercase"))
        st.kind = SD__N_LOWER;
    else if (!strcmp(ty, "StripAccents"))
        st.kind = SD__N_STRIP_ACCENTS;
    else if (!strcmp(ty, "Strip")) {
        st.kind = SD__N_STRIP;
        st.left = jbool(o, "strip_left", 1);
        st.right = jbool(o, "strip_right", 1);
    } else if (!strcmp(ty, "Prepend")) {
        const char *s;
        size_t n;
        int r = jstr(L, o, "prepend", where, &s, &n);
        if (r < 0)
            return L->err->code;
        if (r == 0)
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s (Prepend) has no \"prepend\"", L->file, where);
        st.kind = SD__N_PREPEND;
        st.s = dupn(s, n);
        st.slen = n;
        if (!st.s)
            return nomem(L);
    } else if (!strcmp(ty, "Replace")) {
        const char *s;
        size_t n;
        int r = jstr(L, o, "content", where, &s, &n);
        if (r <= 0)
            return r < 0 ? L->err->code
                         : sd_err_set(L->err, SD_EFORMAT, "%s: %s (Replace) has no \"content\"", L->file, where);
        st.s2 = dupn(s, n);
        st.s2len = n;
        if (!st.s2)
            return nomem(L);
        int rc = jpattern(L, o, where, &st.re, &st.s, &st.slen);
        if (rc) {
            free(st.s2);
            return rc;
        }
        st.kind = st.re ? SD__N_REPLACE_RE : SD__N_REPLACE_STR;
    } else {
        return sd_err_set(L->err, SD_ENOTSUP,
                          "%s: %s: normalizer type %s is not supported (supported: NFC, NFD, NFKC, NFKD, "
                          "Lowercase, Prepend, Replace, Strip, StripAccents, Sequence)",
                          L->file, where, ty);
    }
    int rc = add_norm(L, st);
    if (rc) {
        free(st.s);
        free(st.s2);
        if (st.re)
            pcre2_code_free(st.re);
    }
    return rc;
}

/* ---- pre-tokenizer ---------------------------------------------------------------- */

/* GPT-2's pattern (ByteLevel with use_regex), as HF ships it. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pre(ld *L, sd__pre st)
{
    sd_tokenizer *t = L->t;
    sd__pre *v = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *v);
    if (!v) {
        if (st.re)
            pcre2_code_free(st.re);
        return nomem(L);
    }
    t->pre = v;
    t->pre[t->n_pre++] = st;
    return 0;
}

static int load_pretok(ld *L, const json_t *o, const char *where)
{
    if (!o || json_is_null(o))
        return 0;
    const char *ty = jtype(o);
    if (!json_is_object(o) || !ty)
        return sd_err_set(L->err, SD_EFORMAT, "%s: %s must be an object with a \"type\"", L->file, where);
    sd_tokenizer *t = L->t;
    if (t->n_pre && t->pre[t->n_pre - 1].kind == SD__P_BYTELEVEL)
        return sd_err_set(L->err, SD_ENOTSUP,
                          "%s: %s: a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)",
                          L->file, where);
    sd__pre st = {0};
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a))
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.pretokenizers must be an array", L->file, where);
        for (size_t i = 0; i < json_array_size(a); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
            int rc = load_pretok(L, json_array_get(a, i), w);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        st.kind = SD__P_BYTELEVEL;
        st.add_prefix_space = jbool(o, "add_prefix_space", 1);
        st.behavior = SD__SPLIT_ISOLATED;
        if (jbool(o, "use_regex", 1)) {
            char what[256];
            snprintf(what, sizeof what, "%s: %s (GPT-2 pattern)", L->file, where);
            st.re = sd__re_compile(GPT2_RE, sizeof GPT2_RE - 1, 0, what, L->err);
            if (!st.re)
                return L->err->code;
        }
        t->byte_level = 1;
        return add_pre(L, st);
    }
    if (!strcmp(ty, "Split")) {
        st.kind = SD__P_SPLIT;
        int rc = jpattern(L, o, where, &st.re, NULL, NULL);
        if (rc)
            return rc;
        st.invert = jbool(o, "invert", 0);
        json_t *b = json_object_get(o, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        static const struct {
            const char *name;
            sd__split_behavior b;
        } B[] = {{"Removed", SD__SPLIT_REMOVED},
                 {"Isolated", SD__SPLIT_ISOLATED},
                 {"MergedWithPrevious", SD__SPLIT_MERGED_PREV},
                 {"MergedWithNext", SD__SPLIT_MERGED_NEXT},
                 {"Contiguous", SD__SPLIT_CONTIGUOUS}};
        size_t k = 0;
        while (k < SD_ARRAY_LEN(B) && strcmp(B[k].name, bs))
            k++;
        if (k == SD_ARRAY_LEN(B)) {
            pcre2_code_free(st.re);
            return sd_err_set(L->err, SD_EFORMAT,
                              "%s: %s.behavior '%s' is not one of Removed, Isolated, MergedWithPrevious, "
                              "MergedWithNext, Contiguous",
                              L->file, where, bs);
        }
        st.behavior = B[k].b;
        return add_pre(L, st);
    }
    if (!strcmp(ty, "Metaspace")) {
        /* HF Metaspace: replacement (one character), prepend_scheme always /
         * first / never (older files: add_prefix_space, true = always), split */
        st.kind = SD__P_METASPACE;
        const char *r = "\xe2\x96\x81", *ps = NULL; /* U+2581 */
        size_t rn = 3, psn = 0;
        int got = jstr(L, o, "replacement", where, &r, &rn);
        if (got < 0 || (got = jstr(L, o, "prepend_scheme", where, &ps, &psn)) < 0)
            return L->err->code;
        if (!one_char(r, rn))
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.replacement must be one character", L->file, where);
        if (!ps)
            st.prepend = jbool(o, "add_prefix_space", 1) ? SD__PREPEND_ALWAYS : SD__PREPEND_NEVER;
        else if (!strcmp(ps, "always"))
            st.prepend = SD__PREPEND_ALWAYS;
        else if (!strcmp(ps, "first"))
            st.prepend = SD__PREPEND_FIRST;
        else if (!strcmp(ps, "never"))
            st.prepend = SD__PREPEND_NEVER;
        else
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.prepend_scheme '%s' is not one of always, first, never",
                              L->file, where, ps);
        st.split = jbool(o, "split", 1);
        if (!(st.rep = dupn(r, rn)))
            return nomem(L);
        st.rep_len = rn;
        int rc = add_pre(L, st);
        if (rc)
            free(st.rep);
        return rc;
    }
    return sd_err_set(L->err, SD_ENOTSUP,
                      "%s: %s: pre-tokenizer type %s is not supported (supported: Split, ByteLevel, Metaspace, "
                      "Sequence)",
                      L->file, where, ty);
}

/* ---- decoder ----------------------------------------------------------------------- */

enum { DS_REPLACE, DS_BYTELEVEL, DS_BYTEFALLBACK, DS_STRIP };
typedef struct dstep {
    int kind;   /* DS_* */
    sd__norm rep;
    int start, stop; /* DS_STRIP: at most this many characters rep.s2 off each end */
} dstep;

typedef struct dsteps {
    dstep v[16];
    int n;
    int fused; /* a Fuse was seen: only Fuse may follow */
    int bytelevel;
} dsteps;

static int load_decoder(ld *L, const json_t *o, const char *where, dsteps *d)
{
    const char *ty = jtype(o);
    if (!json_is_object(o) || !ty)
        return sd_err_set(L->err, SD_EFORMAT, "%s: %s must be an object with a \"type\"", L->file, where);
    if (!strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a))
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.decoders must be an array", L->file, where);
        for (size_t i = 0; i < json_array_size(a); i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.decoders[%zu]", where, i);
            int rc = load_decoder(L, json_array_get(a, i), w, d);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "Fuse")) {
        d->fused = 1;
        return 0;
    }
    int is_bl = !strcmp(ty, "ByteLevel"), is_rep = !strcmp(ty, "Replace"), is_bf = !strcmp(ty, "ByteFallback"),
        is_strip = !strcmp(ty, "Strip");
    if (!is_bl && !is_rep && !is_bf && !is_strip)
        return sd_err_set(L->err, SD_ENOTSUP,
                          "%s: %s: decoder type %s is not supported (supported: ByteLevel, Replace, ByteFallback, "
                          "Strip, Fuse, Sequence)",
                          L->file, where, ty);
    int start = 0, stop = 0;
    const char *c = NULL;
    size_t cn = 0;
    if (is_strip) {
        json_t *js = json_object_get(o, "start"), *je = json_object_get(o, "stop");
        int r = jstr(L, o, "content", where, &c, &cn);
        if (r < 0)
            return L->err->code;
        if (!r || !one_char(c, cn) ||
            (js && (!json_is_integer(js) || json_integer_value(js) < 0 || json_integer_value(js) > 1024)) ||
            (je && (!json_is_integer(je) || json_integer_value(je) < 0 || json_integer_value(je) > 1024)))
            return sd_err_set(L->err, SD_EFORMAT,
                              "%s: %s (Strip) needs a one-character \"content\" and counts \"start\" / \"stop\" "
                              "in [0, 1024]",
                              L->file, where);
        start = js ? (int)json_integer_value(js) : 0;
        stop = je ? (int)json_integer_value(je) : 0;
        if (d->fused) {
            /* after Fuse the decode is one string: its start is stripped (and
             * a stream's); its end is not known while streaming */
            if (stop)
                return sd_err_set(L->err, SD_ENOTSUP,
                                  "%s: %s: a Strip of the end (stop %d) after Fuse is not supported", L->file,
                                  where, stop);
            if (L->t->dec_strip)
                return sd_err_set(L->err, SD_ENOTSUP, "%s: %s: two Strip decoders after Fuse", L->file, where);
            L->t->dec_strip = start;
            memcpy(L->t->dec_strip_c, c, cn);
            L->t->dec_strip_clen = cn;
            return 0;
        }
    }
    /* The others act per token only before the tokens are fused into one
     * string; after that they would see token boundaries disappear. */
    if (d->fused || d->bytelevel || d->n == (int)SD_ARRAY_LEN(d->v))
        return sd_err_set(L->err, SD_ENOTSUP,
                          "%s: %s: decoder %s after ByteLevel or Fuse is not supported", L->file, where, ty);
    dstep *s = &d->v[d->n];
    memset(s, 0, sizeof *s);
    if (is_bl) {
        s->kind = DS_BYTELEVEL;
        d->bytelevel = 1;
        d->n++;
        return 0;
    }
    if (is_bf) {
        s->kind = DS_BYTEFALLBACK;
        L->t->dec_per_byte = 1;
        d->n++;
        return 0;
    }
    if (is_strip) {
        s->kind = DS_STRIP;
        s->start = start;
        s->stop = stop;
        if (!(s->rep.s2 = dupn(c, cn)))
            return nomem(L);
        s->rep.s2len = cn;
        d->n++;
        return 0;
    }
    s->kind = DS_REPLACE;
    int r = jstr(L, o, "content", where, &c, &cn);
    if (r <= 0)
        return r < 0 ? L->err->code : sd_err_set(L->err, SD_EFORMAT, "%s: %s (Replace) has no \"content\"", L->file, where);
    s->rep.s2 = dupn(c, cn);
    s->rep.s2len = cn;
    if (!s->rep.s2)
        return nomem(L);
    int rc = jpattern(L, o, where, &s->rep.re, &s->rep.s, &s->rep.slen);
    if (rc) {
        free(s->rep.s2);
        return rc;
    }
    s->rep.kind = s->rep.re ? SD__N_REPLACE_RE : SD__N_REPLACE_STR;
    d->n++;
    return 0;
}

static void dsteps_free(dsteps *d)
{
    for (int i = 0; i < d->n; i++) {
        free(d->v[i].rep.s);
        free(d->v[i].rep.s2);
        if (d->v[i].rep.re)
            pcre2_code_free(d->v[i].rep.re);
    }
}

/* ---- byte-level maps --------------------------------------------------------------- */

static int bl_kept(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

void sd__bl_tables(uint32_t b2c[256], uint16_t c2b[0x144])
{
    unsigned n = 0;
    memset(c2b, 0, 0x144 * sizeof c2b[0]);
    for (unsigned b = 0; b < 256; b++) {
        b2c[b] = bl_kept(b) ? b : 256 + n++;
        c2b[b2c[b]] = (uint16_t)(b + 1);
    }
}

/* s as byte-level characters -> raw bytes; 0 if some character is not a byte's. */
static int bl_unmap(const uint16_t c2b[0x144], const char *s, size_t n, sd_sbuf *out)
{
    out->len = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l;
        if (sd_utf8_next(p + i, n - i, &cp, &l) != SD_UTF8_OK || cp >= 0x144 || !c2b[cp])
            return 0;
        char b = (char)(c2b[cp] - 1);
        if (sd_sbuf_put(out, &b, 1))
            return -1;
        i += l;
    }
    return 1;
}

/* ---- model ------------------------------------------------------------------------- */

static int load_model(ld *L, const json_t *m)
{
    sd_tokenizer *t = L->t;
    if (!json_is_object(m))
        return sd_err_set(L->err, SD_EFORMAT, "%s: no \"model\" object", L->file);
    const char *ty = jtype(m);
    json_t *merges = json_object_get(m, "merges");
    if (!ty && merges)
        ty = "BPE";
    if (!ty)
        return sd_err_set(L->err, SD_EFORMAT, "%s: model has no \"type\"", L->file);
    if (strcmp(ty, "BPE"))
        return sd_err_set(L->err, SD_ENOTSUP, "%s: model type %s is not supported (specd reads BPE models only)",
                          L->file, ty);
    json_t *dropout = json_object_get(m, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return sd_err_set(L->err, SD_ENOTSUP, "%s: model.dropout %g makes encoding random; not supported", L->file,
                          json_number_value(dropout));
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);
    const char *s;
    size_t n;
    int r = jstr(L, m, "continuing_subword_prefix", "model", &s, &n);
    if (r < 0)
        return L->err->code;
    if (r && n) {
        if (!(t->cont_prefix = dupn(s, n)))
            return nomem(L);
        t->cont_prefix_len = n;
    }
    r = jstr(L, m, "end_of_word_suffix", "model", &s, &n);
    if (r < 0)
        return L->err->code;
    if (r && n) {
        if (!(t->eow_suffix = dupn(s, n)))
            return nomem(L);
        t->eow_suffix_len = n;
    }

    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab))
        return sd_err_set(L->err, SD_EFORMAT, "%s: model.vocab must be an object {token: id}", L->file);
    const char *key;
    size_t klen;
    json_t *val;
    int32_t max_id = -1;
    json_object_keylen_foreach(vocab, key, klen, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_ID)
            return sd_err_set(L->err, SD_EFORMAT, "%s: model.vocab[\"%.*s\"] must be an id in [0, %d)", L->file,
                              (int)(klen > 64 ? 64 : klen), key, MAX_ID);
        int32_t id = (int32_t)json_integer_value(val);
        if (sd__strmap_put(&t->vocab, key, klen, id, 1) < 0)
            return nomem(L);
        if (id > max_id)
            max_id = id;
    }
    t->vocab_size = max_id + 1;

    r = jstr(L, m, "unk_token", "model", &s, &n);
    if (r < 0)
        return L->err->code;
    t->unk_id = r ? sd__strmap_get(&t->vocab, s, n) : -1;
    if (r && t->unk_id < 0)
        return sd_err_set(L->err, SD_EFORMAT, "%s: model.unk_token '%.*s' is not in the vocabulary", L->file,
                          (int)(n > 64 ? 64 : n), s);

    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        t->byte_fb_id[b] = sd__strmap_get(&t->vocab, code, 6);
    }

    if (merges && !json_is_array(merges))
        return sd_err_set(L->err, SD_EFORMAT, "%s: model.merges must be an array", L->file);
    sd_sbuf mk = {0};
    int32_t rank = 0;
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *e = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (json_is_string(e)) {
            /* "a b": exactly one space (HF: BadMerges otherwise); "#version" lines skipped */
            const char *ms = json_string_value(e);
            size_t ml = json_string_length(e);
            if (ml >= 8 && !memcmp(ms, "#version", 8))
                continue;
            const char *sp = memchr(ms, ' ', ml);
            if (!sp || memchr(sp + 1, ' ', ml - (size_t)(sp + 1 - ms))) {
                sd_sbuf_free(&mk);
                return sd_err_set(L->err, SD_EFORMAT,
                                  "%s: model.merges[%zu] \"%.*s\" is not two tokens separated by one space", L->file,
                                  i, (int)(ml > 64 ? 64 : ml), ms);
            }
            a = ms;
            al = (size_t)(sp - ms);
            b = sp + 1;
            bl = ml - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            sd_sbuf_free(&mk);
            return sd_err_set(L->err, SD_EFORMAT, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", L->file,
                              i);
        }
        int32_t ia = sd__strmap_get(&t->vocab, a, al), ib = sd__strmap_get(&t->vocab, b, bl);
        size_t skip = t->cont_prefix_len <= bl ? t->cont_prefix_len : bl;
        mk.len = 0;
        if (sd_sbuf_put(&mk, a, al) || sd_sbuf_put(&mk, b + skip, bl - skip)) {
            sd_sbuf_free(&mk);
            return nomem(L);
        }
        int32_t im = sd__strmap_get(&t->vocab, mk.p, mk.len);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *miss = ia < 0 ? a : ib < 0 ? b : mk.p;
            size_t ml = ia < 0 ? al : ib < 0 ? bl : mk.len;
            sd_err_set(L->err, SD_EFORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocabulary", L->file,
                       i, (int)(ml > 64 ? 64 : ml), miss);
            sd_sbuf_free(&mk);
            return L->err->code;
        }
        if (sd__pairmap_put(&t->merges, ia, ib, rank++, im)) {
            sd_sbuf_free(&mk);
            return nomem(L);
        }
    }
    sd_sbuf_free(&mk);
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------ */

static int load_added(ld *L, const json_t *a)
{
    sd_tokenizer *t = L->t;
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_array(a))
        return sd_err_set(L->err, SD_EFORMAT, "%s: added_tokens must be an array", L->file);
    size_t n = json_array_size(a);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return nomem(L);
    int32_t model_count = (int32_t)t->vocab.n, max_added = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(a, i);
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        const char *s;
        size_t sl;
        int r = json_is_object(o) ? jstr(L, o, "content", where, &s, &sl) : 0;
        if (r < 0)
            return L->err->code;
        if (r == 0)
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s must be an object with a \"content\" string", L->file,
                              where);
        if (sl == 0)
            continue; /* HF ignores empty tokens */
        json_t *jid = json_object_get(o, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= MAX_ID)
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s.id must be an id in [0, %d)", L->file, where, MAX_ID);
        sd__added *ad = &t->added[t->n_added];
        ad->special = jbool(o, "special", 0);
        ad->single_word = jbool(o, "single_word", 0);
        ad->lstrip = jbool(o, "lstrip", 0);
        ad->rstrip = jbool(o, "rstrip", 0);
        ad->normalized = jbool(o, "normalized", !ad->special);
        /* HF re-derives the id (AddedVocabulary::add_tokens): a content already known
         * keeps its id, a new one goes after the largest so far. In a consistent file
         * this is the "id" field. */
        int32_t id = sd__strmap_get(&t->added_map, s, sl);
        if (id >= 0) {
            /* the same content twice: HF keeps one token */
            for (int k = 0; k < t->n_added; k++)
                if (t->added[k].id == id && t->added[k].len == sl && !memcmp(t->added[k].content, s, sl)) {
                    t->added[k].special |= ad->special;
                    id = -2;
                    break;
                }
            if (id == -2)
                continue;
        }
        if (id < 0)
            id = sd__strmap_get(&t->vocab, s, sl);
        if (id < 0) {
            if (max_added < 0)
                id = model_count;
            else
                id = (max_added >= model_count || model_count == 0) ? max_added + 1 : model_count;
        }
        if (id >= MAX_ID)
            return sd_err_set(L->err, SD_EFORMAT, "%s: %s gets id %d, beyond %d", L->file, where, id, MAX_ID);
        if (!(ad->content = dupn(s, sl)))
            return nomem(L);
        ad->len = sl;
        ad->id = id;
        if (sd__strmap_put(&t->added_map, s, sl, id, 1) < 0)
            return nomem(L);
        if (id > max_added)
            max_added = id;
        t->n_added++;
    }
    return 0;
}

/* The tries: specials first, then the others, each in file order (HF's pattern
 * order: the first of two equal contents wins). Needs the normalizer. */
static int build_tries(ld *L)
{
    sd_tokenizer *t = L->t;
    t->norm_content = calloc((size_t)t->n_added + 1, sizeof *t->norm_content);
    t->norm_len = calloc((size_t)t->n_added + 1, sizeof *t->norm_len);
    if (!t->norm_content || !t->norm_len)
        return nomem(L);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < t->n_added; i++) {
            sd__added *a = &t->added[i];
            if (a->special != (pass == 0))
                continue;
            if (!a->normalized) {
                if (sd__trie_add(&t->raw_trie, a->content, a->len, i))
                    return nomem(L);
                continue;
            }
            sd_sbuf nb = {0};
            int rc = sd__normalize(t, a->content, a->len, &nb, L->err);
            if (rc) {
                sd_sbuf_free(&nb);
                return sd_err_prefix(L->err, "%s: normalizing added token \"%s\": ", L->file, a->content);
            }
            t->norm_len[i] = nb.len;
            t->norm_content[i] = sd_sbuf_take(&nb, NULL);
            if (!t->norm_content[i])
                return nomem(L);
            if (t->norm_len[i] && sd__trie_add(&t->norm_trie, t->norm_content[i], t->norm_len[i], i))
                return nomem(L);
        }
    }
    return 0;
}

/* ---- per-id table -------------------------------------------------------------------- */

/* The bytes of the run of at most *max characters c (cl bytes each) that
 * starts s[0..n); *max falls by their count. */
static size_t lead_run(const char *s, size_t n, const char *c, size_t cl, int *max)
{
    size_t lo = 0;
    for (; *max > 0 && n - lo >= cl && !memcmp(s + lo, c, cl); (*max)--)
        lo += cl;
    return lo;
}

/* HF Strip on one token: up to start characters c off its start and stop off its
 * end (c: one character's UTF-8). */
static void strip_ends(sd_sbuf *a, const char *c, size_t cl, int start, int stop)
{
    size_t hi = a->len;
    if (!hi)
        return;
    size_t lo = lead_run(a->p, hi, c, cl, &start);
    for (int i = 0; i < stop && hi - lo >= cl && !memcmp(a->p + hi - cl, c, cl); i++)
        hi -= cl;
    memmove(a->p, a->p + lo, hi - lo);
    a->len = hi - lo;
}

static int build_ids(ld *L, const dsteps *d)
{
    sd_tokenizer *t = L->t;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > t->vocab_size)
            t->vocab_size = t->added[i].id + 1;
    t->tok = calloc((size_t)t->vocab_size + 1, sizeof *t->tok);
    if (!t->tok)
        return nomem(L);
    /* strings: model vocabulary, then added contents override (HF id_to_token) */
    for (uint32_t e = 0; e < t->vocab.n; e++) {
        const sd__strent *en = &t->vocab.ent[e];
        sd__tokinfo *ti = &t->tok[en->val];
        if (t->strpool.len > UINT32_MAX - en->len)
            return nomem(L);
        ti->str_off = (uint32_t)t->strpool.len;
        ti->str_len = en->len;
        ti->flags |= SD__TOK_PRESENT;
        if (sd_sbuf_put(&t->strpool, t->vocab.pool.p + en->off, en->len))
            return nomem(L);
    }
    for (int i = 0; i < t->n_added; i++) {
        const sd__added *a = &t->added[i];
        sd__tokinfo *ti = &t->tok[a->id];
        ti->str_off = (uint32_t)t->strpool.len;
        ti->str_len = (uint32_t)a->len;
        ti->flags |= SD__TOK_PRESENT | SD__TOK_ADDED | (a->special ? SD__TOK_SPECIAL : 0);
        if (sd_sbuf_put(&t->strpool, a->content, a->len))
            return nomem(L);
    }
    if (sd_sbuf_reserve(&t->strpool, 0) || sd_sbuf_reserve(&t->decpool, 0))
        return nomem(L);

    /* decoded bytes: the per-token decoder steps, precomputed */
    uint32_t b2c[256];
    uint16_t c2b[0x144];
    sd__bl_tables(b2c, c2b);
    sd_sbuf a = {0}, b = {0};
    int rc = 0;
    for (int id = 0; id < t->vocab_size && !rc; id++) {
        sd__tokinfo *ti = &t->tok[id];
        if (!(ti->flags & SD__TOK_PRESENT))
            continue;
        a.len = 0;
        if (sd_sbuf_put(&a, t->strpool.p + ti->str_off, ti->str_len)) {
            rc = nomem(L);
            break;
        }
        for (int k = 0; k < d->n && !rc; k++) {
            if (d->v[k].kind == DS_REPLACE) {
                rc = sd__norm_step(&d->v[k].rep, a.p, a.len, &b, L->err);
                sd_sbuf x = a;
                a = b;
                b = x;
            } else if (d->v[k].kind == DS_BYTEFALLBACK) {
                /* HF ByteFallback: a token "<0xAB>" is the byte 0xAB */
                int hi, lo;
                if (a.len == 6 && !memcmp(a.p, "<0x", 3) && a.p[5] == '>' && (hi = sd__hexval(a.p[3])) >= 0 &&
                    (lo = sd__hexval(a.p[4])) >= 0) {
                    a.p[0] = (char)(hi << 4 | lo);
                    a.len = 1;
                }
            } else if (d->v[k].kind == DS_STRIP) {
                strip_ends(&a, d->v[k].rep.s2, d->v[k].rep.s2len, d->v[k].start, d->v[k].stop);
            } else {
                /* HF ByteLevel decoder: a token whose characters are all byte
                 * characters gives those bytes, any other token its own UTF-8. */
                int r = bl_unmap(c2b, a.p, a.len, &b);
                if (r < 0)
                    rc = nomem(L);
                else if (r) {
                    sd_sbuf x = a;
                    a = b;
                    b = x;
                }
            }
        }
        if (rc)
            break;
        if (t->decpool.len > UINT32_MAX - a.len) {
            rc = nomem(L);
            break;
        }
        ti->dec_off = (uint32_t)t->decpool.len;
        ti->dec_len = (uint32_t)a.len;
        if (sd_sbuf_put(&t->decpool, a.p, a.len))
            rc = nomem(L);
    }
    sd_sbuf_free(&a);
    sd_sbuf_free(&b);
    if (rc)
        return rc;

    /* byte-level model tables */
    for (int k = 0; k < 256; k++) {
        char u[4];
        int ul = sd_utf8_encode(b2c[k], u);
        t->byte_id[k] = t->byte_level ? sd__strmap_get(&t->vocab, u, (size_t)ul) : -1;
    }
    if (t->byte_level && t->ignore_merges) {
        sd_sbuf raw = {0};
        for (uint32_t e = 0; e < t->vocab.n; e++) {
            const sd__strent *en = &t->vocab.ent[e];
            int r = bl_unmap(c2b, t->vocab.pool.p + en->off, en->len, &raw);
            if (r < 0 || (r > 0 && sd__strmap_put(&t->raw, raw.p, raw.len, en->val, 0) < 0)) {
                sd_sbuf_free(&raw);
                return nomem(L);
            }
        }
        sd_sbuf_free(&raw);
    }
    return 0;
}

/* ---- bos / eos ----------------------------------------------------------------------- */

int32_t sd_tok_token_id(const sd_tokenizer *t, const char *token, size_t len)
{
    int32_t id = sd__strmap_get(&t->added_map, token, len);
    return id >= 0 ? id : sd__strmap_get(&t->vocab, token, len);
}

/* tokenizer_config.json's bos_token / eos_token: 1 found (id set, -1 for null),
 * 0 when the key is absent. */
static int config_token(const sd_tokenizer *t, const json_t *cfg, const char *key, int32_t *id)
{
    json_t *v = json_object_get(cfg, key);
    if (!v)
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v)) {
        *id = -1;
        return 1;
    }
    *id = sd_tok_token_id(t, json_string_value(v), json_string_length(v));
    return 1;
}

static int32_t named_special(const sd_tokenizer *t, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = sd__strmap_get(&t->added_map, names[i], strlen(names[i]));
        if (id >= 0)
            return id;
    }
    return -1;
}

/* The first special token of a TemplateProcessing "single" template, if it comes
 * before the sequence ($A). */
static int32_t template_bos(const sd_tokenizer *t, const json_t *pp)
{
    if (!json_is_object(pp))
        return -1;
    const char *ty = jtype(pp);
    if (ty && !strcmp(ty, "Sequence")) {
        json_t *a = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(a); i++) {
            int32_t id = template_bos(t, json_array_get(a, i));
            if (id >= 0)
                return id;
        }
        return -1;
    }
    if (!ty || strcmp(ty, "TemplateProcessing"))
        return -1;
    json_t *single = json_object_get(pp, "single");
    json_t *first = json_array_get(single, 0);
    json_t *st = json_object_get(first, "SpecialToken");
    json_t *name = json_object_get(st, "id");
    if (!json_is_string(name))
        return -1;
    json_t *spec = json_object_get(json_object_get(pp, "special_tokens"), json_string_value(name));
    json_t *ids = json_object_get(spec, "ids");
    if (json_array_size(ids) == 1 && json_is_integer(json_array_get(ids, 0)))
        return (int32_t)json_integer_value(json_array_get(ids, 0));
    return sd_tok_token_id(t, json_string_value(name), json_string_length(name));
}

/* tokenizer_config.json beside the tokenizer, read once for both loaders:
 * *cfg NULL where there is none */
static int load_config(const char *dir, json_t **cfg, sd_err *err)
{
    *cfg = NULL;
    char *cfgpath = sd_strfmt("%s/tokenizer_config.json", dir);
    if (!cfgpath)
        return sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
    int rc = 0;
    if (sd_file_exists(cfgpath)) {
        json_error_t je;
        *cfg = json_load_file(cfgpath, 0, &je);
        if (!json_is_object(*cfg)) {
            rc = *cfg ? sd_err_set(err, SD_EFORMAT, "%s: the top level must be a JSON object", cfgpath)
                      : sd_err_set(err, SD_EFORMAT, "%s:%d:%d: malformed JSON: %s", cfgpath, je.line, je.column,
                                   je.text);
            json_decref(*cfg);
            *cfg = NULL;
        }
    }
    free(cfgpath);
    return rc;
}

/* cfg: tokenizer_config.json (NULL: none) */
static void find_bos_eos(sd_tokenizer *t, const json_t *cfg, const json_t *pp)
{
    static const char *const BOS[] = {"<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<s>", "<|startoftext|>",
                                      "<bos>", "[BOS]", "<|bos|>"};
    static const char *const EOS[] = {"<|end_of_text|>", "<｜end▁of▁sentence｜>", "</s>", "<|endoftext|>",
                                      "<eos>", "[EOS]", "<|eos|>"};
    int have_bos = config_token(t, cfg, "bos_token", &t->bos);
    int have_eos = config_token(t, cfg, "eos_token", &t->eos);
    if (!have_bos) {
        t->bos = template_bos(t, pp);
        if (t->bos < 0)
            t->bos = named_special(t, BOS, SD_ARRAY_LEN(BOS));
    }
    if (!have_eos)
        t->eos = named_special(t, EOS, SD_ARRAY_LEN(EOS));
    if (t->bos >= t->vocab_size)
        t->bos = -1;
    if (t->eos >= t->vocab_size)
        t->eos = -1;
}

/* ---- load / free --------------------------------------------------------------------- */

void sd_tok_free(sd_tokenizer *t)
{
    if (!t)
        return;
    free(t->path);
    sd__strmap_free(&t->vocab);
    sd__strmap_free(&t->raw);
    sd__strmap_free(&t->added_map);
    sd__pairmap_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->tok);
    sd_sbuf_free(&t->strpool);
    sd_sbuf_free(&t->decpool);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        if (t->norm_content)
            free(t->norm_content[i]);
    }
    free(t->added);
    free(t->norm_content);
    free(t->norm_len);
    sd__trie_free(&t->raw_trie);
    sd__trie_free(&t->norm_trie);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].s);
        free(t->norm[i].s2);
        if (t->norm[i].re)
            pcre2_code_free(t->norm[i].re);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) {
        if (t->pre[i].re)
            pcre2_code_free(t->pre[i].re);
        free(t->pre[i].rep);
    }
    free(t->pre);
    free(t);
}

int sd_tok_present(const char *dir)
{
    static const char *const names[] = {"tokenizer.json", "tiktoken.model"};
    int found = 0;
    for (size_t i = 0; i < SD_ARRAY_LEN(names) && !found; i++) {
        char *p = sd_strfmt("%s/%s", dir, names[i]);
        found = p && sd_file_exists(p);
        free(p);
    }
    return found;
}

int sd_tok_load(sd_tokenizer **out, const char *path, sd_err *err)
{
    *out = NULL;
    if (!path || !*path)
        return sd_err_set(err, SD_EINVAL, "tokenizer: no path given");
    char *file = NULL, *dir = NULL;
    int tiktoken = 0;
    if (sd_dir_exists(path)) {
        file = sd_strfmt("%s/tokenizer.json", path);
        dir = sd_strfmt("%s", path);
        if (file && !sd_file_exists(file)) {
            free(file);
            file = sd_strfmt("%s/tiktoken.model", path);
            tiktoken = 1;
            if (file && !sd_file_exists(file)) {
                free(file);
                free(dir);
                return sd_err_set(err, SD_ENOENT, "%s: no tokenizer.json (nor tiktoken.model) in this folder",
                                  path);
            }
        }
    } else {
        if (!sd_file_exists(path))
            return sd_err_set(err, SD_ENOENT, "%s: no such tokenizer.json or folder", path);
        file = sd_strfmt("%s", path);
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        tiktoken = !strcmp(base, "tiktoken.model");
        dir = slash ? sd_strfmt("%.*s", (int)(slash - path), path) : sd_strfmt(".");
        if (dir && !*dir) {
            free(dir);
            dir = sd_strfmt("/");
        }
    }
    if (!file || !dir) {
        free(file);
        free(dir);
        return sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
    }
    json_t *root = NULL, *cfg = NULL;
    int rc = load_config(dir, &cfg, err);
    if (!rc && tiktoken) {
        rc = sd__tok_tiktoken_json(dir, file, cfg, &root, err);
    } else if (!rc) {
        char *data = NULL;
        size_t len = 0;
        rc = sd_read_file(file, &data, &len, err);
        if (!rc) {
            json_error_t je;
            root = json_loadb(data, len, JSON_ALLOW_NUL, &je);
            free(data);
            if (!root)
                rc = sd_err_set(err, SD_EFORMAT, "%s:%d:%d: malformed JSON: %s", file, je.line, je.column, je.text);
        }
    }
    if (rc) {
        json_decref(cfg);
        free(file);
        free(dir);
        return rc;
    }
    sd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        json_decref(cfg);
        free(file);
        free(dir);
        return sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
    }
    t->path = file;
    t->unk_id = t->bos = t->eos = -1;
    ld L = {t, err, file};
    dsteps dec = {0};
    if (!json_is_object(root)) {
        rc = sd_err_set(err, SD_EFORMAT, "%s: the top level must be a JSON object", file);
        goto fail;
    }
    /* pre-tokenizer first: whether the model is byte-level depends on it */
    if ((rc = load_pretok(&L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer")))
        goto fail;
    if ((rc = load_model(&L, json_object_get(root, "model"))))
        goto fail;
    if ((rc = load_normalizer(&L, json_object_get(root, "normalizer"), "normalizer")))
        goto fail;
    if ((rc = load_added(&L, json_object_get(root, "added_tokens"))))
        goto fail;
    if ((rc = build_tries(&L)))
        goto fail;
    json_t *dj = json_object_get(root, "decoder");
    if (!dj || json_is_null(dj))
        t->dec_join_space = 1;
    else if ((rc = load_decoder(&L, dj, "decoder", &dec)))
        goto fail;
    if ((rc = build_ids(&L, &dec)))
        goto fail;
    find_bos_eos(t, cfg, json_object_get(root, "post_processor"));
    dsteps_free(&dec);
    json_decref(root);
    json_decref(cfg);
    free(dir);
    *out = t;
    return 0;
fail:
    dsteps_free(&dec);
    json_decref(root);
    json_decref(cfg);
    free(dir);
    sd_tok_free(t);
    return rc;
}

/* ---- queries --------------------------------------------------------------------------- */

int sd_tok_vocab_size(const sd_tokenizer *t) { return t->vocab_size; }
int sd_tok_bos_id(const sd_tokenizer *t) { return t->bos; }
int sd_tok_eos_id(const sd_tokenizer *t) { return t->eos; }

int sd_tok_is_special(const sd_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->tok[id].flags & SD__TOK_SPECIAL) != 0;
}

const char *sd_tok_token_str(const sd_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || !(t->tok[id].flags & SD__TOK_PRESENT))
        return NULL;
    if (len)
        *len = t->tok[id].str_len;
    return t->strpool.p + t->tok[id].str_off;
}

const char *sd_tok_token_bytes(const sd_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || !(t->tok[id].flags & SD__TOK_PRESENT))
        return NULL;
    if (len)
        *len = t->tok[id].dec_len;
    return t->decpool.p + t->tok[id].dec_off;
}

/* ---- decode ------------------------------------------------------------------------------ */

static int check_ids(const sd_tokenizer *t, const int32_t *ids, int n, sd_err *err)
{
    if (n < 0 || (n > 0 && !ids))
        return sd_err_set(err, SD_EINVAL, "decode: %d ids at %p", n, (const void *)ids);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return sd_err_set(err, SD_ERANGE, "decode: token id %d (position %d) is out of range [0, %d)", ids[i], i,
                              t->vocab_size);
    return 0;
}

/* Appends the bytes of ids (before UTF-8 repair); *first tracks the join-with-space
 * decoder (no decoder in the file). */
static int append_ids(const sd_tokenizer *t, const int32_t *ids, int n, int skip_special, int *first, sd_sbuf *b)
{
    for (int i = 0; i < n; i++) {
        const sd__tokinfo *ti = &t->tok[ids[i]];
        if (!(ti->flags & SD__TOK_PRESENT))
            continue;
        if (skip_special && (ti->flags & SD__TOK_SPECIAL))
            continue;
        if (t->dec_join_space && !*first && sd_sbuf_putc(b, ' '))
            return -1;
        *first = 0;
        if (sd_sbuf_put(b, t->decpool.p + ti->dec_off, ti->dec_len))
            return -1;
    }
    return 0;
}

/* The Strip after Fuse: up to *left characters off the start of the text a
 * decode (or a stream) emits first; *left falls to 0 at its first other one. */
static void strip_lead(const sd_tokenizer *t, sd_sbuf *out, int *left)
{
    if (!out->len)
        return;
    size_t lo = lead_run(out->p, out->len, t->dec_strip_c, t->dec_strip_clen, left);
    if (lo < out->len)
        *left = 0;
    memmove(out->p, out->p + lo, out->len - lo);
    out->len -= lo;
}

int sd_tok_decode(const sd_tokenizer *t, const int32_t *ids, int n, int skip_special, char **text, size_t *len,
                  sd_err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    int rc = check_ids(t, ids, n, err);
    if (rc)
        return rc;
    sd_sbuf raw = {0}, out = {0};
    int first = 1, left = t->dec_strip;
    if (append_ids(t, ids, n, skip_special, &first, &raw) ||
        sd_utf8_repair_as(&out, raw.p ? raw.p : "", raw.len, 1, t->dec_per_byte) == (size_t)-1 ||
        (strip_lead(t, &out, &left), !(*text = sd_sbuf_take(&out, len)))) {
        sd_sbuf_free(&raw);
        sd_sbuf_free(&out);
        return sd_err_set(err, SD_ENOMEM, "decode: out of memory");
    }
    sd_sbuf_free(&raw);
    return 0;
}

struct sd_detok {
    const sd_tokenizer *t;
    int skip_special;
    int first;        /* nothing emitted yet (join-with-space decoder) */
    int strip_left;   /* the Strip after Fuse: characters it may still take */
    unsigned char hold[4]; /* bytes of an incomplete character held back */
    size_t nhold;
    sd_sbuf raw;
};

int sd_detok_new(sd_detok **out, const sd_tokenizer *t, int skip_special, sd_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return sd_err_set(err, SD_ENOMEM, "detokenizer: out of memory");
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    (*out)->first = 1;
    (*out)->strip_left = t->dec_strip;
    return 0;
}

int sd_detok_push(sd_detok *d, const int32_t *ids, int n, char **text, size_t *len, sd_err *err)
{
    *text = NULL;
    if (len)
        *len = 0;
    int rc = check_ids(d->t, ids, n, err);
    if (rc)
        return rc; /* nothing consumed: the stream is as before */
    sd_sbuf out = {0};
    d->raw.len = 0;
    int first = d->first;
    if (sd_sbuf_put(&d->raw, d->hold, d->nhold) || append_ids(d->t, ids, n, d->skip_special, &first, &d->raw))
        goto oom;
    size_t used = sd_utf8_repair_as(&out, d->raw.p, d->raw.len, 0, d->t->dec_per_byte);
    if (used == (size_t)-1)
        goto oom;
    strip_lead(d->t, &out, &d->strip_left);
    if (!(*text = sd_sbuf_take(&out, len)))
        goto oom;
    d->first = first;
    d->nhold = d->raw.len - used; /* at most 3: an incomplete character */
    memcpy(d->hold, d->raw.p + used, d->nhold);
    return 0;
oom:
    sd_sbuf_free(&out);
    return sd_err_set(err, SD_ENOMEM, "detokenizer: out of memory");
}

int sd_detok_flush(sd_detok *d, char **text, size_t *len)
{
    sd_sbuf out = {0};
    *text = NULL;
    if (len)
        *len = 0;
    if (sd_utf8_repair_as(&out, (const char *)d->hold, d->nhold, 1, d->t->dec_per_byte) == (size_t)-1 ||
        (strip_lead(d->t, &out, &d->strip_left), !(*text = sd_sbuf_take(&out, len)))) {
        sd_sbuf_free(&out);
        return SD_ENOMEM;
    }
    d->nhold = 0;
    d->first = 1;
    d->strip_left = d->t->dec_strip;
    return 0;
}

void sd_detok_free(sd_detok *d)
{
    if (!d)
        return;
    sd_sbuf_free(&d->raw);
    free(d);
}

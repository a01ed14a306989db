/* core/tok_tiktoken: a folder that ships a tiktoken rank file (tiktoken.model,
 * as Kimi-K2, Kimi-Linear and Moonlight do) in place of tokenizer.json.
 *
 * The rank file is read into the tokenizer.json that transformers'
 * TikTokenConverter writes for it, and that document goes through the one
 * tokenizer.json loader (tokenizer.c), so the two forms cannot drift apart:
 *   - model: byte-level BPE; each token's bytes in GPT-2's byte-to-character
 *     map, its id its rank; every split of a token into two ranked tokens is a
 *     merge, merges ordered by the token's rank (then the halves' ranks), and
 *     ignore_merges (tiktoken takes a piece found whole in the ranks as is);
 *   - pre-tokenizer: Split(pattern, Isolated) then ByteLevel without its own
 *     regex; decoder ByteLevel; no normalizer, no post-processor (tiktoken's
 *     encode adds no bos);
 *   - special tokens: tiktoken.Encoding's special_tokens as the model's
 *     tokenizer code builds them: ids from the rank count up, each named by
 *     tokenizer_config.json's added_tokens_decoder or "<|reserved_token_ID|>",
 *     num_reserved_special_tokens of them (and up to the largest id named).
 *
 * The split pattern is not in the rank file: it is the pat_str of the model's
 * tokenizer code (tokenization_*.py beside it), read from that source as a
 * Python string literal or a "sep".join([...]) of literals, which is how
 * every published one writes it. Not done: tiktoken splits runs of more than
 * 25000 whitespace or non-whitespace characters before encoding (the model
 * code's guard against a tiktoken panic); specd encodes such a run whole. */
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/tok_internal.h"
#include "core/util.h"

#define MAX_RANK (1 << 24)

/* ---- the rank file ------------------------------------------------------------------ */

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Standard base64 (padding optional) -> out; the byte count, or -1. */
static int b64_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    while (n && s[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap)
                return -1;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return (int)o;
}

typedef struct rank_tok {
    uint32_t off, len; /* bytes in the pool */
    int32_t rank;
} rank_tok;

typedef struct ranks {
    rank_tok *v;
    int n, cap;
    sd__strmap map; /* bytes -> rank */
    int32_t max_rank;
} ranks;

static void ranks_free(ranks *r)
{
    free(r->v);
    sd__strmap_free(&r->map);
}

static int read_ranks(const char *file, ranks *r, sd_err *err)
{
    char *data = NULL;
    size_t len = 0;
    int rc = sd_read_file(file, &data, &len, err);
    if (rc)
        return rc;
    r->max_rank = -1;
    unsigned char tok[1024];
    size_t line = 0;
    for (size_t p = 0; p < len && !rc;) {
        size_t e = p;
        while (e < len && data[e] != '\n')
            e++;
        line++;
        size_t q = e;
        if (q > p && data[q - 1] == '\r')
            q--;
        size_t sp = p;
        while (sp < q && data[sp] != ' ')
            sp++;
        if (q == p) { /* an empty line */
            p = e + 1;
            continue;
        }
        int64_t rank = -1;
        int nb = sp < q ? b64_decode(data + p, sp - p, tok, sizeof tok) : -1;
        if (sp < q) {
            char num[24];
            size_t nl = q - sp - 1;
            if (nl > 0 && nl < sizeof num) {
                memcpy(num, data + sp + 1, nl);
                num[nl] = 0;
                if (sd_parse_i64(num, &rank))
                    rank = -1;
            }
        }
        if (nb <= 0 || rank < 0 || rank >= MAX_RANK) {
            rc = sd_err_set(err, SD_EFORMAT,
                            "%s:%zu: not \"<base64 token> <rank>\" (a token of 1 to %zu bytes, a rank in [0, %d))",
                            file, line, sizeof tok, MAX_RANK);
            break;
        }
        if (r->n == r->cap) {
            int nc = r->cap ? 2 * r->cap : 4096;
            rank_tok *nv = realloc(r->v, (size_t)nc * sizeof *nv);
            if (!nv) {
                rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", file);
                break;
            }
            r->v = nv;
            r->cap = nc;
        }
        int put = sd__strmap_put(&r->map, (const char *)tok, (size_t)nb, (int32_t)rank, 0);
        if (put < 0) {
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", file);
            break;
        }
        if (put == 1) {
            rc = sd_err_set(err, SD_EFORMAT, "%s:%zu: the token of rank %lld is there twice", file, line,
                            (long long)rank);
            break;
        }
        uint32_t ent = r->map.n - 1; /* the entry just inserted: its key in the map's pool */
        r->v[r->n++] = (rank_tok){r->map.ent[ent].off, r->map.ent[ent].len, (int32_t)rank};
        if (rank > r->max_rank)
            r->max_rank = (int32_t)rank;
        p = e + 1;
    }
    free(data);
    if (!rc && r->n == 0)
        rc = sd_err_set(err, SD_EFORMAT, "%s: no tokens", file);
    return rc;
}

/* ---- the split pattern from the model's tokenizer code --------------------------------- */

static size_t skip_space(const char *s, size_t n, size_t i)
{
    for (;;) {
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n' || s[i] == '\\'))
            i++;
        if (i < n && s[i] == '#') {
            while (i < n && s[i] != '\n')
                i++;
            continue;
        }
        return i;
    }
}

/* One Python string literal at s[*i] (prefixes r, u, b in any case; f is
 * refused), appended to out; *i moves past it. 1 read, 0 none there, -1 no
 * memory. Escapes of non-raw literals: \\ \' \" \n \r \t \xHH \uXXXX
 * \UXXXXXXXX and line continuations; others keep their backslash, as Python
 * does. */
static int py_literal(const char *s, size_t n, size_t *i, sd_sbuf *out)
{
    size_t p = *i;
    int raw = 0;
    while (p < n && s[p] && strchr("rRuUbB", s[p]) && p - *i < 2) {
        raw |= s[p] == 'r' || s[p] == 'R';
        p++;
    }
    if (p >= n || (s[p] != '"' && s[p] != '\''))
        return 0;
    char q = s[p];
    size_t ql = p + 2 < n && s[p + 1] == q && s[p + 2] == q ? 3 : 1;
    p += ql;
    for (;;) {
        if (p >= n)
            return 0; /* unterminated */
        if (s[p] == q && (ql == 1 || (p + 2 < n && s[p + 1] == q && s[p + 2] == q))) {
            *i = p + ql;
            return 1;
        }
        if (ql == 1 && s[p] == '\n')
            return 0;
        if (s[p] != '\\' || p + 1 >= n) {
            if (sd_sbuf_put(out, s + p, 1))
                return -1;
            p++;
            continue;
        }
        char c = s[p + 1];
        if (raw) { /* a backslash stays, and shields the next character */
            if (sd_sbuf_put(out, s + p, 2))
                return -1;
            p += 2;
            continue;
        }
        char one = 0;
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (hex) {
            uint32_t cp = 0;
            int ok = p + 2 + (size_t)hex <= n;
            for (int k = 0; ok && k < hex; k++) {
                int d = sd__hexval(s[p + 2 + k]);
                ok = d >= 0;
                cp = cp << 4 | (uint32_t)(d < 0 ? 0 : d);
            }
            if (ok && cp < 0x110000) {
                char u[4];
                int ul = sd_utf8_encode(cp, u);
                if (ul <= 0 || sd_sbuf_put(out, u, (size_t)ul))
                    return -1;
                p += 2 + (size_t)hex;
                continue;
            }
        }
        switch (c) {
        case '\\': one = '\\'; break;
        case '\'': one = '\''; break;
        case '"': one = '"'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case '\n': p += 2; continue; /* a line continuation */
        default: break;
        }
        if (one ? sd_sbuf_put(out, &one, 1) : sd_sbuf_put(out, s + p, 2))
            return -1;
        p += 2;
    }
}

/* Adjacent literals, as Python joins them: 1, 0 (none), -1 (no memory). */
static int py_literals(const char *s, size_t n, size_t *i, sd_sbuf *out)
{
    int got = 0;
    for (;;) {
        size_t p = skip_space(s, n, *i);
        int r = py_literal(s, n, &p, out);
        if (r < 0)
            return -1;
        if (r == 0)
            return got;
        got = 1;
        *i = p;
    }
}

/* The next assignment "name = ..." (or "name: type = ...") in src from *at on,
 * name at an identifier's start (not an attribute, not "=="): the position
 * of its value, *at past the name; n when there is none. */
static size_t py_assignment(const char *src, size_t n, size_t *at, const char *name)
{
    size_t kl = strlen(name);
    for (; *at + kl <= n; (*at)++) {
        size_t a = *at;
        if (memcmp(src + a, name, kl) ||
            (a > 0 && (isalnum((unsigned char)src[a - 1]) || src[a - 1] == '_' || src[a - 1] == '.')))
            continue;
        size_t p = skip_space(src, n, a + kl);
        if (p < n && src[p] == ':') /* an annotation */
            while (p < n && src[p] != '=' && src[p] != '\n')
                p++;
        if (p >= n || src[p] != '=' || (p + 1 < n && src[p + 1] == '='))
            continue;
        (*at)++;
        return skip_space(src, n, p + 1);
    }
    return n;
}

/* At src[*q]: ([ or ( literals, ... ] or )), the items joined by sep into pat;
 * 1 read, 0 not such a list, -1 no memory. */
static int py_join_list(const char *src, size_t n, size_t *q, const sd_sbuf *sep, sd_sbuf *pat)
{
    size_t p = skip_space(src, n, *q);
    if (p < n && src[p] == '(')
        p = skip_space(src, n, p + 1);
    char close = p < n && src[p] == '[' ? ']' : p < n && src[p] == '(' ? ')' : 0;
    if (!close)
        return 0;
    p++;
    int items = 0, ri;
    do {
        sd_sbuf item = {0};
        ri = py_literals(src, n, &p, &item);
        int oom = ri < 0 || (ri > 0 && ((items++ && sd_sbuf_put(pat, sep->p, sep->len)) ||
                                         sd_sbuf_put(pat, item.p, item.len)));
        sd_sbuf_free(&item);
        if (oom)
            return -1;
        p = skip_space(src, n, p);
    } while (p < n && src[p] == ',' && ++p);
    *q = p;
    return items > 0 && p < n && src[p] == close;
}

/* pat_str = <literals> | <literals>.join([<literals>, ...]) (a list or a tuple)
 * in src: the pattern into out; 1 found, 0 not, -1 no memory. */
int sd__tiktoken_pattern_of_source(const char *src, size_t n, sd_sbuf *out)
{
    for (size_t at = 0, p; (p = py_assignment(src, n, &at, "pat_str")) < n;) {
        if (src[p] == '(') /* pat_str = ( "a" "b" ) */
            p++;
        sd_sbuf sep = {0}, pat = {0};
        int r = py_literals(src, n, &p, &sep), found = 0;
        if (r > 0) {
            size_t q = skip_space(src, n, p);
            if (q + 5 <= n && !memcmp(src + q, ".join", 5)) {
                q += 5;
                r = py_join_list(src, n, &q, &sep, &pat);
                found = r > 0;
            } else {
                found = 1; /* a literal alone */
                sd_sbuf t = sep;
                sep = pat;
                pat = t;
            }
        }
        if (r >= 0 && found) {
            out->len = 0;
            r = sd_sbuf_put(out, pat.p ? pat.p : "", pat.len) ? -1 : 1;
        }
        sd_sbuf_free(&sep);
        sd_sbuf_free(&pat);
        if (r < 0)
            return -1;
        if (found)
            return 1;
    }
    return 0;
}

/* An integer class attribute "name = N" in src; def when absent. */
static long py_int(const char *src, size_t n, const char *name, long def)
{
    for (size_t at = 0, p; (p = py_assignment(src, n, &at, name)) < n;) {
        long v = 0;
        int digits = 0;
        while (p < n && src[p] >= '0' && src[p] <= '9' && v < 1000000) {
            v = v * 10 + (src[p++] - '0');
            digits++;
        }
        if (digits)
            return v;
    }
    return def;
}

/* The pattern and the reserved count from dir's tokenization_*.py. */
static int find_pattern(const char *dir, sd_sbuf *pat, long *reserved, char **from, sd_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return sd_err_set(err, SD_ENOENT, "%s: cannot list the folder", dir);
    struct dirent *de;
    int rc = 0, found = 0;
    char **names = NULL;
    size_t nn = 0;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 16 && !strncmp(de->d_name, "tokenization_", 13) && !strcmp(de->d_name + l - 3, ".py")) {
            char **nv = realloc(names, (nn + 1) * sizeof *names);
            if (!nv || !(nv[nn] = sd_strfmt("%s", de->d_name))) {
                names = nv ? nv : names;
                rc = sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
                break;
            }
            names = nv;
            nn++;
        }
    }
    closedir(d);
    /* in name order, so that the choice does not depend on the directory's */
    for (size_t i = 1; i < nn; i++)
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *x = names[j];
            names[j] = names[j - 1];
            names[j - 1] = x;
        }
    for (size_t i = 0; i < nn && !rc && !found; i++) {
        char *path = sd_strfmt("%s/%s", dir, names[i]), *src = NULL;
        size_t len = 0;
        if (!path) {
            rc = sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
            break;
        }
        if (!sd_read_file(path, &src, &len, NULL)) {
            int r = sd__tiktoken_pattern_of_source(src, len, pat);
            if (r < 0)
                rc = sd_err_set(err, SD_ENOMEM, "tokenizer: out of memory");
            if (r > 0) {
                found = 1;
                *reserved = py_int(src, len, "num_reserved_special_tokens", 0);
                *from = path;
                path = NULL;
            }
        }
        free(src);
        free(path);
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    if (!rc && !found)
        rc = sd_err_set(err, SD_ENOTSUP,
                        "%s: has tiktoken.model but no split pattern for it (specd reads the pat_str of the "
                        "model's tokenization_*.py beside it) and no tokenizer.json",
                        dir);
    return rc;
}

/* ---- the document -------------------------------------------------------------------- */

typedef struct merge {
    int32_t rank, lr, rr; /* the token's rank, then its halves' */
    uint32_t li, ri;      /* the halves' entries in ranks.v ... */
} merge;

static int merge_cmp(const void *a, const void *b)
{
    const merge *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->lr != y->lr)
        return x->lr < y->lr ? -1 : 1;
    return (x->rr > y->rr) - (x->rr < y->rr);
}

/* bytes -> byte-level characters */
static int bl_str(const uint32_t b2c[256], const unsigned char *s, size_t n, sd_sbuf *out)
{
    out->len = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        int l = sd_utf8_encode(b2c[s[i]], u);
        if (sd_sbuf_put(out, u, (size_t)l))
            return -1;
    }
    return sd_sbuf_reserve(out, 1) ? -1 : (out->p[out->len] = 0, 0);
}

static json_t *added_entry(const char *content, size_t len, int special, const json_t *like)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "content", json_stringn(content, len)))
        goto fail;
    static const char *const flags[] = {"single_word", "lstrip", "rstrip", "normalized"};
    for (size_t i = 0; i < SD_ARRAY_LEN(flags); i++) {
        json_t *v = json_object_get(like, flags[i]);
        if (json_object_set_new(o, flags[i], json_boolean(json_is_true(v))))
            goto fail;
    }
    json_t *sp = json_object_get(like, "special");
    if (json_object_set_new(o, "special", json_boolean(json_is_boolean(sp) ? json_is_true(sp) : special)))
        goto fail;
    return o;
fail:
    json_decref(o);
    return NULL;
}

int sd__tok_tiktoken_json(const char *dir, const char *file, const json_t *cfg, json_t **out, sd_err *err)
{
    *out = NULL;
    ranks R = {0};
    sd_sbuf pat = {0}, ls = {0}, rs = {0}, ms = {0};
    char *pat_from = NULL;
    merge *mv = NULL;
    json_t *root = NULL;
    long reserved = 0;
    int rc = read_ranks(file, &R, err);
    if (!rc)
        rc = find_pattern(dir, &pat, &reserved, &pat_from, err);
    if (rc)
        goto done;
    sd_log_debug("tokenizer: %s: %d ranks, the split pattern from %s, %ld reserved special ids", file, R.n,
                 pat_from, reserved);

    /* merges: every split of a token into two ranked tokens */
    size_t nm = 0, capm = 0;
    for (int i = 0; i < R.n; i++) {
        const rank_tok *t = &R.v[i];
        const char *b = R.map.pool.p + t->off;
        for (uint32_t s = 1; s < t->len; s++) {
            int32_t l = sd__strmap_get(&R.map, b, s), r = sd__strmap_get(&R.map, b + s, t->len - s);
            if (l < 0 || r < 0)
                continue;
            if (nm == capm) {
                size_t nc = capm ? 2 * capm : 8192;
                merge *nv = realloc(mv, nc * sizeof *nv);
                if (!nv)
                    goto oom;
                mv = nv;
                capm = nc;
            }
            mv[nm++] = (merge){t->rank, l, r, (uint32_t)i, s};
        }
    }
    if (nm)
        qsort(mv, nm, sizeof *mv, merge_cmp);

    uint32_t b2c[256];
    uint16_t c2b[0x144];
    sd__bl_tables(b2c, c2b);
    json_t *vocab = json_object(), *merges = json_array();
    root = json_object();
    json_t *model = json_object();
    if (!root || !model || json_object_set_new(root, "model", model) || !vocab || !merges ||
        json_object_set_new(model, "vocab", vocab) || json_object_set_new(model, "merges", merges)) {
        if (!model || json_object_get(root, "model") != model)
            json_decref(model);
        goto oom;
    }
    for (int i = 0; i < R.n; i++) {
        if (bl_str(b2c, (const unsigned char *)R.map.pool.p + R.v[i].off, R.v[i].len, &ls) ||
            json_object_setn_new_nocheck(vocab, ls.p, ls.len, json_integer(R.v[i].rank)))
            goto oom;
    }
    for (size_t i = 0; i < nm; i++) {
        const rank_tok *t = &R.v[mv[i].li];
        const unsigned char *b = (const unsigned char *)R.map.pool.p + t->off;
        uint32_t s = mv[i].ri;
        if (bl_str(b2c, b, s, &ls) || bl_str(b2c, b + s, t->len - s, &rs))
            goto oom;
        ms.len = 0; /* "left right": byte-level strings hold no space */
        if (sd_sbuf_put(&ms, ls.p, ls.len) || sd_sbuf_putc(&ms, ' ') || sd_sbuf_put(&ms, rs.p, rs.len) ||
            json_array_append_new(merges, json_stringn(ms.p, ms.len)))
            goto oom;
    }
    if (json_object_set_new(model, "type", json_string("BPE")) ||
        json_object_set_new(model, "ignore_merges", json_true()) ||
        json_object_set_new(model, "byte_fallback", json_false()))
        goto oom;

    json_t *split = json_pack("{s:s, s:{s:s%}, s:s, s:b}", "type", "Split", "pattern", "Regex", pat.p ? pat.p : "",
                              pat.len, "behavior", "Isolated", "invert", 0);
    json_t *bl = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                           "use_regex", 0);
    json_t *pre = json_pack("{s:s, s:[oo]}", "type", "Sequence", "pretokenizers", split, bl);
    json_t *dec = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                            "use_regex", 1);
    if (!pre || json_object_set_new(root, "pre_tokenizer", pre) || !dec ||
        json_object_set_new(root, "decoder", dec))
        goto oom;

    /* special tokens: the rank count up, each named by the config or reserved */
    char *cfgpath = sd_strfmt("%s/tokenizer_config.json", dir);
    if (!cfgpath)
        goto oom;
    json_t *named = json_object_get(cfg, "added_tokens_decoder");
    int64_t base = (int64_t)R.max_rank + 1, last = base + reserved - 1;
    const char *key;
    json_t *val;
    json_object_foreach(named, key, val)
    {
        int64_t id = -1;
        if (sd_parse_i64(key, &id) || id < 0 || id >= MAX_RANK || !json_is_string(json_object_get(val, "content"))) {
            rc = sd_err_set(err, SD_EFORMAT, "%s: added_tokens_decoder[\"%.32s\"] is not an id with a content",
                            cfgpath, key);
            free(cfgpath);
            goto done;
        }
        if (id < base) {
            rc = sd_err_set(err, SD_EFORMAT,
                            "%s: added_tokens_decoder names id %lld, which tiktoken.model ranks (%lld ranks)",
                            cfgpath, (long long)id, (long long)base);
            free(cfgpath);
            goto done;
        }
        if (id > last)
            last = id;
    }
    free(cfgpath);
    json_t *added = json_array();
    if (!added || json_object_set_new(root, "added_tokens", added))
        goto oom;
    for (int64_t id = base; id <= last; id++) {
        char idk[24], rsv[48];
        snprintf(idk, sizeof idk, "%lld", (long long)id);
        json_t *like = json_object_get(named, idk), *c = json_object_get(like, "content");
        int rl = snprintf(rsv, sizeof rsv, "<|reserved_token_%lld|>", (long long)id);
        json_t *e = c ? added_entry(json_string_value(c), json_string_length(c), 1, like)
                      : added_entry(rsv, (size_t)rl, 1, NULL);
        /* ids follow the array's order (load_added re-derives them as HF does) */
        if (!e || json_object_set_new(e, "id", json_integer(id)) || json_array_append_new(added, e))
            goto oom;
    }
    *out = root;
    root = NULL;
    goto done;
oom:
    rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", file);
done:
    json_decref(root);
    free(mv);
    free(pat_from);
    sd_sbuf_free(&pat);
    sd_sbuf_free(&ls);
    sd_sbuf_free(&rs);
    sd_sbuf_free(&ms);
    ranks_free(&R);
    return rc;
}

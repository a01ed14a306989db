/* Tokenizer behaviour on hand-built tokenizer.json files: merge order, added-token
 * flags (HF's own unit-test cases), normalizers, split behaviours, the regex dialect,
 * invalid UTF-8, decoding, streaming, bos/eos, load errors, speed. The HF-produced
 * goldens are in test_tokenizer_golden.c. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utf8proc.h>

#include "core/tok_internal.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "test.h"

/* ---- helpers ---------------------------------------------------------------------- */

/* GPT-2's byte -> printable code point, UTF-8 encoded into out (NUL-terminated). */
static void bl_char(unsigned b, char out[4])
{
    unsigned cp = b, n = 0;
    int kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!kept) {
        for (unsigned x = 0; x < b; x++)
            n += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static char *mkdir_tmp(void)
{
    char tmpl[] = "/tmp/sdtok-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static void rm_tree(char *dir)
{
    if (!dir)
        return;
    char *cmd = sd_strfmt("rm -rf '%s'", dir);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
    free(cmd);
    free(dir);
}

/* Writes j (stolen) as dir/name. */
static int put_json(const char *dir, const char *name, json_t *j)
{
    char *p = sd_strfmt("%s/%s", dir, name);
    int rc = json_dump_file(j, p, JSON_ENSURE_ASCII);
    free(p);
    json_decref(j);
    return rc;
}

static json_t *added(int id, const char *content, int special, int normalized, int lstrip, int rstrip, int single)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "special", special,
                     "normalized", normalized, "lstrip", lstrip, "rstrip", rstrip, "single_word", single);
}

/* A tokenizer.json object: model BPE with vocab/merges (stolen), other parts (stolen
 * or NULL). */
static json_t *tok_json(json_t *vocab, json_t *merges, json_t *added_tokens, json_t *normalizer, json_t *pre,
                        json_t *decoder, int ignore_merges)
{
    json_t *model = json_pack("{s:s, s:o, s:o, s:b, s:n}", "type", "BPE", "vocab", vocab, "merges",
                              merges ? merges : json_array(), "ignore_merges", ignore_merges, "unk_token");
    return json_pack("{s:s, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "added_tokens",
                     added_tokens ? added_tokens : json_array(), "normalizer", normalizer ? normalizer : json_null(),
                     "pre_tokenizer", pre ? pre : json_null(), "decoder", decoder ? decoder : json_null(), "model",
                     model);
}

/* The 256 byte-level characters, ids 0..255 by byte value. */
static json_t *bl_vocab(void)
{
    json_t *v = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char c[4];
        bl_char(b, c);
        json_object_set_new(v, c, json_integer(b));
    }
    return v;
}

static json_t *bytelevel_pre(int use_regex)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                     "use_regex", use_regex);
}

static json_t *bytelevel_dec(void) { return json_pack("{s:s}", "type", "ByteLevel"); }

static sd_tokenizer *load_dir(const char *dir)
{
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    if (sd_tok_load(&t, dir, &err)) {
        fprintf(stderr, "  load %s: %s\n", dir, err.msg);
        return NULL;
    }
    return t;
}

/* encode(s) as a malloc'd array; n set; NULL on error (printed). */
static int32_t *enc(const sd_tokenizer *t, const char *s, size_t len, int *n)
{
    sd_err err = {0};
    int32_t *ids = NULL;
    if (sd_tok_encode(t, s, len, 0, &ids, n, &err)) {
        fprintf(stderr, "  encode: %s\n", err.msg);
        return NULL;
    }
    return ids;
}

static char *dec(const sd_tokenizer *t, const int32_t *ids, int n, int skip, size_t *len)
{
    sd_err err = {0};
    char *s = NULL;
    if (sd_tok_decode(t, ids, n, skip, &s, len, &err)) {
        fprintf(stderr, "  decode: %s\n", err.msg);
        return NULL;
    }
    return s;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

#define ASSERT_IDS(got, n, ...)                                                                       \
    do {                                                                                              \
        static const int32_t want_[] = {__VA_ARGS__};                                                 \
        int nw_ = (int)(sizeof want_ / sizeof want_[0]);                                              \
        if ((n) != nw_ || memcmp((got), want_, sizeof want_)) {                                       \
            print_ids("got ", (got), (n));                                                            \
            print_ids("want", want_, nw_);                                                            \
            TEST_FAIL_("ids differ");                                                                 \
        }                                                                                             \
    } while (0)

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- BPE merge order ------------------------------------------------------------- */

static sd_tokenizer *bl_with_merges(char **dir, const char *const (*m)[2], int nm, int ignore)
{
    json_t *v = bl_vocab(), *merges = json_array();
    for (int i = 0; i < nm; i++) {
        char *joined = sd_strfmt("%s%s", m[i][0], m[i][1]);
        if (!json_object_get(v, joined))
            json_object_set_new(v, joined, json_integer((json_int_t)json_object_size(v)));
        free(joined);
        json_array_append_new(merges, json_pack("[s, s]", m[i][0], m[i][1]));
    }
    *dir = mkdir_tmp();
    if (!*dir || put_json(*dir, "tokenizer.json", tok_json(v, merges, NULL, NULL, bytelevel_pre(0), bytelevel_dec(), ignore)))
        return NULL;
    return load_dir(*dir);
}

TEST(bpe_applies_the_lowest_rank_merge_first)
{
    char *d1, *d2;
    static const char *const ab_first[][2] = {{"a", "b"}, {"b", "c"}};
    static const char *const bc_first[][2] = {{"b", "c"}, {"a", "b"}};
    sd_tokenizer *t1 = bl_with_merges(&d1, ab_first, 2, 0), *t2 = bl_with_merges(&d2, bc_first, 2, 0);
    ASSERT(t1 && t2);
    int n1, n2;
    int32_t *i1 = enc(t1, "abc", 3, &n1), *i2 = enc(t2, "abc", 3, &n2);
    ASSERT(i1 && i2);
    ASSERT_IDS(i1, n1, 256, 'c'); /* ab c */
    ASSERT_IDS(i2, n2, 'a', 256); /* a bc (bc got id 256 there) */
    free(i1);
    free(i2);
    sd_tok_free(t1);
    sd_tok_free(t2);
    rm_tree(d1);
    rm_tree(d2);
}

TEST(bpe_breaks_rank_ties_to_the_left)
{
    char *d;
    static const char *const m[][2] = {{"a", "a"}, {"aa", "aa"}};
    sd_tokenizer *t = bl_with_merges(&d, m, 2, 0);
    ASSERT(t);
    int n;
    int32_t *ids = enc(t, "aaaaa", 5, &n); /* aa aa a -> aaaa a */
    ASSERT(ids);
    ASSERT_IDS(ids, n, 257, 'a');
    free(ids);
    ids = enc(t, "aaa", 3, &n); /* aa a, never a aa */
    ASSERT(ids);
    ASSERT_IDS(ids, n, 256, 'a');
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
}

/* Naive BPE: repeatedly merge the adjacent pair of lowest rank (leftmost on ties). */
typedef struct refm {
    int a, b, rank, id;
} refm;

static int ref_bpe(const refm *m, int nm, int *sym, int n)
{
    for (;;) {
        int best = -1, bi = -1, bid = -1;
        for (int i = 0; i + 1 < n; i++)
            for (int k = 0; k < nm; k++)
                if (m[k].a == sym[i] && m[k].b == sym[i + 1] && (best < 0 || m[k].rank < best)) {
                    best = m[k].rank;
                    bi = i;
                    bid = m[k].id;
                }
        if (bi < 0)
            return n;
        sym[bi] = bid;
        memmove(sym + bi + 1, sym + bi + 2, (size_t)(n - bi - 2) * sizeof *sym);
        n--;
    }
}

TEST(bpe_matches_a_naive_reference_on_random_merges_and_words)
{
    uint64_t s = sd_test_seed() | 1;
    for (int round = 0; round < 4; round++) {
        /* tokens over the alphabet {a,b,c,d}; merges join two existing tokens */
        char *str[300];
        int nstr = 4, nm = 0;
        refm m[296];
        for (int i = 0; i < 4; i++)
            str[i] = sd_strfmt("%c", 'a' + i);
        json_t *v = bl_vocab(), *merges = json_array();
        while (nstr < 60 + round * 40) {
            int a = (int)(rng_next(&s) % (uint64_t)nstr), b = (int)(rng_next(&s) % (uint64_t)nstr);
            char *j = sd_strfmt("%s%s", str[a], str[b]);
            if (strlen(j) > 12 || json_object_get(v, j)) {
                free(j);
                continue;
            }
            int ida = a < 4 ? 'a' + a : 256 + a - 4, idb = b < 4 ? 'a' + b : 256 + b - 4;
            m[nm] = (refm){ida, idb, nm, 256 + nstr - 4};
            nm++;
            json_object_set_new(v, j, json_integer(256 + nstr - 4));
            json_array_append_new(merges, json_pack("[s, s]", str[a], str[b]));
            str[nstr++] = j;
        }
        char *d = mkdir_tmp();
        ASSERT(d && !put_json(d, "tokenizer.json", tok_json(v, merges, NULL, NULL, bytelevel_pre(0), bytelevel_dec(), 0)));
        sd_tokenizer *t = load_dir(d);
        ASSERT(t);
        for (int w = 0; w < 200; w++) {
            char word[64];
            int sym[64], len = 1 + (int)(rng_next(&s) % 40);
            for (int i = 0; i < len; i++) {
                word[i] = (char)('a' + rng_next(&s) % 4);
                sym[i] = word[i];
            }
            int nref = ref_bpe(m, nm, sym, len), n;
            int32_t *ids = enc(t, word, (size_t)len, &n);
            ASSERT(ids);
            int same = n == nref;
            for (int i = 0; same && i < n; i++)
                same = ids[i] == sym[i];
            if (!same) {
                fprintf(stderr, "  word %.*s\n", len, word);
                print_ids("got ", ids, n);
                print_ids("want", sym, nref);
            }
            free(ids);
            ASSERT(same);
        }
        sd_tok_free(t);
        rm_tree(d);
        for (int i = 0; i < nstr; i++)
            free(str[i]);
    }
}

TEST(merges_as_strings_and_as_pairs_give_the_same_ids)
{
    static const char *const m[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"o", "w"}};
    char *d1;
    sd_tokenizer *t1 = bl_with_merges(&d1, m, 5, 0);
    ASSERT(t1);
    /* the same file with "a b" merges */
    char *path = sd_strfmt("%s/tokenizer.json", d1);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    free(path);
    ASSERT(j);
    json_t *merges = json_object_get(json_object_get(j, "model"), "merges");
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *p = json_array_get(merges, i);
        char *s = sd_strfmt("%s %s", json_string_value(json_array_get(p, 0)), json_string_value(json_array_get(p, 1)));
        json_array_set_new(merges, i, json_string(s));
        free(s);
    }
    char *d2 = mkdir_tmp();
    ASSERT(d2 && !put_json(d2, "tokenizer.json", j));
    sd_tokenizer *t2 = load_dir(d2);
    ASSERT(t2);
    const char *text = "hello hellow owl hhee";
    int n1, n2;
    int32_t *i1 = enc(t1, text, strlen(text), &n1), *i2 = enc(t2, text, strlen(text), &n2);
    ASSERT(i1 && i2);
    ASSERT_EQ(n1, n2);
    ASSERT(!memcmp(i1, i2, (size_t)n1 * sizeof *i1));
    ASSERT_EQ(i1[0], 259); /* hello */
    free(i1);
    free(i2);
    sd_tok_free(t1);
    sd_tok_free(t2);
    rm_tree(d1);
    rm_tree(d2);
}

/* ---- added tokens ------------------------------------------------------------------ */

/* A character-level BPE (no merges, no pre-tokenizer) over the given characters,
 * with a Lowercase normalizer and added tokens; Fuse decoder. */
static sd_tokenizer *char_tok(char **dir, const char *chars, json_t *added_tokens, json_t *normalizer, json_t *pre,
                              json_t *extra_vocab, int ignore)
{
    json_t *v = json_object();
    const unsigned char *p = (const unsigned char *)chars;
    int id = 0;
    while (*p) {
        size_t l = *p < 0x80 ? 1 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : 2;
        char c[5] = {0};
        memcpy(c, p, l);
        if (!json_object_get(v, c))
            json_object_set_new(v, c, json_integer(id++));
        p += l;
    }
    const char *k;
    json_t *x;
    json_object_foreach(extra_vocab, k, x) json_object_set_new(v, k, json_integer(id++));
    json_decref(extra_vocab);
    *dir = mkdir_tmp();
    if (!*dir || put_json(*dir, "tokenizer.json",
                          tok_json(v, NULL, added_tokens, normalizer, pre, json_pack("{s:s}", "type", "Fuse"), ignore)))
        return NULL;
    return load_dir(*dir);
}

/* ids of each character of s (char-level vocabulary) appended to out. */
static int chars_ids(const sd_tokenizer *t, const char *s, int32_t *out)
{
    int n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t l = *p < 0x80 ? 1 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : 2;
        out[n++] = sd_tok_token_id(t, (const char *)p, l);
        p += l;
    }
    return n;
}

static const char ASCII[] = "\t\n !\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";

TEST(added_tokens_follow_hf_lstrip_rstrip_single_word_and_normalized)
{
    /* HF added_vocabulary.rs options_use_cases: Lowercase normalizer; "my" lstrip+rstrip,
     * "name", "ony" single_word (all normalized); [CLS] [SEP] special. */
    json_t *a = json_array();
    json_array_append_new(a, added(100, "my", 0, 1, 1, 1, 0));
    json_array_append_new(a, added(101, "name", 0, 1, 0, 0, 0));
    json_array_append_new(a, added(102, "ony", 0, 1, 0, 0, 1));
    json_array_append_new(a, added(103, "[CLS]", 1, 0, 0, 0, 0));
    json_array_append_new(a, added(104, "[SEP]", 1, 0, 0, 0, 0));
    char *d;
    sd_tokenizer *t = char_tok(&d, ASCII, a, json_pack("{s:s}", "type", "Lowercase"), NULL, NULL, 0);
    ASSERT(t);
    int32_t my = sd_tok_token_id(t, "my", 2), name = sd_tok_token_id(t, "name", 4);
    int32_t cls = sd_tok_token_id(t, "[CLS]", 5), sep = sd_tok_token_id(t, "[SEP]", 5);
    ASSERT(my >= 0 && name >= 0 && cls >= 0 && sep >= 0);
    const char *text = "[CLS] My name is Anthony [SEP]";
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    ASSERT(ids);
    int32_t want[64];
    int nw = 0;
    want[nw++] = cls;
    want[nw++] = my; /* " my " taken whole */
    want[nw++] = name;
    nw += chars_ids(t, " is anthony ", want + nw); /* "ony" is not a single word here */
    want[nw++] = sep;
    if (n != nw || memcmp(ids, want, (size_t)n * sizeof *ids)) {
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
        TEST_FAIL_("added-token split differs from HF's");
    }
    free(ids);
    ASSERT(sd_tok_is_special(t, cls) && !sd_tok_is_special(t, my));
    sd_tok_free(t);
    rm_tree(d);
}

TEST(single_word_tokens_need_non_word_characters_around_them)
{
    /* HF test_single_word_is_correct */
    json_t *a = json_array();
    json_array_append_new(a, added(200, "<mask>", 0, 1, 0, 0, 1));
    char *d;
    sd_tokenizer *t = char_tok(&d, ASCII, a, json_pack("{s:s}", "type", "Lowercase"), NULL, NULL, 0);
    ASSERT(t);
    int32_t mask = sd_tok_token_id(t, "<mask>", 6);
    const char *text = "<mask> My name <mask> A<mask> <mask>ony <mask>";
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    ASSERT(ids);
    int32_t want[80];
    int nw = 0;
    want[nw++] = mask;
    nw += chars_ids(t, " my name ", want + nw);
    want[nw++] = mask;
    nw += chars_ids(t, " a<mask> <mask>ony ", want + nw);
    want[nw++] = mask;
    if (n != nw || memcmp(ids, want, (size_t)n * sizeof *ids)) {
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
        TEST_FAIL_("single_word split differs from HF's");
    }
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(lstrip_and_rstrip_take_unicode_whitespace)
{
    /* HF test_lstrip_unicode_space: "Hi <mask> there\t<mask>\t<mask>\u2000" */
    json_t *a = json_array();
    json_array_append_new(a, added(300, "<mask>", 0, 1, 1, 1, 1));
    char *d;
    char *chars = sd_strfmt("%s\u2000", ASCII);
    sd_tokenizer *t = char_tok(&d, chars, a, json_pack("{s:s}", "type", "Lowercase"), NULL, NULL, 0);
    free(chars);
    ASSERT(t);
    int32_t mask = sd_tok_token_id(t, "<mask>", 6);
    const char *text = "Hi <mask> there\t<mask>\t<mask>\u2000";
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    ASSERT(ids);
    int32_t want[40];
    int nw = chars_ids(t, "hi", want);
    want[nw++] = mask;
    nw += chars_ids(t, "there", want + nw);
    want[nw++] = mask;
    want[nw++] = mask;
    if (n != nw || memcmp(ids, want, (size_t)n * sizeof *ids)) {
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
        TEST_FAIL_("lstrip/rstrip split differs from HF's");
    }
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(added_tokens_match_leftmost_longest_and_inside_words)
{
    json_t *a = json_array();
    json_array_append_new(a, added(400, "<|a|>", 1, 0, 0, 0, 0));
    json_array_append_new(a, added(401, "<|a|>x", 1, 0, 0, 0, 0));
    json_array_append_new(a, added(402, "|>x", 1, 0, 0, 0, 0));
    char *d;
    sd_tokenizer *t = char_tok(&d, ASCII, a, NULL, NULL, NULL, 0);
    ASSERT(t);
    int32_t a1 = sd_tok_token_id(t, "<|a|>", 5), a2 = sd_tok_token_id(t, "<|a|>x", 6);
    int n;
    int32_t *ids = enc(t, "q<|a|>xy<|a|><|a|", 17, &n);
    ASSERT(ids);
    int32_t want[20];
    int nw = chars_ids(t, "q", want);
    want[nw++] = a2; /* longest at the leftmost start, even though "|>x" overlaps */
    nw += chars_ids(t, "y", want + nw);
    want[nw++] = a1;
    nw += chars_ids(t, "<|a|", want + nw);
    ASSERT_EQ(n, nw);
    ASSERT(!memcmp(ids, want, (size_t)n * sizeof *ids));
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
}

/* ---- normalizers -------------------------------------------------------------------- */

/* decode(encode(in)) with a Fuse decoder over a character vocabulary == want. */
static int norm_case(json_t *normalizer, const char *in, const char *want)
{
    char *chars = sd_strfmt("%s%s", ASCII, want);
    char *d;
    sd_tokenizer *t = char_tok(&d, chars, NULL, normalizer, NULL, NULL, 0);
    free(chars);
    if (!t)
        return 0;
    int n;
    int32_t *ids = enc(t, in, strlen(in), &n);
    size_t len;
    char *out = ids ? dec(t, ids, n, 0, &len) : NULL;
    int ok = out && len == strlen(want) && !memcmp(out, want, len);
    if (!ok)
        fprintf(stderr, "  normalized \"%s\" -> \"%s\", want \"%s\"\n", in, out ? out : "(error)", want);
    free(ids);
    free(out);
    sd_tok_free(t);
    rm_tree(d);
    return ok;
}

TEST(normalizers_nfc_nfd_nfkc_lowercase_prepend_replace_strip)
{
    ASSERT(norm_case(json_pack("{s:s}", "type", "NFC"), "Ame\xcc\x81lie", "Am\xc3\xa9lie"));
    ASSERT(norm_case(json_pack("{s:s}", "type", "NFD"), "Am\xc3\xa9lie", "Ame\xcc\x81lie"));
    ASSERT(norm_case(json_pack("{s:s}", "type", "NFKC"), "\xef\xac\x81 \xe2\x91\xa0", "fi 1"));
    ASSERT(norm_case(json_pack("{s:s}", "type", "Lowercase"), "\xc4\xb0STANBUL \xce\xa3", "i\xcc\x87stanbul \xcf\x83"));
    ASSERT(norm_case(json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence", "normalizers", "type",
                               "Prepend", "prepend", "\xe2\x96\x81", "type", "Replace", "pattern", "String", " ",
                               "content", "\xe2\x96\x81"),
                     "hi there", "\xe2\x96\x81hi\xe2\x96\x81there"));
    ASSERT(norm_case(json_pack("{s:s, s:b, s:b}", "type", "Strip", "strip_left", 1, "strip_right", 1),
                     " \t x y \xe3\x80\x80", "x y"));
    ASSERT(norm_case(json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "normalizers", "type", "NFD", "type",
                               "StripAccents"),
                     "caf\xc3\xa9", "cafe"));
    ASSERT(norm_case(json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "Regex", "[0-9]+", "content", "#"),
                     "a1b22c333", "a#b#c#"));
}

TEST(normalizing_only_non_ascii_stretches_equals_normalizing_the_whole_text)
{
    /* The normalizers hand utf8proc the non-ASCII stretches only; on random mixes of
     * ASCII, combining marks, Hangul jamo and compatibility characters the result
     * must equal utf8proc on the whole string, for all four forms. */
    static const char *const pieces[] = {"a", "e", "A", " ", "n", "1", "\xcc\x81", "\xcc\x88", "\xcc\xa3", "\xcd\x84",
                                         "\xc3\xa9", "\xe1\x84\x80", "\xe1\x85\xa1", "\xe1\x86\xa8", "\xea\xb0\x80",
                                         "\xef\xac\x81", "\xe2\x91\xa0", "\xe2\x84\xab", "\xe0\xbd\xb3", "\xc5\xbf"};
    static const char *const kinds[] = {"NFC", "NFD", "NFKC", "NFKD"};
    static const int opts[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                               UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    uint64_t s = sd_test_seed() | 1;
    for (int k = 0; k < 4; k++) {
        char *d;
        sd_tokenizer *t = char_tok(&d, ASCII, NULL, json_pack("{s:s}", "type", kinds[k]), NULL, NULL, 0);
        ASSERT(t);
        for (int round = 0; round < 400; round++) {
            char in[256];
            size_t n = 0;
            int parts = 1 + (int)(rng_next(&s) % 24);
            for (int i = 0; i < parts; i++) {
                const char *pc = pieces[rng_next(&s) % SD_ARRAY_LEN(pieces)];
                memcpy(in + n, pc, strlen(pc));
                n += strlen(pc);
            }
            sd_sbuf got = {0};
            sd_err err = {0};
            ASSERT_OK(sd__normalize(t, in, n, &got, &err));
            utf8proc_uint8_t *want = NULL;
            utf8proc_ssize_t wl = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &want,
                                               (utf8proc_option_t)(UTF8PROC_STABLE | opts[k]));
            ASSERT(wl >= 0);
            ASSERT_MSG(got.len == (size_t)wl && !memcmp(got.p, want, got.len), "%s of \"%.*s\"", kinds[k], (int)n, in);
            free(want);
            sd_sbuf_free(&got);
        }
        sd_tok_free(t);
        rm_tree(d);
    }
}

/* ---- pre-tokenizer split behaviours ------------------------------------------------- */

/* pieces of "a-b--c" under a Split on "-" with behaviour b (ignore_merges: a piece
 * that is a vocabulary entry is one token). Returns the decoded pieces joined by |. */
static char *split_pieces(const char *behavior, int invert, const char *text)
{
    json_t *extra = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "a-", 0, "b-", 0, "-b", 0, "-c", 0,
                              "--", 0, "b--", 0, "--c", 0, "-b-", 0, "a-b", 0, "--c", 0);
    json_t *pre = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", "-", "behavior", behavior,
                            "invert", invert);
    char *d;
    sd_tokenizer *t = char_tok(&d, "abc-", NULL, NULL, pre, extra, 1);
    if (!t)
        return NULL;
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    char *out = NULL;
    if (ids) {
        size_t cap = 256, len = 0;
        out = calloc(1, cap);
        for (int i = 0; i < n && out; i++) {
            size_t l;
            const char *s = sd_tok_token_str(t, ids[i], &l);
            if (len + l + 2 >= cap)
                break;
            if (i)
                out[len++] = '|';
            memcpy(out + len, s, l);
            len += l;
        }
    }
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
    return out;
}

TEST(split_behaviours_match_hf)
{
    struct {
        const char *behavior;
        int invert;
        const char *want;
    } C[] = {
        {"Isolated", 0, "a|-|b|-|-|c"},        {"Removed", 0, "a|b|c"},
        {"MergedWithPrevious", 0, "a-|b-|-|c"}, {"MergedWithNext", 0, "a|-b|-|-c"},
        {"Contiguous", 0, "a|-|b|--|c"},        {"Removed", 1, "-|-|-"},
        {"MergedWithPrevious", 1, "a|-b|-|-c"}, {"MergedWithNext", 1, "a-|b-|-|c"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(C); i++) {
        char *got = split_pieces(C[i].behavior, C[i].invert, "a-b--c");
        ASSERT_MSG(got && !strcmp(got, C[i].want), "%s invert=%d: \"%s\", want \"%s\"", C[i].behavior, C[i].invert,
                   got ? got : "(error)", C[i].want);
        free(got);
    }
}

/* ---- regex dialect -------------------------------------------------------------------- */

static char *pieces_with(const char *regex, const char *behavior, const char *text, const char *chars, json_t *extra)
{
    json_t *pre = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", regex, "behavior",
                            behavior, "invert", 0);
    char *d;
    sd_tokenizer *t = char_tok(&d, chars, NULL, NULL, pre, extra, 1);
    if (!t)
        return NULL;
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    char *out = calloc(1, 512);
    size_t len = 0;
    for (int i = 0; ids && out && i < n; i++) {
        size_t l;
        const char *s = sd_tok_token_str(t, ids[i], &l);
        if (len + l + 2 >= 512)
            break;
        if (i)
            out[len++] = '|';
        memcpy(out + len, s, l);
        len += l;
    }
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
    return out;
}

TEST(regex_dialect_is_onigurumas_white_space_script_and_intersection)
{
    /* \s is White_Space: U+180E (Mongolian vowel separator) does not split */
    char *got = pieces_with("\\s+", "Removed", "a\xe1\xa0\x8e" "b c", "abc \xe1\xa0\x8e",
                            json_pack("{s:i}", "a\xe1\xa0\x8e" "b", 0));
    ASSERT_MSG(got && !strcmp(got, "a\xe1\xa0\x8e" "b|c"), "got \"%s\"", got ? got : "(error)");
    free(got);
    /* \p{Han} is the Script property: U+3001 (Script=Common, Script_Extensions has Han) is not Han */
    got = pieces_with("[\\p{Han}]+", "Isolated", "\xe6\xbc\xa2\xe3\x80\x81\xe5\xad\x97", "\xe6\xbc\xa2\xe3\x80\x81\xe5\xad\x97",
                      json_pack("{s:i}", "\xe6\xbc\xa2\xe3\x80\x81\xe5\xad\x97", 0));
    ASSERT_MSG(got && !strcmp(got, "\xe6\xbc\xa2|\xe3\x80\x81|\xe5\xad\x97"), "got \"%s\"", got ? got : "(error)");
    free(got);
    /* Kimi's class intersection [A&&[^B]] */
    got = pieces_with("[\\p{L}&&[^\\p{Han}]]+", "Isolated", "abc\xe6\xbc\xa2" "def", "abcdef\xe6\xbc\xa2",
                      json_pack("{s:i, s:i}", "abc", 0, "def", 0));
    ASSERT_MSG(got && !strcmp(got, "abc|\xe6\xbc\xa2|def"), "got \"%s\"", got ? got : "(error)");
    free(got);
    /* \h is a hex digit in Oniguruma's Ruby syntax */
    got = pieces_with("\\h+", "Isolated", "ff zz", "fz ", json_pack("{s:i}", "ff", 0));
    ASSERT_MSG(got && !strcmp(got, "ff| |z|z"), "got \"%s\"", got ? got : "(error)");
    free(got);
    /* (?i:'s): case-insensitive, the long s folds to s as in Oniguruma */
    got = pieces_with("(?i:'s)|\\p{L}+", "Isolated", "it'S o'\xc5\xbf", "its'So\xc5\xbf",
                      json_pack("{s:i, s:i, s:i}", "'S", 0, "'\xc5\xbf", 0, "it", 0));
    ASSERT_MSG(got && !strcmp(got, "it|'S|o|'\xc5\xbf"), "got \"%s\"", got ? got : "(error)");
    free(got);
}

/* A tokenizer.json from a literal (for the model options), loaded. */
static sd_tokenizer *from_text(char **dir, const char *json)
{
    *dir = mkdir_tmp();
    char *p = *dir ? sd_strfmt("%s/tokenizer.json", *dir) : NULL;
    int rc = p ? sd_write_file(p, json, strlen(json), NULL) : -1;
    free(p);
    return rc ? NULL : load_dir(*dir);
}

static int ids_are(const sd_tokenizer *t, const char *text, const int32_t *want, int nw)
{
    int n;
    int32_t *ids = enc(t, text, strlen(text), &n);
    int ok = ids && n == nw && !memcmp(ids, want, (size_t)n * sizeof *ids);
    if (!ok && ids) {
        fprintf(stderr, "  \"%s\":\n", text);
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
    }
    free(ids);
    return ok;
}

TEST(model_options_unk_fuse_byte_fallback_prefix_and_suffix_follow_hf)
{
    char *d;
    /* HF test_unk_not_fused / test_unk_get_fused */
    sd_tokenizer *t = from_text(&d, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2}, "
                                    "\"merges\": [], \"unk_token\": \"<unk>\"}}");
    ASSERT(t);
    ASSERT(ids_are(t, "accb", (int32_t[]){1, 0, 0, 2}, 4));
    sd_tok_free(t);
    rm_tree(d);
    t = from_text(&d, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2}, "
                      "\"merges\": [], \"unk_token\": \"<unk>\", \"fuse_unk\": true}}");
    ASSERT(t);
    ASSERT(ids_are(t, "accb", (int32_t[]){1, 0, 2}, 3));
    sd_tok_free(t);
    rm_tree(d);
    /* HF test_bpe_byte_fallback: <0x61> for a, <unk> for what has no byte token */
    t = from_text(&d, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<unk>\": 0, \"<0x61>\": 1, \"<0xC3>\": 2, "
                      "\"<0xA9>\": 3}, \"merges\": [], \"unk_token\": \"<unk>\", \"byte_fallback\": true}}");
    ASSERT(t);
    ASSERT(ids_are(t, "c", (int32_t[]){0}, 1));
    ASSERT(ids_are(t, "a\xc3\xa9", (int32_t[]){1, 2, 3}, 3));
    sd_tok_free(t);
    rm_tree(d);
    /* no unk token: an unknown character is dropped (HF) */
    t = from_text(&d, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}");
    ASSERT(t);
    ASSERT(ids_are(t, "axb", (int32_t[]){0, 1}, 2));
    sd_tok_free(t);
    rm_tree(d);
    /* HF test_bpe_with_continuing_subword_prefix */
    t = from_text(&d, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"##b\": 1, \"##c\": 2, \"ab\": 3, "
                      "\"abc\": 4}, \"merges\": [\"a ##b\", \"ab ##c\"], \"continuing_subword_prefix\": \"##\"}}");
    ASSERT(t);
    ASSERT(ids_are(t, "ab", (int32_t[]){3}, 1));
    ASSERT(ids_are(t, "abc", (int32_t[]){4}, 1));
    sd_tok_free(t);
    rm_tree(d);
    /* end_of_word_suffix on the last character of each word */
    t = from_text(&d, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": "
                      "\"Removed\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"b</w>\": 2, "
                      "\"a</w>\": 3, \"ab</w>\": 4}, \"merges\": [\"a b</w>\"], \"end_of_word_suffix\": \"</w>\"}}");
    ASSERT(t);
    ASSERT(ids_are(t, "ab a ba", (int32_t[]){4, 3, 1, 3}, 4));
    sd_tok_free(t);
    rm_tree(d);
}

TEST(decoders_none_joins_with_spaces_and_replace_works_per_token)
{
    char *d;
    /* no decoder: HF joins the token strings with " " */
    sd_tokenizer *t = from_text(&d, "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}], "
                                    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                                    "\"merges\": [[\"a\", \"b\"]]}}");
    ASSERT(t);
    int32_t ids[] = {3, 2, 0, 3, 1};
    size_t len;
    char *s = dec(t, ids, 5, 0, &len);
    ASSERT_STR_EQ(s, "<s> ab a <s> b");
    free(s);
    s = dec(t, ids, 5, 1, &len);
    ASSERT_STR_EQ(s, "ab a b");
    free(s);
    sd_err err = {0};
    sd_detok *dt;
    ASSERT_OK(sd_detok_new(&dt, t, 1, &err));
    char acc[64] = {0};
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(sd_detok_push(dt, &ids[i], 1, &s, &len, &err));
        strcat(acc, s);
        free(s);
    }
    ASSERT_STR_EQ(acc, "ab a b");
    sd_detok_free(dt);
    sd_tok_free(t);
    rm_tree(d);
    /* Sequence[Replace(▁ -> space), Fuse] */
    t = from_text(&d, "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
                      "{\"String\": \"\u2581\"}, \"content\": \" \"}, {\"type\": \"Fuse\"}]}, \"model\": {\"type\": "
                      "\"BPE\", \"vocab\": {\"\u2581hi\": 0, \"\u2581there\": 1, \"!\": 2}, \"merges\": []}}");
    ASSERT(t);
    int32_t ids2[] = {0, 1, 2};
    s = dec(t, ids2, 3, 0, &len);
    ASSERT_STR_EQ(s, " hi there!");
    free(s);
    sd_tok_free(t);
    rm_tree(d);
}

/* ---- invalid UTF-8, decoding, streaming ---------------------------------------------- */

static sd_tokenizer *small_bl(char **dir)
{
    /* merges over byte-level characters: "Ġ t", "h e", "Ġt he", and the two first
     * bytes of € (E2 82 -> "â" "Ĥ") */
    char e2[4], x82[4];
    bl_char(0xE2, e2);
    bl_char(0x82, x82);
    const char *const mm[][2] = {{"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0t", "he"}, {e2, x82}};
    json_t *v = bl_vocab(), *merges = json_array();
    for (int i = 0; i < 4; i++) {
        char *j = sd_strfmt("%s%s", mm[i][0], mm[i][1]);
        json_object_set_new(v, j, json_integer(256 + i));
        free(j);
        json_array_append_new(merges, json_pack("[s, s]", mm[i][0], mm[i][1]));
    }
    /* a vocabulary with a hole: ids 260..299 name no token */
    json_object_set_new(v, "qq", json_integer(300));
    /* HF numbers added tokens itself: a new content gets the model's entry count
     * (261), then max + 1, whatever "id" says (here deliberately wrong). */
    json_t *a = json_array();
    json_array_append_new(a, added(500, "<|eot|>", 1, 0, 0, 0, 0));
    json_array_append_new(a, added(501, "<tag>", 0, 0, 0, 0, 0));
    *dir = mkdir_tmp();
    if (!*dir || put_json(*dir, "tokenizer.json", tok_json(v, merges, a, NULL, bytelevel_pre(1), bytelevel_dec(), 0)))
        return NULL;
    return load_dir(*dir);
}

TEST(invalid_utf8_is_encoded_as_u_fffd_per_maximal_subpart)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    struct {
        const char *bad, *fixed;
    } C[] = {
        {"ab\xff" "cd", "ab\xef\xbf\xbd" "cd"},
        {"\xe2\x82 x", "\xef\xbf\xbd x"},                                        /* truncated: one U+FFFD */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},                /* surrogate: three */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                                /* overlong */
        {"end\xf0\x9f\x98", "end\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(C); i++) {
        int n1, n2;
        int32_t *a = enc(t, C[i].bad, strlen(C[i].bad), &n1), *b = enc(t, C[i].fixed, strlen(C[i].fixed), &n2);
        ASSERT(a && b);
        ASSERT_MSG(n1 == n2 && !memcmp(a, b, (size_t)n1 * sizeof *a), "case %zu", i);
        free(a);
        free(b);
    }
    /* NUL bytes are text like any other */
    int n;
    int32_t *ids = enc(t, "a\0b", 3, &n);
    ASSERT(ids);
    ASSERT_IDS(ids, n, 'a', 0, 'b');
    free(ids);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(decode_range_errors_holes_and_special_skipping)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    ASSERT_EQ(sd_tok_vocab_size(t), 301);
    ASSERT_EQ(sd_tok_token_id(t, "<|eot|>", 7), 261);
    ASSERT_EQ(sd_tok_token_id(t, "<tag>", 5), 262);
    sd_err err = {0};
    char *s = NULL;
    size_t len;
    int32_t bad[] = {'a', 301};
    ASSERT_EQ(sd_tok_decode(t, bad, 2, 0, &s, &len, &err), SD_ERANGE);
    ASSERT_CONTAINS(err.msg, "301");
    int32_t neg[] = {-1};
    ASSERT_EQ(sd_tok_decode(t, neg, 1, 0, &s, &len, &err), SD_ERANGE);
    int32_t hole[] = {'a', 280, 'b'}; /* no token has id 280: decodes to nothing, as in HF */
    s = dec(t, hole, 3, 0, &len);
    ASSERT_STR_EQ(s, "ab");
    free(s);
    int32_t sp[] = {'h', 261, 'i', 262};
    s = dec(t, sp, 4, 0, &len);
    ASSERT_STR_EQ(s, "h<|eot|>i<tag>");
    free(s);
    s = dec(t, sp, 4, 1, &len); /* only special tokens are skipped */
    ASSERT_STR_EQ(s, "hi<tag>");
    free(s);
    /* bytes that are not UTF-8 decode to U+FFFD like from_utf8_lossy */
    int32_t lone[] = {0xE2, 'x', 0xFF};
    s = dec(t, lone, 3, 0, &len);
    ASSERT_STR_EQ(s, "\xef\xbf\xbdx\xef\xbf\xbd");
    free(s);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(streaming_emits_whole_characters_only)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    sd_err err = {0};
    sd_detok *dt;
    ASSERT_OK(sd_detok_new(&dt, t, 0, &err));
    int32_t euro[] = {0xE2, 0x82, 0xAC}; /* € one byte at a time */
    const char *want[] = {"", "", "\xe2\x82\xac"};
    for (int i = 0; i < 3; i++) {
        char *s;
        size_t len;
        ASSERT_OK(sd_detok_push(dt, &euro[i], 1, &s, &len, &err));
        ASSERT_STR_EQ(s, want[i]);
        free(s);
    }
    /* an incomplete tail is held back, then flushed as U+FFFD */
    char *s;
    size_t len;
    int32_t cut[] = {'o', 'k', 0xF0, 0x9F};
    ASSERT_OK(sd_detok_push(dt, cut, 4, &s, &len, &err));
    ASSERT_STR_EQ(s, "ok");
    free(s);
    ASSERT_OK(sd_detok_flush(dt, &s, &len));
    ASSERT_STR_EQ(s, "\xef\xbf\xbd");
    free(s);
    /* a bad id is refused and changes nothing */
    int32_t bad[] = {'a', 9999};
    ASSERT_EQ(sd_detok_push(dt, bad, 2, &s, &len, &err), SD_ERANGE);
    ASSERT_OK(sd_detok_flush(dt, &s, &len));
    ASSERT_STR_EQ(s, "");
    free(s);
    sd_detok_free(dt);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(streaming_equals_full_decode_on_random_ids)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    uint64_t s = sd_test_seed() | 1;
    for (int round = 0; round < 300; round++) {
        int n = 1 + (int)(rng_next(&s) % 40), skip = (int)(rng_next(&s) & 1);
        int32_t ids[40];
        for (int i = 0; i < n; i++) {
            uint64_t r = rng_next(&s) % 10;
            ids[i] = r < 6 ? (int32_t)(0x80 + rng_next(&s) % 0x80) : r < 8 ? (int32_t)(rng_next(&s) % 0x80)
                                                                            : (int32_t)(256 + rng_next(&s) % 45);
        }
        size_t flen;
        char *full = dec(t, ids, n, skip, &flen);
        ASSERT(full);
        sd_err err = {0};
        sd_detok *dt;
        ASSERT_OK(sd_detok_new(&dt, t, skip, &err));
        char acc[4096];
        size_t alen = 0;
        for (int i = 0; i < n;) {
            int k = 1 + (int)(rng_next(&s) % 4);
            if (k > n - i)
                k = n - i;
            char *p;
            size_t l;
            ASSERT_OK(sd_detok_push(dt, ids + i, k, &p, &l, &err));
            ASSERT(l + alen < sizeof acc);
            memcpy(acc + alen, p, l);
            alen += l;
            free(p);
            i += k;
        }
        char *p;
        size_t l;
        ASSERT_OK(sd_detok_flush(dt, &p, &l));
        memcpy(acc + alen, p, l);
        alen += l;
        free(p);
        sd_detok_free(dt);
        ASSERT_MSG(alen == flen && !memcmp(acc, full, flen), "round %d", round);
        free(full);
    }
    sd_tok_free(t);
    rm_tree(d);
}

/* ---- bos / eos, loading ------------------------------------------------------------------ */

TEST(bos_and_eos_come_from_tokenizer_config_then_from_names)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    ASSERT_EQ(sd_tok_bos_id(t), -1); /* no config, no well-known name */
    sd_tok_free(t);
    ASSERT_OK(put_json(d, "tokenizer_config.json",
                       json_pack("{s:{s:s}, s:s}", "bos_token", "content", "<tag>", "eos_token", "<|eot|>")));
    t = load_dir(d);
    ASSERT(t);
    ASSERT_EQ(sd_tok_bos_id(t), 262);
    ASSERT_EQ(sd_tok_eos_id(t), 261);
    int n;
    sd_err err = {0};
    int32_t *ids;
    ASSERT_OK(sd_tok_encode(t, "he", 2, 1, &ids, &n, &err));
    ASSERT_IDS(ids, n, 262, 257);
    free(ids);
    sd_tok_free(t);
    ASSERT_OK(put_json(d, "tokenizer_config.json", json_pack("{s:n, s:s}", "bos_token", "eos_token", "<|eot|>")));
    t = load_dir(d);
    ASSERT(t);
    ASSERT_EQ(sd_tok_bos_id(t), -1); /* null: none */
    sd_tok_free(t);
    /* a broken config is an error naming it, not a silent fallback */
    char *cp = sd_strfmt("%s/tokenizer_config.json", d);
    ASSERT_OK(sd_write_file(cp, "{\"bos_token\": ", 14, NULL));
    free(cp);
    sd_err err2 = {0};
    t = NULL;
    ASSERT_EQ(sd_tok_load(&t, d, &err2), SD_EFORMAT);
    ASSERT_CONTAINS(err2.msg, "tokenizer_config.json:1:");
    rm_tree(d);
}

static void expect_load_error(const char *what, json_t *tok, int code, const char *needle)
{
    char *d = mkdir_tmp();
    if (!d || put_json(d, "tokenizer.json", tok)) {
        fprintf(stderr, "  %s: could not write\n", what);
        sd_test_failed_ = 1;
        rm_tree(d);
        return;
    }
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    int rc = sd_tok_load(&t, d, &err);
    if (rc != code || !strstr(err.msg, needle)) {
        fprintf(stderr, "  %s: rc %d (want %d), message \"%s\" (want \"%s\")\n", what, rc, code, err.msg, needle);
        sd_test_failed_ = 1;
    }
    sd_tok_free(t);
    rm_tree(d);
}

TEST(bad_tokenizer_files_are_refused_with_a_message_naming_the_part)
{
    json_t *v = json_pack("{s:i, s:i}", "a", 0, "b", 1);
    json_t *uni = tok_json(json_deep_copy(v), NULL, NULL, NULL, NULL, NULL, 0);
    json_object_set_new(json_object_get(uni, "model"), "type", json_string("Unigram"));
    expect_load_error("unigram", uni, SD_ENOTSUP, "model type Unigram");
    expect_load_error("whitespace split",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL, json_pack("{s:s}", "type", "WhitespaceSplit"), NULL, 0),
                      SD_ENOTSUP, "pre-tokenizer type WhitespaceSplit");
    expect_load_error("metaspace scheme",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL,
                               json_pack("{s:s, s:s}", "type", "Metaspace", "prepend_scheme", "sometimes"), NULL, 0),
                      SD_EFORMAT, "prepend_scheme 'sometimes' is not one of always, first, never");
    expect_load_error("metaspace replacement",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL,
                               json_pack("{s:s, s:s}", "type", "Metaspace", "replacement", "ab"), NULL, 0),
                      SD_EFORMAT, "replacement must be one character");
    expect_load_error("precompiled",
                      tok_json(json_deep_copy(v), NULL, NULL, json_pack("{s:s}", "type", "Precompiled"), NULL, NULL, 0),
                      SD_ENOTSUP, "normalizer type Precompiled");
    expect_load_error("metaspace decoder",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL, NULL, json_pack("{s:s}", "type", "Metaspace"), 0),
                      SD_ENOTSUP, "decoder type Metaspace");
    expect_load_error("strip of the end after fuse",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL, NULL,
                               json_pack("{s:s, s:[{s:s}, {s:s, s:s, s:i, s:i}]}", "type", "Sequence", "decoders",
                                         "type", "Fuse", "type", "Strip", "content", " ", "start", 0, "stop", 1),
                               0),
                      SD_ENOTSUP, "a Strip of the end (stop 1) after Fuse");
    expect_load_error("strip content",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL, NULL,
                               json_pack("{s:s, s:s, s:i}", "type", "Strip", "content", "ab", "start", 1), 0),
                      SD_EFORMAT, "needs a one-character \"content\"");
    expect_load_error("merge of unknown token", tok_json(json_deep_copy(v), json_pack("[[s, s]]", "a", "z"), NULL, NULL, NULL, NULL, 0),
                      SD_EFORMAT, "merges[0]: token \"z\"");
    expect_load_error("merged token missing", tok_json(json_deep_copy(v), json_pack("[s]", "a b"), NULL, NULL, NULL, NULL, 0),
                      SD_EFORMAT, "token \"ab\" is not in the vocabulary");
    expect_load_error("merge with two spaces", tok_json(json_deep_copy(v), json_pack("[s]", "a b c"), NULL, NULL, NULL, NULL, 0),
                      SD_EFORMAT, "one space");
    expect_load_error("bad regex",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL,
                               json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex", "(a", "behavior", "Isolated"),
                               NULL, 0),
                      SD_EFORMAT, "pre_tokenizer.pattern");
    expect_load_error("other intersection",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL,
                               json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex", "[a-z&&b]", "behavior", "Isolated"),
                               NULL, 0),
                      SD_ENOTSUP, "intersection");
    expect_load_error("bad behaviour",
                      tok_json(json_deep_copy(v), NULL, NULL, NULL,
                               json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "String", " ", "behavior", "Sideways"),
                               NULL, 0),
                      SD_EFORMAT, "Sideways");
    json_t *dropout = tok_json(json_deep_copy(v), NULL, NULL, NULL, NULL, NULL, 0);
    json_object_set_new(json_object_get(dropout, "model"), "dropout", json_real(0.1));
    expect_load_error("dropout", dropout, SD_ENOTSUP, "dropout");
    expect_load_error("negative id", tok_json(json_pack("{s:i}", "a", -3), NULL, NULL, NULL, NULL, NULL, 0), SD_EFORMAT,
                      "model.vocab[\"a\"]");
    json_decref(v);

    /* not JSON at all: file, line and column */
    char *d = mkdir_tmp();
    ASSERT(d);
    char *p = sd_strfmt("%s/tokenizer.json", d);
    ASSERT_OK(sd_write_file(p, "{\"model\": [1, 2,,]}", 19, NULL));
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    ASSERT_EQ(sd_tok_load(&t, p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, "tokenizer.json:1:");
    ASSERT_CONTAINS(err.msg, "malformed JSON");
    /* a folder without tokenizer.json, one with only tiktoken.model */
    unlink(p);
    ASSERT_EQ(sd_tok_load(&t, d, &err), SD_ENOENT);
    ASSERT_CONTAINS(err.msg, "no tokenizer.json");
    free(p);
    p = sd_strfmt("%s/tiktoken.model", d);
    ASSERT_OK(sd_write_file(p, "YQ== 0\n", 7, NULL));
    ASSERT_EQ(sd_tok_load(&t, d, &err), SD_ENOTSUP);
    ASSERT_CONTAINS(err.msg, "tiktoken.model");
    free(p);
    rm_tree(d);
    ASSERT_EQ(sd_tok_load(&t, "/nonexistent/tokenizer.json", &err), SD_ENOENT);
}

/* ---- SentencePiece-style tokenizer.json: Metaspace, ByteFallback, Strip ----------------- */

/* HF Metaspace: spaces become "▁"; prepend_scheme always / first / never puts
 * one before a piece that does not start with it (first: only the piece that
 * starts the input, not one after an added token); split breaks pieces before
 * each "▁" (merges cannot cross it), split false lets them. Vocabulary: ▁ 0,
 * a 1, b 2, a▁ 3, ▁b 4, ▁a 5, <s> 6 (special); merges a+▁ first, then ▁+b,
 * then ▁+a. */
TEST(metaspace_prepends_by_scheme_and_splits_before_the_replacement)
{
    static const char *const scheme[] = {"always", "first", "never"};
    for (int split = 0; split < 2; split++) {
        for (int sc = 0; sc < 3; sc++) {
            char json[1024];
            snprintf(json, sizeof json,
                     "{\"added_tokens\": [{\"id\": 6, \"content\": \"<s>\", \"special\": true}], "
                     "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
                     "\"prepend_scheme\": \"%s\", \"split\": %s}, "
                     "\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xe2\x96\x81\": 0, \"a\": 1, \"b\": 2, "
                     "\"a\xe2\x96\x81\": 3, \"\xe2\x96\x81" "b\": 4, \"\xe2\x96\x81" "a\": 5}, "
                     "\"merges\": [\"a \xe2\x96\x81\", \"\xe2\x96\x81 b\", \"\xe2\x96\x81 a\"]}}",
                     scheme[sc], split ? "true" : "false");
            char *d = NULL;
            sd_tokenizer *t = from_text(&d, json);
            ASSERT_MSG(t, "%s split %d", scheme[sc], split);
            int pre = sc < 2; /* at the input's start: always and first */
            /* "a b": [▁]a▁b; split: [▁a] [▁b]; not: a▁ then b (▁a first when prepended) */
            int32_t w[4];
            int n = 0;
            if (split) {
                w[n++] = pre ? 5 : 1;
                w[n++] = 4;
            } else if (pre) {
                w[n++] = 0; /* ▁ a ▁ b: a+▁ ranks first, then nothing joins ▁ and b */
                w[n++] = 3;
                w[n++] = 2;
            } else {
                w[n++] = 3;
                w[n++] = 2;
            }
            ASSERT_MSG(ids_are(t, "a b", w, n), "%s split %d", scheme[sc], split);
            /* a leading space is the prefix itself: " b" is ▁b under every scheme */
            int32_t lead[] = {4};
            ASSERT(ids_are(t, " b", lead, 1));
            /* after an added token: only "always" prepends */
            int32_t after[] = {6, sc == 0 ? 4 : 2};
            ASSERT_MSG(ids_are(t, "<s>b", after, 2), "%s split %d", scheme[sc], split);
            /* the input's start, then an added token, then a space */
            int32_t mid[] = {pre ? 5 : 1, 6, 4};
            ASSERT_MSG(ids_are(t, "a<s> b", mid, 3), "%s split %d", scheme[sc], split);
            sd_tok_free(t);
            rm_tree(d);
        }
    }
    /* the older form: add_prefix_space (true: always); split by default */
    char *d = NULL;
    sd_tokenizer *t = from_text(&d, "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", "
                                    "\"add_prefix_space\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": "
                                    "{\"_\": 0, \"a\": 1, \"_a\": 2}, \"merges\": [\"_ a\"]}}");
    ASSERT(t);
    int32_t w[] = {1, 2};
    ASSERT(ids_are(t, "a a", w, 2));
    sd_tok_free(t);
    rm_tree(d);
}

/* Llama-2's decoder: Replace ▁ -> " ", ByteFallback ("<0xAB>" is the byte),
 * Fuse, Strip one leading space of the whole text (a stream's start only, and
 * not where a special token comes first); ill-formed bytes decode to a U+FFFD
 * each, as SentencePiece's decode does. */
TEST(byte_fallback_and_strip_decode_as_sentencepiece)
{
    char *d = NULL;
    sd_tokenizer *t = from_text(
        &d, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}], "
            "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
            "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xe2\x96\x81\"}, \"content\": \" \"}, "
            "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
            "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}, "
            "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"<s>\": 0, "
            "\"\xe2\x96\x81Hi\": 1, \"\xe2\x96\x81\": 2, \"<0xE2>\": 3, \"<0x82>\": 4, \"<0xAC>\": 5, "
            "\"<0x41>\": 6, \"<0x4a>\": 7, \"x\": 8}, \"merges\": []}}");
    ASSERT(t);
    static const struct {
        int32_t ids[6];
        int n, skip;
        const char *want;
    } cases[] = {
        {{1, 2, 1}, 3, 0, "Hi  Hi"},              /* one leading space off, not the others */
        {{2, 2, 1}, 3, 0, "  Hi"},                /* one of three, not two */
        {{0, 1}, 2, 0, "<s> Hi"},                 /* the special comes first: nothing to strip */
        {{0, 1}, 2, 1, "Hi"},                     /* skipped: the text starts with the space */
        {{3, 4, 5, 8}, 4, 0, "\xe2\x82\xac" "x"}, /* bytes make a character */
        {{3, 4, 8}, 3, 0, "\xef\xbf\xbd\xef\xbf\xbd" "x"}, /* a cut one: U+FFFD a byte */
        {{6, 7}, 2, 0, "AJ"},                     /* either case of hex digits */
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        size_t len;
        char *s = dec(t, cases[i].ids, cases[i].n, cases[i].skip, &len);
        ASSERT_MSG(s && len == strlen(cases[i].want) && !memcmp(s, cases[i].want, len), "case %zu: \"%s\"", i,
                   s ? s : "(error)");
        free(s);
        /* streamed one id at a time: the same */
        sd_err err = {0};
        sd_detok *dt;
        ASSERT_OK(sd_detok_new(&dt, t, cases[i].skip, &err));
        sd_sbuf acc = {0};
        for (int k = 0; k <= cases[i].n; k++) {
            char *p;
            size_t l;
            if (k < cases[i].n)
                ASSERT_OK(sd_detok_push(dt, &cases[i].ids[k], 1, &p, &l, &err));
            else
                ASSERT_OK(sd_detok_flush(dt, &p, &l));
            ASSERT_OK(sd_sbuf_put(&acc, p, l));
            free(p);
        }
        ASSERT_MSG(acc.len == strlen(cases[i].want) && !memcmp(acc.p, cases[i].want, acc.len), "stream %zu", i);
        sd_sbuf_free(&acc);
        sd_detok_free(dt);
    }
    sd_tok_free(t);
    rm_tree(d);
    /* a Strip before Fuse acts on each token, both ends */
    t = from_text(&d, "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Strip\", \"content\": "
                      "\"-\", \"start\": 2, \"stop\": 1}, {\"type\": \"Fuse\"}]}, \"model\": {\"type\": \"BPE\", "
                      "\"vocab\": {\"---a--\": 0, \"b-\": 1}, \"merges\": []}}");
    ASSERT(t);
    int32_t ids[] = {0, 1};
    size_t len;
    char *s = dec(t, ids, 2, 0, &len);
    ASSERT_MSG(s && !strcmp(s, "-a-b"), "\"%s\"", s ? s : "(error)");
    free(s);
    sd_tok_free(t);
    rm_tree(d);
}

/* ---- tiktoken rank files ----------------------------------------------------------------- */

/* The split pattern of a tiktoken tokenizer is its code's pat_str: a literal,
 * adjacent literals, or a separator's join of a list or tuple of them, raw or
 * not, with comments between; other uses of the name are not it. */
TEST(tiktoken_pattern_is_read_from_the_models_python_source)
{
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"pat_str = r\"\\p{L}+| ?\\d\"\n", "\\p{L}+| ?\\d"},
        {"x = f(pat_str=self.pat_str)\nclass A:\n    pat_str: str = '\\\\s+' '|x'\n", "\\s+|x"},
        {"    pat_str = \"|\".join(\n        [\n            r\"\"\"[\\p{Han}]+\"\"\",  # CJK\n"
         "            r'''\\s+(?!\\S)''',\n            # a comment\n            \"\\t\\x41\\u00e9\\q\",\n"
         "        ]\n    )\n",
         "[\\p{Han}]+|\\s+(?!\\S)|\tA\xc3\xa9\\q"},
        {"pat_str = ''.join((r'a', r'b',))\n", "ab"},
        {"if pat_str == 'x':\n    pass\npat_str = (\n    r'one'\n    r'two'\n)\n", "onetwo"},
        {"pat_str = r\"a\\\"b\"\n", "a\\\"b"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_sbuf out = {0};
        ASSERT_EQ(sd__tiktoken_pattern_of_source(cases[i].src, strlen(cases[i].src), &out), 1);
        ASSERT_MSG(out.len == strlen(cases[i].want) && !memcmp(out.p, cases[i].want, out.len), "case %zu: [%.*s]",
                   i, (int)out.len, out.p);
        sd_sbuf_free(&out);
    }
    static const char *const none[] = {"",
                                       "pattern = r'x'\n",
                                       "pat_str = get_pattern()\n",
                                       "pat_str = 'unterminated\n",
                                       "my_pat_str = 'x'\n",
                                       "pat_str = '|'.join([r'a', name])\n"};
    for (size_t i = 0; i < SD_ARRAY_LEN(none); i++) {
        sd_sbuf out = {0};
        ASSERT_MSG(sd__tiktoken_pattern_of_source(none[i], strlen(none[i]), &out) == 0, "none %zu", i);
        sd_sbuf_free(&out);
    }
}

/* A rank file (base64 token, rank) with a pattern: ids, merges by rank, the
 * specials of tokenizer_config.json's added_tokens_decoder; and bad files. */
TEST(tiktoken_rank_files_load_and_bad_ones_are_refused_by_line)
{
    char *d = mkdir_tmp();
    ASSERT(d);
    char *py = sd_strfmt("%s/tokenization_x.py", d), *rk = sd_strfmt("%s/tiktoken.model", d),
         *cf = sd_strfmt("%s/tokenizer_config.json", d);
    /* the 256 bytes, then "ab" (256), "abc" (257), "bc" (258) */
    sd_sbuf f = {0};
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; b++) {
        char line[32];
        int l = snprintf(line, sizeof line, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
        ASSERT_OK(sd_sbuf_put(&f, line, (size_t)l));
    }
    static const char more[] = "YWI= 256\nYWJj 257\n\nYmM= 258\n";
    ASSERT_OK(sd_sbuf_put(&f, more, sizeof more - 1));
    ASSERT_OK(sd_write_file(rk, f.p, f.len, NULL));
    static const char src[] = "class T:\n    num_reserved_special_tokens = 4\n    pat_str = r\"\\S+|\\s+\"\n";
    ASSERT_OK(sd_write_file(py, src, sizeof src - 1, NULL));
    static const char cfg[] = "{\"eos_token\": \"<|end|>\", \"added_tokens_decoder\": {\"260\": {\"content\": "
                              "\"<|end|>\", \"special\": true}, \"264\": {\"content\": \"<tool>\", \"special\": false}}}";
    ASSERT_OK(sd_write_file(cf, cfg, sizeof cfg - 1, NULL));
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    ASSERT_OK(sd_tok_load(&t, d, &err));
    /* ranks 0-258, reserved 259-262 (260 named), 263 filled in up to the named 264 */
    ASSERT_EQ(sd_tok_vocab_size(t), 265);
    ASSERT_EQ(sd_tok_eos_id(t), 260);
    ASSERT(sd_tok_is_special(t, 259) && sd_tok_is_special(t, 263) && !sd_tok_is_special(t, 264));
    size_t l;
    const char *r = sd_tok_token_str(t, 263, &l);
    ASSERT(r && l == 22 && !memcmp(r, "<|reserved_token_263|>", 22));
    /* pieces (\S+|\s+ between the specials): "abc" whole, " ", "abcabc" by the
     * lowest rank first (ab, ab, then abc twice), the special, " ", "bc", <tool> */
    static const char text[] = "abc abcabc<|end|> bc<tool>";
    int32_t *ids = NULL;
    int n = 0;
    ASSERT_OK(sd_tok_encode(t, text, sizeof text - 1, 1, &ids, &n, &err));
    static const int32_t want[] = {257, ' ', 257, 257, 260, ' ', 258, 264};
    ASSERT_EQ(n, (int)SD_ARRAY_LEN(want));
    for (int i = 0; i < n; i++)
        ASSERT_EQ(ids[i], want[i]);
    free(ids);
    sd_tok_free(t);

    /* bad files: the line, or the part, is named */
    static const struct {
        const char *file, *body, *msg;
    } bad[] = {
        {"tiktoken.model", "YQ== 0\nnot-base64! 1\n", "tiktoken.model:2: not \"<base64 token> <rank>\""},
        {"tiktoken.model", "YQ== 0\nYg==\n", "tiktoken.model:2:"},
        {"tiktoken.model", "YQ== 0\nYg== -3\n", "tiktoken.model:2:"},
        {"tiktoken.model", "YQ== 0\nYQ== 1\n", "tiktoken.model:2: the token of rank 1 is there twice"},
        {"tiktoken.model", "\n\n", "no tokens"},
        {"tokenizer_config.json", "{\"added_tokens_decoder\": {\"1\": {\"content\": \"<x>\"}}}",
         "names id 1, which tiktoken.model ranks"},
        {"tokenizer_config.json", "{\"added_tokens_decoder\": {\"x\": {\"content\": \"<x>\"}}}",
         "added_tokens_decoder[\"x\"] is not an id"},
        {"tokenizer_config.json", "{\"added_tokens_decoder\": ", "malformed JSON"},
        {"tokenization_x.py", "pat_str = compute()\n", "no split pattern"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(bad); i++) {
        ASSERT_OK(sd_write_file(rk, "YQ== 0\nYg== 1\n", 14, NULL));
        ASSERT_OK(sd_write_file(py, src, sizeof src - 1, NULL));
        ASSERT_OK(sd_write_file(cf, "{}", 2, NULL));
        char *p = sd_strfmt("%s/%s", d, bad[i].file);
        ASSERT_OK(sd_write_file(p, bad[i].body, strlen(bad[i].body), NULL));
        free(p);
        t = NULL;
        memset(&err, 0, sizeof err);
        ASSERT_MSG(sd_tok_load(&t, d, &err) != 0, "bad %zu loaded", i);
        ASSERT(!t);
        ASSERT_CONTAINS(err.msg, bad[i].msg);
    }
    ASSERT(sd_tok_present(d));
    sd_sbuf_free(&f);
    free(py);
    free(rk);
    free(cf);
    rm_tree(d);
}

/* ---- concurrency, speed ---------------------------------------------------------------- */

typedef struct thr_arg {
    const sd_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    int n;
} thr_arg;

static void *thr_encode(void *p)
{
    thr_arg *a = p;
    sd_err err = {0};
    if (sd_tok_encode(a->t, a->text, a->len, 0, &a->ids, &a->n, &err))
        a->n = -1;
    return NULL;
}

static char *sample_text(size_t want, uint64_t *s)
{
    static const char *const words[] = {"the ", "quick ", "brown ", "fox ", "jumps\n", "über ", "日本語 ",
                                        "😀 ", "1234 ", "don't ", "\t", "  ", "hello, ", "world! "};
    char *buf = malloc(want + 32);
    size_t len = 0;
    while (buf && len < want) {
        const char *w = words[rng_next(s) % SD_ARRAY_LEN(words)];
        size_t l = strlen(w);
        memcpy(buf + len, w, l);
        len += l;
    }
    if (buf)
        buf[len] = 0;
    return buf;
}

TEST(threads_share_one_tokenizer_and_get_the_same_ids)
{
    char *d;
    sd_tokenizer *t = small_bl(&d);
    ASSERT(t);
    uint64_t s = sd_test_seed() | 1;
    char *text = sample_text(50000, &s);
    ASSERT(text);
    thr_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){t, text, strlen(text), NULL, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, thr_encode, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++) {
        ASSERT(a[i].n == a[0].n && a[0].n > 0);
        ASSERT(!memcmp(a[i].ids, a[0].ids, (size_t)a[0].n * sizeof(int32_t)));
    }
    size_t len;
    char *back = dec(t, a[0].ids, a[0].n, 0, &len);
    ASSERT(back && len == strlen(text) && !memcmp(back, text, len));
    free(back);
    for (int i = 0; i < 4; i++)
        free(a[i].ids);
    free(text);
    sd_tok_free(t);
    rm_tree(d);
}

TEST(a_megabyte_word_and_a_megabyte_of_text_encode_in_linearithmic_time)
{
    /* One pre-token of 1M symbols: a quadratic merge loop would take hours. The bound
     * leaves room for sanitizers on a slow machine; bench/tok_bench measures speed. */
    static const char *const m[][2] = {{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}, {"a", "b"}};
    char *d;
    sd_tokenizer *t = bl_with_merges(&d, m, 4, 0);
    ASSERT(t);
    size_t n = 1 << 20;
    char *big = malloc(n);
    ASSERT(big);
    for (size_t i = 0; i < n; i++)
        big[i] = i % 7 == 6 ? 'b' : 'a';
    double t0 = sd_now_s();
    int nid;
    int32_t *ids = enc(t, big, n, &nid);
    double dt = sd_now_s() - t0;
    ASSERT(ids);
    fprintf(stderr, "  1 MiB single word: %d ids in %.3f s\n", nid, dt);
    ASSERT_LT(dt, 20.0);
    size_t len;
    char *back = dec(t, ids, nid, 0, &len);
    ASSERT(back && len == n && !memcmp(back, big, n));
    free(back);
    free(ids);
    uint64_t s = sd_test_seed() | 1;
    char *text = sample_text(n, &s);
    ASSERT(text);
    t0 = sd_now_s();
    ids = enc(t, text, strlen(text), &nid);
    dt = sd_now_s() - t0;
    ASSERT(ids);
    fprintf(stderr, "  1 MiB of text: %d ids in %.3f s (%.1f MB/s)\n", nid, dt, (double)strlen(text) / dt / 1e6);
    ASSERT_LT(dt, 20.0);
    free(ids);
    free(text);
    free(big);
    sd_tok_free(t);
    rm_tree(d);
}

TEST_MAIN(T(bpe_applies_the_lowest_rank_merge_first), T(bpe_breaks_rank_ties_to_the_left),
          T(bpe_matches_a_naive_reference_on_random_merges_and_words),
          T(model_options_unk_fuse_byte_fallback_prefix_and_suffix_follow_hf),
          T(decoders_none_joins_with_spaces_and_replace_works_per_token), T(merges_as_strings_and_as_pairs_give_the_same_ids),
          T(added_tokens_follow_hf_lstrip_rstrip_single_word_and_normalized),
          T(single_word_tokens_need_non_word_characters_around_them), T(lstrip_and_rstrip_take_unicode_whitespace),
          T(added_tokens_match_leftmost_longest_and_inside_words), T(normalizers_nfc_nfd_nfkc_lowercase_prepend_replace_strip),
          T(normalizing_only_non_ascii_stretches_equals_normalizing_the_whole_text), T(split_behaviours_match_hf), T(regex_dialect_is_onigurumas_white_space_script_and_intersection),
          T(invalid_utf8_is_encoded_as_u_fffd_per_maximal_subpart), T(decode_range_errors_holes_and_special_skipping),
          T(streaming_emits_whole_characters_only), T(streaming_equals_full_decode_on_random_ids),
          T(bos_and_eos_come_from_tokenizer_config_then_from_names),
          T(bad_tokenizer_files_are_refused_with_a_message_naming_the_part),
          T(metaspace_prepends_by_scheme_and_splits_before_the_replacement),
          T(byte_fallback_and_strip_decode_as_sentencepiece),
          T(tiktoken_pattern_is_read_from_the_models_python_source),
          T(tiktoken_rank_files_load_and_bad_ones_are_refused_by_line),
          T(threads_share_one_tokenizer_and_get_the_same_ids),
          T(a_megabyte_word_and_a_megabyte_of_text_encode_in_linearithmic_time))

/* The tokenizer against HF `tokenizers` (tests/golden/tokenizer/golden.json, made by
 * tools/golden/tokenizers.py): four byte-level BPE tokenizers in the styles of
 * Llama-3/Qwen2, DeepSeek-V3, GPT-2 and Kimi-K2 (a converted tiktoken rank file),
 * over a corpus of unicode, emoji, CJK, combining marks, whitespace runs, tabs,
 * CRLF, contractions, digits, long runs, special tokens and the empty string.
 * kimiish is checked in two forms: the converted tokenizer.json, and the rank
 * file itself (tiktoken.model beside the model's tokenizer code and a
 * tokenizer_config.json, as a Kimi-K2 checkpoint ships it), whose ids are
 * also checked against tiktoken's own. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/tokenizer.h"
#include "core/utf8.h"
#include "core/util.h"
#include "test.h"

/* tests/golden/tokenizer/FILE, parsed */
static json_t *golden_file(const char *file)
{
    char *p = sd_strfmt("%s/tests/golden/tokenizer/%s", sd_test_srcdir(), file);
    json_error_t je;
    json_t *g = json_load_file(p, JSON_ALLOW_NUL, &je);
    if (!g)
        fprintf(stderr, "  %s:%d: %s\n", p, je.line, je.text);
    free(p);
    return g;
}

static sd_tokenizer *load(const char *name);
static json_t *golden(void) { return golden_file("golden.json"); }

/* Kimi-K2's own form: the split pattern as the model's tokenization_kimi.py
 * writes it (a "|".join of raw literals; this file is ours, written for the
 * test), num_reserved_special_tokens, and added_tokens_decoder naming the
 * specials from the rank count (3000) up. */
static const char KIMI_PY[] =
    "import tiktoken\n"
    "\n"
    "class TikTokenTokenizer:\n"
    "    num_reserved_special_tokens = 256\n"
    "\n"
    "    pat_str = \"|\".join(\n"
    "        [\n"
    "            r\"\"\"[\\p{Han}]+\"\"\",\n"
    "            r\"\"\"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?\"\"\",\n"
    "            r\"\"\"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?\"\"\",\n"
    "            r\"\"\"\\p{N}{1,3}\"\"\",\n"
    "            r\"\"\" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*\"\"\",  # punctuation\n"
    "            r\"\"\"\\s*[\\r\\n]+\"\"\",\n"
    "            r\"\"\"\\s+(?!\\S)\"\"\",\n"
    "            r\"\"\"\\s+\"\"\",\n"
    "        ]\n"
    "    )\n"
    "\n"
    "    def __init__(self, vocab_file, **kwargs):\n"
    "        self.model = tiktoken.Encoding(name='kimi', pat_str=self.pat_str, mergeable_ranks={},\n"
    "                                       special_tokens={})\n";
static const char *const KIMI_SPECIAL[] = {"[BOS]",         "[EOS]",        "<|im_end|>",  "<|im_user|>",
                                           "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"};

static char *g_kimi_dir; /* the form's folder, made once */

static void rm_kimi_dir(void)
{
    if (!g_kimi_dir)
        return;
    static const char *const files[] = {"tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = sd_strfmt("%s/%s", g_kimi_dir, files[i]);
        unlink(p);
        free(p);
    }
    rmdir(g_kimi_dir);
    free(g_kimi_dir);
    g_kimi_dir = NULL;
}

static const char *kimi_dir(void)
{
    if (g_kimi_dir)
        return g_kimi_dir;
    char tmpl[] = "/tmp/sdkimi-XXXXXX";
    if (!mkdtemp(tmpl))
        return NULL;
    g_kimi_dir = strdup(tmpl);
    atexit(rm_kimi_dir);
    char *src = sd_strfmt("%s/tests/golden/tokenizer/kimiish/tiktoken.model", sd_test_srcdir());
    char *dst = sd_strfmt("%s/tiktoken.model", g_kimi_dir), *data = NULL;
    size_t len = 0;
    int rc = sd_read_file(src, &data, &len, NULL) || sd_write_file(dst, data, len, NULL);
    free(src);
    free(dst);
    free(data);
    dst = sd_strfmt("%s/tokenization_kimi.py", g_kimi_dir);
    rc = rc || sd_write_file(dst, KIMI_PY, sizeof KIMI_PY - 1, NULL);
    free(dst);
    json_t *cfg = json_pack("{s:s, s:s, s:s, s:{s:[s,n]}}", "bos_token", "[BOS]", "eos_token", "[EOS]",
                            "tokenizer_class", "TikTokenTokenizer", "auto_map", "AutoTokenizer",
                            "tokenization_kimi.TikTokenTokenizer");
    json_t *named = json_object();
    for (int i = 0; i < 7; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", 3000 + i);
        json_object_set_new(named, id,
                            json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", KIMI_SPECIAL[i], "lstrip", 0,
                                      "normalized", 0, "rstrip", 0, "single_word", 0, "special", 1));
    }
    json_object_set_new(cfg, "added_tokens_decoder", named);
    dst = sd_strfmt("%s/tokenizer_config.json", g_kimi_dir);
    rc = rc || !cfg || json_dump_file(cfg, dst, 0);
    free(dst);
    json_decref(cfg);
    if (rc) {
        fprintf(stderr, "  could not make the tiktoken form's folder\n");
        rm_kimi_dir();
    }
    return g_kimi_dir;
}

/* How many forms a golden tokenizer is checked in (kimiish: 2). */
static int forms(const char *name) { return strcmp(name, "kimiish") ? 1 : 2; }

static sd_tokenizer *load_form(const char *name, int form)
{
    if (!form)
        return load(name);
    const char *d = kimi_dir();
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    if (d && sd_tok_load(&t, d, &err))
        fprintf(stderr, "  %s: %s\n", d, err.msg);
    return t;
}

static sd_tokenizer *load(const char *name)
{
    char *p = sd_strfmt("%s/tests/golden/tokenizer/%s", sd_test_srcdir(), name);
    sd_err err = {0};
    sd_tokenizer *t = NULL;
    if (sd_tok_load(&t, p, &err))
        fprintf(stderr, "  %s\n", err.msg);
    free(p);
    return t;
}

/* ids (JSON array) as int32; *n set. */
static int32_t *ids_of(const json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int i = 0; v && i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* 1 if got == want; otherwise prints where they part. */
static int same_ids(const char *what, const int32_t *got, int ng, const int32_t *want, int nw)
{
    int i = 0;
    while (i < ng && i < nw && got[i] == want[i])
        i++;
    if (i == ng && i == nw)
        return 1;
    fprintf(stderr, "  %s: ids differ at %d (got %d ids, want %d):", what, i, ng, nw);
    for (int k = i; k < i + 6 && k < ng; k++)
        fprintf(stderr, " %d", got[k]);
    fprintf(stderr, " | want");
    for (int k = i; k < i + 6 && k < nw; k++)
        fprintf(stderr, " %d", want[k]);
    fputc('\n', stderr);
    return 0;
}

static int same_text(const char *what, const char *got, size_t ng, const json_t *want)
{
    size_t nw = json_string_length(want);
    if (ng == nw && !memcmp(got, json_string_value(want), nw))
        return 1;
    size_t i = 0;
    while (i < ng && i < nw && got[i] == json_string_value(want)[i])
        i++;
    fprintf(stderr, "  %s: text differs at byte %zu (got %zu bytes, want %zu)\n", what, i, ng, nw);
    return 0;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* 1 when encoding s[0..n) (add_bos) does not give want's ids; says where. */
static int encode_differs(const sd_tokenizer *t, const char *what, const char *s, size_t n, int add_bos,
                          const json_t *want)
{
    int nw, ng;
    int32_t *w = ids_of(want, &nw), *got = NULL;
    sd_err err = {0};
    int bad;
    if (sd_tok_encode(t, s, n, add_bos, &got, &ng, &err)) {
        fprintf(stderr, "  %s: %s\n", what, err.msg);
        bad = 1;
    } else {
        bad = !same_ids(what, got, ng, w, nw);
    }
    free(got);
    free(w);
    return bad;
}

/* The golden "invalid" cases (hex bytes -> ids): how many differ. */
static int invalid_cases_differ(const sd_tokenizer *t, const char *name, const json_t *inv)
{
    int bad = 0;
    for (size_t i = 0; i < json_array_size(inv); i++) {
        json_t *c = json_array_get(inv, i);
        const char *hex = json_string_value(json_object_get(c, "hex"));
        size_t nb = strlen(hex) / 2;
        char *bytes = malloc(nb + 1);
        for (size_t b = 0; b < nb; b++)
            bytes[b] = (char)(hexval(hex[2 * b]) << 4 | hexval(hex[2 * b + 1]));
        char what[128];
        snprintf(what, sizeof what, "%s invalid %s", name, hex);
        bad += encode_differs(t, what, bytes, nb, 0, json_object_get(c, "ids"));
        free(bytes);
    }
    return bad;
}

/* 1 when ids pushed one at a time through the streaming detokenizer give the
 * full decode */
static int stream_is_full_decode(const sd_tokenizer *t, const int32_t *ids, int n)
{
    sd_err err = {0};
    char *full = NULL;
    size_t flen;
    if (sd_tok_decode(t, ids, n, 0, &full, &flen, &err))
        return 0;
    sd_detok *d;
    if (sd_detok_new(&d, t, 0, &err)) {
        free(full);
        return 0;
    }
    sd_sbuf acc = {0};
    int ok = 1;
    for (int i = 0; i <= n && ok; i++) {
        char *piece = NULL;
        size_t l = 0;
        ok = !(i < n ? sd_detok_push(d, &ids[i], 1, &piece, &l, &err) : sd_detok_flush(d, &piece, &l)) &&
             !sd_sbuf_put(&acc, piece, l);
        free(piece);
    }
    ok = ok && acc.len == flen && (!flen || !memcmp(acc.p, full, flen));
    sd_sbuf_free(&acc);
    sd_detok_free(d);
    free(full);
    return ok;
}

static char *short_name(const char *s)
{
    static char buf[48];
    size_t k = 0;
    for (; *s && k + 1 < sizeof buf; s++)
        buf[k++] = (*s >= 0x20 && *s < 0x7f) ? *s : '.';
    buf[k] = 0;
    return buf;
}

TEST(golden_ids_equal_hf_tokenizers_on_the_corpus)
{
    json_t *g = golden();
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    ASSERT_EQ(json_array_size(toks), 4);
    int bad = 0, checked = 0;
    for (size_t kf = 0; kf < 2 * json_array_size(toks); kf++) {
        json_t *tk = json_array_get(toks, kf / 2);
        int form = (int)(kf % 2);
        const char *name = json_string_value(json_object_get(tk, "name"));
        if (form >= forms(name))
            continue;
        sd_tokenizer *t = load_form(name, form);
        if (form)
            name = "kimiish (tiktoken.model)";
        ASSERT_MSG(t, "%s", name);
        /* the rank file's form: the reserved special ids too, 256 from the rank count */
        ASSERT_EQ(sd_tok_vocab_size(t), form ? 3000 + 256 : json_integer_value(json_object_get(tk, "vocab_size")));
        json_t *cases = json_object_get(tk, "cases"), *tk_ids = json_object_get(tk, "tiktoken_ids");
        if (form)
            ASSERT_EQ(json_array_size(tk_ids), json_array_size(cases));
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i), *text = json_object_get(c, "text");
            const char *s = json_string_value(text);
            size_t sl = json_string_length(text);
            char what[128];
            snprintf(what, sizeof what, "%s case %zu \"%s\"", name, i, short_name(s));
            bad += encode_differs(t, what, s, sl, 0, json_object_get(c, "ids"));
            if (form) { /* and tiktoken's own ids (allowed_special "all") */
                snprintf(what, sizeof what, "%s case %zu against tiktoken", name, i);
                bad += encode_differs(t, what, s, sl, 0, json_array_get(tk_ids, i));
            }
            /* HF's post-processor adds the bos where the tokenizer has a template */
            if (json_array_size(json_object_get(c, "ids_special")) == json_array_size(json_object_get(c, "ids")) + 1) {
                snprintf(what, sizeof what, "%s case %zu with bos", name, i);
                bad += encode_differs(t, what, s, sl, 1, json_object_get(c, "ids_special"));
            }
            checked++;
        }
        sd_tok_free(t);
    }
    fprintf(stderr, "  %d corpus strings checked, %d differ\n", checked, bad);
    json_decref(g);
    ASSERT_EQ(bad, 0);
}

TEST(golden_decodes_equal_hf_tokenizers)
{
    json_t *g = golden();
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    int bad = 0;
    for (size_t kf = 0; kf < 2 * json_array_size(toks); kf++) {
        json_t *tk = json_array_get(toks, kf / 2);
        int form = (int)(kf % 2);
        const char *name = json_string_value(json_object_get(tk, "name"));
        if (form >= forms(name))
            continue;
        sd_tokenizer *t = load_form(name, form);
        if (form)
            name = "kimiish (tiktoken.model)";
        ASSERT(t);
        /* the corpus ids, with and without special tokens */
        json_t *cases = json_object_get(tk, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i);
            int n;
            int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
            for (int skip = 0; skip < 2; skip++) {
                char *s = NULL, what[96];
                size_t len;
                sd_err err = {0};
                snprintf(what, sizeof what, "%s case %zu skip=%d", name, i, skip);
                if (sd_tok_decode(t, ids, n, skip, &s, &len, &err)) {
                    fprintf(stderr, "  %s: %s\n", what, err.msg);
                    bad++;
                } else {
                    bad += !same_text(what, s, len, json_object_get(c, skip ? "decode_skip" : "decode"));
                }
                free(s);
            }
            free(ids);
        }
        /* random ids, often bytes whose concatenation is not UTF-8 */
        json_t *dec = json_object_get(tk, "decode");
        for (size_t i = 0; i < json_array_size(dec); i++) {
            json_t *c = json_array_get(dec, i);
            int n;
            int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
            for (int skip = 0; skip < 2; skip++) {
                char *s = NULL, what[96];
                size_t len;
                sd_err err = {0};
                snprintf(what, sizeof what, "%s random ids %zu skip=%d", name, i, skip);
                if (sd_tok_decode(t, ids, n, skip, &s, &len, &err)) {
                    fprintf(stderr, "  %s: %s\n", what, err.msg);
                    bad++;
                } else {
                    bad += !same_text(what, s, len, json_object_get(c, skip ? "text_skip" : "text"));
                }
                free(s);
            }
            free(ids);
        }
        sd_tok_free(t);
    }
    json_decref(g);
    ASSERT_EQ(bad, 0);
}

TEST(round_trip_decode_encode_is_the_text_without_a_normalizer)
{
    /* llama3ish and kimiish have no normalizer: decode(encode(s)) == s exactly,
     * except where an added token with lstrip/rstrip (<mask>) absorbs the
     * whitespace around it, as HF's does. */
    json_t *g = golden();
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    for (size_t k = 0; k < json_array_size(toks); k++) {
        json_t *tk = json_array_get(toks, k);
        const char *name = json_string_value(json_object_get(tk, "name"));
        if (strcmp(name, "llama3ish") && strcmp(name, "kimiish"))
            continue;
        sd_tokenizer *t = load(name);
        ASSERT(t);
        json_t *cases = json_object_get(tk, "cases");
        for (size_t i = 0; i <= json_array_size(cases); i++) {
            json_t *text = i < json_array_size(cases) ? json_object_get(json_array_get(cases, i), "text")
                                                      : json_object_get(json_object_get(tk, "long"), "text");
            if (!strcmp(name, "llama3ish") && strstr(json_string_value(text), "<mask>"))
                continue;
            int32_t *ids;
            int n;
            sd_err err = {0};
            ASSERT_OK(sd_tok_encode(t, json_string_value(text), json_string_length(text), 0, &ids, &n, &err));
            char *s;
            size_t len;
            ASSERT_OK(sd_tok_decode(t, ids, n, 0, &s, &len, &err));
            ASSERT_MSG(same_text(name, s, len, text), "%s case %zu", name, i);
            free(s);
            free(ids);
        }
        sd_tok_free(t);
    }
    json_decref(g);
}

TEST(invalid_utf8_encodes_like_hf_on_the_replaced_text)
{
    json_t *g = golden();
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    for (size_t kf = 0; kf < 2 * json_array_size(toks); kf++) {
        json_t *tk = json_array_get(toks, kf / 2);
        int form = (int)(kf % 2);
        const char *name = json_string_value(json_object_get(tk, "name"));
        if (form >= forms(name))
            continue;
        sd_tokenizer *t = load_form(name, form);
        if (form)
            name = "kimiish (tiktoken.model)";
        ASSERT(t);
        json_t *inv = json_object_get(tk, "invalid");
        ASSERT_GT(json_array_size(inv), 5);
        ASSERT_EQ(invalid_cases_differ(t, name, inv), 0);
        sd_tok_free(t);
    }
    json_decref(g);
}

TEST(long_text_ids_and_streamed_decode_equal_hf)
{
    json_t *g = golden();
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    for (size_t kf = 0; kf < 2 * json_array_size(toks); kf++) {
        json_t *tk = json_array_get(toks, kf / 2), *lg = json_object_get(tk, "long");
        int form = (int)(kf % 2);
        const char *name = json_string_value(json_object_get(tk, "name"));
        if (form >= forms(name))
            continue;
        sd_tokenizer *t = load_form(name, form);
        ASSERT(t);
        json_t *text = json_object_get(lg, "text");
        int nw, n;
        int32_t *want = ids_of(json_object_get(lg, "ids"), &nw), *got;
        sd_err err = {0};
        ASSERT_OK(sd_tok_encode(t, json_string_value(text), json_string_length(text), 0, &got, &n, &err));
        ASSERT_MSG(same_ids(name, got, n, want, nw), "%s long text", name);
        ASSERT_MSG(stream_is_full_decode(t, got, n), "%s long text streamed", name);
        free(got);
        free(want);
        sd_tok_free(t);
    }
    json_decref(g);
}

TEST(bos_eos_and_special_flags_of_the_golden_tokenizers)
{
    sd_tokenizer *t = load("llama3ish");
    ASSERT(t);
    /* tokenizer_config.json beside it names them */
    ASSERT_EQ(sd_tok_bos_id(t), sd_tok_token_id(t, "<|begin_of_text|>", 17));
    ASSERT_EQ(sd_tok_eos_id(t), sd_tok_token_id(t, "<|eot_id|>", 10));
    ASSERT(sd_tok_is_special(t, sd_tok_bos_id(t)));
    ASSERT(!sd_tok_is_special(t, sd_tok_token_id(t, "<mask>", 6)));
    sd_tok_free(t);
    t = load("gpt2ish/tokenizer.json"); /* the file itself; no config: named tokens */
    ASSERT(t);
    ASSERT_EQ(sd_tok_bos_id(t), -1);
    ASSERT_EQ(sd_tok_eos_id(t), sd_tok_token_id(t, "<|endoftext|>", 13));
    sd_tok_free(t);
}

/* The rank file's form against the converted tokenizer.json: the same token
 * strings at every id, the specials named by tokenizer_config.json, the rest of
 * the 256 reserved ids named as Kimi's code names them and matched in text as
 * tiktoken's allowed_special "all" does. */
TEST(the_rank_files_form_has_the_converted_files_tokens_and_kimis_reserved_ids)
{
    sd_tokenizer *j = load("kimiish"), *t = load_form("kimiish", 1);
    ASSERT(j && t);
    ASSERT(sd_tok_present(kimi_dir()));
    for (int id = 0; id < sd_tok_vocab_size(j); id++) {
        size_t la = 0, lb = 0;
        const char *a = sd_tok_token_str(j, id, &la), *b = sd_tok_token_str(t, id, &lb);
        ASSERT_MSG(a && b && la == lb && !memcmp(a, b, la), "id %d", id);
        ASSERT_EQ(sd_tok_is_special(j, id), sd_tok_is_special(t, id));
    }
    ASSERT_EQ(sd_tok_bos_id(t), 3000);
    ASSERT_EQ(sd_tok_eos_id(t), 3001);
    size_t l = 0;
    const char *r = sd_tok_token_str(t, 3255, &l);
    ASSERT(r && l == strlen("<|reserved_token_3255|>") && !memcmp(r, "<|reserved_token_3255|>", l));
    ASSERT(sd_tok_is_special(t, 3010));
    static const char text[] = "a<|reserved_token_3010|>b<|im_end|>";
    int32_t *ids = NULL;
    int n = 0;
    sd_err err = {0};
    ASSERT_OK(sd_tok_encode(t, text, sizeof text - 1, 0, &ids, &n, &err));
    ASSERT_EQ(n, 4);
    ASSERT_EQ(ids[1], 3010);
    ASSERT_EQ(ids[3], 3002);
    char *out = NULL;
    size_t ol = 0;
    ASSERT_OK(sd_tok_decode(t, ids, n, 1, &out, &ol, &err));
    ASSERT(ol == 2 && !memcmp(out, "ab", 2));
    free(out);
    ASSERT_OK(sd_tok_decode(t, ids, n, 0, &out, &ol, &err));
    ASSERT(ol == sizeof text - 1 && !memcmp(out, text, ol));
    free(out);
    free(ids);
    /* the file named directly loads the same */
    char *p = sd_strfmt("%s/tiktoken.model", kimi_dir());
    sd_tokenizer *f = NULL;
    ASSERT_OK(sd_tok_load(&f, p, &err));
    ASSERT_EQ(sd_tok_vocab_size(f), 3256);
    sd_tok_free(f);
    free(p);
    sd_tok_free(j);
    sd_tok_free(t);
}

/* ---- SentencePiece BPE (tests/golden/tokenizer/spm_golden.json, made by
 * tools/golden/spm.py with SentencePiece as the oracle): one byte-fallback BPE
 * model as tokenizer.json in Llama-2's legacy form (Prepend + Replace
 * normalizers) and the Metaspace form (prepend_scheme first); decoder Replace,
 * ByteFallback, Fuse, Strip. */

/* encode (with and without bos), decode, invalid UTF-8 and the long text */
TEST(sentencepiece_bpe_ids_and_decodes_equal_sentencepieces)
{
    json_t *g = golden_file("spm_golden.json");
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    ASSERT_EQ(json_array_size(toks), 2);
    int bad = 0, checked = 0;
    for (size_t k = 0; k < json_array_size(toks); k++) {
        json_t *tk = json_array_get(toks, k);
        const char *name = json_string_value(json_object_get(tk, "name"));
        sd_tokenizer *t = load(name);
        ASSERT_MSG(t, "%s", name);
        ASSERT_EQ(sd_tok_vocab_size(t), json_integer_value(json_object_get(tk, "vocab_size")));
        ASSERT_EQ(sd_tok_bos_id(t), 1);
        ASSERT_EQ(sd_tok_eos_id(t), 2);
        json_t *cases = json_object_get(tk, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i), *text = json_object_get(c, "text");
            char what[128];
            for (int bos = 0; bos < 2; bos++) {
                snprintf(what, sizeof what, "%s case %zu%s \"%s\"", name, i, bos ? " with bos" : "",
                         short_name(json_string_value(text)));
                bad += encode_differs(t, what, json_string_value(text), json_string_length(text), bos,
                                      json_object_get(c, bos ? "ids_special" : "ids"));
            }
            /* decode: SentencePiece's, the dummy prefix's space stripped */
            int n;
            int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
            char *s = NULL;
            size_t len;
            sd_err err = {0};
            snprintf(what, sizeof what, "%s case %zu decode", name, i);
            if (sd_tok_decode(t, ids, n, 1, &s, &len, &err)) {
                fprintf(stderr, "  %s: %s\n", what, err.msg);
                bad++;
            } else {
                bad += !same_text(what, s, len, json_object_get(c, "decode"));
            }
            free(s);
            free(ids);
            checked++;
        }
        bad += invalid_cases_differ(t, name, json_object_get(tk, "invalid"));
        /* random ids (a quarter of them only byte pieces) */
        json_t *dec = json_object_get(tk, "decode");
        for (size_t i = 0; i < json_array_size(dec); i++) {
            json_t *c = json_array_get(dec, i);
            int n;
            int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
            char *s = NULL, what[96];
            size_t len;
            sd_err err = {0};
            snprintf(what, sizeof what, "%s random ids %zu", name, i);
            ASSERT_OK(sd_tok_decode(t, ids, n, 0, &s, &len, &err));
            bad += !same_text(what, s, len, json_object_get(c, "text"));
            free(s);
            free(ids);
        }
        /* <s> in text: the legacy form puts "▁" before the text after it (its
         * normalizer runs on each stretch between added tokens), Metaspace's
         * "first" does not (that text does not start the input) */
        int legacy = json_is_true(json_object_get(tk, "legacy"));
        int32_t *a = NULL, *b = NULL;
        int na = 0, nb = 0;
        sd_err e2 = {0};
        ASSERT_OK(sd_tok_encode(t, "Hello world", 11, 0, &a, &na, &e2));
        ASSERT_OK(sd_tok_encode(t, "<s>Hello world", 14, 0, &b, &nb, &e2));
        ASSERT_EQ(b[0], 1);
        if (legacy) {
            ASSERT(same_ids("after <s>", b + 1, nb - 1, a, na));
        } else {
            sd_sbuf pieces = {0};
            for (int i = 1; i < nb; i++) {
                size_t l;
                const char *p = sd_tok_token_str(t, b[i], &l);
                ASSERT_OK(sd_sbuf_put(&pieces, p, l));
            }
            ASSERT(pieces.len == 13 && !memcmp(pieces.p, "Hello\xe2\x96\x81world", 13));
            sd_sbuf_free(&pieces);
        }
        free(a);
        free(b);
        json_t *lg = json_object_get(tk, "long"), *text = json_object_get(lg, "text");
        int nw, n;
        int32_t *want = ids_of(json_object_get(lg, "ids"), &nw), *got = NULL;
        sd_err err = {0};
        ASSERT_OK(sd_tok_encode(t, json_string_value(text), json_string_length(text), 0, &got, &n, &err));
        bad += !same_ids("long text", got, n, want, nw);
        /* the stream equals the full decode: the dummy prefix's space stripped
         * from the stream's start only */
        char *full = NULL;
        size_t flen;
        ASSERT_OK(sd_tok_decode(t, got, n, 0, &full, &flen, &err));
        ASSERT(flen > 0 && full[0] != ' ');
        free(full);
        ASSERT_MSG(stream_is_full_decode(t, got, n), "%s long text streamed", name);
        free(got);
        free(want);
        sd_tok_free(t);
    }
    fprintf(stderr, "  %d corpus strings checked, %d differ\n", checked, bad);
    json_decref(g);
    ASSERT_EQ(bad, 0);
}

/* HF tokenizers' own ids and decodes of the SentencePiece fixtures
 * (spm_golden.json's "hf" entries, added on a machine with HF tokenizers by
 * bench/gpu/golden_hf.sh, tools/golden/spm.py --hf): the corpus and texts with
 * <s> / </s> inside, where the legacy and the Metaspace form differ. Skipped
 * until those entries are there. */
TEST(sentencepiece_bpe_equals_hf_tokenizers_where_recorded)
{
    json_t *g = golden_file("spm_golden.json");
    ASSERT(g);
    json_t *toks = json_object_get(g, "tokenizers");
    int bad = 0, checked = 0;
    for (size_t k = 0; k < json_array_size(toks); k++) {
        json_t *tk = json_array_get(toks, k), *hf = json_object_get(tk, "hf");
        if (!hf)
            continue;
        const char *name = json_string_value(json_object_get(tk, "name"));
        sd_tokenizer *t = load(name);
        ASSERT_MSG(t, "%s", name);
        for (size_t i = 0; i < json_array_size(hf); i++) {
            json_t *c = json_array_get(hf, i), *text = json_object_get(c, "text");
            const char *s = json_string_value(text);
            size_t sl = json_string_length(text);
            char what[128];
            snprintf(what, sizeof what, "%s hf case %zu \"%s\"", name, i, short_name(s));
            bad += encode_differs(t, what, s, sl, 0, json_object_get(c, "ids"));
            bad += encode_differs(t, what, s, sl, 1, json_object_get(c, "ids_special"));
            int n;
            int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
            for (int skip = 0; skip < 2; skip++) {
                char *out = NULL;
                size_t len;
                sd_err err = {0};
                if (sd_tok_decode(t, ids, n, skip, &out, &len, &err))
                    bad++;
                else
                    bad += !same_text(what, out, len, json_object_get(c, skip ? "decode_skip" : "decode"));
                free(out);
            }
            free(ids);
            checked++;
        }
        sd_tok_free(t);
    }
    json_decref(g);
    if (!checked)
        TEST_SKIP("spm_golden.json has no HF entries yet (bench/gpu/golden_hf.sh adds them)");
    fprintf(stderr, "  %d HF cases checked, %d differ\n", checked, bad);
    ASSERT_EQ(bad, 0);
}

TEST_MAIN(T(golden_ids_equal_hf_tokenizers_on_the_corpus), T(golden_decodes_equal_hf_tokenizers),
          T(round_trip_decode_encode_is_the_text_without_a_normalizer),
          T(invalid_utf8_encodes_like_hf_on_the_replaced_text), T(long_text_ids_and_streamed_decode_equal_hf),
          T(bos_eos_and_special_flags_of_the_golden_tokenizers),
          T(the_rank_files_form_has_the_converted_files_tokens_and_kimis_reserved_ids),
          T(sentencepiece_bpe_ids_and_decodes_equal_sentencepieces),
          T(sentencepiece_bpe_equals_hf_tokenizers_where_recorded))

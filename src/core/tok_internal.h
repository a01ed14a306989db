/* core/tok_internal: the tokenizer's private layout, shared by tokenizer.c (load,
 * decode) and tok_encode.c (normalize, pre-tokenize, BPE). Nothing outside
 * src/core/tok*.c includes this. */
#ifndef SD_CORE_TOK_INTERNAL_H
#define SD_CORE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/err.h"
#include "core/tokenizer.h"
#include "core/utf8.h"

/* ---- hashing and maps ---------------------------------------------------------- */

static inline uint64_t sd__hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

/* A hex digit's value, or -1. */
static inline int sd__hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* bytes -> int32, open addressing; keys are copied into the map's pool. */
typedef struct sd__strent {
    uint64_t hash;
    uint32_t off, len; /* key bytes in pool */
    int32_t val;
} sd__strent;
typedef struct sd__strmap {
    uint32_t *slot; /* cap slots: 0 empty, else entry index + 1 */
    uint32_t cap;   /* power of two */
    uint32_t n, ncap;
    sd__strent *ent;
    sd_sbuf pool;
} sd__strmap;

/* Inserts key -> val. Returns 1 if the key was there (its value is replaced when
 * overwrite), 0 if inserted, -1 when memory ran out. */
int sd__strmap_put(sd__strmap *m, const char *k, size_t len, int32_t val, int overwrite);
/* The value, or -1. */
int32_t sd__strmap_get(const sd__strmap *m, const char *k, size_t len);
void sd__strmap_free(sd__strmap *m);

/* (left id, right id) -> (rank, merged id): the BPE merges. */
typedef struct sd__pairent {
    uint64_t key; /* UINT64_MAX: empty */
    int32_t rank, id;
} sd__pairent;
typedef struct sd__pairmap {
    sd__pairent *t;
    uint32_t cap, n;
} sd__pairmap;

static inline uint64_t sd__pairkey(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static inline const sd__pairent *sd__pairmap_get(const sd__pairmap *m, int32_t a, int32_t b)
{
    if (!m->cap)
        return NULL;
    uint64_t k = sd__pairkey(a, b);
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    uint32_t mask = m->cap - 1, i = (uint32_t)(h >> 32) & mask;
    for (;;) {
        const sd__pairent *e = &m->t[i];
        if (e->key == k)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & mask;
    }
}
/* Later merges of the same pair replace earlier ones (HF builds a HashMap from the
 * list in order). -1 when memory ran out. */
int sd__pairmap_put(sd__pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
void sd__pairmap_free(sd__pairmap *m);

/* ---- pipeline steps ------------------------------------------------------------ */

typedef enum {
    SD__N_NFC,
    SD__N_NFD,
    SD__N_NFKC,
    SD__N_NFKD,
    SD__N_LOWER,
    SD__N_PREPEND,     /* s: text to prepend to a non-empty piece */
    SD__N_REPLACE_STR, /* s -> s2 */
    SD__N_REPLACE_RE,  /* re -> s2 */
    SD__N_STRIP,       /* left / right */
    SD__N_STRIP_ACCENTS,
} sd__norm_kind;

typedef struct sd__norm {
    sd__norm_kind kind;
    char *s, *s2;
    size_t slen, s2len;
    pcre2_code *re;
    int left, right;
} sd__norm;

typedef enum {
    SD__SPLIT_REMOVED,
    SD__SPLIT_ISOLATED,
    SD__SPLIT_MERGED_PREV,
    SD__SPLIT_MERGED_NEXT,
    SD__SPLIT_CONTIGUOUS,
} sd__split_behavior;

typedef enum { SD__P_SPLIT, SD__P_BYTELEVEL, SD__P_METASPACE } sd__pre_kind;
typedef enum { SD__PREPEND_NEVER, SD__PREPEND_FIRST, SD__PREPEND_ALWAYS } sd__prepend;

typedef struct sd__pre {
    sd__pre_kind kind;
    pcre2_code *re; /* SPLIT: the pattern; BYTELEVEL with use_regex: GPT-2's */
    sd__split_behavior behavior;
    int invert;
    int add_prefix_space;
    /* METASPACE: spaces become rep; rep goes before a piece (by prepend: never,
     * only where it starts the input, always) that does not start with it; with
     * split, pieces break before each rep */
    char *rep;
    size_t rep_len;
    sd__prepend prepend;
    int split;
} sd__pre;

/* An added token (tokenizer.json "added_tokens"). */
typedef struct sd__added {
    int32_t id;
    char *content; /* as given */
    size_t len;
    int special, single_word, lstrip, rstrip, normalized;
} sd__added;

/* A byte trie over added-token contents, for leftmost-longest matching. */
typedef struct sd__trie_node {
    int32_t child;  /* first child node, -1 none */
    int32_t next;   /* next sibling, -1 none */
    int32_t added;  /* index into t->added ending here, -1 none */
    unsigned char byte;
} sd__trie_node;
typedef struct sd__trie {
    sd__trie_node *node; /* node[0] is the root */
    int n, cap;
    int32_t root[256]; /* the root's children by byte, -1 none; node == NULL: no patterns */
} sd__trie;

/* Per id: what decoding emits (after the per-token decoder steps), and flags. */
enum { SD__TOK_PRESENT = 1, SD__TOK_SPECIAL = 2, SD__TOK_ADDED = 4 };
typedef struct sd__tokinfo {
    uint32_t str_off, str_len; /* vocabulary string in strpool */
    uint32_t dec_off, dec_len; /* decoded bytes in decpool */
    uint32_t flags;
} sd__tokinfo;

struct sd_tokenizer {
    char *path; /* the tokenizer.json read */

    /* model: BPE */
    sd__strmap vocab;  /* model vocabulary string -> id */
    sd__pairmap merges;
    int32_t unk_id;    /* -1 none */
    int fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix; /* NULL when unset */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_fb_id[256]; /* "<0xAB>" token ids for byte_fallback, -1 absent */

    /* ByteLevel: the model sees each byte as one printable character. */
    int byte_level;
    int32_t byte_id[256]; /* id of the one-byte token, -1 absent */
    sd__strmap raw;       /* raw bytes -> id of byte-level vocabulary entries */

    /* ids */
    int vocab_size; /* max id + 1 */
    sd__tokinfo *tok;
    sd_sbuf strpool, decpool;

    /* added tokens */
    sd__added *added;
    int n_added;
    sd__strmap added_map; /* content -> id */
    sd__trie raw_trie;    /* normalized == false */
    sd__trie norm_trie;   /* normalized == true, contents normalized */
    char **norm_content;  /* per added token: normalized content (norm_trie) */
    size_t *norm_len;

    sd__norm *norm;
    int n_norm;
    sd__pre *pre;
    int n_pre;

    int dec_join_space; /* no decoder: HF joins the token strings with " " */
    /* a Strip decoder after Fuse: up to dec_strip characters dec_strip_c come
     * off the start of a decode (SentencePiece's dummy prefix space) */
    int dec_strip;
    int dec_per_byte; /* ByteFallback: ill-formed bytes decode to a U+FFFD each */
    char dec_strip_c[4];
    size_t dec_strip_clen;

    int32_t bos, eos;
};

/* ---- shared helpers ------------------------------------------------------------ */

/* ByteLevel's map: byte -> code point, and code point (< 0x144) -> byte + 1 (0:
 * not a byte's). */
void sd__bl_tables(uint32_t b2c[256], uint16_t c2b[0x144]);

/* tok_tiktoken.c: a tiktoken rank file (file) in dir as the tokenizer.json
 * document transformers' TikTokenConverter writes for it (*root, a new
 * reference), its split pattern from dir's tokenization_*.py and its special
 * tokens from dir's tokenizer_config.json. */
struct json_t;
int sd__tok_tiktoken_json(const char *dir, const char *file, const struct json_t *cfg, struct json_t **root,
                          sd_err *err);
/* The pat_str of Python source: 1 (out set), 0 none, -1 no memory. */
int sd__tiktoken_pattern_of_source(const char *src, size_t n, sd_sbuf *out);

/* PCRE2 compile of an Oniguruma pattern (see tokenizer.h); what names the JSON
 * path in messages. literal: the pattern is a plain string. */
pcre2_code *sd__re_compile(const char *pat, size_t len, int literal, const char *what, sd_err *err);

/* Applies the normalizer steps to s[0..n) (valid UTF-8) into out (replacing its
 * content). 0, or a negative SD_E* code. */
int sd__normalize(const sd_tokenizer *t, const char *s, size_t n, sd_sbuf *out, sd_err *err);

/* One normalizer step (also the decoder's Replace): in -> out (emptied first). */
int sd__norm_step(const sd__norm *st, const char *in, size_t n, sd_sbuf *out, sd_err *err);

int sd__trie_add(sd__trie *tr, const char *s, size_t n, int32_t added);
void sd__trie_free(sd__trie *tr);

#endif

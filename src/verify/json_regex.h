/* verify/json_regex: a JSON Schema "pattern" (ECMA-262 syntax, a subset)
 * compiled to a DFA over a string's code points, for json_schema's strings.
 * Internal to verify (sd__jre_); json_schema.h says which patterns are
 * taken and what they mean.
 *
 * The DFA reads symbols: an ASCII code point is itself; every other code
 * point is one of three (a pattern names no non-ASCII character, so none
 * tells two of a symbol apart): the line terminators U+2028 and U+2029
 * ('.' excludes them), the other non-ASCII white space of \s, and the rest.
 * Search semantics (JSON Schema's): the DFA accepts the strings a part of
 * which the pattern matches; ^ and $ hold at the string's ends only. A dead
 * state (from which no string is accepted) is SD_JRE_DEAD, so every state a
 * string reaches can still end accepted. */
#ifndef SD_VERIFY_JSON_REGEX_H
#define SD_VERIFY_JSON_REGEX_H

#include <stddef.h>
#include <stdint.h>

enum {
    SD_JRE_LT = 128, /* U+2028, U+2029 */
    SD_JRE_WS,       /* U+00A0, U+1680, U+2000-200A, U+202F, U+205F, U+3000, U+FEFF */
    SD_JRE_OTHER,    /* any other non-ASCII code point (lone surrogates too) */
    SD_JRE_NSYM
};
#define SD_JRE_DEAD 0xffff
#define SD_JRE_MAX_STATES 2048 /* DFA states of one pattern */
#define SD_JRE_MAX_LEN 1000   /* bytes of a pattern */
#define SD_JRE_MAX_REP 1000   /* a repetition's count */
#define SD_JRE_NO_LEN UINT64_MAX
/* Steps (words of NFA state sets and NFA states touched) building a
 * schema's patterns' DFAs may take: a schema compiles on the thread that
 * reads requests, and (?:.+\s){1,450}, under both state caps, took 7.7M
 * steps, 35-50 ms (2^22: ~25 ms) */
#define SD_JRE_MAX_WORK (1u << 22)

typedef struct sd__jre {
    uint16_t nstate, nclass; /* the start is state 0 */
    uint8_t cls[SD_JRE_NSYM]; /* a symbol's class: symbols no set of the pattern tells apart */
    uint64_t *cmask;          /* (nclass, 3): each class's symbols */
    uint16_t *next;           /* (nstate, nclass): the next state, or SD_JRE_DEAD */
    uint8_t *acc;             /* (nstate): accepts where the string ends here */
    /* lengths (sd__jre_lengths; NULL before): R_n, the states from which some
     * string of n code points ends accepted, repeats from n = lt with period
     * lp; len[q (lt + lp) + m] is the least n >= m with q in R_n
     * (UINT32_MAX: none) */
    uint32_t *len;
    uint32_t lt, lp;
} sd__jre;

/* Compiles pattern pat (n bytes). 0; SD_EINVAL with why saying what is not
 * supported or too large (a phrase, e.g. "backreferences (\1) are not
 * supported"); SD_ENOMEM. re is freed on failure. *work: the steps its
 * DFA's construction may take, less those it took (NULL: SD_JRE_MAX_WORK). */
int sd__jre_compile(const char *pat, size_t n, uint64_t *work, sd__jre *re, char *why,
                    size_t cap);
/* Builds re's length table (for minLength / maxLength beside a pattern):
 * 0, SD_EINVAL (why: too irregular), SD_ENOMEM. */
int sd__jre_lengths(sd__jre *re, char *why, size_t cap);
void sd__jre_free(sd__jre *re);

/* the symbol of code point cp */
int sd__jre_sym(uint32_t cp);
/* ORs into m (3 words) the symbols of the code points in [lo, hi] that are
 * not surrogates */
void sd__jre_range(uint32_t lo, uint32_t hi, uint64_t m[3]);
/* the least n >= m such that some string of n code points takes state q to
 * an accepting end (SD_JRE_NO_LEN: none); needs the length table */
uint64_t sd__jre_next_len(const sd__jre *re, uint16_t q, uint64_t m);
/* 1 where the UTF-8 string s (n bytes, valid) is accepted */
int sd__jre_match(const sd__jre *re, const char *s, size_t n);

#endif

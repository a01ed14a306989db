/* core/utf8: UTF-8 decoding, repair and character classes for the text modules
 * (tokenizer, chat templates).
 *
 * Ill-formed input is repaired the way Python's bytes.decode('utf-8', 'replace')
 * and Rust's String::from_utf8_lossy do it: each maximal subpart of an ill-formed
 * sequence (Unicode 15, section 3.9, "U+FFFD substitution of maximal subparts")
 * becomes one U+FFFD. This module never allocates except through sd_sbuf. */
#ifndef SD_CORE_UTF8_H
#define SD_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer; zero-initialize, free with sd_sbuf_free. p stays
 * NUL-terminated once anything was put in it. */
typedef struct sd_sbuf {
    char *p;
    size_t len, cap;
} sd_sbuf;

/* 0, or -1 when memory ran out (the buffer keeps what it had). */
int sd_sbuf_reserve(sd_sbuf *b, size_t extra);
int sd_sbuf_put(sd_sbuf *b, const void *data, size_t n);
static inline int sd_sbuf_putc(sd_sbuf *b, char c) { return sd_sbuf_put(b, &c, 1); }
void sd_sbuf_free(sd_sbuf *b);
/* Hands the bytes over (malloc'd, NUL-terminated, never NULL unless out of memory)
 * and resets the buffer. */
char *sd_sbuf_take(sd_sbuf *b, size_t *len);

enum {
    SD_UTF8_OK = 0,         /* a whole valid character */
    SD_UTF8_INVALID = 1,    /* an ill-formed maximal subpart */
    SD_UTF8_INCOMPLETE = 2, /* a valid prefix cut off by the end of the input */
};

/* Looks at the character starting at s[0] (n >= 1 bytes available). Returns one of
 * SD_UTF8_*, sets *len to the bytes it spans (1..4; for INVALID the maximal
 * subpart, for INCOMPLETE what is there) and *cp to the code point (OK only). */
int sd_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, size_t *len);
/* 1 if s[0..n) is well-formed UTF-8. */
int sd_utf8_valid(const char *s, size_t n);
/* Writes cp as UTF-8 into out (4 bytes room); returns the length (1..4). */
int sd_utf8_encode(uint32_t cp, char *out);
/* Appends s[0..n) to out with every ill-formed maximal subpart replaced by U+FFFD.
 * With final == 0 a trailing incomplete character is not appended: the return
 * value is the number of input bytes consumed (n minus the held-back tail, at
 * most 3); with final != 0 the tail becomes one U+FFFD and n is returned.
 * Returns (size_t)-1 when memory ran out. */
size_t sd_utf8_repair(sd_sbuf *out, const char *s, size_t n, int final);
/* As sd_utf8_repair, with per_byte: every byte of an ill-formed sequence becomes
 * its own U+FFFD (SentencePiece's decode of byte pieces, and HF's ByteFallback
 * where the byte run is all ill-formed) in place of one a maximal subpart. */
size_t sd_utf8_repair_as(sd_sbuf *out, const char *s, size_t n, int final, int per_byte);

/* Python's str.isspace() (what Jinja's trim filter strips): Unicode White_Space
 * plus U+001C..U+001F. */
int sd_uc_py_space(uint32_t cp);
/* The Unicode White_Space property (Rust char::is_whitespace, Oniguruma \s). */
int sd_uc_white_space(uint32_t cp);

#endif

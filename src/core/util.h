/* core/util: small helpers shared by every module (time, files, number lists). */
#ifndef SD_CORE_UTIL_H
#define SD_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/err.h"

#define SD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock in nanoseconds. */
uint64_t sd_now_ns(void);
static inline double sd_now_s(void) { return (double)sd_now_ns() * 1e-9; }
/* splitmix64's step: a well-mixed 64-bit value of x (ids, keys; not the
 * samplers' counter RNG, verify/sampling.c) */
static inline uint64_t sd_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* JSON's whitespace (space, tab, CR, LF) */
static inline int sd_json_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
/* The longest tail of s[0..n) that is a proper prefix of tag[0..tl): the
 * bytes a text streamed in pieces holds back while the tag may be coming
 * (stop strings, tool-call and reasoning tags). */
static inline size_t sd_tag_tail(const char *s, size_t n, const char *tag, size_t tl)
{
    if (!tl)
        return 0;
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

/* p (an array of elem-byte elements, room for *cap) reallocated to hold
 * need (room doubling from 16): the new array, or NULL (p kept, *cap as
 * it was) */
void *sd_grow(void *p, uint32_t *cap, uint32_t need, size_t elem);
/* Reads a whole file into a NUL-terminated malloc'd buffer. */
int sd_read_file(const char *path, char **data, size_t *len, sd_err *err);
/* Writes len bytes to path (created/truncated). */
int sd_write_file(const char *path, const void *data, size_t len, sd_err *err);
int sd_file_exists(const char *path);
int sd_dir_exists(const char *path);
/* snprintf into a malloc'd string. */
char *sd_strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* snprintf appended to buf (len bytes) at *off, which it advances; what does
 * not fit is cut, buf stays NUL-terminated */
void sd_bufappend(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "1,2,3" -> malloc'd int32 array. what names the flag in the message. */
int sd_parse_ids(const char *s, int32_t **ids, int *n, const char *what, sd_err *err);
/* Strict number parsing: whole string, no overflow. */
int sd_parse_i64(const char *s, int64_t *out);
int sd_parse_f64(const char *s, double *out);

/* The bundled model's folder: $SPECD_BUNDLED_MODEL, else the compile-time
 * SD_BUNDLED_MODEL_DIR (the source tree's models/specd-tiny). */
const char *sd_bundled_model_dir(void);

#endif

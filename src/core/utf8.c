#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

int sd_sbuf_reserve(sd_sbuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int sd_sbuf_put(sd_sbuf *b, const void *data, size_t n)
{
    if (sd_sbuf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void sd_sbuf_free(sd_sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

char *sd_sbuf_take(sd_sbuf *b, size_t *len)
{
    if (!b->p && sd_sbuf_reserve(b, 0))
        return NULL;
    b->p[b->len] = 0;
    char *p = b->p;
    if (len)
        *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

/* Table 3-7 of the Unicode standard: the byte ranges of each position. */
int sd_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, size_t *len)
{
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        *len = 1;
        return SD_UTF8_OK;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        c = b0 & 0x0F;
        if (b0 == 0xE0)
            lo = 0xA0;
        else if (b0 == 0xED)
            hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        c = b0 & 0x07;
        if (b0 == 0xF0)
            lo = 0x90;
        else if (b0 == 0xF4)
            hi = 0x8F;
    } else {
        *len = 1;
        return SD_UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = i;
            return SD_UTF8_INCOMPLETE;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = i;
            return SD_UTF8_INVALID;
        }
        c = (c << 6) | (b & 0x3F);
    }
    *cp = c;
    *len = need;
    return SD_UTF8_OK;
}

int sd_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs dominate real text: skip 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t len;
        if (sd_utf8_next(p + i, n - i, &cp, &len) != SD_UTF8_OK)
            return 0;
        i += len;
    }
    return 1;
}

int sd_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

size_t sd_utf8_repair(sd_sbuf *out, const char *s, size_t n, int final)
{
    return sd_utf8_repair_as(out, s, n, final, 0);
}

size_t sd_utf8_repair_as(sd_sbuf *out, const char *s, size_t n, int final, int per_byte)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t len;
        int st = sd_utf8_next(p + i, n - i, &cp, &len);
        if (st == SD_UTF8_OK) {
            i += len;
            continue;
        }
        if (sd_sbuf_put(out, s + run, i - run))
            return (size_t)-1;
        if (st == SD_UTF8_INCOMPLETE && !final)
            return i; /* hold the tail back: more bytes may complete it */
        if (sd_sbuf_put(out, REPL, 3))
            return (size_t)-1;
        i += per_byte ? 1 : len;
        run = i;
    }
    if (sd_sbuf_put(out, s + run, n - run))
        return (size_t)-1;
    return n;
}

int sd_uc_white_space(uint32_t c)
{
    if (c <= 0x20)
        return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85)
        return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int sd_uc_py_space(uint32_t c) { return sd_uc_white_space(c) || (c >= 0x1C && c <= 0x1F); }

#include "net/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

int sd_buf_reserve(sd_buf *b, size_t extra)
{
    if (extra > ((size_t)-1) / 2 - b->len) {
        b->oom = 1;
        return SD_ENOMEM;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return SD_ENOMEM;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

int sd_buf_append(sd_buf *b, const void *data, size_t len)
{
    if (sd_buf_reserve(b, len))
        return SD_ENOMEM;
    if (len)
        memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = 0;
    return 0;
}

int sd_buf_puts(sd_buf *b, const char *s) { return sd_buf_append(b, s, strlen(s)); }

int sd_buf_printf(sd_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return SD_EINVAL;
    if ((size_t)n < sizeof small)
        return sd_buf_append(b, small, (size_t)n);
    if (sd_buf_reserve(b, (size_t)n))
        return SD_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sd_buf_consume(sd_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p)
        b->p[b->len] = 0;
}

void sd_buf_clear(sd_buf *b)
{
    b->len = 0;
    b->oom = 0;
    if (b->p)
        b->p[0] = 0;
}

void sd_buf_free(sd_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

char *sd_buf_take(sd_buf *b, size_t *len)
{
    if (!b->p && sd_buf_reserve(b, 0))
        return NULL;
    char *p = b->p;
    p[b->len] = 0;
    if (len)
        *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}

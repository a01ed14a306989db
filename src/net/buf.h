/* net/buf: a growable byte buffer for building responses and log lines.
 *
 * The buffer keeps a NUL after its bytes so its text can be read as a C
 * string. Appends report SD_ENOMEM and leave the buffer as it was; once an
 * append failed, `oom` stays set so a builder may check once at the end. */
#ifndef SD_NET_BUF_H
#define SD_NET_BUF_H

#include <stddef.h>

typedef struct sd_buf {
    char *p;    /* NUL-terminated once anything was appended */
    size_t len; /* bytes, not counting the NUL */
    size_t cap;
    int oom;
} sd_buf;

int sd_buf_reserve(sd_buf *b, size_t extra);
int sd_buf_append(sd_buf *b, const void *data, size_t len);
int sd_buf_puts(sd_buf *b, const char *s);
int sd_buf_printf(sd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (n <= len). */
void sd_buf_consume(sd_buf *b, size_t n);
void sd_buf_clear(sd_buf *b);
void sd_buf_free(sd_buf *b);
/* Hands the bytes to the caller (malloc'd, NUL-terminated) and empties b. */
char *sd_buf_take(sd_buf *b, size_t *len);

#endif

#include "bench/serve/sse.h"

#include <string.h>

#include "core/err.h"

void sd_bench_sse_init(sd_bench_sse *p, size_t max_event, sd_bench_sse_fn fn, void *user)
{
    memset(p, 0, sizeof *p);
    p->max_event = max_event;
    p->fn = fn;
    p->user = user;
}

static int line_done(sd_bench_sse *p)
{
    const char *s = p->line.p ? p->line.p : "";
    size_t n = p->line.len;
    if (n == 0) {
        if (!p->has_data)
            return 0;
        p->has_data = 0;
        if (sd_buf_append(&p->data, "", 0))
            return SD_ENOMEM;
        /* The callback may feed nothing back into this parser, so the
         * buffer stays valid for the call; it is cleared afterwards. */
        int rc = p->fn(p->user, p->data.p, p->data.len);
        sd_buf_clear(&p->data);
        return rc;
    }
    if (s[0] == ':')
        return 0; /* comment (servers send them as keep-alive pings) */
    const char *colon = memchr(s, ':', n);
    size_t flen = colon ? (size_t)(colon - s) : n;
    if (flen != 4 || memcmp(s, "data", 4) != 0)
        return 0; /* event, id, retry and unknown fields carry nothing we time */
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    if (vlen && *v == ' ') {
        v++;
        vlen--;
    }
    if (p->data.len + vlen + 1 > p->max_event)
        return SD_ERANGE;
    if (p->has_data && sd_buf_append(&p->data, "\n", 1))
        return SD_ENOMEM;
    if (sd_buf_append(&p->data, v, vlen))
        return SD_ENOMEM;
    p->has_data = 1;
    return 0;
}

int sd_bench_sse_feed(sd_bench_sse *p, const char *bytes, size_t len)
{
    size_t i = 0;
    while (i < len) {
        char c = bytes[i];
        if (c == '\n' && p->after_cr) { /* the LF of a CRLF */
            p->after_cr = 0;
            i++;
            continue;
        }
        p->after_cr = 0;
        if (c == '\r' || c == '\n') {
            p->after_cr = c == '\r';
            i++;
            int rc = line_done(p);
            sd_buf_clear(&p->line);
            if (rc)
                return rc;
            continue;
        }
        size_t j = i;
        while (j < len && bytes[j] != '\r' && bytes[j] != '\n')
            j++;
        if (p->line.len + (j - i) > p->max_event)
            return SD_ERANGE;
        if (sd_buf_append(&p->line, bytes + i, j - i))
            return SD_ENOMEM;
        i = j;
    }
    return 0;
}

size_t sd_bench_sse_pending(const sd_bench_sse *p)
{
    return p->line.len + p->data.len + (size_t)p->has_data;
}

void sd_bench_sse_reset(sd_bench_sse *p)
{
    sd_buf_clear(&p->line);
    sd_buf_clear(&p->data);
    p->has_data = 0;
    p->after_cr = 0;
}

void sd_bench_sse_free(sd_bench_sse *p)
{
    sd_buf_free(&p->line);
    sd_buf_free(&p->data);
    p->has_data = 0;
}

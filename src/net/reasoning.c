/* net/reasoning: reasoning split from content (see reasoning.h). */
#include "net/reasoning.h"

#include <string.h>

#include "core/err.h"
#include "core/util.h"

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
#define OPEN_LEN (sizeof OPEN - 1)
#define CLOSE_LEN (sizeof CLOSE - 1)

void sd_rs_init(sd_rs_parser *p, int in_reasoning, sd_rs_emit emit, void *arg)
{
    memset(p, 0, sizeof *p);
    p->state = in_reasoning ? 1 : 0;
    p->emit = emit;
    p->arg = arg;
}

void sd_rs_free(sd_rs_parser *p) { sd_buf_free(&p->hold); }


static int out(sd_rs_parser *p, int reasoning, const char *s, size_t n)
{
    return n ? p->emit(p->arg, reasoning, s, n) : 0;
}

/* Works through what is held as far as it can be decided. */
static int advance(sd_rs_parser *p, int end)
{
    for (;;) {
        const char *h = p->hold.p ? p->hold.p : "";
        size_t n = p->hold.len;
        if (p->state == 0) { /* whitespace, then <think> or not */
            size_t w = 0;
            while (w < n && sd_json_ws(h[w]))
                w++;
            size_t m = n - w < OPEN_LEN ? n - w : OPEN_LEN;
            if (memcmp(h + w, OPEN, m)) { /* no reasoning: all of it is content */
                p->state = 2;
                p->content_started = 1;
                continue;
            }
            if (m < OPEN_LEN) { /* <think> may still come */
                if (!end)
                    return 0;
                p->state = 2;
                p->content_started = 1;
                continue;
            }
            sd_buf_consume(&p->hold, w + OPEN_LEN);
            p->state = 1;
            continue;
        }
        if (p->state == 1) {
            size_t a = 0;
            if (!p->started) { /* the newlines after <think> */
                while (a < n && h[a] == '\n')
                    a++;
                if (a == n && !end) {
                    sd_buf_clear(&p->hold);
                    return 0;
                }
            }
            const char *c = n > a ? memmem(h + a, n - a, CLOSE, CLOSE_LEN) : NULL;
            size_t e = c ? (size_t)(c - h) : end ? n : n - sd_tag_tail(h, n, CLOSE, CLOSE_LEN);
            /* the newlines before </think> or the end are dropped; before
             * what is not known yet, held (more reasoning may follow them) */
            while (e > a && h[e - 1] == '\n')
                e--;
            int rc = out(p, 1, h + a, e - a);
            if (rc)
                return rc;
            p->started |= e > a;
            if (!c) {
                sd_buf_consume(&p->hold, e);
                if (end)
                    sd_buf_clear(&p->hold);
                return 0;
            }
            sd_buf_consume(&p->hold, (size_t)(c - h) + CLOSE_LEN);
            p->state = 2;
            continue;
        }
        /* content: the newlines right after </think> dropped */
        size_t a = 0;
        if (!p->content_started) {
            while (a < n && h[a] == '\n')
                a++;
            p->content_started = a < n;
        }
        int rc = out(p, 0, h + a, n - a);
        sd_buf_clear(&p->hold);
        return rc;
    }
}

int sd_rs_feed(sd_rs_parser *p, const char *text, size_t len)
{
    if (len && sd_buf_append(&p->hold, text, len))
        return SD_ENOMEM;
    return advance(p, 0);
}

int sd_rs_end(sd_rs_parser *p) { return advance(p, 1); }

int sd_rs_prompt_opens(const char *s, size_t n)
{
    while (n && sd_json_ws(s[n - 1]))
        n--;
    return n >= OPEN_LEN && !memcmp(s + n - OPEN_LEN, OPEN, OPEN_LEN);
}

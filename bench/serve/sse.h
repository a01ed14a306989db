/* bench/serve/sse: an incremental parser of Server-Sent Events (the
 * text/event-stream format of the WHATWG HTML standard, the framing of
 * OpenAI streaming responses).
 *
 * Bytes arrive in arbitrary pieces (TCP reads, HTTP chunks); the parser
 * keeps the partial line and the partial event between calls. Lines end in
 * LF, CRLF or CR; "data:" lines (one optional space after the colon) are
 * joined with LF; ":" lines are comments; other fields (event, id, retry)
 * are ignored; a blank line dispatches the event when it holds data. An
 * event larger than max_event bytes is an error, so a server that never
 * ends a line cannot make the client grow without bound. */
#ifndef SD_BENCH_SSE_H
#define SD_BENCH_SSE_H

#include <stddef.h>

#include "net/buf.h"

/* Receives one complete event's data (NUL-terminated, len bytes). A
 * non-zero return stops the parser and is returned by sd_bench_sse_feed. */
typedef int (*sd_bench_sse_fn)(void *user, const char *data, size_t len);

typedef struct sd_bench_sse {
    sd_buf line;      /* the line read so far */
    sd_buf data;      /* data lines of the current event, LF-joined */
    int has_data;     /* a data: line arrived for the current event */
    int after_cr;     /* the last byte was CR: an LF right after it ends nothing */
    size_t max_event; /* bytes of one event (line or joined data) at most */
    sd_bench_sse_fn fn;
    void *user;
} sd_bench_sse;

void sd_bench_sse_init(sd_bench_sse *p, size_t max_event, sd_bench_sse_fn fn, void *user);
/* Returns 0, SD_ERANGE when an event passes max_event, SD_ENOMEM, or the
 * callback's non-zero value. */
int sd_bench_sse_feed(sd_bench_sse *p, const char *bytes, size_t len);
/* Bytes held that do not yet form a dispatched event (0: clean boundary). */
size_t sd_bench_sse_pending(const sd_bench_sse *p);
void sd_bench_sse_reset(sd_bench_sse *p);
void sd_bench_sse_free(sd_bench_sse *p);

#endif

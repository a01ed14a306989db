/* sched/stop: stop strings over streamed text. Text that could still be the
 * start of a stop string is held back; everything else is released in whole
 * UTF-8 characters. On a match the text is cut before the stop string. */
#ifndef SD_SCHED_STOP_H
#define SD_SCHED_STOP_H

#include <stddef.h>

#include "core/err.h"

typedef struct sd_stop {
    char **stops;
    size_t *lens;
    int n;
    char *held; /* text not yet released */
    size_t n_held, cap_held;
    int matched;
} sd_stop;

int sd_stop_init(sd_stop *s, const char *const *stops, int n, sd_err *err);
void sd_stop_free(sd_stop *s);
/* Adds text; *out (points into s, valid until the next call) / *out_len get
 * the releasable text. Returns 1 when a stop string matched (the released text
 * ends before it, nothing more will be released), else 0; <0 on error. */
int sd_stop_push(sd_stop *s, const char *text, size_t len, const char **out, size_t *out_len);
/* Releases everything held (the request ends without a match). */
void sd_stop_flush(sd_stop *s, const char **out, size_t *out_len);

#endif

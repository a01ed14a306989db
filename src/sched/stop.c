#include "sched/stop.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

int sd_stop_init(sd_stop *s, const char *const *stops, int n, sd_err *err)
{
    memset(s, 0, sizeof *s);
    if (n <= 0)
        return 0;
    s->stops = calloc((size_t)n, sizeof *s->stops);
    s->lens = calloc((size_t)n, sizeof *s->lens);
    if (!s->stops || !s->lens) {
        sd_stop_free(s);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (!l)
            continue; /* an empty stop string matches nothing */
        s->stops[s->n] = strdup(stops[i]);
        if (!s->stops[s->n]) {
            sd_stop_free(s);
            return sd_err_set(err, SD_ENOMEM, "out of memory");
        }
        s->lens[s->n++] = l;
    }
    return 0;
}

void sd_stop_free(sd_stop *s)
{
    if (s->stops)
        for (int i = 0; i < s->n; i++)
            free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->held);
    memset(s, 0, sizeof *s);
}

static int grow(sd_stop *s, size_t need)
{
    if (need <= s->cap_held)
        return 0;
    size_t cap = need * 2;
    char *h = realloc(s->held, cap);
    if (!h)
        return SD_ENOMEM;
    s->held = h;
    s->cap_held = cap;
    return 0;
}

/* bytes at the end of h that are a proper prefix of some stop string */
static size_t partial_tail(const sd_stop *s, const char *h, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < s->n; i++) {
        size_t k = sd_tag_tail(h, n, s->stops[i], s->lens[i]);
        if (k > best)
            best = k;
    }
    return best;
}

int sd_stop_push(sd_stop *s, const char *text, size_t len, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (s->matched)
        return 1;
    if (grow(s, s->n_held + len + 1))
        return SD_ENOMEM;
    /* what was released last time is gone: keep only the held tail */
    memcpy(s->held + s->n_held, text, len);
    s->n_held += len;
    s->held[s->n_held] = 0;
    if (s->n == 0) {
        *out = s->held;
        *out_len = s->n_held;
        s->n_held = 0; /* released: the caller copies before the next push */
        return 0;
    }
    size_t first = (size_t)-1;
    for (int i = 0; i < s->n; i++) {
        const char *p = memmem(s->held, s->n_held, s->stops[i], s->lens[i]);
        if (p && (size_t)(p - s->held) < first)
            first = (size_t)(p - s->held);
    }
    if (first != (size_t)-1) {
        s->matched = 1;
        *out = s->held;
        *out_len = first;
        s->n_held = 0;
        return 1;
    }
    size_t keep = partial_tail(s, s->held, s->n_held);
    size_t rel = s->n_held - keep;
    /* the held bytes are the start of whole characters (the detokenizer gives
     * whole characters and stop strings are valid UTF-8), so rel is a boundary */
    *out = s->held;
    *out_len = rel;
    /* move the kept tail to the front after the caller has read out: done on
     * the next push by the memmove below */
    if (rel) {
        /* copy out into a scratch region past the held data */
        if (grow(s, s->n_held + rel + 1))
            return SD_ENOMEM;
        memcpy(s->held + s->n_held + 1, s->held, rel);
        memmove(s->held, s->held + rel, keep);
        s->n_held = keep;
        *out = s->held + keep + rel + 1;
    }
    return 0;
}

void sd_stop_flush(sd_stop *s, const char **out, size_t *out_len)
{
    *out = s->held ? s->held : "";
    *out_len = s->matched ? 0 : s->n_held;
    s->n_held = 0;
}

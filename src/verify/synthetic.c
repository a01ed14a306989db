#include "verify/synthetic.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "verify/sampling.h"

int sd_synthetic_parse(sd_synthetic *s, const char *text, sd_err *err)
{
    memset(s, 0, sizeof *s);
    if (!text)
        return 0;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!*p)
        return 0;
    sd_synthetic t = {0};
    for (int idx = 1;; idx++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char buf[64];
        /* trim the item */
        while (len && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        if (!len)
            return sd_err_set(err, SD_EINVAL, "--synthetic-accept: value %d is empty in '%s'",
                              idx, text);
        if (t.n == SD_SYNTHETIC_MAX)
            return sd_err_set(err, SD_EINVAL,
                              "--synthetic-accept: more than %d values in '%s' (the last one "
                              "repeats for later positions)",
                              SD_SYNTHETIC_MAX, text);
        double x;
        if (len >= sizeof buf) {
            x = -1; /* too long to be a number we accept */
        } else {
            memcpy(buf, p, len);
            buf[len] = 0;
            if (sd_parse_f64(buf, &x) != 0)
                x = -1;
        }
        if (!(x >= 0.0 && x <= 1.0))
            return sd_err_set(err, SD_EINVAL,
                              "--synthetic-accept: value %d ('%.*s') is not a probability in [0, 1]",
                              idx, (int)(len < 32 ? len : 32), p);
        t.p[t.n++] = x;
        if (!comma)
            break;
        p = comma + 1;
    }
    *s = t;
    return 0;
}

double sd_synthetic_p(const sd_synthetic *s, int i)
{
    if (!s || s->n <= 0 || i < 0)
        return 0.0;
    return s->p[i < s->n ? i : s->n - 1];
}

int sd_synthetic_accept(const sd_synthetic *s, int k, uint64_t seed, uint64_t counter)
{
    if (!s || s->n <= 0)
        return 0;
    for (int i = 0; i < k; i++)
        if (!(sd_rand_uniform(seed, counter + (uint64_t)i, SD_RNG_ACCEPT) < sd_synthetic_p(s, i)))
            return i;
    return k > 0 ? k : 0;
}

double sd_synthetic_mean_len(const sd_synthetic *s, int k)
{
    double len = 1.0, reach = 1.0;
    for (int i = 0; i < k; i++) {
        reach *= sd_synthetic_p(s, i);
        len += reach;
    }
    return len;
}

#include "core/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

uint64_t sd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int sd_read_file(const char *path, char **data, size_t *len, sd_err *err)
{
    *data = NULL;
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return sd_err_set(err, SD_EIO, "%s: cannot seek", path);
    }
    long sz = ftell(f);
    if (sz < 0) {
        fclose(f);
        return sd_err_set(err, SD_EIO, "%s: cannot tell size", path);
    }
    rewind(f);
    char *buf = malloc((size_t)sz + 1);
    if (!buf) {
        fclose(f);
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory (%ld bytes)", path, sz);
    }
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    if (got != (size_t)sz) {
        free(buf);
        return sd_err_set(err, SD_EIO, "%s: short read", path);
    }
    buf[sz] = 0;
    *data = buf;
    if (len)
        *len = (size_t)sz;
    return 0;
}

int sd_write_file(const char *path, const void *data, size_t len, sd_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    size_t put = fwrite(data, 1, len, f);
    int rc = fclose(f);
    if (put != len || rc != 0)
        return sd_err_set(err, SD_EIO, "%s: write failed", path);
    return 0;
}

int sd_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int sd_dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *sd_strfmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void sd_bufappend(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
    if (*off >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
    if (k > 0)
        *off = SD_MIN(len - 1, *off + (size_t)k);
}

int sd_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return SD_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return SD_EINVAL;
    *out = v;
    return 0;
}

int sd_parse_f64(const char *s, double *out)
{
    if (!s || !*s)
        return SD_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || isnan(v))
        return SD_EINVAL;
    *out = v;
    return 0;
}

int sd_parse_ids(const char *s, int32_t **ids, int *n, const char *what, sd_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!s)
        return sd_err_set(err, SD_EINVAL, "%s: missing value", what);
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *out = malloc(cap * sizeof *out);
    if (!out)
        return sd_err_set(err, SD_ENOMEM, "%s: out of memory", what);
    int cnt = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(out);
            return sd_err_set(err, SD_EINVAL, "%s: '%s' is not a comma-separated list of token ids",
                              what, s);
        }
        out[cnt++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            free(out);
            return sd_err_set(err, SD_EINVAL, "%s: trailing comma in '%s'", what, s);
        }
    }
    *ids = out;
    *n = cnt;
    return 0;
}

#ifndef SD_BUNDLED_MODEL_DIR
#define SD_BUNDLED_MODEL_DIR "models/specd-tiny"
#endif

const char *sd_bundled_model_dir(void)
{
    const char *env = getenv("SPECD_BUNDLED_MODEL");
    return env && *env ? env : SD_BUNDLED_MODEL_DIR;
}

void *sd_grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (q)
        *cap = c;
    return q;
}

/* tests/target/fixtures.h: the golden model fixtures (tests/golden/models/NAME/
 * with golden.json) and the error measures the model tests share. */
#ifndef SD_TESTS_TARGET_FIXTURES_H
#define SD_TESTS_TARGET_FIXTURES_H

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "core/util.h"
#include "test.h"

/* Names of the fixture folders (those holding golden.json); returns the count. */
static inline int golden_fixtures(char names[][256], int max)
{
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/golden/models", sd_test_srcdir());
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.')
            continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s/golden.json", root, e->d_name);
        if (sd_file_exists(p))
            snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

/* The first max token ids of a fixture's golden.json; returns the count (0
 * when it cannot be read). */
static inline int fixture_ids(const char *dir, int32_t *ids, int max)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return 0;
    json_t *a = json_object_get(j, "ids");
    int n = (int)json_array_size(a);
    n = n < max ? n : max;
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    json_decref(j);
    return n;
}

static inline double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* largest |a - b|; infinity if any difference is NaN */
static inline double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        m = fmax(m, d);
    }
    return m;
}

#endif

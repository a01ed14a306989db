/* tests/target/fixtures.h: the golden model fixtures (tests/golden/models/NAME/
 * with golden.json) and the error measures the model tests share. */
#ifndef SD_TESTS_TARGET_FIXTURES_H
#define SD_TESTS_TARGET_FIXTURES_H

#include <dirent.h>
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

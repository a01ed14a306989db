/* tests/test.h: the test harness every C test uses.
 *
 * A test program is a list of TEST(name) functions run by TEST_MAIN. Asserts
 * print the statement, file, line and both values, and never compile out.
 * TEST_SKIP(reason) skips the rest of one test; a program whose every test
 * skipped exits 77 (meson's "skipped"). */
#ifndef SD_TEST_H
#define SD_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sd_test_case {
    const char *name;
    void (*fn)(void);
} sd_test_case;

extern int sd_test_failed_; /* set by a failing assert in the running test */
extern int sd_test_skipped_;
extern int sd_test_main_(const sd_test_case *cases, int n, int argc, char **argv);

#define TEST(name) static void name(void)

#define TEST_FAIL_(...)                                                                    \
    do {                                                                                   \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                  \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        sd_test_failed_ = 1;                                                               \
        return;                                                                            \
    } while (0)

#define ASSERT(c)                                                                          \
    do {                                                                                   \
        if (!(c))                                                                          \
            TEST_FAIL_("assertion failed: %s", #c);                                        \
    } while (0)

#define ASSERT_MSG(c, ...)                                                                 \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            fprintf(stderr, "  %s:%d: assertion failed: %s: ", __FILE__, __LINE__, #c);     \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            sd_test_failed_ = 1;                                                           \
            return;                                                                        \
        }                                                                                  \
    } while (0)

#define ASSERT_INT_OP_(a, op, b)                                                           \
    do {                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                \
        if (!(a_ op b_))                                                                   \
            TEST_FAIL_("%s %s %s: %lld vs %lld", #a, #op, #b, a_, b_);                     \
    } while (0)
#define ASSERT_EQ(a, b) ASSERT_INT_OP_(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_INT_OP_(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_INT_OP_(a, <, b)
#define ASSERT_LE(a, b) ASSERT_INT_OP_(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_INT_OP_(a, >, b)
#define ASSERT_GE(a, b) ASSERT_INT_OP_(a, >=, b)

#define ASSERT_OK(expr)                                                                    \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != 0)                                                                      \
            TEST_FAIL_("%s returned %d", #expr, rc_);                                      \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                                \
    do {                                                                                   \
        const char *a_ = (a), *b_ = (b);                                                   \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                             \
            TEST_FAIL_("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_ ? a_ : "(null)",           \
                       b_ ? b_ : "(null)");                                                \
    } while (0)

/* substring */
#define ASSERT_CONTAINS(hay, needle)                                                       \
    do {                                                                                   \
        const char *h_ = (hay), *n_ = (needle);                                            \
        if (!h_ || !strstr(h_, n_))                                                        \
            TEST_FAIL_("%s contains %s: \"%s\" lacks \"%s\"", #hay, #needle,               \
                       h_ ? h_ : "(null)", n_);                                            \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                             \
    do {                                                                                   \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                     \
        if (!(fabs(a_ - b_) <= t_))                                                        \
            TEST_FAIL_("|%s - %s| <= %s: %.9g vs %.9g (diff %.3g)", #a, #b, #tol, a_, b_,  \
                       fabs(a_ - b_));                                                     \
    } while (0)

#define TEST_SKIP(...)                                                                     \
    do {                                                                                   \
        fprintf(stderr, "  skipped: ");                                                    \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        sd_test_skipped_ = 1;                                                              \
        return;                                                                            \
    } while (0)

#define TEST_MAIN(...)                                                                     \
    int sd_test_failed_, sd_test_skipped_;                                                 \
    int main(int argc, char **argv)                                                        \
    {                                                                                      \
        static const sd_test_case cases_[] = {__VA_ARGS__};                                \
        return sd_test_main_(cases_, (int)(sizeof cases_ / sizeof cases_[0]), argc, argv); \
    }
#define T(fn) {#fn, fn}

/* Where the source tree is (set by meson), for fixtures. */
static inline const char *sd_test_srcdir(void)
{
    const char *s = getenv("SD_SRCDIR");
    return s ? s : ".";
}

/* A fresh seed per run unless SD_TEST_SEED pins it; printed so a failure repeats. */
uint64_t sd_test_seed(void);
/* xorshift-based uniform in [lo, hi) */
float sd_test_randf(uint64_t *state, float lo, float hi);

#endif

#include <time.h>
#include <unistd.h>

#include "test.h"

uint64_t sd_test_seed(void)
{
    static uint64_t seed;
    if (!seed) {
        const char *s = getenv("SD_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid();
        if (!seed)
            seed = 1;
        fprintf(stderr, "  seed %llu (SD_TEST_SEED to repeat)\n", (unsigned long long)seed);
    }
    return seed;
}

float sd_test_randf(uint64_t *state, float lo, float hi)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return lo + (hi - lo) * (float)((x >> 40) * (1.0 / 16777216.0));
}

int sd_test_main_(const sd_test_case *cases, int n, int argc, char **argv)
{
    int failed = 0, skipped = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && !strstr(cases[i].name, argv[1]))
            continue;
        sd_test_failed_ = 0;
        sd_test_skipped_ = 0;
        fprintf(stderr, "- %s\n", cases[i].name);
        cases[i].fn();
        ran++;
        if (sd_test_failed_) {
            failed++;
            fprintf(stderr, "FAIL %s\n", cases[i].name);
        } else if (sd_test_skipped_) {
            skipped++;
            fprintf(stderr, "skip %s\n", cases[i].name);
        } else {
            fprintf(stderr, "ok   %s\n", cases[i].name);
        }
    }
    fprintf(stderr, "%d passed, %d failed, %d skipped\n", ran - failed - skipped, failed, skipped);
    if (failed)
        return 1;
    return ran > 0 && skipped == ran ? 77 : 0;
}

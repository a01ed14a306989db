#include "sched/stop.h"
#include "test.h"

/* feeds pieces; returns what was released (malloc'd) and whether a stop hit */
static char *feed(const char *const *stops, int n_stops, const char *const *pieces, int n,
                  int *hit)
{
    sd_stop s;
    sd_err err = {0};
    sd_stop_init(&s, stops, n_stops, &err);
    char *acc = calloc(1, 4096);
    size_t len = 0;
    *hit = 0;
    for (int i = 0; i < n && !*hit; i++) {
        const char *o;
        size_t ol;
        *hit = sd_stop_push(&s, pieces[i], strlen(pieces[i]), &o, &ol) == 1;
        memcpy(acc + len, o, ol);
        len += ol;
    }
    if (!*hit) {
        const char *o;
        size_t ol;
        sd_stop_flush(&s, &o, &ol);
        memcpy(acc + len, o, ol);
        len += ol;
    }
    acc[len] = 0;
    sd_stop_free(&s);
    return acc;
}

TEST(stop_string_split_across_pieces_is_cut_before_it)
{
    const char *stops[] = {"END"};
    const char *pieces[] = {"hello E", "N", "D world"};
    int hit;
    char *out = feed(stops, 1, pieces, 3, &hit);
    ASSERT(hit);
    ASSERT_STR_EQ(out, "hello ");
    free(out);
}

TEST(partial_match_that_fails_is_released_unchanged)
{
    const char *stops[] = {"ENDX"};
    const char *pieces[] = {"a E", "N", "D", "y b"};
    int hit;
    char *out = feed(stops, 1, pieces, 4, &hit);
    ASSERT(!hit);
    ASSERT_STR_EQ(out, "a ENDy b");
    free(out);
}

TEST(the_earliest_of_several_stop_strings_wins)
{
    const char *stops[] = {"world", "lo w"};
    const char *pieces[] = {"hello world"};
    int hit;
    char *out = feed(stops, 2, pieces, 1, &hit);
    ASSERT(hit);
    ASSERT_STR_EQ(out, "hel");
    free(out);
}

TEST(no_stop_strings_release_everything_at_once)
{
    const char *pieces[] = {"é", "ü", "漢字"};
    int hit;
    char *out = feed(NULL, 0, pieces, 3, &hit);
    ASSERT(!hit);
    ASSERT_STR_EQ(out, "éü漢字");
    free(out);
}

TEST(multibyte_stop_string_matches_and_empty_stop_is_ignored)
{
    const char *stops[] = {"", "字"};
    const char *pieces[] = {"漢", "字です"};
    int hit;
    char *out = feed(stops, 2, pieces, 2, &hit);
    ASSERT(hit);
    ASSERT_STR_EQ(out, "漢");
    free(out);
}

TEST_MAIN(T(stop_string_split_across_pieces_is_cut_before_it),
          T(partial_match_that_fails_is_released_unchanged),
          T(the_earliest_of_several_stop_strings_wins),
          T(no_stop_strings_release_everything_at_once),
          T(multibyte_stop_string_matches_and_empty_stop_is_ignored))

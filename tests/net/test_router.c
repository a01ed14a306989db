#include "core/util.h"
#include "net/router.h"
#include "test.h"

TEST(paths_and_methods_map_to_routes)
{
    static const struct {
        const char *method, *path;
        int status;
        sd_route route;
        const char *allow;
    } cases[] = {
        {"POST", "/v1/chat/completions", 200, SD_ROUTE_CHAT, NULL},
        {"POST", "/v1/completions", 200, SD_ROUTE_COMPLETIONS, NULL},
        {"GET", "/v1/models", 200, SD_ROUTE_MODELS, NULL},
        {"HEAD", "/v1/models", 200, SD_ROUTE_MODELS, NULL},
        {"GET", "/v1/models/specd-tiny", 200, SD_ROUTE_MODEL, NULL},
        {"GET", "/v1/models/", 404, SD_ROUTE_NONE, NULL},
        {"POST", "/tokenize", 200, SD_ROUTE_TOKENIZE, NULL},
        {"GET", "/metrics", 200, SD_ROUTE_METRICS, NULL},
        {"GET", "/health", 200, SD_ROUTE_HEALTH, NULL},
        {"GET", "/v1/chat/completions", 405, SD_ROUTE_NONE, "POST"},
        {"HEAD", "/v1/completions", 405, SD_ROUTE_NONE, "POST"},
        {"POST", "/v1/models", 405, SD_ROUTE_NONE, "GET"},
        {"DELETE", "/v1/models/x", 405, SD_ROUTE_NONE, "GET"},
        {"PUT", "/metrics", 405, SD_ROUTE_NONE, "GET"},
        {"GET", "/v1/chat/completions/", 404, SD_ROUTE_NONE, NULL},
        {"POST", "/V1/completions", 404, SD_ROUTE_NONE, NULL},
        {"GET", "/", 404, SD_ROUTE_NONE, NULL},
        {"GET", "", 404, SD_ROUTE_NONE, NULL},
        {"GET", "/healthz", 404, SD_ROUTE_NONE, NULL},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        sd_route r;
        const char *allow;
        int st = sd_route_find(cases[i].method, cases[i].path, &r, &allow);
        ASSERT_MSG(st == cases[i].status && r == cases[i].route, "%s %s -> %d route %d",
                   cases[i].method, cases[i].path, st, (int)r);
        if (cases[i].allow)
            ASSERT_STR_EQ(allow, cases[i].allow);
        else
            ASSERT(allow == NULL);
    }
}

TEST(only_health_goes_without_a_key)
{
    ASSERT_EQ(sd_route_needs_key("/health"), 0);
    ASSERT_EQ(sd_route_needs_key("/metrics"), 1);
    ASSERT_EQ(sd_route_needs_key("/v1/models"), 1);
    ASSERT_EQ(sd_route_needs_key("/no/such/path"), 1);
    ASSERT_EQ(sd_route_needs_key("/health/x"), 1);
}

TEST(the_key_must_match_exactly)
{
    const char *k = "s3cret";
    size_t kl = 6;
    ASSERT_EQ(sd_api_key_ok("Bearer s3cret", k, kl), 1);
    ASSERT_EQ(sd_api_key_ok("bearer s3cret", k, kl), 1);
    ASSERT_EQ(sd_api_key_ok("BEARER   s3cret", k, kl), 1);
    ASSERT_EQ(sd_api_key_ok(NULL, k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("", k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("Bearer", k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("Bearer ", k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("Bearer s3cre", k, kl), 0);   /* a prefix */
    ASSERT_EQ(sd_api_key_ok("Bearer s3crett", k, kl), 0); /* longer */
    ASSERT_EQ(sd_api_key_ok("Bearer S3cret", k, kl), 0);  /* case counts in the key */
    ASSERT_EQ(sd_api_key_ok("Bearer s3cret ", k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("Basic s3cret", k, kl), 0);
    ASSERT_EQ(sd_api_key_ok("s3cret", k, kl), 0);
    /* every single-byte change of the key is refused */
    char h[32];
    for (size_t i = 0; i < kl; i++) {
        snprintf(h, sizeof h, "Bearer %s", k);
        h[7 + i] ^= 1;
        ASSERT_EQ(sd_api_key_ok(h, k, kl), 0);
    }
}

TEST_MAIN(T(paths_and_methods_map_to_routes), T(only_health_goes_without_a_key),
          T(the_key_must_match_exactly))

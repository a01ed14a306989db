#include "net/router.h"

#include <string.h>
#include <strings.h>

static const struct {
    const char *path;
    int prefix; /* the path ends with '/' and something must follow */
    const char *method;
    sd_route route;
} routes[] = {
    {"/v1/chat/completions", 0, "POST", SD_ROUTE_CHAT},
    {"/v1/completions", 0, "POST", SD_ROUTE_COMPLETIONS},
    {"/v1/models", 0, "GET", SD_ROUTE_MODELS},
    {"/v1/models/", 1, "GET", SD_ROUTE_MODEL},
    {"/tokenize", 0, "POST", SD_ROUTE_TOKENIZE},
    {"/metrics", 0, "GET", SD_ROUTE_METRICS},
    {"/health", 0, "GET", SD_ROUTE_HEALTH},
};

int sd_route_find(const char *method, const char *path, sd_route *route, const char **allow)
{
    *route = SD_ROUTE_NONE;
    *allow = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        size_t pl = strlen(routes[i].path);
        int match = routes[i].prefix ? !strncmp(path, routes[i].path, pl) && path[pl]
                                     : !strcmp(path, routes[i].path);
        if (!match)
            continue;
        if (!strcmp(method, routes[i].method) ||
            (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET"))) {
            *route = routes[i].route;
            return 200;
        }
        *allow = routes[i].method;
    }
    return *allow ? 405 : 404;
}

int sd_route_needs_key(const char *path) { return strcmp(path, "/health") != 0; }

int sd_api_key_ok(const char *h, const char *key, size_t klen)
{
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    size_t glen = strlen(h);
    /* Every byte of the key is compared whatever the input: no early exit
     * tells an attacker where the first difference is. */
    unsigned char d = glen != klen;
    for (size_t i = 0; i < klen; i++)
        d |= (unsigned char)(key[i] ^ (i < glen ? h[i] : 0));
    return d == 0;
}

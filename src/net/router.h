/* net/router: which route a request names, and whether its API key is
 * right. Pure functions (no I/O, no state), shared by the server and the
 * request-path fuzzer so that both walk the same decisions. */
#ifndef SD_NET_ROUTER_H
#define SD_NET_ROUTER_H

#include <stddef.h>

typedef enum sd_route {
    SD_ROUTE_NONE = 0,
    SD_ROUTE_CHAT,        /* POST /v1/chat/completions */
    SD_ROUTE_COMPLETIONS, /* POST /v1/completions */
    SD_ROUTE_MODELS,      /* GET  /v1/models */
    SD_ROUTE_MODEL,       /* GET  /v1/models/{model} */
    SD_ROUTE_TOKENIZE,    /* POST /tokenize */
    SD_ROUTE_METRICS,     /* GET  /metrics */
    SD_ROUTE_HEALTH,      /* GET  /health (no key needed) */
} sd_route;

/* 200 with *route set; 404 (no such path); 405 with *allow naming the
 * method the path takes. HEAD is accepted wherever GET is. */
int sd_route_find(const char *method, const char *path, sd_route *route, const char **allow);
/* Every route but /health needs the key (unknown paths too: nothing about
 * the server's routes is told to a client without it). */
int sd_route_needs_key(const char *path);
/* `Authorization: Bearer KEY` (scheme case-insensitive) against key, in a
 * time that depends on the key's length only. NULL header: no. */
int sd_api_key_ok(const char *authorization, const char *key, size_t key_len);

#endif

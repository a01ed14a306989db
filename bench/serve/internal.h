/* bench/serve internals shared between its files. */
#ifndef SD_BENCH_INTERNAL_H
#define SD_BENCH_INTERNAL_H

#include <sys/socket.h>

#include "bench/serve/bench.h"

/* Resolves t's host: the first address that accepts a TCP connection, else
 * the first address. */
int sd__bench_resolve(const sd_bench_target *t, struct sockaddr_storage *ss, sd_err *err);

#endif

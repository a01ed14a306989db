/* kernels/prof: times every op of a backend (prof.c). For measurement runs:
 * it serializes the backend (a sync around each op) and has no graphs. */
#ifndef SD_KERNELS_PROF_H
#define SD_KERNELS_PROF_H

#include <stdio.h>

#include "core/err.h"
#include "kernels/ops.h"

/* A backend that forwards to inner and times each compute op (by name;
 * matmuls by weight shape). inner stays the caller's to close, after this. */
int sd_prof_backend_wrap(sd_backend **out, sd_backend *inner);
sd_backend *sd_prof_inner(sd_backend *be);
/* The table: op, calls, total, mean, share of the timed total, by time. */
void sd_prof_report(sd_backend *be, FILE *f);
void sd_prof_backend_free(sd_backend *be);

#endif

/* engine/backend: picks and opens the backend named by --device
 * (auto: cuda when built with CUDA and a GPU is present, else cpu). */
#ifndef SD_ENGINE_BACKEND_H
#define SD_ENGINE_BACKEND_H

#include "core/config.h"
#include "core/err.h"
#include "kernels/ops.h"

int sd_backend_open(sd_backend **out, const sd_opts *o, sd_err *err);
/* o->device as the backends will open: "cuda" or "cpu" (auto: cuda where a
 * GPU is visible) */
const char *sd_backend_kind(const sd_opts *o);
/* Rank `rank` of n tensor-parallel ranks: GPU `rank`, or a CPU backend with
 * its share of --threads. */
int sd_backend_open_rank(sd_backend **out, const sd_opts *o, int rank, int n, sd_err *err);
void sd_backend_close(sd_backend *be);
/* The model folder of the options: --model, or the bundled model. */
const char *sd_opts_model_dir(const sd_opts *o);

#endif

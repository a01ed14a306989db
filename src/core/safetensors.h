/* core/safetensors: read-only, mmap'd safetensors checkpoints.
 *
 * Opens one file, or a folder: model.safetensors.index.json (sharded), else
 * model.safetensors, else every *.safetensors in it. Tensors stay in the
 * mapping (zero copy). Every malformed file (header length past the end,
 * malformed header JSON, unknown dtype, offsets out of the file, overlapping
 * or truncated data) is an error naming the file and the tensor. Also writes
 * safetensors files (tests, the random checkpoint writer). */
#ifndef SD_CORE_SAFETENSORS_H
#define SD_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/err.h"

#define SD_ST_MAX_DIMS 8

typedef struct sd_st_tensor {
    const char *name;
    sd_dtype dtype;
    int ndim;
    int64_t shape[SD_ST_MAX_DIMS];
    const void *data; /* into the mapping */
    size_t nbytes;
    const char *file; /* base name of the file holding it */
} sd_st_tensor;

typedef struct sd_st sd_st; /* opaque */

int sd_st_open(sd_st **out, const char *path_or_dir, sd_err *err);
void sd_st_close(sd_st *st);
int sd_st_count(const sd_st *st);
const sd_st_tensor *sd_st_at(const sd_st *st, int i);
/* NULL when absent. */
const sd_st_tensor *sd_st_find(const sd_st *st, const char *name);
/* Block-scaled FP8 (the config's quantization_config): from here on
 * sd_st_expect gives each F8_E4M3 tensor NAME dequantized to BF16 with
 * NAME_scale_inv, one scale a rows x cols block (see dequant_fp8). 0, or
 * SD_EINVAL. */
int sd_st_fp8_blocks(sd_st *st, int rows, int cols);
/* The raw parts of F8_E4M3 tensor name of the given shape (after
 * sd_st_fp8_blocks, before its first sd_st_expect): *q the E4M3 bytes,
 * *scale its block scales (F32, BF16 or F16). 0; 1 where the tensor is not
 * such (absent, another dtype or shape, or already dequantized: load it with
 * sd_st_expect); or an error naming the scales. */
int sd_st_fp8_parts(const sd_st *st, const char *name, int ndim, const int64_t *shape,
                    const sd_st_tensor **q, const sd_st_tensor **scale, sd_err *err);
/* Finds name and checks its shape: error "FILE: tensor NAME: shape [a,b] does
 * not match the config (expected [c,d])", or "tensor NAME is missing" (naming
 * the folder). An F8_E4M3 tensor comes dequantized (BF16, held by st) after
 * sd_st_fp8_blocks, and is refused before it. */
int sd_st_expect(const sd_st *st, const char *name, int ndim, const int64_t *shape,
                 const sd_st_tensor **out, sd_err *err);

/* Writes tensors (data taken from each .data/.nbytes) to path; metadata_json
 * is the "__metadata__" object text or NULL. */
int sd_st_write(const char *path, const sd_st_tensor *tensors, int n, const char *metadata_json,
                sd_err *err);

#endif

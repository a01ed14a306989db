/* engine/memplan: the memory plan made at start. From the backend's measured
 * free memory and --mem-fraction it sets aside activations, CUDA-graph pools
 * and communication buffers and gives the rest to the KV cache; it refuses a
 * plan whose cache cannot hold one request of the maximum context. The plan
 * is printed as a table (and kept for /metrics). */
#ifndef SD_ENGINE_MEMPLAN_H
#define SD_ENGINE_MEMPLAN_H

#include <stddef.h>

#include "core/err.h"

typedef struct sd_mem_plan {
    const char *device;     /* backend name */
    size_t total, free;     /* measured, bytes (free: after the weights are loaded) */
    double fraction;        /* --mem-fraction */
    size_t weights;         /* this rank's weights as placed (sd_model_weight_bytes) */
    size_t activations;     /* workspaces and step buffers */
    size_t graphs;          /* CUDA-graph pools */
    size_t comm;            /* all-reduce buffers */
    size_t kv;              /* KV cache bytes */
    size_t kv_per_token;    /* bytes per token slot, all layers and draft caches */
    int block_size, blocks; /* KV blocks */
    int max_context, min_blocks;
    int capped;             /* the CPU plan is capped at max_batch full-context requests */
} sd_mem_plan;

/* Fills blocks/kv. fixed_blocks > 0 pins the block count (--kv-blocks).
 * cap_blocks > 0 bounds the planned count. Errors name what to change. */
int sd_mem_plan_make(sd_mem_plan *p, int fixed_blocks, int cap_blocks, sd_err *err);
/* The table, one log line per row. */
void sd_mem_plan_log(const sd_mem_plan *p);

#endif

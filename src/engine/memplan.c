#include "engine/memplan.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"

int sd_mem_plan_make(sd_mem_plan *p, int fixed_blocks, int cap_blocks, sd_err *err)
{
    size_t per_block = p->kv_per_token * (size_t)p->block_size;
    if (!per_block)
        return sd_err_set(err, SD_EINVAL, "memory plan: zero KV bytes per block");
    if (fixed_blocks > 0) {
        p->blocks = fixed_blocks;
    } else {
        double usable = (double)p->free * p->fraction;
        double reserved = (double)(p->activations + p->graphs + p->comm);
        double left = usable - reserved;
        if (left < 0)
            left = 0;
        double b = left / (double)per_block;
        p->blocks = b > 2e9 ? 2000000000 : (int)b;
        if (cap_blocks > 0 && p->blocks > cap_blocks) {
            p->blocks = cap_blocks;
            p->capped = 1;
        }
    }
    p->kv = (size_t)p->blocks * per_block;
    if (p->blocks < p->min_blocks)
        return sd_err_set(err, SD_EFULL,
                          "memory plan: the KV cache gets %d blocks of %d tokens (%.1f MiB) but "
                          "one request of the maximum context (%d tokens) needs %d blocks: lower "
                          "--max-context, raise --mem-fraction or --kv-blocks, or use a larger device",
                          p->blocks, p->block_size, (double)p->kv / (1 << 20), p->max_context,
                          p->min_blocks);
    return 0;
}

void sd_mem_plan_log(const sd_mem_plan *p)
{
    const double M = 1 << 20;
    sd_log_info("memory plan (%s): total %.1f MiB, free %.1f MiB, fraction %.2f", p->device,
                p->total / M, p->free / M, p->fraction);
    sd_log_info("  %-22s %12.1f MiB", "weights", p->weights / M);
    sd_log_info("  %-22s %12.1f MiB", "activations", p->activations / M);
    sd_log_info("  %-22s %12.1f MiB", "cuda graph pools", p->graphs / M);
    sd_log_info("  %-22s %12.1f MiB", "communication buffers", p->comm / M);
    sd_log_info("  %-22s %12.1f MiB  (%d blocks x %d tokens = %lld tokens, %zu bytes/token%s)",
                "kv cache", p->kv / M, p->blocks, p->block_size,
                (long long)p->blocks * p->block_size, p->kv_per_token,
                p->capped ? "; capped at --max-batch full-context requests" : "");
}

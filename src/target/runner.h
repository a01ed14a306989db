/* target/runner: one sequence through a model, outside the engine.
 * For `specd logits`, the golden tests and tools: positions [start, start+n)
 * of a single sequence whose KV slots are its positions (slot = position), so
 * the cache must hold start + n slots. Inputs and outputs are host memory. */
#ifndef SD_TARGET_RUNNER_H
#define SD_TARGET_RUNNER_H

#include "target/model.h"

typedef struct sd_seq_out {
    float *logits;     /* (n, vocab) or NULL */
    float *hidden;     /* (n, D) final-normed hidden, or NULL */
    float *out_hidden; /* MTP: (n, D) layer output, or NULL */
} sd_seq_out;

/* Target forward of ids at positions start.. (chunked by the workspace). */
int sd_runner_target(sd_model *m, const int32_t *ids, int n, int start, const sd_seq_out *o,
                     sd_err *err);
/* MTP forward: token ids[i] with input hidden in_hidden[i] (n, D) at position start + i. */
int sd_runner_mtp(sd_model *m, const int32_t *ids, const float *in_hidden, int n, int start,
                  const sd_seq_out *o, sd_err *err);

#endif

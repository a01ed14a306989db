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

/* Tensor parallelism on the CPU: tp ranks of one model, each with its own
 * CPU backend (the threads split between them) and its shard, joined by the
 * thread communicator. Each call runs the same step on tp rank threads (rank
 * 0 on the caller's) and returns the outputs, which every rank computes
 * alike: a rank whose outputs differ from rank 0's by one bit is an error.
 * A failed step leaves the group unusable (its communicator aborted). */
typedef struct sd_tp_runner sd_tp_runner;

/* o->tp_rank, o->tp_size and o->comm are set per rank; threads = 0: all cores. */
int sd_tp_runner_open(sd_tp_runner **out, const char *dir, int tp, int threads,
                      const sd_model_opts *o, sd_err *err);
void sd_tp_runner_close(sd_tp_runner *t);
int sd_tp_runner_size(const sd_tp_runner *t);
sd_model *sd_tp_runner_model(sd_tp_runner *t, int rank);
int sd_tp_runner_alloc_kv(sd_tp_runner *t, int n_slots, sd_err *err);
int sd_tp_runner_target(sd_tp_runner *t, const int32_t *ids, int n, int start,
                        const sd_seq_out *o, sd_err *err);
int sd_tp_runner_mtp(sd_tp_runner *t, const int32_t *ids, const float *in_hidden, int n,
                     int start, const sd_seq_out *o, sd_err *err);

#endif

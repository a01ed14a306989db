/* engine: the public face of model execution for the server and the CLI.
 *
 * An sd_engine owns the model (target, optional proposer), the tokenizer, the
 * KV cache and the scheduler thread. Callers submit requests from any thread;
 * the engine reports progress through callbacks that run ON THE ENGINE THREAD
 * (never the caller's): a callback must only copy what it needs and wake its
 * own loop (uv_async_send). It must not call back into the engine except
 * sd_engine_cancel. The engine never blocks on a client. */
#ifndef SD_ENGINE_ENGINE_H
#define SD_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/err.h"

typedef struct sd_engine sd_engine;
typedef struct sd_tokenizer sd_tokenizer;

typedef enum sd_finish {
    SD_FINISH_NONE = 0,
    SD_FINISH_STOP,     /* eos or a stop string */
    SD_FINISH_LENGTH,   /* max_tokens or the context is full */
    SD_FINISH_CANCELLED,
    SD_FINISH_ERROR,
} sd_finish;

typedef struct sd_gen_params {
    int max_tokens; /* 0: the prompt is prefilled and the request ends (its logprobs) */
    double temperature; /* 0: greedy */
    double top_p;       /* 1: off */
    int top_k;          /* 0: off */
    uint64_t seed;
    int has_seed; /* 0: the engine draws one */
    const char *const *stop; /* stop strings (copied at submit) */
    int n_stop;
    int ignore_eos;
    /* token ids that end the request like eos (not printed): a chat
     * template's end-of-turn token (copied at submit) */
    const int32_t *stop_ids;
    int n_stop_ids;
    /* 1: special tokens are printed in the output text (a reply read for
     * tool calls or reasoning tags that are special tokens: Kimi-K2's,
     * DeepSeek's); 0: skipped */
    int keep_special;
    /* 1: each token's log probability comes with it (sd_req_events.on_logprobs),
     * with the top_logprobs (0..SD_MAX_TOP_LOGPROBS) likeliest tokens of its
     * position. The target model's own distribution (the log-softmax of its
     * logits: no temperature or truncation), as vLLM returns by default. The
     * steps that hold such a request bring their logits rows to the host. */
    int logprobs;
    int top_logprobs;
    /* with logprobs: the prompt's tokens' too, each given the ones before
     * it (the first has none), through on_logprobs (ids the prompt's, from
     * its second token on) before the first generated token's (completions'
     * echo: lm-eval's loglikelihood). The prompt's steps bring every row's
     * logits to the host; no prefix cache for it. */
    int prompt_logprobs;
    /* OpenAI's logits processors, on the target's logits before anything
     * else (temperature, truncation, the draft's verification, the
     * logprobs): bias[i] added to the logit of bias_ids[i] (copied at
     * submit; ids within the vocabulary); presence_penalty taken off the
     * logit of every token already generated, frequency_penalty times the
     * times it was (the generated tokens only, as OpenAI and vLLM count).
     * The steps that hold such a request bring their logits rows to the
     * host. */
    const int32_t *bias_ids;
    const float *bias;
    int n_bias;
    float presence_penalty, frequency_penalty;
    /* 1: the text is a JSON object (response_format json_object): tokens
     * that would leave no JSON object prefix are masked, and the end of
     * text (eos, stop ids) waits for the object to close (verify/json_mask.h;
     * after the bias and penalties; needs the model's tokenizer) */
    int json_object;
    /* or, where not NULL, a document valid against this JSON Schema (the
     * schema's text, NUL-terminated; the subset of verify/json_schema.h,
     * compiled at submit: an error names what it does not take) */
    const char *json_schema;
    /* no end of text (eos, stop ids: masked) and no stop string (not
     * looked for in the text of the first min_tokens tokens) before this
     * many tokens (vLLM's min_tokens) */
    int min_tokens;
} sd_gen_params;

#define SD_MAX_TOP_LOGPROBS 20
/* the most tokens one logit_bias may name (OpenAI's limit) */
#define SD_MAX_LOGIT_BIAS 300

/* A token's log probability, and its position's likeliest tokens (most
 * likely first, lower id first on ties) */
typedef struct sd_token_logprob {
    float logprob;
    int n_top;
    int32_t top_ids[SD_MAX_TOP_LOGPROBS];
    float top_logprobs[SD_MAX_TOP_LOGPROBS];
} sd_token_logprob;

/* Speculative statistics of one request (and summed over the engine). */
typedef struct sd_spec_stats {
    uint64_t steps;         /* verify steps (draft -> verify) */
    uint64_t drafted;       /* draft tokens proposed */
    uint64_t accepted;      /* draft tokens accepted */
    uint64_t emitted;       /* tokens emitted by verify steps (accepted + bonus) */
    uint64_t accepted_at[16]; /* accepted at draft position i (0-based) */
    uint64_t proposed_at[16]; /* proposed at draft position i */
    double draft_s, verify_s; /* time in draft and verify */
    /* engine-wide only: the rest of the steps' wall time (scheduling,
     * accepting, streaming, the engine's bookkeeping) */
    double host_s;
} sd_spec_stats;

/* dst += src: the counts and times of two sets of requests together (the
 * choices of one response, a bench's requests) */
static inline void sd_spec_stats_add(sd_spec_stats *dst, const sd_spec_stats *src)
{
    dst->steps += src->steps;
    dst->drafted += src->drafted;
    dst->accepted += src->accepted;
    dst->emitted += src->emitted;
    for (int i = 0; i < 16; i++) {
        dst->accepted_at[i] += src->accepted_at[i];
        dst->proposed_at[i] += src->proposed_at[i];
    }
    dst->draft_s += src->draft_s;
    dst->verify_s += src->verify_s;
    dst->host_s += src->host_s;
}

typedef struct sd_req_stats {
    int prompt_tokens;
    int completion_tokens;
    double queued_s;  /* submit -> first scheduled */
    double ttft_s;    /* submit -> first token */
    double total_s;   /* submit -> finish */
    int cached_tokens; /* prompt tokens found in the prefix cache (first admission) */
    sd_spec_stats spec;
} sd_req_stats;

typedef struct sd_req_events {
    /* New output: the text delta holds whole UTF-8 characters only, with stop
     * strings already cut; ids are the new tokens. Either may be empty. */
    void (*on_output)(void *user, const char *text, size_t len, const int32_t *ids, int n_ids);
    /* Last call for a request; msg is set for SD_FINISH_ERROR. */
    void (*on_finish)(void *user, sd_finish why, const sd_req_stats *st, const char *msg);
    /* With sd_gen_params.logprobs (may be NULL): the log probabilities of
     * the n tokens ids, called just before the on_output that carries them. */
    void (*on_logprobs)(void *user, const int32_t *ids, const sd_token_logprob *lp, int n);
} sd_req_events;

/* why a step drafted (sd_engine_stats.spec_why_*; engine/adaptive.h
 * SD_KWHY_*), by name */
#define SD_SPEC_WHY_N 10
static inline const char *sd_spec_why_name(int i)
{
    static const char *const names[SD_SPEC_WHY_N] = {
        "best", "explore", "refresh", "hope", "neighbour", "periodic", "probe", "fixed", "cohort", "demand"};
    return i >= 0 && i < SD_SPEC_WHY_N ? names[i] : "?";
}

/* why a step was not queued ahead of the one before it (--launch-ahead;
 * sd_engine_stats.ahead_refused): the first reason found, in this order */
enum {
    SD_AHEAD_HOST_TOKENS, /* its tokens are chosen on the host (logits rows came down) */
    SD_AHEAD_ARRIVALS,    /* requests wait or arrive: they join the next step */
    SD_AHEAD_HOST_ROWS,   /* a request's logits come to the host (logprobs, JSON, ...) */
    SD_AHEAD_PREFILL,     /* a request is not decoding (a prompt chunk) */
    SD_AHEAD_DRAFTS,      /* a request verifies drafts */
    SD_AHEAD_TRACKING,    /* a request tracks the proposer (needs this step's hidden states) */
    SD_AHEAD_ENDING,      /* every request ends (or one, without a gather op to leave it out) */
    SD_AHEAD_SHAPE,       /* a running request left out of the step */
    SD_AHEAD_CAUSES
};
static inline const char *sd_ahead_cause_name(int i)
{
    static const char *const names[SD_AHEAD_CAUSES] = {
        "host_tokens", "arrivals", "host_rows", "prefill", "drafts", "tracking", "ending",
        "shape"};
    return i >= 0 && i < SD_AHEAD_CAUSES ? names[i] : "?";
}

/* Engine-wide numbers for /metrics and /health. */
typedef struct sd_engine_stats {
    int queued, running;
    int kv_blocks_total, kv_blocks_used;
    /* the prefix cache: blocks holding a cached prefix that no request
     * holds (reclaimable: counted free), and prompt tokens looked up at
     * admission and found there (their prefill skipped) */
    int kv_blocks_cached;
    uint64_t prefix_queried_tokens, prefix_hit_tokens;
    uint64_t steps;           /* engine steps so far */
    uint64_t last_step_ns;    /* monotonic time of the last completed step */
    uint64_t prompt_tokens, completion_tokens;
    sd_spec_stats spec;
    int tp;                        /* tensor-parallel ranks */
    int ep;                        /* routed experts split whole over them (--ep) */
    uint64_t failed_steps;         /* model steps that failed (their requests got errors) */
    int failing;                   /* consecutive failed model steps: 0 once one runs */
    uint64_t plans;                /* several nodes: step plans sent / followed so far */
    const char *allreduce_metrics; /* GPU ranks: the all-reduce choice table, Prometheus text */
    /* Tensor parallelism: the collectives so far, as of the last published
     * step (rank 0's calls; every rank makes the same ones); zero at --tp 1.
     * A CUDA graph's replay counts the collectives captured in it. */
    uint64_t allreduce_calls;  /* all-reduces, the residual steps among them */
    uint64_t allreduce_floats; /* floats (per rank) they summed */
    uint64_t residual_calls;   /* of allreduce_calls: all-reduce + residual add + RMSNorm */
    uint64_t allgather_calls;  /* the vocabulary shards of the logits */
    uint64_t allreduce_path_calls[4]; /* GPU ranks, by path: nccl, oneshot, twoshot, fused */
    /* GPU ranks: the sum over those all-reduces of the time the start-up
     * autotune measured for that size and path (an estimate from start-up
     * timings, not a measurement of the steps), and the calls it covers */
    double allreduce_est_s;
    uint64_t allreduce_est_calls;
    /* replays of proposer graphs, whose captured collectives are not
     * recorded: their calls are missing from the counts above */
    uint64_t allreduce_unrecorded_replays;
    /* Speculation's draft length: engine steps by the k they drafted (k
     * chosen by adaptive k, or --spec-k), the last step's k (-1 before any),
     * adaptive k measuring costs (1) rather than choosing, and running
     * requests that stopped tracking the proposer (adaptive k found that
     * drafting does not pay at their batch). */
    uint64_t spec_k_steps[17];
    int spec_k_last, spec_exploring, spec_off_running;
    /* proposer passes run without a CUDA graph (a shape's first pass, a
     * size past the graphs', none on the CPU), and of those the ones whose
     * shape found the proposer graph cache full (SD_MAX_PGRAPHS shapes) */
    uint64_t spec_eager_passes, spec_graph_cache_full;
    /* target steps of a speculative engine that skipped the hidden states
     * a proposer reads (MTP, EAGLE-3): no request of the step drafts */
    uint64_t spec_plain_steps;
    uint64_t spec_cohorts; /* adaptive k's cohort switches (sd_adaptive_cohort) */
    /* drafting phases (a request drafted), and of those the ones adaptive
     * k learnt the drafting cost from (no prompt rows in the step, not a
     * probe of requests admitted with speculation off, no proposer pass
     * that was its graph shape's first run or capture), and the phases left
     * out for such a one-off pass */
    uint64_t spec_draft_phases, spec_draft_observed, spec_draft_oneoff;
    /* decode steps queued before the step before them was read
     * (--launch-ahead): the host's work between steps ran while the GPU did */
    uint64_t ahead_steps;
    /* verify steps that took their drafts on the device, queued before
     * the drafts reached the host (--draft-ahead), and of those the ones
     * timed from the step before's tokens to their own (the batch as at
     * the drafting phase, no prompt rows; adaptive k learns from them what
     * drafting ahead hides of its price: sd_adaptive_observe_draft_ahead) */
    uint64_t draft_ahead_steps, draft_ahead_timed;
    /* logits rows brought to the host (the rows of requests that want log
     * probabilities or whose logits a processor changes: bias, penalties,
     * JSON, min_tokens; the other requests of the step choose their tokens
     * on the device), and the steps that brought any */
    uint64_t logits_host_rows, logits_host_steps;
    /* steps not queued ahead of the one before them, by the first reason
     * found (SD_AHEAD_*); only where launch ahead is on */
    uint64_t ahead_refused[SD_AHEAD_CAUSES];
    /* JSON masks (response_format) found in the cache of recent states,
     * and made by a walk of the vocabulary */
    uint64_t json_masks_found, json_masks_made;
    /* json_schema compilations (the server's checks through sd_engine_schemas
     * and the engine's), and the look-ups that found one compiled */
    uint64_t json_schemas_compiled, json_schemas_found;
    /* GEMM algorithm trials the backend ran (each a host stall of a few ms
     * on a GPU: a shape and row count met the first time) */
    uint64_t gemm_trials;
    /* target steps with prompt rows that want no logits; of those the
     * ones padded to a row bucket (a graph's key, or a test's padding) and
     * the ones replayed from a CUDA graph (--cuda-graph-prompt-rows; the
     * rest ran eagerly). A step whose every row wants logits (a 1-token
     * prompt chunk beside decode rows) is a decode step, not counted here. */
    uint64_t prompt_steps, prompt_padded_steps, prompt_graph_steps;
    /* drafting phases by why they drafted (engine/adaptive.h SD_KWHY_*:
     * best, explore, refresh, hope, neighbour, periodic, probe, fixed), and
     * the running requests of those steps that did not draft (they wait
     * for a verify step for one token) */
    uint64_t spec_why_steps[SD_SPEC_WHY_N], spec_why_idle[SD_SPEC_WHY_N];
} sd_engine_stats;

/* Loads the model named by o->model (NULL/empty: the bundled model), the
 * proposer of o->spec, and starts the engine thread. */
int sd_engine_create(sd_engine **out, const sd_opts *o, sd_err *err);
/* Stops the thread, cancels what is left (on_finish CANCELLED), frees everything. */
void sd_engine_destroy(sd_engine *e);

const sd_tokenizer *sd_engine_tokenizer(const sd_engine *e);
int sd_engine_max_context(const sd_engine *e);
const char *sd_engine_model_name(const sd_engine *e);
const char *sd_engine_model_dir(const sd_engine *e);
/* The engine's cache of compiled json_schemas (thread-safe): a server that
 * compiles a request's schema through it to check it leaves the engine
 * nothing to compile. NULL where the engine has no tokenizer. */
struct sd_schema_cache *sd_engine_schemas(sd_engine *e);

/* Queues a request. The prompt is copied. *id identifies it for cancel.
 * Errors (prompt + max_tokens past the context, ...) are returned here and
 * never reach on_finish. */
int sd_engine_submit(sd_engine *e, const int32_t *prompt, int n_prompt, const sd_gen_params *p,
                     const sd_req_events *ev, void *user, uint64_t *id, sd_err *err);
/* Cancels a request in any state; its KV blocks are freed and on_finish runs
 * with SD_FINISH_CANCELLED (unless it already finished). Safe from any thread. */
void sd_engine_cancel(sd_engine *e, uint64_t id);
void sd_engine_get_stats(sd_engine *e, sd_engine_stats *st);

/* Several nodes (--nnodes): node 0 takes requests; every other node's engine
 * follows node 0's steps (sd_engine_submit refuses there). */
int sd_engine_follows(const sd_engine *e);
/* Waits up to timeout_s (<= 0: no limit) for the engine thread to end: 1
 * while it still runs; on a following node 0 once node 0 stopped it, SD_EIO
 * once the node group failed. */
int sd_engine_wait(sd_engine *e, double timeout_s);

#endif

/* engine/internal: the structs shared by the scheduler (engine.c) and the
 * proposers (spec.c). Private to src/engine. */
#ifndef SD_ENGINE_INTERNAL_H
#define SD_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/tokenizer.h"
#include "draft/ngram.h"
#include "engine/adaptive.h"
#include "engine/engine.h"
#include "engine/memplan.h"
#include "engine/tp.h"
#include "sched/kv_blocks.h"
#include "sched/prefix_cache.h"
#include "sched/stop.h"
#include "target/model.h"
#include "verify/accept.h"
#include "verify/json_mask.h"
#include "verify/json_schema.h"
#include "verify/schema_cache.h"
#include "verify/token_mask.h"

/* the JSON mask cache's memory (a 150k vocabulary: ~850 masks) */
#define SD_MASK_CACHE_BYTES ((size_t)16 << 20)
/* the json_schemas kept compiled while no request holds them */
#define SD_SCHEMAS_IDLE 32
#include "verify/sampling.h"
#include "verify/synthetic.h"

/* adaptive k: steps in a row with k = 0 before running requests stop tracking the proposer */
#define SD_SPEC_OFF_AFTER 4
/* target steps a cohort (engine.cohort_at) waits for the requests that do
 * not track the proposer to end: ~8 lifetimes of a 128-token request */
#define SD_COHORT_MAX_STEPS 1024
/* target steps a cohort goes on once every running request tracks the
 * proposer (about a 128-token request's life at ~2 tokens a step): the
 * batch drafting runs at under the same arrivals is a smaller one, which
 * drafting reaches only by running (under Poisson arrivals at c = 64 on an
 * H100 cohorts ended as soon as every request drafting was measured not
 * to pay at the 34-48 requests they had gathered, and EAGLE-3 and MTP ran
 * 1.05-1.07x plain's TPOT; drafting on, 0.80-0.99x, 0.85x on average;
 * NOTES.md, session 47) */
#define SD_COHORT_SETTLE 64
/* the steps the output rate is an average over (demand_update), and between
 * two demand picks at one batch bucket (sd_adaptive_demand_k: a scan of
 * every batch up to twice the running one's bucket) */
#define SD_DEMAND_STEPS 1024
#define SD_DEMAND_EVERY 32

enum { SD_SPEC_NONE = 0, SD_SPEC_MTP, SD_SPEC_EAGLE3, SD_SPEC_DRAFT, SD_SPEC_NGRAM };

typedef struct sd_eagle3 sd_eagle3;


#define SD_MAX_K 16

/* padded steps and CUDA graphs (graphs.c) */
#define SD_MAX_BUCKETS 64
#define SD_MAX_PGRAPHS 256

/* A proposer pass's graph: captured at start (sd__spec_capture) or the
 * second time its key is seen. */
typedef struct sd_pgraph {
    int mode;        /* PROP_* of spec.c */
    const void *src; /* the hidden-state rows it gathers from */
    int T, n_out;    /* padded rows and logits rows */
    int seen;        /* ran eagerly once */
    void *graph;     /* captured, or NULL */
} sd_pgraph;

/* A graph of the target's step with prompt rows (some rows want no
 * logits): captured the second time its key is seen (graphs.c). */
#define SD_MAX_MGRAPHS 64
typedef struct sd_mgraph {
    int T, n_out;  /* padded rows and logits rows */
    int hidden;    /* with the proposer's hidden states */
    int seen;      /* ran eagerly once, padded */
    void *graph;   /* captured, or NULL */
    uint64_t last; /* the table's clock when its key last came */
} sd_mgraph;
/* The slot of the key (T, n_out, hidden) in a table of cap graphs, *n in
 * use: its own, else a new one, else (the table full) the slot of the key
 * not captured (seen once) that came longest ago, which the new key takes;
 * -1 where every slot holds a graph. *clock counts the lookups. */
int sd__mgraph_slot(sd_mgraph *tab, int *n, int cap, uint64_t *clock, int T, int n_out,
                    int hidden);

enum { RQ_WAITING = 0, RQ_PREFILL, RQ_DECODE, RQ_DONE };

/* a request's JSON state, of json_object or of a schema (req.json) */
typedef union sd_jtext {
    sd_json_state obj;
    sd_jschema_state sch;
} sd_jtext;

typedef struct req {
    uint64_t id;
    int state;
    int32_t *tok;
    int n_tok, cap_tok, n_prompt;
    int n_comp;      /* target KV positions computed: 0..n_comp-1 */
    int draft_valid; /* proposer cache slots holding correct data */
    int fresh;       /* no token generated yet: the prefill's last logits are sampled */
    int32_t draft[SD_MAX_K];
    int n_draft;
    int has_q; /* the drafts' distributions (sampled model drafts): 1 in q (host), 2 on the
                * device (pd_qdraft rows j * ov_max_seqs + q_row, until the next drafting) */
    int q_row;
    int draft_dev; /* draft ahead: the drafts are still on the device only (pd_drafts rows j x
                    * drafts_tc + q_row), their copy on its way to ph_drafts */
    int last_k, last_n; /* the last verify: drafts proposed, accepted */
    sd_ngram *ng;       /* n-gram index of tok (SD_SPEC_NGRAM) */
    int no_spec;        /* never drafts: admitted while speculation did not pay */
    /* sd_gen_params.logprobs: each token's (lp[i] for tok[i], i >= n_prompt;
     * cap_lp entries), its steps' logits rows brought to the host */
    int want_lp, top_lp;
    /* sd_gen_params.prompt_logprobs: until they are all sent (plp_sent, the
     * next prompt position); plp_out0: the first logits row of its chunk
     * (out0 is the chunk's last, the one the first token is chosen at) */
    int want_plp, plp_out0, plp_sent;
    sd_token_logprob *lp;
    int cap_lp;
    /* logits processors (sd_gen_params.bias, the penalties): proc when any
     * is on; counts (vocab,): each token's times generated, where a
     * penalty is on */
    int proc;
    int32_t *bias_ids;
    float *bias;
    int n_bias;
    float presence, frequency;
    int32_t *counts;
    int min_tokens; /* sd_gen_params.min_tokens */
    /* the generated text's JSON state: json 1, a JSON object
     * (verify/json_mask.h); 2, a document of schema (verify/json_schema.h,
     * compiled from schema_text, which the plan carries) */
    int json;
    sd_jtext js;
    const sd_jschema *schema; /* e->schemas' (put back when r is freed) */
    char *schema_text;
    float *q; /* (SD_MAX_K, V) draft distributions when sampling with a model proposer */
    sd_sampling samp;
    int greedy, max_tokens, ignore_eos;
    int32_t stop_ids[8];
    int n_stop_ids;
    sd_stop stop;
    sd_detok *detok;
    sd_req_events ev;
    void *user;
    sd_req_stats st;
    sd_accept_stats acc;
    uint64_t t_submit, t_first;
    sd_kv_seq kv;
    atomic_int cancel;  /* asked for (any thread) */
    int cancel_applied; /* taken at a step's start (engine thread; every node alike) */
    int n_preempt;
    /* the prefix cache: whole blocks offered so far, and the key after them */
    int pc_n;
    sd_pc_key pc_key;
    /* step scratch */
    int row0, n_rows; /* rows of this request in the target batch */
    int out0;         /* first logits row */
    int hrow0, n_outs; /* its logits rows: the first (out0 before a prompt
                        * logprobs chunk moves it) and how many */
    int host;         /* its logits rows come to the host (wants_host) */
    int chunk;        /* prefill tokens in this step */
    int vi;           /* row of this request in the step's device verification, or -1 */
    struct req *next;
    struct req *all_next;
} req;

/* A timing the adaptive draft length learns from (plan.c): b is the batch
 * (the requests; k for drafts) */
enum {
    SD_OBS_TARGET, /* a target step read one at a time (a = token rows) */
    SD_OBS_DRAFT,  /* a drafting phase (a = drafting requests, b = k) */
    SD_OBS_AHEAD,  /* a plain step queued ahead (a = token rows) */
    SD_OBS_HIDDEN, /* what queueing ahead would hide of a step read one at a time (a = 1) */
    /* a step whose drafts stayed on the device (draft ahead), from the
     * step before's tokens to its own (a = drafting requests, keys = k) */
    SD_OBS_DRAFT_AHEAD,
};
typedef struct sd_plan_obs {
    int kind; /* SD_OBS_* */
    int a, b;
    double secs;
    int64_t keys; /* SD_OBS_AHEAD: the keys its rows attended to; SD_OBS_DRAFT_AHEAD: k */
} sd_plan_obs;

/* A step's tokens on their way to page-locked host memory with a mark
 * (engine.c): the argmax, or the device's acceptance */
typedef struct sd_tokens_down {
    void *dst;
    const void *src;
    size_t bytes;
    int ev;     /* the mark (0 or 1) */
    int queued; /* its copy and mark are in the stream */
} sd_tokens_down;

struct sd_engine {
    int max_batch, max_batch_tokens;
    sd_backend *be; /* the backend, or the tensor-parallel ranks' virtual one */
    sd_tp *tp;      /* --tp > 1: the ranks (tp.c); NULL on one rank */
    sd_backend *prof_inner; /* --profile-ops: be times the ops of this backend */
    int n_ranks;
    sd_model *targets[SD_TP_MAX]; /* each rank's shard (targets[0] == target) */
    sd_model *drafts[SD_TP_MAX];  /* each rank's copy of the draft LM */
    sd_eagle3 *eagles[SD_TP_MAX]; /* each rank's copy of the EAGLE-3 head */
    sd_model *target;
    sd_tokenizer *tok;
    char model_dir[1024];
    char model_name[256];
    int V, D, max_ctx, eos;
    int eos_ids[8], n_eos;
    int ov_max_seqs; /* sequences in one step (block-table rows) */
    /* proposer */
    int spec;   /* SD_SPEC_* */
    int spec_k; /* -1 auto */
    int k_max;
    sd_model *draft;      /* draft LM (SD_SPEC_DRAFT) */
    sd_eagle3 *eagle;     /* EAGLE-3 head */
    /* proposer device buffers (MTP / EAGLE-3 / draft LM steps); pd_meta
     * packs a pass's tok, pos, seq, slot, hrows (T each) and rows (n_out) */
    int32_t *pd_meta;
    int32_t *ph_meta; /* its host side (6 T) */
    /* the device draft chain (spec.c): drafts (SD_MAX_K, ov_max_seqs), argmax
     * scratch, pass metadata and their host sides; EAGLE-3's d2t */
    int32_t *pd_drafts, *pd_am, *pd_chain, *pd_d2t;
    float *pd_qdraft;   /* sampled device drafts' distributions (k_max, ov, V) */
    float *pd_qsmall;   /* EAGLE-3: one pass's distributions over the draft vocabulary (ov, Vd) */
    sd_sample_params *pd_dsp, *ph_dsp; /* their sampling parameters (k_max, ov) */
    int32_t *d_qidx, *h_qidx;          /* verify: d_q's rows in pd_qdraft (ov * k_max) */
    int32_t *ph_chain, *ph_drafts;
    int32_t *ph_vtok; /* draft ahead: a verify step's tokens, then its gather indices */
    int draft_ahead;  /* --draft-ahead on one rank and node (sd__drafts_gather) */
    int drafts_tc;    /* chain rows of the drafts on the device */
    int draft_sync;   /* this drafting phase is timed: its drafts are waited for */
    float *pd_logits, *pd_hid_in, *pd_hid_out, *pd_hid_prev;
    float *ph_logits;
    float *pd_aux_in; /* EAGLE-3: gathered aux states (T, 3D) */
    float *ph_row;    /* EAGLE-3: a draft row spread over the target vocabulary */
    int32_t *ph_i32; /* host rows of a proposer batch (6 x max_tokens) */
    int ngram_n;
    /* KV */
    sd_kv_pool *kv;
    int block_size, n_blocks, max_blocks;
    sd_pcache *pc;      /* --prefix-cache, or NULL */
    sd_token_table tt;  /* the vocabulary's bytes (the JSON masks), with a tokenizer */
    sd_schema_cache *schemas; /* the json_schemas of requests, one compilation a text */
    sd_mask_cache *mcache; /* the JSON masks of the states met lately
                            * (SD_MASK_CACHE_BYTES; pages touched as used) */
    int32_t *pc_match;  /* (max_blocks,) a lookup's blocks */
    sd_pc_key *pc_keys; /* (max_blocks,) and their keys */
    /* thread and queues */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    req *incoming; /* submitted, not yet seen by the thread (LIFO, reversed on take) */
    req *all;      /* every live request, for cancel by id (guarded by mu) */
    uint64_t next_id;
    /* engine-thread state */
    req **running;
    int n_running, cap_running;
    req **waiting;
    int n_waiting, cap_waiting;
    /* device step buffers */
    int max_tokens;
    int32_t *d_meta; /* a step's tok, pos, seq, slot (T each), rows (n_out): one upload */
    int32_t *d_table;
    float *d_logits, *d_hidden, *d_aux;
    /* host step buffers */
    int32_t *h_tok, *h_pos, *h_seq, *h_slot, *h_table, *h_rows;
    int32_t *h_meta; /* the packed upload */
    float *h_logits, *p_rows;
    int32_t *d_am, *h_am; /* argmax of each logits row (greedy-only steps) */
    int am_valid;         /* h_am holds this step's argmax; h_logits does not */
    /* Launch ahead (engine.c): a plain decode step whose batch cannot
     * change queues the step after it before it is read; that step's
     * tokens are its argmax or its device sampling, copied on the device. Each of the two
     * (the step being read, the one queued) has a download mark of the
     * backend, an argmax buffer and page-locked step inputs of its own. */
    int ahead_on;         /* --launch-ahead: 0 off, 1 auto (one rank, graphs), 2 on (any) */
    int ahead_live;       /* ahead holds a queued step not yet read */
    int ahead_sampled;    /* its tokens are sampled on the device (launch_dev_accept) */
    int ahead_ev;         /* its mark */
    int ahead_Tp;         /* its padded rows (0: none) */
    /* its tokens' download, not queued yet: with the copies of the step
     * queued after it (one kernel, ops.h copies) or alone when it is read */
    sd_tokens_down ahead_down;
    struct step *ahead;   /* its rows; a request that ended since: NULL */
    int32_t *h_am_ev[2];  /* each mark's argmax (h_am points at one) */
    int32_t *h_meta_ev[2], *h_table_ev[2];
    int32_t *h_accraw_ev[2]; /* each mark's launch_dev_accept results */
    int32_t *h_acc_ev[2];    /* and its inputs (h_acc's, h_sp's) */
    sd_sample_params *h_sp_ev[2];
    uint64_t ahead_steps; /* sd_engine_stats.ahead_steps */
    uint64_t host_rows, host_steps; /* sd_engine_stats.logits_host_{rows,steps} */
    uint64_t ahead_refused[SD_AHEAD_CAUSES]; /* sd_engine_stats.ahead_refused */
    uint64_t draft_ahead_steps, draft_ahead_timed; /* sd_engine_stats.draft_ahead_* */
    /* sampled steps verified on the backend (engine.c launch_dev_accept):
     * probabilities scratch (max_out, V), draft distributions (ov, k_max, V)
     * with a model proposer, packed ints (row0, n_draft, drafts, n_acc, out)
     * and sampling parameters, their host sides, per-request results */
    int max_out; /* logits rows of a step at most */
    float *d_probs, *d_q;
    int32_t *d_acc, *h_acc, *h_acc_res;
    sd_sample_params *d_sp, *h_sp;
    int dev_acc, acc_n, acc_k;
    /* stats (guarded by mu) */
    sd_engine_stats stats;
    double t_target_per_tok, t_target_base; /* cost model, seconds */
    sd_adaptive adapt;
    sd_mem_plan plan;
    sd_accept_stats acc_all; /* engine-wide, engine thread only */
    double draft_s_total, verify_s_total, host_s_total;
    int zero_k_steps; /* consecutive steps adaptive k chose 0 */
    unsigned n_admitted_off; /* requests admitted while speculation was off */
    /* adaptive k's cohort switch (sd_adaptive_cohort): stats.steps + 1 at
     * its start, 0: none. Arrivals track the proposer until no running
     * request is left that does not, and SD_COHORT_SETTLE steps after
     * that (cohort_all: stats.steps + 1 then, 0: not yet), or until
     * SD_COHORT_MAX_STEPS pass; no cohort starts before stats.steps
     * reaches cohort_next. (Engine steps,
     * not adapt.steps: that clock ticks at the steps adaptive k prices,
     * and with every request off it stood still, 189 against the engine's
     * ~4500 in a run at c = 64 on an H100, so the first cohort's gap never
     * ended; NOTES.md, session 46.) */
    uint64_t cohort_at, cohort_all, cohort_next;
    sd_cohort_gap cohort_gap; /* cohort_next's gap after a cohort's end */
    int cohort_k; /* the k its requests draft at while it gathers */
    /* the output rate (demand_update): tokens and busy seconds, each
     * step's weighed down by 1 - 1 / SD_DEMAND_STEPS a step; the last
     * step's end and token count; the demand pick cached for the batch
     * bucket dem_k_bucket at engine step (stats.steps) dem_k_at + 1 (0: none) */
    double dem_tok, dem_s;
    uint64_t dem_ns, dem_prev, dem_k_at, dem_steps; /* (dem_steps: busy steps counted) */
    int dem_busy, dem_prompt, dem_k, dem_k_bucket; /* (dem_prompt: the last step had prompt rows) */
    unsigned n_cohorts;
    /* padded steps and CUDA graphs (graphs.c) */
    int graphs_on; /* the backend captures graphs and --cuda-graph-max-bs > 0 */
    int pad_steps; /* decode/verify steps are padded to buckets */
    int n_buckets, graph_max_T;
    int graph_bs; /* sequences a step's graphs take: min(--cuda-graph-max-bs, --max-batch) */
    int buckets[SD_MAX_BUCKETS];
    void *tgraph[SD_MAX_BUCKETS]; /* target step of buckets[i] tokens */
    /* the same without the hidden states a proposer reads (MTP, EAGLE-3),
     * for steps where no request tracks the proposer: captured at start up
     * to graph_bs rows (the rest when first needed) */
    void *tgraph_plain[SD_MAX_BUCKETS];
    sd_pgraph pgraphs[SD_MAX_PGRAPHS];
    int n_pgraphs;
    /* steps with prompt rows, up to mixed_max_T rows (--cuda-graph-prompt-rows;
     * 0: none padded), by padded rows, logits rows and hidden states */
    int mixed_max_T;
    sd_mgraph mgraphs[SD_MAX_MGRAPHS];
    int n_mgraphs;
    uint64_t mgraph_clock;
    /* proposer passes run eagerly (a shape's first pass, no graph for its
     * size), and of those the ones whose shape found the graph cache full */
    uint64_t prop_eager, prop_cache_full;
    /* proposer passes that were a graph shape's first run (eager, making
     * GEMM plans) or its capture: one-off costs, not a drafting phase's */
    uint64_t prop_oneoff;
    uint64_t plain_steps; /* target steps without the proposer's hidden states */
    /* target steps with prompt rows; of those padded (a graph's key, or a
     * test's padding) and replayed from a graph */
    uint64_t prompt_steps, prompt_padded_steps, prompt_graph_steps;
    /* drafting phases by why they drafted (SD_KWHY_*), and the running
     * requests of those steps that did not draft */
    uint64_t kwhy_steps[SD_KWHY_N], kwhy_idle[SD_KWHY_N];
    uint64_t draft_phases, draft_observed, draft_oneoff; /* sd_engine_stats.spec_draft_* */
    /* when the last step read's tokens came (0: it had prompt rows) and its
     * requests: a queued-ahead step's interval (read_step) */
    uint64_t last_read_ns;
    int last_read_n;
    /* the last drafting phase whose drafts stayed on the device (draft
     * ahead), learnable (no prompt rows, no probe, no one-off pass): its
     * batch, drafting requests and k (0: none); the step that takes them
     * times its interval (SD_OBS_DRAFT_AHEAD) */
    int dahead_n, dahead_nd, dahead_k;
    int pad_seq;        /* block-table row of padding rows: the trash block */
    int32_t trash_slot; /* first slot of the trash block (past the pool's) */
    sd_synthetic synth; /* --synthetic-accept (benchmarks only; n == 0: off) */
    /* several nodes (plan.c): node 0 sends each step's plan, the others
     * follow it, so every node takes the same steps */
    sd_nodes *nodes; /* NULL on one node */
    int follower;    /* node_rank > 0 */
    int node_rank;
    int broken;      /* the node group failed: no more steps */
    int reported_broken;
    int stopped; /* the engine thread has ended (guarded by mu) */
    uint64_t plan_seq;
    req **fresh; /* node 0: requests taken since the last plan */
    int n_fresh, cap_fresh;
    sd_plan_obs *obs; /* node 0: timings since the last plan */
    int n_obs, cap_obs;
};

/* plan.c */
/* The top of a step on several nodes: node 0 sends the plan (new requests,
 * cancellations, timings, quit), every other node receives and applies it.
 * On one node: nothing. */
int sd__plan_exchange(sd_engine *e, sd_err *err);
/* node 0: the last plan, telling the others to stop */
void sd__plan_send_quit(sd_engine *e);
/* every node: n_blocks := the smallest of the nodes' */
int sd__plan_agree_blocks(sd_engine *e, int *n_blocks, sd_err *err);
/* a timing for the adaptive draft length: applied now on one node, through
 * the next plan on several */
void sd__plan_observe(sd_engine *e, int kind, int a, int b, double secs, int64_t keys);
/* engine.c: a request checked and built (not queued); queued as waiting */
req *sd__engine_req_new(sd_engine *e, const int32_t *prompt, int n_prompt,
                        const sd_gen_params *p, sd_err *err);
int sd__engine_admit(sd_engine *e, req *r);

typedef struct step {
    int T, n_out, n_seq;
    req *seqs[4096];
} step;

/* spec.c */
int sd__spec_init(sd_engine *e, const sd_opts *o, sd_err *err);
void sd__spec_free(sd_engine *e);
/* KV bytes per token slot of the proposer's own cache (draft LM, EAGLE-3) */
size_t sd__spec_kv_bytes_per_slot(const sd_engine *e);
/* the proposer's buffers and workspaces, bytes */
size_t sd__spec_buffer_bytes(const sd_engine *e);
int sd__spec_alloc_kv(sd_engine *e, int n_slots, sd_err *err);
/* 1: the target pass must write final hidden states, 2: EAGLE-3 aux states, 0: none */
int sd__spec_wants_hidden(const sd_engine *e);
/* After the target pass and acceptance: catch the proposer up and draft k tokens
 * for every decoding request of the step. */
int sd__spec_step(sd_engine *e, step *s, int k, sd_err *err);
/* draft ahead (spec.c): r's drafts from their host copy (chain rows Tc);
 * the copy of a verify step's T tokens and gather indices; after it, the
 * gather of the step's tokens */
void sd__drafts_to_host(sd_engine *e, req *r, int Tc);
sd_copy sd__drafts_gather_copy(sd_engine *e, const step *s, int T);
void sd__drafts_gather(sd_engine *e, int32_t *tokens, int T);
/* At start, where steps are padded: the proposer's graphs captured for the
 * shapes drafting takes (spec.c has which; without graphs each shape runs
 * once, eagerly); 0 or an error */
int sd__spec_capture(sd_engine *e, sd_err *err);
int sd__engine_reserve(sd_engine *e, req *r, int n);
/* the copy of the block-table rows of the step's sequences (after
 * reservations), from a host buffer it fills */
sd_copy sd__engine_tables_copy(sd_engine *e, const step *s);
/* n copies from host memory (sd__host_buf's) to the device: one launch
 * where the backend makes them one (ops.h copies), else upload2d each */
int sd__engine_put_host(sd_engine *e, const sd_copy *cp, int n);
/* a host buffer the backend downloads into, or uploads from once before a
 * sync: page-locked where the backend has it (ops.h host_alloc), else
 * malloc; NULL when out of memory. Freed with sd__host_buf_free. */
void *sd__host_buf(sd_engine *e, size_t bytes);
void sd__host_buf_free(sd_engine *e, void *p);
/* uploads rows 0..T-1 of h_tok/h_pos/h_seq/h_slot and n_out of h_rows in one
 * copy and fills f's inputs with their device addresses (fixed for a given
 * T and n_out, so a graph captured with them stays valid); hidden: the pass
 * also writes the hidden states the proposer reads (MTP, EAGLE-3) */
int sd__engine_upload_step(sd_engine *e, int T, int n_out, int hidden, sd_fwd *f);

/* model passes on every rank (tp.c's rank threads) or the one backend */
enum { SD_FWD_TARGET = 0, SD_FWD_MTP, SD_FWD_DRAFT, SD_FWD_EAGLE_FIRST, SD_FWD_EAGLE_CHAIN };
int sd__fwd(sd_engine *e, int which, const sd_fwd *f, sd_err *err);
/* fn once per rank, in the rank's context (once, on one rank) */
int sd__engine_each(sd_engine *e, int (*fn)(sd_engine *e, void *ctx, sd_err *err), void *ctx,
                    sd_err *err);

/* graphs.c */
int sd__graphs_init(sd_engine *e, const sd_opts *o);
size_t sd__graphs_reserve_bytes(const sd_engine *e);
/* padded row count of a T-row step, 0 when it is not padded */
int sd__graph_bucket(const sd_engine *e, int T);
/* A step of T rows of which n_out want logits (n_out < T: it has prompt
 * rows), up to mixed_max_T rows: its padded rows (the returned bucket, 0:
 * not padded, it runs eagerly as it is), its logits rows *No (n_out's
 * power of two, at most max_out and the bucket) and its graph entry *g
 * (NULL where graphs are off or the table is full: padded all the same
 * where a test pads steps without graphs). */
int sd__mixed_bucket(sd_engine *e, int T, int n_out, int hidden, int *No, sd_mgraph **g);
/* runs the step of entry g (sd__mixed_bucket's, graphs on), its inputs
 * uploaded as f: eagerly the first time (which makes the GEMM plans of its
 * rows), then from its graph */
int sd__mixed_launch(sd_engine *e, sd_mgraph *g, const sd_fwd *f, int argmax, sd_err *err);
/* the prompt step sizes warmed up at start (graphs.c): each doubling from
 * the largest bucket up to a step's most rows, at most max into sizes;
 * their count */
int sd__prompt_sizes(const sd_engine *e, int *sizes, int max);
/* rows from..to-1 become padding rows (tok may be NULL) */
void sd__pad_rows(const sd_engine *e, int32_t *tok, int32_t *pos, int32_t *seq, int32_t *slot,
                  int from, int to);
/* Packs a pass's metadata into h for one upload: ncol columns of T rows
 * (tok, pos, seq, slot[, hrows]; the first n rows of each from cols, the
 * rest padding rows, zeros in columns past slot), then rows (n_rows from
 * rows, zeros up to N). Returns the words; *max_pos = largest pos + 1. */
size_t sd__pack_step(const sd_engine *e, int32_t *h, int T, int n, const int32_t *const *cols,
                     int ncol, const int32_t *rows, int n_rows, int N, int *max_pos);
int sd__target_pass(sd_engine *e, const sd_fwd *f, int argmax, sd_err *err);
int sd__graphs_capture(sd_engine *e, sd_err *err);
/* replays the target graph of Tp rows; f (its inputs, uploaded) without
 * the proposer's hidden states selects, and first captures, the plain one */
int sd__target_graph_launch(sd_engine *e, int Tp, const sd_fwd *f, sd_err *err);
sd_pgraph *sd__pgraph_find(sd_engine *e, int mode, const void *src, int T, int n_out);
void sd__graphs_free(sd_engine *e);

#endif

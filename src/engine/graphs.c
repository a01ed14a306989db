/* engine/graphs: padded steps and CUDA graphs.
 *
 * A decode or verify step of the target is the same work for every step of
 * the same size: its ops, their launch shapes and their pointers depend only
 * on the number of token rows T (positions, slots, block tables and tokens
 * are read from device buffers). So the engine captures one graph per
 * bucket of T at start (1..8, then 16, 24, ... up to --cuda-graph-max-bs
 * sequences x (k + 1) tokens) and replays it: a step with T rows runs the
 * graph of the smallest bucket >= T, its extra rows padded.
 *
 * A padding row is token 0 at position 0 of an extra block-table row whose
 * one block is the trash block: a block past the pool's blocks that every
 * cache allocates and nothing else uses, so padding writes K/V only there
 * and attends only to itself. Its logits are computed and ignored.
 *
 * Proposer passes (MTP, EAGLE-3, draft LM) vary more (catch-up rows, logits
 * rows, the hidden-state source). Their graphs are keyed by (pass, source,
 * T bucket, logits bucket); the shapes drafting takes are captured at start
 * too (sd__spec_capture: for each bucket of drafting requests, the catch-up
 * pass of 1..k+1 rows a request and the chain of 2..k draft passes), and
 * any other shape (a prompt's catch-up, an uneven one) when it comes back:
 * seen once it runs eagerly (which also makes the GEMM plans), seen again
 * it is captured and replayed from then on. The table is bounded; past it,
 * steps run eagerly.
 *
 * Backends without graphs (the CPU) run every step eagerly, unpadded; the
 * engine tests can still pad (sd_opts.debug_pad_steps) to check that padding
 * changes no output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "engine/internal.h"

static int has_graphs(const sd_engine *e)
{
    const sd_ops *op = e->be->ops;
    return op->graph_begin && op->graph_end && op->graph_launch && op->graph_free;
}

int sd__graphs_init(sd_engine *e, const sd_opts *o)
{
    int bs = o->cuda_graph_max_bs < e->max_batch ? o->cuda_graph_max_bs : e->max_batch;
    e->graphs_on = has_graphs(e) && bs > 0;
    e->pad_steps = e->graphs_on || (o->debug_pad_steps && bs > 0);
    e->graph_bs = bs > 0 ? bs : 0;
    e->n_buckets = 0;
    if (!e->pad_steps)
        return 0;
    int per_seq = e->spec == SD_SPEC_NONE ? 1 : e->k_max + 1;
    int max_T = bs * per_seq;
    if (max_T > e->max_tokens)
        max_T = e->max_tokens;
    for (int T = 1; T <= max_T && e->n_buckets < SD_MAX_BUCKETS;) {
        int b = sd_row_bucket(T);
        if (b > max_T)
            b = max_T;
        e->buckets[e->n_buckets++] = b;
        T = b + 1;
    }
    e->graph_max_T = e->buckets[e->n_buckets - 1];
    e->mixed_max_T = SD_MIN(o->cuda_graph_prompt_rows, e->max_tokens);
    return 0;
}

/* Estimate for the memory plan, before anything is captured: a graph's
 * executable holds its kernels' parameters (a few hundred bytes a node), so
 * a few MiB a target graph (two where a proposer reads hidden states) and
 * 2 MiB a proposer pass's are generous. The real use is logged after
 * capture. */
size_t sd__graphs_reserve_bytes(const sd_engine *e)
{
    if (!e->graphs_on)
        return 0;
    size_t target = (size_t)e->n_buckets * (sd__spec_wants_hidden(e) ? 2 : 1);
    return target * ((size_t)4 << 20) +
           (e->mixed_max_T > 0 ? (size_t)SD_MAX_MGRAPHS * ((size_t)4 << 20) : 0) +
           (e->spec != SD_SPEC_NONE ? (size_t)SD_MAX_PGRAPHS * ((size_t)2 << 20) : 0);
}

int sd__graph_bucket(const sd_engine *e, int T)
{
    if (!e->pad_steps || T <= 0 || T > e->graph_max_T)
        return 0;
    for (int i = 0; i < e->n_buckets; i++)
        if (e->buckets[i] >= T)
            return e->buckets[i];
    return 0;
}

static int bucket_index(const sd_engine *e, int Tp)
{
    for (int i = 0; i < e->n_buckets; i++)
        if (e->buckets[i] == Tp)
            return i;
    return -1;
}

void sd__pad_rows(const sd_engine *e, int32_t *tok, int32_t *pos, int32_t *seq, int32_t *slot,
                  int from, int to)
{
    for (int i = from; i < to; i++) {
        if (tok)
            tok[i] = 0;
        pos[i] = 0;
        seq[i] = e->pad_seq;
        slot[i] = e->trash_slot;
    }
}

size_t sd__pack_step(const sd_engine *e, int32_t *h, int T, int n, const int32_t *const *cols,
                     int ncol, const int32_t *rows, int n_rows, int N, int *max_pos)
{
    for (int c = 0; c < ncol; c++)
        memcpy(h + (size_t)c * T, cols[c], (size_t)n * sizeof(int32_t));
    sd__pad_rows(e, h, h + T, h + 2 * T, h + 3 * T, n, T);
    for (int c = 4; c < ncol; c++)
        memset(h + (size_t)c * T + n, 0, (size_t)(T - n) * sizeof(int32_t));
    int32_t *r = h + (size_t)ncol * T;
    memcpy(r, rows, (size_t)n_rows * sizeof(int32_t));
    memset(r + n_rows, 0, (size_t)(N - n_rows) * sizeof(int32_t));
    int mp = 0;
    for (int i = 0; i < T; i++)
        mp = h[T + i] + 1 > mp ? h[T + i] + 1 : mp;
    *max_pos = mp;
    return (size_t)ncol * T + (size_t)N;
}

/* The target pass: forward, then (argmax) the argmax of every logits row,
 * so that greedy steps download only the ids. */
int sd__target_pass(sd_engine *e, const sd_fwd *f, int argmax, sd_err *err)
{
    int rc = sd__fwd(e, SD_FWD_TARGET, f, err);
    if (!rc && argmax && f->n_out > 0 && e->be->ops->argmax_rows)
        e->be->ops->argmax_rows(e->be, e->d_am, f->logits, f->n_out, e->V);
    return rc;
}

struct capture_ctx {
    const sd_fwd *f;
    void **graph;
};

/* in each rank's context: the pass captured into the rank's graph */
static int capture_target(sd_engine *e, void *ctx, sd_err *err)
{
    struct capture_ctx *c = ctx;
    int rc = e->be->ops->graph_begin(e->be);
    if (rc)
        return rc;
    int fr = sd__target_pass(e, c->f, 1, err);
    rc = e->be->ops->graph_end(e->be, c->graph);
    return fr ? fr : rc;
}

/* the target pass of a T-row step with f's inputs and outputs captured
 * into *graph */
static int capture_bucket(sd_engine *e, int T, const sd_fwd *f, void **graph, sd_err *err)
{
    struct capture_ctx cx = {f, graph};
    /* the collectives of the capture run at each replay, not now */
    sd_comm *comm = e->tp ? sd__tp_comm(e->tp) : NULL;
    sd_comm_record_begin(comm);
    int rc = sd__engine_each(e, capture_target, &cx, err);
    if (sd_comm_record_end(comm, *graph))
        sd_log_warn("cuda graphs: no memory to count the collectives of %d-token steps",
                    T);
    return rc;
}

int sd__prompt_sizes(const sd_engine *e, int *sizes, int max)
{
    int n = 0;
    for (int T = e->graph_max_T; T > 0 && T < e->max_tokens && n < max;) {
        T = T < e->max_tokens / 2 ? 2 * T : e->max_tokens;
        sizes[n++] = T;
    }
    return n;
}

/* Prompt steps of more rows than the largest bucket: the target's eager
 * pass at each of sd__prompt_sizes, so the GEMMs' timed trials of their
 * row counts run now. A prompt step's row count takes the trial of a row
 * count of its shape up to twice its own (kernels/cuda/matmul.cu), the
 * buckets' below the largest one and these above; left to the first
 * prompts of each size, they cost those prompts' time to first token
 * 35-100 ms on the bundled model on an H200 (NOTES.md, session 31). The
 * proposer's passes: sd__spec_capture. */
static int warm_prompt_rows(sd_engine *e, sd_err *err)
{
    const sd_ops *op = e->be->ops;
    uint64_t t0 = sd_now_ns();
    int sizes[32], n = sd__prompt_sizes(e, sizes, 32);
    for (int i = 0; i < n; i++) {
        const int T = sizes[i];
        sd__pad_rows(e, e->h_tok, e->h_pos, e->h_seq, e->h_slot, 0, T);
        e->h_rows[0] = T - 1; /* a prompt step's logits: a row a request, not T */
        sd_fwd f;
        int rc = sd__engine_upload_step(e, T, 1, 1, &f);
        if (!rc)
            rc = sd__target_pass(e, &f, 1, err);
        if (!rc)
            rc = op->sync(e->be);
        if (rc)
            return err->msg[0] ? rc : sd_err_set(err, rc, "a %d-token warm-up step failed", T);
    }
    if (n)
        sd_log_info("cuda graphs: %d prompt step sizes (%d..%d tokens) warmed up in %.2f s", n,
                    sizes[0], sizes[n - 1], (double)(sd_now_ns() - t0) * 1e-9);
    return 0;
}

int sd__graphs_capture(sd_engine *e, sd_err *err)
{
    if (!e->graphs_on)
        return 0;
    const sd_ops *op = e->be->ops;
    size_t free0 = 0, free1 = 0, total = 0;
    if (op->mem_info)
        op->mem_info(e->be, &free0, &total);
    uint64_t t0 = sd_now_ns();
    for (int b = 0; b < e->n_buckets; b++) {
        int T = e->buckets[b];
        sd__pad_rows(e, e->h_tok, e->h_pos, e->h_seq, e->h_slot, 0, T);
        for (int i = 0; i < T; i++)
            e->h_rows[i] = i;
        sd_fwd f;
        int rc = sd__engine_upload_step(e, T, T, 1, &f);
        /* warm-up: the first run makes the GEMM plans outside the capture */
        if (!rc)
            rc = sd__target_pass(e, &f, 1, err);
        if (!rc)
            rc = op->sync(e->be);
        if (!rc)
            rc = capture_bucket(e, T, &f, &e->tgraph[b], err);
        /* a step where no request tracks the proposer (speculation off)
         * runs the target without the hidden states it would read */
        if (!rc && sd__spec_wants_hidden(e) && T <= e->graph_bs) {
            sd_fwd fp = f; /* the same inputs, uploaded */
            fp.hidden = NULL;
            fp.aux = NULL;
            rc = capture_bucket(e, T, &fp, &e->tgraph_plain[b], err);
        }
        if (rc)
            return err->msg[0] ? rc
                               : sd_err_set(err, rc, "capturing the CUDA graph of %d-token steps failed",
                                            T);
    }
    if (op->mem_info)
        op->mem_info(e->be, &free1, &total);
    int n_plain = 0;
    for (int b = 0; b < e->n_buckets; b++)
        n_plain += e->tgraph_plain[b] != NULL;
    char plain[96] = "";
    if (n_plain)
        snprintf(plain, sizeof plain, " (%d also without the proposer's hidden states)",
                 n_plain);
    sd_log_info("cuda graphs: %d target step sizes (1..%d tokens) captured%s in %.2f s, %.1f MiB",
                e->n_buckets, e->graph_max_T, plain, (double)(sd_now_ns() - t0) * 1e-9,
                free0 > free1 ? (double)(free0 - free1) / (1 << 20) : 0.0);
    return warm_prompt_rows(e, err);
}

int sd__target_graph_launch(sd_engine *e, int Tp, const sd_fwd *f, sd_err *err)
{
    int b = bucket_index(e, Tp);
    if (b < 0 || !e->tgraph[b])
        return SD_EINVAL;
    void **g = &e->tgraph[b];
    if (sd__spec_wants_hidden(e) && !f->hidden && !f->aux) {
        g = &e->tgraph_plain[b];
        if (!*g) {
            /* the step's inputs are uploaded: capture records, runs nothing */
            int rc = capture_bucket(e, Tp, f, g, err);
            if (rc)
                return rc;
            sd_log_debug("cuda graphs: %d-token steps without the proposer's hidden states captured",
                         Tp);
        }
    }
    int rc = e->be->ops->graph_launch(e->be, *g);
    if (!rc && e->tp)
        sd_comm_replayed(sd__tp_comm(e->tp), *g); /* its collectives ran */
    return rc;
}

/* ---- steps with prompt rows ---- */

/* A step with prompt rows is a decode or verify step's rows (every one
 * wants logits) and prompt chunks (only a prompt's last row does). Eager,
 * such a step cost the host 0.25-0.8 ms of launches and GEMM calls on the
 * bundled model on an H200 whatever its rows, several times the GPU's
 * time; under arrivals every admission is one, and the whole batch waits
 * for it (at 64 requests, 650 arrivals a second: ~800 such steps and 0.43
 * s of 1.6 s; NOTES.md, session 33). Padded to the row buckets of the
 * decode graphs (up to 1/4 more rows past 64, more below) with their logits rows
 * padded to a power of two, the keys repeat, and a key's graph is captured
 * the second time it comes, as a proposer pass's is. Past
 * --cuda-graph-prompt-rows a step's GPU time hides its launches, and the
 * padding would only add work. */
int sd__mixed_bucket(sd_engine *e, int T, int n_out, int hidden, int *No, sd_mgraph **g)
{
    *g = NULL;
    *No = 0;
    if (!e->pad_steps || T <= 0 || n_out >= T || T > e->mixed_max_T)
        return 0;
    const int Tp = sd_row_bucket(T);
    if (Tp > e->max_tokens)
        return 0;
    int no = 0;
    if (n_out > 0)
        for (no = 1; no < n_out; no *= 2)
            ;
    no = SD_MIN(no, SD_MIN(e->max_out, Tp));
    *No = no;
    if (!e->graphs_on)
        return Tp; /* a test's padding: no graphs to key */
    hidden = hidden ? sd__spec_wants_hidden(e) : 0;
    const int i = sd__mgraph_slot(e->mgraphs, &e->n_mgraphs, SD_MAX_MGRAPHS, &e->mgraph_clock, Tp,
                                  no, hidden);
    if (i < 0)
        return 0; /* every slot holds a graph: eager, unpadded */
    *g = &e->mgraphs[i];
    return Tp;
}

/* A key that came once keeps no slot from one that comes again: under
 * arrivals the first steps' mix of keys (~460 possible up to 256 rows)
 * would fill the table with one-offs, and the keys that repeat later
 * would run eagerly for good. */
int sd__mgraph_slot(sd_mgraph *tab, int *n, int cap, uint64_t *clock, int T, int n_out,
                    int hidden)
{
    const uint64_t now = ++*clock;
    int old = -1;
    for (int i = 0; i < *n; i++) {
        sd_mgraph *m = &tab[i];
        if (m->T == T && m->n_out == n_out && m->hidden == hidden) {
            m->last = now;
            return i;
        }
        if (!m->graph && (old < 0 || m->last < tab[old].last))
            old = i;
    }
    const int i = *n < cap ? (*n)++ : old;
    if (i >= 0)
        tab[i] = (sd_mgraph){.T = T, .n_out = n_out, .hidden = hidden, .last = now};
    return i;
}

int sd__mixed_launch(sd_engine *e, sd_mgraph *g, const sd_fwd *f, int argmax, sd_err *err)
{
    if (!g->seen) {
        g->seen = 1;
        return sd__target_pass(e, f, argmax, err);
    }
    if (!g->graph) {
        /* the step's inputs are uploaded: capture records, runs nothing */
        int rc = capture_bucket(e, g->T, f, &g->graph, err);
        if (rc)
            return rc;
        sd_log_debug("cuda graphs: %d-token steps of %d logits rows%s with prompt rows captured",
                     g->T, g->n_out, g->hidden ? " (with hidden states)" : "");
    }
    int rc = e->be->ops->graph_launch(e->be, g->graph);
    if (!rc && e->tp)
        sd_comm_replayed(sd__tp_comm(e->tp), g->graph); /* its collectives ran */
    return rc;
}

/* ---- proposer graphs ---- */

sd_pgraph *sd__pgraph_find(sd_engine *e, int mode, const void *src, int T, int n_out)
{
    if (!e->graphs_on)
        return NULL;
    for (int i = 0; i < e->n_pgraphs; i++) {
        sd_pgraph *g = &e->pgraphs[i];
        if (g->mode == mode && g->src == src && g->T == T && g->n_out == n_out)
            return g; /* spec.c's pgraph_run counts its replays' collectives */
    }
    if (e->n_pgraphs == SD_MAX_PGRAPHS) {
        e->prop_cache_full++; /* its passes run eagerly from now on */
        return NULL;
    }
    sd_pgraph *g = &e->pgraphs[e->n_pgraphs++];
    memset(g, 0, sizeof *g);
    g->mode = mode;
    g->src = src;
    g->T = T;
    g->n_out = n_out;
    return g;
}

void sd__graphs_free(sd_engine *e)
{
    if (!e->be || !e->be->ops->graph_free)
        return;
    for (int b = 0; b < e->n_buckets; b++) {
        if (e->tgraph[b])
            e->be->ops->graph_free(e->be, e->tgraph[b]);
        if (e->tgraph_plain[b])
            e->be->ops->graph_free(e->be, e->tgraph_plain[b]);
    }
    for (int i = 0; i < e->n_pgraphs; i++)
        if (e->pgraphs[i].graph)
            e->be->ops->graph_free(e->be, e->pgraphs[i].graph);
    for (int i = 0; i < e->n_mgraphs; i++)
        if (e->mgraphs[i].graph)
            e->be->ops->graph_free(e->be, e->mgraphs[i].graph);
    memset(e->tgraph, 0, sizeof e->tgraph);
    memset(e->tgraph_plain, 0, sizeof e->tgraph_plain);
    e->n_pgraphs = 0;
    e->n_mgraphs = 0;
}

/* engine/spec: the proposers and the adaptive draft length.
 *
 * After every target pass each proposer first catches up on what the target
 * computed ("extend"), then drafts k tokens per decoding request ("chain"):
 *
 *   MTP (DeepSeek NextN): slot i holds (token x_{i+1}, target hidden h_i) at
 *     rotary position i. Extend fills slots [draft_valid, n_comp) with the
 *     target's final hidden states of this pass; the last slot's logits are
 *     d_1. Chain step j feeds d_j and the MTP layer's own output hidden of the
 *     previous slot. After a verify, the slots past the accepted prefix are
 *     rewritten by the next extend from the target's true hidden states.
 *   Draft LM: its own KV cache over the same slots; token x_i at position i.
 *     Accepted drafts stay valid in its cache.
 *   N-gram: prompt lookup over the request's tokens; no model.
 *
 * Drafts are the argmax for greedy requests; for sampled requests they are
 * sampled from q = the draft distribution after the request's temperature /
 * top-k / top-p, and q is kept for rejection sampling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "draft/eagle3.h"
#include "engine/internal.h"


/* ------------------------------------------------------------------ buffers */

/* Per-request draft from a logits row: argmax, or a sample of q. */
static int32_t draft_token(sd_engine *e, req *r, const float *row, int j)
{
    if (e->eagle) {
        /* reduced draft vocabulary: map through d2t */
        int Vd = sd_eagle3_draft_vocab(e->eagle);
        const int32_t *d2t = sd_eagle3_d2t(e->eagle);
        if (r->greedy)
            return d2t[sd_argmax(row, Vd)];
        for (int i = 0; i < e->V; i++)
            e->ph_row[i] = -INFINITY;
        for (int i = 0; i < Vd; i++)
            e->ph_row[d2t[i]] = row[i];
        row = e->ph_row;
    }
    if (r->greedy)
        return sd_argmax(row, e->V);
    float *q = r->q + (size_t)j * e->V;
    sd_sampling_probs(row, e->V, &r->samp, q);
    uint64_t pos = (uint64_t)(r->n_tok - r->n_prompt + j);
    r->has_q = 1;
    return sd_sample(q, e->V, sd_rand_uniform(r->samp.seed, pos, SD_RNG_DRAFT));
}

/* ------------------------------------------------------------------ init */

/* where pd_drafts' tail starts: a verify step's tokens, then its gather
 * indices (draft ahead) */
static size_t vtok_base(const sd_engine *e) { return SD_MAX_K * (size_t)e->ov_max_seqs; }

int sd__spec_init(sd_engine *e, const sd_opts *o, sd_err *err)
{
    sd_adaptive_init(&e->adapt, e->k_max);
    e->adapt.margin = o->spec_margin;
    if (e->spec == SD_SPEC_NONE)
        return 0;
    const sd_ops *op = e->be->ops;
    size_t T = (size_t)e->max_tokens;
    /* tok, pos, seq, slot, hrows, rows of a pass (6 T), the chain's rows (T) */
    e->pd_meta = op->alloc(e->be, 7 * T * 4);
    e->ph_meta = sd__host_buf(e, 6 * T * 4);
    e->pd_logits = op->alloc(e->be, (size_t)e->ov_max_seqs * (size_t)e->V * 4);
    e->pd_hid_in = op->alloc(e->be, T * (size_t)e->D * 4);
    e->pd_hid_out = op->alloc(e->be, T * (size_t)e->D * 4);
    e->pd_hid_prev = op->alloc(e->be, (size_t)e->ov_max_seqs * (size_t)e->D * 4);
    e->ph_logits = sd__host_buf(e, (size_t)e->ov_max_seqs * (size_t)e->V * 4);
    e->ph_i32 = malloc(T * 4 * 6);
    /* the device draft chain: k drafts per chain row, pass metadata */
    size_t ov = (size_t)e->ov_max_seqs;
    /* the drafts, then (draft ahead) a verify step's tokens and the
     * indices that gather its rows from both (sd__drafts_gather) */
    e->pd_drafts = op->alloc(e->be, (vtok_base(e) + 2 * T) * 4);
    e->ph_vtok = sd__host_buf(e, 2 * T * 4);
    e->pd_am = op->alloc(e->be, ov * 4);
    e->pd_chain = op->alloc(e->be, (3 * (SD_MAX_K - 1) + 2) * ov * 4);
    e->ph_chain = sd__host_buf(e, (3 * (SD_MAX_K - 1) + 2) * ov * 4);
    e->ph_drafts = sd__host_buf(e, SD_MAX_K * ov * 4);
    if (!e->pd_drafts || !e->pd_am || !e->pd_chain || !e->ph_chain || !e->ph_drafts || !e->ph_vtok)
        return sd_err_set(err, SD_ENOMEM, "speculation: out of memory for the draft chain");
    /* sampled drafts on the device: their distributions stay there for the
     * verification (accept_sample_rows), which the backend must have */
    if (e->spec != SD_SPEC_NGRAM && e->k_max > 0 && op->sample_rows && op->accept_sample_rows &&
        op->gather_rows) {
        size_t kq = (size_t)e->k_max;
        e->pd_qdraft = op->alloc(e->be, kq * ov * (size_t)e->V * 4);
        e->pd_dsp = op->alloc(e->be, kq * ov * sizeof(sd_sample_params));
        e->ph_dsp = sd__host_buf(e, kq * ov * sizeof(sd_sample_params));
        if (e->ph_dsp)
            memset(e->ph_dsp, 0, kq * ov * sizeof(sd_sample_params));
        e->d_qidx = op->alloc(e->be, kq * ov * 4);
        e->h_qidx = malloc(kq * ov * 4);
        if (!e->pd_qdraft || !e->pd_dsp || !e->ph_dsp || !e->d_qidx || !e->h_qidx)
            return sd_err_set(err, SD_ENOMEM, "speculation: out of memory for sampled drafts");
    }
    if (!e->pd_meta || !e->ph_meta || !e->pd_logits || !e->pd_hid_in || !e->pd_hid_out || !e->pd_hid_prev || !e->ph_logits ||
        !e->ph_i32)
        return sd_err_set(err, SD_ENOMEM, "speculation: out of memory for the draft buffers");
    if (e->spec == SD_SPEC_NGRAM) {
        e->ngram_n = o->ngram_n;
        return 0;
    }
    if (e->spec == SD_SPEC_DRAFT) {
        if (!o->draft_model || !o->draft_model[0])
            return sd_err_set(err, SD_EINVAL, "--spec draft needs --draft-model DIR");
        /* a draft LM is small: every rank holds all of it */
        sd_model_opts mo = {.max_tokens = e->max_tokens, .load_mtp = 0,
                            .fp8_keep = sd_opts_fp8_keep(o)};
        int rc = 0;
        for (int r = 0; r < e->n_ranks && !rc; r++)
            rc = sd_model_load(&e->drafts[r], o->draft_model,
                               e->tp ? sd__tp_rank_backend(e->tp, r) : e->be, &mo, err);
        e->draft = e->drafts[0];
        if (rc)
            return sd_err_prefix(err, "--draft-model: ");
        const sd_model_cfg *dc = sd_model_cfg_of(e->draft);
        if (dc->vocab_size != e->V)
            return sd_err_set(err, SD_EINVAL,
                              "--draft-model %s: vocab_size %d differs from the target's %d",
                              o->draft_model, dc->vocab_size, e->V);
        sd_tokenizer *dt = NULL;
        if (!e->tok != !sd_tok_present(o->draft_model))
            return sd_err_set(err, SD_EINVAL,
                              "--draft-model %s: one of the target and the draft has a tokenizer "
                              "and the other has none",
                              o->draft_model);
        if (!e->tok)
            return 0;
        rc = sd_tok_load(&dt, o->draft_model, err);
        if (rc)
            return sd_err_prefix(err, "--draft-model tokenizer: ");
        int same = sd_tok_vocab_size(dt) == sd_tok_vocab_size(e->tok);
        for (int i = 0; same && i < sd_tok_vocab_size(dt); i++) {
            size_t la = 0, lb = 0;
            const char *a = sd_tok_token_str(dt, i, &la), *b = sd_tok_token_str(e->tok, i, &lb);
            same = (!a && !b) || (a && b && la == lb && memcmp(a, b, la) == 0);
        }
        sd_tok_free(dt);
        if (!same)
            return sd_err_set(err, SD_EINVAL,
                              "--draft-model %s: its tokenizer does not match the target's",
                              o->draft_model);
        return 0;
    }
    if (e->spec == SD_SPEC_EAGLE3) {
        if (!o->draft_model || !o->draft_model[0])
            return sd_err_set(err, SD_EINVAL, "--spec eagle3 needs --draft-model DIR (the head)");
        /* the head is small: every rank holds all of it */
        int rc = 0;
        for (int r = 0; r < e->n_ranks && !rc; r++)
            rc = sd_eagle3_load(&e->eagles[r], o->draft_model,
                                e->tp ? sd__tp_rank_backend(e->tp, r) : e->be, e->targets[r],
                                e->max_tokens, err);
        e->eagle = e->eagles[0];
        if (rc)
            return sd_err_prefix(err, "--draft-model: ");
        int ids[3];
        sd_eagle3_aux_layers(e->eagle, ids);
        for (int r = 0; r < e->n_ranks; r++)
            if ((rc = sd_model_set_aux_layers(e->targets[r], ids, 3, err)))
                return rc;
        int Vd = sd_eagle3_draft_vocab(e->eagle);
        e->pd_d2t = op->alloc(e->be, (size_t)Vd * 4);
        if (!e->pd_d2t || op->upload(e->be, e->pd_d2t, sd_eagle3_d2t(e->eagle), (size_t)Vd * 4))
            return sd_err_set(err, SD_ENOMEM, "EAGLE-3: out of memory");
        e->d_aux = op->alloc(e->be, T * 3 * (size_t)e->D * 4);
        e->pd_aux_in = op->alloc(e->be, T * 3 * (size_t)e->D * 4);
        e->ph_row = malloc((size_t)e->V * 4);
        if (!e->d_aux || !e->pd_aux_in || !e->ph_row)
            return sd_err_set(err, SD_ENOMEM, "EAGLE-3: out of memory");
        /* sampled drafts on the device: q over the draft vocabulary, then
         * spread over the target's for the verification */
        if (e->pd_qdraft && op->scatter_cols &&
            !(e->pd_qsmall = op->alloc(e->be, (size_t)e->ov_max_seqs * (size_t)Vd * 4)))
            return sd_err_set(err, SD_ENOMEM, "EAGLE-3: out of memory");
        return 0;
    }
    return 0; /* MTP: the target model holds the layer and its cache */
}

size_t sd__spec_kv_bytes_per_slot(const sd_engine *e)
{
    if (e->draft)
        return sd_model_kv_bytes_per_slot(e->draft);
    if (e->eagle)
        return sd_eagle3_kv_bytes_per_slot(e->eagle);
    return 0; /* MTP's cache is counted with the target's */
}

size_t sd__spec_buffer_bytes(const sd_engine *e)
{
    if (e->spec == SD_SPEC_NONE)
        return 0;
    size_t T = (size_t)e->max_tokens, D = (size_t)e->D;
    size_t b = T * 4 * 7 + (SD_MAX_K * 4 + 3 * (SD_MAX_K - 1) + 3) * (size_t)e->ov_max_seqs * 4 +
               (size_t)e->ov_max_seqs * (size_t)e->V * 4 + T * D * 4 * 2 +
               (size_t)e->ov_max_seqs * D * 4;
    if (e->spec != SD_SPEC_NGRAM) /* sampled device drafts: q, parameters, row map */
        b += (size_t)e->k_max * (size_t)e->ov_max_seqs *
             ((size_t)e->V * 4 + sizeof(sd_sample_params) + 4);
    if (e->eagle)
        b += 2 * T * 3 * D * 4 + sd_eagle3_workspace_bytes(e->eagle) +
             (size_t)e->ov_max_seqs * (size_t)sd_eagle3_draft_vocab(e->eagle) * 4;
    if (e->draft)
        b += sd_model_workspace_bytes(e->draft);
    return b;
}

int sd__spec_alloc_kv(sd_engine *e, int n_slots, sd_err *err)
{
    if (e->draft) {
        for (int r = 0; r < e->n_ranks; r++) {
            int rc = sd_model_alloc_kv(e->drafts[r], n_slots, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (e->eagle) {
        for (int r = 0; r < e->n_ranks; r++) {
            int rc = sd_eagle3_alloc_kv(e->eagles[r], n_slots, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    return 0;
}

void sd__spec_free(sd_engine *e)
{
    if (!e->be)
        return;
    void *dev[] = {e->pd_meta,    e->pd_logits, e->pd_hid_in, e->pd_hid_out, e->pd_hid_prev,
                   e->pd_drafts, e->pd_am,     e->pd_chain,  e->pd_d2t,    e->pd_qdraft,
                   e->pd_dsp,    e->d_qidx,    e->pd_qsmall};
    for (size_t i = 0; i < SD_ARRAY_LEN(dev); i++)
        if (dev[i])
            e->be->ops->free(e->be, dev[i]);
    if (e->pd_aux_in)
        e->be->ops->free(e->be, e->pd_aux_in);
    sd__host_buf_free(e, e->ph_logits);
    sd__host_buf_free(e, e->ph_meta);
    sd__host_buf_free(e, e->ph_chain);
    sd__host_buf_free(e, e->ph_drafts);
    sd__host_buf_free(e, e->ph_vtok);
    sd__host_buf_free(e, e->ph_dsp);
    free(e->h_qidx);
    free(e->ph_i32);
    free(e->ph_row);
    for (int r = 0; r < SD_TP_MAX; r++)
        sd_model_free(e->drafts[r]);
    e->draft = NULL;
    for (int r = 0; r < SD_TP_MAX; r++)
        sd_eagle3_free(e->eagles[r]);
    e->eagle = NULL;
}

int sd__spec_wants_hidden(const sd_engine *e)
{
    return e->spec == SD_SPEC_MTP ? 1 : e->spec == SD_SPEC_EAGLE3 ? 2 : 0;
}

/* ------------------------------------------------------------------ model steps */

typedef struct prow {
    int T, n_out;
    int32_t *tok, *pos, *seq, *slot, *rows, *hrows;
    req *out_req[4096];
} prow;

static void prow_init(sd_engine *e, prow *b)
{
    size_t T = (size_t)e->max_tokens;
    b->T = b->n_out = 0;
    b->tok = e->ph_i32;
    b->pos = b->tok + T;
    b->seq = b->pos + T;
    b->slot = b->seq + T;
    b->rows = b->slot + T;
    b->hrows = b->rows + T;
}

/* Runs one proposer forward over the rows in b (sequence table: the step's).
 * mtp: MTP layer with input hidden rows gathered from hid_src by b->hrows.
 * Logits of the out rows land in e->ph_logits. */
enum { PROP_DRAFT_LM = 0, PROP_MTP = 1, PROP_EAGLE_FIRST = 2, PROP_EAGLE_CHAIN = 3 };

/* the catch-up pass's kind and the hidden-state rows it gathers from; the
 * kind of the passes that draft after it (the chain) */
static int first_mode(const sd_engine *e)
{
    return e->spec == SD_SPEC_EAGLE3 ? PROP_EAGLE_FIRST
           : e->spec == SD_SPEC_MTP  ? PROP_MTP
                                     : PROP_DRAFT_LM;
}
static const float *first_src(const sd_engine *e)
{
    return e->spec == SD_SPEC_EAGLE3 ? e->d_aux : e->d_hidden;
}
static int chain_mode(const sd_engine *e)
{
    return e->spec == SD_SPEC_EAGLE3 ? PROP_EAGLE_CHAIN : first_mode(e);
}

/* One proposer pass over uploaded rows: gathers the input hidden states and
 * runs the layer (MTP), the head (EAGLE-3) or the draft LM. */
static int prop_pass(sd_engine *e, int mode, const float *hid_src, sd_fwd *f, const int32_t *hrows,
                     sd_err *err)
{
    const sd_ops *op = e->be->ops;
    if (mode == PROP_MTP || mode == PROP_EAGLE_FIRST || mode == PROP_EAGLE_CHAIN) {
        float *in = e->pd_hid_in;
        int width = e->D;
        if (mode == PROP_EAGLE_FIRST) {
            width = 3 * e->D;
            in = e->pd_aux_in;
        }
        op->gather_rows(e->be, in, hid_src, hrows, f->ab.n_tokens, width, width, width);
        f->in_hidden = in;
        f->out_hidden = e->pd_hid_out;
    }
    return sd__fwd(e,
                   mode == PROP_MTP        ? SD_FWD_MTP
                   : mode == PROP_DRAFT_LM ? SD_FWD_DRAFT
                   : mode == PROP_EAGLE_FIRST ? SD_FWD_EAGLE_FIRST
                                              : SD_FWD_EAGLE_CHAIN,
                   f, err);
}

/* Runs fn eagerly, or through g: the first time a graph's key is seen the
 * work runs eagerly (making GEMM plans outside any capture), the second time
 * it is captured, then replayed. */
struct capture_ctx {
    int (*fn)(sd_engine *, void *, sd_err *);
    void *ctx;
    void **graph;
};

/* in each rank's context: fn captured into the rank's graph */
static int capture_cb(sd_engine *e, void *ctx, sd_err *err)
{
    struct capture_ctx *c = ctx;
    int rc = e->be->ops->graph_begin(e->be);
    if (rc)
        return rc;
    int fr = c->fn(e, c->ctx, err);
    rc = e->be->ops->graph_end(e->be, c->graph);
    return fr ? fr : rc;
}

static int pgraph_run(sd_engine *e, sd_pgraph *g, int (*fn)(sd_engine *, void *, sd_err *),
                      void *ctx, sd_err *err)
{
    const sd_ops *op = e->be->ops;
    sd_comm *comm = e->tp ? sd__tp_comm(e->tp) : NULL;
    if (g && !g->graph)
        e->prop_oneoff++; /* the shape's first run, or its capture */
    if (g && !g->graph && g->seen) {
        /* the collectives of the capture run at each replay, not now */
        struct capture_ctx cx = {fn, ctx, &g->graph};
        sd_comm_record_begin(comm);
        int rc = sd__engine_each(e, capture_cb, &cx, err);
        if (sd_comm_record_end(comm, g->graph))
            sd_log_warn("cuda graphs: no memory to count a proposer pass's collectives");
        if (rc)
            return rc;
    }
    if (g && g->graph) {
        int rc = op->graph_launch(e->be, g->graph);
        if (!rc)
            sd_comm_replayed(comm, g->graph); /* its collectives ran */
        return rc;
    }
    if (g)
        g->seen = 1;
    e->prop_eager++;
    return fn(e, ctx, err);
}

struct prop_ctx {
    int mode;
    const float *hid_src;
    sd_fwd *f;
    const int32_t *hrows;
};

static int prop_cb(sd_engine *e, void *ctx, sd_err *err)
{
    struct prop_ctx *c = ctx;
    return prop_pass(e, c->mode, c->hid_src, c->f, c->hrows, err);
}

/* Runs one proposer pass over the rows in b (sequence table: the step's),
 * padded and replayed from a graph like the target's steps (graphs.c).
 * mtp: MTP layer with input hidden rows gathered from hid_src by b->hrows.
 * Logits of the out rows land in e->ph_logits. tables: the step whose
 * block-table rows go up with the pass's inputs (NULL: none; one launch
 * where the backend makes copies one). T_min: rows it is padded to at
 * least where a graph takes them and that is at most twice its own
 * bucket (fewer shapes, fewer captures). */
static int run_prop(sd_engine *e, prow *b, int mode, const float *hid_src, int download,
                    const step *tables, int T_min, sd_err *err)
{
    const sd_ops *op = e->be->ops;
    sd_backend *be = e->be;
    int n_out = b->n_out;
    int Tp = sd__graph_bucket(e, b->T), Np = n_out ? sd__graph_bucket(e, n_out) : 0, Tm;
    if (Tp && T_min > Tp && T_min <= 2 * Tp && (Tm = sd__graph_bucket(e, T_min)))
        Tp = Tm; /* at most twice the rows' work */
    if ((n_out && !Np) || Np > e->ov_max_seqs || Np > Tp)
        Tp = Np = 0;
    int T = Tp ? Tp : b->T, N = Tp ? Np : n_out;
    int32_t *h = e->ph_meta, *d = e->pd_meta;
    const int32_t *cols[5] = {b->tok, b->pos, b->seq, b->slot, b->hrows};
    int maxp;
    size_t words = sd__pack_step(e, h, T, b->T, cols, 5, b->rows, n_out, N, &maxp);
    sd_fwd f = {.ab = {.n_tokens = T, .pos = d + T, .seq = d + 2 * T, .slot = d + 3 * T,
                       .block_table = e->d_table, .max_blocks = e->max_blocks,
                       .block_size = e->block_size, .max_pos = maxp},
                .tokens = d, .n_out = N, .out_rows = d + 5 * T,
                .logits = N ? e->pd_logits : NULL};
    sd_copy cp[2] = {{.dst = d, .src = h, .width = words * 4, .rows = 1, .dpitch = words * 4,
                      .spitch = words * 4}};
    if (tables) {
        cp[1] = cp[0];
        cp[0] = sd__engine_tables_copy(e, tables);
    }
    int rc = sd__engine_put_host(e, cp, tables ? 2 : 1);
    sd_pgraph *g = !rc && Tp ? sd__pgraph_find(e, mode, hid_src, T, N) : NULL;
    struct prop_ctx cx = {mode, hid_src, &f, d + 4 * T};
    if (!rc)
        rc = pgraph_run(e, g, prop_cb, &cx, err);
    int V = mode == PROP_EAGLE_FIRST || mode == PROP_EAGLE_CHAIN ? sd_eagle3_draft_vocab(e->eagle)
                                                                  : e->V;
    if (!download)
        return rc;
    if (!rc)
        rc = op->sync(be);
    if (!rc && n_out)
        rc = op->download(be, e->ph_logits, e->pd_logits, (size_t)n_out * (size_t)V * 4);
    return rc;
}

static void add_prow(sd_engine *e, prow *b, const req *r, int32_t tok, int pos, int seq_index,
                     int hrow)
{
    b->tok[b->T] = tok;
    b->pos[b->T] = pos;
    b->seq[b->T] = seq_index;
    b->slot[b->T] = sd_kv_seq_slot(e->kv, &r->kv, pos);
    b->hrows[b->T] = hrow;
    b->T++;
}

/* the block table rows of the step are still in e->d_table: sequence index i of
 * the step is s->seqs[i] */
static int seq_index(const step *s, const req *r)
{
    for (int i = 0; i < s->n_seq; i++)
        if (s->seqs[i] == r)
            return i;
    return -1;
}

/* Reserves KV for the chain and the verify of k drafts; returns the k this
 * request gets. */
static int reserve_k(sd_engine *e, req *r, int k)
{
    int left = r->max_tokens - (r->n_tok - r->n_prompt);
    if (k > left - 1)
        k = left - 1;
    if (r->n_tok + k > e->max_ctx)
        k = e->max_ctx - r->n_tok;
    if (k <= 0)
        return 0;
    if (sd_kv_seq_reserve(e->kv, &r->kv, r->n_tok + k) != 0)
        return 0;
    return k;
}

/* ---- the draft chain on the device ----
 * When every drafting request is greedy, a draft token is the argmax of its
 * logits row (through d2t for EAGLE-3), which the backend computes where the
 * logits are: draft j's tokens are written straight into the token input of
 * chain pass j + 1. Positions and slots of every pass are known in advance
 * (drafts extend each sequence by one position a pass), so they go up in one
 * copy; the k - 1 passes run as one graph, and the host downloads the k
 * drafts of every request once. A request whose k is smaller than the
 * step's becomes a padding row (the trash block) for the passes past it.
 * Sampled drafts (MTP, draft LM) run the same chain with sample_rows in
 * place of the argmax: each row samples its request's draft distribution q
 * (temperature / top-k / top-p, the request's draft stream, the draft's
 * output position), and q stays on the device (pd_qdraft, pass-major) until
 * the next step's verification gathers it into d_q for accept_sample_rows;
 * a step that verifies on the host downloads it then. EAGLE-3 samples over
 * its reduced vocabulary and scatters q over the target's (scatter_cols).
 * Synthetic acceptance (host verification) and backends without these ops
 * take the per-pass host path above. */
static int all_greedy(const prow *b)
{
    for (int j = 0; j < b->n_out; j++)
        if (!b->out_req[j]->greedy)
            return 0;
    return 1;
}

/* sampled drafts stay on the device: sample_rows where the logits are, q
 * kept there for the device verification (not with a reduced EAGLE-3
 * vocabulary yet, nor with synthetic acceptance, which verifies on the
 * host) */
static int device_samples(const sd_engine *e)
{
    return e->pd_qdraft && (!e->eagle || e->pd_qsmall) && e->synth.n == 0;
}

static int on_device(const sd_engine *e, const prow *b)
{
    if (!e->pd_drafts || !e->be->ops->argmax_rows || !e->be->ops->gather_i32 || b->n_out == 0 ||
        b->n_out > e->ov_max_seqs)
        return 0;
    return all_greedy(b) || device_samples(e);
}

struct chain_ctx {
    int mode, Tc, k;
    int sampled; /* draft j = sample_rows with pd_dsp's pass-j rows, q into pd_qdraft */
    const int32_t *meta; /* device: (k - 1) x [pos, seq, slot] x Tc, rows (Tc), prev rows (Tc) */
};

/* argmax of n logits rows (width Vl) into out, mapped through d2t for EAGLE-3 */
static void draft_argmax(sd_engine *e, int32_t *out, int n)
{
    const sd_ops *op = e->be->ops;
    if (e->eagle) {
        op->argmax_rows(e->be, e->pd_am, e->pd_logits, n, sd_eagle3_draft_vocab(e->eagle));
        op->gather_i32(e->be, out, e->pd_d2t, e->pd_am, n);
    } else {
        op->argmax_rows(e->be, out, e->pd_logits, n, e->V);
    }
}

/* Draft j of n chain rows from pd_logits: the argmax, or (sampled) a sample
 * of each row's draft distribution, which stays in pd_qdraft's pass-j rows. */
static void draft_pick(sd_engine *e, int32_t *out, int n, int j, int sampled)
{
    if (!sampled) {
        draft_argmax(e, out, n);
        return;
    }
    const sd_ops *op = e->be->ops;
    size_t ov = (size_t)e->ov_max_seqs;
    float *q = e->pd_qdraft + (size_t)j * ov * (size_t)e->V;
    if (e->eagle) {
        /* sampled over the draft vocabulary (its q in the draft ids' order),
         * the token and q mapped to the target's ids through d2t */
        int Vd = sd_eagle3_draft_vocab(e->eagle);
        op->sample_rows(e->be, e->pd_am, e->pd_qsmall, e->pd_logits, e->pd_dsp + (size_t)j * ov, n,
                        Vd);
        op->gather_i32(e->be, out, e->pd_d2t, e->pd_am, n);
        op->scatter_cols(e->be, q, e->pd_qsmall, e->pd_d2t, n, Vd, e->V);
        return;
    }
    op->sample_rows(e->be, out, q, e->pd_logits, e->pd_dsp + (size_t)j * ov, n, e->V);
}

static int chain_cb(sd_engine *e, void *ctx, sd_err *err)
{
    struct chain_ctx *c = ctx;
    const sd_ops *op = e->be->ops;
    int Tc = c->Tc, D = e->D;
    const int32_t *rows = c->meta + 3 * (size_t)Tc * (size_t)(c->k - 1), *prev = rows + Tc;
    float *hb[2] = {e->pd_hid_prev, e->pd_hid_out};
    if (c->mode != PROP_DRAFT_LM)
        op->gather_rows(e->be, hb[0], e->pd_hid_out, prev, Tc, D, D, D);
    for (int j = 1; j < c->k; j++) {
        const int32_t *m = c->meta + 3 * (size_t)Tc * (size_t)(j - 1);
        sd_fwd f = {.ab = {.n_tokens = Tc, .pos = m, .seq = m + Tc, .slot = m + 2 * Tc,
                           .block_table = e->d_table, .max_blocks = e->max_blocks,
                           .block_size = e->block_size, .max_pos = e->max_ctx + SD_MAX_K},
                    .tokens = e->pd_drafts + (size_t)(j - 1) * Tc, .n_out = Tc, .out_rows = rows,
                    .logits = e->pd_logits, .in_hidden = hb[(j - 1) % 2],
                    .out_hidden = hb[j % 2]};
        int rc = sd__fwd(e,
                         c->mode == PROP_MTP        ? SD_FWD_MTP
                         : c->mode == PROP_DRAFT_LM ? SD_FWD_DRAFT
                                                    : SD_FWD_EAGLE_CHAIN,
                         &f, err);
        if (rc)
            return rc;
        draft_pick(e, e->pd_drafts + (size_t)j * Tc, Tc, j, c->sampled);
    }
    return 0;
}

/* the graph of the device chain of kc - 1 passes of this mode over Tc rows
 * (sampled: with the device's draft sampling) */
static sd_pgraph *chain_graph(sd_engine *e, int mode, int sampled, int Tc, int kc)
{
    return sd__pgraph_find(e, (sampled ? 32 : 16) + mode, NULL, Tc, kc);
}

/* The chain's inputs in h for kc - 1 passes over Tc rows, all padding:
 * pass j's positions, sequences and slots (3 Tc words from 3 Tc (j - 1)),
 * then the rows each pass reads (row m: m) and the rows they follow (0).
 * Returns the bytes. */
static size_t chain_pad(const sd_engine *e, int32_t *h, int Tc, int kc)
{
    for (int j = 1; j < kc; j++) {
        int32_t *pos = h + 3 * (size_t)Tc * (size_t)(j - 1);
        sd__pad_rows(e, NULL, pos, pos + Tc, pos + 2 * Tc, 0, Tc);
    }
    int32_t *rows = h + 3 * (size_t)Tc * (size_t)(kc - 1), *prev = rows + Tc;
    for (int m = 0; m < Tc; m++) {
        rows[m] = m;
        prev[m] = 0;
    }
    return (3 * (size_t)Tc * (size_t)(kc - 1) + 2 * (size_t)Tc) * 4;
}

/* r's drafts from their host copy (chain row q_row of Tc rows) */
void sd__drafts_to_host(sd_engine *e, req *r, int Tc)
{
    for (int j = 0; j < r->n_draft; j++)
        r->draft[j] = e->ph_drafts[(size_t)j * (size_t)Tc + (size_t)r->q_row];
    r->draft_dev = 0;
}

/* Draft ahead: the verify step of the T rows packed in e->h_tok takes its
 * requests' drafts where the chain wrote them. Fills e->ph_vtok with the
 * rows' tokens, then each row's index into pd_drafts (a draft's, or its
 * token's in the copy of the first half at pd_drafts' tail), and gives
 * that copy; sd__drafts_gather runs after it. */
sd_copy sd__drafts_gather_copy(sd_engine *e, const step *s, int T)
{
    const size_t base = vtok_base(e);
    int32_t *tok = e->ph_vtok, *idx = tok + T;
    memcpy(tok, e->h_tok, (size_t)T * sizeof(int32_t));
    for (int i = 0; i < T; i++)
        idx[i] = (int32_t)(base + (size_t)i);
    for (int i = 0; i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (r->state != RQ_DECODE || !r->draft_dev)
            continue;
        for (int j = 0; j < r->n_draft; j++)
            idx[r->row0 + 1 + j] = j * e->drafts_tc + r->q_row;
    }
    const size_t bytes = 2 * (size_t)T * sizeof(int32_t);
    return (sd_copy){.dst = e->pd_drafts + base, .src = tok, .width = bytes, .rows = 1,
                     .dpitch = bytes, .spitch = bytes};
}

/* tokens (T) := pd_drafts[idx] (sd_ops.gather_i32), after that copy is made */
void sd__drafts_gather(sd_engine *e, int32_t *tokens, int T)
{
    const int32_t *idx = e->pd_drafts + vtok_base(e) + T;
    e->be->ops->gather_i32(e->be, tokens, e->pd_drafts, idx, T);
}

static int device_chain(sd_engine *e, step *s, const prow *b, const int *kr, int k, sd_err *err)
{
    const sd_ops *op = e->be->ops;
    int mtp = e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3;
    int mode = chain_mode(e);
    int n = b->n_out;
    int Tc = sd__graph_bucket(e, n);
    if (!Tc || Tc > e->ov_max_seqs)
        Tc = n;
    int kc = 1;
    for (int m = 0; m < n; m++) {
        int si = seq_index(s, b->out_req[m]);
        if (si >= 0 && kr[si] > kc)
            kc = kr[si];
    }
    int sampled = !all_greedy(b);
    if (sampled) {
        /* row m of pass j: request m's sampling, its draft stream, the output
         * position of draft j; padding rows greedy */
        size_t ov = (size_t)e->ov_max_seqs;
        for (int j = 0; j < kc; j++)
            for (int m = 0; m < Tc; m++) {
                const req *r = m < n ? b->out_req[m] : NULL;
                e->ph_dsp[(size_t)j * ov + m] =
                    r ? (sd_sample_params){.temperature = r->greedy ? 0.0f : r->samp.temperature,
                                           .top_p = r->samp.top_p, .top_k = r->samp.top_k,
                                           .stream = SD_RNG_DRAFT, .seed = r->samp.seed,
                                           .counter = (uint64_t)(r->n_tok - r->n_prompt + j)}
                      : (sd_sample_params){.temperature = 0.0f, .top_p = 1.0f};
            }
    }
    /* the chain's inputs: pass j's positions, sequences and slots, then the
     * rows it reads and writes (one launch with the sampling parameters
     * where the backend makes copies one) */
    sd_copy cp[2];
    int ncp = 0;
    if (sampled) {
        const size_t w = (size_t)Tc * sizeof(sd_sample_params),
                     pitch = (size_t)e->ov_max_seqs * sizeof(sd_sample_params);
        cp[ncp++] = (sd_copy){.dst = e->pd_dsp, .src = e->ph_dsp, .width = w, .rows = (size_t)kc,
                              .dpitch = pitch, .spitch = pitch};
    }
    if (kc > 1) {
        int32_t *h = e->ph_chain;
        const size_t bytes = chain_pad(e, h, Tc, kc);
        for (int j = 1; j < kc; j++) {
            int32_t *pos = h + 3 * (size_t)Tc * (size_t)(j - 1), *seq = pos + Tc, *slot = seq + Tc;
            for (int m = 0; m < n; m++) {
                const req *r = b->out_req[m];
                int si = seq_index(s, r);
                if (si < 0 || kr[si] <= j)
                    continue;
                pos[m] = (mtp ? r->n_comp - 1 : r->n_tok - 1) + j;
                seq[m] = si;
                slot[m] = sd_kv_seq_slot(e->kv, &r->kv, pos[m]);
            }
        }
        int32_t *prev = h + 3 * (size_t)Tc * (size_t)(kc - 1) + Tc;
        for (int m = 0; m < n; m++)
            prev[m] = b->rows[m];
        cp[ncp++] = (sd_copy){.dst = e->pd_chain, .src = h, .width = bytes, .rows = 1,
                              .dpitch = bytes, .spitch = bytes};
    }
    int rc = ncp ? sd__engine_put_host(e, cp, ncp) : 0;
    /* first drafts: the extend pass's logits rows are the chain's rows */
    if (!rc)
        draft_pick(e, e->pd_drafts, n, 0, sampled);
    if (kc > 1) {
        struct chain_ctx cx = {mode, Tc, kc, sampled, e->pd_chain};
        sd_pgraph *g = NULL;
        if (!rc && e->pad_steps && sd__graph_bucket(e, n) == Tc)
            g = chain_graph(e, mode, sampled, Tc, kc);
        if (!rc)
            rc = pgraph_run(e, g, chain_cb, &cx, err);
    }
    /* the drafts come down queued behind the chain: the wait for it brings
     * them (a sync and then a download took two round trips); mark 0 is
     * free where no target step is queued ahead (none is while requests
     * draft) */
    const size_t db = (size_t)kc * (size_t)Tc * 4;
    /* draft ahead: the host does not wait for the drafts; the verify step
     * takes them where they are (sd__drafts_gather; a sampled step's device
     * verification from its gathered tokens) and their copy comes down
     * queued behind the chain, read with the verify's tokens
     * (sd__drafts_to_host); a step that cannot take them there waits
     * for them (drafts_now) */
    const int queue = op->download_async && op->download_wait && !e->ahead_live;
    const int ahead = queue && e->draft_ahead && !e->draft_sync;
    if (!rc && queue) {
        rc = op->download_async(e->be, e->ph_drafts, e->pd_drafts, db, 0);
        if (!rc && !ahead)
            rc = op->download_wait(e->be, 0);
        e->drafts_tc = Tc;
    } else if (!rc) {
        rc = op->sync(e->be);
        if (!rc)
            rc = op->download(e->be, e->ph_drafts, e->pd_drafts, db);
    }
    if (rc)
        return rc;
    for (int m = 0; m < n; m++) {
        req *r = b->out_req[m];
        int si = seq_index(s, r);
        int kk = si >= 0 ? kr[si] : 1;
        r->has_q = sampled && !r->greedy ? 2 : 0; /* q in pd_qdraft's rows of chain row m */
        r->q_row = m;
        r->n_draft = kk;
        r->draft_dev = ahead;
        if (!ahead)
            sd__drafts_to_host(e, r, Tc);
        /* a draft LM's cache now holds the chain's positions up to the last input */
        if (!mtp && kk > 1)
            r->draft_valid = r->n_tok - 1 + kk;
    }
    return 0;
}

/* The proposer's graphs at start, as the target's are (graphs.c): for each
 * bucket b of drafting requests up to graph_bs, the catch-up pass of b
 * requests catching up r = 1..k_max + 1 rows each (the rows run_prop pads
 * such a pass to: b r in its bucket), then the device chain of kc =
 * 2..k_max draft passes over b rows, greedy and, where the device samples
 * drafts, sampled. Each shape runs on padding rows (the trash block) once
 * eagerly, making its GEMM plans, then is captured and replayed. A fresh
 * engine's first drafting steps no longer run them eagerly and capture
 * them one by one (on an H200 those one-offs made a fresh engine's first
 * batch at 32 requests 0.87-0.98x plain: bench/results/NOTES.md, session
 * 22). At most three quarters of the graph table is filled here; the rest
 * takes the shapes that come while serving. Without graphs, where steps
 * are padded all the same (sd_opts.debug_pad_steps, the CPU's tests), each
 * shape runs once, eagerly: the padding rows' passes are what is tested. */
int sd__spec_capture(sd_engine *e, sd_err *err)
{
    if (!e->pad_steps || e->k_max < 1 ||
        (e->spec != SD_SPEC_MTP && e->spec != SD_SPEC_EAGLE3 && e->spec != SD_SPEC_DRAFT))
        return 0;
    const sd_ops *op = e->be->ops;
    const int first = first_mode(e), cmode = chain_mode(e);
    const float *src = first_src(e);
    const int sampled_too = device_samples(e);
    const int cap = SD_MAX_PGRAPHS * 3 / 4, n0 = e->n_pgraphs;
    const size_t ov = (size_t)e->ov_max_seqs;
    size_t free0 = 0, free1 = 0, total = 0;
    if (op->mem_info)
        op->mem_info(e->be, &free0, &total);
    uint64_t t0 = sd_now_ns();
    int rc = 0, full = 0;
    for (int i = 0; i < e->n_buckets && !rc && !full; i++) {
        const int b = e->buckets[i];
        if (b > e->graph_bs || b > e->ov_max_seqs)
            break;
        /* the catch-up pass: b logits rows of b r rows, all padding */
        for (int r = 1; r <= e->k_max + 1 && !rc; r++) {
            const int Tp = sd__graph_bucket(e, b * r);
            if (!Tp || (r > 1 && Tp == sd__graph_bucket(e, b * (r - 1))))
                continue;
            if (e->n_pgraphs >= cap) {
                full = 1;
                break;
            }
            prow p;
            prow_init(e, &p);
            p.T = Tp;
            p.n_out = b;
            sd__pad_rows(e, p.tok, p.pos, p.seq, p.slot, 0, Tp);
            for (int j = 0; j < Tp; j++) {
                p.hrows[j] = 0;
                p.rows[j] = j;
            }
            /* each pass synced: the next one's inputs are packed into the
             * same page-locked buffer its copies kernel reads when it runs */
            for (int n = 0; n < 1 + e->graphs_on && !rc; n++)
                if (!(rc = run_prop(e, &p, first, src, 0, NULL, 0, err)))
                    rc = op->sync(e->be);
        }
        /* the chain: kc - 1 passes over b rows */
        for (int kc = 2; kc <= e->k_max && !rc && !full; kc++) {
            rc = op->upload(e->be, e->pd_chain, e->ph_chain, chain_pad(e, e->ph_chain, b, kc));
            for (int sampled = 0; sampled <= sampled_too && !rc; sampled++) {
                if (e->n_pgraphs >= cap) {
                    full = 1;
                    break;
                }
                if (sampled) {
                    for (size_t j = 0; j < (size_t)kc * ov; j++)
                        e->ph_dsp[j] = (sd_sample_params){.temperature = 0.0f, .top_p = 1.0f};
                    rc = op->upload(e->be, e->pd_dsp, e->ph_dsp,
                                    (size_t)kc * ov * sizeof(sd_sample_params));
                }
                struct chain_ctx cx = {cmode, b, kc, sampled, e->pd_chain};
                sd_pgraph *g = chain_graph(e, cmode, sampled, b, kc);
                for (int n = 0; n < 1 + e->graphs_on && !rc; n++)
                    if (!(rc = pgraph_run(e, g, chain_cb, &cx, err)))
                        rc = op->sync(e->be); /* (ph_chain and ph_dsp, as above) */
            }
        }
    }
    /* the catch-up passes over prompts larger than the largest bucket: one
     * eager pass at each of the target's warm-up sizes, so their GEMMs'
     * timed trials run now (the draft LM and the EAGLE-3 head have shapes
     * of their own; left to the first prompts, a burst of 64 of them waited
     * 78-94 ms for their first token where plain decode's took 18 on the
     * bundled model on an H200; NOTES.md, session 31) */
    int sizes[32], n_sizes = e->graphs_on ? sd__prompt_sizes(e, sizes, 32) : 0;
    for (int i = 0; i < n_sizes && !rc; i++) {
        prow p;
        prow_init(e, &p);
        p.T = sizes[i];
        p.n_out = 1;
        sd__pad_rows(e, p.tok, p.pos, p.seq, p.slot, 0, p.T);
        memset(p.hrows, 0, (size_t)p.T * sizeof *p.hrows);
        p.rows[0] = p.T - 1; /* its one logits row */
        if (!(rc = run_prop(e, &p, first, src, 0, NULL, 0, err)))
            rc = op->sync(e->be);
    }
    if (!rc)
        rc = op->sync(e->be); /* an upload queued before the table filled */
    if (rc)
        return err->msg[0] ? rc : sd_err_set(err, rc, "capturing the proposer's CUDA graphs failed");
    if (op->mem_info)
        op->mem_info(e->be, &free1, &total);
    if (e->graphs_on)
        sd_log_info("cuda graphs: %d proposer pass shapes captured (and %d prompt sizes run) in "
                    "%.2f s, %.1f MiB%s",
                    e->n_pgraphs - n0, n_sizes, (double)(sd_now_ns() - t0) * 1e-9,
                    free0 > free1 ? (double)(free0 - free1) / (1 << 20) : 0.0,
                    full ? " (the rest when they come: the table is three quarters full)" : "");
    /* the counts are of serving's passes */
    e->prop_eager = e->prop_oneoff = 0;
    return 0;
}

static int model_spec_step(sd_engine *e, step *s, int k, sd_err *err)
{
    /* MTP and EAGLE-3 take shifted tokens and target hidden states */
    int mtp = e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3;
    int eagle = e->spec == SD_SPEC_EAGLE3;
    int Vl = eagle ? sd_eagle3_draft_vocab(e->eagle) : e->V;
    prow b;
    prow_init(e, &b);
    int kr[4096], r_max = 0;
    /* extend */
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        kr[i] = 0;
        if (r->state == RQ_DONE || r->no_spec)
            continue;
        int lo = r->draft_valid;
        int hi = mtp ? r->n_comp - 1 : (r->state == RQ_DECODE ? r->n_tok - 1 : r->n_comp - 1);
        int p0 = e->h_pos[r->row0];
        if (mtp && lo < p0) {
            /* the MTP cache lost track (after a failed step): no drafts for it */
            continue;
        }
        if (r->state == RQ_DECODE && (!mtp || hi >= lo))
            kr[i] = reserve_k(e, r, k);
        /* a draft LM also reads the last token, whose KV the target writes only
         * next step: it needs that position reserved (never by preempting) */
        if (!mtp && kr[i] == 0 && hi >= r->n_comp &&
            sd_kv_seq_reserve(e->kv, &r->kv, hi + 1) != 0)
            hi = r->n_comp - 1;
        for (int p = lo; p <= hi; p++)
            add_prow(e, &b, r, mtp ? r->tok[p + 1] : r->tok[p], p, i, r->row0 + (p - p0));
        if (kr[i] > 0 && hi - lo + 1 > r_max)
            r_max = hi - lo + 1;
        if (hi >= lo)
            r->draft_valid = hi + 1;
        if (kr[i] > 0 && hi >= lo) {
            b.out_req[b.n_out] = r;
            b.rows[b.n_out++] = b.T - 1;
        } else {
            kr[i] = 0;
        }
    }
    if (b.T == 0)
        return 0;
    /* reserve_k may have grown block tables: they go up with the pass's
     * inputs. The pass is padded to its drafting requests' (bucket) times
     * the most rows one of them catches up: its row count follows how many
     * drafts each had accepted (at batch 32 drafting 1 it took 32..64 rows,
     * five graph shapes, each run eagerly once and captured once in a
     * fresh engine's first steps; padded, one or two) */
    int T_min = b.n_out ? sd__graph_bucket(e, b.n_out) * r_max : 0;
    int rc = run_prop(e, &b, first_mode(e), first_src(e), !on_device(e, &b), s, T_min, err);
    if (rc)
        return rc;
    if (on_device(e, &b))
        return device_chain(e, s, &b, kr, k, err);
    /* first drafts; keep each drafting request's last hidden for the chain */
    int n_chain = 0;
    int32_t prev_rows[4096];
    req *chain[4096];
    for (int j = 0; j < b.n_out; j++) {
        req *r = b.out_req[j];
        r->has_q = 0;
        r->draft[0] = draft_token(e, r, e->ph_logits + (size_t)j * Vl, 0);
        r->n_draft = 1;
        prev_rows[n_chain] = b.rows[j];
        chain[n_chain++] = r;
    }
    if (mtp && n_chain) {
        int32_t *d_prev = e->pd_meta + 6 * (size_t)e->max_tokens;
        e->be->ops->upload(e->be, d_prev, prev_rows, (size_t)n_chain * 4);
        e->be->ops->gather_rows(e->be, e->pd_hid_prev, e->pd_hid_out, d_prev, n_chain, e->D,
                                e->D, e->D);
    }
    /* chain */
    for (int j = 1; j < k; j++) {
        prow c;
        prow_init(e, &c);
        int idx[4096], n = 0;
        for (int i = 0; i < n_chain; i++) {
            req *r = chain[i];
            int si = seq_index(s, r);
            if (si < 0 || kr[si] <= j || r->n_draft != j)
                continue;
            int pos = mtp ? r->n_comp - 1 + j : r->n_tok - 1 + j;
            add_prow(e, &c, r, r->draft[j - 1], pos, si, i);
            c.out_req[c.n_out] = r;
            c.rows[c.n_out++] = c.T - 1;
            idx[n++] = i;
        }
        if (!n)
            break;
        rc = run_prop(e, &c, chain_mode(e),
                      e->pd_hid_prev, 1, NULL, 0, err);
        if (rc)
            return rc;
        if (mtp) {
            /* the new output hidden of chain member idx[m] goes to its prev row */
            for (int m = 0; m < n; m++)
                e->be->ops->copy2d(e->be, e->pd_hid_prev + (size_t)idx[m] * e->D,
                                   e->pd_hid_out + (size_t)m * e->D, 1, e->D, e->D, e->D);
        }
        for (int m = 0; m < n; m++) {
            req *r = c.out_req[m];
            r->draft[j] = draft_token(e, r, e->ph_logits + (size_t)m * Vl, j);
            r->n_draft = j + 1;
            if (!mtp)
                r->draft_valid = r->n_tok - 1 + j + 1;
        }
    }
    return 0;
}

static int ngram_step(sd_engine *e, step *s, int k)
{
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        r->n_draft = 0;
        r->has_q = 0;
        if (r->state != RQ_DECODE || r->no_spec)
            continue;
        int kk = reserve_k(e, r, k);
        if (kk <= 0)
            continue;
        /* the index follows the history incrementally: O(n) per new token */
        if (sd_ngram_update(r->ng, r->tok, r->n_tok, NULL) != 0)
            continue;
        int n = sd_ngram_lookup(r->ng, r->tok, r->n_tok, kk, r->draft, NULL);
        r->n_draft = n > 0 ? n : 0;
    }
    return 0;
}

int sd__spec_step(sd_engine *e, step *s, int k, sd_err *err)
{
    if (k > e->k_max)
        k = e->k_max;
    for (int i = 0; i < s->n_seq; i++) {
        s->seqs[i]->n_draft = 0;
        s->seqs[i]->draft_dev = 0;
    }
    switch (e->spec) {
    case SD_SPEC_MTP:
    case SD_SPEC_EAGLE3:
    case SD_SPEC_DRAFT: return model_spec_step(e, s, k, err);
    case SD_SPEC_NGRAM: return ngram_step(e, s, k);
    default: return 0;
    }
}

/* engine: the scheduler thread, continuous batching over a paged KV cache,
 * and speculative decoding (draft -> one batched verify -> accept).
 *
 * One step:
 *   1. take new requests and cancellations;
 *   2. build the batch within the token budget: every decoding sequence
 *      brings its last token and its drafts (verify), then prefill chunks of
 *      waiting requests; KV blocks are reserved first — when they run out the
 *      youngest running request is preempted (its KV freed; it is recomputed
 *      later, nothing is lost);
 *   3. one target forward over the batch;
 *   4. accept drafts (greedy or rejection sampling), sample, stream text,
 *      check stops; KV beyond the accepted tokens is released;
 *   5. the proposer catches up on what the target just computed and drafts
 *      the next step's tokens.
 * The positions of a sequence's KV entries are its token positions, so a
 * rejected draft's entries are simply overwritten later. */
#include "engine/engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/tokenizer.h"
#include "core/util.h"
#include "draft/eagle3.h"
#include "engine/backend.h"
#include "engine/internal.h"
#include "kernels/prof.h"
#include "sched/stop.h"
#include "target/model.h"
#include "verify/accept.h"
#include "verify/sampling.h"

/* ------------------------------------------------------------------ helpers */

static int push_tok(req *r, int32_t t)
{
    if (r->n_tok == r->cap_tok) {
        int cap = r->cap_tok ? r->cap_tok * 2 : 64;
        int32_t *p = realloc(r->tok, (size_t)cap * sizeof *p);
        if (!p)
            return SD_ENOMEM;
        r->tok = p;
        r->cap_tok = cap;
    }
    r->tok[r->n_tok++] = t;
    if (r->counts)
        r->counts[t]++;
    return 0;
}

static int is_eos(const sd_engine *e, const req *r, int32_t t);

/* token t's bytes in running text (the tokenizer's), NULL for a special
 * token or an id it does not name */
static const unsigned char *token_bytes(const sd_engine *e, int32_t t, size_t *n)
{
    *n = 0;
    if (sd_tok_is_special(e->tok, t))
        return NULL;
    return (const unsigned char *)sd_tok_token_bytes(e->tok, t, n);
}

/* r's JSON state (json_object's or its schema's): a copy, bytes fed, whole */
static void jtext_copy(const req *r, sd_jtext *dst, const sd_jtext *src)
{
    if (r->schema)
        sd_jschema_copy(&dst->sch, &src->sch);
    else
        dst->obj = src->obj;
}

static int jtext_feed(const req *r, sd_jtext *st, const unsigned char *b, size_t n)
{
    return r->schema ? sd_jschema_feed(r->schema, &st->sch, b, n) : sd_json_feed(&st->obj, b, n);
}

static int jtext_done(const req *r, const sd_jtext *st)
{
    return r->schema ? sd_jschema_done(r->schema, &st->sch) : sd_json_done(&st->obj);
}

static const unsigned char *jt_bytes(const void *ctx, int32_t t, size_t *n)
{
    return token_bytes(ctx, t, n);
}

/* whether r's text takes special tokens' text: tool calls in a format of
 * special tokens, a reasoning's end tag (verify/json_schema.h,
 * sd_jschema_takes_specials) */
static int takes_specials(const req *r)
{
    return r->schema && sd_jschema_takes_specials(r->schema);
}

/* token t's bytes as r's JSON state reads them: a special token's text
 * where r takes it (tool calls in special tokens), else token_bytes' */
static const unsigned char *jtext_bytes(const sd_engine *e, const req *r, int32_t t, size_t *n)
{
    if (takes_specials(r) && sd_tok_is_special(e->tok, t))
        return (const unsigned char *)sd_tok_token_bytes(e->tok, t, n);
    return token_bytes(e, t, n);
}

/* json_object / json_schema: every token that would leave no prefix of a
 * valid document after st masked to -inf (verify/token_mask.h: most
 * without a feed); an end of text only where the document is whole; a
 * special token where r takes its text there (tool calls' literals) */
static void json_mask_row(sd_engine *e, const req *r, const sd_jtext *st, float *row)
{
    const int done = jtext_done(r, st);
    sd_jtext s;
    const sd_byte_automaton a = r->schema ? sd_jschema_automaton(r->schema) : sd_json_automaton();
    sd_token_mask_cached(e->mcache, &e->tt, &a,
                         r->schema ? (const void *)&st->sch : (const void *)&st->obj,
                         r->schema ? (void *)&s.sch : (void *)&s.obj, row);
    const int specials = takes_specials(r) && sd_jschema_in_literal(&st->sch);
    signed char first[256]; /* specials: whether a first byte is taken (-1: not tried) */
    if (specials)
        memset(first, -1, sizeof first);
    for (int i = 0; i < e->tt.n_none; i++) { /* no bytes (specials): the end of text, once whole */
        const int32_t t = e->tt.none[i];
        if (is_eos(e, r, t)) {
            if (!done)
                row[t] = -INFINITY;
            continue;
        }
        size_t n = 0;
        const unsigned char *b = specials ? jtext_bytes(e, r, t, &n) : NULL;
        int ok = b && n > 0;
        if (ok && first[b[0]] < 0) {
            sd_jschema_copy(&s.sch, &st->sch);
            first[b[0]] = sd_jschema_feed(r->schema, &s.sch, b, 1) == 0;
        }
        if (ok && first[b[0]]) {
            sd_jschema_copy(&s.sch, &st->sch);
            ok = sd_jschema_feed(r->schema, &s.sch, b, n) == 0;
        } else {
            ok = 0;
        }
        if (!ok)
            row[t] = -INFINITY;
    }
}

/* st advanced by token t's bytes */
static void json_advance(const sd_engine *e, const req *r, sd_jtext *st, int32_t t)
{
    size_t n;
    const unsigned char *b = jtext_bytes(e, r, t, &n);
    if (b)
        jtext_feed(r, st, b, n);
}

/* r's logits processors on its rows of a step: row i's history is the
 * generated tokens and the drafts before it (what plain decode's step at
 * that position would have counted, and where its JSON would be) */
static void process_rows(sd_engine *e, req *r, float *logits, int rows)
{
    sd_jtext js;
    if (r->json)
        jtext_copy(r, &js, &r->js);
    for (int i = 0; i < rows; i++) {
        float *row = logits + (size_t)(r->out0 + i) * e->V;
        sd_logits_process(row, e->V, r->bias_ids, r->bias, r->n_bias, r->presence, r->frequency,
                          r->counts);
        if (r->json)
            json_mask_row(e, r, &js, row);
        if (r->n_tok - r->n_prompt + i < r->min_tokens) { /* no end of text yet */
            for (int j = 0; j < e->n_eos; j++)
                row[e->eos_ids[j]] = -INFINITY;
            for (int j = 0; j < r->n_stop_ids; j++)
                row[r->stop_ids[j]] = -INFINITY;
        }
        if (i < rows - 1) {
            if (r->counts)
                r->counts[r->draft[i]]++;
            if (r->json)
                json_advance(e, r, &js, r->draft[i]);
        }
    }
    for (int i = 0; r->counts && i < rows - 1; i++)
        r->counts[r->draft[i]]--;
}

/* the log probability of r's token at position pos, chosen at this logits
 * row (sd_gen_params.logprobs) */
static int keep_lp(const sd_engine *e, req *r, int pos, const float *row)
{
    if (!r->want_lp)
        return 0;
    if (pos >= r->cap_lp) {
        int cap = r->cap_tok > pos ? r->cap_tok : pos + 64;
        sd_token_logprob *p = realloc(r->lp, (size_t)cap * sizeof *p);
        if (!p)
            return SD_ENOMEM;
        r->lp = p;
        r->cap_lp = cap;
    }
    sd_token_logprob *t = &r->lp[pos];
    t->n_top = sd_logprobs_row(row, e->V, r->tok[pos], r->top_lp, &t->logprob, t->top_ids,
                               t->top_logprobs);
    return 0;
}

static int list_push(req ***list, int *n, int *cap, req *r)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        req **p = realloc(*list, (size_t)c * sizeof *p);
        if (!p)
            return SD_ENOMEM;
        *list = p;
        *cap = c;
    }
    (*list)[(*n)++] = r;
    return 0;
}

static void list_remove(req **list, int *n, req *r)
{
    for (int i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
}

/* what a request owns, and the request */
static void req_fields_free(sd_engine *e, req *r)
{
    sd_stop_free(&r->stop);
    sd_detok_free(r->detok);
    sd_ngram_destroy(r->ng);
    free(r->tok);
    free(r->q);
    free(r->lp);
    free(r->bias_ids);
    free(r->bias);
    free(r->counts);
    sd_schema_cache_put(e->schemas, r->schema);
    free(r->schema_text);
    free(r);
}

static void req_free(sd_engine *e, req *r)
{
    pthread_mutex_lock(&e->mu);
    for (req **pp = &e->all; *pp; pp = &(*pp)->all_next)
        if (*pp == r) {
            *pp = r->all_next;
            break;
        }
    pthread_mutex_unlock(&e->mu);
    sd_kv_seq_free(e->kv, &r->kv);
    req_fields_free(e, r);
}

static int is_eos(const sd_engine *e, const req *r, int32_t t)
{
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos_ids[i] == t)
            return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == t)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ finish */

/* The acceptance counters of src/verify into the API's statistics. */
static void spec_from_accept(sd_spec_stats *s, const sd_accept_stats *a)
{
    s->steps = a->steps;
    s->drafted = a->drafted;
    s->accepted = a->accepted;
    s->emitted = a->emitted;
    for (int i = 0; i < 16 && i < SD_ACCEPT_POSITIONS; i++) {
        s->accepted_at[i] = a->accepted_at[i];
        s->proposed_at[i] = a->proposed_at[i];
    }
}

static void fill_stats(sd_engine *e, req *r)
{
    (void)e;
    r->st.prompt_tokens = r->n_prompt;
    r->st.completion_tokens = r->n_tok - r->n_prompt;
    r->st.total_s = (double)(sd_now_ns() - r->t_submit) * 1e-9;
    spec_from_accept(&r->st.spec, &r->acc);
}

static void kv_release(sd_engine *e, req *r, int offer);

static void finish(sd_engine *e, req *r, sd_finish why, const char *msg)
{
    if (r->state == RQ_DONE)
        return;
    /* release what the stop filter held back */
    if (why == SD_FINISH_LENGTH || (why == SD_FINISH_STOP && !r->stop.matched)) {
        char *t = NULL;
        size_t tl = 0;
        if (r->detok && sd_detok_flush(r->detok, &t, &tl) == 0 && tl) {
            const char *o;
            size_t ol;
            sd_stop_push(&r->stop, t, tl, &o, &ol);
            if (ol && r->ev.on_output)
                r->ev.on_output(r->user, o, ol, NULL, 0);
        }
        free(t);
        if (!r->stop.matched) {
            const char *o;
            size_t ol;
            sd_stop_flush(&r->stop, &o, &ol);
            if (ol && r->ev.on_output)
                r->ev.on_output(r->user, o, ol, NULL, 0);
        }
    }
    r->state = RQ_DONE;
    kv_release(e, r, why != SD_FINISH_ERROR);
    fill_stats(e, r);
    pthread_mutex_lock(&e->mu);
    e->stats.completion_tokens += (uint64_t)(r->n_tok - r->n_prompt);
    pthread_mutex_unlock(&e->mu);
    if (r->ev.on_finish)
        r->ev.on_finish(r->user, why, &r->st, msg);
}

/* Streams tokens[from..n_tok) and applies eos / stop strings / max_tokens /
 * context. Returns 1 when the request finished. */
static int emit(sd_engine *e, req *r, int from)
{
    int n_new = r->n_tok - from;
    if (n_new <= 0)
        return 0;
    if (!r->t_first) {
        r->t_first = sd_now_ns();
        r->st.ttft_s = (double)(r->t_first - r->t_submit) * 1e-9;
    }
    /* cut at eos or max_tokens: the tokens after it were never generated */
    sd_finish why = SD_FINISH_NONE;
    for (int i = from; i < r->n_tok; i++) {
        int gen = i - r->n_prompt + 1;
        if (!r->ignore_eos && is_eos(e, r, r->tok[i])) {
            r->n_tok = i + 1;
            why = SD_FINISH_STOP;
            break;
        }
        if (gen >= r->max_tokens || i + 1 >= e->max_ctx) {
            r->n_tok = i + 1;
            why = SD_FINISH_LENGTH;
            break;
        }
    }
    n_new = r->n_tok - from;
    char *text = NULL;
    size_t tl = 0;
    sd_err err = {0};
    /* eos is not printed */
    int n_text = n_new - (why == SD_FINISH_STOP ? 1 : 0);
    /* the text of the first min_tokens tokens is not looked at for stop
     * strings: it goes out as it is */
    const int free_n = SD_MIN(n_text, SD_MAX(0, r->min_tokens - (from - r->n_prompt)));
    char *pre = NULL;
    size_t pl = 0;
    if ((free_n > 0 && r->detok && sd_detok_push(r->detok, r->tok + from, free_n, &pre, &pl, &err)) ||
        (n_text > free_n && r->detok &&
         sd_detok_push(r->detok, r->tok + from + free_n, n_text - free_n, &text, &tl, &err))) {
        free(pre);
        free(text);
        finish(e, r, SD_FINISH_ERROR, err.msg);
        return 1;
    }
    const char *o = "";
    size_t ol = 0;
    int hit = tl ? sd_stop_push(&r->stop, text, tl, &o, &ol) : 0;
    if (pl) { /* the free text first, then what the stop strings let out */
        char *both = malloc(pl + ol + 1);
        if (!both) {
            free(pre);
            free(text);
            finish(e, r, SD_FINISH_ERROR, "out of memory");
            return 1;
        }
        memcpy(both, pre, pl);
        memcpy(both + pl, o, ol);
        free(pre);
        pre = both;
        o = both;
        ol += pl;
    }
    if (r->want_lp && r->ev.on_logprobs && n_new)
        r->ev.on_logprobs(r->user, r->tok + from, r->lp + from, n_new);
    if (r->ev.on_output && (ol || n_new))
        r->ev.on_output(r->user, o, ol, r->tok + from, n_new);
    free(text);
    free(pre);
    if (hit == 1)
        why = SD_FINISH_STOP;
    if (why != SD_FINISH_NONE) {
        finish(e, r, why, NULL);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ KV */

/* Tokens a request in prefill must put in the KV cache: all of a fresh
 * prompt (its last logits give the first token); after a preemption all but
 * the last token, which the next decode step processes. */
static int prefill_target(const req *r) { return r->fresh ? r->n_tok : r->n_tok - 1; }

/* The prefix cache (sched/prefix_cache.h). A request whose proposer keeps
 * KV in the same slots (MTP, EAGLE-3, a draft LM) and that drafts needs
 * those slots of the blocks it shares written for its own tokens; one
 * that never drafts (admitted with speculation off, n-gram lookup, no
 * proposer) needs only the target's. */
static int pc_tracks(const sd_engine *e, const req *r)
{
    return (e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3 || e->spec == SD_SPEC_DRAFT) &&
           !r->no_spec;
}

/* Offers r's whole blocks computed since the last offer: the target's
 * positions up to n_comp are final (a verify writes past them; rejected
 * drafts never land below them), and the proposer's up to draft_valid. A
 * request that drafts offers a block once both are written (MTP's and
 * EAGLE-3's last slot of a block is made from the token after it: the
 * entry keeps it); last: the request stops here (finished, preempted), so
 * the rest of its target-computed blocks go too, without the proposer's. */
static void pc_offer(sd_engine *e, req *r, int last)
{
    if (!e->pc)
        return;
    const int bs = e->block_size, tracks = pc_tracks(e, r);
    const int shifted = e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3;
    for (int pass = 0; pass < 1 + (last && tracks); pass++) {
        const int prop = tracks && pass == 0;
        int lim = r->n_comp;
        if (prop && r->draft_valid < lim)
            lim = r->draft_valid;
        if (lim > r->kv.n_blocks * bs)
            lim = r->kv.n_blocks * bs;
        while ((r->pc_n + 1) * bs <= lim) {
            const int j = r->pc_n++;
            r->pc_key = sd_pcache_insert(e->pc, r->pc_key, r->tok + (size_t)j * bs, r->kv.blocks[j],
                                         prop, prop && shifted ? r->tok[(j + 1) * bs] : -1);
        }
    }
}

/* Frees r's KV (its blocks offered to the prefix cache first where its
 * computed positions are sound: every end but an error); nothing of it is
 * computed then */
static void kv_release(sd_engine *e, req *r, int offer)
{
    if (offer)
        pc_offer(e, r, 1);
    sd_kv_seq_free(e->kv, &r->kv);
    r->pc_n = 0;
    r->pc_key = sd_pcache_root();
    r->n_comp = 0;
    r->draft_valid = 0;
}

/* At admission (nothing computed): shares the cached blocks that begin r's
 * tokens, leaving at least one token of the prefill to run (its logits, or
 * the prefill's end). Returns the positions matched, now computed. The
 * blocks are the ones r may share if it drafts; pc_fit trims them to what
 * it may share once that is decided. */
static int pc_match(sd_engine *e, req *r, int *n_prop)
{
    *n_prop = 0;
    if (!e->pc || r->n_comp > 0 || r->kv.n_blocks > 0 || r->want_plp)
        return 0;
    const int bs = e->block_size, target = prefill_target(r);
    int m = sd_pcache_match(e->pc, r->tok, r->n_tok, (target - 1) / bs, e->pc_match,
                            e->pc_keys, n_prop);
    for (int j = 0; j < m; j++)
        if (sd_kv_seq_share(e->kv, &r->kv, e->pc_match[j]) != 0) {
            m = j; /* out of memory for the table: the rest is computed */
            break;
        }
    if (*n_prop > m)
        *n_prop = m;
    r->pc_key = m ? e->pc_keys[m - 1] : sd_pcache_root();
    r->pc_n = m;
    r->n_comp = m * bs;
    r->draft_valid = *n_prop == m ? m * bs : 0;
    return m * bs;
}

/* An arrival whose first whole blocks a request in prefill is about to
 * compute (the n choices of one prompt, a burst of one system prompt)
 * waits for them: a step later it finds them cached instead of computing
 * them again beside it. */
static int pc_wait(const sd_engine *e, const req *r)
{
    if (!e->pc || r->n_comp > 0 || r->kv.n_blocks > 0 || r->want_plp)
        return 0;
    const int bs = e->block_size, maxb = (prefill_target(r) - 1) / bs;
    for (int i = 0; maxb > 0 && i < e->n_running; i++) {
        const req *q = e->running[i];
        if (q->state != RQ_PREFILL || q->pc_n >= maxb)
            continue;
        /* the blocks both begin with, of those q's prefill computes */
        const int qb = prefill_target(q) / bs;
        int shared = 0;
        while (shared < maxb && shared < qb &&
               !memcmp(q->tok + (size_t)shared * bs, r->tok + (size_t)shared * bs,
                       (size_t)bs * sizeof *r->tok))
            shared++;
        if (shared > q->pc_n)
            return 1;
    }
    return 0;
}

/* A matched request that drafts keeps only the blocks whose proposer
 * slots are written for its tokens (n_prop of them): the rest it computes
 * (the proposer catches up only on what a target pass computes). Returns 1
 * where it dropped blocks. */
static int pc_fit(sd_engine *e, req *r, int n_prop)
{
    const int bs = e->block_size;
    if (!pc_tracks(e, r) || n_prop * bs >= r->n_comp)
        return 0;
    sd_kv_seq_truncate(e->kv, &r->kv, n_prop * bs);
    r->pc_key = n_prop ? e->pc_keys[n_prop - 1] : sd_pcache_root(); /* pc_match's keys */
    r->pc_n = n_prop;
    r->n_comp = r->draft_valid = n_prop * bs;
    return 1;
}

static void preempt(sd_engine *e, req *r)
{
    sd_log_debug("request %llu preempted (KV full); it will be recomputed",
                 (unsigned long long)r->id);
    kv_release(e, r, 1);
    r->n_draft = 0;
    r->state = RQ_WAITING;
    r->n_preempt++;
    list_remove(e->running, &e->n_running, r);
    /* to the front of the queue: it keeps its turn */
    if (list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, r) == 0) {
        memmove(e->waiting + 1, e->waiting, (size_t)(e->n_waiting - 1) * sizeof *e->waiting);
        e->waiting[0] = r;
    }
}

/* Reserves KV for positions [0, n) of r, preempting the youngest other running
 * requests when blocks run out. Returns 0, or SD_EFULL if r cannot fit even alone. */
int sd__engine_reserve(sd_engine *e, req *r, int n)
{
    for (;;) {
        if (sd_kv_seq_reserve(e->kv, &r->kv, n) == 0)
            return 0;
        req *victim = NULL;
        for (int i = e->n_running - 1; i >= 0; i--)
            if (e->running[i] != r && e->running[i]->state != RQ_DONE) {
                victim = e->running[i];
                break;
            }
        if (!victim)
            return SD_EFULL;
        preempt(e, victim);
    }
}

/* ------------------------------------------------------------------ step */

/* The prompt tokens r computes in this step: the rest of its prefill, as
 * far as the step's token budget and rows allow. */
static int prefill_chunk(const sd_engine *e, const step *s, const req *r, int budget)
{
    int chunk = prefill_target(r) - r->n_comp;
    if (chunk > budget)
        chunk = budget;
    if (s->T + chunk > e->max_tokens)
        chunk = e->max_tokens - s->T;
    if (r->want_plp && s->n_out + chunk > e->max_out) /* every row's logits */
        chunk = e->max_out - s->n_out;
    return chunk;
}

/* whether r's logits must come to the host: it wants log probabilities
 * (its tokens' or its prompt's), or a processor changes them (bias,
 * penalties, JSON, min_tokens). Its tokens are chosen there; the step's
 * other requests choose theirs on the device. */
static int wants_host(const req *r) { return r->want_lp || r->proc || r->want_plp; }

static void add_rows(sd_engine *e, step *s, req *r, const int32_t *toks, int n, int pos0, int outs)
{
    r->row0 = s->T;
    r->n_rows = n;
    r->out0 = r->hrow0 = s->n_out;
    r->n_outs = outs;
    r->host = outs > 0 && wants_host(r);
    int si = s->n_seq;
    s->seqs[s->n_seq++] = r;
    for (int i = 0; i < n; i++) {
        int p = pos0 + i;
        e->h_tok[s->T] = toks[i];
        e->h_pos[s->T] = p;
        e->h_seq[s->T] = si;
        e->h_slot[s->T] = sd_kv_seq_slot(e->kv, &r->kv, p);
        s->T++;
    }
    for (int i = n - outs; i < n; i++)
        e->h_rows[s->n_out++] = r->row0 + i;
}

/* The copy of the block-table rows of the step's sequences. Only the
 * blocks the sequences hold are copied (the columns up to the longest
 * table, not the maximum context): attention never reads past a token's
 * own position. */
sd_copy sd__engine_tables_copy(sd_engine *e, const step *s)
{
    int width = 0;
    for (int si = 0; si < s->n_seq; si++) {
        const req *r = s->seqs[si];
        if (r->kv.n_blocks > 0) /* a finished request holds none */
            memcpy(e->h_table + (size_t)si * e->max_blocks, r->kv.blocks,
                   (size_t)r->kv.n_blocks * sizeof(int32_t));
        if (r->kv.n_blocks > width)
            width = r->kv.n_blocks;
    }
    size_t pitch = (size_t)e->max_blocks * sizeof(int32_t);
    return (sd_copy){.dst = e->d_table, .src = e->h_table, .width = (size_t)width * sizeof(int32_t),
                     .rows = (size_t)s->n_seq, .dpitch = pitch, .spitch = pitch};
}

/* the n copies as one (ops.h copies), or SD_ENOTSUP with nothing queued */
static int try_copies(sd_engine *e, const sd_copy *cp, int n)
{
    return e->be->ops->copies ? e->be->ops->copies(e->be, cp, n) : SD_ENOTSUP;
}

/* the n copies from host memory one at a time (upload2d) */
static int put_each(sd_engine *e, const sd_copy *cp, int n)
{
    const sd_ops *op = e->be->ops;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = op->upload2d(e->be, cp[i].dst, cp[i].dpitch, cp[i].src, cp[i].spitch, cp[i].width,
                          cp[i].rows);
    return rc;
}

int sd__engine_put_host(sd_engine *e, const sd_copy *cp, int n)
{
    int rc = try_copies(e, cp, n);
    return rc != SD_ENOTSUP ? rc : put_each(e, cp, n);
}

/* packs the step's inputs (sd__engine_upload_step) and gives their copy */
static sd_copy step_copy(sd_engine *e, int T, int n_out, int hidden, sd_fwd *f)
{
    int32_t *d = e->d_meta;
    const int32_t *cols[4] = {e->h_tok, e->h_pos, e->h_seq, e->h_slot};
    int maxp;
    size_t words = sd__pack_step(e, e->h_meta, T, T, cols, 4, e->h_rows, n_out, n_out, &maxp);
    int want_hidden = hidden ? sd__spec_wants_hidden(e) : 0;
    *f = (sd_fwd){.ab = {.n_tokens = T, .pos = d + T, .seq = d + 2 * T, .slot = d + 3 * T,
                         .block_table = e->d_table, .max_blocks = e->max_blocks,
                         .block_size = e->block_size, .max_pos = maxp},
                  .tokens = d, .n_out = n_out, .out_rows = d + 4 * T, .logits = e->d_logits,
                  .hidden = want_hidden == 1 ? e->d_hidden : NULL,
                  .aux = want_hidden == 2 ? e->d_aux : NULL};
    const size_t bytes = words * sizeof(int32_t);
    return (sd_copy){.dst = d, .src = e->h_meta, .width = bytes, .rows = 1, .dpitch = bytes,
                     .spitch = bytes};
}

int sd__engine_upload_step(sd_engine *e, int T, int n_out, int hidden, sd_fwd *f)
{
    sd_copy c = step_copy(e, T, n_out, hidden, f);
    return e->be->ops->upload(e->be, c.dst, c.src, c.width);
}

/* Queues dn's copy and mark (download_async). */
static int queue_down(sd_engine *e, sd_tokens_down *dn)
{
    int rc = e->be->ops->download_async(e->be, dn->dst, dn->src, dn->bytes, dn->ev);
    dn->queued = !rc;
    return rc;
}

/* A target step's block tables and packed inputs up (sd__engine_tables_copy,
 * sd__engine_upload_step), then, with toks, its n_tok tokens from device
 * memory into the inputs' lead; with dn, the step before's tokens down
 * first, then its mark: one launch where the backend makes the copies one
 * (ops.h copies: the boundary lab's 4.5 us a step boundary where a
 * download kernel and the copies took 7.4, and the copy engine's four
 * ~16, bench/results/boundary-lab-*). */
static int put_step(sd_engine *e, const step *s, int T, int n_out, int hidden, sd_fwd *f,
                    const int32_t *toks, int n_tok, sd_tokens_down *dn, const sd_copy *extra)
{
    const sd_ops *op = e->be->ops;
    const size_t tb = (size_t)n_tok * sizeof(int32_t);
    sd_copy cp[4] = {sd__engine_tables_copy(e, s), step_copy(e, T, n_out, hidden, f),
                     {.dst = e->d_meta, .src = toks, .width = tb, .rows = 1, .dpitch = tb,
                      .spitch = tb}};
    int n = toks ? 3 : 2, rc;
    if (extra) { /* from host memory, never with toks (a step queued ahead has no drafts) */
        if (toks)
            return SD_EINVAL;
        cp[n++] = *extra;
    }
    if (dn && dn->bytes) {
        cp[n++] = (sd_copy){.dst = dn->dst, .src = dn->src, .width = dn->bytes, .rows = 1,
                            .dpitch = dn->bytes, .spitch = dn->bytes};
        rc = try_copies(e, cp, n);
        if (rc != SD_ENOTSUP) {
            /* the copy is made: the mark alone (a download of nothing) */
            sd_tokens_down mark = {dn->dst, dn->src, 0, dn->ev, 0};
            if (!rc)
                rc = queue_down(e, &mark);
            dn->queued = mark.queued;
            return rc;
        }
        n--;
    }
    if (dn && (rc = queue_down(e, dn)) != 0)
        return rc;
    rc = try_copies(e, cp, n);
    if (rc != SD_ENOTSUP)
        return rc;
    rc = put_each(e, cp, extra ? 3 : 2); /* the tables, inputs (and extra) from host memory */
    if (!rc && toks)
        rc = op->copy(e->be, cp[2].dst, cp[2].src, cp[2].width); /* device to device */
    return rc;
}

/* Verifies r's drafts against the logits rows of this step (or takes the
 * backend's verdict, dev_out: accepted count then tokens); appends tokens. */
static int accept_decode(sd_engine *e, req *r, float *logits, const int32_t *dev_out)
{
    int k = r->n_draft, V = e->V;
    int32_t out[SD_MAX_K + 1];
    int n;
    sd_err err = {0};
    if (k < 0 || k > SD_MAX_K)
        return SD_EINVAL;
    /* the device's argmax, where it is of r's own logits */
    const int am = e->am_valid && !r->host;
    if (r->proc && !dev_out)
        process_rows(e, r, logits, k + 1);
    if (dev_out) {
        n = dev_out[0];
        if (n < 0 || n > k)
            return n < 0 ? n : SD_EINVAL;
        memcpy(out, dev_out + 1, (size_t)(n + 1) * sizeof *out);
    } else if (k > 0 && e->synth.n > 0) {
        /* --synthetic-accept (benchmarks only; not the model's output): the
         * first n drafts stand whatever the target says, then the target's
         * own token at position n, picked as plain decode picks it there. */
        uint64_t pos = (uint64_t)(r->n_tok - r->n_prompt);
        n = sd_synthetic_accept(&e->synth, k, r->samp.seed, pos);
        memcpy(out, r->draft, (size_t)n * sizeof *out);
        const float *row = logits + (size_t)(r->out0 + n) * V;
        if (r->greedy) {
            out[n] = am ? e->h_am[r->out0 + n] : sd_argmax(row, V);
        } else {
            sd_sampling_probs(row, V, &r->samp, e->p_rows);
            out[n] = sd_sample(e->p_rows, V,
                               sd_rand_uniform(r->samp.seed, pos + (uint64_t)n, SD_RNG_TARGET));
        }
    } else if (r->greedy) {
        int32_t amx[SD_MAX_K + 1];
        for (int i = 0; i <= k; i++)
            amx[i] = am ? e->h_am[r->out0 + i] : sd_argmax(logits + (size_t)(r->out0 + i) * V, V);
        n = sd_accept_greedy(k, r->draft, amx, out);
    } else {
        if (r->has_q == 2 && k > 0) {
            /* drafted on the device, verified here (the device verification
             * did not launch): the distributions come down first */
            size_t ov = (size_t)e->ov_max_seqs;
            for (int j = 0; j < k; j++)
                if (e->be->ops->download(e->be, r->q + (size_t)j * V,
                                         e->pd_qdraft + ((size_t)j * ov + (size_t)r->q_row) * V,
                                         (size_t)V * sizeof(float)))
                    return SD_EDEVICE;
            r->has_q = 1;
        }
        for (int i = 0; i <= k; i++)
            sd_sampling_probs(logits + (size_t)(r->out0 + i) * V, V, &r->samp,
                              e->p_rows + (size_t)i * V);
        uint64_t pos = (uint64_t)(r->n_tok - r->n_prompt);
        n = sd_accept_chain(&r->samp, V, k, r->draft, e->p_rows, r->has_q ? r->q : NULL,
                            pos, out, &err);
        if (n < 0)
            return n;
    }
    if (k > 0) {
        sd_accept_stats_add(&r->acc, k, n);
        sd_accept_stats_add(&e->acc_all, k, n);
    }
    r->last_k = k;
    r->last_n = n;
    /* positions n_tok-1 .. n_tok-1+n are now computed with the right tokens */
    r->n_comp = r->n_tok + n;
    /* a draft LM's cache holds the accepted drafts; past them it is stale */
    if (r->draft_valid > r->n_tok + n)
        r->draft_valid = r->n_tok + n;
    for (int i = 0; i <= n; i++) {
        if (push_tok(r, out[i]) ||
            (!dev_out && keep_lp(e, r, r->n_tok - 1, logits + (size_t)(r->out0 + i) * V)))
            return SD_ENOMEM;
        if (r->json)
            json_advance(e, r, &r->js, out[i]);
    }
    return n;
}

/* The log probabilities of the prompt tokens r's prefill chunk of this
 * step predicts (row i of the chunk: the token after its position), sent
 * on; the request asks no more of them once they are all sent. */
static int prompt_logprobs(sd_engine *e, req *r)
{
    const int first = r->n_comp + 1 > r->plp_sent ? r->n_comp + 1 : r->plp_sent;
    int last = r->n_comp + r->chunk; /* the position after the chunk's last row */
    if (last > r->n_prompt - 1)
        last = r->n_prompt - 1;
    for (int pos = first; pos <= last; pos++)
        if (keep_lp(e, r, pos, e->h_logits + (size_t)(r->plp_out0 + pos - 1 - r->n_comp) * e->V))
            return SD_ENOMEM;
    if (last >= first && r->ev.on_logprobs)
        r->ev.on_logprobs(r->user, r->tok + first, r->lp + first, last - first + 1);
    if (last >= first)
        r->plp_sent = last + 1;
    if (r->plp_sent >= r->n_prompt)
        r->want_plp = 0;
    return 0;
}

static int sample_one(sd_engine *e, req *r, float *row)
{
    int V = e->V;
    int32_t t;
    if (r->proc)
        process_rows(e, r, row - (size_t)r->out0 * V, 1);
    if (r->greedy) {
        t = e->am_valid && !r->host ? e->h_am[r->out0] : sd_argmax(row, V);
    } else {
        sd_sampling_probs(row, V, &r->samp, e->p_rows);
        uint64_t pos = (uint64_t)(r->n_tok - r->n_prompt);
        t = sd_sample(e->p_rows, V, sd_rand_uniform(r->samp.seed, pos, SD_RNG_TARGET));
    }
    if (push_tok(r, t) || keep_lp(e, r, r->n_tok - 1, row))
        return SD_ENOMEM;
    if (r->json)
        json_advance(e, r, &r->js, t);
    return 0;
}

static void take_incoming(sd_engine *e)
{
    pthread_mutex_lock(&e->mu);
    req *in = e->incoming;
    e->incoming = NULL;
    pthread_mutex_unlock(&e->mu);
    /* reverse to arrival order */
    req *rev = NULL;
    while (in) {
        req *nx = in->next;
        in->next = rev;
        rev = in;
        in = nx;
    }
    while (rev) {
        req *nx = rev->next;
        if (list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, rev)) {
            finish(e, rev, SD_FINISH_ERROR, "out of memory");
            req_free(e, rev);
        } else if (e->nodes && list_push(&e->fresh, &e->n_fresh, &e->cap_fresh, rev)) {
            /* not in the plan: the other nodes would not know it */
            list_remove(e->waiting, &e->n_waiting, rev);
            finish(e, rev, SD_FINISH_ERROR, "out of memory");
            req_free(e, rev);
        }
        rev = nx;
    }
}

int sd__engine_admit(sd_engine *e, req *r)
{
    if (list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, r))
        return SD_ENOMEM;
    pthread_mutex_lock(&e->mu);
    r->all_next = e->all;
    e->all = r;
    pthread_mutex_unlock(&e->mu);
    return 0;
}


/* Finishes cancelled requests of a list and frees the finished ones. */
static void reap_list(sd_engine *e, req **list, int *n)
{
    for (int i = 0; i < *n;) {
        req *r = list[i];
        if (r->cancel_applied && r->state != RQ_DONE)
            finish(e, r, SD_FINISH_CANCELLED, NULL);
        if (r->state == RQ_DONE) {
            list_remove(list, n, r);
            req_free(e, r);
        } else {
            i++;
        }
    }
}

static void reap(sd_engine *e)
{
    /* the step queued ahead keeps its rows for them (the device computes
     * them anyway); it reads none of their results */
    for (int i = 0; e->ahead_live && i < e->ahead->n_seq; i++) {
        req *r = e->ahead->seqs[i];
        if (r && (r->state == RQ_DONE || r->cancel_applied))
            e->ahead->seqs[i] = NULL;
    }
    reap_list(e, e->waiting, &e->n_waiting);
    reap_list(e, e->running, &e->n_running);
}

/* Every running and waiting request ends with `why` (and msg). */
static void end_all(sd_engine *e, sd_finish why, const char *msg)
{
    for (int i = 0; i < e->n_running; i++)
        finish(e, e->running[i], why, msg);
    for (int i = 0; i < e->n_waiting; i++)
        finish(e, e->waiting[i], why, msg);
    reap(e);
}

/* The node group failed: nothing more can run (the other nodes are gone or
 * out of step); every request ends with an error, and /health says so. */
static void fail_all(sd_engine *e, const char *msg)
{
    end_all(e, SD_FINISH_ERROR, msg);
    pthread_mutex_lock(&e->mu);
    e->stats.failed_steps++;
    e->stats.failing++;
    pthread_mutex_unlock(&e->mu);
}

/* The tensor-parallel collectives' counts into st (engine thread, whose
 * rank 0 makes the calls: exact at a step's end). */
static void comm_counts_stats(sd_engine *e, sd_engine_stats *st)
{
    if (!e->tp)
        return;
    sd_comm_counts k;
    sd_comm_get_counts(sd__tp_comm(e->tp), &k);
    st->allreduce_calls = k.allreduce_calls;
    st->allreduce_floats = k.allreduce_floats;
    st->residual_calls = k.residual_calls;
    st->allgather_calls = k.allgather_calls;
    _Static_assert(sizeof st->allreduce_path_calls == sizeof k.path_calls, "paths: engine.h");
    for (int p = 0; p < SD_COMM_PATHS; p++)
        st->allreduce_path_calls[p] = k.path_calls[p];
    st->allreduce_est_s = (double)k.est_ns * 1e-9;
    st->allreduce_est_calls = k.est_calls;
    st->allreduce_unrecorded_replays = k.unrecorded_replays;
}

/* Keeps the output rate of the last ~SD_DEMAND_STEPS decode steps with
 * requests running (dem_tok / dem_s, tokens a second): under a steady
 * stream of requests, the rate its decode steps must serve. Called once a
 * step, after its tokens; `prompt`: the step had prompt rows. Such a step
 * and the one after it (its drafting phase runs the prompt chunk through
 * the proposer) are left out, their tokens and their time: the demand pick
 * prices decode steps, and arrivals' prompts take their time whatever the
 * pick. Counted in, they were ~20% of a plain server's time at c = 64
 * (the bundled model on an H100: 676 of 5066 steps at 0.45 ms against
 * 0.27), and the rate, 83 tokens/ms where its decode steps served ~90,
 * priced plain decode at fewer requests than it ran at (NOTES.md, session
 * 46). */
static void demand_update(sd_engine *e, int prompt)
{
    const uint64_t now = sd_now_ns();
    uint64_t tok = e->stats.completion_tokens; /* (this thread writes it) */
    /* (a request's tokens count once: in completion_tokens once it is done) */
    for (int i = 0; i < e->n_running; i++) {
        const req *r = e->running[i];
        if (r->state != RQ_DONE)
            tok += (uint64_t)(r->n_tok - r->n_prompt);
    }
    if (e->dem_busy && !prompt && !e->dem_prompt && tok >= e->dem_prev && now > e->dem_ns) {
        const double w = 1.0 - 1.0 / SD_DEMAND_STEPS;
        e->dem_tok = e->dem_tok * w + (double)(tok - e->dem_prev);
        e->dem_s = e->dem_s * w + (double)(now - e->dem_ns) * 1e-9;
        e->dem_steps++;
    }
    e->dem_ns = now;
    e->dem_prev = tok;
    e->dem_busy = e->n_running > 0;
    e->dem_prompt = prompt;
}

/* adaptive k's demand pick at a batch (sd_adaptive_demand_k), measured
 * again every SD_DEMAND_EVERY engine steps or at another batch bucket */
static int demand_k(sd_engine *e, int batch)
{
    if (!e->adapt.ahead || e->spec == SD_SPEC_NGRAM)
        return 0;
    const int bucket = sd_adapt_batch_bucket(batch);
    if (!e->dem_k_at || bucket != e->dem_k_bucket ||
        e->stats.steps + 1 - e->dem_k_at >= SD_DEMAND_EVERY) {
        /* (a rate of a few busy steps is the start's, not the stream's:
         * 37.9 tokens/ms after 128 steps of a stream that asked for ~90
         * while its batch grew; NOTES.md, session 46) */
        const double rate =
            e->dem_steps >= SD_DEMAND_STEPS / 2 && e->dem_s > 0 ? e->dem_tok / e->dem_s : 0;
        int bp = 0, bk = 0;
        const int k = sd_adaptive_demand_k(&e->adapt, &e->acc_all, rate, batch, &bp, &bk);
        if (k != e->dem_k || !e->dem_k_at)
            sd_log_debug("adaptive k: demand pick %d at batch %d (step %llu): %.1f tokens/ms "
                         "served plain at %d requests, drafting at %d (0: at no measured batch)",
                         k, batch, (unsigned long long)e->adapt.steps, rate * 1e-3, bp, bk);
        e->dem_k = k;
        e->dem_k_at = e->stats.steps + 1;
        e->dem_k_bucket = bucket;
    }
    return e->dem_k;
}

/* running requests that stopped tracking the proposer (adaptive k) */
static int n_not_drafting(const sd_engine *e)
{
    int off = 0;
    for (int i = 0; i < e->n_running; i++)
        off += e->running[i]->no_spec;
    return off;
}

static void publish_stats(sd_engine *e, int stepped)
{
    pthread_mutex_lock(&e->mu);
    e->stats.queued = e->n_waiting;
    e->stats.running = e->n_running;
    e->stats.kv_blocks_total = e->n_blocks;
    e->stats.kv_blocks_used = sd_kv_pool_used(e->kv);
    e->stats.kv_blocks_cached = sd_kv_pool_evictable(e->kv);
    sd_spec_stats *sp = &e->stats.spec;
    spec_from_accept(sp, &e->acc_all);
    sp->draft_s = e->draft_s_total;
    sp->verify_s = e->verify_s_total;
    sp->host_s = e->host_s_total;
    if (stepped) {
        e->stats.steps++;
        e->stats.last_step_ns = sd_now_ns();
        comm_counts_stats(e, &e->stats);
    }
    e->stats.plans = e->plan_seq;
    e->stats.spec_exploring = e->spec != SD_SPEC_NONE && e->spec_k < 0 && e->adapt.exploring;
    e->stats.spec_off_running = n_not_drafting(e);
    e->stats.spec_eager_passes = e->prop_eager;
    e->stats.spec_graph_cache_full = e->prop_cache_full;
    e->stats.spec_plain_steps = e->plain_steps;
    e->stats.spec_cohorts = e->n_cohorts;
    e->stats.spec_draft_phases = e->draft_phases;
    e->stats.spec_draft_observed = e->draft_observed;
    e->stats.spec_draft_oneoff = e->draft_oneoff;
    e->stats.ahead_steps = e->ahead_steps;
    e->stats.logits_host_rows = e->host_rows;
    e->stats.logits_host_steps = e->host_steps;
    memcpy(e->stats.ahead_refused, e->ahead_refused, sizeof e->ahead_refused);
    if (e->mcache)
        sd_mask_cache_counts(e->mcache, &e->stats.json_masks_found, &e->stats.json_masks_made);
    e->stats.draft_ahead_steps = e->draft_ahead_steps;
    e->stats.draft_ahead_timed = e->draft_ahead_timed;
    e->stats.gemm_trials =
        e->be->ops->gemm_trials ? (uint64_t)e->be->ops->gemm_trials(e->be) : 0;
    e->stats.prompt_steps = e->prompt_steps;
    e->stats.prompt_padded_steps = e->prompt_padded_steps;
    e->stats.prompt_graph_steps = e->prompt_graph_steps;
    memcpy(e->stats.spec_why_steps, e->kwhy_steps, sizeof e->kwhy_steps);
    memcpy(e->stats.spec_why_idle, e->kwhy_idle, sizeof e->kwhy_idle);
    pthread_mutex_unlock(&e->mu);
}

/* Does r sample from a logits row of this step (a fresh prompt's last chunk)? */
static int samples_after_prefill(const req *r)
{
    return r->state == RQ_PREFILL && r->fresh && r->n_comp + r->chunk == prefill_target(r);
}

/* Sampled steps: verification (rejection sampling, n-gram's deterministic
 * drafts, the greedy requests among them) and a fresh prompt's first token
 * run on the backend over the logits rows where they are (accept_sample_rows),
 * and only the accepted counts and tokens come back. The draft distributions
 * of sampled model drafts (computed on the host) go up. Returns 1 when the
 * step must verify on the host instead. ahead: the step is queued before
 * the one before it is read (its requests' tokens are one more each than
 * the host holds yet: the sampling counters a step on). */
/* The ints of the verification buffers (d_acc, h_acc) for ov sequences:
 * the rows, draft counts, drafts, accepted counts and tokens (4 + 2
 * SD_MAX_K a sequence), then the drafts' places among the step's tokens
 * (draft ahead: SD_MAX_K) */
static size_t acc_ints(size_t ov) { return ov * (4 + 3 * SD_MAX_K); }
static size_t acc_didx(size_t ov) { return ov * (4 + 2 * SD_MAX_K); }

/* Whether launch_dev_accept verifies s on the device, and where its sampled
 * drafts' distributions are: -1 the host verifies (the backend cannot, or
 * the kinds are mixed: accept_decode fetches the device's q), else one kind
 * for the step: 0 none (greedy, or n-gram drafts: deterministic, q NULL), 1
 * in r->q (host path), 2 still on the device (the draft chain, has_q 2) */
static int dev_q_kind(const sd_engine *e, const step *s)
{
    if (!e->be->ops->accept_sample_rows || !e->d_acc || e->synth.n > 0)
        return -1;
    int host_q = 0, dev_q = 0, no_q = 0;
    for (int i = 0; i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (r->state == RQ_DECODE && r->n_draft > 0 && !r->greedy && !r->host) {
            dev_q += r->has_q == 2;
            host_q += r->has_q == 1;
            no_q += !r->has_q;
        }
    }
    if ((host_q || dev_q) && !e->d_q)
        return -1;
    if ((host_q && dev_q) || (no_q && (host_q || dev_q)))
        return -1;
    return dev_q ? 2 : host_q ? 1 : 0;
}

static int launch_dev_accept(sd_engine *e, const step *s, int ahead)
{
    const sd_ops *op = e->be->ops;
    const int kind = dev_q_kind(e, s), host_q = kind == 1, dev_q = kind == 2;
    if (kind < 0)
        return 1;
    int n = 0, k = 0, on_dev = 0;
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        r->vi = -1;
        if (!r->host && (r->state == RQ_DECODE || samples_after_prefill(r))) {
            int kd = r->state == RQ_DECODE ? r->n_draft : 0;
            k = kd > k ? kd : k;
            on_dev |= kd > 0 && r->draft_dev;
            r->vi = n++;
        }
    }
    if (on_dev && !op->gather_i32)
        return 1;
    int32_t *row0 = e->h_acc, *nd = row0 + n, *dr = nd + n;
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        if (r->vi < 0)
            continue;
        int kd = r->state == RQ_DECODE ? r->n_draft : 0;
        row0[r->vi] = r->out0;
        nd[r->vi] = kd;
        for (int j = 0; j < k; j++)
            dr[(size_t)r->vi * k + j] = j < kd ? r->draft[j] : 0;
        e->h_sp[r->vi] = (sd_sample_params){
            .temperature = r->greedy ? 0.0f : r->samp.temperature, .top_p = r->samp.top_p,
            .top_k = r->samp.top_k, .seed = r->samp.seed,
            .counter = (uint64_t)(r->n_tok - r->n_prompt + ahead)};
        if (dev_q) {
            /* d_q row vi * k + j := pd_qdraft row j * ov + q_row; rows
             * nobody reads take row 0 */
            for (int j = 0; j < k; j++)
                e->h_qidx[(size_t)r->vi * k + j] =
                    j < kd && !r->greedy ? j * e->ov_max_seqs + r->q_row : 0;
        } else if (host_q && kd > 0 && !r->greedy &&
                   op->upload(e->be, e->d_q + (size_t)r->vi * k * e->V, r->q,
                              (size_t)kd * (size_t)e->V * sizeof(float))) {
            return 1;
        }
    }
    if (dev_q) {
        if (op->upload(e->be, e->d_qidx, e->h_qidx, (size_t)n * k * sizeof(int32_t)))
            return 1;
        op->gather_rows(e->be, e->d_q, e->pd_qdraft, e->d_qidx, n * k, e->V, e->V, e->V);
    }
    int32_t *d = e->d_acc;
    if (op->upload(e->be, d, row0, (size_t)(2 * n + n * k) * sizeof(int32_t)) ||
        op->upload(e->be, e->d_sp, e->h_sp, (size_t)n * sizeof(sd_sample_params)))
        return 1;
    if (on_dev) {
        /* draft ahead: drafts still on the device (r->draft is not yet
         * theirs) come from the step's token inputs, where the gather put
         * them (rows row0 + 1 ..; drafts past a request's count read its
         * first row and are not looked at) */
        const size_t off = acc_didx((size_t)e->ov_max_seqs);
        int32_t *hidx = e->h_acc + off;
        for (int i = 0; i < s->n_seq; i++) {
            const req *r = s->seqs[i];
            if (r->vi < 0)
                continue;
            int kd = r->state == RQ_DECODE ? r->n_draft : 0;
            for (int j = 0; j < k; j++)
                hidx[(size_t)r->vi * k + j] = j < kd ? r->row0 + 1 + j : r->row0;
        }
        if (op->upload(e->be, d + off, hidx, (size_t)n * k * sizeof(int32_t)))
            return 1;
        op->gather_i32(e->be, d + 2 * n, e->d_meta, d + off, n * k);
    }
    int32_t *d_nacc = d + 2 * n + n * k, *d_out = d_nacc + n;
    op->accept_sample_rows(e->be, d_nacc, d_out, e->d_probs, e->d_logits, d,
                           host_q || dev_q ? e->d_q : NULL, d + 2 * n, d + n, e->d_sp, n, k, e->V);
    e->acc_n = n;
    e->acc_k = k;
    return 0;
}

/* r's result of launch_dev_accept, downloaded: [n_acc, tokens...] in
 * e->h_acc_res (the accepted count, then k + 1 token slots) */
static const int32_t *dev_result(sd_engine *e, const req *r)
{
    int32_t *res = e->h_acc_res + (size_t)r->vi * (SD_MAX_K + 2);
    return res;
}

/* the device's results of launch_dev_accept: n_acc (n), out (n, k + 1) */
static const int32_t *dev_accept_out(const sd_engine *e)
{
    return e->d_acc + 2 * e->acc_n + e->acc_n * e->acc_k;
}

static size_t dev_accept_bytes(const sd_engine *e)
{
    return (size_t)(e->acc_n + e->acc_n * (e->acc_k + 1)) * sizeof(int32_t);
}

/* The downloaded counts and tokens (raw: dev_accept_out's) into per-request rows. */
static void unpack_dev_accept(sd_engine *e, const int32_t *raw)
{
    int n = e->acc_n, k = e->acc_k;
    for (int i = 0; i < n; i++) {
        int32_t *res = e->h_acc_res + (size_t)i * (SD_MAX_K + 2);
        res[0] = raw[i];
        memcpy(res + 1, raw + n + (size_t)i * (k + 1), (size_t)(k + 1) * sizeof(int32_t));
    }
}

static int fetch_dev_accept(sd_engine *e)
{
    int32_t *raw = e->h_acc + 2 * e->acc_n + e->acc_n * e->acc_k;
    int rc = e->be->ops->download(e->be, raw, dev_accept_out(e), dev_accept_bytes(e));
    if (!rc)
        unpack_dev_accept(e, raw);
    return rc;
}

/* The download of a step's tokens (n_out rows) with mark ev into that
 * mark's buffers: the argmax, or launch_dev_accept's results (not queued). */
static sd_tokens_down tokens_down(sd_engine *e, int n_out, int ev)
{
    if (e->dev_acc)
        return (sd_tokens_down){e->h_accraw_ev[ev], dev_accept_out(e), dev_accept_bytes(e), ev, 0};
    return (sd_tokens_down){e->h_am_ev[ev], e->d_am, (size_t)n_out * sizeof(int32_t), ev, 0};
}

/* Swaps the host buffers a step uploads from (inputs, block tables,
 * verification ints and sampling parameters) with mark ev's page-locked
 * ones; a second call swaps them back. */
static void swap_mark_bufs(sd_engine *e, int ev)
{
    int32_t *meta = e->h_meta, *table = e->h_table, *acc = e->h_acc;
    sd_sample_params *sp = e->h_sp;
    e->h_meta = e->h_meta_ev[ev];
    e->h_table = e->h_table_ev[ev];
    e->h_acc = e->h_acc_ev[ev];
    e->h_sp = e->h_sp_ev[ev];
    e->h_meta_ev[ev] = meta;
    e->h_table_ev[ev] = table;
    e->h_acc_ev[ev] = acc;
    e->h_sp_ev[ev] = sp;
}

/* How a target step was queued, for its reading */
typedef struct step_launch {
    int Tp;     /* padded rows (0: none) */
    int ev;     /* the mark its argmax downloads with; -1: read after a sync */
    int queued; /* queued before the step before it was read */
    int gathered; /* took its drafts on the device (draft ahead) */
    int graph;    /* replayed a graph */
    uint64_t step0, t0, t_up, t_launch;
    long long keys; /* the keys its rows attend to: its attention's work (debug logs) */
} step_launch;

static int read_step(sd_engine *e, step *s, const step_launch *L, int rc, sd_err *err);

/* the keys a step's rows attend to (its attention's work: adaptive k's
 * price of a queued-ahead step, the debug log): from the host rows built
 * last; 0 where neither reads them (no loop over the rows a step) */
static long long step_keys(const sd_engine *e, int T)
{
    const int priced = e->spec != SD_SPEC_NONE && e->spec_k < 0 && e->adapt.ahead;
    long long keys = 0;
    for (int i = 0; (priced || sd_log_level() >= SD_LOG_DEBUG) && i < T; i++)
        keys += (long long)e->h_pos[i] + 1;
    return keys;
}

/* the keys the next plain step of n requests would read: the running
 * requests', then the waiting ones' up to n (a plain step reads a
 * request's whole context: its tokens so far) */
static double next_keys(const sd_engine *e, int n)
{
    double keys = 0;
    for (int i = 0; i < e->n_running && i < n; i++)
        keys += e->running[i]->n_tok;
    for (int i = 0; i < e->n_waiting && e->n_running + i < n; i++)
        keys += e->waiting[i]->n_tok;
    return keys;
}

/* A cohort of arrivals (adaptive k; `off`: running requests not tracking
 * the proposer) ends SD_COHORT_SETTLE steps after every running request
 * tracks the proposer (the pick then decides on all of them drafting, at
 * the batch drafting runs at), or at its time; until then its requests
 * draft at the k of every request drafting's price at the running batch
 * (tracking at k = 0 they were steps not queued ahead, ~0.1 ms dearer each
 * on the bundled model, and the batch grew from 31 to 55 while they
 * gathered; NOTES.md, session 45). Not where every request drafting is
 * measured not to pay at the batch it gathered: that batch is plain
 * decode's and the cohort's, not drafting's (NOTES.md, session 47). */
static void cohort_step(sd_engine *e, int off)
{
    if (!e->cohort_at)
        return;
    int ck = 0;
    const int pays = sd_adaptive_cohort(&e->adapt, &e->acc_all, e->n_running, &ck);
    if (off == 0 && !e->cohort_all)
        e->cohort_all = e->stats.steps + 1;
    const int done =
        (e->cohort_all && e->stats.steps + 1 - e->cohort_all >= SD_COHORT_SETTLE) ||
        e->stats.steps + 1 - e->cohort_at > SD_COHORT_MAX_STEPS;
    const int dk = pays || done ? 0 : demand_k(e, e->n_running);
    if (pays || dk)
        e->cohort_k = pays ? ck : dk;
    if (done) {
        sd_log_debug("adaptive k: the cohort ends at batch %d (step %llu), %d not tracking",
                     e->n_running, (unsigned long long)e->adapt.steps, off);
        e->cohort_at = e->cohort_all = 0;
        e->cohort_next = sd_cohort_gap_end(&e->cohort_gap, e->stats.steps);
    }
}

/* Adaptive k's k for this step (`off`: running requests not tracking the
 * proposer); *why: the reason where it is not the pick's own
 * (SD_KWHY_COHORT, SD_KWHY_DEMAND, or SD_KWHY_EXPLORE for a settle's
 * measuring step), else -1 (e->adapt.why says it).
 * No request tracks the proposer: no pick (one would be for nobody, and a
 * 1 there, an exploration or a hope, would reset the count of zeros that
 * admits arrivals with speculation off: each arrival would then track the
 * proposer and stop launch ahead); an exploration the last pick began is
 * over, as no request runs it (left on, it froze the count of zeros and
 * held off the demand pick: EAGLE-3 at c = 16 on an H100 ran plain with it
 * on for 6900 steps; NOTES.md, session 47). */
static int adaptive_step_k(sd_engine *e, int off, int *why)
{
    *why = -1;
    if (e->n_running > 0 && off == e->n_running) {
        sd_adaptive_no_pick(&e->adapt);
        return 0;
    }
    /* a cohort that gathers drafts at its own k */
    if (e->cohort_at && !e->cohort_all) {
        if (e->cohort_k)
            *why = SD_KWHY_COHORT;
        return e->cohort_k;
    }
    e->adapt.keys = next_keys(e, e->n_running);
    const int drafting = e->n_running - off;
    if (e->cohort_at) {
        /* the settle (every running request tracks): the pick at the
         * running batch, or a deeper k it has not measured
         * (sd_adaptive_settle_k), else the cohort's k */
        int measuring = 0;
        const int sk =
            sd_adaptive_settle_k(&e->adapt, &e->acc_all, e->n_running, drafting, &measuring);
        if (measuring)
            sd_log_debug("adaptive k: measuring k %d at batch %d as the cohort settles "
                         "(step %llu)",
                         sk, e->n_running, (unsigned long long)e->adapt.steps);
        if (sk < 0) {
            if (e->cohort_k)
                *why = SD_KWHY_COHORT;
            return e->cohort_k;
        }
        if (measuring)
            *why = SD_KWHY_EXPLORE;
        return sk;
    }
    int k = sd_adaptive_pick_k(&e->adapt, &e->acc_all, e->n_running, drafting);
    /* plain at this batch, but drafting serves the rate asked for with
     * fewer requests: the batch it would run at */
    if (k == 0 && !e->adapt.exploring && !e->adapt.refresh_at) {
        k = demand_k(e, e->n_running);
        if (k)
            *why = SD_KWHY_DEMAND;
    }
    return k;
}

/* ---- launch ahead ----
 * Between two decode steps the host reads the argmax, accepts and streams
 * the tokens, checks the stops, builds the next step and uploads it: 30-60
 * us a step on the H200 (NOTES.md), while the GPU waits. Where nothing can
 * change the next step but the tokens themselves (plain decode: greedy, or
 * sampled on the device; no request waiting, none
 * ending by length at this step, one node: a node group's followers take
 * each step from node 0's plan), it is queued before this one is read: its
 * rows are this step's, a position on; its tokens this step's argmax or
 * sampled tokens, copied on the device; its KV slots reserved now. A request this step ends (a stop token, a stop
 * string, a cancel) keeps its row in the queued step, which computes it and
 * reads nothing of it (its KV blocks, freed, go to a later step only in
 * queue order). */

/* whether this engine queues steps ahead at all: switched on, one node,
 * no synthetic acceptance, a backend with the ops */
static int ahead_possible(const sd_engine *e)
{
    const sd_ops *op = e->be->ops;
    return e->ahead_on && !e->nodes && e->synth.n == 0 && op->copy && op->download_async &&
           op->download_wait;
}

/* The per-request places of a step of one row a request (a decode step
 * that may be queued ahead of, or was): request i at row i, its device
 * verification's row i. Building the step after it lays its requests out
 * anew (add_rows); where that one leaves rows out, their places move, so a
 * step is laid out again before it is read. */
static void ahead_layout(sd_engine *e, const step *s)
{
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        if (!r)
            continue;
        r->row0 = r->out0 = r->hrow0 = r->vi = i;
        r->n_rows = r->n_outs = 1;
        r->host = 0;
        /* a decode row: no prompt chunk (the step before may have been its
         * prompt's last; kept, read_step counted that chunk again at every
         * step queued ahead after it: its prompt rows, the prompt tokens'
         * count, the output rate and adaptive k's queued-ahead prices all
         * left those steps out as steps with prompt rows) */
        r->chunk = 0;
    }
    e->acc_n = s->n_seq;
    e->acc_k = 0;
}

/* whether the step queued after s leaves out r's row: r ended before s
 * was read (NULL), or ends when s is read (its last token by length, or
 * its cancel) */
static int ahead_drops(const sd_engine *e, const req *r)
{
    if (!r)
        return 1;
    const int n = r->n_tok + 1; /* its tokens once s is read */
    return r->cancel_applied || atomic_load(&r->cancel) || n - r->n_prompt >= r->max_tokens ||
           n >= e->max_ctx;
}

/* why the step s just queued may not have the next one queued before it
 * is read (SD_AHEAD_*), or -1: it may */
static int ahead_refusal(sd_engine *e, const step *s)
{
    /* the tokens on the device: the argmax (greedy), or the device's
     * sampling of a step without drafts */
    int sampled = e->dev_acc && e->acc_k == 0;
    if (!(e->am_valid || sampled))
        return SD_AHEAD_HOST_TOKENS;
    pthread_mutex_lock(&e->mu);
    int incoming = e->incoming != NULL;
    pthread_mutex_unlock(&e->mu);
    if (incoming || e->n_waiting)
        return SD_AHEAD_ARRIVALS; /* they join at the next step, not one later */
    int gone = 0, drops = 0;
    for (int i = 0; i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (!r) {
            gone++;
            continue;
        }
        if ((!r->greedy && !sampled) || r->host)
            return SD_AHEAD_HOST_ROWS;
        /* a prompt's last chunk whose first token this step chooses
         * decodes in the next (a chunk before it does not) */
        if (r->state != RQ_DECODE && !samples_after_prefill(r))
            return SD_AHEAD_PREFILL;
        if (r->n_draft)
            return SD_AHEAD_DRAFTS;
        /* a request that tracks the proposer needs this step's hidden
         * states and tokens before the next step: speculative engines queue
         * ahead only where adaptive k turned speculation off for all */
        if (e->spec != SD_SPEC_NONE && !r->no_spec)
            return SD_AHEAD_TRACKING;
        drops += ahead_drops(e, r);
    }
    /* rows left out: the next step's tokens are gathered from the live
     * rows of this one's (launch_ahead) */
    if (gone + drops == s->n_seq || (gone + drops && !e->be->ops->gather_i32))
        return SD_AHEAD_ENDING;
    /* one logits row a request (its token: row i's), every running one */
    if (s->n_out != s->n_seq || s->n_seq - gone != e->n_running)
        return SD_AHEAD_SHAPE;
    return -1;
}

/* whether the step s just queued may have the next one queued before it
 * is read; the reason counted where not */
static int ahead_ok(sd_engine *e, const step *s)
{
    if (!ahead_possible(e))
        return 0;
    const int why = ahead_refusal(e, s);
    if (why >= 0)
        e->ahead_refused[why]++;
    return why < 0;
}

/* Queues the step after s (padded to Tp rows as s was) before s is read,
 * its tokens to download with mark ev (e->ahead_down: queued with the step
 * after it, or when it is read), and s's tokens' download dn (with this
 * step's copies, or alone). Nothing is queued but dn where the KV cache
 * is short of a block (the next step reserves it, preempting if it must)
 * or a launch fails (the backend's error reaches s's reading). Returns
 * dn's queueing's error (0: queued). */
/* a request's places in a step (add_rows, launch_dev_accept) */
typedef struct req_places {
    int row0, n_rows, out0, hrow0, n_outs, host, vi;
} req_places;

static int launch_ahead(sd_engine *e, const step *s, int Tp, int ev, sd_tokens_down *dn)
{
    for (int i = 0; i < s->n_seq; i++)
        if (!ahead_drops(e, s->seqs[i]) &&
            sd_kv_seq_reserve(e->kv, &s->seqs[i]->kv, s->seqs[i]->n_tok + 1) != 0)
            return queue_down(e, dn);
    /* s is read after this: its requests' places in it, kept (add_rows and
     * the device verification below give them the next step's) */
    req_places kept[SD_ARRAY_LEN(s->seqs)];
    for (int i = 0; i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (r)
            kept[i] = (req_places){r->row0, r->n_rows, r->out0, r->hrow0, r->n_outs, r->host, r->vi};
    }
    const int acc_n = e->acc_n, acc_k = e->acc_k;
    /* a step with prompt rows (its prompts' last chunks) is followed by a
     * decode step: that one's own bucket */
    if (s->T != s->n_seq)
        Tp = sd__graph_bucket(e, s->n_seq);
    step *a = e->ahead;
    a->T = a->n_out = a->n_seq = 0;
    /* s's rows it keeps: their places in s (a row left out is computed by
     * nothing; ahead_refusal) */
    int32_t keep[SD_ARRAY_LEN(a->seqs)];
    for (int i = 0; i < s->n_seq; i++) {
        if (ahead_drops(e, s->seqs[i]))
            continue;
        const int32_t t = 0; /* s's argmax, copied below */
        keep[a->n_seq] = i;
        add_rows(e, a, s->seqs[i], &t, 1, s->seqs[i]->n_tok, 1);
    }
    const int gather = a->n_seq < s->n_seq;
    if (Tp) {
        sd__pad_rows(e, e->h_tok, e->h_pos, e->h_seq, e->h_slot, a->T, Tp);
        for (int i = a->T; i < Tp; i++)
            e->h_rows[i] = i;
    }
    /* s's inputs may still be on their way up: this step's go from
     * page-locked buffers of its own mark (the previous user of the mark
     * was read; a copy from pageable memory may wait for the queue) */
    swap_mark_bufs(e, ev);
    sd_fwd f;
    sd_err err = {0};
    /* the tokens lead the packed inputs: s's argmax, or its sampled tokens
     * (one a request: no drafts) */
    int sampled = e->dev_acc;
    const int32_t *toks = sampled ? dev_accept_out(e) + e->acc_n : e->d_am;
    /* rows left out: the kept rows' places go up with the inputs, and the
     * tokens are gathered from them on the device */
    const size_t off = acc_didx((size_t)e->ov_max_seqs);
    const size_t kb = (size_t)a->n_seq * sizeof(int32_t);
    const sd_copy places = {.dst = e->d_acc + off, .src = e->h_acc + off, .width = kb, .rows = 1,
                            .dpitch = kb, .spitch = kb};
    if (gather)
        memcpy(e->h_acc + off, keep, kb);
    int rc = put_step(e, a, Tp ? Tp : a->T, Tp ? Tp : a->n_out, 0, &f, gather ? NULL : toks,
                      gather ? 0 : a->T, dn, gather ? &places : NULL);
    if (!rc && gather)
        e->be->ops->gather_i32(e->be, e->d_meta, toks, e->d_acc + off, a->T);
    if (!rc)
        rc = Tp && e->graphs_on ? sd__target_graph_launch(e, Tp, &f, &err)
                                : sd__target_pass(e, &f, !sampled, &err);
    if (!rc && sampled && launch_dev_accept(e, a, 1))
        rc = SD_EDEVICE;
    swap_mark_bufs(e, ev);
    const sd_tokens_down down = rc ? (sd_tokens_down){0} : tokens_down(e, a->n_out, ev);
    for (int i = 0; i < s->n_seq; i++) { /* s is read next: its own places */
        req *r = s->seqs[i];
        if (!r)
            continue;
        const req_places *k = &kept[i];
        r->row0 = k->row0, r->n_rows = k->n_rows, r->out0 = k->out0, r->hrow0 = k->hrow0;
        r->n_outs = k->n_outs, r->host = k->host, r->vi = k->vi;
    }
    e->acc_n = acc_n;
    e->acc_k = acc_k;
    if (rc) {
        sd_log_debug("launch ahead: %s", err.msg[0] ? err.msg : "backend error");
        return dn->queued ? 0 : queue_down(e, dn);
    }
    e->ahead_down = down;
    e->ahead_live = 1;
    e->ahead_sampled = sampled;
    e->ahead_ev = ev;
    e->ahead_Tp = Tp;
    e->ahead_steps++;
    return 0;
}

/* Reads the step queued ahead, queueing the one after it first (without
 * the rows of requests that ended). */
static int read_ahead(sd_engine *e, uint64_t step0)
{
    step s;
    const step *a = e->ahead;
    s.T = a->T;
    s.n_out = a->n_out;
    s.n_seq = a->n_seq;
    memcpy(s.seqs, a->seqs, (size_t)a->n_seq * sizeof *s.seqs);
    step_launch L = {.Tp = e->ahead_Tp, .ev = e->ahead_ev, .queued = 1, .step0 = step0,
                     .t0 = step0, .t_up = step0, .t_launch = step0, .keys = step_keys(e, s.T)};
    e->ahead_live = 0;
    e->am_valid = !e->ahead_sampled;
    e->dev_acc = e->ahead_sampled;
    ahead_layout(e, &s);
    sd_tokens_down dn = e->ahead_down;
    int rc = ahead_ok(e, &s) ? launch_ahead(e, &s, L.Tp, L.ev ^ 1, &dn) : queue_down(e, &dn);
    sd_err err = {0};
    return read_step(e, &s, &L, rc, &err);
}

/* a row of s waits for a draft still on the device (draft ahead) */
static int drafts_on_device(const step *s)
{
    for (int i = 0; i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (r->state == RQ_DECODE && r->draft_dev && r->n_draft > 0)
            return 1;
    }
    return 0;
}

/* draft ahead, where the step cannot take them on the device: the drafts
 * come to the host (their copy is queued behind the chain, with mark 0)
 * and into the step's rows */
static int drafts_now(sd_engine *e, step *s)
{
    int rc = e->be->ops->download_wait(e->be, 0);
    for (int i = 0; i < s->n_seq && !rc; i++) {
        req *r = s->seqs[i];
        if (r->state != RQ_DECODE || !r->draft_dev)
            continue;
        sd__drafts_to_host(e, r, e->drafts_tc);
        memcpy(e->h_tok + r->row0 + 1, r->draft, (size_t)r->n_draft * sizeof(int32_t));
    }
    return rc;
}

/* One engine step. Returns 1 if work was done. */
static int engine_step(sd_engine *e)
{
    const uint64_t step0 = sd_now_ns();
    take_incoming(e);
    sd_err perr = {0};
    if (sd__plan_exchange(e, &perr)) {
        if (!e->reported_broken)
            sd_log_error("node group: %s; no more steps", perr.msg);
        e->reported_broken = 1;
        fail_all(e, "the node group failed (another node is gone)");
        return 0;
    }
    reap(e);
    /* the blocks the last step completed go to the prefix cache */
    for (int i = 0; e->pc && i < e->n_running; i++)
        pc_offer(e, e->running[i], 0);
    if (e->ahead_live)
        return read_ahead(e, step0);
    if (!e->n_running && !e->n_waiting) {
        publish_stats(e, 0);
        return 0;
    }
    step s = {0};
    int budget = e->max_batch_tokens;
    /* 1. decoding sequences: last token + drafts. Reserve first (preemption
     * reorders the running list), then lay out the rows. */
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        if (r->state != RQ_DECODE)
            continue;
        if (r->n_draft > 0 && sd_kv_seq_reserve(e->kv, &r->kv, r->n_tok + r->n_draft) != 0)
            r->n_draft = 0; /* drafts never preempt anybody */
        if (sd__engine_reserve(e, r, r->n_tok) != 0) {
            finish(e, r, SD_FINISH_ERROR, "the KV cache cannot hold this request");
            continue;
        }
        /* a preemption may have shifted the list: start over (reservations stay) */
        if (e->running[i] != r)
            i = -1;
    }
    for (int i = 0; i < e->n_running; i++) {
        req *r = e->running[i];
        r->chunk = 0;
        if (r->state != RQ_DECODE)
            continue;
        int n = 1 + r->n_draft;
        if (s.T + n > e->max_tokens || s.n_seq >= (int)SD_ARRAY_LEN(s.seqs)) {
            r->n_draft = 0;
            continue;
        }
        int32_t toks[SD_MAX_K + 1];
        toks[0] = r->tok[r->n_tok - 1];
        memcpy(toks + 1, r->draft, (size_t)r->n_draft * sizeof(int32_t));
        add_rows(e, &s, r, toks, n, r->n_tok - 1, n);
        budget -= n;
    }
    /* 2. prefill chunks: running first, then waiting requests in order */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; budget > 0 && i < (pass ? e->n_waiting : e->n_running); i++) {
            req *r = pass ? e->waiting[i] : e->running[i];
            if (pass == 0 && r->state != RQ_PREFILL)
                continue;
            if (pass == 1 && e->n_running >= e->max_batch)
                break;
            if (pass == 1 && pc_wait(e, r))
                continue;
            /* an arrival starts after the cached blocks its tokens begin with */
            int n_prop = 0;
            const int matched = pass == 1 && pc_match(e, r, &n_prop) > 0;
            int target = prefill_target(r);
            int chunk = prefill_chunk(e, &s, r, budget);
            if (chunk <= 0 || s.n_seq >= (int)SD_ARRAY_LEN(s.seqs) ||
                sd_kv_seq_reserve(e->kv, &r->kv, r->n_comp + chunk + (r->fresh ? 1 : 0)) != 0) {
                if (matched) /* it waits: its match is made again when it is admitted */
                    kv_release(e, r, 0);
                break; /* prefill never preempts: wait for blocks */
            }
            if (pass == 1) {
                list_remove(e->waiting, &e->n_waiting, r);
                i--;
                list_push(&e->running, &e->n_running, &e->cap_running, r);
                r->state = RQ_PREFILL;
                /* speculation off for now: does it pay at the batch this joins
                 * (the running requests and the ones waiting behind it: a burst
                 * of 32 arrivals is a batch of 32, not of 1, 2, 3, ...)?
                 * Every 8th request tracks the proposer anyway, so the
                 * acceptance and cost estimates keep being refreshed, unless
                 * plain steps are queued ahead (adaptive.ahead): one
                 * request tracking it stops that for the whole batch, so
                 * there the estimates are refreshed when their points age
                 * (SD_CURVE_FRESH steps) and arrivals explore again. A
                 * price of drafting not measured for a while is no reason
                 * either: it may be of the longer contexts the last
                 * requests ended at (the draft LM on the bundled model at
                 * batch 32 ran whole bursts plain on such prices; NOTES.md,
                 * session 19): the arrivals draft, and pick_k measures it
                 * again; so does a burst that arrives after idle on a
                 * verdict of zeros or on prices that say plain at its
                 * batch (they are of the last burst's contexts; its first
                 * few arrivals may explore their own batch and reset the
                 * count of zeros: sd_adaptive_admit_off). */
                int joins = SD_MIN(e->n_running + e->n_waiting, e->max_batch);
                int idle = e->n_running == 1; /* (this one) */
                const int adaptive = e->spec_k < 0 && e->spec != SD_SPEC_NGRAM;
                /* those that would draft with it: it, the arrivals
                 * waiting behind it and the running ones still tracking
                 * (its own flag is decided below) */
                r->no_spec = 0;
                const int drafting = e->n_running - n_not_drafting(e) + e->n_waiting;
                if (adaptive)
                    e->adapt.keys = next_keys(e, joins);
                r->no_spec = adaptive &&
                             sd_adaptive_admit_off(&e->adapt, &e->acc_all, joins, drafting,
                                                   e->zero_k_steps >= SD_SPEC_OFF_AFTER, idle) &&
                             (e->adapt.ahead || ++e->n_admitted_off % 8 != 0);
                /* every request drafting at this batch would pay, or would
                 * serve the output rate with fewer requests: a cohort of
                 * arrivals tracking the proposer (sd_adaptive_cohort,
                 * sd_adaptive_demand_k). The gap after a cohort holds off
                 * the first kind only: a step's price at a batch that dips
                 * and grows back starts and ends them in turn, the rate
                 * over ~1024 steps does not (with the gap on both, MTP at
                 * c = 64 on an H100 ran plain for 450 ms of a 1.6 s run
                 * after its per-step verdict turned plain at a batch of
                 * 16; NOTES.md, session 46) */
                if (r->no_spec && !e->cohort_at) {
                    int why = e->stats.steps >= e->cohort_next
                                  ? sd_adaptive_cohort(&e->adapt, &e->acc_all, joins, &e->cohort_k)
                                  : 0;
                    const int dk = why ? 0 : demand_k(e, joins);
                    if (dk) {
                        why = SD_COHORT_DEMAND;
                        e->cohort_k = dk;
                    }
                    if (why) {
                        e->cohort_at = e->stats.steps + 1;
                        e->n_cohorts++;
                        sd_log_debug("adaptive k: a cohort at batch %d (step %llu): %s", joins,
                                     (unsigned long long)e->adapt.steps,
                                     why == SD_COHORT_MEASURED
                                         ? "every request drafting pays there (measured)"
                                     : why == SD_COHORT_HOPED
                                         ? "every request drafting may pay there (hoped)"
                                         : "drafting serves the output rate with fewer requests");
                    }
                }
                if (e->cohort_at)
                    r->no_spec = 0;
                if (adaptive)
                    sd_log_debug("adaptive k: admitted at batch %d, %d drafting, %s (step %llu): %s",
                                 joins, drafting,
                                 e->zero_k_steps >= SD_SPEC_OFF_AFTER ? "plain verdict" : "drafting",
                                 (unsigned long long)e->adapt.steps,
                                 r->no_spec     ? "speculation off"
                                 : e->cohort_at ? "tracking the proposer (a cohort)"
                                                : "tracking the proposer");
                if (!r->st.queued_s)
                    r->st.queued_s = (double)(sd_now_ns() - r->t_submit) * 1e-9;
                /* one that drafts shares only blocks with its proposer's slots */
                const int refit = matched && pc_fit(e, r, n_prop);
                if (e->pc) {
                    if (!r->n_preempt)
                        r->st.cached_tokens = r->n_comp;
                    pthread_mutex_lock(&e->mu);
                    e->stats.prefix_queried_tokens += (uint64_t)target;
                    e->stats.prefix_hit_tokens += (uint64_t)r->n_comp;
                    pthread_mutex_unlock(&e->mu);
                }
                if (refit) {
                    chunk = prefill_chunk(e, &s, r, budget);
                    if (chunk <= 0 ||
                        sd_kv_seq_reserve(e->kv, &r->kv, r->n_comp + chunk + (r->fresh ? 1 : 0)))
                        continue; /* admitted; its prefill starts at a later step */
                }
            }
            int last = r->n_comp + chunk == target;
            add_rows(e, &s, r, r->tok + r->n_comp, chunk, r->n_comp,
                     r->want_plp ? chunk : last && r->fresh ? 1 : 0);
            if (r->want_plp) { /* the first token is chosen at the last row */
                r->plp_out0 = r->out0;
                r->out0 = s.n_out - 1;
            }
            r->chunk = chunk;
            budget -= chunk;
        }
    }
    if (s.T == 0) {
        publish_stats(e, 0);
        return e->n_running > 0;
    }
    /* 3. target forward. A decode/verify step (every row wants logits) is
     * padded to its bucket and replays that bucket's graph (graphs.c). */
    /* a request that wants its tokens' log probabilities, or whose logits
     * a processor changes (bias, penalties, JSON, min_tokens): its logits
     * rows come to the host, and its tokens are chosen there (nothing is
     * queued ahead of the step); the other requests' are chosen on the
     * device as ever (the argmax, or the device's acceptance), unless none
     * is left */
    int greedy_only = 1, host_logits = 0, n_dev = 0;
    for (int i = 0; i < s.n_seq; i++) {
        const req *r = s.seqs[i];
        host_logits |= r->host;
        greedy_only &= r->host || r->greedy;
        n_dev += !r->host && r->n_outs > 0;
    }
    if (host_logits && !n_dev)
        greedy_only = 0;
    /* the proposer's hidden states: only while a request of the step
     * tracks it (speculation off, a step skips the copies: on the bundled
     * model's 0.2 ms steps EAGLE-3's three were ~4%) */
    int hidden = 0;
    for (int i = 0; i < s.n_seq && !hidden; i++)
        hidden = !s.seqs[i]->no_spec;
    e->plain_steps += !hidden && sd__spec_wants_hidden(e);
    /* a step with prompt rows is padded too where it is small enough, and
     * its logits rows (the padding's point at its last row) to No; only a
     * decode or verify step (every row wants logits) replays the decode
     * graphs, which exist up to graph_max_T rows */
    const int decode = s.n_out == s.T;
    sd_mgraph *mg = NULL;
    int No = 0;
    int Tp = decode ? sd__graph_bucket(e, s.T)
                    : sd__mixed_bucket(e, s.T, s.n_out, hidden, &No, &mg);
    if (Tp) {
        sd__pad_rows(e, e->h_tok, e->h_pos, e->h_seq, e->h_slot, s.T, Tp);
        if (decode) {
            No = Tp;
            for (int i = s.T; i < Tp; i++)
                e->h_rows[i] = i;
        } else {
            for (int i = s.n_out; i < No; i++)
                e->h_rows[i] = Tp - 1;
        }
    }
    sd_fwd f;
    sd_err err = {0};
    uint64_t t0 = sd_now_ns();
    /* draft ahead: rows whose drafts are still on the device take them
     * there (greedy steps, and sampled ones that verify on the device,
     * which take the drafts from the step's gathered tokens; a step the
     * host verifies brings them to the host first) */
    const int Tn = Tp ? Tp : s.T;
    sd_copy vcp;
    int rc = 0, gather = 0, graphed = 0;
    if (drafts_on_device(&s)) {
        gather = e->be->ops->gather_i32 && !host_logits && (greedy_only || dev_q_kind(e, &s) >= 0);
        if (gather)
            vcp = sd__drafts_gather_copy(e, &s, Tn);
        else
            rc = drafts_now(e, &s);
    }
    /* A step that takes its drafts on the device is queued while the
     * chain runs: it uploads from mark 1's page-locked buffers, all in the
     * one copies launch (e->h_table is pageable: copied by the driver, which
     * may wait for the stream). No earlier step is queued on them: the
     * chain ran with none queued ahead, and the step before was read. */
    if (gather)
        swap_mark_bufs(e, 1);
    if (!rc)
        rc = put_step(e, &s, Tn, Tp ? No : s.n_out, hidden, &f, NULL, 0, NULL,
                      gather ? &vcp : NULL);
    if (gather)
        swap_mark_bufs(e, 1);
    if (!rc && gather) {
        sd__drafts_gather(e, e->d_meta, Tn);
        e->draft_ahead_steps++;
    }
    uint64_t t_up = sd_now_ns();
    /* Only greedy requests in the step: the argmax is taken where the logits
     * are, and only token ids cross to the host. */
    e->am_valid = 0;
    if (rc) {
    } else if (Tp && e->graphs_on && decode) {
        rc = sd__target_graph_launch(e, Tp, &f, &err); /* the graph's pass takes the argmax */
        e->am_valid = greedy_only;
        graphed = !rc;
    } else if (mg) {
        const int eager = !mg->seen; /* a key's first run is eager */
        rc = sd__mixed_launch(e, mg, &f, greedy_only, &err);
        e->am_valid = greedy_only && e->be->ops->argmax_rows;
        graphed = !rc && !eager;
    } else {
        rc = sd__target_pass(e, &f, greedy_only, &err);
        e->am_valid = greedy_only && e->be->ops->argmax_rows;
    }
    /* a sampled step that took its drafts on the device verifies there
     * from mark 1's page-locked buffers too (an upload from pageable
     * memory may wait for the chain queued before it) */
    if (gather)
        swap_mark_bufs(e, 1);
    e->dev_acc = !rc && !greedy_only && n_dev > 0 && !launch_dev_accept(e, &s, 0);
    if (gather)
        swap_mark_bufs(e, 1);
    if (!decode) {
        e->prompt_steps++;
        e->prompt_padded_steps += Tp > 0;
        e->prompt_graph_steps += graphed;
    }
    step_launch L = {.Tp = Tp, .ev = -1, .gathered = gather, .step0 = step0, .t0 = t0, .t_up = t_up,
                     .graph = graphed,
                     .t_launch = sd_now_ns(), .keys = step_keys(e, s.T)};
    /* tokens on the device (the argmax, or the device's acceptance) come
     * down queued behind the step, with mark 0: the host's wait for the
     * step brings them, where a sync and then a download took a second
     * round trip (every speculative step's); the next step is queued
     * ahead where nothing but these tokens can change it */
    if (!rc && (e->am_valid || e->dev_acc) && e->be->ops->download_async &&
        e->be->ops->download_wait) {
        sd_tokens_down dn = tokens_down(e, s.n_out, 0);
        if (!(ahead_ok(e, &s) ? launch_ahead(e, &s, Tp, 1, &dn) : queue_down(e, &dn)))
            L.ev = 0;
    } else if (!rc) {
        ahead_ok(e, &s); /* not queued ahead: counted by why (its tokens on the host) */
    }
    return read_step(e, &s, &L, rc, &err);
}

/* Brings logits rows row0 .. row0 + n - 1 of a step to the host (h_logits) */
static int logits_down(sd_engine *e, int row0, int n)
{
    const size_t off = (size_t)row0 * (size_t)e->V;
    e->host_rows += (uint64_t)n;
    return e->be->ops->download(e->be, e->h_logits + off, e->d_logits + off,
                                (size_t)n * (size_t)e->V * sizeof(float));
}

/* Waits for a queued target step, accepts / samples / streams its tokens,
 * then lets the proposer draft. rc: the launch's. Returns 1. */
static int read_step(sd_engine *e, step *s, const step_launch *L, int rc, sd_err *err)
{
    if (!rc && L->ev >= 0) {
        rc = e->be->ops->download_wait(e->be, L->ev); /* its tokens are there too */
        e->h_am = e->h_am_ev[L->ev];
        if (!rc && e->dev_acc)
            unpack_dev_accept(e, e->h_accraw_ev[L->ev]);
    } else if (!rc) {
        rc = e->be->ops->sync(e->be);
    }
    uint64_t t_run = sd_now_ns(), rows0 = e->host_rows;
    if (!rc && L->ev < 0) { /* a marked step's tokens came down with its mark */
        if (e->am_valid)
            rc = e->be->ops->download(e->be, e->h_am, e->d_am, (size_t)s->n_out * sizeof(int32_t));
        else if (e->dev_acc)
            rc = fetch_dev_accept(e);
        else
            rc = logits_down(e, 0, s->n_out);
    }
    /* tokens chosen on the device: the rest of the step's requests' logits
     * rows come down, each run of adjacent ones in one copy */
    for (int i = 0; !rc && (e->am_valid || e->dev_acc) && i < s->n_seq; i++) {
        const req *r = s->seqs[i];
        if (!r || !r->host)
            continue;
        int lo = r->hrow0, hi = lo + r->n_outs;
        while (i + 1 < s->n_seq && s->seqs[i + 1] && s->seqs[i + 1]->host &&
               s->seqs[i + 1]->hrow0 == hi)
            hi += s->seqs[++i]->n_outs;
        rc = logits_down(e, lo, hi - lo);
    }
    e->host_steps += e->host_rows > rows0;
    uint64_t t_end = sd_now_ns();
    double t_target = (double)(t_end - L->t0) * 1e-9;
    if (sd_log_level() >= SD_LOG_DEBUG) {
        sd_log_debug("target step: %d rows of %d requests (%s %d): upload %.3f, launch %.3f, "
                     "run %.3f, download %.3f ms, %lld keys",
                     s->T, s->n_seq,
                     L->queued ? "ahead" : L->graph ? "graph" : "eager",
                     L->Tp ? L->Tp : s->T,
                     1e-6 * (double)(L->t_up - L->t0), 1e-6 * (double)(L->t_launch - L->t_up),
                     1e-6 * (double)(t_run - L->t_launch), 1e-6 * (double)(t_end - t_run),
                     L->keys);
    }
    pthread_mutex_lock(&e->mu);
    if (rc) {
        e->stats.failed_steps++;
        e->stats.failing++;
    } else {
        e->stats.failing = 0;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        sd_log_error("target step failed: %s", err->msg[0] ? err->msg : "backend error");
        for (int i = 0; i < s->n_seq; i++)
            if (s->seqs[i])
                finish(e, s->seqs[i], SD_FINISH_ERROR, "the model step failed");
        reap(e);
        return 1;
    }
    /* adaptive k models decode and verify steps: a step with prompt rows
     * is another cost curve (long rows, eager) */
    int prompt_rows = 0;
    for (int i = 0; i < s->n_seq; i++)
        prompt_rows += s->seqs[i] ? s->seqs[i]->chunk : 0;
    /* a step queued ahead: another curve, of the interval between the step
     * before's tokens and its own (what plain decode costs where it runs
     * ahead; its own time starts after the host's work on the step before,
     * which a batch of 1 on an H200 does not hide: 0.157-0.174 ms against
     * 0.170 a step; NOTES.md, session 30), or its own time where the step
     * before was of another batch; with the keys its rows read (its price
     * follows the context: sd_adaptive.keys) */
    const int after_read = e->last_read_ns && e->last_read_n == s->n_seq && t_end > e->last_read_ns;
    if (!prompt_rows && !L->gathered) { /* (gathered: it ran during its drafting phase) */
        double t = t_target;
        if (L->queued && after_read)
            t = SD_MAX(t, (double)(t_end - e->last_read_ns) * 1e-9);
        sd__plan_observe(e, L->queued ? SD_OBS_AHEAD : SD_OBS_TARGET, s->T, s->n_seq, t, L->keys);
    }
    /* a step that took its drafts on the device: the interval from the
     * step before's tokens to its own is what a drafting step costs where
     * its phase runs ahead (the host's work, the phase and this step on the
     * device one after another, no wait between them), which the phase and
     * its verify step timed apart, each waited for, leave the host's work
     * out of (on an H100 the interval was 0.01 ms longer than the two on
     * average; NOTES.md, session 48) */
    if (!prompt_rows && L->gathered && e->dahead_k > 0 && e->dahead_n == s->n_seq && after_read) {
        sd__plan_observe(e, SD_OBS_DRAFT_AHEAD, e->dahead_nd, s->n_seq,
                         (double)(t_end - e->last_read_ns) * 1e-9, e->dahead_k);
        e->draft_ahead_timed++;
    }
    e->dahead_k = 0;
    e->last_read_ns = prompt_rows ? 0 : t_end;
    e->last_read_n = s->n_seq;
    e->verify_s_total += t_target;
    double t_draft = 0; /* the drafting phase's part of the step */
    /* 4. accept / sample / stream */
    for (int i = 0; i < s->n_seq; i++) {
        req *r = s->seqs[i];
        if (!r || r->state == RQ_DONE) /* NULL: ended before this step queued ahead was read */
            continue;
        int from = r->n_tok;
        if (r->state == RQ_DECODE) {
            r->st.spec.verify_s += t_target;
            if (r->draft_dev) /* their copy came down before the step's tokens */
                sd__drafts_to_host(e, r, e->drafts_tc);
            int n = accept_decode(e, r, e->h_logits,
                                  e->dev_acc && !r->host ? dev_result(e, r) : NULL);
            if (n < 0) {
                finish(e, r, SD_FINISH_ERROR, "verification failed");
                continue;
            }
            r->n_draft = 0;
            emit(e, r, from);
        } else {
            if (r->want_plp && prompt_logprobs(e, r)) {
                finish(e, r, SD_FINISH_ERROR, "out of memory");
                continue;
            }
            r->n_comp += r->chunk;
            int target = prefill_target(r);
            if (r->n_comp == target) {
                r->state = RQ_DECODE;
                if (r->fresh && r->max_tokens == 0) { /* the prompt alone (its logprobs) */
                    finish(e, r, SD_FINISH_LENGTH, NULL);
                    continue;
                }
                if (r->fresh) {
                    r->fresh = 0;
                    if (e->dev_acc && !r->host ? push_tok(r, dev_result(e, r)[1])
                                   : sample_one(e, r, e->h_logits + (size_t)r->out0 * e->V)) {
                        finish(e, r, SD_FINISH_ERROR, "out of memory");
                        continue;
                    }
                    emit(e, r, from);
                }
            }
        }
        if (r->state != RQ_DONE)
            sd_kv_seq_truncate(e->kv, &r->kv, r->n_tok);
    }
    pthread_mutex_lock(&e->mu);
    e->stats.prompt_tokens += (uint64_t)prompt_rows;
    pthread_mutex_unlock(&e->mu);
    /* 5. the proposer catches up and drafts (none of a step read ahead's
     * requests tracks it; those that ended are no longer in it) */
    int live = 0;
    for (int i = 0; i < s->n_seq; i++)
        if (s->seqs[i])
            s->seqs[live++] = s->seqs[i];
    s->n_seq = live;
    if (e->spec != SD_SPEC_NONE) {
        int off = n_not_drafting(e);
        if (e->spec_k < 0 && e->adapt.ahead && e->spec != SD_SPEC_NGRAM) /* (demand_k's) */
            demand_update(e, prompt_rows > 0);
        cohort_step(e, off);
        int why_k = -1;
        int k = e->spec_k >= 0 ? e->spec_k : adaptive_step_k(e, off, &why_k);
        /* Adaptive: when drafting has not paid for a while, the running
         * requests stop tracking the proposer (its catch-up pass costs too);
         * they finish as plain decode. New requests decide on admission. */
        if (e->spec_k < 0) {
            /* a k = 0 that measures a cost (exploration) is no verdict.
             * Where plain steps are queued ahead and priced (a GPU's
             * engine) an exploration's steps, at any k, leave the count as
             * it was: reset, every arrival's exploration of its batch
             * bucket (Poisson arrivals move the batch at every few steps)
             * made the running requests track the proposer again for
             * SD_SPEC_OFF_AFTER steps, and a tracking request stops launch
             * ahead ("tracking": 742-771 of ~4600 MTP steps at c = 64 on
             * the H100, NOTES.md, session 42) */
            /* (a demand pick is never an exploration's) */
            if (why_k == SD_KWHY_COHORT || !e->adapt.exploring)
                e->zero_k_steps = k == 0 ? e->zero_k_steps + 1 : 0;
            else if (!e->adapt.ahead)
                e->zero_k_steps = 0;
            /* n-gram lookup keeps no state to catch up on: its k = 0 costs
             * nothing. Where plain steps are queued ahead and priced (a
             * GPU's engine) arrivals are admitted off while the verdict is
             * plain, and the ones that track the proposer anyway (admitted
             * at a batch not yet priced, or while prices were measured
             * again) stop tracking it at every step of that verdict, not
             * only at its start: as probes (below) their verify steps
             * stopped launch ahead for the whole batch (on the H200 under
             * Poisson arrivals 1211-2681 of a speculative server's
             * ~2500-3300 drafting steps, 9-30 requests waiting in each;
             * NOTES.md, session 34). Explorations and refreshes keep the
             * acceptance estimate fresh there: a pick that explores by
             * drafting keeps its trackers for its steps (turned off at
             * that pick, they measured nothing, and each arrival at a
             * batch not priced explored it again at a step not queued
             * ahead: EAGLE-3 at c = 16 on an H100, 395 times in 6900
             * steps; NOTES.md, session 47) */
            const int off_after = !e->cohort_at && !(e->adapt.exploring && k > 0) &&
                                  (e->zero_k_steps == SD_SPEC_OFF_AFTER ||
                                   (e->adapt.ahead && e->zero_k_steps > SD_SPEC_OFF_AFTER &&
                                    off < e->n_running));
            const int turns_off = off_after && e->spec != SD_SPEC_NGRAM;
            if (turns_off || off < e->n_running) /* (all off: no verdict) */
                sd_cohort_gap_verdict(&e->cohort_gap, e->stats.steps, turns_off);
            if (turns_off) {
                sd_log_debug("adaptive k: 0 for %d steps: speculation off for the %d running requests",
                             e->zero_k_steps, e->n_running);
                for (int i = 0; i < e->n_running; i++)
                    e->running[i]->no_spec = 1;
                off = e->n_running;
            }
        }
        /* Speculation off (without launch ahead priced: the CPU): the few
         * requests still tracking the proposer (one admitted in 8) pay its
         * catch-up pass anyway, which yields their first draft: they draft
         * that one, a row each to verify, and keep the acceptance estimate
         * fresh. Their drafting time is not a drafting cost of the whole
         * batch, so it is not observed. */
        int probe = e->spec_k < 0 && k == 0 && e->spec != SD_SPEC_NGRAM && !e->cohort_at &&
                    e->zero_k_steps >= SD_SPEC_OFF_AFTER && off < e->n_running;
        if (probe)
            k = 1;
        pthread_mutex_lock(&e->mu);
        e->stats.spec_k_last = k;
        e->stats.spec_k_steps[k < 16 ? k : 16]++;
        pthread_mutex_unlock(&e->mu);
        /* draft ahead, except where adaptive k needs this phase's time and
         * its verify step's (the two overlap when the host does not wait),
         * and every 8th drafting phase (the points age: SD_CURVE_STALE) */
        e->draft_sync = e->spec_k < 0 && !probe && !prompt_rows &&
                        (e->draft_phases % 8 == 7 ||
                         sd_adaptive_wants_times(&e->adapt, e->n_running, e->n_running - off, k));
        uint64_t d0 = sd_now_ns(), oneoff0 = e->prop_oneoff;
        rc = sd__spec_step(e, s, k, err);
        int oneoff = e->prop_oneoff != oneoff0;
        t_draft = (double)(sd_now_ns() - d0) * 1e-9;
        if (rc) {
            sd_log_error("proposer failed: %s", err->msg);
            for (int i = 0; i < s->n_seq; i++)
                s->seqs[i]->n_draft = 0;
        }
        int nd = 0, went_ahead = 0;
        for (int i = 0; i < s->n_seq; i++)
            if (s->seqs[i]->n_draft) {
                s->seqs[i]->st.spec.draft_s += t_draft;
                went_ahead |= s->seqs[i]->draft_dev;
                nd++;
            }
        /* why it drafted, and the running requests that wait for it without drafting */
        if (nd > 0) {
            const int why = e->spec_k >= 0 ? SD_KWHY_FIXED
                            : probe        ? SD_KWHY_PROBE
                            : why_k >= 0   ? why_k
                                           : e->adapt.why;
            int waiting = 0; /* (not the ones this step ended: reap() takes them next) */
            for (int i = 0; i < e->n_running; i++)
                waiting += e->running[i]->state != RQ_DONE;
            e->kwhy_steps[why]++;
            e->kwhy_idle[why] += (uint64_t)SD_MAX(waiting - nd, 0);
        }
        /* adaptive k learns a drafting phase's cost from the steps it
         * learns the target's from: none with prompt rows, whose catch-up
         * pass runs the prompt chunk through the proposer (on a fresh
         * batch those were most of k = 1's first times, and the inflated
         * point turned speculation off for good: NOTES.md, session 11);
         * and none with a proposer pass that was its graph shape's first
         * run or capture (a batch's tail: each finish gives a new shape,
         * and on the H200 the bundled model's k = 2..4 phases were learnt
         * at twice their cost there, which turned speculation off for the
         * next batch: NOTES.md, session 12) */
        if (nd > 0) {
            e->draft_phases++;
            int learnable = !probe && !prompt_rows && !went_ahead;
            if (!probe && !prompt_rows && went_ahead && !oneoff) {
                e->dahead_n = s->n_seq;
                e->dahead_nd = nd;
                e->dahead_k = k;
            }
            if (learnable && oneoff) {
                e->draft_oneoff++;
            } else if (learnable) {
                sd__plan_observe(e, SD_OBS_DRAFT, nd, k, t_draft, 0);
                e->draft_observed++;
            }
        }
        e->draft_s_total += t_draft;
    }
    reap(e);
    /* the rest of the step's wall time (scheduling, accepting, streaming):
     * 0.01-0.03 ms a step on the H200 with the bundled model at batch 8-32,
     * against 0.3-0.9 ms of target and drafting; summed before the stats
     * go out, so they hold this step's */
    double t_host = (double)(sd_now_ns() - L->step0) * 1e-9 - t_target - t_draft;
    e->host_s_total += t_host > 0 ? t_host : 0;
    /* what queueing ahead would have hidden of a step read one at a time:
     * its upload and launch, its download (adaptive k prices a queued-ahead
     * plain step with it until one is measured). Not the host's work around
     * it: the step's time (t_target) leaves that out already, as a
     * queued-ahead step's does; counted twice, the bundled model's plain
     * step at batch 32 on an H200 was priced at 0.26-0.28 ms where queued
     * ahead it took 0.33, and MTP, 1.08x plain there, went off in its first
     * burst (NOTES.md, session 20). */
    if (!L->queued && !prompt_rows && e->adapt.ahead)
        sd__plan_observe(e, SD_OBS_HIDDEN, 1, s->n_seq,
                         (double)(L->t_launch - L->t0 + t_end - t_run) * 1e-9, 0);
    publish_stats(e, 1);
    return 1;
}

/* ------------------------------------------------------------------ ranks */

struct fwd_job {
    sd_engine *e;
    int which;
    const sd_fwd *f;
};

/* one rank's pass: the step's addresses mapped to the rank's buffers */
static int fwd_rank(void *ctx, int r, sd_err *err)
{
    struct fwd_job *j = ctx;
    sd_engine *e = j->e;
    sd_fwd f = *j->f;
    if (e->tp) {
        sd_tp *t = e->tp;
#define MAP(p) (p) = (__typeof__(p))(uintptr_t)sd__tp_map(t, (p), r)
        MAP(f.ab.pos);
        MAP(f.ab.seq);
        MAP(f.ab.slot);
        MAP(f.ab.block_table);
        MAP(f.tokens);
        MAP(f.out_rows);
        MAP(f.logits);
        MAP(f.hidden);
        MAP(f.aux);
        MAP(f.in_hidden);
        MAP(f.out_hidden);
#undef MAP
    }
    switch (j->which) {
    case SD_FWD_TARGET: return sd_model_forward(e->targets[r], &f, err);
    case SD_FWD_MTP: return sd_model_mtp_forward(e->targets[r], &f, err);
    case SD_FWD_DRAFT: return sd_model_forward(e->drafts[r], &f, err);
    default: return sd_eagle3_forward(e->eagles[r], &f, j->which == SD_FWD_EAGLE_FIRST, err);
    }
}

int sd__fwd(sd_engine *e, int which, const sd_fwd *f, sd_err *err)
{
    struct fwd_job j = {e, which, f};
    if (!e->tp)
        return fwd_rank(&j, 0, err);
    return sd__tp_each(e->tp, fwd_rank, &j, err);
}

struct each_job {
    sd_engine *e;
    int (*fn)(sd_engine *, void *, sd_err *);
    void *ctx;
};

static int each_rank(void *ctx, int r, sd_err *err)
{
    (void)r;
    struct each_job *j = ctx;
    return j->fn(j->e, j->ctx, err);
}

int sd__engine_each(sd_engine *e, int (*fn)(sd_engine *e, void *ctx, sd_err *err), void *ctx,
                    sd_err *err)
{
    if (!e->tp)
        return fn(e, ctx, err);
    struct each_job j = {e, fn, ctx};
    return sd__tp_each(e->tp, each_rank, &j, err);
}

/* ------------------------------------------------------------------ thread */

/* CLOCK_REALTIME secs from now, for pthread_cond_timedwait */
static struct timespec deadline_in(double secs)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(secs * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

static void *engine_main(void *arg)
{
    sd_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int quit = e->quit;
        pthread_mutex_unlock(&e->mu);
        if (quit)
            break;
        if (engine_step(e))
            continue;
        if (e->follower) {
            if (e->broken)
                break; /* node 0 is gone: this node has nothing to follow */
            continue;  /* the next plan paces this node */
        }
        pthread_mutex_lock(&e->mu);
        if (!e->incoming && !e->quit) {
            struct timespec ts = deadline_in(0.05);
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        pthread_mutex_unlock(&e->mu);
    }
    if (e->ahead_live && !queue_down(e, &e->ahead_down)) /* its buffers outlive it */
        e->be->ops->download_wait(e->be, e->ahead_ev);
    else if (e->ahead_live)
        e->be->ops->sync(e->be);
    e->ahead_live = 0;
    sd__plan_send_quit(e);
    /* cancel what is left */
    take_incoming(e);
    end_all(e, SD_FINISH_CANCELLED, NULL);
    pthread_mutex_lock(&e->mu);
    e->stopped = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int sd_engine_follows(const sd_engine *e) { return e->follower; }

int sd_engine_wait(sd_engine *e, double timeout_s)
{
    struct timespec ts = deadline_in(timeout_s > 0 ? timeout_s : 0);
    int timed_out = 0;
    pthread_mutex_lock(&e->mu);
    while (!e->stopped && !timed_out)
        timed_out = timeout_s > 0 ? pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT
                                  : (pthread_cond_wait(&e->cv, &e->mu), 0);
    int stopped = e->stopped;
    pthread_mutex_unlock(&e->mu);
    return !stopped ? 1 : e->broken ? SD_EIO : 0;
}

/* ------------------------------------------------------------------ public */

/* sd__host_buf: a 64-byte header (which allocator) before the buffer; no
 * more than HOST_PIN_MAX bytes a buffer page-locked (a large vocabulary's
 * logits rows for every sequence would lock GBs of host memory for copies
 * a greedy step never makes) */
#define HOST_BUF_HEAD 64
#define HOST_PIN_MAX ((size_t)64 << 20)

void *sd__host_buf(sd_engine *e, size_t bytes)
{
    const sd_ops *op = e->be->ops;
    int pinned = 1;
    char *raw = op->host_alloc && bytes <= HOST_PIN_MAX
                    ? op->host_alloc(e->be, bytes + HOST_BUF_HEAD)
                    : NULL;
    if (!raw) {
        pinned = 0;
        raw = malloc(bytes + HOST_BUF_HEAD);
    }
    if (!raw)
        return NULL;
    memcpy(raw, &pinned, sizeof pinned);
    return raw + HOST_BUF_HEAD;
}

void sd__host_buf_free(sd_engine *e, void *p)
{
    if (!p)
        return;
    char *raw = (char *)p - HOST_BUF_HEAD;
    int pinned;
    memcpy(&pinned, raw, sizeof pinned);
    if (pinned)
        e->be->ops->host_free(e->be, raw);
    else
        free(raw);
}

static int alloc_step_buffers(sd_engine *e, sd_err *err)
{
    const sd_ops *op = e->be->ops;
    size_t T = (size_t)e->max_tokens;
    size_t tb = (size_t)e->ov_max_seqs * (size_t)e->max_blocks;
    e->d_meta = op->alloc(e->be, 5 * T * 4);
    e->h_meta = sd__host_buf(e, 5 * T * 4);
    e->d_table = op->alloc(e->be, tb * 4);
    /* logits rows: every sequence's last token and drafts at most */
    size_t ov = (size_t)e->ov_max_seqs, O = ov * (size_t)(e->k_max + 1);
    if (O > T)
        O = T;
    e->max_out = (int)O;
    e->d_logits = op->alloc(e->be, O * (size_t)e->V * 4);
    e->d_probs = op->alloc(e->be, O * (size_t)e->V * 4);
    if (e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3 || e->spec == SD_SPEC_DRAFT)
        e->d_q = op->alloc(e->be, ov * (size_t)e->k_max * (size_t)e->V * 4);
    e->d_acc = op->alloc(e->be, acc_ints(ov) * 4);
    e->h_acc = malloc(acc_ints(ov) * 4);
    e->h_acc_res = malloc(ov * (SD_MAX_K + 2) * 4);
    e->d_sp = op->alloc(e->be, ov * sizeof(sd_sample_params));
    e->h_sp = malloc(ov * sizeof(sd_sample_params));
    if (!e->d_probs || !e->d_acc || !e->h_acc || !e->h_acc_res || !e->d_sp || !e->h_sp ||
        (e->k_max > 0 && e->spec != SD_SPEC_NONE && e->spec != SD_SPEC_NGRAM && !e->d_q))
        return sd_err_set(err, SD_ENOMEM, "engine: out of memory for the verification buffers");
    e->d_hidden = op->alloc(e->be, T * (size_t)e->D * 4);
    e->d_am = op->alloc(e->be, T * 4);
    for (int i = 0; i < 2; i++) {
        e->h_am_ev[i] = sd__host_buf(e, T * 4);
        e->h_meta_ev[i] = sd__host_buf(e, 5 * T * 4);
        e->h_table_ev[i] = sd__host_buf(e, tb * 4);
        e->h_accraw_ev[i] = sd__host_buf(e, ov * (SD_MAX_K + 2) * 4);
        e->h_acc_ev[i] = sd__host_buf(e, acc_ints(ov) * 4);
        e->h_sp_ev[i] = sd__host_buf(e, ov * sizeof(sd_sample_params));
        if (!e->h_am_ev[i] || !e->h_meta_ev[i] || !e->h_table_ev[i] || !e->h_accraw_ev[i] ||
            !e->h_acc_ev[i] || !e->h_sp_ev[i])
            return sd_err_set(err, SD_ENOMEM, "engine: out of memory for the step buffers");
    }
    e->h_am = e->h_am_ev[0];
    e->ahead = malloc(sizeof *e->ahead);
    e->h_tok = malloc(T * 4);
    e->h_pos = malloc(T * 4);
    e->h_seq = malloc(T * 4);
    e->h_slot = malloc(T * 4);
    e->h_rows = malloc(T * 4);
    e->h_table = malloc(tb * 4);
    e->h_logits = sd__host_buf(e, O * (size_t)e->V * 4);
    e->p_rows = malloc((size_t)(SD_MAX_K + 1) * (size_t)e->V * 4);
    if (!e->d_meta || !e->h_meta || !e->d_table ||
        !e->d_logits || !e->d_hidden || !e->d_am || !e->h_am || !e->h_tok || !e->h_pos || !e->h_seq || !e->h_slot ||
        !e->h_rows || !e->h_table || !e->h_logits || !e->p_rows || !e->ahead)
        return sd_err_set(err, SD_ENOMEM, "engine: out of memory for the step buffers");
    return 0;
}

static void free_step_buffers(sd_engine *e)
{
    void *dev[] = {e->d_meta, e->d_table, e->d_logits, e->d_hidden, e->d_aux, e->d_am,
                   e->d_probs, e->d_q, e->d_acc, e->d_sp};
    for (size_t i = 0; i < SD_ARRAY_LEN(dev); i++)
        if (dev[i])
            e->be->ops->free(e->be, dev[i]);
    sd__host_buf_free(e, e->h_meta);
    free(e->h_tok);
    free(e->h_pos);
    free(e->h_seq);
    free(e->h_slot);
    free(e->h_rows);
    free(e->h_table);
    sd__host_buf_free(e, e->h_logits);
    for (int i = 0; i < 2; i++) {
        sd__host_buf_free(e, e->h_am_ev[i]);
        sd__host_buf_free(e, e->h_meta_ev[i]);
        sd__host_buf_free(e, e->h_table_ev[i]);
        sd__host_buf_free(e, e->h_accraw_ev[i]);
        sd__host_buf_free(e, e->h_acc_ev[i]);
        sd__host_buf_free(e, e->h_sp_ev[i]);
    }
    free(e->ahead);
    free(e->h_acc);
    free(e->h_acc_res);
    free(e->h_sp);
    free(e->p_rows);
}

static int spec_of(const char *s)
{
    if (!s || !strcmp(s, "none"))
        return SD_SPEC_NONE;
    if (!strcmp(s, "mtp"))
        return SD_SPEC_MTP;
    if (!strcmp(s, "eagle3"))
        return SD_SPEC_EAGLE3;
    if (!strcmp(s, "draft"))
        return SD_SPEC_DRAFT;
    return SD_SPEC_NGRAM;
}

int sd_engine_create(sd_engine **out, const sd_opts *o, sd_err *err)
{
    *out = NULL;
    sd_engine *e = calloc(1, sizeof *e);
    if (!e)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    int rc;
    const char *dir = sd_opts_model_dir(o);
    snprintf(e->model_dir, sizeof e->model_dir, "%s", dir);
    if (o->served_model_name && o->served_model_name[0]) {
        snprintf(e->model_name, sizeof e->model_name, "%s", o->served_model_name);
    } else {
        const char *base = strrchr(dir, '/');
        base = base && base[1] ? base + 1 : dir;
        snprintf(e->model_name, sizeof e->model_name, "%s", base);
        size_t l = strlen(e->model_name);
        if (l > 1 && e->model_name[l - 1] == '/')
            e->model_name[l - 1] = 0;
    }
    e->spec = spec_of(o->spec);
    e->spec_k = o->spec_k;
    if ((rc = sd_synthetic_parse(&e->synth, o->synthetic_accept, err)))
        goto fail;
    if (e->synth.n > 0)
        sd_log_warn("--synthetic-accept %s: drafts are accepted at random, NOT verified: the "
                    "output is not the model's (benchmarks only)", o->synthetic_accept);
    e->k_max = o->spec_k >= 0 ? o->spec_k : 4;
    if (e->k_max > SD_MAX_K - 1)
        e->k_max = SD_MAX_K - 1;
    e->max_batch = o->max_batch;
    e->max_batch_tokens = o->max_batch_tokens;
    /* block-table rows: a step's sequences (at most max_batch, plus one
     * finishing), and the padding row last */
    e->ov_max_seqs = o->max_batch + 2;
    e->pad_seq = e->ov_max_seqs - 1;
    e->n_ranks = o->tp > 1 ? o->tp / (o->nnodes > 1 ? o->nnodes : 1) : 1; /* this node's */
    e->stats.tp = o->tp > 1 ? o->tp : 1;
    e->stats.spec_k_last = -1;
    if (o->tp > 1) {
        sd_model_cfg pre;
        if ((rc = sd_model_cfg_load(&pre, dir, err)) ||
            (rc = sd__tp_open(&e->tp, o, pre.hidden_size, err)))
            goto fail;
        e->be = sd__tp_backend(e->tp);
        e->nodes = sd__tp_nodes(e->tp);
        e->node_rank = o->node_rank;
        e->follower = e->nodes && o->node_rank > 0;
    } else if ((rc = sd_backend_open(&e->be, o, err))) {
        goto fail;
    }
    if (o->profile_ops) {
        if (e->tp) {
            rc = sd_err_set(err, SD_ENOTSUP, "--profile-ops: one rank only (not with --tp)");
            goto fail;
        }
        sd_backend *pb = NULL;
        if ((rc = sd_prof_backend_wrap(&pb, e->be))) {
            rc = sd_err_set(err, rc, "--profile-ops: out of memory");
            goto fail;
        }
        e->prof_inner = e->be;
        e->be = pb; /* it has no graphs: every op runs, and is timed, eagerly */
    }
    e->max_tokens = o->max_batch_tokens + o->max_batch * (e->k_max + 1);
    for (int r = 0; r < e->n_ranks; r++) {
        sd_model_opts mo = {.max_tokens = e->max_tokens, .load_mtp = e->spec == SD_SPEC_MTP,
                            .ep = o->ep, .moe_shared_slots = o->moe_shared_slots,
                            .fp8_keep = sd_opts_fp8_keep(o)};
        if (e->tp) {
            mo.tp_rank = sd__tp_rank0(e->tp) + r;
            mo.tp_size = sd__tp_total(e->tp);
            mo.comm = sd__tp_comm(e->tp);
        }
        if ((rc = sd_model_load(&e->targets[r], dir, e->tp ? sd__tp_rank_backend(e->tp, r) : e->be,
                                &mo, err)))
            goto fail;
    }
    e->target = e->targets[0];
    e->stats.ep = sd_model_expert_parallel(e->target);
    if (e->stats.ep)
        sd_log_info("expert parallel: the routed experts split whole over %d ranks", o->tp);
    const sd_model_cfg *c = sd_model_cfg_of(e->target);
    if (e->spec == SD_SPEC_MTP && !sd_model_has_mtp(e->target)) {
        rc = sd_err_set(err, SD_EINVAL, "--spec mtp: %s has no MTP layer (num_nextn_predict_layers)",
                        dir);
        goto fail;
    }
    e->V = c->vocab_size;
    e->D = c->hidden_size;
    /* A checkpoint without a tokenizer (tokenizer.json or tiktoken.model) runs
     * on token ids alone. */
    if (sd_tok_present(dir) && (rc = sd_tok_load(&e->tok, dir, err))) {
        sd_err_prefix(err, "tokenizer: ");
        goto fail;
    }
    if (e->tok && sd_tok_vocab_size(e->tok) > e->V) {
        rc = sd_err_set(err, SD_EFORMAT, "%s: the tokenizer has %d ids, the model's vocab_size is %d",
                        dir, sd_tok_vocab_size(e->tok), e->V);
        goto fail;
    }
    /* the vocabulary's bytes for the JSON masks (response_format) */
    if (e->tok && (sd_token_table_build(&e->tt, e->V, jt_bytes, e) ||
                   sd_mask_cache_create(&e->mcache, &e->tt, SD_MASK_CACHE_BYTES) ||
                   sd_schema_cache_create(&e->schemas, SD_SCHEMAS_IDLE))) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory for the token table");
        goto fail;
    }
    e->eos = c->n_eos > 0 ? c->eos_ids[0] : e->tok ? sd_tok_eos_id(e->tok) : -1;
    e->n_eos = 0;
    for (int i = 0; i < c->n_eos && i < 8; i++)
        e->eos_ids[e->n_eos++] = c->eos_ids[i];
    if (!e->n_eos && e->eos >= 0)
        e->eos_ids[e->n_eos++] = e->eos;
    e->max_ctx = o->max_context > 0 ? o->max_context : c->max_pos;
    if (e->max_ctx > c->max_pos) {
        rc = sd_err_set(err, SD_EINVAL, "--max-context %d exceeds the model's %d", e->max_ctx,
                        c->max_pos);
        goto fail;
    }
    /* proposer (it loads before the plan: its cache and buffers count) */
    e->block_size = o->block_size;
    e->max_blocks = (e->max_ctx + e->k_max + 1 + e->block_size - 1) / e->block_size + 1;
    if ((rc = alloc_step_buffers(e, err)))
        goto fail;
    if ((rc = sd__spec_init(e, o, err)))
        goto fail;
    /* memory plan: what is left after activations goes to the KV cache */
    sd_mem_plan *mp = &e->plan;
    mp->device = e->be->ops->name;
    if (!e->be->ops->mem_info || e->be->ops->mem_info(e->be, &mp->free, &mp->total)) {
        mp->free = mp->total = (size_t)1 << 30;
    }
    mp->fraction = o->mem_fraction;
    mp->weights = sd_model_weight_bytes(e->target); /* this rank's */
    sd__graphs_init(e, o);
    const char *la = o->launch_ahead ? o->launch_ahead : "auto";
    /* auto (1): one rank with CUDA graphs (greedy and sampled requests); on
     * (2): tensor-parallel ranks (CPU-tested, not yet run on several GPUs)
     * and backends without graphs too */
    e->ahead_on = !strcmp(la, "on") ? 2 : !strcmp(la, "auto") && e->graphs_on && !e->tp;
    e->draft_ahead = o->draft_ahead && !e->tp && !e->nodes;
    /* adaptive k prices k = 0 at a queued-ahead step where one would run:
     * with graphs (a backend without them, the CPU's, runs a step inside its
     * launch: nothing to hide) on one node, without synthetic acceptance */
    e->adapt.ahead = ahead_possible(e) && (e->graphs_on || o->debug_price_ahead);
    /* a GPU's batch buckets price their steps apart (their graphs) */
    e->adapt.own_buckets = e->be->device >= 0;
    if (e->tp) {
        /* the all-reduce of the residual stream at every step size the graphs capture */
        size_t sizes[SD_AR_SIZES];
        int ns = 0;
        for (int b = 0; b < e->n_buckets && ns < SD_AR_SIZES; b++)
            sizes[ns++] = (size_t)e->buckets[b] * (size_t)e->D;
        if (!ns)
            sizes[ns++] = (size_t)e->D;
        if ((rc = sd__tp_tune(e->tp, sizes, ns, err)))
            goto fail;
        e->stats.allreduce_metrics = sd__tp_metrics(e->tp); /* fixed from here on */
    }
    mp->graphs = sd__graphs_reserve_bytes(e);
    mp->comm = sd__tp_comm_bytes(e->tp);
    mp->activations = sd_model_workspace_bytes(e->target) + sd__spec_buffer_bytes(e) +
                      (size_t)e->max_out * (size_t)e->V * 8 /* logits, probabilities */ +
                      (e->d_q ? (size_t)e->ov_max_seqs * (size_t)e->k_max * (size_t)e->V * 4 : 0) +
                      (size_t)e->max_tokens * ((size_t)e->D * 4 + 28);
    mp->kv_per_token = sd_model_kv_bytes_per_slot(e->target) + sd__spec_kv_bytes_per_slot(e);
    if (e->tp && e->be->device < 0) {
        /* CPU ranks share one memory: every rank's cache and buffers come out of it */
        mp->kv_per_token *= (size_t)e->n_ranks;
        mp->activations *= (size_t)e->n_ranks;
    }
    mp->activations += mp->kv_per_token * (size_t)e->block_size; /* the trash block (graphs.c) */
    mp->block_size = e->block_size;
    mp->max_context = e->max_ctx;
    mp->min_blocks = e->max_blocks;
    /* No more than --max-batch full-context requests can run at once: a
     * larger cache would sit idle (and on the CPU it is shared with
     * everything else on the machine). */
    int cap = o->max_batch * e->max_blocks;
    if ((rc = sd_mem_plan_make(mp, o->kv_blocks, cap, err)))
        goto fail;
    /* several nodes: one pool size, or their schedulers would part ways */
    if (e->nodes && (rc = sd__plan_agree_blocks(e, &mp->blocks, err)))
        goto fail;
    sd_mem_plan_log(mp);
    e->n_blocks = mp->blocks;
    if ((rc = sd_kv_pool_create(&e->kv, e->n_blocks, e->block_size, err)))
        goto fail;
    if (o->prefix_cache) {
        if ((rc = sd_pcache_create(&e->pc, e->kv, err)))
            goto fail;
        e->pc_match = malloc((size_t)e->max_blocks * sizeof *e->pc_match);
        e->pc_keys = malloc((size_t)e->max_blocks * sizeof *e->pc_keys);
        if (!e->pc_match || !e->pc_keys) {
            rc = sd_err_set(err, SD_ENOMEM, "prefix cache: out of memory");
            goto fail;
        }
    }
    /* every cache has one block more than the pool: the trash block that
     * padding rows write (graphs.c) */
    int n_slots = (e->n_blocks + 1) * e->block_size;
    e->trash_slot = e->n_blocks * e->block_size;
    for (int r = 0; r < e->n_ranks; r++)
        if ((rc = sd_model_alloc_kv(e->targets[r], n_slots, err)))
            goto fail;
    if ((rc = sd__spec_alloc_kv(e, n_slots, err)))
        goto fail;
    e->h_table[(size_t)e->pad_seq * e->max_blocks] = e->n_blocks;
    if ((rc = e->be->ops->upload(e->be, e->d_table + (size_t)e->pad_seq * e->max_blocks,
                                 e->h_table + (size_t)e->pad_seq * e->max_blocks,
                                 sizeof(int32_t))) ||
        (rc = sd__graphs_capture(e, err)) || (rc = sd__spec_capture(e, err)))
        goto fail;
    sd_log_info("engine: %s on %s, %d layers, vocab %d, context %d, spec %s, k %s", e->model_name,
                e->be->ops->name, c->num_layers, e->V, e->max_ctx, o->spec,
                e->spec_k >= 0 ? "fixed" : "auto");
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        rc = sd_err_set(err, SD_ENOMEM, "cannot start the engine thread");
        goto fail;
    }
    e->started = 1;
    *out = e;
    return 0;
fail:
    sd_engine_destroy(e);
    return rc;
}

void sd_engine_destroy(sd_engine *e)
{
    if (!e)
        return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        int stopped = e->stopped;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        /* a following node's thread waits for node 0's next plan: stopping
         * it before node 0 says so breaks the group (node 0 then fails its
         * requests instead of waiting for this node) */
        if (e->follower && !stopped)
            sd_nodes_abort(e->nodes);
        pthread_join(e->thread, NULL);
    }
    sd__graphs_free(e);
    sd__spec_free(e);
    free(e->fresh);
    free(e->obs);
    free(e->running);
    free(e->waiting);
    if (e->be)
        free_step_buffers(e);
    sd_pcache_free(e->pc);
    free(e->pc_match);
    free(e->pc_keys);
    sd_kv_pool_free(e->kv);
    for (int r = 0; r < SD_TP_MAX; r++)
        sd_model_free(e->targets[r]);
    sd_token_table_free(&e->tt);
    sd_mask_cache_free(e->mcache);
    sd_schema_cache_free(e->schemas);
    sd_tok_free(e->tok);
    if (e->tp) {
        sd__tp_close(e->tp);
    } else if (e->prof_inner) {
        sd_prof_report(e->be, stderr);
        sd_prof_backend_free(e->be);
        sd_backend_close(e->prof_inner);
    } else {
        sd_backend_close(e->be);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

const sd_tokenizer *sd_engine_tokenizer(const sd_engine *e) { return e->tok; }
int sd_engine_max_context(const sd_engine *e) { return e->max_ctx; }
sd_schema_cache *sd_engine_schemas(sd_engine *e) { return e->schemas; }
const char *sd_engine_model_name(const sd_engine *e) { return e->model_name; }
const char *sd_engine_model_dir(const sd_engine *e) { return e->model_dir; }

/* A request checked and built (not queued). */
req *sd__engine_req_new(sd_engine *e, const int32_t *prompt, int n_prompt, const sd_gen_params *p,
                        sd_err *err)
{
    if (n_prompt <= 0) {
        sd_err_set(err, SD_EINVAL, "prompt: at least one token is required");
        return NULL;
    }
    req *r = NULL;
    int rc = 0;
    if (p->max_tokens < 0) {
        sd_err_set(err, SD_EINVAL, "max_tokens: must be at least 0");
        return NULL;
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->V) {
            sd_err_set(err, SD_ERANGE, "prompt: token id %d is out of range (vocab %d)",
                       prompt[i], e->V);
            return NULL;
        }
    if ((int64_t)n_prompt + p->max_tokens > e->max_ctx) {
        sd_err_set(err, SD_ERANGE,
                   "max_tokens: the prompt (%d tokens) plus max_tokens (%d) exceeds the "
                   "context length (%d)",
                   n_prompt, p->max_tokens, e->max_ctx);
        return NULL;
    }
    r = calloc(1, sizeof *r);
    if (!r) {
        sd_err_set(err, SD_ENOMEM, "out of memory");
        return NULL;
    }
    r->cap_tok = n_prompt + 64;
    r->tok = malloc((size_t)r->cap_tok * sizeof(int32_t));
    if (e->spec == SD_SPEC_MTP || e->spec == SD_SPEC_EAGLE3 || e->spec == SD_SPEC_DRAFT)
        r->q = malloc((size_t)SD_MAX_K * (size_t)e->V * sizeof(float));
    if (!r->tok || (e->spec != SD_SPEC_NONE && e->spec != SD_SPEC_NGRAM && !r->q)) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(r->tok, prompt, (size_t)n_prompt * sizeof(int32_t));
    r->n_tok = r->n_prompt = n_prompt;
    r->fresh = 1;
    r->samp.temperature = (float)p->temperature;
    r->samp.top_p = (float)p->top_p;
    r->samp.top_k = p->top_k;
    r->greedy = sd_sampling_is_greedy(&r->samp);
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    if (p->logprobs && (p->top_logprobs < 0 || p->top_logprobs > SD_MAX_TOP_LOGPROBS)) {
        rc = sd_err_set(err, SD_EINVAL, "top_logprobs: %d, at most %d", p->top_logprobs,
                        SD_MAX_TOP_LOGPROBS);
        goto fail;
    }
    r->want_lp = p->logprobs != 0;
    r->top_lp = p->top_logprobs;
    r->want_plp = r->want_lp && p->prompt_logprobs && n_prompt > 1;
    r->plp_sent = 1;
    if (p->n_bias < 0 || p->n_bias > SD_MAX_LOGIT_BIAS) {
        rc = sd_err_set(err, SD_EINVAL, "logit_bias: %d tokens, at most %d", p->n_bias,
                        SD_MAX_LOGIT_BIAS);
        goto fail;
    }
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= e->V || !isfinite(p->bias[i])) {
            rc = sd_err_set(err, SD_EINVAL, "logit_bias: token %d (bias %g): %s", p->bias_ids[i],
                            (double)p->bias[i],
                            isfinite(p->bias[i]) ? "not in the vocabulary" : "the bias is not a number");
            goto fail;
        }
    if (p->n_bias) {
        r->bias_ids = malloc((size_t)p->n_bias * sizeof *r->bias_ids);
        r->bias = malloc((size_t)p->n_bias * sizeof *r->bias);
        if (!r->bias_ids || !r->bias) {
            rc = SD_ENOMEM;
            goto fail;
        }
        memcpy(r->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *r->bias_ids);
        memcpy(r->bias, p->bias, (size_t)p->n_bias * sizeof *r->bias);
        r->n_bias = p->n_bias;
    }
    r->presence = p->presence_penalty;
    r->frequency = p->frequency_penalty;
    if ((r->presence != 0 || r->frequency != 0) &&
        !(r->counts = calloc((size_t)e->V, sizeof *r->counts))) {
        rc = SD_ENOMEM;
        goto fail;
    }
    if (p->json_object || p->json_schema) {
        if (!e->tok) {
            rc = sd_err_set(err, SD_EINVAL, "response_format %s: the model has no tokenizer",
                            p->json_schema ? "json_schema" : "json_object");
            goto fail;
        }
        r->json = 1;
        sd_json_init(&r->js.obj);
    }
    if (p->json_schema) {
        r->json = 2;
        if (!(r->schema_text = strdup(p->json_schema))) {
            rc = SD_ENOMEM;
            goto fail;
        }
        if ((rc = sd_schema_cache_get(e->schemas, p->json_schema, &r->schema, err)))
            goto fail;
        sd_jschema_init(r->schema, &r->js.sch);
    }
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens) {
        rc = sd_err_set(err, SD_EINVAL, "min_tokens: %d, at most max_tokens (%d)", p->min_tokens,
                        p->max_tokens);
        goto fail;
    }
    r->min_tokens = p->min_tokens;
    r->proc = r->n_bias > 0 || r->counts != NULL || r->json || r->min_tokens > 0;
    if (p->n_stop_ids < 0 || p->n_stop_ids > (int)SD_ARRAY_LEN(r->stop_ids)) {
        rc = sd_err_set(err, SD_EINVAL, "stop token ids: at most %d",
                        (int)SD_ARRAY_LEN(r->stop_ids));
        goto fail;
    }
    for (int i = 0; i < p->n_stop_ids; i++)
        r->stop_ids[i] = p->stop_ids[i];
    r->n_stop_ids = p->n_stop_ids;
    if (p->has_seed)
        r->samp.seed = p->seed;
    else
        r->samp.seed = sd_now_ns() ^ ((uint64_t)(uintptr_t)r << 17);
    if ((rc = sd_stop_init(&r->stop, p->stop, p->n_stop, err)))
        goto fail;
    if (e->spec == SD_SPEC_NGRAM && (rc = sd_ngram_create(&r->ng, 1, e->ngram_n, err)))
        goto fail;
    if (e->tok && (rc = sd_detok_new(&r->detok, e->tok, !p->keep_special, err)))
        goto fail;
    sd_kv_seq_init(&r->kv);
    r->pc_key = sd_pcache_root();
    r->t_submit = sd_now_ns();
    return r;
fail:
    if (rc == SD_ENOMEM && !err->msg[0])
        sd_err_set(err, SD_ENOMEM, "out of memory");
    req_fields_free(e, r);
    return NULL;
}

int sd_engine_submit(sd_engine *e, const int32_t *prompt, int n_prompt, const sd_gen_params *p,
                     const sd_req_events *ev, void *user, uint64_t *id, sd_err *err)
{
    if (e->follower)
        return sd_err_set(err, SD_ESTATE,
                          "this node (--node-rank %d) follows node 0: requests go to node 0",
                          e->node_rank);
    sd_err local = {0};
    if (!err)
        err = &local;
    req *r = sd__engine_req_new(e, prompt, n_prompt, p, err);
    if (!r)
        return err->code ? err->code : SD_EINVAL;
    if (ev)
        r->ev = *ev;
    r->user = user;
    pthread_mutex_lock(&e->mu);
    /* r is the engine's once it is queued: a short request may finish and
     * be freed before this thread reads it again, so its id is kept here */
    const uint64_t rid = r->id = ++e->next_id;
    r->next = e->incoming;
    e->incoming = r;
    r->all_next = e->all;
    e->all = r;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (id)
        *id = rid;
    return 0;
}

void sd_engine_cancel(sd_engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    for (req *r = e->all; r; r = r->all_next)
        if (r->id == id) {
            atomic_store(&r->cancel, 1);
            break;
        }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void sd_engine_get_stats(sd_engine *e, sd_engine_stats *st)
{
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    pthread_mutex_unlock(&e->mu);
    /* read now: the server compiles through the cache between steps */
    if (e->schemas)
        sd_schema_cache_counts(e->schemas, &st->json_schemas_compiled, &st->json_schemas_found);
}

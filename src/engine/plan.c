/* engine/plan: several nodes take the same steps.
 *
 * Every node runs the whole engine on its share of the ranks: the same
 * scheduler, the same batches, the same sampling (the all-reduce gives every
 * rank the same logits, and the request's seed fixes every draw). What could
 * differ is only what comes from outside a step: requests and cancellations
 * (they reach node 0) and wall-clock timings (each node measures its own;
 * the adaptive draft length learns from them). So node 0 sends, at the top
 * of every step, a plan with exactly those, and applies it at the same point
 * as every other node: new requests (prompt, parameters, the seed node 0
 * drew), the ids cancelled since the last plan, node 0's timings, and at the
 * end "quit". Everything after that point is a function of the plans.
 *
 * Wire format (host byte order: the nodes run one build): u32 magic, u64
 * sequence number, u32 flags; u32 count, then each new request; u32 count of
 * cancelled ids (u64); u32 count of timings. A node that gets a plan out of
 * sequence, or cannot parse it, stops (its peers then fail their next
 * collective instead of waiting). */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "engine/internal.h"
#include "net/buf.h"

#define PLAN_MAGIC 0x53445035u /* "SDP5": requests carry their logits processors, logprobs (and the prompt's), JSON mode (and schema) and min_tokens */
#define PLAN_QUIT 1u
#define PLAN_TIMEOUT_S 600.0 /* node 0 sends a plan at least every 50 ms while alive */

/* the plan under construction: net/buf's growable buffer (oom checked once
 * at the end) */
typedef sd_buf wbuf;

static void put(wbuf *b, const void *x, size_t n) { sd_buf_append(b, x, n); }
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_f64(wbuf *b, double v) { put(b, &v, 8); }

typedef struct rbuf {
    const unsigned char *p;
    size_t n, off;
    int bad;
} rbuf;

static void get(rbuf *b, void *x, size_t n)
{
    if (b->bad || b->n - b->off < n) {
        b->bad = 1;
        memset(x, 0, n);
        return;
    }
    memcpy(x, b->p + b->off, n);
    b->off += n;
}
static uint32_t get_u32(rbuf *b)
{
    uint32_t v;
    get(b, &v, 4);
    return v;
}
static uint64_t get_u64(rbuf *b)
{
    uint64_t v;
    get(b, &v, 8);
    return v;
}
static double get_f64(rbuf *b)
{
    double v;
    get(b, &v, 8);
    return v;
}

static void put_req(wbuf *b, const req *r)
{
    put_u64(b, r->id);
    put_u32(b, (uint32_t)r->n_prompt);
    put(b, r->tok, (size_t)r->n_prompt * sizeof(int32_t));
    put_u32(b, (uint32_t)r->max_tokens);
    put_f64(b, r->samp.temperature);
    put_f64(b, r->samp.top_p);
    put_u32(b, (uint32_t)r->samp.top_k);
    put_u64(b, r->samp.seed);
    put_u32(b, (uint32_t)r->ignore_eos);
    put_u32(b, (uint32_t)r->n_stop_ids);
    put(b, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
    put_u32(b, (uint32_t)r->stop.n);
    for (int i = 0; i < r->stop.n; i++) {
        put_u32(b, (uint32_t)r->stop.lens[i]);
        put(b, r->stop.stops[i], r->stop.lens[i]);
    }
    /* the logits its steps are chosen from: every node takes the same
     * path (host logits) and the same processors */
    put_u32(b, (uint32_t)r->want_lp);
    put_u32(b, (uint32_t)r->top_lp);
    put_u32(b, (uint32_t)r->want_plp);
    put_u32(b, (uint32_t)r->json);
    if (r->json == 2) {
        const uint32_t l = (uint32_t)strlen(r->schema_text);
        put_u32(b, l);
        put(b, r->schema_text, l);
    }
    put_u32(b, (uint32_t)r->min_tokens);
    put_f64(b, r->presence);
    put_f64(b, r->frequency);
    put_u32(b, (uint32_t)r->n_bias);
    if (r->n_bias) {
        put(b, r->bias_ids, (size_t)r->n_bias * sizeof(int32_t));
        put(b, r->bias, (size_t)r->n_bias * sizeof(float));
    }
}

/* A request of node 0's plan, built and queued here as node 0 did. */
static int take_req(sd_engine *e, rbuf *b, sd_err *err)
{
    uint64_t id = get_u64(b);
    uint32_t n = get_u32(b);
    if (b->bad || n == 0 || (size_t)n > (b->n - b->off) / sizeof(int32_t))
        return sd_err_set(err, SD_EIO, "node plan: a malformed request");
    int32_t *prompt = malloc((size_t)n * sizeof(int32_t));
    if (!prompt)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    get(b, prompt, (size_t)n * sizeof(int32_t));
    sd_gen_params p = {0};
    p.max_tokens = (int)get_u32(b);
    p.temperature = get_f64(b);
    p.top_p = get_f64(b);
    p.top_k = (int)get_u32(b);
    p.seed = get_u64(b);
    p.has_seed = 1;
    p.ignore_eos = (int)get_u32(b);
    int32_t stop_ids[64];
    p.n_stop_ids = (int)get_u32(b);
    if (p.n_stop_ids < 0 || p.n_stop_ids > 64)
        b->bad = 1;
    else
        get(b, stop_ids, (size_t)p.n_stop_ids * sizeof(int32_t));
    p.stop_ids = stop_ids;
    uint32_t ns = get_u32(b);
    char **stops = ns <= 64 ? calloc(ns ? ns : 1, sizeof *stops) : NULL;
    if (!stops)
        b->bad = 1;
    for (uint32_t i = 0; i < ns && !b->bad; i++) {
        uint32_t l = get_u32(b);
        if (l > b->n - b->off) {
            b->bad = 1;
            break;
        }
        stops[i] = malloc((size_t)l + 1);
        if (!stops[i]) {
            b->bad = 1;
            break;
        }
        get(b, stops[i], l);
        stops[i][l] = 0;
    }
    p.stop = (const char *const *)stops;
    p.n_stop = (int)ns;
    p.logprobs = (int)get_u32(b);
    p.top_logprobs = (int)get_u32(b);
    p.prompt_logprobs = (int)get_u32(b);
    const uint32_t json = get_u32(b);
    p.json_object = json == 1;
    char *schema = NULL;
    if (json == 2) {
        uint32_t l = get_u32(b);
        if (b->bad || l > b->n - b->off || !(schema = malloc((size_t)l + 1))) {
            b->bad = 1;
        } else {
            get(b, schema, l);
            schema[l] = 0;
            p.json_schema = schema;
        }
    }
    p.min_tokens = (int)get_u32(b);
    p.presence_penalty = (float)get_f64(b);
    p.frequency_penalty = (float)get_f64(b);
    uint32_t nb = get_u32(b);
    int32_t *bias_ids = NULL;
    float *bias = NULL;
    if (!b->bad && nb > 0) {
        if (nb > SD_MAX_LOGIT_BIAS || (size_t)nb * 8 > b->n - b->off ||
            !(bias_ids = malloc((size_t)nb * sizeof *bias_ids)) || !(bias = malloc((size_t)nb * sizeof *bias))) {
            b->bad = 1;
        } else {
            get(b, bias_ids, (size_t)nb * sizeof *bias_ids);
            get(b, bias, (size_t)nb * sizeof *bias);
            p.bias_ids = bias_ids;
            p.bias = bias;
            p.n_bias = (int)nb;
        }
    }
    int rc = 0;
    req *r = NULL;
    if (b->bad)
        rc = sd_err_set(err, SD_EIO, "node plan: a malformed request");
    else if (!(r = sd__engine_req_new(e, prompt, (int)n, &p, err)))
        rc = err->code ? err->code : SD_EINVAL;
    else {
        r->id = id;
        rc = sd__engine_admit(e, r);
        if (rc)
            sd_err_set(err, rc, "out of memory");
    }
    for (uint32_t i = 0; stops && i < ns; i++)
        free(stops[i]);
    free(stops);
    free(bias_ids);
    free(bias);
    free(schema);
    free(prompt);
    return rc;
}

static void cancel_id(sd_engine *e, uint64_t id)
{
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == id)
            e->waiting[i]->cancel_applied = 1;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id)
            e->running[i]->cancel_applied = 1;
}

static void apply_obs(sd_engine *e, const sd_plan_obs *o)
{
    static const char *what[] = {"target step: rows x batch", "drafting phase: requests x k",
                                 "queued-ahead step: rows x batch",
                                 "hidden by queueing ahead: 1 x batch",
                                 "draft-ahead step: drafting x batch"};
    if (o->kind < 0 || o->kind >= (int)SD_ARRAY_LEN(what))
        return;
    if (o->kind == SD_OBS_DRAFT_AHEAD) {
        sd_log_debug("adaptive k: %s %d x %d, k %lld: %.3f ms (step %llu)", what[o->kind], o->a,
                     o->b, (long long)o->keys, 1e3 * o->secs, (unsigned long long)e->adapt.steps);
        sd_adaptive_observe_draft_ahead(&e->adapt, o->b, o->a, (int)o->keys, o->secs);
        return;
    }
    sd_log_debug("adaptive k: %s %d x %d: %.3f ms (step %llu)", what[o->kind], o->a, o->b,
                 1e3 * o->secs, (unsigned long long)e->adapt.steps);
    if (o->kind == SD_OBS_TARGET)
        sd_adaptive_observe_target(&e->adapt, o->b, o->a, o->secs);
    else if (o->kind == SD_OBS_DRAFT)
        sd_adaptive_observe_draft(&e->adapt, o->a, o->b, o->secs);
    else if (o->kind == SD_OBS_AHEAD)
        sd_adaptive_observe_ahead(&e->adapt, o->b, o->a, o->secs, (double)o->keys);
    else
        sd_adaptive_observe_hidden(&e->adapt, o->b, o->secs);
}

void sd__plan_observe(sd_engine *e, int kind, int a, int b, double secs, int64_t keys)
{
    sd_plan_obs o = {kind, a, b, secs, keys};
    if (!e->nodes) {
        apply_obs(e, &o);
        return;
    }
    if (e->follower)
        return; /* node 0's timings come with its next plan */
    if (e->n_obs == e->cap_obs) {
        int cap = e->cap_obs ? 2 * e->cap_obs : 16;
        sd_plan_obs *p = realloc(e->obs, (size_t)cap * sizeof *p);
        if (!p)
            return; /* one timing less to learn from: every node alike */
        e->obs = p;
        e->cap_obs = cap;
    }
    e->obs[e->n_obs++] = o;
}

/* Cancellations asked for since the last step; with ids (node 0), noted. */
static void take_cancels(sd_engine *e, wbuf *ids, uint32_t *n)
{
    req **lists[2] = {e->waiting, e->running};
    int counts[2] = {e->n_waiting, e->n_running};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < counts[l]; i++) {
            req *r = lists[l][i];
            if (!r->cancel_applied && atomic_load(&r->cancel)) {
                r->cancel_applied = 1;
                if (ids) {
                    put_u64(ids, r->id);
                    (*n)++;
                }
            }
        }
}

static int lead(sd_engine *e, uint32_t flags, sd_err *err)
{
    wbuf b = {0}, ids = {0};
    uint32_t n_cancel = 0;
    take_cancels(e, &ids, &n_cancel);
    put_u32(&b, PLAN_MAGIC);
    put_u64(&b, e->plan_seq++);
    put_u32(&b, flags);
    put_u32(&b, (uint32_t)e->n_fresh);
    for (int i = 0; i < e->n_fresh; i++)
        put_req(&b, e->fresh[i]);
    put_u32(&b, n_cancel);
    if (ids.len)
        put(&b, ids.p, ids.len);
    put_u32(&b, (uint32_t)e->n_obs);
    for (int i = 0; i < e->n_obs; i++) {
        put_u32(&b, (uint32_t)e->obs[i].kind);
        put_u32(&b, (uint32_t)e->obs[i].a);
        put_u32(&b, (uint32_t)e->obs[i].b);
        put_f64(&b, e->obs[i].secs);
        put_u64(&b, (uint64_t)e->obs[i].keys);
        apply_obs(e, &e->obs[i]);
    }
    e->n_fresh = 0;
    e->n_obs = 0;
    int rc = b.oom || ids.oom
                 ? sd_err_set(err, SD_ENOMEM, "node plan: out of memory")
                 : sd_nodes_send_msg(e->nodes, b.p, b.len, PLAN_TIMEOUT_S, err);
    sd_buf_free(&b);
    sd_buf_free(&ids);
    return rc;
}

static int follow(sd_engine *e, sd_err *err)
{
    void *msg = NULL;
    size_t len = 0;
    int rc = sd_nodes_recv_msg(e->nodes, &msg, &len, PLAN_TIMEOUT_S, err);
    if (rc)
        return rc;
    rbuf b = {.p = msg, .n = len};
    uint32_t magic = get_u32(&b);
    uint64_t seq = get_u64(&b);
    uint32_t flags = get_u32(&b);
    if (b.bad || magic != PLAN_MAGIC || seq != e->plan_seq) {
        free(msg);
        return sd_err_set(err, SD_EIO, "node plan %llu: expected plan %llu (a lost or foreign "
                                       "message)",
                          (unsigned long long)seq, (unsigned long long)e->plan_seq);
    }
    e->plan_seq++;
    uint32_t n_new = get_u32(&b);
    for (uint32_t i = 0; i < n_new && !rc; i++)
        rc = take_req(e, &b, err);
    uint32_t n_cancel = rc ? 0 : get_u32(&b);
    for (uint32_t i = 0; i < n_cancel && !b.bad; i++)
        cancel_id(e, get_u64(&b));
    uint32_t n_obs = rc ? 0 : get_u32(&b);
    for (uint32_t i = 0; i < n_obs && !b.bad; i++) {
        sd_plan_obs o;
        o.kind = (int)get_u32(&b);
        o.a = (int)get_u32(&b);
        o.b = (int)get_u32(&b);
        o.secs = get_f64(&b);
        o.keys = (int64_t)get_u64(&b);
        if (!b.bad)
            apply_obs(e, &o);
    }
    if (!rc && b.bad)
        rc = sd_err_set(err, SD_EIO, "node plan %llu: malformed", (unsigned long long)seq);
    free(msg);
    if (!rc && (flags & PLAN_QUIT)) {
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        pthread_mutex_unlock(&e->mu);
    }
    return rc;
}

int sd__plan_exchange(sd_engine *e, sd_err *err)
{
    if (!e->nodes) {
        take_cancels(e, NULL, NULL);
        return 0;
    }
    if (e->broken)
        return sd_err_set(err, SD_ESTATE, "the node group failed earlier");
    int rc = e->follower ? follow(e, err) : lead(e, 0, err);
    if (rc)
        e->broken = 1;
    return rc;
}

void sd__plan_send_quit(sd_engine *e)
{
    if (!e->nodes || e->follower || e->broken)
        return;
    sd_err err = {0};
    if (lead(e, PLAN_QUIT, &err))
        sd_log_warn("telling the other nodes to stop: %s", err.msg);
}

int sd__plan_agree_blocks(sd_engine *e, int *n_blocks, sd_err *err)
{
    if (!e->nodes)
        return 0;
    int n = sd_nodes_count(e->nodes);
    int32_t mine = *n_blocks, *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    int rc = sd_nodes_gather(e->nodes, &mine, all, sizeof mine, PLAN_TIMEOUT_S, err);
    int32_t least = mine;
    for (int k = 0; !rc && !e->follower && k < n; k++)
        if (all[k] < least)
            least = all[k];
    if (!rc)
        rc = sd_nodes_bcast(e->nodes, &least, sizeof least, PLAN_TIMEOUT_S, err);
    free(all);
    if (!rc && least != *n_blocks)
        sd_log_info("KV cache: %d blocks, the smallest node's (this node planned %d)", least,
                    *n_blocks);
    if (!rc)
        *n_blocks = least;
    return rc;
}

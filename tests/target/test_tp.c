/* Tensor parallelism on the CPU: --tp 2 and 4 (rank threads, thread
 * all-reduce), with MoE experts sliced or (--ep) split whole, give the
 * --tp 1 logits, hidden states and MTP logits on every golden fixture and on
 * a derived one with attention biases and a vocabulary no tp divides;
 * configs that cannot be split are refused by name; `specd logits --tp 2`
 * writes the --tp 1 file. */
#include <dirent.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/util.h"
#include "engine/tp.h"
#include "target/runner.h"
#include "comm/hook_comm.h"
#include "fixtures.h"
#include "test.h"

/* fp32 partial sums added in another order: relative to the largest logit */
#define TP_TOL 1e-5

/* The TP runner on `tp` CPU ranks sharing `threads` threads. */
static int runner_open(sd_tp_runner **t, const char *dir, int tp, int threads,
                       const sd_model_opts *mo, sd_err *err)
{
    sd_opts o;
    char v[2][16];
    snprintf(v[0], sizeof v[0], "%d", tp);
    snprintf(v[1], sizeof v[1], "%d", threads);
    *t = NULL;
    int rc = sd_opts_init(&o, err);
    if (!rc && !(rc = sd_opts_set(&o, SD_CMD_LOGITS, "tp", v[0], err)) &&
        !(rc = sd_opts_set(&o, SD_CMD_LOGITS, "threads", v[1], err)) &&
        !(rc = sd_opts_set(&o, SD_CMD_LOGITS, "device", "cpu", err)))
        rc = sd_tp_runner_open(t, dir, &o, mo, err);
    sd_opts_free(&o);
    return rc;
}

/* One model's reference outputs at --tp 1. */
typedef struct ref {
    int n, V, D;
    float *logits, *hidden, *mtp; /* (n, V), (n, D), (n-1, V) or NULL */
} ref;

static void ref_free(ref *r)
{
    free(r->logits);
    free(r->hidden);
    free(r->mtp);
}

static int tp1_ref(const char *dir, const int32_t *ids, int n, ref *r, sd_err *err)
{
    memset(r, 0, sizeof *r);
    sd_backend *be;
    sd_model *m = NULL;
    if (sd_cpu_backend_create(&be, 2))
        return sd_err_set(err, SD_ENOMEM, "cpu backend");
    sd_model_opts mo = {.max_tokens = 64, .load_mtp = 1};
    int rc = sd_model_load(&m, dir, be, &mo, err);
    if (!rc)
        rc = sd_model_alloc_kv(m, n + 8, err);
    if (!rc) {
        const sd_model_cfg *c = sd_model_cfg_of(m);
        r->n = n;
        r->V = c->vocab_size;
        r->D = c->hidden_size;
        r->logits = malloc((size_t)n * r->V * sizeof(float));
        r->hidden = malloc((size_t)n * r->D * sizeof(float));
        sd_seq_out so = {.logits = r->logits, .hidden = r->hidden};
        rc = sd_runner_target(m, ids, n, 0, &so, err);
        if (!rc && sd_model_has_mtp(m)) {
            r->mtp = malloc((size_t)(n - 1) * r->V * sizeof(float));
            sd_seq_out sm = {.logits = r->mtp};
            rc = sd_runner_mtp(m, ids + 1, r->hidden, n - 1, 0, &sm, err);
        }
    }
    sd_model_free(m);
    sd_cpu_backend_destroy(be);
    return rc;
}

/* Compares --tp tp (--ep: experts split whole) with the reference: full
 * prefill (logits, hidden), then prefill of half and one token at a time,
 * then MTP. Returns 1 if all match. */
static int check_tp(const char *name, const char *dir, const int32_t *ids, const ref *r, int tp,
                    int ep)
{
    sd_err err = {0};
    sd_tp_runner *t = NULL;
    int n = r->n, V = r->V, D = r->D, ok = 1;
    size_t nl = (size_t)n * V, nh = (size_t)n * D;
    float *lg = malloc(nl * sizeof(float)), *hid = malloc(nh * sizeof(float));
    float *lg2 = malloc(nl * sizeof(float)), *mlg = malloc(nl * sizeof(float));
    for (size_t i = 0; i < nl; i++)
        lg[i] = lg2[i] = mlg[i] = NAN; /* poison: every value must be written */
    sd_model_opts mo = {.max_tokens = 64, .load_mtp = 1, .ep = ep};
    char label[300];
    snprintf(label, sizeof label, "%s%s", name, ep ? " --ep" : "");
    name = label;
    if (runner_open(&t, dir, tp, 4, &mo, &err) || sd_tp_runner_alloc_kv(t, n + 8, &err)) {
        fprintf(stderr, "  %s tp %d: %s\n", name, tp, err.msg);
        ok = 0;
        goto done;
    }
    if (sd_model_tp_size(sd_tp_runner_model(t, tp - 1)) != tp ||
        sd_model_tp_rank(sd_tp_runner_model(t, tp - 1)) != tp - 1) {
        fprintf(stderr, "  %s tp %d: the last rank does not know its place\n", name, tp);
        ok = 0;
        goto done;
    }
    sd_seq_out so = {.logits = lg, .hidden = hid};
    if (sd_tp_runner_target(t, ids, n, 0, &so, &err)) {
        fprintf(stderr, "  %s tp %d: %s\n", name, tp, err.msg);
        ok = 0;
        goto done;
    }
    double scale = max_abs(r->logits, nl);
    double d = max_diff(lg, r->logits, nl), dh = max_diff(hid, r->hidden, nh);
    double hs = max_abs(r->hidden, nh);
    int good = d <= TP_TOL * scale && dh <= TP_TOL * hs;
    fprintf(stderr, "  %-24s tp %d prefill  logits rel %.3g  hidden rel %.3g  %s\n", name, tp,
            d / scale, dh / hs, good ? "ok" : "FAIL");
    ok &= good;
    /* half prefill, then decode one token at a time */
    int k = n / 2;
    sd_seq_out s1 = {.logits = lg2};
    int rc = sd_tp_runner_target(t, ids, k, 0, &s1, &err);
    for (int i = k; i < n && !rc; i++) {
        sd_seq_out s2 = {.logits = lg2 + (size_t)i * V};
        rc = sd_tp_runner_target(t, ids + i, 1, i, &s2, &err);
    }
    if (rc) {
        fprintf(stderr, "  %s tp %d decode: %s\n", name, tp, err.msg);
        ok = 0;
        goto done;
    }
    d = max_diff(lg2, r->logits, nl);
    good = d <= TP_TOL * scale;
    fprintf(stderr, "  %-24s tp %d decode   logits rel %.3g  %s\n", name, tp, d / scale,
            good ? "ok" : "FAIL");
    ok &= good;
    if (r->mtp) {
        size_t nm = (size_t)(n - 1) * V;
        sd_seq_out sm = {.logits = mlg};
        /* the reference's hidden states, so only the MTP layer is compared */
        if (sd_tp_runner_mtp(t, ids + 1, r->hidden, n - 1, 0, &sm, &err)) {
            fprintf(stderr, "  %s tp %d mtp: %s\n", name, tp, err.msg);
            ok = 0;
            goto done;
        }
        double ms = max_abs(r->mtp, nm), md = max_diff(mlg, r->mtp, nm);
        good = md <= TP_TOL * ms;
        fprintf(stderr, "  %-24s tp %d mtp      logits rel %.3g  %s\n", name, tp, md / ms,
                good ? "ok" : "FAIL");
        ok &= good;
    }
done:
    sd_tp_runner_close(t);
    free(lg);
    free(lg2);
    free(hid);
    free(mlg);
    return ok;
}

TEST(tp_2_and_4_logits_hidden_and_mtp_equal_tp_1_on_every_fixture)
{
    char names[64][256];
    int nf = golden_fixtures(names, 64);
    ASSERT_MSG(nf >= 6, "expected the committed fixtures under tests/golden/models, found %d", nf);
    int failed = 0, mtp_seen = 0, moe_seen = 0;
    for (int f = 0; f < nf; f++) {
        char dir[1400];
        snprintf(dir, sizeof dir, "%.1000s/tests/golden/models/%.255s", sd_test_srcdir(), names[f]);
        int32_t ids[64];
        int n = fixture_ids(dir, ids, 24);
        ref r;
        sd_err err = {0};
        if (n < 4 || tp1_ref(dir, ids, n, &r, &err)) {
            fprintf(stderr, "  %s: %s\n", names[f], n < 4 ? "no ids" : err.msg);
            failed = 1;
            continue;
        }
        mtp_seen |= r.mtp != NULL;
        char cpath[1600], *cfg = NULL;
        size_t len;
        snprintf(cpath, sizeof cpath, "%s/config.json", dir);
        int moe = !sd_read_file(cpath, &cfg, &len, NULL) && strstr(cfg, "\"n_routed_experts\"");
        free(cfg);
        moe_seen |= moe;
        for (int tp = 2; tp <= 4; tp *= 2)
            for (int ep = 0; ep <= moe; ep++)
                if (!check_tp(names[f], dir, ids, &r, tp, ep))
                    failed = 1;
        ref_free(&r);
    }
    ASSERT(!failed);
    ASSERT_MSG(mtp_seen, "no fixture has an MTP layer: the MTP path went untested");
    ASSERT_MSG(moe_seen, "no fixture has routed experts: --ep went untested");
}

/* ---- a derived fixture: llama with q/k/v/o biases and vocab 318 */

static char *tmp_dir(void)
{
    char tmpl[] = "/tmp/specd-tp-XXXXXX";
    return mkdtemp(tmpl) ? strdup(tmpl) : NULL;
}

static void rm_dir(const char *dir)
{
    const char *files[] = {"config.json", "model.safetensors", "a.f32", "b.f32", "c.f32", "d.f32"};
    char p[1200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Replaces the one occurrence of `from` in text (malloc'd result) */
static char *replace1(const char *text, const char *from, const char *to)
{
    const char *p = strstr(text, from);
    if (!p || strstr(p + 1, from))
        return NULL;
    return sd_strfmt("%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
}

/* Writes the llama fixture with vocab V2 (< 320: the first rows) and random
 * attention biases (q, k, v and o) into a fresh folder. */
static char *derive_llama(int V2, sd_err *err)
{
    char src[1200];
    snprintf(src, sizeof src, "%s/tests/golden/models/llama", sd_test_srcdir());
    sd_st *st = NULL;
    char *dir = tmp_dir(), *cfg = NULL, *c1 = NULL, *c2 = NULL;
    char cpath[1300];
    snprintf(cpath, sizeof cpath, "%s/config.json", src);
    size_t len;
    sd_st_tensor t[96];
    char names[8][128];
    float *bias[8] = {0};
    int nt = 0, nb = 0, ok = 0;
    if (!dir || sd_read_file(cpath, &cfg, &len, err) || sd_st_open(&st, src, err))
        goto out;
    char vs[64];
    snprintf(vs, sizeof vs, "\"vocab_size\": %d", V2);
    c1 = replace1(cfg, "\"vocab_size\": 320", vs);
    c2 = c1 ? replace1(c1, "\"attention_bias\": false", "\"attention_bias\": true") : NULL;
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    if (!c2 || sd_write_file(cpath, c2, strlen(c2), err))
        goto out;
    uint64_t rng = sd_test_seed();
    for (int i = 0; i < sd_st_count(st) && nt < 90; i++) {
        t[nt] = *sd_st_at(st, i);
        if (!strcmp(t[nt].name, "model.embed_tokens.weight") || !strcmp(t[nt].name, "lm_head.weight")) {
            t[nt].nbytes = t[nt].nbytes / (size_t)t[nt].shape[0] * (size_t)V2;
            t[nt].shape[0] = V2;
        }
        nt++;
    }
    /* biases of both layers: q [4*16], k, v [2*16], o [64] */
    static const char *proj[4] = {"q", "k", "v", "o"};
    static const int len_of[4] = {64, 32, 32, 64};
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < 4; p++, nb++) {
            snprintf(names[nb], sizeof names[nb], "model.layers.%d.self_attn.%s_proj.bias", l,
                     proj[p]);
            bias[nb] = malloc((size_t)len_of[p] * sizeof(float));
            for (int i = 0; i < len_of[p]; i++)
                bias[nb][i] = sd_test_randf(&rng, -0.5f, 0.5f);
            t[nt++] = (sd_st_tensor){.name = names[nb], .dtype = SD_DT_F32, .ndim = 1,
                                     .shape = {len_of[p]}, .data = bias[nb],
                                     .nbytes = (size_t)len_of[p] * sizeof(float)};
        }
    char wpath[1300];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    ok = !sd_st_write(wpath, t, nt, NULL, err);
out:
    for (int i = 0; i < nb; i++)
        free(bias[i]);
    free(cfg);
    free(c1);
    free(c2);
    sd_st_close(st);
    if (!ok && dir) {
        if (!err->msg[0])
            sd_err_set(err, SD_EIO, "cannot derive the fixture");
        rm_dir(dir);
        free(dir);
        dir = NULL;
    }
    return dir;
}

TEST(attention_biases_and_a_vocab_no_tp_divides_give_tp_1_logits)
{
    sd_err err = {0};
    char *dir = derive_llama(318, &err); /* 318 = 2 * 159; over 4 ranks: 80, 80, 80, 78 */
    ASSERT_MSG(dir, "%s", err.msg);
    int32_t ids[20];
    for (int i = 0; i < 20; i++)
        ids[i] = (int32_t)((i * 53 + 7) % 318);
    ids[19] = 317; /* the last row of the short shard */
    ref r;
    int ok = !tp1_ref(dir, ids, 20, &r, &err);
    if (ok) {
        ok = check_tp("llama+bias vocab 318", dir, ids, &r, 2, 0) &&
             check_tp("llama+bias vocab 318", dir, ids, &r, 4, 0);
        ref_free(&r);
    } else {
        fprintf(stderr, "  %s\n", err.msg);
    }
    rm_dir(dir);
    free(dir);
    ASSERT(ok);
}

/* ---- refusals */

/* Writes config.json of fixture `base` with one or two key changes to a
 * fresh folder (no weights: a refusal must come before any is read). */
static char *derive_config(const char *base, const char *from, const char *to, const char *from2,
                           const char *to2)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/golden/models/%s/config.json", sd_test_srcdir(), base);
    char *cfg = NULL, *c1 = NULL, *c2 = NULL, *dir = NULL;
    size_t len;
    if (sd_read_file(path, &cfg, &len, NULL))
        return NULL;
    c1 = replace1(cfg, from, to);
    c2 = c1 && from2 ? replace1(c1, from2, to2) : (c1 ? strdup(c1) : NULL);
    if (c2 && (dir = tmp_dir())) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        sd_write_file(path, c2, strlen(c2), NULL);
    }
    free(cfg);
    free(c1);
    free(c2);
    return dir;
}

static int open_fails_with(const char *dir, int tp, int ep, const char *want, char *msg,
                           size_t msz)
{
    sd_err err = {0};
    sd_tp_runner *t = NULL;
    sd_model_opts mo = {.max_tokens = 8, .ep = ep};
    int rc = runner_open(&t, dir, tp, 2, &mo, &err);
    sd_tp_runner_close(t);
    snprintf(msg, msz, "%s", err.msg);
    return rc == SD_EINVAL && t == NULL && strstr(err.msg, want) != NULL;
}

TEST(configs_that_do_not_split_are_refused_naming_the_config_key)
{
    char fx[1200], msg[1024];
    snprintf(fx, sizeof fx, "%s/tests/golden/models/llama", sd_test_srcdir());
    ASSERT_MSG(open_fails_with(fx, 3, 0, "num_attention_heads 4 is not divisible by --tp 3", msg,
                               sizeof msg),
               "%s", msg);
    ASSERT_MSG(open_fails_with(fx, 8, 0, "num_attention_heads 4 is not divisible by --tp 8", msg,
                               sizeof msg),
               "%s", msg);
    ASSERT_CONTAINS(msg, "config.json");
    struct {
        const char *base, *from, *to, *from2, *to2;
        int tp, ep;
        const char *want;
    } cases[] = {
        /* 12 heads over 6 ranks, but 6 neither divides 4 kv heads nor is a multiple of 4 */
        {"llama", "\"num_attention_heads\": 4", "\"num_attention_heads\": 12",
         "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", 6, 0,
         "num_key_value_heads 4 does not split over --tp 6"},
        {"llama", "\"intermediate_size\": 128", "\"intermediate_size\": 130", NULL, NULL, 4, 0,
         "intermediate_size 130 is not divisible by --tp 4"},
        {"deepseek-v3", "\"moe_intermediate_size\": 32", "\"moe_intermediate_size\": 30", NULL,
         NULL, 4, 0, "moe_intermediate_size 30 is not divisible by --tp 4"},
        /* --ep: whole experts per rank, the shared expert still sliced */
        {"deepseek-v3-noqlora", "\"n_routed_experts\": 8", "\"n_routed_experts\": 6", NULL,
         NULL, 4, 1, "n_routed_experts 6 is not divisible by --tp 4 (--ep)"},
        {"deepseek-v3-noqlora", "\"moe_intermediate_size\": 32", "\"moe_intermediate_size\": 30",
         NULL, NULL, 4, 1, "moe_intermediate_size 30 x n_shared_experts 1 is not divisible by --tp 4"},
        {"deepseek-v3", "\"num_attention_heads\": 4", "\"num_attention_heads\": 6", NULL, NULL, 4,
         0, "num_attention_heads 6 is not divisible by --tp 4"},
        {"qwen3", "\"vocab_size\": 300", "\"vocab_size\": 3", NULL, NULL, 4, 0,
         "vocab_size 3 is too small to shard over --tp 4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = derive_config(cases[i].base, cases[i].from, cases[i].to, cases[i].from2,
                                  cases[i].to2);
        ASSERT_MSG(dir, "cannot derive case %zu from %s", i, cases[i].base);
        int ok = open_fails_with(dir, cases[i].tp, cases[i].ep, cases[i].want, msg, sizeof msg);
        rm_dir(dir);
        free(dir);
        ASSERT_MSG(ok, "case %zu: got \"%s\", want \"%s\"", i, msg, cases[i].want);
    }
}

TEST(a_sharded_load_without_a_matching_communicator_is_refused)
{
    char fx[1200];
    snprintf(fx, sizeof fx, "%s/tests/golden/models/llama", sd_test_srcdir());
    sd_backend *be;
    ASSERT_OK(sd_cpu_backend_create(&be, 1));
    sd_model *m = NULL;
    sd_err err = {0};
    sd_model_opts mo = {.max_tokens = 8, .tp_rank = 0, .tp_size = 2};
    int rc = sd_model_load(&m, fx, be, &mo, &err);
    ASSERT_EQ(rc, SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "communicator of 2 ranks");
    sd_comm *c;
    ASSERT_OK(sd_thread_comm_create(&c, 4, &err));
    mo.comm = c;
    ASSERT_EQ(sd_model_load(&m, fx, be, &mo, &err), SD_EINVAL);
    mo = (sd_model_opts){.max_tokens = 8, .tp_rank = 2, .tp_size = 2, .comm = c};
    ASSERT_EQ(sd_model_load(&m, fx, be, &mo, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "rank 2 is not in 0..1");
    ASSERT(m == NULL);
    sd_comm_destroy(c);
    sd_cpu_backend_destroy(be);
}

/* ---- the residual step through a communicator's fused hook: a thread comm
 * underneath and a plain-C fused all-reduce + add + RMSNorm (the CPU
 * rmsnorm's formula), the shape of the custom GPU kernel's hook (comm/hook_comm.h) */

typedef struct hk_rank {
    sd_model *m;
    const int32_t *ids;
    int n;
    float *logits;
    int rc;
    sd_err err;
    sd_comm *comm;
} hk_rank;

static void *hk_rank_main(void *arg)
{
    hk_rank *r = arg;
    sd_seq_out so = {.logits = r->logits};
    r->rc = sd_runner_target(r->m, r->ids, r->n, 0, &so, &r->err);
    if (r->rc)
        sd_comm_abort(r->comm);
    return NULL;
}

/* --tp P on ranks whose communicator has the hook: every rank's logits are
 * the thread comm's (sd_tp_runner) bit for bit, and the model called the
 * hook twice per layer (after attention, after the FFN) per forward. */
static int hooked_tp(const char *name, const char *dir, int P, int ep, char *msg, size_t ml)
{
    int32_t ids[16];
    int n = fixture_ids(dir, ids, 16);
    hook_comm h;
    memset(&h, 0, sizeof h);
    sd_err err = {0};
    sd_backend *be[HOOK_COMM_MAXP] = {0};
    hk_rank rk[HOOK_COMM_MAXP];
    memset(rk, 0, sizeof rk);
    float *want = NULL;
    sd_tp_runner *t = NULL;
    int ok = 0, V = 0, L = 0;
    if (n < 2 || hook_comm_open(&h, P, INT_MAX, &err)) /* the hook takes every call */
        goto done;
    for (int r = 0; r < P; r++) {
        sd_model_opts mo = {.max_tokens = 16, .tp_rank = r, .tp_size = P, .comm = &h.pub,
                            .ep = ep};
        if (sd_cpu_backend_create(&be[r], 1) || sd_model_load(&rk[r].m, dir, be[r], &mo, &err) ||
            sd_model_alloc_kv(rk[r].m, n, &err))
            goto done;
        const sd_model_cfg *c = sd_model_cfg_of(rk[r].m);
        V = c->vocab_size;
        L = c->num_layers;
        h.scratch[r] = malloc((size_t)16 * c->hidden_size * sizeof(float));
        rk[r] = (hk_rank){.m = rk[r].m, .ids = ids, .n = n, .comm = &h.pub,
                          .logits = malloc((size_t)n * V * sizeof(float))};
    }
    pthread_t tid[HOOK_COMM_MAXP];
    for (int r = 0; r < P; r++)
        pthread_create(&tid[r], NULL, hk_rank_main, &rk[r]);
    for (int r = 0; r < P; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < P; r++)
        if (rk[r].rc) {
            err = rk[r].err;
            goto done;
        }
    sd_model_opts mo = {.max_tokens = 16, .ep = ep};
    want = malloc((size_t)n * V * sizeof(float));
    sd_seq_out so = {.logits = want};
    if (runner_open(&t, dir, P, P, &mo, &err) || sd_tp_runner_alloc_kv(t, n, &err) ||
        sd_tp_runner_target(t, ids, n, 0, &so, &err))
        goto done;
    ok = 1;
    for (int r = 0; r < P && ok; r++) {
        ok = !memcmp(rk[r].logits, want, (size_t)n * V * sizeof(float));
        if (!ok)
            snprintf(msg, ml, "%s tp %d: rank %d's logits differ from the thread comm's", name, P,
                     r);
        else if (h.calls[r] != 2 * L) {
            ok = 0;
            snprintf(msg, ml, "%s tp %d: rank %d called the hook %d times, want %d", name, P, r,
                     h.calls[r], 2 * L);
        }
    }
done:
    if (!ok && !msg[0])
        snprintf(msg, ml, "%s tp %d: %.400s", name, P, err.msg);
    sd_tp_runner_close(t);
    free(want);
    for (int r = 0; r < P; r++) {
        sd_model_free(rk[r].m);
        if (be[r])
            sd_cpu_backend_destroy(be[r]);
        free(rk[r].logits);
    }
    hook_comm_close(&h);
    return ok;
}

TEST(the_residual_steps_go_through_the_comms_fused_hook_twice_a_layer_with_the_same_bits)
{
    static const struct {
        const char *fx;
        int tp, ep;
    } cases[] = {{"llama", 2, 0}, {"qwen3", 4, 0}, {"deepseek-v3", 2, 1}, {"deepseek-v3", 4, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1200], msg[512] = "";
        snprintf(dir, sizeof dir, "%s/tests/golden/models/%s", sd_test_srcdir(), cases[i].fx);
        int ok = hooked_tp(cases[i].fx, dir, cases[i].tp, cases[i].ep, msg, sizeof msg);
        ASSERT_MSG(ok, "%s", msg);
    }
}

/* ---- the CLI */

static int run_cmd(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(specd_logits_tp_2_and_tp_4_ep_write_the_tp_1_file)
{
    const char *bin = getenv("SPECD_BIN");
    if (!bin || !sd_file_exists(bin))
        TEST_SKIP("SPECD_BIN is not set (run through meson test)");
    char *dir = tmp_dir();
    ASSERT(dir);
    char fx[1200], cmd[4096], fa[1300], fb[1300], fd[1300];
    snprintf(fx, sizeof fx, "%s/tests/golden/models/deepseek-v3", sd_test_srcdir());
    snprintf(fa, sizeof fa, "%s/a.f32", dir);
    snprintf(fb, sizeof fb, "%s/b.f32", dir);
    snprintf(fd, sizeof fd, "%s/d.f32", dir);
    const char *ids = "3,17,250,9,100,383,42,7";
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --device cpu --ids %s --out '%s' --tp 1",
             bin, fx, ids, fa);
    int rc1 = run_cmd(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' logits --model '%s' --device cpu --ids %s --out '%s' --tp 2 --threads 2", bin,
             fx, ids, fb);
    int rc2 = run_cmd(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' logits --model '%s' --device cpu --ids %s --out '%s' --tp 4 --ep --threads 4",
             bin, fx, ids, fd);
    int rc4 = run_cmd(cmd);
    /* a config that cannot split: exit status 1 and a message naming the key */
    snprintf(cmd, sizeof cmd,
             "'%s' logits --model '%s' --device cpu --ids %s --out '%s/c.f32' --tp 3 2>&1 | "
             "grep -q 'num_attention_heads 4 is not divisible by --tp 3'",
             bin, fx, ids, dir);
    int rc3 = run_cmd(cmd);
    char *a = NULL, *b = NULL, *e = NULL;
    size_t la = 0, lb = 0, le = 0;
    sd_err err = {0};
    int ra = rc1 == 0 ? sd_read_file(fa, &a, &la, &err) : -1;
    int rb = rc2 == 0 ? sd_read_file(fb, &b, &lb, &err) : -1;
    int re = rc4 == 0 ? sd_read_file(fd, &e, &le, &err) : -1;
    rm_dir(dir);
    free(dir);
    size_t n = la / sizeof(float);
    double scale = ra == 0 ? max_abs((float *)a, n) : 0;
    double d = rb == 0 && lb == la ? max_diff((float *)a, (float *)b, n) : INFINITY;
    double de = re == 0 && le == la ? max_diff((float *)a, (float *)e, n) : INFINITY;
    free(a);
    free(b);
    free(e);
    ASSERT_EQ(rc1, 0);
    ASSERT_EQ(rc2, 0);
    ASSERT_EQ(rc3, 0);
    ASSERT_EQ(rc4, 0);
    ASSERT(ra == 0 && rb == 0 && re == 0);
    ASSERT_EQ(la, (size_t)8 * 384 * sizeof(float));
    ASSERT_MSG(d <= TP_TOL * scale, "--tp 2: max|d| %.3g vs max|logit| %.3g", d, scale);
    ASSERT_MSG(de <= TP_TOL * scale, "--tp 4 --ep: max|d| %.3g vs max|logit| %.3g", de, scale);
}

TEST_MAIN(T(tp_2_and_4_logits_hidden_and_mtp_equal_tp_1_on_every_fixture),
          T(attention_biases_and_a_vocab_no_tp_divides_give_tp_1_logits),
          T(configs_that_do_not_split_are_refused_naming_the_config_key),
          T(a_sharded_load_without_a_matching_communicator_is_refused),
          T(the_residual_steps_go_through_the_comms_fused_hook_twice_a_layer_with_the_same_bits),
          T(specd_logits_tp_2_and_tp_4_ep_write_the_tp_1_file))

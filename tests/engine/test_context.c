/* Work follows the real context, not the maximum: the same requests decode
 * with --max-context 4096 and 131072 (a model whose positions allow both)
 * give the same tokens in about the same time. What could grow with the
 * maximum: the block table's upload (it copies only the columns in use),
 * attention (it walks each token's own positions), per-step buffers (sized
 * once at start). SD_TEST_DEVICE=cuda runs it on a GPU. */
#include <pthread.h>
#include <unistd.h>

#include "core/config.h"
#include "core/util.h"
#include "engine/engine.h"
#include "test.h"
#include "tiny_model.h"

typedef struct res {
    pthread_mutex_t mu;
    int32_t ids[128];
    int n, done;
    sd_req_stats st;
} res;

static void on_output(void *u, const char *t, size_t l, const int32_t *ids, int n)
{
    (void)t;
    (void)l;
    res *r = u;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n && r->n < 128; i++)
        r->ids[r->n++] = ids[i];
    pthread_mutex_unlock(&r->mu);
}

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    (void)why;
    (void)msg;
    res *r = u;
    pthread_mutex_lock(&r->mu);
    r->st = *st;
    r->done = 1;
    pthread_mutex_unlock(&r->mu);
}

static sd_engine *open_engine(const char *model, int max_ctx)
{
    sd_opts o;
    sd_err err = {0};
    if (sd_opts_init(&o, &err))
        return NULL;
    const char *dev = getenv("SD_TEST_DEVICE");
    char buf[32];
    sd_opts_set(&o, SD_CMD_GENERATE, "model", model, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "device", dev && dev[0] ? dev : "cpu", &err);
    snprintf(buf, sizeof buf, "%d", max_ctx);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-context", buf, &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "max-batch", "2", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "threads", "1", &err);
    sd_opts_set(&o, SD_CMD_GENERATE, "log-level", "warn", &err);
    sd_engine *e = NULL;
    if (sd_engine_create(&e, &o, &err))
        fprintf(stderr, "  engine: %s\n", err.msg);
    sd_opts_free(&o);
    return e;
}

/* One request of 48 prompt tokens and 96 greedy tokens; returns its decode
 * time per token (seconds), or -1. */
static double decode_once(sd_engine *e, res *out)
{
    sd_err err = {0};
    int32_t prompt[48];
    for (int i = 0; i < 48; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % 500);
    memset(out, 0, sizeof *out);
    pthread_mutex_init(&out->mu, NULL);
    sd_gen_params gp = {.max_tokens = 96, .top_p = 1, .seed = 1, .has_seed = 1, .ignore_eos = 1};
    sd_req_events ev = {.on_output = on_output, .on_finish = on_finish};
    double t = -1;
    if (sd_engine_submit(e, prompt, 48, &gp, &ev, out, NULL, &err) == 0) {
        for (int spin = 0; spin < 600000; spin++) {
            pthread_mutex_lock(&out->mu);
            int done = out->done;
            pthread_mutex_unlock(&out->mu);
            if (done)
                break;
            usleep(100);
        }
        if (out->done && out->n > 1)
            t = (out->st.total_s - out->st.ttft_s) / (double)(out->n - 1);
    } else {
        fprintf(stderr, "  submit: %s\n", err.msg);
    }
    pthread_mutex_destroy(&out->mu);
    return t;
}

TEST(decode_time_does_not_grow_from_4k_to_128k_max_context)
{
    tiny_spec sp = {.vocab = 512, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2,
                    .inter = 128, .max_pos = 131072, .scale = 0.05f, .seed = sd_test_seed()};
    char *dir = tiny_model_write(&sp);
    ASSERT(dir != NULL);
    sd_engine *e4 = open_engine(dir, 4096), *e128 = open_engine(dir, 131072);
    ASSERT(e4 != NULL && e128 != NULL);
    res a = {0}, b = {0};
    /* alternated and repeated: the fastest run of each filters the noise of
     * a shared machine */
    double t4 = 1e30, t128 = 1e30;
    for (int rep = 0; rep < 8; rep++) {
        double x = decode_once(e4, &a), y = decode_once(e128, &b);
        ASSERT(x > 0 && y > 0);
        t4 = x < t4 ? x : t4;
        t128 = y < t128 ? y : t128;
        ASSERT_EQ(a.n, 96);
        ASSERT_EQ(b.n, 96);
        for (int i = 0; i < a.n; i++)
            ASSERT_EQ(a.ids[i], b.ids[i]);
    }
    sd_engine_destroy(e4);
    sd_engine_destroy(e128);
    fprintf(stderr, "  decode step: %.1f us at max context 4096, %.1f us at 131072 (ratio %.2f)\n",
            t4 * 1e6, t128 * 1e6, t128 / t4);
    /* 32x the maximum: a step that scaled with it would be many times
     * slower. Release builds measure a ratio of 0.9-1.02; under ASan the
     * engine with the 32x larger cache runs up to ~1.4x slower (its shadow
     * memory), hence the margin. */
    const int flat = t128 < 2.0 * t4 + 20e-6;
    /* the row tests/gpu/validate.sh keeps (error: the ratio, bound: 2x) */
    printf("RESULT {\"test\": \"decode step at --max-context 131072 over 4096 (step-time "
           "ratio)\", \"error\": %.3f, \"bound\": 2, \"passed\": %s, \"step_us_4k\": %.2f, "
           "\"step_us_128k\": %.2f, \"ratio\": %.3f}\n",
           t128 / t4, flat ? "true" : "false", t4 * 1e6, t128 * 1e6, t128 / t4);
    ASSERT_MSG(flat, "the step grew with the maximum context");
    tiny_model_remove(dir);
}

TEST_MAIN(T(decode_time_does_not_grow_from_4k_to_128k_max_context))

/* engine/tp's virtual backend on CPU ranks: one allocation per rank behind
 * rank 0's address, addresses mapped by offset (one past the end too), ops
 * outside a rank's context reach every rank, ops inside one reach that rank
 * only, downloads read rank 0, a freed allocation maps to nothing. */
#include <string.h>

#include <pthread.h>
#include <unistd.h>

#include "core/config.h"
#include "core/util.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/tp.h"
#include "test.h"

typedef struct job {
    sd_tp *t;
    int32_t *buf;
} job;

static int in_rank(void *ctx, int r, sd_err *err)
{
    (void)err;
    job *j = ctx;
    sd_backend *vb = sd__tp_backend(j->t);
    int32_t v[2] = {r, sd__tp_rank()};
    return vb->ops->upload(vb, j->buf + 2, v, sizeof v);
}

TEST(virtual_backend_maps_addresses_and_reaches_the_right_ranks)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "tp", "3", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "device", "cpu", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "threads", "3", &err));
    sd_tp *t = NULL;
    ASSERT_MSG(sd__tp_open(&t, &o, 64, &err) == 0, "%s", err.msg);
    sd_opts_free(&o);
    ASSERT_EQ(sd__tp_size(t), 3);
    sd_backend *vb = sd__tp_backend(t);
    int32_t *a = vb->ops->alloc(vb, 16 * sizeof(int32_t));
    int32_t *b = vb->ops->alloc(vb, 8 * sizeof(int32_t));
    ASSERT(a && b);
    for (int r = 0; r < 3; r++) {
        const int32_t *ar = sd__tp_map(t, a, r), *br = sd__tp_map(t, b, r);
        ASSERT(ar && br);
        ASSERT(r > 0 || ar == a);
        ASSERT(sd__tp_map(t, a + 5, r) == ar + 5);
        ASSERT(sd__tp_map(t, a + 16, r) == ar + 16); /* one past the end */
        for (int q = 0; q < r; q++)
            ASSERT(sd__tp_map(t, a, q) != ar);
    }
    /* outside a rank's context: every rank gets the upload */
    int32_t v[16], got[16];
    for (int i = 0; i < 16; i++)
        v[i] = 7 * i + 1;
    ASSERT_OK(vb->ops->upload(vb, a, v, sizeof v));
    for (int r = 0; r < 3; r++) {
        sd_backend *rb = sd__tp_rank_backend(t, r);
        memset(got, 0, sizeof got);
        ASSERT_OK(rb->ops->download(rb, got, sd__tp_map(t, a, r), sizeof got));
        ASSERT(memcmp(got, v, sizeof v) == 0);
    }
    /* inside: each rank writes its own copy only, and knows its rank */
    job j = {t, a};
    ASSERT_OK(sd__tp_each(t, in_rank, &j, &err));
    for (int r = 0; r < 3; r++) {
        sd_backend *rb = sd__tp_rank_backend(t, r);
        ASSERT_OK(rb->ops->download(rb, got, sd__tp_map(t, a, r), sizeof got));
        ASSERT_EQ(got[2], r);
        ASSERT_EQ(got[3], r);
        ASSERT_EQ(got[4], v[4]);
    }
    ASSERT_EQ(sd__tp_rank(), -1);
    /* downloads read rank 0 */
    ASSERT_OK(vb->ops->download(vb, got, a, sizeof got));
    ASSERT_EQ(got[2], 0);
    /* a freed allocation maps to nothing; the other one still maps */
    vb->ops->free(vb, a);
    ASSERT(sd__tp_map(t, a + 1, 1) == NULL);
    ASSERT(sd__tp_map(t, b, 2) != NULL);
    vb->ops->free(vb, b);
    sd__tp_close(t);
}

TEST(tensor_parallel_ranks_refuse_what_they_cannot_run)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "tp", "2", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "device", "cpu", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "allreduce", "oneshot", &err));
    sd_tp *t = NULL;
    ASSERT(sd__tp_open(&t, &o, 64, &err) != 0);
    ASSERT(t == NULL);
    ASSERT(strstr(err.msg, "--allreduce oneshot") != NULL);
    sd_opts_free(&o);
}

typedef struct fin {
    pthread_mutex_t mu;
    int done;
    sd_finish why;
} fin;

static void on_finish(void *u, sd_finish why, const sd_req_stats *st, const char *msg)
{
    (void)st;
    (void)msg;
    fin *f = u;
    pthread_mutex_lock(&f->mu);
    f->why = why;
    f->done = 1;
    pthread_mutex_unlock(&f->mu);
}

/* A rank group whose communicator was aborted (a rank failed) cannot run a
 * step again: requests end with an error, not a hang, and the engine says
 * its steps are failing (/health and the watchdog read that). */
TEST(an_aborted_rank_group_fails_requests_and_reports_failing_steps)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    char *m = sd_strfmt("%s/tests/golden/models/llama", sd_test_srcdir());
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "model", m, &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "tp", "2", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "device", "cpu", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "threads", "2", &err));
    ASSERT_OK(sd_opts_set(&o, SD_CMD_GENERATE, "max-context", "64", &err));
    sd_engine *e = NULL;
    ASSERT_MSG(sd_engine_create(&e, &o, &err) == 0, "%s", err.msg);
    sd_opts_free(&o);
    free(m);
    sd_engine_stats st;
    sd_engine_get_stats(e, &st);
    ASSERT_EQ(st.tp, 2);
    ASSERT_EQ(st.failing, 0);
    sd_comm_abort(sd__tp_comm(e->tp));
    fin f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    int32_t prompt[3] = {1, 2, 3};
    sd_gen_params gp = {.max_tokens = 4, .top_p = 1, .ignore_eos = 1};
    sd_req_events ev = {.on_finish = on_finish};
    ASSERT_OK(sd_engine_submit(e, prompt, 3, &gp, &ev, &f, NULL, &err));
    for (int spin = 0; spin < 20000; spin++) {
        pthread_mutex_lock(&f.mu);
        int d = f.done;
        pthread_mutex_unlock(&f.mu);
        if (d)
            break;
        usleep(1000);
    }
    ASSERT_EQ(f.done, 1);
    ASSERT_EQ(f.why, SD_FINISH_ERROR);
    usleep(50000);
    sd_engine_get_stats(e, &st);
    ASSERT_GE(st.failing, 1);
    ASSERT_GE(st.failed_steps, 1);
    sd_engine_destroy(e);
}

TEST_MAIN(T(virtual_backend_maps_addresses_and_reaches_the_right_ranks),
          T(tensor_parallel_ranks_refuse_what_they_cannot_run),
          T(an_aborted_rank_group_fails_requests_and_reports_failing_steps))

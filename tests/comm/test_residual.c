/* sd_comm_allreduce_add_rmsnorm, the residual step after a row-parallel
 * layer: on the thread comm (no fused hook) it is bit for bit the all-reduce,
 * then the backend's add and rmsnorm, on every rank; a communicator with a
 * fused hook gets every call, and a call the hook refuses (SD_ENOTSUP) runs
 * the unfused steps with the same result; bad arguments are refused. */
#include <math.h>
#include <pthread.h>

#include "comm/comm.h"
#include "comm/hook_comm.h"
#include "core/dtype.h"
#include "test.h"

#define MAXP 4
#define MAXN (5 * 4096)

typedef struct shape {
    int rows, d;
} shape;
static const shape shapes[] = {{1, 64}, {5, 100}, {3, 4096}, {5, 4096}};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))
static const sd_dtype dts[] = {SD_DT_F32, SD_DT_BF16};
#define N_DTS 2

/* One group's inputs and what each rank got. */
typedef struct fixture {
    int P;
    uint64_t seed;
    float *partial[MAXP]; /* (MAXN) */
    float *resid;         /* (MAXN) x before the step, the same on every rank */
    float wf[4096];
    uint16_t wb[4096];
    float *got_x[MAXP][N_DTS][N_SHAPES], *got_xn[MAXP][N_DTS][N_SHAPES];
    sd_comm *comm;
    int rc[MAXP];
} fixture;

static void fixture_init(fixture *f, int P, sd_comm *comm)
{
    memset(f, 0, sizeof *f);
    f->P = P;
    f->comm = comm;
    f->seed = sd_test_seed();
    uint64_t s = f->seed;
    for (int r = 0; r < P; r++) {
        f->partial[r] = malloc(MAXN * sizeof(float));
        for (int i = 0; i < MAXN; i++)
            f->partial[r][i] = sd_test_randf(&s, -1, 1);
    }
    f->resid = malloc(MAXN * sizeof(float));
    for (int i = 0; i < MAXN; i++)
        f->resid[i] = sd_test_randf(&s, -2, 2);
    for (int c = 0; c < 4096; c++) {
        f->wf[c] = sd_test_randf(&s, 0.5f, 1.5f);
        f->wb[c] = sd_f32_to_bf16(f->wf[c]);
    }
}

static void fixture_free(fixture *f)
{
    for (int r = 0; r < f->P; r++) {
        free(f->partial[r]);
        for (int t = 0; t < N_DTS; t++)
            for (int k = 0; k < N_SHAPES; k++) {
                free(f->got_x[r][t][k]);
                free(f->got_xn[r][t][k]);
            }
    }
    free(f->resid);
}

typedef struct rank_arg {
    fixture *f;
    int rank;
} rank_arg;

/* Every rank: its own CPU backend and buffers, one residual step per
 * (weight dtype, shape). */
static void *rank_main(void *arg)
{
    rank_arg *a = arg;
    fixture *f = a->f;
    int r = a->rank, rc = 0;
    sd_backend *be = NULL;
    if (sd_cpu_backend_create(&be, 1)) {
        f->rc[r] = SD_ENOMEM;
        sd_comm_abort(f->comm);
        return NULL;
    }
    float *part = malloc(MAXN * sizeof(float));
    for (int t = 0; t < N_DTS && !rc; t++)
        for (int k = 0; k < N_SHAPES && !rc; k++) {
            int rows = shapes[k].rows, d = shapes[k].d;
            size_t n = (size_t)rows * d;
            sd_weight w;
            be->ops->weight(be, &w, t ? (const void *)f->wb : (const void *)f->wf, dts[t], 1, d);
            float *x = malloc(n * sizeof(float)), *xn = malloc(n * sizeof(float));
            memcpy(part, f->partial[r], n * sizeof(float));
            memcpy(x, f->resid, n * sizeof(float));
            rc = sd_comm_allreduce_add_rmsnorm(f->comm, r, be, part, x, xn, &w, rows, d, 1e-5f);
            be->ops->weight_free(be, &w);
            f->got_x[r][t][k] = x;
            f->got_xn[r][t][k] = xn;
        }
    free(part);
    sd_cpu_backend_destroy(be);
    f->rc[r] = rc;
    if (rc)
        sd_comm_abort(f->comm);
    return NULL;
}

static int run(fixture *f)
{
    pthread_t tid[MAXP];
    rank_arg args[MAXP];
    for (int r = 0; r < f->P; r++) {
        args[r] = (rank_arg){f, r};
        pthread_create(&tid[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < f->P; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < f->P; r++)
        if (f->rc[r])
            return f->rc[r];
    return 0;
}

/* Elements of every rank's x and xn that differ from the serial unfused
 * steps: the rank-order sum, the CPU backend's add, then its rmsnorm. */
static long count_wrong(fixture *f)
{
    sd_backend *be;
    if (sd_cpu_backend_create(&be, 1))
        return -1;
    long wrong = 0;
    for (int t = 0; t < N_DTS; t++)
        for (int k = 0; k < N_SHAPES; k++) {
            int rows = shapes[k].rows, d = shapes[k].d;
            size_t n = (size_t)rows * d;
            float *sum = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float)),
                  *xn = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                float s = f->partial[0][i];
                for (int r = 1; r < f->P; r++)
                    s += f->partial[r][i];
                sum[i] = s;
            }
            memcpy(x, f->resid, n * sizeof(float));
            sd_weight w;
            be->ops->weight(be, &w, t ? (const void *)f->wb : (const void *)f->wf, dts[t], 1, d);
            be->ops->add(be, x, sum, rows, d);
            be->ops->rmsnorm(be, xn, x, &w, rows, d, d, d, 1e-5f);
            be->ops->weight_free(be, &w);
            for (int r = 0; r < f->P; r++)
                for (size_t i = 0; i < n; i++) {
                    wrong += memcmp(&f->got_x[r][t][k][i], &x[i], sizeof(float)) != 0;
                    wrong += memcmp(&f->got_xn[r][t][k][i], &xn[i], sizeof(float)) != 0;
                }
            free(sum);
            free(x);
            free(xn);
        }
    sd_cpu_backend_destroy(be);
    return wrong;
}

TEST(thread_comm_residual_step_is_allreduce_then_add_then_rmsnorm_bit_for_bit_on_every_rank)
{
    for (int P = 1; P <= MAXP; P++) {
        sd_comm *c = NULL;
        sd_err err = {0};
        ASSERT_MSG(sd_thread_comm_create(&c, P, &err) == 0, "%s", err.msg);
        fixture f;
        fixture_init(&f, P, c);
        int rc = run(&f);
        long wrong = rc ? -1 : count_wrong(&f);
        fixture_free(&f);
        sd_comm_destroy(c);
        ASSERT_EQ(rc, 0);
        ASSERT_MSG(wrong == 0, "P = %d: %ld elements differ from the unfused steps", P, wrong);
    }
}

TEST(a_fused_hook_gets_every_call_and_a_call_it_refuses_runs_unfused_with_the_same_bits)
{
    int P = 3;
    hook_comm h;
    sd_err err = {0};
    /* max 3 rows: takes (1, 64), (3, 4096); refuses (5, 100), (5, 4096) */
    ASSERT_MSG(hook_comm_open(&h, P, 3, &err) == 0, "%s", err.msg);
    for (int r = 0; r < P; r++)
        h.scratch[r] = malloc(MAXN * sizeof(float));
    fixture f;
    fixture_init(&f, P, &h.pub);
    int rc = run(&f);
    long wrong = rc ? -1 : count_wrong(&f);
    fixture_free(&f);
    hook_comm_close(&h);
    ASSERT_EQ(rc, 0);
    ASSERT_MSG(wrong == 0, "%ld elements differ from the unfused steps", wrong);
    for (int r = 0; r < P; r++) {
        ASSERT_EQ(h.calls[r], N_DTS * N_SHAPES);
        ASSERT_EQ(h.taken[r], N_DTS * 2);
    }
}

TEST(residual_step_bad_arguments_are_refused_and_zero_rows_do_nothing)
{
    sd_comm *c = NULL;
    sd_err err = {0};
    ASSERT(sd_thread_comm_create(&c, 1, &err) == 0);
    sd_backend *be = NULL;
    ASSERT(sd_cpu_backend_create(&be, 1) == 0);
    float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[8] = {0}, xn[8] = {0}, wf[4] = {1, 1, 1, 1};
    sd_weight w;
    be->ops->weight(be, &w, wf, SD_DT_F32, 1, 4);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, NULL, p, x, xn, &w, 2, 4, 1e-6f), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 1, be, p, x, xn, &w, 2, 4, 1e-6f), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, be, p, x, xn, NULL, 2, 4, 1e-6f), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, be, p, x, xn, &w, 2, 0, 1e-6f), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, be, NULL, x, xn, &w, 2, 4, 1e-6f), SD_EINVAL);
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, be, p, x, xn, &w, 0, 4, 1e-6f), 0);
    ASSERT(x[0] == 0 && xn[0] == 0);
    /* one rank: x = p, xn its norm */
    ASSERT_EQ(sd_comm_allreduce_add_rmsnorm(c, 0, be, p, x, xn, &w, 2, 4, 1e-6f), 0);
    ASSERT(x[7] == 8);
    ASSERT_NEAR(xn[0], 1.0 / sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6), 1e-6);
    be->ops->weight_free(be, &w);
    sd_cpu_backend_destroy(be);
    sd_comm_destroy(c);
}

TEST_MAIN(T(thread_comm_residual_step_is_allreduce_then_add_then_rmsnorm_bit_for_bit_on_every_rank),
          T(a_fused_hook_gets_every_call_and_a_call_it_refuses_runs_unfused_with_the_same_bits),
          T(residual_step_bad_arguments_are_refused_and_zero_rows_do_nothing))

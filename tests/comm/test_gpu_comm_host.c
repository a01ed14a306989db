/* The host-side parts of the GPU communicator that need no GPU: the
 * topology matrix text, the probe's answer on a machine without the NVIDIA
 * driver, the --allreduce names, and the autotune table (pick by size,
 * log text, /metrics lines). */
#include "comm/gpu_comm.h"
#include "test.h"

static void nvlink_pair(sd_topo *t)
{
    memset(t, 0, sizeof *t);
    t->n = 2;
    for (int i = 0; i < 2; i++) {
        snprintf(t->name[i], sizeof t->name[i], "NVIDIA H200");
        t->numa[i] = 0;
        snprintf(t->cpus[i], sizeof t->cpus[i], "0-47");
        for (int j = 0; j < 2; j++) {
            t->link[i][j] = i == j ? SD_LINK_SELF : SD_LINK_NVLINK;
            t->nvlinks[i][j] = i == j ? 0 : 18;
            t->p2p[i][j] = 1;
        }
    }
}

TEST(topology_prints_like_nvidia_smi_topo_m)
{
    sd_topo t;
    nvlink_pair(&t);
    char buf[4096];
    sd_topo_format(&t, buf, sizeof buf);
    ASSERT_CONTAINS(buf, "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n");
    ASSERT_CONTAINS(buf, "GPU0    X       NV18    0-47            0\n");
    ASSERT_CONTAINS(buf, "GPU1    NV18    X       0-47            0\n");
    ASSERT_CONTAINS(buf, "P2P     GPU0    GPU1    \nGPU0    X       OK      \n");
    /* PCIe across NUMA nodes without P2P, unknown affinity */
    t.link[0][1] = t.link[1][0] = SD_LINK_SYS;
    t.p2p[0][1] = 0;
    t.p2p[1][0] = -1;
    t.numa[1] = -1;
    t.cpus[1][0] = 0;
    sd_topo_format(&t, buf, sizeof buf);
    ASSERT_CONTAINS(buf, "GPU0    X       SYS     0-47            0\n");
    ASSERT_CONTAINS(buf, "GPU1    SYS     X       N/A             N/A\n");
    ASSERT_CONTAINS(buf, "GPU0    X       NS      \nGPU1    ?       X       \n");
    ASSERT_CONTAINS(buf, "Legend:");
    /* a short buffer is cut, never overrun */
    char small[40];
    memset(small, 'z', sizeof small);
    sd_topo_format(&t, small, 32);
    ASSERT_EQ(strlen(small), 31);
    ASSERT_EQ(small[33], 'z');
}

TEST(the_probe_either_describes_the_gpus_or_says_why_not)
{
    sd_topo t;
    sd_err err = {0};
    int rc = sd_topo_probe(&t, &err);
    if (rc) {
        /* no driver library here: the message names it */
        ASSERT_MSG(strstr(err.msg, "libnvidia-ml") || strstr(err.msg, "NVML"), "%s", err.msg);
        return;
    }
    ASSERT_GE(t.n, 1);
    char buf[8192];
    sd_topo_format(&t, buf, sizeof buf);
    fprintf(stderr, "%s", buf);
    ASSERT_CONTAINS(buf, "GPU0");
    for (int i = 0; i < t.n; i++)
        ASSERT_EQ(t.link[i][i], SD_LINK_SELF);
}

TEST(allreduce_names_parse_both_ways)
{
    ASSERT_EQ(sd_ar_algo_parse("auto"), -1);
    ASSERT_EQ(sd_ar_algo_parse("bogus"), -2);
    for (int a = 0; a < SD_AR_N_ALGOS; a++)
        ASSERT_EQ(sd_ar_algo_parse(sd_ar_algo_name((sd_ar_algo)a)), a);
    ASSERT_STR_EQ(sd_ar_algo_name(SD_AR_TWOSHOT), "twoshot");
}

static sd_ar_table sample_table(void)
{
    /* sizes out of order on purpose: pick and the texts sort by size */
    sd_ar_table t = {.n = 3};
    t.c[0] = (sd_ar_choice){.floats = 262144, .algo = SD_AR_TWOSHOT,
                            .us = {30.0, 45.0, 21.5}, .ok = {1, 1, 1}};
    t.c[1] = (sd_ar_choice){.floats = 1024, .algo = SD_AR_ONESHOT,
                            .us = {12.0, 4.25, 6.0}, .ok = {1, 1, 1}};
    t.c[2] = (sd_ar_choice){.floats = 4194304, .algo = SD_AR_NCCL,
                            .us = {180.0, 0, 200.0}, .ok = {1, 0, 0}};
    return t;
}

TEST(table_pick_takes_the_smallest_tuned_size_that_holds_the_message)
{
    sd_ar_table t = sample_table();
    ASSERT_EQ(sd_ar_table_pick(&t, 1), SD_AR_ONESHOT);
    ASSERT_EQ(sd_ar_table_pick(&t, 1024), SD_AR_ONESHOT);
    ASSERT_EQ(sd_ar_table_pick(&t, 1025), SD_AR_TWOSHOT);
    ASSERT_EQ(sd_ar_table_pick(&t, 262144), SD_AR_TWOSHOT);
    ASSERT_EQ(sd_ar_table_pick(&t, 262148), SD_AR_NCCL);
    ASSERT_EQ(sd_ar_table_pick(&t, (size_t)1 << 30), SD_AR_NCCL); /* above the table */
    ASSERT_EQ(sd_ar_table_pick(NULL, 8), SD_AR_NCCL);
    sd_ar_table empty = {0};
    ASSERT_EQ(sd_ar_table_pick(&empty, 8), SD_AR_NCCL);
}

TEST(table_text_and_metrics_list_every_size_with_its_pick)
{
    sd_ar_table t = sample_table();
    char buf[4096];
    sd_ar_table_format(&t, buf, sizeof buf);
    const char *a = strstr(buf, "        1024         4096  oneshot");
    const char *b = strstr(buf, "      262144      1048576  twoshot");
    const char *c = strstr(buf, "     4194304     16777216     nccl");
    ASSERT_MSG(a && b && c && a < b && b < c, "%s", buf);
    ASSERT_CONTAINS(buf, "4.2"); /* oneshot at 1024 floats */
    ASSERT_CONTAINS(buf, "200.0 (wrong)");
    sd_ar_table_metrics(&t, buf, sizeof buf);
    ASSERT_CONTAINS(buf, "# TYPE specd_allreduce_choice gauge\n");
    ASSERT_CONTAINS(buf, "specd_allreduce_choice{bytes=\"4096\",algo=\"oneshot\"} 1\n");
    ASSERT_CONTAINS(buf, "specd_allreduce_choice{bytes=\"16777216\",algo=\"nccl\"} 1\n");
    ASSERT_CONTAINS(buf, "specd_allreduce_seconds{bytes=\"1048576\",algo=\"twoshot\"} 2.15e-05\n");
    /* a wrong result is never advertised as a time */
    ASSERT(strstr(buf, "bytes=\"16777216\",algo=\"twoshot\"") == NULL);
}

TEST(table_estimate_interpolates_the_timed_sizes_and_skips_wrong_or_untimed_ones)
{
    sd_ar_table t = sample_table();
    t.timed = 1;
    /* oneshot: 4.25 us at 1024 floats, 45 at 262144; wrong at 4194304 */
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_ONESHOT, 1024), 4.25, 1e-12);
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_ONESHOT, 256), 4.25, 1e-12); /* the floor */
    double mid = 1024 + (262144 - 1024) * 0.25;
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_ONESHOT, (size_t)mid), 4.25 + 0.25 * (45 - 4.25),
                1e-9);
    /* past the largest right size: scaled by the size */
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_ONESHOT, 4 * 262144), 4 * 45.0, 1e-9);
    /* nccl: right at every size; between 262144 and 4194304 */
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_NCCL, 262144 + (4194304 - 262144) / 2),
                (30.0 + 180.0) / 2, 1e-9);
    ASSERT_NEAR(sd_ar_table_est_us(&t, SD_AR_NCCL, 8388608), 360.0, 1e-9);
    /* untimed (forced) tables and missing tables estimate nothing */
    t.timed = 0;
    ASSERT_EQ(sd_ar_table_est_us(&t, SD_AR_ONESHOT, 1024), 0);
    ASSERT_EQ(sd_ar_table_est_us(NULL, SD_AR_NCCL, 1024), 0);
    sd_ar_table empty = {.timed = 1};
    ASSERT_EQ(sd_ar_table_est_us(&empty, SD_AR_NCCL, 1024), 0);
    t.timed = 1;
    ASSERT_EQ(sd_ar_table_est_us(&t, SD_AR_N_ALGOS, 1024), 0);
}

TEST_MAIN(T(topology_prints_like_nvidia_smi_topo_m),
          T(the_probe_either_describes_the_gpus_or_says_why_not),
          T(allreduce_names_parse_both_ways),
          T(table_pick_takes_the_smallest_tuned_size_that_holds_the_message),
          T(table_text_and_metrics_list_every_size_with_its_pick),
          T(table_estimate_interpolates_the_timed_sizes_and_skips_wrong_or_untimed_ones))

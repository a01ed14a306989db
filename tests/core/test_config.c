#include <unistd.h>
#include "core/config.h"
#include "core/util.h"
#include "test.h"

TEST(defaults_are_set_from_the_table)
{
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_init(&o, &err));
    ASSERT_EQ(o.port, 8000);
    ASSERT_STR_EQ(o.host, "127.0.0.1");
    ASSERT_EQ(o.spec_k, -1);
    ASSERT_NEAR(o.spec_margin, 0.02, 0);
    ASSERT_NEAR(o.top_p, 1.0, 0);
    ASSERT_EQ(o.max_body, 1048576);
    sd_opts_free(&o);
}

TEST(flags_parse_both_forms_and_sglang_aliases)
{
    char *argv[] = {"--port", "9001", "--max-batch=7", "--speculative-algorithm", "EAGLE3",
                    "--speculative-num-draft-tokens", "5", "--ep"};
    sd_opts o;
    sd_err err = {0};
    ASSERT_MSG(sd_opts_parse(&o, SD_CMD_SERVE, 8, argv, &err) == 0, "%s", err.msg);
    ASSERT_EQ(o.port, 9001);
    ASSERT_EQ(o.max_batch, 7);
    ASSERT_STR_EQ(o.spec, "eagle3");
    ASSERT_EQ(o.spec_k, 4);
    ASSERT_EQ(o.ep, 1);
    sd_opts_free(&o);
    char *argv2[] = {"--temperature=0.5", "--spec-k", "auto"};
    ASSERT_OK(sd_opts_parse(&o, SD_CMD_GENERATE, 3, argv2, &err));
    ASSERT_NEAR(o.temperature, 0.5, 0);
    ASSERT_EQ(o.spec_k, -1);
    sd_opts_free(&o);
}

TEST(bad_flags_give_one_line_errors)
{
    sd_opts o;
    sd_err err = {0};
    char *a1[] = {"--bogus", "1"};
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_SERVE, 2, a1, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "unknown option --bogus");
    sd_opts_free(&o);
    char *a2[] = {"--port"};
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_SERVE, 1, a2, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "missing value");
    sd_opts_free(&o);
    char *a3[] = {"--port", "99999"};
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_SERVE, 2, a3, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "--port");
    sd_opts_free(&o);
    char *a4[] = {"--top-p", "abc"};
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_GENERATE, 2, a4, &err), SD_EINVAL);
    sd_opts_free(&o);
    char *a5[] = {"--spec", "medusa"};
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_GENERATE, 2, a5, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "none|mtp");
    sd_opts_free(&o);
    char *a6[] = {"--port", "1"}; /* not an option of logits */
    ASSERT_EQ(sd_opts_parse(&o, SD_CMD_LOGITS, 2, a6, &err), SD_EINVAL);
    sd_opts_free(&o);
}

TEST(config_file_is_read_and_flags_override_it)
{
    char path[] = "/tmp/specd-test-conf-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    const char *txt = "# comment\nport = 7000\nhost = \"0.0.0.0\"\nmax-tokens = 5 # gen only\n";
    ASSERT_EQ(write(fd, txt, strlen(txt)), (long long)strlen(txt));
    close(fd);
    char *argv[] = {"--config", path, "--port", "7001"};
    sd_opts o;
    sd_err err = {0};
    ASSERT_OK(sd_opts_parse(&o, SD_CMD_SERVE, 4, argv, &err));
    ASSERT_EQ(o.port, 7001);
    ASSERT_STR_EQ(o.host, "0.0.0.0");
    sd_opts_free(&o);
    unlink(path);
}

TEST(sample_config_is_the_committed_one)
{
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    sd_opts_write_sample(f);
    fclose(f);
    char path[512];
    snprintf(path, sizeof path, "%s/etc/specd.conf", sd_test_srcdir());
    char *committed = NULL;
    sd_err err = {0};
    ASSERT_OK(sd_read_file(path, &committed, NULL, &err));
    int same = strcmp(mem, committed) == 0;
    free(mem);
    free(committed);
    ASSERT_MSG(same, "etc/specd.conf is stale: run `specd config > etc/specd.conf`");
}

TEST_MAIN(T(defaults_are_set_from_the_table), T(flags_parse_both_forms_and_sglang_aliases),
          T(bad_flags_give_one_line_errors), T(config_file_is_read_and_flags_override_it),
          T(sample_config_is_the_committed_one))

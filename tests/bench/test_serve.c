/* The serving load generator (bench/serve) against real HTTP servers on
 * loopback: a scripted one written here (known delays and faults), and
 * `specd serve` on the bundled model when both are present. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/serve/bench.h"
#include "bench/serve/sse.h"
#include "core/util.h"
#include "fake_server.h"
#include "test.h"

/* ---- set-up --------------------------------------------------------------------- */

static const char *const prompt_text[] = {"def add(a, b):\n", "class Stack:\n",
                                          "import os\n\ndef walk(path):\n"};

static sd_bench_prompts some_prompts(void)
{
    sd_bench_prompts p = {(char **)prompt_text, 3};
    return p;
}

static void cfg_for(sd_bench_cfg *c, int port, const sd_bench_prompts *p, int n, int conc)
{
    memset(c, 0, sizeof *c);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    sd_err err = {0};
    sd_bench_parse_url(url, &c->target, &err);
    c->endpoint = SD_BENCH_COMPLETIONS;
    c->model = "fake";
    c->max_tokens = 16;
    c->temperature = 0;
    c->num_requests = n;
    c->concurrency = conc;
    c->request_timeout_s = 20;
    c->prompts = p;
    c->seed = sd_test_seed();
}

static int count_status(const sd_bench_run *r, sd_bench_status st)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        n += r->recs[i].status == st;
    return n;
}

/* ---- SSE parsing ------------------------------------------------------------------ */

typedef struct events {
    char got[8][64];
    int n;
} events;

static int collect(void *user, const char *data, size_t len)
{
    events *e = user;
    if (e->n < 8)
        snprintf(e->got[e->n], sizeof e->got[0], "%.*s", (int)len, data);
    e->n++;
    return 0;
}

TEST(sse_parser_reassembles_events_split_at_any_bytes)
{
    const char *stream = ": ping\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: x\nid: 3\ndata: two\ndata:"
                         "lines\n\ndata: [DONE]\r\r";
    size_t len = strlen(stream);
    uint64_t st = sd_test_seed();
    for (int trial = 0; trial < 300; trial++) {
        events e = {0};
        sd_bench_sse p;
        sd_bench_sse_init(&p, 1024, collect, &e);
        size_t off = 0;
        while (off < len) { /* pieces of 1..7 bytes, fresh each trial */
            size_t n = 1 + (size_t)sd_test_randf(&st, 0, 7);
            if (trial == 0)
                n = 1;
            if (n > len - off)
                n = len - off;
            ASSERT_OK(sd_bench_sse_feed(&p, stream + off, n));
            off += n;
        }
        ASSERT_EQ(e.n, 3);
        ASSERT_STR_EQ(e.got[0], "{\"a\":1}");
        ASSERT_STR_EQ(e.got[1], "two\nlines");
        ASSERT_STR_EQ(e.got[2], "[DONE]");
        ASSERT_EQ(sd_bench_sse_pending(&p), 0);
        sd_bench_sse_free(&p);
    }
}

TEST(sse_parser_refuses_an_event_past_its_limit)
{
    events e = {0};
    sd_bench_sse p;
    sd_bench_sse_init(&p, 32, collect, &e);
    ASSERT_OK(sd_bench_sse_feed(&p, "data: short\n\n", 13));
    char big[64];
    memset(big, 'x', sizeof big);
    ASSERT_OK(sd_bench_sse_feed(&p, "data: ", 6));
    ASSERT_EQ(sd_bench_sse_feed(&p, big, sizeof big), SD_ERANGE);
    ASSERT_EQ(e.n, 1);
    /* joined data lines count too */
    sd_bench_sse_reset(&p);
    ASSERT_OK(sd_bench_sse_feed(&p, "data: 0123456789012345\n", 23));
    ASSERT_EQ(sd_bench_sse_feed(&p, "data: 0123456789012345\n", 23), SD_ERANGE);
    sd_bench_sse_free(&p);
}

/* ---- numbers -------------------------------------------------------------------- */

TEST(percentiles_interpolate_like_numpy)
{
    double v[] = {4, 1, 3, 2};
    sd_bench_dist d;
    sd_bench_dist_of(v, 4, &d);
    ASSERT_NEAR(d.p50, 2.5, 1e-12);
    ASSERT_NEAR(d.p90, 3.7, 1e-12);
    ASSERT_NEAR(d.p99, 3.97, 1e-12);
    ASSERT_NEAR(d.mean, 2.5, 1e-12);
    ASSERT_NEAR(d.min, 1, 0);
    ASSERT_NEAR(d.max, 4, 0);
    double one[] = {7};
    sd_bench_dist_of(one, 1, &d);
    ASSERT_NEAR(d.p99, 7, 0);
    sd_bench_dist_of(one, 0, &d);
    ASSERT_EQ(d.n, 0);
}

TEST(summary_takes_usage_tokens_for_tpot_and_pools_itl)
{
    uint64_t st = sd_test_seed();
    double gap = sd_test_randf(&st, 0.01f, 0.05f);
    sd_bench_rec r[3];
    memset(r, 0, sizeof r);
    double t1[] = {1.2, 1.2 + gap, 1.2 + 2 * gap, 1.2 + 3 * gap};
    double t2[] = {2.5, 2.5 + 2 * gap};
    /* r0: usage says 8 tokens over 4 chunks; r1: no usage, 2 chunks; r2: a failure */
    r[0] = (sd_bench_rec){.status = SD_BENCH_OK, .t_sent = 1.0, .t_end = 1.2 + 3 * gap,
                          .chunk_t = t1, .n_chunks = 4, .prompt_tokens = 5,
                          .usage_completion_tokens = 8};
    r[1] = (sd_bench_rec){.status = SD_BENCH_OK, .t_sent = 2.0, .t_end = 2.5 + 2 * gap + 0.01,
                          .chunk_t = t2, .n_chunks = 2, .prompt_tokens = -1,
                          .usage_completion_tokens = -1};
    r[2] = (sd_bench_rec){.status = SD_BENCH_ERR_HTTP, .t_sent = 0, .prompt_tokens = -1,
                          .usage_completion_tokens = -1};
    for (int i = 0; i < 3; i++)
        sd_bench_rec_derive(&r[i]);
    ASSERT_EQ(r[0].out_tokens, 8);
    ASSERT_NEAR(r[0].ttft, 0.2, 1e-9);
    ASSERT_NEAR(r[0].tpot, 3 * gap / 7, 1e-9);
    ASSERT_EQ(r[1].out_tokens, 2);
    ASSERT_NEAR(r[1].tpot, 2 * gap + 0.01, 1e-9);
    sd_bench_summary s;
    sd_bench_summarize(r, 3, 4.0, 2, &s);
    ASSERT_EQ(s.completed, 2);
    ASSERT_EQ(s.failed, 1);
    ASSERT_EQ(s.by_status[SD_BENCH_ERR_HTTP], 1);
    ASSERT_EQ(s.output_tokens, 10);
    ASSERT_EQ(s.output_tokens_from_usage, 1);
    ASSERT_EQ(s.input_tokens, 5);
    ASSERT_NEAR(s.request_throughput, 0.5, 1e-12);
    ASSERT_NEAR(s.output_throughput, 2.5, 1e-12);
    ASSERT_NEAR(s.total_token_throughput, 15.0 / 4, 1e-12);
    ASSERT_EQ(s.itl.n, 4); /* 3 gaps of r0 + 1 of r1, pooled */
    ASSERT_NEAR(s.itl.max, 2 * gap, 1e-9);
    ASSERT_NEAR(s.itl.mean, 5 * gap / 4, 1e-9);
    ASSERT_NEAR(s.ttft.mean, (0.2 + 0.5) / 2, 1e-9);
}

TEST(arrivals_are_poisson_at_the_rate_and_seeded)
{
    int n = 20000;
    double *a = malloc(sizeof(double) * (size_t)n), *b = malloc(sizeof(double) * (size_t)n);
    uint64_t seed = sd_test_seed();
    sd_bench_arrivals(a, n, 10.0, seed);
    sd_bench_arrivals(b, n, 10.0, seed);
    ASSERT(a && b);
    ASSERT_NEAR(a[0], 0, 0);
    ASSERT(memcmp(a, b, sizeof(double) * (size_t)n) == 0);
    double sum = 0, sq = 0;
    for (int i = 1; i < n; i++) {
        double g = a[i] - a[i - 1];
        ASSERT(g >= 0);
        sum += g;
        sq += g * g;
    }
    double mean = sum / (n - 1), var = sq / (n - 1) - mean * mean;
    /* exponential gaps: mean 1/rate, standard deviation equal to the mean */
    ASSERT_NEAR(mean, 0.1, 0.004);
    ASSERT_NEAR(sqrt(var) / mean, 1.0, 0.05);
    sd_bench_arrivals(b, n, 10.0, seed + 1);
    ASSERT(memcmp(a, b, sizeof(double) * (size_t)n) != 0);
    sd_bench_arrivals(b, 5, 0, seed);
    ASSERT_NEAR(b[4], 0, 0);
    free(a);
    free(b);
}

TEST(url_parsing_takes_host_port_and_prefix_and_refuses_https)
{
    sd_bench_target t;
    sd_err err = {0};
    ASSERT_OK(sd_bench_parse_url("http://127.0.0.1:8000", &t, &err));
    ASSERT_STR_EQ(t.host, "127.0.0.1");
    ASSERT_EQ(t.port, 8000);
    ASSERT_STR_EQ(t.base, "");
    ASSERT_OK(sd_bench_parse_url("http://gpu-box/api/v1/", &t, &err));
    ASSERT_STR_EQ(t.host, "gpu-box");
    ASSERT_EQ(t.port, 80);
    ASSERT_STR_EQ(t.base, "/api");
    ASSERT_STR_EQ(t.hostport, "gpu-box:80");
    ASSERT_OK(sd_bench_parse_url("http://[::1]:9000", &t, &err));
    ASSERT_STR_EQ(t.host, "::1");
    ASSERT_STR_EQ(t.hostport, "[::1]:9000");
    ASSERT_EQ(sd_bench_parse_url("https://x:1", &t, &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "http://");
    ASSERT_EQ(sd_bench_parse_url("http://x:99999", &t, &err), SD_EINVAL);
    ASSERT_EQ(sd_bench_parse_url("http://:80", &t, &err), SD_EINVAL);
}

TEST(prompts_load_mtbench_gsm8k_humaneval_shapes_and_name_bad_lines)
{
    char path[] = "/tmp/specd-bench-prompts-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    const char *text = "{\"question_id\": 81, \"turns\": [\"Write a poem.\", \"Shorter.\"]}\n"
                       "\n"
                       "{\"question\": \"What is 2+2?\", \"answer\": \"4\"}\n"
                       "{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f(x):\\n\"}\r\n"
                       "{\"text\": \"plain\"}";
    ASSERT_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    sd_bench_prompts p;
    sd_err err = {0};
    ASSERT_OK(sd_bench_prompts_load(path, &p, &err));
    ASSERT_EQ(p.n, 4);
    ASSERT_STR_EQ(p.text[0], "Write a poem.");
    ASSERT_STR_EQ(p.text[1], "What is 2+2?");
    ASSERT_STR_EQ(p.text[2], "def f(x):\n");
    ASSERT_STR_EQ(p.text[3], "plain");
    sd_bench_prompts_free(&p);
    FILE *f = fopen(path, "w");
    fputs("{\"prompt\": \"ok\"}\n{\"answer\": 1}\n", f);
    fclose(f);
    ASSERT_EQ(sd_bench_prompts_load(path, &p, &err), SD_EFORMAT);
    ASSERT_CONTAINS(err.msg, ":2:");
    ASSERT_EQ(p.n, 0);
    unlink(path);
    ASSERT_OK(sd_bench_prompts_random(3, 5, 9, &p, &err));
    ASSERT_EQ(p.n, 3);
    int words = 1;
    for (const char *c = p.text[0]; *c; c++)
        words += *c == ' ';
    ASSERT_EQ(words, 5);
    sd_bench_prompts q;
    ASSERT_OK(sd_bench_prompts_random(3, 5, 9, &q, &err));
    ASSERT_STR_EQ(p.text[2], q.text[2]);
    /* a shared prefix: the same words and a blank line before each */
    char *orig = strdup(p.text[1]);
    ASSERT_OK(sd_bench_prompts_prefix(&p, 7, 4, &err));
    const char *sep = strstr(p.text[0], "\n\n");
    ASSERT(sep != NULL);
    const size_t pl = (size_t)(sep - p.text[0]) + 2;
    for (int i = 1; i < 3; i++)
        ASSERT(!strncmp(p.text[i], p.text[0], pl));
    ASSERT_STR_EQ(p.text[1] + pl, orig);
    words = 1;
    for (const char *c = p.text[0]; c < sep; c++)
        words += *c == ' ';
    ASSERT_EQ(words, 7);
    free(orig);
    sd_bench_prompts_free(&p);
    sd_bench_prompts_free(&q);
}

TEST(metrics_scrape_reads_specd_counters_and_takes_deltas)
{
    const char *before = "# HELP specd_spec_steps_total x\n# TYPE specd_spec_steps_total counter\n"
                         "specd_spec_steps_total 10\nspecd_spec_draft_tokens_total 40\n"
                         "specd_spec_accepted_tokens_total 20\nspecd_spec_emitted_tokens_total 30\n"
                         "specd_spec_position_proposed_total{position=\"0\"} 10\n"
                         "specd_spec_position_accepted_total{position=\"0\"} 8\n"
                         "specd_spec_drafting_steps_total{why=\"best\"} 4\n"
                         "specd_spec_drafting_idle_requests_total{why=\"best\"} 10\n"
                         "specd_spec_steps_totalx 99\n";
    const char *after = "specd_spec_steps_total 20\nspecd_spec_draft_tokens_total 80\n"
                        "specd_spec_accepted_tokens_total 50\nspecd_spec_emitted_tokens_total 70\n"
                        "specd_spec_position_proposed_total{position=\"0\"} 20\n"
                        "specd_spec_position_proposed_total{position=\"1\"} 10\n"
                        "specd_spec_position_accepted_total{position=\"0\"} 17\n"
                        "specd_spec_position_accepted_total{position=\"1\"} 5\n"
                        "specd_spec_draft_seconds_total 1.5e-1\n"
                        "specd_spec_eager_passes_total 7\n"
                        "specd_spec_graph_cache_full_total 2\n"
                        "specd_spec_draft_length_steps_total{k=\"0\"} 12\n"
                        "specd_spec_draft_length_steps_total{k=\"3\"} 5\n"
                        "specd_spec_draft_length_steps_total{k=\"17\"} 5\n"
                        "specd_spec_plain_steps_total 9\n"
                        "specd_spec_cohorts_total 2\n"
                        "specd_launch_ahead_steps_total 6\n"
                        "specd_spec_draft_ahead_steps_total 4\n"
                        "specd_gemm_trials_total 3\n"
                        "specd_prompt_steps_total 8\n"
                        "specd_prompt_graph_steps_total 5\n"
                        "specd_prefix_cache_queried_tokens_total 900\n"
                        "specd_prefix_cache_hit_tokens_total 640\n"
                        "specd_spec_drafting_steps_total{why=\"best\"} 9\n"
                        "specd_spec_drafting_steps_total{why=\"probe\"} 2\n"
                        "specd_spec_drafting_idle_requests_total{why=\"best\"} 12\n"
                        "specd_spec_drafting_idle_requests_total{why=\"probe\"} 30\n"
                        "specd_spec_drafting_steps_total{why=\"a-name-too-long-to-keep\"} 1\n";
    sd_bench_spec b, a, d;
    sd_bench_spec_parse(before, strlen(before), &b);
    sd_bench_spec_parse(after, strlen(after), &a);
    ASSERT(b.present && a.present);
    ASSERT_NEAR(b.steps, 10, 0);
    ASSERT_EQ(a.n_pos, 2);
    ASSERT_NEAR(a.draft_s, 0.15, 1e-12);
    sd_bench_spec_delta(&b, &a, &d);
    ASSERT(d.present);
    ASSERT_NEAR(d.steps, 10, 0);
    ASSERT_NEAR(d.accepted, 30, 0);
    ASSERT_NEAR(d.accepted_at[0], 9, 0);
    ASSERT_NEAR(d.proposed_at[1], 10, 0);
    ASSERT_NEAR(d.eager_passes, 7, 0);
    ASSERT_NEAR(d.cache_full, 2, 0);
    ASSERT_NEAR(d.steps_by_k[0], 12, 0);
    ASSERT_NEAR(d.steps_by_k[3], 5, 0);
    ASSERT_NEAR(d.steps_by_k[16], 0, 0); /* k="17" is past the histogram: ignored */
    ASSERT_NEAR(d.plain_steps, 9, 0);
    ASSERT_NEAR(d.cohorts, 2, 0);
    ASSERT_NEAR(d.ahead_steps, 6, 0);
    ASSERT_NEAR(d.draft_ahead_steps, 4, 0);
    ASSERT_NEAR(d.gemm_trials, 3, 0);
    ASSERT_NEAR(d.prompt_steps, 8, 0);
    ASSERT_NEAR(d.prompt_graph_steps, 5, 0);
    ASSERT_NEAR(d.prefix_queried, 900, 0);
    ASSERT_NEAR(d.prefix_hit, 640, 0);
    /* reasons by name, one first seen in the second scrape; a long name is left out */
    ASSERT_EQ(d.n_why, 2);
    ASSERT_STR_EQ(d.why[0], "best");
    ASSERT_NEAR(d.why_steps[0], 5, 0);
    ASSERT_NEAR(d.why_idle[0], 2, 0);
    ASSERT_STR_EQ(d.why[1], "probe");
    ASSERT_NEAR(d.why_steps[1], 2, 0);
    ASSERT_NEAR(d.why_idle[1], 30, 0);
    sd_bench_spec_delta(&a, &b, &d); /* counters went down: a restart */
    ASSERT(!d.present);
    sd_bench_spec_parse("specd_requests_total 3\n", 23, &a);
    ASSERT(!a.present);
}

/* ---- against the scripted server ---------------------------------------------------- */

TEST(stream_timing_matches_the_server_delays)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 60, .itl_ms = 25, .n_chunks = 8,
                 .tokens_per_chunk = 2, .spec = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 4, 2);
    sd_bench_run run;
    sd_err err = {0};
    int rc = sd_bench_run_once(&c, &run, &err);
    fs_stop(&s);
    ASSERT_MSG(rc == 0, "%s", err.msg);
    sd_bench_summary sum;
    sd_bench_summarize(run.recs, run.n, run.duration_s, run.peak_in_flight, &sum);
    ASSERT_EQ(sum.completed, 4);
    for (int i = 0; i < run.n; i++) {
        const sd_bench_rec *r = &run.recs[i];
        ASSERT_MSG(r->status == SD_BENCH_OK, "request %d: %s", i, r->error);
        ASSERT_EQ(r->n_chunks, 8);
        ASSERT_EQ(r->out_tokens, 16); /* usage, not the 8 chunks */
        ASSERT_EQ(r->prompt_tokens, 7);
        ASSERT_STR_EQ(r->finish_reason, "length");
        ASSERT(r->has_spec && r->spec_accepted == 4 && r->spec_drafted == 6);
        /* The server sleeps before it writes, so no time can come out shorter
         * than its delay (1 ms of timer slack); the role/empty chunk it sends
         * at once does not count as the first token. */
        ASSERT_MSG(r->ttft >= 0.059, "ttft %.4f", r->ttft);
        ASSERT_MSG(r->e2e >= 0.060 + 7 * 0.025 - 0.001, "e2e %.4f", r->e2e);
        ASSERT_NEAR(r->tpot, (r->e2e - r->ttft) / 15, 1e-12);
    }
    /* Upper bounds hold on medians, with room for a loaded 2-core machine. */
    double expect_tpot = 7 * 0.025 / 15;
    ASSERT_MSG(sum.ttft.p50 < 0.060 + 0.080, "ttft p50 %.4f", sum.ttft.p50);
    ASSERT_MSG(sum.tpot.p50 >= expect_tpot * 0.95 && sum.tpot.p50 < expect_tpot * 2,
               "tpot p50 %.5f vs %.5f", sum.tpot.p50, expect_tpot);
    ASSERT_EQ(sum.itl.n, 4 * 7);
    ASSERT_MSG(sum.itl.p50 > 0.018 && sum.itl.p50 < 0.050, "itl p50 %.4f", sum.itl.p50);
    ASSERT_MSG(sum.itl.mean > 0.020 && sum.itl.mean < 0.050, "itl mean %.4f", sum.itl.mean);
    ASSERT_EQ(sum.output_tokens, 64);
    ASSERT_EQ(sum.spec_requests, 4);
    ASSERT_EQ(sum.spec_accepted, 16);
    ASSERT_NEAR(sum.output_throughput * sum.duration_s, 64, 1e-6);
    sd_bench_run_free(&run);
}

TEST(chat_stream_with_crlf_and_split_writes_counts_chunks_without_usage)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 30, .itl_ms = 10, .n_chunks = 6, .no_usage = 1,
                 .crlf = 1, .split = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 3, 1);
    c.endpoint = SD_BENCH_CHAT;
    c.api_key = "sk-test";
    sd_bench_run run;
    sd_err err = {0};
    int rc = sd_bench_run_once(&c, &run, &err);
    char path[256], auth[256], body0[1024];
    snprintf(path, sizeof path, "%s", s.path);
    snprintf(auth, sizeof auth, "%s", s.auth);
    snprintf(body0, sizeof body0, "%s", s.n_bodies ? s.bodies[0] : "");
    fs_stop(&s);
    ASSERT_MSG(rc == 0, "%s", err.msg);
    ASSERT_STR_EQ(path, "/v1/chat/completions");
    ASSERT_STR_EQ(auth, "Bearer sk-test");
    json_t *b = json_loads(body0, 0, NULL);
    ASSERT(b);
    json_t *content = json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content");
    int known = 0;
    for (int i = 0; i < 3; i++)
        known |= json_is_string(content) && !strcmp(json_string_value(content), prompt_text[i]);
    ASSERT(known);
    ASSERT(json_is_true(json_object_get(b, "stream")));
    ASSERT(json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage")));
    ASSERT_EQ(json_integer_value(json_object_get(b, "max_tokens")), 16);
    json_decref(b);
    for (int i = 0; i < run.n; i++) {
        const sd_bench_rec *r = &run.recs[i];
        ASSERT_MSG(r->status == SD_BENCH_OK, "request %d: %s", i, r->error);
        ASSERT_EQ(r->usage_completion_tokens, -1);
        ASSERT_EQ(r->out_tokens, 6); /* from the chunks */
        ASSERT_EQ((int)r->content_bytes, 6 * 5);
        ASSERT_MSG(r->ttft >= 0.029, "ttft %.4f", r->ttft);
    }
    sd_bench_run_free(&run);
}

TEST(keep_alive_reuses_one_connection_per_slot)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .n_chunks = 3, .itl_ms = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 12, 1);
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    int conns1 = s.connections, reqs = s.requests;
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_OK), 12);
    ASSERT_EQ(reqs, 12);
    ASSERT_EQ(conns1, 1);
    ASSERT_EQ(run.connections, 1);
    sd_bench_run_free(&run);
    /* Connection: close from the server: a fresh connection each time, all fine */
    fc.close_after = 1;
    ASSERT_OK(fs_start(&s, &fc));
    cfg_for(&c, s.port, &p, 6, 2);
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    int conns2 = s.connections;
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_OK), 6);
    ASSERT_EQ(conns2, 6);
    sd_bench_run_free(&run);
}

TEST(concurrency_bounds_requests_in_flight)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 40, .itl_ms = 15, .n_chunks = 4};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 9, 3);
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    int peak = s.peak_in_flight, conns = s.connections;
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_OK), 9);
    ASSERT_EQ(peak, 3);
    ASSERT_EQ(run.peak_in_flight, 3);
    ASSERT_LE(conns, 3);
    /* three waves of ~85 ms each */
    ASSERT_MSG(run.duration_s >= 3 * (0.040 + 3 * 0.015), "duration %.3f", run.duration_s);
    sd_bench_run_free(&run);
}

TEST(poisson_arrivals_are_sent_on_schedule)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .n_chunks = 2, .itl_ms = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 16, 0);
    c.rate = 40;
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    fs_stop(&s);
    double want[16];
    sd_bench_arrivals(want, 16, 40, c.seed);
    ASSERT_EQ(count_status(&run, SD_BENCH_OK), 16);
    double late[16];
    for (int i = 0; i < 16; i++) {
        const sd_bench_rec *r = &run.recs[i];
        ASSERT_NEAR(r->t_arrival, want[i], 1e-12);
        /* never early; late only by the loop's wake-up (bounded loosely: the
         * machine may be busy with other tests) */
        ASSERT_MSG(r->t_sent >= want[i] - 0.001 && r->t_sent < want[i] + 0.250,
                   "request %d due %.4f sent %.4f", i, want[i], r->t_sent);
        late[i] = r->t_sent - want[i];
    }
    sd_bench_dist d;
    sd_bench_dist_of(late, 16, &d);
    ASSERT_MSG(d.p50 < 0.030, "median lateness %.4f s", d.p50);
    ASSERT_MSG(run.duration_s >= want[15], "duration %.3f, last arrival %.3f", run.duration_s,
               want[15]);
    sd_bench_run_free(&run);
}

TEST(http_error_statuses_are_counted_with_the_servers_message)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .n_chunks = 2, .fail_every = 2, .status = 500};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 8, 1);
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    int conns = s.connections;
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_OK), 4);
    ASSERT_EQ(count_status(&run, SD_BENCH_ERR_HTTP), 4);
    ASSERT_EQ(conns, 1); /* an error response with a length keeps the connection */
    for (int i = 0; i < run.n; i++)
        if (run.recs[i].status == SD_BENCH_ERR_HTTP) {
            ASSERT_EQ(run.recs[i].http_status, 500);
            ASSERT_CONTAINS(run.recs[i].error, "fake failure 500");
        }
    sd_bench_summary sum;
    sd_bench_summarize(run.recs, run.n, run.duration_s, run.peak_in_flight, &sum);
    ASSERT_EQ(sum.failed, 4);
    ASSERT_EQ(sum.ttft.n, 4); /* failed requests stay out of the latencies */
    sd_bench_run_free(&run);

    fc = (fs_cfg){.mode = FS_STATUS, .status = 429};
    ASSERT_OK(fs_start(&s, &fc));
    cfg_for(&c, s.port, &p, 5, 2);
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_ERR_HTTP), 5);
    ASSERT_EQ(run.recs[0].http_status, 429);
    sd_bench_run_free(&run);
}

TEST(malformed_streams_fail_only_their_request)
{
    static const struct {
        fs_mode mode;
        sd_bench_status want;
        const char *msg;
    } cases[] = {
        {FS_MALFORMED, SD_BENCH_ERR_STREAM, "malformed SSE data"},
        {FS_ERROR_EVENT, SD_BENCH_ERR_STREAM, "engine failed: boom"},
        {FS_NO_DONE, SD_BENCH_ERR_STREAM, "without data: [DONE]"},
        {FS_CLOSE_MID, SD_BENCH_ERR_IO, "mid-response"},
    };
    sd_bench_prompts p = some_prompts();
    for (size_t k = 0; k < SD_ARRAY_LEN(cases); k++) {
        fake_server s;
        fs_cfg fc = {.mode = cases[k].mode, .n_chunks = 3, .split = (int)(k & 1)};
        ASSERT_OK(fs_start(&s, &fc));
        sd_bench_cfg c;
        cfg_for(&c, s.port, &p, 4, 2);
        sd_bench_run run;
        sd_err err = {0};
        ASSERT_OK(sd_bench_run_once(&c, &run, &err));
        fs_stop(&s);
        ASSERT_MSG(count_status(&run, cases[k].want) == 4, "case %zu: %s", k, run.recs[0].error);
        ASSERT_CONTAINS(run.recs[0].error, cases[k].msg);
        ASSERT_EQ(run.recs[0].http_status, 200);
        sd_bench_run_free(&run);
    }
}

TEST(bodies_framed_by_length_or_by_the_connections_end_are_read)
{
    sd_bench_prompts p = some_prompts();
    fs_mode modes[] = {FS_LENGTH_BODY, FS_EOF_BODY};
    for (int k = 0; k < 2; k++) {
        fake_server s;
        fs_cfg fc = {.mode = modes[k], .n_chunks = 5, .tokens_per_chunk = 1};
        ASSERT_OK(fs_start(&s, &fc));
        sd_bench_cfg c;
        cfg_for(&c, s.port, &p, 4, 2);
        sd_bench_run run;
        sd_err err = {0};
        ASSERT_OK(sd_bench_run_once(&c, &run, &err));
        int conns = s.connections;
        fs_stop(&s);
        ASSERT_MSG(count_status(&run, SD_BENCH_OK) == 4, "mode %d: %s", k, run.recs[0].error);
        ASSERT_EQ(run.recs[3].n_chunks, 5);
        ASSERT_EQ(run.recs[3].out_tokens, 5);
        if (modes[k] == FS_EOF_BODY)
            ASSERT_EQ(conns, 4);
        else
            ASSERT_LE(conns, 2);
        sd_bench_run_free(&run);
    }
}

TEST(refused_connections_are_counted_not_fatal)
{
    int port = fs_dead_port();
    ASSERT(port > 0);
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, port, &p, 5, 2);
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    ASSERT_EQ(count_status(&run, SD_BENCH_ERR_CONNECT), 5);
    ASSERT_CONTAINS(run.recs[4].error, "refused");
    ASSERT_EQ(run.recs[4].http_status, 0);
    sd_bench_summary sum;
    sd_bench_summarize(run.recs, run.n, run.duration_s, run.peak_in_flight, &sum);
    ASSERT_EQ(sum.completed, 0);
    ASSERT_EQ(sum.failed, 5);
    ASSERT_NEAR(sum.request_throughput, 0, 0);
    sd_bench_run_free(&run);
}

TEST(a_stale_keep_alive_connection_is_retried_on_a_fresh_one)
{
    /* The server closes every connection after its response without saying
     * so: a reused connection may be dead when the next request goes out. */
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .n_chunks = 2, .silent_close = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 10, 1);
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    int reqs = s.requests;
    fs_stop(&s);
    ASSERT_MSG(count_status(&run, SD_BENCH_OK) == 10, "%s", run.recs[0].error);
    ASSERT_EQ(reqs, 10);
    for (int i = 0; i < 10; i++)
        ASSERT_LE(run.recs[i].attempts, 2);
    sd_bench_run_free(&run);
}

TEST(duration_limit_cancels_in_flight_and_skips_the_rest)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 10, .itl_ms = 50, .n_chunks = 100};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 6, 2);
    c.duration_limit_s = 0.3;
    sd_bench_run run;
    sd_err err = {0};
    uint64_t t0 = sd_now_ns();
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    double took = (double)(sd_now_ns() - t0) * 1e-9;
    fs_stop(&s);
    ASSERT(run.stopped);
    ASSERT_MSG(took < 2.0, "took %.2f s", took);
    ASSERT_EQ(count_status(&run, SD_BENCH_CANCELLED), 2);
    ASSERT_EQ(count_status(&run, SD_BENCH_NOT_SENT), 4);
    ASSERT(run.recs[0].n_chunks >= 2); /* what arrived before the cut is kept */
    ASSERT_NEAR(run.duration_s, 0.3, 0.2);
    sd_bench_summary sum;
    sd_bench_summarize(run.recs, run.n, run.duration_s, run.peak_in_flight, &sum);
    ASSERT_EQ(sum.failed, 0);
    ASSERT_EQ(sum.completed, 0);
    sd_bench_run_free(&run);
}

TEST(request_timeout_fails_a_request_that_never_finishes)
{
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 800, .n_chunks = 1};
    ASSERT_OK(fs_start(&s, &fc));
    sd_bench_prompts p = some_prompts();
    sd_bench_cfg c;
    cfg_for(&c, s.port, &p, 2, 2);
    c.request_timeout_s = 0.2;
    sd_bench_run run;
    sd_err err = {0};
    ASSERT_OK(sd_bench_run_once(&c, &run, &err));
    fs_stop(&s);
    ASSERT_EQ(count_status(&run, SD_BENCH_ERR_TIMEOUT), 2);
    ASSERT_CONTAINS(run.recs[0].error, "within 0.2 s");
    ASSERT_MSG(run.duration_s < 1.0, "duration %.2f", run.duration_s);
    sd_bench_run_free(&run);
}

/* ---- the executable ---------------------------------------------------------------- */

/* Runs argv with stdout and stderr to files; returns the exit status or -1. */
static int run_cmd(char *const argv[], const char *out_path, const char *err_path)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path)
{
    char *d = NULL;
    size_t n;
    sd_err err = {0};
    return sd_read_file(path, &d, &n, &err) ? NULL : d;
}

/* a scratch folder for a run of the executable against the fake server on
 * `port`: its prompts (written), output, stdout and stderr, and the url */
typedef struct cli_files {
    char dir[64], prompts[128], out[128], so[128], se[128], url[64];
} cli_files;

static int cli_files_make(cli_files *c, int port, const char *prompts_jsonl)
{
    snprintf(c->dir, sizeof c->dir, "/tmp/specd-bench-cli-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->prompts, sizeof c->prompts, "%s/p.jsonl", c->dir);
    snprintf(c->out, sizeof c->out, "%s/r.json", c->dir);
    snprintf(c->so, sizeof c->so, "%s/stdout", c->dir);
    snprintf(c->se, sizeof c->se, "%s/stderr", c->dir);
    snprintf(c->url, sizeof c->url, "http://127.0.0.1:%d", port);
    FILE *f = fopen(c->prompts, "w");
    if (!f)
        return -1;
    fputs(prompts_jsonl, f);
    return fclose(f);
}

static void cli_files_remove(const cli_files *c)
{
    unlink(c->prompts);
    unlink(c->out);
    unlink(c->so);
    unlink(c->se);
    rmdir(c->dir);
}

TEST(the_executable_sweeps_and_writes_json_and_a_table)
{
    const char *bin = getenv("SPECD_BENCH_SERVE_BIN");
    if (!bin || access(bin, X_OK))
        TEST_SKIP("SPECD_BENCH_SERVE_BIN not set (run through meson test)");
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 5, .itl_ms = 2, .n_chunks = 4, .spec = 1};
    ASSERT_OK(fs_start(&s, &fc));
    cli_files c;
    ASSERT_OK(cli_files_make(&c, s.port, "{\"prompt\": \"a b\"}\n{\"turns\": [\"c d\"]}\n"));
    char *url = c.url, *out = c.out, *so = c.so, *se = c.se;
    char *argv[] = {(char *)bin, "--url", url, "--prompts", c.prompts, "--num-requests", "3",
                    "--sweep", "1,4", "--model", "fake", "--label", "plain", "--max-tokens",
                    "9", "--out", out, "--progress-interval", "0.05", NULL};
    int rc = run_cmd(argv, so, se);
    int reqs = s.requests, gets = s.gets;
    fs_stop(&s);
    char *stdout_text = slurp(so), *stderr_text = slurp(se);
    ASSERT_MSG(rc == 0, "exit %d: %s", rc, stderr_text ? stderr_text : "");
    ASSERT_EQ(reqs, 1 + 3 + 4); /* one warm-up; the level of 4 sends at least 4 */
    ASSERT_EQ(gets, 4);     /* /metrics before and after each level */
    ASSERT_CONTAINS(stdout_text, "TTFT ms p50/p99");
    ASSERT_CONTAINS(stdout_text, "label=plain");
    ASSERT_CONTAINS(stderr_text, "[c=4] 4/4 done (0 failed)");
    json_error_t je;
    json_t *j = json_load_file(out, 0, &je);
    ASSERT_MSG(j, "%s", je.text);
    ASSERT_STR_EQ(json_string_value(json_object_get(j, "tool")), "specd-bench-serve");
    ASSERT_CONTAINS(json_string_value(json_object_get(j, "command")), "--sweep 1,4");
    ASSERT(json_string_length(json_object_get(j, "timestamp")) == 20);
    ASSERT(json_is_string(json_object_get(j, "commit")));
    ASSERT(json_is_integer(json_object_get(json_object_get(j, "machine"), "cores")));
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(j, "config"), "warmup")), 1);
    json_t *runs = json_object_get(j, "runs");
    ASSERT_EQ(json_array_size(runs), 2);
    json_t *r1 = json_array_get(runs, 1);
    ASSERT_EQ(json_integer_value(json_object_get(r1, "concurrency")), 4);
    json_t *sum = json_object_get(r1, "summary");
    ASSERT_EQ(json_integer_value(json_object_get(sum, "completed")), 4);
    ASSERT_EQ(json_integer_value(json_object_get(sum, "total_output_tokens")), 16);
    ASSERT(json_real_value(json_object_get(sum, "p99_ttft_ms")) >= 5);
    ASSERT(json_is_real(json_object_get(sum, "median_itl_ms")));
    ASSERT(json_is_object(json_object_get(sum, "usage_speculative")));
    ASSERT(json_is_null(json_object_get(r1, "server_speculative"))); /* no /metrics there */
    json_t *reqs1 = json_object_get(r1, "requests");
    ASSERT_EQ(json_array_size(reqs1), 4);
    json_t *q = json_array_get(reqs1, 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(q, "status")), "ok");
    ASSERT_EQ(json_array_size(json_object_get(q, "itl_ms")), 3);
    json_decref(j);
    free(stdout_text);
    free(stderr_text);

    /* nothing listens: every request fails, the JSON says so, exit 3 */
    snprintf(c.url, sizeof c.url, "http://127.0.0.1:%d", fs_dead_port());
    char *argv2[] = {(char *)bin, "--url", url, "--model", "m", "--num-requests", "2",
                     "--random-input-len", "4", "--out", out, "--quiet", NULL};
    rc = run_cmd(argv2, so, se);
    ASSERT_EQ(rc, 3);
    j = json_load_file(out, 0, &je);
    ASSERT(j);
    sum = json_object_get(json_array_get(json_object_get(j, "runs"), 0), "summary");
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(sum, "by_status"),
                                                 "connect_error")), 2);
    json_decref(j);
    /* bad options: exit 2 */
    char *argv3[] = {(char *)bin, "--rate", "fast", NULL};
    ASSERT_EQ(run_cmd(argv3, so, se), 2);
    char *argv4[] = {(char *)bin, "--url", "https://x", NULL};
    ASSERT_EQ(run_cmd(argv4, so, se), 2);
    cli_files_remove(&c);
}

/* --waves W: each sweep level sends at least W x its concurrency, so the
 * server's one-off costs weigh alike at every level (on a GPU 64 requests
 * at c = 64 were one wave in 0.1 s, and a speculative server's first-seen
 * shapes stalled it 18-34 ms: NOTES.md, session 31) */
TEST(waves_scale_each_sweep_level_with_its_concurrency)
{
    const char *bin = getenv("SPECD_BENCH_SERVE_BIN");
    if (!bin || access(bin, X_OK))
        TEST_SKIP("SPECD_BENCH_SERVE_BIN not set (run through meson test)");
    fake_server s;
    fs_cfg fc = {.mode = FS_STREAM, .ttft_ms = 1, .itl_ms = 1, .n_chunks = 2};
    ASSERT_OK(fs_start(&s, &fc));
    cli_files c;
    ASSERT_OK(cli_files_make(&c, s.port, "{\"prompt\": \"a b\"}\n"));
    char *argv[] = {(char *)bin, "--url", c.url, "--prompts", c.prompts, "--num-requests", "5",
                    "--sweep", "1,4", "--waves", "3", "--model", "fake", "--max-tokens", "4",
                    "--out", c.out, "--quiet", "--no-metrics", NULL};
    int rc = run_cmd(argv, c.so, c.se);
    int reqs = s.requests;
    fs_stop(&s);
    char *stderr_text = slurp(c.se);
    ASSERT_MSG(rc == 0, "exit %d: %s", rc, stderr_text ? stderr_text : "");
    ASSERT_EQ(reqs, 1 + 5 + 12); /* warm-up; c = 1: N (5 > 3); c = 4: 3 x 4 (12 > 5) */
    json_error_t je;
    json_t *j = json_load_file(c.out, 0, &je);
    ASSERT_MSG(j, "%s", je.text);
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(j, "config"), "waves")), 3);
    json_t *runs = json_object_get(j, "runs");
    ASSERT_EQ(json_array_size(runs), 2);
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_object_get(json_array_get(runs, 0), "summary"), "completed")), 5);
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_object_get(json_array_get(runs, 1), "summary"), "completed")), 12);
    json_decref(j);
    /* --waves 0 is a bad option */
    char *argv2[] = {(char *)bin, "--waves", "0", NULL};
    ASSERT_EQ(run_cmd(argv2, c.so, c.se), 2);
    free(stderr_text);
    cli_files_remove(&c);
}

/* ---- specd serve, end to end ---------------------------------------------------------- */

TEST(against_specd_serve_on_the_bundled_model)
{
    const char *specd = getenv("SPECD_BIN");
    const char *bin = getenv("SPECD_BENCH_SERVE_BIN");
    char model[512];
    snprintf(model, sizeof model, "%s/models/specd-tiny/config.json", sd_test_srcdir());
    if (!specd || access(specd, X_OK) || !bin)
        TEST_SKIP("SPECD_BIN / SPECD_BENCH_SERVE_BIN not set (run through meson test)");
    if (access(model, R_OK))
        TEST_SKIP("no bundled model at %s", model);
    char dir[] = "/tmp/specd-bench-e2e-XXXXXX";
    ASSERT(mkdtemp(dir));
    char log[128], so[128], out[128];
    snprintf(log, sizeof log, "%s/serve.log", dir);
    snprintf(so, sizeof so, "%s/stdout", dir);
    snprintf(out, sizeof out, "%s/r.json", dir);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(specd, specd, "serve", "--port", "0", "--spec", "mtp", "--spec-k", "2",
              "--max-batch", "4", "--threads", "2", "--kv-blocks", "256", (char *)NULL);
        _exit(127);
    }
    /* the ready line names the port: "ready: serving NAME on http://127.0.0.1:PORT" */
    int port = 0;
    for (int i = 0; i < 1200 && !port; i++) {
        char *t = slurp(log);
        const char *r = t ? strstr(t, "ready: serving") : NULL;
        const char *h = r ? strstr(r, "http://127.0.0.1:") : NULL;
        if (h)
            port = atoi(h + 17);
        int dead = t && strstr(t, "error") && !r;
        free(t);
        if (dead || waitpid(pid, NULL, WNOHANG) == pid)
            break;
        if (!port) {
            struct timespec ts = {0, 50000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!port) {
        char *t = slurp(log);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        ASSERT_MSG(0, "specd serve did not get ready: %s", t ? t : "(no log)");
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    char *argv[] = {(char *)bin, "--url", url, "--num-requests", "4", "--concurrency", "2",
                    "--random-input-len", "12", "--random-output-len", "6", "--out", out,
                    "--label", "mtp", "--quiet", NULL};
    char se[128];
    snprintf(se, sizeof se, "%s/stderr", dir);
    int rc = run_cmd(argv, so, se);
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    char *err_text = slurp(se);
    ASSERT_MSG(rc == 0, "bench exit %d: %s", rc, err_text ? err_text : "");
    free(err_text);
    json_error_t je;
    json_t *j = json_load_file(out, 0, &je);
    ASSERT_MSG(j, "%s", je.text);
    ASSERT(json_is_true(json_object_get(json_object_get(j, "server"), "specd_metrics")));
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(j, "server"), "model")),
                  "specd-tiny");
    json_t *r0 = json_array_get(json_object_get(j, "runs"), 0);
    json_t *sum = json_object_get(r0, "summary");
    ASSERT_EQ(json_integer_value(json_object_get(sum, "completed")), 4);
    /* ignore_eos + max_tokens 6: the server's usage says 6 tokens each */
    ASSERT_EQ(json_integer_value(json_object_get(sum, "total_output_tokens")), 24);
    ASSERT_EQ(json_integer_value(json_object_get(sum, "output_tokens_from_usage")), 4);
    ASSERT(json_integer_value(json_object_get(sum, "total_input_tokens")) >= 4 * 12);
    json_t *spec = json_object_get(r0, "server_speculative");
    ASSERT_MSG(json_is_object(spec), "no speculative numbers from /metrics");
    ASSERT(json_number_value(json_object_get(spec, "steps")) > 0);
    ASSERT(json_array_size(json_object_get(spec, "acceptance_by_position")) >= 1);
    /* the CPU runs every proposer pass without a graph */
    ASSERT(json_number_value(json_object_get(spec, "proposer_eager_passes")) > 0);
    ASSERT(json_is_number(json_object_get(spec, "proposer_graph_cache_full")));
    /* the engine's steps by draft length add up to the speculative steps and more
     * (k = 0 steps are not verify steps) */
    json_t *byk = json_object_get(spec, "engine_steps_by_k");
    double ksum = 0;
    for (size_t k = 0; k < json_array_size(byk); k++)
        ksum += json_number_value(json_array_get(byk, k));
    ASSERT(ksum > 0);
    ASSERT(json_is_number(json_object_get(spec, "engine_launch_ahead_steps")));
    ASSERT(json_is_number(json_object_get(spec, "engine_plain_steps")));
    /* the CPU backend runs no GEMM trials */
    ASSERT_NEAR(json_number_value(json_object_get(spec, "engine_gemm_trials")), 0, 0);
    /* every prompt came in a step with prompt rows; the CPU has no graphs */
    ASSERT(json_number_value(json_object_get(spec, "engine_prompt_steps")) > 0);
    ASSERT_NEAR(json_number_value(json_object_get(spec, "engine_prompt_graph_steps")), 0, 0);
    /* --spec-k 2: every drafting step drafted a fixed k */
    json_t *why = json_object_get(spec, "engine_drafting_steps_by_why");
    ASSERT(json_is_object(why));
    ASSERT(json_number_value(json_object_get(why, "fixed")) > 0);
    ASSERT_EQ(json_object_size(why), 1);
    json_decref(j);
    unlink(log);
    unlink(so);
    unlink(se);
    unlink(out);
    rmdir(dir);
}

TEST_MAIN(T(sse_parser_reassembles_events_split_at_any_bytes),
          T(sse_parser_refuses_an_event_past_its_limit), T(percentiles_interpolate_like_numpy),
          T(summary_takes_usage_tokens_for_tpot_and_pools_itl),
          T(arrivals_are_poisson_at_the_rate_and_seeded),
          T(url_parsing_takes_host_port_and_prefix_and_refuses_https),
          T(prompts_load_mtbench_gsm8k_humaneval_shapes_and_name_bad_lines),
          T(metrics_scrape_reads_specd_counters_and_takes_deltas),
          T(stream_timing_matches_the_server_delays),
          T(chat_stream_with_crlf_and_split_writes_counts_chunks_without_usage),
          T(keep_alive_reuses_one_connection_per_slot), T(concurrency_bounds_requests_in_flight),
          T(poisson_arrivals_are_sent_on_schedule),
          T(http_error_statuses_are_counted_with_the_servers_message),
          T(malformed_streams_fail_only_their_request),
          T(bodies_framed_by_length_or_by_the_connections_end_are_read),
          T(refused_connections_are_counted_not_fatal),
          T(a_stale_keep_alive_connection_is_retried_on_a_fresh_one),
          T(duration_limit_cancels_in_flight_and_skips_the_rest),
          T(request_timeout_fails_a_request_that_never_finishes),
          T(the_executable_sweeps_and_writes_json_and_a_table),
          T(waves_scale_each_sweep_level_with_its_concurrency),
          T(against_specd_serve_on_the_bundled_model))

/* The server's routes, auth and validation through real sockets, with the
 * server running in this process and no model (model routes answer 503):
 * everything a request meets before the engine; and, with the small test
 * model, that a request's schema compilation leaves the loop thread free. */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include "net/openai.h"
#include "net/server.h"
#include "test.h"
#include "rawclient.h"
#include "verify/schema_cache.h"

#define KEY "Authorization: Bearer sekrit-key\r\n"

typedef struct tsrv {
    uv_loop_t loop;
    uv_async_t stop;
    sd_server *srv;
    sd_opts o;
    pthread_t th;
    int port;
} tsrv;

static void *loop_main(void *arg)
{
    tsrv *t = arg;
    uv_run(&t->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void on_stop(uv_async_t *a)
{
    tsrv *t = a->data;
    sd_server_drain(t->srv);
    uv_close((uv_handle_t *)a, NULL);
}

/* A server on an ephemeral port; model: the folder it serves (NULL: none,
 * SD_SERVER_NO_ENGINE). */
static tsrv *start_with(const char *api_key, const char *model)
{
    tsrv *t = calloc(1, sizeof *t);
    sd_err err = {0};
    sd_opts_init(&t->o, &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "port", "0", &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "api-key", api_key, &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "served-model-name", "test-model", &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "max-body", "4096", &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "header-timeout", "0.3", &err);
    sd_opts_set(&t->o, SD_CMD_SERVE, "body-timeout", "0.3", &err);
    if (model) {
        sd_opts_set(&t->o, SD_CMD_SERVE, "model", model, &err);
        sd_opts_set(&t->o, SD_CMD_SERVE, "device", "cpu", &err);
        sd_opts_set(&t->o, SD_CMD_SERVE, "max-context", "512", &err);
    }
    uv_loop_init(&t->loop);
    if (sd_server_start(&t->srv, &t->loop, &t->o,
                        (model ? 0 : SD_SERVER_NO_ENGINE) | SD_SERVER_NO_SIGNALS, &err)) {
        fprintf(stderr, "  start: %s\n", err.msg);
        return NULL;
    }
    t->port = sd_server_port(t->srv);
    uv_async_init(&t->loop, &t->stop, on_stop);
    t->stop.data = t;
    pthread_create(&t->th, NULL, loop_main, t);
    return t;
}

static tsrv *start(const char *api_key) { return start_with(api_key, NULL); }

/* Drains the server as SIGTERM does; 0 when the loop ended with every handle closed. */
static int stop(tsrv *t)
{
    uv_async_send(&t->stop);
    pthread_join(t->th, NULL);
    int status = sd_server_exit_status(t->srv);
    sd_server_free(t->srv);
    int rc = uv_loop_close(&t->loop);
    sd_opts_free(&t->o);
    free(t);
    return rc ? rc : status;
}

static int call(tsrv *t, const char *method, const char *path, const char *hdrs, const char *body,
                resp *r)
{
    memset(r, 0, sizeof *r);
    return http_call(t->port, method, path, hdrs, body, r);
}

TEST(every_route_but_health_needs_the_key)
{
    tsrv *t = start("sekrit-key");
    ASSERT(t);
    resp r;
    static const char *const bad[] = {NULL, "Authorization: Bearer sekrit-kez\r\n",
                                      "Authorization: Bearer sekrit-ke\r\n",
                                      "Authorization: Bearer sekrit-keyy\r\n",
                                      "Authorization: Basic sekrit-key\r\n", "Authorization: \r\n"};
    static const char *const paths[][2] = {{"GET", "/v1/models"},
                                           {"GET", "/metrics"},
                                           {"POST", "/v1/chat/completions"},
                                           {"POST", "/v1/completions"},
                                           {"POST", "/tokenize"},
                                           {"GET", "/nowhere"}};
    for (size_t p = 0; p < SD_ARRAY_LEN(paths); p++)
        for (size_t i = 0; i < SD_ARRAY_LEN(bad); i++) {
            ASSERT_EQ(call(t, paths[p][0], paths[p][1], bad[i], paths[p][0][0] == 'P' ? "{}" : NULL,
                           &r),
                      401);
            ASSERT(is_error_shape(&r, "invalid_api_key"));
            char v[64];
            ASSERT_STR_EQ(hdr_get(&r, "WWW-Authenticate", v, sizeof v), "Bearer");
            free(r.body);
        }
    ASSERT_EQ(call(t, "GET", "/v1/models", KEY, NULL, &r), 200);
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/v1/models", "authorization: bearer  sekrit-key\r\n", NULL, &r), 200);
    free(r.body);
    /* /health: no key needed; no model here, so not healthy */
    ASSERT_EQ(call(t, "GET", "/health", NULL, NULL, &r), 503);
    ASSERT(is_error_shape(&r, "no_model"));
    free(r.body);
    ASSERT_OK(stop(t));
}

TEST(api_key_comes_from_the_environment_too)
{
    setenv("SPECD_API_KEY", "from-env", 1);
    tsrv *t = start("");
    unsetenv("SPECD_API_KEY");
    resp r;
    ASSERT_EQ(call(t, "GET", "/v1/models", NULL, NULL, &r), 401);
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/v1/models", "Authorization: Bearer from-env\r\n", NULL, &r), 200);
    free(r.body);
    ASSERT_OK(stop(t));
}

TEST(unknown_routes_404_and_wrong_methods_405)
{
    tsrv *t = start("sekrit-key");
    resp r;
    ASSERT_EQ(call(t, "GET", "/v2/models", KEY, NULL, &r), 404);
    ASSERT(is_error_shape(&r, "not_found"));
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/v1/chat/completions", KEY, NULL, &r), 405);
    ASSERT(is_error_shape(&r, "method_not_allowed"));
    char v[32];
    ASSERT_STR_EQ(hdr_get(&r, "Allow", v, sizeof v), "POST");
    free(r.body);
    ASSERT_EQ(call(t, "POST", "/v1/models", KEY, "{}", &r), 405);
    ASSERT_STR_EQ(hdr_get(&r, "Allow", v, sizeof v), "GET");
    free(r.body);
    ASSERT_EQ(call(t, "DELETE", "/metrics", KEY, NULL, &r), 405);
    free(r.body);
    ASSERT_EQ(call(t, "POST", "/health", NULL, "{}", &r), 405);
    free(r.body);
    ASSERT_OK(stop(t));
}

TEST(models_list_and_lookup_use_the_served_name)
{
    tsrv *t = start("sekrit-key");
    resp r;
    ASSERT_EQ(call(t, "GET", "/v1/models", KEY, NULL, &r), 200);
    json_error_t je;
    json_t *v = json_loads(r.body, 0, &je);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(v, "data"), 0),
                                                    "id")),
                  "test-model");
    json_decref(v);
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/v1/models/test-model", KEY, NULL, &r), 200);
    v = json_loads(r.body, 0, &je);
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "id")), "test-model");
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "object")), "model");
    json_decref(v);
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/v1/models/gpt-4", KEY, NULL, &r), 404);
    ASSERT(is_error_shape(&r, "model_not_found"));
    free(r.body);
    ASSERT_OK(stop(t));
}

TEST(bodies_are_validated_before_the_model_is_needed)
{
    tsrv *t = start("sekrit-key");
    resp r;
    static const struct {
        const char *path, *body, *code, *param;
        int status;
    } cases[] = {
        {"/v1/chat/completions", "{\"model\":", "invalid_json", NULL, 400},
        {"/v1/chat/completions", "", "invalid_json", NULL, 400},
        {"/v1/completions", "[]", "invalid_json", NULL, 400},
        {"/v1/chat/completions",
         "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"temperature\":\"hot\"}",
         "invalid_type", "temperature", 400},
        {"/v1/chat/completions",
         "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"top_logprobs\":3}",
         "invalid_value", "top_logprobs", 400},
        {"/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}", "model_not_found", "model",
         400},
        {"/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"x\",\"max_tokens\":0}",
         "invalid_value", "max_tokens", 400},
        {"/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"x\",\"n\":300}",
         "invalid_value", "n", 400},
        {"/tokenize", "{\"prompt\":\"x\",\"messages\":[]}", "invalid_value", "messages", 400},
        {"/tokenize", "nope", "invalid_json", NULL, 400},
        /* valid: only the missing model stops it */
        {"/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"x\"}", "no_model", NULL, 503},
        {"/v1/chat/completions",
         "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"stream\":true}",
         "no_model", NULL, 503},
        {"/tokenize", "{\"prompt\":\"x\"}", "no_model", NULL, 503},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        int st = call(t, "POST", cases[i].path, KEY, cases[i].body, &r);
        ASSERT_MSG(st == cases[i].status, "%s %s -> %d", cases[i].path, cases[i].body, st);
        ASSERT(is_error_shape(&r, cases[i].code));
        if (cases[i].param) {
            json_error_t je;
            json_t *v = json_loadb(r.body, r.body_len, 0, &je);
            ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(v, "error"), "param")),
                          cases[i].param);
            json_decref(v);
        }
        free(r.body);
    }
    ASSERT_OK(stop(t));
}

TEST(oversized_and_slow_bodies_get_413_and_408)
{
    tsrv *t = start("sekrit-key");
    resp r;
    char *big = malloc(8192);
    memset(big, ' ', 8191);
    big[8191] = 0;
    big[0] = '{';
    big[8190] = '}';
    ASSERT_EQ(call(t, "POST", "/v1/completions", KEY, big, &r), 413);
    ASSERT(is_error_shape(&r, "body_too_large"));
    free(r.body);
    free(big);
    int fd = dial(t->port);
    ASSERT_OK(SEND(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                       "Content-Length: 100\r\n\r\n{\"model\""));
    rbuf b = {0};
    ASSERT_EQ(read_responses(fd, &b, &r, 1, 3000), 1);
    ASSERT_EQ(r.status, 408);
    free(r.body);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(t));
}

TEST(metrics_are_prometheus_text_and_count_responses)
{
    tsrv *t = start("sekrit-key");
    resp r;
    ASSERT_EQ(call(t, "POST", "/v1/completions", KEY, "{bad", &r), 400);
    free(r.body);
    ASSERT_EQ(call(t, "GET", "/metrics", KEY, NULL, &r), 200);
    char v[96];
    ASSERT_CONTAINS(hdr_get(&r, "Content-Type", v, sizeof v), "text/plain; version=0.0.4");
    ASSERT_CONTAINS(r.body, "# TYPE specd_requests_total counter\n");
    ASSERT_CONTAINS(r.body, "specd_requests_total{outcome=\"rejected\"} 1\n");
    ASSERT_CONTAINS(r.body, "specd_http_responses_total{code=\"400\"} 1\n");
    ASSERT_CONTAINS(r.body, "# TYPE specd_time_to_first_token_seconds histogram\n");
    free(r.body);
    ASSERT_OK(stop(t));
}

TEST(pipelined_api_requests_answer_in_order)
{
    tsrv *t = start("sekrit-key");
    int fd = dial(t->port);
    ASSERT_OK(SEND(fd, "GET /v1/models HTTP/1.1\r\nHost: t\r\n" KEY "\r\n"
                       "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" KEY
                       "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n3\r\nel\"\r\n0\r\n\r\n"
                       "GET /nope HTTP/1.1\r\nHost: t\r\n" KEY "\r\n"
                       "GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
    rbuf b = {0};
    resp r[4];
    ASSERT_EQ(read_responses(fd, &b, r, 4, 3000), 4);
    ASSERT_EQ(r[0].status, 200);
    ASSERT_EQ(r[1].status, 400); /* the de-chunked body `{"model"` is not JSON */
    ASSERT(is_error_shape(&r[1], "invalid_json"));
    ASSERT_EQ(r[2].status, 404);
    ASSERT_EQ(r[3].status, 503);
    resps_free(r, 4);
    free(b.p);
    close(fd);
    ASSERT_OK(stop(t));
}

TEST(memory_feed_runs_the_same_routes)
{
    sd_opts o;
    sd_err err = {0};
    sd_opts_init(&o, &err);
    sd_opts_set(&o, SD_CMD_SERVE, "served-model-name", "m", &err);
    uv_loop_t loop;
    uv_loop_init(&loop);
    sd_server *s;
    ASSERT_OK(sd_server_start(&s, &loop, &o,
                              SD_SERVER_NO_ENGINE | SD_SERVER_NO_SIGNALS | SD_SERVER_NO_LISTEN,
                              &err));
    sd_buf out = {0};
    const char *in = "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
                     "GET /v1/models HTTP/1.1\r\n\r\n";
    sd_server_feed(s, in, strlen(in), &out);
    ASSERT_CONTAINS(out.p, "HTTP/1.1 400 Bad Request");
    ASSERT_CONTAINS(out.p, "\"param\":\"model\"");
    ASSERT_CONTAINS(out.p, "\"id\":\"m\"");
    sd_buf_free(&out);
    sd_server_drain(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    sd_server_free(s);
    ASSERT_OK(uv_loop_close(&loop));
    sd_opts_free(&o);
}

/* ---- a schema's compilation off the loop thread -------------------------------- */

/* Where a schema whose text holds HELD compiles, hold_compile (the schema
 * cache's test hook) waits until the test releases it. */
#define HELD "held_here"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int held;     /* compilations waiting */
    int released; /* they may go on */
} latch = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static void hold_compile(const char *text)
{
    if (!strstr(text, HELD))
        return;
    pthread_mutex_lock(&latch.mu);
    latch.held++;
    pthread_cond_broadcast(&latch.cv);
    while (!latch.released)
        pthread_cond_wait(&latch.cv, &latch.mu);
    latch.held--;
    pthread_mutex_unlock(&latch.mu);
}

static void latch_arm(void)
{
    pthread_mutex_lock(&latch.mu);
    latch.released = 0;
    pthread_mutex_unlock(&latch.mu);
}

static void latch_release(void)
{
    pthread_mutex_lock(&latch.mu);
    latch.released = 1;
    pthread_cond_broadcast(&latch.cv);
    pthread_mutex_unlock(&latch.mu);
}

/* 1 once n compilations wait at the latch, 0 after timeout_ms */
static int latch_wait_held(int n, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&latch.mu);
    while (latch.held < n && pthread_cond_timedwait(&latch.cv, &latch.mu, &until) == 0)
        ;
    int ok = latch.held >= n;
    pthread_mutex_unlock(&latch.mu);
    return ok;
}

static void *release_later(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    latch_release();
    return NULL;
}

/* A chat request with the fields `more` (JSON members after the messages),
 * sent on a fresh connection; its socket, or -1. */
static int send_chat(int port, const char *more)
{
    int fd = dial(port);
    if (fd < 0)
        return -1;
    sd_buf q = {0};
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
             "\"max_tokens\":400,\"temperature\":0,%s}",
             more);
    sd_buf_printf(&q, "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" KEY
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                  strlen(body), body);
    int rc = send_all(fd, q.p, q.len);
    sd_buf_free(&q);
    if (rc) {
        close(fd);
        return -1;
    }
    return fd;
}

/* the fields of a response_format json_schema request */
#define RF(schema)                                                                         \
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":" schema \
    "}}"

static int read_one(int fd, resp *r, int timeout_ms)
{
    rbuf b = {0};
    memset(r, 0, sizeof *r);
    int n = read_responses(fd, &b, r, 1, timeout_ms);
    free(b.p);
    return n == 1 ? r->status : -1;
}

/* While one request's schema compiles (held at the latch), the loop thread
 * answers others: /health, and a small inline request; the held requests
 * then end as they would have: a good schema's 200 whose content is the
 * schema's JSON, a bad schema's 400, exactly the error sd_oai_parse gives;
 * a client that left meanwhile is let go; and a drain waits for a held one. */
TEST(a_schema_compiling_on_the_pool_leaves_the_loop_answering)
{
    char model[1024];
    snprintf(model, sizeof model, "%s/tests/net/fixtures/tiny-chat", sd_test_srcdir());
    char cfg[1100];
    struct stat st;
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    if (stat(cfg, &st))
        TEST_SKIP("no test model at %s", model);
    tsrv *t = start_with("sekrit-key", model);
    ASSERT(t);
    resp r;
    int health = -1;
    for (int i = 0; i < 600 && health != 200; i++) { /* loaded and warmed up: 200 */
        health = call(t, "GET", "/health", NULL, NULL, &r);
        free(r.body);
        if (health != 200)
            usleep(100 * 1000);
    }
    ASSERT_EQ(health, 200);

    static const char good[] = RF("{\"type\":\"object\",\"properties\":{\"" HELD "\":{\"enum\":[1]}},"
                                  "\"required\":[\"" HELD "\"],\"additionalProperties\":false}");
    static const char bad[] = RF("{\"type\":\"object\",\"properties\":{\"" HELD "\":{\"type\":\"objekt\"}}}");
    /* a forced call: its tools' schema compiles in the parse too */
    static const char gone[] = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                               "\"parameters\":{\"type\":\"object\",\"properties\":{\"" HELD "\":"
                               "{\"type\":\"integer\"}}}}}],\"tool_choice\":\"required\"";
    latch_arm();
    sd_schema_cache_set_test_hook(hold_compile);
    int fd_good = send_chat(t->port, good);
    int fd_bad = send_chat(t->port, bad);
    int fd_gone = send_chat(t->port, gone);
    /* the three compile at once, on the pool (before: the first held the
     * loop thread, and the others were never read) */
    int all_held = latch_wait_held(3, 5000);
    if (fd_gone >= 0)
        close(fd_gone); /* its client leaves while its schema compiles */
    resp h, tk;
    health = call(t, "GET", "/health", NULL, NULL, &h);
    int tok = call(t, "POST", "/tokenize", KEY, "{\"prompt\":\"x\"}", &tk);
    latch_release();
    resp rg, rb;
    int st_good = fd_good >= 0 ? read_one(fd_good, &rg, 30000) : -1;
    int st_bad = fd_bad >= 0 ? read_one(fd_bad, &rb, 5000) : -1;
    if (fd_good >= 0)
        close(fd_good);
    if (fd_bad >= 0)
        close(fd_bad);

    /* a drain waits for a request whose schema compiles: stop() returns
     * once the latch is let go (release_later) and the request is done */
    latch_arm();
    int fd_drain = send_chat(t->port, RF("{\"enum\":[\"" HELD "\",3]}"));
    int drain_held = latch_wait_held(1, 5000);
    pthread_t rel;
    pthread_create(&rel, NULL, release_later, NULL);
    int stopped = stop(t);
    pthread_join(rel, NULL);
    sd_schema_cache_set_test_hook(NULL);
    resp rd;
    int st_drain = fd_drain >= 0 ? read_one(fd_drain, &rd, 3000) : -1;
    if (fd_drain >= 0)
        close(fd_drain);

    /* (asserted only now: a failure above must not leave the latch held) */
    ASSERT_MSG(health == 200, "GET /health while schemas compiled: %d", health);
    free(h.body);
    ASSERT_MSG(tok == 200, "POST /tokenize while schemas compiled: %d", tok);
    ASSERT_CONTAINS(tk.body, "\"tokens\":[");
    free(tk.body);
    ASSERT_MSG(all_held, "the three requests' schemas did not all compile at once");
    ASSERT_EQ(st_good, 200);
    json_error_t je;
    json_t *v = json_loadb(rg.body, rg.body_len, 0, &je);
    json_t *c0 = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    const char *content = json_string_value(json_object_get(json_object_get(c0, "message"), "content"));
    ASSERT(content);
    json_t *out = json_loads(content, 0, &je);
    ASSERT_MSG(out && json_object_size(out) == 1 &&
                   json_integer_value(json_object_get(out, HELD)) == 1,
               "content %s", content);
    json_decref(out);
    json_decref(v);
    free(rg.body);
    ASSERT_EQ(st_bad, 400);
    {
        /* the error today's parse gives for that body, to the byte */
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"max_tokens\":400,\"temperature\":0,%s}",
                 bad);
        sd_oai_request req;
        sd_api_error e;
        ASSERT(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), "test-model", NULL, &req, &e) != 0);
        sd_buf want = {0};
        sd_api_error_json(&want, &e);
        ASSERT_EQ(rb.body_len, want.len);
        ASSERT(!memcmp(rb.body, want.p, want.len));
        ASSERT_STR_EQ(e.param, "response_format.json_schema.schema");
        sd_buf_free(&want);
    }
    free(rb.body);
    ASSERT_MSG(drain_held, "the drain's request did not reach its compilation");
    ASSERT_OK(stopped);
    ASSERT_EQ(st_drain, 503); /* shutting down by the time it was parsed */
    ASSERT(is_error_shape(&rd, "shutting_down"));
    free(rd.body);
}

TEST_MAIN(T(every_route_but_health_needs_the_key), T(api_key_comes_from_the_environment_too),
          T(unknown_routes_404_and_wrong_methods_405),
          T(models_list_and_lookup_use_the_served_name),
          T(bodies_are_validated_before_the_model_is_needed),
          T(oversized_and_slow_bodies_get_413_and_408),
          T(metrics_are_prometheus_text_and_count_responses),
          T(pipelined_api_requests_answer_in_order), T(memory_feed_runs_the_same_routes),
          T(a_schema_compiling_on_the_pool_leaves_the_loop_answering))

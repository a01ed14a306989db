/* libFuzzer target over the request path of `specd serve`, no model needed.
 *
 * The input is what a client sends on one connection. It goes through the
 * server's own connection code (net/http.c on a socketless connection: llhttp,
 * pipelining, chunked bodies, the 413/431 limits), then the same decisions the
 * server makes, in the same order: the API key and the route (net/router.c),
 * then JSON validation of the body (net/openai.c). What validates is run on
 * through the context check and the response, chunk and SSE builders. The same
 * bytes are also handed to the validators directly as a body, to reach deep
 * into the JSON paths without HTTP framing.
 *
 * Properties checked (a violation aborts, and libFuzzer keeps the input):
 *   - every byte the connection writes is a sequence of HTTP/1.1 responses;
 *   - an error is always OpenAI-shaped JSON (parsed back here);
 *   - a validated request has a model, a prompt or messages, and sane ranges;
 *   - sanitized text is valid UTF-8 (jansson accepts it as a string);
 *   - the bytes read as a model's reply for tool calls (net/toolcall.c) give
 *     the same content and calls fed whole as fed in pieces the data sizes.
 *
 * Build: meson setup build-fuzz -Dfuzz=true (CC=clang), or directly with clang
 * as tests/net/test_fuzz_request.sh does. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/log.h"
#include "net/buf.h"
#include "net/http.h"
#include "net/metrics.h"
#include "net/openai.h"
#include "verify/json_schema.h"
#include "net/router.h"
#include "net/reasoning.h"
#include "net/toolcall.h"

#define MODEL "fuzz-model"
#define KEY "fuzz-key"
#define CONTEXT 2048

/* Made once for the whole run (a harness, not library code). */
static uv_loop_t loop;
static sd_http_server *srv;
static sd_metrics metrics;

static void die(const char *what, const void *data, size_t len)
{
    fprintf(stderr, "fuzz_request: %s: %.*s\n", what, (int)(len > 2000 ? 2000 : len),
            (const char *)data);
    abort();
}

/* Error JSON of e, parsed back: it must be {"error": {message, type, param, code}}. */
static void check_error_shape(const sd_api_error *e)
{
    sd_buf b = {0};
    if (sd_api_error_json(&b, e))
        die("error JSON could not be built", e->message, strlen(e->message));
    json_error_t je;
    json_t *v = json_loadb(b.p, b.len, 0, &je);
    json_t *o = json_object_get(v, "error");
    if (!json_is_string(json_object_get(o, "message")) ||
        !json_is_string(json_object_get(o, "type")) || !json_object_get(o, "param") ||
        !json_object_get(o, "code") || e->status < 400 || e->status > 599)
        die("error JSON is not OpenAI-shaped", b.p, b.len);
    json_decref(v);
    sd_buf_free(&b);
}

/* tokenize: only the prompt or messages are filled, no sampling parameters. */
static void check_request(const sd_oai_request *r, int tokenize, const void *data, size_t size)
{
    if (r->kind == SD_OAI_CHAT && r->n_msgs < 1)
        die("validated chat without messages", data, size);
    if (r->kind == SD_OAI_COMPLETIONS) {
        if (r->n_prompts < 1 || r->n_prompts > SD_OAI_MAX_N || (tokenize && r->n_prompts != 1))
            die("validated completion without a prompt, or with too many", data, size);
        for (int i = 0; i < r->n_prompts; i++)
            if (r->prompts[i].is_ids ? r->prompts[i].n_ids < 1 : !r->prompts[i].text)
                die("validated completion with an empty prompt", data, size);
    }
    if (tokenize)
        return;
    const sd_gen_params *g = &r->gen;
    if (g->temperature < 0 || g->temperature > 2 || g->top_p <= 0 || g->top_p > 1 ||
        g->top_k < 0 || g->n_stop > SD_OAI_MAX_STOP || (r->max_tokens == 0 && !r->echo) || r->max_tokens < -1 ||
        r->n < 1 || (r->kind == SD_OAI_COMPLETIONS && r->n * r->n_prompts > SD_OAI_MAX_N))
        die("validated request out of range", data, size);
}

/* Runs a validated request through what follows validation, minus the engine. */
static void exercise(sd_oai_request *r, int tokenize, const void *data, size_t size)
{
    check_request(r, tokenize, data, size);
    sd_api_error e;
    /* a forced call in a model's own format and a schema after the
     * reasoning (the server's next steps): the grammar compiles and takes
     * any bytes */
    if (!tokenize && (r->tool_forced || r->gen.json_schema || r->gen.json_object)) {
        int rc = r->tool_forced ? sd_oai_force_format(r, (sd_tool_format)(1 + size % 5), &e) : 0;
        if (!rc && size % 3 == 0)
            rc = sd_oai_json_after(r, size & 2 ? "<think>" : NULL, "</think>", (int)(size & 1), &e);
        if (rc) {
            check_error_shape(&e);
        } else if (r->gen.json_schema) {
            sd_jschema *s = NULL;
            sd_err err = {0};
            if (sd_jschema_compile(r->gen.json_schema, strlen(r->gen.json_schema), &s, &err))
                die("a request's grammar does not compile", data, size);
            sd_jschema_state st;
            sd_jschema_init(s, &st);
            (void)sd_jschema_feed(s, &st, data, size);
            (void)sd_jschema_done(s, &st);
            sd_jschema_free(s);
        }
    }
    const sd_oai_prompt *p0 = r->kind == SD_OAI_COMPLETIONS ? &r->prompts[0] : NULL;
    int n_prompt = !p0 ? (int)(size % (2 * CONTEXT)) : p0->is_ids ? p0->n_ids : (int)(p0->len % (2 * CONTEXT));
    if (sd_oai_fit_context(r, n_prompt, CONTEXT, &e))
        check_error_shape(&e);
    /* max_tokens 0 (echo only): the prompt alone */
    else if (r->gen.max_tokens < (r->max_tokens == 0 ? 0 : 1) || n_prompt + r->gen.max_tokens > CONTEXT)
        die("fit_context let an oversized request through", data, size);
    sd_req_stats st;
    memset(&st, 0, sizeof st);
    st.prompt_tokens = n_prompt;
    st.completion_tokens = (int)(size % 97);
    st.spec.steps = size % 13;
    st.spec.emitted = size % 31;
    /* the request's own n choices (at most 4 here), the last of them in m */
    const int n = r->n < 1 ? 1 : r->n > 4 ? 4 : r->n;
    sd_oai_meta m = {r->kind, "cmpl-fuzz", 1, MODEL, n - 1};
    sd_buf b = {0};
    /* the raw input stands in for model output: any bytes at all */
    sd_oai_choice ch[4];
    /* logprobs asked: entries from the input's bytes (no tokenizer here:
     * each token's text is empty), -inf among them */
    sd_token_logprob lp[8];
    int32_t ids[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = i < (int)size ? ((const unsigned char *)data)[i] : i;
        lp[i] = (sd_token_logprob){i % 3 ? -(float)ids[i] / 7 : -INFINITY,
                                   r->gen.top_logprobs < 3 ? r->gen.top_logprobs : 3,
                                   {ids[i], ids[0], 5},
                                   {-0.1f, -INFINITY, -2}};
    }
    size_t off = size;
    sd_oai_logprobs L = {NULL, r->gen.top_logprobs, ids, lp, 8, &off};
    for (int i = 0; i < n; i++)
        ch[i] = (sd_oai_choice){data, size >> i, data, size, NULL, 0,
                                i % 2 ? SD_FINISH_LENGTH : SD_FINISH_STOP,
                                r->gen.logprobs ? &L : NULL};
    if (sd_oai_response(&b, &m, ch, n, &st) ||
        sd_oai_chunk_event_lp(&b, &m, 1, data, size, SD_FINISH_NONE, r->gen.logprobs ? &L : NULL) ||
        sd_oai_usage_event(&b, &m, &st) || sd_sse_done(&b))
        die("response builders failed", data, size);
    sd_buf_free(&b);
}

static void respond_error(sd_http_req *req, const sd_api_error *e, const char *extra)
{
    check_error_shape(e);
    sd_buf b = {0};
    sd_api_error_json(&b, e);
    sd_http_respond(req, e->status, "application/json", extra, b.p ? b.p : "", b.len);
    sd_buf_free(&b);
}

/* The server's decisions (src/net/server.c, handle()), without a model. */
static void handler(void *user, sd_http_req *req)
{
    (void)user;
    const char *path = sd_http_path(req);
    sd_api_error e;
    if (sd_route_needs_key(path) &&
        !sd_api_key_ok(sd_http_header(req, "Authorization"), KEY, sizeof KEY - 1)) {
        sd_api_error_set(&e, 401, NULL, "invalid_api_key", "missing or wrong API key");
        respond_error(req, &e, "WWW-Authenticate: Bearer\r\n");
        return;
    }
    sd_route route;
    const char *allow;
    int st = sd_route_find(sd_http_method(req), path, &route, &allow);
    if (st != 200) {
        if ((st == 405) != (allow != NULL))
            die("405 without Allow (or Allow without 405)", path, strlen(path));
        sd_api_error_set(&e, st, NULL, st == 405 ? "method_not_allowed" : "not_found", "%s",
                         path);
        respond_error(req, &e, NULL);
        return;
    }
    size_t len;
    const char *body = sd_http_body(req, &len);
    sd_oai_request r;
    sd_buf b = {0};
    switch (route) {
    case SD_ROUTE_CHAT:
    case SD_ROUTE_COMPLETIONS:
    case SD_ROUTE_TOKENIZE: {
        int rc = route == SD_ROUTE_TOKENIZE
                     ? sd_oai_parse_tokenize(body, len, MODEL, NULL, &r, &e)
                     : sd_oai_parse(route == SD_ROUTE_CHAT ? SD_OAI_CHAT : SD_OAI_COMPLETIONS,
                                    body, len, MODEL, NULL, &r, &e);
        if (rc) {
            respond_error(req, &e, NULL);
            return;
        }
        exercise(&r, route == SD_ROUTE_TOKENIZE, body, len);
        sd_oai_request_free(&r);
        sd_api_error_set(&e, 503, NULL, "no_model", "this harness runs without a model");
        respond_error(req, &e, "Retry-After: 5\r\n");
        return;
    }
    case SD_ROUTE_MODELS:
    case SD_ROUTE_MODEL: sd_oai_models(&b, MODEL, 1, CONTEXT); break;
    case SD_ROUTE_METRICS: sd_metrics_render(&metrics, NULL, &b); break;
    default: sd_buf_puts(&b, "{\"status\":\"ok\"}"); break;
    }
    sd_http_respond(req, 200, "application/json", NULL, b.p, b.len);
    sd_buf_free(&b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sd_log_set_level(SD_LOG_ERROR); /* one info line per rejected request otherwise */
    uv_loop_init(&loop);
    sd_metrics_init(&metrics);
    sd_http_limits lim;
    sd_http_limits_default(&lim);
    lim.max_body = 64 << 10; /* small limits, so that inputs can reach them */
    lim.max_header_bytes = 8 << 10;
    lim.max_headers = 32;
    sd_err err = {0};
    if (sd_http_server_create(&srv, &loop, &lim, handler, NULL, &metrics, &err)) {
        fprintf(stderr, "fuzz_request: %s\n", err.msg);
        abort();
    }
    return 0;
}

/* the tool-call parser's output as one text: content, and [name|arguments] per call */
static int tc_collect(void *arg, const char *content, size_t len, const sd_tool_call *call)
{
    sd_buf *b = arg;
    if (!call)
        return sd_buf_append(b, content, len);
    return sd_buf_printf(b, "[%s|%s]", call->name, call->arguments);
}

/* the input as a model's reply in format f, whole and in pieces */
static void toolcall_pieces(const uint8_t *data, size_t size, sd_tool_format f)
{
    sd_buf whole = {0}, pieces = {0};
    sd_tc_parser p;
    sd_tc_init(&p, f, (int)(size & 1), 7, tc_collect, &whole);
    if (sd_tc_feed(&p, (const char *)data, size) || sd_tc_end(&p))
        die("tool calls: feed failed", (const char *)data, size);
    sd_tc_free(&p);
    sd_tc_init(&p, f, (int)(size & 1), 7, tc_collect, &pieces);
    for (size_t i = 0; i < size;) {
        size_t n = 1 + data[i] % 13;
        if (n > size - i)
            n = size - i;
        if (sd_tc_feed(&p, (const char *)data + i, n))
            die("tool calls: feed failed", (const char *)data, size);
        i += n;
    }
    if (sd_tc_end(&p))
        die("tool calls: end failed", (const char *)data, size);
    sd_tc_free(&p);
    if (whole.len != pieces.len || (whole.len && memcmp(whole.p, pieces.p, whole.len)))
        die("tool calls: pieces differ from the whole", (const char *)data, size);
    sd_buf_free(&whole);
    sd_buf_free(&pieces);
}

static int rs_collect(void *arg, int reasoning, const char *text, size_t len)
{
    return sd_buf_printf(arg, "%c%zu:", reasoning ? 'r' : 'c', len) || sd_buf_append(arg, text, len);
}

/* the input as a reply split into reasoning and content, whole and in
 * pieces: the same text of each (pieces may split differently: compared
 * after joining each kind) */
static void reasoning_pieces(const uint8_t *data, size_t size, int in_reasoning)
{
    sd_buf out[2] = {{0}};
    for (int k = 0; k < 2; k++) {
        sd_rs_parser p;
        sd_rs_init(&p, in_reasoning, rs_collect, &out[k]);
        for (size_t i = 0; i < size;) {
            size_t n = k == 0 ? size : 1 + data[i] % 7;
            if (n > size - i)
                n = size - i;
            if (sd_rs_feed(&p, (const char *)data + i, n))
                die("reasoning: feed failed", (const char *)data, size);
            i += n;
        }
        if (sd_rs_end(&p))
            die("reasoning: end failed", (const char *)data, size);
        sd_rs_free(&p);
    }
    /* join the pieces of each kind */
    sd_buf joined[2][2] = {{{0}}};
    for (int k = 0; k < 2; k++)
        for (size_t at = 0; at < out[k].len;) {
            int r = out[k].p[at] == 'r';
            char *end;
            size_t n = strtoull(out[k].p + at + 1, &end, 10);
            at = (size_t)(end - out[k].p) + 1;
            sd_buf_append(&joined[k][r], out[k].p + at, n);
            at += n;
        }
    for (int r = 0; r < 2; r++) {
        if (joined[0][r].len != joined[1][r].len ||
            (joined[0][r].len && memcmp(joined[0][r].p, joined[1][r].p, joined[0][r].len)))
            die("reasoning: pieces differ from the whole", (const char *)data, size);
        sd_buf_free(&joined[0][r]);
        sd_buf_free(&joined[1][r]);
    }
    sd_buf_free(&out[0]);
    sd_buf_free(&out[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const sd_tool_format formats[] = {SD_TOOLS_HERMES, SD_TOOLS_JSON, SD_TOOLS_KIMI, SD_TOOLS_DEEPSEEK31,
                                             SD_TOOLS_DEEPSEEK3};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
        toolcall_pieces(data, size, formats[f]);
    reasoning_pieces(data, size, 0);
    reasoning_pieces(data, size, 1);
    sd_buf out = {0};
    sd_http_feed_memory(srv, data, size, &out);
    /* Every response the connection wrote starts where the previous ended. */
    size_t at = 0;
    while (at < out.len) {
        const char *p = out.p + at;
        if (out.len - at < 12 || memcmp(p, "HTTP/1.1 ", 9) != 0)
            die("output is not a sequence of HTTP/1.1 responses", p, out.len - at);
        const char *he = strstr(p, "\r\n\r\n");
        if (!he)
            die("response head without its end", p, out.len - at);
        size_t after = (size_t)(he + 4 - out.p);
        if (!memcmp(p + 9, "100 ", 4)) { /* interim: no body */
            at = after;
            continue;
        }
        const char *cl = strstr(p, "Content-Length: ");
        if (!cl || cl > he)
            die("response without Content-Length", p, out.len - at);
        size_t with_body = after + (size_t)strtoull(cl + 16, NULL, 10);
#define STARTS_RESPONSE(i) ((i) == out.len || (out.len - (i) >= 9 && !memcmp(out.p + (i), "HTTP/1.1 ", 9)))
        if (with_body <= out.len && STARTS_RESPONSE(with_body))
            at = with_body;
        else if (STARTS_RESPONSE(after)) /* HEAD: the length of a body not sent */
            at = after;
        else
            die("response body overruns", p, out.len - at);
#undef STARTS_RESPONSE
    }
    sd_buf_free(&out);

    sd_oai_request r;
    sd_api_error e;
    for (int kind = 0; kind < 3; kind++) {
        int rc = kind == 2 ? sd_oai_parse_tokenize((const char *)data, size, MODEL, NULL, &r, &e)
                           : sd_oai_parse((sd_oai_kind)kind, (const char *)data, size, MODEL, NULL, &r, &e);
        if (rc) {
            check_error_shape(&e);
        } else {
            exercise(&r, kind == 2, data, size);
            sd_oai_request_free(&r);
        }
    }
    sd_buf clean = {0};
    if (sd_utf8_sanitize(&clean, (const char *)data, size))
        die("sanitize failed", data, size);
    json_t *s = json_stringn(clean.p ? clean.p : "", clean.len);
    if (!s)
        die("sanitized text is not valid UTF-8", clean.p, clean.len);
    json_decref(s);
    sd_buf_free(&clean);
    return 0;
}

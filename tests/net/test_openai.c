#include <jansson.h>

#include "core/util.h"
#include "net/openai.h"
#include "verify/json_schema.h"
#include "verify/schema_cache.h"
#include "test.h"

#define MODEL "specd-tiny"

/* Parses body as route kind and expects a 400 naming param (and, when code
 * is set, that error code). */
static int expect_400(sd_oai_kind kind, const char *body, const char *param, const char *code)
{
    sd_oai_request r;
    sd_api_error e;
    memset(&e, 0, sizeof e);
    int rc = sd_oai_parse(kind, body, strlen(body), MODEL, NULL, &r, &e);
    int ok = rc != 0 && e.status == 400 && strcmp(e.param, param) == 0 &&
             (!code || strcmp(e.code, code) == 0) && e.message[0] &&
             strcmp(e.type, "invalid_request_error") == 0;
    if (!ok)
        fprintf(stderr, "  body %s\n    rc %d status %d param '%s' (want '%s') code '%s' (want "
                        "'%s') message '%s'\n",
                body, rc, e.status, e.param, param, e.code, code ? code : "*", e.message);
    if (rc == 0)
        sd_oai_request_free(&r);
    return ok;
}

static int parse_ok(sd_oai_kind kind, const char *body, sd_oai_request *r)
{
    sd_api_error e;
    memset(&e, 0, sizeof e);
    int rc = sd_oai_parse(kind, body, strlen(body), MODEL, NULL, r, &e);
    if (rc)
        fprintf(stderr, "  body %s\n    refused: %d %s (param %s)\n", body, e.status, e.message,
                e.param);
    return rc == 0;
}

#define CHAT_MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define C(extra) "{\"model\":\"" MODEL "\"," CHAT_MSGS extra "}"
#define P(extra) "{\"model\":\"" MODEL "\",\"prompt\":\"hi\"" extra "}"

TEST(a_full_chat_request_maps_to_gen_params)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT,
                    "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"developer\",\"content\":"
                    "\"be brief\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                    "\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\","
                    "\"content\":null,\"tool_calls\":[]}],\"stream\":true,\"stream_options\":{"
                    "\"include_usage\":true},\"max_completion_tokens\":7,\"temperature\":0.5,"
                    "\"top_p\":0.9,\"top_k\":40,\"seed\":-3,\"n\":1,\"stop\":[\"x\",\"yy\"],"
                    "\"logprobs\":false,\"presence_penalty\":0,\"tools\":[],\"tool_choice\":"
                    "\"none\",\"response_format\":{\"type\":\"text\"},\"user\":\"u\"}",
                    &r));
    ASSERT_EQ(r.kind, SD_OAI_CHAT);
    ASSERT_EQ(r.n_msgs, 3);
    ASSERT_STR_EQ(r.msgs[0].role, "system");
    ASSERT_STR_EQ(r.msgs[1].content, "a\nb");
    ASSERT_STR_EQ(r.msgs[2].role, "assistant");
    ASSERT_STR_EQ(r.msgs[2].content, "");
    ASSERT_EQ(r.stream, 1);
    ASSERT_EQ(r.include_usage, 1);
    ASSERT_EQ(r.max_tokens, 7);
    ASSERT_STR_EQ(r.max_tokens_param, "max_completion_tokens");
    ASSERT_NEAR(r.gen.temperature, 0.5, 0);
    ASSERT_NEAR(r.gen.top_p, 0.9, 0);
    ASSERT_EQ(r.gen.top_k, 40);
    ASSERT_EQ(r.gen.has_seed, 1);
    ASSERT(r.gen.seed == (uint64_t)-3);
    ASSERT_EQ(r.gen.n_stop, 2);
    ASSERT_STR_EQ(r.gen.stop[1], "yy");
    sd_oai_request_free(&r);
}

TEST(completion_defaults_follow_openai)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(""), &r));
    ASSERT_EQ(r.n_prompts, 1);
    ASSERT_STR_EQ(r.prompts[0].text, "hi");
    ASSERT_EQ(r.prompts[0].is_ids, 0);
    ASSERT_EQ(r.n, 1);
    ASSERT_EQ(r.stream, 0);
    ASSERT_EQ(r.max_tokens, -1);
    ASSERT_NEAR(r.gen.temperature, 1.0, 0); /* OpenAI's default, not greedy */
    ASSERT_NEAR(r.gen.top_p, 1.0, 0);
    ASSERT_EQ(r.gen.top_k, 0);
    ASSERT_EQ(r.gen.has_seed, 0);
    ASSERT_OK(sd_oai_fit_context(&r, 5, 100, NULL));
    ASSERT_EQ(r.gen.max_tokens, SD_OAI_DEFAULT_COMPLETION_TOKENS);
    ASSERT_OK(sd_oai_fit_context(&r, 95, 100, NULL));
    ASSERT_EQ(r.gen.max_tokens, 5); /* the default shrinks to what the context leaves */
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(""), &r));
    ASSERT_OK(sd_oai_fit_context(&r, 30, 100, NULL));
    ASSERT_EQ(r.gen.max_tokens, 70); /* chat: the rest of the context */
    sd_oai_request_free(&r);
}

TEST(prompt_forms_text_single_batch_and_token_ids)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[\"one\"]}", &r));
    ASSERT_EQ(r.n_prompts, 1);
    ASSERT_STR_EQ(r.prompts[0].text, "one");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[5,0,7]}", &r));
    ASSERT_EQ(r.n_prompts, 1);
    ASSERT_EQ(r.prompts[0].is_ids, 1);
    ASSERT_EQ(r.prompts[0].n_ids, 3);
    ASSERT_EQ(r.prompts[0].ids[2], 7);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[[9]]}", &r));
    ASSERT_EQ(r.prompts[0].n_ids, 1);
    ASSERT_EQ(r.prompts[0].ids[0], 9);
    sd_oai_request_free(&r);
    /* a batch: strings and token arrays, each a prompt of its own */
    ASSERT(parse_ok(SD_OAI_COMPLETIONS,
                    "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",[1,2],\"\"],\"n\":2}", &r));
    ASSERT_EQ(r.n_prompts, 3);
    ASSERT_STR_EQ(r.prompts[0].text, "a");
    ASSERT_EQ(r.prompts[1].is_ids, 1);
    ASSERT_EQ(r.prompts[1].ids[1], 2);
    ASSERT_EQ(r.prompts[2].len, 0);
    ASSERT_EQ(r.n, 2);
    sd_oai_request_free(&r);
    /* what a batch may not hold, named by its place */
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",5]}",
                      "prompt", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",[]]}",
                      "prompt", "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[[1],[-1]]}",
                      "prompt", "invalid_value"));
    /* n times the prompts: at most SD_OAI_MAX_N choices */
    ASSERT(expect_400(SD_OAI_COMPLETIONS,
                      "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",\"b\"],\"n\":65}", "n",
                      "invalid_value"));
    ASSERT(parse_ok(SD_OAI_COMPLETIONS,
                    "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",\"b\"],\"n\":64}", &r));
    sd_oai_request_free(&r);
    /* text with characters JSON escapes */
    ASSERT(parse_ok(SD_OAI_COMPLETIONS,
                    "{\"model\":\"" MODEL "\",\"prompt\":\"a\\nb\\u00e9\\ud83d\\ude00\"}", &r));
    ASSERT_STR_EQ(r.prompts[0].text, "a\nb\xc3\xa9\xf0\x9f\x98\x80");
    sd_oai_request_free(&r);
    /* a prompt may hold NUL (it travels with its length) */
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":\"a\\u0000b\"}", &r));
    ASSERT_EQ(r.prompts[0].len, 3);
    ASSERT(memcmp(r.prompts[0].text, "a\0b", 3) == 0);
    sd_oai_request_free(&r);
}

TEST(nul_is_refused_outside_the_prompt)
{
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stop\":\"a\\u0000\""), "stop", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"" MODEL "\\u0000x\"," CHAT_MSGS "}", "model",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"a\\u0000\"}]}",
                      "messages[0].content", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\\u0000\","
                      "\"content\":\"a\"}]}",
                      "messages[0].role", "invalid_value"));
}

TEST(malformed_json_is_400_without_param)
{
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_CHAT, "", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_CHAT, "[1,2]", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_CHAT, "\"text\"", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"a\":1} trailing", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"x\",\"model\":\"y\"}", "", "invalid_json"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"prompt\":\"\xff\xfe\"}", "", "invalid_json"));
}

TEST(model_is_required_and_must_be_the_served_one)
{
    ASSERT(expect_400(SD_OAI_CHAT, "{" CHAT_MSGS "}", "model", "missing_required_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":null," CHAT_MSGS "}", "model", NULL));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":3," CHAT_MSGS "}", "model", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"gpt-4\"," CHAT_MSGS "}", "model",
                      "model_not_found"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"other\",\"prompt\":\"x\"}", "model",
                      "model_not_found"));
}

TEST(wrong_types_name_the_parameter)
{
    static const struct {
        const char *field, *value;
    } cases[] = {
        {"stream", "\"yes\""},          {"stream", "1"},
        {"stream_options", "true"},     {"max_tokens", "\"5\""},
        {"max_tokens", "1.5"},          {"max_completion_tokens", "[]"},
        {"temperature", "\"hot\""},     {"top_p", "{}"},
        {"top_k", "2.5"},               {"seed", "\"1\""},
        {"n", "\"1\""},                 {"stop", "5"},
        {"stop", "{}"},                 {"logprobs", "1"},
        {"presence_penalty", "\"0\""},  {"frequency_penalty", "[]"},
        {"logit_bias", "[]"},           {"tools", "{}"},
        {"tool_choice", "1"},           {"response_format", "\"text\""},
        {"user", "5"},                  {"ignore_eos", "\"no\""},
        {"top_logprobs", "\"2\""},      {"parallel_tool_calls", "1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"%s\":%s}",
                 cases[i].field, cases[i].value);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, cases[i].field, NULL), "%s", body);
    }
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"echo\":\"x\""), "echo", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"suffix\":3"), "suffix", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"logprobs\":true"), "logprobs", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"best_of\":\"2\""), "best_of", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stream\":true,\"stream_options\":{\"include_usage\":1}"),
                      "stream_options.include_usage", "invalid_type"));
}

TEST(out_of_range_values_name_the_parameter)
{
    static const struct {
        const char *field, *value;
    } cases[] = {
        {"temperature", "-0.1"}, {"temperature", "2.01"}, {"top_p", "0"},
        {"top_p", "1.5"},        {"top_k", "-2"},         {"max_tokens", "0"},
        {"max_tokens", "-5"},    {"max_tokens", "3000000000"},
        {"max_completion_tokens", "0"}, {"n", "0"},      {"presence_penalty", "2.5"},
        {"frequency_penalty", "-3"},    {"top_logprobs", "21"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"%s\":%s}",
                 cases[i].field, cases[i].value);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, cases[i].field, "invalid_value"), "%s", body);
    }
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"max_tokens\":3,\"max_completion_tokens\":4"),
                      "max_tokens", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stream_options\":{\"include_usage\":true}"),
                      "stream_options", "invalid_value")); /* without stream: true */
}

TEST(unsupported_options_are_refused_by_name)
{
    static const struct {
        const char *field, *value;
    } chat[] = {
        {"functions", "[{\"name\":\"f\"}]"},
        {"function_call", "\"auto\""},
        {"response_format", "{\"type\":\"grammar\"}"},
        {"store", "true"},
    };
    for (size_t i = 0; i < sizeof chat / sizeof chat[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"%s\":%s}",
                 chat[i].field, chat[i].value);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, chat[i].field, "unsupported_parameter"), "%s",
                   body);
    }
    /* echo: completions only; with logprobs, the prompt's too */
    {
        sd_oai_request q;
        ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"echo\":true"), &q));
        ASSERT_EQ(q.echo, 1);
        ASSERT_EQ(q.gen.prompt_logprobs, 0);
        sd_oai_request_free(&q);
        ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"echo\":true,\"logprobs\":2"), &q));
        ASSERT_EQ(q.gen.prompt_logprobs, 1);
        ASSERT_EQ(q.gen.top_logprobs, 2);
        sd_oai_request_free(&q);
        ASSERT(expect_400(SD_OAI_CHAT, C(",\"echo\":true"), "echo", NULL));
    }
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"best_of\":3"), "best_of",
                      "unsupported_parameter"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"suffix\":\"end\""), "suffix",
                      "unsupported_parameter"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"n\":0"), "n", "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"n\":129"), "n", "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"n\":\"2\""), "n", "invalid_type"));
    /* neutral values of the same options are accepted */
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_COMPLETIONS,
                    P(",\"logprobs\":null,\"echo\":false,\"best_of\":1,\"suffix\":\"\","
                      "\"logit_bias\":{},\"n\":1,\"frequency_penalty\":0.0"),
                    &r));
    ASSERT_EQ(r.n, 1);
    sd_oai_request_free(&r);
    /* n choices: 1 when not given */
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"n\":4"), &r));
    ASSERT_EQ(r.n, 4);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"n\":128"), &r));
    ASSERT_EQ(r.n, 128);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(""), &r));
    ASSERT_EQ(r.n, 1);
    sd_oai_request_free(&r);
}

/* logprobs: chat's bool and top_logprobs (which needs it), completions'
 * count; off by default and where null or false */
TEST(logprobs_options_map_to_gen_params)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT, C(""), &r));
    ASSERT_EQ(r.gen.logprobs, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"logprobs\":false,\"top_logprobs\":null"), &r));
    ASSERT_EQ(r.gen.logprobs, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"logprobs\":true"), &r));
    ASSERT_EQ(r.gen.logprobs, 1);
    ASSERT_EQ(r.gen.top_logprobs, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"logprobs\":true,\"top_logprobs\":20"), &r));
    ASSERT_EQ(r.gen.top_logprobs, 20);
    sd_oai_request_free(&r);
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"top_logprobs\":2"), "top_logprobs", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs",
                      "invalid_value"));
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"logprobs\":0"), &r));
    ASSERT_EQ(r.gen.logprobs, 1);
    ASSERT_EQ(r.gen.top_logprobs, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"logprobs\":5"), &r));
    ASSERT_EQ(r.gen.top_logprobs, 5);
    sd_oai_request_free(&r);
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"logprobs\":21"), "logprobs", "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"top_logprobs\":2"), "top_logprobs",
                      "unrecognized_argument"));
}


TEST(unknown_parameters_are_refused_by_name)
{
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"temprature\":0.5"), "temprature",
                      "unrecognized_argument"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"min_p\":0.1"), "min_p", "unrecognized_argument"));
    /* a parameter of the other route */
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"prompt\":\"x\""), "prompt", "unrecognized_argument"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"messages\":[]"), "messages",
                      "unrecognized_argument"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, P(",\"max_completion_tokens\":5"),
                      "max_completion_tokens", "unrecognized_argument"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stream\":true,\"stream_options\":{\"x\":1}"),
                      "stream_options.x", "unrecognized_argument"));
}

TEST(messages_are_validated_one_by_one)
{
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"" MODEL "\"}", "messages",
                      "missing_required_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[]}", "messages",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"" MODEL "\",\"messages\":\"hi\"}", "messages",
                      "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[\"hi\"]}",
                      "messages[0]", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                      "{\"content\":\"b\"}]}",
                      "messages[1].role", "missing_required_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}",
                      "messages[0].role", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":7,\"content\":\"a\"}]}",
                      "messages[0].role", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"a\","
                      "\"tool_call_id\":\"x\"}]}",
                      "messages[0].tool_call_id", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"function\",\"content\":\"a\"}]}",
                      "messages[0].role", "unsupported_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\"}]}",
                      "messages[0].content", "missing_required_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
                      "messages[0].content", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
                      "messages[0].content", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":[{"
                      "\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
                      "messages[0].content[0]", "unsupported_parameter"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":[{"
                      "\"type\":\"text\"}]}]}",
                      "messages[0].content[0]", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"a\","
                      "\"mood\":\"x\"}]}",
                      "messages[0].mood", "unrecognized_argument"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"assistant\",\"content\":"
                      "null,\"tool_calls\":[{\"id\":\"1\"}]}]}",
                      "messages[0].tool_calls[0]", "invalid_value"));
}

/* tools: OpenAI's shape checked tool by tool; tool_choice none drops them,
 * auto keeps them, required and a named function are refused (they would
 * need decoding constrained to a call); earlier tool calls come back as
 * objects for the template; the tool role and its tool_call_id. */
TEST(tools_tool_choice_and_tool_messages_are_parsed)
{
#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\"," \
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"
#define CALLS "[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":null," \
              "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":" \
              "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"n\\\": 2.50}\"}}]}," \
              "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}]"
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT, "{\"model\":\"" MODEL "\",\"messages\":" CALLS ",\"tools\":[" TOOL "]}", &r));
    ASSERT(r.tools && json_array_size(r.tools) == 1);
    ASSERT_EQ(r.parallel_tool_calls, 1);
    ASSERT_EQ(r.n_msgs, 3);
    ASSERT_STR_EQ(r.msgs[1].content, "");
    ASSERT_EQ(r.msgs[1].n_calls, 1);
    ASSERT_STR_EQ(r.msgs[1].calls[0].name, "get_weather");
    ASSERT(json_is_object(r.msgs[1].calls[0].arguments));
    ASSERT_NEAR(json_real_value(json_object_get(r.msgs[1].calls[0].arguments, "n")), 2.5, 0);
    /* and its text as sent (DeepSeek's templates print it so) */
    ASSERT_STR_EQ(r.msgs[1].calls[0].arguments_text, "{\"city\": \"Paris\", \"n\": 2.50}");
    ASSERT_STR_EQ(r.msgs[2].role, "tool");
    ASSERT_STR_EQ(r.msgs[2].content, "sunny");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT,
                    "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"none\","
                    "\"parallel_tool_calls\":false}",
                    &r));
    ASSERT(!r.tools); /* none: not shown to the model, not read out of its text */
    ASSERT_EQ(r.parallel_tool_calls, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"auto\"}",
                    &r));
    ASSERT(r.tools);
    ASSERT_EQ(r.tool_forced, 0);
    ASSERT(r.gen.json_schema == NULL);
    sd_oai_request_free(&r);
    /* forced: a named function decodes to its parameters; required to an
     * array of calls (at most one without parallel calls) */
    ASSERT(parse_ok(SD_OAI_CHAT,
                    "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[" TOOL "],\"tool_choice\":"
                    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
                    &r));
    ASSERT_EQ(r.tool_forced, 1);
    ASSERT_STR_EQ(r.forced_name, "get_weather");
    ASSERT_STR_EQ(r.gen.json_schema, "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT,
                    "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[" TOOL "],\"tool_choice\":\"required\","
                    "\"parallel_tool_calls\":false}",
                    &r));
    ASSERT_EQ(r.tool_forced, 2);
    ASSERT(strstr(r.gen.json_schema, "\"type\":\"array\""));
    ASSERT(strstr(r.gen.json_schema, "\"const\":\"get_weather\""));
    ASSERT(strstr(r.gen.json_schema, "\"maxItems\":1"));
    sd_oai_request_free(&r);
    static const struct {
        const char *extra, *param, *code;
    } bad[] = {
        {",\"tools\":{}", "tools", "invalid_type"},
        {",\"tools\":[5]", "tools[0]", "invalid_type"},
        {",\"tools\":[{\"type\":\"web\",\"function\":{\"name\":\"f\"}}]", "tools[0]", "invalid_value"},
        {",\"tools\":[{\"type\":\"function\"}]", "tools[0]", "invalid_value"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "tools[0]", "invalid_value"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", "tools[0]",
         "invalid_type"},
        {",\"tool_choice\":\"auto\"", "tool_choice", "invalid_value"},
        {",\"tools\":[" TOOL "],\"tool_choice\":\"sometimes\"", "tool_choice", "invalid_value"},
        {",\"tool_choice\":\"required\"", "tool_choice", "invalid_value"}, /* no tools */
        {",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\"}", "tool_choice", "invalid_value"},
        {",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}",
         "tool_choice", "invalid_value"},
        {",\"tools\":[" TOOL "],\"parallel_tool_calls\":1", "parallel_tool_calls", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS "%s}", bad[i].extra);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, bad[i].param, bad[i].code), "%s", body);
    }
    static const struct {
        const char *msgs, *param;
    } badm[] = {
        {"[{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[{\"type\":\"function\",\"function\":{"
         "\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
         "messages[0].tool_calls"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":{"
         "\"name\":\"f\",\"arguments\":\"[1]\"}}]}]",
         "messages[0].tool_calls[0]"},
        {"[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":{"
         "\"name\":\"f\",\"arguments\":{}}}]}]",
         "messages[0].tool_calls[0]"},
        {"[{\"role\":\"tool\",\"tool_call_id\":5,\"content\":\"x\"}]", "messages[0].tool_call_id"},
        {"[{\"role\":\"tool\",\"tool_call_id\":\"c\"}]", "messages[0].content"},
    };
    for (size_t i = 0; i < sizeof badm / sizeof badm[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\",\"messages\":%s}", badm[i].msgs);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, badm[i].param, NULL), "%s", body);
    }
#undef TOOL
#undef CALLS
}

/* chat_template_kwargs: enable_thinking and thinking (booleans, null as not
 * given) reach the template; any other argument is refused by name */
TEST(chat_template_kwargs_are_the_thinking_switches)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT, "{\"model\":\"" MODEL "\"," CHAT_MSGS "}", &r));
    ASSERT(r.kwargs.enable_thinking == -1 && r.kwargs.thinking == -1);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT,
                    "{\"model\":\"" MODEL "\"," CHAT_MSGS
                    ",\"chat_template_kwargs\":{\"enable_thinking\":false,\"thinking\":true}}",
                    &r));
    ASSERT(r.kwargs.enable_thinking == 0 && r.kwargs.thinking == 1);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"chat_template_kwargs\":{\"thinking\":null}}",
                    &r));
    ASSERT(r.kwargs.thinking == -1);
    sd_oai_request_free(&r);
    static const struct {
        const char *extra, *param, *code;
    } bad[] = {
        {",\"chat_template_kwargs\":[]", "chat_template_kwargs", "invalid_type"},
        {",\"chat_template_kwargs\":{\"enable_thinking\":1}", "chat_template_kwargs.enable_thinking", "invalid_type"},
        {",\"chat_template_kwargs\":{\"tools_in_user_message\":false}", "chat_template_kwargs.tools_in_user_message",
         "unsupported_parameter"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS "%s}", bad[i].extra);
        ASSERT_MSG(expect_400(SD_OAI_CHAT, body, bad[i].param, bad[i].code), "%s", body);
    }
    /* completions take no template */
    ASSERT(expect_400(SD_OAI_COMPLETIONS,
                      "{\"model\":\"" MODEL "\",\"prompt\":\"a\",\"chat_template_kwargs\":{}}",
                      "chat_template_kwargs", "unrecognized_argument"));
}

TEST(prompt_is_validated)
{
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\"}", "prompt",
                      "missing_required_parameter"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":5}", "prompt",
                      "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[]}", "prompt",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[[]]}", "prompt",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[1,-2]}", "prompt",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[1,\"a\"]}",
                      "prompt", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS, "{\"model\":\"" MODEL "\",\"prompt\":[1,2.5]}",
                      "prompt", "invalid_type"));
    ASSERT(expect_400(SD_OAI_COMPLETIONS,
                      "{\"model\":\"" MODEL "\",\"prompt\":[4294967296]}", "prompt",
                      "invalid_value"));
}

TEST(stop_strings_are_bounded)
{
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stop\":\"\""), "stop", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"stop\":[\"a\",3]"), "stop", "invalid_type"));
    char body[2048];
    char many[512] = "[";
    for (int i = 0; i < SD_OAI_MAX_STOP + 1; i++)
        strcat(many, i ? ",\"s\"" : "\"s\"");
    strcat(many, "]");
    snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"stop\":%s}", many);
    ASSERT(expect_400(SD_OAI_CHAT, body, "stop", "invalid_value"));
    char longs[SD_OAI_MAX_STOP_LEN + 2];
    memset(longs, 'z', sizeof longs - 1);
    longs[sizeof longs - 1] = 0;
    snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"stop\":\"%s\"}", longs);
    ASSERT(expect_400(SD_OAI_CHAT, body, "stop", "invalid_value"));
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"stop\":\"END\""), &r));
    ASSERT_EQ(r.gen.n_stop, 1);
    ASSERT_STR_EQ(r.gen.stop[0], "END");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"stop\":null,\"seed\":null,\"temperature\":null"), &r));
    ASSERT_EQ(r.gen.n_stop, 0);
    ASSERT_NEAR(r.gen.temperature, 1.0, 0);
    sd_oai_request_free(&r);
}

TEST(context_limit_names_prompt_or_max_tokens)
{
    sd_oai_request r;
    sd_api_error e;
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"max_tokens\":50"), &r));
    ASSERT_EQ(sd_oai_fit_context(&r, 60, 100, &e), SD_EINVAL);
    ASSERT_EQ(e.status, 400);
    ASSERT_STR_EQ(e.param, "max_tokens");
    ASSERT_STR_EQ(e.code, "context_length_exceeded");
    ASSERT_CONTAINS(e.message, "100");
    ASSERT_OK(sd_oai_fit_context(&r, 50, 100, &e));
    ASSERT_EQ(r.gen.max_tokens, 50);
    ASSERT_EQ(sd_oai_fit_context(&r, 100, 100, &e), SD_EINVAL);
    ASSERT_STR_EQ(e.param, "prompt");
    ASSERT_EQ(sd_oai_fit_context(&r, 0, 100, &e), SD_EINVAL);
    ASSERT_STR_EQ(e.param, "prompt");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"max_completion_tokens\":10"), &r));
    ASSERT_EQ(sd_oai_fit_context(&r, 95, 100, &e), SD_EINVAL);
    ASSERT_STR_EQ(e.param, "max_completion_tokens");
    ASSERT_EQ(sd_oai_fit_context(&r, 100, 100, &e), SD_EINVAL);
    ASSERT_STR_EQ(e.param, "messages");
    sd_oai_request_free(&r);
}

/* Random bodies: parse never crashes, and a refusal always has a status, a
 * type and a message. */
TEST(random_mutations_never_crash_and_errors_are_complete)
{
    uint64_t st = sd_test_seed();
    const char *base = C(",\"max_tokens\":5,\"stop\":[\"a\"],\"temperature\":0.7,\"stream\":true,"
                         "\"stream_options\":{\"include_usage\":true}");
    size_t n = strlen(base);
    char *buf = malloc(n + 1);
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, n + 1);
        int muts = 1 + (int)sd_test_randf(&st, 0, 4);
        for (int k = 0; k < muts; k++) {
            size_t at = (size_t)sd_test_randf(&st, 0, (float)n);
            buf[at] = (char)(int)sd_test_randf(&st, 1, 127);
        }
        size_t len = (size_t)sd_test_randf(&st, 0, (float)n + 1);
        sd_oai_request r;
        sd_api_error e;
        memset(&e, 0, sizeof e);
        int rc = sd_oai_parse(it & 1 ? SD_OAI_CHAT : SD_OAI_COMPLETIONS, buf, len, MODEL, NULL, &r, &e);
        if (rc) {
            ASSERT_MSG(e.status == 400 && e.message[0] && e.type, "%.*s", (int)len, buf);
        } else {
            ASSERT(r.model && (r.kind == SD_OAI_CHAT ? r.n_msgs > 0 : 1));
            sd_oai_request_free(&r);
        }
    }
    free(buf);
}

static json_t *load(const sd_buf *b)
{
    json_error_t je;
    json_t *v = json_loadb(b->p, b->len, 0, &je);
    if (!v)
        fprintf(stderr, "  not JSON: %s: %.*s\n", je.text, (int)b->len, b->p);
    return v;
}

TEST(error_json_has_openai_shape)
{
    sd_api_error e;
    sd_api_error_set(&e, 400, "top_p", "invalid_value", "top_p: %g is out of range", 3.0);
    sd_buf b = {0};
    ASSERT_OK(sd_api_error_json(&b, &e));
    json_t *v = load(&b);
    ASSERT(v);
    json_t *err = json_object_get(v, "error");
    ASSERT(json_is_object(err));
    ASSERT_STR_EQ(json_string_value(json_object_get(err, "message")), "top_p: 3 is out of range");
    ASSERT_STR_EQ(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    ASSERT_STR_EQ(json_string_value(json_object_get(err, "param")), "top_p");
    ASSERT_STR_EQ(json_string_value(json_object_get(err, "code")), "invalid_value");
    json_decref(v);
    sd_buf_clear(&b);
    sd_api_error_set(&e, 503, NULL, NULL, "queue full");
    ASSERT_OK(sd_api_error_json(&b, &e));
    v = load(&b);
    err = json_object_get(v, "error");
    ASSERT(json_is_null(json_object_get(err, "param")));
    ASSERT(json_is_null(json_object_get(err, "code")));
    ASSERT_STR_EQ(json_string_value(json_object_get(err, "type")), "server_error");
    json_decref(v);
    sd_buf_free(&b);
}

/* Through the engine's schema cache, a request's schema is compiled once to
 * check it and found there by the engine's look-up (and the next request's
 * check); a forced tool call's schema the same; a refused one is not kept. */
TEST(schemas_are_checked_through_the_cache_the_engine_reads)
{
    sd_schema_cache *c = NULL;
    ASSERT_OK(sd_schema_cache_create(&c, 4));
    const char *body = "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"response_format\":{\"type\":"
                       "\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"boolean\"}}}}";
    const char *forced = "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[{\"type\":\"function\","
                         "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
                         "\"tool_choice\":\"required\"}";
    const char *bad = "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"response_format\":{\"type\":"
                      "\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"pattern\":\"(?=a)\"}}}}";
    sd_oai_request r;
    sd_api_error e;
    uint64_t compiled, found;
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, c, &r, &e));
        sd_schema_cache_counts(c, &compiled, &found);
        ASSERT_EQ(compiled, 1);
        ASSERT_EQ(found, (uint64_t)i);
        sd_oai_request_free(&r);
    }
    ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, forced, strlen(forced), MODEL, c, &r, &e));
    const sd_jschema *s = NULL;
    sd_err err = {0};
    ASSERT_OK(sd_schema_cache_get(c, r.gen.json_schema, &s, &err)); /* the engine's look-up */
    sd_schema_cache_put(c, s);
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 2);
    ASSERT_EQ(found, 2);
    sd_oai_request_free(&r);
    ASSERT(sd_oai_parse(SD_OAI_CHAT, bad, strlen(bad), MODEL, c, &r, &e) != 0);
    ASSERT_STR_EQ(e.param, "response_format.json_schema.schema");
    ASSERT_OK(sd_oai_parse_tokenize(forced, strlen(forced), MODEL, c, &r, &e));
    sd_oai_request_free(&r);
    sd_schema_cache_counts(c, &compiled, &found);
    ASSERT_EQ(compiled, 2);
    ASSERT_EQ(found, 3);
    sd_schema_cache_free(c);
}

/* sd_oai_force_format: a forced call decodes to the model's own format.
 * For each format, the grammar takes the text its chat template writes a
 * call as (the named tool's, or any tool's and up to 16 with
 * parallel_tool_calls), and that text read by the format's parser gives
 * the call back; a tool whose parameters are not an object schema keeps
 * the bare JSON form; no format, nothing changes. */
static int whole_text(const sd_jschema *s, const char *t)
{
    sd_jschema_state st;
    sd_jschema_init(s, &st);
    return sd_jschema_feed(s, &st, (const unsigned char *)t, strlen(t)) == 0 && sd_jschema_done(s, &st);
}

typedef struct fcalls {
    int n;
    char name[4][32], args[4][128];
} fcalls;

static int fc_emit(void *arg, const char *content, size_t len, const sd_tool_call *call)
{
    fcalls *f = arg;
    if (!call) { /* no content but whitespace */
        for (size_t i = 0; i < len; i++)
            if (!sd_json_ws(content[i]))
                return -1;
        return 0;
    }
    snprintf(f->name[f->n], sizeof f->name[0], "%s", call->name);
    snprintf(f->args[f->n], sizeof f->args[0], "%s", call->arguments);
    f->n++;
    return 0;
}

/* the schema a chat body with tool_choice required is decoded to in
 * Hermes' format (NULL: refused; text: its schema text, or why not) */
static sd_jschema *forced_hermes(const char *body, char *text, size_t cap)
{
    sd_oai_request r;
    sd_api_error e;
    sd_jschema *s = NULL;
    sd_err err = {0};
    if (sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e)) {
        snprintf(text, cap, "parse: %s", e.message);
        return NULL;
    }
    if (sd_oai_force_format(&r, SD_TOOLS_HERMES, &e))
        snprintf(text, cap, "force: %s", e.message);
    else if (snprintf(text, cap, "%s", r.gen.json_schema),
             sd_jschema_compile(r.gen.json_schema, strlen(r.gen.json_schema), &s, &err))
        snprintf(text, cap, "compile: %s", err.msg);
    sd_oai_request_free(&r);
    return s;
}

/* head, then arg and a Hermes call's end, is a whole text of s */
static int call_whole(const sd_jschema *s, const char *head, const char *arg)
{
    char t[512];
    snprintf(t, sizeof t, "%s%s}}\n</tool_call>", head, arg);
    sd_jschema_state st;
    sd_jschema_init(s, &st);
    return sd_jschema_feed(s, &st, (const unsigned char *)t, strlen(t)) == 0 && sd_jschema_done(s, &st);
}

TEST(forced_calls_decode_to_the_models_own_format)
{
    static const char TOOLS[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
        "\"integer\",\"minimum\":1},\"lat\":{\"type\":\"number\",\"minimum\":-90,\"maximum\":90}},"
        "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]";
    static const struct {
        sd_tool_format f;
        const char *text; /* as the template writes the calls */
        int calls, named_ok;
    } cases[] = {
        {SD_TOOLS_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
         "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
         2, 0},
        {SD_TOOLS_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", 1, 1},
        {SD_TOOLS_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", 1, 1},
        {SD_TOOLS_DEEPSEEK3,
         SD_DS_CALLS SD_DS_CALL "function" SD_DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```" SD_DS_CALL_END
         "\n" SD_DS_CALL "function" SD_DS_SEP "get_time\n```json\n{}\n```" SD_DS_CALL_END SD_DS_CALLS_END,
         2, 0},
        {SD_TOOLS_DEEPSEEK31,
         SD_DS_CALLS SD_DS_CALL "get_weather" SD_DS_SEP "{\"city\": \"Oslo\"}" SD_DS_CALL_END SD_DS_CALLS_END, 1, 1},
        {SD_TOOLS_KIMI,
         SD_KIMI_CALLS SD_KIMI_CALL "functions.get_weather:0" SD_KIMI_ARGS "{\"city\": \"Oslo\"}" SD_KIMI_CALL_END
         SD_KIMI_CALL "functions.get_time:1" SD_KIMI_ARGS "{}" SD_KIMI_CALL_END SD_KIMI_CALLS_END,
         2, 0},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        for (int named = 0; named < 2; named++) {
            if (named && !cases[i].named_ok)
                continue;
            char body[2048];
            snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS ",%s,\"tool_choice\":%s}", TOOLS,
                     named ? "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}" : "\"required\"");
            sd_oai_request r;
            sd_api_error e;
            ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e));
            ASSERT_EQ(r.tool_format, SD_TOOLS_NONE); /* the bare JSON until told the format */
            ASSERT_OK(sd_oai_force_format(&r, cases[i].f, &e));
            ASSERT_EQ(r.tool_format, cases[i].f);
            ASSERT(r.gen.json_schema == r.schema_text);
            sd_jschema *s = NULL;
            sd_err err = {0};
            ASSERT_MSG(!sd_jschema_compile(r.gen.json_schema, strlen(r.gen.json_schema), &s, &err), "%s",
                       err.msg);
            ASSERT_EQ(sd_jschema_calls(s), 1);
            ASSERT_EQ(sd_jschema_takes_specials(s), sd_tc_keeps_special(cases[i].f));
            sd_jschema_state st;
            sd_jschema_init(s, &st);
            const size_t n = strlen(cases[i].text);
            ASSERT_MSG(sd_jschema_feed(s, &st, (const unsigned char *)cases[i].text, n) == 0 &&
                           sd_jschema_done(s, &st),
                       "case %zu: %s", i, cases[i].text);
            /* the days' bound (minimum 1) holds; get_time (no parameters) takes {} */
            if (strstr(cases[i].text, "\"days\": 2")) {
                char low[512];
                snprintf(low, sizeof low, "%s", cases[i].text);
                char *d = strstr(low, "\"days\": 2") + 8;
                *d = '0';
                sd_jschema_state lo;
                sd_jschema_init(s, &lo);
                ASSERT(sd_jschema_feed(s, &lo, (const unsigned char *)low, (size_t)(d - low) + 1) != 0);
            }
            fcalls got = {0};
            sd_tc_parser tc;
            sd_tc_init(&tc, cases[i].f, 0, 1, fc_emit, &got);
            ASSERT_OK(sd_tc_feed(&tc, cases[i].text, n));
            ASSERT_OK(sd_tc_end(&tc));
            sd_tc_free(&tc);
            ASSERT_EQ(got.n, cases[i].calls);
            ASSERT_STR_EQ(got.name[0], "get_weather");
            ASSERT_CONTAINS(got.args[0], "\"city\": \"Oslo\"");
            if (named) { /* the named tool only, once */
                ASSERT_STR_EQ(r.forced_name, "get_weather");
                sd_jschema_init(s, &st);
                const char *other = strstr(cases[i].text, "get_weather");
                ASSERT(sd_jschema_feed(s, &st, (const unsigned char *)cases[i].text,
                                       (size_t)(other - cases[i].text) + 4) == 0);
                ASSERT(sd_jschema_feed(s, &st, (const unsigned char *)"t", 1) != 0);
            }
            sd_jschema_free(s);
            sd_oai_request_free(&r);
        }
    }
    /* a number's range holds too (lat within [-90, 90]) */
    {
        char body[2048], text[4096];
        snprintf(body, sizeof body,
                 "{\"model\":\"" MODEL "\"," CHAT_MSGS ",%s,\"tool_choice\":\"required\"}", TOOLS);
        sd_jschema *s = forced_hermes(body, text, sizeof text);
        ASSERT_MSG(s, "%s", text);
        static const char head[] =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"lat\": ";
        static const char *const lats[] = {"-45.25", "90", "90.5", "-91"};
        for (int i = 0; i < 4; i++)
            ASSERT_MSG(call_whole(s, head, lats[i]) == (i < 2), "lat %s", lats[i]);
        sd_jschema_free(s);
    }
    /* a tuple's positions lose what json_schema does not take (a pattern
     * with a lookahead) and keep the rest */
    {
        static const char body[] =
            "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{"
            "\"name\":\"at\",\"parameters\":{\"type\":\"object\",\"properties\":{\"pt\":{\"type\":"
            "\"array\",\"prefixItems\":[{\"type\":\"string\",\"pattern\":\"^(?=a)\"},{\"type\":\"integer\"}],"
            "\"items\":false}},\"required\":[\"pt\"]}}}],\"tool_choice\":\"required\"}";
        char text[4096];
        sd_jschema *s = forced_hermes(body, text, sizeof text);
        ASSERT_MSG(s, "%s", text);
        ASSERT(!strstr(text, "pattern"));
        static const char head[] = "<tool_call>\n{\"name\": \"at\", \"arguments\": {\"pt\": ";
        static const char *const pts[] = {"[\"b\", 2]", "[2, \"b\"]", "[\"b\", 2, 3]"};
        for (int i = 0; i < 3; i++)
            ASSERT_MSG(call_whole(s, head, pts[i]) == (i == 0), "pt %s", pts[i]);
        sd_jschema_free(s);
    }
    /* strings' patterns json_schema takes hold, with their lengths, and
     * integers' multiples; a number's multiple and a pattern outside the
     * subset (or that no string of the lengths matches) are dropped */
    {
        static const char body[] =
            "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{"
            "\"name\":\"book\",\"parameters\":{\"type\":\"object\",\"properties\":{"
            "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d+$\",\"maxLength\":6},"
            "\"n\":{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":0,\"maximum\":20},"
            "\"w\":{\"type\":\"number\",\"multipleOf\":0.5},"
            "\"tag\":{\"type\":\"string\",\"pattern\":\"\\\\bx\"},"
            "\"id\":{\"type\":\"string\",\"pattern\":\"^a{9}$\",\"maxLength\":3}},"
            "\"required\":[\"code\"]}}}],\"tool_choice\":\"required\"}";
        char text[4096];
        sd_jschema *s = forced_hermes(body, text, sizeof text);
        ASSERT_MSG(s, "%s", text);
        ASSERT_CONTAINS(text, "\"pattern\":\"^[A-Z]{3}-\\\\d+$\"");
        ASSERT_CONTAINS(text, "\"multipleOf\":5");
        ASSERT(!strstr(text, "0.5") && !strstr(text, "\\\\bx") && !strstr(text, "a{9}"));
        static const char head[] = "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"code\": ";
        static const struct {
            const char *arg;
            int ok;
        } args[] = {
            {"\"ABC-12\"", 1},
            {"\"ABC-123\"", 0}, /* maxLength 6 */
            {"\"AB-12\"", 0},
            {"\"ABC-\"", 0},
            {"\"ABC-1\", \"n\": 15", 1},
            {"\"ABC-1\", \"n\": 12", 0},
            {"\"ABC-1\", \"n\": 25", 0},
            {"\"ABC-1\", \"n\": 10, \"w\": 0.3, \"tag\": \"y\", \"id\": \"b\"", 1},
        };
        for (size_t i = 0; i < SD_ARRAY_LEN(args); i++)
            ASSERT_MSG(call_whole(s, head, args[i].arg) == args[i].ok, "code %s", args[i].arg);
        /* the pattern cuts the text off at the byte: "AB" then a digit */
        char t[256];
        snprintf(t, sizeof t, "%s\"AB1", head);
        sd_jschema_state st;
        sd_jschema_init(s, &st);
        ASSERT_OK(sd_jschema_feed(s, &st, (const unsigned char *)t, strlen(t) - 1));
        ASSERT(sd_jschema_feed(s, &st, (const unsigned char *)"1", 1) != 0);
        sd_jschema_free(s);
    }
    /* no parallel calls: one call, then the end */
    {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"model\":\"" MODEL "\"," CHAT_MSGS ",%s,\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
                 TOOLS);
        sd_oai_request r;
        sd_api_error e;
        ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e));
        ASSERT_OK(sd_oai_force_format(&r, SD_TOOLS_HERMES, &e));
        sd_jschema *s = NULL;
        ASSERT_OK(sd_jschema_compile(r.gen.json_schema, strlen(r.gen.json_schema), &s, NULL));
        ASSERT(!whole_text(s, cases[0].text));
        ASSERT(whole_text(s, cases[1].text));
        sd_jschema_free(s);
        sd_oai_request_free(&r);
    }
    /* a tool whose parameters are not an object schema: the bare JSON stays */
    {
        const char *body = "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
                           "{\"name\":\"f\",\"parameters\":{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"null\"}]}}}],"
                           "\"tool_choice\":\"required\"}";
        sd_oai_request r;
        sd_api_error e;
        ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e));
        char *bare = strdup(r.gen.json_schema);
        ASSERT_OK(sd_oai_force_format(&r, SD_TOOLS_HERMES, &e));
        ASSERT_EQ(r.tool_format, SD_TOOLS_NONE);
        ASSERT_STR_EQ(r.gen.json_schema, bare);
        ASSERT_OK(sd_oai_force_format(&r, SD_TOOLS_NONE, &e)); /* no format: nothing */
        ASSERT_STR_EQ(r.gen.json_schema, bare);
        free(bare);
        sd_oai_request_free(&r);
    }
}

/* sd_oai_json_after: a reply that begins inside the model's reasoning keeps
 * its schema for the text after </think> (response_format json_schema, a
 * forced call in the model's format, json_object's any object); none:
 * nothing changes */
TEST(json_constraints_hold_after_the_reasoning_a_prompt_opens)
{
    static const struct {
        const char *extra, *reply;
    } cases[] = {
        {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}",
         "</thi</think>{\"a\":2}"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
         "\"object\"}}}],\"tool_choice\":\"required\"",
         "think</think><tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"},
        {",\"response_format\":{\"type\":\"json_object\"}",
         "a {\"b\": 1}</think>{\"any\":[1,{\"keys\":null}],\"x\":\"y\"}"},
    };
    for (size_t i = 0; i < SD_ARRAY_LEN(cases); i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"" MODEL "\"," CHAT_MSGS "%s}", cases[i].extra);
        sd_oai_request r;
        sd_api_error e;
        ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e));
        if (r.tool_forced)
            ASSERT_OK(sd_oai_force_format(&r, SD_TOOLS_HERMES, &e));
        ASSERT_OK(sd_oai_json_after(&r, NULL, "</think>", 0, &e));
        ASSERT(!r.gen.json_object && r.gen.json_schema);
        sd_jschema *s = NULL;
        sd_err err = {0};
        ASSERT_MSG(!sd_jschema_compile(r.gen.json_schema, strlen(r.gen.json_schema), &s, &err), "%s", err.msg);
        ASSERT_MSG(whole_text(s, cases[i].reply), "case %zu: %s", i, r.gen.json_schema);
        const char *close = strstr(cases[i].reply, "</think>");
        char no_reasoning[256], opened[512];
        snprintf(no_reasoning, sizeof no_reasoning, "%s", close + 8); /* the reply without it */
        ASSERT(!whole_text(s, no_reasoning));
        sd_jschema_free(s);
        sd_oai_request_free(&r);
        /* a model that may open its reasoning (Qwen3): with <think> or without */
        ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, body, strlen(body), MODEL, NULL, &r, &e));
        if (r.tool_forced)
            ASSERT_OK(sd_oai_force_format(&r, SD_TOOLS_HERMES, &e));
        ASSERT_OK(sd_oai_json_after(&r, "<think>", "</think>", 0, &e));
        ASSERT_OK(sd_jschema_compile(r.gen.json_schema, strlen(r.gen.json_schema), &s, NULL));
        snprintf(opened, sizeof opened, "<think>%s", cases[i].reply);
        ASSERT(whole_text(s, opened));
        ASSERT(whole_text(s, no_reasoning));
        ASSERT(!whole_text(s, cases[i].reply)); /* reasoning not opened */
        sd_jschema_free(s);
        sd_oai_request_free(&r);
    }
    const char *unchanged = "{\"model\":\"" MODEL "\"," CHAT_MSGS "}";
    sd_oai_request r;
    sd_api_error e;
    ASSERT_OK(sd_oai_parse(SD_OAI_CHAT, unchanged, strlen(unchanged), MODEL, NULL, &r, &e));
    ASSERT_OK(sd_oai_json_after(&r, NULL, "</think>", 0, &e));
    ASSERT(!r.gen.json_schema && !r.gen.json_object);
    sd_oai_request_free(&r);
}

/* A name cut to fit the error (an unrecognized key of multibyte characters)
 * may end inside a character: param and message stay valid JSON strings. */
TEST(error_json_of_a_cut_multibyte_key_is_valid)
{
    const char *body = "{\"model\":\"m\",\"prompt\":\"x\",\"\u2581begin\uff5c>function<<|tool_call_argument_begin|>"
                       "\uff5ctool\u2581sep\uff5c>\": {}}";
    sd_oai_request r;
    sd_api_error e;
    ASSERT(sd_oai_parse(SD_OAI_COMPLETIONS, body, strlen(body), "m", NULL, &r, &e) != 0);
    ASSERT_STR_EQ(e.code, "unrecognized_argument");
    sd_buf b = {0};
    ASSERT_OK(sd_api_error_json(&b, &e));
    json_t *v = load(&b);
    ASSERT(v);
    json_t *err = json_object_get(v, "error");
    const char *param = json_string_value(json_object_get(err, "param"));
    ASSERT(param && !strncmp(param, "\xe2\x96\x81" "begin", 8));
    ASSERT(json_is_string(json_object_get(err, "message")));
    json_decref(v);
    sd_buf_free(&b);
}

static sd_req_stats sample_stats(void)
{
    sd_req_stats st;
    memset(&st, 0, sizeof st);
    st.prompt_tokens = 11;
    st.completion_tokens = 7;
    st.spec.steps = 4;
    st.spec.drafted = 12;
    st.spec.accepted = 6;
    st.spec.emitted = 10;
    st.spec.proposed_at[0] = 4;
    st.spec.proposed_at[1] = 4;
    st.spec.proposed_at[2] = 4;
    st.spec.accepted_at[0] = 3;
    st.spec.accepted_at[1] = 2;
    st.spec.accepted_at[2] = 1;
    return st;
}

/* a whole response of one choice */
static int one(sd_buf *b, const sd_oai_meta *m, const char *text, size_t len, const char *rs,
               size_t rlen, const sd_tool_call *calls, int n_calls, sd_finish why,
               const sd_req_stats *st)
{
    sd_oai_choice c = {text, len, rs, rlen, calls, n_calls, why, NULL};
    return sd_oai_response(b, m, &c, 1, st);
}

TEST(chat_response_carries_usage_and_speculative_extension)
{
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-1", 1700000000, MODEL, 0};
    sd_buf b = {0};
    ASSERT_OK(one(&b, &m, "Hello \"w\"\n", 10, NULL, 0, NULL, 0, SD_FINISH_LENGTH, &st));
    json_t *v = load(&b);
    ASSERT(v);
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "object")), "chat.completion");
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "id")), "chatcmpl-1");
    ASSERT_EQ(json_integer_value(json_object_get(v, "created")), 1700000000);
    json_t *c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(c, "message"), "content")),
                  "Hello \"w\"\n");
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(c, "message"), "role")),
                  "assistant");
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_t *u = json_object_get(v, "usage");
    ASSERT_EQ(json_integer_value(json_object_get(u, "prompt_tokens")), 11);
    ASSERT_EQ(json_integer_value(json_object_get(u, "completion_tokens")), 7);
    ASSERT_EQ(json_integer_value(json_object_get(u, "total_tokens")), 18);
    json_t *sp = json_object_get(u, "speculative");
    ASSERT_EQ(json_integer_value(json_object_get(sp, "accepted_tokens")), 6);
    ASSERT_NEAR(json_real_value(json_object_get(sp, "acceptance_rate")), 0.5, 1e-12);
    ASSERT_NEAR(json_real_value(json_object_get(sp, "mean_accepted_length")), 2.5, 1e-12);
    json_t *pos = json_object_get(sp, "acceptance_by_position");
    ASSERT_EQ(json_array_size(pos), 3);
    ASSERT_NEAR(json_real_value(json_array_get(pos, 0)), 0.75, 1e-12);
    ASSERT_NEAR(json_real_value(json_array_get(pos, 2)), 0.25, 1e-12);
    json_decref(v);
    sd_buf_free(&b);
}

/* --reasoning-parser: reasoning_content beside content (null when the reply
 * had none; absent without the parser); streamed as its own deltas */
TEST(reasoning_content_in_responses_and_stream_chunks)
{
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-3", 1700000000, MODEL, 0};
    sd_buf b = {0};
    ASSERT_OK(one(&b, &m, "4.", 2, "2 + 2 \"is\"", 10, NULL, 0, SD_FINISH_STOP, &st));
    json_t *v = load(&b);
    json_t *msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    ASSERT_STR_EQ(json_string_value(json_object_get(msg, "reasoning_content")), "2 + 2 \"is\"");
    ASSERT_STR_EQ(json_string_value(json_object_get(msg, "content")), "4.");
    json_decref(v);
    sd_buf_free(&b);
    ASSERT_OK(one(&b, &m, "hi", 2, "", 0, NULL, 0, SD_FINISH_STOP, &st));
    v = load(&b);
    msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    ASSERT(json_is_null(json_object_get(msg, "reasoning_content")));
    json_decref(v);
    sd_buf_free(&b);
    char w[] = "f", wa[] = "{}";
    sd_tool_call calls[] = {{"call_a", w, wa}};
    ASSERT_OK(one(&b, &m, "", 0, "use f", 5, calls, 1, SD_FINISH_STOP, &st));
    v = load(&b);
    msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    ASSERT_STR_EQ(json_string_value(json_object_get(msg, "reasoning_content")), "use f");
    ASSERT_EQ(json_array_size(json_object_get(msg, "tool_calls")), 1);
    json_decref(v);
    sd_buf_free(&b);
    ASSERT_OK(sd_oai_reasoning_event(&b, &m, "step\n1", 6));
    ASSERT(b.len > 6 && !strncmp(b.p, "data: ", 6));
    json_error_t je;
    v = json_loadb(b.p + 6, b.len - 6 - 2, 0, &je);
    ASSERT(v);
    json_t *c = json_array_get(json_object_get(v, "choices"), 0), *d = json_object_get(c, "delta");
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "object")), "chat.completion.chunk");
    ASSERT_STR_EQ(json_string_value(json_object_get(d, "reasoning_content")), "step\n1");
    ASSERT(!json_object_get(d, "content"));
    ASSERT(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(v);
    sd_buf_free(&b);
}

/* The model's tool calls: content null when it said nothing else, tool_calls
 * with the arguments as a string, finish_reason tool_calls; streamed as one
 * delta a call with its index, and a last chunk with finish_reason tool_calls. */
TEST(tool_calls_in_responses_and_stream_chunks)
{
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-2", 1700000000, MODEL, 0};
    char w[] = "get_weather", wa[] = "{\"city\": \"Paris\"}", f[] = "f", fa[] = "{}";
    sd_tool_call calls[] = {{"call_a", w, wa}, {"call_b", f, fa}};
    sd_buf b = {0};
    ASSERT_OK(one(&b, &m, "", 0, NULL, 0, calls, 2, SD_FINISH_STOP, &st));
    json_t *v = load(&b);
    ASSERT(v);
    json_t *c = json_array_get(json_object_get(v, "choices"), 0), *msg = json_object_get(c, "message");
    ASSERT(json_is_null(json_object_get(msg, "content")));
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    json_t *tc = json_object_get(msg, "tool_calls");
    ASSERT_EQ(json_array_size(tc), 2);
    json_t *c0 = json_array_get(tc, 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(c0, "id")), "call_a");
    ASSERT_STR_EQ(json_string_value(json_object_get(c0, "type")), "function");
    ASSERT(!json_object_get(c0, "index"));
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")),
                  "{\"city\": \"Paris\"}");
    json_decref(v);
    sd_buf_free(&b);
    /* text beside the calls stays; no calls: a plain message and its own finish */
    ASSERT_OK(one(&b, &m, "On it.", 6, NULL, 0, calls, 1, SD_FINISH_STOP, &st));
    v = load(&b);
    msg = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "message");
    ASSERT_STR_EQ(json_string_value(json_object_get(msg, "content")), "On it.");
    json_decref(v);
    sd_buf_free(&b);
    ASSERT_OK(one(&b, &m, "", 0, NULL, 0, calls, 0, SD_FINISH_LENGTH, &st));
    v = load(&b);
    c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "");
    ASSERT(!json_object_get(json_object_get(c, "message"), "tool_calls"));
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_decref(v);
    sd_buf_free(&b);
    /* the stream's chunks */
    ASSERT_OK(sd_oai_tool_call_event(&b, &m, 1, &calls[1]));
    ASSERT(!strncmp(b.p, "data: ", 6) && b.p[b.len - 1] == '\n' && b.p[b.len - 2] == '\n');
    json_error_t je;
    v = json_loadb(b.p + 6, b.len - 8, 0, &je);
    ASSERT(v);
    c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT(json_is_null(json_object_get(c, "finish_reason")));
    json_t *d0 = json_array_get(json_object_get(json_object_get(c, "delta"), "tool_calls"), 0);
    ASSERT_EQ(json_integer_value(json_object_get(d0, "index")), 1);
    ASSERT_STR_EQ(json_string_value(json_object_get(d0, "id")), "call_b");
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(d0, "function"), "name")), "f");
    json_decref(v);
    sd_buf_free(&b);
    ASSERT_OK(sd_oai_tool_calls_finish_event(&b, &m));
    v = json_loadb(b.p + 6, b.len - 8, 0, &je);
    ASSERT(v);
    c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    ASSERT_EQ(json_object_size(json_object_get(c, "delta")), 0);
    json_decref(v);
    sd_buf_free(&b);
}

TEST(completion_response_has_text_and_stop_reason)
{
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_COMPLETIONS, "cmpl-9", 5, MODEL, 0};
    sd_buf b = {0};
    ASSERT_OK(one(&b, &m, "xyz", 3, NULL, 0, NULL, 0, SD_FINISH_STOP, &st));
    json_t *v = load(&b);
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "object")), "text_completion");
    json_t *c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "text")), "xyz");
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "stop");
    ASSERT_EQ(json_integer_value(json_object_get(c, "index")), 0);
    json_decref(v);
    sd_buf_free(&b);
}

/* n > 1: one response, its choices indexed in order, each with its own
 * text and finish reason; a stream chunk names its choice */
TEST(n_choices_in_one_response_and_indexed_chunks)
{
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-5", 1, MODEL, 0};
    char w[] = "f", wa[] = "{}";
    sd_tool_call calls[] = {{"call_a", w, wa}};
    sd_oai_choice ch[3] = {{"a", 1, NULL, 0, NULL, 0, SD_FINISH_STOP, NULL},
                           {"bb", 2, NULL, 0, NULL, 0, SD_FINISH_LENGTH, NULL},
                           {"", 0, NULL, 0, calls, 1, SD_FINISH_STOP, NULL}};
    sd_buf b = {0};
    ASSERT_OK(sd_oai_response(&b, &m, ch, 3, &st));
    json_t *v = load(&b);
    json_t *cs = json_object_get(v, "choices");
    ASSERT_EQ(json_array_size(cs), 3);
    static const char *const fin[] = {"stop", "length", "tool_calls"};
    for (int i = 0; i < 3; i++) {
        json_t *c = json_array_get(cs, (size_t)i);
        ASSERT_EQ(json_integer_value(json_object_get(c, "index")), i);
        ASSERT_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), fin[i]);
        ASSERT(json_is_null(json_object_get(c, "logprobs")));
    }
    json_t *msg1 = json_object_get(json_array_get(cs, 1), "message");
    ASSERT_STR_EQ(json_string_value(json_object_get(msg1, "content")), "bb");
    json_t *msg2 = json_object_get(json_array_get(cs, 2), "message");
    ASSERT(json_is_null(json_object_get(msg2, "content")));
    ASSERT_EQ(json_array_size(json_object_get(msg2, "tool_calls")), 1);
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(v, "usage"), "completion_tokens")), 7);
    json_decref(v);
    sd_buf_free(&b);
    /* completions: text per choice */
    sd_oai_meta mc = {SD_OAI_COMPLETIONS, "cmpl-5", 1, MODEL, 0};
    ASSERT_OK(sd_oai_response(&b, &mc, ch, 2, &st));
    v = load(&b);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(v, "choices"), 1),
                                                    "text")),
                  "bb");
    json_decref(v);
    sd_buf_free(&b);
    /* each kind of chunk carries its choice's index */
    m.index = 2;
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 1, "", 0, SD_FINISH_NONE));
    ASSERT_OK(sd_oai_reasoning_event(&b, &m, "r", 1));
    ASSERT_OK(sd_oai_tool_call_event(&b, &m, 0, &calls[0]));
    ASSERT_OK(sd_oai_tool_calls_finish_event(&b, &m));
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 0, "", 0, SD_FINISH_STOP));
    const char *q = b.p;
    int n = 0;
    while ((q = strstr(q, "data: "))) {
        const char *e = strstr(q, "\n\n");
        json_error_t je;
        json_t *c = json_loadb(q + 6, (size_t)(e - q - 6), 0, &je);
        ASSERT(c);
        ASSERT_EQ(json_integer_value(json_object_get(json_array_get(json_object_get(c, "choices"), 0),
                                                     "index")),
                  2);
        json_decref(c);
        q = e;
        n++;
    }
    ASSERT_EQ(n, 5);
    sd_buf_free(&b);
}

TEST(min_tokens_maps_to_gen_params)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"min_tokens\":7"), &r));
    ASSERT_EQ(r.gen.min_tokens, 7);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(""), &r));
    ASSERT_EQ(r.gen.min_tokens, 0);
    sd_oai_request_free(&r);
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"min_tokens\":-1"), "min_tokens", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"min_tokens\":\"2\""), "min_tokens", "invalid_type"));
}

/* response_format: text (nothing), json_object (the mask), json_schema
 * (the schema's compact text, in its key order; no schema: any JSON
 * value); a schema outside the subset, or of the wrong shape, is a 400
 * naming the field */
TEST(response_format_maps_to_gen_params)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"response_format\":{\"type\":\"json_object\"}"), &r));
    ASSERT_EQ(r.gen.json_object, 1);
    ASSERT(r.gen.json_schema == NULL);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"response_format\":{\"type\":\"text\"}"), &r));
    ASSERT_EQ(r.gen.json_object, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT,
                    C(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
                      "\"p\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{"
                      "\"z\":{\"type\":\"integer\"},\"a\":{\"type\":\"string\"}}}}}"),
                    &r));
    ASSERT_EQ(r.gen.json_object, 0);
    ASSERT_STR_EQ(r.gen.json_schema, "{\"type\":\"object\",\"properties\":{\"z\":{\"type\":"
                                     "\"integer\"},\"a\":{\"type\":\"string\"}}}");
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_CHAT, C(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}"),
                    &r));
    ASSERT_STR_EQ(r.gen.json_schema, "{}");
    sd_oai_request_free(&r);
    ASSERT(expect_400(SD_OAI_CHAT,
                      C(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                        "{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}"),
                      "response_format.json_schema.schema", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"response_format\":{\"type\":\"json_schema\"}"),
                      "response_format.json_schema", "invalid_type"));
    ASSERT(expect_400(SD_OAI_CHAT,
                      C(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":3}}"),
                      "response_format.json_schema.schema", NULL));
    ASSERT(expect_400(SD_OAI_CHAT,
                      C(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":3}}"),
                      "response_format.json_schema.name", "invalid_type"));
}

/* presence / frequency penalties and logit_bias into gen params, bounds
 * named by their parameter */
TEST(logits_processors_map_to_gen_params)
{
    sd_oai_request r;
    ASSERT(parse_ok(SD_OAI_CHAT,
                    C(",\"presence_penalty\":0.5,\"frequency_penalty\":-1.25,"
                      "\"logit_bias\":{\"5\":10,\"7\":-100}"),
                    &r));
    ASSERT_NEAR(r.gen.presence_penalty, 0.5, 0);
    ASSERT_NEAR(r.gen.frequency_penalty, -1.25, 0);
    ASSERT_EQ(r.gen.n_bias, 2);
    int at5 = r.gen.bias_ids[0] == 5 ? 0 : 1;
    ASSERT_EQ(r.gen.bias_ids[at5], 5);
    ASSERT_NEAR(r.gen.bias[at5], 10, 0);
    ASSERT_EQ(r.gen.bias_ids[1 - at5], 7);
    ASSERT_NEAR(r.gen.bias[1 - at5], -100, 0);
    sd_oai_request_free(&r);
    ASSERT(parse_ok(SD_OAI_COMPLETIONS, P(",\"logit_bias\":{}"), &r));
    ASSERT_EQ(r.gen.n_bias, 0);
    ASSERT_NEAR(r.gen.presence_penalty, 0, 0);
    sd_oai_request_free(&r);
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"presence_penalty\":2.5"), "presence_penalty",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"logit_bias\":{\"x\":1}"), "logit_bias", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"logit_bias\":{\"-1\":1}"), "logit_bias", "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"logit_bias\":{\"5\":101}"), "logit_bias.5",
                      "invalid_value"));
    ASSERT(expect_400(SD_OAI_CHAT, C(",\"logit_bias\":{\"5\":\"a\"}"), "logit_bias.5",
                      "invalid_type"));
    char big[8192] = "{\"model\":\"" MODEL "\"," CHAT_MSGS ",\"logit_bias\":{";
    for (int i = 0; i <= SD_MAX_LOGIT_BIAS; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"%d\":1", i ? "," : "", i);
    strcat(big, "}}");
    ASSERT(expect_400(SD_OAI_CHAT, big, "logit_bias", "invalid_value"));
}

/* The logprobs objects: chat's content entries (token, logprob, bytes,
 * top_logprobs), completions' parallel arrays and text_offset; -inf as
 * -9999 (JSON has no infinity) */
TEST(logprobs_json_in_responses_and_chunks)
{
    sd_tokenizer *tok = NULL;
    sd_err err = {0};
    char *dir = sd_strfmt("%s/models/specd-tiny", sd_test_srcdir());
    if (sd_tok_load(&tok, dir, &err)) {
        free(dir);
        printf("skip: no bundled model (%s)\n", err.msg);
        return;
    }
    free(dir);
    int32_t *ids = NULL;
    int n = 0;
    ASSERT_OK(sd_tok_encode(tok, "def f", 5, 0, &ids, &n, &err));
    ASSERT(n >= 2);
    sd_token_logprob lp[2] = {{-0.5f, 2, {ids[0], ids[1]}, {-0.5f, -1.5f}},
                              {-INFINITY, 1, {ids[0]}, {-0.25f}}};
    size_t off = 7;
    sd_oai_logprobs L = {tok, 2, ids, lp, 2, NULL};
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-8", 1, MODEL, 0};
    sd_oai_choice ch = {"x", 1, NULL, 0, NULL, 0, SD_FINISH_STOP, &L};
    sd_buf b = {0};
    ASSERT_OK(sd_oai_response(&b, &m, &ch, 1, &st));
    json_t *v = load(&b);
    json_t *c = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(v, "choices"), 0),
                                                               "logprobs"),
                                               "content"),
                               0);
    size_t len0;
    const char *t0 = sd_tok_token_str(tok, ids[0], &len0);
    (void)t0;
    char *text = NULL;
    size_t tl = 0;
    ASSERT_OK(sd_tok_decode(tok, ids, 1, 0, &text, &tl, &err));
    ASSERT_STR_EQ(json_string_value(json_object_get(c, "token")), text);
    ASSERT_NEAR(json_real_value(json_object_get(c, "logprob")), -0.5, 1e-6);
    ASSERT_EQ(json_array_size(json_object_get(c, "bytes")), tl);
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(c, "bytes"), 0)), (unsigned char)text[0]);
    json_t *top = json_object_get(c, "top_logprobs");
    ASSERT_EQ(json_array_size(top), 2);
    ASSERT_NEAR(json_real_value(json_object_get(json_array_get(top, 1), "logprob")), -1.5, 1e-6);
    json_t *c1 = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(v, "choices"), 0),
                                                                "logprobs"),
                                                "content"),
                                1);
    ASSERT_NEAR(json_real_value(json_object_get(c1, "logprob")), -9999.0, 0);
    json_decref(v);
    sd_buf_free(&b);
    /* the bytes of a text's tokens make the text, a character split over
     * tokens too (each piece its raw bytes, as OpenAI gives them) */
    {
        static const char utf[] = "naïve café ✓ 漢字";
        int32_t *u = NULL;
        int nu = 0;
        ASSERT_OK(sd_tok_encode(tok, utf, strlen(utf), 0, &u, &nu, &err));
        sd_token_logprob *ul = calloc((size_t)nu, sizeof *ul);
        ASSERT(ul);
        sd_oai_logprobs U = {tok, 0, u, ul, nu, NULL};
        sd_oai_choice uc = {utf, strlen(utf), NULL, 0, NULL, 0, SD_FINISH_STOP, &U};
        ASSERT_OK(sd_oai_response(&b, &m, &uc, 1, &st));
        v = load(&b);
        json_t *content = json_object_get(
            json_object_get(json_array_get(json_object_get(v, "choices"), 0), "logprobs"), "content");
        ASSERT_EQ(json_array_size(content), (size_t)nu);
        char got[256];
        size_t gl = 0;
        for (int i = 0; i < nu; i++) {
            json_t *by = json_object_get(json_array_get(content, (size_t)i), "bytes");
            for (size_t k = 0; k < json_array_size(by) && gl < sizeof got; k++)
                got[gl++] = (char)json_integer_value(json_array_get(by, k));
        }
        ASSERT_EQ(gl, strlen(utf));
        ASSERT(memcmp(got, utf, gl) == 0);
        json_decref(v);
        sd_buf_free(&b);
        free(ul);
        free(u);
    }
    /* completions: parallel arrays, text_offset from the offset on */
    sd_oai_meta mc = {SD_OAI_COMPLETIONS, "cmpl-8", 1, MODEL, 0};
    L.offset = &off;
    ASSERT_OK(sd_oai_chunk_event_lp(&b, &mc, 0, "x", 1, SD_FINISH_NONE, &L));
    json_error_t je;
    v = json_loadb(b.p + 6, b.len - 8, 0, &je);
    ASSERT(v);
    json_t *lo = json_object_get(json_array_get(json_object_get(v, "choices"), 0), "logprobs");
    ASSERT_EQ(json_array_size(json_object_get(lo, "tokens")), 2);
    ASSERT_STR_EQ(json_string_value(json_array_get(json_object_get(lo, "tokens"), 0)), text);
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(lo, "text_offset"), 0)), 7);
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(lo, "text_offset"), 1)), 7 + (json_int_t)tl);
    ASSERT_EQ(json_object_size(json_array_get(json_object_get(lo, "top_logprobs"), 0)), 2);
    ASSERT_NEAR(json_real_value(json_object_get(json_array_get(json_object_get(lo, "top_logprobs"), 0), text)),
                -0.5, 1e-6);
    json_decref(v);
    sd_buf_free(&b);
    /* a chat chunk of no text carries them alone: an empty delta */
    ASSERT_OK(sd_oai_chunk_event_lp(&b, &m, 0, "", 0, SD_FINISH_NONE, &L));
    v = json_loadb(b.p + 6, b.len - 8, 0, &je);
    c = json_array_get(json_object_get(v, "choices"), 0);
    ASSERT_EQ(json_object_size(json_object_get(c, "delta")), 0);
    ASSERT_EQ(json_array_size(json_object_get(json_object_get(c, "logprobs"), "content")), 2);
    json_decref(v);
    sd_buf_free(&b);
    free(text);
    free(ids);
    sd_tok_free(tok);
}

/* Splits SSE text into events; each must be exactly `data: X\n\n`. */
static int sse_events(const char *s, size_t len, char ev[][2048], int max)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        if (len - i < 6 || memcmp(s + i, "data: ", 6) != 0)
            return -1;
        const char *end = strstr(s + i, "\n\n");
        if (!end || n == max)
            return -1;
        size_t l = (size_t)(end - (s + i + 6));
        if (memchr(s + i + 6, '\n', l) || l >= 2048)
            return -1;
        memcpy(ev[n], s + i + 6, l);
        ev[n][l] = 0;
        n++;
        i = (size_t)(end - s) + 2;
    }
    return n;
}

TEST(chat_stream_chunks_frame_as_openai_sse)
{
    sd_oai_meta m = {SD_OAI_CHAT, "chatcmpl-7", 42, MODEL, 0};
    sd_req_stats st = sample_stats();
    sd_buf b = {0};
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 1, "", 0, SD_FINISH_NONE));
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 0, "line1\nline2", 11, SD_FINISH_NONE));
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 0, "", 0, SD_FINISH_STOP));
    ASSERT_OK(sd_oai_usage_event(&b, &m, &st));
    ASSERT_OK(sd_sse_done(&b));
    static char ev[8][2048];
    int n = sse_events(b.p, b.len, ev, 8);
    ASSERT_EQ(n, 5);
    json_error_t je;
    json_t *c0 = json_loads(ev[0], 0, &je);
    json_t *d0 = json_object_get(json_array_get(json_object_get(c0, "choices"), 0), "delta");
    ASSERT_STR_EQ(json_string_value(json_object_get(c0, "object")), "chat.completion.chunk");
    ASSERT_STR_EQ(json_string_value(json_object_get(d0, "role")), "assistant");
    ASSERT_STR_EQ(json_string_value(json_object_get(d0, "content")), "");
    json_t *c1 = json_loads(ev[1], 0, &je);
    json_t *ch1 = json_array_get(json_object_get(c1, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_object_get(ch1, "delta"), "content")),
                  "line1\nline2");
    ASSERT(json_object_get(json_object_get(ch1, "delta"), "role") == NULL);
    ASSERT(json_is_null(json_object_get(ch1, "finish_reason")));
    json_t *c2 = json_loads(ev[2], 0, &je);
    json_t *ch2 = json_array_get(json_object_get(c2, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(ch2, "finish_reason")), "stop");
    ASSERT_EQ(json_object_size(json_object_get(ch2, "delta")), 0);
    json_t *c3 = json_loads(ev[3], 0, &je);
    ASSERT_EQ(json_array_size(json_object_get(c3, "choices")), 0);
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(c3, "usage"), "total_tokens")),
              18);
    ASSERT_STR_EQ(ev[4], "[DONE]");
    /* every chunk of one request carries the same id and created */
    ASSERT_STR_EQ(json_string_value(json_object_get(c3, "id")), "chatcmpl-7");
    ASSERT_EQ(json_integer_value(json_object_get(c2, "created")), 42);
    json_decref(c0);
    json_decref(c1);
    json_decref(c2);
    json_decref(c3);
    sd_buf_free(&b);
}

TEST(completion_stream_chunks_are_text_completions)
{
    sd_oai_meta m = {SD_OAI_COMPLETIONS, "cmpl-3", 1, MODEL, 0};
    sd_buf b = {0};
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 1, "ab", 2, SD_FINISH_NONE));
    ASSERT_OK(sd_oai_chunk_event(&b, &m, 0, "", 0, SD_FINISH_LENGTH));
    static char ev[4][2048];
    ASSERT_EQ(sse_events(b.p, b.len, ev, 4), 2);
    json_error_t je;
    json_t *c0 = json_loads(ev[0], 0, &je);
    json_t *ch = json_array_get(json_object_get(c0, "choices"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(c0, "object")), "text_completion");
    ASSERT_STR_EQ(json_string_value(json_object_get(ch, "text")), "ab");
    json_t *c1 = json_loads(ev[1], 0, &je);
    ASSERT_STR_EQ(json_string_value(json_object_get(
                      json_array_get(json_object_get(c1, "choices"), 0), "finish_reason")),
                  "length");
    json_decref(c0);
    json_decref(c1);
    sd_buf_free(&b);
}

TEST(sse_refuses_payloads_that_would_split_an_event)
{
    sd_buf b = {0};
    ASSERT_EQ(sd_sse_event(&b, "{\"a\":\n1}", 8), SD_EINVAL);
    ASSERT_EQ(sd_sse_event(&b, "x\ry", 3), SD_EINVAL);
    ASSERT_OK(sd_sse_event(&b, "{}", 2));
    ASSERT_STR_EQ(b.p, "data: {}\n\n");
    sd_api_error e;
    sd_api_error_set(&e, 500, NULL, "engine_error", "boom");
    ASSERT_OK(sd_sse_error(&b, &e));
    ASSERT_CONTAINS(b.p, "\"error\":{\"message\":\"boom\"");
    sd_buf_free(&b);
}

TEST(invalid_utf8_becomes_replacement_characters)
{
    sd_buf b = {0};
    /* a lone continuation byte, a truncated 3-byte sequence, an overlong, a surrogate */
    const char in[] = "a\x80" "b\xe2\x82" "c\xc0\xaf" "d\xed\xa0\x80" "e\xf0\x9f\x98\x80";
    ASSERT_OK(sd_utf8_sanitize(&b, in, sizeof in - 1));
    ASSERT_STR_EQ(b.p, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd"
                       "d\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "e\xf0\x9f\x98\x80");
    sd_buf_free(&b);
    /* a response over invalid bytes is still valid JSON */
    sd_req_stats st = sample_stats();
    sd_oai_meta m = {SD_OAI_COMPLETIONS, "cmpl-1", 1, MODEL, 0};
    ASSERT_OK(one(&b, &m, "x\xff", 2, NULL, 0, NULL, 0, SD_FINISH_STOP, &st));
    json_t *v = load(&b);
    ASSERT(v);
    ASSERT_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(v, "choices"), 0),
                                                    "text")),
                  "x\xef\xbf\xbd");
    json_decref(v);
    sd_buf_free(&b);
}

TEST(models_list_names_the_served_model)
{
    sd_buf b = {0};
    ASSERT_OK(sd_oai_models(&b, MODEL, 123, 2048));
    json_t *v = load(&b);
    ASSERT_STR_EQ(json_string_value(json_object_get(v, "object")), "list");
    json_t *m = json_array_get(json_object_get(v, "data"), 0);
    ASSERT_STR_EQ(json_string_value(json_object_get(m, "id")), MODEL);
    ASSERT_STR_EQ(json_string_value(json_object_get(m, "object")), "model");
    ASSERT_EQ(json_integer_value(json_object_get(m, "max_model_len")), 2048);
    json_decref(v);
    sd_buf_free(&b);
}

TEST(buf_grows_consumes_and_hands_over)
{
    sd_buf b = {0};
    for (int i = 0; i < 1000; i++)
        ASSERT_OK(sd_buf_printf(&b, "%d,", i));
    ASSERT_EQ(b.len, 3890);
    ASSERT(strncmp(b.p, "0,1,2,", 6) == 0);
    sd_buf_consume(&b, 4);
    ASSERT(strncmp(b.p, "2,3,", 4) == 0);
    ASSERT_EQ(b.len, 3886);
    char big[600];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ASSERT_OK(sd_buf_printf(&b, "%s", big));
    ASSERT_EQ(b.len, 3886 + 599);
    size_t n;
    char *p = sd_buf_take(&b, &n);
    ASSERT_EQ(n, 3886 + 599);
    ASSERT_EQ(p[n], 0);
    ASSERT(b.p == NULL && b.len == 0);
    free(p);
}

TEST_MAIN(T(a_full_chat_request_maps_to_gen_params), T(completion_defaults_follow_openai),
          T(prompt_forms_text_single_batch_and_token_ids), T(nul_is_refused_outside_the_prompt),
          T(malformed_json_is_400_without_param),
          T(model_is_required_and_must_be_the_served_one), T(wrong_types_name_the_parameter),
          T(out_of_range_values_name_the_parameter), T(unsupported_options_are_refused_by_name),
          T(unknown_parameters_are_refused_by_name), T(messages_are_validated_one_by_one),
          T(tools_tool_choice_and_tool_messages_are_parsed), T(forced_calls_decode_to_the_models_own_format),
          T(json_constraints_hold_after_the_reasoning_a_prompt_opens), T(chat_template_kwargs_are_the_thinking_switches),
          T(reasoning_content_in_responses_and_stream_chunks), T(tool_calls_in_responses_and_stream_chunks),
          T(prompt_is_validated), T(stop_strings_are_bounded),
          T(context_limit_names_prompt_or_max_tokens),
          T(random_mutations_never_crash_and_errors_are_complete),
          T(error_json_has_openai_shape), T(error_json_of_a_cut_multibyte_key_is_valid), T(schemas_are_checked_through_the_cache_the_engine_reads), T(chat_response_carries_usage_and_speculative_extension),
          T(completion_response_has_text_and_stop_reason), T(n_choices_in_one_response_and_indexed_chunks), T(logprobs_options_map_to_gen_params), T(logits_processors_map_to_gen_params), T(response_format_maps_to_gen_params), T(min_tokens_maps_to_gen_params),
          T(logprobs_json_in_responses_and_chunks),
          T(chat_stream_chunks_frame_as_openai_sse),
          T(completion_stream_chunks_are_text_completions),
          T(sse_refuses_payloads_that_would_split_an_event),
          T(invalid_utf8_becomes_replacement_characters), T(models_list_names_the_served_model),
          T(buf_grows_consumes_and_hands_over))

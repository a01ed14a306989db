/* net/toolcall: tool calls read out of a model's text, whole or in pieces of
 * any size, with nothing the model said lost. */
#include <stdlib.h>
#include <string.h>

#include "net/buf.h"
#include "net/toolcall.h"
#include "test.h"

/* What the parser gave: content and calls in order, as one text: content as
 * is, a call as [name|arguments]. */
typedef struct got {
    sd_buf text, content;
    int n_calls;
    char ids[8][128];
} got;

static int collect(void *arg, const char *content, size_t len, const sd_tool_call *call)
{
    got *g = arg;
    if (!call) {
        sd_buf_append(&g->content, content, len);
        return sd_buf_append(&g->text, content, len);
    }
    if (g->n_calls < 8)
        memcpy(g->ids[g->n_calls], call->id, sizeof call->id);
    g->n_calls++;
    return sd_buf_printf(&g->text, "[%s|%s]", call->name, call->arguments);
}

/* text fed to p (initialized, emitting to g) in pieces of `step` bytes (0:
 * at once), then its end */
static void feed_all(sd_tc_parser *p, const char *text, size_t step)
{
    size_t n = strlen(text);
    if (!step)
        step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        ASSERT_OK(sd_tc_feed(p, text + i, i + step <= n ? step : n - i));
    ASSERT_OK(sd_tc_end(p));
    sd_tc_free(p);
}

static void run_as(sd_tool_format f, const char *text, int max_calls, size_t step, got *g)
{
    memset(g, 0, sizeof *g);
    sd_tc_parser p;
    sd_tc_init(&p, f, max_calls, 42, collect, g);
    feed_all(&p, text, step);
}

static void run(const char *text, int max_calls, size_t step, got *g)
{
    run_as(SD_TOOLS_HERMES, text, max_calls, step, g);
}

static const char *text_of(got *g) { return g->text.p ? g->text.p : ""; }

static void got_free(got *g)
{
    sd_buf_free(&g->text);
    sd_buf_free(&g->content);
}

/* a reply, what the parser must give ([name|arguments] for a call), its calls */
typedef struct tc_case {
    const char *in, *want;
    int calls;
} tc_case;

/* each case fed at once and in pieces of 1.. bytes (every size up to 16, then
 * a sample): the same text and calls */
static void check_cases(sd_tool_format f, const tc_case *cases, size_t n_cases)
{
    for (size_t i = 0; i < n_cases; i++) {
        size_t n = strlen(cases[i].in);
        for (size_t step = 0; step <= n; step += 1 + step / 16) {
            got g;
            run_as(f, cases[i].in, 0, step, &g);
            ASSERT_MSG(!strcmp(text_of(&g), cases[i].want), "case %zu step %zu: got \"%s\"", i, step, text_of(&g));
            ASSERT_EQ(g.n_calls, cases[i].calls);
            got_free(&g);
        }
    }
}

TEST(calls_and_content_come_out_the_same_in_any_pieces)
{
    static const tc_case cases[] = {
        {"plain text, no call", "plain text, no call", 0},
        {"", "", 0},
        /* Qwen's form: text, then calls one per block; the newlines between
         * calls and after the last are not content */
        {"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
         "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"d\": 2.5}}"
         "\n</tool_call>\n",
         "Let me check.\n[get_weather|{\"city\": \"Paris\"}][get_weather|{\"city\": \"Oslo\", \"d\": 2.5}]", 2},
        /* text after a call is content, its whitespace too (found by the
         * request fuzzer: a piece ending before " <tool_call>" lost the space) */
        {"<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\nDone.", "[f|{}]\nDone.", 1},
        {"<tool_call>{\"name\":\"f\"}</tool_call>a <tool_call>{\"name\":\"g\"}</tool_call> \n",
         "[f|{}]a [g|{}]", 2},
        /* arguments as a JSON string, as "parameters", or missing */
        {"<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}</tool_call>", "[f|{\"a\": 1}]", 1},
        {"<tool_call>{\"name\":\"f\",\"parameters\":{\"b\":[1,true,null]}}</tool_call>",
         "[f|{\"b\": [1, true, null]}]", 1},
        {"<tool_call>{\"name\":\"f\"}</tool_call>", "[f|{}]", 1},
        /* not a call: kept as written */
        {"a<tool_call>not json</tool_call>b", "a<tool_call>not json</tool_call>b", 0},
        {"<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>{\"arguments\":{}}</tool_call>", 0},
        {"<tool_call>{\"name\":3}</tool_call>", "<tool_call>{\"name\":3}</tool_call>", 0},
        /* the output ended inside a call: kept as content */
        {"x<tool_call>{\"name\": \"f\", \"argu", "x<tool_call>{\"name\": \"f\", \"argu", 0},
        /* a tag's start that is not a tag */
        {"a <tool_ b <tool_cal", "a <tool_ b <tool_cal", 0},
        {"<tool_call", "<tool_call", 0},
        /* a closing tag alone is text */
        {"</tool_call> x", "</tool_call> x", 0},
        /* unicode in names' arguments survives, printed as json.dumps does */
        {"<tool_call>{\"name\":\"f\",\"arguments\":{\"q\":\"caf\\u00e9 \\n\"}}</tool_call>",
         "[f|{\"q\": \"caf\xc3\xa9 \\n\"}]", 1},
    };
    check_cases(SD_TOOLS_HERMES, cases, sizeof cases / sizeof cases[0]);
}

TEST(parallel_tool_calls_false_keeps_the_first_call_and_ids_differ)
{
    static const char in[] = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n"
                             "<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
    got g;
    run(in, 1, 0, &g);
    ASSERT_STR_EQ(text_of(&g), "[a|{}]");
    ASSERT_EQ(g.n_calls, 1);
    got_free(&g);
    run(in, 0, 3, &g);
    ASSERT_STR_EQ(text_of(&g), "[a|{}][b|{}]");
    ASSERT_EQ(g.n_calls, 2);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(strlen(g.ids[i]), 29);
        ASSERT(!strncmp(g.ids[i], "call_", 5));
        for (int k = 5; k < 29; k++) {
            char c = g.ids[i][k];
            ASSERT((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
        }
    }
    ASSERT(strcmp(g.ids[0], g.ids[1]));
    /* the same key gives the same ids (a reproducible stream) */
    got h;
    run(in, 0, 0, &h);
    ASSERT_STR_EQ(g.ids[1], h.ids[1]);
    got_free(&g);
    got_free(&h);
}

/* An emit callback's failure stops the feed and comes back from it. */
static int refuse(void *arg, const char *content, size_t len, const sd_tool_call *call)
{
    (void)arg;
    (void)content;
    (void)len;
    return call ? -77 : 0;
}

TEST(an_emit_failure_stops_the_feed)
{
    sd_tc_parser p;
    sd_tc_init(&p, SD_TOOLS_HERMES, 0, 1, refuse, NULL);
    static const char in[] = "x<tool_call>{\"name\":\"f\"}</tool_call>";
    ASSERT_EQ(sd_tc_feed(&p, in, sizeof in - 1), -77);
    sd_tc_free(&p);
}

/* Llama 3.1 / 3.2: a reply that is JSON objects {"name", "parameters"} (";"
 * between several) is calls; any other reply is content, whole. */
TEST(llama_json_replies_are_calls_whole_or_content)
{
    static const tc_case cases[] = {
        {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
         "[get_weather|{\"city\": \"Paris\"}]", 1},
        {"\n {\"name\":\"a\",\"parameters\":{}}; {\"name\":\"b\",\"arguments\":{\"x\":1}} \n", "[a|{}][b|{\"x\": 1}]",
         2},
        {"It is sunny.", "It is sunny.", 0},
        {"  \nIt is {\"name\": \"x\"}", "  \nIt is {\"name\": \"x\"}", 0},
        /* JSON but not calls, or calls and then text: content as written */
        {"{\"answer\": 42}", "{\"answer\": 42}", 0},
        {"{\"name\":\"a\",\"parameters\":{}} and more", "{\"name\":\"a\",\"parameters\":{}} and more", 0},
        {"{\"name\":\"a\",\"parameters\":{", "{\"name\":\"a\",\"parameters\":{", 0},
        {"", "", 0},
        {" \n ", " \n ", 0},
    };
    check_cases(SD_TOOLS_JSON, cases, sizeof cases / sizeof cases[0]);
    got g;
    run_as(SD_TOOLS_JSON, "{\"name\":\"a\",\"parameters\":{}};{\"name\":\"b\",\"parameters\":{}}", 1, 0, &g);
    ASSERT_STR_EQ(text_of(&g), "[a|{}]");
    got_free(&g);
    /* more calls than one reply keeps (16, in every format): content, as written */
    for (int f = 0; f < 5; f++) {
        static const sd_tool_format fm[] = {SD_TOOLS_JSON, SD_TOOLS_KIMI, SD_TOOLS_HERMES, SD_TOOLS_DEEPSEEK31,
                                            SD_TOOLS_DEEPSEEK3};
        static const char *const one[] = {"{\"name\":\"a\",\"parameters\":{}};",
                                          "<|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
                                          "<tool_call>{\"name\":\"a\"}</tool_call>",
                                          "<｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
                                          "<｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n{}<｜tool▁call▁end｜>\n"};
        static const char *const sec[][2] = {{"", ""},
                                             {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"},
                                             {"", ""},
                                             {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"},
                                             {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"}};
        sd_buf in = {0};
        sd_buf_puts(&in, sec[f][0]);
        for (int i = 0; i < 17; i++)
            sd_buf_puts(&in, one[f]);
        sd_buf_puts(&in, sec[f][1]);
        run_as(fm[f], in.p, 0, 0, &g);
        /* hermes blocks are one call each: all 17 are calls */
        ASSERT_EQ(g.n_calls, fm[f] == SD_TOOLS_HERMES ? 17 : 0);
        if (fm[f] != SD_TOOLS_HERMES)
            ASSERT_STR_EQ(text_of(&g), in.p);
        got_free(&g);
        sd_buf_free(&in);
    }
}

/* Kimi-K2: a section of calls in special tokens; the ids are the model's
 * (functions.NAME:I), the names read from them. */
TEST(kimi_sections_hold_calls_with_the_models_ids)
{
#define SEC "<|tool_calls_section_begin|>"
#define SEC_END "<|tool_calls_section_end|>"
#define CALL(id, args) "<|tool_call_begin|>" id "<|tool_call_argument_begin|>" args "<|tool_call_end|>"
    static const tc_case cases[] = {
        {"Checking." SEC CALL("functions.get_weather:0", "{\"city\": \"Paris\"}")
             CALL("functions.get_weather:1", "{\"city\":\"Oslo\"}") SEC_END,
         "Checking.[get_weather|{\"city\": \"Paris\"}][get_weather|{\"city\": \"Oslo\"}]", 2},
        {SEC " " CALL(" functions.a.b:12 ", "{}") "\n" SEC_END "\nafter", "[a.b|{}]\nafter", 1},
        {SEC CALL("plain_name", "{}") SEC_END, "[plain_name|{}]", 1},
        /* not calls: the section as written */
        {SEC CALL("functions.f:0", "[1]") SEC_END, SEC CALL("functions.f:0", "[1]") SEC_END, 0},
        {SEC CALL("functions.:0", "{}") SEC_END, SEC CALL("functions.:0", "{}") SEC_END, 0},
        {SEC "junk" SEC_END, SEC "junk" SEC_END, 0},
        /* the output ended inside the section */
        {"x" SEC "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":",
         "x" SEC "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":", 0},
    };
    check_cases(SD_TOOLS_KIMI, cases, sizeof cases / sizeof cases[0]);
    got g; /* the model's ids kept */
    run_as(SD_TOOLS_KIMI, cases[0].in, 0, 5, &g);
    ASSERT(!strcmp(g.ids[0], "functions.get_weather:0") && !strcmp(g.ids[1], "functions.get_weather:1"));
    got_free(&g);
#undef SEC
#undef SEC_END
#undef CALL
}

/* DeepSeek: a section of calls in its tool tokens; V3.1 writes NAME<｜tool▁sep｜>ARGS,
 * V3 / R1 function<｜tool▁sep｜>NAME and the arguments in a json fence, one
 * call a line; ids are made (the model writes none). */
TEST(deepseek_sections_hold_calls_in_either_form)
{
#define SEC "<｜tool▁calls▁begin｜>"
#define SEC_END "<｜tool▁calls▁end｜>"
#define CALL(head, body) "<｜tool▁call▁begin｜>" head "<｜tool▁sep｜>" body "<｜tool▁call▁end｜>"
    static const tc_case v31[] = {
        {"Checking both." SEC CALL("get_weather", "{\"city\": \"Paris\"}") CALL("get_weather", "{\"city\":\"Oslo\"}")
             SEC_END,
         "Checking both.[get_weather|{\"city\": \"Paris\"}][get_weather|{\"city\": \"Oslo\"}]", 2},
        {SEC CALL(" scale ", " {\"x\": 1e-07} ") SEC_END "\n", "[scale|{\"x\": 1e-07}]", 1},
        /* not calls: the section as written */
        {SEC CALL("get weather", "{}") SEC_END, SEC CALL("get weather", "{}") SEC_END, 0},
        {SEC CALL("f", "[1]") SEC_END, SEC CALL("f", "[1]") SEC_END, 0},
        {SEC CALL("", "{}") SEC_END, SEC CALL("", "{}") SEC_END, 0},
        {SEC "text" SEC_END, SEC "text" SEC_END, 0},
        /* the output ended inside the section */
        {"x" SEC "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":", "x" SEC "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":", 0},
        {"no calls at all", "no calls at all", 0},
    };
    check_cases(SD_TOOLS_DEEPSEEK31, v31, sizeof v31 / sizeof v31[0]);
    static const tc_case v3[] = {
        {"Checking." SEC CALL("function", "get_weather\n```json\n{\"city\": \"Paris\"}\n```") "\n"
             CALL("function", "get_weather\n```json\n{\"city\":\"Oslo\"}\n```") SEC_END,
         "Checking.[get_weather|{\"city\": \"Paris\"}][get_weather|{\"city\": \"Oslo\"}]", 2},
        /* a fence without its language, none at all */
        {SEC CALL("function", "f\n```\n{}\n```") CALL("function", " g \n {\"a\": [1, 2.5]} ") SEC_END,
         "[f|{}][g|{\"a\": [1, 2.5]}]", 2},
        /* not calls: an unclosed fence, text after the arguments, no name */
        {SEC CALL("function", "f\n```json\n{}") SEC_END, SEC CALL("function", "f\n```json\n{}") SEC_END, 0},
        {SEC CALL("function", "f\n```json\n{}\n```x") SEC_END, SEC CALL("function", "f\n```json\n{}\n```x") SEC_END,
         0},
        {SEC CALL("function", "\n```json\n{}\n```") SEC_END, SEC CALL("function", "\n```json\n{}\n```") SEC_END, 0},
        {SEC CALL("", "f\n{}") SEC_END, SEC CALL("", "f\n{}") SEC_END, 0},
    };
    check_cases(SD_TOOLS_DEEPSEEK3, v3, sizeof v3 / sizeof v3[0]);
    got g; /* ids made, one each */
    run_as(SD_TOOLS_DEEPSEEK31, v31[0].in, 0, 3, &g);
    ASSERT(!strncmp(g.ids[0], "call_", 5) && strcmp(g.ids[0], g.ids[1]));
    got_free(&g);
#undef SEC
#undef SEC_END
#undef CALL
}

/* a forced call (tool_choice): the reply, whole, is a named function's
 * arguments, or (required) an array of calls; what is not (cut at its
 * length) is content, as written; fed in pieces, the same */
static void run_forced(const char *name, const char *text, int max_calls, size_t step, got *g)
{
    memset(g, 0, sizeof *g);
    sd_tc_parser p;
    sd_tc_init_forced(&p, name, max_calls, 42, collect, g);
    feed_all(&p, text, step);
}

TEST(forced_calls_are_the_whole_reply)
{
    static const struct {
        const char *name, *in, *want;
        int max, calls;
    } cases[] = {
        {"get_weather", "{\"city\":\"Paris\",\"days\":2}", "[get_weather|{\"city\": \"Paris\", \"days\": 2}]", 0, 1},
        {"get_weather", " { } ", "[get_weather|{}]", 0, 1},
        {"get_weather", "{\"city\": \"Par", "{\"city\": \"Par", 0, 0},
        {NULL, "[{\"name\":\"a\",\"parameters\":{\"x\":1}},{\"name\":\"b\",\"parameters\":{}}]",
         "[a|{\"x\": 1}][b|{}]", 0, 2},
        {NULL, "[{\"name\":\"a\",\"parameters\":{\"x\":1}},{\"name\":\"b\",\"parameters\":{}}]",
         "[a|{\"x\": 1}]", 1, 1},
        {NULL, "[]", "[]", 0, 0},
        {NULL, "[{\"name\":\"a\"", "[{\"name\":\"a\"", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t n = strlen(cases[i].in);
        for (size_t step = 0; step <= n; step += 1 + step / 8) {
            got g;
            run_forced(cases[i].name, cases[i].in, cases[i].max, step, &g);
            ASSERT_MSG(!strcmp(text_of(&g), cases[i].want), "case %zu step %zu: got \"%s\"", i, step,
                       text_of(&g));
            ASSERT_EQ(g.n_calls, cases[i].calls);
            if (g.n_calls)
                ASSERT(!strncmp(g.ids[0], "call_", 5));
            got_free(&g);
        }
    }
}

TEST_MAIN(T(forced_calls_are_the_whole_reply), T(calls_and_content_come_out_the_same_in_any_pieces), T(llama_json_replies_are_calls_whole_or_content),
          T(kimi_sections_hold_calls_with_the_models_ids), T(deepseek_sections_hold_calls_in_either_form),
          T(parallel_tool_calls_false_keeps_the_first_call_and_ids_differ), T(an_emit_failure_stops_the_feed))

/* net/reasoning: a reply's reasoning split from its content, whole or in
 * pieces of any size. */
#include <stdlib.h>
#include <string.h>

#include "net/buf.h"
#include "net/reasoning.h"
#include "test.h"

/* what came out: reasoning and content each gathered, and the two in order
 * as one text: reasoning pieces as {text}, content as is */
typedef struct got {
    sd_buf r, c, all;
    int fail_after; /* >0: the emit fails on that call */
    int calls;
} got;

static int collect(void *arg, int reasoning, const char *s, size_t n)
{
    got *g = arg;
    if (!n)
        return 99; /* an empty piece is never emitted (the feed fails) */
    if (g->fail_after && ++g->calls == g->fail_after)
        return 77;
    sd_buf_append(reasoning ? &g->r : &g->c, s, n);
    if (reasoning)
        return sd_buf_printf(&g->all, "{%.*s}", (int)n, s);
    return sd_buf_append(&g->all, s, n);
}

static const char *str(const sd_buf *b) { return b->p ? b->p : ""; }

static void got_free(got *g)
{
    sd_buf_free(&g->r);
    sd_buf_free(&g->c);
    sd_buf_free(&g->all);
}

/* text fed in pieces of `step` bytes (0: at once) */
static void run(const char *text, int in_reasoning, size_t step, got *g)
{
    memset(g, 0, sizeof *g);
    sd_rs_parser p;
    sd_rs_init(&p, in_reasoning, collect, g);
    size_t n = strlen(text);
    if (!step)
        step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        ASSERT_OK(sd_rs_feed(&p, text + i, i + step <= n ? step : n - i));
    ASSERT_OK(sd_rs_end(&p));
    sd_rs_free(&p);
}

TEST(reasoning_and_content_come_out_the_same_in_any_pieces)
{
    static const struct {
        const char *in;
        int in_reasoning;
        const char *reasoning, *content;
    } cases[] = {
        /* Qwen3: the reply opens the reasoning */
        {"<think>\nPlan: add.\n</think>\n\nIt is 4.", 0, "Plan: add.", "It is 4."},
        {"  \n<think>a\n\nb</think>c", 0, "a\n\nb", "c"},
        /* R1: the prompt opened it */
        {"Plan.\n</think>\n\nAnswer.", 1, "Plan.", "Answer."},
        {"\n\nPlan.\n\n</think>Answer.\n\n", 1, "Plan.", "Answer.\n\n"},
        /* no reasoning: all content, as written */
        {"Hello <think> x </think>", 0, "", "Hello <think> x </think>"},
        {"<thin", 0, "", "<thin"},
        {"  \n ", 0, "", "  \n "},
        {"", 0, "", ""},
        /* never closed: reasoning to the end */
        {"<think>\nstill thinking\n", 0, "still thinking", ""},
        {"thinking </thi", 1, "thinking </thi", ""},
        /* after </think>: content, a second <think> with it; a tag in parts */
        {"a</think></think><think>b", 1, "a", "</think><think>b"},
        {"<think></think>\n\n", 0, "", ""},
        {"x\n<\n/think>y", 1, "x\n<\n/think>y", ""},
        /* a few multi-byte characters and newlines inside the reasoning */
        {"\xe6\x80\x9d\xe8\x80\x83\n\n\xc3\xa9\n</think>\n\xf0\x9f\x98\x80", 1, "\xe6\x80\x9d\xe8\x80\x83\n\n\xc3\xa9",
         "\xf0\x9f\x98\x80"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].in);
        for (size_t step = 0; step <= n; step++) {
            got g;
            run(cases[i].in, cases[i].in_reasoning, step, &g);
            ASSERT_MSG(!strcmp(str(&g.r), cases[i].reasoning) && !strcmp(str(&g.c), cases[i].content),
                       "case %zu step %zu: reasoning \"%s\" content \"%s\"", i, step, str(&g.r), str(&g.c));
            got_free(&g);
        }
    }
    /* reasoning goes out as it comes, ahead of the content */
    got g;
    run("<think>abc</think>def", 0, 1, &g);
    ASSERT_STR_EQ(str(&g.all), "{a}{b}{c}def");
    got_free(&g);
}

TEST(a_prompt_that_ends_in_think_opens_the_reasoning)
{
    static const char *yes[] = {"<｜Assistant｜><think>\n", "<|im_start|>assistant\n<think>", "<think> \n"};
    static const char *no[] = {"<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                               "<｜Assistant｜></think>", "", "think>"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        ASSERT_MSG(sd_rs_prompt_opens(yes[i], strlen(yes[i])), "%s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        ASSERT_MSG(!sd_rs_prompt_opens(no[i], strlen(no[i])), "%s", no[i]);
}

TEST(an_emit_failure_stops_the_feed)
{
    got g;
    memset(&g, 0, sizeof g);
    g.fail_after = 1;
    sd_rs_parser p;
    sd_rs_init(&p, 1, collect, &g);
    ASSERT_EQ(sd_rs_feed(&p, "abc", 3), 77);
    sd_rs_free(&p);
    got_free(&g);
}

TEST_MAIN(T(reasoning_and_content_come_out_the_same_in_any_pieces), T(a_prompt_that_ends_in_think_opens_the_reasoning),
          T(an_emit_failure_stops_the_feed))

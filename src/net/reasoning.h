/* net/reasoning: a chat reply's reasoning, split from its content as it
 * streams (--reasoning-parser).
 *
 * The reasoning models specd serves (DeepSeek-R1 and V3.1 in thinking mode,
 * Qwen3, Kimi-K2-Thinking) think between <think> and </think> before they
 * answer. Where the prompt opened the reasoning (R1's generation prompt ends
 * with "<think>\n"), the reply starts inside it; otherwise a reply that
 * opens with <think> (whitespace before it aside) starts one. The tags are
 * not passed on, nor the newlines next to them (what the templates strip
 * when a reply comes back as history: reasoning.strip('\n'),
 * content.lstrip('\n')). A reasoning the reply never closes is reasoning to
 * its end; text after </think> is content, every byte of it (a second
 * <think> included).
 *
 * Fed in pieces of any size (a tag split across pieces is held back until
 * it is known), it gives the same reasoning and content as fed at once. No
 * I/O: unit-tested and fuzzed alone. */
#ifndef SD_NET_REASONING_H
#define SD_NET_REASONING_H

#include <stddef.h>

#include "net/buf.h"

/* reasoning 1: text of the reasoning, 0: of the content. A non-zero return
 * stops the feed and is returned by it. */
typedef int (*sd_rs_emit)(void *arg, int reasoning, const char *text, size_t len);

typedef struct sd_rs_parser {
    int state;     /* 0 before the reply shows whether it reasons, 1 reasoning, 2 content */
    int started;   /* reasoning: text came after its opening newlines */
    int content_started; /* content: text came after </think>'s newlines */
    sd_buf hold;   /* text not yet emitted */
    sd_rs_emit emit;
    void *arg;
} sd_rs_parser;

/* in_reasoning: the prompt opened the reasoning (sd_rs_prompt_opens) */
void sd_rs_init(sd_rs_parser *p, int in_reasoning, sd_rs_emit emit, void *arg);
/* 0, SD_ENOMEM, or the emit callback's non-zero return. */
int sd_rs_feed(sd_rs_parser *p, const char *text, size_t len);
/* The reply ended: what is held goes out. */
int sd_rs_end(sd_rs_parser *p);
void sd_rs_free(sd_rs_parser *p);
/* 1 when a rendered prompt ends with <think> (whitespace after it aside):
 * the reply starts inside the reasoning. */
int sd_rs_prompt_opens(const char *prompt, size_t len);

#endif

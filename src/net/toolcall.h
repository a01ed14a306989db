/* net/toolcall: the model's tool calls, read out of its text as it streams.
 *
 * The format is the one the chat template taught the model (its
 * sd_tool_format). json (Llama 3.1 / 3.2): a reply that is, whitespace
 * aside, JSON objects {"name": ..., "parameters": {...}} (several joined by
 * ";") is calls; any other reply is content. Such a reply is held to its end
 * (it is a call only if all of it parses), the rest streams as it comes.
 *
 * kimi (Kimi-K2), deepseek31 and deepseek3 (DeepSeek V3.1, V3 / R1):
 * calls in a section of special tokens (sd_tool_format's comment), Kimi's
 * each with its id (functions.NAME:I, kept as the call's id so that it
 * comes back in the history); otherwise as hermes, the section in place of
 * the block.
 *
 * hermes (Qwen2.5 / Qwen3): each call a JSON object {"name": ..., "arguments": {...}}
 * between <tool_call> and </tool_call>. Text before the first call is the
 * message's content; text after a call is content too, but for a stretch
 * between tags (or to the end) that is whitespace alone (the newlines between
 * calls). A block that does not hold such
 * an object, or one the output ends inside, stays in the content as written:
 * nothing the model said is lost. With parallel_tool_calls false the calls
 * after the first are dropped (OpenAI's meaning: at most one).
 *
 * Fed in pieces of any size (a tag split across pieces is held back until it
 * is known), it gives the same content and calls as fed at once; its emit
 * callback sees content and calls in the order they came. No I/O, no state
 * outside the parser: unit-tested and fuzzed alone. */
#ifndef SD_NET_TOOLCALL_H
#define SD_NET_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

#include "core/tokenizer.h"
#include "net/buf.h"

/* A tool call the model made: id "call_" + 24 characters, the function's
 * name, its arguments as JSON text (Python json.dumps of the object, as
 * vLLM writes them). */
typedef struct sd_tool_call {
    char id[128]; /* the model's own where its format has ids (Kimi's functions.NAME:I) */
    char *name;
    char *arguments;
} sd_tool_call;
void sd_tool_call_free(sd_tool_call *c);

/* content (len bytes, not NUL-terminated) or call: one of them per call. A
 * non-zero return stops the feed and is returned by it. */
typedef int (*sd_tc_emit)(void *arg, const char *content, size_t len, const sd_tool_call *call);

typedef struct sd_tc_parser {
    sd_tool_format format;
    int json_state;  /* json: 0 nothing but whitespace yet, 1 a reply of text, 2 one that may be calls */
    int in_call;     /* inside <tool_call> */
    int seg_text;    /* the stretch since the last </tool_call> has had content */
    int n_calls;     /* calls emitted, the one being emitted counted (its index: n_calls - 1) */
    int max_calls;   /* 0: any number */
    uint64_t id_key; /* the calls' ids: a mix of this and their number */
    const char *open, *close; /* the tags around a call (hermes) or the calls (a section) */
    size_t open_len, close_len;
    /* a forced call (tool_choice): the reply is, whole, the arguments of
     * the function forced_name (a named tool_choice), or with forced_list a
     * JSON array of {"name", "parameters"} calls (tool_choice required);
     * the decoding was held to that (a response_format json_schema) */
    char forced_name[256];
    int forced_list;
    sd_buf hold;     /* text not yet emitted: a tag's possible start, a call's body,
                        whitespace after a call */
    sd_tc_emit emit;
    void *arg;
} sd_tc_parser;

void sd_tc_init(sd_tc_parser *p, sd_tool_format format, int max_calls, uint64_t id_key, sd_tc_emit emit,
                void *arg);
/* The parser of a forced call (whatever the model's own format): name, the
 * function a named tool_choice forces, or NULL: tool_choice required (a JSON
 * array of calls). The reply is held to its end; one that is not what was
 * forced (cut at its length) is content, as written. */
void sd_tc_init_forced(sd_tc_parser *p, const char *name, int max_calls, uint64_t id_key,
                       sd_tc_emit emit, void *arg);
/* 1 when format f's calls are in special tokens: its replies must be read
 * with special tokens printed (sd_gen_params.keep_special) */
int sd_tc_keeps_special(sd_tool_format f);
/* 0, SD_ENOMEM, or the emit callback's non-zero return. */
int sd_tc_feed(sd_tc_parser *p, const char *text, size_t len);
/* The output ended: what is held goes out (an unfinished call as content). */
int sd_tc_end(sd_tc_parser *p);
void sd_tc_free(sd_tc_parser *p);

#endif

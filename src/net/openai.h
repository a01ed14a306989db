/* net/openai: the shapes of the OpenAI API, as pure functions.
 *
 * A request body (JSON text) becomes a validated sd_oai_request or an
 * sd_api_error in OpenAI's shape ({"error": {message, type, param, code}})
 * that names the parameter at fault. Responses, stream chunks, usage (with
 * the speculative statistics in the `speculative` extension field) and SSE
 * framing are built here too. Nothing here does I/O, touches the engine or
 * keeps state, so every path is unit-tested and fuzzed without a model. */
#ifndef SD_NET_OPENAI_H
#define SD_NET_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "core/tokenizer.h"
#include "engine/engine.h"
#include "net/buf.h"
#include "net/toolcall.h"

typedef struct sd_api_error {
    int status;       /* HTTP status */
    const char *type; /* static: "invalid_request_error" | "server_error" | ... */
    char param[96];   /* "" is written as null */
    char code[48];    /* "" is written as null */
    char message[512];
} sd_api_error;

/* Fills e; returns SD_EINVAL so `return sd_api_error_set(...)` reads well.
 * type follows the status: 5xx -> server_error, else invalid_request_error. */
int sd_api_error_set(sd_api_error *e, int status, const char *param, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* {"error": {...}} */
int sd_api_error_json(sd_buf *out, const sd_api_error *e);

typedef enum sd_oai_kind { SD_OAI_COMPLETIONS = 0, SD_OAI_CHAT = 1 } sd_oai_kind;

struct json_t;
/* An earlier tool call of an assistant message: its arguments parsed from the
 * JSON text the client sent (an object, printed back by the template), and
 * that text (DeepSeek's templates print it as it is). */
typedef struct sd_oai_call {
    char *id; /* NULL when the client gave none */
    char *name;
    struct json_t *arguments;
    char *arguments_text;
} sd_oai_call;

typedef struct sd_oai_msg {
    char *role; /* system | user | assistant | tool ("developer" arrives as "system") */
    char *content; /* "" for an assistant message of tool calls alone */
    int content_null; /* the client sent no content (an assistant's tool calls alone) */
    sd_oai_call *calls; /* assistant: tool_calls */
    int n_calls;
    char *tool_call_id; /* tool: NULL when not given */
} sd_oai_msg;

/* One prompt of /v1/completions: text, or token ids where is_ids. */
typedef struct sd_oai_prompt {
    char *text; /* owned */
    size_t len;
    int is_ids;
    int32_t *ids; /* owned */
    int n_ids;
} sd_oai_prompt;

typedef struct sd_oai_request {
    sd_oai_kind kind;
    char *model;
    /* completions: the prompts (a batch: several; /tokenize: one), each
     * generated n times */
    sd_oai_prompt *prompts;
    int n_prompts;
    /* chat */
    sd_oai_msg *msgs;
    int n_msgs;
    int stream;
    int include_usage;
    int n; /* choices: n generations of each prompt (n x prompts <= SD_OAI_MAX_N) */
    int max_tokens;               /* -1: not given (sd_oai_fit_context picks it) */
    const char *max_tokens_param; /* the name the client used, for errors */
    char **stop;                  /* owned; gen.stop points here */
    int n_stop;
    /* completions: the prompt comes back before the completion (with
     * logprobs, its tokens' too: gen.prompt_logprobs) */
    int echo;
    /* chat: the tools (validated OpenAI tool objects, a reference), NULL when
     * none were given or tool_choice is "none" (they are then neither shown to
     * the model nor read out of its text); at most one call with
     * parallel_tool_calls false. tool_choice required or a named function:
     * tool_forced below. */
    struct json_t *tools;
    int parallel_tool_calls;
    sd_chat_kwargs kwargs; /* chat: chat_template_kwargs */
    char *schema_text;     /* response_format json_schema's schema, or a forced tool call's
                            * (owned; gen.json_schema) */
    /* the cache the schema was compiled through to check it (sd_oai_parse's
     * schemas; NULL: compiled alone and freed), and the compiled schema of
     * schema_text held there until the request is freed, so that the
     * engine's look-up at submission finds it whatever schemas other
     * requests brought meanwhile (it never compiles on the loop thread) */
    struct sd_schema_cache *schemas;
    const struct sd_jschema *held;
    /* tool_choice that forces a call: 1 a named function (forced_name), 2
     * required (a JSON array of calls); the reply is decoded to that schema */
    int tool_forced;
    char *forced_name;
    /* a forced call decoded to the model's own call format
     * (sd_oai_force_format): its format; SD_TOOLS_NONE, the bare JSON */
    sd_tool_format tool_format;
    int32_t *bias_ids;     /* logit_bias (owned; gen.bias_ids points here) */
    float *bias;
    int n_bias;
    sd_gen_params gen;
    /* POST /tokenize only */
    int add_generation_prompt; /* chat: end with the assistant turn's opening */
    int add_special_tokens;    /* prompt: prepend BOS */
} sd_oai_request;

/* Stop strings: at most this many, each at most SD_OAI_MAX_STOP_LEN bytes. */
#define SD_OAI_MAX_STOP 16
#define SD_OAI_MAX_STOP_LEN 512
/* The most choices one request may ask for (n times the prompts of a
 * batch; OpenAI's limit on n too). */
#define SD_OAI_MAX_N 128
/* /v1/completions without max_tokens generates this many (OpenAI's default). */
#define SD_OAI_DEFAULT_COMPLETION_TOKENS 16

/* Parses and validates one request body. served_model: the one name the
 * server answers to. schemas: the engine's cache of compiled json_schemas
 * (verify/schema_cache.h), through which a schema is compiled to check it,
 * so the engine's own look-up finds it; NULL: compiled alone and freed.
 * On failure fills e (status 400) and leaves *r empty. */
int sd_oai_parse(sd_oai_kind kind, const char *body, size_t len, const char *served_model,
                 struct sd_schema_cache *schemas, sd_oai_request *r, sd_api_error *e);
void sd_oai_request_free(sd_oai_request *r);
/* A forced tool_choice decoded to the model's own call format f (its chat
 * template's: Qwen's <tool_call> blocks, Llama 3.1's JSON, DeepSeek's and
 * Kimi-K2's sections of special tokens; SGLang's way) instead of the bare
 * JSON array parse gave it: r->gen.json_schema becomes an x-specd-calls
 * grammar (verify/json_schema.h) of the tools (the named one), at most one
 * call without parallel_tool_calls, and r->tool_format f; the reply is then
 * read by f's parser. Nothing changes where f has no format, the request
 * forces nothing, or a tool's parameters cannot be read that way (not an
 * object schema: the bare JSON stays). 0, or 500 out of memory. */
int sd_oai_force_format(sd_oai_request *r, sd_tool_format f, sd_api_error *e);
/* A reply that begins inside the model's reasoning (its prompt ends with
 * <think>; open NULL), or may open one (open: its tag, Qwen3's <think>):
 * the request's schema (response_format json_schema, a forced call) holds
 * for the text after close, the reasoning's end tag, not for the reasoning
 * (verify/json_schema.h's x-specd-after; specials: the tags may be special
 * tokens' text); json_object becomes such a schema of any object. Nothing
 * where there is neither. 0, or 500 out of memory. */
int sd_oai_json_after(sd_oai_request *r, const char *open, const char *close, int specials,
                      sd_api_error *e);
/* POST /tokenize (vLLM's shape): {"model"?, "prompt"} or {"model"?,
 * "messages", "add_generation_prompt"?, "tools"?, "tool_choice"?,
 * "chat_template_kwargs"?}, plus
 * "add_special_tokens"?. kind tells which form came. */
int sd_oai_parse_tokenize(const char *body, size_t len, const char *served_model,
                          struct sd_schema_cache *schemas, sd_oai_request *r, sd_api_error *e);

/* Once the prompt is tokenized: checks it is not empty and that prompt +
 * max_tokens fits in max_context, and sets r->gen.max_tokens (the asked
 * value, else the completions default or, for chat, what the context
 * leaves). 400 naming the prompt/messages or the max_tokens parameter. */
int sd_oai_fit_context(sd_oai_request *r, int n_prompt, int max_context, sd_api_error *e);

/* The identity every response and chunk of one request carries; index:
 * the choice a stream chunk is of (n > 1). */
typedef struct sd_oai_meta {
    sd_oai_kind kind;
    const char *id;    /* "cmpl-..." or "chatcmpl-..." */
    long long created; /* unix seconds */
    const char *model;
    int index;
} sd_oai_meta;

/* Log probabilities of some of a choice's tokens (sd_gen_params.logprobs):
 * each token's text and bytes from tok; top: the alternatives asked for;
 * offset (may be NULL: 0): the completion's text bytes before the first of
 * them, advanced past them as the completions format's text_offset counts
 * (a stream's running count). */
typedef struct sd_oai_logprobs {
    const struct sd_tokenizer *tok;
    int top;
    const int32_t *ids;
    const sd_token_logprob *lp;
    int n;
    size_t *offset;
} sd_oai_logprobs;

/* One choice of a whole response. reasoning (chat, --reasoning-parser):
 * NULL no reasoning_content field, else its rlen bytes (null when none).
 * calls (chat): the model's tool calls; with any, content is null where
 * the text is empty, and finish_reason is "tool_calls". */
typedef struct sd_oai_choice {
    const char *text;
    size_t len;
    const char *reasoning;
    size_t rlen;
    const sd_tool_call *calls;
    int n_calls;
    sd_finish why;
    const sd_oai_logprobs *logprobs; /* NULL: "logprobs": null */
} sd_oai_choice;

/* The whole non-streaming response (text_completion or chat.completion)
 * of n choices, indexed in order; usage: the request's (prompt once, the
 * choices' completions summed). */
int sd_oai_response(sd_buf *out, const sd_oai_meta *m, const sd_oai_choice *choices, int n,
                    const sd_req_stats *usage);
/* A chat stream chunk of reasoning: delta {"reasoning_content": text}. */
int sd_oai_reasoning_event(sd_buf *out, const sd_oai_meta *m, const char *text, size_t len);
/* A chat stream chunk holding tool call number index (whole: id, name and
 * arguments in one delta). */
int sd_oai_tool_call_event(sd_buf *out, const sd_oai_meta *m, int index, const sd_tool_call *c);
/* The last chat chunk of a stream that made tool calls: finish_reason
 * "tool_calls". */
int sd_oai_tool_calls_finish_event(sd_buf *out, const sd_oai_meta *m);
/* One SSE event holding a stream chunk (of choice m->index). Chat: role != 0 sends the assistant
 * role (first chunk); text may be empty; why != SD_FINISH_NONE sets
 * finish_reason (and an empty delta). Completions ignore role. */
int sd_oai_chunk_event(sd_buf *out, const sd_oai_meta *m, int role, const char *text, size_t len,
                       sd_finish why);
/* The same chunk with the log probabilities of its tokens (lp NULL: null);
 * a chunk of no text carries them alone (chat: an empty delta). */
int sd_oai_chunk_event_lp(sd_buf *out, const sd_oai_meta *m, int role, const char *text, size_t len,
                          sd_finish why, const sd_oai_logprobs *lp);

/* The usage chunk of stream_options.include_usage: empty choices + usage. */
int sd_oai_usage_event(sd_buf *out, const sd_oai_meta *m, const sd_req_stats *st);
/* GET /v1/models */
int sd_oai_models(sd_buf *out, const char *model, long long created, int max_context);

/* SSE framing: `data: <json>\n\n`. json must hold no newline (compact JSON
 * never does: newlines in strings are escaped). */
int sd_sse_event(sd_buf *out, const char *json, size_t len);
int sd_sse_done(sd_buf *out); /* data: [DONE]\n\n */
int sd_sse_error(sd_buf *out, const sd_api_error *e);

/* Copies text with each invalid UTF-8 sequence replaced by U+FFFD, so the
 * JSON encoder never refuses it. Appends to out. */
int sd_utf8_sanitize(sd_buf *out, const char *s, size_t len);

#endif

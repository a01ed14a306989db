/* core/tokenizer: Hugging Face tokenizer.json (BPE, byte-level or not) in C,
 * and the chat templates of the families specd serves.
 *
 * Encoding reproduces the HF `tokenizers` library (Tokenizer.encode(text,
 * add_special_tokens=False)): added tokens are split out first (leftmost-longest,
 * with their single_word / lstrip / rstrip / normalized flags), the rest is
 * normalized, pre-tokenized (Split with the file's regex, compiled by PCRE2 in
 * UTF+UCP mode with JIT; ByteLevel; Sequence) and merged by BPE rank with a heap,
 * so the cost is O(n log n) in the text, never a quadratic rescan.
 * Decoding reproduces Tokenizer.decode: per-token decoder steps, then the bytes
 * are read as UTF-8 with ill-formed parts replaced by U+FFFD: one a maximal
 * subpart (Rust's from_utf8_lossy, which HF's ByteLevel decoder uses), or with
 * ByteFallback one a byte, as SentencePiece decodes byte pieces (HF's ByteFallback
 * replaces a whole run of byte tokens when any of it is ill-formed; specd keeps
 * the run's well-formed characters, as SentencePiece does).
 *
 * Supported: model BPE (vocab; merges as "a b" strings or [a, b] pairs; unk_token,
 * fuse_unk, byte_fallback, ignore_merges, continuing_subword_prefix,
 * end_of_word_suffix); normalizers NFC, NFD, NFKC, NFKD, Lowercase, Prepend,
 * Replace, Strip, StripAccents, Sequence; pre-tokenizers Split (Regex or String
 * pattern, all five behaviours, invert), ByteLevel (add_prefix_space, use_regex),
 * Metaspace (replacement, prepend_scheme always / first / never or the older
 * add_prefix_space, split), Sequence; decoders ByteLevel, Replace, ByteFallback,
 * Strip (per token, or after Fuse at the text's start: Llama-2's), Fuse, Sequence
 * (or none: tokens joined by a space, as HF does). So SentencePiece BPE models
 * converted to tokenizer.json (Llama-2, Mistral, Mixtral) load in both the legacy
 * (Prepend + Replace normalizers) and the Metaspace form. Anything else is refused
 * at load with a message naming it (e.g. model Unigram, decoder Metaspace,
 * normalizer Precompiled).
 *
 * Regex dialect: tokenizer.json patterns are Oniguruma's (Ruby syntax). Before
 * PCRE2 compiles one, the differences that matter are rewritten: \s / \S mean the
 * Unicode White_Space set (PCRE2 adds U+180E), a bare script name \p{Han} means
 * the Script property (PCRE2 would take Script_Extensions), \h is a hex digit,
 * \uHHHH a code point, and a class intersection [A&&[^B]] (Kimi's pattern)
 * becomes (?:(?![B])[A]). Other intersections, and \S inside a class, are refused.
 *
 * Invalid UTF-8 in the text to encode: each maximal ill-formed subpart is replaced
 * by U+FFFD before anything else, so encode(bytes) == HF.encode(bytes.decode(
 * 'utf-8', 'replace')). Text may hold NUL bytes.
 *
 * Thread safety: a loaded sd_tokenizer is immutable; any number of threads may
 * encode and decode with it at once. An sd_detok belongs to one thread at a time.
 * Nothing here keeps global state. */
#ifndef SD_CORE_TOKENIZER_H
#define SD_CORE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/utf8.h"

typedef struct sd_tokenizer sd_tokenizer;

/* path: a tokenizer.json, or the folder holding it. tokenizer_config.json beside it
 * (optional) names bos_token / eos_token. A folder without tokenizer.json may hold
 * a tiktoken rank file, tiktoken.model (Kimi-K2's form; path may name it too):
 * it is read as the tokenizer.json transformers' TikTokenConverter makes of it,
 * with the split pattern of the model's tokenization_*.py beside it and the
 * special tokens of tokenizer_config.json's added_tokens_decoder (tok_tiktoken.c). */
int sd_tok_load(sd_tokenizer **out, const char *path, sd_err *err);
/* 1 when dir holds a tokenizer sd_tok_load reads (tokenizer.json or tiktoken.model). */
int sd_tok_present(const char *dir);
void sd_tok_free(sd_tokenizer *t);

/* Size of the id space: 1 + the largest id of the model vocabulary and the added
 * tokens. Ids below it that name no token decode to nothing (as in HF). */
int sd_tok_vocab_size(const sd_tokenizer *t);
/* -1 when none. From tokenizer_config.json's bos_token / eos_token when the folder
 * has one (null there means none); else bos from a TemplateProcessing
 * post-processor that starts with a special token; else a special added token with
 * a well-known name (<|begin_of_text|>, <s>, <｜begin▁of▁sentence｜>, ... /
 * <|end_of_text|>, </s>, <|endoftext|>, <｜end▁of▁sentence｜>, ...). */
int sd_tok_bos_id(const sd_tokenizer *t);
int sd_tok_eos_id(const sd_tokenizer *t);
/* 1 if id is an added token marked special (skipped by skip_special decoding). */
int sd_tok_is_special(const sd_tokenizer *t, int32_t id);
/* The id of a token string (added tokens first, then the model vocabulary), or -1. */
int32_t sd_tok_token_id(const sd_tokenizer *t, const char *token, size_t len);
/* The token's vocabulary string (NOT decoded: byte-level tokens read "Ġthe"), or
 * NULL when the id names no token. Valid while t lives. */
const char *sd_tok_token_str(const sd_tokenizer *t, int32_t id, size_t *len);
/* The bytes decoding gives for the token in running text (after the
 * per-token decoder steps: byte-level tokens read " the"; a piece of a UTF-8
 * character stays as it is; no join-with-space, strip or UTF-8 repair,
 * which belong to a whole text), or NULL when the id names no token. Valid
 * while t lives. */
const char *sd_tok_token_bytes(const sd_tokenizer *t, int32_t id, size_t *len);

/* text (len bytes, may hold NUL) -> malloc'd ids (*ids may be NULL when *n == 0).
 * Special and added tokens in the text are matched like HF does. add_bos prepends
 * the bos id when the tokenizer has one. */
int sd_tok_encode(const sd_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                  int *n, sd_err *err);
/* ids -> malloc'd NUL-terminated text (*len bytes, no NUL inside unless a token
 * decodes to one). An id < 0 or >= sd_tok_vocab_size is an SD_ERANGE error. */
int sd_tok_decode(const sd_tokenizer *t, const int32_t *ids, int n, int skip_special, char **text,
                  size_t *len, sd_err *err);

/* Streaming detokenization: push ids as they are generated; each push returns the
 * text that became final (whole UTF-8 characters only, never changed later). The
 * concatenation of every push and the flush equals sd_tok_decode of all the ids. */
typedef struct sd_detok sd_detok;
int sd_detok_new(sd_detok **out, const sd_tokenizer *t, int skip_special, sd_err *err);
/* *text malloc'd (NUL-terminated, may be len 0). */
int sd_detok_push(sd_detok *d, const int32_t *ids, int n, char **text, size_t *len, sd_err *err);
/* At the end: emits what is held back; an incomplete trailing character becomes
 * U+FFFD (as the full decode does). The detok can be reused afterwards. */
int sd_detok_flush(sd_detok *d, char **text, size_t *len);
void sd_detok_free(sd_detok *d);

/* ---- chat templates (chat_template.c) -------------------------------------------
 * Native renderers of the published Jinja chat templates, for plain text messages:
 *   llama3     Llama-3 (3.0), and the 3.1/3.3 and 3.2 forms with the
 *              "Cutting Knowledge Date" system block
 *   chatml     <|im_start|>role\n...<|im_end|>\n; Qwen2/Qwen2.5 default system
 *              prompts and Qwen3's <think> handling are taken from the checkpoint
 *   deepseek3  DeepSeek-V3/R1 (<｜User｜> / <｜Assistant｜>), V3.1's </think> form
 *   kimi-k2    Kimi-K2 (<|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|>)
 * The rendered text holds the family's BOS text where the template has it: encode
 * it with add_bos = 0. */
struct json_t;
/* A tool call of an assistant message: the function's name and its arguments
 * (a JSON object, printed as Python's json.dumps prints it: the templates'
 * `tojson`). */
typedef struct sd_chat_call {
    const char *name;
    const struct json_t *arguments;
    /* the arguments' JSON text as the client sent it (OpenAI's arguments
     * string), printed as it is where the template concatenates it
     * (DeepSeek's); NULL: json.dumps of arguments */
    const char *arguments_text;
    const char *id; /* the call's id (Kimi's template prints it), NULL: none */
} sd_chat_call;
typedef struct sd_chat_msg {
    const char *role; /* system | user | assistant | tool | any other role the family prints */
    const char *content; /* NULL only for an assistant message with tool calls */
    const sd_chat_call *calls; /* assistant: its tool calls (n_calls), else NULL */
    int n_calls;
    const char *tool_call_id; /* tool: the call it answers (Kimi's template prints it), NULL: none */
} sd_chat_msg;
typedef struct sd_chat_template sd_chat_template;

/* name: "auto" (recognize the family from model_dir's tokenizer_config.json
 * chat_template, or chat_template.jinja; with no template at all, chatml when the
 * vocabulary has <|im_start|>), or llama3 | chatml | deepseek3 | kimi-k2 | mistral | llama2. An
 * unknown name or an unrecognized template is an error (never a fallback).
 * model_dir may be NULL with an explicit name. */
int sd_chat_template_load(sd_chat_template **out, const char *model_dir, const char *name,
                          sd_err *err);
int sd_chat_render(const sd_chat_template *ct, const sd_chat_msg *msgs, int n,
                   int add_generation_prompt, char **out, size_t *len, sd_err *err);
/* The template arguments a request may set (OpenAI servers' chat_template_kwargs)
 * that change what specd's renderers print: -1 not given, 0 false, 1 true.
 * enable_thinking: Qwen3 (false: an empty <think></think> opens the reply);
 * DeepSeek V3.1 reads it where `thinking` is not given. thinking: DeepSeek
 * V3.1 (true: the reply opens with <think>; the template's default is false).
 * Other templates do not read them (Jinja ignores them too). */
typedef struct sd_chat_kwargs {
    int enable_thinking;
    int thinking;
} sd_chat_kwargs;
#define SD_CHAT_KWARGS_NONE ((sd_chat_kwargs){.enable_thinking = -1, .thinking = -1})
/* As sd_chat_render, with the request's tools (a JSON array of OpenAI tool
 * objects, each printed as the template's `tool | tojson`; NULL or empty: none),
 * the messages' tool calls and the template arguments kw (NULL: none given).
 * The families whose tool format is written out: chatml with Qwen2.5's and
 * Qwen3's tool blocks, Llama 3.1's and 3.2's (tools in the first user
 * message, one call a message), DeepSeek's (the templates print the calls;
 * the tools go after the system prompt as V3.1's model card describes them),
 * Kimi-K2's; the others refuse tools and tool calls with SD_ENOTSUP. */
int sd_chat_render_kw(const sd_chat_template *ct, const sd_chat_msg *msgs, int n,
                      const struct json_t *tools, const sd_chat_kwargs *kw, int add_generation_prompt,
                      char **out, size_t *len, sd_err *err);
/* Python's json.dumps(v, ensure_ascii=False) of v (key order kept, ", " and
 * ": " separators, floats as Python's repr), appended to b: 0, or -1 when memory
 * ran out. The templates' tojson filter. */
int sd_py_json_dumps(sd_sbuf *b, const struct json_t *v);
/* json.dumps(v, ensure_ascii=False, indent=indent): nested items on their own
 * lines, "," and ": " (tojson(indent=4) in Llama 3.1's template). */
int sd_py_json_dumps_indent(sd_sbuf *b, const struct json_t *v, int indent);
/* How the template's model writes a tool call, for reading it back: none
 * (the template has no tool format specd writes out), hermes (Qwen2.5 /
 * Qwen3: <tool_call>{"name", "arguments"}</tool_call>), json (Llama 3.1 /
 * 3.2: the reply is {"name", "parameters"}), kimi (Kimi-K2: special tokens
 * <|tool_calls_section_begin|> <|tool_call_begin|>functions.NAME:I
 * <|tool_call_argument_begin|>{...}<|tool_call_end|> ... <|tool_calls_section_end|>,
 * so its reply is read with special tokens printed), deepseek31 (V3.1:
 * <｜tool▁calls▁begin｜> <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
 * ... <｜tool▁calls▁end｜>), deepseek3 (V3 / R1: the same section, each call
 * <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>;
 * both read with special tokens printed too). */
/* The formats' special-token tags, as the templates print them and the
 * replies are read for them (net/toolcall.c) */
#define SD_KIMI_CALLS "<|tool_calls_section_begin|>"
#define SD_KIMI_CALLS_END "<|tool_calls_section_end|>"
#define SD_KIMI_CALL "<|tool_call_begin|>"
#define SD_KIMI_ARGS "<|tool_call_argument_begin|>"
#define SD_KIMI_CALL_END "<|tool_call_end|>"
#define SD_DS_CALLS "<｜tool▁calls▁begin｜>"
#define SD_DS_CALLS_END "<｜tool▁calls▁end｜>"
#define SD_DS_CALL "<｜tool▁call▁begin｜>"
#define SD_DS_SEP "<｜tool▁sep｜>"
#define SD_DS_CALL_END "<｜tool▁call▁end｜>"
typedef enum sd_tool_format {
    SD_TOOLS_NONE = 0,
    SD_TOOLS_HERMES,
    SD_TOOLS_JSON,
    SD_TOOLS_KIMI,
    SD_TOOLS_DEEPSEEK3,
    SD_TOOLS_DEEPSEEK31
} sd_tool_format;
sd_tool_format sd_chat_template_tool_format(const sd_chat_template *ct);
/* The family name (llama3 | chatml | deepseek3 | kimi-k2 | mistral | llama2). */
const char *sd_chat_template_name(const sd_chat_template *ct);
/* The text that ends an assistant turn (<|eot_id|>, <|im_end|>, ...): a stop token. */
const char *sd_chat_template_stop(const sd_chat_template *ct);
/* Llama 3.2 prints today's date ("%d %b %Y"); this pins it (reproducible prompts,
 * tests). date must outlive ct. */
void sd_chat_template_set_date(sd_chat_template *ct, const char *date);
void sd_chat_template_free(sd_chat_template *ct);

#endif

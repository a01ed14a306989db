/* bench/common/bench_util.h: what the in-process benchmarks (decode, accept,
 * tok) share: the commit they ran at, prompt sets from JSONL files, and the
 * head of their JSON records. */
#ifndef SD_BENCH_UTIL_H
#define SD_BENCH_UTIL_H

#include <jansson.h>
#include <stdint.h>

#include "core/err.h"
#include "core/tokenizer.h"

/* `git rev-parse --short=12 HEAD` in the working folder, or "unknown";
 * malloc'd. */
char *sd_bench_git_commit(void);

/* One prompt's text from a JSONL record, in the shapes of public sets:
 * MT-Bench {"turns": [first, ...]}, HumanEval {"prompt"}, GSM8K
 * {"question"}, {"text"} or {"input"}; NULL for none. Owned by j. */
const char *sd_bench_record_text(json_t *j);

typedef struct sd_bench_prompt {
    int32_t *ids; /* (n) malloc'd */
    int n;
} sd_bench_prompt;

/* Up to max_n prompts from the JSONL file into ps[0..*n_got), through tok;
 * with ct each text is rendered as one user turn (the template then gives the
 * BOS), without it the tokenizer adds BOS. A prompt longer than max_len keeps
 * its last max_len ids (what the model continues). Records with no text, or
 * that do not encode, are skipped. Returns 0, or SD_EIO when the file cannot
 * be opened (err names it); *n_got may be 0. */
int sd_bench_load_prompts(const char *file, const sd_tokenizer *tok, const sd_chat_template *ct,
                          int max_n, int max_len, sd_bench_prompt *ps, int *n_got, sd_err *err);

/* The head of a benchmark's JSON record: "benchmark", "commit" (commit, or
 * the working folder's), "machine" (machine, or uname's), "device" (device, or
 * "auto") and "command" (argv). */
void sd_bench_json_head(json_t *root, const char *benchmark, const char *commit,
                        const char *machine, const char *device, int argc, char **argv);

#endif

/* bench/common/bench_util.h: what the in-process benchmarks (decode, accept,
 * tok) share: the commit they ran at, prompt sets from JSONL files, and the
 * head of their JSON records. */
#ifndef SD_BENCH_UTIL_H
#define SD_BENCH_UTIL_H

#include <jansson.h>
#include <stdint.h>

#include "core/err.h"
#include "core/tokenizer.h"

/* The commit the benchmark was built from (`git describe --always
 * --dirty`), else `git rev-parse --short=12 HEAD` in the working folder,
 * else "unknown"; malloc'd. */
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

/* Options of an in-process benchmark's argv loop: inside
 *   for (int i = 1; i < argc; i++) {
 *       const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
 * each takes option `name` and its value into field and goes on to the next
 * argument, or makes the parse return -1 (a number out of [lo, hi] says so
 * on stderr, naming the program prog). */
#define SD_BENCH_ARG_STR(name, field)                                                           \
    if (!strcmp(k, name)) {                                                                     \
        if (!v)                                                                                 \
            return -1;                                                                          \
        field = v;                                                                              \
        i++;                                                                                    \
        continue;                                                                               \
    }
#define SD_BENCH_ARG_BUF(name, field)                                                           \
    if (!strcmp(k, name)) {                                                                     \
        if (!v)                                                                                 \
            return -1;                                                                          \
        snprintf(field, sizeof field, "%s", v);                                                 \
        i++;                                                                                    \
        continue;                                                                               \
    }
#define SD_BENCH_ARG_INT(prog, name, field, lo, hi)                                             \
    if (!strcmp(k, name)) {                                                                     \
        int64_t x;                                                                              \
        if (!v || sd_parse_i64(v, &x) || x < (lo) || x > (hi)) {                                \
            fprintf(stderr, "%s: %s: '%s' is not an integer in [%d, %d]\n", prog, name,         \
                    v ? v : "", (int)(lo), (int)(hi));                                          \
            return -1;                                                                          \
        }                                                                                       \
        field = (int)x;                                                                         \
        i++;                                                                                    \
        continue;                                                                               \
    }
#define SD_BENCH_ARG_NUM(prog, name, field, lo, hi)                                             \
    if (!strcmp(k, name)) {                                                                     \
        double x;                                                                               \
        if (!v || sd_parse_f64(v, &x) || x < (lo) || x > (hi)) {                                \
            fprintf(stderr, "%s: %s: '%s' is not a number in [%g, %g]\n", prog, name,           \
                    v ? v : "", (double)(lo), (double)(hi));                                    \
            return -1;                                                                          \
        }                                                                                       \
        field = x;                                                                              \
        i++;                                                                                    \
        continue;                                                                               \
    }

#endif

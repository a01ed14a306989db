/* cli/tokenize: `specd tokenize` and `specd detokenize`.
 *
 *   specd tokenize   (--tokenizer PATH | --model DIR) --text STR   -> [id,id,...]\n
 *   specd detokenize (--tokenizer PATH | --model DIR) --ids 1,2,3  -> the text, byte for byte
 *
 * tokenize prints the ids of the text alone (HF encode with add_special_tokens=False:
 * no BOS is added; special tokens written in the text are still matched), as one
 * JSON array and a newline. detokenize writes exactly the decoded bytes, with no
 * newline of its own. Without --tokenizer and --model, the bundled model's folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/tokenizer.h"
#include "core/util.h"

static int open_tokenizer(const sd_opts *o, const char *cmd, sd_tokenizer **t)
{
    sd_err err = {0};
    const char *path = o->tokenizer && *o->tokenizer ? o->tokenizer : o->model && *o->model ? o->model : NULL;
    if (!path) {
        path = sd_bundled_model_dir();
        if (!sd_dir_exists(path)) {
            fprintf(stderr,
                    "specd %s: no --tokenizer or --model given, and the bundled model folder %s does not exist\n",
                    cmd, path);
            return 1;
        }
    }
    if (sd_tok_load(t, path, &err)) {
        fprintf(stderr, "specd %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

int sd_cmd_tokenize(const sd_opts *o)
{
    sd_tokenizer *t;
    if (open_tokenizer(o, "tokenize", &t))
        return 1;
    sd_err err = {0};
    int32_t *ids = NULL;
    int n = 0;
    const char *text = o->text ? o->text : "";
    if (sd_tok_encode(t, text, strlen(text), 0, &ids, &n, &err)) {
        fprintf(stderr, "specd tokenize: %s\n", err.msg);
        sd_tok_free(t);
        return 1;
    }
    putchar('[');
    for (int i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    sd_tok_free(t);
    return fflush(stdout) == 0 ? 0 : 1;
}

int sd_cmd_detokenize(const sd_opts *o)
{
    sd_err err = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (sd_parse_ids(o->ids ? o->ids : "", &ids, &n, "--ids", &err)) {
        fprintf(stderr, "specd detokenize: %s\n", err.msg);
        return 2;
    }
    sd_tokenizer *t;
    if (open_tokenizer(o, "detokenize", &t)) {
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = sd_tok_decode(t, ids, n, 0, &text, &len, &err);
    free(ids);
    sd_tok_free(t);
    if (rc) {
        fprintf(stderr, "specd detokenize: %s\n", err.msg);
        return 1;
    }
    size_t put = fwrite(text, 1, len, stdout);
    free(text);
    return put == len && fflush(stdout) == 0 ? 0 : 1;
}

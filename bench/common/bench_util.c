/* What the in-process benchmarks share (bench_util.h). */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench_commit.h"
#include "core/util.h"

char *sd_bench_git_commit(void)
{
    /* the commit it was built from; where the build had no git, the
     * working directory's */
    if (strcmp(SD_BENCH_COMMIT, "unknown"))
        return strdup(SD_BENCH_COMMIT);
    FILE *p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    char buf[64] = "";
    if (p) {
        if (!fgets(buf, sizeof buf, p))
            buf[0] = 0;
        pclose(p);
    }
    buf[strcspn(buf, "\n")] = 0;
    return strdup(buf[0] ? buf : "unknown");
}

const char *sd_bench_record_text(json_t *j)
{
    json_t *v;
    if ((v = json_object_get(j, "turns")) && json_is_array(v))
        return json_string_value(json_array_get(v, 0));
    const char *keys[] = {"prompt", "question", "text", "input"};
    for (size_t i = 0; i < SD_ARRAY_LEN(keys); i++)
        if ((v = json_object_get(j, keys[i])) && json_is_string(v))
            return json_string_value(v);
    return NULL;
}

int sd_bench_load_prompts(const char *file, const sd_tokenizer *tok, const sd_chat_template *ct,
                          int max_n, int max_len, sd_bench_prompt *ps, int *n_got, sd_err *err)
{
    *n_got = 0;
    FILE *f = fopen(file, "r");
    if (!f)
        return sd_err_set(err, SD_EIO, "cannot open %s", file);
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    sd_err e2 = {0}; /* a record that does not render or encode is skipped */
    while (n < max_n && getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        const char *text = j ? sd_bench_record_text(j) : NULL;
        if (text) {
            char *rendered = NULL;
            size_t rl = 0;
            if (ct) {
                sd_chat_msg m = {.role = "user", .content = text};
                if (sd_chat_render(ct, &m, 1, 1, &rendered, &rl, &e2) == 0)
                    text = rendered;
            }
            int32_t *ids = NULL;
            int ni = 0;
            if (sd_tok_encode(tok, text, strlen(text), !ct, &ids, &ni, &e2) == 0 && ni > 0) {
                if (ni > max_len) {
                    memmove(ids, ids + ni - max_len, (size_t)max_len * sizeof *ids);
                    ni = max_len;
                }
                ps[n].ids = ids;
                ps[n++].n = ni;
            } else {
                free(ids);
            }
            free(rendered);
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    *n_got = n;
    return 0;
}

void sd_bench_json_head(json_t *root, const char *benchmark, const char *commit,
                        const char *machine, const char *device, int argc, char **argv)
{
    struct utsname un;
    if (uname(&un))
        snprintf(un.machine, sizeof un.machine, "unknown");
    json_object_set_new(root, "benchmark", json_string(benchmark));
    if (commit) {
        json_object_set_new(root, "commit", json_string(commit));
    } else {
        char *c = sd_bench_git_commit();
        json_object_set_new(root, "commit", json_string(c));
        free(c);
    }
    json_object_set_new(root, "machine", json_string(machine ? machine : un.machine));
    json_object_set_new(root, "device", json_string(device ? device : "auto"));
    json_t *cmd = json_array();
    for (int i = 0; i < argc; i++)
        json_array_append_new(cmd, json_string(argv[i]));
    json_object_set_new(root, "command", cmd);
}

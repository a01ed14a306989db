/* bench/serve/prompts: prompt sets from JSON Lines files or made up. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bench/serve/bench.h"
#include "core/util.h"

static int push(sd_bench_prompts *p, int *cap, const char *s, size_t len)
{
    if (p->n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        char **t = realloc(p->text, sizeof(char *) * (size_t)nc);
        if (!t)
            return SD_ENOMEM;
        p->text = t;
        *cap = nc;
    }
    char *c = malloc(len + 1);
    if (!c)
        return SD_ENOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    p->text[p->n++] = c;
    return 0;
}

/* The prompt of one record in any of the known shapes, or NULL. */
static json_t *prompt_of(json_t *o)
{
    json_t *v;
    if ((v = json_object_get(o, "turns")) && json_is_array(v)) /* MT-Bench */
        return json_array_get(v, 0);
    if ((v = json_object_get(o, "question"))) /* GSM8K */
        return v;
    if ((v = json_object_get(o, "prompt"))) /* HumanEval, generic */
        return v;
    return json_object_get(o, "text");
}

int sd_bench_prompts_load(const char *path, sd_bench_prompts *p, sd_err *err)
{
    memset(p, 0, sizeof *p);
    char *data;
    size_t len;
    int rc = sd_read_file(path, &data, &len, err);
    if (rc)
        return rc;
    int cap = 0, lineno = 0;
    char *s = data, *end = data + len;
    while (s < end) {
        char *nl = memchr(s, '\n', (size_t)(end - s));
        char *e = nl ? nl : end;
        lineno++;
        size_t n = (size_t)(e - s);
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r'))
            k++;
        if (k < n) {
            json_error_t je;
            json_t *o = json_loadb(s, n, 0, &je);
            json_t *v = o && json_is_object(o) ? prompt_of(o) : NULL;
            if (!v || !json_is_string(v) || json_string_length(v) == 0) {
                rc = sd_err_set(err, SD_EFORMAT,
                                "%s:%d: %s", path, lineno,
                                !o ? je.text
                                   : "expected an object with \"turns\" (MT-Bench), \"question\" "
                                     "(GSM8K), \"prompt\" (HumanEval) or \"text\": a non-empty "
                                     "string");
                json_decref(o);
                goto fail;
            }
            rc = push(p, &cap, json_string_value(v), json_string_length(v));
            json_decref(o);
            if (rc) {
                sd_err_set(err, rc, "%s: out of memory", path);
                goto fail;
            }
        }
        s = nl ? nl + 1 : end;
    }
    free(data);
    if (p->n == 0)
        return sd_err_set(err, SD_EFORMAT, "%s: no prompts", path);
    return 0;
fail:
    free(data);
    sd_bench_prompts_free(p);
    return rc;
}

/* Common short English words: each is one token in the usual BPE vocabularies. */
static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
    "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time",
    "people", "year", "way", "day", "man", "thing", "world", "life", "hand", "part", "child",
    "eye", "place", "work", "week", "case", "point", "number", "group", "fact", "water",
    "write", "read", "make", "list", "code", "value", "return", "function", "data", "file",
    "line", "name", "type", "first", "last", "long", "great", "little", "own", "other", "old",
    "right", "big", "high", "small", "large", "next", "early", "young", "important", "few"};

/* nwords random common words (seeded) into b */
static void random_words(sd_buf *b, int nwords, uint64_t *st)
{
    for (int w = 0; w < nwords; w++) {
        const char *x = words[sd_bench_rand(st) % SD_ARRAY_LEN(words)];
        sd_buf_printf(b, w ? " %s" : "%s", x);
    }
}

int sd_bench_prompts_prefix(sd_bench_prompts *p, int nwords, uint64_t seed, sd_err *err)
{
    if (nwords <= 0)
        return 0;
    sd_buf pre = {0};
    uint64_t st = seed ^ 0x5e1f5a1dull;
    random_words(&pre, nwords, &st);
    sd_buf_printf(&pre, "\n\n");
    int rc = pre.oom ? SD_ENOMEM : 0;
    for (int i = 0; !rc && i < p->n; i++) {
        sd_buf b = {0};
        sd_buf_append(&b, pre.p, pre.len);
        sd_buf_printf(&b, "%s", p->text[i]);
        char *t = b.oom ? NULL : sd_buf_take(&b, NULL);
        sd_buf_free(&b);
        if (!t) {
            rc = SD_ENOMEM;
            break;
        }
        free(p->text[i]);
        p->text[i] = t;
    }
    sd_buf_free(&pre);
    return rc ? sd_err_set(err, rc, "shared prefix: out of memory") : 0;
}

int sd_bench_prompts_random(int n, int nwords, uint64_t seed, sd_bench_prompts *p, sd_err *err)
{
    memset(p, 0, sizeof *p);
    if (n <= 0 || nwords <= 0)
        return sd_err_set(err, SD_EINVAL, "random prompts: %d prompts of %d words", n, nwords);
    p->text = calloc((size_t)n, sizeof(char *));
    if (!p->text)
        return sd_err_set(err, SD_ENOMEM, "random prompts: out of memory");
    uint64_t st = seed ^ 0x9a0d7e11ull;
    for (int i = 0; i < n; i++) {
        sd_buf b = {0};
        random_words(&b, nwords, &st);
        if (b.oom) {
            sd_buf_free(&b);
            sd_bench_prompts_free(p);
            return sd_err_set(err, SD_ENOMEM, "random prompts: out of memory");
        }
        p->text[i] = sd_buf_take(&b, NULL);
        if (!p->text[i]) {
            sd_bench_prompts_free(p);
            return sd_err_set(err, SD_ENOMEM, "random prompts: out of memory");
        }
        p->n = i + 1;
    }
    return 0;
}

void sd_bench_prompts_free(sd_bench_prompts *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->text[i]);
    free(p->text);
    p->text = NULL;
    p->n = 0;
}

#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"

#define OFF(f) offsetof(sd_opts, f)
#define S SD_OPT_STR
#define I SD_OPT_INT
#define F SD_OPT_FLOAT
#define B SD_OPT_BOOL
#define E SD_OPT_ENUM

#define C_SRV SD_CMD_SERVE
#define C_GEN SD_CMD_GENERATE
#define C_LOG SD_CMD_LOGITS
#define C_BEN SD_CMD_BENCH
#define C_TOK (SD_CMD_TOKENIZE | SD_CMD_DETOKENIZE)
#define C_RUN (SD_CMD_SERVE | SD_CMD_GENERATE | SD_CMD_BENCH)

/* One row per option. The order is the order of --help and of etc/specd.conf. */
const sd_opt_def sd_opt_table[] = {
    /* model and device */
    {"model", NULL, S, OFF(model), "", 0, 0, NULL, SD_CMD_MODEL | C_TOK,
     "checkpoint directory (config.json, *.safetensors, tokenizer.json); empty: the bundled model"},
    {"device", NULL, E, OFF(device), "auto", 0, 0, "auto|cpu|cuda", SD_CMD_MODEL,
     "backend: cuda when a GPU is present, else cpu"},
    {"tp", NULL, I, OFF(tp), "1", 1, 64, NULL, SD_CMD_MODEL, "tensor-parallel ranks"},
    {"ep", NULL, B, OFF(ep), "false", 0, 0, NULL, SD_CMD_MODEL,
     "expert-parallel MoE instead of TP-sharded experts"},
    {"moe-shared-slots", NULL, B, OFF(moe_shared_slots), "true", 0, 0, NULL, SD_CMD_MODEL,
     "run MoE shared experts as always-on slots of the expert kernels (not with --ep)"},
    {"fp8-weights", NULL, E, OFF(fp8_weights), "bf16", 0, 0, "bf16|fp8", SD_CMD_MODEL,
     "block-scaled FP8 checkpoints: bf16 dequantizes the weights as they load; fp8 keeps them FP8 "
     "where the backend reads FP8 (the CPU: the same numbers from half the memory, ~0.65x the "
     "speed)"},
    {"threads", NULL, I, OFF(threads), "0", 0, 1024, NULL, SD_CMD_MODEL,
     "CPU backend threads per rank (0: all cores)"},
    {"tokenizer", NULL, S, OFF(tokenizer), "", 0, 0, NULL, C_TOK,
     "tokenizer.json or the folder holding it"},
    {"chat-template", NULL, S, OFF(chat_template), "auto", 0, 0, NULL, C_SRV | C_GEN | C_BEN,
     "chat template: auto (from the checkpoint) | llama3 | chatml | deepseek3 | kimi-k2 | mistral | llama2"},
    {"reasoning-parser", NULL, E, OFF(reasoning_parser), "none", 0, 0, "none|think|deepseek-r1|qwen3|kimi-k2",
     C_SRV,
     "chat replies' reasoning (<think>...</think>: DeepSeek-R1 and V3.1, Qwen3, Kimi-K2-Thinking; the other "
     "names are think's in other servers) as reasoning_content, apart from content"},
    /* one-shot commands */
    {"ids", NULL, S, OFF(ids), "", 0, 0, NULL, C_LOG | C_GEN | SD_CMD_DETOKENIZE,
     "comma-separated token ids"},
    {"prompt", NULL, S, OFF(prompt), "", 0, 0, NULL, C_GEN, "prompt text"},
    {"text", NULL, S, OFF(text), "", 0, 0, NULL, SD_CMD_TOKENIZE, "text to tokenize"},
    {"out", NULL, S, OFF(out), "", 0, 0, NULL, C_LOG | C_BEN, "output file"},
    /* sampling */
    {"max-tokens", NULL, I, OFF(max_tokens), "64", 1, 1 << 24, NULL, C_GEN | C_BEN,
     "tokens to generate"},
    {"temperature", NULL, F, OFF(temperature), "0", 0, 100, NULL, C_GEN | C_BEN,
     "sampling temperature (0: greedy)"},
    {"top-p", NULL, F, OFF(top_p), "1", 0, 1, NULL, C_GEN | C_BEN, "nucleus sampling mass"},
    {"top-k", NULL, I, OFF(top_k), "0", 0, 1 << 30, NULL, C_GEN | C_BEN, "top-k sampling (0: off)"},
    {"seed", NULL, I, OFF(seed), "0", 0, 9.2e18, NULL, C_GEN | C_BEN, "sampling seed"},
    /* speculation */
    {"spec", "speculative-algorithm", E, OFF(spec), "none", 0, 0, "none|mtp|eagle3|draft|ngram",
     C_RUN, "speculative proposer"},
    {"draft-model", "speculative-draft-model-path", S, OFF(draft_model), "", 0, 0, NULL, C_RUN,
     "EAGLE-3 head or draft model directory"},
    {"spec-k", "speculative-num-steps|speculative-num-draft-tokens", I, OFF(spec_k), "auto", 0, 16, "auto", C_RUN,
     "draft tokens per step, or auto (adaptive; 0 = plain decode)"},
    {"spec-margin", NULL, F, OFF(spec_margin), "0.02", 0, 1, NULL, C_RUN,
     "adaptive k: the throughput gain over the best shorter k (0: plain decode) that a k must "
     "promise to be chosen"},
    {"ngram-n", NULL, I, OFF(ngram_n), "3", 1, 16, NULL, C_RUN,
     "n-gram proposer: tokens matched"},
    {"synthetic-accept", NULL, S, OFF(synthetic_accept), "", 0, 0, NULL, C_RUN,
     "BENCHMARK ONLY, the output is then NOT the model's: accept draft i with probability P(i+1) "
     "given the earlier ones were (\"P1,P2,...\", the last repeats; no comparison with the "
     "target), to measure speculation at real sizes with random weights; empty: off"},
    /* engine */
    {"max-context", NULL, I, OFF(max_context), "0", 0, 1 << 24, NULL, SD_CMD_MODEL,
     "context length (0: the model's max_position_embeddings)"},
    {"block-size", NULL, I, OFF(block_size), "16", 1, 1024, NULL, C_RUN, "KV cache tokens per block"},
    {"kv-blocks", NULL, I, OFF(kv_blocks), "0", 0, 1 << 30, NULL, C_RUN,
     "KV cache blocks (0: planned from memory)"},
    {"max-batch", NULL, I, OFF(max_batch), "64", 1, 4096, NULL, C_RUN, "running sequences at most"},
    {"max-batch-tokens", NULL, I, OFF(max_batch_tokens), "2048", 16, 1 << 20, NULL, C_RUN,
     "tokens per step (chunked prefill budget)"},
    {"mem-fraction", NULL, F, OFF(mem_fraction), "0.9", 0.05, 0.99, NULL, SD_CMD_MODEL,
     "share of free GPU memory to use"},
    {"cuda-graph-max-bs", NULL, I, OFF(cuda_graph_max_bs), "64", 0, 4096, NULL, C_RUN,
     "largest batch captured in CUDA graphs (0: no graphs)"},
    {"cuda-graph-prompt-rows", NULL, I, OFF(cuda_graph_prompt_rows), "256", 0, 1 << 20, NULL,
     C_RUN,
     "steps with prompt rows of up to this many rows replay CUDA graphs too, captured the "
     "second time a padded size comes (0: they run eagerly)"},
    {"launch-ahead", NULL, E, OFF(launch_ahead), "auto", 0, 0, "auto|on|off", C_RUN,
     "queue a plain decode step before the one before it is read, when the batch cannot "
     "change (auto: one rank with CUDA graphs; on: tensor-parallel ranks and no graphs too)"},
    {"draft-ahead", NULL, B, OFF(draft_ahead), "true", 0, 0, NULL, C_RUN,
     "queue a verify step before its drafts reach the host: the step takes them on the "
     "device, and the host's work between drafting and verifying runs while the drafts are "
     "made (one rank, one node)"},
    {"prefix-cache", "enable-prefix-caching", B, OFF(prefix_cache), "true", 0, 0, NULL, C_RUN,
     "keep the KV of whole blocks of prompts and outputs after their requests end, and start a "
     "request whose tokens begin with such blocks after them (evicted least recently used "
     "first when blocks run short)"},
    {"profile-ops", NULL, B, OFF(profile_ops), "false", 0, 0, NULL, C_RUN,
     "time every backend op (a sync around each, no graphs) and print a table at exit"},
    {"allreduce", NULL, E, OFF(allreduce), "auto", 0, 0, "auto|nccl|oneshot|twoshot", SD_CMD_MODEL,
     "all-reduce of GPU tensor-parallel ranks (auto: timed at start, per message size)"},
    {"nnodes", NULL, I, OFF(nnodes), "1", 1, 1024, NULL, SD_CMD_MODEL,
     "nodes of one tensor-parallel group (one process per node, --tp / --nnodes GPUs each)"},
    {"node-rank", NULL, I, OFF(node_rank), "0", 0, 1023, NULL, SD_CMD_MODEL,
     "this node's index, 0..nnodes-1 (node 0 serves --dist-init-addr)"},
    {"dist-init-addr", NULL, S, OFF(dist_init_addr), "", 0, 0, NULL, SD_CMD_MODEL,
     "HOST:PORT where node 0 hands the NCCL id to the other nodes (needed with --nnodes > 1)"},
    /* server */
    {"host", NULL, S, OFF(host), "127.0.0.1", 0, 0, NULL, C_SRV, "address to listen on"},
    {"port", NULL, I, OFF(port), "8000", 0, 65535, NULL, C_SRV, "TCP port"},
    {"config", NULL, S, OFF(config), "", 0, 0, NULL, C_SRV | C_GEN | C_BEN,
     "config file of `name = value` lines (flags override it)"},
    {"api-key", NULL, S, OFF(api_key), "", 0, 0, NULL, C_SRV,
     "require `Authorization: Bearer KEY` (also SPECD_API_KEY)"},
    {"max-body", NULL, I, OFF(max_body), "1048576", 1024, 1 << 30, NULL, C_SRV,
     "largest request body in bytes (413 past it)"},
    {"max-queued", NULL, I, OFF(max_queued), "1024", 1, 1 << 20, NULL, C_SRV,
     "queued requests at most (503 past it)"},
    {"shutdown-timeout", NULL, F, OFF(shutdown_timeout), "30", 0, 86400, NULL, C_SRV,
     "seconds to drain running requests on SIGTERM"},
    {"header-timeout", NULL, F, OFF(header_timeout), "10", 0.01, 3600, NULL, C_SRV,
     "seconds to receive a request's headers (408 past it); also the keep-alive idle limit"},
    {"body-timeout", NULL, F, OFF(body_timeout), "30", 0.01, 3600, NULL, C_SRV,
     "seconds to receive a request's body (408 past it)"},
    {"max-output-buffer", NULL, I, OFF(max_output_buffer), "8388608", 4096, 1 << 30, NULL, C_SRV,
     "bytes queued to a slow reader before it is closed and its request cancelled"},
    {"served-model-name", NULL, S, OFF(served_model_name), "", 0, 0, NULL, C_SRV,
     "model name in the API (default: the checkpoint folder's name)"},
    /* misc */
    {"log-level", NULL, E, OFF(log_level), "info", 0, 0, "error|warn|info|debug", SD_CMD_ALL,
     "log level"},
};
const size_t sd_opt_count = SD_ARRAY_LEN(sd_opt_table);

static const struct {
    const char *name;
    unsigned bit;
} cmd_names[] = {
    {"serve", SD_CMD_SERVE},       {"generate", SD_CMD_GENERATE},
    {"logits", SD_CMD_LOGITS},     {"tokenize", SD_CMD_TOKENIZE},
    {"detokenize", SD_CMD_DETOKENIZE}, {"bench", SD_CMD_BENCH},
    {"config", SD_CMD_CONFIG},
};

unsigned sd_cmd_bit(const char *cmd)
{
    for (size_t i = 0; i < SD_ARRAY_LEN(cmd_names); i++)
        if (strcmp(cmd, cmd_names[i].name) == 0)
            return cmd_names[i].bit;
    return 0;
}

static int choice_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

static const sd_opt_def *find_opt(const char *name)
{
    for (size_t i = 0; i < sd_opt_count; i++) {
        const sd_opt_def *d = &sd_opt_table[i];
        if (strcmp(d->name, name) == 0 || (d->alias && choice_ok(d->alias, name)))
            return d;
    }
    return NULL;
}

/* SGLang's --speculative-algorithm values, mapped to ours. */
static const char *spec_alias(const char *v)
{
    static const struct {
        const char *from, *to;
    } m[] = {{"EAGLE", "eagle3"}, {"EAGLE3", "eagle3"}, {"NEXTN", "mtp"}, {"MTP", "mtp"},
             {"STANDALONE", "draft"}, {"NGRAM", "ngram"}, {"NONE", "none"}};
    for (size_t i = 0; i < SD_ARRAY_LEN(m); i++)
        if (strcasecmp(v, m[i].from) == 0)
            return m[i].to;
    return v;
}

static int set_value(sd_opts *o, const sd_opt_def *d, const char *flag, const char *v, sd_err *err)
{
    void *field = (char *)o + d->offset;
    switch (d->type) {
    case SD_OPT_ENUM:
        if (d->offset == OFF(spec))
            v = spec_alias(v);
        if (!choice_ok(d->choices, v))
            return sd_err_set(err, SD_EINVAL, "--%s: '%s' is not one of %s", flag, v, d->choices);
        /* fallthrough */
    case SD_OPT_STR: {
        char *s = strdup(v);
        if (!s)
            return sd_err_set(err, SD_ENOMEM, "--%s: out of memory", flag);
        free(*(char **)field);
        *(char **)field = s;
        return 0;
    }
    case SD_OPT_INT: {
        int64_t x;
        if (d->choices && strcmp(v, d->choices) == 0) {
            x = -1;
        } else if (sd_parse_i64(v, &x) != 0 || (double)x < d->min || (double)x > d->max) {
            return sd_err_set(err, SD_EINVAL, "--%s: '%s' is not an integer in [%.0f, %.0f]%s%s",
                              flag, v, d->min, d->max, d->choices ? " or " : "",
                              d->choices ? d->choices : "");
        }
        if (d->offset == OFF(seed) || d->offset == OFF(max_body) ||
            d->offset == OFF(max_output_buffer))
            *(long long *)field = x;
        else
            *(int *)field = (int)x;
        return 0;
    }
    case SD_OPT_FLOAT: {
        double x;
        if (sd_parse_f64(v, &x) != 0 || x < d->min || x > d->max)
            return sd_err_set(err, SD_EINVAL, "--%s: '%s' is not a number in [%g, %g]", flag, v,
                              d->min, d->max);
        *(double *)field = x;
        return 0;
    }
    case SD_OPT_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(int *)field = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(int *)field = 0;
        else
            return sd_err_set(err, SD_EINVAL, "--%s: '%s' is not true or false", flag, v);
        return 0;
    }
    return sd_err_set(err, SD_EINVAL, "--%s: bad option type", flag);
}

int sd_opts_set(sd_opts *o, unsigned cmd, const char *name, const char *value, sd_err *err)
{
    const sd_opt_def *d = find_opt(name);
    if (!d || !(d->cmds & cmd))
        return sd_err_set(err, SD_EINVAL, "unknown option --%s", name);
    return set_value(o, d, name, value, err);
}

int sd_opts_init(sd_opts *o, sd_err *err)
{
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < sd_opt_count; i++) {
        int rc = set_value(o, &sd_opt_table[i], sd_opt_table[i].name, sd_opt_table[i].def, err);
        if (rc) {
            sd_opts_free(o);
            return rc;
        }
    }
    return 0;
}

int sd_opts_fp8_keep(const sd_opts *o) { return o->fp8_weights && !strcmp(o->fp8_weights, "fp8"); }

void sd_opts_free(sd_opts *o)
{
    for (size_t i = 0; i < sd_opt_count; i++) {
        const sd_opt_def *d = &sd_opt_table[i];
        if (d->type == SD_OPT_STR || d->type == SD_OPT_ENUM) {
            char **f = (char **)((char *)o + d->offset);
            free(*f);
            *f = NULL;
        }
    }
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

int sd_opts_load_file(sd_opts *o, unsigned cmd, const char *path, sd_err *err)
{
    char *data;
    int rc = sd_read_file(path, &data, NULL, err);
    if (rc)
        return sd_err_prefix(err, "--config: ");
    int lineno = 0;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = sd_err_set(err, SD_EINVAL, "%s:%d: expected `name = value`", path, lineno);
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        const sd_opt_def *d = find_opt(key);
        if (!d) {
            rc = sd_err_set(err, SD_EINVAL, "%s:%d: unknown option '%s'", path, lineno, key);
            break;
        }
        if (!(d->cmds & cmd))
            continue; /* an option of another subcommand: the file is shared */
        rc = set_value(o, d, key, val, err);
        if (rc) {
            sd_err_prefix(err, "%s:%d: ", path, lineno);
            break;
        }
    }
    free(data);
    return rc;
}

int sd_opts_parse(sd_opts *o, unsigned cmd, int argc, char **argv, sd_err *err)
{
    int rc = sd_opts_init(o, err);
    if (rc)
        return rc;
    /* The config file first, so flags override it. */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *path = NULL;
        if (strcmp(a, "--config") == 0 && i + 1 < argc)
            path = argv[i + 1];
        else if (strncmp(a, "--config=", 9) == 0)
            path = a + 9;
        if (path && *path && (cmd & (SD_CMD_SERVE | SD_CMD_GENERATE | SD_CMD_BENCH))) {
            rc = sd_opts_load_file(o, cmd, path, err);
            if (rc)
                return rc;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return sd_err_set(err, SD_EINVAL, "unexpected argument '%s'", a);
        char name[128];
        const char *val = NULL;
        const char *eq = strchr(a + 2, '=');
        size_t nl = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (nl >= sizeof name)
            return sd_err_set(err, SD_EINVAL, "unknown option %s", a);
        memcpy(name, a + 2, nl);
        name[nl] = 0;
        const sd_opt_def *d = find_opt(name);
        int negated = 0;
        if (!d && strncmp(name, "no-", 3) == 0) {
            d = find_opt(name + 3);
            negated = d && d->type == SD_OPT_BOOL;
            if (!negated)
                d = NULL;
        }
        if (!d || !(d->cmds & cmd))
            return sd_err_set(err, SD_EINVAL, "unknown option --%s", name);
        if (eq) {
            val = eq + 1;
        } else if (d->type == SD_OPT_BOOL) {
            val = negated ? "false" : "true";
        } else {
            if (i + 1 >= argc)
                return sd_err_set(err, SD_EINVAL, "--%s: missing value", name);
            val = argv[++i];
        }
        /* SGLang counts the draft tokens verified per step (k + 1 in a chain). */
        char buf[32];
        if (strcmp(name, "speculative-num-draft-tokens") == 0) {
            int64_t x;
            if (sd_parse_i64(val, &x) || x < 1 || x > 17)
                return sd_err_set(err, SD_EINVAL, "--%s: '%s' is not an integer in [1, 17]", name,
                                  val);
            snprintf(buf, sizeof buf, "%lld", (long long)(x - 1));
            val = buf;
        }
        rc = set_value(o, d, name, val, err);
        if (rc)
            return rc;
    }
    return 0;
}

static void default_text(const sd_opt_def *d, char *buf, size_t n)
{
    if (d->def[0])
        snprintf(buf, n, "%s", d->def);
    else
        snprintf(buf, n, "\"\"");
}

void sd_opts_help(FILE *f, const char *cmd_name, unsigned cmd, const char *summary)
{
    fprintf(f, "usage: specd %s [options]\n%s\n\noptions:\n", cmd_name, summary);
    for (size_t i = 0; i < sd_opt_count; i++) {
        const sd_opt_def *d = &sd_opt_table[i];
        if (!(d->cmds & cmd))
            continue;
        char def[64], flag[96];
        default_text(d, def, sizeof def);
        snprintf(flag, sizeof flag, "--%s%s", d->name,
                 d->type == SD_OPT_BOOL ? "" : d->type == SD_OPT_ENUM ? " CHOICE" : " VALUE");
        fprintf(f, "  %-28s %s (default: %s)", flag, d->help, def);
        if (d->type == SD_OPT_ENUM)
            fprintf(f, " [%s]", d->choices);
        if (d->alias)
            fprintf(f, " (aliases: %s)", d->alias);
        fputc('\n', f);
    }
    fprintf(f, "  %-28s %s\n", "--help", "show this help");
}

void sd_opts_write_sample(FILE *f)
{
    fprintf(f, "# specd configuration: `name = value`, one per line; '#' starts a comment.\n"
               "# Use with `specd serve --config FILE`; flags on the command line override it.\n"
               "# Generated by `specd config`; every option of `specd serve` is listed with its\n"
               "# default, commented out.\n");
    for (size_t i = 0; i < sd_opt_count; i++) {
        const sd_opt_def *d = &sd_opt_table[i];
        if (!(d->cmds & SD_CMD_SERVE))
            continue;
        char def[64];
        default_text(d, def, sizeof def);
        fprintf(f, "\n# %s", d->help);
        if (d->type == SD_OPT_ENUM)
            fprintf(f, " [%s]", d->choices);
        fprintf(f, "\n# %s = %s\n", d->name, def);
    }
}

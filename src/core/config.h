/* core/config: the one option table.
 *
 * Every option of every subcommand is one row of sd_opt_table (config.c): its
 * flag, type, default, range or choices, help, and the subcommands it applies
 * to. The same table parses the command line, reads the config file
 * (`name = value` lines), prints --help, and writes the sample etc/specd.conf
 * (`specd config`). To add an option: add a field to sd_opts and a row. */
#ifndef SD_CORE_CONFIG_H
#define SD_CORE_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "core/err.h"

/* Subcommands, as a bit mask on each row. */
enum {
    SD_CMD_SERVE = 1u << 0,
    SD_CMD_GENERATE = 1u << 1,
    SD_CMD_LOGITS = 1u << 2,
    SD_CMD_TOKENIZE = 1u << 3,
    SD_CMD_DETOKENIZE = 1u << 4,
    SD_CMD_BENCH = 1u << 5,
    SD_CMD_CONFIG = 1u << 6,
};
#define SD_CMD_MODEL (SD_CMD_SERVE | SD_CMD_GENERATE | SD_CMD_LOGITS | SD_CMD_BENCH)
#define SD_CMD_ALL 0xffffu

typedef enum { SD_OPT_STR, SD_OPT_INT, SD_OPT_FLOAT, SD_OPT_BOOL, SD_OPT_ENUM } sd_opt_type;

/* Parsed options: strings are owned (free with sd_opts_free). */
typedef struct sd_opts {
    /* model and device */
    char *model;         /* checkpoint directory; NULL: the bundled model */
    char *device;        /* auto | cpu | cuda */
    int tp;              /* tensor-parallel ranks */
    int ep;              /* expert parallel (bool) */
    int moe_shared_slots; /* MoE shared experts in the expert bank (bool) */
    char *fp8_weights;   /* bf16 | fp8: block-scaled FP8 weights dequantized or kept */
    int threads;         /* CPU backend threads, 0 = all cores */
    char *tokenizer;     /* tokenizer.json or its folder */
    char *chat_template; /* auto | llama3 | chatml | deepseek3 | kimi-k2 | mistral | llama2 */
    char *reasoning_parser; /* none | think (and its other names) */
    /* one-shot commands */
    char *ids;
    char *prompt;
    char *text;
    char *out;
    /* sampling */
    int max_tokens;
    double temperature;
    double top_p;
    int top_k;
    long long seed;
    /* speculation */
    char *spec;        /* none | mtp | eagle3 | draft | ngram */
    char *draft_model; /* EAGLE-3 head or draft LM directory */
    int spec_k;        /* -1 = auto */
    double spec_margin; /* adaptive k: the gain a longer k must promise (0.02: 2%) */
    int ngram_n;       /* n-gram match length */
    char *synthetic_accept; /* benchmark only: "P1,P2,..." per-position acceptance; "": off */
    /* engine */
    int max_context;      /* 0: the model's */
    int block_size;       /* KV tokens per block */
    int kv_blocks;        /* 0: planned from memory */
    int max_batch;        /* running sequences */
    int max_batch_tokens; /* tokens per step (chunked prefill budget) */
    double mem_fraction;
    int cuda_graph_max_bs;
    int cuda_graph_prompt_rows; /* steps with prompt rows: graphs up to this many rows */
    char *launch_ahead; /* auto | on | off */
    int draft_ahead;    /* a verify step queued before its drafts reach the host */
    int prefix_cache;   /* automatic prefix caching (sched/prefix_cache.h) */
    int profile_ops; /* time every backend op (kernels/prof.c) */
    int debug_pad_steps; /* not an option: tests pad steps as graphs would, on any backend */
    /* not an option: adaptive k prices k = 0 at a queued-ahead step on any
     * backend (tests; else only where CUDA graphs run) */
    int debug_price_ahead;
    char *allreduce; /* auto | nccl | oneshot | twoshot */
    int nnodes;           /* nodes of the tensor-parallel group */
    int node_rank;        /* this node, 0..nnodes-1 */
    char *dist_init_addr; /* HOST:PORT of node 0's id exchange; "" on one node */
    /* server */
    char *host;
    int port;
    char *config;
    char *api_key;
    long long max_body;
    int max_queued;
    double shutdown_timeout;
    double header_timeout;
    double body_timeout;
    long long max_output_buffer;
    char *served_model_name;
    /* misc */
    char *log_level;
} sd_opts;

typedef struct sd_opt_def {
    const char *name;  /* flag without the leading "--" and config-file key */
    const char *alias; /* other accepted flags, "a|b" (SGLang's names), or NULL */
    sd_opt_type type;
    size_t offset; /* into sd_opts */
    const char *def;
    double min, max;     /* INT/FLOAT range */
    const char *choices; /* ENUM: "a|b|c"; INT: "auto" allowed when set to "auto" (-> -1) */
    unsigned cmds;
    const char *help;
} sd_opt_def;

extern const sd_opt_def sd_opt_table[];
extern const size_t sd_opt_count;

/* Bit of a subcommand name, or 0. */
unsigned sd_cmd_bit(const char *cmd);

/* Sets every option to its default. */
int sd_opts_init(sd_opts *o, sd_err *err);
void sd_opts_free(sd_opts *o);
/* --fp8-weights fp8: 1; bf16 (the default) or unset: 0 */
int sd_opts_fp8_keep(const sd_opts *o);

/* Sets one option by name (flag without dashes or alias) from text. */
int sd_opts_set(sd_opts *o, unsigned cmd, const char *name, const char *value, sd_err *err);

/* Parses argv (after the subcommand): defaults, then --config FILE if given,
 * then the flags. Returns 0, 1 when --help was asked, or SD_EINVAL with a
 * one-line message. Positional arguments are refused. */
int sd_opts_parse(sd_opts *o, unsigned cmd, int argc, char **argv, sd_err *err);
int sd_opts_load_file(sd_opts *o, unsigned cmd, const char *path, sd_err *err);

/* --help text of a subcommand: every flag with its default. */
void sd_opts_help(FILE *f, const char *cmd_name, unsigned cmd, const char *summary);
/* The sample config file (etc/specd.conf): every serve option, commented. */
void sd_opts_write_sample(FILE *f);

#endif

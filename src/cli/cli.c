#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"

typedef struct cmd_entry {
    const char *name;
    unsigned bit;
    int (*fn)(const sd_opts *);
    const char *summary;
} cmd_entry;

/* Weak so that a subcommand whose module is not built yet reports itself
 * missing instead of breaking the link. */
#define WEAK __attribute__((weak))
WEAK int sd_cmd_logits(const sd_opts *o);
WEAK int sd_cmd_generate(const sd_opts *o);
WEAK int sd_cmd_tokenize(const sd_opts *o);
WEAK int sd_cmd_detokenize(const sd_opts *o);
WEAK int sd_cmd_serve(const sd_opts *o);

static const cmd_entry commands[] = {
    {"serve", SD_CMD_SERVE, sd_cmd_serve, "Serve the OpenAI-compatible HTTP API."},
    {"generate", SD_CMD_GENERATE, sd_cmd_generate,
     "Generate a continuation of --prompt or --ids and print it."},
    {"logits", SD_CMD_LOGITS, sd_cmd_logits,
     "Prefill --ids and write float32 logits [n_ids, vocab] to --out."},
    {"tokenize", SD_CMD_TOKENIZE, sd_cmd_tokenize, "Print the token ids of --text as JSON."},
    {"detokenize", SD_CMD_DETOKENIZE, sd_cmd_detokenize, "Print the text of --ids."},
    {"config", SD_CMD_CONFIG, sd_cmd_config, "Print the sample config file (etc/specd.conf)."},
};

int sd_cmd_config(const sd_opts *o)
{
    (void)o;
    sd_opts_write_sample(stdout);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: specd COMMAND [options]\n\n"
               "specd: a speculative-decoding LLM server.\n\ncommands:\n");
    for (size_t i = 0; i < SD_ARRAY_LEN(commands); i++)
        if (commands[i].fn)
            fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`specd COMMAND --help` lists the options of COMMAND.\n");
}

int sd_cli_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("specd 0.1.0\n");
        return 0;
    }
    const cmd_entry *c = NULL;
    for (size_t i = 0; i < SD_ARRAY_LEN(commands); i++)
        if (!strcmp(commands[i].name, name) && commands[i].fn)
            c = &commands[i];
    if (!c) {
        fprintf(stderr, "specd: unknown command '%s' (see specd --help)\n", name);
        return 2;
    }
    sd_opts o;
    sd_err err = {0};
    int rc = sd_opts_parse(&o, c->bit, argc - 2, argv + 2, &err);
    if (rc == 1) {
        sd_opts_help(stdout, c->name, c->bit, c->summary);
        sd_opts_free(&o);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "specd %s: %s\n", c->name, err.msg);
        sd_opts_free(&o);
        return 2;
    }
    if ((rc = sd_cli_check_comm_opts(&o, c->bit, &err))) {
        fprintf(stderr, "specd %s: %s\n", c->name, err.msg);
        sd_opts_free(&o);
        return rc == SD_EINVAL ? 2 : 1;
    }
    int lvl = sd_log_parse_level(o.log_level);
    if (lvl >= 0)
        sd_log_set_level(lvl);
    rc = c->fn(&o);
    sd_opts_free(&o);
    return rc;
}

/* cli: the subcommands of the specd binary. Each takes parsed options and
 * returns the process exit status (0 ok, 1 failure, 2 usage). The dispatch
 * table in cli.c names them; main() only calls sd_cli_main. */
#ifndef SD_CLI_H
#define SD_CLI_H

#include "core/config.h"

int sd_cli_main(int argc, char **argv);
/* The tensor-parallel options checked together (comm_opts.c): SD_EINVAL for
 * an inconsistent set (usage: exit 2), SD_ENOTSUP for one not wired yet. */
int sd_cli_check_comm_opts(const sd_opts *o, unsigned cmd, sd_err *err);
/* A node other than node 0 (--node-rank > 0): runs the engine, following
 * node 0's steps until node 0 stops; the exit status. */
int sd_cli_follow(const sd_opts *o, const char *cmd);

int sd_cmd_config(const sd_opts *o);
int sd_cmd_logits(const sd_opts *o);
int sd_cmd_generate(const sd_opts *o);
int sd_cmd_tokenize(const sd_opts *o);
int sd_cmd_detokenize(const sd_opts *o);
int sd_cmd_serve(const sd_opts *o);

#endif

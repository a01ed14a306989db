/* specd: start-up only. Everything else lives in the modules. */
#include "cli/cli.h"

int main(int argc, char **argv) { return sd_cli_main(argc, argv); }

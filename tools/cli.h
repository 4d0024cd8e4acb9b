/* The command line: one function per sub-command, each in its own tools/cmd_*.c file.
 * A command returns the process exit status; errors are printed as "nightlora: <message>". */
#ifndef NL_CLI_H
#define NL_CLI_H

#include <stdint.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the sub-command name */
    const char *usage;
} nl_cli_command;

/* Print "nightlora <cmd>: <nl_last_error()>" and return 1. */
int nl_cli_fail(const char *cmd);

/* Minimal flag parsing over argv: "--name value" or "--name=value". Returns the value or
 * NULL; `flag_present` answers boolean flags. Unknown flags are reported by nl_cli_check. */
const char *nl_cli_opt(int argc, char **argv, const char *name);
int nl_cli_flag(int argc, char **argv, const char *name);
/* Every "--x" in argv must be in the NULL-terminated list `known` (names without "--");
 * `boolean` lists those that take no value. Returns 0, or prints an error and returns 1. */
int nl_cli_check(const char *cmd, int argc, char **argv, const char *const *known, const char *const *boolean);

/* Shared projection-service flags (--backend, --threads, --wire, --verbose). 0 ok, else usage error printed. */
#include "proj/proj.h"
int nl_cli_proj_config(const char *cmd, int argc, char **argv, nl_proj_config *cfg);

/* Tokenize a user prompt for generation: through the model's chat template unless raw
 * (template_name overrides the GGUF's). ids malloc'd. */
struct nl_model;
int nl_cli_render_prompt(const struct nl_model *m, const char *prompt, int raw, const char *template_name, int32_t **ids, int *n);

#include "eval/eval.h"
/* "label: N examples, ... loss, ppl, accuracy" on stdout. */
void nl_cli_print_eval(const char *label, const nl_eval_result *r);

/* JSON output on stdout: a string literal (NULL -> null) and a number (non-finite -> null:
 * JSON has no NaN). */
void nl_cli_json_str(const char *s);
void nl_cli_json_num(double v);

#endif

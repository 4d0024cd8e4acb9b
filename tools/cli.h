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
/* After a model is loaded: "nightlora <cmd>: warning: PATH: <m->warning>" when it has one. */
struct nl_model;
void nl_cli_model_warning(const char *cmd, const struct nl_model *m);

/* Minimal flag parsing over argv: "--name value" or "--name=value". Returns the value or
 * NULL; `flag_present` answers boolean flags. Unknown flags are reported by nl_cli_check. */
const char *nl_cli_opt(int argc, char **argv, const char *name);
int nl_cli_flag(int argc, char **argv, const char *name);
/* Every "--x" in argv must be in the NULL-terminated list `known` (names without "--");
 * `boolean` lists those that take no value. Returns 0, or prints an error and returns 1. */
int nl_cli_check(const char *cmd, int argc, char **argv, const char *const *known, const char *const *boolean);
/* --config FILE.json (cli_config.c): the flags of a JSON object (keys are flag names, '_' read as
 * '-'; a checkpoint directory's run.json works as is) put before the command line's, so the
 * command line wins; *argc_out and *argv_out are the merged flags (argv itself when there is no
 * --config). 0, or 1 after printing an error naming the file, line and key. */
int nl_cli_config(const char *cmd, int argc, char **argv, const char *const *known, const char *const *boolean,
                  int *argc_out, char ***argv_out);
/* The known flag an unknown one most likely means (NULL: none near): other tools' names for it
 * (--learning-rate, num_train_epochs, lora_r, ...: a table in cli_args.c), the same name with
 * '_' or capitals, else the nearest known flag by edit distance. name may start with "--";
 * *note: a remark to print with it (NULL: none). */
const char *nl_cli_suggest(const char *name, size_t len, const char *const *known, const char *const *boolean,
                           const char **note);
/* --help or -h anywhere in argv: nl_cli_check prints the command's help on stdout and the
 * process exits 0. */

/* Help (cli_help.c): the usage line, one line per flag of `known` and `boolean` with its default,
 * and the exit statuses; returns the number of flags without a description (a test counts them). */
#include <stdio.h>
int nl_cli_print_help(FILE *f, const char *cmd, const char *const *known, const char *const *boolean);
void nl_cli_print_exit_statuses(FILE *f);
/* The usage line of a command ("train --model M.gguf ..."), NULL for none (nightlora.c). */
const char *nl_cli_usage(const char *cmd);

/* Strict flag values. An integer flag takes an optional '-' and decimal digits only ("1.9",
 * "1e3" are refused), in [lo, hi]; a number flag any finite strtod text in [lo, hi] (NaN and
 * Inf are refused). Each returns 1 when the flag is given and valid (*out set), 0 when it is
 * absent (*out untouched), -1 after printing "nightlora CMD: --flag V: expected an integer in
 * [lo, hi]" (callers return 2, a usage error). */
int nl_cli_int(const char *cmd, int argc, char **argv, const char *flag, int64_t lo, int64_t hi, int64_t *out);
int nl_cli_u64(const char *cmd, int argc, char **argv, const char *flag, uint64_t *out);
int nl_cli_num(const char *cmd, int argc, char **argv, const char *flag, double lo, double hi, double *out);

/* An output never replaces an input: before anything is read or written, every output flag's
 * path (and PATH.tmp, through which it is written) is compared with every input flag's path,
 * by device + inode and by resolved path, and with the other outputs; out_dir (a flag naming a
 * directory the run writes its lock, run.json and commits into; NULL: none) must be no input
 * and hold no input under those names. NULL-terminated flag lists (names without "--"); flags
 * not given are skipped. 0, or 1 after printing a usage error naming both flags. */
int nl_cli_no_overwrite(const char *cmd, int argc, char **argv, const char *const *inputs, const char *const *outputs,
                        const char *out_dir);
/* The same for the snapshots `train --save-every N` derives from --out (nl_train_snapshot_path:
 * OUT-stepK.gguf at every multiple K of N, whatever step a run reaches, and their temp files):
 * none may be one of the files the flags `files` name. 0, or 1 after printing an error naming
 * the flag, the snapshot and its step. */
int nl_cli_no_snapshot_overwrite(const char *cmd, int argc, char **argv, const char *const *files, const char *out,
                                 int64_t every);

/* Shared projection-service flags (--backend, --threads, --wire, --verbose). 0 ok, else usage error printed. */
#include "proj/proj.h"
int nl_cli_proj_config(const char *cmd, int argc, char **argv, nl_proj_config *cfg);

/* Tokenize a user prompt for generation: through the model's chat template unless raw
 * (template_name overrides the GGUF's). ids malloc'd. */
struct nl_tokenizer;
int nl_cli_render_prompt(const struct nl_tokenizer *tok, const char *prompt, int raw, const char *template_name,
                         int32_t **ids, int *n);

/* The inference commands' service flags: nl_cli_proj_config, and with no --precision the
 * weights in their stored types ("keep"). 0, or 1 after a usage error. */
int nl_cli_infer_config(const char *cmd, int argc, char **argv, nl_proj_config *cfg);
/* The planner's verdict cache of train, check and the inference commands:
 * ${NL_MODEL_CACHE:-$HOME/.cache/nightlora}/plan (the model cache tools/fetch-models.sh uses),
 * none with --no-plan-cache or without either variable. */
void nl_cli_plan_cache(int argc, char **argv, nl_proj_config *cfg);
/* --n (default n_default), --temp, --top-p, --seed, strict and finite. 0, or 1 after a usage error. */
#include "eval/session.h"
int nl_cli_sample_params(const char *cmd, int argc, char **argv, int n_default, nl_sample_params *sp);

/* Tokens of a conversation + the generation prompt through the chat template (template_name
 * overrides the GGUF's), for generate --system and chat. ids malloc'd. */
#include "data/dataset.h"
int nl_cli_render_conv(const struct nl_tokenizer *tok, const char *template_name, const nl_chat_msg *msgs, int n_msgs,
                       int32_t **ids, int *n);

#include "eval/eval.h"
/* "label: N examples, ... loss, ppl, accuracy" on stdout. */
void nl_cli_print_eval(const char *label, const nl_eval_result *r);

/* JSON output on stdout: a string literal (NULL -> null) and a number (non-finite -> null:
 * JSON has no NaN). */
void nl_cli_json_str(const char *s);
void nl_cli_json_num(double v);

#endif

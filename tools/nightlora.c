/* nightlora: the command-line tool, thin over the library. docs/design.md §5 is its contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"
#include "util/json.h"
#include "nl_version.h"
#include "util/util.h"

void nl_cli_json_str(const char *s) {
    if (!s) {
        fputs("null", stdout);
        return;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (nl_json_escape(&buf, &n, &cap, s, strlen(s)) == 0) fwrite(buf, 1, n, stdout);
    else fputs("null", stdout);
    free(buf);
}

void nl_cli_json_num(double v) {
    if (isfinite(v)) printf("%.6g", v);
    else fputs("null", stdout);
}

int nl_cli_fail(const char *cmd) {
    fprintf(stderr, "nightlora %s: %s\n", cmd, nl_last_error());
    return 1;
}

void nl_cli_model_warning(const char *cmd, const nl_model *m) {
    if (m && m->warning) fprintf(stderr, "nightlora %s: warning: %s: %s\n", cmd, m->path, m->warning);
}

static int flag_match(const char *arg, const char *name, const char **value) {
    if (arg[0] != '-' || arg[1] != '-') return 0;
    size_t n = strlen(name);
    if (strncmp(arg + 2, name, n) != 0) return 0;
    if (arg[2 + n] == 0) {
        *value = NULL;
        return 1;
    }
    if (arg[2 + n] == '=') {
        *value = arg + 3 + n;
        return 1;
    }
    return 0;
}

const char *nl_cli_opt(int argc, char **argv, const char *name) {
    const char *found = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (flag_match(argv[i], name, &v)) {
            if (v) found = v;
            else if (i + 1 < argc) found = argv[++i];
        }
    }
    return found;
}

int nl_cli_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (flag_match(argv[i], name, &v)) return 1;
    }
    return 0;
}

static int in_list(const char *name, size_t n, const char *const *list) {
    for (; list && *list; list++)
        if (strlen(*list) == n && strncmp(*list, name, n) == 0) return 1;
    return 0;
}

int nl_cli_check(const char *cmd, int argc, char **argv, const char *const *known, const char *const *boolean) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            const int missing = nl_cli_print_help(stdout, cmd, known, boolean);
            fflush(stdout);
            exit(missing ? 3 : 0); /* 3: a flag without a description (tests/test_cli_help.c) */
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] != '-') {
            fprintf(stderr, "nightlora %s: unexpected argument '%s'\n", cmd, a);
            return 1;
        }
        const char *eq = strchr(a + 2, '=');
        size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (in_list(a + 2, n, boolean)) continue;
        if (!in_list(a + 2, n, known)) {
            const char *note, *s = nl_cli_suggest(a + 2, n, known, boolean, &note);
            if (s)
                fprintf(stderr,
                        "nightlora %s: unknown option '%.*s': did you mean --%s?%s%s (see 'nightlora help %s')\n", cmd,
                        (int)(n + 2), a, s, note ? " " : "", note ? note : "", cmd);
            else fprintf(stderr, "nightlora %s: unknown option '%s' (see 'nightlora help %s')\n", cmd, a, cmd);
            return 1;
        }
        if (!eq) {
            if (i + 1 >= argc) {
                fprintf(stderr, "nightlora %s: option '%s' needs a value\n", cmd, a);
                return 1;
            }
            i++;
        }
    }
    return 0;
}

/* Sub-commands: each lives in tools/cmd_<name>.c. */
#define NL_COMMANDS(X)                                                                                                 \
    /* X(name, function, usage) */                                                                                     \
    X("eval", nl_cmd_eval,                                                                                             \
      "eval --model M.gguf [--adapter A.gguf|DIR] --data test.jsonl|DIR (DIR/test.jsonl) [--template "                 \
      "chatml|llama3|FILE.jinja --ignore-unknown-keys] [--backend ref|host --threads N]")                              \
    X("generate", nl_cmd_generate,                                                                                     \
      "generate --model M.gguf [--adapter A.gguf|DIR] --prompt TEXT [--system TEXT] [--n N --temp T --top-p P --seed " \
      "S --raw --template chatml|llama3|FILE.jinja]")                                                                  \
    X("logits", nl_cmd_logits, "logits --model M.gguf [--adapter A.gguf|DIR] --tokens \"1 2 3\" --out L.f32")          \
    X("train", nl_cmd_train,                                                                                           \
      "train --model M.gguf --data train.jsonl|DIR (DIR/train.jsonl) --out adapter.gguf [options: nightlora train "    \
      "--help]")                                                                                                       \
    X("chat", nl_cmd_chat,                                                                                             \
      "chat --model M.gguf [--adapter A.gguf|DIR] [--system TEXT] [--n N --temp T --top-p P --seed S --template "      \
      "chatml|llama3|FILE.jinja]   (user turns from stdin, a line each)")                                              \
    X("export", nl_cmd_export,                                                                                         \
      "export --model M.gguf --adapter A.gguf|DIR --format peft|gguf --out DIR|A.gguf [--base-model NAME]   (peft: a " \
      "PEFT directory, adapter_config.json + adapter_model.safetensors)")                                              \
    X("merge", nl_cmd_merge,                                                                                           \
      "merge --model M.gguf --adapter A.gguf|DIR --out merged.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_1] [--strict] "   \
      "[service flags]")                                                                                               \
    X("report", nl_cmd_report,                                                                                         \
      "report --log train-log.jsonl --out report.html [--run CHECKPOINT_DIR or its run.json] [--title TEXT]   (one "   \
      "HTML file: losses, accuracy, lr, tokens/s, pauses, settings)")                                                  \
    X("tokenize", nl_cmd_tokenize, "tokenize --model M.gguf --text TEXT [--no-special] [--pieces]")                    \
    X("check", nl_cmd_check,                                                                                           \
      "check --model M.gguf [--backend host|ref --threads N --precision auto|f32|f16|q8_0 --precision-map MAP "        \
      "--compute f32|bf16|amx|amx-emu|sme|int8|auto --wire f32|f16] [--verbose] [--json]")                             \
    X("bench", nl_cmd_bench,                                                                                           \
      "bench peak|proj|step ... [--json]   peak: [--threads N --seconds S]   proj: --model M.gguf [--threads N "       \
      "--tokens 64,512 --reps R --compute f32|bf16|amx|amx-emu|sme|int8|auto --precision P --cold]   "                 \
      "step: --model M.gguf [--tokens T --answer-tokens N --only abcd --skip-ref --profile]")                          \
    X("mkmodel", nl_cmd_mkmodel,                                                                                       \
      "mkmodel --arch llama|qwen3|qwen35|gemma3 --preset tiny|small|llama3.2-1b|qwen3-0.6b|qwen35-0.8b|gemma3-270m "   \
      "--out M.gguf [--type f32|f16|q8_0] [--seed S]")                                                                 \
    /* end of the list */

#define NL_DECLARE(name, fn, usage) int fn(int argc, char **argv);
NL_COMMANDS(NL_DECLARE)

static const nl_cli_command commands[] = {
#define NL_ENTRY(name, fn, usage) {name, fn, usage},
    NL_COMMANDS(NL_ENTRY){NULL, NULL, NULL},
};

const char *nl_cli_usage(const char *cmd) {
    for (const nl_cli_command *c = commands; c->name; c++) {
        const size_t n = strlen(c->name);
        if (!strncmp(cmd, c->name, n) && (cmd[n] == 0 || cmd[n] == ' ')) return c->usage;
    }
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f, "usage: nightlora <command> [options]\n\ncommands:\n");
    for (const nl_cli_command *c = commands; c->name; c++) fprintf(f, "  %s\n", c->usage);
    fprintf(f, "  --version       the version and the git commit of this build\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        if (argc >= 3) {
            /* help CMD [SUB]: the command's own --help */
            for (const nl_cli_command *c = commands; c->name; c++)
                if (!strcmp(c->name, argv[2])) {
                    char *hv[4] = {argv[2], argc >= 4 ? argv[3] : "--help", "--help", NULL};
                    return c->run(argc >= 4 ? 3 : 2, hv);
                }
            fprintf(stderr, "nightlora help: unknown command '%s'\n", argv[2]);
            usage(stderr);
            return 2;
        }
        /* a bare `nightlora` is a usage error; `nightlora help` asked for this */
        usage(argc < 2 ? stderr : stdout);
        if (argc >= 2) {
            fprintf(stdout,
                    "\n'nightlora help CMD' or 'nightlora CMD --help': a command's flags and their defaults\n\n");
            nl_cli_print_exit_statuses(stdout);
        }
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("nightlora %s (commit %s)\n", NL_VERSION, NL_GIT_COMMIT);
        return 0;
    }
    for (const nl_cli_command *c = commands; c->name; c++)
        if (!strcmp(c->name, argv[1])) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "nightlora: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* nightlora train: docs/design.md §5. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/dataset.h"
#include "os/signals.h"
#include "train/plan.h"
#include "eval/report.h"
#include "train/trainer.h"
#include "util/util.h"

/* The command line as given, quoted for a shell where it needs it ("nightlora train ..."):
 * for runs.jsonl and the report. malloc'd; NULL when out of memory. */
static char *command_line(int argc, char **argv) {
    size_t cap = 16;
    for (int i = 1; i < argc; i++) cap += strlen(argv[i]) * 4 + 3;
    char *cmd = malloc(cap);
    if (!cmd) return NULL;
    size_t n = (size_t)snprintf(cmd, cap, "nightlora train");
    for (int i = 1; i < argc; i++) {
        int plain = argv[i][0] != 0 &&
                    strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./,:+@%") ==
                        strlen(argv[i]);
        cmd[n++] = ' ';
        if (!plain) cmd[n++] = '\'';
        for (const char *c = argv[i]; *c; c++) {
            if (*c == '\'' && !plain) {
                memcpy(cmd + n, "'\\''", 4);
                n += 4;
            } else cmd[n++] = *c;
        }
        if (!plain) cmd[n++] = '\'';
    }
    cmd[n] = 0;
    return cmd;
}

/* --report FILE: at the end of the run, or when it stopped early (after its commit), the
 * report of its log, with the checkpoint directory's run.json and runs.jsonl (every command of
 * the run, resumes included); without a checkpoint directory, this command line. */
static int write_report(const char *cmd, const nl_train_opts *o, const char *path) {
    nl_report_kv info[1] = {{"command", cmd}};
    nl_report_opts ro = {
        .log = o->log_json, .run_json = o->checkpoint_dir, .info = info, .n_info = o->checkpoint_dir ? 0 : 1};
    if (nl_report_write(&ro, path)) {
        fprintf(stderr, "nightlora train: --report %s: %s (the adapter is written to %s)\n", path, nl_last_error(),
                o->out);
        return 1;
    }
    fprintf(o->progress ? o->progress : stderr, "report written to %s\n", path); /* an outcome: --quiet keeps it */
    return 0;
}

/* --keep-best takes an optional value: a bare --keep-best (the next argument not "loss" or
 * "accuracy") reads as --keep-best=loss. argv is copied into buf (cap entries) when so. */
static char **keep_best_value(int *argc, char **argv, char **buf, int cap) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--keep-best")) continue;
        const char *next = i + 1 < *argc ? argv[i + 1] : "";
        if (!strcmp(next, "loss") || !strcmp(next, "accuracy")) continue;
        if (*argc >= cap) return argv;
        memcpy(buf, argv, (size_t)*argc * sizeof *argv);
        buf[i] = "--keep-best=loss";
        buf[*argc] = NULL;
        return buf;
    }
    return argv;
}

int nl_cmd_train(int argc, char **argv) {
    int user_argc = argc; /* the command line as given, for the report (argv may grow below) */
    char **user_argv = argv;
    static const char *const known[] = {"model",
                                        "data",
                                        "out",
                                        "rank",
                                        "alpha",
                                        "dropout",
                                        "lr",
                                        "lr-min",
                                        "steps",
                                        "epochs",
                                        "batch-tokens",
                                        "targets",
                                        "init-adapter",
                                        "backend",
                                        "vulkan-device",
                                        "threads",
                                        "precision",
                                        "precision-map",
                                        "wire",
                                        "compute",
                                        "checkpoint-dir",
                                        "commit-every",
                                        "act-budget-mb",
                                        "seed",
                                        "thermal",
                                        "thermal-status-file",
                                        "battery-temp-file",
                                        "log-json",
                                        "dump-grads",
                                        "warmup",
                                        "schedule",
                                        "clip",
                                        "weight-decay",
                                        "ctx",
                                        "on-long",
                                        "template",
                                        "columns",
                                        "alpaca-prompt",
                                        "stop-after",
                                        "pacing-poll-ms",
                                        "method",
                                        "mezo-eps",
                                        "mem-limit-mb",
                                        "overlap",
                                        "config",
                                        "save-every",
                                        "report",
                                        "val-data",
                                        "val-split",
                                        "eval-every",
                                        "keep-best",
                                        "early-stop",
                                        NULL};
    static const char *const boolean[] = {
        "resume",  "allow-kernel-change", "no-shuffle", "quiet", "verbose", "ignore-unknown-keys", "strict-keys",
        "dry-run", "no-plan-cache",       NULL};
    /* --config FILE.json: its flags first, then the command line's (which win) */
    if (nl_cli_config("train", argc, argv, known, boolean, &argc, &argv)) return 2;
    char *kb_args[256];
    argv = keep_best_value(&argc, argv, kb_args, 255);
    if (nl_cli_check("train", argc, argv, known, boolean)) return 2;
    nl_train_opts o;
    nl_train_defaults(&o);
    static char *cmd_line; /* static: reachable until exit */
    if (!(cmd_line = command_line(user_argc, user_argv))) return nl_cli_fail("train");
    o.command = cmd_line;
    o.model = nl_cli_opt(argc, argv, "model");
    o.data = nl_cli_opt(argc, argv, "data");
    o.out = nl_cli_opt(argc, argv, "out");
    const int dry_run = nl_cli_flag(argc, argv, "dry-run");
    if (!o.model || !o.data || (!o.out && !dry_run)) {
        fprintf(stderr, "nightlora train: --model, --data and --out are required\n");
        return 2;
    }
    /* a data directory (train.jsonl, valid.jsonl, test.jsonl): its train.jsonl is the data,
     * and the file the checks below and every message name */
    static char *train_file, *valid_file; /* static: reachable until exit */
    if (nl_data_dir_file(o.data, "train.jsonl", 1, &train_file) ||
        (train_file && nl_data_dir_file(o.data, "valid.jsonl", 0, &valid_file))) {
        nl_err_prefix("--data %s", o.data);
        return nl_cli_fail("train");
    }
    char *args[256];
    /* DIR/valid.jsonl is the validation set unless --val-data or --val-split names another */
    const int val_flag = nl_cli_opt(argc, argv, "val-data") || nl_cli_opt(argc, argv, "val-split");
    if (train_file) {
        if (argc > 250) {
            fprintf(stderr, "nightlora train: too many arguments (%d)\n", argc);
            return 2;
        }
        memcpy(args, argv, (size_t)argc * sizeof *argv);
        args[argc++] = "--data";
        args[argc++] = train_file;
        if (valid_file && !val_flag) {
            args[argc++] = "--val-data";
            args[argc++] = valid_file;
        }
        args[argc] = NULL;
        argv = args;
        o.data = train_file;
    }
    /* the validation set: --val-data, or DIR/valid.jsonl */
    o.val_data = nl_cli_opt(argc, argv, "val-data");
    static const char *const inputs[] = {
        "model", "data", "val-data", "init-adapter", "thermal-status-file", "battery-temp-file", NULL};
    static const char *const outputs[] = {"out", "log-json", "dump-grads", "report", NULL};
    const char *report = nl_cli_opt(argc, argv, "report");
    if (report && !nl_cli_opt(argc, argv, "log-json")) {
        fprintf(stderr, "nightlora train: --report %s is drawn from the per-step log: give --log-json FILE too\n",
                report);
        return 2;
    }
    if (nl_cli_no_overwrite("train", argc, argv, inputs, outputs, "checkpoint-dir")) return 2;
    if (nl_cli_proj_config("train", argc, argv, &o.proj)) return 2;
    nl_cli_plan_cache(argc, argv, &o.proj);
    const char *v;
    o.init_adapter = nl_cli_opt(argc, argv, "init-adapter");
    o.targets = nl_cli_opt(argc, argv, "targets");
    o.chat_template = nl_cli_opt(argc, argv, "template");
    o.strict_keys = nl_cli_flag(argc, argv, "strict-keys"); /* --ignore-unknown-keys: the default now */
    o.columns = nl_cli_opt(argc, argv, "columns");
    o.alpaca_prompt = nl_cli_opt(argc, argv, "alpaca-prompt");
    o.checkpoint_dir = nl_cli_opt(argc, argv, "checkpoint-dir");
    if ((v = nl_cli_opt(argc, argv, "keep-best")) && (o.keep_best = nl_train_keep_best_from_name(v)) < 0) {
        fprintf(stderr, "nightlora train: --keep-best %s: expected loss or accuracy\n", v);
        return 2;
    }
    o.resume = nl_cli_flag(argc, argv, "resume");
    o.allow_kernel_change = nl_cli_flag(argc, argv, "allow-kernel-change");
    o.shuffle = !nl_cli_flag(argc, argv, "no-shuffle");
    o.log_json = nl_cli_opt(argc, argv, "log-json");
    o.dump_grads = nl_cli_opt(argc, argv, "dump-grads");
    o.thermal_status_file = nl_cli_opt(argc, argv, "thermal-status-file");
    o.battery_temp_file = nl_cli_opt(argc, argv, "battery-temp-file");
    if (nl_cli_flag(argc, argv, "quiet"))
        o.progress = NULL; /* progress only: warnings (o.warnings) and the outcome stay */
    double x = 0;
    if ((v = nl_cli_opt(argc, argv, "thermal"))) {
        if (strcmp(v, "auto") && strcmp(v, "off")) {
            fprintf(stderr, "nightlora train: --thermal %s: expected auto or off\n", v);
            return 2;
        }
        o.thermal = v;
    }
    if ((v = nl_cli_opt(argc, argv, "overlap"))) {
        if (strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off")) {
            fprintf(stderr, "nightlora train: --overlap %s: expected auto, on or off\n", v);
            return 2;
        }
        o.overlap = v;
    }
    if ((v = nl_cli_opt(argc, argv, "schedule"))) {
        if (strcmp(v, "cosine") && strcmp(v, "constant")) {
            fprintf(stderr, "nightlora train: --schedule %s: expected cosine or constant\n", v);
            return 2;
        }
        o.cosine = !strcmp(v, "cosine");
    }
    if (nl_cli_opt(argc, argv, "lr-min") && !o.cosine) {
        fprintf(stderr, "nightlora train: --lr-min is the cosine schedule's floor: drop it with --schedule constant\n");
        return 2;
    }
    if ((v = nl_cli_opt(argc, argv, "on-long"))) {
        if (strcmp(v, "truncate") && strcmp(v, "refuse")) {
            fprintf(stderr, "nightlora train: --on-long %s: expected truncate or refuse\n", v);
            return 2;
        }
        o.refuse_long = !strcmp(v, "refuse");
    }
    if (o.init_adapter && (nl_cli_opt(argc, argv, "alpha") || nl_cli_opt(argc, argv, "targets"))) {
        fprintf(
            stderr,
            "nightlora train: --init-adapter takes rank, alpha and targets from the adapter; drop --alpha/--targets\n");
        return 2;
    }
    if ((v = nl_cli_opt(argc, argv, "method"))) {
        if (strcmp(v, "backprop") && strcmp(v, "mezo")) {
            fprintf(stderr, "nightlora train: --method %s: expected backprop or mezo\n", v);
            return 2;
        }
        o.method = v;
        /* MeZO's update lr·g·z has norm ≈ lr·|g|·sqrt(n): its default lr is the paper's LoRA one */
        if (!strcmp(v, "mezo")) o.lr = 1e-4;
    }
    if (nl_cli_opt(argc, argv, "mezo-eps") && !(o.method && !strcmp(o.method, "mezo"))) {
        fprintf(stderr, "nightlora train: --mezo-eps needs --method mezo\n");
        return 2;
    }
    if (nl_cli_opt(argc, argv, "steps") && nl_cli_opt(argc, argv, "epochs")) {
        fprintf(stderr, "nightlora train: give --steps or --epochs, not both\n");
        return 2;
    }
    /* integers parsed strictly, numbers finite, each in its range (cli.h) */
    int64_t iv;
    uint64_t uv;
#define INT(flag, dst)                                                                                                 \
    if ((r = nl_cli_int("train", argc, argv, flag, (int64_t)nl_train_range_of(flag)->lo,                               \
                        (int64_t)nl_train_range_of(flag)->hi, &iv)) < 0)                                               \
        return 2;                                                                                                      \
    if (r) dst = iv;
#define NUM(flag, dst)                                                                                                 \
    if ((r = nl_cli_num("train", argc, argv, flag, nl_train_range_of(flag)->lo, nl_train_range_of(flag)->hi, &x)) < 0) \
        return 2;                                                                                                      \
    if (r) dst = x;
    int r;
    /* the ranges: train/options.c, the table nl_train checks every caller's options against */
    INT("rank", o.rank)
    NUM("alpha", o.alpha)
    NUM("dropout", o.dropout)
    NUM("lr", o.lr)
    NUM("lr-min", o.lr_min)
    INT("steps", o.steps)
    NUM("epochs", o.epochs)
    INT("batch-tokens", o.batch_tokens)
    INT("commit-every", o.commit_every)
    INT("save-every", o.save_every)
    INT("act-budget-mb", o.act_budget_mb)
    if ((r = nl_cli_u64("train", argc, argv, "seed", &uv)) < 0) return 2;
    if (r) o.seed = uv;
    INT("warmup", o.warmup)
    NUM("clip", o.clip)
    NUM("weight-decay", o.weight_decay)
    INT("ctx", o.max_ctx)
    INT("stop-after", o.stop_after)
    NUM("pacing-poll-ms", o.pacing_poll_s) /* testing only; not in the usage */
    NUM("mezo-eps", o.mezo_eps)
    NUM("mem-limit-mb", o.mem_limit_mb)
    NUM("val-split", o.val_split)
    INT("eval-every", o.eval_every)
    INT("early-stop", o.early_stop)
    o.count_process = 1; /* --mem-limit-mb bounds this process, what it held before the run included */
    o.pacing_poll_s /= 1000.0;
#undef INT
#undef NUM
    /* the examples as rendered and the step plan; no service, nothing written */
    if (dry_run) return nl_train_dry_run(&o, 3, stdout) ? nl_cli_fail("train") : 0;
    /* the snapshots' paths are derived from --out: none may be an input or another output */
    static const char *const files[] = {
        "model",    "data",       "val-data", "init-adapter", "thermal-status-file", "battery-temp-file",
        "log-json", "dump-grads", NULL};
    if (o.save_every > 0 && nl_cli_no_snapshot_overwrite("train", argc, argv, files, o.out, o.save_every)) return 2;
    if (o.init_adapter) o.init_rank = nl_cli_opt(argc, argv, "rank") ? o.rank : 0; /* must match the file's */
    if (o.val_data && o.val_split > 0) {
        fprintf(stderr, "nightlora train: give --val-data or --val-split, not both\n");
        return 2;
    }
    if ((o.eval_every || o.keep_best || o.early_stop) && !o.val_data && !(o.val_split > 0)) {
        fprintf(stderr,
                "nightlora train: --%s needs a validation set: --val-data FILE or --val-split F (or --data DIR with a "
                "valid.jsonl)\n",
                o.eval_every  ? "eval-every"
                : o.keep_best ? "keep-best"
                              : "early-stop");
        return 2;
    }
    /* SIGINT / SIGTERM cancel this run: a commit at the next step boundary, exit 3; a second
     * one ends the process at once (os/signals.h) */
    nl_cancel cancel = {0};
    o.cancel = &cancel;
    if (nl_signals_install(&cancel)) return nl_cli_fail("train");
    /* said at once: a big step may take a minute to end */
    if (o.checkpoint_dir)
        nl_signals_notes(
            "\nnightlora train: stopping at the end of this step: it commits there and writes the adapter (signal "
            "again to stop at once)\n",
            "\nnightlora train: stopped at once: this step is lost, the last commit is kept (--resume continues "
            "from it)\n");
    else
        nl_signals_notes(
            "\nnightlora train: stopping at the end of this step, where the adapter is written (signal again to "
            "stop at once)\n",
            "\nnightlora train: stopped at once: nothing was written (no --checkpoint-dir: the run must start "
            "again)\n");
    nl_train_result res;
    int rc = nl_train(&o, &res);
    nl_signals_restore();
    nl_signals_notes(NULL, NULL);
    if (rc) return nl_cli_fail("train");
    /* the run's outcome (done, early stop, stopped; where the adapter or the best one is) is no
     * progress line: --quiet keeps it */
    {
        FILE *say = o.progress ? o.progress : stderr;
        char ev[160] = "", best[320] = "";
        if (res.n_evals)
            snprintf(ev, sizeof ev, ", %d evaluation%s %.1f s", res.n_evals, res.n_evals == 1 ? "" : "s",
                     res.eval_seconds);
        if (o.keep_best && res.best_step > 0)
            snprintf(best, sizeof best, "; the best adapter (step %lld, val loss %.4f) is in %s",
                     (long long)res.best_step, res.best_loss, o.out);
        fprintf(say,
                "%s after %lld/%lld steps: loss %.4f -> %.4f, %lld tokens in %.1f s (service %.1f s, paused %.1f "
                "s%s)%s%s%s\n",
                res.stopped         ? "stopped"
                : res.early_stopped ? "early stop"
                                    : "done",
                (long long)res.steps_done, (long long)res.total_steps, res.first_loss, res.last_loss,
                (long long)res.tokens, res.seconds, res.service_seconds, res.paused_seconds, ev, best[0] ? best : "",
                best[0] ? "" : "; adapter written to ", best[0] ? "" : o.out);
    }
    if (report && write_report(cmd_line, &o, report)) return 1;
    /* a stop by SIGINT/SIGTERM after its commit: distinct from done (0), so that a script can
     * tell the run is not finished (--resume continues it) */
    return res.stopped && res.signalled ? 3 : 0;
}

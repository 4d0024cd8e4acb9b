/* test_cli_help: the command line explains itself. `CMD --help` on every command exits 0 with a
 * line for every flag the command accepts (a flag with no description exits 3: the test fails
 * until tools/cli_help.c has its row); the defaults train --help states are nl_train_defaults';
 * `help CMD` prints the same text; `help nosuch`, an unknown command and a bare `nightlora`
 * exit 2; tokenize --pieces lists ids and pieces; generate --system and chat render through the
 * chat template (chat's first greedy reply is generate's); train --config reruns a run.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "test.h"
#include "model/model.h"
#include "model/quant.h"
#include "train/trainer.h"

static char dir[256], out[512], err[512];

static int cli(const char *const *args) {
    const char *argv[160] = {NL_CLI};
    int n = 1;
    for (; args[n - 1] && n < 159; n++) argv[n] = args[n - 1];
    if (args[n - 1]) {
        fprintf(stderr, "cli: more than %d arguments\n", n - 1);
        return -1;
    }
    argv[n] = NULL;
    return nl_t_run(argv, err, out);
}

/* cli with stdin from a file */
static int cli_in(const char *const *args, const char *in) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(in, "r", stdin)) _exit(126);
        const char *argv[64] = {NL_CLI};
        int n = 1;
        for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
        argv[n] = NULL;
        if (!freopen(err, "w", stderr) || !freopen(out, "w", stdout)) _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return nl_t_wait(pid);
}

static char *slurp_out(void) {
    size_t n;
    char *s = nl_t_slurp(out, &n);
    return s ? s : calloc(1, 1);
}

/* "--flag ARG   text (default X)": X as a number */
static double help_default(const char *help, const char *flag) {
    char key[64];
    snprintf(key, sizeof key, "\n  --%s ", flag);
    const char *p = strstr(help, key);
    if (!p) return NAN;
    const char *eol = strchr(p + 1, '\n');
    const char *d = strstr(p, "(default ");
    if (!d || (eol && d > eol)) return NAN;
    return strtod(d + 9, NULL);
}

static void test_help_all(void) {
    static const char *const cmds[][3] = {{"train"},   {"eval"},          {"logits"},       {"generate"},
                                          {"chat"},    {"merge"},         {"tokenize"},     {"check"},
                                          {"mkmodel"}, {"bench", "proj"}, {"bench", "step"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *a[4] = {cmds[i][0], cmds[i][1] ? cmds[i][1] : "--help", cmds[i][1] ? "--help" : NULL, NULL};
        int rc = cli(a);
        char *h = slurp_out();
        CHECKF(rc == 0, "%s %s --help: exit %d (3: a flag without a description)", cmds[i][0],
               cmds[i][1] ? cmds[i][1] : "", rc);
        CHECKF(strstr(h, "usage: nightlora ") && strstr(h, "options:") && strstr(h, "exit status:"),
               "%s --help: %.200s", cmds[i][0], h);
        CHECKF(!strstr(h, "(no description)"), "%s --help has a flag without a description", cmds[i][0]);
        /* `help CMD [SUB]` is the same text */
        const char *b[4] = {"help", cmds[i][0], cmds[i][1], NULL};
        CHECK(cli(b) == 0);
        char *h2 = slurp_out();
        CHECKF(!strcmp(h, h2), "help %s differs from %s --help", cmds[i][0], cmds[i][0]);
        free(h);
        free(h2);
    }
    /* train --help names each flag once, with the library's defaults */
    const char *a[] = {"train", "--help", NULL};
    CHECK(cli(a) == 0);
    char *h = slurp_out();
    static const char *const flags[] = {"model",  "data",           "out",      "rank", "lr", "steps", "epochs",
                                        "resume", "checkpoint-dir", "log-json", "quiet"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "\n  --%s", flags[i]);
        CHECKF(strstr(h, key) != NULL, "train --help lacks --%s", flags[i]);
    }
    nl_train_opts o;
    nl_train_defaults(&o);
    struct {
        const char *flag;
        double want;
    } d[] = {
        {"rank", o.rank},
        {"alpha", o.alpha},
        {"dropout", o.dropout},
        {"lr", o.lr},
        {"epochs", o.epochs},
        {"clip", o.clip},
        {"commit-every", (double)o.commit_every},
        {"seed", (double)o.seed},
        {"mezo-eps", o.mezo_eps},
        {"warmup", (double)o.warmup},
        {"weight-decay", o.weight_decay},
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        double got = help_default(h, d[i].flag);
        CHECKF(fabs(got - d[i].want) <= 1e-6 * fabs(d[i].want), "train --help: --%s default %g, the library's is %g",
               d[i].flag, got, d[i].want);
    }
    /* the library's batch is sized to the data (0), and the help says so */
    CHECKF(o.batch_tokens == 0 &&
               strstr(h, "(default: sized to the data, the largest of 4096, 2048, ... with at least 20 steps an epoch"),
           "train --help: --batch-tokens: the library's default is %d", o.batch_tokens);
    free(h);
}

static void test_usage_errors(void) {
    const char *a[] = {"help", "nosuch", NULL};
    CHECK(cli(a) == 2);
    CHECK(nl_t_file_has(err, "unknown command 'nosuch'"));
    const char *b[] = {"nosuch", NULL};
    CHECK(cli(b) == 2);
    const char *c[] = {NULL};
    CHECK(cli(c) == 2);
    const char *d[] = {"help", NULL};
    CHECK(cli(d) == 0);
    CHECK(nl_t_file_has(out, "exit status:"));
    const char *e[] = {"train", "--nosuch", "1", NULL};
    CHECK(cli(e) == 2);
    CHECK(nl_t_file_has(err, "unknown option '--nosuch'"));
}

static void test_pieces_chat(const char *model) {
    const char *a[] = {"tokenize", "--model", model, "--text", "Hello <|im_start|> world", "--pieces", NULL};
    CHECK(cli(a) == 0);
    char *p = slurp_out();
    const char *b[] = {"tokenize", "--model", model, "--text", "Hello <|im_start|> world", NULL};
    CHECK(cli(b) == 0);
    char *ids = slurp_out();
    /* the ids of --pieces, in order, are tokenize's; each line "ID \"piece\"" */
    char joined[4096] = "";
    int lines = 0, control = 0;
    for (char *s = p, *e; *s; s = e + 1) {
        e = strchr(s, '\n');
        if (!e) break;
        *e = 0;
        char *sp = strchr(s, ' ');
        CHECKF(sp && sp[1] == '"', "tokenize --pieces line: %s", s);
        if (!sp) break;
        *sp = 0;
        snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", lines ? " " : "", s);
        control += strstr(sp + 1, "\" control") != NULL;
        lines++;
    }
    CHECKF(!strncmp(joined, ids, strlen(joined)) && ids[strlen(joined)] == '\n', "pieces ids '%s' vs tokenize '%s'",
           joined, ids);
    CHECKF(control == 1, "%d control tokens marked (want 1: <|im_start|>)", control);
    CHECK(lines >= 4);
    free(p);
    free(ids);

    /* generate --system: a different prompt than without it, so (greedy) it may differ, and it
     * is refused with --raw */
    const char *g[] = {"generate", "--model",       model, "--prompt", "note: buy milk",
                       "--system", "Tag the note.", "--n", "4",        NULL};
    CHECK(cli(g) == 0);
    char *gen = slurp_out();
    const char *graw[] = {"generate", "--model", model, "--prompt", "x", "--system", "y", "--raw", NULL};
    CHECK(cli(graw) == 2);
    /* chat: two turns from stdin; its first greedy reply is generate's for the same turns */
    char in[512];
    snprintf(in, sizeof in, "%s/turns.txt", dir);
    FILE *f = fopen(in, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("note: buy milk\n\nand another one\n", f);
    fclose(f);
    const char *c[] = {"chat", "--model", model, "--system", "Tag the note.", "--n", "4", NULL};
    CHECK(cli_in(c, in) == 0);
    char *chat = slurp_out();
    CHECKF(!strncmp(chat, gen, strlen(gen)), "chat's first reply differs from generate's:\n%s\nvs\n%s", chat, gen);
    CHECKF(strlen(chat) > strlen(gen), "chat printed no second reply");
    free(gen);
    free(chat);
}

/* train --config: a checkpoint directory's run.json reruns the run bit for bit; the command line
 * wins over it; a key that is no flag, a value of the wrong kind and a non-object are errors
 * naming the file, line and column. */
static void test_config(const char *model) {
    char data[600], ck[600], a1[600], a2[600], a3[600], cfg[600], bad[600];
    snprintf(data, sizeof data, "%s/../../examples/tagging-train.jsonl", NL_TEST_DATA);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(a1, sizeof a1, "%s/a1.gguf", dir);
    snprintf(a2, sizeof a2, "%s/a2.gguf", dir);
    snprintf(a3, sizeof a3, "%s/a3.gguf", dir);
    snprintf(cfg, sizeof cfg, "%s/run-copy.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    const char *t1[] = {"train", "--model",      model,     "--data",
                        data,    "--out",        a1,        "--steps",
                        "3",     "--lr",         "1e-3",    "--batch-tokens",
                        "256",   "--rank",       "4",       "--checkpoint-dir",
                        ck,      "--no-shuffle", "--quiet", NULL};
    CHECK(cli(t1) == 0);
    char runjson[700];
    snprintf(runjson, sizeof runjson, "%s/run.json", ck);
    size_t n;
    char *rj = nl_t_slurp(runjson, &n);
    CHECK(rj != NULL);
    if (!rj) return;
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fwrite(rj, 1, n, f);
    fclose(f);
    free(rj);
    const char *t2[] = {"train", "--config", cfg, "--out", a2, "--quiet", NULL};
    CHECK(cli(t2) == 0);
    CHECKF(nl_t_same_file(a1, a2), "train --config run.json did not rerun the run bit for bit");
    const char *t3[] = {"train", "--config", cfg, "--out", a3, "--lr", "3e-3", "--quiet", NULL};
    CHECK(cli(t3) == 0);
    CHECKF(!nl_t_same_file(a1, a3), "--lr on the command line did not win over the config's");
    /* Every flag of train is replayed by run.json or named here as no setting of the run. Two runs
     * set every recorded flag between them (flags that exclude each other: --alpha/--targets and
     * --init-adapter, --val-split and --val-data, --steps and --epochs, backprop and MeZO), and
     * each replays from its run.json alone, bit for bit, snapshots included. The first's data
     * lies under a path longer than run.json's values once held (200 chars; before: run.json
     * kept 32 keys and dropped data_path past them), its columns renamed (--columns). The flags
     * come from `train --help`, which lists every flag the command accepts: a new flag fails
     * here until it is recorded or listed below. */
    static const char *const recorded[][2] = {{"model", "model_path"},
                                              {"data", "data_path"},
                                              {"rank", "rank"},
                                              {"alpha", "alpha"},
                                              {"dropout", "dropout"},
                                              {"lr", "lr"},
                                              {"lr-min", "lr_min"},
                                              {"steps", "steps"},
                                              {"epochs", "steps"},
                                              {"batch-tokens", "batch_tokens"},
                                              {"targets", "targets"},
                                              {"init-adapter", "init_adapter"},
                                              {"backend", "backend"},
                                              {"precision", "precision"},
                                              {"precision-map", "precision_map"},
                                              {"wire", "wire"},
                                              {"compute", "compute"},
                                              {"commit-every", "commit_every"},
                                              {"seed", "seed"},
                                              {"thermal", "thermal"},
                                              {"warmup", "warmup"},
                                              {"schedule", "schedule"},
                                              {"clip", "clip"},
                                              {"weight-decay", "weight_decay"},
                                              {"ctx", "ctx"},
                                              {"on-long", "on_long"},
                                              {"template", "template"},
                                              {"columns", "columns"},
                                              {"alpaca-prompt", "alpaca_prompt"},
                                              {"method", "method"},
                                              {"mezo-eps", "mezo_eps"},
                                              {"overlap", "overlap"},
                                              {"save-every", "save_every"},
                                              {"val-data", "val_data_path"},
                                              {"val-split", "val_split"},
                                              {"eval-every", "eval_every"},
                                              {"keep-best", "keep_best"},
                                              {"early-stop", "early_stop"},
                                              {"no-shuffle", "shuffle"},
                                              {"strict-keys", "strict_keys"}};
    static const char *const not_settings[] = {
        /* what the run writes and how the process runs: a replay names its own */
        "out", "checkpoint-dir", "log-json", "dump-grads", "report", "config", "resume", "dry-run", "stop-after",
        "help",
        /* this machine's, never the result's (bit-identical for any thread count or budget) */
        "threads", "act-budget-mb", "mem-limit-mb", "vulkan-device", "thermal-status-file", "battery-temp-file",
        "pacing-poll-ms", "no-plan-cache", "verbose", "quiet", "allow-kernel-change",
        /* the default's old name: no effect */
        "ignore-unknown-keys"};
    char ldir[900], ldata[1000], ck2[700], b1[700], b2[700], cfg2[700], ck3[700], c1[700], c2[700], cfg3[700], val[700];
    snprintf(ldir, sizeof ldir, "%s/%s", dir,
             "a-data-folder-whose-name-is-long-enough-to-make-the-path-longer-than-two-hundred-characters-"
             "as-a-path-on-a-phone-or-in-a-synced-home-folder-may-well-be-once-the-user-has-nested-their-"
             "personal-notes-a-few-levels-deep");
    CHECK(mkdir(ldir, 0777) == 0);
    snprintf(ldata, sizeof ldata, "%s/train.jsonl", ldir);
    CHECK(strlen(ldata) > 240);
    rj = nl_t_slurp(data, &n);
    f = rj ? fopen(ldata, "w") : NULL;
    CHECK(f != NULL);
    if (!f) {
        free(rj);
        return;
    }
    /* "prompt" -> "question", "completion" -> "answer": read back by --columns */
    for (const char *p = rj; *p;) {
        const char *pr = strstr(p, "\"prompt\": "), *c = strstr(p, "\"completion\": ");
        const char *q = pr && (!c || pr < c) ? pr : c;
        if (!q) {
            fputs(p, f);
            break;
        }
        fwrite(p, 1, (size_t)(q - p), f);
        fputs(q == pr ? "\"question\": " : "\"answer\": ", f);
        p = q + (q == pr ? strlen("\"prompt\": ") : strlen("\"completion\": "));
    }
    fclose(f);
    free(rj);
    snprintf(ck2, sizeof ck2, "%s/ck-all", dir);
    snprintf(b1, sizeof b1, "%s/b1.gguf", dir);
    snprintf(b2, sizeof b2, "%s/b2.gguf", dir);
    snprintf(cfg2, sizeof cfg2, "%s/run-all.json", dir);
    snprintf(ck3, sizeof ck3, "%s/ck-all2", dir);
    snprintf(c1, sizeof c1, "%s/c1.gguf", dir);
    snprintf(c2, sizeof c2, "%s/c2.gguf", dir);
    snprintf(cfg3, sizeof cfg3, "%s/run-all2.json", dir);
    snprintf(val, sizeof val, "%s/../../examples/tagging-test.jsonl", NL_TEST_DATA);
    const char *t4[] = {"train",
                        "--model",
                        model,
                        "--data",
                        ldata,
                        "--out",
                        b1,
                        "--steps",
                        "4",
                        "--lr",
                        "2e-3",
                        "--lr-min",
                        "1e-4",
                        "--schedule",
                        "cosine",
                        "--warmup",
                        "1",
                        "--batch-tokens",
                        "200",
                        "--rank",
                        "3",
                        "--alpha",
                        "5",
                        "--dropout",
                        "0.1",
                        "--clip",
                        "0.5",
                        "--weight-decay",
                        "0.01",
                        "--seed",
                        "9",
                        "--ctx",
                        "48",
                        "--on-long",
                        "truncate",
                        "--targets",
                        "q,v,down",
                        "--no-shuffle",
                        "--val-split",
                        "0.2",
                        "--eval-every",
                        "2",
                        "--keep-best",
                        "loss",
                        "--early-stop",
                        "3",
                        "--precision",
                        "q8_0",
                        "--precision-map",
                        "head=q8_0",
                        "--wire",
                        "f16",
                        "--method",
                        "backprop",
                        "--template",
                        "chatml",
                        "--columns",
                        "prompt=question,completion=answer",
                        "--alpaca-prompt",
                        "alpaca",
                        "--strict-keys",
                        "--backend",
                        "host",
                        "--compute",
                        "f32",
                        "--commit-every",
                        "2",
                        "--save-every",
                        "2",
                        "--thermal",
                        "off",
                        "--overlap",
                        "off",
                        "--checkpoint-dir",
                        ck2,
                        "--quiet",
                        NULL};
    /* from an adapter (t1's), MeZO, a validation file, --epochs */
    const char *t6[] = {"train", "--model",        model,  "--data",    data,     "--out",
                        c1,      "--init-adapter", a1,     "--rank",    "4",      "--method",
                        "mezo",  "--mezo-eps",     "2e-3", "--epochs",  "0.1",    "--batch-tokens",
                        "256",   "--val-data",     val,    "--on-long", "refuse", "--checkpoint-dir",
                        ck3,     "--quiet",        NULL};
    const char *const *runs[2] = {t4, t6};
    const char *const ckdirs[2] = {ck2, ck3};
    CHECK(cli(t4) == 0);
    /* --quiet hides the progress, never the outcome: the done / early-stop line, the best adapter */
    CHECKF((nl_t_file_has(err, "done after") || nl_t_file_has(err, "early stop after")) &&
               nl_t_file_has(err, "best adapter") && !nl_t_file_has(err, "step 1/"),
           "train --quiet: the run's outcome is not on stderr, or progress is");
    const int rc6 = cli(t6);
    CHECKF(rc6 == 0, "train --init-adapter --method mezo --epochs --val-data: exit %d", rc6);
    char *rjs[2];
    for (int r = 0; r < 2; r++) {
        char p[800];
        snprintf(p, sizeof p, "%s/run.json", ckdirs[r]);
        rjs[r] = nl_t_slurp(p, NULL);
        CHECKF(rjs[r] != NULL, "no %s", p);
        if (!rjs[r]) rjs[r] = calloc(1, 1);
    }
    CHECKF(strstr(rjs[0], ldata) != NULL, "run.json does not hold the data's whole path");
    /* the flags of train --help */
    const char *hl[] = {"train", "--help", NULL};
    CHECK(cli(hl) == 0);
    char *help = slurp_out();
    int n_flags = 0;
    for (const char *p = help; (p = strstr(p, "\n  --")) != NULL;) {
        p += 5;
        char flag[64];
        size_t k = 0;
        while (k + 1 < sizeof flag && (p[k] == '-' || (p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9'))) {
            flag[k] = p[k];
            k++;
        }
        flag[k] = 0;
        n_flags++;
        int listed = 0;
        for (size_t i = 0; i < sizeof not_settings / sizeof *not_settings; i++)
            listed |= !strcmp(flag, not_settings[i]);
        const char *key = NULL;
        for (size_t i = 0; i < sizeof recorded / sizeof *recorded; i++)
            if (!strcmp(flag, recorded[i][0])) key = recorded[i][1];
        CHECKF(listed || key,
               "train --%s is neither recorded in run.json nor listed as no setting of the run (test_cli_help.c)",
               flag);
        if (!key) continue;
        /* set in one of the two runs, and that run's run.json has its key */
        char dashed[72], quoted[72];
        snprintf(dashed, sizeof dashed, "--%s", flag);
        snprintf(quoted, sizeof quoted, "\"%s\": ", key);
        int in = -1;
        for (int r = 0; r < 2 && in < 0; r++)
            for (const char *const *a = runs[r]; *a; a++)
                if (!strcmp(*a, dashed)) in = r;
        CHECKF(in >= 0, "train --%s is set in neither run of the replay test", flag);
        if (in >= 0) CHECKF(strstr(rjs[in], quoted) != NULL, "train --%s: its run.json has no %s", flag, quoted);
    }
    CHECKF(n_flags > 50, "train --help lists %d flags", n_flags);
    free(help);
    /* each replays from its run.json alone, bit for bit */
    const char *const firsts[2] = {b1, c1}, *const seconds[2] = {b2, c2}, *const cfgs[2] = {cfg2, cfg3};
    for (int r = 0; r < 2; r++) {
        f = fopen(cfgs[r], "w");
        CHECK(f != NULL);
        if (!f) break;
        fputs(rjs[r], f);
        fclose(f);
        const char *t5[] = {"train", "--config", cfgs[r], "--out", seconds[r], "--quiet", NULL};
        const int rc5 = cli(t5);
        CHECKF(rc5 == 0, "train --config run.json of the run with every option (%d): exit %d", r, rc5);
        CHECKF(nl_t_same_file(firsts[r], seconds[r]),
               "train --config run.json of the run with every option (%d) did not rerun it bit for bit", r);
    }
    /* the snapshots too (--save-every 2: steps 2 and 4) */
    for (int k = 2; k <= 4; k += 2) {
        char s1[800], s2[800];
        snprintf(s1, sizeof s1, "%s/b1-step%d.gguf", dir, k);
        snprintf(s2, sizeof s2, "%s/b2-step%d.gguf", dir, k);
        CHECKF(nl_t_same_file(s1, s2), "the replay's snapshot of step %d differs from the run's (or is missing)", k);
    }
    free(rjs[0]);
    free(rjs[1]);
    static const char *const bads[][2] = {
        {"{\n  \"rank\": 8,\n  \"nosuch\": 1\n}\n", "bad.json:3:3: key \"nosuch\" is no flag of train"},
        {"{\"rank\": [8]}", "bad.json:1:10: \"rank\": a list must hold strings without commas"},
        {"{\"rank\": {\"a\": 1}}", "bad.json:1:10: \"rank\": expected a string, number or boolean, got object"},
        {"[1, 2]", "bad.json:1:1: expected a JSON object of flags"},
        {"{\"rank\": 8,}", "bad.json:1:"},
        {"{\"lr\": true}", "\"lr\" takes a value, not true"},
        {"{\"rank\": \"1.5\"}", "--rank 1.5: expected an integer"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        f = fopen(bad, "w");
        if (!f) break;
        fputs(bads[i][0], f);
        fclose(f);
        const char *t[] = {"train", "--config", bad, "--model", model, "--data", data, "--out", a3, NULL};
        const int rc = cli(t);
        CHECKF(rc == 2 && nl_t_file_has(err, bads[i][1]), "config %s: exit %d, want 2 and '%s'", bads[i][0], rc,
               bads[i][1]);
    }
}

/* --quiet hides the progress, never a warning, a data note or the outcome: a run whose data has a
 * key no format reads, with a --save-every beyond its steps and too few steps to learn, says all
 * three and its done line, and no step line (before: the warnings went with the progress) */
static void test_quiet(const char *model) {
    char data[600], a[600];
    snprintf(data, sizeof data, "%s/extra-key.jsonl", dir);
    snprintf(a, sizeof a, "%s/quiet.gguf", dir);
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"note %d: buy milk\", \"completion\": \" shopping\", \"source\": \"phone\"}\n", i);
    fclose(f);
    const char *t[] = {"train", "--model",        model, "--data",       data, "--out",   a,   "--steps",
                       "2",     "--batch-tokens", "64",  "--save-every", "50", "--quiet", NULL};
    CHECK(cli(t) == 0);
    static const char *const want[] = {"data: 8 keys no format reads skipped (the first \"source\" on line 1",
                                       "warning: --save-every 50 is beyond this run's 2 steps",
                                       "warning: only 2 optimizer steps", "done after 2/2 steps"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(nl_t_file_has(err, want[i]), "train --quiet: no '%s' on stderr", want[i]);
    CHECKF(!nl_t_file_has(err, "step 1/") && !nl_t_file_has(err, "training "), "train --quiet printed progress");
}

int main(void) {
    if (nl_t_tmpdir(dir, sizeof dir, "cli_help")) return 1;
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    char model[512];
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    test_help_all();
    test_usage_errors();
    test_pieces_chat(model);
    test_config(model);
    test_quiet(model);
    nl_t_tmpdir_done(dir);
    return nl_t_done();
}

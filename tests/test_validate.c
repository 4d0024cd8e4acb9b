/* Validation during training, the best adapter kept and early stop, through the real CLI
 * (NL_CLI), on a tiny Q8_0 qwen3 (the training's resident types are the file's, so `eval` computes
 * with the training's numerics):
 *  - --val-data with --eval-every 2: one {"eval": {...}} row after steps 2, 4, 6 with exactly the
 *    keys step, loss, accuracy, examples, tokens, seconds; the last row's loss and accuracy are
 *    what `nightlora eval --adapter OUT` prints on the same file (to its printed precision);
 *    the progress shows each evaluation; validating does not change what is trained (the
 *    adapter equals that of a run without it);
 *  - --val-split 0.25: 3 of the 14 lines held out (11 trained on), one evaluation at the end;
 *  - --keep-best: --out equals the adapter of the best evaluation's step (a run of that many
 *    steps, constant schedule), and the progress and final lines name the step;
 *  - --early-stop 2: the run ends at the evaluation the uninterrupted run's losses say (the
 *    second in a row without improvement), exit 0, --out the best;
 *  - resume: the same run stopped after commits (--stop-after) or SIGKILLed after a commit, then
 *    --resume: the same final adapter, the same stop step, the same evaluation rows;
 *  - refusals: validation flags without a validation set, --keep-best accuracy without choices,
 *    --keep-best with another word, --val-data with --val-split. */
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/json.h"
#include "util/util.h"

static char tmp[256], model[512], data[512], val[512], val_nochoice[512];

static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                              "Send the report to the team", "Refill at the physio",       "Renew the passport",
                              "Pick up the kids at five",    "Dentist at nine on Monday"};

static void make_inputs(void) {
    snprintf(model, sizeof model, "%s/q3.gguf", tmp);
    snprintf(data, sizeof data, "%s/train.jsonl", tmp);
    snprintf(val, sizeof val, "%s/valid.jsonl", tmp);
    snprintf(val_nochoice, sizeof val_nochoice, "%s/valid_plain.jsonl", tmp);
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 14; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[i % 8],
                i % 3 ? " please" : "", tags[(i * 3) % 5]);
    fclose(f);
    /* held-out notes tagged otherwise than in training: the validation loss falls, then rises */
    f = fopen(val, "w");
    FILE *g = fopen(val_nochoice, "w");
    for (int i = 0; i < 6; i++) {
        const char *tag = tags[(i * 3 + 2) % 5];
        fprintf(f,
                "{\"prompt\": \"Note: %s soon\\nTag:\", \"completion\": \" %s\", \"choices\": [\" work\", \" family\", "
                "\" shopping\", "
                "\" travel\", \" health\"], \"answer\": \" %s\"}\n",
                notes[(i + 3) % 8], tag, tag);
        fprintf(g, "{\"prompt\": \"Note: %s soon\\nTag:\", \"completion\": \" %s\"}\n", notes[(i + 3) % 8], tag);
    }
    fclose(f);
    fclose(g);
}

/* ---- running the CLI ---- */

/* constant lr, no warmup: the first k steps of a longer run are a k-step run */
static void base_args(nl_t_args *a, const char *out, const char *steps) {
    nl_t_train_args(a, model, data, out);
    nl_t_arg(a, "--steps");
    nl_t_arg(a, steps);
    nl_t_arg(a, "--lr");
    nl_t_arg(a, "2e-2");
    nl_t_arg(a, "--schedule");
    nl_t_arg(a, "constant");
}

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* ---- the log's evaluation rows ---- */

#define MAXE 64
typedef struct {
    int n, bad, n_steps;
    int64_t step[MAXE], examples[MAXE], tokens[MAXE];
    double loss[MAXE], acc[MAXE], seconds[MAXE];
    int acc_null[MAXE];
} evals;

static void read_evals(const char *path, evals *E) {
    memset(E, 0, sizeof *E);
    size_t len;
    char *b = nl_t_slurp(path, &len);
    if (!b) {
        E->bad = 1;
        return;
    }
    for (char *p = b; *p;) {
        char *eol = strchr(p, '\n');
        if (!eol) {
            E->bad = 1;
            break;
        }
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        const nl_json *e = j ? nl_json_get(j, "eval") : NULL;
        if (!j) E->bad = 1;
        else if (!e) E->n_steps += nl_json_get(j, "step") != NULL;
        else if (E->n < MAXE) {
            int i = E->n++;
            /* exactly these six keys */
            static const char *const keys[] = {"step", "loss", "accuracy", "examples", "tokens", "seconds"};
            int n_keys = e->type == NL_JSON_OBJECT ? (int)e->u.obj.n : -1;
            if (n_keys != 6 || j->u.obj.n != 1) E->bad = 1;
            for (int k = 0; k < 6; k++)
                if (!nl_json_get(e, keys[k])) E->bad = 1;
            const nl_json *a = nl_json_get(e, "accuracy");
            E->acc_null[i] = a && a->type == NL_JSON_NULL;
            E->acc[i] = a && nl_json_is_number(a) ? a->u.num.d : -1;
            if (nl_json_int64(nl_json_get(e, "step"), &E->step[i]) ||
                nl_json_int64(nl_json_get(e, "examples"), &E->examples[i]) ||
                nl_json_int64(nl_json_get(e, "tokens"), &E->tokens[i]) || !nl_json_is_number(nl_json_get(e, "loss")) ||
                !nl_json_is_number(nl_json_get(e, "seconds")))
                E->bad = 1;
            else {
                E->loss[i] = nl_json_get(e, "loss")->u.num.d;
                E->seconds[i] = nl_json_get(e, "seconds")->u.num.d;
            }
        }
        nl_json_free(j);
        p = eol + 1;
    }
    free(b);
}

static int same_evals(const evals *a, const evals *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->step[i] != b->step[i] || a->loss[i] != b->loss[i] || a->acc[i] != b->acc[i] ||
            a->tokens[i] != b->tokens[i])
            return 0;
    return 1;
}

/* The step --early-stop P stops at, from the rows of a run without it (0: none). */
static int64_t expected_stop(const evals *E, int P, int64_t *best_step) {
    double best = 0;
    int bad = 0;
    *best_step = 0;
    for (int i = 0; i < E->n; i++) {
        if (*best_step == 0 || E->loss[i] < best) {
            best = E->loss[i];
            *best_step = E->step[i];
            bad = 0;
        } else if (++bad >= P) return E->step[i];
    }
    return 0;
}

/* ---- the tests ---- */

static void test_rows_and_eval(void) {
    char out[512], log[512], err[512], eout[512], plain[512], line[128];
    path_of(out, sizeof out, "v.gguf");
    path_of(log, sizeof log, "v.jsonl");
    path_of(err, sizeof err, "v.err");
    path_of(eout, sizeof eout, "eval.out");
    path_of(plain, sizeof plain, "plain.gguf");
    nl_t_args a;
    base_args(&a, out, "6");
    nl_t_arg(&a, "--val-data");
    nl_t_arg(&a, val);
    nl_t_arg(&a, "--eval-every");
    nl_t_arg(&a, "2");
    nl_t_arg(&a, "--log-json");
    nl_t_arg(&a, log);
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "exited %d", rc);
    evals E;
    read_evals(log, &E);
    CHECKF(E.bad == 0 && E.n == 3 && E.n_steps == 6, "%d eval rows, %d step rows, bad %d", E.n, E.n_steps, E.bad);
    for (int i = 0; i < E.n && i < 3; i++) {
        CHECK(E.step[i] == 2 * (i + 1) && E.examples[i] == 6 && E.tokens[i] > 0 && !E.acc_null[i] && E.acc[i] >= 0 &&
              E.acc[i] <= 1);
        CHECK(E.seconds[i] >= 0 && isfinite(E.loss[i]));
    }
    CHECK(nl_t_file_has(err, "eval at step 2: val loss ") && nl_t_file_has(err, "eval at step 6: val loss "));
    /* the end's validation loss is what eval prints for the adapter written */
    const char *const ev[] = {NL_CLI, "eval",      "--model", model,       "--adapter", out, "--data",
                              val,    "--backend", "host",    "--threads", "2",         NULL};
    CHECK(nl_t_run(ev, err, eout) == 0);
    snprintf(line, sizeof line, "loss %.4f,", E.loss[2]);
    CHECKF(nl_t_file_has(eout, line), "eval does not print '%s'", line);
    snprintf(line, sizeof line, "accuracy %.1f%% (%d/6)", 100.0 * E.acc[2], (int)(E.acc[2] * 6 + 0.5));
    CHECKF(nl_t_file_has(eout, line), "eval does not print '%s'", line);
    printf("eval rows: losses %.4f %.4f %.4f, last = eval's %s\n", E.loss[0], E.loss[1], E.loss[2], line);
    /* validating changes nothing trained */
    base_args(&a, plain, "6");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(nl_t_same_file(out, plain));
    /* --val-split 0.25: lines 4, 8, 12 held out; one evaluation, at the end */
    base_args(&a, out, "3");
    nl_t_arg(&a, "--val-split");
    nl_t_arg(&a, "0.25");
    nl_t_arg(&a, "--log-json");
    nl_t_arg(&a, log);
    CHECK(nl_t_args_run(&a, err) == 0);
    read_evals(log, &E);
    CHECKF(E.n == 1 && E.step[0] == 3 && E.examples[0] == 3 && E.acc_null[0], "%d rows", E.n);
    CHECK(nl_t_file_has(err, ": 11 examples"));
}

static int64_t BEST, STOP, BEST_AT_STOP;  /* of the 10-step run with an evaluation after every step */
static char best_ref[512], stop_ref[512]; /* the adapters of a BEST-step and a BEST_AT_STOP-step run */
static evals FULL;

static void test_keep_best(void) {
    char out[512], log[512], err[512], steps[16], want[800];
    path_of(out, sizeof out, "kb.gguf");
    path_of(log, sizeof log, "kb.jsonl");
    path_of(err, sizeof err, "kb.err");
    path_of(best_ref, sizeof best_ref, "best_ref.gguf");
    nl_t_args a;
    base_args(&a, out, "10");
    nl_t_arg(&a, "--val-data");
    nl_t_arg(&a, val);
    nl_t_arg(&a, "--eval-every");
    nl_t_arg(&a, "1");
    nl_t_arg(&a, "--keep-best");
    nl_t_arg(&a, "--log-json");
    nl_t_arg(&a, log);
    CHECK(nl_t_args_run(&a, err) == 0);
    read_evals(log, &FULL);
    CHECK(FULL.n == 10 && FULL.bad == 0);
    int64_t best_before_stop;
    STOP = expected_stop(&FULL, 2, &best_before_stop);
    /* the best of all ten: the first lowest loss */
    for (int i = 0; i < FULL.n; i++)
        if (i == 0 || FULL.loss[i] < FULL.loss[BEST - 1]) BEST = FULL.step[i];
    printf("keep-best: val losses");
    for (int i = 0; i < FULL.n; i++) printf(" %.4f", FULL.loss[i]);
    printf("; best at step %lld; --early-stop 2 stops at %lld (best then: step %lld)\n", (long long)BEST,
           (long long)STOP, (long long)best_before_stop);
    BEST_AT_STOP = best_before_stop;
    /* the inputs are made for the best to come before the end: else the test shows nothing */
    CHECKF(BEST >= 1 && BEST < 10, "best step %lld", (long long)BEST);
    char err2[512];
    path_of(err2, sizeof err2, "kb_ref.err");
    snprintf(steps, sizeof steps, "%lld", (long long)BEST);
    base_args(&a, best_ref, steps);
    CHECK(nl_t_args_run(&a, err2) == 0);
    path_of(stop_ref, sizeof stop_ref, "stop_ref.gguf");
    snprintf(steps, sizeof steps, "%lld", (long long)BEST_AT_STOP);
    base_args(&a, stop_ref, steps);
    CHECK(nl_t_args_run(&a, err2) == 0);
    CHECKF(nl_t_same_file(out, best_ref), "--out is not the adapter of step %lld", (long long)BEST);
    snprintf(want, sizeof want, "best so far: adapter of step %lld written to %s", (long long)BEST, out);
    CHECK(nl_t_file_has(err, want));
    snprintf(want, sizeof want, "the best adapter (step %lld, val loss %.4f) is in %s", (long long)BEST,
             FULL.loss[BEST - 1], out);
    CHECKF(nl_t_file_has(err, want), "no '%s'", want);
}

/* The early-stop run's arguments: keep-best, an evaluation after every step, patience 2. */
static void es_args(nl_t_args *a, const char *out, const char *log, const char *ck) {
    base_args(a, out, "10");
    nl_t_arg(a, "--val-data");
    nl_t_arg(a, val);
    nl_t_arg(a, "--eval-every");
    nl_t_arg(a, "1");
    nl_t_arg(a, "--keep-best");
    nl_t_arg(a, "loss");
    nl_t_arg(a, "--early-stop");
    nl_t_arg(a, "2");
    nl_t_arg(a, "--log-json");
    nl_t_arg(a, log);
    if (ck) {
        nl_t_arg(a, "--checkpoint-dir");
        nl_t_arg(a, ck);
        nl_t_arg(a, "--commit-every");
        nl_t_arg(a, "3");
    }
}

static evals ES;
static char es_out[512];

static void test_early_stop(void) {
    char log[512], err[512], want[96];
    path_of(es_out, sizeof es_out, "es.gguf");
    path_of(log, sizeof log, "es.jsonl");
    path_of(err, sizeof err, "es.err");
    CHECKF(STOP > 0, "the 10-step run's losses never go 2 evaluations without improvement");
    if (STOP <= 0) return;
    nl_t_args a;
    es_args(&a, es_out, log, NULL);
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "exited %d", rc);
    read_evals(log, &ES);
    CHECKF(ES.n > 0 && ES.step[ES.n - 1] == STOP && ES.n_steps == STOP,
           "stopped after %d rows, %d steps; expected step %lld", ES.n, ES.n_steps, (long long)STOP);
    snprintf(want, sizeof want, "early stop after %lld/10 steps", (long long)STOP);
    CHECKF(nl_t_file_has(err, want), "no '%s'", want);
    CHECK(nl_t_file_has(err, "without improvement: early stop"));
    CHECK(nl_t_same_file(es_out, stop_ref));
}

static int newest_commit(const char *dir) {
    int best = -1;
    for (int s = 0; s <= 10; s++) {
        char p[600];
        snprintf(p, sizeof p, "%s/commit-%d.nlck", dir, s);
        if (access(p, F_OK) == 0) best = s;
    }
    return best;
}

/* Stopped after commits, or killed after one, then resumed: the same decisions. */
static void test_resume(int kill_at) {
    char out[512], log[512], err[512], ck[512], name[32];
    snprintf(name, sizeof name, kill_at ? "kill%d" : "stops", kill_at);
    char f[64];
    snprintf(f, sizeof f, "%s.gguf", name);
    path_of(out, sizeof out, f);
    snprintf(f, sizeof f, "%s.jsonl", name);
    path_of(log, sizeof log, f);
    snprintf(f, sizeof f, "%s.err", name);
    path_of(err, sizeof err, f);
    snprintf(f, sizeof f, "ck_%s", name);
    path_of(ck, sizeof ck, f);
    if (STOP <= 0) return;
    nl_t_args a;
    if (kill_at) {
        es_args(&a, out, log, ck);
        pid_t pid = nl_t_spawn(a.v, err, NULL);
        double t0 = nl_now();
        while (newest_commit(ck) < kill_at && nl_now() - t0 < 60) nl_t_sleep(0.0005);
        kill(pid, SIGKILL);
        int rc = nl_t_wait(pid);
        printf("%s: rc %d, newest commit %d\n", name, rc, newest_commit(ck));
    } else {
        /* stops at steps 2 (no commit boundary: committed as a stop) and 4 */
        for (int i = 0; i < 2; i++) {
            es_args(&a, out, log, ck);
            if (i) nl_t_arg(&a, "--resume");
            nl_t_arg(&a, "--stop-after");
            nl_t_arg(&a, "2");
            int rc = nl_t_args_run(&a, err);
            CHECKF(rc == 0 && newest_commit(ck) == 2 * (i + 1), "%s %d: rc %d, newest commit %d", name, i, rc,
                   newest_commit(ck));
        }
    }
    es_args(&a, out, log, ck);
    nl_t_arg(&a, "--resume");
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "%s: resume exited %d", name, rc);
    evals E;
    read_evals(log, &E);
    CHECKF(same_evals(&E, &ES) && E.n_steps == ES.n_steps,
           "%s: evaluation rows differ from the uninterrupted run's (%d vs %d)", name, E.n, ES.n);
    CHECKF(nl_t_same_file(out, es_out), "%s: the adapter differs from the uninterrupted run's", name);
    CHECK(newest_commit(ck) == STOP);
    /* resumed once more at the early stop: nothing to do, the same adapter */
    CHECK(nl_t_args_run(&a, err) == 0 && nl_t_same_file(out, es_out));
}

static void test_refusals(void) {
    char out[512], err[512];
    path_of(out, sizeof out, "r.gguf");
    path_of(err, sizeof err, "r.err");
    nl_t_args a;
    base_args(&a, out, "2");
    nl_t_arg(&a, "--eval-every");
    nl_t_arg(&a, "1");
    CHECK(nl_t_args_run(&a, err) == 2 &&
          nl_t_file_has(err, "--eval-every needs a validation set: --val-data FILE or --val-split F"));
    base_args(&a, out, "2");
    nl_t_arg(&a, "--val-data");
    nl_t_arg(&a, val_nochoice);
    nl_t_arg(&a, "--keep-best");
    nl_t_arg(&a, "accuracy");
    CHECK(nl_t_args_run(&a, err) == 1 && nl_t_file_has(err, "--keep-best accuracy: the validation set") &&
          nl_t_file_has(err, "has no line with \"choices\""));
    base_args(&a, out, "2");
    nl_t_arg(&a, "--val-data");
    nl_t_arg(&a, val);
    nl_t_arg(&a, "--keep-best");
    nl_t_arg(&a, "lowest");
    CHECK(nl_t_args_run(&a, err) == 2 && nl_t_file_has(err, "unexpected argument 'lowest'"));
    base_args(&a, out, "2");
    nl_t_arg(&a, "--val-data");
    nl_t_arg(&a, val);
    nl_t_arg(&a, "--val-split");
    nl_t_arg(&a, "0.2");
    CHECK(nl_t_args_run(&a, err) == 2 && nl_t_file_has(err, "give --val-data or --val-split, not both"));
    base_args(&a, out, "2");
    nl_t_arg(&a, "--val-split");
    nl_t_arg(&a, "0.05");
    CHECK(nl_t_args_run(&a, err) == 1 && nl_t_file_has(err, "--val-split 0.05: ") &&
          nl_t_file_has(err, "14 examples, too few"));
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "test_validate")) return 1;
    make_inputs();
    test_rows_and_eval();
    test_keep_best();
    test_early_stop();
    test_resume(0);
    test_resume(3);
    test_refusals();
    if (!nl_t_fail) nl_t_tmpdir_done(tmp);
    else fprintf(stderr, "files kept in %s\n", tmp);
    return nl_t_done();
}

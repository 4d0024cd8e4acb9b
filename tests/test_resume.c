/* Overnight safety of `nightlora train`, driven through the real CLI binary (NL_CLI):
 *  - an uninterrupted run gives adapter bytes X and a per-step log L;
 *  - clean stops (--stop-after) chained with --resume end with X and L;
 *  - SIGKILL after the k-th commit, and SIGKILL at pseudo-random times (mid-step, mid-commit,
 *    mid-write: wherever it lands), chained with --resume, end with X and L — with commits every
 *    3 steps, so a resume replays the steps after the last commit, shuffle and dropout on, and
 *    a run that crosses an epoch boundary;
 *  - SIGINT / SIGTERM: the child commits at the next step boundary and exits 3 (stopped by a
 *    signal after committing, not done); SIGTERM while paused by the thermal status file
 *    abandons the step, commits the last finished one and exits 3;
 *  - a fresh run into a directory holding commits is refused and leaves them untouched;
 *  - the resumed log: complete lines of committed steps are kept, the replayed steps are logged
 *    once (L compared field by field, timings aside).
 * Losses are compared exactly: the log prints them with %.17g. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "util/json.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/util.h"

static char tmp[256], model[512], data[512], status_file[512];

/* ---- running the CLI ---- */

/* The shared configuration: shuffle on (default), dropout on, commits every 3 steps, two
 * epochs (so a run crosses an epoch boundary). */
static void base_args(nl_t_args *a, const char *out, const char *ckdir, const char *log) {
    nl_t_train_args(a, model, data, out);
    nl_t_arg(a, "--epochs");
    nl_t_arg(a, "2");
    nl_t_arg(a, "--lr");
    nl_t_arg(a, "3e-3");
    nl_t_arg(a, "--warmup");
    nl_t_arg(a, "2");
    nl_t_arg(a, "--commit-every");
    nl_t_arg(a, "3");
    if (ckdir) {
        nl_t_arg(a, "--checkpoint-dir");
        nl_t_arg(a, ckdir);
    }
    if (log) {
        nl_t_arg(a, "--log-json");
        nl_t_arg(a, log);
    }
}

/* ---- files ---- */

/* The newest commit step in DIR (-1: none). */
static int newest_commit(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail[16];
        if (sscanf(e->d_name, "commit-%d.%15s", &s, tail) == 2 && !strcmp(tail, "nlck") && s > best) best = s;
    }
    closedir(d);
    return best;
}

static void write_status(const char *v) {
    char t[600];
    snprintf(t, sizeof t, "%s.tmp", status_file);
    FILE *f = fopen(t, "w");
    fputs(v, f);
    fclose(f);
    rename(t, status_file);
}

/* ---- the per-step log ---- */

typedef struct {
    int n;
    int step[256];
    double loss[256], lr[256], gnorm[256], pgrad[256]; /* pgrad: MeZO's projected_grad, NAN when absent */
    int64_t tokens[256], targets[256];
    int bad; /* lines that did not parse or lacked a key */
} steplog;

static void read_log(const char *path, steplog *L) {
    memset(L, 0, sizeof *L);
    size_t len;
    char *b = nl_t_slurp(path, &len);
    if (!b) {
        L->bad = 1;
        return;
    }
    for (char *p = b; p < b + len && L->n < 256;) {
        char *eol = memchr(p, '\n', (size_t)(b + len - p));
        if (!eol) {
            L->bad++;
            break;
        }
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        int64_t s, tk, tg;
        const nl_json *lo = nl_json_get(j, "loss"), *lr = nl_json_get(j, "lr"), *gn = nl_json_get(j, "grad_norm");
        if (j && !nl_json_int64(nl_json_get(j, "step"), &s) && !nl_json_int64(nl_json_get(j, "tokens"), &tk) &&
            !nl_json_int64(nl_json_get(j, "targets"), &tg) && nl_json_is_number(lo) && nl_json_is_number(lr) &&
            nl_json_is_number(gn)) {
            L->step[L->n] = (int)s;
            L->loss[L->n] = lo->u.num.d;
            L->lr[L->n] = lr->u.num.d;
            L->gnorm[L->n] = gn->u.num.d;
            const nl_json *pg = nl_json_get(j, "projected_grad");
            L->pgrad[L->n] = nl_json_is_number(pg) ? pg->u.num.d : NAN;
            L->tokens[L->n] = tk;
            L->targets[L->n] = tg;
            L->n++;
        } else L->bad++;
        nl_json_free(j);
        p = eol + 1;
    }
    free(b);
}

/* Same steps, in order, with bit-identical losses, learning rates, gradient norms, tokens. */
static int same_log(const steplog *a, const steplog *b, const char *what) {
    if (a->bad || b->bad || a->n != b->n) {
        fprintf(stderr, "%s: log has %d lines (%d bad), expected %d\n", what, b->n, b->bad, a->n);
        return 0;
    }
    for (int i = 0; i < a->n; i++)
        if (a->step[i] != b->step[i] || a->loss[i] != b->loss[i] || a->lr[i] != b->lr[i] ||
            a->gnorm[i] != b->gnorm[i] || a->tokens[i] != b->tokens[i] || a->targets[i] != b->targets[i] ||
            !(a->pgrad[i] == b->pgrad[i] || (isnan(a->pgrad[i]) && isnan(b->pgrad[i])))) {
            fprintf(stderr, "%s: line %d differs: step %d loss %.17g vs step %d loss %.17g\n", what, i + 1, a->step[i],
                    a->loss[i], b->step[i], b->loss[i]);
            return 0;
        }
    return 1;
}

static char ref_out[512], ref_log[512];
static steplog REF;
static int N_STEPS;
static double REF_SECONDS, LOOP_SECONDS, STEP_SECONDS; /* whole reference run; its step loop; a step */

static void make_inputs(void) {
    snprintf(model, sizeof model, "%s/q3.gguf", tmp);
    snprintf(data, sizeof data, "%s/train.jsonl", tmp);
    snprintf(status_file, sizeof status_file, "%s/thermal", tmp);
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
    static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio",       "Renew the passport",
                                  "Pick up the kids at five",    "Dentist at nine on Monday"};
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 14; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[i % 8],
                i % 3 ? " please" : "", tags[(i * 3) % 5]);
    fclose(f);
}

/* ---- the tests ---- */

static void test_reference(void) {
    char ck[512], err[512];
    snprintf(ref_out, sizeof ref_out, "%s/ref.gguf", tmp);
    snprintf(ref_log, sizeof ref_log, "%s/ref.jsonl", tmp);
    snprintf(ck, sizeof ck, "%s/ck_ref", tmp);
    snprintf(err, sizeof err, "%s/ref.err", tmp);
    nl_t_args a;
    base_args(&a, ref_out, ck, ref_log);
    double t0 = nl_now();
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    while (!nl_t_file_has(err, "training ") && nl_now() - t0 < 30) nl_t_sleep(0.001);
    double t1 = nl_now();
    int rc = nl_t_wait(pid);
    REF_SECONDS = nl_now() - t0;
    LOOP_SECONDS = nl_now() - t1;
    CHECKF(rc == 0, "reference run exited %d", rc);
    read_log(ref_log, &REF);
    N_STEPS = REF.n;
    CHECKF(REF.bad == 0 && N_STEPS >= 8, "%d steps, %d bad lines", REF.n, REF.bad);
    for (int i = 0; i < REF.n; i++) CHECK(REF.step[i] == i + 1);
    CHECK(newest_commit(ck) == N_STEPS);
    /* the progress line: step/total, loss, tok/s, ETA, running|paused */
    char want[64];
    snprintf(want, sizeof want, "step 1/%d  loss ", N_STEPS);
    CHECK(nl_t_file_has(err, want) && nl_t_file_has(err, " tok/s  ETA ") && nl_t_file_has(err, "  running"));
    CHECK(nl_t_file_has(err, "0 truncated") && nl_t_file_has(err, "0 dropped"));
    /* a second run is bit-identical (the premise of everything below) */
    char out2[512], log2[512], ck2[512];
    snprintf(out2, sizeof out2, "%s/ref2.gguf", tmp);
    snprintf(log2, sizeof log2, "%s/ref2.jsonl", tmp);
    snprintf(ck2, sizeof ck2, "%s/ck_ref2", tmp);
    base_args(&a, out2, ck2, log2);
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(nl_t_same_file(ref_out, out2));
    steplog L;
    read_log(log2, &L);
    CHECK(same_log(&REF, &L, "second run"));
    STEP_SECONDS = N_STEPS ? LOOP_SECONDS / N_STEPS : 0.01;
    printf("reference: %d steps in %.2f s (%.1f ms a step with commits and logs)\n", N_STEPS, REF_SECONDS,
           1e3 * STEP_SECONDS);
}

/* The end of every interrupted scenario: resume to completion, then compare with the reference. */
static void finish_and_compare(const char *ck, const char *out, const char *log, const char *what) {
    char err[512];
    snprintf(err, sizeof err, "%s/%s.err", tmp, what);
    nl_t_args a;
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--resume");
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "%s: final resume exited %d", what, rc);
    CHECKF(nl_t_same_file(ref_out, out), "%s: adapter differs from the uninterrupted run", what);
    steplog L;
    read_log(log, &L);
    CHECKF(same_log(&REF, &L, what), "%s", what);
    CHECK(newest_commit(ck) == N_STEPS);
}

static void test_clean_stops(void) {
    char ck[512], out[512], log[512], err[512];
    snprintf(ck, sizeof ck, "%s/ck_stop", tmp);
    snprintf(out, sizeof out, "%s/stop.gguf", tmp);
    snprintf(log, sizeof log, "%s/stop.jsonl", tmp);
    snprintf(err, sizeof err, "%s/stop.err", tmp);
    /* stop after 2, then 3 more (5), then 1 more (6), then to the end */
    static const char *const stops[] = {"2", "3", "1"};
    int expect = 0;
    for (int i = 0; i < 3; i++) {
        nl_t_args a;
        base_args(&a, out, ck, log);
        if (i) nl_t_arg(&a, "--resume");
        nl_t_arg(&a, "--stop-after");
        nl_t_arg(&a, stops[i]);
        int rc = nl_t_args_run(&a, err);
        expect += atoi(stops[i]);
        CHECKF(rc == 0, "stop %d exited %d", i, rc);
        CHECKF(newest_commit(ck) == expect, "after stop %d: newest commit %d, expected %d", i, newest_commit(ck),
               expect);
        CHECK(nl_t_file_has(err, "stopped after"));
        steplog L;
        read_log(log, &L);
        CHECK(L.n == expect && L.bad == 0);
    }
    finish_and_compare(ck, out, log, "clean stops");
}

/* The newest commit damaged on disk (a flipped byte): the resume warns, goes back to the
 * previous commit, replays from there and still ends bit-identically. */
static void test_corrupt_commit(void) {
    char ck[512], out[512], log[512], err[512], cfile[600];
    snprintf(ck, sizeof ck, "%s/ck_corrupt", tmp);
    snprintf(out, sizeof out, "%s/corrupt.gguf", tmp);
    snprintf(log, sizeof log, "%s/corrupt.jsonl", tmp);
    snprintf(err, sizeof err, "%s/corrupt.err", tmp);
    nl_t_args a;
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--stop-after");
    nl_t_arg(&a, "6");
    CHECK(nl_t_args_run(&a, err) == 0 && newest_commit(ck) == 6);
    snprintf(cfile, sizeof cfile, "%s/commit-6.nlck", ck);
    FILE *f = fopen(cfile, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--resume");
    nl_t_arg(&a, "--stop-after");
    nl_t_arg(&a, "1");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECKF(nl_t_file_has(err, "warning: ") && nl_t_file_has(err, "checksum") && nl_t_file_has(err, "at step 3/"),
           "no warning / not resumed from commit 3");
    finish_and_compare(ck, out, log, "corrupt commit");
}

/* SIGKILL once commit-<k> exists (the child is somewhere after its k-th commit by then). */
static void test_kill_after_commit(int k) {
    char ck[512], out[512], log[512], err[512], name[64];
    snprintf(name, sizeof name, "kill_after_%d", k);
    snprintf(ck, sizeof ck, "%s/ck_%s", tmp, name);
    snprintf(out, sizeof out, "%s/%s.gguf", tmp, name);
    snprintf(log, sizeof log, "%s/%s.jsonl", tmp, name);
    snprintf(err, sizeof err, "%s/%s.err", tmp, name);
    nl_t_args a;
    base_args(&a, out, ck, log);
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    double t0 = nl_now();
    while (newest_commit(ck) < 3 * k && nl_now() - t0 < 30) nl_t_sleep(0.0005);
    nl_t_sleep(1.5 * STEP_SECONDS); /* into the step after the next: one step to replay */
    kill(pid, SIGKILL);
    int rc = nl_t_wait(pid);
    int at = newest_commit(ck);
    steplog L;
    read_log(log, &L);
    printf("%s: killed (rc %d) with newest commit %d, %d log lines\n", name, rc, at, L.n);
    CHECK(at >= 3 * k);
    finish_and_compare(ck, out, log, name);
}

/* A chain of SIGKILLs at pseudo-random points, each followed by --resume; the last resume
 * runs to the end. A kill point is: once the log shows a pseudo-random step s of this run
 * (ahead of the commit it resumed from, short of the end), a further pseudo-random fraction of
 * a step (the child's own pace): mid-step, mid-commit or mid-write, wherever it lands. On a
 * loaded machine this process may not run again until the child is far past that point: a
 * child that ended before the kill, or a kill so late that the kills after it have no steps
 * left, is undone (the checkpoint directory and the log as they were before it) and tried
 * again at another point, so every kill counted is one mid-run and the chain has its four. */
static void test_random_kills(void) {
    char ck[512], out[512], log[512], err[512], snap[512], cmd[4800];
    snprintf(ck, sizeof ck, "%s/ck_rand", tmp);
    snprintf(out, sizeof out, "%s/rand.gguf", tmp);
    snprintf(log, sizeof log, "%s/rand.jsonl", tmp);
    snprintf(err, sizeof err, "%s/rand.err", tmp);
    snprintf(snap, sizeof snap, "%s/rand.snap", tmp);
    nl_t_rng_state = 0x5eedf00dULL;
    int killed = 0, replays = 0, from = 0, tries = 0;
    for (int i = 0; i < 4 && tries < 16; tries++) {
        int room = N_STEPS - 3 - from;
        if (room < 1) break;
        int target = from + 1 + (int)((0.5 + 0.5 * nl_t_rand()) * room) % room;
        double frac = 0.5 + 0.5 * nl_t_rand();
        /* the state this kill starts from, to undo a kill that missed */
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s %s.log; if [ -d %s ]; then cp -a %s %s; fi; if [ -f %s ]; then cp %s %s.log; fi", snap,
                 snap, ck, ck, snap, log, log, snap);
        CHECK(system(cmd) == 0);
        nl_t_args a;
        base_args(&a, out, ck, log);
        if (i) nl_t_arg(&a, "--resume");
        unlink(err); /* the last child's "training " is not this one's */
        pid_t pid = nl_t_spawn(a.v, err, NULL);
        double t0 = nl_now();
        /* the log is this run's once it says it trains (a resume first drops the lines past its
         * commit); a step is this child's, as this process saw lines target - 1 and target come
         * (not the reference run's: the machine's load changes, and a delay measured when it was
         * loaded spans many steps later, past the end of the run) */
        while (!nl_t_file_has(err, "training ") && nl_now() - t0 < 60) nl_t_sleep(0.001);
        double ta = -1;
        for (int n; (n = nl_t_count_lines(log)) < target && nl_now() - t0 < 60; nl_t_sleep(0.0003))
            if (ta < 0 && n >= target - 1) ta = nl_now();
        const double tb = nl_now();
        nl_t_sleep(frac * (tb - (ta < 0 ? tb : ta)));
        kill(pid, SIGKILL);
        int rc = nl_t_wait(pid);
        int at = newest_commit(ck) > 0 ? newest_commit(ck) : 0;
        steplog L;
        read_log(log, &L);
        const int missed =
            rc != 128 + SIGKILL || (i < 3 && N_STEPS - 3 - at < 3 - i); /* a step of room for each kill after it */
        printf("random kill %d at step %d + %.2f step: rc %d, newest commit %d, log %d lines%s\n", i, target, frac, rc,
               at, L.n,
               missed     ? " (missed: undone, tried again)"
               : L.n > at ? " (steps past the commit: replayed on resume)"
                          : "");
        if (missed) {
            snprintf(cmd, sizeof cmd,
                     "rm -rf %s %s; if [ -d %s ]; then mv %s %s; fi; if [ -f %s.log ]; then mv %s.log %s; fi", ck, log,
                     snap, snap, ck, snap, snap, log);
            CHECK(system(cmd) == 0);
            continue;
        }
        killed++;
        replays += L.n > at;
        from = at;
        i++;
    }
    printf("random kills: %d in %d tries, %d with steps replayed\n", killed, tries, replays);
    CHECKF(killed >= 3, "only %d of 4 runs were killed mid-run in %d tries", killed, tries);
    finish_and_compare(ck, out, log, "random kills");
}

/* SIGINT / SIGTERM: commit at the next step boundary and exit 3. */
static void test_signal(int sig) {
    char ck[512], out[512], log[512], err[512], name[32];
    snprintf(name, sizeof name, "sig%d", sig);
    snprintf(ck, sizeof ck, "%s/ck_%s", tmp, name);
    snprintf(out, sizeof out, "%s/%s.gguf", tmp, name);
    snprintf(log, sizeof log, "%s/%s.jsonl", tmp, name);
    snprintf(err, sizeof err, "%s/%s.err", tmp, name);
    nl_t_args a;
    base_args(&a, out, ck, log);
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    double t0 = nl_now();
    while (newest_commit(ck) < 3 && nl_now() - t0 < 30) nl_t_sleep(0.0005);
    kill(pid, sig);
    int rc = nl_t_wait(pid);
    int at = newest_commit(ck);
    steplog L;
    read_log(log, &L);
    CHECKF(rc == 3, "%s: exited %d, expected 3 (stopped by a signal after committing)", name, rc);
    CHECKF(nl_t_file_has(err, "stopped after"), "%s: no 'stopped' in the output", name);
    CHECKF(at >= 3 && at < N_STEPS && L.n == at, "%s: newest commit %d, %d log lines", name, at, L.n);
    printf("%s: stopped at step %d of %d\n", name, at, N_STEPS);
    finish_and_compare(ck, out, log, name);
}

/* SIGTERM while paused by the thermal status: the step in progress is abandoned and the last
 * finished one committed; the resume (cool again) finishes bit-identically. */
static void test_signal_in_pause(void) {
    char ck[512], out[512], log[512], err[512];
    snprintf(ck, sizeof ck, "%s/ck_pause", tmp);
    snprintf(out, sizeof out, "%s/pause.gguf", tmp);
    snprintf(log, sizeof log, "%s/pause.jsonl", tmp);
    snprintf(err, sizeof err, "%s/pause.err", tmp);
    write_status("0\n");
    nl_t_args a;
    base_args(&a, out, ck, log);
    nl_t_set(&a, "--thermal", "auto");
    nl_t_arg(&a, "--thermal-status-file");
    nl_t_arg(&a, status_file);
    nl_t_arg(&a, "--pacing-poll-ms");
    nl_t_arg(&a, "10");
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    double t0 = nl_now();
    while (newest_commit(ck) < 3 && nl_now() - t0 < 30) nl_t_sleep(0.0005);
    write_status("3\n");
    while (!nl_t_file_has(err, "paused: thermal status 3") && nl_now() - t0 < 30) nl_t_sleep(0.002);
    int paused = nl_t_file_has(err, "paused: thermal status 3");
    nl_t_sleep(0.05);
    kill(pid, SIGTERM);
    int rc = nl_t_wait(pid);
    int at = newest_commit(ck);
    steplog L;
    read_log(log, &L);
    CHECKF(paused, "the run never paused");
    CHECKF(rc == 3, "exited %d, expected 3", rc);
    CHECK(nl_t_file_has(err, "stop requested while paused"));
    CHECKF(at >= 3 && at < N_STEPS && L.n == at, "newest commit %d, %d log lines", at, L.n);
    printf("sigterm in pause: stopped at step %d\n", at);
    write_status("0\n");
    finish_and_compare(ck, out, log, "signal in pause");
}

/* Two runs on one checkpoint directory: the second is refused at once while the first holds
 * it (paused by the thermal status so that it surely does), and the first then finishes
 * bit-identically. */
static void test_dir_lock(void) {
    char ck[512], out[512], out2[512], log[512], err[512], err2[512];
    snprintf(ck, sizeof ck, "%s/ck_lock", tmp);
    snprintf(out, sizeof out, "%s/lock.gguf", tmp);
    snprintf(out2, sizeof out2, "%s/lock2.gguf", tmp);
    snprintf(log, sizeof log, "%s/lock.jsonl", tmp);
    snprintf(err, sizeof err, "%s/lock.err", tmp);
    snprintf(err2, sizeof err2, "%s/lock2.err", tmp);
    write_status("3\n");
    nl_t_args a;
    base_args(&a, out, ck, log);
    nl_t_set(&a, "--thermal", "auto");
    nl_t_arg(&a, "--thermal-status-file");
    nl_t_arg(&a, status_file);
    nl_t_arg(&a, "--pacing-poll-ms");
    nl_t_arg(&a, "10");
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    double t0 = nl_now();
    while (!nl_t_file_has(err, "paused: thermal status 3") && nl_now() - t0 < 30) nl_t_sleep(0.002);
    nl_t_args b;
    base_args(&b, out2, ck, NULL);
    nl_t_arg(&b, "--resume");
    int rc2 = nl_t_args_run(&b, err2);
    CHECKF(rc2 == 1 && nl_t_file_has(err2, "in use by another training run"), "second run: rc %d", rc2);
    char pidtxt[32];
    snprintf(pidtxt, sizeof pidtxt, "(pid %d)", (int)pid);
    CHECK(nl_t_file_has(err2, pidtxt));
    write_status("0\n");
    int rc = nl_t_wait(pid);
    CHECKF(rc == 0, "first run exited %d", rc);
    CHECK(nl_t_same_file(ref_out, out));
    steplog L;
    read_log(log, &L);
    CHECK(same_log(&REF, &L, "locked run"));
    /* the lock went with the process: a resume now gets the directory */
    CHECK(nl_t_args_run(&b, err2) == 0 && nl_t_same_file(ref_out, out2));
}

/* A fresh run into a directory with commits is refused; the commits stay as they were. */
static void test_refuse_fresh(void) {
    char ck[512], out[512], err[512], cfile[600];
    snprintf(ck, sizeof ck, "%s/ck_ref", tmp);
    snprintf(out, sizeof out, "%s/refused.gguf", tmp);
    snprintf(err, sizeof err, "%s/refused.err", tmp);
    snprintf(cfile, sizeof cfile, "%s/commit-%d.nlck", ck, N_STEPS);
    size_t len;
    char *before = nl_t_slurp(cfile, &len);
    nl_t_args a;
    base_args(&a, out, ck, NULL);
    int rc = nl_t_args_run(&a, err);
    CHECK(rc == 1);
    CHECK(nl_t_file_has(err, "already holds commits") && nl_t_file_has(err, "--resume"));
    size_t len2;
    char *after = nl_t_slurp(cfile, &len2);
    CHECK(before && after && len == len2 && !memcmp(before, after, len));
    free(before);
    free(after);
    struct stat st;
    CHECK(stat(out, &st) != 0); /* nothing written */
    /* --steps and --epochs together: a usage error */
    base_args(&a, out, NULL, NULL);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "3");
    CHECK(nl_t_args_run(&a, err) == 2 && nl_t_file_has(err, "not both"));
}

/* MeZO (--method mezo): the state is the params, the step and the data cursor; a chain of a
 * clean stop, a SIGKILL after a commit and resumes ends bit-identical to an uninterrupted
 * MeZO run (adapter bytes; losses and projected gradients in the log). */
static void mezo_args(nl_t_args *a, const char *out, const char *ck, const char *log) {
    base_args(a, out, ck, log);
    nl_t_arg(a, "--method");
    nl_t_arg(a, "mezo");
    nl_t_arg(a, "--mezo-eps");
    nl_t_arg(a, "1e-3");
}

static void test_mezo_resume(void) {
    char ck[512], out[512], log[512], err[512], mref_out[512], mref_log[512], mck[512];
    snprintf(mref_out, sizeof mref_out, "%s/mezo_ref.gguf", tmp);
    snprintf(mref_log, sizeof mref_log, "%s/mezo_ref.jsonl", tmp);
    snprintf(mck, sizeof mck, "%s/ck_mezo_ref", tmp);
    snprintf(ck, sizeof ck, "%s/ck_mezo", tmp);
    snprintf(out, sizeof out, "%s/mezo.gguf", tmp);
    snprintf(log, sizeof log, "%s/mezo.jsonl", tmp);
    snprintf(err, sizeof err, "%s/mezo.err", tmp);
    nl_t_args a;
    mezo_args(&a, mref_out, mck, mref_log);
    CHECK(nl_t_args_run(&a, err) == 0);
    steplog MREF, L;
    read_log(mref_log, &MREF);
    CHECKF(MREF.n == N_STEPS && MREF.bad == 0, "mezo: %d steps, %d bad lines", MREF.n, MREF.bad);
    int pg_ok = MREF.n > 0;
    for (int i = 0; i < MREF.n; i++) pg_ok &= !isnan(MREF.pgrad[i]) && MREF.pgrad[i] != 0;
    CHECKF(pg_ok, "mezo: projected_grad missing or zero in the log");
    CHECK(!nl_t_same_file(mref_out, ref_out)); /* another optimizer: another adapter */
    /* the same settings but backprop's commits cannot be resumed as MeZO (config hash) */
    {
        base_args(&a, out, ck, log);
        nl_t_arg(&a, "--stop-after");
        nl_t_arg(&a, "2");
        CHECK(nl_t_args_run(&a, err) == 0);
        mezo_args(&a, out, ck, log);
        nl_t_arg(&a, "--resume");
        CHECK(nl_t_args_run(&a, err) == 1 && nl_t_file_has(err, "method backprop there, mezo now"));
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", ck);
        CHECK(system(cmd) == 0);
    }
    /* stop after 4, resume; kill after the next commit, resume to the end */
    mezo_args(&a, out, ck, log);
    nl_t_arg(&a, "--stop-after");
    nl_t_arg(&a, "4");
    CHECK(nl_t_args_run(&a, err) == 0 && newest_commit(ck) == 4);
    mezo_args(&a, out, ck, log);
    nl_t_arg(&a, "--resume");
    pid_t pid = nl_t_spawn(a.v, err, NULL);
    double t0 = nl_now();
    while (newest_commit(ck) < 6 && nl_now() - t0 < 30) nl_t_sleep(0.0005);
    nl_t_sleep(1.5 * STEP_SECONDS);
    kill(pid, SIGKILL);
    int rc = nl_t_wait(pid);
    printf("mezo: killed (rc %d) with newest commit %d\n", rc, newest_commit(ck));
    mezo_args(&a, out, ck, log);
    nl_t_arg(&a, "--resume");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECKF(nl_t_same_file(mref_out, out), "mezo: resumed adapter differs from the uninterrupted run");
    read_log(log, &L);
    CHECK(same_log(&MREF, &L, "mezo resume"));
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/nl_test_resume_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmp, tmp);
    if (system(cmd)) return 1;
    make_inputs();
    test_reference();
    if (N_STEPS > 0) {
        test_refuse_fresh();
        test_clean_stops();
        test_corrupt_commit();
        test_kill_after_commit(1);
        test_kill_after_commit(2);
        test_kill_after_commit(3);
        test_random_kills();
        test_signal(SIGINT);
        test_signal(SIGTERM);
        test_signal_in_pause();
        test_dir_lock();
        test_mezo_resume();
    }
    if (!nl_t_fail) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd)) return 1;
    } else {
        fprintf(stderr, "files kept in %s\n", tmp);
    }
    return nl_t_done();
}

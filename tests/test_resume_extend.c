/* An extendable resume, driven through the real CLI binary (NL_CLI): `--resume` with more
 * --steps / --epochs, or another learning rate or schedule, continues with the optimizer state
 * and says what changed; any other difference is refused as before.
 *  (i)   a constant schedule: 10 steps, then --resume --steps 20, is bit-identical to 20 steps
 *        straight (adapter bytes, and the log's losses); the same with --epochs;
 *  (ii)  a changed --lr (and schedule) on resume is accepted, printed and used (the log's lr);
 *  (iii) a changed rank, data or model is still refused with the settings named, the commits
 *        untouched; fewer steps than the commit's are refused;
 *  (iv)  a commit of a build from before the schedule left the config hash resumes (the same,
 *        extended or with another lr), other settings refused as before. */
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/json.h"
#include "util/util.h"

static char tmp[256], model[512], model2[512], data[512], data2[512];

/* a constant schedule after a warm-up, shuffle and dropout on */
static void base_args(nl_t_args *a, const char *out, const char *ck, const char *log) {
    nl_t_train_args(a, model, data, out);
    nl_t_arg(a, "--lr");
    nl_t_arg(a, "3e-3");
    nl_t_arg(a, "--schedule");
    nl_t_arg(a, "constant");
    nl_t_arg(a, "--warmup");
    nl_t_arg(a, "2");
    nl_t_arg(a, "--commit-every");
    nl_t_arg(a, "4");
    if (ck) {
        nl_t_arg(a, "--checkpoint-dir");
        nl_t_arg(a, ck);
    }
    if (log) {
        nl_t_arg(a, "--log-json");
        nl_t_arg(a, log);
    }
}

static void path(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* The log's "loss" and "lr" by step (index step - 1), its step rows consecutive from the
 * first (step 1, or the step after a resumed run's commit); the number of rows. */
static int read_log(const char *p, double *loss, double *lr, int cap) {
    size_t len;
    char *b = nl_t_slurp(p, &len);
    int n = 0;
    int64_t first = 0;
    for (char *q = b; b && q < b + len;) {
        char *eol = memchr(q, '\n', (size_t)(b + len - q));
        if (!eol) break;
        nl_json *j = nl_json_parse(q, (size_t)(eol - q), NULL);
        int64_t s;
        const nl_json *lo = nl_json_get(j, "loss"), *l = nl_json_get(j, "lr");
        if (j && !nl_json_int64(nl_json_get(j, "step"), &s) && (n ? s == first + n : s >= 1) && s <= cap &&
            nl_json_is_number(lo) && nl_json_is_number(l)) {
            if (!n) first = s;
            loss[s - 1] = lo->u.num.d;
            lr[s - 1] = l->u.num.d;
            n++;
        }
        nl_json_free(j);
        q = eol + 1;
    }
    free(b);
    return n;
}

static void write_notes(const char *p, int n, int salt) {
    static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
    static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio",       "Renew the passport"};
    FILE *f = fopen(p, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[(i + salt) % 6],
                i % 3 ? " please" : "", tags[(i * 3 + salt) % 5]);
    fclose(f);
}

static void make_inputs(void) {
    path(model, sizeof model, "q3.gguf");
    path(model2, sizeof model2, "q3b.gguf");
    path(data, sizeof data, "train.jsonl");
    path(data2, sizeof data2, "other.jsonl");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model) ||
        nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 6, model2)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    write_notes(data, 12, 0);
    write_notes(data2, 12, 1);
}

static char straight[512], straight_log[512];
static double S_LOSS[64], S_LR[64];

/* (i) 10 steps, then --resume --steps 20 = 20 steps straight */
static void test_extend_steps(void) {
    char ck[512], out[512], log[512], err[512];
    path(straight, sizeof straight, "straight.gguf");
    path(straight_log, sizeof straight_log, "straight.jsonl");
    path(ck, sizeof ck, "ck_ext");
    path(out, sizeof out, "ext.gguf");
    path(log, sizeof log, "ext.jsonl");
    path(err, sizeof err, "ext.err");
    nl_t_args a;
    base_args(&a, straight, NULL, straight_log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "20");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(read_log(straight_log, S_LOSS, S_LR, 64) == 20);
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "10");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(!nl_t_same_file(out, straight));
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "20");
    nl_t_arg(&a, "--resume");
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "extended resume exited %d", rc);
    CHECKF(nl_t_file_has(err, "resuming step 10: --steps 10 -> 20\n") && nl_t_file_has(err, "at step 10/20"),
           "no change said");
    CHECKF(nl_t_same_file(out, straight), "10 + 10 steps differ from 20 straight");
    double loss[64], lr[64];
    int n = read_log(log, loss, lr, 64);
    CHECK(n == 20);
    for (int i = 0; i < n && i < 20; i++)
        CHECKF(loss[i] == S_LOSS[i] && lr[i] == S_LR[i], "step %d: loss %.17g vs %.17g", i + 1, loss[i], S_LOSS[i]);
    /* the same run extended once more, by --epochs this time: more steps, said */
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--epochs");
    nl_t_arg(&a, "30");
    nl_t_arg(&a, "--resume");
    nl_t_arg(&a, "--stop-after");
    nl_t_arg(&a, "1");
    CHECK(nl_t_args_run(&a, err) == 0 && nl_t_file_has(err, "resuming step 20: --steps 20 -> "));
    /* fewer steps than the commit's: refused */
    char ck2[512], out2[512];
    path(ck2, sizeof ck2, "ck_short");
    path(out2, sizeof out2, "short.gguf");
    base_args(&a, out2, ck2, NULL);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "6");
    CHECK(nl_t_args_run(&a, err) == 0);
    base_args(&a, out2, ck2, NULL);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "4");
    nl_t_arg(&a, "--resume");
    CHECK(nl_t_args_run(&a, err) == 1 &&
          nl_t_file_has(err, "the newest commit is at step 6, beyond this run's 4 steps"));
}

/* (ii) another learning rate (and schedule) on resume: accepted, printed and used */
static void test_change_lr(void) {
    char ck[512], out[512], log[512], err[512];
    path(ck, sizeof ck, "ck_lr");
    path(out, sizeof out, "lr.gguf");
    path(log, sizeof log, "lr.jsonl");
    path(err, sizeof err, "lr.err");
    nl_t_args a;
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "20");
    nl_t_arg(&a, "--stop-after");
    nl_t_arg(&a, "8");
    CHECK(nl_t_args_run(&a, err) == 0);
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "20");
    nl_t_arg(&a, "--resume");
    nl_t_set(&a, "--lr", "1e-3");
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "resume with another lr exited %d", rc);
    CHECKF(nl_t_file_has(err, "resuming step 8: --lr 0.003 -> 0.001\n"), "the change is not said");
    double loss[64], lr[64];
    int n = read_log(log, loss, lr, 64);
    CHECK(n == 20);
    for (int i = 0; i < 8 && i < n; i++) CHECK(loss[i] == S_LOSS[i] && lr[i] == S_LR[i]);
    for (int i = 8; i < n; i++) CHECKF(lr[i] == 1e-3, "step %d: lr %.17g", i + 1, lr[i]);
    CHECK(n == 20 && loss[8] == S_LOSS[8] && loss[9] != S_LOSS[9]); /* step 9 used the new lr: step 10 sees it */
    CHECK(!nl_t_same_file(out, straight));
    /* the schedule's kind and warm-up too: cosine from the commit on */
    base_args(&a, out, ck, log);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "24");
    nl_t_arg(&a, "--resume");
    nl_t_set(&a, "--schedule", "cosine");
    nl_t_set(&a, "--warmup", "0");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECKF(nl_t_file_has(err, "resuming step 20: --steps 20 -> 24, --lr 0.001 -> 0.003, --schedule constant -> cosine, "
                              "--lr-min (not recorded) -> 0.0003") &&
               nl_t_file_has(err, ", --warmup 2 -> 0\n"),
           "the schedule's change is not said");
}

/* (iii) anything else still refused, with the current message; the commits untouched */
static void test_refused(void) {
    char ck[512], out[512], err[512], commit[600];
    path(ck, sizeof ck, "ck_ref");
    path(out, sizeof out, "ref.gguf");
    path(err, sizeof err, "ref.err");
    snprintf(commit, sizeof commit, "%s/commit-4.nlck", ck);
    nl_t_args a;
    base_args(&a, out, ck, NULL);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "4");
    CHECK(nl_t_args_run(&a, err) == 0);
    size_t l0;
    char *before = nl_t_slurp(commit, &l0);
    static const char *const what[] = {"rank", "data", "model"};
    for (int c = 0; c < 3; c++) {
        base_args(&a, out, ck, NULL);
        nl_t_arg(&a, "--steps");
        nl_t_arg(&a, "8");
        nl_t_arg(&a, "--resume");
        if (c == 0) nl_t_set(&a, "--rank", "8");
        if (c == 1) nl_t_set(&a, "--data", data2);
        if (c == 2) nl_t_set(&a, "--model", model2);
        int rc = nl_t_args_run(&a, err);
        char needle[64];
        snprintf(needle, sizeof needle, c == 0 ? "rank 4 there, 8 now" : "%s ", what[c]);
        CHECKF(rc == 1 &&
                   nl_t_file_has(err,
                                 "cannot resume: this run's settings differ from those the commits were made with: ") &&
                   nl_t_file_has(err, needle) &&
                   nl_t_file_has(err,
                                 "(start a fresh run with another --checkpoint-dir, or resume with the same settings)"),
               "changed %s: rc %d", what[c], rc);
        CHECKF(!nl_t_file_has(err, "steps"), "changed %s: the allowed --steps change is named as a difference",
               what[c]);
    }
    size_t l1;
    char *after = nl_t_slurp(commit, &l1);
    CHECK(before && after && l0 == l1 && !memcmp(before, after, l0));
    free(before);
    free(after);
}

/* The config hash in a commit's header (bytes 16..23, little-endian); 0 when unreadable. */
static uint64_t commit_config_hash(const char *p) {
    size_t len;
    unsigned char *b = (unsigned char *)nl_t_slurp(p, &len);
    uint64_t h = 0;
    for (int i = 7; b && len >= 24 && i >= 0; i--) h = h << 8 | b[16 + i];
    free(b);
    return h;
}

/* A run.json's value of key into buf ("" when absent). */
static void run_json_value(const char *dir, const char *key, char *buf, size_t cap) {
    char p[600];
    snprintf(p, sizeof p, "%s/run.json", dir);
    size_t len;
    char *b = nl_t_slurp(p, &len);
    nl_json *j = b ? nl_json_parse(b, len, NULL) : NULL;
    const nl_json *v = nl_json_get(j, key);
    snprintf(buf, cap, "%s", nl_json_is_string(v) ? v->u.str.s : "");
    nl_json_free(j);
    free(b);
}

/* (iv) a commit made by a build from before the schedule left the config hash
 * (tests/data/legacy-commit: base_args, --steps 12, stopped after 4; its hash includes the
 * schedule) resumes: with the same settings bit-identically to a straight run and committed
 * again in the current format; with more steps or another lr as an extended run, said; with
 * another rank or dropout refused as before, the commit untouched; a cosine run's (cosine/, its
 * hash with lr_min) resumed with a constant schedule. */
static char fdir[512], fdata[700], fcommit[700];
static int same_kernels;

/* DIR holding the legacy commit of SUB ("" or "cosine/") and its run.json, LOG removed */
static void legacy_copy(const char *ck, const char *log, const char *sub) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s && mkdir -p %s && cp %s/%scommit-4.nlck %s/%srun.json %s/", ck,
             log ? log : "", ck, fdir, sub, fdir, sub, ck);
    CHECK(system(cmd) == 0);
}

/* base_args on the fixture's data, --steps STEPS --resume (on other kernels: allowed) */
static void legacy_args(nl_t_args *a, const char *out, const char *ck, const char *log, const char *steps) {
    base_args(a, out, ck, log);
    nl_t_set(a, "--data", fdata);
    nl_t_arg(a, "--steps");
    nl_t_arg(a, steps);
    nl_t_arg(a, "--resume");
    if (!same_kernels) nl_t_arg(a, "--allow-kernel-change");
}

static void test_legacy_commit(void) {
    char ck[512], commit4[600], commit5[600], out[512], log[512], err[512];
    char st12[512], st20[512], st_ck[512], st_log[512];
    snprintf(fdir, sizeof fdir, "%s/legacy-commit", NL_TEST_DATA);
    snprintf(fdata, sizeof fdata, "%s/train.jsonl", fdir);
    snprintf(fcommit, sizeof fcommit, "%s/commit-4.nlck", fdir);
    path(ck, sizeof ck, "ck_legacy");
    snprintf(commit4, sizeof commit4, "%s/commit-4.nlck", ck);
    snprintf(commit5, sizeof commit5, "%s/commit-5.nlck", ck);
    path(out, sizeof out, "legacy.gguf");
    path(log, sizeof log, "legacy.jsonl");
    path(err, sizeof err, "legacy.err");
    path(st12, sizeof st12, "legacy-straight12.gguf");
    path(st20, sizeof st20, "legacy-straight20.gguf");
    path(st_ck, sizeof st_ck, "ck_legacy_straight");
    path(st_log, sizeof st_log, "legacy-straight.jsonl");
    double L[64], LR[64], loss[64], lr[64];
    /* the straight runs on the fixture's data; the kernels this machine runs */
    nl_t_args a;
    base_args(&a, st20, st_ck, st_log);
    nl_t_set(&a, "--data", fdata);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "20");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(read_log(st_log, L, LR, 64) == 20);
    base_args(&a, st12, NULL, NULL);
    nl_t_set(&a, "--data", fdata);
    nl_t_arg(&a, "--steps");
    nl_t_arg(&a, "12");
    CHECK(nl_t_args_run(&a, err) == 0);
    char k_here[256], k_there[256];
    run_json_value(st_ck, "kernels", k_here, sizeof k_here);
    run_json_value(fdir, "kernels", k_there, sizeof k_there);
    same_kernels = k_here[0] && !strcmp(k_here, k_there);
    if (!same_kernels)
        fprintf(stderr,
                "note: the legacy commit was made on other kernels (%s, here %s): resumed with --allow-kernel-change, "
                "results not compared\n",
                k_there, k_here);
    const uint64_t old_hash = commit_config_hash(fcommit);
    CHECK(old_hash != 0);
    /* the same settings, one step, then to the end */
    legacy_copy(ck, log, "");
    for (int pass = 0; pass < 2; pass++) {
        legacy_args(&a, out, ck, log, "12");
        if (!pass) {
            nl_t_arg(&a, "--stop-after");
            nl_t_arg(&a, "1");
        }
        int rc = nl_t_args_run(&a, err);
        CHECKF(rc == 0, "resume of the legacy commit (pass %d) exited %d", pass, rc);
        CHECK(!nl_t_file_has(err, "resuming step "));
        if (!pass) {
            CHECKF(nl_t_file_has(
                       err, "the commit of step 4 was made by an older build (its config hash includes the schedule): "
                            "committed again in the current format\n") &&
                       nl_t_file_has(err, "at step 4/12"),
                   "the legacy commit is not said");
            /* commit 4 now carries the current hash, as commit 5 does */
            uint64_t h4 = commit_config_hash(commit4), h5 = commit_config_hash(commit5);
            CHECKF(h4 == h5 && h4 && h4 != old_hash, "commit 4 %016llx, commit 5 %016llx, legacy %016llx",
                   (unsigned long long)h4, (unsigned long long)h5, (unsigned long long)old_hash);
        } else {
            CHECK(!nl_t_file_has(err, "older build") && nl_t_file_has(err, "at step 5/12"));
        }
    }
    int n = read_log(log, loss, lr, 64);
    CHECKF(n == 8, "%d rows after the resumes", n);
    for (int s = 5; same_kernels && n == 8 && s <= 12; s++)
        CHECKF(loss[s - 1] == L[s - 1] && lr[s - 1] == LR[s - 1], "step %d: loss %.17g vs %.17g straight", s,
               loss[s - 1], L[s - 1]);
    if (same_kernels) CHECKF(nl_t_same_file(out, st12), "the legacy commit resumed differs from 12 steps straight");
    /* more steps: an extended run, said, and bit-identical to 20 straight */
    legacy_copy(ck, log, "");
    legacy_args(&a, out, ck, log, "20");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECKF(nl_t_file_has(err, "resuming step 4: --steps 12 -> 20\n") &&
               nl_t_file_has(err, "committed again in the current format"),
           "the extension of the legacy commit is not said");
    if (same_kernels)
        CHECKF(nl_t_same_file(out, st20), "the legacy commit extended to 20 steps differs from 20 straight");
    n = read_log(log, loss, lr, 64);
    CHECK(n == 16);
    for (int s = 5; same_kernels && n == 16 && s <= 20; s++) CHECKF(loss[s - 1] == L[s - 1], "step %d", s);
    /* another lr: accepted, said, used */
    legacy_copy(ck, log, "");
    legacy_args(&a, out, ck, log, "12");
    nl_t_set(&a, "--lr", "1e-3");
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECKF(nl_t_file_has(err, "resuming step 4: --lr 0.003 -> 0.001\n"), "the legacy commit's lr change is not said");
    n = read_log(log, loss, lr, 64);
    CHECK(n == 8 && lr[4] == 1e-3 && lr[11] == 1e-3);
    /* a cosine run's legacy commit (cosine/: its hash has lr_min) resumed as a constant one */
    legacy_copy(ck, log, "cosine/");
    legacy_args(&a, out, ck, log, "12");
    int crc = nl_t_args_run(&a, err);
    CHECKF(crc == 0 && nl_t_file_has(err, "resuming step 4: --schedule cosine -> constant\n") &&
               nl_t_file_has(err, "committed again in the current format"),
           "the cosine run's legacy commit resumed constant: rc %d", crc);
    /* another rank or dropout: refused as before, nothing written */
    static const char *const what[][3] = {{"--rank", "8", "rank 4 there, 8 now"},
                                          {"--dropout", "0.2", "dropout 0.1 there, 0.2 now"}};
    for (int c = 0; c < 2; c++) {
        legacy_copy(ck, NULL, "");
        legacy_args(&a, out, ck, NULL, "12");
        nl_t_set(&a, what[c][0], what[c][1]);
        int rc = nl_t_args_run(&a, err);
        CHECKF(rc == 1 && nl_t_file_has(err, what[c][2]) &&
                   nl_t_file_has(err, "cannot resume: this run's settings differ"),
               "the legacy commit with %s %s: rc %d", what[c][0], what[c][1], rc);
        char rj[700], frj[700], cmd[1200];
        snprintf(rj, sizeof rj, "%s/run.json", ck);
        snprintf(frj, sizeof frj, "%s/run.json", fdir);
        CHECK(nl_t_same_file(commit4, fcommit) && nl_t_same_file(rj, frj) && !nl_t_file_has(err, "older build"));
        snprintf(cmd, sizeof cmd, "test $(ls %s | grep -c commit-) = 1", ck);
        CHECK(system(cmd) == 0);
    }
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "resume_extend")) return 1;
    make_inputs();
    test_extend_steps();
    test_change_lr();
    test_refused();
    test_legacy_commit();
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

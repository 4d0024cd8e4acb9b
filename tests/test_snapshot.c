/* `train --save-every N`: OUT-stepK.gguf snapshots, driven through the real CLI binary (NL_CLI):
 *  - the path rule (nl_train_snapshot_path);
 *  - a run writes a snapshot at every multiple of N, each byte-identical to the --out of the same
 *    run stopped there (--stop-after K: the same schedule), the last one to its own --out; no
 *    temp file is left; a snapshot loads as an adapter;
 *  - resume-safe: a run stopped and resumed writes the later snapshots byte-identical to an
 *    uninterrupted run's and leaves the earlier ones untouched (the same inode, never rewritten);
 *    a snapshot missing after its commit (a kill between the two) is written by the resume;
 *  - the commits keep their own format and the last two;
 *  - bad values refused with the flag named; a snapshot path that is an input (or the temp file
 *    of one) refused before anything runs, the input untouched. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/quant.h"
#include "train/trainer.h"
#include "util/util.h"

static char tmp[256], model[512], data[512];

/* shuffle and dropout on, a warmup and a cosine schedule: the snapshot must be the step's
 * adapter whatever the step depends on */
static void base_args(nl_t_args *a, const char *out, const char *ck) {
    nl_t_train_args(a, model, data, out);
    nl_t_arg(a, "--steps");
    nl_t_arg(a, "6");
    nl_t_arg(a, "--lr");
    nl_t_arg(a, "3e-3");
    nl_t_arg(a, "--warmup");
    nl_t_arg(a, "2");
    nl_t_arg(a, "--commit-every");
    nl_t_arg(a, "5");
    if (ck) {
        nl_t_arg(a, "--checkpoint-dir");
        nl_t_arg(a, ck);
    }
}

static void path(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static ino_t inode(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? st.st_ino : 0;
}

/* Commit files in DIR (commit-K.nlck). */
static int count_commits(const char *dir, int *newest) {
    DIR *d = opendir(dir);
    int n = 0;
    *newest = -1;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail[16];
        if (sscanf(e->d_name, "commit-%d.%15s", &s, tail) == 2 && !strcmp(tail, "nlck")) {
            n++;
            if (s > *newest) *newest = s;
        }
    }
    closedir(d);
    return n;
}

static int has_tmp_file(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) found = 1;
    }
    closedir(d);
    return found;
}

static void make_inputs(void) {
    snprintf(model, sizeof model, "%s/q3.gguf", tmp);
    snprintf(data, sizeof data, "%s/train.jsonl", tmp);
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
    static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio",       "Renew the passport"};
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 12; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[i % 6],
                i % 3 ? " please" : "", tags[(i * 3) % 5]);
    fclose(f);
}

static void test_path_rule(void) {
    static const struct {
        const char *out, *want;
        long long step;
    } cases[] = {
        {"out/adapter.gguf", "out/adapter-step40.gguf", 40},
        {"adapter.gguf", "adapter-step1.gguf", 1},
        {"out/adapter", "out/adapter-step7.gguf", 7},
        {"a.b/x.bin", "a.b/x.bin-step3.gguf", 3},
        {".gguf", "-step2.gguf", 2},
        {"big.gguf", "big-step9007199254740992.gguf", 9007199254740992LL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *p = nl_train_snapshot_path(cases[i].out, cases[i].step);
        CHECKF(p && !strcmp(p, cases[i].want), "%s step %lld: %s, expected %s", cases[i].out, cases[i].step,
               p ? p : "NULL", cases[i].want);
        free(p);
    }
}

static char ref_out[512];

/* An uninterrupted run with snapshots every 2 steps; the same run stopped at 2 and 4. */
static void test_snapshots(void) {
    char ck[512], err[512], snap[3][512];
    path(ref_out, sizeof ref_out, "ref.gguf");
    path(ck, sizeof ck, "ck_ref");
    path(err, sizeof err, "ref.err");
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "ref-step%d.gguf", 2 * (k + 1));
        path(snap[k], sizeof snap[k], name);
    }
    nl_t_args a;
    base_args(&a, ref_out, ck);
    nl_t_argi(&a, "--save-every", 2);
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "run exited %d", rc);
    for (int k = 0; k < 3; k++) CHECKF(exists(snap[k]), "%s missing", snap[k]);
    CHECK(!nl_t_same_file(snap[0], snap[1])); /* the steps differ */
    CHECK(nl_t_same_file(snap[2], ref_out));  /* step 6 is the end */
    CHECK(!has_tmp_file(tmp));
    /* a snapshot step is a commit step (commits every 5 here), the commit first: a resume never
     * replays the step of a snapshot written */
    for (int k = 0; k < 3; k++) {
        char want[2048];
        snprintf(want, sizeof want, "  (committed)  snapshot %s\n", snap[k]);
        CHECKF(nl_t_file_has(err, want), "no '%s'", want);
    }
    /* the commits keep their format and the last two: steps 5 (--commit-every) and 6 */
    int newest, n = count_commits(ck, &newest);
    CHECKF(n == 2 && newest == 6, "%d commits, newest %d", n, newest);
    /* a snapshot is an adapter: it loads like --out */
    nl_model *m = nl_model_load(model);
    nl_adapter *ad = m ? nl_adapter_load(m, snap[0]) : NULL;
    CHECKF(ad && ad->rank == 4, "%s: %s", snap[0], ad ? "wrong rank" : nl_last_error());
    nl_adapter_free(ad);
    if (m) nl_model_free(m);

    /* the run stopped at step K writes --out = the adapter at step K: each snapshot is that */
    for (int k = 0; k < 2; k++) {
        char out[512], name[32];
        snprintf(name, sizeof name, "stop%d.gguf", 2 * (k + 1));
        path(out, sizeof out, name);
        base_args(&a, out, NULL);
        nl_t_argi(&a, "--stop-after", 2 * (k + 1));
        CHECK(nl_t_args_run(&a, err) == 0);
        CHECKF(nl_t_same_file(out, snap[k]), "--stop-after %d: --out differs from the snapshot of step %d", 2 * (k + 1),
               2 * (k + 1));
    }
    /* without a checkpoint directory the snapshots are the same */
    char out[512], s4[512];
    path(out, sizeof out, "nock.gguf");
    path(s4, sizeof s4, "nock-step4.gguf");
    base_args(&a, out, NULL);
    nl_t_argi(&a, "--save-every", 4);
    CHECK(nl_t_args_run(&a, err) == 0 && nl_t_same_file(s4, snap[1]) && nl_t_same_file(out, ref_out));
    path(s4, sizeof s4, "nock-step2.gguf");
    CHECK(!exists(s4));
}

/* Stopped at 3 and resumed: the later snapshots as the uninterrupted run's, the earlier one
 * untouched; a snapshot lost after its commit is written by the resume. */
static void test_resume(void) {
    char ck[512], out[512], err[512], s2[512], s4[512], s6[512], r2[512], r4[512];
    path(ck, sizeof ck, "ck_res");
    path(out, sizeof out, "res.gguf");
    path(err, sizeof err, "res.err");
    path(s2, sizeof s2, "res-step2.gguf");
    path(s4, sizeof s4, "res-step4.gguf");
    path(s6, sizeof s6, "res-step6.gguf");
    path(r2, sizeof r2, "ref-step2.gguf");
    path(r4, sizeof r4, "ref-step4.gguf");
    nl_t_args a;
    base_args(&a, out, ck);
    nl_t_argi(&a, "--save-every", 2);
    nl_t_argi(&a, "--stop-after", 3);
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(exists(s2) && !exists(s4));
    ino_t ino2 = inode(s2);
    struct stat st0;
    CHECK(stat(s2, &st0) == 0);
    /* resume one step (to 4), then drop the step-4 snapshot as a kill right after the commit of
     * step 4 would have left it */
    base_args(&a, out, ck);
    nl_t_arg(&a, "--resume");
    nl_t_argi(&a, "--save-every", 2);
    nl_t_argi(&a, "--stop-after", 1);
    CHECK(nl_t_args_run(&a, err) == 0);
    CHECK(nl_t_same_file(s4, r4));
    int newest;
    count_commits(ck, &newest);
    CHECK(newest == 4);
    CHECK(unlink(s4) == 0);
    base_args(&a, out, ck);
    nl_t_arg(&a, "--resume");
    nl_t_argi(&a, "--save-every", 2);
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 0, "final resume exited %d", rc);
    CHECK(nl_t_file_has(err, "snapshot of step 4 was missing"));
    CHECK(nl_t_same_file(s4, r4) && nl_t_same_file(out, ref_out) && nl_t_same_file(s6, ref_out));
    struct stat st1;
    CHECK(stat(s2, &st1) == 0 && inode(s2) == ino2 && st1.st_mtime == st0.st_mtime && st1.st_size == st0.st_size);
    CHECK(nl_t_same_file(s2, r2));
}

static void test_refusals(void) {
    char out[512], err[512], init[512];
    path(out, sizeof out, "bad.gguf");
    path(err, sizeof err, "bad.err");
    static const char *const bad[] = {"0", "-2", "x", "1.5", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        nl_t_args a;
        base_args(&a, out, NULL);
        nl_t_arg(&a, "--save-every");
        nl_t_arg(&a, bad[i]);
        int rc = nl_t_args_run(&a, err);
        CHECKF(rc == 2 && nl_t_file_has(err, "--save-every"), "--save-every '%s': rc %d", bad[i], rc);
    }
    CHECK(!exists(out));
    /* the library refuses a negative value with the flag named */
    nl_train_opts o;
    nl_train_defaults(&o);
    o.model = model;
    o.data = data;
    o.out = out;
    o.save_every = -1;
    o.progress = NULL;
    nl_train_result res;
    CHECK(nl_train(&o, &res) != 0 && strstr(nl_last_error(), "--save-every -1"));
    /* a snapshot path that is an input: refused before anything is read or written */
    path(init, sizeof init, "ref-step4.gguf");
    size_t l0;
    char *before = nl_t_slurp(init, &l0);
    char ref[512];
    path(ref, sizeof ref, "ref.gguf");
    nl_t_args a;
    base_args(&a, ref, NULL);
    nl_t_arg(&a, "--init-adapter");
    nl_t_arg(&a, init);
    nl_t_argi(&a, "--save-every", 2);
    int rc = nl_t_args_run(&a, err);
    CHECKF(rc == 2 && nl_t_file_has(err, "--init-adapter") && nl_t_file_has(err, "at step 4") &&
               nl_t_file_has(err, "another --out"),
           "init-adapter = a snapshot: rc %d", rc);
    /* through a symbolic link, and the temp file of a snapshot as --log-json */
    char link[512], tmpname[600];
    path(link, sizeof link, "link.gguf");
    CHECK(symlink(init, link) == 0);
    base_args(&a, ref, NULL);
    nl_t_arg(&a, "--init-adapter");
    nl_t_arg(&a, link);
    nl_t_argi(&a, "--save-every", 4);
    CHECK(nl_t_args_run(&a, err) == 2 && nl_t_file_has(err, "at step 4"));
    snprintf(tmpname, sizeof tmpname, "%s/ref-step6.gguf.tmp", tmp);
    FILE *f = fopen(tmpname, "w");
    if (f) fclose(f);
    base_args(&a, ref, NULL);
    nl_t_arg(&a, "--log-json");
    nl_t_arg(&a, tmpname);
    nl_t_argi(&a, "--save-every", 3);
    CHECK(nl_t_args_run(&a, err) == 2 && nl_t_file_has(err, "--log-json") && nl_t_file_has(err, "temp file"));
    unlink(tmpname);
    size_t l1;
    char *after = nl_t_slurp(init, &l1);
    CHECK(before && after && l0 == l1 && !memcmp(before, after, l0));
    free(before);
    free(after);
    /* a step that is no multiple of N is no snapshot of the run: allowed */
    char out2[512];
    path(out2, sizeof out2, "ref2.gguf");
    base_args(&a, out2, NULL);
    nl_t_arg(&a, "--init-adapter");
    nl_t_arg(&a, init);
    nl_t_argi(&a, "--save-every", 3);
    nl_t_argi(&a, "--stop-after", 1);
    CHECK(nl_t_args_run(&a, err) == 0);
    /* beyond the run's steps: said */
    base_args(&a, out2, NULL);
    nl_t_argi(&a, "--save-every", 7);
    nl_t_argi(&a, "--stop-after", 1);
    CHECK(nl_t_args_run(&a, err) == 0 && nl_t_file_has(err, "--save-every 7 is beyond this run's 6 steps"));
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "snapshot")) return 1;
    make_inputs();
    test_path_rule();
    test_snapshots();
    test_resume();
    test_refusals();
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

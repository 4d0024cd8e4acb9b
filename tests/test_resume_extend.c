/* An extendable resume, driven through the real CLI binary (NL_CLI): `--resume` with more
 * --steps / --epochs, or another learning rate or schedule, continues with the optimizer state
 * and says what changed; any other difference is refused as before.
 *  (i)   a constant schedule: 10 steps, then --resume --steps 20, is bit-identical to 20 steps
 *        straight (adapter bytes, and the log's losses); the same with --epochs;
 *  (ii)  a changed --lr (and schedule) on resume is accepted, printed and used (the log's lr);
 *  (iii) a changed rank, data or model is still refused with the settings named, the commits
 *        untouched; fewer steps than the commit's are refused. */
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/json.h"
#include "util/util.h"

static char tmp[256], model[512], model2[512], data[512], data2[512];

typedef struct {
    const char *v[64];
    int n;
} args;

static void arg(args *a, const char *s) {
    if (a->n < 62) a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

/* a constant schedule after a warm-up, shuffle and dropout on */
static void base_args(args *a, const char *out, const char *ck, const char *log) {
    a->n = 0;
    arg(a, NL_CLI);
    arg(a, "train");
    arg(a, "--model"); arg(a, model);
    arg(a, "--data"); arg(a, data);
    arg(a, "--out"); arg(a, out);
    arg(a, "--batch-tokens"); arg(a, "48");
    arg(a, "--rank"); arg(a, "4");
    arg(a, "--dropout"); arg(a, "0.1");
    arg(a, "--lr"); arg(a, "3e-3");
    arg(a, "--schedule"); arg(a, "constant");
    arg(a, "--warmup"); arg(a, "2");
    arg(a, "--backend"); arg(a, "host");
    arg(a, "--threads"); arg(a, "2");
    arg(a, "--thermal"); arg(a, "off");
    arg(a, "--commit-every"); arg(a, "4");
    if (ck) { arg(a, "--checkpoint-dir"); arg(a, ck); }
    if (log) { arg(a, "--log-json"); arg(a, log); }
}

static int run(const args *a, const char *err) { return nl_t_run(a->v, err, NULL); }

static void path(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* The log's "loss" and "lr" by step (index step - 1); the number of lines. */
static int read_log(const char *p, double *loss, double *lr, int cap) {
    size_t len;
    char *b = nl_t_slurp(p, &len);
    int n = 0;
    for (char *q = b; b && q < b + len && n < cap;) {
        char *eol = memchr(q, '\n', (size_t)(b + len - q));
        if (!eol) break;
        nl_json *j = nl_json_parse(q, (size_t)(eol - q), NULL);
        int64_t s;
        const nl_json *lo = nl_json_get(j, "loss"), *l = nl_json_get(j, "lr");
        if (j && !nl_json_int64(nl_json_get(j, "step"), &s) && s == n + 1 && nl_json_is_number(lo) && nl_json_is_number(l)) {
            loss[n] = lo->u.num.d;
            lr[n] = l->u.num.d;
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
    static const char *notes[] = {"Book the hotel for Friday", "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio", "Renew the passport"};
    FILE *f = fopen(p, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[(i + salt) % 6], i % 3 ? " please" : "",
                tags[(i * 3 + salt) % 5]);
    fclose(f);
}

static void make_inputs(void) {
    path(model, sizeof model, "q3.gguf");
    path(model2, sizeof model2, "q3b.gguf");
    path(data, sizeof data, "train.jsonl");
    path(data2, sizeof data2, "other.jsonl");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model) || nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 6, model2)) {
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
    args a;
    base_args(&a, straight, NULL, straight_log);
    arg(&a, "--steps"); arg(&a, "20");
    CHECK(run(&a, err) == 0);
    CHECK(read_log(straight_log, S_LOSS, S_LR, 64) == 20);
    base_args(&a, out, ck, log);
    arg(&a, "--steps"); arg(&a, "10");
    CHECK(run(&a, err) == 0);
    CHECK(!nl_t_same_file(out, straight));
    base_args(&a, out, ck, log);
    arg(&a, "--steps"); arg(&a, "20");
    arg(&a, "--resume");
    int rc = run(&a, err);
    CHECKF(rc == 0, "extended resume exited %d", rc);
    CHECKF(nl_t_file_has(err, "resuming step 10: --steps 10 -> 20\n") && nl_t_file_has(err, "at step 10/20"), "no change said");
    CHECKF(nl_t_same_file(out, straight), "10 + 10 steps differ from 20 straight");
    double loss[64], lr[64];
    int n = read_log(log, loss, lr, 64);
    CHECK(n == 20);
    for (int i = 0; i < n && i < 20; i++) CHECKF(loss[i] == S_LOSS[i] && lr[i] == S_LR[i], "step %d: loss %.17g vs %.17g", i + 1, loss[i], S_LOSS[i]);
    /* the same run extended once more, by --epochs this time: more steps, said */
    base_args(&a, out, ck, log);
    arg(&a, "--epochs"); arg(&a, "30");
    arg(&a, "--resume");
    arg(&a, "--stop-after"); arg(&a, "1");
    CHECK(run(&a, err) == 0 && nl_t_file_has(err, "resuming step 20: --steps 20 -> "));
    /* fewer steps than the commit's: refused */
    char ck2[512], out2[512];
    path(ck2, sizeof ck2, "ck_short");
    path(out2, sizeof out2, "short.gguf");
    base_args(&a, out2, ck2, NULL);
    arg(&a, "--steps"); arg(&a, "6");
    CHECK(run(&a, err) == 0);
    base_args(&a, out2, ck2, NULL);
    arg(&a, "--steps"); arg(&a, "4");
    arg(&a, "--resume");
    CHECK(run(&a, err) == 1 && nl_t_file_has(err, "the newest commit is at step 6, beyond this run's 4 steps"));
}

/* (ii) another learning rate (and schedule) on resume: accepted, printed and used */
static void test_change_lr(void) {
    char ck[512], out[512], log[512], err[512];
    path(ck, sizeof ck, "ck_lr");
    path(out, sizeof out, "lr.gguf");
    path(log, sizeof log, "lr.jsonl");
    path(err, sizeof err, "lr.err");
    args a;
    base_args(&a, out, ck, log);
    arg(&a, "--steps"); arg(&a, "20");
    arg(&a, "--stop-after"); arg(&a, "8");
    CHECK(run(&a, err) == 0);
    base_args(&a, out, ck, log);
    arg(&a, "--steps"); arg(&a, "20");
    arg(&a, "--resume");
    for (int i = 0; i < a.n; i++)
        if (!strcmp(a.v[i], "3e-3")) a.v[i] = "1e-3";
    int rc = run(&a, err);
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
    arg(&a, "--steps"); arg(&a, "24");
    arg(&a, "--resume");
    for (int i = 0; i + 1 < a.n; i++) {
        if (!strcmp(a.v[i], "--schedule")) a.v[i + 1] = "cosine";
        if (!strcmp(a.v[i], "--warmup")) a.v[i + 1] = "0";
    }
    CHECK(run(&a, err) == 0);
    CHECKF(nl_t_file_has(err, "resuming step 20: --steps 20 -> 24, --lr 0.001 -> 0.003, --schedule constant -> cosine, "
                              "--lr-min (not recorded) -> 0.0003") && nl_t_file_has(err, ", --warmup 2 -> 0\n"),
           "the schedule's change is not said");
}

/* (iii) anything else still refused, with the current message; the commits untouched */
static void test_refused(void) {
    char ck[512], out[512], err[512], commit[600];
    path(ck, sizeof ck, "ck_ref");
    path(out, sizeof out, "ref.gguf");
    path(err, sizeof err, "ref.err");
    snprintf(commit, sizeof commit, "%s/commit-4.nlck", ck);
    args a;
    base_args(&a, out, ck, NULL);
    arg(&a, "--steps"); arg(&a, "4");
    CHECK(run(&a, err) == 0);
    size_t l0;
    char *before = nl_t_slurp(commit, &l0);
    static const char *const what[] = {"rank", "data", "model"};
    for (int c = 0; c < 3; c++) {
        base_args(&a, out, ck, NULL);
        arg(&a, "--steps"); arg(&a, "8");
        arg(&a, "--resume");
        for (int i = 0; i < a.n; i++) {
            if (c == 0 && !strcmp(a.v[i], "4")) a.v[i] = "8";
            if (c == 1 && a.v[i] == data) a.v[i] = data2;
            if (c == 2 && a.v[i] == model) a.v[i] = model2;
        }
        int rc = run(&a, err);
        char needle[64];
        snprintf(needle, sizeof needle, c == 0 ? "rank 4 there, 8 now" : "%s ", what[c]);
        CHECKF(rc == 1 && nl_t_file_has(err, "cannot resume: this run's settings differ from those the commits were made with: ") &&
                   nl_t_file_has(err, needle) && nl_t_file_has(err, "(start a fresh run with another --checkpoint-dir, or resume with the same settings)"),
               "changed %s: rc %d", what[c], rc);
        CHECKF(!nl_t_file_has(err, "steps"), "changed %s: the allowed --steps change is named as a difference", what[c]);
    }
    size_t l1;
    char *after = nl_t_slurp(commit, &l1);
    CHECK(before && after && l0 == l1 && !memcmp(before, after, l0));
    free(before);
    free(after);
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "resume_extend")) return 1;
    make_inputs();
    test_extend_steps();
    test_change_lr();
    test_refused();
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

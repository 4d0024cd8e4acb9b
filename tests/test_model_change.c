/* The model file changing under a run, or between a run and its --resume:
 *   a mapped GGUF truncated under the reader: reading a page that went away returns zeros, no
 *   SIGBUS, and nl_gguf_changed says so (a rewrite in place too; an untouched file: 0);
 *   `nightlora train` (Q8_0) paused by the thermal status while its model is truncated: the
 *   run stops with "MODEL changed while the run was using it ... the last commit (step N) is
 *   kept", exit 1 (not killed by SIGBUS), no adapter; with the model restored, --resume
 *   finishes from commit N;
 *   one weight byte changed in the middle of a tensor (a byte the former sampled identity
 *   skipped) between a run and its --resume: refused as another model; --verbose prints the
 *   time of the identity hash. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/util.h"

static char tmp[256], model[512], data[512], status_file[512];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* The CLI with args (NULL-terminated) through test.h's runner; stderr to err, stdout dropped. */
static pid_t spawn(const char *const *args, const char *err) {
    const char *v[64];
    int n = 0;
    v[n++] = NL_CLI;
    for (int i = 0; args[i] && n < 63; i++) v[n++] = args[i];
    v[n] = NULL;
    return nl_t_spawn(v, err, NULL);
}

static int run(const char *const *args, const char *err) { return nl_t_wait(spawn(args, err)); }

static void write_status(const char *v) {
    char t[600];
    snprintf(t, sizeof t, "%s.tmp", status_file);
    FILE *f = fopen(t, "w");
    fputs(v, f);
    fclose(f);
    rename(t, status_file);
}

static int copy_file(const char *from, const char *to) {
    size_t n;
    char *b = nl_t_slurp(from, &n);
    if (!b) return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(b, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(b);
    return rc;
}

static void show(const char *what, const char *err) {
    char *e = nl_t_slurp(err, NULL);
    const char *line = e ? strstr(e, "nightlora train: ") : NULL;
    printf("%-36s %.*s\n", what, line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    free(e);
}

/* The reader itself: a truncated mapping reads zeros and says it changed. */
static void test_reader(void) {
    char p[512];
    path_of(p, sizeof p, "reader.gguf");
    CHECK(copy_file(model, p) == 0);
    nl_gguf *g = nl_gguf_open(p);
    CHECK(g != NULL);
    if (!g) return;
    CHECK(nl_gguf_changed(g) == 0);
    const nl_gguf_tensor *t = &g->tensors[g->n_tensors - 1]; /* the last tensor: the end of the file */
    uint64_t sum = 0;
    for (uint64_t i = 0; i < t->nbytes; i++) sum += ((const uint8_t *)t->data)[i];
    CHECK(sum != 0);
    CHECK(truncate(p, 4096) == 0);
    sum = 0;
    for (uint64_t i = 0; i < t->nbytes; i++) sum += ((const volatile uint8_t *)t->data)[i]; /* no SIGBUS */
    CHECKF(sum == 0, "the pages that went away read %llu", (unsigned long long)sum);
    CHECK(nl_gguf_changed(g) == 1);
    nl_gguf_close(g);
    /* rewritten in place (same size, new bytes): the modification time says so */
    CHECK(copy_file(model, p) == 0);
    g = nl_gguf_open(p);
    CHECK(g && nl_gguf_changed(g) == 0);
    nl_t_sleep(0.02);
    int fd = open(p, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, "x", 1, 100) == 1);
    if (fd >= 0) close(fd);
    CHECK(g && nl_gguf_changed(g) == 1);
    nl_gguf_close(g);
    unlink(p);
}

/* A model truncated after it was loaded: the check the commands call at their end says so,
 * and merge writes nothing (before: it wrote a model merged from zero pages). */
static void test_check_after_load(void) {
    char p[512], out[512];
    path_of(p, sizeof p, "loaded.gguf");
    path_of(out, sizeof out, "merged.gguf");
    CHECK(copy_file(model, p) == 0);
    nl_model *m = nl_model_load(p);
    CHECK(m != NULL);
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "q,v", 2, 4, 1);
    CHECK(a != NULL);
    CHECK(nl_model_check_unchanged(m, p, "eval", "no result printed") == 0);
    CHECK(truncate(p, 4096) == 0);
    CHECK(nl_model_check_unchanged(m, p, "eval", "no result printed") == -1);
    char want[700];
    snprintf(want, sizeof want, "%s changed while eval was using it (truncated or rewritten); no result printed", p);
    CHECKF(strstr(nl_last_error(), want) != NULL, "%s", nl_last_error());
    CHECK(a && nl_merge(m, a, NL_TYPE_F32, out) == -1 && strstr(nl_last_error(), "changed while merge was using it"));
    CHECK(access(out, F_OK) != 0);
    nl_adapter_free(a);
    nl_model_free(m);
    unlink(p);
}

static int newest_commit(const char *dir) {
    int best = 0;
    char p[700];
    for (int s = 1; s <= 200; s++) {
        snprintf(p, sizeof p, "%s/commit-%d.nlck", dir, s);
        if (access(p, F_OK) == 0) best = s;
    }
    return best;
}

/* A Q8_0 run whose model is truncated while the run is paused. */
static void test_truncated_during_run(void) {
    char m[512], keep[512], ck[512], out[512], err[512];
    path_of(m, sizeof m, "run.gguf");
    path_of(keep, sizeof keep, "run.gguf.orig");
    path_of(ck, sizeof ck, "ck_trunc");
    path_of(out, sizeof out, "trunc_adapter.gguf");
    path_of(err, sizeof err, "trunc.err");
    CHECK(copy_file(model, m) == 0 && copy_file(model, keep) == 0);
    write_status("0\n");
    const char *const a[] = {"train",     "--model",          m,    "--data",         data,   "--out",
                             out,         "--steps",          "40", "--batch-tokens", "32",   "--rank",
                             "2",         "--checkpoint-dir", ck,   "--thermal",      "auto", "--thermal-status-file",
                             status_file, "--pacing-poll-ms", "10", "--threads",      "1",    NULL};
    pid_t pid = spawn(a, err);
    double t0 = nl_now();
    while (newest_commit(ck) < 2 && nl_now() - t0 < 60) nl_t_sleep(0.0005);
    write_status("3\n");
    while (!nl_t_file_has(err, "paused: thermal status 3") && nl_now() - t0 < 60) nl_t_sleep(0.002);
    int paused = nl_t_file_has(err, "paused: thermal status 3");
    CHECK(truncate(m, 4096) == 0);
    write_status("0\n");
    int rc = nl_t_wait(pid);
    int at = newest_commit(ck);
    char want[1024];
    snprintf(want, sizeof want, "the last commit (step %d) is kept", at);
    CHECKF(paused, "the run never paused");
    CHECKF(rc == 1, "exit %d (expected 1; 135 is a SIGBUS)", rc);
    CHECKF(nl_t_file_has(err, "run.gguf changed while the run was using it") && nl_t_file_has(err, want),
           "expected '%s'", want);
    CHECK(at >= 2 && at < 40 && access(out, F_OK) != 0);
    show("model truncated during a run", err);
    /* the commits are intact: with the model as it was, --resume finishes */
    CHECK(copy_file(keep, m) == 0);
    const char *const r[] = {"train", "--model",          m,    "--data",         data,  "--out",
                             out,     "--steps",          "40", "--batch-tokens", "32",  "--rank",
                             "2",     "--checkpoint-dir", ck,   "--thermal",      "off", "--threads",
                             "1",     "--resume",         NULL};
    rc = run(r, err);
    snprintf(want, sizeof want, "resumed from %s at step %d/40", ck, at);
    CHECKF(rc == 0 && nl_t_file_has(err, want) && access(out, F_OK) == 0, "resume: exit %d, expected '%s'", rc, want);
}

/* One weight byte changed between a run and its --resume. */
static void test_weight_changed(void) {
    char m[512], ck[512], out[512], err[512];
    path_of(m, sizeof m, "small.gguf");
    path_of(ck, sizeof ck, "ck_weight");
    path_of(out, sizeof out, "weight_adapter.gguf");
    path_of(err, sizeof err, "weight.err");
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "small", NL_TYPE_Q8_0, 3, m) == 0);
    const char *a[] = {"train", "--model",          m,   "--data",         data,  "--out",     out,  "--steps",
                       "2",     "--stop-after",     "1", "--batch-tokens", "32",  "--rank",    "2",  "--targets",
                       "q",     "--checkpoint-dir", ck,  "--thermal",      "off", "--verbose", NULL, NULL,
                       NULL};
    /* NL_TEST_SMALL (CI's qemu run): the ref backend, whose start checks nothing: the host
     * backend's start checks of this 11 MiB model (T = 16, 64, 256 against ref, twice, the
     * changed model's verdicts being another cache key) took ~200 s under qemu -cpu max; the
     * identity hash and the refusal this checks do not depend on the backend */
    if (nl_t_small()) a[22] = "--backend", a[23] = "ref";
    CHECK(run(a, err) == 0);
    CHECKF(nl_t_file_has(err, "model identity: ") && nl_t_file_has(err, "hashed whole"),
           "--verbose prints no hash time");
    /* a byte inside a tensor, away from the first and last MiB and from the 256 blocks of
     * 4 KiB the former identity sampled */
    nl_gguf *g = nl_gguf_open(m);
    CHECK(g != NULL);
    if (!g) return;
    uint64_t size = g->size, stride = (size - 4096) / 255, at = 0;
    for (uint64_t i = 0; i < 255 && !at; i++) {
        uint64_t off = stride * i + 4096 + stride / 2;
        if (off < (1u << 20) || off + (1u << 20) > size) continue;
        for (int64_t k = 0; k < g->n_tensors && !at; k++) {
            uint64_t t0 = g->data_offset + g->tensors[k].offset;
            if (off >= t0 && off < t0 + g->tensors[k].nbytes) at = off;
        }
    }
    nl_gguf_close(g);
    CHECK(at > 0);
    int fd = open(m, O_RDWR);
    unsigned char b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, (off_t)at) == 1);
    b ^= 1; /* the lowest bit: a Q8_0 quant or the low mantissa bit of a scale, still finite */
    CHECK(pwrite(fd, &b, 1, (off_t)at) == 1);
    close(fd);
    const char *r[] = {"train", "--model",        m,     "--data",   data, "--out",     out, "--steps",
                       "2",     "--batch-tokens", "32",  "--rank",   "2",  "--targets", "q", "--checkpoint-dir",
                       ck,      "--thermal",      "off", "--resume", NULL, NULL,        NULL};
    if (nl_t_small()) r[20] = "--backend", r[21] = "ref";
    int rc = run(r, err);
    CHECKF(rc == 1 && nl_t_file_has(err, "cannot resume") && nl_t_file_has(err, "model "),
           "a changed weight byte: exit %d", rc);
    show("one weight byte changed", err);
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "test_model_change")) return 1;
    path_of(model, sizeof model, "q3.gguf");
    path_of(data, sizeof data, "notes.jsonl");
    path_of(status_file, sizeof status_file, "thermal");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"Note: buy milk %d\\nTag:\", \"completion\": \" shopping\"}\n", i);
    fclose(f);
    double t0 = nl_now();
    test_reader();
    test_check_after_load();
    test_truncated_during_run();
    test_weight_changed();
    printf("%.1f s\n", nl_now() - t0);
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

/* Faults at commit time, end to end through nl_train (tiny qwen3, 4 steps, a commit every
 * step, shuffle and dropout on):
 *  - the checkpoint I/O of the run goes through nl_io_fault (the hooks' ckpt_io); for EVERY call k of
 *    the third commit (open, each write, fsync, close, rename, directory fsync, the listing
 *    and the unlink that prune commit 1), with ENOSPC and EIO, a one-off and a sticky fault
 *    (a dead disk):
 *      · a failure the commit must report stops the run with an error that names the step
 *        and the failed call (and the errno text) and what is kept (after a failed directory
 *        fsync: the new commit, already in place); no adapter is written;
 *      · a failed prune (listing, or unlink of an old commit) is no error: the run ends
 *        normally;
 *      · the previous commit (step 2) still loads with the normal I/O;
 *      · --resume with the normal I/O ends bit-identical (adapter bytes and logged losses) to
 *        an uninterrupted run;
 *  - a TRUNCATED newest commit (the bit-flipped one is in test_resume): the resume warns,
 *    naming the file, uses the previous commit and still ends bit-identical;
 *  - the directory's listing failing: the resume and a fresh run stop with the error, no
 *    commit is lost, and the resume afterwards ends bit-identical;
 *  - planted symbolic links are never followed: DIR/ckpt.tmp, DIR/run.json.tmp, DIR/lock and
 *    OUT.tmp each pointing at a file outside; the run refuses, naming the link, and the file
 *    outside is untouched. A stale regular temp file (a killed run's) is replaced;
 *  - nothing blocks: a FIFO in place of the newest commit (the resume warns and uses the
 *    previous one), as --thermal-status-file, --battery-temp-file, --log-json or --model; a
 *    directory as --data: each refused, naming the file and what it is;
 *  - the messages: a failed directory fsync says the new commit is in place; a failed write
 *    of --out or --log-json names the step and the way back (--resume with another --out);
 *    a lock held by a run whose pid the lock file does not name says so (no stale pid); a
 *    worker thread that cannot start gives the errno text. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "util/json.h"
#include "model/model.h"
#include "model/quant.h"
#include "train/checkpoint.h"
#include "os/io.h"
#include "os/mem.h"
#include "train/trainer.h"
#include "train/trainer_hooks.h"
#include "util/pool.h"
#include "util/util.h"

static char tmp[256], model[512], data[512];

/* ---- a recording I/O layer: the name of every call, in order ---- */

#define MAXCALLS 4096
typedef struct {
    nl_io io;
    const nl_io *base;
    long n;
    const char *name[MAXCALLS];
} recorder;

#define REC(r, nm)                                                                                                     \
    do {                                                                                                               \
        recorder *r_ = (r);                                                                                            \
        if (r_->n < MAXCALLS) r_->name[r_->n] = nm;                                                                    \
        r_->n++;                                                                                                       \
    } while (0)
static int rc_open(void *c, const char *p, int fl, int mode) {
    recorder *r = c;
    REC(r, "open");
    return r->base->open(r->base->ctx, p, fl, mode);
}
static ssize_t rc_read(void *c, int fd, void *b, size_t n) {
    recorder *r = c;
    REC(r, "read");
    return r->base->read(r->base->ctx, fd, b, n);
}
static ssize_t rc_write(void *c, int fd, const void *b, size_t n) {
    recorder *r = c;
    REC(r, "write");
    return r->base->write(r->base->ctx, fd, b, n);
}
static int rc_fstat(void *c, int fd, uint64_t *s, uint32_t *m) {
    recorder *r = c;
    REC(r, "fstat");
    return r->base->fstat(r->base->ctx, fd, s, m);
}
static int rc_fsync(void *c, int fd) {
    recorder *r = c;
    REC(r, "fsync");
    return r->base->fsync(r->base->ctx, fd);
}
static int rc_close(void *c, int fd) {
    recorder *r = c;
    REC(r, "close");
    return r->base->close(r->base->ctx, fd);
}
static int rc_rename(void *c, const char *a, const char *b) {
    recorder *r = c;
    REC(r, "rename");
    return r->base->rename(r->base->ctx, a, b);
}
static int rc_unlink(void *c, const char *p) {
    recorder *r = c;
    REC(r, "unlink");
    return r->base->unlink(r->base->ctx, p);
}
static int rc_fsync_dir(void *c, const char *d) {
    recorder *r = c;
    REC(r, "fsync_dir");
    return r->base->fsync_dir(r->base->ctx, d);
}
static int rc_lstat(void *c, const char *p, uint32_t *m) {
    recorder *r = c;
    REC(r, "lstat");
    return r->base->lstat(r->base->ctx, p, m);
}
static int rc_list(void *c, const char *d, int (*each)(void *, const char *), void *u) {
    recorder *r = c;
    REC(r, "list");
    return r->base->list(r->base->ctx, d, each, u);
}

static void recorder_init(recorder *r) {
    memset(r, 0, sizeof *r);
    r->io = (nl_io){rc_open,   rc_read,   rc_write,     rc_fstat, rc_fsync, rc_close,
                    rc_rename, rc_unlink, rc_fsync_dir, rc_lstat, rc_list,  r};
    r->base = nl_io_posix();
}

/* ---- helpers ---- */

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* The logged (step, loss, grad_norm) triples, as text: exact (%.17g in the log). */
static int log_sig(const char *path, char *out, size_t cap) {
    size_t len;
    char *b = nl_t_slurp(path, &len);
    if (!b) return -1;
    size_t o = 0;
    out[0] = 0;
    int n = 0;
    for (char *p = b; p < b + len;) {
        char *eol = memchr(p, '\n', (size_t)(b + len - p));
        if (!eol) break;
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        int64_t s;
        const nl_json *lo = nl_json_get(j, "loss"), *gn = nl_json_get(j, "grad_norm");
        if (j && !nl_json_int64(nl_json_get(j, "step"), &s) && nl_json_is_number(lo) && nl_json_is_number(gn) &&
            o < cap)
            o += (size_t)snprintf(out + o, cap - o, "%lld %.17g %.17g\n", (long long)s, lo->u.num.d, gn->u.num.d);
        nl_json_free(j);
        n++;
        p = eol + 1;
    }
    free(b);
    return n;
}

static void opts(nl_train_opts *o, const char *out, const char *ck, const char *log) {
    nl_train_defaults(o);
    o->model = model;
    o->data = data;
    o->out = out;
    o->steps = 4;
    o->batch_tokens = 48;
    o->rank = 4;
    o->alpha = 8.0f;
    o->dropout = 0.1f;
    o->lr = 3e-3;
    o->thermal = "off";
    o->progress = NULL;
    o->checkpoint_dir = ck;
    o->commit_every = 1;
    o->log_json = log;
}

static void rm_rf(const char *p) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", p);
    if (system(cmd)) {}
}

static char ref_out[512], ref_log[512], ref_sig[8192];

static void reference(void) {
    char ck[512];
    snprintf(ref_out, sizeof ref_out, "%s/ref.gguf", tmp);
    snprintf(ref_log, sizeof ref_log, "%s/ref.jsonl", tmp);
    snprintf(ck, sizeof ck, "%s/ck_ref", tmp);
    nl_train_opts o;
    opts(&o, ref_out, ck, ref_log);
    nl_train_result r;
    int rc = nl_train(&o, &r);
    CHECKF(rc == 0 && r.steps_done == 4, "reference: %s", nl_last_error());
    CHECK(log_sig(ref_log, ref_sig, sizeof ref_sig) == 4);
}

/* The calls made by the commits of steps 1..k (a clean run stopped after k steps). */
static long calls_through(int k, recorder *rec) {
    char ck[512], out[512], log[512];
    snprintf(ck, sizeof ck, "%s/ck_count%d", tmp, k);
    snprintf(out, sizeof out, "%s/count%d.gguf", tmp, k);
    snprintf(log, sizeof log, "%s/count%d.jsonl", tmp, k);
    recorder_init(rec);
    nl_train_opts o;
    opts(&o, out, ck, log);
    o.stop_after = k;
    nl_train_hooks hk = {.ckpt_io = &rec->io};
    nl_train_result r;
    int rc = nl_train_hooked(&o, &hk, &r);
    CHECKF(rc == 0 && r.steps_done == k, "count run %d: %s", k, nl_last_error());
    return rec->n;
}

/* What the error of a failed call must say (checkpoint.c's wording), by call. */
static const char *call_words(const char *name) {
    if (!strcmp(name, "open")) return "cannot create";
    if (!strcmp(name, "write")) return "write";
    if (!strcmp(name, "fsync")) return "fsync failed";
    if (!strcmp(name, "close")) return "close failed";
    if (!strcmp(name, "rename")) return "rename";
    if (!strcmp(name, "fsync_dir")) return "fsync of the directory";
    return "?";
}

static void test_commit_faults(void) {
    recorder r2, r3;
    long c2 = calls_through(2, &r2), c3 = calls_through(3, &r3);
    CHECKF(c3 > c2 + 5, "commit 3 made %ld calls", c3 - c2);
    int n_cases = 0, n_fail = 0, n_prune = 0;
    int seen_unlink = 0, seen_fsync_dir = 0, seen_rename = 0;
    int n_skipped = 0;
    for (long k = c2; k < c3 && k < MAXCALLS; k++) {
        const char *call = r3.name[k];
        /* NL_TEST_SMALL (qemu, .ci/aarch64.sh): of a run of calls of one kind (the commit's
         * writes), the first and the last only: every kind of call and every neighbour pair
         * still faulted (3 of commit 3's 12 calls skipped, 6 of 24 runs, each a train and a
         * resume: ~20 s under qemu) */
        if (nl_t_small() && k > c2 && k + 1 < c3 && k + 1 < MAXCALLS && !strcmp(call, r3.name[k - 1]) &&
            !strcmp(call, r3.name[k + 1])) {
            n_skipped++;
            continue;
        }
        /* a clean commit lists the directory and unlinks only old commits: the prune */
        int prune = !strcmp(call, "unlink") || !strcmp(call, "list");
        seen_unlink |= prune;
        seen_fsync_dir |= !strcmp(call, "fsync_dir");
        seen_rename |= !strcmp(call, "rename");
        for (int sticky = 0; sticky < 2; sticky++) {
            int err = (k + sticky) % 2 ? EIO : ENOSPC;
            char ck[512], out[512], log[512], what[128], prev[600];
            snprintf(what, sizeof what, "call %ld (%s, %s, %s)", k - c2, call, strerror(err),
                     sticky ? "sticky" : "once");
            snprintf(ck, sizeof ck, "%s/ck_fault", tmp);
            snprintf(out, sizeof out, "%s/fault.gguf", tmp);
            snprintf(log, sizeof log, "%s/fault.jsonl", tmp);
            rm_rf(ck);
            unlink(out);
            nl_io_fault f;
            nl_io_fault_init(&f, NULL, k, err, sticky);
            nl_train_opts o;
            opts(&o, out, ck, log);
            nl_train_hooks hk = {.ckpt_io = &f.io};
            nl_train_result res;
            int rc = nl_train_hooked(&o, &hk, &res);
            n_cases++;
            const char *e = nl_last_error();
            if (prune && !sticky) {
                /* pruning is best effort: the run goes on and ends normally */
                n_prune++;
                CHECKF(rc == 0 && nl_t_same_file(out, ref_out), "%s: rc %d (%s)", what, rc, e);
                continue;
            }
            n_fail++;
            /* a sticky fault at a prune kills the NEXT commit (step 4) instead */
            const char *step = prune ? "step 4: commit failed" : "step 3: commit failed";
            const char *words = prune ? "cannot create" : call_words(call);
            /* what is kept: after a failed directory fsync the new commit is already in place */
            const char *kept = prune                        ? "previous commit (step 3) is kept"
                               : !strcmp(call, "fsync_dir") ? "the commit of step 3 is in place"
                                                            : "previous commit (step 2) is kept";
            CHECKF(rc == -1 && strstr(e, step) && strstr(e, words) && strstr(e, strerror(err)) && strstr(e, kept) &&
                       (strcmp(call, "fsync_dir") || !strstr(e, "previous commit (step 2) is kept")),
                   "%s: rc %d, message: %s", what, rc, e);
            if (k == c2 + 3 && !sticky) printf("commit fault: %s\n", e);
            CHECKF(!exists(out), "%s: an adapter was written after a failed commit", what);
            /* the previous commit loads with the normal I/O */
            snprintf(prev, sizeof prev, "%s/commit-%d.nlck", ck, prune ? 3 : 2);
            {
                /* read the header's hashes, then load with them: must verify */
                size_t len;
                char *b = nl_t_slurp(prev, &len);
                uint64_t ch = 0, mh = 0;
                if (b && len >= 32) {
                    memcpy(&ch, b + 16, 8);
                    memcpy(&mh, b + 24, 8);
                }
                free(b);
                nl_ckpt v;
                int ok = nl_ckpt_load_file(prev, ch, mh, 0, &v, NULL) == 0 && v.step == (uint64_t)(prune ? 3 : 2);
                CHECKF(ok, "%s: the previous commit %s does not load: %s", what, prev, nl_last_error());
                nl_ckpt_free(&v);
            }
            /* resume with the normal I/O: bit-identical to the uninterrupted run */
            o.resume = 1;
            rc = nl_train(&o, &res);
            char sig[8192];
            CHECKF(rc == 0 && res.steps_done == 4, "%s: resume: %s", what, nl_last_error());
            CHECKF(nl_t_same_file(out, ref_out), "%s: resumed adapter differs from the uninterrupted run", what);
            CHECKF(log_sig(log, sig, sizeof sig) == 4 && !strcmp(sig, ref_sig), "%s: resumed log differs:\n%s", what,
                   sig);
        }
    }
    CHECK(seen_unlink && seen_fsync_dir && seen_rename);
    printf("commit faults: %ld calls in commit 3 (%d skipped, NL_TEST_SMALL), %d runs (%d stopped with an error, %d "
           "failed prunes"
           " that did not matter)\n",
           c3 - c2, n_skipped, n_cases, n_fail, n_prune);
}

/* A case's checkpoint directory, adapter and log (512 bytes each), and a clean run stopped
 * after 3 steps that commits into them. */
static void case_run3(const char *name, char *ck, char *out, char *log, nl_train_opts *o) {
    snprintf(ck, 512, "%s/ck_%s", tmp, name);
    snprintf(out, 512, "%s/%s.gguf", tmp, name);
    snprintf(log, 512, "%s/%s.jsonl", tmp, name);
    opts(o, out, ck, log);
    o->stop_after = 3;
    nl_train_result r;
    CHECK(nl_train(o, &r) == 0 && r.steps_done == 3);
}

/* A truncated newest commit: warned about, the previous one used, same end. */
static void test_truncated_commit(void) {
    char ck[512], out[512], log[512], cfile[600];
    nl_train_opts o;
    case_run3("trunc", ck, out, log, &o);
    nl_train_result r;
    snprintf(cfile, sizeof cfile, "%s/commit-3.nlck", ck);
    struct stat st;
    CHECK(stat(cfile, &st) == 0);
    CHECK(truncate(cfile, st.st_size - 100) == 0);
    FILE *prog = tmpfile();
    o.progress = o.warnings = prog; /* the warnings too: the test reads both */
    o.stop_after = 0;
    o.resume = 1;
    CHECKF(nl_train(&o, &r) == 0 && r.steps_done == 4, "%s", nl_last_error());
    fflush(prog);
    long sz = ftell(prog);
    char *text = calloc(1, (size_t)sz + 1);
    rewind(prog);
    CHECK(fread(text, 1, (size_t)sz, prog) == (size_t)sz);
    fclose(prog);
    CHECKF(strstr(text, "warning: ") && strstr(text, "commit-3.nlck") && strstr(text, "at step 2/4"), "progress: %s",
           text);
    free(text);
    char sig[8192];
    CHECK(nl_t_same_file(out, ref_out));
    CHECK(log_sig(log, sig, sizeof sig) == 4 && !strcmp(sig, ref_sig));
}

/* The checkpoint directory's listing fails (EIO from readdir after the entries so far): a
 * --resume stops with the error instead of taking it for "no commit: starting from step 0"
 * (whose commits would then prune the real ones), a fresh run is refused, and every commit is
 * still there and resumes. */
static void test_listing_failure(void) {
    char ck[512], out[512], log[512], c3[600], c4[600];
    nl_train_opts o;
    case_run3("list", ck, out, log, &o);
    nl_train_result r;
    snprintf(c3, sizeof c3, "%s/commit-3.nlck", ck);
    snprintf(c4, sizeof c4, "%s/commit-4.nlck", ck);
    CHECK(exists(c3));
    size_t len3;
    char *before = nl_t_slurp(c3, &len3);
    o.stop_after = 0;
    for (int resume = 1; resume >= 0; resume--) {
        nl_io_fault f;
        nl_io_fault_init(&f, NULL, 0, EIO, 0); /* call 0: the listing (the resume's, or the fresh run's check) */
        nl_train_hooks hk = {.ckpt_io = &f.io};
        o.resume = resume;
        FILE *prog = tmpfile();
        o.progress = o.warnings = prog; /* the warnings too: the test reads both */
        int rc = nl_train_hooked(&o, &hk, &r);
        o.progress = NULL;
        const char *e = nl_last_error();
        CHECKF(rc == -1 && f.failed == 1 && strstr(e, ck) && strstr(e, "cannot list") && strstr(e, strerror(EIO)),
               "%s: rc %d, %s", resume ? "resume" : "fresh run", rc, e);
        if (!resume) CHECKF(strstr(e, "no fresh run starts there"), "%s", e);
        char text[4096] = "";
        rewind(prog);
        size_t n = fread(text, 1, sizeof text - 1, prog);
        text[n] = 0;
        fclose(prog);
        CHECKF(!strstr(text, "starting from step 0"), "progress: %s", text);
        size_t len;
        char *now = nl_t_slurp(c3, &len);
        CHECK(now && before && len == len3 && !memcmp(now, before, len) && !exists(c4));
        free(now);
    }
    free(before);
    /* the listing works again: the resume continues from step 3, bit-identical */
    o.resume = 1;
    CHECKF(nl_train(&o, &r) == 0 && r.steps_done == 4, "%s", nl_last_error());
    CHECK(nl_t_same_file(out, ref_out));
}

/* ================================================================ files: links, FIFOs, messages */

static char victim[512];
static const char VICTIM[] = "precious bytes outside the run's directories\n";

/* lstat: a dangling or planted link counts as there */
static int lexists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static void spit(const char *p, const char *text) {
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int victim_intact(void) {
    size_t len;
    char *b = nl_t_slurp(victim, &len);
    int ok = b && len == sizeof VICTIM - 1 && !memcmp(b, VICTIM, len);
    free(b);
    return ok;
}

/* A fresh case: DIR/<name>/ck (made, empty), DIR/<name>/out.gguf, DIR/<name>/log.jsonl. */
static void case_paths(const char *name, char *ck, char *out, char *log) {
    char d[400], cmd[900];
    snprintf(d, sizeof d, "%.300s/%.60s", tmp, name);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/ck", d, d);
    if (system(cmd)) {}
    snprintf(ck, 512, "%s/ck", d);
    snprintf(out, 512, "%s/out.gguf", d);
    snprintf(log, 512, "%s/log.jsonl", d);
}

/* ---------------------------------------------------------------- symbolic links */

static void test_planted_symlinks(void) {
    static const char *const links[] = {"ckpt.tmp", "run.json.tmp", "lock", "OUT.tmp"};
    for (int i = 0; i < 4; i++) {
        char ck[512], out[512], log[512], link[600];
        case_paths("symlink", ck, out, log);
        spit(victim, VICTIM);
        if (!strcmp(links[i], "OUT.tmp")) snprintf(link, sizeof link, "%s.tmp", out);
        else snprintf(link, sizeof link, "%s/%s", ck, links[i]);
        CHECK(symlink(victim, link) == 0);
        nl_train_opts o;
        opts(&o, out, ck, log);
        nl_train_result r;
        int rc = nl_train(&o, &r);
        const char *e = nl_last_error();
        CHECKF(rc == -1 && strstr(e, link) && strstr(e, "symbolic link") && strstr(e, "remove it"), "%s: rc %d, %s",
               links[i], rc, e);
        CHECKF(victim_intact(), "%s: the file the link points to changed", links[i]);
        CHECKF(!lexists(out), "%s: an adapter was written", links[i]);
        if (i == 0) printf("planted link: %s\n", e);
        /* the link removed, the same command runs */
        CHECK(unlink(link) == 0);
        if (!strcmp(links[i], "ckpt.tmp") || !strcmp(links[i], "run.json.tmp")) o.resume = 1; /* commits may be there */
        rc = nl_train(&o, &r);
        CHECKF(rc == 0 && r.steps_done == 4 && nl_t_same_file(out, ref_out), "%s: after removing the link: %s",
               links[i], nl_last_error());
    }
}

/* The temp files of a killed run are regular files: removed and written anew. */
static void test_stale_temp_files(void) {
    char ck[512], out[512], log[512], p[600];
    case_paths("stale", ck, out, log);
    snprintf(p, sizeof p, "%s/ckpt.tmp", ck);
    spit(p, "half a commit");
    snprintf(p, sizeof p, "%s/run.json.tmp", ck);
    spit(p, "{\"half");
    snprintf(p, sizeof p, "%s.tmp", out);
    spit(p, "GGUF half");
    nl_train_opts o;
    opts(&o, out, ck, log);
    nl_train_result r;
    CHECKF(nl_train(&o, &r) == 0 && nl_t_same_file(out, ref_out), "%s", nl_last_error());
    snprintf(p, sizeof p, "%s/ckpt.tmp", ck);
    CHECK(!lexists(p));
    snprintf(p, sizeof p, "%s.tmp", out);
    CHECK(!lexists(p));
    /* the one atomic write itself: a FIFO or a directory at the temp name is refused, named */
    snprintf(p, sizeof p, "%s/x.tmp", ck);
    CHECK(mkfifo(p, 0600) == 0);
    char x[600];
    snprintf(x, sizeof x, "%s/x", ck);
    CHECK(nl_io_write_file(NULL, x, "abc", 3) == -1 && strstr(nl_last_error(), "is a FIFO") &&
          strstr(nl_last_error(), p));
    CHECK(unlink(p) == 0 && mkdir(p, 0700) == 0);
    CHECK(nl_io_write_file(NULL, x, "abc", 3) == -1 && strstr(nl_last_error(), "is a directory"));
    CHECK(rmdir(p) == 0);
    CHECK(nl_io_write_file(NULL, x, "abc", 3) == 0 && !lexists(p));
}

/* ---------------------------------------------------------------- nothing blocks */

static void test_fifos(void) {
    char ck[512], out[512], log[512], fifo[600];
    /* a FIFO in place of the newest commit: warned, the previous commit used, same end */
    case_paths("fifo_commit", ck, out, log);
    nl_train_opts o;
    opts(&o, out, ck, log);
    o.stop_after = 3;
    nl_train_result r;
    CHECK(nl_train(&o, &r) == 0 && r.steps_done == 3);
    snprintf(fifo, sizeof fifo, "%s/commit-3.nlck", ck);
    CHECK(unlink(fifo) == 0 && mkfifo(fifo, 0600) == 0);
    FILE *prog = tmpfile();
    o.stop_after = 0;
    o.resume = 1;
    o.progress = o.warnings = prog; /* the warnings too: the test reads both */
    int rc = nl_train(&o, &r);
    o.progress = NULL;
    char text[8192] = "";
    rewind(prog);
    size_t n = fread(text, 1, sizeof text - 1, prog);
    text[n] = 0;
    fclose(prog);
    CHECKF(rc == 0 && r.steps_done == 4 && nl_t_same_file(out, ref_out), "resume over a FIFO: %s", nl_last_error());
    CHECKF(strstr(text, "warning: ") && strstr(text, "commit-3.nlck: is a FIFO, not a regular file") &&
               strstr(text, "at step 2/4"),
           "progress: %s", text);

    /* FIFOs as the thermal / battery files, --log-json, --model; a directory as --data */
    case_paths("fifo_inputs", ck, out, log);
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp);
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    for (int c = 0; c < 5; c++) {
        opts(&o, out, ck, log);
        const char *want = "is a FIFO, not a regular file", *name = fifo;
        if (c == 0) o.thermal = "auto", o.thermal_status_file = fifo;
        if (c == 1) o.thermal = "auto", o.battery_temp_file = fifo;
        if (c == 2) o.log_json = fifo;
        if (c == 3) o.model = fifo;
        if (c == 4) o.data = tmp, want = "is a directory, not a regular file", name = tmp;
        rc = nl_train(&o, &r);
        const char *e = nl_last_error();
        CHECKF(rc == -1 && strstr(e, name) && strstr(e, want), "case %d: rc %d, %s", c, rc, e);
        CHECK(!lexists(out));
    }
    unlink(fifo);
}

/* ---------------------------------------------------------------- messages */

/* The directory fsync of commit 3 fails: the commit is in place, the message says so. */
static int n_fsync_dir;
static int fsync_dir_fails_third(void *ctx, const char *d) {
    (void)ctx;
    if (++n_fsync_dir == 3) {
        errno = EIO;
        return -1;
    }
    return nl_io_posix()->fsync_dir(nl_io_posix()->ctx, d);
}

static void test_fsync_dir_message(void) {
    char ck[512], out[512], log[512];
    case_paths("fsync_dir", ck, out, log);
    nl_io io = *nl_io_posix();
    io.fsync_dir = fsync_dir_fails_third;
    n_fsync_dir = 0;
    nl_train_opts o;
    opts(&o, out, ck, log);
    nl_train_hooks hk = {.ckpt_io = &io};
    nl_train_result r;
    int rc = nl_train_hooked(&o, &hk, &r);
    const char *e = nl_last_error();
    CHECKF(rc == -1 && strstr(e, "step 3: commit failed") && strstr(e, "fsync of the directory") &&
               strstr(e, "the commit of step 3 is in place") && !strstr(e, "previous commit (step 2) is kept"),
           "%s", e);
    char c[600];
    snprintf(c, sizeof c, "%s/commit-3.nlck", ck);
    CHECK(lexists(c));
    snprintf(c, sizeof c, "%s/commit-2.nlck", ck);
    CHECK(lexists(c));
}

/* --out cannot be written at the end (a directory appeared there during the run): the step,
 * the kept commit, and --resume with another --out gives the adapter. */
static char grown_dir[600];
static void make_dir_at_out(void *user, int step, const nl_adapter *ad, float *grads) {
    (void)user;
    (void)ad;
    (void)grads;
    if (step == 4) CHECK(mkdir(grown_dir, 0700) == 0);
}

static char fsize_log[512];
static void limit_log_at_3(void *user, int step, const nl_adapter *ad, float *grads) {
    (void)user;
    (void)ad;
    (void)grads;
    struct stat st;
    if (step != 3 || stat(fsize_log, &st) != 0) return;
    struct rlimit lim;
    getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = (rlim_t)st.st_size + 8;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
}

static void test_output_write_failures(void) {
    char ck[512], out[512], log[512], out2[600];
    case_paths("out_fail", ck, out, log);
    snprintf(grown_dir, sizeof grown_dir, "%s", out);
    nl_train_opts o;
    opts(&o, out, ck, log);
    nl_train_hooks hk = {.after_backward = make_dir_at_out};
    nl_train_result r;
    int rc = nl_train_hooked(&o, &hk, &r);
    const char *e = nl_last_error();
    CHECKF(rc == -1 && strstr(e, "step 4: --out") && strstr(e, "writing the adapter failed") &&
               strstr(e, "the last commit (step 4) is kept: --resume with another --out"),
           "%s", e);
    printf("--out failure: %s\n", e);
    snprintf(out2, sizeof out2, "%s2", out);
    o.out = out2;
    o.resume = 1;
    CHECKF(nl_train(&o, &r) == 0 && nl_t_same_file(out2, ref_out), "resume with another --out: %s", nl_last_error());

    /* --log-json: from step 3 on the file may not grow (RLIMIT_FSIZE, set by the hook just
     * before the log line of step 3, which goes out before its commit) */
    case_paths("log_fail", ck, out, log);
    snprintf(fsize_log, sizeof fsize_log, "%s", log);
    opts(&o, out, ck, log);
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    hk.after_backward = limit_log_at_3;
    rc = nl_train_hooked(&o, &hk, &r);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, prev);
    e = nl_last_error();
    CHECKF(rc == -1 && strstr(e, "step 3: --log-json") && strstr(e, "write failed") && strstr(e, strerror(EFBIG)) &&
               strstr(e, "the last commit (step 2) is kept: --resume with another --log-json"),
           "%s", e);
    o.resume = 1;
    CHECKF(nl_train(&o, &r) == 0 && nl_t_same_file(out, ref_out), "resume after the log failure: %s", nl_last_error());
}

/* The --log-json's end: its fsync or its close failing with EIO (a network filesystem reports a
 * lost write there) fails the run (it ended 0); the adapter is not written, the last commit is
 * kept, and a resume with another --log-json finishes it. */
static void test_log_close_eio(void) {
    char ck[512], out[512], log[512];
    for (int k = 0; k < 2; k++) {
        case_paths(k ? "log_close" : "log_fsync", ck, out, log);
        nl_train_opts o;
        opts(&o, out, ck, log);
        nl_io_fault f;
        nl_io_fault_init(&f, NULL, k /* 0: the fsync, 1: the close */, EIO, 0);
        nl_train_hooks hk = {.log_io = &f.io};
        nl_train_result r;
        int rc = nl_train_hooked(&o, &hk, &r);
        const char *e = nl_last_error();
        char want[64];
        snprintf(want, sizeof want, ": %s failed: %s", k ? "close" : "fsync", strerror(EIO));
        CHECKF(rc == -1 && f.failed == 1 && strstr(e, "--log-json") && strstr(e, want) &&
                   strstr(e, "the last commit (step 4) is kept") && !exists(out),
               "log %s EIO: rc %d: %s", k ? "close" : "fsync", rc, e);
        printf("--log-json %s EIO: %s\n", k ? "close" : "fsync", e);
        char log2[600];
        snprintf(log2, sizeof log2, "%s2", log);
        o.log_json = log2;
        o.resume = 1;
        CHECKF(nl_train(&o, &r) == 0 && nl_t_same_file(out, ref_out), "resume after the log close failure: %s",
               nl_last_error());
    }
}

/* A second run while the first holds DIR and its lock file was deleted (rm, a cleanup script):
 * refused, as with the lock file in place (the directory itself is locked). */
static void test_lock_deleted(void) {
    char ck[512], out[512], log[512], lock[600];
    case_paths("lock_deleted", ck, out, log);
    CHECK(mkdir(ck, 0777) == 0 || errno == EEXIST);
    int dfd = open(ck, O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0 && flock(dfd, LOCK_EX | LOCK_NB) == 0); /* what a running run holds */
    snprintf(lock, sizeof lock, "%s/lock", ck);
    unlink(lock);
    nl_train_opts o;
    opts(&o, out, ck, log);
    nl_train_result r;
    int rc = nl_train(&o, &r);
    const char *e = nl_last_error();
    CHECKF(rc == -1 && strstr(e, "is in use by another training run") && strstr(e, "lock file") &&
               strstr(e, "was removed") && !exists(out),
           "%s", e);
    printf("lock deleted: %s\n", e);
    close(dfd);
    CHECKF(nl_train(&o, &r) == 0, "after the first ended: %s", nl_last_error());
}

/* DIR/lock held (flock) by a run that did not record its pid; the file names a pid that no
 * longer runs: the message does not name it as the holder. */
static void test_lock_stale_pid(void) {
    char ck[512], out[512], log[512], lock[600];
    case_paths("lock_pid", ck, out, log);
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    CHECK(gone > 0 && waitpid(gone, NULL, 0) == gone);
    snprintf(lock, sizeof lock, "%s/lock", ck);
    int fd = open(lock, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
    char pid[32];
    int pl = snprintf(pid, sizeof pid, "%d\n", (int)gone);
    CHECK(write(fd, pid, (size_t)pl) == pl);
    nl_train_opts o;
    opts(&o, out, ck, log);
    nl_train_result r;
    int rc = nl_train(&o, &r);
    const char *e = nl_last_error();
    char stale[64];
    snprintf(stale, sizeof stale, "(pid %d)", (int)gone);
    CHECKF(rc == -1 && strstr(e, "in use by another training run") && !strstr(e, stale) && strstr(e, "pid unknown") &&
               strstr(e, "not running"),
           "%s", e);
    close(fd);
}

/* A worker thread that cannot start (no address space left for its stack) says why. */
static void test_thread_errno(void) {
#if defined(__SANITIZE_ADDRESS__)
    printf("thread errno: skipped under ASan (an address-space limit breaks its allocator)\n");
#else
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        /* room for small allocations, none for a worker's 8 MiB stack */
        size_t len;
        char *st = nl_read_file("/proc/self/status", &len);
        int64_t vm = st ? nl_proc_kb_field(st, "VmSize") : -1;
        free(st);
        struct rlimit lim = {(rlim_t)(vm + (2 << 20)), (rlim_t)(vm + (2 << 20))}, got = {0, 0};
        if (vm > 0) setrlimit(RLIMIT_AS, &lim);
        /* the limit must hold (qemu-user takes setrlimit(RLIMIT_AS) and keeps its own: then
         * there is nothing to check here) */
        if (vm <= 0 || getrlimit(RLIMIT_AS, &got) != 0 || got.rlim_cur != lim.rlim_cur) {
            const char *skip = "skip: the address-space limit does not hold here";
            if (write(pfd[1], skip, strlen(skip)) < 0) {}
            _exit(0);
        }
        nl_pool *p = nl_pool_new(16);
        const char *e = p ? "no failure" : nl_last_error();
        if (write(pfd[1], e, strlen(e)) < 0) {}
        _exit(0);
    }
    close(pfd[1]);
    char msg[512] = "";
    ssize_t n = read(pfd[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    if (strncmp(msg, "skip:", 5) == 0) {
        printf("thread errno: %s (qemu-user ignores RLIMIT_AS): not checked\n", msg + 6);
        return;
    }
    CHECKF(strstr(msg, "cannot start worker thread") && strchr(msg, ':') && strstr(msg, strerror(EAGAIN)),
           "message: %s", msg);
#endif
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/nl_test_faults_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmp, tmp);
    if (system(cmd)) return 1;
    snprintf(model, sizeof model, "%s/q3.gguf", tmp);
    snprintf(data, sizeof data, "%s/notes.jsonl", tmp);
    snprintf(victim, sizeof victim, "%s/victim.txt", tmp);
    alarm(600); /* a regression that blocks on a FIFO fails here instead of hanging */
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
    static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio",       "Renew the passport"};
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 10; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[i % 6],
                i % 3 ? " please" : "", tags[(i * 3) % 5]);
    fclose(f);
    double t0 = nl_now();
    reference();
    test_commit_faults();
    test_truncated_commit();
    test_listing_failure();
    test_planted_symlinks();
    test_stale_temp_files();
    test_fifos();
    test_fsync_dir_message();
    test_output_write_failures();
    test_lock_stale_pid();
    test_lock_deleted();
    test_log_close_eio();
    test_thread_errno();
    printf("%.1f s\n", nl_now() - t0);
    if (!nl_t_fail) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd)) return 1;
    } else {
        fprintf(stderr, "files kept in %s\n", tmp);
    }
    return nl_t_done();
}

/* The command line's value checks, shared by every command: strict numbers (an integer flag
 * takes only decimal digits, a range error names the range) and "no output replaces an input"
 * (cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "train/trainer.h"

/* ---- numbers ------------------------------------------------------------------------------ */

/* An optional '-' then decimal digits only: "1.9", "1e3", " 7", "0x10" and "" are not integers. */
static int is_decimal(const char *v) {
    const char *p = v + (v[0] == '-');
    if (!*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* For a refused integer that is a whole number in [lo, hi] written otherwise ("1e9", "4096.0"):
 * " written in digits (1e9: give 1000000000)", so the message does not seem to refuse a value
 * its own range holds; "" otherwise. */
static const char *digits_hint(const char *v, double lo, double hi, char *buf, size_t cap) {
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d >= lo && d <= hi) || d != floor(d) || fabs(d) > 9007199254740992.0) return "";
    snprintf(buf, cap, " written in digits (%s: give %.0f)", v, d);
    return buf;
}

int nl_cli_int(const char *cmd, int argc, char **argv, const char *flag, int64_t lo, int64_t hi, int64_t *out) {
    const char *v = nl_cli_opt(argc, argv, flag);
    if (!v) return 0;
    errno = 0;
    long long x = is_decimal(v) ? strtoll(v, NULL, 10) : 0;
    if (!is_decimal(v) || errno || x < lo || x > hi) {
        char hint[96];
        fprintf(stderr, "nightlora %s: --%s %s: expected an integer in [%" PRId64 ", %" PRId64 "]%s\n", cmd, flag, v,
                lo, hi, is_decimal(v) ? "" : digits_hint(v, (double)lo, (double)hi, hint, sizeof hint));
        return -1;
    }
    *out = (int64_t)x;
    return 1;
}

int nl_cli_u64(const char *cmd, int argc, char **argv, const char *flag, uint64_t *out) {
    const char *v = nl_cli_opt(argc, argv, flag);
    if (!v) return 0;
    errno = 0;
    unsigned long long x = v[0] != '-' && is_decimal(v) ? strtoull(v, NULL, 10) : 0;
    if (v[0] == '-' || !is_decimal(v) || errno) {
        char hint[96];
        fprintf(stderr, "nightlora %s: --%s %s: expected an integer in [0, %" PRIu64 "]%s\n", cmd, flag, v, UINT64_MAX,
                is_decimal(v) ? "" : digits_hint(v, 0.0, 18446744073709551615.0, hint, sizeof hint));
        return -1;
    }
    *out = (uint64_t)x;
    return 1;
}

int nl_cli_num(const char *cmd, int argc, char **argv, const char *flag, double lo, double hi, double *out) {
    const char *v = nl_cli_opt(argc, argv, flag);
    if (!v) return 0;
    char *end;
    double x = strtod(v, &end);
    /* NaN fails both comparisons; Inf fails the range */
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "nightlora %s: --%s %s: expected a number in [%g, %g]\n", cmd, flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 1;
}

/* ---- outputs against inputs ------------------------------------------------------------------ */

typedef struct {
    const char *flag, *path;
    int exists;
    struct stat st;
    char *real; /* resolved path: realpath, or realpath(parent) + "/" + name; else the text */
} path_id;

/* realpath() of p when it exists; otherwise its parent resolved plus its last name (an output
 * not written yet); the text itself when even the parent does not resolve. malloc'd. */
static char *resolve(const char *p) {
    char *r = realpath(p, NULL);
    if (r) return r;
    const char *slash = strrchr(p, '/');
    const char *name = slash ? slash + 1 : p;
    char *parent = NULL;
    if (!slash) parent = realpath(".", NULL);
    else if (slash == p) parent = strdup("");
    else {
        char *d = strndup(p, (size_t)(slash - p));
        parent = d ? realpath(d, NULL) : NULL;
        free(d);
    }
    if (!parent || !*name) {
        free(parent);
        return strdup(p);
    }
    size_t n = strlen(parent) + strlen(name) + 2;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s/%s", parent, name);
    free(parent);
    return out;
}

static void id_init(path_id *id, const char *flag, const char *path) {
    memset(id, 0, sizeof *id);
    id->flag = flag;
    id->path = path;
    id->exists = stat(path, &id->st) == 0;
    id->real = resolve(path);
}

/* The same file: one inode (a hard link, a symlink, another spelling), or one resolved name. */
static int same(const path_id *a, const path_id *b) {
    if (a->exists && b->exists && a->st.st_dev == b->st.st_dev && a->st.st_ino == b->st.st_ino) return 1;
    return a->real && b->real && !strcmp(a->real, b->real);
}

/* The files a run writes inside its checkpoint directory (train/checkpoint.h, trainer.c). */
static int run_writes_name(const char *name) {
    return !strcmp(name, "lock") || !strcmp(name, "run.json") || !strcmp(name, "run.json.tmp") ||
           !strcmp(name, "ckpt.tmp") || !strcmp(name, "runs.jsonl") || !strcmp(name, "runs.jsonl.tmp") ||
           !strncmp(name, "commit-", 7);
}

/* `in` lies in the directory `dir` under a name the run writes there. */
static int in_run_dir(const path_id *in, const path_id *dir) {
    if (!in->real) return 0;
    const char *slash = strrchr(in->real, '/');
    if (!slash || !run_writes_name(slash + 1)) return 0;
    char *parent = strndup(in->real, (size_t)(slash - in->real));
    if (!parent) return 0;
    path_id pd;
    id_init(&pd, "", parent[0] ? parent : "/");
    int r = same(&pd, dir);
    free(pd.real);
    free(parent);
    return r;
}

int nl_cli_no_overwrite(const char *cmd, int argc, char **argv, const char *const *inputs, const char *const *outputs,
                        const char *out_dir) {
    enum { MAXP = 16 };
    path_id in[MAXP], out[MAXP], tmp[MAXP], dir;
    int n_in = 0, n_out = 0, have_dir = 0, rc = 0;
    for (; inputs && *inputs && n_in < MAXP; inputs++) {
        const char *p = nl_cli_opt(argc, argv, *inputs);
        if (p) id_init(&in[n_in++], *inputs, p);
    }
    for (; outputs && *outputs && n_out < MAXP; outputs++) {
        const char *p = nl_cli_opt(argc, argv, *outputs);
        if (!p) continue;
        id_init(&out[n_out], *outputs, p);
        /* every output file is written as PATH.tmp and renamed onto PATH */
        size_t l = strlen(p) + 5;
        char *t = malloc(l);
        if (t) snprintf(t, l, "%s.tmp", p);
        id_init(&tmp[n_out], *outputs, t ? t : p);
        tmp[n_out].path = t; /* freed below (NULL only when out of memory) */
        n_out++;
    }
    const char *dp = out_dir ? nl_cli_opt(argc, argv, out_dir) : NULL;
    if (dp) {
        id_init(&dir, out_dir, dp);
        have_dir = 1;
    }
    for (int o = 0; o < n_out && !rc; o++) {
        for (int i = 0; i < n_in && !rc; i++) {
            if (same(&out[o], &in[i]))
                rc = fprintf(stderr,
                             "nightlora %s: --%s %s and --%s %s are the same file: the output would replace the input; "
                             "choose another --%s\n",
                             cmd, out[o].flag, out[o].path, in[i].flag, in[i].path, out[o].flag);
            else if (same(&tmp[o], &in[i]))
                rc = fprintf(stderr,
                             "nightlora %s: --%s %s is written through %s, which is --%s %s: choose another --%s\n",
                             cmd, out[o].flag, out[o].path, tmp[o].path, in[i].flag, in[i].path, out[o].flag);
        }
        for (int k = 0; k < o && !rc; k++)
            if (same(&out[o], &out[k]))
                rc = fprintf(stderr,
                             "nightlora %s: --%s %s and --%s %s are the same file: give each output its own path\n",
                             cmd, out[k].flag, out[k].path, out[o].flag, out[o].path);
        if (!rc && have_dir && (same(&out[o], &dir) || in_run_dir(&out[o], &dir)))
            rc = fprintf(stderr, "nightlora %s: --%s %s is a file the run writes in --%s %s: choose another --%s\n",
                         cmd, out[o].flag, out[o].path, dir.flag, dir.path, out[o].flag);
    }
    for (int i = 0; i < n_in && have_dir && !rc; i++) {
        if (same(&in[i], &dir))
            rc = fprintf(stderr, "nightlora %s: --%s %s and --%s %s are the same path: choose another --%s\n", cmd,
                         dir.flag, dir.path, in[i].flag, in[i].path, dir.flag);
        else if (in_run_dir(&in[i], &dir))
            rc = fprintf(stderr,
                         "nightlora %s: --%s %s is a file the run writes in --%s %s (its lock, run.json, runs.jsonl or "
                         "commits): "
                         "the input would be replaced; choose another --%s\n",
                         cmd, in[i].flag, in[i].path, dir.flag, dir.path, dir.flag);
    }
    for (int i = 0; i < n_in; i++) free(in[i].real);
    for (int o = 0; o < n_out; o++) {
        free(out[o].real);
        free(tmp[o].real);
        free((char *)tmp[o].path);
    }
    if (have_dir) free(dir.real);
    return rc ? 1 : 0;
}

/* The step k when `name` (a last path component) is a snapshot name of the run: `prefix`
 * ("adapter-step"), a step without leading zeros, ".gguf" or ".gguf.tmp"; else 0. */
static int64_t snapshot_step(const char *name, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) || name[pl] < '1' || name[pl] > '9') return 0;
    char *end;
    errno = 0;
    long long k = strtoll(name + pl, &end, 10);
    if (errno || k <= 0 || (strcmp(end, ".gguf") && strcmp(end, ".gguf.tmp"))) return 0;
    return (int64_t)k;
}

int nl_cli_no_snapshot_overwrite(const char *cmd, int argc, char **argv, const char *const *files, const char *out,
                                 int64_t every) {
    /* the name pattern, from the path of step 1: "DIR/adapter-step1.gguf" -> "adapter-step" */
    char *first = nl_train_snapshot_path(out, 1);
    if (!first) return fprintf(stderr, "nightlora %s: out of memory\n", cmd), 1;
    const char *base = strrchr(first, '/');
    base = base ? base + 1 : first;
    size_t bl = strlen(base) - strlen("1.gguf");
    char *prefix = strndup(base, bl);
    free(first);
    int rc = 0;
    for (; files && *files && prefix && !rc; files++) {
        const char *p = nl_cli_opt(argc, argv, *files);
        if (!p) continue;
        path_id f;
        id_init(&f, *files, p);
        /* the name as given and as resolved (a symbolic link to a snapshot) */
        const char *names[2] = {strrchr(p, '/') ? strrchr(p, '/') + 1 : p, NULL};
        if (f.real) names[1] = strrchr(f.real, '/') ? strrchr(f.real, '/') + 1 : f.real;
        for (int i = 0; i < 2 && !rc; i++) {
            int64_t k = names[i] ? snapshot_step(names[i], prefix) : 0;
            if (k <= 0 || k % every) continue;
            char *sp = nl_train_snapshot_path(out, k);
            if (!sp) break;
            size_t l = strlen(sp) + 5;
            char *tp = malloc(l);
            if (tp) snprintf(tp, l, "%s.tmp", sp);
            path_id s, t;
            id_init(&s, "", sp);
            id_init(&t, "", tp ? tp : sp);
            if (same(&f, &s) || same(&f, &t))
                rc = fprintf(stderr,
                             "nightlora %s: --%s %s would be replaced by the snapshot that --save-every %" PRId64
                             " writes at step %" PRId64 " (%s%s%s, from --out %s): choose another --out\n",
                             cmd, *files, p, every, k, sp, same(&f, &s) ? "" : ", through its temp file ",
                             same(&f, &s) ? "" : t.path, out);
            free(s.real);
            free(t.real);
            free(tp);
            free(sp);
        }
        free(f.real);
    }
    free(prefix);
    return rc ? 1 : 0;
}

/* ---- the nearest known flag ------------------------------------------------------------------ */

/* Other tools' names for nightlora's flags (transformers/PEFT/TRL, Axolotl, mlx-lm,
 * LLaMA-Factory), normalized: lower case, '-' for '_'. */
static const struct {
    const char *alias, *flag, *note;
} flag_aliases[] = {
    {"learning-rate", "lr", NULL},
    {"lora-r", "rank", NULL},
    {"lora-rank", "rank", NULL},
    {"r", "rank", NULL},
    {"lora-alpha", "alpha", NULL},
    {"lora-dropout", "dropout", NULL},
    {"num-train-epochs", "epochs", NULL},
    {"num-epochs", "epochs", NULL},
    {"max-steps", "steps", NULL},
    {"iters", "steps", NULL},
    {"num-iters", "steps", NULL},
    {"warmup-steps", "warmup", NULL},
    {"lr-scheduler-type", "schedule", NULL},
    {"lr-scheduler", "schedule", NULL},
    {"max-grad-norm", "clip", NULL},
    {"grad-clip", "clip", NULL},
    {"max-seq-length", "ctx", NULL},
    {"max-seq-len", "ctx", NULL},
    {"max-length", "ctx", NULL},
    {"cutoff-len", "ctx", NULL},
    {"sequence-len", "ctx", NULL},
    {"output-dir", "out", NULL},
    {"adapter-path", "out", NULL},
    {"adapter-file", "out", NULL},
    {"output", "out", NULL},
    {"model-name-or-path", "model", NULL},
    {"base-model", "model", NULL},
    {"model-path", "model", NULL},
    {"dataset", "data", NULL},
    {"train-file", "data", NULL},
    {"train-data", "data", NULL},
    {"data-path", "data", NULL},
    {"validation-file", "val-data", NULL},
    {"valid-data", "val-data", NULL},
    {"eval-data", "val-data", NULL},
    {"val-set-size", "val-split", NULL},
    {"validation-split", "val-split", NULL},
    {"save-steps", "save-every", NULL},
    {"eval-steps", "eval-every", NULL},
    {"steps-per-eval", "eval-every", NULL},
    {"early-stopping-patience", "early-stop", NULL},
    {"load-best-model-at-end", "keep-best", NULL},
    {"resume-from-checkpoint", "resume", NULL},
    {"resume-adapter-file", "init-adapter", NULL},
    {"target-modules", "targets", NULL},
    {"lora-target-modules", "targets", NULL},
    {"lora-target", "targets", NULL},
    {"chat-template", "template", NULL},
    {"batch-size", "batch-tokens", "a batch is counted in tokens, not examples"},
    {"per-device-train-batch-size", "batch-tokens", "a batch is counted in tokens, not examples"},
    {"micro-batch-size", "batch-tokens", "a batch is counted in tokens, not examples"},
    {"gradient-accumulation-steps", "batch-tokens", "a batch is counted in tokens, not examples"},
    {"num-threads", "threads", NULL},
    {"n-threads", "threads", NULL},
    {"logging-dir", "log-json", NULL},
    {"save-total-limit", "save-every", NULL},
    {"shuffle", "no-shuffle", NULL},
    {"dataset-text-field", "columns", NULL},
};

static int listed_n(const char *const *list, const char *name) {
    for (; list && *list; list++)
        if (!strcmp(*list, name)) return 1;
    return 0;
}

/* Edit distance with transpositions (optimal string alignment), capped at 99. */
static int edit_distance(const char *a, const char *b) {
    const size_t n = strlen(a), m = strlen(b);
    if (n > 62 || m > 62) return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[n][m];
}

const char *nl_cli_suggest(const char *name, size_t len, const char *const *known, const char *const *boolean,
                           const char **note) {
    char k[64];
    *note = NULL;
    while (len && *name == '-') name++, len--;
    if (!len || len >= sizeof k) return NULL;
    for (size_t i = 0; i < len; i++) {
        const char c = name[i];
        k[i] = c == '_' ? '-' : (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    k[len] = 0;
    for (size_t i = 0; i < sizeof flag_aliases / sizeof *flag_aliases; i++)
        if (!strcmp(flag_aliases[i].alias, k) &&
            (listed_n(known, flag_aliases[i].flag) || listed_n(boolean, flag_aliases[i].flag))) {
            *note = flag_aliases[i].note;
            return flag_aliases[i].flag;
        }
    /* a known flag spelled with '_' or capitals */
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *l = pass ? boolean : known; l && *l; l++)
            if (!strcmp(*l, k)) return *l;
    /* else the nearest by edit distance, within a third of the name (at least 1, at most 3) */
    const char *best = NULL;
    int bd = (int)len / 3 < 1 ? 1 : (int)len / 3 > 3 ? 3 : (int)len / 3;
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *l = pass ? boolean : known; l && *l; l++) {
            const int d = edit_distance(k, *l);
            if (d < bd || (d == bd && !best)) {
                best = *l;
                bd = d;
            }
        }
    /* and the nearest of the other tools' names ("lerning-rate") */
    for (size_t i = 0; i < sizeof flag_aliases / sizeof *flag_aliases; i++) {
        const int d = edit_distance(k, flag_aliases[i].alias);
        if ((d < bd || (d == bd && !best)) &&
            (listed_n(known, flag_aliases[i].flag) || listed_n(boolean, flag_aliases[i].flag))) {
            best = flag_aliases[i].flag;
            *note = flag_aliases[i].note;
            bd = d;
        }
    }
    return best;
}

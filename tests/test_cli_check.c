/* The `check` and `bench proj` commands through the built CLI (NL_CLI) on tiny synthetic models:
 * the text report (planner summary consistent with the model, every projection class, resident
 * memory), --verbose (every projection, the per-check table), --json (parses, and agrees with
 * the library), `bench proj` numbers, and usage errors with a non-zero exit and a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/json.h"
#include "model/model.h"
#include "model/quant.h"
#include "nn/forward.h"
#include "proj/proj.h"
#include "test.h"
#include "util/util.h"

static char tmpdir[64];

/* Run `args` through the CLI with stderr merged into stdout; returns the exit status and the
 * output (malloc'd, NUL-terminated) in *out. */
static int run_cli(const char *args, char **out) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", NL_CLI, args);
    FILE *p = popen(cmd, "r");
    *out = NULL;
    if (!p) return -1;
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[n] = 0;
    *out = buf;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* What the library says a run of this model registers: non-embedding service weights (each
 * checked in 2 directions × 3 buckets by the default plan) and the classes present. */
static void expected(const char *path, int *n_checked, int classes[NL_CLASS_COUNT], int *n_projs) {
    nl_model *m = nl_model_load(path);
    CHECKF(m != NULL, "%s", nl_last_error());
    nl_proj_service *s = nl_proj_service_new(NULL);
    nl_runtime rt;
    CHECK(s && nl_runtime_init(&rt, m, s) == 0);
    *n_checked = 0;
    memset(classes, 0, sizeof(int) * NL_CLASS_COUNT);
    for (int i = 0; i < nl_proj_count(s); i++) {
        const nl_proj_weight *w = nl_proj_get(s, i);
        classes[w->cls] = 1;
        if (w->cls != NL_CLASS_EMBED) (*n_checked)++;
    }
    *n_projs = m->n_projs;
    nl_runtime_free(&rt);
    nl_proj_service_free(s);
    nl_model_free(m);
}

/* "planner: N checks, P passed, R routed to CPU" in the text report. */
static int parse_summary(const char *out, int *n, int *p, int *r) {
    const char *s = out ? strstr(out, "planner: ") : NULL;
    return s && sscanf(s, "planner: %d checks, %d passed, %d routed to CPU", n, p, r) == 3;
}

static void test_check(const char *path, const char *label) {
    int n_checked, classes[NL_CLASS_COUNT], n_projs;
    expected(path, &n_checked, classes, &n_projs);
    char args[600], *out;
    int n, p, r;

    /* the default backend (ref): weights converted by the policy, checks against the originals */
    snprintf(args, sizeof args, "check --model %s", path);
    int rc = run_cli(args, &out);
    CHECKF(rc == 0, "%s: check exit %d: %s", label, rc, out ? out : "");
    CHECKF(parse_summary(out, &n, &p, &r) && n == 6 * n_checked && p + r == n && r == 0, "%s: %s", label, out);
    char arch_line[64];
    snprintf(arch_line, sizeof arch_line, "\n%s: n_vocab ", label);
    CHECKF(out && strstr(out, arch_line), "%s: no architecture line", label);
    /* every class of the model in the projection table */
    const char *tab = out ? strstr(out, "projections") : NULL;
    for (int c = 0; c < NL_CLASS_COUNT; c++) {
        char word[32];
        snprintf(word, sizeof word, " %s ", nl_proj_class_name((nl_proj_class)c));
        if (classes[c]) CHECKF(tab && strstr(tab, word), "%s: class%smissing", label, word);
    }
    CHECK(out && strstr(out, "resident: ") && strstr(out, "memory estimate: ") &&
          strstr(out, "service kernels host: "));
    CHECK(out && strstr(out, "n_embd ") && strstr(out, "n_layer "));
    free(out);

    /* host backend, 2 threads: every check passes on these shapes */
    snprintf(args, sizeof args, "check --model %s --backend host --threads 2", path);
    rc = run_cli(args, &out);
    CHECKF(rc == 0 && parse_summary(out, &n, &p, &r) && n == 6 * n_checked && p == n, "%s host: %s", label,
           out ? out : "");
    free(out);

    /* the compute line and the kernels are the service's own: ref says it is the FP32
     * reference, host the mode --compute asked for */
    snprintf(args, sizeof args, "check --model %s --backend ref --compute bf16", path);
    rc = run_cli(args, &out);
    CHECKF(rc == 0 && out && strstr(out, "\ncompute f32\n") &&
               strstr(out, "service kernels ref: f32 compute (reference"),
           "%s: check --backend ref: %s", label, out ? out : "");
    free(out);
    snprintf(args, sizeof args, "check --model %s --backend host --compute f32", path);
    rc = run_cli(args, &out);
    CHECKF(rc == 0 && out && strstr(out, "\ncompute f32\n") && strstr(out, "service kernels host: f32 compute ("),
           "%s: check --compute f32: %s", label, out ? out : "");
    free(out);

    /* --verbose: one line per projection (every tensor name) and the per-check table */
    snprintf(args, sizeof args, "check --model %s --backend host --verbose --precision-map recurrent=f32", path);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && out && strstr(out, "rel_err") && strstr(out, "bound"));
    nl_model *m = nl_model_load(path);
    if (m && out)
        for (int i = 0; i < m->n_projs; i++)
            CHECKF(strstr(out, m->projs[i].name) != NULL, "%s missing", m->projs[i].name);
    if (m && out && classes[NL_CLASS_RECURRENT]) CHECK(strstr(out, "recurrent F32") != NULL);
    /* the per-check table has one line per check, after its header */
    int rows = 0;
    const char *q = out ? strstr(out, "rel_err") : NULL;
    while (q && (q = strchr(q, '\n')) && *++q) {
        const char *eol = strchr(q, '\n');
        size_t len = eol ? (size_t)(eol - q) : strlen(q);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), q);
        if (strstr(line, " fwd ") || strstr(line, " bwd ")) rows++;
    }
    CHECKF(rows == 6 * n_checked, "%s: %d table rows, expected %d", label, rows, 6 * n_checked);
    nl_model_free(m);
    free(out);

    /* --json: one object; its numbers agree with the text and the library */
    snprintf(args, sizeof args, "check --model %s --json --threads 2", path);
    rc = run_cli(args, &out);
    CHECK(rc == 0);
    nl_json *j = out ? nl_json_parse(out, strlen(out), NULL) : NULL;
    CHECKF(j != NULL, "%s: --json does not parse: %s", label, nl_last_error());
    if (j) {
        const nl_json *pl = nl_json_get(j, "planner");
        int64_t v = -1, pv = -1;
        CHECK(nl_json_int64(nl_json_get(pl, "checks"), &v) == 0 && v == 6 * n_checked);
        CHECK(nl_json_int64(nl_json_get(pl, "passed"), &pv) == 0 && pv == v);
        CHECK(nl_json_len(nl_json_get(pl, "table")) == (size_t)(6 * n_checked));
        CHECK(nl_json_len(nl_json_get(pl, "buckets")) == 3);
        const nl_json *pj = nl_json_get(j, "projections");
        CHECK(nl_json_len(pj) == (size_t)n_projs);
        int seen[NL_CLASS_COUNT] = {0};
        for (size_t i = 0; i < nl_json_len(pj); i++) {
            const nl_json *c = nl_json_get(nl_json_at(pj, i), "class");
            for (int k = 0; k < NL_CLASS_COUNT && nl_json_is_string(c); k++)
                if (!strcmp(c->u.str.s, nl_proj_class_name((nl_proj_class)k))) seen[k] = 1;
            int64_t kk = 0, nn = 0;
            CHECK(nl_json_int64(nl_json_get(nl_json_at(pj, i), "k"), &kk) == 0 && kk > 0);
            CHECK(nl_json_int64(nl_json_get(nl_json_at(pj, i), "n"), &nn) == 0 && nn > 0);
        }
        for (int k = 0; k < NL_CLASS_COUNT; k++) CHECK(seen[k] == classes[k]);
        CHECK(nl_json_is_string(nl_json_get(j, "resident_text")));
        int64_t mem = 0;
        CHECK(nl_json_int64(nl_json_get(j, "memory_estimate_bytes"), &mem) == 0 && mem > 0);
        nl_json_free(j);
    }
    free(out);
}

static void test_bench(const char *path) {
    char args[600], *out;
    for (int cold = 0; cold < 2; cold++) {
        /* --cold: the runs cycle over the shape's weights and buffers; the compared product is the same */
        snprintf(args, sizeof args, "bench proj --model %s --reps 1 --tokens 4 --json%s", path, cold ? " --cold" : "");
        int rc = run_cli(args, &out);
        CHECKF(rc == 0, "bench proj exit %d: %s", rc, out ? out : "");
        nl_json *j = out ? nl_json_parse(out, strlen(out), NULL) : NULL;
        CHECKF(j && nl_json_is_array(j) && nl_json_len(j) >= 2, "bench proj --json: %s", out ? out : "");
        for (size_t i = 0; j && i < nl_json_len(j); i++) {
            const nl_json *o = nl_json_at(j, i);
            const nl_json *cj = nl_json_get(o, "cold");
            CHECK(nl_json_is_bool(cj) && (cj->type == NL_JSON_TRUE) == cold);
            const nl_json *hg = nl_json_get(o, "host_gflops"), *rg = nl_json_get(o, "ref_gflops"),
                          *hm = nl_json_get(o, "host_ms"), *rd = nl_json_get(o, "rel_diff");
            int64_t T = 0, k = 0, n = 0;
            CHECK(nl_json_int64(nl_json_get(o, "T"), &T) == 0 && T == 4);
            CHECK(nl_json_int64(nl_json_get(o, "k"), &k) == 0 && nl_json_int64(nl_json_get(o, "n"), &n) == 0);
            CHECK(nl_json_is_number(hm) && hm->u.num.d > 0 && hm->u.num.d < 1e4);
            /* GFLOP/s is consistent with the time: 2·T·N·K / ms */
            CHECK(nl_json_is_number(hg) &&
                  fabs(hg->u.num.d - 2.0 * T * k * n / (hm->u.num.d * 1e-3) * 1e-9) <= 1e-3 * hg->u.num.d + 1e-6);
            CHECK(nl_json_is_number(rg) && rg->u.num.d > 0); /* T <= 64: ref ran too */
            /* host and ref agree within the bf16/q8_0 tolerance */
            CHECKF(nl_json_is_number(rd) && rd->u.num.d < 2e-2, "rel_diff %g",
                   nl_json_is_number(rd) ? rd->u.num.d : -1);
        }
        /* "of peak": each row's host_gflops / host_of_peak is its host_peak_gflops, one figure for the
         * rows of one shape (measured around them) */
        double pk = 0;
        int64_t pk_k = -1, pk_n = -1;
        for (size_t i = 0; j && i < nl_json_len(j); i++) {
            const nl_json *o = nl_json_at(j, i), *hg = nl_json_get(o, "host_gflops"),
                          *hp = nl_json_get(o, "host_of_peak"), *hk = nl_json_get(o, "host_peak_gflops");
            if (!nl_json_is_number(hp)) continue; /* a compute mode without a peak loop (null) */
            CHECK(hp->u.num.d > 0);
            CHECK(nl_json_is_number(hk) && hk->u.num.d > 0);
            const double p = hg->u.num.d / hp->u.num.d;
            if (nl_json_is_number(hk)) CHECK(fabs(p - hk->u.num.d) <= 1e-3 * p); /* the JSON numbers carry 6-7 digits */
            int64_t k = 0, n = 0;
            nl_json_int64(nl_json_get(o, "k"), &k);
            nl_json_int64(nl_json_get(o, "n"), &n);
            if (k != pk_k || n != pk_n) pk = p, pk_k = k, pk_n = n;
            CHECK(fabs(p - pk) <= 1e-3 * pk);
        }
        nl_json_free(j);
        free(out);
    }
    /* bench peak: every kind this CPU has, both figures positive; x86-64 and aarch64 have FP32 */
    snprintf(args, sizeof args, "bench peak --threads 2 --seconds 0.02 --json");
    int rc = run_cli(args, &out);
    CHECKF(rc == 0, "bench peak exit %d: %s", rc, out ? out : "");
    nl_json *j = out ? nl_json_parse(out, strlen(out), NULL) : NULL;
    const nl_json *pks = nl_json_get(j, "peaks");
    CHECKF(nl_json_is_array(pks), "bench peak --json: %s", out ? out : "");
    int have_fp32 = 0;
    for (size_t i = 0; pks && i < nl_json_len(pks); i++) {
        const nl_json *o = nl_json_at(pks, i), *k = nl_json_get(o, "kind"), *one = nl_json_get(o, "one_thread"),
                      *all = nl_json_get(o, "all_threads");
        CHECK(nl_json_is_string(k) && nl_json_is_number(one) && nl_json_is_number(all) && one->u.num.d > 0 &&
              all->u.num.d > 0);
        have_fp32 |= nl_json_is_string(k) && !strcmp(k->u.str.s, "fp32");
    }
#if defined(__x86_64__) || defined(__aarch64__)
    CHECKF(have_fp32, "bench peak: no fp32 row: %s", out ? out : "");
#endif
    nl_json_free(j);
    free(out);
    rc = run_cli("bench peak --seconds 0", &out);
    CHECK(rc == 2 && out && strstr(out, "--seconds"));
    free(out);
    /* the text table: a header and one row per (shape, direction, T) */
    snprintf(args, sizeof args, "bench proj --model %s --reps 1 --tokens 4,8 --threads 2", path);
    rc = run_cli(args, &out);
    CHECK(rc == 0 && out && strstr(out, "GFLOP/s") && strstr(out, " fwd ") && strstr(out, " bwd "));
    free(out);
    /* bench step: (c) and (d) compute the same loss; --answer-tokens changes which rows are
     * targets (the loss is a mean over them), so it changes the loss */
    double loss_all = 0, loss_ans = 0;
    for (int a = 0; a < 2; a++) {
        snprintf(args, sizeof args, "bench step --model %s --tokens 16 --reps 1 --warmup 0 --only cd --json%s", path,
                 a ? " --answer-tokens 4" : "");
        rc = run_cli(args, &out);
        CHECKF(rc == 0, "bench step exit %d: %s", rc, out ? out : "");
        j = out ? nl_json_parse(out, strlen(out), NULL) : NULL;
        const nl_json *cf = nl_json_get(j, "configs");
        const nl_json *lc = nl_json_get(nl_json_get(cf, "c"), "loss"), *ld = nl_json_get(nl_json_get(cf, "d"), "loss");
        CHECKF(nl_json_is_number(lc) && nl_json_is_number(ld) && lc->u.num.d == ld->u.num.d && lc->u.num.d > 0,
               "bench step losses: %s", out ? out : "");
        if (nl_json_is_number(lc)) *(a ? &loss_ans : &loss_all) = lc->u.num.d;
        nl_json_free(j);
        free(out);
    }
    CHECK(loss_all != loss_ans);
    snprintf(args, sizeof args, "bench step --model %s --tokens 16 --answer-tokens 17", path);
    rc = run_cli(args, &out);
    CHECK(rc == 2 && out && strstr(out, "--answer-tokens"));
    free(out);
}

/* --version: the project version and the commit the binary was built from */
static void test_version(void) {
    char *out = NULL;
    int rc = run_cli("--version", &out);
    CHECKF(rc == 0 && out && !strncmp(out, "nightlora 0.", 12) && strstr(out, "(commit "), "--version: %s",
           out ? out : "");
    free(out);
    rc = run_cli("version", &out);
    CHECK(rc == 0 && out && strstr(out, "(commit "));
    free(out);
}

static void test_usage_errors(const char *path) {
    struct {
        const char *args, *msg;
        int want_rc; /* 2 usage, 1 runtime error */
    } cases[] = {
        {"check --model %s --bogus", "unknown option '--bogus'", 2},
        {"check", "--model is required", 2},
        {"check --model %s --backend npu", "--backend npu", 2},
        {"check --model %s --threads 0", "--threads 0", 2},
        {"check --model %s --wire f8", "--wire f8", 2},
        {"check --model %s --compute fp8", "--compute fp8: unknown compute mode", 2},
        {"check --model %s --precision q2", "unknown precision", 1},
        {"check --model %s/../no-such-model.gguf", "no-such-model.gguf", 1},
        {"bench", "expected a benchmark", 2},
        {"bench nope --model %s", "'nope'", 2},
        {"bench proj --model %s --tokens 0", "--tokens 0", 2},
        {"bench proj --model %s --tokens 4,", "--tokens 4,", 2},
        {"bench proj --model %s --reps x", "--reps x", 2},
        {"bench proj --model %s --json --verbose", "unknown option '--verbose'", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[700], *out;
        snprintf(args, sizeof args, cases[i].args, path);
        int rc = run_cli(args, &out);
        CHECKF(rc == cases[i].want_rc && out && strstr(out, cases[i].msg), "'%s': exit %d, output: %s", args, rc,
               out ? out : "");
        free(out);
    }
}

/* The planner's verdict cache: a second `check` of the model reads it (the same summary, said
 * where from), --no-plan-cache neither reads nor writes one. */
static void test_plan_cache(const char *path) {
    char cache[128], args[512];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    char *own = getenv("NL_PLAN_CACHE") ? strdup(getenv("NL_PLAN_CACHE")) : NULL;
    unsetenv("NL_PLAN_CACHE"); /* the model cache's plan/ folder first, $NL_PLAN_CACHE after */
    setenv("NL_MODEL_CACHE", cache, 1);
    snprintf(args, sizeof args, "check --model %s --threads 2 --no-plan-cache", path);
    char *out = NULL;
    CHECK(run_cli(args, &out) == 0 && out && !strstr(out, "plan cache"));
    struct stat st;
    CHECK(stat(cache, &st) != 0); /* nothing written */
    free(out);
    snprintf(args, sizeof args, "check --model %s --threads 2", path);
    int n0, p0, r0, n1, p1, r1;
    CHECK(run_cli(args, &out) == 0 && parse_summary(out, &n0, &p0, &r0) && !strstr(out, "plan cache"));
    free(out);
    CHECK(run_cli(args, &out) == 0 && parse_summary(out, &n1, &p1, &r1) && n1 == n0 && p1 == p0 && r1 == r0);
    char want[200];
    snprintf(want, sizeof want, "; verdicts from the plan cache %s/plan/plan-", cache);
    CHECKF(out && strstr(out, want), "second check: %s", out ? out : "(no output)");
    free(out);
    snprintf(args, sizeof args, "rm -rf %s", cache);
    CHECK(system(args) == 0);
    /* $NL_PLAN_CACHE is the folder itself and comes before the model cache */
    char dir[160];
    snprintf(dir, sizeof dir, "%s/own", tmpdir);
    setenv("NL_PLAN_CACHE", dir, 1);
    snprintf(args, sizeof args, "check --model %s --threads 2", path);
    CHECK(run_cli(args, &out) == 0 && out && !strstr(out, "plan cache"));
    free(out);
    CHECK(run_cli(args, &out) == 0 && out);
    snprintf(want, sizeof want, "; verdicts from the plan cache %s/plan-", dir);
    CHECKF(out && strstr(out, want), "NL_PLAN_CACHE: %s", out ? out : "(no output)");
    CHECK(stat(cache, &st) != 0); /* nothing in the model cache */
    free(out);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    CHECK(system(args) == 0);
    unsetenv("NL_MODEL_CACHE");
    if (own) setenv("NL_PLAN_CACHE", own, 1);
    else unsetenv("NL_PLAN_CACHE");
    free(own);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nl_test_cli_check_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    /* qwen35: attn, mlp, recurrent and a tied head; llama: a separate head and embedding */
    char p35[128], pll[128];
    snprintf(p35, sizeof p35, "%s/qwen35.gguf", tmpdir);
    snprintf(pll, sizeof pll, "%s/llama.gguf", tmpdir);
    CHECKF(nl_mkmodel(NL_ARCH_QWEN35, "tiny", NL_TYPE_F32, 3, p35) == 0, "%s", nl_last_error());
    CHECKF(nl_mkmodel(NL_ARCH_LLAMA, "tiny", NL_TYPE_Q8_0, 4, pll) == 0, "%s", nl_last_error());
    test_check(p35, "qwen35");
    test_check(pll, "llama");
    test_bench(p35);
    test_plan_cache(pll);
    test_usage_errors(p35);
    test_version();
    remove(p35);
    remove(pll);
    rmdir(tmpdir);
    return nl_t_done();
}

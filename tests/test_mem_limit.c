/* --mem-limit-mb holds: `nightlora train` on the small model, as a Q8_0 file and as an F32 file
 * converted to Q8_0 at load (its source pages are read by the conversion), is run with the limit
 * just above what its preflight says it needs ("memory: needs N MiB"): it trains, and the
 * process's peak RSS (wait4's ru_maxrss, the child's VmHWM) stays under the limit; below it,
 * the run keeps fewer layers (and still holds the limit) or is refused before training. The peak is not checked under
 * ASan (its shadow memory and quarantine add to every allocation's RSS). NL_TEST_SMALL (CI's qemu
 * runs): the ref backend (no host start checks, ~100 s a run under qemu), the 3000-word case
 * under 200 MiB only, the Q8_0 file only, one limit below the need. */
#include <errno.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "model/model.h"
#include "model/quant.h"

static char tmp[256];

/* MiB a peak may pass its limit by: 0, but under qemu-user (QEMU_CPU set, as .ci/aarch64.sh runs
 * the tests) the RSS measured is the emulator's, whose cache of translated code grows with the
 * code a run reaches after its start (the 3000-word run at --ctx 576 peaked 2.3 MiB over 80 there
 * while its preflight, which counts the process's RSS at start, said 77.8) */
static double emu_slack_mb(void) {
    const char *q = getenv("QEMU_CPU");
    return q && *q ? 6.0 : 0.0;
}

/* run the CLI with args; exit status, the child's peak RSS in *maxrss_kb */
static int run(const char *const *args, const char *err, long *maxrss_kb) {
    const char *v[64];
    int n = 0;
    v[n++] = NL_CLI;
    for (int i = 0; args[i] && n < 61; i++) v[n++] = args[i];
    if (nl_t_small()) v[n++] = "--backend", v[n++] = "ref";
    v[n] = NULL;
    pid_t pid = nl_t_spawn(v, err, NULL);
    if (pid < 0) return -1;
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0)
        if (errno != EINTR) return -1;
    *maxrss_kb = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* N of "memory: needs N MiB" in the file; -1 when absent */
static double needs_mib(const char *err) {
    char *e = nl_t_slurp(err, NULL);
    const char *p = e ? strstr(e, "memory: needs ") : NULL;
    double v = -1;
    char unit[8] = "";
    if (p && sscanf(p, "memory: needs %lf %7s", &v, unit) == 2 && strcmp(unit, "MiB")) v = -1;
    free(e);
    return v;
}

static void limit_holds(const char *what, int type) {
    char model[512], out[512], err[512], lim[32];
    snprintf(model, sizeof model, "%s/%s.gguf", tmp, what);
    snprintf(out, sizeof out, "%s/%s_adapter.gguf", tmp, what);
    snprintf(err, sizeof err, "%s/%s.err", tmp, what);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "small", type, 3, model) == 0);
    long probe_kb = 0, kb = 0;
    const char *a[] = {"train",
                       "--model",
                       model,
                       "--data",
                       NL_TEST_DATA "/../../examples/tagging-train.jsonl",
                       "--out",
                       out,
                       "--steps",
                       "2",
                       "--batch-tokens",
                       "64",
                       "--threads",
                       "2",
                       "--thermal",
                       "off",
                       "--mem-limit-mb",
                       "100000",
                       NULL};
    CHECK(run(a, err, &probe_kb) == 0);
    double need = needs_mib(err);
    CHECKF(need > 0, "%s: no \"memory: needs N MiB\"", what);
    if (need <= 0) return;
    /* just above: trains, and the peak stays under the limit */
    double limit = need + 1;
    snprintf(lim, sizeof lim, "%.2f", limit);
    a[16] = lim;
    unlink(out);
    int rc = run(a, err, &kb);
    CHECKF(rc == 0 && access(out, F_OK) == 0, "%s: --mem-limit-mb %s: exit %d", what, lim, rc);
    printf("%-6s needs %.2f MiB; --mem-limit-mb %s: peak RSS %.2f MiB\n", what, need, lim, kb / 1024.0);
#ifndef __SANITIZE_ADDRESS__
    CHECKF((double)kb / 1024.0 <= limit + emu_slack_mb(),
           "%s: peak RSS %.2f MiB over --mem-limit-mb %s (the preflight said %.2f MiB)", what, kb / 1024.0, lim, need);
#else
    printf("       (ASan build: the peak is not checked against the limit; shadow memory counts in RSS)\n");
#endif
    /* below what this plan needs: the default activation budget shrinks to what is left (more
     * recompute), or the run is refused before training; a run that starts holds the limit */
    for (double below = 0.5; below < (nl_t_small() ? 1 : 8); below *= 4) {
        limit = need - below;
        snprintf(lim, sizeof lim, "%.2f", limit);
        unlink(out);
        rc = run(a, err, &kb);
        double got = needs_mib(err);
        if (rc == 1) {
            CHECKF(nl_t_file_has(err, "not enough memory: needs ") && access(out, F_OK) != 0,
                   "%s: --mem-limit-mb %s: exit 1", what, lim);
            printf("       --mem-limit-mb %s: refused\n", lim);
            continue;
        }
        CHECKF(rc == 0 && got > 0 && got <= limit, "%s: --mem-limit-mb %s: exit %d, needs %.2f MiB", what, lim, rc,
               got);
        printf("       --mem-limit-mb %s: needs %.2f MiB (less kept), peak RSS %.2f MiB\n", lim, got, kb / 1024.0);
#ifndef __SANITIZE_ADDRESS__
        CHECKF((double)kb / 1024.0 <= limit + emu_slack_mb(), "%s: peak RSS %.2f MiB over --mem-limit-mb %s", what,
               kb / 1024.0, lim);
#endif
    }
}

/* A long line under a limit it cannot be read in: refused before it is read, naming the line,
 * and the process never came near what reading it would have taken (it peaked at 1308 MiB
 * before the refusal under --mem-limit-mb 300 with a 60 MB line). */
static void long_line_refused(void) {
    char model[512], data[512], out[512], err[512];
    snprintf(model, sizeof model, "%s/ll.gguf", tmp);
    snprintf(data, sizeof data, "%s/longline.jsonl", tmp);
    snprintf(out, sizeof out, "%s/ll_adapter.gguf", tmp);
    snprintf(err, sizeof err, "%s/ll.err", tmp);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "small", NL_TYPE_Q8_0, 3, model) == 0);
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"text\": \"short one\"}\n{\"text\": \"", f);
    for (int i = 0; i < 1500000; i++) fputs(i % 7 ? "word " : "river ", f); /* ~8 MB */
    fputs("\"}\n", f);
    fclose(f);
    long kb = 0;
    const char *a[] = {
        "train", "--model",        model, "--data",    data, "--out",     out,   "--steps",        "1",   "--ctx",
        "64",    "--batch-tokens", "64",  "--threads", "2",  "--thermal", "off", "--mem-limit-mb", "120", NULL};
    int rc = run(a, err, &kb);
    CHECKF(rc == 1 && nl_t_file_has(err, "not enough memory: reading the data would need about ") &&
               nl_t_file_has(err, "longline.jsonl:2 is ") && nl_t_file_has(err, "nothing was read or trained") &&
               access(out, F_OK) != 0,
           "long line: exit %d", rc);
    printf("long line, --mem-limit-mb 120: refused before reading, peak RSS %.2f MiB\n", kb / 1024.0);
#ifndef __SANITIZE_ADDRESS__
    CHECKF((double)kb / 1024.0 <= 120 + emu_slack_mb(), "long line: peak RSS %.2f MiB over --mem-limit-mb 120",
           kb / 1024.0);
#endif
}

/* The hardening issue's case: a q8_0 model, one 3000-word text line (4096 tokens at the model's
 * context). Under --mem-limit-mb 285 it said "needs 277.89 MiB" and peaked at 310.7 MiB (the
 * backward's temporaries, the layer inputs' dx and the head's buffers were not counted); with
 * 200 and the --ctx / --batch-tokens it suggested, 212.6 MiB. Now: refused before any work
 * (the peak stays far under), and the suggested settings train within the limit. */
static void long_text_case(double limit_mb) {
    char model[512], data[512], out[512], err[512], lim[32];
    snprintf(model, sizeof model, "%s/lt.gguf", tmp);
    snprintf(data, sizeof data, "%s/words3000.jsonl", tmp);
    snprintf(out, sizeof out, "%s/lt_adapter.gguf", tmp);
    snprintf(err, sizeof err, "%s/lt.err", tmp);
    snprintf(lim, sizeof lim, "%.0f", limit_mb);
    if (access(model, F_OK) != 0) {
        CHECK(nl_mkmodel(NL_ARCH_QWEN3, "small", NL_TYPE_Q8_0, 3, model) == 0);
        FILE *f = fopen(data, "w");
        CHECK(f != NULL);
        if (!f) return;
        static const char *const w[] = {"river", "stone", "light", "word", "green", "house", "quick", "table"};
        fputs("{\"text\": \"", f);
        for (int i = 0; i < 3000; i++) fprintf(f, "%s%s", i ? " " : "", w[(i * 7 + i / 5) % 8]);
        fputs("\"}\n", f);
        fclose(f);
    }
    long kb = 0;
    const char *a[] = {"train", "--model",   model, "--data",         data, "--out", out,  "--steps", "1",  "--threads",
                       "2",     "--thermal", "off", "--mem-limit-mb", lim,  NULL,    NULL, NULL,      NULL, NULL};
    unlink(out);
    int rc = run(a, err, &kb);
    char *e = nl_t_slurp(err, NULL);
    const char *p = e ? strstr(e, "use --ctx ") : NULL;
    int ctx = 0, bt = 0;
    CHECKF(rc == 1 && p && sscanf(p, "use --ctx %d --batch-tokens %d", &ctx, &bt) == 2 && access(out, F_OK) != 0,
           "3000 words, --mem-limit-mb %s: exit %d, %s", lim, rc, e ? e : "");
    free(e);
    printf("3000 words, --mem-limit-mb %s: refused before training (peak RSS %.2f MiB), suggests --ctx %d "
           "--batch-tokens %d\n",
           lim, kb / 1024.0, ctx, bt);
#ifndef __SANITIZE_ADDRESS__
    CHECKF((double)kb / 1024.0 <= limit_mb / 2, "3000 words: the refusal peaked at %.2f MiB", kb / 1024.0);
#endif
    if (ctx < 16) return;
    char cs[16], bs[16];
    snprintf(cs, sizeof cs, "%d", ctx);
    snprintf(bs, sizeof bs, "%d", bt);
    a[15] = "--ctx", a[16] = cs, a[17] = "--batch-tokens", a[18] = bs;
    rc = run(a, err, &kb);
    const double need = needs_mib(err);
    CHECKF(rc == 0 && access(out, F_OK) == 0 && need > 0 && need <= limit_mb,
           "3000 words, --mem-limit-mb %s --ctx %d: exit %d, needs %.2f", lim, ctx, rc, need);
    printf("  --ctx %d --batch-tokens %d: needs %.2f MiB, peak RSS %.2f MiB\n", ctx, bt, need, kb / 1024.0);
#ifndef __SANITIZE_ADDRESS__
    CHECKF((double)kb / 1024.0 <= limit_mb + emu_slack_mb(),
           "3000 words: peak RSS %.2f MiB over --mem-limit-mb %s (--ctx %d)", kb / 1024.0, lim, ctx);
    /* and the estimate is not far above what the run takes (the suggestion is not needlessly small) */
    CHECKF(need <= 1.15 * (double)kb / 1024.0, "3000 words: needs %.2f MiB, but the run peaked at %.2f MiB", need,
           kb / 1024.0);
#endif
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "test_mem_limit")) return 1;
    long_line_refused();
    long_text_case(nl_t_small() ? 80 : 200);
    if (!nl_t_small()) long_text_case(285);
    limit_holds("q8_0", NL_TYPE_Q8_0);
    if (!nl_t_small()) limit_holds("f32", NL_TYPE_F32); /* converted to Q8_0 at load */
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

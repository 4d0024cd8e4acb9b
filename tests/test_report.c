/* The training report (eval/report.h, `nightlora report`, `train --report`): its structure on
 * logs with and without validation rows and pauses, bad input named by file and line, an empty
 * log, the output never replacing an input and written atomically. The browser check (the
 * report rendered by headless Chromium) is tests/report_browser.py. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/report.h"
#include "test.h"
#include "util/util.h"

static char dir[256];

static const char *at(const char *name) {
    static char buf[64][512]; /* a test holds a few dozen at once (argv lists) */
    static int k;
    k = (k + 1) % 64;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECKF(0, "cannot write %s", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* A log like the trainer's: n steps, a pause in the steps listed in `paused` (0-terminated),
 * a validation row every eval_every steps (0: none), with accuracy when acc. Returns what it
 * wrote in *tokens and *active_s (the seconds not paused). */
static void write_log(const char *path, int n, const int *paused, int eval_every, int acc, double *tokens,
                      double *active_s) {
    FILE *f = fopen(path, "w");
    double tok = 0, act = 0;
    for (int s = 1; s <= n; s++) {
        double p = 0;
        for (const int *q = paused; q && *q; q++)
            if (*q == s) p = 3.0;
        double sec = 0.1 + 0.001 * (s % 7) + p;
        int t = 200 + s % 5;
        fprintf(f,
                "{\"step\": %d, \"loss\": %.17g, \"tokens\": %d, \"targets\": 40, \"seconds\": %.4f, "
                "\"service_seconds\": 0.0400, "
                "\"paused_seconds\": %.4f, \"lr\": %.17g, \"grad_norm\": %.17g}\n",
                s, 1 + 7 * exp(-s / 20.0), t, sec, p, 1e-3 * (1 - (double)s / n), 1.0 / s);
        tok += t;
        act += sec - p;
        if (eval_every && s % eval_every == 0) {
            if (acc)
                fprintf(f,
                        "{\"eval\": {\"step\": %d, \"loss\": %.6f, \"accuracy\": %.4f, \"examples\": 120, \"tokens\": "
                        "430, \"seconds\": 1.25}}\n",
                        s, 1.5 + 6 * exp(-s / 20.0), s / (double)n);
            else
                fprintf(f,
                        "{\"eval\": {\"step\": %d, \"loss\": %.6f, \"accuracy\": null, \"examples\": 50, \"tokens\": "
                        "300, \"seconds\": 0.5}}\n",
                        s, 1.5 + 6 * exp(-s / 20.0));
        }
    }
    fclose(f);
    if (tokens) *tokens = tok;
    if (active_s) *active_s = act;
}

/* Nothing in the page is fetched: no script, link, image, frame, import, url(). */
static int self_contained(const char *html) {
    static const char *const bad[] = {"<script", "<link", "<img", "<iframe", "<object", "<embed",
                                      "src=",    "href=", "url(", "@import", NULL};
    for (const char *const *b = bad; *b; b++)
        if (strstr(html, *b)) {
            fprintf(stderr, "report holds %s\n", *b);
            return 0;
        }
    return 1;
}

static char *report(const char *log, const char *run, const char *out) {
    nl_report_opts o = {.log = log, .run_json = run};
    if (nl_report_write(&o, out)) {
        fprintf(stderr, "report failed: %s\n", nl_last_error());
        return NULL;
    }
    return nl_t_slurp(out, NULL);
}

static void test_full(void) {
    static const int paused[] = {30, 31, 77, 0};
    double tokens, active;
    write_log(at("full.jsonl"), 120, paused, 20, 1, &tokens, &active);
    char *h = report(at("full.jsonl"), NULL, at("full.html"));
    CHECK(h != NULL);
    if (!h) return;
    CHECK(!strncmp(h, "<!DOCTYPE html>", 15));
    CHECK(self_contained(h));
    CHECK(count(h, "<svg") == count(h, "</svg>"));
    CHECK(count(h, "<svg") ==
          7); /* loss (log, and linear in a <details>), accuracy, lr, gradient norm, throughput, time per step */
    static const char *const series[] = {"train-loss", "train-loss-mean", "val-loss",  "val-accuracy", "lr",
                                         "grad-norm",  "tokens-per-s",    "service-s", "cpu-s",        NULL};
    for (const char *const *s = series; *s; s++) {
        char key[64];
        snprintf(key, sizeof key, "data-series=\"%s\"", *s);
        const int want =
            !strncmp(*s, "train-loss", 10) || !strcmp(*s, "val-loss") ? 2 : 1; /* the loss: log and linear */
        CHECKF(count(h, key) == want, "%s: %d", key, count(h, key));
    }
    CHECK(strstr(h, "data-series=\"train-loss\" data-points=\"120\""));
    CHECK(count(h, "<title>paused 3.0 s in step ") == 3);
    CHECK(strstr(h, "<title>paused 3.0 s in step 77</title>"));
    CHECK(count(h, "<title>validation at step ") == 6);
    CHECK(count(h, "validation loss ") >= 6);
    CHECK(strstr(h, "<title>step 120: accuracy 100.0%</title>"));
    char want[160];
    snprintf(want, sizeof want, "<tr><th>tokens</th><td>%.0f</td></tr>", tokens);
    CHECKF(strstr(h, want), "%s", want);
    snprintf(want, sizeof want, "<tr><th>tokens/s</th><td>%.0f (paused time excluded)</td></tr>", tokens / active);
    CHECKF(strstr(h, want), "%s", want);
    CHECK(strstr(h, "9.0 s paused in 3 steps;") &&
          strstr(h, ">paused (thermal/battery)</text>")); /* no pause_kind: none said */
    CHECK(strstr(h, "6 evaluations, 7.5 s; best loss"));
    CHECK(strstr(h, "No run.json given"));
    free(h);

    /* a long log: every step counted, the drawn line binned to at most 1200 points */
    write_log(at("long.jsonl"), 5000, NULL, 0, 0, NULL, NULL);
    size_t len;
    CHECK((h = report(at("long.jsonl"), NULL, at("long.html"))) != NULL);
    free(h);
    h = nl_t_slurp(at("long.html"), &len);
    const char *p = h ? strstr(h, "data-series=\"train-loss\" data-points=\"5000\"") : NULL;
    CHECK(p != NULL);
    if (p) {
        const char *d = strstr(p, " d=\""), *e = d ? strchr(d + 4, '"') : NULL;
        int pts = 0;
        for (const char *q = d; q && q < e; q++) pts += *q == 'L' || *q == 'M';
        CHECKF(pts == 1200, "%d points", pts);
    }
    CHECKF(len < 600000, "%zu bytes", len);
    free(h);
}

/* The pause kind of the step rows (pause_kind): in the band's tooltip, the legend and the
 * facts; a log from before it says none (test_full: "paused (thermal/battery)"). */
static void test_pause_kinds(void) {
    static const char *const kinds[] = {"\"pause_kind\": \"thermal\", ", "\"pause_kind\": \"battery\", ", "",
                                        "\"pause_kind\": \"thermal+battery\", "};
    for (int v = 0; v < 3; v++) {
        FILE *f = fopen(at("kinds.jsonl"), "w");
        for (int s = 1; s <= 8; s++) {
            /* v 0: thermal in 2, battery in 5, both in 7; v 1: thermal only; v 2: 5 says nothing */
            int k = s == 2 ? 0 : s == 5 ? (v == 0 ? 1 : v == 1 ? 0 : 2) : s == 7 ? (v == 1 ? 0 : 3) : -1;
            if (v == 2 && s == 7) k = 0;
            fprintf(f,
                    "{\"step\": %d, \"loss\": %g, \"tokens\": 100, \"seconds\": %s, \"paused_seconds\": %s, %s\"lr\": "
                    "0.001}\n",
                    s, 3.0 - 0.1 * s, k >= 0 ? "2.5" : "0.5", k >= 0 ? "2.0" : "0", k >= 0 ? kinds[k] : "");
        }
        fclose(f);
        char *h = report(at("kinds.jsonl"), NULL, at("kinds.html"));
        CHECK(h != NULL);
        if (!h) continue;
        CHECK(strstr(h, "<title>paused 2.0 s in step 2 (thermal)</title>"));
        if (v == 0) {
            CHECK(strstr(h, "<title>paused 2.0 s in step 5 (battery)</title>") &&
                  strstr(h, "<title>paused 2.0 s in step 7 (thermal+battery)</title>"));
            CHECK(strstr(h, ">paused (thermal, battery)</text>") && !strstr(h, "paused (thermal/battery)"));
            CHECKF(strstr(h, "6.0 s paused in 3 steps (thermal in 2, battery in 2)"), "the facts' kinds");
        } else if (v == 1) {
            CHECK(strstr(h, ">paused (thermal)</text>") && strstr(h, "paused in 3 steps (thermal in 3, battery in 0)"));
        } else {
            /* a pause that says nothing: the legend as before, its tooltip without a kind */
            CHECK(strstr(h, "<title>paused 2.0 s in step 5</title>") && strstr(h, ">paused (thermal/battery)</text>"));
        }
        free(h);
    }
}

static void test_without_validation(void) {
    write_log(at("plain.jsonl"), 10, NULL, 0, 0, NULL, NULL);
    char *h = report(at("plain.jsonl"), NULL, at("plain.html"));
    CHECK(h != NULL);
    if (!h) return;
    CHECK(self_contained(h));
    CHECK(!strstr(h, "data-series=\"val-loss\""));
    CHECK(!strstr(h, "data-series=\"val-accuracy\""));
    CHECK(!strstr(h, "data-series=\"train-loss-mean\"")); /* too few steps for a moving mean */
    CHECK(strstr(h, "No validation rows in this log"));
    CHECK(strstr(h, "<tr><th>validation</th><td>none logged</td></tr>"));
    CHECK(!strstr(h, "<title>paused"));
    free(h);
    /* validation rows without accuracy: the loss drawn, the accuracy said to be absent */
    write_log(at("noacc.jsonl"), 10, NULL, 5, 0, NULL, NULL);
    CHECK((h = report(at("noacc.jsonl"), NULL, at("noacc.html"))) != NULL);
    CHECK(h && strstr(h, "data-series=\"val-loss\""));
    CHECK(h && !strstr(h, "data-series=\"val-accuracy\""));
    CHECK(h && strstr(h, "carry no accuracy"));
    free(h);
    /* the fewest fields a step row needs; other kinds of rows counted, not drawn; a killed run's
     * half line left out and said */
    put(at("min.jsonl"), "{\"step\": 1, \"loss\": 2.5, \"tokens\": 10, \"seconds\": 0.5}\n"
                         "{\"best\": {\"step\": 1}}\n"
                         "\n"
                         "{\"step\": 2, \"loss\": 2.25, \"tokens\": 10, \"seconds\": 0.5, \"new_field\": [1, 2]}\n"
                         "{\"step\": 3, \"lo");
    CHECK((h = report(at("min.jsonl"), NULL, at("min.html"))) != NULL);
    CHECK(h && strstr(h, "steps 1 to 2"));
    CHECK(h && strstr(h, "<tr><th>other rows</th><td>1, not drawn (&quot;best&quot;)</td></tr>"));
    CHECK(h && strstr(h, "Line 5 of the log has no newline"));
    CHECK(h && !strstr(h, "data-series=\"lr\""));
    CHECK(h && !strstr(h, "data-series=\"service-s\"")); /* the log has no service_seconds */
    CHECK(h && strstr(h, "data-series=\"cpu-s\""));
    free(h);
}

/* A bad log: no report, an error naming the file and the line, what was there kept. */
static void expect_bad(const char *text, const char *msg) {
    put(at("bad.jsonl"), text);
    put(at("bad.html"), "old report");
    nl_report_opts o = {.log = at("bad.jsonl")};
    int rc = nl_report_write(&o, at("bad.html"));
    CHECKF(rc != 0, "accepted: %s", text);
    CHECKF(rc != 0 && strstr(nl_last_error(), at("bad.jsonl")) && strstr(nl_last_error(), msg),
           "%s: got '%s', want '%s'", text, nl_last_error(), msg);
    CHECK(nl_t_file_has(at("bad.html"), "old report"));
}

static void test_bad_input(void) {
    const char *ok = "{\"step\": 1, \"loss\": 2.5, \"tokens\": 10, \"seconds\": 0.5}\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s{\"step\": 2, \"loss\": 2.5,, \"tokens\": 1}\n", ok,
             "{\"eval\": {\"step\": 1, \"loss\": 3}}\n");
    expect_bad(buf, "bad.jsonl:3:25: expected a string key");
    snprintf(buf, sizeof buf, "%s[1, 2]\n", ok);
    expect_bad(buf, "bad.jsonl:2: an array, expected a JSON object");
    expect_bad("{\"step\": 1, \"tokens\": 10, \"seconds\": 0.5}\n", "bad.jsonl:1: a step row without \"loss\"");
    expect_bad("{\"step\": 1, \"loss\": \"2.5\", \"tokens\": 10, \"seconds\": 0.5}\n",
               "bad.jsonl:1:21: \"loss\" is a string, expected a number");
    expect_bad("{\"step\": 1.5, \"loss\": 2, \"tokens\": 10, \"seconds\": 0.5}\n",
               "bad.jsonl:1:10: \"step\" is a fraction, expected an integer");
    expect_bad("{\"step\": 1, \"loss\": 2, \"tokens\": -1, \"seconds\": 0.5}\n",
               "\"tokens\" is -1, expected an integer >= 0");
    expect_bad("{\"step\": 1, \"loss\": 2, \"tokens\": 1, \"seconds\": 0.5, \"paused_seconds\": 0.7}\n",
               "bad.jsonl:1: \"paused_seconds\" 0.7 is more than");
    snprintf(buf, sizeof buf, "%s%s", ok, ok);
    expect_bad(buf, "bad.jsonl:2: step 1 after step 1: steps must increase");
    snprintf(buf, sizeof buf, "%s{\"eval\": {\"step\": 1, \"loss\": 3, \"accuracy\": 87.5}}\n", ok);
    expect_bad(buf, "bad.jsonl:2:45: \"accuracy\" is out of range, expected a fraction in [0, 1] or null");
    snprintf(buf, sizeof buf, "%s{\"eval\": {\"step\": 1}}\n", ok);
    expect_bad(buf, "bad.jsonl:2: a validation row without \"loss\"");
    snprintf(buf, sizeof buf, "%s{\"eval\": 3}\n", ok);
    expect_bad(buf, "bad.jsonl:2:10: \"eval\" is a number, expected an object");
    /* a bad line in the middle is an error even when the rest is fine */
    snprintf(buf, sizeof buf, "%s{\"step\": 2, \"lo\n%s", ok, ok);
    expect_bad(buf, "bad.jsonl:2:");
    /* nothing to draw */
    expect_bad("", "bad.jsonl: no training step in the log (it is empty)");
    expect_bad("{\"eval\": {\"step\": 0, \"loss\": 3}}\n", "no training step in the log: nothing to draw");
    /* a log that is not there, or a directory */
    nl_report_opts o = {.log = at("missing.jsonl")};
    CHECK(nl_report_write(&o, at("m.html")) != 0 && strstr(nl_last_error(), "missing.jsonl"));
    o.log = dir;
    CHECK(nl_report_write(&o, at("m.html")) != 0 && strstr(nl_last_error(), "directory"));
    expect_bad(
        "{\"step\": 1, \"loss\": 2, \"tokens\": 1, \"seconds\": 0.5, \"paused_seconds\": 0.2, \"pause_kind\": "
        "\"cold\"}\n",
        "bad.jsonl:1:90: \"pause_kind\" is another string, expected \"thermal\", \"battery\" or \"thermal+battery\"");
    expect_bad("{\"step\": 1, \"loss\": 2, \"tokens\": 1, \"seconds\": 0.5, \"pause_kind\": 2}\n",
               "bad.jsonl:1:67: \"pause_kind\" is a number, expected");
}

static void test_settings(void) {
    write_log(at("s.jsonl"), 5, NULL, 0, 0, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/ck", dir);
    CHECK(system(cmd) == 0);
    put(at("ck/run.json"), "{\n  \"rank\": \"16\",\n  \"template\": \"<b>&'x'\",\n  \"n\": 3\n}\n");
    nl_report_kv info[] = {{"command", "nightlora train --out 'a b.gguf'"}};
    nl_report_opts o = {.log = at("s.jsonl"), .run_json = at("ck"), .info = info, .n_info = 1, .title = "A <run>"};
    CHECK(nl_report_write(&o, at("s.html")) == 0);
    char *h = nl_t_slurp(at("s.html"), NULL);
    CHECK(h && strstr(h, "<tr><th>rank</th><td>16</td></tr>"));
    CHECK(h && strstr(h, "<tr><th>template</th><td>&lt;b&gt;&amp;&#39;x&#39;</td></tr>"));
    CHECK(h && strstr(h, "<tr><th>n</th><td>3</td></tr>"));
    CHECK(h && strstr(h, "<tr><th>command</th><td>nightlora train --out &#39;a b.gguf&#39;</td></tr>"));
    CHECK(h && strstr(h, "<title>A &lt;run&gt;</title>"));
    CHECK(h && !strstr(h, "No run.json given"));
    free(h);
    /* the file itself works as well as its directory; a bad one is named with line:column */
    o.run_json = at("ck/run.json");
    CHECK(nl_report_write(&o, at("s.html")) == 0);
    put(at("ck/run.json"), "{\n  \"rank\": 16,,\n}\n");
    put(at("s.html"), "old report");
    CHECK(nl_report_write(&o, at("s.html")) != 0 && strstr(nl_last_error(), "run.json:2:14: expected a string key"));
    CHECK(nl_t_file_has(at("s.html"), "old report"));
    put(at("ck/run.json"), "[]");
    CHECK(nl_report_write(&o, at("s.html")) != 0 &&
          strstr(nl_last_error(), "expected the JSON object a run.json holds"));
}

/* The report never replaces its input, also not through its temp file; it is written atomically. */
static void test_output(void) {
    write_log(at("o.jsonl"), 5, NULL, 0, 0, NULL, NULL);
    char *before = nl_t_slurp(at("o.jsonl"), NULL);
    nl_report_opts o = {.log = at("o.jsonl")};
    CHECK(nl_report_write(&o, at("o.jsonl")) != 0 && strstr(nl_last_error(), "never replaces what it reads"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ln -sf o.jsonl %s/link.html && cp %s %s/o.html.tmp", dir, at("o.jsonl"), dir);
    CHECK(system(cmd) == 0);
    CHECK(nl_report_write(&o, at("link.html")) != 0);
    o.log = at("o.html.tmp");
    CHECK(nl_report_write(&o, at("o.html")) != 0 && strstr(nl_last_error(), "temp file"));
    CHECK(nl_t_file_has(at("o.html.tmp"), "\"step\": 5"));
    char *after = nl_t_slurp(at("o.jsonl"), NULL);
    CHECK(before && after && !strcmp(before, after));
    free(before);
    free(after);
    /* every I/O call of the write failing in turn: the old report stays whole */
    o.log = at("o.jsonl");
    put(at("o.html"), "old report");
    nl_io_fault f;
    nl_io_fault_init(&f, NULL, -1, 0, 0);
    o.io = &f.io;
    CHECK(nl_report_write(&o, at("o2.html")) == 0);
    long calls = f.calls;
    CHECK(calls >= 4);
    int kept = 0;
    for (long k = 0; k < calls; k++) {
        nl_io_fault_init(&f, NULL, k, ENOSPC, 0);
        int rc = nl_report_write(&o, at("o.html"));
        if (rc == -1) kept += nl_t_file_has(at("o.html"), "old report") && !nl_t_file_has(at("o.html"), "<svg");
        else CHECKF(rc == NL_IO_NOT_DURABLE && nl_t_file_has(at("o.html"), "<svg"), "call %ld: rc %d", k, rc);
        if (rc == NL_IO_NOT_DURABLE) put(at("o.html"), "old report");
        else CHECKF(rc == -1 && strstr(nl_last_error(), "o.html"), "call %ld: %s", k, nl_last_error());
    }
    CHECKF(kept >= calls - 1, "%d of %ld", kept, calls);
    o.io = NULL;
    CHECK(nl_report_write(&o, at("o.html")) == 0 && nl_t_file_has(at("o.html"), "<svg"));
}

/* The CLI: `nightlora report` and `train --report` (a tiny model, a few steps). */
static void test_cli(void) {
    write_log(at("c.jsonl"), 8, NULL, 4, 1, NULL, NULL);
    const char *ok[] = {NL_CLI, "report", "--log", at("c.jsonl"), "--out", at("c.html"), NULL};
    CHECK(nl_t_run(ok, at("err"), at("out")) == 0 && nl_t_file_has(at("out"), "report written to"));
    CHECK(nl_t_file_has(at("c.html"), "data-series=\"val-accuracy\""));
    const char *no_out[] = {NL_CLI, "report", "--log", at("c.jsonl"), NULL};
    CHECK(nl_t_run(no_out, at("err"), NULL) == 2 && nl_t_file_has(at("err"), "--log and --out are required"));
    const char *same[] = {NL_CLI, "report", "--log", at("c.jsonl"), "--out", at("c.jsonl"), NULL};
    CHECK(nl_t_run(same, at("err"), NULL) == 2 && nl_t_file_has(at("err"), "are the same file"));
    CHECK(nl_t_file_has(at("c.jsonl"), "\"step\": 8"));
    put(at("cb.jsonl"), "{\"step\": 1, \"loss\": 1, \"tokens\": 1, \"seconds\": 1}\nnot json\n");
    const char *bad[] = {NL_CLI, "report", "--log", at("cb.jsonl"), "--out", at("cb.html"), NULL};
    CHECK(nl_t_run(bad, at("err"), NULL) == 1 && nl_t_file_has(at("err"), "cb.jsonl:2:1: "));

    const char *mk[] = {NL_CLI, "mkmodel", "--arch", "qwen3", "--preset", "tiny", "--out", at("tiny.gguf"), NULL};
    CHECK(nl_t_run(mk, at("err"), NULL) == 0);
    const char *data = NL_TEST_DATA "/../../examples/tagging-train.jsonl";
    const char *tr[] = {NL_CLI,
                        "train",
                        "--model",
                        at("tiny.gguf"),
                        "--data",
                        data,
                        "--out",
                        at("a.gguf"),
                        "--steps",
                        "6",
                        "--batch-tokens",
                        "128",
                        "--threads",
                        "1",
                        "--checkpoint-dir",
                        at("ck2"),
                        "--log-json",
                        at("t.jsonl"),
                        "--report",
                        at("t.html"),
                        "--stop-after",
                        "4",
                        NULL};
    CHECK(nl_t_run(tr, at("err"), NULL) == 0);
    CHECK(nl_t_file_has(at("err"), "report written to"));
    char *h = nl_t_slurp(at("t.html"), NULL);
    CHECK(h && strstr(h, "steps 1 to 4")); /* stopped early, after its commit: the report of what ran */
    /* the command from the checkpoint directory's history (runs.jsonl) */
    CHECK(h && strstr(h, "<tr><th>started (to step 6)</th><td>nightlora train --model "));
    CHECK(h && strstr(h, "<tr><th>rank</th><td>16</td></tr>")); /* from the checkpoint directory's run.json */
    CHECK(h && strstr(h, "data-series=\"service-s\"") && strstr(h, "data-series=\"lr\""));
    CHECK(h && count(h, "<g class=\"resume\"") == 0);
    free(h);
    /* resumed with more steps: both commands, what the resume changed, its marker on every chart,
     * the data's path beside its hash */
    const char *re[] = {NL_CLI,
                        "train",
                        "--model",
                        at("tiny.gguf"),
                        "--data",
                        data,
                        "--out",
                        at("a.gguf"),
                        "--steps",
                        "8",
                        "--batch-tokens",
                        "128",
                        "--threads",
                        "1",
                        "--checkpoint-dir",
                        at("ck2"),
                        "--log-json",
                        at("t.jsonl"),
                        "--report",
                        at("t.html"),
                        "--resume",
                        "--quiet",
                        NULL};
    CHECK(nl_t_run(re, at("err"), NULL) == 0);
    CHECK(nl_t_file_has(at("err"), "report written to")); /* --quiet keeps it */
    h = nl_t_slurp(at("t.html"), NULL);
    CHECK(h && strstr(h, "steps 1 to 8"));
    CHECK(h && strstr(h, "<tr><th>started (to step 6)</th><td>nightlora train --model ") &&
          strstr(h, "--stop-after 4</td></tr>"));
    CHECK(h && strstr(h, "<tr class=\"resume\"><th>resumed at step 4 (to step 8)</th><td>nightlora train --model "));
    CHECK(h && strstr(h, "--resume --quiet<br>changed: --steps 6 -&gt; 8</td></tr>"));
    CHECKF(h && count(h, "<g class=\"resume\" data-x=\"4\">") == 5, "%d step charts marked",
           h ? count(h, "<g class=\"resume\" data-x=\"4\">") : -1);
    CHECK(h && count(h, "<g class=\"resume\"") ==
                   6); /* loss, loss linear, lr, grad norm, time per step; throughput at its time */
    char want[700];
    snprintf(want, sizeof want, "<tr><th>data</th><td>%s (content hash ", data);
    CHECKF(h && strstr(h, want), "no '%s'", want);
    CHECK(h && !strstr(h, "<th>data_path</th>"));
    free(h);
    const char *no_log[] = {NL_CLI,  "train",      "--model",  at("tiny.gguf"), "--data", data,
                            "--out", at("a.gguf"), "--report", at("t.html"),    NULL};
    CHECK(nl_t_run(no_log, at("err"), NULL) == 2 && nl_t_file_has(at("err"), "give --log-json FILE too"));
    const char *same_log[] = {NL_CLI,       "train",      "--model",     at("tiny.gguf"), "--data",      data, "--out",
                              at("a.gguf"), "--log-json", at("t.jsonl"), "--report",      at("t.jsonl"), NULL};
    CHECK(nl_t_run(same_log, at("err"), NULL) == 2 && nl_t_file_has(at("err"), "are the same file"));
    CHECK(nl_t_file_has(at("t.jsonl"), "\"step\": 4"));
}

/* y of the tick label `label` in the chart figure id (a log axis's ticks); NAN when absent */
static double tick_y(const char *h, const char *id, const char *label) {
    char key[80];
    snprintf(key, sizeof key, "<figure id=\"%s\">", id);
    const char *f = strstr(h, key), *end = f ? strstr(f, "</figure>") : NULL;
    snprintf(key, sizeof key, "text-anchor=\"end\">%s</text>", label);
    for (const char *p = f; p && (p = strstr(p, key)) && p < end; p++) {
        const char *y = p;
        while (y > f && strncmp(y, " y=\"", 4)) y--;
        return strtod(y + 4, NULL);
    }
    return NAN;
}

/* cx of the first point of a series in the chart figure id */
static double first_cx(const char *h, const char *id, const char *series) {
    char key[80];
    snprintf(key, sizeof key, "<figure id=\"%s\">", id);
    const char *f = strstr(h, key);
    snprintf(key, sizeof key, "data-series=\"%s\"", series);
    const char *p = f ? strstr(f, key) : NULL;
    p = p ? strstr(p, "cx=\"") : NULL;
    return p ? strtod(p + 4, NULL) : NAN;
}

/* A resumed run (DIR/runs.jsonl beside run.json): every command with what it changed, a marker
 * at each resume's step on every chart (at its time on the throughput chart), the data's path
 * beside its hash; the loss on a log axis (the linear one in a <details>); the accuracy on the
 * loss's x axis (its points where the validation loss's are, though the steps start before the
 * first evaluation); a bad history line named; a log with a loss <= 0 drawn linear. */
static void test_history(void) {
    write_log(at("h.jsonl"), 20, NULL, 4, 1, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/hk", dir);
    CHECK(system(cmd) == 0);
    put(at("hk/run.json"),
        "{\n  \"model\": \"0123456789abcdef\",\n  \"data\": \"fedcba9876543210\",\n  \"rank\": \"8\",\n"
        "  \"model_path\": \"/m/base.gguf\",\n  \"data_path\": \"/d/notes & <tags>.jsonl\"\n}\n");
    put(at("hk/runs.jsonl"), "{\"step\": 0, \"resume\": false, \"steps\": 8, \"command\": \"nightlora train --steps "
                             "8\", \"changes\": \"\"}\n"
                             "{\"step\": 8, \"resume\": true, \"steps\": 14, \"command\": \"nightlora train --steps 14 "
                             "--resume\", \"changes\": \"--steps 8 -> 14\"}\n"
                             "{\"step\": 14, \"resume\": true, \"steps\": 20}\n"
                             "{\"step\": 20, \"resu"); /* a line cut by a crash: left out */
    char *h = report(at("h.jsonl"), at("hk"), at("h.html"));
    CHECK(h != NULL);
    if (!h) return;
    CHECK(self_contained(h));
    CHECK(strstr(h, "<tr><th>started (to step 8)</th><td>nightlora train --steps 8</td></tr>"));
    CHECK(strstr(h, "<tr class=\"resume\"><th>resumed at step 8 (to step 14)</th><td>nightlora train --steps 14 "
                    "--resume<br>changed: --steps 8 -&gt; 14</td></tr>"));
    CHECK(strstr(
        h,
        "<tr class=\"resume\"><th>resumed at step 14 (to step 20)</th><td>(not recorded: a library call)</td></tr>"));
    CHECK(count(h, "<tr class=\"resume\">") == 2);
    /* 7 charts, two resumes each: on the 6 step charts at steps 8 and 14 */
    CHECKF(count(h, "<g class=\"resume\"") == 14, "%d resume markers", count(h, "<g class=\"resume\""));
    CHECK(count(h, "<g class=\"resume\" data-x=\"8\">") == 6 && count(h, "<g class=\"resume\" data-x=\"14\">") == 6);
    CHECK(strstr(h, "<title>resumed at step 8 (to step 14): nightlora train --steps 14 --resume; changed --steps 8 "
                    "-&gt; 14</title>"));
    CHECK(count(h, "resumed (--resume)</text>") == 7);
    CHECK(
        strstr(h, "<tr><th>data</th><td>/d/notes &amp; &lt;tags&gt;.jsonl (content hash fedcba9876543210)</td></tr>"));
    CHECK(strstr(h, "<tr><th>model</th><td>/m/base.gguf (content hash 0123456789abcdef)</td></tr>"));
    CHECK(!strstr(h, "<th>data_path</th>") && !strstr(h, "<th>model_path</th>"));
    /* the log axis: the loss chart's ticks at 2 and 5 (and 1), spaced as their logarithms */
    const char *fl = strstr(h, "<figure id=\"loss\">"), *fa = strstr(h, "<figure id=\"accuracy\">");
    CHECK(fl && strstr(fl, "data-scale=\"log\"") && strstr(fl, "data-scale=\"log\"") < strstr(fl, "</figure>"));
    CHECK(strstr(h, "Training and validation loss (log scale)</figcaption>"));
    CHECK(strstr(h, "<details class=\"linear\"><summary>") && strstr(h, "<figure id=\"loss-linear\">"));
    /* the losses span 3.6 to 7.7, less than a decade: ticks at 4, 5, 6, 7 spaced as their
     * logarithms (log 5/4 : log 6/5 : log 7/6), where the linear chart spaces them evenly */
    double y4 = tick_y(h, "loss", "4"), y5 = tick_y(h, "loss", "5"), y6 = tick_y(h, "loss", "6"),
           y7 = tick_y(h, "loss", "7");
    CHECKF(isfinite(y4) && isfinite(y5) && isfinite(y6) && isfinite(y7) && y4 > y5 && y5 > y6 && y6 > y7,
           "ticks at %g %g %g %g", y4, y5, y6, y7);
    CHECKF(fabs((y4 - y5) / (y5 - y6) - log(5.0 / 4) / log(6.0 / 5)) < 0.02 &&
               fabs((y5 - y6) / (y6 - y7) - log(6.0 / 5) / log(7.0 / 6)) < 0.02,
           "log ticks 4, 5, 6, 7 at %g %g %g %g", y4, y5, y6, y7);
    double l4 = tick_y(h, "loss-linear", "4"), l5 = tick_y(h, "loss-linear", "5"), l6 = tick_y(h, "loss-linear", "6");
    CHECKF(fabs((l4 - l5) - (l5 - l6)) < 0.2, "linear ticks 4, 5, 6 at %g %g %g", l4, l5, l6);
    /* the accuracy on the loss's x axis: the first evaluation (step 4) at the same x in both */
    double cl = first_cx(h, "loss", "val-loss"), ca = first_cx(h, "accuracy", "val-accuracy");
    CHECKF(isfinite(cl) && fabs(cl - ca) < 0.05, "step 4: x %g in the loss chart, %g in the accuracy chart", cl, ca);
    CHECK(fa != NULL);
    free(h);
    /* a bad history line: named by file and line; the output is never the history */
    put(at("hk/runs.jsonl"), "{\"step\": 0, \"resume\": false}\n{\"step\": \"8\", \"resume\": true}\n");
    nl_report_opts o = {.log = at("h.jsonl"), .run_json = at("hk")};
    CHECK(nl_report_write(&o, at("h.html")) != 0 && strstr(nl_last_error(), "runs.jsonl:2: expected a run's row"));
    put(at("hk/runs.jsonl"), "{\"step\": 0, \"resume\": false}\n");
    CHECK(nl_report_write(&o, at("hk/runs.jsonl")) != 0 && strstr(nl_last_error(), "the run's history"));
    CHECK(nl_t_file_has(at("hk/runs.jsonl"), "\"resume\": false"));
    /* a narrow span (5.3 to 6.3, one tick of 1..9 inside): out to the ticks around it, 5 to 7 */
    put(at("n.jsonl"), "{\"step\": 1, \"loss\": 6.3, \"tokens\": 1, \"seconds\": 1}\n{\"step\": 2, \"loss\": 5.3, "
                       "\"tokens\": 1, \"seconds\": 1}\n");
    h = report(at("n.jsonl"), NULL, at("n.html"));
    CHECK(h && isfinite(tick_y(h, "loss", "5")) && isfinite(tick_y(h, "loss", "6")) &&
          isfinite(tick_y(h, "loss", "7")));
    free(h);
    /* a loss <= 0 (a log of another tool): the linear axis */
    put(at("z.jsonl"), "{\"step\": 1, \"loss\": 0.5, \"tokens\": 1, \"seconds\": 1}\n{\"step\": 2, \"loss\": 0, "
                       "\"tokens\": 1, \"seconds\": 1}\n");
    h = report(at("z.jsonl"), NULL, at("z.html"));
    CHECK(h && !strstr(h, "data-scale=\"log\"") && !strstr(h, "loss-linear") && !strstr(h, "(log scale)"));
    free(h);
}

int main(void) {
    if (nl_t_tmpdir(dir, sizeof dir, "report")) return 1;
    test_full();
    test_pause_kinds();
    test_without_validation();
    test_bad_input();
    test_settings();
    test_history();
    test_output();
    test_cli();
    nl_t_tmpdir_done(dir);
    return nl_t_done();
}

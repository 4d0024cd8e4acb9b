/* A chat template is a program from an untrusted file: a bomb in a GGUF's tokenizer.chat_template
 * fails at model load (the probe rendering, data/dataset.h) for `check` and every command that
 * loads the model, before any work, with an error naming the file, the template's line and the
 * limit; a bomb given with --template FILE fails the same way; the model's own good template
 * still loads. Each command's time is bounded (generous for a loaded machine: a bomb took 65 s to
 * 23 GB before the budget). */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model.h"
#include "test.h"
#include "util/util.h"

static char tmp[64];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* A copy of the model `good` whose tokenizer.chat_template is `tmpl`. */
static int with_template(const char *good, const char *bad, const char *tmpl) {
    nl_gguf *g = nl_gguf_open(good);
    if (!g) return -1;
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = nl_gguf_copy_kvs(w, g) || nl_gguf_set_str(w, "tokenizer.chat_template", tmpl);
    for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, false);
    }
    if (!rc) rc = nl_gguf_write(w, bad);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    return rc;
}

/* Runs argv; exit status want_rc within `bound` seconds, stderr holding n1 and n2. */
static void expect_cmd(const char *what, const char *const *argv, int want_rc, const char *n1, const char *n2,
                       double bound) {
    char errf[128];
    path_of(errf, sizeof errf, "err.txt");
    double t0 = nl_now();
    int rc = nl_t_run(argv, errf, NULL);
    double secs = nl_now() - t0;
    char *e = nl_t_slurp(errf, NULL);
    bool ok = rc == want_rc && e && (!n1 || strstr(e, n1)) && (!n2 || strstr(e, n2)) && secs < bound;
    if (!ok)
        fprintf(stderr, "%s: exit %d (want %d) after %.2f s (bound %.0f s), stderr [%s], want [%s] [%s]\n", what, rc,
                want_rc, secs, bound, e ? e : "", n1 ? n1 : "", n2 ? n2 : "");
    CHECK(ok);
    free(e);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/nl_test_tmpl_budget_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    char good[128], loop[128], mem[128], data[128], tfile[128], want[256];
    path_of(good, sizeof good, "good.gguf");
    path_of(loop, sizeof loop, "loop.gguf");
    path_of(mem, sizeof mem, "mem.gguf");
    path_of(data, sizeof data, "d.jsonl");
    path_of(tfile, sizeof tfile, "bomb.jinja");
    CHECKF(nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_F32, 7, good) == 0, "%s", nl_last_error());
    /* the two: 10^4 x 5000 empty iterations ahead of a real template (generate took 65 s,
     * eval ran past 300 s), and a list doubled 27 times (451 MB in generate and eval) */
    CHECK(with_template(good, loop,
                        "{% for a in range(10000) %}{% for b in range(5000) %}{% endfor %}{% endfor %}"
                        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}") ==
          0);
    CHECK(with_template(
              good, mem,
              "{% set ns = namespace(s=[1]) %}\n{% for i in range(27) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
              "{{ ns.s|length }}") == 0);
    FILE *f = fopen(data, "w");
    fputs(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n",
        f);
    fclose(f);

    /* the good model loads and checks */
    const char *c0[] = {NL_CLI, "check", "--model", good, NULL};
    expect_cmd("check good", c0, 0, NULL, NULL, 60);
    /* every command that loads a bomb fails before any work */
    snprintf(want, sizeof want, "%s: tokenizer.chat_template:1: the template ran past 2000000 operations", loop);
    const char *c1[] = {NL_CLI, "check", "--model", loop, NULL};
    expect_cmd("check loop bomb", c1, 1, want, "probe conversation at load", 10);
    const char *c2[] = {NL_CLI, "generate", "--model", loop, "--prompt", "hi", "--n", "4", NULL};
    expect_cmd("generate loop bomb", c2, 1, want, NULL, 10);
    const char *c3[] = {NL_CLI, "eval", "--model", loop, "--data", data, NULL};
    expect_cmd("eval loop bomb", c3, 1, want, NULL, 10);
    char out[128];
    path_of(out, sizeof out, "ad.gguf");
    const char *c4[] = {NL_CLI, "train", "--model", loop, "--data", data, "--out", out, "--steps", "1", NULL};
    expect_cmd("train loop bomb", c4, 1, want, NULL, 10);
    snprintf(want, sizeof want, "%s: tokenizer.chat_template:2: the template needs more than 8.0 MiB", mem);
    const char *c5[] = {NL_CLI, "generate", "--model", mem, "--prompt", "hi", "--n", "4", NULL};
    expect_cmd("generate mem bomb", c5, 1, want, NULL, 10);
    const char *c6[] = {NL_CLI, "eval", "--model", mem, "--data", data, NULL};
    expect_cmd("eval mem bomb", c6, 1, want, NULL, 10);
    CHECK(!(access(out, F_OK) == 0));
    /* a bomb given with --template FILE: refused at the flag's check, before the model is read */
    f = fopen(tfile, "w");
    fputs("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", f);
    fclose(f);
    snprintf(want, sizeof want, "%s:1: the template", tfile);
    const char *c7[] = {NL_CLI, "train",   "--model", good,         "--data", data, "--out",
                        out,    "--steps", "1",       "--template", tfile,    NULL};
    expect_cmd("train --template bomb", c7, 1, want, "probe conversation", 10);
    const char *c8[] = {NL_CLI, "eval", "--model", good, "--data", data, "--template", tfile, NULL};
    expect_cmd("eval --template bomb", c8, 1, want, NULL, 10);
    CHECK(!(access(out, F_OK) == 0));

    remove(good);
    remove(loop);
    remove(mem);
    remove(data);
    remove(tfile);
    remove(out);
    char errf[128];
    path_of(errf, sizeof errf, "err.txt");
    remove(errf);
    rmdir(tmp);
    return nl_t_done();
}

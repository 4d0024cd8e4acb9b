/* Bad input to `nightlora train`, as the user sees it: every case runs the real CLI (NL_CLI)
 * and checks the exit status and the words of the message (docs/bad-input.md is the table of
 * these cases); the NaN-gradient case runs nl_train with its testing hook. Each message is
 * printed so the table can be checked against it. Cases:
 *   empty data file; an example over the context (--on-long refuse: refused with file:line;
 *   truncate: trained, reported); empty completion; wrong JSON types; a line that is not JSON;
 *   unknown --template; non-UTF-8 bytes; a lone surrogate escape; a missing data file;
 *   an adapter for another architecture, for another model size of the same architecture;
 *   --init-adapter with a different --rank (and the same rank: runs); an adapter whose
 *   lora_a / lora_b ranks disagree; an --init-adapter holding a NaN; an adapter holding a NaN
 *   or alpha Inf in eval, generate, logits, merge and train; a base model holding a NaN (a
 *   Q8_0 block scale, an F32 norm) named at load; a NaN gradient at step 3
 *   (stops naming step and tensor, keeps commit 2, writes no adapter); unwritable --out,
 *   --checkpoint-dir and --log-json (refused before training); a truncated model file (GGUF
 *   error with the offset); data as exported (ShareGPT, TRL, an extra column with and without
 *   --ignore-unknown-keys, a train/valid/test.jsonl directory). */
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "train/trainer.h"
#include "train/trainer_hooks.h"
#include "util/util.h"

static char tmp[256], model[512], data[512], errf[512], out[512];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static char *slurp(const char *path) {
    size_t l = 0;
    char *b = nl_read_file(path, &l);
    nl_clear_error();
    return b;
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Run `nightlora train --model M --data D --out O --steps 2 --batch-tokens 64 --rank 4
 * --thermal off <extra...>` (--rank 4 only when extra has no --rank);
 * returns the exit status; stderr in errf. */
static int train_cli(const char *m, const char *d, const char *o, const char *const *extra) {
    const char *v[48];
    int n = 0;
    v[n++] = NL_CLI;
    v[n++] = "train";
    v[n++] = "--model";
    v[n++] = m;
    v[n++] = "--data";
    v[n++] = d;
    v[n++] = "--out";
    v[n++] = o;
    v[n++] = "--steps";
    v[n++] = "2";
    v[n++] = "--batch-tokens";
    v[n++] = "64";
    int has_rank = 0;
    for (int i = 0; extra && extra[i]; i++) has_rank |= !strcmp(extra[i], "--rank");
    if (!has_rank) {
        v[n++] = "--rank";
        v[n++] = "4";
    }
    v[n++] = "--thermal";
    v[n++] = "off";
    for (int i = 0; extra && extra[i] && n < 46; i++) v[n++] = extra[i];
    v[n] = NULL;
    return nl_t_run(v, errf, NULL);
}

/* The "nightlora train: ..." line of the last run (or ""). */
static void last_error(char *buf, size_t cap) {
    char *b = slurp(errf);
    buf[0] = 0;
    const char *p = b ? strstr(b, "nightlora train: ") : NULL;
    if (p) {
        size_t l = strcspn(p, "\n");
        snprintf(buf, cap, "%.*s", (int)l, p);
    }
    free(b);
}

/* A case: exit status `want_rc`, and each needle in the error line (or in stderr when
 * want_rc == 0). Prints the message. */
static void expect(const char *what, int rc, int want_rc, const char *n1, const char *n2, const char *n3) {
    char msg[2048];
    last_error(msg, sizeof msg);
    char *all = slurp(errf);
    const char *hay = want_rc ? msg : (all ? all : "");
    int ok = rc == want_rc && (!n1 || strstr(hay, n1)) && (!n2 || strstr(hay, n2)) && (!n3 || strstr(hay, n3));
    CHECKF(ok, "%s: exit %d (expected %d): %s", what, rc, want_rc, want_rc ? msg : all);
    printf("%-34s exit %d  %s\n", what, rc, want_rc ? msg : "(ran)");
    free(all);
    if (want_rc) CHECKF(!exists(out), "%s: an adapter was written", what);
    unlink(out);
}

static void test_data_errors(void) {
    char p[512];
    path_of(p, sizeof p, "empty.jsonl");
    write_text(p, "");
    expect("empty data file", train_cli(model, p, out, NULL), 1, p, "no examples", NULL);
    path_of(p, sizeof p, "blank.jsonl");
    write_text(p, "\n  \n\n");
    expect("only blank lines", train_cli(model, p, out, NULL), 1, "no examples", NULL, NULL);

    /* an example over the context */
    path_of(p, sizeof p, "long.jsonl");
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"text\": \"");
    for (int i = 0; i < 200; i++) fprintf(f, "the night shift on the farm ");
    fprintf(f, "\"}\n{\"text\": \"a short one\"}\n");
    fclose(f);
    const char *refuse[] = {"--ctx", "64", "--on-long", "refuse", NULL};
    expect("example over --ctx, --on-long refuse", train_cli(model, p, out, refuse), 1,
           "long.jsonl:1:", "more than the context of 64", NULL);
    const char *trunc[] = {"--ctx", "64", "--on-long", "truncate", NULL};
    expect("example over --ctx, --on-long truncate", train_cli(model, p, out, trunc), 0, "(1 truncated to 64 tokens",
           NULL, NULL);
    /* a prompt that fills the context: nothing of the completion is left */
    path_of(p, sizeof p, "longprompt.jsonl");
    f = fopen(p, "w");
    fprintf(f, "{\"prompt\": \"");
    for (int i = 0; i < 200; i++) fprintf(f, "word ");
    fprintf(f, "\", \"completion\": \" tag\"}\n");
    fclose(f);
    expect("prompt fills the context", train_cli(model, p, out, trunc), 1,
           "no example has a target token within the context of 64", NULL, NULL);

    path_of(p, sizeof p, "emptycompl.jsonl");
    write_text(
        p, "{\"prompt\": \"Note: milk\", \"completion\": \" shopping\"}\n{\"prompt\": \"hi\", \"completion\": \"\"}\n");
    expect("empty completion", train_cli(model, p, out, NULL), 1, "emptycompl.jsonl:2:", "\"completion\" is empty",
           NULL);

    path_of(p, sizeof p, "types.jsonl");
    write_text(p, "{\"prompt\": 5, \"completion\": \"x\"}\n");
    expect("wrong JSON type", train_cli(model, p, out, NULL), 1,
           "types.jsonl:1:", "\"prompt\" must be a string, found number", NULL);
    path_of(p, sizeof p, "types2.jsonl");
    write_text(p, "{\"tokens\": [1, \"two\", 3]}\n");
    expect("wrong JSON type in tokens", train_cli(model, p, out, NULL), 1, "types2.jsonl:1:", NULL, NULL);
    path_of(p, sizeof p, "notjson.jsonl");
    write_text(p, "{\"text\": \"fine\"}\n{\"text\": \"unterminated}\n");
    expect("a line that is not JSON", train_cli(model, p, out, NULL), 1, "notjson.jsonl:2:", NULL, NULL);

    const char *tmpl[] = {"--template", "alpaca", NULL};
    expect("unknown --template", train_cli(model, data, out, tmpl), 1, "--template alpaca: unknown chat template",
           "chatml, llama3", NULL);
    char tp[1024];
    path_of(tp, sizeof tp, "bad.jinja");
    write_text(tp, "{% for m in messages %}\n{{ m.content | wordwrap }}{% endfor %}\n");
    const char *tmpl2[] = {"--template", tp, NULL};
    expect("--template FILE.jinja the interpreter cannot run", train_cli(model, data, out, tmpl2), 1,
           "bad.jinja:2: filter 'wordwrap' is not supported", NULL, NULL);

    path_of(p, sizeof p, "latin1.jsonl");
    write_text(p, "{\"prompt\": \"caf\xe9\", \"completion\": \" x\"}\n");
    expect("non-UTF-8 text", train_cli(model, p, out, NULL), 1, "latin1.jsonl:1:", "invalid UTF-8 byte 0xE9", NULL);
    path_of(p, sizeof p, "surrogate.jsonl");
    write_text(p, "{\"text\": \"ok \\ud800 x\"}\n");
    expect("lone surrogate escape", train_cli(model, p, out, NULL), 1, "surrogate.jsonl:1:", "surrogate", NULL);
    path_of(p, sizeof p, "missing.jsonl");
    expect("missing data file", train_cli(model, p, out, NULL), 1, "missing.jsonl", NULL, NULL);
}

/* Data as the common tools export it: ShareGPT and TRL lines train, their mistakes are
 * refused at file:line; an extra column is skipped and counted (refused with --strict-keys);
 * Alpaca lines in a JSON array file and --columns train; a train/valid/test.jsonl directory
 * trains on its train.jsonl. */
static void test_exported_data(void) {
    char p[512];
    path_of(p, sizeof p, "sharegpt.jsonl");
    write_text(p, "{\"conversations\": [{\"from\": \"human\", \"value\": \"Note: milk\"}, {\"from\": \"gpt\", "
                  "\"value\": \"shopping\"}]}\n"
                  "{\"prompt\": [{\"role\": \"user\", \"content\": \"Note: flight\"}], \"completion\": [{\"role\": "
                  "\"assistant\", \"content\": \"travel\"}]}\n");
    expect("ShareGPT and TRL lines", train_cli(model, p, out, NULL), 0, "sharegpt.jsonl: 2 examples", NULL, NULL);
    path_of(p, sizeof p, "sharegpt_role.jsonl");
    write_text(
        p, "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n"
           "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"bot\", \"value\": \"b\"}]}\n");
    expect("ShareGPT: unknown \"from\"", train_cli(model, p, out, NULL), 1,
           "sharegpt_role.jsonl:2:62: conversations[1]: unknown \"from\" \"bot\"", "expected human, gpt or system",
           NULL);
    path_of(p, sizeof p, "sharegpt_empty.jsonl");
    write_text(p, "{\"conversations\": []}\n");
    expect("ShareGPT: empty conversation", train_cli(model, p, out, NULL), 1,
           "sharegpt_empty.jsonl:1:19: \"conversations\" is empty", NULL, NULL);
    path_of(p, sizeof p, "sharegpt_missing.jsonl");
    write_text(p, "{\"conversations\": [{\"from\": \"gpt\"}]}\n");
    expect("ShareGPT: a turn without value", train_cli(model, p, out, NULL), 1,
           "sharegpt_missing.jsonl:1:20: conversations[0] needs \"value\"", NULL, NULL);
    path_of(p, sizeof p, "trl_mixed.jsonl");
    write_text(p, "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": \"b\"}\n");
    expect("TRL: a list prompt, a string completion", train_cli(model, p, out, NULL), 1,
           "trl_mixed.jsonl:1:62: \"completion\" is a string but \"prompt\" is a message list", NULL, NULL);

    path_of(p, sizeof p, "extra.jsonl");
    write_text(p,
               "{\"id\": 1, \"prompt\": \"Note: milk\\nTag:\", \"completion\": \" shopping\", \"source\": \"app\"}\n");
    expect("extra columns: skipped, counted", train_cli(model, p, out, NULL), 0, "extra.jsonl: 1 examples",
           "data: 2 keys no format reads skipped (the first \"id\" on line 1; --strict-keys refuses them)", NULL);
    const char *strict[] = {"--strict-keys", NULL};
    expect("the same, --strict-keys", train_cli(model, p, out, strict), 1, "extra.jsonl:1:2: unknown key \"id\"",
           "without --strict-keys the keys nightlora does not read are skipped", NULL);
    const char *ign[] = {"--ignore-unknown-keys", NULL};
    expect("the same, --ignore-unknown-keys", train_cli(model, p, out, ign), 0, "extra.jsonl: 1 examples", NULL, NULL);

    /* Alpaca lines in a JSON array file (as HF datasets' to_json(lines=False) writes), the
     * prompt built with the model's chat template; --columns maps other names */
    path_of(p, sizeof p, "alpaca.json");
    write_text(p, "[\n  {\"instruction\": \"Tag the note\", \"input\": \"milk\", \"output\": \"shopping\"},\n"
                  "  {\"instruction\": \"Tag: flight\", \"input\": \"\", \"output\": \"travel\"}\n]\n");
    expect("Alpaca, a JSON array", train_cli(model, p, out, NULL), 0, "alpaca.json: 2 examples",
           "data: read as a JSON array of examples; 2 Alpaca lines, the prompt built with the chat template", NULL);
    const char *alp[] = {"--alpaca-prompt", "alpaca", NULL};
    expect("Alpaca, --alpaca-prompt alpaca", train_cli(model, p, out, alp), 0,
           "2 Alpaca lines, the prompt built with the Alpaca template", NULL, NULL);
    path_of(p, sizeof p, "qa.jsonl");
    write_text(p, "{\"question\": \"Note: milk\\nTag:\", \"answer\": \" shopping\"}\n");
    const char *cols[] = {"--columns", "prompt=question,completion=answer", NULL};
    expect("--columns prompt=question,...", train_cli(model, p, out, cols), 0, "qa.jsonl: 1 examples", NULL, NULL);
    const char *badcols[] = {"--columns", "prompt:question", NULL};
    expect("--columns, a bad pair", train_cli(model, p, out, badcols), 1,
           "--columns prompt:question: expected KEY=COLUMN pairs", NULL, NULL);

    char dir[400], want[1600];
    path_of(dir, sizeof dir, "exported");
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(want, sizeof want,
             "--data %s: %s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and %s/train.jsonl cannot "
             "be read",
             dir, dir, dir);
    expect("--data DIR without train.jsonl", train_cli(model, dir, out, NULL), 1, want, NULL, NULL);
    snprintf(p, sizeof p, "%s/train.jsonl", dir);
    char *notes = slurp(data);
    write_text(p, notes ? notes : "");
    free(notes);
    snprintf(want, sizeof want, "on %s/train.jsonl: 8 examples", dir);
    expect("--data DIR", train_cli(model, dir, out, NULL), 0, want, NULL, NULL);
    const char *v[] = {NL_CLI, "train", "--model", model, "--data", dir, "--out", p, "--steps", "1", NULL};
    int rc = nl_t_run(v, errf, NULL);
    char *e = slurp(errf);
    snprintf(want, sizeof want, "--out %s and --data %s are the same file", p, p);
    CHECKF(rc == 2 && e && strstr(e, want), "--out DIR/train.jsonl: exit %d: %s", rc, e ? e : "");
    free(e);
    CHECK(exists(p));
    /* DIR/valid.jsonl is an input too (the validation set) */
    char val[512];
    snprintf(val, sizeof val, "%s/valid.jsonl", dir);
    write_text(val, "{\"prompt\": \"Note: milk\\nTag:\", \"completion\": \" shopping\"}\n");
    const char *v2[] = {NL_CLI, "train", "--model", model, "--data", dir, "--out", val, "--steps", "1", NULL};
    rc = nl_t_run(v2, errf, NULL);
    e = slurp(errf);
    snprintf(want, sizeof want, "--out %s and --val-data %s are the same file", val, val);
    CHECKF(rc == 2 && e && strstr(e, want), "--out DIR/valid.jsonl: exit %d: %s", rc, e ? e : "");
    free(e);
    CHECK(exists(val));
}

/* An adapter whose first lora_b has rank 3 while its lora_a has rank 4. */
static int write_rank_mismatch(const char *good, const char *bad) {
    nl_gguf *g = nl_gguf_open(good);
    if (!g) return -1;
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = nl_gguf_copy_kvs(w, g);
    int done = 0;
    for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        size_t len = strlen(t->name);
        if (!done && len > 7 && !strcmp(t->name + len - 7, ".lora_b")) {
            int64_t ne[2] = {t->ne[0] - 1, t->ne[1]}; /* {r-1, n_out}: the first r-1 columns */
            float *d = malloc((size_t)(ne[0] * ne[1]) * sizeof(float));
            for (int64_t o = 0; o < ne[1]; o++)
                for (int64_t k = 0; k < ne[0]; k++) d[o * ne[0] + k] = ((const float *)t->data)[o * t->ne[0] + k];
            rc = nl_gguf_add_tensor(w, t->name, NL_TYPE_F32, 2, ne, d, false);
            free(d);
            done = 1;
        } else {
            rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, false);
        }
    }
    if (!rc) rc = nl_gguf_write(w, bad);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    return rc;
}

/* A copy of `good` with one value set in the first lora_b (NaN, or a huge finite number). */
static int write_poisoned(const char *good, const char *bad, float value) {
    nl_gguf *g = nl_gguf_open(good);
    if (!g) return -1;
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = nl_gguf_copy_kvs(w, g);
    int done = 0;
    for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        size_t len = strlen(t->name);
        float *d = malloc(t->nbytes);
        memcpy(d, t->data, t->nbytes);
        if (!done && len > 7 && !strcmp(t->name + len - 7, ".lora_b")) {
            size_t n = t->nbytes / sizeof(float);
            for (size_t k = 0; k < n; k++) d[k] = value;
            done = 1;
        }
        rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, d, false);
        free(d);
    }
    if (!rc) rc = nl_gguf_write(w, bad);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    return rc;
}

static void test_adapter_errors(void) {
    char good[512], llama[512], llama_ad[512], small[512], small_ad[512], bad[512];
    path_of(good, sizeof good, "good_adapter.gguf");
    CHECK(train_cli(model, data, good, NULL) == 0);
    /* another architecture */
    path_of(llama, sizeof llama, "llama.gguf");
    path_of(llama_ad, sizeof llama_ad, "llama_adapter.gguf");
    CHECK(nl_mkmodel(NL_ARCH_LLAMA, "tiny", NL_TYPE_Q8_0, 3, llama) == 0);
    CHECK(train_cli(llama, data, llama_ad, NULL) == 0);
    const char *a1[] = {"--init-adapter", llama_ad, NULL};
    expect("adapter for another architecture", train_cli(model, data, out, a1), 1,
           "adapter is for architecture 'llama' but the model is 'qwen3'", NULL, NULL);
    /* same architecture, another size */
    path_of(small, sizeof small, "small.gguf");
    path_of(small_ad, sizeof small_ad, "small_adapter.gguf");
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "small", NL_TYPE_Q8_0, 3, small) == 0);
    const char *sm[] = {"--targets", "q", "--steps", "1", NULL};
    CHECK(train_cli(small, data, small_ad, sm) == 0);
    const char *a2[] = {"--init-adapter", small_ad, NULL};
    expect("adapter for another model size", train_cli(model, data, out, a2), 1, "small_adapter.gguf",
           "do not fit base", NULL);
    /* --rank against the adapter's */
    const char *r8[] = {"--init-adapter", good, "--rank", "8", NULL};
    expect("--init-adapter with another --rank", train_cli(model, data, out, r8), 1, "has rank 4, --rank 8 was asked",
           "drop --rank", NULL);
    const char *r4[] = {"--init-adapter", good, NULL}; /* --rank 4 (train_cli's) = the adapter's */
    expect("--init-adapter with the same --rank", train_cli(model, data, out, r4), 0, "training ", NULL, NULL);
    /* lora_a rank 4, lora_b rank 3 */
    path_of(bad, sizeof bad, "rank_mismatch.gguf");
    CHECK(write_rank_mismatch(good, bad) == 0);
    const char *a3[] = {"--init-adapter", bad, NULL};
    expect("lora_a / lora_b ranks disagree", train_cli(model, data, out, a3), 1, "rank_mismatch.gguf",
           "do not fit base", "expected lora_a {");
    /* a NaN in the adapter */
    path_of(bad, sizeof bad, "nan_adapter.gguf");
    CHECK(write_poisoned(good, bad, NAN) == 0);
    expect("--init-adapter holding a NaN", train_cli(model, data, out, a3), 1, "non-finite value: parameter blk.0.",
           ".lora_b[0] = nan", NULL);
    /* huge but finite values: the forward would overflow; refused at load naming the tensor */
    path_of(bad, sizeof bad, "huge_adapter.gguf");
    CHECK(write_poisoned(good, bad, 3e38f) == 0);
    expect("--init-adapter that overflows", train_cli(model, data, out, a3), 1, "huge_adapter.gguf: 'blk.0.",
           "overflows the forward", NULL);
}

/* `nightlora CMD` exited with want_rc and its "nightlora CMD: ..." line holds n1 and n2. */
static void expect_cmd(const char *what, int rc, const char *cmd, int want_rc, const char *n1, const char *n2) {
    char *b = slurp(errf), head[64];
    snprintf(head, sizeof head, "nightlora %s: ", cmd);
    const char *p = b ? strstr(b, head) : NULL;
    char msg[2048] = "";
    if (p) snprintf(msg, sizeof msg, "%.*s", (int)strcspn(p, "\n"), p);
    CHECKF(rc == want_rc && p && (!n1 || strstr(msg, n1)) && (!n2 || strstr(msg, n2)), "%s: exit %d (expected %d): %s",
           what, rc, want_rc, b ? b : "");
    printf("%-34s exit %d  %s\n", what, rc, msg);
    free(b);
}

/* A copy of the file `src` with `len` bytes at byte `off` of tensor `name`'s data replaced. */
static int patch_tensor(const char *src, const char *dst, const char *name, size_t off, const void *bytes, size_t len) {
    nl_gguf *g = nl_gguf_open(src);
    const nl_gguf_tensor *t = g ? nl_gguf_tensor_find(g, name) : NULL;
    size_t n = 0;
    char *b = t ? nl_read_file(src, &n) : NULL;
    uint64_t at = t ? g->data_offset + t->offset + off : 0;
    int rc = -1;
    if (b && at + len <= n) {
        memcpy(b + at, bytes, len);
        FILE *f = fopen(dst, "wb");
        rc = f && fwrite(b, 1, n, f) == n && fclose(f) == 0 ? 0 : -1;
    }
    free(b);
    nl_gguf_close(g);
    return rc;
}

/* NaN/Inf never reaches a computation: an adapter holding one (a value or alpha) is refused by
 * every command that loads one, as train refuses it (eval printed loss -nan, merge wrote a NaN
 * model, both exit 0); a base model holding one is refused at load naming the tensor and the
 * element (it was blamed on a LoRA gradient and --lr at step 1). */
static void test_nonfinite_inputs(void) {
    char good[512], nan_ad[512], inf_alpha[512], big_alpha[512], huge_ad[512], merged[512];
    path_of(good, sizeof good, "good_adapter.gguf"); /* test_adapter_errors' */
    path_of(nan_ad, sizeof nan_ad, "nan_adapter.gguf");
    path_of(huge_ad, sizeof huge_ad, "huge_adapter.gguf"); /* lora_b 3e38, test_adapter_errors' */
    path_of(inf_alpha, sizeof inf_alpha, "inf_alpha.gguf");
    path_of(big_alpha, sizeof big_alpha, "alpha1e38.gguf");
    path_of(merged, sizeof merged, "merged.gguf");
    for (int v = 0; v < 2; v++) {
        nl_gguf *g = nl_gguf_open(good);
        nl_gguf_writer *w = nl_gguf_writer_new();
        CHECK(g && w && nl_gguf_copy_kvs(w, g) == 0 &&
              nl_gguf_set_f32(w, "adapter.lora.alpha", v ? 1e38f : INFINITY) == 0);
        for (int64_t i = 0; g && i < g->n_tensors; i++)
            nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                               g->tensors[i].data, true);
        CHECK(nl_gguf_write(w, v ? big_alpha : inf_alpha) == 0);
        nl_gguf_writer_free(w);
        nl_gguf_close(g);
    }
    /* 0: a NaN value, 1: alpha inf, 2: a lora_b of 3e38 (finite, the forward would overflow),
     * 3: alpha 1e38 (finite, the scale overflows the forward) */
    for (int k = 0; k < 4; k++) {
        const char *ad = k == 0 ? nan_ad : k == 1 ? inf_alpha : k == 2 ? huge_ad : big_alpha;
        const char *n1 = k == 0   ? "nan_adapter.gguf: non-finite value: parameter blk.0."
                         : k == 1 ? "inf_alpha.gguf: adapter.lora.alpha = inf: expected a finite number"
                         : k == 2 ? "huge_adapter.gguf: 'blk.0."
                                  : "alpha1e38.gguf: 'blk.0.";
        const char *n2 = k == 0 ? ".lora_b[0] = nan" : k == 1 ? NULL : "overflows the forward";
        const char *ev[] = {NL_CLI, "eval",      "--model", model,       "--adapter", ad,  "--data",
                            data,   "--backend", "ref",     "--threads", "1",         NULL};
        expect_cmd(k == 0   ? "eval, adapter holding a NaN"
                   : k == 1 ? "eval, adapter alpha inf"
                   : k == 2 ? "eval, adapter lora_b 3e38"
                            : "eval, adapter alpha 1e38",
                   nl_t_run(ev, errf, NULL), "eval", 1, n1, n2);
        const char *gen[] = {NL_CLI, "generate", "--model", model,       "--adapter", ad,  "--prompt",
                             "hi",   "--n",      "2",       "--backend", "ref",       NULL};
        expect_cmd(k ? "generate, adapter that overflows" : "generate, adapter holding a NaN",
                   nl_t_run(gen, errf, NULL), "generate", 1, n1, n2);
        char lg[512];
        path_of(lg, sizeof lg, "logits.f32");
        const char *lo[] = {NL_CLI,  "logits", "--model", model,       "--adapter", ad,  "--tokens",
                            "1 2 3", "--out",  lg,        "--backend", "ref",       NULL};
        expect_cmd(k ? "logits, adapter that overflows" : "logits, adapter holding a NaN", nl_t_run(lo, errf, NULL),
                   "logits", 1, n1, n2);
        CHECK(!exists(lg));
        const char *mg[] = {NL_CLI, "merge", "--model", model, "--adapter", ad, "--out", merged, NULL};
        expect_cmd(k ? "merge, adapter that overflows" : "merge, adapter holding a NaN", nl_t_run(mg, errf, NULL),
                   "merge", 1, n1, n2);
        CHECK(!exists(merged));
        const char *a[] = {"--init-adapter", ad, NULL};
        expect(k ? "--init-adapter that overflows (again)" : "--init-adapter holding a NaN (again)",
               train_cli(model, data, out, a), 1, n1, n2, NULL);
    }
    /* base weights: a NaN scale in a Q8_0 projection (block 3), a NaN in an F32 norm */
    char nan_q[512], nan_norm[512];
    path_of(nan_q, sizeof nan_q, "nan_q8.gguf");
    path_of(nan_norm, sizeof nan_norm, "nan_norm.gguf");
    const uint8_t nan16[2] = {0x00, 0x7e};
    const float fnan = NAN;
    CHECK(patch_tensor(model, nan_q, "blk.0.attn_q.weight", 3 * 34, nan16, 2) == 0);
    CHECK(patch_tensor(model, nan_norm, "blk.1.ffn_norm.weight", 7 * 4, &fnan, 4) == 0);
    expect("base weight with a NaN block scale", train_cli(nan_q, data, out, NULL), 1,
           "nan_q8.gguf: tensor 'blk.0.attn_q.weight' holds non-finite values (element 96 = nan, in the q8_0 block at "
           "file offset ",
           NULL, NULL);
    const char *ev[] = {NL_CLI, "eval", "--model", nan_norm, "--data", data, "--backend", "ref", NULL};
    expect_cmd("eval, base norm holding a NaN", nl_t_run(ev, errf, NULL), "eval", 1,
               "nan_norm.gguf: tensor 'blk.1.ffn_norm.weight' holds non-finite values (element 7 = nan", NULL);
    /* finite weights whose forward overflows (a norm of 3e38): no command exits 0 with a NaN
     * result (eval printed loss -nan, logits wrote NaN, generate printed tokens, all exit 0) */
    char huge_norm[512], lg[512];
    path_of(huge_norm, sizeof huge_norm, "huge_norm.gguf");
    path_of(lg, sizeof lg, "huge_logits.f32");
    float big[16];
    for (int i = 0; i < 16; i++) big[i] = 3e38f;
    CHECK(patch_tensor(model, huge_norm, "blk.0.attn_norm.weight", 0, big, sizeof big) == 0);
    const char *ev2[] = {NL_CLI, "eval", "--model", huge_norm, "--data", data, "--backend", "ref", NULL};
    expect_cmd("eval, forward overflows", nl_t_run(ev2, errf, NULL), "eval", 1, "the loss is not finite", "no result");
    const char *lo2[] = {NL_CLI,  "logits", "--model",   huge_norm, "--tokens", "1 2 3",
                         "--out", lg,       "--backend", "ref",     NULL};
    expect_cmd("logits, forward overflows", nl_t_run(lo2, errf, NULL), "logits", 1,
               "huge_norm.gguf: the forward is not finite", "no result");
    CHECK(!exists(lg));
    const char *gen2[] = {NL_CLI, "generate", "--model",   huge_norm, "--prompt", "hi",
                          "--n",  "2",        "--backend", "ref",     NULL};
    expect_cmd("generate, forward overflows", nl_t_run(gen2, errf, NULL), "generate", 1, "the forward is not finite",
               NULL);
    /* a LoRA on the tied head (token_embd.weight.lora_a/b): eval, generate, logits refuse it as
     * train and merge do (eval dropped it silently) */
    char tied[512];
    path_of(tied, sizeof tied, "tied_head_adapter.gguf");
    nl_model *mm = nl_model_load(model);
    nl_adapter *ta = mm ? nl_adapter_new(mm, "q,output", 4, 8.0f, 1) : NULL;
    CHECK(mm && mm->tied_head && ta && ta->by_proj[mm->p_output] >= 0 && nl_adapter_save(ta, mm, tied) == 0);
    nl_adapter_free(ta);
    nl_model_free(mm);
    const char *ev3[] = {NL_CLI, "eval", "--model", model, "--adapter", tied, "--data", data, "--backend", "ref", NULL};
    expect_cmd("eval, tied-head adapter", nl_t_run(ev3, errf, NULL), "eval", 1,
               "tied_head_adapter.gguf adapts token_embd.weight", "ties to its output head");
    const char *lo3[] = {NL_CLI, "logits", "--model", model,       "--adapter", tied, "--tokens",
                         "1 2",  "--out",  lg,        "--backend", "ref",       NULL};
    expect_cmd("logits, tied-head adapter", nl_t_run(lo3, errf, NULL), "logits", 1, "adapts token_embd.weight", NULL);
}

/* The hook of test_nan_gradient: at step 3, after the backward, gradient element 0 of adapter
 * tensor 5's lora_b becomes NaN. */
static void poison_grads(void *user, int step, const nl_adapter *ad, float *grads) {
    (void)user;
    if (step == 3 && ad->n > 5) grads[ad->t[5].off_b] = NAN;
}

/* NaN in a gradient at step 3 (a test hook): stop naming the step and the tensor, keep
 * commit 2, write no adapter; --resume (without the poison) then finishes. */
static void test_nan_gradient(void) {
    char ck[512], c2[600], c3[600];
    path_of(ck, sizeof ck, "ck_nan");
    snprintf(c2, sizeof c2, "%s/commit-2.nlck", ck);
    snprintf(c3, sizeof c3, "%s/commit-3.nlck", ck);
    nl_train_opts o;
    nl_train_defaults(&o);
    o.model = model;
    o.data = data;
    o.out = out;
    o.steps = 4;
    o.batch_tokens = 48;
    o.rank = 4;
    o.thermal = "off";
    o.progress = NULL;
    o.checkpoint_dir = ck;
    nl_train_hooks hk = {.after_backward = poison_grads};
    nl_train_result r;
    int rc = nl_train_hooked(&o, &hk, &r);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nl_last_error());
    /* the tensor's name, from the same adapter layout */
    nl_model *m = nl_model_load(model);
    nl_adapter *ad = m ? nl_adapter_new(m, NULL, 4, 32.0f, 42) : NULL;
    char want[256] = "?";
    if (ad) {
        const char *nm = m->projs[ad->t[5].proj].name;
        snprintf(want, sizeof want, "gradient of %.*s.lora_b[0] = nan", (int)(strlen(nm) - 7), nm);
    }
    CHECKF(rc == -1 && strstr(msg, "step 3: non-finite values") && strstr(msg, want) &&
               strstr(msg, "the last commit (step 2) is kept"),
           "message: %s (expected '%s')", msg, want);
    printf("%-34s %s\n", "NaN gradient at step 3", msg);
    CHECK(exists(c2) && !exists(c3) && !exists(out));
    nl_adapter_free(ad);
    nl_model_free(m);
    o.resume = 1;
    CHECKF(nl_train(&o, &r) == 0 && r.steps_done == 4 && exists(out), "%s", nl_last_error());
    unlink(out);
}

static void test_path_errors(void) {
    const char *none[] = {NULL};
    expect("unwritable --out", train_cli(model, data, "/nonexistent-dir/adapter.gguf", none), 1,
           "--out /nonexistent-dir/adapter.gguf", "cannot write there", "nothing was trained");
    char file[512], ckd[600], log[600];
    path_of(file, sizeof file, "a_file");
    write_text(file, "x");
    snprintf(ckd, sizeof ckd, "%s/ck", file);
    const char *c1[] = {"--checkpoint-dir", ckd, NULL};
    expect("unwritable --checkpoint-dir", train_cli(model, data, out, c1), 1, ckd,
           "cannot create the checkpoint directory", "Not a directory");
    snprintf(log, sizeof log, "%s/log.jsonl", file);
    const char *l1[] = {"--log-json", log, NULL};
    expect("unwritable --log-json", train_cli(model, data, out, l1), 1, log, "cannot open for writing", NULL);
    /* a truncated model file */
    char trunc[512];
    path_of(trunc, sizeof trunc, "truncated.gguf");
    char *b = slurp(model);
    struct stat st;
    CHECK(b && stat(model, &st) == 0);
    FILE *f = fopen(trunc, "wb");
    fwrite(b, 1, (size_t)st.st_size * 2 / 3, f);
    fclose(f);
    free(b);
    expect("truncated model file", train_cli(trunc, data, out, NULL), 1, "truncated.gguf: offset ",
           "past the end of the file", NULL);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/nl_test_badinput_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmp, tmp);
    if (system(cmd)) return 1;
    path_of(model, sizeof model, "q3.gguf");
    path_of(data, sizeof data, "notes.jsonl");
    path_of(errf, sizeof errf, "stderr.txt");
    path_of(out, sizeof out, "out.gguf");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"Note: buy milk %d\\nTag:\", \"completion\": \" shopping\"}\n", i);
    fclose(f);
    double t0 = nl_now();
    test_data_errors();
    test_exported_data();
    test_adapter_errors();
    test_nonfinite_inputs();
    test_nan_gradient();
    test_path_errors();
    printf("%.1f s\n", nl_now() - t0);
    if (!nl_t_fail) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd)) return 1;
    } else {
        fprintf(stderr, "files kept in %s\n", tmp);
    }
    return nl_t_done();
}

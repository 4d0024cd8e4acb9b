/* Evaluation on a hand-made choices file (tests/data/eval/choices.jsonl): every number
 * nl_eval_dataset reports (accuracy, loss, target count) is recomputed here from scratch, from
 * nl_session_logits and a float64 log-softmax over the rows that predict each target, with
 * contexts and choices tokenized independently of the dataset loader. `nightlora eval` must
 * print the same numbers, and a malformed line must give "file:line:column" and a non-zero
 * exit. Tiny mkmodel models of every arch (llama adds BOS and uses the llama3 template; qwen3
 * and qwen35 have no BOS and use chatml). */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/quant.h"
#include "util/util.h"

static char tmpdir[256];
static const char *choices_path = NL_TEST_DATA "/eval/choices.jsonl";

/* The file's lines, restated (order matters). fmt: the line format; text: the prompt / text /
 * user message; choices NULL-terminated; answer -1 = no choices (completion is the target). */
typedef struct {
    nl_line_format fmt;
    const char *text;
    const char *choices[5];
    int answer;
    const char *completion;
} line_t;

static const line_t lines[] = {
    {NL_LINE_PROMPT, "The capital of France is", {" Paris", " London", " Rome"}, 0, NULL},
    {NL_LINE_PROMPT, "2 + 2 =", {" 4", " 5", " 22"}, 0, NULL},
    {NL_LINE_PROMPT, "Note: Book the dentist for Monday\nTag:", {" work", " health", " travel"}, 1, NULL},
    {NL_LINE_PROMPT, "The sky on a clear day is", {" blue", " green", " made of cheese"}, 0, NULL},
    {NL_LINE_PROMPT, "Hello", {NULL}, -1, " world"},
    {NL_LINE_PROMPT, "Water boils at", {" 100 degrees", " 50 degrees"}, 0, NULL},
    {NL_LINE_TEXT, "Once upon a time", {" there was", " here"}, 1, NULL},
    {NL_LINE_TOKENS, NULL, {NULL}, 2, NULL}, /* tokens [11, 22, 33, 44], choices [55] [66 77] [88] */
    {NL_LINE_MESSAGES, "Pick a colour.", {"red", "blue"}, 1, NULL},
    {NL_LINE_PROMPT, "Cats say", {" meow", " woof", " moo", " quack"}, 0, NULL},
    {NL_LINE_PROMPT, "The opposite of hot is", {" cold", " warm"}, 0, NULL},
};
enum { N_LINES = sizeof lines / sizeof lines[0] };
static const int32_t tok_ctx[] = {11, 22, 33, 44};
static const int32_t tok_choice[3][2] = {{55}, {66, 77}, {88}};
static const int tok_choice_len[3] = {1, 2, 1};

typedef struct { int32_t *v; int n; } ids_t;

static ids_t text_ids(const nl_tokenizer *tok, const char *s, int with_bos) {
    ids_t r = {0};
    int32_t *t = NULL;
    int n = 0;
    if (nl_tokenize(tok, s, strlen(s), false, false, &t, &n)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
    int b = with_bos && nl_tokenizer_add_bos(tok);
    r.v = malloc(sizeof(int32_t) * (size_t)(n + b + 1));
    if (b) r.v[0] = nl_token_bos(tok);
    memcpy(r.v + b, t, sizeof(int32_t) * (size_t)n);
    r.n = n + b;
    free(t);
    return r;
}

static ids_t concat(ids_t a, const int32_t *b, int nb) {
    ids_t r = {malloc(sizeof(int32_t) * (size_t)(a.n + nb + 1)), a.n + nb};
    if (a.n) memcpy(r.v, a.v, sizeof(int32_t) * (size_t)a.n);
    if (nb) memcpy(r.v + a.n, b, sizeof(int32_t) * (size_t)nb);
    return r;
}

/* Sum over j < nc of log p(cont[j] | seq[0 .. nctx + j)) for seq = ctx + cont: rows
 * nctx-1 .. nctx+nc-2 of the logits, float64 log-softmax. */
static double cont_loglik(nl_session *s, ids_t ctx, const int32_t *cont, int nc) {
    ids_t seq = concat(ctx, cont, nc);
    int V = s->m->hp.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)seq.n * V);
    if (nl_session_logits(s, seq.v, seq.n, lg)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
    double ll = 0;
    for (int j = 0; j < nc; j++) {
        const float *row = lg + (size_t)(ctx.n - 1 + j) * V;
        double mx = row[0], z = 0;
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < V; v++) z += exp((double)row[v] - mx);
        ll += (double)row[cont[j]] - mx - log(z);
    }
    free(lg);
    free(seq.v);
    return ll;
}

static int same_ids(const int32_t *a, const int32_t *b, int n) { return n >= 0 && memcmp(a, b, sizeof(int32_t) * (size_t)n) == 0; }

typedef struct { double loss_sum; int64_t n_targets; int n_items, n_correct, n_examples; } direct_t;

/* `nightlora eval` on `data` (with `extra` flags): its exit status and output (stdout + stderr). */
static int run_cli_with(const char *model, const char *data, const char *extra, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' eval --backend ref --threads 1 %s --model '%s' --data '%s' 2>&1", NL_CLI, extra, model, data);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_cli(const char *model, const char *data, char *out, size_t cap) { return run_cli_with(model, data, "", out, cap); }

static void test_arch(nl_arch arch) {
    const char *name = nl_arch_name(arch);
    char model[512];
    snprintf(model, sizeof model, "%s/%s.gguf", tmpdir, name);
    if (nl_mkmodel(arch, "tiny", NL_TYPE_F32, 3, model)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
    nl_session s;
    /* as `nightlora eval --backend ref --threads 1` runs: the weights in their stored type */
    nl_proj_config cfg = {.backend = "ref", .n_threads = 1, .precision = "keep"};
    if (nl_session_open(&s, model, NULL, &cfg)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
    const nl_tokenizer *tok = s.tok;
    nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
    nl_dataset ds;
    int rc = nl_dataset_load(choices_path, tok, &dopt, &ds);
    CHECKF(rc == 0, "%s", nl_last_error());
    if (rc) { nl_session_close(&s); return; }
    CHECK(ds.n == N_LINES);
    nl_chat_tmpl tmpl;
    CHECK(nl_chat_template_pick(NULL, nl_tokenizer_chat_template(tok), &tmpl) == 0);

    direct_t d = {0};
    int best[N_LINES];
    for (int i = 0; i < N_LINES && i < ds.n; i++) {
        const line_t *L = &lines[i];
        const nl_example *ex = &ds.ex[i];
        ids_t ctx = {0};
        switch (L->fmt) {
            case NL_LINE_PROMPT:
            case NL_LINE_TEXT: ctx = text_ids(tok, L->text, 1); break;
            case NL_LINE_TOKENS: ctx = concat((ids_t){NULL, 0}, tok_ctx, 4); break;
            case NL_LINE_MESSAGES: {
                nl_chat_msg msg = {"user", L->text, strlen(L->text), NULL};
                if (nl_chat_tokenize(tok, tmpl, &msg, 1, true, &ctx.v, NULL, &ctx.n)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
                break;
            }
        }
        CHECKF(ex->format == L->fmt, "%s line %d: format %d", name, i + 1, (int)ex->format);
        d.n_examples++;
        if (L->answer < 0) {
            /* prompt + completion: targets are the completion's tokens and EOS */
            ids_t c = text_ids(tok, L->completion, 0);
            int32_t eos = nl_token_eos(tok) >= 0 ? nl_token_eos(tok) : nl_token_eot(tok);
            c.v[c.n++] = eos;
            ids_t full = concat(ctx, c.v, c.n);
            CHECKF(ex->n_tokens == full.n && same_ids(ex->ids, full.v, full.n), "%s line %d: sequence differs", name, i + 1);
            d.loss_sum -= cont_loglik(&s, ctx, c.v, c.n);
            d.n_targets += c.n;
            best[i] = -1;
            free(c.v);
            free(full.v);
            free(ctx.v);
            continue;
        }
        CHECKF(ex->n_prompt == ctx.n && same_ids(ex->ids, ctx.v, ctx.n), "%s line %d: context differs (%d vs %d tokens)", name, i + 1, ex->n_prompt, ctx.n);
        int nch = 0;
        double ll_best = 0;
        best[i] = -1;
        for (int k = 0; L->fmt == NL_LINE_TOKENS ? k < 3 : L->choices[k] != NULL; k++, nch++) {
            ids_t c;
            if (L->fmt == NL_LINE_TOKENS) c = concat((ids_t){NULL, 0}, tok_choice[k], tok_choice_len[k]);
            else c = text_ids(tok, L->choices[k], 0);
            CHECKF(k < ex->n_choices && ex->choice_len[k] == c.n && same_ids(ex->choice_ids[k], c.v, c.n),
                   "%s line %d: choice %d differs", name, i + 1, k);
            double ll = cont_loglik(&s, ctx, c.v, c.n);
            if (best[i] < 0 || ll > ll_best) { best[i] = k; ll_best = ll; }
            if (k == L->answer) {
                /* the example's own loss: the correct choice after the context */
                d.loss_sum -= ll;
                d.n_targets += c.n;
                CHECKF(ex->n_tokens == ctx.n + c.n && same_ids(ex->ids + ctx.n, c.v, c.n), "%s line %d: sequence differs", name, i + 1);
            }
            free(c.v);
        }
        CHECK(ex->n_choices == nch && ex->answer == L->answer);
        d.n_items++;
        d.n_correct += best[i] == L->answer;
        free(ctx.v);
    }

    nl_eval_result r;
    CHECKF(nl_eval_dataset(&s.rt, &ds, 4096, &r) == 0, "%s", nl_last_error());
    CHECK(r.n_examples == d.n_examples && r.n_examples == N_LINES);
    CHECK(r.n_items == d.n_items && r.n_items == N_LINES - 1);
    CHECKF(r.n_correct == d.n_correct, "%s: eval %d correct, direct %d", name, r.n_correct, d.n_correct);
    CHECKF(r.n_targets == d.n_targets && r.n_targets == ds.n_targets, "%s: targets %lld vs %lld", name,
           (long long)r.n_targets, (long long)d.n_targets);
    CHECK_NEAR(r.loss_sum, d.loss_sum, 1e-5 * d.n_targets); /* measured: < 1e-6 in all */
    /* a random model's loss is near ln(n_vocab); a wrong row or target would not be */
    CHECKF(fabs(nl_eval_loss(&r) - log(s.m->hp.n_vocab)) < 1.0, "%s: loss %.4f", name, nl_eval_loss(&r));

    /* Per item, not only in total: with every answer set to the direct argmax, eval scores
     * all correct; set to another choice, none. */
    nl_eval_result r2;
    for (int i = 0; i < ds.n; i++) if (best[i] >= 0) ds.ex[i].answer = best[i];
    CHECK(nl_eval_dataset(&s.rt, &ds, 4096, &r2) == 0 && r2.n_correct == r2.n_items);
    for (int i = 0; i < ds.n; i++) if (best[i] >= 0) ds.ex[i].answer = (best[i] + 1) % ds.ex[i].n_choices;
    CHECK(nl_eval_dataset(&s.rt, &ds, 4096, &r2) == 0 && r2.n_correct == 0);

    /* the CLI prints the same numbers (default: ref backend, 1 thread, like this session) */
    char out[4096];
    int st = run_cli(model, choices_path, out, sizeof out);
    CHECKF(st == 0, "%s: nightlora eval exit %d: %s", name, st, out);
    const char *p = strstr(out, choices_path);
    int n_ex = -1, n_corr = -1, n_it = -1;
    long long n_tg = -1;
    double loss = -1, ppl = -1, acc = -1;
    int got = p ? sscanf(p + strlen(choices_path), ": %d examples, %lld target tokens, loss %lf, ppl %lf, accuracy %lf%% (%d/%d)",
                         &n_ex, &n_tg, &loss, &ppl, &acc, &n_corr, &n_it) : 0;
    CHECKF(got == 7, "%s: cannot parse: %s", name, out);
    double dl = d.loss_sum / (double)d.n_targets;
    CHECK(n_ex == d.n_examples && n_tg == d.n_targets && n_corr == d.n_correct && n_it == d.n_items);
    CHECK_NEAR(loss, dl, 6e-5);
    CHECK_NEAR(ppl, exp(dl), 6e-4 + 1e-5 * exp(dl));
    CHECK_NEAR(acc, 100.0 * d.n_correct / d.n_items, 0.051);
    printf("%-6s %d examples, %lld targets, loss %.4f, accuracy %d/%d (direct and eval agree)\n", name,
           d.n_examples, (long long)d.n_targets, dl, d.n_correct, d.n_items);

    nl_dataset_free(&ds);
    nl_session_close(&s);
}

/* A malformed line: "file:line:column: message" on stderr and a non-zero exit. */
static void test_cli_errors(const char *model) {
    static const struct { const char *text, *where, *what; } bad[] = {
        /* line 3 (after a blank line): "choices" needs >= 2 entries; its value is at column 28 */
        {"{\"prompt\": \"a\", \"choices\": [\" x\", \" y\"], \"answer\": 0}\n\n"
         "{\"prompt\": \"b\", \"choices\": [\" x\"], \"answer\": 0}\n", ":3:28: ", "choices"},
        /* a typo'd key is an error at the key (column 17) */
        {"{\"prompt\": \"a\", \"completon\": \" x\"}\n", ":1:17: ", "completon"},
        /* JSON syntax: trailing comma, at the '}' (column 36) */
        {"{\"prompt\": \"a\", \"choices\": [\" x\", \" y\"], \"answer\": 1}\n"
         "{\"prompt\": \"b\", \"completion\": \" x\",}\n", ":2:36: ", "comma"},
        /* an answer that is not one of the choices: at the answer's value (column 52) */
        {"{\"prompt\": \"a\", \"choices\": [\" x\", \" y\"], \"answer\": 2}\n", ":1:52: ", "answer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[512], out[4096], want[600];
        snprintf(path, sizeof path, "%s/bad%zu.jsonl", tmpdir, i);
        FILE *f = fopen(path, "w");
        CHECK(f && fputs(bad[i].text, f) >= 0 && fclose(f) == 0);
        int st = run_cli(model, path, out, sizeof out);
        snprintf(want, sizeof want, "%s%s", path, bad[i].where);
        CHECKF(st != 0 && st != -1, "bad%zu: exit %d", i, st);
        CHECKF(strstr(out, want) != NULL && strstr(out, bad[i].what) != NULL, "bad%zu: expected '%s...%s' in: %s", i, want,
               bad[i].what, out);
    }
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* Examples cut to the context: those with targets left are scored on them (and counted as
 * truncated), those with none left are reported as dropped, by line; when every example is
 * dropped there is no loss to report and eval fails (it printed loss 0, ppl 1, exit 0). */
static void test_context_cut(const char *model) {
    static const char mixed[] =
        "{\"tokens\": [1, 2, 3, 4, 5, 6], \"loss_mask\": [0, 0, 0, 0, 1, 1]}\n" /* targets past 4: dropped */
        "{\"tokens\": [1, 2, 3]}\n"                                            /* whole: 2 targets */
        "{\"tokens\": [1, 2, 3, 4, 5, 6]}\n"                                   /* cut to 4: 3 of its 5 */
        "{\"tokens\": [7, 8, 9, 10, 11], \"loss_mask\": [0, 0, 0, 0, 1]}\n";  /* dropped */
    static const char kept[] = "{\"tokens\": [1, 2, 3]}\n{\"tokens\": [1, 2, 3, 4]}\n";
    static const char none[] =
        "{\"tokens\": [1, 2, 3, 4, 5, 6], \"loss_mask\": [0, 0, 0, 0, 1, 1]}\n"
        "{\"tokens\": [7, 8, 9, 10, 11], \"loss_mask\": [0, 0, 0, 0, 1]}\n";
    nl_session s;
    if (nl_session_open(&s, model, NULL, NULL)) { fprintf(stderr, "%s\n", nl_last_error()); exit(1); }
    nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
    nl_dataset a, b, c;
    CHECK(nl_dataset_load_buffer(mixed, strlen(mixed), "mixed", s.tok, &dopt, &a) == 0);
    CHECK(nl_dataset_load_buffer(kept, strlen(kept), "kept", s.tok, &dopt, &b) == 0);
    CHECK(nl_dataset_load_buffer(none, strlen(none), "none", s.tok, &dopt, &c) == 0);
    nl_eval_result ra, rb, rc;
    CHECK(nl_eval_dataset(&s.rt, &a, 4, &ra) == 0);
    CHECK(nl_eval_dataset(&s.rt, &b, 4, &rb) == 0);
    CHECK(ra.n_examples == 4 && ra.n_targets == 5 && ra.n_truncated == 1 && ra.n_dropped == 2);
    CHECK(ra.dropped_line[0] == 1 && ra.dropped_line[1] == 4);
    /* the loss is that of what is left: the same as the file of the kept parts */
    CHECK(rb.n_targets == 5 && rb.n_truncated == 0 && rb.n_dropped == 0);
    CHECKF(ra.loss_sum == rb.loss_sum, "%.17g vs %.17g", ra.loss_sum, rb.loss_sum);
    char cut[256];
    nl_eval_format_cut(&ra, cut, sizeof cut);
    CHECKF(!strcmp(cut, ", 1 truncated to 4 tokens, 2 dropped with no target within the context (lines 1, 4)"), "%s", cut);
    nl_eval_format_cut(&rb, cut, sizeof cut);
    CHECK(cut[0] == 0);
    CHECK(nl_eval_dataset(&s.rt, &c, 4, &rc) != 0);
    CHECKF(strstr(nl_last_error(), "none: no example has a target token within the context of 4: all 2 dropped (lines 1, 2)") != NULL,
           "%s", nl_last_error());
    /* more dropped lines than are listed: the list ends with "..." */
    nl_eval_result rd = {.ctx = 8, .n_dropped = 10, .dropped_line = {1, 2, 3, 4, 5, 6, 7, 8}};
    nl_eval_format_cut(&rd, cut, sizeof cut);
    CHECKF(!strcmp(cut, ", 10 dropped with no target within the context (lines 1, 2, 3, 4, 5, 6, 7, 8, ...)"), "%s", cut);
    nl_dataset_free(&a);
    nl_dataset_free(&b);
    nl_dataset_free(&c);
    nl_session_close(&s);

    /* through the CLI: the report line, and the refusal */
    char path[512], out[4096];
    snprintf(path, sizeof path, "%s/cut.jsonl", tmpdir);
    write_file(path, mixed);
    int st = run_cli_with(model, path, "--ctx 4", out, sizeof out);
    CHECKF(st == 0 && strstr(out, ": 4 examples, 5 target tokens, loss ") &&
           strstr(out, ", 1 truncated to 4 tokens, 2 dropped with no target within the context (lines 1, 4)\n"),
           "exit %d: %s", st, out);
    snprintf(path, sizeof path, "%s/none.jsonl", tmpdir);
    write_file(path, none);
    st = run_cli_with(model, path, "--ctx 4", out, sizeof out);
    CHECKF(st == 1 && strstr(out, "none.jsonl: no example has a target token within the context of 4") && !strstr(out, "loss"),
           "exit %d: %s", st, out);
}

/* Data as exported: `eval --data DIR` reads DIR/test.jsonl and its result line names that
 * file; a directory without one is refused naming both; an extra "id" column is refused
 * (saying --ignore-unknown-keys exists) and skipped with the flag, the same score as without. */
static void test_data_dir(const char *model) {
    char dir[300], path[400], out[4096], want[1600];
    snprintf(dir, sizeof dir, "%s/exported", tmpdir);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    write_file(path, "{\"tokens\": [1, 2, 3]}\n");
    int st = run_cli(model, dir, out, sizeof out);
    snprintf(want, sizeof want, "nightlora eval: --data %s: %s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and"
             " %s/test.jsonl cannot be read: No such file or directory", dir, dir, dir);
    CHECKF(st == 1 && strstr(out, want), "exit %d: %s", st, out);
    snprintf(path, sizeof path, "%s/test.jsonl", dir);
    write_file(path, "{\"tokens\": [1, 2, 3], \"id\": 1}\n{\"tokens\": [4, 5], \"id\": 2, \"source\": \"x\"}\n");
    st = run_cli(model, dir, out, sizeof out);
    snprintf(want, sizeof want, "%s:1:23: unknown key \"id\"", path);
    CHECKF(st == 1 && strstr(out, want) && strstr(out, "--ignore-unknown-keys skips"), "exit %d: %s", st, out);
    st = run_cli_with(model, dir, "--ignore-unknown-keys", out, sizeof out);
    snprintf(want, sizeof want, "%s: 2 examples, 3 target tokens, loss ", path);
    CHECKF(st == 0 && strstr(out, want), "exit %d: %s", st, out);
    char with[4096];
    snprintf(with, sizeof with, "%s", out);
    write_file(path, "{\"tokens\": [1, 2, 3]}\n{\"tokens\": [4, 5]}\n");
    st = run_cli(model, dir, out, sizeof out);
    CHECKF(st == 0 && !strcmp(out, with), "exit %d: %s vs %s", st, out, with);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nl_test_eval_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd)) return 1;
    test_arch(NL_ARCH_QWEN3);
    test_arch(NL_ARCH_LLAMA);
    test_arch(NL_ARCH_QWEN35);
    char model[512];
    snprintf(model, sizeof model, "%s/qwen3.gguf", tmpdir);
    test_cli_errors(model);
    test_context_cut(model);
    test_data_dir(model);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    return nl_t_done();
}

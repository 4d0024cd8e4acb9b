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
#include "nn/lora.h"
#include "util/json.h"
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

typedef struct {
    int32_t *v;
    int n;
} ids_t;

static ids_t text_ids(const nl_tokenizer *tok, const char *s, int with_bos) {
    ids_t r = {0};
    int32_t *t = NULL;
    int n = 0;
    if (nl_tokenize(tok, s, strlen(s), false, false, &t, &n)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
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
    if (nl_session_logits(s, seq.v, seq.n, lg)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
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

static int same_ids(const int32_t *a, const int32_t *b, int n) {
    return n >= 0 && memcmp(a, b, sizeof(int32_t) * (size_t)n) == 0;
}

typedef struct {
    double loss_sum;
    int64_t n_targets;
    int n_items, n_correct, n_examples;
} direct_t;

/* `nightlora eval` on `data` (with `extra` flags): its exit status and output (stdout + stderr). */
static int run_cli_with(const char *model, const char *data, const char *extra, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' eval --backend ref --threads 1 %s --model '%s' --data '%s' 2>&1", NL_CLI, extra,
             model, data);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_cli(const char *model, const char *data, char *out, size_t cap) {
    return run_cli_with(model, data, "", out, cap);
}

static void test_arch(nl_arch arch) {
    const char *name = nl_arch_name(arch);
    char model[512];
    snprintf(model, sizeof model, "%s/%s.gguf", tmpdir, name);
    if (nl_mkmodel(arch, "tiny", NL_TYPE_F32, 3, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    nl_session s;
    /* as `nightlora eval --backend ref --threads 1` runs: the weights in their stored type */
    nl_proj_config cfg = {.backend = "ref", .n_threads = 1, .precision = "keep"};
    if (nl_session_open(&s, model, NULL, &cfg)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    const nl_tokenizer *tok = s.tok;
    nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
    nl_dataset ds;
    int rc = nl_dataset_load(choices_path, tok, &dopt, &ds);
    CHECKF(rc == 0, "%s", nl_last_error());
    if (rc) {
        nl_session_close(&s);
        return;
    }
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
            if (nl_chat_tokenize(tok, tmpl, &msg, 1, true, &ctx.v, NULL, &ctx.n)) {
                fprintf(stderr, "%s\n", nl_last_error());
                exit(1);
            }
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
            CHECKF(ex->n_tokens == full.n && same_ids(ex->ids, full.v, full.n), "%s line %d: sequence differs", name,
                   i + 1);
            d.loss_sum -= cont_loglik(&s, ctx, c.v, c.n);
            d.n_targets += c.n;
            best[i] = -1;
            free(c.v);
            free(full.v);
            free(ctx.v);
            continue;
        }
        CHECKF(ex->n_prompt == ctx.n && same_ids(ex->ids, ctx.v, ctx.n),
               "%s line %d: context differs (%d vs %d tokens)", name, i + 1, ex->n_prompt, ctx.n);
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
            if (best[i] < 0 || ll > ll_best) {
                best[i] = k;
                ll_best = ll;
            }
            if (k == L->answer) {
                /* the example's own loss: the correct choice after the context */
                d.loss_sum -= ll;
                d.n_targets += c.n;
                CHECKF(ex->n_tokens == ctx.n + c.n && same_ids(ex->ids + ctx.n, c.v, c.n),
                       "%s line %d: sequence differs", name, i + 1);
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
    for (int i = 0; i < ds.n; i++)
        if (best[i] >= 0) ds.ex[i].answer = best[i];
    CHECK(nl_eval_dataset(&s.rt, &ds, 4096, &r2) == 0 && r2.n_correct == r2.n_items);
    for (int i = 0; i < ds.n; i++)
        if (best[i] >= 0) ds.ex[i].answer = (best[i] + 1) % ds.ex[i].n_choices;
    CHECK(nl_eval_dataset(&s.rt, &ds, 4096, &r2) == 0 && r2.n_correct == 0);

    /* the CLI prints the same numbers (default: ref backend, 1 thread, like this session) */
    char out[4096];
    int st = run_cli(model, choices_path, out, sizeof out);
    CHECKF(st == 0, "%s: nightlora eval exit %d: %s", name, st, out);
    const char *p = strstr(out, choices_path);
    int n_ex = -1, n_corr = -1, n_it = -1;
    long long n_tg = -1;
    double loss = -1, ppl = -1, acc = -1;
    int got = p ? sscanf(p + strlen(choices_path),
                         ": %d examples, %lld target tokens, loss %lf, ppl %lf, accuracy %lf%% (%d/%d)", &n_ex, &n_tg,
                         &loss, &ppl, &acc, &n_corr, &n_it)
                : 0;
    CHECKF(got == 7, "%s: cannot parse: %s", name, out);
    double dl = d.loss_sum / (double)d.n_targets;
    CHECK(n_ex == d.n_examples && n_tg == d.n_targets && n_corr == d.n_correct && n_it == d.n_items);
    CHECK_NEAR(loss, dl, 6e-5);
    CHECK_NEAR(ppl, exp(dl), 6e-4 + 1e-5 * exp(dl));
    CHECK_NEAR(acc, 100.0 * d.n_correct / d.n_items, 0.051);
    printf("%-6s %d examples, %lld targets, loss %.4f, accuracy %d/%d (direct and eval agree)\n", name, d.n_examples,
           (long long)d.n_targets, dl, d.n_correct, d.n_items);

    nl_dataset_free(&ds);
    nl_session_close(&s);
}

/* A malformed line: "file:line:column: message" on stderr and a non-zero exit. */
static void test_cli_errors(const char *model) {
    static const struct {
        const char *text, *where, *what;
    } bad[] = {
        /* line 3 (after a blank line): "choices" needs >= 2 entries; its value is at column 28 */
        {"{\"prompt\": \"a\", \"choices\": [\" x\", \" y\"], \"answer\": 0}\n\n"
         "{\"prompt\": \"b\", \"choices\": [\" x\"], \"answer\": 0}\n",
         ":3:28: ", "choices"},
        /* a typo'd key is an error at the key (column 17) */
        {"{\"prompt\": \"a\", \"completon\": \" x\"}\n", ":1:17: ", "completon"},
        /* JSON syntax: trailing comma, at the '}' (column 36) */
        {"{\"prompt\": \"a\", \"choices\": [\" x\", \" y\"], \"answer\": 1}\n"
         "{\"prompt\": \"b\", \"completion\": \" x\",}\n",
         ":2:36: ", "comma"},
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
        CHECKF(strstr(out, want) != NULL && strstr(out, bad[i].what) != NULL, "bad%zu: expected '%s...%s' in: %s", i,
               want, bad[i].what, out);
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
        "{\"tokens\": [1, 2, 3]}\n"                                             /* whole: 2 targets */
        "{\"tokens\": [1, 2, 3, 4, 5, 6]}\n"                                    /* cut to 4: 3 of its 5 */
        "{\"tokens\": [7, 8, 9, 10, 11], \"loss_mask\": [0, 0, 0, 0, 1]}\n";    /* dropped */
    static const char kept[] = "{\"tokens\": [1, 2, 3]}\n{\"tokens\": [1, 2, 3, 4]}\n";
    static const char none[] = "{\"tokens\": [1, 2, 3, 4, 5, 6], \"loss_mask\": [0, 0, 0, 0, 1, 1]}\n"
                               "{\"tokens\": [7, 8, 9, 10, 11], \"loss_mask\": [0, 0, 0, 0, 1]}\n";
    nl_session s;
    if (nl_session_open(&s, model, NULL, NULL)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
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
    CHECKF(!strcmp(cut, ", 1 truncated to 4 tokens, 2 dropped with no target within the context (lines 1, 4)"), "%s",
           cut);
    nl_eval_format_cut(&rb, cut, sizeof cut);
    CHECK(cut[0] == 0);
    CHECK(nl_eval_dataset(&s.rt, &c, 4, &rc) != 0);
    CHECKF(strstr(nl_last_error(),
                  "none: no example has a target token within the context of 4: all 2 dropped (lines 1, 2)") != NULL,
           "%s", nl_last_error());
    /* more dropped lines than are listed: the list ends with "..." */
    nl_eval_result rd = {.ctx = 8, .n_dropped = 10, .dropped_line = {1, 2, 3, 4, 5, 6, 7, 8}};
    nl_eval_format_cut(&rd, cut, sizeof cut);
    CHECKF(!strcmp(cut, ", 10 dropped with no target within the context (lines 1, 2, 3, 4, 5, 6, 7, 8, ...)"), "%s",
           cut);
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
    CHECKF(st == 1 && strstr(out, "none.jsonl: no example has a target token within the context of 4") &&
               !strstr(out, "loss"),
           "exit %d: %s", st, out);
}

/* Data as exported: `eval --data DIR` reads DIR/test.jsonl and its result line names that
 * file; a directory without one is refused naming both; an extra "id" column is skipped
 * (the same score as without), refused with --strict-keys. */
static void test_data_dir(const char *model) {
    char dir[300], path[400], out[4096], want[1600];
    snprintf(dir, sizeof dir, "%s/exported", tmpdir);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    write_file(path, "{\"tokens\": [1, 2, 3]}\n");
    int st = run_cli(model, dir, out, sizeof out);
    snprintf(want, sizeof want,
             "nightlora eval: --data %s: %s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and"
             " %s/test.jsonl cannot be read: No such file or directory",
             dir, dir, dir);
    CHECKF(st == 1 && strstr(out, want), "exit %d: %s", st, out);
    snprintf(path, sizeof path, "%s/test.jsonl", dir);
    write_file(path, "{\"tokens\": [1, 2, 3], \"id\": 1}\n{\"tokens\": [4, 5], \"id\": 2, \"source\": \"x\"}\n");
    st = run_cli(model, dir, out, sizeof out);
    snprintf(want, sizeof want, "%s: 2 examples, 3 target tokens, loss ", path);
    CHECKF(st == 0 && strstr(out, want), "exit %d: %s", st, out);
    st = run_cli_with(model, dir, "--strict-keys", out, sizeof out);
    snprintf(want, sizeof want, "%s:1:23: unknown key \"id\"", path);
    CHECKF(st == 1 && strstr(out, want) &&
               strstr(out, "without --strict-keys the keys nightlora does not read are skipped"),
           "exit %d: %s", st, out);
    st = run_cli_with(model, dir, "--ignore-unknown-keys", out, sizeof out);
    snprintf(want, sizeof want, "%s: 2 examples, 3 target tokens, loss ", path);
    CHECKF(st == 0 && strstr(out, want), "exit %d: %s", st, out);
    char with[4096];
    snprintf(with, sizeof with, "%s", out);
    write_file(path, "{\"tokens\": [1, 2, 3]}\n{\"tokens\": [4, 5]}\n");
    st = run_cli(model, dir, out, sizeof out);
    CHECKF(st == 0 && !strcmp(out, with), "exit %d: %s vs %s", st, out, with);
}

/* ---- batches ---- */

typedef struct {
    int n;
    double loss[512];
    int64_t count[512];
    double ll[512][8];
    int nch[512], pred[512], line[512];
} per_ex;

static void on_ex(void *user, const nl_eval_example *e) {
    per_ex *p = user;
    if (p->n >= 512) return;
    p->loss[p->n] = e->loss_sum;
    p->count[p->n] = e->n_targets;
    p->nch[p->n] = e->n_choices;
    p->pred[p->n] = e->predicted;
    p->line[p->n] = e->line;
    for (int k = 0; k < e->n_choices && k < 8; k++) p->ll[p->n][k] = e->ll[k];
    p->n++;
}

/* A choice's log-likelihood the way a decoder gets it: the prompt once into a decoding state (KV
 * cache, GDN state), the choice continuing from it. */
static double kv_choice_ll(nl_runtime *rt, const nl_example *ex, int k) {
    const nl_model *m = rt->m;
    const int E = m->hp.n_embd, np = ex->n_prompt, c = ex->choice_len[k];
    nl_seq_state st;
    if (nl_seq_state_init(&st, m, np + c)) return NAN;
    float *h = malloc(sizeof(float) * (size_t)(np + c) * E), *rows = malloc(sizeof(float) * (size_t)c * E);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)c);
    double s = NAN;
    int n = 0;
    if (np > 0 && nl_forward(rt, &st, ex->ids, np, h) == 0) {
        memcpy(rows, h + (size_t)(np - 1) * E, sizeof(float) * E);
        tg[n++] = ex->choice_ids[k][0];
    }
    if (nl_forward(rt, &st, ex->choice_ids[k], c, h) == 0) {
        for (int i = 1; i < c; i++) {
            memcpy(rows + (size_t)n * E, h + (size_t)(i - 1) * E, sizeof(float) * E);
            tg[n++] = ex->choice_ids[k][i];
        }
        if (nl_head_loss(rt, rows, tg, n, &s, NULL)) s = NAN;
    }
    nl_seq_state_free(&st, m);
    free(h);
    free(rows);
    free(tg);
    return -s;
}

/* Packed batches give the same bits as every sequence alone (batch_tokens 1), for any batch
 * size, on the host backend (2 threads, its default compute) and each architecture; a choice
 * scored as prompt + choice in one sequence equals the decoder's way (prompt into the KV cache,
 * the choice after it) to rounding; the per-example report is in file order. */
static void test_batches(nl_arch arch) {
    const char *name = nl_arch_name(arch);
    char model[512];
    snprintf(model, sizeof model, "%s/%s-q8.gguf", tmpdir, name);
    if (nl_mkmodel(arch, "tiny", NL_TYPE_Q8_0, 4, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    nl_session s;
    nl_proj_config cfg = {.backend = "host", .n_threads = 2, .precision = "keep"};
    if (nl_session_open(&s, model, NULL, &cfg)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    static const char *const files[] = {NL_TEST_DATA "/eval/choices.jsonl",
                                        NL_TEST_DATA "/../../examples/tagging-test.jsonl"};
    for (int f = 0; f < 2; f++) {
        nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
        nl_dataset ds;
        if (nl_dataset_load(files[f], s.tok, &dopt, &ds)) {
            CHECKF(0, "%s", nl_last_error());
            continue;
        }
        /* the first 24 examples of the tagging file: enough for batches of several examples and
         * cuts inside an example's choices, and quick under the sanitizers (8 under qemu,
         * NL_TEST_SMALL: still several per batch and cut choices) */
        const int n_all = ds.n, n_max = nl_t_small() ? 8 : 24;
        if (ds.n > n_max) ds.n = n_max;
        static per_ex ref, got;
        memset(&ref, 0, sizeof ref);
        nl_eval_opts o1 = {.batch_tokens = 1, .on_example = on_ex, .user = &ref};
        nl_eval_result r1, r;
        CHECKF(nl_eval_dataset_opts(&s.rt, &ds, 4096, &o1, &r1) == 0, "%s", nl_last_error());
        CHECK(ref.n == ds.n);
        static const int sizes[] = {7, 300, 0, 1 << 20};
        for (int b = 0; b < 4; b++) {
            memset(&got, 0, sizeof got);
            nl_eval_opts o = {.batch_tokens = sizes[b], .on_example = on_ex, .user = &got};
            CHECKF(nl_eval_dataset_opts(&s.rt, &ds, 4096, &o, &r) == 0, "%s", nl_last_error());
            CHECKF(r.loss_sum == r1.loss_sum && r.n_targets == r1.n_targets && r.n_correct == r1.n_correct &&
                       r.n_items == r1.n_items,
                   "%s %s batch %d: loss %.17g vs %.17g, correct %d vs %d", name, files[f], sizes[b], r.loss_sum,
                   r1.loss_sum, r.n_correct, r1.n_correct);
            int bad = got.n != ref.n;
            for (int i = 0; i < ref.n && !bad; i++) {
                bad |= got.loss[i] != ref.loss[i] || got.count[i] != ref.count[i] || got.pred[i] != ref.pred[i] ||
                       got.line[i] != ref.line[i];
                for (int k = 0; k < ref.nch[i]; k++) bad |= got.ll[i][k] != ref.ll[i][k];
            }
            CHECKF(!bad, "%s %s batch %d: per-example results differ from one sequence at a time", name, files[f],
                   sizes[b]);
        }
        /* the lines come in file order */
        int order = 1;
        for (int i = 1; i < ref.n; i++) order &= ref.line[i] > ref.line[i - 1];
        CHECK(order);
        /* the decoder's way */
        double worst = 0;
        for (int i = 0; i < ds.n && i < 512; i++)
            for (int k = 0; k < ds.ex[i].n_choices; k++) {
                /* relative: the host computes in BF16 by default, and a row's rounding may follow
                 * the request it is in (llama's tiny model measured 0, qwen3/qwen35's ~2e-5) */
                double d = fabs(kv_choice_ll(&s.rt, &ds.ex[i], k) - ref.ll[i][k]) / (1.0 + fabs(ref.ll[i][k]));
                worst = d > worst || d != d ? d : worst;
            }
        CHECKF(worst <= 1e-4, "%s %s: a choice's log-likelihood in one sequence vs after the KV cache: relative %.3g",
               name, files[f], worst);
        fprintf(stderr, "%s %s: batches bit-identical; one sequence vs KV cache: max relative |d ll| %.3g\n", name,
                files[f], worst);
        ds.n = n_all;
        nl_dataset_free(&ds);
    }
    nl_session_close(&s);
}

/* The prompt once (its choices continuing it, the loss shared with the answer) against every
 * choice its own sequence (per_choice, the path before): the same bits on the FP32 path and on
 * the host's default compute, per example and in total, for several batch sizes, on each
 * architecture (gemma3's sliding window with the tiny model's window, qwen35's recurrent layers
 * from the prompt's state). A prompt longer than the attention's query block and than gemma3's
 * window (the chat data's system turn) is in the second file. */
static void test_shared_prefix(nl_arch arch) {
    const char *name = nl_arch_name(arch);
    char model[512];
    snprintf(model, sizeof model, "%s/%s-q8-sp.gguf", tmpdir, name);
    if (nl_mkmodel(arch, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    static const char *const computes[] = {"f32", NULL};
    static const char *const files[] = {NL_TEST_DATA "/eval/choices.jsonl",
                                        NL_TEST_DATA "/../../examples/tagging-chat-test.jsonl"};
    for (int cm = 0; cm < 2; cm++) {
        nl_session s;
        nl_proj_config cfg = {.backend = "host", .n_threads = 2, .precision = "keep", .compute = computes[cm]};
        if (nl_session_open(&s, model, NULL, &cfg)) {
            fprintf(stderr, "%s\n", nl_last_error());
            exit(1);
        }
        for (int f = 0; f < 2; f++) {
            nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
            nl_dataset ds;
            if (nl_dataset_load(files[f], s.tok, &dopt, &ds)) {
                CHECKF(0, "%s", nl_last_error());
                continue;
            }
            const int n_all = ds.n, n_max = nl_t_small() ? 6 : 16;
            if (ds.n > n_max) ds.n = n_max;
            static per_ex ref, got;
            memset(&ref, 0, sizeof ref);
            nl_eval_opts o1 = {.batch_tokens = 1, .per_choice = 1, .on_example = on_ex, .user = &ref};
            nl_eval_result r1, r;
            CHECKF(nl_eval_dataset_opts(&s.rt, &ds, 4096, &o1, &r1) == 0, "%s", nl_last_error());
            int choices = 0, longest = 0;
            for (int i = 0; i < ds.n; i++) {
                choices += ds.ex[i].n_choices > 0;
                longest = ds.ex[i].n_prompt > longest ? ds.ex[i].n_prompt : longest;
            }
            CHECK(ref.n == ds.n && choices > 0 && r1.n_items == choices && r1.n_shared == 0);
            static const int sizes[] = {1, 40, 0};
            for (int b = 0; b < 3; b++) {
                memset(&got, 0, sizeof got);
                nl_eval_opts o = {.batch_tokens = sizes[b], .on_example = on_ex, .user = &got};
                CHECKF(nl_eval_dataset_opts(&s.rt, &ds, 4096, &o, &r) == 0, "%s", nl_last_error());
                double worst = 0;
                int bad = got.n != ref.n;
                for (int i = 0; i < ref.n && !bad; i++) {
                    bad |= got.loss[i] != ref.loss[i] || got.count[i] != ref.count[i] || got.pred[i] != ref.pred[i];
                    for (int k = 0; k < ref.nch[i]; k++) {
                        const double d = fabs(got.ll[i][k] - ref.ll[i][k]);
                        worst = d > worst || d != d ? d : worst;
                    }
                }
                /* every prompt shared but the tokens line's 4 (nl_attention_prefix_rows): choices.jsonl's
                 * 8th line, among the examples taken unless NL_TEST_SMALL cut them to 6 */
                const int alone = f == 0 && ds.n >= 8;
                CHECKF(r.n_shared == choices - alone, "%s: %d of %d prompts shared", name, r.n_shared, choices);
                CHECKF(!bad && worst == 0 && r.loss_sum == r1.loss_sum && r.n_targets == r1.n_targets &&
                           r.n_correct == r1.n_correct,
                       "%s %s compute %s batch %d: shared prefix vs per choice: max |d ll| %.3g, loss %.17g vs %.17g",
                       name, files[f], computes[cm] ? computes[cm] : "default", sizes[b], worst, r.loss_sum,
                       r1.loss_sum);
            }
            fprintf(stderr,
                    "%s %s compute %s: shared prefix = per choice bit for bit (%d examples, prompts up to %d tokens)\n",
                    name, files[f], computes[cm] ? computes[cm] : "default", ds.n, longest);
            ds.n = n_all;
            nl_dataset_free(&ds);
        }
        nl_session_close(&s);
    }
}

/* nl_rt_proj with an adapter: the service's product plus the LoRA term, bit for bit the sum the
 * inference forward always computed (a zeroed buffer, nl_lora_apply into it, then y[i] += it),
 * overlapped (sync 0: the branch on this thread while the request is in flight, the add on the
 * pool) and synchronous (sync 1, `eval`'s mode on the CPU backends, nl_session_sync_cpu: the branch after
 * the wait on the pool, each block's term added in cache), on 1 and 3 threads, at odd row counts
 * (32-row blocks split over the pool's tasks); then eval with the adapter: both modes, the same
 * per-example numbers. */
static void test_lora_proj(nl_arch arch) {
    const char *name = nl_arch_name(arch);
    char model[512], apath[512];
    snprintf(model, sizeof model, "%s/%s-q8-lp.gguf", tmpdir, name);
    snprintf(apath, sizeof apath, "%s/%s-lp-adapter.gguf", tmpdir, name);
    if (nl_mkmodel(arch, "tiny", NL_TYPE_Q8_0, 7, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    nl_model *m = nl_model_load(model);
    CHECK(m != NULL);
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down,qkv,z,alpha,beta,out", 3, 5.0f, 11);
    CHECK(a != NULL);
    if (!a) return;
    for (int i = 0; i < a->n; i++) nl_t_fill(nl_lora_B(a, i), a->t[i].n_out * a->t[i].rank, 0.5);
    CHECK(nl_adapter_save(a, m, apath) == 0);
    nl_adapter_free(a);
    nl_model_free(m);
    nl_session s;
    nl_proj_config cfg = {.backend = "host", .n_threads = 3, .precision = "keep"};
    if (nl_session_open(&s, model, apath, &cfg)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    nl_session_sync_cpu(&s);
    CHECK(s.rt.sync == 1); /* eval's mode on the CPU backends */
    a = s.adapter;
    static const int rows[] = {1, 5, 33, 70, 131};
    int n_proj = 0;
    for (int p = 0; p < s.m->n_projs; p++) {
        const int e = a->by_proj[p];
        if (e < 0) continue;
        const nl_lora_tensor *lt = &a->t[e];
        const nl_lora L = {
            .n_in = (int)lt->n_in, .n_out = (int)lt->n_out, .rank = lt->rank, .scale = nl_adapter_scale(a, e)};
        for (size_t ti = 0; ti < sizeof rows / sizeof *rows; ti++) {
            const int T = rows[ti];
            const size_t nx = (size_t)T * L.n_in, ny = (size_t)T * L.n_out;
            float *x = malloc(nx * sizeof *x), *want = malloc(ny * sizeof *want), *ly = calloc(ny, sizeof *ly),
                  *got = malloc(ny * sizeof *got);
            nl_t_fill(x, (int64_t)nx, 1.0);
            CHECK(nl_proj_run(s.svc, s.rt.svc_id[p], NL_FWD, x, T, want) == 0);
            CHECK(nl_lora_apply(&L, nl_lora_A(a, e), nl_lora_B(a, e), ly, x, T) == 0);
            for (size_t i = 0; i < ny; i++) want[i] += ly[i];
            for (int th = 1; th <= 3; th += 2) {
                CHECK(nl_runtime_set_threads(&s.rt, th) == 0);
                for (int sync = 0; sync < 2; sync++) {
                    s.rt.sync = sync;
                    CHECK(nl_rt_proj(&s.rt, p, x, T, got) == 0);
                    CHECKF(!memcmp(got, want, ny * sizeof *got), "%s %s T=%d threads %d sync %d: LoRA sum differs",
                           name, s.m->projs[p].name, T, th, sync);
                }
            }
            free(x);
            free(want);
            free(ly);
            free(got);
        }
        n_proj++;
    }
    CHECK(n_proj > 0);
    nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
    nl_dataset ds;
    if (nl_dataset_load(NL_TEST_DATA "/../../examples/tagging-chat-test.jsonl", s.tok, &dopt, &ds)) {
        CHECKF(0, "%s", nl_last_error());
        nl_session_close(&s);
        return;
    }
    if (ds.n > 12) ds.n = 12;
    static per_ex ref, got;
    nl_eval_result r0, r1;
    for (int sync = 0; sync < 2; sync++) {
        s.rt.sync = sync;
        memset(sync ? &got : &ref, 0, sizeof ref);
        nl_eval_opts o = {.on_example = on_ex, .user = sync ? &got : &ref};
        CHECKF(nl_eval_dataset_opts(&s.rt, &ds, 4096, &o, sync ? &r1 : &r0) == 0, "%s", nl_last_error());
    }
    int bad = got.n != ref.n || r0.loss_sum != r1.loss_sum || r0.n_correct != r1.n_correct;
    for (int i = 0; i < ref.n && !bad; i++) {
        bad |= got.loss[i] != ref.loss[i] || got.pred[i] != ref.pred[i];
        for (int k = 0; k < ref.nch[i]; k++) bad |= got.ll[i][k] != ref.ll[i][k];
    }
    CHECKF(!bad, "%s: eval with an adapter: synchronous and overlapped LoRA differ", name);
    fprintf(stderr, "%s: nl_rt_proj's LoRA = the zeroed buffer's sum bit for bit (%d projections; eval %d examples)\n",
            name, n_proj, ds.n);
    nl_dataset_free(&ds);
    nl_session_close(&s);
}

/* nl_forward_packed_prefix refuses a continuation with no prefix right before it. */
static void test_prefix_rules(const char *model) {
    nl_session s;
    nl_proj_config cfg = {.backend = "host", .n_threads = 1, .precision = "keep"};
    if (nl_session_open(&s, model, NULL, &cfg)) {
        fprintf(stderr, "%s\n", nl_last_error());
        exit(1);
    }
    const int E = s.m->hp.n_embd;
    static const int32_t tok[6] = {1, 2, 3, 4, 5, 6};
    float *h = malloc(sizeof(float) * 6 * (size_t)E);
    const int seg[3] = {2, 2, 2};
    static const int bad1[3] = {-1, 0, 1}, bad2[3] = {1, -1, 1}, bad3[3] = {-1, -1, 0}, good[3] = {-1, 0, 0};
    const int *bad[3] = {bad1, bad2, bad3};
    for (int i = 0; i < 3; i++) {
        CHECK(nl_forward_packed_prefix(&s.rt, tok, 6, 3, seg, bad[i], h) != 0);
        CHECKF(strstr(nl_last_error(), "continues sequence"), "%s", nl_last_error());
    }
    CHECKF(nl_forward_packed_prefix(&s.rt, tok, 6, 3, seg, good, h) == 0, "%s", nl_last_error());
    /* a prefix of 3 rows and a continuation of 3: alone the prefix's attention takes the
     * direct scores, joined the packed ones */
    const int seg2[2] = {3, 3};
    CHECK(nl_forward_packed_prefix(&s.rt, tok, 6, 2, seg2, good, h) != 0 &&
          strstr(nl_last_error(), "nl_attention_prefix_rows"));
    free(h);
    nl_session_close(&s);
}

/* eval --json: one JSON object (the project's strict parser reads it) with the totals the text
 * line prints and every example in file order; --batch-tokens does not change a number. */
static void test_eval_json(const char *model) {
    static char out[1 << 16], text[4096], again[1 << 16];
    int st = run_cli_with(model, choices_path, "--json", out, sizeof out);
    CHECKF(st == 0, "eval --json exit %d: %s", st, out);
    const char *j = strchr(out, '{');
    nl_json *root = j ? nl_json_parse(j, strlen(j), NULL) : NULL;
    CHECKF(root != NULL, "eval --json is not JSON: %s", out);
    if (!root) return;
    const nl_json *pe = nl_json_get(root, "per_example");
    int64_t n_ex = -1, corr = -1, items = -1, tg = -1;
    nl_json_int64(nl_json_get(root, "examples"), &n_ex);
    nl_json_int64(nl_json_get(root, "correct"), &corr);
    nl_json_int64(nl_json_get(root, "items"), &items);
    nl_json_int64(nl_json_get(root, "targets"), &tg);
    CHECK(n_ex == N_LINES && items == N_LINES - 1 && (int64_t)nl_json_len(pe) == n_ex);
    int64_t c = 0, t = 0, last = 0;
    for (size_t i = 0; i < nl_json_len(pe); i++) {
        const nl_json *e = nl_json_at(pe, i);
        int64_t line = 0, et = 0;
        nl_json_int64(nl_json_get(e, "line"), &line);
        nl_json_int64(nl_json_get(e, "targets"), &et);
        CHECK(line > last);
        last = line;
        t += et;
        const nl_json *ok = nl_json_get(e, "correct");
        c += ok && ok->type == NL_JSON_TRUE;
        if (ok) CHECK(nl_json_len(nl_json_get(e, "choices_ll")) >= 2);
    }
    CHECKF(c == corr && t == tg, "per-example sums %lld correct, %lld targets vs the totals %lld, %lld", (long long)c,
           (long long)t, (long long)corr, (long long)tg);
    /* the text line's numbers are the JSON's */
    CHECK(run_cli(model, choices_path, text, sizeof text) == 0);
    char want[128];
    snprintf(want, sizeof want, "accuracy %.1f%% (%lld/%lld)", 100.0 * corr / items, (long long)corr, (long long)items);
    CHECKF(strstr(text, want) != NULL, "%s vs %s", text, want);
    nl_json_free(root);
    st = run_cli_with(model, choices_path, "--json --batch-tokens 1", again, sizeof again);
    CHECKF(st == 0 && !strcmp(out, again), "eval --json --batch-tokens 1 differs");
    st = run_cli_with(model, choices_path, "--batch-tokens 0", again, sizeof again);
    CHECKF(st == 2 && strstr(again, "--batch-tokens 0: expected an integer in [1, "), "exit %d: %s", st, again);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nl_test_eval_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd)) return 1;
    test_arch(NL_ARCH_QWEN3);
    test_arch(NL_ARCH_LLAMA);
    test_arch(NL_ARCH_QWEN35);
    test_arch(NL_ARCH_GEMMA3);
    test_batches(NL_ARCH_QWEN3);
    test_batches(NL_ARCH_LLAMA);
    test_batches(NL_ARCH_QWEN35);
    test_batches(NL_ARCH_GEMMA3);
    test_shared_prefix(NL_ARCH_LLAMA);
    test_shared_prefix(NL_ARCH_QWEN3);
    test_shared_prefix(NL_ARCH_QWEN35);
    test_shared_prefix(NL_ARCH_GEMMA3);
    test_lora_proj(NL_ARCH_LLAMA);
    test_lora_proj(NL_ARCH_QWEN35);
    char model[512];
    snprintf(model, sizeof model, "%s/qwen3.gguf", tmpdir);
    test_prefix_rules(model);
    test_cli_errors(model);
    test_context_cut(model);
    test_data_dir(model);
    test_eval_json(model);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    return nl_t_done();
}

/* The public API (nightlora.h): a model made, an adapter trained with the progress callback and
 * cancelled through its run handle, validated during training (its eval rows), then evaluated, tokenized, generated
 * from and its logits taken, each checked against the internal call the CLI makes; errors per thread. And the library's
 * defaults (the internal nl_train_defaults, nl_session_open with no config) are the CLI's. */
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nightlora.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/model.h"
#include "model/quant.h"
#include "proj/proj.h"
#include "train/trainer.h"
#include "util/util.h"
#include "test.h"

static char dir[256], model[320], data[320], out[320];

/* The internal entry points' defaults are the CLI's. */
static void test_internal_defaults(void) {
    nl_train_opts o;
    nl_train_defaults(&o);
    /* host backend, every core up to 8, precision auto */
    CHECK(o.proj.backend && !strcmp(o.proj.backend, "host") && o.proj.n_threads == nl_proj_default_threads());
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(nl_proj_default_threads() == (ncpu > 8 ? 8 : ncpu > 0 ? (int)ncpu : 1));
    CHECK(o.proj.precision == NULL && o.proj.backend_impl == NULL);
    CHECK(o.cancel == NULL && o.on_progress == NULL);
    nl_session s;
    CHECKF(nl_session_open(&s, model, NULL, NULL) == 0, "%s", nl_last_error());
    /* no config: host on every core up to 8, the weights in their stored type (this F32 model's
     * projections stay F32; training's policy would have made them Q8_0) */
    CHECK(!strcmp(nl_proj_backend_name(s.svc), "host") && nl_proj_threads(s.svc) == nl_proj_default_threads());
    int n_f32 = 0;
    for (int i = 0; i < nl_proj_count(s.svc); i++) n_f32 += nl_proj_get(s.svc, i)->type == NL_TYPE_F32;
    CHECK(nl_proj_count(s.svc) > 0 && n_f32 == nl_proj_count(s.svc));
    nl_session_close(&s);
}

typedef struct {
    int rows, bad_kind, out_of_order;
    int64_t last_step, total;
    double last_loss, last_tps;
    int cancel_at; /* cancel the run from the callback after this step (0: never) */
    nightlora_run *run;
} progress_log;

static void on_progress(void *user, const nightlora_progress *p) {
    progress_log *l = user;
    if (p->kind != NIGHTLORA_PROGRESS_STEP) {
        l->bad_kind++;
        return;
    }
    if (p->step != l->last_step + 1) l->out_of_order++;
    l->rows++;
    l->last_step = p->step;
    l->total = p->total_steps;
    l->last_loss = p->loss;
    l->last_tps = p->tokens_per_s;
    if (l->cancel_at && p->step == l->cancel_at) nightlora_run_cancel(l->run);
}

static void train_params(nightlora_train_params *p, const char *adapter, int64_t steps) {
    nightlora_train_default_params(p);
    p->model = model;
    p->data = data;
    p->out = adapter;
    p->steps = steps;
    p->batch_tokens = 64;
    p->thermal = "off";
}

static void test_train(void) {
    /* the defaults are the internal ones (and so the CLI's) */
    nightlora_train_params p;
    nightlora_train_default_params(&p);
    nl_train_opts o;
    nl_train_defaults(&o);
    CHECK(p.rank == o.rank && p.alpha == o.alpha && p.lr == o.lr && p.batch_tokens == o.batch_tokens &&
          p.seed == o.seed && p.clip == o.clip && p.lr_min == o.lr_min && !strcmp(p.schedule, "cosine") &&
          !strcmp(p.backend, "host") && p.log_stderr == 0 && p.on_progress == NULL);

    /* a row per step, in order, the last one the result's */
    train_params(&p, out, 3);
    progress_log l = {0};
    p.on_progress = on_progress;
    p.user = &l;
    nightlora_train_result r;
    CHECKF(nightlora_train(&p, NULL, &r) == 0, "%s", nightlora_last_error());
    CHECK(r.steps_done == 3 && r.total_steps == 3 && !r.cancelled && isfinite(r.last_loss));
    CHECKF(l.rows == 3 && l.last_step == 3 && l.total == 3 && !l.bad_kind && !l.out_of_order, "%d rows, last step %lld",
           l.rows, (long long)l.last_step);
    CHECK(l.last_loss == r.last_loss && l.last_tps > 0);

    /* the same run through the internal call: the same adapter, bit for bit */
    char ref[340];
    snprintf(ref, sizeof ref, "%s/ref.gguf", dir);
    nl_train_defaults(&o);
    o.model = model;
    o.data = data;
    o.out = ref;
    o.steps = 3;
    o.batch_tokens = 64;
    o.thermal = "off";
    o.progress = NULL;
    nl_train_result ir;
    CHECKF(nl_train(&o, &ir) == 0, "%s", nl_last_error());
    size_t la = 0, lb = 0;
    char *a = nl_read_file(out, &la), *b = nl_read_file(ref, &lb);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0 && ir.last_loss == r.last_loss);
    free(a);
    free(b);

    /* cancelled from the callback after step 2 of 6: stops there, the adapter written */
    char cut[340];
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    train_params(&p, cut, 6);
    nightlora_run *run = nightlora_run_new();
    progress_log lc = {.cancel_at = 2, .run = run};
    p.on_progress = on_progress;
    p.user = &lc;
    CHECKF(nightlora_train(&p, run, &r) == 0, "%s", nightlora_last_error());
    CHECKF(r.cancelled && r.steps_done == 2 && r.total_steps == 6 && lc.rows == 2, "cancelled %d, %lld steps, %d rows",
           r.cancelled, (long long)r.steps_done, lc.rows);
    CHECK(nightlora_run_cancelled(run));
    struct stat st;
    CHECK(stat(cut, &st) == 0 && st.st_size > 0);
    /* a handle cancelled before the run: no step is taken */
    unlink(cut);
    lc = (progress_log){0};
    CHECKF(nightlora_train(&p, run, &r) == 0, "%s", nightlora_last_error());
    CHECK(r.cancelled && r.steps_done == 0 && lc.rows == 0 && stat(cut, &st) == 0);
    /* reset: the handle runs the next one to its end */
    nightlora_run_reset(run);
    CHECK(!nightlora_run_cancelled(run));
    unlink(cut);
    p.steps = 2;
    CHECKF(nightlora_train(&p, run, &r) == 0, "%s", nightlora_last_error());
    CHECK(!r.cancelled && r.steps_done == 2);
    nightlora_run_free(run);

    /* bad params: errors naming the field */
    train_params(&p, cut, 2);
    p.schedule = "linear";
    CHECK(nightlora_train(&p, NULL, &r) == -1 && strstr(nightlora_last_error(), "schedule 'linear'"));
    train_params(&p, cut, 2);
    p.backend = "gpu";
    CHECK(nightlora_train(&p, NULL, &r) == -1 && strstr(nightlora_last_error(), "backend 'gpu'"));
    train_params(&p, cut, 2);
    p.device = "1";
    CHECK(nightlora_train(&p, NULL, &r) == -1 &&
          strstr(nightlora_last_error(), "device '1': backend 'host' has no devices"));
    train_params(&p, cut, 2);
    p.data = "/nonexistent.jsonl";
    CHECK(nightlora_train(&p, NULL, &r) == -1 && strstr(nightlora_last_error(), "/nonexistent.jsonl"));
    CHECK(nightlora_train(NULL, NULL, &r) == -1);
}

/* Validation through the API: a pass after every 2 steps and after the last, each an
 * NIGHTLORA_PROGRESS_EVAL row after its step's row, the numbers the internal run gives; the
 * last pass is nightlora_eval's on the adapter written; the result counts them. */
typedef struct {
    int n;
    nightlora_progress rows[32];
} row_log;

static void keep_row(void *user, const nightlora_progress *p) {
    row_log *l = user;
    if (l->n < 32) l->rows[l->n++] = *p;
}

typedef struct {
    int n;
    nl_train_progress rows[32];
} internal_log;

static void keep_internal_row(void *user, const nl_train_progress *p) {
    internal_log *l = user;
    if (l->n < 32) l->rows[l->n++] = *p;
}

static void test_validation(void) {
    char val[340], vout[340], iout[340];
    snprintf(val, sizeof val, "%s/val.jsonl", dir);
    snprintf(vout, sizeof vout, "%s/val-adapter.gguf", dir);
    snprintf(iout, sizeof iout, "%s/val-internal.gguf", dir);
    FILE *f = fopen(val, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"prompt\": \"note %d:\", \"choices\": [\" odd\", \" even\"], \"answer\": %d}\n", i + 10,
                i % 2 ? 0 : 1);
    fclose(f);
    nightlora_train_params p;
    train_params(&p, vout, 5);
    p.val_data = val;
    p.eval_every = 2;
    row_log l = {0};
    p.on_progress = keep_row;
    p.user = &l;
    nightlora_train_result r;
    CHECKF(nightlora_train(&p, NULL, &r) == 0, "%s", nightlora_last_error());
    /* step rows 1..5, eval rows after steps 2, 4 and 5 */
    static const int want_kind[] = {1, 1, 2, 1, 1, 2, 1, 2}, want_step[] = {1, 2, 2, 3, 4, 4, 5, 5};
    CHECKF(l.n == 8, "%d rows", l.n);
    for (int i = 0; i < l.n && i < 8; i++)
        CHECKF(l.rows[i].kind == want_kind[i] && l.rows[i].step == want_step[i] && l.rows[i].total_steps == 5,
               "row %d: kind %d step %lld", i, l.rows[i].kind, (long long)l.rows[i].step);
    /* the internal run's rows, field for field (the seconds are the clock's) */
    nl_train_opts o;
    nl_train_defaults(&o);
    o.model = model;
    o.data = data;
    o.out = iout;
    o.steps = 5;
    o.batch_tokens = 64;
    o.thermal = "off";
    o.progress = NULL;
    o.val_data = val;
    o.eval_every = 2;
    internal_log il = {0};
    o.on_progress = keep_internal_row;
    o.progress_user = &il;
    nl_train_result ir;
    CHECKF(nl_train(&o, &ir) == 0, "%s", nl_last_error());
    CHECK(il.n == l.n);
    int evals = 0;
    for (int i = 0; i < l.n && i < il.n; i++) {
        if (l.rows[i].kind != NIGHTLORA_PROGRESS_EVAL) continue;
        evals++;
        const nightlora_progress *a = &l.rows[i];
        const nl_train_progress *b = &il.rows[i];
        CHECKF(b->kind == NL_PROGRESS_EVAL && a->step == b->step && a->eval_loss == b->eval_loss &&
                   a->eval_accuracy == b->eval_accuracy && a->eval_examples == b->eval_examples &&
                   a->eval_tokens == b->eval_tokens,
               "eval row %d: loss %.17g vs %.17g", i, a->eval_loss, b->eval_loss);
        CHECK(a->eval_examples == 5 && a->eval_tokens > 0 && a->eval_accuracy >= 0 && a->eval_accuracy <= 1 &&
              a->eval_seconds > 0 && isfinite(a->eval_loss));
    }
    CHECK(evals == 3);
    CHECKF(r.evaluations == 3 && ir.n_evals == 3 && r.eval_seconds > 0 && !r.early_stopped && r.best_step >= 2 &&
               r.best_step <= 5,
           "%d evaluations, best step %lld", r.evaluations, (long long)r.best_step);
    /* the last pass: eval's numbers on the adapter written */
    nightlora_model_params mp;
    nightlora_model_default_params(&mp);
    mp.adapter = vout;
    mp.precision = "auto"; /* training's resident weights (Q8_0 here), as the validation scored them */
    nightlora_model *m = nightlora_model_open(model, &mp);
    CHECKF(m != NULL, "%s", nightlora_last_error());
    nightlora_eval_result er;
    if (m && l.n == 8) {
        CHECKF(nightlora_eval(m, val, NULL, &er) == 0, "%s", nightlora_last_error());
        CHECKF(er.loss == l.rows[7].eval_loss && er.accuracy == l.rows[7].eval_accuracy && er.n_examples == 5,
               "eval %.17g / %g, the last row %.17g / %g", er.loss, er.accuracy, l.rows[7].eval_loss,
               l.rows[7].eval_accuracy);
    }
    nightlora_model_close(m);
    /* keep_best: a name checked; a validation setting without a set refused */
    train_params(&p, vout, 2);
    p.val_data = val;
    p.keep_best = "latest";
    CHECK(nightlora_train(&p, NULL, &r) == -1 && strstr(nightlora_last_error(), "keep_best 'latest'"));
    train_params(&p, vout, 2);
    p.eval_every = 1;
    CHECK(nightlora_train(&p, NULL, &r) == -1 && strstr(nightlora_last_error(), "needs a validation set"));
    /* without validation: no eval row, the result's validation fields zero */
    train_params(&p, vout, 2);
    l.n = 0;
    p.on_progress = keep_row;
    p.user = &l;
    CHECK(nightlora_train(&p, NULL, &r) == 0 && l.n == 2 && r.evaluations == 0 && r.best_step == 0);
}

static int token_calls;
static char token_text[4096];
static void on_token(void *user, int32_t id, const char *text, size_t len) {
    (void)id;
    size_t *n = user;
    token_calls++;
    if (*n + len < sizeof token_text) {
        memcpy(token_text + *n, text, len);
        *n += len;
        token_text[*n] = 0;
    }
}

static void test_infer(void) {
    nightlora_model_params mp;
    nightlora_model_default_params(&mp);
    mp.adapter = out;
    nightlora_model *m = nightlora_model_open(model, &mp);
    CHECKF(m != NULL, "%s", nightlora_last_error());
    if (!m) return;
    /* the internal session the CLI opens, with the same settings */
    nl_session s;
    CHECKF(nl_session_open(&s, model, out, NULL) == 0, "%s", nl_last_error());
    const int V = nightlora_model_n_vocab(m);
    CHECK(V == s.m->hp.n_vocab && nightlora_model_n_ctx(m) == s.m->hp.n_ctx_train);

    /* tokenize: the count, also past the buffer; detokenize undoes it */
    const char *text = "Note: Book the hotel for Friday";
    int32_t ids[64], few[2];
    int n = nightlora_tokenize(m, text, 0, ids, 64);
    CHECK(n > 2 && nightlora_tokenize(m, text, 0, few, 2) == n && few[0] == ids[0] && few[1] == ids[1]);
    CHECK(nightlora_tokenize(m, text, 0, NULL, 0) == n);
    int32_t *iv = NULL;
    int in = 0;
    CHECK(nl_tokenize(s.tok, text, strlen(text), false, false, &iv, &in) == 0 && in == n &&
          !memcmp(iv, ids, (size_t)n * sizeof *ids));
    free(iv);
    char back[256];
    CHECK(nightlora_detokenize(m, ids, n, back, sizeof back) == (int64_t)strlen(text) && !strcmp(back, text));
    CHECK(nightlora_detokenize(m, ids, n, back, 5) == (int64_t)strlen(text) && !strncmp(back, text, 4) && back[4] == 0);

    /* logits: bit for bit the session's */
    float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
    CHECK(nightlora_logits(m, ids, n, a) == 0 && nl_session_logits(&s, ids, n, b) == 0 &&
          !memcmp(a, b, sizeof(float) * (size_t)n * V));
    int32_t bad[2] = {1, V};
    CHECK(nightlora_logits(m, bad, 2, a) == -1 && strstr(nightlora_last_error(), "outside the vocabulary"));
    free(a);
    free(b);

    /* generate: greedy, the same twice; the callback sees every token and the text */
    nightlora_generate_params gp;
    nightlora_generate_default_params(&gp);
    gp.n_predict = 6;
    gp.on_token = on_token;
    size_t tl = 0;
    gp.user = &tl;
    char *t1 = NULL, *t2 = NULL;
    token_calls = 0;
    int g1 = nightlora_generate(m, "Note: Book the hotel for Friday", &gp, &t1);
    CHECKF(g1 >= 1 && g1 <= 6 && token_calls == g1 && t1 && !strcmp(t1, token_text), "%d tokens, %d calls: %s", g1,
           token_calls, nightlora_last_error());
    gp.on_token = NULL;
    int g2 = nightlora_generate(m, "Note: Book the hotel for Friday", &gp, &t2);
    CHECK(g2 == g1 && t2 && t1 && !strcmp(t1, t2));
    nightlora_free(t1);
    nightlora_free(t2);
    gp.top_p = 0;
    CHECK(nightlora_generate(m, "x", &gp, NULL) == -1 && strstr(nightlora_last_error(), "top_p"));

    /* eval: the CLI's numbers */
    nightlora_eval_result er;
    CHECKF(nightlora_eval(m, data, NULL, &er) == 0, "%s", nightlora_last_error());
    nl_eval_result ir;
    CHECK(nl_eval_file(&s.rt, s.tok, data, NULL, 0, NULL, &ir) == 0);
    CHECK(er.n_examples == ir.n_examples && er.n_targets == ir.n_targets && er.loss == nl_eval_loss(&ir) &&
          er.accuracy == -1.0 && fabs(er.ppl - exp(er.loss)) < 1e-9 * er.ppl);
    nightlora_eval_params ep;
    nightlora_eval_default_params(&ep);
    ep.ctx = 1;
    CHECK(nightlora_eval(m, data, &ep, &er) == -1 && strstr(nightlora_last_error(), "ctx 1"));
    nl_session_close(&s);
    nightlora_model_close(m);
    nightlora_model_close(NULL);

    nightlora_model_default_params(&mp);
    mp.compute = "fast";
    CHECK(nightlora_model_open(model, &mp) == NULL && strstr(nightlora_last_error(), "compute 'fast'"));
    /* a device: only for a backend with devices, and only an index */
    nightlora_model_default_params(&mp);
    mp.device = "0";
    CHECK(nightlora_model_open(model, &mp) == NULL && strstr(nightlora_last_error(), "backend 'host' has no devices"));
    mp.backend = "ref";
    CHECK(nightlora_model_open(model, &mp) == NULL && strstr(nightlora_last_error(), "backend 'ref' has no devices"));
    if (nl_proj_backend_find("vulkan")) {
        mp.backend = "vulkan";
        mp.device = "first";
        CHECK(nightlora_model_open(model, &mp) == NULL &&
              strstr(nightlora_last_error(), "device 'first': expected a device index"));
    }
    CHECK(nightlora_model_open("/nonexistent.gguf", NULL) == NULL &&
          strstr(nightlora_last_error(), "/nonexistent.gguf"));
}

/* Each thread has its own error message. */
static void *fail_in_thread(void *arg) {
    (void)arg;
    nightlora_model *m = nightlora_model_open("/nonexistent-in-thread.gguf", NULL);
    return (void *)(intptr_t)(m == NULL && strstr(nightlora_last_error(), "/nonexistent-in-thread.gguf") != NULL);
}

/* One validation for every face: the C API refuses what the CLI refuses, naming the option,
 * before anything is read or written; a plan's step count never spins. */
static char refused_out[400];

static void expect_refused(nightlora_train_params *p, const char *want, int line) {
    nightlora_train_result r;
    p->out = refused_out;
    unlink(refused_out);
    const double t0 = nl_now();
    const int rc = nightlora_train(p, NULL, &r);
    const double dt = nl_now() - t0;
    CHECKF(rc == -1 && strstr(nightlora_last_error(), want), "line %d: rc %d: %s (want %s)", line, rc,
           nightlora_last_error(), want);
    CHECKF(dt < 10, "line %d: %.1f s to refuse", line, dt);
    CHECKF(access(refused_out, F_OK) != 0, "line %d: an adapter was written", line);
}
#define REFUSED(p, want) expect_refused(&(p), want, __LINE__)

static void test_param_checks(void) {
    nightlora_train_params p;
    snprintf(refused_out, sizeof refused_out, "%s/refused.gguf", dir);
    train_params(&p, out, 0);
    p.epochs = INFINITY;
    REFUSED(p, "--epochs inf: expected a number in [9.9999999999999995e-07, 1000000]");
    p.epochs = 1e300;
    REFUSED(p, "--epochs 1.0000000000000001e+300: expected a number in");
    p.epochs = 1e19;
    REFUSED(p, "--epochs 1e+19: expected a number in");
    p.epochs = NAN;
    REFUSED(p, "--epochs nan");
    p.epochs = 1e12;
    REFUSED(p, "--epochs 1000000000000: expected a number in");
    /* in range but a walk of 2^27 shuffled orders: refused at once, not minutes of counting */
    p.epochs = 1e6;
    p.batch_tokens = 1;
    FILE *f = fopen(data, "r");
    CHECK(f != NULL);
    if (f) fclose(f);
    char big[400];
    snprintf(big, sizeof big, "%s/big.jsonl", dir);
    f = fopen(big, "w");
    for (int i = 0; f && i < 200; i++) fprintf(f, "{\"tokens\": [%d, %d]}\n", 1 + i % 50, 2 + i % 40);
    if (f) fclose(f);
    p.data = big;
    REFUSED(p, "more than the 2^27 sequence visits a plan may take; give --steps N");
    train_params(&p, out, 2);
    p.rank = 0;
    REFUSED(p, "--rank 0: expected an integer in [1, 4096]");
    p.rank = 5000;
    REFUSED(p, "--rank 5000: expected an integer in [1, 4096]");
    train_params(&p, out, 2);
    p.lr = INFINITY;
    REFUSED(p, "--lr inf");
    train_params(&p, out, 2);
    p.dropout = 1.5f;
    REFUSED(p, "--dropout 1.5");
    train_params(&p, out, 2);
    p.batch_tokens = -1; /* 0 is the default: the batch sized to the data */
    REFUSED(p, "--batch-tokens -1");
    train_params(&p, out, 2);
    p.steps = -3;
    REFUSED(p, "--steps -3");
    train_params(&p, out, 2);
    p.warmup = -1;
    REFUSED(p, "--warmup -1");
    train_params(&p, out, 2);
    p.ctx = 1;
    REFUSED(p, "--ctx 1: expected an integer in [2, 10000000], or 0 (the model's)");
    train_params(&p, out, 2);
    p.weight_decay = -1;
    REFUSED(p, "--weight-decay -1");
    train_params(&p, out, 2);
    p.alpha = NAN;
    REFUSED(p, "--alpha nan");
    train_params(&p, out, 2);
    p.clip = NAN;
    REFUSED(p, "--clip nan");
    train_params(&p, out, 2);
    p.mem_limit_mb = -5;
    REFUSED(p, "--mem-limit-mb");
    train_params(&p, out, 2);
    p.val_split = 1.5;
    REFUSED(p, "--val-split 1.5");
    train_params(&p, out, 2);
    p.commit_every = 0;
    REFUSED(p, "--commit-every 0");
    train_params(&p, out, 2);
    p.eval_every = -1;
    p.val_split = 0.25;
    REFUSED(p, "--eval-every -1");
    /* the documented "off" values pass: clip <= 0, lr_min < 0, ctx 0, act_budget_mb -1 */
    train_params(&p, refused_out, 1);
    p.clip = -1;
    p.lr_min = -1;
    p.ctx = 0;
    p.act_budget_mb = -1;
    nightlora_train_result r;
    CHECKF(nightlora_train(&p, NULL, &r) == 0 && r.steps_done == 1, "%s", nightlora_last_error());
    unlink(refused_out);
}

/* Everything train does is a parameter: snapshots, the report, the data readers' options. */
static void test_train_features(void) {
    char snap_out[400], log[400], report[400], s1[400], s2[400], extra[400];
    snprintf(snap_out, sizeof snap_out, "%s/snap.gguf", dir);
    snprintf(log, sizeof log, "%s/snap.jsonl", dir);
    snprintf(report, sizeof report, "%s/snap.html", dir);
    nightlora_train_params p;
    train_params(&p, snap_out, 2);
    p.save_every = 1;
    p.report = report;
    nightlora_train_result r0;
    CHECK(nightlora_train(&p, NULL, &r0) == -1 && strstr(nightlora_last_error(), "report") &&
          strstr(nightlora_last_error(), "log_json"));
    p.log_json = log;
    nightlora_train_result r;
    CHECKF(nightlora_train(&p, NULL, &r) == 0 && r.steps_done == 2, "%s", nightlora_last_error());
    char *s = nl_train_snapshot_path(snap_out, 1), *t = nl_train_snapshot_path(snap_out, 2);
    snprintf(s1, sizeof s1, "%s", s);
    snprintf(s2, sizeof s2, "%s", t);
    free(s);
    free(t);
    CHECK(access(s1, F_OK) == 0 && access(s2, F_OK) == 0 && access(snap_out, F_OK) == 0);
    size_t n = 0;
    char *html = nl_read_file(report, &n);
    CHECK(html && strstr(html, "<svg") && strstr(html, "</html>"));
    free(html);
    /* keys no format reads: skipped by default, refused with strict_keys; columns maps names */
    snprintf(extra, sizeof extra, "%s/extra.jsonl", dir);
    FILE *f = fopen(extra, "w");
    for (int i = 0; f && i < 4; i++) fprintf(f, "{\"id\": %d, \"q\": \"note %d:\", \"a\": \" odd\"}\n", i, i);
    if (f) fclose(f);
    train_params(&p, snap_out, 1);
    p.data = extra;
    p.strict_keys = 1;
    p.columns = "prompt=q,completion=a";
    nightlora_train_result r2;
    CHECK(nightlora_train(&p, NULL, &r2) == -1 &&
          strstr(nightlora_last_error(), "extra.jsonl:1:2: unknown key \"id\""));
    p.strict_keys = 0;
    CHECKF(nightlora_train(&p, NULL, &r2) == 0 && r2.steps_done == 1, "%s", nightlora_last_error());
    p.columns = "prompt";
    CHECK(nightlora_train(&p, NULL, &r2) == -1 &&
          strstr(nightlora_last_error(), "--columns prompt: expected KEY=COLUMN pairs"));
    p.columns = NULL;
    p.alpaca_prompt = "neither";
    CHECK(nightlora_train(&p, NULL, &r2) == -1 && strstr(nightlora_last_error(), "--alpaca-prompt neither"));
}

/* merge and export are functions of the API: the CLI's files, inputs never replaced. */
static void test_merge_export(void) {
    char merged[400], peft[400], back[400];
    snprintf(merged, sizeof merged, "%s/merged.gguf", dir);
    snprintf(peft, sizeof peft, "%s/peft", dir);
    snprintf(back, sizeof back, "%s/back.gguf", dir);
    nightlora_merge_result r;
    CHECKF(nightlora_merge(model, out, merged, NULL, -1, &r) == 0, "%s", nightlora_last_error());
    CHECK(r.n_adapted > 0 && r.lost >= 0 && r.lost < 0.01 && r.worst >= r.lost * 0.999);
    CHECK(nightlora_merge(model, out, model, NULL, -1, NULL) == -1 &&
          strstr(nightlora_last_error(), "would replace an input"));
    CHECK(nightlora_merge(model, out, merged, "q5_k", -1, NULL) == -1 && strstr(nightlora_last_error(), "type 'q5_k'"));
    /* the merged model scores as base + adapter does (f32 base: within float rounding) */
    nightlora_model *mm = nightlora_model_open(merged, NULL), *ma;
    nightlora_model_params mp;
    nightlora_model_default_params(&mp);
    mp.adapter = out;
    ma = nightlora_model_open(model, &mp);
    nightlora_eval_result e1, e2;
    CHECK(mm && ma && nightlora_eval(mm, data, NULL, &e1) == 0 && nightlora_eval(ma, data, NULL, &e2) == 0 &&
          fabs(e1.loss - e2.loss) < 1e-3);
    nightlora_model_close(mm);
    nightlora_model_close(ma);
    CHECKF(nightlora_export(model, out, "peft", peft, "org/base") == 0, "%s", nightlora_last_error());
    char cfg[500];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", peft);
    CHECK(nl_t_file_has(cfg, "\"base_model_name_or_path\": \"org/base\""));
    CHECKF(nightlora_export(model, peft, "gguf", back, NULL) == 0, "%s", nightlora_last_error());
    CHECK(nightlora_export(model, out, "onnx", back, NULL) == -1 && strstr(nightlora_last_error(), "format 'onnx'"));
    CHECK(nightlora_export(model, out, "gguf", out, NULL) == -1 &&
          strstr(nightlora_last_error(), "would replace an input"));
    CHECK(nightlora_export(model, out, "gguf", back, "org/base") == -1 &&
          strstr(nightlora_last_error(), "only with peft"));
    CHECK(nightlora_sizeof("nightlora_merge_result") == sizeof(nightlora_merge_result));
}

static void test_errors(void) {
    CHECK(nightlora_abi_version() == NIGHTLORA_ABI_VERSION && nightlora_version()[0]);
    nightlora_mkmodel_params mk;
    nightlora_mkmodel_default_params(&mk);
    mk.arch = "gpt2";
    CHECK(nightlora_mkmodel("/tmp/never.gguf", &mk) == -1 && strstr(nightlora_last_error(), "arch 'gpt2'"));
    /* the types the CLI offers (it writes through this call): q4_0/q4_1 too, q5_0 not */
    char q4[4200];
    snprintf(q4, sizeof q4, "%s/q4_1.gguf", dir);
    nightlora_mkmodel_default_params(&mk);
    mk.type = "q4_1";
    CHECKF(nightlora_mkmodel(q4, &mk) == 0, "%s", nightlora_last_error());
    mk.type = "q5_0";
    CHECK(nightlora_mkmodel(q4, &mk) == -1 && strstr(nightlora_last_error(), "type 'q5_0'"));
    mk.arch = "gpt2";
    CHECK(nightlora_mkmodel("/tmp/never.gguf", &mk) == -1 && strstr(nightlora_last_error(), "arch 'gpt2'"));
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, fail_in_thread, NULL) == 0 && pthread_join(th, &ok) == 0 && ok);
    /* this thread's message is still its own */
    CHECK(strstr(nightlora_last_error(), "arch 'gpt2'") != NULL);
}

int main(void) {
    if (nl_t_tmpdir(dir, sizeof dir, "test_api")) return 1;
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(out, sizeof out, "%s/adapter.gguf", dir);
    nightlora_mkmodel_params mk;
    nightlora_mkmodel_default_params(&mk);
    CHECK(!strcmp(mk.arch, "qwen3") && !strcmp(mk.preset, "tiny") && !strcmp(mk.type, "f32"));
    mk.seed = 3;
    CHECKF(nightlora_mkmodel(model, &mk) == 0, "%s", nightlora_last_error());
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return nl_t_done();
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"note %d:\", \"completion\": \" %s\"}\n", i, i % 2 ? "odd" : "even");
    fclose(f);
    test_internal_defaults();
    test_train();
    test_validation();
    test_param_checks();
    test_train_features();
    test_infer();
    test_merge_export();
    test_errors();
    nl_t_tmpdir_done(dir);
    return nl_t_done();
}

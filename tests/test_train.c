/* nl_train as a library call, on tiny models of every arch:
 *  - bit-identical runs: same inputs → same per-step losses and adapter bytes, run to run,
 *    --threads 1 vs 2, backends ref and host, llama / qwen3 / qwen35; --act-budget-mb 0
 *    (every layer recomputed) equals a large budget;
 *  - --log-json: one object per step with step, loss, tokens, seconds, service_seconds,
 *    paused_seconds (and targets, lr, grad_norm), consistent with the result;
 *  - --dump-grads equals dLoss/dA, dLoss/dB of the first batch computed directly with
 *    nl_graph_seq (names and shapes: it loads as an adapter of the model); with a fresh adapter
 *    B = 0 so dA is exactly zero and dB is not; from an adapter with B != 0, dA is not zero;
 *  - --init-adapter: rank, alpha and targets come from the file; the first loss is the eval
 *    loss of that adapter (dropout off, one batch = the whole data);
 *  - --targets subsets; --epochs (whole and fractional) vs --steps; cosine and constant
 *    schedules with warmup (the logged lr is nl_lr_at exactly; no step at lr 0, the floor is
 *    0.1 * lr by default and reached after the last step); --steps 1 moves lora_b;
 *  - refusals: another model, lr, rank, data → named in the message; a fresh run into a dir
 *    with commits; commits untouched by a refused run;
 *  - pacing: a thread writes "3" then "0" into the thermal status file: the run pauses (the
 *    progress says so and gives the paused time apart, paused_seconds > 0) and resumes within
 *    the poll interval, and the adapter equals an unpaused run's;
 *  - an unwritable --out is refused before any training; truncated / dropped examples are
 *    reported at start;
 *  - --method mezo: the trainer's steps equal nl_mezo_step called directly on the same batches
 *    (adapter bytes, loss, projected_grad in the log); the run is deterministic;
 *  - energy: with a fake RAPL tree whose counter a thread advances, every log line has joules
 *    > 0 and joules_per_token = joules / tokens, and the start-up line names the counters; with
 *    no counter the start-up line says why and no line has "joules";
 *  - memory preflight (--mem-limit-mb): the estimate is printed; under a too-small limit the run
 *    is refused before training, naming --act-budget-mb / --ctx / --precision values, and with
 *    each suggested value it runs (under the same limit). */
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "data/dataset.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/quant.h"
#include "nn/lora.h"
#include "proj/host.h"
#include "train/graph.h"
#include "train/mezo.h"
#include "train/optim.h"
#include "train/trainer.h"
#include "train/trainer_hooks.h"
#include "util/json.h"
#include "util/util.h"

static char tmp[256];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

/* ---- inputs ---- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* prompt/completion notes, lengths varying */
static void write_notes(const char *path, int n, int variant) {
    static const char *tags[] = {"work", "family", "shopping", "travel", "health"};
    static const char *notes[] = {"Book the hotel for Friday",   "Call mum about the weekend", "Buy milk and eggs",
                                  "Send the report to the team", "Refill at the physio",       "Renew the passport",
                                  "Pick up the kids at five",    "Dentist at nine on Monday"};
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": \"Note: %s%s\\nTag:\", \"completion\": \" %s\"}\n", notes[(i + variant) % 8],
                i % 3 ? " please" : "", tags[(i * 3 + variant) % 5]);
    fclose(f);
}

static void defaults(nl_train_opts *o, const char *model, const char *data, const char *out) {
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
    o->proj.backend = "ref";
    o->proj.n_threads = 1;
}

static int train_hooked(const nl_train_opts *o, const nl_train_hooks *h, nl_train_result *r) {
    nl_train_result dummy;
    int rc = nl_train_hooked(o, h, r ? r : &dummy);
    if (rc) fprintf(stderr, "nl_train: %s\n", nl_last_error());
    return rc;
}

static int train(const nl_train_opts *o, nl_train_result *r) { return train_hooked(o, NULL, r); }

/* ---- the per-step log ---- */

#define MAXL 128
typedef struct {
    int n, bad;
    int64_t step[MAXL], tokens[MAXL], targets[MAXL];
    double loss[MAXL], seconds[MAXL], service[MAXL], paused[MAXL], lr[MAXL], gnorm[MAXL];
} steplog;

static int num(const nl_json *j, const char *key, double *out) {
    const nl_json *v = nl_json_get(j, key);
    if (!nl_json_is_number(v)) return -1;
    *out = v->u.num.d;
    return 0;
}

static void read_log(const char *path, steplog *L) {
    memset(L, 0, sizeof *L);
    size_t len;
    char *b = nl_t_slurp(path, &len);
    if (!b) {
        L->bad = 1;
        return;
    }
    for (char *p = b; p < b + len && L->n < MAXL;) {
        char *eol = memchr(p, '\n', (size_t)(b + len - p));
        if (!eol) {
            L->bad++;
            break;
        }
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        int i = L->n;
        if (nl_json_is_object(j) && !nl_json_int64(nl_json_get(j, "step"), &L->step[i]) &&
            !nl_json_int64(nl_json_get(j, "tokens"), &L->tokens[i]) &&
            !nl_json_int64(nl_json_get(j, "targets"), &L->targets[i]) && !num(j, "loss", &L->loss[i]) &&
            !num(j, "seconds", &L->seconds[i]) && !num(j, "service_seconds", &L->service[i]) &&
            !num(j, "paused_seconds", &L->paused[i]) && !num(j, "lr", &L->lr[i]) && !num(j, "grad_norm", &L->gnorm[i]))
            L->n++;
        else L->bad++;
        nl_json_free(j);
        p = eol + 1;
    }
    free(b);
}

static int same_losses(const steplog *a, const steplog *b) {
    if (a->n != b->n || a->bad || b->bad || a->n == 0) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->loss[i] != b->loss[i] || a->gnorm[i] != b->gnorm[i] || a->tokens[i] != b->tokens[i]) return 0;
    return 1;
}

/* ---- bit-identical runs ---- */

static void test_determinism(nl_arch arch) {
    char model[512], data[512], outs[5][512], logs[5][512];
    snprintf(model, sizeof model, "%s/det_%s.gguf", tmp, nl_arch_name(arch));
    path_of(data, sizeof data, "notes.jsonl");
    CHECK(nl_mkmodel(arch, "tiny", NL_TYPE_Q8_0, 3, model) == 0);
    for (int be = 0; be < 2; be++) {
        const char *backend = be ? "host" : "ref";
        /* 0, 1: threads 1 twice; 2: threads 2; 3: act budget 0; 4: threads 2, --overlap on (the
         * others: auto = synchronous for these CPU backends, LoRA split over the node pool) */
        for (int k = 0; k < 5; k++) {
            snprintf(outs[k], sizeof outs[k], "%s/det_%s_%s_%d.gguf", tmp, nl_arch_name(arch), backend, k);
            snprintf(logs[k], sizeof logs[k], "%s/det_%s_%s_%d.jsonl", tmp, nl_arch_name(arch), backend, k);
            nl_train_opts o;
            defaults(&o, model, data, outs[k]);
            o.proj.backend = backend;
            o.proj.n_threads = k == 2 || k == 4 ? 2 : 1;
            o.overlap = k == 4 ? "on" : k == 2 ? "auto" : NULL;
            o.act_budget_mb = k == 3 ? 0 : 1024;
            o.log_json = logs[k];
            CHECK(train(&o, NULL) == 0);
        }
        steplog L[5];
        for (int k = 0; k < 5; k++) read_log(logs[k], &L[k]);
        CHECKF(L[0].n == 4 && L[0].loss[0] > 0, "%s %s: %d steps", nl_arch_name(arch), backend, L[0].n);
        CHECKF(nl_t_same_file(outs[0], outs[1]) && same_losses(&L[0], &L[1]), "%s %s: run to run", nl_arch_name(arch),
               backend);
        CHECKF(nl_t_same_file(outs[0], outs[2]) && same_losses(&L[0], &L[2]), "%s %s: threads 1 vs 2",
               nl_arch_name(arch), backend);
        CHECKF(nl_t_same_file(outs[0], outs[3]) && same_losses(&L[0], &L[3]), "%s %s: act budget 0 vs 1024 MB",
               nl_arch_name(arch), backend);
        CHECKF(nl_t_same_file(outs[0], outs[4]) && same_losses(&L[0], &L[4]), "%s %s: --overlap on vs off",
               nl_arch_name(arch), backend);
        /* training moved the adapter: the losses are not all equal */
        CHECK(L[0].loss[0] != L[0].loss[3] || L[0].loss[1] != L[0].loss[2]);
    }
}

/* One graph call for all sequences of a step (one service request per projection for their
 * ΣT rows) against one call per sequence (the per_sequence hook): the same adapter bytes and
 * per-step losses, with dropout, on every architecture (attention restarts at each boundary,
 * qwen35's GDN state and conv too), on ref, on host FP32 (--precision f32, compute f32) and on
 * host's default compute (its rows do not depend on the request's size either: any_T). */
static void test_packing(nl_arch arch) {
    char model[512], data[512], outs[2][512], logs[2][512];
    snprintf(model, sizeof model, "%s/pk_%s.gguf", tmp, nl_arch_name(arch));
    path_of(data, sizeof data, "notes.jsonl");
    CHECK(nl_mkmodel(arch, "tiny", NL_TYPE_Q8_0, 7, model) == 0);
    for (int c = 0; c < 3; c++) {
        steplog L[2];
        for (int k = 0; k < 2; k++) {
            snprintf(outs[k], sizeof outs[k], "%s/pk_%s_%d_%d.gguf", tmp, nl_arch_name(arch), c, k);
            snprintf(logs[k], sizeof logs[k], "%s/pk_%s_%d_%d.jsonl", tmp, nl_arch_name(arch), c, k);
            nl_train_opts o;
            defaults(&o, model, data, outs[k]);
            o.proj.backend = c ? "host" : "ref";
            o.proj.precision = c == 1 ? "f32" : NULL;
            o.proj.compute = c == 1 ? "f32" : NULL;
            o.proj.n_threads = 2;
            o.batch_tokens = 120; /* several notes a step */
            o.steps = 3;
            o.act_budget_mb = c == 2 ? 0 : 1024; /* and with recompute */
            o.log_json = logs[k];
            nl_train_hooks h = {.per_sequence = k};
            CHECK(train_hooked(&o, &h, NULL) == 0);
            read_log(logs[k], &L[k]);
        }
        CHECKF(L[0].n == 3 && L[0].tokens[0] > 60, "%s %d: %d steps, %lld tokens in the first", nl_arch_name(arch), c,
               L[0].n, (long long)L[0].tokens[0]);
        CHECKF(nl_t_same_file(outs[0], outs[1]) && same_losses(&L[0], &L[1]),
               "%s config %d: packed step vs one call a sequence", nl_arch_name(arch), c);
    }
}

/* --overlap: auto is synchronous exactly for the CPU backends; bad values are refused. */
static void test_overlap_mode(const char *model, const char *data) {
    nl_train_opts o;
    defaults(&o, model, data, "/tmp/unused.gguf");
    o.proj.backend = "host";
    CHECK(nl_train_sync_mode(&o) == 1);
    o.proj.backend = "ref";
    CHECK(nl_train_sync_mode(&o) == 1);
    o.proj.backend = NULL; /* the default backend is ref */
    CHECK(nl_train_sync_mode(&o) == 1);
    nl_proj_backend accel = nl_proj_backend_ref;
    accel.name = "npu";
    o.proj.backend_impl = &accel;
    CHECK(nl_train_sync_mode(&o) == 0);
    o.overlap = "off";
    CHECK(nl_train_sync_mode(&o) == 1);
    o.proj.backend_impl = NULL;
    o.overlap = "on";
    CHECK(nl_train_sync_mode(&o) == 0);
    o.overlap = "auto";
    CHECK(nl_train_sync_mode(&o) == 1);
    o.overlap = "sometimes";
    nl_train_result r;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "--overlap sometimes"));
}

/* ---- --log-json ---- */

static void test_log_json(const char *model, const char *data) {
    char out[512], log[512];
    path_of(out, sizeof out, "log.gguf");
    path_of(log, sizeof log, "log.jsonl");
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.steps = 6;
    o.log_json = log;
    nl_train_result r;
    CHECK(train(&o, &r) == 0);
    steplog L;
    read_log(log, &L);
    CHECKF(L.n == 6 && L.bad == 0, "%d lines, %d without every key", L.n, L.bad);
    int64_t tok = 0;
    for (int i = 0; i < L.n; i++) {
        CHECK(L.step[i] == i + 1);
        CHECK(L.tokens[i] > 0 && L.tokens[i] <= 48 + 64 && L.targets[i] > 0 && L.targets[i] < L.tokens[i]);
        CHECK(L.seconds[i] > 0 && L.service[i] >= 0 && L.service[i] <= L.seconds[i] + 1e-3 && L.paused[i] == 0);
        CHECK(isfinite(L.loss[i]) && L.loss[i] > 0 && L.gnorm[i] > 0);
        tok += L.tokens[i];
    }
    CHECK(tok == r.tokens);
    CHECK(r.steps_done == 6 && r.total_steps == 6 && !r.stopped);
    CHECK(L.loss[0] == r.first_loss && L.loss[5] == r.last_loss);
    /* a fresh run into the same log path starts it over */
    o.steps = 2;
    CHECK(train(&o, NULL) == 0);
    read_log(log, &L);
    CHECK(L.n == 2);
}

/* ---- --dump-grads ---- */

/* The trainer's first batch and its gradients, computed here with the same parts. */
static int direct_grads(const char *model, const char *data, const nl_train_opts *o, const char *init, float **grads,
                        size_t *n) {
    nl_session s;
    if (nl_session_open(&s, model, NULL, NL_T_REF_CFG)) return -1;
    nl_adapter *ad = init ? nl_adapter_load(s.m, init) : nl_adapter_new(s.m, o->targets, o->rank, o->alpha, o->seed);
    nl_dataset ds;
    nl_packing pk;
    static const int buckets[] = {16, 64, 256, 1024, 4096};
    int ctx = s.m->hp.n_ctx_train < 4096 ? s.m->hp.n_ctx_train : 4096;
    if (!ad || nl_dataset_load(data, s.tok, NULL, &ds)) return -1;
    if (nl_pack(&ds, buckets, 5, ctx, NL_OVERLONG_TRUNCATE, &pk)) return -1;
    nl_batcher *b = nl_batcher_new(&pk, o->seed, o->shuffle, o->batch_tokens);
    const int *idx;
    int nseq;
    if (!b || nl_batcher_next(b, &idx, &nseq)) return -1;
    s.rt.adapter = ad;
    *n = ad->n_params;
    *grads = calloc(ad->n_params, sizeof(float));
    nl_graph g = {.rt = &s.rt,
                  .ad = ad,
                  .grads = *grads,
                  .dropout = o->dropout,
                  .seed = o->seed,
                  .step = 1,
                  .act_budget = UINT64_MAX};
    int64_t nt = 0;
    for (int i = 0; i < nseq; i++) nt += pk.seq[idx[i]].n_targets;
    int rc = 0;
    for (int i = 0; i < nseq && !rc; i++) {
        const nl_seq *sq = &pk.seq[idx[i]];
        int32_t *rows = malloc((size_t)sq->n_tokens * sizeof *rows);
        nl_row_targets(sq->ids, sq->target, sq->n_tokens, rows);
        double ls;
        rc = nl_graph_seq(&g, sq->ids, rows, sq->n_tokens, 1.0f / (float)nt, &ls);
        g.tok_base += sq->n_tokens;
        free(rows);
    }
    nl_batcher_free(b);
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
    s.rt.adapter = NULL;
    nl_adapter_free(ad);
    nl_session_close(&s);
    return rc;
}

/* Checks a dump against the direct gradients; returns (via *a_zero) whether every dA is 0. */
static void check_dump(const char *model, const char *dump, const float *want, size_t n, int *a_zero, int *b_zero,
                       const char *what) {
    nl_model *m = nl_model_load(model);
    nl_adapter *g = m ? nl_adapter_load(m, dump) : NULL; /* names and shapes of an adapter of m */
    CHECKF(g != NULL, "%s: the dump does not load as an adapter: %s", what, nl_last_error());
    if (!g) {
        nl_model_free(m);
        return;
    }
    CHECKF(g->n_params == n && !memcmp(g->params, want, n * sizeof(float)),
           "%s: dumped gradients differ from nl_graph_seq's", what);
    int fin = 1;
    *a_zero = *b_zero = 1;
    for (int i = 0; i < g->n; i++) {
        const float *A = nl_lora_A(g, i), *B = nl_lora_B(g, i);
        for (int64_t j = 0; j < g->t[i].rank * g->t[i].n_in; j++) {
            fin &= isfinite(A[j]) != 0;
            *a_zero &= A[j] == 0.0f;
        }
        for (int64_t j = 0; j < g->t[i].rank * g->t[i].n_out; j++) {
            fin &= isfinite(B[j]) != 0;
            *b_zero &= B[j] == 0.0f;
        }
    }
    CHECKF(fin, "%s: non-finite gradients", what);
    nl_adapter_free(g);
    nl_model_free(m);
}

static void test_dump_grads_and_init(const char *model, const char *data) {
    char out[512], dump[512], init[512], log[512];
    path_of(out, sizeof out, "dump.gguf");
    path_of(dump, sizeof dump, "grads.gguf");
    path_of(init, sizeof init, "init.gguf");
    path_of(log, sizeof log, "init.jsonl");
    /* fresh adapter: B = 0, so dL/dA = (α/r)·Bᵀ(...) is exactly 0 and dL/dB is not */
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.steps = 2;
    o.dump_grads = dump;
    CHECK(train(&o, NULL) == 0);
    float *want = NULL;
    size_t n = 0;
    CHECK(direct_grads(model, data, &o, NULL, &want, &n) == 0);
    int az, bz;
    check_dump(model, dump, want, n, &az, &bz, "fresh");
    CHECKF(az && !bz, "fresh adapter: dA all zero %d (expected 1), dB all zero %d (expected 0)", az, bz);
    free(want);

    /* an adapter with B != 0, rank 3, alpha 6, on q and v only */
    defaults(&o, model, data, init);
    o.targets = "q,v";
    o.rank = 3;
    o.alpha = 6.0f;
    o.steps = 3;
    o.lr = 1e-2;
    CHECK(train(&o, NULL) == 0);
    /* continue from it: rank/alpha/targets from the file (o.rank etc. are ignored) */
    defaults(&o, model, data, out);
    o.init_adapter = init;
    o.dropout = 0.0f;
    o.shuffle = 0;
    o.batch_tokens = 1 << 20; /* one batch = the whole data */
    o.steps = 1;
    o.dump_grads = dump;
    o.log_json = log;
    nl_train_result r;
    CHECK(train(&o, &r) == 0);
    CHECK(direct_grads(model, data, &o, init, &want, &n) == 0);
    check_dump(model, dump, want, n, &az, &bz, "from --init-adapter");
    CHECKF(!az && !bz, "init adapter: dA all zero %d, dB all zero %d (expected 0, 0)", az, bz);
    free(want);
    /* the first loss is the eval loss of the init adapter on the same data */
    nl_session s;
    CHECK(nl_session_open(&s, model, init, NL_T_REF_CFG) == 0);
    nl_dataset ds;
    CHECK(nl_dataset_load(data, s.tok, NULL, &ds) == 0);
    nl_eval_result er;
    CHECK(nl_eval_dataset(&s.rt, &ds, 2048, &er) == 0);
    double with = nl_eval_loss(&er);
    s.rt.adapter = NULL;
    CHECK(nl_eval_dataset(&s.rt, &ds, 2048, &er) == 0);
    double base = nl_eval_loss(&er);
    CHECKF(fabs(r.first_loss - with) <= 1e-5 * with, "first loss %.9g vs eval loss of the init adapter %.9g",
           r.first_loss, with);
    CHECKF(fabs(base - with) > 1e-3, "the init adapter should change the loss (%.9g vs base %.9g)", with, base);
    nl_dataset_free(&ds);
    /* the written adapter has the init's shape */
    nl_adapter *a = nl_adapter_load(s.m, out);
    CHECK(a && a->rank == 3 && a->alpha == 6.0f && a->n == 2 * s.m->hp.n_layer);
    for (int i = 0; a && i < a->n; i++) {
        nl_proj_kind k = s.m->projs[a->t[i].proj].kind;
        CHECK(k == NL_P_Q || k == NL_P_V);
    }
    nl_adapter_free(a);
    nl_session_close(&s);
}

/* ---- --targets, --epochs, schedules ---- */

static void test_targets(const char *model, const char *data) {
    char out[512];
    path_of(out, sizeof out, "targets.gguf");
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.targets = "gate,down";
    o.steps = 1;
    CHECK(train(&o, NULL) == 0);
    nl_model *m = nl_model_load(model);
    nl_adapter *a = m ? nl_adapter_load(m, out) : NULL;
    CHECK(a && a->n == 2 * m->hp.n_layer);
    for (int i = 0; a && i < a->n; i++) {
        nl_proj_kind k = m->projs[a->t[i].proj].kind;
        CHECK(k == NL_P_GATE || k == NL_P_DOWN);
    }
    nl_adapter_free(a);
    nl_model_free(m);
    o.targets = "q,qq";
    nl_train_result r;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "qq"));

    /* A tied head (this model has no output.weight): --targets output is refused before any
     * step, with the reason, and nothing is written; so is an --init-adapter that adapts it. */
    remove(out);
    o.targets = "q,output";
    CHECK(nl_train(&o, &r) == -1);
    CHECKF(strstr(nl_last_error(), "--targets output: ") &&
               strstr(nl_last_error(), "ties its output head to token_embd.weight") &&
               strstr(nl_last_error(), "llama.cpp") && strstr(nl_last_error(), "merge"),
           "%s", nl_last_error());
    CHECK(access(out, F_OK) != 0);
    char init[512];
    path_of(init, sizeof init, "tied-head-init.gguf");
    m = nl_model_load(model);
    a = m ? nl_adapter_new(m, "output", 2, 4.0f, 1) : NULL; /* the library can make one; train won't take it */
    CHECK(m && m->tied_head && a && nl_adapter_save(a, m, init) == 0);
    nl_adapter_free(a);
    nl_model_free(m);
    o.targets = NULL;
    o.init_adapter = init;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "adapts the output head, which this model ties"));
    o.init_adapter = NULL;

    /* The same model with its own output.weight (a copy of the embedding): the head adapter is
     * written as output.weight.lora_a/b, which merge takes. */
    char untied[512], merged[512];
    path_of(untied, sizeof untied, "untied.gguf");
    path_of(merged, sizeof merged, "untied-merged.gguf");
    CHECK(nl_t_untie(model, untied) == 0);
    o.model = untied;
    o.targets = "output";
    CHECK(train(&o, NULL) == 0);
    nl_gguf *ga = nl_gguf_open(out);
    CHECK(ga && nl_gguf_tensor_find(ga, "output.weight.lora_a") && nl_gguf_tensor_find(ga, "output.weight.lora_b") &&
          !nl_gguf_tensor_find(ga, "token_embd.weight.lora_a") && ga->n_tensors == 2);
    nl_gguf_close(ga);
    m = nl_model_load(untied);
    a = m ? nl_adapter_load(m, out) : NULL;
    CHECK(m && !m->tied_head && a && a->n == 1 && nl_merge(m, a, -1, merged) == 0);
    nl_adapter_free(a);
    nl_model_free(m);
}

static void test_epochs(const char *model) {
    /* 10 tokens lines of 8 tokens, batch 16 tokens: 2 sequences a batch, 5 batches an epoch */
    char data[512], out[512], log[512];
    path_of(data, sizeof data, "tokens.jsonl");
    path_of(out, sizeof out, "epochs.gguf");
    path_of(log, sizeof log, "epochs.jsonl");
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 10; i++) {
        fprintf(f, "{\"tokens\": [");
        for (int t = 0; t < 8; t++) fprintf(f, "%s%d", t ? ", " : "", 5 + (i * 37 + t * 11) % 400);
        fprintf(f, "]}\n");
    }
    fclose(f);
    struct {
        double epochs;
        int steps, want;
    } cases[] = {{2, 0, 10}, {1.5, 0, 8}, {0.3, 0, 2}, {1, 7, 7}, {1, 0, 5}};
    for (int c = 0; c < 5; c++) {
        for (int sh = 0; sh < 2; sh++) {
            nl_train_opts o;
            defaults(&o, model, data, out);
            o.batch_tokens = 16;
            o.epochs = cases[c].epochs;
            o.steps = cases[c].steps;
            o.shuffle = sh;
            o.log_json = log;
            nl_train_result r;
            CHECK(train(&o, &r) == 0);
            CHECKF(r.total_steps == cases[c].want && r.steps_done == cases[c].want,
                   "epochs %g steps %d: %lld steps, expected %d", cases[c].epochs, cases[c].steps,
                   (long long)r.total_steps, cases[c].want);
            steplog L;
            read_log(log, &L);
            CHECK(L.n == cases[c].want);
            int ok = 1;
            for (int i = 0; i < L.n; i++) ok &= L.tokens[i] == 16 && L.targets[i] == 14;
            CHECK(ok);
            CHECK(r.tokens == 16 * cases[c].want);
        }
    }
}

static void test_schedule(const char *model, const char *data) {
    char out[512], log[512];
    path_of(out, sizeof out, "sched.gguf");
    path_of(log, sizeof log, "sched.jsonl");
    for (int cos = 0; cos < 3; cos++) {
        nl_train_opts o;
        defaults(&o, model, data, out);
        o.steps = 6;
        o.warmup = 2;
        o.cosine = cos > 0;
        o.lr = 1e-3;
        if (cos == 2) o.lr_min = 0; /* an explicit floor of 0: still no step at 0 */
        o.log_json = log;
        CHECK(train(&o, NULL) == 0);
        steplog L;
        read_log(log, &L);
        CHECK(L.n == 6);
        /* the default floor is 0.1 * lr */
        nl_schedule s = {
            .kind = cos ? NL_LR_COSINE : NL_LR_CONSTANT, .lr = 1e-3, .warmup_steps = 2, .lr_min = cos == 2 ? 0 : 1e-4};
        for (int i = 0; i < L.n; i++)
            CHECKF(L.lr[i] == nl_lr_at(&s, i + 1, 6), "%d step %d: lr %.17g", cos, i + 1, L.lr[i]);
        CHECK(L.lr[0] == 5e-4 && L.lr[1] == 1e-3);
        if (cos) {
            /* steps 3..6 decay over p = 0, 1/4, 2/4, 3/4; the floor would be step 7's */
            double lo = cos == 2 ? 0 : 1e-4;
            CHECK(L.lr[2] == 1e-3);
            CHECK_NEAR(L.lr[4], lo + (1e-3 - lo) * 0.5, 1e-18);
            CHECK(L.lr[3] < L.lr[2] && L.lr[4] < L.lr[3] && L.lr[5] < L.lr[4] && L.lr[5] > lo);
        } else {
            CHECK(L.lr[2] == 1e-3 && L.lr[5] == 1e-3);
        }
    }
    /* a floor above the peak is refused */
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.lr = 1e-3;
    o.lr_min = 2e-3;
    CHECK(nl_train(&o, &(nl_train_result){0}) != 0 && strstr(nl_last_error(), "--lr-min"));
}

/* --steps 1 trains: the one step gets the peak rate (it had lr 0 when the cosine reached its
 * floor at the last step), so lora_b, zero in a fresh adapter, is not zero afterwards. */
static void test_one_step(const char *model, const char *data) {
    char out[512];
    path_of(out, sizeof out, "onestep.gguf");
    for (int cos = 0; cos < 2; cos++) {
        nl_train_opts o;
        defaults(&o, model, data, out);
        o.steps = 1;
        o.cosine = cos;
        o.dropout = 0;
        nl_train_result r;
        CHECK(train(&o, &r) == 0 && r.steps_done == 1);
        nl_session s;
        CHECK(nl_session_open(&s, model, NULL, NL_T_REF_CFG) == 0);
        nl_adapter *ad = nl_adapter_load(s.m, out);
        CHECK(ad != NULL);
        size_t nz = 0, nb = 0;
        for (int i = 0; ad && i < ad->n; i++) {
            const float *B = nl_lora_B(ad, i);
            for (int64_t j = 0; j < ad->t[i].n_out * ad->rank; j++) nz += B[j] != 0.0f;
            nb += (size_t)(ad->t[i].n_out * ad->rank);
        }
        CHECKF(nz > nb / 2, "%s: %zu of %zu lora_b values moved", cos ? "cosine" : "constant", nz, nb);
        nl_adapter_free(ad);
        nl_session_close(&s);
    }
}

static void test_refusals(const char *model, const char *data) {
    char out[512], ck[512], model2[512], data2[512], log[512], commit[600], runjson[600];
    path_of(out, sizeof out, "refuse.gguf");
    path_of(ck, sizeof ck, "ck_refuse");
    path_of(model2, sizeof model2, "other_model.gguf");
    path_of(data2, sizeof data2, "other_data.jsonl");
    path_of(log, sizeof log, "refuse.jsonl");
    snprintf(commit, sizeof commit, "%s/commit-2.nlck", ck);
    snprintf(runjson, sizeof runjson, "%s/run.json", ck);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 99, model2) == 0);
    write_notes(data2, 12, 3);
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.steps = 5;
    o.checkpoint_dir = ck;
    o.stop_after = 2;
    o.log_json = log;
    nl_train_result r;
    CHECK(train(&o, &r) == 0 && r.stopped && r.steps_done == 2);
    size_t len0;
    char *before = nl_t_slurp(commit, &len0);
    CHECK(before != NULL);
    o.stop_after = 0;
    o.resume = 1;
    struct {
        const char *what, *needle1, *needle2;
    } cases[] = {
        {"model", "model ", "other_model.gguf"},
        {"dropout", "dropout 0.1 there, 0.2 now", NULL},
        {"rank", "rank 4 there, 8 now", NULL},
        {"data", "data ", "other_data.jsonl"},
        {"seed+clip", "seed 42 there, 7 now", "clip 1 there, 0.5 now"},
    };
    for (int c = 0; c < 5; c++) {
        nl_train_opts b = o;
        if (c == 0) b.model = model2;
        if (c == 1) b.dropout = 0.2f;
        if (c == 2) b.rank = 8;
        if (c == 3) b.data = data2;
        if (c == 4) {
            b.seed = 7;
            b.clip = 0.5;
        }
        int rc = nl_train(&b, &r);
        const char *e = nl_last_error();
        CHECKF(rc == -1 && strstr(e, "cannot resume") && strstr(e, cases[c].needle1) &&
                   (!cases[c].needle2 || strstr(e, cases[c].needle2)),
               "%s: rc %d, message: %s", cases[c].what, rc, e);
        if (c == 1) printf("refused resume: %s\n", e);
    }
    /* a fresh run into the directory */
    o.resume = 0;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "already holds commits"));
    size_t len1;
    char *after = nl_t_slurp(commit, &len1);
    CHECK(after && len0 == len1 && !memcmp(before, after, len0));
    free(before);
    free(after);
    /* the right settings still resume, to the end; another backend is other kernels: refused,
     * then continued with allow_kernel_change, which warns (its numerics differ from the run so far) */
    o.resume = 1;
    o.proj.backend = "host";
    CHECKF(train(&o, &r) == -1 && strstr(nl_last_error(), "--allow-kernel-change"), "another backend: %s",
           nl_last_error());
    o.allow_kernel_change = 1;
    FILE *prog = tmpfile();
    o.progress = o.warnings = prog; /* the warnings too: the test reads both */
    CHECK(train(&o, &r) == 0 && r.steps_done == 5 && !r.stopped);
    long sz = ftell(prog);
    char *text = calloc(1, (size_t)sz + 1);
    rewind(prog);
    CHECK(fread(text, 1, (size_t)sz, prog) == (size_t)sz);
    fclose(prog);
    CHECKF(strstr(text, "warning: resuming with other numerics (backend ref there, host now)") &&
               strstr(text, "resumed from ") && strstr(text, "at step 2/5"),
           "progress: %s", text);
    /* training keeps the paper's precision policy, and says so */
    CHECKF(strstr(text, "precision: auto (attn, mlp, head -> q8_0, recurrent -> f16; embed and quantized GGUF tensors "
                        "as stored)\n"),
           "progress: %s", text);
    free(text);
    steplog L;
    read_log(log, &L);
    CHECK(L.n == 5 && L.bad == 0);
    o.progress = NULL;
    /* without run.json the commit's hashes still refuse */
    unlink(runjson);
    {
        nl_train_opts b = o;
        b.seed = 7;
        CHECK(nl_train(&b, &r) == -1 && strstr(nl_last_error(), "different training configuration"));
    }
}

/* ---- pacing ---- */

typedef struct {
    const char *status, *log;
    double hot_s;
    int wrote_hot;
} pacing_ctx;

static void write_status(const char *path, const char *v) {
    char t[600];
    snprintf(t, sizeof t, "%s.tmp", path);
    write_text(t, v);
    rename(t, path);
}

static void *pacing_thread(void *arg) {
    pacing_ctx *c = arg;
    double t0 = nl_now();
    while (nl_t_count_lines(c->log) < 2 && nl_now() - t0 < 20) nl_t_sleep(0.002);
    /* a garbled reading first: a warning, not the end of the run */
    write_status(c->status, "hot\n");
    nl_t_sleep(0.05);
    write_status(c->status, "3\n");
    c->wrote_hot = 1;
    nl_t_sleep(c->hot_s);
    write_status(c->status, "0\n");
    return NULL;
}

static void test_pacing(const char *model, const char *data) {
    char out[512], out0[512], log[512], status[512];
    path_of(out, sizeof out, "paced.gguf");
    path_of(out0, sizeof out0, "unpaced.gguf");
    path_of(log, sizeof log, "paced.jsonl");
    path_of(status, sizeof status, "thermal_status");
    write_status(status, "0\n");
    unlink(log);
    nl_train_opts o;
    defaults(&o, model, data, out0);
    o.steps = 40;
    CHECK(train(&o, NULL) == 0);
    FILE *prog = tmpfile();
    o.out = out;
    o.log_json = log;
    o.thermal = "auto";
    o.thermal_status_file = status;
    o.pacing_poll_s = 0.02;
    o.progress = o.warnings = prog; /* the warnings too: the test reads both */
    pacing_ctx c = {.status = status, .log = log, .hot_s = 0.5};
    pthread_t th;
    pthread_create(&th, NULL, pacing_thread, &c);
    nl_train_result r;
    int rc = train(&o, &r);
    pthread_join(th, NULL);
    CHECK(rc == 0 && c.wrote_hot);
    steplog L;
    read_log(log, &L);
    double sum = 0;
    int paused_steps = 0;
    for (int i = 0; i < L.n; i++) {
        sum += L.paused[i];
        paused_steps += L.paused[i] > 0;
    }
    /* no tight timing bounds: the machine may be loaded (the status is hot for 0.5 s) */
    CHECKF(r.paused_seconds > 0.05 && r.paused_seconds < 30.0, "paused %.3f s (status hot for 0.5 s)",
           r.paused_seconds);
    CHECKF(fabs(sum - r.paused_seconds) < 1e-3 && paused_steps >= 1, "log paused_seconds sum %.4f over %d steps", sum,
           paused_steps);
    /* the paused steps' rows say why (the status file: thermal), the others say nothing */
    char *lt = nl_t_slurp(log, NULL);
    int n_kind = 0, n_other = 0;
    for (const char *q = lt; q && (q = strstr(q, "\"pause_kind\": ")); q++) {
        n_kind++;
        n_other += strncmp(q + 14, "\"thermal\"", 9) != 0;
    }
    free(lt);
    CHECKF(n_kind == paused_steps && n_other == 0, "%d rows with pause_kind (%d not thermal), %d paused steps", n_kind,
           n_other, paused_steps);
    fflush(prog);
    long sz = ftell(prog);
    char *text = calloc(1, (size_t)sz + 1);
    rewind(prog);
    CHECK(fread(text, 1, (size_t)sz, prog) == (size_t)sz);
    fclose(prog);
    CHECK(strstr(text, "paused: thermal status 3") && strstr(text, "resumed after"));
    CHECK(strstr(text, "warning: pacing: ") && strstr(text, "training on without this reading"));
    CHECK(strstr(text, "  paused\n") && strstr(text, "  running\n") && strstr(text, " tok/s  ETA "));
    /* the paused figure, apart from tokens/s and the ETA (which leave it out): the run's total so
     * far on every line after the pause */
    const char *pf = strstr(text, "  paused 0.");
    if (!pf) pf = strstr(text, "  paused 1.");
    CHECKF(pf != NULL, "no 'paused N.Ns' figure in the progress lines");
    printf("pacing: paused %.2f s over %d step(s)\n", r.paused_seconds, paused_steps);
    free(text);
    /* a pause changes nothing in the result */
    CHECK(nl_t_same_file(out, out0));
}

/* ---- start-up checks ---- */

static void test_startup(const char *model, const char *data) {
    char log[512], out[512], tdata[512];
    path_of(log, sizeof log, "never.jsonl");
    nl_train_opts o;
    defaults(&o, model, data, "/nonexistent-dir/adapter.gguf");
    o.log_json = log;
    nl_train_result r;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "/nonexistent-dir/adapter.gguf") &&
          strstr(nl_last_error(), "cannot write"));
    CHECK(r.steps_done == 0); /* refused before the first step */
    struct stat st;
    CHECK(stat(log, &st) != 0);
    o.out = tmp; /* a directory */
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "is a directory"));
    path_of(out, sizeof out, "ok.gguf");
    o.out = out;
    o.dump_grads = "/nonexistent-dir/g.gguf";
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "--dump-grads"));
    /* truncated and dropped examples are reported before training */
    path_of(tdata, sizeof tdata, "long.jsonl");
    FILE *f = fopen(tdata, "w");
    fprintf(f, "{\"tokens\": [1, 2, 3, 4, 5, 6]}\n");
    fprintf(f, "{\"tokens\": [");
    for (int i = 0; i < 30; i++) fprintf(f, "%s%d", i ? ", " : "", 10 + i);
    fprintf(f, "]}\n{\"tokens\": [");
    for (int i = 0; i < 30; i++) fprintf(f, "%s%d", i ? ", " : "", 50 + i);
    fprintf(f, "], \"loss_mask\": [");
    for (int i = 0; i < 30; i++) fprintf(f, "%s%d", i ? ", " : "", i >= 25);
    fprintf(f, "]}\n");
    fclose(f);
    defaults(&o, model, tdata, out);
    o.max_ctx = 16;
    o.steps = 1;
    FILE *prog = tmpfile();
    o.progress = o.warnings = prog; /* the warnings too: the test reads both */
    CHECK(train(&o, &r) == 0);
    long sz = ftell(prog);
    char *text = calloc(1, (size_t)sz + 1);
    rewind(prog);
    CHECK(fread(text, 1, (size_t)sz, prog) == (size_t)sz);
    fclose(prog);
    CHECKF(strstr(text, "3 examples, 2 sequences (1 truncated to 16 tokens, 1 dropped"), "progress: %s", text);
    free(text);
    /* the service line says how the step computes: the attention follows the host's compute
     * mode (bf16 where auto picks it, f32 when asked), synchronous on the CPU */
    /* what auto picks on this CPU (amx where usable or NL_AMX=emulate, bf16 on AVX512_BF16 but
     * Intel's, else f32) and what the line says for it */
    void *hctx = NULL;
    CHECK(nl_proj_backend_host.init(&hctx, 1, NULL) == 0);
    const char *mode = hctx ? nl_proj_host_compute(hctx) : "f32";
    static const struct {
        const char *mode, *svc, *nodes;
    } lines[] = {
        {"f32", "f32 compute (", "synchronous, attention f32"},
        {"bf16", "bf16 compute (", "synchronous, attention bf16"},
        {"amx", "amx-bf16 for attn/mlp/head", "synchronous, attention and lora on amx tiles"},
        {"amx-emu", "amx-bf16 (emulated) for attn/mlp/head", "synchronous, attention and lora on amx-emu tiles"},
    };
    int auto_line = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(mode, lines[i].mode)) auto_line = i;
    CHECKF(auto_line >= 0, "auto compute mode %s", mode);
    if (auto_line < 0) auto_line = 0;
    /* bf16 compute keeps the FP32 attention where its BF16 pieces do not exist (an Arm core: the
     * backend's nodes say so), and the line says "attention f32" there */
    const struct nl_amx_tiles *node_tiles = NULL;
    int node_bf16 = 0;
    if (hctx) nl_proj_backend_host.nodes(hctx, &node_tiles, &node_bf16);
    const char *auto_nodes = auto_line == 1 && !node_bf16 ? lines[0].nodes : lines[auto_line].nodes;
    nl_proj_backend_host.free(hctx);
    /* the LoRA products follow the service into BF16 at rank 16 where the pair exists (nn/lora.h),
     * and the line says so; rank 4 (defaults) stays FP32 */
    const int lora_bf16 = auto_line == 1 && node_bf16 && nl_lora_bf16_runs(16);
    for (int c = 0; c < 3; c++) { /* auto, f32, auto at rank 16 */
        defaults(&o, model, data, out);
        o.steps = 1;
        o.proj.backend = "host";
        o.proj.compute = c == 1 ? "f32" : NULL;
        if (c == 2) o.rank = 16;
        prog = tmpfile();
        o.progress = o.warnings = prog; /* the warnings too: the test reads both */
        CHECK(train(&o, &r) == 0);
        sz = ftell(prog);
        text = calloc(1, (size_t)sz + 1);
        rewind(prog);
        CHECK(fread(text, 1, (size_t)sz, prog) == (size_t)sz);
        fclose(prog);
        const int li = c == 1 ? 0 : auto_line;
        CHECKF(strstr(text, lines[li].svc) && strstr(text, c == 1 ? lines[0].nodes : auto_nodes), "progress (%s): %s",
               c == 1 ? "f32" : mode, text);
        CHECKF(!strstr(text, ", lora bf16") == !(c == 2 && lora_bf16), "progress (%s, rank %d, lora bf16 %d): %s",
               c == 1 ? "f32" : mode, o.rank, lora_bf16, text);
        free(text);
    }
}

/* ---- MeZO ---- */

static void test_mezo(const char *model, const char *data) {
    char out[512], out2[512], log[512];
    path_of(out, sizeof out, "mezo.gguf");
    path_of(out2, sizeof out2, "mezo2.gguf");
    path_of(log, sizeof log, "mezo.jsonl");
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.method = "mezo";
    o.mezo_eps = 1e-3;
    o.lr = 1e-3;
    o.steps = 3;
    o.warmup = 1;
    o.log_json = log;
    nl_train_result r;
    CHECK(train(&o, &r) == 0 && r.steps_done == 3);
    o.out = out2;
    o.log_json = NULL;
    CHECK(train(&o, NULL) == 0 && nl_t_same_file(out, out2)); /* deterministic */
    /* the same three steps, directly */
    nl_session s;
    CHECK(nl_session_open(&s, model, NULL, NL_T_REF_CFG) == 0);
    nl_adapter *ad = nl_adapter_new(s.m, NULL, o.rank, o.alpha, o.seed);
    nl_dataset ds;
    nl_packing pk;
    static const int bk[] = {16, 64, 256, 1024, 4096};
    CHECK(ad && nl_dataset_load(data, s.tok, NULL, &ds) == 0);
    CHECK(nl_pack(&ds, bk, 5, s.m->hp.n_ctx_train < 4096 ? s.m->hp.n_ctx_train : 4096, NL_OVERLONG_TRUNCATE, &pk) == 0);
    nl_batcher *b = nl_batcher_new(&pk, o.seed, o.shuffle, o.batch_tokens);
    s.rt.adapter = ad;
    nl_graph g = {.rt = &s.rt, .ad = ad, .grads = NULL, .dropout = o.dropout, .seed = o.seed};
    nl_schedule sch = {.kind = NL_LR_COSINE, .lr = o.lr, .warmup_steps = 1, .lr_min = 0.1 * o.lr};
    steplog L;
    read_log(log, &L);
    CHECK(L.n == 3);
    size_t len;
    char *text = nl_t_slurp(log, &len);
    int ok = 1;
    for (int st = 1; st <= 3 && b; st++) {
        const int *idx;
        int n;
        CHECK(nl_batcher_next(b, &idx, &n) == 0);
        nl_mezo_cfg c;
        nl_mezo_defaults(&c);
        c.eps = 1e-3;
        c.lr = nl_lr_at(&sch, st, 3);
        c.seed = o.seed;
        nl_mezo_result mr;
        CHECK(nl_mezo_step(&g, &c, st, pk.seq, idx, n, &mr) == 0);
        CHECKF(L.loss[st - 1] == mr.loss, "step %d: logged loss %.17g, direct %.17g", st, L.loss[st - 1], mr.loss);
        char want[64];
        snprintf(want, sizeof want, "\"projected_grad\": %.17g", mr.proj_grad);
        ok &= text && strstr(text, want) != NULL;
    }
    CHECKF(ok, "projected_grad in the log differs from nl_mezo_step's");
    free(text);
    nl_adapter *a = nl_adapter_load(s.m, out);
    CHECKF(a && a->n_params == ad->n_params && !memcmp(a->params, ad->params, ad->n_params * sizeof(float)),
           "MeZO adapter differs from three direct nl_mezo_step calls");
    /* and MeZO moved it */
    nl_adapter *fresh = nl_adapter_new(s.m, NULL, o.rank, o.alpha, o.seed);
    CHECK(fresh && memcmp(fresh->params, ad->params, ad->n_params * sizeof(float)) != 0);
    nl_adapter_free(fresh);
    nl_adapter_free(a);
    nl_batcher_free(b);
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
    s.rt.adapter = NULL;
    nl_adapter_free(ad);
    nl_session_close(&s);
    /* --dump-grads has nothing to dump under MeZO */
    o.dump_grads = log;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "MeZO"));
}

/* ---- energy ---- */

typedef struct {
    char path[700];
    volatile int stop;
} rapl_ctx;

static void *rapl_thread(void *arg) {
    rapl_ctx *c = arg;
    long long uj = 1000000;
    while (!c->stop) {
        uj += 2000; /* 2 mJ a millisecond: 2 W */
        char t[720];
        snprintf(t, sizeof t, "%s.tmp", c->path);
        FILE *f = fopen(t, "w");
        if (f) {
            fprintf(f, "%lld\n", uj);
            fclose(f);
            rename(t, c->path);
        }
        nl_t_sleep(0.001);
    }
    return NULL;
}

static char *progress_text(FILE *prog) {
    fflush(prog);
    long sz = ftell(prog);
    char *text = calloc(1, (size_t)sz + 1);
    rewind(prog);
    if (fread(text, 1, (size_t)sz, prog) != (size_t)sz) text[0] = 0;
    fclose(prog);
    return text;
}

static void test_energy(const char *model, const char *data) {
    char root[512], dir[600], out[512], log[512], cmd[3000];
    path_of(root, sizeof root, "fake_sys");
    snprintf(dir, sizeof dir, "%s/sys/class/powercap/intel-rapl:0", root);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && echo package-0 > %s/name && echo 1000000 > %s/energy_uj && echo 262143328850 > "
             "%s/max_energy_range_uj",
             dir, dir, dir, dir);
    CHECK(system(cmd) == 0);
    path_of(out, sizeof out, "energy.gguf");
    path_of(log, sizeof log, "energy.jsonl");
    rapl_ctx c = {.stop = 0};
    snprintf(c.path, sizeof c.path, "%s/energy_uj", dir);
    pthread_t th;
    pthread_create(&th, NULL, rapl_thread, &c);
    nl_train_opts o;
    defaults(&o, model, data, out);
    o.steps = 6; /* six steps of ~100 tokens: some fake-counter tick lands inside one even under load */
    o.batch_tokens = 100;
    o.log_json = log;
    nl_train_hooks hk = {.energy_root = root};
    o.progress = o.warnings = tmpfile(); /* the warnings too: the test reads both */
    int rc = train_hooked(&o, &hk, NULL);
    c.stop = 1;
    pthread_join(th, NULL);
    CHECK(rc == 0);
    char *text = progress_text(o.progress);
    CHECKF(strstr(text, "energy: RAPL package counters (RAPL package-0)"), "progress: %s", text);
    free(text);
    char *b = nl_t_slurp(log, NULL);
    int lines = 0, good = 0, positive = 0;
    for (char *p = b; p && *p;) {
        char *eol = strchr(p, '\n');
        if (!eol) break;
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        double jl, jpt, tok;
        lines++;
        if (!num(j, "joules", &jl) && !num(j, "joules_per_token", &jpt) && !num(j, "tokens", &tok)) {
            /* the fake counter moves every ms; a step on a loaded machine may see no tick */
            good += jl >= 0 && fabs(jpt - jl / tok) <= 1e-5 * jpt;
            positive += jl > 0;
        }
        nl_json_free(j);
        p = eol + 1;
    }
    free(b);
    CHECKF(lines == 6 && good == 6 && positive >= 1,
           "%d lines, %d with joules >= 0 and joules_per_token = joules/tokens, %d > 0", lines, good, positive);
    /* no counter under this root: said so at start-up, no joules in the log */
    path_of(root, sizeof root, "empty_sys");
    snprintf(cmd, sizeof cmd, "mkdir -p %s", root);
    CHECK(system(cmd) == 0);
    hk.energy_root = root;
    o.progress = o.warnings = tmpfile(); /* the warnings too: the test reads both */
    CHECK(train_hooked(&o, &hk, NULL) == 0);
    text = progress_text(o.progress);
    CHECKF(strstr(text, "energy counters not available: ") && strstr(text, "powercap"), "progress: %s", text);
    free(text);
    b = nl_t_slurp(log, NULL);
    CHECK(b && !strstr(b, "joules"));
    free(b);
}

/* ---- memory preflight ---- */

/* The value after `flag ` in msg (-1: absent). */
static double suggested(const char *msg, const char *flag) {
    const char *p = strstr(msg, flag);
    return p ? atof(p + strlen(flag) + 1) : -1;
}

static void test_memory(const char *model_q8) {
    char data[512], out[512], f32[512];
    path_of(data, sizeof data, "longmem.jsonl");
    path_of(out, sizeof out, "mem.gguf");
    path_of(f32, sizeof f32, "f32.gguf");
    FILE *f = fopen(data, "w");
    fprintf(f, "{\"tokens\": [");
    for (int i = 0; i < 1000; i++) fprintf(f, "%s%d", i ? ", " : "", 5 + (i * 37) % 400);
    fprintf(f, "]}\n");
    for (int k = 0; k < 3; k++) {
        fprintf(f, "{\"tokens\": [");
        for (int i = 0; i < 20; i++) fprintf(f, "%s%d", i ? ", " : "", 5 + (i * 7 + k) % 400);
        fprintf(f, "]}\n");
    }
    fclose(f);
    /* the estimate is printed */
    nl_train_opts o;
    defaults(&o, model_q8, data, out);
    o.steps = 1;
    o.batch_tokens = 2048;
    o.act_budget_mb = 1024;
    o.mem_limit_mb = 1000;
    o.progress = o.warnings = tmpfile(); /* the warnings too: the test reads both */
    CHECK(train(&o, NULL) == 0);
    char *text = progress_text(o.progress);
    /* the rows of one graph call: the step's four sequences packed (1000 + 3 x 20) */
    CHECKF(strstr(text, "memory: needs ") && strstr(text, "for 1060 tokens") &&
               strstr(text, "allowed (--mem-limit-mb)"),
           "%s", text);
    free(text);
    /* too small a limit, with a large explicit budget: refused, quickly, with suggestions */
    int refused = 0;
    for (double lim = 12; lim >= 3; lim -= 3.5) { /* 12, 8.5, 5 */
        unlink(out);
        defaults(&o, model_q8, data, out);
        o.steps = 1;
        o.batch_tokens = 2048;
        o.act_budget_mb = 1024;
        o.mem_limit_mb = lim;
        nl_train_result r;
        int rc = nl_train(&o, &r);
        if (rc == 0) continue;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        CHECKF(strstr(msg, "not enough memory: needs ") && strstr(msg, "allowed by --mem-limit-mb") &&
                   strstr(msg, "nothing was trained"),
               "limit %g: %s", lim, msg);
        CHECK(r.steps_done == 0);
        struct stat st;
        CHECK(stat(out, &st) != 0);
        double ab = suggested(msg, "--act-budget-mb"), ctx = suggested(msg, "--ctx"),
               bt = suggested(msg, "--batch-tokens");
        if (!refused) printf("limit %g MB: %s\n", lim, msg);
        refused++;
        CHECKF(ab >= 0 || ctx >= 2, "limit %g: no suggestion: %s", lim, msg);
        if (ab >= 0) {
            o.act_budget_mb = (int64_t)ab;
            CHECKF(train(&o, &r) == 0 && r.steps_done == 1, "limit %g: the suggested --act-budget-mb %g does not run",
                   lim, ab);
            o.act_budget_mb = 1024;
        }
        if (ctx >= 2) {
            /* with --batch-tokens where the packed step is over too */
            o.max_ctx = (int)ctx;
            if (bt >= 1) o.batch_tokens = (int)bt;
            int ok = train(&o, &r) == 0 && r.steps_done == 1;
            if (!ok && getenv("QEMU_CPU")) {
                /* under qemu-user the measured RSS (the preflight's "held") is the emulator's and
                 * grows as new code is first translated (tests/test_mem_limit.c: up to 6 MiB);
                 * the second suggestion, made with that grown term, must run */
                snprintf(msg, sizeof msg, "%s", nl_last_error());
                const double c2 = suggested(msg, "--ctx"), b2 = suggested(msg, "--batch-tokens");
                printf("limit %g (qemu): --ctx %g refused (%s); then --ctx %g\n", lim, ctx, msg, c2);
                if (c2 >= 2) o.max_ctx = (int)c2;
                if (b2 >= 1) o.batch_tokens = (int)b2;
                ok = c2 >= 2 && train(&o, &r) == 0 && r.steps_done == 1;
            }
            CHECKF(ok, "limit %g: the suggested --ctx %g (--batch-tokens %g) does not run", lim, ctx, bt);
        }
    }
    CHECKF(refused >= 3, "only %d limits were refused", refused);
    /* the precision suggestion: Q8_0 weights dequantized to f32 (--precision f32) that q8_0
     * (in place) would make fit: the limit just under what f32 needs */
    char notes[512];
    path_of(notes, sizeof notes, "notes.jsonl");
    nl_train_result r;
    double need[2];
    /* twice, the second pass measured: the "held" term is measured RSS, and under qemu-user that
     * grows by some 0.3 MiB as the q8_0 run's code is first translated, more than the f32/q8_0
     * gap the limit below falls in (the first pass translates both runs' code) */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 2; k++) {
            defaults(&o, model_q8, notes, out);
            o.steps = 1;
            o.proj.precision = k ? "q8_0" : "f32";
            o.act_budget_mb = 0; /* all recomputed: the plan does not shrink under a lower limit */
            o.mem_limit_mb = 1000;
            o.progress = o.warnings = tmpfile(); /* the warnings too: the test reads both */
            CHECK(train(&o, NULL) == 0);
            char *pt = progress_text(o.progress);
            const char *q = pt ? strstr(pt, "memory: needs ") : NULL;
            need[k] = q ? strtod(q + 14, NULL) : -1;
            CHECKF(q && strstr(q, " MiB ("), "%s", pt ? pt : "");
            free(pt);
        }
    CHECKF(need[1] > 0 && need[1] < need[0] - 0.02, "needs %g MiB at f32, %g at q8_0", need[0], need[1]);
    defaults(&o, model_q8, notes, out);
    o.steps = 1;
    o.proj.precision = "f32";
    o.act_budget_mb = 0;
    /* a quarter of the way from f32's need to q8_0's: f32 does not fit, and q8_0's need as the f32
     * run estimates it (its held memory is the f32 run's) does. The "held" term is measured RSS,
     * which moves by some 10 KiB from run to run: a limit 0.01 MiB under f32's need was flaky. */
    o.mem_limit_mb = need[0] - (need[0] - need[1]) / 4;
#ifndef __SANITIZE_ADDRESS__ /* the preflight's "held" term is measured RSS, which ASan's shadow and quarantine        \
                                inflate */
    CHECK(nl_train(&o, &r) == -1);
    const char *e = nl_last_error();
    CHECKF(strstr(e, "--precision q8_0"), "%s (needs %g MiB at f32, %g at q8_0)", e, need[0], need[1]);
    o.proj.precision = "q8_0";
    CHECKF(train(&o, &r) == 0, "the suggested --precision q8_0 does not run");
#endif
    /* nothing fits: said so, with the least it would need */
    o.proj.precision = "f32";
    o.mem_limit_mb = 0.25;
    CHECK(nl_train(&o, &r) == -1 && strstr(nl_last_error(), "no --act-budget-mb, --ctx or --precision makes it fit"));
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/nl_test_train_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmp, tmp);
    if (system(cmd)) return 1;
    char model[512], data[512];
    path_of(model, sizeof model, "q3.gguf");
    path_of(data, sizeof data, "notes.jsonl");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    write_notes(data, 12, 0);
    double t0 = nl_now();
    test_determinism(NL_ARCH_LLAMA);
    test_determinism(NL_ARCH_QWEN3);
    test_determinism(NL_ARCH_QWEN35);
    test_packing(NL_ARCH_LLAMA);
    test_packing(NL_ARCH_QWEN3);
    test_packing(NL_ARCH_QWEN35);
    double t1 = nl_now();
    test_log_json(model, data);
    test_overlap_mode(model, data);
    test_dump_grads_and_init(model, data);
    test_targets(model, data);
    test_epochs(model);
    test_schedule(model, data);
    test_one_step(model, data);
    test_refusals(model, data);
    test_startup(model, data);
    test_mezo(model, data);
    test_energy(model, data);
    test_memory(model);
    double t2 = nl_now();
    test_pacing(model, data);
    printf("determinism %.1f s, flags %.1f s, pacing %.1f s\n", t1 - t0, t2 - t1, nl_now() - t2);
    if (!nl_t_fail) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd)) return 1;
    } else {
        fprintf(stderr, "files kept in %s\n", tmp);
    }
    return nl_t_done();
}

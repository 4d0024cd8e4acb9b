/* api: the public C API (include/nightlora.h), a thin layer over the rooms below. Each function
 * maps its params onto the internal options, calls the one internal piece that does the work
 * (the same the CLI calls), and copies the result out. */
#include "nightlora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/eval.h"
#include "eval/report.h"
#include "eval/session.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/peft.h"
#include "model/quant.h"
#include "proj/proj.h"
#include "os/signals.h"
#include "train/trainer.h"
#include "util/util.h"

#ifndef NL_VERSION
#define NL_VERSION "unknown"
#endif

struct nightlora_model {
    nl_session s;
};

struct nightlora_run {
    nl_cancel cancel;
};

int nightlora_abi_version(void) { return NIGHTLORA_ABI_VERSION; }

const char *nightlora_version(void) { return NL_VERSION; }

const char *nightlora_last_error(void) { return nl_last_error(); }

void nightlora_free(void *p) { free(p); }

size_t nightlora_sizeof(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
#define S(t) {#t, sizeof(t)}
        S(nightlora_mkmodel_params), S(nightlora_model_params), S(nightlora_generate_params),
        S(nightlora_eval_params),    S(nightlora_eval_result),  S(nightlora_progress),
        S(nightlora_train_params),   S(nightlora_train_result), S(nightlora_merge_result),
#undef S
    };
    for (size_t i = 0; name && i < sizeof sizes / sizeof *sizes; i++)
        if (!strcmp(sizes[i].name, name)) return sizes[i].size;
    return 0;
}

/* ---- mkmodel ---- */

void nightlora_mkmodel_default_params(nightlora_mkmodel_params *p) {
    memset(p, 0, sizeof *p);
    p->arch = "qwen3";
    p->preset = "tiny";
    p->type = "f32";
    p->seed = 42;
}

int nightlora_mkmodel(const char *path, const nightlora_mkmodel_params *p) {
    nightlora_mkmodel_params def;
    if (!p) {
        nightlora_mkmodel_default_params(&def);
        p = &def;
    }
    if (!path) return nl_err("mkmodel: path: expected a file name, got NULL");
    int arch = nl_arch_from_name(p->arch ? p->arch : "");
    if (arch < 0)
        return nl_err("mkmodel: arch '%s': expected llama, qwen3, qwen35 or gemma3", p->arch ? p->arch : "(null)");
    int type = p->type ? nl_type_from_name(p->type) : NL_TYPE_F32;
    if (type != NL_TYPE_F32 && type != NL_TYPE_F16 && type != NL_TYPE_Q8_0 && type != NL_TYPE_Q4_0 &&
        type != NL_TYPE_Q4_1)
        return nl_err("mkmodel: type '%s': expected f32, f16, q8_0, q4_0 or q4_1", p->type);
    return nl_mkmodel((nl_arch)arch, p->preset ? p->preset : "tiny", type, p->seed, path);
}

/* ---- models ---- */

void nightlora_model_default_params(nightlora_model_params *p) {
    memset(p, 0, sizeof *p);
    p->backend = "host";
}

/* The projection service's config from the public fields, checked as the CLI checks its flags. */
static int proj_config(nl_proj_config *cfg, const char *backend, const char *device, int n_threads,
                       const char *precision, const char *compute, int wire_f16) {
    nl_proj_config_defaults(cfg);
    if (backend) cfg->backend = backend;
    const nl_proj_backend *be = nl_proj_backend_find(cfg->backend);
    if (!be) return nl_err("backend '%s': expected ref, host or vulkan (where the build has it)", cfg->backend);
    if (device && !be->init_device)
        return nl_err("device '%s': backend '%s' has no devices to choose from", device, cfg->backend);
    if (device && (!*device || strspn(device, "0123456789") != strlen(device) || strlen(device) > 4))
        return nl_err(
            "device '%s': expected a device index (0, 1, ...: nightlora check --backend %s --verbose lists them)",
            device, cfg->backend);
    cfg->device = device;
    if (n_threads < 0 || n_threads > 256)
        return nl_err("n_threads %d: expected 0 (every core up to 8) to 256", n_threads);
    if (n_threads > 0) cfg->n_threads = n_threads;
    cfg->precision = precision;
    cfg->compute = compute;
    if (nl_proj_compute_known(compute)) return nl_err_prefix("compute '%s'", compute);
    cfg->wire_f16 = wire_f16 != 0;
    return 0;
}

nightlora_model *nightlora_model_open(const char *path, const nightlora_model_params *p) {
    nightlora_model_params def;
    if (!p) {
        nightlora_model_default_params(&def);
        p = &def;
    }
    if (!path) {
        nl_err("model_open: path: expected a GGUF file name, got NULL");
        return NULL;
    }
    nl_proj_config cfg;
    if (proj_config(&cfg, p->backend, p->device, p->n_threads, p->precision, p->compute, p->wire_f16)) return NULL;
    if (!cfg.precision) cfg.precision = "keep"; /* inference: the weights as stored, like the CLI */
    nightlora_model *m = nl_calloc(1, sizeof *m);
    if (!m) return NULL;
    if (nl_session_open(&m->s, path, p->adapter, &cfg)) {
        free(m);
        return NULL;
    }
    return m;
}

void nightlora_model_close(nightlora_model *m) {
    if (!m) return;
    nl_session_close(&m->s);
    free(m);
}

int nightlora_model_n_vocab(const nightlora_model *m) { return m ? m->s.m->hp.n_vocab : -1; }

int nightlora_model_n_ctx(const nightlora_model *m) { return m ? m->s.m->hp.n_ctx_train : -1; }

static int need_tokenizer(const nightlora_model *m, const char *who) {
    if (!m) return nl_err("%s: model: NULL", who);
    if (!m->s.tok) return nl_err("%s: the model has no tokenizer vocabulary", m->s.m->path);
    return 0;
}

int nightlora_tokenize(nightlora_model *m, const char *text, int special, int32_t *ids, int cap) {
    if (need_tokenizer(m, "tokenize")) return -1;
    if (!text) return nl_err("tokenize: text: NULL");
    int32_t *v = NULL;
    int n = 0;
    if (nl_tokenize(m->s.tok, text, strlen(text), special != 0, special != 0, &v, &n)) return -1;
    if (ids && cap > 0) memcpy(ids, v, (size_t)(n < cap ? n : cap) * sizeof *ids);
    free(v);
    return n;
}

int64_t nightlora_detokenize(nightlora_model *m, const int32_t *ids, int n, char *buf, size_t cap) {
    if (need_tokenizer(m, "detokenize")) return -1;
    if (n < 0 || (n > 0 && !ids)) return nl_err("detokenize: %d ids at %p", n, (const void *)ids);
    char *text = NULL;
    size_t len = 0;
    if (nl_detokenize(m->s.tok, ids, n, &text, &len)) return -1;
    if (buf && cap > 0) {
        size_t k = len < cap - 1 ? len : cap - 1;
        memcpy(buf, text, k);
        buf[k] = 0;
    }
    free(text);
    return (int64_t)len;
}

/* The ids must be in the vocabulary (the forward gathers embedding rows by them). */
static int check_ids(const nightlora_model *m, const int32_t *ids, int n, const char *who) {
    if (!m) return nl_err("%s: model: NULL", who);
    if (n < 1 || !ids) return nl_err("%s: expected at least one token id, got %d", who, n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->s.m->hp.n_vocab)
            return nl_err("%s: token %d (id %d): outside the vocabulary of %d", who, i, (int)ids[i],
                          m->s.m->hp.n_vocab);
    return 0;
}

int nightlora_logits(nightlora_model *m, const int32_t *ids, int n, float *logits) {
    if (check_ids(m, ids, n, "logits")) return -1;
    if (!logits) return nl_err("logits: output buffer: NULL");
    return nl_session_logits(&m->s, ids, n, logits);
}

void nightlora_generate_default_params(nightlora_generate_params *p) {
    memset(p, 0, sizeof *p);
    p->n_predict = 32;
    p->temp = 0.0f;
    p->top_p = 1.0f;
}

/* The generated text as the CLI prints it (control tokens left out), grown as tokens come. */
typedef struct {
    const nightlora_model *m;
    const nightlora_generate_params *p;
    char *text;
    size_t len, cap;
    int oom;
} gen_sink;

static void gen_token(void *user, int32_t id) {
    gen_sink *g = user;
    const nl_tokenizer *t = g->m->s.tok;
    size_t len = 0;
    const char *piece = nl_token_is_control(t, id) ? "" : nl_token_piece(t, id, &len);
    if (!piece) piece = "";
    if (g->p->on_token) g->p->on_token(g->p->user, id, piece, len);
    if (g->oom || len == 0) return;
    if (g->len + len + 1 > g->cap) {
        size_t cap = g->cap ? g->cap : 256;
        while (cap < g->len + len + 1) cap *= 2;
        char *nt = realloc(g->text, cap);
        if (!nt) {
            g->oom = 1;
            return;
        }
        g->text = nt;
        g->cap = cap;
    }
    memcpy(g->text + g->len, piece, len);
    g->len += len;
    g->text[g->len] = 0;
}

int nightlora_generate(nightlora_model *m, const char *prompt, const nightlora_generate_params *p, char **text) {
    nightlora_generate_params def;
    if (!p) {
        nightlora_generate_default_params(&def);
        p = &def;
    }
    if (text) *text = NULL;
    if (need_tokenizer(m, "generate")) return -1;
    if (!prompt) return nl_err("generate: prompt: NULL");
    if (p->n_predict < 1 || p->n_predict > 1000000)
        return nl_err("generate: n_predict %d: expected 1 to 1000000", p->n_predict);
    if (!(p->temp >= 0.0f && p->temp <= 1e6f)) return nl_err("generate: temp %g: expected 0 to 1e6", (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return nl_err("generate: top_p %g: expected (0, 1]", (double)p->top_p);
    int32_t *ids = NULL;
    int n = 0;
    int rc = p->raw ? nl_tokenize(m->s.tok, prompt, strlen(prompt), true, false, &ids, &n)
                    : nl_chat_prompt_tokens(m->s.tok, p->chat_template, prompt, strlen(prompt), &ids, &n);
    if (rc) return -1;
    nl_sample_params sp = {
        .n_predict = p->n_predict, .temp = p->temp, .top_p = p->top_p, .seed = p->seed, .stop_at_eog = 1};
    gen_sink g = {.m = m, .p = p};
    int n_gen = 0;
    rc = nl_generate(&m->s, ids, n, &sp, gen_token, &g, NULL, &n_gen);
    free(ids);
    if (rc == 0 && g.oom) rc = nl_err("generate: out of memory for the text");
    if (rc == 0 && text) {
        *text = g.text ? g.text : nl_strdup("");
        if (!*text) return -1;
        g.text = NULL;
    }
    free(g.text);
    return rc ? -1 : n_gen;
}

void nightlora_eval_default_params(nightlora_eval_params *p) { memset(p, 0, sizeof *p); }

int nightlora_eval(nightlora_model *m, const char *data, const nightlora_eval_params *p, nightlora_eval_result *r) {
    nightlora_eval_params def;
    if (!p) {
        nightlora_eval_default_params(&def);
        p = &def;
    }
    if (!m) return nl_err("eval: model: NULL");
    if (!data) return nl_err("eval: data: expected a JSONL file name, got NULL");
    if (p->ctx != 0 && p->ctx < 2) return nl_err("eval: ctx %d: expected 0 (the model's) or >= 2", p->ctx);
    nl_eval_result er;
    nl_data_opts dopt = {.chat_template = p->chat_template};
    if (nl_eval_file(&m->s.rt, m->s.tok, data, &dopt, p->ctx, NULL, &er)) return -1;
    if (r) {
        memset(r, 0, sizeof *r);
        r->loss = nl_eval_loss(&er);
        r->ppl = exp(r->loss);
        r->accuracy = er.n_items ? (double)er.n_correct / er.n_items : -1.0;
        r->n_targets = er.n_targets;
        r->n_examples = er.n_examples;
        r->n_items = er.n_items;
        r->n_correct = er.n_correct;
        r->n_truncated = er.n_truncated;
        r->n_dropped = er.n_dropped;
    }
    return 0;
}

/* ---- merge and export ---- */

/* out is neither input (the same inode, or the same text) */
static int not_an_input(const char *who, const char *out, const char *model, const char *adapter) {
    const char *in[2] = {model, adapter};
    struct stat so, si;
    const int have = stat(out, &so) == 0;
    for (int k = 0; k < 2; k++)
        if (!strcmp(out, in[k]) || (have && stat(in[k], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino))
            return nl_err("%s: out %s is the %s: the output would replace an input", who, out, k ? "adapter" : "model");
    return 0;
}

int nightlora_merge(const char *model, const char *adapter, const char *out, const char *type, double max_lost,
                    nightlora_merge_result *r) {
    if (!model || !adapter || !out) return nl_err("merge: model, adapter and out are required");
    if (not_an_input("merge", out, model, adapter)) return -1;
    int t = -1;
    if (type && ((t = nl_type_from_name(type)) < 0 || !nl_type_get(t) || !nl_type_get(t)->from_float))
        return nl_err("merge: type '%s': expected f32, f16, bf16, q8_0, q4_0 or q4_1", type);
    if (isnan(max_lost)) return nl_err("merge: max_lost nan: expected a fraction >= 0 (or < 0: no bound)");
    nl_model *m = nl_model_load(model);
    if (!m) return -1;
    nl_adapter *a = nl_adapter_load(m, adapter);
    nl_merge_stats st;
    memset(&st, 0, sizeof st);
    const int rc = (!a || nl_merge_ex(m, a, t, max_lost, &st, out)) ? -1 : 0;
    nl_adapter_free(a);
    nl_model_free(m);
    if (rc == 0 && r) {
        memset(r, 0, sizeof *r);
        r->n_adapted = st.n_adapted;
        r->n_retyped = st.n_retyped;
        r->lost = st.lost;
        r->worst = st.worst;
    }
    return rc;
}

int nightlora_export(const char *model, const char *adapter, const char *format, const char *out,
                     const char *base_model) {
    if (!model || !adapter || !format || !out) return nl_err("export: model, adapter, format and out are required");
    const int peft = !strcmp(format, "peft");
    if (!peft && strcmp(format, "gguf")) return nl_err("export: format '%s': expected peft or gguf", format);
    if (base_model && !peft)
        return nl_err("export: base_model names the PEFT config's base_model_name_or_path: only with peft");
    if (not_an_input("export", out, model, adapter)) return -1;
    nl_model *m = nl_model_load(model);
    if (!m) return -1;
    nl_adapter *a = nl_adapter_load(m, adapter);
    const int rc = (!a || (peft ? nl_peft_save(a, m, out, base_model) : nl_adapter_save(a, m, out))) ? -1 : 0;
    nl_adapter_free(a);
    nl_model_free(m);
    return rc;
}

/* ---- training ---- */

nightlora_run *nightlora_run_new(void) { return nl_calloc(1, sizeof(nightlora_run)); }

void nightlora_run_cancel(nightlora_run *r) {
    if (r) nl_cancel_request(&r->cancel, 1);
}

int nightlora_run_cancelled(const nightlora_run *r) { return r ? nl_cancel_requested(&r->cancel) != 0 : 0; }

void nightlora_run_reset(nightlora_run *r) {
    if (r) nl_cancel_clear(&r->cancel);
}

void nightlora_run_free(nightlora_run *r) { free(r); }

void nightlora_train_default_params(nightlora_train_params *p) {
    nl_train_opts o;
    nl_train_defaults(&o);
    memset(p, 0, sizeof *p);
    p->rank = o.rank;
    p->alpha = o.alpha;
    p->dropout = o.dropout;
    p->lr = o.lr;
    p->steps = o.steps;
    p->epochs = o.epochs;
    p->batch_tokens = o.batch_tokens;
    p->warmup = o.warmup;
    p->schedule = o.cosine ? "cosine" : "constant";
    p->lr_min = o.lr_min;
    p->clip = o.clip;
    p->weight_decay = o.weight_decay;
    p->ctx = o.max_ctx;
    p->refuse_long = o.refuse_long;
    p->shuffle = o.shuffle;
    p->seed = o.seed;
    p->commit_every = o.commit_every;
    p->act_budget_mb = o.act_budget_mb;
    p->mem_limit_mb = o.mem_limit_mb;
    p->backend = o.proj.backend;
    p->method = o.method;
    p->mezo_eps = o.mezo_eps;
    p->thermal = o.thermal;
}

/* The trainer's progress rows, handed on in the public struct. */
typedef struct {
    nightlora_progress_fn fn;
    void *user;
} progress_relay;

static void relay_progress(void *user, const nl_train_progress *q) {
    const progress_relay *r = user;
    nightlora_progress p = {
        .kind = q->kind == NL_PROGRESS_EVAL ? NIGHTLORA_PROGRESS_EVAL : NIGHTLORA_PROGRESS_STEP,
        .step = q->step,
        .total_steps = q->total_steps,
        .loss = q->loss,
        .lr = q->lr,
        .grad_norm = q->grad_norm,
        .tokens = q->tokens,
        .seconds = q->seconds,
        .tokens_per_s = q->tokens_per_s,
        .paused_seconds = q->paused_seconds,
        .elapsed_seconds = q->elapsed_seconds,
        .eval_loss = q->eval_loss,
        .eval_accuracy = q->eval_accuracy,
        .eval_examples = q->eval_examples,
        .eval_tokens = q->eval_tokens,
        .eval_seconds = q->eval_seconds,
    };
    r->fn(r->user, &p);
}

static int one_of(const char *v, const char *field, const char *a, const char *b) {
    if (!v || !strcmp(v, a) || !strcmp(v, b)) return 0;
    return nl_err("train: %s '%s': expected %s or %s", field, v, a, b);
}

int nightlora_train(const nightlora_train_params *p, nightlora_run *run, nightlora_train_result *r) {
    if (!p) return nl_err("train: params: NULL (nightlora_train_default_params fills them)");
    if (!p->model || !p->data || !p->out) return nl_err("train: model, data and out are required");
    if (one_of(p->schedule, "schedule", "cosine", "constant") || one_of(p->method, "method", "backprop", "mezo") ||
        one_of(p->thermal, "thermal", "auto", "off"))
        return -1;
    nl_train_opts o;
    nl_train_defaults(&o);
    if (proj_config(&o.proj, p->backend, p->device, p->n_threads, p->precision, p->compute, 0))
        return nl_err_prefix("train");
    o.model = p->model;
    o.data = p->data;
    o.out = p->out;
    o.init_adapter = p->init_adapter;
    o.init_rank = 0; /* the adapter's own */
    o.targets = p->targets;
    o.chat_template = p->chat_template;
    o.rank = p->rank;
    o.alpha = p->alpha;
    o.dropout = p->dropout;
    o.lr = p->lr;
    o.steps = p->steps;
    o.epochs = p->epochs;
    o.batch_tokens = p->batch_tokens;
    o.warmup = p->warmup;
    o.cosine = !p->schedule || !strcmp(p->schedule, "cosine");
    o.lr_min = p->lr_min;
    o.clip = p->clip;
    o.weight_decay = p->weight_decay;
    o.max_ctx = p->ctx;
    o.refuse_long = p->refuse_long;
    o.shuffle = p->shuffle;
    o.seed = p->seed;
    o.checkpoint_dir = p->checkpoint_dir;
    o.commit_every = p->commit_every;
    o.resume = p->resume;
    o.act_budget_mb = p->act_budget_mb;
    o.mem_limit_mb = p->mem_limit_mb;
    o.method = p->method ? p->method : "backprop";
    o.mezo_eps = p->mezo_eps;
    o.thermal = p->thermal ? p->thermal : "auto";
    o.thermal_status_file = p->thermal_status_file;
    o.battery_temp_file = p->battery_temp_file;
    o.log_json = p->log_json;
    o.progress = p->log_stderr ? stderr : NULL;
    o.warnings = o.progress; /* a library caller's stderr is its own: warnings too only with log_stderr */
    o.count_process = 0;     /* a library caller's own memory is its own */
    progress_relay relay = {p->on_progress, p->user};
    if (p->on_progress) {
        o.on_progress = relay_progress;
        o.progress_user = &relay;
    }
    o.val_data = p->val_data;
    o.val_split = p->val_split;
    o.eval_every = p->eval_every;
    o.early_stop = p->early_stop;
    if (p->keep_best && (o.keep_best = nl_train_keep_best_from_name(p->keep_best)) < 0)
        return nl_err("train: keep_best '%s': expected loss or accuracy", p->keep_best);
    o.save_every = p->save_every;
    o.strict_keys = p->strict_keys != 0;
    o.columns = p->columns;
    o.alpaca_prompt = p->alpaca_prompt;
    o.overlap = p->overlap;
    o.allow_kernel_change = p->allow_kernel_change != 0;
    if (p->report && !p->log_json)
        return nl_err("train: report %s is drawn from the per-step log: set log_json too", p->report);
    o.cancel = run ? &run->cancel : NULL;
    nl_train_result res;
    memset(&res, 0, sizeof res);
    if (nl_train(&o, &res)) return -1;
    if (r) {
        memset(r, 0, sizeof *r);
        r->steps_done = res.steps_done;
        r->total_steps = res.total_steps;
        r->first_loss = res.first_loss;
        r->last_loss = res.last_loss;
        r->seconds = res.seconds;
        r->service_seconds = res.service_seconds;
        r->paused_seconds = res.paused_seconds;
        r->tokens = res.tokens;
        r->cancelled = res.stopped;
        r->early_stopped = res.early_stopped;
        r->evaluations = res.n_evals;
        r->eval_seconds = res.eval_seconds;
        r->best_step = res.best_step;
        r->best_loss = res.best_step > 0 ? res.best_loss : 0;
        r->best_accuracy = res.best_step > 0 ? (isnan(res.best_accuracy) ? -1 : res.best_accuracy) : 0;
    }
    if (p->report) {
        /* the report train --report writes (its run.json when there is a checkpoint_dir) */
        nl_report_opts ro = {.log = p->log_json, .run_json = p->checkpoint_dir};
        if (nl_report_write(&ro, p->report))
            return nl_err_prefix("train: report %s (the adapter is written to %s)", p->report, p->out);
    }
    return 0;
}

/* Inference commands: logits, generate, merge. */
#include <errno.h>
#include <stdarg.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/quant.h"
#include "proj/proj.h"
#include "proj/vulkan.h"
#include "util/util.h"

/* Shared service flags: --backend ref|host|vulkan, --vulkan-device N, --threads N, --precision, --wire. */
int nl_cli_proj_config(const char *cmd, int argc, char **argv, nl_proj_config *cfg) {
    /* defaults: the library's (host backend on every core up to 8; the planner checks it
     * against ref first) */
    nl_proj_config_defaults(cfg);
    if (nl_cli_opt(argc, argv, "backend")) cfg->backend = nl_cli_opt(argc, argv, "backend");
    int64_t nt = cfg->n_threads;
    if (nl_cli_int(cmd, argc, argv, "threads", 1, 256, &nt) < 0) return 1;
    cfg->n_threads = (int)nt;
    const char *wire = nl_cli_opt(argc, argv, "wire");
    if (wire && strcmp(wire, "f16") && strcmp(wire, "f32")) {
        fprintf(stderr, "nightlora %s: --wire %s: expected f32 or f16\n", cmd, wire);
        return 1;
    }
    cfg->wire_f16 = wire && !strcmp(wire, "f16");
    cfg->verbose = nl_cli_flag(argc, argv, "verbose");
    cfg->precision = nl_cli_opt(argc, argv, "precision");
    cfg->precision_map = nl_cli_opt(argc, argv, "precision-map");
    cfg->compute = nl_cli_opt(argc, argv, "compute");
    if (nl_proj_compute_known(cfg->compute)) {
        fprintf(stderr, "nightlora %s: --compute %s: %s\n", cmd, cfg->compute, nl_last_error());
        return 1;
    }
    if (!nl_proj_backend_find(cfg->backend)) {
        char why[512] = "";
        if (!strcmp(cfg->backend, "vulkan")) nl_proj_vulkan_available(why, sizeof why);
        fprintf(stderr, "nightlora %s: --backend %s: %s\n", cmd, cfg->backend,
                why[0]                           ? why
                : nl_proj_backend_find("vulkan") ? "expected ref, host or vulkan"
                                                 : "expected ref or host");
        return 1;
    }
    cfg->device = nl_cli_opt(argc, argv, "vulkan-device");
    if (cfg->device && strcmp(cfg->backend, "vulkan")) {
        fprintf(stderr, "nightlora %s: --vulkan-device %s: only with --backend vulkan\n", cmd, cfg->device);
        return 1;
    }
    return 0;
}

/* The planner's verdict cache: the folder $NL_PLAN_CACHE names, else the model cache's plan/
 * (${NL_MODEL_CACHE:-$HOME/.cache/nightlora}/plan); none with --no-plan-cache. */
void nl_cli_plan_cache(int argc, char **argv, nl_proj_config *cfg) {
    static char dir[4096];
    cfg->plan_cache_dir = NULL;
    if (nl_cli_flag(argc, argv, "no-plan-cache")) return;
    const char *own = getenv("NL_PLAN_CACHE"), *base = getenv("NL_MODEL_CACHE"), *home = getenv("HOME");
    int n = own && own[0]     ? snprintf(dir, sizeof dir, "%s", own)
            : base && base[0] ? snprintf(dir, sizeof dir, "%s/plan", base)
            : home && home[0] ? snprintf(dir, sizeof dir, "%s/.cache/nightlora/plan", home)
                              : -1;
    if (n > 0 && (size_t)n < sizeof dir) cfg->plan_cache_dir = dir;
}

/* The inference commands (logits, generate, eval): the shared flags, and with no --precision the
 * weights in their stored GGUF types ("keep": what llama.cpp computes with), not the training
 * policy that narrows F32/F16 projections to Q8_0. */
int nl_cli_infer_config(const char *cmd, int argc, char **argv, nl_proj_config *cfg) {
    if (nl_cli_proj_config(cmd, argc, argv, cfg)) return 1;
    nl_cli_plan_cache(argc, argv, cfg);
    if (!cfg->precision) cfg->precision = "keep";
    return 0;
}

int nl_cli_sample_params(const char *cmd, int argc, char **argv, int n_default, nl_sample_params *sp) {
    *sp = (nl_sample_params){.n_predict = n_default, .temp = 0.0f, .top_p = 1.0f, .seed = 0, .stop_at_eog = 1};
    int64_t n_predict = sp->n_predict;
    double temp = sp->temp, top_p = sp->top_p;
    /* strict and finite: "--temp nan" would sample nothing and exit 0 */
    if (nl_cli_int(cmd, argc, argv, "n", 1, 1000000, &n_predict) < 0 ||
        nl_cli_num(cmd, argc, argv, "temp", 0, 1e6, &temp) < 0 ||
        nl_cli_num(cmd, argc, argv, "top-p", 1e-9, 1, &top_p) < 0 || nl_cli_u64(cmd, argc, argv, "seed", &sp->seed) < 0)
        return 1;
    sp->n_predict = (int)n_predict;
    sp->temp = (float)temp;
    sp->top_p = (float)top_p;
    return 0;
}

/* Parse "1 2 3" or "1,2,3" into ids. */
static int parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return nl_err("out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return nl_err("--tokens: expected non-negative integers, got '%.20s' at character %d", p, (int)(p - s));
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                return nl_err("out of memory");
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    if (k == 0) {
        free(v);
        return nl_err("--tokens: no token ids given");
    }
    *ids = v;
    *n = k;
    return 0;
}

int nl_cmd_logits(int argc, char **argv) {
    static const char *const known[] = {"model",   "adapter", "tokens",    "out",           "backend", "vulkan-device",
                                        "threads", "wire",    "precision", "precision-map", "compute", NULL};
    static const char *const boolean[] = {"verbose", "no-plan-cache", NULL};
    if (nl_cli_check("logits", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model"), *tokens = nl_cli_opt(argc, argv, "tokens"),
               *out = nl_cli_opt(argc, argv, "out");
    if (!model || !tokens || !out) {
        fprintf(stderr, "nightlora logits: --model, --tokens and --out are required\n");
        return 2;
    }
    static const char *const inputs[] = {"model", "adapter", NULL}, *const outputs[] = {"out", NULL};
    if (nl_cli_no_overwrite("logits", argc, argv, inputs, outputs, NULL)) return 2;
    nl_proj_config cfg;
    if (nl_cli_infer_config("logits", argc, argv, &cfg)) return 2;
    int32_t *ids = NULL;
    int T = 0;
    if (parse_ids(tokens, &ids, &T)) return nl_cli_fail("logits");
    nl_session s;
    if (nl_session_open(&s, model, nl_cli_opt(argc, argv, "adapter"), &cfg)) {
        free(ids);
        return nl_cli_fail("logits");
    }
    nl_cli_model_warning("logits", s.m);
    int V = s.m->hp.n_vocab, rc = 1;
    float *logits = nl_malloc((size_t)T * V * sizeof(float));
    FILE *f = NULL;
    if (logits && nl_session_logits(&s, ids, T, logits) == 0 &&
        nl_model_check_unchanged(s.m, model, "logits", "no logits written") == 0) {
        f = fopen(out, "wb");
        if (!f) nl_err("%s: cannot open for writing: %s", out, strerror(errno));
        else if (fwrite(logits, sizeof(float), (size_t)T * V, f) != (size_t)T * V || fclose(f) != 0) {
            f = NULL;
            nl_err("%s: write failed: %s", out, strerror(errno));
        } else {
            f = NULL;
            rc = 0;
            fprintf(stderr, "wrote %d x %d float32 logits to %s\n", T, V, out);
        }
    }
    if (f) fclose(f);
    if (rc) nl_cli_fail("logits");
    free(logits);
    free(ids);
    nl_session_close(&s);
    return rc;
}

static void print_token(void *user, int32_t id) {
    const nl_tokenizer *t = user;
    size_t len;
    if (t && nl_token_is_control(t, id)) return; /* end of turn etc.: not text */
    const char *p = t ? nl_token_piece(t, id, &len) : NULL;
    if (p) fwrite(p, 1, len, stdout);
    else printf("[%d]", id);
    fflush(stdout);
}

int nl_cmd_generate(int argc, char **argv) {
    static const char *const known[] = {"model",     "adapter",       "prompt",  "system",        "n",       "temp",
                                        "top-p",     "seed",          "backend", "vulkan-device", "threads", "wire",
                                        "precision", "precision-map", "compute", "template",      NULL};
    static const char *const boolean[] = {"raw", "verbose", "no-plan-cache", NULL};
    if (nl_cli_check("generate", argc, argv, known, boolean)) return 2;
    const char *system = nl_cli_opt(argc, argv, "system");
    if (system && nl_cli_flag(argc, argv, "raw")) {
        fprintf(stderr, "nightlora generate: --system is a turn of the chat template: drop it with --raw\n");
        return 2;
    }
    const char *model = nl_cli_opt(argc, argv, "model"), *prompt = nl_cli_opt(argc, argv, "prompt");
    if (!model || !prompt) {
        fprintf(stderr, "nightlora generate: --model and --prompt are required\n");
        return 2;
    }
    nl_proj_config cfg;
    if (nl_cli_infer_config("generate", argc, argv, &cfg)) return 2;
    nl_sample_params sp;
    if (nl_cli_sample_params("generate", argc, argv, 32, &sp)) return 2;
    nl_session s;
    if (nl_session_open(&s, model, nl_cli_opt(argc, argv, "adapter"), &cfg)) return nl_cli_fail("generate");
    nl_cli_model_warning("generate", s.m);
    int rc = 1;
    int32_t *ids = NULL;
    int n = 0;
    if (!s.tok) {
        nl_err("%s: the model has no tokenizer vocabulary", model);
    } else if ((system ? nl_cli_render_conv(s.tok, nl_cli_opt(argc, argv, "template"),
                                            (const nl_chat_msg[]){{"system", system, strlen(system), NULL},
                                                                  {"user", prompt, strlen(prompt), NULL}},
                                            2, &ids, &n)
                       : nl_cli_render_prompt(s.tok, prompt, nl_cli_flag(argc, argv, "raw"),
                                              nl_cli_opt(argc, argv, "template"), &ids, &n)) == 0) {
        printf("%s", nl_cli_flag(argc, argv, "raw") ? prompt : "");
        rc = nl_generate(&s, ids, n, &sp, print_token, s.tok, NULL, NULL) ? 1 : 0;
        printf("\n");
        if (!rc && nl_model_check_unchanged(s.m, model, "generate", "the text above is not to be trusted")) rc = 1;
    }
    if (rc) nl_cli_fail("generate");
    free(ids);
    nl_session_close(&s);
    return rc;
}

/* The part of the adapter's effect a merged model may miss before merge warns (and --strict
 * refuses, nothing written): 20%, measured on the probe's logits (below). SmolLM2 Q4_1 with a
 * 10-step tagging adapter: the default (adapted weights as Q8_0) misses 6%, --type f16 0.3% (with
 * --compute f32; 2.3% under the default BF16 activations), 98.3% and 97.5% held-out (the adapter
 * 98.3%); --type q4_1 misses 110% (19.2%, the base's level). */
#define NL_MERGE_MAX_OFF 0.20

/* What the merged model does, against what base + adapter does: the logits of a probe prompt
 * (a short chat turn through the model's own template, plain text where it has none) under the
 * three: off = |L(merged) - L(base + adapter)| / |L(base + adapter) - L(base)|, 0 when the merge
 * kept every bit of the adapter's effect, ~1 when it kept none. */
static int merge_probe(int argc, char **argv, const char *model, const char *adapter, const char *merged, double *off) {
    static const char probe[] = "Tag this note with one word: I left my umbrella on the train this morning, and the "
                                "meeting with the dentist moved to Friday.";
    nl_proj_config cfg;
    if (nl_cli_infer_config("merge", argc, argv, &cfg)) return -1;
    const char *paths[3][2] = {{model, NULL}, {model, adapter}, {merged, NULL}};
    float *L[3] = {NULL, NULL, NULL};
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    size_t V = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        nl_session s;
        if (nl_session_open(&s, paths[k][0], paths[k][1], &cfg)) {
            rc = -1;
            break;
        }
        if (k == 0 && nl_chat_prompt_tokens(s.tok, NULL, probe, strlen(probe), &ids, &n) &&
            nl_tokenize(s.tok, probe, strlen(probe), true, false, &ids, &n))
            rc = -1;
        V = (size_t)s.m->hp.n_vocab;
        if (rc == 0 && !(L[k] = nl_malloc((size_t)n * V * sizeof(float)))) rc = -1;
        if (rc == 0) rc = nl_session_logits(&s, ids, n, L[k]);
        nl_session_close(&s);
    }
    if (rc == 0) {
        double moved = 0.0, err = 0.0;
        for (size_t i = 0; i < (size_t)n * V; i++) {
            const double dm = (double)L[1][i] - L[0][i], de = (double)L[2][i] - L[1][i];
            moved += dm * dm;
            err += de * de;
        }
        if (!isfinite(err) || !isfinite(moved)) rc = nl_err("the probe's logits are not finite");
        else *off = moved > 0 ? sqrt(err / moved) : 0.0;
    }
    for (int k = 0; k < 3; k++) free(L[k]);
    free(ids);
    return rc;
}

int nl_cmd_merge(int argc, char **argv) {
    static const char *const known[] = {"model",         "adapter",   "out",           "type",    "strict", "backend",
                                        "threads",       "precision", "precision-map", "compute", "wire",   "verbose",
                                        "no-plan-cache", NULL},
                             *const boolean[] = {"strict", "verbose", "no-plan-cache", NULL};
    if (nl_cli_check("merge", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model"), *adapter = nl_cli_opt(argc, argv, "adapter"),
               *out = nl_cli_opt(argc, argv, "out"), *type = nl_cli_opt(argc, argv, "type");
    const int strict = nl_cli_flag(argc, argv, "strict");
    if (!model || !adapter || !out) {
        fprintf(stderr, "nightlora merge: --model, --adapter and --out are required\n");
        return 2;
    }
    static const char *const inputs[] = {"model", "adapter", NULL}, *const outputs[] = {"out", NULL};
    if (nl_cli_no_overwrite("merge", argc, argv, inputs, outputs, NULL)) return 2;
    int t = -1;
    if (type && ((t = nl_type_from_name(type)) < 0 || !nl_type_get(t) || !nl_type_get(t)->from_float)) {
        fprintf(stderr, "nightlora merge: --type %s: expected f32, f16, bf16, q8_0, q4_0 or q4_1\n", type);
        return 2;
    }
    /* written first beside --out, probed, then renamed into place: what --strict refuses never
     * replaces anything */
    char staged[4200];
    if (snprintf(staged, sizeof staged, "%s.probe", out) >= (int)sizeof staged) {
        fprintf(stderr, "nightlora merge: --out %s: path too long\n", out);
        return 2;
    }
    if (access(staged, F_OK) == 0) {
        fprintf(stderr, "nightlora merge: %s exists (a merge interrupted before it was probed?); remove it first\n",
                staged);
        return 1;
    }
    nl_model *m = nl_model_load(model);
    if (!m) return nl_cli_fail("merge");
    nl_cli_model_warning("merge", m);
    nl_adapter *a = nl_adapter_load(m, adapter);
    nl_merge_stats st;
    int rc = (!a || nl_merge_ex(m, a, t, -1.0, &st, staged)) ? nl_cli_fail("merge") : 0;
    const int n_adapted = a ? a->n : 0;
    nl_adapter_free(a);
    nl_model_free(m);
    double off = 0.0;
    if (rc == 0 && merge_probe(argc, argv, model, adapter, staged, &off)) {
        nl_err_prefix("probing the merged model %s", staged);
        rc = nl_cli_fail("merge");
    }
    if (rc == 0 && strict && off > NL_MERGE_MAX_OFF) {
        fprintf(
            stderr,
            "nightlora merge: --strict: the merged model misses %.1f%% of the adapter's effect on the probe's logits "
            "(more than %.0f%%); nothing written (the default types, or --type q8_0 / f16, keep it)\n",
            100.0 * off, 100.0 * NL_MERGE_MAX_OFF);
        rc = 1;
    }
    if (rc == 0 && rename(staged, out)) {
        fprintf(stderr, "nightlora merge: renaming %s to %s: %s\n", staged, out, strerror(errno));
        rc = 1;
    }
    if (rc) {
        unlink(staged);
        return rc;
    }
    char types[256];
    size_t n = 0;
    types[0] = 0;
    for (int k = 0; k < NL_MERGE_NTYPES && n < sizeof types - 40; k++)
        if (st.by_type[k])
            n +=
                (size_t)snprintf(types + n, sizeof types - n, "%s%d %s", n ? ", " : "", st.by_type[k], nl_type_name(k));
    /* one line: what was merged, in which types, and how much of the adapter the file holds */
    fprintf(
        stderr,
        "merged %d adapted projections into %s (%s%s): kept %.1f%% of the adapter's effect (probe logits off by %.2f%% "
        "of its change; the weights' rounding on its input directions %.1f%% of the update, worst %s %.1f%%)\n",
        n_adapted, out, types[0] ? types : "none", t < 0 && st.n_retyped ? ", finer than stored" : "",
        100.0 * (off < 1.0 ? 1.0 - off : 0.0), 100.0 * off, 100.0 * st.lost, st.worst_name[0] ? st.worst_name : "-",
        100.0 * st.worst);
    if (off > NL_MERGE_MAX_OFF)
        fprintf(
            stderr,
            "nightlora merge: warning: --type %s misses %.1f%% of the adapter's effect (more than %.0f%%): the merged "
            "model "
            "does not do what the adapter does; the default types (or --type q8_0 / f16) keep it, --strict refuses\n",
            type ? type : "(default)", 100.0 * off, 100.0 * NL_MERGE_MAX_OFF);
    return 0;
}

int nl_cli_render_prompt(const struct nl_tokenizer *tok, const char *prompt, int raw, const char *template_name,
                         int32_t **ids, int *n) {
    if (raw) return nl_tokenize(tok, prompt, strlen(prompt), true, false, ids, n);
    return nl_chat_prompt_tokens(tok, template_name, prompt, strlen(prompt), ids, n);
}

void nl_cli_print_eval(const char *label, const nl_eval_result *r) {
    double loss = nl_eval_loss(r);
    printf("%s: %d examples, %lld target tokens, loss %.4f, ppl %.3f", label, r->n_examples, (long long)r->n_targets,
           loss, exp(loss));
    if (r->n_items) printf(", accuracy %.1f%% (%d/%d)", 100.0 * r->n_correct / r->n_items, r->n_correct, r->n_items);
    char cut[256];
    nl_eval_format_cut(r, cut, sizeof cut);
    printf("%s\n", cut);
}

/* eval --json: every example's result as a JSON object, collected in file order. */
typedef struct {
    char *buf;
    size_t n, cap;
    int count, oom;
} eval_rows;

static void rows_add(eval_rows *r, const char *fmt, ...) {
    if (r->oom) return;
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp) {
        r->oom = 1;
        return;
    }
    if (r->n + (size_t)k + 1 > r->cap) {
        size_t cap = (r->n + (size_t)k + 1) * 2;
        char *b = realloc(r->buf, cap);
        if (!b) {
            r->oom = 1;
            return;
        }
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->n, tmp, (size_t)k + 1);
    r->n += (size_t)k;
}

/* a number as JSON (non-finite: null) */
static const char *jnum(char *b, size_t cap, double v) {
    if (isfinite(v)) snprintf(b, cap, "%.9g", v);
    else snprintf(b, cap, "null");
    return b;
}

static void eval_row(void *user, const nl_eval_example *e) {
    eval_rows *r = user;
    char a[32];
    rows_add(r, "%s\n    {\"line\": %d, \"targets\": %lld, \"loss\": %s", r->count++ ? "," : "", e->line,
             (long long)e->n_targets, e->n_targets ? jnum(a, sizeof a, e->loss_sum / (double)e->n_targets) : "null");
    if (e->n_choices > 0) {
        rows_add(r, ", \"choices_ll\": [");
        for (int k = 0; k < e->n_choices; k++) rows_add(r, "%s%s", k ? ", " : "", jnum(a, sizeof a, e->ll[k]));
        rows_add(r, "], \"predicted\": %d, \"answer\": %d, \"correct\": %s", e->predicted, e->answer,
                 e->predicted == e->answer ? "true" : "false");
    }
    rows_add(r, "}");
}

static void print_eval_json(const char *data, const nl_eval_result *r, const eval_rows *rows) {
    const double loss = nl_eval_loss(r);
    char a[32];
    printf("{\"data\": ");
    nl_cli_json_str(data);
    printf(", \"examples\": %d, \"targets\": %lld, \"loss\": %s", r->n_examples, (long long)r->n_targets,
           r->n_targets ? jnum(a, sizeof a, loss) : "null");
    printf(", \"ppl\": %s", r->n_targets ? jnum(a, sizeof a, exp(loss)) : "null");
    if (r->n_items)
        printf(", \"accuracy\": %s, \"correct\": %d, \"items\": %d",
               jnum(a, sizeof a, (double)r->n_correct / r->n_items), r->n_correct, r->n_items);
    else printf(", \"accuracy\": null");
    printf(", \"ctx\": %d, \"truncated\": %d, \"dropped\": %d,\n  \"per_example\": [%s\n  ]}\n", r->ctx, r->n_truncated,
           r->n_dropped, rows->buf ? rows->buf : "");
}

int nl_cmd_eval(int argc, char **argv) {
    static const char *const known[] = {
        "model",         "adapter", "data",     "backend", "vulkan-device", "threads", "wire",          "precision",
        "precision-map", "compute", "template", "ctx",     "batch-tokens",  "columns", "alpaca-prompt", NULL};
    static const char *const boolean[] = {"verbose", "ignore-unknown-keys", "strict-keys",
                                          "json",    "no-plan-cache",       NULL};
    if (nl_cli_check("eval", argc, argv, known, boolean)) return 2;
    int64_t batch = NL_EVAL_BATCH_TOKENS;
    if (nl_cli_int("eval", argc, argv, "batch-tokens", 1, 1 << 24, &batch) < 0) return 2;
    const int json = nl_cli_flag(argc, argv, "json");
    const char *model = nl_cli_opt(argc, argv, "model"), *data = nl_cli_opt(argc, argv, "data");
    if (!model || !data) {
        fprintf(stderr, "nightlora eval: --model and --data are required\n");
        return 2;
    }
    nl_proj_config cfg;
    if (nl_cli_infer_config("eval", argc, argv, &cfg)) return 2;
    int64_t ctx_flag = 0;
    if (nl_cli_int("eval", argc, argv, "ctx", 2, 10000000, &ctx_flag) < 0) return 2;
    /* a data directory: its test.jsonl (the result line names the file read) */
    char *dir_file = NULL;
    if (nl_data_dir_file(data, "test.jsonl", 1, &dir_file)) {
        nl_err_prefix("--data %s", data);
        return nl_cli_fail("eval");
    }
    if (dir_file) data = dir_file;
    nl_session s;
    if (nl_session_open(&s, model, nl_cli_opt(argc, argv, "adapter"), &cfg)) {
        free(dir_file);
        return nl_cli_fail("eval");
    }
    nl_session_sync_cpu(&s);
    nl_cli_model_warning("eval", s.m);
    if (cfg.verbose) {
        char line[256];
        nl_proj_plan_format_summary(s.svc, line, sizeof line);
        fprintf(stderr, "service: %s backend, %s\n", cfg.backend, line);
    }
    nl_data_opts dopt = {.chat_template = nl_cli_opt(argc, argv, "template"),
                         .strict_keys = nl_cli_flag(argc, argv, "strict-keys"),
                         .columns = nl_cli_opt(argc, argv, "columns"),
                         .alpaca = nl_cli_opt(argc, argv, "alpaca-prompt")};
    nl_eval_result r;
    int rc = 1;
    eval_rows rows = {0};
    nl_eval_opts eo = {.batch_tokens = (int)batch, .on_example = json ? eval_row : NULL, .user = &rows};
    if (nl_eval_file(&s.rt, s.tok, data, &dopt, (int)ctx_flag, &eo, &r) == 0 && !rows.oom &&
        nl_model_check_unchanged(s.m, model, "eval", "no result printed") == 0) {
        if (json) print_eval_json(data, &r, &rows);
        else nl_cli_print_eval(data, &r);
        rc = 0;
    } else if (rows.oom) {
        nl_err("out of memory");
    }
    free(rows.buf);
    if (rc) nl_cli_fail("eval");
    nl_session_close(&s);
    free(dir_file);
    return rc;
}

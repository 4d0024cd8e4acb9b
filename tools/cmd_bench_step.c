/* nightlora bench step: the time of one optimizer step's forward + backward (train/graph's
 * nl_graph_seq on random tokens, every row a target), broken down like the paper's table:
 *
 *   (a) ref backend, every layer recomputed, synchronous requests
 *   (b) ref backend, fused CPU nodes with the activation budget (layers kept), synchronous
 *   (c) + the host service, synchronous (submit, wait, then the LoRA branch)
 *   (d) + overlap: the LoRA branch runs while the request is in flight (the normal path)
 *
 * nightlora has no unfused autograd variant to time, so (a) is NOT an "unfused" baseline: it is
 * the fused nodes with the activation memory cut to nothing (every layer's intermediates
 * recomputed through the service before its backward, the third frozen-weight product), which
 * is what the fused nodes' O(T·d) saved state buys. The output says so.
 *
 * For each configuration: seconds per step (median of --reps after --warmup), CPU seconds (the
 * main thread's wall time outside nl_proj_wait), service seconds (the service's busy time),
 * tokens/s, peak RSS (VmHWM, reset per configuration through /proc/self/clear_refs where the
 * kernel allows it) and the resident weight bytes by class and type; then the speed-ups
 * (b)/(a), (c)/(b), (d)/(c). --profile adds the main thread's time by node class and, for the
 * host configurations, the service's busy time by projection shape and direction (requests,
 * ms a request, GFLOP/s, fraction of bench peak's figure): the step's rate of each shape beside
 * what `bench proj` gives it alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cpu/peak.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/quant.h"
#include "nn/forward.h"
#include "proj/proj.h"
#include "os/mem.h"
#include "train/budget.h"
#include "train/graph.h"
#include "util/util.h"

enum { CFG_A, CFG_B, CFG_C, CFG_D, N_CFG };
static const char *const cfg_label[N_CFG] = {"a", "b", "c", "d"};
static const char *const cfg_desc[N_CFG] = {
    "ref backend, recompute every layer, synchronous (no unfused variant exists: see notes)",
    "ref backend, fused nodes + activation budget, synchronous",
    "host service, synchronous (submit, wait, then LoRA)",
    "host service, LoRA overlapped with the in-flight request",
};

/* --profile, a host configuration: the service's busy time by projection shape over the timed
 * reps (nl_proj_get_entry_stats), per step */
#define MAX_SHAPES 48
typedef struct {
    int64_t K, N;
    int type, dir;
    double requests, tokens, busy_s; /* per step */
} shape_row;

typedef struct {
    int ran;
    int n_shapes;
    shape_row shapes[MAX_SHAPES];
    double step_s, cpu_s, service_s, wait_s, thread_cpu_s, process_cpu_s;
    double service_flops; /* 2·T·K·N of the step's service requests (median rep) */
    double tok_s, loss;
    int64_t peak_rss;
    int n_kept, n_recomputed;
    uint64_t peak_cache;
    nl_graph_prof prof; /* per step (median rep) */
    char resident[512];
    uint64_t res_bytes[NL_CLASS_COUNT][NL_TYPE_COUNT];
    char plan[160];
    const char *compute; /* the service's (nl_proj_compute: a static string) */
    double peak_before;  /* bench peak's loop for that compute mode before the steps (0: none) */
} cfg_result;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reset VmHWM to the current RSS (Linux >= 4.0: "5" > /proc/self/clear_refs). 0 if it worked. */
static int reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const nl_model *m;
    nl_adapter *ad;
    float *grads;
    const int32_t *tokens, *targets;
    int answer; /* rows that are targets (the last ones) */
    int T, reps, warmup, threads, plan, profile;
    int64_t budget_mb; /* -1: like train (MemAvailable based) */
    const nl_proj_config *base_cfg;
} bench;

/* sign +1 adds the service's per-weight counters into the shape rows, -1 subtracts them */
static void shape_rows_add(nl_proj_service *svc, cfg_result *r, double sign) {
    for (int id = 0; id < nl_proj_count(svc); id++) {
        const nl_proj_weight *w = nl_proj_get(svc, id);
        if (!w || w->cls == NL_CLASS_EMBED) continue;
        for (int d = 0; d < 2; d++) {
            nl_proj_entry_stats es;
            if (nl_proj_get_entry_stats(svc, id, (nl_dir)d, &es)) continue;
            int k = 0;
            while (k < r->n_shapes && !(r->shapes[k].K == w->n_in && r->shapes[k].N == w->n_out &&
                                        r->shapes[k].type == w->type && r->shapes[k].dir == d))
                k++;
            if (k == r->n_shapes) {
                if (k == MAX_SHAPES) continue;
                r->shapes[k] = (shape_row){.K = w->n_in, .N = w->n_out, .type = w->type, .dir = d};
                r->n_shapes++;
            }
            r->shapes[k].requests += sign * (double)es.requests;
            r->shapes[k].tokens += sign * (double)es.tokens;
            r->shapes[k].busy_s += sign * es.busy_s;
        }
    }
}

static int run_cfg(const bench *b, int which, int peak_reset_ok, cfg_result *r) {
    memset(r, 0, sizeof *r);
    nl_proj_config pc = *b->base_cfg;
    pc.backend = which <= CFG_B ? "ref" : "host";
    pc.backend_impl = NULL;
    pc.n_threads = b->threads;
    if (peak_reset_ok) reset_peak_rss();
    nl_proj_service *svc = nl_proj_service_new(&pc);
    nl_runtime rt;
    int rc = -1, rt_ok = 0;
    if (!svc || nl_runtime_init(&rt, b->m, svc)) goto done;
    rt_ok = 1;
    r->compute = nl_proj_compute(svc);
    rt.adapter = b->ad;
    rt.sync = which != CFG_D;
    if (b->plan && nl_proj_plan(svc, NULL, 0)) goto done;
    if (which >= CFG_C) {
        const int k = nl_peak_of_compute(r->compute);
        r->peak_before = k >= 0 ? nl_peak_measure((nl_peak_kind)k, b->threads, 0.2) : 0.0;
        if (r->peak_before < 0) r->peak_before = 0.0;
    }
    if (b->plan) nl_proj_plan_format_summary(svc, r->plan, sizeof r->plan);
    else snprintf(r->plan, sizeof r->plan, "no planner (--no-plan): whole requests, no buckets");
    nl_proj_format_resident(svc, r->resident, sizeof r->resident);
    for (int c = 0; c < NL_CLASS_COUNT; c++)
        for (int t = 0; t < NL_TYPE_COUNT; t++) r->res_bytes[c][t] = nl_proj_resident_bytes(svc, c, t);
    uint64_t budget;
    if (which == CFG_A) budget = 0;
    else if (b->budget_mb >= 0) budget = (uint64_t)b->budget_mb << 20;
    else budget = nl_act_budget_bytes(0, nl_mem_available_bytes(), (uint64_t)512 << 20);
    nl_graph_prof prof;
    nl_graph g = {.rt = &rt,
                  .ad = b->ad,
                  .grads = b->grads,
                  .dropout = 0.05f,
                  .seed = 1,
                  .step = 1,
                  .act_budget = budget,
                  .prof = &prof,
                  .keep_scratch = 1};
    int n = b->warmup + b->reps;
    double *wall = nl_calloc((size_t)n, sizeof *wall);
    nl_graph_prof *profs = nl_calloc((size_t)n, sizeof *profs);
    double *svc_f = nl_calloc((size_t)n, sizeof *svc_f);
    double *svc_s = nl_calloc((size_t)n, sizeof *svc_s), *tcpu = nl_calloc((size_t)n, sizeof *tcpu),
           *pcpu = nl_calloc((size_t)n, sizeof *pcpu);
    if (!wall || !profs || !svc_s || !tcpu || !pcpu) goto done_free;
    float inv_n = 1.0f / (float)b->answer;
    for (int i = 0; i < n; i++) {
        if (i == b->warmup) shape_rows_add(svc, r, -1.0);
        memset(&prof, 0, sizeof prof);
        memset(b->grads, 0, b->ad->n_params * sizeof(float));
        nl_proj_stats s0, s1;
        nl_proj_get_stats(svc, &s0);
        double t0 = nl_now(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), p0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        double loss = 0;
        if (nl_graph_seq(&g, b->tokens, b->targets, b->T, inv_n, &loss)) goto done_free;
        wall[i] = nl_now() - t0;
        tcpu[i] = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        pcpu[i] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - p0;
        nl_proj_get_stats(svc, &s1);
        svc_s[i] = (s1.busy_s[0] - s0.busy_s[0]) + (s1.busy_s[1] - s0.busy_s[1]);
        if (svc_f) svc_f[i] = (s1.flops[0] - s0.flops[0]) + (s1.flops[1] - s0.flops[1]);
        profs[i] = prof;
        r->loss = loss * inv_n;
        if (b->profile)
            fprintf(stderr, "  (%s) step %d/%d: %.3f s%s\n", cfg_label[which], i + 1, n, wall[i],
                    i < b->warmup ? " (warm-up)" : "");
    }
    shape_rows_add(svc, r, 1.0);
    for (int k = 0; k < r->n_shapes; k++) {
        r->shapes[k].requests /= b->reps;
        r->shapes[k].tokens /= b->reps;
        r->shapes[k].busy_s /= b->reps;
    }
    /* the median rep (by wall time) gives every number of the row */
    int *idx = nl_malloc((size_t)b->reps * sizeof *idx);
    double *sorted = nl_malloc((size_t)b->reps * sizeof *sorted);
    if (!idx || !sorted) {
        free(idx);
        free(sorted);
        goto done_free;
    }
    for (int i = 0; i < b->reps; i++) sorted[i] = wall[b->warmup + i];
    qsort(sorted, (size_t)b->reps, sizeof *sorted, cmp_double);
    double med = sorted[(b->reps - 1) / 2];
    int mi = b->warmup;
    for (int i = b->warmup; i < n; i++)
        if (wall[i] == med) {
            mi = i;
            break;
        }
    free(idx);
    free(sorted);
    r->ran = 1;
    r->step_s = wall[mi];
    r->wait_s = profs[mi].s[NL_GP_WAIT];
    r->cpu_s = wall[mi] - r->wait_s;
    r->service_s = svc_s[mi];
    r->service_flops = svc_f ? svc_f[mi] : 0.0;
    r->thread_cpu_s = tcpu[mi];
    r->process_cpu_s = pcpu[mi];
    r->tok_s = (double)b->T / wall[mi];
    r->prof = profs[mi];
    r->n_kept = g.n_kept;
    r->n_recomputed = g.n_recomputed;
    r->peak_cache = g.peak_cache_bytes;
    r->peak_rss = nl_peak_rss_bytes();
    rc = 0;
done_free:
    nl_graph_free(&g);
    free(wall);
    free(profs);
    free(svc_s);
    free(svc_f);
    free(tcpu);
    free(pcpu);
done:
    if (rt_ok) nl_runtime_free(&rt);
    nl_proj_service_free(svc);
    return rc;
}

static double svc_gflops(const cfg_result *r) {
    return r->service_s > 0 ? r->service_flops / r->service_s * 1e-9 : 0.0;
}

static void print_json(FILE *f, const bench *b, const char *model, const cfg_result *r, const char *compute,
                       double peak) {
    fprintf(f,
            "{\"model\": \"%s\", \"tokens\": %d, \"threads\": %d, \"reps\": %d, \"warmup\": %d, \"compute\": \"%s\", "
            "\"configs\": {",
            model, b->T, b->threads, b->reps, b->warmup, compute);
    int first = 1;
    for (int c = 0; c < N_CFG; c++) {
        if (!r[c].ran) continue;
        fprintf(f,
                "%s\"%s\": {\"desc\": \"%s\", \"seconds_per_step\": %.6f, \"cpu_seconds\": %.6f, \"service_seconds\": "
                "%.6f, "
                "\"wait_seconds\": %.6f, \"main_thread_cpu_seconds\": %.6f, \"process_cpu_seconds\": %.6f, "
                "\"tokens_per_s\": %.3f, "
                "\"loss\": %.6f, \"peak_rss_bytes\": %lld, \"layers_kept\": %d, \"layers_recomputed\": %d, "
                "\"activation_peak_bytes\": %llu, "
                "\"requests\": %llu, \"service_gflops\": %.3f, \"service_of_peak\": %.4f, \"plan\": \"%s\", "
                "\"resident\": {",
                first ? "" : ", ", cfg_label[c], cfg_desc[c], r[c].step_s, r[c].cpu_s, r[c].service_s, r[c].wait_s,
                r[c].thread_cpu_s, r[c].process_cpu_s, r[c].tok_s, r[c].loss, (long long)r[c].peak_rss, r[c].n_kept,
                r[c].n_recomputed, (unsigned long long)r[c].peak_cache, (unsigned long long)r[c].prof.requests,
                svc_gflops(&r[c]), peak > 0 ? svc_gflops(&r[c]) / peak : 0.0, r[c].plan);
        int fr = 1;
        for (int k = 0; k < NL_CLASS_COUNT; k++)
            for (int t = 0; t < NL_TYPE_COUNT; t++)
                if (r[c].res_bytes[k][t]) {
                    fprintf(f, "%s\"%s/%s\": %llu", fr ? "" : ", ", nl_proj_class_name((nl_proj_class)k),
                            nl_type_name(t), (unsigned long long)r[c].res_bytes[k][t]);
                    fr = 0;
                }
        fprintf(f, "}, \"profile\": {");
        for (int k = 0; k < NL_GP_COUNT; k++)
            fprintf(f, "%s\"%s\": %.6f", k ? ", " : "", nl_graph_prof_name(k), r[c].prof.s[k]);
        fprintf(f, "}}");
        first = 0;
    }
    fprintf(f, "}, \"speedups\": {");
    first = 1;
    for (int c = 1; c < N_CFG; c++)
        if (r[c].ran && r[c - 1].ran) {
            fprintf(f, "%s\"%s/%s\": %.4f", first ? "" : ", ", cfg_label[c], cfg_label[c - 1],
                    r[c - 1].step_s / r[c].step_s);
            first = 0;
        }
    fprintf(f, "}}\n");
}

static void fmt_mb(char *buf, size_t cap, int64_t b) {
    if (b < 0) snprintf(buf, cap, "?");
    else snprintf(buf, cap, "%.0f MB", (double)b / 1e6);
}

int nl_cmd_bench_step(int argc, char **argv) {
    static const char *const known[] = {
        "model",   "tokens", "threads", "reps",          "warmup", "only", "precision",     "precision-map",
        "compute", "wire",   "backend", "act-budget-mb", "rank",   "seed", "answer-tokens", NULL};
    static const char *const boolean[] = {"json", "skip-ref", "no-plan", "profile", "verbose", NULL};
    if (nl_cli_check("bench step", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model");
    if (!model) {
        fprintf(stderr, "nightlora bench step: --model is required\n");
        return 2;
    }
    const char *v;
    int64_t T = 512, reps = 3, warmup = 1, rank = 16, budget_mb = -1, answer = -1;
    uint64_t seed = 1;
    const char *c = "bench step";
    if (nl_cli_int(c, argc, argv, "tokens", 2, 1 << 20, &T) < 0 ||
        nl_cli_int(c, argc, argv, "reps", 1, 1000, &reps) < 0 ||
        nl_cli_int(c, argc, argv, "warmup", 0, 100, &warmup) < 0 ||
        nl_cli_int(c, argc, argv, "rank", 1, 4096, &rank) < 0 || nl_cli_u64(c, argc, argv, "seed", &seed) < 0 ||
        nl_cli_int(c, argc, argv, "act-budget-mb", 0, INT64_C(1) << 40, &budget_mb) < 0)
        return 2;
    /* --answer-tokens N: only the last N rows are targets (a prompt/answer example); default
     * all; checked after --tokens, whose range it depends on */
    if (nl_cli_int(c, argc, argv, "answer-tokens", 1, T, &answer) < 0) return 2;
    if (answer < 0) answer = T;
    nl_proj_config pcfg;
    if (nl_cli_proj_config("bench step", argc, argv, &pcfg)) return 2;
    int want[N_CFG] = {1, 1, 1, 1};
    if (nl_cli_flag(argc, argv, "skip-ref")) want[CFG_A] = want[CFG_B] = 0;
    if ((v = nl_cli_opt(argc, argv, "only"))) {
        for (int c = 0; c < N_CFG; c++) want[c] = strchr(v, cfg_label[c][0]) != NULL;
    }
    int json = nl_cli_flag(argc, argv, "json");
    bench b = {.T = T,
               .reps = reps,
               .warmup = warmup,
               .threads = pcfg.n_threads,
               .plan = !nl_cli_flag(argc, argv, "no-plan"),
               .profile = nl_cli_flag(argc, argv, "profile"),
               .budget_mb = budget_mb,
               .base_cfg = &pcfg};
    int rc = 1;
    nl_model *m = nl_model_load(model);
    nl_adapter *ad = NULL;
    int32_t *tok = NULL;
    float *grads = NULL;
    if (!m) return nl_cli_fail("bench step");
    ad = nl_adapter_new(m, NULL, rank, 2.0f * (float)rank, seed);
    tok = nl_malloc(2 * ((size_t)T + 1) * sizeof *tok);
    if (!ad || !tok) goto done;
    grads = nl_calloc(ad->n_params, sizeof *grads);
    if (!grads) goto done;
    /* B = 0 at init would make every LoRA dx zero: small random B instead, so every path
     * carries real numbers (the timing does not depend on the values) */
    for (int e = 0; e < ad->n; e++) {
        float *B = nl_lora_B(ad, e);
        size_t nb = (size_t)ad->t[e].n_out * (size_t)ad->t[e].rank;
        uint64_t st = seed * 0x9E3779B97F4A7C15ull + (uint64_t)e;
        for (size_t i = 0; i < nb; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            B[i] = (float)((double)(st >> 40) / 16777216.0 - 0.5) * 1e-3f;
        }
    }
    {
        uint64_t st = seed ^ 0x5DEECE66Dull;
        for (int t = 0; t <= T; t++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            tok[t] = (int32_t)((st >> 33) % (uint64_t)m->hp.n_vocab);
        }
        /* targets: the next token, on every row (or the last --answer-tokens rows) */
        for (int t = 0; t < T; t++) tok[T + 1 + t] = t >= T - answer ? tok[t + 1] : -1;
    }
    b.m = m;
    b.ad = ad;
    b.grads = grads;
    b.tokens = tok;
    b.targets = tok + T + 1;
    b.answer = answer;
    int peak_ok = reset_peak_rss() == 0;
    cfg_result res[N_CFG];
    memset(res, 0, sizeof res);
    for (int c = 0; c < N_CFG; c++) {
        if (!want[c]) continue;
        if (!json) {
            fprintf(stderr, "(%s) %s ...\n", cfg_label[c], cfg_desc[c]);
            fflush(stderr);
        }
        if (run_cfg(&b, c, peak_ok, &res[c])) goto done;
    }
    /* the compute mode of the host configurations' services (the --compute choice or auto) */
    const char *compute = res[CFG_C].compute ? res[CFG_C].compute : res[CFG_D].compute ? res[CFG_D].compute : "-";
    /* the service's rate as a fraction of bench peak's loop for its compute mode, same threads:
     * the larger of its figures before the steps and after them (a Zen 5 guest's two vCPUs ran
     * at one core's rate for seconds at a time: an after-only figure of 499 GFLOP/s where the
     * steps had run at ~900 made 'of peak' 1.39) */
    const int pk_kind = nl_peak_of_compute(compute);
    const double peak_after = pk_kind >= 0 ? nl_peak_measure((nl_peak_kind)pk_kind, b.threads, 0.2) : 0.0;
    double peak_before = 0.0;
    for (int c = CFG_C; c < N_CFG; c++)
        if (res[c].ran && res[c].compute == compute && res[c].peak_before > peak_before)
            peak_before = res[c].peak_before;
    double peak = peak_after > peak_before ? peak_after : peak_before;
    if (peak < 0) peak = 0.0;
    if (json) {
        print_json(stdout, &b, model, res, compute, peak);
    } else {
        printf("bench step: %s, %s, T=%d, batch 1, LoRA r%d on %d projections, %d thread%s, host compute %s, "
               "median of %d after %d warm-up\n",
               model, nl_arch_name(m->arch), b.T, (int)rank, ad->n, b.threads, b.threads == 1 ? "" : "s", compute,
               b.reps, b.warmup);
        if (peak > 0)
            printf("peak (bench peak's %s loop, %d thread%s): %.0f %s, the larger of before the steps (%.0f) and "
                   "after (%.0f)\n",
                   nl_peak_name((nl_peak_kind)pk_kind), b.threads, b.threads == 1 ? "" : "s", peak,
                   nl_peak_unit((nl_peak_kind)pk_kind), peak_before, peak_after > 0 ? peak_after : 0.0);
        printf("%-3s %9s %9s %9s %9s %9s %10s %6s %9s %7s  %s\n", "", "s/step", "cpu s", "service s", "wait s", "tok/s",
               "peak RSS", "kept", "svc GF/s", "of peak", "configuration");
        for (int c = 0; c < N_CFG; c++) {
            if (!res[c].ran) continue;
            char mb[32];
            fmt_mb(mb, sizeof mb, res[c].peak_rss);
            char frac[16];
            if (peak > 0 && c >= CFG_C) snprintf(frac, sizeof frac, "%.2f", svc_gflops(&res[c]) / peak);
            else snprintf(frac, sizeof frac, "-");
            printf("(%s) %9.3f %9.3f %9.3f %9.3f %9.2f %10s %3d/%-2d %9.1f %7s  %s\n", cfg_label[c], res[c].step_s,
                   res[c].cpu_s, res[c].service_s, res[c].wait_s, res[c].tok_s, mb, res[c].n_kept, m->hp.n_layer,
                   svc_gflops(&res[c]), frac, cfg_desc[c]);
        }
        printf("speed-ups:");
        for (int c = 1; c < N_CFG; c++)
            if (res[c].ran && res[c - 1].ran)
                printf("  (%s)/(%s) %.2fx", cfg_label[c], cfg_label[c - 1], res[c - 1].step_s / res[c].step_s);
        printf("\n");
        for (int c = 0; c < N_CFG; c++)
            if (res[c].ran) {
                printf("(%s) resident: %s; planner: %s; loss %.4f\n", cfg_label[c], res[c].resident, res[c].plan,
                       res[c].loss);
            }
        if (b.profile)
            for (int c = 0; c < N_CFG; c++) {
                if (!res[c].ran) continue;
                printf("(%s) main thread:", cfg_label[c]);
                for (int k = 0; k < NL_GP_COUNT; k++) printf(" %s %.3f", nl_graph_prof_name(k), res[c].prof.s[k]);
                printf(" | thread cpu %.3f, process cpu %.3f, %llu requests\n", res[c].thread_cpu_s,
                       res[c].process_cpu_s, (unsigned long long)res[c].prof.requests);
                if (c < CFG_C) continue;
                /* the service's time by shape: each row's rate against bench proj's for the shape
                 * alone (there the weight and the buffers stay in cache) */
                printf("(%s) service by shape, per step:   K x N  type dir  rows/req  req   ms/req  "
                       "GFLOP/s  of peak\n",
                       cfg_label[c]);
                for (int k = 0; k < res[c].n_shapes; k++) {
                    const shape_row *sr = &res[c].shapes[k];
                    if (sr->requests <= 0) continue;
                    const double gf = 2.0 * sr->tokens * (double)sr->K * (double)sr->N / sr->busy_s / 1e9;
                    char frac[16];
                    if (peak > 0) snprintf(frac, sizeof frac, "%.2f", gf / peak);
                    else snprintf(frac, sizeof frac, "-");
                    printf("(%s) %25lld x %-6lld %4s %s %9.0f %4.0f %8.3f %8.1f %8s\n", cfg_label[c], (long long)sr->K,
                           (long long)sr->N, nl_type_name(sr->type), sr->dir ? "bwd" : "fwd", sr->tokens / sr->requests,
                           sr->requests, 1e3 * sr->busy_s / sr->requests, gf, frac);
                }
            }
        printf("notes: cpu s = the main thread's time outside nl_proj_wait; service s = the service's busy time; "
               "svc GF/s = the service requests' 2*T*K*N over its busy time, of peak = that over bench peak's figure "
               "(host rows); "
               "(a) is not an unfused implementation (nightlora has none): it recomputes every layer%s\n",
               peak_ok ? "" : "; peak RSS is the process peak (VmHWM could not be reset)");
    }
    rc = 0;
done:
    if (rc) nl_cli_fail("bench step");
    free(grads);
    free(tok);
    nl_adapter_free(ad);
    nl_model_free(m);
    return rc;
}

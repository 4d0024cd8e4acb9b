/* nightlora bench: benchmarks. `bench peak` (the machine's register-only peaks, cpu/peak.h)
 * and `bench proj` are here; `bench step` lives in
 * tools/cmd_bench_step.c (a weak default below stands in when that file is not built).
 *
 * bench proj: for each distinct (projection shape, resident type) of the model (the precision
 * policy applied, as a run would hold them), each direction and each T of --tokens: the time
 * of one product through the backend of --backend (default host; best of --reps after a
 * warm-up, or of as many as take 0.25 s when that is more, at most 400; compute mode from --compute; vulkan on
 * --vulkan-device) and through ref on the same resident weight (ref only for T <= 64, best of max(1, reps/3), no
 * warm-up: it is slow), and the relative Frobenius difference of the two. Where the CPU has usable AMX and --compute
 * does not already pick it, the AMX tile kernels are timed too (amx_ms / amx_gflops). FLOPs of one product = 2·T·N·K.
 * --json: one JSON array, an object per row (the backend's columns named after it: host_ms, vulkan_ms, ...). A Vulkan
 * device that is a CPU driver (lavapipe) gets no time: "lavapipe: a CPU driver, no speed figure"; its products are
 * still compared with ref. "of peak" (host backend): the GFLOP/s as a fraction of `bench peak`'s figure for the compute
 * mode's instruction (bf16: vdpbf16ps, f32: FMA, amx: TDPBF16PS) at the same thread count, measured at the start and
 * after each shape (a shape's rows take the larger of the two figures around them: host_peak_gflops in JSON).
 * --cold: the timed runs cycle over the shape's weights, each with its own input and output (at most 1 GiB of them),
 * so W, x and y come from memory as in a step, where every request finds them last touched a layer's work ago; the
 * default repeats one weight on one x and y, which stay in the caches (the product's best case). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cpu/peak.h"
#include "model/model.h"
#include "model/quant.h"
#include "nn/forward.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "proj/vulkan.h"
#include "util/json.h"
#include "util/rng.h"
#include "util/util.h"

int nl_cmd_bench_step(int argc, char **argv) __attribute__((weak));
int nl_cmd_bench_step(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "bench step: not built\n");
    return 2;
}

#define REF_MAX_T 64
#define MAX_TOKENS 16

/* "64,512" -> ts[]; 0 ok, -1 bad. */
static int parse_tokens(const char *s, int *ts, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || *n == MAX_TOKENS) return -1;
        ts[(*n)++] = (int)v;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p) return -1;
        } else if (*p) {
            return -1;
        }
    }
    return *n ? 0 : -1;
}

/* Best wall time of `reps` runs (after `warm` untimed ones), and of more while the timed runs
 * have taken less than min_s seconds (at most MAX_RUNS): a product of a millisecond timed only
 * 3 times is mostly the other tenants' luck on a shared machine; < 0 on error. */
#define MAX_RUNS 400

/* --cold: the runs cycle over the shape's weights (model order) and over as many input/output
 * pairs of their own, so a run's W, x and y were last touched a whole cycle earlier, as a
 * step's requests find them (the hot runs repeat one weight on one x and y, which the caches
 * keep) */
typedef struct {
    const nl_proj_weight **w;
    float **x, **y;
    int n;
} cold_ring;

static double time_run(const nl_proj_backend *be, void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T,
                       float *y, int warm, int reps, double min_s, const cold_ring *cr) {
    for (int r = 0; r < warm; r++)
        if (be->run(ctx, w, dir, x, T, y)) return -1;
    double best = INFINITY, total = 0.0;
    for (int r = 0; r < reps || (total < min_s && r < MAX_RUNS); r++) {
        if (cr) w = cr->w[r % cr->n], x = cr->x[r % cr->n], y = cr->y[r % cr->n];
        double t0 = nl_now();
        if (be->run(ctx, w, dir, x, T, y)) return -1;
        double dt = nl_now() - t0;
        total += dt;
        if (dt < best) best = dt;
    }
    return best;
}

/* the timed backend's and the tile kernels' runs last at least this long (ref's do not) */
#define MIN_TIMED_S 0.25

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : (num == 0 ? 0 : INFINITY);
}

/* One distinct (K, N, resident type): its first projection and the kinds sharing it. */
typedef struct {
    int sid;
    int64_t K, N;
    int type;
    int count;
    char label[64]; /* "gate/up" */
} bench_shape;

/* "model name" of /proc/cpuinfo (Linux x86), else "this CPU" */
static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "this CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        snprintf(buf, cap, "%.*s", (int)strcspn(c, "\n"), c);
        break;
    }
    fclose(f);
}

/* The peak of a compute mode at n threads (0 when it has none), measured once per run */
static double peak_for(const char *compute, int threads, double seconds) {
    const int k = nl_peak_of_compute(compute);
    if (k < 0) return 0.0;
    const double p = nl_peak_measure((nl_peak_kind)k, threads, seconds);
    return p > 0 ? p : 0.0;
}

static int cmd_bench_peak(int argc, char **argv) {
    static const char *const known[] = {"threads", "seconds", NULL};
    static const char *const boolean[] = {"json", NULL};
    if (nl_cli_check("bench peak", argc, argv, known, boolean)) return 2;
    nl_proj_config cfg;
    nl_proj_config_defaults(&cfg);
    int64_t nt = cfg.n_threads;
    if (nl_cli_int("bench peak", argc, argv, "threads", 1, 256, &nt) < 0) return 2;
    double secs = 0.3;
    const char *ss = nl_cli_opt(argc, argv, "seconds");
    if (ss) {
        char *end;
        secs = strtod(ss, &end);
        if (end == ss || *end || !(secs >= 0.01 && secs <= 60)) {
            fprintf(stderr, "nightlora bench peak: --seconds %s: expected 0.01..60\n", ss);
            return 2;
        }
    }
    const int json = nl_cli_flag(argc, argv, "json");
    char name[200];
    cpu_name(name, sizeof name);
    if (json) {
        printf("{\"cpu\": ");
        nl_cli_json_str(name);
        printf(", \"threads\": %d, \"seconds\": %g, \"peaks\": [", (int)nt, secs);
    } else {
        printf(
            "bench peak: %s, register-only loops (12 vector accumulators; AMX: 4 accumulator tiles), about %g s each;\n"
            "1 thread, then %d thread%s at once (the sum of their rates); 2 operations per multiply-add\n",
            name, secs, (int)nt, nt == 1 ? "" : "s");
        printf("%-9s %-28s %12s %12s %8s  %s\n", "kind", "instruction", "1 thread", "all", "scaling", "unit");
    }
    int first = 1, any = 0;
    for (int k = 0; k < NL_PEAK_N; k++) {
        const char *insn = nl_peak_insn((nl_peak_kind)k);
        if (!insn) {
            if (!json)
                printf("%-9s %-28s %12s %12s %8s\n", nl_peak_name((nl_peak_kind)k), "(not on this CPU)", "-", "-", "-");
            continue;
        }
        const double one = nl_peak_measure((nl_peak_kind)k, 1, secs);
        const double all = nt > 1 ? nl_peak_measure((nl_peak_kind)k, (int)nt, secs) : one;
        if (one < 0 || all < 0) {
            nl_err("bench peak: %s: a measuring thread did not start", nl_peak_name((nl_peak_kind)k));
            return nl_cli_fail("bench peak");
        }
        any = 1;
        if (json) {
            printf("%s\n {\"kind\": \"%s\", \"instruction\": \"%s\", \"unit\": \"%s\", \"one_thread\": ",
                   first ? "" : ",", nl_peak_name((nl_peak_kind)k), insn, nl_peak_unit((nl_peak_kind)k));
            nl_cli_json_num(one);
            printf(", \"all_threads\": ");
            nl_cli_json_num(all);
            printf("}");
        } else {
            printf("%-9s %-28s %12.1f %12.1f %7.2fx  %s\n", nl_peak_name((nl_peak_kind)k), insn, one, all,
                   one > 0 ? all / one : 0.0, nl_peak_unit((nl_peak_kind)k));
        }
        fflush(stdout);
        first = 0;
    }
    if (json) printf("\n]}\n");
    else if (!any) printf("no peak loop for this CPU in this build\n");
    return 0;
}

static void cold_free(cold_ring *cr) {
    for (int i = 0; i < cr->n; i++) {
        free(cr->x[i]);
        free(cr->y[i]);
    }
    free(cr->w);
    free(cr->x);
    free(cr->y);
    memset(cr, 0, sizeof *cr);
}

/* the ring of one (shape, T, direction): the shape's weights (of the model's projections, service
 * ids ids[], those the shapes' scan counts with its K, N and type, model order), each with an input (a copy of x's
 * first nx floats: the same values) and an output of its own, at most COLD_MAX_BYTES of them (and at least one) */
#define COLD_MAX_BYTES ((size_t)1 << 30)
static int cold_make(cold_ring *cr, nl_proj_service *svc, const nl_model *m, const int *ids, const bench_shape *sh,
                     const float *x, size_t nx, size_t ny) {
    cold_free(cr);
    const size_t pair = sizeof(float) * (nx + ny);
    int n = sh->count;
    if ((size_t)n * pair > COLD_MAX_BYTES) n = (int)(COLD_MAX_BYTES / pair) > 1 ? (int)(COLD_MAX_BYTES / pair) : 1;
    cr->w = nl_calloc((size_t)n, sizeof *cr->w);
    cr->x = nl_calloc((size_t)n, sizeof *cr->x);
    cr->y = nl_calloc((size_t)n, sizeof *cr->y);
    if (!cr->w || !cr->x || !cr->y) return -1;
    for (int j = 0; j < m->n_projs && cr->n < n; j++) {
        const nl_proj_weight *w = nl_proj_get(svc, ids[j]);
        if (m->projs[j].kind == NL_P_EMBED || w->cls == NL_CLASS_EMBED) continue; /* as the shapes' scan */
        if (w->n_in != sh->K || w->n_out != sh->N || w->type != sh->type) continue;
        const int i = cr->n++;
        cr->w[i] = w;
        cr->x[i] = nl_malloc(sizeof(float) * nx);
        cr->y[i] = nl_malloc(sizeof(float) * ny);
        if (!cr->x[i] || !cr->y[i]) {
            free(cr->x[i]);
            free(cr->y[i]);
            return -1;
        }
        memcpy(cr->x[i], x, sizeof(float) * nx);
        memset(cr->y[i], 0, sizeof(float) * ny);
    }
    return 0;
}

static int cmd_bench_proj(int argc, char **argv) {
    static const char *const known[] = {"model", "backend", "vulkan-device", "threads",       "tokens",
                                        "reps",  "compute", "precision",     "precision-map", NULL};
    static const char *const boolean[] = {"json", "cold", NULL};
    if (nl_cli_check("bench proj", argc, argv, known, boolean)) return 2;
    const int cold = nl_cli_flag(argc, argv, "cold");
    const char *model = nl_cli_opt(argc, argv, "model");
    if (!model) {
        fprintf(stderr, "nightlora bench proj: --model is required (see 'nightlora help bench')\n");
        return 2;
    }
    int ts[MAX_TOKENS], n_t = 2;
    ts[0] = 64;
    ts[1] = 512;
    const char *tok = nl_cli_opt(argc, argv, "tokens");
    if (tok && parse_tokens(tok, ts, &n_t)) {
        fprintf(stderr, "nightlora bench proj: --tokens %s: expected a comma-separated list of 1..65536 (at most %d)\n",
                tok, MAX_TOKENS);
        return 2;
    }
    int reps = 3;
    const char *rs = nl_cli_opt(argc, argv, "reps");
    if (rs) {
        char *end;
        long v = strtol(rs, &end, 10);
        if (end == rs || *end || v < 1 || v > 1000) {
            fprintf(stderr, "nightlora bench proj: --reps %s: expected 1..1000\n", rs);
            return 2;
        }
        reps = (int)v;
    }
    const int ref_reps = reps / 3 > 1 ? reps / 3 : 1;
    nl_proj_config cfg;
    if (nl_cli_proj_config("bench proj", argc, argv, &cfg)) return 2;
    /* the backend timed; the service only holds the resident weights here (on ref) */
    const nl_proj_backend *be = nl_proj_backend_find(cfg.backend);
    const char *device = cfg.device;
    const int is_host = be == &nl_proj_backend_host;
    cfg.backend = "ref";
    cfg.device = NULL;
    const int json = nl_cli_flag(argc, argv, "json");

    nl_model *m = nl_model_load(model);
    if (!m) return nl_cli_fail("bench proj");
    nl_proj_service *svc = nl_proj_service_new(&cfg);
    nl_runtime rt;
    memset(&rt, 0, sizeof rt);
    void *hctx = NULL, *rctx = NULL, *actx = NULL;
    bench_shape *sh = NULL;
    float *x = NULL, *y = NULL, *yr = NULL;
    cold_ring cr = {0};
    int rc = 1, n_sh = 0;
    if (!svc || nl_runtime_init(&rt, m, svc)) goto done;
    if (be->init_device ? be->init_device(&hctx, cfg.n_threads, cfg.compute, device)
                        : be->init(&hctx, cfg.n_threads, cfg.compute)) {
        hctx = NULL;
        nl_err_prefix("backend %s", be->name);
        goto done;
    }
    /* a CPU driver's times say nothing of a GPU: none are given */
    char no_speed[300] = "";
    if (!strcmp(be->name, "vulkan") && !strcmp(nl_proj_vulkan_device_kind(hctx), "cpu")) {
        const char *dn = nl_proj_vulkan_device_name(hctx);
        snprintf(no_speed, sizeof no_speed, "%s: a CPU driver, no speed figure",
                 !strncmp(dn, "llvmpipe", 8) ? "lavapipe" : dn);
    }
    char bdesc[512] = "";
    if (be->describe) be->describe(hctx, bdesc, sizeof bdesc);
    /* where the CPU has usable AMX and the host context does not already run it: the tile
     * kernels too, in their own columns */
    if (is_host && nl_proj_host_cpu_has("amx") && strcmp(nl_proj_host_compute(hctx), "amx")) {
        if (nl_proj_backend_host.init(&actx, cfg.n_threads, "amx")) {
            actx = NULL;
            goto done;
        }
    }
    if (nl_proj_backend_ref.init(&rctx, cfg.n_threads, NULL)) {
        rctx = NULL;
        goto done;
    }

    /* distinct (K, N, resident type), in model order; embeddings are row gathers, not products */
    sh = nl_calloc((size_t)m->n_projs, sizeof *sh);
    if (!sh) goto done;
    int64_t max_io = 0;
    for (int i = 0; i < m->n_projs; i++) {
        const nl_proj_weight *w = nl_proj_get(svc, rt.svc_id[i]);
        if (m->projs[i].kind == NL_P_EMBED || w->cls == NL_CLASS_EMBED) continue;
        const char *kind = nl_proj_kind_name(m->projs[i].kind);
        int j = 0;
        while (j < n_sh && !(sh[j].K == w->n_in && sh[j].N == w->n_out && sh[j].type == w->type)) j++;
        if (j == n_sh) {
            sh[j].sid = rt.svc_id[i];
            sh[j].K = w->n_in;
            sh[j].N = w->n_out;
            sh[j].type = w->type;
            n_sh++;
        }
        sh[j].count++;
        /* add the kind to the label once ("gate/up") */
        char pat[24];
        snprintf(pat, sizeof pat, "/%s/", kind);
        char padded[80];
        snprintf(padded, sizeof padded, "/%s/", sh[j].label);
        if (!strstr(padded, pat) && strlen(sh[j].label) + strlen(kind) + 2 < sizeof sh[j].label) {
            if (sh[j].label[0]) strcat(sh[j].label, "/");
            strcat(sh[j].label, kind);
        }
        if (w->n_in > max_io) max_io = w->n_in;
        if (w->n_out > max_io) max_io = w->n_out;
    }
    int t_max = 0;
    for (int i = 0; i < n_t; i++)
        if (ts[i] > t_max) t_max = ts[i];
    x = nl_malloc(sizeof(float) * (size_t)t_max * (size_t)max_io);
    y = nl_malloc(sizeof(float) * (size_t)t_max * (size_t)max_io);
    yr = nl_malloc(sizeof(float) * (size_t)(t_max < REF_MAX_T ? t_max : REF_MAX_T) * (size_t)max_io);
    if (!x || !y || !yr) goto done;
    uint64_t st = 0x62656E6368ull;
    for (size_t i = 0; i < (size_t)t_max * (size_t)max_io; i++)
        x[i] = (float)((double)(nl_splitmix64(&st) >> 11) * (2.0 / 9007199254740992.0) - 1.0);

    /* the peaks of the timed compute modes at this thread count (bench peak's loops, short) */
    const double peak_h =
        is_host && !no_speed[0] ? peak_for(be->compute ? be->compute(hctx) : "f32", cfg.n_threads, 0.4) : 0.0;
    const double peak_a = actx ? peak_for("amx", cfg.n_threads, 0.4) : 0.0;
    if (json) {
        printf("[");
    } else {
        if (peak_h > 0 || peak_a > 0)
            printf("peak (bench peak's loop, %d thread%s, at the start; measured again after each shape, whose rows' "
                   "'of peak' take the larger of the two around them): %s %.0f GFLOP/s%s",
                   cfg.n_threads, cfg.n_threads == 1 ? "" : "s", nl_proj_host_compute(hctx), peak_h,
                   peak_a > 0 ? ", amx " : "\n");
        if (peak_a > 0) printf("%.0f GFLOP/s\n", peak_a);
        if (is_host)
            printf("bench proj: %s %s, host kernels %s compute %s%s, %d thread%s, host best of %d (or of 0.25 s), "
                   "ref best of %d (T <= %d)\n",
                   nl_arch_name(m->arch), model, nl_proj_host_kernels(hctx), nl_proj_host_compute(hctx),
                   actx ? " (and the amx tile kernels)" : "", cfg.n_threads, cfg.n_threads == 1 ? "" : "s", reps,
                   ref_reps, REF_MAX_T);
        else
            printf("bench proj: %s %s, %s backend: %s; %s best of %d (or of 0.25 s), ref best of %d (T <= %d) on %d "
                   "thread%s\n",
                   nl_arch_name(m->arch), model, be->name, bdesc, be->name, reps, ref_reps, REF_MAX_T, cfg.n_threads,
                   cfg.n_threads == 1 ? "" : "s");
        if (no_speed[0]) printf("%s\n", no_speed);
        if (cold)
            printf(
                "cold (--cold): each timed run takes the shape's next weight (all count of them, model order) with an "
                "input and output of its own, as a step finds them\n");
        char bms[32];
        snprintf(bms, sizeof bms, "%s ms", be->name);
        printf("%-14s %5s %12s %-5s %-3s %5s %10s %8s %7s %10s %8s %8s %9s", "proj", "count", "K x N", "type", "dir",
               "T", bms, "GFLOP/s", "of peak", "ref ms", "GFLOP/s", "speedup", "rel diff");
        if (actx) printf(" %10s %8s %7s", "amx ms", "GFLOP/s", "of peak");
        printf("\n");
    }
    int first = 1;
    /* each shape's peaks: measured again after its rows (the next shape's "before"), the larger
     * of the two divides them: a Zen 5 guest's two vCPUs ran at one core's rate for seconds at a
     * time (the 2-thread bf16 loop read 490 between readings of 900), and a start-only figure
     * made rows of a later state read 1.4-1.6 of peak */
    const cold_ring *crp = cold && !no_speed[0] ? &cr : NULL;
    double pk_h = peak_h, pk_a = peak_a;
    for (int s = 0; s < n_sh; s++) {
        const nl_proj_weight *w = nl_proj_get(svc, sh[s].sid);
        struct {
            double th, tr, diff, ta;
        } row[MAX_TOKENS][2];
        for (int ti = 0; ti < n_t; ti++)
            for (int d = 0; d < 2; d++) {
                const int T = ts[ti];
                const nl_dir dir = (nl_dir)d;
                const size_t n_out = (size_t)(dir == NL_FWD ? w->n_out : w->n_in);
                if (!be->supports(hctx, w, dir, T)) {
                    nl_err("%s backend does not support %s %s", be->name, nl_type_name(w->type), dir ? "bwd" : "fwd");
                    goto done;
                }
                const size_t n_in = (size_t)(dir == NL_FWD ? w->n_in : w->n_out);
                if (crp && cold_make(&cr, svc, m, rt.svc_id, &sh[s], x, (size_t)T * n_in, (size_t)T * n_out)) goto done;
                double th = time_run(be, hctx, w, dir, x, T, y, no_speed[0] ? 0 : 1, no_speed[0] ? 1 : reps,
                                     no_speed[0] ? 0.0 : MIN_TIMED_S, crp);
                if (th < 0) goto done;
                /* the compared product: the first weight on x (the cold runs wrote elsewhere) */
                if (crp && T <= REF_MAX_T && be->run(hctx, w, dir, x, T, y)) goto done;
                if (no_speed[0]) th = NAN;
                double tr = NAN, diff = NAN;
                if (T <= REF_MAX_T) {
                    tr = time_run(&nl_proj_backend_ref, rctx, w, dir, x, T, yr, 0, ref_reps, 0.0, NULL);
                    if (tr < 0) goto done;
                    diff = rel_diff(y, yr, (size_t)T * n_out);
                }
                const double ta =
                    actx ? time_run(&nl_proj_backend_host, actx, w, dir, x, T, y, 1, reps, MIN_TIMED_S, crp) : NAN;
                if (ta < 0) goto done;
                row[ti][d].th = th, row[ti][d].tr = tr, row[ti][d].diff = diff, row[ti][d].ta = ta;
            }
        const double nh = peak_h > 0 ? peak_for(be->compute ? be->compute(hctx) : "f32", cfg.n_threads, 0.2) : 0.0;
        const double na = peak_a > 0 ? peak_for("amx", cfg.n_threads, 0.2) : 0.0;
        const double peak_h = pk_h > nh ? pk_h : nh, peak_a = pk_a > na ? pk_a : na;
        pk_h = nh, pk_a = na;
        for (int ti = 0; ti < n_t; ti++)
            for (int d = 0; d < 2; d++) {
                const int T = ts[ti];
                const double flops = 2.0 * T * (double)w->n_in * (double)w->n_out;
                const double th = row[ti][d].th, tr = row[ti][d].tr, diff = row[ti][d].diff, ta = row[ti][d].ta;
                if (json) {
                    printf("%s\n {\"proj\": ", first ? "" : ",");
                    nl_cli_json_str(sh[s].label);
                    printf(", \"count\": %d, \"k\": %lld, \"n\": %lld, \"type\": \"%s\", \"dir\": \"%s\", \"T\": %d, "
                           "\"threads\": %d, \"backend\": \"%s\", \"compute\": \"%s\", \"cold\": %s, \"%s_ms\": ",
                           sh[s].count, (long long)w->n_in, (long long)w->n_out, nl_type_name(w->type),
                           d ? "bwd" : "fwd", T, cfg.n_threads, be->name, be->compute ? be->compute(hctx) : "f32",
                           crp ? "true" : "false", be->name);
                    nl_cli_json_num(th * 1e3);
                    printf(", \"%s_gflops\": ", be->name);
                    nl_cli_json_num(flops / th * 1e-9);
                    printf(", \"%s_of_peak\": ", be->name);
                    nl_cli_json_num(peak_h > 0 ? flops / th * 1e-9 / peak_h : NAN);
                    printf(", \"%s_peak_gflops\": ", be->name);
                    nl_cli_json_num(peak_h > 0 ? peak_h : NAN);
                    printf(", \"ref_ms\": ");
                    nl_cli_json_num(tr * 1e3);
                    printf(", \"ref_gflops\": ");
                    nl_cli_json_num(flops / tr * 1e-9);
                    printf(", \"rel_diff\": ");
                    nl_cli_json_num(diff);
                    if (actx) {
                        printf(", \"amx_ms\": ");
                        nl_cli_json_num(ta * 1e3);
                        printf(", \"amx_gflops\": ");
                        nl_cli_json_num(flops / ta * 1e-9);
                        printf(", \"amx_of_peak\": ");
                        nl_cli_json_num(peak_a > 0 ? flops / ta * 1e-9 / peak_a : NAN);
                    }
                    printf("}");
                } else {
                    char shape[32];
                    snprintf(shape, sizeof shape, "%lldx%lld", (long long)w->n_in, (long long)w->n_out);
                    if (isfinite(th))
                        printf("%-14s %5d %12s %-5s %-3s %5d %10.3f %8.1f", sh[s].label, sh[s].count, shape,
                               nl_type_name(w->type), d ? "bwd" : "fwd", T, th * 1e3, flops / th * 1e-9);
                    else
                        printf("%-14s %5d %12s %-5s %-3s %5d %10s %8s", sh[s].label, sh[s].count, shape,
                               nl_type_name(w->type), d ? "bwd" : "fwd", T, "-", "-");
                    if (peak_h > 0 && isfinite(th)) printf(" %7.2f", flops / th * 1e-9 / peak_h);
                    else printf(" %7s", "-");
                    if (isfinite(tr) && isfinite(th))
                        printf(" %10.3f %8.2f %7.1fx %9.1e", tr * 1e3, flops / tr * 1e-9, tr / th, diff);
                    else if (isfinite(tr)) printf(" %10.3f %8.2f %8s %9.1e", tr * 1e3, flops / tr * 1e-9, "-", diff);
                    else printf(" %10s %8s %8s %9s", "-", "-", "-", "-");
                    if (actx) {
                        printf(" %10.3f %8.1f", ta * 1e3, flops / ta * 1e-9);
                        if (peak_a > 0) printf(" %7.2f", flops / ta * 1e-9 / peak_a);
                        else printf(" %7s", "-");
                    }
                    printf("\n");
                }
                fflush(stdout);
                first = 0;
            }
    }
    if (json) printf("\n]\n");
    rc = 0;

done:
    if (rc) nl_cli_fail("bench proj");
    free(x);
    free(y);
    free(yr);
    free(sh);
    cold_free(&cr);
    if (hctx) be->free(hctx);
    if (actx) nl_proj_backend_host.free(actx);
    if (rctx) nl_proj_backend_ref.free(rctx);
    nl_runtime_free(&rt);
    if (svc) nl_proj_service_free(svc);
    nl_model_free(m);
    return rc;
}

int nl_cmd_bench(int argc, char **argv) {
    const char *sub = argc >= 2 ? argv[1] : NULL;
    if (sub && !strcmp(sub, "peak")) return cmd_bench_peak(argc - 1, argv + 1);
    if (sub && !strcmp(sub, "proj")) return cmd_bench_proj(argc - 1, argv + 1);
    if (sub && !strcmp(sub, "step")) return nl_cmd_bench_step(argc - 1, argv + 1);
    if (sub && (!strcmp(sub, "--help") || !strcmp(sub, "-h"))) {
        printf("usage: nightlora %s\n\n'nightlora bench peak --help', 'nightlora bench proj --help', 'nightlora bench "
               "step --help': each one's flags\n",
               nl_cli_usage("bench"));
        return 0;
    }
    fprintf(stderr,
            "nightlora bench: expected a benchmark, 'peak', 'proj' or 'step'%s%s%s (see 'nightlora help bench')\n",
            sub ? ", not '" : "", sub ? sub : "", sub ? "'" : "");
    return 2;
}

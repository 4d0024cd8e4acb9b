/* proj/planner: at start-up, validate every (projection, direction, token bucket) of the
 * selected backend against ref on the ORIGINAL weight, and route what fails to ref for the
 * whole run (DESIGN §2: "a run never silently mixes precisions").
 *
 * Error measure: relative Frobenius error ||Y - Y_ref||_F / ||Y_ref||_F over the bucket's
 * T×N (FWD) or T×K (BWD) outputs, on uniform [-1, 1) inputs from a fixed seed per
 * (projection, direction). Bounds per RESIDENT type, because the check measures the
 * conversion (e.g. F32 -> Q8_0) plus the backend's arithmetic:
 *   f32 1e-5 (float accumulation vs double), f16/bf16 1e-2, q8_0 2e-2 (random weights give
 *   ~5e-3), q6_k 5e-2, q4_0/q4_k 1e-1 (backends may quantize activations too);
 *   with the FP16 wire at least 1e-2 (inputs and outputs rounded to 11 bits).
 * The input of a smaller bucket is the first rows of the largest one, so ref runs once per
 * (projection, direction). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/quant.h"
#include "proj/proj_impl.h"
#include "util/util.h"

static const int default_buckets[] = {16, 64, 256};

static double type_bound(int type) {
    switch (type) {
    case NL_TYPE_F32: return 1e-5;
    case NL_TYPE_F16:
    case NL_TYPE_BF16: return 1e-2;
    case NL_TYPE_Q8_0: return 2e-2;
    case NL_TYPE_Q6_K: return 5e-2;
    default: return 1e-1; /* q4_0, q4_k */
    }
}

/* splitmix64 -> uniform [-1, 1): deterministic, independent of libc. */
static uint64_t mix(uint64_t *st) {
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rel_frobenius(const float *y, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!isfinite(num) || !isfinite(den)) return NAN;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int nl_proj_plan(nl_proj_service *s, const int *buckets, int n_buckets) {
    if (!buckets || n_buckets <= 0) {
        buckets = default_buckets;
        n_buckets = (int)(sizeof default_buckets / sizeof default_buckets[0]);
    }
    pthread_mutex_lock(&s->mu);
    int busy = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    if (busy) return nl_err("proj: plan: a request is in flight");
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] <= 0 || buckets[i] > (1 << 20)) return nl_err("proj: plan: bad token bucket %d", buckets[i]);

    /* sorted, unique buckets */
    int *b = nl_malloc(sizeof(int) * (size_t)n_buckets);
    if (!b) return -1;
    memcpy(b, buckets, sizeof(int) * (size_t)n_buckets);
    qsort(b, (size_t)n_buckets, sizeof(int), cmp_int);
    int nb = 0;
    for (int i = 0; i < n_buckets; i++)
        if (nb == 0 || b[nb - 1] != b[i]) b[nb++] = b[i];
    const int tmax = b[nb - 1];

    /* fresh routes (all ref) and check list */
    int n_checks = 0;
    for (int i = 0; i < s->n; i++)
        if (s->e[i].res.cls != NL_CLASS_EMBED) n_checks += 2 * nb;
    nl_proj_check *checks = nl_calloc(n_checks ? (size_t)n_checks : 1, sizeof *checks);
    uint8_t **routes = nl_calloc(s->n ? (size_t)s->n : 1, sizeof *routes);
    if (!checks || !routes) goto oom;
    for (int i = 0; i < s->n; i++)
        if (!(routes[i] = nl_calloc(2 * (size_t)nb, 1))) goto oom;

    /* the executing code reads s->buckets / e->route: install the bucket list now, routes at the end */
    free(s->buckets);
    s->buckets = b;
    s->n_buckets = nb;
    b = NULL;
    for (int i = 0; i < s->n; i++) {
        free(s->e[i].route);
        s->e[i].route = routes[i];
        routes[i] = NULL;
    }

    float *x = NULL, *yref = NULL, *ybe = NULL;
    size_t x_n = 0, y_n = 0;
    int ci = 0, rc = 0;
    for (int id = 0; id < s->n && rc == 0; id++) {
        nl_proj_entry *e = &s->e[id];
        if (e->res.cls == NL_CLASS_EMBED) continue; /* row gathers only */
        for (int d = 0; d < 2 && rc == 0; d++) {
            const nl_dir dir = (nl_dir)d;
            const size_t n_in = (size_t)(dir == NL_FWD ? e->res.n_in : e->res.n_out);
            const size_t n_out = (size_t)(dir == NL_FWD ? e->res.n_out : e->res.n_in);
            const int trivial = s->be == &nl_proj_backend_ref && e->res.data == e->orig.data && !s->cfg.wire_f16;
            double bound = type_bound(e->res.type);
            if (s->cfg.wire_f16 && bound < 1e-2) bound = 1e-2;
            int have_ref = 0;
            for (int bi = 0; bi < nb; bi++) {
                const int T = s->buckets[bi];
                nl_proj_check *c = &checks[ci++];
                c->id = id;
                c->dir = dir;
                c->T = T;
                c->bound = bound;
                c->rel_err = NAN;
                c->supported = s->be->supports(s->be_ctx, &e->res, dir, T) != 0;
                if (c->supported && trivial) {
                    c->rel_err = 0; /* the same code on the same bytes */
                } else if (c->supported) {
                    if (!have_ref) {
                        if (tmax * n_in > x_n) {
                            free(x);
                            x_n = (size_t)tmax * n_in;
                            if (!(x = nl_malloc(sizeof(float) * x_n))) { rc = -1; break; }
                        }
                        if (tmax * n_out > y_n) {
                            free(yref);
                            free(ybe);
                            y_n = (size_t)tmax * n_out;
                            yref = nl_malloc(sizeof(float) * y_n);
                            ybe = nl_malloc(sizeof(float) * y_n);
                            if (!yref || !ybe) { rc = -1; break; }
                        }
                        uint64_t st = 0x6E6C706C616E6E72ull ^ ((uint64_t)id << 1 | (uint64_t)d);
                        for (size_t k = 0; k < (size_t)tmax * n_in; k++)
                            x[k] = (float)((double)(mix(&st) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
                        if (nl_proj_exec_ref(s, e, dir, x, tmax, yref)) { rc = -1; break; }
                        have_ref = 1;
                    }
                    memset(&s->wst, 0, sizeof s->wst);
                    if (nl_proj_exec_backend(s, e, dir, x, T, T, ybe) == 0)
                        c->rel_err = rel_frobenius(ybe, yref, (size_t)T * n_out);
                    /* a backend error is a failed check (rel_err stays NaN), not a failed plan */
                }
                c->passed = c->supported && isfinite(c->rel_err) && c->rel_err <= c->bound;
                e->route[d * nb + bi] = c->passed ? NL_ROUTE_BACKEND : NL_ROUTE_REF;
            }
        }
    }
    memset(&s->wst, 0, sizeof s->wst);
    free(x);
    free(yref);
    free(ybe);
    free(routes);
    free(s->checks);
    s->checks = checks;
    s->n_checks = ci;
    if (rc) {
        /* out of memory half way: every route stays at ref, which is always correct */
        for (int i = 0; i < s->n; i++) memset(s->e[i].route, NL_ROUTE_REF, 2 * (size_t)nb);
        return nl_err_prefix("proj: plan");
    }
    return 0;

oom:
    if (routes)
        for (int i = 0; i < s->n; i++) free(routes[i]);
    free(routes);
    free(checks);
    free(b);
    return nl_err("proj: plan: out of memory");
}

void nl_proj_plan_get_totals(const nl_proj_service *s, nl_proj_plan_totals *out) {
    memset(out, 0, sizeof *out);
    out->checks = s->n_checks;
    for (int i = 0; i < s->n_checks; i++) {
        if (s->checks[i].passed) out->passed++;
        else out->routed++;
    }
}

int nl_proj_plan_check_count(const nl_proj_service *s) { return s->n_checks; }

const nl_proj_check *nl_proj_plan_get_check(const nl_proj_service *s, int i) {
    return i >= 0 && i < s->n_checks ? &s->checks[i] : NULL;
}

int nl_proj_plan_format_summary(const nl_proj_service *s, char *buf, size_t cap) {
    nl_proj_plan_totals t;
    nl_proj_plan_get_totals(s, &t);
    return snprintf(buf, cap, "%d checks, %d passed, %d routed to CPU", t.checks, t.passed, t.routed);
}

char *nl_proj_plan_format_table(const nl_proj_service *s) {
    size_t cap = 128 + (size_t)s->n_checks * 160, len = 0;
    char *out = nl_malloc(cap);
    if (!out) return NULL;
    len += (size_t)snprintf(out, cap, "%-32s %-3s %6s %-5s %10s %8s  %s\n", "projection", "dir", "T", "type",
                            "rel_err", "bound", "result");
    for (int i = 0; i < s->n_checks; i++) {
        const nl_proj_check *c = &s->checks[i];
        const nl_proj_entry *e = &s->e[c->id];
        char err[32];
        if (isnan(c->rel_err)) snprintf(err, sizeof err, "-");
        else snprintf(err, sizeof err, "%.2e", c->rel_err);
        const char *why = c->passed ? "ok" : !c->supported ? "routed to CPU (unsupported)"
                                                           : "routed to CPU (error above bound)";
        int n = snprintf(out + len, cap - len, "%-32.32s %-3s %6d %-5s %10s %8.0e  %s\n", e->name,
                         c->dir == NL_FWD ? "fwd" : "bwd", c->T, nl_type_name(e->res.type), err, c->bound, why);
        if (n > 0) len += (size_t)n < cap - len ? (size_t)n : cap - len - 1;
    }
    return out;
}

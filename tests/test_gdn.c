/* Tests for nn/gdn: forward vs a float64 reference written here from formats.md §3, streaming
 * (one call == token by token == chunks), backward vs float64 central differences of the
 * reference, cache size accounting, and argument errors.
 *
 * Tolerances (float library vs double reference, values O(1)):
 *   forward y:          |y - y_ref| <= 2e-5 * max(1, |y_ref|)
 *   streaming:          exactly equal (same per-token arithmetic in every split)
 *   backward:           |g - g_fd| <= 1e-4 * max(1, max|g_fd| of that input) + 1e-4 * |g_fd|
 *                       (central differences on the double reference, h = 1e-5) */
#include "cpu/fpmode.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"
#include "nn/gdn.h"

#include "test.h"
#include "util/pool.h"
#include "util/util.h"

/* ---------------- float64 reference, straight from the formulas ---------------- */

typedef struct {
    const double *conv, *dt_bias, *A, *norm;
} refw;

static double r_sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_silu(double x) { return x * r_sig(x); }
static double r_softplus(double x) { return x > 20.0 ? x : log(1.0 + exp(x)); }

/* hist[(K-1)][cd] (oldest first) and S[Hv][dk][dv] are the incoming state (may be NULL = zeros);
 * they are updated when non-NULL. */
static void ref_forward(const nl_gdn_shape *s, const refw *w, double *y, const double *mixed, const double *z,
                        const double *b, const double *a, int T, double *hist, double *S_io) {
    int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv, K = s->K, cd = nl_gdn_conv_dim(s);
    double eps = s->eps;
    /* full input sequence with the history in front: rows -(K-1) .. T-1 */
    double *seq = calloc((size_t)(T + K - 1) * cd, sizeof(double));
    if (hist) memcpy(seq, hist, sizeof(double) * (size_t)(K - 1) * cd);
    memcpy(seq + (size_t)(K - 1) * cd, mixed, sizeof(double) * (size_t)T * cd);
    double *S = calloc((size_t)Hv * dk * dv, sizeof(double));
    if (S_io) memcpy(S, S_io, sizeof(double) * (size_t)Hv * dk * dv);
    double *c = malloc(sizeof(double) * cd), *Sp = malloc(sizeof(double) * dk * dv);
    double *u = malloc(sizeof(double) * dv), *o = malloc(sizeof(double) * dv);
    for (int t = 0; t < T; t++) {
        for (int ch = 0; ch < cd; ch++) {
            double acc = 0;
            for (int i = 0; i < K; i++) acc += w->conv[ch * K + i] * seq[(size_t)(t + i) * cd + ch];
            c[ch] = r_silu(acc);
        }
        for (int h = 0; h < 2 * Hk; h++) { /* l2norm of each q and k head */
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += c[h * dk + i] * c[h * dk + i];
            double n = sqrt(ss);
            if (n < eps) n = eps;
            for (int i = 0; i < dk; i++) c[h * dk + i] /= n;
        }
        for (int j = 0; j < Hv; j++) {
            int kh = s->kv_tiled ? j % Hk : j / (Hv / Hk);
            const double *q = c + kh * dk, *k = c + Hk * dk + kh * dk, *v = c + 2 * Hk * dk + j * dv;
            double beta = r_sig(b[t * Hv + j]);
            double g = w->A[j] * r_softplus(a[t * Hv + j] + w->dt_bias[j]);
            double *Sj = S + (size_t)j * dk * dv;
            for (int i = 0; i < dk * dv; i++) Sp[i] = exp(g) * Sj[i];
            for (int cc = 0; cc < dv; cc++) {
                double pr = 0;
                for (int i = 0; i < dk; i++) pr += Sp[i * dv + cc] * k[i];
                u[cc] = beta * (v[cc] - pr);
            }
            for (int i = 0; i < dk; i++)
                for (int cc = 0; cc < dv; cc++) Sj[i * dv + cc] = Sp[i * dv + cc] + k[i] * u[cc];
            double ss = 0;
            for (int cc = 0; cc < dv; cc++) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += Sj[i * dv + cc] * q[i];
                o[cc] = acc / sqrt((double)dk);
                ss += o[cc] * o[cc];
            }
            double rs = 1.0 / sqrt(ss / dv + eps);
            for (int cc = 0; cc < dv; cc++) {
                int ix = t * Hv * dv + j * dv + cc;
                y[ix] = o[cc] * rs * w->norm[cc] * r_silu(z[ix]);
            }
        }
    }
    if (hist) memcpy(hist, seq + (size_t)T * cd, sizeof(double) * (size_t)(K - 1) * cd);
    if (S_io) memcpy(S_io, S, sizeof(double) * (size_t)Hv * dk * dv);
    free(seq);
    free(S);
    free(c);
    free(Sp);
    free(u);
    free(o);
}

/* ---------------- fixtures ---------------- */

typedef struct {
    nl_gdn_shape s;
    int cd, T;
    float *conv, *dt, *A, *norm; /* weights */
    double *dconv, *ddt, *dA, *dnorm;
    float *mixed, *z, *b, *a; /* inputs */
    double *dmixed, *dz, *db, *da;
} fix;

static void fill(float *f, double *d, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) {
        double x = lo + (hi - lo) * 0.5 * (nl_t_rand() + 1.0);
        f[i] = (float)x;
        d[i] = (double)f[i]; /* the reference sees exactly the float inputs */
    }
}

static void fix_init(fix *F, int Hk, int Hv, int dk, int dv, int K, int tiled, int T) {
    memset(F, 0, sizeof *F);
    F->s = (nl_gdn_shape){.Hk = Hk, .Hv = Hv, .dk = dk, .dv = dv, .K = K, .eps = 1e-6f, .kv_tiled = tiled};
    F->cd = nl_gdn_conv_dim(&F->s);
    F->T = T;
    int cd = F->cd;
#define ALLOC2(f, d, n) (f = malloc(sizeof(float) * (n)), d = malloc(sizeof(double) * (n)))
    ALLOC2(F->conv, F->dconv, (size_t)cd * K);
    ALLOC2(F->dt, F->ddt, Hv);
    ALLOC2(F->A, F->dA, Hv);
    ALLOC2(F->norm, F->dnorm, dv);
    ALLOC2(F->mixed, F->dmixed, (size_t)T * cd);
    ALLOC2(F->z, F->dz, (size_t)T * Hv * dv);
    ALLOC2(F->b, F->db, (size_t)T * Hv);
    ALLOC2(F->a, F->da, (size_t)T * Hv);
    fill(F->conv, F->dconv, (size_t)cd * K, -0.8, 0.8);
    fill(F->dt, F->ddt, Hv, -1.0, 1.0);
    fill(F->A, F->dA, Hv, -1.5, -0.2);
    fill(F->norm, F->dnorm, dv, 0.5, 1.5);
    fill(F->mixed, F->dmixed, (size_t)T * cd, -1.5, 1.5);
    fill(F->z, F->dz, (size_t)T * Hv * dv, -2.0, 2.0);
    fill(F->b, F->db, (size_t)T * Hv, -2.0, 2.0);
    fill(F->a, F->da, (size_t)T * Hv, -2.0, 2.0);
}

static void fix_free(fix *F) {
    free(F->conv);
    free(F->dconv);
    free(F->dt);
    free(F->ddt);
    free(F->A);
    free(F->dA);
    free(F->norm);
    free(F->dnorm);
    free(F->mixed);
    free(F->dmixed);
    free(F->z);
    free(F->dz);
    free(F->b);
    free(F->db);
    free(F->a);
    free(F->da);
}

static nl_gdn_weights fw(const fix *F) {
    return (nl_gdn_weights){.conv = F->conv, .dt_bias = F->dt, .A = F->A, .norm = F->norm};
}
static refw rw(const fix *F) { return (refw){F->dconv, F->ddt, F->dA, F->dnorm}; }

/* ---------------- (a) forward vs reference ---------------- */

static void test_forward(int tiled, int with_state) {
    fix F;
    int T = 37;
    fix_init(&F, 2, 4, 5, 3, 4, tiled, T);
    int cd = F.cd, Hv = 4, dk = 5, dv = 3, K = 4;
    size_t ny = (size_t)T * Hv * dv, nh = (size_t)(K - 1) * cd, nS = (size_t)Hv * dk * dv;
    float *y = malloc(sizeof(float) * ny);
    double *yr = malloc(sizeof(double) * ny);
    float *hist = malloc(sizeof(float) * nh), *S = malloc(sizeof(float) * nS);
    double *dh = malloc(sizeof(double) * nh), *dS = malloc(sizeof(double) * nS);
    if (with_state) { /* a random incoming state */
        fill(hist, dh, nh, -1.5, 1.5);
        fill(S, dS, nS, -0.5, 0.5);
    }
    nl_gdn_weights w = fw(&F);
    refw r = rw(&F);
    nl_gdn_state st = {hist, S};
    int rc = nl_gdn_forward(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, with_state ? &st : NULL);
    CHECK(rc == 0);
    ref_forward(&F.s, &r, yr, F.dmixed, F.dz, F.db, F.da, T, with_state ? dh : NULL, with_state ? dS : NULL);
    double err = 0;
    for (size_t i = 0; i < ny; i++) {
        double e = fabs(y[i] - yr[i]) / fmax(1.0, fabs(yr[i]));
        if (e > err) err = e;
    }
    CHECKF(err <= 2e-5, "forward tiled=%d state=%d: max rel err %.3g", tiled, with_state, err);
    if (getenv("NL_TEST_VERBOSE")) printf("forward tiled=%d state=%d: max rel err %.3g\n", tiled, with_state, err);
    if (with_state) {
        double es = 0, eh = 0;
        for (size_t i = 0; i < nS; i++) es = fmax(es, fabs(S[i] - dS[i]) / fmax(1.0, fabs(dS[i])));
        for (size_t i = 0; i < nh; i++) eh = fmax(eh, fabs(hist[i] - dh[i]));
        CHECKF(es <= 2e-5, "final S err %.3g", es);
        CHECKF(eh == 0, "final conv history err %.3g", eh);
    }
    /* the training forward gives the same y bit for bit (zero start only) */
    if (!with_state) {
        nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, T + 3);
        float *y2 = malloc(sizeof(float) * ny);
        CHECK(c && nl_gdn_forward_train(NULL, NULL, &F.s, &w, y2, F.mixed, F.z, F.b, F.a, T, c) == 0);
        CHECK(memcmp(y, y2, sizeof(float) * ny) == 0);
        free(y2);
        nl_gdn_cache_free(c);
    }
    free(y);
    free(yr);
    free(hist);
    free(S);
    free(dh);
    free(dS);
    fix_free(&F);
}

/* A shape where Hk == Hv and K == 1 (no conv history), and one with dk, dv > 8 (dot tails). */
static void test_forward_shapes(void) {
    int shapes[][6] = {{3, 3, 4, 6, 1, 0}, {1, 2, 19, 11, 3, 1}};
    for (int si = 0; si < 2; si++) {
        int *p = shapes[si];
        fix F;
        int T = 21;
        fix_init(&F, p[0], p[1], p[2], p[3], p[4], p[5], T);
        size_t ny = (size_t)T * p[1] * p[3];
        float *y = malloc(sizeof(float) * ny);
        double *yr = malloc(sizeof(double) * ny);
        nl_gdn_weights w = fw(&F);
        refw r = rw(&F);
        CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, NULL) == 0);
        ref_forward(&F.s, &r, yr, F.dmixed, F.dz, F.db, F.da, T, NULL, NULL);
        double err = 0;
        for (size_t i = 0; i < ny; i++) err = fmax(err, fabs(y[i] - yr[i]) / fmax(1.0, fabs(yr[i])));
        CHECKF(err <= 2e-5, "forward shape %d: max rel err %.3g", si, err);
        /* streamed in pieces of 4 (K = 1 needs no conv history: state.conv may be NULL) */
        float *y2 = malloc(sizeof(float) * ny), *S = calloc((size_t)p[1] * p[2] * p[3], sizeof(float));
        float *hist = p[4] > 1 ? calloc((size_t)(p[4] - 1) * F.cd, sizeof(float)) : NULL;
        nl_gdn_state st = {hist, S};
        int vd = p[1] * p[3];
        for (int t0 = 0; t0 < T; t0 += 4) {
            int n = T - t0 < 4 ? T - t0 : 4;
            CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, y2 + (size_t)t0 * vd, F.mixed + (size_t)t0 * F.cd,
                                 F.z + (size_t)t0 * vd, F.b + (size_t)t0 * p[1], F.a + (size_t)t0 * p[1], n, &st) == 0);
        }
        CHECKF(memcmp(y, y2, sizeof(float) * ny) == 0, "shape %d: streamed y differs", si);
        free(y2);
        free(S);
        free(hist);
        free(y);
        free(yr);
        fix_free(&F);
    }
}

/* ---------------- (b) streaming ---------------- */

static void test_streaming(int tiled) {
    fix F;
    int T = 37;
    fix_init(&F, 2, 4, 5, 3, 4, tiled, T);
    int cd = F.cd, Hv = 4, dk = 5, dv = 3, K = 4, vd = Hv * dv;
    size_t ny = (size_t)T * vd, nh = (size_t)(K - 1) * cd, nS = (size_t)Hv * dk * dv;
    nl_gdn_weights w = fw(&F);
    float *y[3], *hist[3], *S[3];
    int steps[3] = {T, 1, 5};
    for (int m = 0; m < 3; m++) {
        y[m] = malloc(sizeof(float) * ny);
        hist[m] = calloc(nh, sizeof(float));
        S[m] = calloc(nS, sizeof(float));
        nl_gdn_state st = {hist[m], S[m]};
        int ok = 1;
        for (int t0 = 0; t0 < T; t0 += steps[m]) {
            int n = T - t0 < steps[m] ? T - t0 : steps[m];
            ok &= nl_gdn_forward(NULL, NULL, &F.s, &w, y[m] + (size_t)t0 * vd, F.mixed + (size_t)t0 * cd,
                                 F.z + (size_t)t0 * vd, F.b + (size_t)t0 * Hv, F.a + (size_t)t0 * Hv, n, &st) == 0;
        }
        CHECK(ok);
    }
    float *y0 = malloc(sizeof(float) * ny);
    CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, y0, F.mixed, F.z, F.b, F.a, T, NULL) == 0);
    CHECKF(memcmp(y0, y[0], sizeof(float) * ny) == 0, "state=NULL vs zero state differ");
    for (int m = 1; m < 3; m++) {
        CHECKF(memcmp(y[0], y[m], sizeof(float) * ny) == 0, "y: one call vs steps of %d differ", steps[m]);
        CHECKF(memcmp(S[0], S[m], sizeof(float) * nS) == 0, "S: one call vs steps of %d differ", steps[m]);
        CHECKF(memcmp(hist[0], hist[m], sizeof(float) * nh) == 0, "conv: one call vs steps of %d differ", steps[m]);
    }
    /* and the streamed final conv history is the last K-1 inputs */
    CHECK(memcmp(hist[0], F.mixed + (size_t)(T - K + 1) * cd, sizeof(float) * nh) == 0);
    for (int m = 0; m < 3; m++) {
        free(y[m]);
        free(hist[m]);
        free(S[m]);
    }
    free(y0);
    fix_free(&F);
}

/* ---------------- (c) backward vs central differences ---------------- */

static double ref_loss(const fix *F, const double *rvec, double *ybuf) {
    refw r = rw(F);
    ref_forward(&F->s, &r, ybuf, F->dmixed, F->dz, F->db, F->da, F->T, NULL, NULL);
    size_t ny = (size_t)F->T * F->s.Hv * F->s.dv;
    double L = 0;
    for (size_t i = 0; i < ny; i++) L += rvec[i] * ybuf[i];
    return L;
}

/* Central difference of L with respect to x[i] (the double copy the reference reads). */
static double fd(fix *F, double *x, size_t i, const double *rvec, double *ybuf) {
    const double h = 1e-5;
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = ref_loss(F, rvec, ybuf);
    x[i] = x0 - h;
    double lm = ref_loss(F, rvec, ybuf);
    x[i] = x0;
    return (lp - lm) / (2 * h);
}

/* The four differentiated inputs: the double copy the reference reads, the gradient, the size. */
typedef struct {
    const char *name;
    double *x;
    const float *g;
    size_t n;
} grad_in;

static void grad_inputs(grad_in in[4], fix *F, const float *gm, const float *gz, const float *gb, const float *ga) {
    size_t T = (size_t)F->T, Hv = (size_t)F->s.Hv;
    in[0] = (grad_in){"mixed", F->dmixed, gm, T * F->cd};
    in[1] = (grad_in){"z", F->dz, gz, T * Hv * F->s.dv};
    in[2] = (grad_in){"b", F->db, gb, T * Hv};
    in[3] = (grad_in){"a", F->da, ga, T * Hv};
}

/* Inputs checked by central differences: every one, or every fd_stride-th for the large shapes
 * (each difference is two reference forwards). */
static size_t fd_stride = 1;

/* Gates of the backward cases: 0 as fix_init; 1 decays near 0 (g ~ -7..-52, α down to e^-52;
 * their products in a chunk underflow to 0); 2 decays near 1 (g ~ -1e-4); 3 β near 0 and 1 (b = ±12 on
 * alternate tokens). */
static int gate_mode = 0;

static void set_gates(fix *F) {
    int T = F->T, Hv = F->s.Hv;
    for (int j = 0; j < Hv && gate_mode == 1; j++) F->dA[j] = F->A[j] = -10.0f - (float)j;
    for (int i = 0; i < T * Hv; i++) {
        if (gate_mode == 1) F->a[i] = 1.0f + 2.0f * (float)(0.5 * (nl_t_rand() + 1.0));
        if (gate_mode == 2) F->a[i] = -12.0f + (float)(0.5 * (nl_t_rand() + 1.0));
        if (gate_mode == 3) F->b[i] = (i / Hv) % 2 ? 12.0f : -12.0f;
        F->da[i] = F->a[i];
        F->db[i] = F->b[i];
    }
}

static void test_backward_shape(int Hk, int Hv, int dk, int dv, int K, int tiled, int T) {
    fix F;
    fix_init(&F, Hk, Hv, dk, dv, K, tiled, T);
    if (gate_mode) set_gates(&F);
    int cd = F.cd, vd = Hv * dv;
    size_t ny = (size_t)T * vd;
    double *rvec = malloc(sizeof(double) * ny), *ybuf = malloc(sizeof(double) * ny);
    float *dy = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < ny; i++) {
        dy[i] = (float)nl_t_rand();
        rvec[i] = dy[i];
    }
    nl_gdn_weights w = fw(&F);
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, T > 40 ? T : 40);
    float *gm = malloc(sizeof(float) * (size_t)T * cd), *gz = malloc(sizeof(float) * ny);
    float *gb = malloc(sizeof(float) * (size_t)T * Hv), *ga = malloc(sizeof(float) * (size_t)T * Hv);
    CHECK(c != NULL);
    CHECK(nl_gdn_forward_train(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, c) == 0);
    for (size_t i = 0; i < (size_t)T * cd; i++) gm[i] = NAN; /* the backward writes every element */
    CHECK(nl_gdn_backward(NULL, NULL, &F.s, &w, c, dy, T, gm, gz, gb, ga) == 0);
    grad_in in[4];
    grad_inputs(in, &F, gm, gz, gb, ga);
    for (int v = 0; v < 4; v++) {
        int finite = 1;
        for (size_t i = 0; i < in[v].n; i++) finite &= isfinite(in[v].g[i]) != 0;
        CHECKF(finite, "d%s tiled=%d T=%d gates %d: not finite", in[v].name, tiled, T, gate_mode);
        double *ref = malloc(sizeof(double) * in[v].n), gmax = 0, err = 0;
        size_t st = in[v].n > 200 ? fd_stride : 1;
        for (size_t i = 0; i < in[v].n; i += st) {
            ref[i] = fd(&F, in[v].x, i, rvec, ybuf);
            gmax = fmax(gmax, fabs(ref[i]));
        }
        size_t worst = 0;
        int bad = 0;
        for (size_t i = 0; i < in[v].n; i += st) {
            double e = fabs(in[v].g[i] - ref[i]);
            if (e > 1e-4 * fmax(1.0, gmax) + 1e-4 * fabs(ref[i])) bad++;
            if (e > err) err = e, worst = i;
        }
        CHECKF(bad == 0, "d%s tiled=%d T=%d: %d bad, max err %.3g at %zu (%.6g vs %.6g), max|g| %.3g", in[v].name,
               tiled, T, bad, err, worst, (double)in[v].g[worst], ref[worst], gmax);
        /* (at T = 1 da is exactly 0: the decay only scales the zero initial state) */
        /* (and the gate gradients are ~0 where the gates saturate: a for decays near 0 and 1, b
         * for β near 0 and 1) */
        if (!(v == 3 && T == 1) && !(v == 3 && (gate_mode == 1 || gate_mode == 2)) && !(v == 2 && gate_mode == 3))
            CHECKF(gmax > 1e-3, "d%s: reference gradient is ~0 (test would be vacuous)", in[v].name);
        if (getenv("NL_TEST_VERBOSE"))
            printf("d%-5s tiled=%d T=%2d dk=%d dv=%d gates %d: max err %.3g, rel to max(1,max|g|) %.3g, max|g| %.3g\n",
                   in[v].name, tiled, T, dk, dv, gate_mode, err, err / fmax(1.0, gmax), gmax);
        free(ref);
    }
    nl_gdn_cache_free(c);
    free(rvec);
    free(ybuf);
    free(dy);
    free(y);
    free(gm);
    free(gz);
    free(gb);
    free(ga);
    fix_free(&F);
}

static void test_backward(int tiled, int T) { test_backward_shape(2, 4, 5, 3, 4, tiled, T); }

/* Large shapes (dk = dv = 128 and a column tail: the vector kernels' full blocks) where a
 * difference per input is too slow: one random direction per input vector, the double
 * reference's central difference along it vs the gradient's projection on it. */
static void test_backward_direction(int Hk, int Hv, int dk, int dv, int tiled, int T) {
    fix F;
    fix_init(&F, Hk, Hv, dk, dv, 4, tiled, T);
    int cd = F.cd;
    size_t ny = (size_t)T * Hv * dv;
    double *rvec = malloc(sizeof(double) * ny), *ybuf = malloc(sizeof(double) * ny);
    float *dy = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < ny; i++) rvec[i] = dy[i] = (float)nl_t_rand();
    nl_gdn_weights w = fw(&F);
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, T);
    float *gm = malloc(sizeof(float) * (size_t)T * cd), *gz = malloc(sizeof(float) * ny);
    float *gb = malloc(sizeof(float) * (size_t)T * Hv), *ga = malloc(sizeof(float) * (size_t)T * Hv);
    CHECK(c && nl_gdn_forward_train(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, c) == 0);
    CHECK(c && nl_gdn_backward(NULL, NULL, &F.s, &w, c, dy, T, gm, gz, gb, ga) == 0);
    grad_in in[4];
    grad_inputs(in, &F, gm, gz, gb, ga);
    for (int v = 0; v < 4; v++) {
        size_t n = in[v].n;
        double *dir = malloc(sizeof(double) * n), *x0 = malloc(sizeof(double) * n), gr = 0, ga_ = 0;
        memcpy(x0, in[v].x, sizeof(double) * n);
        for (size_t i = 0; i < n; i++) {
            dir[i] = nl_t_rand();
            gr += in[v].g[i] * dir[i];
            ga_ += fabs(in[v].g[i] * dir[i]);
        }
        const double h = 1e-5;
        for (size_t i = 0; i < n; i++) in[v].x[i] = x0[i] + h * dir[i];
        double lp = ref_loss(&F, rvec, ybuf);
        for (size_t i = 0; i < n; i++) in[v].x[i] = x0[i] - h * dir[i];
        double lm = ref_loss(&F, rvec, ybuf);
        memcpy(in[v].x, x0, sizeof(double) * n);
        double fdv = (lp - lm) / (2 * h), e = fabs(fdv - gr) / fmax(1e-3, ga_);
        CHECKF(e <= 1e-5, "d%s dk=%d dv=%d T=%d: directional %.9g vs %.9g (rel %.3g of %.3g)", in[v].name, dk, dv, T,
               gr, fdv, e, ga_);
        if (getenv("NL_TEST_VERBOSE"))
            printf("d%-5s dk=%d dv=%d T=%d: directional rel err %.3g (of sum|g r| %.3g)\n", in[v].name, dk, dv, T, e,
                   ga_);
        free(dir);
        free(x0);
    }
    nl_gdn_cache_free(c);
    free(rvec);
    free(ybuf);
    free(dy);
    free(y);
    free(gm);
    free(gz);
    free(gb);
    free(ga);
    fix_free(&F);
}

/* ---------------- (d) cache size ---------------- */

static void test_cache_size(void) {
    nl_gdn_shape s = {.Hk = 2, .Hv = 4, .dk = 5, .dv = 3, .K = 4, .eps = 1e-6f, .kv_tiled = 1};
    uint64_t cd = 2 * 2 * 5 + 4 * 3, per_tok = cd + 4 * 3 + 3 * 4, hs = 4 * 5 * 3;
    for (int T = 1; T <= 70; T++) {
        uint64_t want = 4 * (T * per_tok + (uint64_t)((T - 1) / 16) * hs);
        CHECKF(nl_gdn_cache_bytes(&s, T) == want, "T=%d: %llu vs %llu", T,
               (unsigned long long)nl_gdn_cache_bytes(&s, T), (unsigned long long)want);
    }
    /* checkpoints: none up to 16 tokens, one more every 16 after */
    CHECK(nl_gdn_cache_bytes(&s, 16) - nl_gdn_cache_bytes(&s, 15) == 4 * per_tok);
    CHECK(nl_gdn_cache_bytes(&s, 17) - nl_gdn_cache_bytes(&s, 16) == 4 * (per_tok + hs));
    CHECK(nl_gdn_cache_bytes(&s, 33) - nl_gdn_cache_bytes(&s, 17) == 4 * (16 * per_tok + hs));
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &s, 37);
    CHECK(c && nl_gdn_cache_size(c) == nl_gdn_cache_bytes(&s, 37));
    nl_gdn_cache_free(c);
    /* the qwen35-0.8b layer at T = 512: 31 checkpoints of 1 MiB dominate */
    nl_gdn_shape q = {.Hk = 16, .Hv = 16, .dk = 128, .dv = 128, .K = 4, .eps = 1e-6f, .kv_tiled = 1};
    CHECK(nl_gdn_cache_bytes(&q, 512) == 4ull * (512ull * (6144 + 2048 + 48) + 31ull * 16 * 128 * 128));
    CHECK(nl_gdn_cache_bytes(&s, 0) == 0);
    nl_gdn_shape bad = s;
    bad.Hv = 3;
    CHECK(nl_gdn_cache_bytes(&bad, 10) == 0);
    /* one thread: (Hv/Hk + 2) states, 128 dk- and 208 dv-rows, the transposed conv kernel */
    CHECK(nl_gdn_backward_work_bytes(&q) == 4ull * (3 * 128 * 128 + 128 * 128 + 208 * 128 + 4 * 6144));
    CHECK(nl_gdn_backward_work_bytes(&s) == 4ull * (4 * 5 * 3 + 128 * 5 + 208 * 3 + 4 * cd));
    CHECK(nl_gdn_backward_thread_bytes(&q) == 4ull * (3 * 128 * 128 + 128 * 128 + 208 * 128));
    nl_gdn_shape q2 = q;
    q2.Hv = 48; /* three value heads a key head: three carried gradients */
    CHECK(nl_gdn_backward_thread_bytes(&q2) == 4ull * (5 * 128 * 128 + 128 * 128 + 208 * 128));
}

/* ---------------- errors ---------------- */

static void test_errors(void) {
    fix F;
    fix_init(&F, 2, 4, 5, 3, 4, 1, 20);
    nl_gdn_weights w = fw(&F);
    float *y = malloc(sizeof(float) * 20 * 12), *dm = malloc(sizeof(float) * 20 * F.cd);
    float *dz = malloc(sizeof(float) * 20 * 12), *db = malloc(sizeof(float) * 80), *da = malloc(sizeof(float) * 80);
    nl_gdn_shape bad = F.s;
    bad.Hv = 3;
    CHECK(nl_gdn_forward(NULL, NULL, &bad, &w, y, F.mixed, F.z, F.b, F.a, 20, NULL) == -1);
    CHECK(strstr(nl_last_error(), "multiple") != NULL);
    CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, 0, NULL) == 0);
    CHECK(nl_gdn_cache_new(NULL, &F.s, 0) == NULL);
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, 10);
    CHECK(c != NULL);
    CHECK(nl_gdn_backward(NULL, NULL, &F.s, &w, c, y, 10, dm, dz, db, da) == -1); /* no forward yet */
    CHECK(nl_gdn_forward_train(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, 20, c) == -1);
    CHECK(strstr(nl_last_error(), "at most 10") != NULL);
    CHECK(nl_gdn_forward_train(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, 10, c) == 0);
    CHECK(nl_gdn_backward(NULL, NULL, &F.s, &w, c, y, 9, dm, dz, db, da) == -1);
    nl_gdn_shape other = F.s;
    other.kv_tiled = 0;
    CHECK(nl_gdn_backward(NULL, NULL, &other, &w, c, y, 10, dm, dz, db, da) == -1);
    CHECK(nl_gdn_backward(NULL, NULL, &F.s, &w, c, y, 10, dm, dz, db, da) == 0);
    nl_gdn_cache_free(c);
    free(y);
    free(dm);
    free(dz);
    free(db);
    free(da);
    fix_free(&F);
}

/* ---------------- (e) the SIMD kernels against the portable ones ---------------- */

/* Forward (zero start and a random past state, streamed in two pieces), training forward and
 * backward at each kernel set of the table (portable; AVX2, forced with nl_cpu_use("avx2") also
 * on an AVX-512 CPU, or on aarch64 the neon row; the best, AVX-512 or neonbf16): the same bits. Shapes with dv >= 64
 * (the AVX-512 column blocks; the AVX2 step's are 32), column tails (dv = 70, 21; dk = 33, 17, 13, 9: the products' 16-
 * and 8-column blocks and the portable rest), odd dk, several 16-token chunks and T not a multiple of 16, both head
 * mappings; also the float64 reference at those shapes (with the past state). */
/* the kernel set `name` in use from now on (the portable one where this CPU lacks it): its name */
static const char *use_level(const char *name) {
    if (nl_cpu_use(name) != 0) CHECK(nl_cpu_use("scalar") == 0);
    return nl_cpu_kernels()->name;
}

static void test_simd_same_bits(void) {
    int shapes[][7] = {{2, 4, 33, 70, 4, 1, 37},
                       {1, 2, 17, 128, 3, 0, 50},
                       {1, 1, 9, 64, 4, 1, 16},
                       {2, 2, 128, 128, 4, 1, 40},
                       {2, 4, 13, 21, 4, 0, 47}};
    /* the rows of cpu/kernels.h's table: on aarch64 the middle level is the neon row (the best,
     * neonbf16 where the CPU has FEAT_BF16, shares its GDN entries) */
#if defined(__aarch64__)
    const char *levels[3] = {"scalar", "neon", "auto"};
#else
    const char *levels[3] = {"scalar", "avx2", "auto"};
#endif
    const char *got[3];
    for (int m = 0; m < 3; m++) got[m] = use_level(levels[m]);
    CHECK(nl_cpu_use(NULL) == 0);
    CHECK(!strcmp(got[0], "scalar") && nl_cpu_kernels_find("scalar")->gdn_step == NULL);
    if (strcmp(got[1], levels[1]))
        printf("note: no %s kernels on this CPU; that level runs the portable ones\n", levels[1]);
    printf("note: the best kernel set here: %s\n", got[2]);
    for (int si = 0; si < 5; si++) {
        int *p = shapes[si], Hv = p[1], dk = p[2], dv = p[3], K = p[4], T = p[6];
        fix F;
        fix_init(&F, p[0], Hv, dk, dv, K, p[5], T);
        int cd = F.cd, vd = Hv * dv;
        size_t ny = (size_t)T * vd, nh = (size_t)(K - 1) * cd, nS = (size_t)Hv * dk * dv;
        size_t nm = (size_t)T * cd, ng = (size_t)T * Hv;
        nl_gdn_weights w = fw(&F);
        float *hist0 = malloc(sizeof(float) * nh), *S0 = malloc(sizeof(float) * nS);
        double *dh = malloc(sizeof(double) * nh), *dS = malloc(sizeof(double) * nS);
        fill(hist0, dh, nh, -1.5, 1.5);
        fill(S0, dS, nS, -0.5, 0.5);
        float *dy = malloc(sizeof(float) * ny);
        for (size_t i = 0; i < ny; i++) dy[i] = (float)nl_t_rand();
        float *out[3][9];
        for (int m = 0; m < 3; m++) {
            CHECK(!strcmp(use_level(levels[m]), got[m]));
            float *y = malloc(sizeof(float) * ny), *ys = malloc(sizeof(float) * ny), *yt = malloc(sizeof(float) * ny);
            float *hist = malloc(sizeof(float) * nh), *S = malloc(sizeof(float) * nS);
            memcpy(hist, hist0, sizeof(float) * nh);
            memcpy(S, S0, sizeof(float) * nS);
            CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, NULL) == 0);
            nl_gdn_state st = {hist, S};
            int t1 = T / 3;
            CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, ys, F.mixed, F.z, F.b, F.a, t1, &st) == 0);
            CHECK(nl_gdn_forward(NULL, NULL, &F.s, &w, ys + (size_t)t1 * vd, F.mixed + (size_t)t1 * cd,
                                 F.z + (size_t)t1 * vd, F.b + (size_t)t1 * Hv, F.a + (size_t)t1 * Hv, T - t1,
                                 &st) == 0);
            /* the middle level's training calls take the cache and their temporaries from an
             * arena (the pass's way), the others from the heap: the same bits */
            nl_arena ar = {0};
            nl_arena *ws = m == 1 ? &ar : NULL;
            nl_gdn_cache *c = nl_gdn_cache_new(ws, &F.s, T);
            CHECK(!ws || ar.peak == nl_gdn_cache_arena_bytes(&F.s, T));
            float *gm = malloc(sizeof(float) * nm), *gz = malloc(sizeof(float) * ny);
            float *gb = malloc(sizeof(float) * ng), *ga = malloc(sizeof(float) * ng);
            CHECK(c && nl_gdn_forward_train(NULL, ws, &F.s, &w, yt, F.mixed, F.z, F.b, F.a, T, c) == 0);
            CHECK(c && nl_gdn_backward(NULL, ws, &F.s, &w, c, dy, T, gm, gz, gb, ga) == 0);
            CHECKF(memcmp(y, yt, sizeof(float) * ny) == 0, "shape %d level %s: training forward differs", si, got[m]);
            nl_gdn_cache_free(c);
            nl_arena_free(&ar);
            float *o[9] = {y, ys, S, hist, gm, gz, gb, ga, yt};
            memcpy(out[m], o, sizeof o);
            if (m == 2) { /* vs the float64 reference, from the past state */
                double *yr = malloc(sizeof(double) * ny);
                refw r = rw(&F);
                ref_forward(&F.s, &r, yr, F.dmixed, F.dz, F.db, F.da, T, dh, dS);
                double err = 0, es = 0;
                for (size_t i = 0; i < ny; i++) err = fmax(err, fabs(ys[i] - yr[i]) / fmax(1.0, fabs(yr[i])));
                for (size_t i = 0; i < nS; i++) es = fmax(es, fabs(S[i] - dS[i]) / fmax(1.0, fabs(dS[i])));
                CHECKF(err <= 2e-5 && es <= 2e-5, "shape %d with a past state: y err %.3g, S err %.3g", si, err, es);
                if (getenv("NL_TEST_VERBOSE")) printf("simd shape %d: y err %.3g, S err %.3g\n", si, err, es);
                free(yr);
            }
        }
        CHECK(nl_cpu_use(NULL) == 0);
        size_t len[9] = {ny, ny, nS, nh, nm, ny, ng, ng, ny};
        const char *name[9] = {"y", "y (past state)", "S", "conv history", "dmixed", "dz", "db", "da", "y (train)"};
        for (int m = 1; m < 3; m++)
            for (int v = 0; v < 9; v++)
                CHECKF(memcmp(out[0][v], out[m][v], sizeof(float) * len[v]) == 0,
                       "shape %d: %s differs between level %s and portable", si, name[v], got[m]);
        for (int m = 0; m < 3; m++)
            for (int v = 0; v < 9; v++) free(out[m][v]);
        free(hist0);
        free(S0);
        free(dh);
        free(dS);
        free(dy);
        fix_free(&F);
    }
}

/* ---------------- (e2) each row's GDN entries against their contracts, directly ---------------- */

/* The portable forms' arithmetic per element (nn/gdn.c: step_c, mm_c's row_axpy, silu_d_row with
 * cpu/vecmath.h's nl_fsigmoid): every product rounded, then the add (no contraction at -std=c11),
 * so a row's entry must match these bit for bit. Random data, odd sizes, strided A, both
 * accumulate modes, S_prev separate and in place; SiLU on the values where nl_fexp's masks
 * decide (|x| past 87, ±inf, ±0, tiny). Every row this CPU runs that has the entries. */
static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }

static void ref_step(float *S, const float *Sp, size_t ld, const float *k, const float *v, const float *q, float alpha,
                     float beta, float scale, int dk, int n, float *u, float *r_out, float *o) {
    for (int c = 0; c < n; c++) {
        float p = 0.0f;
        for (int i = 0; i < dk; i++) {
            float x = alpha * Sp[(size_t)i * ld + c];
            S[(size_t)i * ld + c] = x;
            p += k[i] * x;
        }
        float r = v[c] - p;
        if (r_out) r_out[c] = r;
        u[c] = beta * r;
        float oc = 0.0f;
        for (int i = 0; i < dk; i++) {
            float x = S[(size_t)i * ld + c] + k[i] * u[c];
            S[(size_t)i * ld + c] = x;
            oc += q[i] * x;
        }
        o[c] = oc * scale;
    }
}

static void test_row_entries(void) {
    const char *rows[4] = {"avx2", "avx512", "neon", "neonbf16"};
    for (int ri = 0; ri < 4; ri++) {
        const nl_host_kernels *ks = nl_cpu_kernels_find(rows[ri]);
        if (!ks || !ks->gdn_step) continue;
        printf("note: GDN entries of row %s checked directly\n", rows[ri]);
        /* gdn_mm: M rows × N columns × Kd, A row stride ars and column stride acs (1 or, as the
         * backward's transposed products, the row length) */
        int mm_sizes[][3] = {{1, 1, 1},   {5, 37, 3}, {4, 16, 16}, {7, 13, 33},
                             {16, 70, 9}, {3, 4, 1},  {9, 3, 5},   {6, 29, 17}};
        for (int si = 0; si < 8; si++) {
            const int M = mm_sizes[si][0], N = mm_sizes[si][1], Kd = mm_sizes[si][2];
            for (int tr = 0; tr <= 1; tr++)
                for (int acc = 0; acc <= 1; acc++) {
                    const size_t ars = tr ? 1 : (size_t)Kd + 2, acs = tr ? (size_t)M + 1 : 1;
                    const size_t ldb = (size_t)N + 3, ldc = (size_t)N + 5;
                    float *A = malloc(sizeof(float) * (tr ? (size_t)Kd * acs : (size_t)M * ars));
                    float *B = malloc(sizeof(float) * (size_t)Kd * ldb);
                    float *C0 = malloc(sizeof(float) * (size_t)M * ldc), *C1 = malloc(sizeof(float) * (size_t)M * ldc);
                    for (size_t i = 0; i < (tr ? (size_t)Kd * acs : (size_t)M * ars); i++) A[i] = (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)Kd * ldb; i++) B[i] = (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)M * ldc; i++) C0[i] = C1[i] = (float)nl_t_rand();
                    const int j0 = ks->gdn_mm(M, N, Kd, A, ars, acs, B, ldb, C1, ldc, acc);
                    CHECK(j0 >= 0 && j0 <= N);
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < j0; j++) {
                            float c = acc ? C0[(size_t)i * ldc + j] : 0.0f;
                            for (int l = 0; l < Kd; l++)
                                c += A[(size_t)i * ars + (size_t)l * acs] * B[(size_t)l * ldb + j];
                            C0[(size_t)i * ldc + j] = c;
                        }
                    CHECKF(same_bits(C0, C1, (size_t)M * ldc), "row %s gdn_mm %dx%dx%d tr %d acc %d", rows[ri], M, N,
                           Kd, tr, acc);
                    free(A);
                    free(B);
                    free(C0);
                    free(C1);
                }
        }
        /* gdn_step on whole gdn_step_cols blocks of a wider state (row stride ld > columns) */
        int dks[4] = {1, 9, 33, 128};
        const int w = ks->gdn_step_cols;
        for (int di = 0; di < 4; di++)
            for (int mode = 0; mode < 3; mode++) { /* 0: in place, 1: from S_prev, 2: in place, no r_out */
                const int dk = dks[di];
                const size_t ld = (size_t)w + 7, nS = (size_t)dk * ld;
                float *S0 = malloc(sizeof(float) * nS), *S1 = malloc(sizeof(float) * nS),
                      *Sp = malloc(sizeof(float) * nS);
                float k[128], q[128], v[64], u0[64], u1[64], r0[64], r1[64], o0[64], o1[64];
                for (size_t i = 0; i < nS; i++) S0[i] = S1[i] = Sp[i] = (float)nl_t_rand();
                for (int i = 0; i < dk; i++) k[i] = (float)nl_t_rand(), q[i] = (float)nl_t_rand();
                for (int c = 0; c < w; c++) v[c] = (float)nl_t_rand(), r0[c] = r1[c] = 7.0f;
                const float alpha = 0.93f, beta = 0.61f, scale = 1.0f / sqrtf((float)dk);
                ref_step(S0, mode == 1 ? Sp : S0, ld, k, v, q, alpha, beta, scale, dk, w, u0, mode == 2 ? NULL : r0,
                         o0);
                ks->gdn_step(S1, mode == 1 ? Sp : S1, ld, k, v, q, alpha, beta, scale, dk, u1, mode == 2 ? NULL : r1,
                             o1);
                CHECKF(same_bits(S0, S1, nS) && same_bits(u0, u1, w) && same_bits(r0, r1, w) && same_bits(o0, o1, w),
                       "row %s gdn_step dk %d mode %d", rows[ri], dk, mode);
                free(S0);
                free(S1);
                free(Sp);
            }
        /* gdn_scan: n tokens of one block against ref_step token after token (row strides wider
         * than the block, per-token strides of k/q, v, g/β and o as the node's) */
        if (ks->gdn_scan) {
            const int ns[4] = {1, 2, 5, 17};
            for (int di = 0; di < 4; di++)
                for (int ni = 0; ni < 4; ni++) {
                    const int dk = dks[di], n = ns[ni];
                    const size_t ld = (size_t)w + 7, nS = (size_t)dk * ld, ldkq = (size_t)dk + 3;
                    const size_t ldv = (size_t)w + 5, ldg = 3, ldo = (size_t)w + 9;
                    float *S0 = malloc(sizeof(float) * nS), *S1 = malloc(sizeof(float) * nS);
                    float *K = malloc(sizeof(float) * (size_t)n * ldkq), *Q = malloc(sizeof(float) * (size_t)n * ldkq);
                    float *V = malloc(sizeof(float) * (size_t)n * ldv), *G = malloc(sizeof(float) * (size_t)n * ldg);
                    float *Bt = malloc(sizeof(float) * (size_t)n * ldg);
                    float *O0 = malloc(sizeof(float) * (size_t)n * ldo), *O1 = malloc(sizeof(float) * (size_t)n * ldo);
                    float u[64], r[64];
                    for (size_t i = 0; i < nS; i++) S0[i] = S1[i] = (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)n * ldkq; i++) K[i] = (float)nl_t_rand(), Q[i] = (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)n * ldv; i++) V[i] = (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)n * ldg; i++)
                        G[i] = -0.5f * (float)fabs(nl_t_rand()), Bt[i] = 0.5f + 0.4f * (float)nl_t_rand();
                    for (size_t i = 0; i < (size_t)n * ldo; i++) O0[i] = O1[i] = -9.0f;
                    const float scale = 1.0f / sqrtf((float)dk);
                    for (int t = 0; t < n; t++)
                        ref_step(S0, S0, ld, K + t * ldkq, V + t * ldv, Q + t * ldkq, expf(G[t * ldg]), Bt[t * ldg],
                                 scale, dk, w, u, r, O0 + t * ldo);
                    ks->gdn_scan(S1, ld, dk, n, K, Q, ldkq, V, ldv, G, Bt, ldg, scale, O1, ldo);
                    CHECKF(same_bits(S0, S1, nS) && same_bits(O0, O1, (size_t)n * ldo), "row %s gdn_scan dk %d n %d",
                           rows[ri], dk, n);
                    free(S0), free(S1), free(K), free(Q), free(V), free(G), free(Bt), free(O0), free(O1);
                }
        }
        /* gdn_silu against x / (1 + expf(-x)) with the libm this links: every 4099th bit pattern
         * of the 2^32 (exhaustively checked once) and the edges of expf's fast path, in place */
        if (ks->gdn_silu) {
            enum { NB = 4096 };
            static float xs[NB], ys[NB], want[NB];
            const uint64_t stride = 4099;
            int bad = 0, m = 0;
            const float edge[] = {0.0f,   -0.0f,   88.0f,    -88.0f,    87.99f, -87.99f, 103.97f, -103.97f,
                                  1e-30f, -1e-30f, INFINITY, -INFINITY, NAN,    1e-45f,  20.0f,   -20.0f};
            for (uint64_t b = 0; b < (1ull << 32) + sizeof edge / sizeof edge[0]; b += b < (1ull << 32) ? stride : 1) {
                if (b < (1ull << 32)) {
                    const uint32_t u = (uint32_t)b;
                    memcpy(&xs[m], &u, 4);
                } else {
                    xs[m] = edge[b - (1ull << 32)];
                }
                if (++m < NB && b + 1 < (1ull << 32) + sizeof edge / sizeof edge[0]) continue;
                for (int i = 0; i < m; i++) want[i] = xs[i] / (1.0f + expf(-xs[i])), ys[i] = -7.0f;
                memcpy(ys, xs, sizeof(float) * (size_t)m);
                const int done = ks->gdn_silu(ys, ys, m);
                bad += done < 0 || done > m;
                for (int i = 0; i < done; i++) bad += memcmp(&ys[i], &want[i], 4) != 0;
                m = 0;
            }
            CHECKF(bad == 0, "row %s gdn_silu: %d values differ from libm's", rows[ri], bad);
        }
        /* gdn_transpose8: the whole 8×8 blocks, nothing else written */
        int tsz[][2] = {{8, 8}, {13, 21}, {16, 70}, {33, 9}, {7, 40}};
        for (int ti = 0; ti < 5; ti++) {
            const int R = tsz[ti][0], Cc = tsz[ti][1];
            const size_t lds = (size_t)Cc + 1, ldd = (size_t)R + 3;
            float *src = malloc(sizeof(float) * (size_t)R * lds), *dst = malloc(sizeof(float) * (size_t)Cc * ldd);
            for (size_t i = 0; i < (size_t)R * lds; i++) src[i] = (float)nl_t_rand();
            for (size_t i = 0; i < (size_t)Cc * ldd; i++) dst[i] = -9.0f;
            ks->gdn_transpose8(dst, ldd, src, lds, R, Cc);
            int bad = 0;
            for (int c = 0; c < Cc; c++)
                for (int r = 0; r < R; r++) {
                    const int in = r < (R & ~7) && c < (Cc & ~7);
                    const float want = in ? src[(size_t)r * lds + c] : -9.0f;
                    bad += memcmp(&dst[(size_t)c * ldd + r], &want, 4) != 0;
                }
            CHECKF(bad == 0, "row %s gdn_transpose8 %dx%d: %d wrong", rows[ri], R, Cc, bad);
            free(src);
            free(dst);
        }
        /* gdn_silu_d: random x in [-12, 12), then the edges of nl_fexp's range and its masks */
        enum { NX = 203 };
        float x[NX], y0[NX], d0[NX], y1[NX], d1[NX];
        const float edge[] = {0.0f,     -0.0f,     87.0f,  -87.0f,  87.4f,  -87.4f, 88.0f, -88.0f,
                              88.8f,    -88.8f,    100.0f, -100.0f, 1e7f,   -1e7f,  1e30f, -1e30f,
                              INFINITY, -INFINITY, 1e-30f, -1e-30f, 1e-45f, 20.0f,  -20.0f};
        const int ne = (int)(sizeof edge / sizeof edge[0]);
        for (int i = 0; i < NX; i++) x[i] = i < ne ? edge[i] : (float)(12.0 * nl_t_rand());
        for (int n = 1; n <= NX; n += n < 20 ? 1 : 61) {
            for (int i = 0; i < n; i++) {
                const float sg = nl_fsigmoid(x[i]);
                y0[i] = x[i] * sg;
                d0[i] = sg * (1.0f + x[i] * (1.0f - sg));
            }
            const int done = ks->gdn_silu_d(y1, d1, x, n);
            CHECK(done >= 0 && done <= n);
            CHECKF(same_bits(y0, y1, (size_t)done) && same_bits(d0, d1, (size_t)done), "row %s gdn_silu_d n %d",
                   rows[ri], n);
        }
    }
}

/* ---------------- (f) threads ---------------- */

/* Pools of 2 and 3 threads give the same bits as one thread: forward (zero start and a past
 * state), training forward and backward; shapes where several value heads share a key head
 * (both mappings) and where the heads do not split evenly. */
static void test_threads_same_bits(void) {
    int shapes[][7] = {
        {2, 4, 33, 70, 4, 1, 37}, {3, 6, 9, 64, 3, 0, 23}, {1, 2, 5, 3, 4, 1, 35}, {3, 3, 4, 6, 1, 0, 18}};
    nl_pool *pools[3] = {NULL, nl_pool_new(2), nl_pool_new(3)};
    CHECK(pools[1] && pools[2]);
    for (int si = 0; si < 4; si++) {
        int *p = shapes[si], Hv = p[1], dk = p[2], dv = p[3], K = p[4], T = p[6];
        fix F;
        fix_init(&F, p[0], Hv, dk, dv, K, p[5], T);
        int cd = F.cd, vd = Hv * dv;
        size_t ny = (size_t)T * vd, nh = (size_t)(K - 1) * cd, nS = (size_t)Hv * dk * dv;
        size_t nm = (size_t)T * cd, ng = (size_t)T * Hv;
        nl_gdn_weights w = fw(&F);
        float *hist0 = malloc(sizeof(float) * (nh + 1)), *S0 = malloc(sizeof(float) * nS);
        double *dh = malloc(sizeof(double) * (nh + 1)), *dS = malloc(sizeof(double) * nS);
        fill(hist0, dh, nh, -1.5, 1.5);
        fill(S0, dS, nS, -0.5, 0.5);
        float *dy = malloc(sizeof(float) * ny);
        for (size_t i = 0; i < ny; i++) dy[i] = (float)nl_t_rand();
        float *out[3][8];
        for (int m = 0; m < 3; m++) {
            nl_pool *pool = pools[m];
            float *y = malloc(sizeof(float) * ny), *ys = malloc(sizeof(float) * ny);
            float *hist = malloc(sizeof(float) * (nh + 1)), *S = malloc(sizeof(float) * nS);
            memcpy(hist, hist0, sizeof(float) * nh);
            memcpy(S, S0, sizeof(float) * nS);
            CHECK(nl_gdn_forward(pool, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, NULL) == 0);
            nl_gdn_state st = {hist, S};
            CHECK(nl_gdn_forward(pool, NULL, &F.s, &w, ys, F.mixed, F.z, F.b, F.a, T, &st) == 0);
            nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, T);
            float *gm = malloc(sizeof(float) * nm), *gz = malloc(sizeof(float) * ny);
            float *gb = malloc(sizeof(float) * ng), *ga = malloc(sizeof(float) * ng);
            float *yt = malloc(sizeof(float) * ny);
            CHECK(c && nl_gdn_forward_train(pool, NULL, &F.s, &w, yt, F.mixed, F.z, F.b, F.a, T, c) == 0);
            CHECK(c && nl_gdn_backward(pool, NULL, &F.s, &w, c, dy, T, gm, gz, gb, ga) == 0);
            CHECK(memcmp(y, yt, sizeof(float) * ny) == 0);
            free(yt);
            nl_gdn_cache_free(c);
            float *o[8] = {y, ys, S, hist, gm, gz, gb, ga};
            memcpy(out[m], o, sizeof o);
        }
        size_t len[8] = {ny, ny, nS, nh, nm, ny, ng, ng};
        const char *name[8] = {"y", "y (past state)", "S", "conv history", "dmixed", "dz", "db", "da"};
        for (int m = 1; m < 3; m++)
            for (int v = 0; v < 8; v++)
                CHECKF(memcmp(out[0][v], out[m][v], sizeof(float) * len[v]) == 0, "shape %d: %s differs on %d threads",
                       si, name[v], m + 1);
        for (int m = 0; m < 3; m++)
            for (int v = 0; v < 8; v++) free(out[m][v]);
        free(hist0);
        free(S0);
        free(dh);
        free(dS);
        free(dy);
        fix_free(&F);
    }
    nl_pool_free(pools[1]);
    nl_pool_free(pools[2]);
}

/* The node's FP mode (cpu/fpmode.h): under it a denormal reads as zero; after the node's entry
 * points (pool tasks included, on a pool of 2 with gates whose decays underflow) every thread
 * has its own mode back: denormals kept, as IEEE says and as the caller had it. */
static volatile float fp_tiny = 1e-39f; /* an FP32 denormal (FLT_MIN is 1.18e-38) */

static int denormals_kept(void) { return fp_tiny * 1.0f != 0.0f; }

static void pool_probe(void *arg, int task, int n_tasks) {
    (void)n_tasks;
    ((int *)arg)[task] = denormals_kept();
}

static void test_fpmode(void) {
    CHECK(denormals_kept());
#if defined(__x86_64__) || defined(__aarch64__)
    nl_fpmode m = nl_fpmode_flush();
    CHECKF(!denormals_kept(), "nl_fpmode_flush: a denormal still reads as %g", (double)(fp_tiny * 1.0f));
    nl_fpmode_restore(m);
#endif
    CHECK(denormals_kept());
    nl_pool *pool = nl_pool_new(2);
    CHECK(pool != NULL);
    if (!pool) return;
    int T = 37;
    fix F;
    fix_init(&F, 2, 4, 5, 3, 4, 1, T);
    gate_mode = 1;
    set_gates(&F);
    gate_mode = 0;
    size_t ny = (size_t)T * 4 * 3;
    float *y = malloc(sizeof(float) * ny), *dy = malloc(sizeof(float) * ny), *gz = malloc(sizeof(float) * ny);
    float *gm = malloc(sizeof(float) * (size_t)T * F.cd), *gb = malloc(sizeof(float) * (size_t)T * 4);
    float *ga = malloc(sizeof(float) * (size_t)T * 4);
    for (size_t i = 0; i < ny; i++) dy[i] = (float)nl_t_rand();
    nl_gdn_weights w = fw(&F);
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &F.s, T);
    CHECK(c && nl_gdn_forward(pool, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, NULL) == 0);
    CHECK(denormals_kept());
    CHECK(c && nl_gdn_forward_train(pool, NULL, &F.s, &w, y, F.mixed, F.z, F.b, F.a, T, c) == 0);
    CHECK(c && nl_gdn_backward(pool, NULL, &F.s, &w, c, dy, T, gm, gz, gb, ga) == 0);
    CHECKF(denormals_kept(), "the caller's thread left with denormals flushed");
    int kept[2] = {0, 0};
    nl_pool_run(pool, 2, pool_probe, kept);
    CHECKF(kept[0] && kept[1], "a pool thread left with denormals flushed (tasks: %d %d)", kept[0], kept[1]);
    nl_gdn_cache_free(c);
    nl_pool_free(pool);
    free(y);
    free(dy);
    free(gz);
    free(gm);
    free(gb);
    free(ga);
    fix_free(&F);
}

int main(void) {
    for (int tiled = 0; tiled <= 1; tiled++) {
        test_forward(tiled, 0);
        test_forward(tiled, 1);
        test_streaming(tiled);
        test_backward(tiled, 35);
    }
    test_forward_shapes();
    test_backward(1, 1);
    test_backward(0, 16);
    test_backward(1, 17);
    test_backward(0, 32);
    test_backward_shape(1, 2, 11, 10, 3, 1, 20); /* dk, dv > 8: the 8-wide kernel blocks + tails */
    test_backward_shape(3, 3, 4, 6, 1, 0, 18);   /* K = 1, Hk == Hv */
    fd_stride = 5;
    test_backward_shape(1, 2, 9, 67, 3, 1, 35); /* dv >= 64: the SIMD column blocks + a tail; 3 chunks */
    fd_stride = 1;
    /* the chunked backward: T < 16, several chunks with a short last one, dk/dv odd and not
     * multiples of the vector width (16), both head mappings, shared key heads */
    test_backward_shape(1, 2, 7, 19, 3, 0, 5);
    fd_stride = 7;
    test_backward_shape(2, 4, 13, 21, 4, 1, 47);
    fd_stride = 1;
    test_backward_shape(2, 4, 5, 3, 4, 0, 33);
    for (gate_mode = 1; gate_mode <= 3; gate_mode++) {
        test_backward_shape(2, 4, 5, 3, 4, gate_mode & 1, 37);
        test_backward_shape(1, 2, 7, 19, 3, !(gate_mode & 1), 20);
    }
    gate_mode = 0;
    test_backward_direction(2, 2, 128, 128, 1, 40);
    test_backward_direction(1, 2, 128, 70, 0, 37);
    test_simd_same_bits();
    test_threads_same_bits();
    test_cache_size();
    test_errors();
    test_fpmode();
    test_row_entries(); /* last: its random draws leave the other tests' data as it was */
    return nl_t_done();
}

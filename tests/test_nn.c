/* nn/ nodes: RMSNorm, RoPE, SwiGLU, sigmoid gate, cross-entropy, and the fast exp they use.
 * Every forward is compared with a float64 reference written here from the formulas
 * (docs/formats.md §3); every backward with float64 central finite differences of a
 * random linear functional Σ w·out of that reference. Sizes are odd on purpose. */
#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"
#include "nn/nn.h"
#include "nn/par.h"
#include "test.h"

#include <stdint.h>

#define FD_H 1e-5

static double dotd(const double *a, const float *w, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * (double)w[i];
    return s;
}

/* Central finite differences of L(x) = Σ w·f(x) for a double function f with n_x inputs and
 * n_y outputs; g[j] = dL/dx_j. ctx is passed through. */
typedef void (*ref_fn)(double *y, const double *x, void *ctx);
static void fd_grad(double *g, ref_fn f, void *ctx, const float *x0, int64_t nx, const float *w, int64_t ny) {
    double *x = nl_t_to_d(x0, nx), *y = malloc(sizeof(double) * (size_t)ny);
    for (int64_t j = 0; j < nx; j++) {
        const double keep = x[j];
        x[j] = keep + FD_H;
        f(y, x, ctx);
        const double lp = dotd(y, w, ny);
        x[j] = keep - FD_H;
        f(y, x, ctx);
        const double lm = dotd(y, w, ny);
        x[j] = keep;
        g[j] = (lp - lm) / (2 * FD_H);
    }
    free(x);
    free(y);
}

/* ---------------------------------------------------------------- fast exp / sigmoid */
static void test_fexp(void) {
    int nz = 0;
    double worst = 0;
    for (double x = -87.0; x < 88.0; x += 0.0137) {
        const float xf = (float)x;
        const double ref = exp((double)xf);
        const double e = fabs(nl_fexp(xf) - ref) / ref;
        if (e > worst) worst = e;
    }
    CHECKF(worst < 3e-7, "fexp max rel err %g", worst);
    CHECK(nl_fexp(-100.0f) == 0.0f);
    CHECK(nl_fexp(-1e30f) == 0.0f);
    for (float x = -2e7f; x < -1e5f; x *= 0.999f) nz += nl_fexp(x) != 0.0f; /* t < 0 region etc. */
    CHECK(nz == 0);
    CHECK(nl_fexp(-1e9f) == 0.0f);
    CHECK(nl_fexp(-INFINITY) == 0.0f);
    CHECK(isinf(nl_fexp(100.0f)) && nl_fexp(100.0f) > 0);
    CHECK(nl_fexp(0.0f) == 1.0f);
    /* the vector path agrees with the scalar one, tails included */
    float x[21], y[21];
    for (int i = 0; i < 21; i++) x[i] = (float)(20 * nl_t_rand());
    nl_vexp(y, x, 21);
    int same = 1;
    for (int i = 0; i < 21; i++) same &= y[i] == nl_fexp(x[i]);
    CHECK(same);
    CHECK(nl_fsigmoid(-200.0f) == 0.0f && nl_fsigmoid(200.0f) == 1.0f);
    CHECK_NEAR(nl_fsigmoid(0.7f), 1.0 / (1.0 + exp(-0.7)), 1e-7);
}

/* ---------------------------------------------------------------- RMSNorm */
typedef struct {
    int T, n;
    float eps;
    const float *w;
} norm_ctx;
static void norm_ref(double *y, const double *x, void *vc) {
    const norm_ctx *c = vc;
    for (int t = 0; t < c->T; t++) {
        double ss = 0;
        for (int i = 0; i < c->n; i++) ss += x[t * c->n + i] * x[t * c->n + i];
        const double r = 1.0 / sqrt(ss / c->n + c->eps);
        for (int i = 0; i < c->n; i++) y[t * c->n + i] = c->w[i] * x[t * c->n + i] * r;
    }
}
static void test_rmsnorm(void) {
    const int T = 7, n = 13;
    const int64_t N = T * n;
    float x[7 * 13], w[13], y[7 * 13], rstd[7], dy[7 * 13], dx[7 * 13];
    nl_t_fill(x, N, 1.5);
    nl_t_fill(w, n, 1.0);
    nl_t_fill(dy, N, 1.0);
    norm_ctx c = {T, n, 1e-5f, w};
    double yr[7 * 13], g[7 * 13], *xd = nl_t_to_d(x, N);
    norm_ref(yr, xd, &c);
    nl_rmsnorm_forward(y, rstd, x, w, T, n, c.eps);
    CHECKF(nl_t_rel_err(y, yr, N, 1e-6) < 2e-6, "rmsnorm fwd err %g", nl_t_rel_err(y, yr, N, 1e-6));
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += xd[t * n + i] * xd[t * n + i];
        CHECK_NEAR(rstd[t], 1.0 / sqrt(ss / n + c.eps), 1e-6 / sqrt(ss / n));
    }
    /* in place (y aliases x) gives the same */
    float xi[7 * 13];
    memcpy(xi, x, sizeof x);
    nl_rmsnorm_forward(xi, NULL, xi, w, T, n, c.eps);
    CHECK(memcmp(xi, y, sizeof y) == 0);
    nl_rmsnorm_backward(dx, dy, x, w, rstd, T, n);
    fd_grad(g, norm_ref, &c, x, N, dy, N);
    CHECKF(nl_t_rel_err(dx, g, N, 1e-6) < 1e-4, "rmsnorm bwd err %g", nl_t_rel_err(dx, g, N, 1e-6));
    free(xd);
}

/* ---------------------------------------------------------------- RoPE */
typedef struct {
    const nl_rope *r;
    int T, H;
    const int32_t *pos;
} rope_ctx;
static void rope_ref(double *y, const double *x, void *vc) {
    const rope_ctx *c = vc;
    const nl_rope *r = c->r;
    const int hd = r->head_dim, half = r->n_rot / 2;
    memcpy(y, x, sizeof(double) * (size_t)c->T * c->H * hd);
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < half; i++) {
                double th = c->pos[t] * pow(r->base, -2.0 * i / r->n_rot) * r->freq_scale;
                if (r->freq_factors) th /= r->freq_factors[i];
                const int64_t base = ((int64_t)t * c->H + h) * hd;
                const int i0 = r->neox ? i : 2 * i, i1 = r->neox ? i + half : 2 * i + 1;
                const double x0 = x[base + i0], x1 = x[base + i1];
                y[base + i0] = x0 * cos(th) - x1 * sin(th);
                y[base + i1] = x0 * sin(th) + x1 * cos(th);
            }
}
static void test_rope_case(int neox, int n_rot, const float *ff, float freq_scale) {
    enum { T = 7, H = 3, HD = 10 };
    const int64_t N = T * H * HD;
    const int32_t pos[T] = {0, 1, 2, 5, 17, 301, 4099};
    nl_rope r = {
        .head_dim = HD, .n_rot = n_rot, .neox = neox, .base = 10000.0f, .freq_scale = freq_scale, .freq_factors = ff};
    rope_ctx c = {&r, T, H, pos};
    float x[N], y[N], dy[N];
    double yr[N], g[N];
    nl_t_fill(x, N, 1.0);
    nl_t_fill(dy, N, 1.0);
    double *xd = nl_t_to_d(x, N);
    rope_ref(yr, xd, &c);
    memcpy(y, x, sizeof x);
    nl_rope_forward(&r, y, T, H, pos);
    CHECKF(nl_t_rel_err(y, yr, N, 1e-6) < 2e-6, "rope fwd neox=%d n_rot=%d err %g", neox, n_rot,
           nl_t_rel_err(y, yr, N, 1e-6));
    /* dims past n_rot untouched, bit-exact */
    int pass = 1;
    for (int64_t i = 0; i < N; i++)
        if (i % HD >= n_rot) pass &= y[i] == x[i];
    CHECK(pass);
    fd_grad(g, rope_ref, &c, x, N, dy, N);
    float dy_in[N];
    memcpy(dy_in, dy, sizeof dy_in);
    nl_rope_backward(&r, dy, T, H, pos);
    CHECKF(nl_t_rel_err(dy, g, N, 1e-6) < 1e-5, "rope bwd neox=%d n_rot=%d err %g", neox, n_rot,
           nl_t_rel_err(dy, g, N, 1e-6));
    /* the cos/sin table (positions < 302 from it, 4099 computed) gives the same bits */
    float yt[N], dyt[N];
    memcpy(dyt, dy_in, sizeof dyt);
    memcpy(yt, x, sizeof yt);
    CHECK(nl_rope_table(&r, 302) == 0 && r.tab_n == 302);
    nl_rope_forward(&r, yt, T, H, pos);
    nl_rope_backward(&r, dyt, T, H, pos);
    CHECK(memcmp(yt, y, sizeof y) == 0 && memcmp(dyt, dy, sizeof dy) == 0);
    nl_rope_free_table(&r);
    CHECK(r.tab_n == 0 && r.tab_cos == NULL);
    free(xd);
}
static void test_rope(void) {
    const float ff[5] = {1.0f, 1.5f, 2.0f, 8.0f, 8.0f};
    test_rope_case(0, 10, NULL, 1.0f);
    test_rope_case(1, 10, NULL, 1.0f);
    test_rope_case(0, 6, NULL, 1.0f); /* partial rotary */
    test_rope_case(1, 6, NULL, 0.5f);
    test_rope_case(0, 10, ff, 1.0f); /* llama-3 style freq factors */
    test_rope_case(1, 4, ff, 0.25f);
    /* NORM and NEOX really differ (a test that mixed them up would pass both otherwise) */
    float a[10], b[10];
    for (int i = 0; i < 10; i++) a[i] = b[i] = (float)(i + 1);
    const int32_t p = 3;
    nl_rope rn = {.head_dim = 10, .n_rot = 10, .neox = 0, .base = 10000.0f, .freq_scale = 1.0f},
            rx = {.head_dim = 10, .n_rot = 10, .neox = 1, .base = 10000.0f, .freq_scale = 1.0f};
    nl_rope_forward(&rn, a, 1, 1, &p);
    nl_rope_forward(&rx, b, 1, 1, &p);
    CHECK(memcmp(a, b, sizeof a) != 0);
}

/* ---------------------------------------------------------------- SwiGLU, GeGLU and the gate */
typedef struct {
    int64_t n;
    int which;
} ew_ctx; /* which: 0 swiglu, 1 gate, 2 geglu */
static double sigd(double x) { return 1.0 / (1.0 + exp(-x)); }
/* the tanh GELU in float64 */
static double gelud(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static const char *const ew_name[3] = {"swiglu", "gate", "geglu"};
static void ew_fwd(int which, float *y, const float *a, const float *b, int64_t n) {
    if (which == 0) nl_swiglu_forward(y, a, b, n);
    else if (which == 1) nl_gate_forward(y, a, b, n);
    else nl_geglu_forward(y, a, b, n);
}
static void ew_bwd(int which, float *da, float *db, const float *dy, const float *a, const float *b, int64_t n) {
    if (which == 0) nl_swiglu_backward(da, db, dy, a, b, n);
    else if (which == 1) nl_gate_backward(da, db, dy, a, b, n);
    else nl_geglu_backward(da, db, dy, a, b, n);
}
/* x = [a | b] (2n) -> y[n] */
static void ew_ref(double *y, const double *x, void *vc) {
    const ew_ctx *c = vc;
    for (int64_t i = 0; i < c->n; i++) {
        const double a = x[i], b = x[c->n + i];
        y[i] = c->which == 0 ? a * sigd(a) * b : c->which == 1 ? a * sigd(b) : gelud(a) * b;
    }
}
static void test_elementwise(void) {
    enum { N = 37 };
    for (int which = 0; which < 3; which++) {
        float x[2 * N], y[N], dy[N], da[N], db[N];
        double yr[N], g[2 * N];
        nl_t_fill(x, 2 * N, 4.0);
        nl_t_fill(dy, N, 1.0);
        ew_ctx c = {N, which};
        double *xd = nl_t_to_d(x, 2 * N);
        ew_ref(yr, xd, &c);
        ew_fwd(which, y, x, x + N, N);
        CHECKF(nl_t_rel_err(y, yr, N, 1e-6) < 1e-6, "%s fwd err %g", ew_name[which], nl_t_rel_err(y, yr, N, 1e-6));
        ew_bwd(which, da, db, dy, x, x + N, N);
        fd_grad(g, ew_ref, &c, x, 2 * N, dy, N);
        CHECKF(nl_t_rel_err(da, g, N, 1e-6) < 1e-5, "%s bwd da err %g", ew_name[which], nl_t_rel_err(da, g, N, 1e-6));
        CHECKF(nl_t_rel_err(db, g + N, N, 1e-6) < 1e-5, "%s bwd db err %g", ew_name[which],
               nl_t_rel_err(db, g + N, N, 1e-6));
        /* in place: output over an input */
        float xa[2 * N];
        memcpy(xa, x, sizeof x);
        ew_fwd(which, xa, xa, xa + N, N);
        CHECK(memcmp(xa, y, sizeof y) == 0);
        free(xd);
    }
}

/* ---------------------------------------------------------------- cross-entropy */
typedef struct {
    int T, V;
    const int32_t *tg;
    double inv_n;
} xent_ctx;
static void xent_ref(double *y, const double *z, void *vc) { /* y[0] = inv_n · Σ CE */
    const xent_ctx *c = vc;
    double s = 0;
    for (int t = 0; t < c->T; t++) {
        if (c->tg[t] < 0) continue;
        double m = -INFINITY, e = 0;
        for (int j = 0; j < c->V; j++) m = fmax(m, z[t * c->V + j]);
        for (int j = 0; j < c->V; j++) e += exp(z[t * c->V + j] - m);
        s += m + log(e) - z[t * c->V + c->tg[t]];
    }
    y[0] = s * c->inv_n;
}
static void test_xent(void) {
    enum { T = 7, V = 29 };
    const int32_t tg[T] = {3, -1, 0, 28, 11, -1, 5};
    float z[T * V], z0[T * V];
    nl_t_fill(z0, T * V, 3.0);
    const float inv_n = 1.0f / 5;
    xent_ctx c = {T, V, tg, 1.0};
    double ref, *zd = nl_t_to_d(z0, T * V);
    xent_ref(&ref, zd, &c);
    memcpy(z, z0, sizeof z);
    double v = nl_xent_chunk(z, tg, T, V, inv_n, 0);
    CHECK_NEAR(v, ref, 1e-5 * fabs(ref));
    CHECK(memcmp(z, z0, sizeof z) == 0); /* no grad: logits untouched */
    v = nl_xent_chunk(z, tg, T, V, inv_n, 1);
    CHECK_NEAR(v, ref, 1e-5 * fabs(ref));
    double g[T * V];
    const float one = 1.0f;
    c.inv_n = inv_n;
    fd_grad(g, xent_ref, &c, z0, T * V, &one, 1);
    CHECKF(nl_t_rel_err(z, g, T * V, 1e-6) < 1e-4, "xent grad err %g", nl_t_rel_err(z, g, T * V, 1e-6));
    int zero = 1;
    for (int j = 0; j < V; j++) zero &= z[1 * V + j] == 0.0f && z[5 * V + j] == 0.0f;
    CHECK(zero); /* non-target rows */
    /* stability: huge logits (exp would overflow without the max shift) */
    for (int i = 0; i < T * V; i++) z[i] = z0[i] + 1000.0f, zd[i] = z[i];
    xent_ref(&ref, zd, &(xent_ctx){T, V, tg, 1.0});
    v = nl_xent_chunk(z, tg, T, V, inv_n, 1);
    CHECK(isfinite(v));
    CHECK_NEAR(v, ref, 1e-4 * fabs(ref));
    int finite = 1;
    for (int i = 0; i < T * V; i++) finite &= isfinite(z[i]);
    CHECK(finite);
    /* longer rows than the internal exp chunk */
    enum { V2 = 2500 };
    float *zz = malloc(sizeof(float) * 2 * V2);
    nl_t_fill(zz, 2 * V2, 5.0);
    const int32_t tg2[2] = {2499, 1};
    double *zzd = nl_t_to_d(zz, 2 * V2), r2;
    xent_ref(&r2, zzd, &(xent_ctx){2, V2, tg2, 1.0});
    CHECK_NEAR(nl_xent_chunk(zz, tg2, 2, V2, 1.0f, 0), r2, 1e-5 * fabs(r2));
    free(zz);
    free(zzd);
    free(zd);
}

/* ---------------------------------------------------------------- every row, the same bits */
/* The element-wise nodes run their loops through the kernel table's row (nl_vec_kernels: one
 * source, cpu/vec_body.h, built per ISA): each row that runs here gives the scalar row's bits,
 * at odd sizes (the 8-lane tails), with aliasing outputs and rows past the 1024-logit exp chunk. */
enum { RB_T = 3, RB_N = 1037, RB_V = 2113 };
typedef struct {
    float norm[RB_T * RB_N], rstd[RB_T], dnorm[RB_T * RB_N], ew[6][RB_N], rope[2][RB_T * 4 * 22], z[2][RB_T * RB_V];
    float add[4][RB_N];
    double loss[2];
} rows_out;
static void rows_run(rows_out *o) {
    static float x[RB_T * RB_N], w[RB_N], a[RB_N], b[RB_N], dy[RB_T * RB_N], z0[RB_T * RB_V], r0[RB_T * 4 * 22];
    nl_t_rng_state = 0x1234567ULL;
    nl_t_fill(x, RB_T * RB_N, 2.0);
    nl_t_fill(w, RB_N, 1.0);
    nl_t_fill(a, RB_N, 6.0);
    nl_t_fill(b, RB_N, 1.0);
    nl_t_fill(dy, RB_T * RB_N, 1.0);
    nl_t_fill(z0, RB_T * RB_V, 8.0);
    nl_t_fill(r0, RB_T * 4 * 22, 1.0);
    nl_rmsnorm_forward(o->norm, o->rstd, x, w, RB_T, RB_N, 1e-6f);
    memcpy(o->dnorm, dy, sizeof o->dnorm);
    nl_rmsnorm_backward(o->dnorm, o->dnorm, x, w, o->rstd, RB_T, RB_N); /* dx aliasing dy */
    nl_swiglu_forward(o->ew[0], a, b, RB_N);
    nl_swiglu_backward(o->ew[1], o->ew[2], dy, a, b, RB_N);
    nl_gate_forward(o->ew[3], a, b, RB_N);
    nl_gate_backward(o->ew[4], o->ew[5], dy, a, b, RB_N);
    const int32_t pos[RB_T] = {0, 7, 40000};
    for (int neox = 0; neox < 2; neox++) {
        nl_rope r = {.head_dim = 22, .n_rot = 20, .neox = neox, .base = 10000.0f, .freq_scale = 1.0f};
        memcpy(o->rope[neox], r0, sizeof r0);
        nl_rope_forward(&r, o->rope[neox], RB_T, 4, pos);
        nl_rope_backward(&r, o->rope[neox], 2, 4, pos + 1);
    }
    const int32_t tg[RB_T] = {5, -1, RB_V - 1};
    for (int g = 0; g < 2; g++) {
        memcpy(o->z[g], z0, sizeof z0);
        o->loss[g] = nl_xent_chunk(o->z[g], tg, RB_T, RB_V, 0.25f, g);
    }
    memcpy(o->add[0], a, sizeof a);
    nl_par_add(NULL, o->add[0], b, RB_N);
    nl_par_add2(NULL, o->add[1], a, b, RB_N);
    nl_cpu_kernels()->vec->mul(o->add[2], a, b, RB_N); /* nn/lora.c's dropout products */
    memcpy(o->add[3], dy, sizeof o->add[3]);
    nl_cpu_kernels()->vec->muladd(o->add[3], a, b, RB_N);
}
static void test_rows_same_bits(void) {
    static rows_out ref, got;
    CHECK(nl_cpu_use("scalar") == 0);
    rows_run(&ref);
    static const char *const rows[] = {"avx2", "avx512", "neon", "neonbf16"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!nl_cpu_kernels_find(rows[i])) continue;
        CHECK(nl_cpu_use(rows[i]) == 0);
        memset(&got, 0, sizeof got);
        rows_run(&got);
        CHECKF(memcmp(&got, &ref, sizeof ref) == 0, "the %s row's element-wise nodes give the scalar row's bits",
               rows[i]);
        printf("element-wise nodes (%s row): the scalar row's bits\n", rows[i]);
    }
    CHECK(nl_cpu_use(NULL) == 0);
}

/* Each row's entries called directly against the scalar row's, bit for bit: every size 1 .. 40
 * (the 4- and 8-lane tails), inputs salted with the edges of nl_fexp's masks (±87.3, ±88, huge),
 * signed zeros, and for the cross-entropy rows NaN (first or later) and zero maxima of either
 * sign (the max keeps the first of equal values); outputs aliasing inputs. */
static const float rows_edge[] = {0.0f,  -0.0f,  87.3f, -87.3f, 87.34f, -87.34f, 88.0f, -88.0f,
                                  88.8f, -88.8f, 1e30f, -1e30f, 1e-30f, -1e-30f, 20.0f, -20.0f};
static void rows_salt(float *p, int n, double amp) {
    nl_t_fill(p, n, amp);
    for (int i = 0; i < n; i++)
        if (nl_t_rand() > 0.6) p[i] = rows_edge[(int)((nl_t_rand() + 1.0) * 8.0) & 15];
}
#define RE_N 40
static int rows_same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }
static void rows_entries_one(const nl_vec_kernels *v, const nl_vec_kernels *s, const char *name) {
    int bad = 0;
    for (int n = 1; n <= RE_N; n++) {
        float x[RE_N], w[RE_N], a[RE_N], b[RE_N], g[RE_N], o1[2][RE_N], o2[2][RE_N];
        nl_t_rng_state = 0xABCDEF01ULL + (unsigned)n;
        nl_t_fill(x, n, 3.0);
        nl_t_fill(w, n, 1.0);
        nl_t_fill(g, n, 1.0);
        rows_salt(a, n, 30.0);
        rows_salt(b, n, 30.0);
        /* RMSNorm: y, rs; the backward with dx aliasing dy */
        const float r1 = v->rmsnorm_row(o1[0], x, w, n, 1e-6f), r2 = s->rmsnorm_row(o2[0], x, w, n, 1e-6f);
        bad += !rows_same(&r1, &r2, sizeof r1) || !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
        memcpy(o1[0], g, sizeof g);
        memcpy(o2[0], g, sizeof g);
        v->rmsnorm_bwd_row(o1[0], o1[0], x, w, r1, n);
        s->rmsnorm_bwd_row(o2[0], o2[0], x, w, r2, n);
        bad += !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
        /* SwiGLU and the gate, out of place and in place (h = a; da = dh, db = b) */
        v->swiglu_fwd(o1[0], a, b, n);
        s->swiglu_fwd(o2[0], a, b, n);
        bad += !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
        v->gate_fwd(o1[0], b, a, n);
        s->gate_fwd(o2[0], b, a, n);
        bad += !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
        v->swiglu_bwd(o1[0], o1[1], g, a, b, n);
        s->swiglu_bwd(o2[0], o2[1], g, a, b, n);
        bad +=
            !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n) || !rows_same(o1[1], o2[1], sizeof(float) * (size_t)n);
        v->gate_bwd(o1[0], o1[1], g, b, a, n);
        s->gate_bwd(o2[0], o2[1], g, b, a, n);
        bad +=
            !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n) || !rows_same(o1[1], o2[1], sizeof(float) * (size_t)n);
        memcpy(o1[0], a, sizeof a);
        memcpy(o2[0], a, sizeof a);
        v->swiglu_fwd(o1[0], o1[0], b, n);
        s->swiglu_fwd(o2[0], o2[0], b, n);
        bad += !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
        memcpy(o1[0], g, sizeof g), memcpy(o1[1], b, sizeof b);
        memcpy(o2[0], g, sizeof g), memcpy(o2[1], b, sizeof b);
        v->swiglu_bwd(o1[0], o1[1], o1[0], a, o1[1], n);
        s->swiglu_bwd(o2[0], o2[1], o2[0], a, o2[1], n);
        bad +=
            !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n) || !rows_same(o1[1], o2[1], sizeof(float) * (size_t)n);
        /* cross-entropy: plain, a zero maximum (−0 before +0 and after), NaN first and later */
        for (int k = 0; k < 6; k++) {
            float z[RE_N];
            for (int i = 0; i < n; i++) z[i] = k < 1 ? a[i] : -fabsf(a[i]) - 1.0f;
            if (k == 1 || k == 2) z[n / 3] = -0.0f, z[(2 * n) / 3] = 0.0f;
            if (k == 2) z[n / 3] = 0.0f, z[(2 * n) / 3] = -0.0f;
            if (k == 3) z[0] = NAN;
            if (k == 4) z[n - 1] = NAN;
            if (k == 5) z[n / 2] = -INFINITY, z[0] = -INFINITY;
            const int y = (k * 7) % n;
            for (int gr = 0; gr < 2; gr++) {
                memcpy(o1[0], z, sizeof z);
                memcpy(o2[0], z, sizeof z);
                const double l1 = v->xent_row(o1[0], y, n, 0.125f, gr), l2 = s->xent_row(o2[0], y, n, 0.125f, gr);
                bad += !rows_same(&l1, &l2, sizeof l1) || !rows_same(o1[0], o2[0], sizeof(float) * (size_t)n);
            }
        }
        /* RoPE: NEOX and NORM pairs, c0 > 0, nc = n / 2 odd or even, two heads */
        for (int neox = 0; neox < 2; neox++) {
            float r[2][2 * RE_N + 8];
            const int nc = (n + 1) / 2, c0 = n % 3, half = c0 + nc, hd = 2 * half;
            nl_t_fill(r[0], 2 * hd, 2.0);
            memcpy(r[1], r[0], sizeof r[0]);
            v->rope_rotate(r[0], 2, hd, half, c0, nc, x, w, neox);
            s->rope_rotate(r[1], 2, hd, half, c0, nc, x, w, neox);
            bad += !rows_same(r[0], r[1], sizeof(float) * (size_t)(2 * hd));
        }
    }
    /* attention's softmax rows: the 16-lane blocks, the 8-block and the scalar tail at each
     * split (nv), the zeroed masked columns [nv, n) past them; scores salted with the exp
     * masks' edges, so some rows' m leaves lanes at exp's limits */
    static const int att_nv[] = {0, 1, 7, 8, 9, 15, 16, 17, 33, 100};
    enum { ATT_N = 112 };
    for (size_t t = 0; t < sizeof att_nv / sizeof att_nv[0]; t++) {
        const int nv = att_nv[t], n = nv + 1 + (int)t;
        float sr[2][ATT_N], dp[2][ATT_N];
        nl_t_rng_state = 0x5EEDULL + (unsigned)nv;
        rows_salt(sr[0], n, 30.0);
        nl_t_fill(dp[0], n, 2.0);
        float m = -INFINITY;
        for (int j = 0; j < nv; j++) m = sr[0][j] > m ? sr[0][j] : m;
        if (nv == 0) m = 0.0f;
        memcpy(sr[1], sr[0], sizeof sr[0]);
        const float e1 = v->att_exp_sum(sr[0], nv, m), e2 = s->att_exp_sum(sr[1], nv, m);
        bad += !rows_same(&e1, &e2, sizeof e1) || !rows_same(sr[0], sr[1], sizeof(float) * (size_t)n);
        /* the tile forward's row: the BF16 of att_exp_sum's values on the scaled scores, its Σ */
        {
            uint16_t pa[2][ATT_N + 8];
            const int np = n + 5;
            nl_t_fill(sr[0], n, 40.0);
            float ms = -INFINITY;
            for (int j = 0; j < nv; j++) sr[1][j] = sr[0][j] * 0.0883883f, ms = sr[1][j] > ms ? sr[1][j] : ms;
            if (nv == 0) ms = 0.0f;
            const float b1 = v->att_exp_bf16(pa[0], sr[0], nv, np, 0.0883883f, ms);
            const float b2 = s->att_exp_sum(sr[1], nv, ms);
            for (int j = 0; j < np; j++) pa[1][j] = j < nv ? nl_amx_f32_to_bf16(sr[1][j]) : 0;
            bad += !rows_same(&b1, &b2, sizeof b1) || !rows_same(pa[0], pa[1], sizeof(uint16_t) * (size_t)np);
        }
        /* the tile backward's two rows: att_row_bwd's values (scalar row) as BF16 A rows and
         * pairs, past nv zeros up to np; row 1 one key longer or absent; c = 1, L = 0 takes
         * the scores' exp edges into p (denormal and NaN words), dp salted too */
        for (int way = 0; way < 4; way++) {
            enum { NP = ATT_N + 8 };
            const int two = way & 1, np = n + 5;
            const float c = way & 2 ? 1.0f : 0.0883883f, L[2] = {way & 2 ? 0.0f : 1.5f, -0.75f},
                        D[2] = {-0.2537f, 0.125f};
            float s2[2][NP], d2[2][NP], rs[NP], rd[NP];
            const int nv2[2] = {nv, two ? nv + 1 : 0};
            for (int r = 0; r < 2; r++) rows_salt(s2[r], NP, 10.0), rows_salt(d2[r], NP, 2.0);
            if (way & 2) d2[0][nv / 2] = NAN, d2[1][0] = 1e-38f;
            const float *sp[2] = {s2[0], s2[1]}, *dpp[2] = {d2[0], d2[1]};
            uint16_t a1[2][NP], a2[2][NP], am[2][NP];
            uint32_t w1[2][NP], w2[2][NP], wm[2][NP];
            memset(a1, 0xAB, sizeof a1), memset(w1, 0xAB, sizeof w1);
            memset(a2, 0xCD, sizeof a2), memset(w2, 0xCD, sizeof w2);
            v->att_bwd_bf16((uint16_t *const[2]){a1[0], a1[1]}, w1[0], w1[1], sp, dpp, nv2, np, c, L, D);
            s->att_bwd_bf16((uint16_t *const[2]){a2[0], a2[1]}, w2[0], w2[1], sp, dpp, nv2, np, c, L, D);
            for (int r = 0; r < 2; r++) {
                memcpy(rs, s2[r], sizeof rs), memcpy(rd, d2[r], sizeof rd);
                s->att_row_bwd(rs, rd, nv2[r], np, c, L[r], D[r]);
                for (int j = 0; j < np; j++) {
                    am[r][j] = nl_amx_f32_to_bf16(rd[j]);
                    const uint16_t pj = nl_amx_f32_to_bf16(rs[j]);
                    if (r == 0) wm[0][j] = am[0][j], wm[1][j] = pj;
                    else wm[0][j] |= (uint32_t)am[1][j] << 16, wm[1][j] |= (uint32_t)pj << 16;
                }
            }
            for (int r = 0; r < 2; r++)
                bad += !rows_same(a1[r], a2[r], sizeof(uint16_t) * (size_t)np) ||
                       !rows_same(w1[r], w2[r], sizeof(uint32_t) * (size_t)np) ||
                       !rows_same(a2[r], am[r], sizeof(uint16_t) * (size_t)np) ||
                       !rows_same(w2[r], wm[r], sizeof(uint32_t) * (size_t)np) || a1[r][np] != 0xABAB ||
                       w1[r][np] != 0xABABABABu;
        }
        rows_salt(sr[0], n, 10.0);
        memcpy(sr[1], sr[0], sizeof sr[0]);
        memcpy(dp[1], dp[0], sizeof dp[0]);
        v->att_row_bwd(sr[0], dp[0], nv, n, 0.0883883f, 1.5f, -0.2537f);
        s->att_row_bwd(sr[1], dp[1], nv, n, 0.0883883f, 1.5f, -0.2537f);
        bad +=
            !rows_same(sr[0], sr[1], sizeof(float) * (size_t)n) || !rows_same(dp[0], dp[1], sizeof(float) * (size_t)n);
    }
    CHECKF(bad == 0,
           "the %s row's entries give the scalar row's bits (sizes 1..%d, attention rows nv 0..100, edges, NaN, "
           "aliasing): %d differ",
           name, RE_N, bad);
    printf("element-wise entries (%s row), sizes 1..%d, attention rows nv 0..100, edges: the scalar row's bits\n", name,
           RE_N);
}
static void test_rows_entries(void) {
    const nl_host_kernels *sc = nl_cpu_kernels_find("scalar");
    CHECK(sc != NULL);
    static const char *const rows[] = {"avx2", "avx512", "neon", "neonbf16"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const nl_host_kernels *k = nl_cpu_kernels_find(rows[i]);
        if (k && sc) rows_entries_one(k->vec, sc->vec, rows[i]);
    }
#if defined(__x86_64__)
    /* the avx512 row's BF16 words in integer steps, as on AVX-512 CPUs without AVX512_BF16 */
    const nl_host_kernels *k = nl_cpu_kernels_find("avx512");
    if (k && sc) {
        nl_vec_avx512_words_int = 1;
        rows_entries_one(k->vec, sc->vec, "avx512 (integer BF16 words)");
        nl_vec_avx512_words_int = 0;
    }
#endif
}

int main(void) {
    test_fexp();
    test_rmsnorm();
    test_rope();
    test_elementwise();
    test_xent();
    test_rows_same_bits();
    test_rows_entries();
    return nl_t_done();
}

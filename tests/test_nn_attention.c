/* nn/attention: the flash-style kernel against a naive float64 reference that materialises the
 * full score matrix. Forward (out and lse) with GQA and with a KV-cache past (S > T); backward
 * against float64 central finite differences at small sizes and against the float64 analytic
 * backward (itself checked by finite differences) at sizes that cross the block boundaries.
 * The BF16 vector variant and the tile variant (cpu/tiles.h) within the BF16 bound of both; the
 * tile variant on the emulator also bit for bit against a plain C model of its arithmetic. */
#include "cpu/amx.h"
#include "cpu/gemm_bf16.h"
#include "cpu/vecmath.h"
#include "nn/nn.h"
#include "test.h"
#include "tile_model.h"

#include <stdint.h>

static double rel_err(const float *a, const double *b, int64_t n) { return nl_t_rel_err(a, b, n, 1e-6); }

typedef struct {
    int T, S, Hq, Hkv, d;
    double c;
    int w;
} shape; /* w: sliding window (0: none) */

/* key j visible to query t (position past + t) */
static int visible(const shape *s, int t, int j) {
    const int p = s->S - s->T + t;
    return j <= p && (s->w <= 0 || p - j < s->w);
}

/* Naive reference. q[T][Hq][d], k/v[S][Hkv][d]; P[h][t][s] (probabilities, 0 where masked) is
 * returned for the analytic backward when P != NULL. */
static void attn_ref(double *out, double *lse, double *P, const double *q, const double *k, const double *v,
                     const shape *s) {
    const int T = s->T, S = s->S, Hq = s->Hq, Hkv = s->Hkv, d = s->d, past = S - T;
    double *row = malloc(sizeof(double) * S);
    for (int h = 0; h < Hq; h++) {
        const int kh = h / (Hq / Hkv);
        for (int t = 0; t < T; t++) {
            const double *qt = q + ((int64_t)t * Hq + h) * d;
            double m = -INFINITY;
            for (int j = 0; j <= past + t; j++) {
                if (!visible(s, t, j)) continue;
                const double *kj = k + ((int64_t)j * Hkv + kh) * d;
                double sc = 0;
                for (int i = 0; i < d; i++) sc += qt[i] * kj[i];
                row[j] = sc * s->c;
                m = fmax(m, row[j]);
            }
            double z = 0;
            for (int j = 0; j <= past + t; j++)
                if (visible(s, t, j)) z += exp(row[j] - m);
            if (lse) lse[(int64_t)t * Hq + h] = m + log(z);
            double *o = out + ((int64_t)t * Hq + h) * d;
            for (int i = 0; i < d; i++) o[i] = 0;
            for (int j = 0; j < S; j++) {
                const double p = visible(s, t, j) ? exp(row[j] - m) / z : 0.0;
                if (P) P[((int64_t)h * T + t) * S + j] = p;
                if (p == 0.0) continue;
                const double *vj = v + ((int64_t)j * Hkv + kh) * d;
                for (int i = 0; i < d; i++) o[i] += p * vj[i];
            }
        }
    }
    free(row);
}

/* Analytic float64 backward from the materialised P (S == T). */
static void attn_ref_bwd(double *dq, double *dk, double *dv, const double *dout, const double *q, const double *k,
                         const double *v, const shape *s) {
    const int T = s->T, Hq = s->Hq, Hkv = s->Hkv, d = s->d;
    double *out = malloc(sizeof(double) * (size_t)T * Hq * d), *P = malloc(sizeof(double) * (size_t)Hq * T * T);
    double *ds = malloc(sizeof(double) * T);
    attn_ref(out, NULL, P, q, k, v, s);
    memset(dq, 0, sizeof(double) * (size_t)T * Hq * d);
    memset(dk, 0, sizeof(double) * (size_t)T * Hkv * d);
    memset(dv, 0, sizeof(double) * (size_t)T * Hkv * d);
    for (int h = 0; h < Hq; h++) {
        const int kh = h / (Hq / Hkv);
        for (int t = 0; t < T; t++) {
            const double *dot = dout + ((int64_t)t * Hq + h) * d, *ot = out + ((int64_t)t * Hq + h) * d;
            const double *qt = q + ((int64_t)t * Hq + h) * d;
            double D = 0;
            for (int i = 0; i < d; i++) D += dot[i] * ot[i];
            for (int j = 0; j <= t; j++) {
                const double p = P[((int64_t)h * T + t) * T + j];
                const double *vj = v + ((int64_t)j * Hkv + kh) * d;
                double dp = 0;
                for (int i = 0; i < d; i++) dp += dot[i] * vj[i];
                ds[j] = p * (dp - D);
                double *dvj = dv + ((int64_t)j * Hkv + kh) * d;
                for (int i = 0; i < d; i++) dvj[i] += p * dot[i];
            }
            double *dqt = dq + ((int64_t)t * Hq + h) * d;
            for (int j = 0; j <= t; j++) {
                const double *kj = k + ((int64_t)j * Hkv + kh) * d;
                double *dkj = dk + ((int64_t)j * Hkv + kh) * d;
                for (int i = 0; i < d; i++) {
                    dqt[i] += s->c * ds[j] * kj[i];
                    dkj[i] += s->c * ds[j] * qt[i];
                }
            }
        }
    }
    free(out);
    free(P);
    free(ds);
}

/* random inputs of a shape; returns q, k, v (float) */
static void make_qkv(const shape *s, float **q, float **k, float **v) {
    const int64_t nq = (int64_t)s->T * s->Hq * s->d, nk = (int64_t)s->S * s->Hkv * s->d;
    *q = malloc(sizeof(float) * nq);
    *k = malloc(sizeof(float) * nk);
    *v = malloc(sizeof(float) * nk);
    nl_t_fill(*q, nq, 1.5);
    nl_t_fill(*k, nk, 1.5);
    nl_t_fill(*v, nk, 1.0);
}

static void check_forward(const shape *s, const char *name) {
    float *q, *k, *v;
    make_qkv(s, &q, &k, &v);
    const int64_t nq = (int64_t)s->T * s->Hq * s->d, nk = (int64_t)s->S * s->Hkv * s->d, nl = (int64_t)s->T * s->Hq;
    float *out = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * nl);
    double *qd = nl_t_to_d(q, nq), *kd = nl_t_to_d(k, nk), *vd = nl_t_to_d(v, nk);
    double *outr = malloc(sizeof(double) * nq), *lser = malloc(sizeof(double) * nl);
    attn_ref(outr, lser, NULL, qd, kd, vd, s);
    nl_attention_forward_range(&(nl_attn_fwd){.out = out,
                                              .lse = lse,
                                              .q = q,
                                              .k = k,
                                              .v = v,
                                              .T = s->T,
                                              .S = s->S,
                                              .Hq = s->Hq,
                                              .Hkv = s->Hkv,
                                              .d = s->d,
                                              .scale = (float)s->c,
                                              .window = s->w,
                                              .g1 = s->Hkv});
    CHECKF(rel_err(out, outr, nq) < 3e-6, "%s: out err %g", name, rel_err(out, outr, nq));
    CHECKF(rel_err(lse, lser, nl) < 3e-6, "%s: lse err %g", name, rel_err(lse, lser, nl));
    /* lse may be NULL, same output bits */
    float *out2 = malloc(sizeof(float) * nq);
    nl_attention_forward_range(&(nl_attn_fwd){.out = out2,
                                              .lse = NULL,
                                              .q = q,
                                              .k = k,
                                              .v = v,
                                              .T = s->T,
                                              .S = s->S,
                                              .Hq = s->Hq,
                                              .Hkv = s->Hkv,
                                              .d = s->d,
                                              .scale = (float)s->c,
                                              .window = s->w,
                                              .g1 = s->Hkv});
    CHECK(memcmp(out, out2, sizeof(float) * nq) == 0);
    if (s->w <= 0) { /* the plain call is window 0 */
        nl_attention_forward(&(nl_attn_fwd){.out = out2,
                                            .lse = NULL,
                                            .q = q,
                                            .k = k,
                                            .v = v,
                                            .T = s->T,
                                            .S = s->S,
                                            .Hq = s->Hq,
                                            .Hkv = s->Hkv,
                                            .d = s->d,
                                            .scale = (float)s->c});
        CHECK(memcmp(out, out2, sizeof(float) * nq) == 0);
    }
    free(q), free(k), free(v), free(out), free(out2), free(lse), free(qd), free(kd), free(vd), free(outr), free(lser);
}

/* Backward: float kernel vs float64 analytic; when fd, also both vs central differences of
 * L = Σ dout·out(q, k, v). */
static void check_backward(const shape *s, int fd, const char *name) {
    float *q, *k, *v;
    make_qkv(s, &q, &k, &v);
    const int T = s->T;
    const int64_t nq = (int64_t)T * s->Hq * s->d, nk = (int64_t)T * s->Hkv * s->d, nl = (int64_t)T * s->Hq;
    float *out = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * nl), *dout = malloc(sizeof(float) * nq);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nk);
    nl_t_fill(dout, nq, 1.0);
    nl_attention_forward_range(&(nl_attn_fwd){.out = out,
                                              .lse = lse,
                                              .q = q,
                                              .k = k,
                                              .v = v,
                                              .T = T,
                                              .S = T,
                                              .Hq = s->Hq,
                                              .Hkv = s->Hkv,
                                              .d = s->d,
                                              .scale = (float)s->c,
                                              .window = s->w,
                                              .g1 = s->Hkv});
    /* poison the outputs: they must be overwritten, not accumulated into */
    for (int64_t i = 0; i < nq; i++) dq[i] = 1e3f;
    for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = -1e3f;
    nl_attention_backward_range(&(nl_attn_bwd){.dq = dq,
                                               .dk = dk,
                                               .dv = dv,
                                               .dout = dout,
                                               .out = out,
                                               .lse = lse,
                                               .q = q,
                                               .k = k,
                                               .v = v,
                                               .T = T,
                                               .Hq = s->Hq,
                                               .Hkv = s->Hkv,
                                               .d = s->d,
                                               .scale = (float)s->c,
                                               .window = s->w,
                                               .g1 = s->Hkv});
    double *qd = nl_t_to_d(q, nq), *kd = nl_t_to_d(k, nk), *vd = nl_t_to_d(v, nk), *dod = nl_t_to_d(dout, nq);
    double *dqr = malloc(sizeof(double) * nq), *dkr = malloc(sizeof(double) * nk), *dvr = malloc(sizeof(double) * nk);
    attn_ref_bwd(dqr, dkr, dvr, dod, qd, kd, vd, s);
    CHECKF(rel_err(dq, dqr, nq) < 2e-5, "%s: dq err %g", name, rel_err(dq, dqr, nq));
    CHECKF(rel_err(dk, dkr, nk) < 2e-5, "%s: dk err %g", name, rel_err(dk, dkr, nk));
    CHECKF(rel_err(dv, dvr, nk) < 2e-5, "%s: dv err %g", name, rel_err(dv, dvr, nk));
    if (fd) {
        const double h = 1e-5;
        double *o = malloc(sizeof(double) * nq);
        double *bufs[3] = {qd, kd, vd};
        const int64_t ns[3] = {nq, nk, nk};
        const float *got[3] = {dq, dk, dv};
        const double *ana[3] = {dqr, dkr, dvr};
        for (int which = 0; which < 3; which++) {
            double *g = malloc(sizeof(double) * ns[which]), *x = bufs[which];
            for (int64_t j = 0; j < ns[which]; j++) {
                const double keep = x[j];
                double lp = 0, lm = 0;
                x[j] = keep + h;
                attn_ref(o, NULL, NULL, qd, kd, vd, s);
                for (int64_t i = 0; i < nq; i++) lp += o[i] * dod[i];
                x[j] = keep - h;
                attn_ref(o, NULL, NULL, qd, kd, vd, s);
                for (int64_t i = 0; i < nq; i++) lm += o[i] * dod[i];
                x[j] = keep;
                g[j] = (lp - lm) / (2 * h);
            }
            double e_ana = 0, m = 1e-6;
            for (int64_t j = 0; j < ns[which]; j++) {
                e_ana = fmax(e_ana, fabs(ana[which][j] - g[j]));
                m = fmax(m, fabs(g[j]));
            }
            CHECKF(e_ana / m < 1e-7, "%s: analytic reference vs FD (%d) err %g", name, which, e_ana / m);
            CHECKF(rel_err(got[which], g, ns[which]) < 2e-5, "%s: kernel vs FD (%d) err %g", name, which,
                   rel_err(got[which], g, ns[which]));
            free(g);
        }
        free(o);
    }
    free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
    free(qd), free(kd), free(vd), free(dod), free(dqr), free(dkr), free(dvr);
}

/* Layout: the kernel must read head h of token t at q[(t·Hq + h)·d]; build a case where only
 * one (token, head) differs between two inputs and check only that head's outputs move. */
static void test_layout(void) {
    shape s = {5, 5, 4, 2, 6, 0.5, 0};
    float *q, *k, *v;
    make_qkv(&s, &q, &k, &v);
    const int64_t nq = 5 * 4 * 6;
    float a[5 * 4 * 6], b[5 * 4 * 6];
    nl_attention_forward(&(nl_attn_fwd){
        .out = a, .lse = NULL, .q = q, .k = k, .v = v, .T = 5, .S = 5, .Hq = 4, .Hkv = 2, .d = 6, .scale = 0.5f});
    /* change kv head 1 of key 2: only query heads 2, 3 at tokens >= 2 may change */
    for (int i = 0; i < 6; i++) k[(2 * 2 + 1) * 6 + i] += 0.5f, v[(2 * 2 + 1) * 6 + i] -= 0.5f;
    nl_attention_forward(&(nl_attn_fwd){
        .out = b, .lse = NULL, .q = q, .k = k, .v = v, .T = 5, .S = 5, .Hq = 4, .Hkv = 2, .d = 6, .scale = 0.5f});
    int ok = 1;
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < 4; h++) {
            const int should = t >= 2 && h >= 2;
            const int moved = memcmp(a + (t * 4 + h) * 6, b + (t * 4 + h) * 6, 6 * sizeof(float)) != 0;
            ok &= should == moved;
        }
    CHECK(ok);
    (void)nq;
    free(q), free(k), free(v);
}

/* ---- BF16 variant ---- */

/* (the kernel checks: x86-64 only, the BF16 kernels are not built elsewhere) */
#if defined(__x86_64__)
/* float -> BF16 -> float, round to nearest even (what vcvtne2ps2bf16 does for finite input) */
static double bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    float y;
    memcpy(&y, &u, 4);
    return y;
}

/* The kernel C (+)= A·B on packed words against float64 sums of the rounded operands, for each
 * way the attention packs A (rows of X, or pairs_t of Xᵀ) and B (pairs of Y, or rows_t of Yᵀ).
 * The only error left is FP32 accumulation: tolerance 1e-5 of Σ|products|. */
static void check_gemm_bf16(int M, int N, int K, int acc) {
    float *X = malloc(sizeof(float) * M * K), *Xt = malloc(sizeof(float) * K * M);
    float *Y = malloc(sizeof(float) * K * N), *Yt = malloc(sizeof(float) * N * K);
    nl_t_fill(X, (int64_t)M * K, 2.0);
    nl_t_fill(Y, (int64_t)K * N, 3.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < K; j++) Xt[j * M + i] = X[i * K + j];
    for (int i = 0; i < K; i++)
        for (int j = 0; j < N; j++) Yt[j * K + i] = Y[i * N + j];
    const int kw = (K + 1) / 2, ldb = ((N + 15) & ~15) + 3, lda = kw + 2;
    uint32_t *A = malloc(sizeof(uint32_t) * M * lda), *B = malloc(sizeof(uint32_t) * kw * ldb);
    float *C = malloc(sizeof(float) * M * (N + 1)), *C0 = malloc(sizeof(float) * M * (N + 1));
    nl_t_fill(C0, (int64_t)M * (N + 1), 1.0);
    double err = 0;
    for (int way = 0; way < 4; way++) {
        if (way & 1) nl_bf16_pairs_t(A, lda, Xt, M, K, M, lda); /* [M][kw] from Xᵀ[K][M] */
        else nl_bf16_rows(A, lda, X, K, M, K, kw);
        if (way & 2) nl_bf16_rows_t(B, ldb, Yt, K, N, K, ldb); /* [kw][N] from Yᵀ[N][K] */
        else nl_bf16_pairs(B, ldb, Y, N, K, N, ldb);
        memcpy(C, C0, sizeof(float) * M * (N + 1));
        nl_gemm_bf16(C, N + 1, A, lda, B, ldb, M, N, kw, acc);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N + 1; j++) {
                if (j == N) { /* the column past N is not touched */
                    err = fmax(err, C[i * (N + 1) + j] == C0[i * (N + 1) + j] ? 0 : 1);
                    continue;
                }
                double r = acc ? C0[i * (N + 1) + j] : 0, mag = fabs(r);
                for (int t = 0; t < K; t++) {
                    const double pr = bf16_round(X[i * K + t]) * bf16_round(Y[t * N + j]);
                    r += pr, mag += fabs(pr);
                }
                err = fmax(err, fabs(C[i * (N + 1) + j] - r) / (mag + 1e-30));
            }
    }
    CHECKF(err < 1e-5, "gemm_bf16 M=%d N=%d K=%d acc=%d: err %g", M, N, K, acc, err);
    /* the FP32 transpose is exact */
    float *Tt = malloc(sizeof(float) * K * (M + 1));
    nl_transpose_f32(Tt, M + 1, X, K, M, K);
    int same = 1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < K; j++) same &= Tt[j * (M + 1) + i] == X[i * K + j];
    CHECK(same);
    free(X), free(Xt), free(Y), free(Yt), free(A), free(B), free(C), free(C0), free(Tt);
}

#endif

/* err of a vs b relative to the magnitude of b: max |a − b| / max |b| and ‖a − b‖₂ / ‖b‖₂ */
static void errs(const float *a, const double *b, int64_t n, double *mx, double *l2) {
    double e2 = 0, b2 = 0;
    *mx = rel_err(a, b, n);
    for (int64_t i = 0; i < n; i++) e2 += (a[i] - b[i]) * (a[i] - b[i]), b2 += b[i] * b[i];
    *l2 = sqrt(e2 / (b2 + 1e-300));
}

/* Tolerances (all relative to the tensor's magnitude, see errs): BF16 keeps 8 significant
 * bits, unit roundoff u = 2^-9 ≈ 2e-3. Every GEMM input is rounded once (≤ u each), products
 * and sums are FP32, so each product carries ≲ 2u relative error; the backward's results go
 * through two such GEMMs (dS = P ⊙ (dO·Vᵀ − D), then dS·K etc.). Observed on these shapes:
 * max 2.3e-3 .. 4.8e-3, L2 1.9e-3 .. 4.7e-3, i.e. about 2u, errors spread over all elements
 * (lse: ≤ 2.3e-3). Bound for both measures: 1e-2 ≈ 5u. A wrong block, pair or mask gives
 * O(1). The FP32 path is at ~3e-6 of the reference, so "differs from FP32 by > 1e-4" shows
 * the BF16 kernels ran. */
#define BF16_TOL_MAX 1e-2
#define BF16_TOL_L2 1e-2

/* The variant under test: the BF16 vector kernels (g_tiles NULL) or the tile kernels. */
static const nl_amx_tiles *g_tiles;
static void fwd_v(float *out, float *lse, const float *q, const float *k, const float *v, const shape *s, int g0,
                  int g1) {
    if (g_tiles)
        nl_attention_forward_range_tiles(g_tiles, &(nl_attn_fwd){.out = out,
                                                                 .lse = lse,
                                                                 .q = q,
                                                                 .k = k,
                                                                 .v = v,
                                                                 .T = s->T,
                                                                 .S = s->S,
                                                                 .Hq = s->Hq,
                                                                 .Hkv = s->Hkv,
                                                                 .d = s->d,
                                                                 .scale = (float)s->c,
                                                                 .window = s->w,
                                                                 .g0 = g0,
                                                                 .g1 = g1});
    else
        nl_attention_forward_range_bf16(&(nl_attn_fwd){.out = out,
                                                       .lse = lse,
                                                       .q = q,
                                                       .k = k,
                                                       .v = v,
                                                       .T = s->T,
                                                       .S = s->S,
                                                       .Hq = s->Hq,
                                                       .Hkv = s->Hkv,
                                                       .d = s->d,
                                                       .scale = (float)s->c,
                                                       .window = s->w,
                                                       .g0 = g0,
                                                       .g1 = g1});
}
static void bwd_v(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                  const float *q, const float *k, const float *v, const shape *s, int g0, int g1) {
    if (g_tiles)
        nl_attention_backward_range_tiles(g_tiles, &(nl_attn_bwd){.dq = dq,
                                                                  .dk = dk,
                                                                  .dv = dv,
                                                                  .dout = dout,
                                                                  .out = out,
                                                                  .lse = lse,
                                                                  .q = q,
                                                                  .k = k,
                                                                  .v = v,
                                                                  .T = s->T,
                                                                  .Hq = s->Hq,
                                                                  .Hkv = s->Hkv,
                                                                  .d = s->d,
                                                                  .scale = (float)s->c,
                                                                  .window = s->w,
                                                                  .g0 = g0,
                                                                  .g1 = g1});
    else
        nl_attention_backward_range_bf16(&(nl_attn_bwd){.dq = dq,
                                                        .dk = dk,
                                                        .dv = dv,
                                                        .dout = dout,
                                                        .out = out,
                                                        .lse = lse,
                                                        .q = q,
                                                        .k = k,
                                                        .v = v,
                                                        .T = s->T,
                                                        .Hq = s->Hq,
                                                        .Hkv = s->Hkv,
                                                        .d = s->d,
                                                        .scale = (float)s->c,
                                                        .window = s->w,
                                                        .g0 = g0,
                                                        .g1 = g1});
}
/* whether the variant's own kernels run for this shape (else it is the FP32 call) */
static int v_active(const shape *s) { return g_tiles ? s->T > 4 : nl_attention_bf16_active(); }

static void check_bf16(const shape *s, const char *name) {
    float *q, *k, *v;
    make_qkv(s, &q, &k, &v);
    const int T = s->T, S = s->S, Hq = s->Hq, Hkv = s->Hkv, d = s->d;
    const float c = (float)s->c;
    const int64_t nq = (int64_t)T * Hq * d, nk = (int64_t)S * Hkv * d, nl = (int64_t)T * Hq;
    float *out = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * nl);
    float *out32 = malloc(sizeof(float) * nq), *lse32 = malloc(sizeof(float) * nl);
    float *out2 = malloc(sizeof(float) * nq), *lse2 = malloc(sizeof(float) * nl);
    double *qd = nl_t_to_d(q, nq), *kd = nl_t_to_d(k, nk), *vd = nl_t_to_d(v, nk);
    double *outr = malloc(sizeof(double) * nq), *lser = malloc(sizeof(double) * nl);
    attn_ref(outr, lser, NULL, qd, kd, vd, s);
    fwd_v(out, lse, q, k, v, s, 0, Hkv);
    nl_attention_forward_range(&(nl_attn_fwd){.out = out32,
                                              .lse = lse32,
                                              .q = q,
                                              .k = k,
                                              .v = v,
                                              .T = T,
                                              .S = S,
                                              .Hq = Hq,
                                              .Hkv = Hkv,
                                              .d = d,
                                              .scale = c,
                                              .window = s->w,
                                              .g1 = Hkv});
    double em, e2, e32;
    errs(out, outr, nq, &em, &e2);
    CHECKF(em < BF16_TOL_MAX && e2 < BF16_TOL_L2, "%s: bf16 out err max %g l2 %g", name, em, e2);
    errs(lse, lser, nl, &em, &e2);
    CHECKF(em < BF16_TOL_MAX && e2 < BF16_TOL_L2, "%s: bf16 lse err max %g l2 %g", name, em, e2);
    /* the BF16 kernels ran where they can; elsewhere the call is the FP32 one, bit for bit */
    double *o32d = nl_t_to_d(out32, nq);
    e32 = rel_err(out, o32d, nq);
    if (v_active(s)) CHECKF(e32 > 1e-4, "%s: bf16 out too close to fp32 (%g): not taken?", name, e32);
    else CHECK(memcmp(out, out32, sizeof(float) * nq) == 0 && memcmp(lse, lse32, sizeof(float) * nl) == 0);
    /* kv heads split over calls (threads): the same bits */
    for (int g = 0; g < Hkv; g++) fwd_v(out2, lse2, q, k, v, s, g, g + 1);
    CHECK(memcmp(out, out2, sizeof(float) * nq) == 0 && memcmp(lse, lse2, sizeof(float) * nl) == 0);

    if (S == T) {
        float *dout = malloc(sizeof(float) * nq), *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk),
              *dv = malloc(sizeof(float) * nk), *dq2 = malloc(sizeof(float) * nq), *dk2 = malloc(sizeof(float) * nk),
              *dv2 = malloc(sizeof(float) * nk);
        nl_t_fill(dout, nq, 1.0);
        for (int64_t i = 0; i < nq; i++) dq[i] = 1e3f;
        for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = -1e3f;
        /* as in training: the backward consumes the BF16 forward's out and lse */
        bwd_v(dq, dk, dv, dout, out, lse, q, k, v, s, 0, Hkv);
        double *dod = nl_t_to_d(dout, nq);
        double *dqr = malloc(sizeof(double) * nq), *dkr = malloc(sizeof(double) * nk),
               *dvr = malloc(sizeof(double) * nk);
        attn_ref_bwd(dqr, dkr, dvr, dod, qd, kd, vd, s);
        const float *got[3] = {dq, dk, dv};
        const double *ref[3] = {dqr, dkr, dvr};
        const int64_t ns[3] = {nq, nk, nk};
        for (int w = 0; w < 3; w++) {
            errs(got[w], ref[w], ns[w], &em, &e2);
            CHECKF(em < BF16_TOL_MAX && e2 < BF16_TOL_L2, "%s: bf16 d%c err max %g l2 %g", name, "qkv"[w], em, e2);
        }
        if (v_active(s)) {
            nl_attention_backward_range(&(nl_attn_bwd){.dq = dq2,
                                                       .dk = dk2,
                                                       .dv = dv2,
                                                       .dout = dout,
                                                       .out = out,
                                                       .lse = lse,
                                                       .q = q,
                                                       .k = k,
                                                       .v = v,
                                                       .T = T,
                                                       .Hq = Hq,
                                                       .Hkv = Hkv,
                                                       .d = d,
                                                       .scale = c,
                                                       .window = s->w,
                                                       .g1 = Hkv});
            double *dq32 = nl_t_to_d(dq2, nq);
            CHECKF(rel_err(dq, dq32, nq) > 1e-4, "%s: bf16 dq too close to fp32: not taken?", name);
            free(dq32);
        }
        for (int g = Hkv - 1; g >= 0; g--) bwd_v(dq2, dk2, dv2, dout, out, lse, q, k, v, s, g, g + 1);
        CHECK(memcmp(dq, dq2, sizeof(float) * nq) == 0 && memcmp(dk, dk2, sizeof(float) * nk) == 0 &&
              memcmp(dv, dv2, sizeof(float) * nk) == 0);
        free(dout), free(dq), free(dk), free(dv), free(dq2), free(dk2), free(dv2), free(dod), free(dqr), free(dkr),
            free(dvr);
    }
    free(q), free(k), free(v), free(out), free(lse), free(out32), free(lse32), free(out2), free(lse2), free(qd),
        free(kd), free(vd), free(outr), free(lser), free(o32d);
}

/* Decoding-size blocks (T <= 4) always take the FP32 code: the same bits. */
static void test_bf16_small_t(void) {
    const shape s = {3, 9, 4, 2, 16, 0.25, 0};
    float *q, *k, *v;
    make_qkv(&s, &q, &k, &v);
    const int64_t nq = 3 * 4 * 16;
    float a[3 * 4 * 16], b[3 * 4 * 16], la[12], lb[12];
    nl_attention_forward_range(&(nl_attn_fwd){.out = a,
                                              .lse = la,
                                              .q = q,
                                              .k = k,
                                              .v = v,
                                              .T = 3,
                                              .S = 9,
                                              .Hq = 4,
                                              .Hkv = 2,
                                              .d = 16,
                                              .scale = 0.25f,
                                              .g1 = 2});
    nl_attention_forward_range_bf16(&(nl_attn_fwd){.out = b,
                                                   .lse = lb,
                                                   .q = q,
                                                   .k = k,
                                                   .v = v,
                                                   .T = 3,
                                                   .S = 9,
                                                   .Hq = 4,
                                                   .Hkv = 2,
                                                   .d = 16,
                                                   .scale = 0.25f,
                                                   .g1 = 2});
    CHECK(memcmp(a, b, sizeof(float) * nq) == 0 && memcmp(la, lb, sizeof la) == 0);
    free(q), free(k), free(v);
}

static void test_bf16(void) {
#if defined(__x86_64__)
    if (nl_bf16_ok()) {
        check_gemm_bf16(1, 1, 1, 0);
        check_gemm_bf16(8, 32, 64, 0);
        check_gemm_bf16(13, 47, 9, 1);
        check_gemm_bf16(23, 17, 300, 0); /* crosses a KC chunk (128 words) */
        check_gemm_bf16(9, 70, 261, 1);
    } else {
        printf("AVX512_BF16 not available: BF16 kernel tests skipped, BF16 calls checked to be the FP32 ones\n");
    }
#else
    printf("not x86-64: BF16 kernel tests skipped, BF16 calls checked to be the FP32 ones\n");
#endif
    /* T not a multiple of the 48-query block; d even, 128, odd; GQA ratio 1 and 2 */
    check_bf16(&(shape){100, 100, 4, 2, 128, 1.0 / sqrt(128.0), 0}, "bf16 T=100 d=128 gqa2");
    check_bf16(&(shape){53, 53, 2, 2, 64, 1.0 / sqrt(64.0), 0}, "bf16 T=53 d=64 mha");
    check_bf16(&(shape){70, 70, 4, 2, 13, 0.4, 0}, "bf16 T=70 d=13 gqa2");
    check_bf16(&(shape){300, 300, 2, 1, 64, 0.125, 0}, "bf16 T=300 d=64 (KC chunks)");
    check_bf16(&(shape){7, 7, 6, 2, 10, 1.0 / sqrt(10.0), 0}, "bf16 T=7 d=10");
    check_bf16(&(shape){60, 75, 4, 2, 32, 0.2, 0}, "bf16 past S=75 T=60");
    check_bf16(&(shape){100, 100, 4, 2, 32, 0.3, 17}, "bf16 sliding window 17 T=100");
    check_bf16(&(shape){60, 75, 4, 2, 32, 0.2, 30}, "bf16 sliding window 30 past S=75 T=60");
    test_bf16_small_t();
}

/* ---- the plain C model of the attention on the tiles (nn/attention.c's tile variant) ----
 * Per query head and block of 32 queries: s = c·(Q·Kᵀ) and every other product as the tile
 * model's chains (tile_model.h: BF16 inputs, one FP32 chain per element over the padded
 * reduction), the row steps written out: masked keys −∞, the max, p = exp(s − max) with the
 * library's exp and its 8 partial sums, O = P·V / Σp; backward: p = exp(c·s − lse),
 * ds = p·(dp − D)·c, dq = ds·K, then dk, dv one chain per element over the query heads and
 * blocks in order, each block's 32 queries a step. */
#define MB 32
static float m_qk(const float *a, const float *b, int d) { /* one element of a tile product over d */
    float c = 0.0f;
    for (int i = 0; i < (d + 31) / 32 * 32; i++)
        c = m_step(c, i < d ? m_bf16_daz(a[i]) : 0, i < d ? m_bf16_daz(b[i]) : 0);
    return c;
}
static float m_row_sum(const float *p, int nv) { /* row_exp_sum's order */
    float acc[NL_LANES] = {0}, tail = 0.0f;
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) acc[l] += p[j + l];
    for (; j < nv; j++) tail += p[j];
    return nl_lanes_sum(acc) + tail;
}

static void model_tiles_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const shape *sh) {
    const int T = sh->T, S = sh->S, Hq = sh->Hq, Hkv = sh->Hkv, d = sh->d, past = S - T, group = Hq / Hkv;
    const float c = (float)sh->c;
    float *p = malloc(sizeof(float) * ((size_t)S + 32));
    for (int h = 0; h < Hq; h++) {
        const int g = h / group;
        for (int q0 = 0; q0 < T; q0 += MB) {
            const int nq = T - q0 < MB ? T - q0 : MB, kend = past + q0 + nq;
            for (int t = q0; t < q0 + nq; t++) {
                const int nv = past + t + 1, lo = sh->w > 0 ? past + t - sh->w + 1 : 0;
                const float *qt = q + ((int64_t)t * Hq + h) * d;
                float mx = -INFINITY;
                for (int j = 0; j < nv; j++) {
                    p[j] = j < lo ? -INFINITY : m_qk(qt, k + ((int64_t)j * Hkv + g) * d, d);
                    p[j] *= c;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j < nv; j++) p[j] = nl_fexp(p[j] - mx);
                for (int j = nv; j < (kend + 31) / 32 * 32; j++) p[j] = 0.0f;
                const float sum = m_row_sum(p, nv);
                float *o = out + ((int64_t)t * Hq + h) * d;
                for (int i = 0; i < d; i++) {
                    float a = 0.0f;
                    for (int j = 0; j < (kend + 31) / 32 * 32; j++)
                        a = m_step(a, m_bf16_daz(p[j]), j < S ? m_bf16_daz(v[((int64_t)j * Hkv + g) * d + i]) : 0);
                    o[i] = a;
                }
                nl_vscale(o, 1.0f / sum, d);
                lse[(int64_t)t * Hq + h] = mx + logf(sum);
            }
        }
    }
    free(p);
}

static void model_tiles_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                            const float *q, const float *k, const float *v, const shape *sh) {
    const int T = sh->T, Hq = sh->Hq, Hkv = sh->Hkv, d = sh->d, group = Hq / Hkv, Tp = (T + 31) / 32 * 32;
    const float c = (float)sh->c;
    float *P = calloc((size_t)MB * Tp, sizeof(float)), *DS = calloc((size_t)MB * Tp, sizeof(float));
    for (int64_t i = 0; i < (int64_t)T * Hkv * d; i++) dk[i] = dv[i] = 0.0f;
    for (int h = 0; h < Hq; h++) {
        const int g = h / group;
        for (int q0 = 0; q0 < T; q0 += MB) {
            const int nq = T - q0 < MB ? T - q0 : MB, kend = q0 + nq;
            memset(P, 0, sizeof(float) * (size_t)MB * Tp), memset(DS, 0, sizeof(float) * (size_t)MB * Tp);
            for (int i = 0; i < nq; i++) {
                const int t = q0 + i, lo = sh->w > 0 ? t - sh->w + 1 : 0;
                const float *qt = q + ((int64_t)t * Hq + h) * d, *dot = dout + ((int64_t)t * Hq + h) * d;
                float D;
                nl_dot_rows(&D, dot, d, out + ((int64_t)t * Hq + h) * d, d, 1, d);
                const float L = lse[(int64_t)t * Hq + h];
                for (int j = 0; j <= t; j++) {
                    const float sv = j < lo ? -INFINITY : m_qk(qt, k + ((int64_t)j * Hkv + g) * d, d);
                    const float dp = m_qk(dot, v + ((int64_t)j * Hkv + g) * d, d);
                    const float pv = nl_fexp(sv * c - L);
                    P[i * Tp + j] = pv;
                    DS[i * Tp + j] = pv * (dp - D) * c;
                }
                float *dqt = dq + ((int64_t)t * Hq + h) * d;
                for (int e = 0; e < d; e++) {
                    float a = 0.0f;
                    for (int j = 0; j < (kend + 31) / 32 * 32; j++)
                        a = m_step(a, m_bf16_daz(DS[i * Tp + j]),
                                   j < T ? m_bf16_daz(k[((int64_t)j * Hkv + g) * d + e]) : 0);
                    dqt[e] = a;
                }
            }
            for (int j = 0; j < kend; j++)
                for (int e = 0; e < d; e++) {
                    float *a = dk + ((int64_t)j * Hkv + g) * d + e, *b = dv + ((int64_t)j * Hkv + g) * d + e;
                    for (int i = 0; i < MB; i++) {
                        const int t = q0 + i;
                        const float qv = i < nq ? q[((int64_t)t * Hq + h) * d + e] : 0.0f,
                                    ov = i < nq ? dout[((int64_t)t * Hq + h) * d + e] : 0.0f;
                        *a = m_step(*a, m_bf16_daz(DS[i * Tp + j]), m_bf16_daz(qv));
                        *b = m_step(*b, m_bf16_daz(P[i * Tp + j]), m_bf16_daz(ov));
                    }
                }
        }
    }
    free(P), free(DS);
}

/* The emulated tile attention against the model, bit for bit (forward; backward when S == T,
 * from the tile forward's out and lse). */
static void check_tiles_model(const shape *s, const char *name) {
    float *q, *k, *v;
    make_qkv(s, &q, &k, &v);
    const int T = s->T, S = s->S, Hq = s->Hq, Hkv = s->Hkv, d = s->d;
    const int64_t nq = (int64_t)T * Hq * d, nk = (int64_t)S * Hkv * d, nl = (int64_t)T * Hq;
    float *out = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * nl), *om = malloc(sizeof(float) * nq),
          *lm = malloc(sizeof(float) * nl);
    nl_attention_forward_range_tiles(&nl_amx_tiles_emu_chain, &(nl_attn_fwd){.out = out,
                                                                             .lse = lse,
                                                                             .q = q,
                                                                             .k = k,
                                                                             .v = v,
                                                                             .T = T,
                                                                             .S = S,
                                                                             .Hq = Hq,
                                                                             .Hkv = Hkv,
                                                                             .d = d,
                                                                             .scale = (float)s->c,
                                                                             .window = s->w,
                                                                             .g1 = Hkv});
    model_tiles_fwd(om, lm, q, k, v, s);
    CHECKF(memcmp(out, om, sizeof(float) * nq) == 0 && memcmp(lse, lm, sizeof(float) * nl) == 0,
           "%s: tile forward not the model's bits", name);
    if (S == T) {
        float *dout = malloc(sizeof(float) * nq), *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk),
              *dv = malloc(sizeof(float) * nk), *dqm = malloc(sizeof(float) * nq), *dkm = malloc(sizeof(float) * nk),
              *dvm = malloc(sizeof(float) * nk);
        nl_t_fill(dout, nq, 1.0);
        nl_attention_backward_range_tiles(&nl_amx_tiles_emu_chain, &(nl_attn_bwd){.dq = dq,
                                                                                  .dk = dk,
                                                                                  .dv = dv,
                                                                                  .dout = dout,
                                                                                  .out = out,
                                                                                  .lse = lse,
                                                                                  .q = q,
                                                                                  .k = k,
                                                                                  .v = v,
                                                                                  .T = T,
                                                                                  .Hq = Hq,
                                                                                  .Hkv = Hkv,
                                                                                  .d = d,
                                                                                  .scale = (float)s->c,
                                                                                  .window = s->w,
                                                                                  .g1 = Hkv});
        model_tiles_bwd(dqm, dkm, dvm, dout, out, lse, q, k, v, s);
        CHECKF(memcmp(dq, dqm, sizeof(float) * nq) == 0, "%s: tile dq not the model's bits", name);
        CHECKF(memcmp(dk, dkm, sizeof(float) * nk) == 0 && memcmp(dv, dvm, sizeof(float) * nk) == 0,
               "%s: tile dk/dv not the model's bits", name);
        free(dout), free(dq), free(dk), free(dv), free(dqm), free(dkm), free(dvm);
    }
    free(q), free(k), free(v), free(out), free(lse), free(om), free(lm);
}

/* The tile kernels (cpu/tiles.h) on the emulator — and the real instructions where this CPU has
 * usable AMX — with the BF16 checks and bounds: against the float64 forward and the float64
 * analytic backward, not the FP32 call's bits, kv heads split the same bits. Query counts not
 * a multiple of 16 or 32, head dims 64/128/256 (gemma3's 256), sliding windows, a past. */
static void test_tiles(const nl_amx_tiles *tl) {
    g_tiles = tl;
    check_bf16(&(shape){100, 100, 4, 2, 128, 1.0 / sqrt(128.0), 0}, "tiles T=100 d=128 gqa2");
    check_bf16(&(shape){45, 45, 2, 2, 64, 1.0 / sqrt(64.0), 0}, "tiles T=45 d=64 mha");
    check_bf16(&(shape){37, 37, 2, 1, 256, 1.0 / 16.0, 0}, "tiles T=37 d=256");
    check_bf16(&(shape){70, 70, 4, 2, 13, 0.4, 0}, "tiles T=70 d=13 gqa2");
    check_bf16(&(shape){7, 7, 6, 2, 10, 1.0 / sqrt(10.0), 0}, "tiles T=7 d=10");
    check_bf16(&(shape){60, 75, 4, 2, 32, 0.2, 0}, "tiles past S=75 T=60");
    check_bf16(&(shape){100, 100, 4, 2, 64, 0.3, 17}, "tiles sliding window 17 T=100");
    check_bf16(&(shape){60, 75, 4, 2, 32, 0.2, 30}, "tiles sliding window 30 past S=75 T=60");
    check_bf16(&(shape){33, 33, 1, 1, 256, 1.0 / 16.0, 32}, "tiles window 32 T=33 d=256");
    g_tiles = NULL;
}

/* Out of memory for the scratch is an error (-1, nl_err saying so), not NaN in the output: a
 * key length whose panels no allocator gives (S = 2^30 keys of d = 64: 288 GiB of scratch; the
 * keys themselves are never read, the scratch comes first), on every variant. */
static void test_oom_is_error(void) {
    float out[8 * 64], lse[8], q[8 * 64], kv[64], dq[8 * 64], dk[8 * 64], dv[8 * 64];
    for (int i = 0; i < 8 * 64; i++) out[i] = 7.0f, q[i] = 0.0f;
    for (int i = 0; i < 64; i++) kv[i] = 0.0f;
    const int S = 1 << 30;
    CHECK(nl_attention_forward_range(&(nl_attn_fwd){.out = out,
                                                    .lse = lse,
                                                    .q = q,
                                                    .k = kv,
                                                    .v = kv,
                                                    .T = 8,
                                                    .S = S,
                                                    .Hq = 1,
                                                    .Hkv = 1,
                                                    .d = 64,
                                                    .scale = 0.125f,
                                                    .g1 = 1}) == -1);
    CHECK(strstr(nl_last_error(), "out of memory") != NULL);
    CHECK(nl_attention_forward_range_bf16(&(nl_attn_fwd){.out = out,
                                                         .lse = lse,
                                                         .q = q,
                                                         .k = kv,
                                                         .v = kv,
                                                         .T = 8,
                                                         .S = S,
                                                         .Hq = 1,
                                                         .Hkv = 1,
                                                         .d = 64,
                                                         .scale = 0.125f,
                                                         .g1 = 1}) == -1);
    CHECK(nl_attention_forward_range_tiles(&nl_amx_tiles_emu, &(nl_attn_fwd){.out = out,
                                                                             .lse = lse,
                                                                             .q = q,
                                                                             .k = kv,
                                                                             .v = kv,
                                                                             .T = 8,
                                                                             .S = S,
                                                                             .Hq = 1,
                                                                             .Hkv = 1,
                                                                             .d = 64,
                                                                             .scale = 0.125f,
                                                                             .g1 = 1}) == -1);
    int untouched = 1;
    for (int i = 0; i < 8 * 64; i++) untouched &= out[i] == 7.0f;
    CHECKF(untouched, "the output was written on out of memory");
    /* backward: T = 2^30 queries (no head to do, g1 = 0: only the scratch is asked for) */
    CHECK(nl_attention_backward_range(&(nl_attn_bwd){.dq = dq,
                                                     .dk = dk,
                                                     .dv = dv,
                                                     .dout = q,
                                                     .out = out,
                                                     .lse = lse,
                                                     .q = q,
                                                     .k = kv,
                                                     .v = kv,
                                                     .T = 1 << 30,
                                                     .Hq = 1,
                                                     .Hkv = 1,
                                                     .d = 64,
                                                     .scale = 0.125f,
                                                     .g1 = 0}) == -1);
    CHECK(strstr(nl_last_error(), "attention backward: out of memory") != NULL);
}

int main(void) {
    const shape gqa = {7, 7, 6, 2, 10, 1.0 / sqrt(10.0), 0};
    const shape mha = {7, 7, 3, 3, 10, 0.37, 0};
    const shape past = {7, 12, 6, 2, 10, 1.0 / sqrt(10.0), 0};
    const shape past_mha = {5, 9, 2, 2, 13, 0.5, 0};
    const shape longt = {300, 300, 2, 1, 16, 0.25, 0};
    const shape long_past = {300, 333, 4, 2, 12, 0.3, 0};
    const shape mid = {70, 70, 4, 2, 9, 0.4, 0}; /* crosses the 32-query and 64-key blocks */
    check_forward(&gqa, "gqa");
    check_forward(&mha, "mha");
    check_forward(&past, "past");
    check_forward(&past_mha, "past_mha");
    check_forward(&mid, "mid");
    check_forward(&longt, "long");
    check_forward(&long_past, "long_past");
    check_backward(&gqa, 1, "gqa");
    check_backward(&mha, 1, "mha");
    check_backward(&(shape){1, 1, 2, 1, 3, 0.7, 0}, 1, "T=1");
    check_backward(&mid, 0, "mid");
    check_backward(&longt, 0, "long");
    /* sliding window (gemma3): narrower than the sequence, across query blocks, with a past;
     * a window at least as long as the sequence is the plain causal form */
    const shape win = {7, 7, 6, 2, 10, 0.4, 3}, win1 = {6, 6, 2, 1, 5, 0.6, 1};
    const shape win_mid = {70, 70, 4, 2, 9, 0.4, 20}, win_past = {7, 19, 6, 2, 10, 0.3, 9};
    check_forward(&win, "window 3");
    check_forward(&win1, "window 1");
    check_forward(&win_mid, "window 20 T=70");
    check_forward(&win_past, "window 9 with a past");
    check_backward(&win, 1, "window 3");
    check_backward(&win1, 1, "window 1");
    check_backward(&win_mid, 0, "window 20 T=70");
    {
        const shape wide = {9, 9, 2, 1, 8, 0.5, 9};
        float *q, *k, *v, a[9 * 2 * 8], b[9 * 2 * 8];
        make_qkv(&wide, &q, &k, &v);
        nl_attention_forward_range(&(nl_attn_fwd){.out = a,
                                                  .lse = NULL,
                                                  .q = q,
                                                  .k = k,
                                                  .v = v,
                                                  .T = 9,
                                                  .S = 9,
                                                  .Hq = 2,
                                                  .Hkv = 1,
                                                  .d = 8,
                                                  .scale = 0.5f,
                                                  .window = 9,
                                                  .g1 = 1});
        nl_attention_forward(&(nl_attn_fwd){
            .out = b, .lse = NULL, .q = q, .k = k, .v = v, .T = 9, .S = 9, .Hq = 2, .Hkv = 1, .d = 8, .scale = 0.5f});
        CHECK(memcmp(a, b, sizeof a) == 0);
        free(q), free(k), free(v);
    }
    test_layout();
    test_oom_is_error();
    test_bf16();
    test_tiles(&nl_amx_tiles_emu);       /* the hardware's reading */
    test_tiles(&nl_amx_tiles_emu_chain); /* and the other documented one */
    check_tiles_model(&(shape){45, 45, 4, 2, 64, 0.125, 0}, "model T=45 d=64 gqa2");
    check_tiles_model(&(shape){70, 70, 2, 1, 13, 0.4, 20}, "model T=70 d=13 window 20");
    check_tiles_model(&(shape){37, 37, 1, 1, 256, 1.0 / 16.0, 0}, "model T=37 d=256");
    check_tiles_model(&(shape){60, 75, 4, 2, 32, 0.2, 30}, "model past S=75 T=60 window 30");
    check_tiles_model(&(shape){33, 33, 2, 2, 128, 1.0 / sqrt(128.0), 0}, "model T=33 d=128");
    if (nl_amx_tiles_of("amx")) test_tiles(nl_amx_tiles_of("amx"));
    else printf("no usable AMX here: the tile attention ran on the emulator only\n");
    return nl_t_done();
}

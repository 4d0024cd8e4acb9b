/* nn/gdn: the gated delta-net node (forward, streaming forward, training forward + backward).
 * Math: docs/formats.md §3 (GDN), docs/backward.md (gated delta-net).
 *
 * Layout choices:
 * - The recurrence runs one value head at a time over all tokens, so that head's state
 *   S[dk][dv] (64 KiB at dk = dv = 128) stays in cache; every inner loop runs over dv,
 *   contiguous.
 * - Backward walks each head separately too: chunks of 16 tokens last to first; a chunk's 17
 *   states (the checkpoint and the 16 after it) are recomputed into a per-head scratch.
 *   Gradients of q̂/k̂ of a key head shared by several value heads are summed into dmixed in
 *   value-head order (fixed, so deterministic).
 * - dmixed doubles as the buffer for d(conv output): the conv backward is done in place,
 *   ascending in time (row s of the result needs rows s..s+K-1 of the input only). */
#include "nn/gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/vecmath.h"
#include "util/cpu.h"
#include "util/pool.h"
#include "util/util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GDN_X86 1
#endif

#define CH NL_GDN_CHUNK
/* Width of the state column blocks the forward recurrence runs on (see gdn_step). */
#define GDN_COLS 64

struct nl_gdn_cache {
    nl_gdn_shape shape;
    int T_max, T;   /* T: tokens of the last nl_gdn_forward_train (0: none yet) */
    uint64_t bytes; /* size of data */
    float *data;
    float *cpre;                /* [T_max][conv_dim] conv output before SiLU */
    float *z;                   /* [T_max][Hv*dv] */
    float *beta, *g, *dgda;     /* [T_max][Hv] */
    float *ck;                  /* [(T_max-1)/16][Hv][dk][dv]: S before tokens 16, 32, ... */
};

/* ---- small scalar helpers ---- */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf(float x) { return x / (1.0f + expf(-x)); }
static inline float dsiluf(float x) {
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}
/* softplus with ggml's threshold: x > 20 -> x */
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Dot product with 8 fixed partial sums: vectorisable without reassociation flags, and the
 * summation order depends only on n (deterministic). */
static inline float dot(const float *restrict x, const float *restrict y, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[i + l] * y[i + l];
    float r = nl_lanes_sum(acc);
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

static int check_shape(const nl_gdn_shape *s) {
    if (!s) return nl_err("gdn: NULL shape");
    if (s->Hk < 1 || s->Hv < 1 || s->dk < 1 || s->dv < 1 || s->K < 1)
        return nl_err("gdn: bad shape Hk=%d Hv=%d dk=%d dv=%d K=%d (all must be >= 1)", s->Hk, s->Hv,
                      s->dk, s->dv, s->K);
    if (s->Hv % s->Hk)
        return nl_err("gdn: value heads Hv=%d not a multiple of key heads Hk=%d", s->Hv, s->Hk);
    if (!(s->eps > 0.0f) || !isfinite(s->eps)) return nl_err("gdn: eps %g must be > 0", (double)s->eps);
    /* keep conv_dim and dk*dv well inside int */
    int64_t cd = 2 * (int64_t)s->Hk * s->dk + (int64_t)s->Hv * s->dv;
    if (cd > (1 << 28) || (int64_t)s->dk * s->dv > (1 << 28) || s->K > 4096)
        return nl_err("gdn: shape too large (conv_dim %lld, dk*dv %lld, K %d)", (long long)cd,
                      (long long)s->dk * s->dv, s->K);
    return 0;
}

static int check_weights(const nl_gdn_weights *w, int need_gates) {
    if (!w || !w->conv || !w->norm || (need_gates && (!w->dt_bias || !w->A)))
        return nl_err("gdn: missing weight pointer");
    return 0;
}

static inline int key_head(const nl_gdn_shape *s, int j) {
    return s->kv_tiled ? j % s->Hk : j / (s->Hv / s->Hk);
}

/* dst = silu(src) / max(||silu(src)||, eps) over n; returns the norm ||silu(src)||.
 * Forward and backward call this same function, so the recomputed q̂/k̂ match bit for bit. */
static float silu_l2(float *dst, const float *src, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) {
        float x = siluf(src[i]);
        dst[i] = x;
        ss += (double)x * x;
    }
    float nrm = (float)sqrt(ss);
    float inv = 1.0f / (nrm > eps ? nrm : eps);
    for (int i = 0; i < n; i++) dst[i] *= inv;
    return nrm;
}

/* out[c] += a[c] * x[c] over n (8-wide blocks + tail). */
static inline void row_fma(float *restrict out, const float *restrict a, const float *restrict x, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) out[c + l] += a[c + l] * x[c + l];
    for (; c < n; c++) out[c] += a[c] * x[c];
}

/* Causal depthwise conv: cpre[t][ch] = sum_i w[ch][i] * m_{t-K+1+i}[ch] (summed i = 0..K-1),
 * where positions < 0 come from hist[(K-1)][cd] (oldest first; hist[K-1+pos]).
 * wt[K][cd] is scratch for the transposed kernel, so every inner loop is contiguous. */
static void conv_forward(float *cpre, const float *mixed, const float *hist, const float *w, int T,
                         int cd, int K, float *wt) {
    for (int ch = 0; ch < cd; ch++)
        for (int i = 0; i < K; i++) wt[(size_t)i * cd + ch] = w[(size_t)ch * K + i];
    for (int t = 0; t < T; t++) {
        float *out = cpre + (size_t)t * cd;
        memset(out, 0, sizeof(float) * (size_t)cd);
        for (int i = 0; i < K; i++) {
            int pos = t - K + 1 + i;
            const float *r = pos >= 0 ? mixed + (size_t)pos * cd : hist + (size_t)(K - 1 + pos) * cd;
            row_fma(out, wt + (size_t)i * cd, r, cd);
        }
    }
}

/* The conv history after T more inputs: the last K-1 of (hist ++ mixed). In place, ascending:
 * row r reads hist row T+r > r (not yet overwritten) or a mixed row. */
static void conv_state_update(float *hist, const float *mixed, int T, int cd, int K) {
    for (int r = 0; r < K - 1; r++) {
        int pos = T - (K - 1) + r;
        const float *src = pos >= 0 ? mixed + (size_t)pos * cd : hist + (size_t)(K - 1 + pos) * cd;
        if (src != hist + (size_t)r * cd) memmove(hist + (size_t)r * cd, src, sizeof(float) * (size_t)cd);
    }
}

/* Row kernels over dv, written as 8-wide blocks plus a scalar tail: gcc -O2 (the "very cheap"
 * vectoriser) turns fixed 8-element inner loops into SIMD, but not loops of unknown length.
 * No pointer arguments alias. */

/* d = α d;  acc += s d */
static inline void row_scale_acc(float *restrict d, float alpha, float *restrict acc, float s, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) {
            float x = alpha * d[c + l];
            d[c + l] = x;
            acc[c + l] += s * x;
        }
    for (; c < n; c++) {
        float x = alpha * d[c];
        d[c] = x;
        acc[c] += s * x;
    }
}

/* d = α x (out of place);  acc += s d */
static inline void row_scale_acc_from(float *restrict d, const float *restrict x, float alpha,
                                      float *restrict acc, float s, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) {
            float v = alpha * x[c + l];
            d[c + l] = v;
            acc[c + l] += s * v;
        }
    for (; c < n; c++) {
        float v = alpha * x[c];
        d[c] = v;
        acc[c] += s * v;
    }
}

/* d += a x;  acc += s d */
static inline void row_axpy_acc(float *restrict d, float a, const float *restrict x,
                                float *restrict acc, float s, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) {
            float v = d[c + l] + a * x[c + l];
            d[c + l] = v;
            acc[c + l] += s * v;
        }
    for (; c < n; c++) {
        float v = d[c] + a * x[c];
        d[c] = v;
        acc[c] += s * v;
    }
}

/* Backward pass 2 on one row: d' = d + a x; returns <d', y>; *xy = <x, y>; d = α d'. */
static inline float row_bwd2(float *restrict d, float a, const float *restrict x,
                             const float *restrict y, float alpha, float *xy, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) {
            float v = d[c + l] + a * x[c + l];
            acc[l] += v * y[c + l];
            acx[l] += x[c + l] * y[c + l];
            d[c + l] = alpha * v;
        }
    float r = nl_lanes_sum(acc);
    float rx = nl_lanes_sum(acx);
    for (; c < n; c++) {
        float v = d[c] + a * x[c];
        r += v * y[c];
        rx += x[c] * y[c];
        d[c] = alpha * v;
    }
    *xy = rx;
    return r;
}

/* One token of one value head on the columns [0, n) of its state (row stride ld; n = dv for the
 * whole state): S = α S_prev + k uᵀ with u = β (v − (αS_prev)ᵀk); o = scale Sᵀ q. Every column of
 * S evolves on its own (k, q, α, β are shared), so a column block gives the same bits as the
 * whole row. S_prev == S (in place) or a separate state (backward keeps every state of a chunk);
 * both paths do the same arithmetic. r_out (v − p) is kept for backward when non-NULL. p: [n]
 * scratch. Portable form. */
static void step_c(float *S, const float *S_prev, size_t ld, const float *k, const float *v,
                   const float *q, float alpha, float beta, float scale, int dk, int n,
                   float *restrict p, float *restrict u, float *r_out, float *restrict o) {
    for (int c = 0; c < n; c++) p[c] = 0.0f;
    if (S_prev == S)
        for (int i = 0; i < dk; i++) row_scale_acc(S + (size_t)i * ld, alpha, p, k[i], n);
    else
        for (int i = 0; i < dk; i++)
            row_scale_acc_from(S + (size_t)i * ld, S_prev + (size_t)i * ld, alpha, p, k[i], n);
    for (int c = 0; c < n; c++) {
        float r = v[c] - p[c];
        if (r_out) r_out[c] = r;
        u[c] = beta * r;
        o[c] = 0.0f;
    }
    for (int i = 0; i < dk; i++) row_axpy_acc(S + (size_t)i * ld, k[i], u, o, q[i], n);
    for (int c = 0; c < n; c++) o[c] *= scale;
}

#ifdef GDN_X86
/* step_c on 64 columns with AVX-512, p and o held in four registers each: the same multiplies
 * and adds in the same order as step_c (separate, no FMA), so the same bits. */
__attribute__((target("avx512f"))) static void step64_avx512(float *S, const float *S_prev, size_t ld,
                                                               const float *k, const float *v, const float *q,
                                                               float alpha, float beta, float scale, int dk,
                                                               float *restrict u, float *r_out, float *restrict o) {
    const __m512 va = _mm512_set1_ps(alpha);
    __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
    for (int i = 0; i < dk; i++) {
        const float *sp = S_prev + (size_t)i * ld;
        float *sd = S + (size_t)i * ld;
        const __m512 kk = _mm512_set1_ps(k[i]);
        __m512 x0 = _mm512_mul_ps(va, _mm512_loadu_ps(sp)), x1 = _mm512_mul_ps(va, _mm512_loadu_ps(sp + 16));
        __m512 x2 = _mm512_mul_ps(va, _mm512_loadu_ps(sp + 32)), x3 = _mm512_mul_ps(va, _mm512_loadu_ps(sp + 48));
        _mm512_storeu_ps(sd, x0);
        _mm512_storeu_ps(sd + 16, x1);
        _mm512_storeu_ps(sd + 32, x2);
        _mm512_storeu_ps(sd + 48, x3);
        p0 = _mm512_add_ps(p0, _mm512_mul_ps(kk, x0));
        p1 = _mm512_add_ps(p1, _mm512_mul_ps(kk, x1));
        p2 = _mm512_add_ps(p2, _mm512_mul_ps(kk, x2));
        p3 = _mm512_add_ps(p3, _mm512_mul_ps(kk, x3));
    }
    const __m512 vb = _mm512_set1_ps(beta);
    __m512 r0 = _mm512_sub_ps(_mm512_loadu_ps(v), p0), r1 = _mm512_sub_ps(_mm512_loadu_ps(v + 16), p1);
    __m512 r2 = _mm512_sub_ps(_mm512_loadu_ps(v + 32), p2), r3 = _mm512_sub_ps(_mm512_loadu_ps(v + 48), p3);
    if (r_out) {
        _mm512_storeu_ps(r_out, r0);
        _mm512_storeu_ps(r_out + 16, r1);
        _mm512_storeu_ps(r_out + 32, r2);
        _mm512_storeu_ps(r_out + 48, r3);
    }
    const __m512 u0 = _mm512_mul_ps(vb, r0), u1 = _mm512_mul_ps(vb, r1);
    const __m512 u2 = _mm512_mul_ps(vb, r2), u3 = _mm512_mul_ps(vb, r3);
    _mm512_storeu_ps(u, u0);
    _mm512_storeu_ps(u + 16, u1);
    _mm512_storeu_ps(u + 32, u2);
    _mm512_storeu_ps(u + 48, u3);
    __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
    for (int i = 0; i < dk; i++) {
        float *sd = S + (size_t)i * ld;
        const __m512 kk = _mm512_set1_ps(k[i]), qq = _mm512_set1_ps(q[i]);
        __m512 x0 = _mm512_add_ps(_mm512_loadu_ps(sd), _mm512_mul_ps(kk, u0));
        __m512 x1 = _mm512_add_ps(_mm512_loadu_ps(sd + 16), _mm512_mul_ps(kk, u1));
        __m512 x2 = _mm512_add_ps(_mm512_loadu_ps(sd + 32), _mm512_mul_ps(kk, u2));
        __m512 x3 = _mm512_add_ps(_mm512_loadu_ps(sd + 48), _mm512_mul_ps(kk, u3));
        _mm512_storeu_ps(sd, x0);
        _mm512_storeu_ps(sd + 16, x1);
        _mm512_storeu_ps(sd + 32, x2);
        _mm512_storeu_ps(sd + 48, x3);
        o0 = _mm512_add_ps(o0, _mm512_mul_ps(qq, x0));
        o1 = _mm512_add_ps(o1, _mm512_mul_ps(qq, x1));
        o2 = _mm512_add_ps(o2, _mm512_mul_ps(qq, x2));
        o3 = _mm512_add_ps(o3, _mm512_mul_ps(qq, x3));
    }
    const __m512 vs = _mm512_set1_ps(scale);
    _mm512_storeu_ps(o, _mm512_mul_ps(o0, vs));
    _mm512_storeu_ps(o + 16, _mm512_mul_ps(o1, vs));
    _mm512_storeu_ps(o + 32, _mm512_mul_ps(o2, vs));
    _mm512_storeu_ps(o + 48, _mm512_mul_ps(o3, vs));
}
#endif

#ifdef GDN_X86
#define GDN_AVX2 __attribute__((target("avx2")))
/* The 8 lanes of a register as one nl_lanes_sum (the same order as the portable reductions). */
GDN_AVX2 static inline float lanes_sum256(__m256 v) {
    float a[NL_LANES];
    _mm256_storeu_ps(a, v);
    return nl_lanes_sum(a);
}

/* Backward pass 1 on one row of dS, 8 lanes a register: d += a x; du += s d; returns
 * <sn, x> and *du_out = <d (updated), u>: the bits of row_axpy_acc and two dot() calls. */
GDN_AVX2 static float row_bwd1_avx2(float *restrict d, float a, const float *restrict x,
                                    float *restrict du, float s, const float *restrict sn,
                                    const float *restrict u, float *du_out, int n) {
    const __m256 va = _mm256_set1_ps(a), vs = _mm256_set1_ps(s);
    __m256 aq = _mm256_setzero_ps(), ak = aq;
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 xx = _mm256_loadu_ps(x + c);
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(d + c), _mm256_mul_ps(va, xx));
        _mm256_storeu_ps(d + c, v);
        _mm256_storeu_ps(du + c, _mm256_add_ps(_mm256_loadu_ps(du + c), _mm256_mul_ps(vs, v)));
        aq = _mm256_add_ps(aq, _mm256_mul_ps(_mm256_loadu_ps(sn + c), xx));
        ak = _mm256_add_ps(ak, _mm256_mul_ps(v, _mm256_loadu_ps(u + c)));
    }
    for (int t = c; t < n; t++) {
        float v = d[t] + a * x[t];
        d[t] = v;
        du[t] += s * v;
    }
    float rq = lanes_sum256(aq), rk = lanes_sum256(ak);
    for (int t = c; t < n; t++) rq += sn[t] * x[t];
    for (int t = c; t < n; t++) rk += d[t] * u[t];
    *du_out = rk;
    return rq;
}

/* row_bwd2 with 8 lanes a register (the same bits). */
GDN_AVX2 static float row_bwd2_avx2(float *restrict d, float a, const float *restrict x,
                                    const float *restrict y, float alpha, float *xy, int n) {
    const __m256 va = _mm256_set1_ps(a), val = _mm256_set1_ps(alpha);
    __m256 acc = _mm256_setzero_ps(), acx = acc;
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 xx = _mm256_loadu_ps(x + c), yy = _mm256_loadu_ps(y + c);
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(d + c), _mm256_mul_ps(va, xx));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, yy));
        acx = _mm256_add_ps(acx, _mm256_mul_ps(xx, yy));
        _mm256_storeu_ps(d + c, _mm256_mul_ps(val, v));
    }
    float r = lanes_sum256(acc), rx = lanes_sum256(acx);
    for (; c < n; c++) {
        float v = d[c] + a * x[c];
        r += v * y[c];
        rx += x[c] * y[c];
        d[c] = alpha * v;
    }
    *xy = rx;
    return r;
}
#endif

/* Backward pass 1 on one row (portable or AVX2, the same bits): d += a x; du += s d;
 * returns <sn, x>; *du_out = <d, u>. */
static inline float row_bwd1(int wide, float *restrict d, float a, const float *restrict x,
                             float *restrict du, float s, const float *restrict sn,
                             const float *restrict u, float *du_out, int n) {
#ifdef GDN_X86
    if (wide) return row_bwd1_avx2(d, a, x, du, s, sn, u, du_out, n);
#else
    (void)wide;
#endif
    row_axpy_acc(d, a, x, du, s, n);
    float rq = dot(sn, x, n);
    *du_out = dot(d, u, n);
    return rq;
}

static inline float row_bwd2_any(int wide, float *restrict d, float a, const float *restrict x,
                                 const float *restrict y, float alpha, float *xy, int n) {
#ifdef GDN_X86
    if (wide) return row_bwd2_avx2(d, a, x, y, alpha, xy, n);
#else
    (void)wide;
#endif
    return row_bwd2(d, a, x, y, alpha, xy, n);
}

/* nl_gdn_set_simd(0) turns the SIMD kernels off (tests compare both paths). */
static int simd_on = 1;
void nl_gdn_set_simd(int on) { __atomic_store_n(&simd_on, on != 0, __ATOMIC_RELAXED); }

/* 1 when the AVX-512 step runs (the same bits as the portable one). */
static int wide_step(void) {
#ifdef GDN_X86
    return __atomic_load_n(&simd_on, __ATOMIC_RELAXED) && nl_cpu_has(NL_CPU_AVX512);
#else
    return 0;
#endif
}

/* 1 when the backward row kernels run on AVX2 (the same bits as the portable ones). */
static int wide_bwd(void) {
#ifdef GDN_X86
    return __atomic_load_n(&simd_on, __ATOMIC_RELAXED) && nl_cpu_has(NL_CPU_AVX2);
#else
    return 0;
#endif
}

int nl_gdn_simd(void) { return wide_step() || wide_bwd(); }

/* step_c over n columns, in blocks of 64 on the AVX-512 step when `wide` (the rest portable). */
static void gdn_step(int wide, float *S, const float *S_prev, size_t ld, const float *k, const float *v,
                     const float *q, float alpha, float beta, float scale, int dk, int n,
                     float *restrict p, float *restrict u, float *r_out, float *restrict o) {
    int c0 = 0;
#ifdef GDN_X86
    if (wide)
        for (; c0 + 64 <= n; c0 += 64)
            step64_avx512(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, u + c0,
                          r_out ? r_out + c0 : NULL, o + c0);
#else
    (void)wide;
#endif
    if (c0 < n)
        step_c(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, n - c0, p, u + c0,
               r_out ? r_out + c0 : NULL, o + c0);
}

/* Gated RMSNorm in place: o <- o / sqrt(mean(o²) + eps) * nw * silu(z), over dv. */
static void gated_norm(float *o, const float *z, const float *nw, int dv, float eps) {
    double ss = 0.0;
    for (int c = 0; c < dv; c++) ss += (double)o[c] * o[c];
    float rstd = (float)(1.0 / sqrt(ss / dv + eps));
    for (int c = 0; c < dv; c++) o[c] = o[c] * rstd * nw[c] * siluf(z[c]);
}

/* Its backward: given o (pre-norm), z and dy, writes dz and d_o. */
static void gated_norm_backward(float *restrict d_o, float *restrict dz, const float *o,
                                const float *z, const float *nw, const float *dy, int dv, float eps) {
    double ss = 0.0;
    for (int c = 0; c < dv; c++) ss += (double)o[c] * o[c];
    float rstd = (float)(1.0 / sqrt(ss / dv + eps));
    double gdot = 0.0;
    for (int c = 0; c < dv; c++) {
        float sz = siluf(z[c]);
        dz[c] = dy[c] * o[c] * rstd * nw[c] * dsiluf(z[c]);
        float gw = dy[c] * nw[c] * sz; /* d(loss)/d(normalised o) */
        d_o[c] = gw;
        gdot += (double)gw * o[c];
    }
    float f = (float)(gdot * rstd * rstd / dv);
    for (int c = 0; c < dv; c++) d_o[c] = rstd * (d_o[c] - o[c] * f);
}

/* β, g (and dg/da when dgda != NULL) for T tokens. */
static void gates(const nl_gdn_shape *s, const nl_gdn_weights *w, const float *b, const float *a,
                  int T, float *beta, float *g, float *dgda) {
    int H = s->Hv;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < H; j++) {
            size_t ix = (size_t)t * H + j;
            float x = a[ix] + w->dt_bias[j];
            beta[ix] = sigmoidf(b[ix]);
            g[ix] = w->A[j] * softplusf(x);
            if (dgda) dgda[ix] = x > 20.0f ? w->A[j] : w->A[j] * sigmoidf(x);
        }
}

/* The threads' share of [0, n): task `task` of n_tasks gets [n·task/n_tasks, n·(task+1)/n_tasks). */
static void share(int n, int task, int n_tasks, int *i0, int *i1) {
    *i0 = (int)((int64_t)n * task / n_tasks);
    *i1 = (int)((int64_t)n * (task + 1) / n_tasks);
}

/* Tasks for up to n independent pieces on pool (NULL or one thread: 1). */
static int n_tasks_for(nl_pool *pool, int n) {
    int k = pool ? nl_pool_size(pool) : 1;
    return k < n ? k : n;
}

/* Runs fn over n_tasks tasks, on the pool when there are several. */
static void run_tasks(nl_pool *pool, int n_tasks, void (*fn)(void *, int, int), void *job) {
    if (n_tasks > 1) nl_pool_run(pool, n_tasks, fn, job);
    else fn(job, 0, 1);
}

typedef struct {
    const nl_gdn_shape *s;
    const nl_gdn_weights *w;
    float *y, *xs, *Sstate, *ck, *scratch;
    const float *cpre, *z, *beta, *g;
    int T, wide;
} fwd_job;

/* q̂, k̂, silu(v) of the job's rows (xs may equal cpre: elementwise per head segment). */
static void fwd_rows_task(void *arg, int task, int n_tasks) {
    const fwd_job *J = arg;
    const nl_gdn_shape *s = J->s;
    int Hk = s->Hk, dk = s->dk, cd = nl_gdn_conv_dim(s), t0, t1;
    share(J->T, task, n_tasks, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        const float *src = J->cpre + (size_t)t * cd;
        float *dst = J->xs + (size_t)t * cd;
        for (int h = 0; h < 2 * Hk; h++) silu_l2(dst + (size_t)h * dk, src + (size_t)h * dk, dk, s->eps);
        for (int c = 2 * Hk * dk; c < cd; c++) dst[c] = siluf(src[c]);
    }
}

/* The recurrence and the gated norm of the task's value heads (a head's outputs, state and
 * checkpoints are its own: the same bits on any number of threads). */
static void fwd_heads_task(void *arg, int task, int n_tasks) {
    const fwd_job *J = arg;
    const nl_gdn_shape *s = J->s;
    int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv, T = J->T, j0, j1;
    int cd = nl_gdn_conv_dim(s);
    size_t hs = (size_t)dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    float *Shead = J->scratch + (size_t)task * (hs + 3 * (size_t)dv);
    float *p = Shead + hs, *u = p + dv;
    share(Hv, task, n_tasks, &j0, &j1);
    for (int j = j0; j < j1; j++) {
        int kh = key_head(s, j);
        float *S = J->Sstate ? J->Sstate + (size_t)j * hs : Shead;
        if (!J->Sstate) memset(S, 0, sizeof(float) * hs);
        /* column blocks of the state, each over all tokens: dk x GDN_COLS floats stay in L1 */
        for (int c0 = 0; c0 < dv; c0 += GDN_COLS) {
            int n = dv - c0 < GDN_COLS ? dv - c0 : GDN_COLS;
            for (int t = 0; t < T; t++) {
                const float *row = J->xs + (size_t)t * cd;
                if (J->ck && t > 0 && t % CH == 0) {
                    float *dst = J->ck + ((size_t)(t / CH - 1) * Hv + j) * hs;
                    for (int i = 0; i < dk; i++)
                        memcpy(dst + (size_t)i * dv + c0, S + (size_t)i * dv + c0, sizeof(float) * (size_t)n);
                }
                size_t gi = (size_t)t * Hv + j;
                float *o = J->y + (size_t)t * Hv * dv + (size_t)j * dv + c0;
                gdn_step(J->wide, S + c0, S + c0, (size_t)dv, row + Hk * dk + (size_t)kh * dk,
                         row + 2 * Hk * dk + (size_t)j * dv + c0, row + (size_t)kh * dk, expf(J->g[gi]),
                         J->beta[gi], scale, dk, n, p, u, NULL, o);
            }
        }
        for (int t = 0; t < T; t++) {
            float *o = J->y + (size_t)t * Hv * dv + (size_t)j * dv;
            gated_norm(o, J->z + (size_t)t * Hv * dv + (size_t)j * dv, J->w->norm, dv, s->eps);
        }
    }
}

/* Shared forward: cpre (already conv'd, [T][cd]) -> y. xs [T][cd] receives q̂, k̂, silu(v); it
 * may equal cpre. Sstate: [Hv][dk][dv] read and updated, or NULL (zero start). ck: checkpoint
 * array or NULL. Value heads split over the pool's threads. */
static int forward_core(nl_pool *pool, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                        const float *cpre, float *xs, const float *z, const float *beta, const float *g,
                        int T, float *Sstate, float *ck) {
    int nh = n_tasks_for(pool, s->Hv), nr = n_tasks_for(pool, T);
    float *scratch = nl_malloc(sizeof(float) * (size_t)nh * ((size_t)s->dk * s->dv + 3 * (size_t)s->dv));
    if (!scratch) return -1;
    fwd_job J = {.s = s, .w = w, .y = y, .xs = xs, .Sstate = Sstate, .ck = ck, .scratch = scratch, .cpre = cpre,
                 .z = z, .beta = beta, .g = g, .T = T, .wide = wide_step()};
    run_tasks(pool, nr, fwd_rows_task, &J);
    run_tasks(pool, nh, fwd_heads_task, &J);
    free(scratch);
    return 0;
}

int nl_gdn_forward(nl_pool *pool, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y, const float *mixed,
                   const float *z, const float *b, const float *a, int T, nl_gdn_state *state) {
    if (check_shape(s) || check_weights(w, 1)) return -1;
    if (T < 0) return nl_err("gdn: negative token count %d", T);
    if (T == 0) return 0;
    if (!y || !mixed || !z || !b || !a) return nl_err("gdn: NULL activation pointer");
    if (state && (!state->S || (s->K > 1 && !state->conv))) return nl_err("gdn: state without buffers");
    int cd = nl_gdn_conv_dim(s), Hv = s->Hv, K = s->K;
    /* scratch: cpre [T][cd] (turned into q̂, k̂, silu(v) in place); beta, g [T][Hv]; zero
     * history [(K-1)][cd] when no state; wt [K][cd] */
    size_t n_tc = (size_t)T * cd, n_g = (size_t)T * Hv;
    size_t n_hist = state ? 0 : (size_t)(K - 1) * cd;
    size_t n_wt = (size_t)K * cd;
    size_t n = n_tc + 2 * n_g + n_hist + n_wt;
    float *buf = nl_malloc(sizeof(float) * n);
    if (!buf) return -1;
    float *cpre = buf, *beta = cpre + n_tc, *g = beta + n_g, *hist = g + n_g, *wt = hist + n_hist;
    if (!state) memset(hist, 0, sizeof(float) * n_hist);
    const float *h = state ? state->conv : hist;
    conv_forward(cpre, mixed, h, w->conv, T, cd, K, wt);
    gates(s, w, b, a, T, beta, g, NULL);
    /* the state is updated only once nothing can fail */
    if (forward_core(pool, s, w, y, cpre, cpre, z, beta, g, T, state ? state->S : NULL, NULL)) {
        free(buf);
        return -1;
    }
    if (state && K > 1) conv_state_update(state->conv, mixed, T, cd, K);
    free(buf);
    return 0;
}

/* ---- training ---- */

static int n_ckpt(int T) { return T >= 1 ? (T - 1) / CH : 0; }

/* Data floats of a cache for T tokens; -1 on overflow. */
static int cache_floats(const nl_gdn_shape *s, int T, uint64_t *out) {
    uint64_t per_tok = (uint64_t)nl_gdn_conv_dim(s) + (uint64_t)s->Hv * s->dv + 3 * (uint64_t)s->Hv;
    uint64_t a, c, hs;
    if (nl_mul_ok(per_tok, (uint64_t)T, &a)) return -1;
    if (nl_mul_ok((uint64_t)s->Hv * s->dk, (uint64_t)s->dv, &hs)) return -1;
    if (nl_mul_ok(hs, (uint64_t)n_ckpt(T), &c)) return -1;
    if (nl_add_ok(a, c, out)) return -1;
    if (*out > UINT64_MAX / 4) return -1;
    return 0;
}

uint64_t nl_gdn_cache_bytes(const nl_gdn_shape *s, int T) {
    uint64_t f;
    if (T < 1 || check_shape(s) || cache_floats(s, T, &f)) return 0;
    return 4 * f;
}

/* Backward scratch layout (floats), independent of T. */
static uint64_t bwd_work_floats(const nl_gdn_shape *s) {
    uint64_t hs = (uint64_t)s->dk * s->dv;
    return (CH + 1) * hs /* chunk states */ + hs /* dS */ + CH * 2 * (uint64_t)s->dk /* q̂, k̂ */
           + CH * 4 * (uint64_t)s->dv /* v, u, v-p, do */ + 4 * (uint64_t)s->dv /* p, o, du, dp */
           + 2 * (uint64_t)s->dk;     /* l2 backward row */
}

uint64_t nl_gdn_backward_work_bytes(const nl_gdn_shape *s) {
    if (check_shape(s)) return 0;
    return 4 * bwd_work_floats(s);
}

nl_gdn_cache *nl_gdn_cache_new(const nl_gdn_shape *s, int T_max) {
    if (check_shape(s)) return NULL;
    if (T_max < 1) {
        nl_err("gdn: cache for %d tokens (need >= 1)", T_max);
        return NULL;
    }
    uint64_t f;
    if (cache_floats(s, T_max, &f) || f > SIZE_MAX / 4) {
        nl_err("gdn: cache for %d tokens overflows", T_max);
        return NULL;
    }
    nl_gdn_cache *c = nl_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->data = nl_malloc((size_t)f * 4);
    if (!c->data) {
        free(c);
        return NULL;
    }
    c->shape = *s;
    c->T_max = T_max;
    c->bytes = 4 * f;
    size_t T = (size_t)T_max, cd = (size_t)nl_gdn_conv_dim(s), Hv = (size_t)s->Hv;
    c->cpre = c->data;
    c->z = c->cpre + T * cd;
    c->beta = c->z + T * Hv * s->dv;
    c->g = c->beta + T * Hv;
    c->dgda = c->g + T * Hv;
    c->ck = c->dgda + T * Hv;
    return c;
}

void nl_gdn_cache_free(nl_gdn_cache *c) {
    if (!c) return;
    free(c->data);
    free(c);
}

uint64_t nl_gdn_cache_size(const nl_gdn_cache *c) { return c ? c->bytes : 0; }

static int same_shape(const nl_gdn_shape *a, const nl_gdn_shape *b) {
    return a->Hk == b->Hk && a->Hv == b->Hv && a->dk == b->dk && a->dv == b->dv && a->K == b->K &&
           a->eps == b->eps && (a->kv_tiled != 0) == (b->kv_tiled != 0);
}

int nl_gdn_forward_train(nl_pool *pool, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                         const float *mixed, const float *z, const float *b, const float *a,
                         int T, nl_gdn_cache *cache) {
    if (check_shape(s) || check_weights(w, 1)) return -1;
    if (!cache) return nl_err("gdn: NULL cache");
    if (!same_shape(s, &cache->shape)) return nl_err("gdn: cache was made for another shape");
    if (T < 1 || T > cache->T_max)
        return nl_err("gdn: %d tokens for a cache of at most %d", T, cache->T_max);
    if (!y || !mixed || !z || !b || !a) return nl_err("gdn: NULL activation pointer");
    int cd = nl_gdn_conv_dim(s), K = s->K;
    size_t n_tc = (size_t)T * cd, n_hist = (size_t)(K - 1) * cd;
    float *buf = nl_malloc(sizeof(float) * (n_tc + n_hist + (size_t)K * cd));
    if (!buf) return -1;
    float *xs = buf, *hist = xs + n_tc, *wt = hist + n_hist;
    memset(hist, 0, sizeof(float) * n_hist);
    cache->T = 0;
    conv_forward(cache->cpre, mixed, hist, w->conv, T, cd, K, wt);
    memcpy(cache->z, z, sizeof(float) * (size_t)T * s->Hv * s->dv);
    gates(s, w, b, a, T, cache->beta, cache->g, cache->dgda);
    int rc = forward_core(pool, s, w, y, cache->cpre, xs, cache->z, cache->beta, cache->g, T, NULL, cache->ck);
    if (rc == 0) cache->T = T;
    free(buf);
    return rc;
}

typedef struct {
    const nl_gdn_shape *s;
    const nl_gdn_weights *w;
    const nl_gdn_cache *cache;
    const float *dy;
    float *dmixed, *dz, *db, *da, *scratch;
    int T, wide, wide_b;
} bwd_job;

/* The recurrence backward of the task's key heads, each with its value heads in ascending
 * order: the gradients of a key head's q̂/k̂ are summed in the same order on any number of
 * threads; everything else a value head writes is its own. */
static void bwd_heads_task(void *arg, int task, int n_tasks) {
    const bwd_job *J = arg;
    const nl_gdn_shape *s = J->s;
    const nl_gdn_weights *w = J->w;
    const nl_gdn_cache *cache = J->cache;
    const float *dy = J->dy;
    float *dmixed = J->dmixed, *dz = J->dz, *db = J->db, *da = J->da;
    const int T = J->T, wide = J->wide, wide_b = J->wide_b;
    const int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv;
    const int cd = nl_gdn_conv_dim(s);
    const size_t hs = (size_t)dk * dv, vd = (size_t)Hv * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    float *buf = J->scratch + (size_t)task * bwd_work_floats(s);
    float *St = buf;                      /* [17][dk][dv]: St[i] = S before chunk token i */
    float *dS = St + (CH + 1) * hs;       /* [dk][dv] carried gradient */
    float *Q = dS + hs, *Kc = Q + CH * dk; /* [16][dk] q̂, k̂ of the chunk */
    float *V = Kc + CH * dk;              /* [16][dv] silu(v) */
    float *U = V + CH * dv, *R = U + CH * dv, *DO = R + CH * dv; /* [16][dv]: u, v-p, do */
    float *p = DO + CH * dv, *o = p + dv, *du = o + dv, *dp = du + dv; /* [dv] */
    const int nch = (T + CH - 1) / CH;
    int k0, k1;
    share(Hk, task, n_tasks, &k0, &k1);
    for (int kh = k0; kh < k1; kh++)
    for (int j = 0; j < Hv; j++) {
        if (key_head(s, j) != kh) continue;
        const size_t qoff = (size_t)kh * dk, koff = (size_t)Hk * dk + (size_t)kh * dk;
        const size_t voff = 2 * (size_t)Hk * dk + (size_t)j * dv;
        memset(dS, 0, sizeof(float) * hs);
        for (int ci = nch - 1; ci >= 0; ci--) {
            const int t0 = ci * CH, n = T - t0 < CH ? T - t0 : CH;
            if (ci == 0) memset(St, 0, sizeof(float) * hs);
            else memcpy(St, cache->ck + ((size_t)(ci - 1) * Hv + j) * hs, sizeof(float) * hs);
            /* recompute the chunk forward, keeping states, u, v-p and do */
            for (int i = 0; i < n; i++) {
                const size_t t = (size_t)t0 + i, gi = t * Hv + j;
                const float *cp = cache->cpre + t * cd;
                silu_l2(Q + (size_t)i * dk, cp + qoff, dk, s->eps);
                silu_l2(Kc + (size_t)i * dk, cp + koff, dk, s->eps);
                for (int c = 0; c < dv; c++) V[(size_t)i * dv + c] = siluf(cp[voff + c]);
                gdn_step(wide, St + (size_t)(i + 1) * hs, St + (size_t)i * hs, (size_t)dv, Kc + (size_t)i * dk,
                         V + (size_t)i * dv, Q + (size_t)i * dk, expf(cache->g[gi]), cache->beta[gi],
                         scale, dk, dv, p, U + (size_t)i * dv, R + (size_t)i * dv, o);
                gated_norm_backward(DO + (size_t)i * dv, dz + t * vd + (size_t)j * dv, o,
                                    cache->z + t * vd + (size_t)j * dv, w->norm, dy + t * vd + (size_t)j * dv,
                                    dv, s->eps);
            }
            /* walk the chunk backward */
            for (int i = n - 1; i >= 0; i--) {
                const size_t t = (size_t)t0 + i, gi = t * Hv + j;
                const float *q = Q + (size_t)i * dk, *k = Kc + (size_t)i * dk;
                const float *u = U + (size_t)i * dv, *dov = DO + (size_t)i * dv;
                const float *Snew = St + (size_t)(i + 1) * hs, *Sold = St + (size_t)i * hs;
                float *dq = dmixed + t * cd + qoff, *dkv = dmixed + t * cd + koff;
                const float alpha = expf(cache->g[gi]), beta = cache->beta[gi];
                for (int c = 0; c < dv; c++) du[c] = 0.0f;
                /* dS += scale q doᵀ; dq̂ += scale S_t do; dk̂ += dS u; du = dSᵀ k̂ */
                for (int r = 0; r < dk; r++) {
                    float du_u;
                    float sdo = row_bwd1(wide_b, dS + (size_t)r * dv, scale * q[r], dov, du, k[r],
                                         Snew + (size_t)r * dv, u, &du_u, dv);
                    dq[r] += scale * sdo;
                    dkv[r] += du_u;
                }
                /* u = β (v − p): dβ = du·(v − p), dv = β du, dp = −β du */
                const float dbeta = dot(du, R + (size_t)i * dv, dv);
                float *dvv = dmixed + t * cd + voff;
                for (int c = 0; c < dv; c++) {
                    dvv[c] = beta * du[c];
                    dp[c] = -beta * du[c];
                }
                /* dS' = dS + k̂ dpᵀ; dk̂ += α S_{t−1} dp; dα = <dS', S_{t−1}>; dS = α dS' */
                double dalpha = 0.0;
                for (int r = 0; r < dk; r++) {
                    float sodp;
                    dalpha += row_bwd2_any(wide_b, dS + (size_t)r * dv, k[r], dp, Sold + (size_t)r * dv, alpha,
                                           &sodp, dv);
                    dkv[r] += alpha * sodp;
                }
                da[gi] = (float)(dalpha * alpha) * cache->dgda[gi];
                db[gi] = dbeta * beta * (1.0f - beta);
            }
        }
    }
}

/* d(q̂, k̂) of the task's rows -> d(silu out) through the L2 norm; then everything through SiLU'. */
static void bwd_rows_task(void *arg, int task, int n_tasks) {
    const bwd_job *J = arg;
    const nl_gdn_shape *s = J->s;
    const nl_gdn_cache *cache = J->cache;
    float *dmixed = J->dmixed;
    const int Hk = s->Hk, dk = s->dk, cd = nl_gdn_conv_dim(s);
    float *xrow = J->scratch + (size_t)task * bwd_work_floats(s), *drow = xrow + dk; /* [dk] */
    int t0, t1;
    share(J->T, task, n_tasks, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        const float *cp = cache->cpre + (size_t)t * cd;
        float *dm = dmixed + (size_t)t * cd;
        for (int h = 0; h < 2 * Hk; h++) {
            const float *src = cp + (size_t)h * dk;
            float *d = dm + (size_t)h * dk;
            float nrm = silu_l2(xrow, src, dk, s->eps);
            if (nrm > s->eps) {
                float yd = dot(xrow, d, dk);
                for (int i = 0; i < dk; i++) drow[i] = (d[i] - xrow[i] * yd) / nrm;
            } else {
                for (int i = 0; i < dk; i++) drow[i] = d[i] / s->eps;
            }
            for (int i = 0; i < dk; i++) d[i] = drow[i] * dsiluf(src[i]);
        }
        for (int c = 2 * Hk * dk; c < cd; c++) dm[c] *= dsiluf(cp[c]);
    }
}

/* Conv backward of the task's channels, in place: dm_s[ch] = sum_i w[ch][i] dc_{s+K-1-i}[ch],
 * over indices < T (row s needs rows s..s+K-1 of its channel only: ascending in time). */
static void bwd_conv_task(void *arg, int task, int n_tasks) {
    const bwd_job *J = arg;
    const nl_gdn_weights *w = J->w;
    float *dmixed = J->dmixed;
    const int T = J->T, K = J->s->K, cd = nl_gdn_conv_dim(J->s);
    int c0, c1;
    share(cd, task, n_tasks, &c0, &c1);
    for (int t = 0; t < T; t++) {
        float *dm = dmixed + (size_t)t * cd;
        for (int ch = c0; ch < c1; ch++) {
            const float *wc = w->conv + (size_t)ch * K;
            float acc = 0.0f;
            for (int i = K - 1; i >= 0; i--) {
                int src = t + K - 1 - i;
                if (src >= T) continue;
                acc += wc[i] * dmixed[(size_t)src * cd + ch];
            }
            dm[ch] = acc;
        }
    }
}

int nl_gdn_backward(nl_pool *pool, const nl_gdn_shape *s, const nl_gdn_weights *w, const nl_gdn_cache *cache,
                    const float *dy, int T, float *dmixed, float *dz, float *db, float *da) {
    if (check_shape(s) || check_weights(w, 0)) return -1;
    if (!cache) return nl_err("gdn: NULL cache");
    if (!same_shape(s, &cache->shape)) return nl_err("gdn: cache was made for another shape");
    if (cache->T < 1 || T != cache->T)
        return nl_err("gdn: backward over %d tokens, but the cache holds a forward of %d", T, cache->T);
    if (!dy || !dmixed || !dz || !db || !da) return nl_err("gdn: NULL gradient pointer");
    const int cd = nl_gdn_conv_dim(s);
    int nh = n_tasks_for(pool, s->Hk), nr = n_tasks_for(pool, T), nc = n_tasks_for(pool, cd);
    int nmax = nh > nr ? nh : nr;
    float *scratch = nl_malloc(sizeof(float) * (size_t)bwd_work_floats(s) * (size_t)nmax);
    if (!scratch) return -1;
    memset(dmixed, 0, sizeof(float) * (size_t)T * cd);
    bwd_job J = {.s = s, .w = w, .cache = cache, .dy = dy, .dmixed = dmixed, .dz = dz, .db = db, .da = da,
                 .scratch = scratch, .T = T, .wide = wide_step(), .wide_b = wide_bwd()};
    run_tasks(pool, nh, bwd_heads_task, &J);
    run_tasks(pool, nr, bwd_rows_task, &J);
    run_tasks(pool, nc, bwd_conv_task, &J);
    free(scratch);
    return 0;
}

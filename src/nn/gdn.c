/* nn/gdn: the gated delta-net node (forward, streaming forward, training forward + backward).
 * Math: docs/formats.md §3 (GDN), docs/backward.md (gated delta-net).
 *
 * Layout choices:
 * - The recurrence runs one value head at a time over all tokens, so that head's state
 *   S[dk][dv] (64 KiB at dk = dv = 128) stays in cache; every inner loop runs over dv,
 *   contiguous.
 * - Backward runs per key head: chunks of 16 tokens last to first, each in the chunked (WY)
 *   form from its checkpoint (no per-token states): q̂/k̂ of the chunk and their Gram matrix
 *   once, then each value head of the key head in ascending order with its own carried dS
 *   (so the shared q̂/k̂ gradients are summed in a fixed order), then the L2/SiLU backward of
 *   the chunk's q/k rows.
 * - dmixed doubles as the buffer for d(conv output): the conv backward is done in place,
 *   ascending in time (row s of the result needs rows s..s+K-1 of the input only). */
#include "nn/gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/vecmath.h"
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

/* dst = silu(src) / max(||silu(src)||, eps) over n; returns the norm ||silu(src)||. (The
 * forward's; the backward recomputes q̂/k̂ with silu_l2_d, within an ulp or two of these.) */
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
/* step_c on four vectors of columns (64 with AVX-512, 32 with AVX2), p and o held in four
 * registers each: the same multiplies and adds in the same order as step_c (separate, no FMA),
 * so the same bits. One body for both: B is the vector width in bits (the intrinsics' _mmB_
 * prefix, the type __mB), L the floats in a vector. */
#define GDN_V(B, op) _mm##B##_##op
#define GDN_STEP4(name, isa, B, L)                                                                                   \
    __attribute__((target(isa))) static void name(float *S, const float *S_prev, size_t ld, const float *k,          \
                                                  const float *v, const float *q, float alpha, float beta,           \
                                                  float scale, int dk, float *restrict u, float *r_out,              \
                                                  float *restrict o) {                                               \
        const __m##B va = GDN_V(B, set1_ps)(alpha);                                                                  \
        __m##B p0 = GDN_V(B, setzero_ps)(), p1 = p0, p2 = p0, p3 = p0;                                               \
        for (int i = 0; i < dk; i++) {                                                                               \
            const float *sp = S_prev + (size_t)i * ld;                                                               \
            float *sd = S + (size_t)i * ld;                                                                          \
            const __m##B kk = GDN_V(B, set1_ps)(k[i]);                                                               \
            const __m##B x0 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp));                                          \
            const __m##B x1 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + L));                                      \
            const __m##B x2 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + 2 * L));                                  \
            const __m##B x3 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + 3 * L));                                  \
            GDN_V(B, storeu_ps)(sd, x0);                                                                             \
            GDN_V(B, storeu_ps)(sd + L, x1);                                                                         \
            GDN_V(B, storeu_ps)(sd + 2 * L, x2);                                                                     \
            GDN_V(B, storeu_ps)(sd + 3 * L, x3);                                                                     \
            p0 = GDN_V(B, add_ps)(p0, GDN_V(B, mul_ps)(kk, x0));                                                     \
            p1 = GDN_V(B, add_ps)(p1, GDN_V(B, mul_ps)(kk, x1));                                                     \
            p2 = GDN_V(B, add_ps)(p2, GDN_V(B, mul_ps)(kk, x2));                                                     \
            p3 = GDN_V(B, add_ps)(p3, GDN_V(B, mul_ps)(kk, x3));                                                     \
        }                                                                                                            \
        const __m##B vb = GDN_V(B, set1_ps)(beta);                                                                   \
        const __m##B r0 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v), p0);                                               \
        const __m##B r1 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + L), p1);                                           \
        const __m##B r2 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 2 * L), p2);                                       \
        const __m##B r3 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 3 * L), p3);                                       \
        if (r_out) {                                                                                                 \
            GDN_V(B, storeu_ps)(r_out, r0);                                                                          \
            GDN_V(B, storeu_ps)(r_out + L, r1);                                                                      \
            GDN_V(B, storeu_ps)(r_out + 2 * L, r2);                                                                  \
            GDN_V(B, storeu_ps)(r_out + 3 * L, r3);                                                                  \
        }                                                                                                            \
        const __m##B u0 = GDN_V(B, mul_ps)(vb, r0), u1 = GDN_V(B, mul_ps)(vb, r1);                                   \
        const __m##B u2 = GDN_V(B, mul_ps)(vb, r2), u3 = GDN_V(B, mul_ps)(vb, r3);                                   \
        GDN_V(B, storeu_ps)(u, u0);                                                                                  \
        GDN_V(B, storeu_ps)(u + L, u1);                                                                              \
        GDN_V(B, storeu_ps)(u + 2 * L, u2);                                                                          \
        GDN_V(B, storeu_ps)(u + 3 * L, u3);                                                                          \
        __m##B o0 = GDN_V(B, setzero_ps)(), o1 = o0, o2 = o0, o3 = o0;                                               \
        for (int i = 0; i < dk; i++) {                                                                               \
            float *sd = S + (size_t)i * ld;                                                                          \
            const __m##B kk = GDN_V(B, set1_ps)(k[i]), qq = GDN_V(B, set1_ps)(q[i]);                                 \
            const __m##B x0 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd), GDN_V(B, mul_ps)(kk, u0));                    \
            const __m##B x1 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + L), GDN_V(B, mul_ps)(kk, u1));                \
            const __m##B x2 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + 2 * L), GDN_V(B, mul_ps)(kk, u2));            \
            const __m##B x3 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + 3 * L), GDN_V(B, mul_ps)(kk, u3));            \
            GDN_V(B, storeu_ps)(sd, x0);                                                                             \
            GDN_V(B, storeu_ps)(sd + L, x1);                                                                         \
            GDN_V(B, storeu_ps)(sd + 2 * L, x2);                                                                     \
            GDN_V(B, storeu_ps)(sd + 3 * L, x3);                                                                     \
            o0 = GDN_V(B, add_ps)(o0, GDN_V(B, mul_ps)(qq, x0));                                                     \
            o1 = GDN_V(B, add_ps)(o1, GDN_V(B, mul_ps)(qq, x1));                                                     \
            o2 = GDN_V(B, add_ps)(o2, GDN_V(B, mul_ps)(qq, x2));                                                     \
            o3 = GDN_V(B, add_ps)(o3, GDN_V(B, mul_ps)(qq, x3));                                                     \
        }                                                                                                            \
        const __m##B vs = GDN_V(B, set1_ps)(scale);                                                                  \
        GDN_V(B, storeu_ps)(o, GDN_V(B, mul_ps)(o0, vs));                                                            \
        GDN_V(B, storeu_ps)(o + L, GDN_V(B, mul_ps)(o1, vs));                                                        \
        GDN_V(B, storeu_ps)(o + 2 * L, GDN_V(B, mul_ps)(o2, vs));                                                    \
        GDN_V(B, storeu_ps)(o + 3 * L, GDN_V(B, mul_ps)(o3, vs));                                                    \
    }
GDN_STEP4(step64_avx512, "avx512f", 512, 16)
/* (AVX2 has 16 registers: four vectors of p/o and of u leave room; eight would not) */
GDN_STEP4(step32_avx2, "avx2", 256, 8)
#endif

/* The SIMD level the kernels run at: GDN_PORTABLE, GDN_L_AVX2 (x86-64 with AVX2, no FMA used) or
 * GDN_L_AVX512 (AVX-512 F); every level gives the same bits. nl_gdn_set_simd caps it (tests
 * compare the levels): 0 portable, 2 at most AVX2, anything else the best the CPU has. */
enum { GDN_PORTABLE = 0, GDN_L_AVX2 = 2, GDN_L_AVX512 = 3 };
static int simd_cap = GDN_L_AVX512;
void nl_gdn_set_simd(int level) {
    const int cap = level == 0 ? GDN_PORTABLE : level == 2 ? GDN_L_AVX2 : GDN_L_AVX512;
    __atomic_store_n(&simd_cap, cap, __ATOMIC_RELAXED);
}

static int simd_level(void) {
#ifdef GDN_X86
    const int cap = __atomic_load_n(&simd_cap, __ATOMIC_RELAXED);
    if (cap >= GDN_L_AVX512 && nl_cpu_has(NL_CPU_AVX512)) return GDN_L_AVX512;
    if (cap >= GDN_L_AVX2 && nl_cpu_has(NL_CPU_AVX2)) return GDN_L_AVX2;
#endif
    return GDN_PORTABLE;
}

int nl_gdn_simd(void) { return simd_level(); }

/* step_c over n columns, in blocks of 64 on the AVX-512 step or of 32 on the AVX2 one (the
 * rest portable). */
static void gdn_step(int lv, float *S, const float *S_prev, size_t ld, const float *k, const float *v,
                     const float *q, float alpha, float beta, float scale, int dk, int n,
                     float *restrict p, float *restrict u, float *r_out, float *restrict o) {
    int c0 = 0;
#ifdef GDN_X86
    if (lv == GDN_L_AVX512)
        for (; c0 + 64 <= n; c0 += 64)
            step64_avx512(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, u + c0,
                          r_out ? r_out + c0 : NULL, o + c0);
    if (lv == GDN_L_AVX2)
        for (; c0 + 32 <= n; c0 += 32)
            step32_avx2(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, u + c0,
                        r_out ? r_out + c0 : NULL, o + c0);
#else
    (void)lv;
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
    int T, lv;
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
                gdn_step(J->lv, S + c0, S + c0, (size_t)dv, row + Hk * dk + (size_t)kh * dk,
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
                 .z = z, .beta = beta, .g = g, .T = T, .lv = simd_level()};
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

static uint64_t bwd_work_floats(const nl_gdn_shape *s);

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

uint64_t nl_gdn_backward_thread_bytes(const nl_gdn_shape *s) {
    if (check_shape(s)) return 0;
    return 4 * bwd_work_floats(s);
}

uint64_t nl_gdn_backward_work_bytes(const nl_gdn_shape *s) {
    if (check_shape(s)) return 0;
    return 4 * (bwd_work_floats(s) + (uint64_t)s->K * nl_gdn_conv_dim(s));
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

/* ---- the chunked (WY) backward ----
 *
 * Within a chunk of n <= 16 tokens (i = 0..n-1) starting from the state S0 (the checkpoint),
 * with E[i][m] = α_{m+1}···α_i (E[i][i] = 1), γ_i = α_0···α_i and d_m = E[n-1][m]:
 *   U (I + diag(β) L) form:  U_i = β_i (V_i − γ_i (K S0)_i − Σ_{m<i} L_im U_m),  L_im = (k̂_i·k̂_m) E_im
 *   O_i = scale (γ_i (Q S0)_i + Σ_{m<=i} (q̂_i·k̂_m) E_im U_m)
 *   S_end = γ_{n-1} S0 + Σ_m d_m k̂_m U_mᵀ
 * so the state-sized work of a chunk is a few small matrix products (rows of 2n by dk×dv);
 * their backward is derived in docs/backward.md. The cumulative decays are running products
 * (never divided by), so tiny α underflow to 0 instead of producing inf or NaN.
 *
 * mm(): out[i][j] (+)= Σ_l A[i][l] B[l][j] with each element's sum in ascending l, one
 * multiply and one add per term (no FMA), starting from 0 or from out. The AVX-512 kernel
 * runs 4 rows × 64 columns at a time, the AVX2 one 4 rows × 16 columns, with the same
 * operations per element, so both give the same bits as the portable loop. */

/* Runs the statement for c = 0..n-1 as 8-wide blocks plus a tail, so that gcc -O2 vectorises it
 * (element-wise only: any vector width gives the same bits; the arrays must not overlap). */
#if defined(__GNUC__) && !defined(__clang__)
#define GDN_IVDEP _Pragma("GCC ivdep")
#else
#define GDN_IVDEP
#endif
#define GDN_EACH(c, n, ...)                                        \
    do {                                                           \
        int c##_0 = 0;                                             \
        for (; c##_0 + 8 <= (n); c##_0 += 8)                       \
            GDN_IVDEP for (int c##_l = 0; c##_l < 8; c##_l++) {    \
                const int c = c##_0 + c##_l;                       \
                __VA_ARGS__;                                       \
            }                                                      \
        for (int c = c##_0; c < (n); c++) {                        \
            __VA_ARGS__;                                           \
        }                                                          \
    } while (0)

/* out[j] += a * x[j] over n (8-wide blocks + tail). */
static inline void row_axpy(float *restrict out, float a, const float *restrict x, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) out[c + l] += a * x[c + l];
    for (; c < n; c++) out[c] += a * x[c];
}

static void mm_c(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb,
                 float *Cm, size_t ldc, int acc) {
    for (int i = 0; i < M; i++) {
        float *c = Cm + (size_t)i * ldc;
        if (!acc)
            for (int j = 0; j < N; j++) c[j] = 0.0f;
        for (int l = 0; l < Kd; l++) row_axpy(c, A[(size_t)i * ars + (size_t)l * acs], B + (size_t)l * ldb, N);
    }
}

#ifdef GDN_X86
#define GDN_AVX512 __attribute__((target("avx512f")))
/* Register blocks: 4 or 1 rows × 4 or 1 vectors of 16 columns (masks m[v] for the columns);
 * the accumulators are named variables so that they stay in registers. */
#define MM_LD(r, v) (acc ? _mm512_maskz_loadu_ps(m##v, Cm + (size_t)(r) * ldc + 16 * (v)) : _mm512_setzero_ps())
#define MM_ST(r, v, x) _mm512_mask_storeu_ps(Cm + (size_t)(r) * ldc + 16 * (v), m##v, x)
#define MM_UP(x, a, b) x = _mm512_add_ps(x, _mm512_mul_ps(a, b))
#define MM_ARGS                                                                                               \
    int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm, size_t ldc, int acc, \
        const __mmask16 *mk

GDN_AVX512 static void mm_4x64(MM_ARGS) {
    const __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];
    __m512 c00 = MM_LD(0, 0), c01 = MM_LD(0, 1), c02 = MM_LD(0, 2), c03 = MM_LD(0, 3);
    __m512 c10 = MM_LD(1, 0), c11 = MM_LD(1, 1), c12 = MM_LD(1, 2), c13 = MM_LD(1, 3);
    __m512 c20 = MM_LD(2, 0), c21 = MM_LD(2, 1), c22 = MM_LD(2, 2), c23 = MM_LD(2, 3);
    __m512 c30 = MM_LD(3, 0), c31 = MM_LD(3, 1), c32 = MM_LD(3, 2), c33 = MM_LD(3, 3);
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb, *a = A + (size_t)l * acs;
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16);
        const __m512 b2 = _mm512_maskz_loadu_ps(m2, b + 32), b3 = _mm512_maskz_loadu_ps(m3, b + 48);
        __m512 x = _mm512_set1_ps(a[0]);
        MM_UP(c00, x, b0), MM_UP(c01, x, b1), MM_UP(c02, x, b2), MM_UP(c03, x, b3);
        x = _mm512_set1_ps(a[ars]);
        MM_UP(c10, x, b0), MM_UP(c11, x, b1), MM_UP(c12, x, b2), MM_UP(c13, x, b3);
        x = _mm512_set1_ps(a[2 * ars]);
        MM_UP(c20, x, b0), MM_UP(c21, x, b1), MM_UP(c22, x, b2), MM_UP(c23, x, b3);
        x = _mm512_set1_ps(a[3 * ars]);
        MM_UP(c30, x, b0), MM_UP(c31, x, b1), MM_UP(c32, x, b2), MM_UP(c33, x, b3);
    }
    MM_ST(0, 0, c00), MM_ST(0, 1, c01), MM_ST(0, 2, c02), MM_ST(0, 3, c03);
    MM_ST(1, 0, c10), MM_ST(1, 1, c11), MM_ST(1, 2, c12), MM_ST(1, 3, c13);
    MM_ST(2, 0, c20), MM_ST(2, 1, c21), MM_ST(2, 2, c22), MM_ST(2, 3, c23);
    MM_ST(3, 0, c30), MM_ST(3, 1, c31), MM_ST(3, 2, c32), MM_ST(3, 3, c33);
}

GDN_AVX512 static void mm_1x64(MM_ARGS) {
    const __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];
    __m512 c00 = MM_LD(0, 0), c01 = MM_LD(0, 1), c02 = MM_LD(0, 2), c03 = MM_LD(0, 3);
    (void)ars;
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb;
        const __m512 x = _mm512_set1_ps(A[(size_t)l * acs]);
        MM_UP(c00, x, _mm512_maskz_loadu_ps(m0, b)), MM_UP(c01, x, _mm512_maskz_loadu_ps(m1, b + 16));
        MM_UP(c02, x, _mm512_maskz_loadu_ps(m2, b + 32)), MM_UP(c03, x, _mm512_maskz_loadu_ps(m3, b + 48));
    }
    MM_ST(0, 0, c00), MM_ST(0, 1, c01), MM_ST(0, 2, c02), MM_ST(0, 3, c03);
}

GDN_AVX512 static void mm_4x16(MM_ARGS) {
    const __mmask16 m0 = mk[0];
    __m512 c00 = MM_LD(0, 0), c10 = MM_LD(1, 0), c20 = MM_LD(2, 0), c30 = MM_LD(3, 0);
    for (int l = 0; l < Kd; l++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, B + (size_t)l * ldb);
        const float *a = A + (size_t)l * acs;
        MM_UP(c00, _mm512_set1_ps(a[0]), b0), MM_UP(c10, _mm512_set1_ps(a[ars]), b0);
        MM_UP(c20, _mm512_set1_ps(a[2 * ars]), b0), MM_UP(c30, _mm512_set1_ps(a[3 * ars]), b0);
    }
    MM_ST(0, 0, c00), MM_ST(1, 0, c10), MM_ST(2, 0, c20), MM_ST(3, 0, c30);
}

GDN_AVX512 static void mm_1x16(MM_ARGS) {
    const __mmask16 m0 = mk[0];
    __m512 c00 = MM_LD(0, 0);
    (void)ars;
    for (int l = 0; l < Kd; l++)
        MM_UP(c00, _mm512_set1_ps(A[(size_t)l * acs]), _mm512_maskz_loadu_ps(m0, B + (size_t)l * ldb));
    MM_ST(0, 0, c00);
}

static __mmask16 cols_mask(int w) { return w >= 16 ? (__mmask16)0xFFFF : w > 0 ? (__mmask16)((1u << w) - 1) : 0; }

GDN_AVX512 static void mm_avx512(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B,
                                  size_t ldb, float *Cm, size_t ldc, int acc) {
    for (int j0 = 0; j0 < N;) {
        int w = N - j0;
        __mmask16 m[4];
        if (w > 16) {
            if (w > 64) w = 64;
            for (int v = 0; v < 4; v++) m[v] = cols_mask(w - 16 * v);
        } else {
            m[0] = cols_mask(w);
        }
        int i = 0;
        for (; i + 4 <= M; i += 4)
            (w > 16 ? mm_4x64 : mm_4x16)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0,
                                         ldc, acc, m);
        for (; i < M; i++)
            (w > 16 ? mm_1x64 : mm_1x16)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0,
                                         ldc, acc, m);
        j0 += w;
    }
}
/* AVX2 (no FMA): register blocks of 4 or 1 rows × 16 or 8 columns, unmasked; the last < 8
 * columns go to mm_c (every element is summed on its own, so any split gives the same bits). */
#define GDN_AVX2 __attribute__((target("avx2")))
#define M2_LD(r, v) (acc ? _mm256_loadu_ps(Cm + (size_t)(r) * ldc + 8 * (v)) : _mm256_setzero_ps())
#define M2_ST(r, v, x) _mm256_storeu_ps(Cm + (size_t)(r) * ldc + 8 * (v), x)
#define M2_UP(x, a, b) x = _mm256_add_ps(x, _mm256_mul_ps(a, b))
#define M2_ARGS \
    int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm, size_t ldc, int acc

GDN_AVX2 static void mm2_4x16(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0), c01 = M2_LD(0, 1), c10 = M2_LD(1, 0), c11 = M2_LD(1, 1);
    __m256 c20 = M2_LD(2, 0), c21 = M2_LD(2, 1), c30 = M2_LD(3, 0), c31 = M2_LD(3, 1);
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb, *a = A + (size_t)l * acs;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        __m256 x = _mm256_set1_ps(a[0]);
        M2_UP(c00, x, b0), M2_UP(c01, x, b1);
        x = _mm256_set1_ps(a[ars]);
        M2_UP(c10, x, b0), M2_UP(c11, x, b1);
        x = _mm256_set1_ps(a[2 * ars]);
        M2_UP(c20, x, b0), M2_UP(c21, x, b1);
        x = _mm256_set1_ps(a[3 * ars]);
        M2_UP(c30, x, b0), M2_UP(c31, x, b1);
    }
    M2_ST(0, 0, c00), M2_ST(0, 1, c01), M2_ST(1, 0, c10), M2_ST(1, 1, c11);
    M2_ST(2, 0, c20), M2_ST(2, 1, c21), M2_ST(3, 0, c30), M2_ST(3, 1, c31);
}

GDN_AVX2 static void mm2_1x16(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0), c01 = M2_LD(0, 1);
    (void)ars;
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb;
        const __m256 x = _mm256_set1_ps(A[(size_t)l * acs]);
        M2_UP(c00, x, _mm256_loadu_ps(b)), M2_UP(c01, x, _mm256_loadu_ps(b + 8));
    }
    M2_ST(0, 0, c00), M2_ST(0, 1, c01);
}

GDN_AVX2 static void mm2_4x8(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0), c10 = M2_LD(1, 0), c20 = M2_LD(2, 0), c30 = M2_LD(3, 0);
    for (int l = 0; l < Kd; l++) {
        const __m256 b0 = _mm256_loadu_ps(B + (size_t)l * ldb);
        const float *a = A + (size_t)l * acs;
        M2_UP(c00, _mm256_set1_ps(a[0]), b0), M2_UP(c10, _mm256_set1_ps(a[ars]), b0);
        M2_UP(c20, _mm256_set1_ps(a[2 * ars]), b0), M2_UP(c30, _mm256_set1_ps(a[3 * ars]), b0);
    }
    M2_ST(0, 0, c00), M2_ST(1, 0, c10), M2_ST(2, 0, c20), M2_ST(3, 0, c30);
}

GDN_AVX2 static void mm2_1x8(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0);
    (void)ars;
    for (int l = 0; l < Kd; l++)
        M2_UP(c00, _mm256_set1_ps(A[(size_t)l * acs]), _mm256_loadu_ps(B + (size_t)l * ldb));
    M2_ST(0, 0, c00);
}

GDN_AVX2 static void mm_avx2(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B,
                             size_t ldb, float *Cm, size_t ldc, int acc) {
    int j0 = 0;
    while (j0 + 8 <= N) {
        const int w = N - j0 >= 16 ? 16 : 8;
        int i = 0;
        for (; i + 4 <= M; i += 4)
            (w == 16 ? mm2_4x16 : mm2_4x8)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0,
                                           ldc, acc);
        for (; i < M; i++)
            (w == 16 ? mm2_1x16 : mm2_1x8)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0,
                                           ldc, acc);
        j0 += w;
    }
    if (j0 < N) mm_c(M, N - j0, Kd, A, ars, acs, B + j0, ldb, Cm + j0, ldc, acc);
}
#endif

static void mm(int lv, int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb,
               float *Cm, size_t ldc, int acc) {
#ifdef GDN_X86
    if (lv == GDN_L_AVX512) {
        mm_avx512(M, N, Kd, A, ars, acs, B, ldb, Cm, ldc, acc);
        return;
    }
    if (lv == GDN_L_AVX2) {
        mm_avx2(M, N, Kd, A, ars, acs, B, ldb, Cm, ldc, acc);
        return;
    }
#else
    (void)lv;
#endif
    mm_c(M, N, Kd, A, ars, acs, B, ldb, Cm, ldc, acc);
}

/* dst[c][r] = src[r][c] for a rows × cols src (row strides lds, ldd); exact, so the AVX form
 * (8×8 blocks in registers, at the AVX2 and AVX-512 levels) gives the same bits as the
 * portable loop. */
static void transpose_c(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int r0, int r1,
                        int c0, int c1) {
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

#ifdef GDN_X86
__attribute__((target("avx2"))) static void transpose_avx(float *restrict dst, size_t ldd,
                                                              const float *restrict src, size_t lds, int rows,
                                                              int cols) {
    const int R8 = rows & ~7, C8 = cols & ~7;
    for (int r = 0; r < R8; r += 8)
        for (int c = 0; c < C8; c += 8) {
            const float *p = src + (size_t)r * lds + c;
            __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + lds), a2 = _mm256_loadu_ps(p + 2 * lds);
            __m256 a3 = _mm256_loadu_ps(p + 3 * lds), a4 = _mm256_loadu_ps(p + 4 * lds);
            __m256 a5 = _mm256_loadu_ps(p + 5 * lds), a6 = _mm256_loadu_ps(p + 6 * lds);
            __m256 a7 = _mm256_loadu_ps(p + 7 * lds);
            __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
            __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
            __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
            __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *q = dst + (size_t)c * ldd + r;
            _mm256_storeu_ps(q, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(q + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(q + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(q + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(q + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(q + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(q + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(q + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    transpose_c(dst, ldd, src, lds, 0, R8, C8, cols);
    transpose_c(dst, ldd, src, lds, R8, rows, 0, cols);
}
#endif

static void transpose(int lv, float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int rows,
                      int cols) {
#ifdef GDN_X86
    if (lv >= GDN_L_AVX2) {
        transpose_avx(dst, ldd, src, lds, rows, cols);
        return;
    }
#else
    (void)lv;
#endif
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16)
            transpose_c(dst, ldd, src, lds, r0, r0 + 16 < rows ? r0 + 16 : rows, c0, c0 + 16 < cols ? c0 + 16 : cols);
}

/* y = silu(x), d = silu'(x) over n from one sigmoid, cpu/vecmath.h's nl_fsigmoid (its
 * polynomial exp): portable in 8-lane blocks as nn/mlp.c's SwiGLU; with AVX-512 (AVX2) the
 * same operations of nl_fexp 16 (8) lanes at a time (no FMA, its integer exponent and masks),
 * so the same bits. The SIMD kernels do the whole vectors of n and return how many they did;
 * the portable loop does the rest. One body for both widths (B, L as GDN_STEP4's). */
#ifdef GDN_X86
#define GDN_I(B, op) _mm##B##_##op##_si##B /* the integer bitwise ops: _mm512_and_si512 */
#define GDN_SILU(name, isa, B, L)                                                                                    \
    __attribute__((target(isa))) static int name(float *y, float *d, const float *x, int n) {                        \
        const __m##B one = GDN_V(B, set1_ps)(1.0f), big = GDN_V(B, set1_ps)(12582912.0f);                          \
        const __m##B##i sign = GDN_V(B, set1_epi32)((int)0x80000000u), i127 = GDN_V(B, set1_epi32)(127);           \
        const __m##B##i i1 = GDN_V(B, set1_epi32)(1), i255 = GDN_V(B, set1_epi32)(255);                            \
        int i = 0;                                                                                                   \
        for (; i + L <= n; i += L) {                                                                                 \
            const __m##B xv = GDN_V(B, loadu_ps)(x + i);                                                             \
            const __m##B nx = GDN_V(B, castsi##B##_ps)(GDN_I(B, xor)(GDN_V(B, castps_si##B)(xv), sign)); /* -x */    \
            const __m##B t = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(nx, GDN_V(B, set1_ps)(1.44269504088896341f)), big);  \
            const __m##B nn = GDN_V(B, sub_ps)(t, big);                                                              \
            __m##B r = GDN_V(B, sub_ps)(nx, GDN_V(B, mul_ps)(nn, GDN_V(B, set1_ps)(0.693145751953125f)));            \
            r = GDN_V(B, sub_ps)(r, GDN_V(B, mul_ps)(nn, GDN_V(B, set1_ps)(1.42860682030941723e-06f)));              \
            __m##B p = GDN_V(B, set1_ps)(1.98756915e-4f);                                                            \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(1.39819337e-3f));                         \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(8.33345205e-3f));                         \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(4.16657962e-2f));                         \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(1.66666657e-1f));                         \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(5.0e-1f));                                \
            p = GDN_V(B, add_ps)(GDN_V(B, add_ps)(GDN_V(B, mul_ps)(GDN_V(B, mul_ps)(p, r), r), r), one);             \
            const __m##B##i tb = GDN_V(B, castps_si##B)(t);                                                          \
            const __m##B##i ea = GDN_I(B, and)(tb, GDN_V(B, set1_epi32)(0x7FFFFFFF));                                \
            const __m##B##i e = GDN_V(B, add_epi32)(GDN_V(B, sub_epi32)(ea, GDN_V(B, set1_epi32)(0x4B400000)), i127); \
            const __m##B##i neg = GDN_V(B, srai_epi32)(tb, 31);                                                      \
            const __m##B##i lo = GDN_I(B, andnot)(                                                                   \
                neg,                                                                                                 \
                GDN_I(B, andnot)(GDN_V(B, srai_epi32)(GDN_V(B, sub_epi32)(e, i1), 31), GDN_V(B, set1_epi32)(-1)));   \
            const __m##B##i hi = GDN_I(B, or)(GDN_V(B, srai_epi32)(GDN_V(B, sub_epi32)(e, i255), 31), neg);          \
            const __m##B##i eb = GDN_V(B, slli_epi32)(GDN_I(B, and)(GDN_I(B, and)(e, lo), hi), 23);                  \
            const __m##B##i yb = GDN_V(B, castps_si##B)(GDN_V(B, mul_ps)(p, GDN_V(B, castsi##B##_ps)(eb)));         \
            const __m##B##i ex = GDN_I(B, or)(GDN_I(B, and)(GDN_I(B, and)(yb, lo), hi),                              \
                                              GDN_I(B, andnot)(hi, GDN_V(B, set1_epi32)(0x7F800000)));               \
            const __m##B sg = GDN_V(B, div_ps)(one, GDN_V(B, add_ps)(one, GDN_V(B, castsi##B##_ps)(ex)));            \
            GDN_V(B, storeu_ps)(y + i, GDN_V(B, mul_ps)(xv, sg));                                                    \
            GDN_V(B, storeu_ps)(                                                                                     \
                d + i, GDN_V(B, mul_ps)(sg, GDN_V(B, add_ps)(one, GDN_V(B, mul_ps)(xv, GDN_V(B, sub_ps)(one, sg))))); \
        }                                                                                                            \
        return i;                                                                                                    \
    }
GDN_SILU(silu_d_avx512, "avx512f", 512, 16)
GDN_SILU(silu_d_avx2, "avx2", 256, 8)
#endif

static void silu_d_row(int lv, float *restrict y, float *restrict d, const float *restrict x, int n) {
    int i0 = 0;
#ifdef GDN_X86
    if (lv == GDN_L_AVX512) i0 = silu_d_avx512(y, d, x, n);
    if (lv == GDN_L_AVX2) i0 = silu_d_avx2(y, d, x, n);
#else
    (void)lv;
#endif
    for (; i0 < n; i0 += NL_LANES) {
        const int w = n - i0 < NL_LANES ? n - i0 : NL_LANES;
        float xv[NL_LANES] = {0}, ry[NL_LANES], rd[NL_LANES];
        for (int l = 0; l < w; l++) xv[l] = x[i0 + l];
        for (int l = 0; l < NL_LANES; l++) {
            const float sg = nl_fsigmoid(xv[l]);
            ry[l] = xv[l] * sg;
            rd[l] = sg * (1.0f + xv[l] * (1.0f - sg));
        }
        for (int l = 0; l < w; l++) y[i0 + l] = ry[l], d[i0 + l] = rd[l];
    }
}

/* q̂ or k̂ of one head: dst = silu(src) / max(||silu(src)||, eps), ds = silu'(src); returns
 * ||silu(src)||. (The backward's own recomputation: within an ulp or two of silu_l2.) */
static float silu_l2_d(int lv, float *restrict dst, float *restrict ds, const float *restrict src, int n,
                       float eps) {
    silu_d_row(lv, dst, ds, src, n);
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)dst[i] * dst[i];
    float nrm = (float)sqrt(ss);
    float inv = 1.0f / (nrm > eps ? nrm : eps);
    GDN_EACH(i, n, dst[i] *= inv);
    return nrm;
}

/* The gated RMSNorm's backward: given o (pre-norm), z and dy, writes dz and d_o. */
static void gated_norm_backward(int lv, float *restrict d_o, float *restrict dz, const float *restrict o,
                                const float *restrict z, const float *restrict nw, const float *restrict dy, int dv,
                                float eps) {
    double ss = 0.0;
    for (int c = 0; c < dv; c++) ss += (double)o[c] * o[c];
    const float rstd = (float)(1.0 / sqrt(ss / dv + eps));
    silu_d_row(lv, d_o, dz, z, dv); /* silu(z), silu'(z) */
    GDN_EACH(c, dv, dz[c] = dy[c] * o[c] * rstd * nw[c] * dz[c]; d_o[c] = dy[c] * nw[c] * d_o[c]);
    double gdot = 0.0;
    for (int c = 0; c < dv; c++) gdot += (double)d_o[c] * o[c];
    float f = (float)(gdot * rstd * rstd / dv);
    GDN_EACH(c, dv, d_o[c] = rstd * (d_o[c] - o[c] * f));
}

/* Per-thread backward scratch (floats): G = Hv/Hk carried gradients dS, the transposed
 * checkpoint and dS, and the chunk's rows. The C×C matrices live on the stack. */
typedef struct {
    float *dS, *S0T, *dST;      /* [G][dk][dv], [dv][dk], [dv][dk] */
    float *QK, *dQK, *dsQK, *KT, *Z; /* [2C][dk] q̂ then k̂ rows, their gradient, silu'; [dk][C]; [C][dk] */
    float *PW, *dPW, *DOX;      /* [2C][dv]: Q S0 then K S0; their gradients; dO' then dX */
    float *V, *dsV, *R, *U, *UT, *dU, *O; /* [C][dv] (UT [dv][C]) */
} bwd_buf;

static uint64_t bwd_work_floats(const nl_gdn_shape *s) {
    uint64_t hs = (uint64_t)s->dk * s->dv, G = (uint64_t)(s->Hv / s->Hk);
    return (G + 2) * hs + 8 * CH * (uint64_t)s->dk + 13 * CH * (uint64_t)s->dv;
}

static bwd_buf bwd_carve(const nl_gdn_shape *s, float *p) {
    const size_t hs = (size_t)s->dk * s->dv, dk = (size_t)s->dk, dv = (size_t)s->dv;
    bwd_buf b;
    b.dS = p, p += (size_t)(s->Hv / s->Hk) * hs;
    b.S0T = p, p += hs;
    b.dST = p, p += hs;
    b.QK = p, p += 2 * CH * dk;
    b.dQK = p, p += 2 * CH * dk;
    b.dsQK = p, p += 2 * CH * dk;
    b.KT = p, p += CH * dk;
    b.Z = p, p += CH * dk;
    b.PW = p, p += 2 * CH * dv;
    b.dPW = p, p += 2 * CH * dv;
    b.DOX = p, p += 2 * CH * dv;
    b.V = p, p += CH * dv;
    b.dsV = p, p += CH * dv;
    b.R = p, p += CH * dv;
    b.U = p, p += CH * dv;
    b.UT = p, p += CH * dv;
    b.dU = p, p += CH * dv;
    b.O = p;
    return b;
}

typedef struct {
    const nl_gdn_shape *s;
    const nl_gdn_weights *w;
    const nl_gdn_cache *cache;
    const float *dy;
    float *dmixed, *dz, *db, *da, *scratch, *wt;
    int T, lv;
} bwd_job;

/* A chunk's per-token decays and gates and its decayed 16×16 matrices (value head j); entries
 * outside the stated triangles are 0 (the products below run over full n×n blocks). */
typedef struct {
    float al[CH], be[CH], gam[CH];       /* α_i, β_i, γ_i = α_0···α_i */
    float E[CH][CH], Lm[CH][CH], Mq[CH][CH]; /* E_im = α_{m+1}···α_i; L_im (m < i); Mq_im (m <= i) */
    float X[CH][CH];                     /* (I + diag(β) L)⁻¹, unit lower triangular */
} chunk_m;

/* From g, β ([T][Hv]) and the chunk's Gram matrix [Q; K] Kᵀ ([2n][C]: q̂_i·k̂_m, then k̂_i·k̂_m). */
static void chunk_mats(chunk_m *M, const float *g, const float *beta, int Hv, int j, int t0, int n,
                       const float *Gram) {
    for (int i = 0; i < n; i++) {
        size_t gi = (size_t)(t0 + i) * Hv + j;
        M->al[i] = expf(g[gi]);
        M->be[i] = beta[gi];
        M->gam[i] = (i ? M->gam[i - 1] : 1.0f) * M->al[i];
        for (int m = 0; m < n; m++) {
            M->E[i][m] = m < i ? M->E[i - 1][m] * M->al[i] : m == i ? 1.0f : 0.0f;
            M->Mq[i][m] = m <= i ? Gram[(size_t)i * CH + m] * M->E[i][m] : 0.0f;
            M->Lm[i][m] = m < i ? Gram[(size_t)(n + i) * CH + m] * M->E[i][m] : 0.0f;
        }
    }
    /* X = (I + diag(β) L)⁻¹ row by row: X_i = e_i − β_i Σ_{k<i} L_ik X_k */
    for (int i = 0; i < n; i++) {
        for (int m = 0; m < n; m++) M->X[i][m] = m == i ? 1.0f : 0.0f;
        for (int k = 0; k < i; k++) {
            const float a = M->be[i] * M->Lm[i][k];
            for (int m = 0; m <= k; m++) M->X[i][m] -= a * M->X[k][m];
        }
    }
}

/* R_i = V_i − γ_i W_i; U = X diag(β) R (the delta rule's u of the chunk); O = scale (diag(γ) P +
 * Mq U) into O (row stride ldo). P, W: [n][dv] (Q S0, K S0), P NULL for a zero S0. R, U:
 * [n][dv]. */
static void chunk_uo(int lv, const chunk_m *M, int n, int dv, float scale, const float *V, size_t ldv,
                     const float *P, const float *W, float *R, float *U, float *O, size_t ldo) {
    float XB[CH][CH];
    for (int i = 0; i < n; i++) {
        float *r = R + (size_t)i * dv, *o = O + (size_t)i * ldo;
        const float *v = V + (size_t)i * ldv, gi = M->gam[i];
        if (P) {
            GDN_EACH(c, dv, r[c] = v[c] - gi * W[(size_t)i * dv + c]);
            GDN_EACH(c, dv, o[c] = gi * P[(size_t)i * dv + c]);
        } else {
            memcpy(r, v, sizeof(float) * (size_t)dv);
            memset(o, 0, sizeof(float) * (size_t)dv);
        }
        for (int m = 0; m < n; m++) XB[i][m] = M->X[i][m] * M->be[m];
    }
    mm(lv, n, dv, n, &XB[0][0], CH, 1, R, (size_t)dv, U, (size_t)dv, 0);
    mm(lv, n, dv, n, &M->Mq[0][0], CH, 1, U, (size_t)dv, O, ldo, 1);
    for (int i = 0; i < n; i++) {
        float *o = O + (size_t)i * ldo;
        GDN_EACH(c, dv, o[c] *= scale);
    }
}

/* One value head j over one chunk [t0, t0+n): recompute U and O from the checkpoint S0 (NULL:
 * zero), then the gradients. Reads b->QK (q̂ rows 0..n-1, k̂ rows n..2n-1), b->KT and the
 * chunk's Gram matrix QKt = [Q; K] Kᵀ ([2n][C]); adds the chunk's d(q̂, k̂) into b->dQK; writes
 * dmixed's v slice (through SiLU'), dz, db, da of the chunk; dS (the gradient of the chunk's
 * end state; `live` 0 when it is zero) becomes the gradient of S0 (when S0 != NULL). */
static void chunk_bwd(const bwd_job *J, const bwd_buf *b, int j, int t0, int n, const float *S0, float *dS, int live,
                      const float *Gram) {
    const nl_gdn_shape *s = J->s;
    const nl_gdn_cache *cache = J->cache;
    const int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv, lv = J->lv;
    const int cd = nl_gdn_conv_dim(s);
    const size_t vd = (size_t)Hv * dv, voff = 2 * (size_t)Hk * dk + (size_t)j * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    const float *Kc = b->QK + (size_t)n * dk;
    float *P = b->PW, *W = b->PW + (size_t)n * dv, *dP = b->dPW, *dW = b->dPW + (size_t)n * dv;
    float *DO = b->DOX, *dX = b->DOX + (size_t)n * dv;
    float dgam[CH], dbe[CH], xd[CH], DD[2 * CH][2 * CH], DXU[2 * CH][CH];
    double dG[CH];
    chunk_m M;
    chunk_mats(&M, cache->g, cache->beta, Hv, j, t0, n, Gram);
    const float *be = M.be, *gam = M.gam;
    const float(*E)[CH] = M.E, (*Lm)[CH] = M.Lm, (*Mq)[CH] = M.Mq;
    for (int i = 0; i < n; i++)
        silu_d_row(lv, b->V + (size_t)i * dv, b->dsV + (size_t)i * dv, cache->cpre + (size_t)(t0 + i) * cd + voff, dv);
    /* forward: P = Q S0, W = K S0; U, O; then dO' = scale dO through the gated norm */
    if (S0) mm(lv, 2 * n, dv, dk, b->QK, (size_t)dk, 1, S0, (size_t)dv, b->PW, (size_t)dv, 0);
    chunk_uo(lv, &M, n, dv, scale, b->V, (size_t)dv, S0 ? P : NULL, W, b->R, b->U, b->O, (size_t)dv);
    for (int i = 0; i < n; i++) {
        const size_t t = (size_t)t0 + i;
        float *dov = DO + (size_t)i * dv;
        gated_norm_backward(lv, dov, J->dz + t * vd + (size_t)j * dv, b->O + (size_t)i * dv,
                            cache->z + t * vd + (size_t)j * dv, J->w->norm, J->dy + t * vd + (size_t)j * dv, dv,
                            s->eps);
        GDN_EACH(c, dv, dov[c] *= scale);
        dgam[i] = S0 ? dot(P + (size_t)i * dv, dov, dv) : 0.0f;
        GDN_EACH(c, dv, dP[(size_t)i * dv + c] = gam[i] * dov[c]);
    }
    /* dU = diag(d) K dS + Mqkᵀ dO'; Z = diag(d) U dSᵀ (d_m = E[n-1][m]) */
    transpose(lv, b->UT, CH, b->U, (size_t)dv, n, dv);
    if (live) {
        mm(lv, n, dv, dk, Kc, (size_t)dk, 1, dS, (size_t)dv, b->dU, (size_t)dv, 0);
        transpose(lv, b->dST, (size_t)dk, dS, (size_t)dv, dk, dv);
        mm(lv, n, dk, dv, b->U, (size_t)dv, 1, b->dST, (size_t)dk, b->Z, (size_t)dk, 0);
    }
    for (int m = 0; m < n; m++) {
        float *du = b->dU + (size_t)m * dv, *z = b->Z + (size_t)m * dk, dm = E[n - 1][m];
        if (live) {
            GDN_EACH(c, dv, du[c] *= dm);
            GDN_EACH(r, dk, z[r] *= dm);
            xd[m] = dot(Kc + (size_t)m * dk, z, dk);
        } else {
            for (int c = 0; c < dv; c++) du[c] = 0.0f;
            xd[m] = 0.0f;
        }
    }
    mm(lv, n, dv, n, &M.Mq[0][0], 1, CH, DO, (size_t)dv, b->dU, (size_t)dv, 1); /* += Mqᵀ dO' */
    /* dX = (I + diag(β) L)⁻ᵀ dU = Xᵀ dU */
    mm(lv, n, dv, n, &M.X[0][0], 1, CH, b->dU, (size_t)dv, dX, (size_t)dv, 0);
    /* [dO'; dX] Uᵀ: dMqk (i >= m) and −dA (m < i) */
    mm(lv, 2 * n, n, dv, b->DOX, (size_t)dv, 1, b->UT, CH, &DXU[0][0], CH, 0);
    /* dR = β dX (= dV, then through SiLU'); dW = −γ dR; dβ = R·dX + Σ dA L; dγ from P, W, S0 */
    float *dmix = J->dmixed;
    for (int i = 0; i < n; i++) {
        const float *x = dX + (size_t)i * dv;
        float *dvv = dmix + (size_t)(t0 + i) * cd + voff, *dw = dW + (size_t)i * dv;
        const float *dsv = b->dsV + (size_t)i * dv;
        dbe[i] = dot(b->R + (size_t)i * dv, x, dv);
        if (S0) dgam[i] -= be[i] * dot(W + (size_t)i * dv, x, dv);
        const float bi = be[i], mg = -gam[i];
        GDN_EACH(c, dv, const float dr = bi * x[c]; dvv[c] = dr * dsv[c]; dw[c] = mg * dr);
    }
    if (S0 && live) dgam[n - 1] += dot(S0, dS, dk * dv);
    /* DD = [[0, Dq], [Dqᵀ, Dl + Dlᵀ]] (Dq_im = dMqk_im E_im, m <= i; Dl_im = dL_im E_im, m < i),
     * so that d[q̂; k̂] += DD [q̂; k̂]; dG_i (d/d of the log cumulative decay at i) */
    for (int i = 0; i < n; i++) dG[i] = (double)dgam[i] * gam[i];
    for (int r = 0; r < 2 * n; r++)
        for (int c = 0; c < 2 * n; c++) DD[r][c] = 0.0f;
    for (int i = 0; i < n; i++)
        for (int m = 0; m <= i; m++) {
            const float dmq = DXU[i][m], dq = dmq * E[i][m];
            DD[i][n + m] = dq;
            DD[n + m][i] = dq;
            if (m == i) continue;
            const float xq = dmq * Mq[i][m];
            const float dA = -DXU[n + i][m], dL = be[i] * dA, xl = dL * Lm[i][m], dl = dL * E[i][m];
            dbe[i] += dA * Lm[i][m];
            dG[i] += (double)xq + xl;
            dG[m] -= (double)xq + xl;
            DD[n + i][n + m] = dl;
            DD[n + m][n + i] = dl;
        }
    for (int m = 0; m + 1 < n; m++) {
        dG[n - 1] += xd[m];
        dG[m] -= xd[m];
    }
    float *dK = b->dQK + (size_t)n * dk;
    mm(lv, 2 * n, dk, 2 * n, &DD[0][0], 2 * CH, 1, b->QK, (size_t)dk, b->dQK, (size_t)dk, 1);
    if (S0) {
        transpose(lv, b->S0T, (size_t)dk, S0, (size_t)dv, dk, dv);
        mm(lv, 2 * n, dk, dv, b->dPW, (size_t)dv, 1, b->S0T, (size_t)dk, b->dQK, (size_t)dk, 1);
    }
    if (live)
        for (int m = 0; m < n; m++)
            GDN_EACH(r, dk, dK[(size_t)m * dk + r] += b->Z[(size_t)m * dk + r]);
    /* dS0 = γ_{n-1} dS + Qᵀ dP + Kᵀ dW */
    if (S0) {
        const size_t hs = (size_t)dk * dv;
        if (live)
            GDN_EACH(e, dk * dv, dS[e] *= gam[n - 1]);
        else
            memset(dS, 0, sizeof(float) * hs);
        mm(lv, dk, dv, 2 * n, b->QK, 1, (size_t)dk, b->dPW, (size_t)dv, dS, (size_t)dv, 1);
    }
    /* dg_l = Σ_{i >= l} dG_i; then through the gates */
    double acc = 0.0;
    for (int l = n - 1; l >= 0; l--) {
        const size_t gi = (size_t)(t0 + l) * Hv + j;
        acc += dG[l];
        J->da[gi] = (float)acc * cache->dgda[gi];
        J->db[gi] = dbe[l] * be[l] * (1.0f - be[l]);
    }
}

/* The recurrence backward of the task's key heads: chunks last to first; per chunk the q̂/k̂
 * rows and their Gram matrix once, then each value head of the key head in ascending order
 * (each with its own carried dS), then the L2 norm and SiLU backward of those rows. Every
 * value written is the task's own: the same bits on any number of threads. */
static void bwd_heads_task(void *arg, int task, int n_tasks) {
    const bwd_job *J = arg;
    const nl_gdn_shape *s = J->s;
    const nl_gdn_cache *cache = J->cache;
    const int T = J->T, lv = J->lv;
    const int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv, G = Hv / Hk;
    const int cd = nl_gdn_conv_dim(s);
    const size_t hs = (size_t)dk * dv;
    const bwd_buf b = bwd_carve(s, J->scratch + (size_t)task * bwd_work_floats(s));
    float Gram[2 * CH * CH], nrm[2 * CH];
    const int nch = (T + CH - 1) / CH;
    int k0, k1;
    share(Hk, task, n_tasks, &k0, &k1);
    for (int kh = k0; kh < k1; kh++) {
        const size_t qoff = (size_t)kh * dk, koff = (size_t)Hk * dk + (size_t)kh * dk;
        memset(b.dS, 0, sizeof(float) * (size_t)G * hs);
        for (int ci = nch - 1; ci >= 0; ci--) {
            const int t0 = ci * CH, n = T - t0 < CH ? T - t0 : CH;
            for (int i = 0; i < n; i++) {
                const float *cp = cache->cpre + (size_t)(t0 + i) * cd;
                nrm[i] = silu_l2_d(lv, b.QK + (size_t)i * dk, b.dsQK + (size_t)i * dk, cp + qoff, dk, s->eps);
                nrm[n + i] = silu_l2_d(lv, b.QK + (size_t)(n + i) * dk, b.dsQK + (size_t)(n + i) * dk, cp + koff, dk,
                                       s->eps);
            }
            transpose(lv, b.KT, CH, b.QK + (size_t)n * dk, (size_t)dk, n, dk);
            mm(lv, 2 * n, n, dk, b.QK, (size_t)dk, 1, b.KT, CH, Gram, CH, 0);
            memset(b.dQK, 0, sizeof(float) * 2 * (size_t)n * dk);
            for (int j = 0, gj = 0; j < Hv; j++) {
                if (key_head(s, j) != kh) continue;
                const float *S0 = ci ? cache->ck + ((size_t)(ci - 1) * Hv + j) * hs : NULL;
                chunk_bwd(J, &b, j, t0, n, S0, b.dS + (size_t)gj * hs, ci < nch - 1, Gram);
                gj++;
            }
            /* d(q̂, k̂) -> d(silu out) through the L2 norm, then SiLU' */
            for (int h = 0; h < 2 * n; h++) {
                const float *x = b.QK + (size_t)h * dk, *d = b.dQK + (size_t)h * dk, *ds = b.dsQK + (size_t)h * dk;
                float *out = J->dmixed + (size_t)(t0 + (h < n ? h : h - n)) * cd + (h < n ? qoff : koff);
                if (nrm[h] > s->eps) {
                    const float yd = dot(x, d, dk), nh = nrm[h];
                    GDN_EACH(r, dk, out[r] = (d[r] - x[r] * yd) / nh * ds[r]);
                } else {
                    GDN_EACH(r, dk, out[r] = d[r] / s->eps * ds[r]);
                }
            }
        }
    }
}
/* Conv backward of the task's channels, in place: dm_s[ch] = sum_i w[ch][i] dc_{s+K-1-i}[ch],
 * over indices < T (row s needs rows s..s+K-1 of its channel only: ascending in time). */
static void bwd_conv_task(void *arg, int task, int n_tasks) {
    const bwd_job *J = arg;
    const float *wt = J->wt; /* [K][cd]: the kernel transposed */
    float *dmixed = J->dmixed;
    const int T = J->T, K = J->s->K, cd = nl_gdn_conv_dim(J->s);
    int c0, c1;
    share(cd, task, n_tasks, &c0, &c1);
    for (int t = 0; t < T; t++) {
        float *dm = dmixed + (size_t)t * cd;
        int ch = c0;
        /* 8 channels at a time (their rows t.. are read before row t is written) */
        for (; ch + 8 <= c1; ch += 8) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int i = K - 1; i >= 0; i--) {
                int src = t + K - 1 - i;
                if (src >= T) continue;
                const float *x = dmixed + (size_t)src * cd + ch, *wv = wt + (size_t)i * cd + ch;
                for (int l = 0; l < 8; l++) acc[l] += wv[l] * x[l];
            }
            for (int l = 0; l < 8; l++) dm[ch + l] = acc[l];
        }
        for (; ch < c1; ch++) {
            float acc = 0.0f;
            for (int i = K - 1; i >= 0; i--) {
                int src = t + K - 1 - i;
                if (src >= T) continue;
                acc += wt[(size_t)i * cd + ch] * dmixed[(size_t)src * cd + ch];
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
    int nh = n_tasks_for(pool, s->Hk), nc = n_tasks_for(pool, cd);
    const size_t n_work = (size_t)bwd_work_floats(s) * (size_t)nh, K = (size_t)s->K;
    float *scratch = nl_malloc(sizeof(float) * (n_work + K * (size_t)cd));
    if (!scratch) return -1;
    float *wt = scratch + n_work;
    for (int ch = 0; ch < cd; ch++)
        for (size_t i = 0; i < K; i++) wt[i * (size_t)cd + ch] = w->conv[(size_t)ch * K + i];
    memset(dmixed, 0, sizeof(float) * (size_t)T * cd);
    bwd_job J = {.s = s, .w = w, .cache = cache, .dy = dy, .dmixed = dmixed, .dz = dz, .db = db, .da = da,
                 .scratch = scratch, .wt = wt, .T = T, .lv = simd_level()};
    run_tasks(pool, nh, bwd_heads_task, &J);
    run_tasks(pool, nc, bwd_conv_task, &J);
    free(scratch);
    return 0;
}

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
 *   ascending in time (row s of the result needs rows s..s+K-1 of the input only).
 * - Every entry point and every pool task runs with denormals flushed (cpu/fpmode.h): the
 *   running decay products pass through the denormal range on their way to 0, which on Intel
 *   cores costs a microcode assist per operation (it tripled the node's time on a Xeon). */
#include "nn/gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/fpmode.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"
#include "util/pool.h"
#include "util/util.h"

#define CH NL_GDN_CHUNK

/* Runs the statement for c = 0..n-1 as 8-wide blocks plus a tail, so that gcc -O2 vectorises it
 * (element-wise only: any vector width gives the same bits; the arrays must not overlap). */
#if defined(__GNUC__) && !defined(__clang__)
#define GDN_IVDEP _Pragma("GCC ivdep")
#else
#define GDN_IVDEP
#endif
#define GDN_EACH(c, n, ...)                                                                                            \
    do {                                                                                                               \
        int c##_0 = 0;                                                                                                 \
        for (; c##_0 + 8 <= (n); c##_0 += 8) GDN_IVDEP for (int c##_l = 0; c##_l < 8; c##_l++) {                       \
                const int c = c##_0 + c##_l;                                                                           \
                __VA_ARGS__;                                                                                           \
            }                                                                                                          \
        for (int c = c##_0; c < (n); c++) { __VA_ARGS__; }                                                             \
    } while (0)

/* The calls' temporaries: from the pass's arena when there is one (released when the call
 * returns), else the heap (tests, benchmarks). */
static float *tmp_get(nl_arena *ws, nl_arena_mark *m, size_t n) {
    if (!ws) return nl_malloc(sizeof(float) * n);
    *m = nl_arena_top(ws);
    return nl_arena_floats(ws, n);
}
static void tmp_put(nl_arena *ws, nl_arena_mark m, float *p) {
    if (ws) nl_arena_release(ws, m);
    else free(p);
}
/* Width of the state column blocks the forward recurrence runs on (see gdn_step). */
#define GDN_COLS 64

struct nl_gdn_cache {
    nl_gdn_shape shape;
    int T_max, T;   /* T: tokens of the last nl_gdn_forward_train (0: none yet) */
    uint64_t bytes; /* size of data */
    int heap;       /* 1: the struct and data are the heap's (nl_gdn_cache_free frees them) */
    float *data;
    float *cpre;            /* [T_max][conv_dim] conv output before SiLU */
    float *z;               /* [T_max][Hv*dv] */
    float *beta, *g, *dgda; /* [T_max][Hv] */
    float *ck;              /* [(T_max-1)/16][Hv][dk][dv]: S before tokens 16, 32, ... */
};

/* ---- small scalar helpers ---- */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
/* log(1 + y) for y >= 0 from logf: u = 1 + y rounded, log(u) scaled by y / (u - 1), which
 * cancels u's rounding (within 2 ulp; y itself when u rounds to 1). Not glibc's log1pf: its
 * last bit differs between the x86-64 and the AArch64 builds for about 1 input in 1000 (logf's
 * and expf's agree), and the FP32 path gives the same bits on both. */
static inline float log1p_pos(float y) {
    const float u = 1.0f + y;
    return u == 1.0f ? y : logf(u) * (y / (u - 1.0f));
}
/* softplus with ggml's threshold: x > 20 -> x */
static inline float softplusf(float x) { return x > 20.0f ? x : log1p_pos(expf(x)); }

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
        return nl_err("gdn: bad shape Hk=%d Hv=%d dk=%d dv=%d K=%d (all must be >= 1)", s->Hk, s->Hv, s->dk, s->dv,
                      s->K);
    if (s->Hv % s->Hk) return nl_err("gdn: value heads Hv=%d not a multiple of key heads Hk=%d", s->Hv, s->Hk);
    if (!(s->eps > 0.0f) || !isfinite(s->eps)) return nl_err("gdn: eps %g must be > 0", (double)s->eps);
    /* keep conv_dim and dk*dv well inside int */
    int64_t cd = 2 * (int64_t)s->Hk * s->dk + (int64_t)s->Hv * s->dv;
    if (cd > (1 << 28) || (int64_t)s->dk * s->dv > (1 << 28) || s->K > 4096)
        return nl_err("gdn: shape too large (conv_dim %lld, dk*dv %lld, K %d)", (long long)cd, (long long)s->dk * s->dv,
                      s->K);
    return 0;
}

static int check_weights(const nl_gdn_weights *w, int need_gates) {
    if (!w || !w->conv || !w->norm || (need_gates && (!w->dt_bias || !w->A)))
        return nl_err("gdn: missing weight pointer");
    return 0;
}

static inline int key_head(const nl_gdn_shape *s, int j) { return s->kv_tiled ? j % s->Hk : j / (s->Hv / s->Hk); }

/* y = silu(x) = x / (1 + expf(-x)) over n (y may equal x): the kernel set's gdn_silu (libm's
 * expf bits) on what it takes, then libm's expf element by element and the division
 * vectorised (the same operations: the same bits). */
static void silu_row(const nl_host_kernels *ks, float *y, const float *x, int n) {
    float e[256];
    const int i = ks->gdn_silu ? ks->gdn_silu(y, x, n) : 0;
    y += i, x += i, n -= i;
    for (int i0 = 0; i0 < n; i0 += 256) {
        const int m = n - i0 < 256 ? n - i0 : 256;
        for (int l = 0; l < m; l++) e[l] = expf(-x[i0 + l]);
        GDN_EACH(l, m, y[i0 + l] = x[i0 + l] / (1.0f + e[l]));
    }
}

/* ss[r] = Σ_i x_r[i]² in double, i ascending, for the 4 rows x_r = x + r·ld: four independent
 * chains side by side (each the order of a single row's loop). */
static void sumsq4(double ss[4], const float *x, size_t ld, int n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    const float *x1 = x + ld, *x2 = x1 + ld, *x3 = x2 + ld;
    for (int i = 0; i < n; i++) {
        s0 += (double)x[i] * x[i];
        s1 += (double)x1[i] * x1[i];
        s2 += (double)x2[i] * x2[i];
        s3 += (double)x3[i] * x3[i];
    }
    ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
}

static double sumsq(const float *x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

/* s[r] = Σ_i x_r[i]·y_r[i] in double, i ascending, for the 4 rows x_r = x + r·ld, y_r = y + r·ld:
 * sumsq4's four chains (each the order of a single row's loop). */
static void dotd4(double s[4], const float *x, const float *y, size_t ld, int n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    const float *x1 = x + ld, *x2 = x1 + ld, *x3 = x2 + ld, *y1 = y + ld, *y2 = y1 + ld, *y3 = y2 + ld;
    for (int i = 0; i < n; i++) {
        s0 += (double)x[i] * y[i];
        s1 += (double)x1[i] * y1[i];
        s2 += (double)x2[i] * y2[i];
        s3 += (double)x3[i] * y3[i];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* ss[l] = Σ_i x_l[i]² for the w <= 4 rows x_l = x + l·ld (sumsq4 for a full group) */
static void sumsq_rows(double ss[4], const float *x, size_t ld, int w, int n) {
    if (w == 4) sumsq4(ss, x, ld, n);
    else
        for (int l = 0; l < w; l++) ss[l] = sumsq(x + (size_t)l * ld, n);
}

/* ss[r] = Σ_i x_r[i]² for the m rows x_r = x + r·ld, four at a time (the chains of one
 * row's loop: its latency, not its work, bounds a single row) */
static void sumsq_all(double *ss, const float *x, size_t ld, int m, int n) {
    for (int r = 0; r < m; r += 4) sumsq_rows(ss + r, x + (size_t)r * ld, ld, m - r < 4 ? m - r : 4, n);
}

/* Rows r < m of x (stride ld, n each): x_r /= max(||x_r||, eps), with ||silu(src)|| summed as
 * above (x holds silu(src)). (The forward's q̂, k̂; the backward recomputes them with
 * silu_l2_d, within an ulp or two of these.) */
static void l2_rows(float *x, size_t ld, int m, int n, float eps) {
    for (int r = 0; r < m; r += 4) {
        double ss[4];
        const int w = m - r < 4 ? m - r : 4;
        sumsq_rows(ss, x + (size_t)r * ld, ld, w, n);
        for (int l = 0; l < w; l++) {
            float *d = x + (size_t)(r + l) * ld, nrm = (float)sqrt(ss[l]);
            const float inv = 1.0f / (nrm > eps ? nrm : eps);
            GDN_EACH(i, n, d[i] *= inv);
        }
    }
}

/* out[c] += a[c] * x[c] over n (8-wide blocks + tail). */
static inline void row_fma(float *restrict out, const float *restrict a, const float *restrict x, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) out[c + l] += a[c + l] * x[c + l];
    for (; c < n; c++) out[c] += a[c] * x[c];
}

/* Causal depthwise conv of rows [t0, t1): cpre[t][ch] = sum_i w[ch][i] * m_{t-K+1+i}[ch]
 * (summed i = 0..K-1), where positions < 0 come from hist[(K-1)][cd] (oldest first;
 * hist[K-1+pos]). wt[K][cd]: the kernel transposed (conv_wt), so every inner loop is contiguous.
 * Each row on its own: any split of the rows gives the same bits. */
static void conv_rows(float *cpre, const float *mixed, const float *hist, const float *wt, int t0, int t1, int cd,
                      int K) {
    for (int t = t0; t < t1; t++) {
        float *out = cpre + (size_t)t * cd;
        memset(out, 0, sizeof(float) * (size_t)cd);
        for (int i = 0; i < K; i++) {
            int pos = t - K + 1 + i;
            const float *r = pos >= 0 ? mixed + (size_t)pos * cd : hist + (size_t)(K - 1 + pos) * cd;
            row_fma(out, wt + (size_t)i * cd, r, cd);
        }
    }
}

static void conv_wt(float *wt, const float *w, int cd, int K) {
    for (int ch = 0; ch < cd; ch++)
        for (int i = 0; i < K; i++) wt[(size_t)i * cd + ch] = w[(size_t)ch * K + i];
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
static inline void row_scale_acc_from(float *restrict d, const float *restrict x, float alpha, float *restrict acc,
                                      float s, int n) {
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
static inline void row_axpy_acc(float *restrict d, float a, const float *restrict x, float *restrict acc, float s,
                                int n) {
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
static void step_c(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                   float alpha, float beta, float scale, int dk, int n, float *restrict p, float *restrict u,
                   float *r_out, float *restrict o) {
    for (int c = 0; c < n; c++) p[c] = 0.0f;
    if (S_prev == S)
        for (int i = 0; i < dk; i++) row_scale_acc(S + (size_t)i * ld, alpha, p, k[i], n);
    else
        for (int i = 0; i < dk; i++) row_scale_acc_from(S + (size_t)i * ld, S_prev + (size_t)i * ld, alpha, p, k[i], n);
    for (int c = 0; c < n; c++) {
        float r = v[c] - p[c];
        if (r_out) r_out[c] = r;
        u[c] = beta * r;
        o[c] = 0.0f;
    }
    for (int i = 0; i < dk; i++) row_axpy_acc(S + (size_t)i * ld, k[i], u, o, q[i], n);
    for (int c = 0; c < n; c++) o[c] *= scale;
}

/* step_c over n columns, in blocks of the kernel set's gdn_step (64 columns on AVX-512, 32 on
 * AVX2: cpu/gdn_simd.h; 32 on the Arm rows: cpu/gdn_neon.c), the rest portable. */
static void gdn_step(const nl_host_kernels *ks, float *S, const float *S_prev, size_t ld, const float *k,
                     const float *v, const float *q, float alpha, float beta, float scale, int dk, int n,
                     float *restrict p, float *restrict u, float *r_out, float *restrict o) {
    int c0 = 0;
    if (ks->gdn_step)
        for (const int w = ks->gdn_step_cols; c0 + w <= n; c0 += w)
            ks->gdn_step(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, u + c0,
                         r_out ? r_out + c0 : NULL, o + c0);
    if (c0 < n)
        step_c(S + c0, S_prev + c0, ld, k, v + c0, q, alpha, beta, scale, dk, n - c0, p, u + c0,
               r_out ? r_out + c0 : NULL, o + c0);
}

/* Gated RMSNorm in place over the T rows of one head (strides ld): o <- o / sqrt(mean(o²) +
 * eps) * nw * silu(z), over dv; sz: [dv] scratch for silu(z). */
static void gated_norm_rows(const nl_host_kernels *ks, float *o, const float *z, size_t ld, int T, const float *nw,
                            int dv, float eps, float *sz) {
    for (int t0 = 0; t0 < T; t0 += 4) {
        double ss[4];
        const int w = T - t0 < 4 ? T - t0 : 4;
        sumsq_rows(ss, o + (size_t)t0 * ld, ld, w, dv);
        for (int l = 0; l < w; l++) {
            float *ot = o + (size_t)(t0 + l) * ld;
            const float rstd = (float)(1.0 / sqrt(ss[l] / dv + eps));
            silu_row(ks, sz, z + (size_t)(t0 + l) * ld, dv);
            GDN_EACH(c, dv, ot[c] = ot[c] * rstd * nw[c] * sz[c]);
        }
    }
}

/* β, g (and dg/da when dgda != NULL) for tokens [t0, t1). */
static void gates(const nl_gdn_shape *s, const nl_gdn_weights *w, const float *b, const float *a, int t0, int t1,
                  float *beta, float *g, float *dgda) {
    int H = s->Hv;
    for (int t = t0; t < t1; t++)
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

/* A pool task under the node's FP mode (each pool thread has its own; set and put back). */
typedef struct {
    void (*fn)(void *, int, int);
    void *job;
} flushed_job;

static void flushed_task(void *arg, int task, int n_tasks) {
    const flushed_job *F = arg;
    nl_fpmode m = nl_fpmode_flush();
    F->fn(F->job, task, n_tasks);
    nl_fpmode_restore(m);
}

/* Runs fn over n_tasks tasks, on the pool when there are several (the calling thread's mode is
 * already the node's: the entry points set it). */
static void run_tasks(nl_pool *pool, int n_tasks, void (*fn)(void *, int, int), void *job) {
    flushed_job F = {fn, job};
    if (n_tasks > 1) nl_pool_run(pool, n_tasks, flushed_task, &F);
    else fn(job, 0, 1);
}

/* The forward's element-wise prologue, split by token rows over the pool: the conv, the gates
 * and (training) the copy of z into the cache. */
typedef struct {
    const nl_gdn_shape *s;
    const nl_gdn_weights *w;
    float *cpre, *beta, *g, *dgda, *zdst, *wt;
    const float *mixed, *hist, *b, *a, *z;
    int T;
} pro_job;

static void pro_task(void *arg, int task, int n_tasks) {
    const pro_job *P = arg;
    const int cd = nl_gdn_conv_dim(P->s);
    const size_t vd = (size_t)P->s->Hv * P->s->dv;
    int t0, t1;
    share(P->T, task, n_tasks, &t0, &t1);
    conv_rows(P->cpre, P->mixed, P->hist, P->wt, t0, t1, cd, P->s->K);
    gates(P->s, P->w, P->b, P->a, t0, t1, P->beta, P->g, P->dgda);
    if (P->zdst) memcpy(P->zdst + (size_t)t0 * vd, P->z + (size_t)t0 * vd, sizeof(float) * (size_t)(t1 - t0) * vd);
}

static void prologue(nl_pool *pool, pro_job *P) {
    conv_wt(P->wt, P->w->conv, nl_gdn_conv_dim(P->s), P->s->K);
    run_tasks(pool, n_tasks_for(pool, P->T), pro_task, P);
}

typedef struct {
    const nl_gdn_shape *s;
    const nl_gdn_weights *w;
    float *y, *xs, *Sstate, *ck, *scratch;
    const float *cpre, *z, *beta, *g;
    int T;
    const nl_host_kernels *ks; /* the kernel set (nl_cpu_kernels) */
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
        silu_row(J->ks, dst, src, cd);
        l2_rows(dst, (size_t)dk, 2 * Hk, dk, s->eps);
    }
}

/* The recurrence of value head j (key head kh) on the state columns [c0, c0 + gdn_step_cols)
 * over all tokens with the kernel set's gdn_scan: runs of tokens between checkpoints (the
 * checkpoint copied before each run), the same bits as gdn_step token by token. Sb: the
 * block's rows (row stride ldb: the state's own, or a packed copy, so that the block's
 * dk rows stay in L1 instead of taking half of its sets at the state's 512-byte stride). */
static void fwd_scan(const fwd_job *J, float *Sb, size_t ldb, int j, int kh, int c0) {
    const nl_gdn_shape *s = J->s;
    const int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv, T = J->T, n = J->ks->gdn_step_cols;
    const int cd = nl_gdn_conv_dim(s);
    const size_t hs = (size_t)dk * dv, vd = (size_t)Hv * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    for (int t0 = 0; t0 < T;) {
        int t1 = T;
        if (J->ck) {
            if (t0 > 0) {
                float *dst = J->ck + ((size_t)(t0 / CH - 1) * Hv + j) * hs;
                for (int i = 0; i < dk; i++)
                    memcpy(dst + (size_t)i * dv + c0, Sb + (size_t)i * ldb, sizeof(float) * (size_t)n);
            }
            if (t0 + CH < T) t1 = t0 + CH;
        }
        const float *row = J->xs + (size_t)t0 * cd;
        J->ks->gdn_scan(Sb, ldb, dk, t1 - t0, row + (size_t)(Hk + kh) * dk, row + (size_t)kh * dk, (size_t)cd,
                        row + 2 * (size_t)Hk * dk + (size_t)j * dv + c0, (size_t)cd, J->g + (size_t)t0 * Hv + j,
                        J->beta + (size_t)t0 * Hv + j, (size_t)Hv, scale, J->y + (size_t)t0 * vd + (size_t)j * dv + c0,
                        vd);
        t0 = t1;
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
        /* column blocks of the state, each over all tokens: dk x GDN_COLS floats stay in L1 */
        for (int c0 = 0; c0 < dv; c0 += GDN_COLS) {
            int n = dv - c0 < GDN_COLS ? dv - c0 : GDN_COLS;
            if (J->ks->gdn_scan && n == J->ks->gdn_step_cols) {
                /* the block packed (n floats a row) in the task's scratch: from zero, or a
                 * copy of the caller's state put back after the scan (a few tokens, as when
                 * decoding: in place, the copies would cost more than they save) */
                if (J->Sstate && T < CH) {
                    fwd_scan(J, S + c0, (size_t)dv, j, kh, c0);
                    continue;
                }
                if (!J->Sstate) memset(Shead, 0, sizeof(float) * (size_t)dk * n);
                else
                    for (int i = 0; i < dk; i++)
                        memcpy(Shead + (size_t)i * n, S + (size_t)i * dv + c0, sizeof(float) * (size_t)n);
                fwd_scan(J, Shead, (size_t)n, j, kh, c0);
                if (J->Sstate)
                    for (int i = 0; i < dk; i++)
                        memcpy(S + (size_t)i * dv + c0, Shead + (size_t)i * n, sizeof(float) * (size_t)n);
                continue;
            }
            if (!J->Sstate) /* (a packed block before may have used these floats) */
                for (int i = 0; i < dk; i++) memset(S + (size_t)i * dv + c0, 0, sizeof(float) * (size_t)n);
            for (int t = 0; t < T; t++) {
                const float *row = J->xs + (size_t)t * cd;
                if (J->ck && t > 0 && t % CH == 0) {
                    float *dst = J->ck + ((size_t)(t / CH - 1) * Hv + j) * hs;
                    for (int i = 0; i < dk; i++)
                        memcpy(dst + (size_t)i * dv + c0, S + (size_t)i * dv + c0, sizeof(float) * (size_t)n);
                }
                size_t gi = (size_t)t * Hv + j;
                float *o = J->y + (size_t)t * Hv * dv + (size_t)j * dv + c0;
                gdn_step(J->ks, S + c0, S + c0, (size_t)dv, row + Hk * dk + (size_t)kh * dk,
                         row + 2 * Hk * dk + (size_t)j * dv + c0, row + (size_t)kh * dk, expf(J->g[gi]), J->beta[gi],
                         scale, dk, n, p, u, NULL, o);
            }
        }
        gated_norm_rows(J->ks, J->y + (size_t)j * dv, J->z + (size_t)j * dv, (size_t)Hv * dv, T, J->w->norm, dv, s->eps,
                        p);
    }
}

/* Shared forward: cpre (already conv'd, [T][cd]) -> y. xs [T][cd] receives q̂, k̂, silu(v); it
 * may equal cpre. Sstate: [Hv][dk][dv] read and updated, or NULL (zero start). ck: checkpoint
 * array or NULL. Value heads split over the pool's threads. */
static int forward_core(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                        const float *cpre, float *xs, const float *z, const float *beta, const float *g, int T,
                        float *Sstate, float *ck) {
    int nh = n_tasks_for(pool, s->Hv), nr = n_tasks_for(pool, T);
    nl_arena_mark m = {0};
    float *scratch = tmp_get(ws, &m, (size_t)nh * ((size_t)s->dk * s->dv + 3 * (size_t)s->dv));
    if (!scratch) return -1;
    fwd_job J = {.s = s,
                 .w = w,
                 .y = y,
                 .xs = xs,
                 .Sstate = Sstate,
                 .ck = ck,
                 .scratch = scratch,
                 .cpre = cpre,
                 .z = z,
                 .beta = beta,
                 .g = g,
                 .T = T,
                 .ks = nl_cpu_kernels()};
    run_tasks(pool, nr, fwd_rows_task, &J);
    run_tasks(pool, nh, fwd_heads_task, &J);
    tmp_put(ws, m, scratch);
    return 0;
}

static int gdn_forward_run(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                           const float *mixed, const float *z, const float *b, const float *a, int T,
                           nl_gdn_state *state) {
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
    nl_arena_mark m = {0};
    float *buf = tmp_get(ws, &m, n);
    if (!buf) return -1;
    float *cpre = buf, *beta = cpre + n_tc, *g = beta + n_g, *hist = g + n_g, *wt = hist + n_hist;
    if (!state) memset(hist, 0, sizeof(float) * n_hist);
    pro_job P = {.s = s,
                 .w = w,
                 .cpre = cpre,
                 .beta = beta,
                 .g = g,
                 .mixed = mixed,
                 .hist = state ? state->conv : hist,
                 .wt = wt,
                 .b = b,
                 .a = a,
                 .T = T};
    prologue(pool, &P);
    /* the state is updated only once nothing can fail */
    if (forward_core(pool, ws, s, w, y, cpre, cpre, z, beta, g, T, state ? state->S : NULL, NULL)) {
        tmp_put(ws, m, buf);
        return -1;
    }
    if (state && K > 1) conv_state_update(state->conv, mixed, T, cd, K);
    tmp_put(ws, m, buf);
    return 0;
}

int nl_gdn_forward(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                   const float *mixed, const float *z, const float *b, const float *a, int T, nl_gdn_state *state) {
    nl_fpmode m = nl_fpmode_flush();
    int rc = gdn_forward_run(pool, ws, s, w, y, mixed, z, b, a, T, state);
    nl_fpmode_restore(m);
    return rc;
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

static uint64_t al64(uint64_t b) { return b ? (b + 63) & ~(uint64_t)63 : 64; }

uint64_t nl_gdn_train_ws_bytes(const nl_gdn_shape *s, int T, int bwd) {
    if (check_shape(s) || T < 1) return 0;
    const uint64_t cd = (uint64_t)nl_gdn_conv_dim(s), K = (uint64_t)s->K;
    if (bwd) return al64(4 * (bwd_work_floats(s) * (uint64_t)s->Hk + K * cd));
    return al64(4 * ((uint64_t)T * cd + (K - 1) * cd + K * cd)) +
           al64(4 * (uint64_t)s->Hv * ((uint64_t)s->dk * s->dv + 3 * (uint64_t)s->dv));
}

uint64_t nl_gdn_cache_arena_bytes(const nl_gdn_shape *s, int T) {
    const uint64_t b = nl_gdn_cache_bytes(s, T);
    return b ? nl_arena_size(sizeof(nl_gdn_cache)) + nl_arena_size((size_t)b) : 0;
}

nl_gdn_cache *nl_gdn_cache_new(nl_arena *ws, const nl_gdn_shape *s, int T_max) {
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
    nl_gdn_cache *c = ws ? nl_arena_alloc(ws, sizeof *c) : nl_calloc(1, sizeof *c);
    if (!c) return NULL;
    memset(c, 0, sizeof *c);
    c->heap = !ws;
    c->data = ws ? nl_arena_floats(ws, (size_t)f) : nl_malloc((size_t)f * 4);
    if (!c->data) {
        if (!ws) free(c);
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
    if (!c || !c->heap) return;
    free(c->data);
    free(c);
}

uint64_t nl_gdn_cache_size(const nl_gdn_cache *c) { return c ? c->bytes : 0; }

static int same_shape(const nl_gdn_shape *a, const nl_gdn_shape *b) {
    return a->Hk == b->Hk && a->Hv == b->Hv && a->dk == b->dk && a->dv == b->dv && a->K == b->K && a->eps == b->eps &&
           (a->kv_tiled != 0) == (b->kv_tiled != 0);
}

static int gdn_forward_train_run(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                                 const float *mixed, const float *z, const float *b, const float *a, int T,
                                 nl_gdn_cache *cache) {
    if (check_shape(s) || check_weights(w, 1)) return -1;
    if (!cache) return nl_err("gdn: NULL cache");
    if (!same_shape(s, &cache->shape)) return nl_err("gdn: cache was made for another shape");
    if (T < 1 || T > cache->T_max) return nl_err("gdn: %d tokens for a cache of at most %d", T, cache->T_max);
    if (!y || !mixed || !z || !b || !a) return nl_err("gdn: NULL activation pointer");
    int cd = nl_gdn_conv_dim(s), K = s->K;
    size_t n_tc = (size_t)T * cd, n_hist = (size_t)(K - 1) * cd;
    nl_arena_mark m = {0};
    float *buf = tmp_get(ws, &m, n_tc + n_hist + (size_t)K * cd);
    if (!buf) return -1;
    float *xs = buf, *hist = xs + n_tc, *wt = hist + n_hist;
    memset(hist, 0, sizeof(float) * n_hist);
    cache->T = 0;
    pro_job P = {.s = s,
                 .w = w,
                 .cpre = cache->cpre,
                 .beta = cache->beta,
                 .g = cache->g,
                 .dgda = cache->dgda,
                 .zdst = cache->z,
                 .mixed = mixed,
                 .hist = hist,
                 .wt = wt,
                 .b = b,
                 .a = a,
                 .z = z,
                 .T = T};
    prologue(pool, &P);
    int rc = forward_core(pool, ws, s, w, y, cache->cpre, xs, cache->z, cache->beta, cache->g, T, NULL, cache->ck);
    if (rc == 0) cache->T = T;
    tmp_put(ws, m, buf);
    return rc;
}

int nl_gdn_forward_train(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                         const float *mixed, const float *z, const float *b, const float *a, int T,
                         nl_gdn_cache *cache) {
    nl_fpmode m = nl_fpmode_flush();
    int rc = gdn_forward_train_run(pool, ws, s, w, y, mixed, z, b, a, T, cache);
    nl_fpmode_restore(m);
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

/* out[j] += a * x[j] over n (8-wide blocks + tail). */
static inline void row_axpy(float *restrict out, float a, const float *restrict x, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) out[c + l] += a * x[c + l];
    for (; c < n; c++) out[c] += a * x[c];
}

static void mm_c(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm,
                 size_t ldc, int acc) {
    for (int i = 0; i < M; i++) {
        float *c = Cm + (size_t)i * ldc;
        if (!acc)
            for (int j = 0; j < N; j++) c[j] = 0.0f;
        for (int l = 0; l < Kd; l++) row_axpy(c, A[(size_t)i * ars + (size_t)l * acs], B + (size_t)l * ldb, N);
    }
}

/* The kernel set's gdn_mm on the columns it takes (all on AVX-512, whole 8-column blocks on
 * AVX2, whole 4-column blocks on the Arm rows), mm_c on the rest. */
static void mm(const nl_host_kernels *ks, int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B,
               size_t ldb, float *Cm, size_t ldc, int acc) {
    const int j0 = ks->gdn_mm ? ks->gdn_mm(M, N, Kd, A, ars, acs, B, ldb, Cm, ldc, acc) : 0;
    if (j0 < N) mm_c(M, N - j0, Kd, A, ars, acs, B + j0, ldb, Cm + j0, ldc, acc);
}

/* dst[c][r] = src[r][c] for a rows × cols src (row strides lds, ldd); exact, so the AVX form
 * (8×8 blocks in registers, at the AVX2 and AVX-512 levels) gives the same bits as the
 * portable loop. */
static void transpose_c(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int r0, int r1, int c0,
                        int c1) {
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

static void transpose(const nl_host_kernels *ks, float *restrict dst, size_t ldd, const float *restrict src, size_t lds,
                      int rows, int cols) {
    if (ks->gdn_transpose8) { /* the whole 8×8 blocks in registers, the edges here */
        const int R8 = rows & ~7, C8 = cols & ~7;
        ks->gdn_transpose8(dst, ldd, src, lds, rows, cols);
        transpose_c(dst, ldd, src, lds, 0, R8, C8, cols);
        transpose_c(dst, ldd, src, lds, R8, rows, 0, cols);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16)
            transpose_c(dst, ldd, src, lds, r0, r0 + 16 < rows ? r0 + 16 : rows, c0, c0 + 16 < cols ? c0 + 16 : cols);
}

/* y = silu(x), d = silu'(x) over n from one sigmoid, cpu/vecmath.h's nl_fsigmoid (its
 * polynomial exp): portable in 8-lane blocks as nn/mlp.c's SwiGLU; with AVX-512 (AVX2) the
 * same operations of nl_fexp 16 (8) lanes at a time (no FMA, its integer exponent and masks),
 * so the same bits. The SIMD kernels do the whole vectors of n and return how many they did;
 * the portable loop does the rest. One body for both widths (B, L as GDN_STEP4's). */
static void silu_d_row(const nl_host_kernels *ks, float *restrict y, float *restrict d, const float *restrict x,
                       int n) {
    int i0 = ks->gdn_silu_d ? ks->gdn_silu_d(y, d, x, n) : 0;
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

/* q̂ and k̂ rows of a chunk: dst_r = silu(src_r) / max(||silu(src_r)||, eps), ds_r = silu'(src_r)
 * (rows r < m; dst, ds of stride n; src_r = src[r % half] + r / half * ko: the chunk's q rows,
 * then its k rows, ko floats further, stride lds); nrm_r = ||silu(src_r)||. (The backward's own
 * recomputation: within an ulp or two of silu_l2.) */
static void silu_l2_d_rows(const nl_host_kernels *ks, float *restrict dst, float *restrict ds, const float *src,
                           size_t lds, size_t ko, int half, int n, float eps, float *nrm) {
    double ss[2 * CH];
    for (int r = 0; r < 2 * half; r++)
        silu_d_row(ks, dst + (size_t)r * n, ds + (size_t)r * n, src + (size_t)(r % half) * lds + (r < half ? 0 : ko),
                   n);
    sumsq_all(ss, dst, (size_t)n, 2 * half, n);
    for (int r = 0; r < 2 * half; r++) {
        float *d = dst + (size_t)r * n;
        nrm[r] = (float)sqrt(ss[r]);
        const float inv = 1.0f / (nrm[r] > eps ? nrm[r] : eps);
        GDN_EACH(i, n, d[i] *= inv);
    }
}

/* The gated RMSNorm's backward of a chunk's m rows: given o (pre-norm), z and dy, writes dz and
 * d_o. d_o, o: stride ld; dz, z, dy: stride ldz. Each row's sums of squares and products in
 * double as one row's loop, four rows' chains side by side. */
static void gated_norm_backward_rows(const nl_host_kernels *ks, float *restrict d_o, float *restrict dz,
                                     const float *restrict o, size_t ld, const float *restrict z,
                                     const float *restrict nw, const float *restrict dy, size_t ldz, int m, int dv,
                                     float eps) {
    double ss[CH], gd[CH];
    float rstd[CH];
    sumsq_all(ss, o, ld, m, dv);
    for (int r = 0; r < m; r++) {
        float *dor = d_o + (size_t)r * ld, *dzr = dz + (size_t)r * ldz;
        const float *orow = o + (size_t)r * ld, *dyr = dy + (size_t)r * ldz, rs = (float)(1.0 / sqrt(ss[r] / dv + eps));
        rstd[r] = rs;
        silu_d_row(ks, dor, dzr, z + (size_t)r * ldz, dv); /* silu(z), silu'(z) */
        GDN_EACH(c, dv, dzr[c] = dyr[c] * orow[c] * rs * nw[c] * dzr[c]; dor[c] = dyr[c] * nw[c] * dor[c]);
    }
    for (int r = 0; r < m; r += 4) {
        const int w = m - r < 4 ? m - r : 4;
        if (w == 4) dotd4(gd + r, d_o + (size_t)r * ld, o + (size_t)r * ld, ld, dv);
        else
            for (int l = r; l < r + w; l++) {
                double g = 0.0;
                for (int c = 0; c < dv; c++) g += (double)d_o[(size_t)l * ld + c] * o[(size_t)l * ld + c];
                gd[l] = g;
            }
    }
    for (int r = 0; r < m; r++) {
        float *dor = d_o + (size_t)r * ld;
        const float *orow = o + (size_t)r * ld, rs = rstd[r];
        const float f = (float)(gd[r] * rs * rs / dv);
        GDN_EACH(c, dv, dor[c] = rs * (dor[c] - orow[c] * f));
    }
}

/* Per-thread backward scratch (floats): G = Hv/Hk carried gradients dS, the transposed
 * checkpoint and dS, and the chunk's rows. The C×C matrices live on the stack. */
typedef struct {
    float *dS, *S0T, *dST;                /* [G][dk][dv], [dv][dk], [dv][dk] */
    float *QK, *dQK, *dsQK, *KT, *Z;      /* [2C][dk] q̂ then k̂ rows, their gradient, silu'; [dk][C]; [C][dk] */
    float *PW, *dPW, *DOX;                /* [2C][dv]: Q S0 then K S0; their gradients; dO' then dX */
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
    int T;
    const nl_host_kernels *ks; /* the kernel set (nl_cpu_kernels) */
} bwd_job;

/* A chunk's per-token decays and gates and its decayed 16×16 matrices (value head j); entries
 * outside the stated triangles are 0 (the products below run over full n×n blocks). */
typedef struct {
    float al[CH], be[CH], gam[CH];           /* α_i, β_i, γ_i = α_0···α_i */
    float E[CH][CH], Lm[CH][CH], Mq[CH][CH]; /* E_im = α_{m+1}···α_i; L_im (m < i); Mq_im (m <= i) */
    float X[CH][CH];                         /* (I + diag(β) L)⁻¹, unit lower triangular */
} chunk_m;

/* From g, β ([T][Hv]) and the chunk's Gram matrix [Q; K] Kᵀ ([2n][C]: q̂_i·k̂_m, then k̂_i·k̂_m). */
static void chunk_mats(chunk_m *M, const float *g, const float *beta, int Hv, int j, int t0, int n, const float *Gram) {
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
static void chunk_uo(const nl_host_kernels *ks, const chunk_m *M, int n, int dv, float scale, const float *V,
                     size_t ldv, const float *P, const float *W, float *R, float *U, float *O, size_t ldo) {
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
    mm(ks, n, dv, n, &XB[0][0], CH, 1, R, (size_t)dv, U, (size_t)dv, 0);
    mm(ks, n, dv, n, &M->Mq[0][0], CH, 1, U, (size_t)dv, O, ldo, 1);
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
    const int Hk = s->Hk, Hv = s->Hv, dk = s->dk, dv = s->dv;
    const nl_host_kernels *ks = J->ks;
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
        silu_d_row(ks, b->V + (size_t)i * dv, b->dsV + (size_t)i * dv, cache->cpre + (size_t)(t0 + i) * cd + voff, dv);
    /* forward: P = Q S0, W = K S0; U, O; then dO' = scale dO through the gated norm */
    if (S0) mm(ks, 2 * n, dv, dk, b->QK, (size_t)dk, 1, S0, (size_t)dv, b->PW, (size_t)dv, 0);
    chunk_uo(ks, &M, n, dv, scale, b->V, (size_t)dv, S0 ? P : NULL, W, b->R, b->U, b->O, (size_t)dv);
    {
        const size_t o = (size_t)t0 * vd + (size_t)j * dv;
        gated_norm_backward_rows(ks, DO, J->dz + o, b->O, (size_t)dv, cache->z + o, J->w->norm, J->dy + o, vd, n, dv,
                                 s->eps);
    }
    for (int i = 0; i < n; i++) {
        float *dov = DO + (size_t)i * dv;
        GDN_EACH(c, dv, dov[c] *= scale);
        dgam[i] = S0 ? dot(P + (size_t)i * dv, dov, dv) : 0.0f;
        GDN_EACH(c, dv, dP[(size_t)i * dv + c] = gam[i] * dov[c]);
    }
    /* dU = diag(d) K dS + Mqkᵀ dO'; Z = diag(d) U dSᵀ (d_m = E[n-1][m]) */
    transpose(ks, b->UT, CH, b->U, (size_t)dv, n, dv);
    if (live) {
        mm(ks, n, dv, dk, Kc, (size_t)dk, 1, dS, (size_t)dv, b->dU, (size_t)dv, 0);
        transpose(ks, b->dST, (size_t)dk, dS, (size_t)dv, dk, dv);
        mm(ks, n, dk, dv, b->U, (size_t)dv, 1, b->dST, (size_t)dk, b->Z, (size_t)dk, 0);
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
    mm(ks, n, dv, n, &M.Mq[0][0], 1, CH, DO, (size_t)dv, b->dU, (size_t)dv, 1); /* += Mqᵀ dO' */
    /* dX = (I + diag(β) L)⁻ᵀ dU = Xᵀ dU */
    mm(ks, n, dv, n, &M.X[0][0], 1, CH, b->dU, (size_t)dv, dX, (size_t)dv, 0);
    /* [dO'; dX] Uᵀ: dMqk (i >= m) and −dA (m < i) */
    mm(ks, 2 * n, n, dv, b->DOX, (size_t)dv, 1, b->UT, CH, &DXU[0][0], CH, 0);
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
    mm(ks, 2 * n, dk, 2 * n, &DD[0][0], 2 * CH, 1, b->QK, (size_t)dk, b->dQK, (size_t)dk, 1);
    if (S0) {
        transpose(ks, b->S0T, (size_t)dk, S0, (size_t)dv, dk, dv);
        mm(ks, 2 * n, dk, dv, b->dPW, (size_t)dv, 1, b->S0T, (size_t)dk, b->dQK, (size_t)dk, 1);
    }
    if (live)
        for (int m = 0; m < n; m++) GDN_EACH(r, dk, dK[(size_t)m * dk + r] += b->Z[(size_t)m * dk + r]);
    /* dS0 = γ_{n-1} dS + Qᵀ dP + Kᵀ dW */
    if (S0) {
        const size_t hs = (size_t)dk * dv;
        if (live) GDN_EACH(e, dk * dv, dS[e] *= gam[n - 1]);
        else memset(dS, 0, sizeof(float) * hs);
        mm(ks, dk, dv, 2 * n, b->QK, 1, (size_t)dk, b->dPW, (size_t)dv, dS, (size_t)dv, 1);
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
    const int T = J->T;
    const nl_host_kernels *ks = J->ks;
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
            silu_l2_d_rows(ks, b.QK, b.dsQK, cache->cpre + (size_t)t0 * cd + qoff, (size_t)cd, koff - qoff, n, dk,
                           s->eps, nrm);
            transpose(ks, b.KT, CH, b.QK + (size_t)n * dk, (size_t)dk, n, dk);
            mm(ks, 2 * n, n, dk, b.QK, (size_t)dk, 1, b.KT, CH, Gram, CH, 0);
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

static int gdn_backward_run(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w,
                            const nl_gdn_cache *cache, const float *dy, int T, float *dmixed, float *dz, float *db,
                            float *da) {
    if (check_shape(s) || check_weights(w, 0)) return -1;
    if (!cache) return nl_err("gdn: NULL cache");
    if (!same_shape(s, &cache->shape)) return nl_err("gdn: cache was made for another shape");
    if (cache->T < 1 || T != cache->T)
        return nl_err("gdn: backward over %d tokens, but the cache holds a forward of %d", T, cache->T);
    if (!dy || !dmixed || !dz || !db || !da) return nl_err("gdn: NULL gradient pointer");
    const int cd = nl_gdn_conv_dim(s);
    int nh = n_tasks_for(pool, s->Hk), nc = n_tasks_for(pool, cd);
    const size_t n_work = (size_t)bwd_work_floats(s) * (size_t)nh, K = (size_t)s->K;
    nl_arena_mark m = {0};
    float *scratch = tmp_get(ws, &m, n_work + K * (size_t)cd);
    if (!scratch) return -1;
    float *wt = scratch + n_work;
    conv_wt(wt, w->conv, cd, s->K); /* (dmixed: every element is written by bwd_heads_task) */
    bwd_job J = {.s = s,
                 .w = w,
                 .cache = cache,
                 .dy = dy,
                 .dmixed = dmixed,
                 .dz = dz,
                 .db = db,
                 .da = da,
                 .scratch = scratch,
                 .wt = wt,
                 .T = T,
                 .ks = nl_cpu_kernels()};
    run_tasks(pool, nh, bwd_heads_task, &J);
    run_tasks(pool, nc, bwd_conv_task, &J);
    tmp_put(ws, m, scratch);
    return 0;
}

int nl_gdn_backward(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w,
                    const nl_gdn_cache *cache, const float *dy, int T, float *dmixed, float *dz, float *db, float *da) {
    nl_fpmode m = nl_fpmode_flush();
    int rc = gdn_backward_run(pool, ws, s, w, cache, dy, T, dmixed, dz, db, da);
    nl_fpmode_restore(m);
    return rc;
}

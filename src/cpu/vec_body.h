/* cpu/vec_body: the element-wise nodes' bodies (cpu/kernels.h: nl_vec_kernels), ONE source
 * for every row: included by cpu/vec.c (the portable build: the scalar row, and the Arm rows,
 * whose baseline has NEON), cpu/vec_avx2.c and cpu/vec_avx512.c (those get their ISA's flags
 * from the file-name rule, CMakeLists.txt). Define NL_VEC_ISA (the name suffix: portable, avx2,
 * avx512) and include this once; it defines static functions <name>_<isa> and the table
 * nl_vec_kernels_<isa>. A file with its own body for an entry (cpu/vec_neon.c) defines
 * NL_VEC_OWN_<name> and that <name>_<isa> before including this: the entry is then its own, every
 * other entry this source's.
 *
 * The same bits in every row: the loops are cpu/vecmath.h's 8-lane shapes (a reduction's order
 * is fixed by its 8 partial sums, never by the vector width), and -std=c11 turns off FMA
 * contraction, so a body built with -mavx2 -mfma rounds every product and sum exactly as the
 * portable one; only the width of the instructions differs. */
#ifndef NL_VEC_ISA
#error "define NL_VEC_ISA before including cpu/vec_body.h"
#endif

#include <math.h>
#include <stdint.h>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

#define NL_VEC_CAT2(a, b) a##_##b
#define NL_VEC_CAT(a, b) NL_VEC_CAT2(a, b)
#define NL_VEC_FN(f) NL_VEC_CAT(f, NL_VEC_ISA)

/* ---- nn/norm.c: RMSNorm, one row ---- */

#ifndef NL_VEC_OWN_rmsnorm_row
static float NL_VEC_FN(rmsnorm_row)(float *y, const float *x, const float *w, int n, float eps) {
    const double ms = (double)nl_vdot(x, x, n) / (double)n;
    const float rs = (float)(1.0 / sqrt(ms + (double)eps));
    /* 8-lane blocks with the inputs in locals (y may alias x): a plain loop of unknown length
     * stays scalar at -O2 (vecmath.h); each element's arithmetic is the plain loop's */
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES) {
        float xv[NL_LANES], wv[NL_LANES], r[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) xv[l] = x[i + l], wv[l] = w[i + l];
        for (int l = 0; l < NL_LANES; l++) r[l] = wv[l] * (xv[l] * rs);
        for (int l = 0; l < NL_LANES; l++) y[i + l] = r[l];
    }
    for (; i < n; i++) y[i] = w[i] * (x[i] * rs);
    return rs;
}
#endif

#ifndef NL_VEC_OWN_rmsnorm_bwd_row
static void NL_VEC_FN(rmsnorm_bwd_row)(float *dx, const float *dy, const float *x, const float *w, float rs, int n) {
    /* g·x = Σ dy·w·x with 8 partial sums */
    float acc[NL_LANES] = {0};
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) acc[l] += dy[i + l] * w[i + l] * x[i + l];
    float gx = 0.0f;
    for (; i < n; i++) gx += dy[i] * w[i] * x[i];
    gx += nl_lanes_sum(acc);
    const float c = gx * rs * rs / (float)n;
    /* dx may alias dy: 8-lane blocks read into locals first */
    for (i = 0; i + NL_LANES <= n; i += NL_LANES) {
        float g[NL_LANES], wv[NL_LANES], xv[NL_LANES], r[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) g[l] = dy[i + l], wv[l] = w[i + l], xv[l] = x[i + l];
        for (int l = 0; l < NL_LANES; l++) r[l] = rs * (g[l] * wv[l] - xv[l] * c);
        for (int l = 0; l < NL_LANES; l++) dx[i + l] = r[l];
    }
    for (; i < n; i++) dx[i] = rs * (dy[i] * w[i] - x[i] * c);
}
#endif

/* ---- nn/mlp.c: SwiGLU and the sigmoid gate. 8-lane blocks (inputs loaded into locals,
 * results computed, then stored: outputs may alias inputs elementwise and gcc -O2 still
 * vectorises, see vecmath.h). Full blocks read and write the arrays directly; the last partial
 * block goes through zero-padded copies (a copy of a variable length inside every block made
 * gcc call memcpy per block: 8x slower). Each element's arithmetic is the same either way. ---- */

/* one block: y = f(a, b) (y2 = second output, c = third input where the node has them) */
#define NL_VEC_BLOCKS2(n, y, a, b, BODY8)                                                                              \
    do {                                                                                                               \
        int64_t i0_ = 0;                                                                                               \
        for (; i0_ + NL_LANES <= (n); i0_ += NL_LANES) BODY8((y) + i0_, (a) + i0_, (b) + i0_);                         \
        if (i0_ < (n)) {                                                                                               \
            const int w_ = (int)((n)-i0_);                                                                             \
            float ta_[NL_LANES] = {0}, tb_[NL_LANES] = {0}, ty_[NL_LANES];                                             \
            for (int l = 0; l < w_; l++) ta_[l] = (a)[i0_ + l], tb_[l] = (b)[i0_ + l];                                 \
            BODY8(ty_, ta_, tb_);                                                                                      \
            for (int l = 0; l < w_; l++) (y)[i0_ + l] = ty_[l];                                                        \
        }                                                                                                              \
    } while (0)
#define NL_VEC_BLOCKS3(n, y, y2, c, a, b, BODY8)                                                                       \
    do {                                                                                                               \
        int64_t i0_ = 0;                                                                                               \
        for (; i0_ + NL_LANES <= (n); i0_ += NL_LANES) BODY8((y) + i0_, (y2) + i0_, (c) + i0_, (a) + i0_, (b) + i0_);  \
        if (i0_ < (n)) {                                                                                               \
            const int w_ = (int)((n)-i0_);                                                                             \
            float ta_[NL_LANES] = {0}, tb_[NL_LANES] = {0}, tc_[NL_LANES] = {0}, ty_[NL_LANES], ty2_[NL_LANES];        \
            for (int l = 0; l < w_; l++) ta_[l] = (a)[i0_ + l], tb_[l] = (b)[i0_ + l], tc_[l] = (c)[i0_ + l];          \
            BODY8(ty_, ty2_, tc_, ta_, tb_);                                                                           \
            for (int l = 0; l < w_; l++) (y)[i0_ + l] = ty_[l], (y2)[i0_ + l] = ty2_[l];                               \
        }                                                                                                              \
    } while (0)

#ifndef NL_VEC_OWN_swiglu_fwd
static inline void NL_VEC_FN(swiglu_fwd8)(float *h, const float *a, const float *b) {
    float x[NL_LANES], y[NL_LANES], r[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) x[l] = a[l], y[l] = b[l];
    for (int l = 0; l < NL_LANES; l++) r[l] = x[l] * nl_fsigmoid(x[l]) * y[l];
    for (int l = 0; l < NL_LANES; l++) h[l] = r[l];
}
static void NL_VEC_FN(swiglu_fwd)(float *h, const float *a, const float *b, int64_t n) {
    NL_VEC_BLOCKS2(n, h, a, b, NL_VEC_FN(swiglu_fwd8));
}
#endif

#ifndef NL_VEC_OWN_swiglu_bwd
static inline void NL_VEC_FN(swiglu_bwd8)(float *da, float *db, const float *dh, const float *a, const float *b) {
    float x[NL_LANES], y[NL_LANES], g[NL_LANES], ra[NL_LANES], rb[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) x[l] = a[l], y[l] = b[l], g[l] = dh[l];
    for (int l = 0; l < NL_LANES; l++) {
        const float sg = nl_fsigmoid(x[l]);
        ra[l] = g[l] * y[l] * sg * (1.0f + x[l] * (1.0f - sg));
        rb[l] = g[l] * x[l] * sg;
    }
    for (int l = 0; l < NL_LANES; l++) da[l] = ra[l], db[l] = rb[l];
}
static void NL_VEC_FN(swiglu_bwd)(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    NL_VEC_BLOCKS3(n, da, db, dh, a, b, NL_VEC_FN(swiglu_bwd8));
}
#endif

#ifndef NL_VEC_OWN_gate_fwd
static inline void NL_VEC_FN(gate_fwd8)(float *out, const float *o, const float *g) {
    float x[NL_LANES], z[NL_LANES], r[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) x[l] = o[l], z[l] = g[l];
    for (int l = 0; l < NL_LANES; l++) r[l] = x[l] * nl_fsigmoid(z[l]);
    for (int l = 0; l < NL_LANES; l++) out[l] = r[l];
}
static void NL_VEC_FN(gate_fwd)(float *out, const float *o, const float *g, int64_t n) {
    NL_VEC_BLOCKS2(n, out, o, g, NL_VEC_FN(gate_fwd8));
}
#endif

#ifndef NL_VEC_OWN_gate_bwd
static inline void NL_VEC_FN(gate_bwd8)(float *d_o, float *dg, const float *dout, const float *o, const float *g) {
    float x[NL_LANES], z[NL_LANES], dy[NL_LANES], ro[NL_LANES], rg[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) x[l] = o[l], z[l] = g[l], dy[l] = dout[l];
    for (int l = 0; l < NL_LANES; l++) {
        const float sg = nl_fsigmoid(z[l]);
        ro[l] = dy[l] * sg;
        rg[l] = dy[l] * x[l] * sg * (1.0f - sg);
    }
    for (int l = 0; l < NL_LANES; l++) d_o[l] = ro[l], dg[l] = rg[l];
}
static void NL_VEC_FN(gate_bwd)(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n) {
    NL_VEC_BLOCKS3(n, d_o, dg, dout, o, g, NL_VEC_FN(gate_bwd8));
}
#endif

/* ---- nn/xent.c: one target row of logits z[V] (target y, 0 <= y < V) ---- */

#define NL_VEC_XCH 1024 /* exp is evaluated in chunks of this many logits (stack scratch) */

#ifndef NL_VEC_OWN_xent_row
static double NL_VEC_FN(xent_row)(float *z, int y, int V, float inv_n, int want_grad) {
    float e[NL_VEC_XCH];
    /* the max in 8 lanes (the same value as a sequential scan; only the sign of a zero max
     * could follow the order, and z − m, exp and lse = m + log Σ do not see it) */
    float mx[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) mx[l] = z[0];
    int jm = 0;
    for (; jm + NL_LANES <= V; jm += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) mx[l] = z[jm + l] > mx[l] ? z[jm + l] : mx[l];
    float m = z[0];
    for (int l = 0; l < NL_LANES; l++) m = mx[l] > m ? mx[l] : m;
    for (; jm < V; jm++) m = z[jm] > m ? z[jm] : m;
    /* Σ exp(z − m): 8-lane float partials per chunk, chunks summed in double. With want_grad
     * the exponentials are kept in z (one exp pass, not two): z[y] is read first. */
    const float zy = z[y];
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += NL_VEC_XCH) {
        const int nc = V - j0 < NL_VEC_XCH ? V - j0 : NL_VEC_XCH;
        float *ev = want_grad ? z + j0 : e;
        /* z − m, its exp and the 8 partial sums in one pass (each the separate passes' value) */
        float acc[NL_LANES] = {0};
        int j = 0;
        for (; j + NL_LANES <= nc; j += NL_LANES) {
            float t[NL_LANES];
            for (int l = 0; l < NL_LANES; l++) t[l] = nl_fexp(z[j0 + j + l] - m);
            for (int l = 0; l < NL_LANES; l++) ev[j + l] = t[l];
            for (int l = 0; l < NL_LANES; l++) acc[l] += t[l];
        }
        double part = 0.0;
        for (; j < nc; j++) {
            ev[j] = nl_fexp(z[j0 + j] - m);
            part += ev[j];
        }
        for (int l = 0; l < NL_LANES; l++) part += acc[l];
        sum += part;
    }
    const double lse = (double)m + log(sum);
    if (want_grad) {
        /* softmax·inv_n = exp(z − m) · (inv_n / Σ) */
        const float c = (float)((double)inv_n / sum);
        nl_vscale(z, c, V);
        z[y] -= inv_n;
    }
    return lse - (double)zy;
}
#endif

/* ---- nn/rope.c: pairs c0 .. c0+nc-1 of every head of one token x[n_heads][hd], rotated by
 * (cs[j], sn[j]); NEOX pairs (i, i + half), NORM pairs (2i, 2i+1) ---- */

#ifndef NL_VEC_OWN_rope_rotate
static void NL_VEC_FN(rope_rotate)(float *x, int n_heads, int hd, int half, int c0, int nc, const float *cs,
                                   const float *sn, int neox) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        if (neox) {
            float *a = xh + c0, *b = xh + c0 + half;
            int j = 0;
            for (; j + NL_LANES <= nc; j += NL_LANES) { /* 8-lane blocks (vecmath.h), the plain loop's arithmetic */
                float x0[NL_LANES], x1[NL_LANES], r0[NL_LANES], r1[NL_LANES];
                for (int l = 0; l < NL_LANES; l++) x0[l] = a[j + l], x1[l] = b[j + l];
                for (int l = 0; l < NL_LANES; l++) {
                    r0[l] = x0[l] * cs[j + l] - x1[l] * sn[j + l];
                    r1[l] = x0[l] * sn[j + l] + x1[l] * cs[j + l];
                }
                for (int l = 0; l < NL_LANES; l++) a[j + l] = r0[l], b[j + l] = r1[l];
            }
            for (; j < nc; j++) {
                float x0 = a[j], x1 = b[j];
                a[j] = x0 * cs[j] - x1 * sn[j];
                b[j] = x0 * sn[j] + x1 * cs[j];
            }
        } else {
            float *a = xh + 2 * c0;
            int j = 0;
            for (; j + NL_LANES <= nc; j += NL_LANES) {
                float x0[NL_LANES], x1[NL_LANES], r0[NL_LANES], r1[NL_LANES];
                for (int l = 0; l < NL_LANES; l++) x0[l] = a[2 * (j + l)], x1[l] = a[2 * (j + l) + 1];
                for (int l = 0; l < NL_LANES; l++) {
                    r0[l] = x0[l] * cs[j + l] - x1[l] * sn[j + l];
                    r1[l] = x0[l] * sn[j + l] + x1[l] * cs[j + l];
                }
                for (int l = 0; l < NL_LANES; l++) a[2 * (j + l)] = r0[l], a[2 * (j + l) + 1] = r1[l];
            }
            for (; j < nc; j++) {
                float x0 = a[2 * j], x1 = a[2 * j + 1];
                a[2 * j] = x0 * cs[j] - x1 * sn[j];
                a[2 * j + 1] = x0 * sn[j] + x1 * cs[j];
            }
        }
    }
}
#endif

/* ---- nn/attention.c's FP32 softmax rows ---- */

#ifndef NL_VEC_OWN_att_exp_sum
/* sr[j] = exp(sr[j] − m) for j < nv; returns Σ (8 partial sums, fixed order). */
static float NL_VEC_FN(att_exp_sum)(float *sr, int nv, float m) {
    float acc[NL_LANES] = {0};
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES) {
        float t[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) t[l] = nl_fexp(sr[j + l] - m);
        for (int l = 0; l < NL_LANES; l++) {
            sr[j + l] = t[l];
            acc[l] += t[l];
        }
    }
    float tail = 0.0f;
    for (; j < nv; j++) {
        sr[j] = nl_fexp(sr[j] - m);
        tail += sr[j];
    }
    return nl_lanes_sum(acc) + tail;
}
#endif

#ifndef NL_VEC_OWN_att_row_bwd
/* p = exp(s·c − L) into sr, ds = p·(dp − D)·c into dpr, for j < nv; both 0 in [nv, n). */
static void NL_VEC_FN(att_row_bwd)(float *sr, float *dpr, int nv, int n, float c, float L, float D) {
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES) {
        float p[NL_LANES], ds[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) p[l] = nl_fexp(sr[j + l] * c - L);
        for (int l = 0; l < NL_LANES; l++) ds[l] = p[l] * (dpr[j + l] - D) * c;
        for (int l = 0; l < NL_LANES; l++) {
            sr[j + l] = p[l];
            dpr[j + l] = ds[l];
        }
    }
    for (; j < nv; j++) {
        const float p = nl_fexp(sr[j] * c - L);
        sr[j] = p;
        dpr[j] = p * (dpr[j] - D) * c;
    }
    for (j = nv; j < n; j++) sr[j] = dpr[j] = 0.0f;
}
#endif

#ifndef NL_VEC_OWN_att_exp_bf16
static float NL_VEC_FN(att_exp_bf16)(uint16_t *pa, const float *sr, int nv, int np, float c, float m) {
    float acc[NL_LANES] = {0};
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES) {
        float t[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) t[l] = nl_fexp(sr[j + l] * c - m);
        for (int l = 0; l < NL_LANES; l++) {
            pa[j + l] = nl_amx_f32_to_bf16(t[l]);
            acc[l] += t[l];
        }
    }
    float tail = 0.0f;
    for (; j < nv; j++) {
        const float t = nl_fexp(sr[j] * c - m);
        pa[j] = nl_amx_f32_to_bf16(t);
        tail += t;
    }
    for (; j < np; j++) pa[j] = 0;
    return nl_lanes_sum(acc) + tail;
}
#endif

#ifndef NL_VEC_OWN_att_bwd_bf16
/* 8-key blocks: each row's values as att_row_bwd's lanes (a block inside nv) or elements */
static void NL_VEC_FN(att_bwd_bf16)(uint16_t *const da[2], uint32_t *dsw, uint32_t *pw, const float *const sr[2],
                                    const float *const dp[2], const int nv[2], int np, float c, const float L[2],
                                    const float D[2]) {
    for (int j = 0; j < np; j += NL_LANES) {
        const int nb = np - j < NL_LANES ? np - j : NL_LANES;
        float p[2][NL_LANES], ds[2][NL_LANES];
        for (int r = 0; r < 2; r++) {
            if (j + NL_LANES <= nv[r]) {
                for (int l = 0; l < NL_LANES; l++) p[r][l] = nl_fexp(sr[r][j + l] * c - L[r]);
                for (int l = 0; l < NL_LANES; l++) ds[r][l] = p[r][l] * (dp[r][j + l] - D[r]) * c;
            } else {
                for (int l = 0; l < NL_LANES; l++) {
                    p[r][l] = j + l < nv[r] ? nl_fexp(sr[r][j + l] * c - L[r]) : 0.0f;
                    ds[r][l] = j + l < nv[r] ? p[r][l] * (dp[r][j + l] - D[r]) * c : 0.0f;
                }
            }
        }
        for (int l = 0; l < nb; l++) {
            const uint16_t d0 = nl_amx_f32_to_bf16(ds[0][l]), d1 = nl_amx_f32_to_bf16(ds[1][l]);
            da[0][j + l] = d0, da[1][j + l] = d1;
            dsw[j + l] = (uint32_t)d0 | (uint32_t)d1 << 16;
            pw[j + l] = (uint32_t)nl_amx_f32_to_bf16(p[0][l]) | (uint32_t)nl_amx_f32_to_bf16(p[1][l]) << 16;
        }
    }
}
#endif

/* ---- the memory-bound passes (nn/par.c's residual adds, nn/lora.c's dropout products) ---- */

static void NL_VEC_FN(add)(float *restrict y, const float *restrict x, int64_t n) { nl_vadd(y, x, n); }
static void NL_VEC_FN(add2)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    nl_vadd2(y, a, b, n);
}
static void NL_VEC_FN(mul)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    nl_vmul(y, a, b, n);
}
static void NL_VEC_FN(muladd)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    nl_vmuladd(y, a, b, n);
}

const nl_vec_kernels NL_VEC_FN(nl_vec_kernels) = {
    .rmsnorm_row = NL_VEC_FN(rmsnorm_row),
    .rmsnorm_bwd_row = NL_VEC_FN(rmsnorm_bwd_row),
    .swiglu_fwd = NL_VEC_FN(swiglu_fwd),
    .swiglu_bwd = NL_VEC_FN(swiglu_bwd),
    .gate_fwd = NL_VEC_FN(gate_fwd),
    .gate_bwd = NL_VEC_FN(gate_bwd),
    .xent_row = NL_VEC_FN(xent_row),
    .att_exp_sum = NL_VEC_FN(att_exp_sum),
    .att_row_bwd = NL_VEC_FN(att_row_bwd),
    .att_exp_bf16 = NL_VEC_FN(att_exp_bf16),
    .att_bwd_bf16 = NL_VEC_FN(att_bwd_bf16),
    .rope_rotate = NL_VEC_FN(rope_rotate),
    .add = NL_VEC_FN(add),
    .add2 = NL_VEC_FN(add2),
    .mul = NL_VEC_FN(mul),
    .muladd = NL_VEC_FN(muladd),
};

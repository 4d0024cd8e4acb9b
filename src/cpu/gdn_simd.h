/* cpu/gdn_simd.h: the GDN node's (nn/gdn.c) state step and SiLU kernels, one body for both
 * vector widths, instantiated by gdn_avx512.c (B = 512, L = 16) and gdn_avx2.c (256, 8): the
 * same multiplies and adds in the same order as the node's portable forms (separate, no FMA:
 * the files' flags allow FMA, but -std=c11 contracts nothing and the bodies call no FMA
 * intrinsic), so every width gives the same bits. Include after <immintrin.h>. */
#ifndef NL_CPU_GDN_SIMD_H
#define NL_CPU_GDN_SIMD_H

#include <stddef.h>

/* step_c on four vectors of columns (64 with AVX-512, 32 with AVX2), p and o held in four
 * registers each: the same multiplies and adds in the same order as step_c (separate, no FMA),
 * so the same bits. One body for both: B is the vector width in bits (the intrinsics' _mmB_
 * prefix, the type __mB), L the floats in a vector. */
#define GDN_V(B, op) _mm##B##_##op
#define GDN_STEP4(name, B, L)                                                                                          \
    void name(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q, float alpha,   \
              float beta, float scale, int dk, float *restrict u, float *r_out, float *restrict o) {                   \
        const __m##B va = GDN_V(B, set1_ps)(alpha);                                                                    \
        __m##B p0 = GDN_V(B, setzero_ps)(), p1 = p0, p2 = p0, p3 = p0;                                                 \
        for (int i = 0; i < dk; i++) {                                                                                 \
            const float *sp = S_prev + (size_t)i * ld;                                                                 \
            float *sd = S + (size_t)i * ld;                                                                            \
            const __m##B kk = GDN_V(B, set1_ps)(k[i]);                                                                 \
            const __m##B x0 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp));                                            \
            const __m##B x1 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + L));                                        \
            const __m##B x2 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + 2 * L));                                    \
            const __m##B x3 = GDN_V(B, mul_ps)(va, GDN_V(B, loadu_ps)(sp + 3 * L));                                    \
            GDN_V(B, storeu_ps)(sd, x0);                                                                               \
            GDN_V(B, storeu_ps)(sd + L, x1);                                                                           \
            GDN_V(B, storeu_ps)(sd + 2 * L, x2);                                                                       \
            GDN_V(B, storeu_ps)(sd + 3 * L, x3);                                                                       \
            p0 = GDN_V(B, add_ps)(p0, GDN_V(B, mul_ps)(kk, x0));                                                       \
            p1 = GDN_V(B, add_ps)(p1, GDN_V(B, mul_ps)(kk, x1));                                                       \
            p2 = GDN_V(B, add_ps)(p2, GDN_V(B, mul_ps)(kk, x2));                                                       \
            p3 = GDN_V(B, add_ps)(p3, GDN_V(B, mul_ps)(kk, x3));                                                       \
        }                                                                                                              \
        const __m##B vb = GDN_V(B, set1_ps)(beta);                                                                     \
        const __m##B r0 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v), p0);                                                 \
        const __m##B r1 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + L), p1);                                             \
        const __m##B r2 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 2 * L), p2);                                         \
        const __m##B r3 = GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 3 * L), p3);                                         \
        if (r_out) {                                                                                                   \
            GDN_V(B, storeu_ps)(r_out, r0);                                                                            \
            GDN_V(B, storeu_ps)(r_out + L, r1);                                                                        \
            GDN_V(B, storeu_ps)(r_out + 2 * L, r2);                                                                    \
            GDN_V(B, storeu_ps)(r_out + 3 * L, r3);                                                                    \
        }                                                                                                              \
        const __m##B u0 = GDN_V(B, mul_ps)(vb, r0), u1 = GDN_V(B, mul_ps)(vb, r1);                                     \
        const __m##B u2 = GDN_V(B, mul_ps)(vb, r2), u3 = GDN_V(B, mul_ps)(vb, r3);                                     \
        GDN_V(B, storeu_ps)(u, u0);                                                                                    \
        GDN_V(B, storeu_ps)(u + L, u1);                                                                                \
        GDN_V(B, storeu_ps)(u + 2 * L, u2);                                                                            \
        GDN_V(B, storeu_ps)(u + 3 * L, u3);                                                                            \
        __m##B o0 = GDN_V(B, setzero_ps)(), o1 = o0, o2 = o0, o3 = o0;                                                 \
        for (int i = 0; i < dk; i++) {                                                                                 \
            float *sd = S + (size_t)i * ld;                                                                            \
            const __m##B kk = GDN_V(B, set1_ps)(k[i]), qq = GDN_V(B, set1_ps)(q[i]);                                   \
            const __m##B x0 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd), GDN_V(B, mul_ps)(kk, u0));                      \
            const __m##B x1 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + L), GDN_V(B, mul_ps)(kk, u1));                  \
            const __m##B x2 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + 2 * L), GDN_V(B, mul_ps)(kk, u2));              \
            const __m##B x3 = GDN_V(B, add_ps)(GDN_V(B, loadu_ps)(sd + 3 * L), GDN_V(B, mul_ps)(kk, u3));              \
            GDN_V(B, storeu_ps)(sd, x0);                                                                               \
            GDN_V(B, storeu_ps)(sd + L, x1);                                                                           \
            GDN_V(B, storeu_ps)(sd + 2 * L, x2);                                                                       \
            GDN_V(B, storeu_ps)(sd + 3 * L, x3);                                                                       \
            o0 = GDN_V(B, add_ps)(o0, GDN_V(B, mul_ps)(qq, x0));                                                       \
            o1 = GDN_V(B, add_ps)(o1, GDN_V(B, mul_ps)(qq, x1));                                                       \
            o2 = GDN_V(B, add_ps)(o2, GDN_V(B, mul_ps)(qq, x2));                                                       \
            o3 = GDN_V(B, add_ps)(o3, GDN_V(B, mul_ps)(qq, x3));                                                       \
        }                                                                                                              \
        const __m##B vs = GDN_V(B, set1_ps)(scale);                                                                    \
        GDN_V(B, storeu_ps)(o, GDN_V(B, mul_ps)(o0, vs));                                                              \
        GDN_V(B, storeu_ps)(o + L, GDN_V(B, mul_ps)(o1, vs));                                                          \
        GDN_V(B, storeu_ps)(o + 2 * L, GDN_V(B, mul_ps)(o2, vs));                                                      \
        GDN_V(B, storeu_ps)(o + 3 * L, GDN_V(B, mul_ps)(o3, vs));                                                      \
    }

/* The state step over n consecutive tokens of one block of four vectors of columns (in place,
 * no r_out), one sweep over the rows per token: the rows hold X = α_t S_{t-1} (step_c's first
 * pass stores the same), and token t's sweep makes S_t = X + k_t u_tᵀ, o_t += q_t·S_t and stores
 * α_{t+1} S_t while it sums token t+1's p += k_{t+1}·(α_{t+1} S_t) (step_c's first pass of the
 * next token); the last token stores S_t itself. Each row is loaded and stored once per token
 * instead of twice, with the same multiplies and adds in the same order as step_c token after
 * token, so the same bits. Token t reads k = K + t·ldkq, q = Q + t·ldkq, v = V + t·ldv, α =
 * expf(g[t·ldg]) (libm's, as the node), β = be[t·ldg], and writes o = O + t·ldo. Needs
 * <math.h>. */
#define GDN_SC_LD(B, j) GDN_V(B, loadu_ps)(sd + (j)*lanes)
#define GDN_SC_ST(B, j, x) GDN_V(B, storeu_ps)(sd + (j)*lanes, x)
#define GDN_SC_ADD(B, a, x, y) a = GDN_V(B, add_ps)(a, GDN_V(B, mul_ps)(x, y))
/* one row of token t's sweep: s_j = X_j + k u_j; o_j += q s_j; then NEXT (y = α' s, stored, p_j
 * += k' y) or the last token's store of s */
#define GDN_SC_ROW(B, NEXT)                                                                                            \
    const __m##B kk = GDN_V(B, set1_ps)(k[i]), qq = GDN_V(B, set1_ps)(q[i]);                                           \
    const __m##B s0 = GDN_V(B, add_ps)(GDN_SC_LD(B, 0), GDN_V(B, mul_ps)(kk, u0));                                     \
    const __m##B s1 = GDN_V(B, add_ps)(GDN_SC_LD(B, 1), GDN_V(B, mul_ps)(kk, u1));                                     \
    const __m##B s2 = GDN_V(B, add_ps)(GDN_SC_LD(B, 2), GDN_V(B, mul_ps)(kk, u2));                                     \
    const __m##B s3 = GDN_V(B, add_ps)(GDN_SC_LD(B, 3), GDN_V(B, mul_ps)(kk, u3));                                     \
    GDN_SC_ADD(B, o0, qq, s0);                                                                                         \
    GDN_SC_ADD(B, o1, qq, s1);                                                                                         \
    GDN_SC_ADD(B, o2, qq, s2);                                                                                         \
    GDN_SC_ADD(B, o3, qq, s3);                                                                                         \
    NEXT
#define GDN_SC_NEXT(B)                                                                                                 \
    const __m##B kx = GDN_V(B, set1_ps)(kn[i]);                                                                        \
    const __m##B y0 = GDN_V(B, mul_ps)(van, s0), y1 = GDN_V(B, mul_ps)(van, s1);                                       \
    const __m##B y2 = GDN_V(B, mul_ps)(van, s2), y3 = GDN_V(B, mul_ps)(van, s3);                                       \
    GDN_SC_ST(B, 0, y0);                                                                                               \
    GDN_SC_ST(B, 1, y1);                                                                                               \
    GDN_SC_ST(B, 2, y2);                                                                                               \
    GDN_SC_ST(B, 3, y3);                                                                                               \
    GDN_SC_ADD(B, p0, kx, y0);                                                                                         \
    GDN_SC_ADD(B, p1, kx, y1);                                                                                         \
    GDN_SC_ADD(B, p2, kx, y2);                                                                                         \
    GDN_SC_ADD(B, p3, kx, y3);
#define GDN_SC_LAST(B)                                                                                                 \
    GDN_SC_ST(B, 0, s0);                                                                                               \
    GDN_SC_ST(B, 1, s1);                                                                                               \
    GDN_SC_ST(B, 2, s2);                                                                                               \
    GDN_SC_ST(B, 3, s3);
#define GDN_SCAN4(name, B, L)                                                                                          \
    void name(float *S, size_t ld, int dk, int n, const float *K, const float *Q, size_t ldkq, const float *V,         \
              size_t ldv, const float *g, const float *be, size_t ldg, float scale, float *O, size_t ldo) {            \
        if (n < 1) return;                                                                                             \
        const size_t lanes = L;                                                                                        \
        __m##B p0 = GDN_V(B, setzero_ps)(), p1 = p0, p2 = p0, p3 = p0;                                                 \
        { /* token 0's first pass: X = α_0 S, p = k_0·X */                                                           \
            const __m##B va = GDN_V(B, set1_ps)(expf(g[0]));                                                           \
            for (int i = 0; i < dk; i++) {                                                                             \
                float *sd = S + (size_t)i * ld;                                                                        \
                const __m##B kk = GDN_V(B, set1_ps)(K[i]);                                                             \
                const __m##B x0 = GDN_V(B, mul_ps)(va, GDN_SC_LD(B, 0)), x1 = GDN_V(B, mul_ps)(va, GDN_SC_LD(B, 1));   \
                const __m##B x2 = GDN_V(B, mul_ps)(va, GDN_SC_LD(B, 2)), x3 = GDN_V(B, mul_ps)(va, GDN_SC_LD(B, 3));   \
                GDN_SC_ST(B, 0, x0);                                                                                   \
                GDN_SC_ST(B, 1, x1);                                                                                   \
                GDN_SC_ST(B, 2, x2);                                                                                   \
                GDN_SC_ST(B, 3, x3);                                                                                   \
                GDN_SC_ADD(B, p0, kk, x0);                                                                             \
                GDN_SC_ADD(B, p1, kk, x1);                                                                             \
                GDN_SC_ADD(B, p2, kk, x2);                                                                             \
                GDN_SC_ADD(B, p3, kk, x3);                                                                             \
            }                                                                                                          \
        }                                                                                                              \
        for (int t = 0; t < n; t++) {                                                                                  \
            const float *k = K + (size_t)t * ldkq, *q = Q + (size_t)t * ldkq, *v = V + (size_t)t * ldv;                \
            const __m##B vb = GDN_V(B, set1_ps)(be[(size_t)t * ldg]);                                                  \
            const __m##B u0 = GDN_V(B, mul_ps)(vb, GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v), p0));                       \
            const __m##B u1 = GDN_V(B, mul_ps)(vb, GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + L), p1));                   \
            const __m##B u2 = GDN_V(B, mul_ps)(vb, GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 2 * L), p2));               \
            const __m##B u3 = GDN_V(B, mul_ps)(vb, GDN_V(B, sub_ps)(GDN_V(B, loadu_ps)(v + 3 * L), p3));               \
            __m##B o0 = GDN_V(B, setzero_ps)(), o1 = o0, o2 = o0, o3 = o0;                                             \
            p0 = o0, p1 = o0, p2 = o0, p3 = o0;                                                                        \
            if (t + 1 < n) {                                                                                           \
                const float *kn = k + ldkq;                                                                            \
                const __m##B van = GDN_V(B, set1_ps)(expf(g[(size_t)(t + 1) * ldg]));                                  \
                for (int i = 0; i < dk; i++) {                                                                         \
                    float *sd = S + (size_t)i * ld;                                                                    \
                    GDN_SC_ROW(B, GDN_SC_NEXT(B))                                                                      \
                }                                                                                                      \
            } else {                                                                                                   \
                for (int i = 0; i < dk; i++) {                                                                         \
                    float *sd = S + (size_t)i * ld;                                                                    \
                    GDN_SC_ROW(B, GDN_SC_LAST(B))                                                                      \
                }                                                                                                      \
            }                                                                                                          \
            float *o = O + (size_t)t * ldo;                                                                            \
            const __m##B vs = GDN_V(B, set1_ps)(scale);                                                                \
            GDN_V(B, storeu_ps)(o, GDN_V(B, mul_ps)(o0, vs));                                                          \
            GDN_V(B, storeu_ps)(o + L, GDN_V(B, mul_ps)(o1, vs));                                                      \
            GDN_V(B, storeu_ps)(o + 2 * L, GDN_V(B, mul_ps)(o2, vs));                                                  \
            GDN_V(B, storeu_ps)(o + 3 * L, GDN_V(B, mul_ps)(o3, vs));                                                  \
        }                                                                                                              \
    }

#define GDN_I(B, op) _mm##B##_##op##_si##B /* the integer bitwise ops: _mm512_and_si512 */
#define GDN_SILU(name, B, L)                                                                                           \
    int name(float *y, float *d, const float *x, int n) {                                                              \
        const __m##B one = GDN_V(B, set1_ps)(1.0f), big = GDN_V(B, set1_ps)(12582912.0f);                              \
        const __m##B##i sign = GDN_V(B, set1_epi32)((int)0x80000000u), i127 = GDN_V(B, set1_epi32)(127);               \
        const __m##B##i i1 = GDN_V(B, set1_epi32)(1), i255 = GDN_V(B, set1_epi32)(255);                                \
        int i = 0;                                                                                                     \
        for (; i + L <= n; i += L) {                                                                                   \
            const __m##B xv = GDN_V(B, loadu_ps)(x + i);                                                               \
            const __m##B nx = GDN_V(B, castsi##B##_ps)(GDN_I(B, xor)(GDN_V(B, castps_si##B)(xv), sign)); /* -x */      \
            const __m##B t = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(nx, GDN_V(B, set1_ps)(1.44269504088896341f)), big);     \
            const __m##B nn = GDN_V(B, sub_ps)(t, big);                                                                \
            __m##B r = GDN_V(B, sub_ps)(nx, GDN_V(B, mul_ps)(nn, GDN_V(B, set1_ps)(0.693145751953125f)));              \
            r = GDN_V(B, sub_ps)(r, GDN_V(B, mul_ps)(nn, GDN_V(B, set1_ps)(1.42860682030941723e-06f)));                \
            __m##B p = GDN_V(B, set1_ps)(1.98756915e-4f);                                                              \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(1.39819337e-3f));                           \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(8.33345205e-3f));                           \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(4.16657962e-2f));                           \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(1.66666657e-1f));                           \
            p = GDN_V(B, add_ps)(GDN_V(B, mul_ps)(p, r), GDN_V(B, set1_ps)(5.0e-1f));                                  \
            p = GDN_V(B, add_ps)(GDN_V(B, add_ps)(GDN_V(B, mul_ps)(GDN_V(B, mul_ps)(p, r), r), r), one);               \
            const __m##B##i tb = GDN_V(B, castps_si##B)(t);                                                            \
            const __m##B##i ea = GDN_I(B, and)(tb, GDN_V(B, set1_epi32)(0x7FFFFFFF));                                  \
            const __m##B##i e = GDN_V(B, add_epi32)(GDN_V(B, sub_epi32)(ea, GDN_V(B, set1_epi32)(0x4B400000)), i127);  \
            const __m##B##i neg = GDN_V(B, srai_epi32)(tb, 31);                                                        \
            const __m##B##i lo =                                                                                       \
                GDN_I(B, andnot)(neg, GDN_I(B, andnot)(GDN_V(B, srai_epi32)(GDN_V(B, sub_epi32)(e, i1), 31),           \
                                                       GDN_V(B, set1_epi32)(-1)));                                     \
            const __m##B##i hi = GDN_I(B, or)(GDN_V(B, srai_epi32)(GDN_V(B, sub_epi32)(e, i255), 31), neg);            \
            const __m##B##i eb = GDN_V(B, slli_epi32)(GDN_I(B, and)(GDN_I(B, and)(e, lo), hi), 23);                    \
            const __m##B##i yb = GDN_V(B, castps_si##B)(GDN_V(B, mul_ps)(p, GDN_V(B, castsi##B##_ps)(eb)));            \
            const __m##B##i ex = GDN_I(B, or)(GDN_I(B, and)(GDN_I(B, and)(yb, lo), hi),                                \
                                              GDN_I(B, andnot)(hi, GDN_V(B, set1_epi32)(0x7F800000)));                 \
            const __m##B sg = GDN_V(B, div_ps)(one, GDN_V(B, add_ps)(one, GDN_V(B, castsi##B##_ps)(ex)));              \
            GDN_V(B, storeu_ps)(y + i, GDN_V(B, mul_ps)(xv, sg));                                                      \
            GDN_V(B, storeu_ps)                                                                                        \
            (d + i, GDN_V(B, mul_ps)(sg, GDN_V(B, add_ps)(one, GDN_V(B, mul_ps)(xv, GDN_V(B, sub_ps)(one, sg)))));     \
        }                                                                                                              \
        return i;                                                                                                      \
    }

#endif

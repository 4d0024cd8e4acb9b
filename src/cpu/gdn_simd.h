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

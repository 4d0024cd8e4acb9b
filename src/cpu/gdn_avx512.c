/* cpu/gdn_avx512: the GDN node's kernels on AVX-512 F (nn/gdn.c's contracts: the same bits as its
 * portable forms): the state step on 64 columns, SiLU and its derivative 16 lanes at a time, and
 * the chunk products mm() in register blocks of 4 rows × 64 columns. Built with the AVX-512
 * flags (the file's name), only on x86-64; the AVX-512 kernel set's gdn_* entries.
 *
 * mm(): out[i][j] (+)= Σ_l A[i][l] B[l][j] with each element's sum in ascending l, one
 * multiply and one add per term (no FMA), starting from 0 or from out. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/gdn_simd.h"
#include "cpu/kernels.h"

GDN_STEP4(nl_gdn_step64_avx512, 512, 16)
GDN_SCAN4(nl_gdn_scan64_avx512, 512, 16)
GDN_SILU(nl_gdn_silu_d_avx512, 512, 16)

/* Register blocks: 4 or 1 rows × 4 or 1 vectors of 16 columns (masks m[v] for the columns);
 * the accumulators are named variables so that they stay in registers. */
#define MM_LD(r, v) (acc ? _mm512_maskz_loadu_ps(m##v, Cm + (size_t)(r)*ldc + 16 * (v)) : _mm512_setzero_ps())
#define MM_ST(r, v, x) _mm512_mask_storeu_ps(Cm + (size_t)(r)*ldc + 16 * (v), m##v, x)
#define MM_UP(x, a, b) x = _mm512_add_ps(x, _mm512_mul_ps(a, b))
#define MM_ARGS                                                                                                        \
    int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm, size_t ldc, int acc,        \
        const __mmask16 *mk

static void mm_4x64(MM_ARGS) {
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

static void mm_1x64(MM_ARGS) {
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

static void mm_4x16(MM_ARGS) {
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

static void mm_1x16(MM_ARGS) {
    const __mmask16 m0 = mk[0];
    __m512 c00 = MM_LD(0, 0);
    (void)ars;
    for (int l = 0; l < Kd; l++)
        MM_UP(c00, _mm512_set1_ps(A[(size_t)l * acs]), _mm512_maskz_loadu_ps(m0, B + (size_t)l * ldb));
    MM_ST(0, 0, c00);
}

static __mmask16 cols_mask(int w) { return w >= 16 ? (__mmask16)0xFFFF : w > 0 ? (__mmask16)((1u << w) - 1) : 0; }

int nl_gdn_mm_avx512(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb,
                     float *Cm, size_t ldc, int acc) {
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
            (w > 16 ? mm_4x64 : mm_4x16)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0, ldc,
                                         acc, m);
        for (; i < M; i++)
            (w > 16 ? mm_1x64 : mm_1x16)(Kd, A + (size_t)i * ars, ars, acs, B + j0, ldb, Cm + (size_t)i * ldc + j0, ldc,
                                         acc, m);
        j0 += w;
    }
    return N;
}

/* y = x / (1 + expf(-x)) (nn/gdn.c's silu_row) 16 lanes at a time, with glibc's expf (2.28 and
 * later: sysdeps/ieee754/flt-32/e_expf.c, the FMA build the x86-64 and AArch64 libms run)
 * computed as that code does, in double, 8 lanes at a time: the same fused multiply-adds,
 * table (exp2f_data.c, N = 32) and rounding, so the same bits as the libm call (tests/test_gdn
 * checks it against the libm it links). A vector with an input outside expf's fast path
 * (|x| >= 88, NaN) calls libm lane by lane. Returns the elements done (whole vectors). */
static const uint64_t exp2f_tab[32] = {0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
                                       0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
                                       0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
                                       0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
                                       0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
                                       0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
                                       0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
                                       0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

static inline __m512d expf_fast8(__m512d xd, const __m512i *tab) {
    const __m512d inv = _mm512_set1_pd(0x1.71547652b82fep+5), shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kd);
    const __m512d r = _mm512_fmsub_pd(inv, xd, _mm512_sub_pd(kd, shift));
    const __m512i ix = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    const __m512i lo = _mm512_permutex2var_epi64(tab[0], ix, tab[1]),
                  hi = _mm512_permutex2var_epi64(tab[2], ix, tab[3]);
    const __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ix, _mm512_set1_epi64(16)), lo, hi);
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-20), r, _mm512_set1_pd(0x1.ebfce50fac4f3p-13));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.62e42ff0c52d6p-6), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_mul_pd(y, s);
}

int nl_gdn_silu_avx512(float *y, const float *x, int n) {
    const __m512i tab[4] = {_mm512_loadu_si512(exp2f_tab), _mm512_loadu_si512(exp2f_tab + 8),
                            _mm512_loadu_si512(exp2f_tab + 16), _mm512_loadu_si512(exp2f_tab + 24)};
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        const __m512i nb = _mm512_xor_si512(_mm512_castps_si512(xv), _mm512_set1_epi32((int)0x80000000u));
        const __m512i top = _mm512_and_si512(_mm512_srli_epi32(nb, 20), _mm512_set1_epi32(0x7ff));
        if (_mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a))) {
            for (int l = 0; l < 16; l++) y[i + l] = x[i + l] / (1.0f + expf(-x[i + l]));
            continue;
        }
        const __m512 nx = _mm512_castsi512_ps(nb);
        const __m256 e0 = _mm512_cvtpd_ps(expf_fast8(_mm512_cvtps_pd(_mm512_castps512_ps256(nx)), tab));
        const __m256 e1 = _mm512_cvtpd_ps(
            expf_fast8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(nx), 1))), tab));
        const __m512 e =
            _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(e0)), _mm256_castps_pd(e1), 1));
        _mm512_storeu_ps(y + i, _mm512_div_ps(xv, _mm512_add_ps(one, e)));
    }
    return i;
}

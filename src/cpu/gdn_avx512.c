/* cpu/gdn_avx512: the GDN node's kernels on AVX-512 F (nn/gdn.c's contracts: the same bits as its
 * portable forms): the state step on 64 columns, SiLU and its derivative 16 lanes at a time, and
 * the chunk products mm() in register blocks of 4 rows × 64 columns. Built with the AVX-512
 * flags (the file's name), only on x86-64; the AVX-512 kernel set's gdn_* entries.
 *
 * mm(): out[i][j] (+)= Σ_l A[i][l] B[l][j] with each element's sum in ascending l, one
 * multiply and one add per term (no FMA), starting from 0 or from out. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/gdn_simd.h"
#include "cpu/kernels.h"

GDN_STEP4(nl_gdn_step64_avx512, 512, 16)
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

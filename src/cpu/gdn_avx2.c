/* cpu/gdn_avx2: the GDN node's kernels on AVX2 without FMA (nn/gdn.c's contracts: the same bits
 * as its portable forms): the state step on 32 columns, SiLU and its derivative 8 lanes at a time,
 * the chunk products in register blocks, the 8×8 transposes. Built with the AVX2 flags (the file's
 * name), only on x86-64; the AVX2 kernel set's gdn_* entries, and the AVX-512 set's transpose. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/gdn_simd.h"
#include "cpu/kernels.h"

/* (AVX2 has 16 registers: four vectors of p/o and of u leave room; eight would not) */
GDN_STEP4(nl_gdn_step32_avx2, 256, 8)
GDN_SILU(nl_gdn_silu_d_avx2, 256, 8)

/* AVX2 (no FMA): register blocks of 4 or 1 rows × 16 or 8 columns, unmasked; the last < 8
 * columns are left to the caller's mm_c (every element is summed on its own, so any split
 * gives the same bits): returns the columns done. */
#define M2_LD(r, v) (acc ? _mm256_loadu_ps(Cm + (size_t)(r)*ldc + 8 * (v)) : _mm256_setzero_ps())
#define M2_ST(r, v, x) _mm256_storeu_ps(Cm + (size_t)(r)*ldc + 8 * (v), x)
#define M2_UP(x, a, b) x = _mm256_add_ps(x, _mm256_mul_ps(a, b))
#define M2_ARGS                                                                                                        \
    int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm, size_t ldc, int acc

static void mm2_4x16(M2_ARGS) {
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

static void mm2_1x16(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0), c01 = M2_LD(0, 1);
    (void)ars;
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb;
        const __m256 x = _mm256_set1_ps(A[(size_t)l * acs]);
        M2_UP(c00, x, _mm256_loadu_ps(b)), M2_UP(c01, x, _mm256_loadu_ps(b + 8));
    }
    M2_ST(0, 0, c00), M2_ST(0, 1, c01);
}

static void mm2_4x8(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0), c10 = M2_LD(1, 0), c20 = M2_LD(2, 0), c30 = M2_LD(3, 0);
    for (int l = 0; l < Kd; l++) {
        const __m256 b0 = _mm256_loadu_ps(B + (size_t)l * ldb);
        const float *a = A + (size_t)l * acs;
        M2_UP(c00, _mm256_set1_ps(a[0]), b0), M2_UP(c10, _mm256_set1_ps(a[ars]), b0);
        M2_UP(c20, _mm256_set1_ps(a[2 * ars]), b0), M2_UP(c30, _mm256_set1_ps(a[3 * ars]), b0);
    }
    M2_ST(0, 0, c00), M2_ST(1, 0, c10), M2_ST(2, 0, c20), M2_ST(3, 0, c30);
}

static void mm2_1x8(M2_ARGS) {
    __m256 c00 = M2_LD(0, 0);
    (void)ars;
    for (int l = 0; l < Kd; l++) M2_UP(c00, _mm256_set1_ps(A[(size_t)l * acs]), _mm256_loadu_ps(B + (size_t)l * ldb));
    M2_ST(0, 0, c00);
}

int nl_gdn_mm_avx2(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm,
                   size_t ldc, int acc) {
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
    return j0; /* the last < 8 columns: the node's portable mm_c */
}

/* dst[c][r] = src[r][c] on the whole 8×8 blocks (rows & ~7, cols & ~7); the caller does the edges. */
void nl_gdn_transpose8_avx2(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int rows,
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
}

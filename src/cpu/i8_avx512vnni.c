/* cpu/i8_avx512vnni: the int8 FWD row on AVX512_VNNI (vpdpbusd zmm; contract: kernels.h, "the
 * int8 FWD rows"). A micro-tile is MR <= 6 rows × 32 columns: 12 int32 group accumulators (each
 * started from BC, the -128·Σq correction) and 12 float accumulators; per group the sums go to
 * float once and meet the scales in the contract's order, so the bits are the scalar row's. */
#include <immintrin.h>

#include "cpu/kernels.h"

static inline __attribute__((always_inline)) void ukr(const int mr, int kc, int gs, const uint8_t *A, int64_t lda,
                                                      const float *DX, const float *SX, int64_t ldd, const uint32_t *B,
                                                      const int32_t *BC, const float *SW, const float *MW, float *C,
                                                      int64_t ldc, int ncols, int accumulate) {
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << (ncols > 0 ? ncols : 0)) - 1u);
    const int n1 = ncols - 16;
    const __mmask16 m1 = n1 >= 16 ? 0xffff : (__mmask16)((1u << (n1 > 0 ? n1 : 0)) - 1u);
    __m512 f0[6], f1[6];
    _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
        if (accumulate) {
            f0[i] = _mm512_maskz_loadu_ps(m0, C + i * ldc);
            f1[i] = _mm512_maskz_loadu_ps(m1, C + i * ldc + 16);
        } else {
            f0[i] = _mm512_setzero_ps();
            f1[i] = _mm512_setzero_ps();
        }
    }
    const int ng = kc / gs, rq = gs / 4;
    for (int g = 0; g < ng; g++) {
        const __m512i c0 = _mm512_loadu_si512(BC + g * NL_HOST_NP), c1 = _mm512_loadu_si512(BC + g * NL_HOST_NP + 16);
        __m512i s0[6], s1[6];
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) s0[i] = c0, s1[i] = c1;
        const uint32_t *b = B + (int64_t)g * rq * NL_HOST_NP;
        const uint8_t *a = A + g * gs;
        for (int r = 0; r < rq; r++) {
            const __m512i b0 = _mm512_loadu_si512(b + r * NL_HOST_NP), b1 = _mm512_loadu_si512(b + r * NL_HOST_NP + 16);
            _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
                int32_t av;
                __builtin_memcpy(&av, a + i * lda + 4 * r, 4);
                const __m512i x = _mm512_set1_epi32(av);
                s0[i] = _mm512_dpbusd_epi32(s0[i], x, b0);
                s1[i] = _mm512_dpbusd_epi32(s1[i], x, b1);
            }
        }
        const __m512 w0 = _mm512_loadu_ps(SW + g * NL_HOST_NP), w1 = _mm512_loadu_ps(SW + g * NL_HOST_NP + 16);
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            const __m512 dx = _mm512_set1_ps(DX[i * ldd + g]);
            f0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[i]), _mm512_mul_ps(w0, dx), f0[i]);
            f1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[i]), _mm512_mul_ps(w1, dx), f1[i]);
        }
        if (MW) {
            const __m512 v0 = _mm512_loadu_ps(MW + g * NL_HOST_NP), v1 = _mm512_loadu_ps(MW + g * NL_HOST_NP + 16);
            _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
                const __m512 sx = _mm512_set1_ps(SX[i * ldd + g]);
                f0[i] = _mm512_fmadd_ps(v0, sx, f0[i]);
                f1[i] = _mm512_fmadd_ps(v1, sx, f1[i]);
            }
        }
    }
    _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(C + i * ldc, m0, f0[i]);
        _mm512_mask_storeu_ps(C + i * ldc + 16, m1, f1[i]);
    }
}

static void gemm_i8_fwd(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate) {
    for (int s = 0; s < NL_HOST_NP && s < ncols; s += 32) {
        const uint32_t *b = B + s;
        const int32_t *bc = BC + s;
        const float *sw = SW + s, *mw = MW ? MW + s : NULL;
        const int nc = ncols - s;
        int i = 0;
        for (; i + 6 <= m; i += 6)
            ukr(6, kc, gs, A + i * lda, lda, DX + i * ldd, SX ? SX + i * ldd : NULL, ldd, b, bc, sw, mw, C + i * ldc + s, ldc,
                nc, accumulate);
        const uint8_t *a = A + i * lda;
        const float *dx = DX + i * ldd, *sx = SX ? SX + i * ldd : NULL;
        float *c = C + i * ldc + s;
        switch (m - i) {
        case 1: ukr(1, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
        case 2: ukr(2, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
        case 3: ukr(3, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
        case 4: ukr(4, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
        case 5: ukr(5, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
        default: break;
        }
    }
}

const nl_i8_kernels nl_i8_kernels_avx512vnni = {.name = "avx512vnni", .gemm_i8_fwd = gemm_i8_fwd};

/* cpu/kernels_avx2: AVX2 + FMA + F16C kernel set (f32 compute only). Built with -mavx2 -mfma
 * -mf16c; the dispatcher (dispatch.c) hands it out only after cpuid says so. 16 ymm registers: 6 rows of T × 2 vectors
 * (16 columns) of accumulators, four such strips per 64-column panel. */
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#include <string.h>

#include "cpu/kernels.h"

#define MR 6
#define AI __attribute__((always_inline)) static inline

static void y_dq_f16(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = nl_host_f16_to_f32(src[i]);
}

static void y_dq_q8_0(const nl_block_q8_0 *src, float *dst, int nblocks) {
    for (int b = 0; b < nblocks; b++) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(src[b].d));
        for (int j = 0; j < 32; j += 8) {
            __m128i q8;
            memcpy(&q8, src[b].qs + j, 8); /* low 8 bytes used */
            const __m256i q = _mm256_cvtepi8_epi32(q8);
            _mm256_storeu_ps(dst + 32 * b + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

/* Q5_0: as kernels_avx512.c's z_dq_q5_0, 8 lanes at a time (the fifth bits by variable shifts). */
static void y_dq_q5_0(const uint8_t *src, float *dst, int nblocks) {
    const __m256i low4 = _mm256_set1_epi32(0x0f), one = _mm256_set1_epi32(1), b16 = _mm256_set1_epi32(16);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int b = 0; b < nblocks; b++, src += 22) {
        uint16_t h;
        uint32_t qh;
        memcpy(&h, src, 2);
        memcpy(&qh, src + 2, 4);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        for (int j = 0; j < 16; j += 8) {
            const __m256i qs = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + 6 + j)));
            const __m256i h0 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> j)), lane), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> (j + 16))), lane), one);
            const __m256i q0 =
                _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(qs, low4), _mm256_slli_epi32(h0, 4)), b16);
            const __m256i q1 =
                _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(qs, 4), _mm256_slli_epi32(h1, 4)), b16);
            _mm256_storeu_ps(dst + 32 * b + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q0), d));
            _mm256_storeu_ps(dst + 32 * b + 16 + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q1), d));
        }
    }
}

/* 8×8 32-bit transposes (unpack, shuffle, 128-bit lane swap); dst[c*ldd + r] = src[r*lds + c]. */
static void y_transpose32(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += 8) {
        int c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) {
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(src + (r0 + i) * lds + c0));
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int g = 0; g < 8; g += 4) {
                u[g + 0] = _mm256_shuffle_ps(t[g + 0], t[g + 2], 0x44);
                u[g + 1] = _mm256_shuffle_ps(t[g + 0], t[g + 2], 0xEE);
                u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
                u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
            }
            for (int c = 0; c < 4; c++) {
                _mm256_storeu_ps((float *)(dst + (c0 + c) * ldd + r0), _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
                _mm256_storeu_ps((float *)(dst + (c0 + c + 4) * ldd + r0),
                                 _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
            }
        }
        for (; c0 < cols; c0++)
            for (int i = 0; i < 8; i++) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
    }
}

AI void ukr(const int mr, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
            int accumulate) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int p = 0; p < kc; p++) {
        const float *b = B + (size_t)p * NL_HOST_NP;
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            const __m256 a = _mm256_broadcast_ss(A + i * lda + p);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
    if (ncols >= 16) {
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            float *c = C + i * ldc;
            __m256 v0 = acc[i][0], v1 = acc[i][1];
            if (accumulate) {
                v0 = _mm256_add_ps(_mm256_loadu_ps(c), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(c + 8), v1);
            }
            _mm256_storeu_ps(c, v0);
            _mm256_storeu_ps(c + 8, v1);
        }
    } else {
        float tmp[16];
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) { /* constant bounds keep acc in registers */
            if (i >= mr) break;
            float *c = C + i * ldc;
            _mm256_storeu_ps(tmp, acc[i][0]);
            _mm256_storeu_ps(tmp + 8, acc[i][1]);
            for (int j = 0; j < ncols; j++) c[j] = accumulate ? c[j] + tmp[j] : tmp[j];
        }
    }
}

NL_HOST_GEMM_F32_6ROWS(y_gemm_f32, ukr)

const nl_host_kernels nl_host_kernels_avx2 = {
    .name = "avx2",
    .has_bf16 = 0,
    .dq_f16 = y_dq_f16,
    .dq_q8_0 = y_dq_q8_0,
    .gemm_f32 = y_gemm_f32,
    .transpose32 = y_transpose32,
    .dq_q5_0 = y_dq_q5_0,
    .gemm_nn = nl_gemm_nn_avx2,
    .dot_rows = nl_dot_rows_avx2,
    .gdn_step_cols = 32,
    .gdn_step = nl_gdn_step32_avx2,
    .gdn_mm = nl_gdn_mm_avx2,
    .gdn_transpose8 = nl_gdn_transpose8_avx2,
    .gdn_silu_d = nl_gdn_silu_d_avx2,
    .vec = &nl_vec_kernels_avx2,
};
#endif

/* cpu/gemm_neon: the nodes' small FP32 GEMM (cpu/gemm.c's contract) and the row dots on AArch64
 * (Advanced SIMD is always there): the fused chains of the x86 AVX2 kernel, 4×8 register blocks
 * of FMLA by element (8 q accumulators, k increasing from C or 0) and scalar FMADD chains at the
 * edges, so its bits are x86-64's. Built only on aarch64 (the file's name); the NEON kernel
 * set's gemm_nn and dot_rows. */
#include <arm_neon.h>
#include <stdint.h>

#include "cpu/kernels.h"

/* One element: the fused chain from s (k increasing), one FMADD per k. */
static inline float chain_fma(float s, const float *a, int64_t a_cs, const float *b, int64_t ldb, int K) {
    for (int k = 0; k < K; k++) s = __builtin_fmaf(a[k * a_cs], b[(int64_t)k * ldb], s);
    return s;
}

/* Rows m..m+R-1 (R <= 4) × columns n..n+7: R×2 q accumulators of FMLA by element. */
#define NEON_BLOCK(R)                                                                                                  \
    do {                                                                                                               \
        float32x4_t c[4][2];                                                                                           \
        for (int i = 0; i < (R); i++) {                                                                                \
            c[i][0] = acc ? vld1q_f32(cr + (int64_t)i * ldc) : vdupq_n_f32(0.0f);                                      \
            c[i][1] = acc ? vld1q_f32(cr + (int64_t)i * ldc + 4) : vdupq_n_f32(0.0f);                                  \
        }                                                                                                              \
        const float *b = B + n;                                                                                        \
        for (int k = 0; k < K; k++, b += ldb) {                                                                        \
            const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);                                                \
            for (int i = 0; i < (R); i++) {                                                                            \
                const float x = am[i * a_rs + k * a_cs];                                                               \
                c[i][0] = vfmaq_n_f32(c[i][0], b0, x);                                                                 \
                c[i][1] = vfmaq_n_f32(c[i][1], b1, x);                                                                 \
            }                                                                                                          \
        }                                                                                                              \
        for (int i = 0; i < (R); i++) {                                                                                \
            vst1q_f32(cr + (int64_t)i * ldc, c[i][0]);                                                                 \
            vst1q_f32(cr + (int64_t)i * ldc + 4, c[i][1]);                                                             \
        }                                                                                                              \
    } while (0)

void nl_gemm_nn_neon(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                     int N, int K, int acc) {
    for (int m = 0; m < M; m += 4) {
        const int R = M - m < 4 ? M - m : 4;
        const float *am = A + m * a_rs;
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            float *cr = C + (int64_t)m * ldc + n;
            switch (R) { /* constant trip counts: the accumulators stay in registers */
            case 4: NEON_BLOCK(4); break;
            case 3: NEON_BLOCK(3); break;
            case 2: NEON_BLOCK(2); break;
            default: NEON_BLOCK(1); break;
            }
        }
        for (; n < N; n++)
            for (int i = 0; i < R; i++) {
                float *c = C + (int64_t)(m + i) * ldc + n;
                *c = chain_fma(acc ? *c : 0.0f, am + i * a_rs, a_cs, B + n, ldb, K);
            }
    }
}
#undef NEON_BLOCK

void nl_dot_rows_neon(float *out, const float *A, int lda, const float *B, int ldb, int n, int K) {
    for (int i = 0; i < n; i++) out[i] = chain_fma(0.0f, A + (int64_t)i * lda, 1, B + (int64_t)i * ldb, 1, K);
}

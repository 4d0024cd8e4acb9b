/* cpu/kernels_neon: AArch64 NEON kernel set (f32 compute; Advanced SIMD is baseline on
 * AArch64, so no run-time check). 32 q registers: 6 rows of T × 4 vectors (16 columns) of
 * accumulators, four such strips per 64-column panel. Compiled only on aarch64 (CMake marks
 * the file header-only elsewhere; the guard keeps it empty if compiled anyway). */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "cpu/kernels.h"

#define MR 6
#define AI __attribute__((always_inline)) static inline

void nl_neon_dq_f16(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        uint16x4_t h = vld1_u16(src + i);
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(h))); /* exact widening */
    }
    for (; i < n; i++) dst[i] = nl_host_f16_to_f32(src[i]);
}

void nl_neon_dq_q8_0(const nl_block_q8_0 *src, float *dst, int nblocks) {
    for (int b = 0; b < nblocks; b++) {
        const float d = nl_host_f16_to_f32(src[b].d);
        for (int j = 0; j < 32; j += 8) {
            int16x8_t q = vmovl_s8(vld1_s8(src[b].qs + j));
            float32x4_t lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
            float32x4_t hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(q)));
            vst1q_f32(dst + 32 * b + j, vmulq_n_f32(lo, d));
            vst1q_f32(dst + 32 * b + j + 4, vmulq_n_f32(hi, d));
        }
    }
}

AI void ukr(const int mr, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
            int accumulate) {
    float32x4_t acc[MR][4];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[i][r] = vdupq_n_f32(0.0f);
    for (int p = 0; p < kc; p++) {
        const float *b = B + (size_t)p * NL_HOST_NP;
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);
        const float32x4_t b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            const float a = A[i * lda + p];
            acc[i][0] = vfmaq_n_f32(acc[i][0], b0, a);
            acc[i][1] = vfmaq_n_f32(acc[i][1], b1, a);
            acc[i][2] = vfmaq_n_f32(acc[i][2], b2, a);
            acc[i][3] = vfmaq_n_f32(acc[i][3], b3, a);
        }
    }
    float tmp[16];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) { /* constant bounds keep acc in registers */
        if (i >= mr) break;
        float *c = C + i * ldc;
        if (ncols >= 16) {
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                float32x4_t v = acc[i][r];
                if (accumulate) v = vaddq_f32(vld1q_f32(c + 4 * r), v);
                vst1q_f32(c + 4 * r, v);
            }
        } else {
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) vst1q_f32(tmp + 4 * r, acc[i][r]);
            for (int j = 0; j < ncols; j++) c[j] = accumulate ? c[j] + tmp[j] : tmp[j];
        }
    }
}

NL_HOST_GEMM_F32_6ROWS(n_gemm_f32, ukr)

void nl_neon_gemm_f32(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
                      int accumulate) {
    n_gemm_f32(m, kc, A, lda, B, C, ldc, ncols, accumulate);
}

const nl_host_kernels nl_host_kernels_neon = {
    .name = "neon",
    .has_bf16 = 0,
    .dq_f16 = nl_neon_dq_f16,
    .dq_q8_0 = nl_neon_dq_q8_0,
    .gemm_f32 = nl_neon_gemm_f32,
    .gemm_nn = nl_gemm_nn_neon,
    .dot_rows = nl_dot_rows_neon,
    .gdn_step_cols = 32,
    .gdn_step = nl_gdn_step32_neon,
    .gdn_mm = nl_gdn_mm_neon,
    .gdn_transpose8 = nl_gdn_transpose8_neon,
    .gdn_silu_d = nl_gdn_silu_d_neon,
    .vec = &nl_vec_kernels_neon,
};
#else
typedef int nl_kernels_neon_empty; /* ISO C: a translation unit must not be empty */
#endif

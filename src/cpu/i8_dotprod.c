/* cpu/i8_dotprod: the int8 FWD row on AArch64 FEAT_DotProd (SDOT by element; contract: kernels.h,
 * "the int8 FWD rows"); i8.c hands it out where HWCAP_ASIMDDP is set and I8MM is not. Built with
 * NL_ISA_FLAGS_dotprod.
 *
 * SDOT Vd.4S, Vn.16B, Vm.4B[l] adds to each int32 lane j the dot product of Vn's bytes 4j..4j+3
 * with Vm's bytes 4l..4l+3, both signed. One row of the packed B (kernels.h: lane j = the 4 int8
 * weights q[4r..4r+3][j]) is Vn for 4 columns, and 16 bytes of an activation row are Vm for 4 such
 * rows. SDOT is signed × signed, the activations are u8 (q + 128): the row reads them as int8 with
 * the top bit flipped, q = A − 128, and so sums Σ (A−128)·q = BC + Σ A·q exactly, BC being the
 * contract's −128·Σq (it is not read). Integer sums are exact, so the group sums are the scalar
 * model's; per group they go to float once and meet the scales in the contract's order (FMLA:
 * one rounding, as fmaf), so the bits are the scalar row's (tests/test_int8.c).
 *
 * A micro-tile is mr <= 4 rows × 16 columns: 16 int32x4 group sums, 16 float32x4 accumulators
 * (in a local tile, which also takes the odd columns of the panel's last tile). */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline
#define NP NL_HOST_NP

AI void ukr(const int mr, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX, int64_t ldd,
            const uint32_t *B, const float *SW, const float *MW, float *C, int64_t ldc, int nc, int accumulate) {
    float32x4_t f[4][4];
    const int ncs = nc < 16 ? nc : 16;
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (i >= mr) break;
        if (accumulate && ncs == 16) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) f[i][c] = vld1q_f32(C + i * ldc + 4 * c);
        } else if (accumulate) {
            float t[16] = {0};
            memcpy(t, C + i * ldc, sizeof(float) * ncs);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) f[i][c] = vld1q_f32(t + 4 * c);
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) f[i][c] = vdupq_n_f32(0.0f);
        }
    }
    const int ng = kc / gs;
    const uint8x16_t flip = vdupq_n_u8(0x80);
    for (int g = 0; g < ng; g++) {
        int32x4_t s[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) s[i][c] = vdupq_n_s32(0);
        for (int p = g * gs; p < (g + 1) * gs; p += 16) {
            int8x16_t a[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                if (i >= mr) break;
                a[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(A + i * lda + p), flip));
            }
            const uint32_t *b = B + (int64_t)(p / 4) * NP;
#define DOT_STEP(l)                                                                                                    \
    do {                                                                                                               \
        int8x16_t bv[4];                                                                                               \
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) bv[c] =                                                    \
            vreinterpretq_s8_u32(vld1q_u32(b + (l)*NP + 4 * c));                                                       \
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                                          \
            if (i >= mr) break;                                                                                        \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) s[i][c] = vdotq_laneq_s32(s[i][c], bv[c], a[i], l);    \
        }                                                                                                              \
    } while (0)
            DOT_STEP(0);
            DOT_STEP(1);
            DOT_STEP(2);
            DOT_STEP(3);
#undef DOT_STEP
        }
        float32x4_t w[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) w[c] = vld1q_f32(SW + g * NP + 4 * c);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            if (i >= mr) break;
            const float32x4_t dx = vdupq_n_f32(DX[i * ldd + g]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) f[i][c] = vfmaq_f32(f[i][c], vcvtq_f32_s32(s[i][c]), vmulq_f32(w[c], dx));
        }
        if (MW) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) w[c] = vld1q_f32(MW + g * NP + 4 * c);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                if (i >= mr) break;
                const float32x4_t sx = vdupq_n_f32(SX[i * ldd + g]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) f[i][c] = vfmaq_f32(f[i][c], w[c], sx);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (i >= mr) break;
        if (ncs == 16) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) vst1q_f32(C + i * ldc + 4 * c, f[i][c]);
        } else {
            float t[16];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) vst1q_f32(t + 4 * c, f[i][c]);
            memcpy(C + i * ldc, t, sizeof(float) * ncs);
        }
    }
}

static void gemm_i8_fwd(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate) {
    (void)BC; /* −128·Σq by the contract: the flipped activations' sums already are BC + Σ A·q */
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mr = m - i0 < 4 ? m - i0 : 4;
        const uint8_t *a = A + i0 * lda;
        const float *dx = DX + i0 * ldd, *sx = SX ? SX + i0 * ldd : NULL;
        for (int s = 0; s < NP && s < ncols; s += 16) {
            const uint32_t *b = B + s;
            const float *sw = SW + s, *mw = MW ? MW + s : NULL;
            float *c = C + i0 * ldc + s;
            const int nc = ncols - s;
            switch (mr) {
            case 4: ukr(4, kc, gs, a, lda, dx, sx, ldd, b, sw, mw, c, ldc, nc, accumulate); break;
            case 3: ukr(3, kc, gs, a, lda, dx, sx, ldd, b, sw, mw, c, ldc, nc, accumulate); break;
            case 2: ukr(2, kc, gs, a, lda, dx, sx, ldd, b, sw, mw, c, ldc, nc, accumulate); break;
            default: ukr(1, kc, gs, a, lda, dx, sx, ldd, b, sw, mw, c, ldc, nc, accumulate); break;
            }
        }
    }
}

const nl_i8_kernels nl_i8_kernels_dotprod = {.name = "dotprod", .gemm_i8_fwd = gemm_i8_fwd};
#else
typedef int nl_i8_dotprod_empty; /* ISO C: a translation unit must not be empty */
#endif

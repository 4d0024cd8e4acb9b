/* cpu/i8_i8mm: the int8 FWD row on AArch64 FEAT_I8MM (the Armv8.6-A phone cores; contract:
 * kernels.h, "the int8 FWD rows"); i8.c hands it out where HWCAP2_I8MM is set. Built with
 * NL_ISA_FLAGS_i8mm.
 *
 * USMMLA Vd.4S, Vn.16B, Vm.16B (I8MM's unsigned × signed form of SMMLA) multiplies a 2×8 block of
 * u8 (Vn: row 0 in bytes 0..7, row 1 in 8..15) by an 8×2 block of int8 (Vm: one column's 8 values,
 * then the other's) into a 2×2 int32 tile [r0c0, r0c1, r1c0, r1c1]. The activations are the
 * contract's u8 (q + 128) as they are, so the tile starts from BC (−128·Σq) and its sums are the
 * scalar model's BC + Σ A·q, exactly. Two consecutive rows of the packed B (lane j = q[4r..4r+3][j])
 * zipped (ZIP1/ZIP2 .4S) are exactly Vm for two columns (k 8o..8o+7), as in kernels_neonbf16.c's
 * BFMMLA; two activation rows' 16 bytes zipped (.2D) are Vn for two k octets. Per group the sums go
 * to float once and meet the scales in the contract's order (FMLA: one rounding, as fmaf), so
 * the bits are the scalar row's (tests/test_int8.c).
 *
 * A micro-tile is mr <= 4 rows (two row pairs; an odd last row is paired with itself and its
 * second copy not stored) × 8 columns: 8 int32 2×2 tiles, 8 float 2×2 accumulators, B 4, A 2. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline
#define NP NL_HOST_NP

/* [v[0], v[1], v[0], v[1]]: a column pair's value for both rows of a tile */
AI int32x4_t cols2_s32(const int32_t *v) {
    const int32x2_t x = vld1_s32(v);
    return vcombine_s32(x, x);
}
AI float32x4_t cols2_f32(const float *v) {
    const float32x2_t x = vld1_f32(v);
    return vcombine_f32(x, x);
}
/* [a, a, b, b]: a row pair's value for both columns of a tile */
AI float32x4_t rows2_f32(float a, float b) { return vcombine_f32(vdup_n_f32(a), vdup_n_f32(b)); }

AI void ukr(const int mr, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX, int64_t ldd,
            const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C, int64_t ldc, int nc,
            int accumulate) {
    const int ncs = nc < 8 ? nc : 8;
    /* row i's pointers; a missing row of the last pair stands in with row mr-1's (never stored) */
    const uint8_t *ar[4];
    int ri[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) ri[i] = i < mr ? i : mr - 1, ar[i] = A + ri[i] * lda;
    float t[4][8] = {{0}};
    if (accumulate)
        for (int i = 0; i < mr; i++) memcpy(t[i], C + i * ldc, sizeof(float) * ncs);
    float32x4_t f[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) f[r][c] = vcombine_f32(vld1_f32(t[2 * r] + 2 * c), vld1_f32(t[2 * r + 1] + 2 * c));
    const int ng = kc / gs;
    for (int g = 0; g < ng; g++) {
        int32x4_t s[2][4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) s[0][c] = s[1][c] = cols2_s32(BC + g * NP + 2 * c);
        for (int p = g * gs; p < (g + 1) * gs; p += 16) {
            uint8x16_t a[2][2]; /* [row pair][k octet] */
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                const uint64x2_t x0 = vreinterpretq_u64_u8(vld1q_u8(ar[2 * r] + p));
                const uint64x2_t x1 = vreinterpretq_u64_u8(vld1q_u8(ar[2 * r + 1] + p));
                a[r][0] = vreinterpretq_u8_u64(vzip1q_u64(x0, x1));
                a[r][1] = vreinterpretq_u8_u64(vzip2q_u64(x0, x1));
            }
#pragma GCC unroll 2
            for (int o = 0; o < 2; o++) {
                const uint32_t *b0 = B + (int64_t)(p / 4 + 2 * o) * NP;
                int8x16_t bq[4];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const uint32x4_t u0 = vld1q_u32(b0 + 4 * h), u1 = vld1q_u32(b0 + NP + 4 * h);
                    bq[2 * h] = vreinterpretq_s8_u32(vzip1q_u32(u0, u1));
                    bq[2 * h + 1] = vreinterpretq_s8_u32(vzip2q_u32(u0, u1));
                }
#pragma GCC unroll 2
                for (int r = 0; r < 2; r++) {
                    if (2 * r >= mr) break;
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++) s[r][c] = vusmmlaq_s32(s[r][c], a[r][o], bq[c]);
                }
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            if (2 * r >= mr) break;
            const float32x4_t dx = rows2_f32(DX[ri[2 * r] * ldd + g], DX[ri[2 * r + 1] * ldd + g]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                f[r][c] = vfmaq_f32(f[r][c], vcvtq_f32_s32(s[r][c]), vmulq_f32(cols2_f32(SW + g * NP + 2 * c), dx));
            if (MW) {
                const float32x4_t sx = rows2_f32(SX[ri[2 * r] * ldd + g], SX[ri[2 * r + 1] * ldd + g]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) f[r][c] = vfmaq_f32(f[r][c], cols2_f32(MW + g * NP + 2 * c), sx);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            vst1_f32(t[2 * r] + 2 * c, vget_low_f32(f[r][c]));
            vst1_f32(t[2 * r + 1] + 2 * c, vget_high_f32(f[r][c]));
        }
    for (int i = 0; i < mr; i++) memcpy(C + i * ldc, t[i], sizeof(float) * ncs);
}

static void gemm_i8_fwd(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate) {
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mr = m - i0 < 4 ? m - i0 : 4;
        const uint8_t *a = A + i0 * lda;
        const float *dx = DX + i0 * ldd, *sx = SX ? SX + i0 * ldd : NULL;
        for (int s = 0; s < NP && s < ncols; s += 8) {
            const uint32_t *b = B + s;
            const int32_t *bc = BC + s;
            const float *sw = SW + s, *mw = MW ? MW + s : NULL;
            float *c = C + i0 * ldc + s;
            const int nc = ncols - s;
            switch (mr) {
            case 4: ukr(4, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
            case 3: ukr(3, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
            case 2: ukr(2, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
            default: ukr(1, kc, gs, a, lda, dx, sx, ldd, b, bc, sw, mw, c, ldc, nc, accumulate); break;
            }
        }
    }
}

const nl_i8_kernels nl_i8_kernels_i8mm = {.name = "i8mm", .gemm_i8_fwd = gemm_i8_fwd};
#else
typedef int nl_i8_i8mm_empty; /* ISO C: a translation unit must not be empty */
#endif

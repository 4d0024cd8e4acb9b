/* cpu/kernels_neonbf16: the AArch64 row for cores with FEAT_BF16 (Armv8.6-A phone cores: BFMMLA,
 * BFDOT); the dispatcher hands it out where HWCAP2_BF16 is set. Its bf16 entries follow kernels.h's
 * gemm_bf16 contract (FWD and BWD) on the same packed panels as the avx512 row (B: NP pairs a
 * row, low half = even p), so host.c's bf16 mode runs on it unchanged; its f32 entries are the
 * neon row's (kernels_neon.c), so FP32 compute gives the same bits as there.
 *
 * BFMMLA Vd.4S, Vn.8H, Vm.8H multiplies a 2×4 BF16 block of A rows (Vn) by a 4×2 block of B
 * columns (Vm, one column's 4 values after the other) into a 2×2 FP32 tile. The packed panel
 * holds pairs, so two consecutive pair rows of B zipped (ZIP1/ZIP2 .4S) are exactly Vm for two
 * columns. The Arm ARM's BFMatMulAdd does, per output element, BFDotAdd over the pairs (k0,k1)
 * then (k2,k3), and BFDOT is that same BFDotAdd on one pair: so a BFMMLA chain over k ascending
 * and a BFDOT chain over the pairs give the same bits, and the last single row of an odd m uses
 * BFDOT (half a BFMMLA tile would be zeros). BFDotAdd with FPCR.EBF = 0 (the only behaviour of
 * a core without FEAT_EBF16): each product and each sum rounded to odd, BF16 inputs and FP32
 * results below the normal range flushed to zero, FPCR ignored (tests/test_neonbf16.c models it).
 *
 * FWD: per 32-element block a fresh BFMMLA chain t, then acc = fma(t, d, acc) in FP32 (FMLA,
 * round to nearest): the same (Σ bf16(x)·q)·d as the avx512 row, the products' rounding aside.
 * Register use: BWD 2 row pairs × 8 column pairs accumulators (16 columns), B 8, A 2; FWD 2 × 4
 * chain + 2 × 4 accumulators (8 columns), B 4, A 2. Built with NL_ISA_FLAGS_neonbf16. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline
#define NP NL_HOST_NP

/* stands in for a missing second row of a row pair (its results are never stored) */
static const uint16_t zrow[NL_HOST_KC + 8];

AI bfloat16x8_t bf(uint16x8_t v) { return vreinterpretq_bf16_u16(v); }

/* BFMMLA's A operand: elements [p, p+4) of rows r0 and r1 */
AI bfloat16x8_t a_quad(const uint16_t *r0, const uint16_t *r1, int p) {
    return bf(vcombine_u16(vld1_u16(r0 + p), vld1_u16(r1 + p)));
}

/* one pair of a row, then two zeros (the BWD's odd last pair; reads only the pair) */
AI uint16x4_t pair_only(const uint16_t *r) {
    uint32_t x;
    memcpy(&x, r, 4);
    return vreinterpret_u16_u32(vset_lane_u32(x, vdup_n_u32(0), 0));
}

/* B operands of columns (4g, 4g+1) and (4g+2, 4g+3): pair rows b0 (pairs 2q) and b1 (2q+1) */
AI void b_quads(const uint32_t *b0, const uint32_t *b1, int g, bfloat16x8_t *lo, bfloat16x8_t *hi) {
    const uint32x4_t u0 = vld1q_u32(b0 + 4 * g);
    const uint32x4_t u1 = b1 ? vld1q_u32(b1 + 4 * g) : vdupq_n_u32(0);
    *lo = bf(vreinterpretq_u16_u32(vzip1q_u32(u0, u1)));
    *hi = bf(vreinterpretq_u16_u32(vzip2q_u32(u0, u1)));
}

/* C (=|+=) one 2×2 tile [C[0][0], C[0][1], C[1][0], C[1][1]] at c, rows < rows, columns < nc */
AI void store_2x2(float32x4_t v, float *c, int64_t ldc, int rows, int nc, int accumulate) {
    if (nc >= 2) {
        float32x2_t r0 = vget_low_f32(v), r1 = vget_high_f32(v);
        if (accumulate) r0 = vadd_f32(vld1_f32(c), r0);
        vst1_f32(c, r0);
        if (rows > 1) {
            if (accumulate) r1 = vadd_f32(vld1_f32(c + ldc), r1);
            vst1_f32(c + ldc, r1);
        }
        return;
    }
    if (nc < 1) return;
    float t[4];
    vst1q_f32(t, v);
    for (int i = 0; i < rows; i++) c[i * ldc] = accumulate ? c[i * ldc] + t[2 * i] : t[2 * i];
}

/* one row's C (=|+=) v (4 columns), columns < nc */
AI void store_row4(float32x4_t v, float *c, int nc, int accumulate) {
    if (nc >= 4) {
        if (accumulate) v = vaddq_f32(vld1q_f32(c), v);
        vst1q_f32(c, v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (int j = 0; j < nc; j++) c[j] = accumulate ? c[j] + t[j] : t[j];
}

/* ---- BWD: C[i][j] (=|+=) Σ_p2 A[i][2p2]·B[p2][j].lo + A[i][2p2+1]·B[p2][j].hi ---- */

/* rows [0, mr) (mr 2..4: one or two row pairs) × the 16 columns at B; nc columns stored */
AI void ukr_bwd_mmla(const int mr, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C, int64_t ldc,
                     int nc, int accumulate) {
    const int nrp = (mr + 1) / 2;
    const uint16_t *row[4];
    for (int i = 0; i < 4; i++) row[i] = i < mr ? A + i * lda : zrow;
    float32x4_t acc[2][8];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) acc[r][c] = vdupq_n_f32(0.0f);
    int q = 0;
    for (; 2 * q + 1 < kp; q++) {
        const uint32_t *b0 = B + (size_t)(2 * q) * NP;
        bfloat16x8_t bq[8];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) b_quads(b0, b0 + NP, g, &bq[2 * g], &bq[2 * g + 1]);
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            if (r >= nrp) break;
            const bfloat16x8_t a = a_quad(row[2 * r], row[2 * r + 1], 4 * q);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[r][c] = vbfmmlaq_f32(acc[r][c], a, bq[c]);
        }
    }
    if (2 * q < kp) { /* the odd last pair: its partner pair is zeros on both sides */
        const uint32_t *b0 = B + (size_t)(2 * q) * NP;
        bfloat16x8_t bq[8];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) b_quads(b0, NULL, g, &bq[2 * g], &bq[2 * g + 1]);
        for (int r = 0; r < nrp; r++) {
            const bfloat16x8_t a = bf(vcombine_u16(pair_only(row[2 * r] + 4 * q), pair_only(row[2 * r + 1] + 4 * q)));
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) acc[r][c] = vbfmmlaq_f32(acc[r][c], a, bq[c]);
        }
    }
    for (int r = 0; r < nrp; r++)
        for (int c = 0; c < 8; c++)
            store_2x2(acc[r][c], C + 2 * r * ldc + 2 * c, ldc, mr - 2 * r < 2 ? 1 : 2, nc - 2 * c, accumulate);
}

/* one row (BFDOT by element: 4 pairs of A in a register, one broadcast per step) × 16 columns */
AI void ukr_bwd_dot(int kp, const uint16_t *A, const uint32_t *B, float *C, int nc, int accumulate) {
    float32x4_t acc[4];
    for (int c = 0; c < 4; c++) acc[c] = vdupq_n_f32(0.0f);
    int p2 = 0;
#define DOT_STEP(lane)                                                                                                 \
    do {                                                                                                               \
        const uint32_t *b = B + (size_t)(p2 + (lane)) * NP;                                                            \
        for (int c = 0; c < 4; c++)                                                                                    \
            acc[c] = vbfdotq_laneq_f32(acc[c], bf(vreinterpretq_u16_u32(vld1q_u32(b + 4 * c))), a, lane);              \
    } while (0)
    for (; p2 + 4 <= kp; p2 += 4) {
        const bfloat16x8_t a = bf(vld1q_u16(A + 2 * p2));
        DOT_STEP(0);
        DOT_STEP(1);
        DOT_STEP(2);
        DOT_STEP(3);
    }
    for (; p2 < kp; p2++) {
        const bfloat16x8_t a = bf(vcombine_u16(pair_only(A + 2 * p2), vdup_n_u16(0)));
        const uint32_t *b = B + (size_t)p2 * NP;
        for (int c = 0; c < 4; c++)
            acc[c] = vbfdotq_laneq_f32(acc[c], bf(vreinterpretq_u16_u32(vld1q_u32(b + 4 * c))), a, 0);
    }
#undef DOT_STEP
    for (int c = 0; c < 4; c++) store_row4(acc[c], C + 4 * c, nc - 4 * c, accumulate);
}

static void k_gemm_bf16(int m, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C, int64_t ldc,
                        int ncols, int accumulate) {
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mr = m - i0 < 4 ? m - i0 : 4;
        const uint16_t *a = A + i0 * lda;
        for (int s = 0; s < NP / 16 && 16 * s < ncols; s++) {
            float *c = C + i0 * ldc + 16 * s;
            const uint32_t *b = B + 16 * s;
            const int nc = ncols - 16 * s;
            switch (mr) {
            case 4: ukr_bwd_mmla(4, kp, a, lda, b, c, ldc, nc, accumulate); break;
            case 3: ukr_bwd_mmla(3, kp, a, lda, b, c, ldc, nc, accumulate); break;
            case 2: ukr_bwd_mmla(2, kp, a, lda, b, c, ldc, nc, accumulate); break;
            default: ukr_bwd_dot(kp, a, b, c, nc, accumulate); break;
            }
        }
    }
}

/* ---- conversions (integer arithmetic: the same bits as nl_host_f32_to_bf16) ---- */

/* BF16 of four floats in the low halves: round to nearest even, NaN quieted */
AI uint32x4_t bf16_bits(float32x4_t f) {
    const uint32x4_t u = vreinterpretq_u32_f32(f);
    const uint32x4_t rne =
        vshrq_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fffu), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1)))), 16);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
    return vbslq_u32(nan, vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(64)), rne);
}

static void k_to_bf16(const float *src, int n, uint16_t *dst) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(dst + i,
                  vcombine_u16(vmovn_u32(bf16_bits(vld1q_f32(src + i))), vmovn_u32(bf16_bits(vld1q_f32(src + i + 4)))));
    for (; i < n; i++) dst[i] = nl_host_f32_to_bf16(src[i]);
}

static void k_pairs_to_bf16(const float *r0, const float *r1, int n, uint32_t *dst) {
    for (int i = 0; i < n; i += 4) {
        const uint32x4_t lo = bf16_bits(vld1q_f32(r0 + i));
        const uint32x4_t hi = r1 ? bf16_bits(vld1q_f32(r1 + i)) : vdupq_n_u32(0);
        vst1q_u32(dst + i, vorrq_u32(lo, vshlq_n_u32(hi, 16)));
    }
}

const nl_host_kernels nl_host_kernels_neonbf16 = {
    .name = "neonbf16",
    .has_bf16 = 1,
    .dq_f16 = nl_neon_dq_f16,
    .dq_q8_0 = nl_neon_dq_q8_0,
    .gemm_f32 = nl_neon_gemm_f32,
    .gemm_bf16 = k_gemm_bf16,
    .to_bf16 = k_to_bf16,
    .pairs_to_bf16 = k_pairs_to_bf16,
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
typedef int nl_kernels_neonbf16_empty; /* ISO C: a translation unit must not be empty */
#endif

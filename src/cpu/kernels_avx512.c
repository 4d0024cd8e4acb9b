/* cpu/kernels_avx512: AVX-512 F/BW/VL (+FMA, F16C) kernel set, and the AVX512_BF16 kernels.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c; the dispatcher
 * (dispatch.c) hands it out only after cpuid says so. Register blocking: 6 rows of T × 4 vectors (64 columns) of
 * FP32 accumulators for gemm_f32 and gemm_bf16 (FWD and BWD); a panel with fewer live columns
 * runs only its live vectors in taller tiles (8 × 3, 12 × 2, 12 × 1). */
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/gemm_bf16.h"
#include "cpu/kernels.h"
#include "util/rng.h"

#define AI __attribute__((always_inline)) static inline

typedef union {
    __m256i i;
    __m256bh h;
} bh256;

static void z_dq_f16(const uint16_t *src, float *dst, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = nl_host_f16_to_f32(src[i]);
}

static void z_dq_q8_0(const nl_block_q8_0 *src, float *dst, int nblocks) {
    for (int b = 0; b < nblocks; b++) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(src[b].d));
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src[b].qs));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src[b].qs + 16)));
        _mm512_storeu_ps(dst + 32 * b, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
        _mm512_storeu_ps(dst + 32 * b + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
    }
}

/* Q5_0 (docs/formats.md §1): element j < 16 is the low nibble of qs[j] with bit j of qh as its
 * fifth bit, element j + 16 the high nibble with bit j + 16; value (q - 16)·d, exact in FP32. */
static void z_dq_q5_0(const uint8_t *src, float *dst, int nblocks) {
    const __m512i low4 = _mm512_set1_epi32(0x0f), b16 = _mm512_set1_epi32(16);
    for (int b = 0; b < nblocks; b++, src += 22) {
        uint16_t h;
        uint32_t qh;
        memcpy(&h, src, 2);
        memcpy(&qh, src + 2, 4);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        const __m512i qs = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 6)));
        __m512i q0 = _mm512_and_si512(qs, low4), q1 = _mm512_srli_epi32(qs, 4);
        q0 = _mm512_sub_epi32(_mm512_mask_or_epi32(q0, (__mmask16)(qh & 0xffff), q0, b16), b16);
        q1 = _mm512_sub_epi32(_mm512_mask_or_epi32(q1, (__mmask16)(qh >> 16), q1, b16), b16);
        _mm512_storeu_ps(dst + 32 * b, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
        _mm512_storeu_ps(dst + 32 * b + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
    }
}

/* Q4_1 (docs/formats.md §1): { f16 d; f16 m; qs[16] }, element j < 16 the low nibble of qs[j],
 * j + 16 the high one; value q·d + m. q·d is exact in FP32 (4 × 11 bits), so the FMA rounds once
 * as model/quant's q*d + m does: the same floats. */
static void z_dq_q4_1(const uint8_t *src, float *dst, int nblocks) {
    const __m512i low4 = _mm512_set1_epi32(0x0f);
    for (int b = 0; b < nblocks; b++, src += 20) {
        uint16_t hd, hm;
        memcpy(&hd, src, 2);
        memcpy(&hm, src + 2, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd)), m = _mm512_set1_ps(_cvtsh_ss(hm));
        const __m512i qs = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 4)));
        const __m512i q0 = _mm512_and_si512(qs, low4), q1 = _mm512_srli_epi32(qs, 4);
        _mm512_storeu_ps(dst + 32 * b, _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d, m));
        _mm512_storeu_ps(dst + 32 * b + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), d, m));
    }
}

/* 16×16 32-bit transpose in registers: interleave row pairs (32-bit), then row quads (64-bit),
 * then swap 128-bit lanes (4×4 lane transpose) — column c of the 16 rows a[] is stored at
 * dst + c·ldd. */
AI void tr16_store(__m512i a[16], uint32_t *dst, int64_t ldd) {
    __m512i b[16];
    for (int i = 0; i < 16; i += 2) {
        b[i] = _mm512_unpacklo_epi32(a[i], a[i + 1]);
        b[i + 1] = _mm512_unpackhi_epi32(a[i], a[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
        a[g + 0] = _mm512_unpacklo_epi64(b[g + 0], b[g + 2]);
        a[g + 1] = _mm512_unpackhi_epi64(b[g + 0], b[g + 2]);
        a[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
        a[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
    }
    /* a[4g + c], lane L = column 4L+c, rows 4g..4g+3 */
    for (int c = 0; c < 4; c++) {
        const __m512i x0 = a[c], x1 = a[4 + c], x2 = a[8 + c], x3 = a[12 + c];
        const __m512i y0 = _mm512_shuffle_i32x4(x0, x1, 0x44), y1 = _mm512_shuffle_i32x4(x0, x1, 0xEE);
        const __m512i y2 = _mm512_shuffle_i32x4(x2, x3, 0x44), y3 = _mm512_shuffle_i32x4(x2, x3, 0xEE);
        _mm512_storeu_si512((void *)(dst + (0 + c) * ldd), _mm512_shuffle_i32x4(y0, y2, 0x88));
        _mm512_storeu_si512((void *)(dst + (4 + c) * ldd), _mm512_shuffle_i32x4(y0, y2, 0xDD));
        _mm512_storeu_si512((void *)(dst + (8 + c) * ldd), _mm512_shuffle_i32x4(y1, y3, 0x88));
        _mm512_storeu_si512((void *)(dst + (12 + c) * ldd), _mm512_shuffle_i32x4(y1, y3, 0xDD));
    }
}

static void z_transpose32(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int c0 = 0;
        for (; c0 + 16 <= cols; c0 += 16) {
            __m512i a[16];
            for (int i = 0; i < 16; i++) a[i] = _mm512_loadu_si512((const void *)(src + (r0 + i) * lds + c0));
            tr16_store(a, dst + c0 * ldd + r0, ldd);
        }
        for (; c0 < cols; c0++)
            for (int i = 0; i < 16; i++) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
    }
}

static void z_pairs_to_bf16(const float *r0, const float *r1, int n, uint32_t *dst) {
    for (int i = 0; i < n; i += 16) {
        bh256 l, h;
        l.h = _mm512_cvtneps_pbh(_mm512_loadu_ps(r0 + i));
        h.h = _mm512_cvtneps_pbh(r1 ? _mm512_loadu_ps(r1 + i) : _mm512_setzero_ps());
        const __m512i lo = _mm512_cvtepu16_epi32(l.i);
        const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h.i), 16);
        _mm512_storeu_si512((void *)(dst + i), _mm512_or_si512(lo, hi));
    }
}

typedef union {
    __m512i i;
    __m512bh h;
} bh512;

/* BWD pairs straight from two rows' Q8_0 blocks: the same values as dq_q8_0 + pairs_to_bf16
 * (q·d is exact in FP32, then rounded to nearest even). b1 NULL = zeros. */
static void z_q8_0_pairs_to_bf16(const nl_block_q8_0 *b0, const nl_block_q8_0 *b1, int nblocks, uint32_t *dst) {
    /* word 2i <- word i (row 0), word 2i + 1 <- word 16 + i (row 1) of one VCVTNE2PS2BF16 */
    const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int b = 0; b < nblocks; b++) {
        const __m512 d0 = _mm512_set1_ps(_cvtsh_ss(b0[b].d));
        const __m512 d1 = b1 ? _mm512_set1_ps(_cvtsh_ss(b1[b].d)) : _mm512_setzero_ps();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 f0 = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b0[b].qs + 16 * h)))), d0);
            const __m512 f1 = b1 ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                     _mm_loadu_si128((const __m128i *)(b1[b].qs + 16 * h)))),
                                                 d1)
                                 : _mm512_setzero_ps();
            bh512 u;
            u.h = _mm512_cvtne2ps_pbh(f1, f0);
            _mm512_storeu_si512((void *)(dst + 32 * b + 16 * h), _mm512_permutexvar_epi16(ilv, u.i));
        }
    }
}

/* FWD panel pairs of 16 rows of W: dst[p2·ldd + r] = BF16(w_r[2p2]) | BF16(w_r[2p2+1]) << 16
 * for r < 16, p2 < kc/2: the rows' BF16 values (to_bf16's, or dq_q8_0 + to_bf16's) transposed
 * in registers, 16 pairs of 16 rows at a time (no row-major tile in memory). */
static void z_fwd_pairs_f32(const float *rows, int64_t ldr, int kc, uint32_t *dst, int64_t ldd) {
    for (int p = 0; p < kc; p += 32) {
        __m512i a[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            bh512 u;
            u.h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(rows + r * ldr + p + 16), _mm512_loadu_ps(rows + r * ldr + p));
            a[r] = u.i;
        }
        tr16_store(a, dst + (size_t)(p / 2) * ldd, ldd);
    }
}

static void z_q8_0_fwd_pairs(const nl_block_q8_0 *const rows[16], int nblocks, uint32_t *dst, int64_t ldd) {
    for (int b = 0; b < nblocks; b++) {
        __m512i a[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            const nl_block_q8_0 *q = rows[r] + b;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(q->d));
            const __m512 f0 =
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q->qs))), d);
            const __m512 f1 = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q->qs + 16)))), d);
            bh512 u;
            u.h = _mm512_cvtne2ps_pbh(f1, f0);
            a[r] = u.i;
        }
        tr16_store(a, dst + (size_t)(16 * b) * ldd, ldd);
    }
}

static __mmask16 col_mask(int ncols, int r) {
    int v = ncols - 16 * r;
    return v >= 16 ? (__mmask16)0xffff : v <= 0 ? (__mmask16)0 : (__mmask16)((1u << v) - 1);
}

/* The f32 register tile: mr rows × nv vectors of 16 columns (both constant after inlining),
 * each accumulator one FMA chain over p in increasing order from zero whatever the shape, so
 * the shapes give the same bits; a panel with fewer live columns (ncols <= 16·nv) runs only its
 * live vectors, in taller tiles (F32_MR), as gemm_bf16 does. */
#define F32_ROWS 12
AI void ukr_f32(const int mr, const int nv, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc,
                int ncols, int accumulate) {
    __m512 acc[F32_ROWS][4];
#pragma GCC unroll 12
    for (int i = 0; i < F32_ROWS; i++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
    for (int p = 0; p < kc; p++) {
        const float *b = B + (size_t)p * NL_HOST_NP;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            if (r < nv) bv[r] = _mm512_load_ps(b + 16 * r);
#pragma GCC unroll 12
        for (int i = 0; i < F32_ROWS; i++) {
            if (i >= mr) break;
            const __m512 a = _mm512_set1_ps(A[i * lda + p]);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                if (r < nv) acc[i][r] = _mm512_fmadd_ps(a, bv[r], acc[i][r]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < F32_ROWS; i++) {
        if (i >= mr) break;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= nv) break;
            const __mmask16 k = col_mask(ncols, r);
            float *c = C + i * ldc + 16 * r;
            __m512 v = acc[i][r];
            if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, c), v);
            _mm512_mask_storeu_ps(c, k, v);
        }
    }
}

/* rows of the f32 tile for nv live vectors: 24 accumulators (6×4, 8×3, 12×2), 12 for one */
#define F32_MR(nv) ((nv) == 4 ? 6 : (nv) == 3 ? 8 : 12)

#define UKR_F32_CASE(MRv, NV)                                                                                          \
    case MRv:                                                                                                          \
        if (MRv <= F32_MR(NV)) ukr_f32(MRv, NV, kc, a, lda, B, c, ldc, ncols, accumulate);                             \
        break;
#define UKR_F32_NV(NV)                                                                                                 \
    static void gemm_f32_nv##NV(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc,     \
                                int ncols, int accumulate) {                                                           \
        const int R = F32_MR(NV);                                                                                      \
        for (int i0 = 0; i0 < m; i0 += R) {                                                                            \
            const int mr = m - i0 < R ? m - i0 : R;                                                                    \
            const float *a = A + i0 * lda;                                                                             \
            /* the next block's activation rows, while this block computes */                                          \
            const int nr = m - i0 - R < R ? m - i0 - R : R;                                                            \
            for (int r = 0; r < nr; r++)                                                                               \
                for (int p = 0; p < kc; p += 16) _mm_prefetch((const char *)(a + (R + r) * lda + p), _MM_HINT_T0);     \
            float *c = C + i0 * ldc;                                                                                   \
            switch (mr) {                                                                                              \
                UKR_F32_CASE(12, NV)                                                                                   \
                UKR_F32_CASE(11, NV)                                                                                   \
                UKR_F32_CASE(10, NV)                                                                                   \
                UKR_F32_CASE(9, NV)                                                                                    \
                UKR_F32_CASE(8, NV)                                                                                    \
                UKR_F32_CASE(7, NV)                                                                                    \
                UKR_F32_CASE(6, NV)                                                                                    \
                UKR_F32_CASE(5, NV)                                                                                    \
                UKR_F32_CASE(4, NV)                                                                                    \
                UKR_F32_CASE(3, NV)                                                                                    \
                UKR_F32_CASE(2, NV)                                                                                    \
            default: ukr_f32(1, NV, kc, a, lda, B, c, ldc, ncols, accumulate); break;                                  \
            }                                                                                                          \
        }                                                                                                              \
    }
UKR_F32_NV(1)
UKR_F32_NV(2)
UKR_F32_NV(3)
UKR_F32_NV(4)

static void z_gemm_f32(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
                       int accumulate) {
    if (ncols <= 0) return;
    switch ((ncols + 15) / 16) {
    case 1: gemm_f32_nv1(m, kc, A, lda, B, C, ldc, ncols, accumulate); break;
    case 2: gemm_f32_nv2(m, kc, A, lda, B, C, ldc, ncols, accumulate); break;
    case 3: gemm_f32_nv3(m, kc, A, lda, B, C, ldc, ncols, accumulate); break;
    default: gemm_f32_nv4(m, kc, A, lda, B, C, ldc, ncols, accumulate); break;
    }
}

/* ---------------- AVX512_BF16 ---------------- */

AI __m512bh as_bh(__m512i v) {
    bh512 u;
    u.i = v;
    return u.h;
}

/* row of n floats (optionally times d) → n bf16 (padded with zeros to a multiple of 32). */
AI void to_bf16_row(const float *a, const float *d, int n, uint16_t *dst) {
    for (int p = 0; p < n; p += 32) {
        const int lo_n = n - p >= 16 ? 16 : n - p, hi_n = n - p - 16 >= 16 ? 16 : n - p - 16;
        const __mmask16 klo = (__mmask16)(lo_n >= 16 ? 0xffff : (1u << lo_n) - 1);
        const __mmask16 khi = hi_n <= 0 ? 0 : (__mmask16)(hi_n >= 16 ? 0xffff : (1u << hi_n) - 1);
        __m512 lo = _mm512_maskz_loadu_ps(klo, a + p), hi = _mm512_maskz_loadu_ps(khi, a + p + 16);
        if (d) {
            lo = _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(klo, d + p));
            hi = _mm512_mul_ps(hi, _mm512_maskz_loadu_ps(khi, d + p + 16));
        }
        bh512 u;
        u.h = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512((void *)(dst + p), u.i);
    }
}

static void z_to_bf16(const float *src, int n, uint16_t *dst) {
    int i = 0;
    for (; i + 32 <= n; i += 32) to_bf16_row(src + i, NULL, 32, dst + i);
    for (; i < n; i++) dst[i] = nl_host_f32_to_bf16(src[i]);
}

/* lo[i] = nl_host_f32_to_bf16(src[i] − hi[i]) in integer steps (round to nearest even on the
 * bits, a NaN quieted, denormals kept: that function's rule, not VCVTNEPS2BF16's) */
static void z_to_bf16_lo(const float *src, const uint16_t *hi, int n, uint16_t *lo) {
    const __m512i exp_inf = _mm512_set1_epi32(0x7f800000), abs_m = _mm512_set1_epi32(0x7fffffff);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(64);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i h = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(hi + i))), 16);
        const __m512i u = _mm512_castps_si512(_mm512_sub_ps(_mm512_loadu_ps(src + i), _mm512_castsi512_ps(h)));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
        r = _mm512_srli_epi32(r, 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_m), exp_inf);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(lo + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) {
        const uint32_t b = (uint32_t)hi[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        lo[i] = nl_host_f32_to_bf16(src[i] - f);
    }
}

/* The bf16 register tile: mr rows × nv vectors of 16 columns (mr·nv <= 24 accumulators), both
 * constant after inlining. Each accumulator is one chain of vdpbf16ps over p2 in increasing
 * order from zero, whatever the tile's shape, so the shapes give the same bits; a panel with
 * fewer live columns (ncols <= 16·nv) runs only its live vectors, in taller tiles. */
#define BF16_ROWS 12 /* rows of the tallest tile (nv 1 and 2) */
AI void ukr_bf16(const int mr, const int nv, int kp, const uint32_t *a, int64_t lda2, const uint32_t *B, float *C,
                 int64_t ldc, int ncols, int accumulate) {
    __m512 acc[BF16_ROWS][4];
#pragma GCC unroll 12
    for (int i = 0; i < BF16_ROWS; i++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
    for (int p2 = 0; p2 < kp; p2++) {
        const uint32_t *b = B + (size_t)p2 * NL_HOST_NP;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            if (r < nv) bv[r] = as_bh(_mm512_load_si512((const void *)(b + 16 * r)));
#pragma GCC unroll 12
        for (int i = 0; i < BF16_ROWS; i++) {
            if (i >= mr) break;
            const __m512bh x = as_bh(_mm512_set1_epi32((int)a[i * lda2 + p2]));
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                if (r < nv) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], x, bv[r]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < BF16_ROWS; i++) {
        if (i >= mr) break;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= nv) break;
            const __mmask16 k = col_mask(ncols, r);
            float *c = C + i * ldc + 16 * r;
            __m512 v = acc[i][r];
            if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, c), v);
            _mm512_mask_storeu_ps(c, k, v);
        }
    }
}

/* rows of the tile for nv live vectors: 24 accumulators where they fit (6×4, 8×3, 12×2), 12 for
 * one vector (12 chains cover the instruction's latency; the broadcasts, one a row, bound it) */
#define BF16_MR(nv) ((nv) == 4 ? 6 : (nv) == 3 ? 8 : 12)

/* every tile height 1..BF16_MR(NV) of nv = NV */
#define UKR_CASE(MRv, NV)                                                                                              \
    case MRv:                                                                                                          \
        if (MRv <= BF16_MR(NV)) ukr_bf16(MRv, NV, kp, a, lda2, B, c, ldc, ncols, accumulate);                          \
        break;
#define UKR_NV(NV)                                                                                                     \
    static void gemm_bf16_nv##NV(int m, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C,           \
                                 int64_t ldc, int ncols, int accumulate) {                                             \
        const int64_t lda2 = lda / 2; /* in pairs */                                                                   \
        const int R = BF16_MR(NV);                                                                                     \
        for (int i0 = 0; i0 < m; i0 += R) {                                                                            \
            const int mr = m - i0 < R ? m - i0 : R;                                                                    \
            const uint32_t *a = (const uint32_t *)(const void *)(A + i0 * lda);                                        \
            const int nr = m - i0 - R < R ? m - i0 - R : R;                                                            \
            for (int r = 0; r < nr; r++)                                                                               \
                for (int p = 0; p < 2 * kp; p += 32)                                                                   \
                    _mm_prefetch((const char *)(A + (i0 + R + r) * lda + p), _MM_HINT_T0);                             \
            float *c = C + i0 * ldc;                                                                                   \
            switch (mr) {                                                                                              \
                UKR_CASE(12, NV)                                                                                       \
                UKR_CASE(11, NV)                                                                                       \
                UKR_CASE(10, NV)                                                                                       \
                UKR_CASE(9, NV)                                                                                        \
                UKR_CASE(8, NV)                                                                                        \
                UKR_CASE(7, NV)                                                                                        \
                UKR_CASE(6, NV)                                                                                        \
                UKR_CASE(5, NV)                                                                                        \
                UKR_CASE(4, NV)                                                                                        \
                UKR_CASE(3, NV)                                                                                        \
                UKR_CASE(2, NV)                                                                                        \
            default: ukr_bf16(1, NV, kp, a, lda2, B, c, ldc, ncols, accumulate); break;                                \
            }                                                                                                          \
        }                                                                                                              \
    }
UKR_NV(1)
UKR_NV(2)
UKR_NV(3)
UKR_NV(4)

static void z_gemm_bf16(int m, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C, int64_t ldc,
                        int ncols, int accumulate) {
    if (ncols <= 0) return;
    switch ((ncols + 15) / 16) {
    case 1: gemm_bf16_nv1(m, kp, A, lda, B, C, ldc, ncols, accumulate); break;
    case 2: gemm_bf16_nv2(m, kp, A, lda, B, C, ldc, ncols, accumulate); break;
    case 3: gemm_bf16_nv3(m, kp, A, lda, B, C, ldc, ncols, accumulate); break;
    default: gemm_bf16_nv4(m, kp, A, lda, B, C, ldc, ncols, accumulate); break;
    }
}

/* nn/lora.c's dropout rows (kernels.h: dropout_mask_row, dropout_apply_row). 16 mask elements per step: 8
 * consecutive counters' splitmix64 values in one zmm; read as 16 uint32 lanes they are exactly (low, high) of each
 * value, i.e. elements 2c, 2c+1 in order. Integer arithmetic only: the same bits as the scalar loop. The apply form
 * also takes x: x ⊙ m in FP32 (one rounded product, as the node's separate multiply) and/or that product as BF16
 * pair words, rounded as cpu/amx.h's nl_amx_f32_to_bf16: VCVTNEPS2BF16 where the CPU has AVX512_BF16 (cvt), else
 * integer steps (bf16_words); the same words, the bits of the tiles' packers. The conversion is the forward's
 * largest cost after the hash: 0.57 -> 0.37 TSC cycles per element for the packed words alone (K = 1024 rows, L2,
 * Intel Xeon family 6 model 207). Two or four rows of counters in flight, or the 64-bit products from VPMULUDQ,
 * measured no faster there: the loop is bound by its uops, not by VPMULLQ's latency. */
AI __m512i bf16_words(__m512 v) { /* 16 floats -> 16 BF16 (nl_amx_f32_to_bf16), in 32-bit lanes */
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1))),
        16);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    const __mmask16 den = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(64));
    return _mm512_mask_and_epi32(r, den, hi, _mm512_set1_epi32(0x8000));
}

AI int dropout_rows(uint64_t kt, int K, uint32_t thr, float inv, const float *x, float *mr, float *xm, uint32_t *xw,
                    uint16_t *kb, const int cvt) {
    const __m512i lane = _mm512_setr_epi64(1, 2, 3, 4, 5, 6, 7, 8);
    const __m512i gamma = _mm512_set1_epi64((long long)NL_RNG_GAMMA);
    const __m512i step = _mm512_set1_epi64((long long)(8 * NL_RNG_GAMMA));
    const __m512i c1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL),
                  c2 = _mm512_set1_epi64((long long)0x94D049BB133111EBULL);
    const __m512i vthr = _mm512_set1_epi32((int)thr);
    const __m512 vinv = _mm512_set1_ps(inv);
    /* z_c = kt + (c + 1)·γ for c = 0..7, then += 8γ per step */
    __m512i z = _mm512_add_epi64(_mm512_set1_epi64((long long)kt), _mm512_mullo_epi64(lane, gamma));
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        __m512i v = _mm512_xor_si512(z, _mm512_srli_epi64(z, 30));
        v = _mm512_mullo_epi64(v, c1);
        v = _mm512_xor_si512(v, _mm512_srli_epi64(v, 27));
        v = _mm512_mullo_epi64(v, c2);
        v = _mm512_xor_si512(v, _mm512_srli_epi64(v, 31));
        const __mmask16 keep = _mm512_cmpge_epu32_mask(v, vthr);
        const __m512 m = _mm512_maskz_mov_ps(keep, vinv);
        if (kb) kb[i / 16] = (uint16_t)keep;
        if (mr) _mm512_storeu_ps(mr + i, m);
        if (x) {
            const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + i), m);
            if (xm) _mm512_storeu_ps(xm + i, p);
            if (xw && cvt) {
                bh256 w;
                w.h = _mm512_cvtneps_pbh(p);
                _mm256_storeu_si256((__m256i *)(void *)(xw + i / 2), w.i);
            } else if (xw) {
                _mm256_storeu_si256((__m256i *)(void *)(xw + i / 2), _mm512_cvtepi32_epi16(bf16_words(p)));
            }
        }
        z = _mm512_add_epi64(z, step);
    }
    return i;
}

static int z_dropout_mask_row(uint64_t kt, int K, uint32_t thr, float inv, float *mr) {
    return dropout_rows(kt, K, thr, inv, NULL, mr, NULL, NULL, NULL, 0);
}

static int z_dropout_apply_row(uint64_t kt, int K, uint32_t thr, float inv, const float *x, float *mr, float *xm,
                               uint32_t *xw, uint16_t *kb) {
    if (mr && xm && !xw && !kb) return dropout_rows(kt, K, thr, inv, x, mr, xm, NULL, NULL, 0);
    const int cvt = nl_cpu_has(NL_CPU_AVX512BF16);
    if (!mr && !xm && xw && cvt) return dropout_rows(kt, K, thr, inv, x, NULL, NULL, xw, kb, 1);
    if (!mr && !xm && xw) return dropout_rows(kt, K, thr, inv, x, NULL, NULL, xw, kb, 0);
    if (cvt) return dropout_rows(kt, K, thr, inv, x, mr, xm, xw, kb, 1);
    return dropout_rows(kt, K, thr, inv, x, mr, xm, xw, kb, 0);
}

/* The backward's mask from the forward's kept bits (kernels.h: dropout_bits_row): 16 elements per
 * 16-bit word, the mask register straight from the word; the same inv or 0 and the same one rounded
 * product as dropout_rows. */
AI int bits_row(const uint16_t *kb, int n, float inv, const float *x, float *mr, float *xm) {
    const __m512 vinv = _mm512_set1_ps(inv);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 m = _mm512_maskz_mov_ps((__mmask16)kb[i / 16], vinv);
        if (mr) _mm512_storeu_ps(mr + i, m);
        _mm512_storeu_ps(xm + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), m));
    }
    return i;
}

static int z_dropout_bits_row(const uint16_t *kb, int n, float inv, const float *x, float *mr, float *xm) {
    return mr ? bits_row(kb, n, inv, x, mr, xm) : bits_row(kb, n, inv, x, NULL, xm);
}

/* dx through the kept bits (kernels.h: dropout_bits_madd): the mask register as z_dropout_bits_row
 * builds it, then vec's mul or muladd (a rounded product, then the add) */
static int z_dropout_bits_madd(const uint16_t *kb, int n, float inv, const float *t, float *d, int accumulate) {
    const __m512 vinv = _mm512_set1_ps(inv);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(t + i), _mm512_maskz_mov_ps((__mmask16)kb[i / 16], vinv));
        _mm512_storeu_ps(d + i, accumulate ? _mm512_add_ps(_mm512_loadu_ps(d + i), p) : p);
    }
    return i;
}

const nl_host_kernels nl_host_kernels_avx512 = {
    .name = "avx512",
    .has_bf16 = 1,
    .dq_f16 = z_dq_f16,
    .dq_q8_0 = z_dq_q8_0,
    .gemm_f32 = z_gemm_f32,
    .gemm_bf16 = z_gemm_bf16,
    .to_bf16 = z_to_bf16,
    .to_bf16_lo = z_to_bf16_lo,
    .transpose32 = z_transpose32,
    .pairs_to_bf16 = z_pairs_to_bf16,
    .fwd_pairs_f32 = z_fwd_pairs_f32,
    .q8_0_fwd_pairs = z_q8_0_fwd_pairs,
    .q8_0_pairs_to_bf16 = z_q8_0_pairs_to_bf16,
    .dq_q5_0 = z_dq_q5_0,
    .dq_q4_1 = z_dq_q4_1,
    /* the nodes: the AVX2 + FMA small GEMM (its 6×16 tiles are the faster at the nodes' shapes),
     * the BF16 attention pieces, the GDN kernels on 64 columns */
    .gemm_nn = nl_gemm_nn_avx512,
    .dot_rows = nl_dot_rows_avx2,
    .bf16 = &nl_cpu_bf16_avx512,
    .gdn_step_cols = 64,
    .gdn_step = nl_gdn_step64_avx512,
    .gdn_scan = nl_gdn_scan64_avx512,
    .gdn_mm = nl_gdn_mm_avx512,
    .gdn_transpose8 = nl_gdn_transpose8_avx2,
    .gdn_silu_d = nl_gdn_silu_d_avx512,
    .gdn_silu = nl_gdn_silu_avx512,
    .dropout_mask_row = z_dropout_mask_row,
    .dropout_apply_row = z_dropout_apply_row,
    .dropout_bits_row = z_dropout_bits_row,
    .dropout_bits_madd = z_dropout_bits_madd,
    .lora = &nl_lora_kernels_avx512,
    .vec = &nl_vec_kernels_avx512,
};
#endif

/* cpu/gemm_avx512: the nodes' small FP32 GEMM (cpu/gemm.c's contract: one FMA chain per element,
 * k ascending from 0 or from C) on AVX-512F; built with the AVX-512 flags (the file's name:
 * CMakeLists.txt), only on x86-64; the AVX-512 kernel set's gemm_nn. The same structure as
 * gemm_avx2.c with 16-lane vectors: 6×32 register tiles (12 zmm accumulators) for panels of 32
 * columns, 8×16 tiles for a panel of 16 or fewer (the LoRA rank: u = x·Aᵀ, du = dy·B: 8 rows,
 * not 12: rows 4 KB apart share an L1 set and 12 of them thrashed it; measured 52-98 vs
 * 104-110 GFLOP/s on Zen 5); partial vectors through lane masks (masked
 * loads do not fault). Every element's chain is the one gemm_avx2.c computes (fused, k in
 * order), so the bits are the AVX2 row's and the portable chain's (tests/test_gemm). */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline

/* One tile: rows 0..MR-1 of C/A (MR <= 12 for NV = 1 (8 used), <= 6 for NV = 2: compile-time constants
 * after inlining), columns 0..NV*16-1; when MASKED the last vector's lanes are `mask`. */
AI void tile(const int MR, const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs,
             int64_t a_cs, const float *B, int ldb, int K, int acc, __mmask16 mask) {
    __m512 c[12][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *cp = C + (int64_t)i * ldc + 16 * v;
            if (!acc) c[i][v] = _mm512_setzero_ps();
            else if (MASKED && v == NV - 1) c[i][v] = _mm512_maskz_loadu_ps(mask, cp);
            else c[i][v] = _mm512_loadu_ps(cp);
        }
    const float *a = A;
    const float *b = B;
    for (int k = 0; k < K; k++, a += a_cs, b += ldb) {
        const __m512 b0 = NV == 2 || !MASKED ? _mm512_loadu_ps(b) : _mm512_maskz_loadu_ps(mask, b);
        const __m512 b1 = NV == 1 ? b0 : MASKED ? _mm512_maskz_loadu_ps(mask, b + 16) : _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            const __m512 x = _mm512_set1_ps(a[i * a_rs]);
            c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
            if (NV == 2) c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *cp = C + (int64_t)i * ldc + 16 * v;
            if (MASKED && v == NV - 1) _mm512_mask_storeu_ps(cp, mask, c[i][v]);
            else _mm512_storeu_ps(cp, c[i][v]);
        }
}

/* rows m .. M-1 (fewer than MR) through a tile with a constant row count */
#define TILE_REST(NV, MASKED, r, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask)                                        \
    switch (r) {                                                                                                       \
    case 11: tile(11, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                               \
    case 10: tile(10, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                               \
    case 9: tile(9, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 8: tile(8, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 7: tile(7, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 6: tile(6, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 5: tile(5, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 4: tile(4, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 3: tile(3, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 2: tile(2, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    case 1: tile(1, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;                                 \
    default: break;                                                                                                    \
    }

/* All row tiles of one column panel of NV vectors. */
AI void panel(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
              const float *B, int ldb, int M, int K, int acc, __mmask16 mask) {
    const int MR = NV == 1 ? 8 : 6;
    int m = 0;
    for (; m + MR <= M; m += MR)
        tile(MR, NV, MASKED, C + (int64_t)m * ldc, ldc, A + m * a_rs, a_rs, a_cs, B, ldb, K, acc, mask);
    float *Cm = C + (int64_t)m * ldc;
    const float *Am = A + m * a_rs;
    if (NV == 1) {
        TILE_REST(1, MASKED, M - m, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask)
    } else {
        switch (M - m) {
        case 5: tile(5, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
        case 4: tile(4, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
        case 3: tile(3, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
        case 2: tile(2, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
        case 1: tile(1, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
        default: break;
        }
    }
}

/* Rows of B per packed chunk (gemm_avx2.c's reason: a power-of-two row stride would make the
 * panel's rows collide in a few L1 sets); the running sums go through C unchanged. */
#define KC 256

AI void panel_packed(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
                     const float *B, int ldb, int M, int K, int acc, __mmask16 mask, float *buf) {
    const int w = NV * 16;
    if (ldb == w) { /* already contiguous */
        panel(NV, MASKED, C, ldc, A, a_rs, a_cs, B, ldb, M, K, acc, mask);
        return;
    }
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC;
        for (int k = 0; k < kc; k++) {
            const float *src = B + (int64_t)(k0 + k) * ldb;
            float *dst = buf + k * w;
            if (MASKED) {
                if (NV == 2) _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
                _mm512_storeu_ps(dst + w - 16, _mm512_maskz_loadu_ps(mask, src + w - 16));
            } else {
#pragma GCC unroll 2
                for (int v = 0; v < NV; v++) _mm512_storeu_ps(dst + 16 * v, _mm512_loadu_ps(src + 16 * v));
            }
        }
        /* the packed copy has zeros in dead lanes: plain loads are safe; C stays masked */
        panel(NV, MASKED, C, ldc, A + k0 * a_cs, a_rs, a_cs, buf, w, M, kc, acc || k0 > 0, mask);
    }
}

/* Short reductions (the LoRA rank: K = r): gemm_avx2.c's row-outer order (against 4K aliasing
 * between a tile's stores and the next tile's loads), B packed in chunks of SK_NC columns as
 * K × 32 panels. */
#define SK_K 32
#define SK_NC 256

AI void rowtile_smallk(const int MR, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *P,
                       int nc, int K, int acc, __mmask16 mask) {
    int n = 0;
    for (; n + 32 <= nc; n += 32) tile(MR, 2, 0, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 32, K, acc, mask);
    const int rest = nc - n;
    if (rest > 16) tile(MR, 2, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 32, K, acc, mask);
    else if (rest > 0) tile(MR, 1, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 32, K, acc, mask);
}

static void gemm_smallk(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                        int N, int K, int acc) {
    float P[SK_K * SK_NC] __attribute__((aligned(64)));
    for (int n0 = 0; n0 < N; n0 += SK_NC) {
        const int nc = N - n0 < SK_NC ? N - n0 : SK_NC;
        /* P[panel][k][32] = B[k][n0 + 32·panel + j], zero past nc */
        for (int p = 0; p * 32 < nc; p++) {
            const int w = nc - 32 * p < 32 ? nc - 32 * p : 32;
            const __mmask16 m0 = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1);
            const __mmask16 m1 = w >= 32 ? (__mmask16)0xFFFF : w > 16 ? (__mmask16)((1u << (w - 16)) - 1) : 0;
            for (int k = 0; k < K; k++) {
                const float *src = B + (int64_t)k * ldb + n0 + 32 * p;
                float *dst = P + ((int64_t)p * K + k) * 32;
                _mm512_store_ps(dst, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(dst + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        }
        const int rest = nc % 32, live = rest > 16 ? rest - 16 : rest;
        const __mmask16 mask = (__mmask16)((1u << live) - 1);
        float *Cn = C + n0;
        int m = 0;
        for (; m + 6 <= M; m += 6)
            rowtile_smallk(6, Cn + (int64_t)m * ldc, ldc, A + m * a_rs, a_rs, a_cs, P, nc, K, acc, mask);
        float *Cm = Cn + (int64_t)m * ldc;
        const float *Am = A + m * a_rs;
        switch (M - m) {
        case 5: rowtile_smallk(5, Cm, ldc, Am, a_rs, a_cs, P, nc, K, acc, mask); break;
        case 4: rowtile_smallk(4, Cm, ldc, Am, a_rs, a_cs, P, nc, K, acc, mask); break;
        case 3: rowtile_smallk(3, Cm, ldc, Am, a_rs, a_cs, P, nc, K, acc, mask); break;
        case 2: rowtile_smallk(2, Cm, ldc, Am, a_rs, a_cs, P, nc, K, acc, mask); break;
        case 1: rowtile_smallk(1, Cm, ldc, Am, a_rs, a_cs, P, nc, K, acc, mask); break;
        default: break;
        }
    }
}

void nl_gemm_nn_avx512(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                       int N, int K, int acc) {
    if (K <= SK_K && N > 16) {
        gemm_smallk(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
        return;
    }
    float buf[KC * 32] __attribute__((aligned(64)));
    int n = 0;
    for (; n + 32 <= N; n += 32) panel_packed(2, 0, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, 0xFFFF, buf);
    const int rest = N - n;
    if (rest == 0) return;
    /* lanes < (rest mod 16, or 16) of the last vector are live */
    const int live = rest > 16 ? rest - 16 : rest;
    const __mmask16 mask = (__mmask16)((1u << live) - 1);
    if (rest > 16) panel_packed(2, 1, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, mask, buf);
    else if (rest == 16) panel_packed(1, 0, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, 0xFFFF, buf);
    else panel_packed(1, 1, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, mask, buf);
}

/* cpu/gemm_avx2: the nodes' small FP32 GEMM (cpu/gemm.c's contract: one FMA chain per element,
 * k ascending) and the row dots on AVX2 + FMA; built with the AVX2 flags (the file's name:
 * CMakeLists.txt), only on x86-64; the AVX2 and AVX-512 kernel sets' gemm_nn and dot_rows. */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline

/* One tile: rows m..m+MR-1 (MR <= 6, a compile-time constant after inlining), columns
 * n..n+NV*8-1; when MASKED the last vector's lanes are limited by `mask`. */
AI void tile(const int MR, const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs,
             int64_t a_cs, const float *B, int ldb, int K, int acc, __m256i mask) {
    __m256 c[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *cp = C + (int64_t)i * ldc + 8 * v;
            if (!acc) c[i][v] = _mm256_setzero_ps();
            else if (MASKED && v == NV - 1) c[i][v] = _mm256_maskload_ps(cp, mask);
            else c[i][v] = _mm256_loadu_ps(cp);
        }
    const float *a = A;
    const float *b = B;
    for (int k = 0; k < K; k++, a += a_cs, b += ldb) {
        __m256 b0 = NV == 2 || !MASKED ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, mask);
        __m256 b1 = NV == 1 ? b0 : MASKED ? _mm256_maskload_ps(b + 8, mask) : _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m256 x = _mm256_broadcast_ss(a + i * a_rs);
            c[i][0] = _mm256_fmadd_ps(x, b0, c[i][0]);
            if (NV == 2) c[i][1] = _mm256_fmadd_ps(x, b1, c[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *cp = C + (int64_t)i * ldc + 8 * v;
            if (MASKED && v == NV - 1) _mm256_maskstore_ps(cp, mask, c[i][v]);
            else _mm256_storeu_ps(cp, c[i][v]);
        }
}

/* All row tiles of one column panel of NV vectors. */
AI void panel(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
              const float *B, int ldb, int M, int K, int acc, __m256i mask) {
    int m = 0;
    for (; m + 6 <= M; m += 6)
        tile(6, NV, MASKED, C + (int64_t)m * ldc, ldc, A + m * a_rs, a_rs, a_cs, B, ldb, K, acc, mask);
    const int r = M - m;
    float *Cm = C + (int64_t)m * ldc;
    const float *Am = A + m * a_rs;
    switch (r) {
    case 5: tile(5, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
    case 4: tile(4, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
    case 3: tile(3, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
    case 2: tile(2, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
    case 1: tile(1, NV, MASKED, Cm, ldc, Am, a_rs, a_cs, B, ldb, K, acc, mask); break;
    default: break;
    }
}

/* Rows of B per packed chunk: a KCxNV*8 panel of B is copied into contiguous scratch when B's
 * rows are not already contiguous, so a power-of-two row stride (e.g. 2048 floats) cannot
 * make the panel's rows collide in a few L1 sets. Splitting k into chunks keeps the chain:
 * the running sums go through C unchanged (a float stored and reloaded is the same float). */
#define KC 256

AI void panel_packed(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
                     const float *B, int ldb, int M, int K, int acc, __m256i mask, float *buf) {
    const int w = NV * 8;
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
                if (NV == 2) _mm256_storeu_ps(dst, _mm256_loadu_ps(src));
                _mm256_storeu_ps(dst + w - 8, _mm256_maskload_ps(src + w - 8, mask));
            } else {
#pragma GCC unroll 2
                for (int v = 0; v < NV; v++) _mm256_storeu_ps(dst + 8 * v, _mm256_loadu_ps(src + 8 * v));
            }
        }
        /* the packed copy has zeros in dead lanes: plain loads are safe; C stays masked */
        panel(NV, MASKED, C, ldc, A + k0 * a_cs, a_rs, a_cs, buf, w, M, kc, acc || k0 > 0, mask);
    }
}

/* Short reductions (the LoRA rank: K = r). Panel-outer order would store a tile of C rows and
 * then load the next tile's rows, a multiple of 4 KB further when ldc is a power of two (2048
 * floats): each load then waits on a store with the same low address bits (4K aliasing: 43 vs
 * 71 GFLOP/s with a padded ldc). Here B is packed in chunks of SK_NC columns (K x 16 panels,
 * contiguous: B's own rows, 8 KB apart, would share one L1 set), and within a chunk the row
 * tiles are outside and the panels inside, so consecutive tiles are the next 64 bytes of the
 * same rows. Each C element is still one chain over k in order: the same bits as panel order. */
#define SK_K 32
#define SK_NC 256

AI void rowtile_smallk(const int MR, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *P,
                       int nc, int K, int acc, __m256i mask) {
    int n = 0;
    for (; n + 16 <= nc; n += 16) tile(MR, 2, 0, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
    const int rest = nc - n;
    if (rest > 8) tile(MR, 2, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
    else if (rest > 0) tile(MR, 1, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
}

static void gemm_avx2_smallk(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb,
                             int M, int N, int K, int acc) {
    float P[SK_K * SK_NC] __attribute__((aligned(32)));
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int n0 = 0; n0 < N; n0 += SK_NC) {
        const int nc = N - n0 < SK_NC ? N - n0 : SK_NC;
        /* P[panel][k][16] = B[k][n0 + 16·panel + j], zero past nc */
        for (int p = 0; p * 16 < nc; p++) {
            const int w = nc - 16 * p < 16 ? nc - 16 * p : 16;
            for (int k = 0; k < K; k++) {
                const float *src = B + (int64_t)k * ldb + n0 + 16 * p;
                float *dst = P + ((int64_t)p * K + k) * 16;
                if (w == 16) {
                    _mm256_store_ps(dst, _mm256_loadu_ps(src));
                    _mm256_store_ps(dst + 8, _mm256_loadu_ps(src + 8));
                } else {
                    for (int j = 0; j < 16; j++) dst[j] = j < w ? src[j] : 0.0f;
                }
            }
        }
        const int rest = nc % 16, live = rest > 8 ? rest - 8 : rest;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), lane);
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

void nl_gemm_nn_avx2(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                     int N, int K, int acc) {
    if (K <= SK_K && N > 16) {
        gemm_avx2_smallk(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
        return;
    }
    float buf[KC * 16] __attribute__((aligned(32)));
    const __m256i ones = _mm256_set1_epi32(-1);
    int n = 0;
    for (; n + 16 <= N; n += 16) panel_packed(2, 0, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, ones, buf);
    const int rest = N - n;
    if (rest == 0) return;
    /* lanes < (rest mod 8, or 8) of the last vector are live */
    const int live = rest > 8 ? rest - 8 : rest;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), lane);
    if (rest > 8) panel_packed(2, 1, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, mask, buf);
    else panel_packed(1, 1, C + n, ldc, A, a_rs, a_cs, B + n, ldb, M, K, acc, mask, buf);
}

/* 4 independent chains at a time (one FMA each per k): throughput, not latency, bound. */
void nl_dot_rows_avx2(float *out, const float *A, int lda, const float *B, int ldb, int n, int K) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *a0 = A + (int64_t)i * lda, *b0 = B + (int64_t)i * ldb;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int k = 0; k < K; k++) {
            s0 = __builtin_fmaf(a0[k], b0[k], s0);
            s1 = __builtin_fmaf(a0[lda + k], b0[ldb + k], s1);
            s2 = __builtin_fmaf(a0[2 * (int64_t)lda + k], b0[2 * (int64_t)ldb + k], s2);
            s3 = __builtin_fmaf(a0[3 * (int64_t)lda + k], b0[3 * (int64_t)ldb + k], s3);
        }
        out[i] = s0, out[i + 1] = s1, out[i + 2] = s2, out[i + 3] = s3;
    }
    for (; i < n; i++) {
        const float *a = A + (int64_t)i * lda, *b = B + (int64_t)i * ldb;
        float s0 = 0.0f;
        for (int k = 0; k < K; k++) s0 = __builtin_fmaf(a[k], b[k], s0);
        out[i] = s0;
    }
}

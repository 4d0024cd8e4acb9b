/* cpu/gemm: the nodes' small-GEMM kernel (declared in vecmath.h), for the attention blocks
 * and the LoRA rank-r products.
 *
 *   C[M][N] (= or +=) Σ_k A(i, k) · B[k][N]     A(i, k) = A[i·a_rs + k·a_cs]
 *
 * so one kernel serves A row-major (a_rs = lda, a_cs = 1) and A transposed (a_rs = 1,
 * a_cs = lda: C += Aᵀ·B without a transposed copy).
 *
 * Determinism: every element of C is ONE multiply-add chain over k in increasing order,
 * starting from C's old value (accumulate) or from 0 — in the wide kernel, in every edge case
 * and in the scalar fallback alike. So the result of an element does not depend on M, N, the
 * tiling, the thread that computes it, or on splitting the k range over several calls
 * (gradient accumulation across token blocks gives the same bits as one call).
 *
 * x86-64 with AVX2+FMA (checked at run time, util/cpu): 6×16 register tiles of fused multiply-adds
 * (12 ymm accumulators), n-panels outside so a K×16 panel of B stays in L1 while the row
 * tiles go by; partial panels with masked loads/stores. AArch64 (Advanced SIMD is always
 * there): the same fused chains, 4×8 register blocks of FMLA (8 q accumulators) and scalar
 * FMADD chains at the edges, so its bits are x86-64's. Elsewhere: portable C with separate
 * multiply and add (no FMA contraction under -std=c11), the same chain order. */
#include "cpu/cpu.h"
#include "cpu/vecmath.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define NL_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

/* ---- portable ---- */
static void gemm_c(float *restrict C, int ldc, const float *restrict A, int64_t a_rs, int64_t a_cs,
                   const float *restrict B, int ldb, int M, int N, int K, int acc) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        const float *a0 = A + m * a_rs, *a1 = a0 + a_rs, *a2 = a1 + a_rs, *a3 = a2 + a_rs;
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            float c0[8], c1[8], c2[8], c3[8];
            float *cr = C + (int64_t)m * ldc + n;
            for (int l = 0; l < 8; l++) {
                c0[l] = acc ? cr[l] : 0.0f;
                c1[l] = acc ? cr[ldc + l] : 0.0f;
                c2[l] = acc ? cr[2 * ldc + l] : 0.0f;
                c3[l] = acc ? cr[3 * ldc + l] : 0.0f;
            }
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += ldb) {
                const float x0 = a0[k * a_cs], x1 = a1[k * a_cs], x2 = a2[k * a_cs], x3 = a3[k * a_cs];
                for (int l = 0; l < 8; l++) {
                    c0[l] += x0 * b[l];
                    c1[l] += x1 * b[l];
                    c2[l] += x2 * b[l];
                    c3[l] += x3 * b[l];
                }
            }
            for (int l = 0; l < 8; l++) {
                cr[l] = c0[l];
                cr[ldc + l] = c1[l];
                cr[2 * ldc + l] = c2[l];
                cr[3 * ldc + l] = c3[l];
            }
        }
        for (; n < N; n++)
            for (int i = 0; i < 4; i++) {
                const float *ai = A + (m + i) * a_rs;
                float *c = C + (int64_t)(m + i) * ldc + n;
                float s = acc ? *c : 0.0f;
                for (int k = 0; k < K; k++) s += ai[k * a_cs] * B[(int64_t)k * ldb + n];
                *c = s;
            }
    }
    for (; m < M; m++) {
        const float *ai = A + m * a_rs;
        float *cr = C + (int64_t)m * ldc;
        for (int n = 0; n < N; n++) {
            float s = acc ? cr[n] : 0.0f;
            for (int k = 0; k < K; k++) s += ai[k * a_cs] * B[(int64_t)k * ldb + n];
            cr[n] = s;
        }
    }
}

#ifdef NL_X86
#define AVX2 __attribute__((target("avx2,fma")))
#define AI __attribute__((always_inline)) static inline

/* One tile: rows m..m+MR-1 (MR <= 6, a compile-time constant after inlining), columns
 * n..n+NV*8-1; when MASKED the last vector's lanes are limited by `mask`. */
AI AVX2 void tile(const int MR, const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
                  const float *B, int ldb, int K, int acc, __m256i mask) {
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
AI AVX2 void panel(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb,
                   int M, int K, int acc, __m256i mask) {
    int m = 0;
    for (; m + 6 <= M; m += 6) tile(6, NV, MASKED, C + (int64_t)m * ldc, ldc, A + m * a_rs, a_rs, a_cs, B, ldb, K, acc, mask);
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

AI AVX2 void panel_packed(const int NV, const int MASKED, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs,
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

AI AVX2 void rowtile_smallk(const int MR, float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *P,
                            int nc, int K, int acc, __m256i mask) {
    int n = 0;
    for (; n + 16 <= nc; n += 16) tile(MR, 2, 0, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
    const int rest = nc - n;
    if (rest > 8) tile(MR, 2, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
    else if (rest > 0) tile(MR, 1, 1, C + n, ldc, A, a_rs, a_cs, P + (int64_t)n * K, 16, K, acc, mask);
}

static AVX2 void gemm_avx2_smallk(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb,
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
        for (; m + 6 <= M; m += 6) rowtile_smallk(6, Cn + (int64_t)m * ldc, ldc, A + m * a_rs, a_rs, a_cs, P, nc, K, acc, mask);
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

static AVX2 void gemm_avx2(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
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
static AVX2 void dot_rows_fma(float *out, const float *A, int lda, const float *B, int ldb, int n, int K) {
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

#endif

#if defined(__aarch64__)
/* One element: the fused chain from s (k increasing), one FMADD per k. */
static inline float chain_fma(float s, const float *a, int64_t a_cs, const float *b, int64_t ldb, int K) {
    for (int k = 0; k < K; k++) s = __builtin_fmaf(a[k * a_cs], b[(int64_t)k * ldb], s);
    return s;
}

/* Rows m..m+R-1 (R <= 4) × columns n..n+7: R×2 q accumulators of FMLA by element. */
#define NEON_BLOCK(R)                                                                                           \
    do {                                                                                                        \
        float32x4_t c[4][2];                                                                                    \
        for (int i = 0; i < (R); i++) {                                                                         \
            c[i][0] = acc ? vld1q_f32(cr + (int64_t)i * ldc) : vdupq_n_f32(0.0f);                               \
            c[i][1] = acc ? vld1q_f32(cr + (int64_t)i * ldc + 4) : vdupq_n_f32(0.0f);                           \
        }                                                                                                       \
        const float *b = B + n;                                                                                 \
        for (int k = 0; k < K; k++, b += ldb) {                                                                 \
            const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);                                         \
            for (int i = 0; i < (R); i++) {                                                                     \
                const float x = am[i * a_rs + k * a_cs];                                                        \
                c[i][0] = vfmaq_n_f32(c[i][0], b0, x);                                                          \
                c[i][1] = vfmaq_n_f32(c[i][1], b1, x);                                                          \
            }                                                                                                   \
        }                                                                                                       \
        for (int i = 0; i < (R); i++) {                                                                         \
            vst1q_f32(cr + (int64_t)i * ldc, c[i][0]);                                                          \
            vst1q_f32(cr + (int64_t)i * ldc + 4, c[i][1]);                                                      \
        }                                                                                                       \
    } while (0)

static void gemm_neon(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M, int N,
                      int K, int acc) {
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
#endif

void nl_dot_rows(float *out, const float *A, int lda, const float *B, int ldb, int n, int K) {
#ifdef NL_X86
    if (nl_cpu_has(NL_CPU_AVX2)) {
        dot_rows_fma(out, A, lda, B, ldb, n, K);
        return;
    }
#endif
#if defined(__aarch64__)
    for (int i = 0; i < n; i++) out[i] = chain_fma(0.0f, A + (int64_t)i * lda, 1, B + (int64_t)i * ldb, 1, K);
    return;
#endif
    for (int i = 0; i < n; i++) {
        const float *a = A + (int64_t)i * lda, *b = B + (int64_t)i * ldb;
        float s0 = 0.0f;
        for (int k = 0; k < K; k++) s0 += a[k] * b[k];
        out[i] = s0;
    }
}

static void gemm(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M, int N,
                 int K, int acc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!acc)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) C[(int64_t)m * ldc + n] = 0.0f;
        return;
    }
#ifdef NL_X86
    if (nl_cpu_has(NL_CPU_AVX2)) {
        gemm_avx2(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
        return;
    }
#endif
#if defined(__aarch64__)
    gemm_neon(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
    (void)gemm_c;
#else
    gemm_c(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
#endif
}

void nl_gemm_acc(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                 int N, int K) {
    gemm(C, ldc, A, lda, 1, B, ldb, M, N, K, 1);
}

void nl_gemm(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M, int N,
             int K, int accumulate) {
    gemm(C, ldc, A, lda, 1, B, ldb, M, N, K, accumulate);
}

void nl_gemm_tn(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                int N, int K, int accumulate) {
    gemm(C, ldc, A, 1, lda, B, ldb, M, N, K, accumulate);
}

int nl_gemm_wide(void) {
#ifdef NL_X86
    return nl_cpu_has(NL_CPU_AVX2);
#elif defined(__aarch64__)
    return 1;
#else
    return 0;
#endif
}

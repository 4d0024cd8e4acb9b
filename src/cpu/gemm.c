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
 * The kernel set's gemm_nn where it has one (cpu/kernels.h; gemm_avx2.c: x86-64 with AVX2+FMA): 6×16 register tiles of
 * fused multiply-adds (12 ymm accumulators), n-panels outside so a K×16 panel of B stays in L1 while the row tiles go
 * by; partial panels with masked loads/stores; on AArch64 (gemm_neon.c) the same fused chains in 4×8 blocks of FMLA, so
 * its bits are x86-64's. Elsewhere: portable C with separate multiply and add (no FMA contraction under -std=c11), the
 * same chain order. */
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

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

void nl_dot_rows(float *out, const float *A, int lda, const float *B, int ldb, int n, int K) {
    const nl_host_kernels *ks = nl_cpu_kernels();
    if (ks->dot_rows) {
        ks->dot_rows(out, A, lda, B, ldb, n, K);
        return;
    }
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
    const nl_host_kernels *ks = nl_cpu_kernels();
    if (ks->gemm_nn) {
        ks->gemm_nn(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
        return;
    }
    gemm_c(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, acc);
}

void nl_gemm_acc(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                 int N, int K) {
    gemm(C, ldc, A, lda, 1, B, ldb, M, N, K, 1);
}

void nl_gemm(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
             int N, int K, int accumulate) {
    gemm(C, ldc, A, lda, 1, B, ldb, M, N, K, accumulate);
}

void nl_gemm_tn(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                int N, int K, int accumulate) {
    gemm(C, ldc, A, 1, lda, B, ldb, M, N, K, accumulate);
}

int nl_gemm_wide(void) { return nl_cpu_kernels()->gemm_nn != NULL; }

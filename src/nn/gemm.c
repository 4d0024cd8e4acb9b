/* nn/gemm: the one small-GEMM kernel of nn/ (declared in vecmath.h). */
#include "nn/vecmath.h"

/* C[M][N] += A[M][K] · B[K][N]; every matrix row-major with its own row stride (ld*). The
 * 4×8 tile's accumulators live in registers across the K loop; edges fall back to narrower
 * code. The summation order over K is fixed (deterministic). */
void nl_gemm_acc(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb,
                     int M, int N, int K) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        const float *a0 = A + (int64_t)m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            float c0[8], c1[8], c2[8], c3[8];
            float *cr = C + (int64_t)m * ldc + n;
            for (int l = 0; l < 8; l++) {
                c0[l] = cr[l];
                c1[l] = cr[ldc + l];
                c2[l] = cr[2 * ldc + l];
                c3[l] = cr[3 * ldc + l];
            }
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += ldb) {
                const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
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
        for (; n < N; n++) {
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += ldb) {
                s0 += a0[k] * b[0];
                s1 += a1[k] * b[0];
                s2 += a2[k] * b[0];
                s3 += a3[k] * b[0];
            }
            float *cr = C + (int64_t)m * ldc + n;
            cr[0] += s0;
            cr[ldc] += s1;
            cr[2 * ldc] += s2;
            cr[3 * ldc] += s3;
        }
    }
    for (; m < M; m++) {
        const float *a0 = A + (int64_t)m * lda;
        float *cr = C + (int64_t)m * ldc;
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            float c0[8];
            for (int l = 0; l < 8; l++) c0[l] = cr[n + l];
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += ldb) {
                const float x0 = a0[k];
                for (int l = 0; l < 8; l++) c0[l] += x0 * b[l];
            }
            for (int l = 0; l < 8; l++) cr[n + l] = c0[l];
        }
        for (; n < N; n++) {
            float s0 = 0;
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += ldb) s0 += a0[k] * b[0];
            cr[n] += s0;
        }
    }
}

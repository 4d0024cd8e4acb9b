/* cpu/gemm_bf16.h (for nn/): the BF16 pieces of the attention's BF16 variant
 * (cpu/gemm_bf16_avx512.c): conversions of FP32 blocks into BF16 pair words, one GEMM on those words
 * with FP32 accumulation (AVX512_BF16 vdpbf16ps), and the FP32 row steps of the softmax.
 *
 * A "word" is a uint32_t holding two BF16 numbers, the first in the low half. The GEMM
 * contracts over pairs: C[i][n] (+)= Σ_w a_w.lo·b_w.lo + a_w.hi·b_w.hi with A's words along
 * each row of A and B's words down each column of B, so both operands need their reduction
 * index paired. The four packers give every layout the attention needs without a separate
 * transpose pass:
 *   rows:    dst[r][w] = (x[r][2w], x[r][2w+1])     pairs along a row        [R][ceil(C/2)]
 *   rows_t:  dst[w][r] = (x[r][2w], x[r][2w+1])     the same, transposed     [ceil(C/2)][R]
 *   pairs:   dst[w][c] = (x[2w][c], x[2w+1][c])     pairs of rows            [ceil(R/2)][C]
 *   pairs_t: dst[c][w] = (x[2w][c], x[2w+1][c])     the same, transposed     [C][ceil(R/2)]
 * Rounding is to nearest even (vcvtne2ps2bf16); elements past R or C are written as 0, so
 * odd sizes pad with zeros that add nothing to any product.
 *
 * Everything here runs only when nl_bf16_ok(): the kernel set in use (cpu/kernels.h) has a bf16
 * row and the CPU has AVX512_BF16 (x86-64); elsewhere nl_bf16_ok() is 0 and nothing here may be
 * called. Results are
 * deterministic: each C element is one chain of vdpbf16ps over w in increasing order, from 0
 * or from C's old value, whatever M, N or the caller's thread split. */
#ifndef NL_CPU_GEMM_BF16_H
#define NL_CPU_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

/* The pieces, one row of them per kernel set that has them (nl_cpu_bf16_avx512).
 * Packers (shapes above; x has row stride lds floats, dst row stride ldd words):
 *   rows:    writes w < nw for r < R (nw >= ceil(C/2)).
 *   rows_t:  writes w < ceil(C/2), r < rpad (rpad >= R).
 *   pairs:   writes w < ceil(R/2), c < cpad (cpad >= C).
 *   pairs_t: writes c < C, w < wpad (wpad >= ceil(R/2)).
 * gemm: C[M][N] (+)= A·B over K2 words: A[M][K2] (row stride lda words), B[K2][*] (row stride
 *   ldb words; each row readable up to N rounded up to 16 — the packers' padding).
 * transpose_f32: dst[c][r] = x[r][c] for r < R, c < C (FP32, exact).
 * Softmax rows in FP32 (exp as cpu/vecmath.h's nl_fexp: the same reduction and polynomial,
 * 16 lanes with FMA):
 *   row_scale_max: sr[j] *= c for j < nv; returns the max of those (nv >= 1).
 *   row_exp_pack:  p_j = exp(sr[j] − m) for j < nv (0 after), written as nw words of BF16 pairs
 *                  into pw (nw >= ceil(nv/2)); returns Σ p_j in FP32 (of the unrounded p).
 *   row_bwd:       p = exp(sr·c − L) into sr, ds = p·(dp − D)·c into dpr, for j < nv; both 0 in
 *                  [nv, n). */
typedef struct nl_bf16_kernels {
    void (*rows)(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int nw);
    void (*rows_t)(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int rpad);
    void (*pairs)(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int cpad);
    void (*pairs_t)(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int wpad);
    void (*gemm)(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                 int K2, int accumulate);
    void (*transpose_f32)(float *dst, int64_t ldd, const float *x, int64_t lds, int R, int C);
    float (*row_scale_max)(float *sr, int nv, float c);
    float (*row_exp_pack)(uint32_t *pw, const float *sr, int nv, int nw, float m);
    void (*row_bwd)(float *sr, float *dpr, int nv, int n, float c, float L, float D);
} nl_bf16_kernels;

#if defined(__x86_64__)
extern const nl_bf16_kernels nl_cpu_bf16_avx512; /* gemm_bf16_avx512.c */
#endif
/* The BF16 pieces of the kernel set in use (cpu/kernels.h: nl_cpu_kernels), NULL where there are
 * none (no bf16 row, or a CPU without AVX512_BF16). */
const nl_bf16_kernels *nl_cpu_bf16(void);
/* 1 when they can run. */
static inline int nl_bf16_ok(void) { return nl_cpu_bf16() != NULL; }

/* The nodes' calls, through the row (only when nl_bf16_ok()). */
static inline void nl_bf16_rows(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int nw) {
    nl_cpu_bf16()->rows(dst, ldd, x, lds, R, C, nw);
}
static inline void nl_bf16_rows_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int rpad) {
    nl_cpu_bf16()->rows_t(dst, ldd, x, lds, R, C, rpad);
}
static inline void nl_bf16_pairs(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int cpad) {
    nl_cpu_bf16()->pairs(dst, ldd, x, lds, R, C, cpad);
}
static inline void nl_bf16_pairs_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int wpad) {
    nl_cpu_bf16()->pairs_t(dst, ldd, x, lds, R, C, wpad);
}
static inline void nl_gemm_bf16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb,
                                int M, int N, int K2, int accumulate) {
    nl_cpu_bf16()->gemm(C, ldc, A, lda, B, ldb, M, N, K2, accumulate);
}
static inline void nl_transpose_f32(float *dst, int64_t ldd, const float *x, int64_t lds, int R, int C) {
    nl_cpu_bf16()->transpose_f32(dst, ldd, x, lds, R, C);
}
static inline float nl_bf16_row_scale_max(float *sr, int nv, float c) {
    return nl_cpu_bf16()->row_scale_max(sr, nv, c);
}
static inline float nl_bf16_row_exp_pack(uint32_t *pw, const float *sr, int nv, int nw, float m) {
    return nl_cpu_bf16()->row_exp_pack(pw, sr, nv, nw, m);
}
static inline void nl_bf16_row_bwd(float *sr, float *dpr, int nv, int n, float c, float L, float D) {
    nl_cpu_bf16()->row_bwd(sr, dpr, nv, n, c, L, D);
}

#endif

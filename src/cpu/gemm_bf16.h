/* cpu/gemm_bf16.h (for nn/): the BF16 pieces of the attention's BF16 variant
 * (cpu/gemm_bf16.c): conversions of FP32 blocks into BF16 pair words, one GEMM on those words
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
 * Everything here runs only when nl_bf16_ok() (x86-64 with AVX512F/BW/BF16, checked at run
 * time); elsewhere the functions are not built and nl_bf16_ok() is 0. Results are
 * deterministic: each C element is one chain of vdpbf16ps over w in increasing order, from 0
 * or from C's old value, whatever M, N or the caller's thread split. */
#ifndef NL_NN_GEMM_BF16_H
#define NL_NN_GEMM_BF16_H

#include <stdint.h>

/* 1 when the AVX512_BF16 kernels can run on this CPU. */
int nl_bf16_ok(void);

/* Packers (shapes above; x has row stride lds floats, dst row stride ldd words).
 * rows:    writes w < nw for r < R (nw >= ceil(C/2)).
 * rows_t:  writes w < ceil(C/2), r < rpad (rpad >= R).
 * pairs:   writes w < ceil(R/2), c < cpad (cpad >= C).
 * pairs_t: writes c < C, w < wpad (wpad >= ceil(R/2)). */
void nl_bf16_rows(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int nw);
void nl_bf16_rows_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int rpad);
void nl_bf16_pairs(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int cpad);
void nl_bf16_pairs_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int wpad);

/* C[M][N] (+)= A·B over K2 words: A[M][K2] (row stride lda words), B[K2][*] (row stride ldb
 * words; each row readable up to N rounded up to 16 — the packers' padding). */
void nl_gemm_bf16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                  int K2, int accumulate);

/* dst[c][r] = x[r][c] for r < R, c < C (FP32, exact). */
void nl_transpose_f32(float *dst, int64_t ldd, const float *x, int64_t lds, int R, int C);

/* Softmax rows in FP32 (exp as cpu/vecmath.h's nl_fexp: the same reduction and polynomial,
 * 16 lanes with FMA).
 * scale_max: sr[j] *= c for j < nv; returns the max of those (nv >= 1).
 * exp_pack:  p_j = exp(sr[j] − m) for j < nv (0 after), written as nw words of BF16 pairs
 *            into pw (nw >= ceil(nv/2)); returns Σ p_j in FP32 (of the unrounded p).
 * bwd:       p = exp(sr·c − L) into sr, ds = p·(dp − D)·c into dpr, for j < nv; both 0 in
 *            [nv, n). */
float nl_bf16_row_scale_max(float *sr, int nv, float c);
float nl_bf16_row_exp_pack(uint32_t *pw, const float *sr, int nv, int nw, float m);
void nl_bf16_row_bwd(float *sr, float *dpr, int nv, int n, float c, float L, float D);

#endif

/* cpu/vecmath.h (for nn/): small inline vector helpers written so that gcc -O2
 * vectorises them without -ffast-math.
 *
 * Why the odd shapes: gcc 12 at -O2 uses the "very cheap" vectoriser cost model, which only
 * vectorises a loop whose trip count is a known multiple of the vector width. A body written
 * as a fixed 8-lane inner loop ("for (l = 0; l < 8; l++)") is vectorised by the SLP pass at
 * any -O level, and an 8-lane partial-sum array lets a float reduction vectorise without
 * reassociation flags (the summation order is fixed, so results are deterministic). */
#ifndef NL_NN_VECMATH_H
#define NL_NN_VECMATH_H

#include <stdint.h>
#include <string.h>

#define NL_LANES 8

/* The element-wise nodes' loops built from these (norms, SwiGLU, gates, RoPE, cross-entropy,
 * the residual adds, LoRA's dropout products) are the kernel table's nl_vec_kernels
 * (cpu/vec_body.h, one source built per row's ISA flags: cpu/kernels.h); every build gives the
 * same bits (fixed 8-lane reduction orders, no contraction under -std=c11). */

/* C[M][N] += A[M][K] · B[K][N], row-major with row strides ldc/lda/ldb (cpu/gemm.c). C must not
 * overlap A or B. Used for the attention blocks and the LoRA rank-r products. Internal to
 * nn/ (not part of the nn.h contract). */
void nl_gemm_acc(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                 int N, int K);
/* C[M][N] (+)= A[M][K] · B[K][N]: accumulate = 0 overwrites C (no need to zero it first; the
 * same bits as zeroing and accumulating). */
void nl_gemm(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
             int N, int K, int accumulate);
/* C[M][N] (+)= Aᵀ · B with A stored [K][M] (row stride lda): no transposed copy needed. */
void nl_gemm_tn(float *restrict C, int ldc, const float *restrict A, int lda, const float *restrict B, int ldb, int M,
                int N, int K, int accumulate);
/* out[i] = Σ_k A[i][k]·B[i][k] for i < n, each as the SAME multiply-add chain (k increasing,
 * from 0) that nl_gemm uses for one element: a row dot that agrees bit for bit with a GEMM
 * element over the same numbers (attention's D_t against its dp). */
void nl_dot_rows(float *out, const float *A, int lda, const float *B, int ldb, int n, int K);
/* 1 when the fused kernel runs (x86-64 with AVX2+FMA, AArch64: results then differ in the last
 * bits from the portable kernel, deterministically, and agree between the two). */
int nl_gemm_wide(void);

/* The sum of 8 partial sums in one fixed order (lane l with lane l+4 first, then pairs): the
 * end of every 8-lane float reduction in nn/, so each gives the same bits in every caller. */
static inline float nl_lanes_sum(const float acc[NL_LANES]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Σ a[i]·b[i] with 8 partial sums (order fixed: deterministic, independent of threads). */
static inline float nl_vdot(const float *a, const float *b, int n) {
    float acc[NL_LANES] = {0};
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return nl_lanes_sum(acc) + tail;
}

/* y[i] += a·x[i] */
static inline void nl_vaxpy(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] += a * x[i + l];
    for (; i < n; i++) y[i] += a * x[i];
}

/* The memory-bound passes of the nodes (the LoRA branch's dropout products and adds, the
 * residual adds): 8-lane bodies so that they vectorise at -O2 (plain loops of unknown length
 * stayed scalar); each element's arithmetic is that of the plain loop (a product is rounded
 * before an add: no contraction under -std=c11), so the bits are the plain loop's. */
/* y[i] += x[i] */
static inline void nl_vadd(float *restrict y, const float *restrict x, int64_t n) {
    int64_t i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] += x[i + l];
    for (; i < n; i++) y[i] += x[i];
}

/* y[i] = a[i] + b[i] */
static inline void nl_vadd2(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    int64_t i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] = a[i + l] + b[i + l];
    for (; i < n; i++) y[i] = a[i] + b[i];
}

/* y[i] = a[i] · b[i] */
static inline void nl_vmul(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    int64_t i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] = a[i + l] * b[i + l];
    for (; i < n; i++) y[i] = a[i] * b[i];
}

/* y[i] += a[i] · b[i] (the product rounded, then the add) */
static inline void nl_vmuladd(float *restrict y, const float *restrict a, const float *restrict b, int64_t n) {
    int64_t i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] += a[i + l] * b[i + l];
    for (; i < n; i++) y[i] += a[i] * b[i];
}

/* y[i] *= a */
static inline void nl_vscale(float *y, float a, int n) {
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) y[i + l] *= a;
    for (; i < n; i++) y[i] *= a;
}

/* exp(x) in float, branch-free so that it vectorises: Cody-Waite range reduction
 * x = n·ln2 + r (|r| <= ln2/2, n by the 1.5·2^23 rounding trick), a degree-7 polynomial for
 * e^r (Taylor-like coefficients of the classic Cephes expf), and 2^n built in the exponent
 * bits. Max relative error about 1e-7 on [-87, 88]. Results: x < -87.3 (and -inf) -> 0 (no
 * denormals); x > 88.0 -> +inf; NaN -> +inf (callers never pass NaN on purpose). */
static inline float nl_fexp(float x) {
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
    float p = 1.98756915e-4f;
    p = p * r + 1.39819337e-3f;
    p = p * r + 8.33345205e-3f;
    p = p * r + 4.16657962e-2f;
    p = p * r + 1.66666657e-1f;
    p = p * r + 5.0e-1f;
    p = p * r * r + r + 1.0f;
    int32_t tb;
    memcpy(&tb, &t, 4);
    /* biased exponent of 2^n (meaningless when |x| is huge: the masks below take over). t < 0
     * only when x < -8.7e6, where the answer is 0; masking the sign keeps the int math in range. */
    int32_t e = ((tb & 0x7FFFFFFF) - 0x4B400000) + 127;
    int32_t neg = tb >> 31;               /* all ones iff t < 0 */
    int32_t lo = ~((e - 1) >> 31) & ~neg; /* all ones iff e >= 1 and t >= 0 (no underflow) */
    int32_t hi = ((e - 255) >> 31) | neg; /* all ones iff e < 255 or t < 0 (no overflow) */
    int32_t eb = (e & lo & hi) << 23;
    float sc;
    memcpy(&sc, &eb, 4);
    float y = p * sc;
    int32_t yb;
    memcpy(&yb, &y, 4);
    yb = (yb & lo & hi) | (0x7F800000 & ~hi);
    memcpy(&y, &yb, 4);
    return y;
}

/* y[i] = exp(x[i]) (y may alias x) */
static inline void nl_vexp(float *y, const float *x, int n) {
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES) {
        float tmp[NL_LANES];
        for (int l = 0; l < NL_LANES; l++) tmp[l] = nl_fexp(x[i + l]);
        for (int l = 0; l < NL_LANES; l++) y[i + l] = tmp[l];
    }
    for (; i < n; i++) y[i] = nl_fexp(x[i]);
}

/* σ(x) = 1 / (1 + e^{-x}); exact limits 0 and 1 for large |x| (e^{-x} -> inf or 0). */
static inline float nl_fsigmoid(float x) { return 1.0f / (1.0f + nl_fexp(-x)); }

#endif

/* cpu/kernels: the CPU kernel sets the `host` backend runs (docs/design.md §2); its knobs are
 * proj/host.h.
 *
 * The internal contract between host.c (tiling, packing, threads) and one kernel
 * set per instruction set: kernels_scalar.c, kernels_avx2.c, kernels_avx512.c (x86-64, built
 * with their -m flags and chosen at run time from cpuid) and kernels_neon.c (aarch64).
 *
 * How a projection runs (W is N×K row-major and is never transposed or copied whole):
 *   FWD  Y[T][N] = X[T][K]·Wᵀ   output panels of NL_HOST_NP columns n, reduction chunks of
 *                               NL_HOST_KC k: the tile W[n0..+NP][k0..+KC] is dequantized ONCE
 *                               into a scratch panel B[k][n] and then used for all T rows.
 *   BWD  Y[T][K] = X[T][N]·W    output panels of NP columns k, chunks of KC rows n: the tile
 *                               W[n0..+KC][k0..+NP] is dequantized once into B[n][k].
 * Both directions decode W with the same block decoder (value = (float)q · d for Q8_0/Q4_0,
 * the F16 value for F16, model/quant's to_float for other block types), so in f32 compute a
 * one-hot input gives the dequantized column (FWD) / row (BWD) bit for bit. In bf16 compute
 * (Q8_0/Q4_0 only) the activations are rounded to BF16 once per request; FWD does
 * (Σ bf16(x)·q)·d with the integer q (exact in BF16) and d in FP32, so one-hot FWD is exact;
 * BWD multiplies by bf16(q·d), the dequantized value rounded to BF16 when the panel is packed,
 * so one-hot BWD equals the dequantized row within 2⁻⁹ relative.
 * Threads split the OUTPUT panels, never the reduction: every output element is the same
 * FMA chain whatever the thread count or T (a row of Y does not depend on the other rows). */
#ifndef NL_CPU_KERNELS_H
#define NL_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"

#define NL_HOST_NP 64  /* output columns per packed panel */
#define NL_HOST_KC 256 /* reduction elements per packed chunk (multiple of 32 and of 256) */

typedef struct nl_host_kernels {
    const char *name;
    int has_bf16; /* gemm_bf16_* present */

    /* Row decoders into f32 (exact: F16 widening, (float)q*d for Q8_0). n / nblocks elements
     * or blocks; dst holds n or 32*nblocks floats. */
    void (*dq_f16)(const uint16_t *src, float *dst, int n);
    void (*dq_q8_0)(const nl_block_q8_0 *src, float *dst, int nblocks);

    /* C[i][j] (= or += when accumulate) Σ_p A[i*lda + p] · B[p*NP + j]
     * for i < m, p < kc, j < ncols (≤ NP). B is a packed panel, NP floats a row, zero-padded
     * past ncols. Each C element is one FMA chain in p order (p = 0 first). */
    void (*gemm_f32)(int m, int kc, const float *A, int64_t lda, const float *B, float *C,
                     int64_t ldc, int ncols, int accumulate);

    /* bf16 FWD on integer weights. A: m rows of BF16 activations (stride lda elements, even),
     * kc a multiple of 32. B: kc/2 rows of NP pairs (uint32: low half = even p, high half =
     * odd p; BF16 of the integer q). S: kc/32 rows of NP block scales.
     * C[i][j] (=|+=) Σ_b S[b][j] · (Σ_{p in block b} A[i][p] · q[p][j]). */
    void (*gemm_bf16_fwd)(int m, int kc, const uint16_t *A, int64_t lda, const uint32_t *B,
                          const float *S, float *C, int64_t ldc, int ncols, int accumulate);
    /* dst[c*ldd + r] = src[r*lds + c] for r < rows (a multiple of 16), c < cols: the FWD
     * panel transpose (f32 values or BF16 pairs). NULL = host.c's scalar loop. */
    void (*transpose32)(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd, int rows,
                        int cols);
    /* dst[i] = BF16 of the integer q[i], exact, i < n (a multiple of 16; bf16 sets only). */
    void (*i8_to_bf16)(const int8_t *q, int n, uint16_t *dst);
    /* dst[i] = BF16(r0[i]) | BF16(r1[i]) << 16 (round to nearest even), i < n (a multiple of
     * 16); r1 NULL = zeros: the BWD pairs of two consecutive dequantized rows of W (bf16 sets). */
    void (*pairs_to_bf16)(const float *r0, const float *r1, int n, uint32_t *dst);
    /* dst[i] = BF16 of src[i], round to nearest even, i < n (bf16 sets only). */
    void (*to_bf16)(const float *src, int n, uint16_t *dst);
    /* Optional (NULL = the generic decode): nblocks Q8_0 blocks -> dst[32·nblocks] BF16 of the
     * integers q (exact) and d[b·d_stride] = the FP32 block scales (the FWD tile rows). */
    void (*q8_0_to_bf16)(const nl_block_q8_0 *src, int nblocks, uint16_t *dst, float *d, int64_t d_stride);
    /* Optional: pairs_to_bf16 of two rows' dequantized Q8_0 blocks (nblocks each; b1 NULL =
     * zeros), dst[32·nblocks], the same bits as dq_q8_0 followed by pairs_to_bf16. */
    void (*q8_0_pairs_to_bf16)(const nl_block_q8_0 *b0, const nl_block_q8_0 *b1, int nblocks, uint32_t *dst);
    /* Optional (NULL = model/quant's to_float): nblocks Q5_0 blocks (22 bytes each, any
     * alignment) -> dst[32·nblocks] = (q - 16)·d, the same floats as to_float (the product is
     * exact in FP32: 5 × 11 bits), so every compute mode decodes Q5_0 as before, only faster. */
    void (*dq_q5_0)(const uint8_t *src, float *dst, int nblocks);
    /* bf16 BWD: C[i][j] (=|+=) Σ_{p2 < kp} A[i][2p2]·B[p2][j].lo + A[i][2p2+1]·B[p2][j].hi, i < m,
     * j < ncols. A: BF16 activations, stride lda elements (even); B: kp rows of NP pairs. */
    void (*gemm_bf16)(int m, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C,
                      int64_t ldc, int ncols, int accumulate);
} nl_host_kernels;

extern const nl_host_kernels nl_host_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const nl_host_kernels nl_host_kernels_avx2;
extern const nl_host_kernels nl_host_kernels_avx512;
#endif
#if defined(__aarch64__)
extern const nl_host_kernels nl_host_kernels_neon;
#endif

/* Shared scalar helpers (kernels_scalar.c). */
float nl_host_f16_to_f32(uint16_t h);
uint16_t nl_host_f32_to_bf16(float f); /* round to nearest even (like VCVTNEPS2BF16) */
/* Decode one 32-element block of an integer type (Q8_0, Q4_0) to q[32] and its scale d;
 * value = (float)q[i] * d. */
void nl_host_decode_int_block(int type, const void *block, int8_t *q, float *d);
/* Decode elements [k0, k0+n) of one row of `type` (any supported type; k0 need not be
 * block-aligned) into dst using the set's fast row decoders where there are some. */
void nl_host_dequant(const nl_host_kernels *ks, int type, const void *row, int64_t k0, int n,
                     float *dst);
/* 1 if host.c can decode this weight type. */
int nl_host_type_ok(int type);
/* 1 for types with an integer (q, d) form usable by the bf16 kernels (32-element blocks). */
int nl_host_type_int(int type);
/* 1 for the weight types bf16 compute takes: the integer types exactly (q in BF16, d applied in
 * FP32), every other quantized block type (Q4_1, Q4_K, Q6_K) as its FP32 decode rounded to BF16
 * (nearest even), in both directions. F32, F16 and BF16 weights stay on the FP32 kernels. */
int nl_host_type_bf16(int type);

#endif

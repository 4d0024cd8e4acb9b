/* cpu/kernels: the kernel table, one row per ISA level (docs/design.md §2, docs/architecture.md
 * "Adding an ISA"): kernels_scalar.c, kernels_avx2.c, kernels_avx512.c (x86-64) and
 * kernels_neon.c, kernels_neonbf16.c (aarch64), each defining one nl_host_kernels; dispatch.c, the one dispatcher,
 * lists them and picks the best this CPU runs (nl_cpu_kernels). Every GEMM-shaped kernel of the
 * library is an entry of the row: the `host` backend's (its knobs: proj/host.h) and the nodes'
 * (cpu/gemm.c's small GEMM, cpu/gemm_bf16.h's attention pieces, nn/gdn.c's chunk products), and
 * so are the element-wise nodes' vector bodies (norms, SwiGLU, gates, RoPE, cross-entropy, the
 * residual adds, LoRA's dropout products: nl_vec_kernels below, one source, cpu/vec_body.h).
 *
 * One ISA mechanism: a file of src/cpu/ whose name ends in _<isa>.c (kernels_avx2.c,
 * gemm_avx2.c, gdn_avx512.c, vec_avx2.c, kernels_amx.c, ...) is built with that ISA's flags and
 * only on its architecture (CMakeLists.txt); no other file carries ISA flags or target
 * attributes. Its functions run only through a row the dispatcher hands out where the CPU has
 * the ISA.
 *
 * The host backend's contract between host.c (tiling, packing, threads) and a row:
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
 * (the quantized block types: nl_host_type_bf16) the activations are rounded to BF16 once per
 * request and both directions multiply by bf16(w), the dequantized value rounded to BF16
 * (nearest even) when the panel is packed, through the same kernel (gemm_bf16): FWD's panel
 * pairs two consecutive k of one row of W, BWD's two consecutive rows. So FWD and BWD see the
 * same effective weights: one-hot FWD gives the column, one-hot BWD the row of bf16(w), bit for
 * bit (bf16(w) is within 2⁻⁹ relative of the dequantized value).
 * Threads split the OUTPUT panels, never the reduction: every output element is the same
 * FMA chain whatever the thread count or T (a row of Y does not depend on the other rows). */
#ifndef NL_CPU_KERNELS_H
#define NL_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"

#define NL_HOST_NP 64  /* output columns per packed panel */
#define NL_HOST_KC 256 /* reduction elements per packed chunk (multiple of 32 and of 256) */

/* The element-wise nodes' bodies: one source (cpu/vec_body.h) built once per row's flags (cpu/vec.c:
 * portable, the scalar row; vec_avx2.c, vec_avx512.c; vec_neon.c, the Arm rows: NEON intrinsics
 * for the loops gcc leaves scalar, the portable bodies for the rest). Every row gives the same bits
 * (the 8-lane loops of cpu/vecmath.h, a reduction's order fixed by its partial sums, no FMA
 * contraction under -std=c11). The nodes keep their control flow (rows, tokens, threads,
 * scratch) and call these for the loops. */
typedef struct nl_vec_kernels {
    /* nn/norm.c, one row of n: y = w ⊙ (x · rs), returns rs = 1/sqrt(mean(x²) + eps) (in double) */
    float (*rmsnorm_row)(float *y, const float *x, const float *w, int n, float eps);
    /* dx = rs · (dy⊙w − x · c), c = (Σ dy·w·x) · rs² / n (8 partial sums); dx may alias dy */
    void (*rmsnorm_bwd_row)(float *dx, const float *dy, const float *x, const float *w, float rs, int n);
    /* nn/mlp.c's contracts (nl_swiglu_forward, ...; outputs may alias inputs elementwise) */
    void (*swiglu_fwd)(float *h, const float *a, const float *b, int64_t n);
    void (*swiglu_bwd)(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n);
    void (*gate_fwd)(float *out, const float *o, const float *g, int64_t n);
    void (*gate_bwd)(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n);
    /* nn/xent.c, one target row z[V] (0 <= y < V): returns logsumexp(z) − z[y]; want_grad:
     * z = (softmax(z) − onehot(y)) · inv_n */
    double (*xent_row)(float *z, int y, int V, float inv_n, int want_grad);
    /* nn/attention.c's FP32 softmax rows (its comments: row_exp_sum, row_bwd) */
    float (*att_exp_sum)(float *sr, int nv, float m);
    void (*att_row_bwd)(float *sr, float *dpr, int nv, int n, float c, float L, float D);
    /* the tile forward's row (cpu/tiles.h's A rows): pa[j] = bf16(exp(sr[j]·c − m)) for j < nv
     * (the product rounded, then the difference: att_exp_sum's values on row_scale_max's), 0 for
     * nv <= j < np; returns Σ of the unrounded exps in att_exp_sum's order. bf16 rounds as
     * cpu/amx.h's nl_amx_f32_to_bf16. */
    float (*att_exp_bf16)(uint16_t *pa, const float *sr, int nv, int np, float c, float m);
    /* the tile backward's two rows r = 0, 1 at once (cpu/tiles.h's operands): att_row_bwd's p and
     * ds of row r for j < nv[r], 0 for nv[r] <= j < np, as BF16 (nl_amx_f32_to_bf16): ds as A
     * rows da[r][j], and both as VNNI pairs of the two rows, dsw[j] = ds₀ | ds₁ << 16 and
     * pw[j] = p₀ | p₁ << 16, for j < np (nv[r] <= np). nv[1] = 0: row 1 all zeros (sr[1], dp[1]
     * not read). */
    void (*att_bwd_bf16)(uint16_t *const da[2], uint32_t *dsw, uint32_t *pw, const float *const sr[2],
                         const float *const dp[2], const int nv[2], int np, float c, const float L[2],
                         const float D[2]);
    /* nn/rope.c: pairs c0 .. c0+nc-1 of each of one token's n_heads heads (x[h·hd ..]) rotated
     * by cs[j], sn[j]; neox: pairs (i, i + half), else (2i, 2i+1) */
    void (*rope_rotate)(float *x, int n_heads, int hd, int half, int c0, int nc, const float *cs, const float *sn,
                        int neox);
    /* y += x; y = a + b; y = a · b; y += a · b (the product rounded, then the add) */
    void (*add)(float *restrict y, const float *restrict x, int64_t n);
    void (*add2)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n);
    void (*mul)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n);
    void (*muladd)(float *restrict y, const float *restrict a, const float *restrict b, int64_t n);
} nl_vec_kernels;

extern const nl_vec_kernels nl_vec_kernels_portable;
#if defined(__x86_64__) || defined(_M_X64)
extern const nl_vec_kernels nl_vec_kernels_avx2;
extern const nl_vec_kernels nl_vec_kernels_avx512;
/* tests/test_nn only: nonzero makes the avx512 row's BF16 words (att_exp_bf16, att_bwd_bf16) take
 * their integer steps where the CPU has AVX512_BF16 too, as they run on AVX-512 CPUs without it */
extern int nl_vec_avx512_words_int;
#endif
#if defined(__aarch64__)
extern const nl_vec_kernels nl_vec_kernels_neon; /* cpu/vec_neon.c: the neon and neonbf16 rows' */
#endif

/* nn/lora.c's rank-16 products (cpu/lora_avx512.c; NULL in a row without them: the node's
 * nl_gemm calls). Every element is the chain cpu/gemm.c's contract gives it (one FMA chain over
 * k ascending from 0 or from C), so the bits are those of the nl_gemm calls they stand for.
 *   thin16: C[M][16] = Σ_{k<K} X[m·ldx + k]·P[k·16 + j]           (nl_gemm(C, 16, X, ldx, P, 16, M, 16, K, 0))
 *   tn16:   C'[i][n] += Σ_{t<T} P[t·ldp + i]·Q[t·ldq + n], i < 16, n < N, C' at C[i·ldc + n], or
 *           at C[n·ldc + i] when trans (the transposed product: the same chain, a·b = b·a)
 *   add16:  C[m][n] (op)= Σ_{k<16} P[m·ldp + k]·Qp(k, n), Qp packed as ceil(N/32) panels of
 *           16 × 32 (panel n/32 at Qp + 16·32·(n/32), zeros past N); op by mode: 0 =, 1 the
 *           chain from C, 2 C + (the chain from 0, rounded) */
/* The BF16 pair (AVX512_BF16 vdpbf16ps; called only where nl_bf16_ok(), cpu/gemm_bf16.h): operands
 * as words of two BF16 (cpu/gemm_bf16.h's packers), every element one chain over the words w
 * ascending, each word adding its high product and then its low one (both exact in FP32, each
 * add rounded to nearest even):
 *   thin16b: C[M][16] = Σ_{w<Kw} X[m·ldx + w]·P[w·16 + j]
 *   add16b:  C[m][n] (op)= Σ_{w<8} P[m·ldp + w]·Q[w·ldq + n] (Q readable up to N rounded up to
 *            32); op by mode: 0 =, 1 the chain from C, 2 C + chain, 3 C + (chain·Mk) (the
 *            product rounded, then the add), 4 chain·Mk; Mk[m·ldm + n] (modes 3, 4 only) */
typedef struct nl_lora_kernels {
    void (*thin16)(float *C, const float *X, int64_t ldx, const float *P, int M, int K);
    void (*tn16)(float *C, int ldc, int trans, const float *P, int ldp, const float *Q, int64_t ldq, int N, int T);
    void (*add16)(float *C, int64_t ldc, const float *P, int ldp, const float *Qp, int M, int N, int mode);
    void (*thin16b)(float *C, const uint32_t *X, int64_t ldx, const uint32_t *P, int M, int Kw);
    void (*add16b)(float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq, int M, int N,
                   int mode, const float *Mk, int64_t ldm);
    /* The dropout's backward from the forward's kept bits (nn/lora.h: mask_in), no mask or x ⊙ m
     * rows in memory; m(t, n) = inv where bit n of the bit row Kb + t·ldk (16-bit halves, element n
     * at bit n % 16 of half n / 16) is set, else 0 — the values and rounded products of
     * dropout_bits_row's:
     *   add16bk: add16b's modes 3 and 4 with Mk[m][n] = m(m, n) (row m of the call's block), the
     *            same bits as add16b on those mask rows;
     *   tn16k:   C[i·ldc + n] += Σ_{t<T} P[t·ldp + i]·(X[t·ldx + n]·m(t, b0 + n)), i < 16, n < N:
     *            tn16's chain (trans 0) over the rounded products x ⊙ m, the same bits as tn16 on
     *            those rows.
     * NULL where the row has none (the node writes the rows, as before). */
    void (*add16bk)(float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq, int M, int N,
                    int mode, const uint16_t *Kb, int64_t ldk, float inv);
    void (*tn16k)(float *C, int ldc, const float *P, int ldp, const float *X, int64_t ldx, const uint16_t *Kb,
                  int64_t ldk, int b0, float inv, int N, int T);
} nl_lora_kernels;

typedef struct nl_host_kernels {
    const char *name;
    int has_bf16; /* gemm_bf16 and the BF16 packs present */

    /* Row decoders into f32 (exact: F16 widening, (float)q*d for Q8_0). n / nblocks elements
     * or blocks; dst holds n or 32*nblocks floats. */
    void (*dq_f16)(const uint16_t *src, float *dst, int n);
    void (*dq_q8_0)(const nl_block_q8_0 *src, float *dst, int nblocks);

    /* C[i][j] (= or += when accumulate) Σ_p A[i*lda + p] · B[p*NP + j]
     * for i < m, p < kc, j < ncols (≤ NP). B is a packed panel, NP floats a row, zero-padded
     * past ncols up to the next multiple of 16; the columns past that hold anything (host.c
     * packs only the live 16-column groups) and C[i][j < ncols] must not depend on them.
     * Each C element is one FMA chain in p order (p = 0 first). */
    void (*gemm_f32)(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
                     int accumulate);

    /* dst[c*ldd + r] = src[r*lds + c] for r < rows (a multiple of 16), c < cols: the FWD
     * panel transpose (f32 values or BF16 pairs). NULL = host.c's scalar loop. */
    void (*transpose32)(const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd, int rows, int cols);
    /* dst[i] = BF16(r0[i]) | BF16(r1[i]) << 16 (round to nearest even), i < n (a multiple of
     * 16); r1 NULL = zeros: the BWD pairs of two consecutive dequantized rows of W (bf16 sets). */
    void (*pairs_to_bf16)(const float *r0, const float *r1, int n, uint32_t *dst);
    /* dst[i] = BF16 of src[i], round to nearest even, i < n (bf16 sets only). */
    void (*to_bf16)(const float *src, int n, uint16_t *dst);
    /* Optional (NULL = the scalar loop): the split form's second plane (proj/amx.c), lo[i] =
     * nl_host_f32_to_bf16(src[i] − hi[i] as FP32), the difference an FP32 subtraction, i < n
     * (any n); no BF16 instruction needed. */
    void (*to_bf16_lo)(const float *src, const uint16_t *hi, int n, uint16_t *lo);
    /* Optional (NULL = to_bf16 into a tile, then transpose32): the FWD panel's pairs of 16 rows of
     * W straight from their FP32 decode, rows[r·ldr + p] for r < 16, p < kc (a multiple of 32):
     * dst[(p/2)·ldd + r] = BF16(row r, p) | BF16(row r, p + 1) << 16, round to nearest even. */
    void (*fwd_pairs_f32)(const float *rows, int64_t ldr, int kc, uint32_t *dst, int64_t ldd);
    /* Optional: the same from 16 rows' Q8_0 blocks (rows[r]: nblocks blocks each), the values
     * of dq_q8_0 (q·d, exact) rounded to BF16: dst[p2·ldd + r], p2 < 16·nblocks. */
    void (*q8_0_fwd_pairs)(const nl_block_q8_0 *const rows[16], int nblocks, uint32_t *dst, int64_t ldd);
    /* Optional: pairs_to_bf16 of two rows' dequantized Q8_0 blocks (nblocks each; b1 NULL =
     * zeros), dst[32·nblocks], the same bits as dq_q8_0 followed by pairs_to_bf16. */
    void (*q8_0_pairs_to_bf16)(const nl_block_q8_0 *b0, const nl_block_q8_0 *b1, int nblocks, uint32_t *dst);
    /* Optional (NULL = model/quant's to_float): nblocks Q5_0 blocks (22 bytes each, any
     * alignment) -> dst[32·nblocks] = (q - 16)·d, the same floats as to_float (the product is
     * exact in FP32: 5 × 11 bits), so every compute mode decodes Q5_0 as before, only faster. */
    void (*dq_q5_0)(const uint8_t *src, float *dst, int nblocks);
    /* Optional (NULL = to_float): nblocks Q4_1 blocks (20 bytes each, any alignment) -> dst[32·nblocks]
     * = q·d + m, the same floats as to_float (q·d exact in FP32, one rounding either way). */
    void (*dq_q4_1)(const uint8_t *src, float *dst, int nblocks);
    /* bf16 FWD and BWD: C[i][j] (=|+=) Σ_{p2 < kp} A[i][2p2]·B[p2][j].lo + A[i][2p2+1]·B[p2][j].hi, i < m,
     * j < ncols. A: BF16 activations, stride lda elements (even); B: kp rows of NP pairs (the
     * columns past ncols rounded up to 16 hold anything, as for gemm_f32). */
    void (*gemm_bf16)(int m, int kp, const uint16_t *A, int64_t lda, const uint32_t *B, float *C, int64_t ldc,
                      int ncols, int accumulate);

    /* ---- the nodes' kernels (NULL: the node's portable form, the same contract) ---------- */
    /* cpu/gemm.c's small GEMM: C[M][N] (=|+=) Σ_k A[i·a_rs + k·a_cs] · B[k][N], each element one
     * FMA chain over k ascending from 0 or from C (vecmath.h: nl_gemm); and nl_dot_rows. */
    void (*gemm_nn)(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                    int N, int K, int accumulate);
    void (*dot_rows)(float *out, const float *A, int lda, const float *B, int ldb, int n, int K);
    /* the attention's BF16 pieces (cpu/gemm_bf16.h; used only where the CPU has AVX512_BF16) */
    const struct nl_bf16_kernels *bf16;
    /* nn/gdn.c: the state step on gdn_step_cols columns (cpu/gdn_simd.h, cpu/gdn_neon.c); the chunk products
     * (returns the columns it did, the node does the rest); the 8×8-block transpose (the node
     * does the edges); SiLU and its derivative (returns the elements it did). The same bits as
     * the node's portable forms at every level. */
    int gdn_step_cols;
    void (*gdn_step)(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                     float alpha, float beta, float scale, int dk, float *u, float *r_out, float *o);
    /* gdn_step in place over n consecutive tokens of one gdn_step_cols block, the passes of
     * neighbouring tokens fused (cpu/gdn_simd.h's GDN_SCAN4; NULL: gdn_step token by token) */
    void (*gdn_scan)(float *S, size_t ld, int dk, int n, const float *K, const float *Q, size_t ldkq, const float *V,
                     size_t ldv, const float *g, const float *be, size_t ldg, float scale, float *O, size_t ldo);
    int (*gdn_mm)(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *C,
                  size_t ldc, int acc);
    void (*gdn_transpose8)(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols);
    int (*gdn_silu_d)(float *y, float *d, const float *x, int n);
    /* y = x / (1 + expf(-x)) with libm's expf bits (y may equal x; returns the elements it did) */
    int (*gdn_silu)(float *y, const float *x, int n);
    /* nn/lora.c's dropout mask, one row: mr[i] = inv where the 32-bit half (i even: low, odd:
     * high) of nl_rng_u64(kt, i/2) is >= thr, else 0, for i below the count it returns (a
     * multiple of 16, <= K; the node does the rest); integer arithmetic, the node's bits. */
    int (*dropout_mask_row)(uint64_t kt, int K, uint32_t thr, float inv, float *mr);
    /* the same mask applied to one row of x, for the same count (NULL: the node's mask, multiply and
     * packing): mr[i] = the mask (mr may be NULL), xm[i] = x[i]·mr[i] rounded once (xm may be
     * NULL), xw[i/2] = that product as BF16 pair words (low half even i) rounded as cpu/amx.h's
     * nl_amx_f32_to_bf16 (xw may be NULL), kb[i/16] bit i%16 = 1 where the element is kept (the
     * bits nn/lora.h's mask_out keeps; kb may be NULL): the bits of the separate passes */
    int (*dropout_apply_row)(uint64_t kt, int K, uint32_t thr, float inv, const float *x, float *mr, float *xm,
                             uint32_t *xw, uint16_t *kb);
    /* the mask from those kept bits (nn/lora.h's mask_in, the backward): mr[i] = inv where bit i%16
     * of kb[i/16] is set, else 0, xm[i] = x[i]·mr[i] rounded once, for i below the count it returns
     * (a multiple of 16, <= n; NULL: the node's loop): the bits of dropout_apply_row's mr, xm (mr
     * may be NULL) */
    int (*dropout_bits_row)(const uint16_t *kb, int n, float inv, const float *x, float *mr, float *xm);
    /* the backward's dx through that mask: d[i] = t[i]·m[i] (accumulate 0) or d[i] += t[i]·m[i]
     * (the product rounded, then the add: vec mul / muladd's bits), m[i] = inv or 0 from kb as
     * there, for the same count (NULL: the node's loop) */
    int (*dropout_bits_madd)(const uint16_t *kb, int n, float inv, const float *t, float *d, int accumulate);
    const nl_lora_kernels *lora; /* nn/lora.c's rank-16 products (above) */
    /* the element-wise nodes' bodies (required: every row points at one of the builds above) */
    const nl_vec_kernels *vec;
} nl_host_kernels;

extern const nl_host_kernels nl_host_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const nl_host_kernels nl_host_kernels_avx2;
extern const nl_host_kernels nl_host_kernels_avx512;
extern const nl_lora_kernels nl_lora_kernels_avx512; /* cpu/lora_avx512.c */
/* the entries the rows share or take from the ISA's other files (gemm_avx2.c, gdn_avx*.c) */
void nl_gemm_nn_avx2(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                     int N, int K, int accumulate);
void nl_dot_rows_avx2(float *out, const float *A, int lda, const float *B, int ldb, int n, int K);
/* gemm_avx512.c: the AVX-512 row's gemm_nn (16-lane tiles; the same chains, the same bits as
 * nl_gemm_nn_avx2 and the portable fused chain) */
void nl_gemm_nn_avx512(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                       int N, int K, int accumulate);
void nl_gdn_step32_avx2(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                        float alpha, float beta, float scale, int dk, float *u, float *r_out, float *o);
void nl_gdn_step64_avx512(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                          float alpha, float beta, float scale, int dk, float *u, float *r_out, float *o);
void nl_gdn_scan64_avx512(float *S, size_t ld, int dk, int n, const float *K, const float *Q, size_t ldkq,
                          const float *V, size_t ldv, const float *g, const float *be, size_t ldg, float scale,
                          float *O, size_t ldo);
int nl_gdn_mm_avx2(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *C,
                   size_t ldc, int acc);
int nl_gdn_mm_avx512(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *C,
                     size_t ldc, int acc);
void nl_gdn_transpose8_avx2(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols);
int nl_gdn_silu_d_avx2(float *y, float *d, const float *x, int n);
int nl_gdn_silu_d_avx512(float *y, float *d, const float *x, int n);
int nl_gdn_silu_avx512(float *y, const float *x, int n);
#endif
#if defined(__aarch64__)
extern const nl_host_kernels nl_host_kernels_neon;
extern const nl_host_kernels nl_host_kernels_neonbf16; /* kernels_neonbf16.c: FEAT_BF16 */
/* the f32 entries the Arm rows share (kernels_neon.c) */
void nl_neon_dq_f16(const uint16_t *src, float *dst, int n);
void nl_neon_dq_q8_0(const nl_block_q8_0 *src, float *dst, int nblocks);
void nl_neon_gemm_f32(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
                      int accumulate);
void nl_gemm_nn_neon(float *C, int ldc, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int M,
                     int N, int K, int accumulate);
void nl_dot_rows_neon(float *out, const float *A, int lda, const float *B, int ldb, int n, int K);
/* gdn_neon.c: the GDN entries both Arm rows share (the same bits as nn/gdn.c's portable forms) */
void nl_gdn_step32_neon(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                        float alpha, float beta, float scale, int dk, float *u, float *r_out, float *o);
int nl_gdn_mm_neon(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *C,
                   size_t ldc, int acc);
void nl_gdn_transpose8_neon(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols);
int nl_gdn_silu_d_neon(float *y, float *d, const float *x, int n);
#endif

/* ---- the int8 FWD rows (the scalar model: cpu/i8.c; chosen in dispatch.c; design.md §2 "int8") ----
 * `--compute int8` on integer-quantized weights (Q8_0, Q4_0, Q5_0, Q4_1, Q4_K, Q6_K): the FWD
 * product with the activations quantized as llama.cpp's CPU backend does for the type (proj/
 * host_int8.c: Q8_0 per 32-block, Q8_1 for Q4_1, Q8_K per 256 for the K-quants), integer dot
 * products, then the float scales. BWD stays on the float kernels.
 *
 * gemm_i8_fwd contract (one call = m rows × one packed panel of NL_HOST_NP columns × kc
 * reduction elements, kc a multiple of gs; gs = 32, or 16 for Q6_K):
 *   A   m rows of u8 activations, the int8 q + 128, stride lda bytes (row i: A + i·lda);
 *   DX  the activations' group scales: DX[i·ldd + g], g < kc/gs; SX the same layout, the
 *       activation sum terms (NULL when MW is NULL);
 *   B   kc/4 rows of NL_HOST_NP uint32: lane j of row r holds the int8 weights q[4r..4r+3][j]
 *       (byte 0 = k 4r): the VNNI layout (vpdpbusd / SDOT / SMMLA take 4 consecutive k);
 *   BC  kc/gs rows of NL_HOST_NP int32: -128 · Σ_{p in g} q[p][j] (removes the +128, exact;
 *       exactly this: the SDOT row sums Σ ·q, signed × signed, and does not read BC);
 *   SW  kc/gs rows of NL_HOST_NP float weight scales; MW the same, the weight min terms, or NULL.
 *   Columns past ncols are zero in B, BC, SW, MW; C columns past ncols are not written.
 * For i < m, j < ncols: acc = accumulate ? C[i][j] : 0; then for g = 0, 1, ... in order:
 *   isum = BC[g][j] + Σ_{p in g} A[i][p]·q[p][j]      (int32, exact: |isum| < 2^20)
 *   acc  = fma((float)isum, SW[g][j] · DX[i][g], acc)  (the product rounded, then one FMA)
 *   acc  = fma(MW[g][j], SX[i][g], acc)                (only when MW)
 * and C[i][j] = acc. Every row follows this order, so every row gives the same bits as the
 * scalar one (tests/test_int8.c); threads split panels, never a reduction. A row for a new ISA
 * (AVX-VNNI; as the Arm SDOT and I8MM rows, i8_dotprod.c and i8_i8mm.c) is an nl_i8_kernels in
 * a cpu/i8_<isa>.c file and a line in dispatch.c's i8_rows[].
 *
 * pack_b (optional; NULL: nl_i8_pack_b_scalar): B and BC above from a decoded tile, the int8
 * weights of NL_HOST_NP columns, column j's kc values at tile + j·ldt (kc a multiple of gs,
 * columns past ncols zero in the tile); the same integers whatever the row.
 *
 * pack_q8_0 (optional; NULL: the weights decoded to a tile, then pack_b): B, BC and SW above
 * (gs 32) straight from Q8_0 rows: column j < ncols is the row at W + j·rb, its blocks b0 ..
 * b0 + kc/32 - 1 (34 bytes: FP16 d, 32 int8 q); columns past ncols zero. The same bits as the
 * tile's way.
 *
 * quant_row (optional; NULL: nl_i8_quant_row_scalar): one row of K activations quantized as
 * llama.cpp's CPU backend quantizes them (proj/host_int8.c's comment has the definitions):
 * act NL_I8_Q8_0 / NL_I8_Q8_1 (32-blocks, gs 32), NL_I8_Q8_K (256-blocks, groups of gs 32 or
 * 16); xq[K] = q + 128, dx[K/gs] the group scales, sx[K/gs] the sum terms (Q8_1: FP16(d·Σq);
 * Q8_K: d·Σq of the group; not written when sx is NULL). The same bytes and bits as the scalar
 * form for every input, non-finite ones included (tests/test_int8.c). */
enum { NL_I8_Q8_0, NL_I8_Q8_1, NL_I8_Q8_K };
typedef struct nl_i8_kernels {
    const char *name;
    void (*gemm_i8_fwd)(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate);
    void (*pack_b)(const int8_t *tile, int ldt, int kc, int gs, uint32_t *B, int32_t *BC);
    void (*pack_q8_0)(const uint8_t *W, size_t rb, int64_t b0, int kc, int ncols, uint32_t *B, int32_t *BC, float *SW);
    void (*quant_row)(int act, int gs, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx);
} nl_i8_kernels;

void nl_i8_pack_b_scalar(const int8_t *tile, int ldt, int kc, int gs, uint32_t *B, int32_t *BC);
void nl_i8_quant_row_scalar(int act, int gs, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx);
extern const nl_i8_kernels nl_i8_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const nl_i8_kernels nl_i8_kernels_avx512vnni;
#endif
#if defined(__aarch64__)
extern const nl_i8_kernels nl_i8_kernels_i8mm;    /* i8_i8mm.c: USMMLA (FEAT_I8MM) */
extern const nl_i8_kernels nl_i8_kernels_dotprod; /* i8_dotprod.c: SDOT (FEAT_DotProd) */
#endif
/* The best int8 row this CPU runs ("auto"/NULL), or the one named ("scalar", "avx512vnni",
 * "i8mm", "dotprod")
 * when it runs here, else NULL. */
const nl_i8_kernels *nl_cpu_i8_kernels(const char *name);

/* ---- the dispatcher (dispatch.c) ------------------------------------------------------- */
/* The row in use: the best this CPU runs (the first of dispatch.c's list whose ISA it has)
 * unless nl_cpu_use chose another. The nodes call through it; the host backend's "auto". */
const nl_host_kernels *nl_cpu_kernels(void);
/* The row named `name` ("scalar", "avx2", "avx512", "neon", "neonbf16"; "auto" = the best) if this CPU runs
 * it, else NULL. */
const nl_host_kernels *nl_cpu_kernels_find(const char *name);
/* Make the row named `name` (NULL = "auto") the one in use for every later nl_cpu_kernels
 * (tests and benchmarks compare the levels): 0, or -1 + nl_err when this CPU lacks it. */
int nl_cpu_use(const char *name);

/* The f32 panel walk every row with a 6-row micro-kernel shares: 16-column strips of the packed
 * panel, MR = 6 rows at a time, the last 1..5 rows through the same micro-kernel with a constant
 * row count (so each is specialised). ukr(mr, kc, A, lda, B, C, ldc, ncols, accumulate). */
#define NL_HOST_GEMM_F32_6ROWS(name, ukr)                                                                              \
    static void name(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,     \
                     int accumulate) {                                                                                 \
        for (int s = 0; s < NL_HOST_NP / 16 && 16 * s < ncols; s++) {                                                  \
            const float *b = B + 16 * s;                                                                               \
            const int nc = ncols - 16 * s;                                                                             \
            int i = 0;                                                                                                 \
            for (; i + 6 <= m; i += 6) ukr(6, kc, A + i * lda, lda, b, C + i * ldc + 16 * s, ldc, nc, accumulate);     \
            const float *a = A + i * lda;                                                                              \
            float *c = C + i * ldc + 16 * s;                                                                           \
            switch (m - i) {                                                                                           \
            case 1: ukr(1, kc, a, lda, b, c, ldc, nc, accumulate); break;                                              \
            case 2: ukr(2, kc, a, lda, b, c, ldc, nc, accumulate); break;                                              \
            case 3: ukr(3, kc, a, lda, b, c, ldc, nc, accumulate); break;                                              \
            case 4: ukr(4, kc, a, lda, b, c, ldc, nc, accumulate); break;                                              \
            case 5: ukr(5, kc, a, lda, b, c, ldc, nc, accumulate); break;                                              \
            default: break;                                                                                            \
            }                                                                                                          \
        }                                                                                                              \
    }

/* Shared scalar helpers (kernels_scalar.c). */
float nl_host_f16_to_f32(uint16_t h);
uint16_t nl_host_f32_to_bf16(float f); /* round to nearest even (like VCVTNEPS2BF16) */
/* Decode one 32-element block of an integer type (Q8_0, Q4_0) to q[32] and its scale d;
 * value = (float)q[i] * d. */
void nl_host_decode_int_block(int type, const void *block, int8_t *q, float *d);
/* Decode elements [k0, k0+n) of one row of `type` (any supported type; k0 need not be
 * block-aligned) into dst using the set's fast row decoders where there are some. */
void nl_host_dequant(const nl_host_kernels *ks, int type, const void *row, int64_t k0, int n, float *dst);
/* 1 if host.c can decode this weight type. */
int nl_host_type_ok(int type);
/* 1 for the weight types bf16 compute takes: every quantized block type (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q4_K, Q6_K), as its FP32 decode rounded to BF16 (nearest even), the same values in both
 * directions. F32 and BF16 weights stay on the FP32 kernels; F16 ones take bf16 compute but for
 * the recurrent class (proj/host.c bf16_weight: the class is kept to F16 accuracy, FP32). */
int nl_host_type_bf16(int type);

#endif

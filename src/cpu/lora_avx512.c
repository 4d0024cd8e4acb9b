/* cpu/lora_avx512: nn/lora.c's rank-16 products on AVX-512F (kernels.h: nl_lora_kernels), built
 * with the AVX-512 flags, only on x86-64; the AVX-512 row's `lora`. Every output element is the
 * chain cpu/gemm.c's contract gives it (one FMA chain over k ascending, from 0 or from C), so
 * the bits are those of the nl_gemm / nl_gemm_tn calls the node makes without them
 * (tests/test_nn_lora); what differs is only the order in which elements are computed and how
 * the operands reach the registers:
 *   thin16  u = x·Aᵀ, du = dy·B: 16-row tiles (16 accumulators) whose rows are first copied in
 *           chunks of TK columns into a buffer with a padded stride: the rows of x are a
 *           multiple of 4 KB apart and 8 or more of them in one L1 set thrashed it;
 *   tn16    dA += duᵀ·xm and dB += dyᵀ·(s·u) (the sums over the tokens): 16×16 tiles of the
 *           16 × n result, each a chain over all T tokens kept in registers, one load of the
 *           long operand per token (dB is computed as its transpose, s·u ⊗ dy: the same
 *           products, the same order; stored transposed);
 *   add16   y (+)= (s·u)·Bᵀ, dx (+)= du·A (K = 16): 6×32 tiles over panels packed by the node;
 *           mode 2 adds the rounded chain to C in the tile's store (the bits of the term
 *           written to a buffer and added afterwards, NL_LORA_ADD, without the buffer);
 *   thin16b, add16b  the same two on vdpbf16ps (BF16 words, kernels.h), for the BF16 compute
 *           mode: chains over word pairs, so not the FP32 bits; add16b's modes 3 and 4 take the
 *           dropout mask in the store (dx (+)= (du·A) ⊙ m without the buffer). */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline

#define TK 128  /* columns of a thin tile's rows per copied chunk */
#define TKS 144 /* the copy's row stride (floats): not a multiple of 1 KB */

/* C[MR][16] = Σ_k X[i][k]·P[k][0..16], rows of X copied TK columns at a time into buf */
AI void thin_tile(const int MR, float *C, const float *X, int64_t ldx, const float *P, int K, float *buf) {
    __m512 c[16];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) c[i] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < K; k0 += TK) {
        const int kc = K - k0 < TK ? K - k0 : TK;
        for (int i = 0; i < MR; i++) {
            const float *src = X + (int64_t)i * ldx + k0;
            float *dst = buf + i * TKS;
            int k = 0;
            for (; k + 16 <= kc; k += 16) _mm512_storeu_ps(dst + k, _mm512_loadu_ps(src + k));
            if (k < kc) {
                const __mmask16 m = (__mmask16)((1u << (kc - k)) - 1);
                _mm512_mask_storeu_ps(dst + k, m, _mm512_maskz_loadu_ps(m, src + k));
            }
        }
        const float *p = P + (int64_t)k0 * 16;
        /* the next chunk's lines of the MR rows, one per k while this chunk computes (the rows are
         * streams the hardware prefetchers do not all follow) */
        const int last = k0 + kc >= K, kn = last ? (K < TK ? K : TK) : K - k0 - kc < TK ? K - k0 - kc : TK;
        const int nl = MR * ((kn + 15) / 16);
        /* after the last chunk: the next tile's first (rows past M are prefetched for nothing) */
        const float *nx = last ? X + MR * ldx : X + k0 + kc;
        for (int k = 0; k < kc; k++, p += 16) {
            if (k < nl) _mm_prefetch((const char *)(nx + (k % MR) * ldx + (k / MR) * 16), _MM_HINT_T0);
            const __m512 b = _mm512_loadu_ps(p);
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(buf[i * TKS + k]), b, c[i]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) _mm512_storeu_ps(C + (int64_t)i * 16, c[i]);
}

static void z_thin16(float *C, const float *X, int64_t ldx, const float *P, int M, int K) {
    float buf[16 * TKS] __attribute__((aligned(64)));
    int m = 0;
    for (; m + 16 <= M; m += 16) thin_tile(16, C + (int64_t)m * 16, X + m * ldx, ldx, P, K, buf);
    float *Cm = C + (int64_t)m * 16;
    const float *Xm = X + m * ldx;
    switch (M - m) {
    case 15: thin_tile(15, Cm, Xm, ldx, P, K, buf); break;
    case 14: thin_tile(14, Cm, Xm, ldx, P, K, buf); break;
    case 13: thin_tile(13, Cm, Xm, ldx, P, K, buf); break;
    case 12: thin_tile(12, Cm, Xm, ldx, P, K, buf); break;
    case 11: thin_tile(11, Cm, Xm, ldx, P, K, buf); break;
    case 10: thin_tile(10, Cm, Xm, ldx, P, K, buf); break;
    case 9: thin_tile(9, Cm, Xm, ldx, P, K, buf); break;
    case 8: thin_tile(8, Cm, Xm, ldx, P, K, buf); break;
    case 7: thin_tile(7, Cm, Xm, ldx, P, K, buf); break;
    case 6: thin_tile(6, Cm, Xm, ldx, P, K, buf); break;
    case 5: thin_tile(5, Cm, Xm, ldx, P, K, buf); break;
    case 4: thin_tile(4, Cm, Xm, ldx, P, K, buf); break;
    case 3: thin_tile(3, Cm, Xm, ldx, P, K, buf); break;
    case 2: thin_tile(2, Cm, Xm, ldx, P, K, buf); break;
    case 1: thin_tile(1, Cm, Xm, ldx, P, K, buf); break;
    default: break;
    }
}

/* Tokens per pass of tn16: the tiles' chains continue through C from pass to pass (exact). */
#ifndef TT
#define TT 64
#endif
#ifndef PD
#define PD 8
#endif

/* C[n][0..16) += Σ_t Q[t][n]·P[t][0..16), n < NR: the lanes run along P's 16 columns, the
 * long operand's (4 KB-aligned) rows are only broadcast from, and C is one contiguous 16 × 16
 * block (C stored with a row stride of the long operand's would alias every load of it) */
AI void tn_tile(const int NR, float *C, int ldc, const float *P, int ldp, const float *Q, int64_t ldq, int T) {
    __m512 c[16];
#pragma GCC unroll 16
    for (int n = 0; n < NR; n++) c[n] = _mm512_loadu_ps(C + (int64_t)n * ldc);
    const float *p = P, *q = Q;
    for (int k = 0; k < T; k++, p += ldp, q += ldq) {
        /* the long operand's row PD tokens ahead (a new page per token: no hardware prefetcher
         * follows it); both lines when the 16 floats straddle two */
        _mm_prefetch((const char *)(q + PD * ldq), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + PD * ldq + NR - 1), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + 16), _MM_HINT_T0); /* and the next column tile's row */
        _mm_prefetch((const char *)(q + 31), _MM_HINT_T0);
        const __m512 b = _mm512_loadu_ps(p);
#pragma GCC unroll 16
        for (int n = 0; n < NR; n++) c[n] = _mm512_fmadd_ps(_mm512_set1_ps(q[n]), b, c[n]);
    }
#pragma GCC unroll 16
    for (int n = 0; n < NR; n++) _mm512_storeu_ps(C + (int64_t)n * ldc, c[n]);
}

static void tn_tile_n(int nn, float *C, int ldc, const float *P, int ldp, const float *Q, int64_t ldq, int T) {
    switch (nn) {
    case 16: tn_tile(16, C, ldc, P, ldp, Q, ldq, T); break;
    case 15: tn_tile(15, C, ldc, P, ldp, Q, ldq, T); break;
    case 14: tn_tile(14, C, ldc, P, ldp, Q, ldq, T); break;
    case 13: tn_tile(13, C, ldc, P, ldp, Q, ldq, T); break;
    case 12: tn_tile(12, C, ldc, P, ldp, Q, ldq, T); break;
    case 11: tn_tile(11, C, ldc, P, ldp, Q, ldq, T); break;
    case 10: tn_tile(10, C, ldc, P, ldp, Q, ldq, T); break;
    case 9: tn_tile(9, C, ldc, P, ldp, Q, ldq, T); break;
    case 8: tn_tile(8, C, ldc, P, ldp, Q, ldq, T); break;
    case 7: tn_tile(7, C, ldc, P, ldp, Q, ldq, T); break;
    case 6: tn_tile(6, C, ldc, P, ldp, Q, ldq, T); break;
    case 5: tn_tile(5, C, ldc, P, ldp, Q, ldq, T); break;
    case 4: tn_tile(4, C, ldc, P, ldp, Q, ldq, T); break;
    case 3: tn_tile(3, C, ldc, P, ldp, Q, ldq, T); break;
    case 2: tn_tile(2, C, ldc, P, ldp, Q, ldq, T); break;
    case 1: tn_tile(1, C, ldc, P, ldp, Q, ldq, T); break;
    default: break;
    }
}

static void z_tn16(float *C, int ldc, int trans, const float *P, int ldp, const float *Q, int64_t ldq, int N, int T) {
    float t[16][16] __attribute__((aligned(64)));
    for (int n = 0; n < N; n += 16) {
        const int nn = N - n < 16 ? N - n : 16;
        /* the tile as C'ᵀ [nn][16]: C itself when trans and ldc == 16, else a transposed copy */
        float *ct = trans ? C + (int64_t)n * ldc : t[0];
        int ldt = trans ? ldc : 16;
        if (!trans)
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < nn; j++) t[j][i] = C[(int64_t)i * ldc + n + j];
        for (int t0 = 0; t0 < T; t0 += TT) {
            const int tt = T - t0 < TT ? T - t0 : TT;
            tn_tile_n(nn, ct, ldt, P + (int64_t)t0 * ldp, ldp, Q + (int64_t)t0 * ldq + n, ldq, tt);
        }
        if (!trans)
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < nn; j++) C[(int64_t)i * ldc + n + j] = t[j][i];
    }
}

/* A register tile's rows 0..MR-1 of 32 columns (lanes m0, m1): start from C (load) or zero, add
 * C's values in, store. Shared by add_tile (FP32) and addb_tile (BF16 pairs). */
AI void tile_start(const int MR, __m512 (*c)[2], const float *C, int64_t ldc, const int load, __mmask16 m0,
                   __mmask16 m1) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        if (load) {
            c[i][0] = _mm512_maskz_loadu_ps(m0, C + (int64_t)i * ldc);
            c[i][1] = _mm512_maskz_loadu_ps(m1, C + (int64_t)i * ldc + 16);
        } else {
            c[i][0] = _mm512_setzero_ps();
            c[i][1] = _mm512_setzero_ps();
        }
    }
}

/* c = C + c: every load of C before the first store (the rows are a multiple of 4 KB apart: a
 * load behind a store to another row would wait on it) */
AI void tile_add_c(const int MR, __m512 (*c)[2], const float *C, int64_t ldc, __mmask16 m0, __mmask16 m1) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        const float *cp = C + (int64_t)i * ldc;
        c[i][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cp), c[i][0]);
        c[i][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cp + 16), c[i][1]);
    }
}

AI void tile_store(const int MR, __m512 (*c)[2], float *C, int64_t ldc, __mmask16 m0, __mmask16 m1) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float *cp = C + (int64_t)i * ldc;
        _mm512_mask_storeu_ps(cp, m0, c[i][0]);
        _mm512_mask_storeu_ps(cp + 16, m1, c[i][1]);
    }
}

/* rows 0..MR-1 of one 32-column panel: C (op)= Σ_{k<16} P[i][k]·Qp[k][0..32); lanes m0, m1 */
AI void add_tile(const int MR, float *C, int64_t ldc, const float *P, int ldp, const float *Qp, const int mode,
                 __mmask16 m0, __mmask16 m1) {
    __m512 c[6][2];
    tile_start(MR, c, C, ldc, mode == 1, m0, m1);
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
        const __m512 b0 = _mm512_loadu_ps(Qp + k * 32), b1 = _mm512_loadu_ps(Qp + k * 32 + 16);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m512 a = _mm512_set1_ps(P[i * ldp + k]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
    if (mode == 2) tile_add_c(MR, c, C, ldc, m0, m1);
    tile_store(MR, c, C, ldc, m0, m1);
}

AI void add_rows(const int MR, float *C, int64_t ldc, const float *P, int ldp, const float *Qp, int N, const int mode) {
    for (int n = 0; n < N; n += 32) {
        const int w = N - n < 32 ? N - n : 32;
        if (mode && n + 64 < N)
            for (int i = 0; i < MR; i++) {
                _mm_prefetch((const char *)(C + i * ldc + n + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(C + i * ldc + n + 80), _MM_HINT_T0);
            }
        const __mmask16 m0 = (__mmask16)(w >= 16 ? 0xFFFFu : (1u << w) - 1);
        const __mmask16 m1 = (__mmask16)(w >= 32 ? 0xFFFFu : w > 16 ? (1u << (w - 16)) - 1 : 0u);
        add_tile(MR, C + n, ldc, P, ldp, Qp + (int64_t)n * 16, mode, m0, m1);
    }
}

AI void add_all(float *C, int64_t ldc, const float *P, int ldp, const float *Qp, int M, int N, const int mode) {
    int m = 0;
    for (; m + 6 <= M; m += 6) add_rows(6, C + m * ldc, ldc, P + (int64_t)m * ldp, ldp, Qp, N, mode);
    float *Cm = C + m * ldc;
    const float *Pm = P + (int64_t)m * ldp;
    switch (M - m) {
    case 5: add_rows(5, Cm, ldc, Pm, ldp, Qp, N, mode); break;
    case 4: add_rows(4, Cm, ldc, Pm, ldp, Qp, N, mode); break;
    case 3: add_rows(3, Cm, ldc, Pm, ldp, Qp, N, mode); break;
    case 2: add_rows(2, Cm, ldc, Pm, ldp, Qp, N, mode); break;
    case 1: add_rows(1, Cm, ldc, Pm, ldp, Qp, N, mode); break;
    default: break;
    }
}

static void z_add16(float *C, int64_t ldc, const float *P, int ldp, const float *Qp, int M, int N, int mode) {
    if (mode == 2) add_all(C, ldc, P, ldp, Qp, M, N, 2);
    else if (mode == 1) add_all(C, ldc, P, ldp, Qp, M, N, 1);
    else add_all(C, ldc, P, ldp, Qp, M, N, 0);
}

/* ---- BF16 (vdpbf16ps; nn/lora.c calls these only where nl_bf16_ok()) ----
 * The same tiles on words of two BF16: one vdpbf16ps does 32 multiply-adds where an FMA does 16.
 * The operands come packed by the node (cpu/gemm_bf16.h's packers), the rows of X with a padded
 * stride, so no copy here. */

/* C[MR][16] = Σ_w X[i][w]·P[w][0..16), one chain over w from 0 */
AI void thinb_tile(const int MR, float *C, const uint32_t *X, int64_t ldx, const uint32_t *P, int Kw) {
    __m512 c[16];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) c[i] = _mm512_setzero_ps();
    for (int w = 0; w < Kw; w++) {
        const __m512bh b = (__m512bh)_mm512_loadu_si512(P + (int64_t)w * 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) c[i] = _mm512_dpbf16_ps(c[i], (__m512bh)_mm512_set1_epi32((int)X[i * ldx + w]), b);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) _mm512_storeu_ps(C + (int64_t)i * 16, c[i]);
}

static void z_thin16b(float *C, const uint32_t *X, int64_t ldx, const uint32_t *P, int M, int Kw) {
    int m = 0;
    for (; m + 16 <= M; m += 16) thinb_tile(16, C + (int64_t)m * 16, X + m * ldx, ldx, P, Kw);
    float *Cm = C + (int64_t)m * 16;
    const uint32_t *Xm = X + m * ldx;
    switch (M - m) {
    case 15: thinb_tile(15, Cm, Xm, ldx, P, Kw); break;
    case 14: thinb_tile(14, Cm, Xm, ldx, P, Kw); break;
    case 13: thinb_tile(13, Cm, Xm, ldx, P, Kw); break;
    case 12: thinb_tile(12, Cm, Xm, ldx, P, Kw); break;
    case 11: thinb_tile(11, Cm, Xm, ldx, P, Kw); break;
    case 10: thinb_tile(10, Cm, Xm, ldx, P, Kw); break;
    case 9: thinb_tile(9, Cm, Xm, ldx, P, Kw); break;
    case 8: thinb_tile(8, Cm, Xm, ldx, P, Kw); break;
    case 7: thinb_tile(7, Cm, Xm, ldx, P, Kw); break;
    case 6: thinb_tile(6, Cm, Xm, ldx, P, Kw); break;
    case 5: thinb_tile(5, Cm, Xm, ldx, P, Kw); break;
    case 4: thinb_tile(4, Cm, Xm, ldx, P, Kw); break;
    case 3: thinb_tile(3, Cm, Xm, ldx, P, Kw); break;
    case 2: thinb_tile(2, Cm, Xm, ldx, P, Kw); break;
    case 1: thinb_tile(1, Cm, Xm, ldx, P, Kw); break;
    default: break;
    }
}

/* rows 0..MR-1 (<= 8) of 32 columns: C (op)= Σ_{w<8} P[i][w]·Q[w][0..32); lanes m0, m1 */
AI void addb_tile(const int MR, float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq,
                  const int mode, const float *Mk, int64_t ldm, const uint16_t *Kb, int64_t ldk, float inv,
                  __mmask16 m0, __mmask16 m1) {
    __m512 c[8][2];
    tile_start(MR, c, C, ldc, mode == 1, m0, m1);
#pragma GCC unroll 8
    for (int w = 0; w < 8; w++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(Q + w * ldq),
                       b1 = (__m512bh)_mm512_loadu_si512(Q + w * ldq + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)P[i * ldp + w]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], a, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], a, b1);
        }
    }
    if (mode >= 3 && Kb) /* the mask from the kept bits: the tile's columns are halves 0 and 1 of Kb */
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const uint16_t *kp = Kb + (int64_t)i * ldk;
            const __m512 vinv = _mm512_set1_ps(inv);
            c[i][0] = _mm512_mul_ps(c[i][0], _mm512_maskz_mov_ps((__mmask16)(kp[0] & m0), vinv));
            c[i][1] = _mm512_mul_ps(c[i][1], _mm512_maskz_mov_ps((__mmask16)(m1 ? kp[1] & m1 : 0), vinv));
        }
    else if (mode >= 3)
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const float *mp = Mk + (int64_t)i * ldm;
            c[i][0] = _mm512_mul_ps(c[i][0], _mm512_maskz_loadu_ps(m0, mp));
            c[i][1] = _mm512_mul_ps(c[i][1], _mm512_maskz_loadu_ps(m1, mp + 16));
        }
    if (mode == 2 || mode == 3) tile_add_c(MR, c, C, ldc, m0, m1);
    tile_store(MR, c, C, ldc, m0, m1);
}

AI void addb_rows(const int MR, float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq,
                  int N, const int mode, const float *Mk, int64_t ldm, const uint16_t *Kb, int64_t ldk, float inv) {
    for (int n = 0; n < N; n += 32) {
        const int w = N - n < 32 ? N - n : 32;
        if (mode != 0 && mode != 4 && n + 64 < N)
            for (int i = 0; i < MR; i++) {
                _mm_prefetch((const char *)(C + i * ldc + n + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(C + i * ldc + n + 80), _MM_HINT_T0);
            }
        const __mmask16 m0 = (__mmask16)(w >= 16 ? 0xFFFFu : (1u << w) - 1);
        const __mmask16 m1 = (__mmask16)(w >= 32 ? 0xFFFFu : w > 16 ? (1u << (w - 16)) - 1 : 0u);
        addb_tile(MR, C + n, ldc, P, ldp, Q + n, ldq, mode, mode >= 3 && Mk ? Mk + n : NULL, ldm,
                  mode >= 3 && Kb ? Kb + n / 16 : NULL, ldk, inv, m0, m1);
    }
}

AI void addb_all(float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq, int M, int N,
                 const int mode, const float *Mk, int64_t ldm, const uint16_t *Kb, int64_t ldk, float inv) {
    int m = 0;
    for (; m + 8 <= M; m += 8)
        addb_rows(8, C + m * ldc, ldc, P + (int64_t)m * ldp, ldp, Q, ldq, N, mode, Mk ? Mk + m * ldm : NULL, ldm,
                  Kb ? Kb + m * ldk : NULL, ldk, inv);
    float *Cm = C + m * ldc;
    const uint32_t *Pm = P + (int64_t)m * ldp;
    const float *Mm = Mk ? Mk + m * ldm : NULL;
    const uint16_t *Km = Kb ? Kb + m * ldk : NULL;
    switch (M - m) {
    case 7: addb_rows(7, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 6: addb_rows(6, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 5: addb_rows(5, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 4: addb_rows(4, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 3: addb_rows(3, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 2: addb_rows(2, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    case 1: addb_rows(1, Cm, ldc, Pm, ldp, Q, ldq, N, mode, Mm, ldm, Km, ldk, inv); break;
    default: break;
    }
}

static void z_add16b(float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq, int M, int N,
                     int mode, const float *Mk, int64_t ldm) {
    switch (mode) {
    case 0: addb_all(C, ldc, P, ldp, Q, ldq, M, N, 0, NULL, 0, NULL, 0, 0.0f); break;
    case 1: addb_all(C, ldc, P, ldp, Q, ldq, M, N, 1, NULL, 0, NULL, 0, 0.0f); break;
    case 2: addb_all(C, ldc, P, ldp, Q, ldq, M, N, 2, NULL, 0, NULL, 0, 0.0f); break;
    case 3: addb_all(C, ldc, P, ldp, Q, ldq, M, N, 3, Mk, ldm, NULL, 0, 0.0f); break;
    default: addb_all(C, ldc, P, ldp, Q, ldq, M, N, 4, Mk, ldm, NULL, 0, 0.0f); break;
    }
}

static void z_add16bk(float *C, int64_t ldc, const uint32_t *P, int ldp, const uint32_t *Q, int64_t ldq, int M, int N,
                      int mode, const uint16_t *Kb, int64_t ldk, float inv) {
    if (mode == 3) addb_all(C, ldc, P, ldp, Q, ldq, M, N, 3, NULL, 0, Kb, ldk, inv);
    else addb_all(C, ldc, P, ldp, Q, ldq, M, N, 4, NULL, 0, Kb, ldk, inv);
}

/* 16 bits of a kept-bit row from bit b on (halves past nh read as 0) */
AI unsigned bits16_at(const uint16_t *kb, int64_t b, int64_t nh) {
    const int64_t h = b >> 4;
    const int s = (int)(b & 15);
    unsigned v = (unsigned)kb[h] >> s;
    if (s && h + 1 < nh) v |= (unsigned)kb[h + 1] << (16 - s);
    return v & 0xFFFFu;
}

/* tn16k (kernels.h): 16 columns of C's 16 rows in registers (lanes along the columns), each a chain
 * over all T tokens; per token the row's 16 values of x, masked and multiplied in the register (the
 * rounded product bits_row stores), and P's 16 values broadcast. The same FMAs in the same order as
 * tn16's trans-0 tiles on x ⊙ m (a·b = b·a), so the same bits. */
AI void tnk_tile(float *C, int ldc, const float *P, int ldp, const float *X, int64_t ldx, const uint16_t *Kb,
                 int64_t ldk, int64_t b, __m512 vinv, __mmask16 lm, int T) {
    __m512 c[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) c[i] = _mm512_maskz_loadu_ps(lm, C + (int64_t)i * ldc);
    const float *x = X, *p = P;
    const uint16_t *kb = Kb;
    for (int t = 0; t < T; t++, x += ldx, p += ldp, kb += ldk) {
        _mm_prefetch((const char *)(x + PD * ldx), _MM_HINT_T0); /* a new page per token */
        _mm_prefetch((const char *)(x + PD * ldx + 15), _MM_HINT_T0);
        _mm_prefetch((const char *)(x + 16), _MM_HINT_T0); /* and the next column tile's row */
        _mm_prefetch((const char *)(x + 31), _MM_HINT_T0);
        const __m512 m = _mm512_maskz_mov_ps((__mmask16)(bits16_at(kb, b, ldk) & lm), vinv);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(lm, x), m);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i]), v, c[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(C + (int64_t)i * ldc, lm, c[i]);
}

static void z_tn16k(float *C, int ldc, const float *P, int ldp, const float *X, int64_t ldx, const uint16_t *Kb,
                    int64_t ldk, int b0, float inv, int N, int T) {
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int n = 0; n < N; n += 16) {
        const int nn = N - n < 16 ? N - n : 16;
        tnk_tile(C + n, ldc, P, ldp, X + n, ldx, Kb, ldk, (int64_t)b0 + n, vinv, (__mmask16)((1u << nn) - 1), T);
    }
}

const nl_lora_kernels nl_lora_kernels_avx512 = {.thin16 = z_thin16,
                                                .tn16 = z_tn16,
                                                .add16 = z_add16,
                                                .thin16b = z_thin16b,
                                                .add16b = z_add16b,
                                                .add16bk = z_add16bk,
                                                .tn16k = z_tn16k};

/* cpu/gemm_bf16_avx512: BF16 packers, the BF16 GEMM and the FP32 softmax rows of the attention's BF16
 * variant (contract in cpu/gemm_bf16.h).
 *
 * The GEMM: 8×32 register tiles (16 zmm accumulators) of vdpbf16ps, each taking one word of
 * A (two BF16 of the reduction index, broadcast) against 16 words of B (16 columns, the same
 * two reduction indices), so one instruction does 32 multiply-adds into FP32. Column panels
 * of 32 outside, the reduction in chunks of KC words so that the KC×32 panel of B stays in L1
 * while the row tiles go by; a chunk boundary passes the running sums through C unchanged
 * (a stored and reloaded float is the same float), so chunking does not change the chain.
 *
 * The packers convert 16×16 word blocks in registers (vcvtne2ps2bf16, a word permute for the
 * pair interleave, a 16×16 transpose of 32-bit lanes for the transposed layouts).
 *
 * Built with the AVX-512 flags (the file's name: CMakeLists.txt), only on x86-64; reached through
 * the kernel set's bf16 row (nl_cpu_bf16_avx512), which the dispatcher hands out only where the
 * CPU has AVX512_BF16 (cpu/gemm_bf16.h). */
#include <immintrin.h>
#include <math.h>

#include "cpu/gemm_bf16.h"

#define AI __attribute__((always_inline)) static inline

/* lanes < n live (n clamped to [0, 16]) */
static inline __mmask16 mask16(int n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* 32 floats lo[0..15], hi[0..15] -> 16 words (lo0, lo1), (lo2, lo3), .., (hi14, hi15):
 * vcvtne2ps2bf16 puts its second operand in the low half. */
AI __m512i cvt_words(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* a[0..15], b[0..15] -> 16 words (a_c, b_c): convert, then interleave the two halves. */
static const uint16_t pair_idx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
AI __m512i cvt_pairs(__m512 a, __m512 b, __m512i idx) {
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* In-register transpose of a 16×16 block of 32-bit lanes: r[i] lane j <-> r[j] lane i.
 * 32-bit then 64-bit interleaves give, within each 128-bit lane L, rows 4a..4a+3 of column
 * 4L+b in u[4a+b]; two rounds of 128-bit lane shuffles finish the 4×4 transpose of lanes. */
AI void tr16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int b = 0; b < 4; b++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[b], u[4 + b], 0x44), v1 = _mm512_shuffle_i32x4(u[b], u[4 + b], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + b], u[12 + b], 0x44),
                      v3 = _mm512_shuffle_i32x4(u[8 + b], u[12 + b], 0xEE);
        r[b] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + b] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + b] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + b] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* words w0..w0+15 of row x (C floats): pairs of columns 2w, 2w+1 */
AI __m512i row_words(const float *x, int C, int w0) {
    const int c0 = 2 * w0;
    const __m512 lo = _mm512_maskz_loadu_ps(mask16(C - c0), x + (c0 < C ? c0 : 0));
    const __m512 hi = _mm512_maskz_loadu_ps(mask16(C - c0 - 16), x + (c0 + 16 < C ? c0 + 16 : 0));
    return cvt_words(lo, hi);
}

/* words (a_c, b_c) for c = c0..c0+15 of rows a and b (b may be NULL: zeros) */
AI __m512i pair_words(const float *a, const float *b, int C, int c0, __m512i idx) {
    const __mmask16 m = mask16(C - c0);
    const int off = m ? c0 : 0; /* no pointer past the row when nothing is live */
    const __m512 va = _mm512_maskz_loadu_ps(m, a + off);
    const __m512 vb = b ? _mm512_maskz_loadu_ps(m, b + off) : _mm512_setzero_ps();
    return cvt_pairs(va, vb, idx);
}

static void z_rows(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int nw) {
    for (int r = 0; r < R; r++)
        for (int w0 = 0; w0 < nw; w0 += 16)
            _mm512_mask_storeu_epi32(dst + r * ldd + w0, mask16(nw - w0), row_words(x + r * lds, C, w0));
}

static void z_rows_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int rpad) {
    const int nw = (C + 1) / 2;
    for (int r0 = 0; r0 < rpad; r0 += 16) {
        const __mmask16 mr = mask16(rpad - r0);
        for (int w0 = 0; w0 < nw; w0 += 16) {
            __m512i v[16];
            for (int j = 0; j < 16; j++)
                v[j] = r0 + j < R ? row_words(x + (r0 + j) * lds, C, w0) : _mm512_setzero_si512();
            tr16(v);
            const int nb = nw - w0 < 16 ? nw - w0 : 16;
            for (int i = 0; i < nb; i++) _mm512_mask_storeu_epi32(dst + (w0 + i) * ldd + r0, mr, v[i]);
        }
    }
}

static void z_pairs(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int cpad) {
    const __m512i idx = _mm512_loadu_si512(pair_idx);
    for (int w = 0; w < (R + 1) / 2; w++) {
        const float *a = x + 2 * w * lds, *b = 2 * w + 1 < R ? a + lds : NULL;
        for (int c0 = 0; c0 < cpad; c0 += 16)
            _mm512_mask_storeu_epi32(dst + w * ldd + c0, mask16(cpad - c0), pair_words(a, b, C, c0, idx));
    }
}

static void z_pairs_t(uint32_t *dst, int64_t ldd, const float *x, int64_t lds, int R, int C, int wpad) {
    const __m512i idx = _mm512_loadu_si512(pair_idx);
    const int nwr = (R + 1) / 2;
    for (int w0 = 0; w0 < wpad; w0 += 16) {
        const __mmask16 mw = mask16(wpad - w0);
        for (int c0 = 0; c0 < C; c0 += 16) {
            __m512i v[16];
            for (int j = 0; j < 16; j++) {
                const int w = w0 + j;
                if (w < nwr) {
                    const float *a = x + 2 * (int64_t)w * lds;
                    v[j] = pair_words(a, 2 * w + 1 < R ? a + lds : NULL, C, c0, idx);
                } else {
                    v[j] = _mm512_setzero_si512();
                }
            }
            tr16(v);
            const int nb = C - c0 < 16 ? C - c0 : 16;
            for (int i = 0; i < nb; i++) _mm512_mask_storeu_epi32(dst + (c0 + i) * ldd + w0, mw, v[i]);
        }
    }
}

static void z_transpose_f32(float *dst, int64_t ldd, const float *x, int64_t lds, int R, int C) {
    for (int c0 = 0; c0 < C; c0 += 16) {
        const __mmask16 mc = mask16(C - c0);
        for (int r0 = 0; r0 < R; r0 += 16) {
            const __mmask16 mr = mask16(R - r0);
            __m512i v[16];
            for (int j = 0; j < 16; j++)
                v[j] = r0 + j < R ? _mm512_maskz_loadu_epi32(mc, x + (r0 + j) * lds + c0) : _mm512_setzero_si512();
            tr16(v);
            const int nb = C - c0 < 16 ? C - c0 : 16;
            for (int i = 0; i < nb; i++) _mm512_mask_storeu_epi32(dst + (c0 + i) * ldd + r0, mr, v[i]);
        }
    }
}

/* ---- GEMM ---- */

/* One tile: MR (<= 8, constant after inlining) rows × NV (1 or 2) vectors of 16 columns; m0/m1
 * limit the live columns of the two vectors (C is loaded and stored under them; B is read in
 * full vectors, its padding). */
AI void tile(const int MR, const int NV, float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B,
             int64_t ldb, int K2, int acc, __mmask16 m0, __mmask16 m1) {
    __m512 c[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            c[i][v] = acc ? _mm512_maskz_loadu_ps(v ? m1 : m0, C + i * ldc + 16 * v) : _mm512_setzero_ps();
    const uint32_t *b = B;
    for (int w = 0; w < K2; w++, b += ldb) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
        const __m512bh b1 = NV == 2 ? (__m512bh)_mm512_loadu_si512(b + 16) : b0;
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[i * lda + w]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], a, b0);
            if (NV == 2) c[i][1] = _mm512_dpbf16_ps(c[i][1], a, b1);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(C + i * ldc + 16 * v, v ? m1 : m0, c[i][v]);
}

AI void panel(const int NV, float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb,
              int M, int K2, int acc, __mmask16 m0, __mmask16 m1) {
    int m = 0;
    for (; m + 8 <= M; m += 8) tile(8, NV, C + m * ldc, ldc, A + m * lda, lda, B, ldb, K2, acc, m0, m1);
    float *Cm = C + m * ldc;
    const uint32_t *Am = A + m * lda;
    switch (M - m) {
    case 7: tile(7, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 6: tile(6, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 5: tile(5, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 4: tile(4, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 3: tile(3, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 2: tile(2, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    case 1: tile(1, NV, Cm, ldc, Am, lda, B, ldb, K2, acc, m0, m1); break;
    default: break;
    }
}

#define KC 128 /* words of the reduction per chunk: a KC×32 panel of B is 16 KiB */

static void z_gemm(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                   int K2, int accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K2 <= 0) {
        if (!accumulate)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) C[m * ldc + n] = 0.0f;
        return;
    }
    for (int n = 0; n < N; n += 32) {
        const int rest = N - n;
        for (int k0 = 0; k0 < K2; k0 += KC) {
            const int kc = K2 - k0 < KC ? K2 - k0 : KC;
            const int acc = accumulate || k0 > 0;
            const uint32_t *Ak = A + k0, *Bk = B + k0 * ldb + n;
            if (rest > 16) panel(2, C + n, ldc, Ak, lda, Bk, ldb, M, kc, acc, 0xFFFF, mask16(rest - 16));
            else panel(1, C + n, ldc, Ak, lda, Bk, ldb, M, kc, acc, mask16(rest), 0);
        }
    }
}

/* ---- softmax rows ---- */

/* exp(x) as nl_fexp: x = n·ln2 + r by the 1.5·2^23 rounding trick, the same degree-7
 * polynomial, 2^n applied by vscalefps (which also gives 0 and inf at the ends). The clamps
 * keep n finite for -inf and huge inputs; NaN passes through (max/min return their second
 * operand when either is NaN). */
AI __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    const __m512 big = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), big), big);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-06f), r);
    __m512 p = _mm512_set1_ps(1.98756915e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.39819337e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.33345205e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.16657962e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.66666657e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static float z_row_scale_max(float *sr, int nv, float c) {
    const __m512 vc = _mm512_set1_ps(c);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nv; j += 16) {
        const __mmask16 m = mask16(nv - j);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + j), vc);
        _mm512_mask_storeu_ps(sr + j, m, x);
        mx = _mm512_mask_max_ps(mx, m, mx, x);
    }
    return _mm512_reduce_max_ps(mx);
}

static float z_row_exp_pack(uint32_t *pw, const float *sr, int nv, int nw, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int w0 = 0; w0 < nw; w0 += 16) {
        const int j = 2 * w0;
        const __mmask16 m0 = mask16(nv - j), m1 = mask16(nv - j - 16);
        const __m512 e0 =
            _mm512_maskz_mov_ps(m0, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, sr + (m0 ? j : 0)), vm)));
        const __m512 e1 =
            _mm512_maskz_mov_ps(m1, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, sr + (m1 ? j + 16 : 0)), vm)));
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
        _mm512_mask_storeu_epi32(pw + w0, mask16(nw - w0), cvt_words(e0, e1));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static void z_row_bwd(float *sr, float *dpr, int nv, int n, float c, float L, float D) {
    const __m512 vc = _mm512_set1_ps(c), vL = _mm512_set1_ps(L), vD = _mm512_set1_ps(D);
    for (int j = 0; j < n; j += 16) {
        const __mmask16 mv = mask16(nv - j), mn = mask16(n - j);
        const __m512 x = _mm512_maskz_loadu_ps(mv, sr + j), dp = _mm512_maskz_loadu_ps(mv, dpr + j);
        const __m512 p = _mm512_maskz_mov_ps(mv, exp16(_mm512_sub_ps(_mm512_mul_ps(x, vc), vL)));
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp, vD)), vc);
        _mm512_mask_storeu_ps(sr + j, mn, p);
        _mm512_mask_storeu_ps(dpr + j, mn, ds);
    }
}

const nl_bf16_kernels nl_cpu_bf16_avx512 = {
    .rows = z_rows,
    .rows_t = z_rows_t,
    .pairs = z_pairs,
    .pairs_t = z_pairs_t,
    .gemm = z_gemm,
    .transpose_f32 = z_transpose_f32,
    .row_scale_max = z_row_scale_max,
    .row_exp_pack = z_row_exp_pack,
    .row_bwd = z_row_bwd,
};

/* cpu/vec_avx512: the element-wise nodes' bodies (cpu/vec_body.h) built with the avx512 row's
 * flags (from the file name); the same source and the same bits as cpu/vec.c and vec_avx2.c,
 * but for SwiGLU, the gate, the cross-entropy row and attention's softmax rows (their exp is
 * most of the element-wise chain's time): those in 16 lanes with intrinsics, each lane the exact
 * copy of the portable body (nl_fexp's rounding trick, Horner steps in order, its exponent
 * ranges as compares and VSCALEFPS, then the
 * IEEE division; multiplies and adds separate, never fused: -std=c11 does not contract, and
 * gcc's intrinsics are its vector operators), the reductions in the portable order, the last
 * partial block under a mask (its padded lanes are never stored). tests/test_nn.c checks each
 * row against the scalar row's bits. */
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/amx.h"
#include "cpu/cpu.h"
#include "cpu/vecmath.h"

#define NL_VEC_XCH_AVX512 1024 /* vec_body.h's NL_VEC_XCH: the chunks whose sums are added in double */

/* nl_fexp (cpu/vecmath.h) on 16 lanes: its reduction and polynomial, operation for operation;
 * its integer masks as two compares on n and VSCALEFPS. Where nl_fexp's 2^n is a normal
 * number (n in [-126, 127]) both give p·2^n rounded once; below, both 0; above, or a NaN
 * t without its sign bit, both +inf (nl_fexp's hi mask); a NaN t with it, both 0 (its neg).
 * Checked on every FP32 input, bit for bit. */
static inline __m512 fexp16(__m512 x) {
    const __m512 big = _mm512_set1_ps(12582912.0f);
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), big);
    const __m512 n = _mm512_sub_ps(t, big);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.42860682030941723e-06f)));
    __m512 p = _mm512_set1_ps(1.98756915e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.39819337e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.33345205e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.16657962e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.66666657e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    const __mmask16 ok = _mm512_cmp_ps_mask(n, _mm512_set1_ps(-126.0f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(n, _mm512_set1_ps(127.0f), _CMP_LE_OQ);
    const __mmask16 inf = _mm512_cmp_ps_mask(n, _mm512_set1_ps(127.0f), _CMP_NLE_UQ) &
                          (__mmask16)~_mm512_movepi32_mask(_mm512_castps_si512(t));
    return _mm512_mask_mov_ps(_mm512_maskz_scalef_ps(ok, p, n), inf, _mm512_set1_ps(INFINITY));
}

/* nl_fsigmoid: 1 / (1 + e^{-x}) */
static inline __m512 fsigmoid16(__m512 x) {
    const __m512 nx = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, fexp16(nx)));
}

static inline __mmask16 tail16(int64_t n) { return (__mmask16)((1u << n) - 1u); }

/* Blocks of 16, the last under a mask (zeros read, nothing stored past n): each body reads its
 * inputs with LD(p) and stores with ST(p, v) */
#define V16_FOR(n) for (int64_t i = 0; i < (n); i += 16)
#define V16_MASK(n) const __mmask16 m = (n)-i < 16 ? tail16((n)-i) : (__mmask16)0xFFFF
#define LD(p) _mm512_maskz_loadu_ps(m, (p) + i)
#define ST(p, v) _mm512_mask_storeu_ps((p) + i, m, (v))

/* nn/attention.c's softmax rows: 16 lanes, lane l of a block of 16 the portable body's lane
 * l % 8 (acc[l] takes the low half, then the high half: the portable order), the last
 * 8-block in the low half of a masked 16-block, the scalar tail as the portable one */
#define NL_VEC_OWN_att_exp_sum
static float att_exp_sum_avx512(float *sr, int nv, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= nv; j += 16) {
        const __m512 t = fexp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), vm));
        _mm512_storeu_ps(sr + j, t);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(t, 1));
    }
    if (j + 8 <= nv) {
        const __m512 t = fexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(0xFF, sr + j), vm));
        _mm512_mask_storeu_ps(sr + j, 0xFF, t);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
        j += 8;
    }
    float a[NL_LANES];
    _mm256_storeu_ps(a, acc);
    float tail = 0.0f;
    for (; j < nv; j++) {
        sr[j] = nl_fexp(sr[j] - m);
        tail += sr[j];
    }
    return nl_lanes_sum(a) + tail;
}

/* 16 floats to BF16 words as nl_amx_f32_to_bf16 (cpu/amx.h) rounds, in integer steps (this row
 * also runs on AVX-512 CPUs without AVX512_BF16, the tile attention on the emulator): denormals
 * to ±0, NaN quieted, else round to nearest even */
static inline __m512i bf16_lanes_int(__m512 t) { /* the words in the low halves of 32-bit lanes */
    const __m512i u = _mm512_castps_si512(t), hi = _mm512_srli_epi32(u, 16);
    const __mmask16 zero = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(64)));
    return _mm512_mask_mov_epi32(r, zero, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)));
}
static inline __m256i bf16_words_int(__m512 t) { return _mm512_cvtepi32_epi16(bf16_lanes_int(t)); }

int nl_vec_avx512_words_int; /* cpu/kernels.h: the tests' switch */
/* 1: the BF16 words by the CPU's VCVTNEPS2BF16 / VCVTNE2PS2BF16 (where it has AVX512_BF16: the
 * same bits as the integer steps, faster) */
static inline int words_cvt(void) { return !nl_vec_avx512_words_int && nl_cpu_has(NL_CPU_AVX512BF16); }

/* att_exp_sum's blocks and sums; the exps to BF16 words (nl_amx_f32_to_bf16's rounding,
 * VCVTNEPS2BF16's bits, on every AVX-512 CPU: test_nn checks both ways on any machine) */
#define NL_VEC_OWN_att_exp_bf16
static float att_exp_bf16_avx512(uint16_t *pa, const float *sr, int nv, int np, float c, float m) {
    const __m512 vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c);
    const int cvt = words_cvt();
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= nv; j += 16) {
        const __m512 t = fexp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(sr + j), vc), vm));
        _mm256_storeu_si256((__m256i *)(void *)(pa + j), cvt ? (__m256i)_mm512_cvtneps_pbh(t) : bf16_words_int(t));
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(t, 1));
    }
    if (j + 8 <= nv) {
        const __m512 t = fexp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(0xFF, sr + j), vc), vm));
        const __m256i w = cvt ? (__m256i)_mm512_cvtneps_pbh(t) : bf16_words_int(t);
        _mm_storeu_si128((__m128i *)(void *)(pa + j), _mm256_castsi256_si128(w));
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
        j += 8;
    }
    float a[NL_LANES];
    _mm256_storeu_ps(a, acc);
    float tail = 0.0f;
    for (; j < nv; j++) {
        const float t = nl_fexp(sr[j] * c - m);
        pa[j] = nl_amx_f32_to_bf16(t);
        tail += t;
    }
    if (np > j) memset(pa + j, 0, sizeof(uint16_t) * (size_t)(np - j));
    return nl_lanes_sum(a) + tail;
}

#define NL_VEC_OWN_att_row_bwd
static void att_row_bwd_avx512(float *sr, float *dpr, int nv, int n, float c, float L, float D) {
    const __m512 vc = _mm512_set1_ps(c), vL = _mm512_set1_ps(L), vD = _mm512_set1_ps(D);
    for (int64_t i = 0; i < nv; i += 16) {
        V16_MASK(nv);
        const __m512 p = fexp16(_mm512_sub_ps(_mm512_mul_ps(LD(sr), vc), vL));
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(LD(dpr), vD)), vc);
        ST(sr, p);
        ST(dpr, ds);
    }
    for (int j = nv; j < n; j++) sr[j] = dpr[j] = 0.0f;
}

/* att_row_bwd's lanes for both rows, 16 keys a step (lanes past a row's nv masked to 0). The
 * BF16 words: where the CPU has AVX512_BF16 by VCVTNE2PS2BF16 (both rows in one register, the
 * pairs by one VPERMW), else in integer steps as att_exp_bf16's; the same bits (test_nn). */
#define NL_VEC_OWN_att_bwd_bf16
static inline __mmask16 lanes16(int n) { return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xFFFF : tail16(n); }
/* p and ds of both rows at keys j .. j+15 */
#define ATT_BWD_STEP()                                                                                                 \
    const __mmask16 m0 = lanes16(nv[0] - j), m1 = lanes16(nv[1] - j), mn = lanes16(np - j);                            \
    const __m512 p0 =                                                                                                  \
        _mm512_maskz_mov_ps(m0, fexp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m0, s0 + j), vc), vL0)));     \
    const __m512 p1 =                                                                                                  \
        _mm512_maskz_mov_ps(m1, fexp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m1, s1 + j), vc), vL1)));     \
    const __m512 d0 = _mm512_maskz_mov_ps(                                                                             \
        m0, _mm512_mul_ps(_mm512_mul_ps(p0, _mm512_sub_ps(_mm512_maskz_loadu_ps(m0, g0 + j), vD0)), vc));              \
    const __m512 d1 = _mm512_maskz_mov_ps(                                                                             \
        m1, _mm512_mul_ps(_mm512_mul_ps(p1, _mm512_sub_ps(_mm512_maskz_loadu_ps(m1, g1 + j), vD1)), vc))
static void att_bwd_bf16_avx512(uint16_t *const da[2], uint32_t *dsw, uint32_t *pw, const float *const sr[2],
                                const float *const dp[2], const int nv[2], int np, float c, const float L[2],
                                const float D[2]) {
    const __m512 vc = _mm512_set1_ps(c), vL0 = _mm512_set1_ps(L[0]), vL1 = _mm512_set1_ps(L[1]),
                 vD0 = _mm512_set1_ps(D[0]), vD1 = _mm512_set1_ps(D[1]);
    const float *const s0 = sr[0], *const s1 = sr[1], *const g0 = dp[0], *const g1 = dp[1];
    uint16_t *const a0 = da[0], *const a1 = da[1];
    const int nvm = nv[0] > nv[1] ? nv[0] : nv[1];
    int j = 0;
    if (words_cvt()) {
        /* word k of the two-row register (row 0's 16 words, then row 1's) to pair lane k */
        const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                             21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (; j < nvm && j < np; j += 16) {
            ATT_BWD_STEP();
            const __m512i wd = (__m512i)_mm512_cvtne2ps_pbh(d1, d0), wp = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
            _mm256_mask_storeu_epi16(a0 + j, mn, _mm512_castsi512_si256(wd));
            _mm256_mask_storeu_epi16(a1 + j, mn, _mm512_extracti64x4_epi64(wd, 1));
            _mm512_mask_storeu_epi32(dsw + j, mn, _mm512_permutexvar_epi16(ilv, wd));
            _mm512_mask_storeu_epi32(pw + j, mn, _mm512_permutexvar_epi16(ilv, wp));
        }
    } else {
        for (; j < nvm && j < np; j += 16) {
            ATT_BWD_STEP();
            const __m512i w0 = bf16_lanes_int(d0), w1 = bf16_lanes_int(d1);
            _mm256_mask_storeu_epi16(a0 + j, mn, _mm512_cvtepi32_epi16(w0));
            _mm256_mask_storeu_epi16(a1 + j, mn, _mm512_cvtepi32_epi16(w1));
            _mm512_mask_storeu_epi32(dsw + j, mn, _mm512_or_si512(w0, _mm512_slli_epi32(w1, 16)));
            _mm512_mask_storeu_epi32(pw + j, mn,
                                     _mm512_or_si512(bf16_lanes_int(p0), _mm512_slli_epi32(bf16_lanes_int(p1), 16)));
        }
    }
    if (np > j) {
        memset(a0 + j, 0, sizeof(uint16_t) * (size_t)(np - j));
        memset(a1 + j, 0, sizeof(uint16_t) * (size_t)(np - j));
        memset(dsw + j, 0, sizeof(uint32_t) * (size_t)(np - j));
        memset(pw + j, 0, sizeof(uint32_t) * (size_t)(np - j));
    }
}
#undef ATT_BWD_STEP

#define NL_VEC_OWN_swiglu_fwd
static void swiglu_fwd_avx512(float *h, const float *a, const float *b, int64_t n) {
    /* h = x·σ(x)·y */
    V16_FOR(n) {
        V16_MASK(n);
        const __m512 x = LD(a), y = LD(b);
        ST(h, _mm512_mul_ps(_mm512_mul_ps(x, fsigmoid16(x)), y));
    }
}

#define NL_VEC_OWN_swiglu_bwd
static void swiglu_bwd_avx512(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    /* da = g·y·σ·(1 + x·(1 − σ)), db = g·x·σ */
    const __m512 one = _mm512_set1_ps(1.0f);
    V16_FOR(n) {
        V16_MASK(n);
        const __m512 x = LD(a), y = LD(b), g = LD(dh);
        const __m512 sg = fsigmoid16(x);
        const __m512 ra = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(g, y), sg),
                                        _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, sg))));
        const __m512 rb = _mm512_mul_ps(_mm512_mul_ps(g, x), sg);
        ST(da, ra);
        ST(db, rb);
    }
}

#define NL_VEC_OWN_gate_fwd
static void gate_fwd_avx512(float *out, const float *o, const float *g, int64_t n) {
    /* out = x·σ(z) */
    V16_FOR(n) {
        V16_MASK(n);
        const __m512 x = LD(o), z = LD(g);
        ST(out, _mm512_mul_ps(x, fsigmoid16(z)));
    }
}

#define NL_VEC_OWN_gate_bwd
static void gate_bwd_avx512(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n) {
    /* do = dy·σ, dg = dy·x·σ·(1 − σ) */
    const __m512 one = _mm512_set1_ps(1.0f);
    V16_FOR(n) {
        V16_MASK(n);
        const __m512 x = LD(o), z = LD(g), dy = LD(dout);
        const __m512 sg = fsigmoid16(z);
        const __m512 ro = _mm512_mul_ps(dy, sg);
        const __m512 rg = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dy, x), sg), _mm512_sub_ps(one, sg));
        ST(d_o, ro);
        ST(dg, rg);
    }
}

#undef LD
#undef ST

/* ---- nn/xent.c: one target row; vec_body.h's body with its passes on 16 lanes ---- */

#define NL_VEC_OWN_xent_row
static double xent_row_avx512(float *z, int y, int V, float inv_n, int want_grad) {
    /* the max: max_ps(z, m) is `z > m ? z : m` lane by lane (NaN and equal zeros keep m), so the
     * value of the 8-lane scan (the sign of a zero max aside, which nothing downstream sees) */
    __m512 mv = _mm512_set1_ps(z[0]);
    int j = 0;
    for (; j + 16 <= V; j += 16) mv = _mm512_max_ps(_mm512_loadu_ps(z + j), mv);
    float lanes[16], m = z[0];
    _mm512_storeu_ps(lanes, mv);
    for (int l = 0; l < 16; l++) m = lanes[l] > m ? lanes[l] : m;
    for (; j < V; j++) m = z[j] > m ? z[j] : m;
    /* Σ exp(z − m) per 1024-logit chunk: the 8 float partials of the portable body (each 16-lane
     * block adds its low then its high 8 lanes: blocks of 8 in order), its scalar tail, chunks
     * summed in double; with want_grad the exponentials are kept in z */
    const float zy = z[y];
    const __m512 vm = _mm512_set1_ps(m);
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += NL_VEC_XCH_AVX512) {
        const int nc = V - j0 < NL_VEC_XCH_AVX512 ? V - j0 : NL_VEC_XCH_AVX512;
        float *zc = z + j0;
        __m256 acc = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= nc; i += 16) {
            const __m512 t = fexp16(_mm512_sub_ps(_mm512_loadu_ps(zc + i), vm));
            if (want_grad) _mm512_storeu_ps(zc + i, t);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(t, 1));
        }
        if (i + 8 <= nc) {
            const __m512 t = fexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(0xFF, zc + i), vm));
            if (want_grad) _mm512_mask_storeu_ps(zc + i, 0xFF, t);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
            i += 8;
        }
        double part = 0.0;
        for (; i < nc; i++) {
            const float e = nl_fexp(zc[i] - m);
            if (want_grad) zc[i] = e;
            part += e;
        }
        float a8[8];
        _mm256_storeu_ps(a8, acc);
        for (int l = 0; l < 8; l++) part += a8[l];
        sum += part;
    }
    const double lse = (double)m + log(sum);
    if (want_grad) {
        const float c = (float)((double)inv_n / sum);
        nl_vscale(z, c, V);
        z[y] -= inv_n;
    }
    return lse - (double)zy;
}

#define NL_VEC_ISA avx512
#include "cpu/vec_body.h"
#else
typedef int nl_vec_avx512_empty; /* ISO C: a translation unit must not be empty */
#endif

/* cpu/i8_avx512vnni: the int8 FWD row on AVX512_VNNI (vpdpbusd zmm; contract: kernels.h, "the
 * int8 FWD rows"). A micro-tile is MR <= 6 rows × 32 columns with everything in registers: 12
 * int32 group accumulators (each started from BC, the -128·Σq correction) and 12 float
 * accumulators, loaded from C (or zero) once and stored once; per group the sums go to float
 * once and meet the scales in the contract's order, so the bits are the scalar row's. On Zen 4
 * vpdpbusd, vmulps and vfmadd share the two FP multiply pipes (vcvtdq2ps does not), so a
 * 32-group's 16 vpdpbusd per row and 16 columns carry 2 scale operations (3 with the min term):
 * the tile keeps the row at ~0.8 of the vpdpbusd peak (the 12-row tile with its float
 * accumulators on the stack ran at ~0.6). Full tiles use plain loads and stores; only the
 * panel's last columns take masks. The group size (32, 16) and the min term are compile-time.
 * pack_b: the VNNI transpose of a decoded tile (16×16 dword transposes) and BC through vpdpbusd
 * against ones (exact). quant_row: the scalar quantization (i8.c) lane by lane. */
#include <immintrin.h>

#include "cpu/kernels.h"
#include "model/quant.h"

#define MR 6

static inline __attribute__((always_inline)) void ukr(const int mr, const int gs, const int mn, int kc,
                                                      const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                                                      int64_t ldd, const uint32_t *B, const int32_t *BC,
                                                      const float *SW, const float *MW, float *C, int64_t ldc,
                                                      int ncols, int accumulate) {
    __m512 f0[MR], f1[MR];
    if (ncols >= 32) {
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            f0[i] = accumulate ? _mm512_loadu_ps(C + i * ldc) : _mm512_setzero_ps();
            f1[i] = accumulate ? _mm512_loadu_ps(C + i * ldc + 16) : _mm512_setzero_ps();
        }
    } else {
        const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << (ncols > 0 ? ncols : 0)) - 1u);
        const int n1 = ncols - 16;
        const __mmask16 m1 = n1 >= 16 ? 0xffff : (__mmask16)((1u << (n1 > 0 ? n1 : 0)) - 1u);
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            f0[i] = accumulate ? _mm512_maskz_loadu_ps(m0, C + i * ldc) : _mm512_setzero_ps();
            f1[i] = accumulate ? _mm512_maskz_loadu_ps(m1, C + i * ldc + 16) : _mm512_setzero_ps();
        }
    }
    const int ng = kc / gs, rq = gs / 4;
    for (int g = 0; g < ng; g++) {
        __m512i s0[MR], s1[MR];
        const __m512i c0 = _mm512_loadu_si512(BC + g * NL_HOST_NP), c1 = _mm512_loadu_si512(BC + g * NL_HOST_NP + 16);
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) s0[i] = c0, s1[i] = c1;
        const uint32_t *b = B + (int64_t)g * rq * NL_HOST_NP;
        const uint8_t *a = A + g * gs;
        _Pragma("GCC unroll 8") for (int r = 0; r < rq; r++) {
            const __m512i b0 = _mm512_loadu_si512(b + r * NL_HOST_NP), b1 = _mm512_loadu_si512(b + r * NL_HOST_NP + 16);
            _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
                int32_t av;
                __builtin_memcpy(&av, a + i * lda + 4 * r, 4);
                const __m512i x = _mm512_set1_epi32(av);
                s0[i] = _mm512_dpbusd_epi32(s0[i], x, b0);
                s1[i] = _mm512_dpbusd_epi32(s1[i], x, b1);
            }
        }
        const __m512 w0 = _mm512_loadu_ps(SW + g * NL_HOST_NP), w1 = _mm512_loadu_ps(SW + g * NL_HOST_NP + 16);
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            const __m512 dx = _mm512_set1_ps(DX[i * ldd + g]);
            f0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[i]), _mm512_mul_ps(w0, dx), f0[i]);
            f1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[i]), _mm512_mul_ps(w1, dx), f1[i]);
        }
        if (mn) {
            const __m512 v0 = _mm512_loadu_ps(MW + g * NL_HOST_NP), v1 = _mm512_loadu_ps(MW + g * NL_HOST_NP + 16);
            _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
                const __m512 sx = _mm512_set1_ps(SX[i * ldd + g]);
                f0[i] = _mm512_fmadd_ps(v0, sx, f0[i]);
                f1[i] = _mm512_fmadd_ps(v1, sx, f1[i]);
            }
        }
    }
    if (ncols >= 32) {
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            _mm512_storeu_ps(C + i * ldc, f0[i]);
            _mm512_storeu_ps(C + i * ldc + 16, f1[i]);
        }
    } else {
        const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << (ncols > 0 ? ncols : 0)) - 1u);
        const int n1 = ncols - 16;
        const __mmask16 m1 = n1 >= 16 ? 0xffff : (__mmask16)((1u << (n1 > 0 ? n1 : 0)) - 1u);
        _Pragma("GCC unroll 6") for (int i = 0; i < mr; i++) {
            _mm512_mask_storeu_ps(C + i * ldc, m0, f0[i]);
            _mm512_mask_storeu_ps(C + i * ldc + 16, m1, f1[i]);
        }
    }
}

/* one instantiation per (rows, group size, min term) */
#define UKR_ARGS kc, A, lda, DX, SX, ldd, B, BC, SW, MW, C, ldc, ncols, accumulate
#define UKR_PARAMS                                                                                                     \
    int kc, const uint8_t *A, int64_t lda, const float *DX, const float *SX, int64_t ldd, const uint32_t *B,           \
        const int32_t *BC, const float *SW, const float *MW, float *C, int64_t ldc, int ncols, int accumulate
#define UKR_DEF(mr, gs, mn)                                                                                            \
    static void ukr_##mr##_##gs##_##mn(UKR_PARAMS) { ukr(mr, gs, mn, UKR_ARGS); }
// clang-format off
#define UKR_SET(gs, mn)                                                                                                  \
    UKR_DEF(6, gs, mn) UKR_DEF(5, gs, mn) UKR_DEF(4, gs, mn) UKR_DEF(3, gs, mn) UKR_DEF(2, gs, mn) UKR_DEF(1, gs, mn) \
    static void (*const ukrs_##gs##_##mn[7])(UKR_PARAMS) = {NULL, ukr_1_##gs##_##mn, ukr_2_##gs##_##mn, ukr_3_##gs##_##mn, ukr_4_##gs##_##mn, ukr_5_##gs##_##mn, ukr_6_##gs##_##mn};
// clang-format on
UKR_SET(32, 0)
UKR_SET(32, 1)
UKR_SET(16, 0)
UKR_SET(16, 1)

static void gemm_i8_fwd(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate) {
    void (*const *ks)(UKR_PARAMS) = gs == 32 ? (MW ? ukrs_32_1 : ukrs_32_0) : (MW ? ukrs_16_1 : ukrs_16_0);
    for (int s = 0; s < NL_HOST_NP && s < ncols; s += 32)
        for (int i = 0; i < m; i += MR) {
            const int mr = m - i < MR ? m - i : MR;
            ks[mr](kc, A + i * lda, lda, DX + i * ldd, SX ? SX + i * ldd : NULL, ldd, B + s, BC + s, SW + s,
                   MW ? MW + s : NULL, C + i * ldc + s, ldc, ncols - s, accumulate);
        }
}

/* 16 rows of 16 dwords (r[j] = row j) -> r[k] = the k-th dwords of rows 0..15 */
static inline __attribute__((always_inline)) void tr16(__m512i r[16]) {
    __m512i t[16];
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) {
        r[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
        r[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        r[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        r[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    /* r[4q + c]: lane quarter l holds rows 4q..4q+3 (of 128-bit lane l) of column 4l + c */
    for (int j = 0; j < 16; j += 8)
        for (int c = 0; c < 4; c++) {
            t[j + c] = _mm512_shuffle_i32x4(r[j + c], r[j + 4 + c], 0x88);     /* lanes 0,2 of each */
            t[j + 4 + c] = _mm512_shuffle_i32x4(r[j + c], r[j + 4 + c], 0xdd); /* lanes 1,3 */
        }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

static void pack_b(const int8_t *tile, int ldt, int kc, int gs, uint32_t *B, int32_t *BC) {
    const __m512i ones = _mm512_set1_epi8(1);
    const int nr = kc / 4, rg = gs / 4;
    for (int j0 = 0; j0 < NL_HOST_NP; j0 += 16)
        for (int r0 = 0; r0 < nr; r0 += 16) {
            const int n = nr - r0 < 16 ? nr - r0 : 16;
            const __mmask16 mk = (__mmask16)((1u << n) - 1u);
            __m512i v[16];
            for (int j = 0; j < 16; j++) v[j] = _mm512_maskz_loadu_epi32(mk, tile + (int64_t)(j0 + j) * ldt + 4 * r0);
            tr16(v);
            for (int r = 0; r < n; r++) _mm512_storeu_si512(B + (int64_t)(r0 + r) * NL_HOST_NP + j0, v[r]);
            for (int r = 0; r < n; r += rg) {
                __m512i s = _mm512_setzero_si512();
                for (int q = 0; q < rg; q++) s = _mm512_dpbusd_epi32(s, ones, v[r + q]);
                _mm512_storeu_si512(BC + (int64_t)((r0 + r) / rg) * NL_HOST_NP + j0,
                                    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7)));
            }
        }
}

/* Q8_0 rows straight to B, BC, SW: per 16 columns × 64 k, two 32-byte block loads per row make
 * the row's 16 dwords, then the tile's transpose; the 16 FP16 d of a group convert at once
 * (vcvtph2ps, exact; an inf/NaN d takes nl_f16_to_f32, which keeps a NaN's payload unquieted) */
static void pack_q8_0(const uint8_t *W, size_t rb, int64_t b0, int kc, int ncols, uint32_t *B, int32_t *BC, float *SW) {
    const __m512i ones = _mm512_set1_epi8(1);
    const int nr = kc / 4;
    for (int j0 = 0; j0 < NL_HOST_NP; j0 += 16) {
        const int nj = ncols - j0 < 0 ? 0 : ncols - j0 < 16 ? ncols - j0 : 16;
        for (int r0 = 0; r0 < nr; r0 += 16) {
            const int n = nr - r0 < 16 ? nr - r0 : 16; /* 16 or 8: kc is a multiple of 32 */
            __m512i v[16];
            for (int j = 0; j < 16; j++) {
                if (j < nj) {
                    const uint8_t *p = W + (size_t)(j0 + j) * rb + (size_t)(b0 + r0 / 8) * 34 + 2;
                    const __m256i lo = _mm256_loadu_si256((const __m256i *)p);
                    const __m256i hi = n == 16 ? _mm256_loadu_si256((const __m256i *)(p + 34)) : _mm256_setzero_si256();
                    v[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                } else {
                    v[j] = _mm512_setzero_si512();
                }
            }
            tr16(v);
            for (int r = 0; r < n; r++) _mm512_storeu_si512(B + (int64_t)(r0 + r) * NL_HOST_NP + j0, v[r]);
            for (int r = 0; r < n; r += 8) {
                __m512i s = _mm512_setzero_si512();
                for (int q = 0; q < 8; q++) s = _mm512_dpbusd_epi32(s, ones, v[r + q]);
                _mm512_storeu_si512(BC + (int64_t)((r0 + r) / 8) * NL_HOST_NP + j0,
                                    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7)));
            }
        }
        for (int g = 0; g < kc / 32; g++) {
            uint16_t h[16] = {0};
            int special = 0;
            for (int j = 0; j < nj; j++) {
                __builtin_memcpy(&h[j], W + (size_t)(j0 + j) * rb + (size_t)(b0 + g) * 34, 2);
                special |= (h[j] & 0x7c00) == 0x7c00;
            }
            float *sw = SW + (int64_t)g * NL_HOST_NP + j0;
            _mm512_storeu_ps(sw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
            if (special)
                for (int j = 0; j < nj; j++)
                    if ((h[j] & 0x7c00) == 0x7c00) sw[j] = nl_f16_to_f32(h[j]);
        }
    }
}

/* ---- quant_row: the scalar form's operations lane by lane (i8.c), so the same bytes ---- */

/* q = (int)((v·s + 2^23·1.5) − 2^23·1.5): the scalar rne of v·s (mul, add, sub: no FMA) */
static inline __attribute__((always_inline)) __m512i rne16(__m512 v, __m512 s) {
    const __m512 mg = _mm512_set1_ps(12582912.0f);
    return _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, s), mg), mg));
}

/* FP16 round trips of n <= 16 floats in place (vcvtps2ph: round to nearest even, as nl_f32_to_f16) */
static void f16r16(float *v, int n) {
    const __mmask16 k = (__mmask16)((1u << n) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(k, v);
    _mm512_mask_storeu_ps(v, k, _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

/* Q8_0 / Q8_1: 16 blocks of 32 at a time (dx, sx rounded to FP16 together) */
static void quant_q8_0(int q81, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi32(128);
    for (int64_t b0 = 0; b0 < K / 32; b0 += 16) {
        const int nb = K / 32 - b0 < 16 ? (int)(K / 32 - b0) : 16;
        float d[16], s[16];
        for (int b = 0; b < nb; b++) {
            const float *v = x + 32 * (b0 + b);
            const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            /* vmaxps(a, m) = a > m ? a : m, the scalar's step; a NaN lane keeps m */
            const __m512 m = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), zero));
            const float amax = _mm512_reduce_max_ps(m); /* no NaN lanes: any order */
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            d[b] = amax / 127.0f;
            const __m512 idv = _mm512_set1_ps(id);
            const __m512i q0 = rne16(v0, idv), q1 = rne16(v1, idv);
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)); /* wraps as the scalar int sum */
            s[b] = d[b] * (float)sum;
            _mm_storeu_si128((__m128i *)(xq + 32 * (b0 + b)), _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, off)));
            _mm_storeu_si128((__m128i *)(xq + 32 * (b0 + b) + 16), _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, off)));
        }
        f16r16(d, nb);
        __builtin_memcpy(dx + b0, d, sizeof(float) * (size_t)nb);
        if (q81 && sx) {
            f16r16(s, nb);
            __builtin_memcpy(sx + b0, s, sizeof(float) * (size_t)nb);
        }
    }
}

/* Q8_K: 256-blocks, max = the first x of largest |x| */
static void quant_q8_k(int gs, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi32(128), top = _mm512_set1_epi32(127);
    const int ng = 256 / gs;
    for (int64_t b = 0; b < K / 256; b++) {
        const float *v = x + 256 * b;
        __m512 m = zero;
        for (int i = 0; i < 256; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + i)), m);
        const float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            _mm512_storeu_si512(xq + 256 * b, _mm512_set1_epi8((char)128));
            _mm512_storeu_si512(xq + 256 * b + 64, _mm512_set1_epi8((char)128));
            _mm512_storeu_si512(xq + 256 * b + 128, _mm512_set1_epi8((char)128));
            _mm512_storeu_si512(xq + 256 * b + 192, _mm512_set1_epi8((char)128));
            for (int g = 0; g < ng; g++) {
                dx[b * ng + g] = 0.0f;
                if (sx) sx[b * ng + g] = 0.0f;
            }
            continue;
        }
        const __m512 am = _mm512_set1_ps(amax);
        int first = 0;
        for (int i = 0; i < 256; i += 16) {
            const __mmask16 e = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + i)), am, _CMP_EQ_OQ);
            if (e) {
                first = i + __builtin_ctz(e);
                break;
            }
        }
        const float iscale = -127.0f / v[first], d = 1.0f / iscale;
        const __m512 isv = _mm512_set1_ps(iscale);
        __m512i sums[16];
        for (int i = 0; i < 256; i += 16) {
            const __m512i q = _mm512_min_epi32(rne16(_mm512_loadu_ps(v + i), isv), top);
            sums[i / 16] = q;
            _mm_storeu_si128((__m128i *)(xq + 256 * b + i), _mm512_cvtepi32_epi8(_mm512_add_epi32(q, off)));
        }
        for (int g = 0; g < ng; g++) {
            dx[b * ng + g] = d;
            if (sx) {
                const __m512i t = gs == 16 ? sums[g] : _mm512_add_epi32(sums[2 * g], sums[2 * g + 1]);
                sx[b * ng + g] = d * (float)_mm512_reduce_add_epi32(t);
            }
        }
    }
}

static void quant_row(int act, int gs, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx) {
    if (act == NL_I8_Q8_K) quant_q8_k(gs, x, K, xq, dx, sx);
    else quant_q8_0(act == NL_I8_Q8_1, x, K, xq, dx, sx);
}

const nl_i8_kernels nl_i8_kernels_avx512vnni = {
    .name = "avx512vnni", .gemm_i8_fwd = gemm_i8_fwd, .pack_b = pack_b, .pack_q8_0 = pack_q8_0, .quant_row = quant_row};

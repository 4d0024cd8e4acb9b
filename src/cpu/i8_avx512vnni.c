/* cpu/i8_avx512vnni: the int8 FWD row on AVX512_VNNI (vpdpbusd zmm; contract: kernels.h, "the
 * int8 FWD rows"). A micro-tile is MR <= 12 rows × 32 columns: 24 int32 group accumulators in
 * registers (each started from BC, the -128·Σq correction), the float accumulators in a 12×32
 * buffer on the stack (L1); per group the sums go to float once and meet the scales in the
 * contract's order, so the bits are the scalar row's. The group size (32, 16) and the min term
 * are compile-time, so the group's vpdpbusd are straight-line code with no register copies.
 * The next tile's activation rows are prefetched one group ahead. pack_b: the VNNI transpose of
 * a decoded tile (16×16 dword transposes) and BC through vpdpbusd against ones (exact). */
#include <immintrin.h>

#include "cpu/kernels.h"

#define MR 12

static inline __attribute__((always_inline)) void ukr(const int mr, const int gs, const int mn, int kc,
                                                      const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                                                      int64_t ldd, const uint32_t *B, const int32_t *BC,
                                                      const float *SW, const float *MW, float *C, int64_t ldc,
                                                      int ncols, int accumulate, const uint8_t *An, int mn_next) {
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << (ncols > 0 ? ncols : 0)) - 1u);
    const int n1 = ncols - 16;
    const __mmask16 m1 = n1 >= 16 ? 0xffff : (__mmask16)((1u << (n1 > 0 ? n1 : 0)) - 1u);
    float acc[MR * 32] __attribute__((aligned(64)));
    _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
        if (accumulate) {
            _mm512_store_ps(acc + 32 * i, _mm512_maskz_loadu_ps(m0, C + i * ldc));
            _mm512_store_ps(acc + 32 * i + 16, _mm512_maskz_loadu_ps(m1, C + i * ldc + 16));
        } else {
            _mm512_store_ps(acc + 32 * i, _mm512_setzero_ps());
            _mm512_store_ps(acc + 32 * i + 16, _mm512_setzero_ps());
        }
    }
    const int ng = kc / gs, rq = gs / 4;
    for (int g = 0; g < ng; g++) {
        __m512i s0[MR], s1[MR];
        _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
            s0[i] = _mm512_loadu_si512(BC + g * NL_HOST_NP);
            s1[i] = _mm512_loadu_si512(BC + g * NL_HOST_NP + 16);
        }
        const uint32_t *b = B + (int64_t)g * rq * NL_HOST_NP;
        const uint8_t *a = A + g * gs;
        if (An && (g * gs) % 64 == 0)
            for (int i = 0; i < mn_next; i++) _mm_prefetch((const char *)(An + i * lda + g * gs), _MM_HINT_T0);
        _Pragma("GCC unroll 8") for (int r = 0; r < rq; r++) {
            const __m512i b0 = _mm512_loadu_si512(b + r * NL_HOST_NP), b1 = _mm512_loadu_si512(b + r * NL_HOST_NP + 16);
            _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
                int32_t av;
                __builtin_memcpy(&av, a + i * lda + 4 * r, 4);
                const __m512i x = _mm512_set1_epi32(av);
                s0[i] = _mm512_dpbusd_epi32(s0[i], x, b0);
                s1[i] = _mm512_dpbusd_epi32(s1[i], x, b1);
            }
        }
        const __m512 w0 = _mm512_loadu_ps(SW + g * NL_HOST_NP), w1 = _mm512_loadu_ps(SW + g * NL_HOST_NP + 16);
        if (mn) {
            const __m512 v0 = _mm512_loadu_ps(MW + g * NL_HOST_NP), v1 = _mm512_loadu_ps(MW + g * NL_HOST_NP + 16);
            _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
                const __m512 dx = _mm512_set1_ps(DX[i * ldd + g]), sx = _mm512_set1_ps(SX[i * ldd + g]);
                __m512 f0 =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[i]), _mm512_mul_ps(w0, dx), _mm512_load_ps(acc + 32 * i));
                __m512 f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[i]), _mm512_mul_ps(w1, dx),
                                            _mm512_load_ps(acc + 32 * i + 16));
                _mm512_store_ps(acc + 32 * i, _mm512_fmadd_ps(v0, sx, f0));
                _mm512_store_ps(acc + 32 * i + 16, _mm512_fmadd_ps(v1, sx, f1));
            }
        } else {
            _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
                const __m512 dx = _mm512_set1_ps(DX[i * ldd + g]);
                _mm512_store_ps(acc + 32 * i, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[i]), _mm512_mul_ps(w0, dx),
                                                              _mm512_load_ps(acc + 32 * i)));
                _mm512_store_ps(acc + 32 * i + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[i]), _mm512_mul_ps(w1, dx),
                                                                   _mm512_load_ps(acc + 32 * i + 16)));
            }
        }
    }
    _Pragma("GCC unroll 12") for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(C + i * ldc, m0, _mm512_load_ps(acc + 32 * i));
        _mm512_mask_storeu_ps(C + i * ldc + 16, m1, _mm512_load_ps(acc + 32 * i + 16));
    }
}

/* one instantiation per (rows, group size, min term) */
#define UKR_ARGS kc, A, lda, DX, SX, ldd, B, BC, SW, MW, C, ldc, ncols, accumulate, An, mn_next
#define UKR_PARAMS                                                                                                     \
    int kc, const uint8_t *A, int64_t lda, const float *DX, const float *SX, int64_t ldd, const uint32_t *B,           \
        const int32_t *BC, const float *SW, const float *MW, float *C, int64_t ldc, int ncols, int accumulate,         \
        const uint8_t *An, int mn_next
#define UKR_DEF(mr, gs, mn)                                                                                            \
    static void ukr_##mr##_##gs##_##mn(UKR_PARAMS) { ukr(mr, gs, mn, UKR_ARGS); }
/* an X-macro list, laid out by hand (clang-format splits it differently on each pass) */
// clang-format off
#define UKR_SET(gs, mn)                                                                                                  \
    UKR_DEF(12, gs, mn)                                                                                                  \
    UKR_DEF(8, gs, mn) UKR_DEF(4, gs, mn) UKR_DEF(2, gs, mn) UKR_DEF(1, gs, mn) static void (*const ukrs_##gs##_##mn[5])( \
        UKR_PARAMS) = {ukr_12_##gs##_##mn, ukr_8_##gs##_##mn, ukr_4_##gs##_##mn, ukr_2_##gs##_##mn, ukr_1_##gs##_##mn};
// clang-format on
UKR_SET(32, 0)
UKR_SET(32, 1)
UKR_SET(16, 0)
UKR_SET(16, 1)

static void gemm_i8_fwd(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                        int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW, float *C,
                        int64_t ldc, int ncols, int accumulate) {
    void (*const *ks)(UKR_PARAMS) = gs == 32 ? (MW ? ukrs_32_1 : ukrs_32_0) : (MW ? ukrs_16_1 : ukrs_16_0);
    static const int rows[5] = {12, 8, 4, 2, 1};
    for (int s = 0; s < NL_HOST_NP && s < ncols; s += 32) {
        const uint32_t *b = B + s;
        const int32_t *bc = BC + s;
        const float *sw = SW + s, *mw = MW ? MW + s : NULL;
        const int nc = ncols - s;
        int i = 0;
        for (int t = 0; t < 5; t++)
            for (; i + rows[t] <= m; i += rows[t]) {
                const int inext = i + rows[t], mnext = m - inext < MR ? m - inext : MR;
                ks[t](kc, A + i * lda, lda, DX + i * ldd, SX ? SX + i * ldd : NULL, ldd, b, bc, sw, mw, C + i * ldc + s,
                      ldc, nc, accumulate, mnext > 0 ? A + inext * lda : NULL, mnext);
            }
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

const nl_i8_kernels nl_i8_kernels_avx512vnni = {.name = "avx512vnni", .gemm_i8_fwd = gemm_i8_fwd, .pack_b = pack_b};

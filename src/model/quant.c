/* model/quant: one traits table for the ggml tensor types nightlora reads and writes.
 *
 * Every block formula here follows docs/formats.md §1 (the reference dequantizers and
 * quantizers of ggml), so bytes written here load in llama.cpp and bytes read here mean what
 * llama.cpp means. Quantizers are the reference (non-SIMD) ones: deterministic, bit-exact. */
#include "model/quant.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Scalar conversions                                                                        */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float nl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan: keep the payload in the top mantissa bits */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13)); /* rebias 15 -> 127 */
}

/* Round to nearest, ties to even, like the F16C instruction (vcvtps2ph, imm 0): overflow to
 * inf, subnormal results rounded correctly, NaN quieted with its top payload bits kept. */
uint16_t nl_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t e = ax >> 23; /* biased f32 exponent */
    uint32_t mant = ax & 0x7fffff;
    if (e == 0xff) {
        if (mant == 0) return sign | 0x7c00;
        return sign | 0x7e00 | (uint16_t)(mant >> 13);
    }
    if (e > 142) return sign | 0x7c00; /* >= 2^16: inf */
    if (e >= 113) {
        /* normal half: exponent e-112, 10 mantissa bits, round on the 13 dropped bits.
         * A carry out of the mantissa moves to the exponent (and 65520.. to inf): correct. */
        uint32_t h = ((e - 112) << 10) | (mant >> 13);
        uint32_t rem = mant & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    if (e < 102) return sign; /* < 2^-25: rounds to (signed) zero; 2^-25 itself ties to 0 */
    /* subnormal half: value = m * 2^(e-150) with the implicit bit, in units of 2^-24 */
    uint32_t m = mant | 0x800000;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++; /* may become 0x400, the least normal */
    return sign | (uint16_t)h;
}

float nl_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t nl_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);                /* nearest even */
}

/* ---------------------------------------------------------------------------------------- */
/* Row converters (n elements, n a multiple of the block size)                               */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = nl_f16_to_f32(rd16(s + 2 * i));
}
static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) wr16(d + 2 * i, nl_f32_to_f16(src[i]));
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = nl_bf16_to_f32(rd16(s + 2 * i));
}
static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) wr16(d + 2 * i, nl_f32_to_bf16(src[i]));
}

/* Q8_0: 32 elements, { f16 d; int8 qs[32]; } = 34 bytes; y = qs*d. Byte access (not the
 * struct) so that unaligned GGUF mappings are fine. */
static void q8_0_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 32; i++, b += 34) {
        float d = nl_f16_to_f32(rd16(b));
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = (float)(int8_t)b[2 + j] * d;
    }
}
/* Reference quantizer: amax = max|v|, d = amax/127, q = roundf(v * (1/d)) (ggml multiplies by
 * the reciprocal, computed once from the unrounded d; d itself is stored as f16). */
static void q8_0_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / 32; i++, b += 34) {
        const float *x = src + i * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(b, nl_f32_to_f16(d));
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* Q4_0: 32 elements, { f16 d; uint8 qs[16]; } = 18 bytes; low nibble of qs[j] is element j,
 * high nibble element j+16; y = (q-8)*d. */
static void q4_0_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 32; i++, b += 18) {
        float d = nl_f16_to_f32(rd16(b));
        float *y = dst + i * 32;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
    }
}
/* Reference quantizer: max = the signed element of largest |v| (first one on ties),
 * d = max/-8, q = MIN(15, (int8)(v/d + 8.5)) so that max maps to q = 0 exactly. */
static void q4_0_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / 32; i++, b += 18) {
        const float *x = src + i * 32;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(b, nl_f32_to_f16(d));
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 8.5f);
            int q1 = (int8_t)(x[j + 16] * id + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            b[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q5_0: 32 elements, { f16 d; uint8 qh[4]; uint8 qs[16]; } = 22 bytes; element j (< 16) is the
 * low nibble of qs[j] with bit j of qh (little-endian u32) as its fifth bit, element j + 16 the
 * high nibble with bit j + 16; y = d * (q - 16). */
static void q5_0_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 32; i++, b += 22) {
        const float d = nl_f16_to_f32(rd16(b));
        const uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
        float *y = dst + i * 32;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int)((b[6 + j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
            const int x1 = (int)((b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}
/* Q4_1: 32 elements, { f16 d; f16 m; uint8 qs[16]; } = 20 bytes; nibbles as Q4_0 (low =
 * element j, high = element j+16), unsigned; y = q*d + m (q*d is exact in f32: 4 x 11 bits). */
static void q4_1_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 32; i++, b += 20) {
        const float d = nl_f16_to_f32(rd16(b)), m = nl_f16_to_f32(rd16(b + 2));
        float *y = dst + i * 32;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0x0f) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    }
}
/* Reference quantizer: min and max of the block, d = (max-min)/15, id = d ? 1/d : 0 (from the
 * unrounded d), q = MIN(15, (int8)((v-min)*id + 0.5)); d and min are stored as f16. */
static void q4_1_from_float(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n / 32; i++, b += 20) {
        const float *x = src + i * 32;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(b, nl_f32_to_f16(d));
        wr16(b + 2, nl_f32_to_f16(min));
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)((x[j] - min) * id + 0.5f);
            int q1 = (int8_t)((x[j + 16] - min) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            b[4 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q4_K: 256 elements, { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; } = 144 bytes.
 * 8 sub-blocks of 32 with 6-bit scale and min packed in `scales`. */
static void q4_k_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
static void q4_k_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 256; i++, b += 144) {
        const float d = nl_f16_to_f32(rd16(b));
        const float dmin = nl_f16_to_f32(rd16(b + 2));
        const uint8_t *scales = b + 4, *q = b + 16;
        float *y = dst + i * 256;
        for (int is = 0; is < 8; is += 2, q += 32) {
            int sc, m;
            q4_k_scale_min(is, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            q4_k_scale_min(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* Q6_K: 256 elements, { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; } = 210 bytes.
 * 6-bit q = 4 low bits from ql | 2 high bits from qh, minus 32; y = d*scale*q. */
static void q6_k_to_float(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / 256; i++, b += 210) {
        const float d = nl_f16_to_f32(rd16(b + 208));
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float *y = dst + i * 256;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Non-finite values, found from the bytes                                                   */

/* The first of `count` little-endian 16-bit fields at src + k * stride whose bits & mask ==
 * mask (an f16 / bf16 with an all-ones exponent: Inf or NaN), -1 when none. Chunks are
 * OR-reduced without an early exit (contiguous fields: 64-bit words, four fields a word, a
 * loop the compiler vectorizes), then searched field by field. */
static int64_t first_u16_all_ones(const uint8_t *src, int64_t count, size_t stride, uint16_t mask) {
    const uint64_t m4 = mask * 0x0001000100010001ull;
    for (int64_t k0 = 0; k0 < count; k0 += 4096) {
        const int64_t k1 = count - k0 < 4096 ? count : k0 + 4096;
        uint64_t any = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (stride == 2) {
            int64_t k = k0;
            for (; k + 4 <= k1; k += 4) {
                uint64_t w;
                memcpy(&w, src + 2 * k, 8);
                /* a lane of t is 0 exactly where a field has the mask's bits all set; bit 15 of
                 * every lane of t is 0, so the borrow test below sees exactly those lanes */
                const uint64_t t = (w & m4) ^ m4;
                any |= (t - 0x0001000100010001ull) & ~t & 0x8000800080008000ull;
            }
            for (; k < k1; k++) any |= (rd16(src + 2 * k) & mask) == mask;
        } else
#endif
            for (int64_t k = k0; k < k1; k++) any |= (rd16(src + (size_t)k * stride) & mask) == mask;
        if (!any) continue;
        for (int64_t k = k0; k < k1; k++)
            if ((rd16(src + (size_t)k * stride) & mask) == mask) return k;
    }
    return -1;
}

static int isinf_or_nan_at(const uint8_t *p, int64_t i) {
    uint32_t u;
    memcpy(&u, p + 4 * i, 4);
    return (u & 0x7f800000u) == 0x7f800000u;
}
static int64_t f32_first_nonfinite(const void *src, int64_t n) {
    const uint8_t *p = src;
    const uint64_t m2 = 0x7f8000007f800000ull;
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1 = n - i0 < 4096 ? n : i0 + 4096;
        uint64_t any = 0;
        int64_t i = i0;
        for (; i + 2 <= i1; i += 2) { /* two floats a word, as first_u16_all_ones does four halves */
            uint64_t w;
            memcpy(&w, p + 4 * i, 8);
            const uint64_t t = (w & m2) ^ m2;
            any |= (t - 0x0000000100000001ull) & ~t & 0x8000000080000000ull;
        }
        for (; i < i1; i++) any |= isinf_or_nan_at(p, i);
        if (!any) continue;
        for (i = i0; i < i1; i++)
            if (isinf_or_nan_at(p, i)) return i;
    }
    return -1;
}
static int64_t f16_first_nonfinite(const void *src, int64_t n) { return first_u16_all_ones(src, n, 2, 0x7c00); }
static int64_t bf16_first_nonfinite(const void *src, int64_t n) { return first_u16_all_ones(src, n, 2, 0x7f80); }
/* The first element of the first block (blck elements of `bytes`) whose f16 field at off0,
 * or at off1 (>= 0), is Inf or NaN; -1 when none. */
static int64_t first_bad_scale(const void *src, int64_t n, int blck, size_t bytes, size_t off0, int off1) {
    const int64_t nb = n / blck;
    int64_t k = first_u16_all_ones((const uint8_t *)src + off0, nb, bytes, 0x7c00);
    if (off1 >= 0) {
        int64_t k1 = first_u16_all_ones((const uint8_t *)src + off1, k < 0 ? nb : k, bytes, 0x7c00);
        if (k1 >= 0) k = k1;
    }
    return k < 0 ? -1 : k * blck;
}
/* Q8_0, Q4_0, Q5_0: y = d * q (|q| <= 128): finite with a finite d, and an Inf or NaN d makes every
 * value of its block Inf or NaN. Q4_1: y = d * q + m (q <= 15): finite when d and m are.
 * Q4_K: y = d * sc * q - dmin * mn (sc, mn <= 63, q <= 15): finite when d and dmin are.
 * Q6_K: y = d * scale * q (|scale| <= 128, |q| <= 32): finite when d is. */
static int64_t q8_0_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 32, 34, 0, -1); }
static int64_t q4_0_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 32, 18, 0, -1); }
static int64_t q5_0_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 32, 22, 0, -1); }
static int64_t q4_1_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 32, 20, 0, 2); }
static int64_t q4_k_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 256, 144, 0, 2); }
static int64_t q6_k_first_nonfinite(const void *src, int64_t n) { return first_bad_scale(src, n, 256, 210, 208, -1); }

/* ---------------------------------------------------------------------------------------- */
/* The table: one row per ggml id.                                                          */

/* Every ggml id: its name (removed ids keep the one they had), its block layout where known
 * (blck 0: a removed id, or one whose layout nightlora does not know; from ggml-common.h), and
 * the conversions nightlora has for it (NULL: none — such a tensor can still be sized and
 * skipped by the GGUF reader). */
static const nl_type_traits traits[NL_TYPE_COUNT] = {
    [NL_TYPE_F32] = {"f32", 1, 4, f32_to_float, f32_from_float, f32_first_nonfinite},
    [NL_TYPE_F16] = {"f16", 1, 2, f16_to_float, f16_from_float, f16_first_nonfinite},
    [NL_TYPE_Q4_0] = {"q4_0", 32, 18, q4_0_to_float, q4_0_from_float, q4_0_first_nonfinite},
    [NL_TYPE_Q4_1] = {"q4_1", 32, 20, q4_1_to_float, q4_1_from_float, q4_1_first_nonfinite},
    [4] = {"q4_2", 0, 0, NULL, NULL},
    [5] = {"q4_3", 0, 0, NULL, NULL},
    [NL_TYPE_Q5_0] = {"q5_0", 32, 22, q5_0_to_float, NULL, q5_0_first_nonfinite},
    [7] = {"q5_1", 32, 24, NULL, NULL},
    [NL_TYPE_Q8_0] = {"q8_0", 32, 34, q8_0_to_float, q8_0_from_float, q8_0_first_nonfinite},
    [9] = {"q8_1", 32, 36, NULL, NULL},
    [10] = {"q2_k", 256, 84, NULL, NULL},
    [11] = {"q3_k", 256, 110, NULL, NULL},
    [NL_TYPE_Q4_K] = {"q4_k", 256, 144, q4_k_to_float, NULL, q4_k_first_nonfinite},
    [13] = {"q5_k", 256, 176, NULL, NULL},
    [NL_TYPE_Q6_K] = {"q6_k", 256, 210, q6_k_to_float, NULL, q6_k_first_nonfinite},
    [15] = {"q8_k", 256, 292, NULL, NULL},
    [16] = {"iq2_xxs", 256, 66, NULL, NULL},
    [17] = {"iq2_xs", 256, 74, NULL, NULL},
    [18] = {"iq3_xxs", 256, 98, NULL, NULL},
    [19] = {"iq1_s", 256, 50, NULL, NULL},
    [20] = {"iq4_nl", 32, 18, NULL, NULL},
    [21] = {"iq3_s", 256, 110, NULL, NULL},
    [22] = {"iq2_s", 256, 82, NULL, NULL},
    [23] = {"iq4_xs", 256, 136, NULL, NULL},
    [24] = {"i8", 1, 1, NULL, NULL},
    [25] = {"i16", 1, 2, NULL, NULL},
    [26] = {"i32", 1, 4, NULL, NULL},
    [27] = {"i64", 1, 8, NULL, NULL},
    [28] = {"f64", 1, 8, NULL, NULL},
    [29] = {"iq1_m", 256, 56, NULL, NULL},
    [NL_TYPE_BF16] = {"bf16", 1, 2, bf16_to_float, bf16_from_float, bf16_first_nonfinite},
    [31] = {"q4_0_4_4", 0, 0, NULL, NULL},
    [32] = {"q4_0_4_8", 0, 0, NULL, NULL},
    [33] = {"q4_0_8_8", 0, 0, NULL, NULL},
    [34] = {"tq1_0", 256, 54, NULL, NULL},
    [35] = {"tq2_0", 256, 66, NULL, NULL},
    [36] = {"iq4_nl_4_4", 0, 0, NULL, NULL},
    [37] = {"iq4_nl_4_8", 0, 0, NULL, NULL},
    [38] = {"iq4_nl_8_8", 0, 0, NULL, NULL},
    [39] = {"mxfp4", 32, 17, NULL, NULL},
    [40] = {"nvfp4", 0, 0, NULL, NULL},
    [41] = {"q1_0", 0, 0, NULL, NULL},
    [42] = {"q2_0", 0, 0, NULL, NULL},
};

const nl_type_traits *nl_type_info(int type) {
    if (type < 0 || type >= NL_TYPE_COUNT) return NULL;
    return &traits[type];
}

const nl_type_traits *nl_type_get(int type) {
    if (type < 0 || type >= NL_TYPE_COUNT || traits[type].to_float == NULL) return NULL;
    return &traits[type];
}

const char *nl_type_name(int type) {
    if (type < 0 || type >= NL_TYPE_COUNT) return "unknown";
    return traits[type].name;
}

int nl_type_from_name(const char *name) {
    if (!name) return -1;
    for (int t = 0; t < NL_TYPE_COUNT; t++) {
        const char *a = traits[t].name, *b = name;
        while (*a && *b && *a == tolower((unsigned char)*b)) a++, b++;
        if (!*a && !*b) return t;
    }
    return -1;
}

int64_t nl_type_first_nonfinite(int type, const void *src, int64_t n) {
    const nl_type_traits *tt = nl_type_get(type);
    return tt && tt->first_nonfinite ? tt->first_nonfinite(src, n) : -1;
}

int nl_type_ftype(int type) {
    switch (type) {
    case NL_TYPE_F32: return NL_FTYPE_ALL_F32;
    case NL_TYPE_F16: return NL_FTYPE_MOSTLY_F16;
    case NL_TYPE_Q4_0: return NL_FTYPE_MOSTLY_Q4_0;
    case NL_TYPE_Q4_1: return NL_FTYPE_MOSTLY_Q4_1;
    case NL_TYPE_Q8_0: return NL_FTYPE_MOSTLY_Q8_0;
    case NL_TYPE_Q4_K: return NL_FTYPE_MOSTLY_Q4_K_M;
    case NL_TYPE_Q6_K: return NL_FTYPE_MOSTLY_Q6_K;
    case NL_TYPE_BF16: return NL_FTYPE_MOSTLY_BF16;
    default: return -1;
    }
}

size_t nl_row_bytes(int type, int64_t ne0) {
    const nl_type_traits *tt = nl_type_get(type);
    if (!tt || ne0 < 0 || ne0 % tt->blck != 0) return 0;
    return (size_t)(ne0 / tt->blck) * tt->bytes;
}

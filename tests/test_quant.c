/* model/quant: hand-built blocks with known bytes -> known floats for every type, F16/BF16
 * rounding edge cases, reference quantizers checked byte by byte, random round trips. */
#include <stdint.h>

#include "model/gguf.h"
#include "model/quant.h"
#include "test.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The hardware conversion (F16C, round to nearest even) as an independent oracle. */
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) { return (uint16_t)_cvtss_sh(f, 0); }
#define HAVE_HW_F16 1
#endif

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float fbits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void test_names(void) {
    for (int t = 0; t < NL_TYPE_COUNT; t++) {
        CHECK(nl_type_name(t) != NULL && strcmp(nl_type_name(t), "unknown") != 0);
        CHECK(nl_type_from_name(nl_type_name(t)) == t);
    }
    CHECK(strcmp(nl_type_name(-1), "unknown") == 0);
    CHECK(strcmp(nl_type_name(43), "unknown") == 0);
    CHECK(strcmp(nl_type_name(13), "q5_k") == 0);
    CHECK(strcmp(nl_type_name(39), "mxfp4") == 0);
    CHECK(strcmp(nl_type_name(NL_TYPE_BF16), "bf16") == 0);
    CHECK(nl_type_from_name("F16") == NL_TYPE_F16);
    CHECK(nl_type_from_name("Q8_0") == NL_TYPE_Q8_0);
    CHECK(nl_type_from_name("q4_K") == NL_TYPE_Q4_K);
    CHECK(nl_type_from_name("q8") == -1);
    CHECK(nl_type_from_name("q8_00") == -1);
    CHECK(nl_type_from_name("") == -1);
    CHECK(nl_type_from_name(NULL) == -1);

    int supported[] = {0, 1, 2, 3, 6, 8, 12, 14, 30};
    int n_sup = 0;
    for (int t = -2; t < 50; t++) {
        const nl_type_traits *tt = nl_type_get(t);
        if (!tt) continue;
        n_sup++;
        int ok = 0;
        for (int i = 0; i < 9; i++) ok |= supported[i] == t;
        CHECK(ok);
        CHECK(strcmp(tt->name, nl_type_name(t)) == 0);
        CHECK(tt->to_float != NULL);
    }
    CHECK(n_sup == 9);
    CHECK(nl_type_get(NL_TYPE_Q5_0)->from_float == NULL && strcmp(nl_type_get(NL_TYPE_Q5_0)->name, "q5_0") == 0);
    CHECK(nl_type_get(NL_TYPE_Q4_K)->from_float == NULL);
    CHECK(nl_type_get(NL_TYPE_Q6_K)->from_float == NULL);
    CHECK(nl_type_get(NL_TYPE_Q8_0)->from_float != NULL);
    CHECK(nl_type_get(NL_TYPE_Q4_1)->from_float != NULL && strcmp(nl_type_get(NL_TYPE_Q4_1)->name, "q4_1") == 0);

    /* one table: every id's row has its name; the GGUF reader sizes tensors by its layouts,
     * converted types and others (q5_k, mxfp4) alike; removed ids have no layout */
    for (int t = 0; t < NL_TYPE_COUNT; t++) {
        const nl_type_traits *ti = nl_type_info(t);
        CHECK(ti != NULL && strcmp(ti->name, nl_type_name(t)) == 0);
        int blck = -1;
        size_t bb = 0;
        const int known = nl_gguf_type_info(t, &blck, &bb) == 0;
        CHECK(known == (ti->blck > 0));
        if (known) CHECK(blck == ti->blck && bb == ti->bytes && bb > 0);
        CHECK((nl_type_get(t) != NULL) == (ti->to_float != NULL));
        if (nl_type_get(t)) CHECK(nl_type_get(t) == ti && known);
    }
    CHECK(nl_type_info(-1) == NULL && nl_type_info(NL_TYPE_COUNT) == NULL);
    CHECK(nl_type_info(13)->blck == 256 && nl_type_info(13)->bytes == 176 && nl_type_get(13) == NULL);
    CHECK(nl_type_info(39)->blck == 32 && nl_type_info(39)->bytes == 17);
    CHECK(nl_type_info(4)->blck == 0 && nl_gguf_type_info(4, NULL, NULL) == -1);

    /* llama.cpp's llama_ftype numbers (include/llama.h) */
    CHECK(nl_type_ftype(NL_TYPE_F32) == 0 && nl_type_ftype(NL_TYPE_F16) == 1 && nl_type_ftype(NL_TYPE_Q4_0) == 2);
    CHECK(nl_type_ftype(NL_TYPE_Q4_1) == 3 && nl_type_ftype(NL_TYPE_Q8_0) == 7 && nl_type_ftype(NL_TYPE_BF16) == 32);
    CHECK(nl_type_ftype(NL_TYPE_Q4_K) == 15 && nl_type_ftype(NL_TYPE_Q6_K) == 18);
    CHECK(nl_type_ftype(13) == -1 && nl_type_ftype(-1) == -1 && nl_type_ftype(NL_TYPE_COUNT) == -1);

    CHECK(nl_row_bytes(NL_TYPE_F32, 7) == 28);
    CHECK(nl_row_bytes(NL_TYPE_F16, 7) == 14);
    CHECK(nl_row_bytes(NL_TYPE_BF16, 3) == 6);
    CHECK(nl_row_bytes(NL_TYPE_Q8_0, 64) == 68);
    CHECK(nl_row_bytes(NL_TYPE_Q8_0, 33) == 0);
    CHECK(nl_row_bytes(NL_TYPE_Q4_0, 96) == 54);
    CHECK(nl_row_bytes(NL_TYPE_Q4_1, 96) == 60);
    CHECK(nl_row_bytes(NL_TYPE_Q4_1, 48) == 0);
    CHECK(nl_row_bytes(NL_TYPE_Q4_K, 512) == 288);
    CHECK(nl_row_bytes(NL_TYPE_Q6_K, 256) == 210);
    CHECK(nl_row_bytes(NL_TYPE_Q4_K, 32) == 0);
    CHECK(nl_row_bytes(13, 256) == 0); /* unsupported */
    CHECK(sizeof(nl_block_q8_0) == 34 && sizeof(nl_block_q4_0) == 18 && sizeof(nl_block_q4_1) == 20);
}

/* Nearest-even oracle by search: h is right iff no neighbour is closer (ties: even wins). */
static int f16_is_nearest(float f, uint16_t h) {
    double x = f, v = nl_f16_to_f32(h);
    if (isinf(v)) {
        /* overflow: |x| >= 65520 (the midpoint between 65504 and 2^16) */
        return fabs(x) >= 65520.0 && (signbit(v) != 0) == (signbit(x) != 0);
    }
    double e = fabs(x - v);
    for (int dlt = -1; dlt <= 1; dlt += 2) {
        int nb = (int)(h & 0x7fff) + dlt;
        if (nb < 0 || nb > 0x7bff) continue;
        double w = nl_f16_to_f32((uint16_t)((h & 0x8000) | nb));
        double en = fabs(x - w);
        if (en < e) return 0;
        if (en == e && (h & 1)) return 0;
    }
    return 1;
}

static void test_f16(void) {
    /* known halves -> floats */
    CHECK(nl_f16_to_f32(0x3c00) == 1.0f);
    CHECK(nl_f16_to_f32(0xc000) == -2.0f);
    CHECK(nl_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(nl_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(nl_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    CHECK(nl_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(nl_f16_to_f32(0x03ff) == 1023.0f * ldexpf(1.0f, -24));
    CHECK(nl_f16_to_f32(0x8001) == -ldexpf(1.0f, -24));
    CHECK(bits(nl_f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(nl_f16_to_f32(0x7c00) == INFINITY);
    CHECK(nl_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(nl_f16_to_f32(0x7e00)));
    CHECK(isnan(nl_f16_to_f32(0x7c01)));

    /* floats -> halves */
    CHECK(nl_f32_to_f16(1.0f) == 0x3c00);
    CHECK(nl_f32_to_f16(-2.0f) == 0xc000);
    CHECK(nl_f32_to_f16(0.0f) == 0x0000);
    CHECK(nl_f32_to_f16(-0.0f) == 0x8000);
    CHECK(nl_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(nl_f32_to_f16(65519.996f) == 0x7bff);
    CHECK(nl_f32_to_f16(65520.0f) == 0x7c00); /* tie between 65504 (odd) and 2^16 -> inf */
    CHECK(nl_f32_to_f16(1e6f) == 0x7c00);
    CHECK(nl_f32_to_f16(-1e30f) == 0xfc00);
    CHECK(nl_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(nl_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(nl_f32_to_f16(NAN) == 0x7e00 || nl_f32_to_f16(NAN) == 0xfe00);
    CHECK(nl_f32_to_f16(fbits(0x7fc00000u)) == 0x7e00);
    CHECK(nl_f32_to_f16(fbits(0x7f800001u)) == 0x7e00); /* signalling NaN is quieted */
    CHECK(nl_f32_to_f16(fbits(0x7fa00000u)) == 0x7f00); /* top payload bits kept */
    CHECK(nl_f32_to_f16(fbits(0xffc00000u)) == 0xfe00);
    /* ties to even in the normal range: 1 + 2^-11 lies halfway between 0x3c00 and 0x3c01 */
    CHECK(nl_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);
    CHECK(nl_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);
    CHECK(nl_f32_to_f16(fbits(bits(1.0f + ldexpf(1.0f, -11)) + 1)) == 0x3c01);
    CHECK(nl_f32_to_f16(fbits(bits(1.0f + ldexpf(1.0f, -11)) - 1)) == 0x3c00);
    /* 2047.5 ... carries into the exponent: 0x67ff = 2047, midpoint 2047.5 -> 2048 (even) */
    CHECK(nl_f32_to_f16(2047.5f) == 0x6800);
    /* subnormals (unit 2^-24) */
    float u = ldexpf(1.0f, -24);
    CHECK(nl_f32_to_f16(u) == 0x0001);
    CHECK(nl_f32_to_f16(0.5f * u) == 0x0000); /* tie -> even 0 */
    CHECK(nl_f32_to_f16(0.50001f * u) == 0x0001);
    CHECK(nl_f32_to_f16(1.5f * u) == 0x0002); /* tie -> even 2 */
    CHECK(nl_f32_to_f16(2.5f * u) == 0x0002); /* tie -> even 2 */
    CHECK(nl_f32_to_f16(3.5f * u) == 0x0004);
    CHECK(nl_f32_to_f16(-3.0f * u) == 0x8003);
    CHECK(nl_f32_to_f16(1023.0f * u) == 0x03ff);
    CHECK(nl_f32_to_f16(1023.5f * u) == 0x0400); /* tie -> rounds up into the normals */
    CHECK(nl_f32_to_f16(1022.5f * u) == 0x03fe);
    CHECK(nl_f32_to_f16(ldexpf(1.0f, -14)) == 0x0400);
    CHECK(nl_f32_to_f16(ldexpf(1.0f, -26)) == 0x0000);
    CHECK(nl_f32_to_f16(fbits(0x00000001u)) == 0x0000); /* f32 subnormal */
    CHECK(nl_f32_to_f16(-fbits(0x00000001u)) == 0x8000);

    /* every half (but NaN) survives half -> float -> half */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        if (nl_f32_to_f16(nl_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);

    /* random floats in the half range: the result is the nearest half, ties to even;
     * and matches the F16C instruction where the CPU has it */
    int bad_nearest = 0, bad_hw = 0, hw = 0;
#ifdef HAVE_HW_F16
    hw = __builtin_cpu_supports("f16c");
#endif
    nl_t_rng_state = 12345;
    for (int i = 0; i < 400000; i++) {
        uint32_t r = (uint32_t)((nl_t_rand() + 1.0) * 2147483647.0);
        /* exponents 90..160 cover zero-rounding, subnormals, normals and overflow */
        uint32_t e = 90 + (r % 71);
        uint32_t mant = (uint32_t)((nl_t_rand() + 1.0) * 4194303.5) & 0x7fffff;
        if (i % 4 == 0) mant &= ~0xfffu; /* many exact ties */
        uint32_t x = ((r >> 30) & 1u) << 31 | e << 23 | mant;
        float f = fbits(x);
        uint16_t h = nl_f32_to_f16(f);
        if (!f16_is_nearest(f, h)) bad_nearest++;
#ifdef HAVE_HW_F16
        if (hw && hw_f32_to_f16(f) != h) bad_hw++;
#endif
    }
    CHECKF(bad_nearest == 0, "%d conversions not nearest-even", bad_nearest);
    CHECKF(bad_hw == 0, "%d conversions differ from F16C", bad_hw);
    if (!hw) printf("note: no F16C on this CPU, hardware cross-check skipped\n");
}

static void test_bf16(void) {
    CHECK(nl_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(nl_bf16_to_f32(0x4049) == 3.140625f);
    CHECK(nl_bf16_to_f32(0xc000) == -2.0f);
    CHECK(nl_bf16_to_f32(0x7f80) == INFINITY);
    CHECK(nl_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(nl_f32_to_bf16(3.14159265f) == 0x4049);
    CHECK(nl_f32_to_bf16(fbits(0x3f808000u)) == 0x3f80); /* tie, lower even: stays */
    CHECK(nl_f32_to_bf16(fbits(0x3f818000u)) == 0x3f82); /* tie, lower odd: rounds up */
    CHECK(nl_f32_to_bf16(fbits(0x3f808001u)) == 0x3f81);
    CHECK(nl_f32_to_bf16(fbits(0x3f807fffu)) == 0x3f80);
    CHECK(nl_f32_to_bf16(fbits(0xbf818000u)) == 0xbf82);
    CHECK(nl_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(nl_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(nl_f32_to_bf16(fbits(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to inf */
    CHECK(nl_f32_to_bf16(fbits(0x7f800001u)) == 0x7fc0); /* sNaN quieted (bit 6 set) */
    CHECK(nl_f32_to_bf16(fbits(0x7fc00000u)) == 0x7fc0);
    CHECK(nl_f32_to_bf16(fbits(0xff812345u)) == 0xffc1);
    CHECK(nl_f32_to_bf16(fbits(0x00008000u)) == 0x0000); /* subnormal tie to even 0 */
    CHECK(nl_f32_to_bf16(fbits(0x00018000u)) == 0x0002);
    CHECK(nl_f32_to_bf16(-0.0f) == 0x8000);
}

/* Known bytes -> known floats through the traits table (to_float on whole rows). */
static void test_known_blocks(void) {
    float y[512];
    /* F32 / F16 / BF16 rows */
    {
        float x[3] = {1.5f, -0.25f, 1e-3f};
        nl_type_get(NL_TYPE_F32)->to_float(x, y, 3);
        CHECK(y[0] == 1.5f && y[1] == -0.25f && y[2] == 1e-3f);
        uint8_t h[6];
        put16(h, 0x3e00);
        put16(h + 2, 0xb400);
        put16(h + 4, 0x0003);
        nl_type_get(NL_TYPE_F16)->to_float(h, y, 3);
        CHECK(y[0] == 1.5f && y[1] == -0.25f && y[2] == 3 * ldexpf(1.0f, -24));
        put16(h, 0x3fc0);
        put16(h + 2, 0xbe80);
        put16(h + 4, 0x4120);
        nl_type_get(NL_TYPE_BF16)->to_float(h, y, 3);
        CHECK(y[0] == 1.5f && y[1] == -0.25f && y[2] == 10.0f);
        uint8_t o[6];
        float in[3] = {1.5f, -0.25f, 10.0f};
        nl_type_get(NL_TYPE_BF16)->from_float(in, o, 3);
        CHECK(memcmp(o, h, 6) == 0);
        nl_type_get(NL_TYPE_F16)->from_float(in, o, 3);
        CHECK(o[0] == 0x00 && o[1] == 0x3e && o[2] == 0x00 && o[3] == 0xb4 && o[4] == 0x00 && o[5] == 0x49);
    }
    /* Q8_0: two blocks, d = 0.5 and d = -3 */
    {
        uint8_t b[68];
        put16(b, 0x3800);
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
        put16(b + 34, 0xc200);
        for (int j = 0; j < 32; j++) b[36 + j] = (uint8_t)(int8_t)(127 - j);
        nl_type_get(NL_TYPE_Q8_0)->to_float(b, y, 64);
        int bad = 0;
        for (int j = 0; j < 32; j++) {
            bad += y[j] != (float)(j * 8 - 128) * 0.5f;
            bad += y[32 + j] != (float)(127 - j) * -3.0f;
        }
        CHECK(bad == 0);
        CHECK(y[0] == -64.0f && y[32] == -381.0f);
    }
    /* Q4_0: d = 2; qs[j] = j | (15-j)<<4 -> y[j] = (j-8)*2, y[j+16] = (7-j)*2 */
    {
        uint8_t b[18];
        put16(b, 0x4000);
        for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
        nl_type_get(NL_TYPE_Q4_0)->to_float(b, y, 32);
        int bad = 0;
        for (int j = 0; j < 16; j++) {
            bad += y[j] != (float)((j - 8) * 2);
            bad += y[j + 16] != (float)((7 - j) * 2);
        }
        CHECK(bad == 0);
        CHECK(y[0] == -16.0f && y[16] == 14.0f);
    }
    /* Q5_0 (ggml's dequantize_row_q5_0): d = -0.5; qs[j] = j | (15-j)<<4, qh = 0xA5A5F00F (the
     * fifth bits of elements 0-3, 12-15 for j < 16 and 16 + (0, 2, 5, 7, 8, 10, 13, 15)) ->
     * y[j] = ((j | 16·bit j) − 16)·d, y[j+16] = (((15−j) | 16·bit (j+16)) − 16)·d */
    {
        uint8_t b[22];
        put16(b, 0xb800);
        const uint32_t qh = 0xA5A5F00Fu;
        for (int i = 0; i < 4; i++) b[2 + i] = (uint8_t)(qh >> (8 * i));
        for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
        nl_type_get(NL_TYPE_Q5_0)->to_float(b, y, 32);
        int bad = 0;
        for (int j = 0; j < 16; j++) {
            bad += y[j] != (float)((j | (int)(((qh >> j) & 1) << 4)) - 16) * -0.5f;
            bad += y[j + 16] != (float)(((15 - j) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16) * -0.5f;
        }
        CHECKF(bad == 0, "q5_0: %d wrong", bad);
        CHECK(y[0] == -0.0f && y[4] == 6.0f && y[16] == -7.5f &&
              y[17] == 1.0f); /* (0|16)-16, 4-16, 15+16-16, (14|0)-16 */
    }
    /* Q4_1: two blocks. Block 0: d = 0.5, m = -3; qs[j] = j | (15-j)<<4 -> y[j] = 0.5j - 3,
     * y[j+16] = 0.5(15-j) - 3. Block 1: d = 0.25, m = 2 (a positive min); qs = 0xF0 -> 2, 5.75 */
    {
        uint8_t b[40];
        put16(b, 0x3800);
        put16(b + 2, 0xc200);
        for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
        put16(b + 20, 0x3400);
        put16(b + 22, 0x4000);
        for (int j = 0; j < 16; j++) b[24 + j] = 0xf0;
        nl_type_get(NL_TYPE_Q4_1)->to_float(b, y, 64);
        int bad = 0;
        for (int j = 0; j < 16; j++) {
            bad += y[j] != 0.5f * (float)j - 3.0f;
            bad += y[j + 16] != 0.5f * (float)(15 - j) - 3.0f;
            bad += y[32 + j] != 2.0f || y[48 + j] != 5.75f;
        }
        CHECKF(bad == 0, "q4_1: %d wrong", bad);
        CHECK(y[0] == -3.0f && y[16] == 4.5f && y[15] == 4.5f);
    }
    /* Q4_K: 8 sub-blocks with chosen 6-bit scales/mins (high bits exercised), packed here by
     * the layout rule; values y = d*sc*q - dmin*m with d = 0.5, dmin = 0.25. */
    {
        const int sc[8] = {1, 63, 17, 5, 33, 48, 2, 60};
        const int mn[8] = {0, 7, 63, 40, 19, 1, 56, 31};
        uint8_t b[144] = {0};
        put16(b, 0x3800);
        put16(b + 2, 0x3400);
        uint8_t *s = b + 4, *qs = b + 16;
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
            s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
        }
        int q[256];
        for (int e = 0; e < 256; e++) {
            q[e] = (e * 7 + 3) % 16;
            int chunk = e / 64, r = e % 64;
            uint8_t *p = &qs[chunk * 32 + r % 32];
            *p |= (uint8_t)(r < 32 ? q[e] : q[e] << 4);
        }
        nl_type_get(NL_TYPE_Q4_K)->to_float(b, y, 256);
        int bad = 0;
        for (int e = 0; e < 256; e++) {
            int sb = e / 32;
            float want = (0.5f * (float)sc[sb]) * (float)q[e] - 0.25f * (float)mn[sb];
            bad += y[e] != want;
        }
        CHECKF(bad == 0, "q4_k: %d wrong", bad);
        CHECK(y[0] == 0.5f * 3);                       /* sc 1, m 0, q 3 */
        CHECK(y[32] == 0.5f * 63 * q[32] - 0.25f * 7); /* second sub-block */
    }
    /* Q6_K: 16 signed scales, d = 0.25; element e -> (half, quarter, lane) by the layout */
    {
        uint8_t b[210] = {0};
        uint8_t *ql = b, *qh = b + 128;
        int8_t *scl = (int8_t *)(b + 192);
        for (int i = 0; i < 16; i++) scl[i] = (int8_t)(i * 9 - 70);
        put16(b + 208, 0x3400);
        int q[256];
        for (int e = 0; e < 256; e++) {
            q[e] = (e * 37 + 11) % 64; /* 6-bit code; value is code-32 */
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            int lo = q[e] & 15, hi = q[e] >> 4;
            uint8_t *p = &ql[64 * h + l + (g & 1) * 32];
            *p |= (uint8_t)(g < 2 ? lo : lo << 4);
            qh[32 * h + l] |= (uint8_t)(hi << (2 * g));
        }
        nl_type_get(NL_TYPE_Q6_K)->to_float(b, y, 256);
        int bad = 0;
        for (int e = 0; e < 256; e++) {
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            int si = 8 * h + l / 16 + 2 * g;
            float want = 0.25f * (float)scl[si] * (float)(q[e] - 32);
            bad += y[e] != want;
        }
        CHECKF(bad == 0, "q6_k: %d wrong", bad);
        CHECK(y[0] == 0.25f * -70 * (11 - 32));
    }
}

/* Reference quantizers, byte by byte on crafted inputs. */
static void test_quantizers(void) {
    /* Q8_0 block 0: amax 127 -> d = 1 exactly; ties round away from zero (roundf).
     * block 1: all zero -> d = 0, q = 0.  block 2: amax 254 -> d = 2. */
    float x[96] = {0};
    x[0] = 127;
    x[1] = -127;
    x[2] = 63.5f;
    x[3] = -63.5f;
    x[4] = 0.49f;
    x[5] = 0.5f;
    x[6] = -0.5f;
    x[7] = 100.2f;
    x[8] = -1.5f;
    x[64] = 254;
    x[65] = 3;
    x[66] = -3;
    x[67] = 1;
    x[68] = -253;
    x[69] = 0.99f;
    uint8_t b[3 * 34];
    memset(b, 0xAA, sizeof b);
    nl_type_get(NL_TYPE_Q8_0)->from_float(x, b, 96);
    const int8_t want0[9] = {127, -127, 64, -64, 0, 1, -1, 100, -2};
    CHECK(b[0] == 0x00 && b[1] == 0x3c);
    for (int j = 0; j < 9; j++) CHECKF((int8_t)b[2 + j] == want0[j], "j=%d got %d", j, (int8_t)b[2 + j]);
    int z = 0;
    for (int j = 9; j < 32; j++) z += b[2 + j] != 0;
    CHECK(z == 0);
    CHECK(b[34] == 0 && b[35] == 0);
    z = 0;
    for (int j = 0; j < 32; j++) z += b[36 + j] != 0;
    CHECK(z == 0);
    CHECK(b[68] == 0x00 && b[69] == 0x40); /* d = 2 */
    const int8_t want2[6] = {127, 2, -2, 1, -127, 0};
    for (int j = 0; j < 6; j++) CHECKF((int8_t)b[70 + j] == want2[j], "j=%d got %d", j, (int8_t)b[70 + j]);
    /* d not representable: amax = 1 -> d = 1/127 stored as f16 0x2008 (nearest) */
    {
        float v[32] = {1.0f, 0.5f, -0.25f};
        uint8_t q[34];
        nl_type_get(NL_TYPE_Q8_0)->from_float(v, q, 32);
        CHECK(q[0] == (nl_f32_to_f16(1.0f / 127.0f) & 0xff) && q[1] == (nl_f32_to_f16(1.0f / 127.0f) >> 8));
        CHECK(nl_f32_to_f16(1.0f / 127.0f) == 0x2008);
        CHECK((int8_t)q[2] == 127 && (int8_t)q[3] == 64 && (int8_t)q[4] == -32);
    }

    /* Q4_0 block 0: |max| 16 twice: -16 at index 5 comes first -> max = -16, d = 2, id = 0.5.
     * q = MIN(15, (int8)(v*0.5 + 8.5)). block 1: max +8 -> d = -1. */
    float y[64] = {0};
    y[5] = -16;
    y[9] = 16;
    y[1] = 1;
    y[2] = -1;
    y[3] = 3;
    y[4] = 2.9f;
    y[17] = -15;
    y[20] = 7;
    y[32] = 8;
    y[33] = -8;
    y[34] = 1;
    y[35] = -1;
    y[50] = 0.4f;
    uint8_t c[36];
    nl_type_get(NL_TYPE_Q4_0)->from_float(y, c, 64);
    CHECK(c[0] == 0x00 && c[1] == 0x40);   /* d = 2 */
    CHECK(c[18] == 0x00 && c[19] == 0xbc); /* d = -1 */
    int q0[32], q1[32];
    for (int j = 0; j < 32; j++) q0[j] = q1[j] = 8; /* zeros map to 8 */
    q0[5] = 0;
    q0[9] = 15;
    q0[1] = 9;
    q0[2] = 8;
    q0[3] = 10;
    q0[4] = 9;
    q0[17] = 1;
    q0[20] = 12;
    q1[0] = 0;
    q1[1] = 15;
    q1[2] = 7;
    q1[3] = 9;
    q1[18] = 8;
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        bad += c[2 + j] != (uint8_t)(q0[j] | (q0[j + 16] << 4));
        bad += c[20 + j] != (uint8_t)(q1[j] | (q1[j + 16] << 4));
    }
    CHECKF(bad == 0, "q4_0 quantizer: %d bytes differ", bad);
    /* all-zero block: d = -0, every code 8 */
    {
        float zz[32] = {0};
        uint8_t q[18];
        nl_type_get(NL_TYPE_Q4_0)->from_float(zz, q, 32);
        CHECK(q[0] == 0x00 && q[1] == 0x80); /* d = 0/-8 = -0.0, as the reference stores it */
        int nb = 0;
        for (int j = 0; j < 16; j++) nb += q[2 + j] != 0x88;
        CHECK(nb == 0);
    }
}

/* Q4_1 reference quantizer, byte by byte: block 0 spans [-3, 4.5] -> d = 0.5 (f16 0x3800),
 * m = -3 (0xc200), q = MIN(15, (int8)((v+3)*2 + 0.5)): half steps round up, the max maps to 15.
 * Block 1 is constant 2.5: d = 0, id = 0, every q 0, m = 2.5 (0x4100). Block 2 spans
 * [1, 2]: d = 1/15 is not an f16 (stored rounded: 0x2c44), q uses the unrounded id = 15. */
static void test_q4_1_quantizer(void) {
    float x[96];
    for (int j = 0; j < 32; j++) x[j] = -3.0f + 0.25f * (float)(j % 31); /* -3 .. 4.5 */
    x[5] = -3.0f;
    x[6] = 4.5f;
    x[7] = 0.1f;
    x[8] = -2.76f;
    for (int j = 0; j < 32; j++) x[32 + j] = 2.5f;
    for (int j = 0; j < 32; j++) x[64 + j] = 1.0f + (float)j / 31.0f;
    uint8_t b[60];
    memset(b, 0xAA, sizeof b);
    nl_type_get(NL_TYPE_Q4_1)->from_float(x, b, 96);
    CHECK(b[0] == 0x00 && b[1] == 0x38 && b[2] == 0x00 && b[3] == 0xc2);
    int q[96];
    for (int j = 0; j < 32; j++) {
        int v = (int)((x[j] + 3.0f) * 2.0f + 0.5f);
        q[j] = v > 15 ? 15 : v;
    }
    CHECK(q[5] == 0 && q[6] == 15 && q[7] == 6 && q[8] == 0 && q[2] == 1); /* 0.5 rounds up to 1 */
    for (int j = 0; j < 32; j++) q[32 + j] = 0;
    const float id2 = 1.0f / ((2.0f - 1.0f) / 15.0f);
    for (int j = 0; j < 32; j++) {
        int v = (int)((x[64 + j] - 1.0f) * id2 + 0.5f);
        q[64 + j] = v > 15 ? 15 : v;
    }
    CHECK(q[64] == 0 && q[95] == 15);
    CHECK(b[20] == 0 && b[21] == 0 && b[22] == 0x00 && b[23] == 0x41);
    CHECK(nl_f32_to_f16(1.0f / 15.0f) == 0x2c44 && b[40] == 0x44 && b[41] == 0x2c && b[42] == 0x00 && b[43] == 0x3c);
    int bad = 0;
    for (int blk = 0; blk < 3; blk++)
        for (int j = 0; j < 16; j++)
            bad += b[blk * 20 + 4 + j] != (uint8_t)(q[blk * 32 + j] | (q[blk * 32 + j + 16] << 4));
    CHECKF(bad == 0, "q4_1 quantizer: %d bytes differ", bad);
}

/* Random rows: quantize -> dequantize error stays inside the format's bound. */
static void test_round_trips(void) {
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t buf[N * 4];
    nl_t_rng_state = 777;
    for (int i = 0; i < N; i++) x[i] = (float)(nl_t_rand() * (1.0 + 10.0 * (i % 7)));
    for (int i = 0; i < 64; i += 9) x[i * 32 + 3] = 0; /* a few zeros */

    const nl_type_traits *tt = nl_type_get(NL_TYPE_F32);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    CHECK(memcmp(x, y, sizeof x) == 0);

    int bad = 0;
    tt = nl_type_get(NL_TYPE_F16);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    for (int i = 0; i < N; i++) bad += fabsf(x[i] - y[i]) > fabsf(x[i]) * 0x1p-11f + 0x1p-25f;
    CHECKF(bad == 0, "f16: %d", bad);

    bad = 0;
    tt = nl_type_get(NL_TYPE_BF16);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    for (int i = 0; i < N; i++) bad += fabsf(x[i] - y[i]) > fabsf(x[i]) * 0x1p-8f;
    CHECKF(bad == 0, "bf16: %d", bad);

    /* Q8_0: |err| <= d/2 plus the f16 rounding of d (relative 2^-11, times |q| <= 127) */
    bad = 0;
    tt = nl_type_get(NL_TYPE_Q8_0);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    double sq_err = 0, sq = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 127;
        for (int j = 0; j < 32; j++) {
            float e = fabsf(x[b * 32 + j] - y[b * 32 + j]);
            bad += e > 0.5f * d + amax * 0x1p-11f + 1e-30f;
            sq_err += (double)e * e;
            sq += (double)x[b * 32 + j] * x[b * 32 + j];
        }
    }
    CHECKF(bad == 0, "q8_0: %d", bad);
    CHECKF(sqrt(sq_err / sq) < 0.01, "q8_0 rel err %g", sqrt(sq_err / sq));

    /* Q4_0: |err| <= |d| (the one clamp at 15 costs a full step) plus the f16 rounding */
    bad = 0;
    tt = nl_type_get(NL_TYPE_Q4_0);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    sq_err = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 8;
        for (int j = 0; j < 32; j++) {
            float e = fabsf(x[b * 32 + j] - y[b * 32 + j]);
            bad += e > d + amax * 0x1p-9f + 1e-30f;
            sq_err += (double)e * e;
        }
    }
    CHECKF(bad == 0, "q4_0: %d", bad);
    CHECKF(sqrt(sq_err / sq) < 0.12, "q4_0 rel err %g", sqrt(sq_err / sq));
    /* the element of largest |v| maps to code 0 and comes back up to the f16 rounding of d */
    bad = 0;
    for (int b = 0; b < N / 32; b++) {
        int jm = 0;
        for (int j = 1; j < 32; j++)
            if (fabsf(x[b * 32 + j]) > fabsf(x[b * 32 + jm])) jm = j;
        bad += fabsf(y[b * 32 + jm] - x[b * 32 + jm]) > fabsf(x[b * 32 + jm]) * 0x1p-10f;
    }
    CHECKF(bad == 0, "q4_0 max element: %d", bad);

    /* Q4_1: |err| <= d/2 (nearest code; d = (max-min)/15) plus the f16 roundings of d and min;
     * the block's min comes back exactly up to the f16 rounding of min */
    bad = 0;
    int bad_min = 0;
    tt = nl_type_get(NL_TYPE_Q4_1);
    tt->from_float(x, buf, N);
    tt->to_float(buf, y, N);
    sq_err = 0;
    for (int b = 0; b < N / 32; b++) {
        float mn = x[b * 32], mx = x[b * 32];
        for (int j = 1; j < 32; j++) mn = fminf(mn, x[b * 32 + j]), mx = fmaxf(mx, x[b * 32 + j]);
        const float d = (mx - mn) / 15, amax = fmaxf(fabsf(mn), fabsf(mx));
        for (int j = 0; j < 32; j++) {
            float e = fabsf(x[b * 32 + j] - y[b * 32 + j]);
            bad += e > 0.5f * d + amax * 0x1p-9f + 1e-30f;
            sq_err += (double)e * e;
            if (x[b * 32 + j] == mn) bad_min += fabsf(y[b * 32 + j] - mn) > fabsf(mn) * 0x1p-11f;
        }
    }
    CHECKF(bad == 0, "q4_1: %d", bad);
    CHECKF(bad_min == 0, "q4_1 min element: %d", bad_min);
    CHECKF(sqrt(sq_err / sq) < 0.1, "q4_1 rel err %g", sqrt(sq_err / sq));
}

/* nl_type_first_nonfinite reads exponents and block scales only; the oracle decodes every
 * element with to_float and looks. Clean buffers (random values, finite scales) give -1; a
 * poisoned element or scale (Inf, -Inf, a NaN) gives the oracle's first index, with one or
 * two poisoned places, for every type that has to_float. */
static void test_nonfinite(void) {
    /* byte offsets of the f16 scales in a block (the test's own statement of the layouts) */
    static const struct {
        int type, n_off, off[2];
    } blocks[] = {
        {NL_TYPE_Q4_0, 1, {0}}, {NL_TYPE_Q4_1, 2, {0, 2}}, {NL_TYPE_Q5_0, 1, {0}},
        {NL_TYPE_Q8_0, 1, {0}}, {NL_TYPE_Q4_K, 2, {0, 2}}, {NL_TYPE_Q6_K, 1, {208}},
    };
    static const uint16_t bad16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff},
                          badbf[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81};
    static const uint32_t bad32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu};
    enum { N = 4096 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *buf = malloc(N * 4), *clean = malloc(N * 4);
    int types_seen = 0;
    for (int type = 0; type < NL_TYPE_COUNT; type++) {
        const nl_type_traits *tt = nl_type_get(type);
        if (!tt) continue;
        types_seen++;
        CHECKF(tt->first_nonfinite != NULL, "%s: to_float without first_nonfinite", tt->name);
        if (!tt->first_nonfinite) continue;
        int bi = -1;
        for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++)
            if (blocks[b].type == type) bi = (int)b;
        CHECKF(tt->blck == 1 || bi >= 0, "%s: no scale layout in the test", tt->name);
        if (tt->blck > 1 && bi < 0) continue;
        const int64_t nb = N / tt->blck;
        const size_t nbytes = (size_t)nb * tt->bytes;
        for (int i = 0; i < N; i++) x[i] = (float)(2 * nl_t_rand());
        if (tt->from_float) {
            tt->from_float(x, clean, N);
        } else {
            for (size_t i = 0; i < nbytes; i++) clean[i] = (uint8_t)((nl_t_rand() + 1) * 128);
            for (int64_t k = 0; k < nb; k++)
                for (int o = 0; o < blocks[bi].n_off; o++)
                    put16(clean + k * tt->bytes + blocks[bi].off[o], nl_f32_to_f16((float)(nl_t_rand() * 0.1)));
        }
        tt->to_float(clean, y, N);
        int all = 1;
        for (int i = 0; i < N; i++) all &= isfinite(y[i]) != 0;
        CHECKF(all && nl_type_first_nonfinite(type, clean, N) == -1, "%s: a clean buffer", tt->name);
        for (int trial = 0; trial < 40; trial++) {
            memcpy(buf, clean, nbytes);
            int places = 1 + trial % 2;
            for (int k = 0; k < places; k++) {
                int64_t j = (int64_t)((nl_t_rand() + 1) * 0.5 * (double)(tt->blck == 1 ? N : nb));
                if (trial < 3) j = trial == 0 ? 0 : (tt->blck == 1 ? N : nb) - 1; /* the ends */
                if (type == NL_TYPE_F32) {
                    uint32_t v = bad32[trial % 5];
                    memcpy(buf + 4 * j, &v, 4);
                } else if (tt->blck == 1) {
                    put16(buf + 2 * j, type == NL_TYPE_BF16 ? badbf[trial % 4] : bad16[trial % 5]);
                } else {
                    put16(buf + j * tt->bytes + blocks[bi].off[trial % blocks[bi].n_off], bad16[trial % 5]);
                }
            }
            tt->to_float(buf, y, N);
            int64_t want = -1;
            for (int i = 0; i < N && want < 0; i++)
                if (!isfinite(y[i])) want = i;
            int64_t got = nl_type_first_nonfinite(type, buf, N);
            CHECKF(want >= 0 && got == want, "%s trial %d: first non-finite %lld, decoded %lld", tt->name, trial,
                   (long long)got, (long long)want);
        }
    }
    CHECK(types_seen >= 8);
    CHECK(nl_type_first_nonfinite(13 /* q5_k: no to_float */, clean, 256) == -1);
    free(x);
    free(y);
    free(buf);
    free(clean);
}

int main(void) {
    test_names();
    test_f16();
    test_bf16();
    test_known_blocks();
    test_quantizers();
    test_q4_1_quantizer();
    test_round_trips();
    test_nonfinite();
    return nl_t_done();
}

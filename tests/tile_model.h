/* The plain C model of the tile product (TDPBF16PS as the SDM's pseudo-code describes it, the
 * contract of the emulator in cpu/amx_emu.c), shared by the tests of the tile kernels
 * (test_amx: the service's projections; test_nn_tiles, test_nn_attention, test_nn_lora: the
 * nodes' products). BF16 inputs rounded to nearest even from FP32, denormal inputs read as
 * zero, every FP32 sum of one product rounded to nearest even and flushed to zero when denormal. */
#ifndef NL_TESTS_TILE_MODEL_H
#define NL_TESTS_TILE_MODEL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t m_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
/* as the nodes' packers round (cpu/tiles.h, vcvtne2ps2bf16): a denormal reads as zero, a NaN is
 * quieted */
static inline uint16_t m_bf16_daz(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7f800000u)) return (uint16_t)(u >> 16 & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return m_bf16(f);
}
static inline float m_raw(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float m_in(uint16_t h) { /* DAZ */
    return ((h >> 7) & 0xff) == 0 ? (h & 0x8000 ? -0.0f : 0.0f) : m_raw(h);
}
static inline float m_ftz(float f) { return f != 0.0f && fabsf(f) < 1.17549435e-38f ? (signbit(f) ? -0.0f : 0.0f) : f; }
static inline float m_step(float c, uint16_t a, uint16_t b) { return m_ftz(c + m_in(a) * m_in(b)); }

/* C[M][N] (ldc) (=|+=) A·B as the nodes' tile GEMM computes it (cpu/tiles.h): the FP32 inputs
 * rounded by m_bf16_daz, one chain per element over k = 0 .. up32(K) − 1 (zeros past K),
 * A[m][k] = a[m·ras + k·cas], B[k][n] = b[k·rbs + n·cbs]. */
static inline void m_gemm(float *C, int64_t ldc, const float *a, int64_t ras, int64_t cas, const float *b, int64_t rbs,
                          int64_t cbs, int M, int N, int K, int accumulate) {
    const int Kp = (K + 31) / 32 * 32;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float c = accumulate ? C[(int64_t)m * ldc + n] : 0.0f;
            if (K > 0)
                for (int k = 0; k < Kp; k++) {
                    const float av = k < K ? a[m * ras + k * cas] : 0.0f, bv = k < K ? b[k * rbs + n * cbs] : 0.0f;
                    c = m_step(c, m_bf16_daz(av), m_bf16_daz(bv));
                }
            C[(int64_t)m * ldc + n] = c;
        }
}

#endif

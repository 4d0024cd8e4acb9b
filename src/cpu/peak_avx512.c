/* cpu/peak_avx512: the AVX-512 register-only loops (contract: peak_loops.h) */
#include <immintrin.h>

#include "cpu/peak_loops.h"

double nl_peak_fp32_avx512(long it) {
    __m512 a[12], x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = _mm512_fmadd_ps(x, y, a[k]);
        NL_PEAK_ACC12(F)
#undef F
        NL_PEAK_KEEP(x, y);
    }
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 16 * 2;
}

double nl_peak_bf16_avx512(long it) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    for (long i = 0; i < it; i++) {
#define B(k) a[k] = _mm512_dpbf16_ps(a[k], x, y);
        NL_PEAK_ACC12(B)
#undef B
        NL_PEAK_KEEP(x, y);
    }
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 32 * 2;
}

/* cpu/peak_avx2: the AVX2 register-only loop (contract: peak_loops.h) */
#include <immintrin.h>

#include "cpu/peak_loops.h"

double nl_peak_fp32_avx2(long it) {
    __m256 a[12], x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_ps();
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = _mm256_fmadd_ps(x, y, a[k]);
        NL_PEAK_ACC12(F)
#undef F
        NL_PEAK_KEEP(x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 8 * 2;
}

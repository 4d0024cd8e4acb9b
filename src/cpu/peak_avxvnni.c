/* cpu/peak_avxvnni: the AVX-VNNI (VEX-encoded, 256-bit) register-only loop (contract:
 * peak_loops.h) */
#include <immintrin.h>

#include "cpu/peak_loops.h"

double nl_peak_int8_avxvnni(long it) {
    __m256i a[12], x = _mm256_set1_epi8(1), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_si256();
    for (long i = 0; i < it; i++) {
#define I(k) a[k] = _mm256_dpbusd_avx_epi32(a[k], x, y);
        NL_PEAK_ACC12(I)
#undef I
        NL_PEAK_KEEP(x, y);
    }
    __m256i s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_epi32(s, a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 32 * 2;
}

/* cpu/peak_avx512vnni: the AVX512_VNNI register-only loop (contract: peak_loops.h) */
#include <immintrin.h>

#include "cpu/peak_loops.h"

double nl_peak_int8_avx512vnni(long it) {
    __m512i a[12], x = _mm512_set1_epi8(1), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_si512();
    for (long i = 0; i < it; i++) {
#define I(k) a[k] = _mm512_dpbusd_epi32(a[k], x, y);
        NL_PEAK_ACC12(I)
#undef I
        NL_PEAK_KEEP(x, y);
    }
    int s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    __asm__ volatile("" ::"r"(s));
    return (double)it * 12 * 64 * 2;
}

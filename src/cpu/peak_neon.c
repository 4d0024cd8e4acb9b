/* cpu/peak_neon: the Advanced SIMD register-only loop (contract: peak_loops.h) */
#include <arm_neon.h>

#include "cpu/peak_loops.h"

double nl_peak_fp32_neon(long it) {
    float32x4_t a[12], x = vdupq_n_f32(1e-9f), y = vdupq_n_f32(1.0f);
    for (int i = 0; i < 12; i++) a[i] = vdupq_n_f32(0.0f);
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = vfmaq_f32(a[k], x, y);
        NL_PEAK_ACC12(F)
#undef F
        NL_PEAK_KEEP(x, y);
    }
    float32x4_t s = a[0];
    for (int i = 1; i < 12; i++) s = vaddq_f32(s, a[i]);
    __asm__ volatile("" ::"w"(s));
    return (double)it * 12 * 4 * 2;
}

/* tests/arm_bf16: a plain C model of the Arm ARM's BF16 arithmetic with FPCR.EBF = 0 (FEAT_BF16
 * without FEAT_EBF16), shared by test_neonbf16 (BFMMLA, BFDOT) and test_amx (SME's BFMOPA):
 * BFDotAdd(sum, (a0, a1), (b0, b1)) = BFRound(sum + BFRound(BFRound(a0·b0) + BFRound(a1·b1))),
 * BFRound rounding to odd (truncate; set the last fraction bit if anything was dropped), results
 * below 2⁻¹²⁶ flushed to a zero of their sign, overflow to infinity; BF16 and FP32 inputs below
 * the normal range read as zero; FPCR's rounding mode and FZ ignored. The rounding is done with
 * the C library's FE_TOWARDZERO and FE_INEXACT (restored after each operation). */
#ifndef NL_TEST_ARM_BF16_H
#define NL_TEST_ARM_BF16_H
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float bf16f(uint16_t h) { return bitsf((uint32_t)h << 16); }

/* an FP32 input below the normal range reads as a zero of its sign */
static inline float ftz(float f) { return fabsf(f) < FLT_MIN ? copysignf(0.0f, f) : f; }

/* BFRound of the exact a + b (or a · b): round to odd, flush, overflow to infinity */
static inline float bf_round_op(float a, float b, int mul) {
    fenv_t env;
    feholdexcept(&env);
    fesetround(FE_TOWARDZERO);
    volatile float va = a, vb = b;
    volatile float r = mul ? va * vb : va + vb;
    const int inexact = fetestexcept(FE_INEXACT) != 0, over = fetestexcept(FE_OVERFLOW) != 0;
    fesetenv(&env);
    float v = r;
    if (isnan(v)) return bitsf(0x7fc00000u); /* the default NaN */
    if (over) return copysignf(INFINITY, v);
    if (fabsf(v) < FLT_MIN) return copysignf(0.0f, v);
    if (inexact && !isinf(v)) v = bitsf(fbits(v) | 1u);
    return v;
}

/* BFDotAdd(sum, (e1.lo, e1.hi), (e2.lo, e2.hi)), FPCR.EBF = 0 */
static inline float bfdotadd(float sum, uint32_t e1, uint32_t e2) {
    const float a0 = ftz(bf16f((uint16_t)e1)), a1 = ftz(bf16f((uint16_t)(e1 >> 16)));
    const float b0 = ftz(bf16f((uint16_t)e2)), b1 = ftz(bf16f((uint16_t)(e2 >> 16)));
    const float p0 = bf_round_op(a0, b0, 1), p1 = bf_round_op(a1, b1, 1);
    return bf_round_op(ftz(sum), bf_round_op(p0, p1, 0), 0);
}

#endif

/* cpu/fexp_neon.h: cpu/vecmath.h's nl_fexp and nl_fsigmoid on 4 NEON lanes, the scalar forms'
 * operations in their order (its rounding trick, the Horner steps, the integer exponent and masks,
 * then the IEEE division), so every lane gives the scalar bits. For the NEON files of cpu/ only
 * (gdn_neon.c, vec_neon.c), which include <arm_neon.h> first. */
#ifndef NL_CPU_FEXP_NEON_H
#define NL_CPU_FEXP_NEON_H

/* nl_fexp(x), 4 lanes: its operations in its order */
__attribute__((always_inline)) static inline float32x4_t v_fexp(float32x4_t x) {
    const float32x4_t big = vdupq_n_f32(12582912.0f);
    const float32x4_t t = vaddq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)), big);
    const float32x4_t n = vsubq_f32(t, big);
    float32x4_t r = vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(0.693145751953125f)));
    r = vsubq_f32(r, vmulq_f32(n, vdupq_n_f32(1.42860682030941723e-06f)));
    float32x4_t p = vdupq_n_f32(1.98756915e-4f);
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.39819337e-3f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(8.33345205e-3f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(4.16657962e-2f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.66666657e-1f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(5.0e-1f));
    p = vaddq_f32(vaddq_f32(vmulq_f32(vmulq_f32(p, r), r), r), vdupq_n_f32(1.0f));
    const int32x4_t tb = vreinterpretq_s32_f32(t);
    const int32x4_t e =
        vaddq_s32(vsubq_s32(vandq_s32(tb, vdupq_n_s32(0x7FFFFFFF)), vdupq_n_s32(0x4B400000)), vdupq_n_s32(127));
    const int32x4_t neg = vshrq_n_s32(tb, 31);
    /* lo = ~((e - 1) >> 31) & ~neg, hi = ((e - 255) >> 31) | neg */
    const int32x4_t lo = vbicq_s32(vmvnq_s32(vshrq_n_s32(vsubq_s32(e, vdupq_n_s32(1)), 31)), neg);
    const int32x4_t hi = vorrq_s32(vshrq_n_s32(vsubq_s32(e, vdupq_n_s32(255)), 31), neg);
    const int32x4_t eb = vshlq_n_s32(vandq_s32(vandq_s32(e, lo), hi), 23);
    const int32x4_t yb = vreinterpretq_s32_f32(vmulq_f32(p, vreinterpretq_f32_s32(eb)));
    return vreinterpretq_f32_s32(vorrq_s32(vandq_s32(vandq_s32(yb, lo), hi), vbicq_s32(vdupq_n_s32(0x7F800000), hi)));
}

/* nl_fsigmoid(x) = 1 / (1 + nl_fexp(-x)), 4 lanes */
__attribute__((always_inline)) static inline float32x4_t v_fsigmoid(float32x4_t x) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    return vdivq_f32(one, vaddq_f32(one, v_fexp(vnegq_f32(x))));
}

#endif

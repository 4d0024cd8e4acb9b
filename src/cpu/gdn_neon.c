/* cpu/gdn_neon: the GDN node's kernels on AArch64 Advanced SIMD (nn/gdn.c's contracts: the same
 * bits as its portable forms): the state step on 32 columns (8 q registers each of p, o and u),
 * SiLU and its derivative 4 lanes at a time, the chunk products in register blocks of 3 or 1
 * rows × 16, 8 or 4 columns, the 8×8 transposes as four 4×4 TRN1/TRN2 ones. The neon and
 * neonbf16 rows' gdn_* entries; built only on aarch64 (the file's name), baseline flags.
 *
 * The same operations in the same order as the portable forms, as cpu/gdn_simd.h's AVX bodies:
 * every product is rounded before its add (FMUL then FADD, never FMLA: gcc at -std=c11 contracts
 * nothing, so the portable forms compile to separate multiplies and adds on aarch64 too, and these
 * bodies call no fused intrinsic), each state column and each product element on its own chain. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/fexp_neon.h"
#include "cpu/kernels.h"

#define AI __attribute__((always_inline)) static inline
#define SV 8 /* q vectors of state columns a step: 32 columns */

/* step_c on 32 columns: p (then o) and u in registers instead of nn/gdn.c's p[]/o[] rows, the
 * same arithmetic per column: x = α·S_prev; p += k·x; r = v − p; u = β·r; x = S + k·u; o += q·x;
 * o·scale. */
void nl_gdn_step32_neon(float *S, const float *S_prev, size_t ld, const float *k, const float *v, const float *q,
                        float alpha, float beta, float scale, int dk, float *restrict u, float *r_out,
                        float *restrict o) {
    const float32x4_t va = vdupq_n_f32(alpha);
    float32x4_t p[SV], uu[SV], oo[SV];
#pragma GCC unroll 8
    for (int j = 0; j < SV; j++) p[j] = vdupq_n_f32(0.0f);
    for (int i = 0; i < dk; i++) {
        const float *sp = S_prev + (size_t)i * ld;
        float *sd = S + (size_t)i * ld;
        const float32x4_t kk = vdupq_n_f32(k[i]);
#pragma GCC unroll 8
        for (int j = 0; j < SV; j++) {
            const float32x4_t x = vmulq_f32(va, vld1q_f32(sp + 4 * j));
            vst1q_f32(sd + 4 * j, x);
            p[j] = vaddq_f32(p[j], vmulq_f32(kk, x));
        }
    }
    const float32x4_t vb = vdupq_n_f32(beta);
#pragma GCC unroll 8
    for (int j = 0; j < SV; j++) {
        const float32x4_t r = vsubq_f32(vld1q_f32(v + 4 * j), p[j]);
        if (r_out) vst1q_f32(r_out + 4 * j, r);
        uu[j] = vmulq_f32(vb, r);
        vst1q_f32(u + 4 * j, uu[j]);
        oo[j] = vdupq_n_f32(0.0f);
    }
    for (int i = 0; i < dk; i++) {
        float *sd = S + (size_t)i * ld;
        const float32x4_t kk = vdupq_n_f32(k[i]), qq = vdupq_n_f32(q[i]);
#pragma GCC unroll 8
        for (int j = 0; j < SV; j++) {
            const float32x4_t x = vaddq_f32(vld1q_f32(sd + 4 * j), vmulq_f32(kk, uu[j]));
            vst1q_f32(sd + 4 * j, x);
            oo[j] = vaddq_f32(oo[j], vmulq_f32(qq, x));
        }
    }
    const float32x4_t vs = vdupq_n_f32(scale);
#pragma GCC unroll 8
    for (int j = 0; j < SV; j++) vst1q_f32(o + 4 * j, vmulq_f32(oo[j], vs));
}

/* y = x·σ(x), d = σ(x)·(1 + x·(1 − σ(x))) with σ = cpu/vecmath.h's nl_fsigmoid: nl_fexp(−x)'s
 * operations lane by lane (its rounding trick, the Horner steps in its order, the integer exponent
 * and masks), then the IEEE division, as gdn_simd.h's GDN_SILU. Returns the elements done (whole
 * vectors); the node does the rest. */
int nl_gdn_silu_d_neon(float *y, float *d, const float *x, int n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t xv = vld1q_f32(x + i);
        const float32x4_t sg = v_fsigmoid(xv);
        vst1q_f32(y + i, vmulq_f32(xv, sg));
        vst1q_f32(d + i, vmulq_f32(sg, vaddq_f32(one, vmulq_f32(xv, vsubq_f32(one, sg)))));
    }
    return i;
}

/* R rows × NV vectors of C: each element from 0 or from C, then + a·b for l ascending (FMUL by
 * element, then FADD): mm_c's row_axpy chain. Constant R and NV keep c[][] in registers. */
AI void mm_blk(const int R, const int NV, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb,
               float *Cm, size_t ldc, int acc) {
    float32x4_t c[3][4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) c[i][j] = acc ? vld1q_f32(Cm + (size_t)i * ldc + 4 * j) : vdupq_n_f32(0.0f);
    for (int l = 0; l < Kd; l++) {
        const float *b = B + (size_t)l * ldb, *a = A + (size_t)l * acs;
        float32x4_t bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) bv[j] = vld1q_f32(b + 4 * j);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const float x = a[(size_t)i * ars];
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) c[i][j] = vaddq_f32(c[i][j], vmulq_n_f32(bv[j], x));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) vst1q_f32(Cm + (size_t)i * ldc + 4 * j, c[i][j]);
}

/* Column blocks of 16, then one of 8 and one of 4 where they fit, rows by 3 then 1 (4 rows × 16
 * columns spill an accumulator: gcc's scheduler hoists the 16 products); the last < 4
 * columns are left to the node's mm_c (every element is summed on its own, so any split gives the
 * same bits): returns the columns done. */
int nl_gdn_mm_neon(int M, int N, int Kd, const float *A, size_t ars, size_t acs, const float *B, size_t ldb, float *Cm,
                   size_t ldc, int acc) {
    int j0 = 0;
    while (j0 + 4 <= N) {
        const int w = N - j0 >= 16 ? 16 : N - j0 >= 8 ? 8 : 4;
        const float *b = B + j0;
        int i = 0;
        for (; i + 3 <= M; i += 3) {
            const float *a = A + (size_t)i * ars;
            float *c = Cm + (size_t)i * ldc + j0;
            if (w == 16) mm_blk(3, 4, Kd, a, ars, acs, b, ldb, c, ldc, acc);
            else if (w == 8) mm_blk(3, 2, Kd, a, ars, acs, b, ldb, c, ldc, acc);
            else mm_blk(3, 1, Kd, a, ars, acs, b, ldb, c, ldc, acc);
        }
        for (; i < M; i++) {
            const float *a = A + (size_t)i * ars;
            float *c = Cm + (size_t)i * ldc + j0;
            if (w == 16) mm_blk(1, 4, Kd, a, ars, acs, b, ldb, c, ldc, acc);
            else if (w == 8) mm_blk(1, 2, Kd, a, ars, acs, b, ldb, c, ldc, acc);
            else mm_blk(1, 1, Kd, a, ars, acs, b, ldb, c, ldc, acc);
        }
        j0 += w;
    }
    return j0;
}

/* dst[c][r] = src[r][c] on one 4×4 block: TRN1/TRN2 on words, then on doublewords (exact moves). */
AI void tr4(float *restrict dst, size_t ldd, const float *restrict src, size_t lds) {
    const float32x4_t a0 = vld1q_f32(src), a1 = vld1q_f32(src + lds);
    const float32x4_t a2 = vld1q_f32(src + 2 * lds), a3 = vld1q_f32(src + 3 * lds);
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(a0, a1)); /* a00 a10 a02 a12 */
    const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(a0, a1)); /* a01 a11 a03 a13 */
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(a2, a3)); /* a20 a30 a22 a32 */
    const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(a2, a3)); /* a21 a31 a23 a33 */
    vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
    vst1q_f32(dst + ldd, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
    vst1q_f32(dst + 2 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
    vst1q_f32(dst + 3 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
}

/* dst[c][r] = src[r][c] on the whole 8×8 blocks (rows & ~7, cols & ~7); the caller does the edges. */
void nl_gdn_transpose8_neon(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int rows,
                            int cols) {
    const int R8 = rows & ~7, C8 = cols & ~7;
    for (int r = 0; r < R8; r += 8)
        for (int c = 0; c < C8; c += 8)
            for (int rr = 0; rr < 8; rr += 4)
                for (int cc = 0; cc < 8; cc += 4)
                    tr4(dst + (size_t)(c + cc) * ldd + r + rr, ldd, src + (size_t)(r + rr) * lds + c + cc, lds);
}
#else
typedef int nl_gdn_neon_empty; /* ISO C: a translation unit must not be empty */
#endif

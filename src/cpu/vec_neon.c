/* cpu/vec_neon: the element-wise nodes' bodies (cpu/kernels.h: nl_vec_kernels) for the Arm rows
 * (neon, neonbf16), NEON intrinsics where gcc 12 -O2 leaves the portable loop scalar or stages it
 * through memcpy (docs/architecture.md, "On a phone: the nodes' generated code"): RMSNorm's scale
 * and backward, RoPE's rotations, cross-entropy's max and its z − m / exp / sum pass, SwiGLU and
 * the gate. Every other entry (the residual adds, the dropout products) is cpu/vec_body.h's
 * portable body, compiled here from the same source with the same (baseline) flags as cpu/vec.c.
 * Built only on aarch64 (the file's name).
 *
 * The same bits as the portable bodies on every input: the same operations in the same order per
 * element (FMUL then FADD/FSUB, never FMLA/FMLS: vfmaq would fuse; the portable bodies compile
 * to separate multiplies and adds at -std=c11), the reductions with the same 8 partial sums
 * (lanes 0-3 and 4-7 in two q registers) and the same final combine, nl_fexp / nl_fsigmoid as
 * their exact lane-wise copy (cpu/gdn_neon.c's: the rounding trick, the Horner steps in order,
 * the integer exponent and masks, then the IEEE division), and the < 4-element tails as the
 * portable scalar code. tests/test_nn.c checks each row against the scalar row's bits. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>

#include "cpu/fexp_neon.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

/* ---- nn/norm.c ---- */

#define NL_VEC_OWN_rmsnorm_row
static float rmsnorm_row_neon(float *y, const float *x, const float *w, int n, float eps) {
    const double ms = (double)nl_vdot(x, x, n) / (double)n; /* vectorised as it stands */
    const float rs = (float)(1.0 / sqrt(ms + (double)eps));
    const float32x4_t vr = vdupq_n_f32(rs);
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), vr)));
    for (; i < n; i++) y[i] = w[i] * (x[i] * rs);
    return rs;
}

#define NL_VEC_OWN_rmsnorm_bwd_row
static void rmsnorm_bwd_row_neon(float *dx, const float *dy, const float *x, const float *w, float rs, int n) {
    /* g·x = Σ dy·w·x: acc0 = partial sums 0-3, acc1 = 4-7 */
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + NL_LANES <= n; i += NL_LANES) {
        acc0 = vaddq_f32(acc0, vmulq_f32(vmulq_f32(vld1q_f32(dy + i), vld1q_f32(w + i)), vld1q_f32(x + i)));
        acc1 = vaddq_f32(acc1, vmulq_f32(vmulq_f32(vld1q_f32(dy + i + 4), vld1q_f32(w + i + 4)), vld1q_f32(x + i + 4)));
    }
    float gx = 0.0f;
    for (; i < n; i++) gx += dy[i] * w[i] * x[i];
    float acc[NL_LANES];
    vst1q_f32(acc, acc0);
    vst1q_f32(acc + 4, acc1);
    gx += nl_lanes_sum(acc);
    const float c = gx * rs * rs / (float)n;
    const float32x4_t vr = vdupq_n_f32(rs), vc = vdupq_n_f32(c);
    for (i = 0; i + 4 <= n; i += 4) {
        const float32x4_t d =
            vsubq_f32(vmulq_f32(vld1q_f32(dy + i), vld1q_f32(w + i)), vmulq_f32(vld1q_f32(x + i), vc));
        vst1q_f32(dx + i, vmulq_f32(vr, d));
    }
    for (; i < n; i++) dx[i] = rs * (dy[i] * w[i] - x[i] * c);
}

/* ---- nn/mlp.c: SwiGLU and the gate, 4 lanes (outputs may alias inputs elementwise: every input
 * of a vector is loaded before its outputs are stored); the tail elements as the portable lanes ---- */

#define NL_VEC_OWN_swiglu_fwd
static void swiglu_fwd_neon(float *h, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(a + i), y = vld1q_f32(b + i);
        vst1q_f32(h + i, vmulq_f32(vmulq_f32(x, v_fsigmoid(x)), y));
    }
    for (; i < n; i++) h[i] = a[i] * nl_fsigmoid(a[i]) * b[i];
}

#define NL_VEC_OWN_swiglu_bwd
static void swiglu_bwd_neon(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(a + i), y = vld1q_f32(b + i), g = vld1q_f32(dh + i);
        const float32x4_t sg = v_fsigmoid(x);
        const float32x4_t ra =
            vmulq_f32(vmulq_f32(vmulq_f32(g, y), sg), vaddq_f32(one, vmulq_f32(x, vsubq_f32(one, sg))));
        const float32x4_t rb = vmulq_f32(vmulq_f32(g, x), sg);
        vst1q_f32(da + i, ra);
        vst1q_f32(db + i, rb);
    }
    for (; i < n; i++) {
        const float x = a[i], y = b[i], g = dh[i];
        const float sg = nl_fsigmoid(x);
        const float ra = g * y * sg * (1.0f + x * (1.0f - sg)), rb = g * x * sg;
        da[i] = ra, db[i] = rb;
    }
}

#define NL_VEC_OWN_gate_fwd
static void gate_fwd_neon(float *out, const float *o, const float *g, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vmulq_f32(vld1q_f32(o + i), v_fsigmoid(vld1q_f32(g + i))));
    for (; i < n; i++) out[i] = o[i] * nl_fsigmoid(g[i]);
}

#define NL_VEC_OWN_gate_bwd
static void gate_bwd_neon(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(o + i), z = vld1q_f32(g + i), dy = vld1q_f32(dout + i);
        const float32x4_t sg = v_fsigmoid(z);
        const float32x4_t ro = vmulq_f32(dy, sg);
        const float32x4_t rg = vmulq_f32(vmulq_f32(vmulq_f32(dy, x), sg), vsubq_f32(one, sg));
        vst1q_f32(d_o + i, ro);
        vst1q_f32(dg + i, rg);
    }
    for (; i < n; i++) {
        const float x = o[i], z = g[i], dy = dout[i];
        const float sg = nl_fsigmoid(z);
        const float ro = dy * sg, rg = dy * x * sg * (1.0f - sg);
        d_o[i] = ro, dg[i] = rg;
    }
}

/* ---- nn/xent.c ---- */

/* The portable max: m = z[0], then m = z[j] > m ? z[j] : m. Its value is the largest non-NaN
 * z[j] (NaN if z[0] is NaN: no comparison with it is true; later NaNs are passed over); of equal
 * values the first is kept, which differs in bits only for zeros (+0 against −0). Here: 4-lane
 * maxima by the same comparison (lanes from −inf, so a NaN never sticks in a lane), combined from
 * z[0] by it, then the tail; a zero maximum is then taken from the first zero of z, as the
 * portable loop would: the same bits of m in every case. */
static float xent_max(const float *z, int V) {
    float m = z[0];
    int j = 1;
    if (V >= 9) {
        float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0;
        for (; j + 8 <= V; j += 8) {
            const float32x4_t a = vld1q_f32(z + j), b = vld1q_f32(z + j + 4);
            m0 = vbslq_f32(vcgtq_f32(a, m0), a, m0);
            m1 = vbslq_f32(vcgtq_f32(b, m1), b, m1);
        }
        float l[8];
        vst1q_f32(l, m0);
        vst1q_f32(l + 4, m1);
        for (int k = 0; k < 8; k++) m = l[k] > m ? l[k] : m;
    }
    for (; j < V; j++) m = z[j] > m ? z[j] : m;
    if (m == 0.0f)
        for (j = 0; j < V; j++)
            if (z[j] == 0.0f) {
                m = z[j];
                break;
            }
    return m;
}

#define NL_VEC_XCH_NEON 1024 /* cpu/vec_body.h's NL_VEC_XCH: the same chunks, the same sums */

#define NL_VEC_OWN_xent_row
static double xent_row_neon(float *z, int y, int V, float inv_n, int want_grad) {
    const float m = xent_max(z, V);
    const float32x4_t vm = vdupq_n_f32(m);
    /* Σ exp(z − m): per chunk the 8 float partial sums (acc0: lanes 0-3, acc1: 4-7) and the tail
     * in double, then the partials added to it in lane order, chunks summed in double. The
     * portable body's z − m pass, nl_vexp pass and sum pass in one: each element gets the same
     * operations (a subtraction, nl_fexp), each sum the same terms in the same order. With
     * want_grad the exponentials are kept in z; z[y] is read first. */
    const float zy = z[y];
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += NL_VEC_XCH_NEON) {
        const int nc = V - j0 < NL_VEC_XCH_NEON ? V - j0 : NL_VEC_XCH_NEON;
        float *zc = z + j0;
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
        int j = 0;
        for (; j + NL_LANES <= nc; j += NL_LANES) {
            const float32x4_t e0 = v_fexp(vsubq_f32(vld1q_f32(zc + j), vm));
            const float32x4_t e1 = v_fexp(vsubq_f32(vld1q_f32(zc + j + 4), vm));
            if (want_grad) {
                vst1q_f32(zc + j, e0);
                vst1q_f32(zc + j + 4, e1);
            }
            acc0 = vaddq_f32(acc0, e0);
            acc1 = vaddq_f32(acc1, e1);
        }
        double part = 0.0;
        for (; j < nc; j++) {
            const float e = nl_fexp(zc[j] - m);
            if (want_grad) zc[j] = e;
            part += e;
        }
        float acc[NL_LANES];
        vst1q_f32(acc, acc0);
        vst1q_f32(acc + 4, acc1);
        for (int l = 0; l < NL_LANES; l++) part += acc[l];
        sum += part;
    }
    const double lse = (double)m + log(sum);
    if (want_grad) {
        /* softmax·inv_n = exp(z − m) · (inv_n / Σ) */
        const float c = (float)((double)inv_n / sum);
        nl_vscale(z, c, V); /* vectorised as it stands */
        z[y] -= inv_n;
    }
    return lse - (double)zy;
}

/* ---- nn/rope.c: 4 pairs a step (NORM pairs de-interleaved by LD2/ST2) ---- */

#define NL_VEC_OWN_rope_rotate
static void rope_rotate_neon(float *x, int n_heads, int hd, int half, int c0, int nc, const float *cs, const float *sn,
                             int neox) {
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * hd;
        int j = 0;
        if (neox) {
            float *a = xh + c0, *b = xh + c0 + half;
            for (; j + 4 <= nc; j += 4) {
                const float32x4_t x0 = vld1q_f32(a + j), x1 = vld1q_f32(b + j);
                const float32x4_t c = vld1q_f32(cs + j), s = vld1q_f32(sn + j);
                vst1q_f32(a + j, vsubq_f32(vmulq_f32(x0, c), vmulq_f32(x1, s)));
                vst1q_f32(b + j, vaddq_f32(vmulq_f32(x0, s), vmulq_f32(x1, c)));
            }
            for (; j < nc; j++) {
                float x0 = a[j], x1 = b[j];
                a[j] = x0 * cs[j] - x1 * sn[j];
                b[j] = x0 * sn[j] + x1 * cs[j];
            }
        } else {
            float *a = xh + 2 * c0;
            for (; j + 4 <= nc; j += 4) {
                const float32x4x2_t p = vld2q_f32(a + 2 * j);
                const float32x4_t c = vld1q_f32(cs + j), s = vld1q_f32(sn + j);
                float32x4x2_t r;
                r.val[0] = vsubq_f32(vmulq_f32(p.val[0], c), vmulq_f32(p.val[1], s));
                r.val[1] = vaddq_f32(vmulq_f32(p.val[0], s), vmulq_f32(p.val[1], c));
                vst2q_f32(a + 2 * j, r);
            }
            for (; j < nc; j++) {
                float x0 = a[2 * j], x1 = a[2 * j + 1];
                a[2 * j] = x0 * cs[j] - x1 * sn[j];
                a[2 * j + 1] = x0 * sn[j] + x1 * cs[j];
            }
        }
    }
}

/* the rest: the portable bodies (the residual adds, the dropout products: vectorised as they
 * stand), and the table nl_vec_kernels_neon */
#define NL_VEC_ISA neon
#include "cpu/vec_body.h"
#else
typedef int nl_vec_neon_empty; /* ISO C: a translation unit must not be empty */
#endif

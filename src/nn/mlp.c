/* nn/mlp: elementwise gates of the MLP and of the qwen35 attention output.
 *   SwiGLU:  h = silu(a) ⊙ b, silu(a) = a·σ(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a)))
 *            da = dh ⊙ b ⊙ silu'(a),  db = dh ⊙ silu(a)
 *   Gate:    out = o ⊙ σ(g);  do = dout ⊙ σ(g),  dg = dout ⊙ o ⊙ σ(g)(1 − σ(g))
 * All arrays hold n floats. Outputs may alias inputs elementwise (each element is read
 * before it is written). Facts: docs/backward.md. */
#include "nn/nn.h"
#include "nn/vecmath.h"

/* Each function runs 8-lane blocks (inputs loaded into locals, results computed, then
 * stored: so outputs may alias inputs and gcc -O2 still vectorises, see vecmath.h) plus a
 * scalar tail. */

NL_CLONES void nl_swiglu_forward(float *h, const float *a, const float *b, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += NL_LANES) {
        const int w = n - i0 < NL_LANES ? (int)(n - i0) : NL_LANES;
        float x[NL_LANES] = {0}, y[NL_LANES] = {0}, r[NL_LANES];
        for (int l = 0; l < w; l++) x[l] = a[i0 + l], y[l] = b[i0 + l];
        for (int l = 0; l < NL_LANES; l++) r[l] = x[l] * nl_fsigmoid(x[l]) * y[l];
        for (int l = 0; l < w; l++) h[i0 + l] = r[l];
    }
}

NL_CLONES void nl_swiglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += NL_LANES) {
        const int w = n - i0 < NL_LANES ? (int)(n - i0) : NL_LANES;
        float x[NL_LANES] = {0}, y[NL_LANES] = {0}, g[NL_LANES] = {0}, ra[NL_LANES], rb[NL_LANES];
        for (int l = 0; l < w; l++) x[l] = a[i0 + l], y[l] = b[i0 + l], g[l] = dh[i0 + l];
        for (int l = 0; l < NL_LANES; l++) {
            const float sg = nl_fsigmoid(x[l]);
            ra[l] = g[l] * y[l] * sg * (1.0f + x[l] * (1.0f - sg));
            rb[l] = g[l] * x[l] * sg;
        }
        for (int l = 0; l < w; l++) da[i0 + l] = ra[l], db[i0 + l] = rb[l];
    }
}

NL_CLONES void nl_gate_forward(float *out, const float *o, const float *g, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += NL_LANES) {
        const int w = n - i0 < NL_LANES ? (int)(n - i0) : NL_LANES;
        float x[NL_LANES] = {0}, z[NL_LANES] = {0}, r[NL_LANES];
        for (int l = 0; l < w; l++) x[l] = o[i0 + l], z[l] = g[i0 + l];
        for (int l = 0; l < NL_LANES; l++) r[l] = x[l] * nl_fsigmoid(z[l]);
        for (int l = 0; l < w; l++) out[i0 + l] = r[l];
    }
}

NL_CLONES void nl_gate_backward(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += NL_LANES) {
        const int w = n - i0 < NL_LANES ? (int)(n - i0) : NL_LANES;
        float x[NL_LANES] = {0}, z[NL_LANES] = {0}, dy[NL_LANES] = {0}, ro[NL_LANES], rg[NL_LANES];
        for (int l = 0; l < w; l++) x[l] = o[i0 + l], z[l] = g[i0 + l], dy[l] = dout[i0 + l];
        for (int l = 0; l < NL_LANES; l++) {
            const float sg = nl_fsigmoid(z[l]);
            ro[l] = dy[l] * sg;
            rg[l] = dy[l] * x[l] * sg * (1.0f - sg);
        }
        for (int l = 0; l < w; l++) d_o[i0 + l] = ro[l], dg[i0 + l] = rg[l];
    }
}

/* nn/mlp: elementwise gates of the MLP and of the qwen35 attention output.
 *   SwiGLU:  h = silu(a) ⊙ b, silu(a) = a·σ(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a)))
 *            da = dh ⊙ b ⊙ silu'(a),  db = dh ⊙ silu(a)
 *   GeGLU:   h = gelu(a) ⊙ b, gelu(a) = a/2·(1 + tanh(u)), u = k·(a + c·a³), k = √(2/π),
 *            c = 0.044715; gelu'(a) = (1 + tanh u)/2 + a/2·(1 − tanh²u)·k·(1 + 3c·a²)
 *            da = dh ⊙ b ⊙ gelu'(a),  db = dh ⊙ gelu(a)
 *   Gate:    out = o ⊙ σ(g);  do = dout ⊙ σ(g),  dg = dout ⊙ o ⊙ σ(g)(1 − σ(g))
 * All arrays hold n floats. Outputs may alias inputs elementwise (each element is read
 * before it is written). Facts: docs/backward.md. */
#include "cpu/vecmath.h"
#include "nn/nn.h"

#include <math.h>

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

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

void nl_geglu_forward(float *h, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i], y = b[i];
        const float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
        h[i] = 0.5f * x * (1.0f + t) * y;
    }
}

void nl_geglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i], y = b[i], g = dh[i];
        const float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
        const float gelu = 0.5f * x * (1.0f + t);
        const float dgelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        da[i] = g * y * dgelu;
        db[i] = g * gelu;
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

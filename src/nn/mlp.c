/* nn/mlp: elementwise gates of the MLP and of the qwen35 attention output.
 *   SwiGLU:  h = silu(a) ⊙ b, silu(a) = a·σ(a), silu'(a) = σ(a)·(1 + a·(1 − σ(a)))
 *            da = dh ⊙ b ⊙ silu'(a),  db = dh ⊙ silu(a)
 *   GeGLU:   h = gelu(a) ⊙ b, gelu(a) = a/2·(1 + tanh(u)), u = k·(a + c·a³), k = √(2/π),
 *            c = 0.044715; gelu'(a) = (1 + tanh u)/2 + a/2·(1 − tanh²u)·k·(1 + 3c·a²)
 *            da = dh ⊙ b ⊙ gelu'(a),  db = dh ⊙ gelu(a)
 *   Gate:    out = o ⊙ σ(g);  do = dout ⊙ σ(g),  dg = dout ⊙ o ⊙ σ(g)(1 − σ(g))
 * All arrays hold n floats. Outputs may alias inputs elementwise (each element is read
 * before it is written). Facts: docs/backward.md. */
#include "cpu/kernels.h"
#include "nn/nn.h"

#include <math.h>

/* SwiGLU and the gate: the kernel table's element-wise bodies (cpu/vec_body.h, 8-lane blocks). */

void nl_swiglu_forward(float *h, const float *a, const float *b, int64_t n) {
    nl_cpu_kernels()->vec->swiglu_fwd(h, a, b, n);
}

void nl_swiglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    nl_cpu_kernels()->vec->swiglu_bwd(da, db, dh, a, b, n);
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* GELU's tanh form through the logistic function, 0.5·(1 + tanh z) = σ(2z) = 1 / (1 + e^{-2z}),
 * and its slope σ(2z)' = 2·e^{-2z}·σ(2z)² (no cancellation where σ is near 1). Not glibc's tanhf:
 * its last bit differs between the x86-64 and the AArch64 builds for about 1 input in 10^4
 * (expf's agree), and the FP32 path gives the same bits on both. Same values within 2e-7. */
void nl_geglu_forward(float *h, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i], y = b[i];
        const float z = GELU_K * (x + GELU_C * x * x * x);
        const float s = 1.0f / (1.0f + expf(-2.0f * z));
        h[i] = x * s * y;
    }
}

void nl_geglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i], y = b[i], g = dh[i];
        const float z = GELU_K * (x + GELU_C * x * x * x);
        const float e = expf(-2.0f * z), s = 1.0f / (1.0f + e);
        const float ds = s > 0.0f ? e * s * s : 0.0f; /* e = inf: s = 0 and the slope 0 */
        const float gelu = x * s;
        const float dgelu = s + x * (2.0f * ds) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        da[i] = g * y * dgelu;
        db[i] = g * gelu;
    }
}

void nl_gate_forward(float *out, const float *o, const float *g, int64_t n) {
    nl_cpu_kernels()->vec->gate_fwd(out, o, g, n);
}

void nl_gate_backward(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n) {
    nl_cpu_kernels()->vec->gate_bwd(d_o, dg, dout, o, g, n);
}

/* nn/norm: RMSNorm with a frozen weight.
 *   forward:  y[t] = w ⊙ x[t] · rstd[t],  rstd[t] = 1 / sqrt(mean(x[t]²) + eps)   x, y: [T][n]
 *   backward: with g = dy ⊙ w,  dx = rstd · (g − x · (g·x) · rstd² / n)   (no dw: w is frozen)
 * Facts: docs/formats.md §3, backward.md "RMSNorm". */
#include "cpu/kernels.h"
#include "nn/nn.h"

/* the rows' loops: the kernel table's element-wise bodies (cpu/vec_body.h) */

void nl_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int T, int n, float eps) {
    const nl_vec_kernels *v = nl_cpu_kernels()->vec;
    for (int t = 0; t < T; t++) {
        const float rs = v->rmsnorm_row(y + (int64_t)t * n, x + (int64_t)t * n, w, n, eps);
        if (rstd) rstd[t] = rs;
    }
}

/* rstd[T] is the forward's (required). dx may alias dy. */
void nl_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *w, const float *rstd, int T, int n) {
    const nl_vec_kernels *v = nl_cpu_kernels()->vec;
    for (int t = 0; t < T; t++)
        v->rmsnorm_bwd_row(dx + (int64_t)t * n, dy + (int64_t)t * n, x + (int64_t)t * n, w, rstd[t], n);
}

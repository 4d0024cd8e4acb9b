/* nn/norm: RMSNorm with a frozen weight.
 *   forward:  y[t] = w ⊙ x[t] · rstd[t],  rstd[t] = 1 / sqrt(mean(x[t]²) + eps)   x, y: [T][n]
 *   backward: with g = dy ⊙ w,  dx = rstd · (g − x · (g·x) · rstd² / n)   (no dw: w is frozen)
 * Facts: docs/formats.md §3, backward.md "RMSNorm". */
#include "cpu/vecmath.h"
#include "nn/nn.h"

#include <math.h>

static float row_rstd(const float *x, int n, float eps) {
    double ms = (double)nl_vdot(x, x, n) / (double)n;
    return (float)(1.0 / sqrt(ms + (double)eps));
}

NL_CLONES void nl_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (int64_t)t * n;
        float *yr = y + (int64_t)t * n;
        float rs = row_rstd(xr, n, eps);
        if (rstd) rstd[t] = rs;
        for (int i = 0; i < n; i++) yr[i] = w[i] * (xr[i] * rs);
    }
}

/* rstd[T] is the forward's (required). dx may alias dy. */
NL_CLONES void nl_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *w, const float *rstd, int T, int n) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (int64_t)t * n;
        const float *dyr = dy + (int64_t)t * n;
        float *dxr = dx + (int64_t)t * n;
        float rs = rstd[t];
        /* g·x = Σ dy·w·x with 8 partial sums */
        float acc[NL_LANES] = {0};
        int i = 0;
        for (; i + NL_LANES <= n; i += NL_LANES)
            for (int l = 0; l < NL_LANES; l++) acc[l] += dyr[i + l] * w[i + l] * xr[i + l];
        float gx = 0.0f;
        for (; i < n; i++) gx += dyr[i] * w[i] * xr[i];
        gx += nl_lanes_sum(acc);
        float c = gx * rs * rs / (float)n;
        for (i = 0; i < n; i++) dxr[i] = rs * (dyr[i] * w[i] - xr[i] * c);
    }
}

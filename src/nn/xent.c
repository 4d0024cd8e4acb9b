/* nn/xent: softmax cross-entropy over one chunk of logits z[T][V].
 * loss_t = logsumexp(z_t) − z_t[y_t] (max-shifted: lse = m + log Σ exp(z − m), m = max z_t);
 * the function returns Σ_t loss_t over target rows (targets[t] >= 0) in double. With
 * want_grad, z is overwritten with dz_t = (softmax(z_t) − onehot(y_t))·inv_n on target rows,
 * 0 on the others. Facts: docs/backward.md "Head + cross-entropy". */
#include "cpu/vecmath.h"
#include "nn/nn.h"

#include <math.h>

#define XCH 1024 /* exp is evaluated in chunks of this many logits (stack scratch) */

NL_CLONES double nl_xent_chunk(float *z, const int32_t *targets, int T, int V, float inv_n, int want_grad) {
    double total = 0.0;
    float e[XCH];
    for (int t = 0; t < T; t++) {
        float *zr = z + (int64_t)t * V;
        const int y = targets[t];
        if (y < 0 || y >= V) { /* not a target (an out-of-range id is treated the same) */
            if (want_grad)
                for (int j = 0; j < V; j++) zr[j] = 0.0f;
            continue;
        }
        float m = zr[0];
        for (int j = 1; j < V; j++) m = zr[j] > m ? zr[j] : m;
        /* Σ exp(z − m): 8-lane float partials per chunk, chunks summed in double. With
         * want_grad the exponentials are kept in z (one exp pass, not two): zr[y] is read first. */
        const float zy = zr[y];
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += XCH) {
            const int nc = V - j0 < XCH ? V - j0 : XCH;
            float *ev = want_grad ? zr + j0 : e;
            for (int j = 0; j < nc; j++) ev[j] = zr[j0 + j] - m;
            nl_vexp(ev, ev, nc);
            float acc[NL_LANES] = {0};
            int j = 0;
            for (; j + NL_LANES <= nc; j += NL_LANES)
                for (int l = 0; l < NL_LANES; l++) acc[l] += ev[j + l];
            double part = 0.0;
            for (; j < nc; j++) part += ev[j];
            for (int l = 0; l < NL_LANES; l++) part += acc[l];
            sum += part;
        }
        const double lse = (double)m + log(sum);
        total += lse - (double)zy;
        if (want_grad) {
            /* softmax·inv_n = exp(z − m) · (inv_n / Σ) */
            const float c = (float)((double)inv_n / sum);
            nl_vscale(zr, c, V);
            zr[y] -= inv_n;
        }
    }
    return total;
}

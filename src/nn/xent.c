/* nn/xent: softmax cross-entropy over one chunk of logits z[T][V].
 * loss_t = logsumexp(z_t) − z_t[y_t] (max-shifted: lse = m + log Σ exp(z − m), m = max z_t);
 * the function returns Σ_t loss_t over target rows (targets[t] >= 0) in double. With
 * want_grad, z is overwritten with dz_t = (softmax(z_t) − onehot(y_t))·inv_n on target rows,
 * 0 on the others. Facts: docs/backward.md "Head + cross-entropy". */
#include "cpu/kernels.h"
#include "nn/nn.h"

/* a target row's loops: the kernel table's element-wise body (cpu/vec_body.h: xent_row) */
double nl_xent_chunk(float *z, const int32_t *targets, int T, int V, float inv_n, int want_grad) {
    const nl_vec_kernels *v = nl_cpu_kernels()->vec;
    double total = 0.0;
    for (int t = 0; t < T; t++) {
        float *zr = z + (int64_t)t * V;
        const int y = targets[t];
        if (y < 0 || y >= V) { /* not a target (an out-of-range id is treated the same) */
            if (want_grad)
                for (int j = 0; j < V; j++) zr[j] = 0.0f;
            continue;
        }
        total += v->xent_row(zr, y, V, inv_n, want_grad);
    }
    return total;
}

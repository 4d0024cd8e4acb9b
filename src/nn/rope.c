/* nn/rope: rotary position embedding, in place on x[T][n_heads][head_dim].
 * Pair i (i < n_rot/2) at position p is rotated by θ_i = p · base^(-2i/n_rot) · freq_scale / ff[i]:
 *   out0 = x0 cos θ − x1 sin θ,  out1 = x0 sin θ + x1 cos θ
 * NORM (neox = 0, llama) pairs (2i, 2i+1); NEOX (neox = 1, qwen3/qwen35 text) pairs
 * (i, i + n_rot/2). Dims >= n_rot pass through. The backward is the rotation by −θ (a rotation
 * is orthogonal, so its transpose is its inverse).
 * Facts: docs/formats.md §3 "RoPE", backward.md "RoPE".
 *
 * cos/sin are computed once per (token, pair) in double (θ reaches ~1e5 rad at long positions;
 * a float θ would lose ~1e-2 rad there) and shared by all heads of the token. */
#include "cpu/kernels.h"
#include "nn/nn.h"

#include <math.h>
#include <stdlib.h>

#include "util/util.h"

#define ROPE_CHUNK 64 /* pairs per cos/sin table: bounded stack use for any n_rot */

static double inv_freq(const nl_rope *r, int i) {
    double f = pow((double)r->base, -2.0 * (double)i / (double)r->n_rot) * (double)r->freq_scale;
    if (r->freq_factors) f /= (double)r->freq_factors[i];
    return f;
}

int nl_rope_table(nl_rope *r, int n_pos) {
    const int half = r->n_rot / 2;
    if (n_pos <= r->tab_n || half <= 0) return 0;
    float *c = malloc(sizeof(float) * (size_t)n_pos * (size_t)half),
          *s = malloc(sizeof(float) * (size_t)n_pos * (size_t)half);
    if (!c || !s) {
        free(c);
        free(s);
        return nl_err("rope: out of memory for a %d-position table", n_pos);
    }
    for (int i = 0; i < half; i++) {
        const double f = inv_freq(r, i);
        for (int p = 0; p < n_pos; p++) {
            const double th = (double)p * f;
            c[(size_t)p * half + i] = (float)cos(th);
            s[(size_t)p * half + i] = (float)sin(th);
        }
    }
    nl_rope_free_table(r);
    r->tab_cos = c;
    r->tab_sin = s;
    r->tab_n = n_pos;
    return 0;
}

void nl_rope_free_table(nl_rope *r) {
    free(r->tab_cos);
    free(r->tab_sin);
    r->tab_cos = r->tab_sin = NULL;
    r->tab_n = 0;
}

static void rope_apply(const nl_rope *r, float *x, int T, int n_heads, const int32_t *pos, double sign) {
    const int half = r->n_rot / 2;
    const int hd = r->head_dim;
    double invf[ROPE_CHUNK];
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    /* the rotation of every head: the kernel table's element-wise body (cpu/vec_body.h) */
    const nl_vec_kernels *v = nl_cpu_kernels()->vec;
    for (int c0 = 0; c0 < half; c0 += ROPE_CHUNK) {
        const int nc = half - c0 < ROPE_CHUNK ? half - c0 : ROPE_CHUNK;
        int have_invf = 0; /* the frequencies (pow) only for a position past the table */
        for (int t = 0; t < T; t++) {
            if (pos[t] >= 0 && pos[t] < r->tab_n) { /* the table: the same floats (sign flips exactly) */
                const float *tc = r->tab_cos + (size_t)pos[t] * half + c0,
                            *ts = r->tab_sin + (size_t)pos[t] * half + c0;
                for (int j = 0; j < nc; j++) {
                    cs[j] = tc[j];
                    sn[j] = sign > 0 ? ts[j] : -ts[j];
                }
            } else {
                if (!have_invf)
                    for (int j = 0; j < nc; j++) invf[j] = inv_freq(r, c0 + j);
                have_invf = 1;
                for (int j = 0; j < nc; j++) {
                    double th = (double)pos[t] * invf[j];
                    cs[j] = (float)cos(th);
                    sn[j] = (float)(sign * sin(th));
                }
            }
            v->rope_rotate(x + (int64_t)t * n_heads * hd, n_heads, hd, half, c0, nc, cs, sn, r->neox);
        }
    }
}

void nl_rope_forward(const nl_rope *r, float *x, int T, int n_heads, const int32_t *pos) {
    rope_apply(r, x, T, n_heads, pos, 1.0);
}

void nl_rope_backward(const nl_rope *r, float *dx, int T, int n_heads, const int32_t *pos) {
    rope_apply(r, dx, T, n_heads, pos, -1.0);
}

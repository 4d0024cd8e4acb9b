/* nn/par: every node on a pool of 2 and 3 threads gives the bits of the serial node (nn.h)
 * on the same inputs, with shapes above the hand-off threshold and lengths that do not divide
 * evenly (the ranges' edges); the fused q/k norm + RoPE pass gives the bits of the two serial calls. */
#include <string.h>

#include "test.h"
#include "nn/nn.h"
#include "nn/par.h"

#define SAME(a, b, n, what)                                                                                            \
    CHECKF(memcmp((a), (b), (size_t)(n) * sizeof *(a)) == 0, "%s: %d threads differ from one", what, nt)

int main(void) {
    const int T = 67, n = 601, H = 4, Hkv = 2, hd = 16, V = 523,
              RH = 36; /* RH rope heads: T·RH·hd above the hand-off */
    const int64_t ne = (int64_t)T * n;
    float *x = malloc(sizeof(float) * ne), *w = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * ne);
    float *b = malloc(sizeof(float) * ne), *y0 = malloc(sizeof(float) * ne), *y1 = malloc(sizeof(float) * ne);
    float *z0 = malloc(sizeof(float) * ne), *z1 = malloc(sizeof(float) * ne);
    float *r0 = malloc(sizeof(float) * T), *r1 = malloc(sizeof(float) * T);
    float *rr0 = malloc(sizeof(float) * T * RH), *rr1 = malloc(sizeof(float) * T * RH);
    int32_t *pos = malloc(sizeof(int32_t) * T), *tg = malloc(sizeof(int32_t) * T);
    double *l0 = malloc(sizeof(double) * T), *l1 = malloc(sizeof(double) * T);
    nl_t_fill(x, ne, 1.0);
    nl_t_fill(w, n, 1.0);
    nl_t_fill(dy, ne, 1.0);
    nl_t_fill(b, ne, 1.0);
    for (int t = 0; t < T; t++) pos[t] = 3 * t + 1, tg[t] = t % 3 ? (t * 31) % V : -1;
    nl_rope rope = {.head_dim = hd, .n_rot = hd, .neox = 1, .base = 10000.0f, .freq_scale = 1.0f};
    const float sc = 0.25f;
    const int64_t qn = (int64_t)T * H * hd, kvn = (int64_t)T * Hkv * hd;
    float *dout = malloc(sizeof(float) * qn);
    nl_t_fill(dout, qn, 1.0);
    for (int nt = 2; nt <= 3; nt++) {
        nl_pool *p = nl_pool_new(nt);
        CHECK(p != NULL);
        nl_rmsnorm_forward(y0, r0, x, w, T, n, 1e-6f);
        nl_par_rmsnorm_forward(p, y1, r1, x, w, T, n, 1e-6f);
        SAME(y0, y1, ne, "rmsnorm forward");
        SAME(r0, r1, T, "rmsnorm rstd");
        nl_rmsnorm_backward(z0, dy, x, w, r0, T, n);
        nl_par_rmsnorm_backward(p, z1, dy, x, w, r0, T, n);
        SAME(z0, z1, ne, "rmsnorm backward");
        for (int bwd = 0; bwd < 2; bwd++) {
            const int64_t nr = (int64_t)T * RH * hd;
            memcpy(y0, x, sizeof(float) * nr);
            memcpy(y1, x, sizeof(float) * nr);
            if (bwd) nl_rope_backward(&rope, y0, T, RH, pos);
            else nl_rope_forward(&rope, y0, T, RH, pos);
            nl_par_rope(p, &rope, bwd, y1, T, RH, pos);
            SAME(y0, y1, nr, bwd ? "rope backward" : "rope forward");
        }
        /* q/k norm and RoPE in one pass: the bits of the two serial calls (with and without the
         * cos/sin table, which stops short of the last positions) */
        for (int tab = 0; tab < 2; tab++) {
            if (tab) CHECK(nl_rope_table(&rope, 150) == 0);
            const int64_t nr = (int64_t)T * RH * hd;
            nl_rmsnorm_forward(y0, rr0, x, w, T * RH, hd, 1e-6f);
            nl_rope_forward(&rope, y0, T, RH, pos);
            nl_par_norm_rope_forward(p, &rope, y1, rr1, x, w, T, RH, 1e-6f, pos);
            SAME(y0, y1, nr, "norm+rope forward");
            SAME(rr0, rr1, T * RH, "norm+rope rstd");
            memcpy(y0, dy, sizeof(float) * nr);
            nl_rope_backward(&rope, y0, T, RH, pos);
            nl_rmsnorm_backward(y0, y0, x, w, rr0, T * RH, hd);
            memcpy(y1, dy, sizeof(float) * nr);
            nl_par_norm_rope_backward(p, &rope, y1, y1, x, w, rr0, T, RH, pos); /* in place */
            SAME(y0, y1, nr, "norm+rope backward");
            nl_par_norm_rope_backward(p, &rope, z1, dy, x, w, rr0, T, RH, pos);
            SAME(y0, z1, nr, "norm+rope backward (dx apart from dy)");
        }
        nl_rope_free_table(&rope);
        nl_swiglu_forward(y0, x, b, ne);
        nl_par_swiglu_forward(p, y1, x, b, ne);
        SAME(y0, y1, ne, "swiglu forward");
        nl_swiglu_backward(y0, z0, dy, x, b, ne);
        nl_par_swiglu_backward(p, y1, z1, dy, x, b, ne);
        SAME(y0, y1, ne, "swiglu backward da");
        SAME(z0, z1, ne, "swiglu backward db");
        nl_gate_forward(y0, x, b, ne);
        nl_par_gate_forward(p, y1, x, b, ne);
        SAME(y0, y1, ne, "gate forward");
        nl_gate_backward(y0, z0, dy, x, b, ne);
        nl_par_gate_backward(p, y1, z1, dy, x, b, ne);
        SAME(y0, y1, ne, "gate backward d_o");
        SAME(z0, z1, ne, "gate backward dg");
        for (int64_t i = 0; i < ne; i++) y0[i] = x[i] + b[i];
        nl_par_add2(p, y1, x, b, ne);
        SAME(y0, y1, ne, "add2");
        for (int64_t i = 0; i < ne; i++) y0[i] += dy[i];
        nl_par_add(p, y1, dy, ne);
        SAME(y0, y1, ne, "add");
        /* attention: q = x, k = b, v = dy (as [T][H][hd] and [T][Hkv][hd]) */
        for (int bf16 = 0; bf16 < 2; bf16++) {
            float lse0[67 * 4], lse1[67 * 4];
            nl_attn_fwd af = {.out = y0,
                              .lse = lse0,
                              .q = x,
                              .k = b,
                              .v = dy,
                              .T = T,
                              .S = T,
                              .Hq = H,
                              .Hkv = Hkv,
                              .d = hd,
                              .scale = sc,
                              .g1 = Hkv};
            (bf16 ? nl_attention_forward_range_bf16 : nl_attention_forward_range)(&af);
            af.out = y1, af.lse = lse1;
            nl_par_attention_forward(p, bf16, NULL, &af);
            SAME(y0, y1, qn, "attention forward");
            SAME(lse0, lse1, T * H, "attention lse");
            float *dq0 = z0, *dk0 = z0 + qn, *dv0 = dk0 + kvn, *dq1 = z1, *dk1 = z1 + qn, *dv1 = dk1 + kvn;
            nl_attn_bwd ab = {.dq = dq0,
                              .dk = dk0,
                              .dv = dv0,
                              .dout = dout,
                              .out = y0,
                              .lse = lse0,
                              .q = x,
                              .k = b,
                              .v = dy,
                              .T = T,
                              .Hq = H,
                              .Hkv = Hkv,
                              .d = hd,
                              .scale = sc,
                              .g1 = Hkv};
            (bf16 ? nl_attention_backward_range_bf16 : nl_attention_backward_range)(&ab);
            ab.dq = dq1, ab.dk = dk1, ab.dv = dv1;
            nl_par_attention_backward(p, bf16, NULL, &ab);
            SAME(z0, z1, qn + 2 * kvn, "attention backward");
        }
        /* cross-entropy rows of z[T][V] (V·T < ne) */
        for (int g = 0; g < 2; g++) {
            memcpy(y0, x, sizeof(float) * (size_t)T * V);
            memcpy(y1, x, sizeof(float) * (size_t)T * V);
            for (int t = 0; t < T; t++) l0[t] = nl_xent_chunk(y0 + (int64_t)t * V, tg + t, 1, V, 0.5f, g);
            nl_par_xent_rows(p, l1, y1, tg, T, V, 0.5f, g);
            SAME(l0, l1, T, "xent row loss");
            SAME(y0, y1, (int64_t)T * V, "xent dz");
        }
        nl_pool_free(p);
    }
    free(x), free(w), free(dy), free(b), free(y0), free(y1), free(z0), free(z1), free(r0), free(r1), free(pos),
        free(tg);
    free(l0), free(l1), free(dout), free(rr0), free(rr1);
    return nl_t_done();
}

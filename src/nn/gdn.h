/* nn/gdn: the gated delta-net layer core (Qwen3.5 linear attention) as ONE fused node:
 * causal depthwise conv + SiLU, per-head L2 norm of q/k, gates β = σ(b), g = A·softplus(a+dt),
 * the decay-then-delta recurrence with FP32 state, gated RMSNorm with z.
 * Facts: ../shared/ref/formats.md §3 (GDN), ../shared/ref/backward.md.
 * The projections around it (attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out) are proj/'s. */
#ifndef NL_GDN_H
#define NL_GDN_H

#include <stdint.h>

typedef struct {
    int Hk, Hv;        /* key heads (ssm.group_count), value heads (ssm.time_step_rank) */
    int dk, dv;        /* head dims */
    int K;             /* conv kernel */
    float eps;         /* rms_norm_eps (L2 norm and gated RMSNorm) */
    int kv_tiled;      /* 1: v-head j uses k-head j % Hk (qwen35); 0: j / (Hv/Hk) (qwen3next) */
} nl_gdn_shape;
/* conv_dim = 2*Hk*dk + Hv*dv */
static inline int nl_gdn_conv_dim(const nl_gdn_shape *s) { return 2 * s->Hk * s->dk + s->Hv * s->dv; }

typedef struct {
    const float *conv;    /* [conv_dim][K]; conv[c][K-1] multiplies the current token */
    const float *dt_bias; /* [Hv] */
    const float *A;       /* [Hv], = -exp(A_log) (< 0) */
    const float *norm;    /* [dv], gated RMSNorm weight */
} nl_gdn_weights;

/* Decoding / streaming state (owned by the caller, zero-initialised for a new sequence):
 * conv[(K-1)][conv_dim]: the previous K-1 inputs, oldest first; S[Hv][dk][dv]. */
typedef struct {
    float *conv;
    float *S;
} nl_gdn_state;

/* Forward over T tokens. mixed[T][conv_dim] (attn_qkv output), z[T][Hv*dv], b[T][Hv],
 * a[T][Hv] -> y[T][Hv*dv] (the input of ssm_out). state may be NULL (start from zeros, and
 * nothing is returned); otherwise it is read and updated. */
int nl_gdn_forward(const nl_gdn_shape *s, const nl_gdn_weights *w, float *y, const float *mixed,
                   const float *z, const float *b, const float *a, int T, nl_gdn_state *state);

#endif

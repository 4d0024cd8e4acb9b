/* nn/: fused nodes, each a *_forward / *_backward pair on activations (row-major, FP32).
 * Nodes never touch a frozen weight matrix: the layer code calls proj/ for those. Frozen
 * vectors (norm weights, conv kernels) are inputs, never differentiated. Every pair has a
 * float64 finite-difference gradient test (tests/test_nn*.c).
 *
 * Shapes: T tokens; [T][n] means T rows of n floats. */
#ifndef NL_NN_H
#define NL_NN_H

#include <stdint.h>

/* ---- RMSNorm: y = w ⊙ x / sqrt(mean(x²) + eps), per row of n.
 * rstd[T] (1/ρ per row) is saved for backward; may be NULL. y may alias x. */
void nl_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int T, int n, float eps);
/* dx[T][n] = (overwritten). Needs the forward input x and rstd. */
void nl_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *w, const float *rstd, int T, int n);

/* ---- RoPE, in place on x[T][n_heads][head_dim] at positions pos[T].
 * neox = 0: rotate (2i, 2i+1) (llama NORM); neox = 1: (i, i + n_rot/2). Dims >= n_rot pass.
 * theta_i = pos * base^(-2i/n_rot) * freq_scale / freq_factors[i] (factors may be NULL). */
typedef struct {
    int head_dim, n_rot, neox;
    float base, freq_scale;
    const float *freq_factors; /* [n_rot/2] or NULL (borrowed) */
    /* Optional table of cos/sin for positions [0, tab_n) (nl_rope_table; owned): the same floats
     * rope_apply would compute, read instead of computed for every call. */
    float *tab_cos, *tab_sin;
    int tab_n;
} nl_rope;
/* Fill r's table for positions [0, n_pos) (a no-op when it already holds them). Not while
 * another thread applies r. 0 ok, -1 + nl_err (out of memory). */
int nl_rope_table(nl_rope *r, int n_pos);
void nl_rope_free_table(nl_rope *r);
void nl_rope_forward(const nl_rope *r, float *x, int T, int n_heads, const int32_t *pos);
void nl_rope_backward(const nl_rope *r, float *dx, int T, int n_heads, const int32_t *pos); /* rotation by -θ */

/* ---- Causal GQA attention, flash-style (O(T·d) memory, never a T×S matrix for all heads).
 * q[T][Hq][d]; k, v[S][Hkv][d] with S >= T: the first S-T keys are the past (KV cache); query
 * t attends to keys 0 .. S-T+t. Query head h uses kv head h / (Hq/Hkv).
 * out[T][Hq][d]; lse[T][Hq] = logsumexp of the scaled scores (saved for backward; may be NULL).
 * window > 0 (gemma3's sliding window) lets query t (at position S-T+t) see only keys j with
 * S-T+t − j < window; 0 = the whole causal prefix.
 * A call is one request (callers name its fields; what a call does not use stays 0): */
typedef struct {
    float *out, *lse;       /* written: out[T][Hq][d], lse[T][Hq] (may be NULL) */
    const float *q, *k, *v; /* q[T][Hq][d]; k, v[S][Hkv][d] */
    int T, S, Hq, Hkv, d;
    float scale; /* scores = scale · q·k */
    int window;  /* 0: none */
    int g0, g1;  /* the _range calls: kv heads [g0, g1) */
} nl_attn_fwd;
/* The self-attention backward (S == T) of a forward with the same q, k, v, shape, scale and
 * window: dq, dk, dv overwritten. */
typedef struct {
    float *dq, *dk, *dv;           /* written: [T][Hq][d], [T][Hkv][d], [T][Hkv][d] */
    const float *dout, *out, *lse; /* dLoss/dout, the forward's out and lse */
    const float *q, *k, *v;
    int T, Hq, Hkv, d;
    float scale;
    int window;
    int g0, g1; /* the _range calls: kv heads [g0, g1) */
} nl_attn_bwd;
/* Every call returns 0, or -1 with nl_err when its scratch cannot be had (out of memory: an error
 * the step reports, never NaN in the output). The whole calls: every kv head (g0, g1 unused). */
int nl_attention_forward(const nl_attn_fwd *a);
int nl_attention_backward(const nl_attn_bwd *a);
/* The same for kv heads [g0, g1) only (and their query heads g·Hq/Hkv ..): every output element
 * of those heads is written exactly as the whole call writes it, nothing else is touched, so
 * callers may split kv heads over threads with bit-identical results. */
int nl_attention_forward_range(const nl_attn_fwd *a);
int nl_attention_backward_range(const nl_attn_bwd *a);
/* The first query row a forward over keys [0, S) must run (q = rows [start, S) of the
 * sequence, T = S − start) so that its rows [P, S) are the bits the FP32 self-attention call
 * over all S rows (T = S) gives them: P, or a few rows before it where the short tail would
 * take the direct (decoding) scores. The shared-prefix forward (nn/layer.c: a choice's rows
 * after its prompt's) runs the FP32 call only. */
int nl_attention_tail_start(int P, int S);
/* 1 when the FP32 self-attention over the first P rows alone gives those rows the bits the
 * call over S > P rows gives them (both calls take the same scores: packed, or the direct ones
 * of a few rows), so that a prefix of P rows can be computed once for sequences of S rows. */
int nl_attention_prefix_rows(int P, int S);
/* BF16 variant of the two range calls (training's default compute path): the inputs of every
 * GEMM (Q, K, V, dO, P, dS) rounded to BF16 (nearest even), products accumulated in FP32; row
 * max, exp, Σ, lse, D and the scalings in FP32. Same structure and thread-split invariance as
 * the FP32 calls; results agree with them to BF16 accuracy (about 1e-2 of the magnitude), not
 * bit for bit. Where the CPU lacks AVX512_BF16 (checked at run time), or for decoding-size
 * query blocks, they ARE the FP32 calls. nl_attention_bf16_active() says which runs. */
int nl_attention_forward_range_bf16(const nl_attn_fwd *a);
int nl_attention_backward_range_bf16(const nl_attn_bwd *a);
int nl_attention_bf16_active(void);
/* The most per-thread scratch (nl_thread_scratch) one thread's attention over T rows of head
 * size d takes on any path (FP32, BF16, tiles; forward or backward, S = T): a thread's block
 * grows to it. */
uint64_t nl_attention_thread_bytes(int T, int d);
/* The same on the matrix engine's tiles (cpu/tiles.h; tl: cpu/amx.h's tile operations, real
 * or emulated): the FP32 calls' blocks and row steps (softmax, lse, D, the scalings in FP32)
 * with every GEMM a tile GEMM on BF16 operands (nearest even) accumulated in FP32. Same
 * thread-split invariance; agrees with the FP32 calls to BF16 accuracy. Decoding-size query
 * blocks (T <= 4) ARE the FP32 calls. */
struct nl_amx_tiles;
int nl_attention_forward_range_tiles(const struct nl_amx_tiles *tl, const nl_attn_fwd *a);
int nl_attention_backward_range_tiles(const struct nl_amx_tiles *tl, const nl_attn_bwd *a);

/* ---- SwiGLU: h = silu(a) ⊙ b, n elements. */
void nl_swiglu_forward(float *h, const float *a, const float *b, int64_t n);
void nl_swiglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n);

/* ---- GeGLU (gemma3): h = gelu(a) ⊙ b with the tanh GELU,
 * gelu(a) = a/2 · (1 + tanh(√(2/π) · (a + 0.044715 a³))) = a·σ(2√(2/π)(a + 0.044715 a³)), n elements. */
void nl_geglu_forward(float *h, const float *a, const float *b, int64_t n);
void nl_geglu_backward(float *da, float *db, const float *dh, const float *a, const float *b, int64_t n);

/* ---- Sigmoid output gate (qwen35 attention): out = o ⊙ σ(g). */
void nl_gate_forward(float *out, const float *o, const float *g, int64_t n);
void nl_gate_backward(float *d_o, float *dg, const float *dout, const float *o, const float *g, int64_t n);

/* ---- Softmax cross-entropy over one chunk of logits z[T][V]; targets[t] < 0 = not a target.
 * Returns the SUM of -log p(target) over targets. If want_grad, z is overwritten with
 * dz = (softmax(z) - onehot) * inv_n on target rows and 0 elsewhere. */
double nl_xent_chunk(float *z, const int32_t *targets, int T, int V, float inv_n, int want_grad);

#endif

/* nn/gdn: the gated delta-net layer core (Qwen3.5 linear attention) as ONE fused node:
 * causal depthwise conv + SiLU, per-head L2 norm of q/k, gates β = σ(b), g = A·softplus(a+dt),
 * the decay-then-delta recurrence with FP32 state, gated RMSNorm with z.
 * Facts: docs/formats.md §3 (GDN), docs/backward.md.
 * The projections around it (attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out) are proj/'s. */
#ifndef NL_GDN_H
#define NL_GDN_H

#include <stdint.h>

#include "util/arena.h"
#include "util/pool.h"

typedef struct {
    int Hk, Hv;   /* key heads (ssm.group_count), value heads (ssm.time_step_rank) */
    int dk, dv;   /* head dims */
    int K;        /* conv kernel */
    float eps;    /* rms_norm_eps (L2 norm and gated RMSNorm) */
    int kv_tiled; /* 1: v-head j uses k-head j % Hk (qwen35); 0: j / (Hv/Hk) (qwen3next) */
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
 * a[T][Hv] -> y[T][Hv*dv] (the input of ssm_out); y must not alias an input. state may be NULL
 * (start from zeros, and nothing is returned); otherwise it is read and updated, so calls on
 * consecutive pieces of a sequence give the same y as one call (bit for bit). T = 0 is a no-op.
 * Takes about 4*T*conv_dim bytes of scratch for the call (feed long prompts in pieces to
 * bound it), plus 4*(dk*dv + 3*dv) per thread, from ws (the pass's arena, released before it
 * returns; every call here takes one) or, ws NULL, the heap. pool may be NULL (one thread): the value heads
 * are split over its threads, each head's arithmetic as on one thread, so y and the state are
 * the same bits for any pool size. Cost O(T*Hv*dk*dv). */
int nl_gdn_forward(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                   const float *mixed, const float *z, const float *b, const float *a, int T, nl_gdn_state *state);

/* ---- Training (sequences start from the zero state; no incoming state).
 *
 * nl_gdn_forward_train computes the same y as nl_gdn_forward(state = NULL), bit for bit, and
 * saves into a cache what nl_gdn_backward needs:
 *   cpre[T][conv_dim]   the conv output before SiLU (q/k/v, their L2 norms and SiLU' are
 *                       recomputed from it; the conv backward needs only the kernel)
 *   z[T][Hv*dv]         the output-gate input
 *   beta, g, dgda[T][Hv] β = σ(b), g = A·softplus(a+dt_bias), dg/da = A·σ(a+dt_bias)
 *   S checkpoints       the FP32 state S[Hv][dk][dv] before tokens 16, 32, ..., i.e.
 *                       (T-1)/16 of them (the state before token 0 is zero and not stored)
 * The outputs o and the per-token states are NOT saved: backward takes the chunks last to
 * first, recomputes each one's u and o from its checkpoint in the chunked (WY) form, as small
 * matrix products over the chunk's 16 tokens, and carries dS (docs/backward.md). */
#define NL_GDN_CHUNK 16

typedef struct nl_gdn_cache nl_gdn_cache; /* opaque; one data allocation */

/* Bytes of the saved activations for T tokens (what a cache for T_max = T allocates for its
 * data, plus a fixed header of < 200 bytes): 4 * (T*(conv_dim + Hv*dv + 3*Hv)
 * + ((T-1)/16) * Hv*dk*dv). Returns 0 for an invalid shape, T < 1 or overflow. */
uint64_t nl_gdn_cache_bytes(const nl_gdn_shape *s, int T);
/* Transient heap bytes nl_gdn_backward allocates (and frees) on top of the cache, independent
 * of T. On one thread: 4 * ((Hv/Hk + 2)*dk*dv + 128*dk + 208*dv + K*conv_dim) (the carried
 * state gradients of a key head's value heads, a transposed checkpoint and gradient, a
 * chunk's rows, the transposed conv kernel); each further thread of the pool (up to Hk
 * threads) adds nl_gdn_backward_thread_bytes = 4 * ((Hv/Hk + 2)*dk*dv + 128*dk + 208*dv).
 * (About 14 KiB of 16×16 matrices live on the stack.) */
uint64_t nl_gdn_backward_work_bytes(const nl_gdn_shape *s);
uint64_t nl_gdn_backward_thread_bytes(const nl_gdn_shape *s);
/* The most arena bytes nl_gdn_forward_train (bwd 0) or nl_gdn_backward (bwd 1) takes from its
 * ws for T tokens, on any pool (its tasks bounded by the heads); 0 for an invalid shape. */
uint64_t nl_gdn_train_ws_bytes(const nl_gdn_shape *s, int T, int bwd);

/* A cache able to hold up to T_max tokens, from ws (the pass's arena: released with the mark
 * taken before the call, nl_gdn_cache_free then only forgets it) or, ws NULL, the heap (tests,
 * benchmarks); NULL + nl_err on failure. */
nl_gdn_cache *nl_gdn_cache_new(nl_arena *ws, const nl_gdn_shape *s, int T_max);
void nl_gdn_cache_free(nl_gdn_cache *c);
/* The arena bytes nl_gdn_cache_new(ws, s, T) takes (its header and data, rounded as the arena
 * rounds); 0 where nl_gdn_cache_bytes is 0. */
uint64_t nl_gdn_cache_arena_bytes(const nl_gdn_shape *s, int T);
/* Bytes of the cache's data allocation (== nl_gdn_cache_bytes(shape, T_max)). */
uint64_t nl_gdn_cache_size(const nl_gdn_cache *c);

/* As nl_gdn_forward from the zero state, saving into cache (T <= its T_max; shape must equal
 * the cache's). The inputs may be freed afterwards: the cache is self-contained. Scratch as
 * nl_gdn_forward (pool as there). */
int nl_gdn_forward_train(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w, float *y,
                         const float *mixed, const float *z, const float *b, const float *a, int T,
                         nl_gdn_cache *cache);

/* Backward of the last nl_gdn_forward_train on this cache (T must equal its T).
 * dy[T][Hv*dv] -> dmixed[T][conv_dim], dz[T][Hv*dv], db[T][Hv], da[T][Hv] (all overwritten).
 * Only w->conv and w->norm are read (the gate derivatives are in the cache). Frozen weights
 * get no gradient. Cost about 9 dk×dv state-sized products per 16 tokens and value head (about
 * 3x the forward's arithmetic, in matrix form). pool may be NULL: the key heads (each with its
 * value heads in order) are split over its threads, then the conv channels: the same bits for
 * any pool size. */
int nl_gdn_backward(nl_pool *pool, nl_arena *ws, const nl_gdn_shape *s, const nl_gdn_weights *w,
                    const nl_gdn_cache *cache, const float *dy, int T, float *dmixed, float *dz, float *db, float *da);

/* The recurrence's SIMD kernels (the forward's state update, the backward's matrix products,
 * SiLU and transposes) are the kernel table's gdn_* entries (cpu/kernels.h: AVX-512, AVX2, or
 * the portable C here), picked by its one dispatcher; they do the same multiplies and adds in
 * the same order as the portable C (no FMA), so every level gives the same bits (nl_cpu_use
 * chooses the level for tests and benchmarks). */

#endif

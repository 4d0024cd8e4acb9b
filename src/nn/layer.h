/* nn/layer: one layer definition per architecture (llama, qwen3, qwen35, gemma3), the only one: the
 * model forward (nn/forward: logits, generate, eval, with its KV cache / GDN state) and the
 * training graph (train/graph: saves, recompute, backward) both run their layers through it
 * (and their vocabulary head through nn/head, on the same pass).
 *
 *   xmid = x + mixer(attn_norm(x)),   x_out = xmid + down(swiglu(gate(h2), up(h2))),
 *   h2 = ffn_norm(xmid)
 *
 * gemma3: GeGLU for SwiGLU, each residual branch through its post-norm (xmid = x +
 * post_attn_norm(mixer(..)), x_out = xmid + post_ffw_norm(down(..))), sliding-window attention
 * with its own RoPE base on the local layers, queries scaled by hp.attn_scale.
 *
 * The mixer is attention (q/k norms where the model has them: qwen3, qwen35; qwen35's attn_q
 * carries an output gate, de-interleaved here) or, on qwen35's recurrent layers, the gated
 * delta-net. nl_layer_forward writes every intermediate into the layer's cache; the training
 * graph keeps it for nl_layer_backward (or drops it and calls the forward again: recompute),
 * inference lays out the same cache as the layer's temporaries. Formulas: docs/formats.md,
 * backward: docs/backward.md.
 *
 * Every frozen-weight product goes through the pass's proj hook (training: the service plus
 * its LoRA branch with dropout masks and gradients; inference: the service plus the adapter's
 * LoRA), the CPU nodes run on the runtime's pool (nn/par.h, the same bits on any pool) and
 * every temporary comes from the pass's arena, released before the call returns.
 *
 * Adding an architecture: its shape in nl_layer_cache_layout, its forward in
 * nl_layer_forward's mixer / MLP, the matching backward in nl_layer_backward, and its loader in
 * model/; nothing in train/ or eval/ changes.
 *
 * Token rows: a call covers the T rows of one sequence (nl_span). Every node but two is
 * row-wise (projections, norms, RoPE, gates, SwiGLU, adds); the sequence-local ones are the
 * attention core (with the KV cache) and the GDN recurrence (with its state / cache), each in
 * one function below. A span that packs several sequences adds their boundaries to nl_span
 * and splits only those two. */
#ifndef NL_LAYER_H
#define NL_LAYER_H

#include <stdint.h>

#include "model/adapter.h"
#include "model/model.h"
#include "nn/forward.h"
#include "nn/gdn.h"
#include "nn/prof.h"
#include "proj/proj.h"
#include "util/arena.h"
#include "util/util.h"

/* One request to a pass's projection hook: frozen projection p with its LoRA branch,
 *   NL_FWD: out[T][n_out] = in·Wᵀ + LoRA(in); u_save[T][r] receives LoRA's u (may be NULL);
 *   NL_BWD: out[T][n_in] = in·W + LoRA's dx, with in = dy, x and u_in the forward's input
 *           and saved u; the LoRA gradients accumulate. out == NULL: no input gradient,
 *           only the LoRA gradients.
 * Callers name the fields; what a direction does not use stays NULL. */
typedef struct {
    nl_dir dir;
    int layer, kind, p; /* layer l (the head: n_layer) and kind NL_P_*: the dropout key; p: model projection index */
    const float *in;    /* NL_FWD: x [T][n_in]; NL_BWD: dy [T][n_out] */
    const float *x;     /* NL_BWD: the forward's input [T][n_in] */
    float *u_save;      /* NL_FWD: LoRA's u [T][r] written here (may be NULL) */
    const float *u_in;  /* NL_BWD: the forward's saved u (NULL: recomputed) */
    /* NL_FWD: LoRA's dropout mask kept as bits here (nn/lora.h: mask_out, T rows; may be NULL);
     * NL_BWD: the forward's bits (mask_in; NULL, or u_in NULL: the mask regenerated) */
    uint16_t *mask_save;
    const uint16_t *mask_in;
    int T;
    /* each of the T rows' index in the pass's span (the head's gathered target rows keep their
     * LoRA dropout masks: nn/head.h); NULL: rows 0 .. T-1 (the layers) */
    const int64_t *rows;
    float *out;
} nl_pass_req;

/* One pass over the layers: what differs between inference and training. */
typedef struct nl_pass {
    nl_runtime *rt;                                /* borrowed */
    nl_arena *ws;                                  /* every temporary and cache of the pass (borrowed) */
    int (*proj)(void *user, const nl_pass_req *r); /* every frozen-weight product: 0 ok, -1 + nl_err */
    void *user;
    const nl_adapter *save_u;         /* the adapter whose LoRA u rows the cache keeps (NULL: none) */
    int save_gdn;                     /* recurrent layers keep the GDN cache for the backward */
    int save_mask;                    /* with save_u: the LoRA dropout masks' bits kept too (dropout > 0) */
    int attn_bf16;                    /* attention through nl_attention_*_range_bf16 */
    const struct nl_amx_tiles *tiles; /* non-NULL: attention through nl_attention_*_range_tiles */
    nl_graph_prof *prof;              /* NULL: no timing */
} nl_pass;

/* The token rows of one call: T rows at positions pos[T]; one sequence (n_seg <= 1) or
 * n_seg sequences packed back to back, seg_T[i] rows each (Σ seg_T = T; pos restarts at 0 in
 * each). Only the attention core and the GDN recurrence see the boundaries.
 * seg_pre (NULL: none; forward with no decoding state only, FP32 attention): seg_pre[i] = -1,
 * or the index p < i of a segment with seg_pre[p] = -1 whose rows come before segment i's as
 * a shared prefix: segment i continues sequence p (its positions from seg_T[p] on), attends
 * over p's rows and its own, and its recurrent layers start from p's state after p's rows; a
 * prefix's continuations follow it, nothing else between (nl_span_check). Each continuation's
 * rows are the bits of a forward of p's tokens followed by its own as one sequence. */
typedef struct {
    int T;
    const int32_t *pos;
    int n_seg;
    const int *seg_T;
    const int *seg_pre;
} nl_span;

/* 0 when sp's segments fit its rules above, else -1 + nl_err ("forward: ..."). */
int nl_span_check(const nl_span *sp);

/* Sequences in the span and the rows of sequence i. */
static inline int nl_span_n(const nl_span *sp) { return sp->n_seg > 1 ? sp->n_seg : 1; }
static inline int nl_span_len(const nl_span *sp, int i) { return sp->n_seg > 1 ? sp->seg_T[i] : sp->T; }

/* One layer's intermediates for T rows, carved out of one block. hn, hn2, h and, with qk-norm,
 * q and k are not kept: each is a temporary of the forward and of the backward, which
 * recomputes it (the same kernel on the same kept inputs: the same bits) from x_in, xmid,
 * g and u, qraw and kraw; only while one of them runs do they point at it. */
typedef struct {
    float *hn, *rstd1;                    /* attn_norm output [T][E] (not kept), 1/rms [T] */
    float *qraw, *rstd_q, *kraw, *rstd_k; /* q/k before their norms (qk-norm archs) */
    float *q, *k, *v;                     /* after norm + rope: [T][H][hd], [T][Hkv][hd] */
    float *gate;                          /* qwen35 output gate [T][H*hd] */
    float *o, *lse;                       /* attention output [T][H*hd], logsumexp [T][H] */
    float *og;                            /* input of attn_output (o ⊙ σ(gate), or o) */
    float *y;                             /* GDN output = input of ssm_out [T][Hv*dv] */
    nl_gdn_cache **gc;                    /* the GDN node's own caches, one per sequence of the
                                           * span (pass->save_gdn; n_gc of them) */
    int n_gc;
    float *ao, *rstd_ao, *fo, *rstd_fo; /* post-norms (gemma3): mixer and MLP outputs before
                                         * their norms, 1/rms [T] */
    float *xmid, *rstd2, *hn2;          /* after the mixer residual; ffn norm (hn2 not kept) */
    float *g, *u, *h;                   /* SwiGLU / GeGLU: gate, up, act(gate)*up [T][F] (h not kept) */
    float *lu[NL_P_KIND_COUNT];         /* LoRA u = A(m⊙x) per adapted projection [T][r] */
    uint16_t *lm[NL_P_KIND_COUNT];      /* its dropout mask's bits [T][nl_lora_mask_halves(n_in)] */
    float *base;
    uint64_t bytes;
} nl_layer_cache;

/* Bytes of layer l's cache for the span's rows (with LoRA u rows for adapter ad, may be NULL; with
 * the dropout masks' bits beside them when flags has NL_CACHE_MASK, pass->save_mask; with the GDN
 * caches, one per sequence, when flags has NL_CACHE_GDN): what the activation budget counts.
 * nl_layer_cache_bytes: one sequence of T rows. */
enum { NL_CACHE_GDN = 1, NL_CACHE_MASK = 2 };
uint64_t nl_layer_cache_bytes_span(const nl_runtime *rt, const nl_adapter *ad, int flags, int l, const nl_span *sp);
uint64_t nl_layer_cache_bytes(const nl_runtime *rt, const nl_adapter *ad, int flags, int l, int T);

/* What a pass's projection hook takes from ps->ws for one request of T rows to projection p in
 * direction dir (the training graph: its LoRA branch's output and scratch). */
typedef uint64_t (*nl_proj_temp_fn)(void *user, nl_dir dir, int p, int T);
/* The most arena bytes layer l's forward (bwd 0) or backward (bwd 1) over T rows takes from
 * ps->ws on top of its cache (every temporary as nl_layer_forward / nl_layer_backward size
 * it, rounded as the arena rounds, the hook's per request from proj_temp, may be NULL: none):
 * what the training graph's peak bound adds to a layer's cache (tests/test_graph.c checks it
 * against the arena's measured peak). */
uint64_t nl_layer_temp_bytes(const nl_runtime *rt, int l, int T, int bwd, nl_proj_temp_fn proj_temp, void *user);

/* Lay out layer l's cache for the span's rows in ps->ws (released with the arena mark taken
 * before the call; nl_layer_cache_free first). 0 ok, -1 + nl_err. */
int nl_layer_cache_alloc(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c);
void nl_layer_cache_free(nl_layer_cache *c);

/* x_out[T][E] = layer l (x_in), the intermediates into c (from nl_layer_cache_alloc). st: the
 * decoding state (KV rows written at st->n_past.., attention over the cache, the GDN state
 * carried; the caller advances n_past; one sequence only) or NULL (fresh sequences). x_out may
 * be x_in. */
int nl_layer_forward(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, nl_seq_state *st, const float *x_in,
                     float *x_out);

/* The backward of a forward with st == NULL whose cache c is intact: dx holds dLoss/dx_out and
 * receives dLoss/dx_in; with want_dx == 0 (layer 0: nothing trainable below) the mixer's input
 * gradient is not formed (no BWD requests for its input projections, only their LoRA
 * gradients) and dx is left as it is. */
int nl_layer_backward(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, const float *x_in, float *dx,
                      int want_dx);

#endif

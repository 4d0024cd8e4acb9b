/* nn/par: the CPU nodes of nn.h on a thread pool, split over outputs (rows, elements or kv
 * heads). Each thread gets a contiguous range and runs the node's serial code on it, so every
 * output element is computed exactly as one thread computes it: the results do not depend on
 * the pool or its size. pool may be NULL (one thread). Small calls (under ~32 K cost units)
 * stay on the calling thread. */
#ifndef NL_PAR_H
#define NL_PAR_H

#include <stdint.h>

#include "nn/nn.h"
#include "util/pool.h"

/* Run fn(job, i0, i1) over [0, len) in ranges that are multiples of grain; on the pool when
 * the work (len · cost units) is worth a hand-off. */
typedef void (*nl_par_fn)(void *job, int64_t i0, int64_t i1);
void nl_par_run(nl_pool *pool, nl_par_fn fn, void *job, int64_t len, int64_t grain, int64_t work);

/* RMSNorm over T rows of n (rows split). */
void nl_par_rmsnorm_forward(nl_pool *pool, float *y, float *rstd, const float *x, const float *w, int T, int n,
                            float eps);
void nl_par_rmsnorm_backward(nl_pool *pool, float *dx, const float *dy, const float *x, const float *w,
                             const float *rstd, int T, int n);
/* RoPE of x[T][heads][head_dim] (rows split); bwd = 1: the backward (rotation by -θ). */
void nl_par_rope(nl_pool *pool, const nl_rope *r, int bwd, float *x, int T, int heads, const int32_t *pos);
/* The attention's q/k norm and RoPE in one pass over the tokens (rows split by token; each
 * token's rows normed, then rotated, while they are in cache): forward y = rope(rmsnorm(x)),
 * rstd[T·heads]; backward dx = rmsnorm_bwd(rope_bwd(dy)) in place (dx may alias dy). The same
 * bits as the two calls one after the other: every token's outputs are its own. */
void nl_par_norm_rope_forward(nl_pool *pool, const nl_rope *r, float *y, float *rstd, const float *x, const float *w,
                              int T, int heads, float eps, const int32_t *pos);
void nl_par_norm_rope_backward(nl_pool *pool, const nl_rope *r, float *dx, const float *dy, const float *x,
                               const float *w, const float *rstd, int T, int heads, const int32_t *pos);
/* Element-wise nodes over n elements (split in blocks of 64). */
void nl_par_swiglu_forward(nl_pool *pool, float *h, const float *a, const float *b, int64_t n);
void nl_par_swiglu_backward(nl_pool *pool, float *da, float *db, const float *dh, const float *a, const float *b,
                            int64_t n);
void nl_par_geglu_forward(nl_pool *pool, float *h, const float *a, const float *b, int64_t n);
void nl_par_geglu_backward(nl_pool *pool, float *da, float *db, const float *dh, const float *a, const float *b,
                           int64_t n);
void nl_par_gate_forward(nl_pool *pool, float *out, const float *o, const float *g, int64_t n);
void nl_par_gate_backward(nl_pool *pool, float *d_o, float *dg, const float *dout, const float *o, const float *g,
                          int64_t n);
void nl_par_add(nl_pool *pool, float *y, const float *x, int64_t n);                  /* y += x */
void nl_par_add2(nl_pool *pool, float *y, const float *a, const float *b, int64_t n); /* y = a + b */
/* Attention (kv heads split): nl_attention_forward_range / _backward_range over every kv head
 * (a->g0, a->g1 unused), their tile variants when tiles (nn.h; cpu/amx.h's tile operations),
 * else their BF16 variants when bf16. */
struct nl_amx_tiles;
int nl_par_attention_forward(nl_pool *pool, int bf16, const struct nl_amx_tiles *tiles, const nl_attn_fwd *a);
int nl_par_attention_backward(nl_pool *pool, int bf16, const struct nl_amx_tiles *tiles, const nl_attn_bwd *a);
/* Cross-entropy of each row of z[T][V] on its own (rows split): row_loss[t] =
 * nl_xent_chunk(row t) (0 for a row without a target); with want_grad z becomes dz. */
void nl_par_xent_rows(nl_pool *pool, double *row_loss, float *z, const int32_t *targets, int T, int V, float inv_n,
                      int want_grad);

#endif

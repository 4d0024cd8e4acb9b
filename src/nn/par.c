/* The CPU nodes on a pool; see par.h. One job struct and one range function per node. */
#include "nn/par.h"

#include <stddef.h>
#include <string.h>

#include "cpu/kernels.h"
#include "util/util.h"

typedef struct {
    nl_par_fn fn;
    void *job;
    int64_t len, grain;
} par_call;

static void par_task(void *arg, int task, int n_tasks) {
    const par_call *c = arg;
    const int64_t nb = (c->len + c->grain - 1) / c->grain;
    const int64_t b0 = nb * task / n_tasks, b1 = nb * (task + 1) / n_tasks;
    const int64_t i0 = b0 * c->grain, i1 = b1 * c->grain < c->len ? b1 * c->grain : c->len;
    if (i0 < i1) c->fn(c->job, i0, i1);
}

void nl_par_run(nl_pool *pool, nl_par_fn fn, void *job, int64_t len, int64_t grain, int64_t work) {
    if (!pool || work < 32768 || len <= grain) {
        fn(job, 0, len);
        return;
    }
    par_call c = {.fn = fn, .job = job, .len = len, .grain = grain};
    nl_pool_run(pool, nl_pool_size(pool), par_task, &c);
}

/* ---- RMSNorm ---- */

typedef struct {
    float *y, *rstd;
    const float *x, *w;
    int n;
    float eps;
} norm_f_job;

static void norm_f_range(void *arg, int64_t i0, int64_t i1) {
    const norm_f_job *j = arg;
    const int64_t n = j->n;
    nl_rmsnorm_forward(j->y + i0 * n, j->rstd ? j->rstd + i0 : NULL, j->x + i0 * n, j->w, (int)(i1 - i0), j->n, j->eps);
}

void nl_par_rmsnorm_forward(nl_pool *pool, float *y, float *rstd, const float *x, const float *w, int T, int n,
                            float eps) {
    norm_f_job j = {.y = y, .rstd = rstd, .x = x, .w = w, .n = n, .eps = eps};
    nl_par_run(pool, norm_f_range, &j, T, 1, (int64_t)T * n);
}

typedef struct {
    float *dx;
    const float *dy, *x, *w, *rstd;
    int n;
} norm_b_job;

static void norm_b_range(void *arg, int64_t i0, int64_t i1) {
    const norm_b_job *j = arg;
    const int64_t n = j->n;
    nl_rmsnorm_backward(j->dx + i0 * n, j->dy + i0 * n, j->x + i0 * n, j->w, j->rstd + i0, (int)(i1 - i0), j->n);
}

void nl_par_rmsnorm_backward(nl_pool *pool, float *dx, const float *dy, const float *x, const float *w,
                             const float *rstd, int T, int n) {
    norm_b_job j = {.dx = dx, .dy = dy, .x = x, .w = w, .rstd = rstd, .n = n};
    nl_par_run(pool, norm_b_range, &j, T, 1, (int64_t)T * n);
}

/* ---- RoPE ---- */

typedef struct {
    const nl_rope *r;
    float *x;
    int heads, bwd;
    const int32_t *pos;
} rope_job;

static void rope_range(void *arg, int64_t i0, int64_t i1) {
    const rope_job *j = arg;
    float *x = j->x + i0 * j->heads * j->r->head_dim;
    if (j->bwd) nl_rope_backward(j->r, x, (int)(i1 - i0), j->heads, j->pos + i0);
    else nl_rope_forward(j->r, x, (int)(i1 - i0), j->heads, j->pos + i0);
}

void nl_par_rope(nl_pool *pool, const nl_rope *r, int bwd, float *x, int T, int heads, const int32_t *pos) {
    rope_job j = {.r = r, .x = x, .heads = heads, .bwd = bwd, .pos = pos};
    nl_par_run(pool, rope_range, &j, T, 1, (int64_t)T * heads * r->head_dim);
}

/* ---- q/k norm + RoPE, by token ---- */

typedef struct {
    const nl_rope *r;
    float *y, *rstd;
    const float *x, *w, *dy;
    int heads;
    float eps;
    const int32_t *pos;
} norm_rope_job;

#define NORM_ROPE_TOKENS 8 /* tokens per pass: 8 · 16 heads · 128 floats = 64 KiB of q */

static void norm_rope_f_range(void *arg, int64_t t0, int64_t t1) {
    const norm_rope_job *j = arg;
    const int hd = j->r->head_dim;
    for (int64_t a = t0; a < t1; a += NORM_ROPE_TOKENS) {
        const int nt = (int)(t1 - a < NORM_ROPE_TOKENS ? t1 - a : NORM_ROPE_TOKENS);
        const int64_t o = a * j->heads * hd;
        nl_rmsnorm_forward(j->y + o, j->rstd + a * j->heads, j->x + o, j->w, nt * j->heads, hd, j->eps);
        nl_rope_forward(j->r, j->y + o, nt, j->heads, j->pos + a);
    }
}

static void norm_rope_b_range(void *arg, int64_t t0, int64_t t1) {
    const norm_rope_job *j = arg;
    const int hd = j->r->head_dim;
    for (int64_t a = t0; a < t1; a += NORM_ROPE_TOKENS) {
        const int nt = (int)(t1 - a < NORM_ROPE_TOKENS ? t1 - a : NORM_ROPE_TOKENS);
        const int64_t o = a * j->heads * hd;
        float *dx = j->y + o;
        if (dx != j->dy + o) memcpy(dx, j->dy + o, sizeof(float) * (size_t)nt * (size_t)j->heads * (size_t)hd);
        nl_rope_backward(j->r, dx, nt, j->heads, j->pos + a);
        nl_rmsnorm_backward(dx, dx, j->x + o, j->w, j->rstd + a * j->heads, nt * j->heads, hd);
    }
}

void nl_par_norm_rope_forward(nl_pool *pool, const nl_rope *r, float *y, float *rstd, const float *x, const float *w,
                              int T, int heads, float eps, const int32_t *pos) {
    norm_rope_job j = {.r = r, .y = y, .rstd = rstd, .x = x, .w = w, .heads = heads, .eps = eps, .pos = pos};
    nl_par_run(pool, norm_rope_f_range, &j, T, 1, (int64_t)T * heads * r->head_dim);
}

void nl_par_norm_rope_backward(nl_pool *pool, const nl_rope *r, float *dx, const float *dy, const float *x,
                               const float *w, const float *rstd, int T, int heads, const int32_t *pos) {
    norm_rope_job j = {.r = r, .y = dx, .rstd = (float *)rstd, .x = x, .w = w, .dy = dy, .heads = heads, .pos = pos};
    nl_par_run(pool, norm_rope_b_range, &j, T, 1, (int64_t)T * heads * r->head_dim);
}

/* ---- element-wise nodes: y (and y2) from a, b (and c) ---- */

/* Two inputs to one output forward, one output gradient to two input gradients backward: the
 * GLUs (swiglu, geglu) and the output gate share these shapes, so one job runs each. */
typedef void (*elem_fwd_fn)(float *y, const float *a, const float *b, int64_t n);
typedef void (*elem_bwd_fn)(float *da, float *db, const float *dy, const float *a, const float *b, int64_t n);

typedef struct {
    float *y, *y2;
    const float *a, *b, *c;
    elem_fwd_fn fwd;
    elem_bwd_fn bwd;
} elem_job;

#define ELEM_GRAIN 64

static void elem_f_range(void *arg, int64_t i0, int64_t i1) {
    const elem_job *j = arg;
    j->fwd(j->y + i0, j->a + i0, j->b + i0, i1 - i0);
}
static void elem_b_range(void *arg, int64_t i0, int64_t i1) {
    const elem_job *j = arg;
    j->bwd(j->y + i0, j->y2 + i0, j->c + i0, j->a + i0, j->b + i0, i1 - i0);
}
static void elem_forward(nl_pool *pool, elem_fwd_fn fn, float *y, const float *a, const float *b, int64_t n) {
    elem_job j = {.y = y, .a = a, .b = b, .fwd = fn};
    nl_par_run(pool, elem_f_range, &j, n, ELEM_GRAIN, n);
}
static void elem_backward(nl_pool *pool, elem_bwd_fn fn, float *da, float *db, const float *dy, const float *a,
                          const float *b, int64_t n) {
    elem_job j = {.y = da, .y2 = db, .a = a, .b = b, .c = dy, .bwd = fn};
    nl_par_run(pool, elem_b_range, &j, n, ELEM_GRAIN, n);
}

void nl_par_swiglu_forward(nl_pool *pool, float *h, const float *a, const float *b, int64_t n) {
    elem_forward(pool, nl_swiglu_forward, h, a, b, n);
}
void nl_par_swiglu_backward(nl_pool *pool, float *da, float *db, const float *dh, const float *a, const float *b,
                            int64_t n) {
    elem_backward(pool, nl_swiglu_backward, da, db, dh, a, b, n);
}
void nl_par_geglu_forward(nl_pool *pool, float *h, const float *a, const float *b, int64_t n) {
    elem_forward(pool, nl_geglu_forward, h, a, b, n);
}
void nl_par_geglu_backward(nl_pool *pool, float *da, float *db, const float *dh, const float *a, const float *b,
                           int64_t n) {
    elem_backward(pool, nl_geglu_backward, da, db, dh, a, b, n);
}
void nl_par_gate_forward(nl_pool *pool, float *out, const float *o, const float *g, int64_t n) {
    elem_forward(pool, nl_gate_forward, out, o, g, n);
}
void nl_par_gate_backward(nl_pool *pool, float *d_o, float *dg, const float *dout, const float *o, const float *g,
                          int64_t n) {
    elem_backward(pool, nl_gate_backward, d_o, dg, dout, o, g, n);
}

static void add_range(void *arg, int64_t i0, int64_t i1) {
    const elem_job *j = arg;
    nl_cpu_kernels()->vec->add(j->y + i0, j->a + i0, i1 - i0);
}
void nl_par_add(nl_pool *pool, float *y, const float *x, int64_t n) {
    elem_job j = {.y = y, .a = x};
    nl_par_run(pool, add_range, &j, n, ELEM_GRAIN, n);
}

static void add2_range(void *arg, int64_t i0, int64_t i1) {
    const elem_job *j = arg;
    nl_cpu_kernels()->vec->add2(j->y + i0, j->a + i0, j->b + i0, i1 - i0);
}
void nl_par_add2(nl_pool *pool, float *y, const float *a, const float *b, int64_t n) {
    elem_job j = {.y = y, .a = a, .b = b};
    nl_par_run(pool, add2_range, &j, n, ELEM_GRAIN, n);
}

/* ---- attention, split over kv heads ---- */

typedef struct {
    const nl_attn_fwd *a; /* the whole call (its g0, g1 unused) */
    int bf16;
    const struct nl_amx_tiles *tiles;
    int failed; /* a range ran out of memory for its scratch (its thread's nl_err) */
} attn_f_job;

static void attn_f_range(void *arg, int64_t g0, int64_t g1) {
    attn_f_job *j = arg;
    nl_attn_fwd r = *j->a;
    r.g0 = (int)g0, r.g1 = (int)g1;
    int rc;
    if (j->tiles) rc = nl_attention_forward_range_tiles(j->tiles, &r);
    else rc = (j->bf16 ? nl_attention_forward_range_bf16 : nl_attention_forward_range)(&r);
    if (rc) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int nl_par_attention_forward(nl_pool *pool, int bf16, const struct nl_amx_tiles *tiles, const nl_attn_fwd *a) {
    attn_f_job j = {.a = a, .bf16 = bf16, .tiles = tiles};
    nl_par_run(pool, attn_f_range, &j, a->Hkv, 1, (int64_t)a->T * a->S * a->Hq * a->d);
    return j.failed ? nl_err("attention forward: out of memory for scratch (d = %d, S = %d)", a->d, a->S) : 0;
}

typedef struct {
    const nl_attn_bwd *a; /* the whole call (its g0, g1 unused) */
    int bf16;
    const struct nl_amx_tiles *tiles;
    int failed;
} attn_b_job;

static void attn_b_range(void *arg, int64_t g0, int64_t g1) {
    attn_b_job *j = arg;
    nl_attn_bwd r = *j->a;
    r.g0 = (int)g0, r.g1 = (int)g1;
    int rc;
    if (j->tiles) rc = nl_attention_backward_range_tiles(j->tiles, &r);
    else rc = (j->bf16 ? nl_attention_backward_range_bf16 : nl_attention_backward_range)(&r);
    if (rc) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int nl_par_attention_backward(nl_pool *pool, int bf16, const struct nl_amx_tiles *tiles, const nl_attn_bwd *a) {
    attn_b_job j = {.a = a, .bf16 = bf16, .tiles = tiles};
    nl_par_run(pool, attn_b_range, &j, a->Hkv, 1, (int64_t)a->T * a->T * a->Hq * a->d);
    return j.failed ? nl_err("attention backward: out of memory for scratch (d = %d, T = %d)", a->d, a->T) : 0;
}

/* ---- cross-entropy, row by row ---- */

typedef struct {
    double *row_loss;
    float *z;
    const int32_t *targets;
    int V, want_grad;
    float inv_n;
} xent_job;

static void xent_range(void *arg, int64_t t0, int64_t t1) {
    const xent_job *j = arg;
    for (int64_t t = t0; t < t1; t++)
        j->row_loss[t] = nl_xent_chunk(j->z + t * j->V, j->targets + t, 1, j->V, j->inv_n, j->want_grad);
}

void nl_par_xent_rows(nl_pool *pool, double *row_loss, float *z, const int32_t *targets, int T, int V, float inv_n,
                      int want_grad) {
    xent_job j = {.row_loss = row_loss, .z = z, .targets = targets, .V = V, .want_grad = want_grad, .inv_n = inv_n};
    nl_par_run(pool, xent_range, &j, T, 1, (int64_t)T * V);
}

/* The training graph; see graph.h. Backward formulas: docs/backward.md. */
#include "train/graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gdn.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "nn/par.h"
#include "train/budget.h"
#include "util/arena.h"
#include "util/util.h"

/* ---- scratch: one arena a call (util/arena.h) ----
 * Every buffer of a call (layer inputs, layer caches, temporaries, head logits) comes from it;
 * they are strictly nested (a layer's temporaries on top of its cache; kept caches released in
 * reverse layer order by the backward). With g->keep_scratch the blocks survive the call (no
 * page faults and no zeroing of fresh pages on the next step); nl_graph_free releases them. */
static nl_arena *ws_of(nl_graph *g) {
    if (!g->ws) g->ws = nl_calloc(1, sizeof(nl_arena));
    return g->ws;
}

void nl_graph_free(nl_graph *g) {
    if (!g->ws) return;
    nl_arena_free(g->ws);
    free(g->ws);
    g->ws = NULL;
}

static float *falloc(nl_graph *g, size_t n) { return nl_arena_floats(g->ws, n); }

/* ---- CPU nodes on the runtime's pool (nn/par.h) ---- */
#define POOL(g) ((g)->rt->pool)

/* ---- one layer's saved intermediates, carved out of one block ---- */
typedef struct {
    float *hn, *rstd1;                 /* attn_norm output [T][E], 1/rms [T] */
    float *qraw, *rstd_q, *kraw, *rstd_k; /* q/k before their norms (qk-norm archs) */
    float *q, *k, *v;                  /* after norm + rope: [T][H][hd], [T][Hkv][hd] */
    float *gate;                       /* qwen35 output gate [T][H*hd] */
    float *o, *lse;                    /* attention output [T][H*hd], logsumexp [T][H] */
    float *og;                         /* input of attn_output (o ⊙ σ(gate), or o) */
    float *y;                          /* GDN output = input of ssm_out [T][Hv*dv] */
    nl_gdn_cache *gc;
    float *xmid, *rstd2, *hn2;         /* after the mixer residual; ffn norm */
    float *g, *u, *h;                  /* SwiGLU: gate, up, silu(gate)*up [T][F] */
    float *lu[NL_P_KIND_COUNT];        /* LoRA u = A(m⊙x) per projection [T][r] */
    float *base;
    uint64_t bytes;
} layer_cache;

/* Bump allocation over one block; with base == NULL it only counts. */
static float *carve(layer_cache *c, size_t n) {
    float *p = c->base ? (float *)((char *)c->base + c->bytes) : NULL;
    c->bytes += (n * sizeof(float) + 63) & ~(uint64_t)63;
    return p;
}

static int lora_rank(const nl_graph *g, int p) {
    if (p < 0) return 0;
    int e = g->ad->by_proj[p];
    return e >= 0 ? g->ad->t[e].rank : 0;
}

/* Lay out (or count) layer l's cache for T tokens. The GDN cache is separate (its own node). */
static void cache_layout(const nl_graph *g, int l, int T, layer_cache *c) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t E = hp->n_embd, F = hp->n_ff, t = (size_t)T;
    c->bytes = 0;
    c->hn = carve(c, t * E);
    c->rstd1 = carve(c, t);
    if (L->recurrent) {
        c->y = carve(c, t * (size_t)hp->ssm_d_inner);
    } else {
        size_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
        if (L->q_norm) {
            c->qraw = carve(c, t * H * hd);
            c->rstd_q = carve(c, t * H);
            c->kraw = carve(c, t * Hkv * hd);
            c->rstd_k = carve(c, t * Hkv);
        }
        c->q = carve(c, t * H * hd);
        c->k = carve(c, t * Hkv * hd);
        c->v = carve(c, t * Hkv * hd);
        if (m->arch == NL_ARCH_QWEN35) {
            c->gate = carve(c, t * H * hd);
            c->og = carve(c, t * H * hd);
        }
        c->o = carve(c, t * H * hd);
        c->lse = carve(c, t * H);
        if (m->arch != NL_ARCH_QWEN35) c->og = c->o;
    }
    c->xmid = carve(c, t * E);
    c->rstd2 = carve(c, t);
    c->hn2 = carve(c, t * E);
    c->g = carve(c, t * F);
    c->u = carve(c, t * F);
    c->h = carve(c, t * F);
    for (int k = 0; k < NL_P_KIND_COUNT; k++) {
        int r = lora_rank(g, L->p[k]);
        c->lu[k] = r ? carve(c, t * (size_t)r) : NULL;
    }
}

uint64_t nl_graph_layer_bytes(const nl_graph *g, int layer, int T) {
    layer_cache c = {0};
    cache_layout(g, layer, T, &c);
    uint64_t b = c.bytes;
    if (g->rt->m->layers[layer].recurrent) b += nl_gdn_cache_bytes(&g->rt->gdn, T);
    return b;
}

/* The cache lives in the arena: it is released with the arena mark taken before it. */
static int cache_alloc(nl_graph *g, int l, int T, layer_cache *c) {
    memset(c, 0, sizeof *c);
    cache_layout(g, l, T, c);
    uint64_t bytes = c->bytes;
    c->base = nl_arena_alloc(g->ws, bytes);
    if (!c->base) return -1;
    cache_layout(g, l, T, c);
    if (g->rt->m->layers[l].recurrent) {
        c->gc = nl_gdn_cache_new(&g->rt->gdn, T);
        if (!c->gc) { c->base = NULL; return -1; }
    }
    return 0;
}

static void cache_free(layer_cache *c) {
    if (c->gc) nl_gdn_cache_free(c->gc);
    memset(c, 0, sizeof *c);
}

/* ---- timing (bench step) ---- */

static const char *const prof_names[NL_GP_COUNT] = {"wait", "lora_fwd", "lora_bwd", "attn_fwd", "attn_bwd", "norm",
                                                     "rope", "act", "xent", "add", "other"};
const char *nl_graph_prof_name(int k) { return k >= 0 && k < NL_GP_COUNT ? prof_names[k] : "?"; }

static double tic(const nl_graph *g) { return g->prof ? nl_now() : 0.0; }
/* Charges the time since t0 to class k; returns now (the next interval's start). */
static double toc(nl_graph *g, int k, double t0) {
    if (!g->prof) return 0.0;
    double t = nl_now();
    g->prof->s[k] += t - t0;
    return t;
}


/* ---- projections with their LoRA branch ---- */

/* The LoRA node's view of adapter entry e, with its dropout key for (layer, kind). */
static nl_lora lora_of(const nl_graph *g, int e, int layer, int kind) {
    const nl_lora_tensor *t = &g->ad->t[e];
    return (nl_lora){.n_in = (int)t->n_in, .n_out = (int)t->n_out, .rank = t->rank,
                     .scale = nl_adapter_scale(g->ad, e), .dropout = g->dropout,
                     .key = nl_lora_dropout_key(g->seed, (uint64_t)g->step, layer, kind)};
}

/* The LoRA branch of one projection as pool tasks (nn/lora.h's split API). Phase 0: FWD rows
 * or BWD rows (dx, du, s·u, x ⊙ m), split by token rows; phase 1 (BWD, after every row of
 * phase 0): dA's columns and dB's rows, split by those lines, each a chain over all tokens. So
 * every output element is computed exactly as one thread computes it. */
#define LORA_MAX_TASKS 64
typedef struct {
    const nl_lora *L;
    const float *A, *B;
    nl_dir dir;
    int phase, T;
    float *out, *u_save, *dA, *dB, *scr;
    const float *in, *x, *u_in;
    int64_t tok0;
    const int64_t *toks;
    int rc[LORA_MAX_TASKS];
} lora_job;

static void lora_task(void *arg, int task, int n_tasks) {
    lora_job *j = arg;
    if (j->phase == 1) {
        const int64_t J = (int64_t)j->L->n_in + j->L->n_out;
        nl_lora_backward_params(j->L, j->dA, j->dB, j->in, j->x, j->T, j->scr, (int)(J * task / n_tasks),
                                (int)(J * (task + 1) / n_tasks));
        return;
    }
    const int t0 = (int)((int64_t)j->T * task / n_tasks), t1 = (int)((int64_t)j->T * (task + 1) / n_tasks);
    if (t0 >= t1) return;
    if (j->dir == NL_FWD)
        j->rc[task] = nl_lora_forward_rows(j->L, j->A, j->B, j->out, j->u_save, j->in, j->tok0, j->toks, 0, t0, t1);
    else
        j->rc[task] = nl_lora_backward_rows(j->L, j->A, j->B, j->out, 0, j->in, j->x, j->u_in, j->T, j->tok0, j->toks, j->scr,
                                            t0, t1);
}

/* On the pool only in synchronous mode (the service is idle then; while a request is in
 * flight its threads own the cores) and when the branch is worth the hand-off. */
static int lora_run(nl_graph *g, lora_job *j) {
    nl_pool *p = g->rt->pool;
    const int64_t work = (int64_t)j->T * j->L->rank * ((int64_t)j->L->n_in + j->L->n_out);
    int n = p && g->rt->sync && work >= 32768 && j->T >= 2 ? nl_pool_size(p) : 1;
    if (n > LORA_MAX_TASKS) n = LORA_MAX_TASKS;
    if (n > 1) g->n_lora_pool++;
    for (int phase = 0; phase < (j->dir == NL_BWD ? 2 : 1); phase++) {
        j->phase = phase;
        memset(j->rc, 0, sizeof j->rc);
        if (n > 1) nl_pool_run(p, n, lora_task, j);
        else lora_task(j, 0, 1);
        for (int i = 0; i < n; i++)
            if (j->rc[i]) /* the task's message is in its own thread's error slot */
                return n > 1 ? nl_err("lora %s: a pool task failed (out of memory for scratch?)", j->dir == NL_FWD ? "forward" : "backward")
                             : -1;
    }
    return 0;
}

/* One frozen projection with its LoRA branch, in either direction:
 *   NL_FWD: out[T][N] = in·Wᵀ + LoRA(in); u_save[T][r] receives the LoRA u (when adapted).
 *   NL_BWD: out[T][K] = in·W + LoRA's dx, with in = dy; x and u_in are the forward's input and
 *           saved u; the LoRA gradients accumulate into g->grads.
 * toks: the token index of each row for the dropout masks (NULL: g->tok_base + row).
 * NL_BWD with out == NULL: no input gradient wanted (layer 0's mixer inputs): no service
 * request, only the LoRA gradients.
 * The LoRA branch runs on this thread while the base product is in flight, or after it on the
 * runtime's pool when rt->sync, into its own buffer (the service is writing `out`); it is
 * added after the wait. */
static int tproj(nl_graph *g, nl_dir dir, int layer, int kind, int p, const float *in, const float *x,
                 float *u_save, const float *u_in, int T, float *out, const int64_t *toks) {
    nl_runtime *rt = g->rt;
    int e = g->ad->by_proj[p];
    double t = tic(g);
    const int base = out != NULL;
    if (base && (nl_rt_pace(rt) || nl_proj_submit(rt->svc, rt->svc_id[p], dir, in, T, out))) return -1;
    if (base && g->prof) g->prof->requests++;
    int rc = 0;
    if (rt->sync && base) {
        t = toc(g, NL_GP_OTHER, t);
        rc = nl_proj_wait(rt->svc);
        t = toc(g, NL_GP_WAIT, t);
    }
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *lo = NULL;
    size_t n = 0;
    if (e >= 0 && rc == 0) {
        nl_lora L = lora_of(g, e, layer, kind);
        n = (size_t)T * (size_t)(dir == NL_FWD ? L.n_out : L.n_in);
        lo = base ? falloc(g, n) : NULL;
        float *scr = dir == NL_BWD ? falloc(g, nl_lora_bwd_scratch_floats(&L, T)) : NULL;
        t = toc(g, NL_GP_OTHER, t);
        if ((base && !lo) || (dir == NL_BWD && !scr)) {
            rc = -1;
        } else {
            lora_job j = {.L = &L, .A = nl_lora_A(g->ad, e), .B = nl_lora_B(g->ad, e), .dir = dir, .T = T, .out = lo,
                          .u_save = u_save, .in = in, .x = x, .u_in = u_in, .tok0 = g->tok_base, .toks = toks, .scr = scr,
                          .dA = g->grads + g->ad->t[e].off_a, .dB = g->grads + g->ad->t[e].off_b};
            rc = lora_run(g, &j);
        }
        t = toc(g, dir == NL_FWD ? NL_GP_LORA_FWD : NL_GP_LORA_BWD, t);
    }
    if (!rt->sync && base) {
        t = toc(g, NL_GP_OTHER, t);
        if (nl_proj_wait(rt->svc)) rc = -1;
        t = toc(g, NL_GP_WAIT, t);
    }
    if (rc == 0 && lo) nl_par_add(POOL(g), out, lo, n);
    nl_arena_release(g->ws, mk);
    toc(g, NL_GP_ADD, t);
    return rc;
}

static int tproj_fwd(nl_graph *g, int layer, int kind, int p, const float *x, int T, float *y, float *u_save) {
    return tproj(g, NL_FWD, layer, kind, p, x, NULL, u_save, NULL, T, y, NULL);
}

static int tproj_bwd(nl_graph *g, int layer, int kind, int p, const float *dy, const float *x, const float *u, int T, float *dx) {
    return tproj(g, NL_BWD, layer, kind, p, dy, x, NULL, u, T, dx, NULL);
}

#define TIMED(g, k, stmt)          \
    do {                           \
        double t_ = tic(g);        \
        stmt;                      \
        toc((g), (k), t_);         \
    } while (0)

/* ---- layer forward (saving into c) and backward ---- */

static int mixer_attn_fwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, float *out) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    size_t qn = (size_t)T * H * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    float *qdst = L->q_norm ? c->qraw : c->q, *kdst = L->q_norm ? c->kraw : c->k;
    if (gated) {
        nl_arena_mark mk = nl_arena_top(g->ws);
        float *qg = falloc(g, 2 * qn);
        if (!qg) return -1;
        if (tproj_fwd(g, l, NL_P_Q, L->p[NL_P_Q], c->hn, T, qg, c->lu[NL_P_Q])) { nl_arena_release(g->ws, mk); return -1; }
        TIMED(g, NL_GP_ADD, for (size_t th = 0; th < (size_t)T * H; th++) {
            memcpy(qdst + th * hd, qg + th * 2 * hd, hd * sizeof(float));
            memcpy(c->gate + th * hd, qg + th * 2 * hd + hd, hd * sizeof(float));
        });
        nl_arena_release(g->ws, mk);
    } else if (tproj_fwd(g, l, NL_P_Q, L->p[NL_P_Q], c->hn, T, qdst, c->lu[NL_P_Q])) return -1;
    if (tproj_fwd(g, l, NL_P_K, L->p[NL_P_K], c->hn, T, kdst, c->lu[NL_P_K])) return -1;
    if (tproj_fwd(g, l, NL_P_V, L->p[NL_P_V], c->hn, T, c->v, c->lu[NL_P_V])) return -1;
    if (L->q_norm) {
        TIMED(g, NL_GP_NORM, nl_par_rmsnorm_forward(POOL(g), c->q, c->rstd_q, c->qraw, L->q_norm, T * H, hd, hp->rms_eps));
        TIMED(g, NL_GP_NORM, nl_par_rmsnorm_forward(POOL(g), c->k, c->rstd_k, c->kraw, L->k_norm, T * Hkv, hd, hp->rms_eps));
    }
    TIMED(g, NL_GP_ROPE, nl_par_rope(POOL(g), &g->rt->rope, 0, c->q, T, H, pos));
    TIMED(g, NL_GP_ROPE, nl_par_rope(POOL(g), &g->rt->rope, 0, c->k, T, Hkv, pos));
    TIMED(g, NL_GP_ATTN_FWD, nl_par_attention_forward(POOL(g), g->rt->attn_bf16, c->o, c->lse, c->q, c->k, c->v, T, T, H, Hkv, hd, 1.0f / sqrtf((float)hd)));
    if (gated) TIMED(g, NL_GP_ACT, nl_par_gate_forward(POOL(g), c->og, c->o, c->gate, (int64_t)qn));
    return tproj_fwd(g, l, NL_P_O, L->p[NL_P_O], c->og, T, out, c->lu[NL_P_O]);
}

static int mixer_attn_bwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *dout, float *dhn) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, E = hp->n_embd;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    nl_arena_mark mk = nl_arena_top(g->ws);
    /* dog, do, dgate, dq, dk, dv, dqraw(2qn when gated), tmp [T][E] */
    float *buf = falloc(g, 4 * qn + 2 * kvn + 2 * qn + (size_t)T * E);
    if (!buf) return -1;
    float *dog = buf, *d_o = dog + qn, *dgate = d_o + qn, *dq = dgate + qn, *dk = dq + qn, *dv = dk + kvn,
          *dqg = dv + kvn, *tmp = dqg + 2 * qn;
    int rc = -1;
    if (tproj_bwd(g, l, NL_P_O, L->p[NL_P_O], dout, c->og, c->lu[NL_P_O], T, dog)) goto done;
    const float *dattn = dog;
    if (gated) {
        TIMED(g, NL_GP_ACT, nl_par_gate_backward(POOL(g), d_o, dgate, dog, c->o, c->gate, (int64_t)qn));
        dattn = d_o;
    }
    TIMED(g, NL_GP_ATTN_BWD, nl_par_attention_backward(POOL(g), g->rt->attn_bf16, dq, dk, dv, dattn, c->o, c->lse, c->q, c->k, c->v, T, H, Hkv, hd, 1.0f / sqrtf((float)hd)));
    TIMED(g, NL_GP_ROPE, nl_par_rope(POOL(g), &g->rt->rope, 1, dq, T, H, pos));
    TIMED(g, NL_GP_ROPE, nl_par_rope(POOL(g), &g->rt->rope, 1, dk, T, Hkv, pos));
    if (L->q_norm) {
        TIMED(g, NL_GP_NORM, nl_par_rmsnorm_backward(POOL(g), dq, dq, c->qraw, L->q_norm, c->rstd_q, T * H, hd));
        TIMED(g, NL_GP_NORM, nl_par_rmsnorm_backward(POOL(g), dk, dk, c->kraw, L->k_norm, c->rstd_k, T * Hkv, hd));
    }
    const float *dqin = dq;
    if (gated) {
        TIMED(g, NL_GP_ADD, for (size_t th = 0; th < (size_t)T * H; th++) {
            memcpy(dqg + th * 2 * hd, dq + th * hd, hd * sizeof(float));
            memcpy(dqg + th * 2 * hd + hd, dgate + th * hd, hd * sizeof(float));
        });
        dqin = dqg;
    }
    /* dhn == NULL: only the LoRA gradients (see layer_bwd) */
    float *dk_in = dhn ? tmp : NULL;
    if (tproj_bwd(g, l, NL_P_Q, L->p[NL_P_Q], dqin, c->hn, c->lu[NL_P_Q], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_K, L->p[NL_P_K], dk, c->hn, c->lu[NL_P_K], T, dk_in)) goto done;
    if (dhn) TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, (size_t)T * E));
    if (tproj_bwd(g, l, NL_P_V, L->p[NL_P_V], dv, c->hn, c->lu[NL_P_V], T, dk_in)) goto done;
    if (dhn) TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, (size_t)T * E));
    rc = 0;
done:
    nl_arena_release(g->ws, mk);
    return rc;
}

static nl_gdn_weights gdn_weights(const nl_layer *L) {
    return (nl_gdn_weights){.conv = L->ssm_conv, .dt_bias = L->ssm_dt_bias, .A = L->ssm_a, .norm = L->ssm_norm};
}

static int mixer_gdn_fwd(nl_graph *g, int l, int T, layer_cache *c, float *out) {
    const nl_layer *L = &g->rt->m->layers[l];
    const nl_gdn_shape *s = &g->rt->gdn;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *buf = falloc(g, t * (cd + vd + 2 * (size_t)s->Hv));
    if (!buf) return -1;
    float *mixed = buf, *z = mixed + t * cd, *b = z + t * vd, *a = b + t * s->Hv;
    int rc = -1;
    if (tproj_fwd(g, l, NL_P_QKV, L->p[NL_P_QKV], c->hn, T, mixed, c->lu[NL_P_QKV])) goto done;
    if (tproj_fwd(g, l, NL_P_Z, L->p[NL_P_Z], c->hn, T, z, c->lu[NL_P_Z])) goto done;
    if (tproj_fwd(g, l, NL_P_BETA, L->p[NL_P_BETA], c->hn, T, b, c->lu[NL_P_BETA])) goto done;
    if (tproj_fwd(g, l, NL_P_ALPHA, L->p[NL_P_ALPHA], c->hn, T, a, c->lu[NL_P_ALPHA])) goto done;
    nl_gdn_weights w = gdn_weights(L);
    if (nl_gdn_forward_train(s, &w, c->y, mixed, z, b, a, T, c->gc)) goto done;
    rc = tproj_fwd(g, l, NL_P_OUT, L->p[NL_P_OUT], c->y, T, out, c->lu[NL_P_OUT]);
done:
    nl_arena_release(g->ws, mk);
    return rc;
}

static int mixer_gdn_bwd(nl_graph *g, int l, int T, layer_cache *c, const float *dout, float *dhn) {
    const nl_layer *L = &g->rt->m->layers[l];
    const nl_gdn_shape *s = &g->rt->gdn;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T, E = g->rt->m->hp.n_embd;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *buf = falloc(g, t * (vd + cd + vd + 2 * (size_t)s->Hv + E));
    if (!buf) return -1;
    float *dy = buf, *dmixed = dy + t * vd, *dz = dmixed + t * cd, *db = dz + t * vd, *da = db + t * s->Hv, *tmp = da + t * s->Hv;
    int rc = -1;
    nl_gdn_weights w = gdn_weights(L);
    if (tproj_bwd(g, l, NL_P_OUT, L->p[NL_P_OUT], dout, c->y, c->lu[NL_P_OUT], T, dy)) goto done;
    if (nl_gdn_backward(s, &w, c->gc, dy, T, dmixed, dz, db, da)) goto done;
    /* dhn == NULL: only the LoRA gradients (see layer_bwd) */
    float *tin = dhn ? tmp : NULL;
    if (tproj_bwd(g, l, NL_P_QKV, L->p[NL_P_QKV], dmixed, c->hn, c->lu[NL_P_QKV], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_Z, L->p[NL_P_Z], dz, c->hn, c->lu[NL_P_Z], T, tin)) goto done;
    if (dhn) TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, t * E));
    if (tproj_bwd(g, l, NL_P_BETA, L->p[NL_P_BETA], db, c->hn, c->lu[NL_P_BETA], T, tin)) goto done;
    if (dhn) TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, t * E));
    if (tproj_bwd(g, l, NL_P_ALPHA, L->p[NL_P_ALPHA], da, c->hn, c->lu[NL_P_ALPHA], T, tin)) goto done;
    if (dhn) TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, t * E));
    rc = 0;
done:
    nl_arena_release(g->ws, mk);
    return rc;
}

/* x_out = layer(x_in), saving intermediates into c. */
static int layer_fwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *x_in, float *x_out) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    TIMED(g, NL_GP_NORM, nl_par_rmsnorm_forward(POOL(g), c->hn, c->rstd1, x_in, L->attn_norm, T, hp->n_embd, hp->rms_eps));
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *mo = falloc(g, n);
    if (!mo) return -1;
    int rc = L->recurrent ? mixer_gdn_fwd(g, l, T, c, mo) : mixer_attn_fwd(g, l, pos, T, c, mo);
    if (rc == 0) {
        TIMED(g, NL_GP_ADD, nl_par_add2(POOL(g), c->xmid, x_in, mo, (int64_t)n));
        TIMED(g, NL_GP_NORM, nl_par_rmsnorm_forward(POOL(g), c->hn2, c->rstd2, c->xmid, L->ffn_norm, T, hp->n_embd, hp->rms_eps));
        rc = tproj_fwd(g, l, NL_P_GATE, L->p[NL_P_GATE], c->hn2, T, c->g, c->lu[NL_P_GATE]);
        if (rc == 0) rc = tproj_fwd(g, l, NL_P_UP, L->p[NL_P_UP], c->hn2, T, c->u, c->lu[NL_P_UP]);
        if (rc == 0) {
            TIMED(g, NL_GP_ACT, nl_par_swiglu_forward(POOL(g), c->h, c->g, c->u, (int64_t)nf));
            rc = tproj_fwd(g, l, NL_P_DOWN, L->p[NL_P_DOWN], c->h, T, mo, c->lu[NL_P_DOWN]);
        }
        if (rc == 0) TIMED(g, NL_GP_ADD, nl_par_add2(POOL(g), x_out, c->xmid, mo, (int64_t)n));
    }
    nl_arena_release(g->ws, mk);
    return rc;
}

/* dx: in = dLoss/dx_out, out = dLoss/dx_in (layer 0: left as it is, see below). */
static int layer_bwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *x_in, float *dx) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *buf = falloc(g, 3 * nf + 3 * n);
    if (!buf) return -1;
    float *dh = buf, *dg = dh + nf, *du = dg + nf, *dhn = du + nf, *tmp = dhn + n, *dxmid = tmp + n;
    int rc = -1;
    /* MLP: x_out = xmid + down(swiglu(gate(hn2), up(hn2))) */
    if (tproj_bwd(g, l, NL_P_DOWN, L->p[NL_P_DOWN], dx, c->h, c->lu[NL_P_DOWN], T, dh)) goto done;
    TIMED(g, NL_GP_ACT, nl_par_swiglu_backward(POOL(g), dg, du, dh, c->g, c->u, (int64_t)nf));
    if (tproj_bwd(g, l, NL_P_GATE, L->p[NL_P_GATE], dg, c->hn2, c->lu[NL_P_GATE], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_UP, L->p[NL_P_UP], du, c->hn2, c->lu[NL_P_UP], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dhn, tmp, n));
    TIMED(g, NL_GP_NORM, nl_par_rmsnorm_backward(POOL(g), dxmid, dhn, c->xmid, L->ffn_norm, c->rstd2, T, hp->n_embd));
    TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dxmid, dx, n));
    /* mixer: xmid = x_in + mixer(attn_norm(x_in)). Layer 0's x_in is the embedding rows:
     * nothing trainable lies below (frozen embeddings, no LoRA on them), so its input gradient
     * is not formed: no BWD requests for the mixer's input projections (their LoRA A/B
     * gradients need only dy and x), no attention-norm backward. */
    const int want_dx = l > 0 || (g->test && g->test->full_input_grads);
    float *dmix = want_dx ? dhn : NULL;
    rc = L->recurrent ? mixer_gdn_bwd(g, l, T, c, dxmid, dmix) : mixer_attn_bwd(g, l, pos, T, c, dxmid, dmix);
    if (rc || !want_dx) goto done;
    TIMED(g, NL_GP_NORM, nl_par_rmsnorm_backward(POOL(g), dx, dhn, x_in, L->attn_norm, c->rstd1, T, hp->n_embd));
    TIMED(g, NL_GP_ADD, nl_par_add(POOL(g), dx, dxmid, n));
done:
    nl_arena_release(g->ws, mk);
    return rc;
}

/* ---- head: final norm + vocabulary projection + cross-entropy, in token chunks ----
 * 256 rows a chunk: the vocabulary product is the largest of the step (V·E per row, both
 * directions) and runs at its best rate on 256-row buckets, while the logits chunk stays at
 * 256·V floats (155 MB for V = 151936). */
#define HEAD_CHUNK 256

/* The head on every row, chunk by chunk (chunks without a target skipped): the reference the
 * compacted head must reproduce bit for bit (the test hook head_all_rows selects it). */
static int head_all(nl_graph *g, const float *hn, float *dhn, const int32_t *targets, int T, float inv_n, int want_grad,
                    double *loss_sum) {
    const nl_model *m = g->rt->m;
    int E = m->hp.n_embd, V = m->hp.n_vocab, L = m->hp.n_layer;
    int p = m->p_output, r = lora_rank(g, p);
    int C = T < HEAD_CHUNK ? T : HEAD_CHUNK;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *z = falloc(g, (size_t)C * V + (size_t)C * (r ? r : 1));
    double *row_loss = nl_arena_alloc(g->ws, (size_t)C * sizeof(double));
    if (!z || !row_loss) { nl_arena_release(g->ws, mk); return -1; }
    float *u = z + (size_t)C * V;
    int rc = 0;
    for (int t0 = 0; t0 < T && rc == 0; t0 += C) {
        int nc = T - t0 < C ? T - t0 : C, any = 0;
        for (int t = 0; t < nc; t++) any |= targets[t0 + t] >= 0;
        if (!any) continue; /* no target: no loss, zero gradient, no service request */
        int64_t saved = g->tok_base;
        g->tok_base = saved + t0;
        rc = tproj_fwd(g, L, NL_P_OUTPUT, p, hn + (size_t)t0 * E, nc, z, r ? u : NULL);
        if (rc == 0) {
            /* rows in parallel; the chunk's sum in row order (the same bits as one thread) */
            double t1 = tic(g);
            nl_par_xent_rows(POOL(g), row_loss, z, targets + t0, nc, V, inv_n, want_grad);
            double cs = 0.0;
            for (int t = 0; t < nc; t++) cs += row_loss[t];
            *loss_sum += cs;
            toc(g, NL_GP_XENT, t1);
            if (want_grad) rc = tproj_bwd(g, L, NL_P_OUTPUT, p, z, hn + (size_t)t0 * E, r ? u : NULL, nc, dhn + (size_t)t0 * E);
        }
        g->tok_base = saved;
    }
    nl_arena_release(g->ws, mk);
    return rc;
}

/* The head on the target rows only: they are gathered into a compact buffer (256 a chunk),
 * the vocabulary product, cross-entropy and head BWD run on those rows, and their dhn rows are
 * scattered back (the other rows' dhn stay 0: a row without a target has zero logit gradient).
 * For prompt/answer data most rows are prompt, so most of the vocabulary work goes. Bit for
 * bit the uncompacted head: every service row and every LoRA row depends on its own input row
 * only (a planner that routes the two request sizes to different backends would break that,
 * as it already does between sequence lengths), the LoRA dropout masks keep each row's token
 * index (the toks array), and the loss is summed in the uncompacted chunks' grouping. */
static int head_compact(nl_graph *g, const float *hn, float *dhn, const int32_t *targets, int T, float inv_n, int want_grad,
                        double *loss_sum) {
    const nl_model *m = g->rt->m;
    int E = m->hp.n_embd, V = m->hp.n_vocab, L = m->hp.n_layer;
    int p = m->p_output, r = lora_rank(g, p);
    int nt = 0;
    for (int t = 0; t < T; t++) nt += targets[t] >= 0;
    if (nt == 0) return 0;
    int C = nt < HEAD_CHUNK ? nt : HEAD_CHUNK;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *z = falloc(g, (size_t)C * V + (size_t)C * (r ? r : 1) + 2 * (size_t)C * E);
    double *rl = nl_arena_alloc(g->ws, ((size_t)T + C) * sizeof(double));
    int32_t *idx = nl_arena_alloc(g->ws, ((size_t)nt + C) * sizeof(int32_t));
    int64_t *toks = nl_arena_alloc(g->ws, (size_t)C * sizeof(int64_t));
    if (!z || !rl || !idx || !toks) { nl_arena_release(g->ws, mk); return -1; }
    float *u = z + (size_t)C * V, *hc = u + (size_t)C * (r ? r : 1), *dhc = hc + (size_t)C * E;
    double *rlc = rl + T;
    int32_t *tc = idx + nt;
    for (int t = 0, i = 0; t < T; t++) {
        rl[t] = 0.0; /* what the cross-entropy gives a row without a target */
        if (targets[t] >= 0) idx[i++] = t;
    }
    int rc = 0;
    for (int i0 = 0; i0 < nt && rc == 0; i0 += C) {
        int nc = nt - i0 < C ? nt - i0 : C;
        double t1 = tic(g);
        for (int i = 0; i < nc; i++) {
            int t = idx[i0 + i];
            memcpy(hc + (size_t)i * E, hn + (size_t)t * E, (size_t)E * sizeof(float));
            tc[i] = targets[t];
            toks[i] = g->tok_base + t;
        }
        toc(g, NL_GP_ADD, t1);
        rc = tproj(g, NL_FWD, L, NL_P_OUTPUT, p, hc, NULL, r ? u : NULL, NULL, nc, z, toks);
        if (rc) break;
        t1 = tic(g);
        nl_par_xent_rows(POOL(g), rlc, z, tc, nc, V, inv_n, want_grad);
        for (int i = 0; i < nc; i++) rl[idx[i0 + i]] = rlc[i];
        toc(g, NL_GP_XENT, t1);
        if (!want_grad) continue;
        rc = tproj(g, NL_BWD, L, NL_P_OUTPUT, p, z, hc, NULL, r ? u : NULL, nc, dhc, toks);
        t1 = tic(g);
        for (int i = 0; rc == 0 && i < nc; i++)
            memcpy(dhn + (size_t)idx[i0 + i] * E, dhc + (size_t)i * E, (size_t)E * sizeof(float));
        toc(g, NL_GP_ADD, t1);
    }
    /* the loss in head_all's grouping: per chunk of HEAD_CHUNK rows, in row order */
    for (int t0 = 0; t0 < T && rc == 0; t0 += HEAD_CHUNK) {
        int nc = T - t0 < HEAD_CHUNK ? T - t0 : HEAD_CHUNK, any = 0;
        double cs = 0.0;
        for (int t = 0; t < nc; t++) {
            any |= targets[t0 + t] >= 0;
            cs += rl[t0 + t];
        }
        if (any) *loss_sum += cs;
    }
    nl_arena_release(g->ws, mk);
    return rc;
}

static int head(nl_graph *g, const float *x, const int32_t *targets, int T, float inv_n, int want_grad,
                double *loss_sum, float *dx) {
    const nl_model *m = g->rt->m;
    int E = m->hp.n_embd;
    size_t n = (size_t)T * E;
    nl_arena_mark mk = nl_arena_top(g->ws);
    float *hn = falloc(g, 2 * n + (size_t)T);
    if (!hn) return -1;
    float *dhn = hn + n, *rstd = dhn + n;
    TIMED(g, NL_GP_NORM, nl_par_rmsnorm_forward(POOL(g), hn, rstd, x, m->output_norm, T, E, m->hp.rms_eps));
    memset(dhn, 0, n * sizeof(float));
    *loss_sum = 0.0;
    int rc = g->test && g->test->head_all_rows ? head_all(g, hn, dhn, targets, T, inv_n, want_grad, loss_sum)
                              : head_compact(g, hn, dhn, targets, T, inv_n, want_grad, loss_sum);
    if (rc == 0 && want_grad) TIMED(g, NL_GP_NORM, nl_par_rmsnorm_backward(POOL(g), dx, dhn, x, m->output_norm, rstd, T, E));
    nl_arena_release(g->ws, mk);
    return rc;
}

static int run(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, float inv_n, int want_grad, double *loss_sum) {
    nl_runtime *rt = g->rt;
    const nl_model *m = rt->m;
    int nL = m->hp.n_layer, E = m->hp.n_embd;
    size_t n = (size_t)T * E;
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->hp.n_vocab)
            return nl_err("token %d at position %d is outside the vocabulary (0..%d)", tokens[t], t, m->hp.n_vocab - 1);
        if (targets[t] >= m->hp.n_vocab)
            return nl_err("target %d at position %d is outside the vocabulary", targets[t], t);
    }
    nl_arena *a = ws_of(g);
    if (!a) return -1;
    double t_other = tic(g);
    nl_arena_mark m0 = nl_arena_top(a);
    /* xs[l] = input of layer l (always kept); xs[nL] = final hidden state; then dx. */
    float *xs = falloc(g, (size_t)(nL + 2) * n);
    int32_t *pos = nl_arena_alloc(a, (size_t)T * sizeof *pos);
    unsigned char *keep = nl_arena_alloc(a, (size_t)nL);
    uint64_t *lb = nl_arena_alloc(a, (size_t)nL * sizeof *lb);
    nl_arena_mark *kmark = nl_arena_alloc(a, (size_t)nL * sizeof *kmark);
    layer_cache *caches = nl_arena_alloc(a, (size_t)nL * sizeof *caches);
    int rc = -1;
    if (!xs || !pos || !keep || !lb || !kmark || !caches) goto done;
    memset(caches, 0, (size_t)nL * sizeof *caches);
    float *dx = xs + (size_t)(nL + 1) * n;
    for (int t = 0; t < T; t++) pos[t] = t;
    /* cos/sin of positions [0, T) once per run instead of in every RoPE call (same floats) */
    if (nl_rope_table(&rt->rope, T)) goto done;
    if (nl_proj_get_rows(rt->svc, rt->svc_id[m->p_embed], tokens, T, xs)) goto done;
    /* Which layers keep their intermediates: train/budget's plan (later layers first). */
    for (int l = 0; l < nL; l++) lb[l] = nl_graph_layer_bytes(g, l, T);
    nl_act_plan plan;
    if (nl_act_plan_layers(lb, nL, want_grad ? g->act_budget : 0, keep, &plan)) goto done;
    g->n_kept = g->n_recomputed = g->n_lora_pool = 0;
    g->peak_cache_bytes = plan.peak_bytes;
    toc(g, NL_GP_OTHER, t_other);
    for (int l = 0; l < nL; l++) {
        kmark[l] = nl_arena_top(a);
        if (cache_alloc(g, l, T, &caches[l])) goto done;
        if (layer_fwd(g, l, pos, T, &caches[l], xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) goto done;
        if (keep[l]) {
            g->n_kept++;
        } else {
            cache_free(&caches[l]);
            nl_arena_release(a, kmark[l]);
        }
    }
    if (head(g, xs + (size_t)nL * n, targets, T, inv_n, want_grad, loss_sum, dx)) goto done;
    if (want_grad) {
        for (int l = nL - 1; l >= 0; l--) {
            layer_cache *c = &caches[l];
            if (!keep[l]) {
                /* recompute: the third frozen-weight product */
                kmark[l] = nl_arena_top(a);
                if (cache_alloc(g, l, T, c)) goto done;
                if (layer_fwd(g, l, pos, T, c, xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) goto done;
                g->n_recomputed++;
            }
            if (layer_bwd(g, l, pos, T, c, xs + (size_t)l * n, dx)) goto done;
            cache_free(c);
            nl_arena_release(a, kmark[l]); /* the top of the stack: later layers are gone already */
        }
    }
    rc = 0;
done:
    if (caches)
        for (int l = 0; l < nL; l++) cache_free(&caches[l]);
    nl_arena_release(a, m0);
    if (!g->keep_scratch) nl_graph_free(g);
    return rc;
}

int nl_graph_seq(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, float inv_n, double *loss_sum) {
    return run(g, tokens, targets, T, inv_n, 1, loss_sum);
}

int nl_graph_loss(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, double *loss_sum) {
    return run(g, tokens, targets, T, 1.0f, 0, loss_sum);
}

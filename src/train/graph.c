/* The training graph; see graph.h. Backward formulas: ../shared/ref/backward.md. */
#include "train/graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/gdn.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "train/budget.h"
#include "util/util.h"

/* ---- one layer's saved intermediates, carved out of one allocation ---- */
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

static int cache_alloc(const nl_graph *g, int l, int T, layer_cache *c) {
    memset(c, 0, sizeof *c);
    cache_layout(g, l, T, c);
    uint64_t bytes = c->bytes;
    c->base = nl_malloc(bytes);
    if (!c->base) return -1;
    cache_layout(g, l, T, c);
    if (g->rt->m->layers[l].recurrent) {
        c->gc = nl_gdn_cache_new(&g->rt->gdn, T);
        if (!c->gc) { free(c->base); c->base = NULL; return -1; }
    }
    return 0;
}

static void cache_free(layer_cache *c) {
    free(c->base);
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

#define TIMED(g, k, stmt)          \
    do {                           \
        double t_ = tic(g);        \
        stmt;                      \
        toc((g), (k), t_);         \
    } while (0)

/* ---- projections with their LoRA branch ---- */

/* The LoRA node's view of adapter entry e, with its dropout key for (layer, kind). */
static nl_lora lora_of(const nl_graph *g, int e, int layer, int kind) {
    const nl_lora_tensor *t = &g->ad->t[e];
    return (nl_lora){.n_in = (int)t->n_in, .n_out = (int)t->n_out, .rank = t->rank,
                     .scale = nl_adapter_scale(g->ad, e), .dropout = g->dropout,
                     .key = nl_lora_dropout_key(g->seed, (uint64_t)g->step, layer, kind)};
}

/* y[T][N] = W x + LoRA; u_save[T][r] receives the LoRA u (when adapted). */
static int tproj_fwd(nl_graph *g, int layer, int kind, int p, const float *x, int T, float *y, float *u_save) {
    nl_runtime *rt = g->rt;
    int e = g->ad->by_proj[p];
    double t = tic(g);
    if (nl_rt_pace(rt) || nl_proj_submit(rt->svc, rt->svc_id[p], NL_FWD, x, T, y)) return -1;
    if (g->prof) g->prof->requests++;
    int rc = 0;
    if (rt->sync) {
        t = toc(g, NL_GP_OTHER, t);
        rc = nl_proj_wait(rt->svc);
        t = toc(g, NL_GP_WAIT, t);
    }
    float *ly = NULL;
    if (e >= 0 && rc == 0) {
        /* CPU: the LoRA branch, while the base product is in flight */
        nl_lora L = lora_of(g, e, layer, kind);
        ly = nl_calloc((size_t)T * (size_t)L.n_out, sizeof(float));
        t = toc(g, NL_GP_OTHER, t);
        if (!ly || nl_lora_forward(&L, nl_lora_A(g->ad, e), nl_lora_B(g->ad, e), ly, u_save, x, T, g->tok_base)) rc = -1;
        t = toc(g, NL_GP_LORA_FWD, t);
    }
    if (!rt->sync) {
        t = toc(g, NL_GP_OTHER, t);
        if (nl_proj_wait(rt->svc)) rc = -1;
        t = toc(g, NL_GP_WAIT, t);
    }
    if (rc == 0 && ly) {
        size_t n = (size_t)T * (size_t)g->ad->t[e].n_out;
        for (size_t i = 0; i < n; i++) y[i] += ly[i];
    }
    free(ly);
    toc(g, NL_GP_ADD, t);
    return rc;
}

/* dx[T][K] = dy W (+ LoRA's dx); LoRA gradients accumulate into g->grads. x and u are the
 * forward's input and saved u. */
static int tproj_bwd(nl_graph *g, int layer, int kind, int p, const float *dy, const float *x, const float *u, int T, float *dx) {
    nl_runtime *rt = g->rt;
    int e = g->ad->by_proj[p];
    double t = tic(g);
    if (nl_rt_pace(rt) || nl_proj_submit(rt->svc, rt->svc_id[p], NL_BWD, dy, T, dx)) return -1;
    if (g->prof) g->prof->requests++;
    int rc = 0;
    if (rt->sync) {
        t = toc(g, NL_GP_OTHER, t);
        rc = nl_proj_wait(rt->svc);
        t = toc(g, NL_GP_WAIT, t);
    }
    float *ldx = NULL;
    if (e >= 0 && rc == 0) {
        /* dx is being written by the service: the LoRA part goes to its own buffer */
        nl_lora L = lora_of(g, e, layer, kind);
        ldx = nl_calloc((size_t)T * (size_t)L.n_in, sizeof(float));
        t = toc(g, NL_GP_OTHER, t);
        if (!ldx || nl_lora_backward(&L, nl_lora_A(g->ad, e), nl_lora_B(g->ad, e), ldx, g->grads + g->ad->t[e].off_a,
                                     g->grads + g->ad->t[e].off_b, dy, x, u, T, g->tok_base))
            rc = -1;
        t = toc(g, NL_GP_LORA_BWD, t);
    }
    if (!rt->sync) {
        t = toc(g, NL_GP_OTHER, t);
        if (nl_proj_wait(rt->svc)) rc = -1;
        t = toc(g, NL_GP_WAIT, t);
    }
    if (rc == 0 && ldx) {
        size_t n = (size_t)T * (size_t)g->ad->t[e].n_in;
        for (size_t i = 0; i < n; i++) dx[i] += ldx[i];
    }
    free(ldx);
    toc(g, NL_GP_ADD, t);
    return rc;
}

static void vadd(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* ---- layer forward (saving into c) and backward ---- */

static int mixer_attn_fwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, float *out) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    float *qdst = L->q_norm ? c->qraw : c->q, *kdst = L->q_norm ? c->kraw : c->k;
    if (gated) {
        float *qg = nl_malloc(2 * qn * sizeof(float));
        if (!qg) return -1;
        if (tproj_fwd(g, l, NL_P_Q, L->p[NL_P_Q], c->hn, T, qg, c->lu[NL_P_Q])) { free(qg); return -1; }
        for (size_t th = 0; th < (size_t)T * H; th++) {
            memcpy(qdst + th * hd, qg + th * 2 * hd, hd * sizeof(float));
            memcpy(c->gate + th * hd, qg + th * 2 * hd + hd, hd * sizeof(float));
        }
        free(qg);
    } else if (tproj_fwd(g, l, NL_P_Q, L->p[NL_P_Q], c->hn, T, qdst, c->lu[NL_P_Q])) return -1;
    if (tproj_fwd(g, l, NL_P_K, L->p[NL_P_K], c->hn, T, kdst, c->lu[NL_P_K])) return -1;
    if (tproj_fwd(g, l, NL_P_V, L->p[NL_P_V], c->hn, T, c->v, c->lu[NL_P_V])) return -1;
    if (L->q_norm) {
        TIMED(g, NL_GP_NORM, nl_rmsnorm_forward(c->q, c->rstd_q, c->qraw, L->q_norm, T * H, hd, hp->rms_eps));
        TIMED(g, NL_GP_NORM, nl_rmsnorm_forward(c->k, c->rstd_k, c->kraw, L->k_norm, T * Hkv, hd, hp->rms_eps));
    }
    TIMED(g, NL_GP_ROPE, nl_rope_forward(&g->rt->rope, c->q, T, H, pos));
    TIMED(g, NL_GP_ROPE, nl_rope_forward(&g->rt->rope, c->k, T, Hkv, pos));
    TIMED(g, NL_GP_ATTN_FWD, nl_attention_forward(c->o, c->lse, c->q, c->k, c->v, T, T, H, Hkv, hd, 1.0f / sqrtf((float)hd)));
    if (gated) TIMED(g, NL_GP_ACT, nl_gate_forward(c->og, c->o, c->gate, (int64_t)qn));
    (void)kvn;
    return tproj_fwd(g, l, NL_P_O, L->p[NL_P_O], c->og, T, out, c->lu[NL_P_O]);
}

static int mixer_attn_bwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *dout, float *dhn) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, E = hp->n_embd;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    /* dog, do, dgate, dq, dk, dv, dqraw(2qn when gated), tmp [T][E] */
    float *buf = nl_malloc((4 * qn + 2 * kvn + 2 * qn + (size_t)T * E) * sizeof(float));
    if (!buf) return -1;
    float *dog = buf, *d_o = dog + qn, *dgate = d_o + qn, *dq = dgate + qn, *dk = dq + qn, *dv = dk + kvn,
          *dqg = dv + kvn, *tmp = dqg + 2 * qn;
    int rc = -1;
    if (tproj_bwd(g, l, NL_P_O, L->p[NL_P_O], dout, c->og, c->lu[NL_P_O], T, dog)) goto done;
    if (gated) TIMED(g, NL_GP_ACT, nl_gate_backward(d_o, dgate, dog, c->o, c->gate, (int64_t)qn));
    else memcpy(d_o, dog, qn * sizeof(float));
    TIMED(g, NL_GP_ATTN_BWD, nl_attention_backward(dq, dk, dv, d_o, c->o, c->lse, c->q, c->k, c->v, T, H, Hkv, hd, 1.0f / sqrtf((float)hd)));
    TIMED(g, NL_GP_ROPE, nl_rope_backward(&g->rt->rope, dq, T, H, pos));
    TIMED(g, NL_GP_ROPE, nl_rope_backward(&g->rt->rope, dk, T, Hkv, pos));
    if (L->q_norm) {
        TIMED(g, NL_GP_NORM, nl_rmsnorm_backward(dq, dq, c->qraw, L->q_norm, c->rstd_q, T * H, hd));
        TIMED(g, NL_GP_NORM, nl_rmsnorm_backward(dk, dk, c->kraw, L->k_norm, c->rstd_k, T * Hkv, hd));
    }
    const float *dqin = dq;
    if (gated) {
        for (size_t th = 0; th < (size_t)T * H; th++) {
            memcpy(dqg + th * 2 * hd, dq + th * hd, hd * sizeof(float));
            memcpy(dqg + th * 2 * hd + hd, dgate + th * hd, hd * sizeof(float));
        }
        dqin = dqg;
    }
    if (tproj_bwd(g, l, NL_P_Q, L->p[NL_P_Q], dqin, c->hn, c->lu[NL_P_Q], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_K, L->p[NL_P_K], dk, c->hn, c->lu[NL_P_K], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, (size_t)T * E));
    if (tproj_bwd(g, l, NL_P_V, L->p[NL_P_V], dv, c->hn, c->lu[NL_P_V], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, (size_t)T * E));
    rc = 0;
done:
    free(buf);
    return rc;
}

static nl_gdn_weights gdn_weights(const nl_layer *L) {
    return (nl_gdn_weights){.conv = L->ssm_conv, .dt_bias = L->ssm_dt_bias, .A = L->ssm_a, .norm = L->ssm_norm};
}

static int mixer_gdn_fwd(nl_graph *g, int l, int T, layer_cache *c, float *out) {
    const nl_layer *L = &g->rt->m->layers[l];
    const nl_gdn_shape *s = &g->rt->gdn;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T;
    float *buf = nl_malloc(t * (cd + vd + 2 * (size_t)s->Hv) * sizeof(float));
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
    free(buf);
    return rc;
}

static int mixer_gdn_bwd(nl_graph *g, int l, int T, layer_cache *c, const float *dout, float *dhn) {
    const nl_layer *L = &g->rt->m->layers[l];
    const nl_gdn_shape *s = &g->rt->gdn;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T, E = g->rt->m->hp.n_embd;
    float *buf = nl_malloc(t * (vd + cd + vd + 2 * (size_t)s->Hv + E) * sizeof(float));
    if (!buf) return -1;
    float *dy = buf, *dmixed = dy + t * vd, *dz = dmixed + t * cd, *db = dz + t * vd, *da = db + t * s->Hv, *tmp = da + t * s->Hv;
    int rc = -1;
    nl_gdn_weights w = gdn_weights(L);
    if (tproj_bwd(g, l, NL_P_OUT, L->p[NL_P_OUT], dout, c->y, c->lu[NL_P_OUT], T, dy)) goto done;
    if (nl_gdn_backward(s, &w, c->gc, dy, T, dmixed, dz, db, da)) goto done;
    if (tproj_bwd(g, l, NL_P_QKV, L->p[NL_P_QKV], dmixed, c->hn, c->lu[NL_P_QKV], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_Z, L->p[NL_P_Z], dz, c->hn, c->lu[NL_P_Z], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, t * E));
    if (tproj_bwd(g, l, NL_P_BETA, L->p[NL_P_BETA], db, c->hn, c->lu[NL_P_BETA], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, t * E));
    if (tproj_bwd(g, l, NL_P_ALPHA, L->p[NL_P_ALPHA], da, c->hn, c->lu[NL_P_ALPHA], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, t * E));
    rc = 0;
done:
    free(buf);
    return rc;
}

/* x_out = layer(x_in), saving intermediates into c. */
static int layer_fwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *x_in, float *x_out) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    TIMED(g, NL_GP_NORM, nl_rmsnorm_forward(c->hn, c->rstd1, x_in, L->attn_norm, T, hp->n_embd, hp->rms_eps));
    float *mo = nl_malloc(n * sizeof(float));
    if (!mo) return -1;
    int rc = L->recurrent ? mixer_gdn_fwd(g, l, T, c, mo) : mixer_attn_fwd(g, l, pos, T, c, mo);
    if (rc == 0) {
        TIMED(g, NL_GP_ADD, for (size_t i = 0; i < n; i++) c->xmid[i] = x_in[i] + mo[i]);
        TIMED(g, NL_GP_NORM, nl_rmsnorm_forward(c->hn2, c->rstd2, c->xmid, L->ffn_norm, T, hp->n_embd, hp->rms_eps));
        rc = tproj_fwd(g, l, NL_P_GATE, L->p[NL_P_GATE], c->hn2, T, c->g, c->lu[NL_P_GATE]);
        if (rc == 0) rc = tproj_fwd(g, l, NL_P_UP, L->p[NL_P_UP], c->hn2, T, c->u, c->lu[NL_P_UP]);
        if (rc == 0) {
            TIMED(g, NL_GP_ACT, nl_swiglu_forward(c->h, c->g, c->u, (int64_t)nf));
            rc = tproj_fwd(g, l, NL_P_DOWN, L->p[NL_P_DOWN], c->h, T, mo, c->lu[NL_P_DOWN]);
        }
        if (rc == 0)
            TIMED(g, NL_GP_ADD, for (size_t i = 0; i < n; i++) x_out[i] = c->xmid[i] + mo[i]);
    }
    free(mo);
    return rc;
}

/* dx: in = dLoss/dx_out, out = dLoss/dx_in. */
static int layer_bwd(nl_graph *g, int l, const int32_t *pos, int T, layer_cache *c, const float *x_in, float *dx) {
    const nl_model *m = g->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    float *buf = nl_malloc((3 * nf + 3 * n) * sizeof(float));
    if (!buf) return -1;
    float *dh = buf, *dg = dh + nf, *du = dg + nf, *dhn = du + nf, *tmp = dhn + n, *dxmid = tmp + n;
    int rc = -1;
    /* MLP: x_out = xmid + down(swiglu(gate(hn2), up(hn2))) */
    if (tproj_bwd(g, l, NL_P_DOWN, L->p[NL_P_DOWN], dx, c->h, c->lu[NL_P_DOWN], T, dh)) goto done;
    TIMED(g, NL_GP_ACT, nl_swiglu_backward(dg, du, dh, c->g, c->u, (int64_t)nf));
    if (tproj_bwd(g, l, NL_P_GATE, L->p[NL_P_GATE], dg, c->hn2, c->lu[NL_P_GATE], T, dhn)) goto done;
    if (tproj_bwd(g, l, NL_P_UP, L->p[NL_P_UP], du, c->hn2, c->lu[NL_P_UP], T, tmp)) goto done;
    TIMED(g, NL_GP_ADD, vadd(dhn, tmp, n));
    TIMED(g, NL_GP_NORM, nl_rmsnorm_backward(dxmid, dhn, c->xmid, L->ffn_norm, c->rstd2, T, hp->n_embd));
    TIMED(g, NL_GP_ADD, vadd(dxmid, dx, n));
    /* mixer: xmid = x_in + mixer(attn_norm(x_in)) */
    rc = L->recurrent ? mixer_gdn_bwd(g, l, T, c, dxmid, dhn) : mixer_attn_bwd(g, l, pos, T, c, dxmid, dhn);
    if (rc) goto done;
    TIMED(g, NL_GP_NORM, nl_rmsnorm_backward(dx, dhn, x_in, L->attn_norm, c->rstd1, T, hp->n_embd));
    TIMED(g, NL_GP_ADD, vadd(dx, dxmid, n));
done:
    free(buf);
    return rc;
}

/* ---- head: final norm + vocabulary projection + cross-entropy, in token chunks ---- */
#define HEAD_CHUNK 64

static int head(nl_graph *g, const float *x, const int32_t *targets, int T, float inv_n, int want_grad,
                double *loss_sum, float *dx) {
    const nl_model *m = g->rt->m;
    int E = m->hp.n_embd, V = m->hp.n_vocab, L = m->hp.n_layer;
    int p = m->p_output, r = lora_rank(g, p);
    size_t n = (size_t)T * E;
    int C = T < HEAD_CHUNK ? T : HEAD_CHUNK;
    float *hn = nl_malloc((2 * n + (size_t)T + (size_t)C * V + (size_t)C * (r ? r : 1)) * sizeof(float));
    if (!hn) return -1;
    float *dhn = hn + n, *rstd = dhn + n, *z = rstd + T, *u = z + (size_t)C * V;
    TIMED(g, NL_GP_NORM, nl_rmsnorm_forward(hn, rstd, x, m->output_norm, T, E, m->hp.rms_eps));
    memset(dhn, 0, n * sizeof(float));
    *loss_sum = 0.0;
    int rc = 0;
    for (int t0 = 0; t0 < T && rc == 0; t0 += C) {
        int nc = T - t0 < C ? T - t0 : C, any = 0;
        for (int t = 0; t < nc; t++) any |= targets[t0 + t] >= 0;
        if (!any) continue; /* no target: no loss, zero gradient, no service request */
        int64_t saved = g->tok_base;
        g->tok_base = saved + t0;
        rc = tproj_fwd(g, L, NL_P_OUTPUT, p, hn + (size_t)t0 * E, nc, z, r ? u : NULL);
        if (rc == 0) {
            TIMED(g, NL_GP_XENT, *loss_sum += nl_xent_chunk(z, targets + t0, nc, V, inv_n, want_grad));
            if (want_grad) rc = tproj_bwd(g, L, NL_P_OUTPUT, p, z, hn + (size_t)t0 * E, r ? u : NULL, nc, dhn + (size_t)t0 * E);
        }
        g->tok_base = saved;
    }
    if (rc == 0 && want_grad) TIMED(g, NL_GP_NORM, nl_rmsnorm_backward(dx, dhn, x, m->output_norm, rstd, T, E));
    free(hn);
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
    /* xs[l] = input of layer l (always kept); xs[nL] = final hidden state. */
    float *xs = nl_malloc((size_t)(nL + 1) * n * sizeof(float) + n * sizeof(float));
    layer_cache *caches = nl_calloc((size_t)nL, sizeof *caches);
    int32_t *pos = nl_malloc((size_t)T * sizeof *pos);
    int rc = -1;
    if (!xs || !caches || !pos) goto done;
    float *dx = xs + (size_t)(nL + 1) * n;
    for (int t = 0; t < T; t++) pos[t] = t;
    if (nl_proj_get_rows(rt->svc, rt->svc_id[m->p_embed], tokens, T, xs)) goto done;
    /* Which layers keep their intermediates: train/budget's plan (later layers first). */
    unsigned char *keep = nl_calloc((size_t)nL, 1);
    uint64_t *lb = nl_malloc((size_t)nL * sizeof *lb);
    if (!keep || !lb) { free(keep); free(lb); goto done; }
    for (int l = 0; l < nL; l++) lb[l] = nl_graph_layer_bytes(g, l, T);
    nl_act_plan plan;
    int prc = nl_act_plan_layers(lb, nL, want_grad ? g->act_budget : 0, keep, &plan);
    free(lb);
    if (prc) { free(keep); goto done; }
    g->n_kept = g->n_recomputed = 0;
    g->peak_cache_bytes = plan.peak_bytes;
    for (int l = 0; l < nL; l++) {
        layer_cache c;
        if (cache_alloc(g, l, T, &c)) { free(keep); goto done; }
        if (layer_fwd(g, l, pos, T, &c, xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) { cache_free(&c); free(keep); goto done; }
        if (keep[l]) { caches[l] = c; g->n_kept++; }
        else cache_free(&c);
    }
    if (head(g, xs + (size_t)nL * n, targets, T, inv_n, want_grad, loss_sum, dx)) { free(keep); goto done; }
    if (want_grad) {
        for (int l = nL - 1; l >= 0; l--) {
            layer_cache *c = &caches[l];
            if (!keep[l]) {
                /* recompute: the third frozen-weight product */
                if (cache_alloc(g, l, T, c)) { free(keep); goto done; }
                if (layer_fwd(g, l, pos, T, c, xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) { free(keep); goto done; }
                g->n_recomputed++;
            }
            if (layer_bwd(g, l, pos, T, c, xs + (size_t)l * n, dx)) { free(keep); goto done; }
            cache_free(c);
        }
    }
    free(keep);
    rc = 0;
done:
    if (caches)
        for (int l = 0; l < nL; l++) cache_free(&caches[l]);
    free(caches);
    free(xs);
    free(pos);
    return rc;
}

int nl_graph_seq(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, float inv_n, double *loss_sum) {
    return run(g, tokens, targets, T, inv_n, 1, loss_sum);
}

int nl_graph_loss(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, double *loss_sum) {
    return run(g, tokens, targets, T, 1.0f, 0, loss_sum);
}

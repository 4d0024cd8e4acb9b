/* The layer definition; see layer.h. Backward formulas: docs/backward.md. */
#include "nn/layer.h"

#include <math.h>
#include <string.h>

#include "nn/lora.h"
#include "nn/nn.h"
#include "nn/par.h"

/* ---- timing (bench step) ---- */

static const char *const prof_names[NL_GP_COUNT] = {"wait", "lora_fwd", "lora_bwd", "attn_fwd", "attn_bwd", "norm",
                                                    "rope", "act",      "xent",     "add",      "gdn",      "other"};
const char *nl_graph_prof_name(int k) { return k >= 0 && k < NL_GP_COUNT ? prof_names[k] : "?"; }

#define POOL(ps) ((ps)->rt->pool)

static float *falloc(nl_pass *ps, size_t n) { return nl_arena_floats(ps->ws, n); }

/* ---- the cache: one block, carved ---- */

/* Bump allocation over one block; with base == NULL it only counts. */
static float *carve(nl_layer_cache *c, size_t n) {
    float *p = c->base ? (float *)((char *)c->base + c->bytes) : NULL;
    c->bytes += (n * sizeof(float) + 63) & ~(uint64_t)63;
    return p;
}

/* Lay out (or count) layer l's cache for T tokens. The GDN cache is separate (its own node). */
static void cache_layout(const nl_model *m, const nl_adapter *ad, int mask, int l, int T, nl_layer_cache *c) {
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    size_t E = hp->n_embd, F = hp->n_ff, t = (size_t)T;
    c->bytes = 0;
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
        if (!L->q_norm) { /* with qk-norm q and k are recomputed from qraw, kraw (attn_qk_rope) */
            c->q = carve(c, t * H * hd);
            c->k = carve(c, t * Hkv * hd);
        }
        c->v = carve(c, t * Hkv * hd);
        if (m->arch == NL_ARCH_QWEN35) {
            c->gate = carve(c, t * H * hd);
            c->og = carve(c, t * H * hd);
        }
        c->o = carve(c, t * H * hd);
        c->lse = carve(c, t * H);
        if (m->arch != NL_ARCH_QWEN35) c->og = c->o;
    }
    if (hp->post_norms) {
        c->ao = carve(c, t * E);
        c->rstd_ao = carve(c, t);
        c->fo = carve(c, t * E);
        c->rstd_fo = carve(c, t);
    }
    c->xmid = carve(c, t * E);
    c->rstd2 = carve(c, t);
    c->g = carve(c, t * F);
    c->u = carve(c, t * F);
    for (int k = 0; k < NL_P_KIND_COUNT; k++) {
        int r = nl_adapter_rank(ad, L->p[k]);
        c->lu[k] = r ? carve(c, t * (size_t)r) : NULL;
        /* the dropout mask's bits beside u (1 bit per element of x: 1/32 of x's bytes) */
        c->lm[k] =
            r && mask ? (uint16_t *)(void *)carve(c, t * nl_lora_mask_halves((int)ad->t[ad->by_proj[L->p[k]]].n_in) / 2)
                      : NULL;
    }
}

uint64_t nl_layer_cache_bytes_span(const nl_runtime *rt, const nl_adapter *ad, int flags, int l, const nl_span *sp) {
    nl_layer_cache c = {0};
    cache_layout(rt->m, ad, (flags & NL_CACHE_MASK) != 0, l, sp->T, &c);
    uint64_t b = c.bytes;
    if ((flags & NL_CACHE_GDN) && rt->m->layers[l].recurrent)
        for (int i = 0; i < nl_span_n(sp); i++) b += nl_gdn_cache_bytes(&rt->gdn, nl_span_len(sp, i));
    return b;
}

uint64_t nl_layer_cache_bytes(const nl_runtime *rt, const nl_adapter *ad, int flags, int l, int T) {
    const nl_span sp = {.T = T};
    return nl_layer_cache_bytes_span(rt, ad, flags, l, &sp);
}

int nl_layer_cache_alloc(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c) {
    const nl_model *m = ps->rt->m;
    memset(c, 0, sizeof *c);
    cache_layout(m, ps->save_u, ps->save_mask, l, sp->T, c);
    uint64_t bytes = c->bytes;
    c->base = nl_arena_alloc(ps->ws, bytes);
    if (!c->base) return -1;
    cache_layout(m, ps->save_u, ps->save_mask, l, sp->T, c);
    if (ps->save_gdn && m->layers[l].recurrent) {
        int n = nl_span_n(sp);
        c->gc = nl_arena_alloc(ps->ws, (size_t)n * sizeof *c->gc);
        if (!c->gc) {
            c->base = NULL;
            return -1;
        }
        for (int i = 0; i < n; i++) {
            c->gc[i] = nl_gdn_cache_new(ps->ws, &ps->rt->gdn, nl_span_len(sp, i));
            if (!c->gc[i]) {
                nl_layer_cache_free(c);
                return -1;
            }
            c->n_gc = i + 1;
        }
    }
    return 0;
}

/* ---- the temporaries' bound (nl_layer_temp_bytes): each allocation below, as sized there ---- */

static uint64_t A4(uint64_t floats) { return nl_arena_size((size_t)(4 * floats)); }
static uint64_t max2(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* the hook's most over the kinds [k0, k1) of layer l (kinds the layer lacks count 0) */
static uint64_t hooks(const nl_runtime *rt, int l, int k0, int k1, nl_dir dir, int T, nl_proj_temp_fn fn, void *user) {
    uint64_t b = 0;
    for (int k = k0; k < k1; k++) {
        int p = rt->m->layers[l].p[k];
        if (p >= 0 && fn) b = max2(b, fn(user, dir, p, T));
    }
    return b;
}

uint64_t nl_layer_temp_bytes(const nl_runtime *rt, int l, int T, int bwd, nl_proj_temp_fn proj_temp, void *user) {
    const nl_model *m = rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    const uint64_t t = (uint64_t)T, n = t * (uint64_t)hp->n_embd, nf = t * (uint64_t)hp->n_ff;
    const uint64_t qn = t * (uint64_t)hp->n_head * (uint64_t)hp->head_dim,
                   kvn = t * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    const nl_dir dir = bwd ? NL_BWD : NL_FWD;
    const uint64_t mlp = max2(max2(hooks(rt, l, NL_P_GATE, NL_P_GATE + 1, dir, T, proj_temp, user),
                                   hooks(rt, l, NL_P_UP, NL_P_UP + 1, dir, T, proj_temp, user)),
                              hooks(rt, l, NL_P_DOWN, NL_P_DOWN + 1, dir, T, proj_temp, user));
    uint64_t mixer;
    if (L->recurrent) {
        const nl_gdn_shape *s = &rt->gdn;
        const uint64_t cd = (uint64_t)nl_gdn_conv_dim(s), vd = (uint64_t)s->Hv * (uint64_t)s->dv, Hv = (uint64_t)s->Hv;
        const uint64_t buf = bwd ? A4(t * (vd + cd + vd + 2 * Hv + (uint64_t)hp->n_embd)) : A4(t * (cd + vd + 2 * Hv));
        mixer =
            buf + max2(hooks(rt, l, NL_P_QKV, NL_P_OUT + 1, dir, T, proj_temp, user), nl_gdn_train_ws_bytes(s, T, bwd));
    } else {
        const uint64_t hk = hooks(rt, l, NL_P_Q, NL_P_O + 1, dir, T, proj_temp, user);
        if (bwd) mixer = A4(6 * qn + 2 * kvn + n) + hk;
        else mixer = (L->q_norm ? A4(qn + kvn) : 0) + (m->arch == NL_ARCH_QWEN35 ? A4(2 * qn) : 0) + hk;
    }
    /* nl_layer_backward's buffer (hn2 and hn in dh's place, an own one when nf < n); the forward's mo, hn/hn2, h */
    if (bwd) return A4(3 * nf + (hp->post_norms ? 4 : 3) * n + (nf < n ? n : 0)) + max2(mlp, mixer);
    return A4(2 * n + nf) + max2(mlp, mixer);
}

void nl_layer_cache_free(nl_layer_cache *c) {
    for (int i = 0; i < c->n_gc; i++) nl_gdn_cache_free(c->gc[i]);
    memset(c, 0, sizeof *c);
}

/* ---- projections through the pass ---- */

/* the projection `kind` of layer l; its LoRA u rows and mask bits kept in (FWD) or read from (BWD)
 * the layer's cache c */
static int proj_fwd(nl_pass *ps, int l, int kind, const float *x, int T, float *y, const nl_layer_cache *c) {
    return ps->proj(ps->user, &(nl_pass_req){.dir = NL_FWD,
                                             .layer = l,
                                             .kind = kind,
                                             .p = ps->rt->m->layers[l].p[kind],
                                             .in = x,
                                             .u_save = c->lu[kind],
                                             .mask_save = c->lm[kind],
                                             .T = T,
                                             .out = y});
}

static int proj_bwd(nl_pass *ps, int l, int kind, const float *dy, const float *x, const nl_layer_cache *c, int T,
                    float *dx) {
    return ps->proj(ps->user, &(nl_pass_req){.dir = NL_BWD,
                                             .layer = l,
                                             .kind = kind,
                                             .p = ps->rt->m->layers[l].p[kind],
                                             .in = dy,
                                             .x = x,
                                             .u_in = c->lu[kind],
                                             .mask_in = c->lm[kind],
                                             .T = T,
                                             .out = dx});
}

/* ---- segments ---- */

int nl_span_check(const nl_span *sp) {
    if (!sp->seg_pre || nl_span_n(sp) < 2) return 0;
    for (int i = 0, last = -1; i < sp->n_seg; i++) {
        const int p = sp->seg_pre[i];
        if (p == -1) {
            last = i;
        } else if (p < 0 || p != last) {
            if (last < 0)
                return nl_err("forward: sequence %d continues sequence %d, but no prefix comes before it", i, p);
            return nl_err("forward: sequence %d continues sequence %d, not the prefix %d before it", i, p, last);
        } else if (!nl_attention_prefix_rows(sp->seg_T[p], sp->seg_T[p] + sp->seg_T[i])) {
            return nl_err(
                "forward: sequence %d continues sequence %d of %d rows: with its %d rows the attention would not give "
                "the prefix the rows it has alone (nl_attention_prefix_rows)",
                i, p, sp->seg_T[p], sp->seg_T[i]);
        }
    }
    return 0;
}

/* ---- attention mixer ---- */

/* The rows [t0, t0+Ti) of a segment continuing the prefix rows [p0, p0+P) (nl_span.seg_pre):
 * the joined sequence's keys gathered into one block, its queries from nl_attention_tail_start
 * on (a few of the prefix's again where the tail would be short), the continuation's out/lse
 * rows copied back: the bits of the FP32 self-attention of the joined sequence. */
static int attn_continuation(nl_pass *ps, int l, nl_layer_cache *c, int p0, int P, int t0, int Ti) {
    const nl_hparams *hp = &ps->rt->m->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    const int window = ps->rt->m->layers[l].swa ? hp->n_swa : 0;
    const size_t qr = (size_t)H * hd, kr = (size_t)Hkv * hd, fs = sizeof(float);
    const int S = P + Ti, qs = nl_attention_tail_start(P, S), Tq = S - qs, nre = P - qs;
    nl_arena_mark mk = nl_arena_top(ps->ws);
    float *kb = falloc(ps, (size_t)S * kr), *vb = falloc(ps, (size_t)S * kr), *qb = falloc(ps, (size_t)Tq * qr);
    float *ob = falloc(ps, (size_t)Tq * qr), *lb = falloc(ps, (size_t)Tq * H);
    int rc = -1;
    if (kb && vb && qb && ob && lb) {
        NL_TIMED(ps->prof, NL_GP_ADD, {
            memcpy(kb, c->k + (size_t)p0 * kr, (size_t)P * kr * fs);
            memcpy(kb + (size_t)P * kr, c->k + (size_t)t0 * kr, (size_t)Ti * kr * fs);
            memcpy(vb, c->v + (size_t)p0 * kr, (size_t)P * kr * fs);
            memcpy(vb + (size_t)P * kr, c->v + (size_t)t0 * kr, (size_t)Ti * kr * fs);
            memcpy(qb, c->q + (size_t)(p0 + qs) * qr, (size_t)nre * qr * fs);
            memcpy(qb + (size_t)nre * qr, c->q + (size_t)t0 * qr, (size_t)Ti * qr * fs);
        });
        NL_TIMED(ps->prof, NL_GP_ATTN_FWD,
                 rc = nl_par_attention_forward(POOL(ps), 0, NULL,
                                               &(nl_attn_fwd){.out = ob,
                                                              .lse = lb,
                                                              .q = qb,
                                                              .k = kb,
                                                              .v = vb,
                                                              .T = Tq,
                                                              .S = S,
                                                              .Hq = H,
                                                              .Hkv = Hkv,
                                                              .d = hd,
                                                              .scale = hp->attn_scale,
                                                              .window = window}));
        if (rc == 0) {
            memcpy(c->o + (size_t)t0 * qr, ob + (size_t)nre * qr, (size_t)Ti * qr * fs);
            memcpy(c->lse + (size_t)t0 * H, lb + (size_t)nre * H, (size_t)Ti * H * fs);
        }
    }
    nl_arena_release(ps->ws, mk);
    return rc;
}

/* The sequence-local part of the attention mixer: c->o = attention of c->q over c->k, c->v
 * (with st: over the KV cache, this call's rows appended at st->n_past). */
static int attn_core_fwd(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, nl_seq_state *st) {
    const nl_hparams *hp = &ps->rt->m->hp;
    int T = sp->T, H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    const float scale = hp->attn_scale;
    const int window = ps->rt->m->layers[l].swa ? hp->n_swa : 0;
    const float *k = c->k, *v = c->v;
    int S = T;
    if (!st && nl_span_n(sp) > 1) {
        /* packed sequences: each attends over its own rows only */
        size_t qr = (size_t)H * hd, kr = (size_t)Hkv * hd;
        if (sp->seg_pre && (ps->attn_bf16 || ps->tiles))
            return nl_err("internal: shared prefixes with the BF16 or tile attention");
        for (int i = 0, t0 = 0, p0 = 0; i < sp->n_seg; t0 += sp->seg_T[i++]) {
            int Ti = sp->seg_T[i];
            int rc = 0;
            const int pre = sp->seg_pre ? sp->seg_pre[i] : -1;
            if (pre >= 0) {
                if ((rc = attn_continuation(ps, l, c, p0, sp->seg_T[pre], t0, Ti))) return rc;
                continue;
            }
            p0 = t0;
            NL_TIMED(ps->prof, NL_GP_ATTN_FWD,
                     rc = nl_par_attention_forward(POOL(ps), ps->attn_bf16, ps->tiles,
                                                   &(nl_attn_fwd){.out = c->o + t0 * qr,
                                                                  .lse = c->lse + (size_t)t0 * H,
                                                                  .q = c->q + t0 * qr,
                                                                  .k = c->k + t0 * kr,
                                                                  .v = c->v + t0 * kr,
                                                                  .T = Ti,
                                                                  .S = Ti,
                                                                  .Hq = H,
                                                                  .Hkv = Hkv,
                                                                  .d = hd,
                                                                  .scale = scale,
                                                                  .window = window}));
            if (rc) return rc;
        }
        return 0;
    }
    if (st && nl_span_n(sp) > 1) return nl_err("internal: a decoding state with several sequences in one call");
    if (st) {
        if (st->n_past + T > st->n_ctx) return nl_err("context full: %d + %d tokens > %d", st->n_past, T, st->n_ctx);
        size_t row = (size_t)Hkv * hd, kvn = (size_t)T * row;
        NL_TIMED(ps->prof, NL_GP_ADD, {
            memcpy(st->k[l] + (size_t)st->n_past * row, c->k, kvn * sizeof(float));
            memcpy(st->v[l] + (size_t)st->n_past * row, c->v, kvn * sizeof(float));
        });
        k = st->k[l];
        v = st->v[l];
        S = st->n_past + T;
    }
    int rc = 0;
    NL_TIMED(ps->prof, NL_GP_ATTN_FWD,
             rc = nl_par_attention_forward(POOL(ps), ps->attn_bf16, ps->tiles,
                                           &(nl_attn_fwd){.out = c->o,
                                                          .lse = c->lse,
                                                          .q = c->q,
                                                          .k = k,
                                                          .v = v,
                                                          .T = T,
                                                          .S = S,
                                                          .Hq = H,
                                                          .Hkv = Hkv,
                                                          .d = hd,
                                                          .scale = scale,
                                                          .window = window}));
    return rc;
}

/* q and k of the attention: the projections' outputs (c->q, c->k; with qk-norm c->qraw, c->kraw)
 * through the norms (with qk-norm: into c->q, c->k, rstd_q, rstd_k) and the rotation. With
 * qk-norm the backward runs it again on the kept qraw, kraw: the same kernels, the same bits. */
static void attn_qk_rope(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c) {
    const nl_hparams *hp = &ps->rt->m->hp;
    const nl_layer *L = &ps->rt->m->layers[l];
    const int T = sp->T, H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    const nl_rope *rope = nl_rt_rope(ps->rt, l);
    if (L->q_norm && rope->head_dim == hd) { /* norm and rotation in one pass over each token (profiled as norm) */
        NL_TIMED(
            ps->prof, NL_GP_NORM,
            nl_par_norm_rope_forward(POOL(ps), rope, c->q, c->rstd_q, c->qraw, L->q_norm, T, H, hp->rms_eps, sp->pos));
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_norm_rope_forward(POOL(ps), rope, c->k, c->rstd_k, c->kraw, L->k_norm, T, Hkv, hp->rms_eps,
                                          sp->pos));
        return;
    }
    if (L->q_norm) {
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_rmsnorm_forward(POOL(ps), c->q, c->rstd_q, c->qraw, L->q_norm, T * H, hd, hp->rms_eps));
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_rmsnorm_forward(POOL(ps), c->k, c->rstd_k, c->kraw, L->k_norm, T * Hkv, hd, hp->rms_eps));
    }
    NL_TIMED(ps->prof, NL_GP_ROPE, nl_par_rope(POOL(ps), rope, 0, c->q, T, H, sp->pos));
    NL_TIMED(ps->prof, NL_GP_ROPE, nl_par_rope(POOL(ps), rope, 0, c->k, T, Hkv, sp->pos));
}

static int mixer_attn_fwd(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, nl_seq_state *st, float *out) {
    const nl_model *m = ps->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int T = sp->T, H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    const nl_arena_mark mk = nl_arena_top(ps->ws);
    int rc = -1;
    if (L->q_norm) { /* q, k: temporaries here (the cache keeps qraw, kraw: nl_layer_cache) */
        c->q = falloc(ps, qn + kvn);
        if (!c->q) return -1;
        c->k = c->q + qn;
    }
    float *qdst = L->q_norm ? c->qraw : c->q, *kdst = L->q_norm ? c->kraw : c->k;
    if (gated) {
        /* attn_q gives [T][H][q(hd) | gate(hd)]: de-interleave */
        nl_arena_mark mg = nl_arena_top(ps->ws);
        float *qg = falloc(ps, 2 * qn);
        if (!qg || proj_fwd(ps, l, NL_P_Q, c->hn, T, qg, c)) goto done;
        NL_TIMED(
            ps->prof, NL_GP_ADD, for (size_t th = 0; th < (size_t)T * H; th++) {
                memcpy(qdst + th * hd, qg + th * 2 * hd, hd * sizeof(float));
                memcpy(c->gate + th * hd, qg + th * 2 * hd + hd, hd * sizeof(float));
            });
        nl_arena_release(ps->ws, mg);
    } else if (proj_fwd(ps, l, NL_P_Q, c->hn, T, qdst, c)) goto done;
    if (proj_fwd(ps, l, NL_P_K, c->hn, T, kdst, c)) goto done;
    if (proj_fwd(ps, l, NL_P_V, c->hn, T, c->v, c)) goto done;
    attn_qk_rope(ps, l, sp, c);
    if (attn_core_fwd(ps, l, sp, c, st)) goto done;
    if (gated) NL_TIMED(ps->prof, NL_GP_ACT, nl_par_gate_forward(POOL(ps), c->og, c->o, c->gate, (int64_t)qn));
    rc = proj_fwd(ps, l, NL_P_O, c->og, T, out, c);
done:
    if (L->q_norm) c->q = c->k = NULL;
    nl_arena_release(ps->ws, mk);
    return rc;
}

static int mixer_attn_bwd(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, const float *dout, float *dhn) {
    const nl_model *m = ps->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int T = sp->T, H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, E = hp->n_embd;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    int gated = m->arch == NL_ARCH_QWEN35;
    nl_arena_mark mk = nl_arena_top(ps->ws);
    /* dog, do, dgate, dq, dk, dv, dqraw(2qn when gated), tmp [T][E] */
    float *buf = falloc(ps, 4 * qn + 2 * kvn + 2 * qn + (size_t)T * E);
    if (!buf) return -1;
    float *dog = buf, *d_o = dog + qn, *dgate = d_o + qn, *dq = dgate + qn, *dk = dq + qn, *dv = dk + kvn,
          *dqg = dv + kvn, *tmp = dqg + 2 * qn;
    int rc = -1;
    if (proj_bwd(ps, l, NL_P_O, dout, c->og, c, T, dog)) goto done;
    const float *dattn = dog;
    if (gated) {
        NL_TIMED(ps->prof, NL_GP_ACT, nl_par_gate_backward(POOL(ps), d_o, dgate, dog, c->o, c->gate, (int64_t)qn));
        dattn = d_o;
    }
    if (L->q_norm) { /* q, k again (attn_qk_rope) into dqg's place (qn + kvn <= 2qn), free until the rotation's backward
                      */
        c->q = dqg;
        c->k = dqg + qn;
        attn_qk_rope(ps, l, sp, c);
    }
    /* the sequence-local part: self-attention of the call's rows */
    for (int i = 0, t0 = 0; i < nl_span_n(sp); t0 += nl_span_len(sp, i++)) {
        size_t qo = (size_t)t0 * H * hd, ko = (size_t)t0 * Hkv * hd;
        int arc = 0;
        NL_TIMED(ps->prof, NL_GP_ATTN_BWD,
                 arc = nl_par_attention_backward(POOL(ps), ps->attn_bf16, ps->tiles,
                                                 &(nl_attn_bwd){.dq = dq + qo,
                                                                .dk = dk + ko,
                                                                .dv = dv + ko,
                                                                .dout = dattn + qo,
                                                                .out = c->o + qo,
                                                                .lse = c->lse + (size_t)t0 * H,
                                                                .q = c->q + qo,
                                                                .k = c->k + ko,
                                                                .v = c->v + ko,
                                                                .T = nl_span_len(sp, i),
                                                                .Hq = H,
                                                                .Hkv = Hkv,
                                                                .d = hd,
                                                                .scale = hp->attn_scale,
                                                                .window = L->swa ? hp->n_swa : 0}));
        if (arc) goto done; /* rc is -1: the arena mark is released there */
    }
    const nl_rope *rope = nl_rt_rope(ps->rt, l);
    if (L->q_norm && rope->head_dim == hd) { /* as in the forward: one pass over each token */
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_norm_rope_backward(POOL(ps), rope, dq, dq, c->qraw, L->q_norm, c->rstd_q, T, H, sp->pos));
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_norm_rope_backward(POOL(ps), rope, dk, dk, c->kraw, L->k_norm, c->rstd_k, T, Hkv, sp->pos));
    } else {
        NL_TIMED(ps->prof, NL_GP_ROPE, nl_par_rope(POOL(ps), rope, 1, dq, T, H, sp->pos));
        NL_TIMED(ps->prof, NL_GP_ROPE, nl_par_rope(POOL(ps), rope, 1, dk, T, Hkv, sp->pos));
        if (L->q_norm) {
            NL_TIMED(ps->prof, NL_GP_NORM,
                     nl_par_rmsnorm_backward(POOL(ps), dq, dq, c->qraw, L->q_norm, c->rstd_q, T * H, hd));
            NL_TIMED(ps->prof, NL_GP_NORM,
                     nl_par_rmsnorm_backward(POOL(ps), dk, dk, c->kraw, L->k_norm, c->rstd_k, T * Hkv, hd));
        }
    }
    const float *dqin = dq;
    if (gated) {
        NL_TIMED(
            ps->prof, NL_GP_ADD, for (size_t th = 0; th < (size_t)T * H; th++) {
                memcpy(dqg + th * 2 * hd, dq + th * hd, hd * sizeof(float));
                memcpy(dqg + th * 2 * hd + hd, dgate + th * hd, hd * sizeof(float));
            });
        dqin = dqg;
    }
    /* dhn == NULL: only the LoRA gradients (see nl_layer_backward) */
    float *dk_in = dhn ? tmp : NULL;
    if (proj_bwd(ps, l, NL_P_Q, dqin, c->hn, c, T, dhn)) goto done;
    if (proj_bwd(ps, l, NL_P_K, dk, c->hn, c, T, dk_in)) goto done;
    if (dhn) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)T * E));
    if (proj_bwd(ps, l, NL_P_V, dv, c->hn, c, T, dk_in)) goto done;
    if (dhn) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)T * E));
    rc = 0;
done:
    if (L->q_norm) c->q = c->k = NULL;
    nl_arena_release(ps->ws, mk);
    return rc;
}

/* ---- gated delta-net mixer (qwen35) ---- */

static nl_gdn_weights gdn_weights(const nl_layer *L) {
    return (nl_gdn_weights){.conv = L->ssm_conv, .dt_bias = L->ssm_dt_bias, .A = L->ssm_a, .norm = L->ssm_norm};
}

static int mixer_gdn_fwd(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, nl_seq_state *st, float *out) {
    const nl_layer *L = &ps->rt->m->layers[l];
    const nl_gdn_shape *s = &ps->rt->gdn;
    int T = sp->T;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T;
    nl_arena_mark mk = nl_arena_top(ps->ws);
    float *buf = falloc(ps, t * (cd + vd + 2 * (size_t)s->Hv));
    if (!buf) return -1;
    float *mixed = buf, *z = mixed + t * cd, *b = z + t * vd, *a = b + t * s->Hv;
    int rc = -1;
    if (proj_fwd(ps, l, NL_P_QKV, c->hn, T, mixed, c)) goto done;
    if (proj_fwd(ps, l, NL_P_Z, c->hn, T, z, c)) goto done;
    if (proj_fwd(ps, l, NL_P_BETA, c->hn, T, b, c)) goto done;
    if (proj_fwd(ps, l, NL_P_ALPHA, c->hn, T, a, c)) goto done;
    /* the sequence-local part: the recurrence, its cache kept for the backward or its state
     * carried for decoding */
    nl_gdn_weights w = gdn_weights(L);
    if (st && nl_span_n(sp) > 1) {
        nl_err("internal: a decoding state with several sequences in one call");
        goto done;
    }
    /* shared prefixes (nl_span.seg_pre): a prefix with continuations runs from a zero state
     * kept in pst; each continuation from a copy of it (cst), as one call over the joined
     * sequence would (pieces of a sequence give the bits of one call: nn/gdn.h) */
    const int *pre = nl_span_n(sp) > 1 ? sp->seg_pre : NULL;
    if (pre && c->gc) {
        nl_err("internal: shared prefixes in the training graph");
        goto done;
    }
    const size_t n_conv = (size_t)(s->K - 1) * cd + 1, n_S = (size_t)s->Hv * s->dk * s->dv;
    nl_gdn_state pst = {0}, cst = {0};
    if (pre) {
        pst.conv = falloc(ps, n_conv), pst.S = falloc(ps, n_S);
        cst.conv = falloc(ps, n_conv), cst.S = falloc(ps, n_S);
        if (!pst.conv || !pst.S || !cst.conv || !cst.S) goto done;
    }
    for (int i = 0, t0 = 0; i < nl_span_n(sp); t0 += nl_span_len(sp, i++)) {
        int Ti = nl_span_len(sp, i), e;
        size_t o = (size_t)t0;
        nl_gdn_state *gst = st ? &st->gdn[l] : NULL;
        if (pre && pre[i] >= 0) {
            memcpy(cst.conv, pst.conv, n_conv * sizeof(float));
            memcpy(cst.S, pst.S, n_S * sizeof(float));
            gst = &cst;
        } else if (pre && i + 1 < sp->n_seg && pre[i + 1] == i) {
            memset(pst.conv, 0, n_conv * sizeof(float));
            memset(pst.S, 0, n_S * sizeof(float));
            gst = &pst;
        }
        NL_TIMED(ps->prof, NL_GP_GDN,
                 e = c->gc ? nl_gdn_forward_train(POOL(ps), ps->ws, s, &w, c->y + o * vd, mixed + o * cd, z + o * vd,
                                                  b + o * s->Hv, a + o * s->Hv, Ti, c->gc[i])
                           : nl_gdn_forward(POOL(ps), ps->ws, s, &w, c->y + o * vd, mixed + o * cd, z + o * vd,
                                            b + o * s->Hv, a + o * s->Hv, Ti, gst));
        if (e) goto done;
    }
    rc = proj_fwd(ps, l, NL_P_OUT, c->y, T, out, c);
done:
    nl_arena_release(ps->ws, mk);
    return rc;
}

static int mixer_gdn_bwd(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, const float *dout, float *dhn) {
    const nl_layer *L = &ps->rt->m->layers[l];
    const nl_gdn_shape *s = &ps->rt->gdn;
    int T = sp->T;
    size_t cd = (size_t)nl_gdn_conv_dim(s), vd = (size_t)s->Hv * s->dv, t = (size_t)T, E = ps->rt->m->hp.n_embd;
    if (!c->gc) return nl_err("internal: GDN backward without its cache");
    nl_arena_mark mk = nl_arena_top(ps->ws);
    float *buf = falloc(ps, t * (vd + cd + vd + 2 * (size_t)s->Hv + E));
    if (!buf) return -1;
    float *dy = buf, *dmixed = dy + t * vd, *dz = dmixed + t * cd, *db = dz + t * vd, *da = db + t * s->Hv,
          *tmp = da + t * s->Hv;
    int rc = -1;
    nl_gdn_weights w = gdn_weights(L);
    if (proj_bwd(ps, l, NL_P_OUT, dout, c->y, c, T, dy)) goto done;
    if (c->n_gc != nl_span_n(sp)) {
        nl_err("internal: GDN backward with %d caches for %d sequences", c->n_gc, nl_span_n(sp));
        goto done;
    }
    for (int i = 0, t0 = 0; i < c->n_gc; t0 += nl_span_len(sp, i++)) {
        size_t o = (size_t)t0;
        int e;
        NL_TIMED(ps->prof, NL_GP_GDN,
                 e = nl_gdn_backward(POOL(ps), ps->ws, s, &w, c->gc[i], dy + o * vd, nl_span_len(sp, i),
                                     dmixed + o * cd, dz + o * vd, db + o * s->Hv, da + o * s->Hv));
        if (e) goto done;
    }
    /* dhn == NULL: only the LoRA gradients (see nl_layer_backward) */
    float *tin = dhn ? tmp : NULL;
    if (proj_bwd(ps, l, NL_P_QKV, dmixed, c->hn, c, T, dhn)) goto done;
    if (proj_bwd(ps, l, NL_P_Z, dz, c->hn, c, T, tin)) goto done;
    if (dhn) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)(t * E)));
    if (proj_bwd(ps, l, NL_P_BETA, db, c->hn, c, T, tin)) goto done;
    if (dhn) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)(t * E)));
    if (proj_bwd(ps, l, NL_P_ALPHA, da, c->hn, c, T, tin)) goto done;
    if (dhn) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)(t * E)));
    rc = 0;
done:
    nl_arena_release(ps->ws, mk);
    return rc;
}

/* ---- the layer ---- */

/* c->h = act(c->g, c->u) over nf elements: the forward's, and the backward's rebuild of it */
static void mlp_act(nl_pass *ps, nl_layer_cache *c, size_t nf) {
    if (ps->rt->m->hp.mlp_gelu)
        NL_TIMED(ps->prof, NL_GP_ACT, nl_par_geglu_forward(POOL(ps), c->h, c->g, c->u, (int64_t)nf));
    else NL_TIMED(ps->prof, NL_GP_ACT, nl_par_swiglu_forward(POOL(ps), c->h, c->g, c->u, (int64_t)nf));
}

int nl_layer_forward(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, nl_seq_state *st, const float *x_in,
                     float *x_out) {
    const nl_model *m = ps->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int T = sp->T;
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    nl_arena_mark mk = nl_arena_top(ps->ws);
    /* mo; hn, then hn2 in its place; h (the cache keeps none of the three: nl_layer_cache) */
    float *mo = falloc(ps, 2 * n + nf);
    if (!mo) return -1;
    c->hn = c->hn2 = mo + n;
    c->h = mo + 2 * n;
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_forward(POOL(ps), c->hn, c->rstd1, x_in, L->attn_norm, T, hp->n_embd, hp->rms_eps));
    /* with post-norms (gemma3) the mixer's and the MLP's outputs (ao, fo, kept) are normed
     * into mo before their residual adds */
    const int pn = hp->post_norms;
    int rc = L->recurrent ? mixer_gdn_fwd(ps, l, sp, c, st, pn ? c->ao : mo)
                          : mixer_attn_fwd(ps, l, sp, c, st, pn ? c->ao : mo);
    if (rc == 0) {
        if (pn)
            NL_TIMED(
                ps->prof, NL_GP_NORM,
                nl_par_rmsnorm_forward(POOL(ps), mo, c->rstd_ao, c->ao, L->attn_post_norm, T, hp->n_embd, hp->rms_eps));
        NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add2(POOL(ps), c->xmid, x_in, mo, (int64_t)n));
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_rmsnorm_forward(POOL(ps), c->hn2, c->rstd2, c->xmid, L->ffn_norm, T, hp->n_embd, hp->rms_eps));
        rc = proj_fwd(ps, l, NL_P_GATE, c->hn2, T, c->g, c);
        if (rc == 0) rc = proj_fwd(ps, l, NL_P_UP, c->hn2, T, c->u, c);
        if (rc == 0) {
            mlp_act(ps, c, nf);
            rc = proj_fwd(ps, l, NL_P_DOWN, c->h, T, pn ? c->fo : mo, c);
        }
        if (rc == 0 && pn)
            NL_TIMED(
                ps->prof, NL_GP_NORM,
                nl_par_rmsnorm_forward(POOL(ps), mo, c->rstd_fo, c->fo, L->ffn_post_norm, T, hp->n_embd, hp->rms_eps));
        if (rc == 0) NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add2(POOL(ps), x_out, c->xmid, mo, (int64_t)n));
    }
    c->hn = c->hn2 = c->h = NULL;
    nl_arena_release(ps->ws, mk);
    return rc;
}

int nl_layer_backward(nl_pass *ps, int l, const nl_span *sp, nl_layer_cache *c, const float *x_in, float *dx,
                      int want_dx) {
    const nl_model *m = ps->rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int T = sp->T;
    size_t n = (size_t)T * hp->n_embd, nf = (size_t)T * hp->n_ff;
    nl_arena_mark mk = nl_arena_top(ps->ws);
    const int pn = hp->post_norms;
    /* hn2, then hn, recomputed into dh's place once dh is spent (an own one when n_ff < n_embd) */
    const size_t xn = nf < n ? n : 0;
    float *buf = falloc(ps, 3 * nf + (pn ? 4 : 3) * n + xn);
    if (!buf) return -1;
    float *dh = buf, *dg = dh + nf, *du = dg + nf, *dhn = du + nf, *tmp = dhn + n, *dxmid = tmp + n, *dpost = dxmid + n;
    float *nbuf = xn ? dxmid + (pn ? 2 : 1) * n : dh;
    int rc = -1;
    /* MLP: x_out = xmid + down(act(gate(hn2), up(hn2))), with post-norms xmid + norm(down(..)) */
    const float *dfo = dx;
    if (pn) {
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_rmsnorm_backward(POOL(ps), dpost, dx, c->fo, L->ffn_post_norm, c->rstd_fo, T, hp->n_embd));
        dfo = dpost;
    }
    /* h = act(g, u) into dg's place (dg is written after the down projection's backward) */
    c->h = dg;
    mlp_act(ps, c, nf);
    if (proj_bwd(ps, l, NL_P_DOWN, dfo, c->h, c, T, dh)) goto done;
    c->h = NULL;
    if (hp->mlp_gelu)
        NL_TIMED(ps->prof, NL_GP_ACT, nl_par_geglu_backward(POOL(ps), dg, du, dh, c->g, c->u, (int64_t)nf));
    else NL_TIMED(ps->prof, NL_GP_ACT, nl_par_swiglu_backward(POOL(ps), dg, du, dh, c->g, c->u, (int64_t)nf));
    c->hn2 = nbuf; /* the forward's ffn norm again (its rstd2 is kept) */
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_forward(POOL(ps), c->hn2, NULL, c->xmid, L->ffn_norm, T, hp->n_embd, hp->rms_eps));
    if (proj_bwd(ps, l, NL_P_GATE, dg, c->hn2, c, T, dhn)) goto done;
    if (proj_bwd(ps, l, NL_P_UP, du, c->hn2, c, T, tmp)) goto done;
    c->hn2 = NULL;
    NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dhn, tmp, (int64_t)n));
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_backward(POOL(ps), dxmid, dhn, c->xmid, L->ffn_norm, c->rstd2, T, hp->n_embd));
    NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dxmid, dx, (int64_t)n));
    /* mixer: xmid = x_in + mixer(attn_norm(x_in)); without want_dx (layer 0, whose x_in is the
     * frozen embedding rows) no BWD requests for the mixer's input projections (their LoRA A/B
     * gradients need only dy and x), no attention-norm backward */
    float *dmix = want_dx ? dhn : NULL;
    const float *dao = dxmid;
    if (pn) {
        NL_TIMED(ps->prof, NL_GP_NORM,
                 nl_par_rmsnorm_backward(POOL(ps), dpost, dxmid, c->ao, L->attn_post_norm, c->rstd_ao, T, hp->n_embd));
        dao = dpost;
    }
    c->hn = nbuf; /* the forward's attention norm again: the mixer's projections' x (rstd1 is kept) */
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_forward(POOL(ps), c->hn, NULL, x_in, L->attn_norm, T, hp->n_embd, hp->rms_eps));
    rc = L->recurrent ? mixer_gdn_bwd(ps, l, sp, c, dao, dmix) : mixer_attn_bwd(ps, l, sp, c, dao, dmix);
    if (rc || !want_dx) goto done;
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_backward(POOL(ps), dx, dhn, x_in, L->attn_norm, c->rstd1, T, hp->n_embd));
    NL_TIMED(ps->prof, NL_GP_ADD, nl_par_add(POOL(ps), dx, dxmid, (int64_t)n));
done:
    c->hn = c->hn2 = c->h = NULL;
    nl_arena_release(ps->ws, mk);
    return rc;
}

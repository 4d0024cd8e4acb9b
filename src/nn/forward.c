/* The model forward; see forward.h. Formulas: docs/formats.md §3. */
#include "nn/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/lora.h"
#include "util/util.h"

int nl_runtime_init(nl_runtime *rt, const nl_model *m, nl_proj_service *svc) {
    memset(rt, 0, sizeof *rt);
    rt->m = m;
    rt->svc = svc;
    rt->svc_id = nl_malloc((size_t)m->n_projs * sizeof *rt->svc_id);
    if (!rt->svc_id) return -1;
    for (int i = 0; i < m->n_projs; i++) {
        const nl_proj_desc *d = &m->projs[i];
        rt->svc_id[i] = -1;
        /* One resident copy per GGUF tensor: a tied head and the embedding share it. */
        for (int j = 0; j < i; j++)
            if (m->projs[j].w == d->w) rt->svc_id[i] = rt->svc_id[j];
        if (rt->svc_id[i] >= 0) continue;
        int cls = d->cls;
        if (m->tied_head && d->w == m->projs[m->p_output].w) cls = NL_CLASS_HEAD;
        nl_proj_weight w = {
            .name = d->name, .type = d->w->type, .n_in = d->n_in, .n_out = d->n_out,
            .data = d->w->data, .cls = cls,
        };
        rt->svc_id[i] = nl_proj_add(svc, &w);
        if (rt->svc_id[i] < 0) { nl_runtime_free(rt); return -1; }
    }
    const nl_hparams *hp = &m->hp;
    rt->rope = (nl_rope){
        .head_dim = hp->head_dim, .n_rot = hp->n_rot, .neox = hp->rope_neox,
        .base = hp->rope_base, .freq_scale = hp->rope_freq_scale, .freq_factors = m->rope_freqs,
    };
    if (nl_runtime_set_threads(rt, nl_proj_threads(svc))) { nl_runtime_free(rt); return -1; }
    rt->attn_bf16 = !strcmp(nl_proj_compute(svc), "bf16");
    if (m->arch == NL_ARCH_QWEN35) {
        rt->gdn = (nl_gdn_shape){
            .Hk = hp->ssm_n_group, .Hv = hp->ssm_dt_rank, .dk = hp->ssm_d_state,
            .dv = hp->ssm_d_inner / hp->ssm_dt_rank, .K = hp->ssm_d_conv, .eps = hp->rms_eps,
            .kv_tiled = 1,
        };
    }
    return 0;
}

void nl_runtime_free(nl_runtime *rt) {
    free(rt->svc_id);
    rt->svc_id = NULL;
    if (rt->pool) nl_pool_free(rt->pool);
    rt->pool = NULL;
    nl_rope_free_table(&rt->rope);
}

int nl_runtime_set_threads(nl_runtime *rt, int n) {
    if (rt->pool) nl_pool_free(rt->pool);
    rt->pool = NULL;
    if (n <= 1) return 0;
    rt->pool = nl_pool_new(n);
    return rt->pool ? 0 : -1;
}

int nl_seq_state_init(nl_seq_state *st, const nl_model *m, int n_ctx) {
    memset(st, 0, sizeof *st);
    const nl_hparams *hp = &m->hp;
    st->n_ctx = n_ctx;
    st->k = nl_calloc((size_t)hp->n_layer, sizeof *st->k);
    st->v = nl_calloc((size_t)hp->n_layer, sizeof *st->v);
    st->gdn = nl_calloc((size_t)hp->n_layer, sizeof *st->gdn);
    if (!st->k || !st->v || !st->gdn) goto fail;
    for (int l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].recurrent) {
            int conv_dim = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
            size_t dv = (size_t)(hp->ssm_d_inner / hp->ssm_dt_rank);
            st->gdn[l].conv = nl_calloc((size_t)(hp->ssm_d_conv - 1) * conv_dim + 1, sizeof(float));
            st->gdn[l].S = nl_calloc((size_t)hp->ssm_dt_rank * hp->ssm_d_state * dv, sizeof(float));
            if (!st->gdn[l].conv || !st->gdn[l].S) goto fail;
        } else {
            size_t n = (size_t)n_ctx * hp->n_head_kv * hp->head_dim;
            st->k[l] = nl_malloc(n * sizeof(float));
            st->v[l] = nl_malloc(n * sizeof(float));
            if (!st->k[l] || !st->v[l]) goto fail;
        }
    }
    return 0;
fail:
    nl_seq_state_free(st, m);
    return -1;
}

void nl_seq_state_reset(nl_seq_state *st, const nl_model *m) {
    const nl_hparams *hp = &m->hp;
    st->n_past = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        if (!m->layers[l].recurrent) continue;
        int conv_dim = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
        size_t dv = (size_t)(hp->ssm_d_inner / hp->ssm_dt_rank);
        memset(st->gdn[l].conv, 0, (size_t)(hp->ssm_d_conv - 1) * conv_dim * sizeof(float));
        memset(st->gdn[l].S, 0, (size_t)hp->ssm_dt_rank * hp->ssm_d_state * dv * sizeof(float));
    }
}

void nl_seq_state_copy(nl_seq_state *dst, const nl_seq_state *src, const nl_model *m, int with_kv) {
    const nl_hparams *hp = &m->hp;
    dst->n_past = src->n_past;
    for (int l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].recurrent) {
            int conv_dim = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
            size_t dv = (size_t)(hp->ssm_d_inner / hp->ssm_dt_rank);
            memcpy(dst->gdn[l].conv, src->gdn[l].conv, (size_t)(hp->ssm_d_conv - 1) * conv_dim * sizeof(float));
            memcpy(dst->gdn[l].S, src->gdn[l].S, (size_t)hp->ssm_dt_rank * hp->ssm_d_state * dv * sizeof(float));
        } else if (with_kv) {
            size_t n = (size_t)src->n_past * hp->n_head_kv * hp->head_dim;
            memcpy(dst->k[l], src->k[l], n * sizeof(float));
            memcpy(dst->v[l], src->v[l], n * sizeof(float));
        }
    }
}

void nl_seq_state_free(nl_seq_state *st, const nl_model *m) {
    for (int l = 0; l < m->hp.n_layer; l++) {
        if (st->k) free(st->k[l]);
        if (st->v) free(st->v[l]);
        if (st->gdn) { free(st->gdn[l].conv); free(st->gdn[l].S); }
    }
    free(st->k);
    free(st->v);
    free(st->gdn);
    memset(st, 0, sizeof *st);
}

int nl_rt_proj(nl_runtime *rt, int p, const float *x, int T, float *y) {
    if (p < 0) return nl_err("internal: projection missing");
    const nl_adapter *a = rt->adapter;
    int e = a ? a->by_proj[p] : -1;
    if (nl_rt_pace(rt)) return -1;
    if (nl_proj_submit(rt->svc, rt->svc_id[p], NL_FWD, x, T, y)) return -1;
    float *ly = NULL;
    if (e >= 0) {
        /* The LoRA branch runs on the CPU while the base product is in flight. */
        const nl_lora_tensor *t = &a->t[e];
        nl_lora L = {.n_in = (int)t->n_in, .n_out = (int)t->n_out, .rank = t->rank, .scale = nl_adapter_scale(a, e)};
        ly = nl_calloc((size_t)T * (size_t)t->n_out, sizeof(float));
        if (ly && nl_lora_apply(&L, nl_lora_A(a, e), nl_lora_B(a, e), ly, x, T)) { free(ly); ly = NULL; }
    }
    int rc = nl_proj_wait(rt->svc);
    if (rc == 0 && e >= 0) {
        if (!ly) return -1;
        size_t n = (size_t)T * (size_t)rt->m->projs[p].n_out;
        for (size_t i = 0; i < n; i++) y[i] += ly[i];
    }
    free(ly);
    return rc;
}

/* Attention layer (llama, qwen3, qwen35 gated). hn[T][E] is the normed input; out[T][E]. */
static int attn_layer(nl_runtime *rt, int l, nl_seq_state *st, const float *hn, const int32_t *pos, int T, float *out) {
    const nl_model *m = rt->m;
    const nl_hparams *hp = &m->hp;
    const nl_layer *L = &m->layers[l];
    int H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    int gated = m->arch == NL_ARCH_QWEN35;
    size_t qn = (size_t)T * H * hd, kvn = (size_t)T * Hkv * hd;
    float *buf = nl_malloc((gated ? 3 * qn : 2 * qn) * sizeof(float) + 2 * kvn * sizeof(float));
    if (!buf) return -1;
    float *q = buf, *o = q + qn, *k = o + qn, *v = k + kvn, *gate = v + kvn;
    int rc = -1;
    if (gated) {
        /* attn_q gives [T][H][q(hd) | gate(hd)]: de-interleave. */
        float *qg = nl_malloc(2 * qn * sizeof(float));
        if (!qg) goto done;
        if (nl_rt_proj(rt, L->p[NL_P_Q], hn, T, qg)) { free(qg); goto done; }
        for (size_t th = 0; th < (size_t)T * H; th++) {
            memcpy(q + th * hd, qg + th * 2 * hd, hd * sizeof(float));
            memcpy(gate + th * hd, qg + th * 2 * hd + hd, hd * sizeof(float));
        }
        free(qg);
    } else if (nl_rt_proj(rt, L->p[NL_P_Q], hn, T, q)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_K], hn, T, k)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_V], hn, T, v)) goto done;
    if (L->q_norm) nl_rmsnorm_forward(q, NULL, q, L->q_norm, T * H, hd, hp->rms_eps);
    if (L->k_norm) nl_rmsnorm_forward(k, NULL, k, L->k_norm, T * Hkv, hd, hp->rms_eps);
    nl_rope_forward(&rt->rope, q, T, H, pos);
    nl_rope_forward(&rt->rope, k, T, Hkv, pos);
    float scale = 1.0f / sqrtf((float)hd);
    if (st) {
        if (st->n_past + T > st->n_ctx) { nl_err("context full: %d + %d tokens > %d", st->n_past, T, st->n_ctx); goto done; }
        size_t row = (size_t)Hkv * hd;
        memcpy(st->k[l] + (size_t)st->n_past * row, k, kvn * sizeof(float));
        memcpy(st->v[l] + (size_t)st->n_past * row, v, kvn * sizeof(float));
        nl_attention_forward(o, NULL, q, st->k[l], st->v[l], T, st->n_past + T, H, Hkv, hd, scale);
    } else {
        nl_attention_forward(o, NULL, q, k, v, T, T, H, Hkv, hd, scale);
    }
    if (gated) nl_gate_forward(o, o, gate, (int64_t)qn);
    rc = nl_rt_proj(rt, L->p[NL_P_O], o, T, out);
done:
    free(buf);
    return rc;
}

/* Gated delta-net layer (qwen35). */
static int gdn_layer(nl_runtime *rt, int l, nl_seq_state *st, const float *hn, int T, float *out) {
    const nl_model *m = rt->m;
    const nl_layer *L = &m->layers[l];
    const nl_gdn_shape *s = &rt->gdn;
    int conv_dim = nl_gdn_conv_dim(s), vd = s->Hv * s->dv;
    size_t n = (size_t)T * ((size_t)conv_dim + 2 * (size_t)vd + 2 * (size_t)s->Hv);
    float *buf = nl_malloc(n * sizeof(float));
    if (!buf) return -1;
    float *mixed = buf, *z = mixed + (size_t)T * conv_dim, *b = z + (size_t)T * vd, *a = b + (size_t)T * s->Hv,
          *y = a + (size_t)T * s->Hv;
    int rc = -1;
    if (nl_rt_proj(rt, L->p[NL_P_QKV], hn, T, mixed)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_Z], hn, T, z)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_BETA], hn, T, b)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_ALPHA], hn, T, a)) goto done;
    nl_gdn_weights w = {.conv = L->ssm_conv, .dt_bias = L->ssm_dt_bias, .A = L->ssm_a, .norm = L->ssm_norm};
    if (nl_gdn_forward(s, &w, y, mixed, z, b, a, T, st ? &st->gdn[l] : NULL)) goto done;
    rc = nl_rt_proj(rt, L->p[NL_P_OUT], y, T, out);
done:
    free(buf);
    return rc;
}

/* SwiGLU MLP. */
static int mlp_layer(nl_runtime *rt, int l, const float *hn, int T, float *out) {
    const nl_model *m = rt->m;
    const nl_layer *L = &m->layers[l];
    size_t n = (size_t)T * m->hp.n_ff;
    float *g = nl_malloc(2 * n * sizeof(float));
    if (!g) return -1;
    float *u = g + n;
    int rc = -1;
    if (nl_rt_proj(rt, L->p[NL_P_GATE], hn, T, g)) goto done;
    if (nl_rt_proj(rt, L->p[NL_P_UP], hn, T, u)) goto done;
    nl_swiglu_forward(g, g, u, (int64_t)n);
    rc = nl_rt_proj(rt, L->p[NL_P_DOWN], g, T, out);
done:
    free(g);
    return rc;
}

int nl_forward(nl_runtime *rt, nl_seq_state *st, const int32_t *tokens, int T, float *x) {
    const nl_model *m = rt->m;
    const nl_hparams *hp = &m->hp;
    int E = hp->n_embd;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return nl_err("token %d at position %d is outside the vocabulary (0..%d)", tokens[t], t, hp->n_vocab - 1);
    if (nl_proj_get_rows(rt->svc, rt->svc_id[m->p_embed], tokens, T, x)) return -1;
    size_t n = (size_t)T * E;
    float *hn = nl_malloc(2 * n * sizeof(float));
    int32_t *pos = nl_malloc((size_t)T * sizeof *pos);
    if (!hn || !pos) { free(hn); free(pos); return -1; }
    float *dx = hn + n;
    int base = st ? st->n_past : 0;
    for (int t = 0; t < T; t++) pos[t] = base + t;
    int rc = 0;
    for (int l = 0; l < hp->n_layer && rc == 0; l++) {
        const nl_layer *L = &m->layers[l];
        nl_rmsnorm_forward(hn, NULL, x, L->attn_norm, T, E, hp->rms_eps);
        rc = L->recurrent ? gdn_layer(rt, l, st, hn, T, dx) : attn_layer(rt, l, st, hn, pos, T, dx);
        if (rc) break;
        for (size_t i = 0; i < n; i++) x[i] += dx[i];
        nl_rmsnorm_forward(hn, NULL, x, L->ffn_norm, T, E, hp->rms_eps);
        rc = mlp_layer(rt, l, hn, T, dx);
        if (rc) break;
        for (size_t i = 0; i < n; i++) x[i] += dx[i];
    }
    if (rc == 0 && st) st->n_past += T;
    free(hn);
    free(pos);
    return rc;
}

int nl_head_logits(nl_runtime *rt, const float *hidden, int T, float *logits) {
    const nl_model *m = rt->m;
    int E = m->hp.n_embd;
    float *hn = nl_malloc((size_t)T * E * sizeof(float));
    if (!hn) return -1;
    nl_rmsnorm_forward(hn, NULL, hidden, m->output_norm, T, E, m->hp.rms_eps);
    int rc = nl_rt_proj(rt, m->p_output, hn, T, logits);
    free(hn);
    return rc;
}

/* Rows per head chunk: bounds the logits buffer to HEAD_CHUNK × V floats. */
#define HEAD_CHUNK 64

int nl_head_loss(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *sum, float *row_loss) {
    const nl_model *m = rt->m;
    int E = m->hp.n_embd, V = m->hp.n_vocab;
    int C = T < HEAD_CHUNK ? T : HEAD_CHUNK;
    float *z = nl_malloc((size_t)C * V * sizeof(float));
    if (!z) return -1;
    *sum = 0.0;
    int rc = 0;
    for (int t0 = 0; t0 < T && rc == 0; t0 += C) {
        int n = T - t0 < C ? T - t0 : C;
        rc = nl_head_logits(rt, hidden + (size_t)t0 * E, n, z);
        if (rc) break;
        for (int t = 0; t < n; t++) {
            double l = 0.0;
            if (targets[t0 + t] >= 0) l = nl_xent_chunk(z + (size_t)t * V, targets + t0 + t, 1, V, 1.0f, 0);
            *sum += l;
            if (row_loss) row_loss[t0 + t] = (float)l;
        }
    }
    free(z);
    return rc;
}

/* The model forward; see forward.h. Formulas: docs/formats.md §3. */
#include "nn/forward.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/amx.h"
#include "cpu/vecmath.h"
#include "nn/head.h"
#include "nn/layer.h"
#include "nn/lora.h"
#include "nn/par.h"
#include "util/util.h"

/* The gated delta-net's shape from the model's ssm_* hyperparameters (qwen35). */
static nl_gdn_shape gdn_shape(const nl_model *m) {
    const nl_hparams *hp = &m->hp;
    return (nl_gdn_shape){
        .Hk = hp->ssm_n_group,
        .Hv = hp->ssm_dt_rank,
        .dk = hp->ssm_d_state,
        .dv = hp->ssm_d_inner / hp->ssm_dt_rank,
        .K = hp->ssm_d_conv,
        .eps = hp->rms_eps,
        .kv_tiled = 1,
    };
}

/* Floats of a recurrent layer's decoding state: the conv window and the recurrent state. */
static size_t gdn_conv_floats(const nl_model *m) {
    nl_gdn_shape s = gdn_shape(m);
    return (size_t)(s.K - 1) * (size_t)nl_gdn_conv_dim(&s);
}
static size_t gdn_state_floats(const nl_model *m) {
    nl_gdn_shape s = gdn_shape(m);
    return (size_t)s.Hv * (size_t)s.dk * (size_t)s.dv;
}

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
            .name = d->name,
            .type = d->w->type,
            .n_in = d->n_in,
            .n_out = d->n_out,
            .data = d->w->data,
            .cls = cls,
        };
        rt->svc_id[i] = nl_proj_add(svc, &w);
        if (rt->svc_id[i] < 0) {
            nl_runtime_free(rt);
            return -1;
        }
    }
    const nl_hparams *hp = &m->hp;
    rt->rope = (nl_rope){
        .head_dim = hp->head_dim,
        .n_rot = hp->n_rot,
        .neox = hp->rope_neox,
        .base = hp->rope_base,
        .freq_scale = hp->rope_freq_scale,
        .freq_factors = m->rope_freqs,
    };
    rt->rope_swa = rt->rope;
    if (hp->n_swa > 0) {
        /* llama.cpp: the local layers' own base, no scaling */
        rt->rope_swa.base = hp->rope_base_swa;
        rt->rope_swa.freq_scale = 1.0f;
    }
    if (nl_runtime_set_threads(rt, nl_proj_threads(svc))) {
        nl_runtime_free(rt);
        return -1;
    }
    rt->attn_bf16 = nl_proj_node_bf16(svc);
    /* NL_AMX_NODES=off keeps the nodes on the vector paths under a tile service (to measure
     * the nodes' share: docs/bench-proj.md) */
    const char *nodes = getenv("NL_AMX_NODES");
    rt->tiles = nodes && !strcmp(nodes, "off") ? NULL : nl_proj_node_tiles(svc);
    if (m->arch == NL_ARCH_QWEN35) rt->gdn = gdn_shape(m);
    return 0;
}

void nl_runtime_free(nl_runtime *rt) {
    free(rt->svc_id);
    rt->svc_id = NULL;
    if (rt->pool) nl_pool_free(rt->pool);
    rt->pool = NULL;
    nl_rope_free_table(&rt->rope);
    nl_rope_free_table(&rt->rope_swa);
    if (rt->fws) nl_arena_free(rt->fws);
    free(rt->fws);
    rt->fws = NULL;
}

/* the forward's arena (made at the first call) */
static nl_arena *fws_of(nl_runtime *rt) {
    if (!rt->fws) rt->fws = nl_calloc(1, sizeof *rt->fws);
    return rt->fws;
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
            st->gdn[l].conv = nl_calloc(gdn_conv_floats(m) + 1, sizeof(float));
            st->gdn[l].S = nl_calloc(gdn_state_floats(m), sizeof(float));
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
        memset(st->gdn[l].conv, 0, gdn_conv_floats(m) * sizeof(float));
        memset(st->gdn[l].S, 0, gdn_state_floats(m) * sizeof(float));
    }
}

void nl_seq_state_copy(nl_seq_state *dst, const nl_seq_state *src, const nl_model *m, int with_kv) {
    const nl_hparams *hp = &m->hp;
    dst->n_past = src->n_past;
    for (int l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].recurrent) {
            memcpy(dst->gdn[l].conv, src->gdn[l].conv, gdn_conv_floats(m) * sizeof(float));
            memcpy(dst->gdn[l].S, src->gdn[l].S, gdn_state_floats(m) * sizeof(float));
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
        if (st->gdn) {
            free(st->gdn[l].conv);
            free(st->gdn[l].S);
        }
    }
    free(st->k);
    free(st->v);
    free(st->gdn);
    memset(st, 0, sizeof *st);
}

/* The adapter's LoRA of projection e over rows [t0, t1) of a call. */
typedef struct {
    nl_lora L;
    const float *A, *B, *x;
    float *y;
    int T, acc, rc[8];
} rt_lora_job;

static void rt_lora_task(void *arg, int task, int n_tasks) {
    rt_lora_job *j = arg;
    const int64_t nb = (j->T + 31) / 32; /* whole 32-row blocks (nn/lora's) to each task */
    const int t0 = (int)(32 * (nb * task / n_tasks)),
              t1 = task + 1 == n_tasks ? j->T : (int)(32 * (nb * (task + 1) / n_tasks));
    j->rc[task] = t1 > t0 ? nl_lora_forward_rows(&j->L, j->A, j->B, j->y, NULL, j->x, 0, NULL, j->acc, t0, t1) : 0;
}

/* y (acc NL_LORA_ADD: +)= the LoRA term of rows [0, T), on the runtime's pool when the branch is
 * worth the hand-off (the service is idle then: rt->sync, or the add after the wait). Every
 * element's bits are those of nl_lora_forward_to over all rows (one chain per element, whatever
 * the rows' split); NL_LORA_ADD: y + that term, as a buffer added afterwards. */
static int rt_lora(nl_runtime *rt, int e, const float *x, int T, float *y, int acc, int on_pool) {
    const nl_adapter *a = rt->adapter;
    const nl_lora_tensor *t = &a->t[e];
    rt_lora_job j = {
        .L = {.n_in = (int)t->n_in, .n_out = (int)t->n_out, .rank = t->rank, .scale = nl_adapter_scale(a, e)},
        .A = nl_lora_A(a, e),
        .B = nl_lora_B(a, e),
        .x = x,
        .y = y,
        .T = T,
        .acc = acc};
    const int64_t work = (int64_t)T * t->rank * (t->n_in + t->n_out);
    int n = on_pool && rt->pool && work >= 32768 && T >= 2 ? nl_pool_size(rt->pool) : 1;
    if (n > (int)(sizeof j.rc / sizeof *j.rc)) n = (int)(sizeof j.rc / sizeof *j.rc);
    if (n > T) n = T;
    if (n > 1) nl_pool_run(rt->pool, n, rt_lora_task, &j);
    else rt_lora_task(&j, 0, 1);
    for (int i = 0; i < n; i++)
        if (j.rc[i]) /* a worker's message is in its own thread's error slot */
            return n > 1 ? nl_err("lora forward: a pool task failed (out of memory for scratch?)") : -1;
    return 0;
}

/* rt->sync (the CPU backends: their threads own the cores while a request is in flight): the
 * branch after the wait, on the pool, each token block's term added into y while in cache
 * (NL_LORA_ADD). Otherwise the branch runs on this thread while the request is in flight, into
 * its own buffer (accumulate 0: no zeroing pass), added after the wait on the pool. Both give
 * y = W x + (the term) with the term's bits the same. */
int nl_rt_proj(nl_runtime *rt, int p, const float *x, int T, float *y) {
    if (p < 0) return nl_err("internal: projection missing");
    const nl_adapter *a = rt->adapter;
    int e = a ? a->by_proj[p] : -1;
    if (nl_rt_pace(rt)) return -1;
    if (nl_proj_submit(rt->svc, rt->svc_id[p], NL_FWD, x, T, y)) return -1;
    if (rt->sync) {
        if (nl_proj_wait(rt->svc)) return -1;
        return e >= 0 ? rt_lora(rt, e, x, T, y, NL_LORA_ADD, 1) : 0;
    }
    float *ly = NULL;
    nl_arena *ws = e >= 0 ? fws_of(rt) : NULL;
    nl_arena_mark mk = ws ? nl_arena_top(ws) : (nl_arena_mark){0};
    if (e >= 0 && ws) {
        ly = nl_arena_floats(ws, (size_t)T * (size_t)a->t[e].n_out);
        if (ly && rt_lora(rt, e, x, T, ly, 0, 0)) ly = NULL;
    }
    int rc = nl_proj_wait(rt->svc);
    if (rc == 0 && e >= 0) {
        if (!ly) rc = -1;
        else nl_par_add(rt->pool, y, ly, (int64_t)T * rt->m->projs[p].n_out);
    }
    if (ws) nl_arena_release(ws, mk);
    return rc;
}

/* The layers' projections in the forward: the service plus the adapter's LoRA (nl_rt_proj). */
static int forward_proj(void *user, const nl_pass_req *r) {
    if (r->dir != NL_FWD) return nl_err("internal: the model forward has no backward");
    return nl_rt_proj(user, r->p, r->in, r->T, r->out);
}

int nl_check_tokens(const nl_model *m, const int32_t *tokens, int T) {
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->hp.n_vocab)
            return nl_err("token %d at position %d is outside the vocabulary (0..%d)", tokens[t], t, m->hp.n_vocab - 1);
    return 0;
}

int nl_embed_rows(nl_runtime *rt, const int32_t *tokens, int T, float *x) {
    const nl_model *m = rt->m;
    if (nl_proj_get_rows(rt->svc, rt->svc_id[m->p_embed], tokens, T, x)) return -1;
    const float sc = m->hp.embd_scale;
    const int E = m->hp.n_embd;
    if (sc != 1.0f && sc != 0.0f)
        for (int t = 0; t < T; t++) nl_vscale(x + (size_t)t * E, sc, E);
    return 0;
}

/* nl_forward (n_seg 0: one sequence, at st's position) and nl_forward_packed (n_seg fresh
 * sequences, no state; seg_pre: nl_forward_packed_prefix's continuations). */
static int forward_span(nl_runtime *rt, nl_seq_state *st, const int32_t *tokens, int T, int n_seg, const int *seg_T,
                        const int *seg_pre, float *x) {
    const nl_model *m = rt->m;
    const nl_hparams *hp = &m->hp;
    if (nl_check_tokens(m, tokens, T)) return -1;
    if (nl_embed_rows(rt, tokens, T, x)) return -1;
    /* the layers of nn/layer.h, each cache a temporary: no LoRA u rows, no GDN cache (the
     * recurrence carries st's state instead), attention in FP32 */
    nl_arena *ws = fws_of(rt);
    if (!ws) return -1;
    const nl_arena_mark m0 = nl_arena_top(ws);
    nl_pass ps = {.rt = rt, .ws = ws, .proj = forward_proj, .user = rt};
    int32_t *pos = nl_arena_alloc(ws, (size_t)T * sizeof *pos);
    if (!pos) return -1;
    int base = st ? st->n_past : 0;
    if (n_seg > 1) {
        for (int i = 0, t0 = 0; i < n_seg; t0 += seg_T[i++]) {
            const int p0 =
                seg_pre && seg_pre[i] >= 0 ? seg_T[seg_pre[i]] : 0; /* a continuation goes on after its prefix */
            for (int t = 0; t < seg_T[i]; t++) pos[t0 + t] = p0 + t;
        }
    } else {
        for (int t = 0; t < T; t++) pos[t] = base + t;
    }
    const nl_span sp = {.T = T,
                        .pos = pos,
                        .n_seg = n_seg > 1 ? n_seg : 0,
                        .seg_T = n_seg > 1 ? seg_T : NULL,
                        .seg_pre = n_seg > 1 ? seg_pre : NULL};
    int rc = nl_span_check(&sp);
    if (rc == 0 && !st) {
        /* fresh sequences (eval's batches): cos/sin of their positions once, in the runtime's
         * table (the same floats as computed in every RoPE call; decoding keeps computing them,
         * so a long generation grows no table) */
        int n_pos = 0;
        for (int t = 0; t < T; t++)
            if (pos[t] + 1 > n_pos) n_pos = pos[t] + 1;
        rc = nl_rope_table(&rt->rope, n_pos);
        if (rc == 0 && hp->n_swa > 0) rc = nl_rope_table(&rt->rope_swa, n_pos);
    }
    for (int l = 0; l < hp->n_layer && rc == 0; l++) {
        nl_arena_mark mk = nl_arena_top(ws);
        nl_layer_cache c;
        rc = nl_layer_cache_alloc(&ps, l, &sp, &c);
        if (rc == 0) rc = nl_layer_forward(&ps, l, &sp, &c, st, x, x);
        nl_layer_cache_free(&c);
        nl_arena_release(ws, mk);
    }
    if (rc == 0 && st) st->n_past += T;
    nl_arena_release(ws, m0);
    return rc;
}

int nl_forward(nl_runtime *rt, nl_seq_state *st, const int32_t *tokens, int T, float *x) {
    return forward_span(rt, st, tokens, T, 0, NULL, NULL, x);
}

int nl_forward_packed(nl_runtime *rt, const int32_t *tokens, int T, int n_seg, const int *seg_T, float *hidden) {
    return nl_forward_packed_prefix(rt, tokens, T, n_seg, seg_T, NULL, hidden);
}

int nl_forward_packed_prefix(nl_runtime *rt, const int32_t *tokens, int T, int n_seg, const int *seg_T,
                             const int *seg_pre, float *hidden) {
    if (n_seg < 1 || !seg_T) return nl_err("forward: no sequences");
    int64_t sum = 0;
    for (int i = 0; i < n_seg; i++) {
        if (seg_T[i] < 1) return nl_err("forward: sequence %d has %d tokens", i, seg_T[i]);
        sum += seg_T[i];
    }
    if (sum != T) return nl_err("forward: the sequences hold %lld tokens, not %d", (long long)sum, T);
    if (seg_pre && n_seg == 1 && seg_pre[0] != -1)
        return nl_err("forward: sequence 0 continues sequence %d, but no prefix comes before it", seg_pre[0]);
    return forward_span(rt, NULL, tokens, T, n_seg, seg_T, seg_pre, hidden);
}

/* ---- the head (nn/head.h) with the model forward's projections and arena ---- */

int nl_head_logits(nl_runtime *rt, const float *hidden, int T, float *logits) {
    nl_arena *ws = fws_of(rt);
    if (!ws) return -1;
    nl_pass ps = {.rt = rt, .ws = ws, .proj = forward_proj, .user = rt};
    return nl_head_pass_logits(&ps, hidden, T, logits);
}

/* nl_head_loss with the rows' losses as floats (row_loss) and/or doubles (row_loss_d) */
static int head_loss(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *sum, float *row_loss,
                     double *row_loss_d) {
    nl_arena *ws = fws_of(rt);
    if (!ws) return -1;
    const nl_arena_mark mk = nl_arena_top(ws);
    double *rl = row_loss_d ? row_loss_d : nl_arena_alloc(ws, (size_t)T * sizeof *rl);
    if (!rl) return -1;
    nl_pass ps = {.rt = rt, .ws = ws, .proj = forward_proj, .user = rt};
    int rc = nl_head_pass_loss(&ps, hidden, targets, T, 1.0f, rl, NULL);
    *sum = 0.0;
    for (int t = 0; rc == 0 && t < T; t++) {
        *sum += rl[t]; /* in row order */
        if (row_loss) row_loss[t] = (float)rl[t];
    }
    nl_arena_release(ws, mk);
    return rc;
}

int nl_head_loss(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *sum, float *row_loss) {
    return head_loss(rt, hidden, targets, T, sum, row_loss, NULL);
}

int nl_head_loss_rows(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *row_loss) {
    double sum;
    return head_loss(rt, hidden, targets, T, &sum, NULL, row_loss);
}

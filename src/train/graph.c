/* The training graph; see graph.h. The layers themselves (forward, backward): nn/layer.c;
 * here the step around them: which caches stay, recompute, the head (nn/head.c's, its loss summed
 * per sequence), the LoRA branches with their gradients. */
#include "train/graph.h"

#include <stdlib.h>
#include <string.h>

#include "nn/head.h"
#include "nn/layer.h"
#include "nn/lora.h"
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

/* the layer caches keep the LoRA dropout masks' bits where the graph has a dropout */
static int mask_flag(const nl_graph *g) { return g->dropout > 0.0f ? NL_CACHE_MASK : 0; }

uint64_t nl_graph_layer_bytes(const nl_graph *g, int layer, int T) {
    return nl_layer_cache_bytes(g->rt, g->ad, NL_CACHE_GDN | mask_flag(g), layer, T);
}

/* ---- the call's peak, bounded (nl_graph_call_bytes) ---- */

static uint64_t A4(uint64_t floats) { return nl_arena_size((size_t)(4 * floats)); }
static uint64_t max2(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* what tproj takes from the arena for one request: the LoRA branch's output, its scratch */
static uint64_t proj_temp(void *user, nl_dir dir, int p, int T) {
    const nl_graph *g = user;
    const int e = p >= 0 ? g->ad->by_proj[p] : -1;
    if (e < 0) return 0;
    const nl_lora_tensor *t = &g->ad->t[e];
    if (dir == NL_FWD) return A4((uint64_t)T * t->n_out);
    const nl_lora L = {.n_in = (int)t->n_in, .n_out = (int)t->n_out, .rank = t->rank, .dropout = g->dropout};
    return A4((uint64_t)T * t->n_in) + A4(nl_lora_bwd_scratch_floats(&L, T));
}

/* the head's temporaries: head()'s row losses, nn/head's */
static uint64_t head_temp(const nl_graph *g, int T, int want_grad) {
    return nl_arena_size(8 * (size_t)T) + nl_head_pass_bytes(g->rt, g->ad, T, want_grad, proj_temp, (void *)g);
}

uint64_t nl_graph_call_bytes(const nl_graph *g, int T, uint64_t budget, int want_grad, uint64_t *kept_out) {
    const nl_runtime *rt = g->rt;
    const int nL = rt->m->hp.n_layer;
    const uint64_t n = (uint64_t)T * (uint64_t)rt->m->hp.n_embd;
    uint64_t *lb = malloc(((size_t)nL + 1) * sizeof *lb);
    unsigned char *keep = malloc((size_t)nL + 1);
    if (!lb || !keep) {
        free(lb);
        free(keep);
        return UINT64_MAX;
    }
    for (int l = 0; l < nL; l++) lb[l] = nl_graph_layer_bytes(g, l, T);
    nl_act_plan plan;
    if (nl_act_plan_layers(lb, nL, want_grad ? budget : 0, keep, &plan)) memset(keep, 0, (size_t)nL);
    /* run()'s own: the layer inputs, the final state and dx; positions, the plan, the marks, the caches' headers */
    const uint64_t base = A4((uint64_t)(nL + 2) * n) + A4((uint64_t)T) + nl_arena_size((size_t)nL) +
                          nl_arena_size((size_t)nL * 8) + nl_arena_size((size_t)nL * sizeof(nl_arena_mark)) +
                          nl_arena_size((size_t)nL * sizeof(nl_layer_cache));
    uint64_t below = 0, peak = 0;
    for (int l = 0; l < nL; l++) {
        /* a layer's cache (its block; a recurrent one's GDN cache pointers and cache, all in the arena) */
        const uint64_t c = rt->m->layers[l].recurrent
                               ? nl_arena_size((size_t)nl_layer_cache_bytes(rt, g->ad, mask_flag(g), l, T)) +
                                     nl_arena_size(sizeof(void *)) + nl_gdn_cache_arena_bytes(&rt->gdn, T)
                               : nl_arena_size((size_t)lb[l]);
        const uint64_t fwd = nl_layer_temp_bytes(rt, l, T, 0, proj_temp, (void *)g);
        peak = max2(peak, below + c + fwd);
        if (want_grad)
            peak =
                max2(peak, below + c + max2(keep[l] ? 0 : fwd, nl_layer_temp_bytes(rt, l, T, 1, proj_temp, (void *)g)));
        if (keep[l]) below += c;
    }
    peak = max2(peak, below + head_temp(g, T, want_grad));
    if (kept_out) *kept_out = below;
    free(lb);
    free(keep);
    return base + peak;
}

static double tic(const nl_graph *g) { return nl_prof_tic(g->prof); }
static double toc(nl_graph *g, int k, double t0) { return nl_prof_toc(g->prof, k, t0); }

/* ---- projections with their LoRA branch ---- */

/* The LoRA node's view of adapter entry e, with its dropout key for (layer, kind); its per-row
 * products in BF16 when the step's are (rt->attn_bf16: the service computes in BF16). */
static nl_lora lora_of(const nl_graph *g, int e, int layer, int kind) {
    const nl_lora_tensor *t = &g->ad->t[e];
    return (nl_lora){.n_in = (int)t->n_in,
                     .n_out = (int)t->n_out,
                     .rank = t->rank,
                     .scale = nl_adapter_scale(g->ad, e),
                     .dropout = g->dropout,
                     .key = nl_lora_dropout_key(g->seed, (uint64_t)g->step, layer, kind),
                     .tiles = g->rt->tiles,
                     .bf16 = g->rt->attn_bf16};
}

/* The LoRA branch of one projection as pool tasks (nn/lora.h's split API). Phase 0: FWD rows
 * or BWD rows (dx, du, s·u, x ⊙ m), split by token rows; phase 1 (BWD, after every row of
 * phase 0): dA's columns and dB's rows, split by those lines, each a chain over all tokens. So
 * every output element is computed exactly as one thread computes it. On the tiles the backward
 * goes by lines (nn/lora.h: nl_lora_bwd_by_lines): phase 0 du and s·u only, phase 1 dx's columns
 * with dA's (x read once, x ⊙ m never stored) and dB's rows: the same bits. */
#define LORA_MAX_TASKS 64
typedef struct {
    const nl_lora *L;
    const float *A, *B;
    nl_dir dir;
    int phase, T, acc; /* acc: 0, or NL_LORA_ADD (out is the service's output) */
    float *out, *u_save, *dA, *dB, *scr;
    const float *in, *x, *u_in;
    int64_t tok0;
    const int64_t *toks;
    int rc[LORA_MAX_TASKS];
} lora_job;

/* Task `task`'s first line of the by-lines phase (nl_lora_backward_lines): dA's and dx's columns
 * weighted by the passes over x and dx (1, or 3 with dx: x read, dx read and written) against
 * dB's rows' one over dy; column bounds on whole 32-column tiles. */
static int line_cut(const lora_job *j, int task, int n_tasks) {
    const int64_t K = j->L->n_in, N = j->L->n_out, wk = j->out ? 3 : 1, W = wk * K + N;
    const int64_t b = W * task / n_tasks;
    if (task == n_tasks) return (int)(K + N);
    if (b >= wk * K) return (int)(K + b - wk * K);
    const int64_t c = b / wk / 32 * 32;
    return (int)(c < K ? c : K);
}

static void lora_task(void *arg, int task, int n_tasks) {
    lora_job *j = arg;
    const int lines = j->dir == NL_BWD && nl_lora_bwd_by_lines(j->L);
    if (j->phase == 1 && lines) {
        j->rc[task] =
            nl_lora_backward_lines(j->L, j->A, j->out, j->acc, j->dA, j->dB, j->in, j->x, j->T, j->tok0, j->toks,
                                   j->scr, line_cut(j, task, n_tasks), line_cut(j, task + 1, n_tasks));
        return;
    }
    if (j->phase == 1) {
        const int64_t J = (int64_t)j->L->n_in + j->L->n_out;
        j->rc[task] = nl_lora_backward_params(j->L, j->dA, j->dB, j->in, j->x, j->T, j->scr, (int)(J * task / n_tasks),
                                              (int)(J * (task + 1) / n_tasks));
        return;
    }
    const int t0 = (int)((int64_t)j->T * task / n_tasks), t1 = (int)((int64_t)j->T * (task + 1) / n_tasks);
    if (t0 >= t1) return;
    if (j->dir == NL_FWD)
        j->rc[task] =
            nl_lora_forward_rows(j->L, j->A, j->B, j->out, j->u_save, j->in, j->tok0, j->toks, j->acc, t0, t1);
    else if (lines)
        j->rc[task] =
            nl_lora_backward_du(j->L, j->A, j->B, j->in, j->x, j->u_in, j->T, j->tok0, j->toks, j->scr, t0, t1);
    else
        j->rc[task] = nl_lora_backward_rows(j->L, j->A, j->B, j->out, j->acc, j->in, j->x, j->u_in, j->T, j->tok0,
                                            j->toks, j->scr, t0, t1);
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
                return n > 1 ? nl_err("lora %s: a pool task failed (out of memory for scratch?)",
                                      j->dir == NL_FWD ? "forward" : "backward")
                             : -1;
    }
    return 0;
}

/* One frozen projection with its LoRA branch, in either direction:
 *   NL_FWD: out[T][N] = in·Wᵀ + LoRA(in); u_save[T][r] receives the LoRA u (when adapted).
 *   NL_BWD: out[T][K] = in·W + LoRA's dx, with in = dy; x and u_in are the forward's input and
 *           saved u; the LoRA gradients accumulate into g->grads.
 * r->rows: each row's index in the call (the head's gathered rows), its dropout masks keyed by
 * g->tok_base + toks[row]; NULL: g->tok_base + row. r->mask_save: the forward keeps the masks'
 * bits there (the layers' caches, beside u); r->mask_in: the backward reads them, where its u
 * was kept too, instead of hashing the masks again (nn/lora.h: the same bits).
 * NL_BWD with out == NULL: no input gradient wanted (layer 0's mixer inputs): no service
 * request, only the LoRA gradients.
 * The LoRA branch runs on this thread while the base product is in flight, into its own
 * buffer (the service is writing `out`), added after the wait; or, when rt->sync, after the
 * wait on the runtime's pool, each token block's term added into `out` as it is computed
 * (NL_LORA_ADD: the same bits as the buffer and the add, on the tiles too). */
static int tproj(nl_graph *g, const nl_pass_req *r) {
    const nl_dir dir = r->dir;
    const int layer = r->layer, kind = r->kind, p = r->p, T = r->T;
    const float *in = r->in, *x = r->x, *u_in = r->u_in;
    float *u_save = r->u_save, *out = r->out;
    const int64_t *toks = r->rows;
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
    const int fused = rt->sync && base;
    if (e >= 0 && rc == 0) {
        nl_lora L = lora_of(g, e, layer, kind);
        L.mask_out = dir == NL_FWD ? r->mask_save : NULL;
        L.mask_in = dir == NL_BWD && u_in ? r->mask_in : NULL;
        n = (size_t)T * (size_t)(dir == NL_FWD ? L.n_out : L.n_in);
        lo = !base ? NULL : fused ? out : falloc(g, n);
        float *scr = dir == NL_BWD ? falloc(g, nl_lora_bwd_scratch_floats(&L, T)) : NULL;
        t = toc(g, NL_GP_OTHER, t);
        if ((base && !lo) || (dir == NL_BWD && !scr)) {
            rc = -1;
        } else {
            lora_job j = {.L = &L,
                          .A = nl_lora_A(g->ad, e),
                          .B = nl_lora_B(g->ad, e),
                          .dir = dir,
                          .T = T,
                          .out = lo,
                          .acc = fused ? NL_LORA_ADD : 0,
                          .u_save = u_save,
                          .in = in,
                          .x = x,
                          .u_in = u_in,
                          .tok0 = g->tok_base,
                          .toks = toks,
                          .scr = scr,
                          .dA = g->grads + g->ad->t[e].off_a,
                          .dB = g->grads + g->ad->t[e].off_b};
            rc = lora_run(g, &j);
        }
        t = toc(g, dir == NL_FWD ? NL_GP_LORA_FWD : NL_GP_LORA_BWD, t);
    }
    if (!rt->sync && base) {
        t = toc(g, NL_GP_OTHER, t);
        if (nl_proj_wait(rt->svc)) rc = -1;
        t = toc(g, NL_GP_WAIT, t);
    }
    if (rc == 0 && lo && !fused) nl_par_add(POOL(g), out, lo, n);
    nl_arena_release(g->ws, mk);
    toc(g, NL_GP_ADD, t);
    return rc;
}

/* The layers' and the head's projections (nn/layer.h's pass hook). */
static int pass_proj(void *user, const nl_pass_req *r) { return tproj(user, r); }

/* ---- head: nn/head's, through the pass's hook ---- */

/* The head over the span's rows; loss_sums[i] is sequence i's, summed per chunk of
 * NL_HEAD_CHUNK rows from the sequence's start (chunks with a target), each chunk in row order:
 * the grouping that makes nl_graph_seqs' sums those of nl_graph_seq on each sequence. */
static int head(nl_graph *g, nl_pass *ps, const float *x, const int32_t *targets, const nl_span *sp, float inv_n,
                int want_grad, double *loss_sums, float *dx) {
    const int T = sp->T;
    for (int i = 0; i < nl_span_n(sp); i++) loss_sums[i] = 0.0;
    nl_arena_mark mk = nl_arena_top(g->ws);
    double *rl = nl_arena_alloc(g->ws, (size_t)T * sizeof *rl);
    if (!rl) return -1;
    nl_graph_head_fn fn = g->test && g->test->head ? g->test->head : nl_head_pass_loss;
    int rc = fn(ps, x, targets, T, inv_n, rl, want_grad ? dx : NULL);
    for (int i = 0, s0 = 0; i < nl_span_n(sp) && rc == 0; s0 += nl_span_len(sp, i++)) {
        const int Ti = nl_span_len(sp, i);
        for (int t0 = 0; t0 < Ti; t0 += NL_HEAD_CHUNK) {
            int nc = Ti - t0 < NL_HEAD_CHUNK ? Ti - t0 : NL_HEAD_CHUNK, any = 0;
            double cs = 0.0;
            for (int t = 0; t < nc; t++) {
                any |= targets[s0 + t0 + t] >= 0;
                cs += rl[s0 + t0 + t];
            }
            if (any) loss_sums[i] += cs;
        }
    }
    nl_arena_release(g->ws, mk);
    return rc;
}

static int run(nl_graph *g, int n_seq, const int *seq_T, const int32_t *tokens, const int32_t *targets, float inv_n,
               int want_grad, double *loss_sums) {
    nl_runtime *rt = g->rt;
    const nl_model *m = rt->m;
    int nL = m->hp.n_layer, E = m->hp.n_embd;
    if (n_seq < 1) return nl_err("internal: a graph call without a sequence");
    int T = 0, T_max = 0;
    for (int i = 0; i < n_seq; i++) {
        if (seq_T[i] < 1 || seq_T[i] > INT32_MAX - T)
            return nl_err("internal: sequence %d of the call has %d rows", i, seq_T[i]);
        T += seq_T[i];
        if (seq_T[i] > T_max) T_max = seq_T[i];
    }
    size_t n = (size_t)T * E;
    if (nl_check_tokens(m, tokens, T)) return -1;
    for (int t = 0; t < T; t++)
        if (targets[t] >= m->hp.n_vocab)
            return nl_err("target %d at position %d is outside the vocabulary", targets[t], t);
    nl_arena *a = ws_of(g);
    if (!a) return -1;
    double t_other = tic(g);
    /* one block for the whole call (a spill would leave the first block's touched tail resident) */
    if (nl_arena_reserve(a, (size_t)nl_graph_call_bytes(g, T, g->act_budget, want_grad, NULL))) return -1;
    nl_arena_mark m0 = nl_arena_top(a);
    /* xs[l] = input of layer l (always kept); xs[nL] = final hidden state; then dx. */
    float *xs = falloc(g, (size_t)(nL + 2) * n);
    int32_t *pos = nl_arena_alloc(a, (size_t)T * sizeof *pos);
    unsigned char *keep = nl_arena_alloc(a, (size_t)nL);
    uint64_t *lb = nl_arena_alloc(a, (size_t)nL * sizeof *lb);
    nl_arena_mark *kmark = nl_arena_alloc(a, (size_t)nL * sizeof *kmark);
    nl_layer_cache *caches = nl_arena_alloc(a, (size_t)nL * sizeof *caches);
    int rc = -1;
    if (!xs || !pos || !keep || !lb || !kmark || !caches) goto done;
    memset(caches, 0, (size_t)nL * sizeof *caches);
    float *dx = xs + (size_t)(nL + 1) * n;
    /* positions restart in each sequence */
    for (int i = 0, t0 = 0; i < n_seq; t0 += seq_T[i++])
        for (int t = 0; t < seq_T[i]; t++) pos[t0 + t] = t;
    /* cos/sin of positions [0, T_max) once per run instead of in every RoPE call (same floats) */
    if (nl_rope_table(&rt->rope, T_max) || (m->hp.n_swa > 0 && nl_rope_table(&rt->rope_swa, T_max))) goto done;
    if (nl_embed_rows(rt, tokens, T, xs)) goto done;
    /* Which layers keep their intermediates: train/budget's plan (later layers first). */
    const nl_span sp = {.T = T, .pos = pos, .n_seg = n_seq, .seg_T = seq_T};
    for (int l = 0; l < nL; l++) lb[l] = nl_layer_cache_bytes_span(rt, g->ad, NL_CACHE_GDN | mask_flag(g), l, &sp);
    nl_act_plan plan;
    if (nl_act_plan_layers(lb, nL, want_grad ? g->act_budget : 0, keep, &plan)) goto done;
    g->n_kept = g->n_recomputed = g->n_lora_pool = 0;
    g->peak_cache_bytes = plan.peak_bytes;
    toc(g, NL_GP_OTHER, t_other);
    /* the layers (nn/layer.h): every cache kept for the backward (the GDN node's too), the LoRA
     * u rows of the adapter saved */
    nl_pass ps = {.rt = rt,
                  .ws = a,
                  .proj = pass_proj,
                  .user = g,
                  .save_u = g->ad,
                  .save_gdn = 1,
                  .save_mask = mask_flag(g) != 0,
                  .attn_bf16 = rt->attn_bf16,
                  .tiles = rt->tiles,
                  .prof = g->prof};
    for (int l = 0; l < nL; l++) {
        kmark[l] = nl_arena_top(a);
        if (nl_layer_cache_alloc(&ps, l, &sp, &caches[l])) goto done;
        if (nl_layer_forward(&ps, l, &sp, &caches[l], NULL, xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) goto done;
        if (keep[l]) {
            g->n_kept++;
        } else {
            nl_layer_cache_free(&caches[l]);
            nl_arena_release(a, kmark[l]);
        }
    }
    if (head(g, &ps, xs + (size_t)nL * n, targets, &sp, inv_n, want_grad, loss_sums, dx)) goto done;
    if (want_grad) {
        for (int l = nL - 1; l >= 0; l--) {
            nl_layer_cache *c = &caches[l];
            if (!keep[l]) {
                /* recompute: the third frozen-weight product */
                kmark[l] = nl_arena_top(a);
                if (nl_layer_cache_alloc(&ps, l, &sp, c)) goto done;
                if (nl_layer_forward(&ps, l, &sp, c, NULL, xs + (size_t)l * n, xs + (size_t)(l + 1) * n)) goto done;
                g->n_recomputed++;
            }
            /* layer 0's input gradient is not formed: nothing trainable lies below (frozen
             * embeddings, no LoRA on them) */
            const int want_dx = l > 0 || (g->test && g->test->full_input_grads);
            if (nl_layer_backward(&ps, l, &sp, c, xs + (size_t)l * n, dx, want_dx)) goto done;
            nl_layer_cache_free(c);
            nl_arena_release(a, kmark[l]); /* the top of the stack: later layers are gone already */
        }
    }
    rc = 0;
done:
    if (caches)
        for (int l = 0; l < nL; l++) nl_layer_cache_free(&caches[l]);
    nl_arena_release(a, m0);
    if (!g->keep_scratch) nl_graph_free(g);
    return rc;
}

int nl_graph_seq(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, float inv_n, double *loss_sum) {
    return run(g, 1, &T, tokens, targets, inv_n, 1, loss_sum);
}

int nl_graph_seqs(nl_graph *g, int n_seq, const int *seq_T, const int32_t *tokens, const int32_t *targets, float inv_n,
                  double *loss_sums) {
    return run(g, n_seq, seq_T, tokens, targets, inv_n, 1, loss_sums);
}

int nl_graph_loss(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, double *loss_sum) {
    return run(g, 1, &T, tokens, targets, 1.0f, 0, loss_sum);
}

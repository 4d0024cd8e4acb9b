/* train/preflight: the memory preflight of a run, before its first step: the estimate of what
 * the run needs (weights, held memory, adapter state, activations under the budget, the head,
 * the service's buffers), printed, checked against the memory there is, and on refusal the
 * settings that would fit, each computed; the rule is in trainer.h (nl_train). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "nn/forward.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "util/arena.h"
#include "util/pool.h"
#include "os/mem.h"
#include "train/budget.h"
#include "train/trainer_impl.h"
#include "util/util.h"

#define HEAD_CHUNK_EST NL_HEAD_CHUNK /* tokens per head chunk the graph uses at most (logits + grad) */

typedef struct {
    uint64_t weights, state, inputs, kept, scratch, head, held, buffers, total, loaded, need;
    int T;
    int n_kept;
} mem_est;

/* The run's memory for the longest sequence T with `weights` resident bytes. budget: the
 * activation budget in bytes, or UINT64_MAX-1 for "the default": whatever the limit leaves
 * (avail - the rest - reserve). */
#define BUDGET_DEFAULT (UINT64_MAX - 1)

/* What a step holds outside the graph's call (nl_graph_call_bytes) and the adapter state: the
 * service's buffers and its threads' scratch for T rows (the head's in chunks), the nodes'
 * per-thread scratch (attention over T rows, the LoRA products), the RoPE tables (a table
 * grown while the old one lives), and every thread's stack and allocator arena as touched
 * (256 KiB each: the service's pool and dispatcher, the runtime's pool, the caller). */
static uint64_t step_buffers(const nl_trainer *t, int T) {
    const nl_model *m = t->res.m;
    const int C = T < HEAD_CHUNK_EST ? T : HEAD_CHUNK_EST, nth = nl_proj_threads(t->res.svc);
    const int node_threads = (t->res.rt.pool ? nl_pool_size(t->res.rt.pool) : 1) + 1;
    uint64_t per = nl_attention_thread_bytes(T, m->hp.head_dim);
    for (int i = 0; i < t->res.ad->n; i++) {
        const nl_lora_tensor *e = &t->res.ad->t[i];
        const nl_lora L = {.n_in = (int)e->n_in,
                           .n_out = (int)e->n_out,
                           .rank = e->rank,
                           .dropout = t->o->dropout,
                           .tiles = t->res.rt.tiles};
        const uint64_t b = nl_lora_thread_bytes(&L);
        if (b > per) per = b;
    }
    const uint64_t rope = 2ull * 2 * (uint64_t)T * (uint64_t)m->hp.head_dim * sizeof(float) * (m->hp.n_swa > 0 ? 2 : 1);
    return nl_proj_scratch_bytes(t->res.svc, T, C) + (uint64_t)node_threads * per + rope +
           (uint64_t)(2 * nth + node_threads + 2) * (256u << 10);
}

static void mem_estimate(const nl_trainer *t, nl_graph *g, int T, uint64_t weights, uint64_t held, uint64_t loaded,
                         uint64_t budget, int64_t avail, uint64_t reserve, mem_est *e) {
    const nl_hparams *hp = &t->res.m->hp;
    const int want_grad = !t->plan.mezo;
    memset(e, 0, sizeof *e);
    e->T = T;
    e->weights = weights;
    e->held = held;
    e->buffers = step_buffers(t, T);
    e->state = (uint64_t)t->res.ad->n_params * sizeof(float) *
               (t->plan.mezo ? 3 : 4); /* MeZO: params, θ copy, zero m/v for commits */
    /* the graph's call (train/graph.h), nothing kept: every layer input, the largest layer's
     * cache with its temporaries or the head's */
    const uint64_t call0 = nl_graph_call_bytes(g, T, 0, want_grad, NULL);
    e->inputs =
        nl_arena_size((size_t)((uint64_t)(hp->n_layer + 2) * (uint64_t)T * (uint64_t)hp->n_embd * sizeof(float)));
    if (e->inputs > call0) e->inputs = call0;
    e->scratch = call0 - e->inputs;
    e->head = 0; /* in the call's scratch */
    if (want_grad) {
        uint64_t fixed = e->weights + e->held + e->buffers + e->state + call0;
        if (budget == BUDGET_DEFAULT)
            budget = avail < 0 ? UINT64_MAX : (uint64_t)avail > fixed + reserve ? (uint64_t)avail - fixed - reserve : 0;
        /* kept layers add at most their bytes to the call's peak */
        uint64_t kept = 0;
        const uint64_t call = nl_graph_call_bytes(g, T, budget, 1, &kept);
        e->kept = call > call0 ? call - call0 : 0;
        uint64_t lb[512];
        unsigned char keep[512];
        int nL = hp->n_layer < 512 ? hp->n_layer : 512;
        for (int l = 0; l < nL; l++) lb[l] = nl_graph_layer_bytes(g, l, T);
        nl_act_plan plan;
        e->n_kept = nl_act_plan_layers(lb, nL, budget, keep, &plan) == 0 ? plan.n_kept : 0;
    }
    e->total = e->weights + e->held + e->buffers + e->state + e->inputs + e->kept + e->scratch + e->head;
    e->loaded = loaded;
    e->need = loaded > e->total ? loaded : e->total; /* the load and the plan may have peaked higher than a step will */
}

/* Binary units, like --mem-limit-mb and --act-budget-mb (MB there = MiB). */
static void fmt_bytes(char *buf, size_t cap, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, cap, "%.2f MiB", (double)b / (1ull << 20));
    else if (b >= (1ull << 10)) snprintf(buf, cap, "%.1f KiB", (double)b / (1ull << 10));
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

/* Resident weight bytes if every projection but the embedding were at `type` (what
 * --precision <type> gives): the service's rule (proj.h) applied to the GGUF tensors: the
 * embedding keeps its type, a quantized tensor is never re-quantized, a row length that is not
 * a multiple of the target's block keeps its type; one copy per (source, resident type). */
/* Resident weight bytes if every projection but the embedding were asked for `type` (what
 * `--precision type` would give; proj decides feasibility). A GGUF tensor converted twice to
 * the same type (tied head and embedding) counts once, as in the service. */
static uint64_t weights_at(const nl_model *m, int type) {
    int *tgt = malloc((size_t)m->n_projs * sizeof *tgt);
    if (!tgt) return UINT64_MAX;
    uint64_t b = 0;
    for (int i = 0; i < m->n_projs; i++) {
        const nl_proj_desc *d = &m->projs[i];
        tgt[i] = nl_proj_feasible_type(d->w->type, d->n_in, d->cls == NL_CLASS_EMBED ? -1 : type);
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = m->projs[j].w->data == d->w->data && tgt[j] == tgt[i];
        if (!dup) b += (uint64_t)nl_row_bytes(tgt[i], d->n_in) * (uint64_t)d->n_out;
    }
    free(tgt);
    return b;
}

static void fmt_est(char *buf, size_t cap, const mem_est *e, int mezo) {
    char w[32], s[32], in[32], k[32], sc[32], h[32], tot[32], hd[32], bf[32];
    fmt_bytes(tot, sizeof tot, e->need);
    fmt_bytes(hd, sizeof hd, e->held);
    fmt_bytes(bf, sizeof bf, e->buffers);
    char lp[80] = "";
    if (e->loaded > e->total) {
        char v[32];
        fmt_bytes(v, sizeof v, e->loaded);
        snprintf(lp, sizeof lp, "the peak of loading and planning: %s; a step: ", v);
    }
    fmt_bytes(w, sizeof w, e->weights);
    fmt_bytes(s, sizeof s, e->state);
    fmt_bytes(in, sizeof in, e->inputs);
    fmt_bytes(k, sizeof k, e->kept);
    fmt_bytes(sc, sizeof sc, e->scratch);
    fmt_bytes(h, sizeof h, e->head);
    if (mezo)
        snprintf(buf, cap,
                 "%s (%sweights %s, held %s, adapter %s, layer inputs %s + layer scratch %s for %d tokens, "
                 "buffers %s)",
                 tot, lp, w, hd, s, in, sc, e->T, bf);
    else
        snprintf(buf, cap,
                 "%s (%sweights %s, held %s, adapter+grads+AdamW %s, layer inputs %s + %d kept layers %s + recompute "
                 "scratch %s for %d tokens (a layer's cache and temporaries, or the head's), buffers %s)",
                 tot, lp, w, hd, s, in, e->n_kept, k, sc, e->T, bf);
}

/* Check the estimate against the limit; on refusal name what would fit. T: the rows of one
 * graph call (the step's sequences packed), longest: the longest sequence. Sets *budget_out
 * (the activation budget to use). */
int nl_train_mem_preflight(nl_trainer *t, int T, int longest, int64_t avail, int from_limit, int64_t rss0,
                           uint64_t *budget_out) {
    const nl_train_opts *o = t->o;
    nl_graph *g = &t->res.g;
    uint64_t weights = nl_proj_resident_bytes(t->res.svc, -1, -1);
    /* What the run holds now beyond the weights not yet touched and the adapter's parameters
     * (counted in its state): the converted weights' source pages (mapped, read by the
     * conversion), the model's other pages read so far, the tokenized data, the heap so far.
     * The weights (converted, or in place and perhaps read already) are the weights term. */
    uint64_t held = 0;
    nl_mem_trim(); /* the plan's freed buffers are not held */
    int64_t rss = nl_rss_bytes();
    if (rss0 >= 0 && rss > rss0) {
        /* weights resident in place may have been read already (counted as weights) */
        uint64_t d = (uint64_t)(o->count_process ? rss : rss - rss0),
                 known = weights + (uint64_t)t->res.ad->n_params * sizeof(float);
        held = d > known ? d - known : 0;
    }
    /* the process's peak so far (loading, converting, planning), when the process is what is
     * bounded; a library caller's earlier peaks are not the run's */
    int64_t hwm = o->count_process ? nl_peak_rss_bytes() : -1;
    uint64_t loaded = hwm > 0 ? (uint64_t)hwm : 0;
    uint64_t reserve = from_limit ? 0 : (uint64_t)512 << 20;
    uint64_t budget = o->act_budget_mb >= 0 ? (uint64_t)o->act_budget_mb << 20 : BUDGET_DEFAULT;
    mem_est e;
    mem_estimate(t, g, T, weights, held, loaded, budget, avail, reserve, &e);
    char est[512], av[32];
    fmt_est(est, sizeof est, &e, t->plan.mezo);
    if (avail >= 0) fmt_bytes(av, sizeof av, (uint64_t)avail);
    if (o->progress)
        fprintf(o->progress, "memory: needs %s; %s%s\n", est, avail >= 0 ? av : "available memory unknown: not checked",
                avail < 0    ? ""
                : from_limit ? " allowed (--mem-limit-mb)"
                             : " available (MemAvailable)");
    /* the budget the graph gets: what the estimate assumed (explicit, or what is left) */
    if (budget == BUDGET_DEFAULT) {
        uint64_t fixed = e.total - e.kept;
        budget = avail < 0 ? UINT64_MAX : (uint64_t)avail > fixed + reserve ? (uint64_t)avail - fixed - reserve : 0;
    }
    *budget_out = budget;
    if (avail < 0 || e.need <= (uint64_t)avail) return 0;

    /* It does not fit: compute what would. */
    char sug[3][96];
    int ns = 0;
    /* what a suggestion must fit in: the limit less a margin for what the next run's process
     * holds differently (its heap before the preflight varied by 2 MiB in 285 between runs): 2% */
    const uint64_t A = (uint64_t)avail, A_sug = A - A / 50;
    int explicit_budget = o->act_budget_mb > 0;
    uint64_t fixed = e.total - e.kept;
    if (!t->plan.mezo && explicit_budget && fixed <= A_sug) {
        /* the kept layers are what overflow: a budget of what is left (recompute the rest) */
        snprintf(sug[ns++], sizeof sug[0], "--act-budget-mb %llu (recompute)",
                 (unsigned long long)((A_sug - fixed) >> 20));
    }
    /* the longest context that fits with the same other settings */
    {
        int lo = 1, hi = T - 1, best = 0;
        while (lo <= hi) {
            int mid = lo + (hi - lo) / 2;
            mem_est x;
            mem_estimate(t, g, mid, weights, held, loaded,
                         budget == UINT64_MAX ? BUDGET_DEFAULT : (o->act_budget_mb >= 0 ? budget : BUDGET_DEFAULT),
                         avail, reserve, &x);
            if (x.need <= A_sug) {
                best = mid;
                lo = mid + 1;
            } else hi = mid - 1;
        }
        if (best >= 32) best -= best % 16;
        /* a call's rows: the longest sequence, or the step's sequences packed up to
         * --batch-tokens: bound whichever is over */
        int packs = !t->hk.per_sequence && o->batch_tokens > best;
        if (best >= 2 && longest > best && packs)
            snprintf(sug[ns++], sizeof sug[0], "--ctx %d --batch-tokens %d", best, best);
        else if (best >= 2 && longest > best) snprintf(sug[ns++], sizeof sug[0], "--ctx %d", best);
        else if (best >= 2 && packs) snprintf(sug[ns++], sizeof sug[0], "--batch-tokens %d", best);
    }
    /* a smaller resident precision (the embedding keeps its type) */
    static const int types[] = {NL_TYPE_Q8_0, NL_TYPE_Q4_0};
    for (int k = 0; k < 2; k++) {
        uint64_t w2 = weights_at(t->res.m, types[k]);
        if (w2 >= weights) continue;
        mem_est x;
        mem_estimate(t, g, T, w2, held, loaded,
                     o->act_budget_mb >= 0 ? (uint64_t)o->act_budget_mb << 20 : BUDGET_DEFAULT, avail, reserve, &x);
        if (x.need <= A_sug) {
            snprintf(sug[ns++], sizeof sug[0], "--precision %s", nl_type_name(types[k]));
            break;
        }
    }
    char need[32];
    fmt_bytes(need, sizeof need, e.need);
    const char *what = from_limit ? "allowed by --mem-limit-mb" : "available";
    if (ns == 0) {
        mem_est x;
        mem_estimate(t, g, T < 16 ? T : 16,
                     weights_at(t->res.m, NL_TYPE_Q4_0) < weights ? weights_at(t->res.m, NL_TYPE_Q4_0) : weights, held,
                     loaded, 0, avail, reserve, &x);
        char least[32];
        fmt_bytes(least, sizeof least, x.need);
        return nl_err("not enough memory: needs %s, %s %s; no --act-budget-mb, --ctx or --precision makes it fit "
                      "(even --ctx 16 --act-budget-mb 0 --precision q4_0 needs %s): nothing was trained",
                      need, av, what, least);
    }
    return nl_err("not enough memory: needs %s, %s %s: use %s%s%s%s%s; nothing was trained", need, av, what, sug[0],
                  ns > 1 ? (ns > 2 ? ", " : ", or ") : "", ns > 1 ? sug[1] : "", ns > 2 ? ", or " : "",
                  ns > 2 ? sug[2] : "");
}

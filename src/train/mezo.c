/* MeZO zeroth-order step; see mezo.h. */
#include "train/mezo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "util/rng.h"
#include "util/util.h"

/* Domain tag so MeZO's keys never meet the dropout / init / shuffle keys of the same seed. */
#define MEZO_TAG 0x4D655A4F5A4F5052ULL

void nl_mezo_defaults(nl_mezo_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->eps = 1e-3;
    cfg->lr = 1e-4;
    cfg->weight_decay = 0.0;
    cfg->seed = 42;
}

uint64_t nl_mezo_key(uint64_t seed, int64_t step) {
    return nl_rng_key_add(nl_rng_key_add(nl_rng_key(seed), MEZO_TAG), (uint64_t)step);
}

void nl_mezo_perturb(float *dst, const float *src, size_t n, uint64_t key, double scale) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)((double)src[i] + scale * (double)nl_rng_normal(key, (uint64_t)i));
}

/* dst[i] = (float)(a·src[i] + b·z_i) over the runtime's node pool (elements split by ranges:
 * the same bits as one thread; with a = 1 the bits of nl_mezo_perturb). Regenerating z (a
 * Box-Muller in double per element) is most of a MeZO step's CPU time on small models. */
typedef struct {
    float *dst;
    const float *src;
    size_t n;
    uint64_t key;
    double a, b;
} axpz_job;

static void axpz_task(void *arg, int task, int n_tasks) {
    const axpz_job *j = arg;
    const size_t i0 = j->n * (size_t)task / (size_t)n_tasks, i1 = j->n * (size_t)(task + 1) / (size_t)n_tasks;
    for (size_t i = i0; i < i1; i++)
        j->dst[i] = (float)(j->a * (double)j->src[i] + j->b * (double)nl_rng_normal(j->key, (uint64_t)i));
}

static void axpz(nl_graph *g, float *dst, const float *src, size_t n, uint64_t key, double a, double b) {
    axpz_job j = {dst, src, n, key, a, b};
    nl_pool *p = g->rt ? g->rt->pool : NULL;
    if (p && n >= 4096) nl_pool_run(p, nl_pool_size(p), axpz_task, &j);
    else axpz_task(&j, 0, 1);
}

int nl_mezo_batch_loss(nl_graph *g, const nl_seq *seqs, const int *idx, int n_seq, double *loss, int64_t *n_targets,
                       int64_t *n_tokens) {
    double sum = 0.0;
    int64_t nt = 0, ntok = 0;
    int max_T = 0;
    for (int i = 0; i < n_seq; i++) {
        const nl_seq *s = &seqs[idx ? idx[i] : i];
        if (s->n_tokens > max_T) max_T = s->n_tokens;
    }
    int32_t *rows = nl_malloc((size_t)(max_T > 0 ? max_T : 1) * sizeof *rows);
    if (!rows) return -1;
    g->tok_base = 0;
    for (int i = 0; i < n_seq; i++) {
        const nl_seq *s = &seqs[idx ? idx[i] : i];
        nl_row_targets(s->ids, s->target, s->n_tokens, rows);
        double ls;
        if (nl_graph_loss(g, s->ids, rows, s->n_tokens, &ls)) {
            free(rows);
            return -1;
        }
        sum += ls;
        nt += s->n_targets;
        ntok += s->n_tokens;
        g->tok_base += s->n_tokens;
    }
    free(rows);
    *loss = nt ? sum / (double)nt : 0.0;
    if (n_targets) *n_targets = nt;
    if (n_tokens) *n_tokens = ntok;
    return 0;
}

int nl_mezo_step(nl_graph *g, const nl_mezo_cfg *cfg, int64_t step, const nl_seq *seqs, const int *idx, int n_seq,
                 nl_mezo_result *res) {
    if (!(cfg->eps > 0) || !isfinite(cfg->eps)) return nl_err("mezo: eps %g: expected a finite value > 0", cfg->eps);
    if (!(cfg->lr >= 0) || !isfinite(cfg->lr)) return nl_err("mezo: lr %g: expected a finite value >= 0", cfg->lr);
    if (!(cfg->weight_decay >= 0) || !isfinite(cfg->weight_decay))
        return nl_err("mezo: weight_decay %g: expected a finite value >= 0", cfg->weight_decay);
    if (step < 1) return nl_err("mezo: step %lld: expected >= 1", (long long)step);
    if (n_seq < 0) return nl_err("mezo: n_seq %d: expected >= 0", n_seq);
    float *theta = g->ad->params;
    size_t n = g->ad->n_params;
    float *theta0 = nl_malloc((n ? n : 1) * sizeof(float));
    if (!theta0) return -1;
    memcpy(theta0, theta, n * sizeof(float));
    const uint64_t key = nl_mezo_key(cfg->seed, step);
    const float dropout = g->dropout;
    g->dropout = 0.0f; /* both forwards must evaluate the same deterministic function */
    g->step = step;
    nl_mezo_result r = {0};
    int rc = -1;
    axpz(g, theta, theta0, n, key, 1.0, cfg->eps);
    if (nl_mezo_batch_loss(g, seqs, idx, n_seq, &r.loss_plus, &r.n_targets, &r.n_tokens)) goto done;
    axpz(g, theta, theta0, n, key, 1.0, -cfg->eps);
    if (nl_mezo_batch_loss(g, seqs, idx, n_seq, &r.loss_minus, NULL, NULL)) goto done;
    r.loss = 0.5 * (r.loss_plus + r.loss_minus);
    r.proj_grad = (r.loss_plus - r.loss_minus) / (2.0 * cfg->eps);
    if (!isfinite(r.loss_plus) || !isfinite(r.loss_minus)) {
        nl_err("mezo step %lld: the loss is not finite (L+ %g, L- %g)", (long long)step, r.loss_plus, r.loss_minus);
        goto done;
    }
    /* θ ← θ0 − lr·wd·θ0 − lr·g·z, from the saved copy (never from the perturbed values). */
    {
        const double shrink = 1.0 - cfg->lr * cfg->weight_decay, step_scale = -cfg->lr * r.proj_grad;
        axpz(g, theta, theta0, n, key, shrink, step_scale);
    }
    if (res) {
        /* the norm of the gradient estimate g·z: z regenerated, never stored */
        double zz = 0;
        for (size_t i = 0; i < n; i++) {
            double z = nl_rng_normal(key, (uint64_t)i);
            zz += z * z;
        }
        r.grad_norm = fabs(r.proj_grad) * sqrt(zz);
        *res = r;
    }
    rc = 0;
done:
    if (rc) memcpy(theta, theta0, n * sizeof(float));
    g->dropout = dropout;
    free(theta0);
    return rc;
}

/* train/mezo: MeZO, forward-only zeroth-order SGD on the LoRA parameters (Malladi et al. 2023,
 * "Fine-Tuning Language Models with Just Forward Passes").
 *
 * One optimizer step on a batch B, with θ the adapter's params (n floats) and z ~ N(0, I_n):
 *     L+ = L(θ + ε z; B)      L− = L(θ − ε z; B)          (two deterministic forwards)
 *     g  = (L+ − L−) / (2ε)                               (projected gradient ≈ ∇L·z)
 *     θ  ← θ − lr · g · z
 * L is the batch's mean target cross-entropy (sum of target CEs / number of targets), the
 * same normalisation as the backprop trainer's loss. E[g z] = ∇L + O(ε²), so this is SGD on an
 * unbiased (up to O(ε²)) but very noisy gradient estimate: expect many more steps than
 * backprop, each costing two forwards and no backward, no activations kept, no gradients.
 *
 * z is never stored: z_i = nl_rng_normal(nl_mezo_key(seed, step), i), regenerated when needed,
 * so a step is a pure function of (θ, batch, seed, step, ε, lr) and resume from a checkpoint
 * (params + step + data cursor) reproduces the run bit for bit.
 *
 * Exact restore: θ + εz − 2εz + εz in float does not in general give θ back (each add rounds,
 * and the roundings do not cancel), so a step keeps one copy of θ (n floats, the size of the
 * adapter, tiny next to the model) and sets the parameters to fl(θ + εz), fl(θ − εz) and
 * finally fl(θ − lr·g·z) from that copy, each in double per element. Whatever happens
 * (success or error), nothing but the final update changes the parameters.
 *
 * Dropout is forced off for both forwards (MeZO needs L+ and L− of the SAME function); the
 * graph's dropout setting is put back before returning. */
#ifndef NL_MEZO_H
#define NL_MEZO_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "train/graph.h"

typedef struct {
    double eps;          /* perturbation scale ε (1e-3, the paper's) */
    double lr;           /* learning rate for THIS step (set it from nl_lr_at, like AdamW's) */
    double weight_decay; /* decoupled: θ ← θ − lr·wd·θ before the update; default 0 */
    uint64_t seed;       /* run seed; z is keyed by (seed, step) */
} nl_mezo_cfg;

/* eps 1e-3, lr 1e-4, weight_decay 0, seed 42. NB MeZO wants a much smaller lr than AdamW's
 * 2e-4 is for Adam: the update lr·g·z has norm ≈ lr·|g|·sqrt(n). */
void nl_mezo_defaults(nl_mezo_cfg *cfg);

typedef struct {
    double loss; /* (L+ + L−)/2: the batch's mean target CE at θ, up to O(ε²) (free) */
    double loss_plus, loss_minus;
    double proj_grad;  /* g = (L+ − L−) / (2ε) */
    double grad_norm;  /* |g·z|, the norm of the step's gradient estimate (z summed in double) */
    int64_t n_targets; /* targets in the batch */
    int64_t n_tokens;  /* tokens forwarded per pass (the step forwards 2× this) */
} nl_mezo_result;

/* The perturbation key of a step: z_i = nl_rng_normal(key, i). */
uint64_t nl_mezo_key(uint64_t seed, int64_t step);

/* dst[i] = (float)(src[i] + scale · z_i), z_i = nl_rng_normal(key, i), in double per element.
 * dst may equal src. Exposed for tests and for tools that want to look at z. */
void nl_mezo_perturb(float *dst, const float *src, size_t n, uint64_t key, double scale);

/* Mean target cross-entropy of a batch at the current params, dropout as g is configured.
 * The batch is seqs[idx[0]], ..., seqs[idx[n_seq-1]] (idx NULL: seqs[0..n_seq)), exactly what
 * the trainer's batcher hands out. Row targets follow nl_row_targets. g->tok_base is set per
 * sequence like the backprop trainer does. A batch with no target gives loss 0. */
int nl_mezo_batch_loss(nl_graph *g, const nl_seq *seqs, const int *idx, int n_seq, double *loss, int64_t *n_targets,
                       int64_t *n_tokens);

/* One MeZO step on the adapter g->ad (g->grads is not used and may be NULL). `step` is the
 * 1-based optimizer step (the same number the trainer passes to nl_lr_at); g->step is set to
 * it. On success the params hold θ − lr·wd·θ − lr·g·z and *res (may be NULL) is filled. If the
 * loss is not finite the params are left at θ and -1 is returned (nl_err). On any error
 * (including a pace hook that stops the run inside a forward) the params are bit-identical
 * to what they were on entry. */
int nl_mezo_step(nl_graph *g, const nl_mezo_cfg *cfg, int64_t step, const nl_seq *seqs, const int *idx, int n_seq,
                 nl_mezo_result *res);

#endif

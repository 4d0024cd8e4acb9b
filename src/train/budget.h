/* train/budget: which layers keep their intermediates between forward and backward (the
 * activation budget, docs/design.md §4).
 *
 * Why keep the LATER layers: backward runs from the last layer to the first, so a kept
 * later layer frees its intermediates early in the backward pass, and by the time a dropped
 * early layer must be recomputed most kept memory is already free. With a kept set K and
 * per-layer bytes b, the activation memory peaks at
 *     max( sum_{i in K} b_i ,  max_{j not in K} ( sum_{i in K, i < j} b_i + b_j ) )
 * (the first term at the end of the forward; the second while layer j is recomputed in the
 * backward, when only kept layers below j are still alive). Keeping a suffix makes the second
 * term just b_j, so the whole budget goes to kept layers; keeping early layers instead would
 * need one extra layer of headroom for every recompute. */
#ifndef NL_BUDGET_H
#define NL_BUDGET_H

#include <stdint.h>

/* Activation budget: min(cap, available - reserve), floored at 0. cap 0 = no cap; available
 * < 0 = unknown (then cap, or UINT64_MAX when there is no cap either). */
uint64_t nl_act_budget_bytes(uint64_t cap, int64_t available, uint64_t reserve);

typedef struct {
    int n_kept;          /* layers that keep their intermediates */
    uint64_t kept_bytes; /* sum of their bytes */
    uint64_t peak_bytes; /* activation peak of this plan (formula above) */
    int fits;            /* peak_bytes <= budget (0 when even one layer alone exceeds it) */
} nl_act_plan;

/* Decide keep[i] (1 = keep layer i's intermediates, 0 = recompute it in backward) for
 * n_layers layers needing layer_bytes[i] each (the intermediates a layer holds between its
 * forward and its backward, which is also the scratch its recompute needs; the stored layer
 * inputs, weights and gradient buffers are fixed costs the caller leaves out of the budget).
 * Greedy from the last layer down: layer i is kept when the plan's peak (formula above) stays
 * within the budget with it. So the result is the longest suffix that fits, extended by any
 * earlier layer that still fits without making a later recompute overflow. Deterministic.
 * `plan` may be NULL. Returns 0, or -1 (nl_err) on bad arguments. */
int nl_act_plan_layers(const uint64_t *layer_bytes, int n_layers, uint64_t budget, unsigned char *keep,
                       nl_act_plan *plan);

#endif

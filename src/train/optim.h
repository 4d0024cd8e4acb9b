/* train/optim: AdamW, gradient norm and clipping, learning-rate schedules.
 *
 * All adapter parameters live in ONE contiguous float buffer (llm.c style); the optimizer
 * state is two more buffers of the same length:
 *     params[n], grads[n], m[n] (first moment), v[n] (second moment)
 * Every function here walks the buffers in index order, one element at a time, so results
 * are bit-identical run after run and do not depend on any thread count.
 *
 * Step numbering: `step` is the 1-based index of the optimizer step being taken (the first
 * update is step 1). AdamW's bias correction and nl_lr_at use the same number. */
#ifndef NL_OPTIM_H
#define NL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    double lr;           /* learning rate for THIS step (the trainer sets it from nl_lr_at) */
    double beta1;        /* 0.9   */
    double beta2;        /* 0.999 */
    double eps;          /* 1e-8, added to sqrt(v_hat) */
    double weight_decay; /* decoupled (AdamW): p -= lr * weight_decay * p; default 0 */
} nl_adamw;

/* lr 2e-4, beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0. */
void nl_adamw_defaults(nl_adamw *cfg);

/* One AdamW update over n elements, in place on params, m and v (grads is read only):
 *     m = b1*m + (1-b1)*g            v = b2*v + (1-b2)*g*g
 *     m_hat = m / (1 - b1^step)      v_hat = v / (1 - b2^step)
 *     p = p - lr*wd*p - lr * m_hat / (sqrt(v_hat) + eps)
 * The decay uses p before the update (as PyTorch's AdamW). Arithmetic is in double per element,
 * stored back as float. Returns 0, or -1 (nl_err) on step < 1 or a bad configuration. */
int nl_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, const nl_adamw *cfg, int64_t step);

/* sqrt(sum g_i^2), accumulated in double in index order (deterministic). May return inf/NaN
 * when a gradient is not finite: the trainer should then skip the update. */
double nl_grad_global_norm(const float *grads, size_t n);

/* Clip to max_norm: if the global norm exceeds max_norm (> 0), scale grads in place by
 * max_norm / norm. Returns the norm BEFORE clipping. Non-finite norms are returned as they
 * are and grads are left untouched (scaling by 0 or NaN would hide the problem).
 * max_norm <= 0 disables clipping (the norm is still returned). */
double nl_grad_clip(float *grads, size_t n, double max_norm);

typedef enum {
    NL_LR_CONSTANT = 0, /* lr after warmup */
    NL_LR_COSINE = 1,   /* cosine from lr down towards lr_min, after warmup */
} nl_lr_kind;

typedef struct {
    nl_lr_kind kind;
    double lr;        /* peak learning rate */
    int warmup_steps; /* linear warmup length (0 = none) */
    double lr_min;    /* cosine floor (reached after the last step; 0 <= lr_min <= lr) */
} nl_schedule;

/* Learning rate of the 1-based optimizer step `step` of `total_steps`:
 *   warmup (step <= warmup_steps):  lr * step / warmup_steps      (step == warmup_steps: lr)
 *   constant afterwards:            lr
 *   cosine afterwards:              p = (step - W - 1) / (total_steps - W), clamped to [0, 1]
 *                                   lr_min + (lr - lr_min) * 0.5 * (1 + cos(pi * p))
 *                                   so step W + 1 gets lr and the floor lr_min would be step
 *                                   total_steps + 1's: every step of the run gets a rate
 *                                   above lr_min (a one-step run: lr), none gets 0.
 * step < 1 is treated as 1; steps beyond total_steps stay at the floor. If total_steps <=
 * warmup_steps, the cosine part is empty and lr is used after warmup. */
double nl_lr_at(const nl_schedule *s, int64_t step, int64_t total_steps);

#endif

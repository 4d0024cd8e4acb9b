/* train/optim: AdamW, gradient norm/clipping, learning-rate schedules. See optim.h. */
#include "train/optim.h"

#include <math.h>

#include "util/util.h"

void nl_adamw_defaults(nl_adamw *cfg) {
    cfg->lr = 2e-4;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->weight_decay = 0.0;
}

int nl_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, const nl_adamw *cfg, int64_t step) {
    if (step < 1) return nl_err("adamw: step must be >= 1 (got %lld)", (long long)step);
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return nl_err("adamw: betas must be in [0, 1) (got %g, %g)", cfg->beta1, cfg->beta2);
    if (!(cfg->eps > 0) || !isfinite(cfg->lr) || !(cfg->weight_decay >= 0))
        return nl_err("adamw: bad eps %g / lr %g / weight_decay %g", cfg->eps, cfg->lr, cfg->weight_decay);
    const double b1 = cfg->beta1, b2 = cfg->beta2;
    /* Bias corrections once per step; pow keeps them exact for large step counts. */
    const double c1 = 1.0 - pow(b1, (double)step);
    const double c2 = 1.0 - pow(b2, (double)step);
    const double lr = cfg->lr, decay = cfg->lr * cfg->weight_decay, eps = cfg->eps;
    for (size_t i = 0; i < n; i++) {
        double g = grads[i];
        double mi = b1 * m[i] + (1.0 - b1) * g;
        double vi = b2 * v[i] + (1.0 - b2) * g * g;
        double p = params[i];
        p -= decay * p;
        p -= lr * (mi / c1) / (sqrt(vi / c2) + eps);
        m[i] = (float)mi;
        v[i] = (float)vi;
        params[i] = (float)p;
    }
    return 0;
}

double nl_grad_global_norm(const float *grads, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)grads[i] * (double)grads[i];
    return sqrt(s);
}

double nl_grad_clip(float *grads, size_t n, double max_norm) {
    double norm = nl_grad_global_norm(grads, n);
    if (!(max_norm > 0) || !isfinite(norm) || norm <= max_norm) return norm;
    double scale = max_norm / norm;
    for (size_t i = 0; i < n; i++) grads[i] = (float)((double)grads[i] * scale);
    return norm;
}

double nl_lr_at(const nl_schedule *s, int64_t step, int64_t total_steps) {
    if (step < 1) step = 1;
    int w = s->warmup_steps > 0 ? s->warmup_steps : 0;
    if (step <= w) return s->lr * (double)step / (double)w;
    if (s->kind != NL_LR_COSINE || total_steps <= w) return s->lr;
    double p = (double)(step - w - 1) / (double)(total_steps - w);
    if (p > 1.0) p = 1.0;
    return s->lr_min + (s->lr - s->lr_min) * 0.5 * (1.0 + cos(M_PI * p));
}

/* train/optim: AdamW against a float64 reference over several steps, gradient norm and
 * clipping, learning-rate schedule values at their boundaries. */
#include "test.h"
#include "train/optim.h"
#include "util/util.h"

/* Float64 reference AdamW written straight from the paper's formulas (Loshchilov & Hutter,
 * decoupled decay), with the state kept in double. */
static void ref_adamw(double *p, const double *g, double *m, double *v, size_t n, double lr, double b1, double b2,
                      double eps, double wd, int t) {
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        p[i] = p[i] - lr * wd * p[i] - lr * mh / (sqrt(vh) + eps);
    }
}

static void test_adamw(double wd) {
    enum { N = 37, STEPS = 25 };
    float p[N], g[N], m[N], v[N];
    double rp[N], rg[N], rm[N], rv[N];
    for (int i = 0; i < N; i++) {
        p[i] = (float)nl_t_rand();
        rp[i] = p[i];
        m[i] = v[i] = 0;
        rm[i] = rv[i] = 0;
    }
    nl_adamw cfg;
    nl_adamw_defaults(&cfg);
    CHECK(cfg.beta1 == 0.9 && cfg.beta2 == 0.999 && cfg.eps == 1e-8 && cfg.weight_decay == 0);
    cfg.weight_decay = wd;
    nl_schedule sch = {NL_LR_COSINE, 1e-2, 3, 1e-3};
    double maxerr = 0;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) {
            /* gradients of mixed scale, including exact zeros */
            g[i] = (i % 7 == 3) ? 0.0f : (float)(nl_t_rand() * pow(10.0, (i % 5) - 3));
            rg[i] = g[i];
        }
        cfg.lr = nl_lr_at(&sch, t, STEPS);
        CHECK(nl_adamw_step(p, g, m, v, N, &cfg, t) == 0);
        ref_adamw(rp, rg, rm, rv, N, cfg.lr, 0.9, 0.999, 1e-8, wd, t);
        for (int i = 0; i < N; i++) {
            double e = fabs(p[i] - rp[i]) / (1e-3 + fabs(rp[i]));
            if (e > maxerr) maxerr = e;
        }
    }
    /* float storage of p/m/v between steps: relative error stays near float epsilon */
    CHECKF(maxerr < 2e-6, "max rel err %g (wd %g)", maxerr, wd);
    /* the update must actually have moved the parameters (the test can fail) */
    double moved = 0;
    for (int i = 0; i < N; i++) moved += fabs(rp[i]);
    CHECK(moved > 0);
}

static void test_adamw_first_step(void) {
    /* step 1 with bias correction: m_hat = g, v_hat = g^2 -> p -= lr * g / (|g| + eps) */
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, -3.0f, 0.0f}, m[3] = {0}, v[3] = {0};
    nl_adamw cfg;
    nl_adamw_defaults(&cfg);
    cfg.lr = 0.1;
    cfg.weight_decay = 0.5;
    CHECK(nl_adamw_step(p, g, m, v, 3, &cfg, 1) == 0);
    CHECK_NEAR(p[0], 1.0 - 0.1 * 0.5 * 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-6);
    CHECK_NEAR(p[1], -2.0 + 0.1 * 0.5 * 2.0 + 0.1 * 3.0 / (3.0 + 1e-8), 1e-6);
    CHECK_NEAR(p[2], 0.5 - 0.1 * 0.5 * 0.5, 1e-7); /* zero gradient: decay only */
    CHECK_NEAR(m[1], -0.3, 1e-7);
    CHECK_NEAR(v[1], 0.009, 1e-9);
    CHECK(nl_adamw_step(p, g, m, v, 3, &cfg, 0) == -1);
    CHECK(strstr(nl_last_error(), "step") != NULL);
}

static void test_norm_clip(void) {
    enum { N = 1001 };
    static float g[N], g2[N];
    double ref = 0;
    for (int i = 0; i < N; i++) {
        g[i] = (float)nl_t_rand();
        ref += (double)g[i] * g[i];
    }
    ref = sqrt(ref);
    CHECK_NEAR(nl_grad_global_norm(g, N), ref, 1e-12 * ref);
    memcpy(g2, g, sizeof g);
    /* no clipping when under the limit: grads untouched */
    CHECK_NEAR(nl_grad_clip(g2, N, ref * 2), ref, 1e-12 * ref);
    CHECK(memcmp(g, g2, sizeof g) == 0);
    /* clipping: returns pre-clip norm, post-clip norm equals max_norm */
    double pre = nl_grad_clip(g2, N, 1.5);
    CHECK_NEAR(pre, ref, 1e-12 * ref);
    CHECK_NEAR(nl_grad_global_norm(g2, N), 1.5, 1e-6);
    CHECK_NEAR(g2[17] / g[17], 1.5 / ref, 1e-6);
    /* disabled */
    memcpy(g2, g, sizeof g);
    CHECK_NEAR(nl_grad_clip(g2, N, 0), ref, 1e-12 * ref);
    CHECK(memcmp(g, g2, sizeof g) == 0);
    /* non-finite: reported, grads untouched */
    g2[5] = INFINITY;
    CHECK(!isfinite(nl_grad_clip(g2, N, 1.0)));
    CHECK(g2[6] == g[6]);
    g2[5] = NAN;
    CHECK(isnan(nl_grad_global_norm(g2, N)));
    CHECK(nl_grad_global_norm(g, 0) == 0);
}

static void test_schedule(void) {
    nl_schedule c = {NL_LR_CONSTANT, 1e-3, 0, 1e-3};
    CHECK(nl_lr_at(&c, 1, 100) == 1e-3);
    CHECK(nl_lr_at(&c, 100, 100) == 1e-3);
    CHECK(nl_lr_at(&c, 500, 100) == 1e-3);
    c.warmup_steps = 4;
    CHECK_NEAR(nl_lr_at(&c, 1, 100), 0.25e-3, 1e-15);
    CHECK_NEAR(nl_lr_at(&c, 3, 100), 0.75e-3, 1e-15);
    CHECK(nl_lr_at(&c, 4, 100) == 1e-3);
    CHECK(nl_lr_at(&c, 5, 100) == 1e-3);
    CHECK_NEAR(nl_lr_at(&c, 0, 100), 0.25e-3, 1e-15); /* step < 1 treated as 1 */

    /* cosine after 10 warmup steps over 100 decay steps (11..110), floor 2e-5 reached at 111 */
    nl_schedule s = {NL_LR_COSINE, 2e-4, 10, 2e-5};
    CHECK_NEAR(nl_lr_at(&s, 5, 110), 1e-4, 1e-15);
    CHECK_NEAR(nl_lr_at(&s, 10, 110), 2e-4, 1e-15);        /* end of warmup: peak */
    CHECK(nl_lr_at(&s, 11, 110) == 2e-4);                  /* the first decay step: p = 0 */
    CHECK_NEAR(nl_lr_at(&s, 61, 110), 2e-4 * 0.55, 1e-15); /* half way: mean of peak and floor */
    double last = 2e-5 + 1.8e-4 * 0.5 * (1 + cos(M_PI * 0.99));
    CHECK_NEAR(nl_lr_at(&s, 110, 110), last, 1e-15); /* the last step: above the floor */
    CHECK(nl_lr_at(&s, 110, 110) > 2e-5);
    CHECK_NEAR(nl_lr_at(&s, 111, 110), 2e-5, 1e-15); /* the step after the last: floor */
    CHECK_NEAR(nl_lr_at(&s, 200, 110), 2e-5, 1e-15); /* beyond: floor */
    double q = 2e-4 * (0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)));
    CHECK_NEAR(nl_lr_at(&s, 36, 110), q, 1e-15);
    /* monotone non-increasing after warmup, strictly decreasing within the decay */
    int mono = 1;
    for (int t = 12; t <= 111; t++)
        if (!(nl_lr_at(&s, t, 110) < nl_lr_at(&s, t - 1, 110))) mono = 0;
    CHECK(mono);
    /* a floor of 0: still no step of the run gets 0 */
    s.lr_min = 0;
    s.warmup_steps = 0;
    CHECK(nl_lr_at(&s, 1, 1) == 2e-4); /* one-step run: the peak */
    CHECK(nl_lr_at(&s, 1, 3) == 2e-4);
    CHECK_NEAR(nl_lr_at(&s, 2, 3), 2e-4 * 0.75, 1e-15);
    CHECK_NEAR(nl_lr_at(&s, 3, 3), 2e-4 * 0.25, 1e-15);
    CHECK_NEAR(nl_lr_at(&s, 4, 3), 0, 1e-20);
    for (int n = 1; n <= 1000; n += 37) {
        int pos = 1;
        for (int t = 1; t <= n; t++) pos &= nl_lr_at(&s, t, n) > 0;
        CHECKF(pos, "a step of %d has lr 0", n);
    }
    s.warmup_steps = 3; /* warmup then a single decay step: the peak */
    CHECK(nl_lr_at(&s, 4, 4) == 2e-4);
    s.warmup_steps = 10;
    CHECK(nl_lr_at(&s, 12, 10) == 2e-4); /* total <= warmup: no cosine part */
}

int main(void) {
    test_adamw(0.0);
    test_adamw(0.05);
    test_adamw_first_step();
    test_norm_clip();
    test_schedule();
    return nl_t_done();
}

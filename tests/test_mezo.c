/* MeZO: the parameters are restored bit-exactly around the perturbations (also when a forward
 * fails half-way); the update equals θ0 − lr·g·z with z regenerated independently here; the
 * projected gradient matches the backprop directional derivative ∇L·z (central finite
 * difference identity) on tiny models of every arch; MeZO lowers the loss of a small
 * learnable task (train and held-out) over a few hundred steps; same seed → identical params. */
#include <unistd.h>

#include "test.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/quant.h"
#include "train/mezo.h"
#include "util/rng.h"
#include "util/util.h"

static char tmpdir[256];

static void die(void) {
    fprintf(stderr, "%s\n", nl_last_error());
    exit(1);
}

/* A batch of sequences owned by the test. */
typedef struct {
    nl_seq seq[8];
    int32_t ids[8][32];
    uint8_t tgt[8][32];
    int n;
} batch;

/* Task: "x0 K x1 K x2 K ...": random tokens x_i interleaved with a fixed token K; the targets
 * are the K positions. Learnable by the LoRA branches (predict K after any token). */
static void make_task(batch *b, int n_seq, int T, int V, int K, uint64_t seed) {
    b->n = n_seq;
    uint64_t key = nl_rng_key(seed);
    for (int s = 0; s < n_seq; s++) {
        for (int t = 0; t < T; t++) {
            b->ids[s][t] = t % 2 ? K : (int32_t)(nl_rng_u32(key, (uint64_t)(s * 64 + t)) % (uint32_t)V);
            b->tgt[s][t] = t % 2 ? 1 : 0;
        }
        b->seq[s] = (nl_seq){
            .ids = b->ids[s], .target = b->tgt[s], .n_tokens = T, .n_targets = T / 2, .bucket = 32, .example = s};
    }
}

/* Random tokens with scattered targets (for the gradient identity). */
static void make_random(batch *b, int n_seq, int T, int V) {
    b->n = n_seq;
    for (int s = 0; s < n_seq; s++) {
        int nt = 0;
        for (int t = 0; t < T; t++) {
            b->ids[s][t] = (int32_t)((s * 131 + t * 29 + 3) % V);
            b->tgt[s][t] = t > 0 && (t + s) % 3 != 0;
            nt += b->tgt[s][t];
        }
        b->seq[s] = (nl_seq){
            .ids = b->ids[s], .target = b->tgt[s], .n_tokens = T - s, .n_targets = 0, .bucket = 32, .example = s};
        nt = 0;
        for (int t = 0; t < T - s; t++) nt += b->tgt[s][t];
        b->seq[s].n_targets = nt;
    }
}

typedef struct {
    int calls, fail_at;
} pace_ctr;

static int pace_count(void *user) {
    pace_ctr *c = user;
    c->calls++;
    if (c->fail_at > 0 && c->calls == c->fail_at) return nl_err("test: injected failure");
    return 0;
}

static void open_tiny(nl_arch arch, nl_session *s) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, nl_arch_name(arch));
    if (access(path, F_OK) != 0 && nl_mkmodel(arch, "tiny", NL_TYPE_F32, 11, path)) die();
    if (nl_session_open(s, path, NULL, NL_T_REF_CFG)) die();
}

/* Bits of the update and of the restore. */
static void test_restore(void) {
    nl_session s;
    open_tiny(NL_ARCH_QWEN3, &s);
    nl_adapter *ad = nl_adapter_new(s.m, "all", 2, 4.0f, 5);
    if (!ad) die();
    for (int i = 0; i < ad->n; i++) {
        float *B = nl_lora_B(ad, i);
        for (int64_t j = 0; j < ad->t[i].n_out * ad->t[i].rank; j++) B[j] = (float)(0.05 * nl_t_rand());
    }
    s.rt.adapter = ad;
    size_t n = ad->n_params;
    batch b;
    make_random(&b, 3, 17, s.m->hp.n_vocab);
    nl_graph g = {.rt = &s.rt, .ad = ad, .grads = NULL, .dropout = 0.3f, .seed = 1};
    float *p0 = malloc(n * sizeof(float)), *naive = malloc(n * sizeof(float));
    memcpy(p0, ad->params, n * sizeof(float));

    /* Why the copy: add/subtract the regenerated εz does not give θ back in float. */
    uint64_t key = nl_mezo_key(7, 1);
    nl_mezo_perturb(naive, p0, n, key, 1e-3);
    nl_mezo_perturb(naive, naive, n, key, -2e-3);
    nl_mezo_perturb(naive, naive, n, key, 1e-3);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&naive[i], &p0[i], sizeof(float)) != 0;
    printf("naive +εz −2εz +εz restore: %zu of %zu params differ from the original bits\n", differ, n);

    /* lr = 0: the step must leave every bit as it was, and the dropout setting too. */
    nl_mezo_cfg cfg;
    nl_mezo_defaults(&cfg);
    cfg.seed = 7;
    cfg.lr = 0.0;
    nl_mezo_result r;
    CHECK(nl_mezo_step(&g, &cfg, 1, b.seq, NULL, b.n, &r) == 0);
    CHECK(memcmp(ad->params, p0, n * sizeof(float)) == 0);
    CHECK(g.dropout == 0.3f);
    CHECK(r.loss_plus != r.loss_minus);
    CHECK(r.n_targets == b.seq[0].n_targets + b.seq[1].n_targets + b.seq[2].n_targets);
    CHECK(r.n_tokens == 17 + 16 + 15);
    {
        /* the gradient estimate's norm |g|·|z|, z regenerated from the step's key */
        double zz = 0;
        for (size_t i = 0; i < n; i++) {
            double z = nl_rng_normal(nl_mezo_key(7, 1), (uint64_t)i);
            zz += z * z;
        }
        CHECKF(r.grad_norm == fabs(r.proj_grad) * sqrt(zz) && r.grad_norm > 0, "grad_norm %g", r.grad_norm);
    }

    /* lr > 0 with weight decay: the result is fl((1 − lr·wd)·θ0 − lr·g·z) from the ORIGINAL θ0,
     * z regenerated here from the key. Same L± as with lr = 0 (the forwards see the same θ±). */
    cfg.lr = 3e-3;
    cfg.weight_decay = 0.1;
    nl_mezo_result r2;
    CHECK(nl_mezo_step(&g, &cfg, 1, b.seq, NULL, b.n, &r2) == 0);
    CHECK(r2.loss_plus == r.loss_plus && r2.loss_minus == r.loss_minus);
    size_t bad = 0, changed = 0;
    for (size_t i = 0; i < n; i++) {
        double z = nl_rng_normal(key, i);
        float want = (float)((1.0 - 3e-3 * 0.1) * (double)p0[i] - 3e-3 * r2.proj_grad * z);
        bad += memcmp(&want, &ad->params[i], sizeof(float)) != 0;
        changed += ad->params[i] != p0[i];
    }
    CHECKF(bad == 0, "%zu of %zu params differ from fl(θ0 − lr·g·z)", bad, n);
    CHECK(changed > n / 2);

    /* A failure inside the SECOND forward (θ − εz set): the params come back bit-exactly. */
    memcpy(ad->params, p0, n * sizeof(float));
    pace_ctr pc = {0, 0};
    s.rt.pace = pace_count;
    s.rt.pace_user = &pc;
    double l;
    CHECK(nl_mezo_batch_loss(&g, b.seq, NULL, b.n, &l, NULL, NULL) == 0);
    int per_pass = pc.calls;
    CHECK(per_pass > 0);
    for (int k = 1; k <= 2; k++) {
        pc.calls = 0;
        pc.fail_at = k == 1 ? per_pass / 2 : per_pass + per_pass / 2; /* in L+'s, then in L−'s forward */
        CHECK(nl_mezo_step(&g, &cfg, 2, b.seq, NULL, b.n, &r2) == -1);
        CHECK(strstr(nl_last_error(), "injected") != NULL);
        CHECKF(memcmp(ad->params, p0, n * sizeof(float)) == 0, "failure in pass %d changed the params", k);
        CHECK(g.dropout == 0.3f);
    }
    s.rt.pace = NULL;
    /* bad configurations leave everything alone */
    cfg.eps = 0.0;
    CHECK(nl_mezo_step(&g, &cfg, 1, b.seq, NULL, b.n, NULL) == -1);
    cfg.eps = 1e-3;
    CHECK(nl_mezo_step(&g, &cfg, 0, b.seq, NULL, b.n, NULL) == -1);
    CHECK(memcmp(ad->params, p0, n * sizeof(float)) == 0);
    free(p0);
    free(naive);
    s.rt.adapter = NULL;
    nl_adapter_free(ad);
    nl_session_close(&s);
}

/* g = (L+ − L−)/2ε vs ∇L·z from backprop (dropout off, same batch, same normalisation). */
static void test_fd_identity(nl_arch arch) {
    nl_session s;
    open_tiny(arch, &s);
    nl_adapter *ad = nl_adapter_new(s.m, "all", 2, 4.0f, 5);
    if (!ad) die();
    for (int i = 0; i < ad->n; i++) {
        float *B = nl_lora_B(ad, i);
        for (int64_t j = 0; j < ad->t[i].n_out * ad->t[i].rank; j++) B[j] = (float)(0.05 * nl_t_rand());
    }
    s.rt.adapter = ad;
    size_t n = ad->n_params;
    batch b;
    make_random(&b, 3, 19, s.m->hp.n_vocab);
    float *grad = calloc(n, sizeof(float));
    nl_graph g = {.rt = &s.rt, .ad = ad, .grads = grad, .dropout = 0.0f, .seed = 3, .act_budget = UINT64_MAX};
    int64_t nt = 0;
    for (int i = 0; i < b.n; i++) nt += b.seq[i].n_targets;
    double l0 = 0.0;
    for (int i = 0; i < b.n; i++) {
        int32_t rows[32];
        nl_row_targets(b.seq[i].ids, b.seq[i].target, b.seq[i].n_tokens, rows);
        double ls;
        if (nl_graph_seq(&g, b.seq[i].ids, rows, b.seq[i].n_tokens, 1.0f / (float)nt, &ls)) die();
        l0 += ls;
    }
    l0 /= (double)nt;
    g.grads = NULL;   /* MeZO must not need a gradient buffer */
    g.dropout = 0.1f; /* and must switch dropout off itself */
    nl_mezo_cfg cfg;
    nl_mezo_defaults(&cfg);
    cfg.lr = 0.0;
    int bad = 0;
    double worst = 0.0;
    for (int64_t step = 1; step <= 4; step++) {
        uint64_t key = nl_mezo_key(cfg.seed, step);
        double dd = 0.0;
        for (size_t i = 0; i < n; i++) dd += (double)grad[i] * nl_rng_normal(key, i);
        nl_mezo_result r;
        CHECK(nl_mezo_step(&g, &cfg, step, b.seq, NULL, b.n, &r) == 0);
        double err = fabs(r.proj_grad - dd) / fmax(fabs(dd), 1e-2);
        if (err > worst) worst = err;
        if (err > 2e-2) {
            bad++;
            fprintf(stderr, "%s step %lld: projected grad %.6g, directional derivative %.6g\n", nl_arch_name(arch),
                    (long long)step, r.proj_grad, dd);
        }
        /* (L+ + L−)/2 = L(θ) + O(ε²) */
        CHECK_NEAR(r.loss, l0, 1e-4 * fabs(l0));
    }
    CHECKF(bad == 0, "%s: %d of 4 projected gradients off (worst rel err %.3g)", nl_arch_name(arch), bad, worst);
    printf("%s: projected gradient vs ∇L·z, worst rel err %.3g\n", nl_arch_name(arch), worst);
    free(grad);
    s.rt.adapter = NULL;
    nl_adapter_free(ad);
    nl_session_close(&s);
}

/* Run `steps` MeZO steps from the adapter's current params. */
static void run_mezo(nl_graph *g, const nl_mezo_cfg *cfg, const batch *b, int steps, double *first, double *last) {
    for (int64_t step = 1; step <= steps; step++) {
        nl_mezo_result r;
        if (nl_mezo_step(g, cfg, step, b->seq, NULL, b->n, &r)) die();
        if (step == 1 && first) *first = r.loss;
        if (last) *last = r.loss;
    }
}

static void test_learns_and_determinism(void) {
    nl_session s;
    open_tiny(NL_ARCH_LLAMA, &s);
    int V = s.m->hp.n_vocab;
    nl_adapter *ad = nl_adapter_new(s.m, "q,v,output", 2, 4.0f, 5);
    if (!ad) die();
    s.rt.adapter = ad;
    size_t n = ad->n_params;
    float *init = malloc(n * sizeof(float));
    memcpy(init, ad->params, n * sizeof(float));
    batch train, held;
    make_task(&train, 4, 12, V, 7, 100);
    make_task(&held, 4, 12, V, 7, 200);
    nl_graph g = {.rt = &s.rt, .ad = ad, .dropout = 0.0f, .seed = 3};
    double tr0, he0, tr1, he1;
    if (nl_mezo_batch_loss(&g, train.seq, NULL, train.n, &tr0, NULL, NULL)) die();
    if (nl_mezo_batch_loss(&g, held.seq, NULL, held.n, &he0, NULL, NULL)) die();
    nl_mezo_cfg cfg;
    nl_mezo_defaults(&cfg);
    cfg.seed = 11;
    cfg.lr = 2e-3;
    enum { STEPS = 200 };
    double t0 = nl_now(), first, last;
    run_mezo(&g, &cfg, &train, STEPS, &first, &last);
    double dt = nl_now() - t0;
    if (nl_mezo_batch_loss(&g, train.seq, NULL, train.n, &tr1, NULL, NULL)) die();
    if (nl_mezo_batch_loss(&g, held.seq, NULL, held.n, &he1, NULL, NULL)) die();
    printf("MeZO %d steps (%zu params, %.2f s): train loss %.4f -> %.4f, held-out %.4f -> %.4f\n", STEPS, n, dt, tr0,
           tr1, he0, he1);
    CHECKF(tr1 < tr0 - 0.5, "train loss %.4f -> %.4f", tr0, tr1);
    CHECKF(he1 < he0 - 0.5, "held-out loss %.4f -> %.4f", he0, he1);

    /* determinism: same seed from the same init → identical bits (the first 40 steps of the
     * run above, twice); resume: 20 steps, "checkpoint" (params only), then steps 21..40 gives
     * the same bits as 40 straight steps; another seed → different bits */
    float *after = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));
    memcpy(ad->params, init, n * sizeof(float));
    run_mezo(&g, &cfg, &train, 40, NULL, NULL);
    memcpy(after, ad->params, n * sizeof(float));
    memcpy(ad->params, init, n * sizeof(float));
    run_mezo(&g, &cfg, &train, 40, NULL, NULL);
    memcpy(again, ad->params, n * sizeof(float));
    CHECK(memcmp(after, again, n * sizeof(float)) == 0);
    memcpy(ad->params, init, n * sizeof(float));
    run_mezo(&g, &cfg, &train, 20, NULL, NULL);
    for (int64_t step = 21; step <= 40; step++)
        if (nl_mezo_step(&g, &cfg, step, train.seq, NULL, train.n, NULL)) die();
    CHECK(memcmp(after, ad->params, n * sizeof(float)) == 0);
    memcpy(ad->params, init, n * sizeof(float));
    cfg.seed = 12;
    run_mezo(&g, &cfg, &train, 20, NULL, NULL);
    CHECK(memcmp(after, ad->params, n * sizeof(float)) != 0);
    /* idx selects the batch like the trainer's batcher does */
    int idx[2] = {3, 1};
    double lsel, lref;
    batch two = {.n = 2};
    two.seq[0] = train.seq[3];
    two.seq[1] = train.seq[1];
    CHECK(nl_mezo_batch_loss(&g, train.seq, idx, 2, &lsel, NULL, NULL) == 0);
    CHECK(nl_mezo_batch_loss(&g, two.seq, NULL, 2, &lref, NULL, NULL) == 0);
    CHECK(lsel == lref);
    free(after);
    free(again);
    free(init);
    s.rt.adapter = NULL;
    nl_adapter_free(ad);
    nl_session_close(&s);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nl_test_mezo_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd)) return 1;
    /* z is N(0, 1): a quick sanity check of the moments over the first 20000 counters */
    {
        uint64_t key = nl_mezo_key(42, 5);
        double s1 = 0, s2 = 0;
        for (int i = 0; i < 20000; i++) {
            double z = nl_rng_normal(key, (uint64_t)i);
            s1 += z;
            s2 += z * z;
        }
        CHECK_NEAR(s1 / 20000, 0.0, 0.03);
        CHECK_NEAR(s2 / 20000, 1.0, 0.04);
        CHECK(nl_mezo_key(42, 5) != nl_mezo_key(42, 6) && nl_mezo_key(42, 5) != nl_mezo_key(43, 5));
    }
    test_restore();
    test_fd_identity(NL_ARCH_LLAMA);
    test_fd_identity(NL_ARCH_QWEN3);
    test_fd_identity(NL_ARCH_QWEN35);
    test_learns_and_determinism();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    return nl_t_done();
}

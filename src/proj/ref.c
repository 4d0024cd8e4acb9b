/* proj/ref: the FP32 reference backend. Readable, exact to the formats, deterministic.
 *
 *   FWD: Y[T][N] = X[T][K] · Wᵀ     W is N×K row-major (GGUF layout)
 *   BWD: Y[T][K] = X[T][N] · W
 *
 * W is read ONLY through its type's to_float: FWD dequantizes one row at a time and uses it
 * for all T tokens; BWD dequantizes a 256-column slice of each row and accumulates it into
 * those 256 outputs of every token. Sums run in double, in a fixed order (k ascending for FWD,
 * n ascending for BWD), then round once to float.
 *
 * Threads split the OUTPUTS (FWD: rows n of W = columns of Y; BWD: column slices of W =
 * columns of Y), never a reduction, so the result does not depend on the thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "proj/proj.h"
#include "util/pool.h"
#include "util/util.h"

/* BWD column slice: a multiple of every block size (1, 32, 256). */
#define SLICE 256

typedef struct {
    double *acc; /* BWD: [T][SLICE]; FWD: unused */
    float *w;    /* a dequantized row (FWD, K floats) or slice (BWD, SLICE floats) */
    size_t acc_n, w_n;
} ref_scratch;

typedef struct {
    nl_pool *pool;
    int n_threads;
    ref_scratch *sc; /* one per task */
} ref_ctx;

typedef struct {
    ref_ctx *c;
    const nl_proj_weight *w;
    const nl_type_traits *tt;
    size_t row_bytes;
    const float *x;
    int T;
    float *y;
} ref_job;

static int ref_init(void **ctx, int n_threads, const char *compute) {
    *ctx = NULL;
    if (nl_proj_compute_known(compute)) return -1; /* a known mode: FP32 here whatever it asks */
    ref_ctx *c = nl_calloc(1, sizeof *c);
    if (!c) return -1;
    c->n_threads = n_threads > 0 ? n_threads : 1;
    c->sc = nl_calloc((size_t)c->n_threads, sizeof *c->sc);
    c->pool = c->sc ? nl_pool_new(c->n_threads) : NULL;
    if (!c->pool) {
        free(c->sc);
        free(c);
        return -1;
    }
    *ctx = c;
    return 0;
}

static void ref_free(void *ctx) {
    ref_ctx *c = ctx;
    if (!c) return;
    nl_pool_free(c->pool);
    for (int i = 0; i < c->n_threads; i++) {
        free(c->sc[i].acc);
        free(c->sc[i].w);
    }
    free(c->sc);
    free(c);
}

static int ref_supports(void *ctx, const nl_proj_weight *w, nl_dir dir, int T) {
    (void)ctx;
    (void)dir;
    (void)T;
    const nl_type_traits *tt = nl_type_get(w->type);
    return tt && tt->to_float && w->n_in % tt->blck == 0;
}

/* FWD task: rows [n0, n1) of W -> columns [n0, n1) of Y. */
static void fwd_task(void *arg, int task, int n_tasks) {
    ref_job *j = arg;
    const int64_t K = j->w->n_in, N = j->w->n_out;
    const int64_t n0 = N * task / n_tasks, n1 = N * (task + 1) / n_tasks;
    float *wrow = j->c->sc[task].w;
    const uint8_t *base = j->w->data;
    for (int64_t n = n0; n < n1; n++) {
        j->tt->to_float(base + (size_t)n * j->row_bytes, wrow, K);
        int t = 0;
        /* four tokens at a time: four independent sums (each still k ascending), for speed */
        for (; t + 4 <= j->T; t += 4) {
            const float *x0 = j->x + (size_t)t * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double wk = wrow[k];
                a0 += (double)x0[k] * wk;
                a1 += (double)x1[k] * wk;
                a2 += (double)x2[k] * wk;
                a3 += (double)x3[k] * wk;
            }
            j->y[(size_t)t * N + n] = (float)a0;
            j->y[(size_t)(t + 1) * N + n] = (float)a1;
            j->y[(size_t)(t + 2) * N + n] = (float)a2;
            j->y[(size_t)(t + 3) * N + n] = (float)a3;
        }
        for (; t < j->T; t++) {
            const float *xt = j->x + (size_t)t * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xt[k] * (double)wrow[k];
            j->y[(size_t)t * N + n] = (float)acc;
        }
    }
}

/* BWD task: a contiguous range of SLICE-column slices of W -> those columns of Y. */
static void bwd_task(void *arg, int task, int n_tasks) {
    ref_job *j = arg;
    const int64_t K = j->w->n_in, N = j->w->n_out;
    const int64_t n_slices = (K + SLICE - 1) / SLICE;
    const int64_t s0 = n_slices * task / n_tasks, s1 = n_slices * (task + 1) / n_tasks;
    ref_scratch *sc = &j->c->sc[task];
    const uint8_t *base = j->w->data;
    const size_t blk_bytes = j->tt->bytes;
    for (int64_t sl = s0; sl < s1; sl++) {
        const int64_t k0 = sl * SLICE;
        const int64_t len = K - k0 < SLICE ? K - k0 : SLICE; /* a whole number of blocks */
        const size_t off = (size_t)(k0 / j->tt->blck) * blk_bytes;
        memset(sc->acc, 0, sizeof(double) * (size_t)j->T * SLICE);
        for (int64_t n = 0; n < N; n++) {
            j->tt->to_float(base + (size_t)n * j->row_bytes + off, sc->w, len);
            for (int t = 0; t < j->T; t++) {
                const double xv = j->x[(size_t)t * N + n];
                double *a = sc->acc + (size_t)t * SLICE;
                for (int64_t k = 0; k < len; k++) a[k] += xv * (double)sc->w[k];
            }
        }
        for (int t = 0; t < j->T; t++)
            for (int64_t k = 0; k < len; k++) j->y[(size_t)t * K + k0 + k] = (float)sc->acc[(size_t)t * SLICE + k];
    }
}

static int grow(void **p, size_t *have, size_t need, size_t elem) {
    if (*have >= need) return 0;
    void *q = realloc(*p, need * elem);
    if (!q) return nl_err("ref: out of memory (%zu bytes)", need * elem);
    *p = q;
    *have = need;
    return 0;
}

static int ref_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    ref_ctx *c = ctx;
    const nl_type_traits *tt = nl_type_get(w->type);
    if (!tt || !tt->to_float) return nl_err("ref: %s: type %s not supported", w->name, nl_type_name(w->type));
    if (w->n_in % tt->blck)
        return nl_err("ref: %s: K=%lld not a multiple of %d", w->name, (long long)w->n_in, tt->blck);
    if (T <= 0) return 0;
    int n_tasks = c->n_threads;
    for (int i = 0; i < n_tasks; i++) {
        ref_scratch *sc = &c->sc[i];
        if (dir == NL_FWD) {
            if (grow((void **)&sc->w, &sc->w_n, (size_t)w->n_in, sizeof(float))) return -1;
        } else {
            if (grow((void **)&sc->w, &sc->w_n, SLICE, sizeof(float))) return -1;
            if (grow((void **)&sc->acc, &sc->acc_n, (size_t)T * SLICE, sizeof(double))) return -1;
        }
    }
    ref_job j = {c, w, tt, nl_row_bytes(w->type, w->n_in), x, T, y};
    nl_pool_run(c->pool, n_tasks, dir == NL_FWD ? fwd_task : bwd_task, &j);
    return 0;
}

static int ref_describe(void *ctx, char *buf, size_t cap) {
    (void)ctx;
    return snprintf(buf, cap, "f32 compute (reference, float64 sums)");
}

const nl_proj_backend nl_proj_backend_ref = {
    .name = "ref",
    .init = ref_init,
    .supports = ref_supports,
    .run = ref_run,
    .free = ref_free,
    .any_T = 1,
    .describe = ref_describe,
};

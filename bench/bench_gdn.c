/* bench_gdn: one GDN layer at the qwen35-0.8b shape (Hk = Hv = 16, dk = dv = 128, K = 4),
 * T = 512 tokens (or argv[1]): ms for the forward, the training forward (with checkpoints)
 * and the backward, best of N runs (argv[2], default 3), on argv[3] threads (default 1; the
 * results are the same bits on any number), on the kernel set argv[4] (cpu/kernels.h's table:
 * scalar, avx2, avx512 or auto, the best the CPU has, the default; the same bits on every one).
 * Not a test. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu/kernels.h"
#include "nn/gdn.h"
#include "util/pool.h"
#include "util/util.h"

static unsigned long long rng = 88172645463325252ULL;
static float frand(float lo, float hi) { /* xorshift64, uniform in [lo, hi) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
}
static float *rnd(size_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 512, reps = argc > 2 ? atoi(argv[2]) : 3, nth = argc > 3 ? atoi(argv[3]) : 1;
    const char *level = argc > 4 ? argv[4] : "auto";
    if (T < 1 || reps < 1 || nth < 1 || nl_cpu_use(level) != 0) {
        fprintf(stderr, "usage: bench_gdn [T] [reps] [threads] [kernel set: scalar, avx2, avx512 or auto]\n%s\n",
                nl_last_error());
        return 1;
    }
    nl_pool *pool = nth > 1 ? nl_pool_new(nth) : NULL;
    if (nth > 1 && !pool) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    nl_gdn_shape s = {.Hk = 16, .Hv = 16, .dk = 128, .dv = 128, .K = 4, .eps = 1e-6f, .kv_tiled = 1};
    int cd = nl_gdn_conv_dim(&s), vd = s.Hv * s.dv;
    float *conv = rnd((size_t)cd * s.K, -0.5f, 0.5f), *dt = rnd(s.Hv, -1, 1), *A = rnd(s.Hv, -2, -0.1f);
    float *norm = rnd(s.dv, 0.5f, 1.5f);
    nl_gdn_weights w = {conv, dt, A, norm};
    float *mixed = rnd((size_t)T * cd, -1, 1), *z = rnd((size_t)T * vd, -1, 1);
    float *b = rnd((size_t)T * s.Hv, -2, 2), *a = rnd((size_t)T * s.Hv, -2, 2);
    float *dy = rnd((size_t)T * vd, -1, 1), *y = rnd((size_t)T * vd, 0, 1);
    float *dm = rnd((size_t)T * cd, 0, 1), *dz = rnd((size_t)T * vd, 0, 1);
    float *db = rnd((size_t)T * s.Hv, 0, 1), *da = rnd((size_t)T * s.Hv, 0, 1);
    nl_gdn_cache *c = nl_gdn_cache_new(NULL, &s, T);
    if (!c) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < reps; r++) {
        double t0 = nl_now();
        if (nl_gdn_forward(pool, NULL, &s, &w, y, mixed, z, b, a, T, NULL)) goto fail;
        double t1 = nl_now();
        if (nl_gdn_forward_train(pool, NULL, &s, &w, y, mixed, z, b, a, T, c)) goto fail;
        double t2 = nl_now();
        if (nl_gdn_backward(pool, NULL, &s, &w, c, dy, T, dm, dz, db, da)) goto fail;
        double t3 = nl_now();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
        if (t3 - t2 < best[2]) best[2] = t3 - t2;
    }
    /* recurrence flops per token and head: forward 2 passes x 2 FMA x dk*dv */
    double gf = 8.0 * T * s.Hv * s.dk * s.dv * 1e-9;
    printf("gdn qwen35-0.8b shape (Hk=Hv=16, dk=dv=128, K=4), T=%d, best of %d, %d thread%s, %s kernels\n", T, reps,
           nth, nth > 1 ? "s" : "", nl_cpu_kernels()->name);
    printf("  forward        %8.1f ms  (%.2f GFLOP/s on the recurrence)\n", best[0] * 1e3, gf / best[0]);
    printf("  forward_train  %8.1f ms\n", best[1] * 1e3);
    printf("  backward       %8.1f ms  (%.2fx forward)\n", best[2] * 1e3, best[2] / best[0]);
    printf("  cache %.1f MiB (%llu bytes), backward scratch %.2f MiB; checksum %.6g\n",
           nl_gdn_cache_size(c) / 1048576.0, (unsigned long long)nl_gdn_cache_size(c),
           nl_gdn_backward_work_bytes(&s) / 1048576.0, (double)(dm[0] + da[T * s.Hv - 1]));
    nl_gdn_cache_free(c);
    nl_pool_free(pool);
    return 0;
fail:
    fprintf(stderr, "bench_gdn: %s\n", nl_last_error());
    return 1;
}

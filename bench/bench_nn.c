/* bench_nn: wall-clock of the hot nn/ nodes (not a test). Prints ms per call.
 *   attention forward / backward at T=512, Hq=16, Hkv=8, d=128 (Llama-3.2-1B-like layer), FP32
 *   and BF16, and on the AMX tiles where the CPU has them (cpu/tiles.h), one thread and two (kv
 *   heads split; wall clock)
 *   lora forward / backward at T=512, n_in=2048, n_out=2048, r=16, p=0.05 (FP32; AMX tiles
 *   where the CPU has them; there the backward by lines with the mask regenerated and read from
 *   the forward's kept bits)
 *   lora step: the LoRA node of a qwen3-0.6b step at T=512 (its 7 projection shapes × 28 layers,
 *   r=16, p=0.05), as train/graph runs it on a 2-thread pool after each service request: the
 *   forward's rows split over the threads with NL_LORA_ADD and the mask's bits kept, the
 *   backward's rows then its parameter lines reading them; FP32, and the BF16 pair where the CPU
 *   runs it; each projection's own buffers over a ring of 4 layers (~370 MB: from memory, as in a
 *   step); wall clock, best of the reps; per step
 *   gemm (cpu/gemm.c) on the attention and LoRA block shapes
 * Usage: bench_nn [reps] [amx]   (amx: the tile attention only, a profiler's run)
 * Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): steady on a shared
 * machine, where other tenants' time slices would inflate the wall clock. */
#include "cpu/amx.h"
#include "cpu/vecmath.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "util/pool.h"
#include "util/util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define nl_now now_cpu

static void fill(float *p, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = (float)((*s >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
}

typedef struct {
    int bf16, bwd;
    float *o, *lse;
    const float *q, *k, *v, *dout;
    float *dq, *dk, *dv;
    int T, Hq, Hkv, d;
    float scale;
    int g0, g1;
    const nl_amx_tiles *tl; /* non-NULL: the tile variant */
} attn_job;

static void *attn_run(void *arg) {
    const attn_job *j = arg;
    if (j->tl && !j->bwd)
        nl_attention_forward_range_tiles(j->tl, &(nl_attn_fwd){.out = j->o,
                                                               .lse = j->lse,
                                                               .q = j->q,
                                                               .k = j->k,
                                                               .v = j->v,
                                                               .T = j->T,
                                                               .S = j->T,
                                                               .Hq = j->Hq,
                                                               .Hkv = j->Hkv,
                                                               .d = j->d,
                                                               .scale = j->scale,
                                                               .g0 = j->g0,
                                                               .g1 = j->g1});
    else if (j->tl)
        nl_attention_backward_range_tiles(j->tl, &(nl_attn_bwd){.dq = j->dq,
                                                                .dk = j->dk,
                                                                .dv = j->dv,
                                                                .dout = j->dout,
                                                                .out = j->o,
                                                                .lse = j->lse,
                                                                .q = j->q,
                                                                .k = j->k,
                                                                .v = j->v,
                                                                .T = j->T,
                                                                .Hq = j->Hq,
                                                                .Hkv = j->Hkv,
                                                                .d = j->d,
                                                                .scale = j->scale,
                                                                .g0 = j->g0,
                                                                .g1 = j->g1});
    else if (!j->bwd && j->bf16)
        nl_attention_forward_range_bf16(&(nl_attn_fwd){.out = j->o,
                                                       .lse = j->lse,
                                                       .q = j->q,
                                                       .k = j->k,
                                                       .v = j->v,
                                                       .T = j->T,
                                                       .S = j->T,
                                                       .Hq = j->Hq,
                                                       .Hkv = j->Hkv,
                                                       .d = j->d,
                                                       .scale = j->scale,
                                                       .g0 = j->g0,
                                                       .g1 = j->g1});
    else if (!j->bwd)
        nl_attention_forward_range(&(nl_attn_fwd){.out = j->o,
                                                  .lse = j->lse,
                                                  .q = j->q,
                                                  .k = j->k,
                                                  .v = j->v,
                                                  .T = j->T,
                                                  .S = j->T,
                                                  .Hq = j->Hq,
                                                  .Hkv = j->Hkv,
                                                  .d = j->d,
                                                  .scale = j->scale,
                                                  .g0 = j->g0,
                                                  .g1 = j->g1});
    else if (j->bf16)
        nl_attention_backward_range_bf16(&(nl_attn_bwd){.dq = j->dq,
                                                        .dk = j->dk,
                                                        .dv = j->dv,
                                                        .dout = j->dout,
                                                        .out = j->o,
                                                        .lse = j->lse,
                                                        .q = j->q,
                                                        .k = j->k,
                                                        .v = j->v,
                                                        .T = j->T,
                                                        .Hq = j->Hq,
                                                        .Hkv = j->Hkv,
                                                        .d = j->d,
                                                        .scale = j->scale,
                                                        .g0 = j->g0,
                                                        .g1 = j->g1});
    else
        nl_attention_backward_range(&(nl_attn_bwd){.dq = j->dq,
                                                   .dk = j->dk,
                                                   .dv = j->dv,
                                                   .dout = j->dout,
                                                   .out = j->o,
                                                   .lse = j->lse,
                                                   .q = j->q,
                                                   .k = j->k,
                                                   .v = j->v,
                                                   .T = j->T,
                                                   .Hq = j->Hq,
                                                   .Hkv = j->Hkv,
                                                   .d = j->d,
                                                   .scale = j->scale,
                                                   .g0 = j->g0,
                                                   .g1 = j->g1});
    return NULL;
}

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the job's kv heads split over two threads; wall seconds */
static double attn_two(const attn_job *j) {
    attn_job a = *j, b = *j;
    a.g1 = b.g0 = (j->g0 + j->g1) / 2;
    const double t0 = wall();
    pthread_t th;
    const int two = pthread_create(&th, NULL, attn_run, &b) == 0;
    if (!two) attn_run(&b);
    attn_run(&a);
    if (two) pthread_join(th, NULL);
    return wall() - t0;
}

/* ---- the LoRA node of a qwen3-0.6b step (see the header) ---- */
typedef struct {
    const nl_lora *L;
    const float *A, *B, *x, *dy;
    float *y, *u, *dx, *dA, *dB, *scr;
    int T, phase;
} lora_job;

static void lora_task(void *arg, int task, int n) {
    const lora_job *j = arg;
    const int t0 = j->T * task / n, t1 = j->T * (task + 1) / n, J = j->L->n_in + j->L->n_out;
    if (j->phase == 0) nl_lora_forward_rows(j->L, j->A, j->B, j->y, j->u, j->x, 0, NULL, NL_LORA_ADD, t0, t1);
    else if (j->phase == 1)
        nl_lora_backward_rows(j->L, j->A, j->B, j->dx, NL_LORA_ADD, j->dy, j->x, j->u, j->T, 0, NULL, j->scr, t0, t1);
    else nl_lora_backward_params(j->L, j->dA, j->dB, j->dy, j->x, j->T, j->scr, J * task / n, J * (task + 1) / n);
}

static int lora_step(int reps, unsigned *s) {
    enum { T = 512, R = 16, LAYERS = 28, RING = 4, NP = 7 };
    static const int sh[NP][2] = {{1024, 2048}, {1024, 1024}, {1024, 1024}, {2048, 1024},
                                  {1024, 3072}, {1024, 3072}, {3072, 1024}}; /* q k v o gate up down */
    nl_pool *pool = nl_pool_new(2);
    if (!pool) return 1;
    float *buf[RING][NP][6];
    uint16_t *bits[RING][NP];
    size_t scr_n = 0;
    for (int l = 0; l < RING; l++)
        for (int k = 0; k < NP; k++) {
            const size_t K = (size_t)sh[k][0], N = (size_t)sh[k][1];
            const size_t n[6] = {T * K,        T * N, T * N, T * K, (size_t)R * (K + N) * 2,
                                 (size_t)T * R}; /* x y dy dx AB/dAdB u */
            for (int i = 0; i < 6; i++) {
                buf[l][k][i] = malloc(sizeof(float) * n[i]);
                if (!buf[l][k][i]) return 1;
                fill(buf[l][k][i], n[i], s);
                if (i == 4) /* A, B small, as a trained adapter's */
                    for (size_t e = 0; e < n[i]; e++) buf[l][k][i][e] *= 0.05f;
            }
            bits[l][k] = malloc(sizeof(uint16_t) * T * nl_lora_mask_halves((int)K));
            const nl_lora L = {(int)K, (int)N, R, 2.0f, 0.05f, 0, NULL, 0, NULL, NULL};
            if (nl_lora_bwd_scratch_floats(&L, T) > scr_n) scr_n = nl_lora_bwd_scratch_floats(&L, T);
        }
    float *scr = malloc(sizeof(float) * (scr_n + 1));
    if (!scr) return 1;
    for (int bf = 0; bf < 2; bf++) {
        if (bf && !nl_lora_bf16_runs(R)) {
            printf("lora step bf16: the BF16 pair does not run here (no AVX512_BF16): FP32 only\n");
            break;
        }
        double best_f = 1e30, best_b = 1e30;
        for (int r = 0; r < reps; r++) {
            double tf = 0.0, tb = 0.0;
            for (int l = 0; l < LAYERS; l++)
                for (int k = 0; k < NP; k++) {
                    float **b = buf[l % RING][k];
                    const int K = sh[k][0];
                    nl_lora L = {K, sh[k][1], R, 2.0f, 0.05f, nl_lora_dropout_key(1, 2, l, k), NULL, bf, NULL, NULL};
                    L.mask_out = bits[l % RING][k];
                    lora_job j = {&L,
                                  b[4],
                                  b[4] + R * K,
                                  b[0],
                                  b[2],
                                  b[1],
                                  b[5],
                                  b[3],
                                  b[4] + R * (K + sh[k][1]),
                                  b[4] + R * (K + sh[k][1]) + R * K,
                                  scr,
                                  T,
                                  0};
                    double t0 = wall();
                    nl_pool_run(pool, 2, lora_task, &j);
                    tf += wall() - t0;
                    L.mask_out = NULL, L.mask_in = bits[l % RING][k];
                    t0 = wall();
                    j.phase = 1;
                    nl_pool_run(pool, 2, lora_task, &j);
                    j.phase = 2;
                    nl_pool_run(pool, 2, lora_task, &j);
                    tb += wall() - t0;
                }
            if (tf < best_f) best_f = tf;
            if (tb < best_b) best_b = tb;
        }
        printf("lora step %s (qwen3-0.6b: 7 shapes x 28 layers, T=%d r=%d p=0.05, 2 threads, wall): forward %.1f ms, "
               "backward %.1f ms, both %.1f ms a step\n",
               bf ? "bf16" : "fp32", T, R, best_f * 1e3, best_b * 1e3, (best_f + best_b) * 1e3);
    }
    for (int l = 0; l < RING; l++)
        for (int k = 0; k < NP; k++) {
            for (int i = 0; i < 6; i++) free(buf[l][k][i]);
            free(bits[l][k]);
        }
    free(scr);
    nl_pool_free(pool);
    return 0;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const int only_amx = argc > 2 && strcmp(argv[2], "amx") == 0;
    const int T = 512, Hq = 16, Hkv = 8, d = 128;
    const size_t nq = (size_t)T * Hq * d, nk = (size_t)T * Hkv * d;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *o = malloc(nq * 4),
          *lse = malloc((size_t)T * Hq * 4);
    float *dout = malloc(nq * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    unsigned s = 1;
    fill(q, nq, &s), fill(k, nk, &s), fill(v, nk, &s), fill(dout, nq, &s);
    const float scale = 1.0f / sqrtf((float)d);
    const double flop_f = 4.0 * Hq * d * (T * (T + 1) / 2.0); /* QK + PV over the causal half */
    double best_f = 1e30, best_b = 1e30;
    /* FP32, BF16 (where the CPU has AVX512_BF16) and the AMX tiles (where it has them: never the
     * emulator, a test vehicle), on this thread and on two threads that split the kv heads as
     * the training graph does (wall clock for those) */
    const nl_amx_tiles *amx = nl_amx_tiles_of("amx");
    char why[200] = "";
    if (!amx) nl_amx_available(why, sizeof why);
    for (int bf = only_amx ? 2 : 0; bf < 3; bf++) {
        if (bf == 1 && !nl_attention_bf16_active()) {
            printf("attention bf16: AVX512_BF16 not available (the BF16 calls run the FP32 code)\n");
            continue;
        }
        if (bf == 2 && !amx) {
            printf("attention amx: not measured (%s)\n", why);
            continue;
        }
        for (int nt = 1; nt <= 2; nt++) {
            best_f = best_b = 1e30;
            for (int r = 0; r < reps; r++) {
                attn_job jf = {
                    bf == 1, 0, o, lse, q, k, v, dout, dq, dk, dv, T, Hq, Hkv, d, scale, 0, Hkv, bf == 2 ? amx : NULL};
                double tf, tb;
                if (nt == 1) {
                    double t0 = nl_now();
                    attn_run(&jf);
                    double t1 = nl_now();
                    jf.bwd = 1;
                    attn_run(&jf);
                    tf = t1 - t0, tb = nl_now() - t1;
                } else {
                    tf = attn_two(&jf);
                    jf.bwd = 1;
                    tb = attn_two(&jf);
                }
                if (tf < best_f) best_f = tf;
                if (tb < best_b) best_b = tb;
            }
            printf("attention %s T=%d Hq=%d Hkv=%d d=%d, %d thread%s: forward %.1f ms (%.1f GFLOP/s), backward %.1f ms "
                   "(%.1f GFLOP/s), both %.1f ms\n",
                   bf == 2 ? "amx "
                   : bf    ? "bf16"
                           : "fp32",
                   T, Hq, Hkv, d, nt, nt == 1 ? " " : "s", best_f * 1e3, flop_f / best_f * 1e-9, best_b * 1e3,
                   2.5 * flop_f / best_b * 1e-9, (best_f + best_b) * 1e3);
        }
    }
    if (only_amx) return 0;

    const int K = 2048, N = 2048, R = 16;
    float *x = malloc((size_t)T * K * 4), *y = calloc((size_t)T * N, 4), *A = malloc((size_t)R * K * 4);
    float *B = malloc((size_t)N * R * 4), *u = malloc((size_t)T * R * 4), *dy = malloc((size_t)T * N * 4);
    float *dx = calloc((size_t)T * K, 4), *dA = calloc((size_t)R * K, 4), *dB = calloc((size_t)N * R, 4);
    fill(x, (size_t)T * K, &s), fill(A, (size_t)R * K, &s), fill(B, (size_t)N * R, &s), fill(dy, (size_t)T * N, &s);
    const double lf = 2.0 * T * R * (K + N);
    for (int ti = 0; ti < 2; ti++) {
        if (ti && !amx) {
            printf("lora amx: not measured (%s)\n", why);
            break;
        }
        nl_lora L = {K, N, R, 2.0f, 0.05f, nl_lora_dropout_key(1, 2, 3, 4), ti ? amx : NULL, 0, NULL, NULL};
        best_f = best_b = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = nl_now();
            if (nl_lora_forward(&L, A, B, y, u, x, T, 0)) return 1;
            double t1 = nl_now();
            if (nl_lora_backward(&L, A, B, dx, dA, dB, dy, x, u, T, 0)) return 1;
            double t2 = nl_now();
            if (t1 - t0 < best_f) best_f = t1 - t0;
            if (t2 - t1 < best_b) best_b = t2 - t1;
        }
        printf("lora%s T=%d n_in=%d n_out=%d r=%d p=0.05: forward %.2f ms (%.1f GFLOP/s), backward %.2f ms (%.1f "
               "GFLOP/s)\n",
               ti ? " amx" : "", T, K, N, R, best_f * 1e3, lf / best_f * 1e-9, best_b * 1e3, 2 * lf / best_b * 1e-9);
    }
    if (amx) { /* the backward by lines (train/graph's on the tiles), the mask regenerated from its key or read
                  from the bits the forward kept (nn/lora.h mask_out, mask_in), alternated rep by rep */
        nl_lora L = {K, N, R, 2.0f, 0.05f, nl_lora_dropout_key(1, 2, 3, 4), amx, 0, NULL, NULL};
        uint16_t *bits = malloc(sizeof(uint16_t) * (size_t)T * nl_lora_mask_halves(K));
        float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(&L, T) + 1));
        double bf[2] = {1e30, 1e30}, bb[2] = {1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int v = 0; v < 2; v++) {
                L.mask_out = v ? bits : NULL, L.mask_in = NULL;
                double t0 = nl_now();
                if (nl_lora_forward_rows(&L, A, B, y, u, x, 0, NULL, 1, 0, T)) return 1;
                double t1 = nl_now();
                L.mask_out = NULL, L.mask_in = v ? bits : NULL;
                if (nl_lora_backward_du(&L, A, B, dy, x, u, T, 0, NULL, scr, 0, T) ||
                    nl_lora_backward_lines(&L, A, dx, 1, dA, dB, dy, x, T, 0, NULL, scr, 0, K + N))
                    return 1;
                double t2 = nl_now();
                if (t1 - t0 < bf[v]) bf[v] = t1 - t0;
                if (t2 - t1 < bb[v]) bb[v] = t2 - t1;
            }
        printf("lora amx by lines T=%d n_in=%d n_out=%d r=%d p=0.05: forward %.2f ms, kept bits %.2f ms; backward "
               "%.2f ms, from the kept bits %.2f ms\n",
               T, K, N, R, bf[0] * 1e3, bf[1] * 1e3, bb[0] * 1e3, bb[1] * 1e3);
        free(bits), free(scr);
    }
    if (lora_step(reps, &s)) return 1;
    /* gemm shapes: {M, N, K, transposed A} */
    static const int gs[][4] = {{32, 512, 128, 0}, {64, 128, 512, 0}, {512, 128, 64, 1}, {32, 16, 2048, 0},
                                {32, 2048, 16, 0}, {2048, 16, 32, 1}, {16, 2048, 32, 1}};
    float *ga = malloc(4u << 20), *gb = malloc(4u << 20), *gc = calloc(1u << 20, 4);
    fill(ga, 1u << 20, &s), fill(gb, 1u << 20, &s);
    for (int i = 0; i < (int)(sizeof gs / sizeof gs[0]); i++) {
        const int M = gs[i][0], N = gs[i][1], Kk = gs[i][2], tn = gs[i][3];
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = nl_now();
            for (int it = 0; it < 20; it++) {
                if (tn) nl_gemm_tn(gc, N, ga, M, gb, N, M, N, Kk, 1);
                else nl_gemm(gc, N, ga, Kk, gb, N, M, N, Kk, 1);
            }
            double t = (nl_now() - t0) / 20;
            if (t < best) best = t;
        }
        printf("gemm%s M=%d N=%d K=%d: %.1f us (%.1f GFLOP/s)\n", tn ? "_tn" : "   ", M, N, Kk, best * 1e6,
               2.0 * M * N * Kk / best * 1e-9);
    }
    printf("(checksum %g)\n", (double)o[123] + dq[77] + dk[5] + dv[9] + y[3] + dx[4] + dA[5] + dB[6]);
    return 0;
}

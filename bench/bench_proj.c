/* bench_proj: the host backend's GFLOP/s on qwen3-0.6b projection shapes, FWD and BWD, Q8_0 and
 * F16 weights, f32 and bf16 compute, against OpenBLAS SGEMM on dequantized FP32 copies of the
 * same weights (when built with NL_HAVE_OPENBLAS). Not a test.
 *
 *   bench_proj [-t threads (2)] [-T tokens (64 and 512)] [-r reps (best of, 3)] [-c 1] [-s shape]
 *              [-k kernels (auto | scalar | avx2 | avx512 | neon)]
 *
 * -c 1 times with the process CPU clock divided by the thread count instead of the wall clock:
 * steadier on a shared machine (other tenants' time slices are not counted), meaningful with
 * -t 1 (OpenBLAS threads spin-wait, which the CPU clock would count).
 *
 * FLOPs of one projection = 2·T·N·K. Times are the best of `reps` runs after one warm-up. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/quant.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "util/util.h"

#ifdef NL_HAVE_OPENBLAS
/* The two cblas entry points used (declared here so no cblas.h is needed). */
enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
#endif

typedef struct {
    const char *name;
    int K, N;
} shape;

static const shape shapes[] = {
    {"q", 1024, 2048},    {"k/v", 1024, 1024},    {"o", 2048, 1024}, {"gate/up", 1024, 3072},
    {"down", 3072, 1024}, {"head", 1024, 151936}, /* only with -s head (its FP32 copy for SGEMM is 622 MB) */
};
#define NSHAPES 5

static uint64_t rng = 0x1234567887654321ULL;
static float frand(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((double)((rng * 0x2545F4914F6CDD1DULL) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static uint16_t f16_of(float f) { /* small positive/negative normals only: truncating is fine */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = (u >> 13) & 0x3ff;
    if (e < 113) return (uint16_t)s;
    return (uint16_t)(s | ((e - 112) << 10) | m);
}

static void *make_weight(int type, int N, int K) {
    if (type == NL_TYPE_F16) {
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)N * K);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = f16_of(frand() * 0.05f);
        return w;
    }
    nl_block_q8_0 *w = malloc(sizeof(nl_block_q8_0) * (size_t)N * K / 32);
    for (size_t b = 0; b < (size_t)N * K / 32; b++) {
        w[b].d = f16_of(0.0004f + 0.0002f * frand());
        for (int j = 0; j < 32; j++) w[b].qs[j] = (int8_t)(int)(frand() * 127);
    }
    return w;
}

typedef struct {
    double t_host, t_blas, flops;
} acc;

static int use_cpu_clock, n_threads = 2;
static double now(void) {
    if (!use_cpu_clock) return nl_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / n_threads;
}

int main(int argc, char **argv) {
    const char *kernels = "auto";
    int reps = 3, Ts[2] = {64, 512}, nT = 2;
    const char *only = NULL; /* -s NAME: that shape alone (q, k/v, o, gate/up, down, head) */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t")) n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-k")) kernels = argv[i + 1];
        else if (!strcmp(argv[i], "-c")) use_cpu_clock = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-T")) {
            Ts[0] = atoi(argv[i + 1]);
            nT = 1;
        } else if (!strcmp(argv[i], "-s")) only = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [-t threads] [-T tokens] [-r reps] [-c 0|1] [-k kernels] [-s shape|head]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n_threads < 1 || reps < 1 || Ts[0] < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
#ifdef NL_HAVE_OPENBLAS
    openblas_set_num_threads(n_threads);
#endif
    const char *modes[2] = {"f32", "bf16"};
    const int nmodes =
        nl_proj_host_cpu_has("avx512bf16") && (!strcmp(kernels, "auto") || !strcmp(kernels, "avx512")) ? 2 : 1;
    void *ctx[2] = {NULL, NULL};
    for (int m = 0; m < nmodes; m++) {
        if (nl_proj_backend_host.init(&ctx[m], n_threads, NULL) || nl_proj_host_configure(ctx[m], kernels, modes[m])) {
            fprintf(stderr, "host init: %s\n", nl_last_error());
            return 1;
        }
    }
    printf("host kernels %s, %d threads, best of %d, %s clock%s\n", nl_proj_host_kernels(ctx[0]), n_threads, reps,
           use_cpu_clock ? "CPU" : "wall",
#ifdef NL_HAVE_OPENBLAS
           ", vs OpenBLAS SGEMM on FP32 copies"
#else
           " (no OpenBLAS: no SGEMM column)"
#endif
    );
    printf("%-8s %5s %-5s %-4s %-3s %9s %8s %9s %8s %6s\n", "proj", "T", "type", "mode", "dir", "host ms", "GFLOP/s",
           "sgemm ms", "GFLOP/s", "ratio");
    /* totals[T][type][mode][dir] */
    acc tot[2][2][2][2];
    memset(tot, 0, sizeof tot);
    for (int ti = 0; ti < nT; ti++) {
        const int T = Ts[ti];
        for (int s = 0; s < NSHAPES + 1; s++) {
            if (only ? strcmp(only, shapes[s].name) != 0 : s >= NSHAPES) continue;
            const int K = shapes[s].K, N = shapes[s].N;
            const int big = K > N ? K : N;
            float *x = malloc(sizeof(float) * (size_t)T * big), *y = malloc(sizeof(float) * (size_t)T * big);
            float *wf = malloc(sizeof(float) * (size_t)N * K);
            for (size_t i = 0; i < (size_t)T * big; i++) x[i] = frand();
            for (int ty = 0; ty < 2; ty++) {
                const int type = ty ? NL_TYPE_F16 : NL_TYPE_Q8_0;
                void *w = make_weight(type, N, K);
                const size_t rb = type == NL_TYPE_F16 ? (size_t)K * 2 : (size_t)K / 32 * 34;
                for (int n = 0; n < N; n++)
                    nl_host_dequant(&nl_host_kernels_scalar, type, (const uint8_t *)w + rb * n, 0, K,
                                    wf + (size_t)n * K);
                nl_proj_weight pw = {.name = shapes[s].name, .type = type, .n_in = K, .n_out = N, .data = w};
                const double flops = 2.0 * T * N * K;
                for (int d = 0; d < 2; d++) {
                    /* host first: OpenBLAS threads keep spinning for a while after a call */
                    double th_m[2] = {0, 0};
                    for (int m = 0; m < nmodes; m++) {
                        double th = 1e30;
                        for (int r = 0; r <= reps; r++) {
                            double t0 = now();
                            if (nl_proj_backend_host.run(ctx[m], &pw, (nl_dir)d, x, T, y)) {
                                fprintf(stderr, "run: %s\n", nl_last_error());
                                return 1;
                            }
                            double dt = now() - t0;
                            if (r > 0 && dt < th) th = dt;
                        }
                        th_m[m] = th;
                    }
                    double tb = 0;
#ifdef NL_HAVE_OPENBLAS
                    tb = 1e30;
                    for (int r = 0; r <= reps; r++) {
                        double t0 = now();
                        if (d == 0)
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, x, K, wf, K, 0.0f, y,
                                        N);
                        else
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, K, N, 1.0f, x, N, wf, K, 0.0f, y,
                                        K);
                        double dt = now() - t0;
                        if (r > 0 && dt < tb) tb = dt;
                    }
                    usleep(20000); /* let OpenBLAS's spinning threads go to sleep */
#endif
                    for (int m = 0; m < nmodes; m++) {
                        const double th = th_m[m];
                        acc *a = &tot[ti][ty][m][d];
                        a->t_host += th;
                        a->t_blas += tb;
                        a->flops += flops;
                        printf("%-8s %5d %-5s %-4s %-3s %9.3f %8.1f", shapes[s].name, T, ty ? "f16" : "q8_0",
                               nl_proj_host_compute(ctx[m]), d ? "bwd" : "fwd", th * 1e3, flops / th * 1e-9);
                        if (tb > 0) printf(" %9.3f %8.1f %6.2f\n", tb * 1e3, flops / tb * 1e-9, tb / th);
                        else printf("\n");
                    }
                }
                free(w);
            }
            free(x);
            free(y);
            free(wf);
        }
    }
    printf("\nall shapes together (GFLOP/s = total FLOPs / total time; ratio = host / SGEMM):\n");
    printf("%5s %-5s %-4s %-3s %8s %8s %6s\n", "T", "type", "mode", "dir", "host", "sgemm", "ratio");
    for (int ti = 0; ti < nT; ti++)
        for (int ty = 0; ty < 2; ty++)
            for (int m = 0; m < nmodes; m++)
                for (int d = 0; d < 2; d++) {
                    acc *a = &tot[ti][ty][m][d];
                    const char *mode = (m == 1 && ty == 0) ? "bf16" : m == 1 ? "bf16*" : "f32";
                    printf("%5d %-5s %-5s %-3s %8.1f", Ts[ti], ty ? "f16" : "q8_0", mode, d ? "bwd" : "fwd",
                           a->flops / a->t_host * 1e-9);
                    if (a->t_blas > 0) printf(" %8.1f %6.2f\n", a->flops / a->t_blas * 1e-9, a->t_blas / a->t_host);
                    else printf("\n");
                }
    if (nmodes == 2) printf("(bf16* = F16 weights always run the f32 path)\n");
    for (int m = 0; m < nmodes; m++) nl_proj_backend_host.free(ctx[m]);
    return 0;
}

/* test_int8: the int8 compute mode (kernels.h "the int8 FWD rows", proj/host_int8.c).
 *  - the rows: "auto" is the CPU's best (aarch64: I8MM, then DotProd, from HWCAP/HWCAP2); every
 *    int8 row this CPU runs against the scalar model, bit for bit, random data, odd row counts
 *    (1..7, 13, 23, 27), odd column counts, group sizes 32 and 16, storing and accumulating; the
 *    best row's pack_b (the VNNI layout and BC) against the scalar pack, its quant_row against
 *    the scalar quantization (random, constant, zero, tied and non-finite rows), byte for byte,
 *    its pack_q8_0 against the tile's way (random Q8_0 bytes: every FP16 class of d);
 *  - the host backend with --compute int8, every integer type (Q8_0, Q4_0, Q5_0, Q4_1, Q4_K,
 *    Q6_K), odd T and N: the scalar kernel set and the best one bit for bit; 1/2/3 threads bit for
 *    bit; T=1 rows equal to the same rows of a larger T; against the product of the llama.cpp-way
 *    quantized activations (written here from its definitions) with the dequantized weights,
 *    in double, within 1e-4 relative Frobenius; against the FP32 product within the planner's
 *    int8 bound (3e-2); BWD the float path's bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "model/model.h"
#include "model/quant.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "test.h"
#include "util/util.h"

/* the row "auto" gives: the first of i8.c's list this CPU has (aarch64: HWCAP2_I8MM, then
 * HWCAP_ASIMDDP; qemu -cpu max has both, -cpu cortex-a76 dotprod alone, cortex-a53 neither) */
static void row_choice(void) {
    const nl_i8_kernels *best = nl_cpu_i8_kernels(NULL);
    printf("int8 row in use: %s\n", best->name);
    const char *want = "scalar";
#if defined(__aarch64__)
    want = nl_cpu_has(NL_CPU_ARM_I8MM) ? "i8mm" : nl_cpu_has(NL_CPU_ARM_DOTPROD) ? "dotprod" : "scalar";
#elif defined(__x86_64__)
    if (nl_cpu_i8_kernels("avx512vnni")) want = "avx512vnni";
#endif
    CHECKF(strcmp(best->name, want) == 0, "auto int8 row %s, the CPU's best %s", best->name, want);
    CHECK(nl_cpu_i8_kernels("scalar") == &nl_i8_kernels_scalar);
}

static void rows_vs_scalar(const nl_i8_kernels *best) {
    printf("int8 row %s against the scalar model\n", best->name);
    const int NP = NL_HOST_NP;
    for (int gi = 0; gi < 2; gi++) {
        const int gs = gi ? 16 : 32, kc = gi ? 256 : 160;
        const int ng = kc / gs;
        const int ms[] = {1, 5, 6, 7, 13, 2, 3, 4, 23, 27};
        const int ncs[] = {64, 37, 5, 16, 33, 9, 1, 63, 64, 48};
        for (int mi = 0; mi < 10; mi++) {
            const int m = ms[mi], nc = ncs[mi], lda = kc + 7, ldd = ng + 3, ldc = 70;
            uint8_t *A = malloc((size_t)m * lda);
            float *DX = malloc(sizeof(float) * m * ldd), *SX = malloc(sizeof(float) * m * ldd);
            uint32_t *B = calloc((size_t)kc / 4 * NP, 4);
            int32_t *BC = calloc((size_t)ng * NP, 4);
            float *SW = calloc((size_t)ng * NP, 4), *MW = calloc((size_t)ng * NP, 4);
            float *c0 = malloc(sizeof(float) * m * ldc), *c1 = malloc(sizeof(float) * m * ldc);
            for (int i = 0; i < m * lda; i++) A[i] = (uint8_t)((nl_t_rand() + 1) * 128);
            for (int i = 0; i < m * ldd; i++) DX[i] = (float)(nl_t_rand() * 0.01), SX[i] = (float)nl_t_rand();
            for (int r = 0; r < kc / 4; r++)
                for (int j = 0; j < nc; j++) B[r * NP + j] = (uint32_t)((nl_t_rand() + 1) * 2147483648.0);
            for (int g = 0; g < ng; g++)
                for (int j = 0; j < nc; j++) {
                    int s = 0;
                    for (int r = g * gs / 4; r < (g + 1) * gs / 4; r++)
                        for (int b = 0; b < 4; b++) s += (int8_t)(uint8_t)(B[r * NP + j] >> (8 * b));
                    BC[g * NP + j] = -128 * s;
                    SW[g * NP + j] = (float)(nl_t_rand() * 0.02);
                    MW[g * NP + j] = (float)(nl_t_rand() * 0.1);
                }
            for (int acc = 0; acc < 2; acc++)
                for (int mn = 0; mn < 2; mn++) {
                    for (int i = 0; i < m * ldc; i++) c0[i] = c1[i] = (float)nl_t_rand();
                    nl_i8_kernels_scalar.gemm_i8_fwd(m, kc, gs, A, lda, DX, mn ? SX : NULL, ldd, B, BC, SW,
                                                     mn ? MW : NULL, c0, ldc, nc, acc);
                    best->gemm_i8_fwd(m, kc, gs, A, lda, DX, mn ? SX : NULL, ldd, B, BC, SW, mn ? MW : NULL, c1, ldc,
                                      nc, acc);
                    CHECKF(memcmp(c0, c1, sizeof(float) * m * ldc) == 0,
                           "%s vs scalar: gs %d m %d ncols %d acc %d min %d", best->name, gs, m, nc, acc, mn);
                }
            free(A), free(DX), free(SX), free(B), free(BC), free(SW), free(MW), free(c0), free(c1);
        }
    }
}

/* pack_b of the best row against the scalar one: kc 256, 160 and 32 (a partial 16-row block),
 * group sizes 32 and 16, B and BC bit for bit */
static void pack_vs_scalar(void) {
    const nl_i8_kernels *best = nl_cpu_i8_kernels(NULL);
    if (!best->pack_b) return;
    const int NP = NL_HOST_NP, ldt = NL_HOST_KC;
    int8_t *tile = malloc((size_t)NP * ldt);
    uint32_t *b0 = malloc((size_t)ldt / 4 * NP * 4), *b1 = malloc((size_t)ldt / 4 * NP * 4);
    int32_t *c0 = malloc((size_t)ldt / 16 * NP * 4), *c1 = malloc((size_t)ldt / 16 * NP * 4);
    for (int i = 0; i < NP * ldt; i++) tile[i] = (int8_t)(int)(nl_t_rand() * 127.5);
    for (int i = 0; i < 40; i++) tile[(i * 97) % (NP * ldt)] = -128;
    const int kcs[] = {256, 160, 32};
    for (int ki = 0; ki < 3; ki++)
        for (int gs = 16; gs <= 32; gs += 16) {
            const int kc = kcs[ki];
            memset(b0, 0xa5, (size_t)ldt / 4 * NP * 4), memset(b1, 0xa5, (size_t)ldt / 4 * NP * 4);
            memset(c0, 0x5a, (size_t)ldt / 16 * NP * 4), memset(c1, 0x5a, (size_t)ldt / 16 * NP * 4);
            nl_i8_pack_b_scalar(tile, ldt, kc, gs, b0, c0);
            best->pack_b(tile, ldt, kc, gs, b1, c1);
            CHECKF(memcmp(b0, b1, (size_t)kc / 4 * NP * 4) == 0 && memcmp(c0, c1, (size_t)kc / gs * NP * 4) == 0,
                   "%s pack_b vs scalar: kc %d gs %d", best->name, kc, gs);
        }
    free(tile), free(b0), free(b1), free(c0), free(c1);
}

/* quant_row of every row against the scalar form: Q8_0, Q8_1, Q8_K (gs 32, 16), K up to 17
 * 32-blocks (a partial 16-block chunk) or 3 256-blocks, with sx and without; rows of random
 * values, of one value, all-zero blocks, ±0, ties of |x|, and ±inf/NaN; bytes and bits equal */
static void quant_vs_scalar(const nl_i8_kernels *best) {
    if (!best->quant_row) return;
    printf("int8 row %s quant_row against the scalar form\n", best->name);
    const int Ks[] = {32, 96, 512, 544, 256, 768};
    for (int ki = 0; ki < 6; ki++)
        for (int act = NL_I8_Q8_0; act <= NL_I8_Q8_K; act++)
            for (int gs = 32; gs >= 16; gs -= 16)
                for (int kind = 0; kind < 6; kind++) {
                    const int K = Ks[ki];
                    if ((act == NL_I8_Q8_K) != (K % 256 == 0) || (act != NL_I8_Q8_K && gs == 16)) continue;
                    float *x = malloc(sizeof(float) * K), *d[2], *sx[2];
                    uint8_t *q[2];
                    for (int v = 0; v < 2; v++) {
                        d[v] = malloc(sizeof(float) * (K / 16)), sx[v] = malloc(sizeof(float) * (K / 16));
                        q[v] = malloc((size_t)K);
                        memset(d[v], 0x5a, sizeof(float) * (K / 16)), memset(sx[v], 0x5a, sizeof(float) * (K / 16));
                    }
                    for (int i = 0; i < K; i++) x[i] = (float)(nl_t_rand() * (1 + (i % 29 == 0) * 30));
                    if (kind == 1)
                        for (int i = 0; i < K; i++) x[i] = 0.37f;
                    if (kind == 2) memset(x, 0, sizeof(float) * (K > 256 ? 256 : 32)); /* a zero block */
                    if (kind == 3)
                        for (int i = 0; i < K; i += 5) x[i] = i % 2 ? -0.0f : 0.0f;
                    if (kind == 4) x[7] = 3.0f, x[9] = -3.0f, x[K - 1] = 3.0f, x[K - 2] = -3.0f; /* ties */
                    if (kind == 5) x[3] = (float)INFINITY, x[K / 2] = NAN, x[K - 3] = -(float)INFINITY;
                    for (int wsx = 0; wsx < 2; wsx++) {
                        nl_i8_quant_row_scalar(act, gs, x, K, q[0], d[0], wsx ? sx[0] : NULL);
                        best->quant_row(act, gs, x, K, q[1], d[1], wsx ? sx[1] : NULL);
                        const int g = act == NL_I8_Q8_K ? gs : 32;
                        CHECKF(memcmp(q[0], q[1], (size_t)K) == 0 && memcmp(d[0], d[1], sizeof(float) * (K / g)) == 0 &&
                                   memcmp(sx[0], sx[1], sizeof(float) * (K / g)) == 0,
                               "%s quant_row vs scalar: act %d gs %d K %d kind %d sx %d", best->name, act, gs, K, kind,
                               wsx);
                    }
                    free(x);
                    for (int v = 0; v < 2; v++) free(d[v]), free(sx[v]), free(q[v]);
                }
}

/* pack_q8_0 of the best row against the tile's way (the rows' q bytes in a tile, the scalar
 * pack, SW = nl_f16_to_f32(d)): random bytes, so d takes every FP16 class (subnormal, inf,
 * NaN with its payload); kc 256, 160, 32; ncols 64, 37, 16, 5; B, BC and SW bit for bit */
static void pack_q8_0_vs_tile(const nl_i8_kernels *best) {
    if (!best->pack_q8_0) return;
    printf("int8 row %s pack_q8_0 against the tile's way\n", best->name);
    const int NP = NL_HOST_NP, nb = 12;
    const size_t rb = 34 * nb;
    uint8_t *W = malloc(rb * NP);
    int8_t *tile = malloc((size_t)NP * 256);
    uint32_t *b0 = malloc(64 * NP * 4), *b1 = malloc(64 * NP * 4);
    int32_t *c0 = malloc(8 * NP * 4), *c1 = malloc(8 * NP * 4);
    float *s0 = malloc(8 * NP * 4), *s1 = malloc(8 * NP * 4);
    for (size_t i = 0; i < rb * NP; i++) W[i] = (uint8_t)(int)((nl_t_rand() + 1) * 127.99);
    const int kcs[] = {256, 160, 32}, ncs[] = {64, 37, 16, 5};
    for (int ki = 0; ki < 3; ki++)
        for (int ni = 0; ni < 4; ni++) {
            const int kc = kcs[ki], nc = ncs[ni], bs = 3;
            memset(tile, 0, (size_t)NP * 256);
            for (int j = 0; j < NP; j++)
                for (int g = 0; g < kc / 32; g++) {
                    uint16_t h;
                    memcpy(&h, W + rb * j + 34 * (bs + g), 2);
                    s0[g * NP + j] = j < nc ? nl_f16_to_f32(h) : 0.0f;
                    if (j < nc) memcpy(tile + 256 * j + 32 * g, W + rb * j + 34 * (bs + g) + 2, 32);
                }
            nl_i8_pack_b_scalar(tile, 256, kc, 32, b0, c0);
            memset(b1, 0xa5, 64 * NP * 4), memset(c1, 0x5a, 8 * NP * 4), memset(s1, 0x5a, 8 * NP * 4);
            best->pack_q8_0(W, rb, bs, kc, nc, b1, c1, s1);
            CHECKF(memcmp(b0, b1, (size_t)kc / 4 * NP * 4) == 0 && memcmp(c0, c1, (size_t)kc / 32 * NP * 4) == 0 &&
                       memcmp(s0, s1, (size_t)kc / 32 * NP * 4) == 0,
                   "%s pack_q8_0 vs the tile: kc %d ncols %d", best->name, kc, nc);
        }
    free(W), free(tile), free(b0), free(b1), free(c0), free(c1), free(s0), free(s1);
}

/* ---- the llama.cpp-way activations, written from its definitions (independent of host_int8.c) */
static float h16(float v) { return nl_f16_to_f32(nl_f32_to_f16(v)); }

/* x̂ = the dequantized quantized activations of one row; for Q4_1 also the per-block s */
static void ref_quant(int type, const float *x, int K, double *xh, double *s) {
    if (type == NL_TYPE_Q4_K || type == NL_TYPE_Q6_K) {
        for (int b = 0; b < K / 256; b++) {
            float amax = 0, max = 0;
            for (int i = 0; i < 256; i++)
                if (fabsf(x[256 * b + i]) > amax) amax = fabsf(x[256 * b + i]), max = x[256 * b + i];
            const float is = amax ? -127.0f / max : 0, d = amax ? 1.0f / is : 0;
            for (int i = 0; i < 256; i++) {
                float q = amax ? rintf(is * x[256 * b + i]) : 0;
                if (q > 127) q = 127;
                xh[256 * b + i] = (double)q * d;
            }
        }
        return;
    }
    for (int b = 0; b < K / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float d = amax / 127.0f, id = amax ? 127.0f / amax : 0;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const float q = rintf(x[32 * b + i] * id);
            sum += (int)q;
            xh[32 * b + i] = (double)q * h16(d);
        }
        if (s) s[b] = h16(d * (float)sum);
    }
}

static void *new_ctx(int nth, const char *kernels, const char *compute) {
    void *ctx = NULL;
    if (nl_proj_backend_host.init(&ctx, nth, NULL) != 0) return NULL;
    if (nl_proj_host_configure(ctx, kernels, compute) != 0) {
        nl_proj_backend_host.free(ctx);
        return NULL;
    }
    return ctx;
}

static void host_type(int type, int N, int K, int T) {
    const size_t rb = nl_row_bytes(type, K);
    uint8_t *w = malloc(rb * (size_t)N);
    float *wd = malloc(sizeof(float) * (size_t)N * K), *x = malloc(sizeof(float) * (size_t)T * K);
    float *y[4];
    for (int i = 0; i < 4; i++) y[i] = malloc(sizeof(float) * (size_t)T * N);
    nl_t_rand_weight(type, N, K, w);
    for (int n = 0; n < N; n++) nl_type_get(type)->to_float(w + rb * n, wd + (size_t)n * K, K);
    for (int i = 0; i < T * K; i++) x[i] = (float)(nl_t_rand() * (1 + (i % 37 == 0) * 4));
    if (T > 2) memset(x + K, 0, sizeof(float) * K); /* an all-zero row: d = 0 */
    nl_proj_weight pw = {.name = "w", .type = type, .n_in = K, .n_out = N, .data = w, .cls = NL_CLASS_ATTN};
    const char *const kset[] = {"scalar", "auto", "auto", "auto"};
    const int nths[] = {1, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        void *ctx = new_ctx(nths[i], kset[i], "int8");
        CHECK(ctx != NULL);
        if (!ctx) continue;
        CHECK(strcmp(nl_proj_host_compute(ctx), "int8") == 0);
        CHECK(nl_proj_backend_host.run(ctx, &pw, NL_FWD, x, T, y[i]) == 0);
        if (i == 3) { /* a row alone equals that row of the request */
            float *y1 = malloc(sizeof(float) * N);
            CHECK(nl_proj_backend_host.run(ctx, &pw, NL_FWD, x + (size_t)(T - 1) * K, 1, y1) == 0);
            CHECKF(memcmp(y1, y[i] + (size_t)(T - 1) * N, sizeof(float) * N) == 0, "%s: T=1 row differs",
                   nl_type_name(type));
            free(y1);
        }
        nl_proj_backend_host.free(ctx);
    }
    for (int i = 1; i < 4; i++)
        CHECKF(memcmp(y[0], y[i], sizeof(float) * (size_t)T * N) == 0,
               "%s %dx%d T=%d: run %d differs from the scalar run", nl_type_name(type), N, K, T, i);
    /* the llama.cpp-way product in double, and the FP32 one */
    double *xh = malloc(sizeof(double) * K), *s = malloc(sizeof(double) * (K / 32));
    double e2 = 0, r2 = 0, f2 = 0;
    for (int t = 0; t < T; t++) {
        ref_quant(type, x + (size_t)t * K, K, xh, type == NL_TYPE_Q4_1 ? s : NULL);
        for (int n = 0; n < N; n++) {
            const float *wr = wd + (size_t)n * K;
            double ref = 0, full = 0;
            if (type == NL_TYPE_Q4_1) {
                /* Σ_b d_w·(Σ q_w·x̂) + m_w·s: the block min meets s, not Σx̂ */
                for (int b = 0; b < K / 32; b++) {
                    uint16_t mh;
                    memcpy(&mh, w + rb * n + 20 * b + 2, 2);
                    const double m = nl_f16_to_f32(mh);
                    double a = 0;
                    for (int i = 32 * b; i < 32 * b + 32; i++) a += xh[i] * ((double)wr[i] - m);
                    ref += a + m * s[b];
                }
            } else {
                for (int i = 0; i < K; i++) ref += xh[i] * wr[i];
            }
            for (int i = 0; i < K; i++) full += (double)x[(size_t)t * K + i] * wr[i];
            const double v = y[0][(size_t)t * N + n];
            e2 += (v - ref) * (v - ref);
            r2 += ref * ref;
            f2 += (v - full) * (v - full);
        }
    }
    double r2f = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double full = 0;
            for (int i = 0; i < K; i++) full += (double)x[(size_t)t * K + i] * wd[(size_t)n * K + i];
            r2f += full * full;
        }
    const double el = sqrt(e2 / r2), ef = sqrt(f2 / r2f);
    printf("%-5s %3dx%-4d T=%-3d vs llama.cpp-way %.2e, vs fp32 %.2e\n", nl_type_name(type), N, K, T, el, ef);
    CHECKF(el < 1e-4, "%s: %.3e from the llama.cpp-way product", nl_type_name(type), el);
    CHECKF(ef < 3e-2, "%s: %.3e from the FP32 product", nl_type_name(type), ef);
    /* BWD: the float path (bf16 where the CPU has it: AVX512_BF16 or Arm BF16; else f32), bit for bit */
    void *ci = new_ctx(2, "auto", "int8");
    void *cf =
        new_ctx(2, "auto", nl_proj_host_cpu_has("avx512bf16") || nl_proj_host_cpu_has("neonbf16") ? "bf16" : "f32");
    if (ci && cf) {
        float *gi = malloc(sizeof(float) * (size_t)T * K), *gf = malloc(sizeof(float) * (size_t)T * K);
        float *dy = malloc(sizeof(float) * (size_t)T * N);
        for (int i = 0; i < T * N; i++) dy[i] = (float)nl_t_rand();
        CHECK(nl_proj_backend_host.run(ci, &pw, NL_BWD, dy, T, gi) == 0);
        CHECK(nl_proj_backend_host.run(cf, &pw, NL_BWD, dy, T, gf) == 0);
        CHECKF(memcmp(gi, gf, sizeof(float) * (size_t)T * K) == 0, "%s: int8 BWD differs from the float path",
               nl_type_name(type));
        free(gi), free(gf), free(dy);
    }
    if (ci) nl_proj_backend_host.free(ci);
    if (cf) nl_proj_backend_host.free(cf);
    free(xh), free(s), free(w), free(wd), free(x);
    for (int i = 0; i < 4; i++) free(y[i]);
}

int main(void) {
    row_choice();
    /* every row this CPU runs (aarch64 -cpu max: i8mm and dotprod) */
    const char *const rows[] = {"avx512vnni", "i8mm", "dotprod"};
    for (int i = 0; i < 3; i++)
        if (nl_cpu_i8_kernels(rows[i])) rows_vs_scalar(nl_cpu_i8_kernels(rows[i]));
    pack_vs_scalar();
    quant_vs_scalar(nl_cpu_i8_kernels(NULL));
    pack_q8_0_vs_tile(nl_cpu_i8_kernels(NULL));
    const int types[] = {NL_TYPE_Q8_0, NL_TYPE_Q4_0, NL_TYPE_Q5_0, NL_TYPE_Q4_1, NL_TYPE_Q4_K, NL_TYPE_Q6_K};
    for (int i = 0; i < 6; i++) {
        const int kq = types[i] == NL_TYPE_Q4_K || types[i] == NL_TYPE_Q6_K;
        host_type(types[i], 77, kq ? 768 : 352, 13);
        host_type(types[i], 130, kq ? 256 : 96, 7);
    }
    /* the mode's name is the service's */
    CHECK(nl_proj_compute_known("int8") == 0);
    CHECK(nl_proj_compute_known("int4") != 0);
    return nl_t_done();
}

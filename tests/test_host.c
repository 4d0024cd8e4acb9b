/* test_host: the `host` projection backend against a float64 reference built from the
 * dequantized weights, for every kernel set this CPU runs (scalar, avx2, avx512 / neon) and both
 * compute modes (f32, bf16), FWD and BWD, odd shapes, F16/Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q6_K weights;
 * one-hot bit-identity in both directions (in bf16 compute the dequantized weight rounded to BF16,
 * the same effective weight FWD and BWD: kernels.h);
 * 1/2/4 threads bit-identical; results independent of T.
 *
 * Error bound per output element: |y - ref| <= tol · Σ|x·w| (the sum of the absolute products
 * of that dot product), tol = 2e-6·(1 + log2 of the length) for f32 compute (FP32 rounding of
 * a summation chain), 1e-2 for bf16 (activations rounded to BF16: up to 2⁻⁸ relative per product). */
#include <stdint.h>
#include <string.h>

#include "model/model.h"
#include "model/quant.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "test.h"
#include "util/util.h"

/* ---- independent decoders (fp32 results, in the order formats.md gives) ---- */

static float t_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(s ? -v : v);
}

static size_t t_row_bytes(int type, int K) { return nl_row_bytes(type, K); }

static void t_dequant_row(int type, const uint8_t *row, int K, float *out) {
    if (type == NL_TYPE_F16) {
        for (int k = 0; k < K; k++) {
            uint16_t h;
            memcpy(&h, row + 2 * k, 2);
            out[k] = t_f16(h);
        }
    } else if (type == NL_TYPE_Q8_0) {
        for (int b = 0; b < K / 32; b++) {
            uint16_t h;
            memcpy(&h, row + 34 * b, 2);
            float d = t_f16(h);
            for (int j = 0; j < 32; j++) out[32 * b + j] = (float)(int8_t)row[34 * b + 2 + j] * d;
        }
    } else if (type == NL_TYPE_Q4_0) {
        for (int b = 0; b < K / 32; b++) {
            uint16_t h;
            memcpy(&h, row + 18 * b, 2);
            float d = t_f16(h);
            for (int j = 0; j < 16; j++) {
                out[32 * b + j] = (float)((row[18 * b + 2 + j] & 15) - 8) * d;
                out[32 * b + j + 16] = (float)((row[18 * b + 2 + j] >> 4) - 8) * d;
            }
        }
    } else if (type == NL_TYPE_Q4_1) {
        for (int b = 0; b < K / 32; b++) {
            uint16_t h;
            memcpy(&h, row + 20 * b, 2);
            float d = t_f16(h);
            memcpy(&h, row + 20 * b + 2, 2);
            float mn = t_f16(h);
            for (int j = 0; j < 16; j++) {
                out[32 * b + j] = (float)(row[20 * b + 4 + j] & 15) * d + mn;
                out[32 * b + j + 16] = (float)(row[20 * b + 4 + j] >> 4) * d + mn;
            }
        }
    } else if (type == NL_TYPE_Q5_0) { /* fifth bit of element j: bit j of the little-endian qh */
        for (int b = 0; b < K / 32; b++) {
            const uint8_t *blk = row + 22 * b;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = t_f16(h);
            for (int j = 0; j < 32; j++) {
                int nib = j < 16 ? blk[6 + j] & 15 : blk[6 + j - 16] >> 4;
                int hi = (blk[2 + j / 8] >> (j % 8)) & 1;
                out[32 * b + j] = (float)(nib + 16 * hi - 16) * d;
            }
        }
    } else if (type == NL_TYPE_Q6_K) {
        nl_type_get(type)->to_float(row, out, K); /* no second decoder for Q6_K: model/quant's */
    } else {
        for (int b = 0; b < K / 256; b++) {
            const uint8_t *blk = row + 144 * b, *sc = blk + 4, *q = blk + 16;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = t_f16(h);
            memcpy(&h, blk + 2, 2);
            float dmin = t_f16(h);
            float *y = out + 256 * b;
            for (int j = 0; j < 8; j++) {
                int s, m;
                if (j < 4) {
                    s = sc[j] & 63;
                    m = sc[j + 4] & 63;
                } else {
                    s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
                    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                float dd = d * (float)s, mm = dmin * (float)m;
                for (int l = 0; l < 32; l++) {
                    int qv = (j & 1) ? q[32 * (j / 2) + l] >> 4 : q[32 * (j / 2) + l] & 15;
                    y[32 * j + l] = dd * (float)qv - mm;
                }
            }
        }
    }
}

/* The test's decoders agree with model/quant's to_float bit for bit (the ref backend's). */
static void test_decoders(void) {
    static const int types[] = {NL_TYPE_F16, NL_TYPE_Q8_0, NL_TYPE_Q4_0, NL_TYPE_Q4_1, NL_TYPE_Q4_K, NL_TYPE_Q5_0};
    for (int i = 0; i < 6; i++) {
        const int K = 512;
        uint8_t *w = malloc(t_row_bytes(types[i], K));
        float a[512], b[512];
        nl_t_rand_weight(types[i], 1, K, w);
        t_dequant_row(types[i], w, K, a);
        nl_type_get(types[i])->to_float(w, b, K);
        CHECKF(memcmp(a, b, sizeof a) == 0, "type %d: test decoder != quant.c", types[i]);
        /* every kernel set's row decode (its dq_q5_0 / dq_q4_1 where it has them), whole row
         * and a block-aligned middle part, gives quant.c's floats */
        static const char *const sets[] = {"scalar", "avx2", "avx512", "neon"};
        for (int s = 0; s < 4; s++) {
            const nl_host_kernels *ks = nl_cpu_kernels_find(sets[s]);
            if (!ks) continue;
            float c[512];
            nl_host_dequant(ks, types[i], w, 0, K, c);
            CHECKF(memcmp(c, b, sizeof c) == 0, "%s: type %d: nl_host_dequant != quant.c", sets[s], types[i]);
            nl_host_dequant(ks, types[i], w, 64, 96, c);
            CHECKF(memcmp(c, b + 64, 96 * sizeof(float)) == 0, "%s: type %d: nl_host_dequant [64, 160) != quant.c",
                   sets[s], types[i]);
        }
        free(w);
    }
}

/* ---- harness ---- */

typedef struct {
    const char *kernels, *compute;
} mode;

static void *new_ctx(int n_threads, const char *kernels, const char *compute) {
    void *ctx = NULL;
    if (nl_proj_backend_host.init(&ctx, n_threads, NULL) != 0) return NULL;
    if (nl_proj_host_configure(ctx, kernels, compute) != 0) {
        fprintf(stderr, "configure %s/%s: %s\n", kernels, compute, nl_last_error());
        nl_proj_backend_host.free(ctx);
        return NULL;
    }
    return ctx;
}

static double max_err_ratio; /* worst |err| / bound seen, for the log */

/* Run one shape in one mode, compare with the float64 reference. */
static void check_shape(void *ctx, int bf16, int type, int N, int K, int T, nl_dir dir, int cls) {
    uint8_t *w = malloc(t_row_bytes(type, K) * (size_t)N);
    float *wd = malloc(sizeof(float) * (size_t)N * K);
    const int nin = dir == NL_FWD ? K : N, nout = dir == NL_FWD ? N : K;
    float *x = malloc(sizeof(float) * (size_t)T * nin), *y = malloc(sizeof(float) * (size_t)T * nout);
    nl_t_rand_weight(type, N, K, w);
    for (int n = 0; n < N; n++) t_dequant_row(type, w + t_row_bytes(type, K) * n, K, wd + (size_t)n * K);
    for (int i = 0; i < T * nin; i++) x[i] = (float)(nl_t_rand() * 3.0);
    for (int i = 0; i < T * nout; i++) y[i] = NAN; /* must be overwritten */
    nl_proj_weight pw = {.name = "w", .type = type, .cls = cls, .n_in = K, .n_out = N, .data = w};
    CHECK(nl_proj_backend_host.supports(ctx, &pw, dir, T) == 1);
    CHECK(nl_proj_backend_host.run(ctx, &pw, dir, x, T, y) == 0);
    const double tol = bf16 ? 1e-2 : 2e-6 * (1 + log2((double)nin));
    CHECK(nl_proj_host_rel_tol_for(ctx, &pw, nin) == tol);
    if (cls == NL_CLASS_ATTN) CHECK(nl_proj_host_rel_tol(ctx, type, nin) == tol);
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int o = 0; o < nout && bad < 3; o++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < nin; i++) {
                double wv = dir == NL_FWD ? wd[(size_t)o * K + i] : wd[(size_t)i * K + o];
                ref += (double)x[(size_t)t * nin + i] * wv;
                mag += fabs((double)x[(size_t)t * nin + i] * wv);
            }
            double err = fabs((double)y[(size_t)t * nout + o] - ref), bound = tol * mag + 1e-30;
            if (err / bound > max_err_ratio) max_err_ratio = err / bound;
            if (!(err <= bound)) {
                bad++;
                fprintf(stderr, "%s/%s type %d %s N=%d K=%d T=%d: y[%d][%d] = %.9g, ref %.9g, bound %.3g\n",
                        nl_proj_host_kernels(ctx), nl_proj_host_compute(ctx), type, dir == NL_FWD ? "fwd" : "bwd", N, K,
                        T, t, o, y[(size_t)t * nout + o], ref, bound);
            }
        }
    CHECK(bad == 0);
    free(w);
    free(wd);
    free(x);
    free(y);
}

static void test_accuracy(const mode *m) {
    void *ctx = new_ctx(2, m->kernels, m->compute);
    CHECK(ctx != NULL);
    if (!ctx) return;
    const int bf16 = !strcmp(nl_proj_host_compute(ctx), "bf16");
    static const int Ts[] = {1, 3, 17, 64, 65};
    static const int q8[][2] = {{7, 32}, {67, 96}, {131, 544}}; /* N, K */
    static const int f16[][2] = {{1, 1}, {67, 37}, {65, 300}};
    static const int q4k[][2] = {{5, 256}, {67, 512}};
    static const int q5[][2] = {{7, 32}, {67, 96}, {131, 672}}; /* one block; a KC chunk and a part */
    for (int d = 0; d < 2; d++)
        for (int ti = 0; ti < 5; ti++) {
            const int T = Ts[ti];
            for (int s = 0; s < 3; s++) {
                check_shape(ctx, bf16, NL_TYPE_Q8_0, q8[s][0], q8[s][1], T, (nl_dir)d, NL_CLASS_ATTN);
                /* F16: bf16 compute but for the recurrent class (FP32, F16 accuracy) */
                check_shape(ctx, bf16, NL_TYPE_F16, f16[s][0], f16[s][1], T, (nl_dir)d, NL_CLASS_ATTN);
                check_shape(ctx, 0, NL_TYPE_F16, f16[s][0], f16[s][1], T, (nl_dir)d, NL_CLASS_RECURRENT);
            }
            check_shape(ctx, bf16, NL_TYPE_Q4_0, 33, 160, T, (nl_dir)d, NL_CLASS_ATTN);
            check_shape(ctx, bf16, NL_TYPE_Q4_1, 67, 96, T, (nl_dir)d, NL_CLASS_ATTN);
            check_shape(ctx, bf16, NL_TYPE_Q4_1, 130, 576, T, (nl_dir)d, NL_CLASS_ATTN);
            for (int s = 0; s < 2; s++)
                check_shape(ctx, bf16, NL_TYPE_Q4_K, q4k[s][0], q4k[s][1], T, (nl_dir)d, NL_CLASS_ATTN);
            check_shape(ctx, bf16, NL_TYPE_Q6_K, 19, 256, T, (nl_dir)d, NL_CLASS_ATTN);
            for (int s = 0; s < 3; s++)
                check_shape(ctx, bf16, NL_TYPE_Q5_0, q5[s][0], q5[s][1], T, (nl_dir)d, NL_CLASS_ATTN);
        }
    nl_proj_backend_host.free(ctx);
}

static float t_bf16_round(float f) {
    const uint32_t h = (uint32_t)nl_host_f32_to_bf16(f) << 16;
    memcpy(&f, &h, 4);
    return f;
}

/* One-hot rows: FWD of e_k is column k of the effective W, BWD of e_n is row n, bit for bit
 * (compared as floats, so ±0 count as equal), and the two directions see the same effective
 * weights: the dequantized value, rounded to BF16 (nearest even) in bf16 compute for every
 * quantized block type (kernels.h: one dequantizer, both directions). */
static void test_one_hot(const mode *m, int type, int N, int K, int cls) {
    void *ctx = new_ctx(2, m->kernels, m->compute);
    CHECK(ctx != NULL);
    if (!ctx) return;
    const int on_bf16 = !strcmp(nl_proj_host_compute(ctx), "bf16");
    const int bf16 = on_bf16 && type != NL_TYPE_F32 && !(type == NL_TYPE_F16 && cls == NL_CLASS_RECURRENT);
    uint8_t *w = malloc(t_row_bytes(type, K) * (size_t)N);
    float *wd = malloc(sizeof(float) * (size_t)N * K);
    nl_t_rand_weight(type, N, K, w);
    for (int n = 0; n < N; n++) t_dequant_row(type, w + t_row_bytes(type, K) * n, K, wd + (size_t)n * K);
    if (bf16)
        for (size_t i = 0; i < (size_t)N * K; i++) wd[i] = t_bf16_round(wd[i]);
    nl_proj_weight pw = {.name = "w", .type = type, .cls = cls, .n_in = K, .n_out = N, .data = w};
    /* FWD: T = K rows, row t = e_t */
    const size_t M = (size_t)(K > N ? K : N);
    float *x = calloc(M * M, sizeof(float));
    float *yf = malloc(sizeof(float) * (size_t)K * N), *yb = malloc(sizeof(float) * (size_t)N * K);
    for (int t = 0; t < K; t++) x[(size_t)t * K + t] = 1.0f;
    CHECK(nl_proj_backend_host.run(ctx, &pw, NL_FWD, x, K, yf) == 0);
    int bad = 0;
    for (int t = 0; t < K; t++)
        for (int n = 0; n < N; n++) bad += yf[(size_t)t * N + n] != wd[(size_t)n * K + t];
    CHECKF(bad == 0, "%s/%s type %d fwd one-hot: %d mismatches", nl_proj_host_kernels(ctx), nl_proj_host_compute(ctx),
           type, bad);
    /* BWD: T = N rows, row t = e_t */
    memset(x, 0, sizeof(float) * M * M);
    for (int t = 0; t < N; t++) x[(size_t)t * N + t] = 1.0f;
    CHECK(nl_proj_backend_host.run(ctx, &pw, NL_BWD, x, N, yb) == 0);
    bad = 0;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) bad += yb[(size_t)t * K + k] != wd[(size_t)t * K + k];
    CHECKF(bad == 0, "%s/%s type %d bwd one-hot: %d mismatches", nl_proj_host_kernels(ctx), nl_proj_host_compute(ctx),
           type, bad);
    /* FWD's column k of row n and BWD's row n at k: one effective weight */
    bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) bad += yf[(size_t)k * N + n] != yb[(size_t)n * K + k];
    CHECKF(bad == 0, "%s/%s type %d: one-hot FWD and BWD see different weights in %d", nl_proj_host_kernels(ctx),
           nl_proj_host_compute(ctx), type, bad);
    free(w);
    free(wd);
    free(x);
    free(yf);
    free(yb);
    nl_proj_backend_host.free(ctx);
}

/* 1, 2 and 4 threads give the same bits; row t of a T-row run equals a 1-row run of row t. */
static void test_threads(const mode *m, int type, int cls, int N) {
    const int K = type == NL_TYPE_Q4_K ? 512 : type == NL_TYPE_F16 ? 333 : 320, T = 17;
    uint8_t *w = malloc(t_row_bytes(type, K) * (size_t)N);
    nl_t_rand_weight(type, N, K, w);
    nl_proj_weight pw = {.name = "w", .type = type, .cls = cls, .n_in = K, .n_out = N, .data = w};
    float *x = malloc(sizeof(float) * T * (K > N ? K : N));
    for (int i = 0; i < T * (K > N ? K : N); i++) x[i] = (float)nl_t_rand();
    for (int d = 0; d < 2; d++) {
        const int nout = d == NL_FWD ? N : K, nin = d == NL_FWD ? K : N;
        float *y[4];
        static const int nth[4] = {1, 2, 4, 8}; /* 8: fewer panels than threads, rows split */
        for (int i = 0; i < 4; i++) {
            y[i] = malloc(sizeof(float) * T * nout);
            void *ctx = new_ctx(nth[i], m->kernels, m->compute);
            CHECK(ctx != NULL);
            if (ctx) {
                CHECK(nl_proj_backend_host.run(ctx, &pw, (nl_dir)d, x, T, y[i]) == 0);
                if (i == 0) { /* T invariance */
                    float *y1 = malloc(sizeof(float) * nout);
                    int bad = 0;
                    for (int t = 0; t < T; t += 4) {
                        CHECK(nl_proj_backend_host.run(ctx, &pw, (nl_dir)d, x + (size_t)t * nin, 1, y1) == 0);
                        bad += memcmp(y1, y[0] + (size_t)t * nout, sizeof(float) * nout) != 0;
                    }
                    CHECKF(bad == 0, "%s/%s type %d dir %d: T=1 differs from T=%d", m->kernels, m->compute, type, d, T);
                    free(y1);
                }
                nl_proj_backend_host.free(ctx);
            }
        }
        CHECKF(memcmp(y[0], y[1], sizeof(float) * T * nout) == 0, "%s/%s type %d: 1 vs 2 threads", m->kernels,
               m->compute, type);
        CHECKF(memcmp(y[0], y[2], sizeof(float) * T * nout) == 0, "%s/%s type %d: 1 vs 4 threads", m->kernels,
               m->compute, type);
        CHECKF(memcmp(y[0], y[3], sizeof(float) * T * nout) == 0, "%s/%s type %d: 1 vs 8 threads", m->kernels,
               m->compute, type);
        for (int i = 0; i < 4; i++) free(y[i]);
    }
    free(w);
    free(x);
}

/* The kernel set's gemm_bf16 (kernels.h) against its chain written out in C: each C element one
 * chain over the pairs p2 in increasing order from 0, per pair the high products then the low
 * (VDPBF16PS's order; the products of two BF16 are exact in FP32, each add rounds to nearest), the
 * chain added to C's old value when accumulating. Bit for bit for every tile the kernel picks
 * (the live columns ncols 1..64 choose 1..4 vectors and 6..12-row tiles; m covers every tile
 * height and a tail), and the columns past ncols left as they were. Values are normal BF16 of
 * moderate size, so DAZ/FTZ never applies. */
static float t_bf16_val(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_gemm_bf16_chain(const char *kernels) {
    const nl_host_kernels *ks = nl_cpu_kernels_find(kernels);
    CHECK(ks != NULL && ks->gemm_bf16 != NULL);
    if (!ks || !ks->gemm_bf16) return;
    enum { MMAX = 29, KP = 37, LDA = 2 * KP + 6, LDC = 70 };
    uint16_t *A = malloc(sizeof(uint16_t) * MMAX * LDA);
    uint32_t *B = aligned_alloc(64, sizeof(uint32_t) * KP * NL_HOST_NP);
    float *C = malloc(sizeof(float) * MMAX * LDC), *C0 = malloc(sizeof(float) * MMAX * LDC);
    for (int i = 0; i < MMAX * LDA; i++) A[i] = nl_host_f32_to_bf16((float)(2.0 * nl_t_rand()));
    for (int i = 0; i < KP * NL_HOST_NP; i++)
        B[i] = (uint32_t)nl_host_f32_to_bf16((float)nl_t_rand()) | (uint32_t)nl_host_f32_to_bf16((float)nl_t_rand())
                                                                       << 16;
    for (int i = 0; i < MMAX * LDC; i++) C0[i] = (float)(4.0 * nl_t_rand());
    static const int ncs[] = {1, 7, 16, 17, 31, 32, 33, 45, 48, 49, 63, 64};
    int bad = 0;
    for (int m = 1; m <= MMAX; m += (m < 14 ? 1 : 5))
        for (size_t q = 0; q < sizeof ncs / sizeof ncs[0]; q++)
            for (int acc = 0; acc < 2; acc++) {
                const int nc = ncs[q], kp = m % 3 == 0 ? 1 : KP;
                memcpy(C, C0, sizeof(float) * MMAX * LDC);
                ks->gemm_bf16(m, kp, A, LDA, B, C, LDC, nc, acc);
                for (int i = 0; i < MMAX; i++)
                    for (int j = 0; j < LDC; j++) {
                        float want = C0[i * LDC + j];
                        if (i < m && j < nc) {
                            float sum = 0.0f;
                            for (int p2 = 0; p2 < kp; p2++) {
                                const uint32_t b = B[p2 * NL_HOST_NP + j];
                                volatile float hi =
                                    t_bf16_val(A[i * LDA + 2 * p2 + 1]) * t_bf16_val((uint16_t)(b >> 16));
                                volatile float lo = t_bf16_val(A[i * LDA + 2 * p2]) * t_bf16_val((uint16_t)b);
                                sum = sum + hi;
                                sum = sum + lo;
                            }
                            want = acc ? want + sum : sum;
                        }
                        if (memcmp(&want, &C[i * LDC + j], 4) && bad++ < 3)
                            fprintf(stderr, "%s gemm_bf16 m=%d kp=%d ncols=%d acc=%d: C[%d][%d] = %.9g, chain %.9g\n",
                                    kernels, m, kp, nc, acc, i, j, C[i * LDC + j], want);
                    }
            }
    CHECKF(bad == 0, "%s gemm_bf16: %d elements differ from the chain", kernels, bad);
    free(A);
    free(B);
    free(C);
    free(C0);
}

/* The kernel set's gemm_f32 against its chain in C (kernels.h: one FMA chain per element over p
 * from 0, added to C's old value when accumulating), bit for bit for every tile it picks (ncols
 * 1..64: 1..4 live vectors in 6..12-row tiles; m every tile height and a tail), the columns past
 * ncols left as they were and the panel's columns past the live 16-column groups not read (NaN). */
static void test_gemm_f32_chain(const char *kernels) {
    const nl_host_kernels *ks = nl_cpu_kernels_find(kernels);
    CHECK(ks != NULL);
    if (!ks) return;
    enum { MMAX = 29, KC = 41, LDA = KC + 3, LDC = 70 };
    float *A = malloc(sizeof(float) * MMAX * LDA), *B = aligned_alloc(64, sizeof(float) * KC * NL_HOST_NP);
    float *C = malloc(sizeof(float) * MMAX * LDC), *C0 = malloc(sizeof(float) * MMAX * LDC);
    for (int i = 0; i < MMAX * LDA; i++) A[i] = (float)(2.0 * nl_t_rand());
    for (int i = 0; i < MMAX * LDC; i++) C0[i] = (float)(4.0 * nl_t_rand());
    static const int ncs[] = {1, 7, 16, 17, 31, 32, 33, 45, 48, 49, 63, 64};
    int bad = 0;
    for (size_t q = 0; q < sizeof ncs / sizeof ncs[0]; q++) {
        const int nc = ncs[q], live = (nc + 15) / 16 * 16;
        for (int i = 0; i < KC * NL_HOST_NP; i++) B[i] = i % NL_HOST_NP < live ? (float)nl_t_rand() : NAN;
        for (int m = 1; m <= MMAX; m += (m < 14 ? 1 : 5))
            for (int acc = 0; acc < 2; acc++) {
                const int kc = m % 3 == 0 ? 1 : KC;
                memcpy(C, C0, sizeof(float) * MMAX * LDC);
                ks->gemm_f32(m, kc, A, LDA, B, C, LDC, nc, acc);
                for (int i = 0; i < MMAX; i++)
                    for (int j = 0; j < LDC; j++) {
                        float want = C0[i * LDC + j];
                        if (i < m && j < nc) {
                            float sum = 0.0f;
                            for (int p = 0; p < kc; p++) sum = fmaf(A[i * LDA + p], B[p * NL_HOST_NP + j], sum);
                            want = acc ? want + sum : sum;
                        }
                        if (memcmp(&want, &C[i * LDC + j], 4) && bad++ < 3)
                            fprintf(stderr, "%s gemm_f32 m=%d kc=%d ncols=%d acc=%d: C[%d][%d] = %.9g, chain %.9g\n",
                                    kernels, m, kc, nc, acc, i, j, C[i * LDC + j], want);
                    }
            }
    }
    CHECKF(bad == 0, "%s gemm_f32: %d elements differ from the chain", kernels, bad);
    free(A);
    free(B);
    free(C);
    free(C0);
}

/* bf16 compute, the whole request against its model in C, bit for bit: x and the dequantized
 * weight rounded to BF16, each output element the chains of gemm_bf16 over the reduction's
 * chunks of NL_HOST_KC (pairs (2i, 2i + 1), the high product then the low, a zero pad past an odd
 * length), chunk 0's chain stored and every later chain added. Odd shapes (F16 K 1, 37, 301, 333:
 * an odd last pair; N 1, 16, 67: narrow and partial panels) FWD and BWD, 1 and 3 threads. */
static float t_bf16(float f) { return t_bf16_val(nl_host_f32_to_bf16(f)); }

static void check_bf16_model(int type, int N, int K, int T, nl_dir dir, int nth) {
    void *ctx = new_ctx(nth, "avx512", "bf16");
    CHECK(ctx != NULL);
    if (!ctx) return;
    uint8_t *w = malloc(t_row_bytes(type, K) * (size_t)N);
    float *wd = malloc(sizeof(float) * (size_t)N * K);
    const int nin = dir == NL_FWD ? K : N, nout = dir == NL_FWD ? N : K;
    float *x = malloc(sizeof(float) * (size_t)T * nin), *y = malloc(sizeof(float) * (size_t)T * nout);
    nl_t_rand_weight(type, N, K, w);
    for (int n = 0; n < N; n++) t_dequant_row(type, w + t_row_bytes(type, K) * n, K, wd + (size_t)n * K);
    for (int i = 0; i < T * nin; i++) x[i] = (float)(nl_t_rand() * 3.0);
    nl_proj_weight pw = {.name = "w", .type = type, .cls = NL_CLASS_ATTN, .n_in = K, .n_out = N, .data = w};
    CHECK(nl_proj_backend_host.run(ctx, &pw, dir, x, T, y) == 0);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < nout; o++) {
            float yv = 0.0f;
            for (int r0 = 0; r0 < nin; r0 += NL_HOST_KC) {
                float sum = 0.0f;
                for (int r = r0; r < r0 + NL_HOST_KC && r < nin; r += 2) {
                    float xv[2] = {0.0f, 0.0f}, wv[2] = {0.0f, 0.0f};
                    for (int h = 0; h < 2 && r + h < nin; h++) {
                        xv[h] = t_bf16(x[(size_t)t * nin + r + h]);
                        wv[h] = t_bf16(dir == NL_FWD ? wd[(size_t)o * K + r + h] : wd[(size_t)(r + h) * K + o]);
                    }
                    volatile float hi = xv[1] * wv[1];
                    volatile float lo = xv[0] * wv[0];
                    sum = sum + hi;
                    sum = sum + lo;
                }
                yv = r0 == 0 ? sum : yv + sum;
            }
            if (memcmp(&yv, &y[(size_t)t * nout + o], 4) && bad++ < 3)
                fprintf(stderr, "bf16 model type %d %s N=%d K=%d T=%d %d threads: y[%d][%d] = %.9g, model %.9g\n", type,
                        dir == NL_FWD ? "fwd" : "bwd", N, K, T, nth, t, o, y[(size_t)t * nout + o], yv);
        }
    CHECKF(bad == 0, "bf16 model type %d %s N=%d K=%d T=%d: %d differ", type, dir == NL_FWD ? "fwd" : "bwd", N, K, T,
           bad);
    free(w);
    free(wd);
    free(x);
    free(y);
    nl_proj_backend_host.free(ctx);
}

static void test_bf16_model(void) {
    static const int f16[][2] = {{1, 1}, {16, 37}, {67, 301}, {16, 333}, {130, 64}}; /* N, K */
    static const int q8[][2] = {{16, 1024}, {67, 96}, {131, 544}};
    for (int d = 0; d < 2; d++)
        for (int nth = 1; nth <= 3; nth += 2)
            for (int T = 1; T <= 29; T += 14) {
                for (int s = 0; s < 5; s++) check_bf16_model(NL_TYPE_F16, f16[s][0], f16[s][1], T, (nl_dir)d, nth);
                for (int s = 0; s < 3; s++) check_bf16_model(NL_TYPE_Q8_0, q8[s][0], q8[s][1], T, (nl_dir)d, nth);
            }
    /* BWD's two orders (host.c, BWD_Y_BYTES): chunk-outer (3 panels x 2 chunks of the reduction)
     * and panel-outer (300 rows x 16 panels of FP32 Y, over 1 MiB on one thread) */
    check_bf16_model(NL_TYPE_Q8_0, 300, 160, 29, NL_BWD, 1);
    check_bf16_model(NL_TYPE_Q8_0, 300, 1024, 300, NL_BWD, 1);
}

/* bf16 mode really runs a different path than f32 (a test that can fail if the mode is ignored). */
static void test_bf16_differs(const char *kernels) {
    const int N = 64, K = 256, T = 8;
    uint8_t *w = malloc(t_row_bytes(NL_TYPE_Q8_0, K) * N);
    nl_t_rand_weight(NL_TYPE_Q8_0, N, K, w);
    nl_proj_weight pw = {.name = "w", .type = NL_TYPE_Q8_0, .n_in = K, .n_out = N, .data = w};
    float x[8 * 256], y0[8 * 64], y1[8 * 64];
    for (int i = 0; i < T * K; i++) x[i] = (float)nl_t_rand();
    void *a = new_ctx(1, kernels, "f32"), *b = new_ctx(1, kernels, "bf16");
    CHECK(a && b);
    if (a && b) {
        CHECK(nl_proj_backend_host.run(a, &pw, NL_FWD, x, T, y0) == 0);
        CHECK(nl_proj_backend_host.run(b, &pw, NL_FWD, x, T, y1) == 0);
        CHECK(memcmp(y0, y1, sizeof y0) != 0);
    }
    if (a) nl_proj_backend_host.free(a);
    if (b) nl_proj_backend_host.free(b);
    free(w);
}

static void test_errors(void) {
    void *ctx = new_ctx(1, "scalar", "f32");
    CHECK(ctx != NULL);
    uint8_t w[34 * 2] = {0};
    nl_proj_weight pw = {.name = "w", .type = NL_TYPE_Q8_0, .n_in = 48, .n_out = 1, .data = w};
    CHECK(nl_proj_backend_host.supports(ctx, &pw, NL_FWD, 4) == 0); /* K not a block multiple */
    float x[64], y[64];
    CHECK(nl_proj_backend_host.run(ctx, &pw, NL_FWD, x, 1, y) == -1);
    pw.n_in = 32;
    pw.type = 10; /* q2_k: not decoded by model/quant */
    CHECK(nl_proj_backend_host.supports(ctx, &pw, NL_FWD, 4) == 0);
    CHECK(nl_proj_host_configure(ctx, "bogus", NULL) == -1);
    CHECK(nl_proj_host_configure(ctx, NULL, "fp8") == -1);
    nl_proj_backend_host.free(ctx);
    /* the compute mode travels in the service's config to its backend's init */
    void *bad = NULL;
    CHECK(nl_proj_backend_host.init(&bad, 1, "fp8") == -1 && bad == NULL);
    CHECK(nl_proj_backend_ref.init(&bad, 1, "fp8") == -1 && bad == NULL);
    nl_proj_config cfg = {.backend = "host", .n_threads = 1, .compute = "fp8"};
    CHECK(nl_proj_service_new(&cfg) == NULL && strstr(nl_last_error(), "fp8"));
    cfg.compute = "f32";
    nl_proj_service *s = nl_proj_service_new(&cfg);
    CHECK(s && !strcmp(nl_proj_compute(s), "f32"));
    nl_proj_service_free(s);
    cfg.backend = "ref";
    cfg.compute = "bf16"; /* a host mode: ref computes in FP32 whatever it says */
    s = nl_proj_service_new(&cfg);
    CHECK(s && !strcmp(nl_proj_compute(s), "f32"));
    nl_proj_service_free(s);
}

int main(void) {
    test_decoders();
    mode modes[8];
    int nm = 0;
    modes[nm++] = (mode){"scalar", "f32"};
    if (nl_proj_host_cpu_has("avx2")) modes[nm++] = (mode){"avx2", "f32"};
    if (nl_proj_host_cpu_has("avx512")) modes[nm++] = (mode){"avx512", "f32"};
    if (nl_proj_host_cpu_has("avx512bf16")) modes[nm++] = (mode){"avx512", "bf16"};
    if (nl_proj_host_cpu_has("neon")) modes[nm++] = (mode){"neon", "f32"};
    if (nl_proj_host_cpu_has("neonbf16")) modes[nm++] = (mode){"neonbf16", "f32"};
    if (nl_proj_host_cpu_has("neonbf16")) modes[nm++] = (mode){"neonbf16", "bf16"};
    for (int i = 0; i < nm; i++) {
        printf("kernels %s, compute %s\n", modes[i].kernels, modes[i].compute);
        max_err_ratio = 0;
        test_accuracy(&modes[i]);
        printf("  worst error / bound = %.3g\n", max_err_ratio);
        test_one_hot(&modes[i], NL_TYPE_Q8_0, 67, 96, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_Q4_0, 33, 64, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_Q4_1, 35, 96, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_F16, 65, 71, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_F16, 65, 71, NL_CLASS_RECURRENT);
        test_one_hot(&modes[i], NL_TYPE_F16, 16, 301, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_Q4_K, 9, 256, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_Q6_K, 5, 256, NL_CLASS_ATTN);
        test_one_hot(&modes[i], NL_TYPE_Q5_0, 37, 672, NL_CLASS_ATTN);
        test_threads(&modes[i], NL_TYPE_Q8_0, NL_CLASS_ATTN, 200);
        test_threads(&modes[i], NL_TYPE_Q8_0, NL_CLASS_RECURRENT, 16); /* alpha/beta's narrow N */
        test_threads(&modes[i], NL_TYPE_F16, NL_CLASS_ATTN, 200);
        test_threads(&modes[i], NL_TYPE_F16, NL_CLASS_RECURRENT, 200);
        test_threads(&modes[i], NL_TYPE_F16, NL_CLASS_RECURRENT, 16);
        test_threads(&modes[i], NL_TYPE_Q4_1, NL_CLASS_ATTN, 200);
        test_threads(&modes[i], NL_TYPE_Q5_0, NL_CLASS_ATTN, 200);
    }
    if (nl_proj_host_cpu_has("avx512")) test_gemm_f32_chain("avx512");
    if (nl_proj_host_cpu_has("avx512bf16")) {
        test_bf16_differs("avx512");
        test_gemm_bf16_chain("avx512");
        test_bf16_model();
    }
    if (nl_proj_host_cpu_has("neonbf16")) {
        test_bf16_differs("neonbf16");
        /* an Arm core with BF16: the default row and compute are neonbf16 / bf16 */
        void *c = new_ctx(1, "auto", NULL);
        char d[256] = "";
        CHECK(c != NULL);
        if (c) nl_proj_host_describe(c, d, sizeof d);
        CHECKF(!strcmp(d, "bf16 compute (neonbf16 kernels, BF16 weights)"), "describe: '%s'", d);
        if (c) nl_proj_backend_host.free(c);
    }
    test_errors();
    return nl_t_done();
}

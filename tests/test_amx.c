/* test_amx: the matrix-engine kernels (cpu/amx.h) on the tile emulator — and, where this CPU
 * has usable AMX, on the real instructions.
 *   - the emulator's TDPBF16PS (both readings: the SDM's, the hardware's; the intrinsics
 *     guide's chain) against plain C models (DAZ/FTZ included), bit for bit, on random BF16
 *     with denormals and sums that underflow; where the CPU has AMX, the real instruction
 *     against the emulator bit for bit over the whole exponent range;
 *   - the emulated kernel on the chain reading (nl_amx_tiles_emu_chain; FWD and BWD, plain
 *     BF16 and split-BF16) against a plain C model of the whole product (dequantize with the
 *     type's to_float, round to BF16, accumulate in 32-element steps, one chain), bit for bit, for every resident type,
 * on odd shapes (rows/cols/K not multiples of 16/32/64); both kernel sets' packing (scalar and SIMD) give the same
 * bits;
 *   - kernel vs a float64 reference within the bound (|y - ref| <= tol·Σ|x·w|), real too;
 *   - one-hot: FWD's column and BWD's row of every weight are the same bits (and the model's
 *     effective weight: bf16(w), or hi + lo split);
 *   - 1/2/3 threads bit-identical; a row's result does not depend on T;
 *   - the host backend's amx-emu mode (recurrent → split, F32 → the f32 path), the service's
 *     planner with every check passing, and the CLI: check and a short training run. */
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include "model/model.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "arm_bf16.h"
#include "test.h"
#include "tile_model.h"
#include "util/pool.h"
#include "util/util.h"

/* ---- the plain C model ---- */

/* one plane of a value: 0 = hi = bf16(v) (FP32 denormals read as zero, as VCVTNEPS2BF16 and the
 * scalar packing round), 1 = lo = bf16(v - hi) */
static uint16_t m_plane(float v, int lo) {
    const uint16_t hi = m_bf16_daz(v);
    return lo ? m_bf16(v - m_raw(hi)) : hi;
}

/* y[t][n] (FWD, reduction over K) or y[t][k] (BWD, over N): for each 32-step chunk, the
 * passes (w plane, x plane): FWD (hi,hi) (hi,lo) (lo,hi); BWD (hi,hi) (lo,hi) (hi,lo)
 * (A·B, A·Blo, Alo·B with A = W FWD, A = dY BWD). wd: N×K dequantized floats. */
/* the reading the model follows: 0 TDPBF16PS's chain (amx-emu-chain), 1 SME's BFMOPA (every pair
 * one BFDotAdd, arm_bf16.h: rounded to odd) */
static int g_sme;

static void model(nl_dir dir, const float *wd, int N, int K, const float *x, int T, int split, float *y) {
    const int R = dir == NL_FWD ? K : N, O = dir == NL_FWD ? N : K, Rp = (R + 31) / 32 * 32;
    static const int fwd_p[3][2] = {{0, 0}, {0, 1}, {1, 0}}, bwd_p[3][2] = {{0, 0}, {1, 0}, {0, 1}};
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            float c = 0.0f;
            for (int r0 = 0; r0 < Rp; r0 += 32)
                for (int p = 0; p < (split ? 3 : 1); p++) {
                    const int wl = dir == NL_FWD ? fwd_p[p][0] : bwd_p[p][0];
                    const int xl = dir == NL_FWD ? fwd_p[p][1] : bwd_p[p][1];
                    for (int r = r0; r < r0 + 32; r += 1 + g_sme) {
                        uint32_t wp = 0, xp = 0; /* the pair (r, r+1) of planes, SME */
                        for (int h = 0; h <= g_sme; h++) {
                            const int rr = r + h;
                            const float wv =
                                rr < R ? (dir == NL_FWD ? wd[(size_t)o * K + rr] : wd[(size_t)rr * K + o]) : 0.0f;
                            const float xv = rr < R ? x[(size_t)t * R + rr] : 0.0f;
                            if (!g_sme) c = m_step(c, m_plane(wv, wl), m_plane(xv, xl));
                            wp |= (uint32_t)m_plane(wv, wl) << 16 * h;
                            xp |= (uint32_t)m_plane(xv, xl) << 16 * h;
                        }
                        if (g_sme) c = bfdotadd(c, wp, xp);
                    }
                }
            y[(size_t)t * O + o] = c;
        }
}

/* ---- the emulator's instruction against the model ---- */

static uint16_t rand_bf16(void) {
    /* mostly normals around 1, some tiny (products and sums underflow), some denormals */
    const double r = nl_t_rand();
    uint16_t s = nl_t_rand() < 0 ? 0x8000 : 0;
    if (r < -0.8) return (uint16_t)(s | ((unsigned)((nl_t_rand() + 1) * 63) & 0x7f)); /* denormal */
    if (r < -0.5)
        return (uint16_t)(s | (unsigned)(5 + (int)((nl_t_rand() + 1) * 30)) << 7 |
                          ((unsigned)((nl_t_rand() + 1) * 63) & 0x7f));
    return m_bf16((float)nl_t_rand() * 4.0f);
}

/* TDPBF16PS as the SDM's Operation section reads: per output, even and odd partial sums from
 * zero (FMAs), then their sum added to c — the hardware's arithmetic, the emulator's (nl_amx_tiles_emu) */
static float m_dp_sdm(float c, const uint16_t *arow, const uint16_t *b, int n) {
    float ev = 0.0f, od = 0.0f;
    for (int p = 0; p < 16; p++) {
        ev = m_ftz(fmaf(m_in(arow[2 * p]), m_in(b[32 * p + 2 * n]), ev));
        od = m_ftz(fmaf(m_in(arow[2 * p + 1]), m_in(b[32 * p + 2 * n + 1]), od));
    }
    return m_ftz(c + m_ftz(ev + od));
}

static void test_tile_op(void) {
    uint16_t a[2][16 * 32], b[2][16 * 32];
    float c[1024] __attribute__((aligned(64))), c2[1024] __attribute__((aligned(64)));
    int same = 1, same_sdm = 1, differ = 0;
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < 16 * 32; e++) {
                a[i][e] = rand_bf16();
                b[i][e] = rand_bf16();
            }
        for (int e = 0; e < 1024; e++) c[e] = rep % 2 ? (float)nl_t_rand() * 1e-37f : 0.0f;
        memcpy(c2, c, sizeof c2);
        float want[1024], want_sdm[1024];
        memcpy(want, c, sizeof want);
        memcpy(want_sdm, c, sizeof want_sdm);
        nl_amx_block blk = {.a = {(const uint8_t *)a[0], (const uint8_t *)a[1]},
                            .b = {(const uint8_t *)b[0], (const uint8_t *)b[1]},
                            .lda = 64,
                            .ldb = 64,
                            .astep = 0,
                            .bstep = 0,
                            .steps = 2,
                            .load = rep % 2,
                            .c = c};
        nl_amx_tiles_emu_chain.begin();
        nl_amx_tiles_emu_chain.block(&blk);
        nl_amx_tiles_emu_chain.end();
        blk.c = c2;
        nl_amx_tiles_emu.begin();
        nl_amx_tiles_emu.block(&blk);
        nl_amx_tiles_emu.end();
        for (int i = 0; i < 2; i++)
            for (int jj = 0; jj < 2; jj++)
                for (int m = 0; m < 16; m++)
                    for (int n = 0; n < 16; n++) {
                        const int o = (2 * i + jj) * 256 + 16 * m + n;
                        float v = rep % 2 ? want[o] : 0.0f, vs = rep % 2 ? want_sdm[o] : 0.0f;
                        for (int s = 0; s < 2; s++) {
                            for (int p = 0; p < 16; p++) {
                                v = m_step(v, a[i][32 * m + 2 * p], b[jj][32 * p + 2 * n]);
                                v = m_step(v, a[i][32 * m + 2 * p + 1], b[jj][32 * p + 2 * n + 1]);
                            }
                            vs = m_dp_sdm(vs, a[i] + 32 * m, b[jj], n);
                        }
                        want[o] = v;
                        want_sdm[o] = vs;
                        differ += memcmp(&v, &vs, 4) != 0;
                    }
        same &= !memcmp(c, want, sizeof want);
        same_sdm &= !memcmp(c2, want_sdm, sizeof want_sdm);
    }
    CHECKF(same, "the emulated TDPBF16PS (the chain reading) differs from its model");
    CHECKF(same_sdm, "the emulated TDPBF16PS (the SDM's reading, the hardware's) differs from its model");
    /* the two readings are different arithmetic: the tests of the real instructions must not
     * depend on either's bits */
    CHECKF(differ > 1000, "the two readings of TDPBF16PS differ in only %d of 20480 outputs", differ);
}

/* The real TDPBF16PS against the emulator (the SDM's reading), bit for bit, where this CPU has
 * AMX: random BF16 over the whole exponent range (denormals, products and sums that overflow or
 * underflow), c from zero and loaded, several steps, a NaN equal to any NaN. The chain reading
 * (the intrinsics guide's) gave other bits in most outputs of this test on the measured Xeon. */
static uint16_t rand_bf16_wide(int spread) {
    int e = 127 + (int)((nl_t_rand() + 1.0) * 0.5 * (2 * spread + 1)) - spread;
    e = e < 0 ? 0 : e > 254 ? 254 : e;
    return (uint16_t)((nl_t_rand() < 0 ? 0x8000u : 0u) | (unsigned)e << 7 |
                      ((unsigned)((nl_t_rand() + 1) * 64) & 0x7f));
}

static void test_real_tile_op(void) {
    const nl_amx_tiles *real = nl_amx_tiles_of("amx");
    if (!real) return;
    static uint16_t a[2][3 * 16 * 32], b[2][3 * 16 * 32];
    float c[1024] __attribute__((aligned(64))), c2[1024] __attribute__((aligned(64)));
    int bad = 0, n = 0, differ_chain = 0;
    static const int spreads[] = {0, 3, 12, 40, 130};
    for (int rep = 0; rep < 40; rep++) {
        const int sp = spreads[rep % 5];
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < 3 * 16 * 32; e++) {
                a[i][e] = rand_bf16_wide(sp);
                b[i][e] = rand_bf16_wide(sp);
            }
        for (int e = 0; e < 1024; e++) {
            const uint16_t h = rand_bf16_wide(sp + 2);
            c[e] = rep % 2 ? m_raw(h) : 0.0f;
        }
        memcpy(c2, c, sizeof c2);
        float c3[1024] __attribute__((aligned(64)));
        memcpy(c3, c, sizeof c3);
        nl_amx_block blk = {.a = {(const uint8_t *)a[0], (const uint8_t *)a[1]},
                            .b = {(const uint8_t *)b[0], (const uint8_t *)b[1]},
                            .lda = 64,
                            .ldb = 64,
                            .astep = 1024,
                            .bstep = 1024,
                            .steps = 3,
                            .load = rep % 2,
                            .c = c};
        real->begin();
        real->block(&blk);
        real->end();
        blk.c = c2;
        nl_amx_tiles_emu.begin();
        nl_amx_tiles_emu.block(&blk);
        nl_amx_tiles_emu.end();
        blk.c = c3;
        nl_amx_tiles_emu_chain.begin();
        nl_amx_tiles_emu_chain.block(&blk);
        nl_amx_tiles_emu_chain.end();
        for (int e = 0; e < 1024; e++, n++) {
            bad += memcmp(&c[e], &c2[e], 4) != 0 && !(isnan(c[e]) && isnan(c2[e]));
            differ_chain += memcmp(&c[e], &c3[e], 4) != 0 && !(isnan(c[e]) && isnan(c3[e]));
        }
    }
    CHECKF(bad == 0, "the real TDPBF16PS differs from the emulator (the SDM's reading) in %d of %d outputs", bad, n);
    printf("real TDPBF16PS vs the emulator: %d of %d outputs differ (the chain reading: %d)\n", bad, n, differ_chain);
}

/* ---- the tile configuration (what ldtilecfg loads on the hardware) ---- */

static void test_config(void) {
    const uint8_t *c = (const uint8_t *)&nl_amx_config;
    CHECK(sizeof nl_amx_config == 64 && ((uintptr_t)c & 63) == 0);
    /* the SDM's palette-1 layout, as the kernels use it: tiles 0-7 16 rows × 64 bytes, the rest zero */
    int ok = c[0] == 1 && c[1] == 0;
    for (int i = 2; i < 16; i++) ok &= c[i] == 0;
    for (int i = 0; i < 16; i++) {
        uint16_t cb;
        memcpy(&cb, c + 16 + 2 * i, 2);
        ok &= cb == (i < 8 ? 64 : 0) && c[48 + i] == (i < 8 ? 16 : 0);
    }
    CHECKF(ok, "nl_amx_config is not palette 1 with tiles 0-7 of 16 rows x 64 bytes");
    CHECK(nl_amx_config_ok(c));
    /* what the hardware refuses (#GP), the emulator refuses too */
    static const struct {
        int at, val;
    } bad[] = {{0, 2},  {1, 1},   {2, 1},   {15, 1},  {16, 65}, {30, 65}, {32, 64},
               {46, 1}, {48, 17}, {55, 17}, {56, 16}, {63, 1},  {48, 0},  {16, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t m[64];
        memcpy(m, c, 64);
        if (bad[i].at >= 16 && bad[i].at < 32 && !(bad[i].at & 1)) {
            const uint16_t v = (uint16_t)bad[i].val;
            memcpy(m + bad[i].at, &v, 2);
        } else {
            m[bad[i].at] = (uint8_t)bad[i].val;
        }
        CHECKF(!nl_amx_config_ok(m), "a configuration with byte %d = %d accepted", bad[i].at, bad[i].val);
    }
}

/* ---- the kernels ---- */

static const int all_types[] = {NL_TYPE_F32,  NL_TYPE_F16,  NL_TYPE_BF16, NL_TYPE_Q8_0,
                                NL_TYPE_Q4_0, NL_TYPE_Q4_1, NL_TYPE_Q4_K, NL_TYPE_Q6_K};

typedef struct {
    int type, N, K;
    uint8_t *w;
    float *wd; /* dequantized (to_float) */
} weight;

static void make_weight(weight *W, int type, int N, int K) {
    W->type = type;
    W->N = N;
    W->K = K;
    const size_t rb = nl_row_bytes(type, K);
    W->w = malloc(rb * (size_t)N);
    W->wd = malloc(sizeof(float) * (size_t)N * (size_t)K);
    nl_t_rand_weight(type, N, K, W->w);
    for (int n = 0; n < N; n++) nl_type_get(type)->to_float(W->w + rb * (size_t)n, W->wd + (size_t)n * K, K);
}

static void free_weight(weight *W) {
    free(W->w);
    free(W->wd);
}

static nl_proj_weight view(const weight *W, int cls) {
    nl_proj_weight v = {.name = "w", .type = W->type, .n_in = W->K, .n_out = W->N, .data = W->w, .cls = cls};
    return v;
}

/* Y through nl_amx_run with nth threads. */
static int run_amx(const nl_amx_tiles *tl, const nl_host_kernels *ks, const weight *W, nl_dir dir, const float *x,
                   int T, int split, int nth, float *y) {
    nl_pool *pool = nl_pool_new(nth);
    nl_amx_ctx *a = nl_amx_new(nth);
    nl_proj_weight v = view(W, NL_CLASS_ATTN);
    int rc = pool && a ? nl_amx_run(a, tl, ks, pool, &v, dir, x, T, y, split) : -1;
    nl_amx_free(a);
    nl_pool_free(pool);
    return rc;
}

/* max over elements of |y - ref| / Σ|x·w| (float64 reference on the dequantized weight) */
static double rel_err(const weight *W, nl_dir dir, const float *x, int T, const float *y) {
    const int R = dir == NL_FWD ? W->K : W->N, O = dir == NL_FWD ? W->N : W->K;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            double s = 0, sa = 0;
            for (int r = 0; r < R; r++) {
                const double wv = dir == NL_FWD ? W->wd[(size_t)o * W->K + r] : W->wd[(size_t)r * W->K + o];
                s += wv * x[(size_t)t * R + r];
                sa += fabs(wv * x[(size_t)t * R + r]);
            }
            const double e = fabs(y[(size_t)t * O + o] - s) / (sa > 1e-30 ? sa : 1e-30);
            if (e > worst) worst = e;
        }
    return worst;
}

static const nl_host_kernels *simd_set(void) {
#if defined(__x86_64__)
    if (nl_proj_host_cpu_has("avx512")) return &nl_host_kernels_avx512;
    if (nl_proj_host_cpu_has("avx2")) return &nl_host_kernels_avx2;
#elif defined(__aarch64__)
    return &nl_host_kernels_neon;
#endif
    return &nl_host_kernels_scalar;
}

static double worst_plain_f16, worst_split_f16;

/* Every check of one (type, shape, direction, split) on tiles `tl`; exact: compare with the
 * model bit for bit (the emulator). */
static void check_kernel(const nl_amx_tiles *tl, int exact, const weight *W, nl_dir dir, int T, int split) {
    const int R = dir == NL_FWD ? W->K : W->N, O = dir == NL_FWD ? W->N : W->K;
    float *x = malloc(sizeof(float) * (size_t)T * R);
    float *y1 = malloc(sizeof(float) * (size_t)T * O), *y2 = malloc(sizeof(float) * (size_t)T * O);
    float *y3 = malloc(sizeof(float) * (size_t)T * O), *ym = malloc(sizeof(float) * (size_t)T * O);
    nl_t_fill(x, (int64_t)T * R, 1.0);
    const char *tn = nl_type_name(W->type), *dn = dir == NL_FWD ? "fwd" : "bwd";
    CHECK(run_amx(tl, &nl_host_kernels_scalar, W, dir, x, T, split, 1, y1) == 0);
    if (exact) {
        model(dir, W->wd, W->N, W->K, x, T, split, ym);
        CHECKF(!memcmp(y1, ym, sizeof(float) * (size_t)T * O), "%s %s %s %dx%d T=%d: emulated kernel != model",
               tl->name, tn, dn, W->N, W->K, T);
    }
    /* the SIMD set's packing, and 2 / 3 threads: the same bits */
    CHECK(run_amx(tl, simd_set(), W, dir, x, T, split, 2, y2) == 0);
    CHECK(run_amx(tl, simd_set(), W, dir, x, T, split, 3, y3) == 0);
    CHECKF(!memcmp(y1, y2, sizeof(float) * (size_t)T * O) && !memcmp(y1, y3, sizeof(float) * (size_t)T * O),
           "%s %s %s %dx%d T=%d: threads or kernel sets differ", tl->name, tn, dn, W->N, W->K, T);
    /* a row alone: the same bits as in the whole request */
    CHECK(run_amx(tl, simd_set(), W, dir, x + (size_t)(T - 1) * R, 1, split, 2, y2) == 0);
    CHECKF(!memcmp(y2, y1 + (size_t)(T - 1) * O, sizeof(float) * (size_t)O), "%s %s %s: row T-1 alone differs",
           tl->name, tn, dn);
    /* the bound, for any TDPBF16PS that rounds each FP32 sum faithfully (the SDM says nearest
     * even; truncation would be within it too), in any order: the BF16 inputs (8 significant
     * bits: each ≤ 2^-8 relative, a product ≤ 2^-7 + 2^-16; split, hi + lo of x and of w leave
     * ≤ 2^-16 each and the dropped lo·lo ≤ 2^-16: ≤ 3·2^-16 in all) plus n − 1 ≤ n FP32 sums of
     * exact products, each ≤ 2^-23 of Σ|terms| (≤ 1.01·Σ|x·w|), n = passes × the padded
     * reduction + 1 (a reload) */
    const double e = rel_err(W, dir, x, T, y1);
    const int Rp = (R + 31) / 32 * 32;
    const double n = (double)((split ? 3 : 1) * Rp + 1);
    const double tol = (split ? 3 * 0x1p-16 : 0x1p-7 + 0x1p-16) + 1.01 * n * 0x1p-23;
    CHECKF(e <= tol, "%s %s %s %dx%d T=%d split %d: error %.3g > %.3g", tl->name, tn, dn, W->N, W->K, T, split, e, tol);
    if (W->type == NL_TYPE_F16) {
        double *wst = split ? &worst_split_f16 : &worst_plain_f16;
        if (e > *wst) *wst = e;
    }
    free(x);
    free(y1);
    free(y2);
    free(y3);
    free(ym);
}

/* One-hot: FWD with x = e_k gives column k of the effective weight, BWD with dy = e_n its row
 * n: both the same bits, and the model's effective value. */
static void check_onehot(const nl_amx_tiles *tl, int exact, const weight *W, int split) {
    const int N = W->N, K = W->K;
    float *xf = calloc((size_t)K * K, sizeof(float)), *xb = calloc((size_t)N * N, sizeof(float));
    float *yf = malloc(sizeof(float) * (size_t)K * N), *yb = malloc(sizeof(float) * (size_t)N * K);
    for (int k = 0; k < K; k++) xf[(size_t)k * K + k] = 1.0f;
    for (int n = 0; n < N; n++) xb[(size_t)n * N + n] = 1.0f;
    CHECK(run_amx(tl, simd_set(), W, NL_FWD, xf, K, split, 2, yf) == 0);
    CHECK(run_amx(tl, simd_set(), W, NL_BWD, xb, N, split, 3, yb) == 0);
    int same = 1, eff = 1;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            const float f = yf[(size_t)k * N + n], b = yb[(size_t)n * K + k];
            const float wv = W->wd[(size_t)n * K + k];
            /* the products of the other elements are zeros: +0 + hi (+ lo) */
            float want = m_ftz(0.0f + m_in(m_plane(wv, 0)));
            if (split) want = g_sme ? bf_round_op(want, m_in(m_plane(wv, 1)), 0) : m_ftz(want + m_in(m_plane(wv, 1)));
            same &= !memcmp(&f, &b, 4);
            if (exact) eff &= !memcmp(&f, &want, 4);
        }
    CHECKF(same, "%s %s split %d: one-hot FWD and BWD see different weights", tl->name, nl_type_name(W->type), split);
    CHECKF(eff, "%s %s split %d: one-hot weight != the model's effective weight", tl->name, nl_type_name(W->type),
           split);
    if (split && W->type == NL_TYPE_F16) {
        /* hi + lo of an F16 value is the value itself */
        int exact_f16 = 1;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) exact_f16 &= yf[(size_t)k * N + n] == W->wd[(size_t)n * K + k];
        CHECKF(exact_f16, "%s: split-BF16 does not give the F16 weights exactly", tl->name);
    }
    free(xf);
    free(xb);
    free(yf);
    free(yb);
}

/* FP32 denormal activations (the top of their range rounds to the smallest normal BF16 unless
 * read as zero): the scalar set's packing and the SIMD set's give the same bits, the model's. */
static void test_denormal_inputs(void) {
    static const uint32_t den[] = {0x007fffffu, 0x807fffffu, 0x00400000u, 0x80000001u, 0x00018000u};
    weight W;
    make_weight(&W, NL_TYPE_F16, 40, 96);
    /* weights of ±64: a product with the smallest normal BF16 stays normal (the instruction
     * flushes denormal sums), so a denormal read as 2^-126 instead of 0 shows in the output */
    uint16_t *wh = (uint16_t *)(void *)W.w;
    for (int i = 0; i < W.N * W.K; i++) wh[i] = i % 3 ? 0x5400 : 0xd400;
    for (int n = 0; n < W.N; n++)
        nl_type_get(W.type)->to_float(W.w + nl_row_bytes(W.type, W.K) * (size_t)n, W.wd + (size_t)n * W.K, W.K);
    for (int dir = 0; dir < 2; dir++)
        for (int split = 0; split < 2; split++) {
            const int T = 5, R = dir == NL_FWD ? W.K : W.N, O = dir == NL_FWD ? W.N : W.K;
            float *x = malloc(sizeof(float) * T * R), *y1 = malloc(sizeof(float) * T * O),
                  *y2 = malloc(sizeof(float) * T * O), *ym = malloc(sizeof(float) * T * O);
            nl_t_fill(x, (int64_t)T * R, 1.0);
            for (int i = 0; i < T * R; i += 3) memcpy(&x[i], &den[(i / 3) % 5], 4);
            for (int i = 0; i < R; i++) memcpy(&x[i], &den[0], 4); /* row 0: denormals alone */
            CHECK(run_amx(&nl_amx_tiles_emu_chain, &nl_host_kernels_scalar, &W, (nl_dir)dir, x, T, split, 1, y1) == 0);
            CHECK(run_amx(&nl_amx_tiles_emu_chain, simd_set(), &W, (nl_dir)dir, x, T, split, 2, y2) == 0);
            model((nl_dir)dir, W.wd, W.N, W.K, x, T, split, ym);
            CHECKF(!memcmp(y1, y2, sizeof(float) * T * O),
                   "denormal inputs dir %d split %d: scalar and SIMD packing differ", dir, split);
            CHECKF(!memcmp(y1, ym, sizeof(float) * T * O), "denormal inputs dir %d split %d: not the model's bits", dir,
                   split);
            free(x), free(y1), free(y2), free(ym);
        }
    free_weight(&W);
}

static void test_kernels(const nl_amx_tiles *tl, int exact) {
    /* odd shapes: N, K, T not multiples of 16/32/64 where the type allows; K past 256 (the FWD
     * pairs path decodes 256 columns at a time: a second, partial chunk) */
    const struct {
        int N, K, T;
    } any_k[] = {{37, 45, 5}, {70, 300, 33}, {16, 64, 1}}, blk32[] = {{37, 96, 5}, {70, 288, 33}},
      blk256[] = {{19, 256, 17}, {45, 512, 3}};
    for (size_t ti = 0; ti < sizeof all_types / sizeof *all_types; ti++) {
        const int type = all_types[ti], blck = nl_type_get(type)->blck;
        const int ns = blck == 1 ? 3 : 2;
        for (int si = 0; si < ns; si++) {
            const int N = blck == 1 ? any_k[si].N : blck == 32 ? blk32[si].N : blk256[si].N;
            const int K = blck == 1 ? any_k[si].K : blck == 32 ? blk32[si].K : blk256[si].K;
            const int T = blck == 1 ? any_k[si].T : blck == 32 ? blk32[si].T : blk256[si].T;
            weight W;
            make_weight(&W, type, N, K);
            for (int split = 0; split < 2; split++) {
                check_kernel(tl, exact, &W, NL_FWD, T, split);
                check_kernel(tl, exact, &W, NL_BWD, T, split);
                if (si == 0) check_onehot(tl, exact, &W, split);
            }
            free_weight(&W);
        }
    }
    /* X past 1 MiB of BF16 rows: the FWD packs several panels per pass (proj/amx.c fwd_group),
     * N not a multiple of 32 so a group ends in a short panel; split too (its groups hold hi and
     * lo panels: 6 at K = 1024, so one thread's 10 panels make a group of 6 and one of 4), Q8_0 */
    const int big_types[] = {NL_TYPE_Q8_0, NL_TYPE_Q4_K};
    for (size_t ti = 0; ti < sizeof big_types / sizeof *big_types; ti++) {
        weight W;
        /* under qemu (NL_TEST_SMALL) 70 rows: 3 panels, still a short last one */
        make_weight(&W, big_types[ti], getenv("NL_TEST_SMALL") ? 70 : 300, 1024);
        check_kernel(tl, exact, &W, NL_FWD, 520, 0);
        /* (not under qemu: the split case doubled test_amx's 163 s there; every x86 run has it) */
        if (ti == 0 && !getenv("NL_TEST_SMALL")) check_kernel(tl, exact, &W, NL_FWD, 520, 1);
        free_weight(&W);
    }
    printf("%s: F16 weights, worst |y - ref| / sum|x*w|: bf16 tiles %.3g, split-bf16 %.3g\n", tl->name, worst_plain_f16,
           worst_split_f16);
    worst_plain_f16 = worst_split_f16 = 0;
}

/* ---- the host backend in amx-emu mode ---- */

/* mode: "amx-emu" or "sme"; tl its tiles; d_main/d_rec: what describe says of them */
static void test_host_mode(const char *mode, const nl_amx_tiles *tl, const char *d_main, const char *d_rec) {
    void *ctx = NULL, *ref32 = NULL;
    CHECK(nl_proj_backend_host.init(&ctx, 2, mode) == 0);
    CHECK(nl_proj_backend_host.init(&ref32, 2, "f32") == 0);
    CHECK(!strcmp(nl_proj_host_compute(ctx), mode));
    char d[256];
    nl_proj_host_describe(ctx, d, sizeof d);
    CHECKF(strstr(d, d_main) && strstr(d, d_rec), "%s", d);
    if (!strcmp(mode, "amx-emu") && !nl_proj_host_cpu_has("amx")) {
        CHECK(nl_proj_host_configure(ctx, NULL, "amx") == -1);
        CHECKF(strstr(nl_last_error(), "amx-emu") != NULL, "%s", nl_last_error());
        nl_clear_error();
    }
    const int T = 9;
    struct {
        int type, cls, split;
    } cases[] = {
        {NL_TYPE_Q8_0, NL_CLASS_MLP, 0}, {NL_TYPE_F16, NL_CLASS_RECURRENT, 1}, {NL_TYPE_Q6_K, NL_CLASS_HEAD, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        weight W;
        make_weight(&W, cases[i].type, 40, 256);
        nl_proj_weight v = view(&W, cases[i].cls);
        for (int dir = 0; dir < 2; dir++) {
            const int R = dir == NL_FWD ? W.K : W.N, O = dir == NL_FWD ? W.N : W.K;
            float *x = malloc(sizeof(float) * T * R), *y = malloc(sizeof(float) * T * O),
                  *ya = malloc(sizeof(float) * T * O);
            nl_t_fill(x, (int64_t)T * R, 1.0);
            CHECK(nl_proj_backend_host.run(ctx, &v, (nl_dir)dir, x, T, y) == 0);
            CHECK(run_amx(tl, simd_set(), &W, (nl_dir)dir, x, T, cases[i].split, 2, ya) == 0);
            CHECKF(!memcmp(y, ya, sizeof(float) * T * O), "host %s %s class %d dir %d: not the tile kernel's bits",
                   mode, nl_type_name(cases[i].type), cases[i].cls, dir);
            const double tol = nl_proj_host_rel_tol_for(ctx, &v, R);
            CHECKF(rel_err(&W, (nl_dir)dir, x, T, y) <= tol, "host %s %s: error above its own bound %g", mode,
                   nl_type_name(cases[i].type), tol);
            free(x);
            free(y);
            free(ya);
        }
        free_weight(&W);
    }
    /* F32 weights stay on the FP32 vector kernels */
    weight W;
    make_weight(&W, NL_TYPE_F32, 33, 70);
    nl_proj_weight v = view(&W, NL_CLASS_ATTN);
    float x[4 * 70], y[4 * 33], y32[4 * 33];
    nl_t_fill(x, 4 * 70, 1.0);
    CHECK(nl_proj_backend_host.run(ctx, &v, NL_FWD, x, 4, y) == 0);
    CHECK(nl_proj_backend_host.run(ref32, &v, NL_FWD, x, 4, y32) == 0);
    CHECKF(!memcmp(y, y32, sizeof y), "%s: an F32 weight did not take the f32 path", mode);
    free_weight(&W);
    nl_proj_backend_host.free(ctx);
    nl_proj_backend_host.free(ref32);
}

/* The service with the host backend in amx-emu mode: every planner check passes. */
static void test_service(void) {
    nl_proj_config cfg = {.backend = "host", .n_threads = 2, .compute = "amx-emu"};
    nl_proj_service *s = nl_proj_service_new(&cfg);
    CHECK(s != NULL);
    weight ws[4];
    const struct {
        int type, N, K, cls;
    } spec[] = {{NL_TYPE_F32, 48, 64, NL_CLASS_ATTN},
                {NL_TYPE_F16, 40, 96, NL_CLASS_RECURRENT},
                {NL_TYPE_Q4_0, 70, 64, NL_CLASS_MLP},
                {NL_TYPE_Q4_K, 33, 256, NL_CLASS_HEAD}};
    for (int i = 0; i < 4; i++) {
        make_weight(&ws[i], spec[i].type, spec[i].N, spec[i].K);
        nl_proj_weight v = view(&ws[i], spec[i].cls);
        CHECK(nl_proj_add(s, &v) == i);
    }
    CHECK(!strcmp(nl_proj_compute(s), "amx-emu"));
    const int buckets[] = {1, 16, 40};
    CHECKF(nl_proj_plan(s, buckets, 3) == 0, "%s", nl_last_error());
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(s, &tot);
    CHECKF(tot.checks == 4 * 2 * 3 && tot.passed == tot.checks, "%d checks, %d passed", tot.checks, tot.passed);
    nl_proj_service_free(s);
    for (int i = 0; i < 4; i++) free_weight(&ws[i]);
}

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The CLI: check and a short training run on the emulated kernels. */
static void test_cli(void) {
    char dir[] = "/tmp/nl_amx_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    char cmd[2048], path[256];
    snprintf(cmd, sizeof cmd, "%s mkmodel --arch qwen35 --preset tiny --out %s/m.gguf > /dev/null", NL_CLI, dir);
    CHECK(sh(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s check --model %s/m.gguf --backend host --compute amx-emu > %s/check.txt 2>&1", NL_CLI,
             dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/check.txt", dir);
    CHECKF(nl_t_file_has(path, "amx-bf16 (emulated) for attn/mlp/head"), "check does not name the kernels");
    CHECKF(nl_t_file_has(path, " 0 routed to CPU"), "check routed a projection away from the emulated kernels");
    snprintf(cmd, sizeof cmd,
             "printf '{\"text\": \"hello tiles\"}\\n{\"text\": \"one more line\"}\\n' > %s/d.jsonl && "
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/a.gguf --steps 3 --stop-after 2 --backend host "
             "--compute amx-emu --checkpoint-dir %s/ck > %s/train.txt 2>&1",
             dir, NL_CLI, dir, dir, dir, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/train.txt", dir);
    CHECKF(
        nl_t_file_has(
            path, "service: host backend, amx-bf16 (emulated) for attn/mlp/head, split-bf16 (emulated) for recurrent"),
        "train does not print the kernels");
    CHECKF(nl_t_file_has(path, "attention and lora on amx-emu tiles"), "train does not say the nodes run on the tiles");
    CHECKF(nl_t_file_has(path, "step 2/3"), "the training run did not run its steps");
    /* NL_AMX_NODES=off: the service on the tiles, the nodes on the vector paths */
    snprintf(cmd, sizeof cmd,
             "NL_AMX_NODES=off %s train --model %s/m.gguf --data %s/d.jsonl --out %s/a2.gguf --steps 1 --backend host "
             "--compute amx-emu > %s/train2.txt 2>&1",
             NL_CLI, dir, dir, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/train2.txt", dir);
    CHECKF(nl_t_file_has(path, "amx-bf16 (emulated) for attn/mlp/head") && nl_t_file_has(path, "attention f32") &&
               !nl_t_file_has(path, "attention and lora on"),
           "NL_AMX_NODES=off: the nodes not on the vector paths");
    snprintf(path, sizeof path, "%s/ck/run.json", dir);
    CHECKF(nl_t_file_has(path, "\"kernels\": \"host: amx-bf16 (emulated)"), "run.json does not record the kernels");
    CHECKF(nl_t_file_has(path, "; attention and lora on amx-emu tiles\""),
           "run.json does not record the nodes' kernels");
    /* a resume with other kernels is refused, unless asked to continue with them */
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/a.gguf --steps 3 --backend host --compute f32 "
             "--checkpoint-dir %s/ck --resume > %s/resume.txt 2>&1",
             NL_CLI, dir, dir, dir, dir, dir);
    CHECK(sh(cmd) != 0);
    snprintf(path, sizeof path, "%s/resume.txt", dir);
    CHECKF(nl_t_file_has(path, "--allow-kernel-change"), "the refused resume does not say how to continue");
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/a.gguf --steps 3 --backend host --compute f32 "
             "--checkpoint-dir %s/ck --resume --allow-kernel-change > %s/resume2.txt 2>&1",
             NL_CLI, dir, dir, dir, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/resume2.txt", dir);
    CHECKF(nl_t_file_has(path, "warning: resuming on other kernels") && nl_t_file_has(path, "done after 3/3 steps"),
           "the resume with other kernels did not warn and finish");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(sh(cmd) == 0);
}

/* The kernel sets' to_bf16_lo (the split form's lo plane) against its scalar rule on random bit
 * patterns (NaNs, infinities, denormals, ties among them), with hi = bf16(src) and with any hi,
 * an odd n (the tail). */
static uint32_t lo_bits(void) {
    static uint64_t st = 0x9e3779b97f4a7c15ull;
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (uint32_t)(st >> 16);
}

static void test_bf16_lo(void) {
    const nl_host_kernels *sets[] = {&nl_host_kernels_scalar, simd_set()};
    enum { N = 4099 };
    float *src = malloc(sizeof(float) * N);
    uint16_t *hi = malloc(2 * N), *lo = malloc(2 * N);
    int tested = 0;
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        if (!sets[k]->to_bf16_lo) continue;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < N; i++) {
                uint32_t u = lo_bits();
                if (i % 7 == 0) u &= 0x807fffffu;                 /* a denormal (or zero) */
                if (i % 11 == 0) u = (u & 0xffff0000u) | 0x8000u; /* a tie, hi = bf16(src) below */
                if (i % 13 == 0) u |= 0x7f800000u;                /* an infinity or a NaN */
                memcpy(&src[i], &u, 4);
                hi[i] = pass ? (uint16_t)lo_bits() : (uint16_t)(u >> 16); /* truncated: the rest is a tie or not */
            }
            sets[k]->to_bf16_lo(src, hi, N, lo);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                const uint32_t b = (uint32_t)hi[i] << 16;
                float f;
                memcpy(&f, &b, 4);
                bad += lo[i] != nl_host_f32_to_bf16(src[i] - f);
            }
            CHECKF(bad == 0, "%s to_bf16_lo pass %d: %d of %d values differ from the scalar rule", sets[k]->name, pass,
                   bad, N);
            tested++;
        }
    }
    if (!tested) printf("to_bf16_lo: no kernel set here has it\n");
    free(src);
    free(hi);
    free(lo);
}

int main(void) {
    test_config();
    test_tile_op();
    test_bf16_lo();
    test_kernels(&nl_amx_tiles_emu_chain, 1); /* bit for bit against the chain model */
    test_denormal_inputs();
    /* what the tests check on the real instructions holds on the hardware's reading too */
    test_kernels(&nl_amx_tiles_emu, 0);
    test_real_tile_op();
    char why[192];
    if (nl_amx_available(why, sizeof why)) {
#if defined(NL_HAVE_AMX)
        test_kernels(&nl_amx_tiles_real, 0);
#endif
    } else {
        printf("real AMX not run here: %s\n", why);
    }
    test_host_mode("amx-emu", &nl_amx_tiles_emu, "amx-bf16 (emulated) for attn/mlp/head",
                   "split-bf16 (emulated) for recurrent");
    /* Arm SME (kernels_sme.c): the same tests, the model on BFMOPA's arithmetic, bit for bit */
    if (nl_sme_available(why, sizeof why)) {
        const nl_amx_tiles *sme = nl_amx_tiles_of("sme");
        CHECK(sme != NULL);
        if (sme) {
            g_sme = 1;
            test_kernels(sme, 1);
            g_sme = 0;
            test_host_mode("sme", sme, "sme-bf16 for attn/mlp/head", "split-bf16 for recurrent");
        }
    } else {
        printf("SME not run here: %s\n", why);
    }
    test_service();
    test_cli();
    return nl_t_done();
}

/* nn/lora and util/rng: the LoRA node against a float64 reference (with the same dropout mask,
 * regenerated through nl_lora_dropout_mask), its backward against float64 central finite
 * differences, mask reproducibility, p = 0 fast path identity; the counter-based RNG's
 * determinism and distributions. The rank-r products on the tiles (cpu/tiles.h): on the emulator
 * against the plain C model of the tile product bit for bit (forward, backward, with and
 * without dropout), against float64 within the BF16 bound, the split API bit for bit; real
 * AMX within the bound where this CPU has it. At rank 16 the kernel row's LoRA products
 * (cpu/lora_avx512.c) against the nl_gemm calls they replace, bit for bit. */
#include "cpu/amx.h"
#include "cpu/gemm_bf16.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"
#include "model/adapter.h"
#include "nn/lora.h"
#include "util/rng.h"
#include "test.h"
#include "tile_model.h"

#include <stdint.h>

static double rel_err(const float *a, const double *b, int64_t n) { return nl_t_rel_err(a, b, n, 1e-6); }

/* ------------------------------------------------------------------------- RNG */
static void test_rng(void) {
    const uint64_t k1 = nl_rng_key4(42, 1, 2, 3, 4), k1b = nl_rng_key4(42, 1, 2, 3, 4);
    CHECK(k1 == k1b);
    CHECK(nl_rng_key4(42, 2, 1, 3, 4) != k1); /* order matters */
    CHECK(nl_rng_key4(43, 1, 2, 3, 4) != k1);
    CHECK(nl_rng_key_add(nl_rng_key_add(nl_rng_key_add(nl_rng_key_add(nl_rng_key(42), 1), 2), 3), 4) == k1);
    CHECK(nl_rng_u64(k1, 7) == nl_rng_u64(k1, 7));
    CHECK(nl_rng_u64(k1, 7) != nl_rng_u64(k1, 8));
    /* splitmix64 reference value: the stream of seed 0 starts 0xE220A8397B1DCDAF */
    CHECK(nl_rng_mix64(0x9E3779B97F4A7C15ULL) == 0xE220A8397B1DCDAFULL);
    enum { N = 20000 };
    float *u = malloc(sizeof(float) * N), *g = malloc(sizeof(float) * N);
    nl_rng_fill_uniform(u, N, k1, 100);
    nl_rng_fill_normal(g, N, k1, 100);
    double su = 0, sg = 0, sg2 = 0;
    int in01 = 1, same = 1;
    for (int i = 0; i < N; i++) {
        in01 &= u[i] >= 0.0f && u[i] < 1.0f;
        su += u[i];
        sg += g[i];
        sg2 += (double)g[i] * g[i];
        if (i % 997 == 0)
            same &= u[i] == nl_rng_uniform(k1, 100 + (uint64_t)i) && g[i] == nl_rng_normal(k1, 100 + (uint64_t)i);
    }
    CHECK(in01);
    CHECK(same);
    CHECK_NEAR(su / N, 0.5, 0.01);  /* sd of the mean ≈ 0.002 */
    CHECK_NEAR(sg / N, 0.0, 0.03);  /* ≈ 0.007 */
    CHECK_NEAR(sg2 / N, 1.0, 0.05); /* ≈ 0.01 */
    free(u);
    free(g);
}

/* ------------------------------------------------------------------------- LoRA reference */
typedef struct {
    int T, K, N, r;
    double s;
    const float *m;
} lora_shape; /* m[T][K] mask */

/* y = y0 + s · ((m⊙x) Aᵀ) Bᵀ; also u when u != NULL */
static void lora_ref(double *y, double *u, const double *y0, const double *x, const double *A, const double *B,
                     const lora_shape *c) {
    double *ur = malloc(sizeof(double) * c->r);
    for (int t = 0; t < c->T; t++) {
        for (int k = 0; k < c->r; k++) {
            double a = 0;
            for (int i = 0; i < c->K; i++) a += A[k * c->K + i] * (c->m[t * c->K + i] * x[t * c->K + i]);
            ur[k] = a;
            if (u) u[t * c->r + k] = a;
        }
        for (int o = 0; o < c->N; o++) {
            double a = 0;
            for (int k = 0; k < c->r; k++) a += ur[k] * B[o * c->r + k];
            y[t * c->N + o] = (y0 ? y0[t * c->N + o] : 0.0) + c->s * a;
        }
    }
    free(ur);
}

static void test_mask(void) {
    nl_lora L = {5000, 3, 2, 2.0f, 0.3f, nl_lora_dropout_key(7, 11, 3, 1), NULL, 0, NULL, NULL};
    float *m1 = malloc(sizeof(float) * 5000), *m2 = malloc(sizeof(float) * 5000), *m3 = malloc(sizeof(float) * 5000);
    nl_lora_dropout_mask(&L, 17, m1);
    nl_lora_dropout_mask(&L, 17, m2);
    nl_lora_dropout_mask(&L, 18, m3);
    CHECK(memcmp(m1, m2, sizeof(float) * 5000) == 0); /* same key -> same mask */
    CHECK(memcmp(m1, m3, sizeof(float) * 5000) != 0); /* another token -> another mask */
    int zeros = 0, vals = 1;
    const float inv = 1.0f / (1.0f - 0.3f);
    for (int i = 0; i < 5000; i++) {
        zeros += m1[i] == 0.0f;
        vals &= m1[i] == 0.0f || m1[i] == inv;
    }
    CHECK(vals);
    CHECKF(zeros > 1350 && zeros < 1650, "dropped %d of 5000 at p = 0.3", zeros); /* sd ≈ 32 */
    /* another step / layer / projection -> another mask */
    nl_lora L2 = L;
    L2.key = nl_lora_dropout_key(7, 12, 3, 1);
    nl_lora_dropout_mask(&L2, 17, m2);
    CHECK(memcmp(m1, m2, sizeof(float) * 5000) != 0);
    L2.key = nl_lora_dropout_key(7, 11, 3, 2);
    nl_lora_dropout_mask(&L2, 17, m2);
    CHECK(memcmp(m1, m2, sizeof(float) * 5000) != 0);
    L2.dropout = 0.0f;
    nl_lora_dropout_mask(&L2, 17, m2);
    int ones = 1;
    for (int i = 0; i < 5000; i++) ones &= m2[i] == 1.0f;
    CHECK(ones);
    free(m1), free(m2), free(m3);
}

/* The kernel row's dropout_apply_row (the node's one-pass mask, x ⊙ m and BF16 packing) against
 * the separate passes, bit for bit: the mask of nl_lora_dropout_mask, the FP32 product, cpu/amx.h's
 * rounding; every output alone and together, x with NaN, ±inf, denormals and −0. */
static void test_dropout_apply(void) {
    int (*apply)(uint64_t, int, uint32_t, float, const float *, float *, float *, uint32_t *, uint16_t *) =
        nl_cpu_kernels()->dropout_apply_row;
    if (!apply) {
        printf("no dropout_apply_row in this kernel row: the node's separate passes\n");
        return;
    }
    const int K = 1000;
    nl_lora L = {K, 3, 2, 2.0f, 0.2f, nl_lora_dropout_key(9, 1, 2, 3), NULL, 0, NULL, NULL};
    const uint32_t thr = (uint32_t)floor((double)L.dropout * 4294967296.0 + 0.5);
    const float inv = 1.0f / (1.0f - L.dropout);
    float *x = malloc(sizeof(float) * K), *m = malloc(sizeof(float) * K), *xm = malloc(sizeof(float) * K);
    float *m2 = malloc(sizeof(float) * K), *xm2 = malloc(sizeof(float) * K);
    uint32_t *w = malloc(sizeof(uint32_t) * K), *w2 = malloc(sizeof(uint32_t) * K);
    nl_t_fill(x, K, 3.0);
    const uint32_t odd[] = {0x7fc00001u, 0xff800000u, 0x7f800000u, 0x00000001u, 0x807fffffu, 0x80000000u,
                            0x7f7fffffu, 0x3f80ffffu, 0x3f808000u, 0x3f818000u, 0x7f800001u};
    for (int i = 0; i < (int)(sizeof odd / sizeof odd[0]); i++) memcpy(&x[7 * i + 3], &odd[i], 4);
    for (int64_t tok = 0; tok < 3; tok++) {
        nl_lora_dropout_mask(&L, tok, m2);
        const uint64_t kt = nl_rng_key_add(L.key, (uint64_t)tok);
        for (int i = 0; i < K; i++) xm2[i] = x[i] * m2[i];
        for (int i = 0; i + 1 < K; i += 2)
            w2[i / 2] = (uint32_t)nl_amx_f32_to_bf16(xm2[i]) | (uint32_t)nl_amx_f32_to_bf16(xm2[i + 1]) << 16;
        for (int mode = 1; mode < 8; mode++) {
            memset(m, 0xAB, sizeof(float) * K), memset(xm, 0xAB, sizeof(float) * K), memset(w, 0xAB, 4 * (size_t)K);
            const int n =
                apply(kt, K, thr, inv, x, mode & 1 ? m : NULL, mode & 2 ? xm : NULL, mode & 4 ? w : NULL, NULL);
            CHECKF(n % 16 == 0 && n <= K && n >= K - 15, "dropout_apply_row did %d of %d", n, K);
            if (mode & 1)
                CHECKF(memcmp(m, m2, sizeof(float) * (size_t)n) == 0, "dropout_apply_row mask, mode %d", mode);
            if (mode & 2)
                CHECKF(memcmp(xm, xm2, sizeof(float) * (size_t)n) == 0, "dropout_apply_row x*m, mode %d", mode);
            if (mode & 4) CHECKF(memcmp(w, w2, 2 * (size_t)n) == 0, "dropout_apply_row bf16, mode %d", mode);
        }
    }
    free(x), free(m), free(xm), free(m2), free(xm2), free(w), free(w2);
}

/* The kernel row's dropout_mask_row and dropout_apply_row (with its kept bits) and dropout_bits_row
 * (from those bits) against the scalar rule written out here
 * (nl_rng_u64's halves >= thr, the FP32 product, nl_amx_f32_to_bf16), element by element, over
 * K = 1..70 and 1000 (every lane of the 16 and each tail length), three thresholds (0: all kept),
 * x with NaN, ±inf, denormals and −0 moving through the lanes as K changes. */
static int dropout_row_ok(uint64_t kt, int K, uint32_t thr, float inv, const float *x, int n, const float *m,
                          const float *xm, const uint32_t *w, const uint16_t *kb) {
    for (int i = 0; i < n; i++) {
        const uint64_t v = nl_rng_u64(kt, (uint64_t)(i >> 1));
        const int keep = (uint32_t)(i & 1 ? v >> 32 : v) >= thr;
        const float mi = keep ? inv : 0.0f, pi = x[i] * mi;
        const uint16_t wi = w ? (uint16_t)(w[i / 2] >> (i & 1 ? 16 : 0)) : 0;
        if (kb && (kb[i / 16] >> (i % 16) & 1) != keep) return printf("  K %d: kept bit %d differs\n", K, i), 0;
        if (m && memcmp(&m[i], &mi, 4)) return printf("  K %d: mask[%d] %g, want %g\n", K, i, m[i], mi), 0;
        if (xm && memcmp(&xm[i], &pi, 4)) return printf("  K %d: x*m[%d] differs\n", K, i), 0;
        if (w && wi != nl_amx_f32_to_bf16(pi))
            return printf("  K %d: bf16[%d] %04x, want %04x\n", K, i, wi, nl_amx_f32_to_bf16(pi)), 0;
    }
    return 1;
}

static void test_dropout_rows(void) {
    const nl_host_kernels *ks = nl_cpu_kernels();
    if (!ks->dropout_mask_row && !ks->dropout_apply_row) {
        printf("no dropout rows in this kernel row: the node's scalar loop\n");
        return;
    }
    const int KMAX = 1000;
    float *x = malloc(sizeof(float) * KMAX), *m = malloc(sizeof(float) * KMAX), *xm = malloc(sizeof(float) * KMAX);
    uint32_t *w = malloc(sizeof(uint32_t) * KMAX);
    uint16_t *kb = malloc(sizeof(uint16_t) * KMAX);
    const uint32_t odd[] = {0x7fc00001u, 0xff800000u, 0x7f800000u, 0x00000001u, 0x807fffffu,
                            0x80000000u, 0x7f7fffffu, 0x3f80ffffu, 0x3f808000u, 0x3f818000u,
                            0x7f800001u, 0xffc00000u, 0x00800000u, 0x3f807fffu, 0xbf808000u};
    const uint32_t thrs[] = {214748365u, 0x80000000u, 0u};
    int bad = 0, rows = 0;
    for (int K = 1; K <= KMAX && !bad; K = K < 70 ? K + 1 : K == 70 ? KMAX : KMAX + 1) {
        nl_t_fill(x, K, 2.0);
        for (int i = K % 5; i < K; i += 5) memcpy(&x[i], &odd[(i / 5 + K) % 15], 4);
        for (int q = 0; q < 3 && !bad; q++) {
            const uint32_t thr = thrs[q];
            const float inv = 1.0f / (1.0f - (float)((double)thr / 4294967296.0));
            const uint64_t kt = nl_rng_key_add(nl_lora_dropout_key(5, 6, 7, 8), (uint64_t)(K * 3 + q));
            if (ks->dropout_mask_row) {
                memset(m, 0xAB, sizeof(float) * KMAX);
                const int n = ks->dropout_mask_row(kt, K, thr, inv, m);
                CHECKF(n % 16 == 0 && n <= K && n > K - 16, "dropout_mask_row did %d of %d", n, K);
                bad |= !dropout_row_ok(kt, K, thr, inv, x, n, m, NULL, NULL, NULL), rows++;
            }
            for (int mode = 1; ks->dropout_apply_row && mode < 16 && !bad; mode++) {
                memset(m, 0xAB, sizeof(float) * KMAX), memset(xm, 0xAB, sizeof(float) * KMAX);
                memset(w, 0xAB, sizeof(uint32_t) * KMAX), memset(kb, 0xAB, sizeof(uint16_t) * KMAX);
                float *mo = mode & 1 ? m : NULL, *xo = mode & 2 ? xm : NULL;
                uint32_t *wo = mode & 4 ? w : NULL;
                uint16_t *ko = mode & 8 ? kb : NULL;
                const int n = ks->dropout_apply_row(kt, K, thr, inv, x, mo, xo, wo, ko);
                CHECKF(n % 16 == 0 && n <= K && n > K - 16, "dropout_apply_row did %d of %d", n, K);
                bad |= !dropout_row_ok(kt, K, thr, inv, x, n, mo, xo, wo, ko), rows++;
                for (int i = n; i < KMAX; i++) { /* nothing past the count: the node writes the rest */
                    uint32_t a, b;
                    memcpy(&a, &m[i], 4), memcpy(&b, &xm[i], 4);
                    bad |= a != 0xABABABABu || b != 0xABABABABu || (i >= n / 2 && w[i] != 0xABABABABu) ||
                           (i >= n / 16 && kb[i] != 0xABABu);
                }
                if (mode == 8 && ks->dropout_bits_row) { /* the kept bits back into the mask and x ⊙ m */
                    memset(m, 0xAB, sizeof(float) * KMAX), memset(xm, 0xAB, sizeof(float) * KMAX);
                    const int nb = ks->dropout_bits_row(kb, n, inv, x, m, xm);
                    CHECKF(nb == n, "dropout_bits_row did %d of %d", nb, n);
                    bad |= !dropout_row_ok(kt, K, thr, inv, x, nb, m, xm, NULL, NULL), rows++;
                    for (int i = nb; i < KMAX; i++) {
                        uint32_t a, b;
                        memcpy(&a, &m[i], 4), memcpy(&b, &xm[i], 4);
                        bad |= a != 0xABABABABu || b != 0xABABABABu;
                    }
                }
                for (int acc = 0; mode == 8 && ks->dropout_bits_madd && acc < 2; acc++) { /* dx through them */
                    float *d = malloc(sizeof(float) * KMAX), *d2 = malloc(sizeof(float) * KMAX);
                    nl_t_fill(d, K, 1.0), memcpy(d2, d, sizeof(float) * (size_t)K);
                    const int nd = ks->dropout_bits_madd(kb, n, inv, x, d, acc);
                    CHECKF(nd == n, "dropout_bits_madd did %d of %d", nd, n);
                    for (int i = 0; i < nd; i++) {
                        const uint64_t v = nl_rng_u64(kt, (uint64_t)(i >> 1));
                        const float mi = (uint32_t)(i & 1 ? v >> 32 : v) >= thr ? inv : 0.0f, pi = x[i] * mi;
                        const float want = acc ? d2[i] + pi : pi;
                        bad |= memcmp(&d[i], &want, 4) != 0;
                    }
                    bad |= memcmp(d + nd, d2 + nd, sizeof(float) * (size_t)(K - nd)) != 0, rows++;
                    free(d), free(d2);
                }
            }
        }
    }
    CHECKF(!bad, "dropout rows against the scalar rule (%d rows checked)", rows);
    free(x), free(m), free(xm), free(w), free(kb);
}

/* Forward vs reference, then backward vs finite differences, for one (shape, p). */
static void check_lora(int T, int K, int N, int r, float p, int64_t tok0) {
    nl_lora L = {K, N, r, 16.0f / (float)r, p, nl_lora_dropout_key(1234, 5, 2, 3), NULL, 0, NULL, NULL};
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r;
    float *x = malloc(sizeof(float) * nx), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *y = malloc(sizeof(float) * ny), *y0 = malloc(sizeof(float) * ny), *u = malloc(sizeof(float) * T * r);
    float *m = malloc(sizeof(float) * nx);
    nl_t_fill(x, nx, 1.0);
    nl_t_fill(A, na, 0.5);
    nl_t_fill(B, nb, 0.5);
    nl_t_fill(y0, ny, 1.0);
    for (int t = 0; t < T; t++) nl_lora_dropout_mask(&L, tok0 + t, m + (int64_t)t * K);
    lora_shape c = {T, K, N, r, L.scale, m};
    double *xd = nl_t_to_d(x, nx), *Ad = nl_t_to_d(A, na), *Bd = nl_t_to_d(B, nb), *y0d = nl_t_to_d(y0, ny);
    double *yr = malloc(sizeof(double) * ny), *ur = malloc(sizeof(double) * T * r);
    lora_ref(yr, ur, y0d, xd, Ad, Bd, &c);
    memcpy(y, y0, sizeof(float) * ny);
    CHECK(nl_lora_forward(&L, A, B, y, u, x, T, tok0) == 0);
    CHECKF(rel_err(y, yr, ny) < 2e-6, "lora fwd T=%d K=%d N=%d r=%d p=%g err %g", T, K, N, r, p, rel_err(y, yr, ny));
    CHECKF(rel_err(u, ur, T * r) < 2e-6, "lora u err %g", rel_err(u, ur, T * r));

    /* token rows processed in two calls (tok0 offsets) reproduce one call bit for bit */
    float *y2 = malloc(sizeof(float) * ny), *u2 = malloc(sizeof(float) * T * r);
    memcpy(y2, y0, sizeof(float) * ny);
    const int T1 = T / 2;
    CHECK(nl_lora_forward(&L, A, B, y2, u2, x, T1, tok0) == 0);
    CHECK(nl_lora_forward(&L, A, B, y2 + (int64_t)T1 * N, u2 + (int64_t)T1 * r, x + (int64_t)T1 * K, T - T1,
                          tok0 + T1) == 0);
    CHECK(memcmp(y, y2, sizeof(float) * ny) == 0);
    CHECK(memcmp(u, u2, sizeof(float) * T * r) == 0);

    /* backward: L = Σ dy·y; gradients accumulate onto nonzero buffers */
    float *dy = malloc(sizeof(float) * ny), *dx = malloc(sizeof(float) * nx), *dA = malloc(sizeof(float) * na);
    float *dB = malloc(sizeof(float) * nb), *dx0 = malloc(sizeof(float) * nx), *dA0 = malloc(sizeof(float) * na);
    float *dB0 = malloc(sizeof(float) * nb);
    nl_t_fill(dy, ny, 1.0);
    nl_t_fill(dx0, nx, 1.0);
    nl_t_fill(dA0, na, 1.0);
    nl_t_fill(dB0, nb, 1.0);
    memcpy(dx, dx0, sizeof(float) * nx);
    memcpy(dA, dA0, sizeof(float) * na);
    memcpy(dB, dB0, sizeof(float) * nb);
    CHECK(nl_lora_backward(&L, A, B, dx, dA, dB, dy, x, u, T, tok0) == 0);
    const double h = 1e-5;
    double *yp = malloc(sizeof(double) * ny);
    double *bufs[3] = {xd, Ad, Bd};
    const int64_t ns[3] = {nx, na, nb};
    const float *got[3] = {dx, dA, dB}, *base[3] = {dx0, dA0, dB0};
    for (int which = 0; which < 3; which++) {
        double *g = malloc(sizeof(double) * ns[which]), *v = bufs[which];
        float *diff = malloc(sizeof(float) * ns[which]);
        for (int64_t j = 0; j < ns[which]; j++) {
            const double keep = v[j];
            double lp = 0, lm = 0;
            v[j] = keep + h;
            lora_ref(yp, NULL, NULL, xd, Ad, Bd, &c);
            for (int64_t i = 0; i < ny; i++) lp += yp[i] * dy[i];
            v[j] = keep - h;
            lora_ref(yp, NULL, NULL, xd, Ad, Bd, &c);
            for (int64_t i = 0; i < ny; i++) lm += yp[i] * dy[i];
            v[j] = keep;
            g[j] = (lp - lm) / (2 * h);
            diff[j] = got[which][j] - base[which][j]; /* what the call added */
        }
        CHECKF(rel_err(diff, g, ns[which]) < 5e-5, "lora bwd (%d) T=%d K=%d p=%g err %g", which, T, K, p,
               rel_err(diff, g, ns[which]));
        free(g);
        free(diff);
    }
    /* u = NULL (recompute) gives the same bits; dx = NULL skips dx */
    float *dxb = malloc(sizeof(float) * nx), *dAb = malloc(sizeof(float) * na), *dBb = malloc(sizeof(float) * nb);
    memcpy(dxb, dx0, sizeof(float) * nx);
    memcpy(dAb, dA0, sizeof(float) * na);
    memcpy(dBb, dB0, sizeof(float) * nb);
    CHECK(nl_lora_backward(&L, A, B, dxb, dAb, dBb, dy, x, NULL, T, tok0) == 0);
    CHECK(memcmp(dxb, dx, sizeof(float) * nx) == 0);
    CHECK(memcmp(dAb, dA, sizeof(float) * na) == 0);
    CHECK(memcmp(dBb, dB, sizeof(float) * nb) == 0);
    memcpy(dAb, dA0, sizeof(float) * na);
    memcpy(dBb, dB0, sizeof(float) * nb);
    CHECK(nl_lora_backward(&L, A, B, NULL, dAb, dBb, dy, x, u, T, tok0) == 0);
    CHECK(memcmp(dAb, dA, sizeof(float) * na) == 0);

    /* p = 0: the forward is the inference path, bit for bit */
    if (p == 0.0f) {
        memcpy(y2, y0, sizeof(float) * ny);
        CHECK(nl_lora_apply(&L, A, B, y2, x, T) == 0);
        CHECK(memcmp(y, y2, sizeof(float) * ny) == 0);
    } else {
        /* apply ignores dropout: it equals the forward of the same adapter with p = 0 */
        nl_lora L0 = L;
        L0.dropout = 0.0f;
        float *y3 = malloc(sizeof(float) * ny);
        memcpy(y2, y0, sizeof(float) * ny);
        memcpy(y3, y0, sizeof(float) * ny);
        CHECK(nl_lora_apply(&L, A, B, y2, x, T) == 0);
        CHECK(nl_lora_forward(&L0, A, B, y3, NULL, x, T, tok0) == 0);
        CHECK(memcmp(y2, y3, sizeof(float) * ny) == 0);
        CHECK(memcmp(y, y3, sizeof(float) * ny) != 0); /* and dropout did something */
        free(y3);
    }
    free(x), free(A), free(B), free(y), free(y0), free(u), free(m), free(xd), free(Ad), free(Bd), free(y0d);
    free(yr), free(ur), free(y2), free(u2), free(dy), free(dx), free(dA), free(dB), free(dx0), free(dA0), free(dB0);
    free(yp), free(dxb), free(dAb), free(dBb);
}

/* The split API (what train/graph runs on its pool) against the whole calls, bit for bit:
 * forward rows in uneven ranges (run out of order), backward rows then parameter lines in
 * uneven ranges, u given or recomputed, dx or none; and rows gathered out of the sequence with
 * their token indices (toks) equal the full call's rows (backward: the other rows' dy = 0). */
static const nl_amx_tiles *g_tiles; /* check_split's products: NULL FP32, else these tiles */
static int g_bf16;                  /* check_split's and check_tiles' nl_lora.bf16 */
static void check_split(int T, int K, int N, int r, float p, int64_t tok0) {
    nl_lora L = {K, N, r, 8.0f / (float)r, p, nl_lora_dropout_key(77, 3, 1, 4), g_tiles, g_bf16, NULL, NULL};
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r;
    float *x = malloc(sizeof(float) * nx), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *y = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny), *u = malloc(sizeof(float) * T * r),
          *u2 = malloc(sizeof(float) * T * r), *dy = malloc(sizeof(float) * ny);
    nl_t_fill(x, nx, 1.0), nl_t_fill(A, na, 0.5), nl_t_fill(B, nb, 0.5), nl_t_fill(dy, ny, 1.0);
    for (int acc = 0; acc < 2; acc++) {
        nl_t_fill(y, ny, 1.0);
        memcpy(y2, y, sizeof(float) * ny);
        CHECK(nl_lora_forward_to(&L, A, B, y, u, x, T, tok0, acc) == 0);
        const int cut[] = {T, T / 3, 1, 0}; /* ranges [T/3, T), [1, T/3), [0, 1) */
        for (int i = 0; i < 3; i++)
            CHECK(nl_lora_forward_rows(&L, A, B, y2, u2, x, tok0, NULL, acc, cut[i + 1], cut[i]) == 0);
        CHECKF(memcmp(y, y2, sizeof(float) * ny) == 0, "split forward T=%d p=%g acc=%d differs", T, p, acc);
        CHECK(memcmp(u, u2, sizeof(float) * T * r) == 0);
    }
    float *dx = malloc(sizeof(float) * nx), *dA = malloc(sizeof(float) * na), *dB = malloc(sizeof(float) * nb);
    float *dx2 = malloc(sizeof(float) * nx), *dA2 = malloc(sizeof(float) * na), *dB2 = malloc(sizeof(float) * nb);
    float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(&L, T) + 1));
    for (int v = 0; v < 4; v++) { /* bit 0: u given, bit 1: dx accumulates (v == 0: no dx) */
        nl_t_fill(dx, nx, 1.0), nl_t_fill(dA, na, 1.0), nl_t_fill(dB, nb, 1.0);
        memcpy(dx2, dx, sizeof(float) * nx), memcpy(dA2, dA, sizeof(float) * na), memcpy(dB2, dB, sizeof(float) * nb);
        const float *uu = v & 1 ? u : NULL;
        const int dacc = v >> 1 & 1;
        float *d1 = v ? dx : NULL, *d2 = v ? dx2 : NULL;
        CHECK(nl_lora_backward_to(&L, A, B, d1, dacc, dA, dB, dy, x, uu, T, tok0) == 0);
        const int cut[] = {T, 2 * T / 3, 2, 0};
        for (int i = 0; i < 3; i++)
            CHECK(nl_lora_backward_rows(&L, A, B, d2, dacc, dy, x, uu, T, tok0, NULL, scr, cut[i + 1], cut[i]) == 0);
        const int J = K + N, jc[] = {0, K / 2, K + 1, J};
        for (int i = 2; i >= 0; i--) CHECK(nl_lora_backward_params(&L, dA2, dB2, dy, x, T, scr, jc[i], jc[i + 1]) == 0);
        CHECKF(memcmp(dx, dx2, sizeof(float) * nx) == 0, "split backward dx T=%d p=%g v=%d", T, p, v);
        CHECKF(memcmp(dA, dA2, sizeof(float) * na) == 0, "split backward dA T=%d p=%g v=%d", T, p, v);
        CHECKF(memcmp(dB, dB2, sizeof(float) * nb) == 0, "split backward dB T=%d p=%g v=%d", T, p, v);
    }
    /* by lines (the tiles): du rows, then dx's and dA's columns with dB's rows, uneven splits,
     * every dx mode (NL_LORA_ADD too): the bits of the call above */
    CHECK(nl_lora_bwd_by_lines(&L) == (g_tiles != NULL));
    for (int v = 0; g_tiles && v < 8; v++) { /* bit 0: u given, bits 1-2: no dx, dx 0, 1, NL_LORA_ADD */
        nl_t_fill(dx, nx, 1.0), nl_t_fill(dA, na, 1.0), nl_t_fill(dB, nb, 1.0);
        memcpy(dx2, dx, sizeof(float) * nx), memcpy(dA2, dA, sizeof(float) * na), memcpy(dB2, dB, sizeof(float) * nb);
        const float *uu = v & 1 ? u : NULL;
        const int dm = v >> 1, dacc = dm == 3 ? NL_LORA_ADD : dm == 2;
        float *d1 = dm ? dx : NULL, *d2 = dm ? dx2 : NULL;
        CHECK(nl_lora_backward_to(&L, A, B, d1, dacc, dA, dB, dy, x, uu, T, tok0) == 0);
        const int cut[] = {T, 2 * T / 3, 2, 0};
        for (int i = 0; i < 3; i++)
            CHECK(nl_lora_backward_du(&L, A, B, dy, x, uu, T, tok0, NULL, scr, cut[i + 1], cut[i]) == 0);
        const int J = K + N, jc[] = {0, K / 3 | 1, K + 1, J}; /* an odd first column: the mask's high half */
        for (int i = 2; i >= 0; i--)
            CHECK(nl_lora_backward_lines(&L, A, d2, dacc, dA2, dB2, dy, x, T, tok0, NULL, scr, jc[i], jc[i + 1]) == 0);
        CHECKF(memcmp(dx, dx2, sizeof(float) * nx) == 0, "by lines dx T=%d K=%d p=%g v=%d", T, K, p, v);
        CHECKF(memcmp(dA, dA2, sizeof(float) * na) == 0, "by lines dA T=%d K=%d p=%g v=%d", T, K, p, v);
        CHECKF(memcmp(dB, dB2, sizeof(float) * nb) == 0, "by lines dB T=%d K=%d p=%g v=%d", T, K, p, v);
    }
    /* gathered rows: 3 rows of the T, keyed by their token indices */
    const int rows[3] = {1, T / 2, T - 1};
    int64_t toks[3];
    float *xg = malloc(sizeof(float) * 3 * K), *yg = malloc(sizeof(float) * 3 * N),
          *dyg = malloc(sizeof(float) * 3 * N), *dxg = malloc(sizeof(float) * 3 * K);
    for (int i = 0; i < 3; i++) {
        toks[i] = tok0 + rows[i];
        memcpy(xg + (int64_t)i * K, x + (int64_t)rows[i] * K, sizeof(float) * K);
        memcpy(dyg + (int64_t)i * N, dy + (int64_t)rows[i] * N, sizeof(float) * N);
    }
    CHECK(nl_lora_forward_to(&L, A, B, y, NULL, x, T, tok0, 0) == 0);
    CHECK(nl_lora_forward_rows(&L, A, B, yg, NULL, xg, 0, toks, 0, 0, 3) == 0);
    int same = 1;
    for (int i = 0; i < 3; i++) same &= memcmp(yg + (int64_t)i * N, y + (int64_t)rows[i] * N, sizeof(float) * N) == 0;
    CHECKF(same, "gathered forward rows differ (p=%g)", p);
    float *dyz = calloc((size_t)ny, sizeof(float));
    for (int i = 0; i < 3; i++) memcpy(dyz + (int64_t)rows[i] * N, dyg + (int64_t)i * N, sizeof(float) * N);
    nl_t_fill(dA, na, 1.0), nl_t_fill(dB, nb, 1.0);
    memcpy(dA2, dA, sizeof(float) * na), memcpy(dB2, dB, sizeof(float) * nb);
    float *dxl = malloc(sizeof(float) * 3 * K), *dAl = malloc(sizeof(float) * na), *dBl = malloc(sizeof(float) * nb);
    memcpy(dAl, dA, sizeof(float) * na), memcpy(dBl, dB, sizeof(float) * nb);
    CHECK(nl_lora_backward_to(&L, A, B, dx, 0, dA, dB, dyz, x, NULL, T, tok0) == 0);
    CHECK(nl_lora_backward_rows(&L, A, B, dxg, 0, dyg, xg, NULL, 3, 0, toks, scr, 0, 3) == 0);
    CHECK(nl_lora_backward_params(&L, dA2, dB2, dyg, xg, 3, scr, 0, K + N) == 0);
    same = 1;
    for (int i = 0; i < 3; i++) same &= memcmp(dxg + (int64_t)i * K, dx + (int64_t)rows[i] * K, sizeof(float) * K) == 0;
    CHECKF(same, "gathered backward dx rows differ (p=%g)", p);
    if (g_tiles) { /* by lines: the gathered rows' dx, dA, dB those of the rows and params above */
        CHECK(nl_lora_backward_du(&L, A, B, dyg, xg, NULL, 3, 0, toks, scr, 0, 3) == 0);
        CHECK(nl_lora_backward_lines(&L, A, dxl, 0, dAl, dBl, dyg, xg, 3, 0, toks, scr, 0, K + N) == 0);
        CHECKF(memcmp(dxl, dxg, sizeof(float) * 3 * K) == 0 && memcmp(dAl, dA2, sizeof(float) * na) == 0 &&
                   memcmp(dBl, dB2, sizeof(float) * nb) == 0,
               "gathered backward by lines differs (p=%g)", p);
    }
    free(dxl), free(dAl), free(dBl);
    /* dA, dB sum over the tokens: the full call's zero rows are exact no-ops in one FP32 chain
     * per element, which the tiles mode keeps for these too (on tiles a TDPBF16PS that sums a
     * 32-step in its own order, e.g. the SDM's reading or the real one, would group the 3
     * rows' terms differently from the gathered call's) */
    CHECKF(memcmp(dA, dA2, sizeof(float) * na) == 0 && memcmp(dB, dB2, sizeof(float) * nb) == 0,
           "%s: gathered backward dA/dB differ (p=%g)",
           g_tiles  ? g_tiles->name
           : g_bf16 ? "bf16"
                    : "fp32",
           p);
    /* and the mask really depends on the token index: other indices change the rows */
    if (p > 0.0f) {
        for (int i = 0; i < 3; i++) toks[i] += 1;
        CHECK(nl_lora_forward_rows(&L, A, B, yg, NULL, xg, 0, toks, 0, 0, 3) == 0);
        CHECK(memcmp(yg, y + (int64_t)rows[0] * N, sizeof(float) * N) != 0);
    }
    CHECK(nl_lora_forward_rows(&L, A, B, y, NULL, x, tok0, NULL, 0, 2, 1) == -1); /* bad range */
    free(x), free(A), free(B), free(y), free(y2), free(u), free(u2), free(dy), free(dx), free(dA), free(dB);
    free(dx2), free(dA2), free(dB2), free(scr), free(xg), free(yg), free(dyg), free(dxg), free(dyz);
}

/* ------------------------------------------------------------------------- on the tiles */

/* The BF16 bound (relative to the tensor's magnitude): each product's inputs rounded once to
 * BF16 (≤ 2^-8 each), FP32 sums; du, su and the u of the forward are rounded again as the next
 * product's input. Observed ≤ 4e-3 on these shapes; a wrong pair, panel or padding is O(1). */
#define TILE_TOL 1e-2

static void check_tiles(const nl_amx_tiles *tl, int exact, int T, int K, int N, int r, float p, int64_t tok0) {
    const float s = 16.0f / (float)r;
    nl_lora L = {K, N, r, s, p, nl_lora_dropout_key(4321, 2, 1, 5), tl, g_bf16, NULL, NULL}, L32 = L;
    L32.tiles = NULL;
    L32.bf16 = 0;
    const char *name = tl ? tl->name : "bf16"; /* tl NULL: the BF16 vector path (g_bf16, r = 16, no model) */
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r,
                  nu = (int64_t)T * r;
    float *x = malloc(sizeof(float) * nx), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb),
          *m = malloc(sizeof(float) * nx), *xm = malloc(sizeof(float) * nx), *y0 = malloc(sizeof(float) * ny),
          *y = malloc(sizeof(float) * ny), *ym = malloc(sizeof(float) * ny), *y32 = malloc(sizeof(float) * ny),
          *u = malloc(sizeof(float) * nu), *um = malloc(sizeof(float) * nu), *su = malloc(sizeof(float) * nu),
          *du = malloc(sizeof(float) * nu), *dy = malloc(sizeof(float) * ny), *tmp = malloc(sizeof(float) * nx);
    nl_t_fill(x, nx, 1.0), nl_t_fill(A, na, 0.3), nl_t_fill(B, nb, 0.3), nl_t_fill(y0, ny, 1.0), nl_t_fill(dy, ny, 1.0);
    for (int t = 0; t < T; t++) nl_lora_dropout_mask(&L, tok0 + t, m + (int64_t)t * K);
    for (int64_t i = 0; i < nx; i++) xm[i] = p > 0.0f ? x[i] * m[i] : x[i];
    /* forward: the model, then the node */
    m_gemm(um, r, xm, K, 1, A, 1, K, T, r, K, 0);
    for (int64_t i = 0; i < nu; i++) su[i] = s * um[i];
    memcpy(ym, y0, sizeof(float) * ny);
    m_gemm(ym, N, su, r, 1, B, 1, r, T, N, r, 1);
    memcpy(y, y0, sizeof(float) * ny);
    CHECK(nl_lora_forward(&L, A, B, y, u, x, T, tok0) == 0);
    if (exact)
        CHECKF(memcmp(y, ym, sizeof(float) * ny) == 0 && memcmp(u, um, sizeof(float) * nu) == 0,
               "lora tiles T=%d K=%d N=%d r=%d p=%g: forward not the model's bits", T, K, N, r, p);
    memcpy(y32, y0, sizeof(float) * ny);
    CHECK(nl_lora_forward(&L32, A, B, y32, NULL, x, T, tok0) == 0);
    /* float64 reference */
    double *yr = malloc(sizeof(double) * ny), *ur = malloc(sizeof(double) * nu), *xd = nl_t_to_d(x, nx),
           *Ad = nl_t_to_d(A, na), *Bd = nl_t_to_d(B, nb), *y0d = nl_t_to_d(y0, ny);
    lora_ref(yr, ur, y0d, xd, Ad, Bd, &(lora_shape){T, K, N, r, s, m});
    /* the LoRA term alone (y − y0), so the bound is on what the tiles computed */
    double *tr = malloc(sizeof(double) * ny);
    float *tg = malloc(sizeof(float) * ny);
    for (int64_t i = 0; i < ny; i++) tr[i] = yr[i] - y0d[i], tg[i] = y[i] - y0[i];
    double e = rel_err(tg, tr, ny);
    CHECKF(e < TILE_TOL, "lora tiles %s T=%d r=%d: forward err %g", name, T, r, e);
    CHECKF(memcmp(y, y32, sizeof(float) * ny) != 0, "lora tiles: the same bits as FP32 (not taken?)");
    /* backward: the model */
    float *dx = malloc(sizeof(float) * nx), *dA = malloc(sizeof(float) * na), *dB = malloc(sizeof(float) * nb),
          *dxm = malloc(sizeof(float) * nx), *dAm = malloc(sizeof(float) * na), *dBm = malloc(sizeof(float) * nb);
    nl_t_fill(dx, nx, 1.0), nl_t_fill(dA, na, 0.1), nl_t_fill(dB, nb, 0.1);
    memcpy(dxm, dx, sizeof(float) * nx), memcpy(dAm, dA, sizeof(float) * na), memcpy(dBm, dB, sizeof(float) * nb);
    double *dx0 = nl_t_to_d(dx, nx), *dA0 = nl_t_to_d(dA, na), *dB0 = nl_t_to_d(dB, nb);
    m_gemm(du, r, dy, N, 1, B, r, 1, T, r, N, 0);
    for (int64_t i = 0; i < nu; i++) du[i] *= s;
    if (p > 0.0f) {
        m_gemm(tmp, K, du, r, 1, A, K, 1, T, K, r, 0);
        for (int64_t i = 0; i < nx; i++) dxm[i] += tmp[i] * m[i];
    } else {
        m_gemm(dxm, K, du, r, 1, A, K, 1, T, K, r, 1);
    }
    /* dA, dB: FP32 chains over the tokens on the tiles too (nn/lora.h) */
    nl_gemm_tn(dAm, K, du, r, xm, K, r, K, T, 1);
    nl_gemm_tn(dBm, r, dy, N, su, r, N, r, T, 1);
    CHECK(nl_lora_backward(&L, A, B, dx, dA, dB, dy, x, u, T, tok0) == 0);
    if (exact)
        CHECKF(memcmp(dx, dxm, sizeof(float) * nx) == 0 && memcmp(dA, dAm, sizeof(float) * na) == 0 &&
                   memcmp(dB, dBm, sizeof(float) * nb) == 0,
               "lora tiles T=%d K=%d N=%d r=%d p=%g: backward not the model's bits", T, K, N, r, p);
    /* against the float64 analytic backward: du = s·dy·B, dx += (du·A)⊙m, dA += duᵀ(m⊙x),
     * dB += s·dyᵀ·u (the increments alone, each relative to its own magnitude) */
    double *dud = malloc(sizeof(double) * nu), *ix = calloc((size_t)nx, sizeof(double)),
           *iA = calloc((size_t)na, sizeof(double)), *iB = calloc((size_t)nb, sizeof(double));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < r; i++) {
            double a = 0;
            for (int o = 0; o < N; o++) a += (double)dy[t * N + o] * Bd[o * r + i];
            dud[t * r + i] = s * a;
        }
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            double a = 0;
            for (int i = 0; i < r; i++) a += dud[t * r + i] * Ad[i * K + k];
            ix[t * K + k] = a * (p > 0.0f ? m[t * K + k] : 1.0);
        }
    for (int i = 0; i < r; i++)
        for (int k = 0; k < K; k++) {
            double a = 0;
            for (int t = 0; t < T; t++) a += dud[t * r + i] * (double)xm[t * K + k];
            iA[i * K + k] = a;
        }
    for (int o = 0; o < N; o++)
        for (int i = 0; i < r; i++) {
            double a = 0;
            for (int t = 0; t < T; t++) a += (double)dy[t * N + o] * s * ur[t * r + i];
            iB[o * r + i] = a;
        }
    float *gx = malloc(sizeof(float) * nx), *gA = malloc(sizeof(float) * na), *gB = malloc(sizeof(float) * nb);
    for (int64_t i = 0; i < nx; i++) gx[i] = (float)(dx[i] - dx0[i]);
    for (int64_t i = 0; i < na; i++) gA[i] = (float)(dA[i] - dA0[i]);
    for (int64_t i = 0; i < nb; i++) gB[i] = (float)(dB[i] - dB0[i]);
    const double ex = rel_err(gx, ix, nx), eA = rel_err(gA, iA, na), eB = rel_err(gB, iB, nb);
    CHECKF(ex < TILE_TOL && eA < TILE_TOL && eB < TILE_TOL,
           "lora tiles %s T=%d K=%d N=%d r=%d p=%g: backward err dx %g dA %g dB %g", name, T, K, N, r, p, ex, eA, eB);
    free(x), free(A), free(B), free(m), free(xm), free(y0), free(y), free(ym), free(y32), free(u), free(um), free(su),
        free(du);
    free(dy), free(tmp), free(yr), free(ur), free(xd), free(Ad), free(Bd), free(y0d), free(tr), free(tg), free(dx),
        free(dA);
    free(dB), free(dxm), free(dAm), free(dBm), free(dx0), free(dA0), free(dB0), free(dud), free(ix), free(iA), free(iB);
    free(gx), free(gA), free(gB);
}

/* NL_LORA_ADD on the tiles: y0 + the term, bit for bit the unfused call (the term into a buffer
 * with accumulate 0, then y0[i] + term[i]), forward and backward rows (u given or recomputed),
 * split in uneven ranges, with and without dropout; T = 0 and empty ranges leave y as it was. */
static void check_fused(const nl_amx_tiles *tl, int T, int K, int N, int r, float p, int64_t tok0) {
    const nl_lora L = {K, N, r, 8.0f / (float)r, p, nl_lora_dropout_key(5, 2, 3, 1), tl, 0, NULL, NULL};
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r;
    const int64_t nm = (nx > ny ? nx : ny) + 1;
    float *x = malloc(sizeof(float) * (nx + 1)), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *dy = malloc(sizeof(float) * (ny + 1)), *u = malloc(sizeof(float) * ((int64_t)T * r + 1));
    float *base = malloc(sizeof(float) * nm), *term = malloc(sizeof(float) * nm), *want = malloc(sizeof(float) * nm),
          *got = malloc(sizeof(float) * nm);
    float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(&L, T) + 1));
    nl_t_fill(x, nx, 1.0), nl_t_fill(A, na, 0.5), nl_t_fill(B, nb, 0.5), nl_t_fill(dy, ny, 1.0);
    nl_t_fill(base, nm, 2.0);
    const int cut[] = {T, 2 * T / 3, T / 3, T / 3, 0}; /* [T/3, T/3) empty */
    /* forward: the term with accumulate 0, added afterwards */
    CHECK(nl_lora_forward_to(&L, A, B, term, u, x, T, tok0, 0) == 0);
    for (int64_t i = 0; i < ny; i++) want[i] = base[i] + term[i];
    memcpy(got, base, sizeof(float) * ny);
    CHECK(nl_lora_forward_to(&L, A, B, got, NULL, x, T, tok0, NL_LORA_ADD) == 0);
    CHECKF(memcmp(got, want, sizeof(float) * ny) == 0, "%s: fused forward T=%d K=%d N=%d r=%d p=%g", tl->name, T, K, N,
           r, p);
    memcpy(got, base, sizeof(float) * ny);
    for (int i = 0; i < 4; i++)
        CHECK(nl_lora_forward_rows(&L, A, B, got, NULL, x, tok0, NULL, NL_LORA_ADD, cut[i + 1], cut[i]) == 0);
    CHECKF(memcmp(got, want, sizeof(float) * ny) == 0, "%s: fused split forward T=%d K=%d N=%d r=%d p=%g", tl->name, T,
           K, N, r, p);
    /* backward rows: dx with dx_accumulate 0 into the buffer, added afterwards */
    for (int have_u = 0; have_u < 2; have_u++) {
        const float *uu = have_u ? u : NULL;
        CHECK(nl_lora_backward_rows(&L, A, B, term, 0, dy, x, uu, T, tok0, NULL, scr, 0, T) == 0);
        for (int64_t i = 0; i < nx; i++) want[i] = base[i] + term[i];
        memcpy(got, base, sizeof(float) * nx);
        for (int i = 0; i < 4; i++)
            CHECK(nl_lora_backward_rows(&L, A, B, got, NL_LORA_ADD, dy, x, uu, T, tok0, NULL, scr, cut[i + 1],
                                        cut[i]) == 0);
        CHECKF(memcmp(got, want, sizeof(float) * nx) == 0, "%s: fused backward dx T=%d K=%d N=%d r=%d p=%g u=%d",
               tl->name, T, K, N, r, p, have_u);
    }
    free(x), free(A), free(B), free(dy), free(u), free(base), free(term), free(want), free(got), free(scr);
}

/* The mask kept as bits (nl_lora mask_out / mask_in): the forward that keeps them gives the bits of
 * one that does not (y, u) and keeps exactly nl_lora_dropout_mask's values (padding 0); a backward
 * reading them, whole or split (rows then parameters, or by lines with a first column off the
 * 16-bit halves), gives dx, dA, dB bit for bit those of the backward that hashes; one flipped bit
 * changes them (the bits are read). tl: the tiles, or NULL (FP32 or, with bf16, the BF16 pair). */
static void check_bits(const nl_amx_tiles *tl, int bf16, int T, int K, int N, int r, float p, int64_t tok0) {
    nl_lora L = {K, N, r, 4.0f / (float)r, p, nl_lora_dropout_key(31, 4, 2, 6), tl, bf16, NULL, NULL};
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r;
    const size_t hw = nl_lora_mask_halves(K), nh = (size_t)T * hw;
    float *x = malloc(sizeof(float) * nx), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *y = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny), *u = malloc(sizeof(float) * T * r),
          *u2 = malloc(sizeof(float) * T * r), *dy = malloc(sizeof(float) * ny), *m = malloc(sizeof(float) * K);
    uint16_t *bits = malloc(sizeof(uint16_t) * nh);
    float *d[2][3];
    const int64_t nd[3] = {nx, na, nb};
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 3; k++) d[a][k] = malloc(sizeof(float) * nd[k]);
    float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(&L, T) + 1));
    nl_t_fill(x, nx, 1.0), nl_t_fill(A, na, 0.5), nl_t_fill(B, nb, 0.5), nl_t_fill(dy, ny, 1.0);
    nl_t_fill(y, ny, 1.0), memcpy(y2, y, sizeof(float) * ny);
    memset(bits, 0xA5, sizeof(uint16_t) * nh);
    CHECK(nl_lora_forward_to(&L, A, B, y, u, x, T, tok0, 1) == 0);
    L.mask_out = bits;
    const int cut[] = {T, T / 3, 0}; /* the bits' rows from two row ranges */
    for (int i = 0; i < 2; i++)
        CHECK(nl_lora_forward_rows(&L, A, B, y2, u2, x, tok0, NULL, 1, cut[i + 1], cut[i]) == 0);
    L.mask_out = NULL;
    const char *name = tl ? tl->name : bf16 ? "bf16" : "fp32";
    CHECKF(memcmp(y, y2, sizeof(float) * ny) == 0 && memcmp(u, u2, sizeof(float) * T * r) == 0,
           "kept bits %s T=%d K=%d: the forward keeping them differs", name, T, K);
    int bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        nl_lora_dropout_mask(&L, tok0 + t, m);
        for (int i = 0; i < (int)hw * 16; i++)
            bad |= (bits[(size_t)t * hw + i / 16] >> (i % 16) & 1) != (i < K && m[i] != 0.0f);
    }
    CHECKF(!bad, "kept bits %s T=%d K=%d: not the mask's", name, T, K);
    /* flip 0: the bits as kept; 1: one kept element's bit cleared (the result must differ) */
    int fi = K / 2 + 1;
    nl_lora_dropout_mask(&L, tok0 + T / 2, m);
    while (m[fi] == 0.0f) fi = (fi + 1) % K;
    for (int flip = 0; flip < 2; flip++) {
        if (flip) bits[(size_t)(T / 2) * hw + fi / 16] ^= (uint16_t)(1u << (fi % 16));
        for (int v = 0; v < 3; v++) { /* 0: the whole call, 1: rows + params, 2: by lines (tiles only) */
            if (v == 2 && !tl) continue;
            for (int k = 0; k < 3; k++) { /* the same starting values for both */
                nl_t_fill(d[0][k], nd[k], 1.0);
                memcpy(d[1][k], d[0][k], sizeof(float) * (size_t)nd[k]);
            }
            for (int a = 0; a < 2; a++) {
                nl_lora La = L;
                La.mask_in = a ? bits : NULL;
                float *dx = d[a][0], *dA = d[a][1], *dB = d[a][2];
                if (v == 0) {
                    CHECK(nl_lora_backward_to(&La, A, B, dx, 1, dA, dB, dy, x, u, T, tok0) == 0);
                } else if (v == 1) {
                    CHECK(nl_lora_backward_rows(&La, A, B, dx, 1, dy, x, u, T, tok0, NULL, scr, 0, T / 2) == 0);
                    CHECK(nl_lora_backward_rows(&La, A, B, dx, 1, dy, x, u, T, tok0, NULL, scr, T / 2, T) == 0);
                    const int jc[] = {0, 37, K + 3, K + N}; /* a first column off the 16-bit halves */
                    for (int i = 0; i < 3; i++)
                        CHECK(nl_lora_backward_params(&La, dA, dB, dy, x, T, scr, jc[i], jc[i + 1]) == 0);
                } else {
                    CHECK(nl_lora_backward_du(&La, A, B, dy, x, u, T, tok0, NULL, scr, 0, T) == 0);
                    const int jc[] = {0, 40, K + 1, K + N};
                    for (int i = 0; i < 3; i++)
                        CHECK(nl_lora_backward_lines(&La, A, dx, 1, dA, dB, dy, x, T, tok0, NULL, scr, jc[i],
                                                     jc[i + 1]) == 0);
                }
            }
            const int same = memcmp(d[0][0], d[1][0], sizeof(float) * nx) == 0 &&
                             memcmp(d[0][1], d[1][1], sizeof(float) * na) == 0 &&
                             memcmp(d[0][2], d[1][2], sizeof(float) * nb) == 0;
            CHECKF(same == !flip, "kept bits %s T=%d K=%d v=%d: the backward %s", name, T, K, v,
                   flip ? "does not read them" : "reading them differs");
        }
    }
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 3; k++) free(d[a][k]);
    free(x), free(A), free(B), free(y), free(y2), free(u), free(u2), free(dy), free(m), free(bits), free(scr);
}

static void test_kept_bits(void) {
    const int Ks[] = {70, 1000};
    for (int i = 0; i < 2; i++) {
        check_bits(NULL, 0, 45, Ks[i], 33, 8, 0.2f, 100);
        check_bits(NULL, 0, 45, Ks[i], 33, 16, 0.1f, 7); /* the rank-16 kernels */
        if (nl_lora_bf16_runs(16)) check_bits(NULL, 1, 45, Ks[i], 33, 16, 0.1f, 7);
        check_bits(&nl_amx_tiles_emu, 0, 45, Ks[i], 40, 16, 0.1f, 3);
        check_bits(&nl_amx_tiles_emu, 0, 37, Ks[i], 40, 8, 0.3f, 9);
        if (nl_amx_tiles_of("amx")) check_bits(nl_amx_tiles_of("amx"), 0, 45, Ks[i], 40, 16, 0.1f, 3);
    }
}

/* Ranks 8/16/24, token counts not a multiple of 16 or 32, n_in/n_out past one 256-line panel. */
static void test_tiles(const nl_amx_tiles *tl, int exact) {
    check_tiles(tl, exact, 37, 45, 100, 16, 0.0f, 0);
    check_tiles(tl, exact, 70, 100, 33, 8, 0.2f, 64);
    check_tiles(tl, exact, 33, 64, 64, 24, 0.1f, 5);
    check_tiles(tl, exact, 40, 300, 270, 16, 0.0f, 1000);
    check_tiles(tl, exact, 3, 20, 9, 16, 0.3f, 7);
    check_tiles(tl, exact, 21, 37, 40, 1, 0.25f, 9); /* odd n_in: the one-pass dropout's tail */
    check_fused(tl, 37, 45, 100, 16, 0.15f, 3);
    check_fused(tl, 37, 45, 100, 16, 0.0f, 0);
    check_fused(tl, 70, 100, 33, 8, 0.2f, 64);
    check_fused(tl, 33, 300, 270, 24, 0.1f, 5);
    check_fused(tl, 1, 20, 9, 16, 0.3f, 7);
    check_fused(tl, 64, 17, 3, 1, 0.0f, 2);
    check_fused(tl, 0, 20, 9, 16, 0.0f, 0);
    g_tiles = tl;
    check_split(37, 21, 9, 5, 0.5f, 1000);
    check_split(70, 40, 33, 16, 0.0f, 3);
    check_split(70, 300, 280, 24, 0.2f, 64);
    check_split(40, 600, 70, 16, 0.1f, 5); /* by lines: two strips of a thread's columns */
    g_tiles = NULL;
}

/* ------------------------------------------------------------------------- rank 16 */

/* The row's rank-16 kernels (cpu/kernels.h: nl_lora_kernels) against the nl_gemm calls they
 * stand for, bit for bit: odd row counts and lengths, strides a multiple of 4 KB, every mode. */
static void test_k16_kernels(void) {
    const nl_lora_kernels *lk = nl_cpu_kernels()->lora;
    if (!lk) {
        printf("no rank-16 LoRA kernels in the %s row\n", nl_cpu_kernels()->name);
        return;
    }
    const int shapes[][3] = {{37, 300, 70}, {1, 1, 1}, {16, 1024, 33}, {5, 17, 16}, {33, 129, 95}, {64, 2048, 1}};
    for (int si = 0; si < 6; si++) {
        const int M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        const int64_t ld = K < 1024 ? K : 1024 * ((K + 1023) / 1024); /* x's row stride */
        float *X = malloc(sizeof(float) * (size_t)M * ld), *P = malloc(sizeof(float) * (size_t)K * 16);
        float *c1 = malloc(sizeof(float) * (size_t)M * 16), *c2 = malloc(sizeof(float) * (size_t)M * 16);
        nl_t_fill(X, (int64_t)M * ld, 1.0), nl_t_fill(P, (int64_t)K * 16, 0.5);
        lk->thin16(c1, X, ld, P, M, K);
        nl_gemm(c2, 16, X, (int)ld, P, 16, M, 16, K, 0);
        CHECKF(memcmp(c1, c2, sizeof(float) * (size_t)M * 16) == 0, "thin16 M=%d K=%d", M, K);
        /* tn16: C'[16][N] += Σ_t P[t][i]·Q[t][n] over T = M tokens, Q rows ld apart */
        const int64_t lq = N < 1024 ? N + 3 : 1024;
        float *Pt = malloc(sizeof(float) * (size_t)M * 16), *Q = malloc(sizeof(float) * (size_t)M * lq);
        float *d1 = malloc(sizeof(float) * 16 * (size_t)N), *d2 = malloc(sizeof(float) * 16 * (size_t)N);
        nl_t_fill(Pt, (int64_t)M * 16, 1.0), nl_t_fill(Q, (int64_t)M * lq, 1.0);
        for (int trans = 0; trans < 2; trans++) {
            nl_t_fill(d1, 16 * (int64_t)N, 1.0);
            memcpy(d2, d1, sizeof(float) * 16 * (size_t)N);
            lk->tn16(d1, trans ? 16 : N, trans, Pt, 16, Q, lq, N, M);
            if (trans) nl_gemm_tn(d2, 16, Q, (int)lq, Pt, 16, N, 16, M, 1);
            else nl_gemm_tn(d2, N, Pt, 16, Q, (int)lq, 16, N, M, 1);
            CHECKF(memcmp(d1, d2, sizeof(float) * 16 * (size_t)N) == 0, "tn16 trans=%d T=%d N=%d", trans, M, N);
        }
        if (lk->tn16k) { /* x ⊙ m from kept bits (row b0 + n, b0 off the halves) against tn16 on x ⊙ m */
            const int b0s[] = {0, 5, 16};
            for (int bi = 0; bi < 3; bi++) {
                const int b0 = b0s[bi];
                const int64_t ldk = ((int64_t)(b0 + N) + 31) / 32 * 2;
                uint16_t *kb = calloc((size_t)M * ldk, sizeof(uint16_t));
                float *xm = malloc(sizeof(float) * (size_t)M * lq);
                for (int t = 0; t < M; t++)
                    for (int n = 0; n < N; n++) {
                        const int keep = nl_t_rand() > -0.6;
                        kb[t * ldk + (b0 + n) / 16] |= (uint16_t)(keep << ((b0 + n) % 16));
                        xm[t * lq + n] = Q[t * lq + n] * (keep ? 1.25f : 0.0f);
                    }
                for (int h = 0; h < M * ldk; h++) /* bits outside [b0, b0 + N) set: must not be read */
                    for (int j = 0; j < 16; j++) {
                        const int c = (int)(h % ldk) * 16 + j;
                        if (c < b0 || c >= b0 + N) kb[h] |= (uint16_t)(1u << j);
                    }
                nl_t_fill(d1, 16 * (int64_t)N, 1.0);
                memcpy(d2, d1, sizeof(float) * 16 * (size_t)N);
                lk->tn16k(d1, N, Pt, 16, Q, lq, kb, ldk, b0, 1.25f, N, M);
                lk->tn16(d2, N, 0, Pt, 16, xm, lq, N, M);
                CHECKF(memcmp(d1, d2, sizeof(float) * 16 * (size_t)N) == 0, "tn16k T=%d N=%d b0=%d", M, N, b0);
                free(kb), free(xm);
            }
        }
        /* add16: C[M][N] (op)= P[M][16]·Q[16][N], Q packed as panels */
        const int64_t np = ((int64_t)N + 31) / 32 * 32, lc = N < 1024 ? N : 1024 * ((N + 1023) / 1024);
        float *Qr = malloc(sizeof(float) * 16 * (size_t)N), *Qp = calloc((size_t)np * 16, sizeof(float));
        float *e1 = malloc(sizeof(float) * (size_t)M * lc), *e2 = malloc(sizeof(float) * (size_t)M * lc),
              *tm = malloc(sizeof(float) * (size_t)M * N);
        nl_t_fill(Qr, 16 * (int64_t)N, 0.5);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < 16; k++) Qp[(n / 32 * 16 + k) * 32 + n % 32] = Qr[k * N + n];
        for (int mode = 0; mode < 3; mode++) {
            nl_t_fill(e1, (int64_t)M * lc, 1.0);
            memcpy(e2, e1, sizeof(float) * (size_t)M * lc);
            lk->add16(e1, lc, Pt, 16, Qp, M, N, mode);
            if (mode < 2) {
                nl_gemm(e2, (int)lc, Pt, 16, Qr, N, M, N, 16, mode);
            } else {
                nl_gemm(tm, N, Pt, 16, Qr, N, M, N, 16, 0);
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) e2[m * lc + n] += tm[m * N + n];
            }
            CHECKF(memcmp(e1, e2, sizeof(float) * (size_t)M * lc) == 0, "add16 mode=%d M=%d N=%d", mode, M, N);
        }
        free(X), free(P), free(c1), free(c2), free(Pt), free(Q), free(d1), free(d2), free(Qr), free(Qp), free(e1);
        free(e2), free(tm);
    }
}

/* a fill that depends only on (n, seed): the two runs of k16_outputs see the same data */
static void fill_seeded(float *p, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) * (1.0f / 8388608.0f) - 1.0f;
    }
}

/* Every output of the split API at rank 16 (forward acc 0/1/NL_LORA_ADD; backward rows dx
 * none/0/1/NL_LORA_ADD, u given or recomputed; parameter lines in uneven ranges) into out, in
 * a fixed order; returns the number of floats written. */
static int64_t k16_outputs(int T, int K, int N, float p, float *out) {
    const int r = 16;
    nl_lora L = {K, N, r, 2.0f, p, nl_lora_dropout_key(5, 6, 7, 8), NULL, 0, NULL, NULL};
    const int64_t nx = (int64_t)T * K, ny = (int64_t)T * N, na = (int64_t)r * K, nb = (int64_t)N * r;
    float *x = malloc(sizeof(float) * nx), *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *dy = malloc(sizeof(float) * ny), *u = malloc(sizeof(float) * T * r);
    float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(&L, T) + 1));
    fill_seeded(x, nx, 1), fill_seeded(A, na, 2), fill_seeded(B, nb, 3), fill_seeded(dy, ny, 4);
    int64_t o = 0;
    const int acc[3] = {0, 1, NL_LORA_ADD};
    for (int a = 0; a < 3; a++) {
        float *y = out + o;
        fill_seeded(y, ny, 5);
        const int cut[] = {T, T / 3, 1, 0};
        for (int i = 0; i < 3; i++)
            CHECK(nl_lora_forward_rows(&L, A, B, y, u, x, 0, NULL, acc[a], cut[i + 1], cut[i]) == 0);
        o += ny;
    }
    memcpy(out + o, u, sizeof(float) * T * r);
    o += (int64_t)T * r;
    for (int v = 0; v < 8; v++) { /* bit 0: u given; bits 1-2: dx none, 0, 1, NL_LORA_ADD */
        const int dm = v >> 1;
        float *dx = dm ? out + o : NULL;
        if (dx) fill_seeded(dx, nx, 6), o += nx;
        float *dA = out + o, *dB = dA + na;
        fill_seeded(dA, na, 7), fill_seeded(dB, nb, 8);
        o += na + nb;
        const int dacc = dm == 3 ? NL_LORA_ADD : dm == 2;
        const int cut[] = {T, 2 * T / 3, 2, 0};
        for (int i = 0; i < 3; i++)
            CHECK(nl_lora_backward_rows(&L, A, B, dx, dacc, dy, x, v & 1 ? u : NULL, T, 0, NULL, scr, cut[i + 1],
                                        cut[i]) == 0);
        const int J = K + N, jc[] = {0, K / 2, K + 1, J};
        for (int i = 2; i >= 0; i--) CHECK(nl_lora_backward_params(&L, dA, dB, dy, x, T, scr, jc[i], jc[i + 1]) == 0);
    }
    free(x), free(A), free(B), free(dy), free(u), free(scr);
    return o;
}

/* Rank 16 through the nodes' calls: the row's rank-16 kernels give the bits of the same row
 * without them (the AVX2 row: the nl_gemm chains, whose bits every row shares), and the
 * float64 and split checks above hold at r = 16. */
static void test_rank16(void) {
    check_lora(7, 13, 11, 16, 0.0f, 0);
    check_lora(9, 20, 7, 16, 0.25f, 40);
    check_split(70, 40, 33, 16, 0.0f, 3);
    check_split(37, 300, 150, 16, 0.2f, 64);
    const int shapes[][3] = {{70, 40, 33}, {37, 300, 150}, {5, 17, 1}, {45, 1024, 48}, {33, 64, 2048}};
    const char *here = nl_cpu_kernels()->name;
    if (!nl_cpu_kernels()->lora || !nl_cpu_kernels_find("avx2")) return;
    for (int si = 0; si < 5; si++)
        for (int pi = 0; pi < 2; pi++) {
            const int T = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
            const float p = pi ? 0.1f : 0.0f;
            const size_t n = (size_t)(3 * (int64_t)T * N + 16 * T + 8 * ((int64_t)T * K + 16 * (int64_t)(K + N)));
            float *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
            const int64_t n1 = k16_outputs(T, K, N, p, o1);
            CHECK(nl_cpu_use("avx2") == 0);
            const int64_t n2 = k16_outputs(T, K, N, p, o2);
            CHECK(nl_cpu_use(here) == 0);
            CHECKF(n1 == n2 && memcmp(o1, o2, sizeof(float) * (size_t)n1) == 0,
                   "rank 16 T=%d K=%d N=%d p=%g: %s and avx2 differ", T, K, N, p, here);
            free(o1), free(o2);
        }
}

/* ------------------------------------------------------------------------- rank 16 in BF16 */

/* BF16 bits -> float; a float -> the word half of its BF16 (nearest even: vcvtne2ps2bf16) */
static float b2f(uint32_t h) {
    const uint32_t u = (h & 0xFFFFu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2b(float f) { return nl_host_f32_to_bf16(f); }
static uint32_t word_of(float lo, float hi) { return f2b(lo) | f2b(hi) << 16; }

/* one vdpbf16ps lane step: the high product added, then the low one (each exact, each add rounded) */
static float dp_model(float c, uint32_t a, uint32_t b) {
    volatile float hi = b2f(a >> 16) * b2f(b >> 16);
    volatile float lo = b2f(a) * b2f(b);
    c = c + hi;
    return c + lo;
}

/* thin16b and add16b (kernels.h) against that model, bit for bit: words built here from random
 * floats (not by the node's packers), odd row counts, word counts and widths, every mode. */
static void test_bf16_kernels(void) {
    const nl_lora_kernels *lk = nl_cpu_kernels()->lora;
    if (!lk || !lk->thin16b || !nl_bf16_ok()) {
        printf("no BF16 LoRA kernels here (%s row)\n", nl_cpu_kernels()->name);
        return;
    }
    int bad = 0;
    const int th[][2] = {{1, 1}, {5, 9}, {16, 150}, {17, 513}, {37, 64}, {33, 1536}}; /* M, Kw */
    for (int si = 0; si < 6; si++) {
        const int M = th[si][0], Kw = th[si][1];
        const int64_t ldx = Kw + 5;
        uint32_t *X = malloc(4 * (size_t)M * ldx), *P = malloc(4 * (size_t)Kw * 16);
        float *C = malloc(sizeof(float) * (size_t)M * 16);
        for (int64_t i = 0; i < M * ldx; i++) X[i] = word_of((float)nl_t_rand(), (float)(3 * nl_t_rand()));
        for (int64_t i = 0; i < Kw * 16; i++) P[i] = word_of((float)nl_t_rand(), (float)(0.5 * nl_t_rand()));
        lk->thin16b(C, X, ldx, P, M, Kw);
        for (int m = 0; m < M; m++)
            for (int j = 0; j < 16; j++) {
                float c = 0.0f;
                for (int w = 0; w < Kw; w++) c = dp_model(c, X[m * ldx + w], P[w * 16 + j]);
                if (memcmp(&c, &C[m * 16 + j], 4) && bad++ < 3)
                    fprintf(stderr, "thin16b M=%d Kw=%d: C[%d][%d] = %.9g, model %.9g\n", M, Kw, m, j, C[m * 16 + j],
                            c);
            }
        free(X), free(P), free(C);
    }
    const int ad[][2] = {{1, 1}, {7, 17}, {8, 32}, {9, 33}, {37, 95}, {20, 300}}; /* M, N */
    for (int si = 0; si < 6; si++) {
        const int M = ad[si][0], N = ad[si][1];
        const int64_t ldq = (N + 31) / 32 * 32 + 3, ldc = N + 7, ldm = N + 2;
        uint32_t *P = malloc(4 * (size_t)M * 9), *Q = malloc(4 * 8 * (size_t)ldq);
        float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc),
              *Mk = malloc(sizeof(float) * (size_t)M * ldm);
        for (int i = 0; i < M * 9; i++) P[i] = word_of((float)nl_t_rand(), (float)nl_t_rand());
        for (int64_t i = 0; i < 8 * ldq; i++) Q[i] = word_of((float)nl_t_rand(), (float)(2 * nl_t_rand()));
        nl_t_fill(C0, (int64_t)M * ldc, 1.0);
        for (int64_t i = 0; i < M * ldm; i++) Mk[i] = nl_t_rand() < 0 ? 0.0f : 1.25f;
        if (lk->add16bk) { /* modes 3, 4 with Mk's rows as kept bits: add16b's bits on Mk */
            const int64_t ldk = ((int64_t)N + 31) / 32 * 2 + 2;
            uint16_t *kb = calloc((size_t)M * ldk, sizeof(uint16_t));
            float *C1 = malloc(sizeof(float) * (size_t)M * ldc);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) kb[m * ldk + n / 16] |= (uint16_t)((Mk[m * ldm + n] != 0.0f) << (n % 16));
            for (int mode = 3; mode < 5; mode++) {
                memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
                memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
                lk->add16b(C, ldc, P, 9, Q, ldq, M, N, mode, Mk, ldm);
                lk->add16bk(C1, ldc, P, 9, Q, ldq, M, N, mode, kb, ldk, 1.25f);
                if (memcmp(C, C1, sizeof(float) * (size_t)M * ldc) && bad++ < 3)
                    fprintf(stderr, "add16bk M=%d N=%d mode %d: not add16b's bits\n", M, N, mode);
            }
            free(kb), free(C1);
        }
        for (int mode = 0; mode < 5; mode++) {
            memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
            lk->add16b(C, ldc, P, 9, Q, ldq, M, N, mode, Mk, ldm);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < ldc; n++) {
                    const float c0 = C0[m * ldc + n];
                    float want = c0;
                    if (n < N) {
                        float c = mode == 1 ? c0 : 0.0f;
                        for (int w = 0; w < 8; w++) c = dp_model(c, P[m * 9 + w], Q[w * ldq + n]);
                        volatile float cm = c * (mode >= 3 ? Mk[m * ldm + n] : 1.0f);
                        want = mode == 0 || mode == 1 ? c : mode == 2 ? c0 + c : mode == 3 ? c0 + cm : cm;
                    }
                    if (memcmp(&want, &C[m * ldc + n], 4) && bad++ < 3)
                        fprintf(stderr, "add16b M=%d N=%d mode %d: C[%d][%d] = %.9g, model %.9g\n", M, N, mode, m, n,
                                C[m * ldc + n], want);
                }
        }
        free(P), free(Q), free(C), free(C0), free(Mk);
    }
    CHECKF(bad == 0, "BF16 LoRA kernels: %d elements differ from the model", bad);
}

/* The node with nl_lora.bf16 at rank 16: against float64 within the BF16 bound (check_tiles with
 * no tiles), the split API (what train/graph's pool runs: any thread count) and the gathered rows
 * bit for bit (check_split), and other ranks unchanged (they stay FP32). */
static void test_bf16_node(void) {
    if (!nl_cpu_kernels()->lora || !nl_cpu_kernels()->lora->thin16b || !nl_bf16_ok()) return;
    g_bf16 = 1;
    check_tiles(NULL, 0, 37, 45, 100, 16, 0.0f, 0);
    check_tiles(NULL, 0, 70, 101, 33, 16, 0.2f, 64);
    check_tiles(NULL, 0, 40, 300, 270, 16, 0.0f, 1000);
    check_tiles(NULL, 0, 3, 20, 9, 16, 0.3f, 7);
    check_tiles(NULL, 0, 33, 1024, 65, 16, 0.1f, 5);
    check_split(70, 40, 33, 16, 0.0f, 3);
    check_split(37, 301, 150, 16, 0.2f, 64);
    check_split(45, 17, 1024, 16, 0.1f, 9);
    check_split(37, 21, 9, 5, 0.5f, 1000); /* r = 5: FP32 (checked against check_lora's bits below) */
    g_bf16 = 0;
}

static void test_errors_and_init(void) {
    nl_lora L = {4, 3, 2, 1.0f, 1.0f, 0, NULL, 0, NULL, NULL};
    float A[8] = {0}, B[6] = {0}, x[4] = {0}, y[3] = {0};
    CHECK(nl_lora_forward(&L, A, B, y, NULL, x, 1, 0) == -1); /* p = 1 is invalid */
    L.dropout = 0.0f;
    L.rank = 0;
    CHECK(nl_lora_apply(&L, A, B, y, x, 1) == -1);
    /* out of memory for the scratch on the tiles' backward is an error, not a crash: a shape
     * whose packing buffers no address space holds (r = n_in = n_out = 2^24: B packed is
     * 2^49 bytes), asked for before any row is read (T = 0) */
    const nl_lora Lh = {1 << 24, 1 << 24, 1 << 24, 1.0f, 0.0f, 0, &nl_amx_tiles_emu, 0, NULL, NULL};
    CHECK(nl_lora_backward_to(&Lh, A, B, NULL, 1, A, B, y, x, NULL, 0, 0) == -1);
    CHECK(strstr(nl_last_error(), "lora backward: out of memory") != NULL);
    CHECK(nl_lora_backward_rows(&Lh, A, B, NULL, 1, y, x, NULL, 0, 0, NULL, A, 0, 0) == -1);
    CHECK(strstr(nl_last_error(), "lora backward: out of memory") != NULL);
    enum { R = 3, K = 50, N = 7 };
    float a1[R * K], a2[R * K], b[N * R];
    for (int i = 0; i < N * R; i++) b[i] = 1.0f;
    nl_lora_init(a1, b, R, K, N, nl_rng_key4(9, 1, 2, 3, 4));
    nl_lora_init(a2, b, R, K, N, nl_rng_key4(9, 1, 2, 3, 4));
    CHECK(memcmp(a1, a2, sizeof a1) == 0);
    int ok = 1, distinct = 0;
    for (int i = 0; i < R * K; i++) {
        ok &= fabsf(a1[i]) <= 1.0f / sqrtf((float)K);
        distinct += i > 0 && a1[i] != a1[i - 1];
    }
    for (int i = 0; i < N * R; i++) ok &= b[i] == 0.0f;
    CHECK(ok);
    CHECK(distinct > R * K - 5);
}

int main(void) {
    test_rng();
    test_mask();
    test_dropout_apply();
    test_dropout_rows();
    test_kept_bits();
    check_lora(7, 13, 11, 3, 0.0f, 0);
    check_lora(7, 13, 11, 3, 0.25f, 40);
    check_lora(37, 21, 9, 5, 0.5f, 1000); /* more rows than one token block */
    check_lora(37, 21, 9, 5, 0.0f, 0);
    check_split(37, 21, 9, 5, 0.5f, 1000);
    check_split(70, 40, 33, 4, 0.0f, 3);
    check_split(70, 40, 33, 4, 0.2f, 64);
    test_k16_kernels();
    test_rank16();
    test_bf16_kernels();
    test_bf16_node();
    test_errors_and_init();
    test_tiles(&nl_amx_tiles_emu_chain, 1); /* bit for bit against the chain model */
    test_tiles(&nl_amx_tiles_emu, 0);       /* the checks of the real instructions, on the hardware's reading */
    if (nl_amx_tiles_of("amx")) test_tiles(nl_amx_tiles_of("amx"), 0);
    else printf("no usable AMX here: the LoRA tiles ran on the emulator only\n");
    return nl_t_done();
}

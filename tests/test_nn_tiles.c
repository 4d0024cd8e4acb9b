/* cpu/tiles: the nodes' tile GEMM (packing into the A-row and VNNI-pair layouts, both
 * orientations of each operand, zero padding, 2×2 blocks of tiles with edges, accumulation
 * from C) on the tile emulator against the plain C model of the tile product, bit for bit, on
 * odd shapes; a reduction split into consecutive calls of whole 32-element steps gives the
 * same bits; rows and columns computed apart give the same bits; against a float64 reference
 * within the BF16 bound — and, where this CPU has usable AMX (or Arm SME), the real
 * instructions within that bound too. (The attention's and LoRA's products on the tiles: test_nn_attention,
 * test_nn_lora.) */
#include "cpu/tiles.h"
#include "test.h"
#include "tile_model.h"

/* |c − ref| <= TOL · Σ|a·b| (+ the accumulate's |C0|): each input rounded once to BF16 by the
 * packers (the same bits whichever instruction runs; ≤ 2^-8 relative each, observed ≤ 2.5e-3
 * of the magnitude in all on these data), then n ≤ up(K) + 1 FP32 sums of exact products in
 * whatever order the instruction takes, each ≤ 2^-23 of the magnitude (any faithful rounding):
 * ≤ 321·2^-23 = 3.8e-5 more for these K ≤ 300, on the real instructions as on the emulator.
 * A wrong pair, block or padding is O(1). */
#define TOL 5e-3

static void check_gemm(const nl_amx_tiles *tl, int exact, int M, int N, int K, int ta, int tb, int acc) {
    const int64_t ldc = N + 3, lda = ta ? M + 1 : K + 2, ldb = tb ? K + 1 : N + 5;
    float *X = malloc(sizeof(float) * (size_t)(ta ? K : M) * lda),
          *Y = malloc(sizeof(float) * (size_t)(tb ? N : K) * ldb);
    float *C = malloc(sizeof(float) * (size_t)M * ldc), *Cm = malloc(sizeof(float) * (size_t)M * ldc),
          *C0 = malloc(sizeof(float) * (size_t)M * ldc), *C2 = malloc(sizeof(float) * (size_t)M * ldc);
    nl_t_fill(X, (int64_t)(ta ? K : M) * lda, 1.0);
    nl_t_fill(Y, (int64_t)(tb ? N : K) * ldb, 1.0);
    nl_t_fill(C0, (int64_t)M * ldc, 1.0);
    const int Mp = nl_tile_up(M), Kp = nl_tile_up(K), Np = nl_tile_up(N);
    const int64_t pa = Kp + 32, pb = Np + 32; /* packed strides wider than needed */
    uint16_t *A = malloc(sizeof(uint16_t) * (size_t)Mp * pa);
    uint32_t *B = malloc(sizeof(uint32_t) * (size_t)(Kp / 2) * pb);
    nl_tile_pack_a(A, pa, X, lda, ta, M, K);
    nl_tile_pack_b(B, pb, Y, ldb, tb, K, N);
    /* A[m][k], B[k][n] strides into X, Y */
    const int64_t ras = ta ? 1 : lda, cas = ta ? lda : 1, rbs = tb ? 1 : ldb, cbs = tb ? ldb : 1;
    memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
    memcpy(Cm, C0, sizeof(float) * (size_t)M * ldc);
    nl_tile_gemm(tl, C, ldc, A, pa, B, pb, M, N, K, acc);
    m_gemm(Cm, ldc, X, ras, cas, Y, rbs, cbs, M, N, K, acc);
    /* the columns past N (ldc padding) are untouched */
    int untouched = 1;
    for (int m = 0; m < M; m++)
        for (int64_t n = N; n < ldc; n++) untouched &= C[m * ldc + n] == C0[m * ldc + n];
    CHECKF(untouched, "%s M=%d N=%d K=%d: wrote past N", tl->name, M, N, K);
    if (exact)
        CHECKF(memcmp(C, Cm, sizeof(float) * (size_t)M * ldc) == 0,
               "%s M=%d N=%d K=%d ta=%d tb=%d acc=%d: not the model's bits", tl->name, M, N, K, ta, tb, acc);
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = acc ? C0[m * ldc + n] : 0.0, mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                const double p = (double)X[m * ras + k * cas] * Y[k * rbs + n * cbs];
                ref += p;
                mag += fabs(p);
            }
            const double e = fabs(C[m * ldc + n] - ref) / (mag + 1e-30);
            worst = e > worst ? e : worst;
        }
    CHECKF(worst <= TOL, "%s M=%d N=%d K=%d: err %g of the magnitude", tl->name, M, N, K, worst);
    /* the splits hold for any instruction whose output element depends on its row of A, its
     * column of B and C alone (the real one too): they are checked on every tile set */
    if (K > 32) {
        /* the reduction in two calls (the first whole 32-element steps), accumulating */
        const int k1 = 32 * ((K / 32 + 1) / 2);
        memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
        nl_tile_gemm(tl, C2, ldc, A, pa, B, pb, M, N, k1, acc);
        nl_tile_gemm(tl, C2, ldc, A + k1, pa, B + (int64_t)(k1 / 2) * pb, pb, M, N, K - k1, 1);
        CHECKF(memcmp(C, C2, sizeof(float) * (size_t)M * ldc) == 0, "%s M=%d N=%d K=%d: split reduction differs",
               tl->name, M, N, K);
    }
    if (M > 32 && N > 32) {
        /* rows [32, M) and columns [32, N) apart (as threads would split them) */
        memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
        nl_tile_gemm(tl, C2, ldc, A, pa, B, pb, 32, N, K, acc);
        nl_tile_gemm(tl, C2 + 32 * ldc, ldc, A + 32 * pa, pa, B, pb, M - 32, 32, K, acc);
        nl_tile_gemm(tl, C2 + 32 * ldc + 32, ldc, A + 32 * pa, pa, B + 32, pb, M - 32, N - 32, K, acc);
        CHECKF(memcmp(C, C2, sizeof(float) * (size_t)M * ldc) == 0, "%s M=%d N=%d K=%d: split rows/columns differ",
               tl->name, M, N, K);
    }
    free(X), free(Y), free(C), free(Cm), free(C0), free(C2), free(A), free(B);
}

/* The packers' padding is zeros, the values nearest-even BF16. */
static void test_pack(void) {
    float x[3 * 5];
    for (int i = 0; i < 15; i++) x[i] = 1.0f + (float)i / 256.0f + 1.0f / 65536.0f; /* between BF16 values */
    uint16_t a[32 * 32];
    uint32_t b[16 * 32];
    memset(a, 0xff, sizeof a);
    memset(b, 0xff, sizeof b);
    nl_tile_pack_a(a, 32, x, 5, 0, 3, 5);
    nl_tile_pack_b(b, 32, x, 5, 0, 3, 5);
    int ok = 1;
    for (int m = 0; m < 32; m++)
        for (int k = 0; k < 32; k++) ok &= a[m * 32 + k] == (m < 3 && k < 5 ? m_bf16_daz(x[m * 5 + k]) : 0);
    CHECK(ok);
    ok = 1;
    for (int w = 0; w < 16; w++)
        for (int n = 0; n < 32; n++) {
            const uint16_t lo = 2 * w < 3 && n < 5 ? m_bf16_daz(x[2 * w * 5 + n]) : 0,
                           hi = 2 * w + 1 < 3 && n < 5 ? m_bf16_daz(x[(2 * w + 1) * 5 + n]) : 0;
            ok &= b[w * 32 + n] == ((uint32_t)lo | (uint32_t)hi << 16);
        }
    CHECK(ok);
    /* special values, every orientation: the rounding is the model's (FP32 denormals, the top
     * of their range too, read as zeros of their sign; NaN quieted; ±inf, ±0, ties) whichever
     * packer runs (AVX512_BF16 or the scalar loops) */
    static const uint32_t sp[] = {0x00000001u, 0x007fffffu, 0x807fffffu, 0x80400000u, 0x00018000u, 0x7f800001u,
                                  0xffc00001u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x3f808000u, 0x3f818000u,
                                  0x7f7fffffu, 0x00800000u, 0x3f800001u, 0xbf7fffffu, 0x00ffffffu};
    enum { R = 7, C = 37 };
    float xs[R * C];
    for (int i = 0; i < R * C; i++) {
        uint32_t u = sp[i % (sizeof sp / sizeof sp[0])];
        memcpy(&xs[i], &u, 4);
    }
    uint16_t pa[64 * 64];
    uint32_t pb[32 * 64];
    for (int t = 0; t < 2; t++) {
        /* A: t 0 M=R K=C from rows; t 1 M=C K=R from columns */
        const int M = t ? C : R, K = t ? R : C;
        nl_tile_pack_a(pa, 64, xs, C, t, M, K);
        ok = 1;
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) ok &= pa[m * 64 + k] == m_bf16_daz(t ? xs[k * C + m] : xs[m * C + k]);
        CHECKF(ok, "pack_a trans=%d: special values", t);
        /* B: t 0 K=R N=C; t 1 K=C N=R */
        const int Kb = t ? C : R, Nb = t ? R : C;
        nl_tile_pack_b(pb, 64, xs, C, t, Kb, Nb);
        ok = 1;
        for (int k = 0; k < Kb; k++)
            for (int n = 0; n < Nb; n++) {
                const uint32_t wv = pb[(k / 2) * 64 + n];
                ok &= (uint16_t)(k & 1 ? wv >> 16 : wv & 0xffff) == m_bf16_daz(t ? xs[n * C + k] : xs[k * C + n]);
            }
        CHECKF(ok, "pack_b trans=%d: special values", t);
    }
}

static void test_all(const nl_amx_tiles *tl, int exact) {
    static const int shapes[][3] = {{1, 1, 1},    {16, 16, 32}, {32, 32, 32},  {45, 37, 70},
                                    {5, 100, 16}, {70, 24, 9},  {33, 65, 129}, {100, 8, 300}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int way = 0; way < 8; way++)
            check_gemm(tl, exact, shapes[s][0], shapes[s][1], shapes[s][2], way & 1, (way >> 1) & 1, (way >> 2) & 1);
}

int main(void) {
    test_pack();
    test_all(&nl_amx_tiles_emu_chain, 1); /* bit for bit against the chain model */
    test_all(&nl_amx_tiles_emu, 0);       /* the checks of the real instructions, on the hardware's reading */
    const nl_amx_tiles *real = nl_amx_tiles_of("amx");
    if (real) test_all(real, 0);
    else printf("no usable AMX here: the real instructions not run (the emulator was)\n");
    /* Arm SME's tiles (kernels_sme.c; BFMOPA rounds to odd: test_amx checks its bits) within the bound */
    const nl_amx_tiles *sme = nl_amx_tiles_of("sme");
    if (sme) test_all(sme, 0);
    else printf("no usable SME here: its tiles not run\n");
    CHECK(nl_amx_tiles_of("amx-emu") == &nl_amx_tiles_emu && nl_amx_tiles_of("bf16") == NULL &&
          nl_amx_tiles_of(NULL) == NULL);
    return nl_t_done();
}

/* cpu/tiles: packing into the tile layouts and the GEMM over 2×2 blocks of 16×16 FP32 tiles
 * (contract: tiles.h). The layouts are those of the BF16 attention's packers (cpu/gemm_bf16.h:
 * A rows = "rows" / "pairs_t" words, B pairs = "pairs" / "rows_t"), which run where the CPU has
 * AVX512_BF16 (every AMX CPU has it); elsewhere the scalar loops below give the same bits. An
 * output block goes through a 64-byte aligned buffer in the tiles' layout (cpu/amx.h's
 * nl_amx_block): loaded from C when accumulating, stored back after, so edge blocks need no
 * padding of C; a whole 32×32 block the tiles load and store in C itself (nl_amx_block.ldc). */
#include "cpu/tiles.h"

#include <string.h>

#include "cpu/gemm_bf16.h"

/* FP32 -> BF16 as vcvtne2ps2bf16 converts (the vector packers): cpu/amx.h's */
static uint16_t bf16(float f) { return nl_amx_f32_to_bf16(f); }

static uint32_t pair(float lo, float hi) { return (uint32_t)bf16(lo) | (uint32_t)bf16(hi) << 16; }

#if defined(__x86_64__)
/* the vector packers, where they run and the destination is whole words */
static int vec_ok(const void *dst, int64_t ldd_halves) {
    return nl_bf16_ok() && ldd_halves % 2 == 0 && ((uintptr_t)dst & 3) == 0;
}
#endif

void nl_tile_pack_a(uint16_t *dst, int64_t ldd, const float *x, int64_t ld, int trans, int M, int K) {
    const int Mp = nl_tile_up(M), Kp = nl_tile_up(K);
#if defined(__x86_64__)
    if (vec_ok(dst, ldd)) {
        uint32_t *d = (uint32_t *)(void *)dst;
        if (trans) nl_bf16_pairs_t(d, ldd / 2, x, ld, K, M, Kp / 2);
        else nl_bf16_rows(d, ldd / 2, x, ld, M, K, Kp / 2);
        for (int m = M; m < Mp; m++) memset(dst + (int64_t)m * ldd, 0, sizeof(uint16_t) * (size_t)Kp);
        return;
    }
#endif
    for (int m = 0; m < Mp; m++) {
        uint16_t *d = dst + (int64_t)m * ldd;
        int k = 0;
        if (m < M) {
            if (trans)
                for (; k < K; k++) d[k] = bf16(x[(int64_t)k * ld + m]);
            else
                for (; k < K; k++) d[k] = bf16(x[(int64_t)m * ld + k]);
        }
        for (; k < Kp; k++) d[k] = 0;
    }
}

void nl_tile_pack_b(uint32_t *dst, int64_t ldd, const float *x, int64_t ld, int trans, int K, int N) {
    const int W = nl_tile_up(K) / 2, Np = nl_tile_up(N);
#if defined(__x86_64__)
    if (vec_ok(dst, 2 * ldd)) {
        if (trans) nl_bf16_rows_t(dst, ldd, x, ld, N, K, Np);
        else nl_bf16_pairs(dst, ldd, x, ld, K, N, Np);
        for (int w = (K + 1) / 2; w < W; w++) memset(dst + (int64_t)w * ldd, 0, sizeof(uint32_t) * (size_t)Np);
        return;
    }
#endif
    if (trans) {
        for (int n = 0; n < Np; n++) {
            const float *xr = x + (int64_t)n * ld;
            for (int w = 0; w < W; w++) {
                const int k = 2 * w;
                const float lo = n < N && k < K ? xr[k] : 0.0f, hi = n < N && k + 1 < K ? xr[k + 1] : 0.0f;
                dst[(int64_t)w * ldd + n] = pair(lo, hi);
            }
        }
        return;
    }
    for (int w = 0; w < W; w++) {
        uint32_t *d = dst + (int64_t)w * ldd;
        const int k = 2 * w;
        const float *x0 = x + (int64_t)k * ld, *x1 = x0 + ld;
        int n = 0;
        if (k + 1 < K)
            for (; n < N; n++) d[n] = pair(x0[n], x1[n]);
        else if (k < K)
            for (; n < N; n++) d[n] = pair(x0[n], 0.0f);
        for (; n < Np; n++) d[n] = 0;
    }
}

/* an edge block (mr or nr < 32): tile (i, j), row r: c[(2i + j)·256 + 16r + col] =
 * C[m0 + 16i + r][n0 + 16j + col] */
static void block_io(float *c, float *C, int64_t ldc, int mr, int nr, int store) {
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < 16; r++) {
            const int m = 16 * i + r;
            for (int j = 0; j < 2; j++) {
                float *t = c + (2 * i + j) * 256 + 16 * r;
                int nc = m < mr ? nr - 16 * j : 0;
                nc = nc < 0 ? 0 : nc > 16 ? 16 : nc;
                float *cr = C + (int64_t)m * ldc + 16 * j;
                if (store) {
                    if (nc) memcpy(cr, t, sizeof(float) * (size_t)nc);
                } else {
                    if (nc) memcpy(t, cr, sizeof(float) * (size_t)nc);
                    memset(t + nc, 0, sizeof(float) * (size_t)(16 - nc));
                }
            }
        }
}

void nl_tile_gemm(const nl_amx_tiles *tl, float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint32_t *B,
                  int64_t ldb, int M, int N, int K, int accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int m = 0; m < M; m++) memset(C + (int64_t)m * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    _Alignas(64) float c[1024];
    tl->begin();
    /* blocks in any order (each its own): the smaller operand's panels stay in L1 while the
     * other streams once (A's rows outer when B is the smaller) */
    const int a_outer = (int64_t)M > (int64_t)N;
    const int nm = (M + 31) / 32, nn = (N + 31) / 32;
    for (int bi = 0; bi < nm * nn; bi++) {
        const int m0 = 32 * (a_outer ? bi / nn : bi % nm), n0 = 32 * (a_outer ? bi % nn : bi / nm);
        {
            const int mr = M - m0 < 32 ? M - m0 : 32, nr = N - n0 < 32 ? N - n0 : 32;
            float *Cb = C + (int64_t)m0 * ldc + n0;
            const int whole = mr == 32 && nr == 32; /* the tiles load and store C itself */
            if (accumulate && !whole) block_io(c, Cb, ldc, mr, nr, 0);
            const uint16_t *a = A + (int64_t)m0 * lda;
            nl_amx_block b = {.a = {(const uint8_t *)a, (const uint8_t *)(a + 16 * lda)},
                              .b = {(const uint8_t *)(B + n0), (const uint8_t *)(B + n0 + 16)},
                              .lda = lda * 2,
                              .ldb = ldb * 4,
                              .astep = 64,
                              .bstep = 16 * ldb * 4,
                              .steps = (K + 31) / 32,
                              .load = accumulate,
                              .c = whole ? Cb : c,
                              .ldc = whole ? ldc * 4 : 0};
            tl->block(&b);
            if (!whole) block_io(c, Cb, ldc, mr, nr, 1);
        }
    }
    tl->end();
}

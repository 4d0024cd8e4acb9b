/* cpu/amx_kern: the tile kernel, one source built twice (amx.h): kernels_amx.c defines the
 * TILE_* macros as the real instructions, amx_emu.c as the emulator's functions. Before
 * including, define:
 *   AMX_FN(name)        the function name for this build
 *   AMX_ATTR            function attributes (none: kernels_amx.c has the AMX flags as a file)
 *   TILE_LOADCONFIG(p)  TILE_RELEASE()  TILE_ZERO(t)  TILE_LOAD(t, p, stride)
 *   TILE_STORE(t, p, stride)  TILE_DP(c, a, b)      (TDPBF16PS c += a·b)
 * Tiles: 0-3 the 2×2 FP32 accumulators C(i,j) = tile 2i+j, 4-5 the A tiles, 6-7 the B tiles;
 * every tile is configured 16 rows × 64 bytes (nl_amx_config; the data is zero-padded to whole
 * tiles). */

#include "cpu/amx.h"

/* the configuration is the shared object (amx.h: never a local the compiler may half-build) */
AMX_ATTR static void AMX_FN(begin)(void) { TILE_LOADCONFIG(&nl_amx_config); }

AMX_ATTR static void AMX_FN(end)(void) { TILE_RELEASE(); }

/* C(i,j) += A_i · B_j for the 2×2 block; loads of an A pair / a B pair (tile numbers are
 * compile-time constants of the instructions) */
#define AMX_DP4()                                                                                                      \
    do {                                                                                                               \
        TILE_DP(0, 4, 6);                                                                                              \
        TILE_DP(1, 4, 7);                                                                                              \
        TILE_DP(2, 5, 6);                                                                                              \
        TILE_DP(3, 5, 7);                                                                                              \
    } while (0)
#define AMX_LOAD_A(p0, p1, ld)                                                                                         \
    do {                                                                                                               \
        TILE_LOAD(4, p0, ld);                                                                                          \
        TILE_LOAD(5, p1, ld);                                                                                          \
    } while (0)
#define AMX_LOAD_B(p0, p1, ld)                                                                                         \
    do {                                                                                                               \
        TILE_LOAD(6, p0, ld);                                                                                          \
        TILE_LOAD(7, p1, ld);                                                                                          \
    } while (0)

/* The A·B, A·Blo, Alo·B order of a split step is the contract of amx.h (it makes both
 * directions see hi + lo of a weight the same way). */
AMX_ATTR static void AMX_FN(block)(const nl_amx_block *k) {
    /* C(i,j) at c[i][j], rows ldc bytes apart (amx.h: the tiles' layout or the caller's matrix) */
    const int64_t ldc = k->ldc ? k->ldc : 64, rs = k->ldc ? 16 * k->ldc : 2048;
    uint8_t *const c0 = (uint8_t *)k->c, *const c1 = c0 + (k->ldc ? 64 : 1024);
    uint8_t *const c2 = c0 + rs, *const c3 = c1 + rs;
    if (k->load) {
        TILE_LOAD(0, c0, ldc);
        TILE_LOAD(1, c1, ldc);
        TILE_LOAD(2, c2, ldc);
        TILE_LOAD(3, c3, ldc);
    } else {
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
    }
    const int split = k->alo[0] != NULL;
    for (int s = 0; s < k->steps; s++) {
        const int64_t ao = (int64_t)s * k->astep, bo = (int64_t)s * k->bstep;
        AMX_LOAD_A(k->a[0] + ao, k->a[1] + ao, k->lda);
        AMX_LOAD_B(k->b[0] + bo, k->b[1] + bo, k->ldb);
        AMX_DP4();
        if (split) {
            AMX_LOAD_B(k->blo[0] + bo, k->blo[1] + bo, k->ldb);
            AMX_DP4();
            AMX_LOAD_A(k->alo[0] + ao, k->alo[1] + ao, k->lda);
            AMX_LOAD_B(k->b[0] + bo, k->b[1] + bo, k->ldb);
            AMX_DP4();
        }
    }
    TILE_STORE(0, c0, ldc);
    TILE_STORE(1, c1, ldc);
    TILE_STORE(2, c2, ldc);
    TILE_STORE(3, c3, ldc);
}

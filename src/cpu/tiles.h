/* cpu/tiles.h (for nn/): the nodes' own products on the matrix engine's tiles — the
 * attention's Q·Kᵀ, P·V and their backward, the LoRA rank-r products — through the tile
 * operations of cpu/amx.h (nl_amx_tiles: the real AMX instructions where the CPU has them,
 * the portable emulator elsewhere; the runtime takes the service's: nl_amx_tiles_of).
 *
 * One GEMM form: C[M][N] (=|+=) A·B, A as BF16 rows (M × K, the reduction along each row),
 * B as VNNI pairs (row w holds (B[2w][n], B[2w+1][n]) for every n), both rounded from FP32 to
 * nearest even by the packers (as vcvtne2ps2bf16 rounds: an FP32 denormal reads as zero, a NaN
 * is quieted; the same bits with or without AVX512_BF16) and zero padded to whole tiles: A to
 * up(M) rows of up(K) values,
 * B to up(K)/2 rows of up(N) pairs (up: the next multiple of 32). Every C element is one
 * accumulation over k = 0 .. up(K)−1 in 32-element steps, ascending (TDPBF16PS), from 0 or
 * from C's old value: the same bits whatever M, N, the rows of A or the columns of B beside
 * it — so callers may split rows or columns over threads — and whatever the caller's split of
 * its reduction into consecutive calls of whole 32-element steps (accumulate = 1). */
#ifndef NL_NN_TILES_H
#define NL_NN_TILES_H

#include <stdint.h>

#include "cpu/amx.h"

static inline int nl_tile_up(int n) { return (n + 31) / 32 * 32; }

/* A operand into dst (row stride ldd >= up(K) values): trans 0: A[m][k] = x[m·ld + k];
 * trans 1: A[m][k] = x[k·ld + m]. Writes up(M) rows × up(K) values (zeros past M, K). */
void nl_tile_pack_a(uint16_t *dst, int64_t ldd, const float *x, int64_t ld, int trans, int M, int K);
/* B operand into dst (row stride ldd >= up(N) pairs): trans 0: B[k][n] = x[k·ld + n];
 * trans 1: B[k][n] = x[n·ld + k]. Writes up(K)/2 rows × up(N) pairs (zeros past K, N). */
void nl_tile_pack_b(uint32_t *dst, int64_t ldd, const float *x, int64_t ld, int trans, int K, int N);

/* C[M][N] (row stride ldc) (+)= A·B over K: A packed (row stride lda values, up(M) rows
 * readable), B packed (row stride ldb pairs, up(N) pairs of each row readable); the padding
 * past K must be the packers' zeros in both. */
void nl_tile_gemm(const nl_amx_tiles *tl, float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint32_t *B,
                  int64_t ldb, int M, int N, int K, int accumulate);

#endif

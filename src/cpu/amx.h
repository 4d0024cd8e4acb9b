/* cpu/amx: the host backend's matrix-engine path (Intel AMX: BF16 tiles, FP32 accumulation):
 * host.c selects it (proj/host.h is the host's knob); the tile operations (nl_amx_tiles) also
 * serve the nodes' own products (cpu/tiles.h).
 *
 * One kernel source (amx_kern.h) is built twice: against the real tile instructions
 * (kernels_amx.c, x86-64, run only where nl_amx_available() says so) and against a portable C
 * tile emulator (amx_emu.c, every machine), so the packing, the VNNI layout and the role swap
 * are tested everywhere. docs/amx.md has the instruction facts.
 *
 * Both directions read W's resident rows as stored, through the type's one dequantizer
 * (nl_host_dequant), rounded to BF16 (hi) and, split, the rest rounded again (lo = bf16(w - hi)):
 *   FWD  Y tile[t][n]  = Σ_k A[t][k]·B[k][n]   A = 16 rows of X (t) × 32 k,
 *                                              B = W's rows in VNNI pairs: row r = (W[n][2r], W[n][2r+1])
 *        (split: Yᵀ tile[n][t], A = 16 rows of W, B = Xᵀ in pairs, the order below kept)
 *   BWD  Y tile[t][k]  = Σ_n A[t][n]·B[n][k]   A = 16 rows of dY (t) × 32 n,
 *                                              B = W's rows interleaved pairwise: row r =
 *                                              (W[2r][k], W[2r+1][k]) for 16 k
 * No transposed or second copy of W exists; a tile of W is packed on the fly from its rows.
 * Split-BF16 (the recurrent F16 weights): three products per step, in this order,
 * hi·hi, hi(A)·lo(B), lo(A)·hi(B) — an F16 weight is exactly hi + lo, so both directions see the
 * F16 value itself (one-hot: whi + wlo in FP32, the same sum both ways).
 * Every output element is one accumulation over its reduction in 32-element steps, ascending;
 * threads split output tiles (FWD: 32-row panels of W; BWD: 64-column panels of k), never the
 * reduction, so any thread count gives the same bits, and any T (rows are independent). */
#ifndef NL_CPU_AMX_H
#define NL_CPU_AMX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/kernels.h"

/* One 2×2 block of 16×16 FP32 tiles: c[(2i+j)·256 + 16r + col] (=|+=) Σ_s A_i(s) · B_j(s)
 * (ldc 0), or with ldc > 0 a 32×32 block of a caller's matrix: row 16i + r, column 16j + col at
 * c + (16i + r)·ldc bytes + 16j floats (loaded and stored there; no alignment needed).
 * A_i(s) = 16 rows of 32 BF16 at a[i] + s·astep (rows lda bytes apart); B_j(s) = 16 rows of 16
 * BF16 pairs at b[j] + s·bstep (rows ldb bytes apart). With alo/blo (split), each step adds
 * A·B, then A·Blo, then Alo·B (alo/blo: the lo planes at the same offsets from their bases). */
typedef struct {
    const uint8_t *a[2], *b[2];
    const uint8_t *alo[2], *blo[2]; /* NULL unless split */
    int64_t lda, ldb, astep, bstep; /* bytes */
    int steps;
    int load;    /* 1: start from c, 0: from zero */
    float *c;    /* ldc 0: 4 × 256 floats, 64-byte aligned */
    int64_t ldc; /* bytes between the rows of c; 0: the tiles' own layout above */
} nl_amx_block;

/* The 64-byte tile configuration (ldtilecfg's operand, the SDM's palette 1 layout): byte 0
 * palette 1, byte 1 start_row 0, bytes 2-15 reserved (zero), colsb[16] (bytes per row of tile
 * i), rows[16]. */
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} nl_amx_cfg;

/* The one configuration every tile kernel loads (amx.c): tiles 0-7 16 rows x 64 bytes, tiles
 * 8-15 and the reserved bytes zero. An object in memory, never built on the stack: gcc 12's
 * _tile_loadconfig declares only 8 bytes of its operand as read, so the stores of a local
 * configuration's colsb/rows were dead to the compiler (it dropped them; ldtilecfg then read
 * the stack's garbage). */
extern const nl_amx_cfg nl_amx_config;
/* 1 if ldtilecfg accepts the 64 bytes at cfg as a palette-1 configuration (the SDM's rules;
 * amx_emu.c: the emulator refuses what the hardware would) */
int nl_amx_config_ok(const void *cfg);

typedef struct nl_amx_tiles {
    const char *name;    /* "amx" or "amx-emu" */
    void (*begin)(void); /* load the tile configuration (once per thread and task) */
    void (*block)(const nl_amx_block *blk);
    void (*end)(void); /* release the tiles */
} nl_amx_tiles;

/* amx_emu.c, every machine: TDPBF16PS as the hardware computes it (the SDM's reading: two
 * partial sums per output and instruction, measured bit for bit on a Xeon with AMX) */
extern const nl_amx_tiles nl_amx_tiles_emu;
/* amx_emu.c, for the tests: the same kernel with TDPBF16PS as the intrinsics guide's chain (one
 * FMA-free chain per output; other bits); the tests' plain C models of whole products are
 * chains, and what they check on the real instructions must hold on both readings */
extern const nl_amx_tiles nl_amx_tiles_emu_chain;
#if defined(NL_HAVE_AMX)
extern const nl_amx_tiles nl_amx_tiles_real; /* kernels_amx.c: x86-64 with a compiler that has AMX */
#endif

#if defined(NL_HAVE_AMX)
/* cpu/peak's register-only loop on the real tiles (kernels_amx.c): `it` iterations of 4
 * TDPBF16PS (int8 0) or TDPBSSD (1); returns the operations done. Only where
 * nl_amx_available() (and, for int8, the CPU's AMX-INT8). */
double nl_amx_peak_loop(int int8, long it);
#endif

#if defined(NL_HAVE_SME)
/* kernels_sme.c (aarch64, built by a compiler with SME): the same block on Arm SME (BFMOPA into
 * ZA tiles, 512-bit streaming vectors); only where nl_sme_available() */
extern const nl_amx_tiles nl_amx_tiles_sme;
int nl_sme_svl_bytes(void); /* this thread's streaming vector length */
#endif
/* 1 if the SME tile kernel may run here (cpu/sme.c: built, HWCAP2_SME, a 512-bit streaming
 * vector length); why gets the reason when it is 0 */
int nl_sme_available(char *why, size_t cap);

/* 1 if the real tile instructions may run in this process: CPUID AMX-TILE and AMX-BF16, the OS
 * tile state (XCR0 bits 17, 18) and the Linux permission (arch_prctl ARCH_REQ_XCOMP_PERM). The
 * answer is found once and kept; why (may be NULL) gets the reason when it is 0. */
int nl_amx_available(char *why, size_t cap);

/* The tile operations named `name` (nl_amx_tiles.name): "amx" the real instructions (only
 * where nl_amx_available), "sme" Arm's (only where nl_sme_available), "amx-emu" the emulator,
 * anything else NULL. The nodes do not call
 * this: they take the service's answer (proj.h: nl_proj_node_tiles). */
const nl_amx_tiles *nl_amx_tiles_of(const char *compute);

/* FP32 -> BF16 as VCVTNEPS2BF16 / VCVTNE2PS2BF16 convert (what the AVX512_BF16 packers give):
 * nearest even, a NaN quieted, an FP32 denormal read as a zero of its sign. The scalar packing of
 * the tile operands (here and in nn/tiles) rounds this way, so their bits do not depend on the
 * CPU's ISA. */
static inline uint16_t nl_amx_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7f800000u)) return (uint16_t)(u >> 16 & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

#endif

/* cpu/kernels_sme: the tile kernel (amx.h's nl_amx_block contract) on Arm SME: streaming mode,
 * ZA tiles, BFMOPA outer products: the Arm counterpart of kernels_amx.c, driven by the same
 * packing (proj/amx.c: FWD and BWD from the same resident bytes by swapping the operands' roles)
 * and serving the nodes' tile products (cpu/tiles.c) the same way.
 *
 * Built with clang (gcc 12 has no SME): CMakeLists.txt compiles this file alone with
 * NL_SME_CC -march=armv9-a+sme and defines NL_HAVE_SME; without such a compiler the file is
 * left out and cpu/sme.c answers "not built". nl_sme_available() (cpu/sme.c: HWCAP2_SME and a
 * 512-bit streaming vector length, set per thread with prctl) comes before any call.
 *
 * With SVL = 512 bits a ZA.S tile is 16×16 FP32, AMX's tile shape. A block's 2×2 FP32 tiles are
 * done as two passes, i = 0 and 1: ZA0, ZA1 accumulate C(i,0), C(i,1); ZA2 (and ZA3, the lo
 * plane when split) holds A_i(s), loaded row by row (horizontal slices) and read column by column
 * (vertical slices): column p is the 16 rows' pair (A[r][2p], A[r][2p+1]), BFMOPA's first
 * operand; B_j(s) row p (16 pairs, 64 bytes) is the second as stored. One BFMOPA adds, to every
 * element, BFDotAdd(c, a pair, b pair): the Arm ARM's BF16 arithmetic with FPCR.EBF = 0 (each
 * product and sum rounded to odd, denormals flushed; as kernels_neonbf16.c's BFMMLA), so an
 * element is one chain over its pairs in order: per step A·B, then A·Blo, then Alo·B (amx.h's
 * split order). tests/test_amx.c checks it bit for bit against a C model of that arithmetic. */
#if defined(__aarch64__) && defined(NL_HAVE_SME)
#include <arm_sme.h>
#include <sys/prctl.h>

#include "cpu/amx.h"

#ifndef PR_SME_SET_VL
#define PR_SME_SET_VL 63
#endif

/* the SME ABI's lazy-save routine, which clang calls on entry to an __arm_new("za") function and
 * libgcc 12 lacks: this library never leaves a lazy save pending (its ZA functions call
 * nothing), so TPIDR2_EL0 is zero here unless other code in the process uses ZA; then it stops
 * (brk) rather than lose that code's ZA. Weak: a real runtime (compiler-rt) takes precedence. */
__asm__(".weak __arm_tpidr2_save\n"
        ".type __arm_tpidr2_save, %function\n"
        "__arm_tpidr2_save:\n"
        "  mrs x16, tpidr2_el0\n"
        "  cbz x16, 1f\n"
        "  brk #0x5a\n"
        "1: ret\n"
        ".size __arm_tpidr2_save, .-__arm_tpidr2_save\n");

int nl_sme_svl_bytes(void) { return (int)svcntsb(); }

/* a 512-bit streaming vector length for this thread (each thread has its own) */
static void sme_begin(void) {
    if (svcntsb() != 64) prctl(PR_SME_SET_VL, 64, 0, 0, 0);
}

static void sme_end(void) {}

/* ZA2 (ZA3) = the 16 rows of 32 BF16 at p, rows ld bytes apart */
#define LOAD_A(tile, p, ld)                                                                                            \
    do {                                                                                                               \
        for (uint32_t r = 0; r < 16; r++) svld1_hor_za32(tile, r, pw, (p) + (int64_t)r * (ld));                        \
    } while (0)

/* ZA0 += col p of atile ⊗ row p of b0, ZA1 += ... ⊗ row p of b1, p = 0..15 in order */
#define MOPA_STEP(atile, b0, b1, ld)                                                                                   \
    do {                                                                                                               \
        for (uint32_t p = 0; p < 16; p++) {                                                                            \
            const svbfloat16_t zn = svreinterpret_bf16_u32(svread_ver_za32_u32_m(svdup_u32(0), pw, atile, p));         \
            const svbfloat16_t z0 = svreinterpret_bf16_u8(svld1_u8(pb, (b0) + (int64_t)p * (ld)));                     \
            const svbfloat16_t z1 = svreinterpret_bf16_u8(svld1_u8(pb, (b1) + (int64_t)p * (ld)));                     \
            svmopa_za32_bf16_m(0, ph, ph, zn, z0);                                                                     \
            svmopa_za32_bf16_m(1, ph, ph, zn, z1);                                                                     \
        }                                                                                                              \
    } while (0)

__arm_locally_streaming __arm_new("za") static void sme_block(const nl_amx_block *k) {
    const svbool_t pw = svptrue_b32(), ph = svptrue_b16(), pb = svptrue_b8();
    const int split = k->alo[0] != NULL;
    /* C(i,j) rows ldc floats apart (amx.h: the tiles' layout or the caller's matrix) */
    const int64_t ldc = k->ldc ? k->ldc / 4 : 16;
    for (int i = 0; i < 2; i++) {
        float *c0 = k->ldc ? k->c + 16 * i * ldc : k->c + (2 * i) * 256, *c1 = k->ldc ? c0 + 16 : c0 + 256;
        if (k->load) {
            for (uint32_t r = 0; r < 16; r++) {
                svld1_hor_za32(0, r, pw, c0 + ldc * r);
                svld1_hor_za32(1, r, pw, c1 + ldc * r);
            }
        } else {
            svzero_mask_za(0x33); /* ZA0.S, ZA1.S */
        }
        for (int s = 0; s < k->steps; s++) {
            const int64_t ao = (int64_t)s * k->astep, bo = (int64_t)s * k->bstep;
            LOAD_A(2, k->a[i] + ao, k->lda);
            MOPA_STEP(2, k->b[0] + bo, k->b[1] + bo, k->ldb);
            if (split) {
                MOPA_STEP(2, k->blo[0] + bo, k->blo[1] + bo, k->ldb);
                LOAD_A(3, k->alo[i] + ao, k->lda);
                MOPA_STEP(3, k->b[0] + bo, k->b[1] + bo, k->ldb);
            }
        }
        for (uint32_t r = 0; r < 16; r++) {
            svst1_hor_za32(0, r, pw, c0 + ldc * r);
            svst1_hor_za32(1, r, pw, c1 + ldc * r);
        }
    }
}

const nl_amx_tiles nl_amx_tiles_sme = {
    .name = "sme",
    .begin = sme_begin,
    .block = sme_block,
    .end = sme_end,
};
#else
typedef int nl_kernels_sme_empty; /* ISO C: a translation unit must not be empty */
#endif

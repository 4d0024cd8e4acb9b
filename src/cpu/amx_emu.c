/* cpu/amx_emu: a portable C implementation of the tile operations amx_kern.h uses, and the
 * kernel built against it. Each thread has its own tile registers and configuration (as each
 * core has them). Two readings of TDPBF16PS (amx.h, docs/amx.md):
 *   nl_amx_tiles_emu (what `amx-emu` and NL_AMX=emulate run): the SDM's Operation section, the
 *     hardware's arithmetic (measured bit for bit on a Xeon with AMX, test_amx checks it where
 *     the CPU has AMX): per output, two FP32 partial sums from zero over one instruction's 16
 *     pairs, the even and the odd elements (FMAs, each rounded to nearest even, FTZ), then
 *     their sum, then that added to c;
 *   nl_amx_tiles_emu_chain (the tests' whole-product models): the intrinsics guide's chain, for
 *     every pair p in order c += a[m][2p]·b[p][n].lo, then c += a[m][2p+1]·b[p][n].hi.
 * Products of two BF16 are exact in FP32; BF16 denormal inputs read as zero (DAZ), FP32
 * denormal sums become a zero of their sign (FTZ). The product is exact, so whether the
 * compiler contracts a*b + c into an FMA (ISO C mode: it does not) could only show where a
 * product underflows. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/amx.h"

/* the one tile configuration (amx.h), beside the emulator that checks it: built on every machine */
_Static_assert(sizeof(nl_amx_cfg) == 64, "the tile configuration is 64 bytes");

_Alignas(64) const nl_amx_cfg nl_amx_config = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

typedef struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][1024]; /* 16 rows of 64 bytes */
} emu_state;

static _Thread_local emu_state g_tiles;

static float bf16_in(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    if (!(u & 0x7f800000u)) u &= 0x80000000u; /* DAZ */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ftz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (!(u & 0x7f800000u)) u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}

/* 1 if ldtilecfg accepts cfg as palette 1 (the SDM's #GP rules; palette 0 = release is not
 * checked here): start_row 0, reserved bytes 2-15, 32-47 (colsb of tiles 8-15) and 56-63 (their
 * rows) zero; each of tiles 0-7 at most 16 rows and 64 bytes a row, both zero when unused. */
int nl_amx_config_ok(const void *cfgp) {
    const uint8_t *cfg = cfgp;
    if (cfg[0] != 1 || cfg[1] != 0) return 0;
    for (int i = 2; i < 16; i++)
        if (cfg[i]) return 0;
    for (int i = 32; i < 48; i++)
        if (cfg[i]) return 0;
    for (int i = 56; i < 64; i++)
        if (cfg[i]) return 0;
    for (int i = 0; i < 8; i++) {
        uint16_t cb;
        memcpy(&cb, cfg + 16 + 2 * i, 2);
        const int rows = cfg[48 + i];
        if (cb > 64 || rows > 16 || (cb == 0) != (rows == 0)) return 0;
    }
    return 1;
}

/* A configuration the hardware would refuse (#GP) leaves the tiles unconfigured: a store then
 * writes NaNs, so no test can pass on it. */
static void emu_loadconfig(const void *cfgp) {
    const uint8_t *cfg = cfgp;
    emu_state *t = &g_tiles;
    memset(t, 0, sizeof *t);
    if (cfg[0] == 0 || !nl_amx_config_ok(cfg)) return; /* palette 0: tiles released */
    for (int i = 0; i < 8; i++) {
        memcpy(&t->colsb[i], cfg + 16 + 2 * i, 2);
        t->rows[i] = cfg[48 + i];
    }
    t->configured = 1;
}

static void emu_release(void) { memset(&g_tiles, 0, sizeof g_tiles); }

static void emu_zero(int t) { memset(g_tiles.data[t], 0, sizeof g_tiles.data[t]); }

static void emu_load(int t, const void *p, int64_t stride) {
    emu_state *s = &g_tiles;
    memset(s->data[t], 0, sizeof s->data[t]);
    for (int r = 0; r < s->rows[t]; r++) memcpy(s->data[t] + 64 * r, (const uint8_t *)p + r * stride, s->colsb[t]);
}

static void emu_store(int t, void *p, int64_t stride) {
    emu_state *s = &g_tiles;
    if (!s->configured) { /* the hardware: #UD */
        const float nan = NAN;
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) memcpy((uint8_t *)p + r * stride + 4 * c, &nan, 4);
        return;
    }
    for (int r = 0; r < s->rows[t]; r++) memcpy((uint8_t *)p + r * stride, s->data[t] + 64 * r, s->colsb[t]);
}

/* c (M×N FP32) += a (M × K BF16) · b (K/2 rows of N pairs); M = rows[c], N = colsb[c]/4,
 * K/2 = colsb[a]/4 (the instruction's shape rules; the kernel configures full tiles). */
static void emu_dp(int ci, int ai, int bi) {
    emu_state *s = &g_tiles;
    const int M = s->rows[ci], N = s->colsb[ci] / 4, KP = s->colsb[ai] / 4;
    float b0[16][16], b1[16][16];
    for (int p = 0; p < KP; p++)
        for (int n = 0; n < 16; n++) {
            uint16_t h[2];
            memcpy(h, s->data[bi] + 64 * p + 4 * n, 4);
            b0[p][n] = bf16_in(h[0]);
            b1[p][n] = bf16_in(h[1]);
        }
    for (int m = 0; m < M; m++) {
        float acc[16];
        memcpy(acc, s->data[ci] + 64 * m, 64);
        const uint8_t *ar = s->data[ai] + 64 * m;
        for (int p = 0; p < KP; p++) {
            uint16_t h[2];
            memcpy(h, ar + 4 * p, 4);
            const float a0 = bf16_in(h[0]), a1 = bf16_in(h[1]);
            for (int n = 0; n < 16; n++) {
                float v = ftz(acc[n] + a0 * b0[p][n]);
                acc[n] = ftz(v + a1 * b1[p][n]);
            }
        }
        memcpy(s->data[ci] + 64 * m, acc, 4 * (size_t)N);
    }
}

/* TDPBF16PS as the SDM's Operation section reads it and the hardware computes it (measured,
 * docs/amx.md): per output, two FP32 partial sums from zero, the even and the odd elements of
 * the pairs, each step an FMA (one rounding, nearest even, FTZ); then their sum, added to c.
 * Other bits than emu_dp's chain. */
static void emu_dp_sdm(int ci, int ai, int bi) {
    emu_state *s = &g_tiles;
    const int M = s->rows[ci], N = s->colsb[ci] / 4, KP = s->colsb[ai] / 4;
    for (int m = 0; m < M; m++) {
        float acc[16];
        memcpy(acc, s->data[ci] + 64 * m, 64);
        const uint8_t *ar = s->data[ai] + 64 * m;
        for (int n = 0; n < N; n++) {
            float ev = 0.0f, od = 0.0f;
            for (int p = 0; p < KP; p++) {
                uint16_t a[2], b[2];
                memcpy(a, ar + 4 * p, 4);
                memcpy(b, s->data[bi] + 64 * p + 4 * n, 4);
                ev = ftz(fmaf(bf16_in(a[0]), bf16_in(b[0]), ev));
                od = ftz(fmaf(bf16_in(a[1]), bf16_in(b[1]), od));
            }
            acc[n] = ftz(acc[n] + ftz(ev + od));
        }
        memcpy(s->data[ci] + 64 * m, acc, 4 * (size_t)N);
    }
}

#define AMX_FN(name) emu_##name
#define AMX_ATTR
#define TILE_LOADCONFIG(p) emu_loadconfig(p)
#define TILE_RELEASE() emu_release()
#define TILE_ZERO(t) emu_zero(t)
#define TILE_LOAD(t, p, stride) emu_load(t, p, stride)
#define TILE_STORE(t, p, stride) emu_store(t, p, stride)
#define TILE_DP(c, a, b) emu_dp_sdm(c, a, b)
#include "cpu/amx_kern.h"

const nl_amx_tiles nl_amx_tiles_emu = {
    .name = "amx-emu",
    .begin = emu_begin,
    .block = emu_block,
    .end = emu_end,
};

/* the same kernel on the intrinsics guide's chain (tests: the plain C models of whole products
 * are chains; what holds on any valid TDPBF16PS must hold on both) */
#undef AMX_FN
#undef TILE_DP
#define AMX_FN(name) emu_chain_##name
#define TILE_DP(c, a, b) emu_dp(c, a, b)
#include "cpu/amx_kern.h"

const nl_amx_tiles nl_amx_tiles_emu_chain = {
    .name = "amx-emu-chain",
    .begin = emu_chain_begin,
    .block = emu_chain_block,
    .end = emu_chain_end,
};

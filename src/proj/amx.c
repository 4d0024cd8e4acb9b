/* proj/amx: the driver of the tile kernels (contract: amx.h) — packing of the activations
 * (once per request) and of W's tiles (on the fly, from the resident rows through the type's
 * dequantizer), the thread split over output tiles, and the scatter of finished tiles into Y.
 * The same code drives the real instructions and the emulator. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "proj/host.h"
#include "util/util.h"

#define BWD_KW 64 /* BWD output columns k per panel (4 tiles) */
/* BWD reduction rows n per packed chunk of W pairs: a 32-column pair's chunk is then 16 KiB,
 * in L1 while dY's rows go by (bench proj on the Xeon: 256 over 128, 512 and 1024) */
#define BWD_NC 256
/* BWD: uint32 pairs of one 32-column tile pair's chunk (BWD_NC/2 rows × 32, 16 KiB) */
#define BWD_KPS ((int64_t)BWD_NC / 2 * 32)
/* FWD, not split, neither Q8_0's own pairs: k per chunk of 16 rows decoded into FP32 (16 KiB,
 * in L1) and turned into pairs in registers (fwd_pairs_f32); a multiple of every block size */
#define FWD_KC 256

typedef struct {
    void *mem;
    size_t cap;
    uint16_t *whi;       /* FWD, the tile path (fwd_rows): 32 rows × Kp BF16 */
    float *dq;           /* FWD, the pairs path (fwd_rows): 16 rows × FWD_KC floats */
    uint32_t *wp;        /* FWD: the group's panels; not split: VNNI pairs, Kp/2 rows × 32 each; split:
                          * hi then lo BF16 rows, 32 × pad_ld(Kp) each (fwd_panel_bytes) */
    uint32_t *phi, *plo; /* BWD: per 32 columns kp, BWD_NC/2 rows × 32 pairs (BWD_KPS), gw/32 of them */
    float *row;          /* FWD: Kp floats; BWD: 2 × gw floats */
    float *acc;          /* BWD: Tp × gw floats of partial sums */
    float *c;            /* 1024 floats: one 2×2 block of tiles */
    nl_block_q8_0 *zq8;  /* FWD: Kp/32 zero blocks (a Q8_0 panel's rows past N) */
} amx_scratch;

struct nl_amx_ctx {
    int nth;
    amx_scratch *scr;
    uint16_t *xmem; /* the packed activations: hi plane, then lo plane (split) */
    size_t xcap;
};

typedef struct {
    nl_amx_ctx *a;
    const nl_amx_tiles *tl;
    const nl_host_kernels *ks;
    const nl_proj_weight *w;
    const float *x;
    float *y;
    int T, split;
    int64_t K, N, Kp, Np, Tp; /* Kp, Np: K, N rounded up to 32; Tp: T rounded up to 32 */
    int gp;                   /* BWD: 64-column panels per group (bwd_group) */
    int gf;                   /* FWD: 32-row panels per group (fwd_group) */
    int64_t ldx;              /* row stride (elements) of the packed activations: pad_ld(Kp or Np), not split FWD */
    uint16_t *xhi, *xlo;
    size_t rb; /* bytes of one row of W */
} amx_job;

static int64_t up32(int64_t v) { return (v + 31) / 32 * 32; }

/* A row stride of n (a multiple of 32) elements plus one cache line: the 16 rows of a tile load
 * then fall in 16 different L1 sets (a multiple of 2 KiB would put them in 2 and evict) */
static int64_t pad_ld(int64_t n) { return n + 32; }

/* the packed activations' row stride: FWD split keeps Kp (its VNNI-pair layout), else pad_ld */
static int64_t x_ld(nl_dir dir, int split, int64_t Kp, int64_t Np) {
    return dir == NL_FWD ? (split ? Kp : pad_ld(Kp)) : pad_ld(Np);
}
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static float bf16_val(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 1 where the kernel set's BF16 conversions are VCVTNEPS2BF16 on this CPU: its packers then
 * round as nl_amx_f32_to_bf16 does (FP32 denormals read as zero), the tile driver's rule */
static int cvt_bf16(const nl_host_kernels *ks) { return ks->has_bf16 && nl_cpu_has(NL_CPU_AVX512BF16); }

/* hi[i] = bf16(src[i]) (nl_amx_f32_to_bf16: FP32 denormals read as zero, as the kernel set's
 * VCVTNEPS2BF16 converts; that set's to_bf16 only where the CPU has AVX512_BF16, on whole
 * 32-element blocks); lo[i] = bf16(src[i] - hi[i]) when lo is not NULL (split). */
static void to_bf16_split(const nl_host_kernels *ks, const float *src, int n, uint16_t *hi, uint16_t *lo) {
    int i = 0;
    if (ks->to_bf16 && cvt_bf16(ks)) {
        i = n / 32 * 32;
        ks->to_bf16(src, i, hi);
    }
    for (; i < n; i++) hi[i] = nl_amx_f32_to_bf16(src[i]);
    if (lo && ks->to_bf16_lo) ks->to_bf16_lo(src, hi, n, lo);
    else if (lo)
        for (int j = 0; j < n; j++) lo[j] = nl_host_f32_to_bf16(src[j] - bf16_val(hi[j]));
}

nl_amx_ctx *nl_amx_new(int n_threads) {
    nl_amx_ctx *a = nl_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->nth = n_threads < 1 ? 1 : n_threads;
    a->scr = nl_calloc((size_t)a->nth, sizeof *a->scr);
    if (!a->scr) {
        free(a);
        return NULL;
    }
    return a;
}

void nl_amx_free(nl_amx_ctx *a) {
    if (!a) return;
    for (int i = 0; i < a->nth; i++) free(a->scr[i].mem);
    free(a->scr);
    free(a->xmem);
    free(a);
}

static void *grow_aligned(void **mem, size_t *cap, size_t need) {
    if (*cap >= need) return *mem;
    free(*mem);
    *cap = 0;
    *mem = aligned_alloc(64, (need + 63) / 64 * 64);
    if (*mem) *cap = need;
    return *mem;
}

static size_t al64(size_t b) { return (b + 63) / 64 * 64; }

/* FWD: the panels a thread packs before a pass over X's t-block pairs. X (Tp rows of ldx BF16,
 * two planes split) fits L2 for most shapes and then one panel at a time; where it does not, as
 * many panels as keep them within 768 KiB, each pair's rows then read from beyond L2 once per
 * group */
static int fwd_group(int64_t Kp, int64_t Tp, int64_t ldx, int split) {
    const int64_t planes = split ? 2 : 1;
    if (Tp * ldx * 2 * planes <= 1024 * 1024) return 1;
    const int64_t g = (768 * 1024) / (Kp * 64 * planes);
    return g < 1 ? 1 : g > 8 ? 8 : (int)g;
}

/* FWD, not split: how a panel of W becomes pairs. Q8_0: the kernel set's pairs straight from
 * the blocks (q8_0_fwd_pairs); another type: each chunk of 16 rows decoded into FP32 and turned
 * into pairs in registers (fwd_pairs_f32); both where the set has them with VCVTNEPS2BF16, the
 * rounding to_bf16_split uses there. Else (no such kernels): BF16 rows in a tile, transposed. */
enum { FWD_TILE, FWD_Q8, FWD_PAIRS };
static int fwd_path(const nl_host_kernels *ks, int type) {
    if (!cvt_bf16(ks)) return FWD_TILE;
    if (type == NL_TYPE_Q8_0 && ks->q8_0_fwd_pairs) return FWD_Q8;
    return ks->fwd_pairs_f32 ? FWD_PAIRS : FWD_TILE;
}

/* FWD: bytes of a thread's rows for the panel packing (fwd_path): the tile path's 32 BF16 rows,
 * the pairs path's 16 FP32 rows of a chunk; none split (the rows go straight into the group)
 * or for Q8_0's pairs */
static size_t fwd_rows_bytes(const nl_host_kernels *ks, int type, int split, int64_t Kp) {
    if (split) return 0;
    switch (fwd_path(ks, type)) {
    case FWD_Q8: return 0;
    case FWD_PAIRS: return (size_t)16 * FWD_KC * 4;
    default: return al64((size_t)32 * (size_t)Kp * 2);
    }
}

/* FWD: bytes of one panel in the group region: not split Kp/2 × 32 pairs; split the hi and the
 * lo plane of 32 BF16 rows pad_ld(Kp) apart (a multiple of 2 KiB would put a tile load's 16 rows
 * in 2 of L1's sets) */
static size_t fwd_panel_bytes(int split, int64_t Kp) {
    return split ? 2 * al64((size_t)32 * (size_t)pad_ld(Kp) * 2) : al64((size_t)32 * (size_t)Kp * 2);
}

/* FWD: bytes of a thread's rows for the activations' packing (pack_x_fwd_pairs: 16 rows of hi and
 * of lo words, one FP32 row) */
static size_t fwd_pack_bytes(int64_t Kp) { return (size_t)Kp * (16 * 2 * 2 + 4); }

/* Lays out a thread's scratch for the job (sizes depend on K, N, T); at least `pack` bytes
 * (the packing phase's rows, from the start of the block). */
static int scratch_for(amx_job *j, nl_dir dir, amx_scratch *s, size_t pack) {
    const size_t cbytes = 1024 * 4;
    size_t need;
    if (dir == NL_FWD) {
        const size_t wr = fwd_rows_bytes(j->ks, j->w->type, j->split, j->Kp);
        const size_t wg = fwd_panel_bytes(j->split, j->Kp) * (size_t)j->gf;
        const size_t zq = al64((size_t)(j->Kp / 32) * sizeof(nl_block_q8_0));
        need = wr + wg + al64((size_t)j->Kp * 4) + cbytes + zq;
        if (need < pack) need = pack;
        if (!grow_aligned(&s->mem, &s->cap, need)) return -1;
        uint8_t *m = s->mem;
        s->whi = (uint16_t *)(void *)m;
        s->dq = (float *)(void *)m;
        s->wp = (uint32_t *)(void *)(m + wr);
        s->row = (float *)(void *)(m + wr + wg);
        s->c = (float *)(void *)(m + wr + wg + al64((size_t)j->Kp * 4));
        s->zq8 = (nl_block_q8_0 *)(void *)(m + wr + wg + al64((size_t)j->Kp * 4) + cbytes);
    } else {
        const size_t gw = (size_t)j->gp * BWD_KW;
        const size_t pp = (size_t)BWD_NC / 2 * gw * 4, acc = al64((size_t)j->Tp * gw * 4);
        need = 2 * pp + 2 * gw * 4 + acc + cbytes;
        if (need < pack) need = pack;
        if (!grow_aligned(&s->mem, &s->cap, need)) return -1;
        uint8_t *m = s->mem;
        s->phi = (uint32_t *)(void *)m;
        s->plo = (uint32_t *)(void *)(m + pp);
        s->row = (float *)(void *)(m + 2 * pp);
        s->acc = (float *)(void *)(m + 2 * pp + 2 * gw * 4);
        s->c = (float *)(void *)(m + 2 * pp + 2 * gw * 4 + acc);
    }
    return 0;
}

/* BWD: the 64-column panels a thread packs together from each chunk of rows (so every row's
 * bytes of the group are read in one pass, not 64 columns at a time across all the rows): as
 * many as keep the group's partial sums (Tp × 64·gp floats) within 512 KiB, at most 4; where
 * dY's BF16 copy (Tp × Np) is beyond 32 MiB, which every group reads again from memory, within
 * 1 MiB, at most BWD_GMAX (the head's 151936 rows on the Xeon: 94-95 ms over 98-102 in the
 * microbenchmark; the smaller shapes, dY in cache, 4-10 % slower with 8) */
#define BWD_GMAX 8
static int bwd_group(int64_t Tp, int64_t Np) {
    const int big = Tp * Np * 2 > (int64_t)32 << 20;
    const int64_t g = (big ? 1024 * 1024 : 512 * 1024) / (Tp * BWD_KW * 4), cap = big ? BWD_GMAX : 4;
    return g < 1 ? 1 : g > cap ? (int)cap : (int)g;
}

/* ---- phase 1: the activations, once per request (rows split across threads) ---- */

/* FWD, split: Xᵀ in VNNI pairs, per t-block of 16: xp[tb][r][t] = (x[t][2r], x[t][2r+1]) as BF16,
 * r < Kp/2 (zero past K and past T): the block's 16 rows rounded into the thread's scratch
 * (fwd_pack_bytes), then transposed as 32-bit words by the set's transpose32 (a scalar scatter
 * before: with a small N, e.g. qwen35's alpha and beta (N = 16), the request's main cost) */
static void pack_x_fwd_pairs(void *arg, int tid, int nth) {
    amx_job *j = arg;
    const int64_t ntb = j->Tp / 16, b0 = ntb * tid / nth, b1 = ntb * (tid + 1) / nth;
    const int64_t kp2 = j->Kp / 2;
    uint32_t *hbuf = (uint32_t *)(void *)j->a->scr[tid].mem, *lbuf = hbuf + 16 * kp2;
    float *frow = (float *)(void *)(lbuf + 16 * kp2);
    for (int64_t tb = b0; tb < b1; tb++) {
        for (int tt = 0; tt < 16; tt++) {
            const int64_t t = tb * 16 + tt;
            if (t < j->T) {
                memcpy(frow, j->x + t * j->K, (size_t)j->K * 4);
                memset(frow + j->K, 0, (size_t)(j->Kp - j->K) * 4);
            } else {
                memset(frow, 0, (size_t)j->Kp * 4);
            }
            to_bf16_split(j->ks, frow, (int)j->Kp, (uint16_t *)(void *)(hbuf + tt * kp2),
                          j->split ? (uint16_t *)(void *)(lbuf + tt * kp2) : NULL);
        }
        nl_host_transpose32(j->ks, hbuf, kp2, (uint32_t *)(void *)j->xhi + tb * kp2 * 16, 16, 16, (int)kp2);
        if (j->split)
            nl_host_transpose32(j->ks, lbuf, kp2, (uint32_t *)(void *)j->xlo + tb * kp2 * 16, 16, 16, (int)kp2);
    }
}

/* FWD, not split: X as BF16 rows xb[t][k], k < Kp, t < Tp (zero padded): the A operand. */
static void pack_x_fwd(void *arg, int tid, int nth) {
    amx_job *j = arg;
    const int64_t t0 = j->Tp * tid / nth, t1 = j->Tp * (tid + 1) / nth;
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *hi = j->xhi + t * j->ldx;
        int64_t k0 = 0;
        if (t < j->T) {
            to_bf16_split(j->ks, j->x + t * j->K, (int)j->K, hi, NULL);
            k0 = j->K;
        }
        memset(hi + k0, 0, (size_t)(j->Kp - k0) * 2);
    }
}

/* BWD: dY as BF16 rows xb[t][n], n < Np, t < Tp (zero padded), converted in place. */
static void pack_x_bwd(void *arg, int tid, int nth) {
    amx_job *j = arg;
    const int64_t t0 = j->Tp * tid / nth, t1 = j->Tp * (tid + 1) / nth;
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *hi = j->xhi + t * j->ldx, *lo = j->split ? j->xlo + t * j->ldx : NULL;
        int64_t n0 = 0;
        if (t < j->T) {
            to_bf16_split(j->ks, j->x + t * j->N, (int)j->N, hi, lo);
            n0 = j->N;
        }
        memset(hi + n0, 0, (size_t)(j->Np - n0) * 2);
        if (lo) memset(lo + n0, 0, (size_t)(j->Np - n0) * 2);
    }
}

/* ---- phase 2: the products ---- */

/* The 32 rows n0 .. n0+31 of W (zeros past N) dequantized into BF16 tile rows hi (and lo,
 * split), Kp values each (zeros past K), rows ld elements apart. */
static void panel_rows(amx_job *j, amx_scratch *s, int64_t n0, uint16_t *whi, uint16_t *wlo, int64_t ld) {
    const int64_t K = j->K, Kp = j->Kp;
    for (int r = 0; r < 32; r++) {
        uint16_t *hi = whi + (size_t)r * (size_t)ld, *lo = j->split ? wlo + (size_t)r * (size_t)ld : NULL;
        if (n0 + r < j->N) {
            nl_host_dequant(j->ks, j->w->type, (const uint8_t *)j->w->data + (size_t)(n0 + r) * j->rb, 0, (int)K,
                            s->row);
            memset(s->row + K, 0, (size_t)(Kp - K) * 4);
            to_bf16_split(j->ks, s->row, (int)Kp, hi, lo);
        } else {
            memset(hi, 0, (size_t)Kp * 2);
            if (lo) memset(lo, 0, (size_t)Kp * 2);
        }
    }
}

/* FWD, split: thread tid takes 32-row panels of W, a group of them at a time (fwd_group); each
 * is dequantized once into BF16 tile rows (hi and lo, rows pad_ld(Kp) apart) and used against
 * every t-block pair, the pairs outer so that a pair's Xᵀ meets the whole group while it is in
 * cache; a finished 2×2 block of Yᵀ tiles goes into Y transposed. Each element is the same sum
 * whatever the group (its steps ascending, one block). */
static void task_fwd_split(void *arg, int tid, int nth) {
    amx_job *j = arg;
    amx_scratch *s = &j->a->scr[tid];
    const int64_t N = j->N, Kp = j->Kp, kp2 = Kp / 2, lw = pad_ld(Kp);
    const int64_t np = (N + 31) / 32, p0 = np * tid / nth, p1 = np * (tid + 1) / nth;
    const size_t pe = fwd_panel_bytes(1, Kp) / 2; /* uint16_t elements per panel (hi + lo) */
    uint16_t *grp = (uint16_t *)(void *)s->wp;
    if (p0 >= p1) return;
    j->tl->begin();
    for (int64_t pg = p0; pg < p1; pg += j->gf) {
        const int ng = (int)min64(j->gf, p1 - pg);
        for (int g = 0; g < ng; g++) panel_rows(j, s, (pg + g) * 32, grp + g * pe, grp + g * pe + pe / 2, lw);
        for (int64_t tb = 0; tb < j->Tp / 16; tb += 2)
            for (int g = 0; g < ng; g++) {
                const int64_t n0 = (pg + g) * 32;
                const uint16_t *hi = grp + g * pe, *lo = hi + pe / 2;
                nl_amx_block b = {
                    .a = {(const uint8_t *)hi, (const uint8_t *)(hi + 16 * lw)},
                    .b = {(const uint8_t *)((const uint32_t *)(const void *)j->xhi + tb * kp2 * 16),
                          (const uint8_t *)((const uint32_t *)(const void *)j->xhi + (tb + 1) * kp2 * 16)},
                    .alo = {(const uint8_t *)lo, (const uint8_t *)(lo + 16 * lw)},
                    .blo = {(const uint8_t *)((const uint32_t *)(const void *)j->xlo + tb * kp2 * 16),
                            (const uint8_t *)((const uint32_t *)(const void *)j->xlo + (tb + 1) * kp2 * 16)},
                    .lda = lw * 2,
                    .ldb = 64,
                    .astep = 64,
                    .bstep = 1024,
                    .steps = (int)(Kp / 32),
                    .load = 0,
                    .c = s->c};
                j->tl->block(&b);
                /* tile (i, jj) holds Yᵀ[n0 + 16i + r][t = 16(tb + jj) + col] */
                for (int jj = 0; jj < 2; jj++)
                    for (int col = 0; col < 16; col++) {
                        const int64_t t = (tb + jj) * 16 + col;
                        if (t >= j->T) break;
                        float *yr = j->y + t * N + n0;
                        const int nr = (int)min64(32, N - n0);
                        for (int r = 0; r < nr; r++) yr[r] = s->c[(2 * (r / 16) + jj) * 256 + (r % 16) * 16 + col];
                    }
            }
    }
    j->tl->end();
}

/* FWD, not split: the 32 rows n0 .. n0+31 of W (zeros past N) as VNNI pairs along k into wp
 * (wp[r][n] = (W[n][2r], W[n][2r+1]), Kp/2 rows × 32) */
static void fwd_panel(amx_job *j, amx_scratch *s, int path, int64_t n0, uint32_t *wp) {
    const int64_t N = j->N, K = j->K, Kp = j->Kp, kp2 = Kp / 2;
    if (path == FWD_Q8) {
        /* Q8_0: the pairs straight from 16 rows' blocks at a time, transposed in registers: the
         * values of the dequantizer + to_bf16_split (q·d exact, then VCVTNEPS2BF16) */
        for (int h = 0; h < 2; h++) {
            const nl_block_q8_0 *rows[16];
            for (int r = 0; r < 16; r++) {
                const int64_t n = n0 + 16 * h + r;
                rows[r] = n < N ? (const nl_block_q8_0 *)(const void *)((const uint8_t *)j->w->data + (size_t)n * j->rb)
                                : s->zq8;
            }
            j->ks->q8_0_fwd_pairs(rows, (int)(Kp / 32), wp + 16 * h, 32);
        }
        return;
    }
    if (path == FWD_PAIRS) {
        /* the dequantizer's values (zeros past K and N) rounded as to_bf16_split's whole blocks,
         * as the bf16 compute's panels (host.c) */
        for (int h = 0; h < 2; h++)
            for (int64_t k0 = 0; k0 < Kp; k0 += FWD_KC) {
                const int kc = (int)min64(FWD_KC, Kp - k0), nk = (int)min64(kc, K - k0);
                const int64_t r0 = n0 + 16 * h, nr = r0 < N ? min64(16, N - r0) : 0;
                const uint8_t *w0 = (const uint8_t *)j->w->data + (size_t)(nr ? r0 : 0) * j->rb;
                nl_host_fwd_pairs16(j->ks, j->w->type, w0, j->rb, (int)nr, k0, nk, kc, s->dq, FWD_KC,
                                    wp + (k0 / 2) * 32 + 16 * h, 32);
            }
        return;
    }
    panel_rows(j, s, n0, s->whi, NULL, Kp);
    nl_host_transpose32(j->ks, (const uint32_t *)(const void *)s->whi, kp2, wp, 32, 32, (int)kp2);
}

/* FWD, not split: thread tid takes 32-row panels of W; each is dequantized once into BF16 rows
 * and turned into VNNI pairs along k (wp[r][n] = (W[n][2r], W[n][2r+1])), the B operand; A is
 * X's BF16 rows, so a finished tile is a block of Y itself (rows t, columns n), copied out row
 * by row. Each element is the same sum as the split form's Yᵀ tile (the same pairs, in the same
 * 32-element steps: a·b = b·a). */
static void task_fwd(void *arg, int tid, int nth) {
    amx_job *j = arg;
    if (j->split) {
        task_fwd_split(arg, tid, nth);
        return;
    }
    amx_scratch *s = &j->a->scr[tid];
    const int64_t N = j->N, Kp = j->Kp;
    const int64_t np = (N + 31) / 32, p0 = np * tid / nth, p1 = np * (tid + 1) / nth;
    if (p0 >= p1) return;
    const int path = fwd_path(j->ks, j->w->type);
    if (path == FWD_Q8 && N % 32) memset(s->zq8, 0, (size_t)(Kp / 32) * sizeof(nl_block_q8_0));
    j->tl->begin();
    for (int64_t pg = p0; pg < p1; pg += j->gf) {
        const int ng = (int)min64(j->gf, p1 - pg);
        for (int g = 0; g < ng; g++) fwd_panel(j, s, path, (pg + g) * 32, s->wp + (size_t)g * (size_t)Kp * 16);
        /* t-block pairs outer, the group's panels inner: a pair's rows of X stay in L2 while
         * they meet every panel of the group (X itself may not fit there) */
        for (int64_t tb = 0; tb < j->Tp / 16; tb += 2)
            for (int g = 0; g < ng; g++) {
                const int64_t n0 = (pg + g) * 32;
                const int nr = (int)min64(32, N - n0);
                const uint32_t *wp = s->wp + (size_t)g * (size_t)Kp * 16;
                const uint16_t *xa = j->xhi + tb * 16 * j->ldx;
                nl_amx_block b = {.a = {(const uint8_t *)xa, (const uint8_t *)(xa + 16 * j->ldx)},
                                  .b = {(const uint8_t *)wp, (const uint8_t *)(wp + 16)},
                                  .lda = j->ldx * 2,
                                  .ldb = 32 * 4,
                                  .astep = 64,
                                  .bstep = 16 * 32 * 4,
                                  .steps = (int)(Kp / 32),
                                  .load = 0,
                                  .c = s->c};
                j->tl->block(&b);
                /* tile (i, jj) holds Y[t = 16(tb + i) + r][n0 + 16jj + col] */
                for (int i = 0; i < 2; i++)
                    for (int r = 0; r < 16; r++) {
                        const int64_t t = (tb + i) * 16 + r;
                        if (t >= j->T) break;
                        float *yr = j->y + t * N + n0;
                        const float *c0 = s->c + (2 * i) * 256 + r * 16;
                        if (nr == 32) {
                            memcpy(yr, c0, 64);
                            memcpy(yr + 16, c0 + 256, 64);
                        } else {
                            for (int c = 0; c < nr; c++) yr[c] = c0[(c / 16) * 256 + c % 16];
                        }
                    }
            }
    }
    j->tl->end();
}

/* 16 floats, copied as one object (no call to memcpy for each 64 bytes) */
typedef struct {
    float v[16];
} bwd_f16;

/* BWD: thread tid takes 64-column panels of k, gp of them at a time (a group, bwd_group); for
 * each chunk of BWD_NC rows of W, the pairs (W[n][k], W[n+1][k]) of the group's columns are
 * packed once (each row's bytes of the group read in one pass) and used against every t-block
 * pair, the partial sums kept (exactly, as FP32) in acc between chunks; the finished group goes
 * into Y. Each element is the same chain whatever the group: chunk after chunk, ascending. */
static void task_bwd(void *arg, int tid, int nth) {
    amx_job *j = arg;
    amx_scratch *s = &j->a->scr[tid];
    const int64_t K = j->K, N = j->N, Np = j->Np;
    const int64_t nq = (K + BWD_KW - 1) / BWD_KW, q0 = nq * tid / nth, q1 = nq * (tid + 1) / nth;
    const uint8_t *W = j->w->data;
    if (q0 >= q1) return;
    const int gw = j->gp * BWD_KW;
    float *r0 = s->row, *r1 = s->row + gw;
    uint16_t h0[BWD_GMAX * BWD_KW], h1[BWD_GMAX * BWD_KW], l0[BWD_GMAX * BWD_KW], l1[BWD_GMAX * BWD_KW];
    /* Q8_0 (one product): the kernel set's pairs straight from two rows' blocks, the same values
     * as the dequantizer and to_bf16_split (VCVTNEPS2BF16's rounding, where the CPU has it) */
    const int q8 = j->w->type == NL_TYPE_Q8_0 && !j->split && j->ks->q8_0_pairs_to_bf16 && cvt_bf16(j->ks);
    /* another type, one product: the decoded rows' pairs by the set's pairs_to_bf16 (VCVTNEPS2BF16,
     * to_bf16_split's rounding there) instead of two BF16 rows interleaved */
    const int pairs = !q8 && !j->split && j->ks->pairs_to_bf16 && cvt_bf16(j->ks);
    j->tl->begin();
    for (int64_t g = q0; g < q1; g += j->gp) {
        const int64_t k0 = g * BWD_KW;
        const int kw = (int)min64(min64(q1 - g, j->gp) * BWD_KW, K - k0); /* the group's columns with data */
        const int kwp = (kw + 31) / 32 * 32;                              /* ... in whole tiles pairs */
        const int nkp = kwp / 32;
        for (int64_t n0 = 0; n0 < Np; n0 += BWD_NC) {
            const int nc = (int)min64(BWD_NC, Np - n0);
            for (int i = 0; i < nc && q8; i += 2) {
                uint32_t *ph = s->phi + (size_t)(i / 2) * 32;
                const int64_t n = n0 + i;
                if (n >= N) {
                    for (int kp = 0; kp < nkp; kp++) memset(ph + kp * BWD_KPS, 0, 32 * 4);
                    continue;
                }
                /* the group's bytes of the pair 8 rows on, asked for now: each row's run of
                 * bytes is short (kw/32 blocks) and a row apart from the next, and the hardware
                 * prefetchers left the pairs waiting on W (the microbenchmark on the Xeon: 4-6 %
                 * less time for the whole product); read once, so not kept in L2 (hint 0) */
                if (n + 9 < N) {
                    const uint8_t *p = W + (size_t)(n + 8) * j->rb + (size_t)k0 / 32 * sizeof(nl_block_q8_0);
                    for (size_t e = 0; e < (size_t)kw / 32 * sizeof(nl_block_q8_0) + 63; e += 64) {
                        __builtin_prefetch(p + e, 0, 0);
                        __builtin_prefetch(p + j->rb + e, 0, 0);
                    }
                }
                const nl_block_q8_0 *b0 = (const nl_block_q8_0 *)(const void *)(W + (size_t)n * j->rb) + k0 / 32;
                const nl_block_q8_0 *b1 =
                    n + 1 < N ? (const nl_block_q8_0 *)(const void *)(W + (size_t)(n + 1) * j->rb) + k0 / 32 : NULL;
                for (int kp = 0; kp < kw / 32; kp++)
                    j->ks->q8_0_pairs_to_bf16(b0 + kp, b1 ? b1 + kp : NULL, 1, ph + kp * BWD_KPS);
            }
            for (int i = 0; i < nc && !q8; i += 2) {
                float *rr[2] = {r0, r1};
                for (int h = 0; h < 2; h++) {
                    const int64_t n = n0 + i + h;
                    if (n < N) nl_host_dequant(j->ks, j->w->type, W + (size_t)n * j->rb, k0, kw, rr[h]);
                    else memset(rr[h], 0, (size_t)kw * 4);
                    memset(rr[h] + kw, 0, (size_t)(kwp - kw) * 4);
                }
                uint32_t *ph = s->phi + (size_t)(i / 2) * 32, *pl = s->plo + (size_t)(i / 2) * 32;
                if (pairs) {
                    /* one product: the two rows' BF16 pairs in registers, per 32 columns */
                    for (int kp = 0; kp < nkp; kp++)
                        j->ks->pairs_to_bf16(r0 + 32 * kp, r1 + 32 * kp, 32, ph + kp * BWD_KPS);
                    continue;
                }
                to_bf16_split(j->ks, r0, kwp, h0, j->split ? l0 : NULL);
                to_bf16_split(j->ks, r1, kwp, h1, j->split ? l1 : NULL);
                for (int kp = 0; kp < nkp; kp++) {
                    uint32_t *d = ph + kp * BWD_KPS;
                    const uint16_t *a = h0 + 32 * kp, *b = h1 + 32 * kp;
                    for (int c = 0; c < 32; c++) d[c] = (uint32_t)a[c] | (uint32_t)b[c] << 16;
                }
                for (int kp = 0; kp < nkp && j->split; kp++) {
                    uint32_t *d = pl + kp * BWD_KPS;
                    const uint16_t *a = l0 + 32 * kp, *b = l1 + 32 * kp;
                    for (int c = 0; c < 32; c++) d[c] = (uint32_t)a[c] | (uint32_t)b[c] << 16;
                }
            }
            /* kp outer: a kp's pairs (BWD_NC/2 rows × 32, contiguous, 16 KiB) stay in L1 while dY's
             * rows go by */
            for (int kp = 0; kp < nkp; kp++)
                for (int64_t tb = 0; tb < j->Tp / 16; tb += 2) {
                    const uint16_t *xa = j->xhi + tb * 16 * j->ldx + n0;
                    nl_amx_block b = {
                        .a = {(const uint8_t *)xa, (const uint8_t *)(xa + 16 * j->ldx)},
                        .b = {(const uint8_t *)(s->phi + BWD_KPS * kp), (const uint8_t *)(s->phi + BWD_KPS * kp + 16)},
                        .lda = j->ldx * 2,
                        .ldb = 32 * 4,
                        .astep = 64,
                        .bstep = 16 * 32 * 4,
                        .steps = nc / 32,
                        .load = n0 > 0,
                        .c = s->acc + ((tb / 2) * nkp + kp) * 1024};
                    if (j->split) {
                        const uint16_t *xl = j->xlo + tb * 16 * j->ldx + n0;
                        b.alo[0] = (const uint8_t *)xl;
                        b.alo[1] = (const uint8_t *)(xl + 16 * j->ldx);
                        b.blo[0] = (const uint8_t *)(s->plo + BWD_KPS * kp);
                        b.blo[1] = (const uint8_t *)(s->plo + BWD_KPS * kp + 16);
                    }
                    j->tl->block(&b);
                }
        }
        /* block (tb pair, kp) tile (i, jj) holds Y[t = 16(tb + i) + r][k0 + 32kp + 16jj + col]. Y
         * row by row, each row's kw columns in order, 64 bytes a copy (the microbenchmark on the
         * Xeon: 7-15 % less time for the whole product than a block at a time, its rows K floats
         * apart, through memcpy of 64 bytes) */
        for (int64_t t = 0; t < j->T; t++) {
            const float *c = s->acc + (t / 32) * nkp * 1024 + (t % 32 / 16) * 512 + (t % 16) * 16;
            float *yr = j->y + t * K + k0;
            int kk = 0;
            for (; kk + 16 <= kw; kk += 16)
                *(bwd_f16 *)(void *)(yr + kk) =
                    *(const bwd_f16 *)(const void *)(c + (kk / 32) * 1024 + (kk / 16 % 2) * 256);
            if (kk < kw) memcpy(yr + kk, c + (kk / 32) * 1024 + (kk / 16 % 2) * 256, (size_t)(kw - kk) * 4);
        }
    }
    j->tl->end();
}

void nl_amx_scratch_bytes(const nl_host_kernels *ks, int n_threads, int64_t K, int64_t N, int type, nl_dir dir, int T,
                          int split, uint64_t *shared, uint64_t *per_thread) {
    const uint64_t Kp = (uint64_t)up32(K), Np = (uint64_t)up32(N), Tp = (uint64_t)up32(T);
    /* the packed activations (nl_amx_run) and a thread's scratch (scratch_for), as sized there */
    const uint64_t ldx = (uint64_t)x_ld(dir, split, (int64_t)Kp, (int64_t)Np);
    *shared = (Tp * ldx * 2 * (split ? 2 : 1) + 63) / 64 * 64;
    uint64_t need;
    if (dir == NL_FWD) {
        const uint64_t gf = (uint64_t)fwd_group((int64_t)Kp, (int64_t)Tp, (int64_t)ldx, split);
        need = fwd_rows_bytes(ks, type, split, (int64_t)Kp) + gf * fwd_panel_bytes(split, (int64_t)Kp) +
               al64((size_t)(Kp * 4)) + 1024 * 4 + al64((size_t)(Kp / 32) * sizeof(nl_block_q8_0));
        if (need < fwd_pack_bytes((int64_t)Kp)) need = fwd_pack_bytes((int64_t)Kp);
    } else {
        const uint64_t gw = (uint64_t)bwd_group((int64_t)Tp, (int64_t)Np) * BWD_KW;
        need = 2 * ((uint64_t)BWD_NC / 2 * gw * 4) + 2 * gw * 4 + al64((size_t)(Tp * gw * 4)) + 1024 * 4;
        if (need < Np * 4) need = Np * 4;
    }
    *per_thread = (uint64_t)(n_threads < 1 ? 1 : n_threads) * ((need + 63) / 64 * 64);
}

int nl_amx_run(nl_amx_ctx *a, const nl_amx_tiles *tiles, const nl_host_kernels *ks, nl_pool *pool,
               const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y, int split) {
    if (T <= 0) return 0;
    if (nl_pool_size(pool) != a->nth)
        return nl_err("amx: pool of %d threads for a context of %d", nl_pool_size(pool), a->nth);
    amx_job j = {
        .a = a, .tl = tiles, .ks = ks, .w = w, .x = x, .y = y, .T = T, .split = split, .K = w->n_in, .N = w->n_out};
    j.Kp = up32(j.K);
    j.Np = up32(j.N);
    j.Tp = up32(T);
    j.rb = nl_row_bytes(w->type, w->n_in);
    j.gp = bwd_group(j.Tp, j.Np);
    j.gf = 1;
    /* the activations: FWD Tp × Kp (split) or Tp × ldx, BWD Tp × ldx BF16, per plane */
    j.ldx = x_ld(dir, split, j.Kp, j.Np);
    const size_t plane = (size_t)j.Tp * (size_t)j.ldx;
    if (dir == NL_FWD) j.gf = fwd_group(j.Kp, j.Tp, j.ldx, split);
    void *xm = a->xmem;
    if (!grow_aligned(&xm, &a->xcap, plane * 2 * (split ? 2 : 1))) {
        a->xmem = NULL;
        return nl_err("amx: %s: out of memory (%zu bytes of packed activations)", w->name ? w->name : "?", plane * 4);
    }
    a->xmem = xm;
    j.xhi = a->xmem;
    j.xlo = split ? a->xmem + plane : NULL;
    for (int i = 0; i < a->nth; i++) {
        amx_scratch *s = &a->scr[i];
        const size_t pack = dir == NL_FWD ? fwd_pack_bytes(j.Kp) : (size_t)j.Np * 4;
        if (scratch_for(&j, dir, s, pack))
            return nl_err("amx: %s: out of memory (thread scratch)", w->name ? w->name : "?");
    }
    nl_pool_run(pool, a->nth, dir == NL_BWD ? pack_x_bwd : split ? pack_x_fwd_pairs : pack_x_fwd, &j);
    nl_pool_run(pool, a->nth, dir == NL_FWD ? task_fwd : task_bwd, &j);
    return 0;
}

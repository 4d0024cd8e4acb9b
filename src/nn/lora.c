/* nn/lora: the fused LoRA branch (contract and math in lora.h).
 *
 * Tokens are processed in blocks of TB rows. Per call, Aᵀ [n_in][r] and Bᵀ [r][n_out] are packed
 * once so every rank-r product is a plain row-major GEMM (nl_gemm_acc) with unit-stride inner
 * loops. With dropout, the mask of a token block is regenerated from the RNG into scratch and
 * discarded at the end of the block: x ⊙ m never outlives the call; a forward with mask_out keeps
 * the mask's bits (1/32 of x's bytes), a backward with mask_in expands them again instead of
 * hashing (the hash is most of a dropout row's time: 16 elements of splitmix64 per 8 multiplies).
 *
 * On the tiles (L->tiles, cpu/tiles.h) the same blocks (TB = 32 rows: one pair of A tiles) with
 * every per-row product a tile GEMM: per call A and B are packed as B operands in the
 * orientation each product needs (Aᵀ, Bᵀ forward; B, A for du and dx), per block the
 * activations as A rows. r = 16 is half a 32-element step (zero padded); r up to 32 costs the
 * same. dA and dB, the sums over the tokens, stay FP32 chains over t (nl_gemm_tn) on the tiles
 * too: the real TDPBF16PS does not sum a 32-step as a chain (docs/amx.md), so on tiles the
 * rows of a gathered call or of one sequence would group their terms differently from the
 * full or packed call's (whose other rows are zeros) and the gradients would depend on which
 * rows share the call. The pool's backward on the tiles goes by lines (nl_lora_backward_du, then
 * nl_lora_backward_lines): x is read once, for dA and dx's mask together, and x ⊙ m is rebuilt
 * per strip from the mask's key instead of stored in the scratch and read back. */
#include "cpu/cpu.h"
#include "cpu/gemm_bf16.h"
#include "cpu/kernels.h"
#include "cpu/tiles.h"
#include "cpu/vecmath.h"
#include "nn/lora.h"
#include "util/rng.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TB 32 /* token rows per block */

uint64_t nl_lora_dropout_key(uint64_t seed, uint64_t step, int layer, int proj) {
    /* last word: a domain tag so these keys never collide with other uses of the same seed */
    return nl_rng_key4(seed, step, (uint64_t)(int64_t)layer, (uint64_t)(int64_t)proj, 0x4C6F5241446F7074ULL);
}

static int check(const nl_lora *L, const char *what) {
    if (L->rank <= 0 || L->n_in <= 0 || L->n_out <= 0)
        return nl_err("lora %s: bad shape n_in=%d n_out=%d rank=%d", what, L->n_in, L->n_out, L->rank);
    if (!(L->dropout >= 0.0f && L->dropout < 1.0f))
        return nl_err("lora %s: dropout %g not in [0, 1)", what, (double)L->dropout);
    return 0;
}

/* An element is kept iff its 32 random bits are >= p·2^32 (probability 1 − p). */
static uint32_t keep_threshold(float p) {
    double t = floor((double)p * 4294967296.0 + 0.5);
    return t >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)t;
}

/* Token index of row t of a call: tok0 + toks[t] when the rows were gathered, else tok0 + t. */
static int64_t tok_of(int64_t tok0, const int64_t *toks, int64_t t) { return tok0 + (toks ? toks[t] : t); }

/* m[nb][n_in] for token rows t .. t+nb-1 of a call (token indices tok_of). Value c of the
 * token's key gives elements 2c (low 32 bits) and 2c+1 (high 32 bits). */
static void make_mask(const nl_lora *L, int64_t tok0, const int64_t *toks, int64_t t, int nb, float *m) {
    const int K = L->n_in;
    const uint32_t thr = keep_threshold(L->dropout);
    const float inv = 1.0f / (1.0f - L->dropout);
    int (*const wide)(uint64_t, int, uint32_t, float, float *) = nl_cpu_kernels()->dropout_mask_row;
    for (int b = 0; b < nb; b++) {
        const uint64_t kt = nl_rng_key_add(L->key, (uint64_t)tok_of(tok0, toks, t + b));
        float *mr = m + (int64_t)b * K;
        int i = 0;
        if (wide) i = wide(kt, K, thr, inv, mr);
        for (; i + 2 <= K; i += 2) {
            const uint64_t v = nl_rng_u64(kt, (uint64_t)(i >> 1));
            mr[i] = (uint32_t)v >= thr ? inv : 0.0f;
            mr[i + 1] = (uint32_t)(v >> 32) >= thr ? inv : 0.0f;
        }
        if (i < K) mr[i] = (uint32_t)nl_rng_u64(kt, (uint64_t)(i >> 1)) >= thr ? inv : 0.0f;
    }
}

void nl_lora_dropout_mask(const nl_lora *L, int64_t token, float *m) {
    if (L->dropout <= 0.0f) {
        for (int i = 0; i < L->n_in; i++) m[i] = 1.0f;
        return;
    }
    make_mask(L, token, NULL, 0, 1, m);
}

static void pack_AT(float *AT, const float *A, int r, int K) { /* AT[i][k] = A[k][i] */
    for (int k = 0; k < r; k++)
        for (int i = 0; i < K; i++) AT[(int64_t)i * r + k] = A[(int64_t)k * K + i];
}

/* The row's rank-16 kernels (cpu/kernels.h: nl_lora_kernels) when L can take them (FP32, r = 16),
 * else NULL: the nl_gemm calls, the same bits. */
static const nl_lora_kernels *k16(const nl_lora *L) {
    return L->rank == 16 && !L->tiles ? nl_cpu_kernels()->lora : NULL;
}

/* Their BF16 pair (thin16b, add16b) when L asks for it (L->bf16) and this CPU runs it, else NULL. */
static const nl_lora_kernels *kb16(const nl_lora *L) {
    const nl_lora_kernels *lk = k16(L);
    return lk && L->bf16 && lk->thin16b && lk->add16b && nl_bf16_ok() ? lk : NULL;
}

/* The BF16 pair's backward reads the forward's kept bits in its kernels (add16bk, tn16k): no mask
 * rows and no x ⊙ m rows written (phase 1) or read (phase 2). Both phases test this one predicate. */
static const nl_lora_kernels *kbits(const nl_lora *L) {
    const nl_lora_kernels *lk = kb16(L);
    return lk && L->dropout > 0.0f && L->mask_in && lk->add16bk && lk->tn16k ? lk : NULL;
}

int nl_lora_bf16_runs(int rank) {
    const nl_lora L = {.rank = rank, .bf16 = 1};
    return kb16(&L) != NULL;
}

/* Row stride (words) of a block of rows of n floats packed as BF16 words: ceil(n/2) rounded up
 * to 16, plus 16 (rows 64 bytes off a multiple of 1 KB: thin16b reads 16 of them at once). */
static int64_t words_ld(int n) { return (((int64_t)n + 1) / 2 + 15) / 16 * 16 + 16; }

/* Columns of a packed add16 operand: N rounded up to the panel width (32). */
static int64_t panel_cols(int N) { return ((int64_t)N + 31) / 32 * 32; }

/* Qp: the add16 panels of Q(k, n) = S[k·s_k + n·s_n], k < 16, n < N (zeros past N) */
static void pack_panels(float *Qp, const float *S, int64_t s_k, int64_t s_n, int N) {
    for (int n0 = 0; n0 < N; n0 += 32)
        for (int k = 0; k < 16; k++) {
            float *d = Qp + (int64_t)n0 * 16 + k * 32;
            for (int j = 0; j < 32; j++) d[j] = n0 + j < N ? S[k * s_k + (n0 + j) * s_n] : 0.0f;
        }
}

/* Row t's kept mask bits (lora.h: mask_out, mask_in). */
static uint16_t *bits_out(const nl_lora *L, int64_t t) {
    return L->mask_out + t * (int64_t)nl_lora_mask_halves(L->n_in);
}
static const uint16_t *bits_in(const nl_lora *L, int64_t t) {
    return L->mask_in + t * (int64_t)nl_lora_mask_halves(L->n_in);
}

/* The bits of one mask row m[K] (0 or 1/(1−p) > 0) into its halves kb from half h0 on (padding 0). */
static void store_bits(const float *m, int K, uint16_t *kb, int h0) {
    for (int h = h0; h < (int)nl_lora_mask_halves(K); h++) {
        unsigned v = 0;
        for (int j = 0; j < 16 && h * 16 + j < K; j++) v |= (unsigned)(m[h * 16 + j] != 0.0f) << j;
        kb[h] = (uint16_t)v;
    }
}

/* The mask (mr, may be NULL) and x ⊙ m of columns [c, c + n) of one token row from its kept bits kb
 * (x at the row's column c): the values make_mask gives them (0 or inv), the same one rounded
 * product. */
static void bits_strip(const uint16_t *kb, int c, int n, float inv, const float *x, float *mr, float *xm) {
    int (*const wide)(const uint16_t *, int, float, const float *, float *, float *) =
        nl_cpu_kernels()->dropout_bits_row;
    int i = 0;
    for (int pass = 0; pass < 2; pass++) { /* the columns before a whole half, then the kernel's rest */
        for (; i < n && (pass || ((c + i) & 15)); i++) {
            const float m = kb[(c + i) >> 4] >> ((c + i) & 15) & 1 ? inv : 0.0f;
            if (mr) mr[i] = m;
            xm[i] = x[i] * m;
        }
        if (!pass && wide && i < n) i += wide(kb + ((c + i) >> 4), n - i, inv, x + i, mr ? mr + i : NULL, xm + i);
    }
}

/* dx (+)= t ⊙ m for columns [c, c + n) of one token row, m from its kept bits kb: add_masked's bits
 * without the mask row. */
static void bits_madd(const uint16_t *kb, int c, int n, float inv, const float *t, float *d, int accumulate) {
    int (*const wide)(const uint16_t *, int, float, const float *, float *, int) = nl_cpu_kernels()->dropout_bits_madd;
    int i = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (; i < n && (pass || ((c + i) & 15)); i++) {
            const float p = t[i] * (kb[(c + i) >> 4] >> ((c + i) & 15) & 1 ? inv : 0.0f);
            d[i] = accumulate ? d[i] + p : p;
        }
        if (!pass && wide && i < n) i += wide(kb + ((c + i) >> 4), n - i, inv, t + i, d + i, accumulate);
    }
}

/* xm[nb][K] = x ⊙ m for rows t .. t+nb-1 (x points at row t; m written into mbuf), or a
 * pointer to x when there is no dropout. The forward (bwd 0) keeps the rows' bits where
 * L->mask_out; the backward (bwd 1) reads them where L->mask_in. */
static const float *masked_rows(const nl_lora *L, int drop, const float *x, int64_t tok0, const int64_t *toks,
                                int64_t t, int nb, float *mbuf, float *xm, int bwd) {
    if (!drop) return x;
    const int K = L->n_in;
    if (bwd && L->mask_in) {
        const float inv = 1.0f / (1.0f - L->dropout);
        for (int b = 0; b < nb; b++)
            bits_strip(bits_in(L, t + b), 0, K, inv, x + (int64_t)b * K, mbuf + (int64_t)b * K, xm + (int64_t)b * K);
        return xm;
    }
    make_mask(L, tok0, toks, t, nb, mbuf);
    nl_cpu_kernels()->vec->mul(xm, x, mbuf, (int64_t)nb * K);
    if (!bwd && L->mask_out)
        for (int b = 0; b < nb; b++) store_bits(mbuf + (int64_t)b * K, K, bits_out(L, t + b), 0);
    return xm;
}

/* dx (+)= (du·A) ⊙ m, with du·A in tmp (n elements) */
static void add_masked(float *dxb, const float *tmp, const float *m, int64_t n, int accumulate) {
    if (accumulate) nl_cpu_kernels()->vec->muladd(dxb, tmp, m, n);
    else nl_cpu_kernels()->vec->mul(dxb, tmp, m, n);
}

/* y += t (n elements): the add of a block's LoRA term (NL_LORA_ADD) */
static void add_into(float *y, const float *t, int64_t n) { nl_cpu_kernels()->vec->add(y, t, n); }

/* ---- on the tiles ---- */

/* The dropout of token rows t .. t+nb-1 of the call (x at row t) in one pass, through the kernel
 * row's dropout_apply_row (non-NULL): the mask and x ⊙ m into mb and xm when keep, x ⊙ m as BF16
 * pair words into xw (row stride ldw words; words past ceil(K/2) up to wpad zero) when xw != NULL,
 * the forward's bits kept where L->mask_out (bwd 0). drop_block's rows (the tiles' A operand) and
 * lora_fwd16b's (the BF16 pair's words). */
static void drop_rows_apply(const nl_lora *L, const float *x, int64_t tok0, const int64_t *toks, int64_t t, int nb,
                            float *mb, float *xm, int keep, uint32_t *xw, int64_t ldw, int wpad, int bwd) {
    const int K = L->n_in;
    int (*const apply)(uint64_t, int, uint32_t, float, const float *, float *, float *, uint32_t *, uint16_t *) =
        nl_cpu_kernels()->dropout_apply_row;
    const uint32_t thr = keep_threshold(L->dropout);
    const float inv = 1.0f / (1.0f - L->dropout);
    for (int b = 0; b < nb; b++) {
        const uint64_t kt = nl_rng_key_add(L->key, (uint64_t)tok_of(tok0, toks, t + b));
        const float *xr = x + (int64_t)b * K;
        float *mr = keep ? mb + (int64_t)b * K : NULL, *pr = keep ? xm + (int64_t)b * K : NULL;
        uint32_t *w = xw ? xw + (int64_t)b * ldw : NULL;
        uint16_t *kb = !bwd && L->mask_out ? bits_out(L, t + b) : NULL;
        int i = apply(kt, K, thr, inv, xr, mr, pr, w, kb);
        if (kb) /* the halves past the kernel's (a multiple of 16), set bit by bit below */
            for (int h = i / 16; h < (int)nl_lora_mask_halves(K); h++) kb[h] = 0;
        for (; i < K; i += 2) { /* the rest as make_mask draws it: value i/2 gives elements i, i+1 */
            const uint64_t v = nl_rng_u64(kt, (uint64_t)(i >> 1));
            const float m0 = (uint32_t)v >= thr ? inv : 0.0f, m1 = (uint32_t)(v >> 32) >= thr ? inv : 0.0f;
            const float p0 = xr[i] * m0, p1 = i + 1 < K ? xr[i + 1] * m1 : 0.0f;
            if (kb)
                kb[i >> 4] |= (uint16_t)((unsigned)(m0 != 0.0f) << (i & 15) | (unsigned)(i + 1 < K && m1 != 0.0f)
                                                                                  << ((i + 1) & 15));
            if (keep) {
                mr[i] = m0, pr[i] = p0;
                if (i + 1 < K) mr[i + 1] = m1, pr[i + 1] = p1;
            }
            if (w) w[i / 2] = (uint32_t)nl_amx_f32_to_bf16(p0) | (uint32_t)nl_amx_f32_to_bf16(p1) << 16;
        }
        if (w)
            for (int j = (K + 1) / 2; j < wpad; j++) w[j] = 0;
    }
}

/* One token block's dropout in a single pass over x (rows t .. t+nb-1 of the call, x at row t):
 * the mask into mb and x ⊙ m into xm when keep (both [nb][K]), and, when xa != NULL, x ⊙ m as
 * the tiles' A operand (cpu/tiles.h, row stride up(K) values, up(nb) rows). The bits of
 * masked_rows followed by nl_tile_pack_a (the forward's bits kept, the backward's read, as there);
 * where the kernel row has no dropout_apply_row or the backward reads the bits, those two (mb
 * and xm are then written whatever keep says). */
static void drop_block(const nl_lora *L, const float *x, int64_t tok0, const int64_t *toks, int64_t t, int nb,
                       float *mb, float *xm, int keep, uint16_t *xa, int bwd) {
    const int K = L->n_in, Kp = nl_tile_up(K);
    if (!nl_cpu_kernels()->dropout_apply_row || (bwd && L->mask_in)) {
        const float *xb = masked_rows(L, 1, x, tok0, toks, t, nb, mb, xm, bwd);
        if (xa) nl_tile_pack_a(xa, Kp, xb, K, 0, nb, K);
        return;
    }
    drop_rows_apply(L, x, tok0, toks, t, nb, mb, xm, keep, xa ? (uint32_t *)(void *)xa : NULL, Kp / 2, Kp / 2, bwd);
    if (xa)
        for (int b = nb; b < nl_tile_up(nb); b++) memset(xa + (int64_t)b * Kp, 0, sizeof(uint16_t) * (size_t)Kp);
}

/* u rows [nb][r] = xb·Aᵀ (xa: scratch for the packed rows, at: Aᵀ packed) */
static void tile_u(const nl_lora *L, const uint32_t *at, const float *xb, int nb, uint16_t *xa, float *u) {
    const int K = L->n_in, r = L->rank, Kp = nl_tile_up(K), rp = nl_tile_up(r);
    nl_tile_pack_a(xa, Kp, xb, K, 0, nb, K);
    nl_tile_gemm(L->tiles, u, r, xa, Kp, at, rp, nb, r, K, 0);
}

static int lora_fwd_tiles(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int ta,
                          int tb, int64_t tok0, const int64_t *toks, int drop, int accumulate, const char *what) {
    const int K = L->n_in, N = L->n_out, r = L->rank, Kp = nl_tile_up(K), Np = nl_tile_up(N), rp = nl_tile_up(r);
    const size_t n_at = (size_t)Kp / 2 * rp, n_bt = (size_t)rp / 2 * Np, n_xa = (size_t)TB * Kp / 2,
                 n_sa = (size_t)TB * rp / 2;
    const size_t nx = drop ? 2 * (size_t)TB * K : 0, ny = accumulate == NL_LORA_ADD ? (size_t)TB * N : 0;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * (n_at + n_bt + n_xa + n_sa) +
                                      sizeof(float) * (nx + 2 * (size_t)TB * r + ny));
    if (!buf) return nl_err("lora %s: out of memory for scratch (n_in=%d n_out=%d rank=%d)", what, K, N, r);
    uint32_t *at = buf, *bt = at + n_at;
    uint16_t *xa = (uint16_t *)(bt + n_bt), *sa = xa + 2 * n_xa;
    float *mb = (float *)(buf + n_at + n_bt + n_xa + n_sa), *xm = mb + nx / 2, *ub = mb + nx, *su = ub + (size_t)TB * r;
    float *yt = su + (size_t)TB * r;       /* NL_LORA_ADD: the block's term, added to y while in cache */
    nl_tile_pack_b(at, rp, A, K, 1, K, r); /* B[k][i] = A[i][k] */
    nl_tile_pack_b(bt, Np, B, r, 1, r, N); /* B[i][o] = B[o][i] */
    for (int t0 = ta; t0 < tb; t0 += TB) {
        const int nb = tb - t0 < TB ? tb - t0 : TB;
        float *ur = u ? u + (int64_t)t0 * r : ub;
        if (drop) { /* x ⊙ m straight into the packed operand */
            drop_block(L, x + (int64_t)t0 * K, tok0, toks, t0, nb, mb, xm, 0, xa, 0);
            nl_tile_gemm(L->tiles, ur, r, xa, Kp, at, rp, nb, r, K, 0);
        } else {
            tile_u(L, at, x + (int64_t)t0 * K, nb, xa, ur);
        }
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        nl_tile_pack_a(sa, rp, su, r, 0, nb, r);
        if (accumulate == NL_LORA_ADD) {
            nl_tile_gemm(L->tiles, yt, N, sa, rp, bt, Np, nb, N, r, 0);
            add_into(y + (int64_t)t0 * N, yt, (int64_t)nb * N);
        } else {
            nl_tile_gemm(L->tiles, y + (int64_t)t0 * N, N, sa, rp, bt, Np, nb, N, r, accumulate);
        }
    }
    return 0;
}

/* The bytes of lora_bwd_rows_tiles' packing and block buffer (u given or recomputed). */
static size_t bwd_rows_tiles_bytes(const nl_lora *L, int have_u) {
    const int K = L->n_in, N = L->n_out, r = L->rank, Kp = nl_tile_up(K), Np = nl_tile_up(N), rp = nl_tile_up(r);
    const size_t n_at = have_u ? 0 : (size_t)Kp / 2 * rp, n_bb = (size_t)Np / 2 * rp, n_ba = (size_t)rp / 2 * Kp;
    const size_t n_xa = (size_t)TB * (Kp > Np ? Kp : Np) / 2, n_sa = (size_t)TB * rp / 2;
    /* mask and (du·A) before the mask or before the add (dropout or NL_LORA_ADD: always kept) */
    const size_t nx = (L->dropout > 0.0f ? 2 : 1) * (size_t)TB * K;
    return sizeof(uint32_t) * (n_at + n_bb + n_ba + n_xa + n_sa) + sizeof(float) * (nx + (size_t)TB * r + 1);
}

/* Phase 1 on the tiles (the contract of nl_lora_backward_rows); buf: bwd_rows_tiles_bytes(L, u != NULL)
 * bytes (the caller's thread scratch). keep_xm 0 (nl_lora_backward_du: dx NULL): x ⊙ m is not
 * stored, and x is read only to recompute u. */
static void lora_bwd_rows_tiles(const nl_lora *L, const float *A, const float *B, float *dx, int dx_accumulate,
                                const float *dy, const float *x, const float *u, int T, int64_t tok0,
                                const int64_t *toks, float *scratch, int t0, int t1, uint32_t *buf, int keep_xm) {
    const int K = L->n_in, N = L->n_out, r = L->rank, Kp = nl_tile_up(K), Np = nl_tile_up(N), rp = nl_tile_up(r);
    const int drop = L->dropout > 0.0f;
    float *du_all = scratch, *su_all = du_all + (size_t)T * r, *xm_all = su_all + (size_t)T * r;
    const size_t n_at = u ? 0 : (size_t)Kp / 2 * rp, n_bb = (size_t)Np / 2 * rp, n_ba = (size_t)rp / 2 * Kp;
    const size_t n_xa = (size_t)TB * (Kp > Np ? Kp : Np) / 2, n_sa = (size_t)TB * rp / 2;
    uint32_t *at = buf, *bb = at + n_at, *ba = bb + n_bb;
    uint16_t *xa = (uint16_t *)(ba + n_ba), *sa = xa + 2 * n_xa;
    float *mb = (float *)(buf + n_at + n_bb + n_ba + n_xa + n_sa), *tmp = mb + (drop ? (size_t)TB * K : 0),
          *ub = tmp + (size_t)TB * K;
    if (!u) nl_tile_pack_b(at, rp, A, K, 1, K, r);
    nl_tile_pack_b(bb, rp, B, r, 0, N, r);         /* B[o][i] */
    if (dx) nl_tile_pack_b(ba, Kp, A, K, 0, r, K); /* A[i][k] */
    for (int ta = t0; ta < t1; ta += TB) {
        const int nb = t1 - ta < TB ? t1 - ta : TB;
        const float *dyb = dy + (int64_t)ta * N;
        float *du = du_all + (int64_t)ta * r, *su = su_all + (int64_t)ta * r;
        const float *ur = u ? u + (int64_t)ta * r : ub;
        if (drop && (keep_xm || !u)) { /* the mask (dx), x ⊙ m (dA) and, for a recomputed u, its packed operand:
                                          one pass */
            drop_block(L, x + (int64_t)ta * K, tok0, toks, ta, nb, mb, keep_xm ? xm_all + (int64_t)ta * K : tmp,
                       keep_xm, u ? NULL : xa, 1);
            if (!u) nl_tile_gemm(L->tiles, ub, r, xa, Kp, at, rp, nb, r, K, 0);
        } else if (!u) {
            tile_u(L, at, x + (int64_t)ta * K, nb, xa, ub);
        }
        nl_tile_pack_a(xa, Np, dyb, N, 0, nb, N);
        nl_tile_gemm(L->tiles, du, r, xa, Np, bb, rp, nb, r, N, 0);
        for (int i = 0; i < nb * r; i++) du[i] *= L->scale;
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        if (!dx) continue;
        float *dxb = dx + (int64_t)ta * K;
        nl_tile_pack_a(sa, rp, du, r, 0, nb, r);
        if (!drop && dx_accumulate != NL_LORA_ADD) {
            nl_tile_gemm(L->tiles, dxb, K, sa, rp, ba, Kp, nb, K, r, dx_accumulate);
            continue;
        }
        /* NL_LORA_ADD: dx += (du·A) ⊙ m, the term rounded before the add (dx_rows' bits) */
        nl_tile_gemm(L->tiles, tmp, K, sa, rp, ba, Kp, nb, K, r, 0);
        if (drop) add_masked(dxb, tmp, mb, (int64_t)nb * K, dx_accumulate != 0);
        else add_into(dxb, tmp, (int64_t)nb * K);
    }
}

/* lora_fwd on the row's rank-16 kernels: the same chains (u = x·Aᵀ, then y (+)= (s·u)·Bᵀ per
 * token block), NL_LORA_ADD in add16's store. */
static int lora_fwd16(const nl_lora *L, const nl_lora_kernels *lk, const float *A, const float *B, float *y, float *u,
                      const float *x, int ta, int tb, int64_t tok0, const int64_t *toks, int drop, int accumulate,
                      const char *what) {
    const int K = L->n_in, N = L->n_out, r = L->rank;
    const size_t nAT = (size_t)K * r, nBP = (size_t)panel_cols(N) * r, nx = drop ? 2 * (size_t)TB * K : 0;
    float *buf = nl_thread_scratch(sizeof(float) * (nAT + nBP + nx + 2 * (size_t)TB * r));
    if (!buf) return nl_err("lora %s: out of memory for scratch (n_in=%d n_out=%d rank=%d)", what, K, N, r);
    float *AT = buf, *BP = AT + nAT, *mb = BP + nBP, *xm = mb + nx / 2, *ub = mb + nx, *su = ub + (size_t)TB * r;
    pack_AT(AT, A, r, K);
    pack_panels(BP, B, 1, r, N); /* Q(k, o) = B[o][k] */
    const int mode = accumulate == NL_LORA_ADD ? 2 : accumulate ? 1 : 0;
    for (int t0 = ta; t0 < tb; t0 += TB) {
        const int nb = tb - t0 < TB ? tb - t0 : TB;
        const float *xb = masked_rows(L, drop, x + (int64_t)t0 * K, tok0, toks, t0, nb, mb, xm, 0);
        float *ur = u ? u + (int64_t)t0 * r : ub;
        lk->thin16(ur, xb, K, AT, nb, K);
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        lk->add16(y + (int64_t)t0 * N, N, su, r, BP, nb, N, mode);
    }
    return 0;
}

/* lora_fwd16 on the BF16 pair: u = (m ⊙ x)·Aᵀ and y (+)= (s·u)·Bᵀ on words (nl_lora.bf16), per token
 * block x (or x ⊙ m) and s·u packed as rows of words; Aᵀ and Bᵀ packed once per call. */
static size_t fwd16b_bytes(const nl_lora *L) {
    const int K = L->n_in, N = L->n_out;
    const size_t nx = L->dropout > 0.0f ? 2 * (size_t)TB * K : 0;
    return 4 * ((size_t)(K + 1) / 2 * 16 + 8 * (size_t)(panel_cols(N) + 16) + (size_t)TB * words_ld(K) + TB * 8) +
           4 * (nx + 2 * (size_t)TB * 16);
}

static int lora_fwd16b(const nl_lora *L, const nl_lora_kernels *lk, const float *A, const float *B, float *y, float *u,
                       const float *x, int ta, int tb, int64_t tok0, const int64_t *toks, int drop, int accumulate,
                       const char *what) {
    const int K = L->n_in, N = L->n_out, r = L->rank, Kw = (K + 1) / 2;
    const int64_t ldx = words_ld(K), ldq = panel_cols(N) + 16;
    const size_t nPA = (size_t)Kw * 16, nQB = 8 * (size_t)ldq, nxw = (size_t)TB * ldx,
                 nx = drop ? 2 * (size_t)TB * K : 0;
    uint32_t *buf = nl_thread_scratch(fwd16b_bytes(L));
    if (!buf) return nl_err("lora %s: out of memory for scratch (n_in=%d n_out=%d rank=%d)", what, K, N, r);
    uint32_t *PA = buf, *QB = PA + nPA, *xw = QB + nQB, *sw = xw + nxw;
    float *mb = (float *)(sw + (size_t)TB * 8), *xm = mb + nx / 2, *ub = mb + nx, *su = ub + (size_t)TB * r;
    nl_bf16_rows_t(PA, 16, A, K, r, K, 16);                  /* PA[w][j] = (A[j][2w], A[j][2w+1]) */
    nl_bf16_rows_t(QB, ldq, B, r, N, r, (int)panel_cols(N)); /* QB[w][o] = (B[o][2w], B[o][2w+1]) */
    const int mode = accumulate == NL_LORA_ADD ? 2 : accumulate ? 1 : 0;
    const int fuse = nl_cpu_kernels()->dropout_apply_row != NULL;
    for (int t0 = ta; t0 < tb; t0 += TB) {
        const int nb = tb - t0 < TB ? tb - t0 : TB;
        float *ur = u ? u + (int64_t)t0 * r : ub;
        if (drop && fuse) { /* the mask, its bits and x ⊙ m as words in one pass: the same words */
            drop_rows_apply(L, x + (int64_t)t0 * K, tok0, toks, t0, nb, NULL, NULL, 0, xw, ldx, Kw, 0);
        } else {
            const float *xb = masked_rows(L, drop, x + (int64_t)t0 * K, tok0, toks, t0, nb, mb, xm, 0);
            nl_bf16_rows(xw, ldx, xb, K, nb, K, Kw);
        }
        lk->thin16b(ur, xw, ldx, PA, nb, Kw);
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        nl_bf16_rows(sw, 8, su, r, nb, r, 8);
        lk->add16b(y + (int64_t)t0 * N, N, sw, 8, QB, ldq, nb, N, mode, NULL, 0);
    }
    return 0;
}

/* Rows [ta, tb) of the call (y, u, x are the whole call's arrays). */
static int lora_fwd(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int ta,
                    int tb, int64_t tok0, const int64_t *toks, int drop, int accumulate, const char *what) {
    if (check(L, what)) return -1;
    const int K = L->n_in, N = L->n_out, r = L->rank;
    drop = drop && L->dropout > 0.0f;
    if (L->tiles) return lora_fwd_tiles(L, A, B, y, u, x, ta, tb, tok0, toks, drop, accumulate, what);
    if (kb16(L)) return lora_fwd16b(L, kb16(L), A, B, y, u, x, ta, tb, tok0, toks, drop, accumulate, what);
    const nl_lora_kernels *lk = k16(L);
    if (lk) return lora_fwd16(L, lk, A, B, y, u, x, ta, tb, tok0, toks, drop, accumulate, what);
    const size_t nAT = (size_t)K * r, nBT = (size_t)r * N, nx = drop ? 2 * (size_t)TB * K : 0;
    const size_t ny = accumulate == NL_LORA_ADD ? (size_t)TB * N : 0;
    float *buf = nl_thread_scratch(sizeof(float) * (nAT + nBT + nx + 2 * (size_t)TB * r + ny));
    if (!buf) return nl_err("lora %s: out of memory for scratch (n_in=%d n_out=%d rank=%d)", what, K, N, r);
    float *AT = buf, *BT = AT + nAT, *mb = BT + nBT, *xm = mb + nx / 2, *ub = mb + nx, *su = ub + (size_t)TB * r;
    float *yt = su + (size_t)TB * r;
    pack_AT(AT, A, r, K);
    pack_AT(BT, B, N, r); /* BT[k][o] = B[o][k] */
    for (int t0 = ta; t0 < tb; t0 += TB) {
        const int nb = tb - t0 < TB ? tb - t0 : TB;
        const float *xb = masked_rows(L, drop, x + (int64_t)t0 * K, tok0, toks, t0, nb, mb, xm, 0);
        float *ur = u ? u + (int64_t)t0 * r : ub;
        nl_gemm(ur, r, xb, K, AT, r, nb, r, K, 0);
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        if (accumulate == NL_LORA_ADD) {
            nl_gemm(yt, N, su, r, BT, N, nb, N, r, 0);
            add_into(y + (int64_t)t0 * N, yt, (int64_t)nb * N);
        } else {
            nl_gemm(y + (int64_t)t0 * N, N, su, r, BT, N, nb, N, r, accumulate);
        }
    }
    return 0;
}

/* dx[nb][K] (+)= (du · A) ⊙ m for one token block (m NULL: no dropout; tmp: nb·K scratch).
 * NL_LORA_ADD: dx += ((du · A) ⊙ m), the term rounded before the add. */
static void dx_rows(const nl_lora *L, const float *A, const float *du, int nb, float *dxb, int accumulate,
                    const float *m, float *tmp) {
    const int K = L->n_in, r = L->rank;
    if (accumulate == NL_LORA_ADD) {
        nl_gemm(tmp, K, du, r, A, K, nb, K, r, 0);
        if (m) add_masked(dxb, tmp, m, (int64_t)nb * K, 1); /* dxb[i] += tmp[i]·m[i]: no contraction (-std=c11) */
        else add_into(dxb, tmp, (int64_t)nb * K);
        return;
    }
    if (!m) {
        nl_gemm(dxb, K, du, r, A, K, nb, K, r, accumulate);
        return;
    }
    nl_gemm(tmp, K, du, r, A, K, nb, K, r, 0);
    add_masked(dxb, tmp, m, (int64_t)nb * K, accumulate);
}

int nl_lora_forward(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int T,
                    int64_t tok0) {
    return lora_fwd(L, A, B, y, u, x, 0, T, tok0, NULL, 1, 1, "forward");
}

int nl_lora_forward_to(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int T,
                       int64_t tok0, int accumulate) {
    return lora_fwd(L, A, B, y, u, x, 0, T, tok0, NULL, 1, accumulate, "forward");
}

int nl_lora_apply(const nl_lora *L, const float *A, const float *B, float *y, const float *x, int T) {
    return lora_fwd(L, A, B, y, NULL, x, 0, T, 0, NULL, 0, 1, "apply");
}

/* ---- one call split over threads ---- */

int nl_lora_forward_rows(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x,
                         int64_t tok0, const int64_t *toks, int accumulate, int t0, int t1) {
    if (t0 < 0 || t1 < t0) return nl_err("lora forward: bad row range [%d, %d)", t0, t1);
    return lora_fwd(L, A, B, y, u, x, t0, t1, tok0, toks, 1, accumulate, "forward");
}

size_t nl_lora_bwd_scratch_floats(const nl_lora *L, int T) {
    return (size_t)T * (2 * (size_t)L->rank + (L->dropout > 0.0f ? (size_t)L->n_in : 0));
}

/* nl_lora_backward_rows on the row's rank-16 kernels (the same chains: u, du = dy·B by thin16,
 * dx (+)= du·A by add16 over A's panels; with dropout (du·A) ⊙ m as the nl_gemm path does it) */
static int lora_bwd_rows16(const nl_lora *L, const nl_lora_kernels *lk, const float *A, const float *B, float *dx,
                           int dx_accumulate, const float *dy, const float *x, const float *u, int T, int64_t tok0,
                           const int64_t *toks, float *scratch, int t0, int t1) {
    const int K = L->n_in, N = L->n_out, r = L->rank;
    const int drop = L->dropout > 0.0f;
    float *du_all = scratch, *su_all = du_all + (size_t)T * r, *xm_all = su_all + (size_t)T * r;
    const size_t nAT = u ? 0 : (size_t)K * r, nAP = dx ? (size_t)panel_cols(K) * r : 0;
    const size_t nm = drop ? (size_t)TB * K : 0, nt = drop ? (size_t)TB * K : 0;
    float *buf = nl_thread_scratch(sizeof(float) * (nAT + nAP + nm + nt + (size_t)TB * r + 1));
    if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
    float *AT = buf, *AP = AT + nAT, *mb = AP + nAP, *tmp = mb + nm, *ub = tmp + nt;
    if (!u) pack_AT(AT, A, r, K);
    if (dx) pack_panels(AP, A, K, 1, K); /* Q(k, i) = A[k][i] */
    const int mode = dx_accumulate == NL_LORA_ADD ? 2 : dx_accumulate ? 1 : 0;
    for (int ta = t0; ta < t1; ta += TB) {
        const int nb = t1 - ta < TB ? t1 - ta : TB;
        const float *dyb = dy + (int64_t)ta * N;
        float *du = du_all + (int64_t)ta * r, *su = su_all + (int64_t)ta * r;
        const float *xb =
            masked_rows(L, drop, x + (int64_t)ta * K, tok0, toks, ta, nb, mb, xm_all + (int64_t)ta * K, 1);
        const float *ur = u ? u + (int64_t)ta * r : ub;
        if (!u) lk->thin16(ub, xb, K, AT, nb, K);
        lk->thin16(du, dyb, N, B, nb, N);
        for (int i = 0; i < nb * r; i++) du[i] *= L->scale;
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        if (!dx) continue;
        float *dxb = dx + (int64_t)ta * K;
        if (!drop) {
            lk->add16(dxb, K, du, r, AP, nb, K, mode);
            continue;
        }
        lk->add16(tmp, K, du, r, AP, nb, K, 0);
        add_masked(dxb, tmp, mb, (int64_t)nb * K, mode != 0);
    }
    return 0;
}

/* nl_lora_backward_rows on the BF16 pair: u (when recomputed) and du = dy·B by thin16b, dx (+)=
 * du·A by add16b, the mask (dropout) in its store: (du·A) ⊙ m, rounded, then the add, as the FP32
 * path does it through its buffer. */
static size_t bwd16b_bytes(const nl_lora *L, int have_u, int want_dx) {
    const int K = L->n_in, N = L->n_out, kn = K > N ? K : N;
    return 4 * ((have_u ? 0 : (size_t)(K + 1) / 2 * 16) + (size_t)(N + 1) / 2 * 16 +
                (want_dx ? 8 * (size_t)(panel_cols(K) + 16) : 0) + (size_t)TB * words_ld(kn) + TB * 8) +
           4 * ((L->dropout > 0.0f ? (size_t)TB * K : 0) + (size_t)TB * 16 + 1);
}

static int lora_bwd_rows16b(const nl_lora *L, const nl_lora_kernels *lk, const float *A, const float *B, float *dx,
                            int dx_accumulate, const float *dy, const float *x, const float *u, int T, int64_t tok0,
                            const int64_t *toks, float *scratch, int t0, int t1) {
    const int K = L->n_in, N = L->n_out, r = L->rank, Kw = (K + 1) / 2, Nw = (N + 1) / 2;
    const int drop = L->dropout > 0.0f;
    float *du_all = scratch, *su_all = du_all + (size_t)T * r, *xm_all = su_all + (size_t)T * r;
    const int64_t ldk = words_ld(K), ldn = words_ld(N), ldq = panel_cols(K) + 16;
    const size_t nPA = u ? 0 : (size_t)Kw * 16, nPB = (size_t)Nw * 16, nQA = dx ? 8 * (size_t)ldq : 0,
                 nxw = (size_t)TB * (ldk > ldn ? ldk : ldn);
    uint32_t *buf = nl_thread_scratch(bwd16b_bytes(L, u != NULL, dx != NULL));
    if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
    uint32_t *PA = buf, *PB = PA + nPA, *QA = PB + nPB, *xw = QA + nQA, *dw = xw + nxw;
    float *mb = (float *)(dw + (size_t)TB * 8), *ub = mb + (drop ? (size_t)TB * K : 0);
    if (!u) nl_bf16_rows_t(PA, 16, A, K, r, K, 16);                 /* PA[w][j] = (A[j][2w], A[j][2w+1]) */
    nl_bf16_pairs(PB, 16, B, r, N, r, 16);                          /* PB[w][j] = (B[2w][j], B[2w+1][j]) */
    if (dx) nl_bf16_pairs(QA, ldq, A, K, r, K, (int)panel_cols(K)); /* QA[w][k] = (A[2w][k], A[2w+1][k]) */
    const int mode = drop ? (dx_accumulate ? 3 : 4) : dx_accumulate == NL_LORA_ADD ? 2 : dx_accumulate ? 1 : 0;
    const int bits = kbits(L) != NULL; /* the mask from the kept bits in add16bk and phase 2's tn16k */
    for (int ta = t0; ta < t1; ta += TB) {
        const int nb = t1 - ta < TB ? t1 - ta : TB;
        float *du = du_all + (int64_t)ta * r, *su = su_all + (int64_t)ta * r;
        /* x ⊙ m only where u is recomputed from it, or phase 2 reads it */
        const float *xb =
            bits && u ? NULL
                      : masked_rows(L, drop, x + (int64_t)ta * K, tok0, toks, ta, nb, mb, xm_all + (int64_t)ta * K, 1);
        const float *ur = u ? u + (int64_t)ta * r : ub;
        if (!u) {
            nl_bf16_rows(xw, ldk, xb, K, nb, K, Kw);
            lk->thin16b(ub, xw, ldk, PA, nb, Kw);
        }
        nl_bf16_rows(xw, ldn, dy + (int64_t)ta * N, N, nb, N, Nw);
        lk->thin16b(du, xw, ldn, PB, nb, Nw);
        for (int i = 0; i < nb * r; i++) du[i] *= L->scale;
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        if (!dx) continue;
        nl_bf16_rows(dw, 8, du, r, nb, r, 8);
        if (bits)
            lk->add16bk(dx + (int64_t)ta * K, K, dw, 8, QA, ldq, nb, K, mode, bits_in(L, ta),
                        (int64_t)nl_lora_mask_halves(K), 1.0f / (1.0f - L->dropout));
        else lk->add16b(dx + (int64_t)ta * K, K, dw, 8, QA, ldq, nb, K, mode, drop ? mb : NULL, K);
    }
    return 0;
}

/* scratch: du [T][r] = s·dy·B, su [T][r] = s·u, then (dropout only) xm [T][K] = x ⊙ m. */
int nl_lora_backward_rows(const nl_lora *L, const float *A, const float *B, float *dx, int dx_accumulate,
                          const float *dy, const float *x, const float *u, int T, int64_t tok0, const int64_t *toks,
                          float *scratch, int t0, int t1) {
    if (check(L, "backward")) return -1;
    if (t0 < 0 || t1 < t0 || t1 > T) return nl_err("lora backward: bad row range [%d, %d) of %d", t0, t1, T);
    if (L->tiles) {
        uint32_t *buf = nl_thread_scratch(bwd_rows_tiles_bytes(L, u != NULL));
        if (!buf)
            return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", L->n_in, L->n_out,
                          L->rank);
        lora_bwd_rows_tiles(L, A, B, dx, dx_accumulate, dy, x, u, T, tok0, toks, scratch, t0, t1, buf, 1);
        return 0;
    }
    if (kb16(L)) return lora_bwd_rows16b(L, kb16(L), A, B, dx, dx_accumulate, dy, x, u, T, tok0, toks, scratch, t0, t1);
    if (k16(L)) return lora_bwd_rows16(L, k16(L), A, B, dx, dx_accumulate, dy, x, u, T, tok0, toks, scratch, t0, t1);
    const int K = L->n_in, N = L->n_out, r = L->rank;
    const int drop = L->dropout > 0.0f;
    float *du_all = scratch, *su_all = du_all + (size_t)T * r, *xm_all = su_all + (size_t)T * r;
    const size_t nAT = u ? 0 : (size_t)K * r;
    const size_t nm = drop ? (size_t)TB * K : 0, nt = drop || dx_accumulate == NL_LORA_ADD ? (size_t)TB * K : 0;
    float *buf =
        nl_thread_scratch(sizeof(float) * (nAT + nm + nt + (size_t)TB * r + 1)); /* mask, (du·A) before it is added */
    if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
    float *AT = buf, *mb = AT + nAT, *tmp = mb + nm, *ub = tmp + nt;
    if (!u) pack_AT(AT, A, r, K);
    for (int ta = t0; ta < t1; ta += TB) {
        const int nb = t1 - ta < TB ? t1 - ta : TB;
        const float *dyb = dy + (int64_t)ta * N;
        float *du = du_all + (int64_t)ta * r, *su = su_all + (int64_t)ta * r;
        const float *xb =
            masked_rows(L, drop, x + (int64_t)ta * K, tok0, toks, ta, nb, mb, xm_all + (int64_t)ta * K, 1);
        const float *ur = u ? u + (int64_t)ta * r : ub;
        if (!u) nl_gemm(ub, r, xb, K, AT, r, nb, r, K, 0);
        nl_gemm(du, r, dyb, N, B, r, nb, r, N, 0);
        for (int i = 0; i < nb * r; i++) du[i] *= L->scale;
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        if (dx) dx_rows(L, A, du, nb, dx + (int64_t)ta * K, dx_accumulate, drop ? mb : NULL, tmp);
    }
    return 0;
}

/* ---- the backward by lines (the tiles) ---- */

int nl_lora_bwd_by_lines(const nl_lora *L) { return L->tiles != NULL; }

int nl_lora_backward_du(const nl_lora *L, const float *A, const float *B, const float *dy, const float *x,
                        const float *u, int T, int64_t tok0, const int64_t *toks, float *scratch, int t0, int t1) {
    if (check(L, "backward")) return -1;
    if (!nl_lora_bwd_by_lines(L)) return nl_err("lora backward: by lines only on the tiles");
    if (t0 < 0 || t1 < t0 || t1 > T) return nl_err("lora backward: bad row range [%d, %d) of %d", t0, t1, T);
    uint32_t *buf = nl_thread_scratch(bwd_rows_tiles_bytes(L, u != NULL));
    if (!buf)
        return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", L->n_in, L->n_out,
                      L->rank);
    lora_bwd_rows_tiles(L, A, B, NULL, 0, dy, x, u, T, tok0, toks, scratch, t0, t1, buf, 0);
    return 0;
}

#define SW 256 /* columns of x, dx and dA per strip of a token block (nl_lora_backward_lines) */

/* The mask and x ⊙ m of columns [c, c + n) of one token row (key kt, x at the row's column c):
 * drop_block's values for those columns (value j of the row's key gives elements 2j, 2j + 1; the
 * kernel row from the even column on, its key advanced by those values' counters); or, with the
 * row's kept bits kb (mask_in), those bits expanded (mr may then be NULL). */
static void drop_strip(const nl_lora *L, uint64_t kt, const uint16_t *kb, int c, int n, const float *x, float *mr,
                       float *xm) {
    int (*const apply)(uint64_t, int, uint32_t, float, const float *, float *, float *, uint32_t *, uint16_t *) =
        nl_cpu_kernels()->dropout_apply_row;
    const uint32_t thr = keep_threshold(L->dropout);
    const float inv = 1.0f / (1.0f - L->dropout);
    if (kb) {
        bits_strip(kb, c, n, inv, x, mr, xm);
        return;
    }
    int i = 0;
    if (c & 1) { /* the high half of value (c − 1) / 2 */
        mr[0] = (uint32_t)(nl_rng_u64(kt, (uint64_t)(c >> 1)) >> 32) >= thr ? inv : 0.0f;
        xm[0] = x[0] * mr[0];
        i = 1;
    }
    if (apply && i < n) /* nl_rng_u64(kt, j0 + j) = nl_rng_u64(kt + j0·γ, j) */
        i += apply(kt + (uint64_t)((c + i) >> 1) * NL_RNG_GAMMA, n - i, thr, inv, x + i, mr + i, xm + i, NULL, NULL);
    for (; i < n; i++) {
        const uint64_t v = nl_rng_u64(kt, (uint64_t)((c + i) >> 1));
        mr[i] = (uint32_t)((c + i) & 1 ? v >> 32 : v) >= thr ? inv : 0.0f;
        xm[i] = x[i] * mr[i];
    }
}

/* dA's columns [c0, c1) and dx's, a block of TB token rows at a time, each block's columns in
 * strips of SW: x ⊙ m of the strip rebuilt (drop_strip), dx (+)= (du·A) ⊙ m as
 * lora_bwd_rows_tiles computes it (the tiles give each element the bits of the full rows), dA's
 * chains over t continued block by block (tn16 / nl_gemm_tn from C: exact). */
static int bwd_cols_tiles(const nl_lora *L, const float *A, float *dx, int dx_accumulate, float *dA, const float *x,
                          int T, int64_t tok0, const int64_t *toks, const float *du_all, int c0, int c1) {
    const int K = L->n_in, r = L->rank, rp = nl_tile_up(r), w = c1 - c0, wp = nl_tile_up(w), sm = wp < SW ? wp : SW;
    const int drop = L->dropout > 0.0f;
    const float inv = 1.0f / (1.0f - L->dropout);
    const nl_lora_kernels *lk = r == 16 ? nl_cpu_kernels()->lora : NULL;
    const size_t n_ba = (size_t)rp / 2 * wp, n_sa = (size_t)TB * rp / 2, n_at = lk ? (size_t)w * 16 : 0;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * (n_ba + n_sa) + sizeof(float) * (3 * (size_t)TB * sm + n_at));
    if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, L->n_out, r);
    uint32_t *ba = buf;
    uint16_t *sa = (uint16_t *)(ba + n_ba);
    float *mb = (float *)(ba + n_ba + n_sa), *xm = mb + (size_t)TB * sm, *tmp = xm + (size_t)TB * sm,
          *dat = tmp + (size_t)TB * sm;
    if (dx) nl_tile_pack_b(ba, wp, A + c0, K, 0, r, w); /* B[i][k] = A[i][c0 + k] */
    /* tn16: dA's columns transposed ([w][16], tn16's trans form) for the whole call, so the
     * blocks' calls do not transpose a tile in and out each (exact copies either way) */
    if (lk)
        for (int i = 0; i < 16; i++)
            for (int c = 0; c < w; c++) dat[(int64_t)c * 16 + i] = dA[(int64_t)i * K + c0 + c];
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int nb = T - t0 < TB ? T - t0 : TB;
        const float *du = du_all + (int64_t)t0 * r;
        if (dx) nl_tile_pack_a(sa, rp, du, r, 0, nb, r);
        for (int s0 = 0; s0 < w; s0 += SW) {
            const int sw = w - s0 < SW ? w - s0 : SW, cs = c0 + s0;
            const float *xs = x + (int64_t)t0 * K + cs;
            int64_t ldq = K;
            if (drop) {
                for (int b = 0; b < nb; b++) /* with the kept bits no mask row: dx reads the bits */
                    drop_strip(L, L->mask_in ? 0 : nl_rng_key_add(L->key, (uint64_t)tok_of(tok0, toks, t0 + b)),
                               L->mask_in ? bits_in(L, t0 + b) : NULL, cs, sw, xs + (int64_t)b * K,
                               L->mask_in ? NULL : mb + (int64_t)b * sw, xm + (int64_t)b * sw);
                xs = xm, ldq = sw;
            }
            if (dx) {
                float *dxs = dx + (int64_t)t0 * K + cs;
                if (!drop && dx_accumulate != NL_LORA_ADD) {
                    nl_tile_gemm(L->tiles, dxs, K, sa, rp, ba + s0, wp, nb, sw, r, dx_accumulate);
                } else { /* the term rounded, then masked and/or added (lora_bwd_rows_tiles' bits) */
                    nl_tile_gemm(L->tiles, tmp, sw, sa, rp, ba + s0, wp, nb, sw, r, 0);
                    for (int b = 0; b < nb; b++) {
                        float *d = dxs + (int64_t)b * K;
                        const float *tb = tmp + (int64_t)b * sw;
                        if (drop && L->mask_in) bits_madd(bits_in(L, t0 + b), cs, sw, inv, tb, d, dx_accumulate != 0);
                        else if (drop) add_masked(d, tb, mb + (int64_t)b * sw, sw, dx_accumulate != 0);
                        else add_into(d, tb, sw);
                    }
                }
            }
            if (lk) lk->tn16(dat + (int64_t)s0 * 16, 16, 1, du, r, xs, ldq, sw, nb);
            else nl_gemm_tn(dA + cs, K, du, r, xs, ldq, r, sw, nb, 1);
        }
    }
    if (lk)
        for (int i = 0; i < 16; i++)
            for (int c = 0; c < w; c++) dA[(int64_t)i * K + c0 + c] = dat[(int64_t)c * 16 + i];
    return 0;
}

int nl_lora_backward_lines(const nl_lora *L, const float *A, float *dx, int dx_accumulate, float *dA, float *dB,
                           const float *dy, const float *x, int T, int64_t tok0, const int64_t *toks,
                           const float *scratch, int j0, int j1) {
    if (check(L, "backward")) return -1;
    if (!nl_lora_bwd_by_lines(L)) return nl_err("lora backward: by lines only on the tiles");
    const int K = L->n_in, N = L->n_out;
    const int c0 = j0 < K ? j0 : K, c1 = j1 < K ? j1 : K;
    if (c1 > c0 && bwd_cols_tiles(L, A, dx, dx_accumulate, dA, x, T, tok0, toks, scratch, c0, c1)) return -1;
    const int o0 = (j0 > K ? j0 : K) - K, o1 = (j1 < K + N ? j1 : K + N) - K;
    if (o1 > o0 && L->rank != 16) /* dB's rows: nl_lora_backward_params' */
        return nl_lora_backward_params(L, dA, dB, dy, x, T, scratch, K + o0, K + o1);
    if (o1 > o0) { /* the same chains (tn16's, dB as su ⊗ dy) a block of rows at a time, each block's dy
                      strip copied (rows read in order, not a column walk down T pages) */
        const int r = L->rank, w = o1 - o0, sm = w < SW ? w : SW;
        const float *su = scratch + (size_t)T * r;
        float *buf = nl_thread_scratch(sizeof(float) * (size_t)TB * sm);
        if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
        const nl_lora_kernels *lk = nl_cpu_kernels()->lora;
        for (int t0 = 0; t0 < T; t0 += TB) {
            const int nb = T - t0 < TB ? T - t0 : TB;
            for (int s0 = 0; s0 < w; s0 += SW) {
                const int sw = w - s0 < SW ? w - s0 : SW;
                const float *q = dy + (int64_t)t0 * N + o0 + s0;
                int64_t ldq = N;
                if (lk) {
                    for (int b = 0; b < nb; b++)
                        memcpy(buf + (int64_t)b * sw, q + (int64_t)b * N, sizeof(float) * (size_t)sw);
                    q = buf, ldq = sw;
                    lk->tn16(dB + (int64_t)(o0 + s0) * r, r, 1, su + (int64_t)t0 * r, r, q, ldq, sw, nb);
                } else {
                    nl_gemm_tn(dB + (int64_t)(o0 + s0) * r, r, q, ldq, su + (int64_t)t0 * r, r, sw, r, nb, 1);
                }
            }
        }
    }
    return 0;
}

int nl_lora_backward_params(const nl_lora *L, float *dA, float *dB, const float *dy, const float *x, int T,
                            const float *scratch, int j0, int j1) {
    const int K = L->n_in, N = L->n_out, r = L->rank;
    const float *du = scratch, *su = du + (size_t)T * r;
    const float *xm = L->dropout > 0.0f ? su + (size_t)T * r : x;
    /* dA[:, c0..c1) += duᵀ · xm[:, c0..c1)   (one chain over all T tokens per element) */
    const int c0 = j0 < K ? j0 : K, c1 = j1 < K ? j1 : K;
    /* dB[o0..o1) += dy[:, o0..o1)ᵀ · su */
    const int o0 = (j0 > K ? j0 : K) - K, o1 = (j1 < K + N ? j1 : K + N) - K;
    /* FP32 on the tiles too: these sum over the tokens, and a TDPBF16PS sums a 32-step in its
     * own order (docs/amx.md), so on tiles a gathered call's (or one sequence's) rows would
     * group their terms differently from the full (packed) call's, where the other rows are
     * zeros; one FP32 chain per element over t leaves those zeros exact no-ops. The rank-16
     * kernels' tn16 computes those same chains (their bits), so the tiles take it too. */
    const nl_lora_kernels *lk = L->rank == 16 ? nl_cpu_kernels()->lora : NULL;
    if (lk) {                    /* the same chains; dB as its transpose (su ⊗ dy: a·b = b·a) */
        if (c1 > c0 && kbits(L)) /* x ⊙ m from x and the kept bits in the kernel: tn16's bits */
            lk->tn16k(dA + c0, K, du, r, x + c0, K, L->mask_in, (int64_t)nl_lora_mask_halves(K), c0,
                      1.0f / (1.0f - L->dropout), c1 - c0, T);
        else if (c1 > c0) lk->tn16(dA + c0, K, 0, du, r, xm + c0, K, c1 - c0, T);
        if (o1 > o0) lk->tn16(dB + (int64_t)o0 * r, r, 1, su, r, dy + o0, N, o1 - o0, T);
        return 0;
    }
    if (c1 > c0) nl_gemm_tn(dA + c0, K, du, r, xm + c0, K, r, c1 - c0, T, 1);
    if (o1 > o0) nl_gemm_tn(dB + (int64_t)o0 * r, r, dy + o0, N, su, r, o1 - o0, r, T, 1);
    return 0;
}

int nl_lora_backward_to(const nl_lora *L, const float *A, const float *B, float *dx, int dx_accumulate, float *dA,
                        float *dB, const float *dy, const float *x, const float *u, int T, int64_t tok0) {
    if (check(L, "backward")) return -1;
    const int K = L->n_in, N = L->n_out, r = L->rank;
    const int drop = L->dropout > 0.0f;
    if (L->tiles) {
        /* the two phases on one thread, a block of TB rows at a time (the blocks phase 1 takes
         * anyway; phase 2's chains over t continued block by block, as below): the block's
         * phase-1 scratch after the packing buffer, in one thread-scratch request */
        const size_t nrows = bwd_rows_tiles_bytes(L, u != NULL), ns = nl_lora_bwd_scratch_floats(L, TB);
        uint32_t *buf = nl_thread_scratch(nrows + sizeof(float) * ns);
        if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
        float *scr = (float *)((char *)buf + nrows);
        nl_lora Lb = *L; /* its mask_in at the block's rows */
        for (int t0 = 0; t0 < T; t0 += TB) {
            const int nb = T - t0 < TB ? T - t0 : TB;
            if (L->mask_in) Lb.mask_in = bits_in(L, t0);
            lora_bwd_rows_tiles(&Lb, A, B, dx ? dx + (int64_t)t0 * K : NULL, dx_accumulate, dy + (int64_t)t0 * N,
                                x + (int64_t)t0 * K, u ? u + (int64_t)t0 * r : NULL, nb, tok0 + t0, NULL, scr, 0, nb,
                                buf, 1);
            if (nl_lora_backward_params(L, dA, dB, dy + (int64_t)t0 * N, x + (int64_t)t0 * K, nb, scr, 0, K + N))
                return -1;
        }
        return 0;
    }
    if (kb16(L)) {
        /* the two phases a block of TB rows at a time, as on the tiles (the rows' products
         * are per row, the parameters' chains over t continue block by block) */
        float *scr = malloc(sizeof(float) * (nl_lora_bwd_scratch_floats(L, TB) + 1));
        if (!scr) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
        int rc = 0;
        nl_lora Lb = *L; /* its mask_in at the block's rows */
        for (int t0 = 0; t0 < T && rc == 0; t0 += TB) {
            const int nb = T - t0 < TB ? T - t0 : TB;
            if (L->mask_in) Lb.mask_in = bits_in(L, t0);
            rc = nl_lora_backward_rows(&Lb, A, B, dx ? dx + (int64_t)t0 * K : NULL, dx_accumulate, dy + (int64_t)t0 * N,
                                       x + (int64_t)t0 * K, u ? u + (int64_t)t0 * r : NULL, nb, tok0 + t0, NULL, scr, 0,
                                       nb);
            if (rc == 0)
                rc = nl_lora_backward_params(&Lb, dA, dB, dy + (int64_t)t0 * N, x + (int64_t)t0 * K, nb, scr, 0, K + N);
        }
        free(scr);
        return rc;
    }
    const size_t nAT = u ? 0 : (size_t)K * r;
    const size_t nx = drop ? 3 * (size_t)TB * K : 0; /* mask, x ⊙ m, (du·A) before the mask */
    const size_t nsmall = 3 * (size_t)TB * r;        /* du, recomputed u, s·u */
    float *buf = nl_thread_scratch(sizeof(float) * (nAT + nx + nsmall + 1));
    if (!buf) return nl_err("lora backward: out of memory for scratch (n_in=%d n_out=%d rank=%d)", K, N, r);
    float *AT = buf, *mb = AT + nAT, *xm = mb + (drop ? (size_t)TB * K : 0), *tmp = xm + (drop ? (size_t)TB * K : 0);
    float *du = tmp + (drop ? (size_t)TB * K : 0), *ub = du + (size_t)TB * r, *su = ub + (size_t)TB * r;
    if (!u) pack_AT(AT, A, r, K);
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int nb = T - t0 < TB ? T - t0 : TB;
        const float *dyb = dy + (int64_t)t0 * N;
        const float *xb = masked_rows(L, drop, x + (int64_t)t0 * K, tok0, NULL, t0, nb, mb, xm, 1);
        const float *ur = u ? u + (int64_t)t0 * r : ub;
        if (!u) nl_gemm(ub, r, xb, K, AT, r, nb, r, K, 0);
        /* du = s · dy · B   [nb][r] */
        nl_gemm(du, r, dyb, N, B, r, nb, r, N, 0);
        for (int i = 0; i < nb * r; i++) du[i] *= L->scale;
        /* dB += dyᵀ · (s·u)   [N][r] */
        for (int i = 0; i < nb * r; i++) su[i] = L->scale * ur[i];
        nl_gemm_tn(dB, r, dyb, N, su, r, N, r, nb, 1);
        /* dA += duᵀ · (m ⊙ x)   [r][K] */
        nl_gemm_tn(dA, K, du, r, xb, K, r, K, nb, 1);
        /* dx (+)= (du · A) ⊙ m   [nb][K] */
        if (dx) dx_rows(L, A, du, nb, dx + (int64_t)t0 * K, dx_accumulate, drop ? mb : NULL, tmp);
    }
    return 0;
}

int nl_lora_backward(const nl_lora *L, const float *A, const float *B, float *dx, float *dA, float *dB, const float *dy,
                     const float *x, const float *u, int T, int64_t tok0) {
    return nl_lora_backward_to(L, A, B, dx, 1, dA, dB, dy, x, u, T, tok0);
}

/* The most of nl_thread_scratch any path above asks for L (each request as sized there). */
uint64_t nl_lora_thread_bytes(const nl_lora *L) {
    const uint64_t K = (uint64_t)(L->n_in > 0 ? L->n_in : 0), N = (uint64_t)(L->n_out > 0 ? L->n_out : 0),
                   r = (uint64_t)(L->rank > 0 ? L->rank : 0);
    const uint64_t Kp = (uint64_t)nl_tile_up((int)K), Np = (uint64_t)nl_tile_up((int)N),
                   rp = (uint64_t)nl_tile_up((int)r), tb = TB;
    const uint64_t nx = L->dropout > 0.0f ? 3 * tb * K : 0; /* the most any path takes for its masks */
    uint64_t b =
        4 * (Kp / 2 * rp + rp / 2 * Np + tb * Kp / 2 + tb * rp / 2) + 4 * (nx + 2 * tb * r + tb * N); /* tiles FWD */
    uint64_t x =
        4 * (Kp / 2 * rp + Np / 2 * rp + rp / 2 * Kp + tb * (Kp > Np ? Kp : Np) / 2 + tb * rp / 2) +
        4 * (nx + tb * K + tb * r + 1) +
        4 * (tb * (2 * r + (L->dropout > 0.0f ? K : 0))); /* tiles BWD (on one thread: a block's phase-1 scratch too) */
    if (x > b) b = x;
    x = 4 * (rp / 2 * Kp + tb * rp / 2) + 4 * (3 * tb * (Kp < SW ? Kp : SW) + 16 * K); /* tiles BWD by lines */
    if (x > b) b = x;
    const uint64_t kn = K > N ? K : N;
    x = 4 * (K * r + r * ((kn + 31) / 32 * 32) + nx + 3 * tb * r + 1 +
             tb * kn); /* FP32: FWD, BWD rows (NL_LORA_ADD's block; the rank-16 kernels' panels), BWD on one thread */
    if (x > b) b = x;
    if (L->rank == 16 && L->n_in > 0 && L->n_out > 0) { /* the BF16 pair's (whatever L->bf16 says) */
        x = fwd16b_bytes(L);
        if (x > b) b = x;
        x = bwd16b_bytes(L, 0, 1);
        if (x > b) b = x;
    }
    return (b + 63) / 64 * 64;
}

/* nn/attention: causal GQA attention in query blocks.
 *
 * Shapes: q[T][Hq][d]; k, v[S][Hkv][d] (S >= T, the first S-T keys are the past);
 * out[T][Hq][d]; lse[T][Hq]. Query t attends keys 0 .. S-T+t. Query head h reads kv head
 * h / (Hq/Hkv). Scores are c·q·k with c = scale. Sliding window (window > 0, gemma3): query t
 * sees only the keys j with (S-T+t) − j < window (itself and the window − 1 before it); the
 * keys below are masked to −∞ in the score rows (exp gives 0), so window 0 (or one wider
 * than the row) computes exactly what the plain causal form does.
 *
 * Work is organised per kv head g (so a caller can split kv heads over threads: every output a
 * kv head writes — its query heads' out/lse/dq and its own dk/dv columns — belongs to it
 * alone). Per kv head, Kᵀ (and Vᵀ for the backward) is packed once into a d×S panel; then per
 * query head of the group and block of BQ queries [q0, q0+nq), with kend = S-T+q0+nq the keys
 * any of them sees:
 *   forward:  s = c·Q·Kᵀ [nq][kend] (one GEMM), exact row max and p = exp(s − max) (masked
 *             past the causal limit), O = P·V (one GEMM), rows scaled by 1/Σp,
 *             lse = max + log Σp. No online rescaling: the whole visible row is in the block.
 *   backward: p = exp(c·q·k − lse), dp = dO·Vᵀ, D_t = do_t·o_t, ds = p ⊙ (dp − D)·c,
 *             dQ = ds·K (stored), dK += dsᵀ·Q, dV += pᵀ·dO (GEMMs with a transposed A, no
 *             copies). dK/dV of a kv head sum its query heads in increasing h order.
 * Facts: docs/backward.md.
 *
 * Memory: O(d·S + BQ·S) scratch per call (one allocation): per head O(T·d), never T×T.
 * Very short query blocks against a long past (decoding) skip the packing and take dot
 * products straight from the cache. The GEMMs are cpu/gemm.c (deterministic FMA chains). */
#include "cpu/gemm_bf16.h"
#include "cpu/kernels.h"
#include "cpu/tiles.h"
#include "cpu/vecmath.h"
#include "nn/nn.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ 48     /* queries per block: 8 row tiles of the GEMM; causal waste BQ/2 keys per query */
#define SMALL_T 4 /* up to this many queries: no packing (decoding) */
_Static_assert(BQ % 2 == 0, "BF16 blocks start on a pair of queries");

/* Out of memory for the scratch: -1 with nl_err (this thread's; nn/par.c reports it to the caller).
 * Nothing is written: the caller's step fails, it does not go on with NaN. */
static int fwd_oom(int S, int d) {
    return nl_err("attention forward: out of memory for scratch (d = %d, S = %d)", d, S);
}
static int bwd_oom(int T, int d) {
    return nl_err("attention backward: out of memory for scratch (d = %d, T = %d)", d, T);
}

/* dst[i][j] = src row j (stride lds), element i, for j < n: Kᵀ as a d×ldd panel. */
static void pack_t(float *dst, int64_t ldd, const float *src, int64_t lds, int n, int d) {
    enum { JB = 8 };
    int j0 = 0;
    for (; j0 + JB <= n; j0 += JB) {
        const float *s = src + (int64_t)j0 * lds;
        for (int i = 0; i < d; i++) {
            float *o = dst + (int64_t)i * ldd + j0;
            for (int j = 0; j < JB; j++) o[j] = s[(int64_t)j * lds + i];
        }
    }
    for (; j0 < n; j0++)
        for (int i = 0; i < d; i++) dst[(int64_t)i * ldd + j0] = src[(int64_t)j0 * lds + i];
}

/* Rows [0, nq) of a score block (row stride lds), row i the query at position pos0 + i: the
 * keys below the sliding window (j <= pos − window) masked to −∞. No-op for window 0. */
static void mask_window(float *s, int64_t lds, int nq, int pos0, int window) {
    if (window <= 0) return;
    for (int i = 0; i < nq; i++) {
        const int lo = pos0 + i - window + 1;
        for (int j = 0; j < lo; j++) s[i * lds + j] = -INFINITY;
    }
}

/* Row of n scores: sr *= c, returns the max over the first nv (nv >= 1) and zeroes [nv, n). */
static float row_scale_max(float *sr, int nv, int n, float c) {
    float mx[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) mx[l] = -INFINITY;
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) {
            const float x = sr[j + l] * c;
            sr[j + l] = x;
            mx[l] = x > mx[l] ? x : mx[l];
        }
    float m = -INFINITY;
    for (; j < nv; j++) {
        sr[j] *= c;
        m = sr[j] > m ? sr[j] : m;
    }
    for (int l = 0; l < NL_LANES; l++) m = mx[l] > m ? mx[l] : m;
    for (j = nv; j < n; j++) sr[j] = 0.0f;
    return m;
}

/* row_scale_max's max, nothing written (the tile forward's exp pass multiplies again: the same
 * products) */
static float row_max_scaled(const float *sr, int nv, float c) {
    float mx[NL_LANES];
    for (int l = 0; l < NL_LANES; l++) mx[l] = -INFINITY;
    int j = 0;
    for (; j + NL_LANES <= nv; j += NL_LANES)
        for (int l = 0; l < NL_LANES; l++) {
            const float x = sr[j + l] * c;
            mx[l] = x > mx[l] ? x : mx[l];
        }
    float m = -INFINITY;
    for (; j < nv; j++) {
        const float x = sr[j] * c;
        m = x > m ? x : m;
    }
    for (int l = 0; l < NL_LANES; l++) m = mx[l] > m ? mx[l] : m;
    return m;
}

/* The softmax rows' exp passes: the kernel table's element-wise bodies (cpu/vec_body.h:
 * att_exp_sum, att_row_bwd; the same bits in every row of the table) */
static float row_exp_sum(float *sr, int nv, float m) { return nl_cpu_kernels()->vec->att_exp_sum(sr, nv, m); }
static void row_bwd(float *sr, float *dpr, int nv, int n, float c, float L, float D) {
    nl_cpu_kernels()->vec->att_row_bwd(sr, dpr, nv, n, c, L, D);
}

int nl_attention_forward_range(const nl_attn_fwd *a) {
    float *const out = a->out, *const lse = a->lse;
    const float *const q = a->q, *const k = a->k, *const v = a->v;
    const int T = a->T, S = a->S, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv;
    const int past = S - T;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    const int packed = T > SMALL_T;
    const int64_t lds = S; /* row stride of the score block and of the Kᵀ panel */
    const size_t n_kT = packed ? (size_t)d * (size_t)S : 0, n_s = (size_t)(T < BQ ? T : BQ) * (size_t)S;
    float *buf = nl_thread_scratch(sizeof(float) * (n_kT + n_s + 1));
    if (!buf) return fwd_oom(S, d);
    float *kT = buf, *s = buf + n_kT;
    for (int g = g0; g < g1; g++) {
        const float *kg = k + (int64_t)g * d, *vg = v + (int64_t)g * d;
        if (packed) pack_t(kT, lds, kg, ldk, S, d);
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            for (int q0 = 0; q0 < T; q0 += BQ) {
                const int nq = T - q0 < BQ ? T - q0 : BQ;
                const int kend = past + q0 + nq;
                const float *qb = q + (int64_t)q0 * ldq + (int64_t)h * d;
                if (packed) {
                    nl_gemm(s, (int)lds, qb, (int)ldq, kT, (int)lds, nq, kend, d, 0);
                } else {
                    for (int i = 0; i < nq; i++)
                        for (int j = 0; j < kend; j++) s[i * lds + j] = nl_vdot(qb + i * ldq, kg + j * ldk, d);
                }
                mask_window(s, lds, nq, past + q0, window);
                float mx[BQ], sum[BQ];
                for (int i = 0; i < nq; i++) {
                    float *sr = s + i * lds;
                    const int nv = past + q0 + i + 1;
                    mx[i] = row_scale_max(sr, nv, kend, scale);
                    sum[i] = row_exp_sum(sr, nv, mx[i]);
                }
                float *ob = out + (int64_t)q0 * ldq + (int64_t)h * d;
                nl_gemm(ob, (int)ldq, s, (int)lds, vg, (int)ldk, nq, d, kend, 0);
                for (int i = 0; i < nq; i++) {
                    nl_vscale(ob + i * ldq, 1.0f / sum[i], d);
                    if (lse) lse[(int64_t)(q0 + i) * Hq + h] = mx[i] + logf(sum[i]);
                }
            }
        }
    }
    return 0;
}

int nl_attention_forward(const nl_attn_fwd *a) {
    nl_attn_fwd r = *a;
    r.g0 = 0, r.g1 = a->Hkv;
    return nl_attention_forward_range(&r);
}

int nl_attention_prefix_rows(int P, int S) { return (P > SMALL_T) == (S > SMALL_T); }

int nl_attention_tail_start(int P, int S) {
    /* A query row of the FP32 forward does not depend on the block it is in: each score is one
     * chain over d (a GEMM element or one vdot), its max, exp and Σ run over its visible keys in
     * key order, and P·V is one chain over the block's keys with exact zeros past the visible
     * ones. Only packed (GEMM) vs direct (vdot) scores follow the call's T: when the whole call
     * would pack, the tail keeps more than SMALL_T queries so that it packs too. */
    if (S <= SMALL_T || S - P > SMALL_T) return P;
    return S - SMALL_T - 1;
}

int nl_attention_backward_range(const nl_attn_bwd *a) {
    float *const dq = a->dq, *const dk = a->dk, *const dv = a->dv;
    const float *const dout = a->dout, *const out = a->out, *const lse = a->lse, *const q = a->q, *const k = a->k,
                       *const v = a->v;
    const int T = a->T, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    const int64_t lds = T;
    const size_t n_t = (size_t)d * (size_t)T, n_s = (size_t)(T < BQ ? T : BQ) * (size_t)T;
    float *buf = nl_thread_scratch(sizeof(float) * (2 * n_t + 2 * n_s + 1));
    if (!buf) return bwd_oom(T, d);
    float *kT = buf, *vT = kT + n_t, *s = vT + n_t, *dp = s + n_s;
    for (int g = g0; g < g1; g++) {
        const int64_t kvoff = (int64_t)g * d;
        const float *kg = k + kvoff, *vg = v + kvoff;
        float *dkg = dk + kvoff, *dvg = dv + kvoff;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < d; i++) dkg[t * ldk + i] = dvg[t * ldk + i] = 0.0f;
        pack_t(kT, lds, kg, ldk, T, d);
        pack_t(vT, lds, vg, ldk, T, d);
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            const int64_t hoff = (int64_t)h * d;
            for (int q0 = 0; q0 < T; q0 += BQ) {
                const int nq = T - q0 < BQ ? T - q0 : BQ;
                const int kend = q0 + nq;
                const float *qb = q + (int64_t)q0 * ldq + hoff, *dob = dout + (int64_t)q0 * ldq + hoff;
                nl_gemm(s, (int)lds, qb, (int)ldq, kT, (int)lds, nq, kend, d, 0);   /* q·k */
                nl_gemm(dp, (int)lds, dob, (int)ldq, vT, (int)lds, nq, kend, d, 0); /* do·v */
                mask_window(s, lds, nq, q0, window);
                /* D with the same chain as a dp element: where o = v exactly (one visible
                 * key) ds is exactly 0, as it is mathematically */
                float D[BQ];
                nl_dot_rows(D, dob, (int)ldq, out + (int64_t)q0 * ldq + hoff, (int)ldq, nq, d);
                for (int i = 0; i < nq; i++) {
                    const int t = q0 + i;
                    row_bwd(s + i * lds, dp + i * lds, t + 1, kend, scale, lse[(int64_t)t * Hq + h], D[i]);
                }
                nl_gemm(dq + (int64_t)q0 * ldq + hoff, (int)ldq, dp, (int)lds, kg, (int)ldk, nq, d, kend,
                        0);                                                            /* dq = c·ds·K */
                nl_gemm_tn(dkg, (int)ldk, dp, (int)lds, qb, (int)ldq, kend, d, nq, 1); /* dk += c·dsᵀ·Q */
                nl_gemm_tn(dvg, (int)ldk, s, (int)lds, dob, (int)ldq, kend, d, nq, 1); /* dv += pᵀ·dO */
            }
        }
    }
    return 0;
}

int nl_attention_backward(const nl_attn_bwd *a) {
    nl_attn_bwd r = *a;
    r.g0 = 0, r.g1 = a->Hkv;
    return nl_attention_backward_range(&r);
}

/* ---- BF16 variant (cpu/gemm_bf16.h) ----
 *
 * The same blocks as above, with every GEMM operand packed to BF16 words in the layout the
 * vdpbf16ps kernel contracts over (pairs along the reduction index):
 *   forward, per kv head:  Kᵀ words [d/2][S] (for Q·Kᵀ), V pairs of keys [S/2][d] (for P·V);
 *            per block:    Q rows [nq][d/2]; P rows [nq][kend/2], written by the exp pass.
 *   backward, per kv head: Kᵀ, Vᵀ words [d/2][T] (Q·Kᵀ, dO·Vᵀ), K pairs [T/2][d] (dS·K);
 *            per q head:   Qᵀ, dOᵀ pairs of queries [d][T/2];
 *            per block:    Q, dO rows; dS rows [nq][kend/2]; P, dS pairs of queries
 *                          [nq/2][kend].
 * dK and dV are accumulated transposed, dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P ([d][T] FP32, so the
 * small-M side is the transposed-once-per-head Qᵀ rather than a transposed dS per block),
 * and transposed into dk/dv once per kv head. Row strides of B operands get 16 extra words so
 * a power-of-two length (T = 512) does not map a panel's rows onto a few L1 sets. */

#if defined(__x86_64__)
#define NL_ATT_BF16 1

static int64_t ld_b(int n) { return (int64_t)((n + 15) & ~15) + 16; }

/* 0, or -1 when out of memory (nothing written) */
static int fwd_bf16(const nl_attn_fwd *a) {
    float *const out = a->out, *const lse = a->lse;
    const float *const q = a->q, *const k = a->k, *const v = a->v;
    const int T = a->T, S = a->S, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv, past = S - T, dw = (d + 1) / 2, bq = T < BQ ? T : BQ;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    const int64_t ld_kw = ld_b(S), ld_vi = ld_b(d), ld_pw = (S + 1) / 2;
    const size_t n_kw = (size_t)dw * ld_kw, n_vi = (size_t)((S + 1) / 2) * ld_vi, n_qr = (size_t)bq * dw,
                 n_pw = (size_t)bq * ld_pw, n_s = (size_t)bq * S;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * (n_kw + n_vi + n_qr + n_pw) + sizeof(float) * n_s);
    if (!buf) return -1;
    uint32_t *kw = buf, *vi = kw + n_kw, *qr = vi + n_vi, *pw = qr + n_qr;
    float *s = (float *)(pw + n_pw);
    for (int g = g0; g < g1; g++) {
        nl_bf16_rows_t(kw, ld_kw, k + (int64_t)g * d, ldk, S, d, (int)ld_kw);
        nl_bf16_pairs(vi, ld_vi, v + (int64_t)g * d, ldk, S, d, (int)ld_vi);
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            for (int q0 = 0; q0 < T; q0 += BQ) {
                const int nq = T - q0 < BQ ? T - q0 : BQ;
                const int kend = past + q0 + nq, kw_n = (kend + 1) / 2;
                nl_bf16_rows(qr, dw, q + (int64_t)q0 * ldq + (int64_t)h * d, ldq, nq, d, dw);
                nl_gemm_bf16(s, S, qr, dw, kw, ld_kw, nq, kend, dw, 0);
                mask_window(s, S, nq, past + q0, window);
                float mx[BQ], sum[BQ];
                for (int i = 0; i < nq; i++) {
                    const int nv = past + q0 + i + 1;
                    mx[i] = nl_bf16_row_scale_max(s + (int64_t)i * S, nv, scale);
                    sum[i] = nl_bf16_row_exp_pack(pw + i * ld_pw, s + (int64_t)i * S, nv, kw_n, mx[i]);
                }
                float *ob = out + (int64_t)q0 * ldq + (int64_t)h * d;
                nl_gemm_bf16(ob, ldq, pw, ld_pw, vi, ld_vi, nq, d, kw_n, 0);
                for (int i = 0; i < nq; i++) {
                    nl_vscale(ob + i * ldq, 1.0f / sum[i], d);
                    if (lse) lse[(int64_t)(q0 + i) * Hq + h] = mx[i] + logf(sum[i]);
                }
            }
        }
    }
    return 0;
}

static int bwd_bf16(const nl_attn_bwd *a) {
    float *const dq = a->dq, *const dk = a->dk, *const dv = a->dv;
    const float *const dout = a->dout, *const out = a->out, *const lse = a->lse, *const q = a->q, *const k = a->k,
                       *const v = a->v;
    const int T = a->T, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv, dw = (d + 1) / 2, bq = T < BQ ? T : BQ;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    const int64_t ld_t = ld_b(T), ld_ki = ld_b(d), ld_qt = (((T + 1) / 2 + 15) & ~15), ld_sr = (T + 1) / 2;
    const int64_t ld_dt = ld_b(T); /* dKᵀ, dVᵀ rows: not a power of two either (the transposes read 16 at a time) */
    const size_t n_kw = (size_t)dw * ld_t, n_ki = (size_t)((T + 1) / 2) * ld_ki, n_qt = (size_t)d * ld_qt,
                 n_qr = (size_t)bq * dw, n_sr = (size_t)bq * ld_sr, n_pi = (size_t)((bq + 1) / 2) * ld_t;
    const size_t n_s = (size_t)bq * T, n_dt = (size_t)d * ld_dt;
    const size_t n_words = 2 * n_kw + n_ki + 2 * n_qt + 2 * n_qr + n_sr + 2 * n_pi;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * n_words + sizeof(float) * (2 * n_s + 2 * n_dt));
    if (!buf) return -1;
    uint32_t *kw = buf, *vw = kw + n_kw, *ki = vw + n_kw, *qt = ki + n_ki, *ot = qt + n_qt, *qr = ot + n_qt,
             *dor = qr + n_qr, *dsr = dor + n_qr, *pi = dsr + n_sr, *dsi = pi + n_pi;
    float *s = (float *)(buf + n_words), *dp = s + n_s, *dkt = dp + n_s, *dvt = dkt + n_dt;
    for (int g = g0; g < g1; g++) {
        const int64_t kvoff = (int64_t)g * d;
        for (size_t i = 0; i < 2 * n_dt; i++) dkt[i] = 0.0f;
        nl_bf16_rows_t(kw, ld_t, k + kvoff, ldk, T, d, (int)ld_t);
        nl_bf16_rows_t(vw, ld_t, v + kvoff, ldk, T, d, (int)ld_t);
        nl_bf16_pairs(ki, ld_ki, k + kvoff, ldk, T, d, (int)ld_ki);
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            const int64_t hoff = (int64_t)h * d;
            nl_bf16_pairs_t(qt, ld_qt, q + hoff, ldq, T, d, (int)ld_qt);
            nl_bf16_pairs_t(ot, ld_qt, dout + hoff, ldq, T, d, (int)ld_qt);
            for (int q0 = 0; q0 < T; q0 += BQ) {
                const int nq = T - q0 < BQ ? T - q0 : BQ;
                const int kend = q0 + nq, kw_n = (kend + 1) / 2, qw_n = (nq + 1) / 2;
                const float *qb = q + (int64_t)q0 * ldq + hoff, *dob = dout + (int64_t)q0 * ldq + hoff;
                nl_bf16_rows(qr, dw, qb, ldq, nq, d, dw);
                nl_bf16_rows(dor, dw, dob, ldq, nq, d, dw);
                nl_gemm_bf16(s, T, qr, dw, kw, ld_t, nq, kend, dw, 0);   /* q·k */
                nl_gemm_bf16(dp, T, dor, dw, vw, ld_t, nq, kend, dw, 0); /* do·v */
                mask_window(s, T, nq, q0, window);
                float D[BQ];
                nl_dot_rows(D, dob, (int)ldq, out + (int64_t)q0 * ldq + hoff, (int)ldq, nq, d);
                for (int i = 0; i < nq; i++) {
                    const int t = q0 + i;
                    nl_bf16_row_bwd(s + (int64_t)i * T, dp + (int64_t)i * T, t + 1, kend, scale,
                                    lse[(int64_t)t * Hq + h], D[i]);
                }
                nl_bf16_rows(dsr, ld_sr, dp, T, nq, kend, kw_n);
                nl_bf16_pairs(pi, ld_t, s, T, nq, kend, (kend + 15) & ~15);
                nl_bf16_pairs(dsi, ld_t, dp, T, nq, kend, (kend + 15) & ~15);
                nl_gemm_bf16(dq + (int64_t)q0 * ldq + hoff, ldq, dsr, ld_sr, ki, ld_ki, nq, d, kw_n,
                             0);                                                           /* dq = c·ds·K */
                nl_gemm_bf16(dkt, ld_dt, qt + q0 / 2, ld_qt, dsi, ld_t, d, kend, qw_n, 1); /* dkᵀ += c·Qᵀ·ds */
                nl_gemm_bf16(dvt, ld_dt, ot + q0 / 2, ld_qt, pi, ld_t, d, kend, qw_n, 1);  /* dvᵀ += dOᵀ·p */
            }
        }
        nl_transpose_f32(dk + kvoff, ldk, dkt, ld_dt, d, T);
        nl_transpose_f32(dv + kvoff, ldk, dvt, ld_dt, d, T);
    }
    return 0;
}
#endif

int nl_attention_bf16_active(void) {
#ifdef NL_ATT_BF16
    return nl_bf16_ok();
#else
    return 0;
#endif
}

int nl_attention_forward_range_bf16(const nl_attn_fwd *a) {
#ifdef NL_ATT_BF16
    if (a->T > SMALL_T && nl_bf16_ok()) return fwd_bf16(a) ? fwd_oom(a->S, a->d) : 0;
#endif
    return nl_attention_forward_range(a);
}

int nl_attention_backward_range_bf16(const nl_attn_bwd *a) {
#ifdef NL_ATT_BF16
    if (a->T > SMALL_T && nl_bf16_ok()) return bwd_bf16(a) ? bwd_oom(a->T, a->d) : 0;
#endif
    return nl_attention_backward_range(a);
}

/* ---- on the matrix engine's tiles (cpu/tiles.h) ----
 *
 * The FP32 calls' blocks and row steps (row_scale_max, row_exp_sum, row_bwd in FP32), with
 * every GEMM a tile GEMM on BF16 operands, in blocks of BQT = 32 queries (one pair of A
 * tiles; a block's queries are one 32-element step of the dK/dV reductions):
 *   forward, per kv head:  Kᵀ pairs [d/2][S] (Q·Kᵀ), V pairs of keys [S/2][d] (P·V);
 *            per block:    Q rows, P rows (from the FP32 p; Σp of the unrounded p).
 *   backward, per kv head: Kᵀ, Vᵀ pairs (Q·Kᵀ, dO·Vᵀ), K pairs of keys (dS·K);
 *            per block:    Q, dO rows; dS rows (dQ = dS·K); dSᵀ, Pᵀ columns of the block's
 *                          queries into rows over BKV = 128 queries (4 blocks), then per 128
 *                          queries, with Q, dO pairs of queries: dK += dSᵀ·Q, dV += Pᵀ·dO
 *                          straight into dk, dv (one chain per element over the query heads and
 *                          queries in increasing order; a key a block does not see adds zeros,
 *                          which leave the chain's bits as they are).
 * Where the CPU has AMX these are its instructions; on the emulator the same code and
 * packing are tested on every machine (tests/test_nn_tiles.c). Sizes (d, S, T) are padded to
 * whole tiles with zeros; any d, T, window. */
#define BQT 32
#define LD_PAD 16 /* words past a whole-tile row: power-of-two rows (T = 512) off the same L1 sets */
#define BKV 128   /* queries per dK/dV product: 4 steps per load and store of an output block */

/* 0, or -1 when out of memory (nothing written) */
static int fwd_tiles(const nl_amx_tiles *tl, const nl_attn_fwd *a) {
    float *const out = a->out, *const lse = a->lse;
    const float *const q = a->q, *const k = a->k, *const v = a->v;
    const int T = a->T, S = a->S, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv, past = S - T, dp = nl_tile_up(d), Sp = nl_tile_up(S);
    const int ls = Sp + LD_PAD, lv = dp + LD_PAD, lp = Sp + 2 * LD_PAD; /* Kᵀ pairs and s, V pairs, P values */
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    const size_t n_kb = (size_t)dp / 2 * ls, n_vb = (size_t)Sp / 2 * lv, n_qa = (size_t)BQT * dp / 2,
                 n_pa = (size_t)BQT * lp / 2, n_s = (size_t)BQT * ls;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * (n_kb + n_vb + n_qa + n_pa) + sizeof(float) * n_s);
    if (!buf) return -1;
    uint32_t *kb = buf, *vb = kb + n_kb;
    uint16_t *qa = (uint16_t *)(vb + n_vb), *pa = qa + 2 * n_qa;
    float *s = (float *)(buf + n_kb + n_vb + n_qa + n_pa);
    const nl_vec_kernels *vk = nl_cpu_kernels()->vec;
    for (int g = g0; g < g1; g++) {
        nl_tile_pack_b(kb, ls, k + (int64_t)g * d, ldk, 1, d, S); /* B[i][j] = K[j][i] */
        nl_tile_pack_b(vb, lv, v + (int64_t)g * d, ldk, 0, S, d); /* B[j][i] = V[j][i] */
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            for (int q0 = 0; q0 < T; q0 += BQT) {
                const int nq = T - q0 < BQT ? T - q0 : BQT;
                const int kend = past + q0 + nq;
                nl_tile_pack_a(qa, dp, q + (int64_t)q0 * ldq + (int64_t)h * d, ldq, 0, nq, d);
                nl_tile_gemm(tl, s, ls, qa, dp, kb, ls, nq, kend, d, 0);
                mask_window(s, ls, nq, past + q0, window);
                /* P rows straight from the scores (the pack of row_scale_max + row_exp_sum's
                 * rows: the same values, Σ of the unrounded p), zero rows up to the A tiles */
                float mx[BQT], sum[BQT];
                const int kp = nl_tile_up(kend);
                for (int i = 0; i < nq; i++) {
                    const float *sr = s + (int64_t)i * ls;
                    const int nv = past + q0 + i + 1;
                    mx[i] = row_max_scaled(sr, nv, scale);
                    sum[i] = vk->att_exp_bf16(pa + (int64_t)i * lp, sr, nv, kp, scale, mx[i]);
                }
                for (int i = nq; i < nl_tile_up(nq); i++)
                    memset(pa + (int64_t)i * lp, 0, sizeof(uint16_t) * (size_t)kp);
                float *ob = out + (int64_t)q0 * ldq + (int64_t)h * d;
                nl_tile_gemm(tl, ob, ldq, pa, lp, vb, lv, nq, d, kend, 0);
                for (int i = 0; i < nq; i++) {
                    nl_vscale(ob + i * ldq, 1.0f / sum[i], d);
                    if (lse) lse[(int64_t)(q0 + i) * Hq + h] = mx[i] + logf(sum[i]);
                }
            }
        }
    }
    return 0;
}

/* dst[c][r] = x[r][c] for r < R, c < C (FP32, exact): dKᵀ, dVᵀ back into dk, dv */
static void transpose_f32(float *dst, int64_t ldd, const float *x, int64_t lds, int R, int C) {
#if defined(__x86_64__)
    if (nl_bf16_ok()) {
        nl_transpose_f32(dst, ldd, x, lds, R, C);
        return;
    }
#endif
    enum { TB = 16 };
    for (int c0 = 0; c0 < C; c0 += TB)
        for (int r = 0; r < R; r++)
            for (int c = c0; c < C && c < c0 + TB; c++) dst[(int64_t)c * ldd + r] = x[(int64_t)r * lds + c];
}

static int bwd_tiles(const nl_amx_tiles *tl, const nl_attn_bwd *a) {
    float *const dq = a->dq, *const dk = a->dk, *const dv = a->dv;
    const float *const dout = a->dout, *const out = a->out, *const lse = a->lse, *const q = a->q, *const k = a->k,
                       *const v = a->v;
    const int T = a->T, Hq = a->Hq, Hkv = a->Hkv, d = a->d, window = a->window, g0 = a->g0, g1 = a->g1;
    const float scale = a->scale;
    const int group = Hq / Hkv, dp = nl_tile_up(d), Tp = nl_tile_up(T);
    /* row strides: Kᵀ, Vᵀ pairs, s, dp, dKᵀ, dVᵀ, dS and P pairs (lt); K pairs (lr); Qᵀ, dOᵀ
     * (lq values); dS rows (la values) */
    const int lt = Tp + LD_PAD, lr = dp + LD_PAD, lq = BKV + 2 * LD_PAD, la = Tp + 2 * LD_PAD;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    /* words: Kᵀ, Vᵀ pairs; K pairs of keys; dS, P pairs of BKV queries; then BF16 values (2 a
     * word): Q, dO rows [BQT][dp]; Qᵀ, dOᵀ [dp][BKV]; dS rows [BQT][Tp]; then FP32 s, dp
     * [BQT][Tp], dKᵀ, dVᵀ [d][Tp] */
    const size_t n_kb = (size_t)dp / 2 * lt, n_kr = (size_t)Tp / 2 * lr, n_pw = (size_t)BKV / 2 * lt;
    const size_t n_qa = (size_t)BQT * dp / 2, n_qt = (size_t)dp * lq / 2, n_sa = (size_t)BQT * la / 2,
                 n_s = (size_t)BQT * lt, n_dt = (size_t)d * lt;
    const size_t n_words = 2 * n_kb + n_kr + 2 * n_pw + 2 * n_qa + 2 * n_qt + n_sa;
    uint32_t *buf = nl_thread_scratch(sizeof(uint32_t) * n_words + sizeof(float) * (2 * n_s + 2 * n_dt));
    if (!buf) return -1;
    uint32_t *kb = buf, *vb = kb + n_kb, *kr = vb + n_kb, *dsw = kr + n_kr, *pw = dsw + n_pw;
    uint16_t *qa = (uint16_t *)(pw + n_pw), *oa = qa + 2 * n_qa, *qt = oa + 2 * n_qa, *ot = qt + 2 * n_qt,
             *dsa = ot + 2 * n_qt;
    float *s = (float *)(buf + n_words), *dpb = s + n_s, *dkt = dpb + n_s, *dvt = dkt + n_dt;
    const nl_vec_kernels *vk = nl_cpu_kernels()->vec;
    for (int g = g0; g < g1; g++) {
        const int64_t kvoff = (int64_t)g * d;
        nl_tile_pack_b(kb, lt, k + kvoff, ldk, 1, d, T);
        nl_tile_pack_b(vb, lt, v + kvoff, ldk, 1, d, T);
        nl_tile_pack_b(kr, lr, k + kvoff, ldk, 0, T, d);
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh;
            const int64_t hoff = (int64_t)h * d;
            for (int q0 = 0; q0 < T; q0 += BQT) {
                const int nq = T - q0 < BQT ? T - q0 : BQT;
                const int kend = q0 + nq;
                const float *qblk = q + (int64_t)q0 * ldq + hoff, *dob = dout + (int64_t)q0 * ldq + hoff;
                const int sb0 = q0 - q0 % BKV, band = (q0 - sb0) / BQT, sb1 = T - sb0 < BKV ? T : sb0 + BKV;
                const int np = nl_tile_up(sb1); /* the stripe's keys: a block's unseen ones are zeros */
                /* the block's Q, dO as A rows (q·k, do·v) and as the stripe's Qᵀ, dOᵀ columns
                 * (dKᵀ, dVᵀ), each pair of packs from the same rows while in L1 */
                nl_tile_pack_a(qa, dp, qblk, ldq, 0, nq, d);
                nl_tile_pack_a(qt + BQT * band, lq, qblk, ldq, 1, d, nq);
                nl_tile_pack_a(oa, dp, dob, ldq, 0, nq, d);
                nl_tile_pack_a(ot + BQT * band, lq, dob, ldq, 1, d, nq);
                float D[BQT];
                nl_dot_rows(D, dob, (int)ldq, out + (int64_t)q0 * ldq + hoff, (int)ldq, nq, d);
                nl_tile_gemm(tl, s, lt, qa, dp, kb, lt, nq, kend, d, 0);   /* q·k */
                nl_tile_gemm(tl, dpb, lt, oa, dp, vb, lt, nq, kend, d, 0); /* do·v */
                mask_window(s, lt, nq, q0, window);
                /* p, ds of each pair of queries straight into their BF16 operands: dS rows (dq),
                 * dS and P pairs (the pair's row of the dKᵀ, dVᵀ B operands); an odd last query
                 * pairs with zeros, the block's rows past it are zeros too */
                for (int i = 0; i < nq; i += 2) {
                    const int t = q0 + i, two = i + 1 < nq;
                    const float *sr[2] = {s + (int64_t)i * lt, s + (int64_t)(i + two) * lt},
                                *dr[2] = {dpb + (int64_t)i * lt, dpb + (int64_t)(i + two) * lt};
                    uint16_t *da[2] = {dsa + (int64_t)i * la, dsa + (int64_t)(i + 1) * la};
                    const int nv[2] = {t + 1, two ? t + 2 : 0};
                    const float L[2] = {lse[(int64_t)t * Hq + h], two ? lse[(int64_t)(t + 1) * Hq + h] : 0.0f},
                                Dr[2] = {D[i], two ? D[i + 1] : 0.0f};
                    const int64_t w = (int64_t)(BQT * band + i) / 2 * lt;
                    vk->att_bwd_bf16(da, dsw + w, pw + w, sr, dr, nv, np, scale, L, Dr);
                }
                for (int i = (nq + 1) / 2 * 2; i < BQT; i++) {
                    memset(dsa + (int64_t)i * la, 0, sizeof(uint16_t) * (size_t)np);
                    if (i % 2 == 0) {
                        const int64_t w = (int64_t)(BQT * band + i) / 2 * lt;
                        memset(dsw + w, 0, sizeof(uint32_t) * (size_t)np);
                        memset(pw + w, 0, sizeof(uint32_t) * (size_t)np);
                    }
                }
                nl_tile_gemm(tl, dq + (int64_t)q0 * ldq + hoff, ldq, dsa, la, kr, lr, nq, d, kend, 0); /* dq = c·ds·K */
                if (kend < sb1) continue;
                /* dKᵀ += c·Qᵀ·ds, dVᵀ += dOᵀ·p over the stripe's queries; the keys the stripe
                 * sees first start from zero in the first query head (the same bits as adding
                 * to zeros) */
                const int nsb = sb1 - sb0, fresh = hh == 0 ? sb0 : sb1;
                nl_tile_gemm(tl, dkt, lt, qt, lq, dsw, lt, d, fresh, nsb, 1);
                nl_tile_gemm(tl, dvt, lt, ot, lq, pw, lt, d, fresh, nsb, 1);
                if (fresh < sb1) {
                    nl_tile_gemm(tl, dkt + sb0, lt, qt, lq, dsw + sb0, lt, d, sb1 - sb0, nsb, 0);
                    nl_tile_gemm(tl, dvt + sb0, lt, ot, lq, pw + sb0, lt, d, sb1 - sb0, nsb, 0);
                }
            }
        }
        transpose_f32(dk + kvoff, ldk, dkt, lt, d, T);
        transpose_f32(dv + kvoff, ldk, dvt, lt, d, T);
    }
    return 0;
}

int nl_attention_forward_range_tiles(const nl_amx_tiles *tl, const nl_attn_fwd *a) {
    if (a->T > SMALL_T) return fwd_tiles(tl, a) ? fwd_oom(a->S, a->d) : 0;
    return nl_attention_forward_range(a);
}

int nl_attention_backward_range_tiles(const nl_amx_tiles *tl, const nl_attn_bwd *a) {
    if (a->T > SMALL_T) return bwd_tiles(tl, a) ? bwd_oom(a->T, a->d) : 0;
    return nl_attention_backward_range(a);
}

/* ---- the per-thread scratch, bounded (nl_attention_thread_bytes) ----
 * Each path's nl_thread_scratch request above, as sized there (S = T: the training graph). */
static uint64_t ldb64(int64_t n) { return (uint64_t)((n + 15) & ~(int64_t)15) + 16; }

uint64_t nl_attention_thread_bytes(int T, int d) {
    if (T < 1 || d < 1) return 0;
    const uint64_t t = (uint64_t)T, D = (uint64_t)d, bq = (uint64_t)(T < BQ ? T : BQ), dw = (D + 1) / 2,
                   th = (t + 1) / 2;
    /* FP32: forward (Kᵀ panel, scores), backward (Kᵀ, Vᵀ, scores, dP) */
    uint64_t b = 4 * (D * t + bq * t + 1);
    uint64_t x = 4 * (2 * D * t + 2 * bq * t + 1);
    if (x > b) b = x;
    /* BF16 */
    x = 4 * (dw * ldb64(T) + th * ldb64(d) + bq * dw + bq * th) + 4 * bq * t;
    if (x > b) b = x;
    const uint64_t n_words = 2 * dw * ldb64(T) + th * ldb64(d) + 2 * D * ((th + 15) & ~(uint64_t)15) + 2 * bq * dw +
                             bq * th + 2 * ((bq + 1) / 2) * ldb64(T);
    x = 4 * n_words + 4 * (2 * bq * t + 2 * D * ldb64(T));
    if (x > b) b = x;
    /* tiles */
    const uint64_t dp = (uint64_t)nl_tile_up(d), tp = (uint64_t)nl_tile_up(T), lt = tp + LD_PAD, lr = dp + LD_PAD,
                   la = tp + 2 * LD_PAD;
    x = 4 * (dp / 2 * lt + tp / 2 * lr + BQT * dp / 2 + BQT * la / 2) + 4 * BQT * lt;
    if (x > b) b = x;
    const uint64_t lq = BKV + 2 * LD_PAD;
    x = 4 * (2 * (dp / 2 * lt) + tp / 2 * lr + 2 * (BKV / 2 * lt) + 2 * (BQT * dp / 2) + 2 * (dp * lq / 2) +
             BQT * la / 2) +
        4 * (2 * BQT * lt + 2 * D * lt);
    if (x > b) b = x;
    return (b + 63) / 64 * 64;
}

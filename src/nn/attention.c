/* nn/attention: causal GQA attention, flash-style.
 *
 * Shapes: q[T][Hq][d]; k, v[S][Hkv][d] (S >= T, the first S-T keys are the past);
 * out[T][Hq][d]; lse[T][Hq]. Query t attends keys 0 .. S-T+t. Query head h reads kv head
 * h / (Hq/Hkv). Scores are c·q·k with c = scale.
 *
 * Forward, per (query head, block of BQ queries): walk key blocks of BK keys with the online
 * softmax (running max m, running sum l, unnormalised output acc), so only a BQ×BK score
 * block ever exists; lse = m + log l is saved for backward.
 * Backward (S == T), per (query head, key block): recompute p = exp(c·q·k − lse) block by
 * block for every query block that sees the key block, and with D_t = do_t·o_t
 *   ds = p ⊙ (do·vᵀ − D),  dq += c·ds·K,  dk += c·dsᵀ·Q,  dv += pᵀ·dO
 * dk/dv of a key block accumulate in a BK×d scratch and are added into dk/dv once, so GQA
 * sums over the query heads that share a kv head. Facts: ../shared/ref/backward.md.
 *
 * Memory: O((BQ + BK)·d) scratch per call, one allocation. The products are small GEMMs on
 * strided rows (nl_gemm_acc, gemm.c). */
#include "nn/nn.h"
#include "nn/vecmath.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>

#define BQ 32 /* queries per block */
#define BK 64 /* keys per block */

/* dst[i][j] = src row j (stride lds), element i: the transpose of an nk×d row block into a
 * d×BK panel, so scores are a plain GEMM with unit-stride inner loops. */
static void pack_t(float *dst, const float *src, int64_t lds, int nk, int d) {
    for (int j = 0; j < nk; j++) {
        const float *s = src + (int64_t)j * lds;
        for (int i = 0; i < d; i++) dst[(int64_t)i * BK + j] = s[i];
    }
}

static void fill_nan(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
}

void nl_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          int T, int S, int Hq, int Hkv, int d, float scale) {
    const int group = Hq / Hkv;
    const int past = S - T;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    /* scratch: kT[d][BK], s[BQ][BK], acc[BQ][d], m[BQ], l[BQ] */
    float *buf = malloc(sizeof(float) * ((size_t)d * BK + BQ * BK + (size_t)BQ * d + 2 * BQ));
    if (!buf) {
        nl_err("attention forward: out of memory for scratch (d = %d)", d);
        fill_nan(out, (int64_t)T * Hq * d);
        if (lse) fill_nan(lse, (int64_t)T * Hq);
        return;
    }
    float *kT = buf, *s = kT + (size_t)d * BK, *acc = s + BQ * BK, *mx = acc + (size_t)BQ * d, *l = mx + BQ;

    for (int h = 0; h < Hq; h++) {
        const int kvh = h / group;
        const float *kh = k + (int64_t)kvh * d, *vh = v + (int64_t)kvh * d;
        for (int q0 = 0; q0 < T; q0 += BQ) {
            const int nq = T - q0 < BQ ? T - q0 : BQ;
            const float *qb = q + (int64_t)q0 * ldq + (int64_t)h * d;
            for (int i = 0; i < nq * d; i++) acc[i] = 0.0f;
            for (int i = 0; i < nq; i++) {
                mx[i] = -INFINITY;
                l[i] = 0.0f;
            }
            const int kend = past + q0 + nq; /* keys [0, kend) are seen by some query here */
            for (int k0 = 0; k0 < kend; k0 += BK) {
                const int nk = kend - k0 < BK ? kend - k0 : BK;
                pack_t(kT, kh + (int64_t)k0 * ldk, ldk, nk, d);
                for (int i = 0; i < nq * BK; i++) s[i] = 0.0f;
                nl_gemm_acc(s, BK, qb, (int)ldq, kT, BK, nq, nk, d);
                for (int i = 0; i < nq; i++) {
                    float *sr = s + i * BK;
                    int nv = past + q0 + i + 1 - k0; /* causal: keys k0 .. k0+nv-1 visible */
                    if (nv > nk) nv = nk;
                    if (nv <= 0) {
                        for (int j = 0; j < nk; j++) sr[j] = 0.0f;
                        continue;
                    }
                    float bm = -INFINITY;
                    for (int j = 0; j < nv; j++) {
                        sr[j] *= scale;
                        bm = sr[j] > bm ? sr[j] : bm;
                    }
                    const float mnew = bm > mx[i] ? bm : mx[i];
                    if (mnew > mx[i] && l[i] > 0.0f) {
                        /* rescale what was accumulated under the old max */
                        const float corr = nl_fexp(mx[i] - mnew);
                        l[i] *= corr;
                        nl_vscale(acc + (int64_t)i * d, corr, d);
                    }
                    mx[i] = mnew;
                    for (int j = 0; j < nv; j++) sr[j] -= mnew;
                    nl_vexp(sr, sr, nv);
                    float sum = 0.0f;
                    for (int j = 0; j < nv; j++) sum += sr[j];
                    l[i] += sum;
                    for (int j = nv; j < nk; j++) sr[j] = 0.0f;
                }
                nl_gemm_acc(acc, d, s, BK, vh + (int64_t)k0 * ldk, (int)ldk, nq, d, nk);
            }
            for (int i = 0; i < nq; i++) {
                float *o = out + (int64_t)(q0 + i) * ldq + (int64_t)h * d;
                const float inv = 1.0f / l[i];
                const float *a = acc + (int64_t)i * d;
                for (int j = 0; j < d; j++) o[j] = a[j] * inv;
                if (lse) lse[(int64_t)(q0 + i) * Hq + h] = mx[i] + logf(l[i]);
            }
        }
    }
    free(buf);
}

void nl_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           int T, int Hq, int Hkv, int d, float scale) {
    const int group = Hq / Hkv;
    const int64_t ldq = (int64_t)Hq * d, ldk = (int64_t)Hkv * d;
    for (int64_t i = 0; i < (int64_t)T * ldq; i++) dq[i] = 0.0f;
    for (int64_t i = 0; i < (int64_t)T * ldk; i++) dk[i] = dv[i] = 0.0f;
    /* scratch: kT, vT [d][BK]; dka, dva [BK][d]; s, dp [BQ][BK]; pT, dsT [BK][BQ]; D[BQ] */
    const size_t nd = (size_t)d * BK;
    float *buf = malloc(sizeof(float) * (4 * nd + 4 * BQ * BK + BQ));
    if (!buf) {
        nl_err("attention backward: out of memory for scratch (d = %d)", d);
        fill_nan(dq, (int64_t)T * ldq);
        fill_nan(dk, (int64_t)T * ldk);
        fill_nan(dv, (int64_t)T * ldk);
        return;
    }
    float *kT = buf, *vT = kT + nd, *dka = vT + nd, *dva = dka + nd;
    float *s = dva + nd, *dp = s + BQ * BK, *pT = dp + BQ * BK, *dsT = pT + BQ * BK, *D = dsT + BQ * BK;

    for (int h = 0; h < Hq; h++) {
        const int kvh = h / group;
        const int64_t hoff = (int64_t)h * d, kvoff = (int64_t)kvh * d;
        for (int k0 = 0; k0 < T; k0 += BK) {
            const int nk = T - k0 < BK ? T - k0 : BK;
            const float *kb = k + (int64_t)k0 * ldk + kvoff, *vb = v + (int64_t)k0 * ldk + kvoff;
            pack_t(kT, kb, ldk, nk, d);
            pack_t(vT, vb, ldk, nk, d);
            for (size_t i = 0; i < (size_t)nk * d; i++) dka[i] = dva[i] = 0.0f;
            for (int q0 = (k0 / BQ) * BQ; q0 < T; q0 += BQ) {
                const int nq = T - q0 < BQ ? T - q0 : BQ;
                const float *qb = q + (int64_t)q0 * ldq + hoff;
                const float *dob = dout + (int64_t)q0 * ldq + hoff;
                for (int i = 0; i < nq; i++) D[i] = nl_vdot(dob + (int64_t)i * ldq, out + (int64_t)(q0 + i) * ldq + hoff, d);
                for (int i = 0; i < nq * BK; i++) s[i] = dp[i] = 0.0f;
                nl_gemm_acc(s, BK, qb, (int)ldq, kT, BK, nq, nk, d);   /* q·k */
                nl_gemm_acc(dp, BK, dob, (int)ldq, vT, BK, nq, nk, d); /* do·v */
                for (int i = 0; i < nq; i++) {
                    const int t = q0 + i;
                    float *sr = s + i * BK, *dpr = dp + i * BK;
                    int nv = t + 1 - k0; /* keys k0 .. t visible */
                    if (nv > nk) nv = nk;
                    if (nv < 0) nv = 0;
                    const float L = lse[(int64_t)t * Hq + h];
                    for (int j = 0; j < nv; j++) sr[j] = sr[j] * scale - L;
                    nl_vexp(sr, sr, nv);
                    for (int j = 0; j < nv; j++) {
                        const float p = sr[j];
                        const float ds = p * (dpr[j] - D[i]) * scale;
                        pT[j * BQ + i] = p;
                        dsT[j * BQ + i] = ds;
                        sr[j] = ds; /* s now holds c·ds for dq */
                    }
                    for (int j = nv; j < nk; j++) {
                        pT[j * BQ + i] = 0.0f;
                        dsT[j * BQ + i] = 0.0f;
                        sr[j] = 0.0f;
                    }
                }
                nl_gemm_acc(dva, d, pT, BQ, dob, (int)ldq, nk, d, nq);                 /* dv += pᵀ·dO */
                nl_gemm_acc(dka, d, dsT, BQ, qb, (int)ldq, nk, d, nq);                 /* dk += c·dsᵀ·Q */
                nl_gemm_acc(dq + (int64_t)q0 * ldq + hoff, (int)ldq, s, BK, kb, (int)ldk, nq, d, nk); /* dq += c·ds·K */
            }
            for (int j = 0; j < nk; j++) {
                float *dkr = dk + (int64_t)(k0 + j) * ldk + kvoff, *dvr = dv + (int64_t)(k0 + j) * ldk + kvoff;
                const float *a = dka + (int64_t)j * d, *b = dva + (int64_t)j * d;
                for (int i = 0; i < d; i++) {
                    dkr[i] += a[i];
                    dvr[i] += b[i];
                }
            }
        }
    }
    free(buf);
}

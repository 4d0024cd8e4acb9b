/* proj/host_int8: the host backend's int8 FWD (`--compute int8`, docs/design.md §2): the
 * activations quantized as llama.cpp's CPU backend quantizes them for the weight type (its
 * vec_dot_type), the weights' integers packed per panel in the VNNI layout, the integer products
 * and the float scales in a cpu/i8 row (contract: kernels.h, "the int8 FWD rows").
 *
 * Activation quantization, per row of X (written anew from llama.cpp's definitions; the scalar
 * form is cpu/i8.c's nl_i8_quant_row_scalar, a row's quant_row gives the same bytes):
 *   Q8_0 (for Q8_0, Q4_0, Q5_0), 32-blocks: amax = max|x|, d = amax/127, stored as FP16;
 *     id = amax ? 127/amax : 0; q = round-half-even(x·id) (the x86 path's _mm256_round_ps).
 *   Q8_1 (for Q4_1): as Q8_0 and s = FP16(d · Σq) (d the FP32 value).
 *   Q8_K (for Q4_K, Q6_K), 256-blocks: max = the x of largest |x| (the first), iscale =
 *     -127/max, q = min(127, nearest_int(iscale·x)), d = 1/iscale (FP32); all-zero: d = 0.
 * Weight integer forms (value = SW·q + MW per group of gs):
 *   Q8_0: q, SW = d. Q4_0: q = nibble - 8. Q5_0: q = (nibble | bit << 4) - 16. Q4_1: q = nibble,
 *   SW = d, MW = m (with SX = s of Q8_1). Q4_K (gs 32): q = nibble, SW = d·sc, MW = -dmin·m (with
 *   SX = d_x·Σq of the group). Q6_K (gs 16): q = q6 - 32, SW = d·sc.
 * Threads: the activation rows split (each row's bytes do not depend on the split), then the
 * output panels; every output is the contract's one chain whatever the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "proj/host_int8.h"
#include "util/util.h"

int nl_host_int8_type(int type) {
    switch (type) {
    case NL_TYPE_Q8_0:
    case NL_TYPE_Q4_0:
    case NL_TYPE_Q5_0:
    case NL_TYPE_Q4_1:
    case NL_TYPE_Q4_K:
    case NL_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

static int act_of(int type) {
    return type == NL_TYPE_Q4_1 ? NL_I8_Q8_1 : (type == NL_TYPE_Q4_K || type == NL_TYPE_Q6_K) ? NL_I8_Q8_K : NL_I8_Q8_0;
}
static int gs_of(int type) { return type == NL_TYPE_Q6_K ? 16 : 32; }
static int has_min(int type) { return type == NL_TYPE_Q4_1 || type == NL_TYPE_Q4_K; }

/* nl_f16_to_f32 inlined for normal values (the same bits; zero, subnormal, inf, NaN take it) */
static inline float h2f(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1f;
    if (e == 0 || e == 0x1f) return nl_f16_to_f32(h);
    const uint32_t b = ((uint32_t)(h & 0x8000) << 16) | ((e + 112) << 23) | ((uint32_t)(h & 0x3ff) << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Q4_K's 6-bit scale and min of sub-block j (0..7) */
static void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Elements [k0, k0+kc) of one weight row (k0, kc multiples of 256 for the K-quants, of 32
 * otherwise) as int8 q[kc] and the group terms sw[g·st], mw[g·st] (g < kc/gs). */
static void decode_row(int type, const uint8_t *row, int64_t k0, int kc, int8_t *q, float *sw, float *mw, int st) {
    switch (type) {
    case NL_TYPE_Q8_0:
    case NL_TYPE_Q4_0:
    case NL_TYPE_Q5_0:
    case NL_TYPE_Q4_1: {
        const size_t bb = nl_row_bytes(type, 32);
        for (int b = 0; b < kc / 32; b++) {
            const uint8_t *p = row + (size_t)(k0 / 32 + b) * bb;
            int8_t *o = q + 32 * b;
            uint16_t dh;
            memcpy(&dh, p, 2);
            sw[b * st] = h2f(dh);
            if (type == NL_TYPE_Q8_0) {
                memcpy(o, p + 2, 32);
            } else if (type == NL_TYPE_Q4_0) {
                for (int j = 0; j < 16; j++)
                    o[j] = (int8_t)((p[2 + j] & 0xf) - 8), o[j + 16] = (int8_t)((p[2 + j] >> 4) - 8);
            } else if (type == NL_TYPE_Q5_0) {
                uint32_t qh;
                memcpy(&qh, p + 2, 4);
                for (int j = 0; j < 16; j++) {
                    o[j] = (int8_t)(((p[6 + j] & 0xf) | (((qh >> j) << 4) & 0x10)) - 16);
                    o[j + 16] = (int8_t)(((p[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16);
                }
            } else {
                uint16_t mh;
                memcpy(&mh, p + 2, 2);
                mw[b * st] = h2f(mh);
                for (int j = 0; j < 16; j++) o[j] = (int8_t)(p[4 + j] & 0xf), o[j + 16] = (int8_t)(p[4 + j] >> 4);
            }
        }
        return;
    }
    case NL_TYPE_Q4_K:
        for (int b = 0; b < kc / 256; b++) {
            const uint8_t *p = row + (size_t)(k0 / 256 + b) * 144;
            uint16_t dh, mh;
            memcpy(&dh, p, 2);
            memcpy(&mh, p + 2, 2);
            const float d = h2f(dh), dmin = h2f(mh);
            const uint8_t *sc = p + 4, *qs = p + 16;
            for (int j = 0; j < 8; j++) {
                int s, m;
                q4k_scale_min(sc, j, &s, &m);
                sw[(8 * b + j) * st] = d * (float)s;
                mw[(8 * b + j) * st] = -dmin * (float)m;
                const uint8_t *qq = qs + 32 * (j / 2);
                int8_t *o = q + 256 * b + 32 * j;
                for (int l = 0; l < 32; l++) o[l] = (int8_t)(j & 1 ? qq[l] >> 4 : qq[l] & 0xf);
            }
        }
        return;
    case NL_TYPE_Q6_K:
        for (int b = 0; b < kc / 256; b++) {
            const uint8_t *p = row + (size_t)(k0 / 256 + b) * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            uint16_t dh;
            memcpy(&dh, p + 208, 2);
            const float d = h2f(dh);
            for (int g = 0; g < 16; g++) sw[(16 * b + g) * st] = d * (float)sc[g];
            int8_t *o = q + 256 * b;
            for (int h = 0; h < 2; h++, ql += 64, qh += 32, o += 128)
                for (int l = 0; l < 32; l++) {
                    o[l] = (int8_t)(((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32);
                    o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
        }
        return;
    default: return;
    }
}

struct nl_host_int8 {
    int nth;
    struct scr {
        int8_t *tile; /* NP × KC */
        uint32_t *B;  /* KC/4 × NP */
        int32_t *BC;  /* KC/16 × NP */
        float *SW, *MW;
        void *mem;
    } * s;
    uint8_t *xq;
    float *dx, *sx;
    size_t cap_q, cap_d;
    /* the job */
    const nl_i8_kernels *ik;
    const nl_proj_weight *w;
    const float *x;
    int T;
    float *y;
};

nl_host_int8 *nl_host_int8_new(int nth) {
    nl_host_int8 *c = nl_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nth = nth;
    c->s = nl_calloc((size_t)nth, sizeof *c->s);
    if (!c->s) goto fail;
    const size_t nt = (size_t)NL_HOST_NP * NL_HOST_KC, ng = (size_t)NL_HOST_KC / 16 * NL_HOST_NP;
    const size_t total = nt + nt + 3 * ng * 4;
    for (int i = 0; i < nth; i++) {
        uint8_t *m = aligned_alloc(64, (total + 63) / 64 * 64);
        if (!m) {
            nl_err("host: out of memory (%zu bytes of int8 scratch)", total);
            goto fail;
        }
        c->s[i].mem = m;
        c->s[i].tile = (int8_t *)m;
        c->s[i].B = (uint32_t *)(m + nt);
        c->s[i].BC = (int32_t *)(m + 2 * nt);
        c->s[i].SW = (float *)(m + 2 * nt + ng * 4);
        c->s[i].MW = (float *)(m + 2 * nt + 2 * ng * 4);
    }
    return c;
fail:
    nl_host_int8_free(c);
    return NULL;
}

void nl_host_int8_free(nl_host_int8 *c) {
    if (!c) return;
    if (c->s)
        for (int i = 0; i < c->nth; i++) free(c->s[i].mem);
    free(c->s);
    free(c->xq);
    free(c->dx);
    free(c->sx);
    free(c);
}

static void task_quant(void *arg, int tid, int n) {
    nl_host_int8 *c = arg;
    const int64_t K = c->w->n_in, ng = K / gs_of(c->w->type);
    const int t0 = (int)((int64_t)c->T * tid / n), t1 = (int)((int64_t)c->T * (tid + 1) / n);
    const int type = c->w->type;
    void (*const q)(int, int, const float *, int64_t, uint8_t *, float *, float *) =
        c->ik->quant_row ? c->ik->quant_row : nl_i8_quant_row_scalar;
    for (int t = t0; t < t1; t++)
        q(act_of(type), gs_of(type), c->x + (size_t)t * (size_t)K, K, c->xq + (size_t)t * (size_t)K,
          c->dx + (size_t)t * (size_t)ng, has_min(type) ? c->sx + (size_t)t * (size_t)ng : NULL);
}

static void task_fwd(void *arg, int tid, int n) {
    nl_host_int8 *c = arg;
    const nl_proj_weight *w = c->w;
    struct scr *s = &c->s[tid];
    const int64_t K = w->n_in, N = w->n_out;
    const int gs = gs_of(w->type), mn = has_min(w->type);
    const int64_t ldd = K / gs;
    const size_t rb = nl_row_bytes(w->type, K);
    const int64_t np = (N + NL_HOST_NP - 1) / NL_HOST_NP;
    const int64_t p0 = np * tid / n, p1 = np * (tid + 1) / n;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t n0 = p * NL_HOST_NP;
        const int ncols = (int)(N - n0 < NL_HOST_NP ? N - n0 : NL_HOST_NP);
        for (int64_t k0 = 0; k0 < K; k0 += NL_HOST_KC) {
            const int kc = (int)(K - k0 < NL_HOST_KC ? K - k0 : NL_HOST_KC), ng = kc / gs;
            if (w->type == NL_TYPE_Q8_0 && c->ik->pack_q8_0) {
                c->ik->pack_q8_0((const uint8_t *)w->data + (size_t)n0 * rb, rb, k0 / 32, kc, ncols, s->B, s->BC,
                                 s->SW);
                c->ik->gemm_i8_fwd(c->T, kc, gs, c->xq + k0, K, c->dx + k0 / gs, NULL, ldd, s->B, s->BC, s->SW, NULL,
                                   c->y + n0, N, ncols, k0 > 0);
                continue;
            }
            for (int j = 0; j < NL_HOST_NP; j++) {
                int8_t *tr = s->tile + (size_t)j * NL_HOST_KC;
                if (j < ncols) {
                    decode_row(w->type, (const uint8_t *)w->data + (size_t)(n0 + j) * rb, k0, kc, tr, s->SW + j,
                               s->MW + j, NL_HOST_NP);
                } else {
                    memset(tr, 0, (size_t)kc);
                    for (int g = 0; g < ng; g++) {
                        s->SW[g * NL_HOST_NP + j] = 0.0f;
                        s->MW[g * NL_HOST_NP + j] = 0.0f;
                    }
                }
            }
            /* B[r][j] = the 4 bytes tile[j][4r..4r+3], BC = -128·Σq per group */
            (c->ik->pack_b ? c->ik->pack_b : nl_i8_pack_b_scalar)(s->tile, NL_HOST_KC, kc, gs, s->B, s->BC);
            c->ik->gemm_i8_fwd(c->T, kc, gs, c->xq + k0, K, c->dx + k0 / gs, mn ? c->sx + k0 / gs : NULL, ldd, s->B,
                               s->BC, s->SW, mn ? s->MW : NULL, c->y + n0, N, ncols, k0 > 0);
        }
    }
}

int nl_host_int8_run(nl_host_int8 *c, const nl_i8_kernels *ik, nl_pool *pool, const nl_proj_weight *w, const float *x,
                     int T, float *y) {
    const int64_t K = w->n_in;
    const size_t nq = (size_t)T * (size_t)K, nd = (size_t)T * (size_t)(K / gs_of(w->type));
    if (nq > c->cap_q) {
        free(c->xq);
        c->cap_q = 0;
        if (!(c->xq = aligned_alloc(64, (nq + 63) / 64 * 64))) return nl_err("host: out of memory (%zu bytes)", nq);
        c->cap_q = nq;
    }
    if (nd > c->cap_d) {
        free(c->dx);
        free(c->sx);
        c->cap_d = 0;
        c->dx = nl_malloc(nd * 4);
        c->sx = nl_malloc(nd * 4);
        if (!c->dx || !c->sx) return -1;
        c->cap_d = nd;
    }
    c->ik = ik;
    c->w = w;
    c->x = x;
    c->T = T;
    c->y = y;
    nl_pool_run(pool, c->nth, task_quant, c);
    nl_pool_run(pool, c->nth, task_fwd, c);
    return 0;
}

uint64_t nl_host_int8_scratch(const nl_proj_weight *w, int T) {
    const uint64_t K = (uint64_t)w->n_in;
    return ((uint64_t)T * K + 63) / 64 * 64 + 2 * 4 * (uint64_t)T * (K / (uint64_t)gs_of(w->type));
}

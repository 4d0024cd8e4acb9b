/* cpu/kernels_scalar: the portable kernel set (any CPU) and the block decoders every set
 * shares. Block layouts: docs/formats.md §1. F16, Q8_0 and Q4_0 have their own
 * decoders here (the values equal model/quant's to_float bit for bit: exact widening and
 * (float)q*d), Q5_0 and Q4_1 the set's dq_q5_0 / dq_q4_1 where it has them (the same values); every other block
 * type goes through model/quant's to_float. */
#include <string.h>

#include "cpu/kernels.h"

/* IEEE half → float, exact (normals, subnormals, inf, NaN). */
float nl_host_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t nl_host_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

int nl_host_type_ok(int type) {
    if (type == NL_TYPE_F32 || type == NL_TYPE_F16 || type == NL_TYPE_BF16 || type == NL_TYPE_Q8_0 ||
        type == NL_TYPE_Q4_0)
        return 1;
    /* any other block type model/quant decodes (Q4_K, Q6_K): its to_float, block by block */
    const nl_type_traits *tr = nl_type_get(type);
    return tr && tr->to_float && tr->blck > 1 && tr->blck <= 256;
}

int nl_host_type_bf16(int type) {
    /* every block type: decoded to FP32, then rounded to BF16 */
    const nl_type_traits *tr = nl_type_get(type);
    return tr && nl_host_type_ok(type) && tr->blck > 1;
}

void nl_host_decode_int_block(int type, const void *block, int8_t *q, float *d) {
    if (type == NL_TYPE_Q8_0) {
        const nl_block_q8_0 *b = block;
        *d = nl_host_f16_to_f32(b->d);
        memcpy(q, b->qs, 32);
    } else { /* Q4_0: low nibble = element j, high nibble = element j+16, offset 8 */
        const nl_block_q4_0 *b = block;
        *d = nl_host_f16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((b->qs[j] & 0xf) - 8);
            q[j + 16] = (int8_t)((b->qs[j] >> 4) - 8);
        }
    }
}

/* One block (blck elements) of a block type into out. */
static void decode_block(const nl_host_kernels *ks, int type, const uint8_t *blk, float *out) {
    if (type == NL_TYPE_Q8_0) {
        ks->dq_q8_0((const nl_block_q8_0 *)blk, out, 1);
    } else if (type == NL_TYPE_Q4_0) {
        int8_t q[32];
        float d;
        nl_host_decode_int_block(type, blk, q, &d);
        for (int i = 0; i < 32; i++) out[i] = (float)q[i] * d;
    } else if (type == NL_TYPE_Q5_0 && ks->dq_q5_0) {
        ks->dq_q5_0(blk, out, 1);
    } else if (type == NL_TYPE_Q4_1 && ks->dq_q4_1) {
        ks->dq_q4_1(blk, out, 1);
    } else {
        nl_type_get(type)->to_float(blk, out, nl_type_get(type)->blck);
    }
}

void nl_host_dequant(const nl_host_kernels *ks, int type, const void *row, int64_t k0, int n, float *dst) {
    const uint8_t *r = row;
    switch (type) {
    case NL_TYPE_F32: memcpy(dst, r + 4 * k0, (size_t)n * 4); return;
    case NL_TYPE_F16: ks->dq_f16((const uint16_t *)row + k0, dst, n); return;
    case NL_TYPE_BF16:
        for (int i = 0; i < n; i++) {
            uint32_t u = (uint32_t)((const uint16_t *)row)[k0 + i] << 16;
            memcpy(dst + i, &u, 4);
        }
        return;
    default: break;
    }
    const nl_type_traits *tr = nl_type_get(type);
    const int blck = tr->blck;
    const size_t bytes = tr->bytes;
    if (type == NL_TYPE_Q8_0 && k0 % 32 == 0 && n % 32 == 0) {
        ks->dq_q8_0((const nl_block_q8_0 *)(r + (size_t)(k0 / 32) * bytes), dst, n / 32);
        return;
    }
    if (type == NL_TYPE_Q5_0 && ks->dq_q5_0 && k0 % 32 == 0 && n % 32 == 0) {
        ks->dq_q5_0(r + (size_t)(k0 / 32) * bytes, dst, n / 32);
        return;
    }
    if (type == NL_TYPE_Q4_1 && ks->dq_q4_1 && k0 % 32 == 0 && n % 32 == 0) {
        ks->dq_q4_1(r + (size_t)(k0 / 32) * bytes, dst, n / 32);
        return;
    }
    float tmp[256];
    int64_t k = k0, end = k0 + n;
    while (k < end) {
        int64_t b = k / blck, b0 = b * blck;
        int64_t hi = b0 + blck < end ? b0 + blck : end;
        if (k == b0 && hi == b0 + blck) {
            decode_block(ks, type, r + (size_t)b * bytes, dst + (k - k0));
        } else {
            decode_block(ks, type, r + (size_t)b * bytes, tmp);
            memcpy(dst + (k - k0), tmp + (k - b0), (size_t)(hi - k) * 4);
        }
        k = hi;
    }
}

/* ---- the scalar set ---- */

static void s_dq_f16(const uint16_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = nl_host_f16_to_f32(src[i]);
}

static void s_dq_q8_0(const nl_block_q8_0 *src, float *dst, int nblocks) {
    for (int b = 0; b < nblocks; b++) {
        const float d = nl_host_f16_to_f32(src[b].d);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)src[b].qs[i] * d;
    }
}

/* 4 rows × 64 columns of accumulators per pass; plain C, one chain per element. */
static void s_gemm_f32(int m, int kc, const float *A, int64_t lda, const float *B, float *C, int64_t ldc, int ncols,
                       int accumulate) {
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mr = m - i0 < 4 ? m - i0 : 4;
        float acc[4][NL_HOST_NP];
        memset(acc, 0, sizeof acc);
        for (int p = 0; p < kc; p++) {
            const float *b = B + (size_t)p * NL_HOST_NP;
            for (int i = 0; i < mr; i++) {
                const float a = A[(i0 + i) * lda + p];
                for (int j = 0; j < NL_HOST_NP; j++) acc[i][j] += a * b[j];
            }
        }
        for (int i = 0; i < mr; i++) {
            float *c = C + (i0 + i) * ldc;
            if (accumulate)
                for (int j = 0; j < ncols; j++) c[j] += acc[i][j];
            else
                for (int j = 0; j < ncols; j++) c[j] = acc[i][j];
        }
    }
}

const nl_host_kernels nl_host_kernels_scalar = {
    .name = "scalar",
    .has_bf16 = 0,
    .dq_f16 = s_dq_f16,
    .dq_q8_0 = s_dq_q8_0,
    .gemm_f32 = s_gemm_f32,
    .vec = &nl_vec_kernels_portable,
};

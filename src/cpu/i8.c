/* cpu/i8: the int8 FWD rows' scalar form, the model every row matches bit for bit (contract:
 * kernels.h, "the int8 FWD rows"; the rows are chosen in cpu/dispatch.c). */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "model/quant.h"

static void gemm_i8_fwd_scalar(int m, int kc, int gs, const uint8_t *A, int64_t lda, const float *DX, const float *SX,
                               int64_t ldd, const uint32_t *B, const int32_t *BC, const float *SW, const float *MW,
                               float *C, int64_t ldc, int ncols, int accumulate) {
    const int ng = kc / gs;
    for (int i = 0; i < m; i++) {
        const uint8_t *a = A + (int64_t)i * lda;
        for (int j = 0; j < ncols; j++) {
            float acc = accumulate ? C[(int64_t)i * ldc + j] : 0.0f;
            for (int g = 0; g < ng; g++) {
                int32_t isum = BC[g * NL_HOST_NP + j];
                for (int r = g * gs / 4; r < (g + 1) * gs / 4; r++) {
                    const uint32_t w = B[(int64_t)r * NL_HOST_NP + j];
                    for (int b = 0; b < 4; b++)
                        isum += (int32_t)a[4 * r + b] * (int32_t)(int8_t)(uint8_t)(w >> (8 * b));
                }
                acc = fmaf((float)isum, SW[g * NL_HOST_NP + j] * DX[(int64_t)i * ldd + g], acc);
                if (MW) acc = fmaf(MW[g * NL_HOST_NP + j], SX[(int64_t)i * ldd + g], acc);
            }
            C[(int64_t)i * ldc + j] = acc;
        }
    }
}

void nl_i8_pack_b_scalar(const int8_t *tile, int ldt, int kc, int gs, uint32_t *B, int32_t *BC) {
    for (int j = 0; j < NL_HOST_NP; j++) {
        const int8_t *t = tile + (int64_t)j * ldt;
        for (int g = 0; g < kc / gs; g++) {
            int sum = 0;
            for (int i = g * gs; i < (g + 1) * gs; i++) sum += t[i];
            BC[g * NL_HOST_NP + j] = -128 * sum;
        }
        for (int r = 0; r < kc / 4; r++) {
            uint32_t v;
            memcpy(&v, t + 4 * r, 4);
            B[(int64_t)r * NL_HOST_NP + j] = v;
        }
    }
}

/* round half to even for |v| < 2^22 (the FP32 magic-number add, ggml's nearest_int) */
static int rne(float v) {
    const float r = (v + 12582912.0f) - 12582912.0f;
    return (int)r;
}

static float f16r(float v) { return nl_f16_to_f32(nl_f32_to_f16(v)); }

void nl_i8_quant_row_scalar(int act, int gs, const float *x, int64_t K, uint8_t *xq, float *dx, float *sx) {
    if (act != NL_I8_Q8_K) {
        for (int64_t b = 0; b < K / 32; b++) {
            const float *v = x + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                const float ax = fabsf(v[i]);
                amax = ax > amax ? ax : amax; /* fmaxf's value (amax is never NaN), inlined */
            }
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                const int q = rne(v[i] * id);
                sum += q;
                xq[32 * b + i] = (uint8_t)(q + 128);
            }
            dx[b] = f16r(d);
            if (act == NL_I8_Q8_1 && sx) sx[b] = f16r(d * (float)sum);
        }
        return;
    }
    for (int64_t b = 0; b < K / 256; b++) {
        const float *v = x + 256 * b;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; i++) {
            const float ax = fabsf(v[i]);
            if (ax > amax) amax = ax, max = v[i];
        }
        const int ng = 256 / gs;
        if (amax == 0.0f) {
            memset(xq + 256 * b, 128, 256);
            for (int g = 0; g < ng; g++) {
                dx[b * ng + g] = 0.0f;
                if (sx) sx[b * ng + g] = 0.0f;
            }
            continue;
        }
        const float iscale = -127.0f / max, d = 1.0f / iscale;
        for (int g = 0; g < ng; g++) {
            int sum = 0;
            for (int i = g * gs; i < (g + 1) * gs; i++) {
                int q = rne(iscale * v[i]);
                if (q > 127) q = 127;
                sum += q;
                xq[256 * b + i] = (uint8_t)(q + 128);
            }
            dx[b * ng + g] = d;
            if (sx) sx[b * ng + g] = d * (float)sum;
        }
    }
}

const nl_i8_kernels nl_i8_kernels_scalar = {.name = "scalar",
                                            .gemm_i8_fwd = gemm_i8_fwd_scalar,
                                            .pack_b = nl_i8_pack_b_scalar,
                                            .quant_row = nl_i8_quant_row_scalar};

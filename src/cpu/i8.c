/* cpu/i8: the int8 FWD rows' scalar form, the model every row matches bit for bit (contract:
 * kernels.h, "the int8 FWD rows"; the rows are chosen in cpu/dispatch.c). */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"

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

const nl_i8_kernels nl_i8_kernels_scalar = {
    .name = "scalar", .gemm_i8_fwd = gemm_i8_fwd_scalar, .pack_b = nl_i8_pack_b_scalar};

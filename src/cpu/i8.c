/* cpu/i8: the int8 FWD rows' scalar form (the model every row matches bit for bit) and their
 * dispatcher (contract: kernels.h, "the int8 FWD rows"). */
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

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

#if defined(__x86_64__)
/* AVX512_VNNI: CPUID.(7,0):ECX bit 11, with the AVX-512 set cpu.h probes (OS state included) */
static int has_avx512vnni(void) {
    unsigned r[4];
    if (!nl_cpu_has(NL_CPU_AVX512) || !__get_cpuid_count(7, 0, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[2] >> 11) & 1;
}
#endif
#if defined(__aarch64__)
/* FEAT_I8MM (HWCAP2_I8MM), FEAT_DotProd (HWCAP_ASIMDDP): cpu.c's getauxval probe */
static int has_i8mm(void) { return nl_cpu_has(NL_CPU_ARM_I8MM); }
static int has_dotprod(void) { return nl_cpu_has(NL_CPU_ARM_DOTPROD); }
#endif

static const struct {
    const nl_i8_kernels *ks;
    int (*runs)(void); /* NULL: every CPU */
} rows[] = {
#if defined(__x86_64__)
    {&nl_i8_kernels_avx512vnni, has_avx512vnni},
#endif
#if defined(__aarch64__)
    {&nl_i8_kernels_i8mm, has_i8mm},
    {&nl_i8_kernels_dotprod, has_dotprod},
#endif
    {&nl_i8_kernels_scalar, NULL},
};

const nl_i8_kernels *nl_cpu_i8_kernels(const char *name) {
    const int any = !name || !strcmp(name, "auto");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if ((any || !strcmp(name, rows[i].ks->name)) && (!rows[i].runs || rows[i].runs())) return rows[i].ks;
    return NULL;
}

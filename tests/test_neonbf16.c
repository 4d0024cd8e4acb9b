/* test_neonbf16: the neonbf16 row's BF16 kernels (src/cpu/kernels_neonbf16.c: BFMMLA, BFDOT) bit
 * for bit against a plain C model of the instructions' documented arithmetic, on every shape edge
 * of kernels.h's contract (m 1..13, odd kp, ncols 1..64, accumulate, padded lda), and its
 * conversions against nl_host_f32_to_bf16. The model (the Arm ARM's BFDotAdd with FPCR.EBF = 0,
 * FEAT_BF16 without FEAT_EBF16; BFMMLA is BFMatMulAdd, two BFDotAdd per element, pairs (k0,k1)
 * then (k2,k3)):
 *   prod = BFRound(BFMul(a0, b0) + ...) as: p0 = BFRound(a0·b0), p1 = BFRound(a1·b1),
 *   t = BFRound(p0 + p1), sum = BFRound(sum + t);
 * BFRound: round to odd (truncate; set the last fraction bit if anything was dropped), results
 * below 2⁻¹²⁶ flushed to a zero of their sign, overflow to infinity; BF16 and FP32 inputs below the
 * normal range read as zero; FPCR's rounding mode and FZ are ignored. (FWD and BWD run the same
 * kernel, gemm_bf16, on host.c's panels.) The model's own arithmetic is checked on known values
 * everywhere; the kernels run where the CPU has BF16 (aarch64 HWCAP2_BF16: qemu -cpu max in CI),
 * with one check that the hardware rounds to odd where round-to-nearest would differ. */
#include <stdint.h>
#include <string.h>

#include "arm_bf16.h"
#include "cpu/kernels.h"
#include "test.h"

static void test_model(void) {
    /* round to odd: 1 + 2⁻³⁰ and 1 + 0.75 ulp keep 1's bits with the last one set; exact sums stay */
    CHECK(fbits(bf_round_op(1.0f, ldexpf(1.0f, -30), 0)) == 0x3f800001u);
    CHECK(fbits(bf_round_op(1.0f, ldexpf(3.0f, -25), 0)) == 0x3f800001u);
    CHECK(fbits(bf_round_op(1.0f, ldexpf(1.0f, -23), 0)) == 0x3f800001u);
    CHECK(fbits(bf_round_op(1.5f, 0.25f, 0)) == fbits(1.75f));
    CHECK(fbits(bf_round_op(1.0f, -ldexpf(1.0f, -30), 0)) == 0x3f7fffffu); /* truncated 1 - 2⁻³⁰: odd already */
    CHECK(fbits(bf_round_op(ldexpf(1.0f, -100), ldexpf(1.0f, -30), 1)) == 0u); /* flushed */
    CHECK(fbits(bf_round_op(-ldexpf(1.0f, -100), ldexpf(1.0f, -30), 1)) == 0x80000000u);
    CHECK(isinf(bf_round_op(FLT_MAX, FLT_MAX, 0)));
    CHECK(fbits(bf_round_op(1.0f, -1.0f, 0)) == 0u);
    /* the default rounding came back */
    volatile float one = 1.0f, tiny = ldexpf(1.0f, -30);
    CHECK(one + tiny == 1.0f);
    /* 1·1 + 1·1 = 2 (the check), and the pair's products in the low and high halves */
    CHECK(bfdotadd(0.0f, 0x3f803f80u, 0x3f803f80u) == 2.0f);
    CHECK(bfdotadd(1.0f, 0x40000000u | 0x3f80u, 0x40400000u | 0x4000u) == 1.0f + 2.0f + 6.0f);
    /* a BF16 denormal input reads as zero */
    CHECK(bfdotadd(0.0f, 0x0001u, 0x7f00u) == 0.0f);
}

#if defined(__aarch64__)
#include <arm_neon.h>

static uint16_t rbf16(double scale) { return nl_host_f32_to_bf16((float)(nl_t_rand() * scale)); }

/* the hardware's rounding on one instruction each, where round to nearest gives another answer */
static void test_rounding(const nl_host_kernels *ks) {
    /* BWD, one row, one pair: A = (1, 2⁻¹⁵), B = (1, 2⁻¹⁵): 1 + 2⁻³⁰ -> 0x3f800001 */
    uint16_t A[8] = {0x3f80, 0x3800, 0, 0, 0, 0, 0, 0};
    uint32_t B[NL_HOST_NP] = {0};
    B[0] = 0x3f80u | 0x3800u << 16;
    float C[NL_HOST_NP] = {0};
    ks->gemm_bf16(1, 1, A, 8, B, C, NL_HOST_NP, 1, 0);
    CHECKF(fbits(C[0]) == 0x3f800001u, "BFDOT rounds to odd: got %08x", (unsigned)fbits(C[0]));
    /* two rows (BFMMLA) */
    uint16_t A2[16] = {0x3f80, 0x3800, 0, 0, 0, 0, 0, 0, 0x3f80, 0x3800, 0, 0, 0, 0, 0, 0};
    float C2[2 * NL_HOST_NP] = {0};
    ks->gemm_bf16(2, 1, A2, 8, B, C2, NL_HOST_NP, 1, 0);
    CHECKF(fbits(C2[0]) == 0x3f800001u && fbits(C2[NL_HOST_NP]) == 0x3f800001u, "BFMMLA rounds to odd: got %08x %08x",
           (unsigned)fbits(C2[0]), (unsigned)fbits(C2[NL_HOST_NP]));
}

/* one BWD call (m × kp pairs, ncols) against the model; C starts as a guard pattern */
static void check_bwd(const nl_host_kernels *ks, int m, int kp, int ncols, int accumulate) {
    const int lda = 2 * kp + 6; /* even, padded */
    uint16_t *A = malloc(sizeof *A * (size_t)m * lda);
    uint32_t *B = malloc(sizeof *B * (size_t)kp * NL_HOST_NP);
    const int ldc = NL_HOST_NP + 3;
    float *C = malloc(sizeof *C * (size_t)m * ldc), *C0 = malloc(sizeof *C0 * (size_t)m * ldc);
    for (int i = 0; i < m * lda; i++) A[i] = rbf16(i % 7 == 0 ? 100.0 : 1.0);
    for (int p = 0; p < kp; p++)
        for (int j = 0; j < NL_HOST_NP; j++)
            B[p * NL_HOST_NP + j] = j < ncols ? (uint32_t)rbf16(0.05) | (uint32_t)rbf16(0.05) << 16 : 0;
    for (int i = 0; i < m * ldc; i++) C[i] = C0[i] = (float)nl_t_rand();
    ks->gemm_bf16(m, kp, A, lda, B, C, ldc, ncols, accumulate);
    int bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            float want = C0[i * ldc + j];
            if (j < ncols) {
                float s = 0.0f;
                for (int p = 0; p < kp; p++) {
                    uint32_t a;
                    memcpy(&a, A + i * lda + 2 * p, 4);
                    s = bfdotadd(s, a, B[p * NL_HOST_NP + j]);
                }
                want = accumulate ? want + s : s;
            }
            if (fbits(want) != fbits(C[i * ldc + j]) && bad++ < 3)
                fprintf(stderr, "bwd m %d kp %d ncols %d acc %d: C[%d][%d] = %a, model %a\n", m, kp, ncols, accumulate,
                        i, j, (double)C[i * ldc + j], (double)want);
        }
    CHECKF(bad == 0, "bwd m %d kp %d ncols %d acc %d: %d elements differ", m, kp, ncols, accumulate, bad);
    free(A);
    free(B);
    free(C);
    free(C0);
}

static void test_conversions(const nl_host_kernels *ks) {
    enum { N = 4096 };
    float *f = malloc(sizeof *f * N), *g = malloc(sizeof *g * N);
    uint16_t *h = malloc(sizeof *h * N);
    uint32_t *pr = malloc(sizeof *pr * N);
    for (int i = 0; i < N; i++) {
        f[i] = (float)(nl_t_rand() * ldexp(1.0, (int)(nl_t_rand() * 60)));
        g[i] = bitsf((uint32_t)(nl_t_rand() * 4294967296.0)); /* any bits: NaNs, denormals, infinities */
    }
    f[0] = NAN, f[1] = -INFINITY, f[2] = ldexpf(1.0f, -140), f[3] = bitsf(0x3f808000u), f[4] = bitsf(0x3f818000u);
    f[5] = bitsf(0x7f7fffffu), f[6] = -0.0f, f[7] = bitsf(0xff800001u);
    int bad = 0;
    ks->to_bf16(f, N - 3, h); /* an odd tail */
    for (int i = 0; i < N - 3; i++) bad += h[i] != nl_host_f32_to_bf16(f[i]);
    ks->pairs_to_bf16(f, g, N, pr);
    for (int i = 0; i < N; i++)
        bad += pr[i] != ((uint32_t)nl_host_f32_to_bf16(f[i]) | (uint32_t)nl_host_f32_to_bf16(g[i]) << 16);
    ks->pairs_to_bf16(g, NULL, N, pr);
    for (int i = 0; i < N; i++) bad += pr[i] != nl_host_f32_to_bf16(g[i]);
    CHECKF(bad == 0, "conversions: %d values differ from nl_host_f32_to_bf16", bad);
    free(f);
    free(g);
    free(h);
    free(pr);
}

static void test_kernels(void) {
    const nl_host_kernels *ks = nl_cpu_kernels_find("neonbf16");
    if (!ks) {
        printf("no BF16 on this CPU (HWCAP2_BF16): the neonbf16 kernels are not run\n");
        CHECK(nl_cpu_kernels_find("neon") != NULL);
        return;
    }
    CHECK(ks == nl_cpu_kernels_find("auto")); /* the best row here */
    test_rounding(ks);
    test_conversions(ks);
    const int ms[] = {1, 2, 3, 4, 5, 7, 13};
    const int kps[] = {1, 2, 3, 7, 64, 127, 128};
    const int ncs[] = {64, 1, 5, 16, 17, 33, 63};
    const int small = nl_t_small();
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 7; b++)
            for (int c = 0; c < 7; c += small ? 2 : 1) check_bwd(ks, ms[a], kps[b], ncs[c], (a + b + c) & 1);
    check_bwd(ks, 6, 128, 64, 1);
    check_bwd(ks, 8, 128, 64, 1);
}
#else
static void test_kernels(void) { printf("not aarch64: the neonbf16 kernels are not built here\n"); }
#endif

int main(void) {
    test_model();
    test_kernels();
    return nl_t_done();
}

/* cpu/gemm (the FP32 GEMM of the attention fallback and the LoRA branch) against its contract:
 * every C element is ONE multiply-add chain over k in increasing order, from C's old value
 * (accumulate) or from 0 — fused (fmaf) where nl_gemm_wide() says the AVX2+FMA kernel runs,
 * separate multiply and add otherwise — whatever the shape, the tiling path (short reductions
 * K <= 32 take their own row-outer path), a power-of-two row stride, or a transposed A.
 * Checked bit for bit against that chain written out in scalar C, on odd shapes. */
#include "test.h"
#include "cpu/kernels.h"
#include "cpu/vecmath.h"

#include <stdint.h>

static float chain(int wide, float c0, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int ldb, int i,
                   int j, int K) {
    float s = c0;
    for (int k = 0; k < K; k++) {
        const float a = A[i * a_rs + k * a_cs], b = B[(int64_t)k * ldb + j];
        if (wide) s = fmaf(a, b, s);
        else {
            volatile float p = a * b; /* no contraction: a rounded product, then the add */
            s = s + p;
        }
    }
    return s;
}

static void one(int M, int N, int K, int ldc, int tn, int acc) {
    const int wide = nl_gemm_wide();
    const int lda = tn ? M + 3 : K + 1, ldb = N + 5;
    float *A = malloc(sizeof(float) * (size_t)(tn ? K * lda : M * lda));
    float *B = malloc(sizeof(float) * (size_t)K * ldb);
    float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
    for (int i = 0; i < (tn ? K * lda : M * lda); i++) A[i] = (float)nl_t_rand();
    for (int i = 0; i < K * ldb; i++) B[i] = (float)nl_t_rand();
    for (int i = 0; i < M * ldc; i++) C0[i] = C[i] = (float)nl_t_rand();
    if (tn) nl_gemm_tn(C, ldc, A, lda, B, ldb, M, N, K, acc);
    else nl_gemm(C, ldc, A, lda, B, ldb, M, N, K, acc);
    int bad = 0, untouched = 1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            if (j >= N) { /* past N: never written */
                untouched &= C[i * ldc + j] == C0[i * ldc + j];
                continue;
            }
            const float want = tn ? chain(wide, acc ? C0[i * ldc + j] : 0.0f, A, 1, lda, B, ldb, i, j, K)
                                  : chain(wide, acc ? C0[i * ldc + j] : 0.0f, A, lda, 1, B, ldb, i, j, K);
            bad += memcmp(&want, &C[i * ldc + j], sizeof want) != 0;
        }
    CHECKF(bad == 0 && untouched, "gemm%s M=%d N=%d K=%d ldc=%d acc=%d: %d elements differ from the chain%s",
           tn ? "_tn" : "", M, N, K, ldc, acc, bad, untouched ? "" : ", and columns past N were written");
    free(A);
    free(B);
    free(C);
    free(C0);
}

static void all_shapes(void) {
    /* short reductions (the LoRA rank), power-of-two and odd strides, every row/column edge */
    const int Ms[] = {1, 5, 6, 7, 13, 32, 33};
    const int Ns[] = {1, 8, 9, 16, 17, 31, 255, 256, 257, 600};
    const int Ks[] = {1, 4, 16, 31, 32, 33, 300};
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
            for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++) {
                const int M = Ms[a], N = Ns[b], K = Ks[c];
                const int ldc = (a + b + c) % 2 ? N : (N <= 256 ? 512 : 1024); /* tight, or a power of two */
                one(M, N, K, ldc, (int)((a + c) % 2), (int)((b + c) % 2));
            }
    /* the LoRA shapes: rank 16, 2048 columns, ldc 2048 */
    one(32, 2048, 16, 2048, 0, 1);
    one(32, 2048, 16, 2048, 0, 0);
    one(16, 2048, 32, 2048, 1, 1);
    /* the LoRA rank outputs (N = r = 16, long reductions) and the gradients' shapes */
    one(32, 16, 1024, 16, 0, 0);
    one(13, 16, 3072, 16, 0, 1);
    one(16, 1024, 512, 1024, 1, 1);
    one(3072, 16, 512, 16, 1, 1);
}

int main(void) {
    nl_t_rng_state = 5;
    /* every kernel row this CPU runs (the default one last, as the library uses it) */
    static const char *const rows[] = {"scalar", "avx2", "avx512", "neon"};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        if (!nl_cpu_kernels_find(rows[i])) continue;
        CHECK(nl_cpu_use(rows[i]) == 0);
        all_shapes();
        printf("gemm (%s row): %s kernel, every element one k-ordered chain\n", rows[i],
               nl_gemm_wide() ? "fused" : "portable");
    }
    CHECK(nl_cpu_use(NULL) == 0);
    all_shapes();
    return nl_t_done();
}

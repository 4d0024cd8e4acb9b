/* cpu/peak: the register-only peak loops (contract: peak.h). The x86 loops carry their own
 * target attributes and run only where the CPU has the instructions; the AMX loops are in
 * kernels_amx.c (every tile instruction lives there, tests/amx_code.sh). */
#include "cpu/peak.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/amx.h"
#include "cpu/cpu.h"
#include "util/util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* one loop: `it` iterations, returns the operations done (2 per multiply-add) */
typedef double (*peak_loop)(long it);

#define ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* the operands stay in registers and look changed to the compiler, so nothing is hoisted */
#if defined(__aarch64__)
#define PEAK_KEEP(x, y) __asm__ volatile("" : "+w"(x), "+w"(y))
#else
#define PEAK_KEEP(x, y) __asm__ volatile("" : "+v"(x), "+v"(y))
#endif

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static double loop_fp32_512(long it) {
    __m512 a[12], x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = _mm512_fmadd_ps(x, y, a[k]);
        ACC12(F)
#undef F
        PEAK_KEEP(x, y);
    }
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 16 * 2;
}

__attribute__((target("avx2,fma"))) static double loop_fp32_256(long it) {
    __m256 a[12], x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_ps();
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = _mm256_fmadd_ps(x, y, a[k]);
        ACC12(F)
#undef F
        PEAK_KEEP(x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) static double loop_bf16_512(long it) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    for (long i = 0; i < it; i++) {
#define B(k) a[k] = _mm512_dpbf16_ps(a[k], x, y);
        ACC12(B)
#undef B
        PEAK_KEEP(x, y);
    }
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 32 * 2;
}

__attribute__((target("avx512f,avx512vnni"))) static double loop_int8_512(long it) {
    __m512i a[12], x = _mm512_set1_epi8(1), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_si512();
    for (long i = 0; i < it; i++) {
#define I(k) a[k] = _mm512_dpbusd_epi32(a[k], x, y);
        ACC12(I)
#undef I
        PEAK_KEEP(x, y);
    }
    int s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    __asm__ volatile("" ::"r"(s));
    return (double)it * 12 * 64 * 2;
}

__attribute__((target("avx2,avxvnni"))) static double loop_int8_256(long it) {
    __m256i a[12], x = _mm256_set1_epi8(1), y = x;
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_si256();
    for (long i = 0; i < it; i++) {
#define I(k) a[k] = _mm256_dpbusd_avx_epi32(a[k], x, y);
        ACC12(I)
#undef I
        PEAK_KEEP(x, y);
    }
    __m256i s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_epi32(s, a[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)it * 12 * 32 * 2;
}

/* CPUID bits the probe of cpu.h does not keep: AVX512_VNNI (7.0:ECX bit 11), AVX-VNNI
 * (7.1:EAX bit 4), AMX-INT8 (7.0:EDX bit 25) */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1;
}

#if defined(NL_HAVE_AMX)
static double loop_amx_bf16(long it) { return nl_amx_peak_loop(0, it); }
static double loop_amx_int8(long it) { return nl_amx_peak_loop(1, it); }
#endif
#elif defined(__aarch64__)
static double loop_fp32_neon(long it) {
    float32x4_t a[12], x = vdupq_n_f32(1e-9f), y = vdupq_n_f32(1.0f);
    for (int i = 0; i < 12; i++) a[i] = vdupq_n_f32(0.0f);
    for (long i = 0; i < it; i++) {
#define F(k) a[k] = vfmaq_f32(a[k], x, y);
        ACC12(F)
#undef F
        PEAK_KEEP(x, y);
    }
    float32x4_t s = a[0];
    for (int i = 1; i < 12; i++) s = vaddq_f32(s, a[i]);
    __asm__ volatile("" ::"w"(s));
    return (double)it * 12 * 4 * 2;
}
#endif

static peak_loop loop_of(nl_peak_kind k, const char **insn) {
    const char *name = NULL;
    peak_loop f = NULL;
#if defined(__x86_64__)
    switch (k) {
    case NL_PEAK_FP32:
        if (nl_cpu_has(NL_CPU_AVX512)) f = loop_fp32_512, name = "avx512 vfmadd231ps zmm";
        else if (nl_cpu_has(NL_CPU_AVX2)) f = loop_fp32_256, name = "avx2 vfmadd231ps ymm";
        break;
    case NL_PEAK_BF16:
        if (nl_cpu_has(NL_CPU_AVX512BF16)) f = loop_bf16_512, name = "avx512_bf16 vdpbf16ps zmm";
        break;
    case NL_PEAK_INT8:
        if (nl_cpu_has(NL_CPU_AVX512) && cpuid_bit(7, 0, 2, 11)) f = loop_int8_512, name = "avx512_vnni vpdpbusd zmm";
        else if (nl_cpu_has(NL_CPU_AVX2) && cpuid_bit(7, 1, 0, 4)) f = loop_int8_256, name = "avx_vnni vpdpbusd ymm";
        break;
#if defined(NL_HAVE_AMX)
    case NL_PEAK_AMX_BF16:
        if (nl_amx_available(NULL, 0)) f = loop_amx_bf16, name = "amx tdpbf16ps";
        break;
    case NL_PEAK_AMX_INT8:
        if (nl_amx_available(NULL, 0) && cpuid_bit(7, 0, 3, 25)) f = loop_amx_int8, name = "amx tdpbssd";
        break;
#endif
    default:
        break;
    }
#elif defined(__aarch64__)
    if (k == NL_PEAK_FP32) f = loop_fp32_neon, name = "neon fmla v.4s";
#endif
    (void)k;
    if (insn) *insn = name;
    return f;
}

const char *nl_peak_name(nl_peak_kind k) {
    static const char *const n[NL_PEAK_N] = {"fp32", "bf16", "int8", "amx-bf16", "amx-int8"};
    return (int)k >= 0 && k < NL_PEAK_N ? n[k] : "?";
}

const char *nl_peak_unit(nl_peak_kind k) { return k == NL_PEAK_INT8 || k == NL_PEAK_AMX_INT8 ? "GOP/s" : "GFLOP/s"; }

const char *nl_peak_insn(nl_peak_kind k) {
    const char *s;
    loop_of(k, &s);
    return s;
}

int nl_peak_of_compute(const char *compute) {
    if (!compute) return -1;
    if (!strcmp(compute, "bf16")) return NL_PEAK_BF16;
    if (!strcmp(compute, "f32")) return NL_PEAK_FP32;
    if (!strcmp(compute, "amx")) return NL_PEAK_AMX_BF16;
    if (!strcmp(compute, "int8")) return NL_PEAK_INT8;
    return -1;
}

typedef struct {
    peak_loop f;
    long it;
    int *go; /* 0 wait, 1 run, -1 leave without running */
    double rate;
} peak_arg;

static void *peak_thread(void *p) {
    peak_arg *a = p;
    int g;
    while (!(g = __atomic_load_n(a->go, __ATOMIC_ACQUIRE))) {
    }
    if (g < 0) return NULL;
    const double t0 = nl_now();
    const double ops = a->f(a->it);
    const double dt = nl_now() - t0;
    a->rate = dt > 0 ? ops / dt * 1e-9 : 0.0;
    return NULL;
}

double nl_peak_measure(nl_peak_kind k, int n_threads, double seconds) {
    peak_loop f = loop_of(k, NULL);
    if (!f || n_threads < 1 || n_threads > 1024) return -1.0;
    if (!(seconds > 0.0)) seconds = 0.2;
    /* iterations for about `seconds` on one thread: grow until a run is long enough to time */
    long it = 1 << 12;
    double dt = 0.0;
    for (;;) {
        const double t0 = nl_now();
        f(it);
        dt = nl_now() - t0;
        if (dt >= seconds / 8 || it > (1L << 40)) break;
        it *= 4;
    }
    if (dt > 0) it = (long)((double)it * seconds / dt) + 1;
    peak_arg *args = nl_calloc((size_t)n_threads, sizeof *args);
    pthread_t *th = nl_calloc((size_t)n_threads, sizeof *th);
    double sum = -1.0;
    int go = 0, started = 0;
    if (!args || !th) goto out;
    for (int i = 0; i < n_threads; i++) args[i] = (peak_arg){f, it, &go, 0.0};
    /* the caller is thread 0; the others start first and spin until all exist */
    for (int i = 1; i < n_threads; i++, started++)
        if (pthread_create(&th[i], NULL, peak_thread, &args[i])) break;
    __atomic_store_n(&go, started == n_threads - 1 ? 1 : -1, __ATOMIC_RELEASE);
    if (started == n_threads - 1) peak_thread(&args[0]);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    if (started == n_threads - 1) {
        sum = 0.0;
        for (int i = 0; i < n_threads; i++) sum += args[i].rate;
    }
out:
    free(args);
    free(th);
    return sum;
}

/* cpu/cpu: the CPU-feature probe (see cpu.h). */
#include "cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

static unsigned probe(void) {
    unsigned m = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    /* CPUID.1:ECX bit 29 = F16C */
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        m |= 1u << NL_CPU_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
            m |= 1u << NL_CPU_AVX512;
            /* CPUID.(EAX=7,ECX=1):EAX bit 5 = AVX512_BF16 */
            if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1)) m |= 1u << NL_CPU_AVX512BF16;
            /* CPUID.(EAX=7,ECX=0):ECX bit 11 = AVX512_VNNI */
            if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1)) m |= 1u << NL_CPU_AVX512VNNI;
        }
    }
    /* CPUID.1:ECX bit 27 = OSXSAVE (xgetbv may run); XCR0 bits 17, 18 = XTILECFG, XTILEDATA */
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 24) & 1) && ((d >> 22) & 1)) {
        unsigned a1, b1, c1, d1;
        if (__get_cpuid(1, &a1, &b1, &c1, &d1) && ((c1 >> 27) & 1)) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            (void)hi;
            if (((lo >> 17) & 3) == 3) m |= 1u << NL_CPU_AMX;
        }
    }
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu)
        m |= 1u << NL_CPU_INTEL;
#elif defined(__aarch64__)
    m |= 1u << NL_CPU_NEON;
#if defined(__linux__)
    /* the kernel's HWCAP words (asm/hwcap.h bit numbers; spelled here so old headers build) */
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if ((hw2 >> 14) & 1) m |= 1u << NL_CPU_ARM_BF16;   /* HWCAP2_BF16 */
    if ((hw2 >> 13) & 1) m |= 1u << NL_CPU_ARM_I8MM;   /* HWCAP2_I8MM */
    if ((hw >> 20) & 1) m |= 1u << NL_CPU_ARM_DOTPROD; /* HWCAP_ASIMDDP */
    if ((hw2 >> 23) & 1) m |= 1u << NL_CPU_ARM_SME;    /* HWCAP2_SME */
#endif
#endif
    return m;
}

/* NL_CPU_HIDE (a comma-separated list of these names): the features this process acts as if
 * the CPU lacked, with those that come with them (avx2 takes the AVX-512 ones, avx512 its
 * extensions), so that every machine can run the paths of a lesser CPU (tests: a kernel's
 * fallback where this CPU has the faster instruction). Unknown names are ignored. */
static const char *const feature_names[NL_CPU_N_FEATURES] = {[NL_CPU_AVX2] = "avx2",
                                                             [NL_CPU_AVX512] = "avx512",
                                                             [NL_CPU_AVX512BF16] = "avx512bf16",
                                                             [NL_CPU_NEON] = "neon",
                                                             [NL_CPU_AMX] = "amx",
                                                             [NL_CPU_INTEL] = "intel",
                                                             [NL_CPU_ARM_BF16] = "arm_bf16",
                                                             [NL_CPU_ARM_I8MM] = "arm_i8mm",
                                                             [NL_CPU_ARM_DOTPROD] = "arm_dotprod",
                                                             [NL_CPU_ARM_SME] = "arm_sme",
                                                             [NL_CPU_AVX512VNNI] = "avx512vnni"};

static unsigned hidden(const char *list) {
    unsigned h = 0;
    while (list && *list) {
        const char *e = strchr(list, ',');
        const size_t n = e ? (size_t)(e - list) : strlen(list);
        for (int f = 0; f < NL_CPU_N_FEATURES; f++)
            if (feature_names[f] && strlen(feature_names[f]) == n && !strncmp(list, feature_names[f], n)) h |= 1u << f;
        list = e ? e + 1 : NULL;
    }
    if (h & 1u << NL_CPU_AVX2) h |= 1u << NL_CPU_AVX512;
    if (h & 1u << NL_CPU_AVX512) h |= 1u << NL_CPU_AVX512BF16 | 1u << NL_CPU_AVX512VNNI;
    return h;
}

int nl_cpu_has(nl_cpu_feature f) {
    /* asked on every projection request: the CPU once (a benign race: every thread stores the
     * same value); bit 31 marks the mask as known */
    static unsigned known = 0;
    unsigned v = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!v) {
        v = (probe() & ~hidden(getenv("NL_CPU_HIDE"))) | 1u << 31;
        __atomic_store_n(&known, v, __ATOMIC_RELAXED);
    }
    return (int)f >= 0 && f < NL_CPU_N_FEATURES && ((v >> f) & 1u);
}

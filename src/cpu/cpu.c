/* cpu/cpu: the CPU-feature probe (see cpu.h). */
#include "cpu/cpu.h"

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

int nl_cpu_has(nl_cpu_feature f) {
    /* asked on every projection request: the CPU once (a benign race: every thread stores the
     * same value); bit 31 marks the mask as known */
    static unsigned known = 0;
    unsigned v = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!v) {
        v = probe() | 1u << 31;
        __atomic_store_n(&known, v, __ATOMIC_RELAXED);
    }
    return (int)f >= 0 && f < NL_CPU_N_FEATURES && ((v >> f) & 1u);
}

/* cpu/cpu: the one probe of what the CPU this process runs on can do, for every room (the
 * projection kernels, the CPU nodes' SIMD paths). Asked of the CPU once and cached; a feature
 * counts only when the OS saves its registers too (what __builtin_cpu_supports checks). */
#ifndef NL_CPU_H
#define NL_CPU_H

typedef enum {
    NL_CPU_AVX2,        /* x86-64: AVX2 + FMA + F16C */
    NL_CPU_AVX512,      /* x86-64: AVX-512 F, BW, VL and DQ, with the AVX2 set */
    NL_CPU_AVX512BF16,  /* x86-64: AVX512_BF16 (CPUID.(7,1):EAX bit 5), with the AVX-512 set */
    NL_CPU_NEON,        /* aarch64: Advanced SIMD (always there) */
    NL_CPU_AMX,         /* x86-64: AMX-TILE + AMX-BF16 (CPUID.(7,0):EDX bits 24, 22) with the tile state
                         * enabled by the OS (XCR0 bits 17, 18); Linux also wants a per-process
                         * permission before the first tile instruction (cpu/amx.h asks for it) */
    NL_CPU_INTEL,       /* x86-64: the vendor is Intel ("GenuineIntel"): kernel choices by family */
    NL_CPU_ARM_BF16,    /* aarch64: FEAT_BF16 (BFMMLA, BFDOT; Linux HWCAP2_BF16) */
    NL_CPU_ARM_I8MM,    /* aarch64: FEAT_I8MM (SMMLA; HWCAP2_I8MM) */
    NL_CPU_ARM_DOTPROD, /* aarch64: FEAT_DotProd (SDOT; HWCAP_ASIMDDP) */
    NL_CPU_ARM_SME,     /* aarch64: FEAT_SME (streaming mode, ZA; HWCAP2_SME) */
    NL_CPU_AVX512VNNI,  /* x86-64: AVX512_VNNI (CPUID.(7,0):ECX bit 11), with the AVX-512 set */
    NL_CPU_N_FEATURES
} nl_cpu_feature;

/* 1 if this CPU has the feature (and every feature its comment names with it), else 0; a feature
 * named in the environment's NL_CPU_HIDE (e.g. "avx512bf16,amx") reads as absent (cpu.c). */
int nl_cpu_has(nl_cpu_feature f);

#endif

/* cpu/peak_loops: the register-only loops of cpu/peak.c, one file per ISA (peak_<isa>.c, built
 * with that ISA's flags; peak.c runs one only where the CPU has it). Each runs `it` iterations of
 * 12 independent vector multiply-accumulates and returns the operations done (2 per
 * multiply-add). */
#ifndef NL_CPU_PEAK_LOOPS_H
#define NL_CPU_PEAK_LOOPS_H

#define NL_PEAK_ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* the operands stay in registers and look changed to the compiler, so nothing is hoisted */
#if defined(__aarch64__)
#define NL_PEAK_KEEP(x, y) __asm__ volatile("" : "+w"(x), "+w"(y))
#else
#define NL_PEAK_KEEP(x, y) __asm__ volatile("" : "+v"(x), "+v"(y))
#endif

#if defined(__x86_64__)
double nl_peak_fp32_avx512(long it);     /* vfmadd231ps zmm */
double nl_peak_bf16_avx512(long it);     /* vdpbf16ps zmm (AVX512_BF16) */
double nl_peak_fp32_avx2(long it);       /* vfmadd231ps ymm */
double nl_peak_int8_avx512vnni(long it); /* vpdpbusd zmm (AVX512_VNNI) */
double nl_peak_int8_avxvnni(long it);    /* vpdpbusd ymm (AVX-VNNI) */
#elif defined(__aarch64__)
double nl_peak_fp32_neon(long it); /* fmla v.4s */
#endif

#endif

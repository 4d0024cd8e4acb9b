/* cpu/fpmode: the calling thread's floating-point mode with denormals flushed, for a node that
 * would otherwise spend its time on them.
 *
 * Why: on Intel cores every FP32 operation with a denormal input or a denormal result takes a
 * microcode assist (on the order of a hundred cycles; AMD's Zen and the Arm cores handle most
 * of them at full speed). The GDN node's running decay products pass through the denormal
 * range on their way to 0 wherever a head's gate is strong, and on an Intel Xeon that tripled
 * its time (bench step, qwen35-0.8b: 2.6 -> 0.8 s a step).
 *
 * What it sets: x86-64 MXCSR FTZ (bit 15) + DAZ (bit 6), aarch64 FPCR.FZ (bit 24): a denormal
 * input reads as a zero of its sign and a denormal result becomes one. That is one rule on
 * both, so a node under it gives the same bits on x86 and on the phone (up to where the two
 * decide a result is tiny: after rounding on x86, before on Arm; only a result that rounds up
 * to FLT_MIN itself can tell them apart). Elsewhere it does nothing (the node then computes
 * with denormals, as IEEE says).
 *
 * Use: m = nl_fpmode_flush(); ...; nl_fpmode_restore(m); on every thread that runs the node's
 * work (the pool's tasks included: each thread has its own mode), and always restore, since
 * the caller's thread belongs to the caller. */
#ifndef NL_CPU_FPMODE_H
#define NL_CPU_FPMODE_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

typedef struct {
    uint64_t saved; /* the mode before nl_fpmode_flush, as the ISA's register holds it */
} nl_fpmode;

/* Sets flush-to-zero (and denormals-are-zero) on the calling thread; returns the mode before. */
static inline nl_fpmode nl_fpmode_flush(void) {
    nl_fpmode m = {0};
#if defined(__x86_64__) || defined(_M_X64)
    unsigned csr = _mm_getcsr();
    m.saved = csr;
    _mm_setcsr(csr | 0x8040u);
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    m.saved = fpcr;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | ((uint64_t)1 << 24)));
#endif
    return m;
}

/* Puts the calling thread's mode back as nl_fpmode_flush found it. */
static inline void nl_fpmode_restore(nl_fpmode m) {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_setcsr((unsigned)m.saved);
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(m.saved));
#else
    (void)m;
#endif
}

#endif

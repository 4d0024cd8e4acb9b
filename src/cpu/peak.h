/* cpu/peak: the machine's own register-only peaks, what every speed figure of `bench` is a
 * fraction of. Each kind is one loop of independent multiply-accumulates on registers only
 * (12 vector accumulators; the AMX kinds 4 accumulator tiles fed by 4 operand tiles, the 2x2
 * block of the tile kernel), no memory traffic: an upper bound no real product reaches.
 * Figures count 2 operations per multiply-add: GFLOP/s for the float kinds, GOP/s for INT8. */
#ifndef NL_CPU_PEAK_H
#define NL_CPU_PEAK_H

typedef enum {
    NL_PEAK_FP32,     /* FP32 FMA: AVX-512 vfmadd231ps zmm, else AVX2 ymm, else NEON fmla */
    NL_PEAK_BF16,     /* BF16 dot: AVX512_BF16 vdpbf16ps zmm */
    NL_PEAK_INT8,     /* INT8 dot: AVX512_VNNI vpdpbusd zmm, else AVX-VNNI ymm */
    NL_PEAK_AMX_BF16, /* AMX TDPBF16PS */
    NL_PEAK_AMX_INT8, /* AMX TDPBSSD */
    NL_PEAK_N
} nl_peak_kind;

/* "fp32", "bf16", "int8", "amx-bf16", "amx-int8" */
const char *nl_peak_name(nl_peak_kind k);
/* the instruction this CPU's loop of that kind runs ("avx512 vdpbf16ps zmm"), or NULL when the
 * CPU (or this build) has none */
const char *nl_peak_insn(nl_peak_kind k);
/* "GFLOP/s" or "GOP/s" */
const char *nl_peak_unit(nl_peak_kind k);

/* The rate of n_threads threads running the loop at once (about `seconds` long, in 8 slices
 * that all threads start together; the best slice's operations of every thread over its span,
 * first start to last end, so that a slice in which a core was taken away does not count and
 * threads that did not run at the same time are not summed as if they had), in units of 1e9
 * operations a second; -1 when the CPU has no such loop (nl_peak_insn NULL) or a thread could
 * not start. */
double nl_peak_measure(nl_peak_kind k, int n_threads, double seconds);

/* The kind whose peak bounds a host compute mode (nl_proj_host_compute: "bf16", "f32", "amx",
 * "int8"); -1 for one without a measured peak (e.g. the emulator). */
int nl_peak_of_compute(const char *compute);

#endif

/* cpu/dispatch: the one dispatcher of the kernel table (cpu/kernels.h). The rows in order of
 * preference, each with the CPU feature it needs; adding an ISA level is its kernels_<isa>.c and
 * one line here (docs/architecture.md). */
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/gemm_bf16.h"
#include "cpu/kernels.h"
#include "util/util.h"

static const struct {
    const nl_host_kernels *ks;
    int need; /* nl_cpu_feature, or -1: every CPU */
} rows[] = {
#if defined(__x86_64__)
    {&nl_host_kernels_avx512, NL_CPU_AVX512},
    {&nl_host_kernels_avx2, NL_CPU_AVX2},
#endif
#if defined(__aarch64__)
    {&nl_host_kernels_neonbf16, NL_CPU_ARM_BF16},
    {&nl_host_kernels_neon, NL_CPU_NEON},
#endif
    {&nl_host_kernels_scalar, -1},
};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

static int runs(int i) { return rows[i].need < 0 || nl_cpu_has((nl_cpu_feature)rows[i].need); }

const nl_host_kernels *nl_cpu_kernels_find(const char *name) {
    const int any = !name || !strcmp(name, "auto");
    for (int i = 0; i < N_ROWS; i++)
        if ((any || !strcmp(name, rows[i].ks->name)) && runs(i)) return rows[i].ks;
    return NULL;
}

/* the row in use; NULL until the first call (every thread computes the same answer) */
static const nl_host_kernels *in_use;

const nl_host_kernels *nl_cpu_kernels(void) {
    const nl_host_kernels *ks = __atomic_load_n(&in_use, __ATOMIC_ACQUIRE);
    if (ks) return ks;
    ks = nl_cpu_kernels_find("auto");
    __atomic_store_n(&in_use, ks, __ATOMIC_RELEASE);
    return ks;
}

int nl_cpu_use(const char *name) {
    const nl_host_kernels *ks = nl_cpu_kernels_find(name);
    if (!ks) return nl_err("kernel set '%s' does not run on this CPU (or is unknown)", name);
    __atomic_store_n(&in_use, ks, __ATOMIC_RELEASE);
    return 0;
}

const nl_bf16_kernels *nl_cpu_bf16(void) {
    const nl_bf16_kernels *b = nl_cpu_kernels()->bf16;
    return b && nl_cpu_has(NL_CPU_AVX512BF16) ? b : NULL;
}

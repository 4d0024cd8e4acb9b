/* cpu/dispatch: the one dispatcher of the kernel room (cpu/kernels.h, cpu/amx.h): every choice of
 * a kernel by what this CPU has is made here, from cpu/cpu.c's one probe: the kernel table's rows
 * (nl_cpu_kernels), the int8 FWD rows (nl_cpu_i8_kernels) and the tile operations
 * (nl_amx_tiles_of). Each list is in order of preference, each row with the CPU feature it needs;
 * adding an ISA level is its <table>_<isa>.c and one line here (docs/architecture.md). */
#include <string.h>

#include "cpu/amx.h"
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

/* ---- the int8 FWD rows (kernels.h "the int8 FWD rows"; the scalar model: cpu/i8.c) ---- */
static const struct {
    const nl_i8_kernels *ks;
    int need; /* nl_cpu_feature, or -1: every CPU */
} i8_rows[] = {
#if defined(__x86_64__)
    {&nl_i8_kernels_avx512vnni, NL_CPU_AVX512VNNI},
#endif
#if defined(__aarch64__)
    {&nl_i8_kernels_i8mm, NL_CPU_ARM_I8MM},
    {&nl_i8_kernels_dotprod, NL_CPU_ARM_DOTPROD},
#endif
    {&nl_i8_kernels_scalar, -1},
};

const nl_i8_kernels *nl_cpu_i8_kernels(const char *name) {
    const int any = !name || !strcmp(name, "auto");
    for (size_t i = 0; i < sizeof i8_rows / sizeof i8_rows[0]; i++)
        if ((any || !strcmp(name, i8_rows[i].ks->name)) &&
            (i8_rows[i].need < 0 || nl_cpu_has((nl_cpu_feature)i8_rows[i].need)))
            return i8_rows[i].ks;
    return NULL;
}

/* ---- the tile operations (cpu/amx.h): the emulator everywhere, AMX and SME where they run ---- */
const nl_amx_tiles *nl_amx_tiles_of(const char *compute) {
    if (!compute) return NULL;
    if (!strcmp(compute, "amx-emu")) return &nl_amx_tiles_emu;
#if defined(__x86_64__) && defined(NL_HAVE_AMX)
    if (!strcmp(compute, "amx") && nl_amx_available(NULL, 0)) return &nl_amx_tiles_real;
#endif
#if defined(NL_HAVE_SME)
    if (!strcmp(compute, "sme") && nl_sme_available(NULL, 0)) return &nl_amx_tiles_sme;
#endif
    return NULL;
}

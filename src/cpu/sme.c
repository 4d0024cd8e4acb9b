/* cpu/sme: whether the SME tile kernel (kernels_sme.c, nl_amx_tiles_sme) may run in this
 * process: built (a compiler with SME: CMakeLists.txt), the CPU's HWCAP2_SME, and a 512-bit
 * streaming vector length (the kernels' 16×16 FP32 tiles; Linux sets it per thread with
 * prctl(PR_SME_SET_VL), inherited by threads made later; kernels_sme.c's begin sets it again in
 * threads made before). Found once and kept, as nl_amx_available. */
#include <pthread.h>
#include <stdio.h>

#include "cpu/amx.h"
#include "cpu/cpu.h"

#if defined(__aarch64__) && defined(__linux__) && defined(NL_HAVE_SME)
#include <sys/prctl.h>
#ifndef PR_SME_SET_VL
#define PR_SME_SET_VL 63
#endif
#ifndef PR_SME_VL_INHERIT
#define PR_SME_VL_INHERIT (1 << 17)
#endif

static int probe(char *why, size_t cap) {
    if (!nl_cpu_has(NL_CPU_ARM_SME)) {
        snprintf(why, cap, "the CPU has no SME (HWCAP2_SME)");
        return 0;
    }
    int r = prctl(PR_SME_SET_VL, 64 | PR_SME_VL_INHERIT, 0, 0, 0);
    if (r < 0) r = prctl(PR_SME_SET_VL, 64, 0, 0, 0); /* qemu-user 7.2 refuses the inherit flag */
    if (r < 0 || (r & 0xffff) != 64 || nl_sme_svl_bytes() != 64) {
        snprintf(why, cap, "the kernels need a 512-bit streaming vector length (this CPU gave %d bits)",
                 r < 0 ? 8 * nl_sme_svl_bytes() : 8 * (r & 0xffff));
        return 0;
    }
    return 1;
}
#else
static int probe(char *why, size_t cap) {
#if !defined(__aarch64__)
    snprintf(why, cap, "not an Arm CPU");
#elif !defined(NL_HAVE_SME)
    snprintf(why, cap, "this build has no SME kernels (no compiler with SME was found: see cmake's configure line)");
#else
    snprintf(why, cap, "SME is used only on Linux here");
#endif
    return 0;
}
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_usable;
static char g_reason[192];

static void probe_once(void) { g_usable = probe(g_reason, sizeof g_reason); }

int nl_sme_available(char *why, size_t cap) {
    pthread_once(&g_once, probe_once);
    if (!g_usable && why && cap) snprintf(why, cap, "%s", g_reason);
    return g_usable;
}

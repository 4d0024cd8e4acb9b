/* cpu/kernels_amx: the tile kernel (amx_kern.h) on the real AMX instructions, and the
 * availability check. Built with -mamx-tile -mamx-bf16 (the file's name: cpu/kernels.h's one ISA
 * mechanism); only the real_* functions hold tile instructions (tests/amx_code.sh), and host.c
 * calls them only after nl_amx_available() said yes (CPUID and
 * the OS tile state from util/cpu, then the Linux permission: docs/amx.md). NL_HAVE_AMX is
 * defined by the build where the compiler knows the AMX target (x86-64, gcc >= 11 / clang >= 12). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cpu/amx.h"
#include "cpu/cpu.h"

#if defined(__x86_64__) && defined(NL_HAVE_AMX)
#include <errno.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define AMX_FN(name) real_##name
#define AMX_ATTR
/* gcc 12's intrinsics declare no memory read for ldtilecfg beyond 8 bytes, none at all for
 * tileloadd: the compiler barrier before each makes every earlier store (the packed operands,
 * the C block) reach memory first, whatever inlining or link-time optimisation does */
#define NL_AMX_BARRIER() __asm__ volatile("" ::: "memory")
#define TILE_LOADCONFIG(p)                                                                                             \
    do {                                                                                                               \
        NL_AMX_BARRIER();                                                                                              \
        _tile_loadconfig(p);                                                                                           \
    } while (0)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, p, stride)                                                                                        \
    do {                                                                                                               \
        NL_AMX_BARRIER();                                                                                              \
        _tile_loadd(t, p, stride);                                                                                     \
    } while (0)
#define TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#include "cpu/amx_kern.h"

const nl_amx_tiles nl_amx_tiles_real = {
    .name = "amx",
    .begin = real_begin,
    .block = real_block,
    .end = real_end,
};

/* cpu/peak's AMX loops: 4 accumulator tiles fed by 2 A and 2 B tiles (the kernel's 2x2 block),
 * `it` times; the operations done (2 per multiply-add). Only after nl_amx_available() (and, for
 * int8, CPUID AMX-INT8). */
__attribute__((noinline)) static double real_peak(int int8, long it) {
    _Alignas(64) uint16_t ones[16 * 32];
    _Alignas(64) float out[256];
    for (int i = 0; i < 16 * 32; i++) ones[i] = int8 ? 0x0101 : 0x3f80;
    NL_AMX_BARRIER();
    _tile_loadconfig(&nl_amx_config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    NL_AMX_BARRIER();
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    if (int8)
        for (long i = 0; i < it; i++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    else
        for (long i = 0; i < it; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    _tile_stored(3, out, 64);
    _tile_release();
    __asm__ volatile("" ::"r"(out) : "memory");
    return (double)it * 4 * 16 * 16 * (int8 ? 64 : 32) * 2;
}

double nl_amx_peak_loop(int int8, long it) { return real_peak(int8, it); }

/* 1 = usable; else 0 and the reason in why */
static int probe(char *why, size_t cap) {
    if (!nl_cpu_has(NL_CPU_AMX)) {
        snprintf(why, cap,
                 "the CPU has no AMX-TILE/AMX-BF16, or the OS has not enabled the tile state (CPUID.7.0:EDX bits 24, "
                 "22; XCR0 bits 17, 18)");
        return 0;
    }
    /* per process (every thread, present and future; inherited by fork, cleared by exec); the
     * kernel refuses it (ENOSPC) while some thread has an alternate signal stack too small for
     * the tile state (~11 KB of signal frame) */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        const int e = errno;
        snprintf(why, cap, "the kernel refused the tile permission (arch_prctl ARCH_REQ_XCOMP_PERM: %s%s)", strerror(e),
                 e == ENOSPC ? ": a thread's sigaltstack is too small for the tile state" : "");
        return 0;
    }
    unsigned long long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0 || !((perm >> XFEATURE_XTILEDATA) & 1)) {
        snprintf(why, cap,
                 "the tile permission is not in the process's permitted set (arch_prctl ARCH_GET_XCOMP_PERM)");
        return 0;
    }
    return 1;
}
#else
static int probe(char *why, size_t cap) {
#if defined(__x86_64__)
    snprintf(why, cap, "this build's compiler has no AMX target");
#else
    snprintf(why, cap, "not an x86-64 CPU");
#endif
    return 0;
}
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_usable;
static char g_reason[192];

static void probe_once(void) { g_usable = probe(g_reason, sizeof g_reason); }

int nl_amx_available(char *why, size_t cap) {
    pthread_once(&g_once, probe_once); /* once per process: the permission request is too */
    if (!g_usable && why && cap) snprintf(why, cap, "%s", g_reason);
    return g_usable;
}

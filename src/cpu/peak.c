/* cpu/peak: the register-only peaks (contract: peak.h). The loops are in peak_<isa>.c, built with
 * that ISA's flags (the one ISA mechanism, cpu/kernels.h); this file runs one only where the CPU
 * has the instructions. The AMX loops are in kernels_amx.c (every tile instruction lives there,
 * tests/amx_code.sh). */
#include "cpu/peak.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/amx.h"
#include "cpu/cpu.h"
#include "cpu/peak_loops.h"
#include "util/util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* one loop: `it` iterations, returns the operations done (2 per multiply-add) */
typedef double (*peak_loop)(long it);

#if defined(__x86_64__)
/* CPUID bits the probe of cpu.h does not keep: AVX512_VNNI (7.0:ECX bit 11), AVX-VNNI
 * (7.1:EAX bit 4), AMX-INT8 (7.0:EDX bit 25) */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1;
}

#if defined(NL_HAVE_AMX)
static double loop_amx_bf16(long it) { return nl_amx_peak_loop(0, it); }
static double loop_amx_int8(long it) { return nl_amx_peak_loop(1, it); }
#endif
#endif

static peak_loop loop_of(nl_peak_kind k, const char **insn) {
    const char *name = NULL;
    peak_loop f = NULL;
#if defined(__x86_64__)
    switch (k) {
    case NL_PEAK_FP32:
        if (nl_cpu_has(NL_CPU_AVX512)) f = nl_peak_fp32_avx512, name = "avx512 vfmadd231ps zmm";
        else if (nl_cpu_has(NL_CPU_AVX2)) f = nl_peak_fp32_avx2, name = "avx2 vfmadd231ps ymm";
        break;
    case NL_PEAK_BF16:
        if (nl_cpu_has(NL_CPU_AVX512BF16)) f = nl_peak_bf16_avx512, name = "avx512_bf16 vdpbf16ps zmm";
        break;
    case NL_PEAK_INT8:
        if (nl_cpu_has(NL_CPU_AVX512) && cpuid_bit(7, 0, 2, 11))
            f = nl_peak_int8_avx512vnni, name = "avx512_vnni vpdpbusd zmm";
        else if (nl_cpu_has(NL_CPU_AVX2) && cpuid_bit(7, 1, 0, 4))
            f = nl_peak_int8_avxvnni, name = "avx_vnni vpdpbusd ymm";
        break;
#if defined(NL_HAVE_AMX)
    case NL_PEAK_AMX_BF16:
        if (nl_amx_available(NULL, 0)) f = loop_amx_bf16, name = "amx tdpbf16ps";
        break;
    case NL_PEAK_AMX_INT8:
        if (nl_amx_available(NULL, 0) && cpuid_bit(7, 0, 3, 25)) f = loop_amx_int8, name = "amx tdpbssd";
        break;
#endif
    default: break;
    }
#elif defined(__aarch64__)
    if (k == NL_PEAK_FP32) f = nl_peak_fp32_neon, name = "neon fmla v.4s";
#endif
    (void)k;
    if (insn) *insn = name;
    return f;
}

const char *nl_peak_name(nl_peak_kind k) {
    static const char *const n[NL_PEAK_N] = {"fp32", "bf16", "int8", "amx-bf16", "amx-int8"};
    return (int)k >= 0 && k < NL_PEAK_N ? n[k] : "?";
}

const char *nl_peak_unit(nl_peak_kind k) { return k == NL_PEAK_INT8 || k == NL_PEAK_AMX_INT8 ? "GOP/s" : "GFLOP/s"; }

const char *nl_peak_insn(nl_peak_kind k) {
    const char *s;
    loop_of(k, &s);
    return s;
}

int nl_peak_of_compute(const char *compute) {
    if (!compute) return -1;
    if (!strcmp(compute, "bf16")) return NL_PEAK_BF16;
    if (!strcmp(compute, "f32")) return NL_PEAK_FP32;
    if (!strcmp(compute, "amx")) return NL_PEAK_AMX_BF16;
    if (!strcmp(compute, "int8")) return NL_PEAK_INT8;
    return -1;
}

/* slices of the run: every thread runs slice s at the same time (a barrier between slices) */
#define PEAK_SLICES 8

typedef struct {
    peak_loop f;
    long it;     /* iterations per slice */
    int n;       /* threads */
    int *go;     /* 0 wait, 1 run, -1 leave without running */
    int *ready;  /* threads running and waiting for go */
    int *arrive; /* the slice barrier: threads arrived, summed over the slices */
    double ops, t0[PEAK_SLICES], t1[PEAK_SLICES];
} peak_arg;

static void peak_barrier(int *arrive, int target) {
    __atomic_add_fetch(arrive, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(arrive, __ATOMIC_ACQUIRE) < target) sched_yield();
}

static void *peak_thread(void *p) {
    peak_arg *a = p;
    int g;
    __atomic_add_fetch(a->ready, 1, __ATOMIC_RELEASE);
    while (!(g = __atomic_load_n(a->go, __ATOMIC_ACQUIRE))) {}
    if (g < 0) return NULL;
    for (int s = 0; s < PEAK_SLICES; s++) {
        peak_barrier(a->arrive, a->n * (s + 1));
        a->t0[s] = nl_now();
        a->ops = a->f(a->it);
        a->t1[s] = nl_now();
    }
    return NULL;
}

/* One round: the best slice's rate, all threads' operations over the slice's span, from the
 * first thread's start to the last one's end, so that a slice in which a core was taken away
 * reads low (another slice gives the figure) and threads that did not run at the same time are
 * not summed as if they had (the sum of each thread's own best slice can count one core twice).
 * -1 when a thread could not start. */
static double peak_round(peak_loop f, long it, int n_threads) {
    peak_arg *args = nl_calloc((size_t)n_threads, sizeof *args);
    pthread_t *th = nl_calloc((size_t)n_threads, sizeof *th);
    double best = -1.0;
    int go = 0, ready = 0, arrive = 0, started = 0;
    if (!args || !th) goto out;
    for (int i = 0; i < n_threads; i++)
        args[i] = (peak_arg){.f = f, .it = it, .n = n_threads, .go = &go, .ready = &ready, .arrive = &arrive};
    /* every thread is a new one, pinned to its own CPU of the process's set where there are
     * enough (Linux): left to the scheduler, a new thread started on its parent's CPU and the
     * two took turns there for most of the slices (3 runs in 20 read one thread's rate for two);
     * the caller gives go once every one of them runs, yielding its core meanwhile (up to 1 s) */
    int cpus[1024], n_cpus = 0;
#if defined(__linux__)
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) == 0)
        for (int c = 0; c < CPU_SETSIZE && n_cpus < 1024; c++)
            if (CPU_ISSET(c, &mine)) cpus[n_cpus++] = c;
#endif
    for (int i = 0; i < n_threads; i++, started++) {
        pthread_attr_t at;
        if (pthread_attr_init(&at)) break;
#if defined(__linux__)
        if (n_cpus >= n_threads) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[i], &one);
            pthread_attr_setaffinity_np(&at, sizeof one, &one);
        }
#endif
        const int e = pthread_create(&th[i], &at, peak_thread, &args[i]);
        pthread_attr_destroy(&at);
        if (e) break;
    }
    const double t_wait = nl_now();
    while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < started && nl_now() - t_wait < 1.0) sched_yield();
    __atomic_store_n(&go, started == n_threads ? 1 : -1, __ATOMIC_RELEASE);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (started == n_threads) {
        best = 0.0;
        for (int s = 0; s < PEAK_SLICES; s++) {
            double t0 = args[0].t0[s], t1 = args[0].t1[s], ops = 0.0;
            for (int i = 0; i < n_threads; i++) {
                if (args[i].t0[s] < t0) t0 = args[i].t0[s];
                if (args[i].t1[s] > t1) t1 = args[i].t1[s];
                ops += args[i].ops;
            }
            const double r = t1 > t0 ? ops / (t1 - t0) * 1e-9 : 0.0;
            if (r > best) best = r;
        }
    }
out:
    free(args);
    free(th);
    return best;
}

/* One round. Where two pinned threads still gave one thread's rate (3 runs in 24 on a Zen 5
 * guest), a second round read the same: the guest's two vCPUs ran at one core's rate for
 * seconds, as if the host had put them on one core's two hardware threads. Such a figure is the
 * machine's at that moment; bench proj and bench step measure around their runs. */
double nl_peak_measure(nl_peak_kind k, int n_threads, double seconds) {
    peak_loop f = loop_of(k, NULL);
    if (!f || n_threads < 1 || n_threads > 1024) return -1.0;
    if (!(seconds > 0.0)) seconds = 0.2;
    /* iterations for about `seconds` on one thread: grow until a run is long enough to time */
    long it = 1 << 12;
    double dt = 0.0;
    for (;;) {
        const double t0 = nl_now();
        f(it);
        dt = nl_now() - t0;
        if (dt >= seconds / (4 * PEAK_SLICES) || it > (1L << 40)) break;
        it *= 4;
    }
    if (dt > 0) it = (long)((double)it * seconds / PEAK_SLICES / dt) + 1;
    return peak_round(f, it, n_threads);
}

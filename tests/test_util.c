/* util: error slot, overflow-checked arithmetic, file reading, the CPU-feature probe, the hash,
 * splitmix64 and FNV-1a, the thread pool. */
#include "test.h"
#include "cpu/cpu.h"
#include "util/arena.h"
#include "util/hash.h"
#include "util/pool.h"
#include "util/rng.h"
#include "util/util.h"

/* 1 if the kernel's "flags" line of /proc/cpuinfo names every flag of the space-separated
 * list `want`; -1 when there is no such line (not Linux x86-64). An oracle independent of
 * cpuid: what the OS reports. */
static int cpuinfo_has(const char *want) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    char line[8192];
    int found = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            found = 1;
            break;
        }
    fclose(f);
    if (found < 0) return -1;
    char w[256];
    snprintf(w, sizeof w, "%s", want);
    for (char *t = strtok(w, " "); t; t = strtok(NULL, " ")) {
        char pat[64];
        snprintf(pat, sizeof pat, " %s ", t);
        char *nl = strchr(line, '\n');
        if (nl) *nl = ' ';
        if (!strstr(line, pat)) return 0;
    }
    return 1;
}

static void test_cpu(void) {
    CHECK(nl_cpu_has((nl_cpu_feature)-1) == 0 && nl_cpu_has(NL_CPU_N_FEATURES) == 0);
    /* each set includes the one below it */
    CHECK(!nl_cpu_has(NL_CPU_AVX512BF16) || nl_cpu_has(NL_CPU_AVX512));
    CHECK(!nl_cpu_has(NL_CPU_AVX512) || nl_cpu_has(NL_CPU_AVX2));
    for (int i = 0; i < 3; i++) CHECK(nl_cpu_has(NL_CPU_AVX2) == nl_cpu_has(NL_CPU_AVX2)); /* cached */
#if defined(__x86_64__)
    CHECK(nl_cpu_has(NL_CPU_NEON) == 0);
    int avx2 = cpuinfo_has("avx2 fma f16c"), avx512 = cpuinfo_has("avx2 fma f16c avx512f avx512bw avx512vl avx512dq");
    int bf16 = cpuinfo_has("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16");
    if (avx2 >= 0) {
        CHECKF(nl_cpu_has(NL_CPU_AVX2) == avx2, "avx2 probe %d, /proc/cpuinfo %d", nl_cpu_has(NL_CPU_AVX2), avx2);
        CHECKF(nl_cpu_has(NL_CPU_AVX512) == avx512, "avx512 probe %d, /proc/cpuinfo %d", nl_cpu_has(NL_CPU_AVX512),
               avx512);
        CHECKF(nl_cpu_has(NL_CPU_AVX512BF16) == bf16, "bf16 probe %d, /proc/cpuinfo %d", nl_cpu_has(NL_CPU_AVX512BF16),
               bf16);
        /* Linux lists amx_tile / amx_bf16 only where it enabled the tile state */
        const int amx = cpuinfo_has("amx_tile amx_bf16");
        CHECKF(nl_cpu_has(NL_CPU_AMX) == amx, "amx probe %d, /proc/cpuinfo %d", nl_cpu_has(NL_CPU_AMX), amx);
        const int intel = nl_t_file_has("/proc/cpuinfo", "GenuineIntel");
        CHECKF(nl_cpu_has(NL_CPU_INTEL) == intel, "intel probe %d, /proc/cpuinfo %d", nl_cpu_has(NL_CPU_INTEL), intel);
    }
#elif defined(__aarch64__)
    CHECK(nl_cpu_has(NL_CPU_NEON) == 1 && nl_cpu_has(NL_CPU_AVX2) == 0);
#endif
}

/* hash properties: determinism, seed and length count, streaming at any split, every bit flip,
 * a roughly uniform low nibble */
static void test_hash(void) {
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(nl_t_rand() * 127 + 128);
    uint64_t h = nl_hash64(buf, sizeof buf, 7);
    CHECK(h == nl_hash64(buf, sizeof buf, 7));
    CHECK(h != nl_hash64(buf, sizeof buf, 8));
    CHECK(h != nl_hash64(buf, sizeof buf - 1, 7));
    CHECK(nl_hash64("", 0, 0) != nl_hash64("\0", 1, 0)); /* length counts */
    /* streaming at arbitrary split points equals one-shot */
    int stream_ok = 1;
    for (int t = 0; t < 200; t++) {
        nl_hasher s;
        nl_hasher_init(&s, 7);
        size_t off = 0;
        while (off < sizeof buf) {
            size_t n = (size_t)((nl_t_rand() + 1) * 40);
            if (n > sizeof buf - off) n = sizeof buf - off;
            nl_hasher_update(&s, buf + off, n);
            off += n;
        }
        if (nl_hasher_final(&s) != h) stream_ok = 0;
    }
    CHECK(stream_ok);
    /* every single-bit flip changes the hash, at every length class (tail bytes included) */
    int flips_ok = 1;
    for (size_t len = 1; len <= 77; len += 19) {
        uint64_t base = nl_hash64(buf, len, 1);
        for (size_t bit = 0; bit < len * 8; bit++) {
            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            if (nl_hash64(buf, len, 1) == base) flips_ok = 0;
            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        }
    }
    CHECK(flips_ok);
    /* distribution: low byte of hashes of consecutive integers is roughly uniform */
    int bucket[16] = {0};
    for (uint32_t i = 0; i < 16000; i++) bucket[nl_hash64(&i, 4, 0) & 15]++;
    int uniform = 1;
    for (int b = 0; b < 16; b++)
        if (bucket[b] < 850 || bucket[b] > 1150) uniform = 0;
    CHECK(uniform);
}

/* splitmix64 (published reference values of the stream of seed 0), the counter RNG as the same
 * stream (value c of key k = output c + 1 of the stream started at k), the FNV-1a variant */
static void test_splitmix_fnv(void) {
    uint64_t st = 0;
    CHECK(nl_splitmix64(&st) == 0xE220A8397B1DCDAFULL && st == NL_RNG_GAMMA);
    CHECK(nl_splitmix64(&st) == 0x6E789E6AA1B965F4ULL);
    CHECK(nl_splitmix64(&st) == 0x06C45D188009454FULL);
    const uint64_t key = 0x0123456789ABCDEFULL;
    st = key;
    int same = 1;
    for (uint64_t c = 0; c < 100; c++) same &= nl_splitmix64(&st) == nl_rng_u64(key, c);
    CHECK(same);
    /* the basis is 1469598103934665603, not FNV's published 14695981039346656037 (see hash.h) */
    CHECK(nl_fnv1a("", 0) == 1469598103934665603ULL);
    CHECK(nl_fnv1a("a", 1) == 0x44BD8AD473CD9906ULL);
    CHECK(nl_fnv1a("foobar", 6) == 0x88FAD7C0A8FF07F2ULL);
}

/* The arena: sizes rounded up to 64 bytes (malloc's alignment at least), LIFO release to a mark reuses the same bytes
 * (also across a block boundary), an allocation larger than a block gets its own block, free empties it. */
static void test_arena(void) {
    nl_arena a = {0};
    char *p0 = nl_arena_alloc(&a, 10);
    CHECK(p0 && ((uintptr_t)p0 & 15) == 0);
    nl_arena_mark m = nl_arena_top(&a);
    char *p1 = nl_arena_alloc(&a, 1000), *p2 = nl_arena_alloc(&a, 1);
    CHECK(p1 == p0 + 64 && p2 == p1 + 1024);
    nl_arena_release(&a, m);
    CHECK(nl_arena_alloc(&a, 5) == p1);
    /* a block's worth more: a second block; release to m and the first block's top is back */
    char *big = nl_arena_alloc(&a, (size_t)300 << 20);
    CHECK(big != NULL && (big < p0 || big > p0 + ((size_t)256 << 20)));
    big[((size_t)300 << 20) - 1] = 1;
    nl_arena_release(&a, m);
    CHECK(nl_arena_alloc(&a, 64) == p1);
    CHECK(nl_arena_alloc(&a, (size_t)299 << 20) == big); /* the emptied block is reused */
    nl_arena_free(&a);
    CHECK(a.first == NULL && a.cur == NULL);
    CHECK(nl_arena_alloc(&a, 1) != NULL);
    nl_arena_free(&a);
}

/* the pool: every task runs exactly once, with its n_tasks, whatever the pool size and task
 * count (fewer tasks than workers, many more, one, none), job after job */
typedef struct {
    int *hits;
    int n_tasks, bad;
} pool_job;
static void count_task(void *arg, int task, int n_tasks) {
    pool_job *j = arg;
    if (n_tasks != j->n_tasks) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
    j->hits[task]++; /* disjoint: each task writes its own slot */
}
static void test_pool(void) {
    nl_pool_free(NULL);
    int hits[1000];
    for (int nt = 1; nt <= 4; nt++) {
        nl_pool *p = nl_pool_new(nt);
        CHECK(p != NULL && nl_pool_size(p) == nt);
        if (!p) continue;
        static const int counts[] = {0, 1, 2, 3, 7, 64, 1000};
        int ok = 1;
        for (int rep = 0; rep < 50; rep++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                pool_job j = {hits, counts[c], 0};
                memset(hits, 0, sizeof hits);
                nl_pool_run(p, counts[c], count_task, &j);
                for (int i = 0; i < counts[c]; i++) ok &= hits[i] == 1;
                ok &= !j.bad;
            }
        CHECKF(ok, "pool of %d", nt);
        nl_pool_free(p);
    }
    nl_pool *p = nl_pool_new(0); /* < 1: one thread, the caller */
    CHECK(p != NULL && nl_pool_size(p) == 1);
    nl_pool_free(p);
}

int main(void) {
    test_cpu();
    test_pool();
    test_splitmix_fnv();
    test_arena();
    test_hash();
    CHECK(nl_err("x %d", 3) == -1);
    CHECK(strcmp(nl_last_error(), "x 3") == 0);
    nl_err_prefix("file.gguf");
    CHECK(strcmp(nl_last_error(), "file.gguf: x 3") == 0);
    uint64_t r;
    CHECK(nl_mul_ok(1ull << 32, 1ull << 31, &r) == 0 && r == (1ull << 63));
    CHECK(nl_mul_ok(1ull << 32, 1ull << 32, &r) == -1);
    CHECK(nl_add_ok(UINT64_MAX, 1, &r) == -1);
    size_t len;
    CHECK(nl_read_file("/nonexistent/nightlora", &len) == NULL);
    CHECK(strstr(nl_last_error(), "/nonexistent/nightlora") != NULL);
    return nl_t_done();
}

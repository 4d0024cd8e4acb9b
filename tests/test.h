/* Minimal test harness: CHECK records a failure and continues; the program prints
 * "N passed, M failed" and exits non-zero on any failure. */
#ifndef NL_TEST_H
#define NL_TEST_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nl_t_pass, nl_t_fail;

/* The FP32 reference service on one thread (precision auto), for tests of the math that
 * compare with exact results (the library's own default is the host backend on every core).
 * Needs proj/proj.h. */
#define NL_T_REF_CFG (&(nl_proj_config){.backend = "ref", .n_threads = 1})

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (cond) nl_t_pass++;                                                                                         \
        else {                                                                                                         \
            nl_t_fail++;                                                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
        }                                                                                                              \
    } while (0)

#define CHECKF(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (cond) nl_t_pass++;                                                                                         \
        else {                                                                                                         \
            nl_t_fail++;                                                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                                          \
    CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a), (double)(b), (double)(tol))

static inline int nl_t_done(void) {
    printf("%d passed, %d failed\n", nl_t_pass, nl_t_fail);
    return nl_t_fail ? 1 : 0;
}

/* Deterministic test RNG (xorshift64*), uniform in [-1, 1). */
/* 1 when NL_TEST_SMALL is set and not "0" (CI's qemu runs, .ci/aarch64.sh): the heaviest tests
 * take their smaller cases there (each says which). */
static inline int nl_t_small(void) {
    const char *s = getenv("NL_TEST_SMALL");
    return s && *s && strcmp(s, "0") != 0;
}

static unsigned long long nl_t_rng_state = 0x9E3779B97F4A7C15ULL;
static inline double nl_t_rand(void) {
    unsigned long long x = nl_t_rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    nl_t_rng_state = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
/* Numeric helpers shared by the node tests: p[i] = amp · rand in [-amp, amp); a double copy
 * (malloc'd); max |a − b| / max(max |b|, floor), a scale-aware error. */
#include <stdint.h>
static inline void nl_t_fill(float *p, int64_t n, double amp) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)(amp * nl_t_rand());
}
static inline double *nl_t_to_d(const float *p, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = p[i];
    return d;
}
static inline double nl_t_rel_err(const float *a, const double *b, int64_t n, double floor) {
    double e = 0, m = floor;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > e) e = d;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return e / m;
}

/* Small file and time helpers shared by the tests that run training or the CLI. */
#include <errno.h>
#include <time.h>
#include "util/util.h"

/* Whole file, NUL-terminated (NULL if unreadable); *len (may be NULL) gets its size. */
static inline char *nl_t_slurp(const char *path, size_t *len) {
    size_t l = 0;
    char *b = nl_read_file(path, &l);
    if (len) *len = l;
    return b;
}
/* 1 when both files exist and hold the same bytes. */
static inline int nl_t_same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = nl_t_slurp(a, &la), *y = nl_t_slurp(b, &lb);
    int r = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return r;
}
static inline int nl_t_file_has(const char *path, const char *needle) {
    char *b = nl_t_slurp(path, NULL);
    int r = b && strstr(b, needle) != NULL;
    free(b);
    return r;
}
/* Complete lines ('\n'-terminated) in a file; 0 if unreadable. */
static inline int nl_t_count_lines(const char *path) {
    char *b = nl_t_slurp(path, NULL);
    int n = 0;
    for (char *q = b; q && *q; q++) n += *q == '\n';
    free(b);
    return n;
}
/* Start argv (argv[0] = the program) with stderr to err_path and stdout to out_path (NULL:
 * /dev/null); nl_t_wait: its exit status, or 128 + the signal that ended it; nl_t_run: both. */
#include <sys/wait.h>
#include <unistd.h>
static inline pid_t nl_t_spawn(const char *const *argv, const char *err_path, const char *out_path) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(err_path, "w", stderr) || !freopen(out_path ? out_path : "/dev/null", "w", stdout)) _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}
static inline int nl_t_wait(pid_t pid) {
    int st;
    if (pid < 0) return -1;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
static inline int nl_t_run(const char *const *argv, const char *err_path, const char *out_path) {
    return nl_t_wait(nl_t_spawn(argv, err_path, out_path));
}
/* A command line built up for nl_t_run (the tests that drive the CLI binary): nl_t_arg
 * appends a string (kept by pointer), nl_t_argi a flag and its number (kept in the struct),
 * nl_t_set replaces the value after a flag already there; v stays NULL-terminated. */
typedef struct {
    const char *v[96];
    int n;
    char num[16][24];
    int nn;
} nl_t_args;
static inline void nl_t_arg(nl_t_args *a, const char *s) {
    if (a->n < 94) a->v[a->n++] = s;
    a->v[a->n] = NULL;
}
static inline void nl_t_argi(nl_t_args *a, const char *flag, long long v) {
    if (a->nn >= 16) return;
    nl_t_arg(a, flag);
    snprintf(a->num[a->nn], sizeof a->num[0], "%lld", v);
    nl_t_arg(a, a->num[a->nn++]);
}
static inline void nl_t_set(nl_t_args *a, const char *flag, const char *value) {
    for (int i = 0; i + 1 < a->n; i++)
        if (!strcmp(a->v[i], flag)) a->v[i + 1] = value;
}
static inline int nl_t_args_run(const nl_t_args *a, const char *err_path) { return nl_t_run(a->v, err_path, NULL); }
#ifdef NL_CLI
/* `nightlora train` on a tiny model the way the CLI tests run it: rank 4, dropout 0.1,
 * 48-token batches, the host backend on 2 threads, no pacing; the caller adds the rest. */
static inline void nl_t_train_args(nl_t_args *a, const char *model, const char *data, const char *out) {
    a->n = a->nn = 0;
    static const char *const fixed[] = {
        "--batch-tokens", "48",        "--rank", "4",         "--dropout", "0.1", "--backend",
        "host",           "--threads", "2",      "--thermal", "off",       NULL};
    nl_t_arg(a, NL_CLI);
    nl_t_arg(a, "train");
    nl_t_arg(a, "--model");
    nl_t_arg(a, model);
    nl_t_arg(a, "--data");
    nl_t_arg(a, data);
    nl_t_arg(a, "--out");
    nl_t_arg(a, out);
    for (const char *const *f = fixed; *f; f++) nl_t_arg(a, *f);
}
#endif

/* A fresh scratch directory /tmp/nl_<name>_<pid> (an old one removed) into buf; 0 or -1. */
#include <unistd.h>
static inline int nl_t_tmpdir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "/tmp/nl_%s_%d", name, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", buf, buf);
    return system(cmd) ? -1 : 0;
}
/* At the end of a test: remove the directory when every check passed, else keep it and say where. */
static inline void nl_t_tmpdir_done(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (nl_t_fail) fprintf(stderr, "files kept in %s\n", dir);
    else if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
}
/* Sleep s seconds, resuming after signals. */
static inline void nl_t_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- random resident weights (test_host, test_amx) ---- */
#include "model/quant.h"

/* A random half with exponent field in [emin, emax] (normal, finite), random sign. */
static inline uint16_t nl_t_rand_f16(int emin, int emax) {
    double r = nl_t_rand();
    unsigned e = (unsigned)(emin + (int)((r + 1) * 0.5 * (emax - emin + 1)));
    if (e > (unsigned)emax) e = (unsigned)emax;
    unsigned m = (unsigned)((nl_t_rand() + 1) * 512) & 1023;
    unsigned s = nl_t_rand() < 0 ? 0x8000u : 0;
    return (uint16_t)(s | (e << 10) | m);
}

/* N rows of K elements of `type`: F16 in ±[2^-6, 4) with some zeros; Q8_0/Q4_0 with block
 * scales in ±[2^-10, 2^-5); Q4_1/Q4_K/Q6_K random bytes with sane scales; any other type quantized
 * from values in [-1, 1) by its from_float. */
static inline void nl_t_rand_weight(int type, int N, int K, uint8_t *w) {
    size_t n = nl_row_bytes(type, K) * (size_t)N;
    if (type == NL_TYPE_F16) {
        for (size_t i = 0; i < n / 2; i++) {
            uint16_t h = (i % 29 == 3) ? 0 : nl_t_rand_f16(9, 16); /* ±[2^-6, 4) */
            memcpy(w + 2 * i, &h, 2);
        }
    } else if (type == NL_TYPE_Q8_0 || type == NL_TYPE_Q4_0) {
        size_t bb = type == NL_TYPE_Q8_0 ? 34 : 18;
        for (size_t b = 0; b < n / bb; b++) {
            uint16_t d = nl_t_rand_f16(5, 9); /* ±[2^-10, 2^-5) */
            memcpy(w + b * bb, &d, 2);
            for (size_t j = 2; j < bb; j++)
                w[b * bb + j] = type == NL_TYPE_Q8_0 ? (uint8_t)(int8_t)(int)(nl_t_rand() * 127.5)
                                                     : (uint8_t)((nl_t_rand() + 1) * 128);
        }
    } else if (type == NL_TYPE_Q4_1) { /* d >= 0 as the quantizer makes it, min of either sign */
        for (size_t b = 0; b < n / 20; b++) {
            uint16_t d = nl_t_rand_f16(5, 9) & 0x7fff, m = nl_t_rand_f16(7, 11);
            memcpy(w + b * 20, &d, 2);
            memcpy(w + b * 20 + 2, &m, 2);
            for (size_t j = 4; j < 20; j++) w[b * 20 + j] = (uint8_t)((nl_t_rand() + 1) * 128);
        }
    } else if (type == NL_TYPE_Q5_0) { /* random qh and nibbles, a sane f16 d first */
        for (size_t b = 0; b < n / 22; b++) {
            uint16_t d = nl_t_rand_f16(5, 9); /* ±[2^-10, 2^-5) */
            memcpy(w + b * 22, &d, 2);
            for (size_t j = 2; j < 22; j++) w[b * 22 + j] = (uint8_t)((nl_t_rand() + 1) * 128);
        }
    } else if (type == NL_TYPE_Q6_K) { /* random bytes, then a sane f16 d at byte 208 */
        for (size_t i = 0; i < n; i++) w[i] = (uint8_t)((nl_t_rand() + 1) * 128);
        for (size_t b = 0; b < n / 210; b++) {
            uint16_t d = nl_t_rand_f16(5, 9);
            memcpy(w + b * 210 + 208, &d, 2);
        }
    } else if (type == NL_TYPE_Q4_K) {
        for (size_t b = 0; b < n / 144; b++) {
            uint16_t d = nl_t_rand_f16(5, 9) & 0x7fff, dm = nl_t_rand_f16(5, 9) & 0x7fff;
            memcpy(w + b * 144, &d, 2);
            memcpy(w + b * 144 + 2, &dm, 2);
            for (size_t j = 4; j < 144; j++) w[b * 144 + j] = (uint8_t)((nl_t_rand() + 1) * 128);
        }
    } else { /* any other type with a quantizer: values in [-1, 1) */
        float *f = malloc(sizeof(float) * (size_t)K);
        for (int r = 0; r < N && f; r++) {
            for (int k = 0; k < K; k++) f[k] = (float)nl_t_rand();
            nl_type_get(type)->from_float(f, w + nl_row_bytes(type, K) * (size_t)r, K);
        }
        free(f);
    }
}

/* f rounded to BF16 (nearest even; finite f), as a float: the effective weight of bf16 compute. */
static inline float nl_t_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
/* A real model file tools/fetch-models.sh [target] caches in ${NL_MODEL_CACHE:-$HOME/.cache/nightlora}:
 * 1 with its path in buf, or 0 after printing why the caller's checks are skipped. */
static inline int nl_t_cached_model(char *buf, size_t cap, const char *file, const char *target, const char *what) {
    const char *dir = getenv("NL_MODEL_CACHE"), *home = getenv("HOME");
    if (dir && *dir) snprintf(buf, cap, "%s/%s", dir, file);
    else snprintf(buf, cap, "%s/.cache/nightlora/%s", home ? home : "", file);
    if (access(buf, R_OK) == 0) return 1;
    printf("SKIP %s: %s not found (run tools/fetch-models.sh%s%s; it caches the model in "
           "${NL_MODEL_CACHE:-$HOME/.cache/nightlora})\n",
           what, buf, *target ? " " : "", target);
    return 0;
}
/* The real pretrained model tools/fetch-models.sh caches (SmolLM2-135M-Instruct, Q4_1). */
#define NL_T_REAL_MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"
static inline int nl_t_real_model(char *buf, size_t cap, const char *what) {
    return nl_t_cached_model(buf, cap, NL_T_REAL_MODEL, "", what);
}
/* Gemma 3 270M, Q4_K_M (tools/fetch-models.sh gemma3). */
#define NL_T_GEMMA3_MODEL "gemma-3-270m-q4_k_m.gguf"
/* Copy a GGUF model with a head of its own: output.weight = a copy of token_embd.weight (the
 * synthetic models tie them, and train refuses an adapter on a tied head). 0 ok. */
#include "model/gguf.h"
static inline int nl_t_untie(const char *in, const char *out) {
    nl_gguf *g = nl_gguf_open(in);
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = g && w ? nl_gguf_copy_kvs(w, g) : -1;
    for (int64_t i = 0; rc == 0 && i < g->n_tensors; i++)
        rc = nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                                g->tensors[i].data, true);
    const nl_gguf_tensor *te = rc == 0 ? nl_gguf_tensor_find(g, "token_embd.weight") : NULL;
    rc = te ? nl_gguf_add_tensor(w, "output.weight", te->type, 2, te->ne, te->data, true) : -1;
    if (rc == 0) rc = nl_gguf_write(w, out);
    if (w) nl_gguf_writer_free(w);
    if (g) nl_gguf_close(g);
    return rc;
}

#endif

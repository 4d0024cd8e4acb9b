/* proj/host: the `host` projection backend — resident F16/Q8_0/Q4_0 (and Q4_1/Q5_0/Q4_K/Q6_K) weights used in
 * place, CPU SIMD kernels chosen at run time, output panels split over an nl_pool.
 * Tiling, packing and the thread split live here; the arithmetic lives in kernels_*.c
 * (contract: kernels.h). In the amx / amx-emu compute modes the products go to the tile
 * kernels instead (amx.h: their own packing, the same dequantizer and thread pool). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "model/model.h"
#include "proj/host.h"
#include "proj/host_int8.h"
#include "util/pool.h"
#include "util/util.h"

enum { MODE_AUTO = -1, MODE_F32 = 0, MODE_BF16 = 1, MODE_AMX = 2, MODE_AMX_EMU = 3, MODE_SME = 4, MODE_INT8 = 5 };

int nl_proj_host_cpu_has(const char *name) {
    if (!name) return 0;
    if (!strcmp(name, "scalar")) return 1;
    if (!strcmp(name, "avx2")) return nl_cpu_has(NL_CPU_AVX2);
    if (!strcmp(name, "avx512")) return nl_cpu_has(NL_CPU_AVX512);
    if (!strcmp(name, "avx512bf16")) return nl_cpu_has(NL_CPU_AVX512BF16);
    if (!strcmp(name, "neon")) return nl_cpu_has(NL_CPU_NEON);
    if (!strcmp(name, "neonbf16")) return nl_cpu_has(NL_CPU_ARM_BF16);
    if (!strcmp(name, "amx")) return nl_amx_available(NULL, 0);
    return 0;
}

/* "auto": the row in use (cpu/dispatch.c), else the named row where this CPU runs it, or NULL */
static const nl_host_kernels *kernels_by_name(const char *name) {
    return !strcmp(name, "auto") ? nl_cpu_kernels() : nl_cpu_kernels_find(name);
}

static int parse_mode(const char *mode) {
    if (!mode || !strcmp(mode, "auto")) return MODE_AUTO;
    if (!strcmp(mode, "f32")) return MODE_F32;
    if (!strcmp(mode, "bf16")) return MODE_BF16;
    if (!strcmp(mode, "amx")) return MODE_AMX;
    if (!strcmp(mode, "amx-emu")) return MODE_AMX_EMU;
    if (!strcmp(mode, "sme")) return MODE_SME;
    if (!strcmp(mode, "int8")) return MODE_INT8;
    return -2;
}

#define MODES "f32, bf16, amx, amx-emu, sme, int8 or auto"

/* 1 if this CPU has BF16 dot products for a row's gemm_bf16_* (x86 AVX512_BF16, Arm FEAT_BF16) */
static int cpu_bf16(void) { return nl_cpu_has(NL_CPU_AVX512BF16) || nl_cpu_has(NL_CPU_ARM_BF16); }

/* 1 if the row's bf16 entries run here */
static int row_bf16(const nl_host_kernels *ks) { return ks->has_bf16 && cpu_bf16(); }

/* -1 + nl_err when mode m cannot run here. */
static int mode_check(int m) {
    char why[192];
    if (m == MODE_BF16 && !cpu_bf16())
        return nl_err("host: compute bf16 needs AVX512_BF16 (x86) or BF16 (Arm), which this CPU lacks");
    if (m == MODE_AMX && !nl_amx_available(why, sizeof why))
        return nl_err("host: compute amx: %s (--compute amx-emu runs the same kernels emulated)", why);
    if (m == MODE_SME && !nl_sme_available(why, sizeof why)) return nl_err("host: compute sme: %s", why);
    return 0;
}

static const char *const host_computes[] = {"f32", "bf16", "amx", "amx-emu", "sme", "int8", NULL};

/* ---- context and thread pool ---- */

typedef struct {
    float *B;     /* KC × NP packed f32 panel */
    uint32_t *Bp; /* KC/2 × NP packed bf16 pairs */
    float *row;   /* 2 × KC floats of decode scratch */
    float *tile;  /* NP × KC rows of W before the FWD transpose (f32 or BF16) */
    void *mem;
} scratch;

typedef struct host_ctx host_ctx;
typedef void (*task_fn)(host_ctx *c, int tid);

struct host_ctx {
    const nl_host_kernels *ks;
    int compute; /* MODE_*: AUTO picks by capability (mode_of) */
    int nth;
    scratch *scr;     /* [nth]: task tid uses scr[tid] */
    nl_pool *pool;    /* nth threads (the caller is one of them) */
    nl_amx_ctx *amx;  /* the tile kernels' driver, made at the first AMX request */
    nl_host_int8 *i8; /* the int8 FWD's scratch, made at the first int8 request */
    task_fn fn;
    /* the job */
    const nl_proj_weight *w;
    nl_dir dir;
    const float *x;
    int T;
    float *y;
    int bf16;
    uint16_t *xb; /* T×ldx BF16 copy of the activations (bf16 compute) */
    int64_t ldx;  /* its row stride: K (FWD) or N (BWD) rounded up to even, the pad zero */
    size_t xb_cap;
};

static void pool_task(void *arg, int task, int n_tasks) {
    (void)n_tasks;
    host_ctx *c = arg;
    c->fn(c, task);
}

/* fn(c, tid) for tid < nth, task tid on pool worker tid (so on its own scratch). */
static void run_all(host_ctx *c, task_fn fn) {
    c->fn = fn;
    nl_pool_run(c->pool, c->nth, pool_task, c);
}

static void host_free(void *ctx) {
    host_ctx *c = ctx;
    if (!c) return;
    if (c->pool) nl_pool_free(c->pool);
    nl_amx_free(c->amx);
    nl_host_int8_free(c->i8);
    if (c->scr)
        for (int i = 0; i < c->nth; i++) free(c->scr[i].mem);
    free(c->scr);
    free(c->xb);
    free(c);
}

static int host_init(void **out, int n_threads, const char *compute) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) return nl_err("host: n_threads %d out of range (1..256)", n_threads);
    host_ctx *c = nl_calloc(1, sizeof *c);
    if (!c) return -1;
    c->ks = kernels_by_name("auto");
    c->compute = MODE_AUTO;
    c->nth = n_threads;
    c->scr = nl_calloc((size_t)n_threads, sizeof *c->scr);
    if (!c->scr) goto fail;
    const size_t nB = (size_t)NL_HOST_KC * NL_HOST_NP, nBp = nB / 2;
    const size_t total = (2 * nB + nBp + 3 * NL_HOST_KC + 64) * 4;
    for (int i = 0; i < n_threads; i++) {
        scratch *s = &c->scr[i];
        s->mem = aligned_alloc(64, (total + 63) / 64 * 64);
        if (!s->mem) {
            nl_err("host: out of memory (%zu bytes of scratch)", total);
            goto fail;
        }
        memset(s->mem, 0, total); /* the panels' unread columns hold zeros until written */
        float *f = s->mem;
        s->B = f;
        s->Bp = (uint32_t *)(f + nB);
        s->row = f + nB + nBp;
        s->tile = s->row + 3 * NL_HOST_KC + 48; /* stays 64-byte aligned */
    }
    c->pool = nl_pool_new(n_threads);
    if (!c->pool) goto fail;
    if (compute && nl_proj_host_configure(c, NULL, compute)) goto fail;
    *out = c;
    return 0;
fail:
    host_free(c);
    return -1;
}

int nl_proj_host_configure(void *ctx, const char *kernels, const char *compute) {
    host_ctx *c = ctx;
    if (!c) return nl_err("host: configure: no context");
    const nl_host_kernels *ks = c->ks;
    if (kernels) {
        ks = kernels_by_name(kernels);
        if (!ks) return nl_err("host: kernel set '%s' is unknown or not supported by this CPU", kernels);
    }
    int m = c->compute;
    if (compute) {
        m = parse_mode(compute);
        if (m == -2) return nl_err("host: unknown compute mode '%s' (expected " MODES ")", compute);
    }
    if (mode_check(m)) return -1; /* first: what the CPU lacks */
    if (m == MODE_BF16 && !row_bf16(ks))
        return nl_err("host: compute bf16 needs the avx512 kernel set on a CPU with AVX512_BF16 (or neonbf16 on Arm)");
    c->ks = ks;
    c->compute = m;
    return 0;
}

const char *nl_proj_host_kernels(const void *ctx) { return ctx ? ((const host_ctx *)ctx)->ks->name : "none"; }

/* The compute mode a context runs now. auto, by capability (deterministic for a machine):
 *   NL_AMX=emulate in the environment: amx-emu (the tile kernels on the emulator: tests, CI);
 *   AMX usable (CPUID, OS, permission) and NL_AMX not "off": amx;
 *   AVX512_BF16 with the avx512 set: bf16, except on Intel CPUs, whose FP32 FMA path measured
 *   faster than VDPBF16PS (a Sapphire Rapids-class Xeon: 85 vs 67 tok/s a qwen3-0.6b step;
 *   on AMD Zen 4 bf16 is the faster, 118 vs ~100);
 *   the neonbf16 set (an Arm core with BF16): bf16 (BFMMLA; not yet timed on a real core);
 *   else f32. */
static int mode_of(const host_ctx *c) {
    const int m = c->compute;
    const int can_bf16 = row_bf16(c->ks);
    if (m == MODE_AUTO) {
        const char *env = getenv("NL_AMX");
        if (env && !strcmp(env, "emulate")) return MODE_AMX_EMU;
        if (!(env && !strcmp(env, "off")) && nl_amx_available(NULL, 0)) return MODE_AMX;
        return can_bf16 && !nl_cpu_has(NL_CPU_INTEL) ? MODE_BF16 : MODE_F32;
    }
    if (m == MODE_BF16 && !can_bf16) return MODE_F32;
    return m;
}

/* ---- int8 compute (host_int8.c): the FWD of integer-quantized weights in int8; everything
 * else (BWD, F16/F32 weights) as bf16 compute where the CPU has it, else f32 ---- */
static int int8_float_bf16(const void *ctx) { return row_bf16(((const host_ctx *)ctx)->ks); }

/* the int8 row: the scalar model when the scalar kernel set was asked for, else the best */
static const nl_i8_kernels *int8_row(const host_ctx *c) {
    return c->ks == &nl_host_kernels_scalar ? &nl_i8_kernels_scalar : nl_cpu_i8_kernels(NULL);
}

static int int8_describe(const host_ctx *c, char *buf, size_t cap) {
    return snprintf(buf, cap,
                    "int8 compute (%s int8 FWD for q8_0/q4_0/q5_0/q4_1/q4_k/q6_k, %s for the rest, %s kernels)",
                    int8_row(c)->name, int8_float_bf16(c) ? "bf16" : "f32", c->ks->name);
}

static int int8_takes(int mode, const nl_proj_weight *w, nl_dir dir) {
    return mode == MODE_INT8 && dir == NL_FWD && nl_host_int8_type(w->type);
}

static int int8_run(host_ctx *c, const nl_proj_weight *w, const float *x, int T, float *y) {
    if (!c->i8 && !(c->i8 = nl_host_int8_new(c->nth))) return -1;
    return nl_host_int8_run(c->i8, int8_row(c), c->pool, w, x, T, y);
}

static int amx_mode(int m) { return m == MODE_AMX || m == MODE_AMX_EMU || m == MODE_SME; }

/* the tile operations of a tile mode (amx.h); sme and amx are refused where they cannot run */
static const nl_amx_tiles *mode_tiles(int m) {
    if (m == MODE_AMX_EMU) return &nl_amx_tiles_emu;
    return nl_amx_tiles_of(m == MODE_SME ? "sme" : "amx");
}

/* The tile kernels take every type but F32: a weight kept in F32 was asked for FP32 products
 * (its planner bound is 1e-5), which the FP32 vector kernels give. */
static int amx_takes(int mode, const nl_proj_weight *w) { return amx_mode(mode) && w->type != NL_TYPE_F32; }

/* The weights bf16 compute multiplies as BF16: every block type (nl_host_type_bf16) and F16 but
 * for the recurrent class. A recurrent F16 weight (the auto policy's type for the class: its
 * products kept to ~F16 accuracy) stays on the FP32 path: on AVX512_BF16 a product with F16
 * accuracy needs the split-BF16 form of the tile kernels (x_hi·w_hi + x_lo·w_hi + x_hi·w_lo),
 * 3 MACs per element where VDPBF16PS does 2 per FP32 FMA's 1, so 1.5× the FP32 path's work
 * (Zen 4: the FP32 path runs F16 at 0.74-0.84 of the FP32 peak, 0.37-0.42 of the BF16 one;
 * a split could reach 0.33 of it at best). */
static int bf16_weight(const nl_proj_weight *w) {
    return nl_host_type_bf16(w->type) || (w->type == NL_TYPE_F16 && w->cls != NL_CLASS_RECURRENT);
}

/* 1 if mode m multiplies w on the bf16 kernels (bf16 compute, or int8's float path) */
static int bf16_takes(const host_ctx *c, int m, const nl_proj_weight *w) {
    return (m == MODE_BF16 || (m == MODE_INT8 && int8_float_bf16(c))) && bf16_weight(w);
}

const char *nl_proj_host_compute(const void *ctx) {
    if (!ctx) return "f32";
    static const char *const names[] = {"f32", "bf16", "amx", "amx-emu", "sme", "int8"};
    return names[mode_of(ctx)];
}

int nl_proj_host_describe(const void *ctx, char *buf, size_t cap) {
    const host_ctx *c = ctx;
    if (!c) return snprintf(buf, cap, "no host context");
    const int m = mode_of(c);
    if (amx_mode(m)) {
        const char *e = m == MODE_AMX_EMU ? " (emulated)" : "";
        return snprintf(buf, cap, "%s-bf16%s for attn/mlp/head, split-bf16%s for recurrent, %s f32 for F32 weights",
                        m == MODE_SME ? "sme" : "amx", e, e, c->ks->name);
    }
    if (m == MODE_INT8) return int8_describe(c, buf, cap);
    /* bf16: "BF16 weights" since FWD multiplies by bf16(w) as BWD does (before: the integer q and
     * the scale in FP32), so a run committed by an older build is not resumed as the same kernels */
    if (m == MODE_BF16) return snprintf(buf, cap, "bf16 compute (%s kernels, BF16 weights)", c->ks->name);
    return snprintf(buf, cap, "f32 compute (%s kernels)", c->ks->name);
}

static int host_describe(void *ctx, char *buf, size_t cap) { return nl_proj_host_describe(ctx, buf, cap); }

double nl_proj_host_rel_tol_for(const void *ctx, const nl_proj_weight *w, int64_t n_red) {
    const double f32 = 2e-6 * (1.0 + log2((double)(n_red > 1 ? n_red : 1)));
    if (!ctx) return f32;
    const int m = mode_of(ctx);
    if (amx_takes(m, w)) return w->cls == NL_CLASS_RECURRENT ? 1e-4 + f32 : 1e-2;
    if (m == MODE_INT8 && nl_host_int8_type(w->type)) return 3e-2;
    if (bf16_takes(ctx, m, w)) return 1e-2;
    return f32;
}

double nl_proj_host_rel_tol(const void *ctx, int type, int64_t n_red) {
    nl_proj_weight w = {.type = type, .cls = NL_CLASS_ATTN};
    return nl_proj_host_rel_tol_for(ctx, &w, n_red);
}

/* ---- weights ---- */

static int blck_of(int type) {
    const nl_type_traits *tr = nl_type_get(type);
    return tr ? tr->blck : 1;
}

static size_t row_bytes(int type, int64_t k) { return nl_row_bytes(type, k); }

static int host_supports(void *ctx, const nl_proj_weight *w, nl_dir dir, int T) {
    (void)ctx;
    if (!w || !w->data || T < 1 || (dir != NL_FWD && dir != NL_BWD)) return 0;
    if (!nl_host_type_ok(w->type)) return 0;
    if (w->n_in < 1 || w->n_out < 1 || w->n_in > (1 << 30) || w->n_out > (1 << 30)) return 0;
    return w->n_in % blck_of(w->type) == 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void nl_host_transpose32(const nl_host_kernels *ks, const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd,
                         int rows, int cols) {
    if (ks->transpose32) {
        ks->transpose32(src, lds, dst, ldd, rows, cols);
        return;
    }
    for (int r = 0; r < rows; r++)
        for (int cc = 0; cc < cols; cc++) dst[(int64_t)cc * ldd + r] = src[(int64_t)r * lds + cc];
}

/* The part of the output thread tid of the request computes: the output panels (NL_HOST_NP
 * columns of `cols`) [p0, p1) of the rows [r0, r1). With at least as many panels as threads,
 * a share of the panels and every row; with fewer (a 16-column projection), every panel and a
 * share of the rows, in 6-row units (each thread packs the tiles itself). Threads split the
 * output, never the reduction: an element's chain is the same whichever thread computes it. */
static void thread_part(const host_ctx *c, int tid, int64_t cols, int64_t *p0, int64_t *p1, int *r0, int *r1) {
    const int64_t np = (cols + NL_HOST_NP - 1) / NL_HOST_NP;
    if (np >= c->nth) {
        *p0 = np * tid / c->nth;
        *p1 = np * (tid + 1) / c->nth;
        *r0 = 0;
        *r1 = c->T;
        return;
    }
    const int64_t units = (c->T + 5) / 6;
    *p0 = 0;
    *p1 = np;
    *r0 = (int)min64(c->T, 6 * (units * tid / c->nth));
    *r1 = (int)min64(c->T, 6 * (units * (tid + 1) / c->nth));
    if (*r0 >= *r1) *p1 = 0; /* no rows: nothing to pack */
}

/* The W bytes a later tile reads, touched ahead (into L2) while the current tile computes: the
 * packs read W straight from memory, rows far apart, and waited for it (BWD: 16% of the time at
 * T=512). The product runs over row slices of the activations (each row is computed alone, so the
 * bits are those of one call) and a share of the next tile's rows is prefetched before each. */
typedef struct {
    const uint8_t *p; /* the first row's first byte */
    size_t rb, len;   /* row stride, bytes per row */
    int nr, done;     /* rows, rows prefetched */
} ahead;

static void ahead_set(ahead *a, const nl_proj_weight *w, int64_t r0, int64_t nr, int64_t e0, int64_t ne) {
    const int64_t bl = blck_of(w->type);
    const int64_t e1 = (e0 + ne + bl - 1) / bl * bl;
    e0 = e0 / bl * bl;
    a->rb = row_bytes(w->type, w->n_in);
    a->p = (const uint8_t *)w->data + (size_t)r0 * a->rb + row_bytes(w->type, e0);
    a->len = row_bytes(w->type, e1) - row_bytes(w->type, e0);
    a->nr = (int)nr;
    a->done = 0;
}

static void ahead_to(ahead *a, int upto) {
    for (; a->done < upto && a->done < a->nr; a->done++) {
        const uint8_t *r = a->p + (size_t)a->done * a->rb;
        for (size_t o = 0; o < a->len; o += 64) __builtin_prefetch(r + o, 0, 2);
        __builtin_prefetch(r + a->len - 1, 0, 2);
    }
}

/* rows per slice of the product between prefetches (a multiple of the kernels' 6 rows) */
#define AHEAD_ROWS 48
/* task_bwd goes chunk-outer where a thread's Y block (its rows × its panels' columns, FP32) is
 * at most this. Measured on Zen 5 (1 MiB L2), 2 threads, the head's BWD (K 1024, N 151936):
 * 256 KiB: T=64 36.7-39.4 -> 29.5-30.9 ms, T=256 unchanged; 640 KiB: T=256 123-129 -> 107-111;
 * 1.25 MiB: T=512 224-243 -> 204-206; the layers' shapes the same within the spread */
#define BWD_Y_BYTES (1u << 20)

void nl_host_fwd_pairs16(const nl_host_kernels *ks, int type, const uint8_t *w0, size_t rb, int nrows, int64_t k0,
                         int kc, int kc32, float *buf, int64_t ldb, uint32_t *dst, int64_t ldd) {
    for (int r = 0; r < 16; r++) {
        float *d = buf + (size_t)r * (size_t)ldb;
        if (r < nrows) {
            nl_host_dequant(ks, type, w0 + (size_t)r * rb, k0, kc, d);
            memset(d + kc, 0, (size_t)(kc32 - kc) * 4);
        } else {
            memset(d, 0, (size_t)kc32 * 4);
        }
    }
    ks->fwd_pairs_f32(buf, ldb, kc32, dst, ldd);
}

/* zero Q8_0 blocks: the rows of a FWD panel past ncols (q·d = 0) */
static const nl_block_q8_0 zero_q8_0[NL_HOST_KC / 32];

/* The bf16 FWD panel: s->Bp[p/2][j] = bf16(w[n0+j][k0+p]) | bf16(w[n0+j][k0+p+1]) << 16, zero
 * for ncols <= j < ncols rounded up to 16 (the columns past that are not read: kernels.h).
 * 16 rows at a time straight into the pairs where the set can (fwd_pairs_f32, q8_0_fwd_pairs),
 * else BF16 rows in a tile, then transposed. */
static void pack_fwd_bf16(const nl_host_kernels *ks, const nl_proj_weight *w, const uint8_t *W, size_t rb, int64_t n0,
                          int ncols, int64_t k0, int kc, scratch *s) {
    if (w->type == NL_TYPE_Q8_0 && ks->q8_0_fwd_pairs) {
        for (int j0 = 0; j0 < ncols; j0 += 16) {
            const nl_block_q8_0 *rows[16];
            for (int r = 0; r < 16; r++)
                rows[r] = j0 + r < ncols
                              ? (const nl_block_q8_0 *)(const void *)(W + (size_t)(n0 + j0 + r) * rb) + k0 / 32
                              : zero_q8_0;
            ks->q8_0_fwd_pairs(rows, kc / 32, s->Bp + j0, NL_HOST_NP);
        }
        return;
    }
    /* kc is a multiple of 32 but in an F16 row's last chunk: zeros up to the next multiple of 32
     * (the pairs past kc/2 rounded up are not read; the odd kc's last pair has a zero high half) */
    const int kc32 = (kc + 31) / 32 * 32;
    if (ks->fwd_pairs_f32) {
        for (int j0 = 0; j0 < ncols; j0 += 16)
            nl_host_fwd_pairs16(ks, w->type, W + (size_t)(n0 + j0) * rb, rb, ncols - j0, k0, kc, kc32, s->tile,
                                NL_HOST_KC, s->Bp + j0, NL_HOST_NP);
        return;
    }
    uint16_t *tile = (uint16_t *)s->tile;
    for (int j = 0; j < NL_HOST_NP; j++) {
        uint16_t *tr = tile + (size_t)j * NL_HOST_KC;
        if (j >= ncols) {
            memset(tr, 0, (size_t)kc32 * 2);
            continue;
        }
        nl_host_dequant(ks, w->type, W + (size_t)(n0 + j) * rb, k0, kc, s->row);
        memset(s->row + kc, 0, (size_t)(kc32 - kc) * 4);
        ks->to_bf16(s->row, kc32, tr);
    }
    nl_host_transpose32(ks, (const uint32_t *)tile, NL_HOST_KC / 2, s->Bp, NL_HOST_NP, NL_HOST_NP, kc32 / 2);
}

/* FWD: output panels of n, chunks of k. */
static void task_fwd(host_ctx *c, int tid) {
    const nl_proj_weight *w = c->w;
    const nl_host_kernels *ks = c->ks;
    scratch *s = &c->scr[tid];
    const int64_t K = w->n_in, N = w->n_out;
    const size_t rb = row_bytes(w->type, K);
    const uint8_t *W = w->data;
    int64_t p0, p1;
    int tlo, thi;
    thread_part(c, tid, N, &p0, &p1, &tlo, &thi);
    /* panel-outer: Y[T][panel] (T·NP floats) stays in L2 while the chunks of K go by, chunk 0
     * storing and later chunks adding, so Y is written to memory once (a vocabulary-sized Y
     * is far larger than the caches); X (T·K) is read once per panel, from L2/L3. */
    for (int64_t p = p0; p < p1; p++) {
        for (int64_t k0 = 0; k0 < K; k0 += NL_HOST_KC) {
            const int kc = (int)min64(NL_HOST_KC, K - k0);
            const int64_t n0 = p * NL_HOST_NP;
            const int ncols = (int)min64(NL_HOST_NP, N - n0);
            ahead nx = {0};
            if (k0 + NL_HOST_KC < K)
                ahead_set(&nx, w, n0, ncols, k0 + NL_HOST_KC, min64(NL_HOST_KC, K - k0 - NL_HOST_KC));
            else if (p + 1 < p1)
                ahead_set(&nx, w, n0 + NL_HOST_NP, min64(NL_HOST_NP, N - n0 - NL_HOST_NP), 0, min64(NL_HOST_KC, K));
            if (c->bf16) {
                /* B[p/2][j] = (bf16(w[n0+j][k0+p]), bf16(w[n0+j][k0+p+1])), the dequantized values
                 * rounded to BF16 (the BWD pack's values) paired along k: the BWD kernel's panel */
                pack_fwd_bf16(ks, w, W, rb, n0, ncols, k0, kc, s);
                for (int t0 = tlo; t0 < thi; t0 += AHEAD_ROWS) {
                    ahead_to(&nx, (int)((int64_t)nx.nr * (t0 - tlo + AHEAD_ROWS) / (thi - tlo)) + 1);
                    ks->gemm_bf16((int)min64(AHEAD_ROWS, thi - t0), (kc + 1) / 2, c->xb + (size_t)t0 * c->ldx + k0,
                                  c->ldx, s->Bp, c->y + (size_t)t0 * N + n0, N, ncols, k0 > 0);
                }
            } else {
                /* tile[j][p] = W[n0+j][k0+p], then B[p][j] = tile[j][p], for the live 16-column
                 * groups (the columns past them are not read: kernels.h) */
                const int nj = (ncols + 15) / 16 * 16;
                for (int j = 0; j < nj; j++) {
                    float *tr = s->tile + (size_t)j * NL_HOST_KC;
                    if (j < ncols) nl_host_dequant(ks, w->type, W + (size_t)(n0 + j) * rb, k0, kc, tr);
                    else memset(tr, 0, (size_t)kc * 4);
                }
                nl_host_transpose32(ks, (const uint32_t *)s->tile, NL_HOST_KC, (uint32_t *)s->B, NL_HOST_NP, nj, kc);
                for (int t0 = tlo; t0 < thi; t0 += AHEAD_ROWS) {
                    ahead_to(&nx, (int)((int64_t)nx.nr * (t0 - tlo + AHEAD_ROWS) / (thi - tlo)) + 1);
                    ks->gemm_f32((int)min64(AHEAD_ROWS, thi - t0), kc, c->x + (size_t)t0 * K + k0, K, s->B,
                                 c->y + (size_t)t0 * N + n0, N, ncols, k0 > 0);
                }
            }
        }
    }
}

/* bf16, first phase: the activations to BF16 once per request (rows split across threads). */
static void task_cvt(host_ctx *c, int tid) {
    const int64_t n = c->dir == NL_FWD ? c->w->n_in : c->w->n_out;
    const int t0 = (int)((int64_t)c->T * tid / c->nth), t1 = (int)((int64_t)c->T * (tid + 1) / c->nth);
    for (int t = t0; t < t1; t++) {
        uint16_t *xr = c->xb + (size_t)t * (size_t)c->ldx;
        c->ks->to_bf16(c->x + (size_t)t * (size_t)n, (int)n, xr);
        if (c->ldx > n) xr[n] = 0;
    }
}

/* task_bwd's step it of npan panels (from p0) × nch chunks: panel-outer or chunk-outer */
static void bwd_step(int64_t it, int chunk_outer, int64_t p0, int64_t npan, int64_t nch, int64_t *p, int64_t *n0) {
    *p = p0 + (chunk_outer ? it % npan : it / nch);
    *n0 = (chunk_outer ? it / npan : it % nch) * NL_HOST_KC;
}

/* BWD: output panels of k, chunks of n. */
static void task_bwd(host_ctx *c, int tid) {
    const nl_proj_weight *w = c->w;
    const nl_host_kernels *ks = c->ks;
    scratch *s = &c->scr[tid];
    const int64_t K = w->n_in, N = w->n_out;
    const size_t rb = row_bytes(w->type, K);
    const uint8_t *W = w->data;
    int64_t p0, p1;
    int tlo, thi;
    thread_part(c, tid, K, &p0, &p1, &tlo, &thi);
    /* panel-outer, as in task_fwd: Y[T][panel] is finished in L2 and written once. Where the
     * thread's whole Y block fits in BWD_Y_BYTES, chunk-outer instead: a chunk's rows of W are
     * read once for all the thread's panels (panel-outer walks W in 64-column strips, every
     * strip touching every row: the head's 165 MB read about twice per request, which bounded
     * its T=64 BWD). Each Y element's chain is the same either way (chunks in order). */
    const int64_t npan = p1 - p0, nch = (N + NL_HOST_KC - 1) / NL_HOST_KC;
    const int chunk_outer = npan > 1 && (uint64_t)(thi - tlo) * (uint64_t)npan * NL_HOST_NP * 4 <= BWD_Y_BYTES;
    for (int64_t it = 0; it < npan * nch; it++) {
        int64_t p, n0;
        bwd_step(it, chunk_outer, p0, npan, nch, &p, &n0);
        const int nc = (int)min64(NL_HOST_KC, N - n0);
        const int64_t k0 = p * NL_HOST_NP;
        const int ncols = (int)min64(NL_HOST_NP, K - k0);
        ahead nx = {0};
        if (it + 1 < npan * nch) {
            int64_t pn, nn;
            bwd_step(it + 1, chunk_outer, p0, npan, nch, &pn, &nn);
            ahead_set(&nx, w, nn, min64(NL_HOST_KC, N - nn), pn * NL_HOST_NP, min64(NL_HOST_NP, K - pn * NL_HOST_NP));
        }
        if (c->bf16) {
            /* B[i/2][j] = (bf16(w[n0+i][k0+j]), bf16(w[n0+i+1][k0+j])) of the dequantized
             * values; zero past ncols and for the odd row past nc */
            float *r0 = s->row, *r1 = s->row + NL_HOST_NP;
            if (w->type == NL_TYPE_Q8_0 && ks->q8_0_pairs_to_bf16) {
                for (int i = 0; i < nc; i += 2) {
                    uint32_t *dst = s->Bp + (size_t)(i / 2) * NL_HOST_NP;
                    const nl_block_q8_0 *b0 =
                        (const nl_block_q8_0 *)(const void *)(W + (size_t)(n0 + i) * rb) + k0 / 32;
                    const nl_block_q8_0 *b1 =
                        i + 1 < nc ? (const nl_block_q8_0 *)(const void *)(W + (size_t)(n0 + i + 1) * rb) + k0 / 32
                                   : NULL;
                    ks->q8_0_pairs_to_bf16(b0, b1, ncols / 32, dst);
                    if (ncols < NL_HOST_NP) memset(dst + ncols, 0, (size_t)(NL_HOST_NP - ncols) * 4);
                }
            } else {
                for (int i = 0; i < nc; i += 2) {
                    nl_host_dequant(ks, w->type, W + (size_t)(n0 + i) * rb, k0, ncols, r0);
                    for (int j = ncols; j < NL_HOST_NP; j++) r0[j] = 0.0f;
                    const int has1 = i + 1 < nc;
                    if (has1) {
                        nl_host_dequant(ks, w->type, W + (size_t)(n0 + i + 1) * rb, k0, ncols, r1);
                        for (int j = ncols; j < NL_HOST_NP; j++) r1[j] = 0.0f;
                    }
                    ks->pairs_to_bf16(r0, has1 ? r1 : NULL, NL_HOST_NP, s->Bp + (size_t)(i / 2) * NL_HOST_NP);
                }
            }
            for (int t0 = tlo; t0 < thi; t0 += AHEAD_ROWS) {
                ahead_to(&nx, (int)((int64_t)nx.nr * (t0 - tlo + AHEAD_ROWS) / (thi - tlo)) + 1);
                ks->gemm_bf16((int)min64(AHEAD_ROWS, thi - t0), (nc + 1) / 2, c->xb + (size_t)t0 * c->ldx + n0, c->ldx,
                              s->Bp, c->y + (size_t)t0 * K + k0, K, ncols, n0 > 0);
            }
        } else {
            /* B[i][j] = W[n0+i][k0+j] */
            for (int i = 0; i < nc; i++) {
                float *b = s->B + (size_t)i * NL_HOST_NP;
                nl_host_dequant(ks, w->type, W + (size_t)(n0 + i) * rb, k0, ncols, b);
                for (int j = ncols; j < NL_HOST_NP; j++) b[j] = 0.0f;
            }
            for (int t0 = tlo; t0 < thi; t0 += AHEAD_ROWS) {
                ahead_to(&nx, (int)((int64_t)nx.nr * (t0 - tlo + AHEAD_ROWS) / (thi - tlo)) + 1);
                ks->gemm_f32((int)min64(AHEAD_ROWS, thi - t0), nc, c->x + (size_t)t0 * N + n0, N, s->B,
                             c->y + (size_t)t0 * K + k0, K, ncols, n0 > 0);
            }
        }
    }
}

static int host_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    host_ctx *c = ctx;
    if (!c) return nl_err("host: run: no context");
    if (!host_supports(ctx, w, dir, T < 1 ? 1 : T))
        return nl_err("host: %s: unsupported weight (type %d, %lldx%lld)", w && w->name ? w->name : "?",
                      w ? w->type : -1, w ? (long long)w->n_out : 0LL, w ? (long long)w->n_in : 0LL);
    if (T < 1) return T == 0 ? 0 : nl_err("host: %s: T = %d", w->name ? w->name : "?", T);
    if (!x || !y) return nl_err("host: %s: NULL input or output", w->name ? w->name : "?");
    const int mode = mode_of(c);
    if (amx_takes(mode, w)) {
        if (!c->amx && !(c->amx = nl_amx_new(c->nth))) return -1;
        const nl_amx_tiles *tl = mode_tiles(mode);
        if (!tl) return nl_err("host: compute %s: the tiles cannot run here", nl_proj_host_compute(c));
        return nl_amx_run(c->amx, tl, c->ks, c->pool, w, dir, x, T, y, w->cls == NL_CLASS_RECURRENT);
    }
    if (int8_takes(mode, w, dir)) return int8_run(c, w, x, T, y);
    c->w = w;
    c->dir = dir;
    c->x = x;
    c->T = T;
    c->y = y;
    c->bf16 = bf16_takes(c, mode, w);
    if (c->bf16) {
        c->ldx = ((dir == NL_FWD ? w->n_in : w->n_out) + 1) / 2 * 2;
        const size_t need = (size_t)T * (size_t)c->ldx;
        if (need > c->xb_cap) {
            free(c->xb);
            c->xb_cap = 0;
            c->xb = aligned_alloc(64, (need * 2 + 63) / 64 * 64);
            if (!c->xb) return nl_err("host: %s: out of memory (%zu bytes)", w->name ? w->name : "?", need * 2);
            c->xb_cap = need;
        }
        run_all(c, task_cvt);
    }
    run_all(c, dir == NL_FWD ? task_fwd : task_bwd);
    return 0;
}

/* what a request holds beyond the context's fixed scratch (made at init): the tile driver's
 * packed activations and threads' scratch, or the BF16 copy of the activations */
static void host_scratch(void *ctx, const nl_proj_weight *w, nl_dir dir, int T, uint64_t *shared,
                         uint64_t *per_thread) {
    host_ctx *c = ctx;
    *shared = *per_thread = 0;
    if (!c || !w || T < 1) return;
    const int mode = mode_of(c);
    if (amx_takes(mode, w)) {
        nl_amx_scratch_bytes(c->ks, c->nth, w->n_in, w->n_out, w->type, dir, T, w->cls == NL_CLASS_RECURRENT, shared,
                             per_thread);
    } else if (int8_takes(mode, w, dir)) {
        *shared = nl_host_int8_scratch(w, T);
    } else if (bf16_takes(c, mode, w)) {
        const uint64_t ldx = ((uint64_t)(dir == NL_FWD ? w->n_in : w->n_out) + 1) / 2 * 2;
        *shared = ((uint64_t)T * ldx * 2 + 63) / 64 * 64;
    }
}

/* the nodes follow the service: its tiles (real or emulated) in the tile modes, BF16 attention
 * in bf16 where the attention's BF16 pieces exist (cpu/gemm_bf16.h: x86 AVX512_BF16 only; an
 * Arm core in bf16 compute keeps the FP32 attention) */
static void host_nodes(const void *ctx, const nl_amx_tiles **tiles, int *bf16) {
    const int m = ctx ? mode_of(ctx) : MODE_F32;
    *tiles = amx_mode(m) ? mode_tiles(m) : NULL;
    *bf16 = (m == MODE_BF16 || (m == MODE_INT8 && int8_float_bf16(ctx))) && nl_cpu_has(NL_CPU_AVX512BF16);
}

const nl_proj_backend nl_proj_backend_host = {
    .name = "host",
    .init = host_init,
    .supports = host_supports,
    .run = host_run,
    .free = host_free,
    .any_T = 1,
    .describe = host_describe,
    .compute = nl_proj_host_compute,
    .computes = host_computes,
    .nodes = host_nodes,
    .scratch = host_scratch,
};

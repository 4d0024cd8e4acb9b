/* proj/host: the `host` backend (host.c, nl_proj_backend_host in proj.h): its knobs (the
 * service wires --compute to them) and its matrix-engine driver (amx.c). The kernel sets it
 * runs are cpu/kernels.h, the tile operations cpu/amx.h. */
#ifndef NL_PROJ_HOST_H
#define NL_PROJ_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "proj/proj.h"
#include "util/pool.h"

/* Compute modes (nl_proj_config.compute, handed to nl_proj_backend_host.init, or
 * nl_proj_host_configure on a context): "f32" (FP32 activations and weights, FMA)
 * or "bf16" (AVX512_BF16 / Arm BF16 dot products on the quantized block types, dequantized and
 * rounded to BF16 as each panel is packed, the same effective weights FWD and BWD; activations
 * are rounded to BF16; F16 weights too but for the recurrent class (kept to F16 accuracy: the f32
 * path, the fastest way to it without tiles); F32 and BF16 weights run the f32 path), "amx" (the matrix engine's BF16
 * tiles, FP32 accumulation, every type but F32 dequantized to BF16 on the fly; the recurrent class in split-BF16; F32
 * weights on the f32 path: cpu/amx.h) or "amx-emu" (the same kernels on the portable tile emulator: any machine, slow)
 * or "int8" (the FWD of Q8_0/Q4_0/Q5_0/Q4_1/Q4_K/Q6_K weights with the activations quantized to int8 as llama.cpp's CPU
 * backend does, integer dot products (AVX512_VNNI, else the portable row: cpu/kernels.h "the int8 FWD rows"), the
 * scales in FP32; BWD and the other types as bf16 where the CPU has it, else f32: proj/host_int8.c). "auto" (or NULL):
 * by capability, see host.c mode_of (amx where usable, else bf16 on AVX512_BF16 CPUs but Intel's, else f32). The
 * service checks a name (nl_proj_compute_known, from this backend's list); whether this machine can run it is checked
 * where a context takes it. */

/* Per-context override (ctx from nl_proj_backend_host.init). kernels: "auto", "scalar",
 * "avx2", "avx512" or "neon" (NULL = keep); compute as above (NULL = keep). Asking for a set
 * this CPU lacks, or bf16 without AVX512_BF16, is an error (-1 + nl_err). */
int nl_proj_host_configure(void *ctx, const char *kernels, const char *compute);
/* The kernel set and compute mode a context uses now, e.g. "avx512" and "bf16". */
const char *nl_proj_host_kernels(const void *ctx);
const char *nl_proj_host_compute(const void *ctx);
/* Which kernels run which weights, one line (snprintf semantics), e.g. "bf16 compute (avx512
 * kernels)" or "amx-bf16 for attn/mlp/head, split-bf16 for recurrent, avx512 f32 for F32
 * weights": printed at start-up and recorded with a run's commits. */
int nl_proj_host_describe(const void *ctx, char *buf, size_t cap);
/* 1 if the named kernel set ("scalar", "avx2", "avx512", "avx512bf16", "neon", "amx") runs here. */
int nl_proj_host_cpu_has(const char *name);
/* The error bound a context meets for a weight of `type` with reduction length n_red (K for
 * FWD, N for BWD), relative to Σ|x·w| of each output element (tests/test_host.c checks it):
 * 1e-2 where bf16 compute applies to the type, else 2e-6·(1 + log2 n_red). For a planner. */
double nl_proj_host_rel_tol(const void *ctx, int type, int64_t n_red);
/* The same for one weight (its class matters on the tile kernels: split-BF16 for recurrent,
 * 1e-4 + the f32 bound; BF16 tiles 1e-2; F32 weights the f32 bound). */
double nl_proj_host_rel_tol_for(const void *ctx, const nl_proj_weight *w, int64_t n_red);

/* The FWD pairs of 16 rows of W (row r at w0 + r·rb, zeros from row nrows on): columns k0 .. k0+kc
 * decoded into FP32 rows of buf (ldb floats apart, zeros from kc up to kc32, a multiple of 32),
 * then dst[(p/2)·ldd + r] = BF16(row r, p) | BF16(row r, p + 1) << 16 by ks->fwd_pairs_f32 (which
 * the set must have): the bf16 compute's panels and the tile driver's (amx.c) */
void nl_host_fwd_pairs16(const nl_host_kernels *ks, int type, const uint8_t *w0, size_t rb, int nrows, int64_t k0,
                         int kc, int kc32, float *buf, int64_t ldb, uint32_t *dst, int64_t ldd);
/* dst[c·ldd + r] = src[r·lds + c] for r < rows (a multiple of 16), c < cols: the kernel set's
 * transpose (ks->transpose32) or a plain loop */
void nl_host_transpose32(const nl_host_kernels *ks, const uint32_t *src, int64_t lds, uint32_t *dst, int64_t ldd,
                         int rows, int cols);

/* ---- the matrix-engine driver (amx.c; the tile operations: cpu/amx.h) ------------------ */
typedef struct nl_amx_ctx nl_amx_ctx;
nl_amx_ctx *nl_amx_new(int n_threads);
void nl_amx_free(nl_amx_ctx *a);
/* One request: Y = X·Wᵀ (FWD) or dY·W (BWD), W any host type (nl_host_type_ok), split 1 =
 * split-BF16 (3 products), 0 = one BF16 product. Threads: the pool (pool size == n_threads). */
/* What nl_amx_run on a context of n_threads holds for a K×N weight, direction dir, T rows:
 * the packed activations (*shared, one buffer grown to its largest request) and every thread's
 * scratch (*per_thread, all threads together, each grown to its largest), for requests run with the
 * kernel set ks on a weight of type `type` (the FWD packing it picks decides the scratch). */
void nl_amx_scratch_bytes(const nl_host_kernels *ks, int n_threads, int64_t K, int64_t N, int type, nl_dir dir, int T,
                          int split, uint64_t *shared, uint64_t *per_thread);
int nl_amx_run(nl_amx_ctx *a, const nl_amx_tiles *tiles, const nl_host_kernels *ks, nl_pool *pool,
               const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y, int split);

#endif

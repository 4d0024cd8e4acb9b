/* nn/lora: the LoRA branch of one adapted projection, as a fused node.
 *
 *   y[T][n_out] += s · (m ⊙ x) · Aᵀ · Bᵀ,   u = (m ⊙ x) · Aᵀ  [T][r]
 *
 * A [r][n_in] row-major (= GGUF lora_a {n_in, r} = PEFT lora_A.weight), B [n_out][r]
 * (= GGUF lora_b {r, n_out} = PEFT lora_B.weight), s = alpha / r. m is the inverted-dropout
 * mask (each element 0 with probability p, else 1/(1−p)); p = 0 means no mask at all (no RNG
 * call, no copy: the fast path, bit-identical to nl_lora_apply).
 *
 * Element i of token row t of the mask is a pure function of (key, tok0 + t, i) through the
 * counter-based RNG (util/rng.h), so the backward (or a recompute after resume) regenerates
 * exactly the forward's mask; or the forward keeps it as bits (mask_out) and the backward reads
 * them (mask_in) instead of hashing again: the same function's values, the same bits. The caller makes `key`
 * from (seed, step, layer, projection) with nl_lora_dropout_key and chooses tok0 so that
 * every token row of the step has its own index (e.g. micro_batch · T_max + first row).
 *
 * Backward (docs/backward.md "Projection with LoRA"), with du = s · dy · B [T][r]:
 *   dx += (du · A) ⊙ m,   dB += s · dyᵀ · u,   dA += duᵀ · (m ⊙ x)
 * dA/dB/dx ACCUMULATE (gradient accumulation across micro-batches; dx also receives the
 * frozen projection's dy·W from proj/). Cost: about 2·T·r·(n_in + n_out) flops forward,
 * twice that backward; the rank-r products run through a register-blocked GEMM.
 *
 * Functions return 0, or -1 with nl_last_error() set (bad p, out of memory for scratch). */
#ifndef NL_LORA_H
#define NL_LORA_H

#include <stddef.h>
#include <stdint.h>

struct nl_amx_tiles;
typedef struct {
    int n_in, n_out, rank; /* K, N, r */
    float scale;           /* s = alpha / rank */
    float dropout;         /* p in [0, 1) */
    uint64_t key;          /* dropout key (nl_lora_dropout_key); unused when dropout == 0 */
    /* NULL: the rank-r products in FP32 (nl_gemm). Else on these tiles (cpu/amx.h, real or
     * emulated; cpu/tiles.h): every per-row product's operands rounded to BF16 (nearest even),
     * FP32 accumulation; dA and dB (sums over the tokens) FP32 as without tiles, so zero rows
     * are exact no-ops there on any TDPBF16PS; the scalings, the mask and the adds in FP32. The same split
     * invariance (below) and the same accumulation contract; agrees with the FP32 products to
     * BF16 accuracy. */
    const struct nl_amx_tiles *tiles;
    /* 1 (the BF16 compute mode; train/graph sets it with the service's BF16 products): where
     * there are no tiles, r = 16 and the CPU has AVX512_BF16 (nl_bf16_ok()), the products per
     * token row, u = (m ⊙ x)·Aᵀ, y (+)= (s·u)·Bᵀ, du = dy·B and dx (+)= du·A, on vdpbf16ps
     * (cpu/kernels.h: thin16b, add16b): operands rounded to BF16 (nearest even), FP32
     * accumulation, agreeing with the FP32 products to BF16 accuracy. dA and dB (sums over the
     * tokens) stay FP32 chains over t, the tiles' reason: BF16 pairs over the tokens would make
     * the gradients depend on which rows share the call. The scalings, the mask and the adds in
     * FP32; the same split invariance and accumulation contract. 0, or anywhere else: FP32. */
    int bf16;
    /* The mask kept as bits, 1 where an element is kept: token row t of the call (the rows of the
     * whole call, as u) at mask_*[t · nl_lora_mask_halves(n_in)], element i at bit i % 16 of
     * half i / 16 (padding bits 0). With dropout, a training forward writes them into mask_out
     * (NULL: none), and a backward reads mask_in (NULL: the mask regenerated from the key) where it
     * would hash; the caller passes a backward the bits its forward wrote for the same rows, key
     * and tok0. Unused when dropout == 0 and by nl_lora_apply. */
    uint16_t *mask_out;
    const uint16_t *mask_in;
} nl_lora;

/* 16-bit halves per token row of the kept mask bits (mask_out, mask_in): n_in bits rounded up to
 * 32 (rows on 4-byte boundaries). */
static inline size_t nl_lora_mask_halves(int n_in) { return ((size_t)n_in + 31) / 32 * 2; }

/* 1 when an nl_lora of this rank with bf16 = 1 and no tiles runs the BF16 pair on this CPU. */
int nl_lora_bf16_runs(int rank);

/* Key for the masks of one (seed, optimizer step, layer, projection). */
uint64_t nl_lora_dropout_key(uint64_t seed, uint64_t step, int layer, int proj);

/* m[n_in] for token index `token`: 0 or 1/(1−p); all 1 when p == 0. For tests/inspection. */
void nl_lora_dropout_mask(const nl_lora *L, int64_t token, float *m);

/* Training forward: y[T][n_out] += s·u·Bᵀ. u[T][r] is written (save it for backward) or may be
 * NULL (then the backward recomputes it). x[T][n_in]; token rows are tok0 .. tok0+T-1. */
int nl_lora_forward(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int T,
                    int64_t tok0);

/* Backward for the same (L, x, T, tok0) as the forward. u from the forward, or NULL to recompute.
 * dx[T][n_in] += (du·A) ⊙ m (dx may be NULL: not needed, e.g. the first layer's input);
 * dA[r][n_in] += duᵀ·(m ⊙ x); dB[n_out][r] += s·dyᵀ·u. */
int nl_lora_backward(const nl_lora *L, const float *A, const float *B, float *dx, float *dA, float *dB, const float *dy,
                     const float *x, const float *u, int T, int64_t tok0);

/* The same with a choice: accumulate = 0 OVERWRITES y (or dx) with the LoRA term (the bits
 * of a zeroed buffer plus the accumulating call, without the zeroing pass). */
int nl_lora_forward_to(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x, int T,
                       int64_t tok0, int accumulate);
int nl_lora_backward_to(const nl_lora *L, const float *A, const float *B, float *dx, int dx_accumulate, float *dA,
                        float *dB, const float *dy, const float *x, const float *u, int T, int64_t tok0);

/* ---- one call split over threads (train/graph runs these on the runtime's pool) ----
 * The same products as nl_lora_forward_to / nl_lora_backward_to restricted to part of the
 * outputs; parts computed by different threads together give exactly the bits of the whole
 * call (nl_gemm computes every element as one chain over k, whatever M, N or the split of k).
 * Token row t's dropout mask is keyed by tok0 + toks[t] when toks != NULL (rows gathered out
 * of a longer sequence keep their masks), else by tok0 + t. */

/* NL_LORA_ADD as accumulate (forward) or dx_accumulate (backward rows), on every path (the
 * tiles too): y (dx) += the LoRA term computed on its own, i.e. the bits of the term written
 * into a buffer with accumulate = 0 and that buffer added to y afterwards, without the
 * buffer: each token block's term goes through a block of the thread's scratch and is added
 * while it is in cache (train/graph's synchronous path adds the branch into the service's
 * output so). */
#define NL_LORA_ADD 2

/* Forward of rows [t0, t1); y, u, x are the whole call's arrays (row t at t·n_out etc.). */
int nl_lora_forward_rows(const nl_lora *L, const float *A, const float *B, float *y, float *u, const float *x,
                         int64_t tok0, const int64_t *toks, int accumulate, int t0, int t1);

/* Backward in two phases around a scratch of nl_lora_bwd_scratch_floats(L, T) floats shared
 * by all threads:
 *   phase 1, nl_lora_backward_rows over token rows [t0, t1) (split by rows): du = s·dy·B,
 *     s·u (u recomputed when NULL) and x ⊙ m into the scratch, and dx's rows (dx may be NULL);
 *     x ⊙ m is not written (nor read by phase 2, which rebuilds it from x and the bits) where the
 *     BF16 pair reads the forward's kept bits (bf16, mask_in, the row's add16bk and tn16k);
 *   phase 2, after phase 1 has finished every row, nl_lora_backward_params over [j0, j1) of
 *     the n_in + n_out parameter lines: dA's columns j < n_in and dB's rows j − n_in, each
 *     element one chain over all T tokens (never a reduction split across threads).
 * Together: the bits of nl_lora_backward_to for the same arguments (toks == NULL). Phase 2
 * returns -1 + nl_err only on the tiles (out of memory for its packing scratch). */
size_t nl_lora_bwd_scratch_floats(const nl_lora *L, int T);
/* The most per-thread scratch (nl_thread_scratch) a LoRA product of L takes on any path (FP32
 * or tiles, either direction), independent of T: a thread's block grows to it. */
uint64_t nl_lora_thread_bytes(const nl_lora *L);
int nl_lora_backward_rows(const nl_lora *L, const float *A, const float *B, float *dx, int dx_accumulate,
                          const float *dy, const float *x, const float *u, int T, int64_t tok0, const int64_t *toks,
                          float *scratch, int t0, int t1);
int nl_lora_backward_params(const nl_lora *L, float *dA, float *dB, const float *dy, const float *x, int T,
                            const float *scratch, int j0, int j1);

/* The backward by lines, where nl_lora_bwd_by_lines(L) (on the tiles): x read once, in phase 2.
 *   phase 1, nl_lora_backward_du over token rows [t0, t1) (split by rows): du = s·dy·B and s·u
 *     (u recomputed when NULL) into the scratch (nl_lora_bwd_scratch_floats); x ⊙ m not stored;
 *   phase 2, after phase 1 has finished every row, nl_lora_backward_lines over [j0, j1) of the
 *     n_in + n_out lines: for j < n_in dA's column j and dx's column j (dx may be NULL), x ⊙ m
 *     rebuilt from the mask's key a block of rows at a time; for j >= n_in dB's row j − n_in.
 * Together: the bits of nl_lora_backward_rows + nl_lora_backward_params (and so of
 * nl_lora_backward_to, toks == NULL) for the same arguments, whatever the splits. Elsewhere
 * both return -1 + nl_err. */
int nl_lora_bwd_by_lines(const nl_lora *L);
int nl_lora_backward_du(const nl_lora *L, const float *A, const float *B, const float *dy, const float *x,
                        const float *u, int T, int64_t tok0, const int64_t *toks, float *scratch, int t0, int t1);
int nl_lora_backward_lines(const nl_lora *L, const float *A, float *dx, int dx_accumulate, float *dA, float *dB,
                           const float *dy, const float *x, int T, int64_t tok0, const int64_t *toks,
                           const float *scratch, int j0, int j1);

/* Inference: y[T][n_out] += s · (x·Aᵀ)·Bᵀ, dropout off whatever L->dropout says. */
int nl_lora_apply(const nl_lora *L, const float *A, const float *B, float *y, const float *x, int T);

#endif

/* model/adapter: LoRA adapters as llama.cpp loads them (formats.md §4).
 *
 * For a base projection W {n_in, n_out} (row-major [n_out][n_in]) named "<base>":
 *   "<base>.lora_a" {n_in, r}  = A, row-major [r][n_in]
 *   "<base>.lora_b" {r, n_out} = B, row-major [n_out][r]
 *   y = W x + (alpha / r) · B (A x)
 * All A and B live in ONE contiguous F32 buffer (params), so an optimizer step, a checkpoint and
 * a write are single loops over it; the same layout holds the gradients and AdamW moments. */
#ifndef NL_ADAPTER_H
#define NL_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct {
    int proj; /* index into nl_model.projs */
    int rank;
    int64_t n_in, n_out;
    size_t off_a, off_b; /* offsets (floats) of A and B inside params */
} nl_lora_tensor;

typedef struct nl_adapter {
    nl_arch arch;
    float alpha;
    int rank;
    int n; /* adapted projections */
    nl_lora_tensor *t;
    int *by_proj; /* [model->n_projs]: entry index or -1 */
    int n_model_projs;
    float *params; /* owned, n_params floats */
    size_t n_params;
} nl_adapter;

/* PEFT-style init of one tensor pair: A[r][n_in] ~ U(−1/sqrt(n_in), 1/sqrt(n_in))
 * (kaiming-uniform with a = √5), B = 0 (so the adapter starts as the identity). A's element c
 * is uniform value c of `key`. */
void nl_lora_init(float *A, float *B, int rank, int n_in, int n_out, uint64_t key);

/* What a merge kept of the adapter's update ΔW = s·B·A, over the adapted tensors: for each, what
 * the written weights compute against base + adapter on the inputs the adapter reads, A's rows
 * (P an orthonormal basis of them; Q: the written type, encoded and decoded):
 * lost = ‖(Q(W+ΔW) − W − ΔW)·Pᵀ‖ / ‖ΔW‖ (0: every bit of the update is in the file; ≥ 1: none). */
#define NL_MERGE_NTYPES 43 /* ggml's id space (model/quant.h's NL_TYPE_COUNT) */
typedef struct {
    int n_adapted;                /* adapted tensors merged */
    int n_retyped;                /* of those, written in another type than stored */
    int by_type[NL_MERGE_NTYPES]; /* adapted tensors by written type (ggml id) */
    double dw2, err2;             /* Σ‖ΔW‖², Σ‖(Q(W+ΔW) − W − ΔW)·Pᵀ‖² */
    double lost;                  /* sqrt(err2 / dw2), over every adapted tensor */
    double worst;                 /* the largest one tensor's lost */
    char worst_name[96];          /* its name */
} nl_merge_stats;

/* Write base + merged adapter (W + s·B·A for every adapted projection) as GGUF (model/merge.c).
 * type < 0: untouched tensors as stored, adapted ones as nl_merge_out_type says; else projections
 * are written in `type`, and general.file_type names it. Stats into *st (may be NULL). Nothing is
 * written when a merged weight is not finite in its type (what the model loader refuses), when
 * the base changed while it was read, or when max_lost ≥ 0 and st->lost exceeds it. */
int nl_merge_ex(const nl_model *m, const nl_adapter *a, int type, double max_lost, nl_merge_stats *st,
                const char *out_path);
/* nl_merge_ex with no stats and no bound on the loss. */
int nl_merge(const nl_model *m, const nl_adapter *a, int type, const char *out_path);
/* The type merge (type < 0) writes an adapted tensor of `type` in: F32, F16, BF16 and Q8_0 their
 * own; any ≤ 6-bit type (Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) Q8_0, whose grid keeps a LoRA update where
 * theirs drowns it (a whole number of Q8_0 blocks per row, as their blocks are 32 or 256). */
int nl_merge_out_type(int type);

static inline float *nl_lora_A(const nl_adapter *a, int i) { return a->params + a->t[i].off_a; }
static inline float *nl_lora_B(const nl_adapter *a, int i) { return a->params + a->t[i].off_b; }
/* Scale applied to B(Ax): alpha / r, or 1 when alpha == 0 (llama.cpp's rule). */
static inline float nl_adapter_scale(const nl_adapter *a, int i) {
    return a->alpha != 0.0f ? a->alpha / (float)a->t[i].rank : 1.0f;
}

/* A fresh adapter on the projections whose kind is in `targets` (a comma list of kind names:
 * q,k,v,o,gate,up,down,qkv,z,alpha,beta,out,output, or "all" = every linear projection of every
 * layer). A ~ Kaiming-uniform-like from the counter RNG keyed by seed, B = 0 (PEFT's init). */
nl_adapter *nl_adapter_new(const nl_model *m, const char *targets, int rank, float alpha, uint64_t seed);
/* Load a llama.cpp LoRA GGUF and validate it against the model (arch, names, shapes, rank;
 * every value and alpha finite: "PATH: non-finite value: parameter blk.0.attn_q.lora_b[0] =
 * nan", so no command computes with NaN). A directory is read as a PEFT adapter
 * (model/peft.h: adapter_config.json + adapter_model.safetensors). */
nl_adapter *nl_adapter_load(const nl_model *m, const char *path);
/* Same over a caller's buffer (fuzzing, tests); `label` names it in errors. The buffer is only
 * read during the call (the adapter owns copies of every value). */
nl_adapter *nl_adapter_load_buffer(const nl_model *m, const void *buf, size_t len, const char *label);
/* Write as llama.cpp LoRA GGUF (F32 tensors), atomically. */
int nl_adapter_save(const nl_adapter *a, const nl_model *m, const char *path);
/* Write `values` (laid out like params, e.g. gradients) as tensors named like the adapter's. */
int nl_adapter_save_values(const nl_adapter *a, const nl_model *m, const float *values, const char *path);
void nl_adapter_free(nl_adapter *a);
/* The layout of an adapter on projections projs[0..n) of ranks[0..n), in that order (A then B
 * of each, one params buffer, zero-filled): what a loader fills. NULL when out of memory. */
nl_adapter *nl_adapter_alloc(const nl_model *m, const int *projs, const int *ranks, int n, float alpha);
/* 0 when every parameter is finite and no update can overflow the forward, else -1 and
 * "LABEL: non-finite value: parameter blk.0.attn_q.lora_b[0] = nan" or "LABEL: 'blk.0.attn_q'
 * overflows the forward: ...". The bound: the update s·B(Ax) multiplies an input of magnitude
 * X by at most s·|B|·|A|·X (|M| the largest row sum of |M|, the infinity norm), and A x, B(A x)
 * and the scaling are each bounded by the product of max(1, s), max(1, |A|), max(1, |B|); an
 * adapter where that product exceeds NL_ADAPTER_MAX_GAIN (a trained one is near 1e2 to 1e5)
 * turns any activation above ~1e23 into Inf, then NaN, in the forward. */
#define NL_ADAPTER_MAX_GAIN 1e15
int nl_adapter_check_finite(const nl_adapter *a, const nl_model *m, const char *label);
/* "blk.1.attn_q.lora_b[5]": the name of element idx of an array laid out like params (the
 * parameters, their gradients). */
void nl_adapter_elem_name(const nl_adapter *a, const nl_model *m, size_t idx, char *buf, size_t cap);

/* Parse a --targets list into a bitmask over nl_proj_kind; -1 + error on an unknown name. */
int nl_parse_targets(const char *targets, uint32_t *mask);

/* The LoRA rank of model projection p (0: no adapter, no entry, or p < 0). */
static inline int nl_adapter_rank(const nl_adapter *ad, int p) {
    if (!ad || p < 0) return 0;
    const int e = ad->by_proj[p];
    return e >= 0 ? ad->t[e].rank : 0;
}

#endif

/* nn/forward: the model forward (logits, generate, eval): the embedding rows, the layers of
 * nn/layer.h (the one layer definition, which the training graph runs too) with the decoding
 * state, and the head.
 *
 * Every frozen-weight product goes through proj/ (nl_proj_submit/wait); that projection's LoRA
 * branch runs while the request is in flight, or after it on the pool (nl_runtime.sync). */
#ifndef NL_FORWARD_H
#define NL_FORWARD_H

#include <stdint.h>

#include "model/adapter.h"
#include "model/model.h"
#include "nn/gdn.h"
#include "nn/nn.h"
#include "proj/proj.h"
#include "util/arena.h"
#include "util/pool.h"

typedef struct nl_runtime {
    const nl_model *m;         /* borrowed */
    nl_proj_service *svc;      /* borrowed */
    int *svc_id;               /* [m->n_projs]: model projection -> service id (owned) */
    const nl_adapter *adapter; /* borrowed, may be NULL */
    nl_rope rope;
    nl_rope rope_swa; /* gemma3's sliding-window layers: base hp.rope_base_swa */
    nl_gdn_shape gdn;
    /* Pacing hook, called before every service request (thermal/battery pauses); may be
     * NULL. A non-zero return aborts the computation with that status. */
    int (*pace)(void *user);
    void *pace_user;
    /* Synchronous mode: wait for each service request before computing the LoRA branch, then
     * compute it on the pool, instead of on this thread while the request is in flight. Results
     * are bit-identical either way; only the overlap changes. nl_runtime_init leaves it 0; the
     * trainer (nl_train_sync_mode) and `eval` (nl_session_sync_cpu) set it on the CPU
     * backends (host, ref), whose threads own the cores while a request is in flight. */
    int sync;
    /* Attention of the training graph in BF16 (nl_attention_*_range_bf16: GEMM inputs rounded
     * to BF16, FP32 accumulation and softmax); 0 = FP32. nl_runtime_init sets it when the
     * service computes in BF16 (nl_proj_compute), so the step's arithmetic follows one switch;
     * callers may override it. Inference never reads it. */
    int attn_bf16;
    /* The nodes' products on the matrix engine's tiles (cpu/amx.h: the real instructions or
     * the emulator), the service's own when it computes on them ("amx", "amx-emu":
     * nl_amx_tiles_of, set by nl_runtime_init unless NL_AMX_NODES=off is in the environment):
     * the training graph's attention (before attn_bf16) and LoRA products. NULL: the FP32 /
     * BF16 vector paths. Inference never reads it. */
    const struct nl_amx_tiles *tiles;
    /* CPU threads for the nodes that run while the service is idle (attention, norms, RoPE,
     * SwiGLU, cross-entropy, adds): the caller plus pool workers, split over outputs so results
     * do not depend on the count. Created by nl_runtime_init with the service's thread count
     * (NULL when 1); owned. */
    nl_pool *pool;
    /* The model forward's scratch (layer caches and temporaries, the head's logits, the LoRA
     * branches' rows): one arena kept across calls, so a pass over many batches (eval) does
     * not map, fault in and unmap its buffers again for each; the pages of the largest call
     * stay resident until nl_runtime_free. Owned; NULL until the first call. One caller at a
     * time (as the rest of the runtime). */
    nl_arena *fws;
} nl_runtime;

static inline int nl_rt_pace(nl_runtime *rt) { return rt->pace ? rt->pace(rt->pace_user) : 0; }

/* Register every projection of m with the service (a tied head and the embedding share one
 * resident weight). */
int nl_runtime_init(nl_runtime *rt, const nl_model *m, nl_proj_service *svc);
void nl_runtime_free(nl_runtime *rt);
/* Replace the CPU node pool by one of n threads (1 = none). 0 ok, -1 + nl_err. */
int nl_runtime_set_threads(nl_runtime *rt, int n);

/* Decoding state of one sequence: per attention layer a KV cache [n_ctx][Hkv][head_dim] for K
 * and V; per GDN layer its conv window and recurrent state. */
typedef struct {
    int n_ctx, n_past;
    float **k, **v;    /* [n_layer], NULL for recurrent layers */
    nl_gdn_state *gdn; /* [n_layer], zeroed arrays for recurrent layers */
} nl_seq_state;

int nl_seq_state_init(nl_seq_state *st, const nl_model *m, int n_ctx);
void nl_seq_state_reset(nl_seq_state *st, const nl_model *m);
/* dst takes src's position and recurrent (GDN) states; with with_kv also the KV rows
 * [0, n_past) (dst's n_ctx must hold them). Without with_kv, dst's own KV rows below n_past are
 * kept: a snapshot of a shared prefix restores with with_kv = 0 into the state it came from
 * (later tokens write only rows >= n_past). Both states from nl_seq_state_init for model m. */
void nl_seq_state_copy(nl_seq_state *dst, const nl_seq_state *src, const nl_model *m, int with_kv);
void nl_seq_state_free(nl_seq_state *st, const nl_model *m);

/* 0 when every tokens[t] is in the vocabulary, else -1 + nl_err naming the first that is not. */
int nl_check_tokens(const nl_model *m, const int32_t *tokens, int T);

/* x[T][n_embd] = the embedding rows of tokens[T], times hp.embd_scale (gemma3: sqrt(n_embd);
 * the rows are frozen and nothing below them is trained, so the scale has no backward): the
 * one gather the model forward and the training graph both use. */
int nl_embed_rows(nl_runtime *rt, const int32_t *tokens, int T, float *x);

/* The RoPE of layer l (the sliding-window one on gemma3's local layers). */
static inline const nl_rope *nl_rt_rope(const nl_runtime *rt, int l) {
    return rt->m->layers[l].swa ? &rt->rope_swa : &rt->rope;
}

/* Run tokens[T] at positions st->n_past .. n_past+T-1 (st may be NULL: a fresh sequence, no
 * cache kept). hidden[T][n_embd] receives the last layer's output (before the final norm). */
int nl_forward(nl_runtime *rt, nl_seq_state *st, const int32_t *tokens, int T, float *hidden);

/* Fresh sequences packed back to back (eval's batches): tokens[T] holds n_seg sequences of
 * seg_T[i] tokens (Σ = T), each from position 0 and attending only over its own rows (the GDN
 * state restarts); hidden[T][n_embd] as nl_forward's. One service request per projection for
 * all of them; each sequence's rows are the bits nl_forward(rt, NULL, ...) gives it alone (the
 * service's rows are independent). */
int nl_forward_packed(nl_runtime *rt, const int32_t *tokens, int T, int n_seg, const int *seg_T, float *hidden);
/* nl_forward_packed with shared prefixes (eval's choices after their prompt): seg_pre[i] = -1
 * (a fresh sequence), or the index p < i of a fresh sequence whose rows are sequence i's
 * prefix: sequence i goes on after p's tokens (positions seg_T[p]..), attends over p's rows
 * and its own, its recurrent (GDN) layers start from p's state after them; a prefix's
 * continuations follow it, nothing else between, and each fits nl_attention_prefix_rows(seg_T[p],
 * seg_T[p] + seg_T[i]) (nn/nn.h; -1 + nl_err otherwise). Each continuation's
 * rows are the bits nl_forward(rt, NULL, ...) gives the joined sequence's rows after p (the
 * prefix is computed once for all of them). seg_pre NULL: nl_forward_packed. */
int nl_forward_packed_prefix(nl_runtime *rt, const int32_t *tokens, int T, int n_seg, const int *seg_T,
                             const int *seg_pre, float *hidden);
/* Rows a head request projects at a time (nn/head: the inference's and the training graph's): the
 * vocabulary product is the largest of a training step (V·E per row, both directions) and runs
 * at its best rate on 256-row buckets, while the logits chunk stays at 256·V floats (155 MB for
 * V = 151936). */
#define NL_HEAD_CHUNK 256

/* The head (nn/head.h) with the model forward's projections (the service plus the adapter's
 * LoRA) and arena. Final norm + vocabulary projection of T rows: logits[T][n_vocab]. */
int nl_head_logits(nl_runtime *rt, const float *hidden, int T, float *logits);

/* Sum of target cross-entropies over targets[T] (< 0 = not a target), head in token chunks so
 * the full T×V logits never exist. If row_loss != NULL it receives each row's -log p (0 for
 * non-targets). */
int nl_head_loss(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *sum, float *row_loss);
/* Each row's -log p in double (0 for non-targets): row_loss[T]. Summed in row order, a span of
 * them is the sum nl_head_loss gives for those rows alone. */
int nl_head_loss_rows(nl_runtime *rt, const float *hidden, const int32_t *targets, int T, double *row_loss);

/* y[T][n_out] = W x (+ LoRA) through the service for model projection p. */
int nl_rt_proj(nl_runtime *rt, int p, const float *x, int T, float *y);

#endif

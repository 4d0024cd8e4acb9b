/* train/graph: the training step of one sequence on any architecture: the layers of
 * nn/layer.h (the one layer definition, which the model forward runs too) forward storing what
 * backward needs, the head + loss in token chunks, and the layers' backward in reverse, with
 * every frozen-weight product through the projection service (FWD for forward and
 * recompute, BWD for input gradients) and the LoRA branches computed on the CPU while the
 * base request is in flight (or, with rt->sync, after it, split over the runtime's pool).
 *
 * Activation budget: every layer's input x_l is always kept (T×n_embd floats); a layer's
 * intermediates are kept only while the budget allows, otherwise they are dropped after its
 * forward and recomputed from x_l (through the service) just before its backward. */
#ifndef NL_GRAPH_H
#define NL_GRAPH_H

#include <stdint.h>

#include "model/adapter.h"
#include "nn/forward.h"
#include "nn/layer.h"

/* nl_graph_prof (bench step timing): nn/layer.h. */

/* Test hooks: the longer ways to the same bits that the tests check the graph's shortcuts
 * against. The library never sets them (nl_graph.test is NULL). */
/* A head with nn/head's nl_head_pass_loss contract. */
typedef int (*nl_graph_head_fn)(nl_pass *ps, const float *x, const int32_t *targets, int T, float inv_n,
                                double *row_loss, float *dx);

typedef struct {
    /* the head to run instead of nn/head's (NULL: nn/head's; tests/test_graph.c's reference:
     * every row, chunk by chunk, no gathering) */
    nl_graph_head_fn head;
    /* form layer 0's input gradient too (BWD of its mixer input projections and the
     * attention-norm backward), which nothing uses (more work) */
    int full_input_grads;
} nl_graph_test;

typedef struct {
    nl_runtime *rt; /* borrowed; rt->adapter must be `ad` */
    nl_adapter *ad; /* the trainable adapter (borrowed) */
    float *grads;   /* [ad->n_params]: backward ACCUMULATES here (borrowed) */
    float dropout;  /* LoRA dropout probability */
    uint64_t seed;
    int64_t step;        /* optimizer step: part of the dropout key */
    int64_t tok_base;    /* token offset of this sequence inside the step (dropout key) */
    uint64_t act_budget; /* bytes of layer intermediates that may stay resident */
    nl_graph_prof *prof; /* NULL = no timing */
    /* Keep the call's scratch (layer inputs, caches, temporaries: one arena) for the next call
     * instead of freeing it: saves the page faults of ~RSS-peak bytes per step. The caller
     * then releases it with nl_graph_free. */
    int keep_scratch;
    void *ws;                  /* the scratch arena (internal; NULL until the first call) */
    const nl_graph_test *test; /* the tests' longer ways (NULL in the library) */
    /* stats of the last call */
    int n_kept, n_recomputed;
    uint64_t peak_cache_bytes;
    int n_lora_pool; /* LoRA branches (FWD or BWD) split over the runtime's pool */
} nl_graph;

/* Bytes of one layer's intermediates for T tokens (what the budget counts). */
uint64_t nl_graph_layer_bytes(const nl_graph *g, int layer, int T);

/* The most bytes one call of T rows holds at once (its arena: every layer input, the kept
 * layers' caches, a layer's cache with its forward or backward temporaries, or the head's; the
 * recurrent layers' GDN caches), under the plan run() makes with activation budget `budget`
 * (want_grad 0: nl_graph_loss's call, nothing kept); *kept_out (may be NULL): the kept layers'
 * bytes. Each call reserves it as one arena block. UINT64_MAX when out of memory. */
uint64_t nl_graph_call_bytes(const nl_graph *g, int T, uint64_t budget, int want_grad, uint64_t *kept_out);

/* Forward + head + backward of one sequence. targets[t] is the token predicted at row t (< 0:
 * not a target). Gradients of the loss sum·inv_n are accumulated into g->grads; *loss_sum
 * gets the un-normalised sum of target cross-entropies. */
int nl_graph_seq(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, float inv_n, double *loss_sum);

/* nl_graph_seq for n_seq sequences of one optimizer step packed back to back (seq_T[i] rows
 * each; tokens and targets [Σ seq_T]; g->tok_base is the first one's token offset, the next
 * ones follow): every frozen-weight product is ONE service request for all the rows, the
 * attention core and the GDN recurrence see the boundaries (positions restart at 0). The same
 * bits as nl_graph_seq on each in turn with tok_base advancing by its rows, wherever the
 * service's rows are independent of the request's size (gradients accumulate in the same
 * order; the head's loss keeps each sequence's chunks): loss_sums[i] is sequence i's. */
int nl_graph_seqs(nl_graph *g, int n_seq, const int *seq_T, const int32_t *tokens, const int32_t *targets, float inv_n,
                  double *loss_sums);

/* Release the scratch kept by keep_scratch (safe to call at any time, also when none). */
void nl_graph_free(nl_graph *g);

/* Forward + head loss only (no gradients, dropout as configured): for MeZO and checks. */
int nl_graph_loss(nl_graph *g, const int32_t *tokens, const int32_t *targets, int T, double *loss_sum);

#endif

/* eval/eval: loss, perplexity and labelled accuracy of a model (+ adapter) on a dataset. */
#ifndef NL_EVAL_H
#define NL_EVAL_H

#include <stdint.h>

#include "data/dataset.h"
#include "nn/forward.h"

typedef struct {
    double loss_sum;        /* sum of target cross-entropies (nats) */
    int64_t n_targets;
    int n_items;            /* examples with choices */
    int n_correct;          /* of those, argmax log-likelihood == answer */
    int n_examples;
} nl_eval_result;

static inline double nl_eval_loss(const nl_eval_result *r) { return r->n_targets ? r->loss_sum / (double)r->n_targets : 0.0; }

/* Every example's targets contribute to the loss (sequences longer than max_ctx are cut to it);
 * every example with choices is scored by the summed log-likelihood of each choice after its
 * context. */
int nl_eval_dataset(nl_runtime *rt, const nl_dataset *ds, int max_ctx, nl_eval_result *r);

/* Row targets from a sequence's flags: row t predicts ids[t+1] when target[t+1] is set
 * (else -1); the last row predicts nothing. */
void nl_row_targets(const int32_t *ids, const uint8_t *target, int n, int32_t *rows);

#endif

/* eval/score: loss, perplexity and labelled accuracy of a model (+ adapter) on a dataset, through
 * the model forward (nn/forward.h). One scorer for `nightlora eval` (eval/eval.h) and for the
 * validation during training (train/validate.h): eval is the room below train, so training's
 * validation runs the evaluation's own scorer. */
#ifndef NL_SCORE_H
#define NL_SCORE_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "nn/forward.h"

typedef struct {
    double loss_sum; /* sum of target cross-entropies (nats) */
    int64_t n_targets;
    int n_items;         /* examples with choices */
    int n_correct;       /* of those, argmax log-likelihood == answer */
    int n_examples;      /* every example of the file */
    int ctx;             /* the context the examples were cut to */
    int n_truncated;     /* examples cut to it: their targets past it are not scored */
    int n_dropped;       /* examples with no target within it: not in the loss */
    int dropped_line[8]; /* the file lines of the first min(n_dropped, 8) of those */
    int n_shared;        /* examples with choices whose prompt ran once for all of them (the
                          * others: per choice, nl_eval_opts.per_choice) */
} nl_eval_result;

static inline double nl_eval_loss(const nl_eval_result *r) {
    return r->n_targets ? r->loss_sum / (double)r->n_targets : 0.0;
}

/* Every example's targets contribute to the loss (sequences longer than max_ctx are cut to it:
 * counted in n_truncated, or in n_dropped when no target is left, the rule nl_pack applies in
 * training); every example with choices is scored by the summed log-likelihood of each choice
 * after its context. No target left in the whole file is an error (a loss of nothing is not
 * 0). */
int nl_eval_dataset(nl_runtime *rt, const nl_dataset *ds, int max_ctx, nl_eval_result *r);

/* One example's result, for eval --json and the validation rows. */
typedef struct {
    int line;        /* the example's line in its file */
    double loss_sum; /* its targets' cross-entropy within the context (0: dropped) */
    int64_t n_targets;
    int n_choices;    /* 0: no choices */
    const double *ll; /* [n_choices]: each choice's log-likelihood after the prompt */
    int predicted;    /* argmax of ll (the first of equals); -1 without choices */
    int answer;
} nl_eval_example;

/* Rows a batch packs by default: the examples (and each choice after its prompt) go through the
 * model as packed sequences of up to this many tokens, one service request per projection. */
#define NL_EVAL_BATCH_TOKENS 2048

typedef struct {
    int batch_tokens; /* rows per packed forward (0: NL_EVAL_BATCH_TOKENS; 1: every example alone) */
    /* 1: every choice its own sequence, prompt + choice, the prompt computed again for each
     * (NL_EVAL_PER_CHOICE=1 in the environment asks the same); 0: the prompt once, its choices
     * continuing it (nl_forward_packed_prefix), the same bits */
    int per_choice;
    void (*on_example)(void *user, const nl_eval_example *e); /* each example in file order (may be NULL) */
    void *user;
} nl_eval_opts;

/* nl_eval_dataset with options (o may be NULL). The result is the same bits for any
 * batch_tokens and either per_choice: each sequence's rows are those of a forward of it alone.
 * A choice is scored as the sequence prompt + choice, the prompt computed once per example. */
int nl_eval_dataset_opts(nl_runtime *rt, const nl_dataset *ds, int max_ctx, const nl_eval_opts *o, nl_eval_result *r);
/* What nl_eval_dataset checks before it scores anything, without running the model: every
 * choice fits max_ctx, some example has a target within it; r gets the counts of the examples,
 * the truncated and the dropped (no loss yet). 0, or -1 with the message nl_eval_dataset would
 * give (training checks its validation set with it before the first step). */
int nl_eval_check(const nl_dataset *ds, int max_ctx, nl_eval_result *r);
/* ", 1 truncated to 64 tokens, 2 dropped with no target within the context (lines 3, 7)"
 * (empty when nothing was cut): what nl_eval_dataset left out, for a report line. */
void nl_eval_format_cut(const nl_eval_result *r, char *buf, size_t cap);

#endif

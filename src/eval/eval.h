/* eval/eval: loss, perplexity and labelled accuracy of a model (+ adapter) on a dataset
 * (`nightlora eval`, the public API's nl_eval_dataset). The scorer itself is eval/score.h, the one
 * training's validation runs too (train, the room above, includes it). */
#ifndef NL_EVAL_H
#define NL_EVAL_H

#include "eval/score.h"

/* `nightlora eval` over a JSONL file: loaded with tok (the model's vocabulary; NULL: tokens
 * lines only) and opts (NULL: the defaults; its n_vocab is the model's whatever it says), cut
 * to ctx (0: the model's context, capped at 4096; < 2 is an error naming the model), then
 * nl_eval_dataset_opts with eo (may be NULL). */
int nl_eval_file(nl_runtime *rt, const nl_tokenizer *tok, const char *path, const nl_data_opts *opts, int ctx,
                 const nl_eval_opts *eo, nl_eval_result *r);

#endif

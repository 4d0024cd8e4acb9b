/* eval/eval: loss, perplexity and labelled accuracy of a model (+ adapter) on a dataset
 * (`nightlora eval`, the public API's nl_eval_dataset). The scorer itself is nn/score.h, the one
 * training's validation runs too (train and eval may not include each other). */
#ifndef NL_EVAL_H
#define NL_EVAL_H

#include "nn/score.h"

#endif

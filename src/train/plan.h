/* train/plan: what a run will do, known before a step is taken: its data loaded and packed as
 * the run packs it, the optimizer steps an epoch and in all, the warning for a run too short to
 * learn from (with settings that give more, computed), and `train --dry-run`: the first
 * sequences as the model sees them (template applied, targets marked) and the plan, with no
 * service started and nothing written. */
#ifndef NL_TRAIN_PLAN_H
#define NL_TRAIN_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "model/model.h"
#include "train/trainer.h"

/* Fewer optimizer steps than this draw the short-run warning; a batch sized to the data gives
 * an epoch at least this many. */
#define NL_TRAIN_FEW_STEPS 20
/* The largest batch a run sizes to its data, and the batch of a --steps run without one. */
#define NL_TRAIN_BATCH_TOKENS 4096

/* The run's data: o->data read with the model's tokenizer (o->chat_template,
 * o->strict_keys, o->columns, o->alpaca_prompt), with o->val_split its held-out examples moved into *held
 * (nl_dataset_split; *held empty otherwise), the rest packed into sequences of at most *max_ctx
 * tokens (o->max_ctx, or the model's context capped at 4096; o->refuse_long). 0, or -1 with the
 * error naming the file (or the flag) and *ds / *pk / *held left empty. */
int nl_train_load_data(const nl_train_opts *o, const nl_model *m, const nl_tokenizer *tok, nl_dataset *ds,
                       nl_packing *pk, int *max_ctx, nl_dataset *held);

/* The optimizer steps of a run over pk: o->steps, or ceil(o->epochs) epochs of batches (each
 * epoch's batches counted in its own order: with shuffling the count can differ; a fractional
 * last epoch is that share of its batches, rounded up), at least 1. *per_epoch (may be NULL):
 * the first epoch's batches. -1 on error (out of memory). */
int64_t nl_train_count_steps(const nl_train_opts *o, const nl_packing *pk, int64_t *per_epoch);

/* The batch of a run that gives none (o->batch_tokens 0) over pk: NL_TRAIN_BATCH_TOKENS for a
 * run of o->steps, else the largest of 4096, 2048, 1024, ... whose first epoch has at least
 * NL_TRAIN_FEW_STEPS batches (where none does, the largest that gives one sequence a batch):
 * what a small personal dataset needs to learn, where one 4096-token batch can hold a whole
 * epoch. *per_epoch (may be NULL): that batch's steps an epoch. -1 on error. */
int nl_train_batch_for(const nl_train_opts *o, const nl_packing *pk, int64_t *per_epoch);

/* How a run's batch was chosen (nl_train_resolve_batch). */
enum { NL_BATCH_GIVEN, NL_BATCH_SIZED, NL_BATCH_RESUMED_SIZED, NL_BATCH_RESUMED_GIVEN };

/* o->batch_tokens made the run's: kept when given (NL_BATCH_GIVEN); with 0, on o->resume the
 * batch o->checkpoint_dir/run.json records (its "batch_sizing" "data": NL_BATCH_RESUMED_SIZED,
 * else NL_BATCH_RESUMED_GIVEN), so that a resume keeps the run's batch whatever else it
 * changes (--steps); otherwise nl_train_batch_for (NL_BATCH_SIZED). A run.json batch that is no
 * integer in the flag's range is not taken. Returns the way, or -1 on error. */
int nl_train_resolve_batch(nl_train_opts *o, const nl_packing *pk);

/* What the plan says of a batch chosen by `how` (not NL_BATCH_GIVEN), into buf: "sized to the
 * data for at least 20 steps an epoch" ... ; "" for NL_BATCH_GIVEN. */
const char *nl_train_batch_note(int how, char *buf, size_t cap);

/* The short-run warning, without the "warning: " prefix, into buf: the run has fewer than
 * NL_TRAIN_FEW_STEPS optimizer steps, or covers less than one epoch; it names the cause
 * and the largest --batch-tokens (halving o->batch_tokens), with --epochs where even one
 * sequence a step is too few, that gives at least NL_TRAIN_FEW_STEPS steps over at least one
 * epoch ("--batch-tokens 512 gives 28 steps"). buf = "" when the run is long enough. total and
 * per_epoch: nl_train_count_steps. -1 on error. */
int nl_train_short_run(const nl_train_opts *o, const nl_packing *pk, int64_t total, int64_t per_epoch, char *buf,
                       size_t cap);

/* One sequence as text: the pieces of its tokens (control tokens as their text), each run of
 * target (loss) tokens between "[[" and "]]". At most max_bytes of text (0: no limit), then
 * " ... (N more tokens)". *text malloc'd, NUL-terminated. */
int nl_train_render_seq(const nl_tokenizer *tok, const int32_t *ids, const uint8_t *target, int n, size_t max_bytes,
                        char **text);

/* `train --dry-run`: loads the model's file, tokenizer and o->data (nothing else: no service,
 * no adapter, no checkpoint directory, no output), prints to f the first n_show sequences as
 * rendered, the plan (examples, sequences, tokens, targets, steps an epoch, total steps) and the
 * short-run warning if any. 0, or -1 with the error the run would have stopped with. */
int nl_train_dry_run(const nl_train_opts *o, int n_show, FILE *f);

#endif

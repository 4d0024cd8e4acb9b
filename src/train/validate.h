/* train/validate: validation during training (--val-data FILE or --val-split F, --eval-every N),
 * the best adapter kept (--keep-best loss|accuracy) and early stop (--early-stop P).
 *
 * An evaluation scores the validation set with the adapter being trained through the run's own
 * runtime and service: eval/score's nl_eval_dataset, the scorer `nightlora eval` runs, so the loss
 * at the end equals `nightlora eval --adapter OUT` on the same file whenever eval's service has
 * the training's numerics (a model already in its resident types, e.g. Q8_0 with --precision
 * auto; else eval --precision P with the training's P). Dropout is off, nothing is learned.
 *
 * Evaluations come after step N when N is a multiple of --eval-every, and after the last step.
 * Each improves on the best so far or not: loss, strictly lower; accuracy, strictly higher, or
 * equal with a strictly lower loss. The first evaluation always improves. --early-stop P ends the
 * run after P evaluations in a row that did not improve. The state below is committed with the
 * step (as the commit's extra cursor words, train/checkpoint.h), so a resumed run takes the same
 * decisions as an uninterrupted one. */
#ifndef NL_VALIDATE_H
#define NL_VALIDATE_H

#include <stdint.h>
#include <stdio.h>

#include "model/adapter.h"
#include "eval/score.h"
#include "train/trainer.h" /* NL_KEEP_* */

typedef struct {
    int64_t last_eval;    /* the step of the last evaluation done (0: none yet) */
    int64_t best_step;    /* the step of the best evaluation (0: none yet) */
    double best_loss;     /* its mean target loss (nats) */
    double best_accuracy; /* its choice accuracy in [0, 1]; NAN when the set has no choices */
    int64_t bad;          /* evaluations since the best that did not improve on it */
} nl_val_state;

/* The state as checkpoint cursor words: [0] tag "NLVAL001", [1] last_eval, [2] best_step,
 * [3] best_loss and [4] best_accuracy (IEEE-754 bits), [5] bad. */
#define NL_VAL_WORDS 6
void nl_val_state_init(nl_val_state *s);
void nl_val_state_pack(const nl_val_state *s, uint64_t w[NL_VAL_WORDS]);
/* 0 (s filled), or -1 + nl_err naming `path` when the words are not a validation state. */
int nl_val_state_unpack(const uint64_t *w, uint32_t n, const char *path, nl_val_state *s);

/* Whether an evaluation comes after `step` of `total` (every: --eval-every, 0 = at the end only). */
int nl_val_due(int64_t step, int64_t total, int64_t every);

/* The choice accuracy of r in [0, 1], NAN when r scored no example with choices. */
double nl_val_accuracy(const nl_eval_result *r);

/* Record the evaluation of `step` (metric NL_KEEP_LOSS or NL_KEEP_ACCURACY): 1 when it improves
 * on the best (now the best), 0 when not (s->bad counts it). */
int nl_val_update(nl_val_state *s, int metric, int64_t step, const nl_eval_result *r);

/* 1 when --early-stop `patience` (0: off) ends the run in state s. */
static inline int nl_val_stop(const nl_val_state *s, int64_t patience) { return patience > 0 && s->bad >= patience; }

/* The --log-json row of an evaluation, one line:
 *   {"eval": {"step": N, "loss": L, "accuracy": A or null, "examples": E, "tokens": T, "seconds": S}}
 * loss %.17g (exact), accuracy a fraction in [0, 1], tokens the target tokens scored, seconds the
 * evaluation's own (pauses excluded). Returns fprintf's status (< 0 on error). */
int nl_val_log_row(FILE *f, int64_t step, const nl_eval_result *r, double seconds);

/* The progress line of an evaluation, into buf: "eval at step 20: val loss 1.2345, accuracy 95.0%
 * (114/120), 120 examples, 430 target tokens, 1.2 s" (no newline). */
void nl_val_format(char *buf, size_t cap, int64_t step, const nl_eval_result *r, double seconds);

/* ---- a run's validation ---- */

typedef struct {
    nl_dataset ds; /* the validation set (owned) */
    int loaded;
    int max_ctx;         /* the run's context: examples are cut to it, as in training */
    int64_t every;       /* --eval-every (0: at the end only) */
    int keep;            /* --keep-best: NL_KEEP_OFF, _LOSS, _ACCURACY */
    int metric;          /* what "improves" means: keep's metric, else the loss */
    int64_t patience;    /* --early-stop (0: off) */
    nl_val_state st;     /* committed with each step */
    double seconds;      /* this process's evaluations, pauses excluded */
    int n_evals;         /* this process's evaluations */
    double last_seconds; /* the last one's time, pauses excluded */
    nl_eval_result last; /* the last evaluation (last_step 0: none in this process) */
    int64_t last_step;
    const char *failed_flag; /* after -2 from nl_val_eval: the output that failed ("--log-json", "--out") */
} nl_validator;

/* With v->ds loaded (v->loaded set): the settings, and the set checked against the context
 * (nl_eval_check) and, for --keep-best accuracy, for choices to score. 0 or -1 + nl_err. */
int nl_val_init(nl_validator *v, int max_ctx, int64_t every, int keep, int64_t patience);
void nl_val_free(nl_validator *v);
/* Content hash of the set (ids, targets, choices, answers): the run's identity covers it. */
uint64_t nl_val_hash(const nl_validator *v);
/* "validation: 6 examples of FILE, after every 2 steps and at the end; --keep-best loss ..." */
void nl_val_say(const nl_validator *v, FILE *f, const char *what);

/* The evaluation after `step` (the adapter in rt as trained so far): scored, recorded in v->st,
 * its row written to log (NULL: none) and its line to progress (NULL: quiet); with --keep-best an
 * improvement writes the adapter to `out` (atomically: OUT.tmp, renamed) and says so.
 * `paused` points at the pacer's running total of paused seconds, which the evaluation's time
 * excludes. 0; -1 with nl_err when scoring failed (a stop while paused among them: then
 * nothing is recorded); -2 with nl_err when an output failed (v->failed_flag names it). */
int nl_val_eval(nl_validator *v, nl_runtime *rt, int64_t step, const double *paused, FILE *log, FILE *progress,
                const nl_adapter *ad, const nl_model *m, const char *out);

#endif

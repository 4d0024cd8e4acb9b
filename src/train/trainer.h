/* train/trainer: `nightlora train` as a library call. The step (DESIGN.md §4): forward →
 * head → backward (train/graph) over the sequences of one batch, gradient accumulation up to
 * batch_tokens, global-norm clipping, AdamW on the adapter only, commit at optimizer-step
 * boundaries, pacing between service requests. */
#ifndef NL_TRAINER_H
#define NL_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "proj/proj.h"

typedef struct {
    const char *model, *data, *out;      /* required */
    const char *init_adapter;            /* start from an adapter (rank, alpha, targets from it) */
    const char *targets;                 /* --targets list (default: every linear projection) */
    const char *chat_template;           /* override the GGUF's */
    int rank;                            /* 16 */
    float alpha;                         /* 32 */
    float dropout;                       /* 0.05 */
    double lr;                           /* 2e-4 */
    int steps;                           /* 0: from epochs */
    double epochs;                       /* 1 */
    int batch_tokens;                    /* 4096 */
    int warmup;                          /* warmup steps */
    int cosine;                          /* 1: cosine schedule, 0: constant */
    double clip;                         /* max global grad norm (1.0; <= 0 off) */
    double weight_decay;                 /* 0 */
    int max_ctx;                         /* 0: the model's context, capped at 4096 */
    int refuse_long;                     /* 1: error on an example longer than max_ctx */
    int shuffle;                         /* 1 */
    uint64_t seed;                       /* 42 */
    const char *checkpoint_dir;          /* NULL: no commits */
    int commit_every;                    /* 1 */
    int resume;
    int64_t act_budget_mb;               /* -1: MemAvailable-based */
    nl_proj_config proj;
    const char *thermal;                 /* "auto" | "off" */
    const char *thermal_status_file, *battery_temp_file;
    const char *log_json;                /* one JSON object per optimizer step */
    const char *dump_grads;              /* first step's dA/dB as GGUF */
    int stop_after;                      /* testing: stop (as if signalled) after this many steps in this run; 0 = off */
    FILE *progress;                      /* progress lines (stderr); NULL = quiet */
} nl_train_opts;

void nl_train_defaults(nl_train_opts *o);

typedef struct {
    int steps_done;                      /* optimizer steps completed overall (incl. resumed) */
    int total_steps;
    double first_loss, last_loss;
    double seconds, service_seconds, paused_seconds;
    int64_t tokens;
    int stopped;                         /* stopped early by a signal / stop_after */
} nl_train_result;

int nl_train(const nl_train_opts *o, nl_train_result *res);

#endif

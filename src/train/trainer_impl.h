/* train/trainer_impl (private to train/): the state of one nl_train run, shared by the loop
 * (trainer.c) and the memory preflight (preflight.c). Not part of the public API: nightlora.h
 * does not include it. */
#ifndef NL_TRAINER_IMPL_H
#define NL_TRAINER_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "model/adapter.h"
#include "model/model.h"
#include "os/energy.h"
#include "os/pacing.h"
#include "train/graph.h"
#include "train/mezo.h"
#include "train/optim.h"
#include "train/trainer.h"
#include "train/trainer_hooks.h"
#include "train/validate.h"

#define NL_MB (1024.0 * 1024.0)

/* The sequence-length buckets the data is packed into (and the service pads a request to). */
extern const int nl_train_buckets[];
extern const int nl_train_n_buckets;

/* What one run holds, by kind of state: what it opened (freed by trainer_free), what it planned
 * before its first step (fixed for the run), and what this process has done so far. */
typedef struct {
    nl_model *m;
    nl_tokenizer *tok; /* the model's vocabulary */
    nl_adapter *ad;
    nl_proj_service *svc;
    nl_runtime rt;
    nl_dataset ds;
    nl_packing pk;
    nl_batcher *bt;
    nl_graph g; /* the step graph (its kept scratch is freed with the trainer) */
    float *grads, *mom, *vel;
    float *zeros; /* MeZO: the (unused) AdamW moments written in commits */
    nl_energy *en;
    FILE *log;
    int ds_loaded, pk_loaded;
    nl_pacer pacer;
    int pacer_ok;
    int lock_fd;     /* DIR/lock, held (flock) for the whole run; -1: none */
    int lock_dir_fd; /* the checkpoint directory itself, flocked too (a deleted lock file admits no second run) */
} nl_train_res;

typedef struct {
    int mezo;                      /* --method mezo */
    int max_ctx;                   /* the longest sequence the data was packed to */
    int64_t total;                 /* optimizer steps of the whole run */
    int64_t per_epoch;             /* the first epoch's batches (train/plan.h) */
    int batch_sized;               /* batch_tokens was 0: the run's batch sized to the data (1) or taken
                                    * from the run resumed, as it was sized there (2) or set there (3) */
    nl_schedule sched;             /* the learning rate of each step */
    nl_adamw aw;                   /* backprop: AdamW's settings (lr set each step) */
    nl_mezo_cfg mz;                /* MeZO: its settings (lr set each step) */
    uint64_t model_hash, cfg_hash; /* the commits' identity (model_hash: 0 without commits) */
} nl_train_plan;

typedef struct {
    int64_t first_step; /* the step it started from (a resume's commit, else 0) */
    int64_t steps_this_run, last_commit;
    int64_t run_tokens;
    double run_start;
    int energy_failing; /* the energy counter failed once: no more joules */
    int stop_in_pause;  /* a stop was requested while paused: abort the step */
    int pace_failing;   /* the last pacer reading failed (warned once per outage) */
} nl_train_count;

typedef struct {
    const nl_train_opts *o;
    nl_train_hooks hk;    /* the tests' hooks (all zero for nl_train) */
    nl_train_res res;     /* what the run opened */
    nl_train_plan plan;   /* what it planned before its first step */
    nl_train_count count; /* this process's part of the run */
    nl_validator val;     /* validation (val.loaded: a validation set; train/validate.h) */
} nl_trainer;

/* The memory preflight (preflight.c; its rule: trainer.h, nl_train). Prints the estimate
 * ("memory: needs ..."), checks it against avail (bytes; < 0: unknown, not checked; from_limit:
 * avail is --mem-limit-mb, no reserve kept) and refuses a run that cannot fit, naming settings
 * that would. T: the rows of one graph call (the step's sequences packed), longest: the longest
 * sequence; rss0: the process's RSS before the run (< 0: unknown). Sets *budget_out, the
 * activation budget in bytes for the graph. */
int nl_train_mem_preflight(nl_trainer *t, int T, int longest, int64_t avail, int from_limit, int64_t rss0,
                           uint64_t *budget_out);

#endif

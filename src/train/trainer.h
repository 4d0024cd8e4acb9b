/* train/trainer: `nightlora train` as a library call. The step (docs/design.md §4): forward →
 * head → backward (train/graph) over the sequences of one batch, gradient accumulation up to
 * batch_tokens, global-norm clipping, AdamW on the adapter only, commit at optimizer-step
 * boundaries, pacing between service requests. */
#ifndef NL_TRAINER_H
#define NL_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "proj/proj.h"
#include "os/signals.h"
#include "train/optim.h"

/* What nl_train reports to on_progress: a row per optimizer step (before its log line and
 * commit: a cancel from the callback ends the run at that step, committed), and one per
 * validation pass. */
typedef enum { NL_PROGRESS_STEP = 1, NL_PROGRESS_EVAL = 2 } nl_progress_kind;

typedef struct {
    int kind;                  /* nl_progress_kind */
    int64_t step, total_steps; /* 1-based optimizer step (a resumed run's counted) */
    /* NL_PROGRESS_STEP */
    double loss, lr, grad_norm; /* as in the --log-json line */
    int64_t tokens;             /* the step's */
    double seconds;             /* the step's wall time */
    double tokens_per_s;        /* this run so far */
    double paused_seconds;      /* this step's pause */
    double elapsed_seconds;     /* since this run's first step */
    /* NL_PROGRESS_EVAL: the validation pass after `step` */
    double eval_loss, eval_accuracy; /* accuracy -1 when no example has choices */
    int64_t eval_examples, eval_tokens;
    double eval_seconds;
} nl_train_progress;

enum { NL_KEEP_OFF = 0, NL_KEEP_LOSS = 1, NL_KEEP_ACCURACY = 2 }; /* nl_train_opts.keep_best */

typedef struct {
    const char *model, *data, *out; /* required */
    const char *init_adapter;       /* start from an adapter (rank, alpha, targets from it) */
    int init_rank;                  /* with init_adapter: the rank asked for (--rank); 0 = the file's.
                                     * An adapter of another rank is refused. */
    const char *targets;            /* --targets list (default: every linear projection) */
    const char *chat_template;      /* override the GGUF's */
    int strict_keys;                /* data lines: a key no format reads is an error (nl_data_opts) */
    const char *columns;            /* data lines: "prompt=question,..." key names (nl_data_opts) */
    const char *alpaca_prompt;      /* Alpaca lines: NULL/"auto" | "alpaca" | "chat" (nl_data_opts) */
    int rank;                       /* 16 */
    float alpha;                    /* 32 */
    float dropout;                  /* 0.05 */
    double lr;                      /* 2e-4 */
    int64_t steps;                  /* 0: from epochs */
    double epochs;                  /* 3 */
    int batch_tokens;               /* 0 (the default): sized to the data (nl_train_batch_for:
                                     * the largest of 4096, 2048, ... giving an epoch at least
                                     * NL_TRAIN_FEW_STEPS steps; 4096 with steps), a resume
                                     * taking its run's (run.json) */
    int warmup;                     /* warmup steps */
    int cosine;                     /* 1: cosine schedule, 0: constant */
    double lr_min;                  /* the cosine's floor, reached after the last step
                                     * (0 <= lr_min <= lr); < 0: 0.1 * lr (the default) */
    double clip;                    /* max global grad norm (1.0; <= 0 off) */
    double weight_decay;            /* 0 */
    int max_ctx;                    /* 0: the model's context, capped at 4096 */
    int refuse_long;                /* 1: error on an example longer than max_ctx */
    int shuffle;                    /* 1 */
    uint64_t seed;                  /* 42 */
    const char *checkpoint_dir;     /* NULL: no commits */
    /* the command line that started this run, for checkpoint_dir/runs.jsonl (the history the
     * report lists and marks resumes from; train/rundesc.h); NULL: not recorded */
    const char *command;
    int64_t commit_every; /* 1 */
    /* > 0: every save_every optimizer steps the adapter is also written to
     * nl_train_snapshot_path(out, step) (OUT-stepN.gguf, the format of out), committed first
     * when there is a checkpoint_dir (a snapshot step is a commit step); 0: none */
    int64_t save_every;
    int resume;
    int allow_kernel_change; /* --resume on other kernels than the commits': continue */
    int64_t act_budget_mb;   /* -1: MemAvailable-based */
    nl_proj_config proj;     /* nl_proj_config_defaults: host, every core up to 8, precision auto */
    /* LoRA branches overlapped with the in-flight service request: "auto" (NULL) = "off" when
     * the service computes on these CPU cores (backend host or ref: overlapping would
     * oversubscribe them; the branches are then split over the CPU node pool after each
     * request), "on" for any other backend; "on" | "off" force it. Bit-identical either way. */
    const char *overlap;
    const char *thermal; /* "auto" | "off" */
    const char *thermal_status_file, *battery_temp_file;
    const char *log_json;   /* one JSON object per optimizer step (see below) */
    const char *dump_grads; /* step 1's dA/dB (before clipping) as GGUF; not on a resumed run */
    int stop_after;         /* testing: stop (as if signalled) after this many steps in this run; 0 = off */
    double pacing_poll_s;   /* testing: pacer check and poll interval in seconds (0: 1 s / 5 s) */
    FILE *progress;         /* progress lines (stderr); NULL = quiet */
    /* "warning: ..." lines and data notes (stderr; NULL: none): a quiet run (progress NULL)
     * still says what it ignored or could not do */
    FILE *warnings;
    /* Called on the training thread with each progress row (NULL: none). */
    void (*on_progress)(void *user, const nl_train_progress *p);
    void *progress_user;
    /* The run's cancel handle (NULL: none): a request ends the run at the next step boundary
     * with a commit (at once while paused), res->stopped = 1. The CLI points its SIGINT/SIGTERM
     * handlers at it (os/signals.h). */
    nl_cancel *cancel;
    /* The optimizer: "backprop" (default, NULL: forward + backward + AdamW) or "mezo"
     * (train/mezo.h: two forwards per step, SGD on a projected gradient, no backward, no AdamW
     * moments; dropout is off in its forwards). MeZO wants a much smaller lr than AdamW: the
     * CLI's default with --method mezo is 1e-4 (the paper's LoRA setting), against 2e-4 for
     * AdamW, and often 1e-5..1e-4 is right; clip does not apply. */
    const char *method;
    double mezo_eps; /* MeZO perturbation scale (1e-3) */
    /* Memory preflight (see nl_train): the memory the run may use, in MB (fractions allowed);
     * 0 = MemAvailable at start-up. */
    double mem_limit_mb;
    /* 1: the memory the process held before the run counts too (the CLI: --mem-limit-mb bounds
     * the process); 0: only what the run takes (a library caller's own memory is its own). */
    int count_process;
    /* Validation (train/validate.h): a held-out set, val_data (a JSONL file, read like data) or
     * val_split (a fraction of data held out: nl_dataset_split), scored after every eval_every
     * steps (0: only after the last step) with the adapter being trained. keep_best
     * (NL_KEEP_LOSS | NL_KEEP_ACCURACY; 0: off) writes the best adapter so far to out at each
     * improvement instead of the last at the end; early_stop P (0: off) ends the run after P
     * evaluations in a row without improvement. All need a validation set. The CLI gives
     * --data DIR's valid.jsonl as val_data when it has one (and no --val-data / --val-split). */
    const char *val_data;
    double val_split;
    int64_t eval_every;
    int keep_best;
    int64_t early_stop;
} nl_train_opts;

void nl_train_defaults(nl_train_opts *o);
/* The range of each numeric option by its flag name ("rank", "lr", "batch-tokens", ...;
 * train/options.c): the CLI checks its flags against it and nl_train checks every caller's
 * options with nl_train_check_opts, so the C API and Python refuse what the CLI refuses. */
typedef struct {
    const char *flag;
    double lo, hi;
    int integer;
} nl_train_range;
const nl_train_range *nl_train_range_of(const char *flag);
/* Every numeric option finite and in its range (a field's documented "off"/"default" value,
 * 0 or -1, allowed); -1 + "epochs inf: expected a number in [1e-06, 1000000]". */
int nl_train_check_opts(const nl_train_opts *o);
/* --keep-best's names: "loss" -> NL_KEEP_LOSS, "accuracy" -> NL_KEEP_ACCURACY; -1 otherwise. */
int nl_train_keep_best_from_name(const char *name);
/* The learning-rate schedule the run follows (o->lr_min < 0 resolved to 0.1 * lr). */
nl_schedule nl_train_schedule(const nl_train_opts *o);
/* 1 when o->overlap (and the backend, for "auto") asks for the synchronous mode (rt->sync). */
int nl_train_sync_mode(const nl_train_opts *o);
/* The snapshot of step `step` of a run writing `out` (save_every): out without its ".gguf",
 * then "-step<step>.gguf" (out/adapter.gguf -> out/adapter-step40.gguf). malloc'd; NULL (set)
 * when out of memory. */
char *nl_train_snapshot_path(const char *out, int64_t step);

typedef struct {
    int64_t steps_done;  /* optimizer steps completed overall (incl. resumed) */
    int64_t total_steps; /* 64-bit: sequences x epochs can pass 2^31 */
    double first_loss, last_loss;
    double seconds, service_seconds, paused_seconds;
    int64_t tokens;
    int stopped;       /* stopped early by a signal / stop_after */
    int signalled;     /* of those, by SIGINT/SIGTERM (the CLI exits 3) */
    int early_stopped; /* ended by early_stop (not a stop: the run is done) */
    /* Validation (zero without a validation set): this process's evaluations and their time
     * (pauses excluded; not in seconds' training share, nor in tokens/s), the last one, and the
     * best so far of the whole run (best_step 0: none). */
    int n_evals;
    double eval_seconds;
    int64_t val_step;
    double val_loss, val_accuracy; /* accuracy NAN without choices */
    int64_t best_step;
    double best_loss, best_accuracy;
} nl_train_result;

/* Train; 0 (the adapter written to o->out, also after a stop) or -1 (nl_err; whatever was
 * committed stays committed).
 *
 * Before any work: o->out (and o->dump_grads) must be creatable (its temp file is created and
 * removed), a fresh run refuses a checkpoint dir that holds commits, and --resume refuses
 * commits made with another model or other trajectory settings, naming each difference
 * ("rank 16 there, 8 now"); the settings are kept readable in DIR/run.json. The schedule may
 * change on --resume (more steps or epochs, another lr, schedule kind, lr_min, warmup): the run
 * continues with the optimizer state and says what changed ("resuming step 10: --steps 10 ->
 * 20, --lr 0.001 -> 0.0005"). A resume
 * with another backend / precision / wire only warns (no longer bit-identical); one on other
 * kernels (DIR/run.json "kernels", nl_proj_describe: e.g. AMX there, none here) is refused
 * unless allow_kernel_change, then warns. One run at a
 * time per checkpoint dir: an flock on DIR/lock (dropped by the kernel if the process dies).
 *
 * A run of fewer than NL_TRAIN_FEW_STEPS (20) optimizer steps, or shorter than one epoch,
 * prints a warning after its start-up line with settings that give more (train/plan.h,
 * nl_train_short_run: "--batch-tokens 512 gives 28 steps"); it trains as asked.
 *
 * Pacing: a thermal reading that fails mid-run (a host app's file missing or garbled) is a
 * warning, once per outage, and the run goes on; a bad file at start-up is an error.
 *
 * Memory preflight, before the first step (after the model, adapter and data are loaded,
 * before the start-up check of the service): the estimate
 *   resident weights (the service's resident bytes, converted copies included)
 *   + adapter state (params, grads, AdamW m and v: 4 floats a parameter; MeZO: 3)
 *   + stored layer inputs for the longest sequence ((n_layer+1) x T x n_embd floats)
 *   + the layer intermediates kept under the activation budget + one layer's recompute
 *     scratch (nl_graph_layer_bytes)
 *   + the head chunk (256 tokens x n_vocab floats, logits and their gradient)
 *   + held: measured (VmRSS) after the model is loaded and the data tokenized, less the two
 *     terms above it: the converted weights' source pages (mapped, read by the conversion),
 *     the model's other pages read so far, the tokenized data, the heap so far (with
 *     count_process, the process's memory before the run too)
 *   + buffers: the service's padded request buffers and each thread's scratch and stack
 * is printed ("memory: needs ...") and compared with MemAvailable at start-up (or
 * mem_limit_mb). The default activation budget is what is left after the rest (less a 512 MB
 * reserve under MemAvailable). A run that cannot fit stops before training, naming settings
 * that would fit, each computed: "--act-budget-mb N (recompute)", "--ctx N", "--precision q".
 *
 * Non-finite values: after each step's backward (MeZO: each step) the loss, the gradients and
 * the parameters are checked; the run stops, keeping the last commit, naming the step and the
 * first LoRA tensor (in adapter order) whose parameter or gradient is not finite.
 *
 * A failed commit (ENOSPC, EIO at write/fsync/close/rename/directory fsync) stops the run with
 * an error naming the step and the failed call; the previous commit stays loadable.
 *
 * --log-json: one line per optimizer step, written before that step's commit:
 *   {"step", "loss" (%.17g: exact), "tokens", "targets", "seconds", "service_seconds",
 *    "paused_seconds", "lr", "grad_norm"}
 * with MeZO also "projected_grad" (g = (L+ - L-)/(2 eps)); "loss" is then (L+ + L-)/2, the
 * batch loss at the unperturbed params up to O(eps^2), and "grad_norm" the norm of the
 * gradient estimate |g| * |z|. Where an energy counter exists (os/energy.h), also
 * "joules" (used during the step, commit excluded) and "joules_per_token"; never estimated.
 * A fresh run truncates the file. A resumed run first keeps only the complete lines with
 * step <= the commit it resumes from, then appends: the steps it replays after the commit are
 * logged once, and the file of an interrupted-and-resumed run reads like that of an
 * uninterrupted one (timings aside).
 *
 * Stops: a cancel of o->cancel (the CLI's SIGINT/SIGTERM; or stop_after) ends the run at the
 * next step boundary with a commit; a stop while paused abandons the step in progress and
 * commits the last finished one; a handle cancelled before the first step lets none run. The
 * library installs no signal handler. */
int nl_train(const nl_train_opts *o, nl_train_result *res);

#endif

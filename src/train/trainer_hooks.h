/* train/trainer_hooks: what the tests reach into nl_train with. Not part of the public API
 * (nightlora.h does not include it) and not carried by nl_train_opts: nl_train runs with none. */
#ifndef NL_TRAINER_HOOKS_H
#define NL_TRAINER_HOOKS_H

#include "model/adapter.h"
#include "os/io.h"
#include "train/trainer.h"

typedef struct {
    const nl_io *ckpt_io;    /* commits go through this I/O layer (NULL: POSIX) */
    const nl_io *log_io;     /* the --log-json's last fsync and close at the run's end (NULL: POSIX) */
    const char *energy_root; /* root of the sysfs tree for energy counters (NULL: "/") */
    /* Called after each backprop step's backward, before the gradients are checked, clipped and
     * applied (step: 1-based optimizer step; grads: [ad->n_params]); the non-finite check's test
     * writes a NaN there. NULL: none. */
    void (*after_backward)(void *user, int step, const nl_adapter *ad, float *grads);
    void *user;
    /* one graph call (and so one service request per projection) per sequence instead of one
     * for all sequences of the step: the reference the packed step must reproduce */
    int per_sequence;
} nl_train_hooks;

/* nl_train with hooks (h may be NULL: exactly nl_train). */
int nl_train_hooked(const nl_train_opts *o, const nl_train_hooks *h, nl_train_result *res);

#endif

/* The held-out split of a dataset (--val-split); see dataset.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "util/util.h"

int nl_dataset_is_held_out(int64_t i, double frac) {
    return i >= 1 && floor((double)i * frac) > floor((double)(i - 1) * frac);
}

static void totals(nl_dataset *ds) {
    ds->n_tokens = ds->n_targets = 0;
    for (int i = 0; i < ds->n; i++) {
        ds->n_tokens += ds->ex[i].n_tokens;
        ds->n_targets += ds->ex[i].n_targets;
    }
}

int nl_dataset_split(nl_dataset *ds, double frac, nl_dataset *held) {
    memset(held, 0, sizeof *held);
    if (!(frac > 0 && frac < 1)) return nl_err("--val-split %g: expected a fraction in (0, 1)", frac);
    int nh = 0; /* floor(n * frac) < n: never every example */
    for (int i = 1; i <= ds->n; i++) nh += nl_dataset_is_held_out(i, frac);
    if (nh == 0)
        return nl_err("--val-split %g: %s has %d examples, too few to hold any out (at least %.0f are needed)", frac,
                      ds->path, ds->n, ceil(1.0 / frac));
    held->path = nl_strdup(ds->path);
    held->ex = nl_malloc((size_t)nh * sizeof *held->ex);
    if (!held->path || !held->ex) {
        nl_dataset_free(held);
        return -1;
    }
    int kept = 0;
    for (int i = 0; i < ds->n; i++) {
        if (nl_dataset_is_held_out(i + 1, frac)) held->ex[held->n++] = ds->ex[i];
        else ds->ex[kept++] = ds->ex[i];
    }
    ds->n = kept;
    totals(ds);
    totals(held);
    return 0;
}

/* train/options: the one table of the numeric options' ranges, read by the CLI's flag checks
 * (tools/cmd_train.c) and by nl_train's own check of every caller's options (the C API, the
 * Python binding), so each face refuses what the others refuse, naming the option. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "train/trainer.h"
#include "util/util.h"

#define P53 9007199254740992.0 /* 2^53: integers above it are not all doubles */

static const nl_train_range ranges[] = {
    {"rank", 1, 4096, 1},
    {"alpha", -1e6, 1e6, 0},
    {"dropout", 0, 0.99, 0},
    {"lr", 1e-12, 10, 0},
    {"lr-min", 0, 10, 0},
    {"steps", 1, P53, 1},
    {"epochs", 1e-6, 1e6, 0},
    {"batch-tokens", 1, 1000000000, 1},
    {"commit-every", 1, P53, 1},
    {"save-every", 1, P53, 1},
    {"act-budget-mb", 0, 1099511627776.0, 1},
    {"warmup", 0, 1000000000, 1},
    {"clip", 0, 1e9, 0},
    {"weight-decay", 0, 10, 0},
    {"ctx", 2, 10000000, 1},
    {"stop-after", 1, 1000000000, 1},
    {"mezo-eps", 1e-12, 1, 0},
    {"mem-limit-mb", 1e-3, 1e12, 0},
    {"val-split", 1e-9, 0.999999, 0},
    {"eval-every", 1, P53, 1},
    {"early-stop", 1, 1000000000, 1},
    {"pacing-poll-ms", 1, 1e7, 0}, /* testing only (nl_train_opts.pacing_poll_s is in seconds) */
};

const nl_train_range *nl_train_range_of(const char *flag) {
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
        if (!strcmp(ranges[i].flag, flag)) return &ranges[i];
    return NULL;
}

/* v in the flag's range, or equal to `off` (the field's documented "unset" value) when `off_what`
 * names it; the error names the option as its flag. */
static int in_range(const char *flag, double v, const char *off_what, double off) {
    if (off_what && v == off) return 0;
    const nl_train_range *r = nl_train_range_of(flag);
    if (!(v >= r->lo && v <= r->hi) || (r->integer && v != floor(v))) {
        char alt[64] = "";
        if (off_what) snprintf(alt, sizeof alt, ", or %g (%s)", off, off_what);
        return nl_err("--%s %.17g: expected %s in [%.17g, %.17g]%s", flag, v, r->integer ? "an integer" : "a number",
                      r->lo, r->hi, alt);
    }
    return 0;
}

int nl_train_check_opts(const nl_train_opts *o) {
    /* the flags' ranges; 0 (or -1) where a field documents it as "off" / "from elsewhere" */
    if (in_range("rank", o->rank, NULL, 0) || in_range("alpha", o->alpha, NULL, 0) ||
        in_range("dropout", o->dropout, NULL, 0) || in_range("lr", o->lr, NULL, 0) ||
        (o->lr_min >= 0 && in_range("lr-min", o->lr_min, NULL, 0)) ||
        (isnan(o->lr_min) && in_range("lr-min", o->lr_min, NULL, 0)) ||
        in_range("steps", (double)o->steps, "from epochs", 0) ||
        (o->steps == 0 && in_range("epochs", o->epochs, NULL, 0)) ||
        in_range("batch-tokens", o->batch_tokens, "sized to the data", 0) ||
        in_range("commit-every", (double)o->commit_every, NULL, 0) ||
        in_range("save-every", (double)o->save_every, "off", 0) ||
        in_range("act-budget-mb", (double)o->act_budget_mb, "from the memory available", -1) ||
        in_range("warmup", o->warmup, NULL, 0) || (!(o->clip <= 0) && in_range("clip", o->clip, NULL, 0)) ||
        in_range("weight-decay", o->weight_decay, NULL, 0) || in_range("ctx", o->max_ctx, "the model's", 0) ||
        in_range("stop-after", o->stop_after, "off", 0) ||
        (o->method && !strcmp(o->method, "mezo") && in_range("mezo-eps", o->mezo_eps, NULL, 0)) ||
        in_range("mem-limit-mb", o->mem_limit_mb, "MemAvailable", 0) ||
        in_range("val-split", o->val_split, "none", 0) ||
        in_range("eval-every", (double)o->eval_every, "after the last step only", 0) ||
        in_range("early-stop", (double)o->early_stop, "off", 0))
        return -1;
    if (isnan(o->clip) || o->clip < -1e9)
        return nl_err("--clip %g: expected a number in [0, 1e9] (<= 0: off)", o->clip);
    return 0;
}

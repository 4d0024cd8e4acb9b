/* Validation during training; see validate.h. */
#include "train/validate.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/adapter.h"
#include "util/hash.h"
#include "util/util.h"

#define VAL_TAG 0x3130304c41564c4eull /* "NLVAL001" little-endian */

static uint64_t dbits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double bitsd(uint64_t u) {
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

void nl_val_state_init(nl_val_state *s) {
    memset(s, 0, sizeof *s);
    s->best_loss = INFINITY;
    s->best_accuracy = NAN;
}

void nl_val_state_pack(const nl_val_state *s, uint64_t w[NL_VAL_WORDS]) {
    w[0] = VAL_TAG;
    w[1] = (uint64_t)s->last_eval;
    w[2] = (uint64_t)s->best_step;
    w[3] = dbits(s->best_loss);
    w[4] = dbits(s->best_accuracy);
    w[5] = (uint64_t)s->bad;
}

int nl_val_state_unpack(const uint64_t *w, uint32_t n, const char *path, nl_val_state *s) {
    nl_val_state_init(s);
    if (n != NL_VAL_WORDS || w[0] != VAL_TAG)
        return nl_err(
            "%s: the commit holds no validation state (%u extra words): it was made by a run without validation", path,
            n);
    /* counts are never trusted into a wider meaning: a step beyond INT64_MAX is corrupt */
    if (w[1] > INT64_MAX || w[2] > INT64_MAX || w[5] > INT64_MAX || w[2] > w[1])
        return nl_err("%s: the commit's validation state is out of range", path);
    s->last_eval = (int64_t)w[1];
    s->best_step = (int64_t)w[2];
    s->best_loss = bitsd(w[3]);
    s->best_accuracy = bitsd(w[4]);
    s->bad = (int64_t)w[5];
    return 0;
}

int nl_val_due(int64_t step, int64_t total, int64_t every) { return step == total || (every > 0 && step % every == 0); }

double nl_val_accuracy(const nl_eval_result *r) { return r->n_items ? (double)r->n_correct / (double)r->n_items : NAN; }

int nl_val_update(nl_val_state *s, int metric, int64_t step, const nl_eval_result *r) {
    const double loss = nl_eval_loss(r), acc = nl_val_accuracy(r);
    int better;
    if (s->best_step == 0) better = 1;
    else if (metric == NL_KEEP_ACCURACY)
        better = acc > s->best_accuracy || (acc == s->best_accuracy && loss < s->best_loss);
    else better = loss < s->best_loss;
    s->last_eval = step;
    if (!better) {
        s->bad++;
        return 0;
    }
    s->best_step = step;
    s->best_loss = loss;
    s->best_accuracy = acc;
    s->bad = 0;
    return 1;
}

int nl_val_log_row(FILE *f, int64_t step, const nl_eval_result *r, double seconds) {
    const double acc = nl_val_accuracy(r);
    char a[40];
    if (isnan(acc)) snprintf(a, sizeof a, "null");
    else snprintf(a, sizeof a, "%.17g", acc);
    return fprintf(f,
                   "{\"eval\": {\"step\": %" PRId64
                   ", \"loss\": %.17g, \"accuracy\": %s, \"examples\": %d, \"tokens\": %" PRId64
                   ", \"seconds\": %.4f}}\n",
                   step, nl_eval_loss(r), a, r->n_examples, r->n_targets, seconds);
}

void nl_val_format(char *buf, size_t cap, int64_t step, const nl_eval_result *r, double seconds) {
    int k = snprintf(buf, cap, "eval at step %" PRId64 ": val loss %.4f", step, nl_eval_loss(r));
    if (k >= 0 && (size_t)k < cap && r->n_items)
        k += snprintf(buf + k, cap - (size_t)k, ", accuracy %.1f%% (%d/%d)", 100.0 * r->n_correct / r->n_items,
                      r->n_correct, r->n_items);
    if (k >= 0 && (size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, ", %d examples, %" PRId64 " target tokens, %.1f s", r->n_examples,
                 r->n_targets, seconds);
}

int nl_train_keep_best_from_name(const char *name) {
    if (!strcmp(name, "loss")) return NL_KEEP_LOSS;
    if (!strcmp(name, "accuracy")) return NL_KEEP_ACCURACY;
    return -1;
}

int nl_val_init(nl_validator *v, int max_ctx, int64_t every, int keep, int64_t patience) {
    v->max_ctx = max_ctx;
    v->every = every;
    v->keep = keep;
    v->metric = keep == NL_KEEP_ACCURACY ? NL_KEEP_ACCURACY : NL_KEEP_LOSS;
    v->patience = patience;
    nl_val_state_init(&v->st);
    nl_eval_result r;
    if (nl_eval_check(&v->ds, max_ctx, &r)) return nl_err_prefix("validation set");
    if (keep == NL_KEEP_ACCURACY) {
        int items = 0;
        for (int i = 0; i < v->ds.n; i++) items += v->ds.ex[i].n_choices > 0;
        if (!items)
            return nl_err("--keep-best accuracy: the validation set %s has no line with \"choices\" to score (use "
                          "--keep-best loss)",
                          v->ds.path);
    }
    return 0;
}

uint64_t nl_val_hash(const nl_validator *v) {
    nl_hasher h;
    nl_hasher_init(&h, 0x6e6c76616cull);
    for (int i = 0; i < v->ds.n; i++) {
        const nl_example *ex = &v->ds.ex[i];
        const int32_t head[4] = {ex->n_tokens, ex->n_prompt, ex->n_choices, ex->answer};
        nl_hasher_update(&h, head, sizeof head);
        nl_hasher_update(&h, ex->ids, (size_t)ex->n_tokens * sizeof *ex->ids);
        nl_hasher_update(&h, ex->target, (size_t)ex->n_tokens);
        for (int k = 0; k < ex->n_choices; k++) {
            nl_hasher_update(&h, &ex->choice_len[k], sizeof ex->choice_len[k]);
            nl_hasher_update(&h, ex->choice_ids[k], (size_t)ex->choice_len[k] * sizeof(int32_t));
        }
    }
    return nl_hasher_final(&h);
}

void nl_val_say(const nl_validator *v, FILE *f, const char *what) {
    if (!f) return;
    char when[64] = "at the end";
    if (v->every == 1) snprintf(when, sizeof when, "after every step");
    else if (v->every > 0) snprintf(when, sizeof when, "after every %" PRId64 " steps and at the end", v->every);
    fprintf(f, "validation: %d examples (%s), %s", v->ds.n, what, when);
    if (v->keep)
        fprintf(f, "; the best adapter by %s kept in --out", v->keep == NL_KEEP_ACCURACY ? "accuracy" : "loss");
    if (v->patience > 0) fprintf(f, "; early stop after %" PRId64 " evaluations without improvement", v->patience);
    fputc('\n', f);
}

void nl_val_free(nl_validator *v) {
    if (v->loaded) nl_dataset_free(&v->ds);
    v->loaded = 0;
}

int nl_val_eval(nl_validator *v, nl_runtime *rt, int64_t step, const double *paused, FILE *log, FILE *progress,
                const nl_adapter *ad, const nl_model *m, const char *out) {
    const double p0 = *paused, t0 = nl_now();
    nl_eval_result r;
    if (nl_eval_dataset(rt, &v->ds, v->max_ctx, &r)) return nl_err_prefix("step %" PRId64 ": validation", step);
    const double sec = (nl_now() - t0) - (*paused - p0);
    v->seconds += sec;
    v->last_seconds = sec;
    v->n_evals++;
    v->last = r;
    v->last_step = step;
    const int better = nl_val_update(&v->st, v->metric, step, &r);
    if (log && (nl_val_log_row(log, step, &r, sec) < 0 || fflush(log) != 0)) {
        v->failed_flag = "--log-json";
        return nl_err("--log-json: write failed: %s", strerror(errno)), -2;
    }
    if (better && v->keep && nl_adapter_save(ad, m, out)) {
        v->failed_flag = "--out";
        return nl_err_prefix("--out %s: writing the best adapter failed", out), -2;
    }
    if (progress) {
        char line[320];
        nl_val_format(line, sizeof line, step, &r, sec);
        if (better && v->keep)
            fprintf(progress, "%s  best so far: adapter of step %" PRId64 " written to %s\n", line, step, out);
        else if (better) fprintf(progress, "%s  best so far\n", line);
        else
            fprintf(progress, "%s  no better than step %" PRId64 " (%" PRId64 " evaluation%s without improvement%s)\n",
                    line, v->st.best_step, v->st.bad, v->st.bad == 1 ? "" : "s",
                    nl_val_stop(&v->st, v->patience) ? ": early stop" : "");
        fflush(progress);
    }
    return 0;
}

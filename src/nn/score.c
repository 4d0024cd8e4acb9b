/* Scoring a dataset (loss, accuracy); see score.h. */
#include "nn/score.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* ---- batches: examples packed into one forward ----
 *
 * An item is one sequence to score: an example's own tokens (its loss), or its prompt followed by
 * one choice (that choice's log-likelihood: the row before each choice token predicts it). Items
 * of consecutive examples are packed back to back up to batch_tokens rows (an item longer than
 * that runs alone) and go through nl_forward_packed and the head as one request per projection;
 * each item's sum is its rows' losses added in row order, the bits of a forward of the item
 * alone (the service's rows are independent). */
typedef struct {
    int ex;      /* example index */
    int choice;  /* -1: the example's loss; else the choice */
    int n;       /* rows */
} item;

typedef struct {
    nl_runtime *rt;
    const nl_dataset *ds;
    int max_ctx, cap;       /* cap: rows per batch */
    item *it;
    int n_it, it_cap;
    int rows;               /* queued rows */
    int32_t *tok, *tgt;     /* [cap or the longest item] */
    int *seg;
    double *rl;             /* [rows] */
    float *h;
    int buf_rows;
    double **ll;            /* [ds->n]: each example's choice log-likelihoods (NULL: none yet) */
    double *loss;           /* [ds->n] */
    int64_t *count;         /* [ds->n] */
} batcher;

static int reserve(batcher *b, int rows) {
    if (rows <= b->buf_rows) return 0;
    const int E = b->rt->m->hp.n_embd;
    free(b->tok);
    free(b->tgt);
    free(b->rl);
    free(b->h);
    b->tok = nl_malloc((size_t)rows * sizeof *b->tok);
    b->tgt = nl_malloc((size_t)rows * sizeof *b->tgt);
    b->rl = nl_malloc((size_t)rows * sizeof *b->rl);
    b->h = nl_malloc((size_t)rows * E * sizeof *b->h);
    if (!b->tok || !b->tgt || !b->rl || !b->h) {
        b->buf_rows = 0;
        return -1;
    }
    b->buf_rows = rows;
    return 0;
}

/* The tokens and row targets of an item into tok/tgt. */
static void item_rows(const batcher *b, const item *it, int32_t *tok, int32_t *tgt) {
    const nl_example *ex = &b->ds->ex[it->ex];
    if (it->choice < 0) {
        memcpy(tok, ex->ids, (size_t)it->n * sizeof *tok);
        nl_row_targets(ex->ids, ex->target, it->n, tgt);
        return;
    }
    const int np = ex->n_prompt, c = ex->choice_len[it->choice];
    const int32_t *ch = ex->choice_ids[it->choice];
    memcpy(tok, ex->ids, (size_t)np * sizeof *tok);
    memcpy(tok + np, ch, (size_t)c * sizeof *tok);
    for (int t = 0; t < it->n; t++) tgt[t] = -1;
    /* row np-1+i predicts choice token i (with no prompt, the first has nothing before it) */
    for (int i = np > 0 ? 0 : 1; i < c; i++) tgt[np - 1 + i] = ch[i];
}

static int flush(batcher *b) {
    if (b->n_it == 0) return 0;
    if (reserve(b, b->rows)) return -1;
    int *seg = nl_malloc((size_t)b->n_it * sizeof *seg);
    if (!seg) return -1;
    for (int i = 0, t0 = 0; i < b->n_it; t0 += b->it[i++].n) {
        item_rows(b, &b->it[i], b->tok + t0, b->tgt + t0);
        seg[i] = b->it[i].n;
    }
    int rc = nl_forward_packed(b->rt, b->tok, b->rows, b->n_it, seg, b->h);
    if (rc == 0) rc = nl_head_loss_rows(b->rt, b->h, b->tgt, b->rows, b->rl);
    for (int i = 0, t0 = 0; rc == 0 && i < b->n_it; t0 += b->it[i++].n) {
        const item *it = &b->it[i];
        double sum = 0.0;
        int64_t cnt = 0;
        for (int t = 0; t < it->n; t++) {
            sum += b->rl[t0 + t];
            cnt += b->tgt[t0 + t] >= 0;
        }
        if (it->choice < 0) {
            b->loss[it->ex] = sum;
            b->count[it->ex] = cnt;
        } else {
            b->ll[it->ex][it->choice] = -sum;
        }
    }
    if (rc) {
        const nl_example *ex = &b->ds->ex[b->it[0].ex], *ex1 = &b->ds->ex[b->it[b->n_it - 1].ex];
        if (ex == ex1) nl_err_prefix("%s:%d", b->ds->path, ex->line);
        else nl_err_prefix("%s:%d-%d", b->ds->path, ex->line, ex1->line);
    }
    free(seg);
    b->n_it = 0;
    b->rows = 0;
    return rc;
}

static int push(batcher *b, int ex, int choice, int n) {
    if (b->rows + n > b->cap && b->n_it > 0 && flush(b)) return -1;
    if (b->n_it == b->it_cap) {
        int cap = b->it_cap ? 2 * b->it_cap : 64;
        item *t = realloc(b->it, (size_t)cap * sizeof *t);
        if (!t) return nl_err("out of memory");
        b->it = t;
        b->it_cap = cap;
    }
    b->it[b->n_it++] = (item){ex, choice, n};
    b->rows += n;
    return 0;
}

/* "line 3" / "lines 3, 7, 9, ..." for the dropped examples. */
static void format_lines(const nl_eval_result *r, char *buf, size_t cap) {
    const int shown = r->n_dropped < 8 ? r->n_dropped : 8;
    size_t k = (size_t)snprintf(buf, cap, "line%s", shown > 1 ? "s" : "");
    for (int i = 0; i < shown && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s %d", i ? "," : "", r->dropped_line[i]);
    if (r->n_dropped > shown && k < cap) snprintf(buf + k, cap - k, ", ...");
}

/* The tokens of ex scored within max_ctx (0: dropped, no target left within it). */
static int scored_len(const nl_example *ex, int max_ctx) {
    int n = ex->n_tokens < max_ctx ? ex->n_tokens : max_ctx;
    return n < ex->n_tokens && nl_example_targets_within(ex, max_ctx) == 0 ? 0 : n;
}

int nl_eval_check(const nl_dataset *ds, int max_ctx, nl_eval_result *r) {
    memset(r, 0, sizeof *r);
    r->ctx = max_ctx;
    int64_t targets = 0;
    for (int i = 0; i < ds->n; i++) {
        const nl_example *ex = &ds->ex[i];
        const int n = scored_len(ex, max_ctx);
        r->n_examples++;
        if (n > 0) targets += nl_example_targets_within(ex, n);
        if (n == 0) {
            if (r->n_dropped < (int)(sizeof r->dropped_line / sizeof *r->dropped_line)) r->dropped_line[r->n_dropped] = ex->line;
            r->n_dropped++;
        } else if (n < ex->n_tokens) {
            r->n_truncated++;
        }
        for (int k = 0; k < ex->n_choices; k++) {
            int len = ex->n_prompt + ex->choice_len[k];
            if (len > max_ctx) return nl_err("%s:%d: choice %d needs %d tokens, more than the context %d", ds->path, ex->line, k, len, max_ctx);
        }
    }
    if (targets == 0) {
        char lines[128];
        format_lines(r, lines, sizeof lines);
        return nl_err("%s: no example has a target token within the context of %d: all %d dropped (%s); raise --ctx or shorten "
                      "what comes before the targets", ds->path, max_ctx, r->n_examples, lines);
    }
    return 0;
}

int nl_eval_dataset_opts(nl_runtime *rt, const nl_dataset *ds, int max_ctx, const nl_eval_opts *o, nl_eval_result *r) {
    if (nl_eval_check(ds, max_ctx, r)) return -1;
    batcher b = {.rt = rt, .ds = ds, .max_ctx = max_ctx};
    b.cap = o && o->batch_tokens > 0 ? o->batch_tokens : NL_EVAL_BATCH_TOKENS;
    int rc = 0;
    b.ll = calloc((size_t)(ds->n > 0 ? ds->n : 1), sizeof *b.ll);
    b.loss = calloc((size_t)(ds->n > 0 ? ds->n : 1), sizeof *b.loss);
    b.count = calloc((size_t)(ds->n > 0 ? ds->n : 1), sizeof *b.count);
    if (!b.ll || !b.loss || !b.count) rc = nl_err("out of memory");
    /* queue every example's items; the examples before the first one still queued are complete
     * and are counted (and reported) in file order */
    int done = 0;
    for (int i = 0; rc == 0 && i <= ds->n; i++) {
        if (i < ds->n) {
            const nl_example *ex = &ds->ex[i];
            const int n = scored_len(ex, max_ctx);
            if (n > 0) rc = push(&b, i, -1, n);
            if (rc == 0 && ex->n_choices > 0 && !(b.ll[i] = nl_malloc((size_t)ex->n_choices * sizeof **b.ll))) rc = -1;
            for (int k = 0; rc == 0 && k < ex->n_choices; k++) rc = push(&b, i, k, ex->n_prompt + ex->choice_len[k]);
        } else {
            rc = flush(&b);
        }
        const int upto = b.n_it > 0 ? b.it[0].ex : (i < ds->n ? i + 1 : ds->n);
        for (; rc == 0 && done < upto; done++) {
            const nl_example *ex = &ds->ex[done];
            nl_eval_example e = {.line = ex->line, .loss_sum = b.loss[done], .n_targets = b.count[done], .n_choices = ex->n_choices,
                                 .ll = b.ll[done], .predicted = -1, .answer = ex->answer};
            r->loss_sum += e.loss_sum;
            r->n_targets += e.n_targets;
            if (ex->n_choices > 0) {
                int best = 0;
                for (int k = 1; k < ex->n_choices; k++)
                    if (e.ll[k] > e.ll[best]) best = k;
                e.predicted = best;
                r->n_items++;
                r->n_correct += best == ex->answer;
            }
            if (o && o->on_example) o->on_example(o->user, &e);
            free(b.ll[done]);
            b.ll[done] = NULL;
        }
    }
    for (int i = 0; b.ll && i < ds->n; i++) free(b.ll[i]);
    free(b.ll);
    free(b.loss);
    free(b.count);
    free(b.it);
    free(b.tok);
    free(b.tgt);
    free(b.rl);
    free(b.h);
    return rc;
}

int nl_eval_dataset(nl_runtime *rt, const nl_dataset *ds, int max_ctx, nl_eval_result *r) {
    return nl_eval_dataset_opts(rt, ds, max_ctx, NULL, r);
}

void nl_eval_format_cut(const nl_eval_result *r, char *buf, size_t cap) {
    char lines[128];
    format_lines(r, lines, sizeof lines);
    int k = 0;
    buf[0] = 0;
    if (r->n_truncated) k = snprintf(buf, cap, ", %d truncated to %d tokens", r->n_truncated, r->ctx);
    if (r->n_dropped && k >= 0 && (size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, ", %d dropped with no target within the context (%s)", r->n_dropped, lines);
}

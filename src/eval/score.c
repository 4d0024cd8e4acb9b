/* Scoring a dataset (loss, accuracy); see score.h. */
#include "eval/score.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "util/util.h"

/* ---- batches: examples packed into one forward ----
 *
 * An item is one sequence to score: an example's own tokens (its loss), or its prompt followed by
 * one choice (that choice's log-likelihood: the row before each choice token predicts it). An
 * example's prompt runs once: its choices are segments continuing it (nl_forward_packed_prefix,
 * a shared prefix), and its loss sequence, which is prompt + the answer (nl_dataset), is the
 * answer's choice scored once for both. Per choice (nl_eval_opts.per_choice,
 * NL_EVAL_PER_CHOICE=1) every choice is its own sequence, prompt + choice, as before the shared
 * prefixes; so is every choice of a prompt too short to share (nl_attention_prefix_rows: a
 * prompt of a few tokens, a choice making it longer). Groups of consecutive examples (an example's prompt, its choices
 * and its loss) are packed back to back up to batch_tokens rows (a longer group runs alone) and go through the forward
 * as one request per projection, then the head over the rows that predict a target only (per choice: over every row).
 * Each item's sum is its target rows' losses added in row order: the bits of a forward of the item alone (the service's
 * rows are independent, and a continuation's rows are those of prompt + choice as one sequence). */
enum { IT_SEQ, IT_PREFIX, IT_BRANCH };

typedef struct {
    int ex;        /* example index */
    int choice;    /* IT_SEQ: -1 the example's loss, else the choice; IT_BRANCH: the choice */
    int n;         /* rows of its segment */
    int kind;      /* IT_SEQ: a sequence of its own; IT_PREFIX: the example's prompt (no score);
                    * IT_BRANCH: a choice continuing the IT_PREFIX before it */
    int also_loss; /* IT_BRANCH: its sum is the example's loss too */
} item;

typedef struct {
    nl_runtime *rt;
    const nl_dataset *ds;
    int max_ctx, cap; /* cap: rows per batch */
    int per_choice;
    item *it;
    int n_it, it_cap;
    int rows;                   /* queued rows */
    int32_t *tok, *tgt;         /* [buf_rows] */
    int32_t *sel_row, *sel_tgt; /* the head's rows: row of h, its target */
    double *rl;                 /* [buf_rows] */
    float *h, *hs;              /* hidden rows [buf_rows][E]; the head's rows gathered */
    int buf_rows;
    double **ll;    /* [ds->n]: each example's choice log-likelihoods (NULL: none yet) */
    double *loss;   /* [ds->n] */
    int64_t *count; /* [ds->n] */
    int n_shared;   /* examples queued with their prompt once */
} batcher;

static int reserve(batcher *b, int rows) {
    if (rows <= b->buf_rows) return 0;
    const int E = b->rt->m->hp.n_embd;
    free(b->tok);
    free(b->tgt);
    free(b->sel_row);
    free(b->sel_tgt);
    free(b->rl);
    free(b->h);
    free(b->hs);
    b->tok = nl_malloc((size_t)rows * sizeof *b->tok);
    b->tgt = nl_malloc((size_t)rows * sizeof *b->tgt);
    b->sel_row = nl_malloc((size_t)rows * sizeof *b->sel_row);
    b->sel_tgt = nl_malloc((size_t)rows * sizeof *b->sel_tgt);
    b->rl = nl_malloc((size_t)rows * sizeof *b->rl);
    b->h = nl_malloc((size_t)rows * E * sizeof *b->h);
    b->hs = b->per_choice ? NULL : nl_malloc((size_t)rows * E * sizeof *b->hs);
    if (!b->tok || !b->tgt || !b->sel_row || !b->sel_tgt || !b->rl || !b->h || (!b->per_choice && !b->hs)) {
        b->buf_rows = 0;
        return -1;
    }
    b->buf_rows = rows;
    return 0;
}

/* The tokens and row targets of an IT_SEQ item into tok/tgt. */
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
    const int E = b->rt->m->hp.n_embd;
    int *seg = nl_malloc((size_t)b->n_it * 3 * sizeof *seg);
    if (!seg) return -1;
    int *pre = seg + b->n_it, *sel0 = pre + b->n_it; /* seg_pre; each item's first head row */
    /* the segments' tokens, and the head's rows in each item's row order */
    int n_sel = 0;
    for (int i = 0, t0 = 0, p = -1, p0 = 0; i < b->n_it; t0 += b->it[i++].n) {
        const item *it = &b->it[i];
        const nl_example *ex = &b->ds->ex[it->ex];
        seg[i] = it->n;
        pre[i] = -1;
        sel0[i] = n_sel;
        if (it->kind == IT_SEQ) {
            item_rows(b, it, b->tok + t0, b->tgt + t0);
            for (int t = 0; t < it->n; t++)
                if (b->per_choice || b->tgt[t0 + t] >= 0) {
                    b->sel_row[n_sel] = t0 + t;
                    b->sel_tgt[n_sel++] = b->tgt[t0 + t];
                }
        } else if (it->kind == IT_PREFIX) {
            memcpy(b->tok + t0, ex->ids, (size_t)it->n * sizeof *b->tok);
            p = i;
            p0 = t0;
        } else {
            const int32_t *ch = ex->choice_ids[it->choice];
            memcpy(b->tok + t0, ch, (size_t)it->n * sizeof *b->tok);
            pre[i] = p;
            /* the prompt's last row predicts the choice's first token, its rows the rest */
            b->sel_row[n_sel] = p0 + b->it[p].n - 1;
            b->sel_tgt[n_sel++] = ch[0];
            for (int t = 0; t + 1 < it->n; t++) {
                b->sel_row[n_sel] = t0 + t;
                b->sel_tgt[n_sel++] = ch[t + 1];
            }
        }
    }
    int rc = nl_forward_packed_prefix(b->rt, b->tok, b->rows, b->n_it, seg, b->per_choice ? NULL : pre, b->h);
    if (rc == 0 && b->per_choice) {
        rc = nl_head_loss_rows(b->rt, b->h, b->tgt, b->rows, b->rl); /* every row is selected, in order */
    } else if (rc == 0) {
        for (int j = 0; j < n_sel; j++)
            memcpy(b->hs + (size_t)j * E, b->h + (size_t)b->sel_row[j] * E, (size_t)E * sizeof *b->hs);
        if (n_sel > 0) rc = nl_head_loss_rows(b->rt, b->hs, b->sel_tgt, n_sel, b->rl);
    }
    for (int i = 0; rc == 0 && i < b->n_it; i++) {
        const item *it = &b->it[i];
        if (it->kind == IT_PREFIX) continue;
        const int j1 = i + 1 < b->n_it ? sel0[i + 1] : n_sel;
        double sum = 0.0;
        int64_t cnt = 0;
        for (int j = sel0[i]; j < j1; j++) {
            sum += b->rl[j];
            cnt += b->sel_tgt[j] >= 0;
        }
        if (it->kind == IT_SEQ && it->choice < 0) {
            b->loss[it->ex] = sum;
            b->count[it->ex] = cnt;
        } else {
            b->ll[it->ex][it->choice] = -sum;
            if (it->also_loss) {
                b->loss[it->ex] = sum;
                b->count[it->ex] = cnt;
            }
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

/* A group of `rows` rows goes next: the batch so far runs first when it would not fit. */
static int group(batcher *b, int rows) { return b->rows + rows > b->cap && b->n_it > 0 ? flush(b) : 0; }

static int add(batcher *b, item it) {
    if (b->n_it == b->it_cap) {
        int cap = b->it_cap ? 2 * b->it_cap : 64;
        item *t = realloc(b->it, (size_t)cap * sizeof *t);
        if (!t) return nl_err("out of memory");
        b->it = t;
        b->it_cap = cap;
    }
    b->it[b->n_it++] = it;
    b->rows += it.n;
    return 0;
}

static int push(batcher *b, int ex, int choice, int n) {
    return group(b, n) || add(b, (item){ex, choice, n, IT_SEQ, 0}) ? -1 : 0;
}

/* 1 when the example's loss sequence (its first n tokens) is its prompt + the answer with
 * targets on the answer only: the answer's continuation scores it. */
static int loss_is_answer(const nl_example *ex, int n) {
    const int np = ex->n_prompt, a = ex->answer;
    if (a < 0 || a >= ex->n_choices || n != ex->n_tokens || n != np + ex->choice_len[a]) return 0;
    if (memcmp(ex->ids + np, ex->choice_ids[a], (size_t)ex->choice_len[a] * sizeof *ex->ids)) return 0;
    for (int t = 0; t < n; t++)
        if (!ex->target[t] != (t < np)) return 0;
    return 1;
}

/* Queue example i: its loss (n rows, 0: dropped) and its choices. */
static int queue_example(batcher *b, int i, int n) {
    const nl_example *ex = &b->ds->ex[i];
    if (ex->n_choices > 0 && !(b->ll[i] = nl_malloc((size_t)ex->n_choices * sizeof **b->ll))) return -1;
    int alone = ex->n_choices == 0 || b->per_choice || ex->n_prompt == 0;
    for (int k = 0; !alone && k < ex->n_choices; k++)
        alone = !nl_attention_prefix_rows(ex->n_prompt, ex->n_prompt + ex->choice_len[k]);
    if (alone) {
        if (n > 0 && push(b, i, -1, n)) return -1;
        for (int k = 0; k < ex->n_choices; k++)
            if (push(b, i, k, ex->n_prompt + ex->choice_len[k])) return -1;
        return 0;
    }
    b->n_shared++;
    const int shared = n > 0 && loss_is_answer(ex, n);
    int rows = ex->n_prompt + (n > 0 && !shared ? n : 0);
    for (int k = 0; k < ex->n_choices; k++) rows += ex->choice_len[k];
    if (group(b, rows)) return -1;
    if (n > 0 && !shared && add(b, (item){i, -1, n, IT_SEQ, 0})) return -1;
    if (add(b, (item){i, -1, ex->n_prompt, IT_PREFIX, 0})) return -1;
    for (int k = 0; k < ex->n_choices; k++)
        if (add(b, (item){i, k, ex->choice_len[k], IT_BRANCH, shared && k == ex->answer})) return -1;
    return 0;
}

/* "line 3" / "lines 3, 7, 9, ..." for the dropped examples. */
static void format_lines(const nl_eval_result *r, char *buf, size_t cap) {
    const int shown = r->n_dropped < 8 ? r->n_dropped : 8;
    size_t k = (size_t)snprintf(buf, cap, "line%s", shown > 1 ? "s" : "");
    for (int i = 0; i < shown && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s %d", i ? "," : "", r->dropped_line[i]);
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
            if (r->n_dropped < (int)(sizeof r->dropped_line / sizeof *r->dropped_line))
                r->dropped_line[r->n_dropped] = ex->line;
            r->n_dropped++;
        } else if (n < ex->n_tokens) {
            r->n_truncated++;
        }
        for (int k = 0; k < ex->n_choices; k++) {
            int len = ex->n_prompt + ex->choice_len[k];
            if (len > max_ctx)
                return nl_err("%s:%d: choice %d needs %d tokens, more than the context %d", ds->path, ex->line, k, len,
                              max_ctx);
        }
    }
    if (targets == 0) {
        char lines[128];
        format_lines(r, lines, sizeof lines);
        return nl_err(
            "%s: no example has a target token within the context of %d: all %d dropped (%s); raise --ctx or shorten "
            "what comes before the targets",
            ds->path, max_ctx, r->n_examples, lines);
    }
    return 0;
}

int nl_eval_dataset_opts(nl_runtime *rt, const nl_dataset *ds, int max_ctx, const nl_eval_opts *o, nl_eval_result *r) {
    if (nl_eval_check(ds, max_ctx, r)) return -1;
    batcher b = {.rt = rt, .ds = ds, .max_ctx = max_ctx};
    b.cap = o && o->batch_tokens > 0 ? o->batch_tokens : NL_EVAL_BATCH_TOKENS;
    const char *pc = getenv("NL_EVAL_PER_CHOICE");
    b.per_choice = (o && o->per_choice) || (pc && !strcmp(pc, "1"));
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
            rc = queue_example(&b, i, scored_len(ex, max_ctx));
        } else {
            rc = flush(&b);
        }
        const int upto = b.n_it > 0 ? b.it[0].ex : (i < ds->n ? i + 1 : ds->n);
        for (; rc == 0 && done < upto; done++) {
            const nl_example *ex = &ds->ex[done];
            nl_eval_example e = {.line = ex->line,
                                 .loss_sum = b.loss[done],
                                 .n_targets = b.count[done],
                                 .n_choices = ex->n_choices,
                                 .ll = b.ll[done],
                                 .predicted = -1,
                                 .answer = ex->answer};
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
    r->n_shared = b.n_shared;
    for (int i = 0; b.ll && i < ds->n; i++) free(b.ll[i]);
    free(b.ll);
    free(b.loss);
    free(b.count);
    free(b.it);
    free(b.tok);
    free(b.tgt);
    free(b.sel_row);
    free(b.sel_tgt);
    free(b.rl);
    free(b.h);
    free(b.hs);
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

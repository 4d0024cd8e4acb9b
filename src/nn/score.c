/* Scoring a dataset (loss, accuracy); see score.h. */
#include "nn/score.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* Sum of -log p over rows [from, n-1) of ids (each row predicting the next id). */
static int seq_nll(nl_runtime *rt, const int32_t *ids, const uint8_t *target, int n, double *sum, int64_t *count) {
    int E = rt->m->hp.n_embd;
    float *h = nl_malloc((size_t)n * E * sizeof(float));
    int32_t *rows = nl_malloc((size_t)n * sizeof *rows);
    int rc = -1;
    if (h && rows) {
        nl_row_targets(ids, target, n, rows);
        *count = 0;
        for (int t = 0; t < n; t++) *count += rows[t] >= 0;
        rc = nl_forward(rt, NULL, ids, n, h);
        if (rc == 0) rc = nl_head_loss(rt, h, rows, n, sum, NULL);
    }
    free(h);
    free(rows);
    return rc;
}

/* Log-likelihood of each choice after the example's prompt: the prompt runs once into a
 * decoding state, then every choice continues from a copy of it (the recurrent states restored,
 * the prompt's KV rows shared). ll[k] = Σ log p(choice_k tokens | prompt, earlier choice tokens);
 * with an empty prompt the first choice token has nothing before it and is not scored. */
static int choice_lls(nl_runtime *rt, const nl_example *ex, int max_len, double *ll) {
    const nl_model *m = rt->m;
    const int E = m->hp.n_embd, np = ex->n_prompt;
    int maxc = 0;
    for (int k = 0; k < ex->n_choices; k++) maxc = ex->choice_len[k] > maxc ? ex->choice_len[k] : maxc;
    nl_seq_state st, snap;
    int have_st = nl_seq_state_init(&st, m, max_len) == 0, have_snap = have_st && nl_seq_state_init(&snap, m, 1) == 0;
    float *h = nl_malloc((size_t)(np > maxc ? np : maxc) * E * sizeof(float));
    float *rows = nl_malloc((size_t)maxc * E * sizeof(float));
    int32_t *tg = nl_malloc((size_t)maxc * sizeof *tg);
    float *last = nl_malloc((size_t)E * sizeof(float));
    int rc = -1;
    if (!have_st || !have_snap || !h || !rows || !tg || !last) goto done;
    if (np > 0) {
        if (nl_forward(rt, &st, ex->ids, np, h)) goto done;
        memcpy(last, h + (size_t)(np - 1) * E, (size_t)E * sizeof(float));
    }
    nl_seq_state_copy(&snap, &st, m, 0);
    for (int k = 0; k < ex->n_choices; k++) {
        const int c = ex->choice_len[k];
        nl_seq_state_copy(&st, &snap, m, 0);
        if (nl_forward(rt, &st, ex->choice_ids[k], c, h)) goto done;
        /* hidden row i predicts choice token i: the prompt's last row, then the choice's rows */
        int n = 0;
        if (np > 0) {
            memcpy(rows, last, (size_t)E * sizeof(float));
            tg[n++] = ex->choice_ids[k][0];
        }
        for (int i = 1; i < c; i++) {
            memcpy(rows + (size_t)n * E, h + (size_t)(i - 1) * E, (size_t)E * sizeof(float));
            tg[n++] = ex->choice_ids[k][i];
        }
        double s = 0.0;
        if (n > 0 && nl_head_loss(rt, rows, tg, n, &s, NULL)) goto done;
        ll[k] = -s;
    }
    rc = 0;
done:
    if (have_snap) nl_seq_state_free(&snap, m);
    if (have_st) nl_seq_state_free(&st, m);
    free(h);
    free(rows);
    free(tg);
    free(last);
    return rc;
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

int nl_eval_dataset(nl_runtime *rt, const nl_dataset *ds, int max_ctx, nl_eval_result *r) {
    if (nl_eval_check(ds, max_ctx, r)) return -1;
    for (int i = 0; i < ds->n; i++) {
        const nl_example *ex = &ds->ex[i];
        const int n = scored_len(ex, max_ctx);
        if (n > 0) {
            double s;
            int64_t c;
            if (seq_nll(rt, ex->ids, ex->target, n, &s, &c)) return nl_err_prefix("%s:%d", ds->path, ex->line);
            r->loss_sum += s;
            r->n_targets += c;
        }
        if (ex->n_choices == 0) continue;
        /* score each choice after the shared prompt (each fits the context: nl_eval_check) */
        int max_len = 0;
        for (int k = 0; k < ex->n_choices; k++) {
            int len = ex->n_prompt + ex->choice_len[k];
            max_len = len > max_len ? len : max_len;
        }
        double *ll = nl_malloc((size_t)ex->n_choices * sizeof *ll);
        if (!ll) return -1;
        if (choice_lls(rt, ex, max_len, ll)) {
            free(ll);
            return nl_err_prefix("%s:%d", ds->path, ex->line);
        }
        int best = 0;
        for (int k = 1; k < ex->n_choices; k++)
            if (ll[k] > ll[best]) best = k;
        free(ll);
        r->n_items++;
        r->n_correct += best == ex->answer;
    }
    return 0;
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

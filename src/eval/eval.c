/* Evaluation; see eval.h. */
#include "eval/eval.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void nl_row_targets(const int32_t *ids, const uint8_t *target, int n, int32_t *rows) {
    for (int t = 0; t + 1 < n; t++) rows[t] = target[t + 1] ? ids[t + 1] : -1;
    if (n > 0) rows[n - 1] = -1;
}

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

int nl_eval_dataset(nl_runtime *rt, const nl_dataset *ds, int max_ctx, nl_eval_result *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < ds->n; i++) {
        const nl_example *ex = &ds->ex[i];
        int n = ex->n_tokens < max_ctx ? ex->n_tokens : max_ctx;
        double s;
        int64_t c;
        if (seq_nll(rt, ex->ids, ex->target, n, &s, &c)) return nl_err_prefix("%s:%d", ds->path, ex->line);
        r->loss_sum += s;
        r->n_targets += c;
        r->n_examples++;
        if (ex->n_choices == 0) continue;
        /* score each choice after the shared prompt */
        int max_len = 0;
        for (int k = 0; k < ex->n_choices; k++) {
            int len = ex->n_prompt + ex->choice_len[k];
            if (len > max_ctx) return nl_err("%s:%d: choice %d needs %d tokens, more than the context %d", ds->path, ex->line, k, len, max_ctx);
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

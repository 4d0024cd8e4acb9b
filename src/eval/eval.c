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
        /* score each choice: context + choice, targets on the choice tokens */
        int best = -1;
        double best_ll = 0.0;
        for (int k = 0; k < ex->n_choices; k++) {
            int len = ex->n_prompt + ex->choice_len[k];
            if (len > max_ctx) return nl_err("%s:%d: choice %d needs %d tokens, more than the context %d", ds->path, ex->line, k, len, max_ctx);
            int32_t *ids = nl_malloc((size_t)len * sizeof *ids);
            uint8_t *tg = nl_calloc((size_t)len, 1);
            if (!ids || !tg) { free(ids); free(tg); return -1; }
            memcpy(ids, ex->ids, (size_t)ex->n_prompt * sizeof *ids);
            memcpy(ids + ex->n_prompt, ex->choice_ids[k], (size_t)ex->choice_len[k] * sizeof *ids);
            memset(tg + ex->n_prompt, 1, (size_t)ex->choice_len[k]);
            int rc = seq_nll(rt, ids, tg, len, &s, &c);
            free(ids);
            free(tg);
            if (rc) return nl_err_prefix("%s:%d", ds->path, ex->line);
            if (best < 0 || -s > best_ll) { best = k; best_ll = -s; }
        }
        r->n_items++;
        r->n_correct += best == ex->answer;
    }
    return 0;
}

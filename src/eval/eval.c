/* eval/eval: the eval command's pass over a file; see eval.h. */
#include "eval/eval.h"

#include <math.h>

#include "util/util.h"

int nl_eval_file(nl_runtime *rt, const nl_tokenizer *tok, const char *path, const nl_data_opts *opts, int ctx,
                 const nl_eval_opts *eo, nl_eval_result *r) {
    const nl_model *m = rt->m;
    nl_data_opts dopt = {0};
    if (opts) dopt = *opts;
    dopt.n_vocab = m->hp.n_vocab;
    nl_dataset ds;
    if (nl_dataset_load(path, tok, &dopt, &ds)) return -1;
    /* as in training: the model's context, capped at 4096 unless --ctx says otherwise */
    if (ctx == 0) ctx = m->hp.n_ctx_train > 0 && m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    int rc =
        ctx < 2 ? nl_err("%s: the model's context length is %d, too small to evaluate (at least 2; --ctx sets another)",
                         m->path, ctx)
                : nl_eval_dataset_opts(rt, &ds, ctx, eo, r);
    /* a loss computed with NaN or Inf is no result (the model or the adapter overflowed) */
    if (rc == 0 && !isfinite(r->loss_sum))
        rc = nl_err("%s: the loss is not finite (%g over %lld target tokens): the forward of %s%s overflows; no result",
                    path, r->loss_sum, (long long)r->n_targets, m->path, rt->adapter ? " with the adapter" : "");
    nl_dataset_free(&ds);
    return rc;
}

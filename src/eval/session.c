/* Inference session, sampling and generation; see session.h. */
#include "eval/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "model/quant.h"
#include "util/rng.h"
#include "util/util.h"

int nl_session_open(nl_session *s, const char *model_path, const char *adapter_path, const nl_proj_config *cfg) {
    memset(s, 0, sizeof *s);
    /* no config: the CLI's inference defaults (host backend, every core up to 8, the stored
     * weight types) */
    nl_proj_config def;
    nl_proj_config_defaults(&def);
    def.precision = "keep";
    s->m = nl_model_load(model_path);
    if (!s->m) return -1;
    if (nl_tokenizer_for_model(s->m, &s->tok)) goto fail;
    if (adapter_path) {
        s->adapter = nl_adapter_load(s->m, adapter_path);
        if (!s->adapter) goto fail;
        /* as train and merge: a LoRA on a head tied to the embedding (token_embd.weight.lora_a/b)
         * is llama.cpp's embedding adapter, not a head one; no command computes it as either */
        if (s->m->tied_head && s->adapter->by_proj[s->m->p_output] >= 0) {
            nl_err(
                "%s adapts token_embd.weight, which %s ties to its output head: llama.cpp applies such a pair as an "
                "embedding adapter, nightlora's graph as a head one, and merge refuses it; retrain without \"output\" "
                "in --targets",
                adapter_path, model_path);
            goto fail;
        }
    }
    s->svc = nl_proj_service_new(cfg ? cfg : &def);
    if (!s->svc) goto fail;
    if (nl_runtime_init(&s->rt, s->m, s->svc)) goto fail;
    s->rt.adapter = s->adapter;
    /* the planner validates every (projection, direction, bucket) of the backend against ref */
    if (nl_proj_plan(s->svc, NULL, 0)) goto fail;
    return 0;
fail:
    nl_session_close(s);
    return -1;
}

void nl_session_sync_cpu(nl_session *s) { s->rt.sync = nl_proj_backend_on_cpu(nl_proj_backend_name(s->svc)); }

void nl_session_close(nl_session *s) {
    nl_runtime_free(&s->rt);
    if (s->svc) nl_proj_service_free(s->svc);
    nl_adapter_free(s->adapter);
    nl_tokenizer_free(s->tok);
    if (s->m) nl_model_free(s->m);
    memset(s, 0, sizeof *s);
}

/* 0 when logits[T][V] are all finite, else -1 naming the first that is not: a result computed
 * with NaN or Inf is no result (the model or the adapter overflowed the forward). */
static int check_logits(const nl_session *s, const float *logits, int T, int V, int pos0) {
    for (size_t k = 0; k < (size_t)T * (size_t)V; k++)
        if (!isfinite(logits[k]))
            return nl_err("%s: the forward is not finite: logit %zu of position %zu = %g (the model's weights%s "
                          "overflow it); no result",
                          s->m->path, k % (size_t)V, (size_t)pos0 + k / (size_t)V, (double)logits[k],
                          s->rt.adapter ? " or the adapter" : "");
    return 0;
}

int nl_session_logits(nl_session *s, const int32_t *tokens, int T, float *logits) {
    float *h = nl_malloc((size_t)T * s->m->hp.n_embd * sizeof(float));
    if (!h) return -1;
    int rc = nl_forward(&s->rt, NULL, tokens, T, h);
    if (rc == 0) rc = nl_head_logits(&s->rt, h, T, logits);
    if (rc == 0) rc = check_logits(s, logits, T, s->m->hp.n_vocab, 0);
    free(h);
    return rc;
}

typedef struct {
    float p;
    int32_t id;
} prob_id;

static int cmp_prob_desc(const void *a, const void *b) {
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* ties by id: deterministic */
}

int32_t nl_sample(const float *logits, int V, float temp, float top_p, double u) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0.0f) return best;
    prob_id *pi = malloc((size_t)V * sizeof *pi);
    if (!pi) return best;
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        pi[i].p = expf((logits[i] - logits[best]) / temp);
        pi[i].id = i;
        sum += pi[i].p;
    }
    qsort(pi, (size_t)V, sizeof *pi, cmp_prob_desc);
    /* nucleus: the smallest prefix whose mass reaches top_p */
    int n = V;
    if (top_p > 0.0f && top_p < 1.0f) {
        double c = 0.0;
        for (int i = 0; i < V; i++) {
            c += pi[i].p / sum;
            if (c >= top_p) {
                n = i + 1;
                break;
            }
        }
    }
    double mass = 0.0;
    for (int i = 0; i < n; i++) mass += pi[i].p;
    double target = u * mass, c = 0.0;
    int32_t id = pi[n - 1].id;
    for (int i = 0; i < n; i++) {
        c += pi[i].p;
        if (c > target) {
            id = pi[i].id;
            break;
        }
    }
    free(pi);
    return id;
}

/* [0,1) with 53 bits: the sampler's stream, value `step` of the counter RNG keyed by the seed. */
static double sample_uniform(uint64_t seed, uint64_t step) {
    return (double)(nl_rng_u64(seed, step) >> 11) * (1.0 / 9007199254740992.0);
}

int nl_generate(nl_session *s, const int32_t *prompt, int n_prompt, const nl_sample_params *p,
                void (*on_token)(void *user, int32_t id), void *user, int32_t **out, int *n_out) {
    const nl_model *m = s->m;
    int V = m->hp.n_vocab, E = m->hp.n_embd;
    if (n_prompt < 1) return nl_err("generate: empty prompt");
    int n_ctx = n_prompt + p->n_predict;
    if (n_ctx > m->hp.n_ctx_train && m->hp.n_ctx_train > 0) n_ctx = m->hp.n_ctx_train;
    if (n_prompt >= n_ctx) return nl_err("generate: prompt of %d tokens fills the context (%d)", n_prompt, n_ctx);
    nl_seq_state st;
    if (nl_seq_state_init(&st, m, n_ctx)) return -1;
    float *h = nl_malloc((size_t)n_prompt * E * sizeof(float));
    float *logits = nl_malloc((size_t)V * sizeof(float));
    int32_t *gen = nl_malloc((size_t)(p->n_predict + 1) * sizeof(int32_t));
    int rc = -1, ng = 0;
    if (!h || !logits || !gen) goto done;
    if (nl_forward(&s->rt, &st, prompt, n_prompt, h)) goto done;
    if (nl_head_logits(&s->rt, h + (size_t)(n_prompt - 1) * E, 1, logits) ||
        check_logits(s, logits, 1, V, n_prompt - 1))
        goto done;
    int32_t eos = s->tok ? nl_token_eos(s->tok) : -1, eot = s->tok ? nl_token_eot(s->tok) : -1;
    for (ng = 0; ng < p->n_predict; ng++) {
        int32_t id = nl_sample(logits, V, p->temp, p->top_p, sample_uniform(p->seed, (uint64_t)ng));
        gen[ng] = id;
        if (on_token) on_token(user, id);
        if (p->stop_at_eog && (id == eos || id == eot)) {
            ng++;
            break;
        }
        if (st.n_past >= n_ctx) {
            ng++;
            break;
        }
        if (nl_forward(&s->rt, &st, &id, 1, h)) goto done;
        if (nl_head_logits(&s->rt, h, 1, logits) || check_logits(s, logits, 1, V, st.n_past - 1)) goto done;
    }
    rc = 0;
done:
    if (rc == 0 && out) {
        *out = gen;
        gen = NULL;
    }
    if (n_out) *n_out = ng;
    free(gen);
    free(h);
    free(logits);
    nl_seq_state_free(&st, m);
    return rc;
}

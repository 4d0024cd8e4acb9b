/* eval/session: a loaded model + optional adapter + projection service + runtime, for the
 * inference commands (logits, generate, eval). */
#ifndef NL_SESSION_H
#define NL_SESSION_H

#include <stdint.h>

#include "data/tokenizer.h"
#include "model/adapter.h"
#include "model/model.h"
#include "nn/forward.h"
#include "proj/proj.h"

typedef struct {
    nl_model *m;
    nl_tokenizer *tok;   /* the model's vocabulary; NULL when the GGUF has none */
    nl_adapter *adapter; /* may be NULL */
    nl_proj_service *svc;
    nl_runtime rt;
} nl_session;

/* adapter_path may be NULL; cfg may be NULL: the CLI's inference defaults (nl_proj_config_defaults:
 * host backend, every core up to 8; precision "keep": the weights in their stored types). */
int nl_session_open(nl_session *s, const char *model_path, const char *adapter_path, const nl_proj_config *cfg);
/* The LoRA branches after each request, on the runtime's pool (rt.sync), when the backend is a
 * CPU one (host, ref), whose threads own the cores while a request is in flight: what `eval`
 * runs (the trainer sets the same for its validation). The same bits either way. */
void nl_session_sync_cpu(nl_session *s);
void nl_session_close(nl_session *s);

/* Full-sequence forward: logits[T][n_vocab]. */
int nl_session_logits(nl_session *s, const int32_t *tokens, int T, float *logits);

typedef struct {
    int n_predict; /* tokens to generate */
    float temp;    /* 0 = greedy */
    float top_p;   /* 1 = off */
    uint64_t seed;
    int stop_at_eog; /* stop at EOS / end of turn */
} nl_sample_params;

/* Prefill `prompt`, then decode token by token with the KV cache / GDN state. Each generated id
 * is passed to on_token (may be NULL); out/n_out (may be NULL) receive them too (malloc'd). */
int nl_generate(nl_session *s, const int32_t *prompt, int n_prompt, const nl_sample_params *p,
                void (*on_token)(void *user, int32_t id), void *user, int32_t **out, int *n_out);

/* Pick the next token from logits[V]: greedy when temp == 0, else softmax(logits/temp) with
 * nucleus top_p, using a uniform u in [0,1). */
int32_t nl_sample(const float *logits, int V, float temp, float top_p, double u);

#endif

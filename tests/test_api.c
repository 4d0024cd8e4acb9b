/* The public header alone is enough to make a model, train an adapter and evaluate it. */
#include <unistd.h>

#include "nightlora.h"
#include "test.h"

int main(void) {
    char dir[128], model[256], data[256], out[256];
    snprintf(dir, sizeof dir, "/tmp/nl_test_api_%d", (int)getpid());
    snprintf(model, sizeof model, "%s.gguf", dir);
    snprintf(data, sizeof data, "%s.jsonl", dir);
    snprintf(out, sizeof out, "%s-adapter.gguf", dir);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_F32, 3, model) == 0);
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return nl_t_done();
    for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"note %d:\", \"completion\": \" %s\"}\n", i, i % 2 ? "odd" : "even");
    fclose(f);
    nl_train_opts o;
    nl_train_defaults(&o);
    /* the library's defaults are the CLI's: host backend, every core up to 8, precision auto */
    CHECK(o.proj.backend && !strcmp(o.proj.backend, "host") && o.proj.n_threads == nl_proj_default_threads());
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(nl_proj_default_threads() == (ncpu > 8 ? 8 : ncpu > 0 ? (int)ncpu : 1));
    CHECK(o.proj.precision == NULL && o.proj.backend_impl == NULL);
    o.model = model;
    o.data = data;
    o.out = out;
    o.steps = 3;
    o.batch_tokens = 64;
    o.progress = NULL;
    o.thermal = "off";
    nl_train_result r;
    CHECKF(nl_train(&o, &r) == 0, "%s", nl_last_error());
    CHECK(r.steps_done == 3 && isfinite(r.last_loss));
    nl_session s;
    CHECKF(nl_session_open(&s, model, out, NULL) == 0, "%s", nl_last_error());
    CHECK(s.adapter != NULL && s.adapter->n > 0);
    /* no config: host on every core up to 8, and the weights in their stored type (this F32
     * model's projections stay F32; training's policy would have made them Q8_0) */
    CHECK(!strcmp(nl_proj_backend_name(s.svc), "host") && nl_proj_threads(s.svc) == nl_proj_default_threads());
    int n_f32 = 0;
    for (int i = 0; i < nl_proj_count(s.svc); i++) n_f32 += nl_proj_get(s.svc, i)->type == NL_TYPE_F32;
    CHECK(nl_proj_count(s.svc) > 0 && n_f32 == nl_proj_count(s.svc));
    int32_t tok[4] = {1, 2, 3, 4};
    float *logits = malloc(sizeof(float) * 4 * (size_t)s.m->hp.n_vocab);
    CHECK(nl_session_logits(&s, tok, 4, logits) == 0 && isfinite(logits[0]));
    free(logits);
    nl_session_close(&s);
    CHECK(nl_model_load("/nonexistent.gguf") == NULL && strstr(nl_last_error(), "/nonexistent.gguf"));
    unlink(model);
    unlink(data);
    unlink(out);
    return nl_t_done();
}

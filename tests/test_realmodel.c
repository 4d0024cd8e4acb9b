/* The real pretrained model end to end (SmolLM2-135M-Instruct as published: llama, tied head,
 * Q4_1 projections, Q8_0 embedding, smollm pre-tokenizer, ChatML with a default system turn),
 * through the library with its default settings (what every nightlora command runs): it loads
 * as stored, answers a question greedily, and a short LoRA run on it trains, writes an adapter
 * the session loads and evaluates. Skipped, saying so, when the model is not in
 * ${NL_MODEL_CACHE:-$HOME/.cache/nightlora} (tools/fetch-models.sh puts it there). NL_TEST_SMALL
 * (CI's qemu runs): the same checks on the ref backend with 64-token batches (the host backend's
 * start checks of this model, every projection and the 49152-row head at 16/64/256 rows, took
 * more than the 40 min the whole test was given under qemu -cpu max; test_realgemma plans the
 * phone kernels on a real file at 16 rows). */
#include <unistd.h>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/eval.h"
#include "eval/session.h"
#include "model/quant.h"
#include "train/trainer.h"
#include "test.h"

static char tmpdir[256];

/* The model as stored: every projection Q4_1, the tied head and the embedding one Q8_0 tensor,
 * nothing converted by the inference defaults. */
static void test_load(const nl_session *s) {
    const nl_model *m = s->m;
    CHECK(m->arch == NL_ARCH_LLAMA && m->tied_head && m->hp.n_layer == 30 && m->hp.n_embd == 576 &&
          m->hp.n_vocab == 49152);
    int n_q41 = 0, n_head = 0;
    for (int i = 0; i < nl_proj_count(s->svc); i++) {
        const nl_proj_weight *w = nl_proj_get(s->svc, i);
        if (w->cls == NL_CLASS_ATTN || w->cls == NL_CLASS_MLP) n_q41 += w->type == NL_TYPE_Q4_1;
        else n_head += w->type == NL_TYPE_Q8_0;
    }
    CHECKF(n_q41 == 30 * 7 && n_head >= 1, "%d Q4_1 projections, %d Q8_0 head/embed", n_q41, n_head);
    CHECK(nl_proj_converted_bytes(s->svc) == 0);
}

/* Greedy answer to a question through the model's own chat template. */
static void test_generate(nl_session *s) {
    int32_t *prompt = NULL, *gen = NULL;
    int np = 0, ng = 0;
    const char *q = "What is the capital of France?";
    CHECK(nl_chat_prompt_tokens(s->tok, NULL, q, strlen(q), &prompt, &np) == 0);
    nl_sample_params sp = {.n_predict = 12, .temp = 0.0f, .top_p = 1.0f, .seed = 0, .stop_at_eog = 1};
    CHECKF(nl_generate(s, prompt, np, &sp, NULL, NULL, &gen, &ng) == 0, "%s", nl_last_error());
    char *text = NULL;
    size_t len = 0;
    CHECK(ng > 0 && nl_detokenize(s->tok, gen, ng, &text, &len) == 0);
    CHECKF(text && strstr(text, "Paris"), "answer: %s", text ? text : "(none)");
    printf("generate: %s -> %.*s\n", q, (int)len, text ? text : "");
    free(text);
    free(gen);
    free(prompt);
}

/* The examples' chat files through the model's own template (the Jinja interpreter on the
 * GGUF's tokenizer.chat_template) give the tokens and targets the built-in ChatML with its
 * default system turn gave before the interpreter, for SmolLM2; and the one-user-turn prompt of
 * `generate` too. */
static void test_own_template(const nl_session *s) {
    static const char *const files[] = {NL_TEST_DATA "/../../examples/tagging-chat-train.jsonl",
                                        NL_TEST_DATA "/../../examples/tagging-chat-test.jsonl"};
    for (int k = 0; k < 2; k++) {
        nl_dataset own, builtin;
        nl_data_opts o1 = {.chat_template = NULL}, o2 = {.chat_template = "chatml"};
        CHECKF(nl_dataset_load(files[k], s->tok, &o1, &own) == 0, "%s", nl_last_error());
        CHECKF(nl_dataset_load(files[k], s->tok, &o2, &builtin) == 0, "%s", nl_last_error());
        bool same = own.n == builtin.n && own.n > 0;
        for (int i = 0; same && i < own.n; i++) {
            const nl_example *a = &own.ex[i], *b = &builtin.ex[i];
            same = a->n_tokens == b->n_tokens && a->n_prompt == b->n_prompt && a->n_choices == b->n_choices &&
                   memcmp(a->ids, b->ids, (size_t)a->n_tokens * sizeof *a->ids) == 0 &&
                   memcmp(a->target, b->target, (size_t)a->n_tokens) == 0;
            if (!same) fprintf(stderr, "%s: line %d differs\n", files[k], a->line);
        }
        CHECK(same);
        printf("own template: %s: %d examples, the same tokens and targets as the built-in chatml\n", files[k], own.n);
        nl_dataset_free(&own);
        nl_dataset_free(&builtin);
    }
    const char *q = "Tag this note: Dentist at 3pm";
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    CHECK(nl_chat_prompt_tokens(s->tok, NULL, q, strlen(q), &a, &na) == 0);
    CHECK(nl_chat_prompt_tokens(s->tok, "chatml", q, strlen(q), &b, &nb) == 0);
    CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0);
    free(a);
    free(b);
}

int main(void) {
    char model[1024];
    if (!nl_t_real_model(model, sizeof model, "real-model checks")) return nl_t_done();
    if (nl_t_tmpdir(tmpdir, sizeof tmpdir, "realmodel")) return 1;
    nl_session s;
    const nl_proj_config ref = {.backend = "ref"}, *cfg = nl_t_small() ? &ref : NULL;
    CHECKF(nl_session_open(&s, model, NULL, cfg) == 0, "%s", nl_last_error());
    test_load(&s);
    test_generate(&s);
    test_own_template(&s);
    nl_session_close(&s);

    /* a few LoRA steps on chat data through the template, with the library's defaults */
    char data[512], out[512];
    snprintf(data, sizeof data, "%s/notes.jsonl", tmpdir);
    snprintf(out, sizeof out, "%s/adapter.gguf", tmpdir);
    FILE *f = fopen(data, "w");
    CHECK(f != NULL);
    if (!f) return nl_t_done();
    static const char *const notes[][2] = {{"Book the hotel for Friday", "travel"},
                                           {"Buy milk and eggs", "shopping"},
                                           {"Dentist at 3pm", "health"},
                                           {"Send the report to Anna", "work"}};
    for (int i = 0; i < 4; i++)
        fprintf(f,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"Tag this note: %s\"}, "
                "{\"role\": \"assistant\", \"content\": \"%s\"}]}\n",
                notes[i][0], notes[i][1]);
    fclose(f);
    nl_train_opts o;
    nl_train_defaults(&o);
    o.model = model;
    o.data = data;
    o.out = out;
    o.steps = 2;
    o.batch_tokens = nl_t_small() ? 64 : 256;
    if (nl_t_small()) o.proj.backend = "ref";
    o.rank = 4;
    o.targets = "q,v";
    o.lr = 1e-3;
    o.thermal = "off";
    o.progress = NULL;
    nl_train_result r;
    CHECKF(nl_train(&o, &r) == 0, "%s", nl_last_error());
    CHECK(r.steps_done == 2 && isfinite(r.first_loss) && isfinite(r.last_loss) && r.first_loss > 0);
    /* the adapter loads, evaluates, and leaves the tied head alone */
    CHECKF(nl_session_open(&s, model, out, cfg) == 0, "%s", nl_last_error());
    CHECK(s.adapter && s.adapter->n == 60 && s.adapter->by_proj[s.m->p_output] < 0);
    nl_dataset ds;
    nl_data_opts dopt = {.n_vocab = s.m->hp.n_vocab};
    nl_eval_result er;
    CHECK(nl_dataset_load(data, s.tok, &dopt, &ds) == 0);
    CHECKF(nl_eval_dataset(&s.rt, &ds, 512, &er) == 0, "%s", nl_last_error());
    CHECK(er.n_targets > 0 && isfinite(er.loss_sum));
    printf("train: loss %.4f -> %.4f in 2 steps; eval loss %.4f over %lld targets\n", r.first_loss, r.last_loss,
           er.loss_sum / (double)er.n_targets, (long long)er.n_targets);
    nl_dataset_free(&ds);
    nl_session_close(&s);
    nl_t_tmpdir_done(tmpdir);
    return nl_t_done();
}

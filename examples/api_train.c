/* The public C API end to end: make a tiny synthetic model, train a LoRA adapter on it for a few
 * steps with a progress callback, then evaluate, generate and take logits with the adapter.
 *
 *   cc api_train.c $(pkg-config --cflags --libs nightlora) -o api_train
 *   ./api_train examples/tagging-train.jsonl examples/tagging-test.jsonl /tmp/api-demo
 *
 * The work directory is created (it must not exist yet); the model and the adapter are written
 * there. Exit status: 0 ok, 1 an error (printed), 2 a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nightlora.h>

typedef struct {
    int rows;
    double last_loss;
} ui_state;

/* Called after every optimizer step, on the training thread. */
static void show(void *user, const nightlora_progress *p) {
    ui_state *ui = user;
    if (p->kind != NIGHTLORA_PROGRESS_STEP) return;
    ui->rows++;
    ui->last_loss = p->loss;
    printf("step %lld/%lld  loss %.4f  %.0f tok/s\n", (long long)p->step, (long long)p->total_steps, p->loss, p->tokens_per_s);
}

static int fail(const char *what) {
    fprintf(stderr, "api_train: %s: %s\n", what, nightlora_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: api_train TRAIN.jsonl TEST.jsonl WORKDIR\n");
        return 2;
    }
    if (nightlora_abi_version() != NIGHTLORA_ABI_VERSION) {
        fprintf(stderr, "api_train: built for ABI %d, the library is ABI %d\n", NIGHTLORA_ABI_VERSION, nightlora_abi_version());
        return 1;
    }
    const char *train = argv[1], *test = argv[2], *dir = argv[3];
    if (mkdir(dir, 0777) != 0) {
        perror(dir);
        return 1;
    }
    char model[4096], adapter[4096];
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    snprintf(adapter, sizeof adapter, "%s/adapter.gguf", dir);

    nightlora_mkmodel_params mk;
    nightlora_mkmodel_default_params(&mk); /* qwen3, tiny, f32 */
    mk.seed = 3;
    if (nightlora_mkmodel(model, &mk)) return fail("mkmodel");

    nightlora_train_params tp;
    nightlora_train_default_params(&tp);
    tp.model = model;
    tp.data = train;
    tp.out = adapter;
    tp.steps = 4;
    tp.batch_tokens = 256;
    tp.lr = 2e-3;
    tp.thermal = "off";
    ui_state ui = {0, 0};
    tp.on_progress = show;
    tp.user = &ui;
    nightlora_run *run = nightlora_run_new(); /* another thread (or a signal handler) may cancel it */
    if (!run) return fail("run_new");
    nightlora_train_result tr;
    int rc = nightlora_train(&tp, run, &tr);
    nightlora_run_free(run);
    if (rc) return fail("train");
    printf("trained %lld steps (%d progress rows): loss %.4f -> %.4f\n", (long long)tr.steps_done, ui.rows, tr.first_loss, tr.last_loss);
    if (ui.rows != tr.steps_done || ui.last_loss != tr.last_loss) {
        fprintf(stderr, "api_train: %d progress rows for %lld steps\n", ui.rows, (long long)tr.steps_done);
        return 1;
    }

    nightlora_model_params mp;
    nightlora_model_default_params(&mp);
    mp.adapter = adapter;
    nightlora_model *m = nightlora_model_open(model, &mp);
    if (!m) return fail("model_open");
    nightlora_eval_result er;
    if (nightlora_eval(m, test, NULL, &er)) return fail("eval");
    printf("eval: %d examples, loss %.4f, ppl %.3f\n", er.n_examples, er.loss, er.ppl);

    int32_t ids[64];
    int n = nightlora_tokenize(m, "Note: Book the hotel for Friday", 1, ids, 64);
    if (n < 0) return fail("tokenize");
    size_t V = (size_t)nightlora_model_n_vocab(m);
    float *logits = malloc((size_t)n * V * sizeof *logits);
    if (!logits || nightlora_logits(m, ids, n, logits)) return fail("logits");
    size_t best = 0;
    for (size_t v = 1; v < V; v++)
        if (logits[(size_t)(n - 1) * V + v] > logits[(size_t)(n - 1) * V + best]) best = v;
    printf("%d tokens; the most likely next token is %zu\n", n, best);
    free(logits);

    nightlora_generate_params gp;
    nightlora_generate_default_params(&gp);
    gp.n_predict = 8;
    char *text = NULL;
    int ng = nightlora_generate(m, "Note: Book the hotel for Friday", &gp, &text);
    if (ng < 0) return fail("generate");
    printf("generated %d tokens: \"%s\"\n", ng, text);
    nightlora_free(text);

    /* errors name what was wrong, and leave the handle usable */
    if (nightlora_eval(m, "/nonexistent.jsonl", NULL, &er) == 0 || !strstr(nightlora_last_error(), "/nonexistent.jsonl")) {
        fprintf(stderr, "api_train: a missing data file was not an error naming it\n");
        return 1;
    }
    nightlora_model_close(m);
    return 0;
}

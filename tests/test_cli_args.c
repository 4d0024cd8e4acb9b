/* The command line's flag values and paths, as the user sees them (the real CLI, NL_CLI):
 *   an output never replaces an input: train --out = --model, --out / --log-json = --data,
 *   --dump-grads = --init-adapter, an input at OUT.tmp, a symlink and a hard link to an
 *   input, an input the run would write in --checkpoint-dir, merge --out = --model, logits
 *   --out = --adapter: each a usage error naming both flags, the input untouched;
 *   numbers: integer flags parsed strictly with the range in the message (--rank 1.9,
 *   --seed 1e3, --threads 1e9, a too-large --steps, mkmodel --seed -1), generate --temp nan,
 *   bench step --tokens 0 naming --tokens; 64-bit step counts (2200 sequences x 1e6 epochs,
 *   no 100000-epoch cap), a forged commit step above INT_MAX refused at --resume;
 *   messages: a too-large token id is out of the vocabulary (not "a fraction"), a model whose
 *   context length is 1 is named, block_count's tensor count printed without overflow;
 *   a JSONL line over 64 MiB: an error at file:line before parsing, peak RSS under 3x it. */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "data/dataset.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "train/checkpoint.h"
#include "util/util.h"

static char tmp[256], model[512], data[512], errf[512], outf[512];

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Run NL_CLI with args (NULL-terminated); stderr in errf, stdout in outf; the exit status
 * (128 + signal when killed); the child's peak RSS in last_maxrss_kb. */
static long last_maxrss_kb;
static int run(const char *const *args) {
    const char *v[64];
    int n = 0;
    v[n++] = NL_CLI;
    for (int i = 0; args[i] && n < 63; i++) v[n++] = args[i];
    v[n] = NULL;
    pid_t pid = nl_t_spawn(v, errf, outf);
    if (pid < 0) return -1;
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0)
        if (errno != EINTR) return -1;
    last_maxrss_kb = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* exit status want and every needle (up to 3) in stderr; prints the first line of stderr */
static void expect(const char *what, int rc, int want, const char *n1, const char *n2, const char *n3) {
    char *e = nl_t_slurp(errf, NULL);
    const char *s = e ? e : "";
    int ok = rc == want && (!n1 || strstr(s, n1)) && (!n2 || strstr(s, n2)) && (!n3 || strstr(s, n3));
    CHECKF(ok, "%s: exit %d (expected %d): %s", what, rc, want, s);
    const char *line = strstr(s, "nightlora ");
    printf("%-40s exit %d  %.*s\n", what, rc, line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    free(e);
}

/* A copy of a file's bytes, to check an input was left alone. */
typedef struct {
    char *b;
    size_t n;
} snap;
static snap take(const char *p) {
    snap s = {0, 0};
    s.b = nl_t_slurp(p, &s.n);
    return s;
}
static int unchanged(const char *p, snap *s) {
    size_t n;
    char *b = nl_t_slurp(p, &n);
    int r = b && s->b && n == s->n && memcmp(b, s->b, n) == 0;
    free(b);
    free(s->b);
    s->b = NULL;
    return r;
}

#define TRAIN(...)                                                                                                     \
    ((const char *const[]){"train", "--model", model, "--data", data, "--steps", "1", "--batch-tokens", "64",          \
                           "--rank", "2", "--thermal", "off", __VA_ARGS__, NULL})

static void test_no_overwrite(void) {
    char adapter[512], slink[512], hard[512], ck[512], ckdata[600], tmpin[600], out[512];
    path_of(out, sizeof out, "out.gguf");
    path_of(adapter, sizeof adapter, "adapter.gguf");
    CHECK(run(TRAIN("--out", adapter)) == 0);
    snap m = take(model), d = take(data), a = take(adapter);

    expect("train --out = --model", run(TRAIN("--out", model)), 2, "--out", "--model", "same file");
    CHECK(unchanged(model, &m));
    m = take(model);
    expect("train --out = --data", run(TRAIN("--out", data)), 2, "--out", "--data", "same file");
    CHECK(unchanged(data, &d));
    d = take(data);
    expect("train --log-json = --data", run(TRAIN("--out", out, "--log-json", data)), 2, "--log-json", "--data",
           "same file");
    CHECK(unchanged(data, &d));
    d = take(data);
    expect("train --dump-grads = --init-adapter",
           run(TRAIN("--out", out, "--init-adapter", adapter, "--dump-grads", adapter)), 2, "--dump-grads",
           "--init-adapter", NULL);
    CHECK(unchanged(adapter, &a));
    /* another spelling, a symlink, a hard link: the same file */
    char spelled[600];
    snprintf(spelled, sizeof spelled, "%s/./sub/../q3.gguf", tmp);
    char sub[512];
    path_of(sub, sizeof sub, "sub");
    mkdir(sub, 0777);
    expect("train --out = --model (another spelling)", run(TRAIN("--out", spelled)), 2, "--out", "--model", NULL);
    path_of(slink, sizeof slink, "link.jsonl");
    CHECK(symlink(data, slink) == 0);
    expect("train --out = a symlink to --data", run(TRAIN("--out", slink)), 2, "--out", "--data", NULL);
    path_of(hard, sizeof hard, "hard.gguf");
    CHECK(link(model, hard) == 0);
    expect("train --out = a hard link to --model", run(TRAIN("--out", hard)), 2, "--out", "--model", NULL);
    CHECK(unchanged(model, &m));
    CHECK(unchanged(data, &d));
    /* an input at OUT.tmp: the run writes (and removes) it */
    snprintf(tmpin, sizeof tmpin, "%s.tmp", out);
    CHECK(rename(data, tmpin) == 0);
    d = take(tmpin);
    const char *const t1[] = {"train", "--model", model, "--data",    tmpin, "--out",
                              out,     "--steps", "1",   "--thermal", "off", NULL};
    expect("train --data = OUT.tmp", run(t1), 2, "--out", "--data", ".tmp");
    CHECK(unchanged(tmpin, &d));
    CHECK(rename(tmpin, data) == 0);
    /* an input the run would write in its checkpoint directory */
    path_of(ck, sizeof ck, "ck");
    mkdir(ck, 0777);
    snprintf(ckdata, sizeof ckdata, "%s/run.json", ck);
    d = take(data);
    CHECK(rename(data, ckdata) == 0);
    const char *const t2[] = {"train", "--model",          model, "--data",    ckdata, "--out",
                              out,     "--checkpoint-dir", ck,    "--thermal", "off",  NULL};
    expect("train --data in --checkpoint-dir (run.json)", run(t2), 2, "--data", "--checkpoint-dir", NULL);
    CHECK(unchanged(ckdata, &d));
    CHECK(rename(ckdata, data) == 0);
    /* its history too (runs.jsonl, the report's list of commands) */
    snprintf(ckdata, sizeof ckdata, "%s/runs.jsonl", ck);
    d = take(data);
    CHECK(rename(data, ckdata) == 0);
    expect("train --data in --checkpoint-dir (runs.jsonl)", run(t2), 2, "--data", "--checkpoint-dir", NULL);
    CHECK(unchanged(ckdata, &d));
    CHECK(rename(ckdata, data) == 0);
    expect("train --checkpoint-dir = --model", run(TRAIN("--out", out, "--checkpoint-dir", model)), 2,
           "--checkpoint-dir", "--model", NULL);
    expect("train --out = --log-json", run(TRAIN("--out", out, "--log-json", out)), 2, "--out", "--log-json", NULL);
    CHECK(access(out, F_OK) != 0);
    /* merge and logits */
    m = take(model);
    a = take(adapter);
    const char *const g1[] = {"merge", "--model", model, "--adapter", adapter, "--out", model, NULL};
    expect("merge --out = --model", run(g1), 2, "--out", "--model", "same file");
    const char *const g2[] = {"merge", "--model", model, "--adapter", adapter, "--out", adapter, NULL};
    expect("merge --out = --adapter", run(g2), 2, "--out", "--adapter", NULL);
    const char *const g3[] = {"logits",   "--model", model,   "--adapter", adapter,
                              "--tokens", "1 2",     "--out", adapter,     NULL};
    expect("logits --out = --adapter", run(g3), 2, "--out", "--adapter", NULL);
    const char *const g4[] = {"logits", "--model", model, "--tokens", "1 2", "--out", model, NULL};
    expect("logits --out = --model", run(g4), 2, "--out", "--model", NULL);
    CHECK(unchanged(model, &m));
    CHECK(unchanged(adapter, &a));
    /* distinct paths still run */
    const char *const g5[] = {"merge", "--model", model, "--adapter", adapter, "--out", out, NULL};
    expect("merge to another file", run(g5), 0, "merged", NULL, NULL);
    unlink(out);
    unlink(slink);
    unlink(hard);
}

static void test_numbers(void) {
    char out[512];
    path_of(out, sizeof out, "out.gguf");
    expect("--rank 1.9", run(TRAIN("--out", out, "--rank", "1.9")), 2, "--rank 1.9: expected an integer in [1, 4096]",
           NULL, NULL);
    expect("--seed 1e3", run(TRAIN("--out", out, "--seed", "1e3")), 2,
           "--seed 1e3: expected an integer in [0, 18446744073709551615]", NULL, NULL);
    expect("--threads 1e9", run(TRAIN("--out", out, "--threads", "1e9")), 2,
           "--threads 1e9: expected an integer in [1, 256]", NULL, NULL);
    /* a whole number in range written otherwise: said how to write it (the range holds it) */
    expect("--batch-tokens 1e9", run(TRAIN("--out", out, "--batch-tokens", "1e9")), 2,
           "--batch-tokens 1e9: expected an integer in [1, 1000000000] written in digits (1e9: give 1000000000)", NULL,
           NULL);
    expect("--seed 1e3 (hint)", run(TRAIN("--out", out, "--seed", "1e3")), 2, "written in digits (1e3: give 1000)",
           NULL, NULL);
    expect("--rank 1.9 (no hint)", run(TRAIN("--out", out, "--rank", "1.9")), 2,
           "--rank 1.9: expected an integer in [1, 4096]\n", NULL, NULL);
    expect("--threads 100000000000", run(TRAIN("--out", out, "--threads", "100000000000")), 2,
           "expected an integer in [1, 256]", NULL, NULL);
    expect("--steps 1e30", run(TRAIN("--out", out, "--steps", "99999999999999999999")), 2,
           "--steps 99999999999999999999: expected an integer", NULL, NULL);
    expect("--lr nan", run(TRAIN("--out", out, "--lr", "nan")), 2, "--lr nan: expected a number in", NULL, NULL);
    const char *const m1[] = {"mkmodel", "--arch", "qwen3", "--preset", "tiny", "--out", out, "--seed", "-1", NULL};
    expect("mkmodel --seed -1", run(m1), 2, "--seed -1: expected an integer", NULL, NULL);
    const char *const g1[] = {"generate", "--model", model, "--prompt", "hi", "--temp", "nan", NULL};
    expect("generate --temp nan", run(g1), 2, "--temp nan: expected a number", NULL, NULL);
    const char *const g2[] = {"generate", "--model", model, "--prompt", "hi", "--n", "3x", NULL};
    expect("generate --n 3x", run(g2), 2, "--n 3x: expected an integer in [1, 1000000]", NULL, NULL);
    const char *const e1[] = {"eval", "--model", model, "--data", data, "--ctx", "1", NULL};
    expect("eval --ctx 1", run(e1), 2, "--ctx 1: expected an integer in [2, ", NULL, NULL);
    const char *const b1[] = {"bench", "step", "--model", model, "--tokens", "0", NULL};
    expect("bench step --tokens 0", run(b1), 2, "--tokens 0: expected an integer in [2, ", NULL, NULL);
    char *e = nl_t_slurp(errf, NULL);
    CHECKF(e && !strstr(e, "answer-tokens"), "bench step --tokens 0 talks about --answer-tokens: %s", e ? e : "");
    free(e);
    CHECK(access(out, F_OK) != 0);

    /* 64-bit step counts: 2200 one-sequence batches a epoch x 1e6 epochs = 2.2e9 steps */
    char many[512];
    path_of(many, sizeof many, "many.jsonl");
    FILE *f = fopen(many, "w");
    for (int i = 0; i < 2200; i++) fprintf(f, "{\"tokens\": [%d, %d]}\n", 1 + i % 50, 2 + i % 40);
    fclose(f);
    const char *const s1[] = {"train",
                              "--model",
                              model,
                              "--data",
                              many,
                              "--out",
                              out,
                              "--epochs",
                              "1000000",
                              "--batch-tokens",
                              "1",
                              "--no-shuffle",
                              "--stop-after",
                              "1",
                              "--rank",
                              "2",
                              "--thermal",
                              "off",
                              NULL};
    expect("2200 sequences x 1e6 epochs", run(s1), 0, " 2200000000 steps", "stopped after 1/2200000000 steps", NULL);
    /* no epoch cap: 200000 epochs of one batch are 200000 steps */
    path_of(many, sizeof many, "one.jsonl");
    write_text(many, "{\"tokens\": [5, 6, 7]}\n");
    const char *const s2[] = {"train",  "--model",      model, "--data", many, "--out",     out,   "--epochs",
                              "200000", "--stop-after", "1",   "--rank", "2",  "--thermal", "off", NULL};
    expect("200000 epochs", run(s2), 0, " 200000 steps", "stopped after 1/200000 steps", NULL);
    unlink(out);
}

/* A commit whose step field says 2^32 + 1 (the checksum recomputed, the name to match): a
 * --resume must refuse it, not read it as step 1. */
static void test_forged_step(void) {
    char ck[512], c2[600], forged[600], out[512];
    path_of(ck, sizeof ck, "ck_forged");
    path_of(out, sizeof out, "out.gguf");
    const char *const t1[] = {"train", "--model",   model, "--data",           data, "--out",
                              out,     "--steps",   "2",   "--batch-tokens",   "64", "--rank",
                              "2",     "--thermal", "off", "--checkpoint-dir", ck,   NULL};
    CHECK(run(t1) == 0);
    snprintf(c2, sizeof c2, "%s/commit-2.nlck", ck);
    size_t n;
    char *b = nl_t_slurp(c2, &n);
    CHECK(b && n > 104);
    if (!b || n <= 104) return;
    const uint64_t step = (1ull << 32) + 1;
    for (int i = 0; i < 8; i++) b[32 + i] = (char)(step >> (8 * i));
    uint64_t sum = nl_hash64(b, n - 8, NL_CKPT_HASH_SEED);
    for (int i = 0; i < 8; i++) b[n - 8 + i] = (char)(sum >> (8 * i));
    snprintf(forged, sizeof forged, "%s/commit-%llu.nlck", ck, (unsigned long long)step);
    FILE *f = fopen(forged, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
    unlink(out);
    const char *const t2[] = {"train", "--model",        model, "--data", data, "--out",     out,   "--steps",
                              "2",     "--batch-tokens", "64",  "--rank", "2",  "--thermal", "off", "--checkpoint-dir",
                              ck,      "--resume",       NULL};
    expect("a commit step above INT_MAX", run(t2), 1, "at step 4294967297, beyond this run's 2 steps", NULL, NULL);
    CHECK(access(out, F_OK) != 0);
}

/* A copy of `src` with the u32 key `key` set to `value` (every other KV and tensor as is). */
static int with_u32(const char *src, const char *dst, const char *key, uint32_t value) {
    nl_gguf *g = nl_gguf_open(src);
    if (!g) return -1;
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = nl_gguf_copy_kvs(w, g);
    if (!rc) rc = nl_gguf_set_u32(w, key, value); /* replaces the copied value */
    for (int64_t i = 0; i < g->n_tensors && !rc; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, false);
    }
    if (!rc) rc = nl_gguf_write(w, dst);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    return rc;
}

static void test_messages(void) {
    char out[512], p[512], m1[512];
    path_of(out, sizeof out, "out.gguf");
    /* a token id too large for int64 is an integer outside the vocabulary */
    path_of(p, sizeof p, "bigid.jsonl");
    write_text(p, "{\"tokens\": [1, 99999999999999999999, 3]}\n");
    const char *const t1[] = {"train", "--model", model, "--data",    p,     "--out",
                              out,     "--steps", "1",   "--thermal", "off", NULL};
    expect("a token id above int64", run(t1), 1, "bigid.jsonl:1:", "tokens[1] = 1e+20 is outside the vocabulary", NULL);
    char *e = nl_t_slurp(errf, NULL);
    CHECKF(e && !strstr(e, "fraction"), "%s", e ? e : "");
    free(e);
    /* context length 1 in the GGUF: named with the model file */
    path_of(m1, sizeof m1, "ctx1.gguf");
    CHECK(with_u32(model, m1, "qwen3.context_length", 1) == 0);
    const char *const t2[] = {"train", "--model", m1,  "--data",    data,  "--out",
                              out,     "--steps", "1", "--thermal", "off", NULL};
    expect("model context length 1 (train)", run(t2), 1, "ctx1.gguf: the model's context length is 1", NULL, NULL);
    const char *const t3[] = {"eval", "--model", m1, "--data", data, NULL};
    expect("model context length 1 (eval)", run(t3), 1, "ctx1.gguf: the model's context length is 1", NULL, NULL);
    /* block_count x 9 tensors overflows int: printed in 64 bits */
    CHECK(with_u32(model, m1, "qwen3.block_count", 300000000) == 0);
    const char *const t4[] = {"eval", "--model", m1, "--data", data, NULL};
    expect("block_count 300000000", run(t4), 1, "block_count 300000000 needs at least 2700000000 tensors", NULL, NULL);
    unlink(m1);
}

/* A JSONL line over NL_DATA_MAX_LINE: an error at file:line before it is parsed, the run's
 * peak memory under 3x the line (it took 4.6 GB for a 100 MB line). */
static void test_long_line(void) {
    char p[512], out[512];
    path_of(p, sizeof p, "longline.jsonl");
    path_of(out, sizeof out, "out.gguf");
    const size_t n = (size_t)NL_DATA_MAX_LINE + 4096;
    FILE *f = fopen(p, "w");
    fputs("{\"text\": \"a short first line\"}\n{\"text\": \"", f);
    static const char words[] = "the night shift on the farm buys milk ";
    for (size_t k = 0; k < n; k += sizeof words - 1) fputs(words, f);
    fputs("\"}\n", f);
    fclose(f);
    const char *const t1[] = {"train", "--model", model, "--data",    p,     "--out",
                              out,     "--steps", "1",   "--thermal", "off", NULL};
    expect("a JSONL line over 64 MiB", run(t1), 1, "longline.jsonl:2: the line is ",
           "more than the 64 MiB a line may hold", NULL);
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow and quarantine add to every allocation's RSS */
    CHECKF((double)last_maxrss_kb * 1024 < 3.0 * (double)n, "peak RSS %ld KiB for a %zu-byte line", last_maxrss_kb, n);
#endif
    printf("%-40s peak RSS %.1f MiB (%.2fx the line)\n", "", last_maxrss_kb / 1024.0,
           last_maxrss_kb * 1024.0 / (double)n);
    CHECK(access(out, F_OK) != 0);
    unlink(p);
}

/* Flags as other tools spell them: an unknown flag or --config key names the nearest known
 * one (an alias table, then edit distance); nothing is run. */
static void test_suggestions(void) {
    char out[512], cfg[512];
    path_of(out, sizeof out, "sugg.gguf");
    static const struct {
        const char *flag, *want;
    } cases[] = {
        {"--learning-rate", "unknown option '--learning-rate': did you mean --lr?"},
        {"--num_train_epochs", "unknown option '--num_train_epochs': did you mean --epochs?"},
        {"--lora_r", "unknown option '--lora_r': did you mean --rank?"},
        {"--lora-alpha", "did you mean --alpha?"},
        {"--max_steps", "did you mean --steps?"},
        {"--iters", "did you mean --steps?"},
        {"--batch-size", "did you mean --batch-tokens? a batch is counted in tokens, not examples"},
        {"--output_dir", "did you mean --out?"},
        {"--Batch_Tokens", "did you mean --batch-tokens?"},
        {"--chekpoint-dir", "did you mean --checkpoint-dir?"},
        {"--epoch", "did you mean --epochs?"},
        {"--lerning-rate", "did you mean --lr?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *const a[] = {"train", "--model", model, "--data", data, "--out", out, cases[i].flag, "1", NULL};
        expect(cases[i].flag, run(a), 2, cases[i].want, "(see 'nightlora help train')", NULL);
    }
    const char *const far[] = {"train", "--model", model, "--data", data, "--out", out, "--zzzzqqqq", "1", NULL};
    expect("--zzzzqqqq", run(far), 2, "unknown option '--zzzzqqqq' (see 'nightlora help train')", NULL, NULL);
    const char *const ev[] = {"eval", "--model", model, "--data", data, "--learning-rate", "1", NULL};
    expect("eval --learning-rate", run(ev), 2, "nightlora eval: unknown option '--learning-rate'", NULL, NULL);
    path_of(cfg, sizeof cfg, "hf.json");
    write_text(cfg, "{\"learning_rate\": 1e-4,\n \"num_train_epochs\": 2}\n");
    const char *const c1[] = {"train", "--config", cfg, "--model", model, "--data", data, "--out", out, NULL};
    expect("config learning_rate", run(c1), 2,
           "hf.json:1:2: key \"learning_rate\" is no flag of train: did you mean \"lr\" (--lr)?", NULL, NULL);
    write_text(cfg, "{\"lr\": 1e-4,\n \"lora_r\": 8}\n");
    expect("config lora_r", run(c1), 2,
           "hf.json:2:2: key \"lora_r\" is no flag of train: did you mean \"rank\" (--rank)?", NULL, NULL);
    CHECK(access(out, F_OK) != 0);

    /* a YAML config: the same flags, a list for --targets; errors at FILE:LINE */
    char yml[512];
    path_of(yml, sizeof yml, "run.yaml");
    char text[1500];
    snprintf(text, sizeof text,
             "# a run\nmodel: %s\ndata: '%s'\nlr: 1e-3\nrank: 2\ntargets:\n  - q\n  - v\nbatch_tokens: 64\nthermal: "
             "\"off\"\n",
             model, data);
    write_text(yml, text);
    const char *const y1[] = {"train", "--config", yml, "--out", out, "--steps", "1", NULL};
    expect("YAML config", run(y1), 0, "1 steps, ", "rank 2", NULL);
    CHECK(access(out, F_OK) == 0);
    unlink(out);
    write_text(yml, "rank: 2\nlearning_rate: 1e-4\n");
    const char *const y2[] = {"train", "--config", yml, "--model", model, "--data", data, "--out", out, NULL};
    expect("YAML learning_rate", run(y2), 2,
           "run.yaml:2: key \"learning_rate\" is no flag of train: did you mean \"lr\" (--lr)?", NULL, NULL);
    write_text(yml, "rank: 2\n\tlr: 1\n");
    expect("YAML tab", run(y2), 2, "run.yaml:2:1: a tab in the indentation (YAML indents with spaces)", NULL, NULL);
    write_text(yml, "rank: &r 2\n");
    expect("YAML anchor", run(y2), 2, "run.yaml:1:7: an anchor ('&') is not in the YAML subset nightlora reads", NULL,
           NULL);
    write_text(yml, "rank: 2\nrank: 3\n");
    expect("YAML duplicate key", run(y2), 2, "run.yaml:2", "duplicate key \"rank\"", NULL);
    CHECK(access(out, F_OK) != 0);
}

int main(void) {
    if (nl_t_tmpdir(tmp, sizeof tmp, "test_cli_args")) return 1;
    path_of(model, sizeof model, "q3.gguf");
    path_of(data, sizeof data, "notes.jsonl");
    path_of(errf, sizeof errf, "stderr.txt");
    path_of(outf, sizeof outf, "stdout.txt");
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q8_0, 5, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"Note: buy milk %d\\nTag:\", \"completion\": \" shopping\"}\n", i);
    fclose(f);
    double t0 = nl_now();
    test_no_overwrite();
    test_numbers();
    test_forged_step();
    test_messages();
    test_long_line();
    test_suggestions();
    printf("%.1f s\n", nl_now() - t0);
    nl_t_tmpdir_done(tmp);
    return nl_t_done();
}

/* train/plan: the steps of a run (an epoch's batches, whole and fractional epochs, --steps),
 * the short-run warning and the settings it computes (a smaller --batch-tokens; more --epochs
 * where one sequence a step is still too few; --epochs 1 for a run shorter than an epoch),
 * target runs marked in a rendered sequence, and `train --dry-run` through the CLI: the
 * examples as rendered, the plan and the warning printed, exit 0, nothing written; the
 * warning in a real run's start-up lines. */
#include <sys/stat.h>

#include "test.h"
#include "data/dataset.h"
#include "model/model.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "util/util.h"

/* n tokens lines of len tokens each, packed as a run packs them. */
static void make_packing(int n, int len, nl_dataset *ds, nl_packing *pk) {
    size_t cap = (size_t)n * (size_t)len * 8 + 64, k = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "{\"tokens\": [");
        for (int j = 0; j < len; j++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", j ? ", " : "", (i + j) % 50);
        k += (size_t)snprintf(buf + k, cap - k, "]}\n");
    }
    CHECK(nl_dataset_load_buffer(buf, k, "p.jsonl", NULL, NULL, ds) == 0);
    free(buf);
    static const int buckets[] = {16, 64, 256, 1024, 4096};
    CHECK(nl_pack(ds, buckets, 5, 4096, NL_OVERLONG_TRUNCATE, pk) == 0);
}

static void expect_warning(const nl_train_opts *o, const nl_packing *pk, const char *want, int line) {
    int64_t per_epoch = 0, total = nl_train_count_steps(o, pk, &per_epoch);
    char buf[512];
    CHECK(nl_train_short_run(o, pk, total, per_epoch, buf, sizeof buf) == 0);
    CHECKF(!strcmp(buf, want), "line %d:\n  got:  %s\n  want: %s", line, buf, want);
}
#define EXPECT_WARNING(o, pk, want) expect_warning(o, pk, want, __LINE__)

static void test_steps_and_warning(void) {
    nl_dataset ds;
    nl_packing pk;
    make_packing(120, 12, &ds, &pk); /* 1440 tokens */
    nl_train_opts o;
    nl_train_defaults(&o);
    o.batch_tokens = 4096;
    o.epochs = 2;
    int64_t pe = -1;
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 2 && pe == 1);
    /* the README's old example: 2 steps; halving the batch, 128 tokens (10 sequences) is the
     * largest that gives 20 or more */
    EXPECT_WARNING(
        &o, &pk,
        "only 2 optimizer steps (1 an epoch of 120 sequences, 1440 tokens, at --batch-tokens 4096): too few to"
        " learn much; --batch-tokens 128 gives 24 steps");
    o.batch_tokens = 128;
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 24 && pe == 12);
    EXPECT_WARNING(&o, &pk, "");
    /* a fractional epoch: that share of the batches, rounded up, and less than one epoch */
    o.epochs = 0.5;
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 6 && pe == 12);
    o.batch_tokens = 36; /* 3 sequences a step: 40 an epoch */
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 20 && pe == 40);
    EXPECT_WARNING(
        &o, &pk,
        "20 optimizer steps cover 50% of one epoch (40 steps at --batch-tokens 36): part of the data is never"
        " trained on; --epochs 1 gives 40 steps");
    /* --steps: what it says, and an epoch's batches beside it */
    o.epochs = 1;
    o.steps = 5;
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 5 && pe == 40);
    CHECK(nl_train_count_steps(&o, &pk, NULL) == 5);
    EXPECT_WARNING(&o, &pk,
                   "only 5 optimizer steps (40 an epoch of 120 sequences, 1440 tokens, at --batch-tokens 36), less than"
                   " one epoch: too few to learn much; --epochs 1 (instead of --steps) gives 40 steps");
    o.steps = 40;
    EXPECT_WARNING(&o, &pk, "");
    /* shuffled epochs: each epoch's batches counted in its own order */
    o.steps = 0;
    o.epochs = 3;
    o.batch_tokens = 30; /* 2 sequences a step, whatever the order */
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 180 && pe == 60);
    nl_packing_free(&pk);
    nl_dataset_free(&ds);

    /* 5 sequences: even one a step is too few, so the epochs make up the rest */
    make_packing(5, 12, &ds, &pk);
    o.epochs = 1;
    o.batch_tokens = 4096;
    EXPECT_WARNING(
        &o, &pk,
        "only 1 optimizer step (1 an epoch of 5 sequences, 60 tokens, at --batch-tokens 4096): too few to learn"
        " much; --batch-tokens 16 --epochs 4 gives 20 steps");
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
}

/* The batch of a run that gives none: sized to the data for NL_TRAIN_FEW_STEPS steps an epoch
 * (the largest of 4096, 2048, ...), 4096 with --steps, a sequence a step where nothing gives
 * enough; a resume takes its run.json's (a value that is no batch is not taken); a batch given
 * is kept. */
static void test_batch_sizing(const char *dir) {
    nl_dataset ds;
    nl_packing pk;
    make_packing(120, 12, &ds, &pk); /* 1440 tokens: 4096..128 give at most 12 steps, 64 gives 24 */
    nl_train_opts o;
    nl_train_defaults(&o);
    CHECK(o.batch_tokens == 0 && o.epochs == 3 && o.steps == 0);
    int64_t pe = -1;
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 64 && pe == 24);
    o.epochs = 0.5; /* the epochs asked for do not change the batch: an epoch's steps do */
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 64 && pe == 24);
    o.epochs = 3;
    CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_SIZED && o.batch_tokens == 64);
    CHECK(nl_train_count_steps(&o, &pk, &pe) == 72 && pe == 24);
    char note[200];
    CHECKF(!strcmp(nl_train_batch_note(NL_BATCH_SIZED, note, sizeof note),
                   "sized to the data: the largest of 4096, 2048, ... with at least 20 steps an epoch; --batch-tokens "
                   "N sets one"),
           "%s", note);
    /* a batch given is kept, however few steps it gives */
    o.batch_tokens = 4096;
    CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_GIVEN && o.batch_tokens == 4096);
    /* --steps: the 4096-token batch */
    o.batch_tokens = 0;
    o.steps = 7;
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 4096 && pe == 1);
    CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_SIZED && o.batch_tokens == 4096);
    o.steps = 0;
    o.batch_tokens = 0;
    /* unshuffled data sizes the same */
    o.shuffle = 0;
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 64 && pe == 24);
    o.shuffle = 1;
    /* a resume takes the batch its run.json records, sized or given */
    char ck[300], path[320];
    snprintf(ck, sizeof ck, "%s/sizing-ck", dir);
    mkdir(ck, 0700);
    snprintf(path, sizeof path, "%s/run.json", ck);
    static const struct {
        const char *json;
        int how, bt;
    } rj[] = {
        {"{\"batch_tokens\": \"512\", \"batch_sizing\": \"data\"}", NL_BATCH_RESUMED_SIZED, 512},
        {"{\"batch_tokens\": \"4096\"}", NL_BATCH_RESUMED_GIVEN, 4096},
        /* not a batch: sized anew (the resume then refuses a batch that differs, naming it) */
        {"{\"batch_tokens\": \"0\", \"batch_sizing\": \"data\"}", NL_BATCH_SIZED, 64},
        {"{\"batch_tokens\": \"12x\"}", NL_BATCH_SIZED, 64},
        {"{\"batch_tokens\": \"-5\"}", NL_BATCH_SIZED, 64},
        {"{\"batch_tokens\": \"99999999999999999999\"}", NL_BATCH_SIZED, 64},
        {"{\"batch_tokens\": 512}", NL_BATCH_SIZED, 64},
        {"[\"batch_tokens\", \"512\"]", NL_BATCH_SIZED, 64},
        {"{\"batch_tokens\": \"51", NL_BATCH_SIZED, 64},
    };
    o.checkpoint_dir = ck;
    for (size_t i = 0; i < sizeof rj / sizeof *rj; i++) {
        FILE *f = fopen(path, "w");
        fputs(rj[i].json, f);
        fclose(f);
        o.batch_tokens = 0;
        o.resume = 1;
        int how = nl_train_resolve_batch(&o, &pk);
        CHECKF(how == rj[i].how && o.batch_tokens == rj[i].bt, "%s: way %d, batch %d", rj[i].json, how, o.batch_tokens);
        /* not a resume: run.json is not read */
        o.batch_tokens = 0;
        o.resume = 0;
        CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_SIZED && o.batch_tokens == 64);
        /* a batch given wins over run.json */
        o.batch_tokens = 100;
        o.resume = 1;
        CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_GIVEN && o.batch_tokens == 100);
    }
    unlink(path);
    o.batch_tokens = 0;
    CHECK(nl_train_resolve_batch(&o, &pk) == NL_BATCH_SIZED && o.batch_tokens == 64); /* no run.json */
    o.checkpoint_dir = NULL;
    o.resume = 0;
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
    /* 5 sequences: no batch gives 20 steps; 16 tokens is the largest with a sequence a step */
    make_packing(5, 12, &ds, &pk);
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 16 && pe == 5);
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
    /* longer sequences: halving reaches a sequence a step (256) with 30 steps */
    make_packing(30, 200, &ds, &pk); /* 6000 tokens: 4096 gives 2 steps, 512 gives 15, 256 gives 30 */
    CHECK(nl_train_batch_for(&o, &pk, &pe) == 256 && pe == 30);
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
}

static void test_render(const nl_tokenizer *tok) {
    const char *a = "Tag:", *b = " travel";
    int32_t *ia, *ib;
    int na, nb;
    CHECK(nl_tokenize(tok, a, strlen(a), false, false, &ia, &na) == 0);
    CHECK(nl_tokenize(tok, b, strlen(b), false, false, &ib, &nb) == 0);
    int32_t ids[64];
    uint8_t tg[64] = {0};
    int n = 0;
    for (int i = 0; i < na; i++) ids[n++] = ia[i];
    for (int i = 0; i < nb; i++) tg[n] = 1, ids[n++] = ib[i];
    ids[n] = nl_token_eos(tok);
    tg[n++] = 1;
    for (int i = 0; i < na; i++) ids[n++] = ia[i];
    char *text;
    CHECK(nl_train_render_seq(tok, ids, tg, n, 0, &text) == 0);
    CHECKF(!strcmp(text, "Tag:[[ travel<|endoftext|>]]Tag:"), "%s", text);
    free(text);
    /* a sequence ending in a target closes its mark; a cut names what is left out */
    CHECK(nl_train_render_seq(tok, ids, tg, na + nb + 1, 0, &text) == 0);
    CHECKF(!strcmp(text, "Tag:[[ travel<|endoftext|>]]"), "%s", text);
    free(text);
    CHECK(nl_train_render_seq(tok, ids, tg, n, 2, &text) == 0);
    char want[64];
    snprintf(want, sizeof want, " ... (%d more tokens)", n - 2);
    CHECKF(strstr(text, want) != NULL && strncmp(text, "Tag:", 2) == 0, "%s", text);
    free(text);
    free(ia);
    free(ib);
}

static void test_dry_run_cli(const char *dir, const char *model) {
    char data[512], out[512], ck[512], log[512], errf[512], outf[512];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    snprintf(out, sizeof out, "%s/adapter.gguf", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    snprintf(errf, sizeof errf, "%s/stderr.txt", dir);
    snprintf(outf, sizeof outf, "%s/stdout.txt", dir);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f,
                "{\"prompt\": \"Note: buy milk %d\\nTag:\", \"completion\": \" shopping\"}\n"
                "{\"messages\": [{\"role\": \"user\", \"content\": \"Note: fly %d\"}, {\"role\": \"assistant\", "
                "\"content\": \"travel\"}]}\n",
                i, i);
    fclose(f);
    const char *v[] = {NL_CLI,     "train", "--model",          model,  "--data",     dir,
                       "--out",    out,     "--checkpoint-dir", ck,     "--log-json", log,
                       "--epochs", "2",     "--batch-tokens",   "4096", "--dry-run",  NULL};
    int rc = nl_t_run(v, errf, outf);
    char *o = nl_t_slurp(outf, NULL), *e = nl_t_slurp(errf, NULL);
    char want[1600];
    snprintf(want, sizeof want,
             "dry run: %s on %s; nothing is trained or written\nchat template: the model's own "
             "(tokenizer.chat_template)\n\nsequence 1 of 80: line 1 (prompt/completion), ",
             model, data);
    CHECKF(rc == 0 && o && strncmp(o, want, strlen(want)) == 0, "exit %d: %s%s", rc, o ? o : "", e ? e : "");
    CHECKF(o && strstr(o, "Note: buy milk 0\nTag:[[ shopping<|endoftext|>]]\n"), "%s", o ? o : "");
    CHECKF(o && strstr(o, "sequence 2 of 80: line 2 (chat), ") &&
               strstr(o, "<|im_start|>user\nNote: fly 0<|im_end|>\n<|im_start|>assistant\n[[travel<|im_end|>]]\n"),
           "%s", o ? o : "");
    CHECK(o && strstr(o, "sequence 3 of 80") && !strstr(o, "sequence 4 of 80"));
    CHECKF(o && strstr(o, "\nplan: 80 examples, 80 sequences (0 truncated to ") &&
               strstr(o, "; --batch-tokens 4096: 1 steps an epoch; --epochs 2: 2 optimizer steps\n") &&
               strstr(o, "\nwarning: only 2 optimizer steps (1 an epoch of 80 sequences, "),
           "%s", o ? o : "");
    struct stat st;
    CHECK(stat(out, &st) != 0 && stat(ck, &st) != 0 && stat(log, &st) != 0);
    free(o);
    free(e);
    /* training prints the same warning after its start-up line (and none for a run of a
     * sequence a step over an epoch: 80 steps); --stop-after 1 keeps the runs short */
    const char *v1[] = {
        NL_CLI,           "train", "--model",   model, "--data",    dir,   "--out",        out, "--epochs", "2",
        "--batch-tokens", "4096",  "--threads", "1",   "--thermal", "off", "--stop-after", "1", NULL};
    rc = nl_t_run(v1, errf, NULL);
    e = nl_t_slurp(errf, NULL);
    CHECKF(rc == 0 && e && strstr(e, " 2 steps, ") &&
               strstr(e, "\nwarning: only 2 optimizer steps (1 an epoch of 80 sequences, ") && strstr(e, " gives "),
           "exit %d: %s", rc, e ? e : "");
    free(e);
    const char *v3[] = {NL_CLI,      "train", "--model",        model, "--data",    dir,
                        "--out",     out,     "--batch-tokens", "1",   "--threads", "1",
                        "--thermal", "off",   "--stop-after",   "1",   NULL};
    rc = nl_t_run(v3, errf, NULL);
    e = nl_t_slurp(errf, NULL);
    CHECKF(rc == 0 && e && strstr(e, " 240 steps, ") && !strstr(e, "warning: "), "exit %d: %s", rc,
           e ? e : ""); /* 3 epochs */
    free(e);
    unlink(out);
    /* no --batch-tokens, --steps or --epochs: the batch sized to the data, said on the plan line and
     * at the start; run.json records it and a resume keeps it (with --steps too, which alone
     * would take 4096), a --config run.json replays it; a batch given overrides it */
    const char *vd[] = {NL_CLI, "train", "--model", model, "--data", dir, "--out", out, "--dry-run", NULL};
    rc = nl_t_run(vd, errf, outf);
    o = nl_t_slurp(outf, NULL);
    const char *pl = o ? strstr(o, "\nplan: ") : NULL, *bp = pl ? strstr(pl, "; --batch-tokens ") : NULL;
    int bt = bp ? atoi(bp + 17) : 0;
    long per = 0;
    const char *pp =
        bp ? strstr(bp, " (sized to the data: the largest of 4096, 2048, ... with at least 20 steps an epoch;"
                        " --batch-tokens N sets one): ")
           : NULL;
    if (pp) per = atol(strchr(pp, ')') + 3);
    char wantp[256];
    snprintf(wantp, sizeof wantp, " steps an epoch; --epochs 3: %ld optimizer steps\n", 3 * per);
    CHECKF(rc == 0 && pp && bt >= 1 && bt < 4096 && per >= 20 && strstr(pp, wantp) && !strstr(o, "warning: only"),
           "exit %d: %s", rc, o ? o : "");
    free(o);
    char ck2[600], rj[640], again[600];
    snprintf(ck2, sizeof ck2, "%s/ck-sized", dir);
    snprintf(rj, sizeof rj, "%s/run.json", ck2);
    snprintf(again, sizeof again, "%s/again.gguf", dir);
    const char *vs[] = {NL_CLI,      "train", "--model",          model, "--data",    dir,
                        "--out",     out,     "--checkpoint-dir", ck2,   "--threads", "1",
                        "--thermal", "off",   "--stop-after",     "1",   NULL};
    rc = nl_t_run(vs, errf, NULL);
    char wantb[256], wantj[128];
    snprintf(wantb, sizeof wantb,
             "\nbatch: --batch-tokens %d (%ld steps an epoch), sized to the data: the largest of 4096, 2048, ...", bt,
             per);
    snprintf(wantj, sizeof wantj, "\"batch_tokens\": \"%d\",\n  \"batch_sizing\": \"data\",", bt);
    e = nl_t_slurp(errf, NULL);
    char *j = nl_t_slurp(rj, NULL);
    CHECKF(rc == 0 && e && strstr(e, wantb) && j && strstr(j, wantj), "exit %d: %s\n%s", rc, e ? e : "", j ? j : "");
    free(e);
    free(j);
    /* resumed with more --steps: the run's batch, not --steps' 4096 */
    const char *vr[] = {NL_CLI, "train",    "--model", model, "--data",    dir, "--out",     out,   "--checkpoint-dir",
                        ck2,    "--resume", "--steps", "300", "--threads", "1", "--thermal", "off", "--stop-after",
                        "1",    NULL};
    rc = nl_t_run(vr, errf, NULL);
    snprintf(wantb, sizeof wantb,
             "\nbatch: --batch-tokens %d (%ld steps an epoch), the resumed run's, sized to its data (run.json)\n", bt,
             per);
    e = nl_t_slurp(errf, NULL);
    j = nl_t_slurp(rj, NULL);
    CHECKF(rc == 0 && e && strstr(e, "resumed from ") && strstr(e, "/300") && strstr(e, wantb) && j &&
               strstr(j, wantj) && strstr(j, "\"steps\": \"300\""),
           "exit %d: %s\n%s", rc, e ? e : "", j ? j : "");
    free(e);
    free(j);
    /* a batch given on the resume overrides run.json's: here another batch than the commits' */
    const char *vx[] = {
        NL_CLI, "train",    "--model",        model,  "--data",    dir, "--out",     out,   "--checkpoint-dir",
        ck2,    "--resume", "--batch-tokens", "4096", "--threads", "1", "--thermal", "off", "--stop-after",
        "1",    NULL};
    rc = nl_t_run(vx, errf, NULL);
    snprintf(wantb, sizeof wantb,
             "cannot resume: this run's settings differ from those the commits were made with: batch_tokens %d there,"
             " 4096 now",
             bt);
    CHECKF(rc == 1 && nl_t_file_has(errf, wantb) && !nl_t_file_has(errf, "\nbatch: "), "exit %d", rc);
    /* --config run.json: batch_sizing is a record, batch_tokens its flag (the plan says the batch given) */
    const char *vc[] = {NL_CLI, "train", "--config", rj, "--out", again, "--dry-run", NULL};
    rc = nl_t_run(vc, errf, outf);
    snprintf(wantb, sizeof wantb, "; --batch-tokens %d: %ld steps an epoch; --steps 300: 300 optimizer steps\n", bt,
             per);
    CHECKF(rc == 0 && nl_t_file_has(outf, wantb), "exit %d", rc);
    /* a fresh run given its batch: no batch line, no batch_sizing */
    snprintf(ck2, sizeof ck2, "%s/ck-given", dir);
    snprintf(rj, sizeof rj, "%s/run.json", ck2);
    const char *vg[] = {NL_CLI,      "train", "--model",          model, "--data",         dir,
                        "--out",     out,     "--checkpoint-dir", ck2,   "--batch-tokens", "128",
                        "--threads", "1",     "--thermal",        "off", "--stop-after",   "1",
                        NULL};
    rc = nl_t_run(vg, errf, NULL);
    j = nl_t_slurp(rj, NULL);
    CHECKF(rc == 0 && !nl_t_file_has(errf, "\nbatch: ") && j && strstr(j, "\"batch_tokens\": \"128\",") &&
               !strstr(j, "batch_sizing"),
           "exit %d: %s", rc, j ? j : "");
    free(j);
    unlink(out);
    /* no --out needed; a data error is the run's own, at file:line */
    f = fopen(data, "w");
    fprintf(f, "{\"prompt\": \"a\", \"completion\": \" b\"}\n{\"conversations\": []}\n");
    fclose(f);
    const char *v2[] = {NL_CLI, "train", "--model", model, "--data", data, "--dry-run", NULL};
    rc = nl_t_run(v2, errf, outf);
    e = nl_t_slurp(errf, NULL);
    snprintf(want, sizeof want, "nightlora train: %s:2:19: \"conversations\" is empty", data);
    CHECKF(rc == 1 && e && strstr(e, want), "exit %d: %s", rc, e ? e : "");
    free(e);
}

int main(void) {
    test_steps_and_warning();
    char dir[256], model[300];
    if (nl_t_tmpdir(dir, sizeof dir, "test_plan")) return 1;
    test_batch_sizing(dir);
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    if (nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_F32, 3, model)) {
        fprintf(stderr, "%s\n", nl_last_error());
        return 1;
    }
    nl_model *m = nl_model_load(model);
    nl_tokenizer *tok = NULL;
    CHECK(m && nl_tokenizer_for_model(m, &tok) == 0 && tok);
    if (tok) test_render(tok);
    nl_tokenizer_free(tok);
    nl_model_free(m);
    test_dry_run_cli(dir, model);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (!nl_t_fail && system(cmd)) return 1;
    return nl_t_done();
}

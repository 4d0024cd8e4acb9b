/* fuzz_dataset: the JSONL dataset reader (nl_dataset_load_buffer), then packing and batching.
 *
 * Input: byte 0 picks the setting, the rest is the JSONL file.
 *   bits 0-1  tokenizer: 0 none (tokens lines only), 1 small gpt2 vocab with a ChatML
 *             template, 2 small gpt2 vocab with a Llama-3 template and BOS, 3 small
 *             SentencePiece vocab with a ChatML template
 *   bits 2-3  chat template argument: NULL, "auto", "chatml", "llama3"
 *             (with no tokenizer: opts.n_vocab = 0, 50, 300 or 1000)
 *   bit 4     shuffle the batch order
 *   bit 5     strict_keys
 * Oracles on an accepted file (dataset.h's contract): every example has ids in the vocabulary,
 * target[0] == 0, targets in {0,1} with n_targets their count and >= 1, a line number inside
 * the file, and the totals add up; a multiple-choice example has >= 2 non-empty choices, an
 * answer in range, and its sequence is the context followed by the correct choice. A refused
 * file gets an error naming the label. Packing keeps n_tokens <= max_ctx and puts each
 * sequence in the smallest bucket that holds it; two epochs of batches visit every sequence
 * exactly once each. */
#include "common.h"
#include "data/dataset.h"

static fuzz_vocab V[3];
static nl_tokenizer *TOK[3];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    TOK[0] = nl_tokenizer_from_spec(fuzz_vocab_build(&V[0], "gpt2", "gpt-2", false));
    TOK[1] = nl_tokenizer_from_spec(fuzz_vocab_build(&V[1], "gpt2", "llama3", true));
    TOK[2] = nl_tokenizer_from_spec(fuzz_vocab_build(&V[2], "llama", NULL, false));
    for (int i = 0; i < 3; i++)
        if (!TOK[i]) {
            fprintf(stderr, "fuzz_dataset: vocab %d: %s\n", i, nl_last_error());
            abort();
        }
    return 0;
}

static void check_packing(const nl_dataset *ds, bool shuffle) {
    static const int buckets[] = {4, 16, 100};
    const int max_ctx = 32;
    nl_packing p;
    memset(&p, 0, sizeof p);
    if (nl_pack(ds, buckets, 3, max_ctx, NL_OVERLONG_TRUNCATE, &p) != 0) {
        /* only when every example lost all its targets */
        FUZZ_CHECK(ds->n > 0, "pack failed on a non-empty dataset: %s", nl_last_error());
        return;
    }
    FUZZ_CHECK(p.n + p.n_dropped == ds->n, "packing: %d kept + %d dropped != %d examples", p.n, p.n_dropped, ds->n);
    for (int i = 0; i < p.n; i++) {
        const nl_seq *s = &p.seq[i];
        FUZZ_CHECK(s->example >= 0 && s->example < ds->n, "seq example %d", s->example);
        FUZZ_CHECK(s->n_tokens >= 1 && s->n_tokens <= max_ctx, "seq of %d tokens", s->n_tokens);
        FUZZ_CHECK(s->n_targets >= 1, "seq without target kept");
        int want = s->n_tokens <= 4 ? 4 : s->n_tokens <= 16 ? 16 : max_ctx;
        FUZZ_CHECK(s->bucket == want, "seq of %d tokens in bucket %d, expected %d", s->n_tokens, s->bucket, want);
        const nl_example *e = &ds->ex[s->example];
        FUZZ_CHECK(s->ids == e->ids && s->target == e->target, "seq does not borrow its example");
    }
    nl_batcher *b = nl_batcher_new(&p, 42, shuffle, 40);
    FUZZ_CHECK(b != NULL, "batcher: %s", nl_last_error());
    int *seen = calloc((size_t)p.n + 1, sizeof *seen);
    FUZZ_CHECK(seen != NULL, "oom");
    for (int guard = 0; guard < 4 * p.n + 8; guard++) {
        nl_data_cursor c = nl_batcher_cursor(b);
        if (c.epoch >= 2) break;
        const int *idx;
        int n;
        FUZZ_CHECK(nl_batcher_next(b, &idx, &n) == 0, "batcher_next: %s", nl_last_error());
        FUZZ_CHECK(n >= 1, "empty batch");
        int tokens = 0;
        for (int k = 0; k < n; k++) {
            FUZZ_CHECK(idx[k] >= 0 && idx[k] < p.n, "batch index %d", idx[k]);
            seen[idx[k]]++;
            tokens += p.seq[idx[k]].n_tokens;
        }
        FUZZ_CHECK(n == 1 || tokens <= 40, "batch of %d sequences, %d tokens > 40", n, tokens);
    }
    FUZZ_CHECK(nl_batcher_cursor(b).epoch == 2, "two epochs not done");
    for (int i = 0; i < p.n; i++) FUZZ_CHECK(seen[i] == 2, "sequence %d seen %d times in 2 epochs", i, seen[i]);
    free(seen);
    nl_batcher_free(b);
    nl_packing_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int which = sel & 3;
    const nl_tokenizer *tok = which ? TOK[which - 1] : NULL;
    static const char *const tmpl[] = {NULL, "auto", "chatml", "llama3"};
    static const int n_vocab_opt[] = {0, 50, 300, 1000};
    nl_data_opts opts = {0};
    opts.chat_template = tmpl[(sel >> 2) & 3];
    if (!tok) opts.n_vocab = n_vocab_opt[(sel >> 2) & 3];
    opts.strict_keys = (sel >> 5) & 1;
    int n_vocab = tok ? nl_tokenizer_n_vocab(tok) : opts.n_vocab;

    nl_dataset ds;
    memset(&ds, 0xA5, sizeof ds); /* the loader must fill it in every case */
    if (nl_dataset_load_buffer(text, len, "fuzz.jsonl", tok, &opts, &ds) != 0) {
        const char *e = nl_last_error();
        FUZZ_NOTE("refused: %s", e);
        FUZZ_CHECK(e && !strncmp(e, "fuzz.jsonl", 10), "error does not name the file: %s", e);
        FUZZ_CHECK(ds.n == 0 && ds.ex == NULL, "failed load left examples behind");
        nl_dataset_free(&ds);
        return 0;
    }
    int lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    FUZZ_CHECK(ds.n >= 1, "accepted a file without examples");
    int64_t tot_tokens = 0, tot_targets = 0;
    for (int k = 0; k < ds.n; k++) {
        const nl_example *e = &ds.ex[k];
        FUZZ_CHECK(e->n_tokens >= 1, "example %d has %d tokens", k, e->n_tokens);
        FUZZ_CHECK(e->line >= 1 && e->line <= lines, "example %d on line %d of %d", k, e->line, lines);
        FUZZ_CHECK(k == 0 || e->line > ds.ex[k - 1].line, "examples out of line order");
        FUZZ_CHECK(e->target[0] == 0, "example %d (line %d): target[0] = %d", k, e->line, e->target[0]);
        int nt = 0;
        for (int i = 0; i < e->n_tokens; i++) {
            FUZZ_CHECK(e->target[i] <= 1, "target value %d", e->target[i]);
            nt += e->target[i];
            if (n_vocab > 0)
                FUZZ_CHECK(e->ids[i] >= 0 && e->ids[i] < n_vocab, "line %d: id %d outside vocab %d", e->line, e->ids[i],
                           n_vocab);
        }
        FUZZ_CHECK(nt == e->n_targets, "line %d: n_targets %d, counted %d", e->line, e->n_targets, nt);
        FUZZ_CHECK(nt >= 1, "line %d: example without a target accepted", e->line);
        tot_tokens += e->n_tokens;
        tot_targets += nt;
        if (e->n_choices == 0) {
            FUZZ_CHECK(e->answer == -1, "answer %d without choices", e->answer);
            continue;
        }
        FUZZ_CHECK(e->n_choices >= 2, "line %d: %d choices", e->line, e->n_choices);
        FUZZ_CHECK(e->answer >= 0 && e->answer < e->n_choices, "line %d: answer %d of %d", e->line, e->answer,
                   e->n_choices);
        for (int c = 0; c < e->n_choices; c++) {
            FUZZ_CHECK(e->choice_len[c] >= 1, "line %d: empty choice %d", e->line, c);
            for (int i = 0; i < e->choice_len[c]; i++)
                if (n_vocab > 0) FUZZ_CHECK(e->choice_ids[c][i] >= 0 && e->choice_ids[c][i] < n_vocab, "choice id");
        }
        int cl = e->choice_len[e->answer];
        FUZZ_CHECK(e->n_prompt >= 0 && e->n_prompt + cl == e->n_tokens, "line %d: context %d + choice %d != %d tokens",
                   e->line, e->n_prompt, cl, e->n_tokens);
        FUZZ_CHECK(!memcmp(e->ids + e->n_prompt, e->choice_ids[e->answer], (size_t)cl * sizeof(int32_t)),
                   "line %d: sequence does not end with the correct choice", e->line);
        for (int i = 0; i < e->n_tokens; i++)
            FUZZ_CHECK(e->target[i] == (i >= e->n_prompt && i > 0), "line %d: choice example target[%d] = %d", e->line,
                       i, e->target[i]);
    }
    FUZZ_CHECK(tot_tokens == ds.n_tokens && tot_targets == ds.n_targets, "totals");
    FUZZ_NOTE("accepted: %d examples", ds.n);
    check_packing(&ds, (sel >> 4) & 1);
    nl_dataset_free(&ds);
    return 0;
}

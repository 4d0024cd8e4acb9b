/* data/dataset: the four line formats and their exact target masks, every error with
 * file:line:column, choices, ChatML / Llama-3 token sequences, packing, batch order. */
#include <stdint.h>
#include <unistd.h>

#include "data/dataset.h"
#include "util/json.h"
#include "data/tokenizer.h"
#include "model/gguf.h"
#include "test.h"
#include "util/util.h"

static int strict_keys = 1;          /* nl_data_opts.strict_keys of load() and EXPECT_ERR */
static const char *columns, *alpaca; /* its columns and alpaca */

static int load(const char *text, const nl_tokenizer *tok, const char *tmpl, nl_dataset *ds) {
    nl_data_opts o = {
        .chat_template = tmpl, .n_vocab = 100, .strict_keys = strict_keys, .columns = columns, .alpaca = alpaca};
    return nl_dataset_load_buffer(text, strlen(text), "t.jsonl", tok, &o, ds);
}

/* Loading must fail with exactly this message. */
static void expect_err(const char *text, const nl_tokenizer *tok, const char *tmpl, const char *want, int src_line) {
    nl_dataset ds;
    int rc = load(text, tok, tmpl, &ds);
    if (rc == 0) {
        nl_t_fail++;
        fprintf(stderr, "%s:%d: accepted: %s\n", __FILE__, src_line, text);
        nl_dataset_free(&ds);
        return;
    }
    if (strcmp(nl_last_error(), want) == 0) {
        nl_t_pass++;
    } else {
        nl_t_fail++;
        fprintf(stderr, "%s:%d: error\n  got:  %s\n  want: %s\n", __FILE__, src_line, nl_last_error(), want);
    }
    CHECK(ds.n == 0 && ds.ex == NULL);
}
#define EXPECT_ERR(text, tok, tmpl, want) expect_err(text, tok, tmpl, want, __LINE__)

static int seq_is(const nl_example *e, const int32_t *ids, const uint8_t *tg, int n) {
    if (e->n_tokens != n) {
        fprintf(stderr, "  n_tokens %d, want %d\n", e->n_tokens, n);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (e->ids[i] != ids[i] || e->target[i] != tg[i]) {
            fprintf(stderr, "  token %d: (%d,%d), want (%d,%d)\n", i, e->ids[i], e->target[i], ids[i], tg[i]);
            return 0;
        }
    int nt = 0;
    for (int i = 0; i < n; i++) nt += tg[i];
    return e->n_targets == nt;
}

/* ---------------- tokens lines: no tokenizer needed ---------------- */

static void test_tokens_lines(void) {
    nl_dataset ds;
    const char *text = "{\"tokens\": [1, 2, 3]}\n"
                       "\n"
                       "  \t\r\n"
                       "{\"tokens\": [5, 6, 7, 8], \"loss_mask\": [1, 0, 1, 1]}\r\n"
                       "{\"loss_mask\": [0, 0, 1], \"tokens\": [9, 10, 11]}\n"
                       "{\"tokens\": [4, 2], \"choices\": [[3], [4, 5]], \"answer\": 1}";
    CHECK(load(text, NULL, NULL, &ds) == 0);
    CHECK(ds.n == 4);
    if (ds.n == 4) {
        CHECK(seq_is(&ds.ex[0], (int32_t[]){1, 2, 3}, (uint8_t[]){0, 1, 1}, 3));
        CHECK(ds.ex[0].line == 1 && ds.ex[0].format == NL_LINE_TOKENS && ds.ex[0].n_choices == 0);
        CHECK(ds.ex[0].answer == -1);
        CHECK(seq_is(&ds.ex[1], (int32_t[]){5, 6, 7, 8}, (uint8_t[]){0, 0, 1, 1}, 4));
        CHECK(ds.ex[1].line == 4);
        CHECK(seq_is(&ds.ex[2], (int32_t[]){9, 10, 11}, (uint8_t[]){0, 0, 1}, 3));
        CHECK(ds.ex[2].line == 5);
        const nl_example *c = &ds.ex[3];
        CHECK(seq_is(c, (int32_t[]){4, 2, 4, 5}, (uint8_t[]){0, 0, 1, 1}, 4));
        CHECK(c->n_choices == 2 && c->answer == 1 && c->n_prompt == 2);
        CHECK(c->choice_len[0] == 1 && c->choice_ids[0][0] == 3);
        CHECK(c->choice_len[1] == 2 && c->choice_ids[1][0] == 4 && c->choice_ids[1][1] == 5);
        CHECK(ds.n_tokens == 14 && ds.n_targets == 2 + 2 + 1 + 2);
        CHECK(strcmp(ds.path, "t.jsonl") == 0);
    }
    nl_dataset_free(&ds);

    /* A UTF-8 BOM is skipped (columns still count it); a last line without '\n' is read. */
    CHECK(load("\xEF\xBB\xBF{\"tokens\": [1, 2]}", NULL, NULL, &ds) == 0 && ds.n == 1);
    nl_dataset_free(&ds);
    EXPECT_ERR("\xEF\xBB\xBF{\"tokens\": [1, 200]}", NULL, NULL,
               "t.jsonl:1:19: tokens[1] = 200 is outside the vocabulary [0, 100)");
}

static void test_errors(void) {
    /* JSON errors carry the line and the byte column of the problem. */
    EXPECT_ERR("{\"tokens\": [1, 2]}\n{\"tokens\": [1, 2,]}\n", NULL, NULL, "t.jsonl:2:18: trailing comma before ']'");
    EXPECT_ERR("{\"tokens\": [1, 2]}\n\n{\"tokens\": [1 2]}", NULL, NULL,
               "t.jsonl:3:15: expected ',' or ']' after an array element, found '2'");
    EXPECT_ERR("{\"text\": \"a\xff\"}", NULL, NULL, "t.jsonl:1:12: invalid UTF-8 byte 0xFF in string");
    EXPECT_ERR("{\"text\": \"\\uD800\"}", NULL, NULL,
               "t.jsonl:1:11: lone high surrogate \\uD800 (expected a \\uDC00-\\uDFFF escape next)");
    EXPECT_ERR("{\"tokens\": [1], \"tokens\": [2]}", NULL, NULL, "t.jsonl:1:17: duplicate key \"tokens\"");
    EXPECT_ERR("[1, 2]", NULL, NULL, "t.jsonl:1:2: expected a JSON object, found number");
    EXPECT_ERR("", NULL, NULL, "t.jsonl: no examples (the file is empty or has only blank lines)");
    EXPECT_ERR("\n  \n\r\n", NULL, NULL, "t.jsonl: no examples (the file is empty or has only blank lines)");
    /* Keys. */
    EXPECT_ERR(
        "{\"tokens\": [1, 2], \"id\": 7}", NULL, NULL,
        "t.jsonl:1:20: unknown key \"id\" (a line is prompt+completion, messages, conversations, instruction [+ input]"
        " + output, text or tokens [+ loss_mask], with optional choices/answer; without --strict-keys the keys "
        "nightlora"
        " does not read are skipped)");
    EXPECT_ERR("{\"prompt\": \"a\", \"completon\": \"b\"}", NULL, NULL,
               "t.jsonl:1:17: unknown key \"completon\" (a line is prompt+completion, messages, conversations, "
               "instruction [+ input]"
               " + output, text or tokens [+ loss_mask], with optional choices/answer; without --strict-keys the keys "
               "nightlora"
               " does not read are skipped)");
    EXPECT_ERR("{\"tokens\": [1, 2], \"text\": \"x\"}", NULL, NULL,
               "t.jsonl:1:20: \"text\" cannot be combined with \"tokens\" on one line");
    EXPECT_ERR("{}", NULL, NULL,
               "t.jsonl:1:1: a line needs one of \"prompt\" (+ \"completion\"), \"messages\", \"conversations\","
               " \"instruction\" (+ \"output\"), \"text\" or \"tokens\"");
    EXPECT_ERR("{\"completion\": \"x\", \"text\": \"y\"}", NULL, NULL,
               "t.jsonl:1:16: \"completion\" belongs with \"prompt\", not \"text\"");
    EXPECT_ERR("{\"text\": \"y\", \"loss_mask\": [1]}", NULL, NULL,
               "t.jsonl:1:28: \"loss_mask\" belongs with \"tokens\", not \"text\"");
    EXPECT_ERR("{\"tokens\": [1, 2], \"answer\": 0}", NULL, NULL, "t.jsonl:1:30: \"answer\" without \"choices\"");
    /* No tokenizer: only tokens lines. */
    EXPECT_ERR("{\"tokens\": [1, 2]}\n{\"text\": \"hello\"}", NULL, NULL,
               "t.jsonl:2:10: \"text\" needs a tokenizer (only \"tokens\" lines can be read without a model)");
    /* Token ids and masks. */
    EXPECT_ERR("{\"tokens\": [1, 2, 100]}", NULL, NULL,
               "t.jsonl:1:19: tokens[2] = 100 is outside the vocabulary [0, 100)");
    EXPECT_ERR("{\"tokens\": [1, -1]}", NULL, NULL, "t.jsonl:1:16: tokens[1] = -1 is outside the vocabulary [0, 100)");
    EXPECT_ERR(
        "{\"tokens\": [1, 2.5]}", NULL, NULL,
        "t.jsonl:1:16: tokens[1] must be an integer token id written in digits, found a number with a fraction or an"
        " exponent");
    /* 1e-400 underflows to 0, 5.0 and 1e1 are integral: none is a token id written as one */
    EXPECT_ERR(
        "{\"tokens\": [1, 1e-400]}", NULL, NULL,
        "t.jsonl:1:16: tokens[1] must be an integer token id written in digits, found a number with a fraction or an"
        " exponent");
    EXPECT_ERR(
        "{\"tokens\": [5.0, 1]}", NULL, NULL,
        "t.jsonl:1:13: tokens[0] must be an integer token id written in digits, found a number with a fraction or an"
        " exponent");
    EXPECT_ERR(
        "{\"tokens\": [1, 2], \"choices\": [[1e1], [3]], \"answer\": 0}", NULL, NULL,
        "t.jsonl:1:33: choice[0] must be an integer token id written in digits, found a number with a fraction or an"
        " exponent");
    EXPECT_ERR("{\"tokens\": [1, \"2\"]}", NULL, NULL,
               "t.jsonl:1:16: tokens[1] must be an integer token id, found string");
    EXPECT_ERR("{\"tokens\": 5}", NULL, NULL, "t.jsonl:1:12: \"tokens\" must be an array of token ids, found number");
    EXPECT_ERR("{\"tokens\": []}", NULL, NULL, "t.jsonl:1:12: \"tokens\" is empty");
    EXPECT_ERR("{\"tokens\": [1, 2, 3], \"loss_mask\": [1, 1]}", NULL, NULL,
               "t.jsonl:1:36: \"loss_mask\" has 2 entries but \"tokens\" has 3");
    EXPECT_ERR("{\"tokens\": [1, 2], \"loss_mask\": [0, 2]}", NULL, NULL, "t.jsonl:1:37: loss_mask[1] must be 0 or 1");
    EXPECT_ERR("{\"tokens\": [1, 2], \"loss_mask\": [0, true]}", NULL, NULL,
               "t.jsonl:1:37: loss_mask[1] must be 0 or 1");
    EXPECT_ERR("{\"tokens\": [1, 2], \"loss_mask\": {}}", NULL, NULL,
               "t.jsonl:1:33: \"loss_mask\" must be an array of 0/1, found object");
    EXPECT_ERR("{\"tokens\": [7]}", NULL, NULL,
               "t.jsonl:1:12: no target tokens (loss_mask selects no token after the first, or only one token)");
    EXPECT_ERR("{\"tokens\": [7, 8], \"loss_mask\": [1, 0]}", NULL, NULL,
               "t.jsonl:1:12: no target tokens (loss_mask selects no token after the first, or only one token)");
    /* Choices on tokens lines. */
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2]], \"answer\": 0}", NULL, NULL,
               "t.jsonl:1:28: \"choices\" needs at least 2 entries, found 1");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2], []], \"answer\": 0}", NULL, NULL,
               "t.jsonl:1:34: choices[1] is empty");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2], [300]], \"answer\": 0}", NULL, NULL,
               "t.jsonl:1:35: choice[0] = 300 is outside the vocabulary [0, 100)");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2], [3]]}", NULL, NULL,
               "t.jsonl:1:28: a line with \"choices\" needs \"answer\" (an index or the correct choice's text)");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2], [3]], \"answer\": 2}", NULL, NULL,
               "t.jsonl:1:50: \"answer\" must be a choice index in [0, 2) or a choice's text");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [[2], [3]], \"answer\": \"x\"}", NULL, NULL,
               "t.jsonl:1:50: \"answer\" is not one of the choices");
    EXPECT_ERR("{\"tokens\": [1, 2], \"loss_mask\": [1, 1], \"choices\": [[2], [3]], \"answer\": 0}", NULL, NULL,
               "t.jsonl:1:33: \"loss_mask\" cannot be used with \"choices\"");
    EXPECT_ERR("{\"tokens\": [1], \"choices\": [\"a\", \"b\"], \"answer\": 0}", NULL, NULL,
               "t.jsonl:1:29: choices[0] of a tokens line must be an array of token ids, found string");

    /* A file that does not exist names itself. */
    nl_dataset ds;
    CHECK(nl_dataset_load("/nonexistent/x.jsonl", NULL, NULL, &ds) == -1);
    CHECK(strstr(nl_last_error(), "/nonexistent/x.jsonl") != NULL);
}

static void test_file(void) {
    /* Round trip through a real file: the error names the path. */
    char path[] = "/tmp/nl_test_dataset_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fputs("{\"tokens\": [1, 2]}\n{\"tokens\": [1, 2], \"x\": 0}\n", f);
    fclose(f);
    nl_dataset ds;
    nl_data_opts o = {.n_vocab = 10, .strict_keys = 1};
    CHECK(nl_dataset_load(path, NULL, &o, &ds) == -1);
    char want[128];
    snprintf(want, sizeof want, "%s:2:20: unknown key \"x\"", path);
    CHECKF(strncmp(nl_last_error(), want, strlen(want)) == 0, "%s", nl_last_error());
    remove(path);
}

/* A data directory (train.jsonl / valid.jsonl / test.jsonl): the file of a split, NULL for an
 * absent optional one, an error naming both for an absent required one; a file path is no
 * directory (NULL: read it as it is). */
static void test_data_dir(void) {
    char dir[] = "/tmp/nl_test_datadir_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[128];
    snprintf(p, sizeof p, "%s/train.jsonl", dir);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"tokens\": [1, 2]}\n", f);
    fclose(f);
    char *file = (char *)1;
    CHECK(nl_data_dir_file(dir, "train.jsonl", 1, &file) == 0 && file && strcmp(file, p) == 0);
    free(file);
    char slash[140];
    snprintf(slash, sizeof slash, "%s/", dir);
    CHECK(nl_data_dir_file(slash, "train.jsonl", 1, &file) == 0 && file && strcmp(file, p) == 0);
    free(file);
    CHECK(nl_data_dir_file(dir, "valid.jsonl", 0, &file) == 0 && file == NULL);
    CHECK(nl_data_dir_file(dir, "test.jsonl", 1, &file) == -1 && file == NULL);
    char want[400];
    snprintf(want, sizeof want,
             "%s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and %s/test.jsonl cannot be"
             " read: No such file or directory",
             dir, dir);
    CHECKF(strcmp(nl_last_error(), want) == 0, "%s", nl_last_error());
    CHECK(nl_data_dir_file(p, "train.jsonl", 1, &file) == 0 && file == NULL);
    CHECK(nl_data_dir_file("/nonexistent/x.jsonl", "train.jsonl", 1, &file) == 0 && file == NULL);
    remove(p);
    rmdir(dir);
}

/* ---------------- packing and batch order ---------------- */

static void make_lengths(nl_dataset *ds, const int *len, int n) {
    /* tokens lines of the given lengths, all targets */
    size_t cap = 1 << 16, k = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(buf + k, cap - k, "{\"tokens\": [");
        for (int j = 0; j < len[i]; j++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", j ? ", " : "", (i + j) % 50);
        k += (size_t)snprintf(buf + k, cap - k, "]}\n");
    }
    CHECK(nl_dataset_load_buffer(buf, k, "p.jsonl", NULL, NULL, ds) == 0);
    free(buf);
}

/* --val-split: example i (1-based) held out when floor(i F) > floor((i-1) F): F 0.25 of 12 tokens
 * lines holds out lines 4, 8, 12 (blank lines not counted as examples; file lines kept), the
 * rest stay in order; none held out is an error naming --val-split (floor(n F) < n: never all); the rule alone for
 * F 0.1 and 0.3. */
static void test_split(void) {
    char buf[1024];
    size_t k = 0;
    for (int i = 1; i <= 12; i++) {
        k += (size_t)snprintf(buf + k, sizeof buf - k, "{\"tokens\": [%d, %d, %d]}\n", i, i + 1, i + 2);
        if (i == 5) k += (size_t)snprintf(buf + k, sizeof buf - k, "\n"); /* a blank line: line 6 */
    }
    nl_dataset ds, held;
    CHECK(nl_dataset_load_buffer(buf, k, "s.jsonl", NULL, NULL, &ds) == 0 && ds.n == 12);
    CHECKF(nl_dataset_split(&ds, 0.25, &held) == 0, "%s", nl_last_error());
    CHECK(held.n == 3 && ds.n == 9);
    /* examples 4, 8, 12: file lines 4, 9, 13 (the blank line 6 shifts the later ones) */
    CHECK(held.n == 3 && held.ex[0].line == 4 && held.ex[1].line == 9 && held.ex[2].line == 13);
    CHECK(held.n == 3 && held.ex[0].ids[0] == 4 && held.ex[1].ids[0] == 8 && held.ex[2].ids[0] == 12);
    int order = 1;
    for (int i = 1; i < ds.n; i++) order &= ds.ex[i].line > ds.ex[i - 1].line && ds.ex[i].ids[0] % 4 != 0;
    CHECK(order && ds.ex[0].ids[0] == 1);
    CHECK(ds.n_targets == 9 * 2 && held.n_targets == 3 * 2 && ds.n_tokens == 27 && held.n_tokens == 9);
    CHECK(!strcmp(held.path, "s.jsonl"));
    nl_dataset_free(&held);
    /* too few to hold one out, or all of them */
    CHECK(nl_dataset_split(&ds, 0.1, &held) != 0 && strstr(nl_last_error(), "--val-split 0.1") &&
          strstr(nl_last_error(), "9 examples") && ds.n == 9 && held.n == 0);
    nl_dataset_free(&ds);
    CHECK(nl_dataset_load_buffer("{\"tokens\": [1, 2]}\n", 19, "one.jsonl", NULL, NULL, &ds) == 0);
    CHECK(nl_dataset_split(&ds, 0.99, &held) != 0 && strstr(nl_last_error(), "1 examples, too few") && ds.n == 1);
    nl_dataset_free(&ds);
    /* the rule: F 0.1 holds out the 10th, 20th, ...; F 0.3 the 4th, 7th, 10th (floor(i*0.3) steps) */
    int n01 = 0, n03 = 0, ok = 1;
    for (int i = 1; i <= 100; i++) {
        n01 += nl_dataset_is_held_out(i, 0.1);
        n03 += nl_dataset_is_held_out(i, 0.3);
        ok &= nl_dataset_is_held_out(i, 0.1) == (i % 10 == 0);
    }
    CHECK(ok && n01 == 10 && n03 == 30);
    CHECK(!nl_dataset_is_held_out(1, 0.3) && !nl_dataset_is_held_out(3, 0.3) && nl_dataset_is_held_out(4, 0.3) &&
          nl_dataset_is_held_out(7, 0.3) && nl_dataset_is_held_out(10, 0.3));
}

static void test_pack(void) {
    nl_dataset ds;
    int lens[] = {3, 4, 5, 9, 12, 2};
    make_lengths(&ds, lens, 6);
    int buckets[] = {4, 8, 64};
    nl_packing p;
    CHECK(nl_pack(&ds, buckets, 3, 10, NL_OVERLONG_TRUNCATE, &p) == 0);
    CHECK(p.n == 6 && p.n_truncated == 1 && p.n_dropped == 0);
    int want_bucket[] = {4, 4, 8, 10, 10, 4}, want_n[] = {3, 4, 5, 9, 10, 2};
    for (int i = 0; i < p.n && i < 6; i++) {
        CHECKF(p.seq[i].bucket == want_bucket[i] && p.seq[i].n_tokens == want_n[i] && p.seq[i].example == i,
               "seq %d: bucket %d n %d", i, p.seq[i].bucket, p.seq[i].n_tokens);
        CHECK(p.seq[i].ids == ds.ex[i].ids);
    }
    CHECK(p.seq[4].n_targets == 9); /* 10 kept tokens, first is not a target */
    nl_packing_free(&p);

    CHECK(nl_pack(&ds, buckets, 3, 10, NL_OVERLONG_REFUSE, &p) == -1);
    CHECKF(strcmp(nl_last_error(), "p.jsonl:5:1: example has 12 tokens, more than the context of 10 "
                                   "(shorten it, raise the context or truncate)") == 0,
           "%s", nl_last_error());
    CHECK(nl_pack(&ds, (int[]){8, 4}, 2, 10, NL_OVERLONG_TRUNCATE, &p) == -1);
    CHECK(strstr(nl_last_error(), "ascending") != NULL);
    nl_dataset_free(&ds);

    /* Truncation that leaves no target drops the example. */
    const char *t = "{\"tokens\": [1, 2, 3, 4, 5, 6], \"loss_mask\": [0, 0, 0, 0, 1, 1]}\n{\"tokens\": [1, 2]}";
    CHECK(nl_dataset_load_buffer(t, strlen(t), "d.jsonl", NULL, NULL, &ds) == 0);
    CHECK(nl_pack(&ds, NULL, 0, 3, NL_OVERLONG_TRUNCATE, &p) == 0);
    CHECK(p.n == 1 && p.n_dropped == 1 && p.seq[0].example == 1 && p.seq[0].bucket == 3);
    nl_packing_free(&p);
    CHECK(nl_pack(&ds, NULL, 0, 1, NL_OVERLONG_TRUNCATE, &p) == -1);
    nl_dataset_free(&ds);
}

static int is_perm(const int *p, int n) {
    int *seen = calloc((size_t)n, sizeof *seen);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]) ok = 0;
        else seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_order_and_batches(void) {
    enum { N = 37 };
    int a[N], b[N], c[N];
    nl_data_order(N, 42, 0, false, a);
    int ident = 1;
    for (int i = 0; i < N; i++) ident &= a[i] == i;
    CHECK(ident);
    nl_data_order(N, 42, 0, true, a);
    nl_data_order(N, 42, 0, true, b);
    CHECK(is_perm(a, N) && memcmp(a, b, sizeof a) == 0);
    nl_data_order(N, 42, 1, true, c);
    CHECK(is_perm(c, N) && memcmp(a, c, sizeof a) != 0);
    nl_data_order(N, 43, 0, true, c);
    CHECK(memcmp(a, c, sizeof a) != 0);
    ident = 1;
    for (int i = 0; i < N; i++) ident &= a[i] == i;
    CHECK(!ident);
    /* Rough uniformity: position 0 over many seeds hits every index. */
    int hits[N] = {0};
    for (int s = 0; s < 2000; s++) {
        nl_data_order(N, (uint64_t)s, 0, true, c);
        hits[c[0]]++;
    }
    int minh = 1 << 30, maxh = 0;
    for (int i = 0; i < N; i++) {
        if (hits[i] < minh) minh = hits[i];
        if (hits[i] > maxh) maxh = hits[i];
    }
    CHECKF(minh > 20 && maxh < 110, "min %d max %d (expected ~54)", minh, maxh);

    /* Batches: token budget, epochs, resume from any cursor. */
    int lens[N];
    for (int i = 0; i < N; i++) lens[i] = 2 + (i * 7) % 13;
    nl_dataset ds;
    make_lengths(&ds, lens, N);
    nl_packing p;
    CHECK(nl_pack(&ds, (int[]){4, 8, 16}, 3, 16, NL_OVERLONG_REFUSE, &p) == 0);
    nl_batcher *bt = nl_batcher_new(&p, 7, true, 20);
    CHECK(bt != NULL);
    enum { STEPS = 40 };
    int log_n[STEPS], log_idx[STEPS][N];
    nl_data_cursor cur_before[STEPS];
    int seen_in_epoch[N] = {0}, epoch0_count = 0;
    for (int s = 0; s < STEPS; s++) {
        cur_before[s] = nl_batcher_cursor(bt);
        const int *idx;
        int n;
        CHECK(nl_batcher_next(bt, &idx, &n) == 0);
        log_n[s] = n;
        memcpy(log_idx[s], idx, (size_t)n * sizeof *idx);
        int tokens = 0;
        for (int k = 0; k < n; k++) tokens += p.seq[idx[k]].n_tokens;
        CHECKF(n >= 1 && (tokens <= 20 || n == 1), "step %d: %d seqs %d tokens", s, n, tokens);
        if (cur_before[s].epoch == 0)
            for (int k = 0; k < n; k++) {
                seen_in_epoch[idx[k]]++;
                epoch0_count++;
            }
    }
    /* Epoch 0 visited every sequence exactly once, then rolled over. */
    int once = 1;
    for (int i = 0; i < N; i++) once &= seen_in_epoch[i] == 1;
    CHECK(once && epoch0_count == N);
    CHECK(nl_batcher_cursor(bt).epoch >= 1);
    nl_batcher_free(bt);
    /* Resume: a fresh batcher seeked to any saved cursor replays the same batches. */
    int resumed_ok = 1;
    for (int from = 0; from < STEPS; from += 7) {
        nl_batcher *r = nl_batcher_new(&p, 7, true, 20);
        CHECK(nl_batcher_seek(r, cur_before[from]) == 0);
        for (int s = from; s < STEPS; s++) {
            const int *idx;
            int n;
            nl_batcher_next(r, &idx, &n);
            if (n != log_n[s] || memcmp(idx, log_idx[s], (size_t)n * sizeof *idx) != 0) resumed_ok = 0;
        }
        nl_batcher_free(r);
    }
    CHECK(resumed_ok);
    /* A cursor at the end of an epoch means the start of the next. */
    bt = nl_batcher_new(&p, 7, false, 1);
    CHECK(nl_batcher_seek(bt, (nl_data_cursor){2, N}) == 0);
    CHECK(nl_batcher_cursor(bt).epoch == 3 && nl_batcher_cursor(bt).index == 0);
    CHECK(nl_batcher_seek(bt, (nl_data_cursor){0, N + 1}) == -1);
    /* batch_tokens 1: one sequence per batch, file order without shuffle. */
    const int *idx;
    int n;
    nl_batcher_seek(bt, (nl_data_cursor){0, 5});
    CHECK(nl_batcher_next(bt, &idx, &n) == 0 && n == 1 && idx[0] == 5);
    nl_batcher_free(bt);
    CHECK(nl_batcher_new(&p, 7, false, 0) == NULL);
    nl_packing_free(&p);
    nl_dataset_free(&ds);
}

/* ---------------- with a tokenizer ---------------- */

/* GPT-2 byte-to-unicode mapping (formats.md §5): printable bytes map to themselves, the other
 * 68 bytes, in increasing order, to U+0100 onwards. */
static int put_byte_token(char *o, int b) {
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
        cp = b;
    } else {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
        cp = 0x100 + k;
    }
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
        return 1;
    }
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    o[2] = 0;
    return 2;
}

/* A vocab where byte b is token b (no merges) followed by the template tokens:
 * 256 <|im_start|>, 257 <|im_end|> (reserved names in the llama3 vocab), 258 <|start_header_id|>, 259
 * <|end_header_id|>, 260 <|eot_id|>, 261 <|begin_of_text|>, 262 <|endoftext|>. */
static nl_tokenizer *chat_vocab(const char *path, bool llama3, const char *tmpl) {
    static char bytes[256][4];
    const char *toks[263];
    int32_t types[263];
    for (int b = 0; b < 256; b++) {
        put_byte_token(bytes[b], b);
        toks[b] = bytes[b];
        types[b] = 1;
    }
    const char *sp[] = {"<|im_start|>", "<|im_end|>",        "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>",   "<|begin_of_text|>", "<|endoftext|>"};
    if (llama3) { /* a Llama-3 vocab has no ChatML markers */
        sp[0] = "<|reserved_special_token_0|>";
        sp[1] = "<|reserved_special_token_1|>";
    }
    for (int i = 0; i < 7; i++) {
        toks[256 + i] = sp[i];
        types[256 + i] = 3;
    }
    const char *merges[] = {"Q Q"}; /* never fires in the tests' text */
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_set_str(w, "general.architecture", "llama");
    nl_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    nl_gguf_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 263);
    nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, types, 263);
    nl_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    nl_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 261);
    nl_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", llama3 ? 260 : 262);
    nl_gguf_set_u32(w, "tokenizer.ggml.eot_token_id", llama3 ? 260 : 257);
    nl_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", llama3);
    nl_gguf_set_str(
        w, "tokenizer.chat_template",
        tmpl ? tmpl
        : llama3
            ? "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] +"
              " '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
              "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
            : "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] +"
              " '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
              "{%- endif %}");
    int rc = nl_gguf_write(w, path);
    nl_gguf_writer_free(w);
    CHECKF(rc == 0, "%s", nl_last_error());
    nl_gguf *g = nl_gguf_open(path);
    CHECKF(g != NULL, "%s", nl_last_error());
    if (!g) return NULL;
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    CHECKF(t != NULL, "%s", nl_last_error());
    nl_gguf_close(g);
    remove(path);
    return t;
}

static nl_tokenizer *gpt2_vocab(void) {
    nl_gguf *g = nl_gguf_open(NL_TEST_DATA "/tokenizer/ggml-vocab-gpt-2.gguf");
    CHECKF(g != NULL, "%s", nl_last_error());
    if (!g) return NULL;
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    CHECKF(t != NULL, "%s", nl_last_error());
    nl_gguf_close(g);
    return t;
}

/* Expected-sequence builder: bytes of text are their own ids in the chat test vocab. */
typedef struct {
    int32_t ids[512];
    uint8_t tg[512];
    int n;
} seqb;
static void sb_id(seqb *s, int32_t id, int t) {
    s->ids[s->n] = id;
    s->tg[s->n++] = (uint8_t)t;
}
static void sb_txt(seqb *s, const char *txt, int t) {
    for (const char *p = txt; *p; p++) sb_id(s, (unsigned char)*p, t);
}

static void test_chat(const nl_tokenizer *cml, const nl_tokenizer *l3) {
    /* Template choice. */
    nl_chat_tmpl t;
    CHECK(nl_chat_template_pick(NULL, "x<|im_start|>y", &t) == 0 && t == NL_TMPL_CHATML);
    CHECK(nl_chat_template_pick("auto", "<|start_header_id|>", &t) == 0 && t == NL_TMPL_LLAMA3);
    CHECK(nl_chat_template_pick("llama3", "<|im_start|>", &t) == 0 && t == NL_TMPL_LLAMA3);
    CHECK(nl_chat_template_pick("chatml", NULL, &t) == 0 && t == NL_TMPL_CHATML);
    CHECK(nl_chat_template_pick("vicuna", "<|im_start|>", &t) == -1);
    CHECK(strcmp(nl_last_error(), "unknown chat template \"vicuna\" (known: chatml, llama3)") == 0);
    CHECK(nl_chat_template_pick(NULL, "{{ bos }}[INST]", &t) == -1 && strstr(nl_last_error(), "name one"));
    CHECK(nl_chat_template_pick("", NULL, &t) == -1 && strstr(nl_last_error(), "no chat template"));
    CHECK(strcmp(nl_chat_template_name(NL_TMPL_LLAMA3), "llama3") == 0);

    /* Rendered text, exactly as llama.cpp's chatml / llama3 formats. */
    nl_chat_msg m[] = {{"system", "Be brief.", 9, NULL}, {"user", "Hi", 2, NULL}, {"assistant", " Hello! \n", 9, NULL}};
    char *txt;
    size_t tl;
    CHECK(nl_chat_render(NL_TMPL_CHATML, m, 3, true, &txt, &tl) == 0);
    const char *want_cml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                           "<|im_start|>assistant\n Hello! \n<|im_end|>\n<|im_start|>assistant\n";
    CHECK(strcmp(txt, want_cml) == 0 && tl == strlen(want_cml));
    free(txt);
    CHECK(nl_chat_render(NL_TMPL_LLAMA3, m, 3, false, &txt, &tl) == 0);
    const char *want_l3 = "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>";
    CHECK(strcmp(txt, want_l3) == 0);
    free(txt);

    if (!cml || !l3) return;
    int32_t ims = nl_token_lookup(cml, "<|im_start|>"), ime = nl_token_lookup(cml, "<|im_end|>");
    int32_t hs = nl_token_lookup(l3, "<|start_header_id|>"), he = nl_token_lookup(l3, "<|end_header_id|>");
    int32_t eot = nl_token_lookup(l3, "<|eot_id|>"), bos = nl_token_bos(l3);
    CHECK(ims >= 0 && ime >= 0 && hs >= 0 && he >= 0 && eot >= 0 && bos >= 0);

    /* ChatML: loss on assistant content + <|im_end|>, not on headers or the "\n" after. */
    const char *line =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"content\": \"Yo\"}, {\"role\": \"user\", \"content\": \"?\"},"
        " {\"role\": \"assistant\", \"content\": \"ok\"}]}";
    seqb e = {0};
    sb_id(&e, ims, 0);
    sb_txt(&e, "system\nS", 0);
    sb_id(&e, ime, 0);
    sb_txt(&e, "\n", 0);
    sb_id(&e, ims, 0);
    sb_txt(&e, "user\nHi", 0);
    sb_id(&e, ime, 0);
    sb_txt(&e, "\n", 0);
    sb_id(&e, ims, 0);
    sb_txt(&e, "assistant\n", 0);
    sb_txt(&e, "Yo", 1);
    sb_id(&e, ime, 1);
    sb_txt(&e, "\n", 0);
    sb_id(&e, ims, 0);
    sb_txt(&e, "user\n?", 0);
    sb_id(&e, ime, 0);
    sb_txt(&e, "\n", 0);
    sb_id(&e, ims, 0);
    sb_txt(&e, "assistant\n", 0);
    sb_txt(&e, "ok", 1);
    sb_id(&e, ime, 1);
    sb_txt(&e, "\n", 0);
    nl_dataset ds;
    CHECKF(load(line, cml, NULL, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) CHECK(seq_is(&ds.ex[0], e.ids, e.tg, e.n) && ds.ex[0].format == NL_LINE_MESSAGES);
    nl_dataset_free(&ds);
    /* The same via nl_chat_tokenize, and the rendered text tokenized with parse_special
     * gives the same ids (content here has no seam effects). */
    nl_chat_msg mm[] = {{"system", "S", 1, NULL},
                        {"user", "Hi", 2, NULL},
                        {"assistant", "Yo", 2, NULL},
                        {"user", "?", 1, NULL},
                        {"assistant", "ok", 2, NULL}};
    int32_t *ids;
    uint8_t *tg;
    int n;
    CHECK(nl_chat_tokenize(cml, NL_TMPL_CHATML, mm, 5, false, &ids, &tg, &n) == 0);
    CHECK(n == e.n && memcmp(ids, e.ids, (size_t)n * 4) == 0 && memcmp(tg, e.tg, (size_t)n) == 0);
    free(ids);
    free(tg);
    CHECK(nl_chat_render(NL_TMPL_CHATML, mm, 5, false, &txt, &tl) == 0);
    CHECK(nl_tokenize(cml, txt, tl, false, true, &ids, &n) == 0);
    CHECK(n == e.n && memcmp(ids, e.ids, (size_t)n * 4) == 0);
    free(ids);
    free(txt);

    /* Llama-3: BOS, trimmed content, loss on content + <|eot_id|>. */
    line = "{\"messages\": [{\"role\": \"user\", \"content\": \" Hi \"}, {\"role\": \"assistant\", \"content\": \"\\n "
           "Yo\\t\"}]}";
    e.n = 0;
    sb_id(&e, bos, 0);
    sb_id(&e, hs, 0);
    sb_txt(&e, "user", 0);
    sb_id(&e, he, 0);
    sb_txt(&e, "\n\nHi", 0);
    sb_id(&e, eot, 0);
    sb_id(&e, hs, 0);
    sb_txt(&e, "assistant", 0);
    sb_id(&e, he, 0);
    sb_txt(&e, "\n\n", 0);
    sb_txt(&e, "Yo", 1);
    sb_id(&e, eot, 1);
    CHECKF(load(line, l3, NULL, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) CHECK(seq_is(&ds.ex[0], e.ids, e.tg, e.n));
    nl_dataset_free(&ds);
    /* Name override: the llama3 vocab rendered as chatml fails (it lacks <|im_start|>)... */
    EXPECT_ERR(line, l3, "chatml",
               "t.jsonl:1:14: chat template chatml needs the token <|im_start|>, which the vocabulary lacks");
    /* ...and the chatml vocab (which has the llama3 tokens too) can be forced to llama3. */
    CHECK(load(line, cml, "llama3", &ds) == 0 && ds.n == 1 && ds.ex[0].ids[0] == hs); /* no BOS: add_bos off */
    nl_dataset_free(&ds);
    EXPECT_ERR(line, cml, "zephyr",
               "t.jsonl:1:14: unknown chat template \"zephyr\" (known: chatml, llama3; or a FILE.jinja)");

    /* Generation prompt for `nightlora generate`. */
    CHECK(nl_chat_prompt_tokens(cml, NULL, "Hi", 2, &ids, &n) == 0);
    e.n = 0;
    sb_id(&e, ims, 0);
    sb_txt(&e, "user\nHi", 0);
    sb_id(&e, ime, 0);
    sb_txt(&e, "\n", 0);
    sb_id(&e, ims, 0);
    sb_txt(&e, "assistant\n", 0);
    CHECK(n == e.n && memcmp(ids, e.ids, (size_t)n * 4) == 0);
    free(ids);
    CHECK(nl_chat_prompt_tokens(l3, NULL, "Hi", 2, &ids, &n) == 0);
    e.n = 0;
    sb_id(&e, bos, 0);
    sb_id(&e, hs, 0);
    sb_txt(&e, "user", 0);
    sb_id(&e, he, 0);
    sb_txt(&e, "\n\nHi", 0);
    sb_id(&e, eot, 0);
    sb_id(&e, hs, 0);
    sb_txt(&e, "assistant", 0);
    sb_id(&e, he, 0);
    sb_txt(&e, "\n\n", 0);
    CHECK(n == e.n && memcmp(ids, e.ids, (size_t)n * 4) == 0);
    free(ids);

    /* Messages with choices: context = conversation + generation prompt. */
    line =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"choices\": [\"3\", \"4\"], \"answer\": \"4\"}";
    CHECKF(load(line, cml, NULL, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) {
        e.n = 0;
        sb_id(&e, ims, 0);
        sb_txt(&e, "user\n2+2?", 0);
        sb_id(&e, ime, 0);
        sb_txt(&e, "\n", 0);
        sb_id(&e, ims, 0);
        sb_txt(&e, "assistant\n", 0);
        int np = e.n;
        sb_txt(&e, "4", 1);
        CHECK(seq_is(&ds.ex[0], e.ids, e.tg, e.n) && ds.ex[0].n_prompt == np && ds.ex[0].answer == 1);
        CHECK(ds.ex[0].choice_len[0] == 1 && ds.ex[0].choice_ids[0][0] == '3');
    }
    nl_dataset_free(&ds);

    /* The chat sample file (CRLF line ends). */
    CHECKF(nl_dataset_load(NL_TEST_DATA "/data/chat.jsonl", cml, NULL, &ds) == 0, "%s", nl_last_error());
    CHECK(ds.n == 2);
    if (ds.n == 2) {
        CHECK(ds.ex[0].n_targets == (int)strlen("Paris.") + 1);
        CHECK(ds.ex[1].n_choices == 3 && ds.ex[1].answer == 1 && ds.ex[1].line == 2);
    }
    nl_dataset_free(&ds);

    /* Message errors. */
    EXPECT_ERR("{\"messages\": []}", cml, NULL, "t.jsonl:1:14: \"messages\" is empty");
    EXPECT_ERR("{\"messages\": \"hi\"}", cml, NULL, "t.jsonl:1:14: \"messages\" must be an array, found string");
    EXPECT_ERR("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", cml, NULL,
               "t.jsonl:1:14: no assistant message (loss is on assistant turns: nothing to learn)");
    EXPECT_ERR("{\"messages\": [{\"role\": \"bot\", \"content\": \"a\"}]}", cml, NULL,
               "t.jsonl:1:24: messages[0]: unknown role \"bot\" (expected system, user, assistant or tool)");
    EXPECT_ERR("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", cml, NULL,
               "t.jsonl:1:43: \"content\" must be a string, found number");
    EXPECT_ERR("{\"messages\": [{\"role\": \"user\"}]}", cml, NULL, "t.jsonl:1:15: messages[0] needs \"content\"");
    EXPECT_ERR(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"nmae\": \"x\"}]}", cml, NULL,
        "t.jsonl:1:48: messages[0]: unknown key \"nmae\" (expected \"role\" and \"content\", optionally tool_calls,"
        " reasoning_content, name, tool_call_id; without --strict-keys the keys nightlora does not read are skipped)");
    EXPECT_ERR(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}],"
        " \"tools\": {}}",
        cml, NULL, "t.jsonl:1:98: \"tools\" must be an array (of function descriptions), found object");
    EXPECT_ERR("{\"text\": \"a\", \"tools\": []}", cml, NULL,
               "t.jsonl:1:24: \"tools\" belongs with a conversation (\"messages\"), not \"text\"");
    EXPECT_ERR("{\"messages\": [1]}", cml, NULL, "t.jsonl:1:15: messages[0] must be an object, found number");
    EXPECT_ERR(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}],"
        " \"choices\": [\"x\", \"y\"], \"answer\": 0}",
        cml, NULL, "t.jsonl:1:14: with \"choices\", the conversation must not end with an assistant message");
}

/* Two examples hold the same tokens and targets. */
static int same_seq(const nl_example *a, const nl_example *b) {
    return a->n_tokens == b->n_tokens && a->n_targets == b->n_targets &&
           memcmp(a->ids, b->ids, (size_t)a->n_tokens * sizeof *a->ids) == 0 &&
           memcmp(a->target, b->target, (size_t)a->n_tokens) == 0;
}

/* Data as the common tools export it: ShareGPT "conversations", TRL's conversational
 * prompt/completion message lists, and extra columns under ignore_unknown_keys. Each shape
 * is the messages line of the same conversation, token for token and target for target. */
static void test_chat_shapes(const nl_tokenizer *cml) {
    if (!cml) return;
    const char *text =
        /* 1: messages */
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"content\": \"Yo\"}, {\"role\": \"user\", \"content\": \"?\"},"
        " {\"role\": \"assistant\", \"content\": \"ok\"}]}\n"
        /* 2: ShareGPT, human/gpt */
        "{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": \"human\", \"value\": \"Hi\"},"
        " {\"from\": \"gpt\", \"value\": \"Yo\"}, {\"value\": \"?\", \"from\": \"human\"}, {\"from\": \"gpt\", "
        "\"value\": \"ok\"}]}\n"
        /* 3: ShareGPT with user/assistant names */
        "{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": \"user\", \"value\": \"Hi\"},"
        " {\"from\": \"assistant\", \"value\": \"Yo\"}, {\"from\": \"user\", \"value\": \"?\"}, {\"from\": "
        "\"assistant\", \"value\": \"ok\"}]}\n"
        /* 4: TRL: the prompt's assistant turn is context, the loss is on the completion */
        "{\"prompt\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"content\": \"Yo\"}, {\"role\": \"user\", \"content\": \"?\"}],"
        " \"completion\": [{\"role\": \"assistant\", \"content\": \"ok\"}]}\n"
        /* 5: TRL, one turn each; 6: its messages line */
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"completion\": [{\"role\": \"assistant\", "
        "\"content\": \"Yo\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}\n"
        /* 7: TRL with choices; 8: its messages line */
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"choices\": [\"3\", \"4\"], \"answer\": 1}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"choices\": [\"3\", \"4\"], \"answer\": 1}\n"
        /* 9: TRL with an empty prompt list */
        "{\"prompt\": [], \"completion\": [{\"role\": \"assistant\", \"content\": \"Yo\"}]}\n";
    nl_dataset ds;
    CHECKF(load(text, cml, NULL, &ds) == 0, "%s", nl_last_error());
    CHECK(ds.n == 9);
    if (ds.n == 9) {
        for (int i = 0; i < 9; i++) CHECK(ds.ex[i].format == NL_LINE_MESSAGES);
        CHECK(same_seq(&ds.ex[1], &ds.ex[0]));
        CHECK(same_seq(&ds.ex[2], &ds.ex[0]));
        /* line 4: line 1's tokens; targets only on "ok<|im_end|>" */
        const nl_example *a = &ds.ex[0], *t = &ds.ex[3];
        CHECK(t->n_tokens == a->n_tokens && memcmp(t->ids, a->ids, (size_t)a->n_tokens * sizeof *a->ids) == 0);
        CHECK(a->n_targets == 6 && t->n_targets == 3);
        int last = -1;
        for (int i = 0; i < t->n_tokens; i++)
            if (t->target[i]) {
                CHECK(a->target[i]);
                if (last < 0) last = i;
            }
        if (last >= 0) CHECK(t->ids[last] == 'o' && t->ids[last + 1] == 'k');
        CHECK(same_seq(&ds.ex[4], &ds.ex[5]));
        CHECK(same_seq(&ds.ex[6], &ds.ex[7]) && ds.ex[6].n_choices == 2 && ds.ex[6].answer == 1 &&
              ds.ex[6].n_prompt == ds.ex[7].n_prompt);
        CHECK(ds.ex[8].n_targets == 3 && ds.ex[8].line == 9);
    }
    nl_dataset_free(&ds);

    /* Extra columns: an error by default that names the line and the key and says how to
     * skip them; skipped with ignore_unknown_keys (on the line and in its turns). */
    const char *extra =
        "{\"id\": 7, \"source\": \"x\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi\", \"weight\": 0},"
        " {\"from\": \"gpt\", \"value\": \"Yo\"}]}";
    EXPECT_ERR(
        extra, cml, NULL,
        "t.jsonl:1:2: unknown key \"id\" (a line is prompt+completion, messages, conversations, instruction [+ input]"
        " + output, text or tokens [+ loss_mask], with optional choices/answer; without --strict-keys the keys "
        "nightlora"
        " does not read are skipped)");
    strict_keys = 0;
    CHECKF(load(extra, cml, NULL, &ds) == 0, "%s", nl_last_error());
    nl_dataset d2;
    CHECK(load("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
               "\"Yo\"}]}",
               cml, NULL, &d2) == 0);
    if (ds.n == 1 && d2.n == 1) CHECK(same_seq(&ds.ex[0], &d2.ex[0]));
    nl_dataset_free(&ds);
    nl_dataset_free(&d2);
    CHECK(load("{\"tokens\": [1, 2], \"id\": \"a\", \"source\": {\"k\": [1]}}", NULL, NULL, &ds) == 0 && ds.n == 1);
    nl_dataset_free(&ds);
    /* what the flag does not excuse: no format key, two formats, a bad value of a known key */
    EXPECT_ERR(
        "{\"id\": 7, \"input\": \"x\"}", cml, NULL,
        "t.jsonl:1:2: a line needs one of \"prompt\" (+ \"completion\"), \"messages\", \"conversations\","
        " \"instruction\" (+ \"output\"), \"text\" or \"tokens\"; the line's \"id\" is no key nightlora reads (a typo?"
        " --columns KEY=id reads it as KEY)");
    EXPECT_ERR("{\"prompt\": \"a\", \"completon\": \"b\"}", cml, NULL,
               "t.jsonl:1:17: a \"prompt\" line needs \"completion\"; the line's \"completon\" is no key nightlora "
               "reads (a typo?"
               " --columns KEY=completon reads it as KEY)");
    EXPECT_ERR("{\"id\": 1, \"conversations\": [{\"from\": \"human\", \"value\": 3}]}", cml, NULL,
               "t.jsonl:1:56: \"value\" must be a string, found number");
    strict_keys = 1;
    EXPECT_ERR("{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\", \"weight\": 0}]}", cml, NULL,
               "t.jsonl:1:53: conversations[0]: unknown key \"weight\" (expected \"from\" and \"value\"; without"
               " --strict-keys the keys nightlora does not read are skipped)");

    /* ShareGPT errors: wrong types, missing fields, an unknown "from", an empty conversation. */
    EXPECT_ERR("{\"conversations\": \"hi\"}", cml, NULL,
               "t.jsonl:1:19: \"conversations\" must be an array, found string");
    EXPECT_ERR("{\"conversations\": []}", cml, NULL, "t.jsonl:1:19: \"conversations\" is empty");
    EXPECT_ERR("{\"conversations\": [\"hi\"]}", cml, NULL,
               "t.jsonl:1:20: conversations[0] must be an object, found string");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"human\"}]}", cml, NULL,
               "t.jsonl:1:20: conversations[0] needs \"value\"");
    EXPECT_ERR("{\"conversations\": [{\"value\": \"a\"}]}", cml, NULL, "t.jsonl:1:20: conversations[0] needs \"from\"");
    EXPECT_ERR("{\"conversations\": [{\"from\": 1, \"value\": \"a\"}]}", cml, NULL,
               "t.jsonl:1:29: \"from\" must be a string, found number");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"human\", \"value\": null}]}", cml, NULL,
               "t.jsonl:1:47: \"value\" must be a string, found null");
    EXPECT_ERR(
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function\", \"value\": \"b\"}]}",
        cml, NULL,
        "t.jsonl:1:62: conversations[1]: unknown \"from\" \"function\" (expected human, gpt or system; user, assistant "
        "and tool are"
        " taken too)");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}]}", cml, NULL,
               "t.jsonl:1:19: no \"gpt\" turn (loss is on the assistant turns: nothing to learn)");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}], \"messages\": []}", cml, NULL,
               "t.jsonl:1:54: \"messages\" cannot be combined with \"conversations\" on one line");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"gpt\", \"value\": \"a\"}], \"completion\": \"b\"}", cml, NULL,
               "t.jsonl:1:66: \"completion\" belongs with \"prompt\", not \"conversations\"");
    EXPECT_ERR("{\"conversations\": [{\"from\": \"gpt\", \"value\": \"a\"}]}", NULL, NULL,
               "t.jsonl:1:19: \"conversations\" needs a tokenizer (only \"tokens\" lines can be read without a model)");

    /* TRL errors: mixed string/list, an empty or assistant-less completion, bad turns. */
    EXPECT_ERR(
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": \"b\"}", cml, NULL,
        "t.jsonl:1:62: \"completion\" is a string but \"prompt\" is a message list: give both as strings, or both as"
        " lists of {\"role\", \"content\"} messages (TRL's conversational form)");
    EXPECT_ERR(
        "{\"prompt\": \"a\", \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}", cml, NULL,
        "t.jsonl:1:31: \"completion\" is a message list but \"prompt\" is a string: give both as strings, or both as"
        " lists of {\"role\", \"content\"} messages (TRL's conversational form)");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": []}", cml, NULL,
               "t.jsonl:1:62: \"completion\" is empty");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": 5}", cml, NULL,
               "t.jsonl:1:62: \"completion\" must be an array, found number");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}]}", cml, NULL,
               "t.jsonl:1:1: a \"prompt\" line needs \"completion\"");
    EXPECT_ERR(
        "{\"prompt\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"completion\": [{\"role\": \"user\", "
        "\"content\": \"b\"}]}",
        cml, NULL,
        "t.jsonl:1:67: \"completion\" has no assistant message (loss is on the completion's assistant turns: nothing to"
        " learn)");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": [{\"role\": \"gpt\", "
               "\"content\": \"b\"}]}",
               cml, NULL,
               "t.jsonl:1:72: completion[0]: unknown role \"gpt\" (expected system, user, assistant or tool)");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": [{\"role\": \"assistant\"}]}",
               cml, NULL, "t.jsonl:1:63: completion[0] needs \"content\"");
    EXPECT_ERR("{\"prompt\": [7], \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}", cml, NULL,
               "t.jsonl:1:13: prompt[0] must be an object, found number");
    EXPECT_ERR("{\"prompt\": [], \"completion\": []}", cml, NULL, "t.jsonl:1:30: \"completion\" is empty");
    EXPECT_ERR("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": [{\"role\": \"assistant\", "
               "\"content\": \"b\"}],"
               " \"choices\": [\"b\", \"c\"], \"answer\": 0}",
               cml, NULL,
               "t.jsonl:1:62: with \"choices\", a message-list \"prompt\" takes no \"completion\" (the answer is one "
               "of the choices)");
    EXPECT_ERR("{\"prompt\": [], \"choices\": [\"b\", \"c\"], \"answer\": 0}", cml, NULL,
               "t.jsonl:1:12: \"prompt\" is empty");
}

static void test_plain_text(const nl_tokenizer *g2) {
    if (!g2) return;
    /* GPT-2: "Hello" = 15496, " world" = 995, "<|endoftext|>" = 50256 (eos); no BOS added. */
    CHECK(nl_token_eos(g2) == 50256);
    nl_dataset ds;
    const char *text = "{\"text\": \"Hello world\"}\n"
                       "{\"prompt\": \"Hello\", \"completion\": \" world\"}\n"
                       "{\"completion\": \" world\", \"prompt\": \"\"}\n"
                       "{\"prompt\": \"Hello\", \"choices\": [\" world\", \" there\"], \"answer\": 0}\n"
                       "{\"prompt\": \"Hello\", \"completion\": \" there\", \"choices\": [\" world\", \" there\"]}\n"
                       "{\"text\": \"Hello\", \"choices\": [\" world\", \" there\"], \"answer\": \" there\"}\n";
    CHECKF(load(text, g2, NULL, &ds) == 0, "%s", nl_last_error());
    CHECK(ds.n == 6);
    if (ds.n == 6) {
        CHECK(seq_is(&ds.ex[0], (int32_t[]){15496, 995}, (uint8_t[]){0, 1}, 2));
        CHECK(ds.ex[0].format == NL_LINE_TEXT);
        CHECK(seq_is(&ds.ex[1], (int32_t[]){15496, 995, 50256}, (uint8_t[]){0, 1, 1}, 3));
        CHECK(ds.ex[1].format == NL_LINE_PROMPT && ds.ex[1].n_choices == 0);
        /* Empty prompt and no BOS: the first completion token has nothing before it. */
        CHECK(seq_is(&ds.ex[2], (int32_t[]){995, 50256}, (uint8_t[]){0, 1}, 2));
        int32_t there[8];
        int32_t *ids;
        int n;
        CHECK(nl_tokenize(g2, " there", 6, false, false, &ids, &n) == 0 && n == 1);
        there[0] = ids[0];
        free(ids);
        const nl_example *c = &ds.ex[3];
        CHECK(seq_is(c, (int32_t[]){15496, 995}, (uint8_t[]){0, 1}, 2));
        CHECK(c->n_choices == 2 && c->answer == 0 && c->n_prompt == 1);
        CHECK(c->choice_len[1] == 1 && c->choice_ids[1][0] == there[0]);
        c = &ds.ex[4];
        CHECK(seq_is(c, (int32_t[]){15496, there[0]}, (uint8_t[]){0, 1}, 2) && c->answer == 1);
        c = &ds.ex[5];
        CHECK(seq_is(c, (int32_t[]){15496, there[0]}, (uint8_t[]){0, 1}, 2) && c->answer == 1);
        CHECK(c->format == NL_LINE_TEXT && c->n_prompt == 1);
    }
    nl_dataset_free(&ds);

    /* Separate tokenization of prompt and completion: "Hel"+"lo" is not "Hello". */
    CHECK(load("{\"prompt\": \"Hel\", \"completion\": \"lo\"}", g2, NULL, &ds) == 0);
    int32_t *a, *b;
    int na, nb;
    nl_tokenize(g2, "Hel", 3, false, false, &a, &na);
    nl_tokenize(g2, "lo", 2, false, false, &b, &nb);
    if (ds.n == 1) {
        const nl_example *x = &ds.ex[0];
        CHECK(x->n_tokens == na + nb + 1 && memcmp(x->ids, a, (size_t)na * 4) == 0 &&
              memcmp(x->ids + na, b, (size_t)nb * 4) == 0 && x->ids[na + nb] == 50256);
        CHECK(x->n_targets == nb + 1 && x->target[na] == 1 && x->target[na - 1] == 0);
    }
    free(a);
    free(b);
    nl_dataset_free(&ds);

    /* Errors of the text formats. */
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"\"}", g2, NULL,
               "t.jsonl:1:31: \"completion\" is empty (nothing to learn)");
    EXPECT_ERR("{\"prompt\": \"a\"}", g2, NULL, "t.jsonl:1:1: a \"prompt\" line needs \"completion\"");
    EXPECT_ERR("{\"prompt\": 1, \"completion\": \"b\"}", g2, NULL,
               "t.jsonl:1:12: \"prompt\" must be a string, found number");
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": null}", g2, NULL,
               "t.jsonl:1:31: \"completion\" must be a string, found null");
    EXPECT_ERR("{\"text\": \"\"}", g2, NULL, "t.jsonl:1:10: \"text\" is empty");
    EXPECT_ERR("{\"text\": \"Hello\"}", g2, NULL,
               "t.jsonl:1:10: no target tokens (the text is a single token: nothing to predict)");
    /* an empty prompt with one-token choices (GPT-2 adds no BOS): the answer would be the
     * sequence's first token */
    EXPECT_ERR(
        "{\"prompt\": \"\", \"choices\": [\"a\", \"b\"], \"answer\": 0}", g2, NULL,
        "t.jsonl:1:27: no target tokens (the only target is the first token of the sequence, with nothing before it to "
        "predict it from: give a non-empty prompt; this model adds no BOS token)");
    EXPECT_ERR("{\"tokens\": [50257, 1]}", g2, NULL,
               "t.jsonl:1:13: tokens[0] = 50257 is outside the vocabulary [0, 50257)");
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"c\", \"choices\": [\"b\", \"d\"]}", g2, NULL,
               "t.jsonl:1:31: \"completion\" is not one of the choices");
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"b\", \"choices\": [\"b\", \"d\"], \"answer\": 1}", g2, NULL,
               "t.jsonl:1:69: \"answer\" (choice 1) disagrees with \"completion\" (choice 0)");
    EXPECT_ERR("{\"prompt\": \"a\", \"choices\": [\"b\", 3], \"answer\": 0}", g2, NULL,
               "t.jsonl:1:34: choices[1] must be a string, found number");
    EXPECT_ERR("{\"prompt\": \"a\", \"choices\": [\"b\", \"\"], \"answer\": 0}", g2, NULL,
               "t.jsonl:1:34: choices[1] is empty");
    /* The GPT-2 vocab has no chat template and no chatml tokens. */
    EXPECT_ERR("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", g2, NULL,
               "t.jsonl:1:14: the model has no chat template (tokenizer.chat_template); name one: chatml, llama3 or "
               "FILE.jinja");
    EXPECT_ERR("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", g2, "chatml",
               "t.jsonl:1:14: chat template chatml needs the token <|im_start|>, which the vocabulary lacks");
    /* The sample file: every plain format, a blank line, line numbers. */
    CHECKF(nl_dataset_load(NL_TEST_DATA "/data/sample.jsonl", g2, NULL, &ds) == 0, "%s", nl_last_error());
    CHECK(ds.n == 4);
    if (ds.n == 4) {
        CHECK(ds.ex[0].format == NL_LINE_TEXT && ds.ex[0].line == 1);
        CHECK(ds.ex[0].n_tokens == 10 && ds.ex[0].n_targets == 9);
        CHECK(ds.ex[1].format == NL_LINE_PROMPT && ds.ex[1].line == 3);
        CHECK(ds.ex[1].ids[ds.ex[1].n_tokens - 1] == 50256);
        /* The tokens line holds GPT-2's ids of "The quick brown": the same as the text line's. */
        CHECK(ds.ex[2].format == NL_LINE_TOKENS && ds.ex[2].line == 4);
        CHECK(memcmp(ds.ex[2].ids, ds.ex[0].ids, 3 * sizeof(int32_t)) == 0);
        CHECK(ds.ex[3].n_choices == 2 && ds.ex[3].answer == 0 && ds.ex[3].line == 5);
    }
    nl_dataset_free(&ds);

    /* NUL inside a string is data, not an end. */
    CHECK(load("{\"text\": \"a\\u0000b\"}", g2, NULL, &ds) == 0 && ds.n == 1 && ds.ex[0].n_tokens == 3);
    nl_dataset_free(&ds);
}

/* A ChatML template with a default system turn (SmolLM2's, verbatim; Qwen2.5's form with an
 * escaped \n): inserted when the conversation does not open with a system message. */
static void test_default_system(void) {
    static const char *const tmpls[] = {
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
        "'<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, it\\'s a \\\\test.<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
        "or"
        " message.role == 'assistant' %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
        "'\\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    };
    static const char *const sys[] = {"system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face",
                                      "system\nYou are Qwen, it's a \\test."};
    for (int k = 0; k < 2; k++) {
        nl_tokenizer *t = chat_vocab("nl_test_sys_vocab.gguf", false, tmpls[k]);
        if (!t) return;
        int32_t ims = nl_token_lookup(t, "<|im_start|>"), ime = nl_token_lookup(t, "<|im_end|>");
        seqb e = {0};
        sb_id(&e, ims, 0);
        sb_txt(&e, sys[k], 0);
        sb_id(&e, ime, 0);
        sb_txt(&e, "\n", 0);
        sb_id(&e, ims, 0);
        sb_txt(&e, "user\nHi", 0);
        sb_id(&e, ime, 0);
        sb_txt(&e, "\n", 0);
        sb_id(&e, ims, 0);
        sb_txt(&e, "assistant\n", 0);
        sb_txt(&e, "Yo", 1);
        sb_id(&e, ime, 1);
        sb_txt(&e, "\n", 0);
        nl_dataset ds;
        const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                           "\"content\": \"Yo\"}]}";
        CHECKF(load(line, t, NULL, &ds) == 0, "%s", nl_last_error());
        if (ds.n == 1) CHECKF(seq_is(&ds.ex[0], e.ids, e.tg, e.n), "template %d: default system turn", k);
        nl_dataset_free(&ds);
        /* a conversation with its own system message gets no second one */
        line = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
               "{\"role\": \"assistant\", \"content\": \"Yo\"}]}";
        CHECKF(load(line, t, NULL, &ds) == 0, "%s", nl_last_error());
        if (ds.n == 1) CHECK(ds.ex[0].n_tokens == e.n - (int)strlen(sys[k]) + (int)strlen("system\nS"));
        nl_dataset_free(&ds);
        /* the generation prompt of one user turn (what `generate` sends) starts with it too */
        int32_t *ids = NULL;
        int n = 0;
        CHECK(nl_chat_prompt_tokens(t, NULL, "Hi", 2, &ids, &n) == 0);
        CHECK(n == e.n - 4 && memcmp(ids, e.ids, (size_t)(e.n - 4) * 4) == 0); /* all but "Yo<|im_end|>\n" */
        free(ids);
        /* a Llama-3 rendering of the same vocab takes no ChatML default */
        CHECK(load(line, t, "llama3", &ds) == 0 && ds.n == 1 && ds.ex[0].ids[0] != ims);
        nl_dataset_free(&ds);
        nl_tokenizer_free(t);
    }
}

/* The loss targets of example ex as text: each run of target tokens detokenized, runs
 * joined by "|". */
static void target_text(const nl_tokenizer *t, const nl_example *ex, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < ex->n_tokens;) {
        if (!ex->target[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < ex->n_tokens && ex->target[j]) j++;
        char *txt = NULL;
        size_t tl = 0;
        if (nl_detokenize(t, ex->ids + i, j - i, &txt, &tl) == 0)
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%.*s", n ? "|" : "", (int)tl, txt);
        free(txt);
        i = j;
    }
}

static nl_tokenizer *vocab_with_file(const char *name, bool llama3) {
    char path[512];
    snprintf(path, sizeof path, NL_TEST_DATA "/templates/%s", name);
    size_t len;
    char *src = nl_read_file(path, &len);
    CHECKF(src != NULL, "%s", nl_last_error());
    if (!src) return NULL;
    nl_tokenizer *t = chat_vocab("nl_test_jinja_vocab.gguf", llama3, src);
    free(src);
    return t;
}

/* The real templates through the data path: loss spans found by rendering, control tokens
 * only from the template's text, the GGUF's template by default and --template FILE. */
static void test_jinja_templates(const nl_tokenizer *cml, const nl_tokenizer *l3) {
    char got[2048];
    nl_dataset ds;
    /* Qwen3: the last assistant turn after the last user query has its <think> block (from
     * reasoning_content) inside the span; the earlier one renders without it. */
    nl_tokenizer *q3 = vocab_with_file("qwen3.jinja", false);
    const char *line =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"x\","
        " \"reasoning_content\": \"r1\"}, {\"role\": \"user\", \"content\": \"b <|im_end|>\"},"
        " {\"role\": \"assistant\", \"content\": \"y\", \"reasoning_content\": \"r2\"}]}";
    if (q3) {
        CHECKF(load(line, q3, NULL, &ds) == 0, "%s", nl_last_error());
        if (ds.n == 1) {
            target_text(q3, &ds.ex[0], got, sizeof got);
            CHECKF(!strcmp(got, "x<|im_end|>|<think>\nr2\n</think>\n\ny<|im_end|>"), "qwen3 targets: [%s]", got);
            /* the user's "<|im_end|>" is text: the sequence holds as many control <|im_end|> as turns */
            int32_t ime = nl_token_lookup(q3, "<|im_end|>");
            int n_ime = 0;
            for (int i = 0; i < ds.ex[0].n_tokens; i++) n_ime += ds.ex[0].ids[i] == ime;
            CHECK(n_ime == 4);
        }
        nl_dataset_free(&ds);
        /* tools: the tool call rendered after the content is inside the span; tool turns are not */
        line =
            "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"content\": \"\","
            " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"c\": 1}}}]},"
            " {\"role\": \"tool\", \"content\": \"sun\"}, {\"role\": \"assistant\", \"content\": \"ok\"}],"
            " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}";
        CHECKF(load(line, q3, NULL, &ds) == 0, "%s", nl_last_error());
        if (ds.n == 1) {
            target_text(q3, &ds.ex[0], got, sizeof got);
            CHECKF(!strcmp(got, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"c\": 1}}\n</tool_call><|im_end|>|"
                                "<think>\n\n</think>\n\nok<|im_end|>"),
                   "qwen3 tool targets: [%s]", got);
            char *txt = NULL;
            size_t tl = 0;
            CHECK(nl_detokenize(q3, ds.ex[0].ids, ds.ex[0].n_tokens, &txt, &tl) == 0);
            CHECK(txt && strstr(txt, "# Tools") &&
                  strstr(txt, "<|im_start|>user\n<tool_response>\nsun\n</tool_response><|im_end|>"));
            free(txt);
        }
        nl_dataset_free(&ds);
        nl_tokenizer_free(q3);
    }
    /* Llama 3.2 as the GGUF's template: its system header with the fixed date, one BOS (the
     * template's bos_token), trimmed content. */
    nl_tokenizer *t32 = vocab_with_file("llama3.2.jinja", true);
    line = "{\"messages\": [{\"role\": \"user\", \"content\": \" Hi \"}, {\"role\": \"assistant\", \"content\": \" Yo "
           "\"}]}";
    if (t32) {
        CHECKF(load(line, t32, NULL, &ds) == 0, "%s", nl_last_error());
        if (ds.n == 1) {
            target_text(t32, &ds.ex[0], got, sizeof got);
            CHECKF(!strcmp(got, "Yo<|eot_id|>"), "llama3.2 targets: [%s]", got);
            int n_bos = 0;
            for (int i = 0; i < ds.ex[0].n_tokens; i++) n_bos += ds.ex[0].ids[i] == nl_token_bos(t32);
            CHECK(ds.ex[0].ids[0] == nl_token_bos(t32) && n_bos == 1);
            char *txt = NULL;
            size_t tl = 0;
            CHECK(nl_detokenize(t32, ds.ex[0].ids, ds.ex[0].n_tokens, &txt, &tl) == 0);
            CHECK(txt && strstr(txt, "Today Date: 26 Jul 2024\n\n<|eot_id|>"));
            free(txt);
        }
        nl_dataset_free(&ds);
        nl_tokenizer_free(t32);
    }
    /* --template FILE overrides the GGUF's: Gemma 3's over the ChatML vocab */
    const char *gem = NL_TEST_DATA "/templates/gemma3.jinja";
    CHECKF(load(line, cml, gem, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) {
        target_text(cml, &ds.ex[0], got, sizeof got);
        CHECKF(!strcmp(got, "Yo<end_of_turn>"), "gemma3 targets: [%s]",
               got); /* no control token ends it in this vocab: the text up to the turn's end, less the newline */
    }
    nl_dataset_free(&ds);
    line = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"},"
           " {\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"d\"}]}";
    CHECKF(load(line, cml, gem, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) {
        target_text(cml, &ds.ex[0], got, sizeof got);
        CHECKF(!strcmp(got, "b<end_of_turn>|d<end_of_turn>"), "gemma3 targets: [%s]",
               got); /* the span stops at its turn */
    }
    nl_dataset_free(&ds);
    /* the template's own errors, at the line and the template's line */
    line = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"},"
           " {\"role\": \"assistant\", \"content\": \"c\"}]}";
    nl_dataset_load_buffer(line, strlen(line), "t.jsonl", cml, &(nl_data_opts){.chat_template = gem}, &ds);
    CHECKF(strstr(nl_last_error(), "t.jsonl:1:14: ") &&
               strstr(nl_last_error(), "gemma3.jinja:16: the template raised an error: "
                                       "Conversation roles must alternate"),
           "%s", nl_last_error());
    nl_tokenizer *bad = chat_vocab("nl_test_jinja_vocab.gguf", false,
                                   "{% for m in messages %}\n{{ m.content | wordwrap }}{% endfor %}");
    if (bad) {
        EXPECT_ERR(line, bad, NULL,
                   "t.jsonl:1:14: tokenizer.chat_template:2: filter 'wordwrap' is not supported (--template"
                   " chatml, llama3 or FILE.jinja renders with another template)");
        nl_tokenizer_free(bad);
    }
    EXPECT_ERR(line, cml, "nosuch/t.jinja", "t.jsonl:1:14: nosuch/t.jinja: cannot open: No such file or directory");
    CHECK(nl_chat_template_check("chatml") == 0 && nl_chat_template_check(NULL) == 0 &&
          nl_chat_template_check(gem) == 0);
    CHECK(nl_chat_template_check("alpaca") == -1 && strstr(nl_last_error(), "unknown chat template"));
    /* the same conversation, the GGUF's mkmodel-style template and the built-in: the same */
    line = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \" Hi \"},"
           " {\"role\": \"assistant\", \"content\": \"\\n Yo\\t\"}, {\"role\": \"user\", \"content\": \"?\"},"
           " {\"role\": \"assistant\", \"content\": \"ok\"}]}";
    const nl_tokenizer *vs[] = {cml, l3};
    for (int k = 0; k < 2; k++) {
        nl_dataset a, b;
        CHECK(load(line, vs[k], NULL, &a) == 0 && load(line, vs[k], k ? "llama3" : "chatml", &b) == 0);
        CHECK(a.n == 1 && b.n == 1 && a.ex[0].n_tokens == b.ex[0].n_tokens &&
              !memcmp(a.ex[0].ids, b.ex[0].ids, (size_t)a.ex[0].n_tokens * 4) &&
              !memcmp(a.ex[0].target, b.ex[0].target, (size_t)a.ex[0].n_tokens));
        nl_dataset_free(&a);
        nl_dataset_free(&b);
    }
}

/* The loss spans the linear way (nl_chat_template_tokenize) equal the rule's renderings message by
 * message (nl_chat_template_exact_spans), on every real template over conversations of several
 * assistant turns (reasoning, tool calls, content a template trims, empty content); and 20,000
 * turns take well under a second (quadratic before: 4,000 turns 20.9 s). */

/* seconds to render and tokenize the first n turns (a failure is a check failed) */
static double time_turns(nl_chat_template *ct, const nl_chat_msg *m, int n) {
    int32_t *ids = NULL;
    uint8_t *tg = NULL;
    int n_ids = 0;
    const double t0 = nl_now();
    const int rc = nl_chat_template_tokenize(ct, m, n, NULL, false, &ids, &tg, &n_ids);
    const double d = nl_now() - t0;
    CHECKF(rc == 0, "%s", nl_last_error());
    free(ids);
    free(tg);
    return d;
}

static void test_spans_linear(void) {
    static const char *const files[] = {"qwen3.jinja",    "qwen3.5.jinja",  "smollm2.jinja",
                                        "llama3.1.jinja", "llama3.2.jinja", "gemma3.jinja"};
    static const char *const convs[] = {
        "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \" x \"},"
        " {\"role\": \"user\", \"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"y\\n\"},"
        " {\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"\"}]",
        "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"a\"},"
        " {\"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": \"r1\"}, {\"role\": \"user\", "
        "\"content\": \"b\"},"
        " {\"role\": \"assistant\", \"content\": \"<think>\\nq\\n</think>\\n\\ny\"}, {\"role\": \"user\", \"content\": "
        "\"c\"},"
        " {\"role\": \"assistant\", \"content\": \"z\", \"reasoning_content\": \"r3\"}]",
        "[{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"content\": \"\","
        " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"c\": 1}}}]},"
        " {\"role\": \"tool\", \"content\": \"sun\"}, {\"role\": \"assistant\", \"content\": \"ok\"},"
        " {\"role\": \"user\", \"content\": \"more\"}, {\"role\": \"assistant\", \"content\": \"  done  \"}]",
    };
    int compared = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        bool l3 = !strncmp(files[fi], "llama", 5);
        nl_tokenizer *tok = vocab_with_file(files[fi], l3);
        if (!tok) continue;
        for (size_t ci = 0; ci < sizeof convs / sizeof *convs; ci++) {
            char line[2048];
            snprintf(line, sizeof line, "{\"messages\": %s}", convs[ci]);
            nl_dataset a, b;
            nl_chat_template_exact_spans(true);
            int ra = load(line, tok, NULL, &a);
            nl_chat_template_exact_spans(false);
            int rb = load(line, tok, NULL, &b);
            CHECKF(ra == rb, "%s conv %zu: exact %d, linear %d: %s", files[fi], ci, ra, rb, nl_last_error());
            if (ra == 0 && rb == 0) {
                bool same = a.n == b.n && a.ex[0].n_tokens == b.ex[0].n_tokens &&
                            !memcmp(a.ex[0].ids, b.ex[0].ids, (size_t)a.ex[0].n_tokens * 4) &&
                            !memcmp(a.ex[0].target, b.ex[0].target, (size_t)a.ex[0].n_tokens);
                char ga[2048], gb[2048];
                target_text(tok, &a.ex[0], ga, sizeof ga);
                target_text(tok, &b.ex[0], gb, sizeof gb);
                CHECKF(same, "%s conv %zu: targets exact [%s] linear [%s]", files[fi], ci, ga, gb);
                compared += same;
            }
            if (ra == 0) nl_dataset_free(&a);
            if (rb == 0) nl_dataset_free(&b);
        }
        nl_tokenizer_free(tok);
    }
    /* 18 pairs; those both ways refuse alike (an empty last assistant target, tool calls a template
     * drops: the data reader's rules) are not compared */
    CHECKF(compared >= 10, "%d conversations compared", compared);
    /* 20,000 turns through Qwen3's template */
    nl_tokenizer *q3 = vocab_with_file("qwen3.jinja", false);
    nl_chat_template *ct = NULL;
    if (!q3 || nl_chat_template_open(q3, NULL, &ct)) {
        CHECKF(0, "%s", nl_last_error());
        nl_tokenizer_free(q3);
        return;
    }
    enum { N = 20000 };
    nl_chat_msg *m = calloc(N, sizeof *m);
    char(*txt)[32] = calloc(N, 32);
    for (int i = 0; i < N; i++) {
        m[i].role = i % 2 ? "assistant" : "user";
        snprintf(txt[i], 32, "turn %d says hello", i);
        m[i].content = txt[i];
        m[i].content_len = strlen(txt[i]);
    }
    int32_t *ids = NULL;
    uint8_t *tg = NULL;
    int n = 0;
    double t0 = nl_now();
    int rc = nl_chat_template_tokenize(ct, m, N, NULL, false, &ids, &tg, &n);
    double secs = nl_now() - t0;
    CHECKF(rc == 0, "%s", nl_last_error());
    int spans = 0;
    for (int i = 1; rc == 0 && i < n; i++) spans += tg[i] && !tg[i - 1];
    CHECKF(rc == 0 && spans == N / 2, "%d spans", spans);
    /* linear, not quadratic: a tenth of the turns (best of 3) against the whole, so the check
     * holds under an emulator and on a loaded machine (linear: ~10x; quadratic: ~100x); the
     * issue's absolute bound (under a second) natively, where the CPU is a real one */
    double tenth = 1e30;
    for (int r = 0; rc == 0 && r < 3; r++) {
        const double d = time_turns(ct, m, N / 10);
        if (d < tenth) tenth = d;
    }
    /* the whole again (best of up to 3) while a bound is missed: a load spike on a shared
     * machine (make test runs tests side by side) is no quadratic case */
    for (int r = 1; rc == 0 && r < 3 && (secs >= 30.0 * tenth + 0.05 || (!nl_t_small() && secs >= 1.0)); r++) {
        const double d = time_turns(ct, m, N);
        if (d < secs) secs = d;
    }
    CHECKF(secs < 30.0 * tenth + 0.05, "20,000 turns: %.3f s, 2,000: %.3f s (not linear)", secs, tenth);
    if (!nl_t_small()) CHECKF(secs < 1.0, "20,000 turns: %.3f s (best of 3)", secs);
    free(ids);
    free(tg);
    free(m);
    free(txt);
    nl_chat_template_free(ct);
    nl_tokenizer_free(q3);
}

/* A JSONL text written to a file, for a --template FILE. */
static const char *write_tmp(const char *name, const char *text) {
    static char path[4][128];
    static int k;
    char *p = path[k++ & 3];
    snprintf(p, sizeof path[0], "/tmp/nl_test_dataset_%d_%s", (int)getpid(), name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

/* Data as more tools write it (issue: "data from the common tools without editing"): ShareGPT
 * with role/content turns, Alpaca (both prompts), a JSON array file, skipped keys counted,
 * --columns, tool calls and results (rendered or refused), 1e-400 as a token id. */
static void test_common_tools(const nl_tokenizer *cml) {
    if (!cml) return;
    nl_dataset ds, ref;
    char note[512];
    const char *msgs =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}";
    CHECKF(load(msgs, cml, "chatml", &ref) == 0, "%s", nl_last_error());
    /* ShareGPT with {"role", "content"} turns (and {"from", "value"} ones on the same line) */
    CHECKF(
        load("{\"conversations\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"from\": \"gpt\", \"value\": \"Yo\"}]}",
             cml, "chatml", &ds) == 0,
        "%s", nl_last_error());
    CHECK(ds.n == 1 && ref.n == 1 && same_seq(&ds.ex[0], &ref.ex[0]));
    nl_dataset_free(&ds);
    EXPECT_ERR(
        "{\"conversations\": [{\"role\": \"human\", \"content\": \"Hi\"}, {\"role\": \"bot\", \"content\": \"Yo\"}]}",
        cml, "chatml",
        "t.jsonl:1:65: conversations[1]: unknown role \"bot\" (expected system, user, assistant or tool)");

    /* Alpaca through the chat template: the same as the messages line */
    alpaca = "chat";
    CHECKF(load("{\"instruction\": \"Hi\", \"input\": \"\", \"output\": \"Yo\"}", cml, "chatml", &ds) == 0, "%s",
           nl_last_error());
    CHECK(ds.n == 1 && same_seq(&ds.ex[0], &ref.ex[0]) && ds.n_alpaca == 1 && ds.alpaca_chat == 1);
    CHECK(strstr(nl_dataset_note(&ds, note, sizeof note), "1 Alpaca lines, the prompt built with the chat template"));
    nl_dataset_free(&ds);
    nl_dataset_free(&ref);
    CHECK(load("{\"instruction\": \"Hi\", \"input\": \"there\", \"output\": \"Yo\"}", cml, "chatml", &ds) == 0);
    CHECK(load("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\\n\\nthere\"}, {\"role\": \"assistant\", "
               "\"content\": \"Yo\"}]}",
               cml, "chatml", &ref) == 0);
    CHECK(ds.n == 1 && ref.n == 1 && same_seq(&ds.ex[0], &ref.ex[0]) && ds.ex[0].format == NL_LINE_MESSAGES);
    nl_dataset_free(&ds);
    nl_dataset_free(&ref);
    /* auto: a named template (or the model's own) means the chat template */
    alpaca = NULL;
    CHECK(load("{\"instruction\": \"Hi\", \"output\": \"Yo\"}", cml, "chatml", &ds) == 0 && ds.alpaca_chat == 1);
    nl_dataset_free(&ds);
    /* the Alpaca template: the prompt line of its text */
    alpaca = "alpaca";
    CHECKF(load("{\"instruction\": \"Sum\", \"input\": \"1 2\", \"output\": \"3\"}\n{\"instruction\": \"Hi\", "
                "\"output\": \"Yo\"}",
                cml, NULL, &ds) == 0,
           "%s", nl_last_error());
    CHECK(load("{\"prompt\": \"Below is an instruction that describes a task, paired with an input that provides "
               "further context."
               " Write a response that appropriately completes the request.\\n\\n### Instruction:\\nSum\\n\\n### "
               "Input:\\n1 2\\n\\n"
               "### Response:\\n\", \"completion\": \"3\"}\n"
               "{\"prompt\": \"Below is an instruction that describes a task. Write a response that appropriately "
               "completes the"
               " request.\\n\\n### Instruction:\\nHi\\n\\n### Response:\\n\", \"completion\": \"Yo\"}",
               cml, NULL, &ref) == 0);
    CHECK(ds.n == 2 && ref.n == 2 && same_seq(&ds.ex[0], &ref.ex[0]) && same_seq(&ds.ex[1], &ref.ex[1]));
    CHECK(ds.n == 2 && ds.ex[0].format == NL_LINE_PROMPT && ds.alpaca_chat == 0);
    CHECK(strstr(nl_dataset_note(&ds, note, sizeof note), "2 Alpaca lines, the prompt built with the Alpaca template"));
    nl_dataset_free(&ds);
    nl_dataset_free(&ref);
    /* Alpaca with choices: the prompt is the context */
    CHECKF(load("{\"instruction\": \"2+2?\", \"choices\": [\"3\", \"4\"], \"answer\": 1}", cml, NULL, &ds) == 0, "%s",
           nl_last_error());
    CHECK(ds.n == 1 && ds.ex[0].n_choices == 2 && ds.ex[0].answer == 1);
    nl_dataset_free(&ds);
    EXPECT_ERR("{\"instruction\": \"a\"}", cml, NULL, "t.jsonl:1:1: an \"instruction\" line needs \"output\"");
    EXPECT_ERR("{\"instruction\": \"a\", \"output\": \"\"}", cml, NULL,
               "t.jsonl:1:32: \"output\" is empty (nothing to learn)");
    EXPECT_ERR("{\"instruction\": \"a\", \"input\": 3, \"output\": \"b\"}", cml, NULL,
               "t.jsonl:1:31: \"input\" must be a string, found number");
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"b\", \"output\": \"c\"}", cml, NULL,
               "t.jsonl:1:46: \"output\" belongs with \"instruction\" (Alpaca), not \"prompt\"");
    EXPECT_ERR("{\"instruction\": \"a\", \"output\": \"b\", \"messages\": []}", cml, NULL,
               "t.jsonl:1:37: \"messages\" cannot be combined with \"instruction\" on one line");
    alpaca = "both";
    EXPECT_ERR("{\"instruction\": \"a\", \"output\": \"b\"}", cml, NULL,
               "--alpaca-prompt both: expected auto, alpaca or chat");
    alpaca = NULL;

    /* a JSON array file (datasets' to_json(lines=False)); an element's line is where it starts */
    CHECKF(load("\xEF\xBB\xBF  [\n  {\"tokens\": [1, 2]},\n  {\"tokens\": [3,\n 4, 5]}, {\"tokens\": [6, 7]}\n]\n",
                NULL, NULL, &ds) == 0,
           "%s", nl_last_error());
    CHECK(ds.n == 3 && ds.json_array == 1);
    if (ds.n == 3) CHECK(ds.ex[0].line == 2 && ds.ex[1].line == 3 && ds.ex[2].line == 4 && ds.ex[1].n_tokens == 3);
    CHECK(strstr(nl_dataset_note(&ds, note, sizeof note), "read as a JSON array of examples"));
    nl_dataset_free(&ds);
    EXPECT_ERR("[\n{\"tokens\": [1, 2]},\n  {\"tokens\": [1, 200]}]", NULL, NULL,
               "t.jsonl:3:18: tokens[1] = 200 is outside the vocabulary [0, 100)");
    EXPECT_ERR("[\n{\"tokens\": [1, 2]},\n 7]", NULL, NULL, "t.jsonl:3:2: expected a JSON object, found number");
    EXPECT_ERR("[{\"tokens\": [1, 2]},\n]", NULL, NULL, "t.jsonl:2:1: trailing comma before ']'");
    EXPECT_ERR("[]", NULL, NULL, "t.jsonl: no examples (the file is empty or has only blank lines)");

    /* keys no format reads: skipped and counted by default, refused with strict_keys */
    strict_keys = 0;
    CHECKF(load("{\"tokens\": [1, 2], \"id\": 1}\n{\"id\": 2, \"src\": \"a\", \"tokens\": [1, 2]}\n", NULL, NULL,
                &ds) == 0,
           "%s", nl_last_error());
    CHECK(ds.n == 2 && ds.n_skipped_keys == 3 && !strcmp(ds.skipped_key, "id") && ds.skipped_line == 1);
    CHECKF(strstr(nl_dataset_note(&ds, note, sizeof note), "3 keys no format reads skipped (the first \"id\" on line 1;"
                                                           " --strict-keys refuses them)"),
           "%s", note);
    nl_dataset_free(&ds);
    CHECK(load("{\"tokens\": [1, 2]}", NULL, NULL, &ds) == 0 && ds.n_skipped_keys == 0);
    CHECK(nl_dataset_note(&ds, note, sizeof note)[0] == 0);
    nl_dataset_free(&ds);

    /* --columns: other names read as the line's keys */
    columns = "prompt=question,completion=answer";
    CHECKF(load("{\"question\": \"Hi\", \"answer\": \"Yo\", \"id\": 3}", cml, NULL, &ds) == 0, "%s", nl_last_error());
    columns = NULL;
    CHECK(load("{\"prompt\": \"Hi\", \"completion\": \"Yo\"}", cml, NULL, &ref) == 0);
    CHECK(ds.n == 1 && ref.n == 1 && same_seq(&ds.ex[0], &ref.ex[0]) && ds.n_skipped_keys == 1);
    nl_dataset_free(&ds);
    nl_dataset_free(&ref);
    columns = "messages=dialog";
    CHECKF(
        load(
            "{\"dialog\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}",
            cml, "chatml", &ds) == 0,
        "%s", nl_last_error());
    CHECK(ds.n == 1 && ds.ex[0].format == NL_LINE_MESSAGES);
    nl_dataset_free(&ds);
    columns = "prompt=question,completion=answer";
    EXPECT_ERR("{\"question\": \"a\", \"prompt\": \"b\", \"answer\": \"c\"}", cml, NULL,
               "t.jsonl:1:29: the line has both \"prompt\" and \"question\", which --columns prompt=question reads as "
               "\"prompt\"");
    EXPECT_ERR("{\"question\": 1, \"answer\": \"c\"}", cml, NULL,
               "t.jsonl:1:14: \"prompt\" must be a string, found number");
    columns = "prompt";
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"b\"}", cml, NULL,
               "--columns prompt: expected KEY=COLUMN pairs separated by commas (prompt=question,completion=answer)");
    columns = "question=prompt";
    EXPECT_ERR(
        "{\"prompt\": \"a\", \"completion\": \"b\"}", cml, NULL,
        "--columns question=prompt: \"question\" is no key of a line (prompt, completion, messages, conversations,"
        " instruction, input, output, text, tokens, loss_mask, choices, answer, tools)");
    columns = "prompt=a,prompt=b";
    EXPECT_ERR("{\"prompt\": \"a\", \"completion\": \"b\"}", cml, NULL,
               "--columns prompt=a,prompt=b: \"prompt\" or \"b\" is named twice");
    columns = NULL;
    strict_keys = 1;

    /* tool calls: a template that leaves them out (the built-in chatml) is refused by name; one
     * that renders them trains on the call; an assistant turn with nothing is refused */
    const char *call =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"tool_calls\":"
        " [{\"type\": \"function\", \"function\": {\"name\": \"get_w\", \"arguments\": {\"c\": 1}}}]},"
        " {\"role\": \"tool\", \"content\": \"sun\"}, {\"role\": \"assistant\", \"content\": \"ok\"}]}";
    EXPECT_ERR(call, cml, "chatml",
               "t.jsonl:1:50: messages[1]: the chat template (chatml) does not render \"tool_calls\": the call would "
               "be left out"
               " of what is trained (use a template that renders tool calls: the model's own tokenizer.chat_template or"
               " --template FILE.jinja)");
    const char *with_calls = write_tmp(
        "calls.jinja", "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}{%- if m.tool_calls -%}{%- "
                       "for c in m.tool_calls -%}"
                       "<call>{{ c.function.name }}</call>{%- endfor -%}{%- endif -%}<|im_end|>\n{% endfor -%}"
                       "{%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}");
    CHECKF(load(call, cml, with_calls, &ds) == 0, "%s", nl_last_error());
    if (ds.n == 1) {
        char got[512];
        target_text(cml, &ds.ex[0], got, sizeof got);
        CHECKF(!strcmp(got, "<call>get_w</call><|im_end|>|ok<|im_end|>"), "targets: [%s]", got);
    }
    nl_dataset_free(&ds);
    const char *drops_tool =
        write_tmp("notool.jinja",
                  "{%- for m in messages -%}{%- if m.role != 'tool' -%}<|im_start|>{{ m.role }}\n{{ m.content }}{%- if "
                  "m.tool_calls -%}"
                  "<call>{{ m.tool_calls[0].function.name }}</call>{%- endif -%}<|im_end|>\n{%- endif -%}{% endfor -%}"
                  "{%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}");
    char want[600];
    snprintf(want, sizeof want,
             "t.jsonl:1:165: messages[2]: the chat template (%s) leaves the \"tool\" message's content out: the"
             " result would not be in what is trained (use a template that renders tool results: the model's own"
             " tokenizer.chat_template or --template FILE.jinja)",
             drops_tool);
    EXPECT_ERR(call, cml, drops_tool, want);
    EXPECT_ERR(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\", \"content\": \"\"}]}",
        cml, "chatml",
        "t.jsonl:1:50: messages[1]: the assistant message is empty: its target would be only the end of the"
        " turn (nothing to learn)");
    EXPECT_ERR("{\"messages\": [{\"role\": \"user\", \"content\": \"w?\", \"tool_calls\": [{\"function\": {\"name\": "
               "\"f\"}}]},"
               " {\"role\": \"assistant\", \"content\": \"a\"}]}",
               cml, "chatml",
               "t.jsonl:1:63: messages[0]: \"tool_calls\" belong to an assistant message, not a user one");
    EXPECT_ERR("{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": \"assistant\"}]}", cml, "chatml",
               "t.jsonl:1:50: messages[1] needs \"content\"");
    remove(with_calls);
    remove(drops_tool);
}

int main(void) {
    test_tokens_lines();
    test_errors();
    test_file();
    test_data_dir();
    test_split();
    test_pack();
    test_order_and_batches();
    nl_tokenizer *cml = chat_vocab("nl_test_chatml_vocab.gguf", false, NULL);
    nl_tokenizer *l3 = chat_vocab("nl_test_llama3_vocab.gguf", true, NULL);
    test_chat(cml, l3);
    test_chat_shapes(cml);
    test_chat_shapes(l3);
    test_default_system();
    test_jinja_templates(cml, l3);
    test_spans_linear();
    test_common_tools(cml);
    nl_tokenizer_free(cml);
    nl_tokenizer_free(l3);
    nl_tokenizer *g2 = gpt2_vocab();
    test_plain_text(g2);
    nl_tokenizer_free(g2);
    return nl_t_done();
}

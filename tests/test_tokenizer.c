/* data/tokenizer tests: every llama.cpp vocab test vector whose vocab ships here, pre-tokenizer
 * splits derived by hand from the regexes (gpt-2, llama3, qwen2, qwen35, deepseek, falcon,
 * starcoder), the BPE merge loop on a tiny hand vocab, a hand-built SentencePiece vocab written
 * through the GGUF writer, special tokens, invalid UTF-8, the CLI and a 100 KB timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "model/gguf.h"
#include "test.h"
#include "util/util.h"

#define TOKDIR NL_TEST_DATA "/tokenizer/"
static const char *SEP = "\n__ggml_vocab_test__\n";

/* ---- helpers ---- */
static int tok(const nl_tokenizer *t, const char *s, bool add_special, bool parse_special, int32_t **ids) {
    int n = -1;
    if (nl_tokenize(t, s, strlen(s), add_special, parse_special, ids, &n) != 0) {
        fprintf(stderr, "tokenize failed: %s\n", nl_last_error());
        *ids = NULL;
        return -1;
    }
    return n;
}

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
}

static void print_ids(const char *what, const int32_t *v, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, "\n");
}

/* split `text` under `pre` and compare with the NULL-terminated list of expected pieces */
static void check_split(const char *pre, const char *text, const char *const *want) {
    size_t *lens = NULL;
    int n = 0;
    int rc = nl_pretokenize(pre, text, strlen(text), &lens, &n);
    CHECKF(rc == 0, "%s: %s", pre, nl_last_error());
    if (rc) return;
    int nw = 0;
    while (want[nw]) nw++;
    int ok = n == nw;
    size_t off = 0;
    for (int i = 0; ok && i < n; i++) {
        ok = strlen(want[i]) == lens[i] && memcmp(text + off, want[i], lens[i]) == 0;
        off += lens[i];
    }
    CHECKF(ok, "split %s of \"%s\"", pre, text);
    if (!ok) {
        off = 0;
        fprintf(stderr, "  got:");
        for (int i = 0; i < n; i++) {
            fprintf(stderr, " [%.*s]", (int)lens[i], text + off);
            off += lens[i];
        }
        fprintf(stderr, "\n  want:");
        for (int i = 0; i < nw; i++) fprintf(stderr, " [%s]", want[i]);
        fprintf(stderr, "\n");
    }
    free(lens);
}
#define SPLIT(pre, text, ...) check_split(pre, text, (const char *const[]){__VA_ARGS__, NULL})

static nl_tokenizer *open_vocab(const char *name, nl_gguf **gout) {
    char path[512];
    snprintf(path, sizeof path, TOKDIR "ggml-vocab-%s.gguf", name);
    nl_gguf *g = nl_gguf_open(path);
    CHECKF(g != NULL, "open %s: %s", path, nl_last_error());
    if (!g) return NULL;
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    CHECKF(t != NULL, "tokenizer %s: %s", path, nl_last_error());
    if (gout) *gout = g;
    else nl_gguf_close(g);
    return t;
}

/* ---- 1. llama.cpp vectors ---- */
/* llama.cpp's ids for every case of inp_path (cases split on SEP) against out_path (one line
 * of ids per case), and every case's round trip. t is freed. */
static void check_vectors(nl_tokenizer *t, const char *name, const char *inp_path, const char *out_path) {
    size_t ilen, olen;
    char *inp = nl_read_file(inp_path, &ilen);
    char *out = nl_read_file(out_path, &olen);
    CHECKF(inp && out, "%s: %s", name, nl_last_error());
    if (!inp || !out) {
        free(inp);
        free(out);
        nl_tokenizer_free(t);
        return;
    }
    int n_cases = 0, n_ok = 0, n_rt = 0;
    char *ip = inp, *op = out;
    for (;;) {
        char *sep = strstr(ip, SEP);
        if (!sep) break;
        char *eol = strchr(op, '\n');
        CHECKF(eol != NULL, "%s: .out has fewer lines than .inp cases", name);
        if (!eol) break;
        *eol = 0;
        int32_t want[1024];
        int nw = 0;
        for (char *q = op; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            if (nw < 1024) want[nw++] = (int32_t)v;
            q = end;
        }
        int32_t *ids = NULL;
        int n = -1;
        size_t len = (size_t)(sep - ip);
        int rc = nl_tokenize(t, ip, len, false, false, &ids, &n);
        n_cases++;
        if (rc == 0 && ids_eq(ids, n, want, nw)) n_ok++;
        else {
            fprintf(stderr, "%s case %d \"%.*s\": mismatch (%s)\n", name, n_cases, (int)len, ip,
                    rc ? nl_last_error() : "");
            print_ids("want", want, nw);
            if (rc == 0) print_ids("got ", ids, n);
        }
        if (rc == 0) { /* round trip */
            char *back = NULL;
            size_t blen = 0;
            if (nl_detokenize(t, ids, n, &back, &blen) == 0 && blen == len && memcmp(back, ip, len) == 0) n_rt++;
            else fprintf(stderr, "%s case %d: round trip gave \"%.*s\"\n", name, n_cases, (int)blen, back ? back : "");
            free(back);
        }
        free(ids);
        ip = sep + strlen(SEP);
        op = eol + 1;
    }
    CHECKF(n_cases >= 46, "%s: only %d cases", name, n_cases);
    CHECKF(n_ok == n_cases, "%s: %d of %d vectors match", name, n_ok, n_cases);
    CHECKF(n_rt == n_cases, "%s: %d of %d round trips", name, n_rt, n_cases);
    printf("vectors %-15s %d/%d match, %d round trips\n", name, n_ok, n_cases, n_rt);
    free(inp);
    free(out);
    nl_tokenizer_free(t);
}

static void test_vectors(const char *name) {
    nl_tokenizer *t = open_vocab(name, NULL);
    if (!t) return;
    char ip[512], op[512];
    snprintf(ip, sizeof ip, TOKDIR "ggml-vocab-%s.gguf.inp", name);
    snprintf(op, sizeof op, TOKDIR "ggml-vocab-%s.gguf.out", name);
    check_vectors(t, name, ip, op);
}

/* The real SmolLM2-135M-Instruct vocabulary (49152 tokens, pre-tokenizer smollm): llama.cpp's
 * ids on the 46 standard cases (tests/data/tokenizer/smollm2-135m.out, written by
 * llama-cpp-python's tokenize with add_bos=False, special=False), and the ChatML special
 * tokens as the model's template uses them. Skipped when the model is not in the cache. */
static void test_real_vocab(void) {
    char path[1024];
    if (!nl_t_real_model(path, sizeof path, "real-vocab tokenizer checks")) return;
    nl_gguf *g = nl_gguf_open(path);
    CHECKF(g != NULL, "%s", nl_last_error());
    if (!g) return;
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    CHECKF(t != NULL, "%s", nl_last_error());
    const char *pre = NULL;
    CHECK(nl_gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0 && pre && !strcmp(pre, "smollm"));
    nl_gguf_close(g);
    if (!t) return;
    /* the special tokens: <|endoftext|> 0, <|im_start|> 1 (BOS), <|im_end|> 2 (EOS), no BOS added */
    CHECK(nl_token_lookup(t, "<|endoftext|>") == 0 && nl_token_lookup(t, "<|im_start|>") == 1 &&
          nl_token_lookup(t, "<|im_end|>") == 2);
    CHECK(nl_token_bos(t) == 1 && nl_token_eos(t) == 2 && !nl_tokenizer_add_bos(t));
    int32_t *ids = NULL;
    const int32_t user = nl_token_lookup(t, "user"), nl = nl_token_lookup(t, "\xC4\x8A"); /* "\n" mapped */
    int n = tok(t, "<|im_start|>user\nHi<|im_end|>\n", false, true, &ids);
    CHECK(n == 6 && ids[0] == 1 && ids[1] == user && ids[2] == nl && ids[4] == 2 && ids[5] == nl);
    free(ids);
    n = tok(t, "<|im_start|>", false, false, &ids); /* as text: never the control token */
    CHECK(n > 1 && ids[0] != 1);
    free(ids);
    nl_chat_tmpl tm;
    CHECK(nl_chat_template_pick(NULL, nl_tokenizer_chat_template(t), &tm) == 0 && tm == NL_TMPL_CHATML);
    check_vectors(t, "smollm2-135m", TOKDIR "ggml-vocab-gpt-2.gguf.inp", TOKDIR "smollm2-135m.out");
}

/* ---- 2. pre-tokenizer splits, derived by hand from the regexes ---- */
static void test_splits(void) {
    /* gpt-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
    SPLIT("gpt-2", "Hello world!!", "Hello", " world", "!!");
    SPLIT("gpt-2", "I'M don't", "I", "'", "M", " don", "'t"); /* case-sensitive contractions */
    SPLIT("gpt-2", "a   b", "a", "  ", " b");                 /* \s+(?!\S) leaves one space */
    SPLIT("gpt-2", "x 1234567 ", "x", " 1234567", " ");       /* digits unbounded, trailing ws */
    SPLIT("gpt-2", "\tx", "\t", "x");                         /* lone ws before non-space */
    SPLIT("gpt-2", "na\xC3\xAFve caf\xC3\xA9", "na\xC3\xAFve", " caf\xC3\xA9");
    SPLIT("mpt", "a,b", "a", ",", "b");
    /* llama3: (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    SPLIT("llama3", "Hello world", "Hello", " world");
    SPLIT("llama3", "1234567", "123", "456", "7");
    SPLIT("llama3", "I'M don'T", "I", "'M", " don", "'T"); /* case-insensitive */
    SPLIT("llama3", "  x", " ", " x");
    SPLIT("llama3", "a  \n\n  b", "a", "  \n\n", " ", " b"); /* \s*[\r\n]+ ends at the last \n */
    SPLIT("llama3", "x   ", "x", "   ");
    SPLIT("llama3", "a.\r\nb", "a", ".\r\n", "b"); /* punctuation takes [\r\n]* */
    SPLIT("llama3", "abc123def", "abc", "123", "def");
    SPLIT("llama3", "!abc ?!x", "!abc", " ?!", "x"); /* one non-letter may lead a word */
    SPLIT("llama3", "\tHello\nWorld", "\tHello", "\n", "World");
    SPLIT("llama-bpe", "12345", "123", "45");
    SPLIT("llama-v3", "12345", "123", "45");
    /* qwen2: single digits */
    SPLIT("qwen2", "1234567", "1", "2", "3", "4", "5", "6", "7");
    SPLIT("qwen2", "x 12", "x", " ", "1", "2");
    /* qwen35: [\p{L}\p{M}]+ keeps combining marks in the word; qwen2 splits them off */
    SPLIT("qwen35", "e\xCC\x81x y", "e\xCC\x81x", " y");
    SPLIT("qwen2", "e\xCC\x81x y", "e", "\xCC\x81x", " y");
    /* qwen2: marks are neither letters nor the one allowed prefix before letters when a second mark
     * follows, so they fall into the punctuation run */
    SPLIT("qwen35", "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80", /* Devanagari, 3 marks */
          "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80");
    SPLIT("qwen2", "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80", "\xE0\xA4\xB9",
          "\xE0\xA4\xBF\xE0\xA4\x82", "\xE0\xA4\xA6", "\xE0\xA5\x80");
    SPLIT("qwen35", "12", "1", "2");
    /* deepseek-coder: [\r\n] | \s?\p{L}+ | \s?\p{P}+ | CJK+ | \p{N} */
    SPLIT("deepseek-coder", "x12 ab.\n", "x", "1", "2", " ab", ".", "\n");
    /* deepseek-llm: [\r\n] | \s?[cased letters]+ | \s?[!-/:-~...]+ | \s+$ | CJK+ | \p{N}+ */
    SPLIT("deepseek-llm",
          "Hello \xE4\xB8\x96\xE7\x95\x8C"
          "123",
          "Hello", " ", "\xE4\xB8\x96\xE7\x95\x8C", "123");
    SPLIT("deepseek-llm", "ab  ", "ab", "  ");
}

/* falcon/starcoder need the stage-by-stage reasoning written out */
static void test_splits2(void) {
    /* gpt-2 stage gives " 1234567"; [0-9]{3} then cuts " ", "123", "456", "7" */
    SPLIT("falcon", "x 1234567", "x", " ", "123", "456", "7");
    /* the punctuation stage isolates "+=" before gpt-2 could attach the space to it */
    SPLIT("falcon", "a +=b", "a", " ", "+=", "b");
    /* starcoder: \p{N} first, so digits never join a space or each other */
    SPLIT("starcoder", "a 12b", "a", " ", "1", "2", "b");
    SPLIT("refact", "v2", "v", "2");
    /* smollm (SmolLM2): the starcoder stages. Digits stand alone and never take the space;
     * contractions are case-sensitive (GPT-2's regex); \s+(?!\S) leaves one space for the word */
    SPLIT("smollm", "Hello world! 123", "Hello", " world", "!", " ", "1", "2", "3");
    SPLIT("smollm", "I'm DON'T", "I", "'m", " DON", "'", "T");
    SPLIT("smollm", "  multiple   spaces", " ", " multiple", "  ", " spaces");
    SPLIT("smollm", "x2y 3.5%", "x", "2", "y", " ", "3", ".", "5", "%");
    SPLIT("smollm", "<|im_start|>user\n", "<|", "im", "_", "start", "|>", "user", "\n");
    SPLIT("smollm", "caf\xC3\xA9 \xD9\xA3!", "caf\xC3\xA9", " ", "\xD9\xA3", "!"); /* U+0663 is \p{N} */
}

/* ---- 3. BPE merge loop on a tiny hand vocab ---- */
static nl_tokenizer *tiny_bpe(const char *pre, const char *const *merges, int n_merges) {
    static const char *const toks[] = {"a",
                                       "b",
                                       "c",
                                       "ab",
                                       "bc",
                                       "abc",
                                       "aa",
                                       "\xC4\xA0",
                                       "\xC4\xA0"
                                       "a"};
    nl_tokenizer_spec sp = {0};
    sp.model = "gpt2";
    sp.pre = pre;
    sp.n_vocab = 9;
    sp.tokens = toks;
    sp.merges = merges;
    sp.n_merges = n_merges;
    sp.bos = sp.eos = sp.eot = sp.unk = NL_TOK_ID_DEFAULT;
    sp.add_bos = 0; /* llama3 would default to a BOS this vocab does not have */
    sp.add_eos = sp.add_space_prefix = -1;
    nl_tokenizer *t = nl_tokenizer_from_spec(&sp);
    CHECKF(t != NULL, "tiny bpe: %s", nl_last_error());
    return t;
}

#define EXPECT_IDS(t, text, as, ps, ...)                                                                               \
    do {                                                                                                               \
        const int32_t want_[] = {__VA_ARGS__};                                                                         \
        int32_t *got_ = NULL;                                                                                          \
        int ng_ = tok(t, text, as, ps, &got_);                                                                         \
        int nw_ = (int)(sizeof(want_) / sizeof(want_[0]));                                                             \
        CHECKF(ids_eq(got_, ng_, want_, nw_), "ids of \"%s\"", text);                                                  \
        if (!ids_eq(got_, ng_, want_, nw_)) {                                                                          \
            print_ids("want", want_, nw_);                                                                             \
            print_ids("got ", got_, ng_);                                                                              \
        }                                                                                                              \
        free(got_);                                                                                                    \
    } while (0)

static void test_bpe_loop(void) {
    /* ids: a0 b1 c2 ab3 bc4 abc5 aa6 Ġ7 Ġa8 */
    const char *m1[] = {"b c", "a b", "ab c"};
    nl_tokenizer *t = tiny_bpe("gpt-2", m1, 3);
    if (!t) return;
    EXPECT_IDS(t, "abc", false, false, 0, 4); /* rank 0 "b c" first; "a bc" is no merge */
    nl_tokenizer_free(t);
    const char *m2[] = {"a b", "b c", "ab c", "a a", "\xC4\xA0 a"};
    t = tiny_bpe("gpt-2", m2, 5);
    if (!t) return;
    EXPECT_IDS(t, "abc", false, false, 5);    /* a b -> ab, then ab c -> abc */
    EXPECT_IDS(t, "aaa", false, false, 6, 0); /* equal ranks: leftmost pair first */
    EXPECT_IDS(t, "a a", false, false, 0, 8); /* ' ' maps to U+0120, merged with 'a' */
    EXPECT_IDS(t, "abd", false, false, 3);    /* 'd' has no token: its byte is dropped */
    nl_tokenizer_free(t);
    /* ignore_merges (llama3): a whole pre-token that is a token is emitted as is */
    const char *m3[] = {"a b"};
    t = tiny_bpe("gpt-2", m3, 1);
    if (t) {
        EXPECT_IDS(t, "abc", false, false, 3, 2);
        nl_tokenizer_free(t);
    }
    t = tiny_bpe("llama3", m3, 1);
    if (t) {
        EXPECT_IDS(t, "abc", false, false, 5);
        EXPECT_IDS(t, "abcab", false, false, 3, 2, 3); /* not a token: merges as usual */
        CHECK(nl_token_bos(t) == -1);                  /* the gpt2 default 11 is out of range for 9 tokens */
        nl_tokenizer_free(t);
    }
}

/* ---- 4. GPT-2 vocab: special tokens, llama3/qwen2 splitting through the full BPE path ---- */
static void test_gpt2_specials(void) {
    nl_gguf *g = NULL;
    nl_tokenizer *t = open_vocab("gpt-2", &g);
    if (!t) return;
    CHECK(nl_tokenizer_n_vocab(t) == 50257);
    CHECK(nl_token_bos(t) == 50256 && nl_token_eos(t) == 50256 && nl_token_eot(t) == 50256);
    CHECK(nl_token_is_control(t, 50256) && !nl_token_is_control(t, 15496));
    CHECK(!nl_tokenizer_add_bos(t));
    CHECK(nl_token_lookup(t, "<|endoftext|>") == 50256);
    CHECK(nl_token_lookup(t, "Hello") == 15496);
    CHECK(nl_token_lookup(t, "no such token here") == -1);
    size_t pl = 0;
    const char *p = nl_token_piece(t, nl_token_lookup(t, "\xC4\xA0world"), &pl);
    CHECK(p && pl == 6 && !memcmp(p, " world", 6));
    p = nl_token_piece(t, nl_token_lookup(t, "\xC4\x8A"), &pl); /* 'Ċ' = byte 0x0A */
    CHECK(p && pl == 1 && p[0] == '\n');
    CHECK(nl_token_piece(t, 50257, &pl) == NULL && nl_token_piece(t, -1, &pl) == NULL);

    /* parse_special: the control text is one id; without it, plain text */
    int32_t *a = NULL, *b = NULL;
    int na = tok(t, "Hi<|endoftext|>there", false, true, &a);
    int nb = tok(t, "Hi<|endoftext|>there", false, false, &b);
    CHECK(na == 3 && a && a[1] == 50256);
    CHECK(nb > 3 && b);
    for (int i = 0; b && i < nb; i++) CHECK(b[i] != 50256);
    char *back = NULL;
    size_t bl = 0;
    CHECK(a && nl_detokenize(t, a, na, &back, &bl) == 0 && bl == 20 && !memcmp(back, "Hi<|endoftext|>there", 20));
    free(back);
    free(a);
    free(b);
    /* add_special on a gpt2 vocab without add_bos: nothing added */
    EXPECT_IDS(t, "Hello", true, true, 15496);

    /* llama3 / qwen2 splitting on the gpt-2 vocab: each piece goes through BPE on its own */
    const nl_gguf_kv *tk = nl_gguf_get(g, "tokenizer.ggml.tokens");
    const nl_gguf_kv *mg = nl_gguf_get(g, "tokenizer.ggml.merges");
    CHECK(tk && mg);
    if (tk && mg) {
        nl_tokenizer_spec sp = {0};
        sp.model = "gpt2";
        sp.n_vocab = (int32_t)tk->arr_n;
        sp.tokens = (const char *const *)tk->arr_str;
        sp.merges = (const char *const *)mg->arr_str;
        sp.n_merges = (int32_t)mg->arr_n;
        sp.bos = sp.eos = sp.eot = sp.unk = 50256;
        sp.add_bos = sp.add_eos = sp.add_space_prefix = -1;
        sp.pre = "llama3";
        nl_tokenizer *l3 = nl_tokenizer_from_spec(&sp);
        sp.pre = "qwen2";
        nl_tokenizer *q2 = nl_tokenizer_from_spec(&sp);
        CHECK(l3 && q2);
        if (l3 && q2) {
            /* "1234567": llama3 pieces 123|456|7, qwen2 single digits, each piece BPE'd alone */
            int32_t *x = NULL, *y = NULL, *z = NULL;
            int nx = tok(l3, "1234567", false, false, &x);
            int n123 = tok(t, "123", false, false, &y);
            int n456 = tok(t, "456", false, false, &z);
            CHECK(nx == n123 + n456 + 1 && x && y && z && !memcmp(x, y, (size_t)n123 * 4) &&
                  !memcmp(x + n123, z, (size_t)n456 * 4) && x[nx - 1] == nl_token_lookup(t, "7"));
            free(x);
            free(y);
            free(z);
            int nq = tok(q2, "1234567", false, false, &x);
            CHECK(nq == 7 && x);
            for (int i = 0; x && i < 7; i++) {
                char d[2] = {(char)('1' + i), 0};
                CHECK(x[i] == nl_token_lookup(t, d));
            }
            free(x);
            /* add_special with llama3 pre: BOS by default */
            EXPECT_IDS(l3, "Hello", true, false, 50256, 15496);
            /* the llama-bpe / qwen2 / qwen35 inputs: round trip through these tokenizers */
            const char *names[] = {"llama-bpe", "qwen2", "qwen35"};
            for (int k = 0; k < 3; k++) {
                char path[512];
                size_t il;
                snprintf(path, sizeof path, TOKDIR "ggml-vocab-%s.gguf.inp", names[k]);
                char *inp = nl_read_file(path, &il);
                CHECKF(inp != NULL, "%s", nl_last_error());
                int cases = 0, ok = 0;
                for (char *ip = inp; ip;) {
                    char *sep = strstr(ip, SEP);
                    if (!sep) break;
                    size_t len = (size_t)(sep - ip);
                    int32_t *ids = NULL;
                    int n = 0;
                    char *bk = NULL;
                    size_t bkl = 0;
                    cases++;
                    if (nl_tokenize(k == 0 ? l3 : q2, ip, len, false, false, &ids, &n) == 0 &&
                        nl_detokenize(t, ids, n, &bk, &bkl) == 0 && bkl == len && !memcmp(bk, ip, len))
                        ok++;
                    free(ids);
                    free(bk);
                    ip = sep + strlen(SEP);
                }
                CHECKF(cases >= 46 && ok == cases, "%s inputs: %d/%d round trips", names[k], ok, cases);
                free(inp);
            }
        }
        nl_tokenizer_free(l3);
        nl_tokenizer_free(q2);
    }
    nl_tokenizer_free(t);
    nl_gguf_close(g);
}

/* ---- 5. other vocabs: add_special, user-defined tokens ---- */
static void test_vocab_specials(void) {
    nl_tokenizer *t = open_vocab("deepseek-coder", NULL);
    if (t) {
        CHECK(nl_token_bos(t) == 32013 && nl_token_eos(t) == 32014 && nl_tokenizer_add_bos(t));
        int32_t *a = NULL, *b = NULL;
        int na = tok(t, "Hello", true, false, &a);
        int nb = tok(t, "Hello", false, false, &b);
        CHECK(na == nb + 1 && a && b && a[0] == 32013 && !memcmp(a + 1, b, (size_t)nb * 4));
        free(a);
        free(b);
        /* CONTROL text needs parse_special; USER_DEFINED (<|EOT|>) is matched regardless */
        na = tok(t,
                 "<\xEF\xBD\x9C"
                 "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                 false, true, &a);
        CHECK(na == 1 && a && a[0] == 32014);
        free(a);
        na = tok(t, "x<|EOT|>", false, false, &a);
        CHECK(na == 2 && a && a[1] == 32021);
        free(a);
        CHECK(nl_token_eot(t) == 32014); /* no eot key, no <|im_end|>/<|eot_id|>: eos */
        nl_tokenizer_free(t);
    }
    t = open_vocab("mpt", NULL);
    if (t) {
        /* user-defined runs of spaces, longest first: 30 spaces = 24 + 6 (ids 50254, 50272) */
        char s[40] = "a";
        memset(s + 1, ' ', 30);
        strcpy(s + 31, "b");
        int32_t *a = NULL;
        int na = tok(t, s, false, false, &a);
        CHECK(na == 4 && a && a[1] == 50254 && a[2] == 50272);
        free(a);
        nl_tokenizer_free(t);
    }
}

/* ---- 6. invalid UTF-8 ---- */
static void test_invalid_utf8(void) {
    nl_tokenizer *t = open_vocab("gpt-2", NULL);
    if (!t) return;
    struct {
        const char *s;
        size_t len, off;
    } bad[] = {
        {"ab\xC3(", 4, 2},             /* lead byte without continuation */
        {"\xC0\xAF", 2, 0},            /* overlong '/' */
        {"ok\xED\xA0\x80", 5, 2},      /* UTF-16 surrogate */
        {"xyz\xF4\x90\x80\x80", 7, 3}, /* > U+10FFFF */
        {"end\xE2\x82", 5, 3},         /* truncated */
        {"\x80", 1, 0},                /* stray continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        int n = 7;
        int rc = nl_tokenize(t, bad[i].s, bad[i].len, false, false, &ids, &n);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].off);
        CHECKF(rc == -1 && ids == NULL && strstr(nl_last_error(), want), "case %zu: %s", i, nl_last_error());
        CHECK(nl_utf8_validate((const uint8_t *)bad[i].s, bad[i].len) == bad[i].off);
    }
    int32_t *ids = NULL;
    int n = -1;
    CHECK(nl_tokenize(t, "", 0, false, false, &ids, &n) == 0 && n == 0);
    free(ids);
    nl_tokenizer_free(t);
}

/* ---- 7. SentencePiece: hand-built vocab through the GGUF writer ---- */
#define SPM_N (3 + 256 + 22)
static void test_spm(void) {
    static char bytes[256][8];
    const char *toks[SPM_N];
    float scores[SPM_N];
    int32_t types[SPM_N];
    toks[0] = "<unk>";
    types[0] = 2;
    scores[0] = 0;
    toks[1] = "<s>";
    types[1] = 3;
    scores[1] = 0;
    toks[2] = "</s>";
    types[2] = 3;
    scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = 6;
        scores[3 + b] = 0;
    }
#define U "\xE2\x96\x81" /* U+2581 */
    static const struct {
        const char *t;
        float s;
    } normal[22] = {
        {U, -10},        {"h", -10},  {"e", -10}, {"l", -10}, {"o", -10},      {"w", -10},
        {"r", -10},      {"d", -10},  {"he", -1}, {"ll", -2}, {"llo", -3},     {U "he", -4},
        {U "hello", -5}, {U "w", -6}, {"or", -6}, {"ld", -7}, {U "world", -9}, {U "wor", -0.5f},
        {"a", -10},      {"b", -10},  {"ab", -1}, {"bc", -1},
    };
    for (int i = 0; i < 22; i++) {
        toks[259 + i] = normal[i].t;
        scores[259 + i] = normal[i].s;
        types[259 + i] = 1;
    }
    char path[256];
    snprintf(path, sizeof path, "test_tokenizer_spm_%d.gguf", (int)getpid());
    nl_gguf_writer *w = nl_gguf_writer_new();
    CHECK(w != NULL);
    if (!w) return;
    int rc = nl_gguf_set_str(w, "general.architecture", "llama");
    rc |= nl_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    rc |= nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, SPM_N);
    rc |= nl_gguf_set_arr(w, "tokenizer.ggml.scores", NL_GGUF_FLOAT32, scores, SPM_N);
    rc |= nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, types, SPM_N);
    rc |= nl_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    rc |= nl_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    rc |= nl_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    rc |= nl_gguf_set_str(w, "tokenizer.chat_template", "{{ messages }}");
    rc |= nl_gguf_write(w, path);
    nl_gguf_writer_free(w);
    CHECKF(rc == 0, "write spm gguf: %s", nl_last_error());
    nl_gguf *g = nl_gguf_open(path);
    CHECKF(g != NULL, "%s", nl_last_error());
    nl_tokenizer *t = g ? nl_tokenizer_from_gguf(g) : NULL;
    CHECKF(t != NULL, "spm: %s", nl_last_error());
    if (t) {
        int32_t HELLO = nl_token_lookup(t, U "hello"), WORLD = nl_token_lookup(t, U "world");
        int32_t SP = nl_token_lookup(t, U), H = nl_token_lookup(t, "h"), AB = nl_token_lookup(t, "ab");
        int32_t C_ = 3 + 'c';
        CHECK(HELLO == 271 && WORLD == 275);
        CHECK(nl_tokenizer_add_bos(t) && nl_token_bos(t) == 1 && nl_token_eos(t) == 2);
        CHECK(nl_token_eot(t) == 2);
        CHECK(nl_tokenizer_chat_template(t) && !strcmp(nl_tokenizer_chat_template(t), "{{ messages }}"));
        /* derivation (scores): he(-1) ll(-2) llo(-3) ▁he(-4) ▁hello(-5); ▁w and or tie at -6,
         * ▁w (left) first; or; ▁wor(-0.5); ld(-7); ▁world(-9) */
        EXPECT_IDS(t, "hello world", false, false, HELLO, WORLD);
        EXPECT_IDS(t, "hello world", true, false, 1, HELLO, WORLD);
        /* "ab" and "bc" tie at -1: the leftmost pair merges; c has no token -> byte <0x63> */
        EXPECT_IDS(t, "abc", false, false, SP, AB, C_);
        /* byte fallback: é = C3 A9 */
        EXPECT_IDS(t, "h\xC3\xA9", false, false, SP, H, 3 + 0xC3, 3 + 0xA9);
        /* special tokens: a space is prefixed again after each one */
        EXPECT_IDS(t, "hello</s>world", false, true, HELLO, 2, WORLD);
        EXPECT_IDS(t, "<s>hello", false, true, 1, HELLO);
        size_t pl;
        const char *p = nl_token_piece(t, HELLO, &pl);
        CHECK(p && pl == 6 && !memcmp(p, " hello", 6));
        p = nl_token_piece(t, 3 + 0xC3, &pl);
        CHECK(p && pl == 1 && (uint8_t)p[0] == 0xC3);
        const char *rt[] = {"hello world", "hello</s>world", "h\xC3\xA9 abc  d", " lead", ""};
        for (int i = 0; i < 5; i++) {
            int32_t *ids = NULL;
            int n = tok(t, rt[i], false, true, &ids);
            char *bk = NULL;
            size_t bl = 0;
            CHECKF(n >= 0 && nl_detokenize(t, ids, n, &bk, &bl) == 0 && bl == strlen(rt[i]) && !memcmp(bk, rt[i], bl),
                   "spm round trip \"%s\" -> \"%s\"", rt[i], bk ? bk : "");
            free(ids);
            free(bk);
        }
        nl_tokenizer_free(t);
    }
#undef U
    nl_gguf_close(g);
    unlink(path);
}

/* ---- 8. malformed vocabularies ---- */
static void test_bad_vocab(void) {
    const char *toks[] = {"a", "b", "a"};
    nl_tokenizer_spec sp = {0};
    sp.model = "gpt2";
    sp.pre = "gpt-2";
    sp.n_vocab = 3;
    sp.tokens = toks;
    sp.bos = sp.eos = sp.eot = sp.unk = NL_TOK_ID_DEFAULT;
    sp.add_bos = sp.add_eos = sp.add_space_prefix = -1;
    CHECK(nl_tokenizer_from_spec(&sp) == NULL && strstr(nl_last_error(), "duplicate"));
    sp.n_vocab = 2;
    sp.pre = "no-such-pre";
    CHECK(nl_tokenizer_from_spec(&sp) == NULL && strstr(nl_last_error(), "tokenizer.ggml.pre"));
    sp.pre = "gpt-2";
    sp.model = "bert";
    CHECK(nl_tokenizer_from_spec(&sp) == NULL && strstr(nl_last_error(), "tokenizer.ggml.model"));
    sp.model = "gpt2";
    sp.add_bos = 1; /* bos defaults to 11, out of range for 2 tokens */
    CHECK(nl_tokenizer_from_spec(&sp) == NULL && strstr(nl_last_error(), "bos_token_id"));
    size_t *lens = NULL;
    int n = 0;
    CHECK(nl_pretokenize("nope", "x", 1, &lens, &n) == -1);
    /* a GGUF without tokenizer keys */
    char path[256];
    snprintf(path, sizeof path, "test_tokenizer_empty_%d.gguf", (int)getpid());
    nl_gguf_writer *w = nl_gguf_writer_new();
    if (w) {
        nl_gguf_set_str(w, "general.architecture", "llama");
        CHECK(nl_gguf_write(w, path) == 0);
        nl_gguf_writer_free(w);
        nl_gguf *g = nl_gguf_open(path);
        CHECK(g != NULL);
        if (g) {
            CHECK(nl_tokenizer_from_gguf(g) == NULL && strstr(nl_last_error(), "tokenizer.ggml.model"));
            nl_gguf_close(g);
        }
        unlink(path);
    }
}

/* ---- 9. unicode tables ---- */
static void test_unicode(void) {
    CHECK(nl_unicode_flags('a') == NL_UF_L && nl_unicode_flags('5') == NL_UF_N);
    CHECK(nl_unicode_flags(0x301) == NL_UF_M && nl_unicode_flags('!') == NL_UF_P && nl_unicode_flags('+') == NL_UF_S);
    CHECK(nl_unicode_flags(' ') == (NL_UF_Z | NL_UF_WS) && nl_unicode_flags('\n') == (NL_UF_C | NL_UF_WS));
    CHECK(nl_unicode_flags(0x3000) & NL_UF_WS);
    CHECK(nl_unicode_flags(0x85) & NL_UF_WS);
    CHECK(!(nl_unicode_flags(0x1C) & NL_UF_WS));
    CHECK(nl_unicode_flags(0x378) == NL_UF_UNDEF && nl_unicode_flags(0x110000) == NL_UF_UNDEF);
    CHECK(nl_unicode_flags(0x4E00) == NL_UF_L && nl_unicode_flags(0x10FFFF) == NL_UF_UNDEF);
    CHECK(nl_unicode_tolower('A') == 'a' && nl_unicode_tolower('a') == 'a' && nl_unicode_tolower(0x212A) == 'k');
    CHECK(nl_unicode_in_spans(nl_ucd_ds_letter, nl_ucd_ds_letter_n, 0x1FBE) &&
          !nl_unicode_in_spans(nl_ucd_ds_letter, nl_ucd_ds_letter_n, 0x2129));
    char b[4];
    CHECK(nl_utf8_put(0x20AC, b) == 3 && !memcmp(b, "\xE2\x82\xAC", 3));
    CHECK(nl_utf8_put(0x1F600, b) == 4 && !memcmp(b, "\xF0\x9F\x98\x80", 4));
}

/* ---- 10. CLI ---- */
static void test_cli(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tokenize --model %sggml-vocab-gpt-2.gguf --text 'Hello world<|endoftext|>'", NL_CLI,
             TOKDIR);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[256] = {0};
    char *r = fgets(line, sizeof line, f);
    int st = pclose(f);
    CHECKF(r && st == 0 && !strcmp(line, "15496 995 50256\n"), "cli: '%s' status %d", line, st);
    snprintf(cmd, sizeof cmd, "%s tokenize --model %sggml-vocab-gpt-2.gguf --text 'Hello<|endoftext|>' --no-special",
             NL_CLI, TOKDIR);
    f = popen(cmd, "r");
    if (!f) return;
    memset(line, 0, sizeof line);
    r = fgets(line, sizeof line, f);
    st = pclose(f);
    CHECKF(r && st == 0 && strncmp(line, "15496 ", 6) == 0 && !strstr(line, "50256"), "cli --no-special: '%s'", line);
}

/* ---- 11. speed ---- */
static void test_speed(const char *vocab) {
    nl_tokenizer *t = open_vocab(vocab, NULL);
    if (!t) return;
    size_t il;
    char *inp = nl_read_file(TOKDIR "ggml-vocab-qwen35.gguf.inp", &il);
    if (!inp) {
        nl_tokenizer_free(t);
        return;
    }
    size_t n = 100 * 1024;
    char *big = malloc(n);
    for (size_t k = 0; k < n; k += il) memcpy(big + k, inp, n - k < il ? n - k : il);
    while (n > 0 && ((uint8_t)big[n - 1] & 0xC0) == 0x80) n--; /* don't end inside a character */
    if (n > 0 && (uint8_t)big[n - 1] >= 0xC0) n--;
    int32_t *ids = NULL;
    int nid = 0;
    double t0 = nl_now();
    int rc = nl_tokenize(t, big, n, false, true, &ids, &nid);
    double dt = nl_now() - t0;
    CHECKF(rc == 0, "%s", nl_last_error());
    printf("speed %-13s %zu bytes -> %d tokens in %.3f s\n", vocab, n, nid, dt);
    CHECKF(dt < 5.0, "100 KB took %.2f s", dt); /* goal well under 1 s; loose for sanitizer builds */
    char *bk = NULL;
    size_t bl = 0;
    CHECK(rc == 0 && nl_detokenize(t, ids, nid, &bk, &bl) == 0 && bl == n && !memcmp(bk, big, n));
    free(bk);
    free(ids);
    free(big);
    free(inp);
    nl_tokenizer_free(t);
}

/* Developer mode for tests/data/tokenizer/regex_diff.py: read lines "PRE<TAB>HEX(text)" from
 * stdin, print the byte lengths of the pieces nl_pretokenize cuts, one line per input. */
static int pretok_filter(void) {
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        char *tab = strchr(line, '\t');
        if (!tab) {
            printf("ERR\n");
            continue;
        }
        *tab = 0;
        char *hex = tab + 1;
        size_t hl = strcspn(hex, "\r\n"), n = hl / 2;
        char *buf = malloc(n + 1);
        if (!buf) return 1;
        for (size_t i = 0; i < n; i++) {
            unsigned v = 0;
            sscanf(hex + 2 * i, "%2x", &v);
            buf[i] = (char)v;
        }
        size_t *lens = NULL;
        int np = 0;
        if (nl_pretokenize(line, buf, n, &lens, &np)) printf("ERR %s\n", nl_last_error());
        else {
            for (int i = 0; i < np; i++) printf(i ? " %zu" : "%zu", lens[i]);
            printf("\n");
        }
        free(lens);
        free(buf);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--pretok")) return pretok_filter();
    test_unicode();
    test_splits();
    test_splits2();
    test_bpe_loop();
    const char *vocabs[] = {"gpt-2", "mpt", "starcoder", "refact", "falcon", "deepseek-coder", "deepseek-llm"};
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) test_vectors(vocabs[i]);
    test_real_vocab();
    test_gpt2_specials();
    test_vocab_specials();
    test_invalid_utf8();
    test_spm();
    test_bad_vocab();
    test_cli();
    test_speed("gpt-2");
    test_speed("deepseek-llm"); /* 2400 user-defined tokens to look for */
    return nl_t_done();
}

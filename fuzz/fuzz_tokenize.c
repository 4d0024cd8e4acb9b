/* fuzz_tokenize: nl_tokenize / nl_detokenize / nl_pretokenize on arbitrary text.
 *
 * Input: byte 0 = flags (bit 0 parse_special, bit 1 add_special), byte 1 picks the vocabulary:
 *   0                 the real GPT-2 vocabulary (tests/data/tokenizer/ggml-vocab-gpt-2.gguf;
 *                     the small gpt-2 one when the file is missing)
 *   1..FUZZ_N_PRE     the small byte-level BPE vocabulary with each known pre-tokenizer
 *   FUZZ_N_PRE + 1    the small SentencePiece vocabulary (byte fallback, space prefix)
 * (byte 1 is taken modulo the count); the rest is the text.
 * Oracles: tokenizing succeeds exactly when the text is valid UTF-8 (harness's own check);
 * ids are in the vocabulary; without add_special, detokenize(tokenize(x)) == x (every vocab
 * here can spell any byte, tokenizer.h promises the round trip; except SPM on a text holding
 * U+2581, the SPM space mark); with add_special and an
 * add_bos vocab the first id is BOS; without parse_special and add_special no control token
 * appears; the pre-tokenizer's pieces are non-empty and cover the text exactly. */
#include "common.h"

#ifndef NL_TEST_DATA
#define NL_TEST_DATA "tests/data"
#endif

static fuzz_vocab V[FUZZ_N_PRE + 1];
static nl_tokenizer *TOK[FUZZ_N_PRE + 2];
static const char *PRE[FUZZ_N_PRE + 2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < FUZZ_N_PRE; i++) {
        TOK[1 + i] = nl_tokenizer_from_spec(fuzz_vocab_build(&V[i], "gpt2", FUZZ_PRE_NAMES[i], i == 2));
        PRE[1 + i] = FUZZ_PRE_NAMES[i];
    }
    TOK[FUZZ_N_PRE + 1] = nl_tokenizer_from_spec(fuzz_vocab_build(&V[FUZZ_N_PRE], "llama", NULL, false));
    PRE[FUZZ_N_PRE + 1] = NULL;
    for (int i = 1; i < FUZZ_N_PRE + 2; i++)
        if (!TOK[i]) {
            fprintf(stderr, "fuzz_tokenize: vocab %d: %s\n", i, nl_last_error());
            abort();
        }
    size_t n;
    char *bytes = nl_read_file(NL_TEST_DATA "/tokenizer/ggml-vocab-gpt-2.gguf", &n);
    nl_gguf *g = bytes ? nl_gguf_open_buffer(bytes, n, "gpt-2") : NULL;
    TOK[0] = g ? nl_tokenizer_from_gguf(g) : NULL;
    nl_gguf_close(g);
    free(bytes);
    PRE[0] = "gpt-2";
    if (!TOK[0]) {
        fprintf(stderr, "fuzz_tokenize: note: GPT-2 vocab not loaded (%s); using the small one\n", nl_last_error());
        TOK[0] = TOK[1];
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    bool parse_special = data[0] & 1, add_special = data[0] & 2;
    int which = data[1] % (FUZZ_N_PRE + 2);
    const nl_tokenizer *t = TOK[which];
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    bool valid = fuzz_utf8_valid((const uint8_t *)text, len);

    int32_t *ids = NULL;
    int n = -1;
    int rc = nl_tokenize(t, text, len, add_special, parse_special, &ids, &n);
    FUZZ_CHECK((rc == 0) == valid, "tokenize returned %d on %s UTF-8: %s", rc, valid ? "valid" : "invalid",
               rc ? nl_last_error() : "");
    if (rc == 0) {
        int nv = nl_tokenizer_n_vocab(t);
        FUZZ_CHECK(n >= 0 && (n == 0 || ids), "n_ids %d", n);
        FUZZ_CHECK((size_t)n <= 2 * len + 4, "%d ids for %zu bytes", n, len);
        for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d outside vocab %d", ids[i], nv);
        /* SentencePiece writes spaces as U+2581, so a text that already holds U+2581 comes
         * back with spaces there (inherent to SPM, llama.cpp does the same): no round trip */
        bool spm_mark = which == FUZZ_N_PRE + 1 && memmem(text, len, "\xE2\x96\x81", 3) != NULL;
        if (!add_special && !spm_mark) {
            char *back = NULL;
            size_t blen = 0;
            FUZZ_CHECK(nl_detokenize(t, ids, n, &back, &blen) == 0, "detokenize: %s", nl_last_error());
            FUZZ_CHECK(blen == len && !memcmp(back, text, len),
                       "round trip (vocab %d, parse_special %d): %zu bytes in, %zu out", which, parse_special, len,
                       blen);
            free(back);
            if (!parse_special)
                for (int i = 0; i < n; i++)
                    FUZZ_CHECK(!nl_token_is_control(t, ids[i]), "control token %d without parse_special", ids[i]);
        }
        if (add_special && nl_tokenizer_add_bos(t)) {
            FUZZ_CHECK(n >= 1 && ids[0] == nl_token_bos(t), "add_special: first id %d, BOS %d", n ? ids[0] : -1,
                       nl_token_bos(t));
        }
        for (int i = 0; i < n && i < 64; i++) {
            size_t pl;
            FUZZ_CHECK(nl_token_piece(t, ids[i], &pl) != NULL, "piece of id %d", ids[i]);
        }
    } else {
        FUZZ_CHECK(ids == NULL || n <= 0, "failed tokenize returned ids");
    }
    free(ids);

    if (PRE[which]) {
        size_t *lens = NULL;
        int np = -1;
        rc = nl_pretokenize(PRE[which], text, len, &lens, &np);
        FUZZ_CHECK((rc == 0) == valid, "pretokenize returned %d on %s UTF-8", rc, valid ? "valid" : "invalid");
        if (rc == 0) {
            size_t sum = 0;
            for (int i = 0; i < np; i++) {
                FUZZ_CHECK(lens[i] > 0, "empty piece %d", i);
                sum += lens[i];
            }
            FUZZ_CHECK(sum == len, "pieces cover %zu of %zu bytes", sum, len);
        }
        free(lens);
    }
    return 0;
}

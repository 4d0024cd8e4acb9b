/* fuzz_tok_gguf: nl_tokenizer_from_gguf on arbitrary GGUF bytes, then use of the result.
 *
 * Input: the GGUF file. When the reader and the tokenizer accept it, a fixed set of texts
 * (ASCII, the special-token texts, multi-byte UTF-8, digits, whitespace runs) is tokenized
 * with every add_special / parse_special combination and detokenized.
 * Oracles: every id returned is inside the vocabulary; BOS/EOS/EOT are -1 or inside it;
 * every id has a piece; detokenize accepts what tokenize produced; the error of a refused
 * file names it. Vocabularies are bounded by the input size, so nothing here is slow. */
#include "common.h"

static const char *const TEXTS[] = {
    "",
    "Hello world, hello WORLD! 12345 6789",
    "  leading\tand\n\ntrailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<s></s><unk><|endoftext|>",
    "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 \xE2\x96\x81x",
    "aaaaaaaaaaaaaaaaaaaa the then there",
    "\x01\x02\x7f",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nl_gguf *g = nl_gguf_open_buffer(data, size, "fuzz.gguf");
    if (!g) {
        FUZZ_NOTE("gguf refused: %s", nl_last_error());
        return 0;
    }
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    if (!t) {
        const char *e = nl_last_error();
        FUZZ_NOTE("refused: %s", e);
        FUZZ_CHECK(e && strstr(e, "tokenizer"), "error does not name the tokenizer: %s", e);
        nl_gguf_close(g);
        return 0;
    }
    /* the tokenizer must not borrow from the GGUF (the model closes files it loaded) */
    nl_gguf_close(g);
    int nv = nl_tokenizer_n_vocab(t);
    FUZZ_CHECK(nv >= 1, "n_vocab %d", nv);
    int32_t sp[3] = {nl_token_bos(t), nl_token_eos(t), nl_token_eot(t)};
    for (int i = 0; i < 3; i++) FUZZ_CHECK(sp[i] >= -1 && sp[i] < nv, "special id %d outside vocab %d", sp[i], nv);
    const char *ct = nl_tokenizer_chat_template(t);
    if (ct) (void)strlen(ct);
    for (int32_t id = -1; id <= nv && id < 1024; id++) {
        size_t pl = 7;
        const char *p = nl_token_piece(t, id, &pl);
        if (id < 0 || id >= nv) {
            FUZZ_CHECK(p == NULL, "piece for invalid id %d", id);
        } else {
            FUZZ_CHECK(p != NULL, "no piece for id %d", id);
            volatile char c = pl ? p[pl - 1] : 0; /* ASan: the piece is readable */
            (void)c;
        }
        (void)nl_token_is_control(t, id);
    }
    for (size_t k = 0; k < sizeof TEXTS / sizeof TEXTS[0]; k++) {
        for (int f = 0; f < 4; f++) {
            int32_t *ids = NULL;
            int n = 0;
            if (nl_tokenize(t, TEXTS[k], strlen(TEXTS[k]), f & 1, f & 2, &ids, &n) != 0) {
                /* a vocabulary may be unable to spell some text (no byte tokens, no <unk>) */
                free(ids);
                continue;
            }
            for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d outside vocab %d", ids[i], nv);
            char *back = NULL;
            size_t bl = 0;
            FUZZ_CHECK(nl_detokenize(t, ids, n, &back, &bl) == 0, "detokenize: %s", nl_last_error());
            free(back);
            free(ids);
        }
    }
    FUZZ_NOTE("accepted: %d tokens", nv);
    nl_tokenizer_free(t);
    return 0;
}

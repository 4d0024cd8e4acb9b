/* fuzz/common.h: helpers shared by the fuzz harnesses (fuzz/fuzz_*.c) and the corpus maker.
 *
 * Every harness is one translation unit defining LLVMFuzzerTestOneInput (and optionally
 * LLVMFuzzerInitialize); it is linked either with libFuzzer (clang, `make fuzz`) or with
 * fuzz/replay.c (any compiler, `make test` replays the committed corpus and crash inputs).
 * An oracle failure inside a harness calls FUZZ_CHECK, which aborts: libFuzzer then saves the
 * input as a crash, and the replay test fails. */
#ifndef NL_FUZZ_COMMON_H
#define NL_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "util/util.h"

#define FUZZ_CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: oracle failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* With NL_FUZZ_VERBOSE=1 in the environment, harnesses say why an input was refused (to
 * check that seeds reach the paths they are meant for). */
static inline bool fuzz_verbose(void) {
    static int v = -1;
    if (v < 0) v = getenv("NL_FUZZ_VERBOSE") != NULL;
    return v;
}
#define FUZZ_NOTE(...)                            \
    do {                                          \
        if (fuzz_verbose()) {                     \
            fprintf(stderr, "note: " __VA_ARGS__); \
            fprintf(stderr, "\n");                \
        }                                         \
    } while (0)

/* Well-formed UTF-8 as the library's parsers define it (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). The harnesses' own reference, written independently
 * of src/data/unicode.c. */
static inline bool fuzz_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

/* GPT-2's byte-to-unicode map (formats.md §5): printable bytes stand for themselves, the other
 * 68 bytes, in increasing order, for U+0100 onwards. Writes the UTF-8 of byte b's character. */
static inline void fuzz_gpt2_byte_char(int b, char out[4]) {
#define FUZZ_PRINTABLE(x) (((x) >= 0x21 && (x) <= 0x7E) || ((x) >= 0xA1 && (x) <= 0xAC) || ((x) >= 0xAE && (x) <= 0xFF))
    int cp = b;
    if (!FUZZ_PRINTABLE(b)) {
        int k = 0;
        for (int x = 0; x < b; x++) k += !FUZZ_PRINTABLE(x);
        cp = 0x100 + k;
    }
#undef FUZZ_PRINTABLE
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A small vocabulary in the shape of a real one, so every code path of the tokenizer runs:
 *   byte-level BPE ("gpt2"): ids 0..255 the byte characters, then a few merge results,
 *     ChatML / Llama-3 control tokens and one USER_DEFINED token (three spaces);
 *   SentencePiece ("llama"): <unk>, <s>, </s>, the 256 <0xXX> byte-fallback tokens, then
 *     scored pieces and the same control tokens.
 * Built as a spec (fuzz_vocab_spec) so it can also be written into a GGUF seed. The strings
 * live in the struct; fill it once, then point a nl_tokenizer_spec at it. */
#define FUZZ_VOCAB_MAX 320
typedef struct {
    char buf[FUZZ_VOCAB_MAX][24];
    const char *tok[FUZZ_VOCAB_MAX];
    int32_t type[FUZZ_VOCAB_MAX];
    float score[FUZZ_VOCAB_MAX];
    const char *merges[16];
    int n, n_merges;
    nl_tokenizer_spec spec;
} fuzz_vocab;

static const char *const FUZZ_SPECIALS[] = {"<|im_start|>", "<|im_end|>", "<|start_header_id|>",
                                            "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>",
                                            "<|endoftext|>"};
#define FUZZ_CHATML_TEMPLATE "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
#define FUZZ_LLAMA3_TEMPLATE "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"

static inline int fuzz_vocab_add(fuzz_vocab *v, const char *text, int32_t type, float score) {
    snprintf(v->buf[v->n], sizeof v->buf[v->n], "%s", text);
    v->tok[v->n] = v->buf[v->n];
    v->type[v->n] = type;
    v->score[v->n] = score;
    return v->n++;
}

/* model: "gpt2" or "llama"; pre: a gpt2 pre-tokenizer name (ignored for llama); llama3: the
 * Llama-3 template and BOS (else ChatML). */
static inline const nl_tokenizer_spec *fuzz_vocab_build(fuzz_vocab *v, const char *model, const char *pre,
                                                        bool llama3) {
    memset(v, 0, sizeof *v);
    bool bpe = !strcmp(model, "gpt2");
    int first_special;
    if (bpe) {
        char c[4];
        for (int b = 0; b < 256; b++) {
            fuzz_gpt2_byte_char(b, c);
            fuzz_vocab_add(v, c, 1, 0.0f);
        }
        /* merges, in rank order, and their results ("\xC4\xA0" is the space's character) */
        static const char *const M[][2] = {{"\xC4\xA0 t", "\xC4\xA0t"}, {"h e", "he"},
                                           {"\xC4\xA0t he", "\xC4\xA0the"}, {"i n", "in"},
                                           {"1 2", "12"}, {"a a", "aa"}, {"aa aa", "aaaa"},
                                           {"\xC4\xA0 \xC4\xA0", "\xC4\xA0\xC4\xA0"}, {"\xC4\x8A \xC4\x8A", "\xC4\x8A\xC4\x8A"}};
        for (size_t i = 0; i < sizeof M / sizeof M[0]; i++) {
            v->merges[v->n_merges++] = M[i][0];
            fuzz_vocab_add(v, M[i][1], 1, 0.0f);
        }
        first_special = v->n;
    } else {
        fuzz_vocab_add(v, "<unk>", 2, 0.0f);
        fuzz_vocab_add(v, "<s>", 3, 0.0f);
        fuzz_vocab_add(v, "</s>", 3, 0.0f);
        for (int b = 0; b < 256; b++) {
            char c[8];
            snprintf(c, sizeof c, "<0x%02X>", b);
            fuzz_vocab_add(v, c, 6, 0.0f);
        }
        /* "\xE2\x96\x81" is SentencePiece's space mark; higher score = merged first */
        static const char *const P[] = {"\xE2\x96\x81", "t", "h", "e", "a", "b", "he", "\xE2\x96\x81t",
                                        "\xE2\x96\x81the", "ab", "\xE2\x96\x81\x61", "in", "\xC3\xA9"};
        for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) fuzz_vocab_add(v, P[i], 1, -(float)i);
        first_special = v->n;
    }
    for (size_t i = 0; i < sizeof FUZZ_SPECIALS / sizeof FUZZ_SPECIALS[0]; i++) fuzz_vocab_add(v, FUZZ_SPECIALS[i], 3, 0.0f);
    int user = fuzz_vocab_add(v, "   ", 4, 0.0f); /* USER_DEFINED: matched even without parse_special */
    (void)user;
    nl_tokenizer_spec *sp = &v->spec;
    sp->model = model;
    sp->pre = bpe ? pre : NULL;
    sp->n_vocab = v->n;
    sp->tokens = v->tok;
    sp->types = v->type;
    sp->scores = v->score;
    sp->merges = bpe ? v->merges : NULL;
    sp->n_merges = bpe ? v->n_merges : 0;
    if (bpe) {
        sp->bos = first_special + 5;                   /* <|begin_of_text|> */
        sp->eos = first_special + (llama3 ? 4 : 6);    /* <|eot_id|> / <|endoftext|> */
        sp->eot = first_special + (llama3 ? 4 : 1);    /* <|eot_id|> / <|im_end|> */
        sp->unk = -1;
    } else {
        sp->bos = 1;
        sp->eos = 2;
        sp->eot = first_special + (llama3 ? 4 : 1);
        sp->unk = 0;
    }
    sp->add_bos = llama3 ? 1 : -1;
    sp->add_eos = -1;
    sp->add_space_prefix = -1;
    sp->chat_template = llama3 ? FUZZ_LLAMA3_TEMPLATE : FUZZ_CHATML_TEMPLATE;
    return sp;
}

/* Every gpt2 pre-tokenizer name the library knows (tokenizer.c's table), for the harnesses to
 * pick from. */
static const char *const FUZZ_PRE_NAMES[] = {"gpt-2", "mpt", "llama3", "llama-v3", "llama-bpe", "qwen2",
                                             "deepseek-r1-qwen", "qwen35", "deepseek-llm", "deepseek-coder",
                                             "falcon", "starcoder", "refact", "default"};
#define FUZZ_N_PRE ((int)(sizeof FUZZ_PRE_NAMES / sizeof FUZZ_PRE_NAMES[0]))

/* A private temporary file path (for harnesses whose API takes a path). */
static inline void fuzz_tmp_path(char *buf, size_t cap, const char *what) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/nl-fuzz-%s-%ld", dir && *dir ? dir : "/tmp", what, (long)getpid());
}

#endif

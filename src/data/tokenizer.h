/* data/tokenizer: the vocabulary embedded in a GGUF (tokenizer.ggml.*): byte-level BPE
 * ("gpt2", with the pre-tokenizers gpt-2, llama-bpe, qwen2, qwen35, deepseek-llm,
 * deepseek-coder, falcon, starcoder, refact, mpt) and SentencePiece BPE ("llama").
 * Facts: docs/formats.md §5. */
#ifndef NL_TOKENIZER_H
#define NL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/model.h"

typedef struct nl_tokenizer nl_tokenizer;

/* NULL + error when the GGUF has no or a malformed vocabulary (error names the key). */
nl_tokenizer *nl_tokenizer_from_gguf(const nl_gguf *g);
void nl_tokenizer_free(nl_tokenizer *t);
/* The tokenizer of a loaded model (its GGUF's tokenizer.ggml.* keys), checked against the
 * model's vocabulary size: 0 and *out (caller frees), *out = NULL when the file has no
 * vocabulary; -1 + an error naming the file. */
int nl_tokenizer_for_model(const nl_model *m, nl_tokenizer **out);

/* Encode `len` bytes of UTF-8. add_special: BOS/EOS as the vocab says; parse_special: match
 * control (and unknown) token text (chat templates need it). USER_DEFINED tokens are matched
 * whatever parse_special says, as llama.cpp does (mpt's runs of spaces, deepseek's <|EOT|>).
 * *ids is malloc'd (caller frees). Invalid UTF-8 is an error naming the byte offset.
 * A tokenizer is read-only after construction: concurrent calls are safe. */
int nl_tokenize(const nl_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                int32_t **ids, int *n_ids);

/* Bytes of one token as text would contain them (byte-level mapping undone). *len set.
 * Returns a pointer valid until free, or NULL for an invalid id. */
const char *nl_token_piece(const nl_tokenizer *t, int32_t id, size_t *len);
/* Exact token text -> id, -1 if none. */
int32_t nl_token_lookup(const nl_tokenizer *t, const char *text);

int nl_tokenizer_n_vocab(const nl_tokenizer *t);
int32_t nl_token_bos(const nl_tokenizer *t); /* -1 if none */
int32_t nl_token_eos(const nl_tokenizer *t);
int32_t nl_token_eot(const nl_tokenizer *t); /* end of turn (<|im_end|>, <|eot_id|>) or eos */
bool nl_tokenizer_add_bos(const nl_tokenizer *t);
bool nl_token_is_control(const nl_tokenizer *t, int32_t id);
const char *nl_tokenizer_chat_template(const nl_tokenizer *t); /* NULL if absent */

/* ---- additions (tokenizer room) ---- */

/* In-memory construction: what nl_tokenizer_from_gguf builds from the tokenizer.ggml.* keys,
 * usable directly by tests and tools. Arrays are copied (nothing is borrowed). */
#define NL_TOK_ID_DEFAULT (-2) /* id "absent from the file": the model type's default applies */
typedef struct {
    const char *model; /* "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE) */
    const char *pre;   /* tokenizer.ggml.pre (gpt2 only); NULL or "" = "default" */
    int32_t n_vocab;
    const char *const *tokens; /* n_vocab texts */
    const size_t *token_lens;  /* NULL: strlen of each */
    const int32_t *types;      /* NULL: all NORMAL (1); values as tokenizer.ggml.token_type */
    const float *scores;       /* NULL: all 0 (SPM merges by these) */
    const char *const *merges; /* gpt2: "left right", rank = index */
    int32_t n_merges;
    int32_t bos, eos, eot, unk; /* NL_TOK_ID_DEFAULT when the key is absent, -1 = none */
    int add_bos, add_eos;       /* -1: default (add_bos: SPM and llama3 pre true, else false) */
    int add_space_prefix;       /* -1: default (SPM true) */
    const char *chat_template;  /* NULL if none */
} nl_tokenizer_spec;
nl_tokenizer *nl_tokenizer_from_spec(const nl_tokenizer_spec *spec);

/* Concatenated pieces of ids (control tokens give their text). For SPM with a space prefix,
 * the one space the tokenizer prefixed (at the start and after each special token) is
 * removed again, so nl_detokenize(nl_tokenize(x)) == x — except that a SentencePiece vocab
 * cannot tell U+2581 (its space mark) already in x from a space: those come back as spaces
 * (inherent to SentencePiece; llama.cpp does the same). *text is malloc'd, NUL-terminated. */
int nl_detokenize(const nl_tokenizer *t, const int32_t *ids, int n_ids, char **text, size_t *len);

/* Pre-tokenizer split alone (no special tokens, no byte mapping): the byte lengths of the
 * pieces `text` is cut into by the named pre-tokenizer ("gpt-2", "llama3", "qwen2", ...).
 * *piece_lens is malloc'd. Invalid UTF-8 or an unknown name is an error. */
int nl_pretokenize(const char *pre, const char *text, size_t len, size_t **piece_lens, int *n_pieces);

#endif

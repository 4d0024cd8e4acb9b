/* data/tokenizer: the vocabulary embedded in a GGUF (tokenizer.ggml.*): byte-level BPE
 * ("gpt2", with the pre-tokenizers gpt-2, llama-bpe, qwen2, qwen35, deepseek-llm,
 * deepseek-coder, falcon, starcoder, refact, mpt) and SentencePiece BPE ("llama").
 * Facts: ../shared/ref/formats.md §5. */
#ifndef NL_TOKENIZER_H
#define NL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct nl_tokenizer nl_tokenizer;

/* NULL + error when the GGUF has no or a malformed vocabulary (error names the key). */
nl_tokenizer *nl_tokenizer_from_gguf(const nl_gguf *g);
void nl_tokenizer_free(nl_tokenizer *t);

/* Encode `len` bytes of UTF-8. add_special: BOS/EOS as the vocab says; parse_special: match
 * control/user-defined token text (chat templates need it). *ids is malloc'd (caller frees).
 * Invalid UTF-8 is an error naming the byte offset. */
int nl_tokenize(const nl_tokenizer *t, const char *text, size_t len, bool add_special,
                bool parse_special, int32_t **ids, int *n_ids);

/* Bytes of one token as text would contain them (byte-level mapping undone). *len set.
 * Returns a pointer valid until free, or NULL for an invalid id. */
const char *nl_token_piece(const nl_tokenizer *t, int32_t id, size_t *len);
/* Exact token text -> id, -1 if none. */
int32_t nl_token_lookup(const nl_tokenizer *t, const char *text);

int nl_tokenizer_n_vocab(const nl_tokenizer *t);
int32_t nl_token_bos(const nl_tokenizer *t);  /* -1 if none */
int32_t nl_token_eos(const nl_tokenizer *t);
int32_t nl_token_eot(const nl_tokenizer *t);  /* end of turn (<|im_end|>, <|eot_id|>) or eos */
bool nl_tokenizer_add_bos(const nl_tokenizer *t);
bool nl_token_is_control(const nl_tokenizer *t, int32_t id);
const char *nl_tokenizer_chat_template(const nl_tokenizer *t); /* NULL if absent */

#endif

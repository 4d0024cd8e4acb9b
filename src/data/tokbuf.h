/* data/tokbuf (private to data/): the growable token list with per-token target flags, and the
 * chat template's token emission, shared by the chat templates (template.c) and the JSONL line
 * formats (lines.c). The public contract is dataset.h. */
#ifndef NL_TOKBUF_H
#define NL_TOKBUF_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

typedef struct {
    int32_t *ids;
    uint8_t *tgt;
    int n, cap;
} nl_tokbuf;

void nl_tokbuf_free(nl_tokbuf *b);
int nl_tokbuf_push(nl_tokbuf *b, int32_t id, uint8_t t);
/* Tokenize text (no BOS/EOS, no special-token parsing) and append with flag t. */
int nl_tokbuf_text(const nl_tokenizer *tok, nl_tokbuf *b, const char *s, size_t len, uint8_t t);
/* The tokenizer's BOS (flag 0), when it adds one. */
int nl_tokbuf_bos(const nl_tokenizer *tok, nl_tokbuf *b);

/* Marker token ids of a template, looked up by their text. */
typedef struct {
    int32_t open, close; /* chatml: <|im_start|>, <|im_end|>; llama3: header start/end */
    int32_t eot;         /* llama3: <|eot_id|>; chatml: = close */
} nl_tmpl_ids;

/* The markers of template t; an error naming the token the vocabulary lacks. */
int nl_tmpl_ids_get(const nl_tokenizer *tok, nl_chat_tmpl t, nl_tmpl_ids *ti);
/* Appends a conversation (BOS first); assistant content + end-of-turn get flag `asst_target`. */
int nl_chat_tokens(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                   bool add_generation_prompt, uint8_t asst_target, nl_tokbuf *b);

/* The same through a template object (dataset.h): a built-in as above, or a Jinja template
 * (its loss spans found by rendering); tools: NULL or the line's "tools" array. */
int nl_chat_template_tokens(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs,
                            const struct nl_json *tools, bool add_generation_prompt, uint8_t asst_target, nl_tokbuf *b);

#endif

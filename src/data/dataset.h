/* data/dataset: JSONL training/eval data -> token sequences with per-token loss targets,
 * chat templates (ChatML, Llama-3) without a Jinja engine, and the length-class packing and
 * deterministic, resumable batch order the trainer walks.
 *
 * ---- Lines ----
 * Each non-blank line of the file is one JSON object (strict RFC 8259, see json.h) in one of
 * the formats below. target[i] = 1 means ids[i] is a loss target predicted from ids[0..i);
 * target[0] is always 0 (nothing precedes it). "BOS" below means: the tokenizer's BOS id,
 * added only when nl_tokenizer_add_bos() says so.
 *
 *  {"prompt": P, "completion": C}
 *      BOS + tok(P) + tok(C) + EOS. P and C are tokenized SEPARATELY and concatenated (so the
 *      completion's tokens are the ones a model emits after the prompt, whatever the text at
 *      the seam), neither with special-token parsing. Targets: tok(C) and the EOS (the
 *      tokenizer's EOS, or EOT when it has no EOS). C must not be empty; P may be.
 *  {"messages": [{"role": R, "content": S, ...}, ...], "tools": [...]}
 *      The chat template (below), BOS first. R is "system", "user", "assistant" or "tool".
 *      A message may carry "tool_calls", "reasoning_content", "name" and "tool_call_id" and
 *      the line "tools" (an array): a Jinja template sees them as transformers passes them
 *      (the built-ins ignore them). Targets: every assistant content token and that turn's
 *      end-of-turn token (<|im_end|> / <|eot_id|>); never the template's own header tokens or
 *      the "\n" after <|im_end|> (with a Jinja template: the assistant spans, below). At
 *      least one assistant message is required (unless the line has choices).
 *  {"conversations": [{"from": F, "value": S}, ...]}            (ShareGPT)
 *      The messages line of the same turns: F "human" -> user, "gpt" -> assistant, "system"
 *      ("user" and "assistant" are taken as such); any other F is an error. Targets as messages.
 *      A turn may be {"role", "content"} instead (as chat tools write ShareGPT files).
 *  {"prompt": [{"role": R, "content": S}, ...], "completion": [...]}   (TRL conversational)
 *      The messages line of prompt + completion, with TRL's completion-only loss: targets on
 *      the completion's assistant turns only (an assistant turn in the prompt is context: the
 *      prompt rendered alone must be the conversation's first tokens, as it is with chatml and
 *      llama3). The completion needs an assistant message; the prompt list may be empty.
 *      Both "prompt" and "completion" are strings or both lists; with choices, a list "prompt"
 *      and no "completion" (a messages line with choices).
 *  {"text": S}
 *      BOS + tok(S); every token is a target except the first. No EOS is appended.
 *  {"tokens": [ids...], "loss_mask": [0|1...]}
 *      Taken as is: no BOS, ids in [0, n_vocab), written as digits (1e-400, 5.0 are errors). target[i] = loss_mask[i]
 * for i >= 1; loss_mask[0] is ignored; without loss_mask every token but the first is a target. loss_mask must have
 * exactly as many entries as tokens.
 *  {"instruction": I, "input": X, "output": O}                  (Alpaca; "input" optional)
 *      Either the Alpaca template: BOS + tok("Below is an instruction that describes a task[,
 *      paired with an input that provides further context]. Write a response that
 *      appropriately completes the request.\n\n### Instruction:\n" I ["\n\n### Input:\n" X]
 *      "\n\n### Response:\n") + tok(O) + EOS, targets tok(O) and the EOS (as a prompt line);
 *      or the messages line [user: I ["\n\n" X], assistant: O]. opts->alpaca picks; "auto":
 *      the chat template when one is named or the model has one. An empty X is no input.
 * Other key names: opts->columns renames a line's top-level keys first ("prompt=question").
 * Any other key is skipped and counted (exporters add "id", "source", a turn's "weight"), on
 * the line and in a turn's object; with opts->strict_keys it is an error (a typo such as
 * "completon" is caught). A line with keys of two formats is an error either way.
 * A conversation's turn with "tool_calls" (an assistant turn; its content may then be absent
 * or null) and a "tool" turn must change the template's rendering: a template that drops
 * them is an error naming the turn and the template, and an assistant target with neither
 * content nor a tool call is an error. Every line must end up with at least one target token.
 * A file whose first non-blank byte is '[' is one JSON array of such objects (as `datasets`
 * writes with lines=False); an element's line is the line it starts on.
 *
 * ---- Labelled multiple choice ----
 * Any line may add "choices": [c0, c1, ...] (at least 2; strings, or for a tokens line
 * arrays of token ids) and "answer": the correct choice, given as a 0-based index or as a
 * string equal to one of the choices. A prompt line with choices may give "completion"
 * instead of (or as well as, if they agree) "answer": it must equal one of the choices.
 * Such a line is an evaluation item: its context ("prompt") is
 *      prompt line:   BOS + tok(P)
 *      messages line: the rendered conversation + the generation prompt (the conversation
 *                     must not end with an assistant message)
 *      text line:     BOS + tok(S)
 *      tokens line:   the tokens (loss_mask is not allowed)
 * each choice is tok(choice) tokenized separately as a continuation (nothing appended), and
 * the example's sequence is context + the correct choice with targets on the choice only
 * (so ids[0..n_prompt) is the context). Accuracy = the choice with the highest summed
 * log-likelihood after the context.
 *
 * ---- Errors ----
 * Every error reads "file:line:column: message" (column = 1-based byte column in the line of
 * the offending JSON value) and loading stops with -1. A file with no examples is an error.
 * A UTF-8 byte order mark at the start of the file is skipped; "\r\n" line ends are fine.
 *
 * ---- Chat templates ----
 * By default a conversation is rendered with the GGUF's own tokenizer.chat_template through
 * the Jinja interpreter (nl_chat_template_open below: the real Qwen3, Qwen3.5, Llama 3.x,
 * SmolLM2 and Gemma 3 templates render as transformers renders them); --template FILE.jinja
 * renders with another. The two built-ins, by name only (--template chatml / llama3):
 *  chatml (Qwen2/3/3.5): per message "<|im_start|>{role}\n{content}<|im_end|>\n",
 *          generation prompt "<|im_start|>assistant\n".
 *  llama3: per message "<|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|>",
 *          generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n"; BOS from the
 *          tokenizer (add_bos). trim = leading/trailing ASCII whitespace.
 * The template's marker tokens are emitted by id (looked up by text in the vocabulary, which
 * must have them); the text between markers is tokenized without special-token parsing, so
 * the result equals tokenizing the rendered text with parse_special except that user text
 * can never inject a control token, and message content is tokenized on its own (exactly as
 * a model would generate it after the header). nl_chat_template_pick also detects one from a
 * template text (contains "<|im_start|>" -> chatml, "<|start_header_id|>" -> llama3). The
 * built-in chatml does not insert Qwen3's "thinking off" block (the GGUF's own template does).
 * A default system turn the GGUF's own ChatML template renders when the conversation does not
 * open with a system message (SmolLM2's "You are a helpful AI assistant named SmolLM, ...",
 * Qwen2.5's) is inserted the same way, with no loss on it (nl_chat_render, text only, never
 * adds it).
 *
 * ---- Packing ----
 * One example per sequence (attention is plain causal, so examples are never packed
 * together). nl_pack gives each example its length class (the smallest bucket >= its length;
 * max_ctx acts as the last bucket) and applies the overlong policy. nl_batcher walks the
 * sequences in a per-epoch order (file order, or a shuffle that depends only on
 * (seed, epoch)) and cuts batches of at most batch_tokens tokens (a longer sequence is a batch
 * by itself). Its cursor (epoch, index) is all a checkpoint needs to resume exactly. */
#ifndef NL_DATASET_H
#define NL_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

typedef enum {
    NL_LINE_PROMPT = 0, /* prompt + completion */
    NL_LINE_MESSAGES,
    NL_LINE_TEXT,
    NL_LINE_TOKENS,
} nl_line_format;

typedef struct {
    int32_t *ids;    /* n_tokens token ids */
    uint8_t *target; /* n_tokens flags: 1 = ids[i] is a loss target; target[0] == 0 */
    int n_tokens;
    int n_targets; /* count of target[i] == 1 */
    int line;      /* 1-based line in the source file */
    nl_line_format format;
    /* Labelled multiple choice (n_choices == 0: none). The context is ids[0..n_prompt). */
    int n_prompt;
    int n_choices;
    int32_t **choice_ids; /* n_choices arrays */
    int *choice_len;      /* their lengths (>= 1) */
    int answer;           /* index of the correct choice; -1 when n_choices == 0 */
} nl_example;

/* The example's targets among its first max_ctx tokens (what is left of it when it is cut to
 * the context: 0 means nothing of it can be trained on or scored). */
int nl_example_targets_within(const nl_example *ex, int max_ctx);

/* Row targets from a sequence's flags, the rule training and evaluation share: row t predicts
 * ids[t+1] when target[t+1] is set (else -1); the last row predicts nothing. */
void nl_row_targets(const int32_t *ids, const uint8_t *target, int n, int32_t *rows);

typedef struct {
    char *path;     /* label used in errors (owned) */
    nl_example *ex; /* n examples in file order (owned) */
    int n;
    int64_t n_tokens, n_targets; /* totals */
    /* how the file was read (nl_dataset_note says it) */
    int json_array;         /* 1: a JSON array of examples, not JSON Lines */
    int n_alpaca;           /* Alpaca lines ... */
    int alpaca_chat;        /* ... rendered with the chat template (0: the Alpaca template) */
    int64_t n_skipped_keys; /* keys no format reads, skipped (not strict) */
    char skipped_key[48];   /* the first of them, and its line */
    int skipped_line;
} nl_dataset;

typedef struct {
    const char *chat_template; /* NULL or "auto": from the tokenizer; "chatml"; "llama3" */
    int n_vocab;               /* id range for tokens lines when tok == NULL (0: unchecked) */
    int strict_keys;           /* 1: a key no format reads is an error; 0: such keys (an
                                * exporter's "id", "source") are skipped, on the line and in
                                * its turns, and counted (nl_dataset_note) */
    const char *columns;       /* "prompt=question,completion=answer": a line's key "question"
                                * is read as "prompt" (top-level keys; NULL: none) */
    const char *alpaca;        /* Alpaca lines' prompt: NULL/"auto" (the chat template when one
                                * is named or the model has one, else the Alpaca template),
                                * "alpaca" or "chat" */
} nl_data_opts;

/* The longest line a JSONL file may hold (bytes, without its newline): a longer one is an
 * error at file:line before it is parsed. */
#define NL_DATA_MAX_LINE (64 << 20)

/* Load a JSONL file. tok may be NULL, then only tokens lines are accepted (ids checked against
 * opts->n_vocab when > 0). opts may be NULL (defaults). On error: -1, error slot set,
 * *out left empty. */
int nl_dataset_load(const char *path, const nl_tokenizer *tok, const nl_data_opts *opts, nl_dataset *out);
/* Same over a caller's buffer; `label` stands for the file name in errors. */
int nl_dataset_load_buffer(const char *buf, size_t len, const char *label, const nl_tokenizer *tok,
                           const nl_data_opts *opts, nl_dataset *out);
void nl_dataset_free(nl_dataset *ds);
/* One line saying how the file was read, for the plan line: a JSON array, the Alpaca lines'
 * prompt (which template), the skipped keys (how many, the first and its line). buf, "" when
 * there is nothing to say. */
const char *nl_dataset_note(const nl_dataset *ds, char *buf, size_t cap);
/* A data directory (mlx-lm's layout: train.jsonl, valid.jsonl, test.jsonl): when `path` is a
 * directory, *file = path/name (malloc'd), or NULL when that file is absent and !must_exist
 * (absent and must_exist: an error naming both). When `path` is not a directory, *file = NULL
 * and the caller reads `path` itself. 0 or -1. */
int nl_data_dir_file(const char *path, const char *name, int must_exist, char **file);

/* The held-out split (train --val-split F): example i (1-based, in file order, blank lines not
 * counted) is held out when floor(i*F) > floor((i-1)*F), so floor(n*F) examples evenly spread
 * through the file, the same ones every run whatever the seed (F 0.1: the 10th, 20th, ...;
 * F 0.25: the 4th, 8th, ...). nl_dataset_split moves them into *held (same path label, file
 * lines kept) and leaves the rest in ds, in order (never all: floor(n*F) < n); a split holding
 * none out is an error naming --val-split and the file (ds untouched). */
int nl_dataset_is_held_out(int64_t i, double frac);
int nl_dataset_split(nl_dataset *ds, double frac, nl_dataset *held);

/* ---- chat templates ---- */
typedef enum { NL_TMPL_NONE = 0, NL_TMPL_CHATML, NL_TMPL_LLAMA3 } nl_chat_tmpl;

struct nl_json;
typedef struct {
    const char *role;    /* "system", "user", "assistant" or "tool" (NUL-terminated) */
    const char *content; /* UTF-8, content_len bytes */
    size_t content_len;
    const struct nl_json *extra; /* NULL, or the turn's JSON object: its other members
                                  * (tool_calls, reasoning_content, name, ...) reach a Jinja
                                  * template as the message's fields (borrowed) */
} nl_chat_msg;

/* Pick a template: `name` ("chatml", "llama3"; NULL/""/"auto" = detect) wins over the
 * detection from `gguf_template` (tokenizer.chat_template text, may be NULL). */
int nl_chat_template_pick(const char *name, const char *gguf_template, nl_chat_tmpl *out);
const char *nl_chat_template_name(nl_chat_tmpl t);

/* The template as text (no BOS), for display and tests. *text is malloc'd, NUL-terminated. */
int nl_chat_render(nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs, bool add_generation_prompt, char **text,
                   size_t *text_len);

/* Tokens of a conversation (BOS if the tokenizer adds one), with targets on assistant content
 * and its end-of-turn token (target may be NULL). *ids / *target are malloc'd. */
int nl_chat_tokenize(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                     bool add_generation_prompt, int32_t **ids, uint8_t **target, int *n_ids);

/* For `nightlora generate`: one user message + the generation prompt, as tokens, with the
 * template nl_chat_template_open(tok, tmpl_name) gives. */
int nl_chat_prompt_tokens(const nl_tokenizer *tok, const char *tmpl_name, const char *user, size_t user_len,
                          int32_t **ids, int *n_ids);

/* ---- the template a conversation is rendered with ----
 * name NULL, "" or "auto": the GGUF's own tokenizer.chat_template, rendered by the Jinja
 * interpreter (data/jinja.h) as Hugging Face transformers renders it (an error when the GGUF
 * has none: then name one); "chatml" / "llama3": the built-ins above; anything else: a Jinja
 * file (FILE.jinja) read at open.
 * Tokens of a Jinja rendering: the rendered text is cut at the control tokens (their text in
 * the template's own bytes, never in message text: a message cannot inject one) and at the
 * loss spans; each piece is tokenized without special-token parsing. BOS is the template's
 * (bos_token); the tokenizer's BOS is put first only when add_bos is set and the rendering
 * does not start with it.
 * The loss spans, found by rendering (no template-specific knowledge): for each assistant
 * message i, its span starts where the rendering of messages[0..i) with the generation
 * prompt stops agreeing with the whole rendering (so the generation prompt is never a target,
 * and whatever the template puts after it for this turn, e.g. Qwen3's <think> block, is);
 * the content's end is where a rendering with that message's content extended stops
 * agreeing; the span ends after the first control token the template emits from there (the
 * turn's end: <|im_end|>, <|eot_id|>, <end_of_turn>). Tool calls the template renders after
 * the content are inside the span. The same spans in linear time (20,000 turns well under a
 * second): the first assistant message's by that rule; its generation prompt's text, whose last
 * occurrence before each later content starts that span; and one more rendering with a flagged
 * sentinel after every assistant content, walked beside the whole one, for the contents' ends.
 * A template where these do not line up (a content rendered twice or out of order, a prompt
 * text that is not the turn's header) gets the rule's renderings, message by message.
 * Every rendering's budget (jinja.h) is the default plus 16 bytes and 64 operations per byte of
 * the conversation (64 a message). */
typedef struct nl_chat_template nl_chat_template;
/* tok is borrowed and must outlive the template. -1 + error (an unknown name, a file that
 * cannot be read, a construct the interpreter lacks: "FILE:LINE: filter 'x' is not
 * supported"). */
int nl_chat_template_open(const nl_tokenizer *tok, const char *name, nl_chat_template **out);
void nl_chat_template_free(nl_chat_template *ct);
/* "chatml", "llama3", "tokenizer.chat_template" or the file's path */
const char *nl_chat_template_desc(const nl_chat_template *ct);
/* A name's check without a model: a built-in, or a Jinja file that reads, parses and renders a
 * 4-turn probe conversation within jinja.h's default budget (a bomb fails here, before any work). */
int nl_chat_template_check(const char *name);
/* The tokenizer's own tokenizer.chat_template, if any, rendered once on that probe conversation
 * (nl_tokenizer_for_model calls it: a model whose template is a bomb fails at load, every
 * command and `check` with it). Only a budget that runs out fails it: a template that does not
 * parse or refuses the probe on purpose is judged when a command renders with it. */
int nl_chat_template_probe(const nl_tokenizer *tok);
/* Tests: find every loss span by rendering per message (the rule as written, quadratic in the
 * turns) instead of the linear way nl_chat_template_tokenize takes (the same spans). */
void nl_chat_template_exact_spans(bool on);
/* Tokens of a conversation through the template (as a messages line: targets on the assistant
 * spans; target may be NULL). *ids / *target malloc'd. */
int nl_chat_template_tokenize(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs,
                              const struct nl_json *tools, bool add_generation_prompt, int32_t **ids, uint8_t **target,
                              int *n_ids);
/* The conversation as text (no BOS added), as the template renders it. tools: NULL or a JSON
 * array (the template's `tools`). *text malloc'd. */
int nl_chat_template_text(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const struct nl_json *tools,
                          bool add_generation_prompt, char **text, size_t *len);

/* ---- packing and batch order ---- */
typedef enum { NL_OVERLONG_TRUNCATE = 0, NL_OVERLONG_REFUSE } nl_overlong;

typedef struct {
    const int32_t *ids;    /* borrowed from the dataset */
    const uint8_t *target; /* borrowed */
    int n_tokens;          /* <= max_ctx (after truncation) */
    int n_targets;
    int bucket;  /* length class: smallest bucket >= n_tokens */
    int example; /* index into the dataset */
} nl_seq;

typedef struct {
    nl_seq *seq; /* owned; in file order */
    int n;
    int n_truncated; /* examples cut to max_ctx */
    int n_dropped;   /* examples left with no target after truncation (not in seq) */
} nl_packing;

/* buckets: ascending lengths (values > max_ctx are ignored; max_ctx is always the last
 * class). REFUSE: an example longer than max_ctx is an error "file:line:1: ...". TRUNCATE:
 * keep its first max_ctx tokens; if no target remains it is dropped and counted. Error if
 * no sequence remains. */
int nl_pack(const nl_dataset *ds, const int *buckets, int n_buckets, int max_ctx, nl_overlong policy, nl_packing *out);
void nl_packing_free(nl_packing *p);

typedef struct {
    int64_t epoch; /* 0-based */
    int64_t index; /* position in that epoch's order of the next sequence */
} nl_data_cursor;

/* The order of epoch `epoch`: perm[k] = sequence index at position k (n entries). Identity
 * when !shuffle; otherwise a Fisher-Yates shuffle driven by a counter-based hash of
 * (seed, epoch, k), so it is the same on every run and machine. */
void nl_data_order(int n, uint64_t seed, int64_t epoch, bool shuffle, int *perm);

typedef struct nl_batcher nl_batcher;

/* Walks `p` (borrowed; must outlive the batcher). batch_tokens >= 1. */
nl_batcher *nl_batcher_new(const nl_packing *p, uint64_t seed, bool shuffle, int batch_tokens);
void nl_batcher_free(nl_batcher *b);
/* Resume at a cursor saved by nl_batcher_cursor (index <= n). */
int nl_batcher_seek(nl_batcher *b, nl_data_cursor cur);
nl_data_cursor nl_batcher_cursor(const nl_batcher *b);
/* Next batch: *seq_idx points at *n_seq indices into p->seq (valid until the next call).
 * A batch never spans two epochs; after the last batch of an epoch the cursor is
 * (epoch + 1, 0). */
int nl_batcher_next(nl_batcher *b, const int **seq_idx, int *n_seq);

#endif

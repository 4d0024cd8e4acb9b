/* data/lines: the JSONL line formats -> examples (targets, choices, errors at line:column),
 * and loading a file of them. The contract (formats, targets, errors, choices) is in dataset.h. */
#include "data/dataset.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/json.h"
#include "data/tokbuf.h"
#include "util/util.h"

/* ---- JSONL loader ---- */

typedef struct {
    const char *label;
    int line;
    size_t col0;           /* bytes before the line's parsed text (the BOM on line 1) */
    const nl_tokenizer *tok;
    int n_vocab;           /* 0: unchecked */
    const char *tmpl_name;
    nl_chat_template *tmpl; /* NULL until the first messages line (owned) */
    bool ignore_unknown;   /* keys nothing reads are skipped, not refused */
} loader;

/* "label:line:col: message"; off is the byte offset in the line's text. */
static int lerr(const loader *L, size_t off, const char *fmt, ...) NL_PRINTF(3, 4);
static int lerr(const loader *L, size_t off, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nl_err("%s:%d:%zu: %s", L->label, L->line, L->col0 + off + 1, msg);
}

/* Re-raise the current error slot message at a position (the slot is copied first). */
static int lerr_slot(const loader *L, size_t off) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", nl_last_error());
    return lerr(L, off, "%s", msg);
}

static const char *const known_keys[] = {"prompt", "completion", "messages", "conversations", "text",
                                         "tokens", "loss_mask", "choices", "answer", "tools"};
/* the keys that name a line's format (one per line) */
static const char *const format_keys[] = {"prompt", "messages", "conversations", "text", "tokens"};

static bool key_in(const nl_json_member *m, const char *const *keys, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (strcmp(m->key, keys[j]) == 0 && strlen(keys[j]) == m->key_len) return true;
    return false;
}

static int need_string(const loader *L, const nl_json *v, const char *what) {
    if (nl_json_is_string(v)) return 0;
    return lerr(L, v->offset, "%s must be a string, found %s", what, nl_json_type_name(v->type));
}

static int need_tok(const loader *L, const nl_json *v, const char *key) {
    if (L->tok) return 0;
    return lerr(L, v->offset, "\"%s\" needs a tokenizer (only \"tokens\" lines can be read without a model)", key);
}

/* A token id array element: integer in [0, n_vocab). */
static int token_id(const loader *L, const nl_json *v, const char *what, size_t i, int32_t *out) {
    int64_t x;
    if (nl_json_int64(v, &x)) {
        /* an integer too large for int64 (or for a double's exact range) is still an integer */
        if (v->type == NL_JSON_NUMBER && isfinite(v->u.num.d) && v->u.num.d == floor(v->u.num.d))
            return lerr(L, v->offset, "%s[%zu] = %.17g is outside the vocabulary [0, %d)", what, i, v->u.num.d,
                        L->n_vocab > 0 ? L->n_vocab : INT32_MAX);
        return lerr(L, v->offset, "%s[%zu] must be an integer token id, found %s", what, i,
                    v->type == NL_JSON_NUMBER ? "a fraction" : nl_json_type_name(v->type));
    }
    if (x < 0 || (L->n_vocab > 0 && x >= L->n_vocab) || x > INT32_MAX)
        return lerr(L, v->offset, "%s[%zu] = %lld is outside the vocabulary [0, %d)", what, i,
                    (long long)x, L->n_vocab > 0 ? L->n_vocab : INT32_MAX);
    *out = (int32_t)x;
    return 0;
}

/* Tokenize a JSON string value, errors located at it. */
static int tb_json_text(const loader *L, nl_tokbuf *b, const nl_json *v, uint8_t t) {
    if (nl_tokbuf_text(L->tok, b, v->u.str.s, v->u.str.len, t)) return lerr_slot(L, v->offset);
    return 0;
}

static int ensure_template(loader *L, size_t off) {
    if (L->tmpl) return 0;
    if (nl_chat_template_open(L->tok, L->tmpl_name, &L->tmpl)) return lerr_slot(L, off);
    return 0;
}

static void example_free(nl_example *e) {
    free(e->ids);
    free(e->target);
    for (int i = 0; i < e->n_choices; i++)
        if (e->choice_ids) free(e->choice_ids[i]);
    free(e->choice_ids);
    free(e->choice_len);
    memset(e, 0, sizeof *e);
}

/* Choices: fills ex->choice_*, and *answer from "answer" / the completion (-1 if neither). */
static int parse_choices(const loader *L, const nl_json *root, const nl_json *choices,
                         nl_line_format fmt, nl_example *ex) {
    const nl_json *answer = nl_json_get(root, "answer");
    const nl_json *completion = nl_json_get(root, "completion");
    if (!nl_json_is_array(choices))
        return lerr(L, choices->offset, "\"choices\" must be an array, found %s",
                    nl_json_type_name(choices->type));
    size_t nc = nl_json_len(choices);
    if (nc < 2) return lerr(L, choices->offset, "\"choices\" needs at least 2 entries, found %zu", nc);
    if (nc > 1024) return lerr(L, choices->offset, "\"choices\" has %zu entries (at most 1024)", nc);
    ex->choice_ids = calloc(nc, sizeof *ex->choice_ids);
    ex->choice_len = calloc(nc, sizeof *ex->choice_len);
    if (!ex->choice_ids || !ex->choice_len) return lerr(L, choices->offset, "out of memory");
    ex->n_choices = (int)nc;
    for (size_t i = 0; i < nc; i++) {
        const nl_json *c = nl_json_at(choices, i);
        nl_tokbuf b = {0};
        if (fmt == NL_LINE_TOKENS) {
            if (!nl_json_is_array(c))
                return lerr(L, c->offset, "choices[%zu] of a tokens line must be an array of token ids, found %s",
                            i, nl_json_type_name(c->type));
            for (size_t k = 0; k < nl_json_len(c); k++) {
                int32_t id;
                if (token_id(L, nl_json_at(c, k), "choice", k, &id) || nl_tokbuf_push(&b, id, 1)) {
                    nl_tokbuf_free(&b);
                    return -1;
                }
            }
        } else {
            char what[32];
            snprintf(what, sizeof what, "choices[%zu]", i);
            if (need_string(L, c, what) || tb_json_text(L, &b, c, 1)) {
                nl_tokbuf_free(&b);
                return -1;
            }
        }
        if (b.n == 0) {
            nl_tokbuf_free(&b);
            return lerr(L, c->offset, "choices[%zu] is empty", i);
        }
        free(b.tgt);
        ex->choice_ids[i] = b.ids;
        ex->choice_len[i] = b.n;
    }
    /* The correct choice: "answer" (index or text), or a prompt line's completion. */
    int ans = -1;
    if (answer) {
        int64_t x;
        if (nl_json_is_number(answer)) {
            if (nl_json_int64(answer, &x) || x < 0 || x >= (int64_t)nc)
                return lerr(L, answer->offset, "\"answer\" must be a choice index in [0, %zu) or a choice's text", nc);
            ans = (int)x;
        } else if (nl_json_is_string(answer)) {
            for (size_t i = 0; i < nc && ans < 0; i++) {
                const nl_json *c = nl_json_at(choices, i);
                if (nl_json_is_string(c) && c->u.str.len == answer->u.str.len &&
                    memcmp(c->u.str.s, answer->u.str.s, c->u.str.len) == 0)
                    ans = (int)i;
            }
            if (ans < 0) return lerr(L, answer->offset, "\"answer\" is not one of the choices");
        } else {
            return lerr(L, answer->offset, "\"answer\" must be a choice index or a string, found %s",
                        nl_json_type_name(answer->type));
        }
    }
    if (completion && nl_json_is_string(completion)) {
        int ci = -1;
        for (size_t i = 0; i < nc && ci < 0; i++) {
            const nl_json *c = nl_json_at(choices, i);
            if (c->u.str.len == completion->u.str.len &&
                memcmp(c->u.str.s, completion->u.str.s, c->u.str.len) == 0)
                ci = (int)i;
        }
        if (ci < 0) return lerr(L, completion->offset, "\"completion\" is not one of the choices");
        if (ans >= 0 && ans != ci)
            return lerr(L, answer->offset, "\"answer\" (choice %d) disagrees with \"completion\" (choice %d)", ans, ci);
        ans = ci;
    }
    if (ans < 0)
        return lerr(L, choices->offset, "a line with \"choices\" needs \"answer\" (an index or the correct choice's text)");
    ex->answer = ans;
    return 0;
}

/* ---- conversations: every chat shape is one nl_chat_msg list ----
 * "messages" and TRL's conversational "prompt"/"completion" hold {"role", "content"} turns
 * (system, user, assistant); ShareGPT's "conversations" holds {"from", "value"} turns
 * (system, human, gpt; user and assistant are taken too). */

typedef struct {
    const char *name;          /* the line's key, for errors */
    const char *role_key, *content_key;
    bool sharegpt;
} turn_list;

static turn_list chat_turns(const char *name) { return (turn_list){name, "role", "content", false}; }
static const turn_list sharegpt_turns = {"conversations", "from", "value", true};

/* The list's length after its checks: an array of at most 100000 turns, empty only when
 * allow_empty. */
static int turn_count(const loader *L, const nl_json *v, const turn_list *tl, bool allow_empty, size_t *n) {
    if (!nl_json_is_array(v))
        return lerr(L, v->offset, "\"%s\" must be an array, found %s", tl->name, nl_json_type_name(v->type));
    *n = nl_json_len(v);
    if (*n == 0 && !allow_empty) return lerr(L, v->offset, "\"%s\" is empty", tl->name);
    if (*n > 100000) return lerr(L, v->offset, "\"%s\" has too many entries", tl->name);
    return 0;
}

static const char *turn_role(const nl_json *v, bool sharegpt) {
    static const char *const names[][2] = {{"system", "system"}, {"user", "user"}, {"assistant", "assistant"},
                                           {"tool", "tool"}, {"human", "user"}, {"gpt", "assistant"}};
    const size_t n = sharegpt ? 6 : 4;
    for (size_t i = 0; i < n; i++)
        if (v->u.str.len == strlen(names[i][0]) && memcmp(v->u.str.s, names[i][0], v->u.str.len) == 0) return names[i][1];
    return NULL;
}

/* A {"role", "content"} turn's other keys a chat template reads (OpenAI / transformers form). */
static const char *const turn_extra_keys[] = {"tool_calls", "reasoning_content", "name", "tool_call_id"};

/* The turns of list `v` appended at m + *n_out (room for nl_json_len(v) more; pointers into
 * the DOM). *n_asst counts the assistant turns. */
static int parse_turns(const loader *L, const nl_json *v, const turn_list *tl, nl_chat_msg *m, int *n_out,
                       int *n_asst) {
    size_t n = nl_json_len(v);
    for (size_t i = 0; i < n; i++) {
        const nl_json *o = nl_json_at(v, i);
        if (!nl_json_is_object(o))
            return lerr(L, o->offset, "%s[%zu] must be an object, found %s", tl->name, i, nl_json_type_name(o->type));
        for (size_t k = 0; k < o->u.obj.n && !L->ignore_unknown; k++) {
            const nl_json_member *mm = &o->u.obj.members[k];
            if (strcmp(mm->key, tl->role_key) != 0 && strcmp(mm->key, tl->content_key) != 0 &&
                (tl->sharegpt || !key_in(mm, turn_extra_keys, sizeof turn_extra_keys / sizeof *turn_extra_keys)))
                return lerr(L, mm->key_offset, "%s[%zu]: unknown key \"%.60s\" (expected \"%s\" and \"%s\"%s; "
                            "--ignore-unknown-keys skips the keys nightlora does not read)",
                            tl->name, i, mm->key, tl->role_key, tl->content_key,
                            tl->sharegpt ? "" : ", optionally tool_calls, reasoning_content, name, tool_call_id");
        }
        const nl_json *role = nl_json_get(o, tl->role_key), *content = nl_json_get(o, tl->content_key);
        if (!role || !content)
            return lerr(L, o->offset, "%s[%zu] needs \"%s\"", tl->name, i, role ? tl->content_key : tl->role_key);
        char what[32];
        snprintf(what, sizeof what, "\"%s\"", tl->role_key);
        if (need_string(L, role, what)) return -1;
        snprintf(what, sizeof what, "\"%s\"", tl->content_key);
        if (need_string(L, content, what)) return -1;
        const char *r = turn_role(role, tl->sharegpt);
        if (!r && tl->sharegpt)
            return lerr(L, role->offset, "%s[%zu]: unknown \"from\" \"%.40s\" (expected human, gpt or system; "
                        "user, assistant and tool are taken too)", tl->name, i, role->u.str.s);
        if (!r)
            return lerr(L, role->offset, "%s[%zu]: unknown role \"%.40s\" (expected system, user, assistant or tool)",
                        tl->name, i, role->u.str.s);
        if (r[0] == 'a') (*n_asst)++;
        nl_chat_msg *t = &m[(*n_out)++];
        t->role = r;
        t->content = content->u.str.s;
        t->content_len = content->u.str.len;
        t->extra = tl->sharegpt ? NULL : o;
    }
    return 0;
}

/* ---- one line: its keys, then one function per format, then its targets ---- */

/* A line's members, looked up once (NULL when absent). */
typedef struct {
    const nl_json *root;
    const char *fmt_key;   /* the key naming the line's format */
    const nl_json *fv;     /* its value */
    const nl_json *choices, *answer, *completion, *loss_mask, *tools;
    bool trl;              /* TRL's conversational prompt/completion: two message lists */
} line_keys;

/* Keys: only the known ones (unless told to skip the others), exactly one format, and the
 * keys that belong with one format only; sets ex->format. */
static int line_keys_read(const loader *L, const nl_json *root, line_keys *k, nl_example *ex) {
    memset(k, 0, sizeof *k);
    k->root = root;
    if (!nl_json_is_object(root))
        return lerr(L, root->offset, "expected a JSON object, found %s", nl_json_type_name(root->type));
    const char *fmt_key = NULL;
    for (size_t i = 0; i < root->u.obj.n; i++) {
        const nl_json_member *m = &root->u.obj.members[i];
        if (!key_in(m, known_keys, sizeof known_keys / sizeof *known_keys)) {
            if (L->ignore_unknown) continue;
            return lerr(L, m->key_offset, "unknown key \"%.60s\" (a line is prompt+completion, messages, conversations, text or"
                                          " tokens [+ loss_mask], with optional choices/answer; --ignore-unknown-keys skips the"
                                          " keys nightlora does not read)", m->key);
        }
        if (key_in(m, format_keys, sizeof format_keys / sizeof *format_keys)) {
            if (fmt_key) return lerr(L, m->key_offset, "\"%s\" cannot be combined with \"%s\" on one line", m->key, fmt_key);
            fmt_key = m->key;
        }
    }
    if (!fmt_key)
        return lerr(L, root->offset, "a line needs one of \"prompt\" (+ \"completion\"), \"messages\", \"conversations\", \"text\""
                                     " or \"tokens\"");
    k->fmt_key = fmt_key;
    k->choices = nl_json_get(root, "choices");
    k->answer = nl_json_get(root, "answer");
    k->completion = nl_json_get(root, "completion");
    k->loss_mask = nl_json_get(root, "loss_mask");
    k->tools = nl_json_get(root, "tools");
    k->fv = nl_json_get(root, fmt_key);
    if (k->completion && strcmp(fmt_key, "prompt") != 0)
        return lerr(L, k->completion->offset, "\"completion\" belongs with \"prompt\", not \"%s\"", fmt_key);
    if (k->loss_mask && strcmp(fmt_key, "tokens") != 0)
        return lerr(L, k->loss_mask->offset, "\"loss_mask\" belongs with \"tokens\", not \"%s\"", fmt_key);
    if (k->answer && !k->choices) return lerr(L, k->answer->offset, "\"answer\" without \"choices\"");
    if (k->tools && !nl_json_is_array(k->tools))
        return lerr(L, k->tools->offset, "\"tools\" must be an array (of function descriptions), found %s",
                    nl_json_type_name(k->tools->type));
    k->trl = !strcmp(fmt_key, "prompt") && nl_json_is_array(k->fv);
    if (!strcmp(fmt_key, "tokens")) ex->format = NL_LINE_TOKENS;
    else if (!strcmp(fmt_key, "prompt")) ex->format = k->trl ? NL_LINE_MESSAGES : NL_LINE_PROMPT;
    else if (!strcmp(fmt_key, "messages") || !strcmp(fmt_key, "conversations")) ex->format = NL_LINE_MESSAGES;
    else ex->format = NL_LINE_TEXT;
    if (ex->format != NL_LINE_TOKENS && need_tok(L, k->fv, fmt_key)) return -1;
    if (k->tools && ex->format != NL_LINE_MESSAGES)
        return lerr(L, k->tools->offset, "\"tools\" belongs with a conversation (\"messages\"), not \"%s\"", fmt_key);
    return 0;
}

/* The "prompt" key's checks (a string prompt, or TRL's message lists) before anything is
 * tokenized. */
static int check_prompt(const loader *L, const line_keys *k) {
    const nl_json *fv = k->fv, *completion = k->completion;
    const bool trl = k->trl;
    if (!trl && need_string(L, fv, "\"prompt\"")) return -1;
    if (!completion && !k->choices) return lerr(L, k->root->offset, "a \"prompt\" line needs \"completion\"");
    if (completion && trl != nl_json_is_array(completion) && (nl_json_is_string(completion) || nl_json_is_array(completion)))
        return lerr(L, completion->offset, "\"completion\" is a %s but \"prompt\" is a %s: give both as strings, or both as lists"
                    " of {\"role\", \"content\"} messages (TRL's conversational form)", trl ? "string" : "message list",
                    trl ? "message list" : "string");
    if (trl && completion && k->choices)
        return lerr(L, completion->offset, "with \"choices\", a message-list \"prompt\" takes no \"completion\" (the answer is one"
                    " of the choices)");
    if (completion && !trl) {
        if (need_string(L, completion, "\"completion\"")) return -1;
        if (completion->u.str.len == 0) return lerr(L, completion->offset, "\"completion\" is empty (nothing to learn)");
    }
    return 0;
}

static int line_choices(const loader *L, const line_keys *k, nl_example *ex) {
    return k->choices ? parse_choices(L, k->root, k->choices, ex->format, ex) : 0;
}

/* {"prompt": P, "completion": C}: BOS + tok(P) + tok(C) + EOS */
static int line_prompt(loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    if (check_prompt(L, k) || line_choices(L, k, ex)) return -1;
    if (nl_tokbuf_bos(L->tok, b) || tb_json_text(L, b, k->fv, 0)) return -1;
    if (!k->choices) {
        if (tb_json_text(L, b, k->completion, 1)) return -1;
        int32_t end = nl_token_eos(L->tok) >= 0 ? nl_token_eos(L->tok) : nl_token_eot(L->tok);
        if (end >= 0 && nl_tokbuf_push(b, end, 1)) return -1;
    }
    return 0;
}

/* {"text": S}: BOS + tok(S) */
static int line_text(loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    if (need_string(L, k->fv, "\"text\"")) return -1;
    if (k->fv->u.str.len == 0) return lerr(L, k->fv->offset, "\"text\" is empty");
    if (line_choices(L, k, ex)) return -1;
    return nl_tokbuf_bos(L->tok, b) || tb_json_text(L, b, k->fv, k->choices ? 0 : 1) ? -1 : 0;
}

/* One turn list ("messages", ShareGPT's "conversations"), or TRL's prompt + completion,
 * through the chat template. */
static int line_messages(loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    const nl_json *fv = k->fv, *completion = k->completion, *choices = k->choices, *tools = k->tools;
    const bool trl = k->trl;
    if (trl && check_prompt(L, k)) return -1;
    if (line_choices(L, k, ex)) return -1;
    const turn_list tl = !strcmp(k->fmt_key, "conversations") ? sharegpt_turns : chat_turns(k->fmt_key);
    const turn_list tc = chat_turns("completion");
    size_t n1 = 0, n2 = 0;
    if (turn_count(L, fv, &tl, trl, &n1)) return -1;
    if (trl && completion && turn_count(L, completion, &tc, false, &n2)) return -1;
    if (n1 == 0 && n2 == 0) return lerr(L, fv->offset, "\"%s\" is empty", tl.name);
    nl_chat_msg *msgs = calloc(n1 + n2, sizeof *msgs);
    if (!msgs) return lerr(L, fv->offset, "out of memory");
    int rc = -1;
    int n_msgs = 0, n_asst = 0;
    if (parse_turns(L, fv, &tl, msgs, &n_msgs, &n_asst)) goto done;
    const int n_ctx = n_msgs, n_ctx_asst = n_asst; /* TRL: the prompt's turns */
    if (n2 && parse_turns(L, completion, &tc, msgs, &n_msgs, &n_asst)) goto done;
    if (choices && msgs[n_msgs - 1].role[0] == 'a') {
        lerr(L, fv->offset, "with \"choices\", the conversation must not end with an assistant message");
        goto done;
    }
    if (!choices && n_asst - (trl ? n_ctx_asst : 0) == 0) {
        if (trl) lerr(L, completion->offset, "\"completion\" has no assistant message (loss is on the completion's assistant turns: nothing to learn)");
        else if (tl.sharegpt) lerr(L, fv->offset, "no \"gpt\" turn (loss is on the assistant turns: nothing to learn)");
        else lerr(L, fv->offset, "no assistant message (loss is on assistant turns: nothing to learn)");
        goto done;
    }
    if (ensure_template(L, fv->offset)) goto done;
    if (nl_chat_template_tokens(L->tmpl, msgs, n_msgs, tools, choices != NULL, choices ? 0 : 1, b)) {
        lerr_slot(L, fv->offset);
        goto done;
    }
    if (trl && !choices && n_ctx_asst > 0) {
        /* TRL trains on the completion only: the prompt's assistant turns are context. The
         * prompt rendered alone is the conversation's first tokens; no loss on them. */
        nl_tokbuf pb = {0};
        int bad = nl_chat_template_tokens(L->tmpl, msgs, n_ctx, tools, false, 1, &pb);
        if (bad) lerr_slot(L, fv->offset);
        else if (pb.n > b->n || memcmp(pb.ids, b->ids, (size_t)pb.n * sizeof *pb.ids) != 0)
            bad = lerr(L, fv->offset, "the chat template renders the prompt's turns differently inside the whole"
                       " conversation: the completion's tokens cannot be told apart");
        else memset(b->tgt, 0, (size_t)pb.n);
        nl_tokbuf_free(&pb);
        if (bad) goto done;
    }
    rc = 0;
done:
    free(msgs);
    return rc;
}

/* {"tokens": [...], "loss_mask": [...]}: taken as is */
static int line_tokens(loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    const nl_json *fv = k->fv, *loss_mask = k->loss_mask;
    if (!nl_json_is_array(fv))
        return lerr(L, fv->offset, "\"tokens\" must be an array of token ids, found %s", nl_json_type_name(fv->type));
    if (nl_json_len(fv) == 0) return lerr(L, fv->offset, "\"tokens\" is empty");
    if (nl_json_len(fv) > (size_t)INT_MAX / 2) return lerr(L, fv->offset, "\"tokens\" is too long");
    if (loss_mask) {
        if (k->choices) return lerr(L, loss_mask->offset, "\"loss_mask\" cannot be used with \"choices\"");
        if (!nl_json_is_array(loss_mask))
            return lerr(L, loss_mask->offset, "\"loss_mask\" must be an array of 0/1, found %s",
                        nl_json_type_name(loss_mask->type));
        if (nl_json_len(loss_mask) != nl_json_len(fv))
            return lerr(L, loss_mask->offset, "\"loss_mask\" has %zu entries but \"tokens\" has %zu",
                        nl_json_len(loss_mask), nl_json_len(fv));
    }
    if (line_choices(L, k, ex)) return -1;
    for (size_t i = 0; i < nl_json_len(fv); i++) {
        int32_t id;
        uint8_t t = k->choices ? 0 : 1;
        if (token_id(L, nl_json_at(fv, i), "tokens", i, &id)) return -1;
        if (loss_mask) {
            const nl_json *mv = nl_json_at(loss_mask, i);
            int64_t x;
            if (nl_json_int64(mv, &x) || (x != 0 && x != 1)) return lerr(L, mv->offset, "loss_mask[%zu] must be 0 or 1", i);
            t = (uint8_t)x;
        }
        if (nl_tokbuf_push(b, id, t)) return lerr_slot(L, fv->offset);
    }
    return 0;
}

/* The built sequence -> the example: (choices) the correct answer appended, the first token
 * never a target, at least one target. Takes b's arrays on success. */
static int line_finish(const loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    const nl_json *choices = k->choices;
    if (choices) {
        ex->n_prompt = b->n;
        for (int i = 0; i < ex->choice_len[ex->answer]; i++)
            if (nl_tokbuf_push(b, ex->choice_ids[ex->answer][i], 1)) return lerr_slot(L, choices->offset);
    }
    /* the first token has nothing before it: it is never a target */
    const int first_was_target = b->n > 0 && b->tgt[0];
    if (b->n > 0) b->tgt[0] = 0;
    int nt = 0;
    for (int i = 0; i < b->n; i++) nt += b->tgt[i];
    if (nt == 0) {
        const nl_json *at = ex->format == NL_LINE_PROMPT && k->completion ? k->completion : choices ? choices : k->fv;
        return lerr(L, at->offset, "no target tokens (%s)",
                    first_was_target && b->n == 1 && (choices || ex->format == NL_LINE_PROMPT)
                        ? "the only target is the first token of the sequence, with nothing before it to predict it from: "
                          "give a non-empty prompt; this model adds no BOS token"
                    : ex->format == NL_LINE_TEXT   ? "the text is a single token: nothing to predict"
                    : ex->format == NL_LINE_TOKENS ? "loss_mask selects no token after the first, or only one token"
                                                   : "the completion produced no tokens");
    }
    ex->ids = b->ids;
    ex->target = b->tgt;
    ex->n_tokens = b->n;
    ex->n_targets = nt;
    memset(b, 0, sizeof *b);
    return 0;
}

static int parse_line(loader *L, const char *s, size_t len, nl_example *ex) {
    nl_json_error je;
    nl_json *root = nl_json_parse(s, len, &je);
    if (!root) return lerr(L, je.offset, "%s", je.msg);
    nl_tokbuf b = {0};
    line_keys k;
    memset(ex, 0, sizeof *ex);
    ex->line = L->line;
    ex->answer = -1;
    int rc = line_keys_read(L, root, &k, ex);
    if (!rc) {
        switch (ex->format) {
        case NL_LINE_PROMPT: rc = line_prompt(L, &k, ex, &b); break;
        case NL_LINE_TEXT: rc = line_text(L, &k, ex, &b); break;
        case NL_LINE_MESSAGES: rc = line_messages(L, &k, ex, &b); break;
        case NL_LINE_TOKENS: rc = line_tokens(L, &k, ex, &b); break;
        }
    }
    if (!rc) rc = line_finish(L, &k, ex, &b);
    nl_tokbuf_free(&b);
    if (rc) example_free(ex);
    nl_json_free(root);
    return rc;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

void nl_dataset_free(nl_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n; i++) example_free(&ds->ex[i]);
    free(ds->ex);
    free(ds->path);
    memset(ds, 0, sizeof *ds);
}

static int load_lines(loader *Lp, const char *buf, size_t len, const char *label, const nl_tokenizer *tok,
                      const nl_data_opts *opts, nl_dataset *out);

int nl_dataset_load_buffer(const char *buf, size_t len, const char *label, const nl_tokenizer *tok,
                           const nl_data_opts *opts, nl_dataset *out) {
    loader L = {0};
    int rc = load_lines(&L, buf, len, label, tok, opts, out);
    nl_chat_template_free(L.tmpl);
    return rc;
}

static int load_lines(loader *L, const char *buf, size_t len, const char *label, const nl_tokenizer *tok,
                      const nl_data_opts *opts, nl_dataset *out) {
    memset(out, 0, sizeof *out);
    if (!label) label = "<data>";
    L->label = label;
    L->tok = tok;
    L->n_vocab = tok ? nl_tokenizer_n_vocab(tok) : (opts ? opts->n_vocab : 0);
    L->tmpl_name = opts ? opts->chat_template : NULL;
    L->ignore_unknown = opts && opts->ignore_unknown_keys;
    out->path = nl_strdup(label);
    if (!out->path) return -1;
    int cap = 0;
    size_t pos = 0;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) {
        pos = 3;
        L->col0 = 3;
    }
    while (pos < len) {
        if (L->line == INT_MAX) {
            nl_dataset_free(out);
            return nl_err("%s: too many lines", label);
        }
        L->line++;
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t lend = end;
        if (lend > pos && buf[lend - 1] == '\r') lend--;
        /* bounded before it is parsed: a JSON tree and the tokens of one huge line can take
         * many times its size */
        if (lend - pos > NL_DATA_MAX_LINE) {
            nl_dataset_free(out);
            return nl_err("%s:%d: the line is %zu bytes, more than the %d MiB a line may hold (split the example)", label, L->line,
                          lend - pos, NL_DATA_MAX_LINE >> 20);
        }
        if (!blank(buf + pos, lend - pos)) {
            if (out->n == cap) {
                if (cap > INT_MAX / 2) {
                    nl_dataset_free(out);
                    return nl_err("%s: too many examples", label);
                }
                int nc = cap ? cap * 2 : 256;
                nl_example *ne = realloc(out->ex, (size_t)nc * sizeof *ne);
                if (!ne) {
                    nl_dataset_free(out);
                    return nl_err("%s: out of memory", label);
                }
                out->ex = ne;
                cap = nc;
            }
            if (parse_line(L, buf + pos, lend - pos, &out->ex[out->n])) {
                nl_dataset_free(out);
                return -1;
            }
            out->n_tokens += out->ex[out->n].n_tokens;
            out->n_targets += out->ex[out->n].n_targets;
            out->n++;
        }
        pos = end + 1;
        L->col0 = 0;
    }
    if (out->n == 0) {
        nl_dataset_free(out);
        return nl_err("%s: no examples (the file is empty or has only blank lines)", label);
    }
    return 0;
}

int nl_dataset_load(const char *path, const nl_tokenizer *tok, const nl_data_opts *opts, nl_dataset *out) {
    memset(out, 0, sizeof *out);
    size_t len;
    char *buf = nl_read_file(path, &len);
    if (!buf) return -1;
    int rc = nl_dataset_load_buffer(buf, len, path, tok, opts, out);
    free(buf);
    return rc;
}

int nl_data_dir_file(const char *path, const char *name, int must_exist, char **file) {
    *file = NULL;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0; /* a file: read as it is */
    const size_t pl = strlen(path), n = pl + strlen(name) + 2;
    char *f = malloc(n);
    if (!f) return nl_err("out of memory");
    snprintf(f, n, "%s%s%s", path, pl && path[pl - 1] == '/' ? "" : "/", name);
    if (stat(f, &st) != 0) {
        const int e = errno;
        if (e == ENOENT && !must_exist) {
            free(f);
            return 0;
        }
        nl_err("%s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and %s cannot be read: %s", path, f, strerror(e));
        free(f);
        return -1;
    }
    *file = f;
    return 0;
}

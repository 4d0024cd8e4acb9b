/* data/lines: the JSONL line formats -> examples (targets, choices, errors at line:column),
 * and loading a file of them. The contract (formats, targets, errors, choices) is in dataset.h. */
#include "data/dataset.h"

#include <errno.h>
#include <inttypes.h>
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
    size_t col0; /* bytes before the line's parsed text (the BOM on line 1) */
    const nl_tokenizer *tok;
    int n_vocab; /* 0: unchecked */
    const char *tmpl_name;
    nl_chat_template *tmpl;   /* NULL until the first messages line (owned) */
    bool strict;              /* a key nothing reads is refused, not skipped */
    const char *doc;          /* a JSON array file: the whole text (errors' line:column from the offset), else NULL */
    size_t doc_len, doc_base; /* its length; the offsets' origin in it (the BOM) */
    int n_cols;               /* --columns: a line's key cols[i].from is read as cols[i].to */
    struct {
        const char *to;
        char from[64];
    } cols[16];
    int alpaca; /* Alpaca lines: 0 not decided yet, 1 the Alpaca template, 2 the chat template */
    const char *alpaca_opt;
    nl_dataset *out; /* the counts of what was skipped and how lines were read */
} loader;

/* "label:line:col: message"; off is the byte offset in the line's text. */
static int lerr(const loader *L, size_t off, const char *fmt, ...) NL_PRINTF(3, 4);
static int lerr(const loader *L, size_t off, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (L->doc) {
        int line, col;
        nl_json_linecol(L->doc, L->doc_len, L->doc_base + off, &line, &col);
        return nl_err("%s:%d:%d: %s", L->label, line, col, msg);
    }
    return nl_err("%s:%d:%zu: %s", L->label, L->line, L->col0 + off + 1, msg);
}

/* Re-raise the current error slot message at a position (the slot is copied first). */
static int lerr_slot(const loader *L, size_t off) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", nl_last_error());
    return lerr(L, off, "%s", msg);
}

static const char *const known_keys[] = {"prompt",      "completion", "messages", "conversations", "text",
                                         "tokens",      "loss_mask",  "choices",  "answer",        "tools",
                                         "instruction", "input",      "output"};
/* the keys that name a line's format (one per line) */
static const char *const format_keys[] = {"prompt", "messages", "conversations", "text", "tokens", "instruction"};

/* A key skipped (not strict): counted, the first one named in nl_dataset_note. */
static void skipped_key(const loader *L, const nl_json_member *m) {
    nl_dataset *d = L->out;
    if (d->n_skipped_keys++ == 0) {
        snprintf(d->skipped_key, sizeof d->skipped_key, "%.40s", m->key);
        d->skipped_line = L->line;
    }
}

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
    /* digits only: 1e-400 (read as 0), 5.0 or 1e3 are no token id */
    if (v->type == NL_JSON_NUMBER && !v->u.num.is_int && isfinite(v->u.num.d) && fabs(v->u.num.d) < 9007199254740992.0)
        return lerr(L, v->offset,
                    "%s[%zu] must be an integer token id written in digits, found a number with a fraction or an"
                    " exponent",
                    what, i);
    if (nl_json_int64(v, &x)) {
        /* an integer too large for int64 (or for a double's exact range) is still an integer */
        if (v->type == NL_JSON_NUMBER && isfinite(v->u.num.d) && v->u.num.d == floor(v->u.num.d))
            return lerr(L, v->offset, "%s[%zu] = %.17g is outside the vocabulary [0, %d)", what, i, v->u.num.d,
                        L->n_vocab > 0 ? L->n_vocab : INT32_MAX);
        return lerr(L, v->offset, "%s[%zu] must be an integer token id, found %s", what, i,
                    v->type == NL_JSON_NUMBER ? "a fraction" : nl_json_type_name(v->type));
    }
    if (x < 0 || (L->n_vocab > 0 && x >= L->n_vocab) || x > INT32_MAX)
        return lerr(L, v->offset, "%s[%zu] = %lld is outside the vocabulary [0, %d)", what, i, (long long)x,
                    L->n_vocab > 0 ? L->n_vocab : INT32_MAX);
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
static int parse_choices(const loader *L, const nl_json *root, const nl_json *choices, nl_line_format fmt,
                         nl_example *ex) {
    const nl_json *answer = nl_json_get(root, "answer");
    const nl_json *completion = nl_json_get(root, "completion");
    if (!nl_json_is_array(choices))
        return lerr(L, choices->offset, "\"choices\" must be an array, found %s", nl_json_type_name(choices->type));
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
                return lerr(L, c->offset, "choices[%zu] of a tokens line must be an array of token ids, found %s", i,
                            nl_json_type_name(c->type));
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
            if (c->u.str.len == completion->u.str.len && memcmp(c->u.str.s, completion->u.str.s, c->u.str.len) == 0)
                ci = (int)i;
        }
        if (ci < 0) return lerr(L, completion->offset, "\"completion\" is not one of the choices");
        if (ans >= 0 && ans != ci)
            return lerr(L, answer->offset, "\"answer\" (choice %d) disagrees with \"completion\" (choice %d)", ans, ci);
        ans = ci;
    }
    if (ans < 0)
        return lerr(L, choices->offset,
                    "a line with \"choices\" needs \"answer\" (an index or the correct choice's text)");
    ex->answer = ans;
    return 0;
}

/* ---- conversations: every chat shape is one nl_chat_msg list ----
 * "messages" and TRL's conversational "prompt"/"completion" hold {"role", "content"} turns
 * (system, user, assistant); ShareGPT's "conversations" holds {"from", "value"} turns
 * (system, human, gpt; user and assistant are taken too). */

typedef struct {
    const char *name; /* the line's key, for errors */
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
    static const char *const names[][2] = {{"system", "system"}, {"user", "user"},  {"assistant", "assistant"},
                                           {"tool", "tool"},     {"human", "user"}, {"gpt", "assistant"}};
    const size_t n = sharegpt ? 6 : 4;
    for (size_t i = 0; i < n; i++)
        if (v->u.str.len == strlen(names[i][0]) && memcmp(v->u.str.s, names[i][0], v->u.str.len) == 0)
            return names[i][1];
    return NULL;
}

/* A {"role", "content"} turn's other keys a chat template reads (OpenAI / transformers form). */
static const char *const turn_extra_keys[] = {"tool_calls", "reasoning_content", "name", "tool_call_id"};

/* A turn's tool calls: a non-empty "tool_calls" array (NULL when none). */
static const nl_json *turn_tool_calls(const nl_json *o) {
    const nl_json *tc = nl_json_get(o, "tool_calls");
    return nl_json_is_array(tc) && nl_json_len(tc) > 0 ? tc : NULL;
}

/* The turns of list `v` appended at m + *n_out (room for nl_json_len(v) more; pointers into
 * the DOM). *n_asst counts the assistant turns. A "conversations" turn is {"from", "value"}
 * or {"role", "content"} (each turn as it comes). An assistant turn with tool calls may have
 * no content (or null): "". */
static int parse_turns(const loader *L, const nl_json *v, const turn_list *tl, nl_chat_msg *m, int *n_out,
                       int *n_asst) {
    size_t n = nl_json_len(v);
    for (size_t i = 0; i < n; i++) {
        const nl_json *o = nl_json_at(v, i);
        if (!nl_json_is_object(o))
            return lerr(L, o->offset, "%s[%zu] must be an object, found %s", tl->name, i, nl_json_type_name(o->type));
        /* ShareGPT files written by chat tools hold {"role", "content"} turns too */
        const bool sharegpt = tl->sharegpt && !(nl_json_get(o, "role") && !nl_json_get(o, "from"));
        const char *role_key = sharegpt ? tl->role_key : "role", *content_key = sharegpt ? tl->content_key : "content";
        for (size_t k = 0; k < o->u.obj.n; k++) {
            const nl_json_member *mm = &o->u.obj.members[k];
            if (!strcmp(mm->key, role_key) || !strcmp(mm->key, content_key) ||
                (!sharegpt && key_in(mm, turn_extra_keys, sizeof turn_extra_keys / sizeof *turn_extra_keys)))
                continue;
            if (!L->strict) {
                skipped_key(L, mm);
                continue;
            }
            return lerr(L, mm->key_offset,
                        "%s[%zu]: unknown key \"%.60s\" (expected \"%s\" and \"%s\"%s; without"
                        " --strict-keys the keys nightlora does not read are skipped)",
                        tl->name, i, mm->key, role_key, content_key,
                        sharegpt ? "" : ", optionally tool_calls, reasoning_content, name, tool_call_id");
        }
        const nl_json *role = nl_json_get(o, role_key), *content = nl_json_get(o, content_key);
        const bool calls = !sharegpt && turn_tool_calls(o);
        if (!role || (!content && !calls))
            return lerr(L, o->offset, "%s[%zu] needs \"%s\"", tl->name, i, role ? content_key : role_key);
        char what[32];
        snprintf(what, sizeof what, "\"%s\"", role_key);
        if (need_string(L, role, what)) return -1;
        snprintf(what, sizeof what, "\"%s\"", content_key);
        if (content && !(calls && nl_json_is_null(content)) && need_string(L, content, what)) return -1;
        const char *r = turn_role(role, tl->sharegpt);
        if (!r && sharegpt)
            return lerr(L, role->offset,
                        "%s[%zu]: unknown \"from\" \"%.40s\" (expected human, gpt or system; "
                        "user, assistant and tool are taken too)",
                        tl->name, i, role->u.str.s);
        if (!r)
            return lerr(L, role->offset, "%s[%zu]: unknown role \"%.40s\" (expected system, user, assistant or tool)",
                        tl->name, i, role->u.str.s);
        if (calls && r[0] != 'a')
            return lerr(L, nl_json_get(o, "tool_calls")->offset,
                        "%s[%zu]: \"tool_calls\" belong to an assistant message, not"
                        " a %s one",
                        tl->name, i, r);
        if (r[0] == 'a') (*n_asst)++;
        nl_chat_msg *t = &m[(*n_out)++];
        t->role = r;
        t->content = nl_json_is_string(content) ? content->u.str.s : "";
        t->content_len = nl_json_is_string(content) ? content->u.str.len : 0;
        t->extra = sharegpt ? NULL : o;
    }
    return 0;
}

/* ---- one line: its keys, then one function per format, then its targets ---- */

/* A line without a key it needs: the error at its first key no format reads when it has one
 * (a typo such as "completon" is named), else at the line. */
static int missing_key(const loader *L, const nl_json *root, const char *msg) {
    for (size_t i = 0; i < root->u.obj.n; i++) {
        const nl_json_member *m = &root->u.obj.members[i];
        if (!key_in(m, known_keys, sizeof known_keys / sizeof *known_keys))
            return lerr(L, m->key_offset,
                        "%s; the line's \"%.60s\" is no key nightlora reads (a typo? --columns KEY=%.60s reads"
                        " it as KEY)",
                        msg, m->key, m->key);
    }
    return lerr(L, root->offset, "%s", msg);
}

/* A line's members, looked up once (NULL when absent). */
typedef struct {
    const nl_json *root; /* the line's object (under --columns: `view`, its keys renamed) */
    const char *fmt_key; /* the key naming the line's format */
    const nl_json *fv;   /* its value */
    const nl_json *choices, *answer, *completion, *loss_mask, *tools, *input, *output;
    bool trl;                /* TRL's conversational prompt/completion: two message lists */
    nl_json view;            /* --columns: the line's object with its keys renamed */
    nl_json_member *members; /* view's members (malloc'd), NULL without --columns */
} line_keys;

/* --columns: the line's object as `view`, each member named by a mapping's "from" renamed to
 * its "to" (a shallow copy: the values stay in the document). */
static int rename_columns(const loader *L, const nl_json *root, line_keys *k) {
    const size_t n = root->u.obj.n;
    k->members = malloc((n ? n : 1) * sizeof *k->members);
    if (!k->members) return lerr(L, root->offset, "out of memory");
    memcpy(k->members, root->u.obj.members, n * sizeof *k->members);
    for (int c = 0; c < L->n_cols; c++) {
        const nl_json *from = nl_json_get(root, L->cols[c].from), *to = nl_json_get(root, L->cols[c].to);
        if (!from) continue;
        if (to)
            return lerr(L, to->offset, "the line has both \"%s\" and \"%s\", which --columns %s=%s reads as \"%s\"",
                        L->cols[c].to, L->cols[c].from, L->cols[c].to, L->cols[c].from, L->cols[c].to);
        for (size_t i = 0; i < n; i++)
            if (&root->u.obj.members[i].value == from) {
                k->members[i].key = L->cols[c].to;
                k->members[i].key_len = strlen(L->cols[c].to);
            }
    }
    k->view = *root;
    k->view.u.obj.members = k->members;
    k->root = &k->view;
    return 0;
}

/* Keys: only the known ones (unless told to skip the others), exactly one format, and the
 * keys that belong with one format only; sets ex->format. */
static int line_keys_read(const loader *L, const nl_json *root, line_keys *k, nl_example *ex) {
    memset(k, 0, sizeof *k);
    k->root = root;
    if (!nl_json_is_object(root))
        return lerr(L, root->offset, "expected a JSON object, found %s", nl_json_type_name(root->type));
    if (L->n_cols && rename_columns(L, root, k)) return -1;
    root = k->root;
    const char *fmt_key = NULL;
    for (size_t i = 0; i < root->u.obj.n; i++) {
        const nl_json_member *m = &root->u.obj.members[i];
        if (!key_in(m, known_keys, sizeof known_keys / sizeof *known_keys)) {
            if (!L->strict) {
                skipped_key(L, m);
                continue;
            }
            return lerr(L, m->key_offset,
                        "unknown key \"%.60s\" (a line is prompt+completion, messages, conversations,"
                        " instruction [+ input] + output, text or tokens [+ loss_mask], with optional"
                        " choices/answer; without --strict-keys the keys nightlora does not read are"
                        " skipped)",
                        m->key);
        }
        if (key_in(m, format_keys, sizeof format_keys / sizeof *format_keys)) {
            if (fmt_key)
                return lerr(L, m->key_offset, "\"%s\" cannot be combined with \"%s\" on one line", m->key, fmt_key);
            fmt_key = m->key;
        }
    }
    if (!fmt_key)
        return missing_key(L, root,
                           "a line needs one of \"prompt\" (+ \"completion\"), \"messages\", \"conversations\","
                           " \"instruction\" (+ \"output\"), \"text\" or \"tokens\"");
    k->fmt_key = fmt_key;
    k->choices = nl_json_get(root, "choices");
    k->answer = nl_json_get(root, "answer");
    k->completion = nl_json_get(root, "completion");
    k->loss_mask = nl_json_get(root, "loss_mask");
    k->tools = nl_json_get(root, "tools");
    k->input = nl_json_get(root, "input");
    k->output = nl_json_get(root, "output");
    k->fv = nl_json_get(root, fmt_key);
    if (k->completion && strcmp(fmt_key, "prompt") != 0)
        return lerr(L, k->completion->offset, "\"completion\" belongs with \"prompt\", not \"%s\"", fmt_key);
    if (k->loss_mask && strcmp(fmt_key, "tokens") != 0)
        return lerr(L, k->loss_mask->offset, "\"loss_mask\" belongs with \"tokens\", not \"%s\"", fmt_key);
    const nl_json *io = k->input ? k->input : k->output;
    if (io && strcmp(fmt_key, "instruction") != 0)
        return lerr(L, io->offset, "\"%s\" belongs with \"instruction\" (Alpaca), not \"%s\"",
                    k->input ? "input" : "output", fmt_key);
    if (k->answer && !k->choices) return lerr(L, k->answer->offset, "\"answer\" without \"choices\"");
    if (k->tools && !nl_json_is_array(k->tools))
        return lerr(L, k->tools->offset, "\"tools\" must be an array (of function descriptions), found %s",
                    nl_json_type_name(k->tools->type));
    k->trl = !strcmp(fmt_key, "prompt") && nl_json_is_array(k->fv);
    if (!strcmp(fmt_key, "tokens")) ex->format = NL_LINE_TOKENS;
    else if (!strcmp(fmt_key, "prompt") || !strcmp(fmt_key, "instruction"))
        ex->format = k->trl ? NL_LINE_MESSAGES : NL_LINE_PROMPT;
    else if (!strcmp(fmt_key, "messages") || !strcmp(fmt_key, "conversations")) ex->format = NL_LINE_MESSAGES;
    else ex->format = NL_LINE_TEXT;
    if (ex->format != NL_LINE_TOKENS && need_tok(L, k->fv, fmt_key)) return -1;
    if (k->tools && (ex->format != NL_LINE_MESSAGES || !strcmp(fmt_key, "instruction")))
        return lerr(L, k->tools->offset, "\"tools\" belongs with a conversation (\"messages\"), not \"%s\"", fmt_key);
    return 0;
}

/* The "prompt" key's checks (a string prompt, or TRL's message lists) before anything is
 * tokenized. */
static int check_prompt(const loader *L, const line_keys *k) {
    const nl_json *fv = k->fv, *completion = k->completion;
    const bool trl = k->trl;
    if (!trl && need_string(L, fv, "\"prompt\"")) return -1;
    if (!completion && !k->choices) return missing_key(L, k->root, "a \"prompt\" line needs \"completion\"");
    if (completion && trl != nl_json_is_array(completion) &&
        (nl_json_is_string(completion) || nl_json_is_array(completion)))
        return lerr(L, completion->offset,
                    "\"completion\" is a %s but \"prompt\" is a %s: give both as strings, or both as lists"
                    " of {\"role\", \"content\"} messages (TRL's conversational form)",
                    trl ? "string" : "message list", trl ? "message list" : "string");
    if (trl && completion && k->choices)
        return lerr(L, completion->offset,
                    "with \"choices\", a message-list \"prompt\" takes no \"completion\" (the answer is one"
                    " of the choices)");
    if (completion && !trl) {
        if (need_string(L, completion, "\"completion\"")) return -1;
        if (completion->u.str.len == 0)
            return lerr(L, completion->offset, "\"completion\" is empty (nothing to learn)");
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

/* ---- Alpaca: {"instruction", "input", "output"} ----
 * The prompt: the Alpaca template (the Stanford Alpaca release's texts, "### Response:" and a
 * newline as alpaca-lora writes it), or a user turn (instruction, a blank line, input) of the
 * chat template and the output its assistant answer. */

static const char alpaca_head_input[] =
    "Below is an instruction that describes a task, paired with an input that provides further"
    " context. Write a response that appropriately completes the request.\n\n### Instruction:\n";
static const char alpaca_head[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes"
    " the request.\n\n### Instruction:\n";
static const char alpaca_input[] = "\n\n### Input:\n";
static const char alpaca_response[] = "\n\n### Response:\n";

/* 1: the Alpaca template, 2: the chat template; decided at the first Alpaca line. auto: the
 * chat template when one is named or the model has one. */
static int alpaca_mode(loader *L) {
    if (L->alpaca) return L->alpaca;
    const char *o = L->alpaca_opt;
    if (o && !strcmp(o, "alpaca")) L->alpaca = 1;
    else if (o && !strcmp(o, "chat")) L->alpaca = 2;
    else
        L->alpaca =
            (L->tmpl_name && L->tmpl_name[0] && strcmp(L->tmpl_name, "auto")) || nl_tokenizer_chat_template(L->tok) ? 2
                                                                                                                    : 1;
    L->out->alpaca_chat = L->alpaca == 2;
    return L->alpaca;
}

static int cat_text(char **buf, size_t *n, const char *s, size_t len) {
    char *b = realloc(*buf, *n + len + 1);
    if (!b) return -1;
    memcpy(b + *n, s, len);
    *n += len;
    b[*n] = 0;
    *buf = b;
    return 0;
}

static int line_alpaca(loader *L, const line_keys *k, nl_example *ex, nl_tokbuf *b) {
    const nl_json *ins = k->fv, *in = k->input, *outp = k->output, *choices = k->choices;
    if (need_string(L, ins, "\"instruction\"") || (in && need_string(L, in, "\"input\""))) return -1;
    if (!outp && !choices) return missing_key(L, k->root, "an \"instruction\" line needs \"output\"");
    if (outp) {
        if (need_string(L, outp, "\"output\"")) return -1;
        if (choices)
            return lerr(L, outp->offset,
                        "with \"choices\", an \"instruction\" line takes no \"output\" (the answer is one of the"
                        " choices)");
        if (outp->u.str.len == 0) return lerr(L, outp->offset, "\"output\" is empty (nothing to learn)");
    }
    const bool chat = alpaca_mode(L) == 2, has_in = in && in->u.str.len > 0;
    ex->format = chat ? NL_LINE_MESSAGES : NL_LINE_PROMPT;
    if (line_choices(L, k, ex)) return -1;
    char *p = NULL;
    size_t n = 0;
    int rc = -1;
    if (!chat &&
        cat_text(&p, &n, has_in ? alpaca_head_input : alpaca_head, strlen(has_in ? alpaca_head_input : alpaca_head)))
        goto oom;
    if (cat_text(&p, &n, ins->u.str.s, ins->u.str.len)) goto oom;
    if (has_in && (cat_text(&p, &n, chat ? "\n\n" : alpaca_input, chat ? 2 : strlen(alpaca_input)) ||
                   cat_text(&p, &n, in->u.str.s, in->u.str.len)))
        goto oom;
    if (!chat && cat_text(&p, &n, alpaca_response, strlen(alpaca_response))) goto oom;
    if (chat) {
        nl_chat_msg m[2] = {{"user", p, n, NULL},
                            {"assistant", outp ? outp->u.str.s : "", outp ? outp->u.str.len : 0, NULL}};
        if (ensure_template(L, ins->offset)) goto done;
        if (nl_chat_template_tokens(L->tmpl, m, choices ? 1 : 2, NULL, choices != NULL, choices ? 0 : 1, b)) {
            lerr_slot(L, ins->offset);
            goto done;
        }
    } else {
        if (nl_tokbuf_bos(L->tok, b) || nl_tokbuf_text(L->tok, b, p, n, 0)) {
            lerr_slot(L, ins->offset);
            goto done;
        }
        if (!choices) {
            if (tb_json_text(L, b, outp, 1)) goto done;
            int32_t end = nl_token_eos(L->tok) >= 0 ? nl_token_eos(L->tok) : nl_token_eot(L->tok);
            if (end >= 0 && nl_tokbuf_push(b, end, 1)) goto done;
        }
    }
    L->out->n_alpaca++;
    rc = 0;
    goto done;
oom:
    lerr(L, ins->offset, "out of memory");
done:
    free(p);
    return rc;
}

/* ---- tool calls and results: rendered, or refused by name ---- */

/* The position of turn i of a conversation (the TRL completion's after the prompt's). */
static const nl_json *turn_at(const line_keys *k, int i, int n_ctx, const char **list, int *idx) {
    const bool c = k->trl && i >= n_ctx;
    *list = c ? "completion" : k->fmt_key;
    *idx = c ? i - n_ctx : i;
    return nl_json_at(c ? k->completion : k->fv, (size_t)*idx);
}

/* An assistant turn that is a target but has neither content nor a tool call would teach only
 * the turn's end. */
static int empty_targets(const loader *L, const line_keys *k, const nl_chat_msg *msgs, int n_msgs, int n_ctx) {
    for (int i = k->trl ? n_ctx : 0; i < n_msgs; i++) {
        if (msgs[i].role[0] != 'a' || msgs[i].content_len > 0 || (msgs[i].extra && turn_tool_calls(msgs[i].extra)))
            continue;
        const char *list;
        int idx;
        const nl_json *o = turn_at(k, i, n_ctx, &list, &idx);
        return lerr(L, o->offset,
                    "%s[%d]: the assistant message is empty: its target would be only the end of the turn"
                    " (nothing to learn)",
                    list, idx);
    }
    return 0;
}

/* The first turn with tool calls and the first "tool" result must change the rendering: a
 * template that leaves them out (the built-ins, many model templates) is refused by name, so
 * nothing trains on a turn whose call was dropped. */
static int tools_rendered(loader *L, const line_keys *k, const nl_chat_msg *msgs, int n_msgs, int n_ctx) {
    int call = -1, res = -1;
    for (int i = 0; i < n_msgs; i++) {
        if (call < 0 && msgs[i].extra && turn_tool_calls(msgs[i].extra)) call = i;
        if (res < 0 && !strcmp(msgs[i].role, "tool")) res = i;
    }
    if (call < 0 && res < 0) return 0;
    char *full = NULL, *alt = NULL;
    size_t fn = 0, an = 0;
    nl_chat_msg *m2 = malloc((size_t)n_msgs * sizeof *m2);
    nl_json_member *mem = NULL;
    char *c2 = NULL;
    int rc = -1;
    if (!m2) {
        lerr(L, k->fv->offset, "out of memory");
        goto done;
    }
    if (nl_chat_template_text(L->tmpl, msgs, n_msgs, k->tools, false, &full, &fn)) {
        lerr_slot(L, k->fv->offset);
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        const int i = pass ? res : call;
        if (i < 0) continue;
        memcpy(m2, msgs, (size_t)n_msgs * sizeof *m2);
        nl_json view;
        if (!pass) {
            /* the call's turn without its tool_calls */
            const nl_json *o = msgs[i].extra;
            mem = malloc(o->u.obj.n * sizeof *mem);
            if (!mem) {
                lerr(L, o->offset, "out of memory");
                goto done;
            }
            size_t nm = 0;
            for (size_t j = 0; j < o->u.obj.n; j++)
                if (strcmp(o->u.obj.members[j].key, "tool_calls") != 0) mem[nm++] = o->u.obj.members[j];
            view = *o;
            view.u.obj.members = mem;
            view.u.obj.n = nm;
            m2[i].extra = &view;
        } else {
            /* the result's content extended by one byte */
            c2 = malloc(msgs[i].content_len + 2);
            if (!c2) {
                lerr(L, k->fv->offset, "out of memory");
                goto done;
            }
            memcpy(c2, msgs[i].content, msgs[i].content_len);
            c2[msgs[i].content_len] = '\x01';
            c2[msgs[i].content_len + 1] = 0;
            m2[i].content = c2;
            m2[i].content_len = msgs[i].content_len + 1;
        }
        /* a template that fails without the call renders it (it reads it) */
        const int bad = nl_chat_template_text(L->tmpl, m2, n_msgs, k->tools, false, &alt, &an);
        const bool same = !bad && an == fn && memcmp(alt, full, fn) == 0;
        free(alt);
        alt = NULL;
        free(mem);
        mem = NULL;
        free(c2);
        c2 = NULL;
        if (same) {
            const char *list;
            int idx;
            const nl_json *o = turn_at(k, i, n_ctx, &list, &idx);
            lerr(L, o->offset,
                 pass ? "%s[%d]: the chat template (%s) leaves the \"tool\" message's content out: the result would"
                        " not be in what is trained (use a template that renders tool results: the model's own"
                        " tokenizer.chat_template or --template FILE.jinja)"
                      : "%s[%d]: the chat template (%s) does not render \"tool_calls\": the call would be left out"
                        " of what is trained (use a template that renders tool calls: the model's own"
                        " tokenizer.chat_template or --template FILE.jinja)",
                 list, idx, nl_chat_template_desc(L->tmpl));
            goto done;
        }
    }
    rc = 0;
done:
    free(full);
    free(m2);
    return rc;
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
        if (trl)
            lerr(L, completion->offset,
                 "\"completion\" has no assistant message (loss is on the completion's assistant turns: nothing to "
                 "learn)");
        else if (tl.sharegpt) lerr(L, fv->offset, "no \"gpt\" turn (loss is on the assistant turns: nothing to learn)");
        else lerr(L, fv->offset, "no assistant message (loss is on assistant turns: nothing to learn)");
        goto done;
    }
    if (!choices && empty_targets(L, k, msgs, n_msgs, n_ctx)) goto done;
    if (ensure_template(L, fv->offset) || tools_rendered(L, k, msgs, n_msgs, n_ctx)) goto done;
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
            bad = lerr(L, fv->offset,
                       "the chat template renders the prompt's turns differently inside the whole"
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
            if (nl_json_int64(mv, &x) || (x != 0 && x != 1))
                return lerr(L, mv->offset, "loss_mask[%zu] must be 0 or 1", i);
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
        return lerr(
            L, at->offset, "no target tokens (%s)",
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

/* One example from a line's JSON value (a JSONL line, or an element of a JSON array file). */
static int parse_value(loader *L, const nl_json *root, nl_example *ex) {
    nl_tokbuf b = {0};
    line_keys k;
    memset(ex, 0, sizeof *ex);
    ex->line = L->line;
    ex->answer = -1;
    int rc = line_keys_read(L, root, &k, ex);
    if (!rc && !strcmp(k.fmt_key, "instruction")) {
        rc = line_alpaca(L, &k, ex, &b);
    } else if (!rc) {
        switch (ex->format) {
        case NL_LINE_PROMPT: rc = line_prompt(L, &k, ex, &b); break;
        case NL_LINE_TEXT: rc = line_text(L, &k, ex, &b); break;
        case NL_LINE_MESSAGES: rc = line_messages(L, &k, ex, &b); break;
        case NL_LINE_TOKENS: rc = line_tokens(L, &k, ex, &b); break;
        }
    }
    if (!rc) rc = line_finish(L, &k, ex, &b);
    free(k.members);
    nl_tokbuf_free(&b);
    if (rc) example_free(ex);
    return rc;
}

static int parse_line(loader *L, const char *s, size_t len, nl_example *ex) {
    nl_json_error je;
    nl_json *root = nl_json_parse(s, len, &je);
    if (!root) return lerr(L, je.offset, "%s", je.msg);
    int rc = parse_value(L, root, ex);
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

/* --columns "to=from,to=from": each `to` one of the keys a line may hold. */
static int parse_columns(loader *L, const char *spec) {
    const char *p = spec;
    while (p && *p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (!eq || eq == p || eq + 1 == end)
            return nl_err(
                "--columns %s: expected KEY=COLUMN pairs separated by commas (prompt=question,completion=answer)",
                spec);
        const char *to = NULL;
        for (size_t j = 0; j < sizeof known_keys / sizeof *known_keys && !to; j++)
            if (strlen(known_keys[j]) == (size_t)(eq - p) && !memcmp(known_keys[j], p, (size_t)(eq - p)))
                to = known_keys[j];
        if (!to)
            return nl_err("--columns %s: \"%.*s\" is no key of a line (prompt, completion, messages, conversations,"
                          " instruction, input, output, text, tokens, loss_mask, choices, answer, tools)",
                          spec, (int)(eq - p), p);
        const size_t fl = (size_t)(end - eq - 1);
        if (L->n_cols == (int)(sizeof L->cols / sizeof *L->cols) || fl >= sizeof L->cols[0].from)
            return nl_err("--columns %s: at most %zu pairs, each column name under %zu bytes", spec,
                          sizeof L->cols / sizeof *L->cols, sizeof L->cols[0].from);
        for (int c = 0; c < L->n_cols; c++)
            if (L->cols[c].to == to || (strlen(L->cols[c].from) == fl && !memcmp(L->cols[c].from, eq + 1, fl)))
                return nl_err("--columns %s: \"%s\" or \"%.*s\" is named twice", spec, to, (int)fl, eq + 1);
        L->cols[L->n_cols].to = to;
        memcpy(L->cols[L->n_cols].from, eq + 1, fl);
        L->cols[L->n_cols].from[fl] = 0;
        L->n_cols++;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* The next example's slot in out (grown as needed); NULL + error. */
static nl_example *next_slot(nl_dataset *out, int *cap, const char *label) {
    if (out->n == *cap) {
        if (*cap > INT_MAX / 2) {
            nl_err("%s: too many examples", label);
            return NULL;
        }
        int nc = *cap ? *cap * 2 : 256;
        nl_example *ne = realloc(out->ex, (size_t)nc * sizeof *ne);
        if (!ne) {
            nl_err("%s: out of memory", label);
            return NULL;
        }
        out->ex = ne;
        *cap = nc;
    }
    return &out->ex[out->n];
}

static void count_example(nl_dataset *out) {
    out->n_tokens += out->ex[out->n].n_tokens;
    out->n_targets += out->ex[out->n].n_targets;
    out->n++;
}

/* A JSON array file (a JSON export of a data set): each element one example, its line the
 * element's first line. */
static int load_array(loader *L, const char *buf, size_t len, size_t pos, nl_dataset *out) {
    nl_json_error je;
    nl_json *root = nl_json_parse(buf + pos, len - pos, &je);
    L->doc = buf;
    L->doc_len = len;
    L->doc_base = pos;
    if (!root) return lerr(L, je.offset, "%s", je.msg);
    int cap = 0, rc = -1;
    size_t at = 0; /* the offset L->line is counted to */
    L->line = 1;
    for (size_t i = 0; i < nl_json_len(root); i++) {
        const nl_json *v = nl_json_at(root, i);
        for (; at < v->offset; at++) L->line += buf[pos + at] == '\n';
        nl_example *ex = next_slot(out, &cap, L->label);
        if (!ex || parse_value(L, v, ex)) goto done;
        count_example(out);
    }
    rc = 0;
done:
    nl_json_free(root);
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
    L->strict = opts && opts->strict_keys;
    L->alpaca_opt = opts ? opts->alpaca : NULL;
    L->out = out;
    if (L->alpaca_opt && L->alpaca_opt[0] && strcmp(L->alpaca_opt, "auto") && strcmp(L->alpaca_opt, "alpaca") &&
        strcmp(L->alpaca_opt, "chat"))
        return nl_err("--alpaca-prompt %s: expected auto, alpaca or chat", L->alpaca_opt);
    if (opts && parse_columns(L, opts->columns)) return -1;
    out->path = nl_strdup(label);
    if (!out->path) return -1;
    int cap = 0;
    size_t pos = 0;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) {
        pos = 3;
        L->col0 = 3;
    }
    size_t first = pos;
    while (first < len && (buf[first] == ' ' || buf[first] == '\t' || buf[first] == '\r' || buf[first] == '\n'))
        first++;
    if (first < len && buf[first] == '[') {
        /* a JSON array of examples, not JSON Lines */
        if (load_array(L, buf, len, pos, out)) {
            nl_dataset_free(out);
            return -1;
        }
        pos = len;
        out->json_array = 1;
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
            return nl_err("%s:%d: the line is %zu bytes, more than the %d MiB a line may hold (split the example)",
                          label, L->line, lend - pos, NL_DATA_MAX_LINE >> 20);
        }
        if (!blank(buf + pos, lend - pos)) {
            nl_example *ex = next_slot(out, &cap, label);
            if (!ex || parse_line(L, buf + pos, lend - pos, ex)) {
                nl_dataset_free(out);
                return -1;
            }
            count_example(out);
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

/* What the loader decided that a user should know (empty when nothing). */
const char *nl_dataset_note(const nl_dataset *ds, char *buf, size_t cap) {
    int k = 0;
    buf[0] = 0;
    if (ds->json_array) k += snprintf(buf + k, cap - (size_t)k, "read as a JSON array of examples");
    if (ds->n_alpaca && k < (int)cap)
        k += snprintf(buf + k, cap - (size_t)k, "%s%d Alpaca lines, the prompt built with %s", k ? "; " : "",
                      ds->n_alpaca,
                      ds->alpaca_chat
                          ? "the chat template (the instruction and input as the user turn, the output as the"
                            " assistant's; --alpaca-prompt alpaca for the Alpaca template)"
                          : "the Alpaca template (\"Below is an instruction that describes a task ... ### Response:\";"
                            " --alpaca-prompt chat for the chat template)");
    if (ds->n_skipped_keys && k < (int)cap)
        snprintf(buf + k, cap - (size_t)k,
                 "%s%" PRId64 " keys no format reads skipped (the first \"%s\" on line %d; --strict-keys"
                 " refuses them)",
                 k ? "; " : "", ds->n_skipped_keys, ds->skipped_key, ds->skipped_line);
    return buf;
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
        nl_err("%s is a directory, read as train.jsonl / valid.jsonl / test.jsonl, and %s cannot be read: %s", path, f,
               strerror(e));
        free(f);
        return -1;
    }
    *file = f;
    return 0;
}

/* data/dataset: JSONL lines -> examples, chat templates, packing, batch order.
 * The contract (formats, targets, errors, choices) is in dataset.h. */
#include "data/dataset.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json.h"
#include "util/rng.h"
#include "util/util.h"

/* ---- growable token list with target flags ---- */

typedef struct {
    int32_t *ids;
    uint8_t *tgt;
    int n, cap;
} tokbuf;

static void tb_free(tokbuf *b) {
    free(b->ids);
    free(b->tgt);
    memset(b, 0, sizeof *b);
}

static int tb_push(tokbuf *b, int32_t id, uint8_t t) {
    if (b->n == b->cap) {
        if (b->cap > INT_MAX / 2) return nl_err("sequence longer than %d tokens", INT_MAX / 2);
        int cap = b->cap ? b->cap * 2 : 64;
        int32_t *ni = realloc(b->ids, (size_t)cap * sizeof *ni);
        if (!ni) return nl_err("out of memory");
        b->ids = ni;
        uint8_t *nt = realloc(b->tgt, (size_t)cap);
        if (!nt) return nl_err("out of memory");
        b->tgt = nt;
        b->cap = cap;
    }
    b->ids[b->n] = id;
    b->tgt[b->n] = t;
    b->n++;
    return 0;
}

/* Tokenize text (no BOS/EOS, no special-token parsing) and append with flag t. */
static int tb_text(const nl_tokenizer *tok, tokbuf *b, const char *s, size_t len, uint8_t t) {
    if (len == 0) return 0;
    int32_t *ids = NULL;
    int n = 0;
    if (nl_tokenize(tok, s, len, false, false, &ids, &n)) {
        free(ids);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (tb_push(b, ids[i], t)) {
            free(ids);
            return -1;
        }
    free(ids);
    return 0;
}

static int tb_bos(const nl_tokenizer *tok, tokbuf *b) {
    if (nl_tokenizer_add_bos(tok) && nl_token_bos(tok) >= 0) return tb_push(b, nl_token_bos(tok), 0);
    return 0;
}

/* ---- chat templates ---- */

int nl_chat_template_pick(const char *name, const char *gguf_template, nl_chat_tmpl *out) {
    if (name && name[0] && strcmp(name, "auto") != 0) {
        if (strcmp(name, "chatml") == 0) *out = NL_TMPL_CHATML;
        else if (strcmp(name, "llama3") == 0) *out = NL_TMPL_LLAMA3;
        else return nl_err("unknown chat template \"%s\" (known: chatml, llama3)", name);
        return 0;
    }
    if (!gguf_template)
        return nl_err("the model has no chat template (tokenizer.chat_template); name one: chatml or llama3");
    if (strstr(gguf_template, "<|im_start|>")) *out = NL_TMPL_CHATML;
    else if (strstr(gguf_template, "<|start_header_id|>")) *out = NL_TMPL_LLAMA3;
    else
        return nl_err("unrecognised chat template in tokenizer.chat_template (no <|im_start|> or "
                      "<|start_header_id|>); name one: chatml or llama3");
    return 0;
}

const char *nl_chat_template_name(nl_chat_tmpl t) {
    switch (t) {
    case NL_TMPL_CHATML: return "chatml";
    case NL_TMPL_LLAMA3: return "llama3";
    default: return "none";
    }
}

static bool is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void trim(const char **s, size_t *len) {
    while (*len && is_ascii_space(**s)) { (*s)++; (*len)--; }
    while (*len && is_ascii_space((*s)[*len - 1])) (*len)--;
}

typedef struct {
    char *p;
    size_t n, cap;
} strbuf;

static int sb_add(strbuf *b, const char *s, size_t len) {
    if (b->cap - b->n < len + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < len + 1) {
            if (cap > SIZE_MAX / 2) return nl_err("out of memory");
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (!np) return nl_err("out of memory");
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
    return 0;
}
static int sb_str(strbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

int nl_chat_render(nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs, bool add_generation_prompt,
                   char **text, size_t *text_len) {
    strbuf b = {0};
    int rc = sb_add(&b, "", 0);
    if (t != NL_TMPL_CHATML && t != NL_TMPL_LLAMA3) rc = nl_err("nl_chat_render: no template");
    for (int i = 0; i < n_msgs && rc == 0; i++) {
        const char *c = msgs[i].content;
        size_t cl = msgs[i].content_len;
        if (t == NL_TMPL_CHATML) {
            rc = sb_str(&b, "<|im_start|>") || sb_str(&b, msgs[i].role) || sb_str(&b, "\n") ||
                 sb_add(&b, c, cl) || sb_str(&b, "<|im_end|>\n");
        } else {
            trim(&c, &cl);
            rc = sb_str(&b, "<|start_header_id|>") || sb_str(&b, msgs[i].role) ||
                 sb_str(&b, "<|end_header_id|>\n\n") || sb_add(&b, c, cl) || sb_str(&b, "<|eot_id|>");
        }
    }
    if (rc == 0 && add_generation_prompt)
        rc = t == NL_TMPL_CHATML ? sb_str(&b, "<|im_start|>assistant\n")
                                 : sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (rc) {
        free(b.p);
        return -1;
    }
    *text = b.p;
    if (text_len) *text_len = b.n;
    return 0;
}

/* Marker token ids of a template, looked up by their text. */
typedef struct {
    int32_t open, close;   /* chatml: <|im_start|>, <|im_end|>; llama3: header start/end */
    int32_t eot;           /* llama3: <|eot_id|>; chatml: = close */
} tmpl_ids;

static int tmpl_lookup(const nl_tokenizer *tok, const char *tmpl, const char *text, int32_t *id) {
    *id = nl_token_lookup(tok, text);
    if (*id < 0)
        return nl_err("chat template %s needs the token %s, which the vocabulary lacks", tmpl, text);
    return 0;
}

static int tmpl_ids_get(const nl_tokenizer *tok, nl_chat_tmpl t, tmpl_ids *ti) {
    if (t == NL_TMPL_CHATML) {
        if (tmpl_lookup(tok, "chatml", "<|im_start|>", &ti->open) ||
            tmpl_lookup(tok, "chatml", "<|im_end|>", &ti->close))
            return -1;
        ti->eot = ti->close;
        return 0;
    }
    if (t == NL_TMPL_LLAMA3)
        return tmpl_lookup(tok, "llama3", "<|start_header_id|>", &ti->open) ||
                       tmpl_lookup(tok, "llama3", "<|end_header_id|>", &ti->close) ||
                       tmpl_lookup(tok, "llama3", "<|eot_id|>", &ti->eot)
                   ? -1
                   : 0;
    return nl_err("no chat template");
}

/* Header of one turn: chatml "<|im_start|>{role}\n", llama3 "<|start_header_id|>{role}<|end_header_id|>\n\n". */
static int chat_header(const nl_tokenizer *tok, nl_chat_tmpl t, const tmpl_ids *ti, const char *role,
                       tokbuf *b) {
    if (tb_push(b, ti->open, 0)) return -1;
    if (t == NL_TMPL_CHATML) {
        /* role + "\n" is one text fragment between markers, tokenized together. */
        char hdr[32];
        int n = snprintf(hdr, sizeof hdr, "%s\n", role);
        if (n < 0 || (size_t)n >= sizeof hdr) return nl_err("role name too long");
        return tb_text(tok, b, hdr, (size_t)n, 0);
    }
    return tb_text(tok, b, role, strlen(role), 0) || tb_push(b, ti->close, 0) ||
                   tb_text(tok, b, "\n\n", 2, 0)
               ? -1
               : 0;
}

/* The default system turn of the model's own ChatML template: a template that tests
 * messages[0]['role'] and holds a string literal '<|im_start|>system' + newline + TEXT +
 * '<|im_end|>' renders that turn when the conversation does not open with a system message
 * (SmolLM2: "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n
 * You are a helpful AI assistant named SmolLM, ...<|im_end|>\n' }}"; Qwen2.5 likewise), as
 * HF's apply_chat_template and llama.cpp's Jinja mode do. Only for the family the GGUF's own
 * template is (a chatml override on a Llama-3 model gets none). Jinja escapes \n, \t, \', \"
 * and \\ in TEXT are decoded. 1 + *text (malloc'd) when there is one, 0 when not, -1 on OOM. */
static int default_system(const nl_tokenizer *tok, nl_chat_tmpl t, char **text, size_t *len) {
    const char *g = nl_tokenizer_chat_template(tok);
    nl_chat_tmpl own;
    if (t != NL_TMPL_CHATML || !g || nl_chat_template_pick(NULL, g, &own) || own != t) return 0;
    if (!strstr(g, "messages[0]['role']") && !strstr(g, "messages[0][\"role\"]")) return 0;
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(g, head); p; p = strstr(p + 1, head)) {
        const char q = p > g ? p[-1] : 0; /* the literal's quote */
        if (q != '\'' && q != '"') continue;
        const char *c = p + sizeof head - 1;
        if (*c == '\n') c++;
        else if (c[0] == '\\' && c[1] == 'n') c += 2;
        else continue;
        const char *end = c;
        while (*end && *end != q && strncmp(end, "<|im_end|>", 10) != 0) end += end[0] == '\\' && end[1] ? 2 : 1;
        if (strncmp(end, "<|im_end|>", 10) != 0) continue; /* e.g. '<|im_start|>system\n' + content */
        char *out = malloc((size_t)(end - c) + 1);
        if (!out) return nl_err("out of memory");
        size_t n = 0;
        for (const char *r = c; r < end; r++) {
            if (*r == '\\' && r + 1 < end) {
                r++;
                out[n++] = *r == 'n' ? '\n' : *r == 't' ? '\t' : *r;
            } else {
                out[n++] = *r;
            }
        }
        out[n] = 0;
        *text = out;
        *len = n;
        return 1;
    }
    return 0;
}

/* Appends a conversation; assistant content + end-of-turn get flag `asst_target`. */
static int chat_tokens(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                       bool add_generation_prompt, uint8_t asst_target, tokbuf *b) {
    tmpl_ids ti;
    if (tmpl_ids_get(tok, t, &ti) || tb_bos(tok, b)) return -1;
    if (n_msgs == 0 || strcmp(msgs[0].role, "system") != 0) {
        char *sys = NULL;
        size_t sl = 0;
        int has = default_system(tok, t, &sys, &sl);
        if (has < 0) return -1;
        int rc = has ? chat_header(tok, t, &ti, "system", b) || tb_text(tok, b, sys, sl, 0) ||
                           tb_push(b, ti.close, 0) || tb_text(tok, b, "\n", 1, 0)
                     : 0;
        free(sys);
        if (rc) return -1;
    }
    for (int i = 0; i < n_msgs; i++) {
        uint8_t tg = strcmp(msgs[i].role, "assistant") == 0 ? asst_target : 0;
        const char *c = msgs[i].content;
        size_t cl = msgs[i].content_len;
        if (chat_header(tok, t, &ti, msgs[i].role, b)) return -1;
        if (t == NL_TMPL_CHATML) {
            if (tb_text(tok, b, c, cl, tg) || tb_push(b, ti.close, tg) || tb_text(tok, b, "\n", 1, 0))
                return -1;
        } else {
            trim(&c, &cl);
            if (tb_text(tok, b, c, cl, tg) || tb_push(b, ti.eot, tg)) return -1;
        }
    }
    if (add_generation_prompt && chat_header(tok, t, &ti, "assistant", b)) return -1;
    return 0;
}

int nl_chat_tokenize(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                     bool add_generation_prompt, int32_t **ids, uint8_t **target, int *n_ids) {
    tokbuf b = {0};
    if (chat_tokens(tok, t, msgs, n_msgs, add_generation_prompt, 1, &b)) {
        tb_free(&b);
        return -1;
    }
    if (b.n > 0) b.tgt[0] = 0;
    *ids = b.ids;
    if (target) *target = b.tgt;
    else free(b.tgt);
    *n_ids = b.n;
    return 0;
}

int nl_chat_prompt_tokens(const nl_tokenizer *tok, const char *tmpl_name, const char *user,
                          size_t user_len, int32_t **ids, int *n_ids) {
    nl_chat_tmpl t;
    if (nl_chat_template_pick(tmpl_name, nl_tokenizer_chat_template(tok), &t)) return -1;
    nl_chat_msg m = {"user", user, user_len};
    return nl_chat_tokenize(tok, t, &m, 1, true, ids, NULL, n_ids);
}

/* ---- JSONL loader ---- */

typedef struct {
    const char *label;
    int line;
    size_t col0;           /* bytes before the line's parsed text (the BOM on line 1) */
    const nl_tokenizer *tok;
    int n_vocab;           /* 0: unchecked */
    const char *tmpl_name;
    nl_chat_tmpl tmpl;     /* NL_TMPL_NONE until the first messages line */
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

static const char *const known_keys[] = {"prompt", "completion", "messages", "text",
                                         "tokens", "loss_mask", "choices", "answer"};

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
static int tb_json_text(const loader *L, tokbuf *b, const nl_json *v, uint8_t t) {
    if (tb_text(L->tok, b, v->u.str.s, v->u.str.len, t)) return lerr_slot(L, v->offset);
    return 0;
}

static int ensure_template(loader *L, size_t off) {
    if (L->tmpl != NL_TMPL_NONE) return 0;
    nl_chat_tmpl t;
    tmpl_ids ti;
    if (nl_chat_template_pick(L->tmpl_name, nl_tokenizer_chat_template(L->tok), &t) ||
        tmpl_ids_get(L->tok, t, &ti))
        return lerr_slot(L, off);
    L->tmpl = t;
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
        tokbuf b = {0};
        if (fmt == NL_LINE_TOKENS) {
            if (!nl_json_is_array(c))
                return lerr(L, c->offset, "choices[%zu] of a tokens line must be an array of token ids, found %s",
                            i, nl_json_type_name(c->type));
            for (size_t k = 0; k < nl_json_len(c); k++) {
                int32_t id;
                if (token_id(L, nl_json_at(c, k), "choice", k, &id) || tb_push(&b, id, 1)) {
                    tb_free(&b);
                    return -1;
                }
            }
        } else {
            char what[32];
            snprintf(what, sizeof what, "choices[%zu]", i);
            if (need_string(L, c, what) || tb_json_text(L, &b, c, 1)) {
                tb_free(&b);
                return -1;
            }
        }
        if (b.n == 0) {
            tb_free(&b);
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

/* Messages -> nl_chat_msg array (pointers into the DOM). *last_role_asst set. */
static int parse_messages(const loader *L, const nl_json *msgs, nl_chat_msg **out, int *n_out,
                          int *n_asst, bool *last_asst) {
    if (!nl_json_is_array(msgs))
        return lerr(L, msgs->offset, "\"messages\" must be an array, found %s", nl_json_type_name(msgs->type));
    size_t n = nl_json_len(msgs);
    if (n == 0) return lerr(L, msgs->offset, "\"messages\" is empty");
    if (n > 100000) return lerr(L, msgs->offset, "\"messages\" has too many entries");
    nl_chat_msg *m = calloc(n, sizeof *m);
    if (!m) return lerr(L, msgs->offset, "out of memory");
    *n_asst = 0;
    for (size_t i = 0; i < n; i++) {
        const nl_json *o = nl_json_at(msgs, i);
        if (!nl_json_is_object(o)) {
            free(m);
            return lerr(L, o->offset, "messages[%zu] must be an object, found %s", i, nl_json_type_name(o->type));
        }
        for (size_t k = 0; k < o->u.obj.n; k++) {
            const nl_json_member *mm = &o->u.obj.members[k];
            if (strcmp(mm->key, "role") != 0 && strcmp(mm->key, "content") != 0) {
                free(m);
                return lerr(L, mm->key_offset, "messages[%zu]: unknown key \"%s\" (expected \"role\" and \"content\")",
                            i, mm->key);
            }
        }
        const nl_json *role = nl_json_get(o, "role"), *content = nl_json_get(o, "content");
        if (!role || !content) {
            free(m);
            return lerr(L, o->offset, "messages[%zu] needs \"%s\"", i, role ? "content" : "role");
        }
        if (need_string(L, role, "\"role\"") || need_string(L, content, "\"content\"")) {
            free(m);
            return -1;
        }
        const char *r = NULL;
        if (role->u.str.len == 6 && memcmp(role->u.str.s, "system", 6) == 0) r = "system";
        else if (role->u.str.len == 4 && memcmp(role->u.str.s, "user", 4) == 0) r = "user";
        else if (role->u.str.len == 9 && memcmp(role->u.str.s, "assistant", 9) == 0) r = "assistant";
        if (!r) {
            free(m);
            return lerr(L, role->offset, "messages[%zu]: unknown role \"%.40s\" (expected system, user or assistant)",
                        i, role->u.str.s);
        }
        if (r[0] == 'a') (*n_asst)++;
        m[i].role = r;
        m[i].content = content->u.str.s;
        m[i].content_len = content->u.str.len;
    }
    *last_asst = m[n - 1].role[0] == 'a';
    *out = m;
    *n_out = (int)n;
    return 0;
}

static int parse_line(loader *L, const char *s, size_t len, nl_example *ex) {
    nl_json_error je;
    nl_json *root = nl_json_parse(s, len, &je);
    if (!root) return lerr(L, je.offset, "%s", je.msg);
    int rc = -1;
    tokbuf b = {0};
    nl_chat_msg *msgs = NULL;
    memset(ex, 0, sizeof *ex);
    ex->line = L->line;
    ex->answer = -1;

    if (!nl_json_is_object(root)) {
        lerr(L, root->offset, "expected a JSON object, found %s", nl_json_type_name(root->type));
        goto done;
    }
    /* Keys: only the known ones, and exactly one format. */
    const char *fmt_key = NULL;
    for (size_t k = 0; k < root->u.obj.n; k++) {
        const nl_json_member *m = &root->u.obj.members[k];
        bool known = false;
        for (size_t j = 0; j < sizeof known_keys / sizeof *known_keys; j++)
            if (strcmp(m->key, known_keys[j]) == 0 && strlen(known_keys[j]) == m->key_len) known = true;
        if (!known) {
            lerr(L, m->key_offset, "unknown key \"%.60s\" (a line is prompt+completion, messages, text or tokens"
                                   " [+ loss_mask], with optional choices/answer)", m->key);
            goto done;
        }
        bool is_fmt = !strcmp(m->key, "prompt") || !strcmp(m->key, "messages") ||
                      !strcmp(m->key, "text") || !strcmp(m->key, "tokens");
        if (is_fmt) {
            if (fmt_key) {
                lerr(L, m->key_offset, "\"%s\" cannot be combined with \"%s\" on one line", m->key, fmt_key);
                goto done;
            }
            fmt_key = m->key;
        }
    }
    if (!fmt_key) {
        lerr(L, root->offset, "a line needs one of \"prompt\" (+ \"completion\"), \"messages\", \"text\" or \"tokens\"");
        goto done;
    }
    const nl_json *choices = nl_json_get(root, "choices");
    const nl_json *answer = nl_json_get(root, "answer");
    const nl_json *completion = nl_json_get(root, "completion");
    const nl_json *loss_mask = nl_json_get(root, "loss_mask");
    const nl_json *fv = nl_json_get(root, fmt_key);
    if (completion && strcmp(fmt_key, "prompt") != 0) {
        lerr(L, completion->offset, "\"completion\" belongs with \"prompt\", not \"%s\"", fmt_key);
        goto done;
    }
    if (loss_mask && strcmp(fmt_key, "tokens") != 0) {
        lerr(L, loss_mask->offset, "\"loss_mask\" belongs with \"tokens\", not \"%s\"", fmt_key);
        goto done;
    }
    if (answer && !choices) {
        lerr(L, answer->offset, "\"answer\" without \"choices\"");
        goto done;
    }
    if (!strcmp(fmt_key, "tokens")) ex->format = NL_LINE_TOKENS;
    else if (!strcmp(fmt_key, "prompt")) ex->format = NL_LINE_PROMPT;
    else if (!strcmp(fmt_key, "messages")) ex->format = NL_LINE_MESSAGES;
    else ex->format = NL_LINE_TEXT;
    if (ex->format != NL_LINE_TOKENS && need_tok(L, fv, fmt_key)) goto done;

    /* Type checks of the format's own values before anything is tokenized. */
    if (ex->format == NL_LINE_PROMPT) {
        if (need_string(L, fv, "\"prompt\"")) goto done;
        if (!completion && !choices) {
            lerr(L, root->offset, "a \"prompt\" line needs \"completion\"");
            goto done;
        }
        if (completion) {
            if (need_string(L, completion, "\"completion\"")) goto done;
            if (completion->u.str.len == 0) {
                lerr(L, completion->offset, "\"completion\" is empty (nothing to learn)");
                goto done;
            }
        }
    } else if (ex->format == NL_LINE_TEXT) {
        if (need_string(L, fv, "\"text\"")) goto done;
        if (fv->u.str.len == 0) {
            lerr(L, fv->offset, "\"text\" is empty");
            goto done;
        }
    } else if (ex->format == NL_LINE_TOKENS) {
        if (!nl_json_is_array(fv)) {
            lerr(L, fv->offset, "\"tokens\" must be an array of token ids, found %s", nl_json_type_name(fv->type));
            goto done;
        }
        if (nl_json_len(fv) == 0) {
            lerr(L, fv->offset, "\"tokens\" is empty");
            goto done;
        }
        if (nl_json_len(fv) > (size_t)INT_MAX / 2) {
            lerr(L, fv->offset, "\"tokens\" is too long");
            goto done;
        }
        if (loss_mask) {
            if (choices) {
                lerr(L, loss_mask->offset, "\"loss_mask\" cannot be used with \"choices\"");
                goto done;
            }
            if (!nl_json_is_array(loss_mask)) {
                lerr(L, loss_mask->offset, "\"loss_mask\" must be an array of 0/1, found %s",
                     nl_json_type_name(loss_mask->type));
                goto done;
            }
            if (nl_json_len(loss_mask) != nl_json_len(fv)) {
                lerr(L, loss_mask->offset, "\"loss_mask\" has %zu entries but \"tokens\" has %zu",
                     nl_json_len(loss_mask), nl_json_len(fv));
                goto done;
            }
        }
    }
    if (choices && parse_choices(L, root, choices, ex->format, ex)) goto done;

    /* Build the sequence: context, then (choices) the correct answer or the format's targets. */
    switch (ex->format) {
    case NL_LINE_PROMPT:
        if (tb_bos(L->tok, &b) || tb_json_text(L, &b, fv, 0)) goto done;
        if (!choices) {
            if (tb_json_text(L, &b, completion, 1)) goto done;
            int32_t end = nl_token_eos(L->tok) >= 0 ? nl_token_eos(L->tok) : nl_token_eot(L->tok);
            if (end >= 0 && tb_push(&b, end, 1)) goto done;
        }
        break;
    case NL_LINE_TEXT:
        if (tb_bos(L->tok, &b) || tb_json_text(L, &b, fv, choices ? 0 : 1)) goto done;
        break;
    case NL_LINE_MESSAGES: {
        int n_msgs = 0, n_asst = 0;
        bool last_asst = false;
        if (parse_messages(L, fv, &msgs, &n_msgs, &n_asst, &last_asst)) goto done;
        if (choices && last_asst) {
            lerr(L, fv->offset, "with \"choices\", the conversation must not end with an assistant message");
            goto done;
        }
        if (!choices && n_asst == 0) {
            lerr(L, fv->offset, "no assistant message (loss is on assistant turns: nothing to learn)");
            goto done;
        }
        if (ensure_template(L, fv->offset)) goto done;
        if (chat_tokens(L->tok, L->tmpl, msgs, n_msgs, choices != NULL, choices ? 0 : 1, &b)) {
            lerr_slot(L, fv->offset);
            goto done;
        }
        break;
    }
    case NL_LINE_TOKENS:
        for (size_t i = 0; i < nl_json_len(fv); i++) {
            int32_t id;
            uint8_t t = choices ? 0 : 1;
            if (token_id(L, nl_json_at(fv, i), "tokens", i, &id)) goto done;
            if (loss_mask) {
                const nl_json *mv = nl_json_at(loss_mask, i);
                int64_t x;
                if (nl_json_int64(mv, &x) || (x != 0 && x != 1)) {
                    lerr(L, mv->offset, "loss_mask[%zu] must be 0 or 1", i);
                    goto done;
                }
                t = (uint8_t)x;
            }
            if (tb_push(&b, id, t)) {
                lerr_slot(L, fv->offset);
                goto done;
            }
        }
        break;
    }
    if (choices) {
        ex->n_prompt = b.n;
        for (int i = 0; i < ex->choice_len[ex->answer]; i++)
            if (tb_push(&b, ex->choice_ids[ex->answer][i], 1)) {
                lerr_slot(L, choices->offset);
                goto done;
            }
    }
    /* the first token has nothing before it: it is never a target */
    const int first_was_target = b.n > 0 && b.tgt[0];
    if (b.n > 0) b.tgt[0] = 0;
    int nt = 0;
    for (int i = 0; i < b.n; i++) nt += b.tgt[i];
    if (nt == 0) {
        const nl_json *at = ex->format == NL_LINE_PROMPT && completion ? completion : choices ? choices : fv;
        lerr(L, at->offset, "no target tokens (%s)",
             first_was_target && b.n == 1 && (choices || ex->format == NL_LINE_PROMPT)
                 ? "the only target is the first token of the sequence, with nothing before it to predict it from: "
                   "give a non-empty prompt; this model adds no BOS token"
             : ex->format == NL_LINE_TEXT   ? "the text is a single token: nothing to predict"
             : ex->format == NL_LINE_TOKENS ? "loss_mask selects no token after the first, or only one token"
                                            : "the completion produced no tokens");
        goto done;
    }
    ex->ids = b.ids;
    ex->target = b.tgt;
    ex->n_tokens = b.n;
    ex->n_targets = nt;
    memset(&b, 0, sizeof b);
    rc = 0;
done:
    free(msgs);
    tb_free(&b);
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

int nl_dataset_load_buffer(const char *buf, size_t len, const char *label, const nl_tokenizer *tok,
                           const nl_data_opts *opts, nl_dataset *out) {
    memset(out, 0, sizeof *out);
    if (!label) label = "<data>";
    loader L = {0};
    L.label = label;
    L.tok = tok;
    L.n_vocab = tok ? nl_tokenizer_n_vocab(tok) : (opts ? opts->n_vocab : 0);
    L.tmpl_name = opts ? opts->chat_template : NULL;
    out->path = nl_strdup(label);
    if (!out->path) return -1;
    int cap = 0;
    size_t pos = 0;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) {
        pos = 3;
        L.col0 = 3;
    }
    while (pos < len) {
        if (L.line == INT_MAX) {
            nl_dataset_free(out);
            return nl_err("%s: too many lines", label);
        }
        L.line++;
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t lend = end;
        if (lend > pos && buf[lend - 1] == '\r') lend--;
        /* bounded before it is parsed: a JSON tree and the tokens of one huge line can take
         * many times its size */
        if (lend - pos > NL_DATA_MAX_LINE) {
            nl_dataset_free(out);
            return nl_err("%s:%d: the line is %zu bytes, more than the %d MiB a line may hold (split the example)", label, L.line,
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
            if (parse_line(&L, buf + pos, lend - pos, &out->ex[out->n])) {
                nl_dataset_free(out);
                return -1;
            }
            out->n_tokens += out->ex[out->n].n_tokens;
            out->n_targets += out->ex[out->n].n_targets;
            out->n++;
        }
        pos = end + 1;
        L.col0 = 0;
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

/* ---- packing ---- */

void nl_packing_free(nl_packing *p) {
    if (!p) return;
    free(p->seq);
    memset(p, 0, sizeof *p);
}

void nl_row_targets(const int32_t *ids, const uint8_t *target, int n, int32_t *rows) {
    for (int t = 0; t + 1 < n; t++) rows[t] = target[t + 1] ? ids[t + 1] : -1;
    if (n > 0) rows[n - 1] = -1;
}

int nl_example_targets_within(const nl_example *ex, int max_ctx) {
    if (ex->n_tokens <= max_ctx) return ex->n_targets;
    int nt = 0;
    for (int i = 0; i < max_ctx; i++) nt += ex->target[i];
    return nt;
}

int nl_pack(const nl_dataset *ds, const int *buckets, int n_buckets, int max_ctx, nl_overlong policy,
            nl_packing *out) {
    memset(out, 0, sizeof *out);
    if (max_ctx < 2) return nl_err("context length %d is too small (at least 2)", max_ctx);
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] < 1 || (i > 0 && buckets[i] <= buckets[i - 1]))
            return nl_err("token buckets must be positive and ascending (bucket %d = %d)", i, buckets[i]);
    out->seq = calloc(ds->n ? (size_t)ds->n : 1, sizeof *out->seq);
    if (!out->seq) return nl_err("out of memory");
    for (int e = 0; e < ds->n; e++) {
        const nl_example *ex = &ds->ex[e];
        int n = ex->n_tokens, nt = ex->n_targets;
        if (n > max_ctx) {
            if (policy == NL_OVERLONG_REFUSE) {
                nl_packing_free(out);
                return nl_err("%s:%d:1: example has %d tokens, more than the context of %d "
                              "(shorten it, raise the context or truncate)", ds->path, ex->line, n, max_ctx);
            }
            n = max_ctx;
            nt = nl_example_targets_within(ex, max_ctx);
            if (nt == 0) {
                out->n_dropped++;
                continue;
            }
            out->n_truncated++;
        }
        int bucket = max_ctx;
        for (int i = 0; i < n_buckets; i++)
            if (buckets[i] >= n && buckets[i] <= max_ctx) {
                bucket = buckets[i];
                break;
            }
        nl_seq *s = &out->seq[out->n++];
        s->ids = ex->ids;
        s->target = ex->target;
        s->n_tokens = n;
        s->n_targets = nt;
        s->bucket = bucket;
        s->example = e;
    }
    if (out->n == 0) {
        nl_packing_free(out);
        return nl_err("%s: no example has a target token within the context of %d", ds->path, max_ctx);
    }
    return 0;
}

/* Counter-based hash (the splitmix64 step: add γ, then mix), so position k of epoch e never
 * depends on how many numbers were drawn before: any cursor can be resumed directly. */
static uint64_t mix64(uint64_t x) { return nl_rng_mix64(x + NL_RNG_GAMMA); }

void nl_data_order(int n, uint64_t seed, int64_t epoch, bool shuffle, int *perm) {
    for (int k = 0; k < n; k++) perm[k] = k;
    if (!shuffle) return;
    uint64_t key = mix64(mix64(seed ^ 0x6E6C2D6461746131ULL) ^ (uint64_t)epoch);
    for (int i = n - 1; i > 0; i--) {
        /* Modulo bias is < n / 2^64: irrelevant. */
        int j = (int)(mix64(key ^ (uint64_t)i) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

struct nl_batcher {
    const nl_packing *p;
    uint64_t seed;
    bool shuffle;
    int batch_tokens;
    int *perm;            /* order of perm_epoch */
    int64_t perm_epoch;   /* -1: none yet */
    nl_data_cursor cur;
    int *out;             /* indices of the last batch */
};

nl_batcher *nl_batcher_new(const nl_packing *p, uint64_t seed, bool shuffle, int batch_tokens) {
    if (!p || p->n <= 0) {
        nl_err("nl_batcher_new: no sequences");
        return NULL;
    }
    if (batch_tokens < 1) {
        nl_err("batch tokens must be at least 1 (got %d)", batch_tokens);
        return NULL;
    }
    nl_batcher *b = nl_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->p = p;
    b->seed = seed;
    b->shuffle = shuffle;
    b->batch_tokens = batch_tokens;
    b->perm = nl_malloc((size_t)p->n * sizeof *b->perm);
    b->out = nl_malloc((size_t)p->n * sizeof *b->out);
    if (!b->perm || !b->out) {
        nl_batcher_free(b);
        return NULL;
    }
    b->perm_epoch = -1;
    return b;
}

void nl_batcher_free(nl_batcher *b) {
    if (!b) return;
    free(b->perm);
    free(b->out);
    free(b);
}

int nl_batcher_seek(nl_batcher *b, nl_data_cursor cur) {
    if (cur.epoch < 0 || cur.index < 0 || cur.index > b->p->n)
        return nl_err("data cursor (epoch %lld, index %lld) is outside the data (%d sequences)",
                      (long long)cur.epoch, (long long)cur.index, b->p->n);
    if (cur.index == b->p->n) {
        cur.epoch++;
        cur.index = 0;
    }
    b->cur = cur;
    return 0;
}

nl_data_cursor nl_batcher_cursor(const nl_batcher *b) { return b->cur; }

int nl_batcher_next(nl_batcher *b, const int **seq_idx, int *n_seq) {
    const nl_packing *p = b->p;
    if (b->perm_epoch != b->cur.epoch) {
        nl_data_order(p->n, b->seed, b->cur.epoch, b->shuffle, b->perm);
        b->perm_epoch = b->cur.epoch;
    }
    int k = 0;
    int64_t tokens = 0;
    while (b->cur.index < p->n) {
        int s = b->perm[b->cur.index];
        int t = p->seq[s].n_tokens;
        if (k > 0 && tokens + t > b->batch_tokens) break;
        b->out[k++] = s;
        tokens += t;
        b->cur.index++;
        if (tokens >= b->batch_tokens) break;
    }
    if (b->cur.index >= p->n) {
        b->cur.epoch++;
        b->cur.index = 0;
    }
    *seq_idx = b->out;
    *n_seq = k;
    return 0;
}

/* data/template: the chat templates (ChatML, Llama-3) as text and as tokens, and the growable
 * token list they fill (tokbuf.h). The contract is in dataset.h. */
#include "data/tokbuf.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "util/util.h"

/* ---- growable token list with target flags ---- */

void nl_tokbuf_free(nl_tokbuf *b) {
    free(b->ids);
    free(b->tgt);
    memset(b, 0, sizeof *b);
}

int nl_tokbuf_push(nl_tokbuf *b, int32_t id, uint8_t t) {
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

int nl_tokbuf_text(const nl_tokenizer *tok, nl_tokbuf *b, const char *s, size_t len, uint8_t t) {
    if (len == 0) return 0;
    int32_t *ids = NULL;
    int n = 0;
    if (nl_tokenize(tok, s, len, false, false, &ids, &n)) {
        free(ids);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (nl_tokbuf_push(b, ids[i], t)) {
            free(ids);
            return -1;
        }
    free(ids);
    return 0;
}

int nl_tokbuf_bos(const nl_tokenizer *tok, nl_tokbuf *b) {
    if (nl_tokenizer_add_bos(tok) && nl_token_bos(tok) >= 0) return nl_tokbuf_push(b, nl_token_bos(tok), 0);
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

static int tmpl_lookup(const nl_tokenizer *tok, const char *tmpl, const char *text, int32_t *id) {
    *id = nl_token_lookup(tok, text);
    if (*id < 0)
        return nl_err("chat template %s needs the token %s, which the vocabulary lacks", tmpl, text);
    return 0;
}

int nl_tmpl_ids_get(const nl_tokenizer *tok, nl_chat_tmpl t, nl_tmpl_ids *ti) {
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
static int chat_header(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_tmpl_ids *ti, const char *role,
                       nl_tokbuf *b) {
    if (nl_tokbuf_push(b, ti->open, 0)) return -1;
    if (t == NL_TMPL_CHATML) {
        /* role + "\n" is one text fragment between markers, tokenized together. */
        char hdr[32];
        int n = snprintf(hdr, sizeof hdr, "%s\n", role);
        if (n < 0 || (size_t)n >= sizeof hdr) return nl_err("role name too long");
        return nl_tokbuf_text(tok, b, hdr, (size_t)n, 0);
    }
    return nl_tokbuf_text(tok, b, role, strlen(role), 0) || nl_tokbuf_push(b, ti->close, 0) ||
                   nl_tokbuf_text(tok, b, "\n\n", 2, 0)
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

int nl_chat_tokens(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                   bool add_generation_prompt, uint8_t asst_target, nl_tokbuf *b) {
    nl_tmpl_ids ti;
    if (nl_tmpl_ids_get(tok, t, &ti) || nl_tokbuf_bos(tok, b)) return -1;
    if (n_msgs == 0 || strcmp(msgs[0].role, "system") != 0) {
        char *sys = NULL;
        size_t sl = 0;
        int has = default_system(tok, t, &sys, &sl);
        if (has < 0) return -1;
        int rc = has ? chat_header(tok, t, &ti, "system", b) || nl_tokbuf_text(tok, b, sys, sl, 0) ||
                           nl_tokbuf_push(b, ti.close, 0) || nl_tokbuf_text(tok, b, "\n", 1, 0)
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
            if (nl_tokbuf_text(tok, b, c, cl, tg) || nl_tokbuf_push(b, ti.close, tg) || nl_tokbuf_text(tok, b, "\n", 1, 0))
                return -1;
        } else {
            trim(&c, &cl);
            if (nl_tokbuf_text(tok, b, c, cl, tg) || nl_tokbuf_push(b, ti.eot, tg)) return -1;
        }
    }
    if (add_generation_prompt && chat_header(tok, t, &ti, "assistant", b)) return -1;
    return 0;
}

int nl_chat_tokenize(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs,
                     bool add_generation_prompt, int32_t **ids, uint8_t **target, int *n_ids) {
    nl_tokbuf b = {0};
    if (nl_chat_tokens(tok, t, msgs, n_msgs, add_generation_prompt, 1, &b)) {
        nl_tokbuf_free(&b);
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

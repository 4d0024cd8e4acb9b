/* data/template: the chat templates as text and as tokens (the GGUF's own or a file's, through
 * the Jinja interpreter; the built-in ChatML and Llama-3), and the growable token list they
 * fill (tokbuf.h). The contract is in dataset.h. */
#include "data/tokbuf.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/jinja.h"
#include "util/json.h"
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

static bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void trim(const char **s, size_t *len) {
    while (*len && is_ascii_space(**s)) {
        (*s)++;
        (*len)--;
    }
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

int nl_chat_render(nl_chat_tmpl t, const nl_chat_msg *msgs, int n_msgs, bool add_generation_prompt, char **text,
                   size_t *text_len) {
    strbuf b = {0};
    int rc = sb_add(&b, "", 0);
    if (t != NL_TMPL_CHATML && t != NL_TMPL_LLAMA3) rc = nl_err("nl_chat_render: no template");
    for (int i = 0; i < n_msgs && rc == 0; i++) {
        const char *c = msgs[i].content;
        size_t cl = msgs[i].content_len;
        if (t == NL_TMPL_CHATML) {
            rc = sb_str(&b, "<|im_start|>") || sb_str(&b, msgs[i].role) || sb_str(&b, "\n") || sb_add(&b, c, cl) ||
                 sb_str(&b, "<|im_end|>\n");
        } else {
            trim(&c, &cl);
            rc = sb_str(&b, "<|start_header_id|>") || sb_str(&b, msgs[i].role) || sb_str(&b, "<|end_header_id|>\n\n") ||
                 sb_add(&b, c, cl) || sb_str(&b, "<|eot_id|>");
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
    if (*id < 0) return nl_err("chat template %s needs the token %s, which the vocabulary lacks", tmpl, text);
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
static int chat_header(const nl_tokenizer *tok, nl_chat_tmpl t, const nl_tmpl_ids *ti, const char *role, nl_tokbuf *b) {
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
            if (nl_tokbuf_text(tok, b, c, cl, tg) || nl_tokbuf_push(b, ti.close, tg) ||
                nl_tokbuf_text(tok, b, "\n", 1, 0))
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

int nl_chat_prompt_tokens(const nl_tokenizer *tok, const char *tmpl_name, const char *user, size_t user_len,
                          int32_t **ids, int *n_ids) {
    nl_chat_template *ct;
    if (nl_chat_template_open(tok, tmpl_name, &ct)) return -1;
    nl_chat_msg m = {"user", user, user_len, NULL};
    int rc = nl_chat_template_tokenize(ct, &m, 1, NULL, true, ids, NULL, n_ids);
    nl_chat_template_free(ct);
    return rc;
}

/* ---- the template object: a built-in or a Jinja template ---- */

typedef struct {
    const char *s; /* the token's text (borrowed from the tokenizer) */
    size_t n;
    int32_t id;
} ctl_text;

struct nl_chat_template {
    const nl_tokenizer *tok; /* borrowed */
    nl_chat_tmpl builtin;    /* NL_TMPL_NONE: jinja */
    nl_jinja *jinja;
    char *desc;
    ctl_text *ctl; /* control tokens by text, sorted by (first byte, length desc) */
    int n_ctl;
    int first[257]; /* ctl index range by first byte: [first[c], first[c+1]) */
};

static bool is_builtin_name(const char *name) { return !strcmp(name, "chatml") || !strcmp(name, "llama3"); }
static bool is_auto(const char *name) { return !name || !name[0] || !strcmp(name, "auto"); }

/* Not a built-in's name: a file path when it looks like one (a '/', a ".jinja" end) or exists. */
static bool looks_like_file(const char *name) {
    size_t n = strlen(name);
    if (strchr(name, '/') || (n > 6 && !strcmp(name + n - 6, ".jinja"))) return true;
    FILE *f = fopen(name, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static int unknown_name(const char *name) {
    return nl_err("unknown chat template \"%s\" (known: chatml, llama3; or a FILE.jinja)", name);
}

/* A Jinja text parsed; a parse error gets a hint on what overrides it. */
static nl_jinja *parse_tmpl(const char *src, size_t len, const char *label, bool own) {
    nl_jinja *j = nl_jinja_parse(src, len, label);
    if (!j && own) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        nl_err("%s (--template chatml, llama3 or FILE.jinja renders with another template)", msg);
    }
    return j;
}

static int probe(const nl_chat_template *ct, bool own);

int nl_chat_template_check(const char *name) {
    if (is_auto(name) || is_builtin_name(name)) return 0;
    if (!looks_like_file(name)) return unknown_name(name);
    size_t len;
    char *src = nl_read_file(name, &len);
    if (!src) return -1;
    nl_jinja *j = parse_tmpl(src, len, name, false);
    free(src);
    if (!j) return -1;
    nl_chat_template ct = {.jinja = j};
    int rc = probe(&ct, false);
    nl_jinja_free(j);
    return rc;
}

static int ctl_cmp(const void *pa, const void *pb) {
    const ctl_text *a = pa, *b = pb;
    unsigned char ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->n != b->n) return a->n > b->n ? -1 : 1; /* longest first: the longest match wins */
    return a->id < b->id ? -1 : a->id > b->id;
}

static int build_ctl(nl_chat_template *ct) {
    int nv = nl_tokenizer_n_vocab(ct->tok);
    ct->ctl = nl_calloc((size_t)(nv > 0 ? nv : 1), sizeof *ct->ctl);
    if (!ct->ctl) return -1;
    for (int32_t id = 0; id < nv; id++) {
        size_t n;
        const char *s = nl_token_piece(ct->tok, id, &n);
        if (s && n > 0 && nl_token_is_control(ct->tok, id)) ct->ctl[ct->n_ctl++] = (ctl_text){s, n, id};
    }
    qsort(ct->ctl, (size_t)ct->n_ctl, sizeof *ct->ctl, ctl_cmp);
    int k = 0;
    for (int c = 0; c <= 256; c++) {
        while (k < ct->n_ctl && (unsigned char)ct->ctl[k].s[0] < c) k++;
        ct->first[c] = k;
    }
    return 0;
}

int nl_chat_template_open(const nl_tokenizer *tok, const char *name, nl_chat_template **out) {
    *out = NULL;
    nl_chat_template *ct = nl_calloc(1, sizeof *ct);
    if (!ct) return -1;
    ct->tok = tok;
    if (!is_auto(name) && is_builtin_name(name)) {
        nl_tmpl_ids ti;
        if (nl_chat_template_pick(name, NULL, &ct->builtin) || nl_tmpl_ids_get(tok, ct->builtin, &ti) ||
            !(ct->desc = nl_strdup(name)))
            goto fail;
        *out = ct;
        return 0;
    }
    if (!is_auto(name)) {
        if (!looks_like_file(name)) {
            unknown_name(name);
            goto fail;
        }
        size_t len;
        char *src = nl_read_file(name, &len);
        if (!src) goto fail;
        ct->jinja = parse_tmpl(src, len, name, false);
        free(src);
        if (!ct->jinja || !(ct->desc = nl_strdup(name))) goto fail;
    } else {
        const char *g = nl_tokenizer_chat_template(tok);
        if (!g) {
            nl_err("the model has no chat template (tokenizer.chat_template); name one: chatml, llama3 or FILE.jinja");
            goto fail;
        }
        ct->jinja = parse_tmpl(g, strlen(g), "tokenizer.chat_template", true);
        if (!ct->jinja || !(ct->desc = nl_strdup("tokenizer.chat_template"))) goto fail;
    }
    if (build_ctl(ct)) goto fail;
    *out = ct;
    return 0;
fail:
    nl_chat_template_free(ct);
    return -1;
}

void nl_chat_template_free(nl_chat_template *ct) {
    if (!ct) return;
    nl_jinja_free(ct->jinja);
    free(ct->ctl);
    free(ct->desc);
    free(ct);
}

const char *nl_chat_template_desc(const nl_chat_template *ct) { return ct->desc; }

#define ROLE_FLAG 255 /* a role's bytes; a content's are 1, a sentinel's 2..251 */

/* The template's variables, as transformers passes them: messages, tools (none when absent),
 * documents (none), add_generation_prompt, and the tokenizer's bos_token / eos_token texts.
 * sentinel: every assistant message's content gets one byte more, '\x01' flagged 2 + (its
 * ordinal among the assistant messages % 250), where its content ends in the rendering
 * (jinja_spans). */
static nl_jv *jinja_vars(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools,
                         bool gen, bool sentinel) {
    nl_jv *v = nl_jv_dict(), *list = nl_jv_list();
    if (!v || !list) goto fail;
    int n_asst = 0;
    for (int i = 0; i < n_msgs; i++) {
        nl_jv *m = nl_jv_dict();
        if (!m || nl_jv_push(list, m)) goto fail;
        nl_jv *content;
        if (sentinel && !strcmp(msgs[i].role, "assistant")) {
            size_t n = msgs[i].content_len;
            char *c = nl_malloc(n + 1);
            uint8_t *f = c ? nl_malloc(n + 1) : NULL;
            if (!f) {
                free(c);
                goto fail;
            }
            memcpy(c, msgs[i].content, n);
            memset(f, 1, n);
            c[n] = '\x01';
            f[n] = (uint8_t)(2 + n_asst++ % 250);
            content = nl_jv_str_flags(c, n + 1, f);
            free(c);
            free(f);
        } else {
            content = nl_jv_str(msgs[i].content, msgs[i].content_len, true);
        }
        /* the role: data too, flagged ROLE_FLAG (a header is told from a content by it) */
        uint8_t rf[32];
        size_t rl = strlen(msgs[i].role);
        memset(rf, ROLE_FLAG, sizeof rf);
        nl_jv *role = rl <= sizeof rf ? nl_jv_str_flags(msgs[i].role, rl, rf) : nl_jv_str(msgs[i].role, rl, true);
        if (nl_jv_set(m, "role", role) || nl_jv_set(m, "content", content)) goto fail;
        const nl_json *x = msgs[i].extra;
        for (size_t k = 0; x && x->type == NL_JSON_OBJECT && k < x->u.obj.n; k++) {
            const nl_json_member *mm = &x->u.obj.members[k];
            if (!strcmp(mm->key, "role") || !strcmp(mm->key, "content") || strlen(mm->key) != mm->key_len) continue;
            if (nl_jv_set(m, mm->key, nl_jv_from_json(&mm->value))) goto fail;
        }
    }
    if (nl_jv_set(v, "messages", list)) {
        list = NULL;
        goto fail;
    }
    list = NULL;
    if (nl_jv_set(v, "tools", tools ? nl_jv_from_json(tools) : nl_jv_none()) ||
        nl_jv_set(v, "documents", nl_jv_none()) || nl_jv_set(v, "add_generation_prompt", nl_jv_bool(gen)))
        goto fail;
    const struct {
        const char *key;
        int32_t id;
    } sp[] = {{"bos_token", ct->tok ? nl_token_bos(ct->tok) : -1}, {"eos_token", ct->tok ? nl_token_eos(ct->tok) : -1}};
    for (size_t k = 0; k < 2; k++) {
        size_t n;
        const char *s = sp[k].id >= 0 ? nl_token_piece(ct->tok, sp[k].id, &n) : NULL;
        if (s && nl_jv_set(v, sp[k].key, nl_jv_str(s, n, false))) goto fail;
    }
    return v;
fail:
    nl_jv_unref(list);
    nl_jv_unref(v);
    return NULL;
}

/* The bytes of a JSON value's strings plus 16 per value: the size of what a template sees. */
static size_t json_weight(const nl_json *j) {
    if (!j) return 0;
    size_t w = 16;
    switch (j->type) {
    case NL_JSON_STRING: w += j->u.str.len; break;
    case NL_JSON_ARRAY:
        for (size_t i = 0; i < j->u.arr.n; i++) w += json_weight(&j->u.arr.items[i]);
        break;
    case NL_JSON_OBJECT:
        for (size_t i = 0; i < j->u.obj.n; i++)
            w += j->u.obj.members[i].key_len + json_weight(&j->u.obj.members[i].value);
        break;
    default: break;
    }
    return w;
}

/* A rendering's budget grows with the conversation it renders: the default (8 MiB, 2M operations:
 * a bomb in a template stops there in ~0.2 s) plus 16 bytes and 64 operations per byte of the
 * messages (64 bytes a message, its other fields and the tools counted too). */
static nl_jinja_limits render_limits(const nl_chat_msg *msgs, int n_msgs, const nl_json *tools) {
    size_t w = json_weight(tools);
    for (int i = 0; i < n_msgs; i++) w += 64 + msgs[i].content_len + json_weight(msgs[i].extra);
    return (nl_jinja_limits){.mem_bytes = ((size_t)8 << 20) + 16 * w, .ops = 2000000u + 64 * (uint64_t)w};
}

static int jinja_render_s(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools,
                          bool gen, bool sentinel, char **text, size_t *len, uint8_t **flags) {
    nl_jv *v = jinja_vars(ct, msgs, n_msgs, tools, gen, sentinel);
    if (!v) return -1;
    nl_jinja_limits lim = render_limits(msgs, n_msgs, tools);
    int rc = nl_jinja_render_ex(ct->jinja, v, &lim, text, len, flags);
    nl_jv_unref(v);
    return rc;
}

static int jinja_render(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools, bool gen,
                        char **text, size_t *len, uint8_t **flags) {
    return jinja_render_s(ct, msgs, n_msgs, tools, gen, false, text, len, flags);
}

int nl_chat_template_text(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools,
                          bool add_generation_prompt, char **text, size_t *len) {
    if (!ct->jinja) return nl_chat_render(ct->builtin, msgs, n_msgs, add_generation_prompt, text, len);
    return jinja_render(ct, msgs, n_msgs, tools, add_generation_prompt, text, len, NULL);
}

/* A bomb in a template (jinja.h's budget) found before any work: one rendering of a small
 * conversation (system, user, assistant, user, the generation prompt) with the default budget.
 * Only a budget that runs out fails it: a template may refuse this conversation on purpose
 * (raise_exception) or use what the interpreter lacks, and is then judged when it renders. */
static int probe(const nl_chat_template *ct, bool own) {
    static const nl_chat_msg conv[] = {{"system", "You are a probe.", 16, NULL},
                                       {"user", "Hello", 5, NULL},
                                       {"assistant", "Hi.", 3, NULL},
                                       {"user", "Bye", 3, NULL}};
    for (int n = 4; n >= 3; n--) { /* with the system turn, and without it (from the user's) */
        const nl_chat_msg *m = n == 4 ? conv : conv + 1;
        nl_jv *v = jinja_vars(ct, m, n == 4 ? 4 : 3, NULL, true, false);
        if (!v) return -1;
        char *text = NULL;
        int rc = nl_jinja_render_ex(ct->jinja, v, NULL, &text, NULL, NULL);
        nl_jv_unref(v);
        free(text);
        if (rc == NL_JINJA_OVER_BUDGET) {
            char msg[900];
            snprintf(msg, sizeof msg, "%s", nl_last_error());
            return nl_err("%s (found rendering a 4-turn probe conversation%s)", msg,
                          own ? " at load; --template chatml, llama3 or FILE.jinja renders with another template" : "");
        }
        if (rc == 0) return 0;
    }
    return 0;
}

int nl_chat_template_probe(const nl_tokenizer *tok) {
    const char *g = nl_tokenizer_chat_template(tok);
    if (!g) return 0;
    nl_chat_template ct = {.tok = tok, .jinja = nl_jinja_parse(g, strlen(g), "tokenizer.chat_template")};
    if (!ct.jinja) return 0; /* judged when a command renders with it (the error names it then) */
    int rc = probe(&ct, true);
    nl_jinja_free(ct.jinja);
    return rc;
}

/* The control token whose text starts at s (template bytes only: flags all 0), longest first;
 * -1 when none. */
static int match_ctl(const nl_chat_template *ct, const char *s, const uint8_t *fl, size_t n, size_t *len) {
    unsigned char c = (unsigned char)s[0];
    for (int k = ct->first[c]; k < ct->first[c + 1]; k++) {
        const ctl_text *t = &ct->ctl[k];
        if (t->n > n || memcmp(s, t->s, t->n) != 0) continue;
        bool tmpl = true;
        for (size_t j = 0; j < t->n && tmpl; j++) tmpl = fl[j] == 0;
        if (!tmpl) continue;
        *len = t->n;
        return k;
    }
    return -1;
}

static size_t common_prefix(const char *a, size_t an, const char *b, size_t bn) {
    size_t k = 0;
    while (k < an && k < bn && a[k] == b[k]) k++;
    while (k > 0 && k < an && ((unsigned char)a[k] & 0xC0) == 0x80) k--; /* a character boundary */
    return k;
}

typedef struct {
    size_t s, e;
} span;

/* Where assistant message i's span starts by rendering (see dataset.h): where messages[0..i)
 * with the generation prompt stops agreeing with the whole rendering. */
static int exact_start(const nl_chat_template *ct, const nl_chat_msg *msgs, int i, const nl_json *tools, const char *r,
                       size_t rn, size_t *s) {
    char *g = NULL;
    size_t gn = 0;
    if (jinja_render(ct, msgs, i, tools, true, &g, &gn, NULL)) return -1;
    *s = common_prefix(r, rn, g, gn);
    free(g);
    return 0;
}

/* Where its content ends by rendering: where a rendering with that content extended departs. */
static int exact_content_end(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, int i,
                             const nl_json *tools, const char *r, size_t rn, size_t *c) {
    nl_chat_msg *m2 = nl_malloc((size_t)n_msgs * sizeof *m2);
    char *c2 = m2 ? nl_malloc(msgs[i].content_len + 2) : NULL;
    if (!c2) {
        free(m2);
        return -1;
    }
    memcpy(m2, msgs, (size_t)n_msgs * sizeof *m2);
    memcpy(c2, msgs[i].content, msgs[i].content_len);
    c2[msgs[i].content_len] = '\x01';
    c2[msgs[i].content_len + 1] = 0;
    m2[i].content = c2;
    m2[i].content_len = msgs[i].content_len + 1;
    char *r2 = NULL;
    size_t r2n = 0;
    int rc = jinja_render(ct, m2, n_msgs, tools, false, &r2, &r2n, NULL);
    free(m2);
    free(c2);
    if (rc) return -1;
    *c = common_prefix(r, rn, r2, r2n);
    free(r2);
    return 0;
}

/* The span's end from its content's end c: after the first control token the template emits
 * from there; without one, up to where the rendering through this message departs. */
static int span_end(const nl_chat_template *ct, const nl_chat_msg *msgs, int i, const nl_json *tools, const char *r,
                    size_t rn, const uint8_t *fl, size_t s, size_t c, size_t *end) {
    size_t e = rn;
    for (size_t p = c; p < rn; p++) {
        size_t l;
        if (fl[p] == 0 && match_ctl(ct, r + p, fl + p, rn - p, &l) >= 0) {
            e = p + l;
            break;
        }
    }
    if (e == rn) {
        /* no control token ends the turn (a vocabulary without it): up to where the rendering
         * of the conversation through this message departs, when that is past the content */
        char *h = NULL;
        size_t hn = 0;
        if (jinja_render(ct, msgs, i + 1, tools, false, &h, &hn, NULL)) return -1;
        size_t hp = common_prefix(r, rn, h, hn);
        free(h);
        if (hp > c) e = hp;
        while (e > s && (r[e - 1] == '\n' || r[e - 1] == ' ')) e--;
    }
    *end = e;
    return 0;
}

/* The loss span of assistant message i, every part by rendering (3 renderings of up to the
 * whole conversation: quadratic over a conversation; jinja_spans avoids it). */
static int assistant_span(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, int i, const nl_json *tools,
                          const char *r, size_t rn, const uint8_t *fl, span *out) {
    size_t s, c;
    if (exact_start(ct, msgs, i, tools, r, rn, &s) || exact_content_end(ct, msgs, n_msgs, i, tools, r, rn, &c))
        return -1;
    if (c >= rn || c < s) c = s; /* the content is not rendered (a tool call alone) */
    out->s = s;
    return span_end(ct, msgs, i, tools, r, rn, fl, s, c, &out->e);
}

static bool exact_only; /* nl_chat_template_exact_spans: the tests' reference */
void nl_chat_template_exact_spans(bool on) { exact_only = on; }

/* Every assistant message's content end from one more rendering (jinja_vars' sentinel): that
 * rendering is the whole one with a flagged '\x01' after each assistant content (and whatever
 * data bytes the template kept before it, e.g. trailing spaces a `trim` removed only without
 * it). Walking both: where they depart is a content's end (the departure the extended
 * rendering of dataset.h's rule finds), data bytes then the sentinel are skipped, and the walk
 * goes on. c[k] for assistant ordinal k; false when the renderings do not line up that way
 * (a template that renders a content twice, out of order, or its length): the caller then
 * renders per message. */
static bool sentinel_ends(const char *r, size_t rn, const char *r2, const uint8_t *f2, size_t r2n, int n_asst,
                          size_t *c) {
    size_t p = 0, q = 0;
    int k = 0;
    while (q < r2n) {
        if (p < rn && r[p] == r2[q] && !(r2[q] == '\x01' && f2[q] >= 2)) {
            p++;
            q++;
            continue;
        }
        size_t j = q;
        while (j < r2n && f2[j] == 1) j++; /* data bytes, then the sentinel */
        if (j >= r2n || r2[j] != '\x01' || f2[j] < 2 || k >= n_asst || f2[j] != 2 + k % 250) return false;
        size_t cp = p;
        while (cp > 0 && cp < rn && ((unsigned char)r[cp] & 0xC0) == 0x80) cp--; /* a character boundary */
        c[k++] = cp;
        q = j + 1;
    }
    return p == rn && k == n_asst;
}

/* The loss spans of all assistant messages in the rendering (r, rn, fl), in linear time where
 * the template allows: the first one by rendering; its generation prompt's text D (what the
 * prompt rendering adds); every later one starts after the last D (template or role bytes) before its
 * content, which must be the first one's start too; the contents' ends from one sentinel
 * rendering. Whatever does not line up is found per message by rendering (assistant_span). */
static int jinja_spans(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools, bool gen,
                       const char *r, size_t rn, const uint8_t *fl, span *sp, int *n_sp) {
    int n_asst = 0, first = -1;
    for (int i = 0; i < n_msgs; i++)
        if (!strcmp(msgs[i].role, "assistant")) {
            if (first < 0) first = i;
            n_asst++;
        }
    *n_sp = 0;
    if (!n_asst) return 0;
    int rc = -1;
    size_t *c = NULL;
    char *r2 = NULL, *a = NULL, *b = NULL;
    uint8_t *f2 = NULL;
    size_t r2n = 0, an = 0, bn = 0, dn = 0;
    const char *d = NULL;
    bool fast = !exact_only && n_asst > 1;
    if (fast) {
        /* the generation prompt: with and without it, over the messages before the first assistant */
        if (jinja_render(ct, msgs, first, tools, true, &a, &an, NULL) ||
            jinja_render(ct, msgs, first, tools, false, &b, &bn, NULL))
            goto done;
        size_t k = 0;
        while (k < an && k < bn && a[k] == b[k]) k++;
        d = a + k;
        dn = an - k;
        c = nl_malloc((size_t)n_asst * sizeof *c);
        if (!c || jinja_render_s(ct, msgs, n_msgs, tools, gen, true, &r2, &r2n, &f2)) goto done;
        fast = dn > 0 && sentinel_ends(r, rn, r2, f2, r2n, n_asst, c);
    }
    int k = 0;
    size_t lo = 0; /* the previous content's end: a D is looked for after it */
    for (int i = 0; i < n_msgs; i++) {
        if (strcmp(msgs[i].role, "assistant") != 0) continue;
        span x;
        bool done_fast = false;
        if (fast) {
            /* the last D of template bytes that ends at or before the content's end */
            size_t s = SIZE_MAX;
            for (size_t e = c[k]; e >= lo + dn && s == SIZE_MAX; e--) {
                size_t st = e - dn;
                if (memcmp(r + st, d, dn) != 0) continue;
                bool tmpl = true;
                for (size_t j = st; j < e && tmpl; j++) tmpl = fl[j] == 0 || fl[j] == ROLE_FLAG; /* not a content's */
                if (tmpl) s = e;
            }
            if (s != SIZE_MAX && k == 0 && common_prefix(r, rn, a, an) != s)
                fast = false; /* the first one: the rule itself (a) says where it starts; D must agree */
            if (fast && s != SIZE_MAX) {
                size_t cc = c[k];
                if (cc >= rn || cc < s) cc = s;
                x.s = s;
                if (span_end(ct, msgs, i, tools, r, rn, fl, s, cc, &x.e)) goto done;
                done_fast = true;
            }
            lo = c[k];
        }
        if (!done_fast && assistant_span(ct, msgs, n_msgs, i, tools, r, rn, fl, &x)) goto done;
        k++;
        sp[*n_sp] = x;
        if (*n_sp > 0 && sp[*n_sp].s < sp[*n_sp - 1].e) sp[*n_sp].s = sp[*n_sp - 1].e;
        if (sp[*n_sp].e > sp[*n_sp].s) (*n_sp)++;
    }
    rc = 0;
done:
    free(c);
    free(r2);
    free(f2);
    free(a);
    free(b);
    return rc;
}

/* Appends the text r[a, b) tokenized (no special parsing), target flag t. */
static int piece(const nl_chat_template *ct, nl_tokbuf *b, const char *r, size_t a, size_t e, uint8_t t) {
    return nl_tokbuf_text(ct->tok, b, r + a, e - a, t);
}

static int jinja_tokens(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools, bool gen,
                        uint8_t asst_target, nl_tokbuf *b) {
    char *r = NULL;
    uint8_t *fl = NULL;
    size_t rn = 0;
    span *sp = NULL;
    int n_sp = 0, rc = -1;
    if (jinja_render(ct, msgs, n_msgs, tools, gen, &r, &rn, &fl)) return -1;
    if (asst_target) {
        sp = nl_calloc((size_t)n_msgs + 1, sizeof *sp);
        if (!sp || jinja_spans(ct, msgs, n_msgs, tools, gen, r, rn, fl, sp, &n_sp)) goto done;
    }
    /* BOS: the template's own; the tokenizer's first only when it adds one and the
     * rendering does not start with it */
    int32_t bos = nl_token_bos(ct->tok);
    if (nl_tokenizer_add_bos(ct->tok) && bos >= 0) {
        size_t l;
        int k = rn ? match_ctl(ct, r, fl, rn, &l) : -1;
        if ((k < 0 || ct->ctl[k].id != bos) && nl_tokbuf_push(b, bos, 0)) goto done;
    }
    size_t a = 0;
    int si = 0; /* the first span not yet passed */
    for (size_t p = 0; p < rn;) {
        while (si < n_sp && sp[si].e <= p) si++;
        bool in = si < n_sp && sp[si].s <= p;
        size_t l;
        int k = fl[p] == 0 ? match_ctl(ct, r + p, fl + p, rn - p, &l) : -1;
        if (k >= 0) {
            if ((p > a && piece(ct, b, r, a, p, in ? asst_target : 0)) ||
                nl_tokbuf_push(b, ct->ctl[k].id, in ? asst_target : 0))
                goto done;
            p += l;
            a = p;
            continue;
        }
        p++;
        /* a span boundary ends a piece */
        bool cut = si < n_sp && (p == sp[si].s || p == sp[si].e);
        if (cut) {
            if (piece(ct, b, r, a, p, in ? asst_target : 0)) goto done;
            a = p;
        }
    }
    if (rn > a) {
        while (si < n_sp && sp[si].e <= a) si++;
        bool in = si < n_sp && sp[si].s <= a;
        if (piece(ct, b, r, a, rn, in ? asst_target : 0)) goto done;
    }
    rc = 0;
done:
    free(sp);
    free(r);
    free(fl);
    return rc;
}

int nl_chat_template_tokens(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools,
                            bool add_generation_prompt, uint8_t asst_target, nl_tokbuf *b) {
    if (!ct->jinja) return nl_chat_tokens(ct->tok, ct->builtin, msgs, n_msgs, add_generation_prompt, asst_target, b);
    return jinja_tokens(ct, msgs, n_msgs, tools, add_generation_prompt, asst_target, b);
}

int nl_chat_template_tokenize(const nl_chat_template *ct, const nl_chat_msg *msgs, int n_msgs, const nl_json *tools,
                              bool add_generation_prompt, int32_t **ids, uint8_t **target, int *n_ids) {
    nl_tokbuf b = {0};
    if (nl_chat_template_tokens(ct, msgs, n_msgs, tools, add_generation_prompt, 1, &b)) {
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

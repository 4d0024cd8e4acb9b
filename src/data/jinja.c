/* data/jinja: lexer, parser to a tree, and an evaluator over reference-counted values. The
 * contract (what is covered, how whitespace and errors behave) is in jinja.h. */
#include "data/jinja.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define MAX_DEPTH 200      /* nesting of the parser and of macro calls */
#define MAX_OUTPUT (1u << 30)
#define MAX_STEPS 200000000 /* loop iterations + calls: a template cannot spin for ever */

/* ================================ values ================================ */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC, V_METHOD } vtype;

struct node;

struct nl_jv {
    vtype type;
    int rc;
    union {
        bool b;
        int64_t i;
        double f;
        struct { char *s; uint8_t *taint; size_t n; } s;  /* taint NULL: no data byte */
        struct { nl_jv **v; size_t n, cap; } l;
        struct { nl_jv **k; nl_jv **v; size_t n, cap; } d; /* keys are strings (V_DICT, V_NS) */
        const struct node *macro;
        int func;                                       /* builtin id */
        struct { nl_jv *self; const char *name; } m;    /* bound method */
        const char *undef;                              /* the name that was looked up */
    } u;
};

static nl_jv *jv_new(vtype t) {
    nl_jv *v = nl_calloc(1, sizeof *v);
    if (v) {
        v->type = t;
        v->rc = 1;
    }
    return v;
}
static nl_jv *ref(nl_jv *v) {
    if (v) v->rc++;
    return v;
}
void nl_jv_unref(nl_jv *v) {
    if (!v || --v->rc > 0) return;
    switch (v->type) {
    case V_STR: free(v->u.s.s); free(v->u.s.taint); break;
    case V_LIST:
        for (size_t i = 0; i < v->u.l.n; i++) nl_jv_unref(v->u.l.v[i]);
        free(v->u.l.v);
        break;
    case V_DICT:
    case V_NS:
        for (size_t i = 0; i < v->u.d.n; i++) {
            nl_jv_unref(v->u.d.k[i]);
            nl_jv_unref(v->u.d.v[i]);
        }
        free(v->u.d.k);
        free(v->u.d.v);
        break;
    case V_METHOD: nl_jv_unref(v->u.m.self); break;
    default: break;
    }
    free(v);
}

nl_jv *nl_jv_none(void) { return jv_new(V_NONE); }
nl_jv *nl_jv_bool(bool b) {
    nl_jv *v = jv_new(V_BOOL);
    if (v) v->u.b = b;
    return v;
}
nl_jv *nl_jv_int(int64_t i) {
    nl_jv *v = jv_new(V_INT);
    if (v) v->u.i = i;
    return v;
}
static nl_jv *jv_float(double f) {
    nl_jv *v = jv_new(V_FLOAT);
    if (v) v->u.f = f;
    return v;
}
static nl_jv *jv_undef(const char *name) {
    nl_jv *v = jv_new(V_UNDEF);
    if (v) v->u.undef = name;
    return v;
}
/* A string from bytes and optional taint flags (copied). */
static nl_jv *jv_strt(const char *s, size_t n, const uint8_t *taint) {
    nl_jv *v = jv_new(V_STR);
    if (!v) return NULL;
    v->u.s.s = nl_malloc(n + 1);
    if (!v->u.s.s) {
        free(v);
        return NULL;
    }
    if (n) memcpy(v->u.s.s, s, n);
    v->u.s.s[n] = 0;
    v->u.s.n = n;
    if (taint) {
        bool any = false;
        for (size_t i = 0; i < n && !any; i++) any = taint[i] != 0;
        if (any) {
            v->u.s.taint = nl_malloc(n);
            if (!v->u.s.taint) {
                nl_jv_unref(v);
                return NULL;
            }
            memcpy(v->u.s.taint, taint, n);
        }
    }
    return v;
}
nl_jv *nl_jv_str(const char *s, size_t n, bool data) {
    nl_jv *v = jv_strt(s, n, NULL);
    if (v && data && n) {
        v->u.s.taint = nl_malloc(n);
        if (!v->u.s.taint) {
            nl_jv_unref(v);
            return NULL;
        }
        memset(v->u.s.taint, 1, n);
    }
    return v;
}
static nl_jv *jv_cstr(const char *s) { return jv_strt(s, strlen(s), NULL); }
nl_jv *nl_jv_list(void) { return jv_new(V_LIST); }
nl_jv *nl_jv_dict(void) { return jv_new(V_DICT); }

int nl_jv_push(nl_jv *l, nl_jv *v) {
    if (!v) return -1;
    if (l->u.l.n == l->u.l.cap) {
        size_t cap = l->u.l.cap ? l->u.l.cap * 2 : 4;
        nl_jv **nv = realloc(l->u.l.v, cap * sizeof *nv);
        if (!nv) {
            nl_jv_unref(v);
            return nl_err("out of memory");
        }
        l->u.l.v = nv;
        l->u.l.cap = cap;
    }
    l->u.l.v[l->u.l.n++] = v;
    return 0;
}

static bool str_eq(const nl_jv *a, const char *s, size_t n) {
    return a->type == V_STR && a->u.s.n == n && memcmp(a->u.s.s, s, n) == 0;
}

static nl_jv *dict_getn(const nl_jv *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->u.d.n; i++)
        if (str_eq(d->u.d.k[i], k, n)) return d->u.d.v[i];
    return NULL;
}

/* Set key (a string value, a new reference taken) to v (taken). */
static int dict_setv(nl_jv *d, nl_jv *key, nl_jv *v) {
    if (!key || !v) {
        nl_jv_unref(key);
        nl_jv_unref(v);
        return -1;
    }
    for (size_t i = 0; i < d->u.d.n; i++)
        if (str_eq(d->u.d.k[i], key->u.s.s, key->u.s.n)) {
            nl_jv_unref(d->u.d.v[i]);
            d->u.d.v[i] = v;
            nl_jv_unref(key);
            return 0;
        }
    if (d->u.d.n == d->u.d.cap) {
        size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 4;
        nl_jv **nk = realloc(d->u.d.k, cap * sizeof *nk);
        if (nk) d->u.d.k = nk;
        nl_jv **nv = nk ? realloc(d->u.d.v, cap * sizeof *nv) : NULL;
        if (!nv) {
            nl_jv_unref(key);
            nl_jv_unref(v);
            return nl_err("out of memory");
        }
        d->u.d.v = nv;
        d->u.d.cap = cap;
    }
    d->u.d.k[d->u.d.n] = key;
    d->u.d.v[d->u.d.n++] = v;
    return 0;
}
int nl_jv_set(nl_jv *d, const char *key, nl_jv *v) { return dict_setv(d, jv_cstr(key), v); }

nl_jv *nl_jv_from_json(const nl_json *j) {
    switch (j->type) {
    case NL_JSON_NULL: return nl_jv_none();
    case NL_JSON_FALSE: return nl_jv_bool(false);
    case NL_JSON_TRUE: return nl_jv_bool(true);
    case NL_JSON_NUMBER: return j->u.num.is_int ? nl_jv_int(j->u.num.i) : jv_float(j->u.num.d);
    case NL_JSON_STRING: return nl_jv_str(j->u.str.s, j->u.str.len, true);
    case NL_JSON_ARRAY: {
        nl_jv *l = nl_jv_list();
        for (size_t i = 0; l && i < j->u.arr.n; i++)
            if (nl_jv_push(l, nl_jv_from_json(&j->u.arr.items[i]))) {
                nl_jv_unref(l);
                return NULL;
            }
        return l;
    }
    case NL_JSON_OBJECT: {
        nl_jv *d = nl_jv_dict();
        for (size_t i = 0; d && i < j->u.obj.n; i++) {
            const nl_json_member *m = &j->u.obj.members[i];
            if (dict_setv(d, nl_jv_str(m->key, m->key_len, true), nl_jv_from_json(&m->value))) {
                nl_jv_unref(d);
                return NULL;
            }
        }
        return d;
    }
    }
    return NULL;
}

/* ---- growable byte buffer with taint flags ---- */
typedef struct {
    char *s;
    uint8_t *t;
    size_t n, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n, const uint8_t *taint, uint8_t flag) {
    if (n > MAX_OUTPUT || b->n > MAX_OUTPUT - n) return nl_err("template output longer than %u bytes", MAX_OUTPUT);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return nl_err("out of memory");
        b->s = ns;
        uint8_t *nt = realloc(b->t, cap);
        if (!nt) return nl_err("out of memory");
        b->t = nt;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, s, n);
    if (taint) memcpy(b->t + b->n, taint, n);
    else memset(b->t + b->n, flag, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}
static int buf_str(buf *b, const char *s) { return buf_add(b, s, strlen(s), NULL, 0); }
static int buf_jv(buf *b, const nl_jv *v) { return buf_add(b, v->u.s.s, v->u.s.n, v->u.s.taint, 0); }
static nl_jv *buf_take(buf *b) {
    nl_jv *v = jv_strt(b->s ? b->s : "", b->n, b->t);
    free(b->s);
    free(b->t);
    memset(b, 0, sizeof *b);
    return v;
}

/* ================================ lexer ================================ */

typedef enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF } ttype;

typedef struct {
    ttype type;
    int line;
    const char *s; /* source text (T_NAME, T_OP, T_INT, T_FLOAT); T_TEXT/T_STRING: decoded in str */
    size_t n;
    char *str;     /* owned: decoded text or string literal */
    size_t str_n;
} token;

typedef struct {
    const char *label;
    char *src;     /* newline-normalized copy */
    size_t len;
    token *tok;
    size_t n_tok, cap_tok;
} lexer;

static int lex_err(const lexer *L, int line, const char *fmt, ...) NL_PRINTF(3, 4);
static int lex_err(const lexer *L, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nl_err("%s:%d: %s", L->label, line, msg);
}

static int lex_push(lexer *L, ttype t, int line, const char *s, size_t n) {
    if (L->n_tok == L->cap_tok) {
        size_t cap = L->cap_tok ? L->cap_tok * 2 : 256;
        token *nt = realloc(L->tok, cap * sizeof *nt);
        if (!nt) return nl_err("out of memory");
        L->tok = nt;
        L->cap_tok = cap;
    }
    token *k = &L->tok[L->n_tok++];
    memset(k, 0, sizeof *k);
    k->type = t;
    k->line = line;
    k->s = s;
    k->n = n;
    return 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name1(char c) { return is_name0(c) || is_digit(c); }

static int line_at(const lexer *L, size_t pos) {
    int line = 1;
    for (size_t i = 0; i < pos && i < L->len; i++) line += L->src[i] == '\n';
    return line;
}

static int utf8_put(char *out, uint32_t c) {
    if (c < 0x80) { out[0] = (char)c; return 1; }
    if (c < 0x800) { out[0] = (char)(0xC0 | (c >> 6)); out[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12)); out[1] = (char)(0x80 | ((c >> 6) & 63)); out[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18)); out[1] = (char)(0x80 | ((c >> 12) & 63));
    out[2] = (char)(0x80 | ((c >> 6) & 63)); out[3] = (char)(0x80 | (c & 63));
    return 4;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at src[*pos] (the quote): decoded with Python's escapes into the token. */
static int lex_string(lexer *L, size_t *pos, int line) {
    const char q = L->src[*pos];
    size_t i = *pos + 1;
    char *out = nl_malloc(L->len - *pos + 1);
    if (!out) return -1;
    size_t n = 0;
    for (;;) {
        if (i >= L->len) {
            free(out);
            return lex_err(L, line, "unterminated string literal");
        }
        char c = L->src[i];
        if (c == q) break;
        if (c != '\\' || i + 1 >= L->len) {
            out[n++] = c;
            i++;
            continue;
        }
        char e = L->src[i + 1];
        i += 2;
        int digits = 0;
        switch (e) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case 'a': out[n++] = '\a'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'v': out[n++] = '\v'; break;
        case '0': out[n++] = '\0'; break;
        case '\\': out[n++] = '\\'; break;
        case '\'': out[n++] = '\''; break;
        case '"': out[n++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: out[n++] = '\\'; out[n++] = e; break;
        }
        if (digits) {
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i < L->len ? hexval(L->src[i]) : -1;
                if (h < 0) {
                    free(out);
                    return lex_err(L, line, "bad \\%c escape in a string literal", e);
                }
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                free(out);
                return lex_err(L, line, "escape \\%c%0*" PRIX32 " is not a Unicode scalar value", e, digits, cp);
            }
            n += (size_t)utf8_put(out + n, cp);
        }
    }
    *pos = i + 1;
    if (lex_push(L, T_STRING, line, NULL, 0)) {
        free(out);
        return -1;
    }
    L->tok[L->n_tok - 1].str = out;
    L->tok[L->n_tok - 1].str_n = n;
    return 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>=()[]{},.:|";

/* Tokens inside a tag from *pos until its end ("}}" or "%}", with '-'/'+' modifiers); the
 * end modifier's effect on the following text is returned in *strip_after (1: all
 * whitespace, 2: one newline (trim_blocks)). */
static int lex_tag(lexer *L, size_t *pos, bool is_var, int *strip_after, bool *ended_nl) {
    size_t i = *pos;
    const char end0 = is_var ? '}' : '%';
    for (;;) {
        while (i < L->len && is_ws(L->src[i])) i++;
        if (i >= L->len) return lex_err(L, line_at(L, *pos), "unterminated %s", is_var ? "{{ ... }}" : "{% ... %}");
        int line = line_at(L, i);
        char c = L->src[i];
        /* the end of the tag */
        size_t e = i;
        int mod = 0;
        if ((c == '-' || c == '+') && e + 2 < L->len && L->src[e + 1] == end0 && L->src[e + 2] == '}') {
            mod = c;
            e++;
        }
        if (e + 1 < L->len && L->src[e] == end0 && L->src[e + 1] == '}') {
            if (lex_push(L, is_var ? T_VAR_END : T_BLOCK_END, line, NULL, 0)) return -1;
            i = e + 2;
            *ended_nl = false;
            if (mod == '-') {
                size_t j = i;
                while (j < L->len && is_ws(L->src[j])) j++;
                *ended_nl = j > i && L->src[j - 1] == '\n';
                i = j;
            } else if (!is_var && mod != '+' && i < L->len && L->src[i] == '\n') {
                i++;
                *ended_nl = true;
            }
            *strip_after = 0;
            *pos = i;
            return 0;
        }
        if (c == '\'' || c == '"') {
            if (lex_string(L, &i, line)) return -1;
            continue;
        }
        if (is_name0(c)) {
            size_t j = i;
            while (j < L->len && is_name1(L->src[j])) j++;
            if (lex_push(L, T_NAME, line, L->src + i, j - i)) return -1;
            i = j;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            bool fl = false;
            while (j < L->len && (is_digit(L->src[j]) || L->src[j] == '_')) j++;
            if (j + 1 < L->len && L->src[j] == '.' && is_digit(L->src[j + 1])) {
                fl = true;
                j++;
                while (j < L->len && (is_digit(L->src[j]) || L->src[j] == '_')) j++;
            }
            if (j < L->len && (L->src[j] == 'e' || L->src[j] == 'E')) {
                size_t k = j + 1;
                if (k < L->len && (L->src[k] == '+' || L->src[k] == '-')) k++;
                if (k < L->len && is_digit(L->src[k])) {
                    fl = true;
                    j = k;
                    while (j < L->len && is_digit(L->src[j])) j++;
                }
            }
            if (lex_push(L, fl ? T_FLOAT : T_INT, line, L->src + i, j - i)) return -1;
            i = j;
            continue;
        }
        bool matched = false;
        for (int k = 0; ops2[k]; k++)
            if (i + 1 < L->len && L->src[i] == ops2[k][0] && L->src[i + 1] == ops2[k][1]) {
                if (lex_push(L, T_OP, line, L->src + i, 2)) return -1;
                i += 2;
                matched = true;
                break;
            }
        if (matched) continue;
        if (strchr(ops1, c) && c) {
            if (lex_push(L, T_OP, line, L->src + i, 1)) return -1;
            i++;
            continue;
        }
        return lex_err(L, line, "unexpected character '%c' in a tag", c);
    }
}

static int lex_text(lexer *L, const char *s, size_t n, int line) {
    if (n == 0) return 0;
    if (lex_push(L, T_TEXT, line, NULL, 0)) return -1;
    token *k = &L->tok[L->n_tok - 1];
    k->str = nl_strndup(s, n);
    if (!k->str) return -1;
    k->str_n = n;
    return 0;
}

static int lex_all(lexer *L) {
    size_t pos = 0;
    bool line_starting = true;
    for (;;) {
        /* the next tag opening */
        size_t t = pos;
        int kind = 0; /* '{', '%', '#' */
        while (t + 1 < L->len) {
            if (L->src[t] == '{' && (L->src[t + 1] == '{' || L->src[t + 1] == '%' || L->src[t + 1] == '#')) {
                kind = L->src[t + 1];
                break;
            }
            t++;
        }
        if (!kind) {
            if (lex_text(L, L->src + pos, L->len - pos, line_at(L, pos))) return -1;
            break;
        }
        char mod = t + 2 < L->len ? L->src[t + 2] : 0;
        size_t text_end = t;
        if (mod == '-') {
            while (text_end > pos && is_ws(L->src[text_end - 1])) text_end--;
        } else if (mod != '+' && kind != '{') {
            /* lstrip_blocks: spaces and tabs from the start of the line to a block or comment */
            size_t l = text_end;
            while (l > pos && L->src[l - 1] != '\n') l--;
            bool at_line = l > pos || line_starting;
            bool ws = true;
            for (size_t j = l; j < text_end; j++)
                if (!is_ws(L->src[j])) ws = false;
            if (at_line && ws) text_end = l;
        }
        if (lex_text(L, L->src + pos, text_end - pos, line_at(L, pos))) return -1;
        size_t i = t + 2 + (mod == '-' || mod == '+');
        int line = line_at(L, t);
        if (kind == '#') {
            /* comment: to "#}", with its modifiers */
            size_t e = i;
            while (e + 1 < L->len && !(L->src[e] == '#' && L->src[e + 1] == '}')) e++;
            if (e + 1 >= L->len) return lex_err(L, line, "unterminated comment {# ... #}");
            char emod = e > i ? L->src[e - 1] : 0;
            i = e + 2;
            line_starting = false;
            if (emod == '-') {
                size_t j = i;
                while (j < L->len && is_ws(L->src[j])) j++;
                line_starting = j > i && L->src[j - 1] == '\n';
                i = j;
            } else if (emod != '+' && i < L->len && L->src[i] == '\n') {
                i++;
                line_starting = true;
            }
            pos = i;
            continue;
        }
        bool is_var = kind == '{';
        if (!is_var) {
            /* {% raw %} ... {% endraw %}: the text as is ('-' on either tag strips the
             * whitespace beside it; trim_blocks after the endraw) */
            size_t j = i;
            while (j < L->len && is_ws(L->src[j])) j++;
            if (L->len - j >= 3 && memcmp(L->src + j, "raw", 3) == 0 && (j + 3 >= L->len || !is_name1(L->src[j + 3]))) {
                j += 3;
                while (j < L->len && is_ws(L->src[j])) j++;
                bool strip_in = j < L->len && L->src[j] == '-';
                if (strip_in) j++;
                if (j + 1 >= L->len || L->src[j] != '%' || L->src[j + 1] != '}') return lex_err(L, line, "expected %%} after raw");
                j += 2;
                if (strip_in)
                    while (j < L->len && is_ws(L->src[j])) j++;
                /* the endraw tag: "{%" [-+] ws "endraw" ws [-+] "%}" */
                size_t k = j, after = 0;
                char emod_in = 0, emod_out = 0;
                for (; k + 1 < L->len; k++) {
                    if (L->src[k] != '{' || L->src[k + 1] != '%') continue;
                    size_t m = k + 2;
                    emod_in = m < L->len && (L->src[m] == '-' || L->src[m] == '+') ? L->src[m++] : 0;
                    while (m < L->len && is_ws(L->src[m])) m++;
                    if (L->len - m < 6 || memcmp(L->src + m, "endraw", 6) != 0) continue;
                    m += 6;
                    while (m < L->len && is_ws(L->src[m])) m++;
                    emod_out = m < L->len && (L->src[m] == '-' || L->src[m] == '+') ? L->src[m++] : 0;
                    if (m + 1 < L->len && L->src[m] == '%' && L->src[m + 1] == '}') {
                        after = m + 2;
                        break;
                    }
                }
                if (!after) return lex_err(L, line, "{%% raw %%} without {%% endraw %%}");
                size_t text_end = k;
                if (emod_in == '-')
                    while (text_end > j && is_ws(L->src[text_end - 1])) text_end--;
                if (lex_text(L, L->src + j, text_end - j, line_at(L, j))) return -1;
                pos = after;
                line_starting = false;
                if (emod_out == '-') {
                    while (pos < L->len && is_ws(L->src[pos])) pos++;
                    line_starting = pos > after && L->src[pos - 1] == '\n';
                } else if (emod_out != '+' && pos < L->len && L->src[pos] == '\n') {
                    pos++;
                    line_starting = true;
                }
                continue;
            }
        }
        if (lex_push(L, is_var ? T_VAR_BEGIN : T_BLOCK_BEGIN, line, NULL, 0)) return -1;
        int strip = 0;
        bool nl = false;
        if (lex_tag(L, &i, is_var, &strip, &nl)) return -1;
        line_starting = nl;
        pos = i;
    }
    return lex_push(L, T_EOF, line_at(L, L->len), NULL, 0);
}

/* ================================ tree ================================ */

typedef enum {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_KWARG, N_FILTER, N_TEST, N_NOT, N_NEG, N_POS,
    N_BIN, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT,
    /* statements */
    S_BODY, S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_MACRO, S_BREAK, S_CONTINUE,
} nkind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN } binop;

typedef struct node {
    nkind kind;
    int line;
    int op;              /* binop; N_TEST: negated */
    char *name;          /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_KWARG, S_SET, S_MACRO */
    char *attr;          /* S_SET: ns.attr */
    nl_jv *lit;          /* N_LIT, S_TEXT */
    struct node *a, *b, *c;
    struct node **kids;
    int n_kids, cap_kids;
    char **names;        /* S_FOR targets, S_MACRO parameters */
    int n_names;
    int filter_id;       /* N_FILTER / N_TEST: table index */
} node;

struct nl_jinja {
    char *label;
    node *root;
};

static void node_free(node *n) {
    if (!n) return;
    free(n->name);
    free(n->attr);
    nl_jv_unref(n->lit);
    node_free(n->a);
    node_free(n->b);
    node_free(n->c);
    for (int i = 0; i < n->n_kids; i++) node_free(n->kids[i]);
    free(n->kids);
    for (int i = 0; i < n->n_names; i++) free(n->names[i]);
    free(n->names);
    free(n);
}

static node *node_new(nkind k, int line) {
    node *n = nl_calloc(1, sizeof *n);
    if (n) {
        n->kind = k;
        n->line = line;
    }
    return n;
}

static int node_add(node *p, node *k) {
    if (!k) return -1;
    if (p->n_kids == p->cap_kids) {
        int cap = p->cap_kids ? p->cap_kids * 2 : 4;
        node **nk = realloc(p->kids, (size_t)cap * sizeof *nk);
        if (!nk) {
            node_free(k);
            return nl_err("out of memory");
        }
        p->kids = nk;
        p->cap_kids = cap;
    }
    p->kids[p->n_kids++] = k;
    return 0;
}

/* A NULL kid (an absent slice bound, an else-less if arm) */
static int node_add_null(node *p) {
    node *dummy = node_new(N_LIT, p->line);
    if (!dummy) return -1;
    if (node_add(p, dummy)) return -1;
    p->kids[p->n_kids - 1] = NULL;
    node_free(dummy);
    return 0;
}

static int node_add_name(node *p, const char *s, size_t n) {
    char **nn = realloc(p->names, (size_t)(p->n_names + 1) * sizeof *nn);
    if (!nn) return nl_err("out of memory");
    p->names = nn;
    if (!(p->names[p->n_names] = nl_strndup(s, n))) return -1;
    p->n_names++;
    return 0;
}

/* ---- filters, tests, builtins: the tables ---- */

typedef enum {
    F_TRIM, F_LENGTH, F_COUNT, F_TOJSON, F_ITEMS, F_STRING, F_SAFE, F_JOIN, F_SELECT, F_REJECT, F_SELECTATTR,
    F_REJECTATTR, F_MAP, F_FIRST, F_LAST, F_LIST, F_DEFAULT, F_D, F_UPPER, F_LOWER, F_CAPITALIZE, F_TITLE,
    F_REPLACE, F_INT, F_FLOAT, F_ABS, F_REVERSE, F_DICTSORT, F_UNIQUE, F_INDENT, F_SORT, F_MIN, F_MAX, F_SUM,
    F_N
} filter_id;
static const char *const filter_names[F_N] = {
    "trim", "length", "count", "tojson", "items", "string", "safe", "join", "select", "reject", "selectattr",
    "rejectattr", "map", "first", "last", "list", "default", "d", "upper", "lower", "capitalize", "title",
    "replace", "int", "float", "abs", "reverse", "dictsort", "unique", "indent", "sort", "min", "max", "sum"};

typedef enum {
    TS_DEFINED, TS_UNDEFINED, TS_NONE, TS_STRING, TS_MAPPING, TS_ITERABLE, TS_SEQUENCE, TS_NUMBER, TS_INTEGER,
    TS_FLOAT, TS_BOOLEAN, TS_TRUE, TS_FALSE, TS_EQUALTO, TS_EQ, TS_EQEQ, TS_NE, TS_SAMEAS, TS_IN, TS_ODD,
    TS_EVEN, TS_DIVISIBLEBY, TS_CALLABLE, TS_LOWER, TS_UPPER, TS_GT, TS_LT, TS_GE, TS_LE, TS_N
} test_id;
static const char *const test_names[TS_N] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer",
    "float", "boolean", "true", "false", "equalto", "eq", "==", "ne", "sameas", "in", "odd",
    "even", "divisibleby", "callable", "lower", "upper", "gt", "lt", "ge", "le"};

enum { B_RAISE, B_NAMESPACE, B_RANGE, B_DICT, B_N };
static const char *const builtin_names[B_N] = {"raise_exception", "namespace", "range", "dict"};

static int find_name(const char *const *tab, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(tab[i]) == len && memcmp(tab[i], s, len) == 0) return i;
    return -1;
}

/* ================================ parser ================================ */

typedef struct {
    lexer *L;
    size_t p;
    int depth;
} parser;

static const token *cur(const parser *P) { return &P->L->tok[P->p]; }
static bool tok_is(const token *t, ttype ty, const char *s) {
    return t->type == ty && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static bool at_op(const parser *P, const char *s) { return tok_is(cur(P), T_OP, s); }
static bool at_name(const parser *P, const char *s) { return tok_is(cur(P), T_NAME, s); }

static int perr(const parser *P, const char *fmt, ...) NL_PRINTF(2, 3);
static int perr(const parser *P, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nl_err("%s:%d: %s", P->L->label, cur(P)->line, msg);
}

static const char *tok_desc(const token *t, char *tmp, size_t n) {
    switch (t->type) {
    case T_NAME: case T_OP: case T_INT: case T_FLOAT: snprintf(tmp, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); break;
    case T_STRING: snprintf(tmp, n, "a string"); break;
    case T_VAR_END: snprintf(tmp, n, "'}}'"); break;
    case T_BLOCK_END: snprintf(tmp, n, "'%%}'"); break;
    case T_EOF: snprintf(tmp, n, "the end of the template"); break;
    default: snprintf(tmp, n, "text"); break;
    }
    return tmp;
}

static int expect_op(parser *P, const char *s) {
    if (!at_op(P, s)) {
        char tmp[64];
        return perr(P, "expected '%s', found %s", s, tok_desc(cur(P), tmp, sizeof tmp));
    }
    P->p++;
    return 0;
}

static node *parse_expr(parser *P);
static node *parse_or(parser *P);
static node *parse_unary(parser *P, bool with_filter);

static node *lit_node(parser *P, nl_jv *v) {
    node *n = node_new(N_LIT, cur(P)->line);
    if (!n || !v) {
        nl_jv_unref(v);
        free(n);
        return NULL;
    }
    n->lit = v;
    return n;
}

/* Call arguments after '(' up to ')': positional kids, keyword kids are N_KWARG. */
static int parse_args(parser *P, node *call) {
    if (expect_op(P, "(")) return -1;
    while (!at_op(P, ")")) {
        if (cur(P)->type == T_NAME && tok_is(&P->L->tok[P->p + 1], T_OP, "=")) {
            node *kw = node_new(N_KWARG, cur(P)->line);
            if (!kw || !(kw->name = nl_strndup(cur(P)->s, cur(P)->n))) {
                node_free(kw);
                return -1;
            }
            P->p += 2;
            if (!(kw->a = parse_expr(P))) {
                node_free(kw);
                return -1;
            }
            if (node_add(call, kw)) return -1;
        } else if (node_add(call, parse_expr(P))) {
            return -1;
        }
        if (!at_op(P, ",")) break;
        P->p++;
    }
    return expect_op(P, ")");
}

static node *parse_primary(parser *P) {
    const token *t = cur(P);
    char tmp[64];
    if (t->type == T_STRING) {
        /* adjacent literals concatenate */
        buf b = {0};
        while (cur(P)->type == T_STRING) {
            if (buf_add(&b, cur(P)->str, cur(P)->str_n, NULL, 0)) {
                free(b.s);
                free(b.t);
                return NULL;
            }
            P->p++;
        }
        return lit_node(P, buf_take(&b));
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        char num[64];
        size_t k = 0;
        for (size_t i = 0; i < t->n && k + 1 < sizeof num; i++)
            if (t->s[i] != '_') num[k++] = t->s[i];
        num[k] = 0;
        P->p++;
        if (t->type == T_INT) {
            char *end;
            long long v = strtoll(num, &end, 10);
            return lit_node(P, nl_jv_int(v));
        }
        return lit_node(P, jv_float(strtod(num, NULL)));
    }
    if (t->type == T_NAME) {
        P->p++;
        if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) return lit_node(P, nl_jv_bool(true));
        if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) return lit_node(P, nl_jv_bool(false));
        if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) return lit_node(P, nl_jv_none());
        node *n = node_new(N_NAME, t->line);
        if (n && !(n->name = nl_strndup(t->s, t->n))) {
            node_free(n);
            return NULL;
        }
        return n;
    }
    if (tok_is(t, T_OP, "(")) {
        P->p++;
        if (at_op(P, ")")) {
            P->p++;
            return node_new(N_TUPLE, t->line);
        }
        node *e = parse_expr(P);
        if (!e) return NULL;
        if (at_op(P, ",")) {
            node *tu = node_new(N_TUPLE, t->line);
            if (!tu || node_add(tu, e)) {
                if (!tu) node_free(e);
                node_free(tu);
                return NULL;
            }
            while (at_op(P, ",")) {
                P->p++;
                if (at_op(P, ")")) break;
                if (node_add(tu, parse_expr(P))) {
                    node_free(tu);
                    return NULL;
                }
            }
            e = tu;
        }
        if (expect_op(P, ")")) {
            node_free(e);
            return NULL;
        }
        return e;
    }
    if (tok_is(t, T_OP, "[")) {
        P->p++;
        node *l = node_new(N_LIST, t->line);
        if (!l) return NULL;
        while (!at_op(P, "]")) {
            if (node_add(l, parse_expr(P))) {
                node_free(l);
                return NULL;
            }
            if (!at_op(P, ",")) break;
            P->p++;
        }
        if (expect_op(P, "]")) {
            node_free(l);
            return NULL;
        }
        return l;
    }
    if (tok_is(t, T_OP, "{")) {
        P->p++;
        node *d = node_new(N_DICT, t->line);
        if (!d) return NULL;
        while (!at_op(P, "}")) {
            if (node_add(d, parse_expr(P)) || expect_op(P, ":") || node_add(d, parse_expr(P))) {
                node_free(d);
                return NULL;
            }
            if (!at_op(P, ",")) break;
            P->p++;
        }
        if (expect_op(P, "}")) {
            node_free(d);
            return NULL;
        }
        return d;
    }
    perr(P, "unexpected %s in an expression", tok_desc(t, tmp, sizeof tmp));
    return NULL;
}

static node *parse_postfix(parser *P, node *n) {
    while (n) {
        const token *t = cur(P);
        if (tok_is(t, T_OP, ".")) {
            P->p++;
            const token *nm = cur(P);
            node *a = node_new(N_ATTR, t->line);
            if (!a) break;
            a->a = n;
            n = a;
            if (nm->type == T_NAME) {
                if (!(a->name = nl_strndup(nm->s, nm->n))) break;
            } else if (nm->type == T_INT) {
                /* x.0: an item */
                a->kind = N_ITEM;
                if (!(a->b = lit_node(P, nl_jv_int(strtoll(nm->s, NULL, 10))))) break;
            } else {
                char tmp[64];
                perr(P, "expected an attribute name after '.', found %s", tok_desc(nm, tmp, sizeof tmp));
                break;
            }
            P->p++;
        } else if (tok_is(t, T_OP, "[")) {
            P->p++;
            node *idx = NULL;
            bool slice = false;
            node *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            for (;;) {
                if (at_op(P, ":")) {
                    slice = true;
                    P->p++;
                    if (++k > 2) {
                        perr(P, "a slice has at most 3 parts");
                        goto fail;
                    }
                    continue;
                }
                if (at_op(P, "]")) break;
                if (parts[k]) {
                    perr(P, "expected ':' or ']' in a subscript");
                    goto fail;
                }
                if (!(parts[k] = parse_expr(P))) goto fail;
            }
            P->p++;
            if (slice) {
                idx = node_new(N_SLICE, t->line);
                if (!idx) goto fail;
                idx->a = n;
                n = idx;
                for (int j = 0; j < 3; j++) {
                    if (parts[j] ? node_add(idx, parts[j]) : node_add_null(idx)) {
                        parts[j] = NULL;
                        goto fail;
                    }
                    parts[j] = NULL;
                }
            } else {
                if (!parts[0]) {
                    perr(P, "empty subscript []");
                    goto fail;
                }
                idx = node_new(N_ITEM, t->line);
                if (!idx) goto fail;
                idx->a = n;
                idx->b = parts[0];
                parts[0] = NULL;
                n = idx;
            }
            continue;
        fail:
            for (int j = 0; j < 3; j++) node_free(parts[j]);
            break;
        } else if (tok_is(t, T_OP, "(")) {
            node *c = node_new(N_CALL, t->line);
            if (!c) break;
            c->a = n;
            n = c;
            if (parse_args(P, c)) break;
        } else {
            return n;
        }
    }
    node_free(n);
    return NULL;
}

/* A filter or test name (dotted names are not supported). */
static int name_after(parser *P, const char *what, const char *const *tab, int ntab, node *f) {
    const token *t = cur(P);
    if (t->type != T_NAME && !tok_is(t, T_OP, "==")) return perr(P, "expected a %s name", what);
    int id = find_name(tab, ntab, t->s, t->n);
    if (id < 0) return perr(P, "%s '%.*s' is not supported", what, (int)(t->n > 40 ? 40 : t->n), t->s);
    f->filter_id = id;
    if (!(f->name = nl_strndup(t->s, t->n))) return -1;
    P->p++;
    return 0;
}

static node *parse_filters(parser *P, node *n) {
    while (n) {
        if (at_op(P, "|")) {
            P->p++;
            node *f = node_new(N_FILTER, cur(P)->line);
            if (!f) break;
            f->a = n;
            n = f;
            if (name_after(P, "filter", filter_names, F_N, f)) break;
            if (at_op(P, "(") && parse_args(P, f)) break;
        } else if (at_name(P, "is")) {
            P->p++;
            node *t = node_new(N_TEST, cur(P)->line);
            if (!t) break;
            t->a = n;
            n = t;
            if (at_name(P, "not")) {
                t->op = 1;
                P->p++;
            }
            if (name_after(P, "test", test_names, TS_N, t)) break;
            const token *c = cur(P);
            if (tok_is(c, T_OP, "(")) {
                if (parse_args(P, t)) break;
            } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                        tok_is(c, T_OP, "[") || tok_is(c, T_OP, "{")) &&
                       !tok_is(c, T_NAME, "else") && !tok_is(c, T_NAME, "or") && !tok_is(c, T_NAME, "and") &&
                       !tok_is(c, T_NAME, "if") && !tok_is(c, T_NAME, "is") && !tok_is(c, T_NAME, "in") &&
                       !tok_is(c, T_NAME, "not")) {
                node *arg = parse_primary(P);
                if (!arg || node_add(t, parse_postfix(P, arg))) break;
            }
        } else {
            return n;
        }
    }
    node_free(n);
    return NULL;
}

static node *parse_unary(parser *P, bool with_filter) {
    if (++P->depth > MAX_DEPTH) {
        perr(P, "expression nested too deeply");
        return NULL;
    }
    node *n;
    const token *t = cur(P);
    if (tok_is(t, T_OP, "-") || tok_is(t, T_OP, "+")) {
        P->p++;
        n = node_new(tok_is(t, T_OP, "-") ? N_NEG : N_POS, t->line);
        if (n && !(n->a = parse_unary(P, false))) {
            node_free(n);
            n = NULL;
        }
    } else {
        n = parse_postfix(P, parse_primary(P));
    }
    if (n && with_filter) n = parse_filters(P, n);
    P->depth--;
    return n;
}

static node *bin(parser *P, nkind k, int op, node *a, node *b, int line) {
    (void)P;
    if (!a || !b) {
        node_free(a);
        node_free(b);
        return NULL;
    }
    node *n = node_new(k, line);
    if (!n) {
        node_free(a);
        node_free(b);
        return NULL;
    }
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(parser *P) {
    node *l = parse_unary(P, true);
    while (l && at_op(P, "**")) {
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_BIN, OP_POW, l, parse_unary(P, true), line);
    }
    return l;
}
static node *parse_math2(parser *P) {
    node *l = parse_pow(P);
    while (l) {
        int op = at_op(P, "*") ? OP_MUL : at_op(P, "/") ? OP_DIV : at_op(P, "//") ? OP_FDIV : at_op(P, "%") ? OP_MOD : -1;
        if (op < 0) break;
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_BIN, op, l, parse_pow(P), line);
    }
    return l;
}
static node *parse_concat(parser *P) {
    node *l = parse_math2(P);
    while (l && at_op(P, "~")) {
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_CONCAT, 0, l, parse_math2(P), line);
    }
    return l;
}
static node *parse_math1(parser *P) {
    node *l = parse_concat(P);
    while (l) {
        int op = at_op(P, "+") ? OP_ADD : at_op(P, "-") ? OP_SUB : -1;
        if (op < 0) break;
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_BIN, op, l, parse_concat(P), line);
    }
    return l;
}
static node *parse_compare(parser *P) {
    node *l = parse_math1(P);
    while (l) {
        int line = cur(P)->line;
        int op = at_op(P, "==") ? OP_EQ : at_op(P, "!=") ? OP_NE : at_op(P, "<") ? OP_LT : at_op(P, ">") ? OP_GT
               : at_op(P, "<=") ? OP_LE : at_op(P, ">=") ? OP_GE : at_name(P, "in") ? OP_IN : -1;
        if (op < 0 && at_name(P, "not") && tok_is(&P->L->tok[P->p + 1], T_NAME, "in")) {
            op = OP_NOTIN;
            P->p++;
        }
        if (op < 0) break;
        P->p++;
        l = bin(P, N_BIN, op, l, parse_math1(P), line);
    }
    return l;
}
static node *parse_not(parser *P) {
    if (at_name(P, "not")) {
        int line = cur(P)->line;
        P->p++;
        if (++P->depth > MAX_DEPTH) {
            perr(P, "expression nested too deeply");
            return NULL;
        }
        node *a = parse_not(P);
        P->depth--;
        if (!a) return NULL;
        node *n = node_new(N_NOT, line);
        if (!n) {
            node_free(a);
            return NULL;
        }
        n->a = a;
        return n;
    }
    return parse_compare(P);
}
static node *parse_and(parser *P) {
    node *l = parse_not(P);
    while (l && at_name(P, "and")) {
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_AND, 0, l, parse_not(P), line);
    }
    return l;
}
static node *parse_or(parser *P) {
    node *l = parse_and(P);
    while (l && at_name(P, "or")) {
        int line = cur(P)->line;
        P->p++;
        l = bin(P, N_OR, 0, l, parse_and(P), line);
    }
    return l;
}
static node *parse_expr(parser *P) {
    if (++P->depth > MAX_DEPTH) {
        perr(P, "expression nested too deeply");
        return NULL;
    }
    node *e = parse_or(P);
    while (e && at_name(P, "if")) {
        int line = cur(P)->line;
        P->p++;
        node *c = node_new(N_COND, line);
        if (!c) {
            node_free(e);
            e = NULL;
            break;
        }
        c->b = e;
        e = c;
        if (!(c->a = parse_or(P))) {
            node_free(e);
            e = NULL;
            break;
        }
        if (at_name(P, "else")) {
            P->p++;
            if (!(c->c = parse_or(P))) {
                node_free(e);
                e = NULL;
                break;
            }
        }
    }
    P->depth--;
    return e;
}

/* ---- statements ---- */

static int expect_block_end(parser *P, const char *tag) {
    if (cur(P)->type != T_BLOCK_END) {
        char tmp[64];
        return perr(P, "expected '%%}' to end {%% %s %%}, found %s", tag, tok_desc(cur(P), tmp, sizeof tmp));
    }
    P->p++;
    return 0;
}

/* Parses statements into `body` until a block tag named in `ends` (the name is left current,
 * after the '{%'); *which = its index; the template's end only when ends == NULL. */
static int parse_body(parser *P, node *body, const char *const *ends, int *which);

static int parse_block_tag(parser *P, node *body, bool *handled);

static int parse_body(parser *P, node *body, const char *const *ends, int *which) {
    if (++P->depth > MAX_DEPTH) return perr(P, "blocks nested too deeply");
    for (;;) {
        const token *t = cur(P);
        if (t->type == T_EOF) {
            if (!ends) {
                P->depth--;
                return 0;
            }
            {
                int last = 0;
                while (ends[last + 1]) last++;
                return perr(P, "missing {%% %s %%}", ends[last]);
            }
        }
        if (t->type == T_TEXT) {
            node *n = node_new(S_TEXT, t->line);
            if (!n || !(n->lit = jv_strt(t->str, t->str_n, NULL)) || node_add(body, n)) {
                if (n && !n->lit) node_free(n);
                return -1;
            }
            P->p++;
            continue;
        }
        if (t->type == T_VAR_BEGIN) {
            P->p++;
            node *n = node_new(S_OUT, t->line);
            if (!n) return -1;
            if (!(n->a = parse_expr(P))) {
                node_free(n);
                return -1;
            }
            if (cur(P)->type != T_VAR_END) {
                char tmp[64];
                node_free(n);
                return perr(P, "expected '}}', found %s", tok_desc(cur(P), tmp, sizeof tmp));
            }
            P->p++;
            if (node_add(body, n)) return -1;
            continue;
        }
        if (t->type == T_BLOCK_BEGIN) {
            const token *nm = &P->L->tok[P->p + 1];
            if (nm->type != T_NAME) {
                P->p++;
                return perr(P, "expected a tag name after '{%%'");
            }
            for (int k = 0; ends && ends[k]; k++)
                if (tok_is(nm, T_NAME, ends[k])) {
                    P->p++;
                    *which = k;
                    P->depth--;
                    return 0;
                }
            P->p++;
            bool handled = false;
            if (parse_block_tag(P, body, &handled)) return -1;
            if (!handled) {
                char name[48];
                snprintf(name, sizeof name, "%.*s", (int)(nm->n > 40 ? 40 : nm->n), nm->s);
                static const char *const known_ends[] = {"endif", "endfor", "endset", "endmacro", "elif", "else", "endgeneration", NULL};
                if (find_name(known_ends, 7, nm->s, nm->n) >= 0) return perr(P, "unexpected {%% %s %%}", name);
                return perr(P, "tag '%s' is not supported", name);
            }
            continue;
        }
        char tmp[64];
        return perr(P, "unexpected %s", tok_desc(t, tmp, sizeof tmp));
    }
}

/* Current token: the tag's name. */
static int parse_block_tag(parser *P, node *body, bool *handled) {
    const token *nm = cur(P);
    int line = nm->line;
    *handled = true;
    if (tok_is(nm, T_NAME, "if")) {
        P->p++;
        node *n = node_new(S_IF, line);
        if (!n) return -1;
        if (node_add(body, n)) return -1;
        for (;;) {
            if (node_add(n, parse_expr(P)) || expect_block_end(P, "if")) return -1;
            node *arm = node_new(S_BODY, cur(P)->line);
            if (node_add(n, arm)) return -1;
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            int which = -1;
            if (parse_body(P, arm, ends, &which)) return -1;
            P->p++;
            if (which == 0) continue;
            if (which == 1) {
                if (expect_block_end(P, "else") || node_add_null(n)) return -1;
                node *els = node_new(S_BODY, cur(P)->line);
                if (node_add(n, els)) return -1;
                static const char *const ends2[] = {"endif", NULL};
                if (parse_body(P, els, ends2, &which)) return -1;
                P->p++;
            }
            return expect_block_end(P, "endif");
        }
    }
    if (tok_is(nm, T_NAME, "for")) {
        P->p++;
        node *n = node_new(S_FOR, line);
        if (!n) return -1;
        if (node_add(body, n)) return -1;
        bool paren = at_op(P, "(");
        if (paren) P->p++;
        for (;;) {
            if (cur(P)->type != T_NAME) return perr(P, "expected a loop variable name");
            if (node_add_name(n, cur(P)->s, cur(P)->n)) return -1;
            P->p++;
            if (!at_op(P, ",")) break;
            P->p++;
        }
        if (paren && expect_op(P, ")")) return -1;
        if (!at_name(P, "in")) return perr(P, "expected 'in' in {%% for %%}");
        P->p++;
        /* the iterable: no conditional expression (its 'if' is the loop filter) */
        if (!(n->a = parse_or(P))) return -1;
        if (at_name(P, "if")) {
            P->p++;
            if (!(n->b = parse_or(P))) return -1;
        }
        if (at_name(P, "recursive")) return perr(P, "recursive loops are not supported");
        if (expect_block_end(P, "for")) return -1;
        node *lb = node_new(S_BODY, cur(P)->line);
        if (node_add(n, lb)) return -1;
        static const char *const ends[] = {"else", "endfor", NULL};
        int which = -1;
        if (parse_body(P, lb, ends, &which)) return -1;
        P->p++;
        if (which == 0) {
            if (expect_block_end(P, "else")) return -1;
            if (!(n->c = node_new(S_BODY, cur(P)->line))) return -1;
            static const char *const ends2[] = {"endfor", NULL};
            if (parse_body(P, n->c, ends2, &which)) return -1;
            P->p++;
        }
        return expect_block_end(P, "endfor");
    }
    if (tok_is(nm, T_NAME, "set")) {
        P->p++;
        node *n = node_new(S_SET, line);
        if (!n) return -1;
        if (node_add(body, n)) return -1;
        if (cur(P)->type != T_NAME) return perr(P, "expected a variable name after 'set'");
        if (!(n->name = nl_strndup(cur(P)->s, cur(P)->n))) return -1;
        P->p++;
        if (at_op(P, ".")) {
            P->p++;
            if (cur(P)->type != T_NAME) return perr(P, "expected an attribute name after '.'");
            if (!(n->attr = nl_strndup(cur(P)->s, cur(P)->n))) return -1;
            P->p++;
        }
        if (at_op(P, ",")) return perr(P, "tuple assignment in {%% set %%} is not supported");
        if (at_op(P, "=")) {
            P->p++;
            if (!(n->a = parse_expr(P))) return -1;
            return expect_block_end(P, "set");
        }
        /* block set, with optional filters */
        node *src = node_new(S_BODY, line);
        if (!src) return -1;
        n->b = src;
        node *filt = NULL;
        if (at_op(P, "|")) {
            /* filters applied to the captured text: a chain over a placeholder name */
            node *ph = node_new(N_NAME, line);
            if (!ph || !(ph->name = nl_strdup(" block"))) {
                node_free(ph);
                return -1;
            }
            if (!(filt = parse_filters(P, ph))) return -1;
            n->c = filt;
        }
        if (expect_block_end(P, "set")) return -1;
        static const char *const ends[] = {"endset", NULL};
        int which;
        if (parse_body(P, src, ends, &which)) return -1;
        P->p++;
        return expect_block_end(P, "endset");
    }
    if (tok_is(nm, T_NAME, "macro")) {
        P->p++;
        node *n = node_new(S_MACRO, line);
        if (!n) return -1;
        if (node_add(body, n)) return -1;
        if (cur(P)->type != T_NAME) return perr(P, "expected a macro name");
        if (!(n->name = nl_strndup(cur(P)->s, cur(P)->n))) return -1;
        P->p++;
        if (expect_op(P, "(")) return -1;
        while (!at_op(P, ")")) {
            if (cur(P)->type != T_NAME) return perr(P, "expected a parameter name");
            if (node_add_name(n, cur(P)->s, cur(P)->n)) return -1;
            P->p++;
            if (at_op(P, "=")) {
                P->p++;
                if (node_add(n, parse_expr(P))) return -1;
            } else if (node_add_null(n)) {
                return -1;
            }
            if (!at_op(P, ",")) break;
            P->p++;
        }
        if (expect_op(P, ")") || expect_block_end(P, "macro")) return -1;
        if (!(n->b = node_new(S_BODY, cur(P)->line))) return -1;
        static const char *const ends[] = {"endmacro", NULL};
        int which;
        if (parse_body(P, n->b, ends, &which)) return -1;
        P->p++;
        return expect_block_end(P, "endmacro");
    }
    if (tok_is(nm, T_NAME, "generation")) {
        /* transformers' assistant-mask marker: rendered as its body */
        P->p++;
        if (expect_block_end(P, "generation")) return -1;
        node *g = node_new(S_BODY, cur(P)->line);
        if (node_add(body, g)) return -1;
        static const char *const ends[] = {"endgeneration", NULL};
        int which;
        if (parse_body(P, g, ends, &which)) return -1;
        P->p++;
        return expect_block_end(P, "endgeneration");
    }
    if (tok_is(nm, T_NAME, "break") || tok_is(nm, T_NAME, "continue")) {
        node *n = node_new(tok_is(nm, T_NAME, "break") ? S_BREAK : S_CONTINUE, line);
        P->p++;
        if (node_add(body, n)) return -1;
        return expect_block_end(P, n->kind == S_BREAK ? "break" : "continue");
    }
    *handled = false;
    return 0;
}

nl_jinja *nl_jinja_parse(const char *src, size_t len, const char *label) {
    lexer L = {.label = label ? label : "template"};
    nl_jinja *t = NULL;
    /* newlines normalized to \n, one trailing newline dropped (jinja2's keep_trailing_newline=False) */
    L.src = nl_malloc(len + 1);
    if (!L.src) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            L.src[L.len++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            L.src[L.len++] = src[i];
        }
    }
    if (L.len && L.src[L.len - 1] == '\n') L.len--;
    L.src[L.len] = 0;
    if (lex_all(&L)) goto done;
    parser P = {.L = &L};
    node *root = node_new(S_BODY, 1);
    if (!root) goto done;
    if (parse_body(&P, root, NULL, NULL)) {
        node_free(root);
        goto done;
    }
    t = nl_calloc(1, sizeof *t);
    if (!t || !(t->label = nl_strdup(L.label))) {
        free(t);
        t = NULL;
        node_free(root);
        goto done;
    }
    t->root = root;
done:
    for (size_t i = 0; i < L.n_tok; i++) free(L.tok[i].str);
    free(L.tok);
    free(L.src);
    return t;
}

void nl_jinja_free(nl_jinja *t) {
    if (!t) return;
    node_free(t->root);
    free(t->label);
    free(t);
}

/* ================================ evaluator ================================ */

typedef struct frame {
    nl_jv *vars; /* dict */
    struct frame *parent;
} frame;

typedef struct {
    const nl_jinja *t;
    const nl_jv *ctx;
    frame *root;
    int depth;
    long steps;
    int brk; /* 1 break, 2 continue pending */
} rstate;

static int rerr(const rstate *R, const node *n, const char *fmt, ...) NL_PRINTF(3, 4);
static int rerr(const rstate *R, const node *n, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nl_err("%s:%d: %s", R->t->label, n ? n->line : 0, msg);
}

static const char *type_name(const nl_jv *v) {
    switch (v->type) {
    case V_UNDEF: return "undefined";
    case V_NONE: return "none";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "string";
    case V_LIST: return "list";
    case V_DICT: return "dict";
    case V_NS: return "namespace";
    case V_MACRO: return "macro";
    default: return "function";
    }
}

static bool truthy(const nl_jv *v) {
    switch (v->type) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0;
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->u.l.n > 0;
    case V_DICT: return v->u.d.n > 0;
    default: return true;
    }
}

static bool is_num(const nl_jv *v) { return v->type == V_INT || v->type == V_FLOAT || v->type == V_BOOL; }
static double num_f(const nl_jv *v) {
    return v->type == V_FLOAT ? v->u.f : v->type == V_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const nl_jv *v) { return v->type == V_INT ? v->u.i : v->type == V_BOOL ? v->u.b : (int64_t)v->u.f; }

static bool jv_equal(const nl_jv *a, const nl_jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->type == V_FLOAT || b->type == V_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->type != b->type) return false;
    switch (a->type) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.s, b->u.s.s, a->u.s.n) == 0;
    case V_LIST:
        if (a->u.l.n != b->u.l.n) return false;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!jv_equal(a->u.l.v[i], b->u.l.v[i])) return false;
        return true;
    case V_DICT:
        if (a->u.d.n != b->u.d.n) return false;
        for (size_t i = 0; i < a->u.d.n; i++) {
            const nl_jv *o = dict_getn(b, a->u.d.k[i]->u.s.s, a->u.d.k[i]->u.s.n);
            if (!o || !jv_equal(a->u.d.v[i], o)) return false;
        }
        return true;
    default: return a == b;
    }
}

/* ---- text forms: Python's str() and repr(), and json.dumps ---- */

/* Python's repr of a float (shortest round-trip digits, its exponent rules). */
static void fmt_float(double f, char *out, size_t n) {
    if (isnan(f)) { snprintf(out, n, "nan"); return; }
    if (isinf(f)) { snprintf(out, n, f < 0 ? "-inf" : "inf"); return; }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* digits and decimal exponent from tmp: d.ddde±XX */
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = 0;
    int ex = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (ex < -4 || ex >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, n - k, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
        return;
    }
    if (ex < 0) {
        out[k++] = '0';
        out[k++] = '.';
        for (int i = 0; i < -ex - 1; i++) out[k++] = '0';
        for (int i = 0; i < nd; i++) out[k++] = digits[i];
    } else {
        for (int i = 0; i <= ex; i++) out[k++] = i < nd ? digits[i] : '0';
        out[k++] = '.';
        if (nd > ex + 1)
            for (int i = ex + 1; i < nd; i++) out[k++] = digits[i];
        else
            out[k++] = '0';
    }
    out[k] = 0;
}

static int to_repr(buf *b, const nl_jv *v);

static int repr_str(buf *b, const nl_jv *v) {
    const char *s = v->u.s.s;
    size_t n = v->u.s.n;
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (buf_add(b, &q, 1, NULL, 0)) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        if (c == '\\') e = "\\\\";
        else if (c == (unsigned char)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        }
        if (e ? buf_str(b, e) : buf_add(b, s + i, 1, v->u.s.taint ? v->u.s.taint + i : NULL, 0)) return -1;
    }
    return buf_add(b, &q, 1, NULL, 0);
}

/* str(v) as Python prints it (strings as they are, None, True, lists in repr form). */
static int to_str(buf *b, const nl_jv *v) {
    char num[48];
    switch (v->type) {
    case V_UNDEF: return 0;
    case V_NONE: return buf_str(b, "None");
    case V_BOOL: return buf_str(b, v->u.b ? "True" : "False");
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return buf_str(b, num);
    case V_FLOAT: fmt_float(v->u.f, num, sizeof num); return buf_str(b, num);
    case V_STR: return buf_jv(b, v);
    default: return to_repr(b, v);
    }
}

static int to_repr(buf *b, const nl_jv *v) {
    switch (v->type) {
    case V_STR: return repr_str(b, v);
    case V_UNDEF: return buf_str(b, "Undefined");
    case V_LIST:
        if (buf_str(b, "[")) return -1;
        for (size_t i = 0; i < v->u.l.n; i++)
            if ((i && buf_str(b, ", ")) || to_repr(b, v->u.l.v[i])) return -1;
        return buf_str(b, "]");
    case V_DICT:
        if (buf_str(b, "{")) return -1;
        for (size_t i = 0; i < v->u.d.n; i++)
            if ((i && buf_str(b, ", ")) || to_repr(b, v->u.d.k[i]) || buf_str(b, ": ") || to_repr(b, v->u.d.v[i]))
                return -1;
        return buf_str(b, "}");
    case V_NS: return buf_str(b, "<Namespace>");
    case V_MACRO: return buf_str(b, "<Macro>");
    case V_FUNC: case V_METHOD: return buf_str(b, "<function>");
    default: return to_str(b, v);
    }
}

static nl_jv *str_of(const nl_jv *v) {
    if (v->type == V_STR) return ref((nl_jv *)v);
    buf b = {0};
    if (to_str(&b, v)) {
        free(b.s);
        free(b.t);
        return NULL;
    }
    return buf_take(&b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort): the bytes of strings keep
 * their data flags. */
static int to_json(buf *b, const nl_jv *v, int indent, int level, bool sort, const rstate *R, const node *at) {
    char num[48];
    if (level > MAX_DEPTH) return rerr(R, at, "tojson: value nested too deeply");
    switch (v->type) {
    case V_NONE: return buf_str(b, "null");
    case V_BOOL: return buf_str(b, v->u.b ? "true" : "false");
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return buf_str(b, num);
    case V_FLOAT:
        if (isnan(v->u.f)) return buf_str(b, "NaN");
        if (isinf(v->u.f)) return buf_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        fmt_float(v->u.f, num, sizeof num);
        return buf_str(b, num);
    case V_STR: {
        if (buf_str(b, "\"")) return -1;
        for (size_t i = 0; i < v->u.s.n; i++) {
            unsigned char c = (unsigned char)v->u.s.s[i];
            uint8_t fl = v->u.s.taint ? v->u.s.taint[i] : 0;
            char esc[8];
            const char *e = NULL;
            if (c == '"') e = "\\\"";
            else if (c == '\\') e = "\\\\";
            else if (c == '\n') e = "\\n";
            else if (c == '\r') e = "\\r";
            else if (c == '\t') e = "\\t";
            else if (c == '\b') e = "\\b";
            else if (c == '\f') e = "\\f";
            else if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
            if (e ? buf_add(b, e, strlen(e), NULL, fl) : buf_add(b, v->u.s.s + i, 1, NULL, fl)) return -1;
        }
        return buf_str(b, "\"");
    }
    case V_LIST:
    case V_DICT: {
        bool is_list = v->type == V_LIST;
        size_t n = is_list ? v->u.l.n : v->u.d.n;
        if (n == 0) return buf_str(b, is_list ? "[]" : "{}");
        if (buf_str(b, is_list ? "[" : "{")) return -1;
        size_t *order = NULL;
        if (!is_list) {
            order = nl_malloc(n * sizeof *order);
            if (!order) return -1;
            for (size_t i = 0; i < n; i++) order[i] = i;
            if (sort) /* insertion sort by key bytes (stable, small) */
                for (size_t i = 1; i < n; i++)
                    for (size_t j = i; j > 0; j--) {
                        const nl_jv *x = v->u.d.k[order[j - 1]], *y = v->u.d.k[order[j]];
                        size_t m = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
                        int c = memcmp(x->u.s.s, y->u.s.s, m);
                        if (c > 0 || (c == 0 && x->u.s.n > y->u.s.n)) {
                            size_t t = order[j];
                            order[j] = order[j - 1];
                            order[j - 1] = t;
                        } else {
                            break;
                        }
                    }
        }
        int rc = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            if (i) rc = buf_str(b, indent >= 0 ? "," : ", ");
            if (!rc && indent >= 0) {
                rc = buf_str(b, "\n");
                for (int k = 0; k < indent * (level + 1) && !rc; k++) rc = buf_str(b, " ");
            }
            if (rc) break;
            if (is_list) {
                rc = to_json(b, v->u.l.v[i], indent, level + 1, sort, R, at);
            } else {
                rc = to_json(b, v->u.d.k[order[i]], indent, level + 1, sort, R, at) || buf_str(b, ": ") ||
                     to_json(b, v->u.d.v[order[i]], indent, level + 1, sort, R, at);
            }
        }
        free(order);
        if (rc) return -1;
        if (indent >= 0) {
            if (buf_str(b, "\n")) return -1;
            for (int k = 0; k < indent * level; k++)
                if (buf_str(b, " ")) return -1;
        }
        return buf_str(b, is_list ? "]" : "}");
    }
    default: return rerr(R, at, "tojson: a value of type %s is not JSON serializable", type_name(v));
    }
}

/* ---- scopes ---- */

static nl_jv *lookup(const rstate *R, const frame *f, const char *name) {
    for (; f; f = f->parent) {
        nl_jv *v = dict_getn(f->vars, name, strlen(name));
        if (v) return v;
    }
    nl_jv *v = R->ctx ? dict_getn(R->ctx, name, strlen(name)) : NULL;
    return v;
}

static int frame_set(frame *f, const char *name, nl_jv *v) { return nl_jv_set(f->vars, name, v); }

/* ---- evaluation ---- */

static nl_jv *eval(rstate *R, frame *f, const node *n);
static int exec_body(rstate *R, frame *f, const node *body, buf *out);

/* String helpers: Python's whitespace (str.isspace) at a UTF-8 position; its byte length or 0. */
static size_t uspace_at(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c < 0x80) return 0;
    uint32_t cp = 0;
    size_t len = 0;
    if ((c & 0xE0) == 0xC0 && i + 1 < n) { cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); len = 2; }
    else if ((c & 0xF0) == 0xE0 && i + 2 < n) {
        cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
        len = 3;
    } else return 0;
    if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return len;
    return 0;
}
/* Python whitespace ending at byte end (exclusive): its length or 0. */
static size_t uspace_before(const char *s, size_t n, size_t end) {
    if (end == 0) return 0;
    size_t st = end - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80 && end - st < 4) st--;
    size_t l = uspace_at(s, n, st);
    if (l == end - st) return l;
    l = uspace_at(s, n, end - 1);
    return l == 1 ? 1 : 0;
}

static nl_jv *substr(const nl_jv *s, size_t a, size_t b) {
    return jv_strt(s->u.s.s + a, b - a, s->u.s.taint ? s->u.s.taint + a : NULL);
}

/* strip: which 1 left, 2 right, 3 both; chars NULL = whitespace. */
static nl_jv *strip(const nl_jv *s, int which, const nl_jv *chars) {
    size_t a = 0, b = s->u.s.n;
    const char *p = s->u.s.s;
    if (chars) {
        /* chars as a set of UTF-8 characters; ASCII fast path works bytewise for single bytes */
        const char *cs = chars->u.s.s;
        size_t cn = chars->u.s.n;
        for (;;) {
            bool moved = false;
            if (which & 1)
                for (size_t k = 0; k < cn && a < b;) {
                    size_t cl = 1;
                    while (k + cl < cn && ((unsigned char)cs[k + cl] & 0xC0) == 0x80) cl++;
                    if (b - a >= cl && memcmp(p + a, cs + k, cl) == 0) {
                        a += cl;
                        moved = true;
                        k = 0;
                        continue;
                    }
                    k += cl;
                }
            if (which & 2)
                for (size_t k = 0; k < cn && a < b;) {
                    size_t cl = 1;
                    while (k + cl < cn && ((unsigned char)cs[k + cl] & 0xC0) == 0x80) cl++;
                    if (b - a >= cl && memcmp(p + b - cl, cs + k, cl) == 0) {
                        b -= cl;
                        moved = true;
                        k = 0;
                        continue;
                    }
                    k += cl;
                }
            if (!moved) break;
        }
    } else {
        size_t l;
        if (which & 1)
            while (a < b && (l = uspace_at(p, b, a))) a += l;
        if (which & 2)
            while (b > a && (l = uspace_before(p, b, b))) b -= l;
    }
    return substr(s, a, b);
}

static nl_jv *concat_str(const nl_jv *a, const nl_jv *b) {
    buf o = {0};
    if (buf_jv(&o, a) || buf_jv(&o, b)) {
        free(o.s);
        free(o.t);
        return NULL;
    }
    return buf_take(&o);
}

static nl_jv *binop_eval(rstate *R, const node *n, int op, nl_jv *a, nl_jv *b) {
    if (op == OP_EQ) return nl_jv_bool(jv_equal(a, b));
    if (op == OP_NE) return nl_jv_bool(!jv_equal(a, b));
    if (op == OP_IN || op == OP_NOTIN) {
        bool r = false;
        if (b->type == V_STR) {
            if (a->type != V_STR) {
                rerr(R, n, "'in <string>' requires a string as the left operand, not %s", type_name(a));
                return NULL;
            }
            r = a->u.s.n == 0;
            for (size_t i = 0; !r && a->u.s.n <= b->u.s.n && i <= b->u.s.n - a->u.s.n; i++)
                r = memcmp(b->u.s.s + i, a->u.s.s, a->u.s.n) == 0;
        } else if (b->type == V_LIST) {
            for (size_t i = 0; !r && i < b->u.l.n; i++) r = jv_equal(a, b->u.l.v[i]);
        } else if (b->type == V_DICT || b->type == V_NS) {
            r = a->type == V_STR && dict_getn(b, a->u.s.s, a->u.s.n) != NULL;
        } else if (b->type == V_UNDEF) {
            r = false;
        } else {
            rerr(R, n, "argument of type %s is not iterable ('in')", type_name(b));
            return NULL;
        }
        return nl_jv_bool(op == OP_IN ? r : !r);
    }
    if (a->type == V_UNDEF || b->type == V_UNDEF) {
        const nl_jv *u = a->type == V_UNDEF ? a : b;
        rerr(R, n, "'%s' is undefined", u->u.undef ? u->u.undef : "value");
        return NULL;
    }
    if (op >= OP_LT && op <= OP_GE) {
        int c;
        if (is_num(a) && is_num(b)) {
            double x = num_f(a), y = num_f(b);
            c = x < y ? -1 : x > y;
        } else if (a->type == V_STR && b->type == V_STR) {
            size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
            c = memcmp(a->u.s.s, b->u.s.s, m);
            if (c == 0) c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
        } else {
            rerr(R, n, "cannot compare %s with %s", type_name(a), type_name(b));
            return NULL;
        }
        bool r = op == OP_LT ? c < 0 : op == OP_GT ? c > 0 : op == OP_LE ? c <= 0 : c >= 0;
        return nl_jv_bool(r);
    }
    if (op == OP_ADD && a->type == V_STR && b->type == V_STR) return concat_str(a, b);
    if (op == OP_ADD && a->type == V_LIST && b->type == V_LIST) {
        nl_jv *l = nl_jv_list();
        for (size_t i = 0; l && i < a->u.l.n + b->u.l.n; i++)
            if (nl_jv_push(l, ref(i < a->u.l.n ? a->u.l.v[i] : b->u.l.v[i - a->u.l.n]))) {
                nl_jv_unref(l);
                return NULL;
            }
        return l;
    }
    if (op == OP_MUL && ((a->type == V_STR && (b->type == V_INT || b->type == V_BOOL)) ||
                         (b->type == V_STR && (a->type == V_INT || a->type == V_BOOL)))) {
        const nl_jv *s = a->type == V_STR ? a : b;
        int64_t k = num_i(a->type == V_STR ? b : a);
        buf o = {0};
        for (int64_t i = 0; i < k; i++)
            if (buf_jv(&o, s)) {
                free(o.s);
                free(o.t);
                return NULL;
            }
        return buf_take(&o);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
        rerr(R, n, "unsupported operand types for %s: %s and %s", sym[op], type_name(a), type_name(b));
        return NULL;
    }
    bool fl = a->type == V_FLOAT || b->type == V_FLOAT;
    if (op == OP_DIV) {
        if (num_f(b) == 0) {
            rerr(R, n, "division by zero");
            return NULL;
        }
        return jv_float(num_f(a) / num_f(b));
    }
    if (fl) {
        double x = num_f(a), y = num_f(b), r = 0;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_POW: r = pow(x, y); break;
        case OP_FDIV:
        case OP_MOD:
            if (y == 0) {
                rerr(R, n, "division by zero");
                return NULL;
            }
            r = op == OP_FDIV ? floor(x / y) : x - floor(x / y) * y;
            break;
        }
        return jv_float(r);
    }
    int64_t x = num_i(a), y = num_i(b), r = 0;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; break;
    case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; break;
    case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; break;
    case OP_POW:
        if (y < 0) return jv_float(pow((double)x, (double)y));
        r = 1;
        for (int64_t i = 0; i < y; i++)
            if (__builtin_mul_overflow(r, x, &r)) goto ovf;
        break;
    case OP_FDIV:
    case OP_MOD:
        if (y == 0) {
            rerr(R, n, "division by zero");
            return NULL;
        }
        if (x == INT64_MIN && y == -1) goto ovf;
        {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            r = op == OP_FDIV ? q : m;
        }
        break;
    }
    return nl_jv_int(r);
ovf:
    rerr(R, n, "integer overflow");
    return NULL;
}

/* Attribute (or item) of obj named by the string key; V_UNDEF when absent. */
static const char *const str_methods[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                          "replace", "upper", "lower", "title", "capitalize", "find", "count", "join", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static nl_jv *method(nl_jv *self, const char *name) {
    nl_jv *m = jv_new(V_METHOD);
    if (!m) return NULL;
    m->u.m.self = ref(self);
    m->u.m.name = name;
    return m;
}

static nl_jv *get_attr(rstate *R, const node *n, nl_jv *obj, const char *name, size_t len) {
    if (obj->type == V_UNDEF) {
        rerr(R, n, "'%s' is undefined (reading its '%.*s')", obj->u.undef ? obj->u.undef : "value", (int)len, name);
        return NULL;
    }
    if (obj->type == V_DICT || obj->type == V_NS) {
        if (obj->type == V_DICT)
            for (int i = 0; dict_methods[i]; i++)
                if (strlen(dict_methods[i]) == len && !memcmp(dict_methods[i], name, len)) return method(obj, dict_methods[i]);
        nl_jv *v = dict_getn(obj, name, len);
        return v ? ref(v) : jv_undef(n->name ? n->name : "attribute");
    }
    if (obj->type == V_STR)
        for (int i = 0; str_methods[i]; i++)
            if (strlen(str_methods[i]) == len && !memcmp(str_methods[i], name, len)) return method(obj, str_methods[i]);
    return jv_undef(n->name ? n->name : "attribute");
}

static bool norm_index(int64_t *i, size_t n) {
    if (*i < 0) *i += (int64_t)n;
    return *i >= 0 && (uint64_t)*i < n;
}

static nl_jv *get_item(rstate *R, const node *n, nl_jv *obj, nl_jv *key) {
    if (obj->type == V_UNDEF) {
        rerr(R, n, "'%s' is undefined (indexing it)", obj->u.undef ? obj->u.undef : "value");
        return NULL;
    }
    if ((obj->type == V_LIST || obj->type == V_STR) && (key->type == V_INT || key->type == V_BOOL)) {
        int64_t i = num_i(key);
        if (obj->type == V_LIST) {
            if (!norm_index(&i, obj->u.l.n)) return jv_undef("list item");
            return ref(obj->u.l.v[i]);
        }
        /* a character: UTF-8 aware */
        size_t nchar = 0;
        for (size_t k = 0; k < obj->u.s.n; k++) nchar += ((unsigned char)obj->u.s.s[k] & 0xC0) != 0x80;
        if (!norm_index(&i, nchar)) return jv_undef("string index");
        size_t c = 0, a = 0;
        for (size_t k = 0; k < obj->u.s.n; k++)
            if (((unsigned char)obj->u.s.s[k] & 0xC0) != 0x80) {
                if ((int64_t)c == i) {
                    a = k;
                    break;
                }
                c++;
            }
        size_t b = a + 1;
        while (b < obj->u.s.n && ((unsigned char)obj->u.s.s[b] & 0xC0) == 0x80) b++;
        return substr(obj, a, b);
    }
    if (key->type == V_STR) {
        if (obj->type == V_DICT || obj->type == V_NS) {
            nl_jv *v = dict_getn(obj, key->u.s.s, key->u.s.n);
            if (v) return ref(v);
        }
        return get_attr(R, n, obj, key->u.s.s, key->u.s.n);
    }
    return jv_undef("item");
}

/* The iteration items of v as a new list (dicts: keys; strings: characters). */
static nl_jv *as_list(rstate *R, const node *n, const nl_jv *v) {
    nl_jv *l = nl_jv_list();
    if (!l) return NULL;
    switch (v->type) {
    case V_UNDEF: case V_NONE:
        if (v->type == V_NONE) {
            nl_jv_unref(l);
            rerr(R, n, "none is not iterable");
            return NULL;
        }
        return l;
    case V_LIST:
        for (size_t i = 0; i < v->u.l.n; i++)
            if (nl_jv_push(l, ref(v->u.l.v[i]))) goto fail;
        return l;
    case V_DICT:
        for (size_t i = 0; i < v->u.d.n; i++)
            if (nl_jv_push(l, ref(v->u.d.k[i]))) goto fail;
        return l;
    case V_STR:
        for (size_t i = 0; i < v->u.s.n;) {
            size_t j = i + 1;
            while (j < v->u.s.n && ((unsigned char)v->u.s.s[j] & 0xC0) == 0x80) j++;
            if (nl_jv_push(l, substr(v, i, j))) goto fail;
            i = j;
        }
        return l;
    default:
        nl_jv_unref(l);
        rerr(R, n, "a value of type %s is not iterable", type_name(v));
        return NULL;
    }
fail:
    nl_jv_unref(l);
    return NULL;
}

/* Slice a list or a string (by characters) with Python's rules. */
static nl_jv *do_slice(rstate *R, const node *n, nl_jv *obj, nl_jv *const *parts) {
    int64_t st[3];
    bool has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = parts[k] && parts[k]->type != V_NONE;
        if (has[k] && parts[k]->type != V_INT && parts[k]->type != V_BOOL) {
            rerr(R, n, "slice indices must be integers, not %s", type_name(parts[k]));
            return NULL;
        }
        st[k] = has[k] ? num_i(parts[k]) : 0;
    }
    int64_t step = has[2] ? st[2] : 1;
    if (step == 0) {
        rerr(R, n, "slice step cannot be zero");
        return NULL;
    }
    nl_jv *items = obj->type == V_STR || obj->type == V_LIST ? as_list(R, n, obj) : NULL;
    if (!items) {
        if (obj->type != V_STR && obj->type != V_LIST) rerr(R, n, "a value of type %s cannot be sliced", type_name(obj));
        return NULL;
    }
    int64_t len = (int64_t)items->u.l.n;
    int64_t lo, hi;
    if (step > 0) {
        lo = has[0] ? st[0] : 0;
        hi = has[1] ? st[1] : len;
        if (lo < 0) lo = lo + len < 0 ? 0 : lo + len;
        if (hi < 0) hi = hi + len < 0 ? 0 : hi + len;
        if (lo > len) lo = len;
        if (hi > len) hi = len;
    } else {
        lo = has[0] ? st[0] : len - 1;
        hi = has[1] ? st[1] : -1 - len;
        if (lo < 0) lo = lo + len < 0 ? -1 : lo + len;
        else if (lo >= len) lo = len - 1;
        if (hi < 0) hi = hi + len < 0 ? -1 : hi + len;
        else if (hi >= len) hi = len - 1;
    }
    nl_jv *out = nl_jv_list();
    for (int64_t i = lo; out && (step > 0 ? i < hi : i > hi); i += step)
        if (nl_jv_push(out, ref(items->u.l.v[i]))) out = NULL;
    nl_jv_unref(items);
    if (!out) return NULL;
    if (obj->type == V_STR) {
        buf b = {0};
        for (size_t i = 0; i < out->u.l.n; i++)
            if (buf_jv(&b, out->u.l.v[i])) {
                free(b.s);
                free(b.t);
                nl_jv_unref(out);
                return NULL;
            }
        nl_jv_unref(out);
        return buf_take(&b);
    }
    return out;
}

/* ---- calls: evaluated arguments ---- */
typedef struct {
    nl_jv *pos[16];
    int n_pos;
    const char *kw_name[16];
    nl_jv *kw[16];
    int n_kw;
} args;

static void args_free(args *a) {
    for (int i = 0; i < a->n_pos; i++) nl_jv_unref(a->pos[i]);
    for (int i = 0; i < a->n_kw; i++) nl_jv_unref(a->kw[i]);
    a->n_pos = a->n_kw = 0;
}

static int eval_args(rstate *R, frame *f, const node *call, int first, args *a) {
    memset(a, 0, sizeof *a);
    for (int i = first; i < call->n_kids; i++) {
        const node *k = call->kids[i];
        if (a->n_pos >= 16 || a->n_kw >= 16) {
            args_free(a);
            return rerr(R, call, "too many arguments");
        }
        nl_jv *v = eval(R, f, k->kind == N_KWARG ? k->a : k);
        if (!v) {
            args_free(a);
            return -1;
        }
        if (k->kind == N_KWARG) {
            a->kw_name[a->n_kw] = k->name;
            a->kw[a->n_kw++] = v;
        } else {
            a->pos[a->n_pos++] = v;
        }
    }
    return 0;
}

/* Argument i (positional) or keyword `name`; NULL if absent. */
static nl_jv *arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->n_pos) return a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kw_name[k], name)) return a->kw[k];
    return NULL;
}

static int need_str(rstate *R, const node *n, const nl_jv *v, const char *what) {
    if (v && v->type == V_STR) return 0;
    return rerr(R, n, "%s must be a string, not %s", what, v ? type_name(v) : "missing");
}

static nl_jv *call_macro(rstate *R, const node *n, const node *m, const args *a);
static nl_jv *apply_test(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a);

static nl_jv *split_str(rstate *R, const node *n, const nl_jv *s, const nl_jv *sep, int64_t maxsplit, bool from_right) {
    nl_jv *l = nl_jv_list();
    if (!l) return NULL;
    const char *p = s->u.s.s;
    size_t len = s->u.s.n;
    if (sep && sep->type != V_NONE) {
        if (need_str(R, n, sep, "split's separator")) goto fail;
        size_t m = sep->u.s.n;
        if (m == 0) {
            rerr(R, n, "split: empty separator");
            goto fail;
        }
        if (!from_right) {
            size_t a = 0;
            int64_t done = 0;
            for (size_t i = 0; i + m <= len;) {
                if ((maxsplit < 0 || done < maxsplit) && memcmp(p + i, sep->u.s.s, m) == 0) {
                    if (nl_jv_push(l, substr(s, a, i))) goto fail;
                    i += m;
                    a = i;
                    done++;
                } else {
                    i++;
                }
            }
            if (nl_jv_push(l, substr(s, a, len))) goto fail;
        } else {
            /* collect from the right, then reverse */
            size_t b = len;
            int64_t done = 0;
            nl_jv *r = nl_jv_list();
            if (!r) goto fail;
            for (size_t i = len; i >= m;) {
                if ((maxsplit < 0 || done < maxsplit) && memcmp(p + i - m, sep->u.s.s, m) == 0) {
                    if (nl_jv_push(r, substr(s, i, b))) {
                        nl_jv_unref(r);
                        goto fail;
                    }
                    i -= m;
                    b = i;
                    done++;
                } else {
                    i--;
                }
            }
            if (nl_jv_push(r, substr(s, 0, b))) {
                nl_jv_unref(r);
                goto fail;
            }
            for (size_t i = r->u.l.n; i > 0; i--)
                if (nl_jv_push(l, ref(r->u.l.v[i - 1]))) {
                    nl_jv_unref(r);
                    goto fail;
                }
            nl_jv_unref(r);
        }
        return l;
    }
    /* whitespace runs; empty pieces dropped */
    size_t i = 0;
    int64_t done = 0;
    size_t w;
    while (i < len) {
        while (i < len && (w = uspace_at(p, len, i))) i += w;
        if (i >= len) break;
        if (maxsplit >= 0 && done >= maxsplit) {
            size_t e = len;
            while (e > i && (w = uspace_before(p, len, e))) e -= w;
            if (nl_jv_push(l, substr(s, i, e))) goto fail;
            break;
        }
        size_t j = i;
        while (j < len && !uspace_at(p, len, j)) j++;
        if (nl_jv_push(l, substr(s, i, j))) goto fail;
        done++;
        i = j;
    }
    return l;
fail:
    nl_jv_unref(l);
    return NULL;
}

static nl_jv *case_map(const nl_jv *s, int mode) {
    /* ASCII letters only (1 upper, 2 lower, 3 capitalize, 4 title) */
    nl_jv *o = jv_strt(s->u.s.s, s->u.s.n, s->u.s.taint);
    if (!o) return NULL;
    bool word_start = true;
    for (size_t i = 0; i < o->u.s.n; i++) {
        char c = o->u.s.s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool up;
        if (mode == 1) up = true;
        else if (mode == 2) up = false;
        else if (mode == 3) up = i == 0;
        else up = word_start;
        if (alpha) o->u.s.s[i] = up ? (char)(c & ~0x20) : (char)(c | 0x20);
        if (mode == 4) word_start = !alpha && !((unsigned char)c >= 0x80);
    }
    return o;
}

static nl_jv *replace_str(rstate *R, const node *n, const nl_jv *s, const nl_jv *old, const nl_jv *new_, int64_t count) {
    if (need_str(R, n, old, "replace's first argument") || need_str(R, n, new_, "replace's second argument")) return NULL;
    buf b = {0};
    size_t m = old->u.s.n;
    int64_t done = 0;
    int rc = 0;
    if (m == 0) {
        /* Python inserts the replacement between characters */
        for (size_t i = 0; i <= s->u.s.n && !rc; ) {
            if (count < 0 || done < count) {
                rc = buf_jv(&b, new_);
                done++;
            }
            if (i == s->u.s.n) break;
            size_t j = i + 1;
            while (j < s->u.s.n && ((unsigned char)s->u.s.s[j] & 0xC0) == 0x80) j++;
            if (!rc) rc = buf_add(&b, s->u.s.s + i, j - i, s->u.s.taint ? s->u.s.taint + i : NULL, 0);
            i = j;
        }
    } else {
        size_t i = 0;
        while (i < s->u.s.n && !rc) {
            if ((count < 0 || done < count) && i + m <= s->u.s.n && memcmp(s->u.s.s + i, old->u.s.s, m) == 0) {
                rc = buf_jv(&b, new_);
                i += m;
                done++;
            } else {
                rc = buf_add(&b, s->u.s.s + i, 1, s->u.s.taint ? s->u.s.taint + i : NULL, 0);
                i++;
            }
        }
    }
    if (rc) {
        free(b.s);
        free(b.t);
        return NULL;
    }
    return buf_take(&b);
}

static nl_jv *call_method(rstate *R, const node *n, nl_jv *self, const char *name, const args *a) {
    if (self->type == V_DICT) {
        if (!strcmp(name, "get")) {
            nl_jv *k = arg(a, 0, "key");
            if (!k) {
                rerr(R, n, "get() needs a key");
                return NULL;
            }
            nl_jv *v = k->type == V_STR ? dict_getn(self, k->u.s.s, k->u.s.n) : NULL;
            if (v) return ref(v);
            nl_jv *d = arg(a, 1, "default");
            return d ? ref(d) : nl_jv_none();
        }
        nl_jv *l = nl_jv_list();
        for (size_t i = 0; l && i < self->u.d.n; i++) {
            nl_jv *e;
            if (!strcmp(name, "keys")) e = ref(self->u.d.k[i]);
            else if (!strcmp(name, "values")) e = ref(self->u.d.v[i]);
            else {
                e = nl_jv_list();
                if (e && (nl_jv_push(e, ref(self->u.d.k[i])) || nl_jv_push(e, ref(self->u.d.v[i])))) {
                    nl_jv_unref(e);
                    e = NULL;
                }
            }
            if (nl_jv_push(l, e)) {
                nl_jv_unref(l);
                return NULL;
            }
        }
        return l;
    }
    /* string methods */
    nl_jv *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        bool start = name[0] == 's';
        if (!a0) {
            rerr(R, n, "%s() needs an argument", name);
            return NULL;
        }
        const nl_jv *cands[64];
        size_t nc = 0;
        if (a0->type == V_LIST)
            for (size_t i = 0; i < a0->u.l.n && nc < 64; i++) cands[nc++] = a0->u.l.v[i];
        else
            cands[nc++] = a0;
        for (size_t i = 0; i < nc; i++) {
            if (need_str(R, n, cands[i], name)) return NULL;
            size_t m = cands[i]->u.s.n;
            if (m <= self->u.s.n && memcmp(self->u.s.s + (start ? 0 : self->u.s.n - m), cands[i]->u.s.s, m) == 0)
                return nl_jv_bool(true);
        }
        return nl_jv_bool(false);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        nl_jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        return split_str(R, n, self, sep, mx ? num_i(mx) : -1, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (a0 && a0->type != V_NONE && need_str(R, n, a0, name)) return NULL;
        return strip(self, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, a0 && a0->type == V_STR ? a0 : NULL);
    }
    if (!strcmp(name, "replace")) {
        nl_jv *c = arg(a, 2, "count");
        return replace_str(R, n, self, a0, a1, c ? num_i(c) : -1);
    }
    if (!strcmp(name, "upper")) return case_map(self, 1);
    if (!strcmp(name, "lower")) return case_map(self, 2);
    if (!strcmp(name, "capitalize")) {
        nl_jv *lo = case_map(self, 2);
        if (lo && lo->u.s.n && lo->u.s.s[0] >= 'a' && lo->u.s.s[0] <= 'z') lo->u.s.s[0] = (char)(lo->u.s.s[0] & ~0x20);
        return lo;
    }
    if (!strcmp(name, "title")) return case_map(self, 4);
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        if (need_str(R, n, a0, name)) return NULL;
        size_t m = a0->u.s.n;
        int64_t cnt = 0, at = -1;
        for (size_t i = 0; i + m <= self->u.s.n;) {
            if (memcmp(self->u.s.s + i, a0->u.s.s, m) == 0) {
                if (at < 0) {
                    size_t c = 0;
                    for (size_t k = 0; k < i; k++) c += ((unsigned char)self->u.s.s[k] & 0xC0) != 0x80;
                    at = (int64_t)c;
                }
                cnt++;
                i += m ? m : 1;
            } else {
                i++;
            }
        }
        return nl_jv_int(name[0] == 'f' ? at : cnt);
    }
    if (!strcmp(name, "join")) {
        if (!a0) {
            rerr(R, n, "join() needs an argument");
            return NULL;
        }
        nl_jv *items = as_list(R, n, a0);
        if (!items) return NULL;
        buf b = {0};
        int rc = 0;
        for (size_t i = 0; i < items->u.l.n && !rc; i++) {
            if (i) rc = buf_jv(&b, self);
            if (!rc && need_str(R, n, items->u.l.v[i], "join's items")) rc = -1;
            if (!rc) rc = buf_jv(&b, items->u.l.v[i]);
        }
        nl_jv_unref(items);
        if (rc) {
            free(b.s);
            free(b.t);
            return NULL;
        }
        return buf_take(&b);
    }
    rerr(R, n, "method '%s' is not supported", name);
    return NULL;
}

static nl_jv *call_value(rstate *R, frame *f, const node *n, nl_jv *fn, const args *a) {
    (void)f;
    if (++R->steps > MAX_STEPS) {
        rerr(R, n, "the template ran too long");
        return NULL;
    }
    if (fn->type == V_METHOD) return call_method(R, n, fn->u.m.self, fn->u.m.name, a);
    if (fn->type == V_MACRO) return call_macro(R, n, fn->u.macro, a);
    if (fn->type == V_FUNC) {
        switch (fn->u.func) {
        case B_RAISE: {
            nl_jv *m = arg(a, 0, NULL);
            nl_jv *s = m ? str_of(m) : NULL;
            rerr(R, n, "the template raised an error: %s", s ? s->u.s.s : "");
            nl_jv_unref(s);
            return NULL;
        }
        case B_NAMESPACE:
        case B_DICT: {
            nl_jv *ns = jv_new(fn->u.func == B_NAMESPACE ? V_NS : V_DICT);
            if (!ns) return NULL;
            if (a->n_pos && a->pos[0]->type == V_DICT)
                for (size_t i = 0; i < a->pos[0]->u.d.n; i++)
                    if (dict_setv(ns, ref(a->pos[0]->u.d.k[i]), ref(a->pos[0]->u.d.v[i]))) {
                        nl_jv_unref(ns);
                        return NULL;
                    }
            for (int i = 0; i < a->n_kw; i++)
                if (nl_jv_set(ns, a->kw_name[i], ref(a->kw[i]))) {
                    nl_jv_unref(ns);
                    return NULL;
                }
            return ns;
        }
        case B_RANGE: {
            int64_t lo = 0, hi = 0, st = 1;
            for (int i = 0; i < a->n_pos; i++)
                if (a->pos[i]->type != V_INT) {
                    rerr(R, n, "range() arguments must be integers");
                    return NULL;
                }
            if (a->n_pos == 1) hi = a->pos[0]->u.i;
            else if (a->n_pos >= 2) {
                lo = a->pos[0]->u.i;
                hi = a->pos[1]->u.i;
                if (a->n_pos >= 3) st = a->pos[2]->u.i;
            }
            if (st == 0) {
                rerr(R, n, "range() step must not be zero");
                return NULL;
            }
            nl_jv *l = nl_jv_list();
            for (int64_t i = lo; l && (st > 0 ? i < hi : i > hi); i += st) {
                if (l->u.l.n >= 1000000) {
                    rerr(R, n, "range() too long");
                    nl_jv_unref(l);
                    return NULL;
                }
                if (nl_jv_push(l, nl_jv_int(i))) l = NULL;
            }
            return l;
        }
        }
    }
    if (fn->type == V_UNDEF) rerr(R, n, "'%s' is undefined (called as a function)", fn->u.undef ? fn->u.undef : "value");
    else rerr(R, n, "a value of type %s is not callable", type_name(fn));
    return NULL;
}

static nl_jv *call_macro(rstate *R, const node *n, const node *m, const args *a) {
    if (++R->depth > MAX_DEPTH) {
        R->depth--;
        rerr(R, n, "macro calls nested too deeply");
        return NULL;
    }
    frame mf = {nl_jv_dict(), R->root};
    nl_jv *res = NULL;
    if (!mf.vars) goto done;
    if (a->n_pos > m->n_names) {
        rerr(R, n, "macro '%s' takes %d arguments, %d given", m->name, m->n_names, a->n_pos);
        goto done;
    }
    for (int i = 0; i < m->n_names; i++) {
        nl_jv *v = arg(a, i, m->names[i]);
        if (v) v = ref(v);
        else if (m->kids[i]) v = eval(R, &mf, m->kids[i]);
        else v = jv_undef(m->names[i]);
        if (!v || frame_set(&mf, m->names[i], v)) goto done;
    }
    for (int k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (int i = 0; i < m->n_names; i++) known |= !strcmp(m->names[i], a->kw_name[k]);
        if (!known) {
            rerr(R, n, "macro '%s' has no parameter '%s'", m->name, a->kw_name[k]);
            goto done;
        }
    }
    buf out = {0};
    if (exec_body(R, &mf, m->b, &out)) {
        free(out.s);
        free(out.t);
        goto done;
    }
    res = buf_take(&out);
done:
    nl_jv_unref(mf.vars);
    R->depth--;
    return res;
}

/* select/reject/selectattr/rejectattr/map over a sequence. */
static nl_jv *filter_seq(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
    nl_jv *items = as_list(R, n, v);
    if (!items) return NULL;
    nl_jv *out = nl_jv_list();
    if (!out) goto fail;
    bool attr = id == F_SELECTATTR || id == F_REJECTATTR || id == F_MAP;
    nl_jv *attrname = attr ? arg(a, 0, "attribute") : NULL;
    if (id == F_MAP && !attrname) {
        rerr(R, n, "map: only map(attribute=NAME) and map('filter') are supported");
        goto fail;
    }
    if (attr && need_str(R, n, attrname, "the attribute name")) goto fail;
    int ti = -1;
    int targ0 = attr ? 1 : 0;
    nl_jv *tname = id == F_MAP ? NULL : arg(a, targ0, NULL);
    bool map_filter = false;
    int map_fid = -1;
    if (id == F_MAP && a->n_pos >= 1 && !arg(a, -1, "attribute")) {
        /* map('filtername', ...) */
        map_filter = true;
        map_fid = find_name(filter_names, F_N, a->pos[0]->u.s.s, a->pos[0]->u.s.n);
        if (map_fid != F_STRING && map_fid != F_TRIM && map_fid != F_LOWER && map_fid != F_UPPER && map_fid != F_LENGTH &&
            map_fid != F_INT && map_fid != F_FLOAT && map_fid != F_TOJSON) {
            rerr(R, n, "map: filter '%s' is not supported there", a->pos[0]->u.s.s);
            goto fail;
        }
    }
    if (tname) {
        if (need_str(R, n, tname, "the test name")) goto fail;
        ti = find_name(test_names, TS_N, tname->u.s.s, tname->u.s.n);
        if (ti < 0) {
            rerr(R, n, "test '%s' is not supported", tname->u.s.s);
            goto fail;
        }
    }
    args targs = {0};
    for (int i = targ0 + 1; i < a->n_pos && targs.n_pos < 16; i++) targs.pos[targs.n_pos++] = a->pos[i];
    for (size_t i = 0; i < items->u.l.n; i++) {
        nl_jv *it = items->u.l.v[i];
        nl_jv *subj = it;
        nl_jv *tmp = NULL;
        if (attr && !map_filter) {
            tmp = get_item(R, n, it, attrname);
            if (!tmp) goto fail;
            subj = tmp;
        }
        if (id == F_MAP) {
            nl_jv *mv;
            if (map_filter) {
                if (map_fid == F_STRING) mv = str_of(it);
                else if (map_fid == F_TRIM) mv = it->type == V_STR ? strip(it, 3, NULL) : str_of(it);
                else if (map_fid == F_LOWER || map_fid == F_UPPER) mv = it->type == V_STR ? case_map(it, map_fid == F_UPPER ? 1 : 2) : str_of(it);
                else if (map_fid == F_LENGTH) mv = nl_jv_int(it->type == V_STR ? (int64_t)it->u.s.n : it->type == V_LIST ? (int64_t)it->u.l.n : (int64_t)it->u.d.n);
                else {
                    buf b = {0};
                    if (to_json(&b, it, -1, 0, false, R, n)) {
                        free(b.s);
                        free(b.t);
                        goto fail;
                    }
                    mv = buf_take(&b);
                }
            } else {
                mv = ref(subj);
                if (mv->type == V_UNDEF) {
                    nl_jv *d = arg(a, -1, "default");
                    if (d) {
                        nl_jv_unref(mv);
                        mv = ref(d);
                    }
                }
            }
            nl_jv_unref(tmp);
            if (nl_jv_push(out, mv)) goto fail;
            continue;
        }
        bool keep;
        if (ti >= 0) {
            nl_jv *r = apply_test(R, f, n, ti, subj, &targs);
            if (!r) {
                nl_jv_unref(tmp);
                goto fail;
            }
            keep = truthy(r);
            nl_jv_unref(r);
        } else {
            keep = truthy(subj);
        }
        nl_jv_unref(tmp);
        if (id == F_REJECT || id == F_REJECTATTR) keep = !keep;
        if (keep && nl_jv_push(out, ref(it))) goto fail;
    }
    nl_jv_unref(items);
    return out;
fail:
    nl_jv_unref(items);
    nl_jv_unref(out);
    return NULL;
}

static nl_jv *apply_filter(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
    switch (id) {
    case F_TRIM: {
        nl_jv *s = str_of(v);
        if (!s) return NULL;
        nl_jv *c = arg(a, 0, "chars");
        nl_jv *r = strip(s, 3, c && c->type == V_STR ? c : NULL);
        nl_jv_unref(s);
        return r;
    }
    case F_LENGTH:
    case F_COUNT:
        switch (v->type) {
        case V_STR: {
            int64_t c = 0;
            for (size_t i = 0; i < v->u.s.n; i++) c += ((unsigned char)v->u.s.s[i] & 0xC0) != 0x80;
            return nl_jv_int(c);
        }
        case V_LIST: return nl_jv_int((int64_t)v->u.l.n);
        case V_DICT: case V_NS: return nl_jv_int((int64_t)v->u.d.n);
        case V_UNDEF: return nl_jv_int(0);
        default: rerr(R, n, "length: a value of type %s has no length", type_name(v)); return NULL;
        }
    case F_TOJSON: {
        nl_jv *ind = arg(a, 0, "indent"), *sk = arg(a, -1, "sort_keys");
        int indent = ind && ind->type != V_NONE ? (int)num_i(ind) : -1;
        if (indent > 64) indent = 64;
        buf b = {0};
        if (to_json(&b, v, indent, 0, sk && truthy(sk), R, n)) {
            free(b.s);
            free(b.t);
            return NULL;
        }
        return buf_take(&b);
    }
    case F_ITEMS:
        if (v->type == V_UNDEF) return nl_jv_list();
        if (v->type != V_DICT && v->type != V_NS) {
            rerr(R, n, "items: a value of type %s is not a mapping", type_name(v));
            return NULL;
        }
        return call_method(R, n, v, "items", a);
    case F_STRING: return str_of(v);
    case F_SAFE: return ref(v);
    case F_JOIN: {
        nl_jv *items = as_list(R, n, v);
        if (!items) return NULL;
        nl_jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        buf b = {0};
        int rc = 0;
        for (size_t i = 0; i < items->u.l.n && !rc; i++) {
            if (i && sep) rc = to_str(&b, sep);
            nl_jv *it = items->u.l.v[i], *tmp = NULL;
            if (attr && !rc) {
                tmp = get_item(R, n, it, attr);
                if (!tmp) rc = -1;
                it = tmp;
            }
            if (!rc) rc = to_str(&b, it);
            nl_jv_unref(tmp);
        }
        nl_jv_unref(items);
        if (rc) {
            free(b.s);
            free(b.t);
            return NULL;
        }
        return buf_take(&b);
    }
    case F_SELECT: case F_REJECT: case F_SELECTATTR: case F_REJECTATTR: case F_MAP:
        return filter_seq(R, f, n, id, v, a);
    case F_FIRST:
    case F_LAST: {
        nl_jv *items = as_list(R, n, v);
        if (!items) return NULL;
        nl_jv *r = items->u.l.n ? ref(items->u.l.v[id == F_FIRST ? 0 : items->u.l.n - 1]) : jv_undef("first/last of an empty sequence");
        nl_jv_unref(items);
        return r;
    }
    case F_LIST: return as_list(R, n, v);
    case F_REVERSE: {
        if (v->type == V_STR) {
            nl_jv *parts[3] = {NULL, NULL, NULL};
            nl_jv *m1 = nl_jv_int(-1);
            parts[2] = m1;
            nl_jv *r = m1 ? do_slice(R, n, v, parts) : NULL;
            nl_jv_unref(m1);
            return r;
        }
        nl_jv *items = as_list(R, n, v);
        if (!items) return NULL;
        for (size_t i = 0; i < items->u.l.n / 2; i++) {
            nl_jv *t = items->u.l.v[i];
            items->u.l.v[i] = items->u.l.v[items->u.l.n - 1 - i];
            items->u.l.v[items->u.l.n - 1 - i] = t;
        }
        return items;
    }
    case F_DEFAULT:
    case F_D: {
        nl_jv *d = arg(a, 0, "default_value"), *b = arg(a, 1, "boolean");
        bool use = v->type == V_UNDEF || (b && truthy(b) && !truthy(v));
        if (use) return d ? ref(d) : jv_cstr("");
        return ref(v);
    }
    case F_UPPER: case F_LOWER: case F_CAPITALIZE: case F_TITLE: {
        nl_jv *s = str_of(v);
        if (!s) return NULL;
        nl_jv *r = call_method(R, n, s, id == F_UPPER ? "upper" : id == F_LOWER ? "lower" : id == F_TITLE ? "title" : "capitalize", a);
        nl_jv_unref(s);
        return r;
    }
    case F_REPLACE: {
        nl_jv *s = str_of(v);
        if (!s) return NULL;
        nl_jv *c = arg(a, 2, "count");
        nl_jv *r = replace_str(R, n, s, arg(a, 0, "old"), arg(a, 1, "new"), c ? num_i(c) : -1);
        nl_jv_unref(s);
        return r;
    }
    case F_INT:
        if (is_num(v)) return nl_jv_int(num_i(v));
        if (v->type == V_STR) return nl_jv_int(strtoll(v->u.s.s, NULL, 10));
        return nl_jv_int(0);
    case F_FLOAT:
        if (is_num(v)) return jv_float(num_f(v));
        if (v->type == V_STR) return jv_float(strtod(v->u.s.s, NULL));
        return jv_float(0);
    case F_ABS:
        if (v->type == V_FLOAT) return jv_float(fabs(v->u.f));
        if (is_num(v)) return nl_jv_int(num_i(v) < 0 ? -num_i(v) : num_i(v));
        rerr(R, n, "abs: a value of type %s is not a number", type_name(v));
        return NULL;
    case F_INDENT: {
        nl_jv *s = str_of(v);
        if (!s) return NULL;
        nl_jv *w = arg(a, 0, "width"), *fst = arg(a, 1, "first"), *bl = arg(a, 2, "blank");
        int64_t width = w ? num_i(w) : 4;
        buf pad = {0}, b = {0};
        int rc = 0;
        for (int64_t i = 0; i < width && !rc; i++) rc = buf_str(&pad, " ");
        size_t st = 0;
        bool first_line = true;
        for (size_t i = 0; i <= s->u.s.n && !rc; i++) {
            if (i < s->u.s.n && s->u.s.s[i] != '\n') continue;
            bool blank = i == st;
            if ((first_line ? fst && truthy(fst) : true) && (!blank || (bl && truthy(bl))) && pad.n) rc = buf_add(&b, pad.s, pad.n, NULL, 0);
            if (!rc) rc = buf_add(&b, s->u.s.s + st, i - st + (i < s->u.s.n), s->u.s.taint ? s->u.s.taint + st : NULL, 0);
            st = i + 1;
            first_line = false;
        }
        free(pad.s);
        free(pad.t);
        nl_jv_unref(s);
        if (rc) {
            free(b.s);
            free(b.t);
            return NULL;
        }
        return buf_take(&b);
    }
    default:
        rerr(R, n, "filter '%s' is not supported", filter_names[id]);
        return NULL;
    }
}

static nl_jv *apply_test(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
    (void)f;
    nl_jv *x = arg(a, 0, NULL);
    bool r;
    switch (id) {
    case TS_DEFINED: r = v->type != V_UNDEF; break;
    case TS_UNDEFINED: r = v->type == V_UNDEF; break;
    case TS_NONE: r = v->type == V_NONE; break;
    case TS_STRING: r = v->type == V_STR; break;
    case TS_MAPPING: r = v->type == V_DICT || v->type == V_NS; break;
    case TS_ITERABLE: r = v->type == V_STR || v->type == V_LIST || v->type == V_DICT || v->type == V_UNDEF; break;
    case TS_SEQUENCE: r = v->type == V_STR || v->type == V_LIST || v->type == V_DICT; break;
    case TS_NUMBER: r = is_num(v); break;
    case TS_INTEGER: r = v->type == V_INT; break;
    case TS_FLOAT: r = v->type == V_FLOAT; break;
    case TS_BOOLEAN: r = v->type == V_BOOL; break;
    case TS_TRUE: r = v->type == V_BOOL && v->u.b; break;
    case TS_FALSE: r = v->type == V_BOOL && !v->u.b; break;
    case TS_EQUALTO: case TS_EQ: case TS_EQEQ: case TS_NE: case TS_SAMEAS: case TS_GT: case TS_LT: case TS_GE: case TS_LE:
    case TS_IN: case TS_DIVISIBLEBY:
        if (!x) {
            rerr(R, n, "test '%s' needs an argument", test_names[id]);
            return NULL;
        }
        if (id == TS_SAMEAS) {
            r = v->type == x->type && ((v->type == V_NONE || v->type == V_UNDEF) || (v->type == V_BOOL && v->u.b == x->u.b) || v == x);
        } else if (id == TS_IN) {
            nl_jv *b = binop_eval(R, n, OP_IN, v, x);
            if (!b) return NULL;
            r = b->u.b;
            nl_jv_unref(b);
        } else if (id == TS_DIVISIBLEBY) {
            if (!is_num(v) || !is_num(x) || num_i(x) == 0) {
                rerr(R, n, "divisibleby needs non-zero numbers");
                return NULL;
            }
            r = num_i(v) % num_i(x) == 0;
        } else {
            int op = id == TS_NE ? OP_NE : id == TS_GT ? OP_GT : id == TS_LT ? OP_LT : id == TS_GE ? OP_GE : id == TS_LE ? OP_LE : OP_EQ;
            nl_jv *b = binop_eval(R, n, op, v, x);
            if (!b) return NULL;
            r = b->u.b;
            nl_jv_unref(b);
        }
        break;
    case TS_ODD: case TS_EVEN:
        if (!is_num(v)) {
            rerr(R, n, "test '%s' needs a number", test_names[id]);
            return NULL;
        }
        r = (num_i(v) % 2 != 0) == (id == TS_ODD);
        break;
    case TS_CALLABLE: r = v->type == V_MACRO || v->type == V_FUNC || v->type == V_METHOD; break;
    case TS_LOWER: case TS_UPPER: {
        r = v->type == V_STR;
        bool any = false;
        for (size_t i = 0; r && i < v->u.s.n; i++) {
            char c = v->u.s.s[i];
            if (c >= 'a' && c <= 'z') { any = true; if (id == TS_UPPER) r = false; }
            if (c >= 'A' && c <= 'Z') { any = true; if (id == TS_LOWER) r = false; }
        }
        r = r && any;
        break;
    }
    default: rerr(R, n, "test %d is not supported", id); return NULL;
    }
    return nl_jv_bool(r);
}

static nl_jv *eval(rstate *R, frame *f, const node *n) {
    if (++R->depth > MAX_DEPTH * 4) {
        R->depth--;
        rerr(R, n, "expression nested too deeply");
        return NULL;
    }
    nl_jv *res = NULL, *a = NULL, *b = NULL;
    switch (n->kind) {
    case N_LIT: res = ref(n->lit); break;
    case N_NAME: {
        nl_jv *v = lookup(R, f, n->name);
        if (v) {
            res = ref(v);
            break;
        }
        int bi = find_name(builtin_names, B_N, n->name, strlen(n->name));
        if (bi >= 0) {
            res = jv_new(V_FUNC);
            if (res) res->u.func = bi;
            break;
        }
        res = jv_undef(n->name);
        break;
    }
    case N_ATTR:
        if (!(a = eval(R, f, n->a))) break;
        res = get_attr(R, n, a, n->name, strlen(n->name));
        break;
    case N_ITEM:
        if (!(a = eval(R, f, n->a)) || !(b = eval(R, f, n->b))) break;
        res = get_item(R, n, a, b);
        break;
    case N_SLICE: {
        if (!(a = eval(R, f, n->a))) break;
        nl_jv *parts[3] = {NULL, NULL, NULL};
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++)
            if (n->kids[k] && !(parts[k] = eval(R, f, n->kids[k]))) ok = false;
        if (ok) res = do_slice(R, n, a, parts);
        for (int k = 0; k < 3; k++) nl_jv_unref(parts[k]);
        break;
    }
    case N_CALL: {
        if (!(a = eval(R, f, n->a))) break;
        args ar;
        if (eval_args(R, f, n, 0, &ar)) break;
        res = call_value(R, f, n, a, &ar);
        args_free(&ar);
        break;
    }
    case N_FILTER: {
        if (!(a = eval(R, f, n->a))) break;
        args ar;
        if (eval_args(R, f, n, 0, &ar)) break;
        res = apply_filter(R, f, n, n->filter_id, a, &ar);
        args_free(&ar);
        break;
    }
    case N_TEST: {
        if (!(a = eval(R, f, n->a))) break;
        args ar;
        if (eval_args(R, f, n, 0, &ar)) break;
        res = apply_test(R, f, n, n->filter_id, a, &ar);
        args_free(&ar);
        if (res && n->op) res->u.b = !res->u.b;
        break;
    }
    case N_NOT:
        if (!(a = eval(R, f, n->a))) break;
        res = nl_jv_bool(!truthy(a));
        break;
    case N_NEG:
    case N_POS:
        if (!(a = eval(R, f, n->a))) break;
        if (!is_num(a)) {
            rerr(R, n, "bad operand type for unary %c: %s", n->kind == N_NEG ? '-' : '+', type_name(a));
            break;
        }
        if (n->kind == N_POS) res = a->type == V_FLOAT ? jv_float(a->u.f) : nl_jv_int(num_i(a));
        else if (a->type == V_FLOAT) res = jv_float(-a->u.f);
        else if (num_i(a) == INT64_MIN) rerr(R, n, "integer overflow");
        else res = nl_jv_int(-num_i(a));
        break;
    case N_BIN:
        if (!(a = eval(R, f, n->a)) || !(b = eval(R, f, n->b))) break;
        res = binop_eval(R, n, n->op, a, b);
        break;
    case N_CONCAT: {
        if (!(a = eval(R, f, n->a)) || !(b = eval(R, f, n->b))) break;
        buf o = {0};
        if (to_str(&o, a) || to_str(&o, b)) {
            free(o.s);
            free(o.t);
            break;
        }
        res = buf_take(&o);
        break;
    }
    case N_AND:
        if (!(a = eval(R, f, n->a))) break;
        res = truthy(a) ? eval(R, f, n->b) : ref(a);
        break;
    case N_OR:
        if (!(a = eval(R, f, n->a))) break;
        res = truthy(a) ? ref(a) : eval(R, f, n->b);
        break;
    case N_COND:
        if (!(a = eval(R, f, n->a))) break;
        res = truthy(a) ? eval(R, f, n->b) : n->c ? eval(R, f, n->c) : jv_undef("the else of a conditional");
        break;
    case N_LIST:
    case N_TUPLE:
        res = nl_jv_list();
        for (int i = 0; res && i < n->n_kids; i++)
            if (nl_jv_push(res, eval(R, f, n->kids[i]))) {
                nl_jv_unref(res);
                res = NULL;
            }
        break;
    case N_DICT:
        res = nl_jv_dict();
        for (int i = 0; res && i + 1 < n->n_kids; i += 2) {
            nl_jv *k = eval(R, f, n->kids[i]);
            if (k && k->type != V_STR) {
                rerr(R, n, "dict keys must be strings here, not %s", type_name(k));
                nl_jv_unref(k);
                k = NULL;
            }
            if (!k || dict_setv(res, k, eval(R, f, n->kids[i + 1]))) {
                nl_jv_unref(res);
                res = NULL;
            }
        }
        break;
    default: rerr(R, n, "not an expression"); break;
    }
    nl_jv_unref(a);
    nl_jv_unref(b);
    R->depth--;
    return res;
}

static int emit(rstate *R, const node *n, buf *out, const nl_jv *v) {
    if (v->type == V_UNDEF) return 0;
    if (v->type == V_FUNC || v->type == V_METHOD || v->type == V_MACRO)
        return rerr(R, n, "cannot print a %s", type_name(v));
    return to_str(out, v);
}

static int exec_for(rstate *R, frame *f, const node *n, buf *out) {
    nl_jv *it = eval(R, f, n->a);
    if (!it) return -1;
    nl_jv *items = it->type == V_DICT ? as_list(R, n, it) : as_list(R, n, it);
    nl_jv_unref(it);
    if (!items) return -1;
    int rc = 0;
    /* the loop filter applies before loop.* is counted */
    if (n->b) {
        nl_jv *kept = nl_jv_list();
        for (size_t i = 0; kept && i < items->u.l.n && !rc; i++) {
            frame ff = {nl_jv_dict(), f};
            if (!ff.vars) {
                rc = -1;
                break;
            }
            nl_jv *x = items->u.l.v[i];
            if (n->n_names == 1) rc = frame_set(&ff, n->names[0], ref(x));
            else
                for (int k = 0; k < n->n_names && !rc; k++)
                    rc = frame_set(&ff, n->names[k], x->type == V_LIST && (size_t)k < x->u.l.n ? ref(x->u.l.v[k]) : jv_undef(n->names[k]));
            nl_jv *c = rc ? NULL : eval(R, &ff, n->b);
            if (!c) rc = -1;
            else if (truthy(c)) rc = nl_jv_push(kept, ref(x));
            nl_jv_unref(c);
            nl_jv_unref(ff.vars);
        }
        nl_jv_unref(items);
        if (!kept || rc) {
            nl_jv_unref(kept);
            return -1;
        }
        items = kept;
    }
    size_t len = items->u.l.n;
    for (size_t i = 0; i < len && !rc; i++) {
        if (++R->steps > MAX_STEPS) {
            rc = rerr(R, n, "the template ran too long");
            break;
        }
        frame ff = {nl_jv_dict(), f};
        nl_jv *loop = nl_jv_dict();
        if (!ff.vars || !loop) {
            nl_jv_unref(ff.vars);
            nl_jv_unref(loop);
            rc = -1;
            break;
        }
        rc = nl_jv_set(loop, "index", nl_jv_int((int64_t)i + 1)) || nl_jv_set(loop, "index0", nl_jv_int((int64_t)i)) ||
             nl_jv_set(loop, "revindex", nl_jv_int((int64_t)(len - i))) ||
             nl_jv_set(loop, "revindex0", nl_jv_int((int64_t)(len - i - 1))) ||
             nl_jv_set(loop, "first", nl_jv_bool(i == 0)) || nl_jv_set(loop, "last", nl_jv_bool(i + 1 == len)) ||
             nl_jv_set(loop, "length", nl_jv_int((int64_t)len)) ||
             (i > 0 && nl_jv_set(loop, "previtem", ref(items->u.l.v[i - 1]))) ||
             (i + 1 < len && nl_jv_set(loop, "nextitem", ref(items->u.l.v[i + 1]))) ||
             nl_jv_set(ff.vars, "loop", loop);
        nl_jv *x = items->u.l.v[i];
        if (!rc) {
            if (n->n_names == 1) {
                rc = frame_set(&ff, n->names[0], ref(x));
            } else {
                nl_jv *tu = x->type == V_LIST ? ref(x) : NULL;
                if (!tu || tu->u.l.n != (size_t)n->n_names)
                    rc = rerr(R, n, "cannot unpack a %s into %d loop variables", type_name(x), n->n_names);
                for (int k = 0; k < n->n_names && !rc; k++) rc = frame_set(&ff, n->names[k], ref(tu->u.l.v[k]));
                nl_jv_unref(tu);
            }
        }
        if (!rc) rc = exec_body(R, &ff, n->kids[0], out);
        nl_jv_unref(ff.vars);
        if (R->brk == 1) {
            R->brk = 0;
            break;
        }
        R->brk = 0;
    }
    if (!rc && len == 0 && n->c) rc = exec_body(R, f, n->c, out);
    nl_jv_unref(items);
    return rc;
}

static int exec_body(rstate *R, frame *f, const node *body, buf *out) {
    for (int i = 0; i < body->n_kids && !R->brk; i++) {
        const node *s = body->kids[i];
        switch (s->kind) {
        case S_TEXT:
            if (buf_jv(out, s->lit)) return -1;
            break;
        case S_OUT: {
            nl_jv *v = eval(R, f, s->a);
            if (!v) return -1;
            int rc = emit(R, s, out, v);
            nl_jv_unref(v);
            if (rc) return -1;
            break;
        }
        case S_BODY:
            if (exec_body(R, f, s, out)) return -1;
            break;
        case S_IF: {
            for (int k = 0; k + 1 < s->n_kids; k += 2) {
                bool take = true;
                if (s->kids[k]) {
                    nl_jv *c = eval(R, f, s->kids[k]);
                    if (!c) return -1;
                    take = truthy(c);
                    nl_jv_unref(c);
                }
                if (take) {
                    if (exec_body(R, f, s->kids[k + 1], out)) return -1;
                    break;
                }
            }
            break;
        }
        case S_FOR:
            if (exec_for(R, f, s, out)) return -1;
            break;
        case S_SET: {
            nl_jv *v;
            if (s->a) {
                v = eval(R, f, s->a);
            } else {
                buf b = {0};
                if (exec_body(R, f, s->b, &b)) {
                    free(b.s);
                    free(b.t);
                    return -1;
                }
                v = buf_take(&b);
                if (v && s->c) {
                    /* the filters over the captured text: bind it to the placeholder */
                    frame pf = {nl_jv_dict(), f};
                    nl_jv *r = NULL;
                    if (pf.vars && !frame_set(&pf, " block", v)) r = eval(R, &pf, s->c);
                    else nl_jv_unref(v);
                    nl_jv_unref(pf.vars);
                    v = r;
                }
            }
            if (!v) return -1;
            if (s->attr) {
                nl_jv *ns = lookup(R, f, s->name);
                if (!ns || ns->type != V_NS) {
                    nl_jv_unref(v);
                    return rerr(R, s, "'%s' is not a namespace (set %s.%s)", s->name, s->name, s->attr);
                }
                if (nl_jv_set(ns, s->attr, v)) return -1;
            } else if (frame_set(f, s->name, v)) {
                return -1;
            }
            break;
        }
        case S_MACRO: {
            nl_jv *m = jv_new(V_MACRO);
            if (!m) return -1;
            m->u.macro = s;
            if (frame_set(f, s->name, m)) return -1;
            break;
        }
        case S_BREAK:
            R->brk = 1;
            break;
        case S_CONTINUE:
            R->brk = 2;
            break;
        default: return rerr(R, s, "not a statement");
        }
    }
    return 0;
}

int nl_jinja_render(const nl_jinja *t, const nl_jv *ctx, char **text, size_t *len, uint8_t **from_data) {
    frame root = {nl_jv_dict(), NULL};
    if (!root.vars) return -1;
    rstate R = {.t = t, .ctx = ctx, .root = &root};
    buf out = {0};
    int rc = buf_add(&out, "", 0, NULL, 0);
    if (!rc) rc = exec_body(&R, &root, t->root, &out);
    nl_jv_unref(root.vars);
    if (rc) {
        free(out.s);
        free(out.t);
        return -1;
    }
    *text = out.s;
    if (len) *len = out.n;
    if (from_data) *from_data = out.t;
    else free(out.t);
    return 0;
}

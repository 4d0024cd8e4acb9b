/* data/jinja_lex: the template text to tokens (text runs, tag delimiters, names, literals,
 * operators), with jinja2's whitespace control (trim_blocks, lstrip_blocks, '-' and '+'). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_int.h"
#include "util/util.h"

/* ================================ lexer ================================ */

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

/* The line of byte pos: a binary search over the newline offsets (made once per template), so a
 * long template lexes in O(n log n), not O(n) per token. */
static int line_at(const lexer *L, size_t pos) {
    size_t lo = 0, hi = L->n_nl; /* the number of newlines before pos */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (L->nl[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    return lo >= (size_t)INT32_MAX ? INT32_MAX : (int)lo + 1;
}

static int utf8_put(char *out, uint32_t c) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 63));
        out[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 63));
    out[2] = (char)(0x80 | ((c >> 6) & 63));
    out[3] = (char)(0x80 | (c & 63));
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
    /* the decoded text is never longer than the literal: sized by its closing quote */
    size_t end = i;
    while (end < L->len && L->src[end] != q) end += L->src[end] == '\\' ? 2 : 1;
    char *out = nl_malloc((end < L->len ? end : L->len) - *pos + 1);
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
        default:
            out[n++] = '\\';
            out[n++] = e;
            break;
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

int nl_jinja_lex(lexer *L) {
    size_t n_nl = 0;
    for (size_t i = 0; i < L->len; i++) n_nl += L->src[i] == '\n';
    L->nl = nl_malloc((n_nl ? n_nl : 1) * sizeof *L->nl);
    if (!L->nl) return -1;
    for (size_t i = 0; i < L->len; i++)
        if (L->src[i] == '\n') L->nl[L->n_nl++] = i;
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
                if (j + 1 >= L->len || L->src[j] != '%' || L->src[j + 1] != '}')
                    return lex_err(L, line, "expected %%} after raw");
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

/* util/yaml: the YAML subset of config files as JSON text (yaml.h). */
#include "util/yaml.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *b;
    size_t n, cap;
    bool oom;
} obuf;

static void put(obuf *o, const char *s, size_t n) {
    if (o->oom) return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        char *b = realloc(o->b, cap);
        if (!b) {
            o->oom = true;
            return;
        }
        o->b = b;
        o->cap = cap;
    }
    memcpy(o->b + o->n, s, n);
    o->n += n;
    o->b[o->n] = 0;
}

static void putc1(obuf *o, char c) { put(o, &c, 1); }

/* s[0..n) as a JSON string literal (its bytes; control characters escaped) */
static void put_str(obuf *o, const char *s, size_t n) {
    putc1(o, '"');
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(o, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(o, esc, 6);
        } else {
            putc1(o, (char)c);
        }
    }
    putc1(o, '"');
}

typedef struct {
    const char *s;
    size_t len;
    int line;
    size_t ls; /* the current line's first byte */
    nl_yaml_error *err;
    obuf o;
} yrd;

static int fail(yrd *y, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(y->err->msg, sizeof y->err->msg, fmt, ap);
    va_end(ap);
    y->err->line = y->line;
    y->err->col = (int)(at - y->ls) + 1;
    return -1;
}

/* The first byte of s[p, e) that does not begin a well-formed UTF-8 sequence (no overlong forms,
 * no surrogates, at most U+10FFFF), or e: the converted JSON must be text the JSON reader takes. */
static size_t utf8_bad(const char *s, size_t p, size_t e) {
    while (p < e) {
        unsigned char b = (unsigned char)s[p];
        size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
        if (n == 0 || p + n > e) return p;
        uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
        for (size_t k = 1; k < n; k++) {
            unsigned char t = (unsigned char)s[p + k];
            if ((t & 0xC0) != 0x80) return p;
            c = c << 6 | (t & 0x3Fu);
        }
        if ((n == 2 && c < 0x80) || (n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
            (c >= 0xD800 && c <= 0xDFFF))
            return p;
        p += n;
    }
    return e;
}

/* a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool json_number(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return false;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return false;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return false;
    }
    return i == n;
}

static bool is_word(const char *s, size_t n, const char *const *words) {
    for (; *words; words++)
        if (strlen(*words) == n && !memcmp(*words, s, n)) return true;
    return false;
}

/* A plain scalar s[0..n) (trimmed) as JSON: null, a boolean, a number or a string. */
static void put_plain(obuf *o, const char *s, size_t n) {
    static const char *const nulls[] = {"~", "null", "Null", "NULL", NULL};
    static const char *const trues[] = {"true", "True", "TRUE", NULL};
    static const char *const falses[] = {"false", "False", "FALSE", NULL};
    if (n == 0 || is_word(s, n, nulls)) put(o, "null", 4);
    else if (is_word(s, n, trues)) put(o, "true", 4);
    else if (is_word(s, n, falses)) put(o, "false", 5);
    else if (json_number(s, n)) put(o, s, n);
    else put_str(o, s, n);
}

/* After a value: nothing, spaces, or spaces and a comment. */
static int rest_empty(yrd *y, size_t p, size_t e) {
    size_t q = p;
    while (q < e && y->s[q] == ' ') q++;
    if (q == e || (y->s[q] == '#' && q > p)) return 0;
    return fail(y, q, "unexpected text after the value");
}

/* A quoted scalar at s[p] (' or "), closed on this line; *end: the byte after it. */
static int quoted(yrd *y, size_t p, size_t e, size_t *end) {
    const char q = y->s[p];
    obuf *o = &y->o;
    putc1(o, '"');
    size_t i = p + 1;
    for (;;) {
        if (i >= e)
            return fail(y, p, "a quoted scalar must end on its line (multi-line scalars are not in the subset)");
        const char c = y->s[i];
        if (q == '\'' && c == '\'') {
            if (i + 1 < e && y->s[i + 1] == '\'') {
                putc1(o, '\'');
                i += 2;
                continue;
            }
            break;
        }
        if (q == '"' && c == '"') break;
        if (q == '"' && c == '\\') {
            if (i + 1 >= e) return fail(y, i, "a backslash at the end of the line");
            const char x = y->s[i + 1];
            if (strchr("\"\\/bfnrt", x)) {
                put(o, y->s + i, 2);
                i += 2;
                continue;
            }
            if (x == 'u') {
                /* four hex digits; a surrogate only as a high one followed by a \u low one (the
                 * JSON reader refuses a lone one: the subset does too, at its place) */
                unsigned v[2] = {0, 0};
                int n_u = 1;
                for (int u = 0; u < n_u; u++) {
                    const size_t at = i + 6 * (size_t)u;
                    if (u && (at + 1 >= e || y->s[at] != '\\' || y->s[at + 1] != 'u'))
                        return fail(y, i, "\\u%04X is a high surrogate without a \\u low one after it", v[0]);
                    for (int k = 0; k < 4; k++) {
                        const char h = at + 2 + (size_t)k < e ? y->s[at + 2 + (size_t)k] : 0;
                        const int d = h >= '0' && h <= '9'   ? h - '0'
                                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                             : -1;
                        if (d < 0) return fail(y, at, "\\u needs four hex digits");
                        v[u] = v[u] << 4 | (unsigned)d;
                    }
                    if (!u && v[0] >= 0xD800 && v[0] <= 0xDBFF) n_u = 2;
                    else if (!u && v[0] >= 0xDC00 && v[0] <= 0xDFFF)
                        return fail(y, i, "\\u%04X is a lone low surrogate (not a character)", v[0]);
                    else if (u && !(v[1] >= 0xDC00 && v[1] <= 0xDFFF))
                        return fail(y, i, "\\u%04X is a high surrogate without a \\u low one after it", v[0]);
                }
                put(o, y->s + i, 6 * (size_t)n_u);
                i += 6 * (size_t)n_u;
                continue;
            }
            return fail(y, i, "the escape \\%c is not in the subset (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX are)",
                        x);
        }
        if ((unsigned char)c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned char)c);
            put(o, esc, 6);
        } else if (q == '\'' && (c == '"' || c == '\\')) {
            putc1(o, '\\');
            putc1(o, c);
        } else {
            putc1(o, c);
        }
        i++;
    }
    putc1(o, '"');
    *end = i + 1;
    return 0;
}

static int bad_start(yrd *y, size_t p) {
    const char c = y->s[p];
    const char *what = c == '&'                             ? "an anchor"
                       : c == '*'                           ? "an alias"
                       : c == '!'                           ? "a tag"
                       : (c == '|' || c == '>')             ? "a block scalar"
                       : c == '{'                           ? "a flow map"
                       : (c == '%' || c == '@' || c == '`') ? "a reserved indicator"
                                                            : NULL;
    if (what) return fail(y, p, "%s ('%c') is not in the YAML subset nightlora reads (maps, lists, scalars)", what, c);
    return 0;
}

/* A value at s[p..e): quoted, a flow list, or plain (to a comment). */
static int value(yrd *y, size_t p, size_t e) {
    const char *s = y->s;
    if (bad_start(y, p)) return -1;
    size_t end;
    if (s[p] == '"' || s[p] == '\'') {
        if (quoted(y, p, e, &end)) return -1;
        return rest_empty(y, end, e);
    }
    if (s[p] == '[') {
        putc1(&y->o, '[');
        size_t i = p + 1;
        int n = 0;
        for (;;) {
            while (i < e && s[i] == ' ') i++;
            if (i >= e) return fail(y, p, "a flow list must end on its line");
            if (s[i] == ']' && n == 0) break;
            if (n) putc1(&y->o, ',');
            if (s[i] == '[' || s[i] == ']' || s[i] == ',' || bad_start(y, i))
                return y->err->msg[0] ? -1 : fail(y, i, "expected a scalar in the flow list");
            if (s[i] == '"' || s[i] == '\'') {
                if (quoted(y, i, e, &i)) return -1;
            } else {
                size_t a = i;
                while (i < e && s[i] != ',' && s[i] != ']' && !(s[i] == '#' && s[i - 1] == ' ')) i++;
                size_t b = i;
                while (b > a && s[b - 1] == ' ') b--;
                put_plain(&y->o, s + a, b - a);
            }
            n++;
            while (i < e && s[i] == ' ') i++;
            if (i < e && s[i] == ',') {
                i++;
                continue;
            }
            if (i < e && s[i] == ']') break;
            return fail(y, i, "expected ',' or ']' in the flow list");
        }
        putc1(&y->o, ']');
        return rest_empty(y, i + 1, e);
    }
    size_t i = p;
    while (i < e && !(s[i] == '#' && i > p && s[i - 1] == ' ')) {
        if (s[i] == ':' && (i + 1 == e || s[i + 1] == ' '))
            return fail(y, i, "a map inside a value is not in the subset (put it on its own lines, indented)");
        i++;
    }
    size_t b = i;
    while (b > p && s[b - 1] == ' ') b--;
    put_plain(&y->o, s + p, b - p);
    return 0;
}

typedef struct {
    int indent;
    char kind; /* 'm' map, 's' list */
    int count;
} level;

/* Long (~165 lines): one line-by-line state machine (the stack of open maps and lists, the key
 * waiting for its value, the output) whose cases read and change the same state; split, each
 * part would take all of it. */
int nl_yaml_to_json(const char *s, size_t len, char **json, size_t *json_len, nl_yaml_error *err) {
    memset(err, 0, sizeof *err);
    yrd y = {.s = s, .len = len, .err = err};
    level st[NL_YAML_MAX_DEPTH + 1];
    int depth = 0, pending = 0, pend_indent = 0, ended = 0, started = 0, rc = -1;
    size_t pos = 0;
    if (len >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) pos = 3;
    while (pos < len || (pos == len && y.line == 0)) {
        y.line++;
        y.ls = pos;
        const char *nl = memchr(s + pos, '\n', len - pos);
        size_t e = nl ? (size_t)(nl - s) : len, next = nl ? e + 1 : len + 1;
        if (e > pos && s[e - 1] == '\r') e--;
        if (y.line > 1) putc1(&y.o, '\n');
        size_t c = pos;
        while (c < e && s[c] == ' ') c++;
        if (c < e && s[c] == '\t') {
            fail(&y, c, "a tab in the indentation (YAML indents with spaces)");
            goto done;
        }
        for (size_t k = c; k < e; k++)
            if (s[k] == 0 || ((unsigned char)s[k] < 0x20 && s[k] != '\t')) {
                fail(&y, k, "a control byte 0x%02x", (unsigned char)s[k]);
                goto done;
            }
        size_t bad = utf8_bad(s, c, e);
        if (bad < e) {
            fail(&y, bad, "not UTF-8 text (byte 0x%02x)", (unsigned char)s[bad]);
            goto done;
        }
        pos = next;
        if (c == e || s[c] == '#') continue;
        const int indent = (int)(c - y.ls);
        if (indent == 0 && e - c >= 3 && (!memcmp(s + c, "---", 3) || !memcmp(s + c, "...", 3)) &&
            (e - c == 3 || s[c + 3] == ' ')) {
            if (s[c] == '-' && started) {
                fail(&y, c, "a second document ('---') is not in the subset");
                goto done;
            }
            if (s[c] == '.') ended = 1;
            else if (rest_empty(&y, c + 3, e)) goto done;
            continue;
        }
        if (ended) {
            fail(&y, c, "text after the document's end ('...')");
            goto done;
        }
        /* the line: a list item, or "key: value" */
        const bool item = s[c] == '-' && (c + 1 == e || s[c + 1] == ' ');
        size_t key_end = 0, vstart = 0;
        if (!item) {
            size_t k = c;
            if (s[c] == '"' || s[c] == '\'') {
                obuf save = y.o;
                y.o = (obuf){0};
                if (quoted(&y, c, e, &k)) {
                    free(y.o.b);
                    y.o = save;
                    goto done;
                }
                free(y.o.b);
                y.o = save;
            } else {
                if (bad_start(&y, c)) goto done;
                while (k < e && !(s[k] == ':' && (k + 1 == e || s[k + 1] == ' ')) &&
                       !(s[k] == '#' && k > c && s[k - 1] == ' '))
                    k++;
            }
            if (k >= e || s[k] != ':') {
                fail(&y, c,
                     depth || started ? "expected \"key: value\" or \"- item\""
                                      : "expected a map (\"key: value\" lines)");
                goto done;
            }
            key_end = k;
            vstart = k + 1;
        } else {
            vstart = c + 1;
        }
        /* a key or item left without a value on its line: a nested block, or null */
        if (pending) {
            pending = 0;
            if (indent > pend_indent || (indent == pend_indent && item && st[depth - 1].kind == 'm')) {
                if (depth == NL_YAML_MAX_DEPTH) {
                    fail(&y, c, "nested deeper than %d levels", NL_YAML_MAX_DEPTH);
                    goto done;
                }
                st[depth++] = (level){indent, item ? 's' : 'm', 0};
                putc1(&y.o, item ? '[' : '{');
            } else {
                put(&y.o, "null", 4);
            }
        }
        /* close what this line's indentation ends */
        while (depth > 0 && (st[depth - 1].indent > indent ||
                             (st[depth - 1].indent == indent && st[depth - 1].kind == 's' && !item && depth >= 2 &&
                              st[depth - 2].kind == 'm' && st[depth - 2].indent == indent))) {
            putc1(&y.o, st[depth - 1].kind == 'm' ? '}' : ']');
            depth--;
        }
        if (depth == 0) {
            if (started) {
                fail(&y, c, "indented less than the document's first line");
                goto done;
            }
            started = 1;
            st[depth++] = (level){indent, item ? 's' : 'm', 0};
            putc1(&y.o, item ? '[' : '{');
        }
        level *L = &st[depth - 1];
        if (L->indent != indent) {
            fail(&y, c, "indented %d spaces where %d are expected", indent, L->indent);
            goto done;
        }
        if ((L->kind == 's') != item) {
            fail(&y, c, item ? "a list item among a map's keys" : "a key among a list's items");
            goto done;
        }
        if (L->count++) putc1(&y.o, ',');
        if (!item) {
            if (s[c] == '"' || s[c] == '\'') {
                size_t k;
                if (quoted(&y, c, e, &k)) goto done;
            } else {
                size_t b = key_end;
                while (b > c && s[b - 1] == ' ') b--;
                put_str(&y.o, s + c, b - c);
            }
            putc1(&y.o, ':');
        }
        size_t v = vstart;
        while (v < e && s[v] == ' ') v++;
        if (v == e || s[v] == '#') {
            pending = 1;
            pend_indent = indent;
            continue;
        }
        if (item && s[v] == '-' && (v + 1 == e || s[v + 1] == ' ')) {
            fail(&y, v, "a list inside a list item is not in the subset");
            goto done;
        }
        if (item && s[v] != '"' && s[v] != '\'' && s[v] != '[') {
            for (size_t k = v; k < e && !(s[k] == '#' && s[k - 1] == ' '); k++)
                if (s[k] == ':' && (k + 1 == e || s[k + 1] == ' ')) {
                    fail(&y, v, "a map inside a list item is not in the subset");
                    goto done;
                }
        }
        if (value(&y, v, e)) goto done;
    }
    if (pending) put(&y.o, "null", 4);
    while (depth > 0) putc1(&y.o, st[--depth].kind == 'm' ? '}' : ']');
    if (!started) put(&y.o, "null", 4);
    if (len > 0 && s[len - 1] == '\n') putc1(&y.o, '\n'); /* as many lines as the input */
    rc = 0;
done:
    if (!rc && y.o.oom) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        rc = -1;
    }
    if (rc) {
        free(y.o.b);
        return -1;
    }
    *json = y.o.b;
    *json_len = y.o.n;
    return 0;
}

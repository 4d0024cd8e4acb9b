/* util/json: strict RFC 8259 parser. See json.h for the contract and the choices made. */
#include "util/json.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* ---- arena: all nodes and strings of one document ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

typedef struct {
    chunk *chunks;   /* newest first */
    size_t next_cap; /* size of the next chunk to allocate */
    nl_json root;    /* nl_json_free recovers the doc from &root */
} doc;

static void *arena_alloc(doc *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = d->next_cap > n ? d->next_cap : n;
        c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->next = d->chunks;
        c->used = 0;
        c->cap = cap;
        d->chunks = c;
        if (d->next_cap < ((size_t)1 << 24)) d->next_cap *= 2;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

static void doc_free(doc *d) {
    if (!d) return;
    chunk *c = d->chunks;
    while (c) {
        chunk *nx = c->next;
        free(c);
        c = nx;
    }
    free(d);
}

/* ---- parser state ---- */

typedef struct {
    const unsigned char *s;
    size_t len, pos;
    doc *d;
    /* Scratch stacks: children of the arrays/objects being parsed, copied into the arena
     * once when their container closes (each value is copied once per container). */
    nl_json *vals;
    size_t nvals, capvals;
    nl_json_member *mems;
    size_t nmems, capmems;
    char decimal_point; /* the C library's, for strtod in a non-"C" locale */
    nl_json_error *err;
} parser;

/* Record an error at `offset`; returns -1. */
static int fail(parser *p, size_t offset, const char *fmt, ...) NL_PRINTF(3, 4);
static int fail(parser *p, size_t offset, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
    va_end(ap);
    p->err->offset = offset;
    return -1;
}

static int oom(parser *p) { return fail(p, p->pos, "out of memory"); }

/* "'x'", "end of input" or "byte 0xNN", for messages. */
static const char *found(const parser *p, size_t at, char *buf, size_t n) {
    if (at >= p->len) return "end of input";
    unsigned c = p->s[at];
    if (c >= 0x21 && c < 0x7f) snprintf(buf, n, "'%c'", (char)c);
    else if (c == ' ') snprintf(buf, n, "a space");
    else if (c == '\n') snprintf(buf, n, "end of line");
    else snprintf(buf, n, "byte 0x%02X", c);
    return buf;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* Length of the valid UTF-8 sequence starting at s[i] (lead byte >= 0x80), or 0 if invalid.
 * Exactly the well-formed table of Unicode §3.9 (no overlongs, no surrogates, <= U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t len, size_t i) {
    unsigned c = s[i];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) {
        n = 3;
        lo = 0xA0;
    } else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) {
        n = 3;
        hi = 0x9F;
    } else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) {
        n = 4;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) {
        n = 4;
        hi = 0x8F;
    } else return 0;
    if (len - i < n) return 0;
    if (s[i + 1] < lo || s[i + 1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
    return n;
}

static int hex4(const unsigned char *s, size_t len, size_t i, unsigned *out) {
    if (len - i < 4 || i > len) return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = s[i + k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* p->pos at the opening quote. Decodes into the arena; leaves pos after the closing quote. */
static int parse_string(parser *p, const char **out, size_t *out_len) {
    const unsigned char *s = p->s;
    size_t open = p->pos, i = open + 1;
    /* First pass: find the closing quote, to size the output (decoded <= raw). */
    while (i < p->len && s[i] != '"') i += (s[i] == '\\') ? 2 : 1;
    if (i >= p->len) return fail(p, open, "unterminated string");
    size_t end = i;
    char *buf = arena_alloc(p->d, end - open);
    if (!buf) return oom(p);
    size_t o = 0;
    i = open + 1;
    while (i < end) {
        unsigned c = s[i];
        if (c == '\\') {
            unsigned e = s[i + 1]; /* i + 1 < end: a backslash never ends the scan */
            switch (e) {
            case '"': buf[o++] = '"'; break;
            case '\\': buf[o++] = '\\'; break;
            case '/': buf[o++] = '/'; break;
            case 'b': buf[o++] = '\b'; break;
            case 'f': buf[o++] = '\f'; break;
            case 'n': buf[o++] = '\n'; break;
            case 'r': buf[o++] = '\r'; break;
            case 't': buf[o++] = '\t'; break;
            case 'u': {
                unsigned cp;
                if (hex4(s, end, i + 2, &cp)) return fail(p, i, "\\u must be followed by four hex digits");
                if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, i, "lone low surrogate \\u%04X", cp);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (end - i < 12 || s[i + 6] != '\\' || s[i + 7] != 'u' || hex4(s, end, i + 8, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return fail(p, i, "lone high surrogate \\u%04X (expected a \\uDC00-\\uDFFF escape next)", cp);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
                o += put_utf8(buf + o, cp);
                i += 6;
                continue;
            }
            default: {
                char fb[16];
                return fail(p, i, "invalid escape '\\%s' in string",
                            e >= 0x21 && e < 0x7f ? (snprintf(fb, sizeof fb, "%c", (char)e), fb)
                                                  : (snprintf(fb, sizeof fb, "x%02X", e), fb));
            }
            }
            i += 2;
        } else if (c < 0x20) {
            return fail(p, i, "control character 0x%02X in string (must be escaped)", c);
        } else if (c < 0x80) {
            buf[o++] = (char)c;
            i++;
        } else {
            size_t n = utf8_seq(s, end, i);
            if (!n) return fail(p, i, "invalid UTF-8 byte 0x%02X in string", c);
            memcpy(buf + o, s + i, n);
            o += n;
            i += n;
        }
    }
    buf[o] = 0;
    *out = buf;
    *out_len = o;
    p->pos = end + 1;
    return 0;
}

static int parse_number(parser *p, nl_json *v) {
    const unsigned char *s = p->s;
    size_t start = p->pos, i = start;
    char fb[16];
    bool neg = false, integral = true;
    if (s[i] == '-') {
        neg = true;
        i++;
    }
    if (i >= p->len || s[i] < '0' || s[i] > '9')
        return fail(p, i, "expected a digit after '-', found %s", found(p, i, fb, sizeof fb));
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') return fail(p, start, "leading zeros are not allowed in numbers");
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t int_end = i;
    if (i < p->len && s[i] == '.') {
        integral = false;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, i, "expected a digit after '.', found %s", found(p, i, fb, sizeof fb));
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, i, "expected a digit in the exponent, found %s", found(p, i, fb, sizeof fb));
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t n = i - start;
    v->type = NL_JSON_NUMBER;
    if (integral && int_end - start - (neg ? 1 : 0) <= 18) {
        /* Fast path (token id lists): at most 18 digits fit int64 exactly, and the int64 ->
         * double conversion is correctly rounded, like strtod. */
        int64_t acc = 0;
        for (size_t k = start + (neg ? 1 : 0); k < int_end; k++) acc = acc * 10 + (s[k] - '0');
        v->u.num.i = neg ? -acc : acc;
        v->u.num.d = neg ? (acc ? -(double)acc : -0.0) : (double)acc;
        v->u.num.is_int = true;
        p->pos = i;
        return 0;
    }
    /* strtod needs a terminated copy (bytes after len must never be read). */
    char small[64];
    char *tmp = n < sizeof small ? small : malloc(n + 1);
    if (!tmp) return oom(p);
    memcpy(tmp, s + start, n);
    tmp[n] = 0;
    if (p->decimal_point != '.')
        for (size_t k = 0; k < n; k++)
            if (tmp[k] == '.') tmp[k] = p->decimal_point;
    double d = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    if (isinf(d)) return fail(p, start, "number out of range for a double");
    v->u.num.d = d;
    v->u.num.i = 0;
    v->u.num.is_int = false;
    if (integral) {
        /* Exact int64: accumulate as a negative value so INT64_MIN fits. */
        int64_t acc = 0;
        bool ok = true;
        for (size_t k = start + (neg ? 1 : 0); k < int_end; k++) {
            int dg = s[k] - '0';
            if (acc < (INT64_MIN + dg) / 10) {
                ok = false;
                break;
            }
            acc = acc * 10 - dg;
        }
        if (ok && !neg && acc == INT64_MIN) ok = false;
        if (ok) {
            v->u.num.is_int = true;
            v->u.num.i = neg ? acc : -acc;
        }
    }
    p->pos = i;
    return 0;
}

static int parse_value(parser *p, int depth, nl_json *v);

static int push_val(parser *p, const nl_json *v) {
    if (p->nvals == p->capvals) {
        size_t cap = p->capvals ? p->capvals * 2 : 64;
        nl_json *nv = realloc(p->vals, cap * sizeof *nv);
        if (!nv) return oom(p);
        p->vals = nv;
        p->capvals = cap;
    }
    p->vals[p->nvals++] = *v;
    return 0;
}

static int push_mem(parser *p, const nl_json_member *m) {
    if (p->nmems == p->capmems) {
        size_t cap = p->capmems ? p->capmems * 2 : 32;
        nl_json_member *nm = realloc(p->mems, cap * sizeof *nm);
        if (!nm) return oom(p);
        p->mems = nm;
        p->capmems = cap;
    }
    p->mems[p->nmems++] = *m;
    return 0;
}

static int parse_array(parser *p, int depth, nl_json *v) {
    char fb[16];
    size_t open = p->pos;
    if (depth >= NL_JSON_MAX_DEPTH) return fail(p, open, "nesting deeper than %d arrays/objects", NL_JSON_MAX_DEPTH);
    p->pos++;
    size_t base = p->nvals;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            nl_json item;
            if (parse_value(p, depth + 1, &item) || push_val(p, &item)) return -1;
            skip_ws(p);
            if (p->pos >= p->len) return fail(p, open, "unterminated array (expected ',' or ']' before end of input)");
            unsigned char c = p->s[p->pos];
            if (c == ']') {
                p->pos++;
                break;
            }
            if (c != ',')
                return fail(p, p->pos, "expected ',' or ']' after an array element, found %s",
                            found(p, p->pos, fb, sizeof fb));
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ']') return fail(p, p->pos, "trailing comma before ']'");
        }
    }
    size_t n = p->nvals - base;
    nl_json *items = NULL;
    if (n) {
        items = arena_alloc(p->d, n * sizeof *items);
        if (!items) return oom(p);
        memcpy(items, p->vals + base, n * sizeof *items);
    }
    p->nvals = base;
    v->type = NL_JSON_ARRAY;
    v->u.arr.items = items;
    v->u.arr.n = n;
    return 0;
}

static int key_cmp(const nl_json_member *a, const nl_json_member *b) {
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    if (c) return c;
    return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

static int key_ptr_cmp(const void *x, const void *y) {
    const nl_json_member *a = *(const nl_json_member *const *)x;
    const nl_json_member *b = *(const nl_json_member *const *)y;
    int c = key_cmp(a, b);
    if (c) return c;
    return a->key_offset < b->key_offset ? -1 : a->key_offset > b->key_offset;
}

/* Reports the first (in document order) key that repeats an earlier one. */
static int check_dups(parser *p, const nl_json_member *m, size_t n) {
    size_t bad = (size_t)-1;
    if (n <= 16) {
        for (size_t j = 1; j < n && bad == (size_t)-1; j++)
            for (size_t i = 0; i < j; i++)
                if (key_cmp(&m[i], &m[j]) == 0) {
                    bad = j;
                    break;
                }
        if (bad == (size_t)-1) return 0;
        return fail(p, m[bad].key_offset, "duplicate key \"%.60s\"", m[bad].key);
    }
    const nl_json_member **ix = malloc(n * sizeof *ix);
    if (!ix) return oom(p);
    for (size_t i = 0; i < n; i++) ix[i] = &m[i];
    qsort(ix, n, sizeof *ix, key_ptr_cmp);
    const nl_json_member *first_dup = NULL;
    for (size_t i = 1; i < n; i++)
        if (key_cmp(ix[i - 1], ix[i]) == 0 && (i < 2 || key_cmp(ix[i - 2], ix[i]) != 0))
            /* ix[i] is the second occurrence of its key */
            if (!first_dup || ix[i]->key_offset < first_dup->key_offset) first_dup = ix[i];
    free(ix);
    if (!first_dup) return 0;
    return fail(p, first_dup->key_offset, "duplicate key \"%.60s\"", first_dup->key);
}

static int parse_object(parser *p, int depth, nl_json *v) {
    char fb[16];
    size_t open = p->pos;
    if (depth >= NL_JSON_MAX_DEPTH) return fail(p, open, "nesting deeper than %d arrays/objects", NL_JSON_MAX_DEPTH);
    p->pos++;
    size_t base = p->nmems;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            if (p->pos >= p->len) return fail(p, open, "unterminated object (expected a key before end of input)");
            if (p->s[p->pos] != '"')
                return fail(p, p->pos, "expected a string key, found %s", found(p, p->pos, fb, sizeof fb));
            nl_json_member m;
            m.key_offset = p->pos;
            if (parse_string(p, &m.key, &m.key_len)) return -1;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return fail(p, p->pos, "expected ':' after an object key, found %s", found(p, p->pos, fb, sizeof fb));
            p->pos++;
            if (parse_value(p, depth + 1, &m.value) || push_mem(p, &m)) return -1;
            skip_ws(p);
            if (p->pos >= p->len) return fail(p, open, "unterminated object (expected ',' or '}' before end of input)");
            unsigned char c = p->s[p->pos];
            if (c == '}') {
                p->pos++;
                break;
            }
            if (c != ',')
                return fail(p, p->pos, "expected ',' or '}' after an object member, found %s",
                            found(p, p->pos, fb, sizeof fb));
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == '}') return fail(p, p->pos, "trailing comma before '}'");
        }
    }
    size_t n = p->nmems - base;
    nl_json_member *mem = NULL;
    if (n) {
        if (check_dups(p, p->mems + base, n)) return -1;
        mem = arena_alloc(p->d, n * sizeof *mem);
        if (!mem) return oom(p);
        memcpy(mem, p->mems + base, n * sizeof *mem);
    }
    p->nmems = base;
    v->type = NL_JSON_OBJECT;
    v->u.obj.members = mem;
    v->u.obj.n = n;
    return 0;
}

static int literal(parser *p, const char *word, nl_json_type t, nl_json *v) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail(p, p->pos, "invalid literal (expected '%s')", word);
    p->pos += n;
    v->type = t;
    return 0;
}

static int parse_value(parser *p, int depth, nl_json *v) {
    char fb[16];
    skip_ws(p);
    memset(v, 0, sizeof *v);
    v->offset = p->pos;
    if (p->pos >= p->len) return fail(p, p->pos, "expected a value, found end of input");
    switch (p->s[p->pos]) {
    case '{': return parse_object(p, depth, v);
    case '[': return parse_array(p, depth, v);
    case '"': v->type = NL_JSON_STRING; return parse_string(p, &v->u.str.s, &v->u.str.len);
    case 't': return literal(p, "true", NL_JSON_TRUE, v);
    case 'f': return literal(p, "false", NL_JSON_FALSE, v);
    case 'n': return literal(p, "null", NL_JSON_NULL, v);
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9': return parse_number(p, v);
    default: return fail(p, p->pos, "expected a value, found %s", found(p, p->pos, fb, sizeof fb));
    }
}

nl_json *nl_json_parse(const char *s, size_t len, nl_json_error *err) {
    nl_json_error local;
    if (!err) err = &local;
    err->offset = 0;
    err->msg[0] = 0;
    parser p = {0};
    p.s = (const unsigned char *)(s ? s : "");
    p.len = s ? len : 0;
    p.err = err;
    const struct lconv *lc = localeconv();
    p.decimal_point = (lc && lc->decimal_point && lc->decimal_point[0]) ? lc->decimal_point[0] : '.';
    if (p.len > NL_JSON_MAX_BYTES) {
        fail(&p, 0, "document of %zu bytes is larger than the %zu-byte limit", p.len, NL_JSON_MAX_BYTES);
        nl_err("offset 0: %s", err->msg);
        return NULL;
    }
    p.d = calloc(1, sizeof *p.d);
    if (!p.d) {
        nl_err("out of memory");
        return NULL;
    }
    /* First chunk sized for the usual JSONL line: a few nodes per input byte budgeted. */
    size_t first = 2 * p.len + 256;
    p.d->next_cap = first < ((size_t)1 << 20) ? first : ((size_t)1 << 20);
    char fb[16];
    int rc = parse_value(&p, 0, &p.d->root);
    if (rc == 0) {
        skip_ws(&p);
        if (p.pos != p.len) rc = fail(&p, p.pos, "unexpected %s after the value", found(&p, p.pos, fb, sizeof fb));
    }
    free(p.vals);
    free(p.mems);
    if (rc) {
        doc_free(p.d);
        nl_err("offset %zu: %s", err->offset, err->msg);
        return NULL;
    }
    return &p.d->root;
}

void nl_json_free(nl_json *root) {
    if (!root) return;
    doc_free((doc *)((char *)root - offsetof(doc, root)));
}

void nl_json_linecol(const char *s, size_t len, size_t offset, int *line, int *col) {
    if (offset > len) offset = len;
    size_t ln = 1, start = 0;
    for (size_t i = 0; i < offset; i++)
        if (s[i] == '\n') {
            ln++;
            start = i + 1;
        }
    if (line) *line = (int)ln;
    if (col) *col = (int)(offset - start + 1);
}

const char *nl_json_type_name(nl_json_type t) {
    switch (t) {
    case NL_JSON_NULL: return "null";
    case NL_JSON_FALSE: return "false";
    case NL_JSON_TRUE: return "true";
    case NL_JSON_NUMBER: return "number";
    case NL_JSON_STRING: return "string";
    case NL_JSON_ARRAY: return "array";
    case NL_JSON_OBJECT: return "object";
    }
    return "?";
}

const nl_json *nl_json_getn(const nl_json *obj, const char *key, size_t key_len) {
    if (!obj || obj->type != NL_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->u.obj.n; i++) {
        const nl_json_member *m = &obj->u.obj.members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0) return &m->value;
    }
    return NULL;
}

const nl_json *nl_json_get(const nl_json *obj, const char *key) {
    return key ? nl_json_getn(obj, key, strlen(key)) : NULL;
}

size_t nl_json_len(const nl_json *v) {
    if (!v) return 0;
    if (v->type == NL_JSON_ARRAY) return v->u.arr.n;
    if (v->type == NL_JSON_OBJECT) return v->u.obj.n;
    return 0;
}

const nl_json *nl_json_at(const nl_json *arr, size_t i) {
    if (!arr || arr->type != NL_JSON_ARRAY || i >= arr->u.arr.n) return NULL;
    return &arr->u.arr.items[i];
}

int nl_json_int64(const nl_json *v, int64_t *out) {
    if (!v || v->type != NL_JSON_NUMBER) return -1;
    if (v->u.num.is_int) {
        *out = v->u.num.i;
        return 0;
    }
    double d = v->u.num.d;
    if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
        *out = (int64_t)d;
        return 0;
    }
    return -1;
}

static int buf_reserve(char **buf, size_t *n, size_t *cap, size_t extra) {
    if (*cap - *n >= extra) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc - *n < extra) {
        if (nc > SIZE_MAX / 2) return nl_err("out of memory");
        nc *= 2;
    }
    char *nb = realloc(*buf, nc);
    if (!nb) return nl_err("out of memory");
    *buf = nb;
    *cap = nc;
    return 0;
}

int nl_json_escape(char **buf, size_t *n, size_t *cap, const char *s, size_t len) {
    if (*n > *cap) return nl_err("nl_json_escape: bad buffer");
    /* Worst case 6 bytes per input byte, plus quotes and a NUL. */
    if (len > (SIZE_MAX - 3) / 6) return nl_err("out of memory");
    if (buf_reserve(buf, n, cap, len * 6 + 3)) return -1;
    char *o = *buf + *n;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            *o++ = '\\';
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            *o++ = '\\';
            break;
        case '\n':
            *o++ = '\\';
            *o++ = 'n';
            break;
        case '\r':
            *o++ = '\\';
            *o++ = 'r';
            break;
        case '\t':
            *o++ = '\\';
            *o++ = 't';
            break;
        case '\b':
            *o++ = '\\';
            *o++ = 'b';
            break;
        case '\f':
            *o++ = '\\';
            *o++ = 'f';
            break;
        default:
            if (c < 0x20) {
                static const char hx[] = "0123456789abcdef";
                *o++ = '\\';
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hx[c >> 4];
                *o++ = hx[c & 15];
            } else {
                *o++ = (char)c;
            }
        }
    }
    *o++ = '"';
    *o = 0;
    *n = (size_t)(o - *buf);
    return 0;
}

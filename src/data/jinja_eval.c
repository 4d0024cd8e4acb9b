/* data/jinja_eval: the evaluator over the tree (nl_jinja_render): truth, equality, the text forms
 * (str, repr, json.dumps), scopes, operators, attribute and item access, slices, statements. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_int.h"
#include "util/util.h"

/* ================================ evaluator ================================ */

int nl_jinja_rerr(const rstate *R, const node *n, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nl_err("%s:%d: %s", R->t->label, n ? n->line : 0, msg);
}

const char *nl_jinja_type_name(const nl_jv *v) {
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

bool nl_jinja_truthy(const nl_jv *v) {
    switch (v->type) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0;
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->u.l.n > 0;
    case V_DICT: return v->u.d.n > 0;
    default: return true;
    }
}

bool nl_jinja_is_num(const nl_jv *v) { return v->type == V_INT || v->type == V_FLOAT || v->type == V_BOOL; }
double nl_jinja_num_f(const nl_jv *v) {
    return v->type == V_FLOAT ? v->u.f : v->type == V_INT ? (double)v->u.i : (double)v->u.b;
}
int64_t nl_jinja_num_i(const nl_jv *v) {
    return v->type == V_INT ? v->u.i : v->type == V_BOOL ? v->u.b : (int64_t)v->u.f;
}

/* A value nested past MAX_DEPTH in a printer or a comparison: the rendering fails (its budget
 * says why), the C stack stays bounded. */
static int too_deep(void) {
    if (nl_jb && !nl_jb->over) nl_jb->over = NL_JB_DEPTH;
    return nl_err("a value nested too deeply");
}

static bool jv_equal_at(const nl_jv *a, const nl_jv *b, int depth) {
    if (depth > MAX_DEPTH) {
        too_deep();
        return false;
    }
    if (nl_jb_charge(0, 1 + (a->type == V_STR ? a->u.s.n / 64 : 0))) return false;
    if (nl_jinja_is_num(a) && nl_jinja_is_num(b)) {
        if (a->type == V_FLOAT || b->type == V_FLOAT) return nl_jinja_num_f(a) == nl_jinja_num_f(b);
        return nl_jinja_num_i(a) == nl_jinja_num_i(b);
    }
    if (a->type != b->type) return false;
    switch (a->type) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.s, b->u.s.s, a->u.s.n) == 0;
    case V_LIST:
        if (a->u.l.n != b->u.l.n) return false;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!jv_equal_at(a->u.l.v[i], b->u.l.v[i], depth + 1)) return false;
        return true;
    case V_DICT:
        if (a->u.d.n != b->u.d.n) return false;
        for (size_t i = 0; i < a->u.d.n; i++) {
            const nl_jv *o = nl_jv_dict_getn(b, a->u.d.k[i]->u.s.s, a->u.d.k[i]->u.s.n);
            if (!o || !jv_equal_at(a->u.d.v[i], o, depth + 1)) return false;
        }
        return true;
    default: return a == b;
    }
}
static bool jv_equal(const nl_jv *a, const nl_jv *b) { return jv_equal_at(a, b, 0); }

/* ---- text forms: Python's str() and repr(), and json.dumps ---- */

/* Python's repr of a float (shortest round-trip digits, its exponent rules). */
static void fmt_float(double f, char *out, size_t n) {
    if (isnan(f)) {
        snprintf(out, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, n, f < 0 ? "-inf" : "inf");
        return;
    }
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
        else out[k++] = '0';
    }
    out[k] = 0;
}

static int repr_at(buf *b, const nl_jv *v, int depth);
static int to_repr(buf *b, const nl_jv *v) { return repr_at(b, v, 0); }

static int repr_str(buf *b, const nl_jv *v) {
    const char *s = v->u.s.s;
    size_t n = v->u.s.n;
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (nl_jbuf_add(b, &q, 1, NULL, 0)) return -1;
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
        if (e ? nl_jbuf_str(b, e) : nl_jbuf_add(b, s + i, 1, v->u.s.taint ? v->u.s.taint + i : NULL, 0)) return -1;
    }
    return nl_jbuf_add(b, &q, 1, NULL, 0);
}

/* str(v) as Python prints it (strings as they are, None, True, lists in repr form). */
int nl_jinja_to_str(buf *b, const nl_jv *v) {
    char num[48];
    switch (v->type) {
    case V_UNDEF: return 0;
    case V_NONE: return nl_jbuf_str(b, "None");
    case V_BOOL: return nl_jbuf_str(b, v->u.b ? "True" : "False");
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return nl_jbuf_str(b, num);
    case V_FLOAT: fmt_float(v->u.f, num, sizeof num); return nl_jbuf_str(b, num);
    case V_STR: return nl_jbuf_jv(b, v);
    default: return to_repr(b, v);
    }
}

static int repr_at(buf *b, const nl_jv *v, int depth) {
    if (depth > MAX_DEPTH) return too_deep();
    switch (v->type) {
    case V_STR: return repr_str(b, v);
    case V_UNDEF: return nl_jbuf_str(b, "Undefined");
    case V_LIST:
        if (nl_jbuf_str(b, "[")) return -1;
        for (size_t i = 0; i < v->u.l.n; i++)
            if ((i && nl_jbuf_str(b, ", ")) || repr_at(b, v->u.l.v[i], depth + 1)) return -1;
        return nl_jbuf_str(b, "]");
    case V_DICT:
        if (nl_jbuf_str(b, "{")) return -1;
        for (size_t i = 0; i < v->u.d.n; i++)
            if ((i && nl_jbuf_str(b, ", ")) || repr_at(b, v->u.d.k[i], depth + 1) || nl_jbuf_str(b, ": ") ||
                repr_at(b, v->u.d.v[i], depth + 1))
                return -1;
        return nl_jbuf_str(b, "}");
    case V_NS: return nl_jbuf_str(b, "<Namespace>");
    case V_MACRO: return nl_jbuf_str(b, "<Macro>");
    case V_FUNC:
    case V_METHOD: return nl_jbuf_str(b, "<function>");
    default: return nl_jinja_to_str(b, v);
    }
}

nl_jv *nl_jinja_str_of(const nl_jv *v) {
    if (v->type == V_STR) return nl_jv_ref((nl_jv *)v);
    buf b = {0};
    if (nl_jinja_to_str(&b, v)) {
        nl_jbuf_free(&b);
        return NULL;
    }
    return nl_jbuf_take(&b);
}

/* json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort): the bytes of strings keep
 * their data flags. */
int nl_jinja_to_json(buf *b, const nl_jv *v, int indent, int level, bool sort, const rstate *R, const node *at) {
    char num[48];
    if (level > MAX_DEPTH) return nl_jinja_rerr(R, at, "tojson: value nested too deeply");
    switch (v->type) {
    case V_NONE: return nl_jbuf_str(b, "null");
    case V_BOOL: return nl_jbuf_str(b, v->u.b ? "true" : "false");
    case V_INT: snprintf(num, sizeof num, "%" PRId64, v->u.i); return nl_jbuf_str(b, num);
    case V_FLOAT:
        if (isnan(v->u.f)) return nl_jbuf_str(b, "NaN");
        if (isinf(v->u.f)) return nl_jbuf_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        fmt_float(v->u.f, num, sizeof num);
        return nl_jbuf_str(b, num);
    case V_STR: {
        if (nl_jbuf_str(b, "\"")) return -1;
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
            if (e ? nl_jbuf_add(b, e, strlen(e), NULL, fl) : nl_jbuf_add(b, v->u.s.s + i, 1, NULL, fl)) return -1;
        }
        return nl_jbuf_str(b, "\"");
    }
    case V_LIST:
    case V_DICT: {
        bool is_list = v->type == V_LIST;
        size_t n = is_list ? v->u.l.n : v->u.d.n;
        if (n == 0) return nl_jbuf_str(b, is_list ? "[]" : "{}");
        if (nl_jbuf_str(b, is_list ? "[" : "{")) return -1;
        size_t *order = NULL;
        if (!is_list) {
            order = nl_malloc(n * sizeof *order);
            if (!order) return -1;
            for (size_t i = 0; i < n; i++) order[i] = i;
            if (sort) /* insertion sort by key bytes (stable, small) */
                for (size_t i = 1; i < n; i++)
                    for (size_t j = i; j > 0; j--) {
                        if (nl_jb_charge(0, 1)) break; /* quadratic: each comparison counts */
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
            if (i) rc = nl_jbuf_str(b, indent >= 0 ? "," : ", ");
            if (!rc && indent >= 0) {
                rc = nl_jbuf_str(b, "\n");
                for (int k = 0; k < indent * (level + 1) && !rc; k++) rc = nl_jbuf_str(b, " ");
            }
            if (rc) break;
            if (is_list) {
                rc = nl_jinja_to_json(b, v->u.l.v[i], indent, level + 1, sort, R, at);
            } else {
                rc = nl_jinja_to_json(b, v->u.d.k[order[i]], indent, level + 1, sort, R, at) || nl_jbuf_str(b, ": ") ||
                     nl_jinja_to_json(b, v->u.d.v[order[i]], indent, level + 1, sort, R, at);
            }
        }
        free(order);
        if (rc) return -1;
        if (indent >= 0) {
            if (nl_jbuf_str(b, "\n")) return -1;
            for (int k = 0; k < indent * level; k++)
                if (nl_jbuf_str(b, " ")) return -1;
        }
        return nl_jbuf_str(b, is_list ? "]" : "}");
    }
    default: return nl_jinja_rerr(R, at, "tojson: a value of type %s is not JSON serializable", nl_jinja_type_name(v));
    }
}

/* ---- scopes ---- */

static nl_jv *lookup(const rstate *R, const frame *f, const char *name) {
    for (; f; f = f->parent) {
        nl_jv *v = nl_jv_dict_getn(f->vars, name, strlen(name));
        if (v) return v;
    }
    nl_jv *v = R->ctx ? nl_jv_dict_getn(R->ctx, name, strlen(name)) : NULL;
    return v;
}

int nl_jinja_frame_set(frame *f, const char *name, nl_jv *v) { return nl_jv_set(f->vars, name, v); }

/* ---- evaluation ---- */

/* String helpers: Python's whitespace (str.isspace) at a UTF-8 position; its byte length or 0. */
size_t nl_jinja_uspace_at(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c < 0x80) return 0;
    uint32_t cp = 0;
    size_t len = 0;
    if ((c & 0xE0) == 0xC0 && i + 1 < n) {
        cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F);
        len = 2;
    } else if ((c & 0xF0) == 0xE0 && i + 2 < n) {
        cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
        len = 3;
    } else return 0;
    if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return len;
    return 0;
}
/* Python whitespace ending at byte end (exclusive): its length or 0. */
size_t nl_jinja_uspace_before(const char *s, size_t n, size_t end) {
    if (end == 0) return 0;
    size_t st = end - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80 && end - st < 4) st--;
    size_t l = nl_jinja_uspace_at(s, n, st);
    if (l == end - st) return l;
    l = nl_jinja_uspace_at(s, n, end - 1);
    return l == 1 ? 1 : 0;
}

nl_jv *nl_jinja_substr(const nl_jv *s, size_t a, size_t b) {
    return nl_jv_strt(s->u.s.s + a, b - a, s->u.s.taint ? s->u.s.taint + a : NULL);
}

/* strip: which 1 left, 2 right, 3 both; chars NULL = whitespace. */
nl_jv *nl_jinja_strip(const nl_jv *s, int which, const nl_jv *chars) {
    size_t a = 0, b = s->u.s.n;
    const char *p = s->u.s.s;
    if (chars && nl_jb_charge(0, (s->u.s.n / 64 + 1) * (chars->u.s.n + 1))) return NULL;
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
            while (a < b && (l = nl_jinja_uspace_at(p, b, a))) a += l;
        if (which & 2)
            while (b > a && (l = nl_jinja_uspace_before(p, b, b))) b -= l;
    }
    return nl_jinja_substr(s, a, b);
}

static nl_jv *concat_str(const nl_jv *a, const nl_jv *b) {
    buf o = {0};
    if (nl_jbuf_jv(&o, a) || nl_jbuf_jv(&o, b)) {
        nl_jbuf_free(&o);
        return NULL;
    }
    return nl_jbuf_take(&o);
}

/* A binary operator's value. Long (~130 lines): one case per operator and operand types, in one
 * switch, so the language's coercion rules read in one place. */
nl_jv *nl_jinja_binop(rstate *R, const node *n, int op, nl_jv *a, nl_jv *b) {
    if (op == OP_EQ) return nl_jv_bool(jv_equal(a, b));
    if (op == OP_NE) return nl_jv_bool(!jv_equal(a, b));
    if (op == OP_IN || op == OP_NOTIN) {
        bool r = false;
        if (b->type == V_STR) {
            if (a->type != V_STR) {
                nl_jinja_rerr(R, n, "'in <string>' requires a string as the left operand, not %s",
                              nl_jinja_type_name(a));
                return NULL;
            }
            if (nl_jb_charge(0, b->u.s.n / 8 * (a->u.s.n / 64 + 1))) return NULL; /* a memcmp a byte */
            r = a->u.s.n == 0;
            for (size_t i = 0; !r && a->u.s.n <= b->u.s.n && i <= b->u.s.n - a->u.s.n; i++)
                r = memcmp(b->u.s.s + i, a->u.s.s, a->u.s.n) == 0;
        } else if (b->type == V_LIST) {
            for (size_t i = 0; !r && i < b->u.l.n; i++) r = jv_equal(a, b->u.l.v[i]);
        } else if (b->type == V_DICT || b->type == V_NS) {
            r = a->type == V_STR && nl_jv_dict_getn(b, a->u.s.s, a->u.s.n) != NULL;
        } else if (b->type == V_UNDEF) {
            r = false;
        } else {
            nl_jinja_rerr(R, n, "argument of type %s is not iterable ('in')", nl_jinja_type_name(b));
            return NULL;
        }
        return nl_jv_bool(op == OP_IN ? r : !r);
    }
    if (a->type == V_UNDEF || b->type == V_UNDEF) {
        const nl_jv *u = a->type == V_UNDEF ? a : b;
        nl_jinja_rerr(R, n, "'%s' is undefined", u->u.undef ? u->u.undef : "value");
        return NULL;
    }
    if (op >= OP_LT && op <= OP_GE) {
        int c;
        if (nl_jinja_is_num(a) && nl_jinja_is_num(b)) {
            double x = nl_jinja_num_f(a), y = nl_jinja_num_f(b);
            c = x < y ? -1 : x > y;
        } else if (a->type == V_STR && b->type == V_STR) {
            size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
            c = memcmp(a->u.s.s, b->u.s.s, m);
            if (c == 0) c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
        } else {
            nl_jinja_rerr(R, n, "cannot compare %s with %s", nl_jinja_type_name(a), nl_jinja_type_name(b));
            return NULL;
        }
        bool r = op == OP_LT ? c < 0 : op == OP_GT ? c > 0 : op == OP_LE ? c <= 0 : c >= 0;
        return nl_jv_bool(r);
    }
    if (op == OP_ADD && a->type == V_STR && b->type == V_STR) return concat_str(a, b);
    if (op == OP_ADD && a->type == V_LIST && b->type == V_LIST) {
        nl_jv *l = nl_jv_list();
        for (size_t i = 0; l && i < a->u.l.n + b->u.l.n; i++)
            if (nl_jv_push(l, nl_jv_ref(i < a->u.l.n ? a->u.l.v[i] : b->u.l.v[i - a->u.l.n]))) {
                nl_jv_unref(l);
                return NULL;
            }
        return l;
    }
    if (op == OP_MUL && ((a->type == V_STR && (b->type == V_INT || b->type == V_BOOL)) ||
                         (b->type == V_STR && (a->type == V_INT || a->type == V_BOOL)))) {
        const nl_jv *s = a->type == V_STR ? a : b;
        int64_t k = nl_jinja_num_i(a->type == V_STR ? b : a);
        buf o = {0};
        for (int64_t i = 0; i < k; i++)
            if (nl_jbuf_jv(&o, s)) {
                nl_jbuf_free(&o);
                return NULL;
            }
        return nl_jbuf_take(&o);
    }
    if (!nl_jinja_is_num(a) || !nl_jinja_is_num(b)) {
        static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
        nl_jinja_rerr(R, n, "unsupported operand types for %s: %s and %s", sym[op], nl_jinja_type_name(a),
                      nl_jinja_type_name(b));
        return NULL;
    }
    bool fl = a->type == V_FLOAT || b->type == V_FLOAT;
    if (op == OP_DIV) {
        if (nl_jinja_num_f(b) == 0) {
            nl_jinja_rerr(R, n, "division by zero");
            return NULL;
        }
        return nl_jv_float(nl_jinja_num_f(a) / nl_jinja_num_f(b));
    }
    if (fl) {
        double x = nl_jinja_num_f(a), y = nl_jinja_num_f(b), r = 0;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_POW: r = pow(x, y); break;
        case OP_FDIV:
        case OP_MOD:
            if (y == 0) {
                nl_jinja_rerr(R, n, "division by zero");
                return NULL;
            }
            r = op == OP_FDIV ? floor(x / y) : x - floor(x / y) * y;
            break;
        }
        return nl_jv_float(r);
    }
    int64_t x = nl_jinja_num_i(a), y = nl_jinja_num_i(b), r = 0;
    switch (op) {
    case OP_ADD:
        if (__builtin_add_overflow(x, y, &r)) goto ovf;
        break;
    case OP_SUB:
        if (__builtin_sub_overflow(x, y, &r)) goto ovf;
        break;
    case OP_MUL:
        if (__builtin_mul_overflow(x, y, &r)) goto ovf;
        break;
    case OP_POW:
        if (y < 0) return nl_jv_float(pow((double)x, (double)y));
        r = 1;
        for (int64_t i = 0; i < y; i++)
            if (__builtin_mul_overflow(r, x, &r)) goto ovf;
        break;
    case OP_FDIV:
    case OP_MOD:
        if (y == 0) {
            nl_jinja_rerr(R, n, "division by zero");
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
    nl_jinja_rerr(R, n, "integer overflow");
    return NULL;
}

/* Attribute (or item) of obj named by the string key; V_UNDEF when absent. */
static const char *const str_methods[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip",
                                          "rstrip",     "replace",  "upper", "lower",  "title", "capitalize",
                                          "find",       "count",    "join",  NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

nl_jv *nl_jinja_method(nl_jv *self, const char *name) {
    nl_jv *m = nl_jv_new(V_METHOD);
    if (!m) return NULL;
    m->u.m.self = nl_jv_ref(self);
    m->u.m.name = name;
    return m;
}

static nl_jv *get_attr(rstate *R, const node *n, nl_jv *obj, const char *name, size_t len) {
    if (obj->type == V_UNDEF) {
        nl_jinja_rerr(R, n, "'%s' is undefined (reading its '%.*s')", obj->u.undef ? obj->u.undef : "value", (int)len,
                      name);
        return NULL;
    }
    if (obj->type == V_DICT || obj->type == V_NS) {
        if (obj->type == V_DICT)
            for (int i = 0; dict_methods[i]; i++)
                if (strlen(dict_methods[i]) == len && !memcmp(dict_methods[i], name, len))
                    return nl_jinja_method(obj, dict_methods[i]);
        nl_jv *v = nl_jv_dict_getn(obj, name, len);
        return v ? nl_jv_ref(v) : nl_jv_undef(n->name ? n->name : "attribute");
    }
    if (obj->type == V_STR)
        for (int i = 0; str_methods[i]; i++)
            if (strlen(str_methods[i]) == len && !memcmp(str_methods[i], name, len))
                return nl_jinja_method(obj, str_methods[i]);
    return nl_jv_undef(n->name ? n->name : "attribute");
}

static bool norm_index(int64_t *i, size_t n) {
    if (*i < 0) *i += (int64_t)n;
    return *i >= 0 && (uint64_t)*i < n;
}

nl_jv *nl_jinja_get_item(rstate *R, const node *n, nl_jv *obj, nl_jv *key) {
    if (obj->type == V_UNDEF) {
        nl_jinja_rerr(R, n, "'%s' is undefined (indexing it)", obj->u.undef ? obj->u.undef : "value");
        return NULL;
    }
    if ((obj->type == V_LIST || obj->type == V_STR) && (key->type == V_INT || key->type == V_BOOL)) {
        int64_t i = nl_jinja_num_i(key);
        if (obj->type == V_LIST) {
            if (!norm_index(&i, obj->u.l.n)) return nl_jv_undef("list item");
            return nl_jv_ref(obj->u.l.v[i]);
        }
        /* a character: UTF-8 aware */
        if (nl_jb_charge(0, obj->u.s.n / 64)) return NULL;
        size_t nchar = 0;
        for (size_t k = 0; k < obj->u.s.n; k++) nchar += ((unsigned char)obj->u.s.s[k] & 0xC0) != 0x80;
        if (!norm_index(&i, nchar)) return nl_jv_undef("string index");
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
        return nl_jinja_substr(obj, a, b);
    }
    if (key->type == V_STR) {
        if (obj->type == V_DICT || obj->type == V_NS) {
            nl_jv *v = nl_jv_dict_getn(obj, key->u.s.s, key->u.s.n);
            if (v) return nl_jv_ref(v);
        }
        return get_attr(R, n, obj, key->u.s.s, key->u.s.n);
    }
    return nl_jv_undef("item");
}

/* The iteration items of v as a new list (dicts: keys; strings: characters). */
nl_jv *nl_jinja_as_list(rstate *R, const node *n, const nl_jv *v) {
    nl_jv *l = nl_jv_list();
    if (!l) return NULL;
    switch (v->type) {
    case V_UNDEF:
    case V_NONE:
        if (v->type == V_NONE) {
            nl_jv_unref(l);
            nl_jinja_rerr(R, n, "none is not iterable");
            return NULL;
        }
        return l;
    case V_LIST:
        for (size_t i = 0; i < v->u.l.n; i++)
            if (nl_jv_push(l, nl_jv_ref(v->u.l.v[i]))) goto fail;
        return l;
    case V_DICT:
        for (size_t i = 0; i < v->u.d.n; i++)
            if (nl_jv_push(l, nl_jv_ref(v->u.d.k[i]))) goto fail;
        return l;
    case V_STR:
        for (size_t i = 0; i < v->u.s.n;) {
            size_t j = i + 1;
            while (j < v->u.s.n && ((unsigned char)v->u.s.s[j] & 0xC0) == 0x80) j++;
            if (nl_jv_push(l, nl_jinja_substr(v, i, j))) goto fail;
            i = j;
        }
        return l;
    default:
        nl_jv_unref(l);
        nl_jinja_rerr(R, n, "a value of type %s is not iterable", nl_jinja_type_name(v));
        return NULL;
    }
fail:
    nl_jv_unref(l);
    return NULL;
}

/* Slice a list or a string (by characters) with Python's rules. */
nl_jv *nl_jinja_slice(rstate *R, const node *n, nl_jv *obj, nl_jv *const *parts) {
    int64_t st[3];
    bool has[3];
    for (int k = 0; k < 3; k++) {
        has[k] = parts[k] && parts[k]->type != V_NONE;
        if (has[k] && parts[k]->type != V_INT && parts[k]->type != V_BOOL) {
            nl_jinja_rerr(R, n, "slice indices must be integers, not %s", nl_jinja_type_name(parts[k]));
            return NULL;
        }
        st[k] = has[k] ? nl_jinja_num_i(parts[k]) : 0;
    }
    int64_t step = has[2] ? st[2] : 1;
    if (step == 0) {
        nl_jinja_rerr(R, n, "slice step cannot be zero");
        return NULL;
    }
    nl_jv *items = obj->type == V_STR || obj->type == V_LIST ? nl_jinja_as_list(R, n, obj) : NULL;
    if (!items) {
        if (obj->type != V_STR && obj->type != V_LIST)
            nl_jinja_rerr(R, n, "a value of type %s cannot be sliced", nl_jinja_type_name(obj));
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
        if (nl_jv_push(out, nl_jv_ref(items->u.l.v[i]))) {
            nl_jv_unref(out); /* a push that fails (the budget) leaves the list to its owner */
            out = NULL;
        }
    nl_jv_unref(items);
    if (!out) return NULL;
    if (obj->type == V_STR) {
        buf b = {0};
        for (size_t i = 0; i < out->u.l.n; i++)
            if (nl_jbuf_jv(&b, out->u.l.v[i])) {
                nl_jbuf_free(&b);
                nl_jv_unref(out);
                return NULL;
            }
        nl_jv_unref(out);
        return nl_jbuf_take(&b);
    }
    return out;
}

/* An expression's value. Long (~140 lines): one case per expression node kind in one switch, each
 * short; the budget and the reference counting are the same in every case. */
nl_jv *nl_jinja_eval(rstate *R, frame *f, const node *n) {
    R->at = n;
    if (nl_jb_charge(0, 1)) return NULL;
    if (++R->depth > MAX_DEPTH * 4) {
        R->depth--;
        nl_jinja_rerr(R, n, "expression nested too deeply");
        return NULL;
    }
    nl_jv *res = NULL, *a = NULL, *b = NULL;
    switch (n->kind) {
    case N_LIT: res = nl_jv_ref(n->lit); break;
    case N_NAME: {
        nl_jv *v = lookup(R, f, n->name);
        if (v) {
            res = nl_jv_ref(v);
            break;
        }
        int bi = nl_jinja_find_name(nl_jinja_builtin_names, B_N, n->name, strlen(n->name));
        if (bi >= 0) {
            res = nl_jv_new(V_FUNC);
            if (res) res->u.func = bi;
            break;
        }
        res = nl_jv_undef(n->name);
        break;
    }
    case N_ATTR:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        res = get_attr(R, n, a, n->name, strlen(n->name));
        break;
    case N_ITEM:
        if (!(a = nl_jinja_eval(R, f, n->a)) || !(b = nl_jinja_eval(R, f, n->b))) break;
        res = nl_jinja_get_item(R, n, a, b);
        break;
    case N_SLICE: {
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        nl_jv *parts[3] = {NULL, NULL, NULL};
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++)
            if (n->kids[k] && !(parts[k] = nl_jinja_eval(R, f, n->kids[k]))) ok = false;
        if (ok) res = nl_jinja_slice(R, n, a, parts);
        for (int k = 0; k < 3; k++) nl_jv_unref(parts[k]);
        break;
    }
    case N_CALL: {
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        args ar;
        if (nl_jinja_eval_args(R, f, n, 0, &ar)) break;
        res = nl_jinja_call_value(R, f, n, a, &ar);
        nl_jinja_args_free(&ar);
        break;
    }
    case N_FILTER: {
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        args ar;
        if (nl_jinja_eval_args(R, f, n, 0, &ar)) break;
        res = nl_jinja_apply_filter(R, f, n, n->filter_id, a, &ar);
        nl_jinja_args_free(&ar);
        break;
    }
    case N_TEST: {
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        args ar;
        if (nl_jinja_eval_args(R, f, n, 0, &ar)) break;
        res = nl_jinja_apply_test(R, f, n, n->filter_id, a, &ar);
        nl_jinja_args_free(&ar);
        if (res && n->op) res->u.b = !res->u.b;
        break;
    }
    case N_NOT:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        res = nl_jv_bool(!nl_jinja_truthy(a));
        break;
    case N_NEG:
    case N_POS:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        if (!nl_jinja_is_num(a)) {
            nl_jinja_rerr(R, n, "bad operand type for unary %c: %s", n->kind == N_NEG ? '-' : '+',
                          nl_jinja_type_name(a));
            break;
        }
        if (n->kind == N_POS) res = a->type == V_FLOAT ? nl_jv_float(a->u.f) : nl_jv_int(nl_jinja_num_i(a));
        else if (a->type == V_FLOAT) res = nl_jv_float(-a->u.f);
        else if (nl_jinja_num_i(a) == INT64_MIN) nl_jinja_rerr(R, n, "integer overflow");
        else res = nl_jv_int(-nl_jinja_num_i(a));
        break;
    case N_BIN:
        if (!(a = nl_jinja_eval(R, f, n->a)) || !(b = nl_jinja_eval(R, f, n->b))) break;
        res = nl_jinja_binop(R, n, n->op, a, b);
        break;
    case N_CONCAT: {
        if (!(a = nl_jinja_eval(R, f, n->a)) || !(b = nl_jinja_eval(R, f, n->b))) break;
        buf o = {0};
        if (nl_jinja_to_str(&o, a) || nl_jinja_to_str(&o, b)) {
            nl_jbuf_free(&o);
            break;
        }
        res = nl_jbuf_take(&o);
        break;
    }
    case N_AND:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        res = nl_jinja_truthy(a) ? nl_jinja_eval(R, f, n->b) : nl_jv_ref(a);
        break;
    case N_OR:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        res = nl_jinja_truthy(a) ? nl_jv_ref(a) : nl_jinja_eval(R, f, n->b);
        break;
    case N_COND:
        if (!(a = nl_jinja_eval(R, f, n->a))) break;
        res = nl_jinja_truthy(a) ? nl_jinja_eval(R, f, n->b)
              : n->c             ? nl_jinja_eval(R, f, n->c)
                                 : nl_jv_undef("the else of a conditional");
        break;
    case N_LIST:
    case N_TUPLE:
        res = nl_jv_list();
        for (int i = 0; res && i < n->n_kids; i++)
            if (nl_jv_push(res, nl_jinja_eval(R, f, n->kids[i]))) {
                nl_jv_unref(res);
                res = NULL;
            }
        break;
    case N_DICT:
        res = nl_jv_dict();
        for (int i = 0; res && i + 1 < n->n_kids; i += 2) {
            nl_jv *k = nl_jinja_eval(R, f, n->kids[i]);
            if (k && k->type != V_STR) {
                nl_jinja_rerr(R, n, "dict keys must be strings here, not %s", nl_jinja_type_name(k));
                nl_jv_unref(k);
                k = NULL;
            }
            if (!k || nl_jv_dict_setv(res, k, nl_jinja_eval(R, f, n->kids[i + 1]))) {
                nl_jv_unref(res);
                res = NULL;
            }
        }
        break;
    default: nl_jinja_rerr(R, n, "not an expression"); break;
    }
    nl_jv_unref(a);
    nl_jv_unref(b);
    R->depth--;
    return res;
}

static int emit(rstate *R, const node *n, buf *out, const nl_jv *v) {
    if (v->type == V_UNDEF) return 0;
    if (v->type == V_FUNC || v->type == V_METHOD || v->type == V_MACRO)
        return nl_jinja_rerr(R, n, "cannot print a %s", nl_jinja_type_name(v));
    return nl_jinja_to_str(out, v);
}

static int exec_for(rstate *R, frame *f, const node *n, buf *out) {
    nl_jv *it = nl_jinja_eval(R, f, n->a);
    if (!it) return -1;
    nl_jv *items = it->type == V_DICT ? nl_jinja_as_list(R, n, it) : nl_jinja_as_list(R, n, it);
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
            if (n->n_names == 1) rc = nl_jinja_frame_set(&ff, n->names[0], nl_jv_ref(x));
            else
                for (int k = 0; k < n->n_names && !rc; k++)
                    rc = nl_jinja_frame_set(&ff, n->names[k],
                                            x->type == V_LIST && (size_t)k < x->u.l.n ? nl_jv_ref(x->u.l.v[k])
                                                                                      : nl_jv_undef(n->names[k]));
            nl_jv *c = rc ? NULL : nl_jinja_eval(R, &ff, n->b);
            if (!c) rc = -1;
            else if (nl_jinja_truthy(c)) rc = nl_jv_push(kept, nl_jv_ref(x));
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
        R->at = n;
        if (nl_jb_charge(0, 1)) {
            rc = -1;
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
             (i > 0 && nl_jv_set(loop, "previtem", nl_jv_ref(items->u.l.v[i - 1]))) ||
             (i + 1 < len && nl_jv_set(loop, "nextitem", nl_jv_ref(items->u.l.v[i + 1])));
        /* the frame owns loop once it is set (a failed set frees it); a failure before that leaves it ours */
        if (rc) nl_jv_unref(loop);
        else rc = nl_jv_set(ff.vars, "loop", loop);
        nl_jv *x = items->u.l.v[i];
        if (!rc) {
            if (n->n_names == 1) {
                rc = nl_jinja_frame_set(&ff, n->names[0], nl_jv_ref(x));
            } else {
                nl_jv *tu = x->type == V_LIST ? nl_jv_ref(x) : NULL;
                if (!tu || tu->u.l.n != (size_t)n->n_names)
                    rc = nl_jinja_rerr(R, n, "cannot unpack a %s into %d loop variables", nl_jinja_type_name(x),
                                       n->n_names);
                for (int k = 0; k < n->n_names && !rc; k++)
                    rc = nl_jinja_frame_set(&ff, n->names[k], nl_jv_ref(tu->u.l.v[k]));
                nl_jv_unref(tu);
            }
        }
        if (!rc) rc = nl_jinja_exec_body(R, &ff, n->kids[0], out);
        nl_jv_unref(ff.vars);
        if (R->brk == 1) {
            R->brk = 0;
            break;
        }
        R->brk = 0;
    }
    if (!rc && len == 0 && n->c) rc = nl_jinja_exec_body(R, f, n->c, out);
    nl_jv_unref(items);
    return rc;
}

int nl_jinja_exec_body(rstate *R, frame *f, const node *body, buf *out) {
    for (int i = 0; i < body->n_kids && !R->brk; i++) {
        const node *s = body->kids[i];
        R->at = s;
        if (nl_jb_charge(0, 1)) return -1;
        switch (s->kind) {
        case S_TEXT:
            if (nl_jbuf_jv(out, s->lit)) return -1;
            break;
        case S_OUT: {
            nl_jv *v = nl_jinja_eval(R, f, s->a);
            if (!v) return -1;
            int rc = emit(R, s, out, v);
            nl_jv_unref(v);
            if (rc) return -1;
            break;
        }
        case S_BODY:
            if (nl_jinja_exec_body(R, f, s, out)) return -1;
            break;
        case S_IF: {
            for (int k = 0; k + 1 < s->n_kids; k += 2) {
                bool take = true;
                if (s->kids[k]) {
                    nl_jv *c = nl_jinja_eval(R, f, s->kids[k]);
                    if (!c) return -1;
                    take = nl_jinja_truthy(c);
                    nl_jv_unref(c);
                }
                if (take) {
                    if (nl_jinja_exec_body(R, f, s->kids[k + 1], out)) return -1;
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
                v = nl_jinja_eval(R, f, s->a);
            } else {
                buf b = {0};
                if (nl_jinja_exec_body(R, f, s->b, &b)) {
                    nl_jbuf_free(&b);
                    return -1;
                }
                v = nl_jbuf_take(&b);
                if (v && s->c) {
                    /* the filters over the captured text: bind it to the placeholder */
                    frame pf = {nl_jv_dict(), f};
                    nl_jv *r = NULL;
                    if (pf.vars && !nl_jinja_frame_set(&pf, " block", v)) r = nl_jinja_eval(R, &pf, s->c);
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
                    return nl_jinja_rerr(R, s, "'%s' is not a namespace (set %s.%s)", s->name, s->name, s->attr);
                }
                if (nl_jv_set(ns, s->attr, v)) return -1;
            } else if (nl_jinja_frame_set(f, s->name, v)) {
                return -1;
            }
            break;
        }
        case S_MACRO: {
            nl_jv *m = nl_jv_new(V_MACRO);
            if (!m) return -1;
            m->u.macro = s;
            if (nl_jinja_frame_set(f, s->name, m)) return -1;
            break;
        }
        case S_BREAK: R->brk = 1; break;
        case S_CONTINUE: R->brk = 2; break;
        default: return nl_jinja_rerr(R, s, "not a statement");
        }
    }
    return 0;
}

/* The default budget per rendering (jinja.h): generous for a chat template over a conversation,
 * far below what a bomb asks for. */
#define MEM_DEFAULT ((size_t)8 << 20)
#define OPS_DEFAULT 2000000u

int nl_jinja_render_ex(const nl_jinja *t, const nl_jv *ctx, const nl_jinja_limits *lim, char **text, size_t *len,
                       uint8_t **from_data) {
    nl_jbudget B = {.mem_limit = lim && lim->mem_bytes ? lim->mem_bytes : MEM_DEFAULT,
                    .ops_limit = lim && lim->ops ? lim->ops : OPS_DEFAULT};
    nl_jbudget *outer = nl_jb;
    nl_jb = &B;
    rstate R = {.t = t, .ctx = ctx};
    frame root = {nl_jv_dict(), NULL};
    R.root = &root;
    buf out = {0};
    int rc = root.vars ? nl_jbuf_add(&out, "", 0, NULL, 0) : -1;
    if (!rc) rc = nl_jinja_exec_body(&R, &root, t->root, &out);
    nl_jv_unref(root.vars);
    nl_jb = outer;
    if (rc || B.over) {
        nl_jbuf_free(&out);
        if (B.over == NL_JB_MEM)
            nl_jinja_rerr(&R, R.at, "the template needs more than %.1f MiB (its memory limit for one rendering)",
                          (double)B.mem_limit / (1 << 20));
        else if (B.over == NL_JB_OPS)
            nl_jinja_rerr(&R, R.at,
                          "the template ran past %" PRIu64 " operations (its limit for one rendering: values made, "
                          "expressions, loop iterations, calls, output bytes / 64)",
                          B.ops_limit);
        else if (B.over == NL_JB_DEPTH) nl_jinja_rerr(&R, R.at, "a value nested more than %d deep", MAX_DEPTH);
        return B.over ? NL_JINJA_OVER_BUDGET : -1;
    }
    *text = out.s;
    if (len) *len = out.n;
    if (from_data) *from_data = out.t;
    else free(out.t);
    return 0;
}

int nl_jinja_render(const nl_jinja *t, const nl_jv *ctx, char **text, size_t *len, uint8_t **from_data) {
    return nl_jinja_render_ex(t, ctx, NULL, text, len, from_data);
}

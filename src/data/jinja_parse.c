/* data/jinja_parse: tokens to a tree of expression and statement nodes (nl_jinja_parse), and the
 * tables of the filters, tests and builtins the parser accepts. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_int.h"
#include "util/util.h"

/* ================================ tree ================================ */

/* Iterative (a worklist through `next`): `1+1+...+1` with 100k terms is a tree 100k deep. */
static void node_free(node *n) {
    if (!n) return;
    n->next = NULL;
    node *todo = n;
    while (todo) {
        node *w = todo;
        todo = w->next;
        node *kid[3] = {w->a, w->b, w->c};
        for (int i = 0; i < 3 + w->n_kids; i++) {
            node *k = i < 3 ? kid[i] : w->kids[i - 3];
            if (!k) continue;
            k->next = todo;
            todo = k;
        }
        free(w->name);
        free(w->attr);
        nl_jv_unref(w->lit);
        free(w->kids);
        for (int i = 0; i < w->n_names; i++) free(w->names[i]);
        free(w->names);
        free(w);
    }
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

const char *const nl_jinja_filter_names[F_N] = {
    "trim",     "length",     "count",      "tojson", "items",   "string", "safe",  "join",    "select",
    "reject",   "selectattr", "rejectattr", "map",    "first",   "last",   "list",  "default", "d",
    "upper",    "lower",      "capitalize", "title",  "replace", "int",    "float", "abs",     "reverse",
    "dictsort", "unique",     "indent",     "sort",   "min",     "max",    "sum"};

const char *const nl_jinja_test_names[TS_N] = {
    "defined", "undefined",   "none",     "string",  "mapping", "iterable", "sequence", "number", "integer", "float",
    "boolean", "true",        "false",    "equalto", "eq",      "==",       "ne",       "sameas", "in",      "odd",
    "even",    "divisibleby", "callable", "lower",   "upper",   "gt",       "lt",       "ge",     "le"};

const char *const nl_jinja_builtin_names[B_N] = {"raise_exception", "namespace", "range", "dict"};

int nl_jinja_find_name(const char *const *tab, int n, const char *s, size_t len) {
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
    case T_NAME:
    case T_OP:
    case T_INT:
    case T_FLOAT: snprintf(tmp, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); break;
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
            if (nl_jbuf_add(&b, cur(P)->str, cur(P)->str_n, NULL, 0)) {
                nl_jbuf_free(&b);
                return NULL;
            }
            P->p++;
        }
        return lit_node(P, nl_jbuf_take(&b));
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
        return lit_node(P, nl_jv_float(strtod(num, NULL)));
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
    int id = nl_jinja_find_name(tab, ntab, t->s, t->n);
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
            if (name_after(P, "filter", nl_jinja_filter_names, F_N, f)) break;
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
            if (name_after(P, "test", nl_jinja_test_names, TS_N, t)) break;
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
        int op = at_op(P, "*")    ? OP_MUL
                 : at_op(P, "/")  ? OP_DIV
                 : at_op(P, "//") ? OP_FDIV
                 : at_op(P, "%")  ? OP_MOD
                                  : -1;
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
        int op = at_op(P, "==")     ? OP_EQ
                 : at_op(P, "!=")   ? OP_NE
                 : at_op(P, "<")    ? OP_LT
                 : at_op(P, ">")    ? OP_GT
                 : at_op(P, "<=")   ? OP_LE
                 : at_op(P, ">=")   ? OP_GE
                 : at_name(P, "in") ? OP_IN
                                    : -1;
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
            if (!n || !(n->lit = nl_jv_strt(t->str, t->str_n, NULL)) || node_add(body, n)) {
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
                static const char *const known_ends[] = {"endif", "endfor", "endset",        "endmacro",
                                                         "elif",  "else",   "endgeneration", NULL};
                if (nl_jinja_find_name(known_ends, 7, nm->s, nm->n) >= 0) return perr(P, "unexpected {%% %s %%}", name);
                return perr(P, "tag '%s' is not supported", name);
            }
            continue;
        }
        char tmp[64];
        return perr(P, "unexpected %s", tok_desc(t, tmp, sizeof tmp));
    }
}

/* Long (~160 lines): one case per statement tag (if, for, set, macro, call, filter, ...), each a
 * few lines of the same parser state; a table of functions would only move the cases apart. */
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
    if (nl_jinja_lex(&L)) goto done;
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
    free(L.nl);
    free(L.src);
    return t;
}

void nl_jinja_free(nl_jinja *t) {
    if (!t) return;
    node_free(t->root);
    free(t->label);
    free(t);
}

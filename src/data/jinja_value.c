/* data/jinja_value: the template values (reference-counted; the constructors of jinja.h and the
 * internal ones of jinja_int.h) and the growable byte buffer with data flags. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_int.h"
#include "util/util.h"

/* ================================ values ================================ */

nl_jv *nl_jv_new(vtype t) {
    nl_jv *v = nl_calloc(1, sizeof *v);
    if (v) {
        v->type = t;
        v->rc = 1;
    }
    return v;
}
nl_jv *nl_jv_ref(nl_jv *v) {
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

nl_jv *nl_jv_none(void) { return nl_jv_new(V_NONE); }
nl_jv *nl_jv_bool(bool b) {
    nl_jv *v = nl_jv_new(V_BOOL);
    if (v) v->u.b = b;
    return v;
}
nl_jv *nl_jv_int(int64_t i) {
    nl_jv *v = nl_jv_new(V_INT);
    if (v) v->u.i = i;
    return v;
}
nl_jv *nl_jv_float(double f) {
    nl_jv *v = nl_jv_new(V_FLOAT);
    if (v) v->u.f = f;
    return v;
}
nl_jv *nl_jv_undef(const char *name) {
    nl_jv *v = nl_jv_new(V_UNDEF);
    if (v) v->u.undef = name;
    return v;
}
/* A string from bytes and optional taint flags (copied). */
nl_jv *nl_jv_strt(const char *s, size_t n, const uint8_t *taint) {
    nl_jv *v = nl_jv_new(V_STR);
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
    nl_jv *v = nl_jv_strt(s, n, NULL);
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
nl_jv *nl_jv_cstr(const char *s) { return nl_jv_strt(s, strlen(s), NULL); }
nl_jv *nl_jv_list(void) { return nl_jv_new(V_LIST); }
nl_jv *nl_jv_dict(void) { return nl_jv_new(V_DICT); }

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

nl_jv *nl_jv_dict_getn(const nl_jv *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->u.d.n; i++)
        if (str_eq(d->u.d.k[i], k, n)) return d->u.d.v[i];
    return NULL;
}

/* Set key (a string value, a new reference taken) to v (taken). */
int nl_jv_dict_setv(nl_jv *d, nl_jv *key, nl_jv *v) {
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
int nl_jv_set(nl_jv *d, const char *key, nl_jv *v) { return nl_jv_dict_setv(d, nl_jv_cstr(key), v); }

nl_jv *nl_jv_from_json(const nl_json *j) {
    switch (j->type) {
    case NL_JSON_NULL: return nl_jv_none();
    case NL_JSON_FALSE: return nl_jv_bool(false);
    case NL_JSON_TRUE: return nl_jv_bool(true);
    case NL_JSON_NUMBER: return j->u.num.is_int ? nl_jv_int(j->u.num.i) : nl_jv_float(j->u.num.d);
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
            if (nl_jv_dict_setv(d, nl_jv_str(m->key, m->key_len, true), nl_jv_from_json(&m->value))) {
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

int nl_jbuf_add(buf *b, const char *s, size_t n, const uint8_t *taint, uint8_t flag) {
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
int nl_jbuf_str(buf *b, const char *s) { return nl_jbuf_add(b, s, strlen(s), NULL, 0); }
int nl_jbuf_jv(buf *b, const nl_jv *v) { return nl_jbuf_add(b, v->u.s.s, v->u.s.n, v->u.s.taint, 0); }
nl_jv *nl_jbuf_take(buf *b) {
    nl_jv *v = nl_jv_strt(b->s ? b->s : "", b->n, b->t);
    free(b->s);
    free(b->t);
    memset(b, 0, sizeof *b);
    return v;
}

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

/* ---- the rendering's budget ---- */

_Thread_local nl_jbudget *nl_jb;

int nl_jb_charge(size_t bytes, uint64_t ops) {
    nl_jbudget *B = nl_jb;
    if (!B) return 0;
    if (B->over) return -1;
    B->mem += bytes;
    B->ops += ops;
    if (B->mem > B->mem_limit) B->over = NL_JB_MEM;
    else if (B->ops > B->ops_limit) B->over = NL_JB_OPS;
    else return 0;
    return nl_err("the template ran out of its budget"); /* the rendering names which, and where */
}

void nl_jb_release(size_t bytes) {
    nl_jbudget *B = nl_jb;
    if (B) B->mem = bytes > B->mem ? 0 : B->mem - bytes;
}

/* What a value holds, as charged while it was made (and released when it goes). */
static size_t jv_bytes(const nl_jv *v) {
    size_t b = sizeof *v;
    switch (v->type) {
    case V_STR: b += v->u.s.n + 1 + (v->u.s.taint ? v->u.s.n : 0); break;
    case V_LIST: b += v->u.l.cap * sizeof(nl_jv *); break;
    case V_DICT:
    case V_NS: b += v->u.d.cap * 2 * sizeof(nl_jv *) + (size_t)v->u.d.icap * sizeof(uint32_t); break;
    default: break;
    }
    return b;
}

/* ================================ values ================================ */

nl_jv *nl_jv_new(vtype t) {
    if (nl_jb_charge(sizeof(nl_jv), 1)) return NULL;
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
/* Iterative (a worklist through `next`), so a deeply nested value cannot overflow the stack. */
void nl_jv_unref(nl_jv *v) {
    if (!v || --v->rc > 0) return;
    v->next = NULL;
    nl_jv *todo = v;
#define DROP(c)                                                                                                        \
    do {                                                                                                               \
        nl_jv *c_ = (c);                                                                                               \
        if (c_ && --c_->rc == 0) {                                                                                     \
            c_->next = todo;                                                                                           \
            todo = c_;                                                                                                 \
        }                                                                                                              \
    } while (0)
    while (todo) {
        nl_jv *w = todo;
        todo = w->next;
        switch (w->type) {
        case V_LIST:
            for (size_t i = 0; i < w->u.l.n; i++) DROP(w->u.l.v[i]);
            break;
        case V_DICT:
        case V_NS:
            for (size_t i = 0; i < w->u.d.n; i++) {
                DROP(w->u.d.k[i]);
                DROP(w->u.d.v[i]);
            }
            break;
        case V_METHOD: DROP(w->u.m.self); break;
        default: break;
        }
        nl_jb_release(jv_bytes(w));
        switch (w->type) {
        case V_STR:
            free(w->u.s.s);
            free(w->u.s.taint);
            break;
        case V_LIST: free(w->u.l.v); break;
        case V_DICT:
        case V_NS:
            free(w->u.d.k);
            free(w->u.d.v);
            free(w->u.d.idx);
            break;
        default: break;
        }
        free(w);
    }
#undef DROP
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
    if (nl_jb_charge(n + 1, 1 + n / 64)) return NULL;
    nl_jv *v = nl_jv_new(V_STR);
    if (!v) {
        nl_jb_release(n + 1);
        return NULL;
    }
    v->u.s.n = n; /* charged from here on: nl_jv_unref releases it */
    v->u.s.s = nl_malloc(n + 1);
    if (!v->u.s.s) {
        nl_jv_unref(v);
        return NULL;
    }
    if (n) memcpy(v->u.s.s, s, n);
    v->u.s.s[n] = 0;
    v->u.s.n = n;
    if (taint) {
        bool any = false;
        for (size_t i = 0; i < n && !any; i++) any = taint[i] != 0;
        if (any) {
            if (nl_jb_charge(n, 0)) {
                nl_jv_unref(v);
                return NULL;
            }
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
        if (nl_jb_charge(n, 0)) {
            nl_jv_unref(v);
            return NULL;
        }
        v->u.s.taint = nl_malloc(n);
        if (!v->u.s.taint) {
            nl_jv_unref(v);
            return NULL;
        }
        memset(v->u.s.taint, 1, n);
    }
    return v;
}
nl_jv *nl_jv_str_flags(const char *s, size_t n, const uint8_t *flags) { return nl_jv_strt(s, n, flags); }
nl_jv *nl_jv_cstr(const char *s) { return nl_jv_strt(s, strlen(s), NULL); }
nl_jv *nl_jv_list(void) { return nl_jv_new(V_LIST); }
nl_jv *nl_jv_dict(void) { return nl_jv_new(V_DICT); }

int nl_jv_push(nl_jv *l, nl_jv *v) {
    if (!v) return -1;
    if (l->u.l.n == l->u.l.cap) {
        size_t cap = l->u.l.cap ? l->u.l.cap * 2 : 4;
        if (nl_jb_charge((cap - l->u.l.cap) * sizeof(nl_jv *), 0)) {
            nl_jv_unref(v);
            return -1;
        }
        nl_jv **nv = realloc(l->u.l.v, cap * sizeof *nv);
        if (!nv) {
            nl_jb_release((cap - l->u.l.cap) * sizeof(nl_jv *));
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

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The entry index of key (s, n) in d, or -1: through the hash index when there is one. */
static long dict_find(const nl_jv *d, const char *k, size_t n) {
    if (d->u.d.idx) {
        uint32_t mask = d->u.d.icap - 1;
        for (uint32_t h = hash_bytes(k, n) & mask;; h = (h + 1) & mask) {
            uint32_t e = d->u.d.idx[h];
            if (!e) return -1;
            if (str_eq(d->u.d.k[e - 1], k, n)) return (long)e - 1;
        }
    }
    for (size_t i = 0; i < d->u.d.n; i++)
        if (str_eq(d->u.d.k[i], k, n)) return (long)i;
    return -1;
}

static void index_put(nl_jv *d, size_t i) {
    uint32_t mask = d->u.d.icap - 1;
    const nl_jv *key = d->u.d.k[i];
    uint32_t h = hash_bytes(key->u.s.s, key->u.s.n) & mask;
    while (d->u.d.idx[h]) h = (h + 1) & mask;
    d->u.d.idx[h] = (uint32_t)i + 1;
}

/* After entry n-1 was added: the index kept at most half full (built at 16 keys), so a dict with
 * many keys (200k {% set %} in one scope) costs O(1) per lookup, not O(keys). */
static int index_added(nl_jv *d) {
    size_t n = d->u.d.n;
    if (n < 16) return 0;
    if (d->u.d.idx && n * 2 <= d->u.d.icap) {
        index_put(d, n - 1);
        return 0;
    }
    size_t icap = 64;
    while (icap < n * 4) icap *= 2;
    if (icap > UINT32_MAX / 2 || nl_jb_charge((icap - d->u.d.icap) * sizeof(uint32_t), icap / 64)) return -1;
    uint32_t *idx = nl_calloc(icap, sizeof *idx);
    if (!idx) {
        nl_jb_release((icap - d->u.d.icap) * sizeof(uint32_t));
        return -1;
    }
    free(d->u.d.idx);
    d->u.d.idx = idx;
    d->u.d.icap = (uint32_t)icap;
    for (size_t i = 0; i < n; i++) index_put(d, i);
    return 0;
}

nl_jv *nl_jv_dict_getn(const nl_jv *d, const char *k, size_t n) {
    long i = dict_find(d, k, n);
    return i < 0 ? NULL : d->u.d.v[i];
}

/* Set key (a string value, a new reference taken) to v (taken). */
int nl_jv_dict_setv(nl_jv *d, nl_jv *key, nl_jv *v) {
    if (!key || !v) {
        nl_jv_unref(key);
        nl_jv_unref(v);
        return -1;
    }
    long at = dict_find(d, key->u.s.s, key->u.s.n);
    if (at >= 0) {
        nl_jv_unref(d->u.d.v[at]);
        d->u.d.v[at] = v;
        nl_jv_unref(key);
        return 0;
    }
    if (d->u.d.n == d->u.d.cap) {
        size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 4;
        size_t grow = (cap - d->u.d.cap) * 2 * sizeof(nl_jv *);
        if (nl_jb_charge(grow, 0)) {
            nl_jv_unref(key);
            nl_jv_unref(v);
            return -1;
        }
        nl_jv **nk = realloc(d->u.d.k, cap * sizeof *nk);
        if (nk) d->u.d.k = nk;
        nl_jv **nv = nk ? realloc(d->u.d.v, cap * sizeof *nv) : NULL;
        if (nv) d->u.d.v = nv;
        if (!nv) {
            /* the arrays keep their old capacity (one of them may be larger: only cap counts) */
            nl_jb_release(grow);
            nl_jv_unref(key);
            nl_jv_unref(v);
            return nl_err("out of memory");
        }
        d->u.d.cap = cap;
    }
    d->u.d.k[d->u.d.n] = key;
    d->u.d.v[d->u.d.n++] = v;
    return index_added(d);
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
        if (nl_jb_charge((cap - b->cap) * 2, 0)) return -1;
        char *ns = realloc(b->s, cap);
        if (ns) b->s = ns;
        uint8_t *nt = ns ? realloc(b->t, cap) : NULL;
        if (nt) b->t = nt;
        if (!nt) {
            nl_jb_release((cap - b->cap) * 2);
            return nl_err("out of memory");
        }
        b->cap = cap;
    }
    if (nl_jb_charge(0, 1 + n / 64)) return -1;
    if (n) memcpy(b->s + b->n, s, n);
    if (taint) memcpy(b->t + b->n, taint, n);
    else memset(b->t + b->n, flag, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}
int nl_jbuf_str(buf *b, const char *s) { return nl_jbuf_add(b, s, strlen(s), NULL, 0); }
int nl_jbuf_jv(buf *b, const nl_jv *v) { return nl_jbuf_add(b, v->u.s.s, v->u.s.n, v->u.s.taint, 0); }
void nl_jbuf_free(buf *b) {
    nl_jb_release(b->cap * 2);
    free(b->s);
    free(b->t);
    memset(b, 0, sizeof *b);
}
nl_jv *nl_jbuf_take(buf *b) {
    nl_jv *v = nl_jv_strt(b->s ? b->s : "", b->n, b->t);
    nl_jbuf_free(b);
    return v;
}

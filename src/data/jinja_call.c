/* data/jinja_call: calls (evaluated arguments), string and dict methods, the builtins (range,
 * namespace, dict, raise_exception), macros, filters and tests. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja_int.h"
#include "util/util.h"

/* ---- calls: evaluated arguments ---- */

void nl_jinja_args_free(args *a) {
    for (int i = 0; i < a->n_pos; i++) nl_jv_unref(a->pos[i]);
    for (int i = 0; i < a->n_kw; i++) nl_jv_unref(a->kw[i]);
    a->n_pos = a->n_kw = 0;
}

int nl_jinja_eval_args(rstate *R, frame *f, const node *call, int first, args *a) {
    memset(a, 0, sizeof *a);
    for (int i = first; i < call->n_kids; i++) {
        const node *k = call->kids[i];
        if (a->n_pos >= 16 || a->n_kw >= 16) {
            nl_jinja_args_free(a);
            return nl_jinja_rerr(R, call, "too many arguments");
        }
        nl_jv *v = nl_jinja_eval(R, f, k->kind == N_KWARG ? k->a : k);
        if (!v) {
            nl_jinja_args_free(a);
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
    return nl_jinja_rerr(R, n, "%s must be a string, not %s", what, v ? nl_jinja_type_name(v) : "missing");
}

static nl_jv *call_macro(rstate *R, const node *n, const node *m, const args *a);

static nl_jv *split_str(rstate *R, const node *n, const nl_jv *s, const nl_jv *sep, int64_t maxsplit, bool from_right) {
    if (nl_jb_charge(0, s->u.s.n / 64)) return NULL;
    nl_jv *l = nl_jv_list();
    if (!l) return NULL;
    const char *p = s->u.s.s;
    size_t len = s->u.s.n;
    if (sep && sep->type != V_NONE) {
        if (need_str(R, n, sep, "split's separator")) goto fail;
        size_t m = sep->u.s.n;
        if (m == 0) {
            nl_jinja_rerr(R, n, "split: empty separator");
            goto fail;
        }
        if (!from_right) {
            size_t a = 0;
            int64_t done = 0;
            for (size_t i = 0; i + m <= len;) {
                if ((maxsplit < 0 || done < maxsplit) && memcmp(p + i, sep->u.s.s, m) == 0) {
                    if (nl_jv_push(l, nl_jinja_substr(s, a, i))) goto fail;
                    i += m;
                    a = i;
                    done++;
                } else {
                    i++;
                }
            }
            if (nl_jv_push(l, nl_jinja_substr(s, a, len))) goto fail;
        } else {
            /* collect from the right, then reverse */
            size_t b = len;
            int64_t done = 0;
            nl_jv *r = nl_jv_list();
            if (!r) goto fail;
            for (size_t i = len; i >= m;) {
                if ((maxsplit < 0 || done < maxsplit) && memcmp(p + i - m, sep->u.s.s, m) == 0) {
                    if (nl_jv_push(r, nl_jinja_substr(s, i, b))) {
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
            if (nl_jv_push(r, nl_jinja_substr(s, 0, b))) {
                nl_jv_unref(r);
                goto fail;
            }
            for (size_t i = r->u.l.n; i > 0; i--)
                if (nl_jv_push(l, nl_jv_ref(r->u.l.v[i - 1]))) {
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
        while (i < len && (w = nl_jinja_uspace_at(p, len, i))) i += w;
        if (i >= len) break;
        if (maxsplit >= 0 && done >= maxsplit) {
            size_t e = len;
            while (e > i && (w = nl_jinja_uspace_before(p, len, e))) e -= w;
            if (nl_jv_push(l, nl_jinja_substr(s, i, e))) goto fail;
            break;
        }
        size_t j = i;
        while (j < len && !nl_jinja_uspace_at(p, len, j)) j++;
        if (nl_jv_push(l, nl_jinja_substr(s, i, j))) goto fail;
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
    nl_jv *o = nl_jv_strt(s->u.s.s, s->u.s.n, s->u.s.taint);
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

static nl_jv *replace_str(rstate *R, const node *n, const nl_jv *s, const nl_jv *old, const nl_jv *new_,
                          int64_t count) {
    if (need_str(R, n, old, "replace's first argument") || need_str(R, n, new_, "replace's second argument"))
        return NULL;
    buf b = {0};
    size_t m = old->u.s.n;
    int64_t done = 0;
    int rc = 0;
    if (m == 0) {
        /* Python inserts the replacement between characters */
        for (size_t i = 0; i <= s->u.s.n && !rc;) {
            if (count < 0 || done < count) {
                rc = nl_jbuf_jv(&b, new_);
                done++;
            }
            if (i == s->u.s.n) break;
            size_t j = i + 1;
            while (j < s->u.s.n && ((unsigned char)s->u.s.s[j] & 0xC0) == 0x80) j++;
            if (!rc) rc = nl_jbuf_add(&b, s->u.s.s + i, j - i, s->u.s.taint ? s->u.s.taint + i : NULL, 0);
            i = j;
        }
    } else {
        size_t i = 0;
        while (i < s->u.s.n && !rc) {
            if ((count < 0 || done < count) && i + m <= s->u.s.n && memcmp(s->u.s.s + i, old->u.s.s, m) == 0) {
                rc = nl_jbuf_jv(&b, new_);
                i += m;
                done++;
            } else {
                rc = nl_jbuf_add(&b, s->u.s.s + i, 1, s->u.s.taint ? s->u.s.taint + i : NULL, 0);
                i++;
            }
        }
    }
    if (rc) {
        nl_jbuf_free(&b);
        return NULL;
    }
    return nl_jbuf_take(&b);
}

static nl_jv *call_method(rstate *R, const node *n, nl_jv *self, const char *name, const args *a) {
    if (self->type == V_DICT) {
        if (!strcmp(name, "get")) {
            nl_jv *k = arg(a, 0, "key");
            if (!k) {
                nl_jinja_rerr(R, n, "get() needs a key");
                return NULL;
            }
            nl_jv *v = k->type == V_STR ? nl_jv_dict_getn(self, k->u.s.s, k->u.s.n) : NULL;
            if (v) return nl_jv_ref(v);
            nl_jv *d = arg(a, 1, "default");
            return d ? nl_jv_ref(d) : nl_jv_none();
        }
        nl_jv *l = nl_jv_list();
        for (size_t i = 0; l && i < self->u.d.n; i++) {
            nl_jv *e;
            if (!strcmp(name, "keys")) e = nl_jv_ref(self->u.d.k[i]);
            else if (!strcmp(name, "values")) e = nl_jv_ref(self->u.d.v[i]);
            else {
                e = nl_jv_list();
                if (e && (nl_jv_push(e, nl_jv_ref(self->u.d.k[i])) || nl_jv_push(e, nl_jv_ref(self->u.d.v[i])))) {
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
            nl_jinja_rerr(R, n, "%s() needs an argument", name);
            return NULL;
        }
        const nl_jv *cands[64];
        size_t nc = 0;
        if (a0->type == V_LIST)
            for (size_t i = 0; i < a0->u.l.n && nc < 64; i++) cands[nc++] = a0->u.l.v[i];
        else cands[nc++] = a0;
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
        return split_str(R, n, self, sep, mx ? nl_jinja_num_i(mx) : -1, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (a0 && a0->type != V_NONE && need_str(R, n, a0, name)) return NULL;
        return nl_jinja_strip(self, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, a0 && a0->type == V_STR ? a0 : NULL);
    }
    if (!strcmp(name, "replace")) {
        nl_jv *c = arg(a, 2, "count");
        return replace_str(R, n, self, a0, a1, c ? nl_jinja_num_i(c) : -1);
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
        if (nl_jb_charge(0, self->u.s.n / 64 * (m / 64 + 1))) return NULL;
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
            nl_jinja_rerr(R, n, "join() needs an argument");
            return NULL;
        }
        nl_jv *items = nl_jinja_as_list(R, n, a0);
        if (!items) return NULL;
        buf b = {0};
        int rc = 0;
        for (size_t i = 0; i < items->u.l.n && !rc; i++) {
            if (i) rc = nl_jbuf_jv(&b, self);
            if (!rc && need_str(R, n, items->u.l.v[i], "join's items")) rc = -1;
            if (!rc) rc = nl_jbuf_jv(&b, items->u.l.v[i]);
        }
        nl_jv_unref(items);
        if (rc) {
            nl_jbuf_free(&b);
            return NULL;
        }
        return nl_jbuf_take(&b);
    }
    nl_jinja_rerr(R, n, "method '%s' is not supported", name);
    return NULL;
}

nl_jv *nl_jinja_call_value(rstate *R, frame *f, const node *n, nl_jv *fn, const args *a) {
    (void)f;
    R->at = n;
    if (nl_jb_charge(0, 1)) return NULL;
    if (fn->type == V_METHOD) return call_method(R, n, fn->u.m.self, fn->u.m.name, a);
    if (fn->type == V_MACRO) return call_macro(R, n, fn->u.macro, a);
    if (fn->type == V_FUNC) {
        switch (fn->u.func) {
        case B_RAISE: {
            nl_jv *m = arg(a, 0, NULL);
            nl_jv *s = m ? nl_jinja_str_of(m) : NULL;
            nl_jinja_rerr(R, n, "the template raised an error: %s", s ? s->u.s.s : "");
            nl_jv_unref(s);
            return NULL;
        }
        case B_NAMESPACE:
        case B_DICT: {
            nl_jv *ns = nl_jv_new(fn->u.func == B_NAMESPACE ? V_NS : V_DICT);
            if (!ns) return NULL;
            if (a->n_pos && a->pos[0]->type == V_DICT)
                for (size_t i = 0; i < a->pos[0]->u.d.n; i++)
                    if (nl_jv_dict_setv(ns, nl_jv_ref(a->pos[0]->u.d.k[i]), nl_jv_ref(a->pos[0]->u.d.v[i]))) {
                        nl_jv_unref(ns);
                        return NULL;
                    }
            for (int i = 0; i < a->n_kw; i++)
                if (nl_jv_set(ns, a->kw_name[i], nl_jv_ref(a->kw[i]))) {
                    nl_jv_unref(ns);
                    return NULL;
                }
            return ns;
        }
        case B_RANGE: {
            int64_t lo = 0, hi = 0, st = 1;
            for (int i = 0; i < a->n_pos; i++)
                if (a->pos[i]->type != V_INT) {
                    nl_jinja_rerr(R, n, "range() arguments must be integers");
                    return NULL;
                }
            if (a->n_pos == 1) hi = a->pos[0]->u.i;
            else if (a->n_pos >= 2) {
                lo = a->pos[0]->u.i;
                hi = a->pos[1]->u.i;
                if (a->n_pos >= 3) st = a->pos[2]->u.i;
            }
            if (st == 0) {
                nl_jinja_rerr(R, n, "range() step must not be zero");
                return NULL;
            }
            nl_jv *l = nl_jv_list();
            for (int64_t i = lo; l && (st > 0 ? i < hi : i > hi); i += st) {
                if (l->u.l.n >= 1000000) {
                    nl_jinja_rerr(R, n, "range() too long");
                    nl_jv_unref(l);
                    return NULL;
                }
                if (nl_jv_push(l, nl_jv_int(i))) {
                    nl_jv_unref(l); /* a push that fails (the budget) leaves the list to its owner */
                    l = NULL;
                }
            }
            return l;
        }
        }
    }
    if (fn->type == V_UNDEF)
        nl_jinja_rerr(R, n, "'%s' is undefined (called as a function)", fn->u.undef ? fn->u.undef : "value");
    else nl_jinja_rerr(R, n, "a value of type %s is not callable", nl_jinja_type_name(fn));
    return NULL;
}

static nl_jv *call_macro(rstate *R, const node *n, const node *m, const args *a) {
    if (++R->depth > MAX_DEPTH) {
        R->depth--;
        nl_jinja_rerr(R, n, "macro calls nested too deeply");
        return NULL;
    }
    frame mf = {nl_jv_dict(), R->root};
    nl_jv *res = NULL;
    if (!mf.vars) goto done;
    if (a->n_pos > m->n_names) {
        nl_jinja_rerr(R, n, "macro '%s' takes %d arguments, %d given", m->name, m->n_names, a->n_pos);
        goto done;
    }
    for (int i = 0; i < m->n_names; i++) {
        nl_jv *v = arg(a, i, m->names[i]);
        if (v) v = nl_jv_ref(v);
        else if (m->kids[i]) v = nl_jinja_eval(R, &mf, m->kids[i]);
        else v = nl_jv_undef(m->names[i]);
        if (!v || nl_jinja_frame_set(&mf, m->names[i], v)) goto done;
    }
    for (int k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (int i = 0; i < m->n_names; i++) known |= !strcmp(m->names[i], a->kw_name[k]);
        if (!known) {
            nl_jinja_rerr(R, n, "macro '%s' has no parameter '%s'", m->name, a->kw_name[k]);
            goto done;
        }
    }
    buf out = {0};
    if (nl_jinja_exec_body(R, &mf, m->b, &out)) {
        nl_jbuf_free(&out);
        goto done;
    }
    res = nl_jbuf_take(&out);
done:
    nl_jv_unref(mf.vars);
    R->depth--;
    return res;
}

/* select/reject/selectattr/rejectattr/map over a sequence. */
static nl_jv *filter_seq(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
    nl_jv *items = nl_jinja_as_list(R, n, v);
    if (!items) return NULL;
    nl_jv *out = nl_jv_list();
    if (!out) goto fail;
    bool attr = id == F_SELECTATTR || id == F_REJECTATTR || id == F_MAP;
    nl_jv *attrname = attr ? arg(a, 0, "attribute") : NULL;
    if (id == F_MAP && !attrname) {
        nl_jinja_rerr(R, n, "map: only map(attribute=NAME) and map('filter') are supported");
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
        map_fid = nl_jinja_find_name(nl_jinja_filter_names, F_N, a->pos[0]->u.s.s, a->pos[0]->u.s.n);
        if (map_fid != F_STRING && map_fid != F_TRIM && map_fid != F_LOWER && map_fid != F_UPPER &&
            map_fid != F_LENGTH && map_fid != F_INT && map_fid != F_FLOAT && map_fid != F_TOJSON) {
            nl_jinja_rerr(R, n, "map: filter '%s' is not supported there", a->pos[0]->u.s.s);
            goto fail;
        }
    }
    if (tname) {
        if (need_str(R, n, tname, "the test name")) goto fail;
        ti = nl_jinja_find_name(nl_jinja_test_names, TS_N, tname->u.s.s, tname->u.s.n);
        if (ti < 0) {
            nl_jinja_rerr(R, n, "test '%s' is not supported", tname->u.s.s);
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
            tmp = nl_jinja_get_item(R, n, it, attrname);
            if (!tmp) goto fail;
            subj = tmp;
        }
        if (id == F_MAP) {
            nl_jv *mv;
            if (map_filter) {
                if (map_fid == F_STRING) mv = nl_jinja_str_of(it);
                else if (map_fid == F_TRIM) mv = it->type == V_STR ? nl_jinja_strip(it, 3, NULL) : nl_jinja_str_of(it);
                else if (map_fid == F_LOWER || map_fid == F_UPPER)
                    mv = it->type == V_STR ? case_map(it, map_fid == F_UPPER ? 1 : 2) : nl_jinja_str_of(it);
                else if (map_fid == F_LENGTH)
                    mv = nl_jv_int(it->type == V_STR    ? (int64_t)it->u.s.n
                                   : it->type == V_LIST ? (int64_t)it->u.l.n
                                                        : (int64_t)it->u.d.n);
                else {
                    buf b = {0};
                    if (nl_jinja_to_json(&b, it, -1, 0, false, R, n)) {
                        nl_jbuf_free(&b);
                        goto fail;
                    }
                    mv = nl_jbuf_take(&b);
                }
            } else {
                mv = nl_jv_ref(subj);
                if (mv->type == V_UNDEF) {
                    nl_jv *d = arg(a, -1, "default");
                    if (d) {
                        nl_jv_unref(mv);
                        mv = nl_jv_ref(d);
                    }
                }
            }
            nl_jv_unref(tmp);
            if (nl_jv_push(out, mv)) goto fail;
            continue;
        }
        bool keep;
        if (ti >= 0) {
            nl_jv *r = nl_jinja_apply_test(R, f, n, ti, subj, &targs);
            if (!r) {
                nl_jv_unref(tmp);
                goto fail;
            }
            keep = nl_jinja_truthy(r);
            nl_jv_unref(r);
        } else {
            keep = nl_jinja_truthy(subj);
        }
        nl_jv_unref(tmp);
        if (id == F_REJECT || id == F_REJECTATTR) keep = !keep;
        if (keep && nl_jv_push(out, nl_jv_ref(it))) goto fail;
    }
    nl_jv_unref(items);
    return out;
fail:
    nl_jv_unref(items);
    nl_jv_unref(out);
    return NULL;
}

/* One filter applied. Long (~160 lines): one short case per built-in filter, in one switch on its
 * id, so the list of filters the engine knows is in one place. */
nl_jv *nl_jinja_apply_filter(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
    switch (id) {
    case F_TRIM: {
        nl_jv *s = nl_jinja_str_of(v);
        if (!s) return NULL;
        nl_jv *c = arg(a, 0, "chars");
        nl_jv *r = nl_jinja_strip(s, 3, c && c->type == V_STR ? c : NULL);
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
        case V_DICT:
        case V_NS: return nl_jv_int((int64_t)v->u.d.n);
        case V_UNDEF: return nl_jv_int(0);
        default: nl_jinja_rerr(R, n, "length: a value of type %s has no length", nl_jinja_type_name(v)); return NULL;
        }
    case F_TOJSON: {
        nl_jv *ind = arg(a, 0, "indent"), *sk = arg(a, -1, "sort_keys");
        int indent = ind && ind->type != V_NONE ? (int)nl_jinja_num_i(ind) : -1;
        if (indent > 64) indent = 64;
        buf b = {0};
        if (nl_jinja_to_json(&b, v, indent, 0, sk && nl_jinja_truthy(sk), R, n)) {
            nl_jbuf_free(&b);
            return NULL;
        }
        return nl_jbuf_take(&b);
    }
    case F_ITEMS:
        if (v->type == V_UNDEF) return nl_jv_list();
        if (v->type != V_DICT && v->type != V_NS) {
            nl_jinja_rerr(R, n, "items: a value of type %s is not a mapping", nl_jinja_type_name(v));
            return NULL;
        }
        return call_method(R, n, v, "items", a);
    case F_STRING: return nl_jinja_str_of(v);
    case F_SAFE: return nl_jv_ref(v);
    case F_JOIN: {
        nl_jv *items = nl_jinja_as_list(R, n, v);
        if (!items) return NULL;
        nl_jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        buf b = {0};
        int rc = 0;
        for (size_t i = 0; i < items->u.l.n && !rc; i++) {
            if (i && sep) rc = nl_jinja_to_str(&b, sep);
            nl_jv *it = items->u.l.v[i], *tmp = NULL;
            if (attr && !rc) {
                tmp = nl_jinja_get_item(R, n, it, attr);
                if (!tmp) rc = -1;
                it = tmp;
            }
            if (!rc) rc = nl_jinja_to_str(&b, it);
            nl_jv_unref(tmp);
        }
        nl_jv_unref(items);
        if (rc) {
            nl_jbuf_free(&b);
            return NULL;
        }
        return nl_jbuf_take(&b);
    }
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
    case F_MAP: return filter_seq(R, f, n, id, v, a);
    case F_FIRST:
    case F_LAST: {
        nl_jv *items = nl_jinja_as_list(R, n, v);
        if (!items) return NULL;
        nl_jv *r = items->u.l.n ? nl_jv_ref(items->u.l.v[id == F_FIRST ? 0 : items->u.l.n - 1])
                                : nl_jv_undef("first/last of an empty sequence");
        nl_jv_unref(items);
        return r;
    }
    case F_LIST: return nl_jinja_as_list(R, n, v);
    case F_REVERSE: {
        if (v->type == V_STR) {
            nl_jv *parts[3] = {NULL, NULL, NULL};
            nl_jv *m1 = nl_jv_int(-1);
            parts[2] = m1;
            nl_jv *r = m1 ? nl_jinja_slice(R, n, v, parts) : NULL;
            nl_jv_unref(m1);
            return r;
        }
        nl_jv *items = nl_jinja_as_list(R, n, v);
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
        bool use = v->type == V_UNDEF || (b && nl_jinja_truthy(b) && !nl_jinja_truthy(v));
        if (use) return d ? nl_jv_ref(d) : nl_jv_cstr("");
        return nl_jv_ref(v);
    }
    case F_UPPER:
    case F_LOWER:
    case F_CAPITALIZE:
    case F_TITLE: {
        nl_jv *s = nl_jinja_str_of(v);
        if (!s) return NULL;
        nl_jv *r = call_method(R, n, s,
                               id == F_UPPER   ? "upper"
                               : id == F_LOWER ? "lower"
                               : id == F_TITLE ? "title"
                                               : "capitalize",
                               a);
        nl_jv_unref(s);
        return r;
    }
    case F_REPLACE: {
        nl_jv *s = nl_jinja_str_of(v);
        if (!s) return NULL;
        nl_jv *c = arg(a, 2, "count");
        nl_jv *r = replace_str(R, n, s, arg(a, 0, "old"), arg(a, 1, "new"), c ? nl_jinja_num_i(c) : -1);
        nl_jv_unref(s);
        return r;
    }
    case F_INT:
        if (nl_jinja_is_num(v)) return nl_jv_int(nl_jinja_num_i(v));
        if (v->type == V_STR) return nl_jv_int(strtoll(v->u.s.s, NULL, 10));
        return nl_jv_int(0);
    case F_FLOAT:
        if (nl_jinja_is_num(v)) return nl_jv_float(nl_jinja_num_f(v));
        if (v->type == V_STR) return nl_jv_float(strtod(v->u.s.s, NULL));
        return nl_jv_float(0);
    case F_ABS:
        if (v->type == V_FLOAT) return nl_jv_float(fabs(v->u.f));
        if (nl_jinja_is_num(v)) return nl_jv_int(nl_jinja_num_i(v) < 0 ? -nl_jinja_num_i(v) : nl_jinja_num_i(v));
        nl_jinja_rerr(R, n, "abs: a value of type %s is not a number", nl_jinja_type_name(v));
        return NULL;
    case F_INDENT: {
        nl_jv *s = nl_jinja_str_of(v);
        if (!s) return NULL;
        nl_jv *w = arg(a, 0, "width"), *fst = arg(a, 1, "first"), *bl = arg(a, 2, "blank");
        int64_t width = w ? nl_jinja_num_i(w) : 4;
        buf pad = {0}, b = {0};
        int rc = 0;
        for (int64_t i = 0; i < width && !rc; i++) rc = nl_jbuf_str(&pad, " ");
        size_t st = 0;
        bool first_line = true;
        for (size_t i = 0; i <= s->u.s.n && !rc; i++) {
            if (i < s->u.s.n && s->u.s.s[i] != '\n') continue;
            bool blank = i == st;
            if ((first_line ? fst && nl_jinja_truthy(fst) : true) && (!blank || (bl && nl_jinja_truthy(bl))) && pad.n)
                rc = nl_jbuf_add(&b, pad.s, pad.n, NULL, 0);
            if (!rc)
                rc =
                    nl_jbuf_add(&b, s->u.s.s + st, i - st + (i < s->u.s.n), s->u.s.taint ? s->u.s.taint + st : NULL, 0);
            st = i + 1;
            first_line = false;
        }
        nl_jbuf_free(&pad);
        nl_jv_unref(s);
        if (rc) {
            nl_jbuf_free(&b);
            return NULL;
        }
        return nl_jbuf_take(&b);
    }
    default: nl_jinja_rerr(R, n, "filter '%s' is not supported", nl_jinja_filter_names[id]); return NULL;
    }
}

nl_jv *nl_jinja_apply_test(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a) {
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
    case TS_NUMBER: r = nl_jinja_is_num(v); break;
    case TS_INTEGER: r = v->type == V_INT; break;
    case TS_FLOAT: r = v->type == V_FLOAT; break;
    case TS_BOOLEAN: r = v->type == V_BOOL; break;
    case TS_TRUE: r = v->type == V_BOOL && v->u.b; break;
    case TS_FALSE: r = v->type == V_BOOL && !v->u.b; break;
    case TS_EQUALTO:
    case TS_EQ:
    case TS_EQEQ:
    case TS_NE:
    case TS_SAMEAS:
    case TS_GT:
    case TS_LT:
    case TS_GE:
    case TS_LE:
    case TS_IN:
    case TS_DIVISIBLEBY:
        if (!x) {
            nl_jinja_rerr(R, n, "test '%s' needs an argument", nl_jinja_test_names[id]);
            return NULL;
        }
        if (id == TS_SAMEAS) {
            r = v->type == x->type &&
                ((v->type == V_NONE || v->type == V_UNDEF) || (v->type == V_BOOL && v->u.b == x->u.b) || v == x);
        } else if (id == TS_IN) {
            nl_jv *b = nl_jinja_binop(R, n, OP_IN, v, x);
            if (!b) return NULL;
            r = b->u.b;
            nl_jv_unref(b);
        } else if (id == TS_DIVISIBLEBY) {
            if (!nl_jinja_is_num(v) || !nl_jinja_is_num(x) || nl_jinja_num_i(x) == 0) {
                nl_jinja_rerr(R, n, "divisibleby needs non-zero numbers");
                return NULL;
            }
            r = nl_jinja_num_i(v) % nl_jinja_num_i(x) == 0;
        } else {
            int op = id == TS_NE   ? OP_NE
                     : id == TS_GT ? OP_GT
                     : id == TS_LT ? OP_LT
                     : id == TS_GE ? OP_GE
                     : id == TS_LE ? OP_LE
                                   : OP_EQ;
            nl_jv *b = nl_jinja_binop(R, n, op, v, x);
            if (!b) return NULL;
            r = b->u.b;
            nl_jv_unref(b);
        }
        break;
    case TS_ODD:
    case TS_EVEN:
        if (!nl_jinja_is_num(v)) {
            nl_jinja_rerr(R, n, "test '%s' needs a number", nl_jinja_test_names[id]);
            return NULL;
        }
        r = (nl_jinja_num_i(v) % 2 != 0) == (id == TS_ODD);
        break;
    case TS_CALLABLE: r = v->type == V_MACRO || v->type == V_FUNC || v->type == V_METHOD; break;
    case TS_LOWER:
    case TS_UPPER: {
        r = v->type == V_STR;
        bool any = false;
        for (size_t i = 0; r && i < v->u.s.n; i++) {
            char c = v->u.s.s[i];
            if (c >= 'a' && c <= 'z') {
                any = true;
                if (id == TS_UPPER) r = false;
            }
            if (c >= 'A' && c <= 'Z') {
                any = true;
                if (id == TS_LOWER) r = false;
            }
        }
        r = r && any;
        break;
    }
    default: nl_jinja_rerr(R, n, "test %d is not supported", id); return NULL;
    }
    return nl_jv_bool(r);
}

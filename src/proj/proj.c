/* proj/: the projection service (docs/design.md §2): weight registration with the precision
 * policy, the one-in-flight request queue and its dispatcher thread, token buckets, the FP16
 * wire (row scaling, retries, fallback) and the counters. Backends only ever see one chunk of
 * rows at a time. The planner lives in planner.c, the reference backend in ref.c. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "model/quant.h"
#include "proj/proj_impl.h"
#include "proj/vulkan.h"
#include "util/util.h"

/* ---------------------------------------------------------------------------------------- */
/* Backends, found by name. New backends add a row.                                          */

static const nl_proj_backend *const backends[] = {
    &nl_proj_backend_ref,
    &nl_proj_backend_host,
#if defined(NL_HAVE_VULKAN)
    &nl_proj_backend_vulkan,
#endif
    NULL,
};

const nl_proj_backend *nl_proj_backend_find(const char *name) {
    if (!name) name = "ref";
    for (int i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Precision policy                                                                          */

/* The class names are the one list of model/model.c (nl_proj_class_name). */
static int class_from_name(const char *s, size_t n) {
    for (int c = 0; c < NL_CLASS_COUNT; c++) {
        const char *name = nl_proj_class_name((nl_proj_class)c);
        if (strlen(name) == n && strncmp(name, s, n) == 0) return c;
    }
    return -1;
}

/* A type the service can convert a weight to: one with a quantizer. */
static int parse_target(const char *s, size_t n, int *type) {
    char buf[16];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (strcmp(buf, "keep") == 0) {
        *type = -1;
        return 0;
    }
    int t = nl_type_from_name(buf);
    const nl_type_traits *tt = nl_type_get(t);
    if (!tt || !tt->from_float) return -1;
    *type = t;
    return 0;
}

/* '*' matches any run (also empty), '?' one character. */
static int glob_match(const char *g, const char *s) {
    for (; *g; g++, s++) {
        if (*g == '*') {
            while (g[1] == '*') g++;
            if (!g[1]) return 1;
            for (; *s; s++)
                if (glob_match(g + 1, s)) return 1;
            return 0;
        }
        if (!*s || (*g != '?' && *g != *s)) return 0;
    }
    return *s == 0;
}

static int parse_precision_map(nl_proj_service *s, const char *map) {
    const char *p = map;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (a < b) {
            const char *eq = memchr(a, '=', (size_t)(b - a));
            if (!eq || eq == a)
                return nl_err("precision map: \"%.*s\": expected class=type or pattern=type", (int)(b - a), a);
            const char *k1 = eq;
            while (k1 > a && (k1[-1] == ' ' || k1[-1] == '\t')) k1--;
            const char *v0 = eq + 1;
            while (v0 < b && (*v0 == ' ' || *v0 == '\t')) v0++;
            nl_proj_rule r = {0};
            if (parse_target(v0, (size_t)(b - v0), &r.type))
                return nl_err("precision map: \"%.*s\": unknown type \"%.*s\" (expected f32, f16, bf16, q8_0, q4_0, "
                              "q4_1 or keep)",
                              (int)(b - a), a, (int)(b - v0), v0);
            r.cls = class_from_name(a, (size_t)(k1 - a));
            if (r.cls < 0) {
                r.kind = 1;
                r.glob = nl_strndup(a, (size_t)(k1 - a));
                if (!r.glob) return -1;
            }
            nl_proj_rule *nr = realloc(s->rules, sizeof *nr * (size_t)(s->n_rules + 1));
            if (!nr) {
                free(r.glob);
                return nl_err("precision map: out of memory");
            }
            s->rules = nr;
            s->rules[s->n_rules++] = r;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int is_float_type(int t) { return t == NL_TYPE_F32 || t == NL_TYPE_F16 || t == NL_TYPE_BF16; }

int nl_proj_feasible_type(int gguf_type, int64_t n_in, int target) {
    if (target < 0 || target == gguf_type) return gguf_type;
    if (!is_float_type(gguf_type) && target != NL_TYPE_F32) return gguf_type; /* never re-quantize */
    const nl_type_traits *tr = nl_type_get(target);
    if (!tr || n_in % tr->blck) return gguf_type;
    return target;
}

int nl_proj_default_threads(void) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    return ncpu > 8 ? 8 : ncpu > 0 ? (int)ncpu : 1;
}

void nl_proj_config_defaults(nl_proj_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = "host";
    cfg->n_threads = nl_proj_default_threads();
}

int nl_proj_format_precision(const nl_proj_service *s, char *buf, size_t cap) {
    const char *rules = s->n_rules ? ", then the precision map" : "";
    if (s->keep_all) return snprintf(buf, cap, "keep (every weight in its GGUF type%s)", rules);
    if (s->precision >= 0)
        return snprintf(buf, cap,
                        "%s (every projection widened or narrowed to %s where feasible; embed and "
                        "quantized GGUF tensors as stored%s)",
                        nl_type_name(s->precision), nl_type_name(s->precision), rules);
    return snprintf(buf, cap,
                    "auto (attn, mlp, head -> q8_0, recurrent -> f16; embed and quantized GGUF "
                    "tensors as stored%s)",
                    rules);
}

/* The type the policy asks for (-1 = keep), before feasibility. */
static int policy_target(const nl_proj_service *s, const nl_proj_weight *w) {
    int tgt;
    if (w->cls == NL_CLASS_EMBED || s->keep_all) tgt = -1;
    else if (s->precision >= 0) tgt = s->precision;
    else tgt = w->cls == NL_CLASS_RECURRENT ? NL_TYPE_F16 : NL_TYPE_Q8_0;
    for (int i = 0; i < s->n_rules; i++)
        if (s->rules[i].kind == 0 && s->rules[i].cls == w->cls) tgt = s->rules[i].type;
    for (int i = 0; i < s->n_rules; i++)
        if (s->rules[i].kind == 1 && w->name && glob_match(s->rules[i].glob, w->name)) tgt = s->rules[i].type;
    return tgt;
}

/* Convert n_out rows of K elements from w->type to `type`; 1 = F16 would overflow (keep). */
static int convert(const nl_proj_weight *w, int type, void *dst) {
    const nl_type_traits *from = nl_type_get(w->type), *to = nl_type_get(type);
    size_t in_bytes = nl_row_bytes(w->type, w->n_in), out_bytes = nl_row_bytes(type, w->n_in);
    float *row = nl_malloc(sizeof(float) * (size_t)w->n_in);
    if (!row) return -1;
    for (int64_t n = 0; n < w->n_out; n++) {
        from->to_float((const uint8_t *)w->data + (size_t)n * in_bytes, row, w->n_in);
        if (type == NL_TYPE_F16)
            for (int64_t k = 0; k < w->n_in; k++)
                if (isfinite(row[k]) && fabsf(row[k]) > 65504.0f) {
                    free(row);
                    return 1;
                }
        to->from_float(row, (uint8_t *)dst + (size_t)n * out_bytes, w->n_in);
    }
    free(row);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The dispatcher thread                                                                     */

static void *dispatcher(void *arg) {
    nl_proj_service *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && !s->have_req) {
            /* requests of a step follow each other within microseconds: spin briefly first */
            pthread_mutex_unlock(&s->mu);
            const int got = nl_spin_wait(&s->have_req, 1, 1, NL_SPIN_S);
            pthread_mutex_lock(&s->mu);
            if (!got && !s->quit && !s->have_req) pthread_cond_wait(&s->cv_req, &s->mu);
        }
        if (s->quit) break;
        int id = s->req.id, T = s->req.T;
        nl_dir dir = s->req.dir;
        const float *x = s->req.x;
        float *y = s->req.y;
        pthread_mutex_unlock(&s->mu);

        memset(&s->wst, 0, sizeof s->wst);
        double t0 = nl_now();
        int rc = nl_proj_exec(s, id, dir, x, T, y);
        double dt = nl_now() - t0;

        pthread_mutex_lock(&s->mu);
        s->stats.retries += s->wst.retries;
        s->stats.fallbacks += s->wst.fallbacks;
        s->stats.routed_tokens += s->wst.routed_tokens;
        s->stats.padded_tokens += s->wst.padded_tokens;
        if (rc) snprintf(s->req_err, sizeof s->req_err, "%s", nl_last_error());
        s->stats.requests[dir]++;
        s->stats.tokens[dir] += (uint64_t)T;
        s->stats.busy_s[dir] += dt;
        if (id >= 0 && id < s->n) {
            nl_proj_entry_stats *es = &s->e[id].st[dir == NL_BWD];
            es->requests++;
            es->tokens += (uint64_t)T;
            es->busy_s += dt;
        }
        {
            const nl_proj_weight *pw = nl_proj_get(s, id);
            if (pw) s->stats.flops[dir] += 2.0 * (double)T * (double)pw->n_in * (double)pw->n_out;
        }
        s->req_rc = rc;
        s->have_req = 0;
        __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Service lifetime and registration                                                         */

nl_proj_service *nl_proj_service_new(const nl_proj_config *cfg) {
    nl_proj_config def = {0};
    if (!cfg) cfg = &def;
    const nl_proj_backend *be = cfg->backend_impl ? cfg->backend_impl : nl_proj_backend_find(cfg->backend);
    if (!be) {
        char known[128] = "";
        for (int i = 0; backends[i]; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), " %s", backends[i]->name);
        nl_err("proj: unknown backend \"%s\" (known:%s)", cfg->backend, known);
        return NULL;
    }
    nl_proj_service *s = nl_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    s->cfg.backend = be->name;
    s->cfg.precision = NULL; /* borrowed strings are parsed now, not kept */
    s->cfg.precision_map = NULL;
    s->cfg.compute = NULL;
    s->cfg.device = NULL;
    s->n_threads = cfg->n_threads > 0 ? cfg->n_threads : 1;
    s->be = be;
    s->precision = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_req, NULL);
    pthread_cond_init(&s->cv_done, NULL);

    if (cfg->precision && strcmp(cfg->precision, "auto") != 0) {
        int t;
        if (parse_target(cfg->precision, strlen(cfg->precision), &t)) {
            nl_err("proj: unknown precision \"%s\" (expected auto, keep, f32, f16, bf16, q8_0, q4_0 or q4_1)",
                   cfg->precision);
            goto fail;
        }
        s->precision = t;
        s->keep_all = t < 0;
    }
    if (cfg->precision_map && parse_precision_map(s, cfg->precision_map)) goto fail;

    if (cfg->device && !be->init_device) {
        nl_err("proj: backend %s has no devices to choose from (device \"%s\")", be->name, cfg->device);
        goto fail;
    }
    if (be->init_device ? be->init_device(&s->be_ctx, s->n_threads, cfg->compute, cfg->device)
                        : be->init(&s->be_ctx, s->n_threads, cfg->compute)) {
        nl_err_prefix("proj: backend %s", be->name);
        goto fail;
    }
    if (cfg->wire_f16 && be->wire_f16) be->wire_f16(s->be_ctx);
    if (be == &nl_proj_backend_ref) s->ref_ctx = s->be_ctx;
    else if (nl_proj_backend_ref.init(&s->ref_ctx, s->n_threads, NULL)) goto fail;

    int te = nl_thread_create(&s->thread, dispatcher, s);
    if (te != 0) {
        nl_err("proj: cannot start the service thread: %s", strerror(te));
        goto fail;
    }
    s->thread_ok = 1;
    return s;
fail:
    nl_proj_service_free(s);
    return NULL;
}

void nl_proj_service_free(nl_proj_service *s) {
    if (!s) return;
    if (s->thread_ok) {
        pthread_mutex_lock(&s->mu);
        while (s->have_req) pthread_cond_wait(&s->cv_done, &s->mu); /* let a request finish */
        s->quit = 1;
        pthread_cond_broadcast(&s->cv_req);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->be && s->be_ctx) s->be->free(s->be_ctx);
    if (s->ref_ctx && s->ref_ctx != s->be_ctx) nl_proj_backend_ref.free(s->ref_ctx);
    for (int i = 0; i < s->n; i++) {
        free(s->e[i].name);
        free(s->e[i].owned);
        free(s->e[i].route);
    }
    free(s->e);
    for (int i = 0; i < s->n_rules; i++) free(s->rules[i].glob);
    free(s->rules);
    free(s->buckets);
    free(s->checks);
    free(s->xbuf);
    free(s->ybuf);
    free(s->wx);
    free(s->wy);
    free(s->shift);
    free(s->rowi);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_req);
    pthread_cond_destroy(&s->cv_done);
    free(s);
}

int nl_proj_add(nl_proj_service *s, const nl_proj_weight *w) {
    const char *nm = w && w->name ? w->name : "(unnamed)";
    if (!w || !w->data) return nl_err("proj: %s: no data", nm);
    const nl_type_traits *tt = nl_type_get(w->type);
    if (!tt || !tt->to_float) return nl_err("proj: %s: tensor type %s is not supported", nm, nl_type_name(w->type));
    if (w->n_in <= 0 || w->n_out <= 0 || w->n_in > INT32_MAX || w->n_out > INT32_MAX)
        return nl_err("proj: %s: bad shape K=%lld N=%lld", nm, (long long)w->n_in, (long long)w->n_out);
    if (w->n_in % tt->blck)
        return nl_err("proj: %s: K=%lld is not a multiple of the %s block size %d", nm, (long long)w->n_in, tt->name,
                      tt->blck);
    if (w->cls < 0 || w->cls >= NL_CLASS_COUNT) return nl_err("proj: %s: bad class %d", nm, w->cls);
    pthread_mutex_lock(&s->mu);
    int busy = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    if (busy) return nl_err("proj: %s: cannot add a weight while a request is in flight", nm);
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        nl_proj_entry *ne = realloc(s->e, sizeof *ne * (size_t)cap);
        if (!ne) return nl_err("proj: out of memory");
        s->e = ne;
        s->cap = cap;
    }
    nl_proj_entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    e->name = nl_strdup(nm);
    if (!e->name) return -1;
    e->orig = *w;
    e->orig.name = e->name;
    e->res = e->orig;

    int tgt = nl_proj_feasible_type(w->type, w->n_in, policy_target(s, w));

    if (tgt != w->type) {
        /* the same source converted to the same type before (tied head/embedding): share */
        for (int i = 0; i < s->n; i++) {
            nl_proj_entry *o = &s->e[i];
            if (o->orig.data == w->data && o->orig.type == w->type && o->orig.n_in == w->n_in &&
                o->orig.n_out == w->n_out && o->res.type == tgt) {
                e->res.type = tgt;
                e->res.data = o->res.data;
                break;
            }
        }
        if (e->res.data == w->data) {
            size_t bytes = nl_row_bytes(tgt, w->n_in) * (size_t)w->n_out;
            e->owned = nl_malloc(bytes);
            if (!e->owned) {
                free(e->name);
                return nl_err_prefix("proj: %s", nm);
            }
            int rc = convert(w, tgt, e->owned);
            if (rc < 0) {
                free(e->owned);
                free(e->name);
                return -1;
            }
            if (rc == 1) { /* F16 would overflow: keep the GGUF bytes */
                free(e->owned);
                e->owned = NULL;
            } else {
                e->res.type = tgt;
                e->res.data = e->owned;
            }
        }
    }
    e->res_bytes = nl_row_bytes(e->res.type, w->n_in) * (uint64_t)w->n_out;
    for (int i = 0; i < s->n; i++)
        if (s->e[i].res.data == e->res.data) e->shares = 1;
    if (s->buckets) {
        /* added after planning: not validated, every bucket goes to ref */
        e->route = nl_calloc(2 * (size_t)s->n_buckets, 1);
        if (!e->route) {
            free(e->owned);
            free(e->name);
            return -1;
        }
    }
    return s->n++;
}

int nl_proj_count(const nl_proj_service *s) { return s->n; }

int nl_proj_threads(const nl_proj_service *s) { return s->n_threads; }

const char *nl_proj_backend_name(const nl_proj_service *s) { return s->be->name; }

int nl_proj_backend_on_cpu(const char *name) { return name && (!strcmp(name, "host") || !strcmp(name, "ref")); }

const char *nl_proj_compute(const nl_proj_service *s) {
    return s && s->be->compute ? s->be->compute(s->be_ctx) : "f32";
}

int nl_proj_compute_known(const char *mode) {
    if (!mode || !strcmp(mode, "auto")) return 0;
    char list[256] = "auto";
    size_t n = strlen(list);
    for (int b = 0; backends[b]; b++) {
        static const char *const f32_only[] = {"f32", NULL};
        const char *const *m = backends[b]->computes ? backends[b]->computes : f32_only;
        for (int i = 0; m[i]; i++) {
            if (!strcmp(mode, m[i])) return 0;
            char pat[40];
            snprintf(pat, sizeof pat, ", %s,", m[i]);
            char have[260];
            snprintf(have, sizeof have, ", %s,", list);
            if (!strstr(have, pat) && n + strlen(m[i]) + 3 < sizeof list)
                n += (size_t)snprintf(list + n, sizeof list - n, ", %s", m[i]);
        }
    }
    return nl_err("unknown compute mode '%s' (expected %s)", mode, list);
}

const struct nl_amx_tiles *nl_proj_node_tiles(const nl_proj_service *s) {
    const struct nl_amx_tiles *t = NULL;
    int bf16 = 0;
    if (s && s->be->nodes) s->be->nodes(s->be_ctx, &t, &bf16);
    return t;
}

int nl_proj_node_bf16(const nl_proj_service *s) {
    const struct nl_amx_tiles *t = NULL;
    int bf16 = 0;
    if (s && s->be->nodes) s->be->nodes(s->be_ctx, &t, &bf16);
    return bf16;
}

int nl_proj_describe(const nl_proj_service *s, char *buf, size_t cap) {
    char d[256] = "";
    if (s->be->describe) s->be->describe(s->be_ctx, d, sizeof d);
    return snprintf(buf, cap, "%s%s%s", s->be->name, d[0] ? ": " : "", d);
}

const nl_proj_weight *nl_proj_get(const nl_proj_service *s, int id) {
    if (id < 0 || id >= s->n) return NULL;
    return &s->e[id].res;
}

/* ---------------------------------------------------------------------------------------- */
/* Execution: buckets, routes, the FP16 wire                                                 */

static int grow(void **p, size_t *have, size_t need, size_t elem) {
    if (*have >= need) return 0;
    void *q = realloc(*p, need * elem);
    if (!q) return nl_err("proj: out of memory (%zu bytes)", need * elem);
    *p = q;
    *have = need;
    return 0;
}

int nl_proj_exec_ref(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int T, float *y) {
    return nl_proj_backend_ref.run(s->ref_ctx, &e->orig, dir, x, T, y);
}

/* rows -> bucket rows (zero padded), backend, first `rows` rows back. bucket 0: any T (an
 * any_T backend's whole request), no padding. */
static int run_padded(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int rows, int bucket,
                      float *y) {
    if (rows == bucket || bucket == 0) return s->be->run(s->be_ctx, &e->res, dir, x, rows, y);
    const size_t n_in = (size_t)(dir == NL_FWD ? e->res.n_in : e->res.n_out);
    const size_t n_out = (size_t)(dir == NL_FWD ? e->res.n_out : e->res.n_in);
    if (grow((void **)&s->xbuf, &s->xbuf_n, (size_t)bucket * n_in, sizeof(float)) ||
        grow((void **)&s->ybuf, &s->ybuf_n, (size_t)bucket * n_out, sizeof(float)))
        return -1;
    memcpy(s->xbuf, x, sizeof(float) * (size_t)rows * n_in);
    memset(s->xbuf + (size_t)rows * n_in, 0, sizeof(float) * (size_t)(bucket - rows) * n_in);
    if (s->be->run(s->be_ctx, &e->res, dir, s->xbuf, bucket, s->ybuf)) return -1;
    memcpy(y, s->ybuf, sizeof(float) * (size_t)rows * n_out);
    s->wst.padded_tokens += (uint64_t)(bucket - rows);
    return 0;
}

static float f16_round(float v) { return nl_f16_to_f32(nl_f32_to_f16(v)); }

/* Scale exponent that brings max|row| into [2^11, 2^12). */
static int row_shift(const float *row, size_t n) {
    float m = 0.0f;
    for (size_t k = 0; k < n; k++) m = fmaxf(m, fabsf(row[k]));
    if (m == 0.0f || !isfinite(m)) return 0;
    int ex;
    frexpf(m, &ex); /* m = f * 2^ex, f in [0.5, 1) */
    return 12 - ex;
}

#define WIRE_LIMIT 60000.0f
#define WIRE_MAX_RETRIES 3

/* The FP16 wire (DESIGN §2): each row goes out as FP16 scaled by 2^shift (max|x| near 2^12);
 * the outputs come back as FP16 and are unscaled here in FP32. A row whose output is
 * non-finite or reaches 60000 is sent again with a further 2^-8, at most three times; then it
 * is computed by ref on the original weight. Retries run in the same bucket (zero padded), or
 * unpadded when bucket is 0 (any T). */
static int run_wire(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int rows, int bucket, float *y) {
    const size_t n_in = (size_t)(dir == NL_FWD ? e->res.n_in : e->res.n_out);
    const size_t n_out = (size_t)(dir == NL_FWD ? e->res.n_out : e->res.n_in);
    if (grow((void **)&s->wx, &s->wx_n, (size_t)rows * n_in, sizeof(float)) ||
        grow((void **)&s->wy, &s->wy_n, (size_t)rows * n_out, sizeof(float)) ||
        grow((void **)&s->shift, &s->shift_n, (size_t)rows, sizeof(int)) ||
        grow((void **)&s->rowi, &s->rowi_n, (size_t)rows, sizeof(int)))
        return -1;
    int n_pend = rows; /* rows still to send: s->rowi[0..n_pend) */
    for (int t = 0; t < rows; t++) {
        s->rowi[t] = t;
        s->shift[t] = row_shift(x + (size_t)t * n_in, n_in);
    }
    for (int attempt = 0; attempt <= WIRE_MAX_RETRIES && n_pend > 0; attempt++) {
        if (attempt > 0) s->wst.retries += (uint64_t)n_pend;
        /* pack the pending rows, scaled and rounded to FP16 */
        for (int i = 0; i < n_pend; i++) {
            const int t = s->rowi[i];
            const float *xr = x + (size_t)t * n_in;
            float *wr = s->wx + (size_t)i * n_in;
            for (size_t k = 0; k < n_in; k++) wr[k] = f16_round(ldexpf(xr[k], s->shift[t]));
        }
        if (run_padded(s, e, dir, s->wx, n_pend, bucket, s->wy)) return -1;
        int n_bad = 0;
        for (int i = 0; i < n_pend; i++) {
            const int t = s->rowi[i];
            const float *wr = s->wy + (size_t)i * n_out;
            float *yr = y + (size_t)t * n_out;
            int bad = 0;
            for (size_t k = 0; k < n_out; k++) {
                float h = f16_round(wr[k]);
                if (!isfinite(h) || fabsf(h) >= WIRE_LIMIT) {
                    bad = 1;
                    break;
                }
                yr[k] = ldexpf(h, -s->shift[t]);
            }
            if (bad) {
                s->shift[t] -= 8;
                s->rowi[n_bad++] = t; /* n_bad <= i: compaction in place is safe */
            }
        }
        n_pend = n_bad;
    }
    /* rows that never fit: the full float path */
    for (int i = 0; i < n_pend; i++) {
        const int t = s->rowi[i];
        if (nl_proj_exec_ref(s, e, dir, x + (size_t)t * n_in, 1, y + (size_t)t * n_out)) return -1;
        s->wst.fallbacks++;
    }
    return 0;
}

int nl_proj_exec_backend(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int rows, int bucket,
                         float *y) {
    if (s->cfg.wire_f16) return run_wire(s, e, dir, x, rows, bucket, y);
    return run_padded(s, e, dir, x, rows, bucket, y);
}

uint64_t nl_proj_scratch_bytes(const nl_proj_service *s, int T, int T_head) {
    uint64_t pad = 0, wire = 0, shared = 0, per_thread = 0;
    const int B = s->buckets && s->n_buckets > 0 ? s->buckets[s->n_buckets - 1] : 0;
    for (int i = 0; i < s->n; i++) {
        const nl_proj_entry *e = &s->e[i];
        if (e->res.cls == NL_CLASS_EMBED) continue;
        const int rows = e->res.cls == NL_CLASS_HEAD ? T_head : T;
        if (rows < 1) continue;
        for (int d = 0; d < 2; d++) {
            const nl_dir dir = d ? NL_BWD : NL_FWD;
            const uint64_t io = (uint64_t)(e->res.n_in + e->res.n_out) * sizeof(float);
            int whole = !s->buckets || (s->be->any_T && s->be->supports(s->be_ctx, &e->res, dir, rows));
            for (int b = 0; whole && s->buckets && b < s->n_buckets; b++)
                whole = e->route && e->route[d * s->n_buckets + b] == NL_ROUTE_BACKEND;
            /* split onto buckets: a chunk of at most the largest bucket, padded (xbuf, ybuf) */
            const int chunk = whole ? rows : (B > 0 && B < rows ? B : rows);
            if (!whole && B > 0 && (uint64_t)B * io > pad) pad = (uint64_t)B * io;
            if (s->cfg.wire_f16 && (uint64_t)chunk * (io + 2 * sizeof(int)) > wire)
                wire = (uint64_t)chunk * (io + 2 * sizeof(int));
            if (s->be->scratch) {
                uint64_t sh = 0, pt = 0;
                s->be->scratch(s->be_ctx, &e->res, dir, whole ? rows : (B > chunk ? B : chunk), &sh, &pt);
                if (sh > shared) shared = sh;
                if (pt > per_thread) per_thread = pt;
            }
        }
    }
    return pad + wire + shared + per_thread;
}

/* Splits T onto the validated buckets: whole largest buckets while they fit, then the
 * largest bucket <= the rest, and finally the smallest bucket >= the rest (zero padded).
 * On an any_T backend with every bucket of (id, dir) validated: one whole request. */
int nl_proj_exec(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y) {
    nl_proj_entry *e = &s->e[id];
    const size_t n_in = (size_t)(dir == NL_FWD ? e->res.n_in : e->res.n_out);
    const size_t n_out = (size_t)(dir == NL_FWD ? e->res.n_out : e->res.n_in);
    if (T == 0) return 0;
    if (!s->buckets) {
        if (!s->be->supports(s->be_ctx, &e->res, dir, T)) {
            s->wst.routed_tokens += (uint64_t)T;
            return nl_proj_exec_ref(s, e, dir, x, T, y);
        }
        return nl_proj_exec_backend(s, e, dir, x, T, T, y);
    }
    if (s->be->any_T && s->be->supports(s->be_ctx, &e->res, dir, T)) {
        int all = 1;
        for (int i = 0; i < s->n_buckets; i++) all &= e->route[dir * s->n_buckets + i] == NL_ROUTE_BACKEND;
        if (all) return nl_proj_exec_backend(s, e, dir, x, T, 0, y);
    }
    int t = 0;
    while (t < T) {
        const int rest = T - t;
        int bi = -1;
        for (int i = s->n_buckets - 1; i >= 0; i--)
            if (s->buckets[i] <= rest) {
                bi = i;
                break;
            }
        if (bi < 0) bi = 0; /* rest smaller than every bucket: the smallest, padded */
        const int bucket = s->buckets[bi];
        const int rows = rest < bucket ? rest : bucket;
        const float *xc = x + (size_t)t * n_in;
        float *yc = y + (size_t)t * n_out;
        int rc;
        if (e->route[dir * s->n_buckets + bi] == NL_ROUTE_BACKEND) {
            rc = nl_proj_exec_backend(s, e, dir, xc, rows, bucket, yc);
        } else {
            s->wst.routed_tokens += (uint64_t)rows;
            rc = nl_proj_exec_ref(s, e, dir, xc, rows, yc);
        }
        if (rc) return -1;
        t += rows;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The request API                                                                           */

int nl_proj_submit(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y) {
    if (id < 0 || id >= s->n) return nl_err("proj: submit: no projection %d (%d registered)", id, s->n);
    if (dir != NL_FWD && dir != NL_BWD) return nl_err("proj: submit: bad direction %d", (int)dir);
    if (T < 0 || (T > 0 && (!x || !y))) return nl_err("proj: submit %s: bad arguments (T=%d)", s->e[id].name, T);
    pthread_mutex_lock(&s->mu);
    if (s->in_flight) {
        pthread_mutex_unlock(&s->mu);
        if (s->cfg.strict) assert(!"nl_proj_submit: a request is already in flight");
        return nl_err("proj: submit %s: a request is already in flight (wait first)", s->e[id].name);
    }
    s->req.id = id;
    s->req.dir = dir;
    s->req.x = x;
    s->req.T = T;
    s->req.y = y;
    s->in_flight = 1;
    __atomic_store_n(&s->done, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&s->have_req, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->cv_req);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int nl_proj_wait(nl_proj_service *s) {
    pthread_mutex_lock(&s->mu);
    if (!s->in_flight) {
        pthread_mutex_unlock(&s->mu);
        return nl_err("proj: wait: no request in flight");
    }
    if (!s->done) {
        pthread_mutex_unlock(&s->mu);
        nl_spin_wait(&s->done, 1, 1, NL_SPIN_S);
        pthread_mutex_lock(&s->mu);
    }
    while (!s->done) pthread_cond_wait(&s->cv_done, &s->mu);
    s->in_flight = 0;
    int rc = s->req_rc;
    pthread_mutex_unlock(&s->mu);
    if (rc) return nl_err("%s", s->req_err);
    return 0;
}

int nl_proj_run(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y) {
    if (nl_proj_submit(s, id, dir, x, T, y)) return -1;
    return nl_proj_wait(s);
}

int nl_proj_get_rows(nl_proj_service *s, int id, const int32_t *rows, int n, float *out) {
    if (id < 0 || id >= s->n) return nl_err("proj: get_rows: no projection %d", id);
    const nl_proj_weight *w = &s->e[id].res;
    const nl_type_traits *tt = nl_type_get(w->type);
    const size_t rb = nl_row_bytes(w->type, w->n_in);
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= w->n_out)
            return nl_err("proj: get_rows %s: row %d out of range [0, %lld)", w->name, (int)rows[i],
                          (long long)w->n_out);
        tt->to_float((const uint8_t *)w->data + (size_t)rows[i] * rb, out + (size_t)i * w->n_in, w->n_in);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Counters and memory report                                                                */

void nl_proj_get_stats(const nl_proj_service *s, nl_proj_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
}

int nl_proj_get_entry_stats(const nl_proj_service *s, int id, nl_dir dir, nl_proj_entry_stats *out) {
    if (id < 0 || id >= s->n) return nl_err("proj: no weight with id %d", id);
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->e[id].st[dir == NL_BWD];
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    return 0;
}

uint64_t nl_proj_resident_bytes(const nl_proj_service *s, int cls, int type) {
    uint64_t b = 0;
    for (int i = 0; i < s->n; i++) {
        const nl_proj_entry *e = &s->e[i];
        if (e->shares) continue;
        if ((cls < 0 || e->res.cls == cls) && (type < 0 || e->res.type == type)) b += e->res_bytes;
    }
    return b;
}

uint64_t nl_proj_converted_bytes(const nl_proj_service *s) {
    uint64_t b = 0;
    for (int i = 0; i < s->n; i++)
        if (s->e[i].owned) b += s->e[i].res_bytes;
    return b;
}

static void fmt_bytes(char *buf, size_t cap, uint64_t b) {
    if (b >= 1000000000ull) snprintf(buf, cap, "%.2f GB", (double)b / 1e9);
    else if (b >= 1000000ull) snprintf(buf, cap, "%.2f MB", (double)b / 1e6);
    else if (b >= 1000ull) snprintf(buf, cap, "%.2f kB", (double)b / 1e3);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

int nl_proj_format_resident(const nl_proj_service *s, char *buf, size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (int c = 0; c < NL_CLASS_COUNT; c++) {
        int first = 1; /* "recurrent F16 2.02 GB, Q8_0 1.00 GB": the class is named once */
        for (int t = 0; t < NL_TYPE_COUNT; t++) {
            uint64_t b = nl_proj_resident_bytes(s, c, t);
            if (!b) continue;
            char up[16], sz[32];
            const char *nm = nl_type_name(t);
            size_t k = 0;
            for (; nm[k] && k + 1 < sizeof up; k++) up[k] = (char)(nm[k] >= 'a' && nm[k] <= 'z' ? nm[k] - 32 : nm[k]);
            up[k] = 0;
            fmt_bytes(sz, sizeof sz, b);
            int n = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%s%s%s %s", len ? ", " : "",
                             first ? nl_proj_class_name((nl_proj_class)c) : "", first ? " " : "", up, sz);
            first = 0;
            len += (size_t)n;
        }
    }
    return (int)len;
}

/* model/gguf: GGUF v3 reader and writer. Facts: docs/formats.md §1.
 *
 * Reader: every count, length, dimension and offset read from the file is checked against the
 * bytes that remain BEFORE it is used (allocation sizes included), with overflow-checked
 * arithmetic. Errors name the file label, the byte offset and what was expected.
 *
 * Writer: header, KVs, tensor infos, zero padding to the alignment, then each tensor blob
 * followed by zero padding to the alignment (the layout llama.cpp's gguf_write_out produces). */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/quant.h"
#include "os/io.h"
#include "util/hash.h"
#include "util/util.h"

/* ggml type layouts come from the one traits table (model/quant.c). */
int nl_gguf_type_info(int type, int *blck, size_t *blck_bytes) {
    const nl_type_traits *tt = nl_type_info(type);
    if (!tt || tt->blck == 0) return -1;
    if (blck) *blck = tt->blck;
    if (blck_bytes) *blck_bytes = tt->bytes;
    return 0;
}

/* The highest type id whose layout is known (for the error message). */
static int last_known_type(void) {
    int t = NL_TYPE_COUNT - 1;
    while (t > 0 && nl_gguf_type_info(t, NULL, NULL) != 0) t--;
    return t;
}

/* Bytes of a tensor of `type` with dims ne[4]; -1 with a short reason in *why on failure. */
static int tensor_nbytes(int type, const int64_t ne[NL_GGUF_MAX_DIMS], uint64_t *out, const char **why) {
    int blck;
    size_t bb;
    if (nl_gguf_type_info(type, &blck, &bb) != 0) {
        *why = "unknown ggml type";
        return -1;
    }
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++)
        if (ne[d] < 0) {
            *why = "negative dimension";
            return -1;
        }
    if (ne[0] % blck != 0) {
        *why = "ne0 is not a multiple of the block size";
        return -1;
    }
    /* The element count must fit int64 (ggml_nelements) and the byte size uint64. */
    uint64_t nel = 1, bytes;
    if (nl_mul_ok((uint64_t)(ne[0] / blck), bb, &bytes) != 0) {
        *why = "dims overflow";
        return -1;
    }
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++)
        if (nl_mul_ok(nel, (uint64_t)ne[d], &nel) != 0 || nel > (uint64_t)INT64_MAX) {
            *why = "dims overflow";
            return -1;
        }
    for (int d = 1; d < NL_GGUF_MAX_DIMS; d++)
        if (nl_mul_ok(bytes, (uint64_t)ne[d], &bytes) != 0 || bytes > (uint64_t)INT64_MAX) {
            *why = "dims overflow";
            return -1;
        }
    *out = bytes;
    return 0;
}

static uint64_t pad_to(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

static size_t vtype_size(int t) {
    switch (t) {
    case NL_GGUF_UINT8:
    case NL_GGUF_INT8:
    case NL_GGUF_BOOL: return 1;
    case NL_GGUF_UINT16:
    case NL_GGUF_INT16: return 2;
    case NL_GGUF_UINT32:
    case NL_GGUF_INT32:
    case NL_GGUF_FLOAT32: return 4;
    case NL_GGUF_UINT64:
    case NL_GGUF_INT64:
    case NL_GGUF_FLOAT64: return 8;
    default: return 0; /* STRING, ARRAY, unknown */
    }
}

const char *nl_gguf_vtype_name(int type) {
    static const char *names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                  "bool",  "string", "array",  "uint64", "int64",  "float64"};
    if (type < 0 || type > NL_GGUF_FLOAT64) return "unknown";
    return names[type];
}

/* ------------------------------------------------------------------------------------------
 * String hash set for duplicate detection and lookups: open addressing over indices. */
typedef struct {
    int64_t *slot; /* index+1, 0 = empty */
    uint64_t cap;  /* power of two */
} name_set;

static int set_init(name_set *s, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    s->slot = nl_calloc(cap, sizeof *s->slot);
    s->cap = cap;
    return s->slot ? 0 : -1;
}

/* Finds `name` among names[] via the set; returns its index or -1. If `insert_idx` >= 0 and
 * the name is absent, inserts it. */
static int64_t set_find(const name_set *s, char *const *names, const char *name, size_t len, int64_t insert_idx,
                        size_t stride) {
    if (!s->slot) return -1;
    uint64_t h = nl_fnv1a(name, len) & (s->cap - 1);
    for (;;) {
        int64_t v = s->slot[h];
        if (v == 0) {
            if (insert_idx >= 0) s->slot[h] = insert_idx + 1;
            return -1;
        }
        const char *other = *(char *const *)((const char *)names + (size_t)(v - 1) * stride);
        if (strlen(other) == len && memcmp(other, name, len) == 0) return v - 1;
        h = (h + 1) & (s->cap - 1);
    }
}

/* The handle with private lookup tables after the public part. */
typedef struct {
    nl_gguf pub;
    name_set kv_set, t_set;
    int fd;         /* the mapped file, kept open to notice it changing (-1: none) */
    struct stat st; /* its size and modification time at open */
    int watch;      /* its slot in the SIGBUS watch list (-1: none) */
} gguf_impl;

/* ---- a mapped file changing under the reader ----
 * Someone truncating (or rewriting) a model file while a run has it mapped turns every access
 * to the pages that went away into SIGBUS, which would kill an overnight run without a word.
 * Every mapping is registered here; a SIGBUS whose address lies in one is answered by laying
 * zero pages (an anonymous mapping) over the rest of it and marking it changed, so the access
 * completes and the run goes on to its next check: the owner asks nl_gguf_changed() before it
 * trusts a result (the trainer, before every commit) and stops there, naming the file. A
 * SIGBUS anywhere else gets the disposition there was before (the default: the process dies). */
#include <pthread.h>
#include <signal.h>
#define NL_WATCH_MAX 64
static struct {
    uintptr_t lo, hi;              /* [lo, hi): the mapping */
    volatile sig_atomic_t changed; /* set by the handler */
    int used;                      /* published with __atomic_store_n after lo/hi */
} watch[NL_WATCH_MAX];
static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction bus_prev;
static int bus_installed;
static uintptr_t page_size;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < NL_WATCH_MAX; i++) {
        if (!__atomic_load_n(&watch[i].used, __ATOMIC_ACQUIRE) || a < watch[i].lo || a >= watch[i].hi) continue;
        uintptr_t from = a & ~(page_size - 1);
        /* mmap is a plain system call here: safe in a handler on Linux */
        if (mmap((void *)from, watch[i].hi - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
            MAP_FAILED) {
            watch[i].changed = 1;
            return; /* the access is retried and reads zeros */
        }
        break;
    }
    sigaction(SIGBUS, &bus_prev, NULL); /* not ours: returning re-raises it the old way */
}

static int watch_add(const void *base, uint64_t size) {
    pthread_mutex_lock(&watch_mu);
    int slot = -1;
    if (!bus_installed) {
        page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (page_size > 0 && sigaction(SIGBUS, &sa, &bus_prev) == 0) bus_installed = 1;
    }
    for (int i = 0; i < NL_WATCH_MAX && bus_installed && slot < 0; i++) {
        if (watch[i].used) continue;
        watch[i].lo = (uintptr_t)base;
        watch[i].hi = (uintptr_t)base + (uintptr_t)size;
        watch[i].changed = 0;
        __atomic_store_n(&watch[i].used, 1, __ATOMIC_RELEASE);
        slot = i;
    }
    pthread_mutex_unlock(&watch_mu);
    return slot; /* -1: not watched (more than NL_WATCH_MAX files open): only fstat notices */
}

static void watch_remove(int slot) {
    if (slot < 0) return;
    pthread_mutex_lock(&watch_mu);
    __atomic_store_n(&watch[slot].used, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&watch_mu);
}

int nl_gguf_changed(const nl_gguf *g) {
    if (!g || !g->mapped) return 0;
    const gguf_impl *im = (const gguf_impl *)g;
    if (im->watch >= 0 && watch[im->watch].changed) return 1;
    struct stat st;
    if (im->fd < 0 || fstat(im->fd, &st) != 0) return 0;
    return st.st_size != im->st.st_size || st.st_mtim.tv_sec != im->st.st_mtim.tv_sec ||
           st.st_mtim.tv_nsec != im->st.st_mtim.tv_nsec;
}

/* ------------------------------------------------------------------------------------------
 * Reader */
typedef struct {
    const uint8_t *b;
    uint64_t size, pos;
    const char *label;
} cursor;

static uint64_t left(const cursor *c) { return c->size - c->pos; }

/* Ensure n bytes remain; `what` describes the thing being read. */
static int need(const cursor *c, uint64_t n, const char *what) {
    if (n > left(c))
        return nl_err("%s: offset %" PRIu64 ": truncated %s: expected %" PRIu64 " bytes, file has %" PRIu64
                      " left (file size %" PRIu64 ")",
                      c->label, c->pos, what, n, left(c), c->size);
    return 0;
}

static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (need(c, 4, what)) return -1;
    *v = ld32(c->b + c->pos);
    c->pos += 4;
    return 0;
}
static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (need(c, 8, what)) return -1;
    *v = ld64(c->b + c->pos);
    c->pos += 8;
    return 0;
}

/* GGUF string: uint64 length + bytes. Returns a NUL-terminated copy. */
static char *rd_str(cursor *c, uint64_t *len_out, const char *what) {
    uint64_t at = c->pos, n;
    char lw[160];
    snprintf(lw, sizeof lw, "%s length", what);
    if (rd_u64(c, &n, lw)) return NULL;
    if (n > left(c)) {
        nl_err("%s: offset %" PRIu64 ": %s has length %" PRIu64 ", longer than the %" PRIu64
               " bytes left in the file (size %" PRIu64 ")",
               c->label, at, what, n, left(c), c->size);
        return NULL;
    }
    char *s = nl_strndup((const char *)c->b + c->pos, (size_t)n);
    if (!s) return NULL;
    c->pos += n;
    if (len_out) *len_out = n;
    return s;
}

static void load_scalar(nl_gguf_kv *kv, int t, const uint8_t *p) {
    switch (t) {
    case NL_GGUF_UINT8: kv->v.u64 = p[0]; break;
    case NL_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case NL_GGUF_BOOL: kv->v.u64 = p[0] != 0; break;
    case NL_GGUF_UINT16: kv->v.u64 = (uint16_t)(p[0] | p[1] << 8); break;
    case NL_GGUF_INT16: kv->v.i64 = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case NL_GGUF_UINT32: kv->v.u64 = ld32(p); break;
    case NL_GGUF_INT32: kv->v.i64 = (int32_t)ld32(p); break;
    case NL_GGUF_FLOAT32: {
        uint32_t u = ld32(p);
        float f;
        memcpy(&f, &u, 4);
        kv->v.f64 = f;
        break;
    }
    case NL_GGUF_UINT64: kv->v.u64 = ld64(p); break;
    case NL_GGUF_INT64: kv->v.i64 = (int64_t)ld64(p); break;
    case NL_GGUF_FLOAT64: {
        uint64_t u = ld64(p);
        memcpy(&kv->v.f64, &u, 8);
        break;
    }
    }
}

static int parse_kv(cursor *c, nl_gguf_kv *kv, int64_t i) {
    char what[200];
    uint64_t at = c->pos, klen;
    snprintf(what, sizeof what, "key of KV %" PRId64, i);
    kv->key = rd_str(c, &klen, what);
    if (!kv->key) return -1;
    if (klen == 0)
        return nl_err("%s: offset %" PRIu64 ": KV %" PRId64 " has an empty key, expected a non-empty string", c->label,
                      at, i);
    /* Keys are looked up as C strings: one with a NUL inside could never be found, and two
     * differing only after the NUL would look like duplicates. */
    if (strlen(kv->key) != klen)
        return nl_err("%s: offset %" PRIu64 ": KV %" PRId64 " key contains a NUL byte, expected a key without NUL",
                      c->label, at, i);
    uint32_t t;
    snprintf(what, sizeof what, "value type of KV %" PRId64 " '%.64s'", i, kv->key);
    at = c->pos;
    if (rd_u32(c, &t, what)) return -1;
    if (t > NL_GGUF_FLOAT64)
        return nl_err("%s: offset %" PRIu64 ": unknown value type %" PRIu32 " for KV '%.64s', expected 0..12", c->label,
                      at, t, kv->key);
    kv->type = (int)t;
    kv->offset = c->pos;
    snprintf(what, sizeof what, "value of KV '%.64s'", kv->key);
    if (t == NL_GGUF_STRING) {
        kv->str = rd_str(c, NULL, what);
        return kv->str ? 0 : -1;
    }
    if (t != NL_GGUF_ARRAY) {
        size_t sz = vtype_size((int)t);
        if (need(c, sz, what)) return -1;
        load_scalar(kv, (int)t, c->b + c->pos);
        c->pos += sz;
        return 0;
    }
    /* ARRAY: int32 elem type, uint64 count, elements. */
    uint32_t et;
    uint64_t n;
    snprintf(what, sizeof what, "array element type of KV '%.64s'", kv->key);
    at = c->pos;
    if (rd_u32(c, &et, what)) return -1;
    if (et > NL_GGUF_FLOAT64 || et == NL_GGUF_ARRAY)
        return nl_err("%s: offset %" PRIu64 ": unknown array element type %" PRIu32
                      " for KV '%.64s', expected 0..12 other than 9 (array)",
                      c->label, at, et, kv->key);
    kv->arr_type = (int)et;
    snprintf(what, sizeof what, "array length of KV '%.64s'", kv->key);
    at = c->pos;
    if (rd_u64(c, &n, what)) return -1;
    kv->arr_n = n;
    kv->offset = c->pos;
    if (et == NL_GGUF_STRING) {
        /* Each string needs at least its 8-byte length: bound n before allocating. */
        if (n > left(c) / 8)
            return nl_err("%s: offset %" PRIu64 ": array of %" PRIu64
                          " strings in KV '%.64s' is longer than the file (%" PRIu64
                          " bytes left, each string needs at least 8)",
                          c->label, at, n, kv->key, left(c));
        kv->arr_str = nl_calloc(n ? n : 1, sizeof *kv->arr_str);
        kv->arr_str_len = nl_calloc(n ? n : 1, sizeof *kv->arr_str_len);
        if (!kv->arr_str || !kv->arr_str_len) return -1;
        for (uint64_t j = 0; j < n; j++) {
            snprintf(what, sizeof what, "string %" PRIu64 " of array KV '%.64s'", j, kv->key);
            kv->arr_str[j] = rd_str(c, &kv->arr_str_len[j], what);
            if (!kv->arr_str[j]) return -1;
        }
        return 0;
    }
    size_t es = vtype_size((int)et);
    if (n > left(c) / es)
        return nl_err("%s: offset %" PRIu64 ": array of %" PRIu64 " %s in KV '%.64s' needs more than the %" PRIu64
                      " bytes left in the file",
                      c->label, at, n, nl_gguf_vtype_name((int)et), kv->key, left(c));
    kv->arr_data = c->b + c->pos;
    c->pos += n * es;
    return 0;
}

static int parse_tensor_info(cursor *c, nl_gguf_tensor *t, int64_t i) {
    char what[200];
    uint64_t at = c->pos, nlen;
    snprintf(what, sizeof what, "name of tensor info %" PRId64, i);
    t->name = rd_str(c, &nlen, what);
    if (!t->name) return -1;
    if (nlen >= NL_GGUF_MAX_NAME)
        return nl_err("%s: offset %" PRIu64 ": tensor %" PRId64 " name '%.64s...' is %" PRIu64 " bytes, expected < %d",
                      c->label, at, i, t->name, nlen, NL_GGUF_MAX_NAME);
    if (strlen(t->name) != nlen)
        return nl_err("%s: offset %" PRIu64 ": tensor %" PRId64 " name contains a NUL byte", c->label, at, i);
    snprintf(what, sizeof what, "n_dims of tensor info '%s'", t->name);
    at = c->pos;
    if (rd_u32(c, &t->n_dims, what)) return -1;
    if (t->n_dims > NL_GGUF_MAX_DIMS)
        return nl_err("%s: offset %" PRIu64 ": tensor '%s' has %" PRIu32 " dims, expected at most %d", c->label, at,
                      t->name, t->n_dims, NL_GGUF_MAX_DIMS);
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    uint64_t at_ne = c->pos;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        snprintf(what, sizeof what, "ne[%" PRIu32 "] of tensor info '%s'", d, t->name);
        at = c->pos;
        if (rd_u64(c, &v, what)) return -1;
        if ((int64_t)v < 0)
            return nl_err("%s: offset %" PRIu64 ": tensor '%s' ne[%" PRIu32 "] = %" PRId64 ", expected >= 0", c->label,
                          at, t->name, d, (int64_t)v);
        t->ne[d] = (int64_t)v;
    }
    uint32_t ty;
    snprintf(what, sizeof what, "type of tensor info '%s'", t->name);
    at = c->pos;
    if (rd_u32(c, &ty, what)) return -1;
    t->type = (int)ty;
    if (nl_gguf_type_info(t->type, NULL, NULL) != 0)
        return nl_err("%s: offset %" PRIu64 ": tensor '%s' has unknown ggml type %" PRIu32
                      ", expected a known type id (0..%d)",
                      c->label, at, t->name, ty, last_known_type());
    const char *why;
    if (tensor_nbytes(t->type, t->ne, &t->nbytes, &why) != 0)
        return nl_err("%s: offset %" PRIu64 ": tensor '%s' {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "} %s: %s",
                      c->label, at_ne, t->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], nl_type_name(t->type), why);
    snprintf(what, sizeof what, "data offset of tensor info '%s'", t->name);
    if (rd_u64(c, &t->offset, what)) return -1;
    return 0;
}

static void free_kv(nl_gguf_kv *kv) {
    free(kv->key);
    free(kv->str);
    if (kv->arr_str)
        for (uint64_t j = 0; j < kv->arr_n; j++) free(kv->arr_str[j]);
    free(kv->arr_str);
    free(kv->arr_str_len);
}

void nl_gguf_close(nl_gguf *g) {
    if (!g) return;
    gguf_impl *im = (gguf_impl *)g;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free_kv(&g->kv[i]);
    if (g->tensors)
        for (int64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(im->kv_set.slot);
    free(im->t_set.slot);
    watch_remove(im->watch);
    if (g->mapped && g->base) munmap((void *)g->base, (size_t)g->size);
    if (im->fd >= 0) close(im->fd);
    free(g->path);
    free(im);
}

static int parse(gguf_impl *im) {
    nl_gguf *g = &im->pub;
    cursor c = {g->base, g->size, 0, g->path};
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        char got[9] = "";
        for (uint64_t i = 0; i < 4 && i < g->size; i++) snprintf(got + 2 * i, 3, "%02x", g->base[i]);
        return nl_err("%s: offset 0: not a GGUF file: bad magic (%s%s), expected \"GGUF\" (47475546)", g->path,
                      g->size < 4 ? "file shorter than 4 bytes: " : "", got);
    }
    c.pos = 4;
    if (rd_u32(&c, &g->version, "header (version)")) return -1;
    if (g->version < 2 || g->version > 3)
        return nl_err("%s: offset 4: unsupported GGUF version %" PRIu32 ", expected 3 (or 2)", g->path, g->version);
    uint64_t nt, nkv;
    if (rd_u64(&c, &nt, "header (tensor count)")) return -1;
    if (rd_u64(&c, &nkv, "header (KV count)")) return -1;
    if ((int64_t)nt < 0) return nl_err("%s: offset 8: tensor count %" PRId64 ", expected >= 0", g->path, (int64_t)nt);
    if ((int64_t)nkv < 0) return nl_err("%s: offset 16: KV count %" PRId64 ", expected >= 0", g->path, (int64_t)nkv);
    /* Never trust a count for an allocation: a KV needs at least 8 (key length) + 1 (key) + 4
     * (type) + 1 (smallest value) = 14 bytes and a tensor info at least 8 + 4 + 4 + 8 = 24, so
     * a file can hold at most left/14 KVs (left/24 infos); parsing entry number cap-1 can start
     * but never complete. A larger count therefore fails as "truncated ..." at the real spot. */
    uint64_t kv_cap = (nkv < left(&c) / 14 ? nkv : left(&c) / 14) + 1;
    uint64_t t_cap = (nt < left(&c) / 24 ? nt : left(&c) / 24) + 1;
    g->kv = nl_calloc(kv_cap, sizeof *g->kv);
    g->tensors = nl_calloc(t_cap, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return -1;
    if (set_init(&im->kv_set, (int64_t)kv_cap) || set_init(&im->t_set, (int64_t)t_cap)) return -1;

    g->alignment = NL_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < nkv; i++) {
        uint64_t at = c.pos;
        if (i >= kv_cap)
            return nl_err("%s: offset %" PRIu64 ": internal: KV count bound", g->path, at); /* unreachable */
        g->n_kv = (int64_t)i + 1; /* so close() frees the partially parsed entry */
        nl_gguf_kv *kv = &g->kv[i];
        if (parse_kv(&c, kv, (int64_t)i)) return -1;
        if (set_find(&im->kv_set, &g->kv[0].key, kv->key, strlen(kv->key), (int64_t)i, sizeof *kv) >= 0)
            return nl_err("%s: offset %" PRIu64 ": duplicate key '%s' (KV %" PRIu64 "), expected unique keys", g->path,
                          at, kv->key, i);
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != NL_GGUF_UINT32)
                return nl_err("%s: offset %" PRIu64 ": general.alignment has type %s, expected uint32", g->path, at,
                              nl_gguf_vtype_name(kv->type));
            if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)) != 0)
                return nl_err("%s: offset %" PRIu64 ": general.alignment = %" PRIu64 ", expected a power of two",
                              g->path, at, kv->v.u64);
            g->alignment = (uint32_t)kv->v.u64;
        }
    }
    g->n_kv = (int64_t)nkv;

    uint64_t *at_of = nl_malloc(t_cap * sizeof *at_of); /* info offsets, for errors */
    if (!at_of) return -1;
    for (uint64_t i = 0; i < nt; i++) {
        if (i >= t_cap) {
            free(at_of);
            return nl_err("%s: offset %" PRIu64 ": internal: tensor count bound", g->path, c.pos);
        } /* unreachable */
        at_of[i] = c.pos;
        g->n_tensors = (int64_t)i + 1;
        nl_gguf_tensor *t = &g->tensors[i];
        if (parse_tensor_info(&c, t, (int64_t)i)) {
            free(at_of);
            return -1;
        }
        if (set_find(&im->t_set, &g->tensors[0].name, t->name, strlen(t->name), (int64_t)i, sizeof *t) >= 0) {
            uint64_t at = at_of[i];
            free(at_of);
            return nl_err("%s: offset %" PRIu64 ": duplicate tensor name '%s' (tensor %" PRIu64
                          "), expected unique names",
                          g->path, at, t->name, i);
        }
    }
    g->n_tensors = (int64_t)nt;

    if (nt == 0) {
        /* Vocab-only file: may end right after the KVs (no padding, no data). */
        g->data_offset = c.pos;
        free(at_of);
        return 0;
    }
    g->data_offset = pad_to(c.pos, g->alignment);
    if (g->data_offset > g->size) {
        free(at_of);
        return nl_err("%s: offset %" PRIu64
                      ": truncated padding before the data section: expected the data section at offset %" PRIu64
                      ", file size %" PRIu64,
                      g->path, c.pos, g->data_offset, g->size);
    }
    uint64_t expect = 0, avail = g->size - g->data_offset;
    for (uint64_t i = 0; i < nt; i++) {
        nl_gguf_tensor *t = &g->tensors[i];
        /* The offset field is the last 8 bytes of the tensor's info. */
        uint64_t off_at = (i + 1 < nt ? at_of[i + 1] : c.pos) - 8;
        if (t->offset != expect) {
            free(at_of);
            return nl_err("%s: offset %" PRIu64 ": tensor '%s' has data offset %" PRIu64 ", expected %" PRIu64
                          " (tensor data must be contiguous in info order, each padded to %" PRIu32 " bytes)",
                          g->path, off_at, t->name, t->offset, expect, g->alignment);
        }
        if (t->nbytes > avail || t->offset > avail - t->nbytes) {
            free(at_of);
            return nl_err("%s: offset %" PRIu64 ": tensor '%s' data [%" PRIu64 ", %" PRIu64
                          ") in the data section at %" PRIu64 " runs past the end of the file (size %" PRIu64
                          "): expected the file to hold it",
                          g->path, off_at, t->name, t->offset, t->offset + t->nbytes, g->data_offset, g->size);
        }
        t->data = g->base + g->data_offset + t->offset;
        /* nbytes <= avail < 2^64, so the padded sum cannot overflow uint64 meaningfully; check anyway. */
        uint64_t padded = pad_to(t->nbytes, g->alignment);
        if (nl_add_ok(expect, padded, &expect)) {
            free(at_of);
            return nl_err("%s: offset %" PRIu64 ": tensor '%s' data offsets overflow", g->path, off_at, t->name);
        }
    }
    free(at_of);
    return 0;
}

/* fd, st: the mapped file (fd is owned from here on), or -1 / NULL for a buffer. */
static nl_gguf *open_common(const uint8_t *base, uint64_t size, const char *label, int mapped, int fd,
                            const struct stat *st) {
    gguf_impl *im = nl_calloc(1, sizeof *im);
    if (!im) {
        if (mapped && base) munmap((void *)base, (size_t)size);
        if (fd >= 0) close(fd);
        return NULL;
    }
    im->fd = fd;
    if (st) im->st = *st;
    im->watch = mapped && base ? watch_add(base, size) : -1;
    nl_gguf *g = &im->pub;
    g->base = base;
    g->size = size;
    g->mapped = mapped;
    g->path = nl_strdup(label ? label : "<buffer>");
    if (!g->path || parse(im) != 0) {
        nl_gguf_close(g);
        return NULL;
    }
    return g;
}

nl_gguf *nl_gguf_open_buffer(const void *buf, size_t len, const char *label) {
    static const uint8_t empty[1];
    return open_common(buf ? buf : empty, buf ? len : 0, label, 0, -1, NULL);
}

nl_gguf *nl_gguf_open(const char *path) {
    /* O_NONBLOCK: a FIFO there opens at once and is refused below, never waited on */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        nl_err("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        nl_err("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        nl_err("%s: is %s, not a regular file", path, nl_file_kind((unsigned)st.st_mode));
        close(fd);
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0) {
        close(fd);
        return open_common(NULL, 0, path, 0, -1, NULL); /* fails with "bad magic" naming the file */
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        nl_err("%s: cannot mmap %" PRIu64 " bytes: %s", path, size, strerror(errno));
        close(fd);
        return NULL;
    }
    return open_common(p, size, path, 1, fd, &st);
}

/* ------------------------------------------------------------------------------------------
 * Lookups */
const nl_gguf_kv *nl_gguf_get(const nl_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    const gguf_impl *im = (const gguf_impl *)g;
    int64_t i = set_find(&im->kv_set, &g->kv[0].key, key, strlen(key), -1, sizeof(nl_gguf_kv));
    return i >= 0 ? &g->kv[i] : NULL;
}

const nl_gguf_tensor *nl_gguf_tensor_find(const nl_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    const gguf_impl *im = (const gguf_impl *)g;
    int64_t i = set_find(&im->t_set, &g->tensors[0].name, name, strlen(name), -1, sizeof(nl_gguf_tensor));
    return i >= 0 ? &g->tensors[i] : NULL;
}

static int is_unsigned(int t) {
    return t == NL_GGUF_UINT8 || t == NL_GGUF_UINT16 || t == NL_GGUF_UINT32 || t == NL_GGUF_UINT64;
}
static int is_signed(int t) {
    return t == NL_GGUF_INT8 || t == NL_GGUF_INT16 || t == NL_GGUF_INT32 || t == NL_GGUF_INT64;
}

static int wrong_type(const nl_gguf *g, const nl_gguf_kv *kv, const char *expected) {
    return nl_err("%s: key '%s' has type %s, expected %s", g->path, kv->key, nl_gguf_vtype_name(kv->type), expected);
}

int nl_gguf_get_i64(const nl_gguf *g, const char *key, int64_t *out) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    if (!kv) return 1;
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return 0;
    }
    if (is_unsigned(kv->type)) {
        if (kv->v.u64 > (uint64_t)INT64_MAX)
            return nl_err("%s: key '%s' = %" PRIu64 " does not fit int64", g->path, key, kv->v.u64);
        *out = (int64_t)kv->v.u64;
        return 0;
    }
    return wrong_type(g, kv, "an integer");
}

int nl_gguf_get_u32(const nl_gguf *g, const char *key, uint32_t *out) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    if (!kv) return 1;
    if (is_unsigned(kv->type)) {
        if (kv->v.u64 > UINT32_MAX)
            return nl_err("%s: key '%s' = %" PRIu64 " does not fit uint32", g->path, key, kv->v.u64);
        *out = (uint32_t)kv->v.u64;
        return 0;
    }
    if (is_signed(kv->type)) {
        if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX)
            return nl_err("%s: key '%s' = %" PRId64 " does not fit uint32", g->path, key, kv->v.i64);
        *out = (uint32_t)kv->v.i64;
        return 0;
    }
    return wrong_type(g, kv, "an integer (uint32)");
}

int nl_gguf_get_f32(const nl_gguf *g, const char *key, float *out) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    if (!kv) return 1;
    if (kv->type == NL_GGUF_FLOAT32 || kv->type == NL_GGUF_FLOAT64) {
        *out = (float)kv->v.f64;
        return 0;
    }
    return wrong_type(g, kv, "float32");
}

int nl_gguf_get_bool(const nl_gguf *g, const char *key, bool *out) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    if (!kv) return 1;
    if (kv->type == NL_GGUF_BOOL) {
        *out = kv->v.u64 != 0;
        return 0;
    }
    return wrong_type(g, kv, "bool");
}

int nl_gguf_get_str(const nl_gguf *g, const char *key, const char **out) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    if (!kv) return 1;
    if (kv->type == NL_GGUF_STRING) {
        *out = kv->str;
        return 0;
    }
    return wrong_type(g, kv, "string");
}

static int arr_elem(const nl_gguf_kv *kv, uint64_t i, nl_gguf_kv *tmp) {
    if (!kv || kv->type != NL_GGUF_ARRAY) return nl_err("key '%s' is not an array", kv ? kv->key : "(null)");
    size_t es = vtype_size(kv->arr_type);
    if (!es || !kv->arr_data)
        return nl_err("key '%s' is an array of %s, expected numbers", kv->key, nl_gguf_vtype_name(kv->arr_type));
    if (i >= kv->arr_n)
        return nl_err("key '%s': index %" PRIu64 " out of range (array of %" PRIu64 ")", kv->key, i, kv->arr_n);
    memset(tmp, 0, sizeof *tmp);
    load_scalar(tmp, kv->arr_type, (const uint8_t *)kv->arr_data + i * es);
    return 0;
}

int nl_gguf_arr_i64(const nl_gguf_kv *kv, uint64_t i, int64_t *out) {
    nl_gguf_kv t;
    if (arr_elem(kv, i, &t)) return -1;
    int at = kv->arr_type;
    if (is_signed(at)) *out = t.v.i64;
    else if (is_unsigned(at) || at == NL_GGUF_BOOL) {
        if (t.v.u64 > (uint64_t)INT64_MAX) return nl_err("key '%s'[%" PRIu64 "] does not fit int64", kv->key, i);
        *out = (int64_t)t.v.u64;
    } else return nl_err("key '%s' is an array of %s, expected integers", kv->key, nl_gguf_vtype_name(at));
    return 0;
}

int nl_gguf_arr_f64(const nl_gguf_kv *kv, uint64_t i, double *out) {
    nl_gguf_kv t;
    if (arr_elem(kv, i, &t)) return -1;
    int at = kv->arr_type;
    if (is_signed(at)) *out = (double)t.v.i64;
    else if (is_unsigned(at) || at == NL_GGUF_BOOL) *out = (double)t.v.u64;
    else *out = t.v.f64;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Writer. KVs are kept serialized (type + value bytes, little-endian) so that copy and
 * replace are byte-exact; tensors keep a pointer (owned copy, borrowed, or a fill callback). */
typedef struct {
    char *key;
    uint8_t *val; /* serialized: int32 type, then the value */
    size_t val_len;
} wkv;

typedef struct {
    char *name;
    int type, n_dims;
    int64_t ne[NL_GGUF_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    void *owned;
    nl_gguf_fill_fn fill;
    void *user;
} wtensor;

struct nl_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

/* Growable byte buffer for serialising a value. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} bbuf;

static void bb_put(bbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            nl_err("out of memory serialising GGUF value");
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u32(bbuf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    bb_put(b, x, 4);
}
static void bb_u64(bbuf *b, uint64_t v) {
    bb_u32(b, (uint32_t)v);
    bb_u32(b, (uint32_t)(v >> 32));
}
static void bb_str(bbuf *b, const char *s, uint64_t n) {
    bb_u64(b, n);
    bb_put(b, s, (size_t)n);
}

nl_gguf_writer *nl_gguf_writer_new(void) { return nl_calloc(1, sizeof(nl_gguf_writer)); }

void nl_gguf_writer_free(nl_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].owned);
    }
    free(w->kv);
    free(w->t);
    free(w);
}

/* Takes ownership of b->p. */
static int set_kv(nl_gguf_writer *w, const char *key, bbuf *b) {
    if (b->oom) {
        free(b->p);
        return -1;
    }
    if (!w || !key || !key[0]) {
        free(b->p);
        return nl_err("gguf writer: empty key");
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].val = b->p;
            w->kv[i].val_len = b->n;
            return 0;
        }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *nk = realloc(w->kv, cap * sizeof *nk);
        if (!nk) {
            free(b->p);
            return nl_err("out of memory adding GGUF key '%s'", key);
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = nl_strdup(key);
    if (!k) {
        free(b->p);
        return -1;
    }
    w->kv[w->n_kv++] = (wkv){k, b->p, b->n};
    return 0;
}

static int set_scalar(nl_gguf_writer *w, const char *key, int type, const void *le, size_t n) {
    bbuf b = {0};
    bb_u32(&b, (uint32_t)type);
    bb_put(&b, le, n);
    return set_kv(w, key, &b);
}

int nl_gguf_set_u32(nl_gguf_writer *w, const char *key, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return set_scalar(w, key, NL_GGUF_UINT32, x, 4);
}
int nl_gguf_set_i32(nl_gguf_writer *w, const char *key, int32_t v) {
    uint32_t u = (uint32_t)v;
    uint8_t x[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    return set_scalar(w, key, NL_GGUF_INT32, x, 4);
}
int nl_gguf_set_u64(nl_gguf_writer *w, const char *key, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    return set_scalar(w, key, NL_GGUF_UINT64, x, 8);
}
int nl_gguf_set_f32(nl_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t x[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    return set_scalar(w, key, NL_GGUF_FLOAT32, x, 4);
}
int nl_gguf_set_bool(nl_gguf_writer *w, const char *key, bool v) {
    uint8_t x = v ? 1 : 0;
    return set_scalar(w, key, NL_GGUF_BOOL, &x, 1);
}
int nl_gguf_set_str(nl_gguf_writer *w, const char *key, const char *v) {
    bbuf b = {0};
    bb_u32(&b, NL_GGUF_STRING);
    bb_str(&b, v ? v : "", v ? strlen(v) : 0);
    return set_kv(w, key, &b);
}

int nl_gguf_set_arr(nl_gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n) {
    size_t es = vtype_size(elem_type);
    if (!es)
        return nl_err("gguf writer: key '%s': array element type %s is not numeric", key,
                      nl_gguf_vtype_name(elem_type));
    uint64_t bytes;
    if (nl_mul_ok(n, es, &bytes) || bytes > SIZE_MAX / 2) return nl_err("gguf writer: key '%s': array too large", key);
    if (n && !data) return nl_err("gguf writer: key '%s': NULL array data", key);
    bbuf b = {0};
    bb_u32(&b, NL_GGUF_ARRAY);
    bb_u32(&b, (uint32_t)elem_type);
    bb_u64(&b, n);
    if (n) bb_put(&b, data, (size_t)bytes); /* caller supplies little-endian elements */
    return set_kv(w, key, &b);
}

static int set_arr_str_len(nl_gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                           uint64_t n) {
    bbuf b = {0};
    bb_u32(&b, NL_GGUF_ARRAY);
    bb_u32(&b, NL_GGUF_STRING);
    bb_u64(&b, n);
    for (uint64_t i = 0; i < n && !b.oom; i++) {
        const char *s = strs[i] ? strs[i] : "";
        bb_str(&b, s, lens ? lens[i] : strlen(s));
    }
    return set_kv(w, key, &b);
}

int nl_gguf_set_arr_str(nl_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    return set_arr_str_len(w, key, strs, NULL, n);
}

int nl_gguf_remove_key(nl_gguf_writer *w, const char *key) {
    for (size_t i = 0; w && key && i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].key);
            free(w->kv[i].val);
            memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - i - 1) * sizeof *w->kv);
            w->n_kv--;
            return 0;
        }
    return 1;
}

int nl_gguf_copy_kvs(nl_gguf_writer *w, const nl_gguf *g) {
    for (int64_t i = 0; i < g->n_kv; i++) {
        const nl_gguf_kv *kv = &g->kv[i];
        int rc;
        if (kv->type == NL_GGUF_STRING) {
            rc = nl_gguf_set_str(w, kv->key, kv->str);
        } else if (kv->type == NL_GGUF_ARRAY && kv->arr_type == NL_GGUF_STRING) {
            rc = set_arr_str_len(w, kv->key, (const char *const *)kv->arr_str, kv->arr_str_len, kv->arr_n);
        } else if (kv->type == NL_GGUF_ARRAY) {
            rc = nl_gguf_set_arr(w, kv->key, kv->arr_type, kv->arr_data, kv->arr_n);
        } else {
            /* Re-serialise the scalar in its original type. */
            uint8_t x[8];
            size_t n = vtype_size(kv->type);
            uint64_t bits = kv->v.u64;
            if (kv->type == NL_GGUF_FLOAT32) {
                float f = (float)kv->v.f64;
                uint32_t u;
                memcpy(&u, &f, 4);
                bits = u;
            } else if (kv->type == NL_GGUF_FLOAT64) memcpy(&bits, &kv->v.f64, 8);
            for (size_t j = 0; j < n; j++) x[j] = (uint8_t)(bits >> (8 * j));
            rc = set_scalar(w, kv->key, kv->type, x, n);
        }
        if (rc) return -1;
    }
    return 0;
}

static int add_tensor_common(nl_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                             wtensor *out) {
    if (!name || strlen(name) >= NL_GGUF_MAX_NAME || !name[0])
        return nl_err("gguf writer: tensor name '%s' must be 1..%d bytes", name ? name : "(null)",
                      NL_GGUF_MAX_NAME - 1);
    if (n_dims < 1 || n_dims > NL_GGUF_MAX_DIMS)
        return nl_err("gguf writer: tensor '%s': n_dims %d, expected 1..4", name, n_dims);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return nl_err("gguf writer: duplicate tensor name '%s'", name);
    memset(out, 0, sizeof *out);
    out->type = type;
    out->n_dims = n_dims;
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++) out->ne[d] = d < n_dims ? ne[d] : 1;
    const char *why;
    if (tensor_nbytes(type, out->ne, &out->nbytes, &why))
        return nl_err("gguf writer: tensor '%s' (type %d, {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}): %s",
                      name, type, out->ne[0], out->ne[1], out->ne[2], out->ne[3], why);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return nl_err("out of memory adding tensor '%s'", name);
        w->t = nt;
        w->cap_t = cap;
    }
    out->name = nl_strdup(name);
    return out->name ? 0 : -1;
}

int nl_gguf_add_tensor(nl_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                       bool borrow) {
    wtensor t;
    if (add_tensor_common(w, name, type, n_dims, ne, &t)) return -1;
    if (t.nbytes && !data) {
        free(t.name);
        return nl_err("gguf writer: tensor '%s': NULL data", name);
    }
    if (borrow) {
        t.data = data;
    } else {
        if (t.nbytes > SIZE_MAX) {
            free(t.name);
            return nl_err("gguf writer: tensor '%s' too large", name);
        }
        t.owned = nl_malloc((size_t)t.nbytes);
        if (!t.owned) {
            free(t.name);
            return -1;
        }
        if (t.nbytes) memcpy(t.owned, data, (size_t)t.nbytes);
        t.data = t.owned;
    }
    w->t[w->n_t++] = t;
    return 0;
}

int nl_gguf_add_tensor_fill(nl_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                            nl_gguf_fill_fn fill, void *user) {
    wtensor t;
    if (!fill) return nl_err("gguf writer: tensor '%s': NULL fill callback", name ? name : "(null)");
    if (add_tensor_common(w, name, type, n_dims, ne, &t)) return -1;
    t.fill = fill;
    t.user = user;
    w->t[w->n_t++] = t;
    return 0;
}

static int w_pad(nl_io_out *o, uint64_t pos, uint64_t align) {
    static const uint8_t zeros[256];
    uint64_t n = pad_to(pos, align) - pos;
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        if (nl_io_out_write(o, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

static int write_body(void *user, nl_io_out *o) {
    nl_gguf_writer *w = user;
    const char *path = o->path;
    uint32_t align = NL_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, "general.alignment") == 0) {
            if (w->kv[i].val_len != 8 || ld32(w->kv[i].val) != NL_GGUF_UINT32)
                return nl_err("%s: general.alignment must be uint32", path);
            align = ld32(w->kv[i].val + 4);
            if (align == 0 || (align & (align - 1)))
                return nl_err("%s: general.alignment %" PRIu32 " is not a power of two", path, align);
        }
    bbuf h = {0};
    bb_put(&h, "GGUF", 4);
    bb_u32(&h, 3);
    bb_u64(&h, (uint64_t)w->n_t);
    bb_u64(&h, (uint64_t)w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        bb_str(&h, w->kv[i].key, strlen(w->kv[i].key));
        bb_put(&h, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        bb_str(&h, t->name, strlen(t->name));
        bb_u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) bb_u64(&h, (uint64_t)t->ne[d]);
        bb_u32(&h, (uint32_t)t->type);
        bb_u64(&h, off);
        off += pad_to(t->nbytes, align);
    }
    if (h.oom) {
        free(h.p);
        return -1;
    }
    int rc = nl_io_out_write(o, h.p, h.n);
    uint64_t pos = h.n;
    free(h.p);
    if (rc) return -1;
    if (w->n_t == 0) return 0; /* vocab-only: ends right after the KVs */
    if (w_pad(o, pos, align)) return -1;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->fill) {
            void *buf = nl_malloc((size_t)t->nbytes);
            if (!buf) return -1;
            if (t->fill(t->user, (int)i, buf, t->nbytes)) {
                free(buf);
                return nl_err_prefix("%s: tensor '%s'", path, t->name);
            }
            rc = nl_io_out_write(o, buf, (size_t)t->nbytes);
            free(buf);
            if (rc) return -1;
        } else if (nl_io_out_write(o, t->data, (size_t)t->nbytes)) {
            return -1;
        }
        if (w_pad(o, t->nbytes, align)) return -1;
    }
    return 0;
}

/* os/io's one atomic file write: PATH.tmp (O_EXCL|O_NOFOLLOW), fsync, rename, fsync of the
 * directory. */
int nl_gguf_write(nl_gguf_writer *w, const char *path) { return nl_io_write_atomic(NULL, path, NULL, write_body, w); }

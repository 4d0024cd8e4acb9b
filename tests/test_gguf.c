/* model/gguf: writer -> reader round trips, the real vocab files, one case per malformed
 * class (each error must name the file label, the offset and what was expected), truncation
 * at every byte length, and random single-byte corruption. */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "test.h"
#include "util/util.h"

#define LABEL "mem.gguf"

static int has(const char *s) { return strstr(nl_last_error(), s) != NULL; }

static uint8_t *read_all(const char *path, size_t *len) { return (uint8_t *)nl_read_file(path, len); }

/* Offset just past the first occurrence of `needle` (as raw bytes) in buf, or 0. */
static size_t after(const uint8_t *buf, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(buf + i, needle, n) == 0) return i + n;
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Parse a copy of exactly len bytes (so ASan sees any over-read). */
static nl_gguf *parse_copy(const uint8_t *buf, size_t len, uint8_t **copy) {
    *copy = malloc(len ? len : 1);
    if (len) memcpy(*copy, buf, len);
    return nl_gguf_open_buffer(*copy, len, LABEL);
}

/* Expect parsing to fail with a message containing the label and every string given. */
static void expect_fail(const uint8_t *buf, size_t len, const char *what, const char *s1, const char *s2) {
    uint8_t *copy;
    nl_gguf *g = parse_copy(buf, len, &copy);
    CHECKF(g == NULL, "%s: parse should fail", what);
    if (g) nl_gguf_close(g);
    else {
        CHECKF(has(LABEL), "%s: message lacks the label: %s", what, nl_last_error());
        if (s1) CHECKF(has(s1), "%s: message lacks '%s': %s", what, s1, nl_last_error());
        if (s2) CHECKF(has(s2), "%s: message lacks '%s': %s", what, s2, nl_last_error());
    }
    free(copy);
}

/* ---- a hand-built file holding every scalar type (the writer has setters for only some) */
typedef struct {
    uint8_t *p;
    size_t n;
} buf_t;
static void b_raw(buf_t *b, const void *s, size_t n) {
    b->p = realloc(b->p, b->n + n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void b_u32(buf_t *b, uint32_t v) {
    uint8_t x[4];
    put32(x, v);
    b_raw(b, x, 4);
}
static void b_u64(buf_t *b, uint64_t v) {
    uint8_t x[8];
    put64(x, v);
    b_raw(b, x, 8);
}
static void b_str(buf_t *b, const char *s) {
    b_u64(b, strlen(s));
    b_raw(b, s, strlen(s));
}
static void b_kv(buf_t *b, const char *key, uint32_t type, const void *val, size_t n) {
    b_str(b, key);
    b_u32(b, type);
    b_raw(b, val, n);
}

static void test_all_scalar_types(void) {
    buf_t b = {0};
    b_raw(&b, "GGUF", 4);
    b_u32(&b, 3);
    b_u64(&b, 0);
    b_u64(&b, 11);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint8_t u16[2] = {0x34, 0x12}, i16[2] = {0xfe, 0xff}; /* 0x1234, -2 */
    uint8_t i32[4];
    put32(i32, (uint32_t)-123456);
    uint8_t u64[8];
    put64(u64, 0x123456789abcdef0ull);
    uint8_t i64[8];
    put64(i64, (uint64_t)(int64_t)-5000000000ll);
    double d = -2.5e100;
    uint64_t db;
    memcpy(&db, &d, 8);
    uint8_t f64[8];
    put64(f64, db);
    float f = 0.375f;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    uint8_t f32[4];
    put32(f32, fb);
    uint8_t bo = 1;
    uint8_t u32[4];
    put32(u32, 4000000000u);
    b_kv(&b, "t.u8", NL_GGUF_UINT8, &u8, 1);
    b_kv(&b, "t.i8", NL_GGUF_INT8, &i8, 1);
    b_kv(&b, "t.u16", NL_GGUF_UINT16, u16, 2);
    b_kv(&b, "t.i16", NL_GGUF_INT16, i16, 2);
    b_kv(&b, "t.u32", NL_GGUF_UINT32, u32, 4);
    b_kv(&b, "t.i32", NL_GGUF_INT32, i32, 4);
    b_kv(&b, "t.f32", NL_GGUF_FLOAT32, f32, 4);
    b_kv(&b, "t.bool", NL_GGUF_BOOL, &bo, 1);
    b_kv(&b, "t.u64", NL_GGUF_UINT64, u64, 8);
    b_kv(&b, "t.i64", NL_GGUF_INT64, i64, 8);
    b_kv(&b, "t.f64", NL_GGUF_FLOAT64, f64, 8);

    for (int pass = 0; pass < 2; pass++) {
        uint8_t *copy;
        nl_gguf *g = parse_copy(b.p, b.n, &copy);
        CHECKF(g != NULL, "%s", nl_last_error());
        if (!g) {
            free(copy);
            break;
        }
        CHECK(g->n_kv == 11 && g->n_tensors == 0 && g->data_offset == b.n);
        CHECK(nl_gguf_get(g, "t.u8")->v.u64 == 200 && nl_gguf_get(g, "t.u8")->type == NL_GGUF_UINT8);
        CHECK(nl_gguf_get(g, "t.i8")->v.i64 == -100);
        CHECK(nl_gguf_get(g, "t.u16")->v.u64 == 0x1234);
        CHECK(nl_gguf_get(g, "t.i16")->v.i64 == -2);
        CHECK(nl_gguf_get(g, "t.i32")->v.i64 == -123456);
        CHECK(nl_gguf_get(g, "t.u64")->v.u64 == 0x123456789abcdef0ull);
        CHECK(nl_gguf_get(g, "t.i64")->v.i64 == -5000000000ll);
        CHECK(nl_gguf_get(g, "t.f64")->v.f64 == -2.5e100);
        uint32_t v32;
        int64_t v64;
        float vf;
        bool vb;
        CHECK(nl_gguf_get_u32(g, "t.u32", &v32) == 0 && v32 == 4000000000u);
        CHECK(nl_gguf_get_u32(g, "t.u8", &v32) == 0 && v32 == 200);
        CHECK(nl_gguf_get_u32(g, "t.i32", &v32) == -1 && has("t.i32")); /* negative does not fit */
        CHECK(nl_gguf_get_u32(g, "t.u64", &v32) == -1);
        CHECK(nl_gguf_get_u32(g, "t.f32", &v32) == -1 && has("float32") && has("t.f32"));
        CHECK(nl_gguf_get_u32(g, "absent", &v32) == 1);
        CHECK(nl_gguf_get_i64(g, "t.i64", &v64) == 0 && v64 == -5000000000ll);
        CHECK(nl_gguf_get_i64(g, "t.u32", &v64) == 0 && v64 == 4000000000ll);
        CHECK(nl_gguf_get_f32(g, "t.f32", &vf) == 0 && vf == 0.375f);
        CHECK(nl_gguf_get_f32(g, "t.bool", &vf) == -1 && has("bool"));
        CHECK(nl_gguf_get_bool(g, "t.bool", &vb) == 0 && vb);
        const char *s;
        CHECK(nl_gguf_get_str(g, "t.u8", &s) == -1 && has("string"));
        if (pass == 0) {
            /* Copy every KV through the writer and read it back byte-identical. */
            nl_gguf_writer *w = nl_gguf_writer_new();
            CHECK(nl_gguf_copy_kvs(w, g) == 0);
            CHECK(nl_gguf_write(w, "test_gguf_scalars.gguf") == 0);
            nl_gguf_writer_free(w);
            size_t n2;
            uint8_t *b2 = read_all("test_gguf_scalars.gguf", &n2);
            CHECK(b2 && n2 == b.n && memcmp(b2, b.p, n2) == 0);
            free(b2);
        }
        nl_gguf_close(g);
        free(copy);
    }
    free(b.p);
}

/* ---- writer round trip with arrays, strings, tensors of several types */
static const int T_TYPES[] = {0 /*f32*/, 1 /*f16*/, 8 /*q8_0*/, 12 /*q4_k*/, 26 /*i32*/, 30 /*bf16*/, 2 /*q4_0*/};
static const int64_t T_NE[][4] = {{7, 3, 1, 1}, {5, 1, 1, 1}, {64, 3, 1, 1}, {256, 2, 1, 1},
                                  {3, 2, 2, 1}, {9, 1, 1, 1}, {32, 1, 2, 2}};
static const int T_NDIMS[] = {2, 1, 2, 2, 3, 1, 4};
#define N_T ((int)(sizeof T_TYPES / sizeof T_TYPES[0]))

static int fill_pattern(void *user, int idx, void *dst, uint64_t n) {
    (void)user;
    for (uint64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(i * 7 + (uint64_t)idx * 13 + 1);
    return 0;
}

/* Builds the standard test file in memory (through the writer and a temp file). */
static uint8_t *make_file(const char *path, uint32_t align, size_t *len, uint8_t **blobs_out) {
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_set_str(w, "general.architecture", "llama");
    nl_gguf_set_str(w, "general.name", "first");
    nl_gguf_set_str(w, "general.name", "replaced"); /* setting twice replaces */
    if (align) nl_gguf_set_u32(w, "general.alignment", align);
    nl_gguf_set_u32(w, "a.removed", 1);
    nl_gguf_set_u32(w, "a.u32", 42);
    CHECK(nl_gguf_remove_key(w, "a.removed") == 0 && nl_gguf_remove_key(w, "a.removed") == 1);
    nl_gguf_set_i32(w, "a.i32", -7);
    nl_gguf_set_u64(w, "a.u64", 1ull << 40);
    nl_gguf_set_f32(w, "a.f32", 1e-6f);
    nl_gguf_set_bool(w, "a.bool", true);
    nl_gguf_set_str(w, "a.empty", "");
    int32_t ia[5] = {1, -2, 3, -4, 5};
    nl_gguf_set_arr(w, "a.arr_i32", NL_GGUF_INT32, ia, 5);
    float fa[3] = {0.5f, -1.25f, 3.0f};
    nl_gguf_set_arr(w, "a.arr_f32", NL_GGUF_FLOAT32, fa, 3);
    uint8_t ba[4] = {1, 0, 1, 1};
    nl_gguf_set_arr(w, "a.arr_bool", NL_GGUF_BOOL, ba, 4);
    uint16_t ua[2] = {65535, 1};
    nl_gguf_set_arr(w, "a.arr_u16", NL_GGUF_UINT16, ua, 2);
    nl_gguf_set_arr(w, "a.arr_empty", NL_GGUF_UINT8, NULL, 0);
    const char *sa[4] = {"hello", "", "w\xc3\xb6rld", "a b"};
    nl_gguf_set_arr_str(w, "a.arr_str", sa, 4);
    uint8_t *blobs = malloc(1 << 16);
    size_t boff = 0;
    for (int i = 0; i < N_T; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d.weight", i);
        if (i == 3) {
            CHECK(nl_gguf_add_tensor_fill(w, name, T_TYPES[i], T_NDIMS[i], T_NE[i], fill_pattern, NULL) == 0);
            fill_pattern(NULL, i, blobs + boff, 2 * 144);
            boff += 2 * 144;
            continue;
        }
        int blck;
        size_t bb;
        nl_gguf_type_info(T_TYPES[i], &blck, &bb);
        size_t nb = (size_t)(T_NE[i][0] / blck) * bb * (size_t)(T_NE[i][1] * T_NE[i][2] * T_NE[i][3]);
        for (size_t j = 0; j < nb; j++) blobs[boff + j] = (uint8_t)(j * 31 + (size_t)i);
        CHECK(nl_gguf_add_tensor(w, name, T_TYPES[i], T_NDIMS[i], T_NE[i], blobs + boff, i % 2) == 0);
        boff += nb;
    }
    CHECK(nl_gguf_add_tensor(w, "t0.weight", 0, 1, T_NE[0], blobs, true) == -1 && has("duplicate")); /* duplicate */
    int64_t bad_ne[1] = {33};
    CHECK(nl_gguf_add_tensor(w, "bad", 8, 1, bad_ne, blobs, true) == -1 && has("block size"));
    CHECK(nl_gguf_add_tensor(w, "x123456789012345678901234567890123456789012345678901234567890abc", 0, 1, bad_ne, blobs,
                             true) == -1);
    CHECKF(nl_gguf_write(w, path) == 0, "%s", nl_last_error());
    nl_gguf_writer_free(w);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0); /* renamed away */
    *blobs_out = blobs;
    return read_all(path, len);
}

static void test_round_trip(uint32_t align) {
    size_t len;
    uint8_t *blobs;
    uint8_t *file = make_file("test_gguf_rt.gguf", align, &len, &blobs);
    CHECK(file != NULL);
    nl_gguf *g = nl_gguf_open("test_gguf_rt.gguf");
    CHECKF(g != NULL, "%s", nl_last_error());
    if (!g) {
        free(file);
        free(blobs);
        return;
    }
    uint32_t A = align ? align : 32;
    CHECK(g->alignment == A && g->version == 3 && g->mapped);
    CHECK(g->data_offset % A == 0);
    const char *s;
    CHECK(nl_gguf_get_str(g, "general.name", &s) == 0 && strcmp(s, "replaced") == 0);
    CHECK(nl_gguf_get_str(g, "a.empty", &s) == 0 && s[0] == 0);
    uint32_t u;
    int64_t i64;
    float f;
    bool b;
    CHECK(nl_gguf_get_u32(g, "a.u32", &u) == 0 && u == 42);
    CHECK(nl_gguf_get_i64(g, "a.i32", &i64) == 0 && i64 == -7);
    CHECK(nl_gguf_get_i64(g, "a.u64", &i64) == 0 && i64 == (1ll << 40));
    CHECK(nl_gguf_get_f32(g, "a.f32", &f) == 0 && f == 1e-6f);
    CHECK(nl_gguf_get_bool(g, "a.bool", &b) == 0 && b);
    const nl_gguf_kv *kv = nl_gguf_get(g, "a.arr_i32");
    CHECK(kv && kv->type == NL_GGUF_ARRAY && kv->arr_type == NL_GGUF_INT32 && kv->arr_n == 5);
    CHECK(nl_gguf_arr_i64(kv, 1, &i64) == 0 && i64 == -2);
    CHECK(nl_gguf_arr_i64(kv, 4, &i64) == 0 && i64 == 5);
    CHECK(nl_gguf_arr_i64(kv, 5, &i64) == -1); /* out of range */
    double d;
    kv = nl_gguf_get(g, "a.arr_f32");
    CHECK(kv && kv->arr_n == 3 && nl_gguf_arr_f64(kv, 1, &d) == 0 && d == -1.25);
    CHECK(nl_gguf_arr_i64(kv, 0, &i64) == -1); /* floats are not integers */
    kv = nl_gguf_get(g, "a.arr_bool");
    CHECK(kv && kv->arr_n == 4 && nl_gguf_arr_i64(kv, 1, &i64) == 0 && i64 == 0 && nl_gguf_arr_i64(kv, 3, &i64) == 0 &&
          i64 == 1);
    kv = nl_gguf_get(g, "a.arr_u16");
    CHECK(kv && nl_gguf_arr_i64(kv, 0, &i64) == 0 && i64 == 65535);
    kv = nl_gguf_get(g, "a.arr_empty");
    CHECK(kv && kv->arr_n == 0 && kv->arr_type == NL_GGUF_UINT8);
    kv = nl_gguf_get(g, "a.arr_str");
    CHECK(kv && kv->arr_type == NL_GGUF_STRING && kv->arr_n == 4);
    if (kv && kv->arr_n == 4) {
        CHECK(strcmp(kv->arr_str[0], "hello") == 0 && kv->arr_str[1][0] == 0 &&
              strcmp(kv->arr_str[2], "w\xc3\xb6rld") == 0);
        CHECK(kv->arr_str_len[2] == 6 && strcmp(kv->arr_str[3], "a b") == 0);
    }
    CHECK(nl_gguf_get(g, "missing") == NULL && nl_gguf_get(g, "a.removed") == NULL);
    CHECK(g->n_tensors == N_T);
    size_t boff = 0;
    uint64_t expect_off = 0;
    for (int i = 0; i < N_T && i < g->n_tensors; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d.weight", i);
        const nl_gguf_tensor *t = nl_gguf_tensor_find(g, name);
        CHECKF(t == &g->tensors[i], "%s", name);
        if (!t) continue;
        CHECK(t->type == T_TYPES[i] && t->n_dims == (uint32_t)T_NDIMS[i]);
        for (int k = 0; k < 4; k++) CHECK(t->ne[k] == T_NE[i][k]);
        CHECK(t->offset == expect_off && t->offset % A == 0);
        CHECK((const uint8_t *)t->data == g->base + g->data_offset + t->offset);
        CHECK(memcmp(t->data, blobs + boff, (size_t)t->nbytes) == 0);
        /* padding between tensors is zero */
        uint64_t end = g->data_offset + t->offset + t->nbytes, pend = (end + A - 1) / A * A;
        for (uint64_t p = end; p < pend && p < g->size; p++) CHECK(g->base[p] == 0);
        boff += t->nbytes;
        expect_off += (t->nbytes + A - 1) / A * A;
    }
    CHECK(g->tensors[3].nbytes == 2 * 144 && g->tensors[2].nbytes == 2 * 3 * 34 && g->tensors[0].nbytes == 7 * 3 * 4);
    CHECK(g->data_offset + expect_off == g->size);
    CHECK(nl_gguf_tensor_find(g, "nope") == NULL);

    /* copy_kvs + the same tensors give a byte-identical file */
    nl_gguf_writer *w = nl_gguf_writer_new();
    CHECK(nl_gguf_copy_kvs(w, g) == 0);
    for (int i = 0; i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        CHECK(nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, true) == 0);
    }
    CHECK(nl_gguf_write(w, "test_gguf_rt2.gguf") == 0);
    nl_gguf_writer_free(w);
    size_t len2;
    uint8_t *file2 = read_all("test_gguf_rt2.gguf", &len2);
    CHECK(file2 && len2 == len && memcmp(file, file2, len) == 0);
    free(file2);
    nl_gguf_close(g);
    free(file);
    free(blobs);
}

/* ---- the real vocab-only files */
static void test_vocab_files(void) {
    const char *dir = NL_TEST_DATA "/tokenizer";
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "%s: cannot open", dir);
    if (!d) return;
    struct dirent *e;
    int n_files = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        nl_gguf *g = nl_gguf_open(path);
        CHECKF(g != NULL, "%s", nl_last_error());
        if (!g) continue;
        n_files++;
        const char *model;
        CHECK(nl_gguf_get_str(g, "tokenizer.ggml.model", &model) == 0 && strcmp(model, "gpt2") == 0);
        const nl_gguf_kv *tok = nl_gguf_get(g, "tokenizer.ggml.tokens");
        const nl_gguf_kv *tt = nl_gguf_get(g, "tokenizer.ggml.token_type");
        const nl_gguf_kv *mg = nl_gguf_get(g, "tokenizer.ggml.merges");
        CHECKF(tok && tok->arr_type == NL_GGUF_STRING && tok->arr_n > 1000, "%s tokens", e->d_name);
        CHECKF(tt && tok && tt->arr_n == tok->arr_n && tt->arr_type == NL_GGUF_INT32, "%s token_type", e->d_name);
        CHECKF(mg && mg->arr_type == NL_GGUF_STRING && mg->arr_n > 1000, "%s merges", e->d_name);
        CHECK(g->n_tensors == 0 && g->data_offset == g->size); /* ends right after the KVs */
        if (strstr(e->d_name, "gpt-2")) {
            /* GPT-2: 50257 tokens; token 0 is "!" and 50256 is <|endoftext|>. */
            CHECK(tok && tok->arr_n == 50257 && strcmp(tok->arr_str[0], "!") == 0 &&
                  strcmp(tok->arr_str[50256], "<|endoftext|>") == 0);
        }
        nl_gguf_close(g);
    }
    closedir(d);
    CHECK(n_files >= 5);
    printf("read %d vocab files\n", n_files);
}

/* ---- malformed files, one case per class */
static void test_malformed(void) {
    size_t len;
    uint8_t *blobs;
    uint8_t *good = make_file("test_gguf_bad.gguf", 0, &len, &blobs);
    free(blobs);
    uint8_t *b = malloc(len);
    char s[128];

    {
        uint8_t *c;
        nl_gguf *g = parse_copy(good, len, &c);
        CHECKF(g != NULL, "%s", nl_last_error());
        nl_gguf_close(g);
        free(c);
    }

    memcpy(b, good, len);
    b[1] = 'X';
    expect_fail(b, len, "bad magic", "offset 0", "not a GGUF");
    expect_fail(good, 3, "short magic", "offset 0", "not a GGUF");
    expect_fail(good, 0, "empty", "offset 0", "not a GGUF");

    uint32_t versions[3] = {0, 1, 4};
    for (int i = 0; i < 3; i++) {
        memcpy(b, good, len);
        put32(b + 4, versions[i]);
        snprintf(s, sizeof s, "version %u", versions[i]);
        expect_fail(b, len, "bad version", "offset 4", s);
    }
    expect_fail(good, 10, "truncated header", "offset 8", "truncated header");

    /* truncated KV: cut in the middle of the a.u64 value */
    size_t v = after(good, len, "a.u64") + 4;
    snprintf(s, sizeof s, "offset %zu", v);
    expect_fail(good, v + 3, "truncated KV", s, "truncated value of KV 'a.u64'");

    /* truncated tensor info: cut inside t2's dims */
    size_t ti = after(good, len, "t2.weight");
    snprintf(s, sizeof s, "offset %zu", ti + 4);
    expect_fail(good, ti + 4 + 5, "truncated tensor info", s, "truncated ne[0] of tensor info 't2.weight'");

    /* string longer than the file */
    size_t sl = after(good, len, "general.name") + 4;
    memcpy(b, good, len);
    put64(b + sl, 1ull << 40);
    snprintf(s, sizeof s, "offset %zu", sl);
    expect_fail(b, len, "long string", s, "longer than");
    memcpy(b, good, len);
    put64(b + sl, UINT64_MAX);
    expect_fail(b, len, "huge string", s, "longer than");

    /* array longer than the file (numeric and strings) */
    size_t al = after(good, len, "a.arr_i32") + 8;
    memcpy(b, good, len);
    put64(b + al, 1ull << 61);
    snprintf(s, sizeof s, "offset %zu", al);
    expect_fail(b, len, "long array", s, "array of");
    al = after(good, len, "a.arr_str") + 8;
    memcpy(b, good, len);
    put64(b + al, 1ull << 50);
    snprintf(s, sizeof s, "offset %zu", al);
    expect_fail(b, len, "long string array", s, "strings");

    /* unknown KV type and unknown array element type */
    size_t kt = after(good, len, "a.u32");
    memcpy(b, good, len);
    put32(b + kt, 13);
    snprintf(s, sizeof s, "offset %zu", kt);
    expect_fail(b, len, "unknown KV type", s, "unknown value type 13");
    kt = after(good, len, "a.arr_i32") + 4;
    memcpy(b, good, len);
    put32(b + kt, 9);
    snprintf(s, sizeof s, "offset %zu", kt);
    expect_fail(b, len, "array of arrays", s, "array element type 9");

    /* unknown tensor type (5 was removed from ggml) */
    size_t tt = after(good, len, "t0.weight") + 4 + 2 * 8;
    memcpy(b, good, len);
    put32(b + tt, 5);
    snprintf(s, sizeof s, "offset %zu", tt);
    expect_fail(b, len, "unknown tensor type", s, "unknown ggml type 5");

    /* dims overflow */
    size_t ne = after(good, len, "t0.weight") + 4;
    memcpy(b, good, len);
    put64(b + ne, 1ull << 40);
    put64(b + ne + 8, 1ull << 40);
    snprintf(s, sizeof s, "offset %zu", ne);
    expect_fail(b, len, "dims overflow", s, "overflow");
    memcpy(b, good, len);
    put64(b + ne, (uint64_t)-4);
    expect_fail(b, len, "negative dim", s, "expected >= 0");
    /* ne0 not a multiple of the block size (q8_0 tensor t2) */
    ne = after(good, len, "t2.weight") + 4;
    memcpy(b, good, len);
    put64(b + ne, 40);
    snprintf(s, sizeof s, "offset %zu", ne);
    expect_fail(b, len, "partial block", s, "block size");
    /* too many dims */
    memcpy(b, good, len);
    put32(b + ne - 4, 5);
    expect_fail(b, len, "n_dims", "5 dims", "at most 4");

    /* data offset out of range / overlapping (non-contiguous) */
    size_t of = after(good, len, "t1.weight") + 4 + 8 + 4;
    memcpy(b, good, len);
    put64(b + of, 0); /* overlaps t0 */
    snprintf(s, sizeof s, "offset %zu", of);
    expect_fail(b, len, "overlapping offset", s, "has data offset 0, expected 96");
    memcpy(b, good, len);
    put64(b + of, 1ull << 62);
    expect_fail(b, len, "offset out of range", s, "expected 96");

    /* tensor data past the end of the file */
    of = after(good, len, "t6.weight") + 4 + 4 * 8 + 4;
    snprintf(s, sizeof s, "offset %zu", of);
    expect_fail(good, len - 40, "data past end", s, "past the end of the file");

    /* duplicate key, duplicate tensor name */
    size_t k2 = after(good, len, "a.i32");
    memcpy(b, good, len);
    memcpy(b + k2 - 5, "a.u32", 5);
    snprintf(s, sizeof s, "offset %zu", k2 - 5 - 8);
    expect_fail(b, len, "duplicate key", s, "duplicate key 'a.u32'");
    size_t t1 = after(good, len, "t1.weight");
    memcpy(b, good, len);
    b[t1 - 8] = '0';
    snprintf(s, sizeof s, "offset %zu", t1 - 9 - 8);
    expect_fail(b, len, "duplicate tensor", s, "duplicate tensor name 't0.weight'");

    /* tensor name >= 64 bytes: grow the name length into the following bytes */
    memcpy(b, good, len);
    put64(b + t1 - 9 - 8, 64);
    snprintf(s, sizeof s, "offset %zu", t1 - 9 - 8);
    expect_fail(b, len, "long name", s, "expected < 64");

    /* alignment: wrong type, not a power of two */
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_set_u32(w, "general.alignment", 48);
    nl_gguf_set_u32(w, "x", 1);
    CHECK(nl_gguf_write(w, "test_gguf_align.gguf") == -1 && has("power of two"));
    nl_gguf_set_i32(w, "general.alignment", 32);
    CHECK(nl_gguf_write(w, "test_gguf_align.gguf") == -1 && has("uint32"));
    nl_gguf_set_u32(w, "general.alignment", 16);
    CHECK(nl_gguf_write(w, "test_gguf_align.gguf") == 0);
    nl_gguf_writer_free(w);
    size_t alen;
    uint8_t *ab = read_all("test_gguf_align.gguf", &alen);
    size_t av = after(ab, alen, "general.alignment") + 4;
    ab[av] = 48;
    snprintf(s, sizeof s, "offset %zu", av - 4 - 8 - 17);
    expect_fail(ab, alen, "alignment not pow2", s, "power of two");
    ab[av] = 16;
    put32(ab + av - 4, NL_GGUF_INT32);
    expect_fail(ab, alen, "alignment type", s, "expected uint32");
    free(ab);

    /* empty key */
    memcpy(b, good, len);
    size_t ek = after(good, len, "general.architecture") - 20 - 8;
    put64(b + ek, 0);
    snprintf(s, sizeof s, "offset %zu", ek);
    expect_fail(b, len, "empty key", s, "empty key");

    /* counts larger than the file */
    memcpy(b, good, len);
    put64(b + 16, 1ull << 40);
    expect_fail(b, len, "kv count", "offset", "of KV 15"); /* runs into the tensor infos */
    memcpy(b, good, len);
    put64(b + 8, 1ull << 62);
    expect_fail(b, len, "tensor count", "offset", "tensor info");
    memcpy(b, good, len);
    put64(b + 8, (uint64_t)-1);
    expect_fail(b, len, "tensor count", "offset 8", "tensor count -1");

    /* files: missing, empty, directory */
    CHECK(nl_gguf_open("/nonexistent/x.gguf") == NULL && has("/nonexistent/x.gguf") && has("cannot open"));
    FILE *f = fopen("test_gguf_empty.gguf", "wb");
    fclose(f);
    CHECK(nl_gguf_open("test_gguf_empty.gguf") == NULL && has("test_gguf_empty.gguf") && has("not a GGUF"));
    CHECK(nl_gguf_open(".") == NULL && has("not a regular file"));
    w = nl_gguf_writer_new();
    CHECK(nl_gguf_write(w, "/nonexistent/dir/x.gguf") == -1 && has("/nonexistent/dir/x.gguf.tmp"));
    nl_gguf_writer_free(w);

    free(b);
    free(good);
}

/* ---- every prefix length; random single-byte corruption */
static void test_truncation_and_fuzz(void) {
    size_t len;
    uint8_t *blobs;
    uint8_t *good = make_file("test_gguf_fuzz.gguf", 0, &len, &blobs);
    free(blobs);
    nl_gguf *g0 = nl_gguf_open_buffer(good, len, LABEL);
    CHECK(g0 != NULL);
    if (!g0) {
        free(good);
        return;
    }
    const nl_gguf_tensor *last = &g0->tensors[g0->n_tensors - 1];
    size_t need = (size_t)(g0->data_offset + last->offset + last->nbytes);
    nl_gguf_close(g0);
    int bad_ok = 0, bad_fail = 0, bad_msg = 0;
    for (size_t n = 0; n <= len; n++) {
        uint8_t *c;
        nl_gguf *g = parse_copy(good, n, &c);
        if (n < need) {
            if (g) bad_ok++;
            else if (!has(LABEL) || !has("offset")) bad_msg++;
        } else if (!g) bad_fail++;
        nl_gguf_close(g);
        free(c);
    }
    CHECKF(bad_ok == 0, "%d truncated prefixes parsed", bad_ok);
    CHECKF(bad_fail == 0, "%d complete prefixes failed", bad_fail);
    CHECKF(bad_msg == 0, "%d errors lack label/offset", bad_msg);

    /* Random single-byte corruption: must never crash or read outside the buffer; when a
     * corrupted file parses, touch everything it points at (ASan checks the bounds). */
    int parsed = 0;
    uint64_t sink = 0;
    for (int it = 0; it < 3000; it++) {
        uint8_t *c = malloc(len);
        memcpy(c, good, len);
        size_t pos = (size_t)((nl_t_rand() * 0.5 + 0.5) * (double)len) % len;
        /* bias toward the header/infos where structure lives */
        if (it % 2) pos %= (len < 700 ? len : 700);
        uint8_t val = (uint8_t)((nl_t_rand() * 0.5 + 0.5) * 256);
        if (it % 5 == 0) val = (uint8_t)(c[pos] ^ 0x80);
        c[pos] = val;
        nl_gguf *g = nl_gguf_open_buffer(c, len, LABEL);
        if (g) {
            parsed++;
            for (int64_t i = 0; i < g->n_kv; i++) {
                const nl_gguf_kv *kv = &g->kv[i];
                sink += strlen(kv->key);
                if (kv->str) sink += strlen(kv->str);
                if (kv->arr_str)
                    for (uint64_t j = 0; j < kv->arr_n; j++) sink += kv->arr_str_len[j] + strlen(kv->arr_str[j]);
                if (kv->arr_data && kv->arr_n) {
                    double dd;
                    sink += nl_gguf_arr_f64(kv, kv->arr_n - 1, &dd) == 0;
                }
            }
            for (int64_t i = 0; i < g->n_tensors; i++) {
                const nl_gguf_tensor *t = &g->tensors[i];
                if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
            }
            nl_gguf_close(g);
        } else {
            CHECK(has(LABEL));
        }
        free(c);
    }
    printf("fuzz: %d of 3000 corrupted files still parsed (sink %llu)\n", parsed, (unsigned long long)sink);
    free(good);
}

int main(void) {
    test_all_scalar_types();
    test_round_trip(0);
    test_round_trip(64);
    test_vocab_files();
    test_malformed();
    test_truncation_and_fuzz();
    remove("test_gguf_scalars.gguf");
    remove("test_gguf_rt.gguf");
    remove("test_gguf_rt2.gguf");
    remove("test_gguf_bad.gguf");
    remove("test_gguf_align.gguf");
    remove("test_gguf_empty.gguf");
    remove("test_gguf_fuzz.gguf");
    return nl_t_done();
}

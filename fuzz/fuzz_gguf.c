/* fuzz_gguf: the GGUF reader (nl_gguf_open_buffer) on arbitrary bytes.
 *
 * The input is the whole file. When it parses, every KV and tensor is walked through the
 * public accessors, and the reader's promises are checked:
 *   - every string (key, value, array element) is NUL-terminated within its recorded length
 *     and lies in memory the reader owns (ASan checks the reads);
 *   - numeric array payloads and tensor data lie inside the input buffer (checked by
 *     address, and every byte is read so ASan would also see an overrun);
 *   - tensor data starts at data_offset + offset, is aligned (relative to the file) to the
 *     file's alignment, has the byte size its type and shape imply, and tensors do not overlap;
 *   - lookups by key / name find the same entry (keys and names are unique);
 *   - the typed getters agree with the stored type.
 * Then the KVs are copied into a writer (nl_gguf_copy_kvs), which must accept anything the
 * reader accepted. */
#include <math.h>

#include "common.h"
#include "model/gguf.h"

static volatile uint64_t sink; /* keeps the byte reads alive */

static void touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += b[i];
    sink += s;
}

static bool inside(const uint8_t *base, size_t size, const void *p, uint64_t n) {
    const uint8_t *q = p;
    return q >= base && n <= size && (uint64_t)(q - base) <= size - n;
}

static size_t elem_size(int t) {
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
    default: return 0;
    }
}

static bool is_int_type(int t) {
    return t == NL_GGUF_UINT8 || t == NL_GGUF_INT8 || t == NL_GGUF_UINT16 || t == NL_GGUF_INT16 ||
           t == NL_GGUF_UINT32 || t == NL_GGUF_INT32 || t == NL_GGUF_UINT64 || t == NL_GGUF_INT64;
}

static void walk_kv(const nl_gguf *g, const nl_gguf_kv *kv, const uint8_t *data, size_t size) {
    FUZZ_CHECK(kv->key != NULL, "KV without key");
    FUZZ_CHECK(nl_gguf_get(g, kv->key) == kv, "lookup of key '%s' found another entry", kv->key);
    FUZZ_CHECK(kv->type >= 0 && kv->type <= NL_GGUF_FLOAT64, "type %d", kv->type);
    (void)nl_gguf_vtype_name(kv->type);

    /* typed getters: consistent with the stored type */
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    const char *s;
    int r = nl_gguf_get_str(g, kv->key, &s);
    FUZZ_CHECK((r == 0) == (kv->type == NL_GGUF_STRING), "get_str %d on type %d", r, kv->type);
    if (r == 0) FUZZ_CHECK(s == kv->str, "get_str returned another string");
    r = nl_gguf_get_bool(g, kv->key, &b);
    FUZZ_CHECK((r == 0) == (kv->type == NL_GGUF_BOOL), "get_bool %d on type %d", r, kv->type);
    r = nl_gguf_get_i64(g, kv->key, &i64);
    if (r == 0) FUZZ_CHECK(is_int_type(kv->type), "get_i64 ok on type %d", kv->type);
    if (!is_int_type(kv->type)) FUZZ_CHECK(r == -1, "get_i64 %d on type %d", r, kv->type);
    r = nl_gguf_get_u32(g, kv->key, &u32);
    if (r == 0) FUZZ_CHECK(is_int_type(kv->type), "get_u32 ok on type %d", kv->type);
    r = nl_gguf_get_f32(g, kv->key, &f32);
    FUZZ_CHECK(r != 1, "get_f32 says absent for a present key");
    (void)nl_last_error();

    if (kv->type == NL_GGUF_STRING) {
        FUZZ_CHECK(kv->str != NULL, "string KV without value");
        touch(kv->str, strlen(kv->str) + 1);
    }
    if (kv->type != NL_GGUF_ARRAY) return;
    FUZZ_CHECK(kv->arr_type >= 0 && kv->arr_type <= NL_GGUF_FLOAT64 && kv->arr_type != NL_GGUF_ARRAY,
               "array element type %d", kv->arr_type);
    if (kv->arr_type == NL_GGUF_STRING) {
        FUZZ_CHECK(kv->arr_str && kv->arr_str_len, "string array without storage");
        /* each element needs its 8-byte length in the file */
        FUZZ_CHECK(kv->arr_n <= size / 8, "%llu strings in a %zu-byte file", (unsigned long long)kv->arr_n, size);
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            FUZZ_CHECK(kv->arr_str[j] != NULL, "string %llu missing", (unsigned long long)j);
            FUZZ_CHECK(kv->arr_str_len[j] <= size, "string length %llu > file", (unsigned long long)kv->arr_str_len[j]);
            touch(kv->arr_str[j], kv->arr_str_len[j] + 1); /* bytes + terminator are readable */
            FUZZ_CHECK(kv->arr_str[j][kv->arr_str_len[j]] == 0, "string %llu not terminated", (unsigned long long)j);
        }
        int64_t x;
        FUZZ_CHECK(nl_gguf_arr_i64(kv, 0, &x) != 0, "arr_i64 on a string array succeeded");
        return;
    }
    size_t es = elem_size(kv->arr_type);
    FUZZ_CHECK(es > 0, "element size");
    FUZZ_CHECK(kv->arr_n <= size / es, "array of %llu x %zu bytes in a %zu-byte file", (unsigned long long)kv->arr_n,
               es, size);
    FUZZ_CHECK(kv->arr_n == 0 || inside(data, size, kv->arr_data, kv->arr_n * es), "array payload outside the input");
    if (kv->arr_n) touch(kv->arr_data, kv->arr_n * es);
    /* element accessors: in range ok, first out-of-range index refused */
    uint64_t n_probe = kv->arr_n < 64 ? kv->arr_n : 64;
    for (uint64_t j = 0; j < n_probe; j++) {
        uint64_t idx = j < 32 ? j : kv->arr_n - 1 - (j - 32); /* the first and the last ones */
        int64_t x;
        double d;
        int ri = nl_gguf_arr_i64(kv, idx, &x), rf = nl_gguf_arr_f64(kv, idx, &d);
        FUZZ_CHECK(rf == 0, "arr_f64[%llu] failed: %s", (unsigned long long)idx, nl_last_error());
        /* a uint64 above INT64_MAX is refused by design ("does not fit int64") */
        bool fits = true;
        if (kv->arr_type == NL_GGUF_UINT64) { /* the raw element: a double cannot tell 2^63-1 from 2^63 */
            const uint8_t *e = (const uint8_t *)kv->arr_data + idx * 8;
            fits = (e[7] & 0x80) == 0;
        }
        if ((is_int_type(kv->arr_type) || kv->arr_type == NL_GGUF_BOOL) && fits)
            FUZZ_CHECK(ri == 0, "arr_i64 on an integer array failed: %s", nl_last_error());
        if (ri == 0 && rf == 0 && fits)
            FUZZ_CHECK((double)x == d, "arr_i64 %lld and arr_f64 %.17g disagree", (long long)x, d);
        if (!fits) FUZZ_CHECK(ri != 0, "arr_i64 accepted a uint64 above INT64_MAX");
    }
    int64_t x;
    double d;
    FUZZ_CHECK(nl_gguf_arr_i64(kv, kv->arr_n, &x) != 0, "arr_i64 accepted index n");
    FUZZ_CHECK(nl_gguf_arr_f64(kv, kv->arr_n, &d) != 0, "arr_f64 accepted index n");
    FUZZ_CHECK(nl_gguf_arr_f64(kv, UINT64_MAX, &d) != 0, "arr_f64 accepted index 2^64-1");
}

static void walk_tensors(const nl_gguf *g, const uint8_t *data, size_t size) {
    uint64_t prev_end = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        FUZZ_CHECK(t->name && strlen(t->name) < NL_GGUF_MAX_NAME, "tensor %lld name", (long long)i);
        FUZZ_CHECK(nl_gguf_tensor_find(g, t->name) == t, "lookup of tensor '%s' found another entry", t->name);
        FUZZ_CHECK(t->n_dims <= NL_GGUF_MAX_DIMS, "n_dims %u", t->n_dims);
        for (uint32_t d = t->n_dims; d < NL_GGUF_MAX_DIMS; d++)
            FUZZ_CHECK(t->ne[d] == 1, "missing dim %u is %lld", d, (long long)t->ne[d]);
        int blck;
        size_t bb;
        FUZZ_CHECK(nl_gguf_type_info(t->type, &blck, &bb) == 0 && blck > 0 && bb > 0, "type %d", t->type);
        /* nbytes = (elements / blck) * block bytes, with ne0 a whole number of blocks */
        uint64_t n = 1;
        bool ovf = false;
        for (int d = 0; d < NL_GGUF_MAX_DIMS; d++) {
            FUZZ_CHECK(t->ne[d] >= 0, "ne[%d] = %lld", d, (long long)t->ne[d]);
            if (nl_mul_ok(n, (uint64_t)t->ne[d], &n)) ovf = true;
        }
        FUZZ_CHECK(!ovf, "element count overflows but the tensor was accepted");
        FUZZ_CHECK(t->ne[0] % blck == 0, "ne0 %lld not a multiple of the block %d", (long long)t->ne[0], blck);
        uint64_t want = 0;
        FUZZ_CHECK(nl_mul_ok(n / (uint64_t)blck, bb, &want) == 0 && want == t->nbytes, "nbytes %llu, expected %llu",
                   (unsigned long long)t->nbytes, (unsigned long long)want);
        FUZZ_CHECK(t->offset % g->alignment == 0, "offset %llu not aligned to %u", (unsigned long long)t->offset,
                   g->alignment);
        FUZZ_CHECK(t->offset >= prev_end, "tensor '%s' overlaps the previous one", t->name);
        FUZZ_CHECK(t->data == data + g->data_offset + t->offset, "data pointer of '%s'", t->name);
        FUZZ_CHECK(inside(data, size, t->data, t->nbytes), "tensor '%s' data outside the input", t->name);
        touch(t->data, t->nbytes);
        prev_end = t->offset + t->nbytes;
    }
    FUZZ_CHECK(g->data_offset <= size, "data_offset %llu > size %zu", (unsigned long long)g->data_offset, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nl_gguf *g = nl_gguf_open_buffer(data, size, "fuzz.gguf");
    if (!g) {
        const char *e = nl_last_error();
        FUZZ_NOTE("refused: %s", e);
        FUZZ_CHECK(e && !strncmp(e, "fuzz.gguf", 9), "error does not name the input: %s", e);
        return 0;
    }
    FUZZ_CHECK(g->base == data && g->size == size, "handle does not describe the input");
    FUZZ_CHECK(g->version == 2 || g->version == 3, "version %u", g->version);
    FUZZ_CHECK(g->alignment && (g->alignment & (g->alignment - 1)) == 0, "alignment %u", g->alignment);
    FUZZ_CHECK(g->n_kv >= 0 && g->n_tensors >= 0, "counts");
    for (int64_t i = 0; i < g->n_kv; i++) walk_kv(g, &g->kv[i], data, size);
    walk_tensors(g, data, size);
    FUZZ_CHECK(nl_gguf_get(g, "\x01no such key") == NULL, "phantom key");
    FUZZ_CHECK(nl_gguf_tensor_find(g, "\x01no such tensor") == NULL, "phantom tensor");

    nl_gguf_writer *w = nl_gguf_writer_new();
    FUZZ_CHECK(w != NULL, "writer");
    FUZZ_CHECK(nl_gguf_copy_kvs(w, g) == 0, "copy_kvs refused a file the reader accepted: %s", nl_last_error());
    for (int64_t i = 0; i < g->n_tensors && i < 16; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        int n_dims = t->n_dims ? (int)t->n_dims : 1;
        /* the writer may refuse shapes the reader tolerates (e.g. 0 dims); it must not crash */
        (void)nl_gguf_add_tensor(w, t->name, t->type, n_dims, t->ne, t->data, true);
    }
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    return 0;
}

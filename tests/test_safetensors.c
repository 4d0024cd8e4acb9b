/* model/safetensors: a written file reads back (names, dtypes, shapes, values, metadata, the
 * 8-aligned header), and every malformed file is refused with a message naming the file and the
 * offset: too short, a header length past the end, a header that is not JSON or not an object,
 * offsets outside the data, a size that does not match the shape, a dtype not read, overlapping
 * tensors, bytes of no tensor, a truncated file. */
#include <stdint.h>

#include "model/quant.h"
#include "model/safetensors.h"
#include "test.h"
#include "util/util.h"

/* A file from a header text and n data bytes (value i = i): u64 length, header, data. */
static size_t build(uint8_t *buf, const char *header, size_t n_data) {
    uint64_t h = strlen(header);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < n_data; i++) buf[8 + h + i] = (uint8_t)i;
    return 8 + h + n_data;
}

/* The buffer is refused and the message has every needle (NULL-terminated). */
static void refused(const uint8_t *buf, size_t len, const char *const *needles) {
    nl_safetensors *st = nl_st_open_buffer(buf, len, "bad.safetensors");
    CHECK(st == NULL);
    nl_st_close(st);
    const char *e = nl_last_error();
    int all = strstr(e, "bad.safetensors: ") == e;
    for (; *needles; needles++) all &= strstr(e, *needles) != NULL;
    CHECKF(all, "message: %s", e);
}
#define REFUSED(buf, len, ...) refused(buf, len, (const char *const[]){__VA_ARGS__, NULL})

static void test_round_trip(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float a[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e-3f};
    uint16_t h[3], b[4];
    const float hv[3] = {0.5f, -65504.0f, 1.0f / 1024}, bv[4] = {1.0f, -3.0f, 256.0f, 0.0078125f};
    for (int i = 0; i < 3; i++) nl_type_get(NL_TYPE_F16)->from_float(&hv[i], &h[i], 1);
    for (int i = 0; i < 4; i++) b[i] = nl_f32_to_bf16(bv[i]);
    nl_st_out t[4] = {
        {.name = "a.weight", .dtype = NL_ST_F32, .n_dims = 2, .shape = {2, 3}, .data = a},
        {.name = "half \"quoted\"", .dtype = NL_ST_F16, .n_dims = 1, .shape = {3}, .data = h},
        {.name = "brain", .dtype = NL_ST_BF16, .n_dims = 3, .shape = {1, 2, 2}, .data = b},
        {.name = "empty", .dtype = NL_ST_F32, .n_dims = 2, .shape = {0, 4}, .data = a},
    };
    static const char *const meta[] = {"format", "pt", "note", "a\nb", NULL};
    CHECK(nl_st_write(path, t, 4, meta) == 0);
    nl_safetensors *st = nl_st_open(path);
    CHECKF(st != NULL, "%s", nl_last_error());
    if (!st) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (uint8_t)st->buf[i];
    CHECK(hl % 8 == 0);
    CHECK(st->n == 4);
    CHECK(st->len == 8 + hl + 24 + 6 + 8);
    CHECK(nl_st_meta(st, "format") && !strcmp(nl_st_meta(st, "format"), "pt"));
    CHECK(nl_st_meta(st, "note") && !strcmp(nl_st_meta(st, "note"), "a\nb"));
    CHECK(nl_st_meta(st, "none") == NULL);
    const nl_st_tensor *ta = nl_st_find(st, "a.weight"), *th = nl_st_find(st, "half \"quoted\""),
                       *tb = nl_st_find(st, "brain"), *te = nl_st_find(st, "empty");
    CHECK(ta && th && tb && te && !nl_st_find(st, "a"));
    if (ta && th && tb && te) {
        CHECK(ta->dtype == NL_ST_F32 && ta->n_dims == 2 && ta->shape[0] == 2 && ta->shape[1] == 3 && ta->n_elems == 6);
        CHECK(ta->offset == 8 + hl && ta->nbytes == 24);
        float o[6];
        nl_st_to_f32(ta, o);
        CHECK(memcmp(o, a, sizeof a) == 0);
        CHECK(th->dtype == NL_ST_F16 && th->n_elems == 3);
        nl_st_to_f32(th, o);
        CHECK(o[0] == hv[0] && o[1] == hv[1] && o[2] == hv[2]);
        CHECK(tb->dtype == NL_ST_BF16 && tb->n_dims == 3 && tb->n_elems == 4);
        nl_st_to_f32(tb, o);
        CHECK(o[0] == bv[0] && o[1] == bv[1] && o[2] == bv[2] && o[3] == bv[3]);
        CHECK(te->n_elems == 0 && te->nbytes == 0);
    }
    /* cut anywhere: refused, never read past the end */
    size_t len = st->len;
    char *copy = malloc(len);
    memcpy(copy, st->buf, len);
    nl_st_close(st);
    int all_refused = 1;
    for (size_t cut = 0; cut < len; cut++) {
        nl_safetensors *s2 = nl_st_open_buffer(copy, cut, "cut");
        all_refused &= s2 == NULL;
        nl_st_close(s2);
    }
    CHECK(all_refused);
    nl_st_close(nl_st_open_buffer(copy, len - 1, "bad.safetensors"));
    CHECKF(strstr(nl_last_error(), "do not lie in") != NULL, "%s", nl_last_error());
    free(copy);
}

static void test_malformed(void) {
    uint8_t buf[1024];
    size_t n;
    REFUSED(buf, 5, "offset 0", "too short");
    n = build(buf, "{}", 0);
    buf[0] = 200; /* header length past the end */
    REFUSED(buf, n, "offset 0", "header length 200 runs past the end of the file (size 10)");
    n = build(buf, "{\"a\":", 0);
    REFUSED(buf, n, "offset 13", "not valid JSON");
    n = build(buf, "[1, 2]", 0);
    REFUSED(buf, n, "offset 8", "the header is a array, expected an object");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8);
    REFUSED(buf, n, "offset ", "tensor 'w'", "data_offsets [0, 16) do not lie in the 8 data bytes");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    REFUSED(buf, n, "offset 55", "tensor 'w': data_offsets [0, 8) hold 8 bytes, its F32 shape [3] needs 12");
    n = build(buf, "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    REFUSED(buf, n, "offset 22", "has dtype F64: nightlora reads F32, F16 or BF16");
    n = build(buf, "{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    REFUSED(buf, n, "unknown dtype 'Q4'");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    REFUSED(buf, n, "offset 37", "a shape entry is not a non-negative integer");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8);
    REFUSED(buf, n, "offset 36", "the shape's element count overflows");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 8);
    REFUSED(buf, n, "data_offsets [4, 0) do not lie in");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
    REFUSED(buf, n, "tensor 'w' has no data_offsets");
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4);
    REFUSED(buf, n, "unknown field 'extra'");
    n = build(buf, "{\"w\":[1]}", 0);
    REFUSED(buf, n, "tensor 'w' is described by a array");
    n = build(buf, "{\"__metadata__\":{\"k\":1}}", 0);
    REFUSED(buf, n, "__metadata__ 'k' is a number, expected a string");
    n = build(buf,
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8);
    REFUSED(buf, n, "tensor 'y' data", "overlaps tensor 'x'");
    n = build(buf, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    REFUSED(buf, n, "bytes [", "belong to no tensor");
    n = build(buf, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8);
    REFUSED(buf, n, "the 4 bytes after the last tensor belong to no tensor");
    /* a well-formed one is read (the checks above do not refuse everything) */
    n = build(buf, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},\"__metadata__\":{}}", 4);
    nl_safetensors *st = nl_st_open_buffer(buf, n, "good");
    CHECKF(st && st->n == 1 && st->t[0].dtype == NL_ST_BF16, "%s", nl_last_error());
    nl_st_close(st);
    CHECK(nl_st_open("/nonexistent/x.safetensors") == NULL && strstr(nl_last_error(), "/nonexistent/x.safetensors"));
}

int main(void) {
    char dir[256];
    if (nl_t_tmpdir(dir, sizeof dir, "safetensors")) return 1;
    test_round_trip(dir);
    test_malformed();
    nl_t_tmpdir_done(dir);
    return nl_t_done();
}

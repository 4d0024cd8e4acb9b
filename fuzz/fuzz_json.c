/* fuzz_json: the strict JSON parser (nl_json_parse) on arbitrary bytes.
 *
 * Oracles, each independent of the parser's own code:
 *   - an accepted document is valid UTF-8 (harness's own decoder) and contains no raw control
 *     byte other than TAB, LF, CR (strict RFC 8259: they are not allowed inside strings and
 *     are not whitespace);
 *   - its nesting is at most NL_JSON_MAX_DEPTH;
 *   - every number equals strtod of its own source text (found from the node's offset), and
 *     is_int numbers are exact integers;
 *   - every string / key node's offset points at a '"';
 *   - the accessors agree with the DOM (nl_json_get/getn/at/len/int64);
 *   - serialising the DOM (nl_json_escape for strings, %.17g for numbers) and parsing it again
 *     gives an equal DOM, and serialising that gives the same bytes;
 *   - a rejected document gets an error offset within the input and a message.
 * The input is passed with its exact length and no terminator, so a read past it is an ASan
 * report. */
#include <math.h>

#include "common.h"
#include "util/json.h"

typedef struct {
    char *buf;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        b->buf = realloc(b->buf, cap);
        FUZZ_CHECK(b->buf != NULL, "oom");
        b->cap = cap;
    }
    memcpy(b->buf + b->n, s, n);
    b->n += n;
    b->buf[b->n] = 0;
}

static void emit(sbuf *b, const nl_json *v) {
    char num[64];
    switch (v->type) {
    case NL_JSON_NULL: put(b, "null", 4); break;
    case NL_JSON_FALSE: put(b, "false", 5); break;
    case NL_JSON_TRUE: put(b, "true", 4); break;
    case NL_JSON_NUMBER: {
        /* "-0" is integer text with i = 0: print it from d to keep the sign */
        int k = v->u.num.is_int && !(v->u.num.i == 0 && signbit(v->u.num.d))
                    ? snprintf(num, sizeof num, "%lld", (long long)v->u.num.i)
                    : snprintf(num, sizeof num, "%.17g", v->u.num.d);
        put(b, num, (size_t)k);
        break;
    }
    case NL_JSON_STRING:
        FUZZ_CHECK(nl_json_escape(&b->buf, &b->n, &b->cap, v->u.str.s, v->u.str.len) == 0, "escape failed");
        break;
    case NL_JSON_ARRAY:
        put(b, "[", 1);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) put(b, ",", 1);
            emit(b, &v->u.arr.items[i]);
        }
        put(b, "]", 1);
        break;
    case NL_JSON_OBJECT:
        put(b, "{", 1);
        for (size_t i = 0; i < v->u.obj.n; i++) {
            const nl_json_member *m = &v->u.obj.members[i];
            if (i) put(b, ",", 1);
            FUZZ_CHECK(nl_json_escape(&b->buf, &b->n, &b->cap, m->key, m->key_len) == 0, "escape failed");
            put(b, ":", 1);
            emit(b, &m->value);
        }
        put(b, "}", 1);
        break;
    }
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void equal(const nl_json *a, const nl_json *b) {
    FUZZ_CHECK(a->type == b->type, "type %d vs %d after a round trip", a->type, b->type);
    switch (a->type) {
    case NL_JSON_NUMBER:
        FUZZ_CHECK(same_double(a->u.num.d, b->u.num.d), "number %.17g vs %.17g after a round trip", a->u.num.d,
                   b->u.num.d);
        if (a->u.num.is_int && b->u.num.is_int) FUZZ_CHECK(a->u.num.i == b->u.num.i, "integer changed");
        break;
    case NL_JSON_STRING:
        FUZZ_CHECK(a->u.str.len == b->u.str.len && !memcmp(a->u.str.s, b->u.str.s, a->u.str.len), "string changed");
        break;
    case NL_JSON_ARRAY:
        FUZZ_CHECK(a->u.arr.n == b->u.arr.n, "array length changed");
        for (size_t i = 0; i < a->u.arr.n; i++) equal(&a->u.arr.items[i], &b->u.arr.items[i]);
        break;
    case NL_JSON_OBJECT:
        FUZZ_CHECK(a->u.obj.n == b->u.obj.n, "member count changed");
        for (size_t i = 0; i < a->u.obj.n; i++) {
            const nl_json_member *x = &a->u.obj.members[i], *y = &b->u.obj.members[i];
            FUZZ_CHECK(x->key_len == y->key_len && !memcmp(x->key, y->key, x->key_len), "key changed");
            equal(&x->value, &y->value);
        }
        break;
    default: break;
    }
}

/* Checks one node against the source text; returns its depth (scalars 0). */
static int check(const nl_json *v, const uint8_t *src, size_t len) {
    FUZZ_CHECK(v->offset < len, "offset %zu outside the %zu-byte input", v->offset, len);
    switch (v->type) {
    case NL_JSON_NULL: FUZZ_CHECK(src[v->offset] == 'n', "null at a '%c'", src[v->offset]); return 0;
    case NL_JSON_FALSE: FUZZ_CHECK(src[v->offset] == 'f', "false at a '%c'", src[v->offset]); return 0;
    case NL_JSON_TRUE: FUZZ_CHECK(src[v->offset] == 't', "true at a '%c'", src[v->offset]); return 0;
    case NL_JSON_NUMBER: {
        char text[512];
        size_t k = 0;
        while (v->offset + k < len && k + 1 < sizeof text && strchr("+-0123456789.eE", src[v->offset + k]) &&
               src[v->offset + k])
            text[k] = (char)src[v->offset + k], k++;
        text[k] = 0;
        FUZZ_CHECK(k > 0, "number at a '%c'", src[v->offset]);
        if (k + 1 < sizeof text) { /* a very long number is not re-read here */
            double d = strtod(text, NULL);
            FUZZ_CHECK(same_double(d, v->u.num.d), "'%s' parsed as %.17g, strtod gives %.17g", text, v->u.num.d, d);
            bool int_text = !strpbrk(text, ".eE");
            if (v->u.num.is_int) {
                FUZZ_CHECK(int_text, "'%s' is not integer text but is_int", text);
                FUZZ_CHECK(strtoll(text, NULL, 10) == v->u.num.i, "'%s' is_int with i = %lld", text,
                           (long long)v->u.num.i);
            }
        }
        int64_t i;
        if (nl_json_int64(v, &i) == 0) {
            FUZZ_CHECK(v->u.num.is_int || (v->u.num.d == (double)i && fabs(v->u.num.d) <= 9007199254740992.0),
                       "int64 %lld from %.17g", (long long)i, v->u.num.d);
            if (v->u.num.is_int) FUZZ_CHECK(i == v->u.num.i, "int64 disagrees with is_int value");
        } else {
            FUZZ_CHECK(!v->u.num.is_int, "int64 refused an is_int number");
        }
        return 0;
    }
    case NL_JSON_STRING:
        FUZZ_CHECK(src[v->offset] == '"', "string at a '%c'", src[v->offset]);
        FUZZ_CHECK(v->u.str.s[v->u.str.len] == 0, "string not terminated");
        FUZZ_CHECK(fuzz_utf8_valid((const uint8_t *)v->u.str.s, v->u.str.len), "decoded string is not UTF-8");
        return 0;
    case NL_JSON_ARRAY: {
        FUZZ_CHECK(src[v->offset] == '[', "array at a '%c'", src[v->offset]);
        FUZZ_CHECK(nl_json_len(v) == v->u.arr.n, "len");
        FUZZ_CHECK(nl_json_at(v, v->u.arr.n) == NULL && nl_json_get(v, "a") == NULL, "array accessors");
        int depth = 0;
        for (size_t i = 0; i < v->u.arr.n; i++) {
            FUZZ_CHECK(nl_json_at(v, i) == &v->u.arr.items[i], "at(%zu)", i);
            int d = check(&v->u.arr.items[i], src, len);
            if (d > depth) depth = d;
        }
        return depth + 1;
    }
    case NL_JSON_OBJECT: {
        FUZZ_CHECK(src[v->offset] == '{', "object at a '%c'", src[v->offset]);
        FUZZ_CHECK(nl_json_len(v) == v->u.obj.n && nl_json_at(v, 0) == NULL, "object accessors");
        int depth = 0;
        for (size_t i = 0; i < v->u.obj.n; i++) {
            const nl_json_member *m = &v->u.obj.members[i];
            FUZZ_CHECK(m->key_offset < len && src[m->key_offset] == '"', "key offset");
            FUZZ_CHECK(m->key[m->key_len] == 0, "key not terminated");
            FUZZ_CHECK(fuzz_utf8_valid((const uint8_t *)m->key, m->key_len), "decoded key is not UTF-8");
            const nl_json *g = nl_json_getn(v, m->key, m->key_len);
            FUZZ_CHECK(g != NULL && g->offset == m->value.offset && g->type == m->value.type, "getn of member %zu", i);
            if (strlen(m->key) == m->key_len) FUZZ_CHECK(nl_json_get(v, m->key) == g, "get disagrees with getn");
            for (size_t j = 0; j < i; j++) /* keys are unique (small objects only: quadratic) */
                if (i < 64)
                    FUZZ_CHECK(v->u.obj.members[j].key_len != m->key_len ||
                                   memcmp(v->u.obj.members[j].key, m->key, m->key_len),
                               "duplicate key accepted");
            int d = check(&m->value, src, len);
            if (d > depth) depth = d;
        }
        return depth + 1;
    }
    }
    FUZZ_CHECK(0, "unknown type %d", (int)v->type);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nl_json_error err;
    memset(&err, 0, sizeof err);
    nl_json *root = nl_json_parse((const char *)data, size, &err);
    if (!root) {
        FUZZ_CHECK(err.offset <= size, "error offset %zu past the %zu-byte input", err.offset, size);
        FUZZ_CHECK(err.msg[0] != 0, "empty error message");
        int line = 0, col = 0;
        nl_json_linecol((const char *)data, size, err.offset, &line, &col);
        FUZZ_CHECK(line >= 1 && col >= 1, "linecol %d:%d", line, col);
        return 0;
    }
    FUZZ_CHECK(fuzz_utf8_valid(data, size), "accepted a document that is not valid UTF-8");
    for (size_t i = 0; i < size; i++)
        FUZZ_CHECK(data[i] >= 0x20 || data[i] == '\t' || data[i] == '\n' || data[i] == '\r',
                   "accepted a raw control byte 0x%02x at offset %zu", data[i], i);
    int depth = check(root, data, size);
    FUZZ_CHECK(depth <= NL_JSON_MAX_DEPTH, "accepted nesting depth %d", depth);

    sbuf a = {0}, b = {0};
    emit(&a, root);
    nl_json *again = nl_json_parse(a.buf, a.n, &err);
    FUZZ_CHECK(again != NULL, "re-parse of the serialised document failed at %zu: %s\n%s", err.offset, err.msg, a.buf);
    equal(root, again);
    emit(&b, again);
    FUZZ_CHECK(a.n == b.n && !memcmp(a.buf, b.buf, a.n), "serialisation is not stable");
    nl_json_free(again);
    nl_json_free(root);
    free(a.buf);
    free(b.buf);
    return 0;
}

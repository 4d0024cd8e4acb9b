/* util/json: RFC 8259 valid and invalid inputs, decoded values, error offsets, limits. */
#include <stdint.h>

#include "util/json.h"
#include "util/yaml.h"
#include "test.h"
#include "util/util.h"

/* Valid documents (parsed with strlen as length). */
static const char *valid[] = {
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1",
    "-1",
    "123",
    "1.5",
    "-1.5e10",
    "1E2",
    "1e+2",
    "1e-2",
    "0.0",
    "0e0",
    "0E-0",
    "1.7976931348623157e308",
    "5e-324",
    "1e-400",
    "\"\"",
    "\"a\"",
    "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
    "\"\\u0041\"",
    "\"\\uD83D\\uDE00\"",
    "\"\xc3\xa9\"",
    "\"\xe2\x82\xac\"",
    "\"\xf0\x9f\x98\x80\"",
    "\"\xef\xbf\xbf\"",
    "\"\xf4\x8f\xbf\xbf\"",
    "\"\x7f\"",
    "[]",
    "{}",
    "[ ]",
    "{ }",
    " \t\r\n[1,2,3] \t\r\n",
    "[[[]]]",
    "{\"a\":{\"b\":[null]}}",
    "[1,\"x\",true,false,null,{},[]]",
    "{\"\":0}",
    "{\"a\":1,\"b\":2}",
    "{\"a\":1,\"A\":2}",
    "[-0.0e-0]",
    "{\"\\u0000\":1,\"\\u0000a\":2}",
    "[1e308]",
    "[-1e308]",
    "\"\\u00e9\"",
    "\"\\uDBFF\\uDFFF\"",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
};

typedef struct {
    const char *text;
    size_t len;         /* 0: strlen */
    size_t offset;      /* expected error offset */
    const char *needle; /* substring expected in the message */
} bad_case;

static const bad_case invalid[] = {
    {"", 0, 0, "expected a value"},
    {"   ", 0, 3, "end of input"},
    {"[1,]", 0, 3, "trailing comma"},
    {"{\"a\":1,}", 0, 7, "trailing comma"},
    {"[1 2]", 0, 3, "expected ',' or ']'"},
    {"{\"a\" 1}", 0, 5, "expected ':'"},
    {"{a:1}", 0, 1, "expected a string key"},
    {"{'a':1}", 0, 1, "expected a string key"},
    {"['a']", 0, 1, "expected a value"},
    {"01", 0, 0, "leading zeros"},
    {"-01", 0, 0, "leading zeros"},
    {"00", 0, 0, "leading zeros"},
    {"1.", 0, 2, "digit after '.'"},
    {".5", 0, 0, "expected a value"},
    {"+1", 0, 0, "expected a value"},
    {"-", 0, 1, "digit after '-'"},
    {"-a", 0, 1, "digit after '-'"},
    {"1e", 0, 2, "exponent"},
    {"1e+", 0, 3, "exponent"},
    {"1.e5", 0, 2, "digit after '.'"},
    {"0x10", 0, 1, "unexpected 'x'"},
    {"NaN", 0, 0, "expected a value"},
    {"Infinity", 0, 0, "expected a value"},
    {"-Infinity", 0, 1, "digit after '-'"},
    {"1e309", 0, 0, "out of range"},
    {"[0, -1e400]", 0, 4, "out of range"},
    {"tru", 0, 0, "expected 'true'"},
    {"nul", 0, 0, "expected 'null'"},
    {"True", 0, 0, "expected a value"},
    {"truex", 0, 4, "unexpected 'x'"},
    {"[1]]", 0, 3, "unexpected ']'"},
    {"[1] x", 0, 4, "unexpected 'x'"},
    {"{} {}", 0, 3, "unexpected '{'"},
    {"[", 0, 1, "expected a value"},
    {"[1", 0, 0, "unterminated array"},
    {"{", 0, 0, "unterminated object"},
    {"{\"a\":1", 0, 0, "unterminated object"},
    {"\"abc", 0, 0, "unterminated string"},
    {"\"abc\\\"", 0, 0, "unterminated string"},
    {"/* c */ 1", 0, 0, "expected a value"},
    {"[1] // c", 0, 4, "unexpected '/'"},
    {"\"a\tb\"", 0, 2, "control character 0x09"},
    {"\"a\nb\"", 0, 2, "control character 0x0A"},
    {"\"\x01\"", 0, 1, "control character 0x01"},
    {"\"\\x41\"", 0, 1, "invalid escape '\\x'"},
    {"\"\\a\"", 0, 1, "invalid escape"},
    {"\"\\'\"", 0, 1, "invalid escape"},
    {"\"\\u12\"", 0, 1, "four hex digits"},
    {"\"\\u12G4\"", 0, 1, "four hex digits"},
    {"\"\\U0041\"", 0, 1, "invalid escape"},
    {"\"\\uD800\"", 0, 1, "lone high surrogate"},
    {"\"x\\uD800\\u0041\"", 0, 2, "lone high surrogate"},
    {"\"\\uD800\\uD800\"", 0, 1, "lone high surrogate"},
    {"\"\\uDC00\"", 0, 1, "lone low surrogate"},
    {"\"\\uDFFF\\uD800\"", 0, 1, "lone low surrogate"},
    {"\"\xc0\x80\"", 0, 1, "invalid UTF-8"},         /* overlong NUL */
    {"\"\xc1\xbf\"", 0, 1, "invalid UTF-8"},         /* overlong */
    {"\"\xe0\x80\xaf\"", 0, 1, "invalid UTF-8"},     /* overlong '/' */
    {"\"\xf0\x80\x80\xaf\"", 0, 1, "invalid UTF-8"}, /* overlong '/' */
    {"\"\xed\xa0\x80\"", 0, 1, "invalid UTF-8"},     /* U+D800 encoded */
    {"\"\xed\xbf\xbf\"", 0, 1, "invalid UTF-8"},     /* U+DFFF encoded */
    {"\"\xf4\x90\x80\x80\"", 0, 1, "invalid UTF-8"}, /* U+110000 */
    {"\"\xf5\x80\x80\x80\"", 0, 1, "invalid UTF-8"},
    {"\"\xff\"", 0, 1, "invalid UTF-8"},
    {"\"\x80\"", 0, 1, "invalid UTF-8"},         /* stray continuation */
    {"\"ab\xc3\"", 0, 3, "invalid UTF-8"},       /* truncated */
    {"\"\xe2\x82\"", 0, 1, "invalid UTF-8"},     /* truncated */
    {"\"\xe2\x28\xa1\"", 0, 1, "invalid UTF-8"}, /* bad continuation */
    {"\xef\xbb\xbf{}", 0, 0, "byte 0xEF"},       /* BOM */
    {"\xc3\xa9", 0, 0, "byte 0xC3"},             /* non-ASCII outside a string */
    {"{\"a\":1,\"a\":2}", 0, 7, "duplicate key \"a\""},
    {"{\"b\":0,\"a\":1,\"c\":[{\"x\":1,\"x\":1}],\"a\":2}", 0, 25, "duplicate key \"x\""},
    {"{\"\\u0061\":1,\"a\":2}", 0, 12, "duplicate key"},
    {"[1,\x0b"
     "2]",
     0, 3, "expected a value"}, /* vertical tab is not whitespace */
    {"[1,\xc2\xa0"
     "2]",
     0, 3, "expected a value"},                   /* no-break space is not whitespace */
    {"\"a\0b\"", 5, 2, "control character 0x00"}, /* raw NUL */
    {"[1]\0", 4, 3, "unexpected byte 0x00"},
};

static void test_valid(void) {
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) {
        nl_json_error e;
        nl_json *v = nl_json_parse(valid[i], strlen(valid[i]), &e);
        CHECKF(v != NULL, "valid[%zu] %s rejected: %zu: %s", i, valid[i], e.offset, e.msg);
        nl_json_free(v);
    }
}

static void test_invalid(void) {
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        const bad_case *c = &invalid[i];
        size_t len = c->len ? c->len : strlen(c->text);
        nl_json_error e;
        nl_json *v = nl_json_parse(c->text, len, &e);
        CHECKF(v == NULL, "invalid[%zu] accepted", i);
        if (v) {
            nl_json_free(v);
            continue;
        }
        CHECKF(e.offset == c->offset, "invalid[%zu] offset %zu, expected %zu (%s)", i, e.offset, c->offset, e.msg);
        CHECKF(strstr(e.msg, c->needle) != NULL, "invalid[%zu] msg '%s' lacks '%s'", i, e.msg, c->needle);
        /* The error slot carries the same message with the offset. */
        char want[64];
        snprintf(want, sizeof want, "offset %zu: ", c->offset);
        CHECKF(strncmp(nl_last_error(), want, strlen(want)) == 0, "slot '%s'", nl_last_error());
    }
}

static int str_is(const nl_json *v, const char *bytes, size_t n) {
    return v && v->type == NL_JSON_STRING && v->u.str.len == n && memcmp(v->u.str.s, bytes, n) == 0 &&
           v->u.str.s[n] == 0;
}

static void test_values(void) {
    /* Every escape, decoded. */
    const char *t = "[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\\u0000x\", \"\\u00e9\\u20AC\", \"\\uD83D\\uDE00\","
                    " \"\\uDBFF\\uDFFF\", \"\\u007f\\u0080\\u07ff\\u0800\\uffff\", \"\xc3\xa9\"]";
    nl_json *v = nl_json_parse(t, strlen(t), NULL);
    CHECK(v && nl_json_is_array(v) && nl_json_len(v) == 7);
    if (v) {
        CHECK(str_is(nl_json_at(v, 0), "\"\\/\b\f\n\r\t", 8));
        CHECK(str_is(nl_json_at(v, 1), "\0x", 2));
        CHECK(str_is(nl_json_at(v, 2), "\xc3\xa9\xe2\x82\xac", 5));
        CHECK(str_is(nl_json_at(v, 3), "\xf0\x9f\x98\x80", 4));
        CHECK(str_is(nl_json_at(v, 4), "\xf4\x8f\xbf\xbf", 4));
        CHECK(str_is(nl_json_at(v, 5), "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf", 11));
        CHECK(str_is(nl_json_at(v, 6), "\xc3\xa9", 2));
        CHECK(nl_json_at(v, 7) == NULL);
        CHECK(nl_json_at(v, 1)->offset == 21);
    }
    nl_json_free(v);

    /* Numbers. */
    struct {
        const char *t;
        double d;
        int is_int;
        int64_t i;
    } nums[] = {
        {"0", 0, 1, 0},
        {"-0", -0.0, 1, 0},
        {"42", 42, 1, 42},
        {"-17", -17, 1, -17},
        {"1.5", 1.5, 0, 0},
        {"-2.5e-3", -2.5e-3, 0, 0},
        {"1e308", 1e308, 0, 0},
        {"1E+2", 100, 0, 0},
        {"5e-324", 5e-324, 0, 0},
        {"9223372036854775807", 9223372036854775807.0, 1, INT64_MAX},
        {"-9223372036854775808", -9223372036854775808.0, 1, INT64_MIN},
        {"9223372036854775808", 9223372036854775808.0, 0, 0},
        {"123456789012345678901234567890", 1.2345678901234568e29, 0, 0},
        {"0.1", 0.1, 0, 0},
        {"999999999999999999", 1e18, 1, 999999999999999999LL},
        {"-123456789012345678", -123456789012345678.0, 1, -123456789012345678LL},
        {"1234567890123456789", 1234567890123456789.0, 1, 1234567890123456789LL},
        {"2.2250738585072014e-308", 2.2250738585072014e-308, 0, 0},
    };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        nl_json *n = nl_json_parse(nums[i].t, strlen(nums[i].t), NULL);
        CHECKF(n && n->type == NL_JSON_NUMBER, "%s", nums[i].t);
        if (!n) continue;
        CHECKF(n->u.num.d == nums[i].d, "%s -> %.17g", nums[i].t, n->u.num.d);
        CHECKF(n->u.num.is_int == (nums[i].is_int != 0), "%s is_int", nums[i].t);
        if (nums[i].is_int) CHECKF(n->u.num.i == nums[i].i, "%s i", nums[i].t);
        nl_json_free(n);
    }
    nl_json *mz = nl_json_parse("-0", 2, NULL);
    CHECK(mz && signbit(mz->u.num.d));
    nl_json_free(mz);
    nl_json *ul = nl_json_parse("1e-400", 6, NULL);
    CHECK(ul && ul->u.num.d == 0.0);
    nl_json_free(ul);

    /* nl_json_int64: integer text, integral doubles up to 2^53, not fractions. */
    const char *it = "[7, 7.0, 1e3, 7.5, -3, 1e300, \"7\", 9007199254740992.0]";
    nl_json *a = nl_json_parse(it, strlen(it), NULL);
    int64_t x = 0;
    CHECK(a && nl_json_int64(nl_json_at(a, 0), &x) == 0 && x == 7);
    CHECK(a && nl_json_int64(nl_json_at(a, 1), &x) == 0 && x == 7);
    CHECK(a && nl_json_int64(nl_json_at(a, 2), &x) == 0 && x == 1000);
    CHECK(a && nl_json_int64(nl_json_at(a, 3), &x) == -1);
    CHECK(a && nl_json_int64(nl_json_at(a, 4), &x) == 0 && x == -3);
    CHECK(a && nl_json_int64(nl_json_at(a, 5), &x) == -1); /* integral but beyond 2^53 */
    CHECK(a && nl_json_int64(nl_json_at(a, 6), &x) == -1);
    CHECK(a && nl_json_int64(nl_json_at(a, 7), &x) == 0 && x == 9007199254740992LL);
    nl_json_free(a);

    /* Objects: order kept, lookup by key, keys with NUL, type names. */
    const char *ot = "{\"z\": 1, \"a\": [true, false, null], \"k\\u0000\": \"v\", \"\": {}}";
    nl_json *o = nl_json_parse(ot, strlen(ot), NULL);
    CHECK(o && nl_json_is_object(o) && nl_json_len(o) == 4);
    if (o) {
        CHECK(strcmp(o->u.obj.members[0].key, "z") == 0 && o->u.obj.members[0].key_offset == 1);
        CHECK(strcmp(o->u.obj.members[1].key, "a") == 0);
        const nl_json *arr = nl_json_get(o, "a");
        CHECK(nl_json_is_array(arr) && nl_json_len(arr) == 3);
        CHECK(nl_json_at(arr, 0)->type == NL_JSON_TRUE && nl_json_at(arr, 1)->type == NL_JSON_FALSE);
        CHECK(nl_json_is_null(nl_json_at(arr, 2)) && nl_json_is_bool(nl_json_at(arr, 0)));
        CHECK(nl_json_get(o, "k") == NULL);
        CHECK(str_is(nl_json_getn(o, "k\0", 2), "v", 1));
        CHECK(nl_json_is_object(nl_json_get(o, "")) && nl_json_len(nl_json_get(o, "")) == 0);
        CHECK(nl_json_get(o, "missing") == NULL && nl_json_get(arr, "a") == NULL);
        CHECK(nl_json_at(o, 0) == NULL);
        CHECK(strcmp(nl_json_type_name(nl_json_get(o, "z")->type), "number") == 0);
    }
    nl_json_free(o);
    CHECK(nl_json_len(NULL) == 0 && nl_json_get(NULL, "a") == NULL);
    nl_json_free(NULL);
}

static void test_depth_and_bounds(void) {
    char buf[400];
    /* 64 nested arrays are fine, 65 are not. */
    for (int depth = 63; depth <= 66; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) buf[n++] = '[';
        for (int i = 0; i < depth; i++) buf[n++] = ']';
        nl_json_error e;
        nl_json *v = nl_json_parse(buf, (size_t)n, &e);
        if (depth <= NL_JSON_MAX_DEPTH) {
            CHECKF(v != NULL, "depth %d: %s", depth, e.msg);
        } else {
            CHECKF(v == NULL && e.offset == NL_JSON_MAX_DEPTH && strstr(e.msg, "nesting"), "depth %d", depth);
        }
        nl_json_free(v);
    }
    /* Mixed objects/arrays count together. */
    int n = 0;
    for (int i = 0; i < 40; i++) {
        memcpy(buf + n, "{\"a\":[", 6);
        n += 6;
    }
    buf[n++] = '1';
    for (int i = 0; i < 40; i++) {
        buf[n++] = ']';
        buf[n++] = '}';
    }
    nl_json_error e;
    nl_json *v = nl_json_parse(buf, (size_t)n, &e);
    CHECK(v == NULL && strstr(e.msg, "nesting"));
    nl_json_free(v);

    /* Bytes past len are never read: a number or literal cut by len. */
    const char *s = "[12345]";
    v = nl_json_parse(s + 1, 3, &e); /* "123" */
    CHECK(v && v->u.num.i == 123);
    nl_json_free(v);
    v = nl_json_parse("truex", 4, &e);
    CHECK(v && v->type == NL_JSON_TRUE);
    nl_json_free(v);
    v = nl_json_parse("\"ab\"", 3, &e);
    CHECK(v == NULL && strstr(e.msg, "unterminated string"));
    nl_json_free(v);
    v = nl_json_parse("\"\\u00411\"", 5, &e); /* \u00 cut: not 4 hex digits before the end */
    CHECK(v == NULL);
    nl_json_free(v);
}

static void test_linecol(void) {
    const char *t = "ab\ncd\n\nef";
    int l, c;
    nl_json_linecol(t, strlen(t), 0, &l, &c);
    CHECK(l == 1 && c == 1);
    nl_json_linecol(t, strlen(t), 4, &l, &c);
    CHECK(l == 2 && c == 2);
    nl_json_linecol(t, strlen(t), 6, &l, &c);
    CHECK(l == 3 && c == 1);
    nl_json_linecol(t, strlen(t), 8, &l, &c);
    CHECK(l == 4 && c == 2);
    /* A multi-line document error mapped to line:column. */
    const char *doc = "{\n  \"a\": 1,\n  \"b\": [1,,2]\n}";
    nl_json_error e;
    CHECK(nl_json_parse(doc, strlen(doc), &e) == NULL);
    nl_json_linecol(doc, strlen(doc), e.offset, &l, &c);
    CHECKF(l == 3 && c == 11, "%d:%d %s", l, c, e.msg);
}

static void test_large_and_dups(void) {
    /* Large array and object: linear-time parse, sorted duplicate check. */
    size_t n = 20000, cap = n * 24 + 16, len = 0;
    char *buf = malloc(cap);
    buf[len++] = '{';
    for (size_t i = 0; i < n; i++) len += (size_t)snprintf(buf + len, cap - len, "%s\"k%zu\":%zu", i ? "," : "", i, i);
    buf[len++] = '}';
    nl_json_error e;
    double t0 = nl_now();
    nl_json *v = nl_json_parse(buf, len, &e);
    CHECKF(v && nl_json_len(v) == n, "%s", e.msg);
    int64_t x;
    CHECK(v && nl_json_int64(nl_json_get(v, "k19999"), &x) == 0 && x == 19999);
    nl_json_free(v);
    /* Duplicate far apart: "k5" again at the end. */
    len--;
    size_t dup_at = len + 1;
    len += (size_t)snprintf(buf + len, cap - len, ",\"k5\":0}");
    v = nl_json_parse(buf, len, &e);
    CHECKF(v == NULL && e.offset == dup_at && strstr(e.msg, "duplicate key \"k5\""), "%zu %s", e.offset, e.msg);
    free(buf);

    /* A long string with many escapes (decoded once, no quadratic growth). */
    size_t m = 2000000;
    char *s = malloc(m * 2 + 3);
    len = 0;
    s[len++] = '"';
    for (size_t i = 0; i < m; i++) {
        s[len++] = '\\';
        s[len++] = 'n';
    }
    s[len++] = '"';
    v = nl_json_parse(s, len, &e);
    CHECK(v && v->u.str.len == m && v->u.str.s[m - 1] == '\n');
    nl_json_free(v);
    free(s);
    double dt = nl_now() - t0;
    /* a guard against quadratic behaviour (linear takes ~0.1 s), not a timing test */
    CHECKF(dt < 30.0, "large parses took %.2f s", dt);
}

static void test_escape_roundtrip(void) {
    const char raw[] = "a\"b\\c\n\t\x01\xc3\xa9\0z";
    size_t rl = sizeof raw - 1;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    CHECK(nl_json_escape(&buf, &n, &cap, raw, rl) == 0);
    CHECK(buf && strcmp(buf, "\"a\\\"b\\\\c\\n\\t\\u0001\xc3\xa9\\u0000z\"") == 0);
    nl_json *v = nl_json_parse(buf, n, NULL);
    CHECK(v && str_is(v, raw, rl));
    nl_json_free(v);
    free(buf);
}

/* Deterministic mutation fuzzing (run under ASan by `make test SANITIZE=1`). Properties that
 * must hold for any input: a failure has an offset within the input and a message; leading
 * whitespace shifts a failure's offset by exactly one; trailing whitespace never changes
 * the verdict; every strict prefix of a container or string document is an error. */
static void test_fuzz(void) {
    static const char *seeds[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"h\\u00e9llo\\n\"}], \"x\": [1, -2.5e3, true, null]}",
        "[\"\\uD83D\\uDE00\", \"\xc3\xa9\xe2\x82\xac\", 0, -0.0, 1E+9, {\"a\": {\"b\": []}}]",
        "{\"tokens\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}",
    };
    static const char alphabet[] = "{}[]\",:\\-+.eE0123456789 \tntrufalsx\x80\xc3\xed\xf4\x00\x1f";
    char buf[256], tmp[258];
    int bad = 0, iters = 30000;
    for (int it = 0; it < iters; it++) {
        const char *sd = seeds[it % 3];
        size_t len = strlen(sd);
        memcpy(buf, sd, len);
        int edits = 1 + (int)((nl_t_rand() + 1) * 2);
        for (int e = 0; e < edits && len > 0; e++) {
            size_t at = (size_t)((nl_t_rand() + 1) * 0.5 * (double)len) % len;
            char c = alphabet[(size_t)((nl_t_rand() + 1) * 0.5 * (sizeof alphabet - 1)) % (sizeof alphabet - 1)];
            double op = nl_t_rand();
            if (op < -0.3) buf[at] = c;
            else if (op < 0.3 && len < sizeof buf - 1) {
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = c;
                len++;
            } else {
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
            }
        }
        nl_json_error e1, e2, e3;
        nl_json *v = nl_json_parse(buf, len, &e1);
        if (!v && (e1.offset > len || !e1.msg[0])) bad++;
        tmp[0] = ' ';
        memcpy(tmp + 1, buf, len);
        nl_json *w = nl_json_parse(tmp, len + 1, &e2);
        if ((v == NULL) != (w == NULL) || (!v && e2.offset != e1.offset + 1)) bad++;
        memcpy(tmp, buf, len);
        tmp[len] = '\n';
        nl_json *x = nl_json_parse(tmp, len + 1, &e3);
        if ((v == NULL) != (x == NULL)) bad++;
        nl_json_free(v);
        nl_json_free(w);
        nl_json_free(x);
    }
    CHECKF(bad == 0, "%d fuzz property violations", bad);
    int prefix_ok = 1;
    for (int k = 0; k < 3; k++)
        for (size_t n = 0; n < strlen(seeds[k]); n++) {
            nl_json *v = nl_json_parse(seeds[k], n, NULL);
            if (v) prefix_ok = 0;
            nl_json_free(v);
        }
    CHECK(prefix_ok);
}

/* util/yaml's \u escapes: what it accepts the JSON reader takes (a surrogate pair), what the
 * JSON reader would refuse (a lone surrogate) it refuses at its line:column (found by fuzz_yaml:
 * a lone \uDDDF passed through) */
static void test_yaml_unicode(void) {
    static const struct {
        const char *doc;
        int ok, line, col;
    } cs[] = {
        {"a: \"\\u00e9\"\n", 1, 0, 0},
        {"a: \"x \\uD83D\\uDE00 y\"\n", 1, 0, 0},
        {"a: \"ok\"\nb: \"tab \\uDDDF\"\n", 0, 2, 9},
        {"a: \"\\uD83D\"\n", 0, 1, 5},
        {"a: \"\\uD83Dx\"\n", 0, 1, 5},
        {"a: \"\\uD83D\\u0041\"\n", 0, 1, 5},
        {"a: \"\\u00eG\"\n", 0, 1, 5},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char *js = NULL;
        size_t n = 0;
        nl_yaml_error ye;
        const int rc = nl_yaml_to_json(cs[i].doc, strlen(cs[i].doc), &js, &n, &ye);
        if (cs[i].ok) {
            CHECKF(rc == 0, "yaml case %zu: %s", i, ye.msg);
            nl_json_error je;
            nl_json *j = rc == 0 ? nl_json_parse(js, n, &je) : NULL;
            CHECKF(j != NULL, "yaml case %zu: the JSON reader refused its conversion: %s", i, js ? js : "");
            nl_json_free(j);
        } else {
            CHECKF(rc != 0 && ye.line == cs[i].line && ye.col == cs[i].col,
                   "yaml case %zu: rc %d at %d:%d (%s), want %d:%d", i, rc, ye.line, ye.col, ye.msg, cs[i].line,
                   cs[i].col);
        }
        free(js);
    }
}

int main(void) {
    test_valid();
    test_invalid();
    test_values();
    test_depth_and_bounds();
    test_linecol();
    test_large_and_dups();
    test_escape_roundtrip();
    test_fuzz();
    test_yaml_unicode();
    return nl_t_done();
}

/* util/json: a strict RFC 8259 JSON parser producing a read-only DOM.
 *
 * Strict means: exactly the RFC grammar. No trailing commas, no comments, no leading zeros,
 * no NaN/Infinity, no single quotes, no raw control characters (< 0x20) inside strings, no
 * byte order mark. Whitespace is only space, tab, LF and CR. Any value may be the top level.
 * Input must be valid UTF-8: overlong forms, UTF-8-encoded surrogates (ED A0..BF ..), code
 * points above U+10FFFF, stray continuation bytes and truncated sequences are errors. \u
 * escapes are decoded to UTF-8; a surrogate pair becomes one 4-byte character and a lone
 * (unpaired) surrogate escape is an error. Strings may contain NUL (\u0000), so every string
 * carries its byte length (it is also NUL-terminated for convenience).
 *
 * Choices made where the RFC leaves room:
 *   - duplicate keys in one object are rejected (error at the second key);
 *   - a number whose magnitude overflows a double (1e309, -1e400) is an error; one that
 *     underflows (1e-400) becomes 0 or a subnormal, like strtod;
 *   - nesting deeper than NL_JSON_MAX_DEPTH arrays/objects is an error;
 *   - documents larger than NL_JSON_MAX_BYTES are refused.
 *
 * Cost is linear in the input: strings are decoded once into their final storage, arrays and
 * objects are collected on a scratch stack and copied once when they close, and duplicate
 * keys are found by sorting (n log n) for large objects. All nodes of one document live in
 * one arena, so nl_json_free(root) is a single walk over a few chunks.
 *
 * Error reporting: nl_json_parse returns NULL, fills *err (if non-NULL) with the byte offset
 * of the problem and a message without position, and also sets the library error slot to
 * "offset N: message". nl_json_linecol turns an offset into 1-based line:column. */
#ifndef NL_JSON_H
#define NL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NL_JSON_MAX_DEPTH 64
#define NL_JSON_MAX_BYTES ((size_t)1 << 30) /* 1 GiB per document */

typedef enum {
    NL_JSON_NULL = 0,
    NL_JSON_FALSE,
    NL_JSON_TRUE,
    NL_JSON_NUMBER,
    NL_JSON_STRING,
    NL_JSON_ARRAY,
    NL_JSON_OBJECT,
} nl_json_type;

typedef struct nl_json nl_json;
typedef struct nl_json_member nl_json_member;

struct nl_json {
    nl_json_type type;
    size_t offset; /* byte offset of the value's first byte in the input */
    union {
        struct {
            double d;    /* the value, correctly rounded (strtod) */
            int64_t i;   /* exact value when is_int */
            bool is_int; /* integer text (no '.', no exponent) that fits int64 */
        } num;
        struct {
            const char *s; /* decoded UTF-8, NUL-terminated, may contain NUL */
            size_t len;    /* bytes, without the terminator */
        } str;
        struct {
            const nl_json *items; /* n values in document order */
            size_t n;
        } arr;
        struct {
            const nl_json_member *members; /* n members in document order, keys unique */
            size_t n;
        } obj;
    } u;
};

struct nl_json_member {
    const char *key; /* decoded, NUL-terminated, may contain NUL */
    size_t key_len;
    size_t key_offset; /* byte offset of the key's opening quote */
    nl_json value;
};

typedef struct {
    size_t offset; /* byte offset of the error in the input */
    char msg[160]; /* what was expected / found, no position prefix */
} nl_json_error;

/* Parse `len` bytes (no NUL terminator needed; bytes past len are never read). Returns the
 * root value (owned: release with nl_json_free) or NULL with *err filled (err may be NULL)
 * and the error slot set. */
nl_json *nl_json_parse(const char *s, size_t len, nl_json_error *err);
/* Free a document. Only the pointer returned by nl_json_parse may be passed; NULL is ok. */
void nl_json_free(nl_json *root);

/* 1-based line and column (in bytes) of `offset` within s[0..len). Lines end at LF. */
void nl_json_linecol(const char *s, size_t len, size_t offset, int *line, int *col);

const char *nl_json_type_name(nl_json_type t); /* "null", "false", ..., "object" */

/* ---- accessors (all tolerate NULL and wrong types by returning NULL / 0 / -1) ---- */
/* Object member by key (exact bytes; keys with NUL need nl_json_getn). NULL if absent. */
const nl_json *nl_json_get(const nl_json *obj, const char *key);
const nl_json *nl_json_getn(const nl_json *obj, const char *key, size_t key_len);
/* Number of elements (array) or members (object); 0 for anything else. */
size_t nl_json_len(const nl_json *v);
/* Array element i, NULL when out of range or not an array. */
const nl_json *nl_json_at(const nl_json *arr, size_t i);

static inline bool nl_json_is_null(const nl_json *v) { return v && v->type == NL_JSON_NULL; }
static inline bool nl_json_is_bool(const nl_json *v) {
    return v && (v->type == NL_JSON_TRUE || v->type == NL_JSON_FALSE);
}
static inline bool nl_json_is_number(const nl_json *v) { return v && v->type == NL_JSON_NUMBER; }
static inline bool nl_json_is_string(const nl_json *v) { return v && v->type == NL_JSON_STRING; }
static inline bool nl_json_is_array(const nl_json *v) { return v && v->type == NL_JSON_ARRAY; }
static inline bool nl_json_is_object(const nl_json *v) { return v && v->type == NL_JSON_OBJECT; }

/* Exact integer value of a number: 0 and *out set when the number is integer text that fits
 * int64 (is_int), or a double that is integral with |d| <= 2^53 (so "5.0" and "1e3" count);
 * -1 otherwise (no error slot change). */
int nl_json_int64(const nl_json *v, int64_t *out);

/* Append `len` bytes of UTF-8 to buf as a JSON string literal (with quotes), escaping '"',
 * '\\' and control characters. *buf is realloc'd; *n and *cap track it. 0 or -1 (OOM). For
 * writers such as --log-json. */
int nl_json_escape(char **buf, size_t *n, size_t *cap, const char *s, size_t len);

#endif

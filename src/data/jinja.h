/* data/jinja: a Jinja subset for chat templates (tokenizer.chat_template), rendered the way
 * Hugging Face transformers renders them (jinja2 with trim_blocks and lstrip_blocks, no
 * autoescape, one trailing newline of the template dropped, its tojson and raise_exception).
 *
 * Covered: text, {{ }}, {% %}, {# #}, the '-' and '+' whitespace modifiers; if/elif/else,
 * for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/
 * length/previtem/nextitem, break/continue), set (name, ns.attr, block set), macro (positional,
 * keyword and default arguments), generation (rendered as its body); literals (strings with
 * Python escapes, ints, floats, true/false/none, lists, tuples, dicts), attribute and item
 * access, slices, calls with keyword arguments, + - * / // % **, ~, comparisons, in / not in,
 * and/or/not, `a if c else b`; the filters and tests in the tables of jinja_parse.c; string methods
 * (startswith, endswith, split, rsplit, strip, lstrip, rstrip, replace, upper, lower, title,
 * capitalize, find, count, join, format is not), dict methods (items, keys, values, get);
 * namespace(), range(), raise_exception(). Values: undefined, none, bool, int (64-bit),
 * float, string, list, dict (insertion order), namespace, macro.
 * Not covered (an error naming the construct and the line): include/import/extends/block,
 * call/filter blocks, loop.cycle, filters and tests not in the tables, strftime_now (left
 * undefined, so templates fall back to their fixed date: renderings do not change by the day).
 *
 * Every string byte carries a flag "came from the caller's data" (a message's text) through
 * concatenation, slicing, trimming and splitting, so a caller can tell template text (where
 * special tokens are markup) from message text (where they are not). */
#ifndef NL_JINJA_H
#define NL_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/json.h"

typedef struct nl_jinja nl_jinja; /* a parsed template, read-only after parsing */
typedef struct nl_jv nl_jv;       /* a reference-counted value */

/* Parse `len` bytes of template text. `label` names it in errors: "label:LINE: message"
 * (e.g. "tpl.jinja:12: filter 'wordwrap' is not supported"). NULL + error on failure. */
nl_jinja *nl_jinja_parse(const char *src, size_t len, const char *label);
void nl_jinja_free(nl_jinja *t);

/* Values. Constructors return a new reference (NULL + error on OOM); the setters take
 * ownership of `v` (also on failure). */
nl_jv *nl_jv_none(void);
nl_jv *nl_jv_bool(bool b);
nl_jv *nl_jv_int(int64_t i);
/* `data`: every byte is flagged as the caller's data. */
nl_jv *nl_jv_str(const char *s, size_t n, bool data);
nl_jv *nl_jv_list(void);
nl_jv *nl_jv_dict(void);
int nl_jv_push(nl_jv *list, nl_jv *v);
int nl_jv_set(nl_jv *dict, const char *key, nl_jv *v);
/* `flags`: each byte's flag (copied): 0 template text, 1 data, 2..255 data a caller marks. */
nl_jv *nl_jv_str_flags(const char *s, size_t n, const uint8_t *flags);
/* A JSON value as a template value (objects keep their member order); strings flagged data. */
nl_jv *nl_jv_from_json(const nl_json *j);
void nl_jv_unref(nl_jv *v);

/* Render with the variables of `ctx` (a dict, borrowed). *text (malloc'd, NUL-terminated,
 * *len bytes) and, when from_data is not NULL, *from_data (malloc'd, *len flags: 1 = the
 * byte came from a data string; nl_jv_str_flags' own values kept). -1 + "label:line: message" on error
 * (raise_exception's message, an undefined value used where one is needed, a type error). */
int nl_jinja_render(const nl_jinja *t, const nl_jv *ctx, char **text, size_t *len, uint8_t **from_data);

/* A rendering's budget. mem_bytes: the bytes it may hold at once (every value, string, list,
 * dict and buffer it makes, the output included; the variables passed in do not count); ops:
 * its operations (a value made, an expression evaluated, a statement, a loop iteration, a call,
 * 64 bytes written). 0: the default, 8 MiB and 2,000,000 operations (about 0.1-0.3 s); past
 * either the rendering stops at once with "label:line: the template needs more than X MiB
 * (its memory limit for one rendering)" or "... ran past N operations ...". Nesting (of the
 * parser, of macro calls, of values printed or compared) is bounded by 200. */
typedef struct {
    size_t mem_bytes;
    uint64_t ops;
} nl_jinja_limits;
/* nl_jinja_render with a budget (lim NULL: the defaults); NL_JINJA_OVER_BUDGET (-2) when the
 * budget ran out, -1 on any other error. */
#define NL_JINJA_OVER_BUDGET (-2)
int nl_jinja_render_ex(const nl_jinja *t, const nl_jv *ctx, const nl_jinja_limits *lim, char **text, size_t *len,
                       uint8_t **from_data);

#endif

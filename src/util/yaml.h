/* util/yaml: a small, strict subset of YAML read as JSON text, for config files.
 *
 * The subset: one document (an optional leading "---", an optional "..." end); block maps
 * ("key: value", a quoted or plain key), block lists ("- value", indented under a key or at
 * its indentation), nesting by spaces; scalars plain (null ~ true false, numbers in JSON's
 * grammar, else a string), 'single-quoted' ('' is a quote) or "double-quoted" (the escapes
 * JSON has); flow lists of scalars on one line ("[q, v]"); comments ("#" at a line's start or
 * after a space). Anything else — tabs in indentation, anchors, aliases, tags, block scalars
 * (| >), flow maps, multi-line scalars, a list item holding a map, a second document — is an
 * error at its line and column, never guessed at.
 *
 * The JSON has the document's lines: a value on YAML line L is on JSON line L, so an error the
 * JSON reader finds later (a duplicate key) names the YAML line. Duplicate keys are left to
 * that reader. Linear in the input; nesting at most NL_YAML_MAX_DEPTH. */
#ifndef NL_YAML_H
#define NL_YAML_H

#include <stddef.h>

#define NL_YAML_MAX_DEPTH 32

typedef struct {
    int line, col; /* 1-based */
    char msg[160];
} nl_yaml_error;

/* *json: malloc'd, NUL-terminated, *json_len bytes. 0, or -1 with *err filled (out of memory
 * included). */
int nl_yaml_to_json(const char *s, size_t len, char **json, size_t *json_len, nl_yaml_error *err);

#endif

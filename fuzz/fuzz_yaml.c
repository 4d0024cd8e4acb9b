/* fuzz_yaml: the YAML subset of config files (nl_yaml_to_json) on arbitrary bytes.
 *
 * Oracles: an accepted document's JSON parses (nl_json_parse accepts it, or refuses only a
 * duplicate key, which is left to the JSON reader) and has as many lines as the input (each
 * value on its YAML line); a refused one has an error line within the input's lines, a column
 * >= 1 and a message. The input is passed with its exact length, no terminator. */
#include "common.h"
#include "util/json.h"
#include "util/yaml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    char *buf = malloc(size ? size : 1);
    FUZZ_CHECK(buf != NULL, "oom");
    memcpy(buf, data, size);
    int lines = 1;
    for (size_t i = 0; i < size; i++) lines += buf[i] == '\n';
    char *js = NULL;
    size_t jl = 0;
    nl_yaml_error e;
    if (nl_yaml_to_json(buf, size, &js, &jl, &e) == 0) {
        int jlines = 1;
        for (size_t i = 0; i < jl; i++) jlines += js[i] == '\n';
        FUZZ_CHECK(jlines == lines || (size == 0 && jlines == 1), "the JSON has %d lines, the YAML %d", jlines, lines);
        nl_json_error je;
        nl_json *root = nl_json_parse(js, jl, &je);
        /* the JSON reader may still refuse what only it checks (a duplicate key, a number beyond a
         * double): the config loader reports that at its line */
        FUZZ_CHECK(root != NULL || strstr(je.msg, "duplicate key") || strstr(je.msg, "out of range"),
                   "the JSON of an accepted document does not parse: %s (%.200s)", je.msg, js);
        nl_json_free(root);
        free(js);
    } else {
        FUZZ_CHECK(e.line >= 1 && e.line <= lines && e.col >= 1 && e.msg[0], "error at %d:%d (%d lines): %s", e.line,
                   e.col, lines, e.msg);
    }
    free(buf);
    return 0;
}

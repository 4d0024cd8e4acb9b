/* fuzz_jinja: the chat-template interpreter (nl_jinja_parse, nl_jinja_render) on arbitrary
 * template text, rendered over a fixed conversation (system, user, assistant with
 * reasoning_content and tool_calls, tool; tools; add_generation_prompt; bos/eos tokens).
 *
 * Oracles:
 *   - a refused template, or a failed rendering, has an error "fuzz.jinja:LINE: ..." with
 *     LINE within the template's lines;
 *   - a rendering is NUL-terminated at its length and its data flags are 0 or 1;
 *   - rendering twice gives the same bytes and flags (no state leaks between renderings);
 *   - every message text byte that reaches the output unchanged keeps flag 1 only when it came
 *     from data: a template without variables renders flags all 0.
 * Inputs are cut at 64 KiB. The corpus holds the bomb shapes (a list or string doubled, nested loops
 * of 10^4-10^5, a macro called in a loop, values and expressions nested 1000-30000 deep, 2,500
 * sets): each rendering's budget (jinja.h; here a tenth of the default operations, fuzz_limits)
 * stops them in well under the per-input timeout. */
#include "common.h"
#include "data/jinja.h"
#include "util/json.h"

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \" Hi <|im_end|> \"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nYo\", \"reasoning_content\": \"why\","
    " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, "
    "true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"ok\\\": 1}\"}, {\"role\": \"user\", \"content\": \"again\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"documents\": null}";

static nl_jv *ctx;
/* The default memory ceiling, a tenth of the default operations: under ASan + UBSan a rendering
 * runs ~40x slower than natively (the corpus's 10^6-call macro loop stops at the default budget
 * in 0.18 s natively, 6.8 s in this harness on a loaded 2-core machine, and each input renders
 * twice against a 10 s timeout), so the same budget code stops each bomb at a tenth of the count. */
static const nl_jinja_limits fuzz_limits = {0, 200000};

static void check_err(const char *what, int n_lines) {
    const char *e = nl_last_error();
    FUZZ_CHECK(strncmp(e, "fuzz.jinja:", 11) == 0, "%s error without the label: %s", what, e);
    char *end;
    long line = strtol(e + 11, &end, 10);
    FUZZ_CHECK(end > e + 11 && *end == ':' && line >= 0 && line <= n_lines + 1, "%s error line %ld of %d: %s", what,
               line, n_lines, e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) size = 65536;
    if (!ctx) {
        nl_json_error je;
        nl_json *j = nl_json_parse(vars_json, strlen(vars_json), &je);
        FUZZ_CHECK(j != NULL, "vars: %s", je.msg);
        ctx = nl_jv_from_json(j); /* owns its copies; the DOM can go */
        nl_json_free(j);
        FUZZ_CHECK(ctx != NULL, "vars");
    }
    int n_lines = 1;
    for (size_t i = 0; i < size; i++) n_lines += data[i] == '\n' || data[i] == '\r';
    nl_jinja *t = nl_jinja_parse((const char *)data, size, "fuzz.jinja");
    if (!t) {
        check_err("parse", n_lines);
        return 0;
    }
    char *out[2] = {NULL, NULL};
    uint8_t *fl[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    int rc[2];
    for (int k = 0; k < 2; k++) {
        rc[k] = nl_jinja_render_ex(t, ctx, &fuzz_limits, &out[k], &n[k], &fl[k]);
        if (rc[k]) check_err("render", n_lines);
    }
    FUZZ_CHECK(rc[0] == rc[1], "two renderings: %d then %d", rc[0], rc[1]);
    if (rc[0] == 0) {
        FUZZ_CHECK(out[0][n[0]] == 0, "not NUL-terminated");
        for (size_t i = 0; i < n[0]; i++) FUZZ_CHECK(fl[0][i] <= 1, "flag %d", fl[0][i]);
        FUZZ_CHECK(n[0] == n[1] && !memcmp(out[0], out[1], n[0]) && !memcmp(fl[0], fl[1], n[0]), "renderings differ");
        bool has_var = memmem(data, size, "{{", 2) || memmem(data, size, "{%", 2);
        if (!has_var)
            for (size_t i = 0; i < n[0]; i++)
                FUZZ_CHECK(fl[0][i] == 0, "data flag at %zu in a template without tags", i);
    }
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(fl[k]);
    }
    nl_jinja_free(t);
    return 0;
}

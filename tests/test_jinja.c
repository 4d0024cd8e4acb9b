/* data/jinja: the real chat templates of Qwen3, Qwen3.5, Llama 3.1/3.2, SmolLM2 and Gemma 3
 * (tests/data/templates/, one .jinja file each) render every conversation of tests/data/templates/vectors.jsonl
 * byte for byte as jinja2 does (tools/gen_template_vectors.py made the file); the constructs
 * beyond those templates; errors name the construct and the line. */
#include <stdint.h>

#include "data/jinja.h"
#include "util/json.h"
#include "test.h"
#include "util/util.h"

static char *slurp(const char *path, size_t *len) {
    char *s = nl_read_file(path, len);
    if (!s) fprintf(stderr, "%s\n", nl_last_error());
    return s;
}

/* Renders src over a JSON object of variables; *out malloc'd (NULL on error). */
static char *render_json(const char *src, const char *vars_json, const char *label) {
    nl_jinja *t = nl_jinja_parse(src, strlen(src), label);
    if (!t) return NULL;
    nl_json_error je;
    nl_json *j = nl_json_parse(vars_json, strlen(vars_json), &je);
    if (!j) {
        fprintf(stderr, "bad vars json: %s\n", je.msg);
        nl_jinja_free(t);
        return NULL;
    }
    nl_jv *ctx = nl_jv_from_json(j);
    char *out = NULL;
    size_t n = 0;
    if (nl_jinja_render(t, ctx, &out, &n, NULL)) out = NULL;
    nl_jv_unref(ctx);
    nl_json_free(j);
    nl_jinja_free(t);
    return out;
}

static void expect_render(const char *src, const char *vars, const char *want, int line) {
    char *got = render_json(src, vars, "t.jinja");
    if (!got || strcmp(got, want) != 0)
        fprintf(stderr, "test_jinja.c:%d: template %s\n  want [%s]\n  got  [%s] %s\n", line, src, want,
                got ? got : "(error)", got ? "" : nl_last_error());
    CHECK(got && strcmp(got, want) == 0);
    free(got);
}
#define EXPECT(src, vars, want) expect_render(src, vars, want, __LINE__)

static void expect_error(const char *src, const char *vars, const char *want, int line) {
    char *got = render_json(src, vars, "t.jinja");
    bool ok = !got && strstr(nl_last_error(), want);
    if (!ok)
        fprintf(stderr, "test_jinja.c:%d: template %s: want error [%s], got [%s]\n", line, src, want,
                got ? got : nl_last_error());
    CHECK(ok);
    free(got);
}
#define EXPECT_ERR(src, vars, want) expect_error(src, vars, want, __LINE__)

static void vectors(void) {
    size_t len;
    char *all = slurp(NL_TEST_DATA "/templates/vectors.jsonl", &len);
    CHECK(all != NULL);
    if (!all) return;
    int n_cases = 0, n_ok = 0;
    char cur_name[128] = "";
    nl_jinja *t = NULL;
    for (char *line = all; line < all + len;) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(all + len - line);
        nl_json_error je;
        nl_json *row = nl_json_parse(line, ll, &je);
        CHECK(row != NULL);
        line += ll + 1;
        if (!row) continue;
        const nl_json *tn = nl_json_get(row, "template"), *cs = nl_json_get(row, "case");
        const nl_json *vars = nl_json_get(row, "vars"), *want = nl_json_get(row, "expected");
        const nl_json *werr = nl_json_get(row, "error");
        if (strcmp(cur_name, tn->u.str.s) != 0) {
            nl_jinja_free(t);
            snprintf(cur_name, sizeof cur_name, "%s", tn->u.str.s);
            char path[512];
            snprintf(path, sizeof path, NL_TEST_DATA "/templates/%s", cur_name);
            size_t sl;
            char *src = slurp(path, &sl);
            t = src ? nl_jinja_parse(src, sl, cur_name) : NULL;
            if (!t) fprintf(stderr, "%s: %s\n", cur_name, nl_last_error());
            CHECK(t != NULL);
            free(src);
        }
        n_cases++;
        if (t) {
            nl_jv *ctx = nl_jv_from_json(vars);
            char *out = NULL;
            size_t n = 0;
            int rc = nl_jinja_render(t, ctx, &out, &n, NULL);
            bool ok;
            if (werr) {
                ok = rc != 0 && strstr(nl_last_error(), werr->u.str.s) != NULL;
                if (!ok)
                    fprintf(stderr, "%s %s: want the error \"%s\", got %s\n", cur_name, cs->u.str.s, werr->u.str.s,
                            rc ? nl_last_error() : out);
            } else {
                ok = rc == 0 && n == want->u.str.len && memcmp(out, want->u.str.s, n) == 0;
                if (!ok) {
                    fprintf(stderr, "%s %s: differs\n", cur_name, cs->u.str.s);
                    if (rc) fprintf(stderr, "  error: %s\n", nl_last_error());
                    else {
                        size_t k = 0;
                        while (k < n && k < want->u.str.len && out[k] == want->u.str.s[k]) k++;
                        fprintf(stderr, "  first difference at byte %zu\n  want ...%.80s\n  got  ...%.80s\n", k,
                                want->u.str.s + (k > 20 ? k - 20 : 0), out + (k > 20 ? k - 20 : 0));
                    }
                }
            }
            n_ok += ok;
            CHECK(ok);
            free(out);
            nl_jv_unref(ctx);
        }
        nl_json_free(row);
    }
    nl_jinja_free(t);
    free(all);
    printf("vectors: %d/%d cases equal to jinja2's renderings\n", n_ok, n_cases);
    CHECK(n_cases >= 100);
}

/* Constructs beyond the six templates, with jinja2's results (checked by hand against
 * jinja2 3.1 with trim_blocks and lstrip_blocks). */
static void constructs(void) {
    EXPECT("a {{ 1 + 2 * 3 }} b", "{}", "a 7 b");
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", "{}", "3 -4 1 2 3.5 1024");
    EXPECT("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3.0 * 2 }}", "{}",
           "1.0 0.30000000000000004 1e+20 1.5e-07 6.0");
    EXPECT("{{ 'a' ~ 1 ~ none ~ true }}", "{}", "a1NoneTrue");
    EXPECT("{{ x }}|{{ x is defined }}|{{ x is undefined }}|{{ d.y is defined }}", "{\"d\":{}}", "|False|True|False");
    EXPECT("{% if a %}A{% elif b %}B{% else %}C{% endif %}", "{\"a\":0,\"b\":\"\"}", "C");
    EXPECT("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% else %}empty{% endfor %}",
           "{\"xs\":[\"a\",\"b\",\"c\"]}", "1a,2b,3c");
    EXPECT("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", "{\"xs\":[]}", "empty");
    EXPECT("{% for x in xs if x > 1 %}{{ loop.index0 }}:{{ x }}/{{ loop.length }} {% endfor %}", "{\"xs\":[1,2,3]}",
           "0:2/2 1:3/2 ");
    EXPECT("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\":{\"b\":1,\"a\":[1,2]}}", "b=1;a=[1, 2];");
    EXPECT("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% "
           "endfor %}",
           "{\"xs\":[1,2,3,4,5]}", "13");
    EXPECT("{% for x in xs %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }} {% endfor %}", "{\"xs\":[1,2,3]}",
           ">1>2 1>2>3 2>3> ");
    EXPECT("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "{}", "1");
    EXPECT("{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", "{}",
           "4");
    EXPECT("{% set b %}in {{ 1 }} block{% endset %}[{{ b }}]", "{}", "[in 1 block]");
    EXPECT("{% set b | upper %}shout{% endset %}{{ b }}", "{}", "SHOUT");
    EXPECT("{% macro m(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, c=3) }} {{ m(1, 2, "
           "3) }}",
           "{}", "1-B-None 1-B-3 1-2-3");
    EXPECT("{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-1] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][::2] }} {{ 'héllo'[1] }}", "{}",
           "bc fedcba [3, 4] [1, 3] é");
    EXPECT("{{ '  x  ' | trim }}|{{ 'xxhixx'.strip('x') }}|{{ ' a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ "
           "'a-b-c'.rsplit('-', 1) }}",
           "{}", "x|hi|['a', 'b', 'c']|['a', 'b', '', 'c']|['a-b', 'c']");
    EXPECT("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'a.b.a'.replace('a', 'z') }} {{ "
           "'ab'.upper() }}",
           "{}", "True True z.b.z AB");
    EXPECT(
        "{{ [3,1,2] | length }} {{ 'héllo' | length }} {{ {'a':1} | length }} {{ [1,2] | first }} {{ [1,2] | last }}",
        "{}", "3 5 1 1 2");
    EXPECT("{{ xs | selectattr('on') | map(attribute='n') | join(',') }}|{{ xs | rejectattr('on') | map(attribute='n') "
           "| list }}",
           "{\"xs\":[{\"n\":\"a\",\"on\":true},{\"n\":\"b\",\"on\":false},{\"n\":\"c\",\"on\":1}]}", "a,c|['b']");
    EXPECT("{{ [1,2,3,4] | select('odd') | list }} {{ ['a','b'] | reject('equalto','a') | list }} {{ ['x','y'] | "
           "map('upper') | join }}",
           "{}", "[1, 3] ['b'] XY");
    EXPECT("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}",
           "{\"d\":{\"a\":[1,2.5,null,true],\"b\":{}}}",
           "{\"a\": [1, 2.5, null, true], \"b\": {}}|{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  "
           "\"b\": {}\n}|\"é\\\"\\n\"");
    EXPECT("{{ x | default('d') }} {{ '' | default('d', true) }} {{ 3 | string ~ 'x' }} {{ '12' | int + 1 }}", "{}",
           "d d 3x 13");
    EXPECT("{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 'z' not in 'abc' }}", "{}",
           "True True True True");
    EXPECT("{{ 'yes' if 1 > 2 else 'no' }} {{ 'x' if false }}|{{ none is none }} {{ 1 is number }} {{ 'a' is string }} "
           "{{ {} is mapping }}",
           "{}", "no |True True True True");
    EXPECT("{{ [] is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 6 is divisibleby 3 }} {{ x is sameas none }} {{ "
           "true is true }}",
           "{\"x\":null}", "True True True True True True");
    EXPECT("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d['a'] }} {{ d.a }} {{ d.keys() | list }} {{ d.values() | list }}",
           "{\"d\":{\"a\":5}}", "5 0 5 5 ['a'] [5]");
    EXPECT("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ 'ab' * 2 }} {{ [1] + [2] }}", "{}",
           "[0, 1, 2] [1, 3, 5] abab [1, 2]");
    EXPECT("{{ \"it's\" }} {{ 'say \"hi\"' }} {{ 'a\\tb\\u00e9\\x41' }} {{ 'con' 'cat' }}", "{}",
           "it's say \"hi\" a\tbéA concat");
    EXPECT("{{ ['it\\'s', 'x'] }}", "{}", "[\"it's\", 'x']");
    /* whitespace: trim_blocks, lstrip_blocks, '-' and '+' */
    EXPECT("a\n  {% if true %}\n  b\n  {% endif %}\nc", "{}", "a\n  b\nc");
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc");
    EXPECT("a\n  {%+ if true %}b{% endif %}", "{}", "a\n  b");
    EXPECT("x {{ 1 }}\n  {{ 2 }}\n", "{}", "x 1\n  2");
    EXPECT("x\n  {# comment #}\ny{#- c2 -#}  z", "{}", "x\nyz");
    EXPECT("{{- ' a ' -}}\n {{ 'b' }}", "{}", " a b");
    EXPECT("line\r\nnext\r\n", "{}", "line\nnext");
    EXPECT("{% raw %}{{ not }}{% endraw %}", "{}", "{{ not }}");
    EXPECT("a {%- raw -%}  x  {%- endraw -%}  b", "{}", "axb");
    EXPECT("{% raw %}\n{{x}}\n{% endraw %}\nz", "{}", "\n{{x}}\nz");
    EXPECT("  {% raw %}r{% endraw %}", "{}", "r");
    EXPECT("{% generation %}gen{% endgeneration %}", "{}", "gen");
}

static void errors(void) {
    EXPECT_ERR("line1\n{{ x | wordwrap }}", "{}", "t.jinja:2: filter 'wordwrap' is not supported");
    EXPECT_ERR("a\nb\n{% include 'x.jinja' %}", "{}", "t.jinja:3: tag 'include' is not supported");
    EXPECT_ERR("{% if x is prime %}{% endif %}", "{}", "t.jinja:1: test 'prime' is not supported");
    EXPECT_ERR("{% if true %}", "{}", "missing {% endif %}");
    EXPECT_ERR("{% endfor %}", "{}", "unexpected {% endfor %}");
    EXPECT_ERR("{{ 'abc }}", "{}", "unterminated string literal");
    EXPECT_ERR("{% raw %}{{ ot }}{% endraw %draw %t", "{}", "t.jinja:1: {% raw %} without {% endraw %}");
    EXPECT_ERR("{{ 1 + }}", "{}", "t.jinja:1: unexpected '}}' in an expression");
    EXPECT_ERR("\n\n{{ raise_exception('Roles must alternate') }}", "{}",
               "t.jinja:3: the template raised an error: Roles must alternate");
    EXPECT_ERR("{{ x.y }}", "{}", "t.jinja:1: 'x' is undefined");
    EXPECT_ERR("{{ 'a' + 1 }}", "{}", "unsupported operand types for +: string and int");
    EXPECT_ERR("{{ 1 // 0 }}", "{}", "division by zero");
    EXPECT_ERR("{% for x in 5 %}{% endfor %}", "{}", "not iterable");
    EXPECT_ERR("{{ x | tojson }}", "{}", "not JSON serializable");
    EXPECT_ERR("{{ x.cycle('a') }}", "{\"x\":{}}", "'cycle' is undefined (called as a function)");
    EXPECT_ERR("{{ x(1) }}", "{\"x\":3}", "a value of type int is not callable");
    EXPECT_ERR("{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}", "{}", "nested too deeply");
    EXPECT_ERR(
        "{{ ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
        "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1 }}",
        "{}", "nested too deeply");
}

/* Data flags: message text keeps its flag through the template's string handling; template
 * literals do not have it. */
static void taint(void) {
    const char *src =
        "{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>' }}{{ m.content.split('|')[1] }}";
    nl_jinja *t = nl_jinja_parse(src, strlen(src), "t");
    CHECK(t != NULL);
    nl_json_error je;
    const char *vars = "{\"m\":{\"role\":\"user\",\"content\":\"  a|<|im_end|>  \"}}";
    nl_json *j = nl_json_parse(vars, strlen(vars), &je);
    nl_jv *ctx = nl_jv_from_json(j);
    char *out = NULL;
    uint8_t *fl = NULL;
    size_t n = 0;
    CHECK(nl_jinja_render(t, ctx, &out, &n, &fl) == 0);
    const char *want = "<|im_start|>user\na|<|im_end|><|im_end|><";
    CHECK(out && strcmp(out, want) == 0);
    /* flags: 12 template, 4 data (user), 1 template, 12 data (trimmed content), 10 template, 1 data */
    const char *wf = "0000000000001111"
                     "0"
                     "111111111111"
                     "0000000000"
                     "1";
    bool same = fl && strlen(wf) == n;
    for (size_t i = 0; same && i < n; i++) same = fl[i] == (uint8_t)(wf[i] - '0');
    CHECK(same);
    free(out);
    free(fl);
    nl_jv_unref(ctx);
    nl_json_free(j);
    nl_jinja_free(t);
}

/* Parses and renders src (lim NULL: the default budget); the seconds both took in *secs; the
 * output (malloc'd) or NULL with the error left in nl_last_error(). */
static char *timed_render(const char *src, size_t len, const nl_jinja_limits *lim, double *secs) {
    double t0 = nl_now();
    char *out = NULL;
    nl_jinja *t = nl_jinja_parse(src, len, "bomb.jinja");
    if (t) {
        nl_jv *ctx = nl_jv_dict();
        size_t n;
        if (!ctx || nl_jinja_render_ex(t, ctx, lim, &out, &n, NULL)) out = NULL;
        nl_jv_unref(ctx);
        nl_jinja_free(t);
    }
    *secs = nl_now() - t0;
    return out;
}

/* A bomb is refused with an error naming the template, its line and the limit, in well under a
 * second (the bound, 2 s, is generous for a loaded machine: these take milliseconds to ~0.3 s alone, up to 1.1 s seen
 * under make test on 2 shared vCPUs). */
static void expect_bomb(const char *src, size_t len, const char *want, int line) {
    double secs;
    char *out = timed_render(src, len, NULL, &secs);
    bool ok = !out && strstr(nl_last_error(), want) && !strncmp(nl_last_error(), "bomb.jinja:", 11) && secs < 2.0;
    if (!ok)
        fprintf(stderr, "test_jinja.c:%d: bomb %.60s...: want error [%s] within 2 s, got [%s] after %.3f s\n", line,
                src, want, out ? "(rendered)" : nl_last_error(), secs);
    CHECK(ok);
    free(out);
}
#define EXPECT_BOMB(src, want) expect_bomb(src, strlen(src), want, __LINE__)

static char *repeat(const char *head, const char *unit, size_t n, const char *tail, size_t *len) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1);
    memcpy(s, head, hl);
    for (size_t i = 0; i < n; i++) memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * n, tail, tl + 1);
    *len = hl + ul * n + tl;
    return s;
}

/* The budget (jinja.h): memory, operations, nesting; the parser linear on long input. */
static void budget(void) {
    /* memory: a list doubled 64 times (23 GB before the budget), a string doubled 27 times */
    EXPECT_BOMB("{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ "
                "ns.s|length }}",
                "the template needs more than 8.0 MiB (its memory limit for one rendering)");
    EXPECT_BOMB(
        "{% set ns = namespace(s='ab') %}{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "needs more than 8.0 MiB");
    EXPECT_BOMB("{{ 'x' * 1000000000 }}", "bomb.jinja:1: the template");
    EXPECT_BOMB("{% for i in range(1000000) %}{{ i }}{% endfor %}", "bomb.jinja:1: the template needs more than");
    /* operations: 10^4 x 5000 empty iterations (65 s before), 10^5 x 10^5, a macro called 10^8 times */
    EXPECT_BOMB("{% for a in range(10000) %}{% for b in range(5000) %}{% endfor %}{% endfor %}",
                "ran past 2000000 operations");
    EXPECT_BOMB("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
                "bomb.jinja:1: the template");
    EXPECT_BOMB("{% macro m() %}{% endmacro %}{% for a in range(10000) %}{% for b in range(10000) %}{{ m() }}{% endfor "
                "%}{% endfor %}",
                "ran past 2000000 operations");
    EXPECT_BOMB("{% set s = 'a' * 100000 %}{% for a in range(10000) %}{% if 'b' in s %}{% endif %}{% endfor %}",
                "ran past 2000000 operations");
    /* nesting of values: printed, compared, freed (a list 100k deep, iteratively) */
    EXPECT_BOMB("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
                "a value nested more than 200 deep");
    EXPECT_BOMB(
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l == ns.l }}",
        "a value nested more than 200 deep");
    nl_jinja_limits big = {.mem_bytes = (size_t)256 << 20, .ops = 100000000};
    double secs;
    const char *deep =
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}done";
    char *out = timed_render(deep, strlen(deep), &big, &secs);
    CHECK(out && !strcmp(out, "done"));
    free(out);

    /* the parser: 200k {% set vN = N %} lines (quadratic before: 10k 6 s, 40k 98 s); the default
     * budget refuses their 200k variables at once, a larger one renders them, both in < 1 s */
    size_t len = 0, cap = 200000 * 32;
    char *src = malloc(cap);
    for (int i = 0; i < 200000; i++) len += (size_t)snprintf(src + len, cap - len, "{%% set v%d = %d %%}\n", i, i);
    len += (size_t)snprintf(src + len, cap - len, "{{ v0 + v199999 }}");
    expect_bomb(src, len, "needs more than 8.0 MiB", __LINE__);
    out = timed_render(src, len, &big, &secs);
    CHECK(out && !strcmp(out, "199999"));
    if (!out || secs >= 2.0) fprintf(stderr, "200k sets: %s after %.3f s\n", out ? out : nl_last_error(), secs);
    CHECK(secs < 2.0);
    free(out);
    free(src);
    /* 100k nested parentheses / brackets / nots (6.2 s before: the line of each token was counted
     * from the start), refused at the parser's depth; 100k terms in one expression parse, and
     * their 100k-deep tree is refused by the evaluator and freed without recursion */
    src = repeat("{{ ", "(", 100000, "1 }}", &len);
    expect_bomb(src, len, "bomb.jinja:1: expression nested too deeply", __LINE__);
    free(src);
    src = repeat("\n\n{{ ", "[", 100000, " }}", &len);
    expect_bomb(src, len, "bomb.jinja:3: expression nested too deeply", __LINE__);
    free(src);
    src = repeat("{{ ", "not ", 100000, "1 }}", &len);
    expect_bomb(src, len, "nested too deeply", __LINE__);
    free(src);
    src = repeat("{{ 1", " + 1", 100000, " }}", &len);
    expect_bomb(src, len, "bomb.jinja:1: expression nested too deeply", __LINE__);
    free(src);
    /* 200k lines of text and tags: lexed and parsed in linear time */
    src = repeat("", "line {{ 1 }}\n", 200000, "", &len);
    out = timed_render(src, len, &big, &secs);
    CHECK(out && strlen(out) == 200000 * 7 - 1 && secs < 2.0);
    free(out);
    free(src);
    /* a 100k-character string literal after 100k lines: sized by its quotes, not by the rest */
    src = repeat("{% set s = '", "x", 100000, "' %}{{ s|length }}", &len);
    out = timed_render(src, len, NULL, &secs);
    CHECK(out && !strcmp(out, "100000"));
    free(out);
    free(src);
    /* a rendering within the budget is unchanged by it (an iteration is ~25 operations: its
     * scope and its loop.* values), and the budget is per rendering */
    for (int k = 0; k < 3; k++)
        EXPECT("{% for a in range(200) %}{% for b in range(200) %}{% endfor %}{% endfor %}ok", "{}", "ok");
    nl_jinja_limits tiny = {.mem_bytes = 4096, .ops = 0};
    const char *small = "{{ 'x' * 10000 }}";
    out = timed_render(small, strlen(small), &tiny, &secs);
    CHECK(!out && strstr(nl_last_error(), "needs more than 0.0 MiB"));
    nl_jinja_limits few = {.mem_bytes = 0, .ops = 50};
    const char *loop = "{% for i in range(100) %}{{ i }}{% endfor %}";
    out = timed_render(loop, strlen(loop), &few, &secs);
    CHECK(!out && strstr(nl_last_error(), "ran past 50 operations"));
}

int main(void) {
    vectors();
    constructs();
    errors();
    taint();
    budget();
    return nl_t_done();
}

/* --config FILE.json: a command's flags from a JSON object, the command line winning.
 *
 * The object's keys are flag names, with '_' read as '-' ("batch_tokens" is --batch-tokens),
 * so a checkpoint directory's run.json (every value a string) configures `train` as it ran:
 * "model_path" / "data_path" are --model / --data, "targets" keeps its list (the part before
 * " ("), "shuffle": "0" is --no-shuffle, "template": "auto" and an empty value are no flag, and
 * "val_data_path" is --val-data, and the record-only keys of run.json (the content hashes
 * "model" / "data", "init", "kernels", "validation", "batch_sizing": its "batch_tokens" is the
 * batch sized, given as --batch-tokens) are skipped, and so are "alpha" and "targets" of a run
 * that started from an adapter (its "init_adapter" gives them). A value is a string, a number or
 * a boolean (true: the flag is given; false: not), or a list of strings (the flag's
 * comma-separated value: "targets": ["q", "v"]); a key that is no flag of the command is an error
 * naming the file, line and key, and the nearest known flag (nl_cli_suggest: "learning_rate" ->
 * "lr").
 * --config FILE.yaml (or .yml): the same flags as a YAML map, the small strict subset of
 * util/yaml.h (maps, scalars, lists; no new dependency), errors at FILE:LINE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util/json.h"
#include "util/yaml.h"
#include "util/util.h"

/* the merged flags of --config: the command's flags point into them to the end of the process */
static char **config_argv;

static void free_config_argv(void) {
    for (char **p = config_argv; p && *p; p++) free(*p);
    free(config_argv);
    config_argv = NULL;
}

static int listed(const char *const *list, const char *name) {
    for (; list && *list; list++)
        if (!strcmp(*list, name)) return 1;
    return 0;
}

typedef struct {
    char **v;
    int n, cap;
} strv;

static int push(strv *a, const char *s, size_t len) {
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, s, len);
    c[len] = 0;
    a->v[a->n++] = c;
    a->v[a->n] = NULL;
    return 0;
}

/* --config FILE.yaml: errors name the line (the JSON's columns are not the YAML's) */
static int yaml_cfg;

/* "path:line:col" of a JSON offset ("path:line" for YAML); a static buffer */
static const char *loc(const char *path, const char *text, size_t len, size_t off) {
    static char b[600];
    int line, col;
    nl_json_linecol(text, len, off, &line, &col);
    if (yaml_cfg) snprintf(b, sizeof b, "%s:%d", path, line);
    else snprintf(b, sizeof b, "%s:%d:%d", path, line, col);
    return b;
}

/* run.json's content hashes: 16 hex digits */
static int is_hash(const nl_json *v) {
    if (v->type != NL_JSON_STRING || v->u.str.len != 16) return 0;
    for (size_t i = 0; i < 16; i++) {
        const char c = v->u.str.s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

int nl_cli_config(const char *cmd, int argc, char **argv, const char *const *known, const char *const *boolean,
                  int *argc_out, char ***argv_out) {
    *argc_out = argc;
    *argv_out = argv;
    const char *path = nl_cli_opt(argc, argv, "config");
    if (!path) return 0;
    size_t len;
    char *text = nl_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "nightlora %s: --config %s: %s\n", cmd, path, nl_last_error());
        return 1;
    }
    /* FILE.yaml / FILE.yml: the YAML subset (util/yaml.h) read as the JSON of the same lines */
    const size_t pl = strlen(path);
    yaml_cfg = (pl > 5 && !strcmp(path + pl - 5, ".yaml")) || (pl > 4 && !strcmp(path + pl - 4, ".yml"));
    if (yaml_cfg) {
        nl_yaml_error ye;
        char *js;
        size_t jl;
        if (nl_yaml_to_json(text, len, &js, &jl, &ye)) {
            fprintf(stderr, "nightlora %s: %s:%d:%d: %s\n", cmd, path, ye.line, ye.col, ye.msg);
            free(text);
            return 1;
        }
        free(text);
        text = js;
        len = jl;
    }
    nl_json_error je;
    nl_json *root = nl_json_parse(text, len, &je);
    if (!root || !nl_json_is_object(root)) {
        const char *where = loc(path, text, len, root ? root->offset : je.offset);
        fprintf(stderr, "nightlora %s: %s: %s\n", cmd, where,
                root ? (yaml_cfg ? "expected a map of flags (\"key: value\" lines)" : "expected a JSON object of flags")
                     : je.msg);
        nl_json_free(root);
        free(text);
        return 1;
    }
    /* a run.json of a run that started from an adapter ("init": "adapter HASH"): its alpha and
     * targets are the adapter's, which --init-adapter (its "init_adapter") brings again */
    const nl_json *init = nl_json_get(root, "init");
    const int from_adapter =
        nl_json_is_string(init) && !strncmp(init->u.str.s, "adapter ", 8) && nl_json_get(root, "init_adapter");
    strv a = {0};
    int rc = push(&a, argv[0], strlen(argv[0]));
    for (size_t i = 0; !rc && i < root->u.obj.n; i++) {
        const nl_json_member *m = &root->u.obj.members[i];
        char key[64];
        if (m->key_len >= sizeof key || memchr(m->key, 0, m->key_len)) {
            rc = 2;
            const char *where = loc(path, text, len, m->key_offset);
            fprintf(stderr, "nightlora %s: %s: key \"%.40s\" is no flag of %s\n", cmd, where, m->key, cmd);
            break;
        }
        for (size_t k = 0; k <= m->key_len; k++) key[k] = m->key[k] == '_' ? '-' : m->key[k];
        const nl_json *v = &m->value;
        /* run.json's record-only keys: the content hashes of model and data, init, kernels */
        if ((!strcmp(key, "model") || !strcmp(key, "data")) && is_hash(v)) continue;
        if (!strcmp(key, "init") || !strcmp(key, "kernels") || !strcmp(key, "validation") ||
            !strcmp(key, "batch-sizing"))
            continue;
        if (from_adapter && (!strcmp(key, "alpha") || !strcmp(key, "targets"))) continue;
        /* --steps and --epochs exclude each other: the command line's wins */
        if ((!strcmp(key, "steps") && nl_cli_opt(argc, argv, "epochs")) ||
            (!strcmp(key, "epochs") && nl_cli_opt(argc, argv, "steps")))
            continue;
        if (!strcmp(key, "model-path")) strcpy(key, "model");
        if (!strcmp(key, "data-path")) strcpy(key, "data");
        if (!strcmp(key, "val-data-path")) strcpy(key, "val-data");
        if (!strcmp(key, "config")) {
            rc = 2;
            const char *where = loc(path, text, len, m->key_offset);
            fprintf(stderr, "nightlora %s: %s: a config cannot name another --config\n", cmd, where);
            break;
        }
        char num[64], list_val[1024];
        const char *val = NULL;
        size_t vlen = 0;
        int flag_on = -1; /* booleans: 1 given, 0 not */
        if (v->type == NL_JSON_STRING) {
            val = v->u.str.s;
            vlen = v->u.str.len;
        } else if (v->type == NL_JSON_NUMBER) {
            int64_t iv;
            if (nl_json_int64(v, &iv) == 0) snprintf(num, sizeof num, "%lld", (long long)iv);
            else snprintf(num, sizeof num, "%.17g", v->u.num.d);
            val = num;
            vlen = strlen(num);
        } else if (v->type == NL_JSON_TRUE || v->type == NL_JSON_FALSE) {
            flag_on = v->type == NL_JSON_TRUE;
        } else if (v->type == NL_JSON_ARRAY && nl_json_len(v) > 0 && nl_json_len(v) <= 64) {
            /* a list of strings (targets: [q, v]): the flag's comma-separated value */
            size_t k = 0;
            for (size_t i = 0; i < nl_json_len(v) && k < sizeof list_val; i++) {
                const nl_json *e = nl_json_at(v, i);
                if (!nl_json_is_string(e) || memchr(e->u.str.s, ',', e->u.str.len) ||
                    memchr(e->u.str.s, 0, e->u.str.len)) {
                    k = sizeof list_val;
                    break;
                }
                k += (size_t)snprintf(list_val + k, sizeof list_val - k, "%s%s", i ? "," : "", e->u.str.s);
            }
            if (k >= sizeof list_val) {
                rc = 2;
                const char *where = loc(path, text, len, v->offset);
                fprintf(stderr,
                        "nightlora %s: %s: \"%s\": a list must hold strings without commas (at most %zu bytes)\n", cmd,
                        where, m->key, sizeof list_val - 1);
                break;
            }
            val = list_val;
            vlen = k;
        } else {
            rc = 2;
            const char *where = loc(path, text, len, v->offset);
            fprintf(stderr, "nightlora %s: %s: \"%s\": expected a string, number or boolean, got %s\n", cmd, where,
                    m->key, nl_json_type_name(v->type));
            break;
        }
        if (!strcmp(key, "shuffle") && listed(boolean, "no-shuffle")) {
            /* run.json: "shuffle": "1" / "0" */
            const int on = flag_on >= 0 ? flag_on : !(vlen == 1 && val[0] == '0');
            if (!on) rc = push(&a, "--no-shuffle", 12);
            continue;
        }
        if (!strcmp(key, "targets") && val) {
            const char *p = strstr(val, " (");
            if (p) vlen = (size_t)(p - val);
        }
        if ((!strcmp(key, "template") && val && !strcmp(val, "auto")) || (val && vlen == 0)) continue;
        const int is_bool = listed(boolean, key);
        if (!is_bool && !listed(known, key)) {
            rc = 2;
            const char *where = loc(path, text, len, m->key_offset);
            const char *note, *s = nl_cli_suggest(m->key, m->key_len, known, boolean, &note);
            if (s)
                fprintf(stderr,
                        "nightlora %s: %s: key \"%s\" is no flag of %s: did you mean \"%s\" (--%s)?%s%s (see 'nightlora"
                        " %s --help')\n",
                        cmd, where, m->key, cmd, s, s, note ? " " : "", note ? note : "", cmd);
            else
                fprintf(stderr, "nightlora %s: %s: key \"%s\" is no flag of %s (see 'nightlora %s --help')\n", cmd,
                        where, m->key, cmd, cmd);
            break;
        }
        char f[72];
        snprintf(f, sizeof f, "--%s", key);
        if (is_bool) {
            if (flag_on < 0) flag_on = !(vlen == 1 && val[0] == '0') && strcmp(val, "false");
            if (flag_on) rc = push(&a, f, strlen(f));
            continue;
        }
        if (flag_on >= 0) {
            rc = 2;
            const char *where = loc(path, text, len, v->offset);
            fprintf(stderr, "nightlora %s: %s: \"%s\" takes a value, not %s\n", cmd, where, m->key,
                    flag_on ? "true" : "false");
            break;
        }
        if (!rc) rc = push(&a, f, strlen(f));
        if (!rc) rc = push(&a, val, vlen);
    }
    /* then the command line (its later occurrences win), less --config itself */
    for (int i = 1; !rc && i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--config=", 9)) continue;
        rc = push(&a, argv[i], strlen(argv[i]));
    }
    nl_json_free(root);
    free(text);
    if (rc) {
        if (rc < 0) fprintf(stderr, "nightlora %s: out of memory\n", cmd);
        for (int i = 0; i < a.n; i++) free(a.v[i]);
        free(a.v);
        return 1;
    }
    *argc_out = a.n;
    *argv_out = a.v;
    config_argv = a.v;
    atexit(free_config_argv);
    return 0;
}

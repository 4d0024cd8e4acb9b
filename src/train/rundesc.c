/* train/rundesc: the run's description (the settings as key = value strings), its config
 * hash, DIR/run.json and the comparison a resume makes with it; see rundesc.h. */
#include "train/rundesc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/json.h"
#include "os/io.h"
#include "util/hash.h"
#include "util/util.h"

void nl_desc_add(nl_run_desc *d, const char *key, int kind, const char *fmt, ...) {
    if (d->n == d->cap) {
        const int nc = d->cap ? 2 * d->cap : 48;
        nl_run_kv *k = realloc(d->kv, (size_t)nc * sizeof *k);
        if (!k) {
            d->oom = 1;
            return;
        }
        d->kv = k;
        d->cap = nc;
    }
    va_list ap, aq;
    va_start(ap, fmt);
    va_copy(aq, ap);
    const int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *v = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (v) vsnprintf(v, (size_t)len + 1, fmt, aq);
    va_end(aq);
    if (!v) {
        d->oom = 1;
        return;
    }
    d->kv[d->n++] = (nl_run_kv){key, kind, v};
}

void nl_desc_free(nl_run_desc *d) {
    for (int i = 0; i < d->n; i++) free(d->kv[i].val);
    free(d->kv);
    memset(d, 0, sizeof *d);
}

const char *nl_desc_get(const nl_run_desc *d, const char *key) {
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->kv[i].key, key)) return d->kv[i].val;
    return "";
}

/* The shortest decimal text that reads back as exactly x (as a float when is_float): exact
 * for the hash, readable in run.json ("0.0002", not "0.00020000000000000001"). */
const char *nl_desc_num(char *buf, size_t cap, double x, int is_float) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        double y = strtod(buf, NULL);
        if (is_float ? (float)y == (float)x : y == x) break;
    }
    return buf;
}

/* The hash of the settings whose kind is in `kinds` (a bit per kind), the model excepted. */
static uint64_t hash_kinds(const nl_run_desc *d, unsigned kinds) {
    nl_hasher h;
    nl_hasher_init(&h, 0x6e6c636667ull);
    for (int i = 0; i < d->n; i++) {
        if (!(kinds >> d->kv[i].kind & 1u) || !strcmp(d->kv[i].key, "model")) continue;
        nl_hasher_update(&h, d->kv[i].key, strlen(d->kv[i].key) + 1);
        nl_hasher_update(&h, d->kv[i].val, strlen(d->kv[i].val) + 1);
    }
    return nl_hasher_final(&h);
}

/* The config hash of a commit: the trajectory settings, the model excepted (it has its own). */
uint64_t nl_desc_config_hash(const nl_run_desc *d) { return hash_kinds(d, 1u << NL_KV_CONFIG); }

static char *run_json_path(const char *dir) {
    size_t n = strlen(dir) + 10;
    char *p = nl_malloc(n);
    if (p) snprintf(p, n, "%s/run.json", dir);
    return p;
}

/* DIR/run.json parsed as an object, or NULL (no error set) when it is missing or unreadable. */
static nl_json *read_run_json(const char *dir) {
    char *path = run_json_path(dir);
    if (!path) return NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        free(path);
        return NULL;
    }
    size_t len;
    char *buf = nl_read_file(path, &len);
    free(path);
    if (!buf) {
        nl_clear_error();
        return NULL;
    }
    nl_json *j = nl_json_parse(buf, len, NULL);
    free(buf);
    if (!nl_json_is_object(j)) {
        nl_json_free(j);
        nl_clear_error();
        return NULL;
    }
    return j;
}

/* The schedule keys a build before the schedule left the config hash hashed with the rest; a
 * run.json may record one this description lacks (lr_min of a cosine run, now constant). */
static int legacy_schedule_key(const char *key) {
    static const char *const keys[] = {"steps", "lr", "schedule", "lr_min", "warmup"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(key, keys[i])) return 1;
    return 0;
}

uint64_t nl_desc_legacy_config_hash(const nl_run_desc *d, const char *dir) {
    nl_json *j = read_run_json(dir);
    if (!j) return hash_kinds(d, 1u << NL_KV_CONFIG | 1u << NL_KV_SCHEDULE);
    /* this description with the schedule as run.json has it, in run.json's (description) order */
    nl_run_desc *l = nl_calloc(1, sizeof *l);
    if (!l) {
        nl_json_free(j);
        nl_clear_error();
        return 0;
    }
    for (int i = 0; i < d->n; i++) {
        const nl_run_kv *kv = &d->kv[i];
        if (kv->kind == NL_KV_SCHEDULE) {
            const nl_json *v = nl_json_get(j, kv->key);
            if (!nl_json_is_string(v)) continue; /* not in that run's schedule */
            nl_desc_add(l, kv->key, kv->kind, "%s", v->u.str.s);
        } else {
            nl_desc_add(l, kv->key, kv->kind, "%s", kv->val);
        }
        /* schedule keys that run recorded right after this one and this description lacks */
        for (size_t m = 0; m + 1 < j->u.obj.n; m++) {
            if (strcmp(j->u.obj.members[m].key, kv->key)) continue;
            for (size_t k = m + 1; k < j->u.obj.n; k++) {
                const nl_json_member *mk = &j->u.obj.members[k];
                if (!legacy_schedule_key(mk->key) || nl_desc_get(d, mk->key)[0] || !nl_json_is_string(&mk->value))
                    break;
                nl_desc_add(l, mk->key, NL_KV_SCHEDULE, "%s", mk->value.u.str.s);
            }
            break;
        }
    }
    uint64_t h = l->oom ? 0 : hash_kinds(l, 1u << NL_KV_CONFIG | 1u << NL_KV_SCHEDULE);
    nl_desc_free(l);
    free(l);
    nl_json_free(j);
    return h;
}

static int buf_raw(char **buf, size_t *n, size_t *cap, const char *s) {
    size_t l = strlen(s);
    if (*n + l + 1 > *cap) {
        size_t nc = (*n + l + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return nl_err("out of memory");
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *n, s, l + 1);
    *n += l;
    return 0;
}

/* DIR/run.json: one JSON object, every value a string. */
int nl_desc_write(const nl_run_desc *d, const char *dir) {
    if (d->oom) return nl_err("out of memory describing the run");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return nl_err("%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (int i = 0; i < d->n && !rc; i++) {
        rc = buf_raw(&buf, &n, &cap, i ? ",\n  " : "{\n  ");
        if (!rc) rc = nl_json_escape(&buf, &n, &cap, d->kv[i].key, strlen(d->kv[i].key));
        if (!rc) rc = buf_raw(&buf, &n, &cap, ": ");
        if (!rc) rc = nl_json_escape(&buf, &n, &cap, d->kv[i].val, strlen(d->kv[i].val));
    }
    if (!rc) rc = buf_raw(&buf, &n, &cap, "\n}\n");
    char *path = rc ? NULL : run_json_path(dir);
    if (!rc) rc = path ? nl_io_write_file(NULL, path, buf, n) : -1;
    free(path);
    free(buf);
    return rc;
}

/* Compare `d` with DIR/run.json: append every differing setting of `kind` to msg, as
 * "key A there, B now; ..." or (as_flags) "--key A -> B, ...". Returns the number of
 * differences, or -1 when there is no readable run.json (nothing to compare). */
static int compare(const nl_run_desc *d, const char *dir, int kind, const char *only, int as_flags, char *msg,
                   size_t cap) {
    nl_json *j = read_run_json(dir);
    if (!j) return -1;
    int nd = 0;
    size_t ml = strlen(msg);
    for (int i = 0; i < d->n; i++) {
        if (d->kv[i].kind != kind || (only && strcmp(d->kv[i].key, only))) continue;
        const nl_json *v = nl_json_get(j, d->kv[i].key);
        if (!nl_json_is_string(v) && kind == NL_KV_KERNELS) continue; /* a run from before they were recorded */
        const char *was = nl_json_is_string(v) ? v->u.str.s : "(not recorded)";
        if (!strcmp(was, d->kv[i].val)) continue;
        const char *sep = nd++ ? (as_flags ? ", " : "; ") : "";
        if (ml >= cap) continue;
        if (as_flags) {
            char flag[32];
            snprintf(flag, sizeof flag, "%s", d->kv[i].key);
            for (char *c = flag; *c; c++)
                if (*c == '_') *c = '-';
            ml += (size_t)snprintf(msg + ml, cap - ml, "%s--%s %s -> %s", sep, flag, was, d->kv[i].val);
        } else if (!strcmp(d->kv[i].key, "model") || !strcmp(d->kv[i].key, "data")) {
            char pk[16];
            snprintf(pk, sizeof pk, "%s_path", d->kv[i].key);
            const nl_json *pv = nl_json_get(j, pk);
            ml += (size_t)snprintf(msg + ml, cap - ml, "%s%s %s (hash %s) there, %s (hash %s) now", sep, d->kv[i].key,
                                   nl_json_is_string(pv) ? pv->u.str.s : "?", was, nl_desc_get(d, pk), d->kv[i].val);
        } else {
            ml += (size_t)snprintf(msg + ml, cap - ml, "%s%s %s there, %s now", sep, d->kv[i].key, was, d->kv[i].val);
        }
    }
    nl_json_free(j);
    return nd;
}

int nl_desc_compare(const nl_run_desc *d, const char *dir, int kind, const char *only, char *msg, size_t cap) {
    return compare(d, dir, kind, only, 0, msg, cap);
}

int nl_desc_changes(const nl_run_desc *d, const char *dir, int kind, char *msg, size_t cap) {
    return compare(d, dir, kind, NULL, 1, msg, cap);
}

int nl_desc_history(const nl_run_desc *d, const char *dir, int64_t step, int resumed, int64_t total,
                    const char *command) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return nl_err("%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
    size_t pn = strlen(dir) + 12;
    char *path = nl_malloc(pn);
    if (!path) return -1;
    snprintf(path, pn, "%s/runs.jsonl", dir);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (resumed) { /* the lines before, each complete (a line cut by a crash goes) */
        struct stat st;
        size_t len = 0;
        char *old = stat(path, &st) == 0 ? nl_read_file(path, &len) : NULL;
        nl_clear_error();
        const char *end = old ? old + len : NULL;
        while (end && end > old && end[-1] != '\n') end--;
        if (old && end > old && (buf = malloc((size_t)(end - old) + 1))) {
            memcpy(buf, old, (size_t)(end - old));
            n = cap = (size_t)(end - old);
            buf[n] = 0;
        } else if (old && end > old) {
            rc = nl_err("out of memory");
        }
        free(old);
    }
    /* what this run changed: every kind a resume may change (the config cannot: it is refused) */
    char chg[2048] = "";
    static const int kinds[] = {NL_KV_SCHEDULE, NL_KV_NUMERICS, NL_KV_INFO};
    for (size_t k = 0; resumed && k < sizeof kinds / sizeof *kinds; k++) {
        size_t l = strlen(chg);
        if (l && l + 2 < sizeof chg) strcpy(chg + l, ", ");
        if (nl_desc_changes(d, dir, kinds[k], chg + strlen(chg), sizeof chg - strlen(chg)) <= 0) chg[l] = 0;
    }
    char num[64];
    snprintf(num, sizeof num, "{\"step\": %lld, \"resume\": %s, \"steps\": %lld", (long long)step,
             resumed ? "true" : "false", (long long)total);
    if (!rc) rc = buf_raw(&buf, &n, &cap, num);
    if (!rc && command) rc = buf_raw(&buf, &n, &cap, ", \"command\": ");
    if (!rc && command) rc = nl_json_escape(&buf, &n, &cap, command, strlen(command));
    if (!rc) rc = buf_raw(&buf, &n, &cap, ", \"changes\": ");
    if (!rc) rc = nl_json_escape(&buf, &n, &cap, chg, strlen(chg));
    if (!rc) rc = buf_raw(&buf, &n, &cap, "}\n");
    if (rc && !nl_last_error()[0]) nl_err("out of memory");
    if (!rc) rc = nl_io_write_file(NULL, path, buf, n);
    free(buf);
    free(path);
    return rc;
}

/* os/pacing: thermal/battery providers and the pause/resume policy. See pacing.h. */
#include "os/pacing.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "os/sysfs.h"
#include "util/util.h"

/* sysfs.h's reader: 0, or -1 with errno. */
static int read_small(const char *path, char *buf, size_t cap) { return nl_sysfs_read(path, buf, cap, NULL); }

/* Whole string (after leading blanks) is a base-10 integer. */
static int parse_long(const char *s, long *out) {
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* Printable excerpt of bad contents for an error message. */
static void excerpt(const char *s, char *out, size_t cap) {
    size_t j = 0;
    for (size_t i = 0; s[i] && j + 4 < cap; i++) out[j++] = (s[i] >= 32 && s[i] < 127) ? s[i] : '?';
    if (j + 4 >= cap) {
        out[j++] = '.';
        out[j++] = '.';
        out[j++] = '.';
    }
    out[j] = 0;
}

/* ------------------------------------------------------------------ none */

static int none_status(void *ctx, int *s) {
    (void)ctx;
    (void)s;
    return 1;
}
static int none_batt(void *ctx, float *c) {
    (void)ctx;
    (void)c;
    return 1;
}

void nl_thermal_none(nl_thermal_provider *out) {
    memset(out, 0, sizeof *out);
    out->thermal_status = none_status;
    out->battery_temp_c = none_batt;
    snprintf(out->desc, sizeof out->desc, "none");
}

void nl_thermal_free(nl_thermal_provider *p) {
    if (p && p->destroy) p->destroy(p->ctx);
    if (p) memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------ files */

typedef struct {
    char *status_file, *battery_file;
} files_ctx;

static int files_status(void *vctx, int *status) {
    files_ctx *c = vctx;
    if (!c->status_file) return 1;
    char buf[64], ex[40];
    const char *why;
    if (nl_sysfs_read(c->status_file, buf, sizeof buf, &why) != 0)
        return nl_err("%s: cannot read thermal status: %s", c->status_file, why);
    long v;
    if (parse_long(buf, &v) != 0 || v < 0 || v > 6) {
        excerpt(buf, ex, sizeof ex);
        return nl_err("%s: expected a thermal status, an integer 0..6, got '%s'", c->status_file, ex);
    }
    *status = (int)v;
    return 0;
}

static int files_batt(void *vctx, float *celsius) {
    files_ctx *c = vctx;
    if (!c->battery_file) return 1;
    char buf[64], ex[40];
    const char *why;
    if (nl_sysfs_read(c->battery_file, buf, sizeof buf, &why) != 0)
        return nl_err("%s: cannot read battery temperature: %s", c->battery_file, why);
    double v;
    if (parse_double(buf, &v) != 0 || v < -50 || v > 150) {
        excerpt(buf, ex, sizeof ex);
        return nl_err("%s: expected the battery temperature in °C as a decimal number "
                      "(-50..150), got '%s'",
                      c->battery_file, ex);
    }
    *celsius = (float)v;
    return 0;
}

static void files_destroy(void *vctx) {
    files_ctx *c = vctx;
    if (!c) return;
    free(c->status_file);
    free(c->battery_file);
    free(c);
}

int nl_thermal_files(nl_thermal_provider *out, const char *status_file, const char *battery_file) {
    memset(out, 0, sizeof *out);
    files_ctx *c = nl_calloc(1, sizeof *c);
    if (!c) return -1;
    if ((status_file && !(c->status_file = nl_strdup(status_file))) ||
        (battery_file && !(c->battery_file = nl_strdup(battery_file)))) {
        files_destroy(c);
        return -1;
    }
    int s;
    float t;
    if (files_status(c, &s) < 0 || files_batt(c, &t) < 0) {
        files_destroy(c);
        return -1;
    }
    out->thermal_status = files_status;
    out->battery_temp_c = files_batt;
    out->destroy = files_destroy;
    out->ctx = c;
    snprintf(out->desc, sizeof out->desc, "files: status %s; battery %s", status_file ? status_file : "-",
             battery_file ? battery_file : "-");
    return 0;
}

/* ------------------------------------------------------------------ sysfs */

typedef struct {
    char *temp_path;
    long scale;                       /* readings × scale = millidegrees (1, or from sensor_info) */
    long passive_mc, hot_mc, crit_mc; /* LONG_MIN when the zone has no such trip */
} zone;

typedef struct {
    char *battery_path; /* NULL: none found */
    zone *zones;
    int n_zones;
} sysfs_ctx;

static char *join(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + strlen(b) + (c ? strlen(c) : 0) + 1;
    char *s = nl_malloc(n);
    if (s) snprintf(s, n, "%s%s%s", a, b, c ? c : "");
    return s;
}

static void sysfs_destroy(void *vctx) {
    sysfs_ctx *c = vctx;
    if (!c) return;
    free(c->battery_path);
    for (int i = 0; i < c->n_zones; i++) free(c->zones[i].temp_path);
    free(c->zones);
    free(c);
}

/* Per-zone 0..6 from a temperature in millidegrees (documented in pacing.h). */
static int zone_status(const zone *z, long t) {
    if (z->crit_mc != LONG_MIN && t >= z->crit_mc) return 6;
    if (z->hot_mc != LONG_MIN && t >= z->hot_mc) return 4;
    if (z->passive_mc != LONG_MIN) {
        if (t >= z->passive_mc) return 2;
        if (t >= z->passive_mc - 10000) return 1;
        return 0;
    }
    if (t >= 95000) return 4;
    if (t >= 85000) return 3;
    if (t >= 75000) return 2;
    if (t >= 65000) return 1;
    return 0;
}

static int sane_mc(long t) { return t >= -40000 && t <= 200000; }

static int sysfs_status(void *vctx, int *status) {
    sysfs_ctx *c = vctx;
    int best = -1;
    for (int i = 0; i < c->n_zones; i++) {
        char buf[64];
        long t;
        if (read_small(c->zones[i].temp_path, buf, sizeof buf) != 0 || parse_long(buf, &t) != 0 || t < -200000 ||
            t > 200000 || !sane_mc(t *= c->zones[i].scale))
            continue;
        int s = zone_status(&c->zones[i], t);
        if (s > best) best = s;
    }
    if (best < 0) return 1;
    *status = best;
    return 0;
}

static int sysfs_batt(void *vctx, float *celsius) {
    sysfs_ctx *c = vctx;
    char buf[64];
    long t;
    if (!c->battery_path || read_small(c->battery_path, buf, sizeof buf) != 0 || parse_long(buf, &t) != 0 || t < -400 ||
        t > 1500)
        return 1;
    *celsius = (float)t / 10.0f;
    return 0;
}

static int is_zone_name(const char *s, long *idx) {
    if (strncmp(s, "thermal_zone", 12) != 0) return 0;
    return parse_long(s + 12, idx) == 0 && *idx >= 0 && s[12] >= '0' && s[12] <= '9';
}

typedef struct {
    long idx;
    const char *name;
} named;
static int cmp_named_idx(const void *a, const void *b) {
    long x = ((const named *)a)->idx, y = ((const named *)b)->idx;
    return x < y ? -1 : x > y;
}

static int short_name(const char *s) { return strlen(s) < 64; }

/* The entries of a directory (names < 64 chars, not starting with '.'), sorted by name. A
 * directory that is not there (ENOENT, ENOTDIR) or not readable here (EACCES, EPERM: an app
 * sandbox) has none; any other failure, a listing that fails part way included, is -1 with
 * nl_err naming the directory: a short list of zones would watch only some of them. */
static int list_dir(const nl_io *io, const char *path, char ***out) {
    int n = nl_sysfs_list(io, path, short_name, out);
    if (n >= 0) return n;
    *out = NULL;
    if (errno == ENOENT || errno == ENOTDIR || errno == EACCES || errno == EPERM) return 0;
    return nl_err("%s: cannot list: %s; the device's temperature cannot be watched (--thermal off trains without "
                  "pacing; --thermal-status-file / --battery-temp-file read a host app's readings)",
                  path, strerror(errno));
}

/* 0 with *found (NULL: no battery), or -1 (nl_err). */
static int find_battery(const nl_io *io, const char *root, char **found_out) {
    *found_out = NULL;
    char *p = join(root, "/sys/class/power_supply/battery/temp", NULL);
    if (!p) return -1;
    char buf[64];
    if (read_small(p, buf, sizeof buf) == 0) {
        *found_out = p;
        return 0;
    }
    free(p);
    char *dir = join(root, "/sys/class/power_supply", NULL);
    if (!dir) return -1;
    char **ents;
    int n = list_dir(io, dir, &ents);
    if (n < 0) {
        free(dir);
        return -1;
    }
    char *found = NULL;
    for (int i = 0; i < n && !found; i++) {
        char sub[128];
        snprintf(sub, sizeof sub, "/%s/type", ents[i]);
        char *tp = join(dir, sub, NULL);
        if (tp && read_small(tp, buf, sizeof buf) == 0 && strcmp(buf, "Battery") == 0) {
            snprintf(sub, sizeof sub, "/%s/temp", ents[i]);
            char *t = join(dir, sub, NULL);
            if (t && read_small(t, buf, sizeof buf) == 0) found = t;
            else free(t);
        }
        free(tp);
    }
    nl_sysfs_names_free(ents, n);
    free(dir);
    *found_out = found;
    return 0;
}

/* Qualcomm's msm_thermal (Android kernels up to 4.x) lists its sensors in
 * ROOT/sys/module/msm_thermal/sensor_info as "type:name:alias:scale" entries separated by
 * blanks, scale being what the zone's readings are per °C (tsens 10: tenths; adc 1: °C; pmic
 * 1000). The zone whose `type` is an entry's name reads in that unit (its trip points too):
 * returns the factor to millidegrees, 1 when the zone is not listed or the scale is not
 * 1, 10, 100 or 1000. */
static long sensor_scale(const char *info, const char *type) {
    if (!info || !*type) return 1;
    const size_t n = strlen(type);
    for (const char *e = info; *e;) {
        while (*e == ' ' || *e == '\t' || *e == '\n') e++;
        if (!*e) break;
        const char *end = e + strcspn(e, " \t\n");
        const char *c1 = memchr(e, ':', (size_t)(end - e));
        if (c1 && (size_t)(end - c1 - 1) > n && strncmp(c1 + 1, type, n) == 0 && c1[1 + n] == ':') {
            const char *c3 = c1 + 1 + n + 1;
            c3 = memchr(c3, ':', (size_t)(end - c3)); /* past the alias */
            if (c3) {
                char num[16];
                size_t k = (size_t)(end - c3 - 1);
                if (k > 0 && k < sizeof num) {
                    memcpy(num, c3 + 1, k);
                    num[k] = 0;
                    long f;
                    if (parse_long(num, &f) == 0 && (f == 1 || f == 10 || f == 100 || f == 1000)) return 1000 / f;
                }
            }
            return 1;
        }
        e = end;
    }
    return 1;
}

static void read_trips(const char *zdir, zone *z) {
    z->passive_mc = z->hot_mc = z->crit_mc = LONG_MIN;
    for (int k = 0; k < 32; k++) {
        char name[64], buf[64], tbuf[64];
        snprintf(name, sizeof name, "/trip_point_%d_type", k);
        char *tp = join(zdir, name, NULL);
        snprintf(name, sizeof name, "/trip_point_%d_temp", k);
        char *tt = join(zdir, name, NULL);
        long t;
        int ok = tp && tt && read_small(tp, buf, sizeof buf) == 0 && read_small(tt, tbuf, sizeof tbuf) == 0 &&
                 parse_long(tbuf, &t) == 0 && t >= -200000 && t <= 200000 && sane_mc(t *= z->scale);
        free(tp);
        free(tt);
        if (!ok) continue;
        if (strcmp(buf, "passive") == 0 && (z->passive_mc == LONG_MIN || t < z->passive_mc)) z->passive_mc = t;
        else if (strcmp(buf, "hot") == 0 && (z->hot_mc == LONG_MIN || t < z->hot_mc)) z->hot_mc = t;
        else if (strcmp(buf, "critical") == 0 && (z->crit_mc == LONG_MIN || t < z->crit_mc)) z->crit_mc = t;
    }
}

int nl_thermal_sysfs(nl_thermal_provider *out, const char *root) { return nl_thermal_sysfs_io(out, root, NULL); }

int nl_thermal_sysfs_io(nl_thermal_provider *out, const char *root, const nl_io *io) {
    memset(out, 0, sizeof *out);
    if (!root) root = "";
    sysfs_ctx *c = nl_calloc(1, sizeof *c);
    if (!c) return -1;
    if (find_battery(io, root, &c->battery_path)) {
        sysfs_destroy(c);
        return -1;
    }
    char *tdir = join(root, "/sys/class/thermal", NULL);
    if (!tdir) {
        sysfs_destroy(c);
        return -1;
    }
    char **names;
    int n = list_dir(io, tdir, &names), nz = 0;
    if (n < 0) {
        free(tdir);
        sysfs_destroy(c);
        return -1;
    }
    /* the msm_thermal sensor list, where there is one (NULL: every zone in millidegrees) */
    char info[4096];
    char *ip = join(root, "/sys/module/msm_thermal/sensor_info", NULL);
    const char *sinfo = ip && nl_sysfs_read(ip, info, sizeof info, NULL) == 0 ? info : NULL;
    free(ip);
    named *ents = nl_calloc(n ? (size_t)n : 1, sizeof *ents);
    for (int i = 0; ents && i < n; i++)
        if (is_zone_name(names[i], &ents[nz].idx)) ents[nz++].name = names[i];
    if (nz > 1) qsort(ents, (size_t)nz, sizeof *ents, cmp_named_idx);
    c->zones = ents ? nl_calloc(nz ? (size_t)nz : 1, sizeof *c->zones) : NULL;
    for (int i = 0; c->zones && i < nz; i++) {
        char sub[80];
        snprintf(sub, sizeof sub, "/%s", ents[i].name);
        char *zdir = join(tdir, sub, NULL);
        char *tp = zdir ? join(zdir, "/temp", NULL) : NULL;
        if (!tp) {
            free(zdir);
            continue;
        }
        zone *z = &c->zones[c->n_zones++];
        z->temp_path = tp;
        char type[64] = "";
        char *typ = sinfo ? join(zdir, "/type", NULL) : NULL;
        if (!typ || read_small(typ, type, sizeof type) != 0) type[0] = 0;
        free(typ);
        z->scale = sensor_scale(sinfo, type);
        read_trips(zdir, z);
        free(zdir);
    }
    free(ents);
    nl_sysfs_names_free(names, n);
    free(tdir);
    if (!c->zones) {
        sysfs_destroy(c);
        return -1;
    }
    out->thermal_status = sysfs_status;
    out->battery_temp_c = sysfs_batt;
    out->destroy = sysfs_destroy;
    out->ctx = c;
    snprintf(out->desc, sizeof out->desc, "sysfs: battery %s; %d thermal zones",
             c->battery_path ? c->battery_path : "none", c->n_zones);
    return 0;
}

int nl_thermal_open(nl_thermal_provider *out, const char *mode, const char *status_file, const char *battery_file) {
    if (mode && strcmp(mode, "off") == 0) {
        nl_thermal_none(out);
        return 0;
    }
    if (mode && *mode && strcmp(mode, "auto") != 0) {
        memset(out, 0, sizeof *out);
        return nl_err("--thermal: expected auto or off, got '%s'", mode);
    }
    if (status_file || battery_file) return nl_thermal_files(out, status_file, battery_file);
    return nl_thermal_sysfs(out, NULL);
}

/* ------------------------------------------------------------------ pacer */

void nl_pacer_defaults(nl_pacer_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->enabled = 1;
    cfg->pause_status = 2;
    cfg->resume_status = 1;
    cfg->pause_battery_c = 40.0;
    cfg->resume_battery_c = 38.0;
    cfg->check_interval_s = 1.0;
    cfg->poll_interval_s = 5.0;
}

static double real_now(void *ctx) {
    (void)ctx;
    return nl_now();
}

static void real_sleep(void *ctx, double s) {
    (void)ctx;
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    /* a signal cuts the sleep short on purpose: the caller then polls should_stop */
    nanosleep(&ts, NULL);
}

int nl_pacer_init(nl_pacer *p, const nl_pacer_cfg *cfg, nl_thermal_provider *src) {
    memset(p, 0, sizeof *p);
    if (cfg->resume_status > cfg->pause_status || cfg->resume_battery_c > cfg->pause_battery_c)
        return nl_err("pacer: resume thresholds (status %d, %.1f °C) must not exceed pause "
                      "thresholds (status %d, %.1f °C)",
                      cfg->resume_status, cfg->resume_battery_c, cfg->pause_status, cfg->pause_battery_c);
    if (!(cfg->poll_interval_s > 0) || !(cfg->check_interval_s >= 0))
        return nl_err("pacer: poll interval must be > 0 and check interval >= 0");
    p->cfg = *cfg;
    if (!p->cfg.now) p->cfg.now = real_now;
    if (!p->cfg.sleep) p->cfg.sleep = real_sleep;
    if (src) {
        p->src = *src;
        memset(src, 0, sizeof *src);
    } else nl_thermal_none(&p->src);
    p->last_read = -1;
    return 0;
}

void nl_pacer_free(nl_pacer *p) {
    if (!p) return;
    nl_thermal_free(&p->src);
    memset(p, 0, sizeof *p);
}

static int read_sources(nl_pacer *p) {
    int s = 0;
    float t = 0;
    int rs = p->src.thermal_status ? p->src.thermal_status(p->src.ctx, &s) : 1;
    if (rs < 0) return -1;
    int rb = p->src.battery_temp_c ? p->src.battery_temp_c(p->src.ctx, &t) : 1;
    if (rb < 0) return -1;
    p->have_status = rs == 0;
    p->status = rs == 0 ? s : 0;
    p->have_battery = rb == 0;
    p->battery_c = rb == 0 ? t : 0;
    p->last_read = p->cfg.now(p->cfg.clock_ctx);
    return 0;
}

static int is_hot(const nl_pacer *p) {
    return (p->have_status && p->status >= p->cfg.pause_status) ||
           (p->have_battery && p->battery_c >= p->cfg.pause_battery_c);
}

static int is_cool(const nl_pacer *p) {
    return (!p->have_status || p->status <= p->cfg.resume_status) &&
           (!p->have_battery || p->battery_c <= p->cfg.resume_battery_c);
}

static void NL_PRINTF(2, 3) logf_(nl_pacer *p, const char *fmt, ...) {
    if (!p->cfg.log) return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->cfg.log(p->cfg.log_ctx, msg);
}

static const char *const pause_names[] = {NULL, "thermal", "battery", "thermal+battery"};

const char *nl_pause_kind_name(unsigned kinds) { return kinds < 4 ? pause_names[kinds] : NULL; }

unsigned nl_pause_kind_parse(const char *name) {
    for (unsigned k = 1; name && k < 4; k++)
        if (!strcmp(name, pause_names[k])) return k;
    return 0;
}

int nl_pacer_check(nl_pacer *p) {
    if (!p->cfg.enabled) return 0;
    double t0 = p->cfg.now(p->cfg.clock_ctx);
    if (p->last_read >= 0 && t0 - p->last_read < p->cfg.check_interval_s) return 0;
    if (read_sources(p) != 0) return -1;
    if (!is_hot(p)) return 0;

    int hot_s = p->have_status && p->status >= p->cfg.pause_status;
    int hot_b = p->have_battery && p->battery_c >= p->cfg.pause_battery_c;
    if (hot_s && hot_b) logf_(p, "paused: thermal status %d, battery %.1f °C", p->status, (double)p->battery_c);
    else if (hot_s) logf_(p, "paused: thermal status %d", p->status);
    else logf_(p, "paused: battery %.1f °C", (double)p->battery_c);
    p->n_pauses++;
    p->pause_kinds |= (hot_s ? NL_PAUSE_THERMAL : 0u) | (hot_b ? NL_PAUSE_BATTERY : 0u);
    double start = p->last_read;
    for (;;) {
        if (p->cfg.should_stop && p->cfg.should_stop(p->cfg.stop_ctx)) {
            double el = p->cfg.now(p->cfg.clock_ctx) - start;
            p->paused_seconds += el;
            logf_(p, "stop requested while paused after %.1f s", el);
            return 1;
        }
        p->cfg.sleep(p->cfg.clock_ctx, p->cfg.poll_interval_s);
        if (read_sources(p) != 0) {
            p->paused_seconds += p->cfg.now(p->cfg.clock_ctx) - start;
            return -1;
        }
        if (is_cool(p)) {
            double el = p->last_read - start;
            p->paused_seconds += el;
            logf_(p, "resumed after %.1f s", el);
            return 0;
        }
    }
}

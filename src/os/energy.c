/* os/energy: energy counters (RAPL, battery); see energy.h. */
#include "os/energy.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "os/sysfs.h"
#include "util/util.h"

#define MAX_ZONES 16
#define PATH_CAP 512

typedef struct {
    char energy[PATH_CAP];
    uint64_t range_uj; /* counter wraps to 0 after this value */
    uint64_t last_uj;
} zone;

struct nl_energy {
    nl_energy_kind kind;
    char reason[1024];
    char source[256];
    double (*clock)(void *);
    void *clock_user;
    const nl_io *io; /* the directory listings (NULL: POSIX) */
    /* RAPL */
    zone z[MAX_ZONES];
    int n_zones;
    /* battery */
    char cur_path[PATH_CAP], volt_path[PATH_CAP], status_path[PATH_CAP];
    int has_status;
    double last_t, last_w;
    /* running total since open (J) and the state of the sampler */
    double joules;
    long samples;
    char fail[512]; /* sticky failure of a background sample ("" = none) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;
    double period_s;
};

static double default_clock(void *user) {
    (void)user;
    return nl_now();
}

/* A small sysfs file into buf (sysfs.h's reader); on failure "<path>: <reason>" goes to msg. */
static int read_small(const char *path, char *buf, size_t cap, char *msg, size_t msg_cap) {
    const char *why;
    if (nl_sysfs_read(path, buf, cap, &why) == 0) return 0;
    snprintf(msg, msg_cap, "%s: %s", path, why);
    return -1;
}

/* A decimal integer file (optionally signed): the whole content must be the number. */
static int read_int(const char *path, int allow_negative, int64_t *out, char *msg, size_t msg_cap) {
    char buf[64];
    if (read_small(path, buf, sizeof buf, msg, msg_cap)) return -1;
    const char *p = buf;
    int neg = 0;
    if (*p == '-' && allow_negative) {
        neg = 1;
        p++;
    }
    if (*p < '0' || *p > '9') {
        snprintf(msg, msg_cap, "%s: expected a%s decimal integer, read '%.32s'", path,
                 allow_negative ? "" : " non-negative", buf);
        return -1;
    }
    uint64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10 || v * 10 + (uint64_t)(*p - '0') > (uint64_t)INT64_MAX) {
            snprintf(msg, msg_cap, "%s: value '%.32s' out of range", path, buf);
            return -1;
        }
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (*p) {
        snprintf(msg, msg_cap, "%s: expected a decimal integer, read '%.32s'", path, buf);
        return -1;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

/* dst = "a/b/c" (c may be NULL: "a/b"); -1 when it does not fit (a path we cannot name is
 * treated like a missing file). */
static int join(char *dst, size_t cap, const char *a, const char *b, const char *c) {
    int n = c ? snprintf(dst, cap, "%s/%s/%s", a, b, c) : snprintf(dst, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap) {
        dst[0] = 0;
        return -1;
    }
    return 0;
}

static void append_reason(nl_energy *e, const char *msg) {
    size_t len = strlen(e->reason);
    snprintf(e->reason + len, sizeof e->reason - len, "%s%s", len ? "; " : "", msg);
}

/* "intel-rapl:<digits>" exactly (top-level zone). */
static int is_top_zone(const char *name) {
    if (strncmp(name, "intel-rapl:", 11)) return 0;
    const char *p = name + 11;
    if (!*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* Directory entries (sorted by name), filtered by keep(name) when given; -1 with errno (a
 * listing that fails part way too: a short list of RAPL zones would under-count). */
static int list_dir(const nl_io *io, const char *dir, int (*keep)(const char *), char ***names, int *n) {
    *n = nl_sysfs_list(io, dir, keep, names);
    if (*n < 0) {
        *n = 0;
        return -1;
    }
    return 0;
}

static void free_names(char **names, int n) { nl_sysfs_names_free(names, n); }

static int probe_rapl(nl_energy *e, const char *root) {
    char dir[PATH_CAP], msg[PATH_CAP + 128];
    snprintf(dir, sizeof dir, "%s/sys/class/powercap", root);
    char **names;
    int n;
    if (list_dir(e->io, dir, is_top_zone, &names, &n)) {
        snprintf(msg, sizeof msg, "no RAPL (%s: %s)", dir, strerror(errno));
        append_reason(e, msg);
        return 0;
    }
    if (n == 0) {
        snprintf(msg, sizeof msg, "no RAPL zone in %s", dir);
        append_reason(e, msg);
        free_names(names, n);
        return 0;
    }
    /* pass 0: zones other than psys; pass 1 (only if pass 0 found none usable): psys */
    char label[256] = "";
    char first_fail[PATH_CAP + 128] = "";
    for (int pass = 0; pass < 2 && e->n_zones == 0; pass++) {
        for (int i = 0; i < n && e->n_zones < MAX_ZONES; i++) {
            char path[PATH_CAP], zname[64] = "";
            if (join(path, sizeof path, dir, names[i], "name") ||
                read_small(path, zname, sizeof zname, msg, sizeof msg))
                snprintf(zname, sizeof zname, "%s", names[i]);
            if ((strcmp(zname, "psys") == 0) != (pass == 1)) continue;
            zone *z = &e->z[e->n_zones];
            int64_t range, v;
            if (join(path, sizeof path, dir, names[i], "max_energy_range_uj") ||
                join(z->energy, sizeof z->energy, dir, names[i], "energy_uj")) {
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s/%s: path too long", dir, names[i]);
                continue;
            }
            if (read_int(path, 0, &range, msg, sizeof msg)) {
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s", msg);
                continue;
            }
            if (range <= 0) {
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s: expected a range > 0", path);
                continue;
            }
            if (read_int(z->energy, 0, &v, msg, sizeof msg)) {
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s", msg);
                continue;
            }
            if (v > range) {
                if (!first_fail[0])
                    snprintf(first_fail, sizeof first_fail, "%s: %lld exceeds max_energy_range_uj %lld", z->energy,
                             (long long)v, (long long)range);
                continue;
            }
            z->range_uj = (uint64_t)range;
            z->last_uj = (uint64_t)v;
            size_t len = strlen(label);
            snprintf(label + len, sizeof label - len, "%s%s", len ? " + " : "", zname);
            e->n_zones++;
        }
    }
    free_names(names, n);
    if (e->n_zones == 0) {
        snprintf(msg, sizeof msg, "RAPL unreadable (%s)", first_fail);
        append_reason(e, msg);
        return 0;
    }
    /* A zone that could not be read while another could: refuse rather than under-count. */
    if (first_fail[0]) {
        snprintf(msg, sizeof msg, "RAPL partly unreadable (%s)", first_fail);
        append_reason(e, msg);
        e->n_zones = 0;
        return 0;
    }
    snprintf(e->source, sizeof e->source, "RAPL %s", label);
    e->kind = NL_ENERGY_RAPL;
    return 1;
}

static int is_charging(const char *status) { return !strcmp(status, "Charging") || !strcmp(status, "Full"); }

/* Battery power in W from one current/voltage sample. */
static int battery_watts(nl_energy *e, double *w, char *msg, size_t cap) {
    int64_t ua, uv;
    if (read_int(e->cur_path, 1, &ua, msg, cap) || read_int(e->volt_path, 1, &uv, msg, cap)) return -1;
    if (e->has_status) {
        char st[64];
        if (read_small(e->status_path, st, sizeof st, msg, cap)) return -1;
        if (is_charging(st)) {
            snprintf(msg, cap,
                     "%s: the battery is %s, so its current is no longer the device's consumption; energy since the "
                     "start is unknown",
                     e->status_path, st);
            return -1;
        }
    }
    *w = fabs((double)ua) * 1e-6 * fabs((double)uv) * 1e-6;
    return 0;
}

static int battery_type(const char *dir, const char *name) {
    char path[PATH_CAP], t[32], msg[PATH_CAP + 64];
    return join(path, sizeof path, dir, name, "type") == 0 && read_small(path, t, sizeof t, msg, sizeof msg) == 0 &&
           !strcmp(t, "Battery");
}

static int probe_battery(nl_energy *e, const char *root) {
    char dir[PATH_CAP], msg[PATH_CAP + 256];
    snprintf(dir, sizeof dir, "%s/sys/class/power_supply", root);
    char **names;
    int n;
    if (list_dir(e->io, dir, NULL, &names, &n)) {
        snprintf(msg, sizeof msg, "no battery (%s: %s)", dir, strerror(errno));
        append_reason(e, msg);
        return 0;
    }
    const char *pick = NULL;
    for (int i = 0; i < n && !pick; i++)
        if (!strcmp(names[i], "battery")) pick = names[i];
    for (int i = 0; i < n && !pick; i++)
        if (battery_type(dir, names[i])) pick = names[i];
    if (!pick) {
        snprintf(msg, sizeof msg, "no battery in %s", dir);
        append_reason(e, msg);
        free_names(names, n);
        return 0;
    }
    if (join(e->cur_path, sizeof e->cur_path, dir, pick, "current_now") ||
        join(e->volt_path, sizeof e->volt_path, dir, pick, "voltage_now") ||
        join(e->status_path, sizeof e->status_path, dir, pick, "status")) {
        snprintf(msg, sizeof msg, "battery: %s/%s: path too long", dir, pick);
        append_reason(e, msg);
        free_names(names, n);
        return 0;
    }
    snprintf(e->source, sizeof e->source, "battery %s (|current_now| x voltage_now, integrated)", pick);
    free_names(names, n);
    e->has_status = access(e->status_path, F_OK) == 0;
    double w;
    if (battery_watts(e, &w, msg, sizeof msg)) {
        char full[sizeof msg + 16];
        snprintf(full, sizeof full, "battery: %s", msg);
        append_reason(e, full);
        e->source[0] = 0;
        return 0;
    }
    e->last_w = w;
    e->last_t = e->clock(e->clock_user);
    e->kind = NL_ENERGY_BATTERY;
    return 1;
}

nl_energy *nl_energy_open_clock(const char *root, double (*clock)(void *user), void *clock_user) {
    return nl_energy_open_io(root, clock, clock_user, NULL);
}

nl_energy *nl_energy_open_io(const char *root, double (*clock)(void *user), void *clock_user, const nl_io *io) {
    nl_energy *e = nl_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->io = io;
    e->clock = clock ? clock : default_clock;
    e->clock_user = clock_user;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    /* "/" and "" both mean the real tree; never build "//sys". */
    const char *r = root && strcmp(root, "/") ? root : "";
    if (strlen(r) > PATH_CAP - 128) {
        snprintf(e->reason, sizeof e->reason, "root path too long");
        return e;
    }
    if (!probe_rapl(e, r)) probe_battery(e, r);
    if (e->kind != NL_ENERGY_NONE) {
        e->reason[0] = 0;
        e->samples = 1;
    }
    return e;
}

nl_energy *nl_energy_open(const char *root) { return nl_energy_open_clock(root, NULL, NULL); }

nl_energy_kind nl_energy_kind_of(const nl_energy *e) { return e->kind; }
const char *nl_energy_reason(const nl_energy *e) { return e->reason; }
const char *nl_energy_source(const nl_energy *e) { return e->source; }

/* One sample into the running total; caller holds mu. Failures are sticky. */
static int sample_locked(nl_energy *e) {
    if (e->fail[0]) return -1;
    char msg[sizeof e->fail];
    if (e->kind == NL_ENERGY_RAPL) {
        uint64_t now[MAX_ZONES];
        for (int i = 0; i < e->n_zones; i++) {
            int64_t v;
            if (read_int(e->z[i].energy, 0, &v, msg, sizeof msg)) goto fail;
            if ((uint64_t)v > e->z[i].range_uj) {
                snprintf(msg, sizeof msg, "%s: %lld exceeds max_energy_range_uj %llu", e->z[i].energy, (long long)v,
                         (unsigned long long)e->z[i].range_uj);
                goto fail;
            }
            now[i] = (uint64_t)v;
        }
        /* all zones read: only now commit, so a failed read never counts half a sample */
        for (int i = 0; i < e->n_zones; i++) {
            zone *z = &e->z[i];
            /* counts 0..range then restarts at 0: a smaller value means one wrap */
            uint64_t d = now[i] >= z->last_uj ? now[i] - z->last_uj : (z->range_uj - z->last_uj) + now[i];
            e->joules += (double)d * 1e-6;
            z->last_uj = now[i];
        }
    } else if (e->kind == NL_ENERGY_BATTERY) {
        double w, t = e->clock(e->clock_user);
        if (battery_watts(e, &w, msg, sizeof msg)) goto fail;
        if (t > e->last_t) e->joules += 0.5 * (w + e->last_w) * (t - e->last_t);
        e->last_t = t;
        e->last_w = w;
    } else {
        return nl_err("energy counters not available: %s", e->reason);
    }
    e->samples++;
    return 0;
fail:
    snprintf(e->fail, sizeof e->fail, "%s", msg);
    return -1;
}

int nl_energy_read(nl_energy *e, double *joules) {
    pthread_mutex_lock(&e->mu);
    int rc = sample_locked(e);
    if (rc == 0) *joules = e->joules;
    else if (e->fail[0]) nl_err("energy: %s", e->fail);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

long nl_energy_samples(nl_energy *e) {
    pthread_mutex_lock(&e->mu);
    long n = e->samples;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static void *sampler_main(void *arg) {
    nl_energy *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double s = floor(e->period_s);
        ts.tv_sec += (time_t)s;
        ts.tv_nsec += (long)((e->period_s - s) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int r = 0;
        while (!e->stop && r != ETIMEDOUT) r = pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        if (e->stop) break;
        if (sample_locked(e)) break; /* sticky: the next nl_energy_read reports it */
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int nl_energy_start_sampler(nl_energy *e, double period_s) {
    if (e->kind == NL_ENERGY_NONE) return 0;
    if (!(period_s > 0) || period_s > 3600)
        return nl_err("energy: sampler period %g s: expected 0 < period <= 3600", period_s);
    if (e->running) return nl_err("energy: the sampler is already running");
    e->period_s = period_s;
    e->stop = 0;
    int te = nl_thread_create(&e->thread, sampler_main, e);
    if (te) return nl_err("energy: cannot start the sampler thread: %s", strerror(te));
    e->running = 1;
    return 0;
}

void nl_energy_close(nl_energy *e) {
    if (!e) return;
    if (e->running) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

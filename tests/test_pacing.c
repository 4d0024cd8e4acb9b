/* os/pacing (+ os/signals): exact pause/resume points and hysteresis on scripted
 * heating/cooling with a fake clock; file and sysfs providers, bad contents; a cancel handle
 * cancelled by a real in-process signal. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "os/pacing.h"
#include "os/signals.h"
#include "util/util.h"

/* ---------------------------------------------------------------- fakes */

typedef struct {
    double t;
    int sleeps;
    int raise_on_sleep;       /* raise SIGINT on this sleep (1-based), 0 = never */
    void (*hook)(int sleeps); /* called after each sleep (the world changes meanwhile) */
} fake_clock;
static double fk_now(void *c) { return ((fake_clock *)c)->t; }
static void fk_sleep(void *c, double s) {
    fake_clock *f = c;
    f->t += s;
    f->sleeps++;
    if (f->raise_on_sleep && f->sleeps == f->raise_on_sleep) raise(SIGINT);
    if (f->hook) f->hook(f->sleeps);
}

typedef struct {
    int n;
    const int *status; /* -1 = unavailable */
    const float *batt; /* < -100 = unavailable */
    int reads;         /* readings taken so far (one per pacer reading) */
} script;
static int sc_status(void *c, int *s) {
    script *sc = c;
    int i = sc->reads < sc->n ? sc->reads : sc->n - 1;
    if (sc->status[i] < 0) return 1;
    *s = sc->status[i];
    return 0;
}
static int sc_batt(void *c, float *t) {
    script *sc = c;
    int i = sc->reads < sc->n ? sc->reads : sc->n - 1;
    sc->reads++; /* the pacer reads status first, then battery: one reading = one step */
    if (sc->batt[i] < -100) return 1;
    *t = sc->batt[i];
    return 0;
}

static char logs[16][128];
static int n_logs;
static void cap_log(void *ctx, const char *m) {
    (void)ctx;
    if (n_logs < 16) snprintf(logs[n_logs], sizeof logs[0], "%s", m);
    n_logs++;
}

static void setup(nl_pacer *p, fake_clock *fc, script *sc, double check_interval) {
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    cfg.check_interval_s = check_interval;
    cfg.poll_interval_s = 10.0;
    cfg.now = fk_now;
    cfg.sleep = fk_sleep;
    cfg.clock_ctx = fc;
    cfg.log = cap_log;
    nl_thermal_provider src = {sc_status, sc_batt, NULL, sc, "script"};
    n_logs = 0;
    CHECK(nl_pacer_init(p, &cfg, &src) == 0);
    CHECK(src.ctx == NULL); /* ownership taken */
}

/* ---------------------------------------------------------------- policy */

static void test_battery_hysteresis(void) {
    static const float batt[] = {35, 39, 39.9f, 40.0f, 39.5f, 38.5f, 38.0f, 39.0f, 39.9f, 40.5f, 36};
    static const int st[] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    script sc = {11, st, batt, 0};
    fake_clock fc = {100.0, 0, 0, NULL};
    nl_pacer p;
    setup(&p, &fc, &sc, 0);
    /* reads after each check: running checks read once; a paused check reads until cool */
    int expect_reads[] = {1, 2, 3, 7, 8, 9, 11};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        int rc = nl_pacer_check(&p);
        if (rc != 0 || sc.reads != expect_reads[i]) {
            ok = 0;
            fprintf(stderr, "check %d: rc %d reads %d (want %d)\n", i, rc, sc.reads, expect_reads[i]);
        }
    }
    CHECK(ok);
    CHECK(p.n_pauses == 2);
    CHECK(p.paused_seconds == 40.0);
    CHECK(fc.t == 140.0 && fc.sleeps == 4);
    CHECK(n_logs == 4);
    CHECK(p.pause_kinds == NL_PAUSE_BATTERY);
    CHECK(strcmp(logs[0], "paused: battery 40.0 °C") == 0);
    CHECK(strcmp(logs[1], "resumed after 30.0 s") == 0);
    CHECK(strcmp(logs[2], "paused: battery 40.5 °C") == 0);
    CHECK(strcmp(logs[3], "resumed after 10.0 s") == 0);
    nl_pacer_free(&p);
}

static void test_status_and_battery(void) {
    static const int st[] = {0, 1, 2, 1, 1, 3, 2, 0, 1};
    static const float batt[] = {30, 30, 30, 39, 38, 41, 30, 30, 39.5f};
    script sc = {9, st, batt, 0};
    fake_clock fc = {0, 0, 0, NULL};
    nl_pacer p;
    setup(&p, &fc, &sc, 0);
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 1);
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 2 && p.pause_kinds == 0);
    /* status 2 pauses; (1, 39) is not cool (battery above 38); (1, 38) is: a thermal pause
     * (the battery that held it is no cause) */
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 5);
    CHECK(p.pause_kinds == NL_PAUSE_THERMAL);
    p.pause_kinds = 0;
    /* (3, 41) pauses; (2, 30) not cool (status); (0, 30) cool */
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 8);
    CHECK(p.pause_kinds == (NL_PAUSE_THERMAL | NL_PAUSE_BATTERY));
    /* (1, 39.5): within both hysteresis bands, keeps running */
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 9);
    CHECK(p.n_pauses == 2 && p.paused_seconds == 40.0);
    CHECK(n_logs == 4);
    CHECK(strcmp(logs[0], "paused: thermal status 2") == 0);
    CHECK(strcmp(logs[1], "resumed after 20.0 s") == 0);
    CHECK(strcmp(logs[2], "paused: thermal status 3, battery 41.0 °C") == 0);
    CHECK(strcmp(logs[3], "resumed after 20.0 s") == 0);
    CHECK(p.have_status && p.status == 1 && p.have_battery && p.battery_c == 39.5f);
    nl_pacer_free(&p);
}

/* The kinds' names (the log rows' "pause_kind") and back. */
static void test_kind_names(void) {
    CHECK(nl_pause_kind_name(0) == NULL && !strcmp(nl_pause_kind_name(NL_PAUSE_THERMAL), "thermal") &&
          !strcmp(nl_pause_kind_name(NL_PAUSE_BATTERY), "battery") &&
          !strcmp(nl_pause_kind_name(NL_PAUSE_THERMAL | NL_PAUSE_BATTERY), "thermal+battery") &&
          nl_pause_kind_name(4) == NULL);
    for (unsigned k = 1; k < 4; k++) CHECK(nl_pause_kind_parse(nl_pause_kind_name(k)) == k);
    CHECK(nl_pause_kind_parse("cold") == 0 && nl_pause_kind_parse("") == 0 && nl_pause_kind_parse(NULL) == 0 &&
          nl_pause_kind_parse("battery+thermal") == 0);
}

static void test_intervals_and_off(void) {
    static const int st[] = {0};
    static const float batt[] = {30};
    script sc = {1, st, batt, 0};
    fake_clock fc = {5, 0, 0, NULL};
    nl_pacer p;
    setup(&p, &fc, &sc, 1.0);
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 1);
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 1); /* within the check interval */
    fc.t += 0.999;
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 1);
    fc.t += 0.001;
    CHECK(nl_pacer_check(&p) == 0 && sc.reads == 2);
    nl_pacer_free(&p);

    static const int hot[] = {6};
    static const float hb[] = {60};
    script sh = {1, hot, hb, 0};
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    cfg.enabled = 0; /* --thermal off */
    nl_thermal_provider src = {sc_status, sc_batt, NULL, &sh, "script"};
    CHECK(nl_pacer_init(&p, &cfg, &src) == 0);
    CHECK(nl_pacer_check(&p) == 0 && sh.reads == 0);
    nl_pacer_free(&p);

    /* bad configurations */
    nl_pacer_defaults(&cfg);
    cfg.resume_battery_c = 41;
    CHECK(nl_pacer_init(&p, &cfg, NULL) == -1 && strstr(nl_last_error(), "resume"));
    nl_pacer_defaults(&cfg);
    cfg.poll_interval_s = 0;
    CHECK(nl_pacer_init(&p, &cfg, NULL) == -1);
    /* no provider: never pauses */
    nl_pacer_defaults(&cfg);
    CHECK(nl_pacer_init(&p, &cfg, NULL) == 0 && nl_pacer_check(&p) == 0);
    nl_pacer_free(&p);
}

/* ---------------------------------------------------------------- signals */

static void test_signals(void) {
    struct sigaction before, after;
    sigaction(SIGINT, NULL, &before);
    nl_cancel run = {0}, other = {0};
    CHECK(nl_cancel_requested(&run) == 0 && nl_cancel_requested(NULL) == 0);
    CHECK(nl_signals_install(NULL) == -1);
    CHECK(nl_signals_install(&run) == 0);
    CHECK(nl_cancel_requested(&run) == 0);
    raise(SIGTERM);
    CHECK(nl_cancel_requested(&run) == SIGTERM && nl_cancel_poll(&run) == SIGTERM);
    CHECK(nl_cancel_requested(&other) == 0); /* a signal cancels the handle it points at, no other */
    nl_cancel_clear(&run);
    CHECK(nl_cancel_requested(&run) == 0);

    /* a stop request ends a pause: the 2nd sleep raises SIGINT */
    static const int st[] = {-1};
    static const float batt[] = {45};
    script sc = {1, st, batt, 0};
    fake_clock fc = {0, 0, 2, NULL};
    nl_pacer p;
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    cfg.poll_interval_s = 10;
    cfg.now = fk_now;
    cfg.sleep = fk_sleep;
    cfg.clock_ctx = &fc;
    cfg.log = cap_log;
    cfg.should_stop = nl_cancel_poll;
    cfg.stop_ctx = &run;
    nl_thermal_provider src = {sc_status, sc_batt, NULL, &sc, "script"};
    n_logs = 0;
    CHECK(nl_pacer_init(&p, &cfg, &src) == 0);
    CHECK(nl_pacer_check(&p) == 1);
    CHECK(nl_cancel_requested(&run) == SIGINT);
    CHECK(p.paused_seconds == 20.0 && p.n_pauses == 1);
    CHECK(n_logs == 2 && strcmp(logs[1], "stop requested while paused after 20.0 s") == 0);
    nl_pacer_free(&p);

    /* pointed at another handle, a signal cancels that one */
    CHECK(nl_signals_install(&other) == 0);
    raise(SIGINT);
    CHECK(nl_cancel_requested(&other) == SIGINT);
    nl_signals_restore();
    sigaction(SIGINT, NULL, &after);
    CHECK(after.sa_handler == before.sa_handler);
    nl_cancel_request(&run, 0);
    CHECK(nl_cancel_requested(&run) == 1);

    /* a second signal kills (default action); each says so on stderr at once when notes are set
     * (the first when it arrives, not when the step ends; the second before the process ends) */
    char errp[64];
    snprintf(errp, sizeof errp, "/tmp/nl_pacing_sig_%d.txt", (int)getpid());
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) _exit(4);
        nl_cancel c = {0};
        nl_signals_install(&c);
        nl_signals_notes("first: stopping at the end of this step\n", "second: stopped at once\n");
        raise(SIGINT);
        if (nl_cancel_requested(&c) != SIGINT) _exit(3);
        if (write(2, "between\n", 8) != 8) _exit(5);
        raise(SIGINT);
        _exit(0); /* should not get here */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "child status %d", status);
    char *said = nl_t_slurp(errp, NULL);
    CHECKF(said && !strcmp(said, "first: stopping at the end of this step\nbetween\nsecond: stopped at once\n"),
           "stderr: %s", said ? said : "(none)");
    free(said);
    unlink(errp);
}

/* ---------------------------------------------------------------- providers */

static char root[256];

static void put(const char *rel, const char *content) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    /* mkdir -p of the parent */
    for (char *s = p + strlen(root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    FILE *f = fopen(p, "w");
    fputs(content, f);
    fclose(f);
}

static void path(char *buf, size_t cap, const char *rel) { snprintf(buf, cap, "%s/%s", root, rel); }

static void test_files(void) {
    char sf[512], bf[512];
    path(sf, sizeof sf, "status");
    path(bf, sizeof bf, "batt");
    put("status", "2\n");
    put("batt", "38.5\n");
    nl_thermal_provider pr;
    CHECK(nl_thermal_files(&pr, sf, bf) == 0);
    int s = -1;
    float t = 0;
    CHECK(pr.thermal_status(pr.ctx, &s) == 0 && s == 2);
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 0 && t == 38.5f);
    /* contents change between readings: read every time */
    put("status", "0");
    CHECK(pr.thermal_status(pr.ctx, &s) == 0 && s == 0);
    nl_thermal_free(&pr);
    CHECK(nl_thermal_files(&pr, NULL, bf) == 0);
    CHECK(pr.thermal_status(pr.ctx, &s) == 1);
    nl_thermal_free(&pr);

    const char *bad_status[] = {"abc", "7", "-1", "", "2 3", "2.5", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_status / sizeof *bad_status; i++) {
        put("status", bad_status[i]);
        CHECKF(nl_thermal_files(&pr, sf, NULL) == -1 && strstr(nl_last_error(), sf) && strstr(nl_last_error(), "0..6"),
               "'%s': %s", bad_status[i], nl_last_error());
    }
    const char *bad_batt[] = {"warm", "", "1e400", "38,5", "nan", "400"};
    for (size_t i = 0; i < sizeof bad_batt / sizeof *bad_batt; i++) {
        put("batt", bad_batt[i]);
        CHECKF(nl_thermal_files(&pr, NULL, bf) == -1 && strstr(nl_last_error(), bf) && strstr(nl_last_error(), "°C"),
               "'%s': %s", bad_batt[i], nl_last_error());
    }
    char missing[512];
    path(missing, sizeof missing, "no/such/file");
    CHECK(nl_thermal_files(&pr, missing, NULL) == -1 && strstr(nl_last_error(), missing));

    /* a file that goes bad during the run stops the check with the file named */
    put("batt", "30");
    CHECK(nl_thermal_open(&pr, "auto", NULL, bf) == 0);
    nl_pacer p;
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    cfg.check_interval_s = 0;
    CHECK(nl_pacer_init(&p, &cfg, &pr) == 0);
    CHECK(nl_pacer_check(&p) == 0);
    put("batt", "hot!");
    CHECK(nl_pacer_check(&p) == -1 && strstr(nl_last_error(), bf) && strstr(nl_last_error(), "hot!"));
    nl_pacer_free(&p);

    CHECK(nl_thermal_open(&pr, "off", sf, bf) == 0 && pr.thermal_status(pr.ctx, &s) == 1 &&
          pr.battery_temp_c(pr.ctx, &t) == 1);
    nl_thermal_free(&pr);
    CHECK(nl_thermal_open(&pr, "sometimes", NULL, NULL) == -1 && strstr(nl_last_error(), "sometimes"));
}

/* the battery cools by 1 °C per poll: 39.5 (not cool), 38.5, 37.5 (cool) */
static void cool_battery(int sleeps) {
    char v[16];
    snprintf(v, sizeof v, "%d", 405 - 10 * sleeps);
    put("sys1/sys/class/power_supply/BAT1/temp", v);
}

static void test_sysfs(void) {
    char r[512];
    path(r, sizeof r, "sys1");
    nl_thermal_provider pr;
    int s;
    float t;
    /* nothing there: both unavailable */
    CHECK(nl_thermal_sysfs(&pr, r) == 0);
    CHECK(pr.thermal_status(pr.ctx, &s) == 1 && pr.battery_temp_c(pr.ctx, &t) == 1);
    nl_thermal_free(&pr);

    put("sys1/sys/class/power_supply/AC/type", "Mains\n");
    put("sys1/sys/class/power_supply/AC/temp", "999\n");
    put("sys1/sys/class/power_supply/BAT1/type", "Battery\n");
    put("sys1/sys/class/power_supply/BAT1/temp", "405\n");
    put("sys1/sys/class/thermal/thermal_zone0/temp", "50000\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_0_type", "active\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_0_temp", "40000\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_1_type", "passive\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_1_temp", "60000\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_2_type", "hot\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_2_temp", "85000\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_3_type", "critical\n");
    put("sys1/sys/class/thermal/thermal_zone0/trip_point_3_temp", "95000\n");
    put("sys1/sys/class/thermal/thermal_zone1/temp", "45000\n");
    put("sys1/sys/class/thermal/thermal_zone10/temp", "garbage\n");
    put("sys1/sys/class/thermal/cooling_device0/type", "fan\n");
    CHECK(nl_thermal_sysfs(&pr, r) == 0);
    CHECK(strstr(pr.desc, "BAT1/temp") && strstr(pr.desc, "3 thermal zones"));
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 0 && t == 40.5f);
    /* zone0: 50 °C >= passive 60 - 10 -> 1 ; zone1: 45 °C, fixed thresholds -> 0 */
    CHECK(pr.thermal_status(pr.ctx, &s) == 0 && s == 1);
    const struct {
        const char *z0, *z1;
        int want;
    } cases[] = {{"49999", "45000", 0}, {"60000", "45000", 2}, {"84999", "45000", 2}, {"85000", "45000", 4},
                 {"95000", "45000", 6}, {"20000", "64999", 0}, {"20000", "65000", 1}, {"20000", "75000", 2},
                 {"20000", "85000", 3}, {"20000", "95000", 4}, {"250000", "45000", 0} /* broken sensor ignored */};
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        put("sys1/sys/class/thermal/thermal_zone0/temp", cases[i].z0);
        put("sys1/sys/class/thermal/thermal_zone1/temp", cases[i].z1);
        if (pr.thermal_status(pr.ctx, &s) != 0 || s != cases[i].want) {
            bad++;
            fprintf(stderr, "zone temps %s/%s: status %d want %d\n", cases[i].z0, cases[i].z1, s, cases[i].want);
        }
    }
    CHECK(bad == 0);
    /* end to end: battery 40.5 °C pauses, cooling to 37.9 resumes */
    put("sys1/sys/class/thermal/thermal_zone0/temp", "30000");
    put("sys1/sys/class/thermal/thermal_zone1/temp", "30000");
    nl_pacer p;
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    fake_clock fc = {0, 0, 0, NULL};
    cfg.now = fk_now;
    cfg.sleep = fk_sleep;
    cfg.clock_ctx = &fc;
    cfg.log = cap_log;
    n_logs = 0;
    fc.hook = cool_battery;
    CHECK(nl_pacer_init(&p, &cfg, &pr) == 0);
    put("sys1/sys/class/power_supply/BAT1/temp", "405");
    CHECK(nl_pacer_check(&p) == 0);
    CHECK(fc.sleeps == 3 && p.paused_seconds == 15.0 && p.n_pauses == 1);
    CHECK(n_logs == 2 && strcmp(logs[0], "paused: battery 40.5 °C") == 0 &&
          strcmp(logs[1], "resumed after 15.0 s") == 0);
    nl_pacer_free(&p);

    /* the Android name wins over a scan */
    put("sys1/sys/class/power_supply/battery/temp", "312\n");
    CHECK(nl_thermal_sysfs(&pr, r) == 0);
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 0 && fabsf(t - 31.2f) < 1e-5f);
    put("sys1/sys/class/power_supply/battery/temp", "n/a\n"); /* unreadable later: unavailable */
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 1);
    nl_thermal_free(&pr);
}

/* A listing that fails is an error naming the directory (a short list of zones would watch only
 * some); a directory missing or not readable here (an app sandbox) has no zones. */
static void test_sysfs_listing_errors(void) {
    char r[512];
    path(r, sizeof r, "sys1"); /* the tree test_sysfs left: a battery scan and 3 zones */
    nl_thermal_provider pr;
    nl_io_fault f;
    long calls;
    nl_io_fault_init(&f, NULL, -1, 0, 0);
    CHECK(nl_thermal_sysfs_io(&pr, r, &f.io) == 0 && strstr(pr.desc, "3 thermal zones"));
    nl_thermal_free(&pr);
    calls = f.calls;
    CHECK(calls >= 1);
    for (long k = 0; k < calls; k++) {
        /* readdir failing part way (EIO, after the entries so far): refused */
        nl_io_fault_init(&f, NULL, k, EIO, 0);
        int rc = nl_thermal_sysfs_io(&pr, r, &f.io);
        const char *e = nl_last_error();
        CHECKF(rc == -1 && strstr(e, "cannot list") && strstr(e, strerror(EIO)) && strstr(e, r) &&
                   strstr(e, "--thermal off"),
               "listing %ld failing: rc %d, %s", k, rc, e);
        if (rc == 0) nl_thermal_free(&pr);
        /* not readable here: no zones / no battery, no error */
        nl_io_fault_init(&f, NULL, k, EACCES, 0);
        CHECKF(nl_thermal_sysfs_io(&pr, r, &f.io) == 0, "listing %ld EACCES: %s", k, nl_last_error());
        nl_thermal_free(&pr);
    }
}

/* A phone's sysfs layout (tests/data/sysfs/NAME.txt: "PATH VALUE" lines) written under
 * root/NAME; returns that directory. */
static const char *phone(const char *name) {
    static char dir[512];
    char fx[512], line[2048];
    snprintf(fx, sizeof fx, NL_TEST_DATA "/sysfs/%s.txt", name);
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    FILE *f = fopen(fx, "r");
    CHECKF(f != NULL, "%s: %s", fx, strerror(errno));
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        char rel[600], val[2048];
        snprintf(rel, sizeof rel, "%.63s/%.500s", name, line);
        snprintf(val, sizeof val, "%s", sp + 1); /* the newline stays, as sysfs writes it */
        put(rel, val);
    }
    if (f) fclose(f);
    return dir;
}

static void set_zone(const char *name, int z, const char *v) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s/sys/class/thermal/thermal_zone%d/temp", name, z);
    put(rel, v);
}

static int status_of(nl_thermal_provider *pr) {
    int s = -1;
    return pr->thermal_status(pr->ctx, &s) == 0 ? s : -1;
}

/* msm8953: zone 9 (tsens_tz_sensor4 = cpu4) cools from 80.0 °C to 60.0 °C during the first sleep */
static void cool_cpu4(int sleeps) {
    if (sleeps == 1) set_zone("msm8953", 9, "600");
}

/* Two real phones' layouts (the fixtures' comments say where they come from). */
static void test_phones(void) {
    nl_thermal_provider pr;
    float t;
    /* a Snapdragon 625 phone, Android kernel 3.18: 24 zones in three units (sensor_info) */
    const char *r = phone("msm8953");
    CHECK(nl_thermal_sysfs(&pr, r) == 0);
    CHECKF(strstr(pr.desc, "power_supply/battery/temp") && strstr(pr.desc, "24 thermal zones"), "%s", pr.desc);
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 0 && fabsf(t - 25.1f) < 1e-5f);
    CHECKF(status_of(&pr) == 0, "msm8953 at rest: status %d", status_of(&pr)); /* the hottest: the PMIC, 32.6 °C */
    /* cpu4's sensor reads tenths of °C: 800 is 80.0 °C (taken as millidegrees it would be 0.8 °C) */
    set_zone("msm8953", 9, "800");
    CHECKF(status_of(&pr) == 2, "msm8953 cpu4 at 80.0 °C: status %d", status_of(&pr));
    set_zone("msm8953", 9, "950");
    CHECKF(status_of(&pr) == 4, "msm8953 cpu4 at 95.0 °C: status %d", status_of(&pr));
    set_zone("msm8953", 9, "322");
    set_zone("msm8953", 2, "66"); /* xo_therm, an adc thermistor in °C */
    CHECKF(status_of(&pr) == 1, "msm8953 xo_therm at 66 °C: status %d", status_of(&pr));
    set_zone("msm8953", 2, "31");
    set_zone("msm8953", 21, "76000"); /* pm8953_tz in millidegrees */
    CHECKF(status_of(&pr) == 2, "msm8953 pmic at 76 °C: status %d", status_of(&pr));
    set_zone("msm8953", 21, "32636");
    /* end to end: cpu4 at 80 °C pauses the run, 60 °C resumes it */
    set_zone("msm8953", 9, "800");
    nl_pacer p;
    nl_pacer_cfg cfg;
    nl_pacer_defaults(&cfg);
    fake_clock fc = {0, 0, 0, cool_cpu4};
    cfg.now = fk_now;
    cfg.sleep = fk_sleep;
    cfg.clock_ctx = &fc;
    cfg.log = cap_log;
    n_logs = 0;
    CHECK(nl_pacer_init(&p, &cfg, &pr) == 0);
    CHECK(nl_pacer_check(&p) == 0);
    CHECKF(fc.sleeps == 1 && p.n_pauses == 1 && n_logs == 2 && strcmp(logs[0], "paused: thermal status 2") == 0,
           "msm8953 pause: %d sleeps, %ld pauses, %d logs (%s)", fc.sleeps, p.n_pauses, n_logs, n_logs ? logs[0] : "");
    nl_pacer_free(&p);

    /* OnePlus 8 (sm8250), Android kernel 4.19: 33 zones in millidegrees with passive trips */
    r = phone("oneplus8");
    CHECK(nl_thermal_sysfs(&pr, r) == 0);
    CHECKF(strstr(pr.desc, "power_supply/battery/temp") && strstr(pr.desc, "33 thermal zones"), "%s", pr.desc);
    CHECK(pr.battery_temp_c(pr.ctx, &t) == 0 && fabsf(t - 31.2f) < 1e-5f);
    CHECKF(status_of(&pr) == 0, "oneplus8 at rest: status %d", status_of(&pr));
    /* CPU 0 (tsens0 1: cpu-0-0-usr = zone 1, cpu-0-0-step = zone 29, passive at 110 °C) */
    set_zone("oneplus8", 1, "101000");
    set_zone("oneplus8", 29, "101000");
    CHECKF(status_of(&pr) == 1, "oneplus8 cpu0 at 101 °C: status %d", status_of(&pr));
    set_zone("oneplus8", 1, "110000");
    set_zone("oneplus8", 29, "110000");
    CHECKF(status_of(&pr) == 2, "oneplus8 cpu0 at 110 °C: status %d", status_of(&pr));
    set_zone("oneplus8", 1, "35000");
    set_zone("oneplus8", 29, "35000");
    /* DDR (tsens1 3: ddr-usr = zone 19, pop-mem-step = zone 28, passive at 95 °C) */
    set_zone("oneplus8", 19, "95000");
    set_zone("oneplus8", 28, "95000");
    CHECKF(status_of(&pr) == 2, "oneplus8 ddr at 95 °C: status %d", status_of(&pr));
    set_zone("oneplus8", 19, "35000");
    set_zone("oneplus8", 28, "35000");
    /* a gold core has only the user_space trips (115 °C): 106 °C is LIGHT */
    set_zone("oneplus8", 7, "106000");
    CHECKF(status_of(&pr) == 1, "oneplus8 cpu-1-0 at 106 °C: status %d", status_of(&pr));
    nl_thermal_free(&pr);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/nl_test_pacing_XXXXXX");
    if (!mkdtemp(root)) return 1;
    test_battery_hysteresis();
    test_status_and_battery();
    test_kind_names();
    test_intervals_and_off();
    test_signals();
    test_files();
    test_sysfs();
    test_sysfs_listing_errors();
    test_phones();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return nl_t_done();
}

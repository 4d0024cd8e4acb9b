/* os/pacing: pause training while the device is hot, resume when it has cooled.
 *
 * A provider reads two numbers, either of which may be unavailable:
 *   thermal status  0..6, Android PowerManager's scale: 0 NONE, 1 LIGHT, 2 MODERATE,
 *                   3 SEVERE, 4 CRITICAL, 5 EMERGENCY, 6 SHUTDOWN
 *   battery temperature in °C
 * Policy (docs/design.md §4), with hysteresis so the run does not flap at a threshold:
 *   pause  when status >= 2 OR battery >= 40.0 °C
 *   resume when status <= 1 AND battery <= 38.0 °C     (an unavailable reading never blocks)
 * The trainer calls nl_pacer_check between projection-service requests. */
#ifndef NL_PACING_H
#define NL_PACING_H

#include "os/io.h"

/* A source of readings. Each read function returns 0 with the value, 1 when this source does
 * not have that reading (now or ever), -1 on error (nl_err names the file and what was wrong).
 * destroy (may be NULL) frees ctx. Fill one in yourself to drive the pacer from a callback
 * (tests, a host app that pushes readings). */
typedef struct {
    int (*thermal_status)(void *ctx, int *status);
    int (*battery_temp_c)(void *ctx, float *celsius);
    void (*destroy)(void *ctx);
    void *ctx;
    char desc[256]; /* what it reads, for the log: "sysfs: battery <path>; 12 thermal zones" */
} nl_thermal_provider;

/* No readings at all (the pacer then never pauses). */
void nl_thermal_none(nl_thermal_provider *out);

/* Files a host app writes (either path may be NULL):
 *   status_file  an integer 0..6 (like Android's PowerManager thermal status), e.g. "2\n"
 *   battery_file the battery temperature in °C as a decimal number, e.g. "38.5\n"
 * Both are read once here, so a missing or malformed file is an error at start-up, and again
 * at every reading. Bad contents give "FILE: expected ..., got '...'". A host app should
 * replace the file atomically (write a temp file, rename) so a half-written number is never
 * seen. Returns 0 or -1 (nl_err). */
int nl_thermal_files(nl_thermal_provider *out, const char *status_file, const char *battery_file);

/* Linux / Android sysfs under `root` (NULL or "" = the real filesystem; tests pass a fake
 * tree). What it reads:
 *   battery  ROOT/sys/class/power_supply/battery/temp, else the `temp` of the first (by name)
 *            ROOT/sys/class/power_supply/<x>/ whose `type` is "Battery"; tenths of °C.
 *   status   ROOT/sys/class/thermal/thermal_zone<N>/temp (millidegrees C) of every zone, mapped
 *            to 0..6 per zone, the maximum taken. A zone with a `passive` trip point P (the
 *            temperature where the kernel starts throttling; trip_point_<k>_type/_temp) maps:
 *              t >= its `critical` trip -> 6, t >= its `hot` trip -> 4,
 *              t >= P -> 2, t >= P - 10 °C -> 1, else 0.
 *            A zone with no passive trip uses fixed thresholds:
 *              t >= 95 °C -> 4, >= 85 -> 3, >= 75 -> 2, >= 65 -> 1, else 0.
 *            Readings outside -40..200 °C are ignored as broken sensors. The unit is
 *            millidegrees, except for the zones ROOT/sys/module/msm_thermal/sensor_info lists
 *            (Qualcomm's older Android kernels: "type:name:alias:scale" with scale 10 = tenths,
 *            1 = °C; the zone's `type` is the name): those read, trips too, in their unit.
 * Unreadable or malformed sysfs files count as "unavailable" (Android kernels expose zones that
 * fail to read); they never stop a run. So does a directory that is missing or not readable
 * here (ENOENT, ENOTDIR, EACCES, EPERM: an app sandbox). The files are found once, here.
 * Returns 0, or -1 on out-of-memory and when a directory cannot be listed for another reason
 * (EIO, or readdir failing part way: a short list would watch only some zones), nl_err naming
 * the directory. */
int nl_thermal_sysfs(nl_thermal_provider *out, const char *root);
/* The same, listing the directories through io (NULL: nl_io_posix(); tests fail it). */
int nl_thermal_sysfs_io(nl_thermal_provider *out, const char *root, const nl_io *io);

/* The CLI's choice: mode "off" -> none; status_file or battery_file given -> files;
 * otherwise ("auto" or NULL) -> sysfs. Returns 0 or -1 (nl_err; also for an unknown mode). */
int nl_thermal_open(nl_thermal_provider *out, const char *mode, const char *status_file, const char *battery_file);

void nl_thermal_free(nl_thermal_provider *p);

typedef struct {
    int enabled;             /* 0 (--thermal off): nl_pacer_check returns 0 at once */
    int pause_status;        /* 2: pause when status >= this */
    int resume_status;       /* 1: resume only when status <= this */
    double pause_battery_c;  /* 40.0 */
    double resume_battery_c; /* 38.0 */
    double check_interval_s; /* 1.0: while running, read the sources at most this often
                                (checks in between return at once); 0 = every call */
    double poll_interval_s;  /* 5.0: while paused, sleep this long between readings */
    /* Clock and sleep hooks (NULL: nl_now and nanosleep). Tests pass a fake clock. */
    double (*now)(void *ctx);
    void (*sleep)(void *ctx, double seconds);
    void *clock_ctx;
    /* Called with "paused: battery 40.3 °C", "paused: thermal status 2", "resumed after
     * 12.0 s", "stop requested while paused after 3.0 s" (NULL: silent). */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
    /* Polled while paused; nonzero ends the pause and nl_pacer_check returns 1 (NULL: never).
     * nl_cancel_poll (signals.h) with stop_ctx = the run's cancel handle fits. */
    int (*should_stop)(void *ctx);
    void *stop_ctx;
} nl_pacer_cfg;

typedef struct {
    nl_pacer_cfg cfg;
    nl_thermal_provider src; /* owned */
    double last_read;        /* clock time of the last reading, < 0 before the first */
    int have_status, status; /* last readings */
    int have_battery;
    float battery_c;
    /* statistics */
    double paused_seconds; /* total time spent paused */
    long n_pauses;         /* pause transitions */
    unsigned pause_kinds;  /* NL_PAUSE_* of the readings that started a pause, or-ed since the
                              caller last zeroed it (the trainer: at each step's start) */
} nl_pacer;

/* What started a pause: thermal status >= pause_status, battery >= pause_battery_c. */
enum { NL_PAUSE_THERMAL = 1, NL_PAUSE_BATTERY = 2 };
/* "thermal", "battery", "thermal+battery" (the --log-json step rows' "pause_kind"); NULL for 0. */
const char *nl_pause_kind_name(unsigned kinds);
/* The kinds a name of nl_pause_kind_name stands for; 0 for any other text. */
unsigned nl_pause_kind_parse(const char *name);

/* enabled 1, status 2/1, battery 40/38 °C, check 1 s, poll 5 s, real clock, no log. */
void nl_pacer_defaults(nl_pacer_cfg *cfg);

/* Takes ownership of *src (it is zeroed). Returns 0 or -1 on a bad configuration
 * (resume thresholds above pause thresholds, non-positive poll interval). */
int nl_pacer_init(nl_pacer *p, const nl_pacer_cfg *cfg, nl_thermal_provider *src);

/* Call between service requests. Returns 0 at once when cool (or within check_interval of
 * the last reading). When hot, logs the pause, sleeps poll_interval_s at a time until the
 * resume condition holds, logs the resume and returns 0. Returns 1 when should_stop fired
 * during a pause, -1 when a provider fails (nl_err; paused time so far is still counted). */
int nl_pacer_check(nl_pacer *p);

void nl_pacer_free(nl_pacer *p);

#endif

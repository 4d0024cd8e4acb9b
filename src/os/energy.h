/* os/energy: cumulative energy use of the machine, where it exposes a counter, for
 * joules/token in `train` and `bench step`.
 *
 * Sources, tried in this order under a root directory (normally "/"; tests pass a fake tree):
 *
 *  1. Linux powercap RAPL: <root>/sys/class/powercap/intel-rapl:<N>/energy_uj, the top-level
 *     zones only (one per package; "intel-rapl:N:M" sub-zones such as core/uncore/dram are
 *     parts of, or beside, their package and would double count). A top-level zone named
 *     "psys" (the whole platform, which contains the packages) is used only when there is no
 *     other zone. Each counter is in µJ and wraps to 0 after max_energy_range_uj (typically
 *     2^32 µJ ≈ 4.3 kJ, i.e. every ~40 s at 100 W): a smaller reading than the last one means
 *     one wrap, so the counters must be read more often than one range per interval — the
 *     sampler thread (nl_energy_start_sampler) takes care of that. Since 2020 (CVE-2020-8694)
 *     energy_uj is readable by root only on most distributions: unavailable, with the reason.
 *
 *  2. A battery: <root>/sys/class/power_supply/battery (Android's name), else the first
 *     supply (in name order) whose `type` reads "Battery", with current_now (µA) and
 *     voltage_now (µV). Power = |current_now| · voltage_now (the sign convention of current
 *     differs between devices), integrated over time with the trapezoid rule between samples:
 *     accuracy depends on sampling often (sampler thread) and on the driver's own averaging.
 *     The battery current is the device's consumption only while it discharges: a battery
 *     whose `status` reads "Charging" or "Full" at open is unavailable, and one that starts
 *     charging later makes nl_energy_read fail (the energy since open is then unknown).
 *
 * Nothing here prints; the caller reports "energy counters not available: <reason>". */
#ifndef NL_ENERGY_H
#define NL_ENERGY_H

#include "os/io.h"

typedef struct nl_energy nl_energy;

typedef enum { NL_ENERGY_NONE = 0, NL_ENERGY_RAPL, NL_ENERGY_BATTERY } nl_energy_kind;

/* Probe the sources under `root` (NULL = "/") and take the first sample. Returns a handle
 * whether or not a counter is available (NULL only when out of memory, nl_err set).
 * `clock` (may be NULL = nl_now, monotonic seconds) is the time base of the battery
 * integration; tests pass a fake clock. */
nl_energy *nl_energy_open(const char *root);
nl_energy *nl_energy_open_clock(const char *root, double (*clock)(void *user), void *clock_user);
/* The same, listing the directories through io (NULL: nl_io_posix(); tests fail it: a listing
 * that fails, part way or not, leaves that source unavailable with the directory and errno in
 * the reason). */
nl_energy *nl_energy_open_io(const char *root, double (*clock)(void *user), void *clock_user, const nl_io *io);

nl_energy_kind nl_energy_kind_of(const nl_energy *e);
static inline int nl_energy_available(const nl_energy *e) { return e && nl_energy_kind_of(e) != NL_ENERGY_NONE; }
/* Why no counter is available (e.g. "/sys/class/powercap/intel-rapl:0/energy_uj: Permission
 * denied; no battery in /sys/class/power_supply"); "" when available. */
const char *nl_energy_reason(const nl_energy *e);
/* What is measured, e.g. "RAPL package-0 + package-1" or "battery (current_now × voltage_now,
 * integrated)"; "" when unavailable. */
const char *nl_energy_source(const nl_energy *e);

/* Take a sample now and give the joules used since open. -1 + nl_err when unavailable or a
 * counter cannot be read or parsed any more (the file named) or the battery started charging. */
int nl_energy_read(nl_energy *e, double *joules);

/* Sample every period_s seconds on a background thread (so RAPL wraps are never missed and
 * the battery power is integrated finely) until nl_energy_close. Reads stay valid meanwhile.
 * No-op returning 0 when unavailable. -1 + nl_err when the thread cannot be started. */
int nl_energy_start_sampler(nl_energy *e, double period_s);
/* Samples taken so far (open's included). */
long nl_energy_samples(nl_energy *e);

void nl_energy_close(nl_energy *e);

#endif

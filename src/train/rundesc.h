/* train/rundesc (private to train/): the run's description.
 * Every setting that changes the training trajectory is one key = value string; the config
 * hash stored in every commit is the hash of those strings (the model has its own hash in the
 * commit), and DIR/run.json keeps them readable so that a refused resume can name what
 * differs. Settings that change the numerics but not the configuration (backend, resident
 * precision, FP16 wire) are recorded too: a resume that changes them only warns, since its
 * result can no longer be bit-identical to an uninterrupted run. The schedule (the step count,
 * the learning rate, its kind, floor and warm-up) is recorded but not hashed: a resume may
 * change it (an extended run), and says what changed. The thread count, the
 * activation budget and pacing never change a result and are not recorded. The kernels
 * (nl_proj_describe) change every bit: a resume on others is refused unless asked for. */
#ifndef NL_RUNDESC_H
#define NL_RUNDESC_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

enum { NL_KV_CONFIG, NL_KV_NUMERICS, NL_KV_KERNELS, NL_KV_INFO, NL_KV_SCHEDULE };
typedef struct {
    const char *key;
    int kind;
    char *val; /* owned */
} nl_run_kv;
/* As many settings as the run has (no cap: a run with every option set records them all, its
 * paths whole), each value its own string; nl_desc_free releases them. */
typedef struct {
    nl_run_kv *kv;
    int n, cap;
    int oom; /* an add ran out of memory: nl_desc_write refuses */
} nl_run_desc;

/* Appends key = value (printf), of `kind`; `key` must outlive d. Out of memory sets d->oom. */
void nl_desc_add(nl_run_desc *d, const char *key, int kind, const char *fmt, ...) NL_PRINTF(4, 5);
void nl_desc_free(nl_run_desc *d);
/* The value of key, "" when absent. */
const char *nl_desc_get(const nl_run_desc *d, const char *key);
/* The shortest decimal text that reads back as exactly x (as a float when is_float). */
const char *nl_desc_num(char *buf, size_t cap, double x, int is_float);
/* The config hash of a commit: the NL_KV_CONFIG settings, the model excepted (it has its own). */
uint64_t nl_desc_config_hash(const nl_run_desc *d);
/* The config hash a build before the schedule left it (NL_KV_SCHEDULE) gave the commits of
 * this configuration: the NL_KV_CONFIG and NL_KV_SCHEDULE settings, the model excepted, in
 * description order, the schedule as DIR/run.json recorded it (the run those commits come
 * from; this description's own when there is no readable run.json). 0 when out of memory. */
uint64_t nl_desc_legacy_config_hash(const nl_run_desc *d, const char *dir);
/* Writes DIR/run.json (DIR created if missing): one JSON object, every value a string. */
int nl_desc_write(const nl_run_desc *d, const char *dir);
/* Compare d with DIR/run.json: appends "key A there, B now; ..." to msg for every differing
 * setting of `kind` (only the key `only` when not NULL). Returns the number of differences,
 * or -1 when there is no readable run.json. */
int nl_desc_compare(const nl_run_desc *d, const char *dir, int kind, const char *only, char *msg, size_t cap);
/* The same comparison said as flags: "--steps 10 -> 20, --lr 0.001 -> 0.0005" (a key's flag:
 * "--" and the key with '-' for '_'). */
int nl_desc_changes(const nl_run_desc *d, const char *dir, int kind, char *msg, size_t cap);

/* DIR/runs.jsonl, the run's history: one line per process that trained in DIR, {"step": S (the
 * step it started from), "resume": true|false, "steps": TOTAL, "command": "..." (absent when
 * NULL: a library caller), "changes": "--steps 10 -> 20, ..." (what it changed against
 * run.json: the schedule, the numerics and the recorded flags; "" for none)}. A resume
 * appends its line; a run that starts from step 0 without a commit begins the file anew.
 * Written atomically (the whole file, os/io.h). The report draws a resume's marker and lists
 * every command from it (eval/report.h). Call before nl_desc_write replaces run.json. */
int nl_desc_history(const nl_run_desc *d, const char *dir, int64_t step, int resumed, int64_t total,
                    const char *command);

#endif

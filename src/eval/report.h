/* eval/report: a training run's report, one self-contained HTML file to look at.
 *
 * Drawn from the rows of a --log-json file (trainer.h): one chart each, inline SVG, for the
 * training loss with the validation loss, the validation accuracy, the learning rate, the
 * gradient norm, tokens/s over the run's time axis (paused intervals, thermal or battery, and
 * evaluations shaded on it), and service vs CPU seconds per step; then the run's commands and
 * settings. The loss is drawn on a log axis (the linear one in a <details> under it) when every
 * loss is > 0; the step charts share one x span, so the accuracy lines up with the loss. With a
 * run.json, the run's history beside it (DIR/runs.jsonl, train/rundesc.h) lists every command,
 * the first and each resume with what it changed, and each resume is a dashed marker on every
 * chart (at its step; on the time axis at the time its first step began); the model and the
 * data are shown as their paths beside their content hashes. Inline CSS, no script, nothing fetched from anywhere:
 * any browser shows it offline.
 *
 * The log's rows, one JSON object a line:
 *   a step        {"step": N, "loss": L, "tokens": T, "seconds": S, ...} (also targets,
 *                 service_seconds, paused_seconds, lr, grad_norm, projected_grad, joules);
 *                 steps strictly increase (a log holds one run, resumes included);
 *   a validation  {"eval": {"step": N, "loss": L, "accuracy": A or null, "examples": E,
 *                 "tokens": T, "seconds": S}} (optional: a report without them says so);
 *   other kinds   objects without "step" or "eval" are counted and named, not drawn.
 * A line that is not JSON, not an object, or a step or validation row with a missing or
 * mistyped field is an error naming the file and line ("LOG:7:12: ..."); only a last line
 * without its newline (a run killed while writing it) is left out, and the report says so.
 * Members a row has beyond these are ignored (newer writers). A log without a step is an
 * error: there is nothing to draw. */
#ifndef NL_REPORT_H
#define NL_REPORT_H

#include "os/io.h"

typedef struct {
    const char *key, *value;
} nl_report_kv;

typedef struct {
    const char *log;          /* the --log-json file (required) */
    const char *run_json;     /* the checkpoint directory's run.json, or the directory (NULL: none) */
    const char *title;        /* the page's heading (NULL: "nightlora training report") */
    const nl_report_kv *info; /* more settings rows, shown first (the command line); borrowed */
    int n_info;
    const nl_io *io; /* the output's writes (NULL: nl_io_posix(); tests inject faults) */
} nl_report_opts;

/* Writes the report to `out` atomically (os/io.h: OUT.tmp, fsync, rename), so a failure leaves
 * what was there. `out` (or OUT.tmp) being one of the inputs is refused before anything is
 * written. Returns 0, or -1 (NL_IO_NOT_DURABLE when only the directory's fsync failed) with
 * nl_err naming the file. */
int nl_report_write(const nl_report_opts *o, const char *out);

#endif

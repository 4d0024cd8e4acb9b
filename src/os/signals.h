/* os/signals: a run's cancel handle, and SIGINT / SIGTERM pointed at one.
 *
 * A cancel handle (nl_cancel) asks a training run to commit and stop at the next safe point:
 * the trainer polls it between steps, the pacer while paused. Each run has its own (a host app
 * cancels one run without touching another); nothing here is process-global but the signal
 * handlers, which the CLI installs for its one run.
 *
 * With the handlers installed, the first SIGINT or SIGTERM cancels the handle they point at. A
 * SECOND one (the handle already cancelled) restores the default action and re-raises it, so a
 * second Ctrl-C ends the process at once; that is safe because a commit is atomic (the previous
 * commit stays loadable). The handler is installed without SA_RESTART so a blocking sleep
 * returns early. */
#ifndef NL_SIGNALS_H
#define NL_SIGNALS_H

/* A request to stop, set from any thread or a signal handler (nl_cancel_request is a lone
 * atomic store, async-signal-safe). A zeroed one is not cancelled. */
typedef struct {
    int requested; /* 0, or the signal number (1 when asked for from code) */
} nl_cancel;

void nl_cancel_request(nl_cancel *c, int sig); /* sig <= 0 records 1 */
int nl_cancel_requested(const nl_cancel *c);   /* NULL: 0 (nothing can cancel it) */
void nl_cancel_clear(nl_cancel *c);
/* nl_cancel_requested in the shape of a callback (nl_pacer_cfg.should_stop); ctx: the handle. */
int nl_cancel_poll(void *ctx);

/* Point SIGINT and SIGTERM at c (the handle itself is left as it is). Returns 0 or -1 (nl_err).
 * Calling it again while installed points them at the new handle. */
int nl_signals_install(nl_cancel *c);

/* What the handlers write to stderr (fd 2, with write: async-signal-safe) on the first request
 * (at once, not when the step ends) and on the second (before the process ends); NULL: nothing.
 * The strings are borrowed for as long as the handlers are installed. */
void nl_signals_notes(const char *first, const char *second);

/* Put back the handlers that were there before nl_signals_install (no-op if not installed). */
void nl_signals_restore(void);

#endif

/* sys/signals: SIGINT / SIGTERM ask the trainer to commit and stop at the next safe point.
 *
 * The first SIGINT or SIGTERM only sets a flag (a sig_atomic_t) that the trainer polls
 * between steps (and the pacer polls while paused). A SECOND one restores the default action
 * and re-raises it, so a second Ctrl-C ends the process at once; that is safe because a
 * commit is atomic (the previous commit stays loadable). The handler is installed without
 * SA_RESTART so a blocking sleep returns early. */
#ifndef NL_SIGNALS_H
#define NL_SIGNALS_H

/* Install the handlers for SIGINT and SIGTERM and clear the flag. Returns 0 or -1 (nl_err).
 * Calling it again while installed just clears the flag. */
int nl_signals_install(void);

/* Put back the handlers that were there before nl_signals_install (no-op if not installed). */
void nl_signals_restore(void);

/* 0 when no stop was requested, otherwise the signal number (or the value given to
 * nl_stop_request). */
int nl_stop_requested(void);

/* Ask for a stop from code (a host app, a test); sig > 0. */
void nl_stop_request(int sig);

/* Clear the flag. */
void nl_stop_clear(void);

/* nl_stop_requested() in the shape of a callback (nl_pacer_cfg.should_stop); ctx unused. */
int nl_stop_poll(void *ctx);

#endif

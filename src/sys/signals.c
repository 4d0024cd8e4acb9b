/* sys/signals: a stop flag set by SIGINT / SIGTERM. See signals.h. */
#include "sys/signals.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

#include "util/util.h"

static volatile sig_atomic_t stop_sig;
static struct sigaction old_int, old_term;
static int installed;

static void on_signal(int sig) {
    if (stop_sig) {
        /* second request: default action, delivered when this handler returns */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_sig = sig;
}

int nl_signals_install(void) {
    stop_sig = 0;
    if (installed) return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a sleeping pacer wakes up at once */
    if (sigaction(SIGINT, &sa, &old_int) != 0)
        return nl_err("cannot install the SIGINT handler: %s", strerror(errno));
    if (sigaction(SIGTERM, &sa, &old_term) != 0) {
        int e = errno;
        sigaction(SIGINT, &old_int, NULL);
        return nl_err("cannot install the SIGTERM handler: %s", strerror(e));
    }
    installed = 1;
    return 0;
}

void nl_signals_restore(void) {
    if (!installed) return;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    installed = 0;
}

int nl_stop_requested(void) { return (int)stop_sig; }

void nl_stop_request(int sig) { stop_sig = sig > 0 ? sig : 1; }

void nl_stop_clear(void) { stop_sig = 0; }

int nl_stop_poll(void *ctx) {
    (void)ctx;
    return (int)stop_sig;
}

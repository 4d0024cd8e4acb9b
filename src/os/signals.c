/* os/signals: cancel handles, and the SIGINT / SIGTERM handlers that cancel one. See signals.h. */
#include "os/signals.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

void nl_cancel_request(nl_cancel *c, int sig) { __atomic_store_n(&c->requested, sig > 0 ? sig : 1, __ATOMIC_SEQ_CST); }

int nl_cancel_requested(const nl_cancel *c) { return c ? __atomic_load_n(&c->requested, __ATOMIC_SEQ_CST) : 0; }

void nl_cancel_clear(nl_cancel *c) { __atomic_store_n(&c->requested, 0, __ATOMIC_SEQ_CST); }

int nl_cancel_poll(void *ctx) { return nl_cancel_requested(ctx); }

static nl_cancel *target; /* read by the handler: written only while the handlers are not installed, or atomically */
static struct sigaction old_int, old_term;
static int installed;

static const char *note_first, *note_second; /* nl_signals_notes; NULL: silent */

static void say(const char *msg) {
    if (!msg) return;
    size_t n = strlen(msg); /* async-signal-safe, as write is */
    while (n) {
        ssize_t w = write(2, msg, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            return;
        }
        msg += w;
        n -= (size_t)w;
    }
}

static void on_signal(int sig) {
    int saved = errno;
    nl_cancel *c = __atomic_load_n(&target, __ATOMIC_SEQ_CST);
    if (!c) return;
    if (nl_cancel_requested(c)) {
        /* second request: default action, delivered when this handler returns */
        say(__atomic_load_n(&note_second, __ATOMIC_SEQ_CST));
        signal(sig, SIG_DFL);
        raise(sig);
        errno = saved;
        return;
    }
    nl_cancel_request(c, sig);
    say(__atomic_load_n(&note_first, __ATOMIC_SEQ_CST));
    errno = saved;
}

void nl_signals_notes(const char *first, const char *second) {
    __atomic_store_n(&note_first, first, __ATOMIC_SEQ_CST);
    __atomic_store_n(&note_second, second, __ATOMIC_SEQ_CST);
}

int nl_signals_install(nl_cancel *c) {
    if (!c) return nl_err("signals: no cancel handle to point SIGINT and SIGTERM at");
    __atomic_store_n(&target, c, __ATOMIC_SEQ_CST);
    if (installed) return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a sleeping pacer wakes up at once */
    if (sigaction(SIGINT, &sa, &old_int) != 0) return nl_err("cannot install the SIGINT handler: %s", strerror(errno));
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
    __atomic_store_n(&target, NULL, __ATOMIC_SEQ_CST);
}

#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char err_slot[1024];

int nl_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_slot, sizeof err_slot, fmt, ap);
    va_end(ap);
    return -1;
}

int nl_err_prefix(const char *fmt, ...) {
    char old[sizeof err_slot];
    va_list ap;
    memcpy(old, err_slot, sizeof old);
    va_start(ap, fmt);
    int n = vsnprintf(err_slot, sizeof err_slot, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n + 2 < sizeof err_slot) {
        /* append ": old", cut to the slot */
        size_t room = sizeof err_slot - (size_t)n;
        err_slot[n] = ':';
        err_slot[n + 1] = ' ';
        memcpy(err_slot + n + 2, old, room - 2);
        err_slot[sizeof err_slot - 1] = 0;
    }
    return -1;
}

const char *nl_last_error(void) { return err_slot[0] ? err_slot : "unknown error"; }
void nl_clear_error(void) { err_slot[0] = 0; }

void *nl_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) nl_err("out of memory allocating %zu bytes", n);
    return p;
}

void *nl_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) nl_err("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

char *nl_strndup(const char *s, size_t n) {
    char *p = nl_malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *nl_strdup(const char *s) { return nl_strndup(s, strlen(s)); }

const char *nl_file_kind(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "an unknown kind of file";
    }
}

char *nl_read_file(const char *path, size_t *len) {
    /* O_NONBLOCK: a FIFO opens at once (and is refused below); no effect on a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        nl_err("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        if (e) nl_err("%s: cannot stat: %s", path, strerror(e));
        else nl_err("%s: is %s, not a regular file", path, nl_file_kind((unsigned)st.st_mode));
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        nl_err("%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        nl_err("%s: out of memory", path);
        return NULL;
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                nl_err("%s: out of memory", path);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        nl_err("%s: read error at offset %zu", path, n);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

double nl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static _Thread_local struct {
    void *p;
    size_t n;
} scratch_tls; /* reachable while the thread lives */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *p) { free(p); } /* a thread that ends frees its block */
static void scratch_key_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

void *nl_thread_scratch(size_t n) {
    if (n == 0) n = 1;
    if (scratch_tls.n >= n) return scratch_tls.p;
    const size_t want = (n + 63) / 64 * 64;
    void *q = aligned_alloc(64, want);
    if (!q) {
        nl_err("out of memory (%zu bytes of scratch)", n);
        return NULL;
    }
    free(scratch_tls.p);
    scratch_tls.p = q;
    scratch_tls.n = want;
    pthread_once(&scratch_once, scratch_key_init);
    pthread_setspecific(scratch_key, q);
    return q;
}

int nl_spin_wait(const int *word, int value, int until_eq, double seconds) {
    const double t0 = nl_now();
    for (int i = 1;; i++) {
        if ((__atomic_load_n(word, __ATOMIC_ACQUIRE) == value) == (until_eq != 0)) return 1;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
        if (i % 64 == 0) {
            if (nl_now() - t0 > seconds) return 0;
            sched_yield();
        }
    }
}

int nl_thread_create(pthread_t *th, void *(*fn)(void *), void *arg) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* the new thread inherits this mask */
    int rc = pthread_create(th, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* util: the error slot and small helpers every room uses.
 *
 * Functions in the library return an int status (0 = ok, negative = error) or NULL, and put
 * a one-line message in a thread-local slot: nl_err("%s: offset %llu: expected ...", ...).
 * The CLI prints nl_last_error() and exits non-zero. Nothing in the library calls exit(). */
#ifndef NL_UTIL_H
#define NL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define NL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NL_PRINTF(a, b)
#endif

/* Set the error slot; always returns -1 so callers can `return nl_err(...)`. */
int nl_err(const char *fmt, ...) NL_PRINTF(1, 2);
/* Prefix the current message: "prefix: old message". Returns -1. */
int nl_err_prefix(const char *fmt, ...) NL_PRINTF(1, 2);
const char *nl_last_error(void);
void nl_clear_error(void);

/* Allocation that records an error on failure (returns NULL then). */
void *nl_malloc(size_t n);
void *nl_calloc(size_t n, size_t size);
char *nl_strdup(const char *s);
char *nl_strndup(const char *s, size_t n);

/* Whole-file read (NUL-terminated extra byte); NULL + error on failure. Opened non-blocking,
 * and refused unless a regular file ("PATH: is a directory, not a regular file"), so a FIFO
 * never blocks and a directory never reads as "read error at offset 0". */
char *nl_read_file(const char *path, size_t *len);

/* What a file mode (st_mode) is, for messages: "a regular file", "a directory", "a FIFO",
 * "a socket", "a character device", "a block device", "a symbolic link", "an unknown kind of
 * file". */
const char *nl_file_kind(unsigned mode);

/* Overflow-checked size arithmetic: return 0 on success, -1 on overflow. */
static inline int nl_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return -1;
    *out = a * b;
    return 0;
}
static inline int nl_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return -1;
    *out = a + b;
    return 0;
}

/* pthread_create for the library's worker threads: they start with SIGINT and SIGTERM blocked,
 * so those signals reach the main thread (the trainer's stop flag, the pacer's sleep). */
#include <pthread.h>
int nl_thread_create(pthread_t *th, void *(*fn)(void *), void *arg);

/* This thread's scratch block of at least n bytes (64-byte aligned), kept for the next call on
 * the same thread (grown when a call needs more; freed when the thread ends): the per-call
 * working memory of the CPU nodes, which would otherwise be malloc'd and freed — and, at a few
 * MB, mmap'd and page-faulted in anew — on every call. One holder at a time per thread: a
 * caller must not keep it across a call that uses it too. NULL + nl_err when out of memory. */
void *nl_thread_scratch(size_t n);

/* Monotonic wall-clock seconds. */
double nl_now(void);

/* Hand-off between threads: spin for up to `seconds` (pausing, and yielding the core every few
 * rounds so a runnable thread is not starved) until the int at `word` equals `value`
 * (until_eq = 1) or differs from it (until_eq = 0); returns 1 once it does, 0 on time-out.
 * Callers still check and block on their condition variable afterwards: this only skips the
 * sleep and wake-up when the next job follows within microseconds, as it does between the
 * requests and nodes of a training step. Writers store the word with __atomic_store_n. */
int nl_spin_wait(const int *word, int value, int until_eq, double seconds);
#define NL_SPIN_S 50e-6

#endif

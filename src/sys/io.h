/* sys/io: the tiny injectable file-I/O layer under checkpoint commit/load.
 *
 * Every call the checkpoint code makes on a file goes through an nl_io table, so tests can
 * make the k-th call fail with ENOSPC or EIO (nl_io_fault) and check that a failed commit
 * leaves the previous one intact (SQLite's way of testing its atomic commit).
 *
 * Conventions are POSIX: functions return >= 0 on success and -1 with errno set on failure;
 * `ctx` is the table's own pointer, passed back to every function. */
#ifndef NL_IO_H
#define NL_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct nl_io {
    int (*open)(void *ctx, const char *path, int flags, int mode); /* returns fd */
    ssize_t (*read)(void *ctx, int fd, void *buf, size_t n);       /* may return short */
    ssize_t (*write)(void *ctx, int fd, const void *buf, size_t n); /* may return short */
    int (*size)(void *ctx, int fd, uint64_t *bytes);               /* fstat st_size */
    int (*fsync)(void *ctx, int fd);
    int (*close)(void *ctx, int fd);
    int (*rename)(void *ctx, const char *from, const char *to);
    int (*unlink)(void *ctx, const char *path);
    int (*fsync_dir)(void *ctx, const char *dir); /* open(O_RDONLY|O_DIRECTORY), fsync, close */
    void *ctx;
} nl_io;

/* The real thing (retries EINTR). Static table; never NULL. */
const nl_io *nl_io_posix(void);

/* Fault injection: wraps `base` and counts every call (any function). The call with
 * 0-based number `fail_at` fails with errno `err` without reaching `base`. With `sticky`
 * set, every later call fails too (a crash or a dead disk: nothing after that point reaches
 * the disk, not even cleanup). fail_at < 0 never fails (use it to count a clean run's calls). */
typedef struct {
    nl_io io;          /* pass &fault.io to the code under test */
    const nl_io *base;
    long calls;        /* calls made so far */
    long fail_at;
    int err;
    int sticky;
    int failed;        /* number of calls failed so far */
} nl_io_fault;

void nl_io_fault_init(nl_io_fault *f, const nl_io *base, long fail_at, int err, int sticky);

#endif

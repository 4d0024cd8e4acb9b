/* os/io: the tiny injectable file-I/O layer under every file the library commits (checkpoints,
 * adapters, models, run.json) and under the directory listings whose errors matter.
 *
 * Every call goes through an nl_io table, so tests can make the k-th call fail with ENOSPC or
 * EIO (nl_io_fault) and check that a failed write leaves the previous file intact (SQLite's
 * way of testing its atomic commit).
 *
 * Conventions are POSIX: functions return >= 0 on success and -1 with errno set on failure;
 * `ctx` is the table's own pointer, passed back to every function. */
#ifndef NL_IO_H
#define NL_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct nl_io {
    int (*open)(void *ctx, const char *path, int flags, int mode);    /* returns fd */
    ssize_t (*read)(void *ctx, int fd, void *buf, size_t n);          /* may return short */
    ssize_t (*write)(void *ctx, int fd, const void *buf, size_t n);   /* may return short */
    int (*fstat)(void *ctx, int fd, uint64_t *bytes, uint32_t *mode); /* st_size, st_mode */
    int (*fsync)(void *ctx, int fd);
    int (*close)(void *ctx, int fd);
    int (*rename)(void *ctx, const char *from, const char *to);
    int (*unlink)(void *ctx, const char *path);
    int (*fsync_dir)(void *ctx, const char *dir);              /* open(O_RDONLY|O_DIRECTORY), fsync, close */
    int (*lstat)(void *ctx, const char *path, uint32_t *mode); /* st_mode, links not followed */
    /* Every entry of dir but "." and ".." to each(user, name), in directory order; each returns
     * 0 to go on (non-zero stops the listing and is returned). 0 at the end; -1 with errno when
     * dir cannot be opened (ENOENT: it does not exist) or read (readdir's errno): the entries
     * delivered before a failure are then NOT the whole directory. */
    int (*list)(void *ctx, const char *dir, int (*each)(void *user, const char *name), void *user);
    void *ctx;
} nl_io;

/* The real thing (retries EINTR). Static table; never NULL. */
const nl_io *nl_io_posix(void);

/* Open an existing file for reading without ever blocking (O_NONBLOCK, so a FIFO put in its
 * place returns at once) and refuse what is not a regular file: "PATH: is a FIFO, not a
 * regular file". Returns the fd (blocking mode restored) with *bytes = its size (bytes may be
 * NULL), or -1 with nl_err naming the file ("PATH: cannot open: ..."). */
int nl_io_open_regular(const nl_io *io, const char *path, uint64_t *bytes);

/* ---- one atomic file write ----
 *
 * The protocol of every file the library writes whole (checkpoint commits, adapters, models,
 * run.json, the log rewritten on resume):
 *   1. TMP is created with O_CREAT|O_EXCL|O_NOFOLLOW, so a symlink planted there is never
 *      followed; a regular TMP left by a killed run is removed first; a symlink or anything
 *      else at TMP is refused, named ("TMP: is a symbolic link, not a temp file of ours;
 *      remove it");
 *   2. body(user, out) writes the content with nl_io_out_write;
 *   3. fsync, close, rename TMP onto PATH (nothing durable changed before this point: on any
 *      failure TMP is unlinked and PATH is what it was);
 *   4. fsync of PATH's directory, so the rename survives a power loss.
 * Every message names the file and the call (cannot create, write at offset N, fsync, close,
 * rename, fsync of the directory) with the errno text. */
typedef struct {
    const nl_io *io;
    int fd;
    const char *path; /* the temp file, for messages */
    uint64_t off;     /* bytes written so far */
} nl_io_out;

/* Write all of p[0..n) (1 MiB per call). 0, or -1 with nl_err "TMP: write at offset N failed". */
int nl_io_out_write(nl_io_out *out, const void *p, size_t n);

typedef int (*nl_io_body_fn)(void *user, nl_io_out *out); /* 0, or -1 with nl_err set */

/* Returned when only step 4 failed: PATH already holds the new content, the old one is gone,
 * but the rename may not survive a power loss (a message must not say the old file is kept). */
#define NL_IO_NOT_DURABLE (-2)

/* The protocol above. tmp NULL = PATH.tmp; io NULL = nl_io_posix(). Returns 0, -1 (PATH
 * unchanged) or NL_IO_NOT_DURABLE, with nl_err set. */
int nl_io_write_atomic(const nl_io *io, const char *path, const char *tmp, nl_io_body_fn body, void *user);

/* The same for a buffer in memory. */
int nl_io_write_file(const nl_io *io, const char *path, const void *buf, size_t len);

/* The protocol's temp file of PATH, "PATH.tmp" (malloc'd; NULL + nl_err out of memory): the one
 * place the name is made. */
char *nl_io_tmp_path(const char *path);

/* Create TMP as step 1 does and remove it again: whether PATH's directory takes our temp file
 * (checked before a long run that writes PATH at its end). Returns 0, or -1 with nl_err. */
int nl_io_probe_tmp(const nl_io *io, const char *tmp);

/* Fault injection: wraps `base` and counts every call (any function). The call with
 * 0-based number `fail_at` fails with errno `err` without reaching `base` (a failing `list`
 * delivers base's entries first, then fails: a readdir error after a partial listing). With
 * `sticky` set, every later call fails too (a crash or a dead disk: nothing after that point
 * reaches the disk, not even cleanup). fail_at < 0 never fails (use it to count a clean run's
 * calls). */
typedef struct {
    nl_io io; /* pass &fault.io to the code under test */
    const nl_io *base;
    long calls; /* calls made so far */
    long fail_at;
    int err;
    int sticky;
    int failed; /* number of calls failed so far */
} nl_io_fault;

void nl_io_fault_init(nl_io_fault *f, const nl_io *base, long fail_at, int err, int sticky);

#endif

/* sys/io: POSIX implementation of the injectable I/O table, and a fault injector. */
#include "sys/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static int px_open(void *ctx, const char *path, int flags, int mode) {
    (void)ctx;
    int fd;
    do fd = open(path, flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    return fd;
}

static ssize_t px_read(void *ctx, int fd, void *buf, size_t n) {
    (void)ctx;
    ssize_t r;
    do r = read(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r;
}

static ssize_t px_write(void *ctx, int fd, const void *buf, size_t n) {
    (void)ctx;
    ssize_t r;
    do r = write(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r;
}

static int px_size(void *ctx, int fd, uint64_t *bytes) {
    (void)ctx;
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    *bytes = (uint64_t)st.st_size;
    return 0;
}

static int px_fsync(void *ctx, int fd) {
    (void)ctx;
    int r;
    do r = fsync(fd);
    while (r < 0 && errno == EINTR);
    return r;
}

static int px_close(void *ctx, int fd) {
    (void)ctx;
    /* never retry close on EINTR: the descriptor is gone either way on Linux */
    return close(fd);
}

static int px_rename(void *ctx, const char *from, const char *to) {
    (void)ctx;
    return rename(from, to);
}

static int px_unlink(void *ctx, const char *path) {
    (void)ctx;
    return unlink(path);
}

static int px_fsync_dir(void *ctx, const char *dir) {
    int fd = px_open(ctx, dir, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0) return -1;
    int r = px_fsync(ctx, fd);
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

static const nl_io posix_io = {px_open, px_read, px_write, px_size, px_fsync,
                               px_close, px_rename, px_unlink, px_fsync_dir, NULL};

const nl_io *nl_io_posix(void) { return &posix_io; }

/* ---- fault injection ---- */

/* Returns 1 when this call must fail (errno set). */
static int fault_hit(nl_io_fault *f) {
    long k = f->calls++;
    if (f->fail_at >= 0 && (k == f->fail_at || (f->sticky && k > f->fail_at))) {
        f->failed++;
        errno = f->err;
        return 1;
    }
    return 0;
}

#define FB(f) ((f)->base)
static int ft_open(void *c, const char *p, int fl, int m) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->open(FB(f)->ctx, p, fl, m);
}
static ssize_t ft_read(void *c, int fd, void *b, size_t n) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->read(FB(f)->ctx, fd, b, n);
}
static ssize_t ft_write(void *c, int fd, const void *b, size_t n) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->write(FB(f)->ctx, fd, b, n);
}
static int ft_size(void *c, int fd, uint64_t *s) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->size(FB(f)->ctx, fd, s);
}
static int ft_fsync(void *c, int fd) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->fsync(FB(f)->ctx, fd);
}
static int ft_close(void *c, int fd) {
    nl_io_fault *f = c;
    if (fault_hit(f)) {
        /* a failed close still releases the descriptor (Linux semantics); don't leak it */
        int e = errno;
        FB(f)->close(FB(f)->ctx, fd);
        errno = e;
        return -1;
    }
    return FB(f)->close(FB(f)->ctx, fd);
}
static int ft_rename(void *c, const char *a, const char *b) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->rename(FB(f)->ctx, a, b);
}
static int ft_unlink(void *c, const char *p) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->unlink(FB(f)->ctx, p);
}
static int ft_fsync_dir(void *c, const char *d) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->fsync_dir(FB(f)->ctx, d);
}

void nl_io_fault_init(nl_io_fault *f, const nl_io *base, long fail_at, int err, int sticky) {
    f->io = (nl_io){ft_open, ft_read, ft_write, ft_size, ft_fsync,
                    ft_close, ft_rename, ft_unlink, ft_fsync_dir, f};
    f->base = base ? base : nl_io_posix();
    f->calls = 0;
    f->fail_at = fail_at;
    f->err = err;
    f->sticky = sticky;
    f->failed = 0;
}

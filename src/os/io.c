/* os/io: POSIX implementation of the injectable I/O table, the one atomic file write, and a
 * fault injector. */
#include "os/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

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

static int px_fstat(void *ctx, int fd, uint64_t *bytes, uint32_t *mode) {
    (void)ctx;
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    if (bytes) *bytes = (uint64_t)st.st_size;
    if (mode) *mode = (uint32_t)st.st_mode;
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

static int px_lstat(void *ctx, const char *path, uint32_t *mode) {
    (void)ctx;
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
    *mode = (uint32_t)st.st_mode;
    return 0;
}

static int px_list(void *ctx, const char *dir, int (*each)(void *user, const char *name), void *user) {
    (void)ctx;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int rc = 0;
    for (;;) {
        errno = 0; /* readdir returns NULL both at the end and on an error: errno tells them apart */
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) rc = -1;
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if ((rc = each(user, e->d_name)) != 0) break;
    }
    int err = errno;
    closedir(d);
    errno = err;
    return rc;
}

static const nl_io posix_io = {px_open,   px_read,   px_write,     px_fstat, px_fsync, px_close,
                               px_rename, px_unlink, px_fsync_dir, px_lstat, px_list,  NULL};

const nl_io *nl_io_posix(void) { return &posix_io; }

/* ---- regular files, one atomic write ---- */

int nl_io_open_regular(const nl_io *io, const char *path, uint64_t *bytes) {
    if (!io) io = nl_io_posix();
    /* O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; on a regular file it
     * changes nothing, so the descriptor is used as it is */
    int fd = io->open(io->ctx, path, O_RDONLY | O_NONBLOCK, 0);
    if (fd < 0) return nl_err("%s: cannot open: %s", path, strerror(errno));
    uint64_t n;
    uint32_t mode;
    if (io->fstat(io->ctx, fd, &n, &mode) != 0) {
        int e = errno;
        io->close(io->ctx, fd);
        return nl_err("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(mode)) {
        io->close(io->ctx, fd);
        return nl_err("%s: is %s, not a regular file", path, nl_file_kind(mode));
    }
    if (bytes) *bytes = n;
    return fd;
}

int nl_io_out_write(nl_io_out *o, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n) {
        size_t chunk = n < (1u << 20) ? n : (1u << 20);
        ssize_t r = o->io->write(o->io->ctx, o->fd, p, chunk);
        if (r <= 0) {
            const char *why = r == 0 ? "wrote 0 bytes" : strerror(errno);
            return nl_err("%s: write at offset %llu failed: %s", o->path, (unsigned long long)o->off, why);
        }
        p += r;
        n -= (size_t)r;
        o->off += (uint64_t)r;
    }
    return 0;
}

/* Step 1 of the protocol (io.h): the temp file, created exclusively, never through a link. */
static int create_tmp(const nl_io *io, const char *tmp) {
    for (int tries = 0;; tries++) {
        int fd = io->open(io->ctx, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0666);
        if (fd >= 0) return fd;
        if (errno != EEXIST || tries > 0) return nl_err("%s: cannot create: %s", tmp, strerror(errno));
        uint32_t mode;
        if (io->lstat(io->ctx, tmp, &mode) != 0) {
            if (errno == ENOENT) continue; /* gone in between */
            return nl_err("%s: cannot create: it exists and cannot be examined: %s", tmp, strerror(errno));
        }
        if (S_ISLNK(mode))
            return nl_err("%s: is a symbolic link, not a temp file of ours: refusing to follow it; remove it", tmp);
        if (!S_ISREG(mode)) return nl_err("%s: is %s, not a temp file of ours; remove it", tmp, nl_file_kind(mode));
        /* a regular file: the temp file of a run that was killed while writing */
        if (io->unlink(io->ctx, tmp) != 0 && errno != ENOENT)
            return nl_err("%s: cannot create: a stale temp file is in the way and cannot be removed: %s", tmp,
                          strerror(errno));
    }
}

char *nl_io_tmp_path(const char *path) {
    size_t pl = strlen(path);
    char *t = nl_malloc(pl + 5);
    if (t) {
        memcpy(t, path, pl);
        memcpy(t + pl, ".tmp", 5);
    }
    return t;
}

/* The directory holding path (malloc'd): "." without a slash, "/" for "/name". */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return nl_strdup(".");
    if (slash == path) return nl_strdup("/");
    return nl_strndup(path, (size_t)(slash - path));
}

int nl_io_write_atomic(const nl_io *io, const char *path, const char *tmp, nl_io_body_fn body, void *user) {
    if (!io) io = nl_io_posix();
    char *own = tmp ? NULL : nl_io_tmp_path(path), *dir = dir_of(path);
    if (!tmp) tmp = own;
    int rc = -1;
    if (!tmp || !dir) goto end;
    nl_io_out out = {io, -1, tmp, 0};
    out.fd = create_tmp(io, tmp);
    if (out.fd < 0) goto end; /* nothing of ours to remove */
    rc = body(user, &out) ? -1 : 0;
    if (!rc && io->fsync(io->ctx, out.fd) != 0) rc = nl_err("%s: fsync failed: %s", tmp, strerror(errno));
    int close_rc = io->close(io->ctx, out.fd); /* the descriptor is released either way */
    if (!rc && close_rc != 0) rc = nl_err("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && io->rename(io->ctx, tmp, path) != 0)
        rc = nl_err("%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (rc) {
        /* nothing durable changed: drop the partial temp file, keep the error message */
        io->unlink(io->ctx, tmp);
        goto end;
    }
    if (io->fsync_dir(io->ctx, dir) != 0) {
        nl_err("%s: fsync of the directory after writing %s failed: %s", dir, path, strerror(errno));
        rc = NL_IO_NOT_DURABLE;
    }
end:
    free(own);
    free(dir);
    return rc;
}

typedef struct {
    const void *buf;
    size_t len;
} mem_body;

static int write_mem(void *user, nl_io_out *out) {
    const mem_body *m = user;
    return nl_io_out_write(out, m->buf, m->len);
}

int nl_io_write_file(const nl_io *io, const char *path, const void *buf, size_t len) {
    mem_body m = {buf, len};
    return nl_io_write_atomic(io, path, NULL, write_mem, &m);
}

int nl_io_probe_tmp(const nl_io *io, const char *tmp) {
    if (!io) io = nl_io_posix();
    int fd = create_tmp(io, tmp);
    if (fd < 0) return -1;
    io->close(io->ctx, fd);
    io->unlink(io->ctx, tmp);
    return 0;
}

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
static int ft_fstat(void *c, int fd, uint64_t *s, uint32_t *m) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->fstat(FB(f)->ctx, fd, s, m);
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

static int ft_lstat(void *c, const char *p, uint32_t *m) {
    nl_io_fault *f = c;
    return fault_hit(f) ? -1 : FB(f)->lstat(FB(f)->ctx, p, m);
}
static int ft_list(void *c, const char *d, int (*each)(void *, const char *), void *user) {
    nl_io_fault *f = c;
    if (fault_hit(f)) {
        /* readdir failing part way: the entries so far were delivered, then the error */
        int e = errno;
        if (FB(f)->list(FB(f)->ctx, d, each, user) > 0) {} /* what base says no longer matters */
        errno = e;
        return -1;
    }
    return FB(f)->list(FB(f)->ctx, d, each, user);
}

void nl_io_fault_init(nl_io_fault *f, const nl_io *base, long fail_at, int err, int sticky) {
    f->io = (nl_io){ft_open,   ft_read,   ft_write,     ft_fstat, ft_fsync, ft_close,
                    ft_rename, ft_unlink, ft_fsync_dir, ft_lstat, ft_list,  f};
    f->base = base ? base : nl_io_posix();
    f->calls = 0;
    f->fail_at = fail_at;
    f->err = err;
    f->sticky = sticky;
    f->failed = 0;
}

/* os/sysfs: small-file and directory reads for the OS probes. See sysfs.h. */
#include "os/sysfs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

static void say(const char **why, const char *msg) {
    if (why) *why = msg;
}

/* "is a FIFO, not a regular file", in a per-thread buffer that lives until the next call */
static const char *not_regular(unsigned mode) {
    static _Thread_local char msg[64];
    snprintf(msg, sizeof msg, "is %s, not a regular file", nl_file_kind(mode));
    return msg;
}

int nl_sysfs_read(const char *path, char *buf, size_t cap, const char **why) {
    int fd;
    do fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        say(why, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        say(why, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        say(why, not_regular((unsigned)st.st_mode));
        close(fd);
        errno = EINVAL;
        return -1;
    }
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            say(why, strerror(e));
            close(fd);
            errno = e;
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = 0;
    return 0;
}

typedef struct {
    int (*keep)(const char *);
    char **names;
    int n, cap;
} collect;

static int collect_one(void *user, const char *name) {
    collect *c = user;
    if (name[0] == '.' || (c->keep && !c->keep(name))) return 0;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        char **nn = realloc(c->names, (size_t)cap * sizeof *nn);
        if (!nn) return 1;
        c->names = nn;
        c->cap = cap;
    }
    if (!(c->names[c->n] = strdup(name))) return 1;
    c->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int nl_sysfs_list(const nl_io *io, const char *dir, int (*keep)(const char *name), char ***names) {
    if (!io) io = nl_io_posix();
    collect c = {keep, NULL, 0, 0};
    *names = NULL;
    int rc = io->list(io->ctx, dir, collect_one, &c);
    if (rc != 0) {
        int e = rc > 0 ? ENOMEM : errno;
        nl_sysfs_names_free(c.names, c.n);
        errno = e;
        return -1;
    }
    if (c.n > 1) qsort(c.names, (size_t)c.n, sizeof *c.names, cmp_str);
    *names = c.names;
    return c.n;
}

void nl_sysfs_names_free(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* os/sysfs: the one reader of small kernel / host-app files (sysfs attributes, /proc-like
 * text, a host app's status file) and of the directories that hold them, for the OS probes
 * (pacing, energy). */
#ifndef NL_SYSFS_H
#define NL_SYSFS_H

#include <stddef.h>

#include "os/io.h"

/* Read a small file into buf (at most cap - 1 bytes, NUL-terminated, trailing '\n', '\r', ' '
 * and '\t' cut). The file is opened non-blocking and refused unless it is a regular file, so
 * a FIFO put in its place never blocks a run. Returns 0, or -1 with errno set and *why the
 * reason (strerror's, or "is a FIFO, not a regular file": text that lives until this thread's
 * next call; why may be NULL). */
int nl_sysfs_read(const char *path, char *buf, size_t cap, const char **why);

/* The names in dir that do not start with '.' and that keep(name) accepts (keep NULL: all),
 * sorted by strcmp, into *names (malloc'd; free with nl_sysfs_names_free). Returns the count,
 * or -1 with errno set (ENOENT: no such directory; any other: it could not be opened or read —
 * a listing that fails part way is an error, never a short list) and nothing allocated.
 * io: NULL = nl_io_posix() (tests fail the listing with nl_io_fault). */
int nl_sysfs_list(const nl_io *io, const char *dir, int (*keep)(const char *name), char ***names);
void nl_sysfs_names_free(char **names, int n);

#endif

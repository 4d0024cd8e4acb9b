/* os/mem: memory probes from /proc. See mem.h. */
#include "os/mem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "util/util.h"
#if defined(__GLIBC__)
#include <malloc.h>
#endif

int64_t nl_proc_kb_field(const char *text, const char *key) {
    size_t klen = strlen(key);
    for (const char *line = text; line && *line;) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            const char *p = line + klen + 1;
            while (*p == ' ' || *p == '\t') p++;
            if (*p < '0' || *p > '9') return -1;
            char *end;
            errno = 0;
            unsigned long long v = strtoull(p, &end, 10);
            if (errno) return -1;
            while (*end == ' ' || *end == '\t') end++;
            uint64_t mul = 1;
            if (strncmp(end, "kB", 2) == 0) mul = 1024;
            else if (*end != '\n' && *end != 0) return -1;
            uint64_t bytes;
            if (nl_mul_ok(v, mul, &bytes) || bytes > (uint64_t)INT64_MAX) return -1;
            return (int64_t)bytes;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return -1;
}

static int64_t proc_field(const char *path, const char *key) {
    size_t len;
    char *t = nl_read_file(path, &len);
    if (!t) {
        nl_clear_error(); /* a missing /proc is not an error here: callers fall back */
        return -1;
    }
    int64_t v = nl_proc_kb_field(t, key);
    free(t);
    return v;
}

int64_t nl_mem_available_bytes(void) {
    int64_t v = proc_field("/proc/meminfo", "MemAvailable");
    if (v >= 0) return v;
#ifdef _SC_AVPHYS_PAGES
    long pages = sysconf(_SC_AVPHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psize > 0) return (int64_t)pages * (int64_t)psize;
#endif
    return -1;
}

int64_t nl_peak_rss_bytes(void) {
    int64_t v = proc_field("/proc/self/status", "VmHWM");
    if (v >= 0) return v;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss > 0) return (int64_t)ru.ru_maxrss * 1024;
    return -1;
}

int64_t nl_rss_bytes(void) { return proc_field("/proc/self/status", "VmRSS"); }

void nl_mem_trim(void) {
#if defined(__GLIBC__)
    (void)malloc_trim(0);
#endif
}

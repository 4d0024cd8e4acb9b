/* os/mem: how much memory there is and how much this process used (/proc, else libc). */
#ifndef NL_SYS_MEM_H
#define NL_SYS_MEM_H

#include <stdint.h>

/* MemAvailable from /proc/meminfo (the kernel's estimate of memory a new workload can use
 * without swapping), else sysconf(_SC_AVPHYS_PAGES) * page size; -1 when unknown. */
int64_t nl_mem_available_bytes(void);

/* Peak resident set size of this process: VmHWM from /proc/self/status, else getrusage's
 * ru_maxrss; -1 when unknown. */
int64_t nl_peak_rss_bytes(void);

/* Current resident set size (VmRSS); -1 when unknown. */
int64_t nl_rss_bytes(void);

/* Give the heap's free pages back to the system where the C library can (glibc's malloc_trim),
 * so that VmRSS counts what is held, not what was freed; elsewhere nothing. */
void nl_mem_trim(void);

/* The value of a "Key:   123 kB" line in /proc/meminfo or /proc/self/status style text, in
 * bytes (kB multiplied by 1024; a value without unit taken as bytes); -1 when missing or
 * malformed. The key must match a whole key at the start of a line. */
int64_t nl_proc_kb_field(const char *text, const char *key);

#endif

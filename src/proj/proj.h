/* proj/: the frozen-projection service (DESIGN.md §2). The ONLY code that multiplies by a
 * frozen weight. One op per projection, two directions, one resident copy of W:
 *
 *   NL_FWD: Y[T][N] = X[T][K] · Wᵀ      (W is N×K row-major, exactly as GGUF stores it)
 *   NL_BWD: Y[T][K] = X[T][N] · W        (the input gradient, from the SAME resident bytes)
 *
 * submit returns at once; the caller does CPU work (e.g. the LoRA branch) and then waits.
 * Exactly one request is in flight at a time. Backends plug in through nl_proj_backend. */
#ifndef NL_PROJ_H
#define NL_PROJ_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { NL_FWD = 0, NL_BWD = 1 } nl_dir;

/* What a backend sees of one frozen weight. `data` is borrowed (the GGUF mapping or a copy
 * the service converted once at load). */
typedef struct {
    const char *name;
    int type;             /* nl_type of data */
    int64_t n_in, n_out;  /* K, N */
    const void *data;     /* N rows of nl_row_bytes(type, K) bytes */
    int cls;              /* nl_proj_class */
} nl_proj_weight;

typedef struct nl_proj_backend {
    const char *name;                                     /* "ref", "host", ... */
    int (*init)(void **ctx, int n_threads);
    /* 1 if the backend can run this weight/direction/bucket. */
    int (*supports)(void *ctx, const nl_proj_weight *w, nl_dir dir, int T);
    /* Y (T×N for FWD, T×K for BWD) is overwritten. */
    int (*run)(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y);
    void (*free)(void *ctx);
} nl_proj_backend;

extern const nl_proj_backend nl_proj_backend_ref;

typedef struct nl_proj_service nl_proj_service;

typedef struct {
    const char *backend;  /* "ref" (default) or "host" */
    int n_threads;        /* service worker threads (0 = 1) */
    int wire_f16;         /* FP16 wire mode (host backend) */
    int verbose;
} nl_proj_config;

nl_proj_service *nl_proj_service_new(const nl_proj_config *cfg);
void nl_proj_service_free(nl_proj_service *s);

/* Register a frozen weight; returns its id (>= 0), or -1 + error. The service may convert
 * it once to its resident type here (precision policy); `w->data` must outlive the service. */
int nl_proj_add(nl_proj_service *s, const nl_proj_weight *w);
int nl_proj_count(const nl_proj_service *s);
const nl_proj_weight *nl_proj_get(const nl_proj_service *s, int id); /* the resident view */

/* One request in flight, always: a second submit before wait is an error. */
int nl_proj_submit(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y);
int nl_proj_wait(nl_proj_service *s);
/* submit + wait */
int nl_proj_run(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y);

/* Gather rows of W (embedding lookup) through the same dequantizer: out[i][K] = W[rows[i]]. */
int nl_proj_get_rows(nl_proj_service *s, int id, const int32_t *rows, int n, float *out);

#endif

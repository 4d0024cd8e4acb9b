/* proj/ internals shared by proj.c (service, queue, wire) and planner.c. Not a contract for
 * other rooms: they use proj.h. */
#ifndef NL_PROJ_IMPL_H
#define NL_PROJ_IMPL_H

#include <pthread.h>

#include "proj/proj.h"

enum { NL_ROUTE_REF = 0, NL_ROUTE_BACKEND = 1 };

typedef struct {
    nl_proj_weight orig;       /* as registered (GGUF bytes, borrowed); the ref fallback uses it */
    nl_proj_weight res;        /* resident view: orig.data in place, or a converted copy */
    char *name;                /* owned copy; both views point at it */
    void *owned;               /* converted bytes (NULL when in place or shared) */
    uint64_t res_bytes;        /* bytes of res.data */
    int shares;                /* res.data already counted by an earlier entry */
    uint8_t *route;            /* [2][n_buckets] NL_ROUTE_*, after nl_proj_plan (else NULL) */
    nl_proj_entry_stats st[2]; /* per nl_dir, the dispatcher's (under mu) */
} nl_proj_entry;

typedef struct {
    int kind; /* 0: class, 1: glob */
    int cls;
    char *glob;
    int type; /* target type, -1 = keep the GGUF type */
} nl_proj_rule;

struct nl_proj_service {
    nl_proj_config cfg;
    int n_threads;
    const nl_proj_backend *be;
    void *be_ctx;
    void *ref_ctx; /* == be_ctx when the backend is ref */
    int precision; /* -1 auto (or keep, below), else a type */
    int keep_all;  /* precision "keep": every weight in its GGUF type */
    nl_proj_rule *rules;
    int n_rules;

    nl_proj_entry *e;
    int n, cap;

    /* planner */
    int *buckets; /* ascending, after nl_proj_plan */
    int n_buckets;
    nl_proj_check *checks;
    int n_checks;
    char plan_cache_note[768]; /* what the verdict cache did ("" when none is set) */

    /* scratch of the executing thread (one request at a time) */
    float *xbuf, *ybuf, *wx, *wy;
    size_t xbuf_n, ybuf_n, wx_n, wy_n;
    int *shift, *rowi;
    size_t shift_n, rowi_n;

    /* the request queue: one dispatcher thread, one request in flight */
    pthread_t thread;
    int thread_ok;
    pthread_mutex_t mu;
    pthread_cond_t cv_req, cv_done;
    int in_flight, have_req, done, quit;
    struct {
        int id;
        nl_dir dir;
        const float *x;
        int T;
        float *y;
    } req;
    int req_rc;
    char req_err[512];
    nl_proj_stats stats; /* under mu */
    nl_proj_stats wst;   /* the executing thread's counts for the current request */
};

/* Compute one request (any T) the way the dispatcher does: buckets, routes, wire. */
int nl_proj_exec(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y);
/* One chunk of `rows` (<= bucket) rows through the backend (zero-padded to `bucket`; bucket 0
 * = as many rows as given, for any_T backends), with the FP16 wire when configured. */
int nl_proj_exec_backend(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int rows, int bucket,
                         float *y);
/* The ref backend on the original weight. */
int nl_proj_exec_ref(nl_proj_service *s, nl_proj_entry *e, nl_dir dir, const float *x, int T, float *y);

#endif

/* util/pool: the library's one persistent thread pool (see pool.h). */
#include "util/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* n-1 workers wait for a generation number to change, run their tasks (i = w, w+n, ...), and
 * count down; the caller runs worker 0's share and waits. */

struct nl_pool {
    int n;
    pthread_t *th;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    int gen; /* job counter (wraps; compared for equality only) */
    int pending, quit;
    void (*fn)(void *, int, int);
    void *arg;
    int n_tasks;
};

typedef struct {
    nl_pool *p;
    int w;
} pool_arg;

static void *pool_main(void *argp) {
    nl_pool *p = ((pool_arg *)argp)->p;
    int w = ((pool_arg *)argp)->w;
    free(argp);
    int seen = 0;
    for (;;) {
        nl_spin_wait(&p->gen, seen, 0, NL_SPIN_S);
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->cv_go, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        void (*fn)(void *, int, int) = p->fn;
        void *arg = p->arg;
        int nt = p->n_tasks;
        pthread_mutex_unlock(&p->mu);
        for (int i = w; i < nt; i += p->n) fn(arg, i, nt);
        pthread_mutex_lock(&p->mu);
        __atomic_store_n(&p->pending, p->pending - 1, __ATOMIC_RELEASE);
        if (p->pending == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

nl_pool *nl_pool_new(int n_threads) {
    nl_pool *p = nl_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads > 0 ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_go, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (p->n > 1) {
        p->th = nl_calloc((size_t)p->n - 1, sizeof *p->th);
        if (!p->th) goto fail;
        for (int w = 1; w < p->n; w++) {
            pool_arg *a = nl_malloc(sizeof *a);
            if (!a) goto fail;
            a->p = p;
            a->w = w;
            int e = nl_thread_create(&p->th[w - 1], pool_main, a);
            if (e != 0) {
                free(a);
                nl_err("cannot start worker thread %d of %d: %s", w, p->n, strerror(e));
                goto fail;
            }
            p->n_started++;
        }
    }
    return p;
fail:
    nl_pool_free(p);
    return NULL;
}

int nl_pool_size(const nl_pool *p) { return p->n; }

void nl_pool_run(nl_pool *p, int n_tasks, void (*fn)(void *, int, int), void *arg) {
    if (p->n == 1 || n_tasks <= 1) {
        for (int i = 0; i < n_tasks; i++) fn(arg, i, n_tasks);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    p->pending = p->n - 1;
    __atomic_store_n(&p->gen, (int)((unsigned)p->gen + 1u), __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n_tasks; i += p->n) fn(arg, i, n_tasks);
    nl_spin_wait(&p->pending, 0, 1, NL_SPIN_S);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void nl_pool_free(nl_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_go);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p);
}

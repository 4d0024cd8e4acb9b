/* util/pool: the library's one persistent thread pool — the host backend's output panels, the
 * reference backend, the CPU nodes of the training step and the inference forward (nn/par), the
 * optimizer and MeZO all split their work over one. Workers spin briefly, then sleep on a
 * condition variable, between jobs (nl_spin_wait), so the back-to-back jobs of a step cost
 * microseconds to hand off. Workers start with SIGINT/SIGTERM blocked (nl_thread_create). */
#ifndef NL_POOL_H
#define NL_POOL_H

typedef struct nl_pool nl_pool;
/* n_threads - 1 workers are started; the caller of nl_pool_run is worker 0. NULL + nl_err
 * when a thread cannot be started. */
nl_pool *nl_pool_new(int n_threads);
int nl_pool_size(const nl_pool *p);
/* Runs fn(arg, task, n_tasks) for every task in [0, n_tasks): task i on worker i % size.
 * Returns when all are done. Tasks must write disjoint outputs. One caller at a time. */
void nl_pool_run(nl_pool *p, int n_tasks, void (*fn)(void *arg, int task, int n_tasks), void *arg);
void nl_pool_free(nl_pool *p); /* NULL-safe */

#endif

/* proj/host_int8: the host backend's int8 FWD (host_int8.c; docs/design.md §2). */
#ifndef NL_PROJ_HOST_INT8_H
#define NL_PROJ_HOST_INT8_H

#include <stdint.h>

#include "cpu/kernels.h"
#include "proj/proj.h"
#include "util/pool.h"

typedef struct nl_host_int8 nl_host_int8;

/* 1 for the weight types the int8 FWD takes: Q8_0, Q4_0, Q5_0, Q4_1, Q4_K, Q6_K. */
int nl_host_int8_type(int type);
/* Scratch for nth threads (tid = pool task): NULL + nl_err on no memory. */
nl_host_int8 *nl_host_int8_new(int nth);
void nl_host_int8_free(nl_host_int8 *c);
/* Y[T][n_out] = X[T][n_in]·Wᵀ with int8 activations (w->type: nl_host_int8_type); the pool
 * has the context's nth threads. 0, or -1 + nl_err. */
int nl_host_int8_run(nl_host_int8 *c, const nl_i8_kernels *ik, nl_pool *pool, const nl_proj_weight *w, const float *x,
                     int T, float *y);
/* bytes a request holds beyond the fixed scratch (the quantized activations) */
uint64_t nl_host_int8_scratch(const nl_proj_weight *w, int T);

#endif

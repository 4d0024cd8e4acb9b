/* nn/prof: the optional per-call timing of a pass's main thread (bench step): wall seconds by
 * node class, charged by the layers (nn/layer.c) and the head (nn/head.c). */
#ifndef NL_NN_PROF_H
#define NL_NN_PROF_H

#include <stdint.h>

#include "util/util.h"

/* Optional per-call timing of the main thread (bench step): wall seconds by node class.
 * Accumulates; the caller zeroes it. */
enum {
    NL_GP_WAIT = 0, /* blocked in nl_proj_wait (the service is the critical path) */
    NL_GP_LORA_FWD, /* LoRA forward branches (overlapped with the request unless rt->sync) */
    NL_GP_LORA_BWD, /* LoRA backward (dx, dA, dB) */
    NL_GP_ATTN_FWD, /* attention core forward (scores, softmax, PV) */
    NL_GP_ATTN_BWD,
    NL_GP_NORM, /* RMSNorm forward/backward (layer, q/k and final norms) */
    NL_GP_ROPE,
    NL_GP_ACT,   /* SwiGLU and gates, forward and backward */
    NL_GP_XENT,  /* softmax cross-entropy of the head chunks */
    NL_GP_ADD,   /* residual adds, LoRA adds, copies */
    NL_GP_GDN,   /* the gated delta-net node (nn/gdn), forward and backward */
    NL_GP_OTHER, /* submits, allocation, embedding rows, planning */
    NL_GP_COUNT
};
typedef struct {
    double s[NL_GP_COUNT];
    uint64_t requests; /* service requests submitted */
} nl_graph_prof;
/* "wait", "lora_fwd", ... */
const char *nl_graph_prof_name(int k);

/* The start of an interval (0 when not timing). */
static inline double nl_prof_tic(const nl_graph_prof *p) { return p ? nl_now() : 0.0; }
/* Charges the time since t0 to class k; returns now (the next interval's start). */
static inline double nl_prof_toc(nl_graph_prof *p, int k, double t0) {
    if (!p) return 0.0;
    double t = nl_now();
    p->s[k] += t - t0;
    return t;
}

/* Runs stmt, charging its time to class k of prof (NULL: just runs it). */
#define NL_TIMED(prof, k, stmt)                                                                                        \
    do {                                                                                                               \
        double nl_t0_ = nl_prof_tic(prof);                                                                             \
        stmt;                                                                                                          \
        nl_prof_toc((prof), (k), nl_t0_);                                                                              \
    } while (0)

#endif

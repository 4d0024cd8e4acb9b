/* nn/head: the vocabulary head, the one definition that inference (nn/forward: logits, eval's
 * losses) and training (train/graph: the loss and its backward) both run:
 *
 *   hn = output_norm(x)  (RMSNorm),   z = hn·W_outᵀ + LoRA(hn),   loss_t = −log softmax(z_t)[y_t]
 *
 * The output projection goes through the pass's proj hook (nn/layer.h: layer n_layer, kind
 * NL_P_OUTPUT), the norm and the cross-entropy run on the runtime's pool (nn/par.h, the same
 * bits on any pool), and every temporary comes from the pass's arena, released before the
 * call returns. */
#ifndef NL_HEAD_H
#define NL_HEAD_H

#include <stdint.h>

#include "nn/layer.h"

/* logits[T][n_vocab] of x[T][n_embd]: the norm, then one request for all T rows. 0, or -1 +
 * nl_err. */
int nl_head_pass_logits(nl_pass *ps, const float *x, int T, float *logits);

/* The loss head of x[T][n_embd] with targets[T] (< 0: not a target). Only the target rows
 * are projected: gathered, NL_HEAD_CHUNK (nn/forward.h) a request, each with its row index in
 * the pass (the hook's rows: its LoRA dropout mask); row_loss[T] receives each row's −log p in
 * double (0 for the other rows). Bit for bit the head on every row (every service and LoRA row
 * depends on its own input row only; tests/test_graph.c checks it against that).
 * dx != NULL: the backward of inv_n · Σ loss_t: dz = (softmax(z) − onehot)·inv_n on the target
 * rows, dhn = dz·W_out + LoRA's (the hook's NL_BWD, which accumulates the LoRA gradients), dx =
 * the norm's backward of dhn (overwritten; dhn is 0 on the other rows). 0, or -1 + nl_err. */
int nl_head_pass_loss(nl_pass *ps, const float *x, const int32_t *targets, int T, float inv_n, double *row_loss,
                      float *dx);

/* The most bytes nl_head_pass_loss over T rows takes from ps->ws (want_grad: dx != NULL;
 * save_u: the pass's save_u, whose u rows of the output projection it keeps for the backward;
 * the hook's per request from proj_temp, may be NULL: none), rounded as the arena rounds: what
 * the training graph's peak bound counts for its head. */
uint64_t nl_head_pass_bytes(const nl_runtime *rt, const nl_adapter *save_u, int T, int want_grad,
                            nl_proj_temp_fn proj_temp, void *user);

#endif

/* The vocabulary head; see head.h. */
#include "nn/head.h"

#include <string.h>

#include "nn/nn.h"
#include "nn/par.h"
#include "util/util.h"

int nl_head_pass_logits(nl_pass *ps, const float *x, int T, float *logits) {
    const nl_model *m = ps->rt->m;
    const int E = m->hp.n_embd;
    const nl_arena_mark mk = nl_arena_top(ps->ws);
    float *hn = nl_arena_floats(ps->ws, (size_t)T * E);
    if (!hn) return -1;
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_forward(ps->rt->pool, hn, NULL, x, m->output_norm, T, E, m->hp.rms_eps));
    int rc = ps->proj(ps->user, &(nl_pass_req){.dir = NL_FWD,
                                               .layer = m->hp.n_layer,
                                               .kind = NL_P_OUTPUT,
                                               .p = m->p_output,
                                               .in = hn,
                                               .T = T,
                                               .out = logits});
    nl_arena_release(ps->ws, mk);
    return rc;
}

/* The target rows (nt of them, nt >= 1) of hn: gathered NL_HEAD_CHUNK at a time, projected,
 * their losses into row_loss, and with dhn their input gradients scattered back into it. */
static int head_rows(nl_pass *ps, const float *hn, float *dhn, const int32_t *targets, int T, int nt, float inv_n,
                     double *row_loss) {
    const nl_model *m = ps->rt->m;
    const int E = m->hp.n_embd, V = m->hp.n_vocab, L = m->hp.n_layer, p = m->p_output;
    const int r = nl_adapter_rank(ps->save_u, p), C = nt < NL_HEAD_CHUNK ? nt : NL_HEAD_CHUNK;
    nl_arena *ws = ps->ws;
    float *z = nl_arena_floats(ws, (size_t)C * V + (size_t)C * (r ? r : 1) + 2 * (size_t)C * E);
    double *rlc = nl_arena_alloc(ws, (size_t)C * sizeof(double));
    int32_t *idx = nl_arena_alloc(ws, ((size_t)nt + C) * sizeof(int32_t));
    int64_t *rows = nl_arena_alloc(ws, (size_t)C * sizeof(int64_t));
    if (!z || !rlc || !idx || !rows) return -1;
    float *u = z + (size_t)C * V, *hc = u + (size_t)C * (r ? r : 1), *dhc = hc + (size_t)C * E;
    int32_t *tc = idx + nt;
    for (int t = 0, i = 0; t < T; t++)
        if (targets[t] >= 0) idx[i++] = t;
    int rc = 0;
    for (int i0 = 0; i0 < nt && rc == 0; i0 += C) {
        const int nc = nt - i0 < C ? nt - i0 : C;
        double t1 = nl_prof_tic(ps->prof);
        for (int i = 0; i < nc; i++) {
            const int t = idx[i0 + i];
            memcpy(hc + (size_t)i * E, hn + (size_t)t * E, (size_t)E * sizeof(float));
            tc[i] = targets[t];
            rows[i] = t;
        }
        nl_prof_toc(ps->prof, NL_GP_ADD, t1);
        rc = ps->proj(ps->user, &(nl_pass_req){.dir = NL_FWD,
                                               .layer = L,
                                               .kind = NL_P_OUTPUT,
                                               .p = p,
                                               .in = hc,
                                               .u_save = r ? u : NULL,
                                               .T = nc,
                                               .rows = rows,
                                               .out = z});
        if (rc) break;
        t1 = nl_prof_tic(ps->prof);
        nl_par_xent_rows(ps->rt->pool, rlc, z, tc, nc, V, inv_n, dhn != NULL);
        for (int i = 0; i < nc; i++) row_loss[idx[i0 + i]] = rlc[i];
        nl_prof_toc(ps->prof, NL_GP_XENT, t1);
        if (!dhn) continue;
        rc = ps->proj(ps->user, &(nl_pass_req){.dir = NL_BWD,
                                               .layer = L,
                                               .kind = NL_P_OUTPUT,
                                               .p = p,
                                               .in = z,
                                               .x = hc,
                                               .u_in = r ? u : NULL,
                                               .T = nc,
                                               .rows = rows,
                                               .out = dhc});
        t1 = nl_prof_tic(ps->prof);
        for (int i = 0; rc == 0 && i < nc; i++)
            memcpy(dhn + (size_t)idx[i0 + i] * E, dhc + (size_t)i * E, (size_t)E * sizeof(float));
        nl_prof_toc(ps->prof, NL_GP_ADD, t1);
    }
    return rc;
}

int nl_head_pass_loss(nl_pass *ps, const float *x, const int32_t *targets, int T, float inv_n, double *row_loss,
                      float *dx) {
    const nl_model *m = ps->rt->m;
    const int E = m->hp.n_embd;
    const size_t n = (size_t)T * E;
    int nt = 0;
    for (int t = 0; t < T; t++) {
        row_loss[t] = 0.0; /* what the cross-entropy gives a row without a target */
        nt += targets[t] >= 0;
    }
    const nl_arena_mark mk = nl_arena_top(ps->ws);
    float *hn = nl_arena_floats(ps->ws, dx ? 2 * n + (size_t)T : n);
    if (!hn) return -1;
    float *dhn = dx ? hn + n : NULL, *rstd = dx ? hn + 2 * n : NULL;
    NL_TIMED(ps->prof, NL_GP_NORM,
             nl_par_rmsnorm_forward(ps->rt->pool, hn, rstd, x, m->output_norm, T, E, m->hp.rms_eps));
    if (dhn) memset(dhn, 0, n * sizeof(float));
    int rc = nt ? head_rows(ps, hn, dhn, targets, T, nt, inv_n, row_loss) : 0;
    if (rc == 0 && dx)
        NL_TIMED(ps->prof, NL_GP_NORM, nl_par_rmsnorm_backward(ps->rt->pool, dx, dhn, x, m->output_norm, rstd, T, E));
    nl_arena_release(ps->ws, mk);
    return rc;
}

uint64_t nl_head_pass_bytes(const nl_runtime *rt, const nl_adapter *save_u, int T, int want_grad,
                            nl_proj_temp_fn proj_temp, void *user) {
    const nl_model *m = rt->m;
    const uint64_t E = (uint64_t)m->hp.n_embd, V = (uint64_t)m->hp.n_vocab, t = (uint64_t)T;
    const int r = nl_adapter_rank(save_u, m->p_output);
    const uint64_t C = (uint64_t)(T < NL_HEAD_CHUNK ? T : NL_HEAD_CHUNK); /* every row a target: the most */
    uint64_t b = nl_arena_size((size_t)(4 * (want_grad ? 2 * t * E + t : t * E)));
    b += nl_arena_size((size_t)(4 * (C * V + C * (uint64_t)(r ? r : 1) + 2 * C * E))) + nl_arena_size((size_t)(8 * C)) +
         nl_arena_size((size_t)(4 * (t + C))) + nl_arena_size((size_t)(8 * C));
    uint64_t req = 0;
    if (proj_temp) {
        req = proj_temp(user, NL_FWD, m->p_output, (int)C);
        if (want_grad) {
            const uint64_t bwd = proj_temp(user, NL_BWD, m->p_output, (int)C);
            req = bwd > req ? bwd : req;
        }
    }
    return b + req;
}

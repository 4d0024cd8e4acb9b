/* model/merge: an adapter merged into its base model's weights, written as one GGUF. */
#include <stdlib.h>

#include "model/adapter.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "util/util.h"

int nl_merge_out_type(int type) {
    const nl_type_traits *tt = nl_type_get(type);
    return tt && tt->from_float ? type : NL_TYPE_Q8_0;
}

int nl_merge(const nl_model *m, const nl_adapter *a, int type, const char *out_path) {
    const nl_gguf *g = m->gguf;
    nl_gguf_writer *w = nl_gguf_writer_new();
    if (!w) return -1;
    int rc = nl_gguf_copy_kvs(w, g);
    if (rc == 0 && a && m->tied_head && a->by_proj[m->p_output] >= 0)
        rc = nl_err("merge: the adapter adapts the tied output head, which shares token_embd.weight; merging it would change the embedding too");
    void **owned = nl_calloc((size_t)g->n_tensors + 1, sizeof(void *));
    if (!owned) rc = -1;
    for (int64_t i = 0; i < g->n_tensors && rc == 0; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        int p = -1;
        for (int j = 0; j < m->n_projs; j++)
            if (m->projs[j].w == t && m->projs[j].kind != NL_P_EMBED) p = j;
        /* The tied head shares token_embd: an adapter on "output" cannot be merged into it
         * without changing the embedding too. */
        int e = (a && p >= 0) ? a->by_proj[p] : -1;
        int out_type = (p >= 0 && type >= 0) ? type : t->type;
        if (e >= 0 && type < 0) out_type = nl_merge_out_type(t->type);
        if (e < 0 && out_type == t->type) {
            rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, true);
            continue;
        }
        const nl_type_traits *src = nl_type_get(t->type), *dst = nl_type_get(out_type);
        if (!src || !src->to_float) { rc = nl_err("merge: cannot read tensor '%s' of type %s", t->name, nl_type_name(t->type)); break; }
        if (!dst || !dst->from_float) { rc = nl_err("merge: cannot write type %s", nl_type_name(out_type)); break; }
        int64_t K = t->ne[0], N = t->ne[1] * t->ne[2] * t->ne[3];
        if (K % dst->blck) { rc = nl_err("merge: tensor '%s' row of %lld is not a multiple of %s blocks", t->name, (long long)K, dst->name); break; }
        float *wf = nl_malloc((size_t)K * N * sizeof(float));
        void *q = nl_malloc(nl_row_bytes(out_type, K) * (size_t)N);
        if (!wf || !q) { free(wf); free(q); rc = -1; break; }
        src->to_float(t->data, wf, K * N);
        if (e >= 0) {
            const float *A = nl_lora_A(a, e), *B = nl_lora_B(a, e);
            int r = a->t[e].rank;
            float s = nl_adapter_scale(a, e);
            for (int64_t o = 0; o < N; o++)
                for (int j = 0; j < r; j++) {
                    float c = s * B[o * r + j];
                    const float *Aj = A + (size_t)j * K;
                    float *wo = wf + (size_t)o * K;
                    for (int64_t i2 = 0; i2 < K; i2++) wo[i2] += c * Aj[i2];
                }
        }
        dst->from_float(wf, q, K * N);
        free(wf);
        owned[i] = q;
        rc = nl_gguf_add_tensor(w, t->name, out_type, (int)t->n_dims, t->ne, q, true);
    }
    if (rc == 0 && type >= 0) {
        const int ft = nl_type_ftype(type);
        rc = nl_gguf_set_u32(w, "general.file_type", (uint32_t)(ft >= 0 ? ft : NL_FTYPE_ALL_F32));
    }
    if (rc == 0) rc = nl_model_check_unchanged(m, m->gguf->path, "merge", "nothing written");
    if (rc == 0) rc = nl_gguf_write(w, out_path);
    if (owned)
        for (int64_t i = 0; i < g->n_tensors; i++) free(owned[i]);
    free(owned);
    nl_gguf_writer_free(w);
    return rc;
}

/* The real Gemma 3 270M file (google/gemma-3-270m in Q4_K_M, tools/fetch-models.sh gemma3) through
 * the training service as `nightlora train` opens it (nl_train_defaults' service config,
 * nl_runtime_init, the plan): every projection stays resident as the file stores it (Q5_0 attn_q/k,
 * ffn_gate/up and half the attn_v; Q4_K attn_output and half the ffn_down, Q6_K the other half;
 * Q8_0 the other attn_v and the tied head), the file's own bytes in place: no dequantized or
 * transposed copy (the resident bytes of each type equal the stored bytes, nothing converted), every
 * planner check passed (nothing routed to ref); FWD and BWD of one-hot rows through the service give
 * one effective weight from those bytes for a Q5_0, a Q4_K and a Q6_K tensor (model/quant's to_float,
 * rounded to BF16 where the service computes in bf16 or on the BF16 tiles: proj/host.h). Skipped, saying so, when the
 * file is absent. NL_TEST_SMALL (CI's qemu runs): the plan at the 16-row bucket only (every
 * projection, both directions, the 262144-row tied head included, at 16 rows instead of 16/64/256). */
#include "model/model.h"
#include "model/quant.h"
#include "nn/forward.h"
#include "proj/proj.h"
#include "train/trainer.h"
#include "test.h"

/* FWD of e_k (16 k's) is column k of the stored weight, BWD of e_n (16 n's) is row n. */
static void one_hot(nl_proj_service *s, int id, const nl_proj_desc *d, int bf16) {
    const int64_t K = d->n_in, N = d->n_out;
    float *wf = malloc(sizeof(float) * (size_t)(K * N));
    CHECK(wf != NULL);
    if (!wf) return;
    nl_type_get(d->w->type)->to_float(d->w->data, wf, K * N);
    enum { T = 16 };
    for (int dir = 0; dir < 2; dir++) {
        const int64_t in = dir ? N : K, out = dir ? K : N;
        float *x = calloc((size_t)(T * in), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(T * out));
        int64_t hot[T];
        for (int t = 0; t < T; t++) {
            hot[t] = (t * (in / T) + t * 7 + 3) % in; /* spread over the rows, odd offsets */
            x[t * in + hot[t]] = 1.0f;
        }
        CHECK(nl_proj_run(s, id, (nl_dir)dir, x, T, y) == 0);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int64_t o = 0; o < out; o++) {
                float want = dir ? wf[hot[t] * K + o] : wf[o * K + hot[t]];
                if (bf16) want = nl_t_bf16_round(want);
                bad += y[t * out + o] != want;
            }
        CHECKF(bad == 0, "%s (%s) %s one-hot: %d of %lld differ from the stored weight", d->name,
               nl_type_name(d->w->type), dir ? "bwd" : "fwd", bad, (long long)(T * out));
        printf("%s %s %s one-hot: %lld values equal the stored weight%s\n", d->name, nl_type_name(d->w->type),
               dir ? "bwd" : "fwd", (long long)(T * out), bf16 ? " rounded to BF16" : "");
        free(x);
        free(y);
    }
    free(wf);
}

int main(void) {
    char path[1024];
    if (!nl_t_cached_model(path, sizeof path, NL_T_GEMMA3_MODEL, "gemma3", "the real Gemma 3 checks"))
        return nl_t_done();
    nl_model *m = nl_model_load(path);
    CHECKF(m != NULL, "%s", nl_last_error());
    if (!m) return nl_t_done();
    CHECK(m->arch == NL_ARCH_GEMMA3 && m->tied_head && m->hp.n_layer == 18 && m->hp.n_embd == 640);
    nl_train_opts o;
    nl_train_defaults(&o);
    nl_proj_service *s = nl_proj_service_new(&o.proj);
    nl_runtime rt;
    CHECKF(s && nl_runtime_init(&rt, m, s) == 0, "%s", nl_last_error());
    if (!s) return nl_t_done();
    /* bf16 compute or the BF16 tiles (auto on a CPU with usable AMX; no recurrent weights here,
     * which the tiles would take split) */
    const char *cm = nl_proj_compute(s);
    const int bf16 = !strcmp(cm, "bf16") || !strcmp(cm, "amx") || !strcmp(cm, "amx-emu");

    /* resident as stored: type, the file's bytes, bytes per type (each tensor once) */
    uint64_t stored[NL_TYPE_COUNT] = {0};
    int n_type[NL_TYPE_COUNT] = {0}, moved = 0, sample[NL_TYPE_COUNT];
    for (int t = 0; t < NL_TYPE_COUNT; t++) sample[t] = -1;
    for (int i = 0; i < m->n_projs; i++) {
        const nl_proj_desc *d = &m->projs[i];
        const nl_proj_weight *r = nl_proj_get(s, rt.svc_id[i]);
        moved += r->type != d->w->type || r->data != d->w->data;
        int first = 1;
        for (int j = 0; j < i; j++) first &= m->projs[j].w != d->w;
        if (!first) continue;
        stored[d->w->type] += nl_row_bytes(d->w->type, d->n_in) * (uint64_t)d->n_out;
        n_type[d->w->type]++;
        if (sample[d->w->type] < 0 && d->layer == 7) sample[d->w->type] = i;
    }
    CHECKF(moved == 0, "%d projections not resident as stored", moved);
    CHECKF(n_type[NL_TYPE_Q5_0] == 81 && n_type[NL_TYPE_Q4_K] == 27 && n_type[NL_TYPE_Q6_K] == 9 &&
               n_type[NL_TYPE_Q8_0] == 10,
           "tensors: q5_0 %d, q4_k %d, q6_k %d, q8_0 %d", n_type[NL_TYPE_Q5_0], n_type[NL_TYPE_Q4_K],
           n_type[NL_TYPE_Q6_K], n_type[NL_TYPE_Q8_0]);
    for (int t = 0; t < NL_TYPE_COUNT; t++)
        if (stored[t]) {
            const uint64_t res = nl_proj_resident_bytes(s, -1, t);
            CHECKF(res == stored[t], "%s: resident %llu B, stored %llu B", nl_type_name(t), (unsigned long long)res,
                   (unsigned long long)stored[t]);
            printf("%s: %d tensors, resident %llu B = stored %llu B\n", nl_type_name(t), n_type[t],
                   (unsigned long long)res, (unsigned long long)stored[t]);
        }
    CHECK(nl_proj_converted_bytes(s) == 0);

    /* the plan the trainer makes: every check passes, so the host kernels run every weight */
    static const int b16[] = {16};
    CHECK(nl_t_small() ? nl_proj_plan(s, b16, 1) == 0 : nl_proj_plan(s, NULL, 0) == 0);
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(s, &tot);
    CHECKF(tot.checks > 0 && tot.routed == 0, "%d checks, %d routed to ref", tot.checks, tot.routed);

    /* FWD and BWD from the same bytes */
    static const int types[] = {NL_TYPE_Q5_0, NL_TYPE_Q4_K, NL_TYPE_Q6_K};
    for (int k = 0; k < 3; k++) {
        const int i = sample[types[k]];
        CHECKF(i >= 0, "no %s tensor in layer 7", nl_type_name(types[k]));
        if (i >= 0) one_hot(s, rt.svc_id[i], &m->projs[i], bf16);
    }
    nl_runtime_free(&rt);
    nl_proj_service_free(s);
    nl_model_free(m);
    return nl_t_done();
}

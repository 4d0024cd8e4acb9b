/* fuzz_adapter: the LoRA adapter loader (nl_adapter_load_buffer) against tiny models.
 *
 * Three tiny synthetic models (llama, qwen3, qwen35; nl_mkmodel "tiny", F32) are made once at
 * start-up in a temporary file each. The input is the adapter GGUF; it is offered to every
 * model (all but the one its general.architecture names refuse it at once).
 * Oracles on an accepted adapter: it has the model's architecture; each entry adapts a
 * distinct non-embedding projection with that projection's n_in / n_out and a rank in
 * 1..4096; by_proj is the inverse of the entries; the A and B blocks lie inside params
 * (rank * n_in and n_out * rank floats) without overlapping; every parameter is readable.
 * A refused adapter gets an error naming the input. */
#include "common.h"
#include "model/adapter.h"
#include "model/quant.h"

#define N_MODELS 3
static nl_model *M[N_MODELS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const nl_arch arch[N_MODELS] = {NL_ARCH_LLAMA, NL_ARCH_QWEN3, NL_ARCH_QWEN35};
    for (int i = 0; i < N_MODELS; i++) {
        char path[512];
        fuzz_tmp_path(path, sizeof path, nl_arch_name(arch[i]));
        if (nl_mkmodel(arch[i], "tiny", NL_TYPE_F32, 7, path) != 0 || !(M[i] = nl_model_load(path))) {
            fprintf(stderr, "fuzz_adapter: tiny %s model: %s\n", nl_arch_name(arch[i]), nl_last_error());
            abort();
        }
        remove(path); /* the mapping stays valid */
    }
    return 0;
}

static void check(const nl_model *m, const nl_adapter *a) {
    FUZZ_CHECK(a->arch == m->arch, "arch");
    FUZZ_CHECK(a->n >= 1 && a->n <= m->n_projs, "%d entries", a->n);
    FUZZ_CHECK(a->n_model_projs == m->n_projs, "n_model_projs");
    /* the blocks, as [start, end) in floats, must tile without overlap */
    size_t *lo = calloc((size_t)a->n * 2, sizeof *lo), *hi = calloc((size_t)a->n * 2, sizeof *hi);
    FUZZ_CHECK(lo && hi, "oom");
    for (int i = 0; i < a->n; i++) {
        const nl_lora_tensor *t = &a->t[i];
        FUZZ_CHECK(t->proj >= 0 && t->proj < m->n_projs, "proj %d", t->proj);
        const nl_proj_desc *d = &m->projs[t->proj];
        FUZZ_CHECK(d->kind != NL_P_EMBED, "adapts the embedding");
        FUZZ_CHECK(t->n_in == d->n_in && t->n_out == d->n_out, "shape of '%s'", d->name);
        FUZZ_CHECK(t->rank >= 1 && t->rank <= 4096, "rank %d", t->rank);
        FUZZ_CHECK(a->by_proj[t->proj] == i, "by_proj[%d] = %d, expected %d", t->proj, a->by_proj[t->proj], i);
        lo[2 * i] = t->off_a;
        hi[2 * i] = t->off_a + (size_t)t->rank * (size_t)t->n_in;
        lo[2 * i + 1] = t->off_b;
        hi[2 * i + 1] = t->off_b + (size_t)t->n_out * (size_t)t->rank;
        (void)nl_adapter_scale(a, i);
    }
    int mapped = 0;
    for (int p = 0; p < m->n_projs; p++) {
        FUZZ_CHECK(a->by_proj[p] >= -1 && a->by_proj[p] < a->n, "by_proj[%d] = %d", p, a->by_proj[p]);
        mapped += a->by_proj[p] >= 0;
    }
    FUZZ_CHECK(mapped == a->n, "%d projections mapped for %d entries", mapped, a->n);
    for (int i = 0; i < 2 * a->n; i++) {
        FUZZ_CHECK(hi[i] <= a->n_params, "block [%zu, %zu) past %zu params", lo[i], hi[i], a->n_params);
        for (int j = 0; j < i; j++) FUZZ_CHECK(hi[i] <= lo[j] || hi[j] <= lo[i], "blocks %d and %d overlap", i, j);
    }
    free(lo);
    free(hi);
    volatile float s = 0;
    for (size_t k = 0; k < a->n_params; k++) s += a->params[k];
    (void)s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < N_MODELS; i++) {
        nl_adapter *a = nl_adapter_load_buffer(M[i], data, size, "fuzz-adapter.gguf");
        if (!a) {
            const char *e = nl_last_error();
            FUZZ_NOTE("model %d refused: %s", i, e);
            FUZZ_CHECK(e && strstr(e, "fuzz-adapter.gguf"), "error does not name the input: %s", e);
            continue;
        }
        FUZZ_NOTE("model %d accepted: %d entries", i, a->n);
        check(M[i], a);
        nl_adapter_free(a);
    }
    return 0;
}

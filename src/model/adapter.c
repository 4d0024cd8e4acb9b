/* LoRA adapter io and layout; see adapter.h. */
#include "model/adapter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "model/gguf.h"
#include "model/peft.h"
#include "model/quant.h"
#include "util/rng.h"
#include "util/util.h"

static const char *const kind_names[] = {
    [NL_P_Q] = "q",           [NL_P_K] = "k",         [NL_P_V] = "v",       [NL_P_O] = "o",
    [NL_P_GATE] = "gate",     [NL_P_UP] = "up",       [NL_P_DOWN] = "down", [NL_P_QKV] = "qkv",
    [NL_P_Z] = "z",           [NL_P_ALPHA] = "alpha", [NL_P_BETA] = "beta", [NL_P_OUT] = "out",
    [NL_P_OUTPUT] = "output", [NL_P_EMBED] = "embed",
};

int nl_parse_targets(const char *targets, uint32_t *mask) {
    *mask = 0;
    if (!targets || !*targets || !strcmp(targets, "all")) {
        for (int k = 0; k < NL_P_OUTPUT; k++) *mask |= 1u << k;
        return 0;
    }
    const char *p = targets;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int k = 0; k < NL_P_EMBED; k++)
            if (strlen(kind_names[k]) == n && !strncmp(kind_names[k], p, n)) found = k;
        if (found < 0)
            return nl_err("--targets: unknown projection '%.*s' (known: "
                          "q,k,v,o,gate,up,down,qkv,z,alpha,beta,out,output, or all)",
                          (int)n, p);
        *mask |= 1u << found;
        p += n + (e ? 1 : 0);
    }
    return 0;
}

nl_adapter *nl_adapter_alloc(const nl_model *m, const int *projs, const int *ranks, int n, float alpha) {
    nl_adapter *a = nl_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->arch = m->arch;
    a->alpha = alpha;
    a->n = n;
    a->n_model_projs = m->n_projs;
    a->t = nl_calloc((size_t)n, sizeof *a->t);
    a->by_proj = nl_malloc((size_t)m->n_projs * sizeof *a->by_proj);
    if (!a->t || !a->by_proj) {
        nl_adapter_free(a);
        return NULL;
    }
    for (int i = 0; i < m->n_projs; i++) a->by_proj[i] = -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const nl_proj_desc *d = &m->projs[projs[i]];
        nl_lora_tensor *t = &a->t[i];
        t->proj = projs[i];
        t->rank = ranks[i];
        t->n_in = d->n_in;
        t->n_out = d->n_out;
        t->off_a = off;
        off += (size_t)t->rank * (size_t)t->n_in;
        t->off_b = off;
        off += (size_t)t->n_out * (size_t)t->rank;
        a->by_proj[projs[i]] = i;
        if (i == 0 || t->rank > a->rank) a->rank = t->rank;
    }
    a->n_params = off;
    a->params = nl_calloc(off, sizeof(float));
    if (!a->params) {
        nl_adapter_free(a);
        return NULL;
    }
    return a;
}

void nl_lora_init(float *A, float *B, int rank, int n_in, int n_out, uint64_t key) {
    const float bound = 1.0f / sqrtf((float)n_in);
    const int64_t na = (int64_t)rank * n_in, nbv = (int64_t)n_out * rank;
    for (int64_t c = 0; c < na; c++) A[c] = (2.0f * nl_rng_uniform(key, (uint64_t)c) - 1.0f) * bound;
    for (int64_t c = 0; c < nbv; c++) B[c] = 0.0f;
}

nl_adapter *nl_adapter_new(const nl_model *m, const char *targets, int rank, float alpha, uint64_t seed) {
    uint32_t mask;
    if (nl_parse_targets(targets, &mask)) return NULL;
    if (rank < 1 || rank > 4096) {
        nl_err("--rank %d: expected 1..4096", rank);
        return NULL;
    }
    int *projs = nl_malloc((size_t)m->n_projs * sizeof *projs);
    int *ranks = nl_malloc((size_t)m->n_projs * sizeof *ranks);
    if (!projs || !ranks) {
        free(projs);
        free(ranks);
        return NULL;
    }
    int n = 0;
    for (int i = 0; i < m->n_projs; i++) {
        const nl_proj_desc *d = &m->projs[i];
        if (d->kind == NL_P_EMBED || !(mask & (1u << d->kind))) continue;
        projs[n] = i;
        ranks[n] = rank;
        n++;
    }
    nl_adapter *a = NULL;
    if (n == 0) nl_err("--targets '%s' selects no projection of this %s model", targets, nl_arch_name(m->arch));
    else a = nl_adapter_alloc(m, projs, ranks, n, alpha);
    free(projs);
    free(ranks);
    if (!a) return NULL;
    /* A: PEFT's kaiming-uniform; B = 0, so a fresh adapter leaves the model's outputs unchanged.
     * Each tensor's values come from a key of (seed, projection index). */
    for (int i = 0; i < a->n; i++)
        nl_lora_init(nl_lora_A(a, i), nl_lora_B(a, i), a->t[i].rank, (int)a->t[i].n_in, (int)a->t[i].n_out,
                     nl_rng_key_add(nl_rng_key(seed), (uint64_t)a->t[i].proj));
    return a;
}

void nl_adapter_free(nl_adapter *a) {
    if (!a) return;
    free(a->t);
    free(a->by_proj);
    free(a->params);
    free(a);
}

static int find_proj_by_name(const nl_model *m, const char *name, size_t len) {
    for (int i = 0; i < m->n_projs; i++)
        if (m->projs[i].kind != NL_P_EMBED && strlen(m->projs[i].name) == len && !strncmp(m->projs[i].name, name, len))
            return i;
    return -1;
}

static int tensor_to_f32(const char *path, const nl_gguf_tensor *t, float *out) {
    const nl_type_traits *tr = nl_type_get(t->type);
    if (!tr || !tr->to_float)
        return nl_err("%s: tensor '%s' has type %s, expected f32, f16, bf16 or q8_0", path, t->name,
                      nl_type_name(t->type));
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    tr->to_float(t->data, out, n);
    return 0;
}

/* Validate and copy out an opened adapter GGUF; closes g in every case. `path` labels errors.
 * Long (~125 lines): each tensor pair is checked against the model (name, shape, type, rank,
 * alpha) before anything is copied, so a bad file leaves nothing half loaded. */
static nl_adapter *load_gguf(const nl_model *m, nl_gguf *g, const char *path) {
    nl_adapter *a = NULL;
    int *projs = NULL, *ranks = NULL, *ia = NULL, *ib = NULL;
    const char *s;
    if (nl_gguf_get_str(g, "general.type", &s) != 0 || strcmp(s, "adapter") != 0) {
        nl_err("%s: not a LoRA adapter (general.type is not \"adapter\")", path);
        goto fail;
    }
    if (nl_gguf_get_str(g, "adapter.type", &s) != 0 || strcmp(s, "lora") != 0) {
        nl_err("%s: adapter.type is not \"lora\"", path);
        goto fail;
    }
    if (nl_gguf_get_str(g, "general.architecture", &s) != 0) {
        nl_err("%s: missing key general.architecture", path);
        goto fail;
    }
    if (strcmp(s, nl_arch_name(m->arch)) != 0) {
        nl_err("%s: adapter is for architecture '%s' but the model is '%s'", path, s, nl_arch_name(m->arch));
        goto fail;
    }
    float alpha = 0.0f;
    int r = nl_gguf_get_f32(g, "adapter.lora.alpha", &alpha);
    if (r < 0) {
        nl_err_prefix("%s", path);
        goto fail;
    }
    if (!isfinite(alpha)) {
        nl_err("%s: adapter.lora.alpha = %g: expected a finite number", path, (double)alpha);
        goto fail;
    }

    projs = nl_malloc((size_t)(g->n_tensors + 1) * sizeof(int));
    ranks = nl_malloc((size_t)(g->n_tensors + 1) * sizeof(int));
    ia = nl_malloc((size_t)(g->n_tensors + 1) * sizeof(int));
    ib = nl_malloc((size_t)(g->n_tensors + 1) * sizeof(int));
    if (!projs || !ranks || !ia || !ib) goto fail;
    int n = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        size_t len = strlen(t->name);
        int is_a = len > 7 && !strcmp(t->name + len - 7, ".lora_a");
        int is_b = len > 7 && !strcmp(t->name + len - 7, ".lora_b");
        if (!is_a && !is_b) {
            if (len > 12 && !strcmp(t->name + len - 12, "_norm.weight")) continue; /* llama.cpp ignores these */
            nl_err("%s: tensor '%s' is neither <base>.lora_a nor <base>.lora_b", path, t->name);
            goto fail;
        }
        if (!is_a) continue;
        int p = find_proj_by_name(m, t->name, len - 7);
        if (p < 0) {
            nl_err("%s: tensor '%s' adapts '%.*s', which this %s model does not have", path, t->name, (int)(len - 7),
                   t->name, nl_arch_name(m->arch));
            goto fail;
        }
        char bname[NL_GGUF_MAX_NAME + 8];
        snprintf(bname, sizeof bname, "%.*s.lora_b", (int)(len - 7), t->name);
        const nl_gguf_tensor *tb = nl_gguf_tensor_find(g, bname);
        if (!tb) {
            nl_err("%s: '%s' has no matching '%s'", path, t->name, bname);
            goto fail;
        }
        const nl_proj_desc *d = &m->projs[p];
        if (t->n_dims != 2 || tb->n_dims != 2 || t->ne[0] != d->n_in || tb->ne[1] != d->n_out ||
            t->ne[1] != tb->ne[0]) {
            nl_err("%s: '%s' {%lld, %lld} / '%s' {%lld, %lld} do not fit base '%s' {%lld, %lld} "
                   "(expected lora_a {%lld, r} and lora_b {r, %lld})",
                   path, t->name, (long long)t->ne[0], (long long)t->ne[1], tb->name, (long long)tb->ne[0],
                   (long long)tb->ne[1], d->name, (long long)d->n_in, (long long)d->n_out, (long long)d->n_in,
                   (long long)d->n_out);
            goto fail;
        }
        if (t->ne[1] < 1 || t->ne[1] > 4096) {
            nl_err("%s: '%s' has rank %lld, expected 1..4096", path, t->name, (long long)t->ne[1]);
            goto fail;
        }
        for (int j = 0; j < n; j++)
            if (projs[j] == p) {
                nl_err("%s: '%s' appears twice", path, t->name);
                goto fail;
            }
        projs[n] = p;
        ranks[n] = (int)t->ne[1];
        ia[n] = (int)i;
        ib[n] = (int)(tb - g->tensors);
        n++;
    }
    /* every lora_b needs its lora_a */
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        size_t len = strlen(name);
        if (len > 7 && !strcmp(name + len - 7, ".lora_b")) {
            int ok = 0;
            for (int j = 0; j < n; j++) ok |= ib[j] == (int)i;
            if (!ok) {
                nl_err("%s: '%s' has no matching lora_a", path, name);
                goto fail;
            }
        }
    }
    if (n == 0) {
        nl_err("%s: the adapter has no lora_a/lora_b tensors", path);
        goto fail;
    }
    a = nl_adapter_alloc(m, projs, ranks, n, alpha);
    if (!a) goto fail;
    for (int i = 0; i < n; i++) {
        if (tensor_to_f32(path, &g->tensors[ia[i]], nl_lora_A(a, i))) goto fail;
        if (tensor_to_f32(path, &g->tensors[ib[i]], nl_lora_B(a, i))) goto fail;
    }
    if (nl_adapter_check_finite(a, m, path)) goto fail;
    free(projs);
    free(ranks);
    free(ia);
    free(ib);
    nl_gguf_close(g);
    return a;
fail:
    free(projs);
    free(ranks);
    free(ia);
    free(ib);
    nl_adapter_free(a);
    nl_gguf_close(g);
    return NULL;
}

int nl_adapter_check_finite(const nl_adapter *a, const nl_model *m, const char *label) {
    for (size_t k = 0; k < a->n_params; k++)
        if (!isfinite(a->params[k])) {
            char name[NL_GGUF_MAX_NAME + 32];
            nl_adapter_elem_name(a, m, k, name, sizeof name);
            return nl_err("%s: non-finite value: parameter %s = %g", label, name, (double)a->params[k]);
        }
    if (!isfinite(a->alpha)) return nl_err("%s: alpha = %g: expected a finite number", label, (double)a->alpha);
    for (int i = 0; i < a->n; i++) {
        const nl_lora_tensor *lt = &a->t[i];
        const float *A = nl_lora_A(a, i), *B = nl_lora_B(a, i);
        double na = 0.0, nb = 0.0; /* infinity norms, in double: no overflow while checking */
        for (int r = 0; r < lt->rank; r++) {
            double sum = 0.0;
            for (int64_t j = 0; j < lt->n_in; j++) sum += fabs((double)A[(size_t)r * (size_t)lt->n_in + (size_t)j]);
            if (sum > na) na = sum;
        }
        for (int64_t o = 0; o < lt->n_out; o++) {
            double sum = 0.0;
            for (int r = 0; r < lt->rank; r++) sum += fabs((double)B[(size_t)o * (size_t)lt->rank + (size_t)r]);
            if (sum > nb) nb = sum;
        }
        double s = fabs((double)nl_adapter_scale(a, i));
        double gain = fmax(1.0, s) * fmax(1.0, na) * fmax(1.0, nb);
        if (!(gain <= NL_ADAPTER_MAX_GAIN)) {
            const char *nm = m->projs[lt->proj].name;
            size_t bl = strlen(nm);
            if (bl > 7 && !strcmp(nm + bl - 7, ".weight")) bl -= 7;
            return nl_err(
                "%s: '%.*s' overflows the forward: its update scale %g x |B| %g x |A| %g (largest row sums) can "
                "multiply an activation by %.3g, more than the %g a finite forward allows: its values or its "
                "alpha are out of range (the adapter is damaged, or was trained to diverge)",
                label, (int)bl, nm, s, nb, na, gain, NL_ADAPTER_MAX_GAIN);
        }
    }
    return 0;
}

void nl_adapter_elem_name(const nl_adapter *a, const nl_model *m, size_t idx, char *buf, size_t cap) {
    for (int i = 0; i < a->n; i++) {
        const nl_lora_tensor *lt = &a->t[i];
        for (int part = 0; part < 2; part++) {
            size_t off = part ? lt->off_b : lt->off_a, n = (size_t)lt->rank * (size_t)(part ? lt->n_out : lt->n_in);
            if (idx < off || idx - off >= n) continue;
            const char *nm = m->projs[lt->proj].name;
            size_t bl = strlen(nm);
            if (bl > 7 && !strcmp(nm + bl - 7, ".weight")) bl -= 7;
            snprintf(buf, cap, "%.*s.lora_%c[%zu]", (int)bl, nm, part ? 'b' : 'a', idx - off);
            return;
        }
    }
    snprintf(buf, cap, "[%zu]", idx);
}

nl_adapter *nl_adapter_load(const nl_model *m, const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return nl_peft_load(m, path);
    nl_gguf *g = nl_gguf_open(path);
    return g ? load_gguf(m, g, path) : NULL;
}

nl_adapter *nl_adapter_load_buffer(const nl_model *m, const void *buf, size_t len, const char *label) {
    nl_gguf *g = nl_gguf_open_buffer(buf, len, label);
    return g ? load_gguf(m, g, label) : NULL;
}

static int save_impl(const nl_adapter *a, const nl_model *m, const float *values, const char *path) {
    nl_gguf_writer *w = nl_gguf_writer_new();
    if (!w) return -1;
    int rc = 0;
    rc |= nl_gguf_set_str(w, "general.type", "adapter");
    rc |= nl_gguf_set_str(w, "general.architecture", nl_arch_name(m->arch));
    rc |= nl_gguf_set_str(w, "general.name", "nightlora adapter");
    rc |= nl_gguf_set_u32(w, "general.file_type", NL_FTYPE_ALL_F32);
    rc |= nl_gguf_set_str(w, "adapter.type", "lora");
    rc |= nl_gguf_set_f32(w, "adapter.lora.alpha", a->alpha);
    for (int i = 0; i < a->n && rc == 0; i++) {
        const nl_lora_tensor *t = &a->t[i];
        char name[NL_GGUF_MAX_NAME + 8];
        int64_t ne_a[2] = {t->n_in, t->rank}, ne_b[2] = {t->rank, t->n_out};
        snprintf(name, sizeof name, "%s.lora_a", m->projs[t->proj].name);
        rc |= nl_gguf_add_tensor(w, name, NL_TYPE_F32, 2, ne_a, values + t->off_a, true);
        snprintf(name, sizeof name, "%s.lora_b", m->projs[t->proj].name);
        rc |= nl_gguf_add_tensor(w, name, NL_TYPE_F32, 2, ne_b, values + t->off_b, true);
    }
    if (rc == 0) rc = nl_gguf_write(w, path);
    nl_gguf_writer_free(w);
    return rc ? -1 : 0;
}

int nl_adapter_save(const nl_adapter *a, const nl_model *m, const char *path) {
    return save_impl(a, m, a->params, path);
}

int nl_adapter_save_values(const nl_adapter *a, const nl_model *m, const float *values, const char *path) {
    return save_impl(a, m, values, path);
}

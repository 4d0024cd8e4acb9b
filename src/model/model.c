/* model/model: llama, qwen3, qwen35 and gemma3 read from GGUF metadata; every required key and tensor
 * shape is validated; frozen projections are described (nl_proj_desc) and small vectors are
 * copied to F32. Facts: docs/formats.md §2. */
#include "model/model.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "util/util.h"

static const char *const arch_names[NL_ARCH_COUNT] = {"llama", "qwen3", "qwen35", "gemma3"};

const char *nl_arch_name(nl_arch a) { return (a >= 0 && a < NL_ARCH_COUNT) ? arch_names[a] : "unknown"; }

int nl_arch_from_name(const char *s) {
    for (int a = 0; s && a < NL_ARCH_COUNT; a++)
        if (strcmp(s, arch_names[a]) == 0) return a;
    return -1;
}

const char *nl_proj_kind_name(nl_proj_kind k) {
    static const char *const n[NL_P_KIND_COUNT] = {"q",   "k", "v",     "o",    "gate", "up",     "down",
                                                   "qkv", "z", "alpha", "beta", "out",  "output", "embed"};
    return (k >= 0 && k < NL_P_KIND_COUNT) ? n[k] : "unknown";
}

const char *nl_proj_class_name(nl_proj_class c) {
    static const char *const n[NL_CLASS_COUNT] = {"attn", "mlp", "recurrent", "head", "embed"};
    return (c >= 0 && c < NL_CLASS_COUNT) ? n[c] : "unknown";
}

/* GGUF tensor-name stem per projection kind (blk.%d.<stem>.weight). */
static const char *const kind_stem[NL_P_KIND_COUNT] = {"attn_q",   "attn_k",   "attn_v",   "attn_output", "ffn_gate",
                                                       "ffn_up",   "ffn_down", "attn_qkv", "attn_gate",   "ssm_alpha",
                                                       "ssm_beta", "ssm_out",  "output",   "token_embd"};

static nl_proj_class kind_class(nl_proj_kind k) {
    switch (k) {
    case NL_P_Q:
    case NL_P_K:
    case NL_P_V:
    case NL_P_O: return NL_CLASS_ATTN;
    case NL_P_GATE:
    case NL_P_UP:
    case NL_P_DOWN: return NL_CLASS_MLP;
    case NL_P_OUTPUT: return NL_CLASS_HEAD;
    case NL_P_EMBED: return NL_CLASS_EMBED;
    default: return NL_CLASS_RECURRENT;
    }
}

int nl_model_proj(const nl_model *m, int layer, nl_proj_kind kind) {
    if (!m || kind < 0 || kind >= NL_P_KIND_COUNT) return -1;
    if (kind == NL_P_EMBED) return m->p_embed;
    if (kind == NL_P_OUTPUT) return m->p_output;
    if (layer < 0 || layer >= m->hp.n_layer) return -1;
    return m->layers[layer].p[kind];
}

void nl_model_free(nl_model *m) {
    if (!m) return;
    if (m->layers)
        for (int il = 0; il < m->hp.n_layer; il++) {
            nl_layer *L = &m->layers[il];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_norm);
            free(L->k_norm);
            free(L->attn_post_norm);
            free(L->ffn_post_norm);
            free(L->ssm_conv);
            free(L->ssm_dt_bias);
            free(L->ssm_a);
            free(L->ssm_norm);
        }
    free(m->layers);
    free(m->projs);
    free(m->output_norm);
    free(m->rope_freqs);
    nl_gguf_close(m->gguf);
    free(m->path);
    free(m->warning);
    free(m);
}

void nl_hparams_arch(nl_arch a, nl_hparams *hp) {
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->mlp_gelu = hp->post_norms = hp->swa_pattern = 0;
    if (a != NL_ARCH_GEMMA3) return;
    /* llama.cpp's gemma3 (src/llama-model.cpp): every 6th layer full attention; queries scaled
     * by 1/sqrt(n_embd / n_head) on the 27B (62 layers: query_pre_attn_scalar), else by
     * 1/sqrt(head_dim); embeddings times sqrt(n_embd); GeGLU; post-norms */
    hp->swa_pattern = 6;
    if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->mlp_gelu = 1;
    hp->post_norms = 1;
}

/* ---- keys */
typedef struct {
    nl_model *m;
    const nl_gguf *g;
    char key[160];
    int block_count;
    uint8_t *used; /* [g->n_tensors]: found by find_tensor */
} loader;

static const char *akey(loader *ld, const char *suffix) {
    snprintf(ld->key, sizeof ld->key, "%s.%s", nl_arch_name(ld->m->arch), suffix);
    return ld->key;
}

/* u32 hparam that may also be written as a per-layer array (feed_forward_length, head_count):
 * only uniform arrays are supported. required: error naming the key when absent. */
static int get_u32_or_arr(loader *ld, const char *suffix, int required, int dflt, int n_layer, int *out) {
    const char *key = akey(ld, suffix);
    const nl_gguf_kv *kv = nl_gguf_get(ld->g, key);
    if (!kv) {
        if (required) return nl_err("%s: missing required key '%s'", ld->g->path, key);
        *out = dflt;
        return 0;
    }
    int64_t v;
    if (kv->type == NL_GGUF_ARRAY) {
        if (kv->arr_n == 0) return nl_err("%s: key '%s' is an empty array", ld->g->path, key);
        /* one value per layer: a shorter array leaves layers without one */
        if (kv->arr_n < (uint64_t)n_layer)
            return nl_err("%s: offset %" PRIu64 ": key '%s' holds %" PRIu64
                          " values, but block_count is %d: expected one per layer",
                          ld->g->path, kv->offset, key, kv->arr_n, n_layer);
        if (nl_gguf_arr_i64(kv, 0, &v)) return nl_err_prefix("%s", ld->g->path);
        for (uint64_t i = 1; i < kv->arr_n; i++) {
            int64_t w;
            if (nl_gguf_arr_i64(kv, i, &w)) return nl_err_prefix("%s", ld->g->path);
            if (w != v)
                return nl_err("%s: key '%s' varies per layer (%" PRId64 " at layer 0, %" PRId64 " at layer %" PRIu64
                              "): only uniform layers are supported",
                              ld->g->path, key, v, w, i);
        }
    } else if (nl_gguf_get_i64(ld->g, key, &v) != 0) {
        return -1;
    }
    if (v <= 0 || v > INT32_MAX)
        return nl_err("%s: key '%s' = %" PRId64 ", expected a positive 32-bit value", ld->g->path, key, v);
    *out = (int)v;
    return 0;
}

static int get_u32(loader *ld, const char *suffix, int required, int dflt, int *out) {
    const char *key = akey(ld, suffix);
    uint32_t v;
    int rc = nl_gguf_get_u32(ld->g, key, &v);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (required) return nl_err("%s: missing required key '%s'", ld->g->path, key);
        *out = dflt;
        return 0;
    }
    if (v == 0 || v > INT32_MAX)
        return nl_err("%s: key '%s' = %" PRIu32 ", expected a positive value", ld->g->path, key, v);
    *out = (int)v;
    return 0;
}

static int get_f32(loader *ld, const char *suffix, int required, float dflt, float *out) {
    const char *key = akey(ld, suffix);
    int rc = nl_gguf_get_f32(ld->g, key, out);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (required) return nl_err("%s: missing required key '%s'", ld->g->path, key);
        *out = dflt;
    }
    return 0;
}

static int read_hparams(loader *ld) {
    nl_model *m = ld->m;
    nl_hparams *hp = &m->hp;
    const char *path = ld->g->path;
    int block_count, nextn = 0, rc = 0;
    rc |= get_u32(ld, "context_length", 1, 0, &hp->n_ctx_train);
    if (!rc) rc |= get_u32(ld, "embedding_length", 1, 0, &hp->n_embd);
    if (!rc) rc |= get_u32(ld, "block_count", 1, 0, &block_count);
    if (!rc) rc |= get_u32_or_arr(ld, "feed_forward_length", 1, 0, block_count, &hp->n_ff);
    if (!rc) rc |= get_u32_or_arr(ld, "attention.head_count", 1, 0, block_count, &hp->n_head);
    if (!rc) rc |= get_u32_or_arr(ld, "attention.head_count_kv", 0, hp->n_head, block_count, &hp->n_head_kv);
    if (rc) return -1;
    if (hp->n_embd % hp->n_head != 0 && !nl_gguf_get(ld->g, akey(ld, "attention.key_length")))
        return nl_err("%s: n_embd %d is not a multiple of n_head %d and '%s' is absent", path, hp->n_embd, hp->n_head,
                      ld->key);
    int value_length;
    if (get_u32(ld, "attention.key_length", 0, hp->n_embd / hp->n_head, &hp->head_dim)) return -1;
    if (get_u32(ld, "attention.value_length", 0, hp->head_dim, &value_length)) return -1;
    if (value_length != hp->head_dim)
        return nl_err("%s: attention.value_length %d != key_length %d: only equal head sizes are supported", path,
                      value_length, hp->head_dim);
    if (get_u32(ld, "rope.dimension_count", 0, hp->head_dim, &hp->n_rot)) return -1;
    if (get_f32(ld, "rope.freq_base", 0, 10000.0f, &hp->rope_base)) return -1;
    if (!(hp->rope_base > 0) || !isfinite(hp->rope_base))
        return nl_err("%s: key '%s' = %g: expected a finite number > 0", path, ld->key, hp->rope_base);
    if (get_f32(ld, "attention.layer_norm_rms_epsilon", 1, 0, &hp->rms_eps)) return -1;
    if (!(hp->rms_eps > 0) || !isfinite(hp->rms_eps))
        return nl_err("%s: key '%s' = %g: expected a finite number > 0", path, ld->key, hp->rms_eps);
    /* Linear RoPE scaling divides positions by the factor (llama3's scaling comes as the
     * rope_freqs tensor); a scaling nightlora does not implement (yarn, longrope) is refused:
     * ignoring it would compute other positions than the model was trained with. */
    hp->rope_freq_scale = 1.0f;
    const char *stype = NULL;
    if (nl_gguf_get_str(ld->g, akey(ld, "rope.scaling.type"), &stype) < 0) return -1;
    if (stype && strcmp(stype, "none") && strcmp(stype, "linear"))
        return nl_err("%s: key '%s' = '%s': this RoPE scaling is not implemented (nightlora has linear, or none)", path,
                      ld->key, stype);
    if (stype && strcmp(stype, "linear") == 0) {
        float factor = 1.0f;
        if (get_f32(ld, "rope.scaling.factor", 0, 1.0f, &factor)) return -1;
        if (!(factor > 0) || !isfinite(factor))
            return nl_err("%s: key '%s' = %g: expected a finite number > 0", path, ld->key, factor);
        hp->rope_freq_scale = 1.0f / factor;
    }
    hp->rope_neox = m->arch != NL_ARCH_LLAMA;
    if (m->arch == NL_ARCH_GEMMA3) {
        /* the window from the file; the local RoPE base as llama.cpp has it (10000) unless the
         * file names one */
        if (get_u32(ld, "attention.sliding_window", 1, 0, &hp->n_swa)) return -1;
        if (get_f32(ld, "rope.freq_base_swa", 0, 10000.0f, &hp->rope_base_swa)) return -1;
        if (!(hp->rope_base_swa > 0) || !isfinite(hp->rope_base_swa))
            return nl_err("%s: key '%s' = %g: expected a finite number > 0", path, ld->key, hp->rope_base_swa);
    }
    if (m->arch == NL_ARCH_QWEN35) {
        const char *k = akey(ld, "nextn_predict_layers");
        uint32_t v;
        int r = nl_gguf_get_u32(ld->g, k, &v);
        if (r < 0) return -1;
        if (r == 0) nextn = (int)v;
        if (nextn >= block_count)
            return nl_err("%s: key '%s' = %d leaves no layers of %d", path, k, nextn, block_count);
    }
    hp->n_layer = block_count - nextn; /* MTP blocks come after the main stack and are ignored */
    ld->block_count = block_count;
    nl_hparams_arch(m->arch, hp);

    if (hp->n_head % hp->n_head_kv != 0)
        return nl_err("%s: n_head %d is not a multiple of n_head_kv %d", path, hp->n_head, hp->n_head_kv);
    if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return nl_err("%s: rope.dimension_count %d must be even and <= head_dim %d", path, hp->n_rot, hp->head_dim);
    if (m->arch == NL_ARCH_LLAMA && hp->n_rot != hp->head_dim)
        return nl_err("%s: llama requires rope.dimension_count (%d) == head_dim (%d)", path, hp->n_rot, hp->head_dim);

    if (m->arch == NL_ARCH_QWEN35) {
        if (get_u32(ld, "ssm.conv_kernel", 1, 0, &hp->ssm_d_conv) ||
            get_u32(ld, "ssm.state_size", 1, 0, &hp->ssm_d_state) ||
            get_u32(ld, "ssm.group_count", 1, 0, &hp->ssm_n_group) ||
            get_u32(ld, "ssm.time_step_rank", 1, 0, &hp->ssm_dt_rank) ||
            get_u32(ld, "ssm.inner_size", 1, 0, &hp->ssm_d_inner) ||
            get_u32(ld, "full_attention_interval", 0, 4, &hp->full_attn_interval))
            return -1;
        if (!nl_gguf_get(ld->g, akey(ld, "rope.dimension_sections")))
            return nl_err("%s: missing required key '%s'", path, ld->key);
        if (hp->ssm_dt_rank % hp->ssm_n_group != 0)
            return nl_err("%s: ssm.time_step_rank %d (value heads) is not a multiple of ssm.group_count %d (key heads)",
                          path, hp->ssm_dt_rank, hp->ssm_n_group);
        /* llama.cpp sizes the value heads with state_size too, so inner_size must agree. */
        if ((int64_t)hp->ssm_d_state * hp->ssm_dt_rank != hp->ssm_d_inner)
            return nl_err("%s: ssm.inner_size %d != ssm.state_size %d * ssm.time_step_rank %d", path, hp->ssm_d_inner,
                          hp->ssm_d_state, hp->ssm_dt_rank);
    }
    return 0;
}

/* ---- tensors */
static void shape_str(const int64_t *ne, int nd, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "{%" PRId64, ne[0]);
    for (int d = 1; d < nd && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, ", %" PRId64, ne[d]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "}");
}

/* Finds `name` and checks its shape {ne0} (ne1 == 0) or {ne0, ne1} and that its type can be
 * read. Returns 0 (found, *out set), 1 (absent; an error naming it is set when required),
 * -1 (present but wrong: the error names the tensor and both shapes, or the type). */
static int find_tensor(loader *ld, const char *name, int64_t ne0, int64_t ne1, int required,
                       const nl_gguf_tensor **out) {
    const nl_gguf_tensor *t = nl_gguf_tensor_find(ld->g, name);
    int nd = ne1 > 0 ? 2 : 1;
    int64_t want[4] = {ne0, nd == 2 ? ne1 : 1, 1, 1};
    char ws[96], fs[96];
    shape_str(want, nd, ws, sizeof ws);
    if (!t) {
        if (required) nl_err("%s: missing tensor '%s' (expected shape %s)", ld->g->path, name, ws);
        return 1;
    }
    if (t->ne[0] != want[0] || t->ne[1] != want[1] || t->ne[2] != 1 || t->ne[3] != 1) {
        shape_str(t->ne, t->n_dims ? (int)t->n_dims : 1, fs, sizeof fs);
        return nl_err("%s: tensor '%s' has shape %s, expected %s", ld->g->path, name, fs, ws);
    }
    const nl_type_traits *tt = nl_type_get(t->type);
    if (!tt || !tt->to_float)
        return nl_err("%s: tensor '%s' has type %s, which nightlora cannot read", ld->g->path, name,
                      nl_type_name(t->type));
    /* Inf/NaN weights are the file's fault: say so here, not later as a non-finite loss or
     * gradient (one pass over the bytes, at memory speed: scales and exponents only) */
    const int64_t bad = nl_type_first_nonfinite(t->type, t->data, t->ne[0] * t->ne[1]);
    if (bad >= 0) {
        float blk[256];
        const int64_t b0 = bad / tt->blck * tt->blck;
        tt->to_float((const uint8_t *)t->data + (size_t)(bad / tt->blck) * tt->bytes, blk, tt->blck);
        return nl_err("%s: tensor '%s' holds non-finite values (element %" PRId64
                      " = %g, %s%s%s at file offset %" PRIu64 "): the model file is damaged or was converted wrongly",
                      ld->g->path, name, bad, (double)blk[bad - b0], tt->blck > 1 ? "in the " : "",
                      tt->blck > 1 ? tt->name : "", tt->blck > 1 ? " block" : "",
                      ld->g->data_offset + t->offset + (uint64_t)(bad / tt->blck) * tt->bytes);
    }
    ld->used[t - ld->g->tensors] = 1;
    *out = t;
    return 0;
}

/* F32 copy of a tensor of n = ne0 * max(ne1, 1) elements (norm weights, conv kernels). NULL
 * with *err = 1 on an error; NULL with *err untouched when absent and optional. */
static float *load_f32(loader *ld, const char *name, int64_t ne0, int64_t ne1, int required, int *err) {
    const nl_gguf_tensor *t;
    int rc = find_tensor(ld, name, ne0, ne1, required, &t);
    if (rc != 0) {
        if (rc < 0 || required) *err = 1;
        return NULL;
    }
    int64_t n = ne0 * (ne1 > 0 ? ne1 : 1);
    float *v = nl_malloc((size_t)n * sizeof *v);
    if (!v) {
        *err = 1;
        return NULL;
    }
    nl_type_get(t->type)->to_float(t->data, v, n);
    return v;
}

/* Registers a projection (W ggml {n_in, n_out}). Returns its id, -1 when absent and optional,
 * -2 on error. */
static int add_proj(loader *ld, const char *name, int il, nl_proj_kind kind, int64_t n_in, int64_t n_out,
                    int required) {
    nl_model *m = ld->m;
    const nl_gguf_tensor *t;
    int rc = find_tensor(ld, name, n_in, n_out, required, &t);
    if (rc < 0 || (rc == 1 && required)) return -2;
    if (rc == 1) return -1;
    nl_proj_desc *p = &m->projs[m->n_projs];
    p->name = t->name; /* owned by the gguf */
    p->layer = il;
    p->kind = kind;
    p->cls = kind_class(kind);
    p->n_in = n_in;
    p->n_out = n_out;
    p->w = t;
    if (il >= 0) m->layers[il].p[kind] = m->n_projs;
    return m->n_projs++;
}

static int layer_proj(loader *ld, int il, nl_proj_kind kind, int64_t n_in, int64_t n_out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, kind_stem[kind]);
    return add_proj(ld, name, il, kind, n_in, n_out, 1) < 0 ? -1 : 0;
}

static float *layer_vec(loader *ld, int il, const char *stem, int64_t ne0, int64_t ne1, int *err) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, stem);
    return load_f32(ld, name, ne0, ne1, 1, err);
}

static int load_layer(loader *ld, int il) {
    nl_model *m = ld->m;
    const nl_hparams *hp = &m->hp;
    nl_layer *L = &m->layers[il];
    int err = 0;
    const int64_t E = hp->n_embd, hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, F = hp->n_ff;
    for (int k = 0; k < NL_P_KIND_COUNT; k++) L->p[k] = -1;

    if (!(L->attn_norm = layer_vec(ld, il, "attn_norm.weight", E, 0, &err))) return -1;
    /* qwen35's post_attention_norm is the pre-FFN norm */
    if (!(L->ffn_norm = layer_vec(ld, il, m->arch == NL_ARCH_QWEN35 ? "post_attention_norm.weight" : "ffn_norm.weight",
                                  E, 0, &err)))
        return -1;
    if (!L->recurrent) {
        int64_t q_out = m->arch == NL_ARCH_QWEN35 ? hd * H * 2 : hd * H; /* qwen35: [q_h | gate_h] per head */
        if (layer_proj(ld, il, NL_P_Q, E, q_out) || layer_proj(ld, il, NL_P_K, E, hd * Hkv) ||
            layer_proj(ld, il, NL_P_V, E, hd * Hkv) || layer_proj(ld, il, NL_P_O, hd * H, E))
            return -1;
        if (m->arch != NL_ARCH_LLAMA) {
            if (!(L->q_norm = layer_vec(ld, il, "attn_q_norm.weight", hd, 0, &err))) return -1;
            if (!(L->k_norm = layer_vec(ld, il, "attn_k_norm.weight", hd, 0, &err))) return -1;
        }
    } else {
        const int64_t Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank, dk = hp->ssm_d_state,
                      dv = hp->ssm_d_inner / hp->ssm_dt_rank;
        const int64_t key_dim = Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;
        if (layer_proj(ld, il, NL_P_QKV, E, conv_dim) || layer_proj(ld, il, NL_P_Z, E, value_dim) ||
            layer_proj(ld, il, NL_P_ALPHA, E, Hv) || layer_proj(ld, il, NL_P_BETA, E, Hv) ||
            layer_proj(ld, il, NL_P_OUT, value_dim, E))
            return -1;
        if (!(L->ssm_conv = layer_vec(ld, il, "ssm_conv1d.weight", hp->ssm_d_conv, conv_dim, &err))) return -1;
        if (!(L->ssm_dt_bias = layer_vec(ld, il, "ssm_dt.bias", Hv, 0, &err))) return -1;
        if (!(L->ssm_a = layer_vec(ld, il, "ssm_a", Hv, 0, &err))) return -1;
        if (!(L->ssm_norm = layer_vec(ld, il, "ssm_norm.weight", dv, 0, &err))) return -1;
    }
    if (layer_proj(ld, il, NL_P_GATE, E, F) || layer_proj(ld, il, NL_P_UP, E, F) || layer_proj(ld, il, NL_P_DOWN, F, E))
        return -1;
    if (hp->post_norms) {
        if (!(L->attn_post_norm = layer_vec(ld, il, "post_attention_norm.weight", E, 0, &err))) return -1;
        if (!(L->ffn_post_norm = layer_vec(ld, il, "post_ffw_norm.weight", E, 0, &err))) return -1;
    }
    /* llama.cpp's loader also knows biases and a fused attn_qkv for other checkpoints;
     * nightlora's graph has neither, so refuse such a file rather than ignore tensors. */
    static const char *const extra[] = {"attn_q.bias",   "attn_k.bias", "attn_v.bias",   "attn_output.bias",
                                        "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "attn_qkv.weight"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        if (L->recurrent && i == sizeof extra / sizeof extra[0] - 1) continue;
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", il, extra[i]);
        if (nl_gguf_tensor_find(ld->g, name))
            return nl_err("%s: tensor '%s' is not supported by nightlora's %s graph", ld->g->path, name,
                          nl_arch_name(m->arch));
    }
    return 0;
}

static int set_recurrent(loader *ld) {
    nl_model *m = ld->m;
    const nl_hparams *hp = &m->hp;
    for (int il = 0; il < hp->n_layer; il++) {
        m->layers[il].recurrent = m->arch == NL_ARCH_QWEN35 && ((il + 1) % hp->full_attn_interval) != 0;
        m->layers[il].swa = hp->n_swa > 0 && hp->swa_pattern > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
    }
    if (m->arch != NL_ARCH_QWEN35) return 0;
    const char *key = akey(ld, "attention.recurrent_layers");
    const nl_gguf_kv *kv = nl_gguf_get(ld->g, key);
    if (!kv) return 0;
    if (kv->type != NL_GGUF_ARRAY || kv->arr_type == NL_GGUF_STRING)
        return nl_err("%s: key '%s' has type %s, expected an array of bool", ld->g->path, key,
                      nl_gguf_vtype_name(kv->type));
    if (kv->arr_n < (uint64_t)hp->n_layer)
        return nl_err("%s: key '%s' has %" PRIu64 " entries, expected %d (one per layer)", ld->g->path, key, kv->arr_n,
                      hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) {
        int64_t v;
        if (nl_gguf_arr_i64(kv, (uint64_t)il, &v)) return nl_err_prefix("%s", ld->g->path);
        m->layers[il].recurrent = v != 0;
    }
    return 0;
}

/* Tensors the graph did not take: a blk.N tensor past block_count is an error (block_count
 * says fewer layers than the file holds: layers would be dropped silently); any other
 * unused tensor (the MTP blocks after the main stack excepted) is listed in m->warning. */
static int check_unused(loader *ld) {
    const nl_gguf *g = ld->g;
    char list[512];
    size_t k = 0;
    int n_unused = 0;
    list[0] = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        long layer = -1;
        if (!strncmp(name, "blk.", 4) && name[4] >= '0' && name[4] <= '9') {
            char *end;
            layer = strtol(name + 4, &end, 10);
            if (*end != '.') layer = -1;
        }
        if (layer >= ld->block_count)
            return nl_err(
                "%s: tensor '%s' is of layer %ld, but block_count is %d: the file holds more layers than it says",
                g->path, name, layer, ld->block_count);
        if (ld->used[i] || layer >= ld->m->hp.n_layer) continue;
        if (n_unused++ < 8 && k < sizeof list)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", name);
    }
    if (n_unused == 0) return 0;
    char buf[700];
    snprintf(buf, sizeof buf, "%d tensor%s that nightlora's %s graph does not use, ignored: %s%s", n_unused,
             n_unused > 1 ? "s" : "", nl_arch_name(ld->m->arch), list, n_unused > 8 ? ", ..." : "");
    ld->m->warning = nl_strdup(buf);
    return ld->m->warning ? 0 : -1;
}

nl_model *nl_model_from_gguf(nl_gguf *g) {
    if (!g) return NULL;
    nl_model *m = nl_calloc(1, sizeof *m);
    if (!m) {
        nl_gguf_close(g);
        return NULL;
    }
    m->gguf = g;
    m->path = nl_strdup(g->path);
    m->p_embed = m->p_output = -1;
    loader ld = {.m = m, .g = g, .used = nl_calloc(g->n_tensors > 0 ? (size_t)g->n_tensors : 1, 1)};
    if (!ld.used) goto fail;
    const char *arch;
    int rc = nl_gguf_get_str(g, "general.architecture", &arch);
    if (rc != 0) {
        if (rc == 1) nl_err("%s: missing required key 'general.architecture'", g->path);
        goto fail;
    }
    int a = nl_arch_from_name(arch);
    if (a < 0) {
        nl_err("%s: unsupported architecture '%s' (supported: llama, qwen3, qwen35, gemma3)", g->path, arch);
        goto fail;
    }
    m->arch = (nl_arch)a;
    if (!m->path || read_hparams(&ld)) goto fail;
    nl_hparams *hp = &m->hp;

    /* n_vocab: the vocab_size key, else the tokens array, else token_embd's rows. */
    const nl_gguf_tensor *te = nl_gguf_tensor_find(g, "token_embd.weight");
    const nl_gguf_kv *toks = nl_gguf_get(g, "tokenizer.ggml.tokens");
    if (nl_gguf_get(g, akey(&ld, "vocab_size"))) {
        if (get_u32(&ld, "vocab_size", 1, 0, &hp->n_vocab)) goto fail;
    } else if (toks && toks->type == NL_GGUF_ARRAY && toks->arr_n > 0 && toks->arr_n <= INT32_MAX) {
        hp->n_vocab = (int)toks->arr_n;
    } else if (te && te->ne[1] > 0 && te->ne[1] <= INT32_MAX) {
        hp->n_vocab = (int)te->ne[1];
    } else {
        nl_err("%s: cannot tell the vocabulary size: no '%s', no tokenizer.ggml.tokens, no token_embd.weight", g->path,
               ld.key);
        goto fail;
    }

    /* Never trust block_count for an allocation: every layer has at least 9 tensors. */
    if ((int64_t)hp->n_layer * 9 > g->n_tensors) {
        nl_err("%s: block_count %d needs at least %" PRId64 " tensors, the file has %" PRId64, g->path, hp->n_layer,
               (int64_t)hp->n_layer * 9, g->n_tensors);
        goto fail;
    }
    m->layers = nl_calloc((size_t)hp->n_layer, sizeof *m->layers);
    m->projs = nl_calloc((size_t)hp->n_layer * NL_P_KIND_COUNT + 2, sizeof *m->projs);
    if (!m->layers || !m->projs) goto fail;
    if (set_recurrent(&ld)) goto fail;

    m->p_embed = add_proj(&ld, "token_embd.weight", -1, NL_P_EMBED, hp->n_embd, hp->n_vocab, 1);
    if (m->p_embed < 0) goto fail;
    int err = 0;
    m->output_norm = load_f32(&ld, "output_norm.weight", hp->n_embd, 0, 1, &err);
    if (err) goto fail;
    if (m->arch == NL_ARCH_LLAMA) {
        m->rope_freqs = load_f32(&ld, "rope_freqs.weight", hp->n_rot / 2, 0, 0, &err);
        if (err) goto fail;
    }
    for (int il = 0; il < hp->n_layer; il++)
        if (load_layer(&ld, il)) goto fail;
    m->p_output = add_proj(&ld, "output.weight", -1, NL_P_OUTPUT, hp->n_embd, hp->n_vocab, 0);
    if (m->p_output == -2) goto fail;
    if (m->p_output < 0) {
        /* Tied head: the vocabulary projection reuses the token embedding's bytes. */
        m->tied_head = true;
        nl_proj_desc *p = &m->projs[m->n_projs];
        *p = m->projs[m->p_embed];
        p->kind = NL_P_OUTPUT;
        p->cls = NL_CLASS_HEAD;
        m->p_output = m->n_projs++;
    }
    if (check_unused(&ld)) goto fail;

    free(ld.used);
    return m;
fail:
    free(ld.used);
    nl_model_free(m);
    return NULL;
}

nl_model *nl_model_load(const char *path) {
    nl_gguf *g = nl_gguf_open(path);
    if (!g) return NULL;
    return nl_model_from_gguf(g);
}

int nl_model_check_unchanged(const nl_model *m, const char *path, const char *who, const char *then) {
    if (!m || !m->gguf || !nl_gguf_changed(m->gguf)) return 0;
    return nl_err("%s changed while %s was using it (truncated or rewritten); %s", path, who, then);
}

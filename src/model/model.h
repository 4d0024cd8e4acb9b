/* model/model: architectures (llama, qwen3, qwen35, gemma3) read from GGUF metadata, their tensor
 * tables, and the loaded model. Facts: docs/formats.md §2.
 *
 * The model never multiplies by a frozen weight itself: it describes every frozen projection
 * (nl_proj_desc) and proj/ owns the resident bytes and the products. Small per-layer vectors
 * (norm weights, conv kernel, gates) are copied to F32 at load. */
#ifndef NL_MODEL_H
#define NL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/gguf.h"

typedef enum { NL_ARCH_LLAMA = 0, NL_ARCH_QWEN3 = 1, NL_ARCH_QWEN35 = 2, NL_ARCH_GEMMA3 = 3, NL_ARCH_COUNT } nl_arch;

const char *nl_arch_name(nl_arch a);  /* "llama", "qwen3", "qwen35", "gemma3" */
int nl_arch_from_name(const char *s); /* -1 when unknown */

/* Projection kinds: what a frozen weight is inside its layer. The short names are the CLI's
 * --targets names (q,k,v,o,gate,up,down,qkv,z,alpha,beta,out,output). */
typedef enum {
    NL_P_Q = 0,
    NL_P_K,
    NL_P_V,
    NL_P_O,
    NL_P_GATE,
    NL_P_UP,
    NL_P_DOWN,
    NL_P_QKV,
    NL_P_Z,
    NL_P_ALPHA,
    NL_P_BETA,
    NL_P_OUT,    /* qwen35 GDN layers */
    NL_P_OUTPUT, /* vocabulary head (may be the tied token embedding) */
    NL_P_EMBED,  /* token embedding, used for row gathers only */
    NL_P_KIND_COUNT
} nl_proj_kind;
const char *nl_proj_kind_name(nl_proj_kind k);

/* Precision classes of the policy (DESIGN §2). */
typedef enum {
    NL_CLASS_ATTN = 0,
    NL_CLASS_MLP,
    NL_CLASS_RECURRENT,
    NL_CLASS_HEAD,
    NL_CLASS_EMBED,
    NL_CLASS_COUNT
} nl_proj_class;
const char *nl_proj_class_name(nl_proj_class c);

typedef struct {
    const char *name; /* GGUF tensor name, e.g. "blk.3.attn_q.weight" */
    int layer;        /* -1 for output / embedding */
    nl_proj_kind kind;
    nl_proj_class cls;
    int64_t n_in, n_out;     /* K = ggml ne0, N = ggml ne1; W is row-major [N][K] */
    const nl_gguf_tensor *w; /* borrowed from the model's gguf */
} nl_proj_desc;

typedef struct {
    int n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_rot, n_ctx_train;
    float rope_base, rope_freq_scale, rms_eps;
    int rope_neox; /* 0: rotate (2i, 2i+1) (llama); 1: (i, i + n_rot/2) */
    /* qwen35 gated delta-net */
    int ssm_d_conv;  /* K, conv kernel */
    int ssm_d_state; /* dk = head_k_dim */
    int ssm_n_group; /* Hk = key heads */
    int ssm_dt_rank; /* Hv = value heads */
    int ssm_d_inner; /* Hv * dv */
    int full_attn_interval;
    /* gemma3 (docs/formats.md §2): sliding-window attention on every layer but each
     * swa_pattern-th (layer il is full when il % swa_pattern == swa_pattern - 1), a key visible
     * to a query at distance < n_swa; those layers rotate with rope_base_swa. n_swa 0: none. */
    int n_swa, swa_pattern;
    float rope_base_swa;
    float attn_scale; /* scores = attn_scale · q·k (1/sqrt(head_dim) but gemma3-27B) */
    float embd_scale; /* embedding rows times this (gemma3: sqrt(n_embd); else 1) */
    int mlp_gelu;     /* MLP activation: 0 SwiGLU (silu), 1 GeGLU (tanh GELU, gemma3) */
    int post_norms;   /* RMSNorm on the mixer's and the MLP's outputs before their
                       * residual adds (gemma3's post_attention_norm, post_ffw_norm) */
} nl_hparams;

typedef struct {
    bool recurrent; /* qwen35 GDN layer */
    bool swa;       /* gemma3 sliding-window layer (window hp.n_swa, rope_base_swa) */
    /* projection ids (index into nl_model.projs), -1 when absent */
    int p[NL_P_KIND_COUNT];
    /* F32 copies (owned): */
    float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* ffn_norm = post_attention_norm in qwen35 */
    float *attn_post_norm, *ffn_post_norm;         /* gemma3: post_attention_norm, post_ffw_norm */
    float *ssm_conv;                               /* [conv_dim][K] */
    float *ssm_dt_bias, *ssm_a;                    /* [Hv] */
    float *ssm_norm;                               /* [dv] */
} nl_layer;

typedef struct nl_model {
    char *path;
    nl_gguf *gguf; /* owned */
    nl_arch arch;
    nl_hparams hp;
    bool tied_head;        /* output uses token_embd.weight */
    float *output_norm;    /* [n_embd] */
    float *rope_freqs;     /* [n_rot/2] or NULL */
    int p_embed, p_output; /* proj ids */
    nl_layer *layers;      /* [n_layer] */
    nl_proj_desc *projs;   /* every frozen projection, including embed and output */
    int n_projs;
    char *warning; /* owned; NULL, or what the loader ignored, for the caller to
                    * print ("2 tensors that nightlora's qwen3 graph does not use,
                    * ignored: blk.0.x.weight, ...") */
} nl_model;

/* Load and validate (every required key and tensor shape; errors name the key or the tensor
 * and both shapes). NULL + nl_last_error() on failure. */
nl_model *nl_model_load(const char *path);
/* Same over an already opened GGUF (takes ownership of g, also on failure). */
nl_model *nl_model_from_gguf(nl_gguf *g);
void nl_model_free(nl_model *m);
/* 0 when the model's file is as it was opened (nl_gguf_changed); else -1 and the error
 * "PATH changed while WHO was using it (truncated or rewritten); THEN". */
int nl_model_check_unchanged(const nl_model *m, const char *path, const char *who, const char *then);

/* The hyper-parameters an architecture fixes rather than its file (attn_scale, embd_scale,
 * mlp_gelu, post_norms, swa_pattern), from the shape already in hp (head_dim, n_embd, n_head,
 * n_layer): what the loader and mkmodel both use. */
void nl_hparams_arch(nl_arch a, nl_hparams *hp);

/* Projection id of (layer, kind) or -1. */
int nl_model_proj(const nl_model *m, int layer, nl_proj_kind kind);

/* Synthetic models (mkmodel). Presets: "tiny", "small", "llama3.2-1b", "qwen3-0.6b",
 * "qwen35-0.8b", "gemma3-270m". type: NL_TYPE_F32/F16/Q8_0/Q4_0/Q4_1 for the projection weights (model/quant's
 * from_float). Deterministic in seed. */
int nl_mkmodel(nl_arch arch, const char *preset, int type, uint64_t seed, const char *out_path);
/* The hyper-parameters a preset gives (what nl_mkmodel writes); -1 + error for an unknown
 * preset or one meant for another architecture. */
int nl_mkmodel_hparams(nl_arch arch, const char *preset, nl_hparams *hp);

#endif

/* model/model + mkmodel: synthetic tiny models of every arch/type load back with the expected
 * hyper-parameters and projections; generation is deterministic in the seed; malformed models
 * (missing key, wrong shape, unknown arch, ...) give the specific error. */
#include <sys/stat.h>

#include "data/tokenizer.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "test.h"
#include "util/util.h"

/* What opening a model for use checks: the model (nl_model_load) and its vocabulary
 * (nl_tokenizer_for_model, which the session and the trainer call next). NULL when either
 * refuses the file. */
static nl_model *with_vocab(nl_model *m) {
    nl_tokenizer *t = NULL;
    if (m && nl_tokenizer_for_model(m, &t)) {
        nl_model_free(m);
        return NULL;
    }
    nl_tokenizer_free(t);
    return m;
}
static nl_model *load_with_vocab(const char *path) { return with_vocab(nl_model_load(path)); }

static int has(const char *s) { return strstr(nl_last_error(), s) != NULL; }

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void check_hparams_equal(const nl_hparams *a, const nl_hparams *b, const char *what) {
    CHECKF(a->n_vocab == b->n_vocab && a->n_embd == b->n_embd && a->n_layer == b->n_layer && a->n_ff == b->n_ff,
           "%s dims", what);
    CHECKF(a->n_head == b->n_head && a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim && a->n_rot == b->n_rot,
           "%s heads", what);
    CHECKF(a->n_ctx_train == b->n_ctx_train && a->rope_base == b->rope_base && a->rms_eps == b->rms_eps, "%s rope/eps",
           what);
    CHECKF(a->rope_freq_scale == b->rope_freq_scale && a->rope_neox == b->rope_neox, "%s rope mode", what);
    CHECKF(a->ssm_d_conv == b->ssm_d_conv && a->ssm_d_state == b->ssm_d_state && a->ssm_n_group == b->ssm_n_group &&
               a->ssm_dt_rank == b->ssm_dt_rank && a->ssm_d_inner == b->ssm_d_inner &&
               a->full_attn_interval == b->full_attn_interval,
           "%s ssm", what);
    CHECKF(a->n_swa == b->n_swa && a->swa_pattern == b->swa_pattern && a->rope_base_swa == b->rope_base_swa &&
               a->attn_scale == b->attn_scale && a->embd_scale == b->embd_scale && a->mlp_gelu == b->mlp_gelu &&
               a->post_norms == b->post_norms,
           "%s gemma3 fields", what);
}

static void test_tiny_models(void) {
    const int types[3] = {NL_TYPE_F32, NL_TYPE_F16, NL_TYPE_Q8_0};
    for (int a = 0; a < NL_ARCH_COUNT; a++)
        for (int ti = 0; ti < 3; ti++) {
            char path[64], what[64];
            snprintf(path, sizeof path, "test_model_%s_%s.gguf", nl_arch_name((nl_arch)a), nl_type_name(types[ti]));
            snprintf(what, sizeof what, "%s/%s", nl_arch_name((nl_arch)a), nl_type_name(types[ti]));
            CHECKF(nl_mkmodel((nl_arch)a, "tiny", types[ti], 7, path) == 0, "%s: %s", what, nl_last_error());
            if (types[ti] == NL_TYPE_F32)
                CHECKF(file_size(path) > 0 && file_size(path) <= 2 * 1024 * 1024, "%s: %ld bytes", what,
                       file_size(path));
            nl_model *m = nl_model_load(path);
            CHECKF(m != NULL, "%s: %s", what, nl_last_error());
            if (!m) continue;
            nl_hparams want;
            CHECK(nl_mkmodel_hparams((nl_arch)a, "tiny", &want) == 0);
            check_hparams_equal(&m->hp, &want, what);
            const nl_hparams *hp = &m->hp;
            CHECK((int)m->arch == a && m->tied_head && m->hp.n_embd == 64 && m->hp.n_vocab == 512);
            CHECK(hp->rope_neox == (a != NL_ARCH_LLAMA));
            CHECK(m->rope_freqs == NULL);
            CHECKF(m->warning == NULL, "%s: %s", what, m->warning);
            int n_recurrent = 0, expect_projs = 2;
            for (int il = 0; il < hp->n_layer; il++) {
                const nl_layer *L = &m->layers[il];
                n_recurrent += L->recurrent;
                expect_projs += L->recurrent ? 8 : 7;
                CHECK(L->attn_norm && L->ffn_norm && L->attn_norm[0] == 1.0f && L->ffn_norm[hp->n_embd - 1] == 1.0f);
                if (a == NL_ARCH_QWEN35) {
                    CHECKF(L->recurrent == (il % 2 == 0), "%s layer %d recurrent", what, il); /* interval 2 */
                } else {
                    CHECK(!L->recurrent);
                }
                if (L->recurrent) {
                    int Hv = hp->ssm_dt_rank, conv_dim = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
                    CHECK(L->ssm_conv && L->ssm_dt_bias && L->ssm_a && L->ssm_norm && !L->q_norm);
                    int ok = 1;
                    for (int h = 0; h < Hv; h++)
                        ok &= L->ssm_a[h] <= -1.0f && L->ssm_a[h] >= -16.0f && fabsf(L->ssm_dt_bias[h]) < 1.0f;
                    CHECK(ok);
                    double s2 = 0;
                    for (int i = 0; i < conv_dim * hp->ssm_d_conv; i++) s2 += (double)L->ssm_conv[i] * L->ssm_conv[i];
                    s2 = sqrt(s2 / (conv_dim * hp->ssm_d_conv));
                    CHECKF(s2 > 0.1 && s2 < 0.3, "conv std %g", s2);
                    CHECK(L->ssm_norm[0] == 1.0f);
                    for (int k = NL_P_QKV; k <= NL_P_OUT; k++) CHECK(L->p[k] >= 0);
                    CHECK(L->p[NL_P_Q] == -1 && L->p[NL_P_O] == -1);
                } else {
                    for (int k = NL_P_Q; k <= NL_P_O; k++) CHECK(L->p[k] >= 0);
                    CHECK(L->p[NL_P_QKV] == -1);
                    CHECK((L->q_norm != NULL) == (a != NL_ARCH_LLAMA));
                }
                for (int k = NL_P_GATE; k <= NL_P_DOWN; k++) CHECK(L->p[k] >= 0);
                /* gemma3: post-norms on every layer, sliding window on all but every 6th */
                CHECK((L->attn_post_norm != NULL) == (a == NL_ARCH_GEMMA3) &&
                      (L->ffn_post_norm != NULL) == (a == NL_ARCH_GEMMA3));
                CHECKF(L->swa == (a == NL_ARCH_GEMMA3 && il != 5), "%s layer %d swa", what, il);
            }
            if (a == NL_ARCH_GEMMA3)
                CHECK(hp->n_swa == 8 && hp->rope_base_swa == 10000.0f && hp->mlp_gelu && hp->post_norms &&
                      hp->embd_scale == 8.0f && hp->attn_scale == 0.25f);
            else
                CHECK(hp->n_swa == 0 && !hp->mlp_gelu && !hp->post_norms && hp->embd_scale == 1.0f &&
                      hp->attn_scale == 1.0f / sqrtf((float)hp->head_dim));
            CHECK(n_recurrent == (a == NL_ARCH_QWEN35 ? 2 : 0));
            CHECKF(m->n_projs == expect_projs, "%s: %d projs, expected %d", what, m->n_projs, expect_projs);
            /* every projection: shape, class and type as written */
            for (int p = 0; p < m->n_projs; p++) {
                const nl_proj_desc *d = &m->projs[p];
                CHECK(d->w && d->w->ne[0] == d->n_in && d->w->ne[1] == d->n_out && d->w->type == types[ti]);
                nl_proj_class want_cls = d->kind <= NL_P_O        ? NL_CLASS_ATTN
                                         : d->kind <= NL_P_DOWN   ? NL_CLASS_MLP
                                         : d->kind <= NL_P_OUT    ? NL_CLASS_RECURRENT
                                         : d->kind == NL_P_OUTPUT ? NL_CLASS_HEAD
                                                                  : NL_CLASS_EMBED;
                CHECK(d->cls == want_cls);
                if (d->layer >= 0) CHECK(nl_model_proj(m, d->layer, d->kind) == p);
            }
            const nl_proj_desc *e = &m->projs[m->p_embed], *o = &m->projs[m->p_output];
            CHECK(e->kind == NL_P_EMBED && e->layer == -1 && e->n_in == 64 && e->n_out == 512 &&
                  strcmp(e->name, "token_embd.weight") == 0);
            CHECK(o->kind == NL_P_OUTPUT && o->cls == NL_CLASS_HEAD && o->w == e->w); /* tied */
            CHECK(nl_model_proj(m, -1, NL_P_OUTPUT) == m->p_output && nl_model_proj(m, 99, NL_P_Q) == -1);
            int l0 = a == NL_ARCH_QWEN35 ? 1 : 0; /* an attention layer */
            const nl_proj_desc *q = &m->projs[m->layers[l0].p[NL_P_Q]];
            CHECK(q->n_in == 64 && q->n_out == (a == NL_ARCH_QWEN35 ? 2 * 64 : 64) && q->layer == l0);
            const nl_proj_desc *k = &m->projs[m->layers[l0].p[NL_P_K]];
            CHECK(k->n_out == (a == NL_ARCH_GEMMA3 ? 16 : 32) &&
                  k->cls == NL_CLASS_ATTN); /* gemma3 tiny: one kv head */
            const nl_proj_desc *dn = &m->projs[m->layers[l0].p[NL_P_DOWN]];
            CHECK(dn->n_in == 160 && dn->n_out == 64 && dn->cls == NL_CLASS_MLP);
            if (a == NL_ARCH_QWEN35) {
                const nl_proj_desc *qkv = &m->projs[m->layers[0].p[NL_P_QKV]];
                CHECK(qkv->n_out == 2 * 2 * 16 + 4 * 16 && qkv->cls == NL_CLASS_RECURRENT &&
                      strcmp(qkv->name, "blk.0.attn_qkv.weight") == 0);
                CHECK(m->projs[m->layers[2].p[NL_P_ALPHA]].n_out == 4 && m->projs[m->layers[2].p[NL_P_OUT]].n_in == 64);
            }
            /* weights look like N(0, 0.02) after dequantization */
            if (types[ti] != NL_TYPE_Q8_0 || 1) {
                const nl_proj_desc *up = &m->projs[m->layers[0].p[NL_P_UP]];
                int64_t n = up->n_in * up->n_out;
                float *buf = malloc((size_t)n * sizeof *buf);
                nl_type_get(up->w->type)->to_float(up->w->data, buf, n);
                double s = 0, s2 = 0;
                for (int64_t i = 0; i < n; i++) s += buf[i], s2 += (double)buf[i] * buf[i];
                double mean = s / n, sd = sqrt(s2 / n - mean * mean);
                CHECKF(fabs(mean) < 0.002 && sd > 0.018 && sd < 0.022, "%s: mean %g sd %g", what, mean, sd);
                free(buf);
            }
            /* vocabulary keys */
            const nl_gguf *g = m->gguf;
            const char *s;
            CHECK(nl_gguf_get_str(g, "tokenizer.ggml.model", &s) == 0 && strcmp(s, "gpt2") == 0);
            CHECK(nl_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0 && strcmp(s, a == NL_ARCH_LLAMA    ? "llama-bpe"
                                                                                 : a == NL_ARCH_QWEN35 ? "qwen35"
                                                                                                       : "qwen2") == 0);
            CHECK(nl_gguf_get_str(g, "tokenizer.chat_template", &s) == 0 &&
                  strstr(s, a == NL_ARCH_LLAMA ? "<|start_header_id|>" : "<|im_start|>") != NULL);
            const nl_gguf_kv *toks = nl_gguf_get(g, "tokenizer.ggml.tokens"),
                             *tt = nl_gguf_get(g, "tokenizer.ggml.token_type");
            const nl_gguf_kv *mg = nl_gguf_get(g, "tokenizer.ggml.merges");
            CHECK(toks && toks->arr_n == 512 && tt && tt->arr_n == 512 && mg && mg->arr_n > 100);
            if (toks && tt && mg && toks->arr_n == 512) {
                CHECK(strcmp(toks->arr_str[' '], "\xc4\xa0") == 0 &&
                      strcmp(toks->arr_str['\n'], "\xc4\x8a") == 0);                                      /* Ġ, Ċ */
                CHECK(strcmp(toks->arr_str['A'], "A") == 0 && strcmp(toks->arr_str[0], "\xc4\x80") == 0); /* U+0100 */
                uint32_t bos, eot;
                CHECK(nl_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) == 0 &&
                      nl_gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &eot) == 0);
                CHECK(strcmp(toks->arr_str[bos], a == NL_ARCH_LLAMA ? "<|begin_of_text|>" : "<|endoftext|>") == 0);
                CHECK(strcmp(toks->arr_str[eot], a == NL_ARCH_LLAMA ? "<|eot_id|>" : "<|im_end|>") == 0);
                int64_t ty;
                CHECK(nl_gguf_arr_i64(tt, bos, &ty) == 0 && ty == 3);
                /* layout: bytes and merges NORMAL, then the CONTROL tokens, then UNUSED */
                int stage = 0, layout_ok = 1, n_control = 0;
                for (uint64_t i = 0; i < tt->arr_n; i++) {
                    nl_gguf_arr_i64(tt, i, &ty);
                    int st = ty == 1 ? 0 : ty == 3 ? 1 : ty == 5 ? 2 : 9;
                    layout_ok &= st >= stage && st != 9 && (i >= 256 || st == 0);
                    stage = st;
                    n_control += ty == 3;
                }
                CHECK(layout_ok && n_control == (a == NL_ARCH_LLAMA ? 5 : 3));
                bool add_bos;
                CHECK(nl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) == 0 &&
                      add_bos == (a == NL_ARCH_LLAMA));
                /* every merge "l r": both halves and their concatenation are tokens */
                int bad = 0;
                for (uint64_t i = 0; i < mg->arr_n; i++) {
                    char buf[128];
                    const char *sp = strchr(mg->arr_str[i] + 1, ' ');
                    if (!sp) {
                        bad++;
                        continue;
                    }
                    size_t ll = (size_t)(sp - mg->arr_str[i]);
                    int fl = 0, fr = 0, fm = 0;
                    snprintf(buf, sizeof buf, "%.*s%s", (int)ll, mg->arr_str[i], sp + 1);
                    for (uint64_t t = 0; t < toks->arr_n; t++) {
                        fl |= strlen(toks->arr_str[t]) == ll && strncmp(toks->arr_str[t], mg->arr_str[i], ll) == 0;
                        fr |= strcmp(toks->arr_str[t], sp + 1) == 0;
                        fm |= strcmp(toks->arr_str[t], buf) == 0;
                    }
                    bad += !(fl && fr && fm);
                }
                CHECKF(bad == 0, "%d bad merges", bad);
            }
            /* the tokenizer built from the synthetic vocabulary */
            nl_tokenizer *tok = NULL;
            CHECKF(nl_tokenizer_for_model(m, &tok) == 0 && tok != NULL, "%s: no tokenizer", what);
            if (tok) {
                CHECK(nl_tokenizer_n_vocab(tok) == 512);
                CHECK(nl_tokenizer_add_bos(tok) == (a == NL_ARCH_LLAMA));
                int32_t eot = nl_token_eot(tok);
                size_t pl;
                const char *piece = nl_token_piece(tok, eot, &pl);
                CHECK(piece && strcmp(piece, a == NL_ARCH_LLAMA ? "<|eot_id|>" : "<|im_end|>") == 0 &&
                      nl_token_is_control(tok, eot));
                const char *text = "The night shift on the farm began, and the model learns.";
                int32_t *ids = NULL;
                int n = 0;
                CHECK(nl_tokenize(tok, text, strlen(text), false, false, &ids, &n) == 0);
                /* merges compress the text well below one token per byte, and decode back exactly */
                CHECKF(n > 0 && n < (int)strlen(text) / 2, "%s: %d tokens for %zu bytes", what, n, strlen(text));
                char back[256] = "";
                size_t bl = 0;
                for (int i = 0; i < n; i++) {
                    const char *pc = nl_token_piece(tok, ids[i], &pl);
                    if (pc && bl + pl < sizeof back) {
                        memcpy(back + bl, pc, pl);
                        bl += pl;
                    }
                }
                back[bl] = 0;
                CHECK(strcmp(back, text) == 0);
                free(ids);
                const char *chat = a == NL_ARCH_LLAMA ? "<|start_header_id|>user<|end_header_id|>" : "<|im_start|>user";
                CHECK(nl_tokenize(tok, chat, strlen(chat), false, true, &ids, &n) == 0);
                CHECK(n >= 2 && nl_token_is_control(tok, ids[0]));
                free(ids);
                const char *tpl = nl_tokenizer_chat_template(tok);
                CHECK(tpl && strstr(tpl, a == NL_ARCH_LLAMA ? "<|start_header_id|>" : "<|im_start|>"));
            }
            nl_tokenizer_free(tok);
            nl_model_free(m);
            if (types[ti] != NL_TYPE_F32) remove(path);
        }
}

static void test_determinism(void) {
    CHECK(nl_mkmodel(NL_ARCH_QWEN35, "tiny", NL_TYPE_Q8_0, 123, "test_model_det_a.gguf") == 0);
    CHECK(nl_mkmodel(NL_ARCH_QWEN35, "tiny", NL_TYPE_Q8_0, 123, "test_model_det_b.gguf") == 0);
    CHECK(nl_mkmodel(NL_ARCH_QWEN35, "tiny", NL_TYPE_Q8_0, 124, "test_model_det_c.gguf") == 0);
    CHECK(nl_t_same_file("test_model_det_a.gguf", "test_model_det_b.gguf"));
    CHECK(file_size("test_model_det_a.gguf") == file_size("test_model_det_c.gguf"));
    CHECK(!nl_t_same_file("test_model_det_a.gguf", "test_model_det_c.gguf"));
    remove("test_model_det_a.gguf");
    remove("test_model_det_b.gguf");
    remove("test_model_det_c.gguf");
}

static void test_presets(void) {
    nl_hparams hp;
    CHECK(nl_mkmodel_hparams(NL_ARCH_LLAMA, "llama3.2-1b", &hp) == 0);
    CHECK(hp.n_embd == 2048 && hp.n_layer == 16 && hp.n_head == 32 && hp.n_head_kv == 8 && hp.head_dim == 64 &&
          hp.n_ff == 8192);
    CHECK(hp.n_vocab == 128256 && hp.rope_base == 500000.0f && hp.rms_eps == 1e-5f && hp.n_ctx_train == 131072 &&
          hp.n_rot == 64);
    CHECK(nl_mkmodel_hparams(NL_ARCH_QWEN3, "qwen3-0.6b", &hp) == 0);
    CHECK(hp.n_embd == 1024 && hp.n_layer == 28 && hp.n_head == 16 && hp.n_head_kv == 8 && hp.head_dim == 128 &&
          hp.n_ff == 3072);
    CHECK(hp.n_vocab == 151936 && hp.rope_base == 1e6f && hp.rms_eps == 1e-6f && hp.n_ctx_train == 40960 &&
          hp.rope_neox == 1);
    CHECK(nl_mkmodel_hparams(NL_ARCH_QWEN35, "qwen35-0.8b", &hp) == 0);
    CHECK(hp.n_embd == 1024 && hp.n_layer == 24 && hp.n_head == 8 && hp.n_head_kv == 2 && hp.head_dim == 256 &&
          hp.n_rot == 64);
    CHECK(hp.n_ff == 3584 && hp.n_vocab == 248320 && hp.rope_base == 1e7f && hp.full_attn_interval == 4 &&
          hp.n_ctx_train == 262144);
    CHECK(hp.ssm_n_group == 16 && hp.ssm_dt_rank == 16 && hp.ssm_d_state == 128 && hp.ssm_d_inner == 2048 &&
          hp.ssm_d_conv == 4);
    CHECK(nl_mkmodel_hparams(NL_ARCH_GEMMA3, "gemma3-270m", &hp) == 0); /* the GGUF's metadata */
    CHECK(hp.n_embd == 640 && hp.n_layer == 18 && hp.n_head == 4 && hp.n_head_kv == 1 && hp.head_dim == 256 &&
          hp.n_ff == 2048);
    CHECK(hp.n_vocab == 262144 && hp.rope_base == 1e6f && hp.rms_eps == 1e-6f && hp.n_ctx_train == 32768 &&
          hp.n_swa == 512);
    CHECK(hp.swa_pattern == 6 && hp.rope_base_swa == 10000.0f && hp.attn_scale == 1.0f / 16 &&
          hp.embd_scale == sqrtf(640.0f));
    CHECK(nl_mkmodel_hparams(NL_ARCH_QWEN35, "small", &hp) == 0);
    CHECK(hp.n_layer == 8 && hp.full_attn_interval == 4 && hp.ssm_n_group == 4 && hp.ssm_dt_rank == 8 &&
          hp.ssm_d_state == 48);
    /* small: 10-30 M parameters */
    for (int a = 0; a < NL_ARCH_COUNT; a++) {
        CHECK(nl_mkmodel_hparams((nl_arch)a, "small", &hp) == 0);
        double E = hp.n_embd, per_attn = E * hp.head_dim * hp.n_head * (a == NL_ARCH_QWEN35 ? 3 : 2) +
                                         2 * E * hp.head_dim * hp.n_head_kv;
        double kd = (double)hp.ssm_n_group * hp.ssm_d_state, vd = hp.ssm_d_inner;
        double per_gdn = E * (2 * kd + vd) + E * vd + 2 * E * hp.ssm_dt_rank + vd * E, ffn = 3 * E * hp.n_ff;
        double total = E * hp.n_vocab;
        for (int il = 0; il < hp.n_layer; il++)
            total += ffn + ((a == NL_ARCH_QWEN35 && (il + 1) % hp.full_attn_interval) ? per_gdn : per_attn);
        CHECKF(total >= 10e6 && total <= 30e6, "%s small: %.1f M params", nl_arch_name((nl_arch)a), total / 1e6);
    }
    CHECK(nl_mkmodel_hparams(NL_ARCH_QWEN3, "llama3.2-1b", &hp) == -1 && has("--arch llama"));
    CHECK(nl_mkmodel_hparams(NL_ARCH_QWEN3, "huge", &hp) == -1 && has("unknown preset 'huge'"));
    CHECK(nl_mkmodel(NL_ARCH_LLAMA, "tiny", NL_TYPE_Q6_K, 1, "test_model_never.gguf") == -1 && has("q6_k"));
    CHECK(file_size("test_model_never.gguf") < 0);
}

/* ---- malformed models, rewritten from a good one */
typedef struct {
    const char *drop_key;
    const char *drop_tensor;
    const char *replace_tensor; /* with the given type / shape (zeros) */
    int r_type;
    int64_t r_ne[2];
    int r_ndims;
    void (*mod)(nl_gguf_writer *w);
    const char *add_vec; /* an extra F32 {64} tensor */
} rewrite_t;

static int rewrite(const char *src, const char *dst, const rewrite_t *r) {
    nl_gguf *g = nl_gguf_open(src);
    if (!g) return -1;
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_copy_kvs(w, g);
    if (r->drop_key) nl_gguf_remove_key(w, r->drop_key);
    if (r->mod) r->mod(w);
    void *zeros = NULL;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        if (r->drop_tensor && strcmp(t->name, r->drop_tensor) == 0) continue;
        if (r->replace_tensor && strcmp(t->name, r->replace_tensor) == 0) {
            int blck;
            size_t bb;
            nl_gguf_type_info(r->r_type, &blck, &bb);
            size_t nb = (size_t)(r->r_ne[0] / blck) * bb * (size_t)(r->r_ndims > 1 ? r->r_ne[1] : 1);
            zeros = calloc(1, nb);
            nl_gguf_add_tensor(w, t->name, r->r_type, r->r_ndims, r->r_ne, zeros, false);
            continue;
        }
        nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, true);
    }
    float extra[64] = {0};
    int64_t ne64 = 64;
    if (r->add_vec) nl_gguf_add_tensor(w, r->add_vec, NL_TYPE_F32, 1, &ne64, extra, false);
    int rc = nl_gguf_write(w, dst);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    free(zeros);
    return rc;
}

static void mod_arch_gptneox(nl_gguf_writer *w) { nl_gguf_set_str(w, "general.architecture", "gpt-neox"); }
static void mod_linear_rope(nl_gguf_writer *w) {
    nl_gguf_set_str(w, "llama.rope.scaling.type", "linear");
    nl_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f);
}
static void mod_yarn_rope(nl_gguf_writer *w) {
    nl_gguf_set_str(w, "llama.rope.scaling.type", "yarn");
    nl_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f);
}
static void mod_interval3(nl_gguf_writer *w) { nl_gguf_set_u32(w, "qwen35.full_attention_interval", 3); }
static void mod_interval3_flags(nl_gguf_writer *w) {
    nl_gguf_set_u32(w, "qwen35.full_attention_interval", 3);
    uint8_t flags[4] = {1, 0, 1, 0};
    nl_gguf_set_arr(w, "qwen35.attention.recurrent_layers", NL_GGUF_BOOL, flags, 4);
}
static void mod_eps_as_string(nl_gguf_writer *w) {
    nl_gguf_set_str(w, "qwen3.attention.layer_norm_rms_epsilon", "tiny");
}
static void mod_ff_array(nl_gguf_writer *w) {
    uint32_t ff[2] = {160, 160};
    nl_gguf_set_arr(w, "qwen3.feed_forward_length", NL_GGUF_UINT32, ff, 2);
    nl_gguf_remove_key(w, "qwen3.attention.key_length");
    nl_gguf_remove_key(w, "qwen3.attention.value_length");
    nl_gguf_remove_key(w, "qwen3.rope.dimension_count");
    nl_gguf_remove_key(w, "qwen3.rope.freq_base");
    nl_gguf_remove_key(w, "qwen3.vocab_size");
}

static void mod_rope_base_inf(nl_gguf_writer *w) { nl_gguf_set_f32(w, "llama.rope.freq_base", INFINITY); }
static void mod_rope_base_nan(nl_gguf_writer *w) { nl_gguf_set_f32(w, "llama.rope.freq_base", NAN); }
static void mod_eps_nan(nl_gguf_writer *w) { nl_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", NAN); }
static void mod_eps_inf(nl_gguf_writer *w) { nl_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", INFINITY); }
static void mod_linear_inf(nl_gguf_writer *w) {
    nl_gguf_set_str(w, "llama.rope.scaling.type", "linear");
    nl_gguf_set_f32(w, "llama.rope.scaling.factor", INFINITY);
}
static void mod_rope_none(nl_gguf_writer *w) { nl_gguf_set_str(w, "llama.rope.scaling.type", "none"); }
static void mod_block_count_1(nl_gguf_writer *w) { nl_gguf_set_u32(w, "llama.block_count", 1); }
static void mod_eos_past(nl_gguf_writer *w) { nl_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 512); }
static void mod_bos_negative(nl_gguf_writer *w) { nl_gguf_set_i32(w, "tokenizer.ggml.bos_token_id", -1); }
static void mod_eot_past(nl_gguf_writer *w) { nl_gguf_set_u32(w, "tokenizer.ggml.eot_token_id", 100000); }
static void mod_head_count_short(nl_gguf_writer *w) {
    uint32_t hc[1] = {4}; /* block_count is 2 */
    nl_gguf_set_arr(w, "llama.attention.head_count", NL_GGUF_UINT32, hc, 1);
}

/* GGUF values that were accepted silently, each an error naming the key or the tensor now
 * (unused tensors: a warning listing them): an Inf/NaN rope base, rms epsilon or linear rope
 * factor; a rope scaling nightlora does not implement (yarn; was ignored); block_count below
 * the layers the file holds (layers were dropped); an eos/bos/eot id out of range or negative
 * (fell back to token 11); a token text that is not UTF-8. */
static void test_values(void) {
    const char *L = "test_model_llama_f32.gguf", *B = "test_model_bad.gguf";
    static const struct {
        void (*mod)(nl_gguf_writer *);
        const char *n1, *n2;
    } bad[] = {
        {mod_rope_base_inf, "key 'llama.rope.freq_base' = inf: expected a finite number > 0", NULL},
        {mod_rope_base_nan, "key 'llama.rope.freq_base' = nan: expected a finite number > 0", NULL},
        {mod_eps_nan, "key 'llama.attention.layer_norm_rms_epsilon' = nan: expected a finite number > 0", NULL},
        {mod_eps_inf, "key 'llama.attention.layer_norm_rms_epsilon' = inf", NULL},
        {mod_linear_inf, "key 'llama.rope.scaling.factor' = inf: expected a finite number > 0", NULL},
        {mod_yarn_rope, "key 'llama.rope.scaling.type' = 'yarn': this RoPE scaling is not implemented", NULL},
        {mod_block_count_1, "tensor 'blk.1.", "is of layer 1, but block_count is 1"},
        {mod_eos_past, "key 'tokenizer.ggml.eos_token_id' = 512: expected a token id in [0, 512)", NULL},
        {mod_bos_negative, "key 'tokenizer.ggml.bos_token_id' = -1: expected a token id in [0, 512)", NULL},
        {mod_eot_past, "key 'tokenizer.ggml.eot_token_id' = 100000", NULL},
        {mod_head_count_short,
         "key 'llama.attention.head_count' holds 1 values, but block_count is 2: expected one per layer", ": offset "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rewrite_t r = {.mod = bad[i].mod};
        CHECK(rewrite(L, B, &r) == 0);
        nl_model *m = load_with_vocab(B);
        CHECKF(m == NULL && has(B) && has(bad[i].n1) && (!bad[i].n2 || has(bad[i].n2)), "case %zu: %s", i,
               m ? "loaded" : nl_last_error());
        nl_model_free(m);
    }
    /* "none" is no scaling */
    rewrite_t rn = {.mod = mod_rope_none};
    CHECK(rewrite(L, B, &rn) == 0);
    nl_model *m = load_with_vocab(B);
    CHECKF(m && m->hp.rope_freq_scale == 1.0f && !m->warning, "%s", nl_last_error());
    nl_model_free(m);
    /* a tensor of a layer past block_count: an error; an unused tensor: a warning naming it */
    rewrite_t rx = {.add_vec = "blk.2.attn_norm.weight"};
    CHECK(rewrite(L, B, &rx) == 0);
    CHECKF(load_with_vocab(B) == NULL && has("tensor 'blk.2.attn_norm.weight' is of layer 2, but block_count is 2"),
           "%s", nl_last_error());
    rewrite_t ru = {.add_vec = "blk.0.attn_sinks.weight"};
    CHECK(rewrite(L, B, &ru) == 0);
    m = load_with_vocab(B);
    CHECKF(
        m && m->warning &&
            strstr(m->warning, "1 tensor that nightlora's llama graph does not use, ignored: blk.0.attn_sinks.weight"),
        "%s", m ? (m->warning ? m->warning : "no warning") : nl_last_error());
    nl_model_free(m);
    /* and the CLI prints it */
    char cmd[512];
    snprintf(
        cmd, sizeof cmd,
        "%s generate --model %s --prompt hi --n 1 --backend ref 2>&1 >/dev/null | grep -q 'warning: %s: 1 tensor that'",
        NL_CLI, B, B);
    CHECK(system(cmd) == 0);
    /* a token text that is not UTF-8 */
    {
        nl_gguf *g = nl_gguf_open(L);
        nl_gguf_writer *w = nl_gguf_writer_new();
        nl_gguf_copy_kvs(w, g);
        const nl_gguf_kv *tk = nl_gguf_get(g, "tokenizer.ggml.tokens");
        CHECK(tk && tk->arr_n > 300);
        const char **toks = malloc(sizeof(char *) * tk->arr_n);
        for (uint64_t i = 0; i < tk->arr_n; i++) toks[i] = tk->arr_str[i];
        toks[300] = "ab\xff";
        nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, tk->arr_n);
        for (int64_t i = 0; i < g->n_tensors; i++)
            nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                               g->tensors[i].data, true);
        CHECK(nl_gguf_write(w, B) == 0);
        nl_gguf_writer_free(w);
        nl_gguf_close(g);
        free(toks);
        CHECKF(load_with_vocab(B) == NULL && has("tokenizer.ggml.tokens[300] is not valid UTF-8 (byte 0xFF at 2)"),
               "%s", nl_last_error());
    }
    /* a NUL inside a token's text, a token type of 99: refused naming the file offset, which
     * holds that byte / value */
    for (int k = 0; k < 2; k++) {
        nl_gguf *g = nl_gguf_open(L);
        nl_gguf_writer *w = nl_gguf_writer_new();
        nl_gguf_copy_kvs(w, g);
        const nl_gguf_kv *tk = nl_gguf_get(g, "tokenizer.ggml.tokens"),
                         *tt = nl_gguf_get(g, "tokenizer.ggml.token_type");
        CHECK(tk && tk->arr_n > 300 && tt && tt->arr_n == tk->arr_n);
        const char **toks = malloc(sizeof(char *) * tk->arr_n);
        for (uint64_t i = 0; i < tk->arr_n; i++) toks[i] = tk->arr_str[i];
        toks[300] = "nulQZmark";
        int32_t *types = malloc(sizeof(int32_t) * tt->arr_n);
        memcpy(types, tt->arr_data, sizeof(int32_t) * tt->arr_n);
        if (k == 1) types[77] = 99;
        nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, tk->arr_n);
        nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, types, tt->arr_n);
        for (int64_t i = 0; i < g->n_tensors; i++)
            nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                               g->tensors[i].data, true);
        CHECK(nl_gguf_write(w, B) == 0);
        nl_gguf_writer_free(w);
        nl_gguf_close(g);
        free(toks);
        free(types);
        size_t n = 0;
        unsigned char *b = (unsigned char *)nl_read_file(B, &n);
        unsigned char *q = b ? memmem(b, n, "nulQZmark", 9) : NULL;
        CHECK(q != NULL);
        if (k == 0 && q) q[3] = 0; /* "nul\0Zmark": the length prefix still says 9 */
        FILE *f = fopen(B, "wb");
        CHECK(f && fwrite(b, 1, n, f) == n);
        if (f) fclose(f);
        CHECKF(load_with_vocab(B) == NULL && has(B) &&
                   has(k ? "tokenizer.ggml.token_type[77] = 99: expected a token type in 0..6"
                         : "tokenizer.ggml.tokens[300] holds a NUL byte (at 3 of its 9)"),
               "%s: %s", k ? "type 99" : "NUL", nl_last_error());
        const char *o = strstr(nl_last_error(), ": offset ");
        unsigned long long off = o ? strtoull(o + 9, NULL, 10) : 0;
        CHECKF(o && off < n && (k ? b[off] == 99 && b[off + 1] == 0 : b[off] == 0 && off == (size_t)(q - b) + 3),
               "offset %llu", off);
        free(b);
    }
    remove(B);
}

static void test_errors(void) {
    const char *L = "test_model_llama_f32.gguf", *Q3 = "test_model_qwen3_f32.gguf", *Q35 = "test_model_qwen35_f32.gguf";
    const char *B = "test_model_bad.gguf";
    nl_model *m;

    rewrite_t r1 = {.drop_key = "llama.attention.layer_norm_rms_epsilon"};
    CHECK(rewrite(L, B, &r1) == 0);
    CHECK(nl_model_load(B) == NULL && has(B) && has("missing required key 'llama.attention.layer_norm_rms_epsilon'"));
    rewrite_t r1b = {.drop_key = "qwen35.ssm.state_size"};
    CHECK(rewrite(Q35, B, &r1b) == 0);
    CHECK(nl_model_load(B) == NULL && has("missing required key 'qwen35.ssm.state_size'"));
    rewrite_t r1c = {.drop_key = "general.architecture"};
    CHECK(rewrite(Q3, B, &r1c) == 0);
    CHECK(nl_model_load(B) == NULL && has("missing required key 'general.architecture'"));
    rewrite_t r1d = {.mod = mod_eps_as_string};
    CHECK(rewrite(Q3, B, &r1d) == 0);
    CHECK(nl_model_load(B) == NULL && has("qwen3.attention.layer_norm_rms_epsilon") && has("string") && has("float32"));

    rewrite_t r2 = {.replace_tensor = "blk.1.attn_k.weight", .r_type = NL_TYPE_F32, .r_ne = {64, 48}, .r_ndims = 2};
    CHECK(rewrite(L, B, &r2) == 0);
    CHECKF(nl_model_load(B) == NULL && has(B) &&
               has("tensor 'blk.1.attn_k.weight' has shape {64, 48}, expected {64, 32}"),
           "%s", nl_last_error());
    rewrite_t r2b = {.replace_tensor = "blk.0.ssm_norm.weight", .r_type = NL_TYPE_F32, .r_ne = {16, 2}, .r_ndims = 2};
    CHECK(rewrite(Q35, B, &r2b) == 0);
    CHECKF(nl_model_load(B) == NULL && has("tensor 'blk.0.ssm_norm.weight' has shape {16, 2}, expected {16}"), "%s",
           nl_last_error());
    rewrite_t r2c = {.replace_tensor = "output_norm.weight", .r_type = 7 /* q5_1 */, .r_ne = {64}, .r_ndims = 1};
    CHECK(rewrite(Q3, B, &r2c) == 0);
    CHECKF(nl_model_load(B) == NULL && has("output_norm.weight") && has("q5_1"), "%s", nl_last_error());

    rewrite_t r3 = {.drop_tensor = "blk.0.ffn_up.weight"};
    CHECK(rewrite(Q3, B, &r3) == 0);
    CHECKF(nl_model_load(B) == NULL && has("missing tensor 'blk.0.ffn_up.weight' (expected shape {64, 160})"), "%s",
           nl_last_error());

    rewrite_t r4 = {.mod = mod_arch_gptneox};
    CHECK(rewrite(L, B, &r4) == 0);
    CHECKF(nl_model_load(B) == NULL && has("unsupported architecture 'gpt-neox'") && has("llama, qwen3, qwen35"), "%s",
           nl_last_error());

    /* a bias tensor nightlora's graph would ignore is refused */
    rewrite_t r5 = {.add_vec = "blk.1.attn_output.bias"};
    CHECK(rewrite(L, B, &r5) == 0);
    CHECKF(nl_model_load(B) == NULL && has("'blk.1.attn_output.bias' is not supported"), "%s", nl_last_error());

    /* explicit output head: not tied */
    {
        nl_gguf *g = nl_gguf_open(L);
        nl_gguf_writer *w = nl_gguf_writer_new();
        nl_gguf_copy_kvs(w, g);
        for (int64_t i = 0; i < g->n_tensors; i++)
            nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                               g->tensors[i].data, true);
        const nl_gguf_tensor *te = nl_gguf_tensor_find(g, "token_embd.weight");
        nl_gguf_add_tensor(w, "output.weight", te->type, 2, te->ne, te->data, true);
        float ff[8] = {1, 1, 2, 4, 8, 16, 32, 32};
        int64_t ne8 = 8;
        nl_gguf_add_tensor(w, "rope_freqs.weight", NL_TYPE_F32, 1, &ne8, ff, false);
        uint16_t h[64];
        for (int i = 0; i < 64; i++) h[i] = nl_f32_to_f16(0.5f + (float)i / 64);
        int64_t ne64 = 64;
        nl_gguf_add_tensor(w, "blk.0.attn_norm.weight", NL_TYPE_F16, 1, &ne64, h, false); /* duplicate: refused */
        CHECK(has("duplicate"));
        CHECK(nl_gguf_write(w, B) == 0);
        nl_gguf_writer_free(w);
        nl_gguf_close(g);
        m = nl_model_load(B);
        CHECKF(m != NULL, "%s", nl_last_error());
        if (m) {
            CHECK(!m->tied_head && strcmp(m->projs[m->p_output].name, "output.weight") == 0 &&
                  m->projs[m->p_output].w != m->projs[m->p_embed].w);
            CHECK(m->rope_freqs && m->rope_freqs[0] == 1 && m->rope_freqs[7] == 32);
            CHECK(m->n_projs == 2 + 7 * 2);
            nl_model_free(m);
        }
    }
    /* F16 norm vector converted to F32 */
    rewrite_t r6 = {.replace_tensor = "blk.1.attn_norm.weight", .r_type = NL_TYPE_F16, .r_ne = {64}, .r_ndims = 1};
    CHECK(rewrite(L, B, &r6) == 0);
    m = nl_model_load(B);
    CHECKF(m && m->layers[1].attn_norm[5] == 0.0f && m->layers[0].attn_norm[5] == 1.0f, "%s", nl_last_error());
    nl_model_free(m);
    /* rope scaling */
    rewrite_t r7 = {.mod = mod_linear_rope};
    CHECK(rewrite(L, B, &r7) == 0);
    m = nl_model_load(B);
    CHECK(m && m->hp.rope_freq_scale == 0.25f);
    nl_model_free(m);
    /* qwen35 layer kinds: interval 3 contradicts the tensors; explicit flags override it */
    rewrite_t r8 = {.mod = mod_interval3};
    CHECK(rewrite(Q35, B, &r8) == 0);
    CHECKF(nl_model_load(B) == NULL && has("missing tensor 'blk.1.attn_qkv.weight'"), "%s", nl_last_error());
    rewrite_t r8b = {.mod = mod_interval3_flags};
    CHECK(rewrite(Q35, B, &r8b) == 0);
    m = nl_model_load(B);
    CHECKF(m && m->layers[0].recurrent && !m->layers[1].recurrent && m->layers[2].recurrent &&
               !m->layers[3].recurrent && m->hp.full_attn_interval == 3,
           "%s", nl_last_error());
    nl_model_free(m);
    /* per-layer arrays (uniform) and defaults: head_dim = n_embd/n_head, n_rot = head_dim,
     * freq_base 10000, vocab from the token list */
    rewrite_t r9 = {.mod = mod_ff_array};
    CHECK(rewrite(Q3, B, &r9) == 0);
    m = nl_model_load(B);
    CHECKF(m && m->hp.n_ff == 160 && m->hp.head_dim == 16 && m->hp.n_rot == 16 && m->hp.rope_base == 10000.0f &&
               m->hp.n_vocab == 512,
           "%s", nl_last_error());
    nl_model_free(m);
    CHECK(nl_model_load("/nonexistent/m.gguf") == NULL && has("/nonexistent/m.gguf"));
    remove(B);
}

static void test_cli(void) {
    int rc =
        system(NL_CLI " mkmodel --arch qwen3 --preset tiny --out test_model_cli.gguf --type f16 --seed 9 > /dev/null");
    CHECK(rc == 0);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_F16, 9, "test_model_lib.gguf") == 0);
    CHECK(nl_t_same_file("test_model_cli.gguf", "test_model_lib.gguf"));
    /* Q4_0 / Q4_1 projection weights (model/quant's quantizers, as merge writes them) */
    CHECK(system(NL_CLI
                 " mkmodel --arch qwen3 --preset tiny --out test_model_cli.gguf --type q4_1 --seed 9 > /dev/null") ==
          0);
    CHECK(nl_mkmodel(NL_ARCH_QWEN3, "tiny", NL_TYPE_Q4_1, 9, "test_model_lib.gguf") == 0);
    CHECK(nl_t_same_file("test_model_cli.gguf", "test_model_lib.gguf"));
    CHECK(nl_mkmodel(NL_ARCH_LLAMA, "tiny", NL_TYPE_Q4_0, 9, "test_model_lib.gguf") == 0);
    CHECK(system(NL_CLI " mkmodel --arch gpt2 --preset tiny --out test_model_cli.gguf 2> /dev/null") != 0);
    CHECK(system(NL_CLI " mkmodel --arch llama --preset tiny --out test_model_cli.gguf --type q6_k 2> /dev/null") != 0);
    CHECK(system(NL_CLI " mkmodel --arch llama --preset qwen3-0.6b --out test_model_cli.gguf 2> /dev/null") != 0);
    CHECK(system(NL_CLI " mkmodel --arch llama --out test_model_cli.gguf 2> /dev/null") != 0);
    remove("test_model_cli.gguf");
    remove("test_model_lib.gguf");
}

/* Random single-byte corruption of the metadata and tensor infos must never crash the loader
 * (ASan build checks every access); a model that still loads must be self-consistent. */
static void test_fuzz(void) {
    CHECK(nl_mkmodel(NL_ARCH_QWEN35, "tiny", NL_TYPE_Q8_0, 5, "test_model_fuzz.gguf") == 0);
    size_t len;
    uint8_t *good = (uint8_t *)nl_read_file("test_model_fuzz.gguf", &len);
    nl_gguf *g0 = nl_gguf_open_buffer(good, len, "fuzz");
    CHECK(g0 != NULL);
    if (!g0) {
        free(good);
        return;
    }
    /* the KVs before the token list, and the tensor-info block */
    size_t kv_end = 0, ti_start = 0, ti_end = (size_t)g0->data_offset;
    for (size_t i = 0; i + 21 < len && !kv_end; i++)
        if (memcmp(good + i, "tokenizer.ggml.tokens", 21) == 0) kv_end = i;
    for (size_t i = len > 0 ? ti_end : 0; i-- > 0 && !ti_start;)
        if (i + 17 < len && memcmp(good + i, "token_embd.weight", 17) == 0) ti_start = i - 8;
    nl_gguf_close(g0);
    CHECK(kv_end > 0 && ti_start > kv_end);
    int loaded = 0;
    uint8_t *c = malloc(len);
    for (int it = 0; it < 600; it++) {
        memcpy(c, good, len);
        double u = nl_t_rand() * 0.5 + 0.5;
        size_t pos = it % 2 ? (size_t)(u * (double)kv_end) : ti_start + (size_t)(u * (double)(ti_end - ti_start));
        if (pos >= len) pos = len - 1;
        c[pos] = (uint8_t)((nl_t_rand() * 0.5 + 0.5) * 256);
        nl_gguf *g = nl_gguf_open_buffer(c, len, "fuzz");
        nl_model *m = g ? with_vocab(nl_model_from_gguf(g)) : NULL;
        if (m) {
            loaded++;
            int ok = 1;
            for (int p = 0; p < m->n_projs; p++)
                ok &= m->projs[p].w->ne[0] == m->projs[p].n_in && m->projs[p].w->ne[1] == m->projs[p].n_out;
            CHECK(ok);
            nl_model_free(m);
        } else {
            CHECK(has("fuzz"));
        }
    }
    printf("model fuzz: %d of 600 corrupted files still loaded\n", loaded);
    free(c);
    free(good);
    remove("test_model_fuzz.gguf");
}

int main(void) {
    test_cli();
    test_fuzz();
    test_tiny_models();
    test_determinism();
    test_presets();
    test_errors();
    test_values();
    remove("test_model_llama_f32.gguf");
    remove("test_model_qwen3_f32.gguf");
    remove("test_model_qwen35_f32.gguf");
    return nl_t_done();
}

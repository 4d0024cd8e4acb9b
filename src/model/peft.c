/* PEFT adapter directories; see peft.h. */
#include "model/peft.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/safetensors.h"
#include "os/io.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/util.h"

/* transformers' module of each projection kind inside layer N (NULL: none) */
static const char *const hf_names[NL_P_KIND_COUNT] = {
    [NL_P_Q] = "self_attn.q_proj",
    [NL_P_K] = "self_attn.k_proj",
    [NL_P_V] = "self_attn.v_proj",
    [NL_P_O] = "self_attn.o_proj",
    [NL_P_GATE] = "mlp.gate_proj",
    [NL_P_UP] = "mlp.up_proj",
    [NL_P_DOWN] = "mlp.down_proj",
    /* qwen35 gated delta-net: named, to be refused by name */
    [NL_P_QKV] = "linear_attn.in_proj_qkv",
    [NL_P_Z] = "linear_attn.in_proj_z",
    [NL_P_ALPHA] = "linear_attn.in_proj_a",
    [NL_P_BETA] = "linear_attn.in_proj_b",
    [NL_P_OUT] = "linear_attn.out_proj",
};

static int is_gdn(nl_proj_kind k) { return k >= NL_P_QKV && k <= NL_P_OUT; }

/* The module name without refusing: 0, or -1 when the projection has no transformers name. */
static int module_name(const nl_model *m, int p, char *buf, size_t cap) {
    const nl_proj_desc *d = &m->projs[p];
    if (d->kind == NL_P_OUTPUT) return snprintf(buf, cap, "lm_head") < (int)cap ? 0 : -1;
    if (d->layer < 0 || !hf_names[d->kind]) return -1;
    return snprintf(buf, cap, "model.layers.%d.%s", d->layer, hf_names[d->kind]) < (int)cap ? 0 : -1;
}

int nl_peft_module(const nl_model *m, int p, char *buf, size_t cap) {
    const nl_proj_desc *d = &m->projs[p];
    if (module_name(m, p, buf, cap) != 0)
        return nl_err("'%s' has no PEFT (transformers) module name in nightlora's mapping", d->name);
    if (is_gdn(d->kind))
        return nl_err(
            "'%s' (%s) is a qwen35 gated delta-net projection: the GGUF orders its value heads otherwise than "
            "transformers (tiled, not grouped) and nightlora does not map that order to PEFT; adapt only "
            "q,k,v,o,gate,up,down,output to move an adapter to or from PEFT",
            d->name, buf);
    return 0;
}

/* Heads whose rows llama's converter permuted for projection p (q: n_head, k: n_head_kv), or 0. */
static int permuted_heads(const nl_model *m, int p) {
    if (m->arch != NL_ARCH_LLAMA) return 0;
    nl_proj_kind k = m->projs[p].kind;
    return k == NL_P_Q ? m->hp.n_head : k == NL_P_K ? m->hp.n_head_kv : 0;
}

/* B [n_out][r] between the GGUF's row order and transformers' (see peft.h): per head of hd
 * rows, GGUF row 2i + j <-> HF row j·hd/2 + i. to_hf = 1: src in GGUF order, dst in HF order. */
static void permute_rows(const float *src, float *dst, int64_t n_out, int r, int heads, int to_hf) {
    const int64_t hd = n_out / heads, half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                int64_t g = h * hd + 2 * i + j, f = h * hd + j * half + i;
                const float *s = src + (to_hf ? g : f) * r;
                memcpy(dst + (to_hf ? f : g) * r, s, (size_t)r * sizeof(float));
            }
}

static int check_heads(const nl_model *m, int p, int heads) {
    const nl_proj_desc *d = &m->projs[p];
    if (heads < 1 || d->n_out % heads || (d->n_out / heads) % 2)
        return nl_err("'%s' {%" PRId64 ", %" PRId64 "}: %d heads of an even size do not fill its %" PRId64 " rows",
                      d->name, d->n_in, d->n_out, heads, d->n_out);
    return 0;
}

static int make_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0) return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    if (e == EEXIST) return nl_err("%s: exists and is not a directory (a PEFT adapter is a directory)", dir);
    return nl_err("%s: cannot create the directory: %s", dir, strerror(e));
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = nl_malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static char *suffixed(const char *path, const char *suffix) {
    size_t n = strlen(path) + strlen(suffix) + 1;
    char *p = nl_malloc(n);
    if (p) snprintf(p, n, "%s%s", path, suffix);
    return p;
}

/* The manifest's text: the identity (util/hash.h nl_content_hash64: size and every byte) of
 * each of the pair's files, as 16 hex digits. */
static char *manifest_text(uint64_t h_cfg, uint64_t h_w, size_t *len) {
    char *txt = nl_malloc(256);
    if (!txt) return NULL;
    int n = snprintf(txt, 256,
                     "{\n  \"nightlora_manifest\": 1,\n  \"files\": {\n    \"" NL_PEFT_CONFIG "\": \"%016" PRIx64
                     "\",\n    \"" NL_PEFT_WEIGHTS "\": \"%016" PRIx64 "\"\n  }\n}\n",
                     h_cfg, h_w);
    *len = (size_t)n;
    return txt;
}

/* The pair, whole (peft.h): each file written whole beside its final name (NAME.new, through
 * the atomic write of os/io.h), the manifest naming both hashes; only then the renames,
 * manifest first. Until the first rename DIR is as it was; after it, a reader finds the
 * manifest naming the new pair, so an old file still in place (a crash between renames) is
 * refused, never read with the other's half. */
static int commit_dir(const nl_io *io, const char *dir, const char *wpath, const char *cpath, const nl_st_out *t, int n,
                      const char *const *meta, const char *cfg, size_t clen) {
    char *mpath = join(dir, NL_PEFT_MANIFEST);
    char *w_new = suffixed(wpath, ".new"), *c_new = suffixed(cpath, ".new"),
         *m_new = mpath ? suffixed(mpath, ".new") : NULL;
    char *man = NULL;
    int rc = -1, staged = 0;
    if (!mpath || !w_new || !c_new || !m_new) goto end;
    uint64_t h_w = 0;
    staged = 1;
    if (nl_st_write_io(io, w_new, t, n, meta) < 0) {
        nl_err_prefix("%s: not written (%s is unchanged)", wpath, dir);
        goto end;
    }
    if (nl_file_hash64(w_new, &h_w)) goto end;
    if (nl_io_write_file(io, c_new, cfg, clen) < 0) {
        nl_err_prefix("%s: not written (%s is unchanged)", cpath, dir);
        goto end;
    }
    size_t mlen = 0;
    man = manifest_text(nl_content_hash64(cfg, clen), h_w, &mlen);
    if (!man) goto end;
    if (nl_io_write_file(io, m_new, man, mlen) < 0) {
        nl_err_prefix("%s: not written (%s is unchanged)", mpath, dir);
        goto end;
    }
    const char *from[3] = {m_new, w_new, c_new}, *to[3] = {mpath, wpath, cpath};
    for (int k = 0; k < 3; k++)
        if (io->rename(io->ctx, from[k], to[k]) != 0) {
            int e = errno;
            if (k == 0) nl_err("%s: rename to %s failed: %s (%s is unchanged)", from[k], to[k], strerror(e), dir);
            else {
                nl_err(
                    "%s: rename to %s failed: %s; the export is not whole: %s names the new files, so readers refuse "
                    "the directory until an export completes there: export again",
                    from[k], to[k], strerror(e), mpath);
                staged = 0; /* the remaining staged files are the export's only copy: keep them */
            }
            goto end;
        }
    staged = 0;
    if (io->fsync_dir(io->ctx, dir) != 0) {
        rc = nl_err("%s: fsync of the directory after writing %s failed: %s", dir, NL_PEFT_MANIFEST, strerror(errno));
        goto end;
    }
    rc = 0;
end:
    if (staged) {
        /* nothing renamed: drop what was staged, keep the message */
        if (w_new) io->unlink(io->ctx, w_new);
        if (c_new) io->unlink(io->ctx, c_new);
        if (m_new) io->unlink(io->ctx, m_new);
    }
    free(man);
    free(mpath);
    free(w_new);
    free(c_new);
    free(m_new);
    return rc;
}

/* adapter_config.json text (PEFT's own keys, sorted as PEFT writes them). */
static char *config_text(const nl_adapter *a, const nl_model *m, const char *base_model, float alpha, size_t *len) {
    char *txt = NULL;
    FILE *f = open_memstream(&txt, len);
    if (!f) {
        nl_err("out of memory");
        return NULL;
    }
    int rc = 0;
    char mod[96];
    fputs("{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": ", f);
    if (base_model) rc |= nl_st_json_str(f, base_model);
    else fputs("null", f);
    fprintf(
        f,
        ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
        "  \"init_lora_weights\": true,\n  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n"
        "  \"lora_alpha\": %.9g,\n  \"lora_dropout\": 0.0,\n  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n"
        "  \"r\": %d,\n  \"rank_pattern\": {",
        (double)alpha, a->rank);
    int np = 0;
    for (int i = 0; i < a->n; i++)
        if (a->t[i].rank != a->rank) {
            rc |= module_name(m, a->t[i].proj, mod, sizeof mod);
            fputs(np++ ? ",\n    " : "\n    ", f);
            rc |= nl_st_json_str(f, mod);
            fprintf(f, ": %d", a->t[i].rank);
        }
    fputs(np ? "\n  },\n" : "},\n", f);
    fputs("  \"revision\": null,\n  \"target_modules\": [", f);
    int nt = 0;
    for (int k = 0; k < NL_P_KIND_COUNT; k++) {
        int any = 0;
        for (int i = 0; i < a->n && !any; i++) any = m->projs[a->t[i].proj].kind == (nl_proj_kind)k;
        if (!any) continue;
        const char *leaf = k == NL_P_OUTPUT ? "lm_head" : strrchr(hf_names[k], '.') + 1;
        fputs(nt++ ? ",\n    " : "\n    ", f);
        rc |= nl_st_json_str(f, leaf);
    }
    fputs("\n  ],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": false\n}\n", f);
    if (ferror(f)) rc = -1;
    if (fclose(f) || rc) {
        free(txt);
        nl_err("out of memory");
        return NULL;
    }
    return txt;
}

/* A Hugging Face repository id: "org/name", one slash, no spaces or other URL parts. */
static int repo_id(const char *s, size_t n) {
    int slashes = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        slashes += c == '/';
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.' || c == '/'))
            return 0;
    }
    return slashes == 1 && n > 2 && s[0] != '/' && s[n - 1] != '/';
}

const char *nl_peft_base_model(const nl_model *m, char *buf, size_t cap) {
    const char *v = NULL;
    /* the repository the GGUF was converted from, as convert_hf_to_gguf writes it */
    if (!nl_gguf_get_str(m->gguf, "general.source.huggingface.repository", &v) && v && repo_id(v, strlen(v))) return v;
    static const char *const urls[] = {"general.source.url", "general.base_model.0.repo_url", "general.url"};
    static const char hf[] = "https://huggingface.co/";
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
        v = NULL;
        if (nl_gguf_get_str(m->gguf, urls[i], &v) || !v || strncmp(v, hf, sizeof hf - 1)) continue;
        const char *id = v + sizeof hf - 1;
        size_t n = strlen(id);
        while (n && id[n - 1] == '/') n--;
        if (repo_id(id, n) && n < cap) {
            memcpy(buf, id, n);
            buf[n] = 0;
            return buf;
        }
    }
    /* a general.name that is itself a repository id ("Qwen/Qwen3-0.6B") */
    v = NULL;
    if (!nl_gguf_get_str(m->gguf, "general.name", &v) && v && repo_id(v, strlen(v))) return v;
    return NULL;
}

int nl_peft_save_io(const nl_io *io, const nl_adapter *a, const nl_model *m, const char *dir, const char *base_model) {
    char mod[96];
    for (int i = 0; i < a->n; i++)
        if (nl_peft_module(m, a->t[i].proj, mod, sizeof mod)) return nl_err_prefix("%s: cannot write as PEFT", dir);
    float alpha = a->alpha;
    if (alpha == 0.0f) {
        /* llama.cpp's alpha 0 means scale 1: PEFT says that with lora_alpha = r */
        for (int i = 0; i < a->n; i++)
            if (a->t[i].rank != a->rank)
                return nl_err(
                    "%s: the adapter's alpha is 0 (scale 1) and its ranks differ (%d and %d): PEFT has no single "
                    "lora_alpha for that",
                    dir, a->t[i].rank, a->rank);
        alpha = (float)a->rank;
    }
    char base_buf[256];
    if (!base_model) base_model = nl_peft_base_model(m, base_buf, sizeof base_buf);
    for (int i = 0; i < a->n; i++) {
        int heads = permuted_heads(m, a->t[i].proj);
        if (heads && check_heads(m, a->t[i].proj, heads)) return nl_err_prefix("%s", dir);
    }
    /* B of q and k permuted into a copy; everything else is written from params as it is */
    float *buf = nl_malloc(a->n_params * sizeof(float) + 1);
    nl_st_out *t = nl_calloc((size_t)a->n * 2 + 1, sizeof *t);
    char **names = nl_calloc((size_t)a->n * 2 + 1, sizeof *names);
    char *wpath = join(dir, NL_PEFT_WEIGHTS), *cpath = join(dir, NL_PEFT_CONFIG);
    char *cfg = NULL;
    int rc = -1;
    if (!buf || !t || !names || !wpath || !cpath) goto done;
    memcpy(buf, a->params, a->n_params * sizeof(float));
    for (int i = 0; i < a->n; i++) {
        const nl_lora_tensor *lt = &a->t[i];
        int heads = permuted_heads(m, lt->proj);
        if (heads) permute_rows(nl_lora_B(a, i), buf + lt->off_b, lt->n_out, lt->rank, heads, 1);
        module_name(m, lt->proj, mod, sizeof mod);
        for (int part = 0; part < 2; part++) {
            size_t n = strlen(mod) + 40;
            char *nm = names[2 * i + part] = nl_malloc(n);
            if (!nm) goto done;
            snprintf(nm, n, "base_model.model.%s.lora_%c.weight", mod, part ? 'B' : 'A');
            nl_st_out *o = &t[2 * i + part];
            o->name = nm;
            o->dtype = NL_ST_F32;
            o->n_dims = 2;
            o->shape[0] = part ? lt->n_out : lt->rank;
            o->shape[1] = part ? lt->rank : lt->n_in;
            o->data = buf + (part ? lt->off_b : lt->off_a);
        }
    }
    size_t clen = 0;
    cfg = config_text(a, m, base_model, alpha, &clen);
    static const char *const meta[] = {"format", "pt", NULL};
    if (!cfg || make_dir(dir)) goto done;
    rc = commit_dir(io ? io : nl_io_posix(), dir, wpath, cpath, t, a->n * 2, meta, cfg, clen);
done:
    for (int i = 0; names && i < a->n * 2; i++) free(names[i]);
    free(names);
    free(t);
    free(buf);
    free(wpath);
    free(cpath);
    free(cfg);
    return rc;
}

int nl_peft_save(const nl_adapter *a, const nl_model *m, const char *dir, const char *base_model) {
    return nl_peft_save_io(NULL, a, m, dir, base_model);
}

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct {
    const char *path, *text;
    size_t len;
} cfg_src;

/* "CONFIG:line:col: WHAT WHY" at the value v. */
static int cfg_err(const cfg_src *c, const nl_json *v, const char *why, const char *what) {
    int line, col;
    nl_json_linecol(c->text, c->len, v->offset, &line, &col);
    return nl_err("%s:%d:%d: %s %s", c->path, line, col, what, why);
}

/* The config's checks: what PEFT would compute and nightlora cannot is refused by name. */
static int check_config(const cfg_src *c, const nl_json *root, int *r_out, float *alpha_out, int *has_rank_pattern) {
    if (!nl_json_is_object(root))
        return nl_err("%s:1:1: the config is a %s, expected an object", c->path, nl_json_type_name(root->type));
    const nl_json *v = nl_json_get(root, "peft_type");
    if (!v) return nl_err("%s: no peft_type: not a PEFT adapter config", c->path);
    if (!nl_json_is_string(v) || strcmp(v->u.str.s, "LORA"))
        return cfg_err(c, v, "nightlora reads LoRA adapters only (peft_type \"LORA\")", "peft_type is not \"LORA\":");
    /* switches that change the math: false or absent */
    static const char *const must_be_false[] = {"use_dora",  "use_rslora", "fan_in_fan_out",
                                                "lora_bias", "use_qalora", NULL};
    static const char *const why_false[] = {"DoRA's magnitude vector is not LoRA's y = Wx + s·BAx",
                                            "rank-stabilised scaling alpha/sqrt(r) is not alpha/r",
                                            "GPT-2-style Conv1D weights are stored transposed",
                                            "a LoRA bias term has no place in nightlora's adapter",
                                            "QALoRA pools the input",
                                            NULL};
    for (int k = 0; must_be_false[k]; k++) {
        v = nl_json_get(root, must_be_false[k]);
        if (v && !nl_json_is_null(v) && v->type != NL_JSON_FALSE) {
            char what[64];
            snprintf(what, sizeof what, "%s is set:", must_be_false[k]);
            return cfg_err(c, v, why_false[k], what);
        }
    }
    v = nl_json_get(root, "bias");
    if (v && !nl_json_is_null(v) && !(nl_json_is_string(v) && !strcmp(v->u.str.s, "none")))
        return cfg_err(c, v, "nightlora adapts weights only (bias \"none\")", "bias is not \"none\":");
    /* lists or objects that must be empty: extra trained modules, per-module alpha, ... */
    static const char *const must_be_empty[] = {"modules_to_save",
                                                "alpha_pattern",
                                                "layer_replication",
                                                "target_parameters",
                                                "trainable_token_indices",
                                                "alora_invocation_tokens",
                                                NULL};
    for (int k = 0; must_be_empty[k]; k++) {
        v = nl_json_get(root, must_be_empty[k]);
        if (v && !nl_json_is_null(v) && nl_json_len(v) != 0) {
            char what[64];
            snprintf(what, sizeof what, "%s is not empty:", must_be_empty[k]);
            return cfg_err(
                c, v, k == 1 ? "nightlora holds one alpha for every module" : "nightlora reads LoRA pairs only", what);
        }
    }
    v = nl_json_get(root, "r");
    int64_t r;
    if (!v || nl_json_int64(v, &r) || r < 1 || r > 4096)
        return v ? cfg_err(c, v, "expected an integer in [1, 4096]", "r:") : nl_err("%s: no r (the rank)", c->path);
    v = nl_json_get(root, "lora_alpha");
    if (!v || !nl_json_is_number(v) || !isfinite(v->u.num.d))
        return v ? cfg_err(c, v, "expected a finite number", "lora_alpha:") : nl_err("%s: no lora_alpha", c->path);
    if (!isfinite((float)v->u.num.d)) {
        char what[64];
        snprintf(what, sizeof what, "lora_alpha %g:", v->u.num.d);
        return cfg_err(c, v, "beyond the float range (|alpha| < 3.4e38): the adapter's scale would be infinite", what);
    }
    if (v->u.num.d == 0.0)
        return cfg_err(c, v,
                       "PEFT scales the adapter by 0/r = 0, where nightlora's (and llama.cpp's) alpha 0 means scale 1: "
                       "refused rather than computed otherwise",
                       "lora_alpha is 0:");
    *r_out = (int)r;
    *alpha_out = (float)v->u.num.d;
    v = nl_json_get(root, "rank_pattern");
    *has_rank_pattern = v && nl_json_len(v) > 0;
    return 0;
}

static void shape_str(const nl_st_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* A manifest, when DIR has one (peft.h): both files must be the ones it names. The bytes
 * checked are the ones read (the config's text, the weights' buffer), not a second read. */
static int check_manifest(const char *dir, const char *cpath, const char *text, size_t len, const char *wpath,
                          const nl_safetensors *st) {
    char *mpath = join(dir, NL_PEFT_MANIFEST);
    if (!mpath) return -1;
    struct stat sb;
    if (lstat(mpath, &sb) != 0 && errno == ENOENT) {
        free(mpath);
        return 0; /* PEFT's own directory */
    }
    size_t mlen;
    char *mt = nl_read_file(mpath, &mlen);
    nl_json *root = NULL;
    int rc = -1;
    if (!mt) goto end;
    nl_json_error je;
    root = nl_json_parse(mt, mlen, &je);
    const nl_json *files = root ? nl_json_get(root, "files") : NULL;
    if (!files || !nl_json_is_object(files)) {
        nl_err(
            "%s: not a manifest of nightlora's (expected {\"nightlora_manifest\": 1, \"files\": {...}}): remove it, or "
            "export again",
            mpath);
        goto end;
    }
    const char *names[2] = {NL_PEFT_CONFIG, NL_PEFT_WEIGHTS}, *paths[2] = {cpath, wpath};
    uint64_t have[2] = {nl_content_hash64(text, len), nl_content_hash64(st->buf, st->len)};
    for (int k = 0; k < 2; k++) {
        const nl_json *v = nl_json_get(files, names[k]);
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, have[k]);
        if (!v || !nl_json_is_string(v) || strcmp(v->u.str.s, hex)) {
            nl_err(
                "%s does not match %s (its hash is %s, the manifest names %s): the two files are not of one export (an "
                "export into %s was interrupted, or a file was changed since); export again (or remove the manifest to "
                "take the files as they are)",
                paths[k], mpath, hex, v && nl_json_is_string(v) ? v->u.str.s : "none", dir);
            goto end;
        }
    }
    rc = 0;
end:
    nl_json_free(root);
    free(mt);
    free(mpath);
    return rc;
}

/* A PEFT directory as an adapter. Long (~125 lines): the config, the manifest, the tensors' names,
 * ranks and shapes are checked against each other and the model in one pass with one cleanup. */
nl_adapter *nl_peft_load(const nl_model *m, const char *dir) {
    nl_adapter *a = NULL;
    nl_safetensors *st = NULL;
    nl_json *root = NULL;
    char *text = NULL;
    int *projs = NULL, *ranks = NULL, *ia = NULL, *ib = NULL;
    unsigned char *used = NULL;
    char *cpath = join(dir, NL_PEFT_CONFIG), *wpath = join(dir, NL_PEFT_WEIGHTS);
    if (!cpath || !wpath) goto fail;
    size_t len;
    text = nl_read_file(cpath, &len);
    if (!text) {
        nl_err_prefix("%s: not a PEFT adapter directory (no readable %s)", dir, NL_PEFT_CONFIG);
        goto fail;
    }
    cfg_src cs = {cpath, text, len};
    nl_json_error je;
    root = nl_json_parse(text, len, &je);
    if (!root) {
        int line, col;
        nl_json_linecol(text, len, je.offset, &line, &col);
        nl_err("%s:%d:%d: %s", cpath, line, col, je.msg);
        goto fail;
    }
    int r_cfg = 0, has_rank_pattern = 0;
    float alpha = 0.0f;
    if (check_config(&cs, root, &r_cfg, &alpha, &has_rank_pattern)) goto fail;
    struct stat sb;
    if (stat(wpath, &sb) != 0) {
        char *bin = join(dir, "adapter_model.bin");
        int pickle = bin && stat(bin, &sb) == 0;
        free(bin);
        if (pickle)
            nl_err("%s: holds adapter_model.bin (a pickle) but no %s: nightlora reads safetensors only (PEFT's "
                   "save_pretrained writes it by default)",
                   dir, NL_PEFT_WEIGHTS);
        else nl_err("%s: cannot read: %s", wpath, strerror(errno));
        goto fail;
    }
    st = nl_st_open(wpath);
    if (!st || check_manifest(dir, cpath, text, len, wpath, st)) goto fail;
    projs = nl_malloc((size_t)m->n_projs * sizeof *projs + 1);
    ranks = nl_malloc((size_t)m->n_projs * sizeof *ranks + 1);
    ia = nl_malloc((size_t)m->n_projs * sizeof *ia + 1);
    ib = nl_malloc((size_t)m->n_projs * sizeof *ib + 1);
    used = nl_calloc((size_t)st->n + 1, 1);
    if (!projs || !ranks || !ia || !ib || !used) goto fail;
    int n = 0;
    char mod[96], na[160], nb[160];
    for (int p = 0; p < m->n_projs; p++) {
        const nl_proj_desc *d = &m->projs[p];
        if (d->kind == NL_P_EMBED || module_name(m, p, mod, sizeof mod)) continue;
        snprintf(na, sizeof na, "base_model.model.%s.lora_A.weight", mod);
        snprintf(nb, sizeof nb, "base_model.model.%s.lora_B.weight", mod);
        const nl_st_tensor *ta = nl_st_find(st, na), *tb = nl_st_find(st, nb);
        if (!ta && !tb) continue;
        if (!ta || !tb) {
            nl_err("%s: '%s' has no matching '%s'", wpath, ta ? na : nb, ta ? nb : na);
            goto fail;
        }
        if (nl_peft_module(m, p, mod, sizeof mod)) {
            nl_err_prefix("%s: tensor '%s'", wpath, na);
            goto fail;
        }
        if (ta->n_dims != 2 || tb->n_dims != 2 || ta->shape[1] != d->n_in || tb->shape[0] != d->n_out ||
            ta->shape[0] != tb->shape[1]) {
            char sa[64], sb2[64];
            shape_str(ta, sa, sizeof sa);
            shape_str(tb, sb2, sizeof sb2);
            nl_err("%s: '%s' %s / '%s' %s do not fit %s (base '%s' {%" PRId64 ", %" PRId64
                   "}): expected lora_A [r, %" PRId64 "] and lora_B [%" PRId64 ", r]",
                   wpath, na, sa, nb, sb2, mod, d->name, d->n_in, d->n_out, d->n_in, d->n_out);
            goto fail;
        }
        if (ta->shape[0] < 1 || ta->shape[0] > 4096) {
            nl_err("%s: '%s' has rank %" PRId64 ", expected 1..4096", wpath, na, ta->shape[0]);
            goto fail;
        }
        if (!has_rank_pattern && ta->shape[0] != r_cfg) {
            nl_err("%s: '%s' has rank %" PRId64 " but %s says r = %d (and has no rank_pattern)", wpath, na,
                   ta->shape[0], cpath, r_cfg);
            goto fail;
        }
        int heads = permuted_heads(m, p);
        if (heads && check_heads(m, p, heads)) {
            nl_err_prefix("%s", wpath);
            goto fail;
        }
        projs[n] = p;
        ranks[n] = (int)ta->shape[0];
        ia[n] = (int)(ta - st->t);
        ib[n] = (int)(tb - st->t);
        used[ia[n]] = used[ib[n]] = 1;
        n++;
    }
    for (int i = 0; i < st->n; i++)
        if (!used[i]) {
            const char *nm = st->t[i].name;
            if (ends_with(nm, ".lora_A.weight") || ends_with(nm, ".lora_B.weight"))
                nl_err("%s: tensor '%s' adapts a module this %s model has no adaptable projection for (nightlora maps "
                       "model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj and lm_head)",
                       wpath, nm, nl_arch_name(m->arch));
            else
                nl_err("%s: tensor '%s' is not a LoRA pair's base_model.model.<module>.lora_A.weight or .lora_B.weight "
                       "(embedding LoRA, DoRA magnitudes and other PEFT tensors are not read)",
                       wpath, nm);
            goto fail;
        }
    if (n == 0) {
        nl_err("%s: the adapter has no lora_A/lora_B tensors", wpath);
        goto fail;
    }
    a = nl_adapter_alloc(m, projs, ranks, n, alpha);
    if (!a) goto fail;
    for (int i = 0; i < n; i++) {
        nl_st_to_f32(&st->t[ia[i]], nl_lora_A(a, i));
        int heads = permuted_heads(m, projs[i]);
        if (!heads) {
            nl_st_to_f32(&st->t[ib[i]], nl_lora_B(a, i));
            continue;
        }
        float *tmp = nl_malloc((size_t)st->t[ib[i]].n_elems * sizeof(float));
        if (!tmp) goto fail;
        nl_st_to_f32(&st->t[ib[i]], tmp);
        permute_rows(tmp, nl_lora_B(a, i), a->t[i].n_out, a->t[i].rank, heads, 0);
        free(tmp);
    }
    if (nl_adapter_check_finite(a, m, wpath)) goto fail;
    goto done;
fail:
    nl_adapter_free(a);
    a = NULL;
done:
    free(projs);
    free(ranks);
    free(ia);
    free(ib);
    free(used);
    nl_st_close(st);
    nl_json_free(root);
    free(text);
    free(cpath);
    free(wpath);
    return a;
}

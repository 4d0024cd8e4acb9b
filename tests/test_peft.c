/* model/peft and `nightlora export`: PEFT adapter directories out and in.
 *   - export -> import is bit-exact on tiny llama, qwen3, qwen35 and gemma3 (attention and MLP)
 *     models, with per-module ranks (rank_pattern) too; on llama the file's q/k lora_B rows are
 *     the GGUF's in transformers' order (per head: GGUF rows 0, 2, 4, ..., then 1, 3, 5, ...), on
 *     qwen3 and gemma3 as they are (transformers' module names are llama's); A is never permuted;
 *   - F16 and BF16 tensors read;
 *   - what PEFT would compute otherwise is refused by name and place (use_rslora, use_dora,
 *     alpha_pattern, lora_alpha 0, another peft_type, bias, modules_to_save, a rank other than
 *     r), and so are broken directories (no config, a pickle only, a bad JSON, an unknown or
 *     unpaired tensor, a wrong shape, a NaN) and qwen35's gated delta-net projections;
 *   - the CLI: export to PEFT and back to GGUF gives the same bytes; eval and train
 *     --init-adapter read the directory exactly as the GGUF; usage errors. */
#include <sys/stat.h>

#include "model/adapter.h"
#include "model/model.h"
#include "model/peft.h"
#include "model/safetensors.h"
#include "os/io.h"
#include "model/gguf.h"
#include "test.h"
#include "util/util.h"

static char dir[256];

static nl_model *tiny(nl_arch arch) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, nl_arch_name(arch));
    if (nl_mkmodel(arch, "tiny", 0 /* F32 */, 5, path)) return NULL;
    return nl_model_load(path);
}

static void fill(nl_adapter *a, double amp) {
    for (size_t k = 0; k < a->n_params; k++) a->params[k] = (float)(amp * nl_t_rand());
}

static int same_adapter(const nl_adapter *a, const nl_adapter *b) {
    if (!a || !b || a->n != b->n || a->alpha != b->alpha || a->n_params != b->n_params) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->t[i].proj != b->t[i].proj || a->t[i].rank != b->t[i].rank || a->t[i].off_a != b->t[i].off_a) return 0;
    return memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0;
}

/* The adapter's entry of the first layer with a projection of kind k, or -1. */
static int find_kind(const nl_adapter *a, const nl_model *m, nl_proj_kind k) {
    for (int i = 0; i < a->n; i++)
        if (m->projs[a->t[i].proj].kind == k) return i;
    return -1;
}

static void sys_ok(const char *fmt, const char *arg1, const char *arg2) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, fmt, arg1, arg2);
    CHECKF(system(cmd) == 0, "%s", cmd);
}

/* The file's B of (the first layer with kind) against the adapter's: llama q/k per head GGUF rows
 * 0, 2, 4, ..., hd-2, 1, 3, ..., hd-1 in that order; otherwise the same rows. A unchanged. */
static void check_file_order(const nl_adapter *a, const nl_model *m, const char *pdir, nl_proj_kind kind,
                             const char *module) {
    char path[512], name[256];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", pdir);
    nl_safetensors *st = nl_st_open(path);
    int i = find_kind(a, m, kind);
    CHECK(st && i >= 0);
    if (!st || i < 0) {
        nl_st_close(st);
        return;
    }
    const nl_lora_tensor *lt = &a->t[i];
    int layer = m->projs[lt->proj].layer;
    snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", layer, module);
    const nl_st_tensor *tb = nl_st_find(st, name);
    snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", layer, module);
    const nl_st_tensor *ta = nl_st_find(st, name);
    CHECK(tb && ta && tb->shape[0] == lt->n_out && tb->shape[1] == lt->rank && ta->shape[0] == lt->rank &&
          ta->shape[1] == lt->n_in);
    if (tb && ta) {
        float *b = malloc((size_t)tb->n_elems * sizeof(float)), *av = malloc((size_t)ta->n_elems * sizeof(float));
        nl_st_to_f32(tb, b);
        nl_st_to_f32(ta, av);
        CHECK(memcmp(av, nl_lora_A(a, i), (size_t)ta->n_elems * sizeof(float)) == 0);
        int permuted = m->arch == NL_ARCH_LLAMA && (kind == NL_P_Q || kind == NL_P_K);
        int heads = kind == NL_P_Q ? m->hp.n_head : m->hp.n_head_kv, hd = m->hp.head_dim, ok = 1;
        const float *g = nl_lora_B(a, i);
        for (int64_t row = 0; row < lt->n_out; row++) {
            int64_t h = row / hd, rr = row % hd, src = row;
            if (permuted) src = h * hd + (rr < hd / 2 ? 2 * rr : 2 * (rr - hd / 2) + 1);
            ok &= memcmp(b + row * lt->rank, g + src * lt->rank, (size_t)lt->rank * sizeof(float)) == 0;
        }
        CHECKF(ok && (!permuted || heads * hd == lt->n_out), "%s %s: rows in the wrong order", nl_arch_name(m->arch),
               module);
        if (permuted) CHECK(memcmp(b, g, (size_t)tb->n_elems * sizeof(float)) != 0);
        free(b);
        free(av);
    }
    nl_st_close(st);
}

static void test_round_trip(nl_arch arch) {
    nl_model *m = tiny(arch);
    CHECKF(m != NULL, "%s", nl_last_error());
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down", 4, 8.0f, 1);
    CHECK(a != NULL);
    fill(a, 0.1);
    char pdir[512];
    snprintf(pdir, sizeof pdir, "%s/%s-peft", dir, nl_arch_name(arch));
    CHECKF(nl_peft_save(a, m, pdir, "org/base") == 0, "%s", nl_last_error());
    nl_adapter *b = nl_adapter_load(m, pdir); /* a directory: read as PEFT */
    CHECKF(same_adapter(a, b), "%s: export -> import is not bit-exact (%s)", nl_arch_name(arch),
           b ? "values" : nl_last_error());
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", pdir);
    CHECK(nl_t_file_has(cfg, "\"r\": 4,") && nl_t_file_has(cfg, "\"lora_alpha\": 8,") &&
          nl_t_file_has(cfg, "\"org/base\"") && nl_t_file_has(cfg, "\"peft_type\": \"LORA\"") &&
          nl_t_file_has(cfg, "\"task_type\": \"CAUSAL_LM\"") && nl_t_file_has(cfg, "\"down_proj\"") &&
          nl_t_file_has(cfg, "\"rank_pattern\": {}"));
    check_file_order(a, m, pdir, NL_P_Q, "self_attn.q_proj");
    check_file_order(a, m, pdir, NL_P_K, "self_attn.k_proj");
    check_file_order(a, m, pdir, NL_P_V, "self_attn.v_proj");
    check_file_order(a, m, pdir, NL_P_DOWN, "mlp.down_proj");
    /* writing again over the directory replaces its files */
    fill(a, 0.2);
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0);
    nl_adapter_free(b);
    b = nl_peft_load(m, pdir);
    CHECK(same_adapter(a, b));
    CHECK(nl_t_file_has(cfg, "\"base_model_name_or_path\": null"));
    nl_adapter_free(b);
    nl_adapter_free(a);
    if (arch == NL_ARCH_QWEN35) {
        /* the gated delta-net projections are refused both ways */
        a = nl_adapter_new(m, "qkv,out", 4, 8.0f, 1);
        CHECK(a && nl_peft_save(a, m, pdir, NULL) != 0 && strstr(nl_last_error(), "gated delta-net"));
        nl_adapter_free(a);
    }
    nl_model_free(m);
}

/* ranks per module (rank_pattern), alpha 0 */
static void test_ranks(nl_model *m) {
    int projs[3] = {nl_model_proj(m, 0, NL_P_Q), nl_model_proj(m, 0, NL_P_V), nl_model_proj(m, 1, NL_P_K)},
        ranks[3] = {4, 2, 4};
    nl_adapter *a = nl_adapter_alloc(m, projs, ranks, 3, 6.0f);
    fill(a, 0.1);
    char pdir[512], cfg[600];
    snprintf(pdir, sizeof pdir, "%s/ranks", dir);
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", pdir);
    CHECKF(nl_peft_save(a, m, pdir, NULL) == 0, "%s", nl_last_error());
    CHECK(nl_t_file_has(cfg, "\"model.layers.0.self_attn.v_proj\": 2") && nl_t_file_has(cfg, "\"r\": 4,"));
    nl_adapter *b = nl_adapter_load(m, pdir);
    CHECKF(same_adapter(a, b), "%s", b ? "values" : nl_last_error());
    nl_adapter_free(b);
    a->alpha = 0.0f; /* scale 1 (llama.cpp): PEFT needs one lora_alpha = r, impossible with two ranks */
    CHECK(nl_peft_save(a, m, pdir, NULL) != 0 && strstr(nl_last_error(), "alpha is 0"));
    nl_adapter_free(a);
    ranks[1] = 4;
    a = nl_adapter_alloc(m, projs, ranks, 3, 0.0f);
    fill(a, 0.1);
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0 && nl_t_file_has(cfg, "\"lora_alpha\": 4,"));
    b = nl_adapter_load(m, pdir);
    CHECK(b && b->alpha == 4.0f && nl_adapter_scale(b, 0) == nl_adapter_scale(a, 0));
    nl_adapter_free(b);
    nl_adapter_free(a);
}

/* A copy of the good directory src with its config's text `from` replaced by `to` (NULL: the
 * config as it is), and the weights rewritten from `t` when t is given. */
static void variant(const char *src, const char *dst, const char *from, const char *to, const nl_st_out *t, int n) {
    sys_ok("rm -rf %s && mkdir -p %s", dst, dst);
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/adapter_config.json", src);
    snprintf(q, sizeof q, "%s/adapter_config.json", dst);
    size_t len;
    char *c = nl_t_slurp(p, &len);
    FILE *f = fopen(q, "w");
    if (c && f) {
        char *at = from ? strstr(c, from) : NULL;
        CHECKF(!from || at, "'%s' is not in the config", from);
        if (at) {
            fwrite(c, 1, (size_t)(at - c), f);
            fputs(to, f);
            fputs(at + strlen(from), f);
        } else {
            fwrite(c, 1, len, f);
        }
    }
    if (f) fclose(f);
    free(c);
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", dst);
    if (t) CHECK(nl_st_write(q, t, n, NULL) == 0);
    else {
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", src);
        sys_ok("cp %s %s", p, q);
    }
}

static void refused(const nl_model *m, const char *pdir, const char *const *needles) {
    nl_adapter *a = nl_adapter_load(m, pdir);
    CHECK(a == NULL);
    nl_adapter_free(a);
    const char *e = nl_last_error();
    int all = strstr(e, pdir) != NULL;
    for (; *needles; needles++) all &= strstr(e, *needles) != NULL;
    CHECKF(all, "message: %s", e);
}
#define REFUSED(m, d, ...) refused(m, d, (const char *const[]){__VA_ARGS__, NULL})

static void test_refusals(nl_model *m) {
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down", 4, 8.0f, 2);
    fill(a, 0.1);
    char good[512], bad[512], path[600];
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    CHECK(nl_peft_save(a, m, good, NULL) == 0);
    variant(good, bad, NULL, NULL, NULL, 0);
    nl_adapter *b = nl_adapter_load(m, bad);
    CHECKF(same_adapter(a, b), "the unchanged copy must load: %s", nl_last_error());
    nl_adapter_free(b);
    variant(good, bad, "\"use_rslora\": false", "\"use_rslora\": true", NULL, 0);
    REFUSED(m, bad, "adapter_config.json:", "use_rslora is set", "alpha/sqrt(r)");
    variant(good, bad, "\"use_dora\": false", "\"use_dora\": true", NULL, 0);
    REFUSED(m, bad, "adapter_config.json:", "use_dora is set", "DoRA");
    variant(good, bad, "\"alpha_pattern\": {}", "\"alpha_pattern\": {\"q_proj\": 4}", NULL, 0);
    REFUSED(m, bad, "adapter_config.json:2:", "alpha_pattern is not empty", "one alpha");
    variant(good, bad, "\"lora_alpha\": 8", "\"lora_alpha\": 0", NULL, 0);
    REFUSED(m, bad, "adapter_config.json:", "lora_alpha is 0", "scale 1");
    variant(good, bad, "\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"", NULL, 0);
    REFUSED(m, bad, "peft_type is not \"LORA\"");
    variant(good, bad, "\"bias\": \"none\"", "\"bias\": \"all\"", NULL, 0);
    REFUSED(m, bad, "bias is not \"none\"");
    variant(good, bad, "\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]", NULL, 0);
    REFUSED(m, bad, "modules_to_save is not empty");
    variant(good, bad, "\"fan_in_fan_out\": false", "\"fan_in_fan_out\": true", NULL, 0);
    REFUSED(m, bad, "fan_in_fan_out is set");
    variant(good, bad, "\"r\": 4", "\"r\": 5", NULL, 0);
    REFUSED(m, bad, "adapter_model.safetensors", "has rank 4 but", "says r = 5");
    variant(good, bad, "\"r\": 4", "\"r\": 4,,", NULL, 0);
    REFUSED(m, bad, "adapter_config.json:15:");
    variant(good, bad, "\"peft_type\": \"LORA\",", "", NULL, 0);
    REFUSED(m, bad, "no peft_type");
    /* no config; a pickle only */
    snprintf(path, sizeof path, "%s/adapter_config.json", bad);
    unlink(path);
    REFUSED(m, bad, "not a PEFT adapter directory");
    variant(good, bad, NULL, NULL, NULL, 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", bad);
    sys_ok("mv %s %s.bin", path, path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors.bin", bad);
    char bin[600];
    snprintf(bin, sizeof bin, "%s/adapter_model.bin", bad);
    sys_ok("mv %s %s", path, bin);
    REFUSED(m, bad, "adapter_model.bin (a pickle)");

    /* the tensors: read the good file, then write variants of it */
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", good);
    nl_safetensors *st = nl_st_open(path);
    CHECK(st != NULL);
    if (!st) {
        nl_adapter_free(a);
        return;
    }
    int n = st->n;
    nl_st_out *t = calloc((size_t)n + 1, sizeof *t);
    uint16_t *bf = calloc((size_t)a->n_params, sizeof *bf);
    float nan_row[256];
    for (int i = 0; i < n; i++) {
        t[i] = (nl_st_out){
            .name = st->t[i].name, .dtype = st->t[i].dtype, .n_dims = st->t[i].n_dims, .data = st->t[i].data};
        memcpy(t[i].shape, st->t[i].shape, sizeof t[i].shape);
    }
    /* BF16 and F16 tensors are read, to their values */
    nl_st_out *t16 = calloc((size_t)n, sizeof *t16);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        t16[i] = t[i];
        t16[i].dtype = i % 2 ? NL_ST_BF16 : NL_ST_F16;
        t16[i].data = bf + off;
        float *v = malloc((size_t)st->t[i].n_elems * sizeof(float));
        nl_st_to_f32(&st->t[i], v);
        if (i % 2)
            for (int64_t k = 0; k < st->t[i].n_elems; k++) bf[off + k] = nl_f32_to_bf16(v[k]);
        else nl_type_get(NL_TYPE_F16)->from_float(v, bf + off, st->t[i].n_elems);
        off += (size_t)st->t[i].n_elems;
        free(v);
    }
    variant(good, bad, NULL, NULL, t16, n);
    b = nl_adapter_load(m, bad);
    double err = 0;
    for (size_t k = 0; b && k < b->n_params; k++) err = fmax(err, fabs(b->params[k] - a->params[k]));
    CHECKF(b && err > 0 && err < 1e-3, "F16/BF16 read: %s, max err %g", b ? "" : nl_last_error(), err);
    nl_adapter_free(b);
    free(t16);
    /* an extra tensor of a module nightlora cannot place; an embedding LoRA; an unpaired one */
    t[n] = t[0];
    t[n].name = "base_model.model.model.layers.0.self_attn.rotary.lora_A.weight";
    variant(good, bad, NULL, NULL, t, n + 1);
    REFUSED(m, bad,
            "'base_model.model.model.layers.0.self_attn.rotary.lora_A.weight' adapts a module this llama model has no");
    t[n].name = "base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight";
    variant(good, bad, NULL, NULL, t, n + 1);
    REFUSED(m, bad, "layers.9.self_attn.q_proj.lora_A.weight' adapts a module");
    t[n].name = "base_model.model.model.embed_tokens.lora_embedding_A";
    variant(good, bad, NULL, NULL, t, n + 1);
    REFUSED(m, bad, "embed_tokens.lora_embedding_A' is not a LoRA pair's");
    t[n].name = "base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight";
    variant(good, bad, NULL, NULL, t, n + 1);
    REFUSED(m, bad, "in_proj_qkv.lora_A.weight' adapts a module");
    variant(good, bad, NULL, NULL, t + 1, n - 1); /* q's lora_A gone */
    REFUSED(m, bad, "'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' has no matching");
    /* a wrong shape: lora_A [4, 64] written as [8, 32] */
    nl_st_out keep = t[0];
    t[0].shape[0] = 8;
    t[0].shape[1] = 32;
    variant(good, bad, NULL, NULL, t, n);
    REFUSED(m, bad, "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' [8, 32]", "do not fit",
            "expected lora_A [r, 64]");
    t[0] = keep;
    /* a NaN */
    const nl_st_tensor *q_b = nl_st_find(st, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    int qb = q_b ? (int)(q_b - st->t) : 1;
    nl_st_to_f32(&st->t[qb], nan_row);
    nan_row[5] = NAN;
    t[qb].data = nan_row;
    variant(good, bad, NULL, NULL, t, n);
    REFUSED(m, bad, "non-finite value: parameter blk.0.attn_q.lora_b[", "nan");
    free(t);
    free(bf);
    nl_st_close(st);
    nl_adapter_free(a);
}

/* The pair is whole: an export of B over A's directory, crashed (every I/O call from the k-th on
 * failing: nothing after it reaches the disk) or out of space (the k-th call only) at each of
 * its calls in turn, is read back as A, as B, or refused by the manifest, never as a mix; a
 * failure before the renames leaves A readable and names the real output; a directory whose
 * files are of two exports (B's weights with A's config: the SIGKILL between two renames) is
 * refused. */
static void test_whole(nl_model *m) {
    char pdir[512], cfg[600], keep[600], w[600], cmd[1400];
    snprintf(pdir, sizeof pdir, "%s/whole-peft", dir);
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down", 4, 8.0f, 1), *b = nl_adapter_new(m, "q,v", 2, 3.0f, 1);
    CHECK(a && b);
    if (!a || !b) {
        nl_adapter_free(a);
        nl_adapter_free(b);
        return;
    }
    fill(a, 0.1);
    fill(b, 0.3);
    nl_io_fault f;
    nl_io_fault_init(&f, NULL, -1, 0, 0);
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0 && nl_peft_save_io(&f.io, b, m, pdir, NULL) == 0);
    long calls = f.calls;
    CHECKF(calls > 6, "%ld calls", calls);
    int seen_a = 0, seen_b = 0, seen_refused = 0, seen_enospc_named = 0;
    for (int sticky = 0; sticky < 2; sticky++)
        for (long k = 0; k < calls; k++) {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", pdir);
            sys_ok("%s%s", cmd, "");
            CHECK(nl_peft_save(a, m, pdir, NULL) == 0);
            nl_io_fault_init(&f, NULL, k, sticky ? EIO : ENOSPC, sticky);
            int rc = nl_peft_save_io(&f.io, b, m, pdir, NULL);
            char why[1024];
            snprintf(why, sizeof why, "%s", rc ? nl_last_error() : "");
            if (rc && !sticky && strstr(why, "No space left") && strstr(why, "not written") &&
                strstr(why, "is unchanged"))
                seen_enospc_named++;
            nl_adapter *got = nl_peft_load(m, pdir);
            int is_a = same_adapter(got, a), is_b = same_adapter(got, b);
            CHECKF(got == NULL ? strstr(nl_last_error(), "does not match") != NULL : (is_a || is_b),
                   "fault at call %ld (%s): %s", k, sticky ? "crash" : "ENOSPC",
                   got ? "read as a mix" : nl_last_error());
            /* a failure that says the directory is unchanged leaves A */
            if (rc && strstr(why, "is unchanged")) CHECKF(is_a, "call %ld: '%s' but A is not what is read", k, why);
            if (rc == 0) CHECKF(is_b, "call %ld: the export succeeded but B is not read", k);
            seen_a += is_a;
            seen_b += is_b;
            seen_refused += got == NULL;
            nl_adapter_free(got);
        }
    CHECKF(seen_a && seen_b && seen_refused && seen_enospc_named, "A %d, B %d, refused %d, ENOSPC named %d", seen_a,
           seen_b, seen_refused, seen_enospc_named);
    /* the mixed pair itself: B's weights beside A's config */
    snprintf(keep, sizeof keep, "%s/a_config.json", dir);
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", pdir);
    snprintf(w, sizeof w, "%s/adapter_model.safetensors", pdir);
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0);
    sys_ok("cp '%s' '%s'", cfg, keep);
    CHECK(nl_peft_save(b, m, pdir, NULL) == 0);
    sys_ok("cp '%s' '%s'", keep, cfg);
    nl_adapter *got = nl_peft_load(m, pdir);
    CHECKF(!got && strstr(nl_last_error(), "adapter_config.json does not match") &&
               strstr(nl_last_error(), "export again"),
           "mixed pair: %s", got ? "read" : nl_last_error());
    nl_adapter_free(got);
    /* PEFT's own directory has no manifest: read as it is */
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s/nightlora-manifest.json", pdir);
    CHECK(unlink(cmd) == 0);
    got = nl_peft_load(m, pdir);
    CHECKF(got && got->alpha == a->alpha, "without a manifest: %s", got ? "other values" : nl_last_error());
    nl_adapter_free(got);
    nl_adapter_free(a);
    nl_adapter_free(b);
}

/* Finite values that overflow the forward are refused at load as in a GGUF: a lora_A value of
 * 3e38, lora_alpha 1e300 (beyond float: the scale would be inf). */
static void test_overflow(nl_model *m) {
    char pdir[512], cfg[600], man[600];
    snprintf(pdir, sizeof pdir, "%s/overflow-peft", dir);
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", pdir);
    snprintf(man, sizeof man, "%s/nightlora-manifest.json", pdir);
    nl_adapter *a = nl_adapter_new(m, "q,v", 4, 8.0f, 1);
    CHECK(a != NULL);
    if (!a) return;
    fill(a, 0.1);
    nl_lora_A(a, 1)[3] = 3e38f;
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0);
    nl_adapter *b = nl_peft_load(m, pdir);
    CHECKF(!b && strstr(nl_last_error(), "adapter_model.safetensors: 'blk.0.attn_v' overflows the forward"),
           "lora_A 3e38: %s", b ? "read" : nl_last_error());
    nl_adapter_free(b);
    nl_lora_A(a, 1)[3] = 0.01f;
    CHECK(nl_peft_save(a, m, pdir, NULL) == 0 && unlink(man) == 0);
    sys_ok("sed -i 's/\"lora_alpha\": 8,/\"lora_alpha\": 1e300,/' '%s'%s", cfg, "");
    b = nl_peft_load(m, pdir);
    CHECKF(!b && strstr(nl_last_error(), "adapter_config.json:") &&
               strstr(nl_last_error(), "lora_alpha 1e+300: beyond the float range"),
           "lora_alpha 1e300: %s", b ? "read" : nl_last_error());
    nl_adapter_free(b);
    nl_adapter_free(a);
}

/* ---- the CLI ---- */

static int cli(const char *const *args, const char *errf, const char *outf) {
    const char *v[40];
    int n = 0;
    v[n++] = NL_CLI;
    for (; *args && n < 39; args++) v[n++] = *args;
    v[n] = NULL;
    return nl_t_run(v, errf, outf);
}
#define CLI(errf, outf, ...) cli((const char *const[]){__VA_ARGS__, NULL}, errf, outf)

static void test_cli(void) {
    char model[512], data[512], ad[512], pdir[512], back[512], err[512], out1[512], out2[512], t1[512], t2[512],
        q35[512];
    snprintf(model, sizeof model, "%s/cli.gguf", dir);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(ad, sizeof ad, "%s/a.gguf", dir);
    snprintf(pdir, sizeof pdir, "%s/a-peft", dir);
    snprintf(back, sizeof back, "%s/back.gguf", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(out1, sizeof out1, "%s/out1.txt", dir);
    snprintf(out2, sizeof out2, "%s/out2.txt", dir);
    snprintf(t1, sizeof t1, "%s/t1.gguf", dir);
    snprintf(t2, sizeof t2, "%s/t2.gguf", dir);
    CHECK(CLI(err, NULL, "mkmodel", "--arch", "llama", "--preset", "tiny", "--out", model, "--seed", "3") == 0);
    FILE *f = fopen(data, "w");
    for (int i = 0; f && i < 6; i++)
        fprintf(f, "{\"prompt\": \"Note %d: call mum\\nTag:\", \"completion\": \" family\"}\n", i);
    if (f) fclose(f);
    CHECK(CLI(err, NULL, "train", "--model", model, "--data", data, "--out", ad, "--steps", "3", "--rank", "4", "--lr",
              "1e-2", "--backend", "ref", "--quiet") == 0);
    CHECK(CLI(err, out1, "export", "--model", model, "--adapter", ad, "--format", "peft", "--out", pdir) == 0);
    CHECKF(nl_t_file_has(out1, "PEFT LoRA adapter") && nl_t_file_has(out1, "q/k lora_B rows in transformers' order"),
           "stdout");
    CHECK(CLI(err, NULL, "export", "--model", model, "--adapter", pdir, "--format", "gguf", "--out", back) == 0);
    CHECKF(nl_t_same_file(ad, back), "GGUF -> PEFT -> GGUF changed the bytes");
    /* eval reads the directory as the GGUF */
    CHECK(CLI(err, out1, "eval", "--model", model, "--adapter", ad, "--data", data, "--backend", "ref") == 0);
    CHECK(CLI(err, out2, "eval", "--model", model, "--adapter", pdir, "--data", data, "--backend", "ref") == 0);
    char *e1 = nl_t_slurp(out1, NULL), *e2 = nl_t_slurp(out2, NULL), *p;
    /* the lines name the data file only; compare them whole */
    CHECKF(e1 && e2 && !strcmp(e1, e2) && (p = strstr(e1, "loss ")) != NULL, "eval: %s / %s", e1 ? e1 : "",
           e2 ? e2 : "");
    free(e1);
    free(e2);
    /* train --init-adapter DIR continues exactly as from the GGUF */
    CHECK(CLI(err, NULL, "train", "--model", model, "--data", data, "--out", t1, "--steps", "2", "--init-adapter", ad,
              "--backend", "ref", "--quiet") == 0);
    CHECK(CLI(err, NULL, "train", "--model", model, "--data", data, "--out", t2, "--steps", "2", "--init-adapter", pdir,
              "--backend", "ref", "--quiet") == 0);
    CHECKF(nl_t_same_file(t1, t2), "train --init-adapter DIR differs from --init-adapter A.gguf");
    /* usage errors (exit 2) and refusals (exit 1) */
    CHECK(CLI(err, NULL, "export", "--model", model, "--adapter", ad, "--format", "onnx", "--out", pdir) == 2 &&
          nl_t_file_has(err, "--format onnx: expected peft"));
    CHECK(CLI(err, NULL, "export", "--adapter", ad, "--format", "peft", "--out", pdir) == 2 &&
          nl_t_file_has(err, "--model, --adapter, --format and --out are required"));
    CHECK(CLI(err, NULL, "export", "--model", model, "--adapter", ad, "--format", "gguf", "--out", back, "--base-model",
              "x") == 2);
    CHECK(CLI(err, NULL, "export", "--model", model, "--adapter", ad, "--format", "gguf", "--out", ad) == 2 &&
          nl_t_file_has(err, "the same file"));
    CHECK(CLI(err, NULL, "export", "--model", model, "--adapter", ad, "--format", "peft", "--out", data) == 1 &&
          nl_t_file_has(err, "exists and is not a directory"));
    snprintf(q35, sizeof q35, "%s/q35.gguf", dir);
    CHECK(CLI(err, NULL, "mkmodel", "--arch", "qwen35", "--preset", "tiny", "--out", q35) == 0);
    CHECK(CLI(err, NULL, "train", "--model", q35, "--data", data, "--out", t1, "--steps", "1", "--rank", "2",
              "--backend", "ref", "--quiet") == 0);
    CHECK(CLI(err, NULL, "export", "--model", q35, "--adapter", t1, "--format", "peft", "--out", pdir) == 1 &&
          nl_t_file_has(err, "nightlora export: ") && nl_t_file_has(err, "gated delta-net"));
}

/* base_model_name_or_path from the GGUF: the source repository, a huggingface.co URL, an
 * ORG/NAME general.name; none (null) from a name that is no repository id. */
static int with_str(const char *src, const char *dst, const char *key, const char *value) {
    nl_gguf *g = nl_gguf_open(src);
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = g && w ? nl_gguf_copy_kvs(w, g) : -1;
    if (!rc) rc = nl_gguf_set_str(w, key, value);
    for (int64_t i = 0; rc == 0 && i < g->n_tensors; i++)
        rc = nl_gguf_add_tensor(w, g->tensors[i].name, g->tensors[i].type, (int)g->tensors[i].n_dims, g->tensors[i].ne,
                                g->tensors[i].data, true);
    if (!rc) rc = nl_gguf_write(w, dst);
    if (w) nl_gguf_writer_free(w);
    if (g) nl_gguf_close(g);
    return rc;
}

static void test_base_model(void) {
    char src[512], dst[512], bb[256];
    snprintf(src, sizeof src, "%s/llama.gguf", dir);
    snprintf(dst, sizeof dst, "%s/named.gguf", dir);
    static const struct {
        const char *key, *value, *want;
    } cases[] = {
        {"general.source.huggingface.repository", "HuggingFaceTB/SmolLM2-135M-Instruct",
         "HuggingFaceTB/SmolLM2-135M-Instruct"},
        {"general.source.url", "https://huggingface.co/Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"},
        {"general.base_model.0.repo_url", "https://huggingface.co/google/gemma-3-270m/", "google/gemma-3-270m"},
        {"general.name", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B"},
        {"general.name", "Smollm2 135M 8k Lc100K Mix1 Ep2", NULL},
        {"general.source.url", "https://example.com/a/b", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(with_str(src, dst, cases[i].key, cases[i].value) == 0);
        nl_model *m = nl_model_load(dst);
        CHECKF(m != NULL, "%s", nl_last_error());
        if (!m) continue;
        const char *got = nl_peft_base_model(m, bb, sizeof bb);
        CHECKF(cases[i].want ? got && !strcmp(got, cases[i].want) : got == NULL, "%s = %s: got %s", cases[i].key,
               cases[i].value, got ? got : "(null)");
        nl_model_free(m);
    }
}

int main(void) {
    if (nl_t_tmpdir(dir, sizeof dir, "peft")) return 1;
    test_round_trip(NL_ARCH_LLAMA);
    test_round_trip(NL_ARCH_QWEN3);
    test_round_trip(NL_ARCH_QWEN35);
    test_round_trip(NL_ARCH_GEMMA3);
    nl_model *m = tiny(NL_ARCH_LLAMA);
    CHECK(m != NULL);
    if (m) {
        test_ranks(m);
        test_refusals(m);
        test_whole(m);
        test_overflow(m);
    }
    nl_model_free(m);
    test_cli();
    test_base_model();
    nl_t_tmpdir_done(dir);
    return nl_t_done();
}

/* fuzz/mkcorpus: writes the seed inputs of every harness: small valid and near-valid files
 * made with the library's own writers (GGUF writer, nl_adapter_save, nl_ckpt_commit) and the
 * test data (tests/data). Usage: fuzz_mkcorpus OUTDIR [TESTDATA]; creates OUTDIR/<harness>/.
 * The committed corpus (fuzz/corpus/) is these seeds merged with what fuzzing found. */
#include <errno.h>
#include <sys/stat.h>

#include "common.h"
#include "model/adapter.h"
#include "model/gguf.h"
#include "model/peft.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"

static const char *OUT;
static int n_written;

static void die(const char *what) {
    fprintf(stderr, "mkcorpus: %s: %s\n", what, nl_last_error());
    exit(1);
}

static void put(const char *harness, const char *name, const void *prefix, size_t np, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", OUT, harness);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/seed-%s", OUT, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(prefix, 1, np, f) != np || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "mkcorpus: cannot write %s\n", path);
        exit(1);
    }
    n_written++;
}

static char *slurp(const char *path, size_t *n) {
    char *b = nl_read_file(path, n);
    if (!b) die(path);
    return b;
}

/* Write a GGUF via the writer and return its bytes. */
static char *gguf_bytes(nl_gguf_writer *w, size_t *n) {
    char tmp[512];
    fuzz_tmp_path(tmp, sizeof tmp, "seed.gguf");
    if (nl_gguf_write(w, tmp) != 0) die("gguf write");
    nl_gguf_writer_free(w);
    char *b = slurp(tmp, n);
    remove(tmp);
    return b;
}

static char *vocab_gguf(const char *model, const char *pre, bool llama3, size_t *n) {
    static fuzz_vocab v;
    const nl_tokenizer_spec *sp = fuzz_vocab_build(&v, model, pre, llama3);
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_set_str(w, "general.architecture", "llama");
    nl_gguf_set_str(w, "tokenizer.ggml.model", model);
    if (pre) nl_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", sp->tokens, (uint64_t)sp->n_vocab);
    nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, sp->types, (uint64_t)sp->n_vocab);
    nl_gguf_set_arr(w, "tokenizer.ggml.scores", NL_GGUF_FLOAT32, sp->scores, (uint64_t)sp->n_vocab);
    if (sp->n_merges) nl_gguf_set_arr_str(w, "tokenizer.ggml.merges", sp->merges, (uint64_t)sp->n_merges);
    nl_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)sp->bos);
    nl_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)sp->eos);
    nl_gguf_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)sp->eot);
    if (sp->unk >= 0) nl_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)sp->unk);
    nl_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", llama3);
    nl_gguf_set_str(w, "tokenizer.chat_template", sp->chat_template);
    return gguf_bytes(w, n);
}

/* Mini vocabularies (a few hundred bytes): small inputs for the fuzzer to grow from, so the
 * merged corpus is not all 5 KB copies of the full seed vocabularies. */
static void seeds_mini_vocab(void) {
    static const char *const bpe[] = {"a",
                                      "b",
                                      "c",
                                      "\xC4\xA0",
                                      "ab",
                                      "\xC4\xA0"
                                      "a",
                                      "<|im_end|>",
                                      "<s>"};
    static const int32_t bpe_ty[] = {1, 1, 1, 1, 1, 1, 3, 3};
    static const char *const merges[] = {"a b", "\xC4\xA0 a"};
    static const char *const spm[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "<0x41>"};
    static const int32_t spm_ty[] = {2, 3, 3, 1, 1, 1, 1, 6};
    static const float spm_sc[] = {0, 0, 0, -1, -2, -3, -0.5f, 0};
    for (int k = 0; k < 2; k++) {
        nl_gguf_writer *w = nl_gguf_writer_new();
        nl_gguf_set_str(w, "tokenizer.ggml.model", k ? "llama" : "gpt2");
        if (k) {
            nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", spm, 8);
            nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, spm_ty, 8);
            nl_gguf_set_arr(w, "tokenizer.ggml.scores", NL_GGUF_FLOAT32, spm_sc, 8);
            nl_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
        } else {
            nl_gguf_set_str(w, "tokenizer.ggml.pre", "qwen2");
            nl_gguf_set_arr_str(w, "tokenizer.ggml.tokens", bpe, 8);
            nl_gguf_set_arr(w, "tokenizer.ggml.token_type", NL_GGUF_INT32, bpe_ty, 8);
            nl_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 2);
            nl_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 7);
            nl_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
        }
        size_t n;
        char *b = gguf_bytes(w, &n);
        put("tok_gguf", k ? "mini-spm.gguf" : "mini-gpt2.gguf", "", 0, b, n);
        put("gguf", k ? "mini-spm.gguf" : "mini-gpt2.gguf", "", 0, b, n);
        free(b);
    }
}

static void seeds_gguf(void) {
    /* every value type */
    nl_gguf_writer *w = nl_gguf_writer_new();
    nl_gguf_set_str(w, "general.architecture", "llama");
    nl_gguf_set_u32(w, "u32", 7);
    nl_gguf_set_i32(w, "i32", -7);
    nl_gguf_set_u64(w, "u64", 1ull << 40);
    nl_gguf_set_f32(w, "f32", 0.5f);
    nl_gguf_set_bool(w, "bool", true);
    nl_gguf_set_str(w, "str", "h\xC3\xA9llo");
    static const uint8_t u8[] = {1, 2, 255};
    static const int16_t i16[] = {-1, 300};
    static const double f64[] = {1.5, -0.0};
    static const int64_t i64[] = {-5, 1ll << 50};
    nl_gguf_set_arr(w, "arr.u8", NL_GGUF_UINT8, u8, 3);
    nl_gguf_set_arr(w, "arr.i16", NL_GGUF_INT16, i16, 2);
    nl_gguf_set_arr(w, "arr.f64", NL_GGUF_FLOAT64, f64, 2);
    nl_gguf_set_arr(w, "arr.i64", NL_GGUF_INT64, i64, 2);
    nl_gguf_set_arr(w, "arr.empty", NL_GGUF_UINT32, NULL, 0);
    const char *strs[] = {"a", "", "\xE2\x96\x81x"};
    nl_gguf_set_arr_str(w, "arr.str", strs, 3);
    size_t n;
    char *b = gguf_bytes(w, &n);
    put("gguf", "kv-types.gguf", "", 0, b, n);
    free(b);

    /* a few tensors of different types, with a non-default alignment */
    w = nl_gguf_writer_new();
    nl_gguf_set_str(w, "general.architecture", "llama");
    nl_gguf_set_u32(w, "general.alignment", 64);
    float f[64];
    for (int i = 0; i < 64; i++) f[i] = (float)i * 0.25f - 3.0f;
    uint8_t raw[256];
    for (int i = 0; i < 256; i++) raw[i] = (uint8_t)(i * 37);
    int64_t ne_a[2] = {8, 3}, ne_b[1] = {32}, ne_c[3] = {32, 1, 2}, ne_d[1] = {5};
    nl_gguf_add_tensor(w, "a.f32", NL_TYPE_F32, 2, ne_a, f, false);
    nl_gguf_add_tensor(w, "b.f16", NL_TYPE_F16, 1, ne_b, raw, false);
    nl_gguf_add_tensor(w, "c.q8_0", NL_TYPE_Q8_0, 3, ne_c, raw, false);
    nl_gguf_add_tensor(w, "d.bf16", NL_TYPE_BF16, 1, ne_d, raw, false);
    b = gguf_bytes(w, &n);
    put("gguf", "tensors.gguf", "", 0, b, n);
    free(b);

    b = vocab_gguf("gpt2", "gpt-2", false, &n);
    put("gguf", "vocab-gpt2.gguf", "", 0, b, n);
    put("tok_gguf", "vocab-gpt2.gguf", "", 0, b, n);
    free(b);
    b = vocab_gguf("gpt2", "llama3", true, &n);
    put("tok_gguf", "vocab-llama3.gguf", "", 0, b, n);
    free(b);
    b = vocab_gguf("gpt2", "deepseek-llm", false, &n);
    put("tok_gguf", "vocab-deepseek.gguf", "", 0, b, n);
    free(b);
    b = vocab_gguf("llama", NULL, false, &n);
    put("gguf", "vocab-spm.gguf", "", 0, b, n);
    put("tok_gguf", "vocab-spm.gguf", "", 0, b, n);
    free(b);
    /* near-valid: a v2 header and a truncated file */
    b = vocab_gguf("gpt2", "qwen2", false, &n);
    put("tok_gguf", "vocab-qwen2.gguf", "", 0, b, n);
    b[4] = 2;
    put("gguf", "v2.gguf", "", 0, b, n);
    put("gguf", "truncated.gguf", "", 0, b, n / 3);
    free(b);
}

static void seeds_json(const char *td) {
    static const char *const docs[] = {
        "{\"a\": [1, -2.5e-3, true, false, null], \"b\": {\"c\": \"d\\n\\u00e9\\ud83d\\ude00\"}}",
        "[[[[[[[[[[]]]]]]]]]]",
        "-0",
        "123456789012345678901234567890",
        "9223372036854775807",
        "-9223372036854775809",
        "1e308",
        "4.9e-324",
        "\"\\u0000\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        " \t\r\n{ } ",
        "{\"k\":1,\"k\":2}",
        "[1,]",
        "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"",
        "\"\xED\xA0\x80\"",
        "0.1e+2",
    };
    char name[32];
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        snprintf(name, sizeof name, "doc%02zu.json", i);
        put("json", name, "", 0, docs[i], strlen(docs[i]));
    }
    char path[1024];
    const char *files[] = {"sample.jsonl", "chat.jsonl"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/data/%s", td, files[k]);
        size_t n;
        char *b = slurp(path, &n);
        /* each line is a document */
        char *line = b;
        int li = 0;
        while (line < b + n) {
            char *nl = memchr(line, '\n', (size_t)(b + n - line));
            size_t ll = nl ? (size_t)(nl - line) : (size_t)(b + n - line);
            if (ll) {
                snprintf(name, sizeof name, "%s-%d.json", k ? "chat" : "sample", li);
                put("json", name, "", 0, line, ll);
            }
            li++;
            line += ll + 1;
        }
        free(b);
    }
}

static void seeds_dataset(const char *td) {
    char path[1024];
    const char *files[] = {"sample.jsonl", "chat.jsonl"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/data/%s", td, files[k]);
        size_t n;
        char *b = slurp(path, &n);
        /* GPT-2 ids in the tokens line -> ids the small vocabularies have (same length) */
        char *ids = strstr(b, "464, 2068, 7586");
        if (ids) memcpy(ids, "164, 20,   75  ", 15);
        static const uint8_t sels[] = {0x01, 0x02, 0x03, 0x09, 0x0E, 0x13, 0x05};
        for (size_t s = 0; s < sizeof sels; s++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%02x.jsonl", files[k], sels[s]);
            put("dataset", name, &sels[s], 1, b, n);
        }
        free(b);
    }
    static const char *const extra[] = {
        "{\"tokens\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n{\"tokens\": [4, 5]}\n",
        "{\"tokens\": [1, 2], \"choices\": [[3], [4, 5]], \"answer\": 1}\r\n",
        "\xEF\xBB\xBF{\"text\": \"a b c\"}\n\n",
        "{\"prompt\": \"\", \"completion\": \"x\", \"choices\": [\"x\", \"y\"]}\n",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"  hi  \"}, {\"role\": \"assistant\", \"content\": "
        "\"yo\"}]}\n",
        "{\"text\": \"<|im_start|>not special<|im_end|>\"}\n",
        "{\"completon\": \"typo\"}\n",
        "{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": \"human\", \"value\": \"hi\"},"
        " {\"from\": \"gpt\", \"value\": \"yo\"}]}\n",
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"a\"},"
        " {\"role\": \"user\", \"content\": \"?\"}], \"completion\": [{\"role\": \"assistant\", \"content\": "
        "\"yo\"}]}\n",
        "{\"id\": 7, \"conversations\": [{\"from\": \"human\", \"value\": \"hi\", \"weight\": 0}, {\"from\": \"gpt\", "
        "\"value\": \"yo\"}],"
        " \"source\": \"x\"}\n",
    };
    /* 0x20: strict_keys */
    static const uint8_t sel[] = {0x00, 0x04, 0x01, 0x01, 0x0D, 0x03, 0x02, 0x01, 0x06, 0x21};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "extra%zu.jsonl", i);
        put("dataset", name, &sel[i], 1, extra[i], strlen(extra[i]));
    }
}

static void seeds_tokenize(const char *td) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-gpt-2.gguf.inp", td);
    size_t n;
    char *b = slurp(path, &n);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = b;
    int i = 0;
    while (p < b + n) {
        char *e = strstr(p, sep);
        size_t l = e ? (size_t)(e - p) : (size_t)(b + n - p);
        /* spread the strings over flag / vocabulary choices */
        uint8_t pre[2] = {(uint8_t)(i & 3), (uint8_t)(i % (FUZZ_N_PRE + 2))};
        char name[32];
        snprintf(name, sizeof name, "inp%02d.txt", i);
        put("tokenize", name, pre, 2, p, l);
        i++;
        if (!e) break;
        p = e + strlen(sep);
    }
    free(b);
    static const char *const extra[] = {"<|im_start|>user\nhello<|im_end|>\n", "   three   spaces   ",
                                        "the then 1234567 aaaa", "\xE2\x96\x81the caf\xC3\xA9", "\xC3\x28 invalid"};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++)
        for (int f = 0; f < 4; f++) {
            uint8_t pre[2] = {(uint8_t)f, (uint8_t)(f == 0 ? 0 : f == 1 ? 1 : f == 2 ? 3 : FUZZ_N_PRE + 1)};
            char name[32];
            snprintf(name, sizeof name, "extra%zu-%d.txt", k, f);
            put("tokenize", name, pre, 2, extra[k], strlen(extra[k]));
        }
}

static void seeds_adapter(void) {
    static const nl_arch arch[3] = {NL_ARCH_LLAMA, NL_ARCH_QWEN3, NL_ARCH_QWEN35};
    static const char *const targets[3] = {"q,v", "all", "qkv,gate,out"};
    for (int i = 0; i < 3; i++) {
        char mp[512], ap[512];
        fuzz_tmp_path(mp, sizeof mp, "seed-model.gguf");
        fuzz_tmp_path(ap, sizeof ap, "seed-adapter.gguf");
        if (nl_mkmodel(arch[i], "tiny", NL_TYPE_F32, 7, mp) != 0) die("mkmodel");
        nl_model *m = nl_model_load(mp);
        if (!m) die("model load");
        nl_adapter *a = nl_adapter_new(m, targets[i], i + 1, 4.0f, 3);
        if (!a || nl_adapter_save(a, m, ap) != 0) die("adapter");
        size_t n;
        char *b = slurp(ap, &n);
        char name[64];
        snprintf(name, sizeof name, "%s.gguf", nl_arch_name(arch[i]));
        put("adapter", name, "", 0, b, n);
        free(b);
        /* the same adapter with F16 lora tensors (the loader converts f16/bf16/q8_0) */
        nl_gguf_writer *w = nl_gguf_writer_new();
        nl_gguf_set_str(w, "general.architecture", nl_arch_name(arch[i]));
        nl_gguf_set_str(w, "general.type", "adapter");
        nl_gguf_set_str(w, "adapter.type", "lora");
        nl_gguf_set_f32(w, "adapter.lora.alpha", 2.0f);
        const nl_lora_tensor *t = &a->t[0];
        const nl_proj_desc *d = &m->projs[t->proj];
        char na[128], nb[128];
        snprintf(na, sizeof na, "%s.lora_a", d->name);
        snprintf(nb, sizeof nb, "%s.lora_b", d->name);
        int64_t ne_a[2] = {t->n_in, t->rank}, ne_b[2] = {t->rank, t->n_out};
        uint16_t *h = calloc((size_t)(t->n_in + t->n_out) * (size_t)t->rank, 2);
        for (int64_t k = 0; k < (t->n_in + t->n_out) * t->rank; k++) h[k] = (uint16_t)(0x3C00 + (k % 64)); /* 1.0 .. */
        nl_gguf_add_tensor(w, na, NL_TYPE_F16, 2, ne_a, h, false);
        nl_gguf_add_tensor(w, nb, NL_TYPE_F16, 2, ne_b, h, false);
        free(h);
        b = gguf_bytes(w, &n);
        snprintf(name, sizeof name, "%s-f16.gguf", nl_arch_name(arch[i]));
        put("adapter", name, "", 0, b, n);
        free(b);
        nl_adapter_free(a);
        nl_model_free(m);
        remove(mp);
        remove(ap);
    }
}

static void seeds_safetensors(void) {
    char path[512];
    fuzz_tmp_path(path, sizeof path, "seed.safetensors");
    /* every dtype, a scalar, an empty tensor, metadata */
    float f[6] = {1, -2, 0.5f, 3, -0.25f, 8};
    uint16_t h[4] = {0x3C00, 0xC000, 0x3800, 0x0001}, bf[3] = {0x3F80, 0xC040, 0x0000};
    nl_st_out t[5] = {
        {.name = "w.weight", .dtype = NL_ST_F32, .n_dims = 2, .shape = {2, 3}, .data = f},
        {.name = "h", .dtype = NL_ST_F16, .n_dims = 1, .shape = {4}, .data = h},
        {.name = "b", .dtype = NL_ST_BF16, .n_dims = 3, .shape = {1, 3, 1}, .data = bf},
        {.name = "scalar", .dtype = NL_ST_F32, .n_dims = 0, .data = f},
        {.name = "empty", .dtype = NL_ST_F16, .n_dims = 2, .shape = {0, 7}, .data = h},
    };
    static const char *const meta[] = {"format", "pt", NULL};
    size_t n;
    if (nl_st_write(path, t, 5, meta) != 0) die("safetensors");
    char *b = slurp(path, &n);
    put("safetensors", "dtypes.safetensors", "", 0, b, n);
    free(b);
    /* a PEFT adapter of a tiny llama (q, v: the permuted and the plain rows) */
    char mp[512], dir[400];
    fuzz_tmp_path(mp, sizeof mp, "seed-model.gguf");
    fuzz_tmp_path(dir, sizeof dir, "seed-peft");
    if (nl_mkmodel(NL_ARCH_LLAMA, "tiny", NL_TYPE_F32, 7, mp) != 0) die("mkmodel");
    nl_model *m = nl_model_load(mp);
    nl_adapter *a = m ? nl_adapter_new(m, "q,v", 2, 4.0f, 3) : NULL;
    if (!a || nl_peft_save(a, m, dir, NULL) != 0) die("peft");
    snprintf(path, sizeof path, "%s/" NL_PEFT_WEIGHTS, dir);
    b = slurp(path, &n);
    put("safetensors", "peft.safetensors", "", 0, b, n);
    free(b);
    remove(path);
    snprintf(path, sizeof path, "%s/" NL_PEFT_CONFIG, dir);
    remove(path);
    rmdir(dir);
    nl_adapter_free(a);
    nl_model_free(m);
    remove(mp);
}

static void seeds_checkpoint(void) {
    char dir[512];
    fuzz_tmp_path(dir, sizeof dir, "seed-ckpt");
    static const uint64_t np[] = {0, 3, 17};
    for (int i = 0; i < 3; i++) {
        uint64_t cur[2] = {11, 12}, rng[3] = {1, 2, 3};
        float p[17];
        for (int k = 0; k < 17; k++) p[k] = (float)k - 8.5f;
        nl_ckpt ck = {0};
        ck.config_hash = 1;
        ck.model_hash = 2;
        ck.step = (uint64_t)i + 5;
        ck.epoch = 1;
        ck.index = 3;
        ck.n_cursor = i == 0 ? 0 : 2;
        ck.cursor = cur;
        ck.n_rng = 3;
        ck.rng = rng;
        ck.rank = 4;
        ck.alpha = 8.0f;
        ck.n_params = np[i];
        ck.params = ck.m = ck.v = p;
        if (nl_ckpt_commit(dir, &ck, NULL) != 0) die("checkpoint commit");
        char path[1024];
        snprintf(path, sizeof path, "%s/commit-%llu.nlck", dir, (unsigned long long)ck.step);
        size_t n;
        char *b = slurp(path, &n);
        static const uint8_t modes[] = {0x00, 0x06, 0x07, 0x0F, 0x17, 0x1B, 0x26};
        for (size_t k = 0; k < sizeof modes; k++) {
            char name[32];
            snprintf(name, sizeof name, "np%llu-%02x.nlck", (unsigned long long)np[i], modes[k]);
            put("checkpoint", name, &modes[k], 1, b, n);
        }
        free(b);
    }
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/commit-%d.nlck", dir, i + 5);
        remove(path);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTDIR [TESTDATA]\n", argv[0]);
        return 2;
    }
    OUT = argv[1];
    const char *td = argc > 2 ? argv[2] : "tests/data";
    if (mkdir(OUT, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkcorpus: cannot create %s\n", OUT);
        return 1;
    }
    seeds_gguf();
    seeds_mini_vocab();
    seeds_json(td);
    seeds_dataset(td);
    seeds_tokenize(td);
    seeds_adapter();
    seeds_checkpoint();
    seeds_safetensors();
    printf("mkcorpus: %d seed files under %s\n", n_written, OUT);
    return 0;
}

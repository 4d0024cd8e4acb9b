/* Inference path: decode == prefill on every arch (gemma3's past its sliding window), adapters (B = 0 is exact, rank-1
 * == merge), sampling. Models are made by mkmodel (tiny preset). */
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "eval/session.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "util/util.h"

static char tmpdir[256];
/* FP32 resident weights: the adapter-vs-merge comparison must not see quantization noise. */
static const nl_proj_config f32cfg = {.backend = "ref", .n_threads = 1, .precision = "f32"};

static void make_model(nl_arch arch, int type, char *path) {
    snprintf(path, 512, "%s/%s-%d.gguf", tmpdir, nl_arch_name(arch), type);
    if (nl_mkmodel(arch, "tiny", type, 7, path)) {
        fprintf(stderr, "mkmodel: %s\n", nl_last_error());
        exit(1);
    }
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double maxd = 0.0, maxv = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > maxd) maxd = d;
        if (fabs((double)a[i]) > maxv) maxv = fabs((double)a[i]);
    }
    return maxd / maxv;
}

/* The logits of a full-sequence forward equal those of token-by-token decoding (KV cache and
 * GDN state), and of a prefill in two pieces. */
static void test_decode_equals_prefill(const char *path) {
    nl_session s;
    CHECK(nl_session_open(&s, path, NULL, NL_T_REF_CFG) == 0);
    enum { T = 19 };
    int V = s.m->hp.n_vocab, E = s.m->hp.n_embd;
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 37 + 11) % V);
    float *full = malloc(sizeof(float) * T * V), *step = malloc(sizeof(float) * T * V),
          *h = malloc(sizeof(float) * T * E);
    CHECK(nl_session_logits(&s, tok, T, full) == 0);
    nl_seq_state st;
    CHECK(nl_seq_state_init(&st, s.m, 64) == 0);
    for (int t = 0; t < T; t++) {
        CHECK(nl_forward(&s.rt, &st, &tok[t], 1, h) == 0);
        CHECK(nl_head_logits(&s.rt, h, 1, step + (size_t)t * V) == 0);
    }
    double d = max_rel_diff(full, step, (size_t)T * V);
    CHECKF(d < 1e-4, "%s: decode vs prefill rel diff %g", path, d);
    /* prefill 7 then 12 */
    nl_seq_state_reset(&st, s.m);
    CHECK(nl_forward(&s.rt, &st, tok, 7, h) == 0);
    CHECK(nl_head_logits(&s.rt, h, 7, step) == 0);
    CHECK(nl_forward(&s.rt, &st, tok + 7, T - 7, h) == 0);
    CHECK(nl_head_logits(&s.rt, h, T - 7, step + (size_t)7 * V) == 0);
    d = max_rel_diff(full, step, (size_t)T * V);
    CHECKF(d < 1e-4, "%s: two-piece prefill rel diff %g", path, d);
    /* logits are not degenerate: different positions differ */
    CHECK(max_rel_diff(full, full + V, (size_t)V) > 1e-3);
    /* a snapshot after a shared prefix (eval's choices): prefix 7, snapshot, continue with one
     * suffix, restore, continue with the same suffix again: the same bits; another suffix in
     * between does not leak into it (recurrent states restored, KV rows overwritten) */
    {
        nl_seq_state snap;
        CHECK(nl_seq_state_init(&snap, s.m, 1) == 0);
        float *h1 = malloc(sizeof(float) * T * E), *h2 = malloc(sizeof(float) * T * E);
        int32_t other[T];
        for (int t = 0; t < T; t++) other[t] = (int32_t)((t * 53 + 5) % V);
        nl_seq_state_reset(&st, s.m);
        CHECK(nl_forward(&s.rt, &st, tok, 7, h) == 0);
        nl_seq_state_copy(&snap, &st, s.m, 0);
        CHECK(snap.n_past == 7);
        CHECK(nl_forward(&s.rt, &st, tok + 7, 5, h1) == 0);
        nl_seq_state_copy(&st, &snap, s.m, 0);
        CHECK(nl_forward(&s.rt, &st, other, 9, h2) == 0);
        nl_seq_state_copy(&st, &snap, s.m, 0);
        CHECK(st.n_past == 7);
        CHECK(nl_forward(&s.rt, &st, tok + 7, 5, h2) == 0);
        CHECKF(memcmp(h1, h2, sizeof(float) * 5 * E) == 0, "%s: restored prefix state differs", path);
        /* with_kv: a fresh state gets the prefix's KV rows too */
        nl_seq_state st2;
        CHECK(nl_seq_state_init(&st2, s.m, 64) == 0);
        nl_seq_state_reset(&st, s.m);
        CHECK(nl_forward(&s.rt, &st, tok, 7, h) == 0);
        nl_seq_state_copy(&st2, &st, s.m, 1);
        CHECK(nl_forward(&s.rt, &st2, tok + 7, 5, h2) == 0);
        CHECKF(memcmp(h1, h2, sizeof(float) * 5 * E) == 0, "%s: copied state (with KV) differs", path);
        nl_seq_state_free(&st2, s.m);
        nl_seq_state_free(&snap, s.m);
        free(h1);
        free(h2);
    }
    nl_seq_state_free(&st, s.m);
    free(full);
    free(step);
    free(h);
    nl_session_close(&s);
}

/* An adapter with B = 0 leaves logits bit-identical; a rank-1 adapter with random B equals
 * merge + plain forward. */
static void test_adapters(const char *path, const char *tag) {
    char apath[512], mpath[512];
    snprintf(apath, sizeof apath, "%s/%s-zero.gguf", tmpdir, tag);
    nl_model *m = nl_model_load(path);
    CHECK(m != NULL);
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "all", 1, 2.0f, 3);
    CHECK(a != NULL);
    CHECK(nl_adapter_save(a, m, apath) == 0);
    enum { T = 9 };
    int V = m->hp.n_vocab;
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 53 + 5) % V);
    float *base = malloc(sizeof(float) * T * V), *with = malloc(sizeof(float) * T * V),
          *merged = malloc(sizeof(float) * T * V);
    nl_session s;
    CHECK(nl_session_open(&s, path, NULL, &f32cfg) == 0);
    CHECK(nl_session_logits(&s, tok, T, base) == 0);
    nl_session_close(&s);
    CHECK(nl_session_open(&s, path, apath, &f32cfg) == 0);
    CHECK(s.adapter && s.adapter->n == a->n);
    CHECK(nl_session_logits(&s, tok, T, with) == 0);
    nl_session_close(&s);
    CHECK(memcmp(base, with, sizeof(float) * T * V) == 0);

    /* random B on every projection except the tied head (merge can't split a tied tensor) */
    nl_adapter_free(a);
    a = nl_adapter_new(m, "q,k,v,o,gate,up,down,qkv,z,alpha,beta,out", 1, 2.0f, 3);
    for (int i = 0; i < a->n; i++) {
        float *B = nl_lora_B(a, i);
        for (int64_t j = 0; j < a->t[i].n_out; j++) B[j] = (float)(0.5 * nl_t_rand());
    }
    snprintf(apath, sizeof apath, "%s/%s-r1.gguf", tmpdir, tag);
    snprintf(mpath, sizeof mpath, "%s/%s-merged.gguf", tmpdir, tag);
    CHECK(nl_adapter_save(a, m, apath) == 0);
    CHECK(nl_merge(m, a, NL_TYPE_F32, mpath) == 0);
    {
        /* the merged file says what it holds: llama.cpp's ALL_F32 */
        nl_gguf *mg = nl_gguf_open(mpath);
        uint32_t ft = 99;
        CHECK(mg && nl_gguf_get_u32(mg, "general.file_type", &ft) == 0 && ft == 0);
        nl_gguf_close(mg);
    }
    CHECK(nl_session_open(&s, path, apath, &f32cfg) == 0);
    CHECK(nl_session_logits(&s, tok, T, with) == 0);
    nl_session_close(&s);
    CHECK(nl_session_open(&s, mpath, NULL, &f32cfg) == 0);
    CHECK(nl_session_logits(&s, tok, T, merged) == 0);
    nl_session_close(&s);
    double d = max_rel_diff(with, merged, (size_t)T * V), moved = max_rel_diff(with, base, (size_t)T * V);
    CHECKF(d < 1e-4, "%s: adapter vs merged rel diff %g", tag, d);
    CHECKF(moved > 1e-3, "%s: the adapter changed nothing (%g)", tag, moved);

    /* merge --type q4_1: every adapted projection is the reference Q4_1 quantization of the
     * F32 merge's tensor, byte for byte; other tensors as they were; file_type 3 (MOSTLY_Q4_1) */
    char qpath[512];
    snprintf(qpath, sizeof qpath, "%s/%s-merged-q4_1.gguf", tmpdir, tag);
    CHECK(nl_merge(m, a, NL_TYPE_Q4_1, qpath) == 0);
    nl_gguf *gf = nl_gguf_open(mpath), *gq = nl_gguf_open(qpath);
    CHECK(gf && gq);
    if (gf && gq) {
        uint32_t ft = 0;
        CHECK(nl_gguf_get_u32(gq, "general.file_type", &ft) == 0 && ft == 3);
        int n_q41 = 0, bad = 0;
        for (int64_t i = 0; i < gq->n_tensors; i++) {
            const nl_gguf_tensor *tq = &gq->tensors[i], *tf = nl_gguf_tensor_find(gf, tq->name);
            if (!tf) {
                bad++;
                continue;
            }
            if (tq->type != NL_TYPE_Q4_1) continue;
            n_q41++;
            const int64_t n = tf->ne[0] * tf->ne[1];
            uint8_t *want = malloc(nl_row_bytes(NL_TYPE_Q4_1, tf->ne[0]) * (size_t)tf->ne[1]);
            nl_type_get(NL_TYPE_Q4_1)->from_float((const float *)tf->data, want, n);
            bad += tf->type != NL_TYPE_F32 ||
                   memcmp(want, tq->data, nl_row_bytes(NL_TYPE_Q4_1, tf->ne[0]) * (size_t)tf->ne[1]) != 0;
            free(want);
        }
        CHECKF(bad == 0 && n_q41 >= a->n, "%s: q4_1 merge: %d of %d tensors differ", tag, bad, n_q41);
    }
    nl_gguf_close(gf);
    nl_gguf_close(gq);
    nl_adapter_free(a);
    nl_model_free(m);
    free(base);
    free(with);
    free(merged);
}

/* merge of an adapter into weights of a type nightlora cannot quantize to (the real Gemma 3 file
 * stores attn_q/k and ffn_gate/up as Q5_0, others as Q4_K and Q6_K): each such adapted weight is
 * written as Q8_0 — the reference Q8_0 quantization of the F32 merge's tensor, byte for byte —,
 * every other tensor as it was, and the merged model computes what the adapter does. */
static void test_merge_unwritable(const char *f32_path) {
    CHECK(nl_merge_out_type(NL_TYPE_Q5_0) == NL_TYPE_Q8_0 && nl_merge_out_type(NL_TYPE_Q4_K) == NL_TYPE_Q8_0 &&
          nl_merge_out_type(NL_TYPE_Q6_K) == NL_TYPE_Q8_0);
    CHECK(nl_merge_out_type(NL_TYPE_Q4_1) == NL_TYPE_Q8_0 && nl_merge_out_type(NL_TYPE_Q4_0) == NL_TYPE_Q8_0 &&
          nl_merge_out_type(NL_TYPE_F32) == NL_TYPE_F32 && nl_merge_out_type(NL_TYPE_BF16) == NL_TYPE_BF16 &&
          nl_merge_out_type(NL_TYPE_F16) == NL_TYPE_F16 && nl_merge_out_type(NL_TYPE_Q8_0) == NL_TYPE_Q8_0);
    /* the tiny model with two projections in Q5_0 (random codes, a small scale per block) */
    static const char *const q5[2] = {"blk.0.attn_q.weight", "blk.1.ffn_up.weight"};
    char path[512], apath[512], mpath[512], fpath[512];
    snprintf(path, sizeof path, "%s/q5_0-model.gguf", tmpdir);
    nl_gguf *g = nl_gguf_open(f32_path);
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = g && w ? nl_gguf_copy_kvs(w, g) : -1;
    uint8_t *blocks[2] = {NULL, NULL};
    for (int64_t i = 0; rc == 0 && i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        int k = strcmp(t->name, q5[0]) == 0 ? 0 : strcmp(t->name, q5[1]) == 0 ? 1 : -1;
        if (k < 0) {
            rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, true);
            continue;
        }
        const size_t nb = (size_t)(t->ne[0] * t->ne[1] / 32);
        blocks[k] = malloc(nb * 22);
        for (size_t b = 0; b < nb * 22; b++) blocks[k][b] = (uint8_t)((unsigned)((nl_t_rand() + 1.0) * 128.0) & 0xffu);
        for (size_t b = 0; b < nb; b++) {
            const uint16_t d = nl_f32_to_f16((float)(0.004 + 0.002 * fabs(nl_t_rand())));
            blocks[k][b * 22] = (uint8_t)d;
            blocks[k][b * 22 + 1] = (uint8_t)(d >> 8);
        }
        rc = nl_gguf_add_tensor(w, t->name, NL_TYPE_Q5_0, (int)t->n_dims, t->ne, blocks[k], true);
    }
    if (rc == 0) rc = nl_gguf_write(w, path);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    free(blocks[0]);
    free(blocks[1]);
    CHECK(rc == 0);
    nl_model *m = rc == 0 ? nl_model_load(path) : NULL;
    CHECK(m != NULL);
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down", 2, 4.0f, 5);
    CHECK(a != NULL);
    for (int i = 0; i < a->n; i++) {
        float *B = nl_lora_B(a, i);
        for (int64_t j = 0; j < a->t[i].n_out * 2; j++) B[j] = (float)(0.5 * nl_t_rand());
    }
    snprintf(apath, sizeof apath, "%s/q5_0-adapter.gguf", tmpdir);
    snprintf(mpath, sizeof mpath, "%s/q5_0-merged.gguf", tmpdir);
    snprintf(fpath, sizeof fpath, "%s/q5_0-merged-f32.gguf", tmpdir);
    CHECK(nl_adapter_save(a, m, apath) == 0);
    CHECK(nl_merge(m, a, -1, mpath) == 0);
    CHECK(nl_merge(m, a, NL_TYPE_F32, fpath) == 0);
    nl_gguf *gb = nl_gguf_open(path), *gm = nl_gguf_open(mpath), *gf = nl_gguf_open(fpath);
    CHECK(gb && gm && gf);
    if (gb && gm && gf) {
        int n_q8 = 0, bad = 0;
        for (int64_t i = 0; i < gm->n_tensors; i++) {
            const nl_gguf_tensor *tm = &gm->tensors[i], *tb = nl_gguf_tensor_find(gb, tm->name),
                                 *tf = nl_gguf_tensor_find(gf, tm->name);
            if (!tb || !tf) {
                bad++;
                continue;
            }
            const int64_t n = tm->ne[0] * tm->ne[1];
            if (tb->type == NL_TYPE_Q5_0) {
                n_q8++;
                const size_t bytes = nl_row_bytes(NL_TYPE_Q8_0, tm->ne[0]) * (size_t)tm->ne[1];
                uint8_t *want = malloc(bytes);
                nl_type_get(NL_TYPE_Q8_0)->from_float((const float *)tf->data, want, n);
                /* the reference quantization of the F32 merge, but for merge's rounding that keeps
                 * the update: the same block scales, each value at most one step from nearest */
                int off = tm->type != NL_TYPE_Q8_0 || tf->type != NL_TYPE_F32 || tm->nbytes != bytes;
                for (size_t b = 0; !off && b < bytes; b += 34) {
                    off += memcmp(want + b, (const uint8_t *)tm->data + b, 2) != 0;
                    for (int j = 0; j < 32; j++)
                        off += abs((int)(int8_t)want[b + 2 + j] - (int)((const int8_t *)tm->data)[b + 2 + j]) > 1;
                }
                bad += off != 0;
                free(want);
            } else {
                /* F32 weights stay F32 (adapted or not); norms and the embedding byte for byte */
                bad += tm->type != tb->type;
                const int proj = (strstr(tm->name, "attn_") || strstr(tm->name, "ffn_")) && !strstr(tm->name, "norm");
                if (!proj)
                    bad += memcmp(tm->data, tb->data, nl_row_bytes(tb->type, tb->ne[0]) * (size_t)(n / tb->ne[0])) != 0;
            }
        }
        CHECKF(bad == 0 && n_q8 == 2, "merge of q5_0 weights: %d tensors wrong, %d written as q8_0", bad, n_q8);
    }
    nl_gguf_close(gb);
    nl_gguf_close(gm);
    nl_gguf_close(gf);
    /* and it computes what base + adapter computes, up to the Q8_0 rounding of two weights */
    enum { T = 9 };
    const int V = m->hp.n_vocab;
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 31 + 2) % V);
    float *with = malloc(sizeof(float) * T * V), *merged = malloc(sizeof(float) * T * V),
          *base = malloc(sizeof(float) * T * V);
    nl_session s;
    CHECK(nl_session_open(&s, path, NULL, &f32cfg) == 0 && nl_session_logits(&s, tok, T, base) == 0);
    nl_session_close(&s);
    CHECK(nl_session_open(&s, path, apath, &f32cfg) == 0 && nl_session_logits(&s, tok, T, with) == 0);
    nl_session_close(&s);
    CHECK(nl_session_open(&s, mpath, NULL, &f32cfg) == 0 && nl_session_logits(&s, tok, T, merged) == 0);
    nl_session_close(&s);
    const double d = max_rel_diff(with, merged, (size_t)T * V), moved = max_rel_diff(with, base, (size_t)T * V);
    CHECKF(d < 0.1 * moved, "q5_0 merge: merged vs adapter rel diff %g, the adapter moves the logits by %g", d, moved);
    free(with);
    free(merged);
    free(base);
    nl_adapter_free(a);
    nl_model_free(m);
}

/* Logits of T tokens of a model (+ adapter) under the F32 reference. */
static void logits_of(const char *model, const char *adapter, const int32_t *tok, int T, float *out) {
    nl_session s;
    CHECK(nl_session_open(&s, model, adapter, &f32cfg) == 0 && nl_session_logits(&s, tok, T, out) == 0);
    nl_session_close(&s);
}

/* What merge keeps of an update, measured: the tiny model with every projection stored as Q4_1
 * (as SmolLM2's file), an adapter whose update is ~1/10 of a Q4_1 step. The default writes the
 * adapted weights as Q8_0 (the rest as stored), keeps the update (lost < 10%) and computes what
 * base + adapter does; --type q4_1 loses most of it (the measure says so, the logits agree) and a
 * bound refuses it with nothing written; F16 and F32 keep it to their rounding; an update that
 * overflows the written type is refused, nothing written (what the loader would reject). */
static void test_merge_kept(const char *f32_path) {
    char path[512], apath[512], mdef[512], m4[512], m16[512], m32[512], mbad[512];
    snprintf(path, sizeof path, "%s/q4_1-model.gguf", tmpdir);
    nl_gguf *g = nl_gguf_open(f32_path);
    nl_gguf_writer *w = nl_gguf_writer_new();
    int rc = g && w ? nl_gguf_copy_kvs(w, g) : -1;
    void *blk[256] = {0};
    int nb = 0;
    for (int64_t i = 0; rc == 0 && i < g->n_tensors; i++) {
        const nl_gguf_tensor *t = &g->tensors[i];
        const int proj =
            (strstr(t->name, "attn_") || strstr(t->name, "ffn_")) && !strstr(t->name, "norm") && t->n_dims == 2;
        if (!proj || t->type != NL_TYPE_F32 || nb == 256 || t->ne[0] % 32) {
            rc = nl_gguf_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, true);
            continue;
        }
        const int64_t n = t->ne[0] * t->ne[1];
        blk[nb] = malloc(nl_row_bytes(NL_TYPE_Q4_1, t->ne[0]) * (size_t)t->ne[1]);
        nl_type_get(NL_TYPE_Q4_1)->from_float((const float *)t->data, blk[nb], n);
        rc = nl_gguf_add_tensor(w, t->name, NL_TYPE_Q4_1, 2, t->ne, blk[nb], true);
        nb++;
    }
    if (rc == 0) rc = nl_gguf_write(w, path);
    nl_gguf_writer_free(w);
    nl_gguf_close(g);
    for (int k = 0; k < nb; k++) free(blk[k]);
    CHECK(rc == 0 && nb > 0);
    nl_model *m = rc == 0 ? nl_model_load(path) : NULL;
    CHECK(m != NULL);
    if (!m) return;
    nl_adapter *a = nl_adapter_new(m, "q,k,v,o,gate,up,down", 2, 4.0f, 9);
    CHECK(a != NULL);
    if (!a) {
        nl_model_free(m);
        return;
    }
    for (int i = 0; i < a->n; i++) {
        float *B = nl_lora_B(a, i);
        for (int64_t j = 0; j < a->t[i].n_out * 2; j++) B[j] = (float)(0.02 * nl_t_rand());
    }
    snprintf(apath, sizeof apath, "%s/q4_1-adapter.gguf", tmpdir);
    snprintf(mdef, sizeof mdef, "%s/q4_1-merged.gguf", tmpdir);
    snprintf(m4, sizeof m4, "%s/q4_1-merged-q4_1.gguf", tmpdir);
    snprintf(m16, sizeof m16, "%s/q4_1-merged-f16.gguf", tmpdir);
    snprintf(m32, sizeof m32, "%s/q4_1-merged-f32.gguf", tmpdir);
    snprintf(mbad, sizeof mbad, "%s/q4_1-merged-refused.gguf", tmpdir);
    CHECK(nl_adapter_save(a, m, apath) == 0);
    nl_merge_stats sd, s4, s16, s32;
    CHECK(nl_merge_ex(m, a, -1, 0.10, &sd, mdef) == 0);
    CHECK(nl_merge_ex(m, a, NL_TYPE_Q4_1, -1.0, &s4, m4) == 0);
    CHECK(nl_merge_ex(m, a, NL_TYPE_F16, 0.10, &s16, m16) == 0);
    CHECK(nl_merge_ex(m, a, NL_TYPE_F32, 0.0001, &s32, m32) == 0);
    printf("merge kept: lost q8_0 (default) %.4f, q4_1 %.4f, f16 %.6f, f32 %.2g\n", sd.lost, s4.lost, s16.lost,
           s32.lost);
    CHECKF(sd.n_adapted == a->n && sd.n_retyped == a->n && sd.by_type[NL_TYPE_Q8_0] == a->n,
           "default: %d adapted, %d retyped, %d q8_0 of %d", sd.n_adapted, sd.n_retyped, sd.by_type[NL_TYPE_Q8_0],
           a->n);
    CHECKF(sd.lost < 0.10 && sd.worst >= sd.lost && sd.worst_name[0], "default merge lost %g (worst %g)", sd.lost,
           sd.worst);
    CHECKF(s4.lost > 0.15 && s4.lost > 5 * sd.lost, "q4_1 merge lost only %g of an update under its step (q8_0: %g)",
           s4.lost, sd.lost);
    CHECKF(s16.lost < 0.01 && s16.lost < sd.lost, "f16 merge lost %g", s16.lost);
    CHECKF(s32.lost < 1e-5, "f32 merge lost %g", s32.lost);
    /* the file: adapted weights Q8_0, the rest (the embedding, the norms) as stored */
    nl_gguf *gb = nl_gguf_open(path), *gm = nl_gguf_open(mdef);
    CHECK(gb && gm);
    for (int64_t i = 0; gb && gm && i < gm->n_tensors; i++) {
        const nl_gguf_tensor *tm = &gm->tensors[i], *tb = nl_gguf_tensor_find(gb, tm->name);
        CHECK(tb != NULL);
        if (!tb) continue;
        if (tb->type == NL_TYPE_Q4_1)
            CHECKF(tm->type == NL_TYPE_Q8_0, "%s written as %s", tm->name, nl_type_name(tm->type));
        else
            CHECKF(tm->type == tb->type && tm->nbytes == tb->nbytes &&
                       memcmp(tm->data, tb->data, (size_t)tb->nbytes) == 0,
                   "%s changed", tm->name);
    }
    /* the default's Q8_0 rounding keeps the update (merge.c q8_0_keep_update): block scales the
     * reference quantizer's, every element within 1.5 steps of W + ΔW, and the error on A's rows
     * well under nearest rounding's */
    double e_keep = 0, e_near = 0;
    int n_far = 0, n_scale = 0;
    for (int i = 0; gb && gm && i < a->n; i++) {
        const nl_gguf_tensor *tw = m->projs[a->t[i].proj].w, *tm = nl_gguf_tensor_find(gm, tw->name);
        if (!tm || tm->type != NL_TYPE_Q8_0) continue;
        const int64_t K = a->t[i].n_in, N = a->t[i].n_out;
        const int r = a->t[i].rank;
        const float sc = nl_adapter_scale(a, i), *A = nl_lora_A(a, i), *B = nl_lora_B(a, i);
        float *row = malloc(sizeof(float) * (size_t)K), *wq = malloc(sizeof(float) * (size_t)K),
              *nq = malloc(sizeof(float) * (size_t)K);
        uint8_t *nb8 = malloc(nl_row_bytes(NL_TYPE_Q8_0, K));
        const size_t rs = nl_row_bytes(tw->type, K), r8 = nl_row_bytes(NL_TYPE_Q8_0, K);
        for (int64_t o = 0; o < N; o++) {
            nl_type_get(tw->type)->to_float((const uint8_t *)tw->data + (size_t)o * rs, row, K);
            for (int j = 0; j < r; j++)
                for (int64_t k = 0; k < K; k++) row[k] += sc * B[o * r + j] * A[(size_t)j * K + k];
            const uint8_t *qm = (const uint8_t *)tm->data + (size_t)o * r8;
            nl_type_get(NL_TYPE_Q8_0)->to_float(qm, wq, K);
            nl_type_get(NL_TYPE_Q8_0)->from_float(row, nb8, K);
            nl_type_get(NL_TYPE_Q8_0)->to_float(nb8, nq, K);
            for (int64_t b = 0; b < K / 32; b++) {
                n_scale += memcmp(qm + b * 34, nb8 + b * 34, 2) != 0;
                const float step = nl_f16_to_f32((uint16_t)(nb8[b * 34] | (nb8[b * 34 + 1] << 8)));
                for (int k = 0; k < 32; k++) n_far += fabsf(wq[b * 32 + k] - row[b * 32 + k]) > 1.5f * step + 1e-7f;
            }
            for (int j = 0; j < r; j++) {
                double pk = 0, pn = 0;
                for (int64_t k = 0; k < K; k++) {
                    pk += ((double)wq[k] - row[k]) * A[(size_t)j * K + k];
                    pn += ((double)nq[k] - row[k]) * A[(size_t)j * K + k];
                }
                e_keep += pk * pk, e_near += pn * pn;
            }
        }
        free(row);
        free(wq);
        free(nq);
        free(nb8);
    }
    printf("merge kept: error on A's rows, kept rounding / nearest: %.3f\n", sqrt(e_keep / e_near));
    CHECKF(n_scale == 0 && n_far == 0,
           "default Q8_0: %d block scales not the reference's, %d elements over 1.5 steps from W + dW", n_scale, n_far);
    CHECKF(e_near > 0 && e_keep < 0.5 * e_near, "default Q8_0: error on A's rows %g of nearest rounding's",
           sqrt(e_keep / e_near));
    nl_gguf_close(gb);
    nl_gguf_close(gm);
    /* the measure tells what the logits tell */
    enum { T = 9 };
    const int V = m->hp.n_vocab;
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 37 + 3) % V);
    float *base = malloc(sizeof(float) * T * V), *with = malloc(sizeof(float) * T * V),
          *ld = malloc(sizeof(float) * T * V), *l4 = malloc(sizeof(float) * T * V);
    logits_of(path, NULL, tok, T, base);
    logits_of(path, apath, tok, T, with);
    logits_of(mdef, NULL, tok, T, ld);
    logits_of(m4, NULL, tok, T, l4);
    double moved = 0, ed = 0, e4 = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        moved += ((double)with[i] - base[i]) * ((double)with[i] - base[i]);
        ed += ((double)with[i] - ld[i]) * ((double)with[i] - ld[i]);
        e4 += ((double)with[i] - l4[i]) * ((double)with[i] - l4[i]);
    }
    moved = sqrt(moved), ed = sqrt(ed), e4 = sqrt(e4);
    printf("merge kept: logits |merged - (base+adapter)| / |adapter's change|: q8_0 %.4f, q4_1 %.4f\n", ed / moved,
           e4 / moved);
    CHECKF(moved > 0 && ed < 0.2 * moved, "default merge: logits off by %g of the adapter's change", ed / moved);
    CHECKF(e4 > 0.5 * moved, "q4_1 merge: logits off by only %g of the adapter's change", e4 / moved);
    free(base);
    free(with);
    free(ld);
    free(l4);
    /* a bound on the loss refuses, nothing written, the figures in the message */
    nl_merge_stats sb;
    CHECK(nl_merge_ex(m, a, NL_TYPE_Q4_1, 0.10, &sb, mbad) == -1);
    CHECKF(strstr(nl_last_error(), "would lose") && strstr(nl_last_error(), "nothing written"), "%s", nl_last_error());
    CHECK(access(mbad, F_OK) != 0);
    /* the CLI: one summary line with the probe's figure; --type q4_1 warns, --strict refuses and
     * writes nothing (an older --out is left as it was) */
    char errp[512], outp[512];
    snprintf(errp, sizeof errp, "%s/merge.err", tmpdir);
    snprintf(outp, sizeof outp, "%s/cli-merged.gguf", tmpdir);
    const char *const c1[] = {NL_CLI, "merge", "--model", path, "--adapter", apath, "--out", outp, NULL};
    CHECK(nl_t_run(c1, errp, NULL) == 0);
    char *e = nl_t_slurp(errp, NULL);
    CHECKF(e && strstr(e, "kept") && strstr(e, "probe logits off by") && !strstr(e, "warning"), "%s", e ? e : "");
    free(e);
    struct stat st0;
    CHECK(stat(outp, &st0) == 0);
    const char *const c2[] = {NL_CLI,  "merge", "--model", path,   "--adapter", apath,
                              "--out", mbad,    "--type",  "q4_1", NULL};
    CHECK(nl_t_run(c2, errp, NULL) == 0);
    e = nl_t_slurp(errp, NULL);
    CHECKF(e && strstr(e, "warning: --type q4_1 misses"), "%s", e ? e : "");
    free(e);
    unlink(mbad);
    const char *const c3[] = {NL_CLI,  "merge", "--model", path,   "--adapter", apath,
                              "--out", outp,    "--type",  "q4_1", "--strict",  NULL};
    CHECK(nl_t_run(c3, errp, NULL) == 1);
    e = nl_t_slurp(errp, NULL);
    CHECKF(e && strstr(e, "--strict") && strstr(e, "nothing written"), "%s", e ? e : "");
    free(e);
    struct stat st1;
    char probe_path[600];
    snprintf(probe_path, sizeof probe_path, "%s.probe", outp);
    CHECK(stat(outp, &st1) == 0 && st1.st_ino == st0.st_ino && st1.st_size == st0.st_size &&
          access(probe_path, F_OK) != 0);
    /* an update that overflows the written type: refused, nothing written */
    float *B0 = nl_lora_B(a, 0);
    for (int64_t j = 0; j < a->t[0].n_out * 2; j++) B0[j] = 1e30f;
    CHECK(nl_merge_ex(m, a, NL_TYPE_F16, -1.0, NULL, mbad) == -1);
    CHECKF(strstr(nl_last_error(), "not finite") && strstr(nl_last_error(), "nothing written"), "%s", nl_last_error());
    CHECK(access(mbad, F_OK) != 0);
    CHECK(nl_merge_ex(m, a, -1, -1.0, NULL, mbad) == -1); /* q8_0's f16 block scale */
    CHECK(access(mbad, F_OK) != 0);
    nl_adapter_free(a);
    nl_model_free(m);
}

static void test_adapter_errors(const char *llama_path, const char *qwen_path) {
    char apath[512];
    snprintf(apath, sizeof apath, "%s/llama-for-qwen.gguf", tmpdir);
    nl_model *ml = nl_model_load(llama_path), *mq = nl_model_load(qwen_path);
    nl_adapter *a = nl_adapter_new(ml, "q", 2, 4.0f, 1);
    CHECK(nl_adapter_save(a, ml, apath) == 0);
    CHECK(nl_adapter_load(mq, apath) == NULL);
    CHECK(strstr(nl_last_error(), "llama") && strstr(nl_last_error(), "qwen3"));
    CHECK(nl_adapter_load(ml, "/nonexistent.gguf") == NULL);
    CHECK(nl_adapter_new(ml, "q,bogus", 2, 4.0f, 1) == NULL);
    CHECK(strstr(nl_last_error(), "bogus") != NULL);
    nl_adapter_free(a);
    nl_model_free(ml);
    nl_model_free(mq);
}

static void test_sampling(void) {
    float l[5] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
    CHECK(nl_sample(l, 5, 0.0f, 1.0f, 0.5) == 1);
    /* top_p tiny keeps only the best */
    CHECK(nl_sample(l, 5, 1.0f, 0.01f, 0.99) == 1);
    /* u near 1 with full nucleus picks from the tail, u = 0 the head */
    CHECK(nl_sample(l, 5, 1.0f, 1.0f, 0.0) == 1);
    CHECK(nl_sample(l, 5, 1.0f, 1.0f, 0.999999) == 2);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nl_test_infer_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd)) return 1;
    char paths[4][512];
    const nl_arch archs[4] = {NL_ARCH_LLAMA, NL_ARCH_QWEN3, NL_ARCH_QWEN35, NL_ARCH_GEMMA3};
    for (int i = 0; i < 4; i++) {
        make_model(archs[i], NL_TYPE_F32, paths[i]);
        test_decode_equals_prefill(paths[i]);
        test_adapters(paths[i], nl_arch_name(archs[i]));
    }
    /* quantized weights through the same path */
    char q8[512];
    make_model(NL_ARCH_QWEN35, NL_TYPE_Q8_0, q8);
    test_decode_equals_prefill(q8);
    test_merge_unwritable(paths[3]);
    test_merge_kept(paths[0]);
    test_adapter_errors(paths[0], paths[1]);
    test_sampling();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    return nl_t_done();
}

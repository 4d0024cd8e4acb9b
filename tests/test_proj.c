/* proj/: the ref backend against float64, one-hot identities, get_rows, the precision policy
 * (conversion, in place, sharing, resident bytes), one request in flight, counters, thread
 * count independence, the planner (routing, buckets) and every branch of the FP16 wire. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/model.h"
#include "model/quant.h"
#include "proj/proj.h"
#include "test.h"
#include "util/hash.h"
#include "util/util.h"

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct {
    int type;
    int64_t K, N;
    void *data; /* GGUF-like bytes */
    float *wf;  /* [N][K] dequantized through the traits table */
} tw;

static void tw_make(tw *w, int type, int64_t K, int64_t N, float scale) {
    w->type = type;
    w->K = K;
    w->N = N;
    size_t rb = nl_row_bytes(type, K);
    w->data = calloc((size_t)N, rb);
    w->wf = malloc(sizeof(float) * (size_t)(N * K));
    const nl_type_traits *tt = nl_type_get(type);
    if (tt->from_float) {
        float *row = malloc(sizeof(float) * (size_t)K);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) row[k] = (float)nl_t_rand() * scale;
            tt->from_float(row, (uint8_t *)w->data + n * rb, K);
        }
        free(row);
    } else {
        /* k-quants and Q5_0: random codes and scales, sane f16 (super-)block scales */
        uint8_t *p = w->data;
        for (size_t i = 0; i < (size_t)N * rb; i++) p[i] = (uint8_t)((nl_t_rand() + 1.0) * 127.9);
        for (size_t blk = 0; blk < (size_t)N * rb / tt->bytes; blk++) {
            uint8_t *b = p + blk * tt->bytes;
            if (type == NL_TYPE_Q5_0) { /* 32-element blocks: d first */
                uint16_t d = nl_f32_to_f16(scale * 0.004f * (float)(1.0 + nl_t_rand()));
                b[0] = (uint8_t)d;
                b[1] = (uint8_t)(d >> 8);
            } else if (type == NL_TYPE_Q4_K) {
                uint16_t d = nl_f32_to_f16(scale * 0.01f * (float)(1.0 + nl_t_rand()));
                uint16_t dm = nl_f32_to_f16(scale * 0.005f * (float)(1.0 + nl_t_rand()));
                b[0] = (uint8_t)d;
                b[1] = (uint8_t)(d >> 8);
                b[2] = (uint8_t)dm;
                b[3] = (uint8_t)(dm >> 8);
            } else {
                uint16_t d = nl_f32_to_f16(scale * 0.001f * (float)(1.0 + nl_t_rand()));
                b[208] = (uint8_t)d;
                b[209] = (uint8_t)(d >> 8);
            }
        }
    }
    for (int64_t n = 0; n < N; n++) tt->to_float((uint8_t *)w->data + n * rb, w->wf + n * K, K);
}

static void tw_free(tw *w) {
    free(w->data);
    free(w->wf);
}

static nl_proj_weight tw_view(const tw *w, const char *name, int cls) {
    nl_proj_weight v = {name, w->type, w->K, w->N, w->data, cls};
    return v;
}

static float *rand_vec(size_t n, float scale) {
    float *v = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = (float)nl_t_rand() * scale;
    return v;
}

/* float64 reference from the dequantized matrix */
static void ref64(const tw *w, nl_dir dir, const float *x, int T, double *y) {
    for (int t = 0; t < T; t++) {
        if (dir == NL_FWD)
            for (int64_t n = 0; n < w->N; n++) {
                double a = 0;
                for (int64_t k = 0; k < w->K; k++) a += (double)x[t * w->K + k] * w->wf[n * w->K + k];
                y[t * w->N + n] = a;
            }
        else
            for (int64_t k = 0; k < w->K; k++) {
                double a = 0;
                for (int64_t n = 0; n < w->N; n++) a += (double)x[t * w->N + n] * w->wf[n * w->K + k];
                y[t * w->K + k] = a;
            }
    }
}

static double max_rel(const float *y, const double *yd, size_t n) {
    double m = 0, ymax = 0;
    for (size_t i = 0; i < n; i++) ymax = fmax(ymax, fabs(yd[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(y[i] - yd[i]) / (ymax > 0 ? ymax : 1));
    return m;
}

static nl_proj_service *svc(const char *precision, const char *map, int threads, int wire) {
    nl_proj_config c = {0};
    c.n_threads = threads;
    c.precision = precision;
    c.precision_map = map;
    c.wire_f16 = wire;
    nl_proj_service *s = nl_proj_service_new(&c);
    CHECKF(s != NULL, "%s", nl_last_error());
    return s;
}

static const int all_types[] = {NL_TYPE_F32,  NL_TYPE_F16,  NL_TYPE_BF16, NL_TYPE_Q8_0,
                                NL_TYPE_Q4_0, NL_TYPE_Q5_0, NL_TYPE_Q4_K, NL_TYPE_Q6_K};

/* ---- ref vs float64, one-hot identities, get_rows ----------------------------------------- */

static void test_ref_all_types(void) {
    nl_proj_service *s = svc(NULL, "*=keep", 3, 0);
    for (int ti = 0; ti < 8; ti++) {
        const int type = all_types[ti];
        const int blck = nl_type_get(type)->blck;
        const int64_t K = blck == 1 ? 37 : blck == 32 ? 96 : 512;
        const int64_t N = 7 + 2 * ti;
        const int T = 5;
        tw w;
        tw_make(&w, type, K, N, 0.5f);
        nl_proj_weight v = tw_view(&w, "blk.0.attn_q.weight", NL_CLASS_ATTN);
        int id = nl_proj_add(s, &v);
        CHECKF(id >= 0, "%s", nl_last_error());
        CHECK(nl_proj_get(s, id)->type == type && nl_proj_get(s, id)->data == w.data);

        for (int d = 0; d < 2; d++) {
            const nl_dir dir = (nl_dir)d;
            const int64_t in = d ? N : K, out = d ? K : N;
            float *x = rand_vec((size_t)(T * in), 1.0f);
            float *y = malloc(sizeof(float) * (size_t)(T * out));
            double *yd = malloc(sizeof(double) * (size_t)(T * out));
            CHECK(nl_proj_run(s, id, dir, x, T, y) == 0);
            ref64(&w, dir, x, T, yd);
            double e = max_rel(y, yd, (size_t)(T * out));
            CHECKF(e < 1e-6, "type %s dir %d: max rel err %g", nl_type_name(type), d, e);

            /* one-hot rows: BWD gives the dequantized row n0, FWD the dequantized column k0 */
            memset(x, 0, sizeof(float) * (size_t)(T * in));
            int bad = 0;
            for (int t = 0; t < T; t++) x[t * in + (t * 3 + 1) % in] = 1.0f;
            CHECK(nl_proj_run(s, id, dir, x, T, y) == 0);
            for (int t = 0; t < T; t++) {
                const int64_t hot = (t * 3 + 1) % in;
                for (int64_t o = 0; o < out; o++) {
                    float want = d ? w.wf[hot * K + o] : w.wf[o * K + hot];
                    bad += y[t * out + o] != want; /* exact (±0 compare equal) */
                }
            }
            CHECKF(bad == 0, "type %s dir %d: one-hot differs in %d", nl_type_name(type), d, bad);
            free(x);
            free(y);
            free(yd);
        }

        /* get_rows: the same dequantizer */
        int32_t rows[4] = {(int32_t)N - 1, 0, 2, 2};
        float *g = malloc(sizeof(float) * (size_t)(4 * K));
        CHECK(nl_proj_get_rows(s, id, rows, 4, g) == 0);
        int bad = 0;
        for (int i = 0; i < 4; i++) bad += memcmp(g + i * K, w.wf + rows[i] * K, sizeof(float) * (size_t)K) != 0;
        CHECK(bad == 0);
        int32_t oob = (int32_t)N;
        CHECK(nl_proj_get_rows(s, id, &oob, 1, g) == -1);
        CHECK(strstr(nl_last_error(), "out of range") != NULL);
        free(g);
        tw_free(&w); /* the service only borrows: don't run this id again */
    }
    nl_proj_service_free(s);
}

/* ---- precision policy ------------------------------------------------------------------------ */

static void test_policy(void) {
    nl_t_rng_state = 99;
    tw a, r, e, h16, q8, q4k, big, odd, q8r;
    tw_make(&a, NL_TYPE_F32, 64, 9, 1.0f);
    tw_make(&r, NL_TYPE_F32, 64, 5, 1.0f);
    tw_make(&e, NL_TYPE_F32, 64, 11, 1.0f);
    tw_make(&h16, NL_TYPE_F16, 64, 3, 1.0f);
    tw_make(&q8, NL_TYPE_Q8_0, 64, 7, 1.0f);
    tw_make(&q4k, NL_TYPE_Q4_K, 256, 3, 1.0f);
    tw_make(&big, NL_TYPE_F32, 32, 2, 1.0f);
    ((float *)big.data)[5] = 1e5f;           /* beyond F16 range */
    tw_make(&odd, NL_TYPE_F32, 48, 2, 1.0f); /* K not a multiple of 32 */
    tw_make(&q8r, NL_TYPE_Q8_0, 32, 4, 1.0f);

    nl_proj_service *s = svc("auto", NULL, 1, 0);
    nl_proj_weight v;
    v = tw_view(&a, "blk.0.attn_q.weight", NL_CLASS_ATTN);
    int ia = nl_proj_add(s, &v);
    v = tw_view(&r, "blk.0.attn_qkv.weight", NL_CLASS_RECURRENT);
    int ir = nl_proj_add(s, &v);
    v = tw_view(&e, "token_embd.weight", NL_CLASS_EMBED);
    int ie = nl_proj_add(s, &v);
    v = tw_view(&e, "token_embd.weight", NL_CLASS_HEAD); /* tied head */
    int ih = nl_proj_add(s, &v);
    int ih2 = nl_proj_add(s, &v); /* same source, same target: shared */
    v = tw_view(&h16, "blk.1.attn_gate.weight", NL_CLASS_RECURRENT);
    int i16 = nl_proj_add(s, &v);
    v = tw_view(&q8, "blk.1.ffn_up.weight", NL_CLASS_MLP);
    int iq8 = nl_proj_add(s, &v);
    v = tw_view(&q4k, "blk.1.ffn_down.weight", NL_CLASS_MLP);
    int iq4 = nl_proj_add(s, &v);
    v = tw_view(&big, "blk.2.ssm_out.weight", NL_CLASS_RECURRENT);
    int ibig = nl_proj_add(s, &v);
    v = tw_view(&odd, "blk.2.attn_k.weight", NL_CLASS_ATTN);
    int iodd = nl_proj_add(s, &v);
    v = tw_view(&q8r, "blk.2.ssm_alpha.weight", NL_CLASS_RECURRENT);
    int iq8r = nl_proj_add(s, &v);
    CHECK(ia >= 0 && ir >= 0 && ie >= 0 && ih >= 0 && ih2 >= 0 && i16 >= 0 && iq8 >= 0 && iq4 >= 0 && ibig >= 0 &&
          iodd >= 0 && iq8r >= 0);
    CHECK(nl_proj_count(s) == 11);

    CHECK(nl_proj_get(s, ia)->type == NL_TYPE_Q8_0 && nl_proj_get(s, ia)->data != a.data);
    CHECK(nl_proj_get(s, ir)->type == NL_TYPE_F16);
    CHECK(nl_proj_get(s, ie)->type == NL_TYPE_F32 && nl_proj_get(s, ie)->data == e.data); /* embed: in place */
    CHECK(nl_proj_get(s, ih)->type == NL_TYPE_Q8_0);
    CHECK(nl_proj_get(s, ih2)->data == nl_proj_get(s, ih)->data);                             /* converted once */
    CHECK(nl_proj_get(s, i16)->type == NL_TYPE_F16 && nl_proj_get(s, i16)->data == h16.data); /* zero copy */
    CHECK(nl_proj_get(s, iq8)->type == NL_TYPE_Q8_0 && nl_proj_get(s, iq8)->data == q8.data);
    CHECK(nl_proj_get(s, iq4)->type == NL_TYPE_Q4_K && nl_proj_get(s, iq4)->data == q4k.data);   /* no requant */
    CHECK(nl_proj_get(s, ibig)->type == NL_TYPE_F32 && nl_proj_get(s, ibig)->data == big.data);  /* F16 overflow */
    CHECK(nl_proj_get(s, iodd)->type == NL_TYPE_F32);                                            /* K % 32 != 0 */
    CHECK(nl_proj_get(s, iq8r)->type == NL_TYPE_Q8_0 && nl_proj_get(s, iq8r)->data == q8r.data); /* no narrowing */
    CHECK(strcmp(nl_proj_get(s, ia)->name, "blk.0.attn_q.weight") == 0);
    CHECK(nl_proj_get(s, ia)->cls == NL_CLASS_ATTN);

    /* the converted bytes are exactly the reference quantizer's */
    {
        size_t rb = nl_row_bytes(NL_TYPE_Q8_0, 64);
        uint8_t *want = malloc(rb * 9);
        for (int n = 0; n < 9; n++) nl_type_get(NL_TYPE_Q8_0)->from_float(a.wf + n * 64, want + n * rb, 64);
        CHECK(memcmp(want, nl_proj_get(s, ia)->data, rb * 9) == 0);
        free(want);
        uint8_t h[2 * 64 * 5];
        nl_type_get(NL_TYPE_F16)->from_float(r.wf, h, 64 * 5);
        CHECK(memcmp(h, nl_proj_get(s, ir)->data, sizeof h) == 0);
    }

    /* resident bytes: in place == GGUF bytes; shared counted once */
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_RECURRENT, NL_TYPE_F16) == (uint64_t)(2 * 64 * 5 + 2 * 64 * 3));
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_MLP, NL_TYPE_Q8_0) == (uint64_t)(68 * 7));
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_MLP, NL_TYPE_Q4_K) == (uint64_t)(144 * 3));
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_EMBED, -1) == (uint64_t)(4 * 64 * 11));
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_HEAD, NL_TYPE_Q8_0) == (uint64_t)(68 * 11));
    CHECK(nl_proj_resident_bytes(s, NL_CLASS_ATTN, -1) == (uint64_t)(68 * 9 + 4 * 48 * 2));
    CHECK(nl_proj_converted_bytes(s) == (uint64_t)(68 * 9 + 2 * 64 * 5 + 68 * 11));
    uint64_t all = nl_proj_resident_bytes(s, -1, -1), sum = 0;
    for (int c = 0; c < NL_CLASS_COUNT; c++) sum += nl_proj_resident_bytes(s, c, -1);
    CHECK(all == sum);
    char buf[512];
    int n = nl_proj_format_resident(s, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n == strlen(buf));
    CHECKF(strstr(buf, "attn F32 384 B, Q8_0 612 B, mlp Q8_0 476 B, Q4_K 432 B") != NULL, "%s", buf);
    CHECKF(strstr(buf, "recurrent F32 256 B, F16 1.02 kB, Q8_0 136 B, head Q8_0 748 B") != NULL, "%s", buf);
    CHECKF(strstr(buf, "embed F32 2.82 kB") != NULL, "%s", buf);
    char small[8];
    CHECK(nl_proj_format_resident(s, small, sizeof small) == n && strlen(small) == 7);
    nl_proj_service_free(s);

    /* global precision and the map: globs win over classes, the last match wins */
    s = svc("f32", "mlp=f16, blk.0.* = q8_0 ,recurrent=keep,blk.0.attn_q*=bf16", 1, 0);
    v = tw_view(&a, "blk.0.attn_q.weight", NL_CLASS_ATTN);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_BF16);
    v = tw_view(&a, "blk.0.ffn_up.weight", NL_CLASS_MLP);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_Q8_0);
    v = tw_view(&a, "blk.3.ffn_up.weight", NL_CLASS_MLP);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_F16);
    v = tw_view(&h16, "blk.3.attn_k.weight", NL_CLASS_ATTN);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_F32); /* widened */
    v = tw_view(&q8, "blk.3.attn_v.weight", NL_CLASS_ATTN);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_F32); /* exact expansion */
    v = tw_view(&r, "blk.3.attn_qkv.weight", NL_CLASS_RECURRENT);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->data == r.data); /* keep */
    v = tw_view(&q4k, "blk.0.ffn_down.weight", NL_CLASS_MLP);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_Q4_K); /* q8_0 asked: no requant */
    nl_proj_service_free(s);

    /* "keep": every weight in its GGUF type (F32 stays F32, F16 stays F16, in place), the map
     * still applies; and the policy in words */
    s = svc("keep", "blk.9.*=q8_0", 1, 0);
    v = tw_view(&a, "blk.0.attn_q.weight", NL_CLASS_ATTN);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->data == a.data);
    v = tw_view(&h16, "blk.0.attn_gate.weight", NL_CLASS_RECURRENT);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->data == h16.data);
    v = tw_view(&e, "token_embd.weight", NL_CLASS_HEAD);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_F32);
    v = tw_view(&a, "blk.9.attn_q.weight", NL_CLASS_ATTN);
    CHECK(nl_proj_get(s, nl_proj_add(s, &v))->type == NL_TYPE_Q8_0);
    CHECK(nl_proj_converted_bytes(s) == (uint64_t)(68 * 9));
    char pol[256];
    nl_proj_format_precision(s, pol, sizeof pol);
    CHECKF(!strcmp(pol, "keep (every weight in its GGUF type, then the precision map)"), "%s", pol);
    nl_proj_service_free(s);
    s = svc(NULL, NULL, 1, 0);
    nl_proj_format_precision(s, pol, sizeof pol);
    CHECKF(!strcmp(pol, "auto (attn, mlp, head -> q8_0, recurrent -> f16; embed and quantized GGUF tensors as stored)"),
           "%s", pol);
    nl_proj_service_free(s);

    /* bad configs and weights */
    nl_proj_config c = {0};
    c.precision = "q5_k";
    CHECK(nl_proj_service_new(&c) == NULL && strstr(nl_last_error(), "q5_k") != NULL);
    c.precision = NULL;
    c.precision_map = "mlp";
    CHECK(nl_proj_service_new(&c) == NULL && strstr(nl_last_error(), "mlp") != NULL);
    c.precision_map = "mlp=q4_k"; /* no quantizer */
    CHECK(nl_proj_service_new(&c) == NULL);
    c.precision_map = NULL;
    c.backend = "npu";
    CHECK(nl_proj_service_new(&c) == NULL && strstr(nl_last_error(), "npu") != NULL);
    s = svc(NULL, NULL, 1, 0);
    v = tw_view(&a, "x", NL_CLASS_ATTN);
    v.type = 13; /* q5_k */
    CHECK(nl_proj_add(s, &v) == -1 && strstr(nl_last_error(), "q5_k") != NULL);
    v = tw_view(&q8, "x", NL_CLASS_ATTN);
    v.n_in = 40;
    CHECK(nl_proj_add(s, &v) == -1);
    v = tw_view(&a, "x", NL_CLASS_ATTN);
    v.data = NULL;
    CHECK(nl_proj_add(s, &v) == -1);
    CHECK(nl_proj_get(s, 0) == NULL && nl_proj_count(s) == 0);
    nl_proj_service_free(s);

    tw_free(&a);
    tw_free(&r);
    tw_free(&e);
    tw_free(&h16);
    tw_free(&q8);
    tw_free(&q4k);
    tw_free(&big);
    tw_free(&odd);
    tw_free(&q8r);
}

/* ---- queue, counters, threads ------------------------------------------------------------- */

static void test_queue_and_counters(void) {
    nl_t_rng_state = 7;
    tw w;
    tw_make(&w, NL_TYPE_Q8_0, 96, 13, 1.0f);
    nl_proj_service *s = svc(NULL, NULL, 2, 0);
    nl_proj_weight v = tw_view(&w, "blk.0.ffn_gate.weight", NL_CLASS_MLP);
    int id = nl_proj_add(s, &v);
    float *x = rand_vec(9 * 96, 1.0f), *y = malloc(sizeof(float) * 9 * 96), *y2 = malloc(sizeof(float) * 9 * 96);

    CHECK(nl_proj_wait(s) == -1); /* nothing in flight */
    CHECK(nl_proj_submit(s, id, NL_FWD, x, 9, y) == 0);
    CHECK(nl_proj_submit(s, id, NL_FWD, x, 9, y2) == -1);
    CHECK(strstr(nl_last_error(), "in flight") != NULL);
    CHECK(nl_proj_add(s, &v) == -1); /* no registration mid-request either */
    CHECK(nl_proj_wait(s) == 0);
    CHECK(nl_proj_wait(s) == -1);
    CHECK(nl_proj_run(s, id, NL_FWD, x, 9, y2) == 0);
    CHECK(memcmp(y, y2, sizeof(float) * 9 * 13) == 0);
    CHECK(nl_proj_submit(s, 5, NL_FWD, x, 9, y) == -1); /* bad id: nothing in flight */
    CHECK(nl_proj_submit(s, id, NL_BWD, x, 4, y) == 0); /* x is 4 x 13 here */
    CHECK(nl_proj_wait(s) == 0);
    CHECK(nl_proj_run(s, id, NL_BWD, x, 0, y) == 0); /* empty request */

    nl_proj_stats st;
    nl_proj_get_stats(s, &st);
    CHECK(st.requests[NL_FWD] == 2 && st.requests[NL_BWD] == 2);
    CHECK(st.tokens[NL_FWD] == 18 && st.tokens[NL_BWD] == 4);
    CHECK(st.busy_s[NL_FWD] > 0 && st.busy_s[NL_BWD] > 0);
    CHECK(st.retries == 0 && st.fallbacks == 0 && st.routed_tokens == 0 && st.padded_tokens == 0);

    /* freeing with a request in flight waits for it */
    CHECK(nl_proj_submit(s, id, NL_FWD, x, 9, y) == 0);
    nl_proj_service_free(s);

    /* strict mode: the second submit is a programming error and asserts */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        nl_proj_config c = {0};
        c.strict = 1;
        nl_proj_service *ss = nl_proj_service_new(&c);
        int i = nl_proj_add(ss, &v);
        nl_proj_submit(ss, i, NL_FWD, x, 9, y);
        nl_proj_submit(ss, i, NL_FWD, x, 9, y2);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d", status);

    free(x);
    free(y);
    free(y2);
    tw_free(&w);
}

static void test_threads_identical(void) {
    nl_t_rng_state = 31;
    const int types[3] = {NL_TYPE_Q8_0, NL_TYPE_F16, NL_TYPE_Q4_K};
    for (int ti = 0; ti < 3; ti++) {
        const int64_t K = types[ti] == NL_TYPE_Q4_K ? 768 : 672, N = 37;
        const int T = 11;
        tw w;
        tw_make(&w, types[ti], K, N, 1.0f);
        float *xf = rand_vec((size_t)(T * K), 1.0f), *xb = rand_vec((size_t)(T * N), 1.0f);
        float *yf[3], *yb[3];
        const int th[3] = {1, 2, 4};
        for (int i = 0; i < 3; i++) {
            nl_proj_service *s = svc(NULL, "*=keep", th[i], 0);
            nl_proj_weight v = tw_view(&w, "w", NL_CLASS_ATTN);
            int id = nl_proj_add(s, &v);
            yf[i] = malloc(sizeof(float) * (size_t)(T * N));
            yb[i] = malloc(sizeof(float) * (size_t)(T * K));
            CHECK(nl_proj_run(s, id, NL_FWD, xf, T, yf[i]) == 0);
            CHECK(nl_proj_run(s, id, NL_BWD, xb, T, yb[i]) == 0);
            nl_proj_service_free(s);
        }
        for (int i = 1; i < 3; i++) {
            CHECKF(memcmp(yf[0], yf[i], sizeof(float) * (size_t)(T * N)) == 0, "fwd %s threads %d",
                   nl_type_name(types[ti]), th[i]);
            CHECKF(memcmp(yb[0], yb[i], sizeof(float) * (size_t)(T * K)) == 0, "bwd %s threads %d",
                   nl_type_name(types[ti]), th[i]);
        }
        double *yd = malloc(sizeof(double) * (size_t)(T * K));
        ref64(&w, NL_BWD, xb, T, yd);
        CHECK(max_rel(yb[0], yd, (size_t)(T * K)) < 1e-6);
        for (int i = 0; i < 3; i++) {
            free(yf[i]);
            free(yb[i]);
        }
        free(yd);
        free(xf);
        free(xb);
        tw_free(&w);
    }
}

/* The training defaults (nl_proj_config_defaults: host backend, every core up to 8, precision
 * auto) keep Q5_0, Q4_K and Q6_K weights (the Gemma 3 file's types) resident as stored, in every
 * class: the registered bytes in place, resident bytes = stored bytes, nothing converted; the
 * plan passes every check (nothing routed to ref), and FWD and BWD of one-hot rows give one
 * effective weight from those bytes in both directions: to_float's value, rounded to BF16 when
 * the service computes in bf16 or on the BF16 tiles (kernels.h; auto picks the tiles on a CPU
 * with usable AMX, or with NL_AMX=emulate). */
static void test_resident_as_stored(void) {
    nl_t_rng_state = 17;
    static const struct {
        int type, cls;
        int64_t K, N;
    } ws[] = {
        {NL_TYPE_Q5_0, NL_CLASS_ATTN, 640, 40}, {NL_TYPE_Q5_0, NL_CLASS_MLP, 96, 67},
        {NL_TYPE_Q4_K, NL_CLASS_ATTN, 512, 24}, {NL_TYPE_Q6_K, NL_CLASS_MLP, 768, 19},
        {NL_TYPE_Q4_K, NL_CLASS_HEAD, 256, 33},
    };
    enum { NW = sizeof ws / sizeof ws[0] };
    nl_proj_config c;
    nl_proj_config_defaults(&c);
    nl_proj_service *s = nl_proj_service_new(&c);
    CHECKF(s != NULL, "%s", nl_last_error());
    if (!s) return;
    const char *cm = nl_proj_compute(s);
    const int bf16 = !strcmp(cm, "bf16") || !strcmp(cm, "amx") || !strcmp(cm, "amx-emu"); /* no recurrent class here */
    tw w[NW];
    int id[NW];
    uint64_t stored[NL_TYPE_COUNT] = {0};
    char name[NW][32];
    for (int i = 0; i < NW; i++) {
        tw_make(&w[i], ws[i].type, ws[i].K, ws[i].N, 1.0f);
        snprintf(name[i], sizeof name[i], "blk.%d.w.weight", i);
        nl_proj_weight v = tw_view(&w[i], name[i], ws[i].cls);
        id[i] = nl_proj_add(s, &v);
        CHECKF(id[i] >= 0, "%s", nl_last_error());
        stored[ws[i].type] += nl_row_bytes(ws[i].type, ws[i].K) * (uint64_t)ws[i].N;
        const nl_proj_weight *r = nl_proj_get(s, id[i]);
        CHECKF(r->type == ws[i].type && r->data == w[i].data, "%s: resident %s, %s", nl_type_name(ws[i].type),
               nl_type_name(r->type), r->data == w[i].data ? "in place" : "a copy");
    }
    for (int t = 0; t < NL_TYPE_COUNT; t++)
        if (stored[t])
            CHECKF(nl_proj_resident_bytes(s, -1, t) == stored[t], "%s: resident %llu B, stored %llu B", nl_type_name(t),
                   (unsigned long long)nl_proj_resident_bytes(s, -1, t), (unsigned long long)stored[t]);
    CHECK(nl_proj_converted_bytes(s) == 0);
    CHECK(nl_proj_plan(s, NULL, 0) == 0);
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(s, &tot);
    CHECKF(tot.checks > 0 && tot.routed == 0, "%d checks, %d routed", tot.checks, tot.routed);
    for (int i = 0; i < NW; i++) {
        const int64_t K = ws[i].K, N = ws[i].N;
        for (int d = 0; d < 2; d++) {
            /* FWD: row t = e_t (t < K) gives column t of W; BWD: row t = e_t (t < N) gives row t */
            const int64_t T = d ? N : K, in = d ? N : K, out = d ? K : N;
            float *x = calloc((size_t)(T * in), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(T * out));
            for (int64_t t = 0; t < T; t++) x[t * in + t] = 1.0f;
            CHECK(nl_proj_run(s, id[i], (nl_dir)d, x, (int)T, y) == 0);
            int bad = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t o = 0; o < out; o++) {
                    float want = d ? w[i].wf[t * K + o] : w[i].wf[o * K + t];
                    if (bf16) want = nl_t_bf16_round(want);
                    bad += y[t * out + o] != want;
                }
            CHECKF(bad == 0, "%s %s one-hot (%s compute): %d of %lld differ from the stored weight",
                   nl_type_name(ws[i].type), d ? "bwd" : "fwd", nl_proj_compute(s), bad, (long long)(T * out));
            free(x);
            free(y);
        }
    }
    nl_proj_service_free(s);
    for (int i = 0; i < NW; i++) tw_free(&w[i]);
}

/* ---- planner ------------------------------------------------------------------------------ */

/* A test backend around ref: wrong by 10% in BWD, unsupported for T > 4, and it records
 * every T it was asked to run. */
static int fake_seen_bad_T;
static int fake_init(void **ctx, int n, const char *compute) { return nl_proj_backend_ref.init(ctx, n, compute); }
static void fake_free(void *ctx) { nl_proj_backend_ref.free(ctx); }
static int fake_supports(void *ctx, const nl_proj_weight *w, nl_dir dir, int T) {
    (void)ctx;
    (void)w;
    (void)dir;
    return T <= 4;
}
static int fake_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    if (T != 2 && T != 4) fake_seen_bad_T++;
    if (nl_proj_backend_ref.run(ctx, w, dir, x, T, y)) return -1;
    if (dir == NL_BWD)
        for (int64_t i = 0; i < (int64_t)T * w->n_in; i++) y[i] *= 1.1f;
    return 0;
}
static const char *fake_compute(const void *ctx) {
    (void)ctx;
    return "bf16";
}
static const nl_proj_backend fake_backend = {"fake", fake_init, fake_supports, fake_run, fake_free, 0,   NULL,
                                             NULL,   NULL,      NULL,          NULL,     NULL,      NULL};

static void test_planner(void) {
    nl_t_rng_state = 5;
    tw a, m, emb;
    tw_make(&a, NL_TYPE_F32, 64, 9, 1.0f);
    tw_make(&m, NL_TYPE_Q4_0, 32, 7, 1.0f);
    tw_make(&emb, NL_TYPE_F16, 64, 5, 1.0f);
    char buf[128];

    /* ref backend: trivially all-pass, also with converted weights (a -> Q8_0) */
    nl_proj_service *s = svc(NULL, NULL, 2, 0);
    nl_proj_weight va = tw_view(&a, "blk.0.attn_q.weight", NL_CLASS_ATTN);
    nl_proj_weight vm = tw_view(&m, "blk.0.ffn_up.weight", NL_CLASS_MLP);
    nl_proj_weight ve = tw_view(&emb, "token_embd.weight", NL_CLASS_EMBED);
    nl_proj_add(s, &va);
    nl_proj_add(s, &vm);
    nl_proj_add(s, &ve);
    const int bk[3] = {4, 2, 4};
    CHECK(nl_proj_plan(s, bk, 3) == 0);
    nl_proj_plan_format_summary(s, buf, sizeof buf);
    CHECKF(strcmp(buf, "8 checks, 8 passed, 0 routed to CPU") == 0, "%s", buf);
    for (int i = 0; i < nl_proj_plan_check_count(s); i++) {
        const nl_proj_check *c = nl_proj_plan_get_check(s, i);
        if (c->id == 0) CHECKF(c->rel_err > 1e-4 && c->rel_err < 2e-2, "q8_0 conversion err %g", c->rel_err);
        if (c->id == 1) CHECK(c->rel_err == 0);
    }
    CHECK(nl_proj_plan_get_check(s, 8) == NULL);
    char *tab = nl_proj_plan_format_table(s);
    CHECK(tab && strstr(tab, "blk.0.attn_q.weight") && strstr(tab, "q8_0") && strstr(tab, "ok"));
    free(tab);
    nl_proj_service_free(s);

    /* fake backend: BWD is wrong (routed), T > 4 unsupported (routed), FWD on T <= 4 passes */
    nl_proj_config c = {0};
    c.backend_impl = &fake_backend;
    c.precision_map = "*=keep";
    c.n_threads = 2;
    s = nl_proj_service_new(&c);
    CHECK(s != NULL);
    CHECK(s && strcmp(nl_proj_compute(s), "f32") == 0); /* no compute hook: f32 */
    {
        /* the service asks the backend's hook, whatever the backend */
        static const nl_proj_backend bf16_backend = {"fake16", fake_init, fake_supports, fake_run, fake_free,
                                                     0,        NULL,      fake_compute,  NULL,     NULL,
                                                     NULL,     NULL,      NULL};
        nl_proj_config c16 = c;
        c16.backend_impl = &bf16_backend;
        nl_proj_service *s16 = nl_proj_service_new(&c16);
        CHECK(s16 && strcmp(nl_proj_compute(s16), "bf16") == 0);
        if (s16) nl_proj_service_free(s16);
    }
    int ia = nl_proj_add(s, &va);
    nl_proj_add(s, &vm);
    nl_proj_add(s, &ve);
    const int bk2[3] = {8, 2, 4};
    CHECK(nl_proj_plan(s, bk2, 3) == 0);
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(s, &tot);
    CHECK(tot.checks == 12 && tot.passed == 4 && tot.routed == 8);
    nl_proj_plan_format_summary(s, buf, sizeof buf);
    CHECKF(strcmp(buf, "12 checks, 4 passed, 8 routed to CPU") == 0, "%s", buf);
    tab = nl_proj_plan_format_table(s);
    CHECK(tab && strstr(tab, "unsupported") && strstr(tab, "above bound"));
    free(tab);
    for (int i = 0; i < tot.checks; i++) {
        const nl_proj_check *k = nl_proj_plan_get_check(s, i);
        CHECK(k->passed == (k->dir == NL_FWD && k->T <= 4));
        if (k->dir == NL_BWD && k->T <= 4) CHECK(k->rel_err > 0.05 && k->rel_err < 0.2);
    }
    /* requests after planning: T = 13 -> 8 (routed to ref) + 4 + 1 padded to 2 */
    nl_proj_stats st0, st1;
    nl_proj_get_stats(s, &st0);
    nl_proj_entry_stats ef0, eb0, ef1, eb1, em0, em1;
    CHECK(nl_proj_get_entry_stats(s, ia, NL_FWD, &ef0) == 0 && nl_proj_get_entry_stats(s, ia, NL_BWD, &eb0) == 0);
    CHECK(nl_proj_get_entry_stats(s, ia + 1, NL_FWD, &em0) == 0);
    CHECK(nl_proj_get_entry_stats(s, nl_proj_count(s), NL_FWD, &em1) == -1);
    float *x = rand_vec(13 * 64, 1.0f), *y = malloc(sizeof(float) * 13 * 64);
    double *yd = malloc(sizeof(double) * 13 * 64);
    fake_seen_bad_T = 0;
    CHECK(nl_proj_run(s, ia, NL_FWD, x, 13, y) == 0);
    CHECK(fake_seen_bad_T == 0);
    ref64(&a, NL_FWD, x, 13, yd);
    CHECK(max_rel(y, yd, 13 * 9) < 1e-6);
    nl_proj_get_stats(s, &st1);
    CHECK(st1.routed_tokens - st0.routed_tokens == 8);
    CHECK(st1.padded_tokens - st0.padded_tokens == 1);
    /* BWD routed to ref everywhere: exact, the fake never runs */
    CHECK(nl_proj_run(s, ia, NL_BWD, x, 13, y) == 0);
    ref64(&a, NL_BWD, x, 13, yd);
    CHECK(max_rel(y, yd, 13 * 64) < 1e-6);
    CHECK(fake_seen_bad_T == 0);
    nl_proj_get_stats(s, &st1);
    CHECK(st1.routed_tokens - st0.routed_tokens == 8 + 13);
    CHECK(st1.retries == 0 && st1.fallbacks == 0);
    /* the per-weight counters: one request of 13 rows each way on ia, none on the next weight */
    CHECK(nl_proj_get_entry_stats(s, ia, NL_FWD, &ef1) == 0 && nl_proj_get_entry_stats(s, ia, NL_BWD, &eb1) == 0);
    CHECK(nl_proj_get_entry_stats(s, ia + 1, NL_FWD, &em1) == 0);
    CHECK(ef1.requests - ef0.requests == 1 && ef1.tokens - ef0.tokens == 13 && ef1.busy_s > ef0.busy_s);
    CHECK(eb1.requests - eb0.requests == 1 && eb1.tokens - eb0.tokens == 13 && eb1.busy_s > eb0.busy_s);
    CHECK(em1.requests == em0.requests && em1.tokens == em0.tokens);
    /* a projection added after the plan is not validated: ref */
    int late = nl_proj_add(s, &va);
    CHECK(nl_proj_run(s, late, NL_FWD, x, 3, y) == 0);
    nl_proj_get_stats(s, &st0);
    CHECK(st0.routed_tokens - st1.routed_tokens == 3);
    nl_proj_service_free(s);

    free(x);
    free(y);
    free(yd);
    tw_free(&a);
    tw_free(&m);
    tw_free(&emb);
}

/* The planner at sizes where it compares sampled columns + probes instead of every output.
 * A backend around ref that corrupts what the globals say: one output column (or every column
 * with bad_col = -1, or the last row with bad_col = -2) of one direction, scaled by bad_scale,
 * or set to NaN. */
static int bad_dir, bad_col, bad_nan;
static double bad_scale;
static int colbad_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    if (nl_proj_backend_ref.run(ctx, w, dir, x, T, y)) return -1;
    if ((int)dir != bad_dir) return 0;
    const int64_t n_out = dir == NL_FWD ? w->n_out : w->n_in;
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < n_out; c++) {
            const int hit = bad_col == -1 || c == bad_col || (bad_col == -2 && t == T - 1);
            if (hit) y[t * n_out + c] = bad_nan ? NAN : (float)(y[t * n_out + c] * bad_scale);
        }
    return 0;
}
static const nl_proj_backend colbad_backend = {"colbad", fake_init, fake_supports, colbad_run, fake_free, 0,   NULL,
                                               NULL,     NULL,      NULL,          NULL,       NULL,      NULL};

/* Plan one projection with colbad; returns the largest and smallest rel_err of direction dir
 * (over the buckets {2, 4}) and whether every check of that direction failed / passed. */
static void plan_colbad(const tw *w, int threads, int dir, double *lo, double *hi, int *all_fail, int *all_pass) {
    nl_proj_config c = {0};
    c.backend_impl = &colbad_backend;
    c.precision_map = "*=keep";
    c.n_threads = threads;
    nl_proj_service *s = nl_proj_service_new(&c);
    nl_proj_weight v = tw_view(w, "blk.0.ffn_up.weight", NL_CLASS_MLP);
    CHECK(s && nl_proj_add(s, &v) == 0);
    const int bk[2] = {2, 4};
    CHECK(nl_proj_plan(s, bk, 2) == 0);
    *lo = INFINITY;
    *hi = -INFINITY;
    *all_fail = *all_pass = 1;
    for (int i = 0; i < nl_proj_plan_check_count(s); i++) {
        const nl_proj_check *k = nl_proj_plan_get_check(s, i);
        if ((int)k->dir != dir) continue;
        *lo = fmin(*lo, k->rel_err);
        *hi = fmax(*hi, k->rel_err);
        if (isnan(k->rel_err)) *lo = *hi = NAN;
        if (k->passed) *all_fail = 0;
        else *all_pass = 0;
    }
    nl_proj_service_free(s);
}

static void test_planner_sampled(void) {
    nl_t_rng_state = 77;
    /* K·N = 320000 > 2^18 and both n_out > 64: the sampled + probe comparison, FWD and BWD */
    tw w;
    tw_make(&w, NL_TYPE_F32, 320, 1000, 1.0f);
    double lo, hi;
    int fail, pass;
    /* a correct backend passes with a float-rounding error (f32 bound 1e-5) */
    bad_dir = -1;
    for (int d = 0; d < 2; d++) {
        plan_colbad(&w, 2, d, &lo, &hi, &fail, &pass);
        CHECKF(pass && hi < 1e-6, "dir %d: correct backend rel err %g", d, hi);
    }
    /* every output 1 + 3e-4: the estimate is the full Frobenius error, 3e-4 */
    bad_col = -1;
    bad_scale = 1.0 + 3e-4;
    bad_nan = 0;
    for (int d = 0; d < 2; d++) {
        bad_dir = d;
        plan_colbad(&w, 2, d, &lo, &hi, &fail, &pass);
        CHECKF(fail && fabs(lo - 3e-4) < 3e-6 && fabs(hi - 3e-4) < 3e-6, "dir %d: uniform error %g..%g", d, lo, hi);
    }
    /* ONE column wrong by 1%, anywhere (mostly columns no sample holds): caught in every bucket.
     * Its full Frobenius error is about 1e-2/sqrt(n_out) (3e-4 FWD, 6e-4 BWD) >> 1e-5. */
    const int cols[] = {0, 1, 63, 64, 137, 319, 500, 998, 999};
    bad_scale = 1.01;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
            const int n_out = d == NL_FWD ? 1000 : 320;
            if (cols[i] >= n_out) continue;
            bad_dir = d;
            bad_col = cols[i];
            plan_colbad(&w, 2, d, &lo, &hi, &fail, &pass);
            /* at least about the full error (probes); at most 1e-2 (when it is a sampled
             * column, the sampled comparison gives it weight 1/PLAN_S: stricter) */
            const double expect = 1e-2 / sqrt((double)n_out);
            CHECKF(fail && lo > expect / 4 && hi <= 1e-2, "dir %d col %d: rel err %g..%g (about %g)", d, cols[i], lo,
                   hi, expect);
            /* the other direction is untouched */
            plan_colbad(&w, 2, !d, &lo, &hi, &fail, &pass);
            CHECK(pass);
        }
    /* a NaN in one column, or a wrong last row of the bucket */
    bad_nan = 1;
    bad_col = 555;
    bad_dir = NL_FWD;
    plan_colbad(&w, 2, NL_FWD, &lo, &hi, &fail, &pass);
    CHECK(fail && isnan(lo));
    bad_nan = 0;
    bad_col = -2;
    bad_scale = 0.9;
    for (int d = 0; d < 2; d++) {
        bad_dir = d;
        plan_colbad(&w, 2, d, &lo, &hi, &fail, &pass);
        CHECKF(fail && lo > 1e-2, "dir %d: wrong last row, rel err %g", d, lo);
    }
    /* the planner's numbers do not depend on the thread count */
    bad_col = 137;
    bad_scale = 1.01;
    for (int d = 0; d < 2; d++) {
        bad_dir = d;
        double lo1, hi1, lo3, hi3;
        plan_colbad(&w, 1, d, &lo1, &hi1, &fail, &pass);
        plan_colbad(&w, 3, d, &lo3, &hi3, &fail, &pass);
        CHECK(lo1 == lo3 && hi1 == hi3);
    }
    bad_dir = -1;
    tw_free(&w);
}

/* The host backend through the service: policy-converted weights, planner, buckets, wire. */
static void test_host_service(void) {
    nl_t_rng_state = 21;
    const int types[5] = {NL_TYPE_F32, NL_TYPE_F16, NL_TYPE_Q8_0, NL_TYPE_Q4_K, NL_TYPE_Q6_K};
    const int classes[5] = {NL_CLASS_ATTN, NL_CLASS_RECURRENT, NL_CLASS_MLP, NL_CLASS_MLP, NL_CLASS_HEAD};
    for (int wire = 0; wire < 2; wire++) {
        nl_proj_config c = {0};
        c.backend = "host";
        c.n_threads = 2;
        c.wire_f16 = wire;
        nl_proj_service *s = nl_proj_service_new(&c);
        CHECKF(s != NULL, "%s", nl_last_error());
        if (!s) return;
        tw w[5];
        for (int i = 0; i < 5; i++) {
            tw_make(&w[i], types[i], 512, 19, 0.5f);
            nl_proj_weight v = tw_view(&w[i], "blk.0.w", classes[i]);
            CHECK(nl_proj_add(s, &v) == i);
        }
        const int bk[2] = {4, 8};
        CHECK(nl_proj_plan(s, bk, 2) == 0);
        char buf[128];
        nl_proj_plan_format_summary(s, buf, sizeof buf);
        nl_proj_plan_totals tot;
        nl_proj_plan_get_totals(s, &tot);
        CHECK(tot.checks == 20);
        /* every failure must be an unsupported type, never an error above its bound */
        for (int i = 0; i < tot.checks; i++) {
            const nl_proj_check *k = nl_proj_plan_get_check(s, i);
            CHECKF(k->passed || !k->supported, "wire %d %s dir %d T %d err %g bound %g", wire,
                   nl_type_name(nl_proj_get(s, k->id)->type), k->dir, k->T, k->rel_err, k->bound);
        }
        for (int i = 0; i < 5; i++)
            for (int d = 0; d < 2; d++) {
                const int T = 11;
                const int64_t in = d ? 19 : 512, out = d ? 512 : 19;
                float *x = rand_vec((size_t)(T * in), 1.0f), *y = malloc(sizeof(float) * (size_t)(T * out));
                double *yd = malloc(sizeof(double) * (size_t)(T * out));
                CHECK(nl_proj_run(s, i, (nl_dir)d, x, T, y) == 0);
                ref64(&w[i], (nl_dir)d, x, T, yd);
                double num = 0, den = 0;
                for (int64_t j = 0; j < T * out; j++) {
                    num += (y[j] - yd[j]) * (y[j] - yd[j]);
                    den += yd[j] * yd[j];
                }
                CHECKF(sqrt(num / den) < 3e-2, "host wire %d type %s dir %d: rel err %g", wire, nl_type_name(types[i]),
                       d, sqrt(num / den));
                free(x);
                free(y);
                free(yd);
            }
        /* host is an any_T backend: with every bucket validated, a request goes whole (no
         * padding) and equals the rows sent one at a time, bit for bit */
        for (int i = 0; i < 5; i++)
            for (int d = 0; d < 2; d++) {
                const int T = 11;
                const int64_t in = d ? 19 : 512, out = d ? 512 : 19;
                float *x = rand_vec((size_t)(T * in), 1.0f), *y = malloc(sizeof(float) * (size_t)(T * out));
                float *y1 = malloc(sizeof(float) * (size_t)(T * out));
                nl_proj_stats st0, st1;
                nl_proj_get_stats(s, &st0);
                CHECK(nl_proj_run(s, i, (nl_dir)d, x, T, y) == 0);
                nl_proj_get_stats(s, &st1);
                int all_ok = 1;
                for (int k = 0; k < tot.checks; k++) {
                    const nl_proj_check *ck = nl_proj_plan_get_check(s, k);
                    if (ck->id == i && (int)ck->dir == d) all_ok &= ck->passed;
                }
                if (all_ok)
                    CHECKF(st1.padded_tokens == st0.padded_tokens, "type %s dir %d: padded %d", nl_type_name(types[i]),
                           d, (int)(st1.padded_tokens - st0.padded_tokens));
                for (int t = 0; t < T; t++) CHECK(nl_proj_run(s, i, (nl_dir)d, x + t * in, 1, y1 + t * out) == 0);
                CHECKF(memcmp(y, y1, sizeof(float) * (size_t)(T * out)) == 0, "wire %d type %s dir %d: whole != rows",
                       wire, nl_type_name(types[i]), d);
                free(x);
                free(y);
                free(y1);
            }
        nl_proj_service_free(s);
        for (int i = 0; i < 5; i++) tw_free(&w[i]);
    }
}

/* ---- the FP16 wire ---------------------------------------------------------------------- */

static void test_wire(void) {
    nl_t_rng_state = 11;
    nl_proj_stats st;
    /* 1. tiny gradients: every input underflows FP16 unscaled; scaled, the result is accurate */
    {
        tw w;
        tw_make(&w, NL_TYPE_F32, 64, 9, 1.0f);
        nl_proj_service *s = svc(NULL, "*=keep", 1, 1);
        nl_proj_weight v = tw_view(&w, "blk.0.attn_o.weight", NL_CLASS_ATTN);
        int id = nl_proj_add(s, &v);
        const int T = 3;
        float *x = rand_vec((size_t)T * 9, 2e-9f), *y = malloc(sizeof(float) * T * 64);
        double *yd = malloc(sizeof(double) * T * 64);
        int under = 0;
        for (int i = 0; i < T * 9; i++) under += nl_f16_to_f32(nl_f32_to_f16(x[i])) == 0.0f;
        CHECK(under == T * 9);
        CHECK(nl_proj_run(s, id, NL_BWD, x, T, y) == 0);
        ref64(&w, NL_BWD, x, T, yd);
        double e = max_rel(y, yd, (size_t)T * 64);
        CHECKF(e < 2e-3 && e > 0, "wire rel err %g", e);
        float *xf = rand_vec((size_t)T * 64, 3e-8f);
        CHECK(nl_proj_run(s, id, NL_FWD, xf, T, y) == 0);
        ref64(&w, NL_FWD, xf, T, yd);
        CHECKF(max_rel(y, yd, (size_t)T * 9) < 2e-3, "fwd wire rel err %g", max_rel(y, yd, (size_t)T * 9));
        nl_proj_get_stats(s, &st);
        CHECK(st.retries == 0 && st.fallbacks == 0);
        nl_proj_service_free(s);
        free(x);
        free(xf);
        free(y);
        free(yd);
        tw_free(&w);
    }
    /* 2. a row that overflows once and fits on the retry; 3. a row that never fits */
    {
        float W[3][32];
        for (int n = 0; n < 3; n++)
            for (int k = 0; k < 32; k++) W[n][k] = n == 0 ? 0.9375f : 0.01f * (float)(k - n);
        float Wb[3][32];
        memcpy(Wb, W, sizeof W);
        Wb[0][7] = 1e30f; /* overflows FP16 whatever the scale */
        nl_proj_service *s = svc(NULL, "*=keep", 2, 1);
        nl_proj_weight v = {"blk.0.ffn_down.weight", NL_TYPE_F32, 32, 3, W, NL_CLASS_MLP};
        int id = nl_proj_add(s, &v);
        v.data = Wb;
        int idb = nl_proj_add(s, &v);
        float x[2][32], y[2][3];
        for (int k = 0; k < 32; k++) {
            x[0][k] = 1.0f; /* row 0: max 1 -> scaled to 2048 -> y0 = 61440: finite in FP16 but >= 60000 */
            x[1][k] = 0.001f * (float)(k - 16); /* row 1: fits at once */
        }
        CHECK(nl_proj_run(s, id, NL_FWD, &x[0][0], 2, &y[0][0]) == 0);
        nl_proj_get_stats(s, &st);
        CHECKF(st.retries == 1 && st.fallbacks == 0, "retries %llu fallbacks %llu", (unsigned long long)st.retries,
               (unsigned long long)st.fallbacks);
        CHECK(y[0][0] == 30.0f);
        double want = 0;
        for (int k = 0; k < 32; k++) want += (double)x[1][k] * W[1][k];
        CHECK_NEAR(y[1][1], want, fabs(want) * 2e-3);

        CHECK(nl_proj_run(s, idb, NL_FWD, &x[0][0], 2, &y[0][0]) == 0);
        nl_proj_get_stats(s, &st);
        /* row 0 of idb: three retries, then ref; row 1 also hits 1e30 * 0.007 -> also never fits */
        CHECKF(st.retries == 1 + 3 + 3 && st.fallbacks == 2, "retries %llu fallbacks %llu",
               (unsigned long long)st.retries, (unsigned long long)st.fallbacks);
        double y00 = 0;
        for (int k = 0; k < 32; k++) y00 += (double)Wb[0][k];
        CHECK(isfinite(y[0][0]) && fabs(y[0][0] - y00) <= 1e-6 * y00);
        CHECK(isfinite(y[1][0]));
        /* BWD through the wire as well: column 7 of idb never fits, the rest is exact */
        float g[1][3] = {{1.0f, 0, 0}}, gx[1][32];
        CHECK(nl_proj_run(s, idb, NL_BWD, &g[0][0], 1, &gx[0][0]) == 0);
        CHECK(gx[0][7] == 1e30f && gx[0][5] == 0.9375f);
        nl_proj_get_stats(s, &st);
        CHECK(st.retries == 10 && st.fallbacks == 3);
        g[0][1] = 0.5f;
        CHECK(nl_proj_run(s, id, NL_BWD, &g[0][0], 1, &gx[0][0]) == 0);
        CHECK_NEAR(gx[0][5], 0.9375 + 0.5 * 0.01 * 4, 1e-3);
        nl_proj_get_stats(s, &st);
        CHECK(st.retries == 10 && st.fallbacks == 3 && st.requests[NL_BWD] == 2 && st.requests[NL_FWD] == 2);
        nl_proj_service_free(s);
    }
}

/* ---- the planner's verdict cache (nl_proj_config.plan_cache_dir) -------------------------- */

/* fake_backend (BWD 10% wrong, T > 4 unsupported) counting its runs */
static int cache_runs;
static int counting_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    cache_runs++;
    return fake_run(ctx, w, dir, x, T, y);
}
static const nl_proj_backend counting_backend = {
    "counting", fake_init, fake_supports, counting_run, fake_free, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static const nl_proj_backend counting_backend2 = {
    "counting2", fake_init, fake_supports, counting_run, fake_free, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

/* A service of (a, m) on backend be with the cache in dir, planned on buckets {2, 4, 8}; the
 * backend's runs it took, its summary in sum. */
static nl_proj_service *cached_plan(const nl_proj_backend *be, int threads, const char *dir, tw *a, tw *m, int *runs,
                                    char *sum, size_t cap) {
    nl_proj_config c = {0};
    c.backend_impl = be;
    c.precision_map = "*=keep";
    c.n_threads = threads;
    c.plan_cache_dir = dir;
    nl_proj_service *s = nl_proj_service_new(&c);
    CHECK(s != NULL);
    if (!s) return NULL;
    nl_proj_weight va = tw_view(a, "blk.0.attn_q.weight", NL_CLASS_ATTN),
                   vm = tw_view(m, "blk.0.ffn_up.weight", NL_CLASS_MLP);
    CHECK(nl_proj_add(s, &va) == 0 && nl_proj_add(s, &vm) == 1);
    const int bk[3] = {2, 4, 8};
    cache_runs = 0;
    CHECKF(nl_proj_plan(s, bk, 3) == 0, "%s", nl_last_error());
    *runs = cache_runs;
    nl_proj_plan_format_summary(s, sum, cap);
    return s;
}

/* The same verdicts, errors and routes. */
static int same_plan(const nl_proj_service *x, const nl_proj_service *y) {
    if (!x || !y || nl_proj_plan_check_count(x) != nl_proj_plan_check_count(y)) return 0;
    for (int i = 0; i < nl_proj_plan_check_count(x); i++) {
        const nl_proj_check *p = nl_proj_plan_get_check(x, i), *q = nl_proj_plan_get_check(y, i);
        if (p->passed != q->passed || p->supported != q->supported ||
            !(p->rel_err == q->rel_err || (isnan(p->rel_err) && isnan(q->rel_err))))
            return 0;
    }
    return 1;
}

static int count_files(const char *dir, char *one, size_t cap) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "plan-", 5)) {
            n++;
            snprintf(one, cap, "%s/%s", dir, e->d_name);
        }
    if (d) closedir(d);
    return n;
}

static void test_plan_cache(void) {
    char dir[128], file[512], sum[1024], cmd[700];
    snprintf(dir, sizeof dir, "/tmp/nl_test_proj_cache_%d/plan", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/nl_test_proj_cache_%d", (int)getpid());
    CHECK(system(cmd) == 0);
    nl_t_rng_state = 11;
    tw a, m;
    tw_make(&a, NL_TYPE_F32, 64, 9, 1.0f);
    tw_make(&m, NL_TYPE_Q4_0, 32, 7, 1.0f);
    int runs;
    /* a miss: checked, written (the directory made) */
    nl_proj_service *s0 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 8 && !strstr(sum, "plan cache"), "%d runs: %s", runs,
           sum); /* T <= 4: 2 weights x 2 dirs x 2 buckets */
    CHECK(!strcmp(sum, "12 checks, 4 passed, 8 routed to CPU"));
    CHECK(count_files(dir, file, sizeof file) == 1);
    /* private: the directory 0700, the file 0600 */
    struct stat pst;
    CHECK(stat(dir, &pst) == 0 && (pst.st_mode & 0777) == 0700 && stat(file, &pst) == 0 &&
          (pst.st_mode & 0777) == 0600);
    /* a hit: only the sample (one projection of the two: its 4 supported checks) runs, the same
     * verdicts, said */
    nl_proj_service *s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 4 && strstr(sum, "12 checks, 4 passed, 8 routed to CPU; verdicts from the plan cache ") &&
               strstr(sum, file),
           "%d runs: %s", runs, sum);
    CHECK(same_plan(s0, s1));
    nl_proj_service_free(s1);
    /* forged: every failing verdict (BWD is 10% wrong) set to 0 with the checksum recomputed, as
     * an attacker who knows the format would; the sample catches it, all is checked again, the
     * routes are the honest ones and the file is rewritten honest */
    {
        size_t fl = 0;
        unsigned char *fb = (unsigned char *)nl_t_slurp(file, &fl), *honest = fb ? malloc(fl) : NULL;
        CHECK(fb && honest && fl == 16 + 12 * 16 + 8);
        if (fb && honest) {
            memcpy(honest, fb, fl);
            for (int i = 0; i < 12; i++) {
                double e;
                memcpy(&e, fb + 16 + i * 16 + 8, 8);
                if (!(e <= 1e-5)) memset(fb + 16 + i * 16 + 8, 0, 8); /* NaN (unsupported) or over the bound */
            }
            uint64_t h = nl_hash64(fb, fl - 8, 0x6e6c706366ull);
            for (int i = 0; i < 8; i++) fb[fl - 8 + i] = (unsigned char)(h >> (8 * i));
            FILE *f = fopen(file, "wb");
            CHECK(f && fwrite(fb, 1, fl, f) == fl);
            if (f) fclose(f);
            s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
            CHECKF(runs == 4 + 8 && strstr(sum, "12 checks, 4 passed, 8 routed to CPU; plan cache ") &&
                       strstr(sum, "forged or stale): checked again"),
                   "forged: %d runs: %s", runs, sum);
            CHECK(same_plan(s0, s1));
            nl_proj_service_free(s1);
            size_t l2 = 0;
            char *again = nl_t_slurp(file, &l2);
            CHECKF(again && l2 == fl && !memcmp(again, honest, fl), "the forged file was not rewritten");
            free(again);
            /* not ours, or writable by others, or in a directory others can write: ignored */
            for (int k = geteuid() == 0 ? 0 : 1; k < 3; k++) { /* chown needs root */
                char c2[700];
                snprintf(c2, sizeof c2,
                         k == 0   ? "chown 65534 %s"
                         : k == 1 ? "chmod 0666 %s"
                                  : "chmod 0777 $(dirname %s)",
                         file);
                CHECK(system(c2) == 0);
                s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
                const char *want = k == 0   ? "owned by uid 65534, mode 0600"
                                   : k == 1 ? "mode 0666: only a file of uid"
                                            : "mode 0777: others could replace";
                CHECKF(runs == 8 && strstr(sum, want) && strstr(sum, "): checked again") && same_plan(s0, s1),
                       "perm %d: %d runs: %s", k, runs, sum);
                nl_proj_service_free(s1);
                CHECK(stat(dir, &pst) == 0 && (pst.st_mode & 0777) == 0700 && stat(file, &pst) == 0 &&
                      pst.st_uid == geteuid() && (pst.st_mode & 0777) == 0600);
            }
        }
        free(fb);
        free(honest);
    }
    /* a weight byte changed: checked again, another file */
    ((unsigned char *)m.data)[5] ^= 0x10;
    s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 8 && !strstr(sum, "plan cache"), "changed weight: %d runs: %s", runs, sum);
    CHECK(count_files(dir, file, sizeof file) == 2);
    nl_proj_service_free(s1);
    ((unsigned char *)m.data)[5] ^= 0x10;
    /* other kernels (another backend's name), another thread count: checked again */
    s1 = cached_plan(&counting_backend2, 2, dir, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 8 && !strstr(sum, "plan cache"), "other kernels: %d runs: %s", runs, sum);
    nl_proj_service_free(s1);
    s1 = cached_plan(&counting_backend, 1, dir, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 8, "other threads: %d runs", runs);
    nl_proj_service_free(s1);
    CHECK(count_files(dir, file, sizeof file) == 4);
    /* the first file again: damaged in each way, ignored with the reason, checked, written anew */
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(system(cmd) == 0);
    s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
    nl_proj_service_free(s1);
    CHECK(count_files(dir, file, sizeof file) == 1);
    size_t len = 0;
    char *good = nl_t_slurp(file, &len);
    CHECK(good && len == 16 + 12 * 16 + 8);
    static const char *const why[] = {"checksum mismatch: corrupt", "bytes holding 13 verdicts",
                                      "not a plan cache (10 bytes", "version 9"};
    for (int k = 0; k < 4 && good; k++) {
        char *bad = malloc(len);
        memcpy(bad, good, len);
        size_t blen = len;
        if (k == 0) bad[40] ^= 1; /* an error's bits */
        if (k == 1) bad[12] = 13; /* a count the size does not hold */
        if (k == 2) blen = 10;    /* cut short */
        if (k == 3) bad[8] = 9;   /* another format version */
        FILE *f = fopen(file, "wb");
        CHECK(f && fwrite(bad, 1, blen, f) == blen);
        if (f) fclose(f);
        free(bad);
        s1 = cached_plan(&counting_backend, 2, dir, &a, &m, &runs, sum, sizeof sum);
        CHECKF(runs == 8 && strstr(sum, "ignored (") && strstr(sum, why[k]) && strstr(sum, "): checked again"),
               "damage %d: %d runs: %s", k, runs, sum);
        CHECK(same_plan(s0, s1));
        nl_proj_service_free(s1);
        CHECK(nl_t_same_file(file, file) && nl_t_file_has(file, "NLPLANC1"));
        size_t l2 = 0;
        char *again = nl_t_slurp(file, &l2);
        CHECKF(again && l2 == len && !memcmp(again, good, len), "damage %d: not written anew", k);
        free(again);
    }
    free(good);
    /* a directory that cannot be made: the plan is whole, the summary says so */
    char blocked[200];
    snprintf(blocked, sizeof blocked, "%s/file/plan", dir);
    snprintf(cmd, sizeof cmd, "touch %s/file", dir);
    CHECK(system(cmd) == 0);
    s1 = cached_plan(&counting_backend, 2, blocked, &a, &m, &runs, sum, sizeof sum);
    CHECKF(runs == 8 && strstr(sum, "; plan cache not written: ") && same_plan(s0, s1), "%s", sum);
    nl_proj_service_free(s1);
    nl_proj_service_free(s0);
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/nl_test_proj_cache_%d", (int)getpid());
    CHECK(system(cmd) == 0);
    free(a.data);
    free(a.wf);
    free(m.data);
    free(m.wf);
}

int main(void) {
    test_plan_cache();
    test_ref_all_types();
    test_policy();
    test_queue_and_counters();
    test_threads_identical();
    test_resident_as_stored();
    test_planner();
    test_planner_sampled();
    test_host_service();
    test_wire();
    return nl_t_done();
}

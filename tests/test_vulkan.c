/* test_vulkan: the `vulkan` projection backend (proj/vulkan.c) on whatever Vulkan device the
 * machine has (CI: lavapipe, Mesa's CPU driver) — the host backend's tests for it:
 *   - one-hot rows, FWD and BWD, every type with a shader: the effective weights are model/quant's
 *     to_float values (what the host backend's f32 kernels give) bit for bit;
 *   - random data, odd shapes, against a float64 reference with the host's f32 bound;
 *   - the same bits run to run, for any T (row t of a T-row run = a 1-row run of row t), with
 *     the weights split across buffers (a forced small buffer limit), through a staging copy;
 *   - the service: buckets and the planner (every check passes; a weight the device cannot
 *     hold is routed to the CPU), the FP16 wire with its retries;
 *   - the CLI: a training run of a tiny model of each architecture (llama, qwen3, qwen35, gemma3)
 *     on --backend vulkan whose losses match the host backend's, and a resume on another backend
 *     refused unless --allow-kernel-change;
 *   - the C API's device choice (nightlora_model_params.device, ABI 4): device 0 opens, its
 *     logits match the host backend's; a device index the machine lacks is an error.
 * Skipped (exit 77, "SKIPPED: ..." line) where the build or the machine has no Vulkan. */
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include "nightlora.h"
#include "model/model.h"
#include "model/quant.h"
#include "proj/host.h"
#include "proj/proj.h"
#include "proj/proj_impl.h"
#include "proj/vulkan.h"
#include "test.h"
#include "util/util.h"

#if defined(NL_HAVE_VULKAN)

static const int all_types[] = {NL_TYPE_F32,  NL_TYPE_F16,  NL_TYPE_BF16, NL_TYPE_Q8_0, NL_TYPE_Q4_0,
                                NL_TYPE_Q4_1, NL_TYPE_Q5_0, NL_TYPE_Q4_K, NL_TYPE_Q6_K};
#define N_TYPES ((int)(sizeof all_types / sizeof *all_types))

static void *vk_new(void) {
    void *ctx = NULL;
    if (nl_proj_backend_vulkan.init(&ctx, 1, NULL)) {
        fprintf(stderr, "vulkan init: %s\n", nl_last_error());
        return NULL;
    }
    return ctx;
}

/* random weights of any type: F32 and BF16 from uniform values, the rest as test.h makes them */
static uint8_t *rand_weight(int type, int N, int K) {
    const size_t rb = nl_row_bytes(type, K);
    uint8_t *w = malloc(rb * (size_t)N);
    if (type == NL_TYPE_F32 || type == NL_TYPE_BF16) {
        float *row = malloc(sizeof(float) * (size_t)K);
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < K; k++) row[k] = (float)nl_t_rand();
            nl_type_get(type)->from_float(row, w + rb * (size_t)n, K);
        }
        free(row);
    } else {
        nl_t_rand_weight(type, N, K, w);
    }
    return w;
}

static float *dequant(int type, const uint8_t *w, int N, int K) {
    float *wd = malloc(sizeof(float) * (size_t)N * K);
    const size_t rb = nl_row_bytes(type, K);
    for (int n = 0; n < N; n++) nl_type_get(type)->to_float(w + rb * (size_t)n, wd + (size_t)n * K, K);
    return wd;
}

/* FWD of e_k is column k of the dequantized W, BWD of e_n is row n: bit for bit (as floats) */
static void test_one_hot(void *ctx, int type, int N, int K) {
    uint8_t *w = rand_weight(type, N, K);
    float *wd = dequant(type, w, N, K);
    nl_proj_weight pw = {.name = "w", .type = type, .n_in = K, .n_out = N, .data = w};
    const int M = K > N ? K : N;
    float *x = calloc((size_t)M * M, sizeof(float)), *y = malloc(sizeof(float) * (size_t)M * M);
    for (int t = 0; t < K; t++) x[(size_t)t * K + t] = 1.0f;
    CHECK(nl_proj_backend_vulkan.supports(ctx, &pw, NL_FWD, K) == 1);
    CHECKF(nl_proj_backend_vulkan.run(ctx, &pw, NL_FWD, x, K, y) == 0, "%s", nl_last_error());
    int bad = 0;
    for (int t = 0; t < K; t++)
        for (int n = 0; n < N; n++) bad += y[(size_t)t * N + n] != wd[(size_t)n * K + t];
    CHECKF(bad == 0, "type %s fwd one-hot: %d mismatches", nl_type_name(type), bad);
    memset(x, 0, sizeof(float) * (size_t)M * M);
    for (int t = 0; t < N; t++) x[(size_t)t * N + t] = 1.0f;
    CHECKF(nl_proj_backend_vulkan.run(ctx, &pw, NL_BWD, x, N, y) == 0, "%s", nl_last_error());
    bad = 0;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) bad += y[(size_t)t * K + k] != wd[(size_t)t * K + k];
    CHECKF(bad == 0, "type %s bwd one-hot: %d mismatches", nl_type_name(type), bad);
    /* the host backend's f32 kernels see the same effective weights */
    void *h = NULL;
    CHECK(nl_proj_backend_host.init(&h, 1, "f32") == 0);
    if (h && nl_proj_backend_host.supports(h, &pw, NL_BWD, N)) {
        float *yh = malloc(sizeof(float) * (size_t)N * K);
        CHECK(nl_proj_backend_host.run(h, &pw, NL_BWD, x, N, yh) == 0);
        bad = 0;
        for (size_t i = 0; i < (size_t)N * K; i++) bad += yh[i] != y[i];
        CHECKF(bad == 0, "type %s: host and vulkan one-hot rows differ in %d", nl_type_name(type), bad);
        free(yh);
    }
    if (h) nl_proj_backend_host.free(h);
    free(w);
    free(wd);
    free(x);
    free(y);
}

/* |y - ref| <= tol·Σ|x·w| with the host's f32 tolerance */
static void check_accuracy(void *ctx, int type, int N, int K, int T, nl_dir dir) {
    uint8_t *w = rand_weight(type, N, K);
    float *wd = dequant(type, w, N, K);
    const int nin = dir == NL_FWD ? K : N, nout = dir == NL_FWD ? N : K;
    float *x = malloc(sizeof(float) * (size_t)T * nin), *y = malloc(sizeof(float) * (size_t)T * nout);
    for (int i = 0; i < T * nin; i++) x[i] = (float)(nl_t_rand() * 3.0);
    for (int i = 0; i < T * nout; i++) y[i] = NAN;
    nl_proj_weight pw = {.name = "w", .type = type, .n_in = K, .n_out = N, .data = w};
    CHECKF(nl_proj_backend_vulkan.run(ctx, &pw, dir, x, T, y) == 0, "%s", nl_last_error());
    const double tol = 2e-6 * (1 + log2((double)nin));
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++)
        for (int o = 0; o < nout && bad < 3; o++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < nin; i++) {
                const double wv = dir == NL_FWD ? wd[(size_t)o * K + i] : wd[(size_t)i * K + o];
                ref += (double)x[(size_t)t * nin + i] * wv;
                mag += fabs((double)x[(size_t)t * nin + i] * wv);
            }
            if (!(fabs((double)y[(size_t)t * nout + o] - ref) <= tol * mag + 1e-30)) {
                bad++;
                fprintf(stderr, "type %s %s N=%d K=%d T=%d: y[%d][%d] = %.9g, ref %.9g\n", nl_type_name(type),
                        dir == NL_FWD ? "fwd" : "bwd", N, K, T, t, o, y[(size_t)t * nout + o], ref);
            }
        }
    CHECK(bad == 0);
    free(w);
    free(wd);
    free(x);
    free(y);
}

/* the same bits: twice, T vs 1-row runs, split across buffers, through staging */
static void test_bits(void *ctx, int type) {
    const int N = 200, K = type == NL_TYPE_Q4_K || type == NL_TYPE_Q6_K ? 512 : 320, T = 37;
    uint8_t *w = rand_weight(type, N, K);
    nl_proj_weight pw = {.name = "w", .type = type, .n_in = K, .n_out = N, .data = w};
    float *x = malloc(sizeof(float) * T * (K > N ? K : N));
    for (int i = 0; i < T * (K > N ? K : N); i++) x[i] = (float)nl_t_rand();
    void *small = vk_new();
    CHECK(small != NULL);
    /* a limit of a few rows: the weight in several buffers, requests in row chunks */
    const uint64_t lim = 4096 > nl_row_bytes(type, K) * 5 ? 4096 : (nl_row_bytes(type, K) * 5 + 3) / 4 * 4;
    CHECKF(small && nl_proj_vulkan_set_buffer_limit(small, lim) == 0, "%s", nl_last_error());
    setenv("NL_VULKAN_STAGING", "1", 1);
    void *staged = vk_new();
    unsetenv("NL_VULKAN_STAGING");
    CHECK(staged != NULL);
    for (int d = 0; d < 2; d++) {
        const int nout = d == NL_FWD ? N : K, nin = d == NL_FWD ? K : N;
        const size_t n = (size_t)T * nout;
        float *y0 = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * n), *y1r = malloc(sizeof(float) * nout);
        CHECK(nl_proj_backend_vulkan.run(ctx, &pw, (nl_dir)d, x, T, y0) == 0);
        CHECK(nl_proj_backend_vulkan.run(ctx, &pw, (nl_dir)d, x, T, y1) == 0);
        CHECKF(memcmp(y0, y1, sizeof(float) * n) == 0, "type %s dir %d: two runs differ", nl_type_name(type), d);
        int bad = 0;
        for (int t = 0; t < T; t += 5) {
            CHECK(nl_proj_backend_vulkan.run(ctx, &pw, (nl_dir)d, x + (size_t)t * nin, 1, y1r) == 0);
            bad += memcmp(y1r, y0 + (size_t)t * nout, sizeof(float) * nout) != 0;
        }
        CHECKF(bad == 0, "type %s dir %d: T=1 differs from T=%d", nl_type_name(type), d, T);
        if (small) {
            CHECKF(nl_proj_backend_vulkan.run(small, &pw, (nl_dir)d, x, T, y1) == 0, "%s", nl_last_error());
            CHECKF(nl_proj_vulkan_weight_parts(small, &pw) > 2, "type %s: %d parts", nl_type_name(type),
                   nl_proj_vulkan_weight_parts(small, &pw));
            bad = 0;
            for (size_t i = 0; i < n; i++) bad += y0[i] != y1[i];
            CHECKF(bad == 0, "type %s dir %d: split into %d buffers of %llu bytes: %d outputs differ",
                   nl_type_name(type), d, nl_proj_vulkan_weight_parts(small, &pw), (unsigned long long)lim, bad);
        }
        if (staged) {
            CHECK(nl_proj_backend_vulkan.run(staged, &pw, (nl_dir)d, x, T, y1) == 0);
            CHECKF(memcmp(y0, y1, sizeof(float) * n) == 0, "type %s dir %d: staged upload differs", nl_type_name(type),
                   d);
        }
        free(y0);
        free(y1);
        free(y1r);
    }
    if (small) nl_proj_backend_vulkan.free(small);
    if (staged) nl_proj_backend_vulkan.free(staged);
    free(w);
    free(x);
}

/* a weight is uploaded once, whatever the requests */
static void test_upload_once(void *ctx) {
    int n0;
    nl_proj_vulkan_uploaded_bytes(ctx, &n0);
    uint8_t *w = rand_weight(NL_TYPE_Q8_0, 64, 96);
    nl_proj_weight pw = {.name = "w", .type = NL_TYPE_Q8_0, .n_in = 96, .n_out = 64, .data = w};
    float x[3 * 96], y[3 * 96];
    for (int i = 0; i < 3 * 96; i++) x[i] = (float)nl_t_rand();
    for (int r = 0; r < 3; r++) {
        CHECK(nl_proj_backend_vulkan.run(ctx, &pw, NL_FWD, x, 3, y) == 0);
        CHECK(nl_proj_backend_vulkan.run(ctx, &pw, NL_BWD, x, 3, y) == 0);
    }
    int n1;
    nl_proj_vulkan_uploaded_bytes(ctx, &n1);
    CHECKF(n1 == n0 + 1, "%d uploads for one weight", n1 - n0);
    CHECK(nl_proj_vulkan_weight_parts(ctx, &pw) == 1);
    free(w);
}

static void test_errors(void *ctx) {
    uint8_t w[64] = {0};
    nl_proj_weight pw = {.name = "w", .type = NL_TYPE_Q8_0, .n_in = 48, .n_out = 1, .data = w};
    CHECK(nl_proj_backend_vulkan.supports(ctx, &pw, NL_FWD, 4) == 0); /* K not a block multiple */
    pw.n_in = 32;
    pw.type = 10; /* q2_k: no shader (and no decoder): unsupported, the planner routes it */
    CHECK(nl_proj_backend_vulkan.supports(ctx, &pw, NL_FWD, 4) == 0);
    void *bad = NULL;
    CHECK(nl_proj_backend_vulkan.init(&bad, 1, "fp8") == -1 && bad == NULL);
    CHECK(nl_proj_backend_vulkan.init_device(&bad, 1, NULL, "99") == -1 && strstr(nl_last_error(), "device 99"));
    CHECK(nl_proj_backend_vulkan.init_device(&bad, 1, NULL, "x") == -1 && strstr(nl_last_error(), "device index"));
    nl_proj_config cfg = {.backend = "host", .n_threads = 1, .device = "0"};
    CHECK(nl_proj_service_new(&cfg) == NULL && strstr(nl_last_error(), "no devices to choose"));
    char d[512];
    CHECK(nl_proj_backend_vulkan.describe(ctx, d, sizeof d) > 0 && strstr(d, "f32 compute on device"));
}

/* The service on vulkan: planned buckets, requests off the buckets, against host */
static void test_service(void) {
    nl_proj_config cfg = {.backend = "vulkan", .n_threads = 1, .precision = "keep"};
    nl_proj_service *s = nl_proj_service_new(&cfg);
    CHECKF(s != NULL, "%s", nl_last_error());
    nl_proj_config hc = {.backend = "host", .n_threads = 1, .precision = "keep", .compute = "f32"};
    nl_proj_service *h = nl_proj_service_new(&hc);
    CHECK(h != NULL);
    if (!s || !h) return;
    uint8_t *ws[N_TYPES + 1];
    for (int i = 0; i < N_TYPES; i++) {
        const int K = all_types[i] == NL_TYPE_Q4_K || all_types[i] == NL_TYPE_Q6_K ? 256 : 96, N = 70 + i;
        ws[i] = rand_weight(all_types[i], N, K);
        nl_proj_weight w = {.name = nl_type_name(all_types[i]),
                            .type = all_types[i],
                            .n_in = K,
                            .n_out = N,
                            .data = ws[i],
                            .cls = NL_CLASS_MLP};
        CHECK(nl_proj_add(s, &w) == i && nl_proj_add(h, &w) == i);
    }
    /* an F32 weight whose row is larger than the buffers once they are lowered: routed */
    ws[N_TYPES] = rand_weight(NL_TYPE_F32, 3, 2048);
    nl_proj_weight big = {
        .name = "wide", .type = NL_TYPE_F32, .n_in = 2048, .n_out = 3, .data = ws[N_TYPES], .cls = NL_CLASS_MLP};
    CHECK(nl_proj_add(s, &big) == N_TYPES && nl_proj_add(h, &big) == N_TYPES);
    CHECK(nl_proj_vulkan_set_buffer_limit(s->be_ctx, 4096) == 0);
    const int buckets[] = {1, 16, 40};
    CHECKF(nl_proj_plan(s, buckets, 3) == 0, "%s", nl_last_error());
    CHECK(nl_proj_plan(h, buckets, 3) == 0);
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(s, &tot);
    CHECKF(tot.checks == (N_TYPES + 1) * 6 && tot.passed == N_TYPES * 6 && tot.routed == 6,
           "%d checks, %d passed, %d routed", tot.checks, tot.passed, tot.routed);
    char sum[256];
    nl_proj_plan_format_summary(s, sum, sizeof sum);
    printf("plan: %s\n", sum);
    for (int i = 0; i <= N_TYPES; i++)
        for (int d = 0; d < 2; d++) {
            const nl_proj_weight *w = nl_proj_get(s, i);
            const int nin = d == NL_FWD ? (int)w->n_in : (int)w->n_out,
                      nout = d == NL_FWD ? (int)w->n_out : (int)w->n_in;
            const int T = 53; /* 40 + 1 x 13: two buckets */
            float *x = malloc(sizeof(float) * (size_t)T * nin), *y = malloc(sizeof(float) * (size_t)T * nout),
                  *yh = malloc(sizeof(float) * (size_t)T * nout);
            for (int k = 0; k < T * nin; k++) x[k] = (float)nl_t_rand();
            CHECK(nl_proj_submit(s, i, (nl_dir)d, x, T, y) == 0);
            CHECK(nl_proj_wait(s) == 0);
            CHECK(nl_proj_run(h, i, (nl_dir)d, x, T, yh) == 0);
            double e = 0, m = 0;
            for (int k = 0; k < T * nout; k++) {
                e += ((double)y[k] - yh[k]) * ((double)y[k] - yh[k]);
                m += (double)yh[k] * yh[k];
            }
            CHECKF(sqrt(e / m) < 1e-5, "%s dir %d: vulkan vs host %.3g", w->name, d, sqrt(e / m));
            free(x);
            free(y);
            free(yh);
        }
    nl_proj_stats st;
    nl_proj_get_stats(s, &st);
    CHECKF(st.routed_tokens == 2 * 53, "routed tokens %llu", (unsigned long long)st.routed_tokens);
    nl_proj_service_free(s);
    nl_proj_service_free(h);
    for (int i = 0; i <= N_TYPES; i++) free(ws[i]);
}

/* The FP16 wire around vulkan: the rows scaled and rounded, a row that overflows sent again */
static void test_wire(void) {
    const int N = 40, K = 64, T = 5;
    nl_proj_config cfg = {.backend = "vulkan", .n_threads = 1, .precision = "keep", .wire_f16 = 1};
    nl_proj_config rc = {.backend = "ref", .n_threads = 1, .precision = "keep"};
    nl_proj_service *s = nl_proj_service_new(&cfg), *r = nl_proj_service_new(&rc);
    CHECK(s && r);
    if (!s || !r) return;
    float *wf = malloc(sizeof(float) * N * K);
    for (int i = 0; i < N * K; i++) wf[i] = (float)nl_t_rand() * (i < K ? 300.0f : 1.0f); /* row 0 overflows FP16 */
    nl_proj_weight w = {.name = "w", .type = NL_TYPE_F32, .n_in = K, .n_out = N, .data = wf, .cls = NL_CLASS_MLP};
    CHECK(nl_proj_add(s, &w) == 0 && nl_proj_add(r, &w) == 0);
    float x[T * K], y[T * N], yr[T * N];
    for (int i = 0; i < T * K; i++) x[i] = (float)nl_t_rand() * 100.0f;
    for (int i = 0; i < K; i++) x[i] = 1000.0f; /* every product of row 0's first output adds up */
    CHECK(nl_proj_run(s, 0, NL_FWD, x, T, y) == 0);
    CHECK(nl_proj_run(r, 0, NL_FWD, x, T, yr) == 0);
    nl_proj_stats st;
    nl_proj_get_stats(s, &st);
    CHECKF(st.retries > 0, "no row was sent again (%llu retries)", (unsigned long long)st.retries);
    /* the activations crossed as FP16 (2 bytes each; the outputs 4), the retries too */
    uint64_t out_b, in_b = nl_proj_vulkan_io_bytes(s->be_ctx, &out_b);
    CHECKF(in_b > 2 * (uint64_t)K * T && in_b * 2 * N == out_b * K,
           "wire bytes: %llu in, %llu out for %d rows and %llu retries", (unsigned long long)in_b,
           (unsigned long long)out_b, T, (unsigned long long)st.retries);
    double e = 0, m = 0;
    for (int i = 0; i < T * N; i++) {
        e += ((double)y[i] - yr[i]) * ((double)y[i] - yr[i]);
        m += (double)yr[i] * yr[i];
    }
    CHECKF(sqrt(e / m) < 1e-2, "wire vs ref: %.3g", sqrt(e / m));
    CHECKF(sqrt(e / m) > 0, "the wire changed nothing");
    free(wf);
    nl_proj_service_free(s);
    nl_proj_service_free(r);
}

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The number after `key` on each line starting with `prefix` -> loss[]: a training log's
 * "step N/M loss L" lines (prefix "step ", key "loss ", 4 decimals) or a --log-json file's
 * (prefix "{", key "\"loss\": ", full precision) */
static int read_losses(const char *path, const char *prefix, const char *key, double *loss, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *p = strstr(line, key);
        if (!strncmp(line, prefix, strlen(prefix)) && p) loss[n++] = strtod(p + strlen(key), NULL);
    }
    fclose(f);
    return n;
}

/* The CLI: a tiny model trained on vulkan and on host; losses within the planner's bound */
static void test_cli(const char *cpu_kind) {
    char dir[256], cmd[4096], path[512];
    if (nl_t_tmpdir(dir, sizeof dir, "vulkan")) {
        CHECK(0);
        return;
    }
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --arch qwen3 --preset tiny --out %s/m.gguf > /dev/null && "
             "printf '{\"text\": \"hello vulkan\"}\\n{\"text\": \"one more line of text\"}\\n{\"text\": \"and a "
             "third\"}\\n' > %s/d.jsonl",
             NL_CLI, dir, dir);
    CHECK(sh(cmd) == 0);
    const char *common = "--steps 4 --batch-tokens 48 --rank 4 --threads 2 --thermal off --seed 7";
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/h.gguf %s --backend host --compute f32 > "
             "%s/host.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir);
    CHECK(sh(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/v.gguf %s --backend vulkan --vulkan-device 0 "
             "--checkpoint-dir %s/ck --stop-after 2 > %s/vk.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/v.gguf %s --backend vulkan "
             "--checkpoint-dir %s/ck --resume >> %s/vk.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/vk.txt", dir);
    CHECKF(nl_t_file_has(path, "service: vulkan backend, f32 compute on device 0, "), "train does not name the device");
    CHECKF(nl_t_file_has(path, " 0 routed to CPU"),
           "the planner routed a projection of the tiny model away from vulkan");
    double lh[16], lv[16];
    char hp[512];
    snprintf(hp, sizeof hp, "%s/host.txt", dir);
    const int nh = read_losses(hp, "step ", "loss ", lh, 16), nv = read_losses(path, "step ", "loss ", lv, 16);
    CHECKF(nh == 4 && nv == 4, "%d host and %d vulkan loss lines", nh, nv);
    for (int i = 0; i < nh && i < nv; i++)
        CHECKF(fabs(lh[i] - lv[i]) <= 2e-2 * fabs(lh[i]), "step %d: loss %.6f on host, %.6f on vulkan", i + 1, lh[i],
               lv[i]);
    /* a resume on another backend: refused, unless asked */
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/v.gguf %s --steps 6 --backend host "
             "--checkpoint-dir %s/ck --resume > %s/r1.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECK(sh(cmd) != 0);
    snprintf(path, sizeof path, "%s/r1.txt", dir);
    CHECKF(nl_t_file_has(path, "--allow-kernel-change"), "the refused resume does not say how to continue");
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/v.gguf %s --steps 6 --backend host "
             "--checkpoint-dir %s/ck --resume --allow-kernel-change > %s/r2.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/r2.txt", dir);
    CHECKF(nl_t_file_has(path, "warning: resuming on other kernels"), "the accepted resume does not warn");
    /* bench proj on this backend: a CPU driver gets no speed figure, only the difference from ref */
    snprintf(cmd, sizeof cmd,
             "%s bench proj --model %s/m.gguf --backend vulkan --reps 1 --tokens 4 > %s/bench.txt 2>&1", NL_CLI, dir,
             dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/bench.txt", dir);
    CHECKF(nl_t_file_has(path, "vulkan backend: f32 compute on device") && nl_t_file_has(path, "vulkan ms"),
           "bench proj --backend vulkan");
    if (!strcmp(cpu_kind, "cpu"))
        CHECKF(nl_t_file_has(path, ": a CPU driver, no speed figure"), "bench proj on a CPU driver gave speed figures");
    snprintf(cmd, sizeof cmd,
             "%s bench proj --model %s/m.gguf --backend ref --reps 1 --tokens 4 --json > %s/bench.json 2>&1", NL_CLI,
             dir, dir);
    CHECK(sh(cmd) == 0);
    snprintf(path, sizeof path, "%s/bench.json", dir);
    CHECKF(nl_t_file_has(path, "\"ref_ms\": ") && nl_t_file_has(path, "\"backend\": \"ref\""),
           "bench proj --backend ref --json");
    nl_t_tmpdir_done(dir);
}

/* A tiny model of `arch` trained 4 steps on host (f32) and on vulkan: every loss within the
 * planner's bound, nothing routed away from the device. */
static void test_cli_arch(const char *arch) {
    char dir[256], cmd[4096], hp[512], vp[512];
    if (nl_t_tmpdir(dir, sizeof dir, "vulkan-arch")) {
        CHECK(0);
        return;
    }
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --arch %s --preset tiny --out %s/m.gguf > /dev/null && "
             "printf '{\"text\": \"hello vulkan, %s\"}\\n{\"text\": \"one more line of text\"}\\n{\"text\": \"and a "
             "third\"}\\n' > %s/d.jsonl",
             NL_CLI, arch, dir, arch, dir);
    CHECK(sh(cmd) == 0);
    const char *common = "--steps 4 --batch-tokens 48 --rank 4 --threads 2 --thermal off --seed 7";
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/h.gguf %s --backend host --compute f32 "
             "--log-json %s/host.jsonl > %s/host.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECKF(sh(cmd) == 0, "%s: train on host", arch);
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/m.gguf --data %s/d.jsonl --out %s/v.gguf %s --backend vulkan "
             "--log-json %s/vk.jsonl > %s/vk.txt 2>&1",
             NL_CLI, dir, dir, dir, common, dir, dir);
    CHECKF(sh(cmd) == 0, "%s: train on vulkan", arch);
    snprintf(hp, sizeof hp, "%s/host.txt", dir);
    snprintf(vp, sizeof vp, "%s/vk.txt", dir);
    CHECKF(nl_t_file_has(vp, "service: vulkan backend, f32 compute on device "), "%s: train does not name the device",
           arch);
    CHECKF(nl_t_file_has(vp, " 0 routed to CPU"),
           "%s: the planner routed a projection of the tiny model away from vulkan", arch);
    double lh[16], lv[16];
    snprintf(hp, sizeof hp, "%s/host.jsonl", dir);
    snprintf(vp, sizeof vp, "%s/vk.jsonl", dir);
    const int nh = read_losses(hp, "{", "\"loss\": ", lh, 16), nv = read_losses(vp, "{", "\"loss\": ", lv, 16);
    CHECKF(nh == 4 && nv == 4, "%s: %d host and %d vulkan loss lines", arch, nh, nv);
    double worst = 0;
    for (int i = 0; i < nh && i < nv; i++) {
        const double d = fabs(lh[i] - lv[i]) / fabs(lh[i]);
        if (d > worst) worst = d;
        CHECKF(d <= 2e-2, "%s step %d: loss %.6f on host, %.6f on vulkan", arch, i + 1, lh[i], lv[i]);
    }
    printf("vulkan: %s trains: 4 losses within %.2g of the host's f32 (relative; first %.9f vs %.9f)\n", arch, worst,
           lh[0], lv[0]);
    nl_t_tmpdir_done(dir);
}

/* The C API chooses the device: nightlora_model_params.device "0" opens on it (logits within the
 * f32 bound of the host backend's), an index past the last device is refused. */
static void test_api_device(void) {
    char dir[256], cmd[1024], model[512];
    if (nl_t_tmpdir(dir, sizeof dir, "vulkan-api")) {
        CHECK(0);
        return;
    }
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s mkmodel --arch llama --preset tiny --out %s > /dev/null", NL_CLI, model);
    CHECK(sh(cmd) == 0);
    nightlora_model_params mp;
    nightlora_model_default_params(&mp);
    mp.compute = "f32";
    nightlora_model *h = nightlora_model_open(model, &mp);
    mp.backend = "vulkan";
    mp.device = "0";
    nightlora_model *v = nightlora_model_open(model, &mp);
    CHECKF(h && v, "%s", nightlora_last_error());
    if (h && v) {
        const int32_t ids[] = {1, 17, 42, 99, 5, 250, 3};
        const int n = 7, nv = nightlora_model_n_vocab(h);
        float *lh = malloc(sizeof(float) * n * nv), *lv = malloc(sizeof(float) * n * nv);
        CHECK(lh && lv && nightlora_logits(h, ids, n, lh) == 0 && nightlora_logits(v, ids, n, lv) == 0);
        double worst = 0, scale = 0;
        for (int i = 0; lh && lv && i < n * nv; i++) {
            if (fabs(lh[i] - lv[i]) > worst) worst = fabs(lh[i] - lv[i]);
            if (fabs(lh[i]) > scale) scale = fabs(lh[i]);
        }
        CHECKF(worst <= 1e-3 * scale, "logits on vulkan device 0 differ from the host's by %g (scale %g)", worst,
               scale);
        free(lh);
        free(lv);
    }
    nightlora_model_close(h);
    nightlora_model_close(v);
    mp.device = "999";
    CHECK(nightlora_model_open(model, &mp) == NULL && strstr(nightlora_last_error(), "999"));
    nl_t_tmpdir_done(dir);
}

int main(void) {
    char why[512];
    if (!nl_proj_vulkan_available(why, sizeof why)) {
        printf("SKIPPED: no Vulkan device: %s\n", why);
        return 77;
    }
    void *ctx = vk_new();
    CHECK(ctx != NULL);
    if (!ctx) return nl_t_done();
    char d[512];
    nl_proj_backend_vulkan.describe(ctx, d, sizeof d);
    printf("vulkan: %s; buffers of %llu bytes\n", d, (unsigned long long)nl_proj_vulkan_buffer_limit(ctx));
    for (int i = 0; i < N_TYPES; i++) {
        const int t = all_types[i], blk = nl_type_get(t)->blck;
        test_one_hot(ctx, t, 37, blk == 256 ? 256 : blk == 32 ? 96 : 71);
        static const int Ts[] = {1, 3, 33, 70};
        for (int d2 = 0; d2 < 2; d2++)
            for (int ti = 0; ti < 4; ti++) {
                check_accuracy(ctx, t, 67, blk == 256 ? 512 : blk == 32 ? 160 : 37, Ts[ti], (nl_dir)d2);
                if (ti == 2) check_accuracy(ctx, t, 5, blk == 256 ? 256 : 32, Ts[ti], (nl_dir)d2);
            }
        test_bits(ctx, t);
    }
    test_upload_once(ctx);
    test_errors(ctx);
    char kind[32];
    snprintf(kind, sizeof kind, "%s", nl_proj_vulkan_device_kind(ctx));
    nl_proj_backend_vulkan.free(ctx);
    test_service();
    test_wire();
    test_cli(kind);
    test_cli_arch("llama");
    test_cli_arch("qwen35");
    test_cli_arch("gemma3");
    test_api_device();
    return nl_t_done();
}

#else

int main(void) {
    printf("SKIPPED: this build has no Vulkan backend (CMake left it out: no Vulkan headers, no glslc or "
           "-DNL_VULKAN=OFF)\n");
    return 77;
}

#endif

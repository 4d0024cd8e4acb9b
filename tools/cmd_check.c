/* nightlora check: what a run would see of a model, without running it. Loads the model,
 * registers every projection with the service (precision policy applied), runs the planner,
 * and reports: architecture and hyper-parameters, every projection (class, K×N, GGUF type ->
 * resident type, in place / converted / shared, bytes), resident memory per class, the
 * service's compute mode and kernels (its backend's describe), the planner summary (and with --verbose its per-check
 * table), and a memory estimate. --json prints the same as one JSON object.
 *
 * Exit status: 0 when the model loads and the planner ran (checks routed to the CPU are a
 * finding, not an error: the run stays correct), 1 on an error, 2 on a usage error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "util/json.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "model/quant.h"
#include "nn/forward.h"
#include "proj/proj.h"
#include "proj/vulkan.h"
#include "util/util.h"

static void fmt_bytes(char *buf, size_t cap, uint64_t b) {
    if (b >= 1000000000ull) snprintf(buf, cap, "%.2f GB", (double)b / 1e9);
    else if (b >= 1000000ull) snprintf(buf, cap, "%.2f MB", (double)b / 1e6);
    else if (b >= 1000ull) snprintf(buf, cap, "%.2f kB", (double)b / 1e3);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

/* How one projection is held. */
typedef struct {
    int model_idx;   /* index into m->projs */
    int sid;         /* service id */
    int shared_with; /* model index of the projection that registered sid first, or -1 */
    int gguf_type, res_type, cls;
    int64_t K, N;
    int in_place;   /* resident bytes are the GGUF mapping */
    uint64_t bytes; /* resident bytes */
} proj_row;

static const char *storage_name(const proj_row *r) {
    return r->shared_with >= 0 ? "shared" : r->in_place ? "in place" : "converted";
}

static void print_hparams(const nl_model *m) {
    const nl_hparams *h = &m->hp;
    int n_rec = 0;
    for (int l = 0; l < h->n_layer; l++) n_rec += m->layers[l].recurrent;
    printf("%s: n_vocab %d, n_embd %d, n_layer %d, n_ff %d, n_head %d, n_head_kv %d, head_dim %d, n_rot %d, "
           "n_ctx_train %d, rope_base %g, rope_freq_scale %g, rms_eps %g, %s head",
           nl_arch_name(m->arch), h->n_vocab, h->n_embd, h->n_layer, h->n_ff, h->n_head, h->n_head_kv, h->head_dim,
           h->n_rot, h->n_ctx_train, h->rope_base, h->rope_freq_scale, h->rms_eps, m->tied_head ? "tied" : "separate");
    if (m->arch == NL_ARCH_QWEN35)
        printf(", %d recurrent layers (ssm d_conv %d, d_state %d, n_group %d, dt_rank %d, d_inner %d, "
               "full_attn_interval %d)",
               n_rec, h->ssm_d_conv, h->ssm_d_state, h->ssm_n_group, h->ssm_dt_rank, h->ssm_d_inner,
               h->full_attn_interval);
    printf("\n");
}

static void json_hparams(const nl_model *m) {
    const nl_hparams *h = &m->hp;
    int n_rec = 0;
    for (int l = 0; l < h->n_layer; l++) n_rec += m->layers[l].recurrent;
    printf("{\"n_vocab\": %d, \"n_embd\": %d, \"n_layer\": %d, \"n_ff\": %d, \"n_head\": %d, \"n_head_kv\": %d, "
           "\"head_dim\": %d, \"n_rot\": %d, \"n_ctx_train\": %d, \"rope_base\": ",
           h->n_vocab, h->n_embd, h->n_layer, h->n_ff, h->n_head, h->n_head_kv, h->head_dim, h->n_rot, h->n_ctx_train);
    nl_cli_json_num(h->rope_base);
    printf(", \"rope_freq_scale\": ");
    nl_cli_json_num(h->rope_freq_scale);
    printf(", \"rms_eps\": ");
    nl_cli_json_num(h->rms_eps);
    printf(", \"tied_head\": %s, \"recurrent_layers\": %d", m->tied_head ? "true" : "false", n_rec);
    if (m->arch == NL_ARCH_QWEN35)
        printf(", \"ssm_d_conv\": %d, \"ssm_d_state\": %d, \"ssm_n_group\": %d, \"ssm_dt_rank\": %d, "
               "\"ssm_d_inner\": %d, \"full_attn_interval\": %d",
               h->ssm_d_conv, h->ssm_d_state, h->ssm_n_group, h->ssm_dt_rank, h->ssm_d_inner, h->full_attn_interval);
    printf("}");
}

int nl_cmd_check(int argc, char **argv) {
    static const char *const known[] = {"model",     "backend",       "vulkan-device", "threads", "wire",
                                        "precision", "precision-map", "compute",       NULL};
    static const char *const boolean[] = {"verbose", "json", "no-plan-cache", NULL};
    if (nl_cli_check("check", argc, argv, known, boolean)) return 2;
    const char *model = nl_cli_opt(argc, argv, "model");
    if (!model) {
        fprintf(stderr, "nightlora check: --model is required (see 'nightlora help check')\n");
        return 2;
    }
    nl_proj_config cfg;
    if (nl_cli_proj_config("check", argc, argv, &cfg)) return 2;
    nl_cli_plan_cache(argc, argv, &cfg);
    const int verbose = nl_cli_flag(argc, argv, "verbose"), json = nl_cli_flag(argc, argv, "json");
    cfg.verbose = 0; /* the report below is the verbose output */

    nl_model *m = nl_model_load(model);
    if (!m) return nl_cli_fail("check");
    {
        /* the vocabulary is part of what check checks (train, eval and generate load it) */
        nl_tokenizer *tok = NULL;
        int bad = nl_tokenizer_for_model(m, &tok);
        nl_tokenizer_free(tok);
        if (bad) {
            nl_model_free(m);
            return nl_cli_fail("check");
        }
    }
    nl_cli_model_warning("check", m);
    nl_proj_service *svc = nl_proj_service_new(&cfg);
    nl_runtime rt;
    memset(&rt, 0, sizeof rt);
    proj_row *rows = NULL;
    int rc = 1;
    if (!svc || nl_runtime_init(&rt, m, svc)) goto done;

    /* the arithmetic the service's backend runs ("f32" on ref; host: --compute or auto) */
    const char *compute = nl_proj_compute(svc);

    char kdesc[256]; /* what the service runs: "host: amx-bf16 for attn/mlp/head, ..." */
    nl_proj_describe(svc, kdesc, sizeof kdesc);

    rows = nl_calloc((size_t)m->n_projs, sizeof *rows);
    if (!rows) goto done;
    for (int i = 0; i < m->n_projs; i++) {
        proj_row *r = &rows[i];
        const nl_proj_desc *d = &m->projs[i];
        const nl_proj_weight *w = nl_proj_get(svc, rt.svc_id[i]);
        r->model_idx = i;
        r->sid = rt.svc_id[i];
        r->shared_with = -1;
        for (int j = 0; j < i; j++)
            if (rows[j].sid == r->sid) {
                r->shared_with = j;
                break;
            }
        r->gguf_type = d->w->type;
        r->res_type = w->type;
        r->cls = w->cls;
        r->K = d->n_in;
        r->N = d->n_out;
        r->in_place = w->data == d->w->data;
        r->bytes = (uint64_t)nl_row_bytes(w->type, w->n_in) * (uint64_t)w->n_out;
    }

    double t0 = nl_now();
    clock_t c0 = clock(); /* process CPU time, all threads: steadier than wall on a shared machine */
    if (nl_proj_plan(svc, NULL, 0)) goto done;
    const double plan_s = nl_now() - t0, plan_cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    nl_proj_plan_totals tot;
    nl_proj_plan_get_totals(svc, &tot);
    char summary[128], resident[1024], mbuf[32], cbuf[32], tbuf[32], rbuf[32];
    nl_proj_plan_format_summary(svc, summary, sizeof summary);
    nl_proj_format_resident(svc, resident, sizeof resident);
    int buckets[16], n_b = 0; /* the planner's buckets, from its checks (ascending per projection) */
    for (int i = 0; i < nl_proj_plan_check_count(svc); i++) {
        const nl_proj_check *c = nl_proj_plan_get_check(svc, i);
        int seen = 0;
        for (int b = 0; b < n_b; b++) seen |= buckets[b] == c->T;
        if (!seen && n_b < 16) buckets[n_b++] = c->T;
    }
    /* memory: the GGUF stays mapped (the ref fallback reads the original bytes) plus the
     * converted copies; the resident set of a run is about the resident weights */
    const uint64_t mapping = m->gguf->size, converted = nl_proj_converted_bytes(svc),
                   res_all = nl_proj_resident_bytes(svc, -1, -1);
    fmt_bytes(mbuf, sizeof mbuf, mapping);
    fmt_bytes(cbuf, sizeof cbuf, converted);
    fmt_bytes(tbuf, sizeof tbuf, mapping + converted);
    fmt_bytes(rbuf, sizeof rbuf, res_all);
    const char *precision = nl_cli_opt(argc, argv, "precision"), *pmap = nl_cli_opt(argc, argv, "precision-map");

    if (json) {
        printf("{\"model\": ");
        nl_cli_json_str(model);
        printf(", \"arch\": ");
        nl_cli_json_str(nl_arch_name(m->arch));
        printf(", \"hparams\": ");
        json_hparams(m);
        printf(", \"backend\": ");
        nl_cli_json_str(cfg.backend);
        printf(", \"threads\": %d, \"wire\": \"%s\", \"precision\": ", cfg.n_threads, cfg.wire_f16 ? "f16" : "f32");
        nl_cli_json_str(precision ? precision : "auto");
        printf(", \"precision_map\": ");
        nl_cli_json_str(pmap);
        printf(", \"compute\": ");
        nl_cli_json_str(compute);
        printf(", \"kernels\": ");
        nl_cli_json_str(kdesc);
        printf(",\n \"projections\": [");
        for (int i = 0; i < m->n_projs; i++) {
            const proj_row *r = &rows[i];
            printf("%s\n  {\"name\": ", i ? "," : "");
            nl_cli_json_str(m->projs[i].name);
            printf(", \"kind\": ");
            nl_cli_json_str(nl_proj_kind_name(m->projs[i].kind));
            printf(", \"class\": ");
            nl_cli_json_str(nl_proj_class_name((nl_proj_class)r->cls));
            printf(", \"k\": %lld, \"n\": %lld, \"gguf_type\": ", (long long)r->K, (long long)r->N);
            nl_cli_json_str(nl_type_name(r->gguf_type));
            printf(", \"type\": ");
            nl_cli_json_str(nl_type_name(r->res_type));
            printf(", \"storage\": \"%s\", \"bytes\": %llu, \"shared_with\": ", storage_name(r),
                   (unsigned long long)(r->shared_with >= 0 ? 0 : r->bytes));
            nl_cli_json_str(r->shared_with >= 0 ? m->projs[r->shared_with].name : NULL);
            printf("}");
        }
        printf("],\n \"resident\": {");
        int first = 1;
        for (int c = 0; c < NL_CLASS_COUNT; c++)
            for (int t = 0; t < NL_TYPE_COUNT; t++) {
                uint64_t b = nl_proj_resident_bytes(svc, c, t);
                if (!b) continue;
                printf("%s\"%s %s\": %llu", first ? "" : ", ", nl_proj_class_name((nl_proj_class)c), nl_type_name(t),
                       (unsigned long long)b);
                first = 0;
            }
        printf("}, \"resident_text\": ");
        nl_cli_json_str(resident);
        printf(", \"resident_bytes\": %llu, \"converted_bytes\": %llu, \"mapping_bytes\": %llu, "
               "\"memory_estimate_bytes\": %llu,\n",
               (unsigned long long)res_all, (unsigned long long)converted, (unsigned long long)mapping,
               (unsigned long long)(mapping + converted));
        printf(" \"planner\": {\"checks\": %d, \"passed\": %d, \"routed\": %d, \"summary\": ", tot.checks, tot.passed,
               tot.routed);
        nl_cli_json_str(summary);
        printf(", \"seconds\": ");
        nl_cli_json_num(plan_s);
        printf(", \"cpu_seconds\": ");
        nl_cli_json_num(plan_cpu);
        printf(", \"buckets\": [");
        for (int b = 0; b < n_b; b++) printf("%s%d", b ? ", " : "", buckets[b]);
        printf("], \"table\": [");
        for (int i = 0; i < tot.checks; i++) {
            const nl_proj_check *c = nl_proj_plan_get_check(svc, i);
            const nl_proj_weight *w = nl_proj_get(svc, c->id);
            printf("%s\n  {\"name\": ", i ? "," : "");
            nl_cli_json_str(w->name);
            printf(", \"dir\": \"%s\", \"T\": %d, \"type\": \"%s\", \"rel_err\": ", c->dir == NL_FWD ? "fwd" : "bwd",
                   c->T, nl_type_name(w->type));
            nl_cli_json_num(c->rel_err);
            printf(", \"bound\": ");
            nl_cli_json_num(c->bound);
            printf(", \"supported\": %s, \"passed\": %s}", c->supported ? "true" : "false",
                   c->passed ? "true" : "false");
        }
        printf("]}}\n");
        rc = 0;
        goto done;
    }

    printf("model %s\n", model);
    print_hparams(m);
    printf("backend %s, %d thread%s, wire %s, precision %s%s%s\n", cfg.backend, cfg.n_threads,
           cfg.n_threads == 1 ? "" : "s", cfg.wire_f16 ? "f16" : "f32", precision ? precision : "auto",
           pmap ? ", map " : "", pmap ? pmap : "");
    printf("compute %s\n", compute);
    printf("service kernels %s\n", kdesc);
    if (verbose && !strcmp(cfg.backend, "vulkan")) {
        char devs[2048];
        if (nl_proj_vulkan_list(devs, sizeof devs) >= 0) printf("vulkan devices (--vulkan-device N):\n%s\n", devs);
    }

    printf("\nprojections (%d%s):\n", m->n_projs,
           verbose ? "" : ", grouped by class, shape and types; --verbose lists each");
    if (verbose) {
        printf("  %-32s %-6s %-9s %13s  %-15s %-10s %10s\n", "name", "kind", "class", "K x N", "gguf -> type",
               "storage", "bytes");
        for (int i = 0; i < m->n_projs; i++) {
            const proj_row *r = &rows[i];
            char shape[40], types[40], bytes[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)r->K, (long long)r->N);
            snprintf(types, sizeof types, "%s -> %s", nl_type_name(r->gguf_type), nl_type_name(r->res_type));
            fmt_bytes(bytes, sizeof bytes, r->bytes);
            printf("  %-32s %-6s %-9s %13s  %-15s %-10s %10s", m->projs[i].name, nl_proj_kind_name(m->projs[i].kind),
                   nl_proj_class_name((nl_proj_class)r->cls), shape, types, storage_name(r), bytes);
            if (r->shared_with >= 0) printf("  (= %s)", m->projs[r->shared_with].name);
            printf("\n");
        }
    } else {
        printf("  %5s %-9s %-14s %13s  %-15s %-10s %10s %10s\n", "count", "class", "kinds", "K x N", "gguf -> type",
               "storage", "each", "total");
        int *done_grp = nl_calloc((size_t)m->n_projs, sizeof *done_grp);
        if (!done_grp) goto done;
        for (int i = 0; i < m->n_projs; i++) {
            if (done_grp[i]) continue;
            const proj_row *r = &rows[i];
            int count = 0;
            uint64_t total = 0;
            char kinds[64] = "";
            for (int j = i; j < m->n_projs; j++) {
                const proj_row *q = &rows[j];
                if (q->cls == r->cls && q->K == r->K && q->N == r->N && q->gguf_type == r->gguf_type &&
                    q->res_type == r->res_type && !strcmp(storage_name(q), storage_name(r))) {
                    done_grp[j] = 1;
                    count++;
                    /* the kinds in the group, once each: "gate/up" */
                    const char *k = nl_proj_kind_name(m->projs[j].kind);
                    char pat[24], padded[80];
                    snprintf(pat, sizeof pat, "/%s/", k);
                    snprintf(padded, sizeof padded, "/%s/", kinds);
                    if (!strstr(padded, pat) && strlen(kinds) + strlen(k) + 2 < sizeof kinds) {
                        if (kinds[0]) strcat(kinds, "/");
                        strcat(kinds, k);
                    }
                    total += q->shared_with >= 0 ? 0 : q->bytes;
                }
            }
            char shape[40], types[40], each[32], all[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)r->K, (long long)r->N);
            snprintf(types, sizeof types, "%s -> %s", nl_type_name(r->gguf_type), nl_type_name(r->res_type));
            fmt_bytes(each, sizeof each, r->bytes);
            fmt_bytes(all, sizeof all, total);
            printf("  %5d %-9s %-14s %13s  %-15s %-10s %10s %10s\n", count, nl_proj_class_name((nl_proj_class)r->cls),
                   kinds, shape, types, storage_name(r), each, all);
        }
        free(done_grp);
    }
    printf("\nresident: %s (total %s; converted copies %s)\n", resident, rbuf, cbuf);
    printf("planner: %s (buckets", summary);
    for (int b = 0; b < n_b; b++) printf("%s%d", b ? ", " : " ", buckets[b]);
    printf("; %.2f s, %.2f s CPU)\n", plan_s, plan_cpu);
    if (verbose) {
        char *tab = nl_proj_plan_format_table(svc);
        if (!tab) goto done;
        printf("%s", tab);
        free(tab);
    } else if (tot.routed) {
        printf("  (--verbose shows which checks were routed and why)\n");
    }
    printf("memory estimate: %s (GGUF mapping %s + converted copies %s), plus activations\n", tbuf, mbuf, cbuf);
    rc = 0;

done:
    if (rc) nl_cli_fail("check");
    free(rows);
    nl_runtime_free(&rt);
    if (svc) nl_proj_service_free(svc);
    nl_model_free(m);
    return rc;
}

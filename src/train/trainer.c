/* The training loop; see trainer.h. */
#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "eval/eval.h"
#include "model/adapter.h"
#include "model/model.h"
#include "nn/forward.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/graph.h"
#include "train/optim.h"
#include "train/pacing.h"
#include "train/signals.h"
#include "util/util.h"

void nl_train_defaults(nl_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = 16;
    o->alpha = 32.0f;
    o->dropout = 0.05f;
    o->lr = 2e-4;
    o->epochs = 1.0;
    o->batch_tokens = 4096;
    o->cosine = 1;
    o->clip = 1.0;
    o->shuffle = 1;
    o->seed = 42;
    o->commit_every = 1;
    o->act_budget_mb = -1;
    o->proj.backend = "ref";
    o->proj.n_threads = 1;
    o->thermal = "auto";
    o->progress = stderr;
}

static const int buckets[] = {16, 64, 256, 1024, 4096};

typedef struct {
    const nl_train_opts *o;
    nl_model *m;
    nl_adapter *ad;
    nl_proj_service *svc;
    nl_runtime rt;
    nl_dataset ds;
    nl_packing pk;
    nl_batcher *bt;
    float *grads, *mom, *vel;
    FILE *log;
    int ds_loaded, pk_loaded;
    nl_pacer pacer;
    int pacer_ok;
    int stop_in_pause;      /* a stop was requested while paused: abort the step */
} trainer;

#define NL_STOPPED 2        /* pace hook status: stop requested during a pause */

static int pace_hook(void *user) {
    trainer *t = user;
    int r = nl_pacer_check(&t->pacer);
    if (r == 1) { t->stop_in_pause = 1; nl_err("stopped while paused"); return NL_STOPPED; }
    return r;
}

static void pace_log(void *user, const char *msg) {
    FILE *f = user;
    if (f) fprintf(f, "%s\n", msg);
}

/* A fresh run must not silently replace the commits of another run. */
static int dir_has_commits(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "commit-", 7)) found = 1;
    closedir(d);
    return found;
}

static void trainer_free(trainer *t) {
    if (t->log && t->log != stdout) fclose(t->log);
    if (t->pacer_ok) nl_pacer_free(&t->pacer);
    nl_batcher_free(t->bt);
    if (t->pk_loaded) nl_packing_free(&t->pk);
    if (t->ds_loaded) nl_dataset_free(&t->ds);
    nl_runtime_free(&t->rt);
    if (t->svc) nl_proj_service_free(t->svc);
    nl_adapter_free(t->ad);
    if (t->m) nl_model_free(t->m);
    free(t->grads);
    free(t->mom);
    free(t->vel);
}

/* Everything that changes the training trajectory goes into the config hash, so a checkpoint
 * from another configuration is refused at resume. */
static uint64_t config_hash(const nl_train_opts *o, const nl_adapter *ad, uint64_t data_hash, int total_steps) {
    nl_hasher h;
    nl_hasher_init(&h, 0x6e6c636667ull);
    int32_t iv[] = {ad->rank, o->batch_tokens, o->warmup, o->cosine, o->max_ctx, o->refuse_long, o->shuffle, total_steps, ad->n};
    double dv[] = {ad->alpha, o->dropout, o->lr, o->clip, o->weight_decay};
    nl_hasher_update(&h, iv, sizeof iv);
    nl_hasher_update(&h, dv, sizeof dv);
    nl_hasher_update(&h, &o->seed, sizeof o->seed);
    nl_hasher_update(&h, &data_hash, sizeof data_hash);
    for (int i = 0; i < ad->n; i++) nl_hasher_update(&h, &ad->t[i].proj, sizeof ad->t[i].proj);
    const char *tmpl = o->chat_template ? o->chat_template : "";
    nl_hasher_update(&h, tmpl, strlen(tmpl));
    return nl_hasher_final(&h);
}

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) { snprintf(buf, cap, "?"); return; }
    long x = (long)(s + 0.5);
    if (x >= 3600) snprintf(buf, cap, "%ldh%02ldm", x / 3600, (x % 3600) / 60);
    else if (x >= 60) snprintf(buf, cap, "%ldm%02lds", x / 60, x % 60);
    else snprintf(buf, cap, "%lds", x);
}

static int count_total_steps(trainer *t) {
    const nl_train_opts *o = t->o;
    if (o->steps > 0) return o->steps;
    /* walk the batcher through ceil(epochs) epochs, counting batches */
    nl_batcher *b = nl_batcher_new(&t->pk, o->seed, o->shuffle, o->batch_tokens);
    if (!b) return -1;
    int whole = (int)floor(o->epochs), total = 0;
    double frac = o->epochs - whole;
    for (int e = 0; e <= whole && e < 100000; e++) {
        int in_epoch = 0;
        const int *idx;
        int n;
        for (;;) {
            nl_data_cursor c = nl_batcher_cursor(b);
            if (c.epoch != e) break;
            if (nl_batcher_next(b, &idx, &n)) { nl_batcher_free(b); return -1; }
            in_epoch++;
        }
        total += e < whole ? in_epoch : (int)ceil(frac * in_epoch);
    }
    nl_batcher_free(b);
    return total > 0 ? total : 1;
}

int nl_train(const nl_train_opts *o, nl_train_result *res) {
    trainer t = {.o = o};
    memset(res, 0, sizeof *res);
    int rc = -1;
    double t_start = nl_now();
    if (!o->model || !o->data || !o->out) return nl_err("train: --model, --data and --out are required");
    if (o->batch_tokens < 1) return nl_err("--batch-tokens %d: expected >= 1", o->batch_tokens);
    if (o->dropout < 0 || o->dropout >= 1) return nl_err("--dropout %g: expected 0 <= p < 1", o->dropout);
    if (!(o->lr > 0)) return nl_err("--lr %g: expected > 0", o->lr);
    if (o->commit_every < 1) return nl_err("--commit-every %d: expected >= 1", o->commit_every);
    if (o->resume && !o->checkpoint_dir) return nl_err("--resume needs --checkpoint-dir");

    t.m = nl_model_load(o->model);
    if (!t.m) goto done;
    if (!t.m->tok) { nl_err("%s: the model has no tokenizer vocabulary", o->model); goto done; }
    if (o->init_adapter) t.ad = nl_adapter_load(t.m, o->init_adapter);
    else t.ad = nl_adapter_new(t.m, o->targets, o->rank, o->alpha, o->seed);
    if (!t.ad) goto done;
    t.svc = nl_proj_service_new(&o->proj);
    if (!t.svc || nl_runtime_init(&t.rt, t.m, t.svc)) goto done;
    t.rt.adapter = t.ad;
    if (nl_proj_plan(t.svc, NULL, 0)) goto done;
    if (o->progress) {
        char line[256], mem[512];
        nl_proj_plan_format_summary(t.svc, line, sizeof line);
        nl_proj_format_resident(t.svc, mem, sizeof mem);
        fprintf(o->progress, "service: %s backend, %s; resident %s\n", o->proj.backend ? o->proj.backend : "ref", line, mem);
        if (o->proj.verbose) {
            char *table = nl_proj_plan_format_table(t.svc);
            if (table) fputs(table, o->progress);
            free(table);
        }
    }
    {
        nl_thermal_provider prov;
        if (nl_thermal_open(&prov, o->thermal ? o->thermal : "auto", o->thermal_status_file, o->battery_temp_file)) goto done;
        nl_pacer_cfg pc;
        nl_pacer_defaults(&pc);
        pc.enabled = !(o->thermal && !strcmp(o->thermal, "off")) || o->thermal_status_file || o->battery_temp_file;
        pc.log = pace_log;
        pc.log_ctx = o->progress;
        pc.should_stop = nl_stop_poll;
        if (nl_pacer_init(&t.pacer, &pc, &prov)) goto done;
        t.pacer_ok = 1;
        t.rt.pace = pace_hook;
        t.rt.pace_user = &t;
    }
    if (o->checkpoint_dir && !o->resume && dir_has_commits(o->checkpoint_dir)) {
        nl_err("%s already holds commits of a run: pass --resume to continue it, or choose another --checkpoint-dir", o->checkpoint_dir);
        goto done;
    }

    nl_data_opts dopt = {.chat_template = o->chat_template, .n_vocab = t.m->hp.n_vocab};
    if (nl_dataset_load(o->data, t.m->tok, &dopt, &t.ds)) goto done;
    t.ds_loaded = 1;
    int max_ctx = o->max_ctx > 0 ? o->max_ctx : (t.m->hp.n_ctx_train > 0 && t.m->hp.n_ctx_train < 4096 ? t.m->hp.n_ctx_train : 4096);
    if (nl_pack(&t.ds, buckets, (int)(sizeof buckets / sizeof *buckets), max_ctx,
                o->refuse_long ? NL_OVERLONG_REFUSE : NL_OVERLONG_TRUNCATE, &t.pk)) goto done;
    t.pk_loaded = 1;
    int total = count_total_steps(&t);
    if (total < 0) goto done;
    t.bt = nl_batcher_new(&t.pk, o->seed, o->shuffle, o->batch_tokens);
    if (!t.bt) goto done;

    size_t np = t.ad->n_params;
    t.grads = nl_calloc(np, sizeof(float));
    t.mom = nl_calloc(np, sizeof(float));
    t.vel = nl_calloc(np, sizeof(float));
    if (!t.grads || !t.mom || !t.vel) goto done;

    uint64_t data_hash = 0, model_hash = 0;
    if (nl_file_hash64(o->data, &data_hash) || nl_file_hash64(o->model, &model_hash)) goto done;
    uint64_t cfg_hash = config_hash(o, t.ad, data_hash, total);
    int step = 0;
    if (o->resume) {
        nl_ckpt ck;
        char warn[512];
        int r = nl_ckpt_load_latest(o->checkpoint_dir, cfg_hash, model_hash, np, &ck, warn, sizeof warn, NULL);
        if (r < 0) goto done;
        if (warn[0] && o->progress) fprintf(o->progress, "warning: %s\n", warn);
        if (r == 0) {
            memcpy(t.ad->params, ck.params, np * sizeof(float));
            memcpy(t.mom, ck.m, np * sizeof(float));
            memcpy(t.vel, ck.v, np * sizeof(float));
            step = (int)ck.step;
            nl_data_cursor cur = {.epoch = (int64_t)ck.epoch, .index = (int64_t)ck.index};
            nl_ckpt_free(&ck);
            if (nl_batcher_seek(t.bt, cur)) goto done;
            if (o->progress) fprintf(o->progress, "resumed from %s at step %d/%d\n", o->checkpoint_dir, step, total);
        } else if (o->progress) {
            fprintf(o->progress, "no commit in %s: starting from step 0\n", o->checkpoint_dir);
        }
    }
    if (o->log_json) {
        t.log = fopen(o->log_json, o->resume ? "a" : "w");
        if (!t.log) { nl_err("%s: cannot open for writing: %s", o->log_json, strerror(errno)); goto done; }
    }
    /* activation budget = min(--act-budget-mb, MemAvailable less a reserve for everything else) */
    uint64_t budget = nl_act_budget_bytes(o->act_budget_mb >= 0 ? (uint64_t)o->act_budget_mb << 20 : 0,
                                          nl_mem_available_bytes(), (uint64_t)512 << 20);
    if (o->act_budget_mb == 0) budget = 0;
    nl_graph g = {.rt = &t.rt, .ad = t.ad, .grads = t.grads, .dropout = o->dropout, .seed = o->seed,
                  .act_budget = budget};
    nl_schedule sched = {.kind = o->cosine ? NL_LR_COSINE : NL_LR_CONSTANT, .lr = o->lr, .warmup_steps = o->warmup};
    nl_adamw aw;
    nl_adamw_defaults(&aw);
    aw.weight_decay = o->weight_decay;
    if (o->progress)
        fprintf(o->progress, "training %s on %s: %d examples, %d sequences, %d steps, %d adapted projections (%zu parameters, rank %d)\n",
                o->model, o->data, t.ds.n, t.pk.n, total, t.ad->n, np, t.ad->rank);
    int first_step = step, steps_this_run = 0;
    double run_start = nl_now();
    int64_t run_tokens = 0;
    nl_signals_install();
    nl_data_cursor prev_cursor = nl_batcher_cursor(t.bt);
    while (step < total) {
        const int *idx;
        int nseq;
        prev_cursor = nl_batcher_cursor(t.bt);
        if (nl_batcher_next(t.bt, &idx, &nseq)) goto done;
        double paused0 = t.pacer.paused_seconds;
        double t0 = nl_now();
        nl_proj_stats st0;
        nl_proj_get_stats(t.svc, &st0);
        int64_t n_targets = 0, n_tokens = 0;
        for (int i = 0; i < nseq; i++) n_targets += t.pk.seq[idx[i]].n_targets;
        memset(t.grads, 0, np * sizeof(float));
        g.step = step + 1;
        g.tok_base = 0;
        double loss_sum = 0.0;
        float inv_n = n_targets ? 1.0f / (float)n_targets : 0.0f;
        for (int i = 0; i < nseq; i++) {
            const nl_seq *sq = &t.pk.seq[idx[i]];
            int32_t *rows = nl_malloc((size_t)sq->n_tokens * sizeof *rows);
            if (!rows) goto done;
            nl_row_targets(sq->ids, sq->target, sq->n_tokens, rows);
            double ls;
            int r = nl_graph_seq(&g, sq->ids, rows, sq->n_tokens, inv_n, &ls);
            free(rows);
            if (r && t.stop_in_pause) break;
            if (r) goto done;
            loss_sum += ls;
            g.tok_base += sq->n_tokens;
            n_tokens += sq->n_tokens;
        }
        if (t.stop_in_pause) {
            /* Stopped inside a pause: this step is abandoned; the state is that of the last
             * finished step, and the data cursor goes back to this batch. */
            if (nl_batcher_seek(t.bt, prev_cursor)) goto done;
            res->stopped = 1;
            if (o->checkpoint_dir && step > 0) {
                nl_ckpt ck = {.config_hash = cfg_hash, .model_hash = model_hash, .step = (uint64_t)step,
                              .epoch = (uint64_t)prev_cursor.epoch, .index = (uint64_t)prev_cursor.index,
                              .rank = (uint32_t)t.ad->rank, .alpha = t.ad->alpha, .n_params = np,
                              .params = t.ad->params, .m = t.mom, .v = t.vel};
                if (nl_ckpt_commit(o->checkpoint_dir, &ck, NULL)) goto done;
            }
            break;
        }
        double loss = n_targets ? loss_sum / (double)n_targets : 0.0;
        if (!isfinite(loss)) {
            nl_err("step %d: the loss is not finite (%g); stopping, the last commit is kept", step + 1, loss);
            goto done;
        }
        if (o->dump_grads && step == first_step && first_step == 0) {
            if (nl_adapter_save_values(t.ad, t.m, t.grads, o->dump_grads)) goto done;
        }
        double gnorm = nl_grad_clip(t.grads, np, o->clip);
        if (!isfinite(gnorm)) {
            nl_err("step %d: the gradient norm is not finite; stopping, the last commit is kept", step + 1);
            goto done;
        }
        aw.lr = nl_lr_at(&sched, step + 1, total);
        if (nl_adamw_step(t.ad->params, t.grads, t.mom, t.vel, np, &aw, step + 1)) goto done;
        step++;
        steps_this_run++;
        run_tokens += n_tokens;
        double dt = nl_now() - t0;
        nl_proj_stats st1;
        nl_proj_get_stats(t.svc, &st1);
        double svc_s = (st1.busy_s[0] + st1.busy_s[1]) - (st0.busy_s[0] + st0.busy_s[1]);
        res->service_seconds += svc_s;
        res->tokens += n_tokens;
        if (step == first_step + 1) res->first_loss = loss;
        res->last_loss = loss;
        int commit = o->checkpoint_dir && (step % o->commit_every == 0 || step == total);
        int stop = (o->stop_after > 0 && steps_this_run >= o->stop_after) || nl_stop_requested();
        if (o->checkpoint_dir && stop) commit = 1;
        if (commit) {
            nl_data_cursor cur = nl_batcher_cursor(t.bt);
            nl_ckpt ck = {.config_hash = cfg_hash, .model_hash = model_hash, .step = (uint64_t)step,
                          .epoch = (uint64_t)cur.epoch, .index = (uint64_t)cur.index, .rank = (uint32_t)t.ad->rank,
                          .alpha = t.ad->alpha, .n_params = np, .params = t.ad->params, .m = t.mom, .v = t.vel};
            if (nl_ckpt_commit(o->checkpoint_dir, &ck, NULL)) goto done;
        }
        if (t.log) {
            fprintf(t.log, "{\"step\": %d, \"loss\": %.6f, \"tokens\": %lld, \"targets\": %lld, \"seconds\": %.4f, "
                           "\"service_seconds\": %.4f, \"paused_seconds\": %.4f, \"lr\": %.6g, \"grad_norm\": %.6g}\n",
                    step, loss, (long long)n_tokens, (long long)n_targets, dt, svc_s, t.pacer.paused_seconds - paused0, aw.lr, gnorm);
            fflush(t.log);
        }
        if (o->progress) {
            double el = nl_now() - run_start, tps = el > 0 ? (double)run_tokens / el : 0.0;
            char eta[32];
            fmt_eta(el / steps_this_run * (total - step), eta, sizeof eta);
            fprintf(o->progress, "step %d/%d  loss %.4f  %.0f tok/s  ETA %s  %s%s\n", step, total, loss, tps, eta,
                    t.pacer.paused_seconds > paused0 ? "paused" : "running", commit ? "  (committed)" : "");
        }
        if (stop) { res->stopped = 1; break; }
    }
    if (nl_adapter_save(t.ad, t.m, o->out)) goto done;
    res->paused_seconds = t.pacer.paused_seconds;
    res->steps_done = step;
    res->total_steps = total;
    rc = 0;
done:
    nl_signals_restore();
    res->seconds = nl_now() - t_start;
    trainer_free(&t);
    return rc;
}

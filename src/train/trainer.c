/* The training loop; see trainer.h. */
#include "train/trainer.h"
#include "train/trainer_hooks.h"
#include "train/trainer_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/amx.h"
#include "data/dataset.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/quant.h"
#include "nn/lora.h"
#include "nn/forward.h"
#include "os/energy.h"
#include "os/mem.h"
#include "os/pacing.h"
#include "os/signals.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/graph.h"
#include "train/mezo.h"
#include "train/optim.h"
#include "train/plan.h"
#include "train/rundesc.h"
#include "util/hash.h"
#include "util/json.h"
#include "util/rng.h"
#include "util/util.h"

void nl_train_defaults(nl_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->rank = 16;
    o->alpha = 32.0f;
    o->dropout = 0.05f;
    o->lr = 2e-4;
    o->epochs = 3.0;
    o->batch_tokens = 0; /* sized to the data (train/plan.h) */
    o->cosine = 1;
    o->lr_min = -1;
    o->clip = 1.0;
    o->shuffle = 1;
    o->seed = 42;
    o->commit_every = 1;
    o->act_budget_mb = -1;
    nl_proj_config_defaults(&o->proj); /* the CLI's: host, every core up to 8, precision auto */
    o->thermal = "auto";
    o->progress = stderr;
    o->warnings = stderr;
    o->method = "backprop";
    o->mezo_eps = 1e-3;
}

nl_schedule nl_train_schedule(const nl_train_opts *o) {
    nl_schedule s = {.kind = o->cosine ? NL_LR_COSINE : NL_LR_CONSTANT, .lr = o->lr, .warmup_steps = o->warmup};
    s.lr_min = o->cosine ? (o->lr_min < 0 ? 0.1 * o->lr : o->lr_min) : o->lr;
    return s;
}

int nl_train_sync_mode(const nl_train_opts *o) {
    if (o->overlap && !strcmp(o->overlap, "on")) return 0;
    if (o->overlap && !strcmp(o->overlap, "off")) return 1;
    const char *b = o->proj.backend_impl ? o->proj.backend_impl->name : o->proj.backend ? o->proj.backend : "ref";
    return nl_proj_backend_on_cpu(b);
}

char *nl_train_snapshot_path(const char *out, int64_t step) {
    size_t n = strlen(out);
    if (n >= 5 && !strcmp(out + n - 5, ".gguf")) n -= 5;
    size_t cap = n + 32;
    char *p = nl_malloc(cap);
    if (p) snprintf(p, cap, "%.*s-step%" PRId64 ".gguf", (int)n, out, step);
    return p;
}

const int nl_train_buckets[] = {16, 64, 256, 1024, 4096};
const int nl_train_n_buckets = (int)(sizeof nl_train_buckets / sizeof *nl_train_buckets);

#define NL_STOPPED 2 /* pace hook status: stop requested during a pause */

static int pace_hook(void *user) {
    nl_trainer *t = user;
    int r = nl_pacer_check(&t->res.pacer);
    if (r == 1) {
        t->count.stop_in_pause = 1;
        nl_err("stopped while paused");
        return NL_STOPPED;
    }
    if (r < 0) {
        /* A reading that fails (a host app's status file missing or half-written for a moment)
         * must not end an overnight run: warn once per outage, train on, read again at the
         * next check. An unavailable reading never blocks (pacing.h), so this is the same
         * rule. A bad file at start-up is still an error (nl_thermal_open). */
        if (!t->count.pace_failing && t->o->warnings)
            fprintf(t->o->warnings, "warning: pacing: %s; training on without this reading\n", nl_last_error());
        t->count.pace_failing = 1;
        return 0;
    }
    t->count.pace_failing = 0;
    return r;
}

static void pace_log(void *user, const char *msg) {
    FILE *f = user;
    if (f) fprintf(f, "%s\n", msg);
}

static void trainer_free(nl_trainer *t) {
    nl_graph_free(&t->res.g);
    if (t->res.lock_fd >= 0) close(t->res.lock_fd); /* releases the lock */
    if (t->res.lock_dir_fd >= 0) close(t->res.lock_dir_fd);
    if (t->res.log && t->res.log != stdout) fclose(t->res.log);
    if (t->res.pacer_ok) nl_pacer_free(&t->res.pacer);
    nl_batcher_free(t->res.bt);
    if (t->res.pk_loaded) nl_packing_free(&t->res.pk);
    if (t->res.ds_loaded) nl_dataset_free(&t->res.ds);
    nl_val_free(&t->val);
    nl_runtime_free(&t->res.rt);
    if (t->res.svc) nl_proj_service_free(t->res.svc);
    nl_adapter_free(t->res.ad);
    nl_tokenizer_free(t->res.tok);
    if (t->res.m) nl_model_free(t->res.m);
    free(t->res.grads);
    free(t->res.mom);
    free(t->res.vel);
    free(t->res.zeros);
    nl_energy_close(t->res.en);
}

/* DIR/lock, opened never through a symbolic link planted there (O_NOFOLLOW; created with
 * O_EXCL when missing) and never blocking on a FIFO put there (O_NONBLOCK; anything but a
 * regular file is refused, named). */
static int open_lock(const char *path) {
    for (int tries = 0; tries < 3; tries++) {
        int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
            if (fd < 0 && errno == EEXIST) continue; /* another run created it in between */
        }
        if (fd < 0) {
            if (errno == ELOOP)
                return nl_err("%s: is a symbolic link, not our lock file: refusing to follow it; remove it", path);
            return nl_err("%s: cannot create: %s", path, strerror(errno));
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            int e = errno;
            close(fd);
            if (e) return nl_err("%s: cannot stat: %s", path, strerror(e));
            return nl_err("%s: is %s, not a lock file: remove it", path, nl_file_kind((unsigned)st.st_mode));
        }
        return fd;
    }
    return nl_err("%s: cannot create: it appears and disappears (another program is at it)", path);
}

/* The run holding the lock on fd, for the message: the pid of its POSIX lock (the holder takes
 * one beside the flock, and the kernel knows who holds it), else the pid the file names when
 * that process still runs; "pid unknown" otherwise, never a stale pid. */
static void lock_holder(int fd, char *buf, size_t cap) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid > 0) {
        snprintf(buf, cap, "pid %ld", (long)fl.l_pid);
        return;
    }
    char pid[24] = "";
    ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
    pid[r > 0 ? r : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    char *end;
    long v = strtol(pid, &end, 10);
    if (pid[0] && !*end && v > 0 && (kill((pid_t)v, 0) == 0 || errno == EPERM)) snprintf(buf, cap, "pid %ld", v);
    else if (pid[0]) snprintf(buf, cap, "pid unknown: the lock file names %.20s, which is not running", pid);
    else snprintf(buf, cap, "pid unknown");
}

/* One run per checkpoint directory: two runs committing into the same directory (a scheduler
 * starting tonight's run while last night's still goes) would interleave their commits. An
 * flock on DIR/lock, taken before any work and held until the end; the kernel drops it when
 * the process dies, so a killed run never leaves a stale lock. The holder also takes a POSIX
 * lock on the file and writes its pid there, for the message of a run refused. DIR is created
 * (one level) if missing. */
static int lock_dir(const char *dir, int *fd_out, int *dir_fd_out) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return nl_err("%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
    size_t n = strlen(dir) + 6;
    char *path = nl_malloc(n);
    if (!path) return -1;
    snprintf(path, n, "%s/lock", dir);
    /* The directory itself is flocked first: a lock file deleted under a running run (rm, a
     * cleanup script) would let a second run create a new one and lock that; the directory's
     * lock cannot be deleted away. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        free(path);
        return nl_err("%s: cannot open the checkpoint directory: %s", dir, strerror(e));
    }
    if (flock(dfd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(dfd);
        char who[96] = "pid unknown";
        int lfd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (lfd >= 0) {
            lock_holder(lfd, who, sizeof who);
            close(lfd);
        } else {
            snprintf(who, sizeof who, "pid unknown: its lock file %s was removed", path);
        }
        if (e == EWOULDBLOCK)
            nl_err(
                "%s is in use by another training run (%s): wait for it to end, or stop it (SIGINT commits and exits)",
                dir, who);
        else nl_err("%s: cannot lock: %s", dir, strerror(e));
        free(path);
        return -1;
    }
    int fd = open_lock(path);
    if (fd < 0) {
        close(dfd);
        free(path);
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char who[96];
        if (e == EWOULDBLOCK) lock_holder(fd, who, sizeof who);
        close(fd);
        if (e == EWOULDBLOCK)
            nl_err(
                "%s is in use by another training run (%s): wait for it to end, or stop it (SIGINT commits and exits)",
                dir, who);
        else nl_err("%s: cannot lock: %s", path, strerror(e));
        close(dfd);
        free(path);
        return -1;
    }
    free(path);
    *dir_fd_out = dfd;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &fl) != 0) { /* only for the message: the flock is the lock */
    }
    char pid[24];
    int pl = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)pl, 0) != pl) { /* the pid is only for the message */
    }
    *fd_out = fd;
    return 0;
}

/* ---- files ------------------------------------------------------------------------------ */

/* An output written at the END of a long run (the adapter, the gradient dump) is checked
 * before the run starts: the writers create PATH.tmp and rename it onto PATH (os/io's atomic
 * write), so create and remove that temp file now. `flag` names the option in the message. */
static int probe_output(const char *flag, const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return nl_err("--%s %s: is a directory, expected a file path", flag, path);
    char *tmp = nl_io_tmp_path(path);
    if (!tmp) return -1;
    int rc = nl_io_probe_tmp(NULL, tmp);
    free(tmp);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", nl_last_error());
        return nl_err("--%s %s: cannot write there (%s); nothing was trained", flag, path, why);
    }
    return 0;
}

/* --log-json, opened for appending (a resume) or anew. What is there must be a regular file
 * (or nothing): a FIFO would block the run at its first line, a device is no log. The open is
 * non-blocking and checked again on the descriptor, and truncation comes after the check. */
static FILE *open_log(const char *path, int append) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        nl_err("--log-json %s: is %s, not a regular file", path, nl_file_kind((unsigned)st.st_mode));
        return NULL;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0), 0666);
    if (fd < 0) {
        nl_err("%s: cannot open for writing: %s", path, strerror(errno));
        return NULL;
    }
    int bad = fstat(fd, &st) != 0 ? -1 : !S_ISREG(st.st_mode);
    if (!bad && !append && ftruncate(fd, 0) != 0) bad = -1;
    if (bad) {
        if (bad < 0) nl_err("%s: cannot open for writing: %s", path, strerror(errno));
        else nl_err("--log-json %s: is %s, not a regular file", path, nl_file_kind((unsigned)st.st_mode));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, append ? "a" : "w");
    if (!f) {
        nl_err("%s: cannot open for writing: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* --log-json on resume: keep only the complete lines of steps <= keep_step (the committed
 * step; an evaluation's row by the step it followed), so the steps the resumed run replays are not logged twice and a
 * line half-written by a killed run disappears. Written back atomically. A missing file is fine. */
static int log_keep_steps(const char *path, int64_t keep_step) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    size_t len;
    char *buf = nl_read_file(path, &len);
    if (!buf) return -1;
    char *out = nl_malloc(len + 1);
    if (!out) {
        free(buf);
        return -1;
    }
    size_t n = 0;
    for (char *p = buf; p < buf + len;) {
        char *eol = memchr(p, '\n', (size_t)(buf + len - p));
        if (!eol) break; /* no newline: written by a killed run */
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), NULL);
        int64_t s;
        const nl_json *ev = j ? nl_json_get(j, "eval") : NULL; /* an evaluation's row: its step inside */
        if (j && nl_json_int64(nl_json_get(ev ? ev : j, "step"), &s) == 0 && s >= 1 && s <= keep_step) {
            memcpy(out + n, p, (size_t)(eol - p) + 1);
            n += (size_t)(eol - p) + 1;
        }
        nl_json_free(j);
        p = eol + 1;
    }
    nl_clear_error();
    int rc = nl_io_write_file(NULL, path, out, n);
    free(out);
    free(buf);
    return rc;
}

/* ---- the run's description (train/rundesc.h) ---- */

/* Content hash of the packed sequences (ids and targets): what the run trains on, whatever
 * the file looks like (the tokenizer is covered by the model hash). */
static uint64_t packing_hash(const nl_packing *pk) {
    nl_hasher h;
    nl_hasher_init(&h, 0x6e6c64617461ull);
    for (int i = 0; i < pk->n; i++) {
        int32_t n = pk->seq[i].n_tokens;
        nl_hasher_update(&h, &n, sizeof n);
        nl_hasher_update(&h, pk->seq[i].ids, (size_t)n * sizeof(int32_t));
        nl_hasher_update(&h, pk->seq[i].target, (size_t)n);
    }
    return nl_hasher_final(&h);
}

/* Whether train/graph's LoRA products run in BF16 (with the service's, at a rank the pair has). */
static int lora_bf16(const nl_trainer *t) {
    return !t->res.rt.tiles && t->res.rt.attn_bf16 && t->res.ad && nl_lora_bf16_runs(t->res.ad->rank);
}

static void build_desc(const nl_trainer *t, uint64_t model_hash, uint64_t data_hash, int64_t total, int max_ctx,
                       nl_run_desc *d) {
    const nl_train_opts *o = t->o;
    const nl_adapter *ad = t->res.ad;
    memset(d, 0, sizeof *d);
    nl_desc_add(d, "model", NL_KV_CONFIG, "%016llx", (unsigned long long)model_hash);
    nl_desc_add(d, "data", NL_KV_CONFIG, "%016llx", (unsigned long long)data_hash);
    /* targets: the kinds adapted, the tensor count and a short hash of the exact list */
    char kinds[160] = "";
    size_t kl = 0;
    for (int k = 0; k < NL_P_KIND_COUNT; k++) {
        int any = 0;
        for (int i = 0; i < ad->n && !any; i++) any = t->res.m->projs[ad->t[i].proj].kind == (nl_proj_kind)k;
        if (any && kl < sizeof kinds)
            kl += (size_t)snprintf(kinds + kl, sizeof kinds - kl, "%s%s", kl ? "," : "",
                                   nl_proj_kind_name((nl_proj_kind)k));
    }
    nl_hasher h;
    nl_hasher_init(&h, 0x6e6c7467ull);
    for (int i = 0; i < ad->n; i++) nl_hasher_update(&h, &ad->t[i].proj, sizeof ad->t[i].proj);
    nl_desc_add(d, "targets", NL_KV_CONFIG, "%s (%d tensors, #%08x)", kinds, ad->n,
                (unsigned)(nl_hasher_final(&h) >> 32));
    nl_desc_add(d, "rank", NL_KV_CONFIG, "%d", ad->rank);
    char nb[40];
    nl_desc_add(d, "alpha", NL_KV_CONFIG, "%s", nl_desc_num(nb, sizeof nb, ad->alpha, 1));
    /* a fresh adapter follows from (model, targets, rank, seed); a loaded one is hashed */
    if (o->init_adapter)
        nl_desc_add(d, "init", NL_KV_CONFIG, "adapter %016llx",
                    (unsigned long long)nl_hash64(ad->params, ad->n_params * sizeof(float), 0x6e6c696e6974ull));
    else nl_desc_add(d, "init", NL_KV_CONFIG, "fresh");
    nl_desc_add(d, "method", NL_KV_CONFIG, "%s", t->plan.mezo ? "mezo" : "backprop");
    if (t->plan.mezo) nl_desc_add(d, "mezo_eps", NL_KV_CONFIG, "%s", nl_desc_num(nb, sizeof nb, o->mezo_eps, 0));
    /* the schedule: recorded, not hashed; a resume may change it (resume_from) */
    nl_desc_add(d, "steps", NL_KV_SCHEDULE, "%" PRId64, total);
    nl_desc_add(d, "batch_tokens", NL_KV_CONFIG, "%d", o->batch_tokens);
    /* a batch sized to the data says so (record only): a resume keeps it (nl_train_resolve_batch) */
    if (t->plan.batch_sized == NL_BATCH_SIZED || t->plan.batch_sized == NL_BATCH_RESUMED_SIZED)
        nl_desc_add(d, "batch_sizing", NL_KV_INFO, "data");
    nl_desc_add(d, "lr", NL_KV_SCHEDULE, "%s", nl_desc_num(nb, sizeof nb, o->lr, 0));
    nl_desc_add(d, "schedule", NL_KV_SCHEDULE, "%s", o->cosine ? "cosine" : "constant");
    /* the floor is reached after the last step (a commit of the older schedule, which gave
     * the last step lr 0, has no lr_min and is refused as made with other settings) */
    if (o->cosine)
        nl_desc_add(d, "lr_min", NL_KV_SCHEDULE, "%s", nl_desc_num(nb, sizeof nb, nl_train_schedule(o).lr_min, 0));
    nl_desc_add(d, "warmup", NL_KV_SCHEDULE, "%d", o->warmup);
    nl_desc_add(d, "dropout", NL_KV_CONFIG, "%s", nl_desc_num(nb, sizeof nb, o->dropout, 1));
    nl_desc_add(d, "clip", NL_KV_CONFIG, "%s", nl_desc_num(nb, sizeof nb, o->clip, 0));
    nl_desc_add(d, "weight_decay", NL_KV_CONFIG, "%s", nl_desc_num(nb, sizeof nb, o->weight_decay, 0));
    nl_desc_add(d, "ctx", NL_KV_CONFIG, "%d", max_ctx);
    nl_desc_add(d, "on_long", NL_KV_CONFIG, "%s", o->refuse_long ? "refuse" : "truncate");
    nl_desc_add(d, "shuffle", NL_KV_CONFIG, "%d", o->shuffle ? 1 : 0);
    nl_desc_add(d, "seed", NL_KV_CONFIG, "%llu", (unsigned long long)o->seed);
    nl_desc_add(d, "template", NL_KV_CONFIG, "%s", o->chat_template ? o->chat_template : "auto");
    if (t->val.loaded) {
        /* only with validation: the description of a run without it is as before */
        /* the keys a --config run.json reads back as flags (cli_config.c): "validation" is the
         * set's identity (record only), "val_split" / "val_data_path" and the rest are flags */
        if (o->val_split > 0) {
            nl_desc_add(d, "validation", NL_KV_CONFIG, "split %s", nl_desc_num(nb, sizeof nb, o->val_split, 0));
            nl_desc_add(d, "val_split", NL_KV_INFO, "%s", nl_desc_num(nb, sizeof nb, o->val_split, 0));
        } else {
            nl_desc_add(d, "validation", NL_KV_CONFIG, "file %016llx", (unsigned long long)nl_val_hash(&t->val));
            nl_desc_add(d, "val_data_path", NL_KV_INFO, "%s", o->val_data);
        }
        if (o->eval_every) nl_desc_add(d, "eval_every", NL_KV_CONFIG, "%lld", (long long)o->eval_every);
        if (o->keep_best)
            nl_desc_add(d, "keep_best", NL_KV_CONFIG, "%s", o->keep_best == NL_KEEP_ACCURACY ? "accuracy" : "loss");
        if (o->early_stop) nl_desc_add(d, "early_stop", NL_KV_CONFIG, "%lld", (long long)o->early_stop);
    }
    nl_desc_add(d, "backend", NL_KV_NUMERICS, "%s",
                o->proj.backend_impl ? o->proj.backend_impl->name
                : o->proj.backend    ? o->proj.backend
                                     : "ref");
    nl_desc_add(d, "precision", NL_KV_NUMERICS, "%s", o->proj.precision ? o->proj.precision : "auto");
    nl_desc_add(d, "precision_map", NL_KV_NUMERICS, "%s", o->proj.precision_map ? o->proj.precision_map : "");
    nl_desc_add(d, "wire", NL_KV_NUMERICS, "%s", o->proj.wire_f16 ? "f16" : "f32");
    char kern[256];
    nl_proj_describe(t->res.svc, kern, sizeof kern);
    if (t->res.rt.tiles) /* the nodes' products follow the service onto the tiles (nn/forward.h) */
        nl_desc_add(d, "kernels", NL_KV_KERNELS, "%s; attention and lora on %s tiles", kern, t->res.rt.tiles->name);
    else if (lora_bf16(t)) /* train/graph's LoRA products in BF16 with the service's (nn/lora.h) */
        nl_desc_add(d, "kernels", NL_KV_KERNELS, "%s; lora bf16", kern);
    else nl_desc_add(d, "kernels", NL_KV_KERNELS, "%s", kern);
    nl_desc_add(d, "model_path", NL_KV_INFO, "%s", o->model);
    nl_desc_add(d, "data_path", NL_KV_INFO, "%s", o->data);
    /* the rest of what `train --config run.json` replays (recorded, never hashed or compared, so
     * the commits of runs before them still resume): how the data's lines are read (their effect
     * is in the data hash), the adapter the run starts from (its content is "init"), the compute
     * mode asked for (the kernels it gave are "kernels"), and how the run commits, snapshots,
     * paces and overlaps. tests/test_cli_help.c checks that every flag of train is a key here or
     * named as no setting of the run. */
    if (o->init_adapter) nl_desc_add(d, "init_adapter", NL_KV_INFO, "%s", o->init_adapter);
    if (o->columns) nl_desc_add(d, "columns", NL_KV_INFO, "%s", o->columns);
    if (o->alpaca_prompt) nl_desc_add(d, "alpaca_prompt", NL_KV_INFO, "%s", o->alpaca_prompt);
    if (o->strict_keys) nl_desc_add(d, "strict_keys", NL_KV_INFO, "1");
    if (o->proj.compute) nl_desc_add(d, "compute", NL_KV_INFO, "%s", o->proj.compute);
    nl_desc_add(d, "commit_every", NL_KV_INFO, "%" PRId64, o->commit_every);
    if (o->save_every > 0) nl_desc_add(d, "save_every", NL_KV_INFO, "%" PRId64, o->save_every);
    nl_desc_add(d, "thermal", NL_KV_INFO, "%s", o->thermal ? o->thermal : "auto");
    if (o->overlap) nl_desc_add(d, "overlap", NL_KV_INFO, "%s", o->overlap);
}

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long x = (long)(s + 0.5);
    if (x >= 3600) snprintf(buf, cap, "%ldh%02ldm", x / 3600, (x % 3600) / 60);
    else if (x >= 60) snprintf(buf, cap, "%ldm%02lds", x / 60, x % 60);
    else snprintf(buf, cap, "%lds", x);
}

static int commit_state(nl_trainer *t, uint64_t cfg_hash, uint64_t model_hash, int64_t step, nl_data_cursor cur) {
    const float *m = t->plan.mezo ? t->res.zeros : t->res.mom, *v = t->plan.mezo ? t->res.zeros : t->res.vel;
    nl_ckpt ck = {.config_hash = cfg_hash,
                  .model_hash = model_hash,
                  .step = (uint64_t)step,
                  .epoch = (uint64_t)cur.epoch,
                  .index = (uint64_t)cur.index,
                  .rank = (uint32_t)t->res.ad->rank,
                  .alpha = t->res.ad->alpha,
                  .n_params = t->res.ad->n_params,
                  .params = t->res.ad->params,
                  .m = (float *)m,
                  .v = (float *)v};
    uint64_t vw[NL_VAL_WORDS];
    if (t->val.loaded) { /* the best so far and the patience counter travel with the step */
        nl_val_state_pack(&t->val.st, vw);
        ck.n_cursor = NL_VAL_WORDS;
        ck.cursor = vw;
    }
    return nl_ckpt_commit(t->o->checkpoint_dir, &ck, t->hk.ckpt_io);
}

/* A failed commit ends the run: say which step, which call (the checkpoint layer's message
 * names the file and the call: write, fsync, close, rename, directory fsync) and what is kept.
 * rc NL_IO_NOT_DURABLE: only the directory fsync failed, so the new commit is already in place
 * (the previous one is not what a resume finds first). */
static void commit_error(int64_t step, int64_t last_commit, int rc) {
    char why[1024];
    snprintf(why, sizeof why, "%s", nl_last_error());
    if (rc == NL_IO_NOT_DURABLE)
        nl_err("step %" PRId64 ": commit failed: %s; training stopped: the commit of step %" PRId64
               " is in place but may not survive a power "
               "loss (the one before it is kept too), --resume continues from the newest that verifies",
               step, why, step);
    else if (last_commit > 0)
        nl_err("step %" PRId64 ": commit failed: %s; training stopped: the previous commit (step %" PRId64
               ") is kept, --resume continues from it",
               step, why, last_commit);
    else nl_err("step %" PRId64 ": commit failed: %s; training stopped (nothing committed yet)", step, why);
}

/* The model file changed under the run (truncated or rewritten: model/gguf.h): what was
 * computed since the last check read pages that are gone, so nothing more is committed. */
static int model_changed(const nl_trainer *t, int64_t last_commit) {
    if (!nl_gguf_changed(t->res.m->gguf)) return 0;
    const nl_train_opts *o = t->o;
    if (o->checkpoint_dir && last_commit > 0)
        return nl_err(
            "%s changed while the run was using it (truncated or rewritten); stopping: the last commit (step %" PRId64
            ") is kept, --resume with the model as it was continues from it; no adapter written",
            o->model, last_commit);
    return nl_err("%s changed while the run was using it (truncated or rewritten); stopping: %s, no adapter written",
                  o->model, o->checkpoint_dir ? "nothing was committed" : "no --checkpoint-dir: nothing is kept");
}

/* A failed write of an output (--out at the end, --log-json at a step) ends the run: say the
 * step and how to get the trained state back (`flag` names the output to change). */
static void output_error(const nl_train_opts *o, int64_t step, const char *why, int64_t last_commit, const char *flag) {
    if (o->checkpoint_dir && last_commit > 0)
        nl_err("step %" PRId64 ": %s; the last commit (step %" PRId64 ") is kept: --resume with another %s", step, why,
               last_commit, flag);
    else if (o->checkpoint_dir)
        nl_err("step %" PRId64 ": %s; nothing was committed yet (the run must start again)", step, why);
    else
        nl_err("step %" PRId64 ": %s; nothing was committed (no --checkpoint-dir): the run must start again", step,
               why);
}

/* ---- non-finite values ------------------------------------------------------------------- */

/* AdamW over the runtime's node pool: the update is element-wise, so ranges give the same bits
 * as one call (a 10 M-parameter adapter: ~50 ms of double arithmetic per step on one core). */
typedef struct {
    float *p, *m, *v;
    const float *g;
    size_t n;
    const nl_adamw *cfg;
    int64_t step;
} adamw_job;

static void adamw_task(void *arg, int task, int n_tasks) {
    const adamw_job *j = arg;
    const size_t i0 = j->n * (size_t)task / (size_t)n_tasks, i1 = j->n * (size_t)(task + 1) / (size_t)n_tasks;
    nl_adamw_step(j->p + i0, j->g + i0, j->m + i0, j->v + i0, i1 - i0, j->cfg, j->step); /* cfg, step: checked */
}

static int adamw_pool(nl_runtime *rt, float *p, const float *g, float *m, float *v, size_t n, const nl_adamw *cfg,
                      int64_t step) {
    if (!rt->pool || n < 4096) return nl_adamw_step(p, g, m, v, n, cfg, step);
    if (nl_adamw_step(p, g, m, v, 0, cfg, step)) return -1; /* validates cfg and step, touches nothing */
    adamw_job j = {p, m, v, g, n, cfg, step};
    nl_pool_run(rt->pool, nl_pool_size(rt->pool), adamw_task, &j);
    return 0;
}

static int all_finite(const float *x, size_t n, size_t *bad) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            *bad = i;
            return 0;
        }
    return 1;
}

/* The first LoRA tensor (adapter order; A before B; the parameter before its gradient) holding
 * a non-finite value, described into buf ("parameter blk.1.attn_q.lora_b[5] = nan"); 0 when
 * there is none. grads may be NULL (MeZO). */
static int find_nonfinite(const nl_trainer *t, const float *grads, char *buf, size_t cap) {
    const nl_adapter *ad = t->res.ad;
    for (int i = 0; i < ad->n; i++) {
        const nl_lora_tensor *lt = &ad->t[i];
        for (int part = 0; part < 2; part++) {
            size_t off = part ? lt->off_b : lt->off_a, n = (size_t)lt->rank * (size_t)(part ? lt->n_out : lt->n_in),
                   bad;
            for (int isg = 0; isg < 2; isg++) {
                const float *x = isg ? grads : ad->params;
                if (!x || all_finite(x + off, n, &bad)) continue;
                char name[160];
                nl_adapter_elem_name(ad, t->res.m, off + bad, name, sizeof name);
                snprintf(buf, cap, "%s %s = %g", isg ? "gradient of" : "parameter", name, (double)x[off + bad]);
                return 1;
            }
        }
    }
    return 0;
}

/* Stop on a non-finite loss / gradient: name the step and the first tensor. */
static int nonfinite_error(const nl_trainer *t, int64_t step, int64_t last_commit, double loss, const float *grads) {
    char where[256];
    char kept[96];
    if (t->o->checkpoint_dir && last_commit > 0)
        snprintf(kept, sizeof kept, "the last commit (step %" PRId64 ") is kept", last_commit);
    else
        snprintf(kept, sizeof kept, "%s",
                 t->o->checkpoint_dir ? "nothing was committed" : "no --checkpoint-dir: nothing is kept");
    if (find_nonfinite(t, grads, where, sizeof where))
        return nl_err("step %" PRId64
                      ": non-finite values (loss %g): first in the %s; stopping, %s, no adapter written "
                      "(try a lower --lr; check the --init-adapter and the data)",
                      step, loss, where, kept);
    return nl_err("step %" PRId64
                  ": the loss is not finite (%g) while every LoRA parameter%s is finite (the base model's "
                  "activations overflow?); stopping, %s, no adapter written",
                  step, loss, grads ? " and gradient" : "", kept);
}

/* ---- one step's sequences in one graph call ---- */

/* The nseq sequences of the step (t->res.pk.seq[idx[i]]) packed back to back through
 * nl_graph_seqs; their losses added in order into *loss_sum (as one call each would). */
static int step_packed(nl_trainer *t, nl_graph *g, const int *idx, int nseq, float inv_n, double *loss_sum,
                       int64_t *n_tokens) {
    int64_t T = 0;
    for (int i = 0; i < nseq; i++) T += t->res.pk.seq[idx[i]].n_tokens;
    if (T > INT32_MAX) return nl_err("a step of %" PRId64 " tokens is too long for one call", T);
    int32_t *ids = nl_malloc((size_t)T * 2 * sizeof *ids);
    int *seg = nl_malloc((size_t)nseq * sizeof *seg);
    double *ls = nl_malloc((size_t)nseq * sizeof *ls);
    int rc = -1;
    if (!ids || !seg || !ls) goto out;
    int32_t *rows = ids + T;
    for (int i = 0, t0 = 0; i < nseq; t0 += seg[i++]) {
        const nl_seq *sq = &t->res.pk.seq[idx[i]];
        seg[i] = sq->n_tokens;
        memcpy(ids + t0, sq->ids, (size_t)sq->n_tokens * sizeof *ids);
        nl_row_targets(sq->ids, sq->target, sq->n_tokens, rows + t0);
    }
    if (nl_graph_seqs(g, nseq, seg, ids, rows, inv_n, ls)) goto out;
    for (int i = 0; i < nseq; i++) *loss_sum += ls[i];
    g->tok_base += T;
    *n_tokens += T;
    rc = 0;
out:
    free(ids), free(seg), free(ls);
    return rc;
}

/* ---- the step kinds --------------------------------------------------------------------
 * One optimizer step `step` (1-based) on the batch idx[0..nseq) through the run's graph, at
 * the learning rate of t->plan (aw / mz): the params are updated in place, so (n_targets in,
 * the rest out) says what it did. Return 0 (done), 1 (stopped inside a pause: the params are
 * those of the last step), -1 (an error, set; a non-finite value is named). */

/* What a step did (step_backprop / step_mezo). */
typedef struct {
    double loss, gnorm, pgrad, lr;
    int64_t n_tokens, n_targets;
} step_out;

/* MeZO: two forwards, no backward; the step updates the params itself (on any error they are
 * as before). */
static int step_mezo(nl_trainer *t, int64_t step, const int *idx, int nseq, step_out *so) {
    const int64_t last_commit = t->count.last_commit;
    nl_mezo_result mr;
    if (nl_mezo_step(&t->res.g, &t->plan.mz, step, t->res.pk.seq, idx, nseq, &mr)) {
        if (!t->count.stop_in_pause) {
            /* the loss was not finite (the params are back at θ): name the tensor */
            if (strstr(nl_last_error(), "not finite")) nonfinite_error(t, step, last_commit, NAN, NULL);
            return -1;
        }
        return 1;
    }
    so->loss = mr.loss;
    so->pgrad = mr.proj_grad;
    so->n_tokens = mr.n_tokens;
    so->gnorm = mr.grad_norm;
    if (!all_finite(t->res.ad->params, t->res.ad->n_params, &(size_t){0})) {
        nonfinite_error(t, step, last_commit, so->loss, NULL);
        return -1;
    }
    return 0;
}

/* Backprop: the gradients of the step's sequences (one graph call, or one a sequence with the
 * tests' hook), clipped, then AdamW. */
static int step_backprop(nl_trainer *t, int64_t step, const int *idx, int nseq, step_out *so) {
    const nl_train_opts *o = t->o;
    nl_graph *g = &t->res.g;
    const int64_t n_targets = so->n_targets, last_commit = t->count.last_commit;
    int64_t *n_tokens = &so->n_tokens;
    double *loss = &so->loss;
    size_t np = t->res.ad->n_params;
    memset(t->res.grads, 0, np * sizeof(float));
    g->step = step;
    g->tok_base = 0;
    double loss_sum = 0.0;
    float inv_n = n_targets ? 1.0f / (float)n_targets : 0.0f;
    if (!t->hk.per_sequence) {
        /* the step's sequences in one graph call: one request per projection */
        int r = step_packed(t, g, idx, nseq, inv_n, &loss_sum, n_tokens);
        if (r) return t->count.stop_in_pause ? 1 : -1;
    }
    for (int i = 0; t->hk.per_sequence && i < nseq; i++) {
        const nl_seq *sq = &t->res.pk.seq[idx[i]];
        int32_t *rows = nl_malloc((size_t)sq->n_tokens * sizeof *rows);
        if (!rows) return -1;
        nl_row_targets(sq->ids, sq->target, sq->n_tokens, rows);
        double ls;
        int r = nl_graph_seq(g, sq->ids, rows, sq->n_tokens, inv_n, &ls);
        free(rows);
        if (r) return t->count.stop_in_pause ? 1 : -1;
        loss_sum += ls;
        g->tok_base += sq->n_tokens;
        *n_tokens += sq->n_tokens;
    }
    *loss = n_targets ? loss_sum / (double)n_targets : 0.0;
    if (t->hk.after_backward) t->hk.after_backward(t->hk.user, step, t->res.ad, t->res.grads);
    size_t bad;
    if (!isfinite(*loss) || !all_finite(t->res.grads, np, &bad))
        return nonfinite_error(t, step, last_commit, *loss, t->res.grads), -1;
    if (o->dump_grads && step == 1) {
        if (nl_adapter_save_values(t->res.ad, t->res.m, t->res.grads, o->dump_grads)) return -1;
    }
    so->gnorm = nl_grad_clip(t->res.grads, np, o->clip);
    if (!isfinite(so->gnorm)) return nonfinite_error(t, step, last_commit, *loss, t->res.grads), -1;
    if (adamw_pool(&t->res.rt, t->res.ad->params, t->res.grads, t->res.mom, t->res.vel, np, &t->plan.aw, step))
        return -1;
    if (!all_finite(t->res.ad->params, np, &bad)) return nonfinite_error(t, step, last_commit, *loss, t->res.grads), -1;
    return 0;
}

/* The options a run cannot start with, each refused with its flag before anything is opened;
 * the outputs are probed for writability now, not after a night of training. */
static int check_opts(const nl_train_opts *o) {
    if (!o->model || !o->data || !o->out) return nl_err("train: --model, --data and --out are required");
    if (o->method && strcmp(o->method, "backprop") && strcmp(o->method, "mezo"))
        return nl_err("--method %s: expected backprop or mezo", o->method);
    const int mezo = o->method && !strcmp(o->method, "mezo");
    if (mezo && !(o->mezo_eps > 0 && isfinite(o->mezo_eps)))
        return nl_err("--mezo-eps %g: expected a finite value > 0", o->mezo_eps);
    if (o->mem_limit_mb < 0 || !isfinite(o->mem_limit_mb))
        return nl_err("--mem-limit-mb %g: expected > 0", o->mem_limit_mb);
    if (o->overlap && strcmp(o->overlap, "auto") && strcmp(o->overlap, "on") && strcmp(o->overlap, "off"))
        return nl_err("--overlap %s: expected auto, on or off", o->overlap);
    if (o->batch_tokens < 0) return nl_err("--batch-tokens %d: expected >= 1 (0: sized to the data)", o->batch_tokens);
    if (o->dropout < 0 || o->dropout >= 1) return nl_err("--dropout %g: expected 0 <= p < 1", o->dropout);
    if (!(o->lr > 0)) return nl_err("--lr %g: expected > 0", o->lr);
    if (o->cosine && !(o->lr_min < 0) && !(o->lr_min <= o->lr))
        return nl_err("--lr-min %g: expected 0 <= lr-min <= --lr %g", o->lr_min, o->lr);
    if (o->steps < 0) return nl_err("--steps %" PRId64 ": expected >= 1", o->steps);
    if (o->steps == 0 && !(o->epochs > 0)) return nl_err("--epochs %g: expected > 0", o->epochs);
    if (o->commit_every < 1) return nl_err("--commit-every %" PRId64 ": expected >= 1", o->commit_every);
    if (o->save_every < 0) return nl_err("--save-every %" PRId64 ": expected >= 1 (0: no snapshots)", o->save_every);
    if (o->resume && !o->checkpoint_dir) return nl_err("--resume needs --checkpoint-dir");
    if (o->val_data && o->val_split > 0) return nl_err("give --val-data or --val-split, not both");
    if (o->val_split < 0 || o->val_split >= 1)
        return nl_err("--val-split %g: expected a fraction in (0, 1)", o->val_split);
    if (o->eval_every < 0 || o->early_stop < 0 || o->keep_best < 0 || o->keep_best > NL_KEEP_ACCURACY)
        return nl_err("--eval-every %lld / --early-stop %lld / --keep-best %d: out of range", (long long)o->eval_every,
                      (long long)o->early_stop, o->keep_best);
    if ((o->eval_every || o->keep_best || o->early_stop) && !o->val_data && !(o->val_split > 0))
        return nl_err("--%s needs a validation set: --val-data FILE or --val-split F", o->eval_every  ? "eval-every"
                                                                                       : o->keep_best ? "keep-best"
                                                                                                      : "early-stop");
    /* every numeric option in the range the CLI's flags have (the C API and Python pass here too) */
    if (nl_train_check_opts(o)) return -1;
    /* what is written at the end must be writable now, not after a night of training */
    if (probe_output("out", o->out)) return -1;
    if (o->dump_grads && probe_output("dump-grads", o->dump_grads)) return -1;
    if (nl_chat_template_check(o->chat_template)) return nl_err_prefix("--template %s", o->chat_template);
    if (o->dump_grads && mezo) return nl_err("--dump-grads: MeZO computes no gradients (use --method backprop)");
    return 0;
}

/* Opens what a run reads: the model and its tokenizer, the adapter (fresh or --init-adapter),
 * the projection service and runtime, the checkpoint directory's state for a fresh run, and
 * the data, tokenized and packed into sequences of at most t->plan.max_ctx tokens. */
static int open_run(nl_trainer *t) {
    const nl_train_opts *o = t->o;
    t->res.m = nl_model_load(o->model);
    if (!t->res.m) return -1;
    if (nl_tokenizer_for_model(t->res.m, &t->res.tok)) return -1;
    if (t->res.m->warning && o->warnings) fprintf(o->warnings, "warning: %s: %s\n", o->model, t->res.m->warning);
    if (!t->res.tok) {
        nl_err("%s: the model has no tokenizer vocabulary", o->model);
        return -1;
    }
    if (o->init_adapter) t->res.ad = nl_adapter_load(t->res.m, o->init_adapter);
    else t->res.ad = nl_adapter_new(t->res.m, o->targets, o->rank, o->alpha, o->seed);
    if (!t->res.ad) return -1;
    /* llama.cpp finds a LoRA pair by its base tensor's name: a tied model has no output.weight,
     * and token_embd.weight.lora_a/b is validated and applied as an EMBEDDING adapter (at the
     * token lookup), so no adapter file adapts a tied head alone; merge cannot either (the head
     * and the embedding are one tensor). Refused before anything is trained. */
    if (t->res.m->tied_head && t->res.ad->by_proj[t->res.m->p_output] >= 0) {
        if (o->init_adapter)
            nl_err(
                "--init-adapter %s adapts the output head, which this model ties to token_embd.weight: an adapter on a "
                "tied head loads in neither llama.cpp nor merge; start a fresh adapter without \"output\" in --targets",
                o->init_adapter);
        else
            nl_err(
                "--targets output: %s ties its output head to token_embd.weight (it has no output.weight), and an "
                "adapter on a tied head loads in neither llama.cpp (token_embd.weight.lora_a/b would be taken for an "
                "embedding adapter) nor merge (the head and the embedding are one tensor); drop \"output\" from "
                "--targets (\"all\" leaves the head out)",
                o->model);
        return -1;
    }
    if (o->init_adapter && o->init_rank > 0 && t->res.ad->rank != o->init_rank) {
        nl_err("--init-adapter %s has rank %d, --rank %d was asked: drop --rank (the adapter's rank is used) or start "
               "a fresh adapter without --init-adapter",
               o->init_adapter, t->res.ad->rank, o->init_rank);
        return -1;
    }
    t->res.svc = nl_proj_service_new(&o->proj);
    if (!t->res.svc || nl_runtime_init(&t->res.rt, t->res.m, t->res.svc)) return -1;
    t->res.rt.adapter = t->res.ad;
    t->res.rt.sync = nl_train_sync_mode(o);
    if (o->checkpoint_dir && !o->resume) {
        /* A fresh run must not silently replace the commits of another run, and a listing that
         * fails must not pass for an empty directory. */
        int has = nl_ckpt_dir_has_commits(o->checkpoint_dir, t->hk.ckpt_io);
        if (has < 0) {
            nl_err_prefix("cannot tell whether %s holds commits, so no fresh run starts there", o->checkpoint_dir);
            return -1;
        }
        if (has) {
            nl_err(
                "%s already holds commits of a run: pass --resume to continue it, or choose another --checkpoint-dir",
                o->checkpoint_dir);
            return -1;
        }
    }

    if (nl_train_load_data(o, t->res.m, t->res.tok, &t->res.ds, &t->res.pk, &t->plan.max_ctx, &t->val.ds)) return -1;
    t->res.ds_loaded = t->res.pk_loaded = 1;
    /* the validation set: held out of the data before it was packed (--val-split), or its own file */
    nl_data_opts dopt = {.chat_template = o->chat_template,
                         .n_vocab = t->res.m->hp.n_vocab,
                         .strict_keys = o->strict_keys,
                         .columns = o->columns,
                         .alpaca = o->alpaca_prompt};
    if (o->val_data && nl_dataset_load(o->val_data, t->res.tok, &dopt, &t->val.ds)) return -1;
    t->val.loaded = o->val_split > 0 || o->val_data;
    if (t->val.loaded && nl_val_init(&t->val, t->plan.max_ctx, o->eval_every, o->keep_best, o->early_stop)) return -1;
    return 0;
}

/* ---- the run's plan, before the first step ---------------------------------------------- */

/* The plan of the steps: the rows of one graph call, the service's plan (its checks' buffers
 * are part of the peak the preflight counts), the memory preflight and the activation budget
 * it leaves the graph, and what the service computes with, said. avail, rss0: the memory
 * there was and the process's RSS before the run (nl_train_mem_preflight). */
static int plan_run(nl_trainer *t, int64_t avail, int64_t rss0) {
    const nl_train_opts *o = t->o;
    int max_T = 1, longest;
    int64_t all_T = 0;
    for (int i = 0; i < t->res.pk.n; i++) {
        if (t->res.pk.seq[i].n_tokens > max_T) max_T = t->res.pk.seq[i].n_tokens;
        all_T += t->res.pk.seq[i].n_tokens;
    }
    /* the rows of one graph call: a step's sequences packed (at most --batch-tokens, or one
     * longer sequence) */
    longest = max_T;
    if (!t->hk.per_sequence) {
        int64_t packed = all_T < o->batch_tokens ? all_T : o->batch_tokens;
        if (packed > max_T) max_T = (int)packed;
    }
    /* keep_scratch: the graph's buffers live across steps (freed in trainer_free) */
    t->res.g = (nl_graph){
        .rt = &t->res.rt, .ad = t->res.ad, .grads = NULL, .dropout = o->dropout, .seed = o->seed, .keep_scratch = 1};
    /* planned first: its checks' buffers are part of the peak the preflight counts */
    if (nl_proj_plan(t->res.svc, NULL, 0)) return -1;
    uint64_t budget;
    if (nl_train_mem_preflight(t, max_T, longest, avail, o->mem_limit_mb > 0, rss0, &budget)) return -1;
    if (o->act_budget_mb == 0) budget = 0;
    t->res.g.act_budget = budget;
    if (o->progress) {
        char line[256], mem[512];
        nl_proj_format_precision(t->res.svc, line, sizeof line);
        fprintf(o->progress, "precision: %s\n", line);
        nl_proj_plan_format_summary(t->res.svc, line, sizeof line);
        nl_proj_format_resident(t->res.svc, mem, sizeof mem);
        char kern[256];
        const int kn = nl_proj_describe(t->res.svc, kern, sizeof kern);
        const char *colon = kn > 0 ? strchr(kern, ':') : NULL; /* "host: ..." -> "..." */
        char nodes[64];
        if (t->res.rt.tiles) snprintf(nodes, sizeof nodes, "attention and lora on %s tiles", t->res.rt.tiles->name);
        else
            snprintf(nodes, sizeof nodes, "attention %s%s", t->res.rt.attn_bf16 ? "bf16" : "f32",
                     lora_bf16(t) ? ", lora bf16" : "");
        fprintf(o->progress, "service: %s backend, %s, %s; resident %s; %s, %s\n",
                o->proj.backend ? o->proj.backend : "ref", colon ? colon + 2 : "f32 compute", line, mem,
                t->res.rt.sync ? "synchronous" : "LoRA overlapped with requests", nodes);
        if (o->proj.verbose) {
            char *table = nl_proj_plan_format_table(t->res.svc);
            if (table) fputs(table, o->progress);
            free(table);
        }
    }
    return 0;
}

/* Pacing (thermal, battery: the runtime's pace hook between service requests) and the energy
 * counter: one where the machine has one, else the reason, said (never an estimate). */
static int open_pacing(nl_trainer *t) {
    const nl_train_opts *o = t->o;
    nl_thermal_provider prov;
    if (nl_thermal_open(&prov, o->thermal ? o->thermal : "auto", o->thermal_status_file, o->battery_temp_file))
        return -1;
    nl_pacer_cfg pc;
    nl_pacer_defaults(&pc);
    pc.enabled = !(o->thermal && !strcmp(o->thermal, "off")) || o->thermal_status_file || o->battery_temp_file;
    if (o->pacing_poll_s > 0) pc.check_interval_s = pc.poll_interval_s = o->pacing_poll_s;
    pc.log = pace_log;
    pc.log_ctx = o->progress;
    pc.should_stop = nl_cancel_poll;
    pc.stop_ctx = o->cancel;
    if (nl_pacer_init(&t->res.pacer, &pc, &prov)) return -1;
    t->res.pacer_ok = 1;
    t->res.rt.pace = pace_hook;
    t->res.rt.pace_user = t;
    t->res.en = nl_energy_open(t->hk.energy_root);
    if (!t->res.en) return -1;
    if (nl_energy_available(t->res.en)) {
        if (nl_energy_start_sampler(t->res.en, 0.5)) return -1;
        if (o->progress)
            fprintf(o->progress, "energy: %s counters (%s)\n",
                    nl_energy_kind_of(t->res.en) == NL_ENERGY_RAPL ? "RAPL package" : "battery",
                    nl_energy_source(t->res.en));
    } else if (o->progress) {
        fprintf(o->progress, "energy counters not available: %s\n", nl_energy_reason(t->res.en));
    }
    return 0;
}

/* The optimizer's side: the run's step count, the batcher, the state (AdamW gradients and
 * moments; MeZO: the zero moments its commits carry), the schedule and the step configs. */
static int open_state(nl_trainer *t) {
    const nl_train_opts *o = t->o;
    t->plan.total = nl_train_count_steps(o, &t->res.pk, &t->plan.per_epoch);
    if (t->plan.total < 0) return -1;
    t->res.bt = nl_batcher_new(&t->res.pk, o->seed, o->shuffle, o->batch_tokens);
    if (!t->res.bt) return -1;
    size_t np = t->res.ad->n_params;
    if (t->plan.mezo) {
        t->res.zeros = nl_calloc(np ? np : 1, sizeof(float));
        if (!t->res.zeros) return -1;
    } else {
        t->res.grads = nl_calloc(np, sizeof(float));
        t->res.mom = nl_calloc(np, sizeof(float));
        t->res.vel = nl_calloc(np, sizeof(float));
        if (!t->res.grads || !t->res.mom || !t->res.vel) return -1;
    }
    t->res.g.grads = t->res.grads;
    t->plan.sched = nl_train_schedule(o);
    nl_adamw_defaults(&t->plan.aw);
    t->plan.aw.weight_decay = o->weight_decay;
    nl_mezo_defaults(&t->plan.mz);
    t->plan.mz.eps = o->mezo_eps;
    t->plan.mz.weight_decay = o->weight_decay;
    t->plan.mz.seed = o->seed;
    return 0;
}

/* --resume: the newest commit that verifies and matches this run's description (desc) is
 * loaded into the adapter, the optimizer state and the data cursor, and *step set to its step;
 * a run with other settings is refused, naming each difference; other kernels are refused
 * unless allowed, other numerics warn. No commit: *step stays 0. */
static int resume_from(nl_trainer *t, const nl_run_desc *desc, int64_t *step) {
    const nl_train_opts *o = t->o;
    size_t np = t->res.ad->n_params;
    nl_ckpt ck;
    char warn[512];
    int r = nl_ckpt_load_latest(o->checkpoint_dir, t->plan.cfg_hash, t->plan.model_hash, np, &ck, warn, sizeof warn,
                                t->hk.ckpt_io);
    int legacy = 0;
    if (r < 0) {
        /* commits of a build before the schedule left the config hash carry the older hash
         * (the schedule hashed with the rest): such a commit of this configuration is taken */
        char first[1536];
        snprintf(first, sizeof first, "%s", nl_last_error());
        uint64_t lh = nl_desc_legacy_config_hash(desc, o->checkpoint_dir);
        if (lh && lh != t->plan.cfg_hash &&
            nl_ckpt_load_latest(o->checkpoint_dir, lh, t->plan.model_hash, np, &ck, warn, sizeof warn, t->hk.ckpt_io) ==
                0) {
            legacy = 1;
            r = 0;
        } else {
            nl_err("%s", first);
        }
    }
    if (r < 0) {
        /* name what differs when the run's description is there to compare with */
        char why[1536];
        int n = snprintf(
            why, sizeof why,
            "%s: cannot resume: this run's settings differ from those the commits were made with: ", o->checkpoint_dir);
        if (n > 0 && (size_t)n < sizeof why &&
            nl_desc_compare(desc, o->checkpoint_dir, NL_KV_CONFIG, NULL, why, sizeof why) > 0)
            nl_err("%s (start a fresh run with another --checkpoint-dir, or resume with the same settings)", why);
        return -1;
    }
    if (warn[0] && o->warnings) fprintf(o->warnings, "warning: %s\n", warn);
    if (r != 0) {
        if (o->progress) fprintf(o->progress, "no commit in %s: starting from step 0\n", o->checkpoint_dir);
        return 0;
    }
    memcpy(t->res.ad->params, ck.params, np * sizeof(float));
    if (!t->plan.mezo) {
        memcpy(t->res.mom, ck.m, np * sizeof(float));
        memcpy(t->res.vel, ck.v, np * sizeof(float));
    }
    uint64_t ck_step = ck.step;
    nl_data_cursor cur = {.epoch = (int64_t)ck.epoch, .index = (int64_t)ck.index};
    if (t->val.loaded && nl_val_state_unpack(ck.cursor, ck.n_cursor, o->checkpoint_dir, &t->val.st)) {
        nl_ckpt_free(&ck);
        return -1;
    }
    nl_ckpt_free(&ck);
    /* a step is never trusted into a narrower type: a forged one above the run's count is refused */
    if (ck_step > (uint64_t)t->plan.total)
        return nl_err("%s: the newest commit is at step %" PRIu64 ", beyond this run's %" PRId64 " steps",
                      o->checkpoint_dir, ck_step, t->plan.total);
    *step = (int64_t)ck_step;
    if (nl_batcher_seek(t->res.bt, cur)) return -1;
    char diff[1024] = "";
    /* other kernels are refused, whether by capability (another machine, the same settings) or
     * asked for (another backend, e.g. vulkan after host): the run would not be the bits an
     * uninterrupted one gives; --allow-kernel-change continues, with a warning */
    if (nl_desc_compare(desc, o->checkpoint_dir, NL_KV_KERNELS, NULL, diff, sizeof diff) > 0) {
        if (!o->allow_kernel_change)
            return nl_err(
                "%s: cannot resume bit-identically: %s; pass --allow-kernel-change to continue on these kernels "
                "(the result will differ from an uninterrupted run)",
                o->checkpoint_dir, diff);
        if (o->warnings) fprintf(o->warnings, "warning: resuming on other kernels (%s)\n", diff);
    }
    diff[0] = 0;
    if (nl_desc_compare(desc, o->checkpoint_dir, NL_KV_NUMERICS, NULL, diff, sizeof diff) > 0 && o->warnings)
        fprintf(o->warnings,
                "warning: resuming with other numerics (%s): the result will differ from an uninterrupted run\n", diff);
    /* an extended run: more steps, another learning rate or schedule, with the optimizer state */
    char chg[1024] = "";
    if (nl_desc_changes(desc, o->checkpoint_dir, NL_KV_SCHEDULE, chg, sizeof chg) > 0 && o->progress)
        fprintf(o->progress, "resuming step %" PRId64 ": %s\n", *step, chg);
    if (legacy) {
        /* committed again in the current format (same state, this run's config hash) before the
         * run.json of this run replaces the one the old hash was checked against */
        if (commit_state(t, t->plan.cfg_hash, t->plan.model_hash, *step, cur) < 0) return -1;
        if (o->progress)
            fprintf(o->progress,
                    "the commit of step %" PRId64
                    " was made by an older build (its config hash includes the schedule): "
                    "committed again in the current format\n",
                    *step);
    }
    if (o->progress)
        fprintf(o->progress, "resumed from %s at step %" PRId64 "/%" PRId64 "\n", o->checkpoint_dir, *step,
                t->plan.total);
    struct stat st;
    if (o->keep_best && t->val.st.best_step > 0 && stat(o->out, &st) != 0 && o->warnings)
        fprintf(o->warnings,
                "warning: the best adapter so far (step %" PRId64 ") was written to --out %s, which is not there now\n",
                t->val.st.best_step, o->out);
    return 0;
}

/* The snapshot of `step` (save_every) at `path`: the adapter as --out is written, atomically
 * (os/io). A failure ends the run like a failed --out. */
static int write_snapshot(nl_trainer *t, int64_t step, const char *path) {
    const nl_train_opts *o = t->o;
    if (!nl_adapter_save(t->res.ad, t->res.m, path)) return 0;
    char why[1024];
    snprintf(why, sizeof why, "--save-every %" PRId64 ": writing the snapshot of step %" PRId64 " failed: %s",
             o->save_every, step, nl_last_error());
    output_error(o, step, why, t->count.last_commit, "--out");
    return -1;
}

/* Snapshots at the start. A snapshot follows its step's commit, so a resumed run (from its
 * newest commit) replays no step whose snapshot was written: the earlier ones stay as they are;
 * the snapshot of the step it resumes from is written when missing (a run killed between that
 * commit and its snapshot). A run whose steps end before the first snapshot is told. */
static int start_snapshots(nl_trainer *t, int64_t step) {
    const nl_train_opts *o = t->o;
    if (o->save_every > t->plan.total && o->warnings)
        fprintf(o->warnings,
                "warning: --save-every %" PRId64 " is beyond this run's %" PRId64
                " steps: no snapshot will be written\n",
                o->save_every, t->plan.total);
    if (step == 0 || step % o->save_every) return 0;
    char *path = nl_train_snapshot_path(o->out, step);
    if (!path) return -1;
    struct stat st;
    int rc = 0;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        rc = write_snapshot(t, step, path);
        if (!rc && o->progress)
            fprintf(o->progress, "snapshot of step %" PRId64 " was missing: written to %s\n", step, path);
    }
    free(path);
    return rc;
}

/* Where the run starts: the identity its commits carry (the model's hash, the run's
 * description, DIR/run.json), the commit a --resume continues from, the --log-json opened, and
 * the run said. *step: the step it starts from. */
static int start_run(nl_trainer *t, int64_t *step) {
    const nl_train_opts *o = t->o;
    /* The model's identity in every commit: a hash of every byte of the file, read through the
     * run's own mapping (a weight changed anywhere makes --resume refuse it; a file changing
     * while it is hashed is caught by the check before the first step); only commits need it. */
    if (o->checkpoint_dir) {
        double th = nl_now();
        t->plan.model_hash = nl_content_hash64(t->res.m->gguf->base, t->res.m->gguf->size);
        if (o->proj.verbose && o->progress) {
            double dt = nl_now() - th;
            fprintf(o->progress, "model identity: %s hashed whole (%.1f MiB) in %.3f s (%.1f GB/s)\n", o->model,
                    (double)t->res.m->gguf->size / NL_MB, dt, dt > 0 ? (double)t->res.m->gguf->size / dt / 1e9 : 0.0);
        }
    }
    nl_run_desc desc;
    build_desc(t, t->plan.model_hash, packing_hash(&t->res.pk), t->plan.total, t->plan.max_ctx, &desc);
    t->plan.cfg_hash = nl_desc_config_hash(&desc);
    *step = 0;
    int drc = desc.oom ? nl_err("out of memory describing the run") : 0;
    if (!drc && o->resume && resume_from(t, &desc, step)) drc = -1;
    t->count.first_step = t->count.last_commit = *step;
    if (!drc && o->save_every > 0 && start_snapshots(t, *step)) drc = -1;
    /* the history first: it says what this run changed against the run.json it replaces */
    if (!drc && o->checkpoint_dir &&
        nl_desc_history(&desc, o->checkpoint_dir, *step, *step > 0, t->plan.total, o->command))
        drc = -1;
    if (!drc && o->checkpoint_dir && nl_desc_write(&desc, o->checkpoint_dir)) drc = -1;
    nl_desc_free(&desc);
    if (drc) return -1;
    if (o->log_json) {
        /* A resumed run logs from its commit on: lines of later steps (replayed now) go. */
        if (o->resume && log_keep_steps(o->log_json, *step)) return -1;
        if (!(t->res.log = open_log(o->log_json, o->resume))) return -1;
    }
    if (o->progress)
        fprintf(
            o->progress,
            "training %s on %s: %d examples, %d sequences (%d truncated to %d tokens, %d dropped with no target left), "
            "%" PRId64 " steps, %d adapted projections (%zu parameters, rank %d)%s\n",
            o->model, o->data, t->res.ds.n, t->res.pk.n, t->res.pk.n_truncated, t->plan.max_ctx, t->res.pk.n_dropped,
            t->plan.total, t->res.ad->n, t->res.ad->n_params, t->res.ad->rank,
            t->plan.mezo ? ", MeZO (two forwards a step, no backward)" : "");
    if (o->progress && t->plan.batch_sized != NL_BATCH_GIVEN) {
        char note[640];
        fprintf(o->progress, "batch: --batch-tokens %d (%" PRId64 " steps an epoch), %s\n", o->batch_tokens,
                t->plan.per_epoch, nl_train_batch_note(t->plan.batch_sized, note, sizeof note));
    }
    /* how the data was read (keys skipped, Alpaca's prompt) and a run too short to learn: said
     * on the warnings stream, which a quiet run (no progress) keeps */
    if (o->warnings) {
        char warn[640];
        if (nl_dataset_note(&t->res.ds, warn, sizeof warn)[0]) fprintf(o->warnings, "data: %s\n", warn);
        if (nl_train_short_run(o, &t->res.pk, t->plan.total, t->plan.per_epoch, warn, sizeof warn)) return -1;
        if (warn[0]) fprintf(o->warnings, "warning: %s\n", warn);
        fflush(o->warnings);
    }
    if (o->progress) {
        if (t->val.loaded) {
            char what[600];
            if (o->val_split > 0)
                snprintf(what, sizeof what, "held out of %s by --val-split %g", o->data, o->val_split);
            else snprintf(what, sizeof what, "%s", o->val_data);
            nl_val_say(&t->val, o->progress, what);
        }
        fflush(o->progress);
    }
    return 0;
}

/* ---- a step's report ---------------------------------------------------------------------- */

/* What a step is measured from, read just before it. */
typedef struct {
    double t0, paused0, j0;
    int have_j; /* j0 was read */
    nl_proj_stats st0;
} step_mark;

static void mark_step(nl_trainer *t, step_mark *mk) {
    mk->paused0 = t->res.pacer.paused_seconds;
    t->res.pacer.pause_kinds = 0; /* what pauses this step: its log row's pause_kind */
    mk->t0 = nl_now();
    mk->j0 = 0;
    mk->have_j = nl_energy_available(t->res.en) && !t->count.energy_failing && nl_energy_read(t->res.en, &mk->j0) == 0;
    nl_proj_get_stats(t->res.svc, &mk->st0);
}

/* The row of finished step `step` for o->on_progress: before the stop check, so that a cancel
 * from the callback ends the run at this step, with its commit. */
static void progress_step(const nl_trainer *t, int64_t step, const step_out *so, double seconds, double paused_s) {
    double el = nl_now() - t->count.run_start;
    nl_train_progress p = {.kind = NL_PROGRESS_STEP,
                           .step = step,
                           .total_steps = t->plan.total,
                           .loss = so->loss,
                           .lr = so->lr,
                           .grad_norm = so->gnorm,
                           .tokens = so->n_tokens,
                           .seconds = seconds,
                           .paused_seconds = paused_s,
                           .tokens_per_s = el > 0 ? (double)t->count.run_tokens / el : 0.0,
                           .elapsed_seconds = el,
                           .eval_accuracy = -1};
    t->o->on_progress(t->o->progress_user, &p);
}

/* The evaluation after `step` (train/validate.h), its outputs' failures said like the step's.
 * 0 done, 1 stopped while paused in it (nothing recorded), -1 an error (set). */
static int val_eval(nl_trainer *t, int64_t step) {
    const nl_train_opts *o = t->o;
    int vr = nl_val_eval(&t->val, &t->res.rt, step, &t->res.pacer.paused_seconds, t->res.log, o->progress, t->res.ad,
                         t->res.m, o->out);
    if (vr == -1 && t->count.stop_in_pause) return 1;
    if (vr == 0 && o->on_progress) { /* the validation row for the library's caller */
        const nl_eval_result *r = &t->val.last;
        const double acc = nl_val_accuracy(r);
        nl_train_progress p = {.kind = NL_PROGRESS_EVAL,
                               .step = step,
                               .total_steps = t->plan.total,
                               .eval_loss = nl_eval_loss(r),
                               .eval_accuracy = isnan(acc) ? -1 : acc,
                               .eval_examples = r->n_examples,
                               .eval_tokens = r->n_targets,
                               .eval_seconds = t->val.last_seconds,
                               .paused_seconds = t->res.pacer.paused_seconds,
                               .elapsed_seconds = nl_now() - t->count.run_start};
        o->on_progress(o->progress_user, &p);
    }
    if (vr == -2) {
        char why[1024];
        snprintf(why, sizeof why, "%s", nl_last_error());
        output_error(o, step, why, t->count.last_commit, t->val.failed_flag);
    }
    return vr < 0 ? -1 : 0;
}

/* The report of finished step `step`: its energy and service time, the result's totals, the
 * progress row, the --log-json line, the evaluation when one is due, the commit when one is due, the progress
 * line. Returns 1 when the run is to stop now (a cancel, stop_after: committed), 2 when
 * --early-stop ends it (committed), 0 to go on, -1 on an error (set). */
static int report_step(nl_trainer *t, int64_t step, const step_mark *mk, const step_out *so, nl_train_result *res) {
    const nl_train_opts *o = t->o;
    t->count.steps_this_run++;
    t->count.run_tokens += so->n_tokens;
    double dt = nl_now() - mk->t0;
    double j1 = 0;
    int have_j = mk->have_j;
    if (have_j && nl_energy_read(t->res.en, &j1) != 0) {
        have_j = 0;
        t->count.energy_failing = 1;
        if (o->warnings)
            fprintf(o->warnings, "warning: energy counter: %s; no more joules in the log\n", nl_last_error());
    }
    nl_proj_stats st1;
    nl_proj_get_stats(t->res.svc, &st1);
    double svc_s = (st1.busy_s[0] + st1.busy_s[1]) - (mk->st0.busy_s[0] + mk->st0.busy_s[1]);
    double paused_s = t->res.pacer.paused_seconds - mk->paused0;
    res->service_seconds += svc_s;
    res->tokens += so->n_tokens;
    if (step == t->count.first_step + 1) res->first_loss = so->loss;
    res->last_loss = so->loss;
    if (o->on_progress) progress_step(t, step, so, dt, paused_s);
    const int signalled = nl_cancel_requested(o->cancel); /* SIGINT/SIGTERM in the CLI */
    int stop = (o->stop_after > 0 && t->count.steps_this_run >= o->stop_after) || signalled;
    res->signalled = signalled;
    /* a snapshot step is a commit step, the commit first: a resume never replays the step of a
     * snapshot written, and one killed in between writes the missing snapshot (start_run) */
    int snap = o->save_every > 0 && step % o->save_every == 0;
    int commit = o->checkpoint_dir && (step % o->commit_every == 0 || step == t->plan.total || stop || snap);
    /* The log line goes out BEFORE the commit (and is made durable with it): a kill in
     * between leaves a line for an uncommitted step, which the resume drops and replays;
     * the other order could lose the line of a committed step for good. */
    if (t->res.log) {
        fprintf(t->res.log,
                "{\"step\": %" PRId64 ", \"loss\": %.17g, \"tokens\": %lld, \"targets\": %lld, \"seconds\": %.4f, "
                "\"service_seconds\": %.4f, \"paused_seconds\": %.4f, \"lr\": %.17g, \"grad_norm\": %.17g",
                step, so->loss, (long long)so->n_tokens, (long long)so->n_targets, dt, svc_s, paused_s, so->lr,
                so->gnorm);
        const char *pk = paused_s > 0 ? nl_pause_kind_name(t->res.pacer.pause_kinds) : NULL;
        if (pk) fprintf(t->res.log, ", \"pause_kind\": \"%s\"", pk);
        if (t->plan.mezo) fprintf(t->res.log, ", \"projected_grad\": %.17g", so->pgrad);
        if (have_j)
            fprintf(t->res.log, ", \"joules\": %.6g, \"joules_per_token\": %.6g", j1 - mk->j0,
                    so->n_tokens ? (j1 - mk->j0) / (double)so->n_tokens : 0.0);
        fputs("}\n", t->res.log);
        if (fflush(t->res.log) != 0 || (commit && fsync(fileno(t->res.log)) != 0)) {
            char why[512];
            snprintf(why, sizeof why, "--log-json %s: write failed: %s", o->log_json, strerror(errno));
            output_error(o, step, why, t->count.last_commit, "--log-json");
            return -1;
        }
    }
    /* The evaluation after this step, before its commit (which carries what it decided); a
     * signal skips it (the commit then has it pending: a resume evaluates first). */
    int early = 0;
    if (t->val.loaded && !signalled && nl_val_due(step, t->plan.total, o->eval_every)) {
        int vr = val_eval(t, step);
        if (vr < 0) return -1;
        if (vr > 0) { /* stopped while paused in it: commit the step, the evaluation pending */
            stop = res->signalled = 1;
            commit = o->checkpoint_dir != NULL;
        }
        early = vr == 0 && nl_val_stop(&t->val.st, o->early_stop);
        if (early && o->checkpoint_dir) commit = 1;
        if (commit && t->res.log && fsync(fileno(t->res.log)) != 0) {
            char why[512];
            snprintf(why, sizeof why, "--log-json %s: write failed: %s", o->log_json, strerror(errno));
            output_error(o, step, why, t->count.last_commit, "--log-json");
            return -1;
        }
    }
    if (commit) {
        int crc = commit_state(t, t->plan.cfg_hash, t->plan.model_hash, step, nl_batcher_cursor(t->res.bt));
        if (crc) {
            commit_error(step, t->count.last_commit, crc);
            return -1;
        }
        t->count.last_commit = step;
    }
    char *snap_path = NULL;
    if (snap && (!(snap_path = nl_train_snapshot_path(o->out, step)) || write_snapshot(t, step, snap_path))) {
        free(snap_path);
        return -1;
    }
    if (o->progress) {
        /* training time only: paused time (pacing) and evaluations count in neither figure */
        double el = nl_now() - t->count.run_start - t->res.pacer.paused_seconds - t->val.seconds,
               tps = el > 0 ? (double)t->count.run_tokens / el : 0.0;
        char eta[32], paused[48] = "";
        fmt_eta(el / (double)t->count.steps_this_run * (double)(t->plan.total - step), eta, sizeof eta);
        if (t->res.pacer.paused_seconds > 0)
            snprintf(paused, sizeof paused, "  paused %.1fs", t->res.pacer.paused_seconds);
        fprintf(o->progress, "step %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  ETA %s%s  %s%s%s%s\n", step,
                t->plan.total, so->loss, tps, eta, paused, paused_s > 0 ? "paused" : "running",
                commit ? "  (committed)" : "", snap_path ? "  snapshot " : "", snap_path ? snap_path : "");
        fflush(o->progress);
    }
    free(snap_path);
    return early ? 2 : stop;
}

/* Stopped inside a pause while step + 1 ran: that step is abandoned; the state is that of
 * step, and the data cursor goes back to the batch it was given (prev). Committed when this
 * run finished a step. */
static int stop_paused(nl_trainer *t, int64_t step, nl_data_cursor prev, nl_train_result *res) {
    const nl_train_opts *o = t->o;
    if (nl_batcher_seek(t->res.bt, prev)) return -1;
    res->stopped = 1;
    res->signalled = 1;
    const int commit = o->checkpoint_dir && step > t->count.first_step;
    int crc = commit ? commit_state(t, t->plan.cfg_hash, t->plan.model_hash, step, prev) : 0;
    if (crc) {
        commit_error(step, t->count.last_commit, crc);
        return -1;
    }
    if (o->progress)
        fprintf(o->progress, "stopped at step %" PRId64 "/%" PRId64 "%s\n", step, t->plan.total,
                commit ? " (committed)" : "");
    return 0;
}

/* The end of the run (all steps, or a stop at step): the adapter written to --out. */
/* The --log-json's end: flushed, fsynced and closed, each checked (an EIO at close, which a
 * network filesystem reports there, means lines are lost: the run does not end with 0). */
static int close_log(nl_trainer *t, int64_t step) {
    const nl_io *io = t->hk.log_io ? t->hk.log_io : nl_io_posix();
    FILE *f = t->res.log;
    t->res.log = NULL;
    const char *what = "write";
    int rc = fflush(f) == 0 ? 0 : -1, e = errno;
    int fd = rc ? -1 : dup(fileno(f)); /* the descriptor the checked fsync and close go through */
    if (!rc && fd < 0) rc = -1, e = errno;
    if (fclose(f) != 0 && !rc) rc = -1, e = errno, what = "close";
    if (!rc && io->fsync(io->ctx, fd) != 0) rc = -1, e = errno, what = "fsync";
    if (fd >= 0 && io->close(io->ctx, fd) != 0 && !rc) rc = -1, e = errno, what = "close";
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "--log-json %s: %s failed: %s", t->o->log_json, what, strerror(e));
        output_error(t->o, step, why, t->count.last_commit, "--log-json");
    }
    return rc;
}

static int finish_run(nl_trainer *t, int64_t step, nl_train_result *res) {
    const nl_train_opts *o = t->o;
    if (model_changed(t, t->count.last_commit)) return -1;
    if (t->res.log && t->res.log != stdout && close_log(t, step)) return -1;
    /* --keep-best: --out holds the best evaluation's adapter (none yet: this one) */
    const int kept = t->val.loaded && o->keep_best && t->val.st.best_step > 0;
    if (!kept && nl_adapter_save(t->res.ad, t->res.m, o->out)) {
        char why[1024];
        snprintf(why, sizeof why, "--out %s: writing the adapter failed: %s", o->out, nl_last_error());
        output_error(o, step, why, t->count.last_commit, "--out");
        return -1;
    }
    res->paused_seconds = t->res.pacer.paused_seconds;
    if (t->val.loaded) {
        res->n_evals = t->val.n_evals;
        res->eval_seconds = t->val.seconds;
        res->val_step = t->val.last_step;
        res->val_loss = t->val.last_step ? nl_eval_loss(&t->val.last) : NAN;
        res->val_accuracy = t->val.last_step ? nl_val_accuracy(&t->val.last) : NAN;
        res->best_step = t->val.st.best_step;
        res->best_loss = t->val.st.best_loss;
        res->best_accuracy = t->val.st.best_accuracy;
    }
    res->steps_done = step;
    res->total_steps = t->plan.total;
    return 0;
}

int nl_train(const nl_train_opts *o, nl_train_result *res) { return nl_train_hooked(o, NULL, res); }

int nl_train_hooked(const nl_train_opts *o, const nl_train_hooks *h, nl_train_result *res) {
    /* the run's own options: o with its batch made the run's once the data is packed */
    nl_train_opts run = *o;
    nl_trainer t = {.o = &run, .res = {.lock_fd = -1, .lock_dir_fd = -1}};
    if (h) t.hk = *h;
    memset(res, 0, sizeof *res);
    int rc = -1;
    double t_start = nl_now();
    /* what there is before we take any: the model's conversions come out of it */
    int64_t avail = o->mem_limit_mb > 0 ? (int64_t)(o->mem_limit_mb * NL_MB) : nl_mem_available_bytes();
    int64_t rss0 = nl_rss_bytes(); /* the process before the run: what the run takes is counted from here */
    if (check_opts(o)) return -1;
    t.plan.mezo = o->method && !strcmp(o->method, "mezo");
    if (o->checkpoint_dir && lock_dir(o->checkpoint_dir, &t.res.lock_fd, &t.res.lock_dir_fd)) return -1;

    int64_t step = 0;
    if (open_run(&t) || (t.plan.batch_sized = nl_train_resolve_batch(&run, &t.res.pk)) < 0 ||
        plan_run(&t, avail, rss0) || open_pacing(&t) || open_state(&t) || start_run(&t, &step))
        goto done;
    if (model_changed(&t, t.count.last_commit)) goto done;
    t.count.run_start = nl_now();
    /* a run cancelled before its first step takes none (the adapter as it starts is written) */
    if (nl_cancel_requested(o->cancel)) res->stopped = res->signalled = step < t.plan.total;
    /* an evaluation the last commit left pending (a cancel came first) is done first */
    if (!res->stopped && t.val.loaded && step > 0 && t.val.st.last_eval < step &&
        nl_val_due(step, t.plan.total, o->eval_every)) {
        int vr = val_eval(&t, step);
        if (vr < 0) goto done;
        if (vr > 0) res->stopped = res->signalled = 1; /* stopped while paused in it: still pending */
    }
    int early = t.val.loaded && nl_val_stop(&t.val.st, o->early_stop); /* a resume of a run that stopped early */
    while (step < t.plan.total && !early && !res->stopped) {
        const int *idx;
        int nseq;
        nl_data_cursor prev_cursor = nl_batcher_cursor(t.res.bt);
        if (nl_batcher_next(t.res.bt, &idx, &nseq)) goto done;
        step_mark mk;
        mark_step(&t, &mk);
        step_out so = {0};
        for (int i = 0; i < nseq; i++) so.n_targets += t.res.pk.seq[idx[i]].n_targets;
        t.plan.aw.lr = nl_lr_at(&t.plan.sched, step + 1, t.plan.total);
        t.plan.mz.lr = so.lr = t.plan.aw.lr;
        int sr = t.plan.mezo ? step_mezo(&t, step + 1, idx, nseq, &so) : step_backprop(&t, step + 1, idx, nseq, &so);
        if (sr < 0 || model_changed(&t, t.count.last_commit)) goto done;
        if (sr > 0) { /* stopped inside a pause: step + 1 is abandoned */
            if (stop_paused(&t, step, prev_cursor, res)) goto done;
            break;
        }
        int r = report_step(&t, ++step, &mk, &so, res);
        if (r < 0) goto done;
        if (r == 2) {
            early = 1;
            break;
        }
        if (r > 0) {
            res->stopped = step < t.plan.total;
            break;
        } /* a stop at the last step is the end */
    }
    res->early_stopped = early && step < t.plan.total;
    if (res->early_stopped && o->progress)
        fprintf(o->progress,
                "early stop at step %" PRId64 "/%" PRId64 ": %" PRId64
                " evaluations without improvement on step %" PRId64 "\n",
                step, t.plan.total, t.val.st.bad, t.val.st.best_step);
    if (finish_run(&t, step, res)) goto done;
    rc = 0;
done:
    res->seconds = nl_now() - t_start;
    trainer_free(&t);
    return rc;
}

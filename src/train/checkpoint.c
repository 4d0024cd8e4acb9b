/* train/checkpoint: atomic commit/resume of adapter + optimizer state. See checkpoint.h. */
#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

/* ------------------------------------------------------------------ format helpers */

enum { HDR = 96 };
static const char MAGIC[8] = {'N', 'L', 'C', 'K', 'P', 'T', 0, 0};

static int host_is_le(void) {
    const uint16_t x = 1;
    return *(const uint8_t *)&x == 1;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t load_le64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Total file size implied by the counts, or -1 on overflow. */
static int file_bytes(uint64_t n_cursor, uint64_t n_rng, uint64_t n_params, uint64_t *out) {
    uint64_t words, arr, t;
    if (nl_add_ok(n_cursor, n_rng, &words) || nl_mul_ok(words, 8, &words)) return -1;
    if (nl_mul_ok(n_params, 12, &arr)) return -1;
    if (nl_add_ok(HDR + 8, words, &t) || nl_add_ok(t, arr, &t)) return -1;
    *out = t;
    return 0;
}

static int ckpt_name(char *buf, size_t cap, const char *dir, uint64_t step) {
    int n = snprintf(buf, cap, "%s/commit-%llu.nlck", dir, (unsigned long long)step);
    if (n < 0 || (size_t)n >= cap) return nl_err("%s: checkpoint path too long", dir);
    return 0;
}

/* Parse "commit-<digits>.nlck" (canonical decimal, no leading zeros). 0 ok, -1 not ours. */
static int parse_name(const char *name, uint64_t *step) {
    if (strncmp(name, "commit-", 7) != 0) return -1;
    const char *p = name + 7;
    uint64_t v = 0;
    const char *d = p;
    while (*p >= '0' && *p <= '9') {
        if (nl_mul_ok(v, 10, &v) || nl_add_ok(v, (uint64_t)(*p - '0'), &v)) return -1;
        p++;
    }
    if (p == d || (d[0] == '0' && p - d > 1) || strcmp(p, ".nlck") != 0) return -1;
    *step = v;
    return 0;
}

/* Steps of every commit file in dir, sorted descending. Returns count, 0 when the directory
 * does not exist, -1 on error: a listing that fails part way (readdir's errno) is an error,
 * never a short list. *steps is malloc'd (NULL when count is 0). */
static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

typedef struct {
    uint64_t *steps;
    long n, cap;
    int any; /* a name starting with "commit-", ours or not */
} listing;

static int list_one(void *user, const char *name) {
    listing *l = user;
    if (!strncmp(name, "commit-", 7)) l->any = 1;
    uint64_t s;
    if (parse_name(name, &s) != 0) return 0;
    if (l->n == l->cap) {
        long cap = l->cap ? l->cap * 2 : 16;
        uint64_t *ns = realloc(l->steps, (size_t)cap * sizeof *ns);
        if (!ns) return 1;
        l->steps = ns;
        l->cap = cap;
    }
    l->steps[l->n++] = s;
    return 0;
}

static long list_dir_commits(const char *dir, uint64_t **steps, int *any, const nl_io *io) {
    listing l = {NULL, 0, 0, 0};
    *steps = NULL;
    int rc = io->list(io->ctx, dir, list_one, &l);
    if (rc != 0) {
        int e = errno;
        free(l.steps);
        if (rc > 0) return nl_err("out of memory listing %s", dir);
        if (e == ENOENT) return 0;
        return nl_err("%s: cannot list the checkpoint directory: %s", dir, strerror(e));
    }
    if (l.n > 1) qsort(l.steps, (size_t)l.n, sizeof *l.steps, cmp_desc);
    *steps = l.steps;
    if (any) *any = l.any;
    return l.n;
}

static long list_commits(const char *dir, uint64_t **steps, const nl_io *io) {
    return list_dir_commits(dir, steps, NULL, io);
}

int nl_ckpt_dir_has_commits(const char *dir, const nl_io *io) {
    if (!io) io = nl_io_posix();
    uint64_t *steps;
    int any = 0;
    long n = list_dir_commits(dir, &steps, &any, io);
    free(steps);
    if (n < 0) return -1;
    return n > 0 || any;
}

/* ------------------------------------------------------------------ commit */

typedef struct {
    nl_io_out *out;
    nl_hasher h;
} writer;

static int w_bytes(writer *w, const void *data, size_t n, int hash) {
    if (hash) nl_hasher_update(&w->h, data, n);
    return nl_io_out_write(w->out, data, n);
}

static int w_u64s(writer *w, const uint64_t *a, uint32_t n) {
    /* host is little-endian (checked), so the array bytes are the file bytes */
    return n ? w_bytes(w, a, (size_t)n * 8, 1) : 0;
}

static int w_floats(writer *w, const float *a, uint64_t n) {
    return n ? w_bytes(w, a, (size_t)n * sizeof(float), 1) : 0;
}

typedef struct {
    const nl_ckpt *ck;
    const uint8_t *hdr;
    uint64_t total;
} commit_body;

/* The commit file's bytes (format in checkpoint.h), through the atomic write. */
static int write_commit(void *user, nl_io_out *out) {
    const commit_body *b = user;
    const nl_ckpt *ck = b->ck;
    writer w = {out, {{0}, 0, 0, {0}, 0}};
    nl_hasher_init(&w.h, NL_CKPT_HASH_SEED);
    int rc = w_bytes(&w, b->hdr, HDR, 1);
    if (!rc) rc = w_u64s(&w, ck->cursor, ck->n_cursor);
    if (!rc) rc = w_u64s(&w, ck->rng, ck->n_rng);
    if (!rc) rc = w_floats(&w, ck->params, ck->n_params);
    if (!rc) rc = w_floats(&w, ck->m, ck->n_params);
    if (!rc) rc = w_floats(&w, ck->v, ck->n_params);
    if (!rc) {
        uint8_t sum[8];
        put64(sum, nl_hasher_final(&w.h));
        rc = w_bytes(&w, sum, 8, 0);
    }
    if (!rc && out->off != b->total) rc = nl_err("%s: internal size mismatch", out->path);
    return rc;
}

int nl_ckpt_commit(const char *dir, const nl_ckpt *ck, const nl_io *io) {
    if (!io) io = nl_io_posix();
    if (!host_is_le()) return nl_err("checkpoint: big-endian hosts are not supported");
    if (ck->n_cursor > NL_CKPT_MAX_WORDS || ck->n_rng > NL_CKPT_MAX_WORDS)
        return nl_err("checkpoint: n_cursor %u / n_rng %u over the limit %d", ck->n_cursor, ck->n_rng,
                      NL_CKPT_MAX_WORDS);
    if ((ck->n_cursor && !ck->cursor) || (ck->n_rng && !ck->rng) || (ck->n_params && (!ck->params || !ck->m || !ck->v)))
        return nl_err("checkpoint: missing array");
    uint64_t total;
    if (file_bytes(ck->n_cursor, ck->n_rng, ck->n_params, &total) || ck->n_params > SIZE_MAX / sizeof(float))
        return nl_err("checkpoint: n_params %llu too large", (unsigned long long)ck->n_params);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return nl_err("%s: cannot create checkpoint directory: %s", dir, strerror(errno));

    char tmp[4096], fin[4096];
    int n = snprintf(tmp, sizeof tmp, "%s/ckpt.tmp", dir);
    if (n < 0 || (size_t)n >= sizeof tmp) return nl_err("%s: checkpoint path too long", dir);
    if (ckpt_name(fin, sizeof fin, dir, ck->step)) return -1;

    uint8_t hdr[HDR] = {0};
    memcpy(hdr, MAGIC, 8);
    put32(hdr + 8, NL_CKPT_VERSION);
    put32(hdr + 12, HDR);
    put64(hdr + 16, ck->config_hash);
    put64(hdr + 24, ck->model_hash);
    put64(hdr + 32, ck->step);
    put64(hdr + 40, ck->epoch);
    put64(hdr + 48, ck->index);
    put64(hdr + 56, ck->n_params);
    put32(hdr + 64, ck->n_cursor);
    put32(hdr + 68, ck->n_rng);
    put32(hdr + 72, ck->rank);
    uint32_t ab;
    memcpy(&ab, &ck->alpha, 4);
    put32(hdr + 76, ab);

    commit_body body = {ck, hdr, total};
    int rc = nl_io_write_atomic(io, fin, tmp, write_commit, &body);
    if (rc) return rc; /* -1: nothing changed; NL_IO_NOT_DURABLE: in place, not synced */

    /* The new commit is durable; prune. Keep it, every newer one (a commit never deletes a
     * commit newer than itself: one that did not verify at resume may read fine later, and a
     * listing that missed it must not cost it) and the newest older one. A listing that fails
     * prunes nothing. Failures here leave an extra file behind, which the next commit retries;
     * they are not errors. */
    uint64_t *steps;
    long cnt = list_commits(dir, &steps, io);
    int kept_prev = 0;
    for (long i = 0; i < cnt; i++) {
        if (steps[i] >= ck->step) continue;
        if (!kept_prev && NL_CKPT_KEEP >= 2) {
            kept_prev = 1;
            continue;
        }
        char old[4096];
        if (ckpt_name(old, sizeof old, dir, steps[i]) == 0) io->unlink(io->ctx, old);
    }
    free(steps);
    nl_clear_error();
    return 0;
}

/* ------------------------------------------------------------------ load */

enum { LOAD_OK = 0, LOAD_CORRUPT = -1, LOAD_MISMATCH = -2 };

static int r_bytes(const nl_io *io, int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n) {
        size_t chunk = n < (1u << 20) ? n : (1u << 20);
        ssize_t r = io->read(io->ctx, fd, p, chunk);
        if (r < 0) return -1;
        if (r == 0) {
            errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

void nl_ckpt_free(nl_ckpt *ck) {
    if (!ck) return;
    free(ck->cursor);
    free(ck->rng);
    free(ck->params);
    free(ck->m);
    free(ck->v);
    memset(ck, 0, sizeof *ck);
}

/* Returns LOAD_OK, LOAD_CORRUPT (bad/truncated/unreadable file) or LOAD_MISMATCH (a verified
 * file for another model/config); nl_err holds the reason, naming the file. Long (~125 lines):
 * one reader of one file format, every length checked against the file's real size before it is
 * used, in the order the bytes come; each check names its field. */
static int load_one(const char *path, uint64_t config_hash, uint64_t model_hash, uint64_t n_expect, nl_ckpt *out,
                    const nl_io *io) {
    memset(out, 0, sizeof *out);
    if (!host_is_le()) return nl_err("checkpoint: big-endian hosts are not supported");
    uint64_t size;
    int fd = nl_io_open_regular(io, path, &size); /* a FIFO there never blocks the resume */
    if (fd < 0) return LOAD_CORRUPT;
    int rc = LOAD_CORRUPT;
    uint8_t hdr[HDR];
    if (size < HDR + 8) {
        nl_err("%s: truncated: %llu bytes, a checkpoint has at least %d", path, (unsigned long long)size, HDR + 8);
        goto done;
    }
    if (r_bytes(io, fd, hdr, HDR) != 0) {
        nl_err("%s: read error in the header: %s", path, errno ? strerror(errno) : "short read");
        goto done;
    }
    if (memcmp(hdr, MAGIC, 8) != 0) {
        nl_err("%s: offset 0: not a nightlora checkpoint (bad magic)", path);
        goto done;
    }
    uint32_t ver = get32(hdr + 8), hbytes = get32(hdr + 12);
    if (ver != NL_CKPT_VERSION || hbytes != HDR) {
        nl_err("%s: offset 8: version %u / header %u bytes, expected version %d / %d bytes", path, ver, hbytes,
               NL_CKPT_VERSION, HDR);
        goto done;
    }
    uint64_t n_params = load_le64(hdr + 56);
    uint32_t n_cursor = get32(hdr + 64), n_rng = get32(hdr + 68);
    if (n_cursor > NL_CKPT_MAX_WORDS || n_rng > NL_CKPT_MAX_WORDS) {
        nl_err("%s: offset 64: n_cursor %u / n_rng %u over the limit %d", path, n_cursor, n_rng, NL_CKPT_MAX_WORDS);
        goto done;
    }
    uint64_t want;
    if (n_params > SIZE_MAX / sizeof(float)) { /* 32-bit hosts */
        nl_err("%s: offset 56: n_params %llu too large for this host", path, (unsigned long long)n_params);
        goto done;
    }
    if (file_bytes(n_cursor, n_rng, n_params, &want) || want != size) {
        nl_err("%s: size %llu bytes but the header (n_params %llu) implies %llu: truncated or "
               "corrupt",
               path, (unsigned long long)size, (unsigned long long)n_params, (unsigned long long)want);
        goto done;
    }
    /* size is real (fstat), and want == size, so these allocations are bounded by the file */
    nl_hasher h;
    nl_hasher_init(&h, NL_CKPT_HASH_SEED);
    nl_hasher_update(&h, hdr, HDR);
    out->n_cursor = n_cursor;
    out->n_rng = n_rng;
    out->n_params = n_params;
    out->cursor = nl_calloc(n_cursor ? n_cursor : 1, 8);
    out->rng = nl_calloc(n_rng ? n_rng : 1, 8);
    size_t fb = (size_t)n_params * sizeof(float);
    out->params = nl_malloc(fb);
    out->m = nl_malloc(fb);
    out->v = nl_malloc(fb);
    if (!out->cursor || !out->rng || !out->params || !out->m || !out->v) {
        nl_err_prefix("%s", path);
        goto done;
    }
    struct {
        void *p;
        size_t n;
    } parts[5] = {{out->cursor, (size_t)n_cursor * 8},
                  {out->rng, (size_t)n_rng * 8},
                  {out->params, fb},
                  {out->m, fb},
                  {out->v, fb}};
    uint64_t off = HDR;
    for (int i = 0; i < 5; i++) {
        if (r_bytes(io, fd, parts[i].p, parts[i].n) != 0) {
            nl_err("%s: read error near offset %llu: %s", path, (unsigned long long)off,
                   errno ? strerror(errno) : "short read");
            goto done;
        }
        nl_hasher_update(&h, parts[i].p, parts[i].n);
        off += parts[i].n;
    }
    uint8_t sum[8];
    if (r_bytes(io, fd, sum, 8) != 0) {
        nl_err("%s: read error at offset %llu: %s", path, (unsigned long long)off,
               errno ? strerror(errno) : "short read");
        goto done;
    }
    uint64_t stored = load_le64(sum), computed = nl_hasher_final(&h);
    if (stored != computed) {
        nl_err("%s: checksum mismatch (stored %016llx, computed %016llx): corrupt", path, (unsigned long long)stored,
               (unsigned long long)computed);
        goto done;
    }
    out->config_hash = load_le64(hdr + 16);
    out->model_hash = load_le64(hdr + 24);
    out->step = load_le64(hdr + 32);
    out->epoch = load_le64(hdr + 40);
    out->index = load_le64(hdr + 48);
    out->rank = get32(hdr + 72);
    uint32_t ab = get32(hdr + 76);
    memcpy(&out->alpha, &ab, 4);
    rc = LOAD_MISMATCH;
    if (out->model_hash != model_hash) {
        nl_err("%s: made for a different model: model hash %016llx in the checkpoint, "
               "%016llx expected",
               path, (unsigned long long)out->model_hash, (unsigned long long)model_hash);
        goto done;
    }
    if (out->config_hash != config_hash) {
        nl_err("%s: made with a different training configuration: config hash %016llx in the "
               "checkpoint, %016llx expected",
               path, (unsigned long long)out->config_hash, (unsigned long long)config_hash);
        goto done;
    }
    if (n_expect && n_params != n_expect) {
        nl_err("%s: holds %llu adapter parameters, %llu expected", path, (unsigned long long)n_params,
               (unsigned long long)n_expect);
        goto done;
    }
    rc = LOAD_OK;
done:
    io->close(io->ctx, fd);
    if (rc != LOAD_OK) nl_ckpt_free(out);
    return rc;
}

int nl_ckpt_load_file(const char *path, uint64_t config_hash, uint64_t model_hash, uint64_t n_params, nl_ckpt *out,
                      const nl_io *io) {
    return load_one(path, config_hash, model_hash, n_params, out, io ? io : nl_io_posix()) == LOAD_OK ? 0 : -1;
}

/* Append "; <formatted>" (or just it when buf is empty) to a bounded buffer. */
static void NL_PRINTF(3, 4) appendf(char *buf, size_t cap, const char *fmt, ...) {
    if (!buf || !cap) return;
    size_t len = strlen(buf);
    if (len + 3 >= cap) return;
    if (len) {
        memcpy(buf + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

int nl_ckpt_load_latest(const char *dir, uint64_t config_hash, uint64_t model_hash, uint64_t n_params, nl_ckpt *out,
                        char *warning, size_t cap, const nl_io *io) {
    if (!io) io = nl_io_posix();
    memset(out, 0, sizeof *out);
    if (warning && cap) warning[0] = 0;
    uint64_t *steps;
    long cnt = list_commits(dir, &steps, io);
    if (cnt < 0) return -1;
    if (cnt == 0) return 1;
    char skipped[2048] = "";
    for (long i = 0; i < cnt; i++) {
        char path[4096];
        if (ckpt_name(path, sizeof path, dir, steps[i])) break;
        int rc = load_one(path, config_hash, model_hash, n_params, out, io);
        if (rc == LOAD_OK) {
            free(steps);
            if (skipped[0]) { appendf(warning, cap, "%s; resuming from %s", skipped, path); }
            nl_clear_error();
            return 0;
        }
        if (rc == LOAD_MISMATCH) {
            free(steps);
            return -1;
        }
        appendf(skipped, sizeof skipped, "%s", nl_last_error());
    }
    free(steps);
    return nl_err("%s: no checkpoint verifies: %s", dir, skipped);
}

/* proj/planner: at start-up, validate every (projection, direction, token bucket) of the
 * selected backend against ref on the ORIGINAL weight, and route what fails to ref for the
 * whole run (DESIGN §2: "a run never silently mixes precisions").
 *
 * Error measure: relative Frobenius error ||Y - Y_ref||_F / ||Y_ref||_F over the bucket's
 * T×N (FWD) or T×K (BWD) outputs, on uniform [-1, 1) inputs from a fixed seed per
 * (projection, direction). Bounds per RESIDENT type, because the check measures the
 * conversion (e.g. F32 -> Q8_0) plus the backend's arithmetic:
 *   f32 1e-5 (float accumulation vs double), f16/bf16 1e-2, q8_0 2e-2 (random weights give
 *   ~5e-3), q6_k 5e-2, q4_0/q4_1/q4_k 1e-1 (backends may quantize activations too);
 *   with the FP16 wire at least 1e-2 (inputs and outputs rounded to 11 bits).
 * The input of a smaller bucket is the first rows of the largest one, so the reference runs
 * once per (projection, direction).
 *
 * Cost. The backend always computes its full bucket (that is what is being validated). The
 * reference does not: a full ref product at real sizes (qwen3-0.6b: 2 x 256 x 575 M MACs in
 * double) takes minutes. For a small projection (n_out <= 64 or n_in·n_out <= 2^18) every
 * output is compared, exactly as described above. For a larger one, two cheap views of the
 * T × n_out output are compared instead, and the larger of their two errors is the check's:
 *   - SAMPLED COLUMNS: PLAN_S output columns, one drawn (seeded) in each of PLAN_S equal
 *     strata, the last stratum always contributing the last column (panel tails); ref
 *     computes just those columns, for every row. Relative Frobenius error over them.
 *   - PROBES (covers every column): output column c belongs to group c % PLAN_G and gets a
 *     seeded sign r_c = ±1. For each row and group the backend's Σ_c r_c·Y[t][c] is compared
 *     with ref's, which costs one matvec per group: FWD Y·r = X·(Wᵀr), BWD Y·r = X·(W r).
 *     For Rademacher signs E||E r||² = ||E||_F² and E||Y r||² = ||Y||_F², so the relative
 *     error of the T × PLAN_G probe values estimates the full Frobenius error, and an error
 *     confined to ONE column enters with weight exactly 1 (|r_c| = 1): a backend wrong in
 *     one column is caught whenever the full comparison would catch it. A non-finite output
 *     anywhere fails the check.
 * Both views estimate the same full Frobenius error for errors spread over the outputs (what
 * a correct backend's rounding gives); an error concentrated in a sampled column weighs more
 * in the sampled view, so taking the larger only makes such a check stricter.
 * Ref then costs one decoding pass over the original W per projection (shared by both
 * directions) plus T·n_in·(PLAN_S + PLAN_G) MACs per direction, in double. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model/model.h"
#include "model/quant.h"
#include "proj/proj_impl.h"
#include "os/io.h"
#include "util/hash.h"
#include "util/rng.h"
#include "util/pool.h"
#include "util/util.h"

static const int default_buckets[] = {16, 64, 256};

#define PLAN_S 16                   /* sampled output columns per direction */
#define PLAN_G 8                    /* probe groups per direction */
#define PLAN_FULL_N 64              /* n_out <= this: compare every output */
#define PLAN_FULL_ELEMS (1 << 18)   /* or n_in·n_out <= this */
#define PLAN_CHUNKS 16              /* row chunks of the decoding pass (not the thread count) */
#define PLAN_PART_BYTES (64u << 20) /* cap on the chunks' FWD probe partial sums */
#define PLAN_TBLK 8                 /* rows of X per task of the reference product */
#define PLAN_IBLK 128               /* inputs per block of the reference product */

static double type_bound(int type) {
    switch (type) {
    case NL_TYPE_F32: return 1e-5;
    case NL_TYPE_F16:
    case NL_TYPE_BF16: return 1e-2;
    case NL_TYPE_Q8_0: return 2e-2;
    case NL_TYPE_Q6_K:
    case NL_TYPE_Q5_0: return 5e-2;
    case NL_TYPE_Q4_0:
    case NL_TYPE_Q4_1:
    case NL_TYPE_Q4_K: return 1e-1;
    default: return 1e-1; /* any other block type host or ref decodes */
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* What the reference computes for one direction of one projection. The W_ref "columns" of
 * `aux` ([n_in][width], double) are: PLAN_G probe vectors (Wᵀr or W r per group) then the
 * sampled columns of W (FWD: rows n of W; BWD: columns k of W). yref = X·aux ([tmax][width]).
 * full: width = n_out, no probes, aux column c = output column c. */
typedef struct {
    int need; /* some bucket of this direction runs the backend */
    int64_t n_in, n_out;
    int full, G, S, width;
    int *cols;     /* [S] sampled output columns (ascending) */
    float *sign;   /* [n_out] ±1 probe signs (G > 0) */
    int *col_slot; /* FWD only: [n_out] -> sampled slot or -1 */
    float *x;      /* [tmax][n_in] */
    double *aux;   /* [n_in][width] */
    double *yref;  /* [tmax][width] */
} dir_ref;

typedef struct {
    const nl_proj_entry *e;
    const nl_type_traits *tt;
    size_t row_bytes;
    dir_ref *f, *b; /* f->need / b->need say which parts to build */
    int n_chunks;
    float *wrow;  /* [n_chunks][K] decode scratch */
    double *part; /* [n_chunks][G][K] FWD probe partial sums */
} pass_job;

/* Decode rows [n0, n1) of the original W once and build both directions' reference columns:
 * FWD probes accumulate Σ_n r_n W[n][:] per group into this chunk's partial (combined in chunk
 * order afterwards: the result does not depend on the thread count); everything else is
 * written to rows/columns this chunk owns. */
static void pass_task(void *arg, int chunk, int n_chunks) {
    pass_job *j = arg;
    const int64_t K = j->e->orig.n_in, N = j->e->orig.n_out;
    const int64_t n0 = N * chunk / n_chunks, n1 = N * (chunk + 1) / n_chunks;
    float *w = j->wrow + (size_t)chunk * (size_t)K;
    dir_ref *f = j->f, *b = j->b;
    double *part = f->need && f->G ? j->part + (size_t)chunk * (size_t)f->G * (size_t)K : NULL;
    if (part) memset(part, 0, sizeof(double) * (size_t)f->G * (size_t)K);
    const uint8_t *base = j->e->orig.data;
    for (int64_t n = n0; n < n1; n++) {
        j->tt->to_float(base + (size_t)n * j->row_bytes, w, K);
        if (f->need) {
            if (f->full) {
                for (int64_t k = 0; k < K; k++) f->aux[(size_t)k * f->width + (size_t)n] = w[k];
            } else {
                double *p = part + (size_t)(n % f->G) * (size_t)K;
                const double r = f->sign[n];
                int64_t k = 0;
                for (; k + 8 <= K; k += 8)
                    for (int u = 0; u < 8; u++) p[k + u] += r * w[k + u];
                for (; k < K; k++) p[k] += r * w[k];
                const int slot = f->col_slot[n];
                if (slot >= 0)
                    for (int64_t k = 0; k < K; k++) f->aux[(size_t)k * f->width + (size_t)(f->G + slot)] = w[k];
            }
        }
        if (b->need) {
            double *a = b->aux + (size_t)n * (size_t)b->width;
            if (b->full) {
                for (int64_t k = 0; k < K; k++) a[k] = w[k];
            } else {
                /* a[g] = Σ_{k % PLAN_G == g} r_k W[n][k] (G == PLAN_G when not full) */
                double acc[PLAN_G] = {0};
                int64_t k = 0;
                for (; k + PLAN_G <= K; k += PLAN_G)
                    for (int g = 0; g < PLAN_G; g++) acc[g] += (double)b->sign[k + g] * w[k + g];
                for (; k < K; k++) acc[k % PLAN_G] += (double)b->sign[k] * w[k];
                for (int g = 0; g < PLAN_G; g++) a[g] = acc[g];
                for (int s = 0; s < b->S; s++) a[b->G + s] = w[b->cols[s]];
            }
        }
    }
}

typedef struct {
    const dir_ref *r;
    int tmax;
} prod_job;

/* yref rows [t0, t0 + PLAN_TBLK) = X·aux: one owner per row, sums in a fixed order (blocks of
 * PLAN_IBLK inputs ascending, so a block of aux stays in L1 while the rows go past it). */
static void prod_task(void *arg, int task, int n_tasks) {
    (void)n_tasks;
    const prod_job *j = arg;
    const dir_ref *r = j->r;
    const int t0 = task * PLAN_TBLK, t1 = t0 + PLAN_TBLK < j->tmax ? t0 + PLAN_TBLK : j->tmax;
    const size_t W = (size_t)r->width, n_in = (size_t)r->n_in;
    memset(r->yref + (size_t)t0 * W, 0, sizeof(double) * W * (size_t)(t1 - t0));
    for (size_t i0 = 0; i0 < n_in; i0 += PLAN_IBLK) {
        const size_t i1 = i0 + PLAN_IBLK < n_in ? i0 + PLAN_IBLK : n_in;
        for (int t = t0; t < t1; t++) {
            const float *x = r->x + (size_t)t * n_in;
            double *y = r->yref + (size_t)t * W;
            if (W == PLAN_G + PLAN_S) {
                /* the sampled case: a fixed width the compiler keeps in registers */
                double acc[PLAN_G + PLAN_S];
                memcpy(acc, y, sizeof acc);
                for (size_t i = i0; i < i1; i++) {
                    const double xv = x[i], *a = r->aux + i * W;
                    for (int c = 0; c < PLAN_G + PLAN_S; c++) acc[c] += xv * a[c];
                }
                memcpy(y, acc, sizeof acc);
            } else {
                for (size_t i = i0; i < i1; i++) {
                    const double xv = x[i], *a = r->aux + i * W;
                    for (size_t c = 0; c < W; c++) y[c] += xv * a[c];
                }
            }
        }
    }
}

static int grow(void **p, size_t *have, size_t need, size_t elem) {
    if (*have >= need) return 0;
    free(*p);
    *p = nl_malloc(need * elem);
    if (!*p) {
        *have = 0;
        return -1;
    }
    *have = need;
    return 0;
}

typedef struct {
    int *cols, *col_slot;
    float *sign, *x;
    double *aux, *yref;
    size_t cols_n, col_slot_n, sign_n, x_n, aux_n, yref_n;
} dir_buf;

/* Choose the comparison for one direction (full, or sampled columns + probes) and draw its
 * seeded columns and signs. */
static int dir_setup(dir_ref *r, dir_buf *bf, int64_t n_in, int64_t n_out, int tmax, uint64_t seed, int fwd) {
    r->n_in = n_in;
    r->n_out = n_out;
    r->full = n_out <= PLAN_FULL_N || n_in * n_out <= PLAN_FULL_ELEMS;
    r->G = r->full ? 0 : PLAN_G;
    r->S = r->full ? (int)n_out : PLAN_S;
    r->width = r->G + r->S;
    if (grow((void **)&bf->x, &bf->x_n, (size_t)tmax * (size_t)n_in, sizeof(float)) ||
        grow((void **)&bf->aux, &bf->aux_n, (size_t)n_in * (size_t)r->width, sizeof(double)) ||
        grow((void **)&bf->yref, &bf->yref_n, (size_t)tmax * (size_t)r->width, sizeof(double)))
        return -1;
    r->x = bf->x;
    r->aux = bf->aux;
    r->yref = bf->yref;
    uint64_t st = seed;
    for (size_t k = 0; k < (size_t)tmax * (size_t)n_in; k++)
        r->x[k] = (float)((double)(nl_splitmix64(&st) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    r->cols = NULL;
    r->sign = NULL;
    r->col_slot = NULL;
    if (r->full) return 0;
    if (grow((void **)&bf->cols, &bf->cols_n, PLAN_S, sizeof(int)) ||
        grow((void **)&bf->sign, &bf->sign_n, (size_t)n_out, sizeof(float)))
        return -1;
    r->cols = bf->cols;
    r->sign = bf->sign;
    st = seed ^ 0x5AD1E5C0111Dull;
    for (int s = 0; s < PLAN_S; s++) {
        const int64_t lo = n_out * s / PLAN_S, hi = n_out * (s + 1) / PLAN_S; /* n_out > PLAN_S: non-empty */
        r->cols[s] = (int)(s == PLAN_S - 1 ? hi - 1 : lo + (int64_t)(nl_splitmix64(&st) % (uint64_t)(hi - lo)));
    }
    for (int64_t c = 0; c < n_out; c++) r->sign[c] = (nl_splitmix64(&st) >> 63) ? 1.0f : -1.0f;
    if (fwd) {
        if (grow((void **)&bf->col_slot, &bf->col_slot_n, (size_t)n_out, sizeof(int))) return -1;
        r->col_slot = bf->col_slot;
        for (int64_t c = 0; c < n_out; c++) r->col_slot[c] = -1;
        for (int s = 0; s < PLAN_S; s++) r->col_slot[r->cols[s]] = s;
    }
    return 0;
}

/* Relative error of the backend's first T rows y[T][n_out] against the reference. */
static double compare(const dir_ref *r, const float *y, int T) {
    double num_s = 0, den_s = 0, num_p = 0, den_p = 0;
    double pr[PLAN_G];
    for (int t = 0; t < T; t++) {
        const float *yt = y + (size_t)t * (size_t)r->n_out;
        const double *ref = r->yref + (size_t)t * (size_t)r->width;
        for (int s = 0; s < r->S; s++) {
            const double v = r->full ? yt[s] : yt[r->cols[s]];
            const double d = v - ref[r->G + s];
            num_s += d * d;
            den_s += ref[r->G + s] * ref[r->G + s];
        }
        if (r->full) continue;
        for (int g = 0; g < PLAN_G; g++) pr[g] = 0;
        int64_t c = 0;
        for (; c + PLAN_G <= r->n_out; c += PLAN_G)
            for (int g = 0; g < PLAN_G; g++) pr[g] += (double)r->sign[c + g] * yt[c + g];
        for (; c < r->n_out; c++) pr[c % PLAN_G] += (double)r->sign[c] * yt[c];
        for (int g = 0; g < r->G; g++) {
            const double d = pr[g] - ref[g];
            num_p += d * d;
            den_p += ref[g] * ref[g];
        }
    }
    /* a NaN/Inf output anywhere reaches num_s (sampled) or num_p (every column) */
    if (!isfinite(num_s) || !isfinite(den_s) || !isfinite(num_p) || !isfinite(den_p)) return NAN;
    double e = den_s == 0 ? (num_s == 0 ? 0 : INFINITY) : sqrt(num_s / den_s);
    if (!r->full) {
        const double ep = den_p == 0 ? (num_p == 0 ? 0 : INFINITY) : sqrt(num_p / den_p);
        if (ep > e) e = ep;
    }
    return e;
}

/* ---- the verdict cache (nl_proj_config.plan_cache_dir) ----
 * DIR/plan-<key>.nlpc: "NLPLANC1", u32 version, u32 n, n records {u64 check key, f64 error},
 * u64 nl_hash64 of everything before it; little-endian. The key of a check hashes what its
 * verdict depends on; the file's name hashes all of them. */
#define PLAN_CACHE_VERSION 1u /* the checks' inputs, views and bounds: bump when they change */

static uint64_t weight_key(const nl_proj_weight *w) {
    const uint64_t bytes = (uint64_t)nl_row_bytes(w->type, w->n_in) * (uint64_t)w->n_out;
    uint64_t k[4] = {nl_content_hash64(w->data, bytes), (uint64_t)w->type, (uint64_t)w->n_in, (uint64_t)w->n_out};
    return nl_hash64(k, sizeof k, 0x6e6c706377ull);
}

/* keys[i] for checks[i]; the file's key. */
static uint64_t cache_keys(nl_proj_service *s, const nl_proj_check *checks, int n_checks, uint64_t *keys) {
    char kern[320];
    int kl = nl_proj_describe(s, kern, sizeof kern);
    if (kl < 0 || (size_t)kl >= sizeof kern) kl = (int)strlen(kern);
    uint64_t sk[5] = {nl_hash64(kern, (size_t)kl, 0x6e6c70636bull), (uint64_t)s->n_threads, (uint64_t)s->cfg.wire_f16,
                      PLAN_CACHE_VERSION, (uint64_t)PLAN_S << 32 | (uint64_t)PLAN_G};
    const uint64_t skey = nl_hash64(sk, sizeof sk, 0x6e6c706373ull);
    nl_hasher fh;
    nl_hasher_init(&fh, skey);
    uint64_t wk[2] = {0, 0};
    int last = -1;
    for (int i = 0; i < n_checks; i++) {
        const nl_proj_check *c = &checks[i];
        const nl_proj_entry *e = &s->e[c->id];
        if (c->id != last) {
            wk[0] = weight_key(&e->orig);
            wk[1] = e->res.data == e->orig.data && e->res.type == e->orig.type ? wk[0] : weight_key(&e->res);
            last = c->id;
        }
        uint64_t ck[6];
        double bound = c->bound;
        memcpy(&ck[3], &bound, 8);
        ck[0] = wk[0];
        ck[1] = wk[1];
        ck[2] = (uint64_t)c->dir << 32 | (uint64_t)(uint32_t)c->T;
        ck[4] = skey;
        ck[5] = (uint64_t)c->id;
        keys[i] = nl_hash64(ck, sizeof ck, 0x6e6c706365ull);
        nl_hasher_update(&fh, &keys[i], sizeof keys[i]);
    }
    return nl_hasher_final(&fh);
}

static uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The errors of a verified file whose keys are `keys` into err[]: 0; 1 no file; -1 ignored
 * (why in `why`: the file's size, magic, version, count, checksum or keys). */
static int cache_read(const char *dir, const char *path, const uint64_t *keys, int n, double *err, char *why,
                      size_t cap) {
    struct stat st;
    if (lstat(path, &st) != 0) return 1;
    /* as ssh with its keys: only a file of ours that no one else could have written, in a
     * directory no one else can write to (a forged verdict routes nothing to the CPU) */
    struct stat ds;
    const uid_t me = geteuid();
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, cap, "%s, not a regular file", nl_file_kind(st.st_mode));
        return -1;
    }
    if (st.st_uid != me || (st.st_mode & 022)) {
        snprintf(why, cap, "owned by uid %u, mode %04o: only a file of uid %u that no one else can write is trusted",
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)me);
        return -1;
    }
    if (stat(dir, &ds) != 0 || ds.st_uid != me || (ds.st_mode & 022)) {
        snprintf(why, cap, "its directory %s is owned by uid %u, mode %04o: others could replace the file", dir,
                 (unsigned)ds.st_uid, (unsigned)(ds.st_mode & 07777));
        return -1;
    }
    size_t len = 0;
    unsigned char *b = (unsigned char *)nl_read_file(path, &len);
    if (!b) {
        snprintf(why, cap, "%s", nl_last_error());
        nl_clear_error();
        return -1;
    }
    int rc = -1;
    const size_t want = 16 + (size_t)n * 16 + 8;
    if (len < 24 || memcmp(b, "NLPLANC1", 8))
        snprintf(why, cap, "not a plan cache (%zu bytes, no NLPLANC1 magic)", len);
    else if ((uint32_t)rd64(b + 8) != PLAN_CACHE_VERSION)
        snprintf(why, cap, "version %u, this build writes %u", (unsigned)(uint32_t)rd64(b + 8), PLAN_CACHE_VERSION);
    else if ((uint64_t)(rd64(b + 8) >> 32) != (uint64_t)n || len != want)
        snprintf(why, cap, "%zu bytes holding %llu verdicts, %zu bytes for this plan's %d", len,
                 (unsigned long long)(rd64(b + 8) >> 32), want, n);
    else if (rd64(b + len - 8) != nl_hash64(b, len - 8, 0x6e6c706366ull))
        snprintf(why, cap, "checksum mismatch: corrupt");
    else {
        rc = 0;
        for (int i = 0; i < n && !rc; i++) {
            if (rd64(b + 16 + (size_t)i * 16) != keys[i]) {
                snprintf(why, cap, "verdict %d is another check's", i);
                rc = -1;
            }
            uint64_t bits = rd64(b + 16 + (size_t)i * 16 + 8);
            memcpy(&err[i], &bits, 8);
        }
    }
    free(b);
    return rc;
}

/* DIR and its missing parents. */
static int make_dirs(const char *dir) {
    char p[4096];
    size_t l = strlen(dir);
    if (l == 0 || l >= sizeof p) return nl_err("%s: plan cache directory path too long", dir);
    memcpy(p, dir, l + 1);
    for (size_t i = 1; i <= l; i++)
        if (p[i] == '/' || p[i] == 0) {
            char c = p[i];
            p[i] = 0;
            if (mkdir(p, 0700) != 0 && errno != EEXIST)
                return nl_err("%s: cannot create the plan cache directory: %s", p, strerror(errno));
            p[i] = c;
        }
    /* the cache directory itself 0700 (one made by an older build, or by hand, is narrowed) */
    struct stat st;
    if (stat(dir, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 077) && chmod(dir, 0700) != 0)
        return nl_err("%s: cannot make the plan cache directory private (0700): %s", dir, strerror(errno));
    return 0;
}

typedef struct {
    const unsigned char *b;
    size_t n;
} cache_body;

static int cache_body_write(void *user, nl_io_out *out) {
    const cache_body *cb = user;
    return nl_io_out_write(out, cb->b, cb->n);
}

static int cache_write(const char *dir, const char *path, const uint64_t *keys, const nl_proj_check *checks, int n) {
    const size_t len = 16 + (size_t)n * 16 + 8;
    unsigned char *b = nl_malloc(len);
    if (!b) return -1;
    memcpy(b, "NLPLANC1", 8);
    wr64(b + 8, (uint64_t)n << 32 | PLAN_CACHE_VERSION);
    for (int i = 0; i < n; i++) {
        uint64_t bits;
        double e = checks[i].rel_err;
        memcpy(&bits, &e, 8);
        wr64(b + 16 + (size_t)i * 16, keys[i]);
        wr64(b + 16 + (size_t)i * 16 + 8, bits);
    }
    wr64(b + len - 8, nl_hash64(b, len - 8, 0x6e6c706366ull));
    char tmp[4200];
    int rc = make_dirs(dir);
    if (!rc && snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof tmp)
        rc = nl_err("%s: path too long", path);
    cache_body cb = {b, len};
    if (!rc) rc = nl_io_write_atomic(NULL, path, tmp, cache_body_write, &cb) == -1 ? -1 : 0;
    /* 0600 whatever the umask: a group-writable file would not be trusted on the next load */
    if (!rc && chmod(path, 0600) != 0) rc = nl_err("%s: cannot make it private (0600): %s", path, strerror(errno));
    free(b);
    return rc;
}

/* The projections whose cached verdicts are measured again on a load: ceil(n / 16), at least
 * one, drawn from a seed no file can predict (time, pid, an address), so a forged verdict is
 * caught with probability >= 1/16 on every load, and the honest cache costs 1/16 of a plan. */
static void pick_sample(const nl_proj_service *s, unsigned char *pick) {
    int n = 0;
    for (int i = 0; i < s->n; i++) n += s->e[i].res.cls != NL_CLASS_EMBED;
    int k = (n + 15) / 16;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32 ^
                    (uint64_t)(uintptr_t)&ts;
    for (int j = 0; j < k && n > 0; j++) {
        /* the r-th projection not yet picked */
        uint64_t r = nl_rng_u64(seed, (uint64_t)j) % (uint64_t)(n - j);
        for (int i = 0; i < s->n; i++) {
            if (s->e[i].res.cls == NL_CLASS_EMBED || pick[i]) continue;
            if (r-- == 0) {
                pick[i] = 1;
                break;
            }
        }
    }
}

/* The plan; when read_cache, verdicts may come from the cache (a sample measured again); 1 when
 * a measured verdict differed from its cached one (the cache is then not to be trusted: the
 * caller plans again without it). Long (~220 lines) on purpose: its steps (sorted buckets, fresh
 * routes, cache keys, the checks, the sampled re-check, installing the routes under the lock)
 * share the service's lock state and one cleanup path for every allocation; split, each part
 * would take most of the locals. */
static int plan_impl(nl_proj_service *s, const int *buckets, int n_buckets, int read_cache) {
    if (!buckets || n_buckets <= 0) {
        buckets = default_buckets;
        n_buckets = (int)(sizeof default_buckets / sizeof default_buckets[0]);
    }
    pthread_mutex_lock(&s->mu);
    int busy = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    if (busy) return nl_err("proj: plan: a request is in flight");
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] <= 0 || buckets[i] > (1 << 20)) return nl_err("proj: plan: bad token bucket %d", buckets[i]);

    /* sorted, unique buckets */
    int *b = nl_malloc(sizeof(int) * (size_t)n_buckets);
    if (!b) return -1;
    memcpy(b, buckets, sizeof(int) * (size_t)n_buckets);
    qsort(b, (size_t)n_buckets, sizeof(int), cmp_int);
    int nb = 0;
    for (int i = 0; i < n_buckets; i++)
        if (nb == 0 || b[nb - 1] != b[i]) b[nb++] = b[i];
    const int tmax = b[nb - 1];

    /* fresh routes (all ref) and check list */
    int n_checks = 0;
    for (int i = 0; i < s->n; i++)
        if (s->e[i].res.cls != NL_CLASS_EMBED) n_checks += 2 * nb;
    nl_proj_check *checks = nl_calloc(n_checks ? (size_t)n_checks : 1, sizeof *checks);
    uint8_t **routes = nl_calloc(s->n ? (size_t)s->n : 1, sizeof *routes);
    if (!checks || !routes) goto oom;
    for (int i = 0; i < s->n; i++)
        if (!(routes[i] = nl_calloc(2 * (size_t)nb, 1))) goto oom;

    /* the executing code reads s->buckets / e->route: install the bucket list now, routes at the end */
    free(s->buckets);
    s->buckets = b;
    s->n_buckets = nb;
    b = NULL;
    for (int i = 0; i < s->n; i++) {
        free(s->e[i].route);
        s->e[i].route = routes[i];
        routes[i] = NULL;
    }

    /* the verdict cache: the checks' keys from their weights, kernels and parameters */
    s->plan_cache_note[0] = 0;
    uint64_t *keys = NULL, fkey = 0;
    double *cached = NULL;
    unsigned char *recheck = NULL; /* [s->n]: projections whose cached verdicts are measured again */
    int forged = 0;
    char cache_path[4200] = "";
    if (s->cfg.plan_cache_dir && s->cfg.plan_cache_dir[0] && n_checks) {
        for (int id = 0, k = 0; id < s->n; id++) {
            const nl_proj_entry *e = &s->e[id];
            if (e->res.cls == NL_CLASS_EMBED) continue;
            double bound = type_bound(e->res.type);
            if (s->cfg.wire_f16 && bound < 1e-2) bound = 1e-2;
            for (int d = 0; d < 2; d++)
                for (int bi = 0; bi < nb; bi++, k++)
                    checks[k] = (nl_proj_check){.id = id, .dir = (nl_dir)d, .T = s->buckets[bi], .bound = bound};
        }
        keys = nl_malloc(sizeof *keys * (size_t)n_checks);
        cached = nl_malloc(sizeof *cached * (size_t)n_checks);
        if (keys && cached) {
            fkey = cache_keys(s, checks, n_checks, keys);
            snprintf(cache_path, sizeof cache_path, "%s/plan-%016llx.nlpc", s->cfg.plan_cache_dir,
                     (unsigned long long)fkey);
            char why[512] = "";
            int cr =
                read_cache ? cache_read(s->cfg.plan_cache_dir, cache_path, keys, n_checks, cached, why, sizeof why) : 1;
            if (cr == 0 && !(recheck = nl_calloc((size_t)s->n + 1, 1))) cr = 1;
            if (cr == 0) {
                pick_sample(s, recheck);
                snprintf(s->plan_cache_note, sizeof s->plan_cache_note, "; verdicts from the plan cache %s",
                         cache_path);
            } else {
                if (cr < 0)
                    snprintf(s->plan_cache_note, sizeof s->plan_cache_note,
                             "; plan cache %s ignored (%s): checked again", cache_path, why);
                free(cached);
                cached = NULL;
            }
        } else {
            nl_clear_error();
            free(keys);
            free(cached);
            keys = NULL;
            cached = NULL;
        }
    }

    nl_pool *pool = nl_pool_new(s->n_threads);
    dir_buf bufs[2];
    memset(bufs, 0, sizeof bufs);
    float *ybe = NULL, *wrow = NULL;
    double *part = NULL;
    size_t ybe_n = 0, wrow_n = 0, part_n = 0;
    int ci = 0, rc = pool ? 0 : -1;
    for (int id = 0; id < s->n && rc == 0; id++) {
        nl_proj_entry *e = &s->e[id];
        if (e->res.cls == NL_CLASS_EMBED) continue; /* row gathers only */
        const int trivial = s->be == &nl_proj_backend_ref && e->res.data == e->orig.data && !s->cfg.wire_f16;
        const int measure = !cached || recheck[id]; /* no cache, or a projection of the sample */
        double bound = type_bound(e->res.type);
        if (s->cfg.wire_f16 && bound < 1e-2) bound = 1e-2;
        const int64_t K = e->orig.n_in, N = e->orig.n_out;

        /* which (direction, bucket) pairs run the backend */
        nl_proj_check *pc = &checks[ci];
        dir_ref dr[2];
        memset(dr, 0, sizeof dr);
        for (int d = 0; d < 2; d++)
            for (int bi = 0; bi < nb; bi++) {
                nl_proj_check *c = &pc[d * nb + bi];
                c->id = id;
                c->dir = (nl_dir)d;
                c->T = s->buckets[bi];
                c->bound = bound;
                c->rel_err = NAN;
                c->supported = s->be->supports(s->be_ctx, &e->res, (nl_dir)d, c->T) != 0;
                if (c->supported && trivial) c->rel_err = 0; /* the same code on the same bytes */
                else if (c->supported && !measure) c->rel_err = cached[ci + d * nb + bi]; /* measured before */
                else if (c->supported) dr[d].need = 1;
            }
        ci += 2 * nb;

        if (dr[0].need || dr[1].need) {
            /* the reference columns of both directions, from one pass over the original W */
            for (int d = 0; d < 2 && rc == 0; d++)
                if (dr[d].need && dir_setup(&dr[d], &bufs[d], d ? N : K, d ? K : N, tmax,
                                            0x6E6C706C616E6E72ull ^ ((uint64_t)id << 1 | (uint64_t)d), d == 0))
                    rc = -1;
            if (rc) break;
            pass_job pj = {e, nl_type_get(e->orig.type), nl_row_bytes(e->orig.type, K), &dr[0], &dr[1], 0, NULL, NULL};
            int nc = N < PLAN_CHUNKS ? (int)N : PLAN_CHUNKS;
            if (dr[0].need && dr[0].G)
                while (nc > 1 && (uint64_t)nc * dr[0].G * (uint64_t)K * sizeof(double) > PLAN_PART_BYTES) nc--;
            pj.n_chunks = nc;
            if (grow((void **)&wrow, &wrow_n, (size_t)nc * (size_t)K, sizeof(float)) ||
                (dr[0].need && dr[0].G &&
                 grow((void **)&part, &part_n, (size_t)nc * (size_t)dr[0].G * (size_t)K, sizeof(double)))) {
                rc = -1;
                break;
            }
            pj.wrow = wrow;
            pj.part = part;
            nl_pool_run(pool, nc, pass_task, &pj);
            if (dr[0].need && dr[0].G) {
                /* FWD probes: Σ over chunks in chunk order -> aux[k][g] */
                for (int64_t k = 0; k < K; k++)
                    for (int g = 0; g < dr[0].G; g++) {
                        double acc = 0;
                        for (int c = 0; c < nc; c++)
                            acc += part[((size_t)c * dr[0].G + (size_t)g) * (size_t)K + (size_t)k];
                        dr[0].aux[(size_t)k * dr[0].width + (size_t)g] = acc;
                    }
            }
            for (int d = 0; d < 2; d++)
                if (dr[d].need) {
                    prod_job pr = {&dr[d], tmax};
                    nl_pool_run(pool, (tmax + PLAN_TBLK - 1) / PLAN_TBLK, prod_task, &pr);
                }
        }

        for (int d = 0; d < 2 && rc == 0; d++) {
            const nl_dir dir = (nl_dir)d;
            for (int bi = 0; bi < nb; bi++) {
                nl_proj_check *c = &pc[d * nb + bi];
                if (c->supported && !trivial && measure) {
                    const int T = c->T;
                    if (grow((void **)&ybe, &ybe_n, (size_t)T * (size_t)dr[d].n_out, sizeof(float))) {
                        rc = -1;
                        break;
                    }
                    memset(&s->wst, 0, sizeof s->wst);
                    if (nl_proj_exec_backend(s, e, dir, dr[d].x, T, T, ybe) == 0) c->rel_err = compare(&dr[d], ybe, T);
                    /* a backend error is a failed check (rel_err stays NaN), not a failed plan */
                }
                c->passed = c->supported && isfinite(c->rel_err) && c->rel_err <= c->bound;
                if (c->supported && !trivial && cached && recheck[id]) {
                    const double was = cached[ci - 2 * nb + d * nb + bi];
                    if (c->passed != (isfinite(was) && was <= c->bound)) forged = 1;
                }
                e->route[d * nb + bi] = c->passed ? NL_ROUTE_BACKEND : NL_ROUTE_REF;
            }
        }
    }
    memset(&s->wst, 0, sizeof s->wst);
    nl_pool_free(pool);
    for (int d = 0; d < 2; d++) {
        free(bufs[d].cols);
        free(bufs[d].col_slot);
        free(bufs[d].sign);
        free(bufs[d].x);
        free(bufs[d].aux);
        free(bufs[d].yref);
    }
    free(ybe);
    free(wrow);
    free(part);
    free(routes);
    free(s->checks);
    s->checks = checks;
    s->n_checks = ci;
    int unsure = 0; /* a backend error is a failed check now, not a verdict to keep */
    for (int i = 0; i < ci; i++) unsure |= checks[i].supported && isnan(checks[i].rel_err);
    if (!rc && keys && !cached && !unsure && ci == n_checks &&
        cache_write(s->cfg.plan_cache_dir, cache_path, keys, checks, n_checks)) {
        /* a cache that cannot be written costs the next run its checks, nothing else */
        size_t l = strlen(s->plan_cache_note);
        snprintf(s->plan_cache_note + l, sizeof s->plan_cache_note - l, "; plan cache not written: %s",
                 nl_last_error());
        nl_clear_error();
    }
    free(keys);
    free(cached);
    free(recheck);
    if (rc) {
        /* out of memory half way: every route stays at ref, which is always correct */
        for (int i = 0; i < s->n; i++) memset(s->e[i].route, NL_ROUTE_REF, 2 * (size_t)nb);
        return nl_err_prefix("proj: plan");
    }
    return forged;

oom:
    if (routes)
        for (int i = 0; i < s->n; i++) free(routes[i]);
    free(routes);
    free(checks);
    free(b);
    return nl_err("proj: plan: out of memory");
}

int nl_proj_plan(nl_proj_service *s, const int *buckets, int n_buckets) {
    int rc = plan_impl(s, buckets, n_buckets, 1);
    if (rc != 1) return rc;
    /* a sampled verdict measured otherwise than the cache said: the file is forged or stale;
     * every verdict is measured again (and the file rewritten) */
    char was[sizeof s->plan_cache_note];
    snprintf(was, sizeof was, "%s", s->plan_cache_note);
    const char *path = strstr(was, "plan cache ");
    rc = plan_impl(s, buckets, n_buckets, 0);
    if (rc == 1) rc = 0; /* not reached: nothing cached was read */
    if (rc == 0) {
        char note[2 * sizeof s->plan_cache_note + 128];
        snprintf(note, sizeof note,
                 "; %s ignored (a re-checked verdict differs from the one it holds: forged or stale): checked again%s",
                 path ? path : "plan cache", s->plan_cache_note);
        size_t l = strlen(note);
        if (l >= sizeof s->plan_cache_note) l = sizeof s->plan_cache_note - 1;
        memcpy(s->plan_cache_note, note, l);
        s->plan_cache_note[l] = 0;
    }
    return rc;
}

void nl_proj_plan_get_totals(const nl_proj_service *s, nl_proj_plan_totals *out) {
    memset(out, 0, sizeof *out);
    out->checks = s->n_checks;
    for (int i = 0; i < s->n_checks; i++) {
        if (s->checks[i].passed) out->passed++;
        else out->routed++;
    }
}

int nl_proj_plan_check_count(const nl_proj_service *s) { return s->n_checks; }

const nl_proj_check *nl_proj_plan_get_check(const nl_proj_service *s, int i) {
    return i >= 0 && i < s->n_checks ? &s->checks[i] : NULL;
}

int nl_proj_plan_format_summary(const nl_proj_service *s, char *buf, size_t cap) {
    nl_proj_plan_totals t;
    nl_proj_plan_get_totals(s, &t);
    return snprintf(buf, cap, "%d checks, %d passed, %d routed to CPU%s", t.checks, t.passed, t.routed,
                    s->plan_cache_note);
}

char *nl_proj_plan_format_table(const nl_proj_service *s) {
    size_t cap = 128 + (size_t)s->n_checks * 160, len = 0;
    char *out = nl_malloc(cap);
    if (!out) return NULL;
    len += (size_t)snprintf(out, cap, "%-32s %-3s %6s %-5s %10s %8s  %s\n", "projection", "dir", "T", "type", "rel_err",
                            "bound", "result");
    for (int i = 0; i < s->n_checks; i++) {
        const nl_proj_check *c = &s->checks[i];
        const nl_proj_entry *e = &s->e[c->id];
        char err[32];
        if (isnan(c->rel_err)) snprintf(err, sizeof err, "-");
        else snprintf(err, sizeof err, "%.2e", c->rel_err);
        const char *why = c->passed       ? "ok"
                          : !c->supported ? "routed to CPU (unsupported)"
                                          : "routed to CPU (error above bound)";
        int n = snprintf(out + len, cap - len, "%-32.32s %-3s %6d %-5s %10s %8.0e  %s\n", e->name,
                         c->dir == NL_FWD ? "fwd" : "bwd", c->T, nl_type_name(e->res.type), err, c->bound, why);
        if (n > 0) len += (size_t)n < cap - len ? (size_t)n : cap - len - 1;
    }
    return out;
}

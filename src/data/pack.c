/* data/pack: length-class packing of examples into sequences, and the deterministic,
 * resumable batch order the trainer walks. The contract is in dataset.h. */
#include "data/dataset.h"

#include <stdlib.h>
#include <string.h>

#include "util/rng.h"
#include "util/util.h"

/* ---- packing ---- */

void nl_packing_free(nl_packing *p) {
    if (!p) return;
    free(p->seq);
    memset(p, 0, sizeof *p);
}

void nl_row_targets(const int32_t *ids, const uint8_t *target, int n, int32_t *rows) {
    for (int t = 0; t + 1 < n; t++) rows[t] = target[t + 1] ? ids[t + 1] : -1;
    if (n > 0) rows[n - 1] = -1;
}

int nl_example_targets_within(const nl_example *ex, int max_ctx) {
    if (ex->n_tokens <= max_ctx) return ex->n_targets;
    int nt = 0;
    for (int i = 0; i < max_ctx; i++) nt += ex->target[i];
    return nt;
}

int nl_pack(const nl_dataset *ds, const int *buckets, int n_buckets, int max_ctx, nl_overlong policy, nl_packing *out) {
    memset(out, 0, sizeof *out);
    if (max_ctx < 2) return nl_err("context length %d is too small (at least 2)", max_ctx);
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] < 1 || (i > 0 && buckets[i] <= buckets[i - 1]))
            return nl_err("token buckets must be positive and ascending (bucket %d = %d)", i, buckets[i]);
    out->seq = calloc(ds->n ? (size_t)ds->n : 1, sizeof *out->seq);
    if (!out->seq) return nl_err("out of memory");
    for (int e = 0; e < ds->n; e++) {
        const nl_example *ex = &ds->ex[e];
        int n = ex->n_tokens, nt = ex->n_targets;
        if (n > max_ctx) {
            if (policy == NL_OVERLONG_REFUSE) {
                nl_packing_free(out);
                return nl_err("%s:%d:1: example has %d tokens, more than the context of %d "
                              "(shorten it, raise the context or truncate)",
                              ds->path, ex->line, n, max_ctx);
            }
            n = max_ctx;
            nt = nl_example_targets_within(ex, max_ctx);
            if (nt == 0) {
                out->n_dropped++;
                continue;
            }
            out->n_truncated++;
        }
        int bucket = max_ctx;
        for (int i = 0; i < n_buckets; i++)
            if (buckets[i] >= n && buckets[i] <= max_ctx) {
                bucket = buckets[i];
                break;
            }
        nl_seq *s = &out->seq[out->n++];
        s->ids = ex->ids;
        s->target = ex->target;
        s->n_tokens = n;
        s->n_targets = nt;
        s->bucket = bucket;
        s->example = e;
    }
    if (out->n == 0) {
        nl_packing_free(out);
        return nl_err("%s: no example has a target token within the context of %d", ds->path, max_ctx);
    }
    return 0;
}

/* Counter-based hash (the splitmix64 step: add γ, then mix), so position k of epoch e never
 * depends on how many numbers were drawn before: any cursor can be resumed directly. */
static uint64_t mix64(uint64_t x) { return nl_rng_mix64(x + NL_RNG_GAMMA); }

void nl_data_order(int n, uint64_t seed, int64_t epoch, bool shuffle, int *perm) {
    for (int k = 0; k < n; k++) perm[k] = k;
    if (!shuffle) return;
    uint64_t key = mix64(mix64(seed ^ 0x6E6C2D6461746131ULL) ^ (uint64_t)epoch);
    for (int i = n - 1; i > 0; i--) {
        /* Modulo bias is < n / 2^64: irrelevant. */
        int j = (int)(mix64(key ^ (uint64_t)i) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

struct nl_batcher {
    const nl_packing *p;
    uint64_t seed;
    bool shuffle;
    int batch_tokens;
    int *perm;          /* order of perm_epoch */
    int64_t perm_epoch; /* -1: none yet */
    nl_data_cursor cur;
    int *out; /* indices of the last batch */
};

nl_batcher *nl_batcher_new(const nl_packing *p, uint64_t seed, bool shuffle, int batch_tokens) {
    if (!p || p->n <= 0) {
        nl_err("nl_batcher_new: no sequences");
        return NULL;
    }
    if (batch_tokens < 1) {
        nl_err("batch tokens must be at least 1 (got %d)", batch_tokens);
        return NULL;
    }
    nl_batcher *b = nl_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->p = p;
    b->seed = seed;
    b->shuffle = shuffle;
    b->batch_tokens = batch_tokens;
    b->perm = nl_malloc((size_t)p->n * sizeof *b->perm);
    b->out = nl_malloc((size_t)p->n * sizeof *b->out);
    if (!b->perm || !b->out) {
        nl_batcher_free(b);
        return NULL;
    }
    b->perm_epoch = -1;
    return b;
}

void nl_batcher_free(nl_batcher *b) {
    if (!b) return;
    free(b->perm);
    free(b->out);
    free(b);
}

int nl_batcher_seek(nl_batcher *b, nl_data_cursor cur) {
    if (cur.epoch < 0 || cur.index < 0 || cur.index > b->p->n)
        return nl_err("data cursor (epoch %lld, index %lld) is outside the data (%d sequences)", (long long)cur.epoch,
                      (long long)cur.index, b->p->n);
    if (cur.index == b->p->n) {
        cur.epoch++;
        cur.index = 0;
    }
    b->cur = cur;
    return 0;
}

nl_data_cursor nl_batcher_cursor(const nl_batcher *b) { return b->cur; }

int nl_batcher_next(nl_batcher *b, const int **seq_idx, int *n_seq) {
    const nl_packing *p = b->p;
    if (b->perm_epoch != b->cur.epoch) {
        nl_data_order(p->n, b->seed, b->cur.epoch, b->shuffle, b->perm);
        b->perm_epoch = b->cur.epoch;
    }
    int k = 0;
    int64_t tokens = 0;
    while (b->cur.index < p->n) {
        int s = b->perm[b->cur.index];
        int t = p->seq[s].n_tokens;
        if (k > 0 && tokens + t > b->batch_tokens) break;
        b->out[k++] = s;
        tokens += t;
        b->cur.index++;
        if (tokens >= b->batch_tokens) break;
    }
    if (b->cur.index >= p->n) {
        b->cur.epoch++;
        b->cur.index = 0;
    }
    *seq_idx = b->out;
    *n_seq = k;
    return 0;
}

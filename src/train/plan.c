/* train/plan: a run's data and step plan, the short-run warning and `train --dry-run`
 * (plan.h). */
#include "train/plan.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "os/mem.h"
#include "util/json.h"
#include "train/trainer_impl.h"
#include "util/util.h"

/* The size of the file at path and its longest line (bytes, and its 1-based number), read in
 * 1 MiB chunks (no more held); 0, or -1 when it cannot be read (the loader then says why). */
static int scan_lines(const char *path, uint64_t *size, uint64_t *longest, int64_t *longest_line) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char *buf = malloc(1 << 20);
    uint64_t cur = 0, total = 0;
    int64_t line = 1;
    *longest = 0;
    *longest_line = 1;
    size_t n;
    while (buf && (n = fread(buf, 1, 1 << 20, f)) > 0) {
        total += n;
        for (const char *p = buf, *end = buf + n; p < end;) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            cur += (uint64_t)((nl ? nl : end) - p);
            if (!nl) break;
            if (cur > *longest) {
                *longest = cur;
                *longest_line = line;
            }
            cur = 0;
            line++;
            p = nl + 1;
        }
    }
    if (cur > *longest) {
        *longest = cur;
        *longest_line = line;
    }
    int rc = buf && !ferror(f) ? 0 : -1;
    free(buf);
    fclose(f);
    *size = total;
    return rc;
}

/* Bytes the reader and the tokenizer hold at their peak per byte of the longest line (its
 * text, the JSON value, pre-tokenized pieces and BPE symbols): measured 13.5 on SmolLM2's
 * tokenizer (a 6.2 MB line: +84 MB), about 18 in the hardening issue's 60 MB line; with margin. */
#define READ_BYTES_PER_LINE_BYTE 20

/* --mem-limit-mb is kept while reading too: what reading the data would peak at (the process
 * now, the file's buffer and its tokens, the longest line held READ_BYTES_PER_LINE_BYTE times),
 * refused before it is read rather than after the peak. */
static int check_read_memory(const nl_train_opts *o) {
    if (!(o->mem_limit_mb > 0)) return 0;
    const char *files[2] = {o->data, o->val_data};
    uint64_t need = o->count_process ? (uint64_t)(nl_rss_bytes() > 0 ? nl_rss_bytes() : 0) : 0, worst = 0;
    const char *worst_file = o->data;
    int64_t worst_line = 1;
    for (int k = 0; k < 2; k++) {
        uint64_t size, longest;
        int64_t line;
        if (!files[k] || scan_lines(files[k], &size, &longest, &line)) continue;
        need += 2 * size; /* the file's text, and its examples' tokens and strings */
        if (longest > worst) {
            worst = longest;
            worst_file = files[k];
            worst_line = line;
        }
    }
    need += (uint64_t)READ_BYTES_PER_LINE_BYTE * worst;
    const uint64_t limit = (uint64_t)(o->mem_limit_mb * NL_MB);
    if (need <= limit) return 0;
    return nl_err(
        "not enough memory: reading the data would need about %.2f MiB at its peak (%s:%" PRId64 " is %" PRIu64
        " bytes, which the reader and the tokenizer hold about %d times over), %.2f MiB allowed by --mem-limit-mb: "
        "split that example or raise --mem-limit-mb; nothing was read or trained",
        (double)need / NL_MB, worst_file, worst_line, worst, READ_BYTES_PER_LINE_BYTE, o->mem_limit_mb);
}

int nl_train_load_data(const nl_train_opts *o, const nl_model *m, const nl_tokenizer *tok, nl_dataset *ds,
                       nl_packing *pk, int *max_ctx, nl_dataset *held) {
    memset(pk, 0, sizeof *pk);
    memset(held, 0, sizeof *held);
    if (check_read_memory(o)) return -1;
    nl_data_opts dopt = {.chat_template = o->chat_template,
                         .n_vocab = m->hp.n_vocab,
                         .strict_keys = o->strict_keys,
                         .columns = o->columns,
                         .alpaca = o->alpaca_prompt};
    if (nl_dataset_load(o->data, tok, &dopt, ds)) return -1;
    /* the validation split comes out before packing: what is held out is never trained on */
    if (o->val_split > 0 && nl_dataset_split(ds, o->val_split, held)) {
        nl_dataset_free(ds);
        return -1;
    }
    const int ctx =
        o->max_ctx > 0 ? o->max_ctx : (m->hp.n_ctx_train > 0 && m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    if (ctx < 2) {
        if (o->max_ctx > 0) nl_err("--ctx %d: expected >= 2", o->max_ctx);
        else
            nl_err("%s: the model's context length is %d, too small to train on (at least 2; --ctx sets another)",
                   o->model, ctx);
        nl_dataset_free(ds);
        nl_dataset_free(held);
        return -1;
    }
    if (nl_pack(ds, nl_train_buckets, nl_train_n_buckets, ctx,
                o->refuse_long ? NL_OVERLONG_REFUSE : NL_OVERLONG_TRUNCATE, pk)) {
        nl_dataset_free(ds);
        nl_dataset_free(held);
        return -1;
    }
    if (pk->n == 0) {
        nl_err("%s: no example has a target token left to train on (%d examples, %d dropped)", o->data, ds->n,
               pk->n_dropped);
        nl_packing_free(pk);
        nl_dataset_free(ds);
        nl_dataset_free(held);
        return -1;
    }
    *max_ctx = ctx;
    return 0;
}

int64_t nl_train_count_steps(const nl_train_opts *o, const nl_packing *pk, int64_t *per_epoch) {
    if (o->steps > 0 && !per_epoch) return o->steps;
    /* bounded work: the epochs in their range, and with shuffling (each epoch's order walked)
     * at most 2^27 sequence visits, seconds at most */
    if (o->steps <= 0 && !(o->epochs > 0 && o->epochs <= 1e6))
        return nl_err("--epochs %g: expected a number in [1e-06, 1e+06]", o->epochs);
    if (o->steps <= 0 && o->shuffle && ceil(o->epochs) * (double)pk->n > 134217728.0)
        return nl_err(
            "--epochs %g over %d sequences, shuffled: %.3g epochs' orders to walk to count the steps, more than the"
            " 2^27 sequence visits a plan may take; give --steps N (or --no-shuffle)",
            o->epochs, pk->n, ceil(o->epochs));
    /* walk the batcher through ceil(epochs) epochs, counting batches: with shuffling an
     * epoch's batch count depends on its order; without, every epoch has the first one's.
     * 64-bit: 200k sequences a batch each over 11000 epochs are 2.2e9 steps. */
    nl_batcher *b = nl_batcher_new(pk, o->seed, o->shuffle, o->batch_tokens);
    if (!b) return -1;
    const int64_t whole = o->steps > 0 ? 0 : (int64_t)floor(o->epochs);
    const double frac = o->steps > 0 ? 0 : o->epochs - (double)whole;
    int64_t total = 0, first = -1;
    for (int64_t e = 0; e < (o->steps > 0 ? 1 : whole + (frac > 0)); e++) {
        int64_t in_epoch = 0;
        if (!o->shuffle && first >= 0) {
            in_epoch = first;
        } else {
            const int *idx;
            int n;
            for (;;) {
                nl_data_cursor c = nl_batcher_cursor(b);
                if (c.epoch != e) break;
                if (nl_batcher_next(b, &idx, &n)) {
                    nl_batcher_free(b);
                    return -1;
                }
                in_epoch++;
            }
            if (first < 0) first = in_epoch;
        }
        total += e < whole ? in_epoch : (int64_t)ceil(frac * (double)in_epoch);
    }
    nl_batcher_free(b);
    if (per_epoch) *per_epoch = first;
    if (o->steps > 0) return o->steps;
    return total > 0 ? total : 1;
}

/* The steps of o's run over pk with another batch size and a number of epochs. */
static int64_t steps_with(const nl_train_opts *o, const nl_packing *pk, int batch_tokens, double epochs,
                          int64_t *per_epoch) {
    nl_train_opts c = *o;
    c.steps = 0;
    c.epochs = epochs;
    c.batch_tokens = batch_tokens;
    return nl_train_count_steps(&c, pk, per_epoch);
}

int nl_train_batch_for(const nl_train_opts *o, const nl_packing *pk, int64_t *per_epoch) {
    int bt = NL_TRAIN_BATCH_TOKENS;
    int64_t pe = 0;
    if (o->steps > 0) {
        if (per_epoch && steps_with(o, pk, bt, 1, per_epoch) < 0) return -1;
        return bt;
    }
    for (;;) {
        if (steps_with(o, pk, bt, 1, &pe) < 0) return -1;
        /* enough steps, or a sequence a step already (a smaller batch gives no more: the
         * first such batch, halving, is the largest) */
        if (pe >= NL_TRAIN_FEW_STEPS || pe >= pk->n || bt == 1) break;
        bt /= 2;
    }
    if (per_epoch) *per_epoch = pe;
    return bt;
}

/* DIR/run.json's value of key as a string (malloc'd), or NULL when the file or the key is not
 * there or not readable (no error set). */
static char *run_json_value(const char *dir, const char *key) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/run.json", dir) >= (int)sizeof path) return NULL;
    size_t len;
    char *buf = nl_read_file(path, &len), *val = NULL;
    if (!buf) {
        nl_clear_error();
        return NULL;
    }
    nl_json *j = nl_json_parse(buf, len, NULL);
    const nl_json *v = nl_json_is_object(j) ? nl_json_get(j, key) : NULL;
    if (nl_json_is_string(v) && !memchr(v->u.str.s, 0, v->u.str.len) && (val = malloc(v->u.str.len + 1))) {
        memcpy(val, v->u.str.s, v->u.str.len);
        val[v->u.str.len] = 0;
    }
    nl_json_free(j);
    free(buf);
    nl_clear_error();
    return val;
}

int nl_train_resolve_batch(nl_train_opts *o, const nl_packing *pk) {
    if (o->batch_tokens > 0) return NL_BATCH_GIVEN;
    if (o->resume && o->checkpoint_dir) {
        /* the run resumed keeps its batch: a string of digits in the flag's range, nothing else */
        char *v = run_json_value(o->checkpoint_dir, "batch_tokens");
        const nl_train_range *r = nl_train_range_of("batch-tokens");
        char *end = NULL;
        long long bt = v && v[0] >= '0' && v[0] <= '9' ? strtoll(v, &end, 10) : 0;
        const int ok = end && !*end && bt >= (long long)r->lo && bt <= (long long)r->hi;
        free(v);
        if (ok) {
            char *how = run_json_value(o->checkpoint_dir, "batch_sizing");
            const int sized = how && !strcmp(how, "data");
            free(how);
            o->batch_tokens = (int)bt;
            return sized ? NL_BATCH_RESUMED_SIZED : NL_BATCH_RESUMED_GIVEN;
        }
    }
    int bt = nl_train_batch_for(o, pk, NULL);
    if (bt < 0) return -1;
    o->batch_tokens = bt;
    return NL_BATCH_SIZED;
}

const char *nl_train_batch_note(int how, char *buf, size_t cap) {
    if (how == NL_BATCH_SIZED)
        snprintf(buf, cap,
                 "sized to the data: the largest of %d, %d, ... with at least %d steps an epoch; --batch-tokens N"
                 " sets one",
                 NL_TRAIN_BATCH_TOKENS, NL_TRAIN_BATCH_TOKENS / 2, NL_TRAIN_FEW_STEPS);
    else if (how == NL_BATCH_RESUMED_SIZED) snprintf(buf, cap, "the resumed run's, sized to its data (run.json)");
    else if (how == NL_BATCH_RESUMED_GIVEN) snprintf(buf, cap, "the resumed run's (run.json)");
    else buf[0] = 0;
    return buf;
}

int nl_train_short_run(const nl_train_opts *o, const nl_packing *pk, int64_t total, int64_t per_epoch, char *buf,
                       size_t cap) {
    buf[0] = 0;
    const int few = total < NL_TRAIN_FEW_STEPS, part = total < per_epoch;
    if (!few && !part) return 0;
    /* The suggestion: at least one epoch (the epochs asked for, when more), and the largest
     * batch, halving, that gives enough steps; when even one sequence a step is too few, the
     * epochs that make up the rest. */
    double ep = o->steps == 0 && o->epochs > 1 ? o->epochs : 1;
    int bt = o->batch_tokens;
    int64_t got;
    for (;;) {
        int64_t pe;
        if ((got = steps_with(o, pk, bt, ep, &pe)) < 0) return -1;
        if (got >= NL_TRAIN_FEW_STEPS) break;
        if (pe >= pk->n || bt == 1) { /* a sequence a step already */
            ep = ceil((double)NL_TRAIN_FEW_STEPS / (double)pe);
            if ((got = steps_with(o, pk, bt, ep, NULL)) < 0) return -1;
            break;
        }
        bt /= 2;
    }
    int64_t tokens = 0;
    for (int i = 0; i < pk->n; i++) tokens += pk->seq[i].n_tokens;
    char cause[320], set[96] = "";
    if (few)
        snprintf(cause, sizeof cause,
                 "only %" PRId64 " optimizer step%s (%" PRId64 " an epoch of %d sequence%s, %" PRId64
                 " tokens, at --batch-tokens %d)%s: too few to learn much",
                 total, total == 1 ? "" : "s", per_epoch, pk->n, pk->n == 1 ? "" : "s", tokens, o->batch_tokens,
                 part ? ", less than one epoch" : "");
    else
        snprintf(cause, sizeof cause,
                 "%" PRId64 " optimizer steps cover %.0f%% of one epoch (%" PRId64 " steps at --batch-tokens %d):"
                 " part of the data is never trained on",
                 total, 100.0 * (double)total / (double)per_epoch, per_epoch, o->batch_tokens);
    int n = 0;
    if (bt != o->batch_tokens) n += snprintf(set + n, sizeof set - (size_t)n, "--batch-tokens %d", bt);
    if (o->steps > 0 || ep != o->epochs)
        snprintf(set + n, sizeof set - (size_t)n, "%s--epochs %g%s", n ? " " : "", ep,
                 o->steps > 0 ? " (instead of --steps)" : "");
    snprintf(buf, cap, "%s; %s gives %" PRId64 " steps", cause, set, got);
    return 0;
}

/* Appends len bytes to a growing buffer. */
typedef struct {
    char *s;
    size_t n, cap;
} text_buf;

static int tb_put(text_buf *b, const char *s, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + len + 1) nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) return nl_err("out of memory");
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, len);
    b->n += len;
    b->s[b->n] = 0;
    return 0;
}

int nl_train_render_seq(const nl_tokenizer *tok, const int32_t *ids, const uint8_t *target, int n, size_t max_bytes,
                        char **text) {
    text_buf b = {0};
    int in = 0, i = 0, rc = tb_put(&b, "", 0);
    for (; i < n && !rc; i++) {
        if (max_bytes && b.n >= max_bytes) break;
        if (target[i] != in) rc = tb_put(&b, in ? "]]" : "[[", 2);
        in = target[i];
        size_t len;
        const char *p = nl_token_piece(tok, ids[i], &len);
        if (!p) {
            char unk[32];
            int k = snprintf(unk, sizeof unk, "<token %d>", ids[i]);
            rc = rc || tb_put(&b, unk, (size_t)k);
        } else {
            rc = rc || tb_put(&b, p, len);
        }
    }
    if (!rc && in) rc = tb_put(&b, "]]", 2);
    if (!rc && i < n) {
        char more[64];
        int k = snprintf(more, sizeof more, " ... (%d more tokens)", n - i);
        rc = tb_put(&b, more, (size_t)k);
    }
    if (rc) {
        free(b.s);
        return -1;
    }
    *text = b.s;
    return 0;
}

static const char *format_name(nl_line_format f) {
    return f == NL_LINE_PROMPT     ? "prompt/completion"
           : f == NL_LINE_MESSAGES ? "chat"
           : f == NL_LINE_TEXT     ? "text"
                                   : "tokens";
}

int nl_train_dry_run(const nl_train_opts *given, int n_show, FILE *f) {
    if (!given->model || !given->data) return nl_err("train: --model and --data are required");
    nl_train_opts run = *given, *o = &run; /* the batch made the run's (nl_train_resolve_batch) */
    nl_model *m = nl_model_load(o->model);
    if (!m) return -1;
    nl_tokenizer *tok = NULL;
    nl_dataset ds = {0}, held = {0};
    nl_packing pk = {0};
    int rc = -1, max_ctx = 0;
    if (nl_tokenizer_for_model(m, &tok)) goto done;
    if (!tok) {
        nl_err("%s: the model has no tokenizer vocabulary", o->model);
        goto done;
    }
    if (m->warning) fprintf(f, "warning: %s: %s\n", o->model, m->warning);
    if (nl_train_load_data(o, m, tok, &ds, &pk, &max_ctx, &held)) goto done;
    const int how = nl_train_resolve_batch(o, &pk);
    if (how < 0) goto done;
    int64_t per_epoch = 0, total = nl_train_count_steps(o, &pk, &per_epoch);
    if (total < 0) goto done;
    fprintf(f, "dry run: %s on %s; nothing is trained or written\n", o->model, o->data);
    for (int i = 0; i < ds.n; i++)
        if (ds.ex[i].format == NL_LINE_MESSAGES) {
            nl_chat_template *ct;
            if (nl_chat_template_open(tok, o->chat_template, &ct) == 0) {
                const char *d = nl_chat_template_desc(ct);
                fprintf(f, "chat template: %s%s\n", strcmp(d, "tokenizer.chat_template") ? d : "the model's own",
                        strcmp(d, "tokenizer.chat_template") ? "" : " (tokenizer.chat_template)");
                nl_chat_template_free(ct);
            }
            break;
        }
    for (int i = 0; i < pk.n && i < n_show; i++) {
        const nl_seq *s = &pk.seq[i];
        const nl_example *ex = &ds.ex[s->example];
        char *text;
        if (nl_train_render_seq(tok, s->ids, s->target, s->n_tokens, 4000, &text)) goto done;
        fprintf(f, "\nsequence %d of %d: line %d (%s), %d tokens%s, %d targets [[marked]]:\n%s\n", i + 1, pk.n,
                ex->line, format_name(ex->format), s->n_tokens,
                s->n_tokens < ex->n_tokens ? " (cut to the context)" : "", s->n_targets, text);
        free(text);
    }
    int64_t tokens = 0, targets = 0;
    for (int i = 0; i < pk.n; i++) {
        tokens += pk.seq[i].n_tokens;
        targets += pk.seq[i].n_targets;
    }
    char what[64];
    if (o->steps > 0) snprintf(what, sizeof what, "--steps %" PRId64, o->steps);
    else snprintf(what, sizeof what, "--epochs %g", o->epochs);
    char note[160], why[176] = "";
    if (how != NL_BATCH_GIVEN) snprintf(why, sizeof why, " (%s)", nl_train_batch_note(how, note, sizeof note));
    fprintf(f,
            "\nplan: %d examples, %d sequences (%d truncated to %d tokens, %d dropped with no target left), %" PRId64
            " tokens and %" PRId64 " targets an epoch; --batch-tokens %d%s: %" PRId64 " steps an epoch; %s: %" PRId64
            " optimizer steps\n",
            ds.n, pk.n, pk.n_truncated, max_ctx, pk.n_dropped, tokens, targets, o->batch_tokens, why, per_epoch, what,
            total);
    char warn[640];
    if (nl_dataset_note(&ds, warn, sizeof warn)[0]) fprintf(f, "data: %s\n", warn);
    if (nl_train_short_run(o, &pk, total, per_epoch, warn, sizeof warn)) goto done;
    if (warn[0]) fprintf(f, "warning: %s\n", warn);
    rc = 0;
done:
    nl_packing_free(&pk);
    nl_dataset_free(&ds);
    nl_dataset_free(&held);
    nl_tokenizer_free(tok);
    nl_model_free(m);
    return rc;
}

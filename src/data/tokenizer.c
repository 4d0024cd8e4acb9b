/* data/tokenizer: byte-level BPE ("gpt2") and SentencePiece BPE ("llama") over the vocabulary
 * embedded in a GGUF. Facts (keys, pre-tokenizer regexes, byte mapping, merge loop, special
 * tokens) are those of llama.cpp's src/llama-vocab.cpp and src/unicode.cpp, summarised in
 * docs/formats.md §5; the code here is our own.
 *
 * Pipeline of nl_tokenize:
 *   1. validate UTF-8 (error names the byte offset);
 *   2. carve special tokens out of the text (longest text first, every occurrence): CONTROL and
 *      UNKNOWN tokens only with parse_special, USER_DEFINED tokens always (llama.cpp does the
 *      same: added tokens such as mpt's runs of spaces are matched before pre-tokenizing);
 *   3. each remaining raw fragment: BPE -> pre-tokenizer split into pieces, each piece
 *      byte-mapped and merged by rank; SPM -> ' ' becomes U+2581 (with one space prefixed at the
 *      start and after every special token), symbols merged by the score of the merged piece.
 *
 * Pre-tokenizers are hand-written scanners over codepoints (no regex library), in pretok.c. */
#include "data/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/pretok.h"
#include "data/unicode.h"
#include "util/hash.h"
#include "util/util.h"

/* token attributes (bit set, as llama.cpp keeps them) */
enum {
    A_UNKNOWN = 1 << 0,
    A_UNUSED = 1 << 1,
    A_NORMAL = 1 << 2,
    A_CONTROL = 1 << 3,
    A_USER = 1 << 4,
    A_BYTE = 1 << 5,
};
enum { KIND_BPE, KIND_SPM };

/* ---- the tokenizer ---- */
struct nl_tokenizer {
    int kind;
    const nl_pre_def *pre;
    int32_t n_vocab;
    char **text; /* raw token texts (NUL-terminated copies) */
    uint32_t *text_len;
    uint8_t *attr;
    float *score;
    char **piece; /* decoded bytes (nl_token_piece) */
    uint32_t *piece_len;
    /* text -> id: open addressing over ids, capacity a power of two */
    int32_t *hslot;
    uint32_t hmask;
    /* (left id, right id) -> merge rank and merged id */
    uint64_t *mkey;
    int32_t *mrank, *mres;
    uint64_t mmask;
    int32_t byte_tok[256]; /* BPE: id of each byte's mapped char; SPM: id of <0xXX> */
    int32_t *special;      /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int n_special;
    int32_t bos, eos, eot, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    char *chat_template;
};

/* ---- hashing (nl_fnv1a, util/hash.h) ---- */

static int32_t vocab_find(const nl_tokenizer *t, const char *s, size_t n) {
    if (!t->hslot) return -1;
    uint32_t i = (uint32_t)nl_fnv1a(s, n) & t->hmask;
    for (;;) {
        int32_t id = t->hslot[i];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(t->text[id], s, n) == 0) return id;
        i = (i + 1) & t->hmask;
    }
}

static uint64_t mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* rank of merging (l, r), or -1; *res = merged id */
static int32_t merge_find(const nl_tokenizer *t, int32_t l, int32_t r, int32_t *res) {
    if (!t->mkey || l < 0 || r < 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint64_t i = mix64(key) & t->mmask;
    for (;;) {
        if (t->mrank[i] < 0) return -1;
        if (t->mkey[i] == key) {
            *res = t->mres[i];
            return t->mrank[i];
        }
        i = (i + 1) & t->mmask;
    }
}

/* ---- GPT-2 byte-level mapping ---- */
/* bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves; the other 68, in increasing byte
 * order, to U+0100, U+0101, ... */
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    uint32_t n = 0; /* how many unmapped bytes come before b */
    if (b <= 0x20) n = b;
    else if (b <= 0xA0) n = 0x21 + (b - 0x7F);
    else n = 0x21 + 0x22; /* 0xAD: after 0x00-0x20 (33) and 0x7F-0xA0 (34) */
    return 0x100 + n;
}

/* inverse: codepoint -> byte, -1 if cp is not a mapped byte */
static int cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68) return -1;
    uint32_t n = cp - 0x100;
    if (n <= 0x20) return (int)n;
    if (n < 0x21 + 0x22) return (int)(0x7F + (n - 0x21));
    return 0xAD;
}

/* ---- small growable int32 vector ---- */
typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;
static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof(int32_t));
        if (!v) return nl_err("tokenizer: out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- scratch for one nl_tokenize call ---- */
typedef struct {
    double key;
    int32_t left, right, a, b;
} bigram;
typedef struct {
    uint32_t *cp, *fl;
    size_t *off; /* byte offset of each codepoint (+ end) */
    size_t *segs, *tmp;
    char *buf; /* mapped / escaped text */
    int32_t *sid, *sprev, *snext;
    uint32_t *sstart, *slen;
    bigram *heap;
    size_t nheap;
} scratch;

/* min-heap on (key, left) */
static int big_less(const bigram *x, const bigram *y) {
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}
static void heap_push(scratch *s, bigram g) {
    size_t i = s->nheap++;
    s->heap[i] = g;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!big_less(&s->heap[i], &s->heap[p])) break;
        bigram tmp = s->heap[i];
        s->heap[i] = s->heap[p];
        s->heap[p] = tmp;
        i = p;
    }
}
static bigram heap_pop(scratch *s) {
    bigram top = s->heap[0];
    s->heap[0] = s->heap[--s->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->nheap && big_less(&s->heap[l], &s->heap[m])) m = l;
        if (r < s->nheap && big_less(&s->heap[r], &s->heap[m])) m = r;
        if (m == i) break;
        bigram tmp = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = tmp;
        i = m;
    }
    return top;
}

/* BPE of one pre-token (raw bytes p[0..m)). Each byte is one initial symbol (its mapped char);
 * adjacent pairs merge lowest rank first, ties leftmost. */
static int bpe_piece(const nl_tokenizer *t, scratch *s, const uint8_t *p, size_t m, ivec *out) {
    if (m == 0) return 0;
    if (t->ignore_merges) { /* whole pre-token already a token: emit it (llama3) */
        size_t k = 0;
        for (size_t i = 0; i < m; i++) k += nl_utf8_put(byte_to_cp(p[i]), s->buf + k);
        int32_t id = vocab_find(t, s->buf, k);
        if (id >= 0) return ivec_push(out, id);
    }
    for (size_t i = 0; i < m; i++) {
        s->sid[i] = t->byte_tok[p[i]];
        s->sprev[i] = (int32_t)i - 1;
        s->snext[i] = i + 1 < m ? (int32_t)i + 1 : -1;
        s->sstart[i] = (uint32_t)i;
        s->slen[i] = 1;
    }
    s->nheap = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        int32_t res, r = merge_find(t, s->sid[i], s->sid[i + 1], &res);
        if (r >= 0) heap_push(s, (bigram){r, (int32_t)i, (int32_t)i + 1, s->sid[i], s->sid[i + 1]});
    }
    while (s->nheap) {
        bigram g = heap_pop(s);
        int32_t l = g.left, r = g.right;
        if (s->slen[l] == 0 || s->slen[r] == 0 || s->snext[l] != r || s->sid[l] != g.a || s->sid[r] != g.b)
            continue; /* stale */
        int32_t res;
        merge_find(t, g.a, g.b, &res);
        s->sid[l] = res;
        s->slen[l] += s->slen[r];
        s->slen[r] = 0;
        s->snext[l] = s->snext[r];
        if (s->snext[r] >= 0) s->sprev[s->snext[r]] = l;
        int32_t pl = s->sprev[l], nx = s->snext[l];
        if (pl >= 0) {
            int32_t rr, rk = merge_find(t, s->sid[pl], s->sid[l], &rr);
            if (rk >= 0) heap_push(s, (bigram){rk, pl, l, s->sid[pl], s->sid[l]});
        }
        if (nx >= 0) {
            int32_t rr, rk = merge_find(t, s->sid[l], s->sid[nx], &rr);
            if (rk >= 0) heap_push(s, (bigram){rk, l, nx, s->sid[l], s->sid[nx]});
        }
    }
    for (int32_t i = 0; i >= 0; i = s->snext[i]) {
        if (s->sid[i] >= 0) {
            if (ivec_push(out, s->sid[i])) return -1;
        } else { /* not a token: byte by byte, skipping bytes the vocab lacks */
            for (uint32_t k = 0; k < s->slen[i]; k++) {
                int32_t id = t->byte_tok[p[s->sstart[i] + k]];
                if (id >= 0 && ivec_push(out, id)) return -1;
            }
        }
    }
    return 0;
}

static int bpe_fragment(const nl_tokenizer *t, scratch *s, const uint8_t *text, size_t len, ivec *out) {
    size_t ncp = 0, pos = 0;
    while (pos < len) {
        uint32_t c;
        s->off[ncp] = pos;
        if (nl_utf8_next(text, len, &pos, &c) != 0) return nl_err("tokenizer: invalid UTF-8"); /* validated before */
        s->cp[ncp] = c;
        s->fl[ncp] = nl_unicode_flags(c);
        ncp++;
    }
    s->off[ncp] = len;
    size_t nseg = nl_pre_split(t->pre, s->cp, s->fl, ncp, s->segs, s->tmp);
    size_t c0 = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t c1 = c0 + s->segs[i];
        if (bpe_piece(t, s, text + s->off[c0], s->off[c1] - s->off[c0], out)) return -1;
        c0 = c1;
    }
    return 0;
}

/* SPM: symbols are the UTF-8 characters of the escaped text; a pair merges when the
 * concatenation is a token, highest score first, ties leftmost. */
static void spm_try_pair(const nl_tokenizer *t, scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = s->slen[l] + s->slen[r];
    int32_t id = vocab_find(t, s->buf + s->sstart[l], size);
    if (id < 0) return;
    heap_push(s, (bigram){-(double)t->score[id], l, r, (int32_t)size, 0});
}

static int spm_emit_byte(const nl_tokenizer *t, uint8_t b, ivec *out) {
    int32_t id = t->byte_tok[b];
    if (id < 0) {
        char c = (char)b;
        id = vocab_find(t, &c, 1);
    }
    if (id < 0) id = t->unk;
    return id >= 0 ? ivec_push(out, id) : 0;
}

static int spm_fragment(const nl_tokenizer *t, scratch *s, const uint8_t *text, size_t len, bool prefix, ivec *out) {
    size_t k = 0;
    if (prefix) {
        memcpy(s->buf, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + k, "\xE2\x96\x81", 3);
            k += 3;
        } else s->buf[k++] = (char)text[i];
    }
    size_t nsym = 0, pos = 0;
    while (pos < k) {
        uint32_t c;
        size_t p0 = pos;
        if (nl_utf8_next((const uint8_t *)s->buf, k, &pos, &c) != 0) return nl_err("tokenizer: invalid UTF-8");
        s->sstart[nsym] = (uint32_t)p0;
        s->slen[nsym] = (uint32_t)(pos - p0);
        s->sprev[nsym] = (int32_t)nsym - 1;
        s->snext[nsym] = pos < k ? (int32_t)nsym + 1 : -1;
        nsym++;
    }
    if (nsym == 0) return 0;
    s->nheap = 0;
    for (size_t i = 1; i < nsym; i++) spm_try_pair(t, s, (int32_t)i - 1, (int32_t)i);
    while (s->nheap) {
        bigram g = heap_pop(s);
        int32_t l = g.left, r = g.right;
        if (s->slen[l] == 0 || s->slen[r] == 0 || s->slen[l] + s->slen[r] != (uint32_t)g.a) continue;
        s->slen[l] += s->slen[r];
        s->slen[r] = 0;
        s->snext[l] = s->snext[r];
        if (s->snext[r] >= 0) s->sprev[s->snext[r]] = l;
        spm_try_pair(t, s, s->sprev[l], l);
        spm_try_pair(t, s, l, s->snext[l]);
    }
    for (int32_t i = 0; i >= 0; i = s->snext[i]) {
        int32_t id = vocab_find(t, s->buf + s->sstart[i], s->slen[i]);
        if (id >= 0) {
            if (ivec_push(out, id)) return -1;
        } else {
            for (uint32_t j = 0; j < s->slen[i]; j++)
                if (spm_emit_byte(t, (uint8_t)s->buf[s->sstart[i] + j], out)) return -1;
        }
    }
    return 0;
}

/* ---- special-token partition ---- */
typedef struct {
    size_t off, len;
    int32_t id;
} frag; /* id < 0: raw text */
typedef struct {
    frag *v;
    size_t n, cap;
} fvec;
static int fvec_push(fvec *a, frag f) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        frag *v = realloc(a->v, cap * sizeof(frag));
        if (!v) return nl_err("tokenizer: out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = f;
    return 0;
}

/* Every special token, longest first, is cut out of every raw fragment at every occurrence
 * (llama.cpp tokenizer_st_partition). A 64 Ki-bit table of the byte pairs in the text skips
 * tokens that cannot occur, so thousands of added tokens cost little. */
static int partition(const nl_tokenizer *t, const char *text, size_t len, bool parse_special, fvec *out) {
    out->n = 0;
    if (len == 0) return 0;
    if (fvec_push(out, (frag){0, len, -1})) return -1;
    if (t->n_special == 0) return 0;
    uint64_t *pairs = calloc(65536 / 64, sizeof(uint64_t));
    if (!pairs) return nl_err("tokenizer: out of memory");
    uint8_t seen1[256] = {0};
    for (size_t i = 0; i < len; i++) {
        seen1[(uint8_t)text[i]] = 1;
        if (i + 1 < len) {
            unsigned pr = ((unsigned)(uint8_t)text[i] << 8) | (uint8_t)text[i + 1];
            pairs[pr >> 6] |= 1ULL << (pr & 63);
        }
    }
    fvec next = {0};
    int rc = 0;
    for (int si = 0; si < t->n_special && rc == 0; si++) {
        int32_t id = t->special[si];
        if (!parse_special && (t->attr[id] & (A_CONTROL | A_UNKNOWN))) continue;
        const char *tx = t->text[id];
        size_t tl = t->text_len[id];
        if (tl == 0 || tl > len || !seen1[(uint8_t)tx[0]]) continue;
        int possible = 1;
        for (size_t k = 0; k + 1 < tl && possible; k++) {
            unsigned pr = ((unsigned)(uint8_t)tx[k] << 8) | (uint8_t)tx[k + 1];
            if (!(pairs[pr >> 6] & (1ULL << (pr & 63)))) possible = 0;
        }
        if (!possible) continue;
        next.n = 0;
        int found = 0;
        for (size_t fi = 0; fi < out->n && rc == 0; fi++) {
            frag f = out->v[fi];
            if (f.id >= 0 || f.len < tl) {
                rc = fvec_push(&next, f);
                continue;
            }
            size_t start = f.off, end = f.off + f.len;
            while (rc == 0) {
                const char *hit = end - start >= tl ? memmem(text + start, end - start, tx, tl) : NULL;
                if (!hit) {
                    if (end > start) rc = fvec_push(&next, (frag){start, end - start, -1});
                    break;
                }
                size_t h = (size_t)(hit - text);
                found = 1;
                if (h > start) rc = fvec_push(&next, (frag){start, h - start, -1});
                if (rc == 0) rc = fvec_push(&next, (frag){h, tl, id});
                start = h + tl;
            }
        }
        if (rc == 0 && found) {
            fvec tmp = *out;
            *out = next;
            next = tmp;
        }
    }
    free(next.v);
    free(pairs);
    return rc;
}

int nl_tokenize(const nl_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                int32_t **ids, int *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!t) return nl_err("nl_tokenize: no tokenizer");
    if (!text && len) return nl_err("nl_tokenize: NULL text");
    size_t bad = nl_utf8_validate((const uint8_t *)text, len);
    if (bad < len)
        return nl_err("tokenize: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad, (unsigned)(uint8_t)text[bad]);
    if (len > (size_t)INT32_MAX / 4) return nl_err("tokenize: text of %zu bytes is too long", len);

    ivec out = {0};
    fvec frags = {0};
    scratch s = {0};
    int rc = 0;
    size_t n = len + 2;
    /* buf: mapped text needs up to 2 bytes per byte; SPM escaping up to 3 per byte (+3 prefix) */
    s.cp = malloc(n * sizeof(uint32_t));
    s.fl = malloc(n * sizeof(uint32_t));
    s.off = malloc((n + 1) * sizeof(size_t));
    s.segs = malloc(n * sizeof(size_t));
    s.tmp = malloc(n * sizeof(size_t));
    s.buf = malloc(3 * n + 4);
    s.sid = malloc(3 * n * sizeof(int32_t));
    s.sprev = malloc(3 * n * sizeof(int32_t));
    s.snext = malloc(3 * n * sizeof(int32_t));
    s.sstart = malloc(3 * n * sizeof(uint32_t));
    s.slen = malloc(3 * n * sizeof(uint32_t));
    s.heap = malloc(6 * n * sizeof(bigram)); /* initial pairs + 2 per merge */
    if (!s.cp || !s.fl || !s.off || !s.segs || !s.tmp || !s.buf || !s.sid || !s.sprev || !s.snext || !s.sstart ||
        !s.slen || !s.heap) {
        rc = nl_err("tokenize: out of memory for %zu bytes of text", len);
        goto done;
    }
    if (add_special && t->add_bos && t->bos >= 0 && (rc = ivec_push(&out, t->bos))) goto done;
    if ((rc = partition(t, text, len, parse_special, &frags))) goto done;
    bool prev_special = true; /* SPM: prefix a space at the start and after special tokens */
    for (size_t i = 0; i < frags.n && rc == 0; i++) {
        frag f = frags.v[i];
        if (f.id >= 0) {
            rc = ivec_push(&out, f.id);
            prev_special = true;
        } else if (t->kind == KIND_BPE) {
            rc = bpe_fragment(t, &s, (const uint8_t *)text + f.off, f.len, &out);
        } else {
            rc = spm_fragment(t, &s, (const uint8_t *)text + f.off, f.len, t->add_space_prefix && prev_special, &out);
            prev_special = false;
        }
    }
    if (rc == 0 && add_special && t->add_eos && t->eos >= 0) rc = ivec_push(&out, t->eos);
done:
    free(s.cp);
    free(s.fl);
    free(s.off);
    free(s.segs);
    free(s.tmp);
    free(s.buf);
    free(s.sid);
    free(s.sprev);
    free(s.snext);
    free(s.sstart);
    free(s.slen);
    free(s.heap);
    free(frags.v);
    if (rc) {
        free(out.v);
        return -1;
    }
    if (out.n > (size_t)INT32_MAX) {
        free(out.v);
        return nl_err("tokenize: too many tokens");
    }
    if (!out.v) {
        out.v = malloc(sizeof(int32_t));
        if (!out.v) return nl_err("tokenize: out of memory");
    }
    *ids = out.v;
    *n_ids = (int)out.n;
    return 0;
}

int nl_pretokenize(const char *pre, const char *text, size_t len, size_t **piece_lens, int *n_pieces) {
    *piece_lens = NULL;
    *n_pieces = 0;
    const nl_pre_def *pd = nl_pre_find(pre);
    if (!pd) return nl_err("pretokenize: unknown pre-tokenizer '%s'", pre ? pre : "");
    size_t bad = nl_utf8_validate((const uint8_t *)text, len);
    if (bad < len) return nl_err("pretokenize: invalid UTF-8 at byte offset %zu", bad);
    size_t n = len + 1;
    uint32_t *cp = malloc(n * sizeof(uint32_t)), *fl = malloc(n * sizeof(uint32_t));
    size_t *off = malloc((n + 1) * sizeof(size_t)), *segs = malloc(n * sizeof(size_t));
    size_t *tmp = malloc(n * sizeof(size_t));
    int rc = 0;
    if (!cp || !fl || !off || !segs || !tmp) {
        rc = nl_err("pretokenize: out of memory");
        goto done;
    }
    size_t ncp = 0, pos = 0;
    while (pos < len) {
        uint32_t c;
        off[ncp] = pos;
        nl_utf8_next((const uint8_t *)text, len, &pos, &c);
        cp[ncp] = c;
        fl[ncp] = nl_unicode_flags(c);
        ncp++;
    }
    off[ncp] = len;
    size_t nseg = nl_pre_split(pd, cp, fl, ncp, segs, tmp);
    size_t c0 = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t c1 = c0 + segs[i];
        segs[i] = off[c1] - off[c0];
        c0 = c1;
    }
    *piece_lens = segs;
    segs = NULL;
    *n_pieces = (int)nseg;
done:
    free(cp);
    free(fl);
    free(off);
    free(segs);
    free(tmp);
    return rc;
}

/* ---- construction ---- */
static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* decoded bytes of token id */
static int make_piece(nl_tokenizer *t, int32_t id) {
    const char *tx = t->text[id];
    size_t n = t->text_len[id];
    uint8_t a = t->attr[id];
    char *p = malloc(n + 1);
    if (!p) return nl_err("tokenizer: out of memory");
    size_t k = 0;
    if (a & (A_CONTROL | A_USER | A_UNKNOWN)) {
        memcpy(p, tx, n);
        k = n;
    } else if (a & A_BYTE) {
        unsigned v;
        char hex[3] = {0};
        if (n == 6 && !memcmp(tx, "<0x", 3) && tx[5] == '>') {
            hex[0] = tx[3];
            hex[1] = tx[4];
            char *end;
            v = (unsigned)strtoul(hex, &end, 16);
            if (*end == 0) p[k++] = (char)v;
        }
    } else if (a & A_NORMAL) {
        if (t->kind == KIND_SPM) { /* U+2581 -> ' ' */
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && !memcmp(tx + i, "\xE2\x96\x81", 3)) {
                    p[k++] = ' ';
                    i += 3;
                } else p[k++] = tx[i++];
            }
        } else { /* undo the byte-level mapping; codepoints outside it are kept as they are */
            size_t pos = 0;
            while (pos < n) {
                size_t p0 = pos;
                uint32_t c;
                if (nl_utf8_next((const uint8_t *)tx, n, &pos, &c) != 0) {
                    p[k++] = tx[pos++];
                    continue;
                }
                int b = cp_to_byte(c);
                if (b >= 0) p[k++] = (char)b;
                else {
                    memcpy(p + k, tx + p0, pos - p0);
                    k += pos - p0;
                }
            }
        }
    } /* UNUSED / UNDEFINED tokens decode to nothing, as in llama.cpp */
    p[k] = 0;
    t->piece[id] = p;
    t->piece_len[id] = (uint32_t)k;
    return 0;
}

typedef struct {
    uint32_t len;
    int32_t id;
} len_id;
static int special_cmp(const void *x, const void *y) { /* longest first, then lower id */
    const len_id *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The tokenizer from the GGUF's fields. Long (~165 lines) because it is one validation pass:
 * every table (tokens, types, scores, merges, the special tokens) is checked against the others
 * as it is built, with one cleanup for the partly built tokenizer. */
nl_tokenizer *nl_tokenizer_from_spec(const nl_tokenizer_spec *sp) {
    if (!sp || !sp->model) {
        nl_err("tokenizer.ggml.model: missing");
        return NULL;
    }
    int kind;
    if (!strcmp(sp->model, "gpt2")) kind = KIND_BPE;
    else if (!strcmp(sp->model, "llama")) kind = KIND_SPM;
    else {
        nl_err("tokenizer.ggml.model: unsupported tokenizer '%s' (expected \"gpt2\" or \"llama\")", sp->model);
        return NULL;
    }
    const nl_pre_def *pre = NULL;
    if (kind == KIND_BPE) {
        pre = nl_pre_find(sp->pre);
        if (!pre) {
            nl_err("tokenizer.ggml.pre: unsupported pre-tokenizer '%s'", sp->pre);
            return NULL;
        }
    }
    if (sp->n_vocab <= 0 || !sp->tokens) {
        nl_err("tokenizer.ggml.tokens: empty vocabulary");
        return NULL;
    }
    if (kind == KIND_BPE && sp->n_merges > 0 && !sp->merges) {
        nl_err("tokenizer.ggml.merges: missing");
        return NULL;
    }

    nl_tokenizer *t = nl_calloc(1, sizeof(*t));
    if (!t) return NULL;
    int32_t n = sp->n_vocab;
    t->kind = kind;
    t->pre = pre;
    t->n_vocab = n;
    t->text = calloc((size_t)n, sizeof(char *));
    t->text_len = calloc((size_t)n, sizeof(uint32_t));
    t->attr = calloc((size_t)n, 1);
    t->score = calloc((size_t)n, sizeof(float));
    t->piece = calloc((size_t)n, sizeof(char *));
    t->piece_len = calloc((size_t)n, sizeof(uint32_t));
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    t->hslot = malloc((size_t)cap * sizeof(int32_t));
    t->hmask = cap - 1;
    if (!t->text || !t->text_len || !t->attr || !t->score || !t->piece || !t->piece_len || !t->hslot) {
        nl_err("tokenizer: out of memory for %d tokens", n);
        goto fail;
    }
    memset(t->hslot, 0xFF, (size_t)cap * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        const char *s = sp->tokens[i] ? sp->tokens[i] : "";
        size_t len = sp->token_lens ? sp->token_lens[i] : strlen(s);
        if (len > UINT32_MAX / 4) {
            nl_err("tokenizer.ggml.tokens: token %d is too long", i);
            goto fail;
        }
        t->text[i] = dup_bytes(s, len);
        if (!t->text[i]) {
            nl_err("tokenizer: out of memory");
            goto fail;
        }
        t->text_len[i] = (uint32_t)len;
        t->score[i] = sp->scores ? sp->scores[i] : 0.0f;
        int ty = sp->types ? sp->types[i] : 1;
        t->attr[i] = ty == 1   ? A_NORMAL
                     : ty == 2 ? A_UNKNOWN
                     : ty == 3 ? A_CONTROL
                     : ty == 4 ? A_USER
                     : ty == 5 ? A_UNUSED
                     : ty == 6 ? A_BYTE
                               : 0;
        if (len == 0) continue; /* an empty token can never be matched */
        uint32_t h = (uint32_t)nl_fnv1a(s, len) & t->hmask;
        while (t->hslot[h] >= 0) {
            int32_t o = t->hslot[h];
            if (t->text_len[o] == len && !memcmp(t->text[o], s, len)) {
                nl_err("tokenizer.ggml.tokens: duplicate token text at ids %d and %d", o, i);
                goto fail;
            }
            h = (h + 1) & t->hmask;
        }
        t->hslot[h] = i;
    }

    /* end-of-turn style tokens are control tokens whatever the file says (llama.cpp does the same) */
    static const char *const eog_texts[] = {
        "<|im_end|>",
        "<|eot_id|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "<|eom_id|>",
        "<\xEF\xBD\x9C"
        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    };
    for (size_t k = 0; k < sizeof(eog_texts) / sizeof(eog_texts[0]); k++) {
        int32_t id = vocab_find(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0) t->attr[id] |= A_CONTROL;
    }

    /* merges: "left right" split at the first space after index 0; rank = index */
    if (kind == KIND_BPE && sp->n_merges > 0) {
        uint64_t mcap = 1;
        while (mcap < 2ull * (uint64_t)sp->n_merges) mcap <<= 1;
        t->mkey = malloc(mcap * sizeof(uint64_t));
        t->mrank = malloc(mcap * sizeof(int32_t));
        t->mres = malloc(mcap * sizeof(int32_t));
        t->mmask = mcap - 1;
        if (!t->mkey || !t->mrank || !t->mres) {
            nl_err("tokenizer: out of memory for merges");
            goto fail;
        }
        memset(t->mrank, 0xFF, mcap * sizeof(int32_t));
        char *cat = NULL;
        size_t catcap = 0;
        for (int32_t i = 0; i < sp->n_merges; i++) {
            const char *m = sp->merges[i] ? sp->merges[i] : "";
            size_t ml = strlen(m);
            const char *sp1 = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
            if (!sp1) continue;
            size_t la = (size_t)(sp1 - m), lb = ml - la - 1;
            int32_t l = vocab_find(t, m, la), r = vocab_find(t, sp1 + 1, lb);
            if (l < 0 || r < 0) continue; /* parts not in the vocab: the merge can never apply */
            if (la + lb > catcap) {
                catcap = 2 * (la + lb);
                char *c2 = realloc(cat, catcap);
                if (!c2) {
                    free(cat);
                    nl_err("tokenizer: out of memory");
                    goto fail;
                }
                cat = c2;
            }
            memcpy(cat, m, la);
            memcpy(cat + la, sp1 + 1, lb);
            int32_t res = vocab_find(t, cat, la + lb);
            if (res < 0) continue; /* result not a token: skip (HF refuses such vocabularies) */
            uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
            uint64_t h = mix64(key) & t->mmask;
            while (t->mrank[h] >= 0 && t->mkey[h] != key) h = (h + 1) & t->mmask;
            if (t->mrank[h] >= 0) continue; /* duplicate pair: the first (lowest) rank wins */
            t->mkey[h] = key;
            t->mrank[h] = i;
            t->mres[h] = res;
        }
        free(cat);
    }

    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (kind == KIND_BPE) {
            int k = nl_utf8_put(byte_to_cp((uint8_t)b), buf);
            t->byte_tok[b] = vocab_find(t, buf, (size_t)k);
        } else {
            static const char hx[] = "0123456789ABCDEF";
            char tb[6] = {'<', '0', 'x', hx[b >> 4], hx[b & 15], '>'};
            t->byte_tok[b] = vocab_find(t, tb, 6);
        }
    }

    /* special ids: defaults by model type, then the file's keys when in range */
    int32_t dbos = kind == KIND_SPM ? 1 : 11, deos = kind == KIND_SPM ? 2 : 11, dunk = kind == KIND_SPM ? 0 : -1;
    int32_t *ids[4] = {&t->bos, &t->eos, &t->eot, &t->unk};
    int32_t given[4] = {sp->bos, sp->eos, sp->eot, sp->unk};
    int32_t defs[4] = {dbos, deos, -1, dunk};
    for (int k = 0; k < 4; k++) {
        int32_t v = defs[k] < n ? defs[k] : -1;
        if (given[k] != NL_TOK_ID_DEFAULT && given[k] >= -1 && given[k] < n) v = given[k];
        *ids[k] = v;
    }
    if (t->eot < 0) {
        static const char *const eot_texts[] = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"};
        for (size_t k = 0; k < 4 && t->eot < 0; k++) t->eot = vocab_find(t, eot_texts[k], strlen(eot_texts[k]));
        if (t->eot < 0) t->eot = t->eos;
    }
    t->ignore_merges = kind == KIND_BPE && pre->llama3;
    t->add_bos = sp->add_bos >= 0 ? sp->add_bos != 0 : (kind == KIND_SPM || (pre && pre->llama3));
    t->add_eos = sp->add_eos >= 0 ? sp->add_eos != 0 : false;
    t->add_space_prefix = kind == KIND_SPM && (sp->add_space_prefix >= 0 ? sp->add_space_prefix != 0 : true);
    if (t->add_bos && t->bos < 0) {
        nl_err("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
        goto fail;
    }
    if (t->add_eos && t->eos < 0) {
        nl_err("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
        goto fail;
    }
    if (sp->chat_template && !(t->chat_template = nl_strdup(sp->chat_template))) goto fail;

    int ns = 0;
    for (int32_t i = 0; i < n; i++)
        if ((t->attr[i] & (A_CONTROL | A_USER | A_UNKNOWN)) && t->text_len[i] > 0) ns++;
    t->special = malloc((size_t)(ns ? ns : 1) * sizeof(int32_t));
    len_id *order = malloc((size_t)(ns ? ns : 1) * sizeof(len_id));
    if (!t->special || !order) {
        free(order);
        nl_err("tokenizer: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < n; i++)
        if ((t->attr[i] & (A_CONTROL | A_USER | A_UNKNOWN)) && t->text_len[i] > 0)
            order[t->n_special++] = (len_id){t->text_len[i], i};
    qsort(order, (size_t)t->n_special, sizeof(len_id), special_cmp);
    for (int i = 0; i < t->n_special; i++) t->special[i] = order[i].id;
    free(order);

    for (int32_t i = 0; i < n; i++)
        if (make_piece(t, i)) goto fail;
    return t;
fail:
    nl_tokenizer_free(t);
    return NULL;
}

void nl_tokenizer_free(nl_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->text) free(t->text[i]);
        if (t->piece) free(t->piece[i]);
    }
    free(t->text);
    free(t->text_len);
    free(t->attr);
    free(t->score);
    free(t->piece);
    free(t->piece_len);
    free(t->hslot);
    free(t->mkey);
    free(t->mrank);
    free(t->mres);
    free(t->special);
    free(t->chat_template);
    free(t);
}

int nl_tokenizer_for_model(const nl_model *m, nl_tokenizer **out) {
    const nl_gguf *g = m->gguf;
    *out = NULL;
    if (!nl_gguf_get(g, "tokenizer.ggml.model")) return 0;
    nl_tokenizer *t = nl_tokenizer_from_gguf(g);
    if (!t) {
        /* most of the tokenizer's messages name the file already */
        if (strncmp(nl_last_error(), g->path, strlen(g->path))) nl_err_prefix("%s", g->path);
        return -1;
    }
    if (nl_tokenizer_n_vocab(t) > m->hp.n_vocab) {
        nl_err("%s: tokenizer has %d tokens but the model's vocabulary is %d", g->path, nl_tokenizer_n_vocab(t),
               m->hp.n_vocab);
        nl_tokenizer_free(t);
        return -1;
    }
    if (nl_chat_template_probe(t)) {
        nl_err_prefix("%s", g->path);
        nl_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* ---- GGUF ---- */
static const nl_gguf_kv *arr_kv(const nl_gguf *g, const char *key, int elem_type, int *rc) {
    const nl_gguf_kv *kv = nl_gguf_get(g, key);
    *rc = 0;
    if (!kv) return NULL;
    if (kv->type != NL_GGUF_ARRAY || kv->arr_type != elem_type) {
        *rc =
            nl_err("%s: %s: expected an array of %s, found %s%s%s", g->path ? g->path : "gguf", key,
                   nl_gguf_vtype_name(elem_type), nl_gguf_vtype_name(kv->type), kv->type == NL_GGUF_ARRAY ? " of " : "",
                   kv->type == NL_GGUF_ARRAY ? nl_gguf_vtype_name(kv->arr_type) : "");
        return NULL;
    }
    return kv;
}

/* A special token id: absent = the model type's default; present, it must name a token
 * (an id out of range fell back to the default silently, and the default was then trained
 * as the end token). */
static int get_id(const nl_gguf *g, const char *key, int32_t n_vocab, int32_t *out) {
    int64_t v;
    int r = nl_gguf_get_i64(g, key, &v);
    if (r < 0) return -1;
    if (r == 1) {
        *out = NL_TOK_ID_DEFAULT;
        return 0;
    }
    if (v < 0 || v >= n_vocab)
        return nl_err("%s: key '%s' = %lld: expected a token id in [0, %d)", g->path, key, (long long)v, (int)n_vocab);
    *out = (int32_t)v;
    return 0;
}

static int get_flag(const nl_gguf *g, const char *key, int *out) {
    bool b;
    int r = nl_gguf_get_bool(g, key, &b);
    if (r < 0) return -1;
    *out = r == 0 ? (int)b : -1;
    return 0;
}

/* Long (~140 lines): every tokenizer.ggml.* key read and checked in one place, in the order the
 * vocabulary needs them (model kind, tokens, scores, types, merges, special ids, pre-tokenizer). */
nl_tokenizer *nl_tokenizer_from_gguf(const nl_gguf *g) {
    const char *path = g && g->path ? g->path : "gguf";
    if (!g) {
        nl_err("nl_tokenizer_from_gguf: no file");
        return NULL;
    }
    nl_tokenizer_spec sp = {0};
    int rc;
    if (nl_gguf_get_str(g, "tokenizer.ggml.model", &sp.model) != 0) {
        nl_err_prefix("%s: tokenizer.ggml.model: missing or not a string", path);
        return NULL;
    }
    if (nl_gguf_get_str(g, "tokenizer.ggml.pre", &sp.pre) < 0) return NULL;
    const nl_gguf_kv *tok = arr_kv(g, "tokenizer.ggml.tokens", NL_GGUF_STRING, &rc);
    if (rc) return NULL;
    if (!tok) {
        nl_err("%s: tokenizer.ggml.tokens: missing", path);
        return NULL;
    }
    if (tok->arr_n == 0 || tok->arr_n > INT32_MAX / 2) {
        nl_err("%s: tokenizer.ggml.tokens: bad token count %llu", path, (unsigned long long)tok->arr_n);
        return NULL;
    }
    int32_t n = (int32_t)tok->arr_n;
    sp.n_vocab = n;
    sp.tokens = (const char *const *)tok->arr_str;
    size_t *lens = malloc((size_t)n * sizeof(size_t));
    int32_t *types = NULL;
    float *scores = NULL;
    nl_tokenizer *t = NULL;
    if (!lens) {
        nl_err("tokenizer: out of memory");
        return NULL;
    }
    uint64_t at = tok->offset; /* file offset of token i's length, then its text */
    for (int32_t i = 0; i < n; i++) {
        lens[i] = (size_t)tok->arr_str_len[i];
        const char *nul = memchr(tok->arr_str[i], 0, lens[i]);
        if (nul) {
            nl_err("%s: offset %llu: tokenizer.ggml.tokens[%d] holds a NUL byte (at %zu of its %zu): a token's text "
                   "has none",
                   path, (unsigned long long)(at + 8 + (uint64_t)(nul - tok->arr_str[i])), (int)i,
                   (size_t)(nul - tok->arr_str[i]), lens[i]);
            free(lens);
            return NULL;
        }
        at += 8 + (uint64_t)lens[i];
        /* token texts are UTF-8 (byte-level BPE maps bytes to codepoints, SentencePiece spells
         * raw bytes <0xNN>): anything else is a damaged vocabulary */
        size_t bad = nl_utf8_validate((const uint8_t *)tok->arr_str[i], lens[i]);
        if (bad < lens[i]) {
            nl_err("%s: tokenizer.ggml.tokens[%d] is not valid UTF-8 (byte 0x%02X at %zu)", path, (int)i,
                   (unsigned)(uint8_t)tok->arr_str[i][bad], bad);
            free(lens);
            return NULL;
        }
    }
    sp.token_lens = lens;

    const nl_gguf_kv *tt = arr_kv(g, "tokenizer.ggml.token_type", NL_GGUF_INT32, &rc);
    if (rc) goto done;
    if (tt) {
        if (tt->arr_n < (uint64_t)n) {
            nl_err("%s: tokenizer.ggml.token_type: %llu entries for %d tokens", path, (unsigned long long)tt->arr_n, n);
            goto done;
        }
        types = malloc((size_t)n * sizeof(int32_t));
        if (!types) {
            nl_err("tokenizer: out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            int64_t v;
            if (nl_gguf_arr_i64(tt, (uint64_t)i, &v)) goto done;
            /* llama.cpp's types: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined,
             * 5 unused, 6 byte */
            if (v < 0 || v > 6) {
                nl_err("%s: offset %llu: tokenizer.ggml.token_type[%d] = %lld: expected a token type in 0..6 (normal "
                       "1, unknown 2, "
                       "control 3, user-defined 4, unused 5, byte 6)",
                       path, (unsigned long long)(tt->offset + 4ull * (uint64_t)i), (int)i, (long long)v);
                goto done;
            }
            types[i] = (int32_t)v;
        }
        sp.types = types;
    }
    const nl_gguf_kv *sc = nl_gguf_get(g, "tokenizer.ggml.scores");
    if (sc) {
        if (sc->type != NL_GGUF_ARRAY || (sc->arr_type != NL_GGUF_FLOAT32 && sc->arr_type != NL_GGUF_INT32)) {
            nl_err("%s: tokenizer.ggml.scores: expected an array of FLOAT32, found %s", path,
                   nl_gguf_vtype_name(sc->type));
            goto done;
        }
        if (sc->arr_n < (uint64_t)n) {
            nl_err("%s: tokenizer.ggml.scores: %llu entries for %d tokens", path, (unsigned long long)sc->arr_n, n);
            goto done;
        }
        scores = malloc((size_t)n * sizeof(float));
        if (!scores) {
            nl_err("tokenizer: out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n; i++) {
            double v;
            if (nl_gguf_arr_f64(sc, (uint64_t)i, &v)) goto done;
            scores[i] = (float)v;
        }
        sp.scores = scores;
    }
    const nl_gguf_kv *mg = arr_kv(g, "tokenizer.ggml.merges", NL_GGUF_STRING, &rc);
    if (rc) goto done;
    if (mg) {
        if (mg->arr_n > INT32_MAX) {
            nl_err("%s: tokenizer.ggml.merges: too many merges", path);
            goto done;
        }
        sp.merges = (const char *const *)mg->arr_str;
        sp.n_merges = (int32_t)mg->arr_n;
    } else if (!strcmp(sp.model, "gpt2")) {
        nl_err("%s: tokenizer.ggml.merges: missing (required by a gpt2 tokenizer)", path);
        goto done;
    }
    if (get_id(g, "tokenizer.ggml.bos_token_id", n, &sp.bos) || get_id(g, "tokenizer.ggml.eos_token_id", n, &sp.eos) ||
        get_id(g, "tokenizer.ggml.eot_token_id", n, &sp.eot) ||
        get_id(g, "tokenizer.ggml.unknown_token_id", n, &sp.unk) ||
        get_flag(g, "tokenizer.ggml.add_bos_token", &sp.add_bos) ||
        get_flag(g, "tokenizer.ggml.add_eos_token", &sp.add_eos) ||
        get_flag(g, "tokenizer.ggml.add_space_prefix", &sp.add_space_prefix))
        goto done;
    if (nl_gguf_get_str(g, "tokenizer.chat_template", &sp.chat_template) < 0) goto done;
    t = nl_tokenizer_from_spec(&sp);
    if (!t) nl_err_prefix("%s", path);
done:
    free(lens);
    free(types);
    free(scores);
    return t;
}

/* ---- queries ---- */
const char *nl_token_piece(const nl_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_len[id];
    return t->piece[id];
}

int32_t nl_token_lookup(const nl_tokenizer *t, const char *text) {
    return t && text ? vocab_find(t, text, strlen(text)) : -1;
}

int nl_detokenize(const nl_tokenizer *t, const int32_t *ids, int n_ids, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return nl_err("detokenize: token id %d out of range (vocab %d)", ids[i], t->n_vocab);
        total += t->piece_len[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) return nl_err("detokenize: out of memory");
    size_t k = 0;
    bool after_special = true;
    for (int i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        const char *p = t->piece[id];
        size_t pl = t->piece_len[id];
        bool special = (t->attr[id] & (A_CONTROL | A_USER | A_UNKNOWN)) != 0;
        if (!special && after_special && t->add_space_prefix && pl > 0 && p[0] == ' ') {
            p++;
            pl--;
        }
        memcpy(out + k, p, pl);
        k += pl;
        after_special = special;
    }
    out[k] = 0;
    *text = out;
    if (len) *len = k;
    return 0;
}

int nl_tokenizer_n_vocab(const nl_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t nl_token_bos(const nl_tokenizer *t) { return t ? t->bos : -1; }
int32_t nl_token_eos(const nl_tokenizer *t) { return t ? t->eos : -1; }
int32_t nl_token_eot(const nl_tokenizer *t) { return t ? t->eot : -1; }
bool nl_tokenizer_add_bos(const nl_tokenizer *t) { return t && t->add_bos; }
bool nl_token_is_control(const nl_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & A_CONTROL);
}
const char *nl_tokenizer_chat_template(const nl_tokenizer *t) { return t ? t->chat_template : NULL; }

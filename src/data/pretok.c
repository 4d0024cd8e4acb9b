/* data/pretok: the pre-tokenizer table and scanners (see pretok.h). */
#include "data/pretok.h"

#include <string.h>

#include "data/unicode.h"

static const nl_pre_def PRE_DEFS[] = {
    {"gpt-2", 1, {{ST_GPT2, 0, 0}}, 0},
    {"mpt", 1, {{ST_GPT2, 0, 0}}, 0},
    {"llama3", 1, {{ST_LLAMA3, 0, 0}}, 1},
    {"llama-v3", 1, {{ST_LLAMA3, 0, 0}}, 1},
    {"llama-bpe", 1, {{ST_LLAMA3, 0, 0}}, 1},
    {"qwen2", 1, {{ST_QWEN2, 0, 0}}, 0},
    {"deepseek-r1-qwen", 1, {{ST_QWEN2, 0, 0}}, 0},
    {"qwen35", 1, {{ST_QWEN35, 0, 0}}, 0},
    {"deepseek-llm",
     6,
     {{ST_ONE, C_CRLF, 0},
      {ST_RUN, C_DS_LETTER, 1},
      {ST_RUN, C_DS_PUNCT, 1},
      {ST_TRAIL_WS, 0, 0},
      {ST_RUN, C_CJK, 0},
      {ST_RUN, C_N, 0}},
     0},
    {"deepseek-coder",
     5,
     {{ST_ONE, C_CRLF, 0}, {ST_RUN, C_L, 1}, {ST_RUN, C_P, 1}, {ST_RUN, C_CJK, 0}, {ST_ONE, C_N, 0}},
     0},
    {"falcon", 3, {{ST_RUN, C_FALCON, 0}, {ST_GPT2, 0, 0}, {ST_DIGIT3, 0, 0}}, 0},
    {"starcoder", 2, {{ST_ONE, C_N, 0}, {ST_GPT2, 0, 0}}, 0},
    {"refact", 2, {{ST_ONE, C_N, 0}, {ST_GPT2, 0, 0}}, 0},
    /* SmolLM/SmolLM2: llama.cpp gives "smollm" the starcoder stages (\p{N}, then the GPT-2 regex);
     * its other flag (clean_spaces = false) only concerns decoding, which never cleans here */
    {"smollm", 2, {{ST_ONE, C_N, 0}, {ST_GPT2, 0, 0}}, 0},
    {"default", 4, {{ST_RUN, C_DEFAULT, 0}, {ST_GPT2, 0, 0}, {ST_RUN, C_N, 0}, {ST_DIGIT3, 0, 0}}, 0},
};

const nl_pre_def *nl_pre_find(const char *name) {
    if (!name || !*name) name = "default";
    for (size_t i = 0; i < sizeof(PRE_DEFS) / sizeof(PRE_DEFS[0]); i++)
        if (!strcmp(PRE_DEFS[i].name, name)) return &PRE_DEFS[i];
    return NULL;
}

/* ---- pre-tokenizer scanners ----
 * Input: codepoints cp[a..b) with flags fl[]; output: piece lengths (in codepoints) appended to
 * out[*n]. Positions outside [a, b) read as "no codepoint" (flags 0), as the regex engine sees
 * the end of a segment. */
#define OOR 0xFFFFFFFFu
#define CPAT(i) ((i) < b ? cp[i] : OOR)
#define FLAT(i) ((i) < b ? fl[i] : 0u)
#define EMIT(end)                                                                                                      \
    do {                                                                                                               \
        size_t e_ = (end);                                                                                             \
        if (e_ > prev) {                                                                                               \
            out[(*n)++] = e_ - prev;                                                                                   \
            prev = e_;                                                                                                 \
        }                                                                                                              \
    } while (0)

static void scan_gpt2(const uint32_t *cp, const uint32_t *fl, size_t a, size_t b, size_t *out, size_t *n) {
    size_t pos = a, prev = a;
    while (pos < b) {
        uint32_t c = cp[pos], f = fl[pos];
        if (c == '\'' && pos + 1 < b) { /* 's|'t|'re|'ve|'m|'ll|'d (case-sensitive) */
            uint32_t c1 = cp[pos + 1];
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                EMIT(pos);
                continue;
            }
            if (pos + 2 < b) {
                uint32_t c2 = cp[pos + 2];
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    EMIT(pos);
                    continue;
                }
            }
        }
        uint32_t f2 = c == ' ' ? FLAT(pos + 1) : f;
        if (f2 & NL_UF_L) { /* ' ?\p{L}+' */
            pos += c == ' ';
            while (FLAT(pos) & NL_UF_L) pos++;
            EMIT(pos);
            continue;
        }
        if (f2 & NL_UF_N) { /* ' ?\p{N}+' */
            pos += c == ' ';
            while (FLAT(pos) & NL_UF_N) pos++;
            EMIT(pos);
            continue;
        }
        if (!(f2 & (NL_UF_WS | NL_UF_L | NL_UF_N)) && f2) { /* ' ?[^\s\p{L}\p{N}]+' */
            pos += c == ' ';
            for (;;) {
                uint32_t g = FLAT(pos);
                if ((g & (NL_UF_WS | NL_UF_L | NL_UF_N)) || !g) break;
                pos++;
            }
            EMIT(pos);
            continue;
        }
        size_t nws = 0;
        while (FLAT(pos + nws) & NL_UF_WS) nws++;
        if (nws > 1 && pos + nws < b) {
            pos += nws - 1;
            EMIT(pos);
            continue;
        } /* \s+(?!\S) */
        if (nws > 0) {
            pos += nws;
            EMIT(pos);
            continue;
        } /* unmatched whitespace */
        pos++;
        EMIT(pos);
    }
}

/* llama3 (digits = 3, marks = 0), qwen2 (1, 0), qwen35 (1, 1) */
static void scan_llama3(const uint32_t *cp, const uint32_t *fl, size_t a, size_t b, size_t *out, size_t *n,
                        size_t digits, int marks) {
    const uint32_t word = NL_UF_L | (marks ? NL_UF_M : 0);
    const uint32_t not_punct = NL_UF_WS | NL_UF_L | NL_UF_N | (marks ? NL_UF_M : 0);
    size_t pos = a, prev = a;
    while (pos < b) {
        uint32_t c = cp[pos], f = fl[pos];
        if (c == '\'' && pos + 1 < b) { /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
            uint32_t c1 = nl_unicode_tolower(cp[pos + 1]);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                EMIT(pos);
                continue;
            }
            if (pos + 2 < b) {
                uint32_t c2 = nl_unicode_tolower(cp[pos + 2]);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    EMIT(pos);
                    continue;
                }
            }
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ (qwen35: [\p{L}\p{M}]+) */
        if (!(c == '\r' || c == '\n' || (f & NL_UF_N))) {
            if ((f & word) || (FLAT(pos + 1) & word)) {
                pos++;
                while (FLAT(pos) & word) pos++;
                EMIT(pos);
                continue;
            }
        }
        if (f & NL_UF_N) { /* \p{N}{1,digits} */
            size_t ini = pos;
            while (FLAT(pos) & NL_UF_N) {
                pos++;
                if (pos - ini >= digits) {
                    EMIT(pos);
                    ini = pos;
                }
            }
            EMIT(pos);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
        uint32_t f2 = c == ' ' ? FLAT(pos + 1) : f;
        if (!(f2 & not_punct) && f) {
            pos += c == ' ';
            while (!(f2 & not_punct) && f2) {
                pos++;
                f2 = FLAT(pos);
            }
            while (CPAT(pos) == '\r' || CPAT(pos) == '\n') pos++;
            EMIT(pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (FLAT(pos + nws) & NL_UF_WS) {
            uint32_t c2 = cp[pos + nws];
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) {
            pos = last_rn;
            EMIT(pos);
            continue;
        } /* \s*[\r\n]+ */
        if (nws > 1 && pos + nws < b) {
            pos += nws - 1;
            EMIT(pos);
            continue;
        } /* \s+(?!\S) */
        if (nws > 0) {
            pos += nws;
            EMIT(pos);
            continue;
        } /* \s+ */
        pos++;
        EMIT(pos);
    }
}

/* Class membership as llama.cpp's regex fallback sees it: classes written with \p{..} match the
 * codepoint's category; literal ranges match codepoints, except that non-ASCII whitespace was
 * replaced by U+000B before matching (so it only ever matches \s). */
static int cls_has(int cls, uint32_t c, uint32_t f) {
    switch (cls) {
    case C_CRLF: return c == '\r' || c == '\n';
    case C_L: return (f & NL_UF_L) != 0;
    case C_N: return (f & NL_UF_N) != 0;
    case C_P: return (f & NL_UF_P) != 0;
    case C_FALCON: return (f & NL_UF_P) || (c && c < 0x80 && strchr("$+<=>^~|`", (int)c));
    case C_DEFAULT: return (f & NL_UF_P) || (c && c < 0x80 && strchr("$+<=>^~|", (int)c));
    }
    if (c >= 0x80 && (f & NL_UF_WS)) return 0;
    switch (cls) {
    case C_DS_LETTER: return nl_unicode_in_spans(nl_ucd_ds_letter, nl_ucd_ds_letter_n, c);
    case C_DS_PUNCT: return nl_unicode_in_spans(nl_ucd_ds_punct, nl_ucd_ds_punct_n, c);
    case C_CJK: return nl_unicode_in_spans(nl_ucd_ds_cjk, nl_ucd_ds_cjk_n, c);
    }
    return 0;
}

/* Length of a match of the stage's pattern starting exactly at pos (0: none). The patterns are
 * simple enough that the leftmost-first match at a given start is found without backtracking:
 * in \s?CLASS+ no class contains whitespace, so the optional \s is taken iff a class codepoint
 * follows it. */
static size_t match_at(const pre_stage *st, const uint32_t *cp, const uint32_t *fl, size_t pos, size_t b) {
    switch (st->kind) {
    case ST_ONE: return cls_has(st->cls, cp[pos], fl[pos]) ? 1 : 0;
    case ST_RUN: {
        size_t p = pos;
        if (st->ws_opt && (fl[p] & NL_UF_WS) && p + 1 < b && cls_has(st->cls, cp[p + 1], fl[p + 1])) p++;
        size_t q = p;
        while (q < b && cls_has(st->cls, cp[q], fl[q])) q++;
        return q > p ? q - pos : 0;
    }
    case ST_DIGIT3:
        return (pos + 3 <= b && cp[pos] - '0' < 10 && cp[pos + 1] - '0' < 10 && cp[pos + 2] - '0' < 10) ? 3 : 0;
    }
    return 0;
}

/* Generic stage over a segment: successive leftmost matches; text between matches is a piece. */
static void scan_generic(const pre_stage *st, const uint32_t *cp, const uint32_t *fl, size_t a, size_t b, size_t *out,
                         size_t *n) {
    size_t prev = a;
    if (st->kind == ST_TRAIL_WS) { /* \s+$: the maximal whitespace run at the segment end */
        size_t s = b;
        while (s > a && (fl[s - 1] & NL_UF_WS)) s--;
        EMIT(s);
        EMIT(b);
        return;
    }
    size_t pos = a;
    while (pos < b) {
        size_t m = match_at(st, cp, fl, pos, b);
        if (m == 0) {
            pos++;
            continue;
        }
        EMIT(pos);
        EMIT(pos + m);
        pos += m;
    }
    EMIT(b);
}

/* Run the stages of `pre` over cp[0..ncp): piece lengths in codepoints into segs (capacity ncp),
 * tmp is scratch of the same size. Returns the piece count. */
size_t nl_pre_split(const nl_pre_def *pre, const uint32_t *cp, const uint32_t *fl, size_t ncp, size_t *segs,
                    size_t *tmp) {
    if (ncp == 0) return 0;
    size_t nseg = 1;
    segs[0] = ncp;
    for (int s = 0; s < pre->n; s++) {
        const pre_stage *st = &pre->st[s];
        size_t nout = 0, start = 0;
        for (size_t i = 0; i < nseg; i++) {
            size_t a = start, b = start + segs[i];
            switch (st->kind) {
            case ST_GPT2: scan_gpt2(cp, fl, a, b, tmp, &nout); break;
            case ST_LLAMA3: scan_llama3(cp, fl, a, b, tmp, &nout, 3, 0); break;
            case ST_QWEN2: scan_llama3(cp, fl, a, b, tmp, &nout, 1, 0); break;
            case ST_QWEN35: scan_llama3(cp, fl, a, b, tmp, &nout, 1, 1); break;
            default: scan_generic(st, cp, fl, a, b, tmp, &nout); break;
            }
            start = b;
        }
        memcpy(segs, tmp, nout * sizeof(size_t));
        nseg = nout;
    }
    return nseg;
}

/* data/pretok (private to data/): the pre-tokenizers of byte-level BPE as hand-written
 * scanners over codepoints (no regex library). Each one is a list of stages; a stage cuts every
 * current segment further (like llama.cpp, text between two matches of a stage's regex becomes a
 * segment of its own). The regexes are llama.cpp's (src/llama-vocab.cpp), docs/formats.md §5. */
#ifndef NL_PRETOK_H
#define NL_PRETOK_H

#include <stddef.h>
#include <stdint.h>

/* ---- pre-tokenizer stages ---- */
enum {
    ST_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
    ST_LLAMA3, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    ST_QWEN2,  /* as LLAMA3 with \p{N} (single digits) */
    ST_QWEN35, /* as QWEN2 with [\p{L}\p{M}]+ words and \p{M} excluded from the punctuation run */
    ST_RUN,    /* \s?CLASS+ (ws_opt) or CLASS+ */
    ST_ONE,    /* CLASS */
    ST_TRAIL_WS, /* \s+$ */
    ST_DIGIT3,   /* [0-9][0-9][0-9] */
};
enum {
    C_CRLF,      /* [\r\n] */
    C_L,         /* \p{L} */
    C_N,         /* \p{N} */
    C_P,         /* \p{P} */
    C_FALCON,    /* [\p{P}\$\+<=>\^~\|`] */
    C_DEFAULT,   /* [\p{P}\$\+<=>\^~\|] */
    C_DS_LETTER, /* deepseek-llm [A-Za-zµÀ-Ö...] */
    C_DS_PUNCT,  /* deepseek-llm [!-/:-~！-／：-～‘-‟　-。] */
    C_CJK,       /* [一-龥ࠀ-一가-퟿] */
};
typedef struct {
    int kind, cls, ws_opt;
} pre_stage;
#define MAX_STAGES 6
typedef struct {
    const char *name;
    int n;
    pre_stage st[MAX_STAGES];
    int llama3; /* ignore_merges and add_bos default */
} nl_pre_def;

/* The pre-tokenizer named `name` (tokenizer.ggml.pre; NULL or "" = "default"), or NULL. */
const nl_pre_def *nl_pre_find(const char *name);
/* Run the stages of `pre` over cp[0..ncp) (flags fl from data/unicode): piece lengths in
 * codepoints into segs (capacity ncp), tmp is scratch of the same size. Returns the count. */
size_t nl_pre_split(const nl_pre_def *pre, const uint32_t *cp, const uint32_t *fl, size_t ncp, size_t *segs,
                    size_t *tmp);

#endif

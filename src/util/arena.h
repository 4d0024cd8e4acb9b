/* util/arena: a stack of big blocks for scratch that is strictly nested (LIFO): allocation
 * bumps, release rewinds to a mark. The training graph and the model forward take every buffer
 * of a call from one (layer inputs, layer caches, temporaries, head logits), so the peak equals
 * what the same mallocs would hold, and a kept arena saves the page faults of the next call.
 * Blocks are 256 MiB of virtual memory (or one allocation's size, if larger); pages become
 * resident only when touched. Zero-initialise an nl_arena before its first use. */
#ifndef NL_ARENA_H
#define NL_ARENA_H

#include <stddef.h>

typedef struct nl_arena_blk nl_arena_blk;
typedef struct {
    nl_arena_blk *first, *cur;
    size_t peak; /* the most bytes live at once since the arena was made (rounded sizes) */
} nl_arena;
typedef struct {
    nl_arena_blk *b;
    size_t used;
} nl_arena_mark;

/* Uninitialised, sizes rounded up to 64 bytes (aligned as malloc aligns); NULL + nl_err when
 * out of memory. */
void *nl_arena_alloc(nl_arena *a, size_t bytes);
static inline float *nl_arena_floats(nl_arena *a, size_t n) { return nl_arena_alloc(a, n * sizeof(float)); }
nl_arena_mark nl_arena_top(const nl_arena *a);
/* Release everything allocated since m was taken (the blocks stay for reuse). */
void nl_arena_release(nl_arena *a, nl_arena_mark m);
/* Free every block (the arena is empty and usable again). */
void nl_arena_free(nl_arena *a);
/* Make the first block at least `bytes` (virtual: nothing is touched), so a call whose peak
 * is known stays in one block: a stack that spills into a second block leaves the pages it
 * touched at the end of the first resident, and the blocks' resident sum exceeds the peak.
 * Only on an empty arena (no block yet, or every block released); 0, or -1 + nl_err. */
int nl_arena_reserve(nl_arena *a, size_t bytes);
/* The bytes nl_arena_alloc(a, n) takes (n rounded up to 64): what a bound on an arena's peak
 * adds per allocation. */
static inline size_t nl_arena_size(size_t n) { return n ? (n + 63) & ~(size_t)63 : 64; }

#endif

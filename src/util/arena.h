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

#endif

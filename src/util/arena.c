/* The scratch arena; see arena.h. */
#include "util/arena.h"

#include <stdlib.h>

#include "util/util.h"

struct nl_arena_blk {
    nl_arena_blk *next;
    size_t cap, used;
    char pad[40]; /* data starts 64 bytes in */
};

#define ARENA_BLOCK ((size_t)256 << 20) /* virtual; pages become resident only when touched */

void *nl_arena_alloc(nl_arena *a, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes == 0) bytes = 64;
    nl_arena_blk *b = a->cur;
    if (b && b->cap - b->used >= bytes) {
        void *p = (char *)(b + 1) + b->used;
        b->used += bytes;
        return p;
    }
    /* the blocks after cur are empty: take the first that fits, else append one */
    nl_arena_blk *prev = b;
    for (nl_arena_blk *n = b ? b->next : a->first; n; prev = n, n = n->next)
        if (n->cap >= bytes) {
            n->used = bytes;
            a->cur = n;
            return n + 1;
        }
    size_t cap = bytes > ARENA_BLOCK ? bytes : ARENA_BLOCK;
    nl_arena_blk *nb = malloc(sizeof(nl_arena_blk) + cap);
    if (!nb) {
        nl_err("out of memory (%zu bytes of scratch)", cap);
        return NULL;
    }
    nb->next = NULL;
    nb->cap = cap;
    nb->used = bytes;
    if (prev) prev->next = nb;
    else a->first = nb;
    a->cur = nb;
    return nb + 1;
}

nl_arena_mark nl_arena_top(const nl_arena *a) { return (nl_arena_mark){a->cur, a->cur ? a->cur->used : 0}; }

void nl_arena_release(nl_arena *a, nl_arena_mark m) {
    for (nl_arena_blk *b = m.b ? m.b->next : a->first; b; b = b->next) b->used = 0;
    if (m.b) m.b->used = m.used;
    a->cur = m.b;
}

void nl_arena_free(nl_arena *a) {
    for (nl_arena_blk *b = a->first, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    a->first = a->cur = NULL;
}

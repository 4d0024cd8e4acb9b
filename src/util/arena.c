/* The scratch arena; see arena.h. */
#include "util/arena.h"

#include <stdint.h>
#include <stdlib.h>

#include "util/util.h"

struct nl_arena_blk {
    nl_arena_blk *next;
    size_t cap, used;
    char pad[40]; /* data starts 64 bytes in */
};

#define ARENA_BLOCK ((size_t)256 << 20) /* virtual; pages become resident only when touched */

/* the bytes live: every block up to cur (the blocks after it are empty) */
static void note_peak(nl_arena *a) {
    size_t live = 0;
    for (nl_arena_blk *b = a->first; b; b = b->next) {
        live += b->used;
        if (b == a->cur) break;
    }
    if (live > a->peak) a->peak = live;
}

static void *alloc(nl_arena *a, size_t bytes) {
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

void *nl_arena_alloc(nl_arena *a, size_t bytes) {
    if (bytes > SIZE_MAX - 64) {
        nl_err("out of memory (%zu bytes of scratch)", bytes);
        return NULL;
    }
    void *p = alloc(a, nl_arena_size(bytes));
    if (p) note_peak(a);
    return p;
}

int nl_arena_reserve(nl_arena *a, size_t bytes) {
    for (nl_arena_blk *b = a->first; b; b = b->next)
        if (b->used) return nl_err("internal: nl_arena_reserve on an arena in use");
    if (a->first && a->first->cap >= bytes) return 0;
    /* the first block is too small: free the (empty) blocks and make one that holds it all */
    nl_arena_free(a);
    if (bytes > SIZE_MAX - sizeof(nl_arena_blk)) return nl_err("out of memory (%zu bytes of scratch)", bytes);
    size_t cap = bytes > ARENA_BLOCK ? bytes : ARENA_BLOCK;
    nl_arena_blk *nb = malloc(sizeof(nl_arena_blk) + cap);
    if (!nb) return nl_err("out of memory (%zu bytes of scratch)", cap);
    nb->next = NULL;
    nb->cap = cap;
    nb->used = 0;
    a->first = nb;
    a->cur = NULL;
    return 0;
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

/* fuzz_safetensors: the safetensors reader (nl_st_open_buffer), under PEFT adapter loading.
 *
 * The input is the file. Oracles on an accepted file: every tensor has a dtype it reads, at
 * most 8 dimensions, n_elems = the product of its shape and nbytes = n_elems × the dtype's size;
 * its data lies inside the input, after the header; the tensors tile the data section exactly
 * (sorted by offset, each starts where the one before ends, the last ends at the end of the
 * input); each name finds itself; every value converts (nl_st_to_f32 reads every byte). Written
 * again with nl_st_write and read back, the file holds the same names, dtypes, shapes and bytes.
 * A refused file gets an error naming the input. */
#include "common.h"
#include "model/safetensors.h"

static char tmp_path[512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_tmp_path(tmp_path, sizeof tmp_path, "rewrite.safetensors");
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const nl_st_tensor *x = *(const nl_st_tensor *const *)a, *y = *(const nl_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static void check(const nl_safetensors *st, size_t size) {
    static const unsigned dsize[] = {4, 2, 2};
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (uint8_t)st->buf[i];
    FUZZ_CHECK(st->len == size && hl <= size - 8, "header length %llu, size %zu", (unsigned long long)hl, size);
    const nl_st_tensor **order = calloc((size_t)st->n + 1, sizeof *order);
    FUZZ_CHECK(order, "oom");
    for (int i = 0; i < st->n; i++) {
        const nl_st_tensor *t = &st->t[i];
        FUZZ_CHECK(t->dtype >= NL_ST_F32 && t->dtype <= NL_ST_BF16, "dtype %d", (int)t->dtype);
        FUZZ_CHECK(t->n_dims >= 0 && t->n_dims <= NL_ST_MAX_DIMS, "n_dims %d", t->n_dims);
        uint64_t ne = 1;
        for (int d = 0; d < t->n_dims; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "shape[%d] = %lld", d, (long long)t->shape[d]);
            ne *= (uint64_t)t->shape[d]; /* bounded: n_elems × size fits the input */
        }
        FUZZ_CHECK(ne == (uint64_t)t->n_elems && t->nbytes == ne * dsize[t->dtype], "'%s': %llu elements, %llu bytes",
                   t->name, (unsigned long long)ne, (unsigned long long)t->nbytes);
        FUZZ_CHECK(t->offset >= 8 + hl && t->offset + t->nbytes <= size, "'%s' data outside the input", t->name);
        FUZZ_CHECK((const char *)t->data == st->buf + t->offset, "data pointer");
        FUZZ_CHECK(nl_st_find(st, t->name) == t, "'%s' does not find itself", t->name);
        float *v = malloc((size_t)t->n_elems * sizeof(float) + 1);
        FUZZ_CHECK(v, "oom");
        nl_st_to_f32(t, v);
        free(v);
        order[i] = t;
    }
    qsort(order, (size_t)st->n, sizeof *order, by_offset);
    uint64_t pos = 8 + hl;
    for (int i = 0; i < st->n; i++) {
        FUZZ_CHECK(order[i]->offset == pos, "'%s' at %llu, expected %llu", order[i]->name,
                   (unsigned long long)order[i]->offset, (unsigned long long)pos);
        pos += order[i]->nbytes;
    }
    FUZZ_CHECK(pos == size, "the tensors end at %llu of %zu", (unsigned long long)pos, size);
    free(order);
    /* write and read back */
    nl_st_out *out = calloc((size_t)st->n + 1, sizeof *out);
    FUZZ_CHECK(out, "oom");
    for (int i = 0; i < st->n; i++) {
        out[i] = (nl_st_out){
            .name = st->t[i].name, .dtype = st->t[i].dtype, .n_dims = st->t[i].n_dims, .data = st->t[i].data};
        memcpy(out[i].shape, st->t[i].shape, sizeof out[i].shape);
    }
    FUZZ_CHECK(nl_st_write(tmp_path, out, st->n, NULL) == 0, "rewrite: %s", nl_last_error());
    free(out);
    nl_safetensors *again = nl_st_open(tmp_path);
    FUZZ_CHECK(again, "the rewrite is refused: %s", nl_last_error());
    FUZZ_CHECK(again->n == st->n, "%d tensors, expected %d", again->n, st->n);
    for (int i = 0; i < st->n; i++) {
        const nl_st_tensor *a = &st->t[i], *b = nl_st_find(again, a->name);
        FUZZ_CHECK(b && b->dtype == a->dtype && b->n_dims == a->n_dims && b->nbytes == a->nbytes, "'%s' changed",
                   a->name);
        FUZZ_CHECK(!memcmp(a->shape, b->shape, sizeof a->shape) && !memcmp(a->data, b->data, (size_t)a->nbytes),
                   "'%s' changed", a->name);
    }
    nl_st_close(again);
    remove(tmp_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nl_safetensors *st = nl_st_open_buffer(data, size, "input.safetensors");
    if (!st) {
        FUZZ_CHECK(strstr(nl_last_error(), "input.safetensors") != NULL, "error without the label: %s",
                   nl_last_error());
        FUZZ_NOTE("refused: %s", nl_last_error());
        return 0;
    }
    check(st, size);
    nl_st_close(st);
    return 0;
}

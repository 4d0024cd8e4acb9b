/* model/safetensors: Hugging Face's safetensors container, read and written (PEFT adapters,
 * model/peft.h).
 *
 * Layout (all little-endian):
 *   u64   N                 the header's length in bytes
 *   N     bytes of JSON     an object: tensor name -> {"dtype": "F32", "shape": [d0, d1, ...],
 *                           "data_offsets": [begin, end]}, and optionally "__metadata__": an
 *                           object of string values
 *   ...   data              tensor t's row-major bytes at file offset 8 + N + begin .. 8 + N + end
 *
 * The reader trusts no length in the file: N must fit the file, the header must be strict JSON
 * (util/json.h), every tensor's offsets must lie inside the data, end − begin must equal its
 * shape's elements times its dtype's size, and the tensors must tile the data section exactly
 * (no overlap, no bytes that belong to no tensor: what the safetensors library itself requires).
 * Errors name the file and the byte offset ("A.safetensors: offset 52: tensor 'x': data_offsets
 * [0, 40) hold 40 bytes, its F32 shape [3, 4] needs 48"). Dtypes read: F32, F16, BF16; any
 * other (F64, I64, U8, ...) is refused by name. */
#ifndef NL_SAFETENSORS_H
#define NL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/json.h"

#define NL_ST_MAX_DIMS 8
#define NL_ST_MAX_HEADER ((uint64_t)100 << 20) /* the safetensors library's own limit */

typedef enum { NL_ST_F32 = 0, NL_ST_F16, NL_ST_BF16 } nl_st_dtype;

const char *nl_st_dtype_name(nl_st_dtype t); /* "F32", "F16", "BF16" */

typedef struct {
    const char *name; /* borrowed from the header DOM */
    nl_st_dtype dtype;
    int n_dims;
    int64_t shape[NL_ST_MAX_DIMS];
    int64_t n_elems; /* product of shape (1 for a scalar) */
    uint64_t offset; /* file offset of the first data byte */
    uint64_t nbytes;
    const void *data; /* inside the file's bytes (any alignment) */
} nl_st_tensor;

typedef struct {
    char *label; /* the path, for messages */
    char *buf;   /* the whole file (owned) */
    size_t len;
    nl_json *header;         /* owned */
    const nl_json *metadata; /* "__metadata__" or NULL */
    nl_st_tensor *t;         /* in header order */
    int n;
} nl_safetensors;

/* Read and validate a file / a caller's buffer (copied; label names it in errors). NULL +
 * nl_last_error() on any problem. */
nl_safetensors *nl_st_open(const char *path);
nl_safetensors *nl_st_open_buffer(const void *buf, size_t len, const char *label);
void nl_st_close(nl_safetensors *st);

const nl_st_tensor *nl_st_find(const nl_safetensors *st, const char *name);
/* A "__metadata__" string value, or NULL. */
const char *nl_st_meta(const nl_safetensors *st, const char *key);
/* The tensor's elements as F32 into out[n_elems]. */
void nl_st_to_f32(const nl_st_tensor *t, float *out);

/* One tensor to write: data holds n_elems values of dtype, row-major (borrowed). */
typedef struct {
    const char *name;
    nl_st_dtype dtype;
    int n_dims;
    int64_t shape[NL_ST_MAX_DIMS];
    const void *data;
} nl_st_out;

/* Write tensors t[0..n) in that order, with "__metadata__" from meta (key, value, key, value,
 * ..., NULL; may be NULL), atomically (os/io.h). The header is padded with spaces to a multiple
 * of 8 bytes, so every tensor's data starts 8-aligned in the file when its offset is. 0 or -1. */
int nl_st_write(const char *path, const nl_st_out *t, int n, const char *const *meta);
/* The same through io (NULL = nl_io_posix(); tests inject faults). */
struct nl_io;
int nl_st_write_io(const struct nl_io *io, const char *path, const nl_st_out *t, int n, const char *const *meta);

/* s as a JSON string literal onto f (the header's and the PEFT config's strings). 0 or -1. */
int nl_st_json_str(FILE *f, const char *s);

#endif

/* model/gguf: GGUF v3 reader (mmap, every length and offset checked against the file size)
 * and writer (files llama.cpp accepts). Facts: docs/formats.md §1.
 *
 * Reader: nl_gguf_open maps the file; all strings are copied out NUL-terminated; numeric
 * array payloads and tensor data point into the mapping (borrowed, valid until close).
 * Every error message names the file, the byte offset and what was expected. */
#ifndef NL_GGUF_H
#define NL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum nl_gguf_vtype {
    NL_GGUF_UINT8 = 0,
    NL_GGUF_INT8 = 1,
    NL_GGUF_UINT16 = 2,
    NL_GGUF_INT16 = 3,
    NL_GGUF_UINT32 = 4,
    NL_GGUF_INT32 = 5,
    NL_GGUF_FLOAT32 = 6,
    NL_GGUF_BOOL = 7,
    NL_GGUF_STRING = 8,
    NL_GGUF_ARRAY = 9,
    NL_GGUF_UINT64 = 10,
    NL_GGUF_INT64 = 11,
    NL_GGUF_FLOAT64 = 12,
};

#define NL_GGUF_DEFAULT_ALIGNMENT 32
#define NL_GGUF_MAX_DIMS 4
#define NL_GGUF_MAX_NAME 64

typedef struct {
    char *key;
    int type; /* enum nl_gguf_vtype */
    union {
        uint64_t u64; /* any unsigned scalar, bool (0/1) */
        int64_t i64;  /* any signed scalar */
        double f64;   /* FLOAT32 / FLOAT64 */
    } v;
    char *str;             /* STRING */
    int arr_type;          /* ARRAY: element type */
    uint64_t arr_n;        /* ARRAY: element count */
    const void *arr_data;  /* ARRAY of numbers/bools: little-endian payload inside the mapping */
    char **arr_str;        /* ARRAY of strings: arr_n NUL-terminated copies */
    uint64_t *arr_str_len; /* their byte lengths (strings may contain NUL in theory) */
    uint64_t offset;       /* file offset of the value (ARRAY: of its first element), for messages */
} nl_gguf_kv;

typedef struct {
    char *name;
    uint32_t n_dims;
    int64_t ne[NL_GGUF_MAX_DIMS]; /* missing dims = 1; ne[0] is contiguous */
    int type;                     /* ggml type id (model/quant.h) */
    uint64_t offset;              /* relative to the data section */
    uint64_t nbytes;
    const void *data; /* inside the mapping */
} nl_gguf_tensor;

typedef struct nl_gguf {
    char *path;
    const uint8_t *base; /* mapping (or caller's buffer) */
    uint64_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv, n_tensors;
    nl_gguf_kv *kv;
    nl_gguf_tensor *tensors;
    uint64_t data_offset; /* file offset of the data section */
} nl_gguf;

/* Open and validate; NULL + nl_last_error() on failure. */
nl_gguf *nl_gguf_open(const char *path);
/* Parse a caller-owned buffer (fuzzing, tests); `label` names it in errors. Borrowed: the
 * buffer must outlive the handle. */
nl_gguf *nl_gguf_open_buffer(const void *buf, size_t len, const char *label);
void nl_gguf_close(nl_gguf *g);
/* 1 when the file under a mapped reader changed after it was opened (a page of it went away:
 * truncated; or its size or modification time differ: rewritten), else 0 (also for a buffer).
 * Reading a page that went away does not kill the process: a SIGBUS handler the first
 * nl_gguf_open installs answers it with zeros and marks the reader changed, so results computed
 * since the last check must not be trusted once this says 1. */
int nl_gguf_changed(const nl_gguf *g);

/* Lookups return NULL / -1 when absent. */
const nl_gguf_kv *nl_gguf_get(const nl_gguf *g, const char *key);
const nl_gguf_tensor *nl_gguf_tensor_find(const nl_gguf *g, const char *name);

/* Typed getters: 0 ok, 1 absent (out untouched), -1 present with a wrong type (error set,
 * naming the key, the found and the expected type). Integers accept any integer type whose
 * value fits. */
int nl_gguf_get_u32(const nl_gguf *g, const char *key, uint32_t *out);
int nl_gguf_get_i64(const nl_gguf *g, const char *key, int64_t *out);
int nl_gguf_get_f32(const nl_gguf *g, const char *key, float *out);
int nl_gguf_get_bool(const nl_gguf *g, const char *key, bool *out);
int nl_gguf_get_str(const nl_gguf *g, const char *key, const char **out);
/* Numeric array element as double / int64 (no bounds trust: i < arr_n is checked). */
int nl_gguf_arr_i64(const nl_gguf_kv *kv, uint64_t i, int64_t *out);
int nl_gguf_arr_f64(const nl_gguf_kv *kv, uint64_t i, double *out);

const char *nl_gguf_vtype_name(int type);
/* Block geometry of a ggml type id known to the container (a private table, independent of
 * quant.c): 0 ok, -1 unknown id. Either out pointer may be NULL. */
int nl_gguf_type_info(int type, int *blck, size_t *blck_bytes);

/* ---- writer ---- */
typedef struct nl_gguf_writer nl_gguf_writer;

nl_gguf_writer *nl_gguf_writer_new(void);
void nl_gguf_writer_free(nl_gguf_writer *w);
/* Setting a key twice replaces its value. */
int nl_gguf_set_u32(nl_gguf_writer *w, const char *key, uint32_t v);
int nl_gguf_set_i32(nl_gguf_writer *w, const char *key, int32_t v);
int nl_gguf_set_u64(nl_gguf_writer *w, const char *key, uint64_t v);
int nl_gguf_set_f32(nl_gguf_writer *w, const char *key, float v);
int nl_gguf_set_bool(nl_gguf_writer *w, const char *key, bool v);
int nl_gguf_set_str(nl_gguf_writer *w, const char *key, const char *v);
/* Numeric array: `data` holds n little-endian elements of elem_type (copied). */
int nl_gguf_set_arr(nl_gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n);
int nl_gguf_set_arr_str(nl_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Remove a key: 0 removed, 1 absent. */
int nl_gguf_remove_key(nl_gguf_writer *w, const char *key);
/* Copy every KV of a reader into the writer (for merge / adapters). */
int nl_gguf_copy_kvs(nl_gguf_writer *w, const nl_gguf *g);
/* Add a tensor; `data` (nbytes of `type`) is copied unless `borrow` (then it must stay valid
 * until write). Tensors are written in the order added. */
int nl_gguf_add_tensor(nl_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                       bool borrow);
/* Add a tensor whose bytes are produced at write time: fill(user, index, dst, nbytes) writes
 * nbytes into dst (a buffer the writer owns for that one call) and returns 0, or -1 + error.
 * Lets a producer stream large models without holding every tensor in memory. */
typedef int (*nl_gguf_fill_fn)(void *user, int tensor_index, void *dst, uint64_t nbytes);
int nl_gguf_add_tensor_fill(nl_gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                            nl_gguf_fill_fn fill, void *user);
/* Write the file with os/io's one atomic write (path.tmp created O_EXCL|O_NOFOLLOW, fsync,
 * rename, fsync of the directory). 0, -1 (path unchanged) or NL_IO_NOT_DURABLE (os/io.h: the
 * new file is in place but its directory could not be synced), with nl_err set. */
int nl_gguf_write(nl_gguf_writer *w, const char *path);

#endif

/* model/quant: the ggml tensor types nightlora reads and writes, as ONE traits table
 * (block size, block bytes, to_float, from_float). Adding a type is adding a row.
 * Facts: docs/formats.md §1 (block layouts, reference quantizers). */
#ifndef NL_QUANT_H
#define NL_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum nl_type {
    NL_TYPE_F32 = 0,
    NL_TYPE_F16 = 1,
    NL_TYPE_Q4_0 = 2,
    NL_TYPE_Q4_1 = 3,
    NL_TYPE_Q5_0 = 6,
    NL_TYPE_Q8_0 = 8,
    NL_TYPE_Q4_K = 12,
    NL_TYPE_Q6_K = 14,
    NL_TYPE_BF16 = 30,
    NL_TYPE_COUNT = 43, /* ggml's id space */
};

typedef struct {
    const char *name; /* "f32", "q8_0", ... (lower case, as the CLI spells them) */
    int blck;         /* elements per block; 0 when the layout is not known (removed ids) */
    size_t bytes;     /* bytes per block */
    /* n must be a multiple of blck. NULL when the direction is not supported. */
    void (*to_float)(const void *src, float *dst, int64_t n);
    void (*from_float)(const float *src, void *dst, int64_t n);
    /* The index of the first of n elements whose decoded value is not finite, -1 when every
     * one is, found from the bytes without decoding (the exponent bits of a float, the f16
     * scales of a block: with finite scales no block format here can decode to Inf or NaN).
     * Every row with to_float has one (test_quant checks it against decoding). */
    int64_t (*first_nonfinite)(const void *src, int64_t n);
} nl_type_traits;

/* The row of any ggml id (NULL out of range): the name, the block layout where known (blck > 0;
 * what the GGUF reader sizes tensors by, converted or not) and the conversions where nightlora
 * has them. */
const nl_type_traits *nl_type_info(int type);
/* The row of a type nightlora handles (to_float set); NULL for any other id. */
const nl_type_traits *nl_type_get(int type);
/* ggml's name for any id (even unsupported ones, e.g. "q5_k"); "unknown" past the range. */
const char *nl_type_name(int type);
/* Parse "f32", "F16", "q8_0", ... (any ggml name, case-insensitive; the id of an unsupported
 * type like "q5_k" is returned too, so check nl_type_get); -1 when unknown. */
int nl_type_from_name(const char *name);
/* The first of n elements (a multiple of the block size) of a handled type whose decoded
 * value is Inf or NaN, -1 when none is (and for a type without to_float); at memory speed.
 * The model loader runs it over every tensor it uses. */
int64_t nl_type_first_nonfinite(int type, const void *src, int64_t n);
/* llama.cpp's llama_ftype (general.file_type): the type most of a model file's weights have. */
enum nl_ftype {
    NL_FTYPE_ALL_F32 = 0,
    NL_FTYPE_MOSTLY_F16 = 1,
    NL_FTYPE_MOSTLY_Q4_0 = 2,
    NL_FTYPE_MOSTLY_Q4_1 = 3,
    NL_FTYPE_MOSTLY_Q8_0 = 7,
    NL_FTYPE_MOSTLY_Q4_K_M = 15,
    NL_FTYPE_MOSTLY_Q6_K = 18,
    NL_FTYPE_MOSTLY_BF16 = 32,
};
/* The file type of a model whose weights are `type`; -1 when llama.cpp names none for it. */
int nl_type_ftype(int type);
/* Bytes of one row of ne0 elements; 0 if ne0 is not a multiple of the block size. */
size_t nl_row_bytes(int type, int64_t ne0);

float nl_f16_to_f32(uint16_t h);
uint16_t nl_f32_to_f16(float f); /* round to nearest even, like F16C */
float nl_bf16_to_f32(uint16_t h);
uint16_t nl_f32_to_bf16(float f); /* ggml's rounding, NaN kept quiet */

/* Q8_0 block, exposed for the kernels (proj/). */
typedef struct {
    uint16_t d;
    int8_t qs[32];
} nl_block_q8_0;
typedef struct {
    uint16_t d;
    uint8_t qs[16];
} nl_block_q4_0;
typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} nl_block_q4_1;

#endif

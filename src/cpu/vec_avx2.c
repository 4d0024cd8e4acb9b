/* cpu/vec_avx2: the element-wise nodes' bodies (cpu/vec_body.h) built with the avx2 row's flags
 * (-mavx2 -mfma -mf16c, from the file name): the 8-lane loops become one 256-bit vector instead
 * of two 128-bit ones; the same bits as cpu/vec.c (no contraction under -std=c11). */
#if defined(__x86_64__) && defined(__AVX2__)
#define NL_VEC_ISA avx2
#include "cpu/vec_body.h"
#else
typedef int nl_vec_avx2_empty; /* ISO C: a translation unit must not be empty */
#endif

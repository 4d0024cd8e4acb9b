/* cpu/vec_avx512: the element-wise nodes' bodies (cpu/vec_body.h) built with the avx512 row's
 * flags (from the file name); the same source and the same bits as cpu/vec.c and vec_avx2.c. */
#if defined(__x86_64__) && defined(__AVX512F__)
#define NL_VEC_ISA avx512
#include "cpu/vec_body.h"
#else
typedef int nl_vec_avx512_empty; /* ISO C: a translation unit must not be empty */
#endif

/* cpu/vec: the element-wise nodes' bodies built for the baseline ISA (cpu/vec_body.h): the
 * scalar row's (the Arm rows' are cpu/vec_neon.c's: NEON intrinsics where gcc leaves these
 * loops scalar, these bodies elsewhere). */
#define NL_VEC_ISA portable
#include "cpu/vec_body.h"

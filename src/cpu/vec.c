/* cpu/vec: the element-wise nodes' bodies built for the baseline ISA (cpu/vec_body.h): the
 * scalar row's, and the Arm rows' (the aarch64 baseline has NEON: gcc vectorises the 8-lane
 * loops into it). */
#define NL_VEC_ISA portable
#include "cpu/vec_body.h"

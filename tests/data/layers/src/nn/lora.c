#include "nn/lora.h"
#include "model/adapter.h"
#include "util/rng.h"
#include <immintrin.h>
__attribute__((target("avx512f"))) static int wide_row(int n) { return n; }

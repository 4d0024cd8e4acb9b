#include "nn/lora.h"
#include "model/adapter.h"
#include "util/rng.h"
#include <immintrin.h>
__attribute__((target("avx512f"))) static int wide_row(int n) { return n; }
__attribute__((target_clones("arch=x86-64-v3", "default"))) static int cloned_row(int n) { return n; }

/* util/rng: counter-based RNG (see rng.h). */
#include "util/rng.h"

#include <math.h>

uint64_t nl_rng_key4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t k = nl_rng_key(seed);
    k = nl_rng_key_add(k, a);
    k = nl_rng_key_add(k, b);
    k = nl_rng_key_add(k, c);
    return nl_rng_key_add(k, d);
}

float nl_rng_normal(uint64_t key, uint64_t counter) {
    uint64_t v = nl_rng_u64(key, counter);
    /* u1 in (0, 1], u2 in [0, 1), 32 bits each; double math so the tails are accurate. */
    double u1 = ((double)(v >> 32) + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)(v & 0xFFFFFFFFu) * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void nl_rng_fill_uniform(float *out, int64_t n, uint64_t key, uint64_t counter0) {
    for (int64_t i = 0; i < n; i++) out[i] = nl_rng_uniform(key, counter0 + (uint64_t)i);
}

void nl_rng_fill_normal(float *out, int64_t n, uint64_t key, uint64_t counter0) {
    for (int64_t i = 0; i < n; i++) out[i] = nl_rng_normal(key, counter0 + (uint64_t)i);
}

/* util/rng: a counter-based (stateless) random number generator.
 *
 * A number is a pure function of (key, counter): the same key and counter ALWAYS give the same
 * number, on every platform, in any call order and whatever the thread count. There is no
 * hidden state, so recomputation (backward re-running a forward), resume from a checkpoint and
 * parallel workers all reproduce the exact same values. Uses: LoRA dropout masks (key =
 * (seed, step, layer, projection, token), counter = feature index), LoRA init, MeZO
 * perturbations, data shuffling.
 *
 * Construction: a key is a 64-bit hash of a tuple of 64-bit words, built by chaining
 * nl_rng_key_add (each word goes through the splitmix64/Stafford "mix13" finaliser, mixed
 * with the running key). Value number c of a key is mix(key + (c + 1)·γ) with γ the golden
 * ratio constant, i.e. the c-th output of a splitmix64 stream seeded with the key. Not
 * cryptographic; statistically good (splitmix64 passes BigCrush). */
#ifndef NL_RNG_H
#define NL_RNG_H

#include <stdint.h>

#define NL_RNG_GAMMA 0x9E3779B97F4A7C15ULL

/* Stafford variant 13 of the murmur3 64-bit finaliser (the splitmix64 output function). */
static inline uint64_t nl_rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The sequential splitmix64 stream (Steele, Lea, Flood 2014): advance *state by γ and return
 * the mixed value — for the few places that draw from a seeded stream rather than from a
 * (key, counter) pair. */
static inline uint64_t nl_splitmix64(uint64_t *state) {
    *state += NL_RNG_GAMMA;
    return nl_rng_mix64(*state);
}

/* Start a key from a seed; then add tuple words in a fixed order. Different tuples (and the
 * same words in a different order) give unrelated keys. */
static inline uint64_t nl_rng_key(uint64_t seed) { return nl_rng_mix64(seed ^ 0x6A09E667F3BCC909ULL); }
static inline uint64_t nl_rng_key_add(uint64_t key, uint64_t word) {
    return nl_rng_mix64(key ^ nl_rng_mix64(word + NL_RNG_GAMMA));
}
/* Convenience: key of (seed, a, b, c, d) = key_add(key_add(key_add(key_add(key(seed), a), b), c), d). */
uint64_t nl_rng_key4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* The counter-th 64-bit value of a key. */
static inline uint64_t nl_rng_u64(uint64_t key, uint64_t counter) {
    return nl_rng_mix64(key + (counter + 1) * NL_RNG_GAMMA);
}
/* High 32 bits of nl_rng_u64. */
static inline uint32_t nl_rng_u32(uint64_t key, uint64_t counter) { return (uint32_t)(nl_rng_u64(key, counter) >> 32); }
/* Uniform float in [0, 1): the top 24 bits / 2^24 (every value exactly representable). */
static inline float nl_rng_uniform(uint64_t key, uint64_t counter) {
    return (float)(nl_rng_u64(key, counter) >> 40) * (1.0f / 16777216.0f);
}
/* Standard normal N(0, 1) by Box-Muller from the two 32-bit halves of value `counter`
 * (u1 in (0, 1] so log never sees 0). One normal per counter (the sine branch is unused). */
float nl_rng_normal(uint64_t key, uint64_t counter);

/* out[i] = value (counter0 + i) for i < n. */
void nl_rng_fill_uniform(float *out, int64_t n, uint64_t key, uint64_t counter0); /* [0, 1) */
void nl_rng_fill_normal(float *out, int64_t n, uint64_t key, uint64_t counter0);  /* N(0, 1) */

#endif

/* util/hash: one 64-bit non-cryptographic hash for the library — the checkpoint checksum, the
 * identity of a model file, of the packed training data and of a run's configuration. */
#ifndef NL_HASH_H
#define NL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* A 64-bit non-cryptographic hash of n bytes (4 independent multiply-rotate lanes over 32-byte
 * stripes, then a splitmix64-style finaliser; several GB/s). Every single-bit change, and any
 * change confined to one 8-byte word, always changes the result; other changes collide with
 * probability ~2^-64. The value is the same on every platform (bytes are read little-endian). */
uint64_t nl_hash64(const void *data, size_t n, uint64_t seed);

/* Streaming form: init, update any number of times, final (same value as nl_hash64 over the
 * concatenation). */
typedef struct {
    uint64_t lane[4];
    uint64_t total;
    uint64_t seed;
    uint8_t buf[32];
    uint32_t nbuf;
} nl_hasher;
void nl_hasher_init(nl_hasher *h, uint64_t seed);
void nl_hasher_update(nl_hasher *h, const void *data, size_t n);
uint64_t nl_hasher_final(const nl_hasher *h);

/* The identity of a file, for "is this the same model file?": the hash of its size and every
 * byte (read in 1 MiB chunks, at memory speed when the file is cached: about 0.1 s a GB here),
 * so any changed weight byte changes it. Not affected by the file's path or time stamps.
 * Returns 0 and *out, or -1 with nl_err naming the file and the offset. */
int nl_file_hash64(const char *path, uint64_t *out);
/* The same identity of `size` bytes already in memory (a mapped file): the value
 * nl_file_hash64 gives for a file holding them, without reading the file again. */
uint64_t nl_content_hash64(const void *data, uint64_t size);

/* FNV-1a of n bytes: the short-key hash of the library's hash tables (tensor and KV names,
 * vocabulary strings) and of mkmodel's per-tensor seeds; fast for a few bytes, not for bulk data
 * (nl_hash64 is). The offset basis is 1469598103934665603, one digit short of FNV's published
 * 14695981039346656037, as every copy had it: kept, since mkmodel's weights follow from it. */
static inline uint64_t nl_fnv1a(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

#endif

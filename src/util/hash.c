/* util/hash: the library's one 64-bit hash (checksums of checkpoint files, identities of a
 * model file, of the packed data and of a run's configuration). See hash.h. */
#include "util/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/rng.h"
#include "util/util.h"

/* odd multipliers: multiplication by them is a bijection (splitmix64's γ and its two finaliser
 * multipliers) */
#define K1 NL_RNG_GAMMA
#define K2 0xBF58476D1CE4E5B9ull
#define K3 0x94D049BB133111EBull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load_le64(const uint8_t *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
           (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

/* Bijective 64-bit mixer (xor-shift / multiply rounds): the splitmix64 finaliser. */
static inline uint64_t mix64(uint64_t x) { return nl_rng_mix64(x); }

/* One lane round; for a fixed word it is a bijection of the lane, and for a fixed lane a
 * bijection of the word, so a change in one word always survives to the end. */
static inline uint64_t lane_round(uint64_t lane, uint64_t w) { return rotl64(lane + w * K1, 29) * K2; }

void nl_hasher_init(nl_hasher *h, uint64_t seed) {
    for (int i = 0; i < 4; i++) h->lane[i] = seed ^ (K3 * (uint64_t)(i + 1));
    h->total = 0;
    h->seed = seed;
    h->nbuf = 0;
}

static void stripe(nl_hasher *h, const uint8_t *p) {
    h->lane[0] = lane_round(h->lane[0], load_le64(p));
    h->lane[1] = lane_round(h->lane[1], load_le64(p + 8));
    h->lane[2] = lane_round(h->lane[2], load_le64(p + 16));
    h->lane[3] = lane_round(h->lane[3], load_le64(p + 24));
}

void nl_hasher_update(nl_hasher *h, const void *data, size_t n) {
    const uint8_t *p = data;
    h->total += n;
    if (h->nbuf) {
        size_t take = 32 - h->nbuf < n ? 32 - h->nbuf : n;
        memcpy(h->buf + h->nbuf, p, take);
        h->nbuf += (uint32_t)take;
        p += take;
        n -= take;
        if (h->nbuf < 32) return;
        stripe(h, h->buf);
        h->nbuf = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(h, p);
    memcpy(h->buf, p, n);
    h->nbuf = (uint32_t)n;
}

uint64_t nl_hasher_final(const nl_hasher *h) {
    uint64_t x = mix64(h->total ^ h->seed);
    for (int i = 0; i < 4; i++) x = (x ^ mix64(h->lane[i])) * K1;
    const uint8_t *p = h->buf;
    uint32_t n = h->nbuf;
    for (; n >= 8; p += 8, n -= 8) x = rotl64(x ^ (load_le64(p) * K2), 27) * K3 + K1;
    if (n) {
        uint64_t w = 0;
        for (uint32_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
        x = rotl64(x ^ (w * K2), 23) * K3 + K2;
    }
    return mix64(x);
}

uint64_t nl_hash64(const void *data, size_t n, uint64_t seed) {
    nl_hasher h;
    nl_hasher_init(&h, seed);
    nl_hasher_update(&h, data, n);
    return nl_hasher_final(&h);
}

/* pread the whole range or fail. */
static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* The identity's start: its seed and the size (8 bytes, little-endian). */
static void identity_init(nl_hasher *h, uint64_t size) {
    nl_hasher_init(h, 0x66696c6568617368ull);
    uint8_t sz[8];
    for (int i = 0; i < 8; i++) sz[i] = (uint8_t)(size >> (8 * i));
    nl_hasher_update(h, sz, 8);
}

uint64_t nl_content_hash64(const void *data, uint64_t size) {
    nl_hasher h;
    identity_init(&h, size);
    nl_hasher_update(&h, data, (size_t)size);
    return nl_hasher_final(&h);
}

int nl_file_hash64(const char *path, uint64_t *out) {
    enum { CHUNK = 1 << 20 }; /* a chunk stays in cache between the copy and the hash */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nl_err("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return nl_err("%s: cannot stat: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t *buf = nl_malloc(CHUNK);
    if (!buf) {
        close(fd);
        return -1;
    }
    nl_hasher h;
    identity_init(&h, size);
    int rc = 0;
    uint64_t off = 0;
    for (off = 0; off < size && rc == 0; off += CHUNK) {
        size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        errno = 0;
        rc = pread_all(fd, buf, n, off);
        if (rc == 0) nl_hasher_update(&h, buf, n);
    }
    int e = errno;
    free(buf);
    close(fd);
    if (rc != 0)
        return nl_err("%s: read error near offset %llu: %s", path, (unsigned long long)off,
                      e ? strerror(e) : "unexpected end of file");
    *out = nl_hasher_final(&h);
    return 0;
}

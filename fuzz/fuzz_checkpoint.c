/* fuzz_checkpoint: the checkpoint reader (nl_ckpt_load_file) through an in-memory nl_io.
 *
 * Input: byte 0 = mode, the rest = the checkpoint file's bytes.
 *   bit 0    fix the trailing checksum first (so mutations get past it into the fields)
 *   bit 1    expect the config / model hashes the file holds (else 1 and 2)
 *   bit 2    expect the file's n_params (else 0 = any)
 *   bits 3-4 largest read the I/O layer returns: unlimited, 1, 7 or 64 bytes (short reads)
 *   bit 5    every read after the header fails with EIO
 * Oracle: the harness decides independently, from checkpoint.h's format description, whether
 * the file is valid (magic, version 1, 96-byte header, counts within NL_CKPT_MAX_WORDS, size
 * equal to what the counts imply, checksum, hashes, n_params) and the loader must agree; an
 * accepted file's fields and arrays must equal the bytes of the file; a refused one leaves
 * the struct zeroed and the error names the file. */
#include <errno.h>
#include <sys/stat.h>

#include "common.h"
#include "train/checkpoint.h"

typedef struct {
    const uint8_t *data;
    size_t size, pos;
    size_t max_read;
    int fail_after_header;
    int open_fds;
} memfile;

static int m_open(void *ctx, const char *path, int flags, int mode) {
    (void)path;
    (void)flags;
    (void)mode;
    ((memfile *)ctx)->open_fds++;
    return 3;
}
static ssize_t m_read(void *ctx, int fd, void *buf, size_t n) {
    memfile *f = ctx;
    FUZZ_CHECK(fd == 3 && f->open_fds == 1, "read on fd %d", fd);
    if (f->fail_after_header && f->pos >= 96) {
        errno = EIO;
        return -1;
    }
    if (f->max_read && n > f->max_read) n = f->max_read;
    if (n > f->size - f->pos) n = f->size - f->pos;
    memcpy(buf, f->data + f->pos, n);
    f->pos += n;
    return (ssize_t)n;
}
static ssize_t m_write(void *ctx, int fd, const void *buf, size_t n) {
    (void)ctx;
    (void)fd;
    (void)buf;
    (void)n;
    FUZZ_CHECK(0, "the loader wrote");
    return -1;
}
static int m_fstat(void *ctx, int fd, uint64_t *bytes, uint32_t *mode) {
    (void)fd;
    *bytes = ((memfile *)ctx)->size;
    *mode = S_IFREG | 0644;
    return 0;
}
static int m_fsync(void *ctx, int fd) {
    (void)ctx;
    (void)fd;
    return 0;
}
static int m_close(void *ctx, int fd) {
    FUZZ_CHECK(fd == 3, "close of fd %d", fd);
    ((memfile *)ctx)->open_fds--;
    return 0;
}
static int m_rename(void *ctx, const char *a, const char *b) {
    (void)ctx;
    (void)a;
    (void)b;
    FUZZ_CHECK(0, "the loader renamed");
    return -1;
}
static int m_unlink(void *ctx, const char *p) {
    (void)ctx;
    (void)p;
    FUZZ_CHECK(0, "the loader unlinked");
    return -1;
}
static int m_fsync_dir(void *ctx, const char *d) {
    (void)ctx;
    (void)d;
    return 0;
}
static int m_lstat(void *ctx, const char *p, uint32_t *mode) {
    (void)ctx;
    (void)p;
    (void)mode;
    FUZZ_CHECK(0, "the loader examined a path");
    return -1;
}
static int m_list(void *ctx, const char *d, int (*each)(void *, const char *), void *u) {
    (void)ctx;
    (void)d;
    (void)each;
    (void)u;
    FUZZ_CHECK(0, "the loader listed a directory");
    return -1;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    FUZZ_CHECK(file != NULL, "oom");
    memcpy(file, data + 1, n);
    if ((mode & 1) && n >= 8) {
        uint64_t h = nl_hash64(file, n - 8, NL_CKPT_HASH_SEED);
        for (int i = 0; i < 8; i++) file[n - 8 + i] = (uint8_t)(h >> (8 * i));
    }
    /* the harness's own verdict */
    bool valid = n >= 104 && !memcmp(file, "NLCKPT\0\0", 8) && le32(file + 8) == 1 && le32(file + 12) == 96;
    uint64_t n_params = 0, cfg = 1, mdl = 2, expect_np = 0;
    uint32_t n_cursor = 0, n_rng = 0;
    if (valid) {
        n_params = le64(file + 56);
        n_cursor = le32(file + 64);
        n_rng = le32(file + 68);
        valid = n_cursor <= NL_CKPT_MAX_WORDS && n_rng <= NL_CKPT_MAX_WORDS && n_params <= n / 12 &&
                104 + 8 * ((uint64_t)n_cursor + n_rng) + 12 * n_params == n;
    }
    if (valid) valid = le64(file + n - 8) == nl_hash64(file, n - 8, NL_CKPT_HASH_SEED);
    if (n >= 32 && (mode & 2)) {
        cfg = le64(file + 16);
        mdl = le64(file + 24);
    }
    if (n >= 64 && (mode & 4)) expect_np = le64(file + 56);
    if (valid) valid = cfg == le64(file + 16) && mdl == le64(file + 24) && (!expect_np || expect_np == n_params);
    static const size_t max_read[4] = {0, 1, 7, 64};
    memfile mf = {file, n, 0, max_read[(mode >> 3) & 3], (mode >> 5) & 1, 0};
    if (mf.fail_after_header && n > 96 && valid) valid = false; /* the arrays (or the checksum) are after the header */
    nl_io io = {m_open,   m_read,   m_write,     m_fstat, m_fsync, m_close,
                m_rename, m_unlink, m_fsync_dir, m_lstat, m_list,  &mf};

    nl_ckpt ck;
    memset(&ck, 0x5A, sizeof ck);
    int rc = nl_ckpt_load_file("fuzz.nlck", cfg, mdl, expect_np, &ck, &io);
    FUZZ_CHECK(mf.open_fds == 0, "file left open");
    FUZZ_CHECK((rc == 0) == valid, "load returned %d for a %s file: %s", rc, valid ? "valid" : "invalid",
               rc ? nl_last_error() : "");
    if (rc != 0) {
        const char *e = nl_last_error();
        FUZZ_NOTE("refused: %s", e);
        FUZZ_CHECK(e && strstr(e, "fuzz.nlck"), "error does not name the file: %s", e);
        static const nl_ckpt zero;
        FUZZ_CHECK(!memcmp(&ck, &zero, sizeof ck), "failed load left data in the struct");
        free(file);
        return 0;
    }
    FUZZ_CHECK(ck.config_hash == le64(file + 16) && ck.model_hash == le64(file + 24), "hashes");
    FUZZ_CHECK(ck.step == le64(file + 32) && ck.epoch == le64(file + 40) && ck.index == le64(file + 48),
               "cursor fields");
    FUZZ_CHECK(ck.n_params == n_params && ck.n_cursor == n_cursor && ck.n_rng == n_rng, "counts");
    FUZZ_CHECK(ck.rank == le32(file + 72) && !memcmp(&ck.alpha, file + 76, 4), "rank / alpha");
    const uint8_t *p = file + 96;
    FUZZ_CHECK(!n_cursor || !memcmp(ck.cursor, p, 8 * (size_t)n_cursor), "cursor words");
    p += 8 * (size_t)n_cursor;
    FUZZ_CHECK(!n_rng || !memcmp(ck.rng, p, 8 * (size_t)n_rng), "rng words");
    p += 8 * (size_t)n_rng;
    size_t fb = 4 * (size_t)n_params;
    FUZZ_CHECK(!fb || !memcmp(ck.params, p, fb), "params");
    FUZZ_CHECK(!fb || !memcmp(ck.m, p + fb, fb), "m");
    FUZZ_CHECK(!fb || !memcmp(ck.v, p + 2 * fb, fb), "v");
    FUZZ_NOTE("accepted: %llu params", (unsigned long long)n_params);
    nl_ckpt_free(&ck);
    free(file);
    return 0;
}

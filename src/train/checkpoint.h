/* train/checkpoint: atomic commit and resume of the training state.
 *
 * A commit is one file DIR/commit-<step>.nlck (step in decimal, no leading zeros) holding
 * everything needed to continue bit-identically: the adapter parameters, AdamW's m and v,
 * the optimizer step, the data cursor and the RNG state. Commit protocol (SQLite's; os/io's
 * one atomic file write, nl_io_write_atomic, does 1-5):
 *   1. write DIR/ckpt.tmp            4. rename ckpt.tmp -> commit-<step>.nlck
 *   2. fsync it                      5. fsync DIR
 *   3. close it (errors checked)     6. only now remove older commits, keeping NL_CKPT_KEEP
 * A crash at any point leaves the old commits untouched; a failed commit (ENOSPC, EIO) returns
 * -1, removes its temp file, and never touches an older commit.
 *
 * File format v1, little-endian, fixed 96-byte header then arrays then a checksum:
 *    0  char[8]  magic "NLCKPT\0\0"       56  u64  n_params
 *    8  u32      version (1)              64  u32  n_cursor  (<= NL_CKPT_MAX_WORDS)
 *   12  u32      header bytes (96)        68  u32  n_rng     (<= NL_CKPT_MAX_WORDS)
 *   16  u64      config hash              72  u32  lora rank
 *   24  u64      model hash               76  f32  lora alpha
 *   32  u64      step                     80  u64  reserved (0)
 *   40  u64      epoch                    88  u64  reserved (0)
 *   48  u64      index
 *   96  u64 cursor[n_cursor], u64 rng[n_rng], f32 params[n_params], f32 m[n_params],
 *       f32 v[n_params]
 *  end  u64 checksum = nl_hash64(every byte before it, NL_CKPT_HASH_SEED)
 * The reader trusts no count from the file: the size the header implies must equal the file
 * size, counts are bounded, and the checksum is verified before any field is used. */
#ifndef NL_CHECKPOINT_H
#define NL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "util/hash.h" /* nl_hash64: the checksum */

#include "os/io.h"

#define NL_CKPT_VERSION 1
#define NL_CKPT_KEEP 2         /* commits kept on disk: the newest and the one before */
#define NL_CKPT_MAX_WORDS 4096 /* bound on n_cursor and n_rng */
#define NL_CKPT_HASH_SEED 0x6e6c636b70740001ull

/* The training state. For nl_ckpt_commit every pointer is BORROWED from the caller. After a
 * successful load the arrays are OWNED by the struct: release them with nl_ckpt_free (or take
 * a pointer and set the field to NULL first to keep it). */
typedef struct {
    uint64_t config_hash; /* caller's hash of the training configuration */
    uint64_t model_hash;  /* caller's hash of the base model (e.g. nl_file_hash64) */
    uint64_t step;        /* optimizer steps completed */
    uint64_t epoch;       /* data cursor: epoch ... */
    uint64_t index;       /* ... and position within it */
    uint32_t n_cursor;    /* opaque extra cursor words (shuffle state, bucket pos, ...) */
    uint64_t *cursor;
    uint32_t n_rng; /* RNG state words */
    uint64_t *rng;
    uint32_t rank; /* adapter hyper-parameters */
    float alpha;
    uint64_t n_params; /* length of params, m and v */
    float *params, *m, *v;
} nl_ckpt;

/* Write the state as DIR/commit-<ck->step>.nlck atomically (protocol above). DIR is created
 * (one level) if missing. After the new commit is durable, every commit-*.nlck in DIR with a
 * smaller step is removed except the newest of them. A commit never deletes a commit newer
 * than itself (one that was skipped at resume, unreadable then, may read fine later; it is
 * replaced when the run reaches its step). A listing that fails removes nothing.
 * io: NULL = nl_io_posix(). Returns 0, or -1 with nl_err naming the file and the failed call.
 * If the final directory fsync fails the new file is complete and verified by its checksum
 * but maybe not durable: NL_IO_NOT_DURABLE (-2) is returned, the file is left in place and no
 * older commit is removed, so a later load finds either the new or the previous commit. */
int nl_ckpt_commit(const char *dir, const nl_ckpt *ck, const nl_io *io);

/* Load the newest commit in DIR that verifies. DIR is listed through io: a listing that fails
 * (opendir, or readdir part way) is -1 with the directory and errno, never "no commit".
 *   config_hash, model_hash: must equal the file's; n_params: expected length (0 = any).
 * A newest file that is truncated, bit-flipped or unreadable is skipped and described in
 * `warning` (cap bytes, NUL-terminated, "" when nothing was skipped); the previous commit is
 * then used. A verified commit with a different config or model hash (or n_params) is
 * refused: -1 with a message naming the file and which hash differs, both values in hex.
 * Returns 0 (out filled, owning its arrays), 1 when DIR has no commit file or does not exist
 * (out zeroed), -1 on error (no commit verifies, a hash differs, I/O error listing DIR).
 * warning may be NULL. io: NULL = nl_io_posix(). */
int nl_ckpt_load_latest(const char *dir, uint64_t config_hash, uint64_t model_hash, uint64_t n_params, nl_ckpt *out,
                        char *warning, size_t cap, const nl_io *io);

/* Whether DIR holds a file named commit-* (a commit, or what looks like one): 1 yes, 0 no (also
 * when DIR does not exist), -1 when DIR cannot be listed (nl_err: the directory and errno; a
 * listing that fails part way is an error, never "no"). io: NULL = nl_io_posix(). */
int nl_ckpt_dir_has_commits(const char *dir, const nl_io *io);

/* Load and verify one checkpoint file (same checks as above). 0 or -1. */
int nl_ckpt_load_file(const char *path, uint64_t config_hash, uint64_t model_hash, uint64_t n_params, nl_ckpt *out,
                      const nl_io *io);

/* Free the arrays of a loaded checkpoint and zero the struct (NULL-safe). */
void nl_ckpt_free(nl_ckpt *ck);

#endif

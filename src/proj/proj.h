/* proj/: the frozen-projection service (docs/design.md §2). The ONLY code that multiplies by a
 * frozen weight. One op per projection, two directions, one resident copy of W:
 *
 *   NL_FWD: Y[T][N] = X[T][K] · Wᵀ      (W is N×K row-major, exactly as GGUF stores it)
 *   NL_BWD: Y[T][K] = X[T][N] · W        (the input gradient, from the SAME resident bytes)
 *
 * submit returns at once; the caller does CPU work (e.g. the LoRA branch) and then waits.
 * Exactly one request is in flight at a time. Backends plug in through nl_proj_backend. */
#ifndef NL_PROJ_H
#define NL_PROJ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct nl_amx_tiles; /* cpu/amx.h: the tile operations the nodes may use (nl_proj_node_tiles) */

typedef enum { NL_FWD = 0, NL_BWD = 1 } nl_dir;

/* What a backend sees of one frozen weight. `data` is borrowed (the GGUF mapping or a copy
 * the service converted once at load). */
typedef struct {
    const char *name;
    int type;            /* nl_type of data */
    int64_t n_in, n_out; /* K, N */
    const void *data;    /* N rows of nl_row_bytes(type, K) bytes */
    int cls;             /* nl_proj_class */
} nl_proj_weight;

typedef struct nl_proj_backend {
    const char *name; /* "ref", "host", ... */
    /* compute: the arithmetic asked for (nl_proj_config.compute; NULL = the backend's default).
     * A backend refuses a mode it does not know (-1 + nl_err); one it knows but only another
     * backend runs (ref and "bf16") it ignores. */
    int (*init)(void **ctx, int n_threads, const char *compute);
    /* 1 if the backend can run this weight/direction/bucket. */
    int (*supports)(void *ctx, const nl_proj_weight *w, nl_dir dir, int T);
    /* Y (T×N for FWD, T×K for BWD) is overwritten. */
    int (*run)(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y);
    void (*free)(void *ctx);
    /* 1 if each output row depends only on its own input row and is computed the same way
     * whatever T (no static shapes, no state across rows). Once the planner has validated every
     * bucket of a (projection, direction) on such a backend, the service sends requests of it
     * whole instead of splitting and zero-padding them onto the buckets: a validated bucket
     * vouches for the row computation, which is the same at any T. */
    int any_T;
    /* Optional: one line naming the kernels that run which weights ("bf16 compute (avx512
     * kernels)", "amx-bf16 for attn/mlp/head, split-bf16 for recurrent, ..."); snprintf
     * semantics. NULL: the backend's name says it all. */
    int (*describe)(void *ctx, char *buf, size_t cap);
    /* Optional: the arithmetic this context computes in ("f32", "bf16", ...; a static string),
     * what nl_proj_compute reports and the nodes' attention follows. NULL: "f32". */
    const char *(*compute)(const void *ctx);
    /* Optional, for a backend with devices to choose from (vulkan): init on the device named by
     * nl_proj_config.device ("0", "1", ...; NULL = the backend's own choice). The service calls
     * it instead of init when set; a config naming a device for a backend without it is refused. */
    int (*init_device)(void **ctx, int n_threads, const char *compute, const char *device);
    /* Optional: told once after init when the service runs the FP16 wire (wire_f16): every
     * input row it then sends holds FP16 values (scaled), which such a backend may carry as
     * FP16 (vulkan: the activations cross to the device in half the bytes). */
    void (*wire_f16)(void *ctx);
    /* The compute modes the backend knows (nl_proj_config.compute; NULL-terminated; NULL: "f32"
     * only): the service's list of modes is the union of its backends' (nl_proj_compute_known). */
    const char *const *computes;
    /* Optional: what the nodes may use beside this context, which they ask the service for
     * (nl_proj_nodes) instead of reading the compute mode: the tile operations their own
     * products may run on (NULL: none), and whether they compute in BF16 as the service does.
     * NULL hook: neither. */
    void (*nodes)(const void *ctx, const struct nl_amx_tiles **tiles, int *bf16);
    /* Optional: the memory a request of T rows to w in direction dir makes the context hold
     * beyond what init allocated: *shared (buffers grown to the largest request, one for the
     * context) and *per_thread (all its threads' scratch together). NULL: none (the memory
     * preflight counts what the service's hook says: nl_proj_scratch_bytes). */
    void (*scratch)(void *ctx, const nl_proj_weight *w, nl_dir dir, int T, uint64_t *shared, uint64_t *per_thread);
} nl_proj_backend;

typedef struct nl_proj_service nl_proj_service;

extern const nl_proj_backend nl_proj_backend_ref;  /* ref.c: FP32 reference, every type */
extern const nl_proj_backend nl_proj_backend_host; /* host.c: resident-type SIMD kernels */
/* vulkan.c (proj/vulkan.h; only where the build found Vulkan): compute shaders on a GPU */
/* The backend registered under `name` ("ref", ...), or NULL. */
const nl_proj_backend *nl_proj_backend_find(const char *name);

typedef struct {
    const char *backend; /* "ref" (the default of a zeroed config), "host" or "vulkan" */
    int n_threads;       /* service worker threads (0 = 1) */
    /* FP16 wire (NPU-faithful mode), done by the service around any backend: each input row
     * is scaled by a power of two so max|x| lands in [2^11, 2^12) and rounded to FP16; the
     * outputs are rounded to FP16 and unscaled in FP32. A row whose output is non-finite or
     * >= 60000 is resent with a further 2^-8 (at most 3 times), then computed by ref on the
     * original weight. Counted in nl_proj_stats.retries / fallbacks. */
    int wire_f16;
    int verbose;
    /* The host backend's compute mode: "f32", "bf16", "amx", "amx-emu", "int8" or "auto" (NULL: auto,
     * by capability; proj/host.h). Handed to the backend's init; ref computes in FP32 whatever
     * it says (but refuses an unknown mode). */
    const char *compute;
    /* Resident precision of the projection weights (DESIGN §2), applied once at nl_proj_add:
     *   "auto" (default, NULL): recurrent -> f16; attn, mlp, head -> q8_0; embed keeps its type
     *           (the paper's training policy)
     *   "keep": every weight in its GGUF type (what inference uses by default)
     *   "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1": every class but embed
     * precision_map overrides per class or tensor-name glob (* and ?), comma separated:
     *   "recurrent=f32,mlp=f16,blk.0.*=keep"   classes: attn mlp recurrent head embed;
     *   "keep" = the GGUF type. Globs win over classes; the last matching entry wins.
     * Whatever the target, a quantized GGUF tensor (q8_0, q4_0, q4_1, q4_k, q6_k) is never
     * re-quantized or narrowed to 16 bits (only expanded to exact f32 when asked), and a tensor
     * already in its target type is used in place (zero copy). */
    const char *precision;
    const char *precision_map;
    /* Use this backend instead of looking `backend` up (tests, out-of-tree backends). */
    const nl_proj_backend *backend_impl;
    /* Misuse (a second submit before wait) aborts through assert() instead of returning an
     * error: for debug runs. */
    int strict;
    /* The planner's verdict cache (NULL: none; the CLI's is the model cache directory's plan/):
     * nl_proj_plan keeps each check's measured error in DIR/plan-<key>.nlpc, the key a hash of
     * every projection's weight bytes (original and resident), the backend's kernels
     * (nl_proj_describe), its thread count, the wire and each check's direction, bucket and
     * bound; a later plan of the same service reads the verdicts instead of checking again. A
     * file that does not verify (size, magic, checksum, keys) is ignored, said in the summary,
     * and written again. Written atomically (os/io), through a temp file of this process. */
    const char *plan_cache_dir;
    /* The backend's device (vulkan: the index of vkEnumeratePhysicalDevices, --vulkan-device N);
     * NULL: the backend's choice (vulkan: a discrete GPU, else integrated, ..., a CPU driver last). */
    const char *device;
} nl_proj_config;

/* The resident type a weight of `gguf_type` with rows of n_in gets when the policy asks for
 * `target` (-1 = keep): quantized GGUF tensors are never re-quantized (only expanded to f32),
 * and rows that are not whole blocks of the target keep the GGUF type. (F16 overflow, found
 * only while converting, also keeps the GGUF bytes.) */
int nl_proj_feasible_type(int gguf_type, int64_t n_in, int target);

/* The defaults of the library's entry points and of the CLI (nl_train_defaults, nl_session_open
 * with no config, every nightlora command): the host backend on nl_proj_default_threads()
 * threads, f32 wire, precision NULL ("auto"; the inference entry points then ask for "keep").
 * A zeroed config (or NULL to nl_proj_service_new) is still ref on one thread. */
void nl_proj_config_defaults(nl_proj_config *cfg);
/* Every online core, at most 8. */
int nl_proj_default_threads(void);
/* The service's precision policy in words, e.g. "auto (attn, mlp, head -> q8_0, recurrent -> f16;
 * embed and quantized GGUF tensors as stored)", into buf (NUL-terminated); like snprintf. */
int nl_proj_format_precision(const nl_proj_service *s, char *buf, size_t cap);

nl_proj_service *nl_proj_service_new(const nl_proj_config *cfg);
void nl_proj_service_free(nl_proj_service *s);

/* Register a frozen weight; returns its id (>= 0), or -1 + error. The service may convert
 * it once to its resident type here (precision policy); `w->data` must outlive the service. */
int nl_proj_add(nl_proj_service *s, const nl_proj_weight *w);
int nl_proj_count(const nl_proj_service *s);
/* The service's worker thread count (nl_proj_config.n_threads, at least 1). */
int nl_proj_threads(const nl_proj_service *s);
/* The backend's name ("host", "ref", ...). */
const char *nl_proj_backend_name(const nl_proj_service *s);
/* 1 when the backend named computes on the CPU's own cores (host, ref): the requests then share
 * the cores with the caller, who waits and runs its CPU work after (the runtime's sync mode). */
int nl_proj_backend_on_cpu(const char *name);
/* "bf16" when the service's backend computes in BF16 (host with --compute bf16 or auto on an
 * AVX512_BF16 CPU), else "f32": the training graph runs its attention at the same precision. */
const char *nl_proj_compute(const nl_proj_service *s);
const nl_proj_weight *nl_proj_get(const nl_proj_service *s, int id); /* the resident view */
/* "<backend>: <its describe line>" (e.g. "host: amx-bf16 for attn/mlp/head, ..."), the kernels
 * this service runs: printed at start-up, recorded with a run's commits and compared at
 * resume (other kernels give other bits). snprintf semantics. */
int nl_proj_describe(const nl_proj_service *s, char *buf, size_t cap);
/* 0 when `mode` is a compute mode of one of the backends (or NULL, or "auto"), else -1 + nl_err
 * naming them: the one check of a --compute name (the CLI, the API); whether the chosen backend
 * runs it on this machine is its init's answer. */
int nl_proj_compute_known(const char *mode);
/* What the nodes may use beside the service (the backend's nodes hook): the tile operations of
 * their own products (NULL: the vector paths) and whether their attention computes in BF16. */
const struct nl_amx_tiles *nl_proj_node_tiles(const nl_proj_service *s);
int nl_proj_node_bf16(const nl_proj_service *s);

/* One request in flight, always: a second submit before wait is an error. */
int nl_proj_submit(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y);
int nl_proj_wait(nl_proj_service *s);
/* submit + wait */
int nl_proj_run(nl_proj_service *s, int id, nl_dir dir, const float *x, int T, float *y);

/* Gather rows of W (embedding lookup) through the same dequantizer: out[i][K] = W[rows[i]].
 * Reads only the resident bytes: allowed while a request is in flight. */
int nl_proj_get_rows(nl_proj_service *s, int id, const int32_t *rows, int n, float *out);

/* ---- counters ---------------------------------------------------------------------------- */
typedef struct {
    uint64_t requests[2];   /* per nl_dir */
    uint64_t tokens[2];     /* rows of X submitted, per nl_dir */
    double busy_s[2];       /* wall seconds the service spent computing, per nl_dir */
    double flops[2];        /* 2·T·K·N of the requests (counted as submitted), per nl_dir */
    uint64_t retries;       /* FP16 wire: rows sent again with a further 2^-8 */
    uint64_t fallbacks;     /* FP16 wire: rows that never fit, computed by ref */
    uint64_t routed_tokens; /* rows computed by ref because the planner routed them */
    uint64_t padded_tokens; /* zero rows added to fill a token bucket */
} nl_proj_stats;
void nl_proj_get_stats(const nl_proj_service *s, nl_proj_stats *out);
/* The same per registered weight and direction (bench step --profile's service rows: which
 * shapes the busy time went to, against bench proj's figure for the shape alone). */
typedef struct {
    uint64_t requests, tokens;
    double busy_s;
} nl_proj_entry_stats;
/* 0, or -1 + nl_err for an id not registered */
int nl_proj_get_entry_stats(const nl_proj_service *s, int id, nl_dir dir, nl_proj_entry_stats *out);

/* ---- resident memory ------------------------------------------------------------------------ */
/* Bytes of resident weight data of class `cls` (nl_proj_class) in type `type`; -1 = any.
 * In-place weights count their GGUF bytes; bytes shared by two projections count once. */
uint64_t nl_proj_resident_bytes(const nl_proj_service *s, int cls, int type);
/* Bytes the service allocated for converted copies (0 when everything is in place). */
uint64_t nl_proj_converted_bytes(const nl_proj_service *s);
/* The most the service holds for requests of at most T rows (T_head for the head's weights;
 * the embedding is never a request) once planned: its padding and FP16-wire buffers where a
 * request is split onto buckets, and the backend's buffers and threads' scratch (its scratch
 * hook), each grown to its largest. What the memory preflight counts for the service. */
uint64_t nl_proj_scratch_bytes(const nl_proj_service *s, int T, int T_head);
/* "attn Q8_0 1.20 GB, mlp Q8_0 2.72 GB, recurrent F16 2.02 GB, embed Q6_K 0.41 GB" into buf
 * (always NUL-terminated); returns the length it needed (like snprintf). */
int nl_proj_format_resident(const nl_proj_service *s, char *buf, size_t cap);

/* ---- planner (planner.c) ------------------------------------------------------------------ */
/* For every (projection, direction, bucket) run the backend once on deterministic random input
 * and compare it with ref on the ORIGINAL weight (relative Frobenius error, bound per resident
 * type: f32 1e-5, f16/bf16 1e-2, q8_0 2e-2, q6_k 5e-2, q4_0/q4_1/q4_k 1e-1; at least 1e-2 with the
 * FP16 wire). A failing or unsupported triple is routed to ref on the original weight for the
 * rest of the run. Afterwards every request is split / zero-padded onto the buckets, except on
 * an any_T backend where every bucket of that (projection, direction) passed: sent whole.
 * buckets NULL or n_buckets 0: {16, 64, 256}. Embedding projections (row gathers) are skipped.
 * Not while a request is in flight. Counters are left as they were. */
int nl_proj_plan(nl_proj_service *s, const int *buckets, int n_buckets);

typedef struct {
    int id; /* projection */
    nl_dir dir;
    int T;          /* bucket */
    int supported;  /* backend->supports said yes */
    double rel_err; /* measured (NAN when not run) */
    double bound;
    int passed; /* else routed to ref */
} nl_proj_check;
typedef struct {
    int checks, passed, routed;
} nl_proj_plan_totals;
void nl_proj_plan_get_totals(const nl_proj_service *s, nl_proj_plan_totals *out);
int nl_proj_plan_check_count(const nl_proj_service *s);
const nl_proj_check *nl_proj_plan_get_check(const nl_proj_service *s, int i);
/* "N checks, N passed, M routed to CPU" into buf, and what the verdict cache did when one
 * is set ("; verdicts from the plan cache F", "; plan cache F ignored (why): checked again");
 * returns the length needed. */
int nl_proj_plan_format_summary(const nl_proj_service *s, char *buf, size_t cap);
/* One line per check (name, dir, T, type, error, bound, verdict); malloc'd, caller frees. */
char *nl_proj_plan_format_table(const nl_proj_service *s);

#endif

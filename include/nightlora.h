/* nightlora: the public C API (this one header; libnightlora.so / libnightlora.a).
 *
 *   cc app.c $(pkg-config --cflags --libs nightlora)
 *
 * Everything here is named nightlora_* / NIGHTLORA_*; nothing else is exported from the shared
 * library. Handles are opaque; each *_params struct is filled by its *_default_params()
 * function first, then the fields the caller cares about are set.
 *
 * Errors: a function returns 0 (or a count, or a handle) on success and -1 (or NULL) on
 * failure; nightlora_last_error() then gives a one-line message naming the file and the byte
 * offset or line, the flag-like field, or what was expected. Every parameter is checked as the
 * CLI checks its flag (the same ranges: "--epochs inf: expected a number in [1e-06, 1e+06]")
 * before anything is read or written. The message is per thread: a call
 * on one thread never overwrites another thread's message.
 *
 * Threads: a model handle serves one call at a time (its projection service has one request in
 * flight); open one per thread for concurrent inference. nightlora_train runs on the calling
 * thread; its progress callback is called there, between optimizer steps; nightlora_run_cancel
 * may be called from any thread, from that callback, or from a signal handler.
 *
 * ABI: NIGHTLORA_ABI_VERSION is the shared library's SONAME number (libnightlora.so.N). It
 * changes when a struct here changes shape or a function its signature; a program checks
 * nightlora_abi_version() == NIGHTLORA_ABI_VERSION at start-up to catch a mismatched library.
 *
 *   nightlora_train_params p;
 *   nightlora_train_default_params(&p);
 *   p.model = "qwen3-0.6b-q8_0.gguf"; p.data = "my.jsonl"; p.out = "adapter.gguf";
 *   p.checkpoint_dir = "ckpt"; p.resume = 1;  p.on_progress = show; p.user = &ui;
 *   nightlora_run *run = nightlora_run_new();        // another thread may cancel it
 *   nightlora_train_result r;
 *   if (nightlora_train(&p, run, &r)) fprintf(stderr, "%s\n", nightlora_last_error());
 *   nightlora_run_free(run);
 *
 *   nightlora_model *m = nightlora_model_open("qwen3-0.6b-q8_0.gguf", NULL);  // NULL: defaults
 *   int n = nightlora_tokenize(m, "Note: buy milk", 1, ids, 64);
 *   nightlora_logits(m, ids, n, logits);            // or nightlora_generate, nightlora_eval
 *   nightlora_model_close(m);
 *
 * examples/api_train.c is a complete program. */
#ifndef NIGHTLORA_H
#define NIGHTLORA_H

#include <stddef.h>
#include <stdint.h>

#ifndef NL_API
#if defined(__GNUC__) || defined(__clang__)
#define NL_API __attribute__((visibility("default")))
#else
#define NL_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versions and errors ---- */

#define NIGHTLORA_ABI_VERSION 4

NL_API int nightlora_abi_version(void);     /* the library's NIGHTLORA_ABI_VERSION */
NL_API const char *nightlora_version(void); /* the project version, "0.2.0" */
/* This thread's message of its last failed call ("" when none). */
NL_API const char *nightlora_last_error(void);
/* Free what a nightlora_* function returned as malloc'd (nightlora_generate's text). */
NL_API void nightlora_free(void *p);
/* sizeof the public struct named ("nightlora_train_params", ...), as the library was built;
 * 0 for another name. Bindings that mirror the structs (python/nightlora) check their layout
 * against it. */
NL_API size_t nightlora_sizeof(const char *struct_name);

/* ---- synthetic models (random weights, a real byte-level BPE vocabulary) ---- */

typedef struct {
    const char *arch;   /* "llama" | "qwen3" (default) | "qwen35" | "gemma3" */
    const char *preset; /* "tiny" (default) | "small" | "llama3.2-1b" | "qwen3-0.6b" | "qwen35-0.8b" | "gemma3-270m" */
    const char *type;   /* projection weights: "f32" (default) | "f16" | "q8_0" | "q4_0" | "q4_1" */
    uint64_t seed;      /* 42; the file is a function of (arch, preset, type, seed) */
} nightlora_mkmodel_params;

NL_API void nightlora_mkmodel_default_params(nightlora_mkmodel_params *p);
/* Write the GGUF to path (p NULL: the defaults). */
NL_API int nightlora_mkmodel(const char *path, const nightlora_mkmodel_params *p);

/* ---- models: a base GGUF (+ an adapter) with its projection service, for inference ---- */

typedef struct nightlora_model nightlora_model;

typedef struct {
    const char *adapter;   /* a LoRA adapter GGUF to apply (NULL: none) */
    const char *backend;   /* "host" (default) | "ref" (FP32 reference) | "vulkan" (where the
                            * library was built with it: compute shaders on a GPU) */
    int n_threads;         /* service threads; 0: every core up to 8 */
    const char *precision; /* resident types: NULL = "keep" (as stored; what llama.cpp computes
                            * with) | "auto" (training's policy) | "f32" | "f16" | "bf16" |
                            * "q8_0" | "q4_0" | "q4_1" */
    const char *compute;   /* host arithmetic: NULL = "auto" | "f32" | "bf16" | "amx" | "amx-emu" | "int8" */
    int wire_f16;          /* 1: FP16 wire to the service (NPU-faithful mode) */
    const char *device;    /* ABI 4: the backend's device, `--vulkan-device N`'s "N" (vulkan:
                            * the index nightlora_check lists); NULL: the backend's own choice
                            * (a discrete GPU, else integrated, ..., a CPU driver last); a
                            * device for a backend without devices is an error */
} nightlora_model_params;

NL_API void nightlora_model_default_params(nightlora_model_params *p);
/* Load path (and p->adapter), start the service. NULL on error. p NULL: the defaults. */
NL_API nightlora_model *nightlora_model_open(const char *path, const nightlora_model_params *p);
NL_API void nightlora_model_close(nightlora_model *m); /* NULL: no-op */
NL_API int nightlora_model_n_vocab(const nightlora_model *m);
NL_API int nightlora_model_n_ctx(const nightlora_model *m); /* the context it was trained for */

/* Token ids of UTF-8 text. special: 1 adds BOS/EOS as the vocabulary says and matches
 * control-token text ("<|im_end|>"), as `nightlora tokenize` does; 0 neither (--no-special).
 * Writes min(count, cap) ids and returns the count (call again with a larger buffer when it
 * exceeds cap; ids may be NULL with cap 0), or -1. */
NL_API int nightlora_tokenize(nightlora_model *m, const char *text, int special, int32_t *ids, int cap);
/* The text of ids (control tokens included as their text): writes up to cap - 1 bytes and a
 * NUL, returns the full length in bytes (excluding the NUL), or -1 for an invalid id. */
NL_API int64_t nightlora_detokenize(nightlora_model *m, const int32_t *ids, int n, char *buf, size_t cap);

/* Full-sequence forward: logits[n][n_vocab] (row-major float32), what `nightlora logits` writes. */
NL_API int nightlora_logits(nightlora_model *m, const int32_t *ids, int n, float *logits);

typedef struct {
    int n_predict;             /* tokens to generate (32) */
    float temp;                /* 0 = greedy (default) */
    float top_p;               /* 1 = off (default) */
    uint64_t seed;             /* 0 */
    int raw;                   /* 0: the prompt is one user message in the model's chat template
                                * (as `nightlora generate`); 1: the prompt's tokens as they are */
    const char *chat_template; /* NULL: the GGUF's; "chatml" | "llama3" override */
    /* Called with each generated token (id, and its text; control tokens have text ""), on the
     * calling thread; NULL: none. */
    void (*on_token)(void *user, int32_t id, const char *text, size_t len);
    void *user;
} nightlora_generate_params;

NL_API void nightlora_generate_default_params(nightlora_generate_params *p);
/* Generate after prompt; stops at end of turn / EOS or after n_predict tokens. *text (may be
 * NULL) receives the generated text, control tokens left out (as the CLI prints it), malloc'd:
 * free it with nightlora_free. Returns the number of generated tokens, or -1. */
NL_API int nightlora_generate(nightlora_model *m, const char *prompt, const nightlora_generate_params *p, char **text);

typedef struct {
    const char *chat_template; /* for {"messages"} data: NULL = the GGUF's */
    int ctx;                   /* examples are cut to this; 0: the model's context, capped at 4096 */
} nightlora_eval_params;

typedef struct {
    double loss;     /* mean target cross-entropy (nats) */
    double ppl;      /* exp(loss) */
    double accuracy; /* n_correct / n_items; -1 when no example has choices */
    int64_t n_targets;
    int n_examples, n_items, n_correct;
    int n_truncated, n_dropped; /* examples cut to ctx / with no target within it */
} nightlora_eval_result;

NL_API void nightlora_eval_default_params(nightlora_eval_params *p);
/* Loss, perplexity and accuracy on a JSONL file (`nightlora eval`). p NULL: the defaults. */
NL_API int nightlora_eval(nightlora_model *m, const char *data, const nightlora_eval_params *p,
                          nightlora_eval_result *r);

/* ---- training ---- */

/* A run's cancel handle: nightlora_run_cancel ends the run it is passed to at the next step
 * boundary (or at once while paused for heat) with a commit, and nightlora_train returns 0 with
 * result.cancelled = 1 and the adapter written. Thread-safe and async-signal-safe. A handle
 * cancelled before nightlora_train starts stops it before its first step. */
typedef struct nightlora_run nightlora_run;
NL_API nightlora_run *nightlora_run_new(void);
NL_API void nightlora_run_cancel(nightlora_run *r);
NL_API int nightlora_run_cancelled(const nightlora_run *r);
NL_API void nightlora_run_reset(nightlora_run *r); /* clear a cancel, to reuse the handle */
NL_API void nightlora_run_free(nightlora_run *r);

typedef enum {
    NIGHTLORA_PROGRESS_STEP = 1, /* an optimizer step finished */
    NIGHTLORA_PROGRESS_EVAL = 2  /* a validation pass finished (the eval_* fields) */
} nightlora_progress_kind;

typedef struct {
    int kind;                  /* nightlora_progress_kind */
    int64_t step, total_steps; /* 1-based optimizer step (counting a resumed run's) */
    /* kind STEP: */
    double loss; /* the step's batch loss */
    double lr, grad_norm;
    int64_t tokens;         /* the step's tokens */
    double seconds;         /* the step's wall time */
    double tokens_per_s;    /* this run so far */
    double paused_seconds;  /* of this step, paused for heat (0 when it ran through) */
    double elapsed_seconds; /* since this run's first step */
    /* kind EVAL: the validation pass after `step` */
    double eval_loss;
    double eval_accuracy; /* -1 when no example has choices */
    int64_t eval_examples, eval_tokens;
    double eval_seconds;
} nightlora_progress;

/* Called on the training thread after each step's update, before its log line and commit: a
 * nightlora_run_cancel from here ends the run at this step (committed). */
typedef void (*nightlora_progress_fn)(void *user, const nightlora_progress *p);

typedef struct {
    const char *model, *data, *out; /* required: base GGUF, JSONL data, adapter GGUF to write */
    const char *init_adapter;       /* start from this adapter (its rank, alpha, targets) */
    const char *targets;            /* "q,k,v,o,gate,up,down,..." (NULL: every linear projection) */
    const char *chat_template;      /* NULL: the GGUF's */
    int rank;                       /* 16 */
    float alpha;                    /* 32 */
    float dropout;                  /* 0.05 */
    double lr;                      /* 2e-4 (method "mezo": set it yourself, ~1e-4) */
    int64_t steps;                  /* 0: from epochs */
    double epochs;                  /* 3 */
    int batch_tokens;               /* 0 (default): sized to the data, the largest of 4096, 2048, ...
                                     * with at least 20 steps an epoch (4096 with steps); a resume
                                     * takes its run's */
    int warmup;                     /* 0 */
    const char *schedule;           /* "cosine" (default) | "constant" */
    double lr_min;                  /* the cosine's floor; < 0: 0.1 * lr (default) */
    double clip;                    /* max global gradient norm (1; <= 0 off) */
    double weight_decay;            /* 0 */
    int ctx;                        /* 0: the model's context, capped at 4096 */
    int refuse_long;                /* 1: an example longer than ctx is an error (0: truncated) */
    int shuffle;                    /* 1 */
    uint64_t seed;                  /* 42 */
    const char *checkpoint_dir;     /* NULL: no commits */
    int64_t commit_every;           /* 1 */
    int resume;                     /* continue from checkpoint_dir's last commit */
    int64_t act_budget_mb;          /* -1: from the memory available */
    double mem_limit_mb;            /* 0: MemAvailable */
    const char *backend;            /* "host" (default) | "ref" | "vulkan" (where built) */
    int n_threads;                  /* 0: every core up to 8 */
    const char *precision;          /* NULL = "auto" (Q8_0 attn/mlp/head, F16 recurrent) | "keep" | ... */
    const char *compute;            /* NULL = "auto" | "f32" | "bf16" | "amx" | "amx-emu" | "int8" */
    const char *method;             /* "backprop" (default) | "mezo" */
    double mezo_eps;                /* 1e-3 */
    const char *thermal;            /* "auto" (default: sysfs) | "off" */
    const char *thermal_status_file, *battery_temp_file; /* readings a host app writes */
    const char *log_json;                                /* one JSON line per step (NULL: none) */
    int log_stderr;                                      /* 1: the CLI's progress lines on stderr (default 0) */
    nightlora_progress_fn on_progress;                   /* NULL: none */
    void *user;                                          /* passed to on_progress */
    /* Validation (ABI 2; `train --val-data` and the rest): a held-out set scored with the
     * adapter being trained, each pass an on_progress row of kind NIGHTLORA_PROGRESS_EVAL */
    const char *val_data;  /* a JSONL file read like data (NULL: none) */
    double val_split;      /* or this fraction of data held out, in (0, 1) (0: none) */
    int64_t eval_every;    /* scored after every N steps and after the last (0: the last only) */
    const char *keep_best; /* NULL | "loss" | "accuracy": out gets the best adapter */
    int64_t early_stop;    /* end after P evaluations without improvement (0: off) */
    /* The rest of what `train` does (ABI 3): */
    int64_t save_every;        /* every N steps the adapter also goes to OUT-stepN.gguf (0: none) */
    const char *report;        /* at the end, the run's HTML report (`train --report`; needs log_json);
                                * a report that cannot be written fails the call, the adapter written */
    int strict_keys;           /* 1: a data key no format reads is an error (0: skipped and counted) */
    const char *columns;       /* "prompt=question,completion=answer": other names of a line's keys */
    const char *alpaca_prompt; /* Alpaca lines: NULL/"auto" | "alpaca" (the Alpaca template) | "chat" */
    const char *overlap;       /* NULL/"auto" | "on" | "off": LoRA branches beside the service request */
    int allow_kernel_change;   /* resume on other kernels than the commits' */
    const char *device;        /* ABI 4: the backend's device ("0", "1", ...: vulkan's
                                * --vulkan-device N); NULL: the backend's own choice */
} nightlora_train_params;

typedef struct {
    int64_t steps_done; /* optimizer steps done overall (a resumed run's included) */
    int64_t total_steps;
    double first_loss, last_loss;
    double seconds, service_seconds, paused_seconds;
    int64_t tokens;
    int cancelled; /* ended early by nightlora_run_cancel */
    /* validation (ABI 2; zero without a validation set) */
    int early_stopped;               /* ended by early_stop (done, not cancelled) */
    int evaluations;                 /* validation passes of this call */
    double eval_seconds;             /* their time */
    int64_t best_step;               /* the run's best evaluation (0: none) */
    double best_loss, best_accuracy; /* accuracy -1 when no example has choices */
} nightlora_train_result;

NL_API void nightlora_train_default_params(nightlora_train_params *p);
/* Train (what `nightlora train` does). run may be NULL (then nothing can cancel it). 0: the
 * adapter written to p->out (also after a cancel); -1: nightlora_last_error(), and whatever
 * was committed to checkpoint_dir stays committed. */
NL_API int nightlora_train(const nightlora_train_params *p, nightlora_run *run, nightlora_train_result *r);

/* ---- merge and export (ABI 3) ---- */

typedef struct {
    int n_adapted; /* adapted tensors merged */
    int n_retyped; /* of those, written in a finer type than stored (a <= 6-bit base: Q8_0) */
    double lost;   /* the update's part the written weights' rounding loses, over every adapted
                    * tensor: ||Q(W+dW) - Q(W) - dW|| / ||dW|| (0: all of it kept) */
    double worst;  /* the largest one tensor's lost */
} nightlora_merge_result;

/* Base + adapter merged into one GGUF (`nightlora merge`): type NULL keeps what was learned
 * (untouched tensors as stored, adapted ones of a <= 6-bit base as Q8_0), else "f32" | "f16" |
 * "bf16" | "q8_0" | "q4_0" | "q4_1" for every projection. max_lost >= 0: nothing is written when
 * more than that fraction of the update is lost (`--strict`'s refusal); < 0: no bound. out must
 * be neither input. r may be NULL. */
NL_API int nightlora_merge(const char *model, const char *adapter, const char *out, const char *type, double max_lost,
                           nightlora_merge_result *r);
/* An adapter converted (`nightlora export`): format "peft" (a PEFT directory: adapter_config.json,
 * adapter_model.safetensors and the manifest; base_model NULL: the Hugging Face repository the
 * GGUF names, else null) or "gguf" (llama.cpp's LoRA GGUF); adapter is a GGUF or a PEFT
 * directory, model its base. out must be neither input. */
NL_API int nightlora_export(const char *model, const char *adapter, const char *format, const char *out,
                            const char *base_model);

#ifdef __cplusplus
}
#endif

#endif

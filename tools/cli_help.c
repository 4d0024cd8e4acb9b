/* The command line's help: one line per flag, with its default, for every command
 * (`nightlora CMD --help`, `nightlora help CMD`), and the exit statuses. A command's flags are
 * the lists it gives nl_cli_check; every flag there has a row here (a row keyed "cmd:flag" is
 * that command's own wording, else the shared "flag" row). tests/test_cli_help.c runs --help on
 * every command and fails on a flag without a row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *key;  /* "flag" or "cmd:flag" (cmd: the first word of the command) */
    const char *arg;  /* the value's placeholder; NULL for a flag that takes no value */
    const char *text; /* what it does, then "(default ...)" where there is one */
} help_row;

static const help_row rows[] = {
    /* shared: the model, the service */
    {"model", "M.gguf", "the base model (GGUF v3) [required]"},
    {"adapter", "A.gguf|DIR",
     "a LoRA adapter applied to the model: llama.cpp's LoRA GGUF, or a PEFT directory (adapter_config.json + "
     "adapter_model.safetensors) (default none)"},
    {"backend", "host|ref|vulkan",
     "the projection service: host (CPU kernels), vulkan (compute shaders on a GPU, where the build found Vulkan), "
     "each checked against ref at start, or ref (the FP32 reference) (default host)"},
    {"vulkan-device", "N",
     "with --backend vulkan: the Vulkan device of that index (`nightlora check --backend vulkan --verbose` lists them) "
     "(default: a discrete GPU, else integrated, ..., a CPU driver last)"},
    {"threads", "N", "service threads (default every core, up to 8)"},
    {"precision", "P",
     "resident weight types: auto (attn/mlp/head Q8_0, recurrent F16), keep (as stored), f32, f16, bf16, q8_0, q4_0, "
     "q4_1 (default: auto for train, keep for inference)"},
    {"precision-map", "CLASS=TYPE,...",
     "per-class or per-projection types after --precision, e.g. recurrent=f16,head=q8_0 (default none)"},
    {"compute", "MODE",
     "host compute: f32, bf16, amx, amx-emu, sme, int8 (FWD of integer-quantized weights with int8 activations as "
     "llama.cpp quantizes them, the rest bf16/f32) or auto (default auto: amx where the CPU has it, bf16 on "
     "AVX512_BF16 or Arm BF16, else f32)"},
    {"wire", "f32|f16",
     "activations to and from the service: f32, or f16 with per-row scaling and retries (default f32)"},
    {"verbose", NULL, "the planner's checks and the service's details on stderr"},
    {"no-plan-cache", NULL,
     "check every projection again: neither read nor write the planner's verdicts in $NL_PLAN_CACHE, else "
     "${NL_MODEL_CACHE:-~/.cache/nightlora}/plan (default: a second command on the same model, kernels and threads "
     "reads them)"},
    {"template", "NAME",
     "chat template for \"messages\" data and prompts: chatml, llama3 or a FILE.jinja (default: the GGUF's own "
     "tokenizer.chat_template, rendered as Jinja)"},
    {"ctx", "N", "context length the examples are cut to (default the model's)"},
    {"seed", "S", "random seed: shuffling, dropout, a fresh adapter's A (default 42)"},
    {"generate:seed", "S", "sampling seed (default 0)"},
    {"json", NULL, "print the result as one JSON object on stdout"},
    {"out", "FILE", "output path (never one of the inputs) [required]"},
    /* train */
    {"data", "FILE.jsonl|DIR",
     "training data: JSONL lines (or one JSON array) of {\"text\"}, {\"prompt\",\"completion\"}, {\"messages\"}, "
     "ShareGPT {\"conversations\"}, Alpaca {\"instruction\",\"input\",\"output\"} or TRL message lists; a directory: "
     "its train.jsonl [required]"},
    {"ignore-unknown-keys", NULL, "skip the keys of a line no format reads (the default; kept for old command lines)"},
    {"strict-keys", NULL, "a key of a line no format reads is an error (default: skipped, and the count printed)"},
    {"columns", "KEY=COL,...",
     "read a line's column COL as KEY (prompt=question,completion=answer; KEY: prompt, completion, messages, "
     "conversations, instruction, input, output, text, tokens, ...)"},
    {"alpaca-prompt", "auto|alpaca|chat",
     "Alpaca lines' prompt: the Alpaca template or the chat template (default auto: the chat template when the model "
     "has one or --template names one)"},
    {"dry-run", NULL,
     "print the first sequences as the model sees them (template applied, loss targets [[marked]]) and the step plan, "
     "then exit: no service, nothing written"},
    {"train:out", "A.gguf", "the adapter written at the end (llama.cpp's LoRA GGUF) [required]"},
    {"config", "FILE.json",
     "flags from a JSON object (keys: flag names, '_' for '-'; a checkpoint directory's run.json works as is); the "
     "command line's win"},
    {"rank", "N", "LoRA rank (default 16)"},
    {"alpha", "A", "LoRA alpha; the update is scaled by alpha/rank (default 32)"},
    {"dropout", "P", "LoRA dropout on the adapter's input (default 0.05)"},
    {"lr", "LR", "AdamW learning rate (default 2e-4; 1e-4 with --method mezo)"},
    {"lr-min", "LR", "the cosine schedule's floor (default lr/10)"},
    {"steps", "N", "optimizer steps (default: from --epochs)"},
    {"epochs", "E", "passes over the data, fractions allowed (default 3)"},
    {"batch-tokens", "N",
     "tokens per optimizer step, sequences packed up to it (default: sized to the data, the largest of 4096, 2048, ... "
     "with at least 20 steps an epoch, said on the plan line; 4096 with --steps; a --resume keeps its run's)"},
    {"targets", "LIST",
     "projections to adapt: q,k,v,o,gate,up,down,qkv,z,alpha,beta,out,output, or all: every one but the output head "
     "(default all)"},
    {"init-adapter", "A.gguf|DIR",
     "start from this adapter (its rank, alpha and targets) instead of B = 0: a LoRA GGUF or a PEFT directory (default "
     "none)"},
    {"schedule", "cosine|constant", "learning-rate schedule after the warm-up (default cosine)"},
    {"warmup", "N", "linear warm-up steps (default 0)"},
    {"clip", "C", "global gradient-norm clip, 0 for none (default 1.0)"},
    {"weight-decay", "W", "AdamW decoupled weight decay (default 0)"},
    {"on-long", "truncate|refuse", "a sequence longer than the context: cut it, or refuse the data (default truncate)"},
    {"no-shuffle", NULL, "keep the data's order (default: shuffled by --seed each epoch)"},
    {"checkpoint-dir", "DIR", "commit the run's state here at step boundaries, for --resume (default none)"},
    {"commit-every", "N", "commit every N optimizer steps (default 1)"},
    {"save-every", "N",
     "also write the adapter every N optimizer steps to OUT-stepN.gguf (--out without .gguf; the format of --out, "
     "kept; a commit step too) (default none)"},
    {"resume", NULL,
     "continue the run committed in --checkpoint-dir; more --steps/--epochs or another "
     "--lr/--schedule/--lr-min/--warmup extend it"},
    {"allow-kernel-change", NULL, "resume although the service's kernels differ from the committed run's"},
    {"act-budget-mb", "MB",
     "memory for kept activations; layers past it are recomputed, 0 recomputes all (default: what the machine has)"},
    {"mem-limit-mb", "MB", "refuse to start when the run would need more than this (default: available memory)"},
    {"thermal", "auto|off", "pause while the device is hot or on a low battery (default auto)"},
    {"thermal-status-file", "F", "read the thermal status from this file instead of the system's"},
    {"battery-temp-file", "F", "read the battery temperature from this file instead of the system's"},
    {"log-json", "FILE", "one JSON row per step (loss, lr, tokens, times, pacing) (default none)"},
    {"report", "FILE.html",
     "at the end (and when the run stops early after its commit) the run's report drawn from --log-json, with the "
     "command line and run.json (default none)"},
    {"dump-grads", "G.gguf", "write the first step's adapter gradients and stop (for gradient checks)"},
    {"quiet", NULL, "no progress lines; warnings and the outcome (done, early stop, where the adapter is) stay"},
    {"train:verbose", NULL, "the planner's checks, the memory plan and per-step details on stderr"},
    {"method", "backprop|mezo", "gradients by backpropagation, or MeZO's two forward passes (default backprop)"},
    {"mezo-eps", "E", "MeZO's perturbation size (default 1e-3)"},
    {"overlap", "auto|on|off", "overlap service requests with CPU work (default auto)"},
    {"val-data", "FILE",
     "a validation set (JSONL, read like --data): scored with the adapter being trained after every --eval-every steps "
     "and at the end (default: with --data DIR, its valid.jsonl when there)"},
    {"val-split", "F",
     "hold out a fraction F of --data for validation: example i (from 1) when floor(i*F) > floor((i-1)*F), the same "
     "every run (default none)"},
    {"eval-every", "N", "evaluate the validation set after every N steps (default: only after the last step)"},
    {"keep-best", "[loss|accuracy]",
     "write the adapter to --out at each evaluation that improves on the best, not the last one at the end (bare: "
     "loss; default off)"},
    {"early-stop", "P", "stop after P evaluations in a row without improvement (default off)"},
    {"stop-after", "N", "stop after N steps of this process, committing (a test aid; default none)"},
    {"pacing-poll-ms", "MS", "how often a paused run polls the thermal/battery state (a test aid)"},
    /* eval, logits, generate, merge, tokenize */
    {"eval:data", "FILE.jsonl|DIR",
     "held-out data (a directory: its test.jsonl); lines with \"choices\" and \"answer\" are scored for accuracy "
     "[required]"},
    {"eval:batch-tokens", "N",
     "examples (and each choice after its prompt) packed into forwards of up to N tokens; the result is the same for "
     "any N (default 2048)"},
    {"eval:json", NULL,
     "the result as one JSON object, with every example's loss, choice log-likelihoods, prediction and answer"},
    {"tokens", "IDS", "token ids, space- or comma-separated [required]"},
    {"logits:out", "L.f32", "the logits, n_tokens x n_vocab little-endian float32 [required]"},
    {"prompt", "TEXT", "the prompt, rendered through the chat template unless --raw [required]"},
    {"n", "N", "tokens to generate (default 32)"},
    {"temp", "T", "sampling temperature, 0 for greedy (default 0)"},
    {"top-p", "P", "nucleus sampling mass (default 1)"},
    {"raw", NULL, "send the prompt as is, without the chat template"},
    {"system", "TEXT", "a system turn before the user's (default: the template's own, if it has one)"},
    {"chat:n", "N", "at most N tokens a reply (default 256)"},
    {"chat:seed", "S", "sampling seed of the first reply, +1 each turn (default 0)"},
    {"pieces", NULL, "one token a line: its id, its piece as a JSON string, \"control\" for control tokens"},
    {"merge:out", "M.gguf", "the merged model (GGUF) [required]"},
    {"type", "TYPE",
     "the merged weights' type: f32, f16, bf16, q8_0, q4_0 or q4_1 (default: an adapted weight of f32, f16, bf16 or "
     "q8_0 in its own type, of a <= 6-bit type (q4_0, q4_1, q5_0, q4_k, q6_k) as q8_0, which keeps the update; every "
     "other tensor as stored)"},
    {"strict", NULL,
     "refuse (nothing written) when the merged model misses more than 20% of the adapter's effect on a probe prompt's "
     "logits (default: a warning)"},
    {"export:adapter", "A.gguf|DIR", "the adapter to convert: llama.cpp's LoRA GGUF, or a PEFT directory [required]"},
    {"export:model", "M.gguf",
     "the adapter's base model: its architecture and heads (llama's q/k row order) [required]"},
    {"format", "peft|gguf",
     "peft: a PEFT directory (adapter_config.json + adapter_model.safetensors); gguf: llama.cpp's LoRA GGUF "
     "[required]"},
    {"export:out", "DIR|A.gguf",
     "the directory (created if missing) or the GGUF file written (never one of the inputs) [required]"},
    {"base-model", "ORG/NAME",
     "adapter_config.json's base_model_name_or_path, what AutoPeftModelForCausalLM loads (default: the Hugging Face "
     "repository the GGUF names: general.source.huggingface.repository, a huggingface.co URL, an ORG/NAME "
     "general.name; else null, with a warning)"},
    {"text", "TEXT", "the text to tokenize [required]"},
    {"no-special", NULL, "treat special-token text as plain text"},
    {"special", NULL, "parse special-token text as special tokens (the default)"},
    /* report */
    {"log", "FILE.jsonl", "the run's --log-json file: step rows and {\"eval\": ...} validation rows [required]"},
    {"report:out", "FILE.html",
     "the report: one self-contained HTML file (inline SVG and CSS, no script), never one of the inputs [required]"},
    {"run", "DIR|run.json",
     "the run's settings: its --checkpoint-dir or the run.json in it (default: what the log carries)"},
    {"title", "TEXT", "the page's heading (default \"nightlora training report\")"},
    /* check, mkmodel, bench */
    {"check:verbose", NULL, "every planner check (projection, direction, bucket) with its error"},
    {"arch", "ARCH", "architecture: llama, qwen3, qwen35 or gemma3 [required]"},
    {"preset", "NAME", "shape: tiny, small, llama3.2-1b, qwen3-0.6b or qwen35-0.8b [required]"},
    {"mkmodel:out", "M.gguf", "the synthetic model (random weights) [required]"},
    {"mkmodel:type", "TYPE",
     "weight type: f32, f16, q8_0, q4_0 or q4_1 (model/quant's quantizers, as merge writes them; default f32)"},
    {"mkmodel:seed", "S", "seed of the random weights (default 42)"},
    {"bench:tokens", "T[,T...]", "tokens per request: a list for proj (default 64,512), one for step (default 512)"},
    {"reps", "R", "timed repetitions, best kept (default 3; bench proj: at least 0.25 s of them)"},
    {"bench:warmup", "N", "untimed repetitions first (default 1)"},
    {"cold", NULL,
     "proj: the timed runs cycle over the shape's weights, each with an input and output of its own, so W, x and y "
     "come from memory as in a step (default: one weight on one x and y, kept in the caches)"},
    {"only", "LETTERS", "the step variants to run, of abcd (default all)"},
    {"skip-ref", NULL, "do not time the reference step"},
    {"no-plan", NULL, "skip the planner (time the service as configured)"},
    {"profile", NULL, "time every node of the step"},
    {"bench:rank", "N", "LoRA rank of the benchmarked step (default 16)"},
    {"bench:act-budget-mb", "MB", "activation budget of the benchmarked step (default: what the machine has)"},
    {"answer-tokens", "N", "the last N tokens carry the loss (default: all of them)"},
    {"bench:seed", "S", "seed of the benchmark's data (default 1)"},
    {"bench:seconds", "S", "peak: about how long each loop runs (default 0.3)"},
};

static const help_row *find_row(const char *cmd, const char *flag) {
    char first[32];
    size_t n = strcspn(cmd, " ");
    if (n >= sizeof first) n = sizeof first - 1;
    memcpy(first, cmd, n);
    first[n] = 0;
    const help_row *shared = NULL;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *k = rows[i].key, *colon = strchr(k, ':');
        if (colon) {
            if ((size_t)(colon - k) == n && !strncmp(k, first, n) && !strcmp(colon + 1, flag)) return &rows[i];
        } else if (!strcmp(k, flag)) {
            shared = &rows[i];
        }
    }
    return shared;
}

void nl_cli_print_exit_statuses(FILE *f) {
    fprintf(
        f,
        "exit status:\n"
        "  0  done (a training run ended by --early-stop, or stopped by --stop-after or a pause limit, has committed)\n"
        "  1  an error: the message on stderr names the file and the offset or line; nothing committed is lost\n"
        "  2  a usage error: an unknown command or flag, a missing or malformed value\n"
        "  3  train: stopped by SIGINT/SIGTERM after committing the last finished step (not done: --resume continues "
        "it)\n");
}

static int print_flag(FILE *f, const char *cmd, const char *flag, int boolean) {
    const help_row *r = find_row(cmd, flag);
    char left[64];
    if (!r) {
        snprintf(left, sizeof left, "--%s", flag);
        fprintf(f, "  %-30s (no description)\n", left);
        return 1;
    }
    if (boolean || !r->arg) snprintf(left, sizeof left, "--%s", flag);
    else snprintf(left, sizeof left, "--%s %s", flag, r->arg);
    if (strlen(left) > 30) fprintf(f, "  %s\n  %-30s %s\n", left, "", r->text);
    else fprintf(f, "  %-30s %s\n", left, r->text);
    return 0;
}

int nl_cli_print_help(FILE *f, const char *cmd, const char *const *known, const char *const *boolean) {
    const char *usage = nl_cli_usage(cmd);
    if (usage) fprintf(f, "usage: nightlora %s\n\n", usage);
    fprintf(f, "options:\n");
    int missing = 0;
    for (const char *const *k = known; k && *k; k++) {
        int is_bool = 0;
        for (const char *const *b = boolean; b && *b; b++) is_bool |= !strcmp(*b, *k);
        if (!is_bool) missing += print_flag(f, cmd, *k, 0);
    }
    for (const char *const *b = boolean; b && *b; b++) missing += print_flag(f, cmd, *b, 1);
    fprintf(f, "  %-30s %s\n\n", "--help", "this text");
    nl_cli_print_exit_statuses(f);
    return missing;
}

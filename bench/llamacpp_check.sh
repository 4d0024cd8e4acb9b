#!/bin/sh
# Does llama.cpp load what nightlora writes, and compute the same thing? llama.cpp here is
# llama-cpp-python from PyPI (built once from its sdist into a virtual environment in the model
# cache: bench/llamacpp/env.sh).
#
# 1. Synthetic models, per architecture: a `small` model written by `nightlora mkmodel` (F32
#    weights; and a Q8_0 one), a LoRA adapter trained on it by `nightlora train` (a short run on
#    the example tagging task); llama.cpp gives the next-token probabilities after a fixed token
#    prompt, with and without the adapter (bench/llamacpp/probs.py), and bench/llamacpp/compare.py
#    compares them with nightlora's (`logits`, ref backend, FP32).
# 2. The real model, SmolLM2-135M-Instruct (Q4_1; tools/fetch-models.sh): tokenizer ids, logits
#    with default flags, FP32 logits against transformers (when the environment has it), greedy
#    generation, an adapter and its merged model, the tied head (bench/llamacpp/real.py).
# 3. The second real model, Gemma 3 270M (Q4_K_M, gemma3; tools/fetch-models.sh gemma3), the base
#    model with no chat template in its file: checked on plain text (real.py without a template):
#    tokenizer ids (Gemma's turn markers too), logits on the file and on its F32 expansion, greedy
#    generation (--raw), the tagging task (examples/tagging-{train,test}.jsonl, prompt/completion)
#    trained for one epoch with its held-out accuracy before and after, that adapter in llama.cpp,
#    its merged model (the adapted Q4_K/Q5_0/Q6_K weights written as Q8_0), the tied head. Bounded
#    by GEMMA_TIMEOUT seconds (1500). GEMMA_CHAT=1 adds the chat form: the tokenizer on the prompts
#    rendered by tests/data/templates/gemma3.jinja (the -it models' template) and the tagging task
#    as conversations (examples/tagging-chat-*.jsonl, --template that file).
#
#   sh bench/llamacpp_check.sh
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-llamacpp), ARCHS ("llama qwen3 qwen35"),
# STEPS (120), REAL (1: the real-model parts; 0 skips them), REAL_MODELS ("smollm2 gemma3"),
# GEMMA_TIMEOUT (1500), GEMMA_CHAT (0), INT8 (1), INT8_TIMEOUT (300), NL_MODEL_CACHE. Exit status 1 if
# llama.cpp refuses a file, an F32 synthetic model's top token differs, or a real-model check
# fails (the Q8_0 rows are reported only: llama.cpp rounds activations to 8 bits there, so a near
# tie among the top tokens of these nearly flat distributions may go either way). When
# llama-cpp-python cannot be had it says so and exits 0; without the real model its part says
# so (the message of tools/fetch-models.sh --check) and is skipped; the Gemma part likewise.
set -e
BIN=${BIN:-build/nightlora}
WORK=${WORK:-/tmp/nightlora-llamacpp}
ARCHS=${ARCHS:-"llama qwen3 qwen35"}
STEPS=${STEPS:-120}
REAL=${REAL:-1}
REAL_MODELS=${REAL_MODELS:-"smollm2 gemma3"}
GEMMA_TIMEOUT=${GEMMA_TIMEOUT:-1500}
GEMMA_CHAT=${GEMMA_CHAT:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
. "$HERE/llamacpp/env.sh"
t_start=$(date +%s)
if ! nl_need_llamacpp; then
    echo "llamacpp_check: llama-cpp-python cannot be had: skipping"
    exit 0
fi
mkdir -p "$WORK"
# can this machine run the built llama.cpp at all? (an environment problem is a skip, not a
# verdict on nightlora's files)
if ! "$NL_PY" -c "import llama_cpp; llama_cpp.llama_backend_init()" >"$WORK/preflight.log" 2>&1; then
    tail -5 "$WORK/preflight.log"
    echo "llamacpp_check: llama-cpp-python does not start on this machine: skipping"
    exit 0
fi
echo "llama.cpp: llama-cpp-python $("$NL_PY" -c 'import llama_cpp; print(llama_cpp.__version__)') ($NL_VENV)"
TOKS="1 500 77 1200 9 3000 41 2 2222 345"
status=0
check() { # label model fatal [adapter]
    label=$1
    model=$2
    fatal=$3
    ad=$4
    out="$WORK/$(echo "$label" | tr ' ' '_').json"
    if ! "$NL_PY" "$HERE/llamacpp/probs.py" "$model" "$TOKS" "$out" $ad >"$WORK/llamacpp.log" 2>&1; then
        echo "$label: llama.cpp failed:"
        tail -5 "$WORK/llamacpp.log"
        status=1
        return
    fi
    printf '%-22s ' "$label:"
    rc=0
    if [ -n "$ad" ]; then
        python3 "$HERE/llamacpp/compare.py" "$BIN" "$model" "$TOKS" "$out" --adapter "$ad" || rc=$?
    else
        python3 "$HERE/llamacpp/compare.py" "$BIN" "$model" "$TOKS" "$out" || rc=$?
    fi
    [ "$rc" -eq 0 ] || [ "$fatal" = 0 ] || status=1
}
for arch in $ARCHS; do
    m="$WORK/$arch-small.gguf"
    mq="$WORK/$arch-small-q8_0.gguf"
    a="$WORK/$arch-adapter.gguf"
    "$BIN" mkmodel --arch "$arch" --preset small --type f32 --seed 1 --out "$m" >/dev/null
    "$BIN" mkmodel --arch "$arch" --preset small --type q8_0 --seed 1 --out "$mq" >/dev/null
    # with a snapshot half way (--save-every: the format of --out, OUT-stepN.gguf)
    half=$((STEPS / 2 > 0 ? STEPS / 2 : 1))
    "$BIN" train --model "$m" --data "$ROOT/examples/tagging-train.jsonl" --out "$a" --steps "$STEPS" --lr 2e-3 \
        --batch-tokens 256 --backend host --threads 2 --seed 1 --save-every "$half" --quiet >/dev/null
    check "$arch f32" "$m" 1
    check "$arch f32 + adapter" "$m" 1 "$a"
    check "$arch f32 + snapshot" "$m" 1 "$WORK/$arch-adapter-step$half.gguf"
    check "$arch q8_0" "$mq" 0
    check "$arch q8_0 + adapter" "$mq" 0 "$a"
done
[ "$status" -eq 0 ] && echo "synthetic models: llama.cpp loaded every model and adapter; F32 top tokens agree"
# 4. --compute int8 (the FWD of integer-quantized weights with llama.cpp's own activation
#    quantization) against llama.cpp's CPU logits on the same files, beside the bf16 and f32
#    paths (bench/llamacpp/int8.py: the relative L2 difference of every prompt row's logits;
#    reported, not a verdict: the KV cache in F16 and the other float orders stay different).
#    INT8 (1) runs it, bounded by INT8_TIMEOUT seconds per model (300).
INT8=${INT8:-1}
INT8_TIMEOUT=${INT8_TIMEOUT:-300}
if [ "$INT8" = 1 ]; then
    I8TOKS="1 500 77 1200 9 3000 41 2 2222 345 17 88 1000 23 5 600"
    for im in "$WORK/qwen35-small-q8_0.gguf" "$WORK/llama-small-q8_0.gguf" \
        "$NL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" "$NL_MODEL_CACHE/gemma-3-270m-q4_k_m.gguf"; do
        [ -f "$im" ] || continue
        echo "int8 logits vs llama.cpp: $(basename "$im")"
        timeout "$INT8_TIMEOUT" "$NL_PY" "$HERE/llamacpp/int8.py" "$BIN" "$im" "$I8TOKS" 2>/dev/null | grep -v '^llama' ||
            echo "  (not finished in $INT8_TIMEOUT s, or failed)"
    done
fi
case " $REAL_MODELS " in *" smollm2 "*) real_smollm2=$REAL ;; *) real_smollm2=0 ;; esac
case " $REAL_MODELS " in *" gemma3 "*) real_gemma3=$REAL ;; *) real_gemma3=0 ;; esac
if [ "$real_smollm2" = 1 ]; then
    if msg=$(sh "$ROOT/tools/fetch-models.sh" --check smollm2); then
        echo "real model: $NL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
        "$NL_PY" "$HERE/llamacpp/real.py" --bin "$BIN" --model "$NL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" \
            --work "$WORK/real" --data-train "$ROOT/examples/tagging-chat-train.jsonl" || status=1
    else
        echo "real model: skipped: $msg"
    fi
fi
if [ "$real_gemma3" = 1 ]; then
    if msg=$(sh "$ROOT/tools/fetch-models.sh" --check gemma3); then
        echo "real model: $NL_MODEL_CACHE/gemma-3-270m-q4_k_m.gguf (no chat template: plain text)"
        t_gemma=$(date +%s)
        rc=0
        timeout "$GEMMA_TIMEOUT" "$NL_PY" "$HERE/llamacpp/real.py" --bin "$BIN" \
            --model "$NL_MODEL_CACHE/gemma-3-270m-q4_k_m.gguf" --work "$WORK/gemma3" \
            --data-train "$ROOT/examples/tagging-train.jsonl" --data-test "$ROOT/examples/tagging-test.jsonl" \
            --only tokenizer,logits,generate,tagging,adapter,tied || rc=$?
        if [ "$GEMMA_CHAT" = 1 ] && [ "$rc" -eq 0 ]; then
            echo "real model: gemma3 with the chat template tests/data/templates/gemma3.jinja"
            timeout "$GEMMA_TIMEOUT" "$NL_PY" "$HERE/llamacpp/real.py" --bin "$BIN" \
                --model "$NL_MODEL_CACHE/gemma-3-270m-q4_k_m.gguf" --work "$WORK/gemma3-chat" \
                --template "$ROOT/tests/data/templates/gemma3.jinja" \
                --data-train "$ROOT/examples/tagging-chat-train.jsonl" --data-test "$ROOT/examples/tagging-chat-test.jsonl" \
                --only tokenizer,tagging || rc=$?
        fi
        [ "$rc" -eq 124 ] && echo "gemma3: not finished in $GEMMA_TIMEOUT s (GEMMA_TIMEOUT)"
        [ "$rc" -eq 0 ] || status=1
        echo "gemma3: $(($(date +%s) - t_gemma)) s"
    else
        echo "real model: skipped: $msg"
    fi
fi
echo "llamacpp_check: $([ "$status" -eq 0 ] && echo passed || echo FAILED) in $(($(date +%s) - t_start)) s"
exit $status
